"""Greedy speculative decoding is lossless: token for token the output of plain greedy decoding.

float32 on CPU, exact equality, with the real DFlash, DFlash 2 and EAGLE-3 drafters (random weights, so
they are mostly rejected) and with scripted proposers that know the plain continuation:
an oracle (every draft accepted), a partly-right one (rejection at every position of the block)
and the real drafters steered by the oracle for a random prefix of each proposal (so real drafter
caches see long accepted spans and rollbacks; after each one the drafter is checked against a
fresh drafter rebuilt from the committed tokens). Also: stop ids and max_tokens inside an accepted
span, the end of the context, and a two-turn conversation on one session.
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from dflash_cli.runtime.generation import PlainDecoder, Request, Result, generate
from dflash_cli.runtime.drafters.base import Drafter
from dflash_cli.runtime.drafters.dflash import DFlashProposer
from dflash_cli.runtime.drafters.dflash2 import DFlash2Proposer
from dflash_cli.runtime.drafters.eagle3 import Eagle3Proposer
from dflash_cli.runtime.sampling import SamplingParams
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.speculative import SpeculativeDecoder
from dflash_cli.models.dflash import DFlashDrafter
from dflash_cli.models.dflash2 import DFlash2Drafter
from dflash_cli.models.eagle3 import Eagle3Drafter
from dflash_cli.models.qwen3 import Qwen3Model
from tiny import make_dflash, make_dflash2, make_eagle3, make_qwen3

GREEDY = SamplingParams()
MAX_LEN = 128
EXTRA = 24  # plain continuation computed beyond max_tokens, for proposers that look ahead
N_PROMPTS = 9


# Drafters: name -> (target, make_dflash / make_eagle3 arguments)
DFLASH = {
    "A-b4": ("A", dict(seed=31, layers=1, block_size=4, target_layer_ids=[1, 2])),
    "A-b8": ("A", dict(seed=32, layers=2, block_size=8, target_layer_ids=[0, 2])),
    "B-b6": ("B", dict(seed=33, layers=1, block_size=6, target_layer_ids=[1])),
    # z-lab's Qwen3.5 drafters' layout: sliding-window layers (causal in the block) and a full one; a window shorter
    # than the contexts.
    "A-b4-swa": ("A", dict(seed=34, layers=2, block_size=4, target_layer_ids=[1, 2], sliding_window=5,
                           use_sliding_window=True, layer_types=["sliding_attention", "full_attention"])),
}
DFLASH2 = {  # the selector walking 5 candidates; B's drafter in the speculators layout, three channel groups
    "A-b6-k5": ("A", dict(seed=34, layers=1, block_size=6, target_layer_ids=[1, 2], top_k=5)),
    "B-b5-spec": ("B", dict(seed=35, layers=2, block_size=5, target_layer_ids=[0, 1], kernel_size=3, top_k=3,
                            layout="speculators")),
}
EAGLE3 = {
    "A-v200": ("A", dict(seed=41, draft_vocab=200)),
    "B-v384-hd24": ("B", dict(seed=42, draft_vocab=384, head_dim=24)),
}
DFLASH_LENS = {"A-b4": [None, 1, 2], "A-b8": [None, 3, 5], "B-b6": [None, 2, 4], "A-b4-swa": [None, 2]}
DFLASH2_LENS = {"A-b6-k5": [None, 2], "B-b5-spec": [None, 3]}
EAGLE3_LENS = {"A-v200": [1, 3, 6], "B-v384-hd24": [2, 5, None]}  # None: the proposer's most


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: thousands of tiny forwards


class Zoo:
    """Tiny random targets and drafters, built once; memoised plain greedy references."""

    def __init__(self, root):
        self.dirs, self.targets, self.cfgs = {}, {}, {}
        for name, over in {"A": dict(seed=21, num_hidden_layers=4),
                           "B": dict(seed=22, num_hidden_layers=3, hidden_size=48, intermediate_size=96)}.items():
            d = make_qwen3(root / name, with_tokenizer=False, **over)
            self.cfgs[name] = json.loads((d / "config.json").read_text())
            self.targets[name] = Qwen3Model.load(d)
        for name, (t, kw) in DFLASH.items():
            self.dirs[name] = make_dflash(root / f"dflash-{name}", self.cfgs[t], **kw)
        for name, (t, kw) in DFLASH2.items():
            self.dirs[name] = make_dflash2(root / f"dflash2-{name}", self.cfgs[t], **kw)
        for name, (t, kw) in EAGLE3.items():
            self.dirs[name] = make_eagle3(root / f"eagle3-{name}", self.cfgs[t], **kw)
        self.drafters = {name: self.load_drafter(name) for name in [*DFLASH, *DFLASH2, *EAGLE3]}
        rng = random.Random(7)
        lengths = [1, 2, 5, 9, 13, 17, 20, 24, 7]
        self.prompts = {t: [[rng.randrange(self.cfgs[t]["vocab_size"]) for _ in range(n)] for n in lengths]
                        for t in self.targets}
        self._plain: dict = {}

    def target_of(self, drafter: str) -> str:
        return (DFLASH.get(drafter) or DFLASH2.get(drafter) or EAGLE3[drafter])[0]

    def load_drafter(self, name: str):
        """A new drafter network for drafter `name`."""
        target = self.targets[self.target_of(name)]
        if name in DFLASH2:
            return DFlash2Drafter.load(self.dirs[name], target, selector=True)
        return (DFlashDrafter if name in DFLASH else Eagle3Drafter).load(self.dirs[name], target)

    def proposer(self, name: str, fresh: bool = False):
        """A runtime drafter (its own caches) over drafter `name`'s network (a new one where `fresh`)."""
        d = self.load_drafter(name) if fresh else self.drafters[name]
        if name in DFLASH2:
            return DFlash2Proposer(d)
        return DFlashProposer(d) if name in DFLASH else Eagle3Proposer(d)

    def plain(self, target: str, prompt: tuple, max_tokens: int, stops: tuple = (), max_len: int = MAX_LEN) -> Result:
        key = (target, prompt, max_tokens, stops, max_len)
        if key not in self._plain:
            session = Session(self.targets[target], max_len)
            self._plain[key] = generate(session, PlainDecoder(), Request(list(prompt), GREEDY, max_tokens, stops))
        return self._plain[key]

    def truth(self, target: str, prompt: list[int], max_tokens: int) -> list[int]:
        """prompt + the plain greedy continuation, EXTRA tokens past max_tokens (no stops)."""
        return list(prompt) + self.plain(target, tuple(prompt), max_tokens + EXTRA).tokens


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> Zoo:
    return Zoo(tmp_path_factory.mktemp("lossless"))


