"""GPU check for the graphed path: same tokens as the eager reference, lossless with graphs on.

Run on a CUDA machine: `python -m pytest -m gpu -s tests/gpu`.
"""

import time

import pytest
import torch

from dflash_cli.runtime.generation import PlainDecoder, Request, generate
from dflash_cli.runtime.drafters.base import Drafter
from dflash_cli.runtime.drafters.dflash import DFlashProposer
from dflash_cli.runtime.drafters.dflash2 import DFlash2Proposer
from dflash_cli.runtime.drafters.eagle3 import Eagle3Proposer
from dflash_cli.runtime.sampling import SamplingParams
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.speculative import SpeculativeDecoder
from dflash_cli.synthetic import random_drafter, random_target

from test_foundation_gpu import report

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def near_tie(model, tokens, at, path):
    """The reference path's top-2 margin at the divergence, in units of one bf16 step at the max logit."""
    import math

    s = Session(model, len(tokens) + 8, path=path)
    logits = s.forward(tokens[:at], all_logits=False).logits[-1]
    top2 = logits.topk(2).values
    ulp = 2.0 ** (math.floor(math.log2(float(logits.abs().max()))) - 7)
    return float(top2[0] - top2[1]) / ulp


def test_graphs_match_eager_over_128_steps_qwen3_4b_shapes():
    model = random_target("qwen3-4b", "cuda", torch.bfloat16, seed=0, max_position_embeddings=4096)
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, model.cfg.vocab_size, (64,), generator=g).tolist()
    runs = {}
    for path in ("eager", "graphs"):
        session = Session(model, 1024, path=path)
        t0 = time.perf_counter()
        runs[path] = generate(session, PlainDecoder(), Request(prompt, SamplingParams(), max_tokens=128))
        runs[path + "_s"] = time.perf_counter() - t0
        runs[path + "_capture_s"] = session.fast.capture_s if session.fast else 0.0
    d = first_diff(runs["eager"].tokens, runs["graphs"].tokens)
    margin = None if d is None else near_tie(model, prompt + runs["eager"].tokens, len(prompt) + d, "eager")
    report("gpu_graphs", {"device": torch.cuda.get_device_name(), "first_divergence": d, "margin_bf16_steps": margin,
                          "eager_tok_s": round(runs["eager"].decode_tok_per_s, 2),
                          "graphs_tok_s": round(runs["graphs"].decode_tok_per_s, 2),
                          "graphs_capture_s": round(runs["graphs_capture_s"], 3)})
    assert d is None or margin <= 4  # a near-tie: within 4 bf16 steps of the largest logit


def test_prefill_graphs_match_eager_bf16():
    """Prefills replayed from graphs (padded to their size bucket): a 2048-token prompt from 0, then 300 tokens
    after it (padded to 512), with new ids on every use, captured (capture_prefills: the bench's) on a size's first
    use, replayed on the later ones, and the second's prompts again on a fourth (the same logits, bit for bit). Against the
    eager forward (cuDNN attention, no padding) each use agrees to bf16 noise, and the greedy token is the same or a
    near-tie (the 300-token turn attends over the 2048 prompt's keys, so stale inputs or KV would show there)."""
    model = random_target("qwen3-4b", "cuda", torch.bfloat16, seed=0, max_position_embeddings=4096)
    g = torch.Generator().manual_seed(5)
    prompts = [[torch.randint(0, model.cfg.vocab_size, (n,), generator=g).tolist() for n in (2048, 300)]
               for _ in range(3)]
    prompts.append(prompts[1])
    eager, graphs = Session(model, 4096, path="eager"), Session(model, 4096, path="graphs")
    graphs.fast.capture_prefills = True
    errors, runs = [], []
    for turns in prompts:  # captured, replayed with new ids (twice), replayed with the second's ids
        eager.reset(), graphs.reset()
        runs.append([])
        for ids in turns:
            a, b = graphs.forward(ids).logits[-1].float().clone(), eager.forward(ids).logits[-1].float()
            runs[-1].append(a)
            errors.append(((a - b).abs().max() / b.abs().max()).item())
            ulp = 2.0 ** (torch.log2(b.abs().max()).floor().item() - 7)
            assert a.argmax() == b.argmax() or (b.max() - b[a.argmax()]).item() <= 4 * ulp
    assert sum(key[0] > 32 for key in graphs.fast.steps) == 2 and graphs.fast.captures == 2
    assert all(torch.equal(x, y) for x, y in zip(runs[1], runs[3]))  # the same inputs: the same logits
    report("gpu_prefill_graphs", {"rel_err_vs_eager": [round(e, 4) for e in errors]})
    assert max(errors) <= 6e-2


class Oracle(Drafter):
    """The real drafter runs (graphs, caches, rollback); its drafts are replaced by the truth for a random prefix."""

    def __init__(self, inner, truth, seed):
        import random

        self.inner, self.truth, self.rng = inner, truth, random.Random(seed)
        self.kind, self.capture, self.max_draft = inner.kind, inner.capture, inner.max_draft
        self.pos = 0

    def reset(self, max_len, path="eager"):
        self.inner.reset(max_len, path)

    def absorb(self, hidden, start, tokens):
        self.inner.absorb(hidden, start, tokens)
        self.pos = start + len(tokens)

    def rollback(self, length):
        self.inner.rollback(length)

    def propose(self, last, k, params):
        drafts, q = self.inner.propose(last, k, params)
        n = self.rng.randint(0, k)
        right = self.truth[self.pos + 1 : self.pos + 1 + n]
        if right:
            drafts = drafts.clone()
            drafts[: len(right)] = torch.tensor(right, device=drafts.device)
        return drafts, q


