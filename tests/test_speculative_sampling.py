"""Speculative sampling (temperature > 0) keeps the target's distribution.

Chi-square goodness-of-fit tests against exact probabilities, never against another sample;
fixed seeds make every test deterministic. The critical value is the 0.999 quantile of the
chi-square distribution (computed from torch.special.gammainc, no scipy).

1. accept_sampled on fixed rows (block verification): the first emitted token follows p[0]; given that i drafts
   were accepted, the next emitted token follows p[i]; the number accepted follows block verification's exact
   odds (every draft block enumerated through the engine's block_weights), on average at least token-by-token
   verification's product of overlaps sum(min(p, q)); q == p always accepts, q disjoint from p always rejects.
   With a one-hot q (a draft proposed as the drafter's argmax): draft i is accepted with probability
   p_i(draft), and after a rejection the token follows p_i with the draft removed; a certain draft (p = 1)
   always passes; k = 0.
1c. Exactly, in float64: whole generations of four tokens over a 3-token vocabulary, with target and draft rows
   that depend on the prefix, composed from block_weights and next_weights over every draft block and outcome,
   equal the target's distribution, for blocks of 1 to 3 drafts, rows in vocabulary order or each in its own
   (q's padded, as a sampler's buffer holds them).
2. End to end on a target with an 8-token vocabulary: the joint distribution of the first three
   generated tokens (the last two from a speculative step) with a DFlash, a DFlash 2 (its selector's sampled walk,
   q the walk's rows over 4 candidates; selector off: argmax drafts, q one-hot) and an EAGLE-3 drafter,
   at temperature 1 and with top-k/top-p, equals the plain sampler's exact one. The EAGLE-3 draft
   vocabulary covers half the tokens, so q is zero where the target has mass.
   On the eager path and on the static one (the device-position forwards that CUDA graphs capture, run
   eagerly), where the sampling runs inside the steps: the plain step's verdict, the drafters' proposals (a
   DFlash block, the EAGLE-3 chain) and the verify's rejection sampling.
3. The same seed gives the same text, run to run (tiny pair and the demo through the CLI).
4. The filtered rows themselves: the top-K_MAX candidates and the full sort give the reference distribution
   (softmax(logits / T), top-k, top-p) on a vocabulary larger than K_MAX, and the exponential race samples it.
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from dflash_cli.runtime.generation import PlainDecoder, Request, generate
from dflash_cli.runtime import sampling
from dflash_cli.runtime.drafters.dflash import DFlashProposer
from dflash_cli.runtime.drafters.dflash2 import DFlash2Proposer
from dflash_cli.runtime.drafters.eagle3 import Eagle3Proposer
from dflash_cli.runtime.sampling import (K_MAX, Filtered, SamplingParams, accept_sampled, begin, block_weights,
                                         next_weights, probabilities, sample)
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.speculative import SpeculativeDecoder
from dflash_cli.models.dflash import DFlashDrafter
from dflash_cli.models.dflash2 import DFlash2Drafter
from dflash_cli.models.eagle3 import Eagle3Drafter
from dflash_cli.models.qwen3 import Qwen3Model
from tiny import make_dflash, make_dflash2, make_eagle3, qwen3_config, random_qwen3_tensors, save_sharded

ALPHA = 0.999


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: thousands of tiny forwards


# ---------------------------------------------------------------------------------------------
# chi-square machinery


def chi2_quantile(df: int, level: float = ALPHA) -> float:
    """x with P(chi2_df <= x) = level: bisection on the regularised lower incomplete gamma."""
    cdf = lambda x: float(torch.special.gammainc(torch.tensor(df / 2, dtype=torch.float64),  # noqa: E731
                                                 torch.tensor(x / 2, dtype=torch.float64)))
    lo, hi = 0.0, 10.0 * df + 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < level else (lo, mid)
    return (lo + hi) / 2


def test_chi2_quantiles_match_tables():
    for df, x in [(1, 10.828), (2, 13.816), (5, 20.515), (10, 29.588), (30, 59.703)]:
        assert abs(chi2_quantile(df) - x) < 2e-3


def chi2(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> tuple[float, int]:
    """Pearson statistic and degrees of freedom of `counts` against `probs` (flattened).

    Cells expected below min_expected are pooled (smallest first) into one cell. A count in a
    cell of probability zero is an outright failure.
    """
    counts, probs = counts.flatten().double(), probs.flatten().double()
    probs = probs / probs.sum()
    n = counts.sum()
    impossible = counts[probs == 0].sum()
    assert impossible == 0, f"{int(impossible)} samples of probability-0 outcomes"
    keep = probs > 0
    counts, expected = counts[keep], probs[keep] * n
    order = expected.argsort()
    counts, expected = counts[order], expected[order]
    cut = int((expected < min_expected).sum())  # pool the small cells, and more until the pool is large enough
    while 0 < cut < len(expected) and expected[:cut].sum() < min_expected:
        cut += 1
    obs = torch.cat([counts[:cut].sum()[None], counts[cut:]]) if cut else counts
    exp = torch.cat([expected[:cut].sum()[None], expected[cut:]]) if cut else expected
    stat = float(((obs - exp) ** 2 / exp).sum())
    return stat, len(exp) - 1


def assert_fits(counts: torch.Tensor, probs: torch.Tensor, what: str) -> float:
    stat, df = chi2(counts, probs)
    assert df >= 1, what
    crit = chi2_quantile(df)
    assert stat < crit, f"{what}: chi2 = {stat:.1f} >= {crit:.1f} (df {df}); counts {counts.tolist()}"
    return stat


def test_chi2_has_power():
    """The machinery rejects a sample of another distribution and passes a sample of the right one."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    right = torch.bincount(torch.multinomial(p, 4000, True, generator=g), minlength=4)
    wrong = torch.bincount(torch.multinomial(torch.tensor([0.36, 0.32, 0.2, 0.12]), 4000, True, generator=g),
                           minlength=4)
    assert_fits(right, p, "right")
    stat, df = chi2(wrong, p)
    assert stat > chi2_quantile(df)
    with pytest.raises(AssertionError, match="probability-0"):
        chi2(torch.tensor([5, 5, 1]), torch.tensor([0.5, 0.5, 0.0]))


