"""CPU: a step's Triton kernels compiled for the H100 (sm_90) without a GPU, as a launch would specialise them, and
their registers, shared memory and SASS instruction counts by opcode.

Triton specialises integer arguments at launch: those divisible by 16 get a divisibility hint (16-byte vector loads),
those equal to 1 become constants. Compiled without those hints a kernel looks very different (the decode split:
3200 instructions of scalar loads instead of 1080 with vector loads), so the arguments below are a decode step's at
Qwen3-4B shapes. Needs Triton's bundled ptxas and cuobjdump (the pip wheel has them).

  python benchmarks/triton_sass.py            # the decode split, the merge and the add + norm kernel
"""

import collections
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dflash_cli.kernels import attention, elementwise  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
TARGET = GPUTarget("cuda", 90, 32)
# Pointer types by argument name (every pointer is 16-byte aligned at launch).
POINTERS = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "limit_ptr": "*i64", "part_o": "*fp32",
            "part_ml": "*fp32", "kn_ptr": "*bf16", "vn_ptr": "*bf16", "qw_ptr": "*bf16", "kw_ptr": "*bf16",
            "cos_ptr": "*fp32", "sin_ptr": "*fp32", "pos_ptr": "*i64", "trace_ptr": "*i64", "out_ptr": "*bf16",
            "h_ptr": "*bf16", "d_ptr": "*bf16", "w_ptr": "*bf16", "h_out": "*bf16", "x_out": "*bf16",
            "warm_ptr": "*u8"}
FLOATS = {"scale", "eps"}
# Qwen3-4B decode at ctx 1024 (window 2048: 32 splits of 64 keys), as attention._attend launches it.
DECODE = dict(T=1, stride_lt=1, NSPLIT=32, stride_qt=6144, stride_qh=128, stride_ks=1024, stride_kh=128,
              stride_vs=1024, stride_vh=128, stride_knt=6144, stride_knh=128, stride_vnt=6144, stride_vnh=128,
              stride_ot=4096, stride_h=2560, stride_d=2560, warm_bytes=0)
KERNELS = {
    "split (decode, fresh)": (attention._split_kernel, 4, dict(
        G=4, D=128, BLOCK_R=16, BLOCK_S=64, SPLIT=64, FRESH=True, BLOCK_T=1, PDL=True, ROWS=16, TRACE=False,
        EARLY=False, WARM=False, WARM_STEPS=1, WARM_THREADS=128)),
    "merge (decode)": (attention._merge_kernel, 1, dict(
        NSPLIT=32, G=4, D=128, DB=64, BLOCK_R=16, SPLITS_P2=32, CHUNK=32, PDL=True, TRACE=False)),
    "add + norm": (elementwise._add_rms_norm_kernel, 4, dict(D=2560, BLOCK=4096, PDL=True, TRACE=False)),
}


def compile_sm90(fn, warps: int, constexprs: dict, runtime: dict, folder: str) -> tuple[str, int]:
    """(path of fn's cubin for sm_90a, written in folder; its shared memory in bytes). Runtime ints equal to 1
    become constants, those divisible by 16 and every pointer get Triton's divisibility hint, as at launch. Every
    argument must be named here (a pointer, a float, a constexpr or a runtime int): one typed by guess is the
    mistake this tool exists to avoid."""
    names = fn.arg_names
    consts = dict(constexprs, **{k: v for k, v in runtime.items() if v == 1 and k in names})
    sig, attrs = {}, {}
    for i, n in enumerate(names):
        if n in consts:
            sig[n] = "constexpr"
        elif n in POINTERS:
            sig[n], attrs[(i,)] = POINTERS[n], [["tt.divisibility", 16]]
        elif n in FLOATS:
            sig[n] = "fp32"
        elif n in runtime:
            sig[n] = "i32"
            if runtime[n] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            raise SystemExit(f"{fn.__name__}: argument '{n}' is not described (POINTERS, FLOATS, DECODE)")
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    kernel = triton.compile(src, target=TARGET, options={"num_warps": warps})
    ptx = os.path.join(folder, "k.ptx")
    with open(ptx, "w") as f:  # the bundled ptxas may be older than the PTX version this Triton writes
        f.write(re.sub(r"^\.version \d+\.\d+", ".version 8.8", kernel.asm["ptx"], flags=re.M))
    cubin = os.path.join(folder, "k.cubin")
    subprocess.run([os.path.join(BIN, "ptxas"), "--gpu-name", "sm_90a", ptx, "-o", cubin], check=True)
    return cubin, kernel.metadata.shared


def sass_profile(cubin: str) -> tuple[int, collections.Counter]:
    """(registers, instruction count by opcode) of the cubin's one kernel."""
    dump = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", "-res-usage", cubin], capture_output=True,
                          text=True, check=True).stdout
    regs = int(re.search(r"REG:(\d+)", dump).group(1))
    ops = collections.Counter()
    for line in dump.splitlines():
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if m:
            ops[m.group(2)] += 1
    return regs, ops


def main():
    for name, (fn, warps, consts) in KERNELS.items():
        with tempfile.TemporaryDirectory() as folder:
            cubin, shared = compile_sm90(fn, warps, consts, DECODE, folder)
            regs, ops = sass_profile(cubin)
        loads = {k: v for k, v in sorted(ops.items()) if k.startswith(("LDG", "STG", "LDS", "STS", "BAR"))}
        print(f"{name}: {sum(ops.values())} instructions, {regs} registers, {shared} B shared, {warps} warps")
        print(f"  memory and barriers: {loads}")
        print(f"  most frequent: {ops.most_common(8)}")


if __name__ == "__main__":
    main()
