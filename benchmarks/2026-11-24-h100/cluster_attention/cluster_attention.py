"""GPU (record of a session 17 experiment that lost): cluster_attention.cu (one kernel per decode row: a
thread-block cluster per KV head, merged through distributed shared memory) against our Triton split + merge attention, Qwen3-4B heads, one query row.

36 layers' own K/V (each its own buffer), the visible length in device memory, timed as a CUDA graph of the 36
calls; each variant checked against an fp32 reference first. Prints one line per (keys, variant).
"""

import ctypes
import os
import sys

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(_HERE))))  # the checkout
from dflash_cli.engine.kernels import attention, cubin  # noqa: E402
from dflash_cli.engine.kernels.cubin import LaunchAttribute as _LaunchAttribute, _LaunchConfig  # noqa: E402

LAYERS, H, KV, D = 36, 32, 8, 128
SRC = os.path.join(_HERE, "cluster_attention.cu")  # a record beside this script, not part of the engine


class Cluster:
    def __init__(self):
        from pathlib import Path

        major, minor = torch.cuda.get_device_capability()
        image = cubin.build(Path(SRC), f"sm_{major}{minor}", [])
        self.drv = ctypes.CDLL("libcuda.so.1")
        torch.cuda.synchronize()
        self.mod = ctypes.c_void_p()
        assert self.drv.cuModuleLoadData(ctypes.byref(self.mod), image) == 0
        self.fns = {}

    def fn(self, name):
        if name not in self.fns:
            f = ctypes.c_void_p()
            assert self.drv.cuModuleGetFunction(ctypes.byref(f), self.mod, name.encode()) == 0, name
            code = self.drv.cuFuncSetAttribute(f, 14, 1)  # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
            assert code == 0, f"non-portable cluster attribute: {code}"
            if self.smem(name):
                code = self.drv.cuFuncSetAttribute(f, 8, self.smem(name))  # MAX_DYNAMIC_SHARED_SIZE_BYTES
                assert code == 0, f"dynamic shared memory {self.smem(name)}: {code}"
            self.fns[name] = f
        return self.fns[name]

    @staticmethod
    def smem(name):
        if "_pipe_" not in name:
            return 0
        stages, keys = (int(x[1:]) for x in name.split("_")[-2:])
        return stages * 2 * keys * D * 2

    def config(self, c, stream, pdl=False, smem=0):
        attrs = (_LaunchAttribute * 2)()
        attrs[0].id = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        attrs[0].value[0], attrs[0].value[1], attrs[0].value[2] = c, 1, 1
        attrs[1].id = 6
        attrs[1].value[0] = 1
        return _LaunchConfig((c, KV, 1), (256, 1, 1), smem, stream, attrs, 2 if pdl else 1), attrs

    def max_clusters(self, name, c):
        n = ctypes.c_int()
        cfg, keep = self.config(c, None, smem=self.smem(name))
        code = self.drv.cuOccupancyMaxActiveClusters(ctypes.byref(n), self.fn(name), ctypes.byref(cfg))
        return n.value if code == 0 else f"error {code}"

    def __call__(self, name, c, q, k, v, limit, out, scale, pdl=False):
        vals = [ctypes.c_void_p(q.data_ptr()), ctypes.c_int(q.stride(1)), ctypes.c_void_p(k.data_ptr()),
                ctypes.c_void_p(v.data_ptr()), ctypes.c_int(k.stride(0)), ctypes.c_int(k.stride(1)),
                ctypes.c_int(v.stride(0)), ctypes.c_int(v.stride(1)), ctypes.c_void_p(limit.data_ptr()),
                ctypes.c_void_p(out.data_ptr()), ctypes.c_float(scale), ctypes.c_int(int(pdl))]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.byref(x), ctypes.c_void_p) for x in vals])
        cfg, keep = self.config(c, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), pdl, self.smem(name))
        code = self.drv.cuLaunchKernelEx(ctypes.byref(cfg), self.fn(name), params, None)
        assert code == 0, f"launch {name} c={c}: {code}"
        return out


def graph_us(calls, reps=20) -> float:
    for c in calls:
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    for _ in range(3):
        g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000 / reps / len(calls)


def main():
    kern = Cluster()
    scale = D ** -0.5
    for name, c in (("cluster_attn_g4_u4", 16), ("cluster_pipe_g4_s4_k64", 16), ("cluster_pipe_g4_s4_k32", 8)):
        print(f"{name} cluster {c}: at most {kern.max_clusters(name, c)} active clusters")
    variants = [("cluster_attn_g4_u4", 16), ("cluster_pipe_g4_s4_k32", 16), ("cluster_pipe_g4_s6_k32", 16),
                ("cluster_pipe_g4_s4_k64", 16), ("cluster_pipe_g4_s3_k64", 16), ("cluster_pipe_g4_s4_k32", 8),
                ("cluster_pipe_g4_s4_k32", 4)]
    for keys, window in ((1, 2048), (1025, 2048), (2049, 4096), (4097, 8192), (8193, 16384)):
        torch.manual_seed(0)
        ks = [torch.randn(window, KV, D, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
        vs = [torch.randn(window, KV, D, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
        qs = [torch.randn(1, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
        outs = [torch.empty(1, H * D, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
        limit = torch.tensor([keys - 1], device="cuda")
        ref = torch.nn.functional.scaled_dot_product_attention(
            qs[0].transpose(0, 1)[None].float(), ks[0][:keys].transpose(0, 1)[None].float(),
            vs[0][:keys].transpose(0, 1)[None].float(), scale=scale, enable_gqa=True)[0, :, 0]
        err = lambda x: ((x.float().view(H, D) - ref).norm() / ref.norm()).item()  # noqa: E731
        kv_bytes = keys * KV * D * 2 * 2
        triton_calls = [lambda i=i: attention.attention_window(qs[i], ks[i], vs[i], limit, scale)
                        for i in range(LAYERS)]
        rows = [("triton split+merge", err(triton_calls[0]()), triton_calls)]
        for name, c in variants:
            calls = [lambda i=i, name=name, c=c: kern(name, c, qs[i], ks[i], vs[i], limit, outs[i], scale)
                     for i in range(LAYERS)]
            rows.append((f"{name} c{c}", err(calls[0]()), calls))
        for label, e, calls in rows:
            us = graph_us(calls)
            print(f"{keys:5d} keys ({kv_bytes / 1e6:5.1f} MB) {label:24s} {us:6.2f} us/layer "
                  f"{kv_bytes / us / 1e3:5.0f} GB/s  rel err {e:.1e}")
        # A length that moves (a graph replayed at growing positions): the cluster kernel reads it each call.
        limit.fill_(max(keys // 2, 1) - 1)
        ref2 = torch.nn.functional.scaled_dot_product_attention(
            qs[0].transpose(0, 1)[None].float(), ks[0][: max(keys // 2, 1)].transpose(0, 1)[None].float(),
            vs[0][: max(keys // 2, 1)].transpose(0, 1)[None].float(), scale=scale, enable_gqa=True)[0, :, 0]
        got = kern("cluster_pipe_g4_s4_k32", 16, qs[0], ks[0], vs[0], limit, outs[0], scale).float().view(H, D)
        print(f"      half length: rel err {((got - ref2).norm() / ref2.norm()).item():.1e}")
        del ks, vs


if __name__ == "__main__":
    main()
