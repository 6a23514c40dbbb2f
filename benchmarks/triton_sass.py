"""CPU: a step's Triton kernels compiled for the H100 (sm_90) without a GPU, as a launch would specialise them, and
their registers, shared memory and SASS instruction counts by opcode.

Triton specialises integer arguments at launch: those divisible by 16 get a divisibility hint (16-byte vector loads),
those equal to 1 become constants. Compiled without those hints a kernel looks very different (the decode split:
3200 instructions of scalar loads instead of 1080 with vector loads), so the arguments below are a decode step's at
Qwen3-4B shapes, and at Qwen3.5-4B's for its gated attention (head dim 256, RoPE on 64 dims, the output gate in the
merge). Needs Triton's bundled ptxas and cuobjdump (the pip wheel has them).

  python benchmarks/triton_sass.py            # the decode split, the merge, the add + norm and RoPE kernels
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
            "warm_ptr": "*u8", "gate_ptr": "*bf16", "q_out": "*bf16", "k_out": "*bf16", "v_out": "*bf16"}
FLOATS = {"scale", "eps"}


def split(d: int, row: int, kv: int) -> dict:
    """A decode row's fresh split at ctx 1024 (window 2048: 32 splits of 64 keys), as attention._attend launches it:
    head dim d, rows of `row` values from the projection, kv KV heads of 4 query heads each."""
    return dict(T=1, NSPLIT=32, stride_lt=1, stride_qt=row, stride_qh=d, stride_ks=kv * d, stride_kh=d,
                stride_vs=kv * d, stride_vh=d, stride_knt=row, stride_knh=d, stride_vnt=row, stride_vnh=d,
                warm_bytes=0)


def split_consts(d: int, r: int, kv: int) -> dict:
    """The split's constants: head dim d, RoPE on its first r dims, kv KV heads."""
    return dict(G=4, D=d, R=r, BLOCK_R=16, BLOCK_S=64, LEAST=64, CAP=256, PROGRAMS=512, KVB=kv, HOST_SPLIT=64,
                DYNAMIC=False, FRESH=True, BLOCK_T=1, PDL=True, ROWS=16, TRACE=False, EARLY=False, WARM=False,
                WARM_STEPS=1, WARM_THREADS=128, WINDOWED=False, low_ptr=None)


def merge_consts(d: int, gated: bool) -> dict:
    """The merge's constants: head dim d over 2 programs, with the output gate or without."""
    gate = dict(GATED=True) if gated else dict(GATED=False, gate_ptr=None)
    return dict(NSPLIT=32, G=4, D=d, DB=d // 2, BLOCK_R=16, SPLITS_P2=32, CHUNK=32, BLOCK_T=1, LEAST=64, CAP=256,
                PROGRAMS=512, KVB=8, HOST_SPLIT=64, DYNAMIC=False, PDL=True, TRACE=False, **gate)


# (kernel, warps, constexprs, runtime arguments) of each: Qwen3-4B (qkv rows 6144, 8 KV heads of 128), then
# Qwen3.5-4B's gated attention ([q | k | v | gate] rows 10240, 4 KV heads of 256, RoPE on 64 dims).
ROPE_ROWS = dict(H=16, KV=4, stride_qt=10240, stride_qh=256, stride_kt=10240, stride_kh=256, stride_vt=10240,
                 stride_vh=256, stride_ot=1024, stride_kl=0, stride_vl=0, stride_wl=0, stride_ol=0)
KERNELS = {
    "split (decode, fresh)": (attention._split_kernel, 4, split_consts(128, 128, 8), split(128, 6144, 8)),
    "merge (decode)": (attention._merge_kernel, 1, merge_consts(128, False),
                       dict(stride_lt=1, T=1, stride_ot=4096, stride_gt=0)),
    "add + norm": (elementwise._add_rms_norm_kernel, 4, dict(D=2560, BLOCK=4096, PDL=True, TRACE=False),
                   dict(stride_h=2560, stride_d=2560)),
    "Qwen3.5 split (decode, fresh, partial RoPE)": (attention._split_kernel, 4, split_consts(256, 64, 4),
                                                    split(256, 10240, 4)),
    "Qwen3.5 merge (decode, gated)": (attention._merge_kernel, 1, merge_consts(256, True),
                                      dict(stride_lt=1, T=1, stride_ot=4096, stride_gt=10240)),
    "Qwen3.5 q/k norm + partial RoPE + KV write": (elementwise._qk_norm_rope_kernel, 1,
                                                   dict(D=256, R=64, WRITE=True, PDL=True, TRACE=False), ROPE_ROWS),
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
            raise SystemExit(f"{fn.__name__}: argument '{n}' is not described (POINTERS, FLOATS, KERNELS)")
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
    for name, (fn, warps, consts, runtime) in KERNELS.items():
        with tempfile.TemporaryDirectory() as folder:
            cubin, shared = compile_sm90(fn, warps, consts, runtime, folder)
            regs, ops = sass_profile(cubin)
        loads = {k: v for k, v in sorted(ops.items()) if k.startswith(("LDG", "STG", "LDS", "STS", "BAR"))}
        print(f"{name}: {sum(ops.values())} instructions, {regs} registers, {shared} B shared, {warps} warps")
        print(f"  memory and barriers: {loads}")
        print(f"  most frequent: {ops.most_common(8)}")


if __name__ == "__main__":
    main()
