"""DFlash 2's kernels (kernels/dflash2.py) against the torch reference (models/dflash2.py), on CPU through Triton's
interpreter (in a subprocess: TRITON_INTERPRET must be set before kernels are defined): the convolution, the
selector's scores and its walk, greedy and sampled. Skipped where triton is not installed (a CUDA extra)."""

import re
import textwrap

import pytest

from interpret import run_interpreted

pytest.importorskip("triton")

CHECK = textwrap.dedent("""
    import torch
    from dflash_cli.kernels import dflash2 as kernel
    from dflash_cli.layers import ops
    from dflash_cli.models.dflash2 import CandidateSelector, convolve
    from dflash_cli.runtime.sampling import race, race_noise
    g = torch.Generator().manual_seed(0)
    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype)
    BF16 = 4e-2  # the interpreter truncates to bf16 (the GPU rounds to nearest, as torch): a few ulps apart
    def rel(a, b):
        return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()

    # The convolution: every block length against every tap count and group count; delta a view of the
    # projection's [T, 2, taps, G] (as DynamicConv.prepare passes it), the residual add fused or not.
    kernel.CONV_CHANNELS = 32  # several channel programs, the last one partly filled (H = 48)
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, BF16)):
        for rows in (1, 3, 8, 16):
            for taps in (1, 2, 3, 4):
                for groups in (1, 2, 4):
                    x, h = randn(rows, 48, dtype=dtype), randn(rows, 48, dtype=dtype)
                    base = randn(taps, 48, dtype=dtype)
                    delta = randn(rows, 2 * taps * groups, dtype=dtype).view(rows, 2, taps, groups)[:, 1]
                    assert kernel.conv_fits(x, delta, base, h)
                    assert rel(kernel.dynamic_conv(x, delta, base), convolve(x, delta, base)) <= tol, \\
                        (dtype, rows, taps, groups)
                    assert rel(kernel.dynamic_conv(x, delta, base, h), convolve(x, delta, base, h)) <= tol
                    # with the next sublayer's norm: the sum, and its RMSNorm
                    weight = 1 + 0.1 * randn(48, dtype=dtype)
                    got_h, got_x = kernel.conv_add_rms_norm(x, delta, base, h, weight, 1e-6)
                    want_h = convolve(x, delta, base, h)
                    assert rel(got_h, want_h) <= tol and rel(got_x, ops.rms_norm(want_h, weight, 1e-6)) <= tol

    # The selector: K candidates of V tokens, rank R; the codebooks in float32 and bf16 (the model's dtype).
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, BF16)):
        for k, K, R, V in ((7, 16, 40, 300), (3, 5, 16, 50), (1, 64, 100, 500)):
            sel = CandidateSelector(randn(V, R, dtype=dtype), randn(V, R, dtype=dtype), randn(R, 24, dtype=dtype), K)
            x, logits = randn(k, 24, dtype=dtype), randn(k, V)
            anchor = torch.tensor([V - 3])
            candidates, scores = sel.scores(x, logits, anchor)
            unary = logits.gather(1, candidates)
            projected = ops.linear(x, sel.projection)
            got = kernel.selector_scores(candidates, unary, anchor, projected, sel.predecessor, sel.successor)
            assert got.dtype == scores.dtype and rel(got, scores) <= tol, (dtype, k, K)
            scores = got  # the walk on the very same scores: identical picks
            tokens, q = CandidateSelector.walk(candidates, scores)
            got_tokens, got_q = kernel.selector_walk(candidates, scores)
            assert got_q is None and torch.equal(got_tokens, tokens), (k, K)
            # Sampled: the torch walk's draws, one row's noise per draw, replayed from the same generator state
            # against the kernel's walk on that noise drawn at once.
            temperature = torch.tensor([0.7])
            state = g.get_state()
            tokens, q = CandidateSelector.walk(candidates, scores, temperature, lambda w: race(w, g))
            g.set_state(state)
            noise = torch.cat([race_noise((1, K), "cpu", g) for _ in range(k)])
            got_tokens, got_q = kernel.selector_walk(candidates, scores, temperature, noise)
            assert torch.allclose(got_q, q, rtol=1e-5, atol=1e-7) and torch.equal(got_tokens, tokens), (k, K)

    # A greedy tie goes to the first candidate, a NaN wins (torch's argmax); the walk follows the pick's row.
    candidates = torch.arange(16).view(2, 8) + 100
    scores = torch.zeros(2, 8, 8)
    scores[0, 0, 3] = scores[0, 0, 5] = 1.0  # row 0: the tie -> candidate 3
    scores[1, 3, 6] = float("nan")
    assert kernel.selector_walk(candidates, scores)[0].tolist() == [103, 114]
    assert CandidateSelector.walk(candidates, scores)[0].tolist() == [103, 114]
    # Sampled at a high and a low temperature (read from the tensor): q follows, a cold walk is the greedy one.
    scores = randn(2, 8, 8)
    for t in (5.0, 0.01):
        noise = torch.empty(2, 8).exponential_(generator=g)
        tokens, q = kernel.selector_walk(candidates, scores, torch.tensor([t]), noise)
        assert torch.allclose(q[0], torch.softmax(scores[0, 0] / t, -1), rtol=1e-5, atol=1e-7)
    assert torch.equal(tokens, kernel.selector_walk(candidates, scores)[0])

    # Draws from q: a chi-square over many walks of one row (fresh noise each), against q itself.
    candidates, scores = torch.arange(6).view(1, 6), randn(1, 6, 6)
    noise = torch.empty(4000, 6).exponential_(generator=g)
    counts = torch.zeros(6)
    for n in noise.view(4000, 1, 6)[:800]:
        token, q = kernel.selector_walk(candidates, scores, torch.tensor([1.0]), n)
        counts[token] += 1
    expected = 800 * q[0]
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 20.5, (counts, expected)  # 5 degrees of freedom: p = 0.001
    print("ok")
""")


