"""The sampler's kernels (kernels/sampling.py) against runtime/sampling.py's torch code, on CPU through Triton's
interpreter (in a subprocess: TRITON_INTERPRET must be set before kernels are defined): the filtered rows, their
draws on the same noise, a draft head's id map, the plain top-k, and the block-verification verdict. Small chunks and
merges, so that a row of a few hundred tokens runs every level of the kernels' tree. Skipped where triton is not
installed (a CUDA extra)."""

import textwrap

import pytest

from interpret import run_interpreted

pytest.importorskip("triton")

CHECK = textwrap.dedent("""
    import torch
    from dflash_cli.kernels import sampling as kernel
    from dflash_cli.runtime import sampling
    from dflash_cli.runtime.sampling import SamplingParams, TOP_K, Filtered
    kernel.CHUNK = 64  # several chunks a row, the last one partly filled
    kernel.MERGE_KEYS = 128  # two lists of 64 a merge: 200 tokens are 4 chunks, merged 4 -> 2 -> the row's
    K = sampling.K_MAX
    g = torch.Generator().manual_seed(0)

    def by_value(rows, logits):
        # Each row's probability per distinct logit value: tied logits (bf16 has many) may swap places.
        d = rows.dense(logits.shape[-1])
        out = []
        for r in range(d.shape[0]):
            _, group = torch.unique(logits[r].float(), return_inverse=True)
            out.append(torch.zeros(logits.shape[-1]).scatter_add_(0, group, d[r]))
        return torch.stack(out)

    for vocab in (64, 200):
        for dtype in (torch.float32, torch.bfloat16):
            logits = (torch.randn(5, vocab, generator=g) * 3).to(dtype)
            for params in (SamplingParams(0.6, 0.95, 20), SamplingParams(1.0, 1.0, 64) if dtype == torch.float32
                           else SamplingParams(0.3, 0.5, 1)):
                s = sampling.Sampler(logits.device)
                s.load(params)
                want = sampling.filtered(logits, TOP_K, s)  # torch: logits on CPU
                ids = torch.zeros(8, K, dtype=torch.long)
                probs = torch.zeros(8, K)
                kernel.filtered(logits, K, s.temperature, s.top_p, s.top_k, ids[1:6], probs[1:6])
                got = Filtered(ids[1:6].clone(), probs[1:6].clone())
                err = (by_value(got, logits) - by_value(want, logits)).abs().max().item()
                assert err < 1e-6, (vocab, dtype, params, err)
                assert torch.allclose(got.probs.sum(-1), torch.ones(5))
                # The draw on the kernel's noise (torch.rand [rows, K] after this seed), and a draft head's map.
                to_target = torch.randperm(4 * vocab, generator=g)[:vocab]
                torch.manual_seed(7)
                tokens = kernel.filtered(logits, K, s.temperature, s.top_p, s.top_k, ids[:5], probs[:5], draw=True,
                                         to_target=to_target)
                torch.manual_seed(7)
                u = torch.rand(5, K)
                best = (probs[:5] / -torch.log(u.clamp_min(2.0 ** -25))).argmax(-1)
                assert torch.equal(tokens, ids[:5].gather(1, best[:, None])[:, 0]), (vocab, params)
                assert torch.equal(ids[:5], to_target[got.ids]) and torch.equal(probs[:5], got.probs)

    # The plain top-k: torch's values; ids as a stable descending sort's (of equal values the lower index first).
    # Chunks of 512: the floor's packed path on random rows and on an ascending one at k = 64, the whole chunk's
    # where more than 4 k logits reach the floor (all tied; ascending at k = 16); a row of many ties at the cut; k
    # below a power of two; a last chunk shorter than k (1060 = 2 x 512 + 36); merges of 2 lists (k = 64).
    kernel.CHUNK = 512
    for vocab, k, dtype in ((1060, 64, torch.float32), (1100, 16, torch.bfloat16), (600, 5, torch.float32)):
        logits = (torch.randn(5, vocab, generator=g) * 3).to(dtype)
        logits[2] = (logits[2] * 2).round()
        logits[3] = torch.arange(vocab)
        logits[4] = 1.0
        values, ids = kernel.top_k(logits, k)
        want_values, _ = torch.topk(logits, k, dim=-1)
        want_ids = torch.sort(logits.float(), dim=-1, descending=True, stable=True).indices[:, :k]
        assert values.dtype == dtype and torch.equal(values, want_values), (vocab, k, dtype)
        assert torch.equal(ids, want_ids), (vocab, k, dtype)

    # The verdict against sampling.accept itself, on the same noise (tests/verdict_check.py).
    import sys
    sys.path.insert(0, "tests")
    from verdict_check import check_verdicts
    check_verdicts("cpu")
    print("ok")
""")