# ---------------------------------------------------------------------------------------------
# scripted proposers


class Scripted(Drafter):
    """Proposes from `truth` (prompt + plain greedy continuation, indexed by position): the first
    `right(k)` drafts are the true tokens, the rest deliberately wrong. Checks what the decoder
    tells it: absorbed positions are contiguous and hold the true tokens, `last` is the true token."""

    kind = "scripted"
    capture: tuple[int, ...] = ()  # needs no target states: absorb gets hidden=None

    def __init__(self, truth: list[int], vocab: int, max_draft: int = 8, seed: int | None = None, spread: int = 16,
                 hidden_size: int = 64):
        self.truth, self.vocab, self.max_draft, self.hidden_size = truth, vocab, max_draft, hidden_size
        self.rng = random.Random(seed) if seed is not None else None  # None: every draft right
        self.spread, self.bag = spread, []
        self.length = 0
        self.resets = 0
        self.log: list[int] = []  # right drafts per proposal

    def right(self, k: int) -> int:
        """All k, or a value from a shuffled bag of 0..spread (each comes once per spread+1 proposals)."""
        if self.rng is None:
            return k
        if not self.bag:
            self.bag = list(range(self.spread + 1))
            self.rng.shuffle(self.bag)
        return min(self.bag.pop(), k)

    def reset(self, max_len: int, path: str = "eager") -> None:
        self.length = 0
        self.resets += 1

    def absorb(self, hidden: torch.Tensor, start: int, tokens: list[int]) -> None:
        assert start == self.length, f"absorb at {start}, committed {self.length}"
        if self.capture:
            assert hidden.shape == (len(tokens), len(self.capture) * self.hidden_size)
        else:
            assert hidden is None
        assert tokens == self.truth[start : start + len(tokens)]
        self.length = start + len(tokens)

    def rollback(self, length: int) -> None:
        self.length = min(self.length, length)

    def propose(self, last: int, k: int, params):
        pos = self.length  # where `last` sits
        assert last == self.truth[pos]
        true = self.truth[pos + 1 : pos + 1 + k]
        assert len(true) == k, "proposal past the precomputed continuation"
        j = self.right(k)
        self.log.append(j)
        return torch.tensor(true[:j] + [(t + 1) % self.vocab for t in true[j:]]), None


