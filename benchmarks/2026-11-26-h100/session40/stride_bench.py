"""Session 40: does a weight's row stride set how fast the skinny GEMM streams it?

In the decode graph o (rows 8 KB apart) and down (19 KB) stream at 2.66-2.69 TB/s where qkv and gate/up (5 KB) reach
2.94-2.95. Here every product's rows are padded by PAD elements (the kernel reads a row stride), in 36 layers' own
weights (no L2 reuse), and timed in CUDA graphs: each product alone over the 36 layers, and the four in a decode
chain (no attention, no norms, no warm-ups: a relative measure). Results are checked against the unpadded product.
"""

import sys

import torch

sys.path.insert(0, ".")
from dflash_cli.engine.kernels import cuda_gemm  # noqa: E402

LAYERS = 36
SHAPES = {"qkv": (6144, 2560), "o": (2560, 4096), "gate_up": (19456, 2560), "down": (2560, 9728)}
PADS = [int(p) for p in (sys.argv[1:] or ["0", "8", "64", "256"])]


def graph_ms(fn, reps=20) -> float:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def main():
    torch.manual_seed(0)
    dev = "cuda"
    xs = {name: torch.randn(1, k, device=dev, dtype=torch.bfloat16) for name, (n, k) in SHAPES.items()}
    xs["down"] = torch.randn(1, 9728, device=dev, dtype=torch.bfloat16)
    res = torch.randn(1, 2560, device=dev, dtype=torch.bfloat16)
    print(f"device {torch.cuda.get_device_name()}")
    for pad in PADS:
        ws = {name: [torch.randn(n, k + pad, device=dev, dtype=torch.bfloat16)[:, :k] * 0.02 for _ in range(LAYERS)]
              for name, (n, k) in SHAPES.items()}
        # correctness: the padded read against torch on the same view
        for name, w in ws.items():
            got = cuda_gemm.skinny_linear(xs[name], w[0]).float()
            ref = (xs[name].float() @ w[0].float().t())
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            assert err < 2e-2, (name, pad, err)

        def product(name):
            return lambda: [cuda_gemm.skinny_linear(xs[name], w) for w in ws[name]]

        def chain():
            h = res
            for i in range(LAYERS):
                qkv = cuda_gemm.skinny_linear(h, ws["qkv"][i])
                h = cuda_gemm.skinny_linear(qkv[:, :4096].contiguous(), ws["o"][i], residual=h)
                act = cuda_gemm.skinny_linear(h, ws["gate_up"][i], swiglu=True)
                h = cuda_gemm.skinny_linear(act, ws["down"][i], residual=h)
            return h

        line = [f"pad {pad:4d}: chain {graph_ms(chain):.4f} ms"]
        for name, (n, k) in SHAPES.items():
            us = graph_ms(product(name)) * 1000 / LAYERS
            line.append(f"{name} {us:6.2f} us {n * k * 2 / us / 1e3:5.0f} GB/s")
        print(" | ".join(line), flush=True)
        del ws
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