# ---------------------------------------------------------------------------------------------
# 1. accept_sampled with fixed distributions


def rows(g: torch.Generator, n: int, v: int, scale: float = 1.5, support=None) -> torch.Tensor:
    logits = torch.randn(n, v, generator=g, dtype=torch.float64) * scale
    if support is not None:
        mask = torch.full((v,), float("-inf"), dtype=torch.float64)
        mask[list(support)] = 0
        logits = logits + mask
    return torch.softmax(logits, -1).float()


def run_accept(p: torch.Tensor, q: torch.Tensor, trials: int, seed: int):
    """Draw drafts from q's rows, run accept_sampled; returns accepted counts [T] and emitted lists."""
    k, v = q.shape
    g = torch.Generator().manual_seed(seed)
    drafts = torch.stack([torch.multinomial(q[i], trials, replacement=True, generator=g) for i in range(k)], 1)
    accepted, emitted = [], []
    for t in range(trials):
        d = drafts[t]
        n, bonus = (int(x) for x in accept_sampled(d, q, p, g))
        assert 0 <= n <= k and 0 <= bonus < v
        accepted.append(n)
        emitted.append(d[:n].tolist() + [bonus])
    return torch.tensor(accepted), emitted


def dense(probs: torch.Tensor, ordered: bool = True) -> Filtered:
    """Rows over the whole vocabulary; ordered False: as a q buffer holds them (p read at their ids, not gathered)."""
    return Filtered(torch.arange(probs.shape[-1]).expand(probs.shape), probs, ordered)


def kept_odds(h: torch.Tensor) -> torch.Tensor:
    """h [k] (block_weights') -> P(n = i), i = 0..k: the last i with u_i < h_i."""
    later = torch.cat([torch.flip(torch.cumprod(torch.flip(1 - h, [0]), 0), [0]), torch.ones(1, dtype=h.dtype)])
    return torch.cat([torch.ones(1, dtype=h.dtype), h]) * later  # h_i * prod(1 - h_j, j > i); h_0 = 1