def eagle3_logits(drafter: Eagle3Proposer, last: int, drafts: list[int]) -> torch.Tensor:
    """Draft-vocabulary logits of the chain fed [last] + drafts[:-1] (teacher forced)."""
    pos, state = drafter.first_state()
    rows = []
    for i, tok in enumerate([last] + drafts[:-1]):
        logits, state = drafter.chain_step(pos + i, state, tok)
        rows.append(logits)
    return torch.stack(rows)


class Steered(Drafter):
    """A real proposer whose first j drafts (j random per proposal) are replaced by the true
    tokens; the drafter itself still runs every step. Before each proposal the drafter's
    logits are compared with a fresh drafter that absorbed the committed tokens in one go,
    which checks that absorbs after partial acceptance and rollbacks left its caches right."""

    def __init__(self, zoo: Zoo, name: str, truth: list[int], seed: int | None, check_every: int = 1):
        """seed None: every draft replaced by the truth (full acceptance, the real drafter still running)."""
        self.zoo, self.name, self.truth = zoo, name, truth
        self.inner = zoo.proposer(name)
        self.fresh = zoo.proposer(name, fresh=True)
        self.target = zoo.targets[zoo.target_of(name)]
        self.kind, self.capture, self.max_draft = self.inner.kind, self.inner.capture, self.inner.max_draft
        self.rng = random.Random(seed) if seed is not None else None
        self.check_every = check_every
        self.tokens: list[int] = []  # committed tokens, as absorbed
        self.log: list[int] = []  # steered (true) drafts per proposal
        self.checked = 0

    def reset(self, max_len: int, path: str = "eager") -> None:
        self.inner.reset(max_len, path)
        self.max_len = max_len
        self.tokens = []

    def absorb(self, hidden, start, tokens):
        assert start == len(self.tokens)
        self.inner.absorb(hidden, start, tokens)
        self.tokens += tokens

    def rollback(self, length):
        self.inner.rollback(length)
        del self.tokens[length:]

    def propose(self, last, k, params):
        drafts, q = self.inner.propose(last, k, params)
        assert drafts.shape == (k,) and drafts.dtype == torch.long
        drafts = drafts.tolist()
        if len(self.log) % self.check_every == 0:
            self.check_against_fresh(last, drafts)
        pos = len(self.tokens)
        j = self.rng.randint(0, k) if self.rng else k
        self.log.append(j)
        true = self.truth[pos + 1 : pos + 1 + j]
        assert len(true) == j
        return torch.tensor(true + drafts[j:]), q

    def check_against_fresh(self, last: int, drafts: list[int]) -> None:
        session = Session(self.target, self.max_len)
        hidden = session.forward(self.tokens, capture=self.capture).hidden
        self.fresh.reset(self.max_len)
        if isinstance(self.fresh, DFlashProposer):
            self.fresh.absorb(hidden, 0)
            ours = self.inner.draft_logits(last, len(drafts))
            ref = self.fresh.draft_logits(last, len(drafts))
            if isinstance(self.fresh, DFlash2Proposer):  # drafts: the selector's walk, not each row's argmax
                assert self.fresh.propose(last, len(drafts), GREEDY)[0].tolist() == drafts
            else:
                assert ours.argmax(-1).tolist() == drafts
        else:
            self.fresh.absorb(hidden, 0, list(self.tokens))
            ours, ref = eagle3_logits(self.inner, last, drafts), eagle3_logits(self.fresh, last, drafts)
            assert self.inner.model.draft_to_target[ours.argmax(-1)].tolist() == drafts
        assert torch.allclose(ours, ref, rtol=1e-4, atol=1e-4), (ours - ref).abs().max()
        self.checked += 1


# ---------------------------------------------------------------------------------------------
# checks shared by every test


