"""The sampled verdict kernel (kernels/sampling.accept, block verification) against the torch code
(runtime/sampling.accept) on the same noise: in Triton's interpreter on CPU (test_sampling_kernels.py) and compiled
on a GPU (tests/gpu/test_kernels_gpu.py)."""

import torch

from dflash_cli.kernels import sampling as kernel
from dflash_cli.runtime import sampling
from dflash_cli.runtime.sampling import TOP_K, SamplingParams


def want_accept(drafts, q, p, vocab, noise, rows):
    """sampling.accept fed the kernel's noise (uniform [R + K]: R = the rows' power of two, the first k the
    acceptance's, then the race's as Exp(1) = -log(u))."""
    rand, race_noise = torch.rand, sampling.race_noise
    torch.rand = lambda n, **kw: noise[:n].clone()
    race = -torch.log(noise[rows:].clamp_min(2.0 ** -25))
    sampling.race_noise = lambda shape, device, gen: race[:shape[-1]].view(shape)
    try:
        n, tok = sampling.accept(drafts, q, p, vocab, None)
    finally:
        torch.rand, sampling.race_noise = rand, race_noise
    return int(n), int(tok)


def check_verdicts(device: str, trials: int = 28, vocab: int = 500) -> None:
    """The q rows sit in a buffer of MAX_ROWS whose rows from k on hold another proposal's (row k one near p's: when
    every draft is kept q is not read there), and p is close to q, so that every count of accepted drafts comes up,
    all k of them included."""
    g = torch.Generator().manual_seed(0)
    K = sampling.K_MAX
    s = sampling.Sampler(torch.device("cpu"))
    s.load(SamplingParams(0.8, 0.95, 30))
    seen = set()
    for trial in range(trials):
        k = (0, 1, 2, 3, 7, 15, 31)[trial % 7]  # 31: a step of the most rows (MAX_STEP_ROWS 32)
        z = torch.randn(k + 1, vocab, generator=g) * 2
        p = sampling.filtered(z, TOP_K, s)
        buffer = sampling.filtered(torch.randn(sampling.MAX_ROWS, vocab, generator=g) * 2, TOP_K, s)
        near = sampling.filtered(z + 0.3 * torch.randn(k + 1, vocab, generator=g), TOP_K, s)
        buffer.ids[: k + 1], buffer.probs[: k + 1] = near.ids, near.probs
        drafts = sampling.draw(buffer[:k], g)
        ids = torch.cat([torch.tensor([5]), drafts])
        on = [t.to(device) for t in (ids, buffer.ids, buffer.probs, p.ids, p.probs)]
        torch.manual_seed(trial)
        out = kernel.accept(*on).cpu()
        rows = max(2, 1 << k.bit_length())
        torch.manual_seed(trial)
        noise = torch.rand(rows + K, device=device).cpu()  # what the kernel drew
        n, tok = want_accept(drafts, buffer[:k], p, vocab, noise, rows)
        assert out.tolist() == [n, tok, *drafts.tolist()], (trial, out.tolist(), n, tok)
        seen.add("none" if n == 0 else "all" if n == k else "some")
    assert seen == {"none", "some", "all"}, seen