@pytest.mark.parametrize("kind", ["none", "dflash", "mtp"])
def test_hybrid_target_in_graphs_is_lossless_fp32(kind):
    """Qwen3.5-4B shapes (Gated DeltaNet + gated attention), fp32: the graphs path (DeltaNet kernels, the fold inside
    the verify's graph, padded short prompts) gives the eager path's greedy tokens, plain and speculative (an oracle
    forcing real acceptance), up to rare near-ties; no capture after warm-up."""
    from dflash_cli.runtime import graphs
    from dflash_cli.runtime.drafters import proposer as runtime
    from dflash_cli.runtime.warmup import prepare

    torch.backends.cuda.matmul.allow_tf32 = False
    model = random_target("qwen3.5-4b", "cuda", torch.float32, seed=3, max_position_embeddings=4096)
    g = torch.Generator().manual_seed(5)
    for trial, n in enumerate((9, 40)):  # a padded short prompt, a long one
        prompt = torch.randint(0, model.cfg.vocab_size, (n,), generator=g).tolist()
        eager = generate(Session(model, 512, path="eager"), PlainDecoder(), Request(prompt, SamplingParams(), 64))
        if kind == "none":
            decoder = PlainDecoder()
        else:
            inner = runtime(kind, random_drafter("qwen3.5-4b", kind, model))
            decoder = SpeculativeDecoder(Oracle(inner, prompt + eager.tokens, trial), 7)
        session = Session(model, 512)
        prepare(session, decoder, SamplingParams())
        before = graphs.Totals.captures
        res = generate(session, decoder, Request(prompt, SamplingParams(), 64))
        assert graphs.Totals.captures == before
        d = first_diff(eager.tokens, res.tokens)
        if d is not None:
            assert near_tie(model, prompt + eager.tokens, len(prompt) + d, "eager") < 0.01, (kind, trial, d)


@pytest.mark.parametrize("kind", ["dflash", "eagle3", "dflash2"])
def test_speculative_is_lossless_with_graphs_fp32(kind):
    # fp32 on the GPU (no TF32): decode and verify round alike up to rare near-ties.
    torch.backends.cuda.matmul.allow_tf32 = False
    model = random_target("qwen3-4b", "cuda", torch.float32, seed=3, max_position_embeddings=4096)
    drafter = random_drafter("qwen3-4b", kind, model)
    proposer = {"dflash": DFlashProposer, "eagle3": Eagle3Proposer, "dflash2": DFlash2Proposer}[kind](drafter)
    g = torch.Generator().manual_seed(4)
    for trial in range(3):
        prompt = torch.randint(0, model.cfg.vocab_size, (40 + trial,), generator=g).tolist()
        plain = generate(Session(model, 512), PlainDecoder(), Request(prompt, SamplingParams(), max_tokens=96))
        # Force real acceptance on random weights: propose the plain continuation for a random prefix.
        spec = generate(Session(model, 512), SpeculativeDecoder(Oracle(proposer, prompt + plain.tokens, trial), 7),
                        Request(prompt, SamplingParams(), max_tokens=96))
        d = first_diff(plain.tokens, spec.tokens)
        if d is not None:
            assert near_tie(model, prompt + plain.tokens, len(prompt) + d, "eager") < 0.01, (kind, trial, d)
        else:
            assert plain.tokens == spec.tokens


def test_folded_dflash_drafter_matches_unfolded_bf16(monkeypatch):
    """The DFlash drafter as loaded on the GPU (norm weights folded into its products, hidden_norm into the stacked
    context k/v product; its norms then run inside the products) against the same drafter unfolded: the same context
    keys and values and draft logits up to bf16 rounding, on graphs, for a 16-row block and a 2-row one."""
    from dflash_cli.layers import ops

    target = random_target("qwen3-4b", "cuda", torch.bfloat16, seed=0, max_position_embeddings=4096)
    folded = random_drafter("qwen3-4b", "dflash", target)
    monkeypatch.setattr(ops, "folds_norms", lambda device, dtype: False)
    plain = random_drafter("qwen3-4b", "dflash", target)
    assert folded.norms_folded and not plain.norms_folded
    hidden = torch.randn(40, len(plain.capture) * plain.cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
    plain, folded = DFlashProposer(plain), DFlashProposer(folded)
    for d in (plain, folded):
        d.reset(256, "graphs")
        d.absorb(hidden[:24], 0)  # a prompt (eager)
        d.absorb(hidden[24:], 24)  # a step's 16 rows (the absorb graph)
    err = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    assert err(folded.cache.k[:, :40], plain.cache.k[:, :40]) <= 2e-2
    assert err(folded.cache.v[:, :40], plain.cache.v[:, :40]) <= 2e-2
    for n in (folded.max_draft, 1):
        a, b = folded.draft_logits(7, n), plain.draft_logits(7, n)
        print(f"[folded_dflash] rows {n + 1}: draft logits rel err {err(a, b):.2e}")
        assert err(a, b) <= 3e-2, n