def test_sampling_kernels_match_reference_in_interpreter():
    run_interpreted(CHECK, timeout=600)


# The kernels dispatched (ops.model_kernels forced to the interpreted module on CPU) through whole sampled
# generations on the static path (what the GPU's graphs capture): DFlash and EAGLE-3 (a draft head's id map,
# each chained row written into the q buffer). At a temperature near 0 the draws are the argmaxes, so every output
# must be plain greedy's: the rows, the q buffer and the verdict are wired as the torch path's.
DISPATCH = textwrap.dedent("""
    import json, sys, tempfile
    from pathlib import Path
    import torch
    sys.path.insert(0, "tests")
    from interpret import counting
    from tiny import make_dflash, make_eagle3, make_qwen3
    from dflash_cli.kernels import sampling as kernel
    from dflash_cli.layers import ops
    from dflash_cli.models.dflash import DFlashDrafter
    from dflash_cli.models.eagle3 import Eagle3Drafter
    from dflash_cli.models.qwen3 import Qwen3Model
    from dflash_cli.runtime.drafters.dflash import DFlashProposer
    from dflash_cli.runtime.drafters.eagle3 import Eagle3Proposer
    from dflash_cli.runtime.generation import PlainDecoder, Request, generate
    from dflash_cli.runtime.sampling import SamplingParams
    from dflash_cli.runtime.session import Session
    from dflash_cli.runtime.speculative import SpeculativeDecoder
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp())
    target_dir = make_qwen3(root / "target", seed=5, num_hidden_layers=3, with_tokenizer=False)
    cfg = json.loads((target_dir / "config.json").read_text())
    target = Qwen3Model.load(target_dir)
    dflash = DFlashDrafter.load(make_dflash(root / "d", cfg, seed=6, layers=1, block_size=4), target)
    eagle3 = Eagle3Drafter.load(make_eagle3(root / "e", cfg, seed=7), target)
    kernel.CHUNK = 512  # one chunk of the 384 tokens, its floor's path (the interpreter is slow on 2048)
    calls = {}
    module = counting(kernel, ("filtered", "accept"), ("fits",), calls)
    prompt = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(2)).tolist()
    def run(decoder, params):
        session = Session(target, max_len=64, path="static")
        return generate(session, decoder, Request(prompt, params, max_tokens=6)).tokens
    want = run(PlainDecoder(), SamplingParams())
    saved = ops.model_kernels
    ops.model_kernels = lambda x, name: module if name == "sampling" else None
    try:  # two drafts a step: the interpreter takes ~0.6 s a row
        for make in (lambda: SpeculativeDecoder(DFlashProposer(dflash), 2),
                     lambda: SpeculativeDecoder(Eagle3Proposer(eagle3), 2)):
            got = run(make(), SamplingParams(temperature=1e-4, top_p=0.95, top_k=20, seed=1))
            assert got == want, (got, want)
    finally:
        ops.model_kernels = saved
    assert calls.get("filtered", 0) >= 8 and calls.get("accept", 0) >= 2, calls
    print("ok", calls)
""")


def test_the_sampler_with_its_kernels_is_wired_as_the_torch_path():
    run_interpreted(DISPATCH, timeout=600)