def test_dflash2_kernels_match_reference_in_interpreter():
    run_interpreted(CHECK, timeout=300)


# The drafter with its kernels dispatched (ops.model_kernels forced to the interpreted module on CPU) against the
# torch path, through whole generations on the static path (what the GPU's graphs capture): the conv views and
# residual adds, the selector's top-k (5 of a width of 8), the anchor, the sampler's temperature tensor and the noise
# as the model passes them. Greedy: the same drafts and tokens. Sampled: the same too, since on CPU one Exp(1) draw
# of [k, K] equals k draws of [1, K].
DISPATCH = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path
    import torch
    sys.path.insert(0, "tests")
    from interpret import counting
    from tiny import make_dflash2, make_qwen3
    from dflash_cli.kernels import dflash2 as kernel
    from dflash_cli.layers import ops
    from dflash_cli.models.dflash2 import DFlash2Drafter
    from dflash_cli.models.qwen3 import Qwen3Model
    from dflash_cli.runtime.drafters.dflash2 import DFlash2Proposer
    from dflash_cli.runtime.generation import Request, generate
    from dflash_cli.runtime.sampling import SamplingParams
    from dflash_cli.runtime.session import Session
    from dflash_cli.runtime.speculative import SpeculativeDecoder
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp())
    target_dir = make_qwen3(root / "target", seed=5, num_hidden_layers=3, with_tokenizer=False)
    cfg = json.loads((target_dir / "config.json").read_text())
    folder = make_dflash2(root / "d2", cfg, seed=6, layers=1, block_size=6, target_layer_ids=[0, 2], kernel_size=3,
                          top_k=5, rank=12)
    target = Qwen3Model.load(target_dir)
    drafter = DFlash2Drafter.load(folder, target, selector=True)
    from dflash_cli.kernels import sampling
    sampling.CHUNK = 128  # the selector's top-k: three chunks of the 384 tokens (the interpreter is slow on big ones)
    calls = {}
    module = counting(kernel, ("dynamic_conv", "conv_add_rms_norm", "top_k", "selector_scores", "selector_walk"),
                      ("conv_fits", "top_k_fits", "scores_fit", "walk_fits"), calls)
    prompt = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(2)).tolist()
    def run(params):
        session = Session(target, max_len=64, path="static")
        res = generate(session, SpeculativeDecoder(DFlash2Proposer(drafter)), Request(prompt, params, max_tokens=14))
        return res.tokens, [s.draft for s in res.steps]
    for params in (SamplingParams(), SamplingParams(temperature=0.9, seed=3)):
        want = run(params)
        ops.model_kernels, saved = (lambda x, name: module), ops.model_kernels
        try:
            got = run(params)
        finally:
            ops.model_kernels = saved
        assert got == want, (params, got, want)
    assert calls["dynamic_conv"] >= 4 and calls["conv_add_rms_norm"] >= 4, calls
    assert calls["top_k"] >= 2 and calls["selector_scores"] >= 2 and calls["selector_walk"] >= 2, calls
    print("ok", calls)
""")


def test_dflash2_drafter_with_its_kernels_gives_the_torch_drafts():
    run_interpreted(DISPATCH, timeout=300)


def test_dflash2_convolutions_compile_without_fused_products():
    """The interpreter cannot show the GPU's roundings: the convolutions compiled for sm_90 (no GPU needed) must
    round each tap's product as torch does, i.e. hold no fused multiply-add (kernels/dflash2.NO_FMA)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    from dflash_cli.kernels import dflash2 as kernel

    for fn, const in ((kernel._dynamic_conv_kernel, dict(GROUP=16, TAPS=2, BLOCK_T=8, BLOCK_C=128, RESIDUAL=True)),
                      (kernel._conv_add_rms_norm_kernel, dict(GROUP=16, TAPS=2, BLOCK=4096))):
        const["PDL"] = False
        names = fn.arg_names
        sig = {n: "constexpr" if n in const else "fp32" if n == "eps" else "i32" if n[0] in "TH" or "stride" in n
               else "*bf16" for n in names}
        src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(n),): v for n, v in const.items()})
        ptx = compile(src, target=GPUTarget("cuda", 90, 32), options=kernel.NO_FMA).asm["ptx"]
        assert not re.search(r"\bfma\.", ptx), fn.__name__