def check_steps(res: Result, prompt_len: int, max_tokens: int, max_len: int, draft_len: int) -> None:
    """Per-step accounting, and each block's size: min(draft_len, cache rows left); near max_tokens a block keeps
    its size (one graph shape) and what passes max_tokens is cut."""
    assert len(res.tokens) >= 1
    assert sum(len(s.emitted) for s in res.steps) == len(res.tokens) - 1  # the first comes from prefill
    produced = 1
    length = prompt_len  # committed target positions before each step
    for s in res.steps:
        assert s.accepted <= len(s.draft)
        assert 1 <= len(s.emitted) <= s.accepted + 1
        assert s.emitted[: s.accepted] == s.draft[: len(s.emitted)][: s.accepted]  # accepted drafts come first
        assert len(s.draft) == min(draft_len, max_len - length - 1)
        assert len(s.emitted) <= max_tokens - produced
        produced += len(s.emitted)
        length = prompt_len + produced - 1
    assert produced == len(res.tokens)


def assert_same(spec: Result, plain: Result) -> None:
    assert spec.tokens == plain.tokens
    assert (spec.finish_reason, spec.context_full, spec.interrupted) == (
        plain.finish_reason, plain.context_full, plain.interrupted)
    assert spec.prompt_tokens == plain.prompt_tokens


def run_spec(zoo: Zoo, target: str, proposer, prompt, max_tokens, draft_len=None, stops=(), max_len=MAX_LEN):
    decoder = SpeculativeDecoder(proposer, draft_len)
    res = generate(Session(zoo.targets[target], max_len), decoder, Request(list(prompt), GREEDY, max_tokens, stops))
    check_steps(res, len(prompt), max_tokens, max_len, decoder.draft_len)
    assert res.draft_kind == proposer.kind
    return res


def max_tokens_for(i: int) -> int:
    return 24 + (7 * i) % 17  # 24..40


# ---------------------------------------------------------------------------------------------
# 1. the real drafters, many (prompt, drafter, draft length) combinations

DFLASH_CASES = [(d, p, n) for d in DFLASH for n in DFLASH_LENS[d] for p in range(6)]
EAGLE3_CASES = [(d, p, n) for d in EAGLE3 for n in EAGLE3_LENS[d] for p in range(N_PROMPTS)]
DFLASH2_CASES = [(d, p, n) for d in DFLASH2 for n in DFLASH2_LENS[d] for p in range(5)]


def _check_real(zoo: Zoo, drafter: str, prompt_idx: int, draft_len):
    target = zoo.target_of(drafter)
    prompt = zoo.prompts[target][prompt_idx]
    m = max_tokens_for(prompt_idx)
    res = run_spec(zoo, target, zoo.proposer(drafter), prompt, m, draft_len)
    assert_same(res, zoo.plain(target, tuple(prompt), m))
    assert len(res.tokens) == m and res.finish_reason == "length"


@pytest.mark.parametrize("drafter,prompt_idx,draft_len", DFLASH_CASES)
def test_dflash_greedy_equals_plain(zoo, drafter, prompt_idx, draft_len):
    _check_real(zoo, drafter, prompt_idx, draft_len)


@pytest.mark.parametrize("drafter,prompt_idx,draft_len", DFLASH2_CASES)
def test_dflash2_greedy_equals_plain(zoo, drafter, prompt_idx, draft_len):
    _check_real(zoo, drafter, prompt_idx, draft_len)


@pytest.mark.parametrize("drafter,prompt_idx,draft_len", EAGLE3_CASES)
def test_eagle3_greedy_equals_plain(zoo, drafter, prompt_idx, draft_len):
    _check_real(zoo, drafter, prompt_idx, draft_len)


def test_case_counts_and_draft_length_cap():
    assert len(DFLASH_CASES) >= 50 and len(EAGLE3_CASES) >= 50
    assert SpeculativeDecoder(Scripted([], 2, max_draft=7), 99).draft_len == 7
    assert SpeculativeDecoder(Scripted([], 2, max_draft=7)).draft_len == 7
    assert SpeculativeDecoder(Scripted([], 2, max_draft=7), 3).draft_len == 3


# ---------------------------------------------------------------------------------------------
# 2. scripted proposers: full acceptance and rejection at every position


@pytest.mark.parametrize("target,prompt_idx,draft_len,max_tokens",
                         [("A", 0, 1, 33), ("A", 3, 3, 33), ("A", 5, 7, 33), ("B", 2, 5, 37), ("B", 6, 15, 33),
                          ("B", 1, 2, 31)])
