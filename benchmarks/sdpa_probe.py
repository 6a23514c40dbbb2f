import torch, time
import torch.nn.functional as F
for t in (2048, 8192):
    q = torch.randn(32, t, 128, device="cuda", dtype=torch.bfloat16)
    for name, fn in (("3d", lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True)),
                     ("4d", lambda: F.scaled_dot_product_attention(q[None], q[None], q[None], is_causal=True))):
        fn(); torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(5): fn()
        torch.cuda.synchronize(); print(t, name, round((time.perf_counter() - t0) / 5 * 1000, 2), "ms")