def count_odds(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Fixed rows p [k+1, V], q [k, V] -> P(n = i) under block verification: every draft block, weighted by q."""
    k, v = q.shape
    p, q = p.double(), q.double()
    out = torch.zeros(k + 1, dtype=torch.float64)
    for block in itertools.product(range(v), repeat=k):
        x = torch.tensor(block, dtype=torch.long)
        weight = q[torch.arange(k), x].prod()
        if weight > 0:
            out += weight * kept_odds(block_weights(x, dense(q), dense(p), v)[0])
    return out


def check_accept_distribution(p, q, accepted, emitted, label):
    k, v = q.shape
    trials = len(emitted)
    # Token i of the step, among steps that got that far, follows p[i] (rows are independent here).
    for i in range(k + 1):
        toks = torch.tensor([e[i] for e in emitted if len(e) > i], dtype=torch.long)
        if len(toks) >= 200:
            assert_fits(torch.bincount(toks, minlength=v), p[i], f"{label}: emitted token {i}")
    # Accepted counts: block verification's odds; on average never fewer than token by token's, where
    # P(n >= i+1 | n >= i) = sum(min(p_i, q_i)).
    p_n = count_odds(p, q)
    p_n = torch.where(p_n < 1e-6, 0.0, p_n)  # rounding of odds that are exactly 0
    if (p_n > 0).sum() > 1:
        assert_fits(torch.bincount(accepted, minlength=k + 1), p_n, f"{label}: accepted count")
    else:
        assert (accepted == int(p_n.argmax())).all()
    overlap = torch.minimum(p[:k].double(), q.double()).sum(-1)
    assert float((p_n * torch.arange(k + 1)).sum()) >= float(overlap.cumprod(0).sum()) - 1e-6, label
    return trials


@pytest.mark.parametrize("seed", [0, 1])
def test_accept_sampled_partial_overlap(seed):
    g = torch.Generator().manual_seed(100 + seed)
    v, k = 6, 3
    p = rows(g, k + 1, v)
    q = rows(g, k, v)
    accepted, emitted = run_accept(p, q, 20000, seed)
    check_accept_distribution(p, q, accepted, emitted, "overlap")
    assert 0 < (accepted == 0).float().mean() < 0.9  # both acceptance and rejection happen
    # The first token's marginal is p[0], not q[0]: the test would tell them apart.
    first = torch.bincount(torch.tensor([e[0] for e in emitted]), minlength=v)
    stat, df = chi2(first, q[0])
    assert stat > chi2_quantile(df)


def test_accept_sampled_with_zeros_on_both_sides():
    """Filtered rows: q is zero where p has mass (EAGLE-3 tokens outside the draft vocabulary),
    p is zero where q has mass (the target's top-k/top-p cut)."""
    g = torch.Generator().manual_seed(7)
    v = 6
    p = torch.stack([rows(g, 1, v, support=s)[0] for s in ([0, 1, 2, 3], [1, 2, 4], [0, 3, 4, 5], [2, 5])])
    q = torch.stack([rows(g, 1, v, support=s)[0] for s in ([2, 3, 4], [0, 1, 2, 4, 5], [3, 4])])
    accepted, emitted = run_accept(p, q, 20000, 3)
    check_accept_distribution(p, q, accepted, emitted, "zeros")
    assert (accepted >= 1).any() and (accepted == 0).any()


def test_accept_sampled_q_equal_p_always_accepts():
    g = torch.Generator().manual_seed(8)
    v, k = 6, 3
    p = rows(g, k + 1, v)
    accepted, emitted = run_accept(p, p[:k].clone(), 6000, 4)
    assert (accepted == k).all()
    check_accept_distribution(p, p[:k], accepted, emitted, "q == p")


def test_accept_sampled_disjoint_q_always_rejects():
    g = torch.Generator().manual_seed(9)
    v, k = 6, 3
    p = rows(g, k + 1, v, support=[0, 1, 2])
    q = rows(g, k, v, support=[3, 4, 5])
    accepted, emitted = run_accept(p, q, 6000, 5)
    assert (accepted == 0).all()  # the residual max(p - q, 0) is p itself
    assert_fits(torch.bincount(torch.tensor([e[0] for e in emitted]), minlength=v), p[0], "disjoint: residual")


# ---------------------------------------------------------------------------------------------
# 1b. accept_sampled with a one-hot q: drafts proposed as the drafter's argmax (certain drafts). The engine's
# proposers sample their drafts (benchmarks/sampled_acceptance.py: argmax drafts accepted less on the demo pair);
# that benchmark verifies argmax drafts this way, so the rule it relies on is exact: accept with probability
# p(draft); at a rejection draw from p with the draft removed.


def run_accept_onehot(p: torch.Tensor, drafts: torch.Tensor, trials: int, seed: int):
    """accept_sampled on fixed drafts [k] with q one-hot at them; accepted counts [T] and emitted lists."""
    k, v = drafts.shape[0], p.shape[1]
    q = torch.nn.functional.one_hot(drafts, v).float()
    g = torch.Generator().manual_seed(seed)
    accepted, emitted = [], []
    for _ in range(trials):
        n, bonus = (int(x) for x in accept_sampled(drafts, q, p, g))
        assert 0 <= n <= k and 0 <= bonus < v
        accepted.append(n)
        emitted.append(drafts[:n].tolist() + [bonus])
    return torch.tensor(accepted), emitted


def check_onehot_distribution(p, drafts, accepted, emitted, label):
    k, v = drafts.shape[0], p.shape[1]
    # Draft i is accepted with probability p_i(draft i): the count follows the products.
    acc = p[torch.arange(k), drafts].double()
    reach = torch.cat([torch.ones(1, dtype=torch.float64), acc.cumprod(0)])  # P(n >= i)
    p_n = reach - torch.cat([reach[1:], torch.zeros(1, dtype=torch.float64)])
    if (p_n > 0).sum() > 1:
        assert_fits(torch.bincount(accepted, minlength=k + 1), p_n, f"{label}: accepted count")
    else:
        assert (accepted == int(p_n.argmax())).all()
    for i in range(k + 1):
        # After a rejection at i (n == i < k): p_i with the draft removed, renormalised; after k acceptances, p_k.
        after = torch.tensor([e[i] for e, n in zip(emitted, accepted.tolist()) if n == i], dtype=torch.long)
        if i < k:
            expected = p[i].clone()
            expected[drafts[i]] = 0
        else:
            expected = p[k]
        if len(after) >= 200:
            assert_fits(torch.bincount(after, minlength=v), expected, f"{label}: token {i} after a rejection there")
        elif len(after):
            assert bool((expected[after] > 0).all()), f"{label}: token {i} of probability 0"
        # Token i's marginal, among steps that got that far, is still p_i: the speculative step is lossless.
        toks = torch.tensor([e[i] for e in emitted if len(e) > i], dtype=torch.long)
        if len(toks) >= 200:
            assert_fits(torch.bincount(toks, minlength=v), p[i], f"{label}: emitted token {i}")


@pytest.mark.parametrize("seed", [0, 1])
def test_accept_onehot_acceptance_is_p_of_the_draft(seed):
    g = torch.Generator().manual_seed(200 + seed)
    v, k = 6, 3
    p = rows(g, k + 1, v, scale=1.0)
    drafts = torch.tensor([int(p[0].argmax()), int(p[1].argmin()), int(p[2].argsort()[v // 2])])  # likely to rare
    accepted, emitted = run_accept_onehot(p, drafts, 20000, seed)
    check_onehot_distribution(p, drafts, accepted, emitted, "one-hot")
    assert 0 < (accepted == 0).float().mean() < 0.9 and (accepted >= 2).any()


def test_accept_onehot_certain_and_impossible_drafts():
    """q(x) = 1 with p(x) = 1: always accepted (the residual, all zero, is never drawn from); a draft the target
    cut (top-k/top-p: p(x) = 0): always rejected, and the residual is p itself."""
    g = torch.Generator().manual_seed(11)
    v = 6
    p = rows(g, 3, v)
    p[0] = 0
    p[0, 4] = 1  # the target is certain of the first draft
    p[1, 2] = 0
    p[1] /= p[1].sum()  # and excludes the second
    accepted, emitted = run_accept_onehot(p, torch.tensor([4, 2]), 6000, 6)
    assert (accepted == 1).all()
    assert all(e[0] == 4 and e[1] != 2 for e in emitted)
    assert_fits(torch.bincount(torch.tensor([e[1] for e in emitted]), minlength=v), p[1], "impossible draft")


def test_accept_with_no_drafts_draws_from_the_first_row():
    """k = 0 (a step at the end of the cache): nothing to accept, the token comes from p[0]."""
    g = torch.Generator().manual_seed(12)
    v = 6
    p = rows(g, 1, v)
    none = torch.zeros(0, dtype=torch.long)
    gen = torch.Generator().manual_seed(7)
    out = [accept_sampled(none, torch.zeros(0, v), p, gen) for _ in range(6000)]
    assert all(int(n) == 0 for n, _ in out)
    assert_fits(torch.bincount(torch.tensor([int(b) for _, b in out]), minlength=v), p[0], "k = 0")


# ---------------------------------------------------------------------------------------------
# 1c. block verification is lossless, exactly: whole generations composed from block_weights


def prefix_rows(prefix: tuple, salt: int, v: int = 3) -> torch.Tensor:
    """A distribution over v tokens that depends on the prefix, sometimes with a zero (a filtered row)."""
    g = torch.Generator().manual_seed(salt + sum((t + 1) * 5 ** i for i, t in enumerate(prefix)) * 2)
    w = torch.rand(v, generator=g, dtype=torch.float64) ** 2
    if torch.rand(1, generator=g) < 0.4:
        w[int(torch.randint(v, (1,), generator=g))] = 0
    return w / w.sum()


def as_buffer(rows: torch.Tensor, salt: int, pad: int) -> Filtered:
    """Rows as a sampler's buffer may hold them: each row's ids in its own order, then `pad` columns of id 0 at
    probability 0."""
    g = torch.Generator().manual_seed(salt)
    perm = torch.stack([torch.randperm(rows.shape[1], generator=g) for _ in range(rows.shape[0])])
    ids = torch.cat([perm, torch.zeros(rows.shape[0], pad, dtype=torch.long)], 1)
    probs = torch.cat([rows.gather(1, perm), torch.zeros(rows.shape[0], pad, dtype=rows.dtype)], 1)
    return Filtered(ids, probs)


def one_step(prefix: tuple, k: int, layout: str) -> dict:
    """The exact distribution of a step's emitted tokens (drafts kept + the next), every draft block and outcome.
    layout "dense": rows over the vocabulary in order, read both ways block by block (ordered: a gather; not: as a
    buffer holds them); "buffer": every row's ids in an order of its own, q's with a padding column."""
    out: dict = {}
    for block in itertools.product(range(3), repeat=k):
        q = torch.stack([prefix_rows(prefix + block[:i], 1) for i in range(k)])
        weight = q[torch.arange(k), torch.tensor(block)].prod()
        if weight == 0:
            continue
        p = torch.stack([prefix_rows(prefix + block[:i], 0) for i in range(k + 1)])
        if layout == "dense":
            ordered = sum(block) % 2 == 0
            q_rows, p_rows = dense(q, ordered=not ordered), dense(p, ordered=ordered)
        else:
            salt = sum((t + 1) * 5 ** i for i, t in enumerate(prefix + block))
            q_rows, p_rows = as_buffer(q, salt, 1), as_buffer(p, salt + 1, 0)
        h, w = block_weights(torch.tensor(block), q_rows, p_rows, 3)
        for n, odds in enumerate(kept_odds(h).tolist()):
            if odds > 0:
                ids, row = next_weights(torch.tensor(n), w, q_rows, p_rows, 3)
                for token, pt in zip(ids.tolist(), (row / row.sum()).tolist()):
                    key = block[:n] + (token,)
                    out[key] = out.get(key, 0.0) + float(weight) * odds * pt
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("layout", ["dense", "buffer"])
def test_block_verification_is_exactly_lossless(k, layout):
    length = 4

    def generations(prefix: tuple) -> dict:
        if len(prefix) >= length:
            return {prefix[:length]: 1.0}
        out: dict = {}
        for emitted, w in one_step(prefix, k, layout).items():
            for seq, v in generations(prefix + emitted).items():
                out[seq] = out.get(seq, 0.0) + w * v
        return out

    got = generations(())
    for seq in itertools.product(range(3), repeat=length):
        want = float(torch.stack([prefix_rows(seq[:i], 0)[seq[i]] for i in range(length)]).prod())
        assert abs(got.get(seq, 0.0) - want) < 1e-12, (seq, got.get(seq), want)
    # And a step keeps at least as many as token by token, on average: sum over blocks of q(block) times
    # sum_i prod_{j <= i} min(1, p_j / q_j).
    emitted = sum(len(e) * w for e, w in one_step((), k, layout).items())
    token = 1.0
    for block in itertools.product(range(3), repeat=k):
        q = torch.stack([prefix_rows(block[:i], 1)[block[i]] for i in range(k)])
        p = torch.stack([prefix_rows(block[:i], 0)[block[i]] for i in range(k)])
        if q.prod() > 0:
            token += float(q.prod() * torch.minimum(p / q, torch.ones(k, dtype=torch.float64)).cumprod(0).sum())
    assert emitted >= token - 1e-12 and (k == 1 or emitted > token + 1e-3), (emitted, token)


# ---------------------------------------------------------------------------------------------
# 2. end to end: the first tokens of generate() with a drafter, against the exact target probabilities

VOCAB = 8
PROMPT = [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampling")
    cfg = qwen3_config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    target_dir = root / "target"
    target_dir.mkdir()
    (target_dir / "config.json").write_text(json.dumps(cfg))
    # Smaller weights than tiny.make_qwen3: next-token distributions with several likely tokens.
    save_sharded(random_qwen3_tensors(cfg, seed=4, std=0.03), target_dir)
    target = Qwen3Model.load(target_dir)
    dflash = DFlashDrafter.load(make_dflash(root / "dflash", cfg, seed=5, layers=1, block_size=5,
                                            target_layer_ids=[0, 1], std=0.05), target)
    eagle = Eagle3Drafter.load(make_eagle3(root / "eagle3", cfg, seed=6, draft_vocab=4, std=0.15,
                                           eagle_aux_hidden_state_layer_ids=[0, 1, 1]), target)
    # DFlash 2: the selector walks 4 of the 8 tokens (q is zero on the others), or each row's argmax (q one-hot).
    folder = make_dflash2(root / "dflash2", cfg, seed=7, layers=1, block_size=5, target_layer_ids=[0, 1], std=0.05,
                          group_size=8, rank=4, top_k=4)
    dflash2 = {"dflash2": DFlash2Drafter.load(folder, target, selector=True),
               "dflash2-argmax": DFlash2Drafter.load(folder, target, selector=False)}
    return target, dflash, eagle, dflash2


def exact_joint(target, params: SamplingParams, n: int = 3) -> torch.Tensor:
    """P(first n tokens) [V]*n under the plain sampler: chained probabilities() of the target's logits."""

    def next_probs(ids):
        return probabilities(Session(target, 16).forward(ids).logits[-1], params).double()

    joint = torch.zeros((VOCAB,) * n, dtype=torch.float64)
    p1 = next_probs(PROMPT)
    for a in range(VOCAB):
        if p1[a] == 0:
            continue
        p2 = next_probs(PROMPT + [a])
        for b in range(VOCAB):
            if p2[b] == 0:
                continue
            joint[a, b] = p1[a] * p2[b] * next_probs(PROMPT + [a, b])
    assert abs(float(joint.sum()) - 1) < 1e-6
    return joint


# (drafter, params, draft length, runs). max_tokens = 3: the first token comes from the prefill,
# the next two from the first speculative step, cut after two tokens. With one draft the third token
# is the bonus whenever the draft is accepted; with more, the second draft's test.
CONFIGS = {
    "plain-T1": ("none", SamplingParams(temperature=1.0), 0, 1200),
    "plain-topk-topp": ("none", SamplingParams(temperature=0.8, top_k=3, top_p=0.8), 0, 1200),
    "dflash-topp-k1": ("dflash", SamplingParams(temperature=1.0, top_p=0.9), 1, 1500),  # the full sort's mode
    "eagle3-T1-k2": ("eagle3", SamplingParams(temperature=1.0), 4, 1500),
    "dflash-topk-topp-k2": ("dflash", SamplingParams(temperature=0.8, top_k=3, top_p=0.8), 4, 1200),
    "eagle3-topk-topp-k1": ("eagle3", SamplingParams(temperature=1.3, top_k=6, top_p=0.85), 1, 1200),
    "dflash2-T1-k2": ("dflash2", SamplingParams(temperature=1.0), 2, 1500),
    "dflash2-topk-topp-k3": ("dflash2", SamplingParams(temperature=0.8, top_k=3, top_p=0.8), 3, 1200),
    "dflash2-argmax-T1-k2": ("dflash2-argmax", SamplingParams(temperature=1.0), 2, 1200),
}


def make_decoder(models, kind: str, draft_len: int):
    _, dflash, eagle, dflash2 = models
    if kind == "none":
        return PlainDecoder(queue_ahead=True)  # on the static path: each step's token fed to the next inside it
    if kind in dflash2:
        return SpeculativeDecoder(DFlash2Proposer(dflash2[kind]), draft_len)
    return SpeculativeDecoder(DFlashProposer(dflash) if kind == "dflash" else Eagle3Proposer(eagle), draft_len)


def sampled_joint(target, decoder, params: SamplingParams, runs: int, path: str):
    """The first three tokens' counts over `runs` seeded generations (the last two from one speculative step), and
    the drafts that step accepted and offered among the two kept: (counts like exact_joint's, accepted, drafted)."""
    counts = torch.zeros_like(exact_joint(target, params))
    accepted = drafted = 0
    for seed in range(runs):
        p = SamplingParams(params.temperature, params.top_p, params.top_k, seed=seed)
        res = generate(Session(target, 16, path=path), decoder, Request(PROMPT, p, max_tokens=3))
        assert len(res.tokens) == 3 and res.finish_reason == "length"
        assert sum(len(s.emitted) for s in res.steps) == 2
        counts[tuple(res.tokens)] += 1
        if res.steps[0].draft:
            # A block keeps its size near max_tokens (one graph shape); what passes max_tokens is cut.
            assert len(res.steps[0].draft) == min(decoder.draft_len, 16 - len(PROMPT) - 1)
            accepted += min(res.steps[0].accepted, 2)  # the drafts that reach the two tokens kept
            drafted += min(len(res.steps[0].draft), 2)
    return counts, accepted, drafted


def assert_joint_fits(counts, joint, label: str) -> None:
    """Chi-square of the sampled first three tokens against the exact joint: tokens 1-2, 1-3 and 2-3."""
    assert_fits(counts.sum(-1), joint.sum(-1), f"{label}: tokens 1-2")
    assert_fits(counts, joint, f"{label}: tokens 1-3")
    assert_fits(counts.sum(0), joint.sum(0), f"{label}: tokens 2-3")


@pytest.mark.parametrize("path", ["eager", "static"])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_speculative_sampling_matches_the_target_distribution(models, config, path):
    target, dflash, eagle, _ = models
    kind, params, draft_len, runs = CONFIGS[config]
    decoder = make_decoder(models, kind, draft_len)
    joint = exact_joint(target, params)
    counts, accepted, drafted = sampled_joint(target, decoder, params, runs, path)
    # Drafts are accepted and rejected: both branches of the rejection sampler are exercised (dflash-topk-topp-k2
    # accepts about 4.5% of its first two drafts, old sampler and new alike: 0.041 and 0.055 over 400 seeds).
    assert kind == "none" or 0.02 < accepted / drafted < 0.95, accepted / drafted
    assert_joint_fits(counts, joint, config)

    if kind == "eagle3":
        # The target puts mass outside the draft vocabulary, where q is 0: only the residual
        # (or the bonus) can emit those tokens, and they must come out at the target's rate.
        outside = torch.ones(VOCAB, dtype=torch.bool)
        outside[eagle.draft_to_target] = False
        assert outside.sum() == VOCAB - 4
        p2 = joint.sum((0, 2))
        assert float(p2[outside].sum()) > 0.2
        assert abs(float(counts.sum((0, 2))[outside].sum()) / runs - float(p2[outside].sum())) < 0.06


@pytest.mark.parametrize("path", ["eager", "static"])
@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, seed=11),
                                    SamplingParams(temperature=0.7, top_k=3, seed=12)],
                         ids=["T1", "T0.7-topk"])
def test_dflash2_drafts_follow_the_walk_rows_they_record(models, params, path):
    """The sampled walk: the drafts a proposal draws are distributed as the q rows it leaves for the verify, row 1
    given row 0's draft (the rows are conditional: each depends on the token the row before took). Chi-square of
    the first two drafts against q0(a) * q1(b | a), over repeated proposals at one position. The end-to-end test
    above would miss drafts drawn from another distribution than the recorded one unless it were far off."""
    target, *_, dflash2 = models
    proposer = DFlash2Proposer(dflash2["dflash2"])
    session = Session(target, 16, path=path)
    SpeculativeDecoder(proposer, 3).prefill(session, PROMPT)
    begin(params, "cpu")
    vocab, top_k = VOCAB, dflash2["dflash2"].selector.top_k
    q0, q1, counts = None, {}, torch.zeros(VOCAB, VOCAB)
    for _ in range(3000):
        drafts, q = proposer.propose(PROMPT[-1], 3, params)
        dense = q.dense(vocab)
        assert (q.probs[:, top_k:] == 0).all() and torch.allclose(dense.sum(-1), torch.ones(3))
        a, b = int(drafts[0]), int(drafts[1])
        assert dense[0, a] > 0 and dense[1, b] > 0
        q0 = dense[0] if q0 is None else q0
        assert torch.equal(dense[0], q0)  # the first row follows the anchor alone
        q1.setdefault(a, dense[1])
        assert torch.equal(dense[1], q1[a])  # the second, the first draft
        counts[a, b] += 1
    joint = torch.zeros(VOCAB, VOCAB + 1, dtype=torch.float64)  # last column: drafts never drawn first
    for a in range(VOCAB):
        if a in q1:
            joint[a, :VOCAB] = q0[a].double() * q1[a].double()
        else:
            joint[a, VOCAB] = q0[a]
    assert len(q1) >= 2
    assert_fits(torch.cat([counts, torch.zeros(VOCAB, 1)], 1), joint, "DFlash 2 walk: first two drafts")


# ---------------------------------------------------------------------------------------------
# 3. the same seed, the same text


@pytest.mark.parametrize("path", ["eager", "static"])
@pytest.mark.parametrize("kind", ["none", "dflash", "eagle3", "dflash2"])
def test_the_same_seed_gives_the_same_text(models, kind, path):
    """Run to run, with fresh sessions and decoders: the same tokens, drafts and acceptances; other seeds differ.
    On the static path a session reused after a generation of other params gives them too."""
    target = models[0]
    reused = Session(target, 64, path=path)

    def run(seed, session=None):
        if session is None:
            session = Session(target, 64, path=path)
        session.reset()
        res = generate(session, make_decoder(models, kind, 3),
                       Request(PROMPT, SamplingParams(temperature=1.0, top_k=6, seed=seed), max_tokens=24))
        return res.tokens, [(s.draft, s.accepted) for s in res.steps]

    first = run(3)
    assert run(3) == first
    generate(reused, make_decoder(models, kind, 3), Request(PROMPT, SamplingParams(0.5, 0.7, 2, seed=9), 10))
    assert run(3, reused) == first
    if kind != "none":
        assert any(0 < a < len(d) for d, a in first[1])  # some step both accepted and rejected
    assert len({tuple(run(seed)[0]) for seed in range(4)}) > 1


@pytest.mark.parametrize("draft", ["dflash", "eagle3"])
def test_the_same_seed_gives_the_same_text_on_the_demo(cli, draft):
    def tokens(seed):
        r = cli("generate", "--model", "demo", "--prompt", "def fibonacci(n):", "--draft", draft,
                "--temperature", "0.6", "--top-p", "0.95", "--top-k", "20", "--seed", seed, "--max-tokens", "40", "--json")
        assert r.code == 0, r.err
        res = json.loads(r.out)
        assert res["stats"]["draft_kind"] == draft
        return res["tokens"]

    first = tokens(7)
    assert len(first) == 40 and tokens(7) == first


# ---------------------------------------------------------------------------------------------
# 4. the filtered rows on a vocabulary larger than K_MAX


def reference_probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """softmax(logits / T) restricted by top-k then top-p, over the whole vocabulary in float64 (a sort per row)."""
    scores = logits.double() / params.temperature
    if 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    sorted_p = sorted_p.masked_fill((sorted_p.cumsum(-1) - sorted_p) >= params.top_p, 0.0)
    probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return probs / probs.sum(-1, keepdim=True)


@pytest.mark.parametrize("top_k", [1, 20, K_MAX, 0, K_MAX + 36])
@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.3])
@pytest.mark.parametrize("temperature", [0.6, 1.3])
def test_filtered_rows_are_the_reference_distribution(top_k, top_p, temperature):
    """The K_MAX candidates (top_k <= K_MAX), every token uncut (top_k 0, top_p 1) and the full sort (otherwise)
    against the reference, on 300 tokens; the mode is what the params ask for."""
    g = torch.Generator().manual_seed(top_k * 7 + int(top_p * 10))
    logits = torch.randn(5, 300, generator=g) * 3
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    uncut = sampling.ALL if top_k == 0 and top_p == 1 else sampling.FULL
    assert sampling.mode(params) == (sampling.TOP_K if 0 < top_k <= K_MAX else uncut)
    got = probabilities(logits, params)
    torch.testing.assert_close(got.double(), reference_probabilities(logits, params), rtol=1e-4, atol=1e-6)
    if top_k:
        assert ((got > 0).sum(-1) <= top_k).all()


@pytest.mark.parametrize("top_k", [20, 0])
def test_the_exponential_race_samples_the_filtered_row(top_k):
    """sample() (one row at a time, as a plain step draws inside its graph) against probabilities(), and the same
    seed draws the same tokens."""
    g = torch.Generator().manual_seed(31)
    logits = torch.randn(300, generator=g) * 1.5
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=top_k, seed=4)
    s = begin(params, "cpu")
    draws = torch.stack([sample(logits, params, s) for _ in range(6000)])
    assert_fits(torch.bincount(draws, minlength=300), probabilities(logits, params), f"top_k {top_k}")
    s = begin(params, "cpu")
    assert torch.equal(torch.stack([sample(logits, params, s) for _ in range(50)]), draws[:50])


def test_the_race_gives_no_mass_to_negligible_tokens_of_a_large_vocabulary():
    """The CPU noise is never 0: noise 0 (U = 0, once in 2^24 floats) made its token win whatever its weight, so
    over a 152k vocabulary (the all mode keeps every token) about 1% of draws were a uniform token."""
    g = torch.Generator().manual_seed(5)
    weights = torch.full((64, 151936), 1e-30)
    weights[:, 7] = 1.0
    assert all((sampling.race(weights, g) == 7).all() for _ in range(20))
    lone = torch.zeros(64, 151936)
    lone[:, 7] = 1.0  # a row's only candidate wins whatever its noise
    assert all((sampling.race(lone, g) == 7).all() for _ in range(20))