def test_oracle_drafts_are_all_accepted(zoo, target, prompt_idx, draft_len, max_tokens):
    prompt = zoo.prompts[target][prompt_idx]
    vocab = zoo.cfgs[target]["vocab_size"]
    truth = zoo.truth(target, prompt, max_tokens)
    oracle = Scripted(truth, vocab, max_draft=16)
    res = run_spec(zoo, target, oracle, prompt, max_tokens, draft_len)
    assert_same(res, zoo.plain(target, tuple(prompt), max_tokens))
    assert oracle.resets == 1
    # Every draft accepted; the bonus is the target's next token; blocks are full but the last.
    produced = 1
    for s in res.steps:
        assert s.accepted == len(s.draft) == min(draft_len, max_tokens - produced)
        full = s.draft + [truth[len(prompt) + produced + len(s.draft)]]
        assert s.emitted == full[: max_tokens - produced]
        produced += len(s.emitted)
    assert len(res.steps) == -(-(max_tokens - 1) // (draft_len + 1))
    assert all(len(s.emitted) == draft_len + 1 for s in res.steps[:-1])


@pytest.mark.parametrize("target,prompt_idx,draft_len,seed",
                         [("A", 1, 1, 0), ("A", 4, 4, 1), ("A", 7, 8, 2), ("B", 0, 3, 3), ("B", 5, 6, 4),
                          ("B", 8, 12, 5)])
def test_partly_right_drafts_are_rolled_back_at_every_position(zoo, target, prompt_idx, draft_len, seed):
    prompt = zoo.prompts[target][prompt_idx]
    m = 40
    truth = zoo.truth(target, prompt, m)
    proposer = Scripted(truth, zoo.cfgs[target]["vocab_size"], max_draft=16, seed=seed, spread=draft_len)
    res = run_spec(zoo, target, proposer, prompt, m, draft_len)
    assert_same(res, zoo.plain(target, tuple(prompt), m))
    # The target accepts exactly the true prefix of each block, wherever the first wrong draft sits.
    assert [s.accepted for s in res.steps] == proposer.log
    if draft_len <= 4:  # long enough runs reach every rejection position
        assert set(proposer.log) == set(range(draft_len + 1))


@pytest.mark.parametrize("drafter,prompt_idx,draft_len,seed",
                         [("A-b4", 2, None, 0), ("A-b8", 4, 6, 1), ("B-b6", 7, None, 2), ("A-b4-swa", 8, None, 6),
                          ("A-b6-k5", 5, None, 6), ("B-b5-spec", 1, 3, 7),
                          ("A-v200", 3, 5, 3), ("B-v384-hd24", 6, 8, 4), ("B-v384-hd24", 0, 2, 5)])
def test_real_drafter_steered_by_oracle_keeps_consistent_caches(zoo, drafter, prompt_idx, draft_len, seed):
    target = zoo.target_of(drafter)
    prompt = zoo.prompts[target][prompt_idx]
    m = 40
    truth = zoo.truth(target, prompt, m)
    steered = Steered(zoo, drafter, truth, seed)
    res = run_spec(zoo, target, steered, prompt, m, draft_len)
    assert_same(res, zoo.plain(target, tuple(prompt), m))
    assert steered.checked == len(res.steps) >= 5
    assert all(s.accepted >= j for s, j in zip(res.steps, steered.log))
    assert max(s.accepted for s in res.steps) >= 2  # long accepted spans did happen


def test_scripted_proposer_that_asks_for_states_gets_one_row_per_token(zoo):
    """The other proposers run with capture=(); with a capture, absorb sees the accepted rows' states."""
    prompt = zoo.prompts["A"][2]
    truth = zoo.truth("A", prompt, 24)
    for seed in (None, 3):
        proposer = Scripted(truth, zoo.cfgs["A"]["vocab_size"], seed=seed, spread=3,
                            hidden_size=zoo.cfgs["A"]["hidden_size"])
        proposer.capture = (1, 3)
        res = run_spec(zoo, "A", proposer, prompt, 24, 3)
        assert_same(res, zoo.plain("A", tuple(prompt), 24))


# ---------------------------------------------------------------------------------------------
# 3. stop ids and max_tokens inside an accepted span


def _first_occurrences(tokens: list[int]) -> list[int]:
    return [i for i, t in enumerate(tokens) if t not in tokens[:i]]


NAMES = {"A": {"dflash": "A-b8", "eagle3": "A-v200"}, "B": {"dflash": "B-b6", "eagle3": "B-v384-hd24"}}
KINDS = ["oracle", "partly", "dflash-full", "eagle3-full", "dflash", "eagle3", "real-dflash", "real-eagle3"]


def _proposer(zoo: Zoo, kind: str, target: str, truth: list[int], seed: int = 0, spread: int = 16,
              check_every: int = 3):
    """oracle / partly: scripted; dflash, eagle3: steered real drafters (-full: every draft true);
    real-*: the real drafter alone."""
    if kind in ("oracle", "partly"):
        return Scripted(truth, zoo.cfgs[target]["vocab_size"], max_draft=16,
                        seed=None if kind == "oracle" else seed, spread=spread)
    if kind.startswith("real-"):
        return zoo.proposer(NAMES[target][kind[5:]])
    base, _, mode = kind.partition("-")
    return Steered(zoo, NAMES[target][base], truth, None if mode == "full" else seed, check_every)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("target,prompt_idx,draft_len,which", [("A", 3, 3, 1), ("A", 6, 5, 2), ("B", 4, 4, 3)])
def test_stop_id_inside_an_accepted_span(zoo, kind, target, prompt_idx, draft_len, which):
    prompt = zoo.prompts[target][prompt_idx]
    m = 40
    truth = zoo.truth(target, prompt, m)
    out = truth[len(prompt) :][:m]
    # A stop id first emitted at index s, not at the end of an oracle block (so it is mid-span).
    candidates = [i for i in _first_occurrences(out) if i >= 2 and (i - 1) % (draft_len + 1) != draft_len]
    assert len(candidates) > which, out
    s = candidates[which]
    stops = (out[s], 10_000)
    plain = zoo.plain(target, tuple(prompt), m, stops)
    assert plain.tokens == out[: s + 1] and plain.finish_reason == "stop"
    proposer = _proposer(zoo, kind, target, truth, seed=which, spread=draft_len)
    res = run_spec(zoo, target, proposer, prompt, m, draft_len, stops)
    assert_same(res, plain)
    assert res.tokens[-1] == out[s] and res.finish_reason == "stop"
    if kind in ("oracle", "dflash-full", "eagle3-full"):  # the stop cut a fully accepted block short
        last = res.steps[-1]
        assert last.accepted == len(last.draft) and len(last.emitted) < len(last.draft) + 1


@pytest.mark.parametrize("kind", ["oracle", "dflash", "eagle3"])
def test_stop_on_the_first_token_and_stops_that_never_come(zoo, kind):
    prompt = zoo.prompts["A"][5]
    truth = zoo.truth("A", prompt, 30)
    out = truth[len(prompt) :]
    first = generate(Session(zoo.targets["A"], MAX_LEN), SpeculativeDecoder(_proposer(zoo, kind, "A", truth), 4),
                     Request(prompt, GREEDY, 30, (out[0],)))
    assert first.tokens == out[:1] and first.finish_reason == "stop" and first.steps == []
    never = tuple(t for t in range(zoo.cfgs["A"]["vocab_size"]) if t not in out)[:3]
    res = run_spec(zoo, "A", _proposer(zoo, kind, "A", truth), prompt, 30, 4, never)
    assert_same(res, zoo.plain("A", tuple(prompt), 30))
    assert res.finish_reason == "length"


@pytest.mark.parametrize("draft_len,max_tokens", [(3, 2), (3, 11), (3, 15), (4, 13), (5, 5), (7, 30), (15, 20),
                                                  (1, 1), (2, 3)])
def test_max_tokens_inside_an_accepted_span(zoo, draft_len, max_tokens):
    prompt = zoo.prompts["B"][3]
    truth = zoo.truth("B", prompt, max_tokens)
    oracle = Scripted(truth, zoo.cfgs["B"]["vocab_size"], max_draft=16)
    res = run_spec(zoo, "B", oracle, prompt, max_tokens, draft_len)
    assert_same(res, zoo.plain("B", tuple(prompt), max_tokens))
    assert len(res.tokens) == max_tokens and res.finish_reason == "length" and not res.context_full
    if max_tokens > 1:
        last = res.steps[-1]
        assert last.accepted == len(last.draft)
        if (max_tokens - 1) % (draft_len + 1):  # the budget ends inside the last block
            assert len(last.emitted) < draft_len + 1
    else:
        assert res.steps == []


# ---------------------------------------------------------------------------------------------
# 4. the end of the context


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("prompt_idx,room,draft_len", [(4, 9, 4), (7, 14, 5), (0, 2, 3), (2, 1, 4), (6, 20, 15)])
def test_context_limit(zoo, kind, prompt_idx, room, draft_len):
    """max_len = prompt + room: generation stops at the context limit (context_full), blocks
    shrink to fit the cache, and the output is plain's."""
    prompt = zoo.prompts["A"][prompt_idx]
    max_len = len(prompt) + room
    m = 40
    truth = zoo.truth("A", prompt, m)
    plain = zoo.plain("A", tuple(prompt), m, (), max_len)
    assert plain.context_full and len(plain.tokens) == room and plain.finish_reason == "length"
    proposer = _proposer(zoo, kind, "A", truth, seed=prompt_idx)
    res = run_spec(zoo, "A", proposer, prompt, m, draft_len, max_len=max_len)  # checks block sizes
    assert_same(res, plain)
    if kind in ("oracle", "dflash-full", "eagle3-full") and res.steps:
        assert all(st.accepted == len(st.draft) for st in res.steps)


# ---------------------------------------------------------------------------------------------
# 5. a conversation: two requests on one session


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("target,stop_first", [("A", False), ("B", True)])
def test_two_turns_on_one_session(zoo, kind, target, stop_first):
    """The second request's prompt follows the first's output (its last token still pending);
    drafter caches carry over, also after a first turn that max_tokens or a stop id cut in the
    middle of an accepted block (the drafter had absorbed tokens past the end of the output)."""
    p1, p2 = zoo.prompts[target][5], zoo.prompts[target][2]
    draft_len = 4
    m1, m2 = 28, 30  # with full acceptance, turn one ends 2 tokens into a 5-token block
    model = zoo.targets[target]

    # Plain reference, and the no-stop continuation of each turn for the scripted proposers.
    truth1 = zoo.truth(target, p1, m1)
    out1 = truth1[len(p1) :]
    stops = ()
    if stop_first:  # a stop in the middle of a full block
        s = [i for i in _first_occurrences(out1[:m1]) if i >= 4 and (i - 1) % (draft_len + 1) < draft_len - 1][0]
        stops = (out1[s],)
    plain_session = Session(model, MAX_LEN)
    plain1 = generate(plain_session, PlainDecoder(), Request(p1, GREEDY, m1, stops))
    length1, pending1 = plain_session.length, list(plain_session.pending)
    ext_session = Session(model, MAX_LEN)
    generate(ext_session, PlainDecoder(), Request(p1, GREEDY, m1, stops))
    ext2 = generate(ext_session, PlainDecoder(), Request(p2, GREEDY, m2 + EXTRA)).tokens
    plain2 = generate(plain_session, PlainDecoder(), Request(p2, GREEDY, m2))
    assert plain2.tokens == ext2[:m2]
    truth2 = p1 + plain1.tokens + p2 + ext2

    proposer = _proposer(zoo, kind, target, truth1, seed=11, spread=draft_len, check_every=1)
    decoder = SpeculativeDecoder(proposer, draft_len)
    session = Session(model, MAX_LEN)
    spec1 = generate(session, decoder, Request(p1, GREEDY, m1, stops))
    check_steps(spec1, len(p1), m1, MAX_LEN, decoder.draft_len)
    assert_same(spec1, plain1)
    assert (session.length, session.pending) == (length1, pending1)
    if kind in ("oracle", "dflash-full", "eagle3-full"):  # turn one really ended inside an accepted block
        last = spec1.steps[-1]
        assert last.accepted == len(last.draft) and len(last.emitted) < last.accepted + 1
    proposer.truth = truth2
    spec2 = generate(session, decoder, Request(p2, GREEDY, m2))
    assert_same(spec2, plain2)
    # Turn two's prefill forwards the pending token and the prompt.
    check_steps(spec2, length1 + len(pending1) + len(p2), m2, MAX_LEN, decoder.draft_len)
    assert (session.length, session.pending) == (plain_session.length, plain_session.pending)
    if isinstance(proposer, Scripted):
        assert proposer.resets == 1  # the state was carried over, not rebuilt
    if isinstance(proposer, Steered):
        assert proposer.checked == len(spec1.steps) + len(spec2.steps)
