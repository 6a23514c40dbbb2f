"""Speculative decoding on a Qwen3.5 hybrid target is lossless: a verify keeps its accepted rows of the recurrent state
(the closed-form fold, n read from device memory) and any later rollback (a stop id or max_tokens inside an accepted
span, a dropped look-ahead) rewinds within the last forward. float32 on CPU, greedy speculative tokens equal plain
greedy tokens, on the eager and the static (graph-capturable) paths, with DFlash, EAGLE-3 and scripted proposers that
are rejected at every position; two chat turns on one session. At temperature > 0 the target's distribution with a
DFlash drafter (chi-square); a chat turn interrupted (Ctrl-C) in its prefill or mid-answer, before, inside or after a
forward, leaves the state from which the next turn answers as a never-interrupted session does."""

from __future__ import annotations

import random

import pytest
import torch

from dflash_cli.models.dflash import DFlashDrafter
from dflash_cli.models.eagle3 import Eagle3Drafter
from dflash_cli.models.qwen35 import Qwen35Model
from dflash_cli.runtime.drafters.dflash import DFlashProposer
from dflash_cli.runtime.drafters.eagle3 import Eagle3Proposer
from dflash_cli.runtime.generation import PlainDecoder, Request, generate
from dflash_cli.runtime.sampling import SamplingParams
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.speculative import SpeculativeDecoder
from test_speculative_lossless import Scripted, assert_same, check_steps
from tiny import make_dflash, make_eagle3, make_qwen35, qwen3_config

GREEDY = SamplingParams()
MAX_LEN = 160
VOCAB = 384
LENGTHS = [1, 3, 8, 17, 40]  # 40: a prefill longer than a step's rows


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    target = Qwen35Model.load(make_qwen35(root / "target", seed=7, with_tokenizer=False, num_hidden_layers=4))
    # The drafters see the target through its width, vocabulary and layer count only.
    shape = qwen3_config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    dflash = DFlashDrafter.load(make_dflash(root / "dflash", shape, seed=31, layers=1, block_size=6,
                                            target_layer_ids=[1, 2]), target)
    eagle3 = Eagle3Drafter.load(make_eagle3(root / "eagle3", shape, seed=41, draft_vocab=200), target)
    rng = random.Random(3)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in LENGTHS]
    return {"target": target, "dflash": dflash, "eagle3": eagle3, "prompts": prompts, "plain": {}}


def plain(zoo, prompt, max_tokens, stops=()):
    key = (tuple(prompt), max_tokens, tuple(stops))
    if key not in zoo["plain"]:
        session = Session(zoo["target"], MAX_LEN)
        zoo["plain"][key] = generate(session, PlainDecoder(), Request(list(prompt), GREEDY, max_tokens, stops))
    return zoo["plain"][key]


def proposer(zoo, kind):
    return DFlashProposer(zoo["dflash"]) if kind == "dflash" else Eagle3Proposer(zoo["eagle3"])


def spec(zoo, prop, prompt, max_tokens, path, draft_len=None, stops=()):
    decoder = SpeculativeDecoder(prop, draft_len)
    res = generate(Session(zoo["target"], MAX_LEN, path=path), decoder,
                   Request(list(prompt), GREEDY, max_tokens, stops))
    check_steps(res, len(prompt), max_tokens, MAX_LEN, decoder.draft_len)
    return res


def test_fold_equals_the_sequential_state(zoo):
    """The state after row n of a verify, folded from its kept rows, is the state a forward of rows 0..n leaves."""
    model = zoo["target"]
    ids = torch.tensor(zoo["prompts"][2])
    for n in range(len(ids)):
        a, b = model.new_cache(32), model.new_cache(32)
        model.forward(ids[: n + 1], 0, a)
        model.forward(ids, 0, b, hold=True)
        model.commit_rows(b, torch.tensor([n]), len(ids))
        assert torch.allclose(b.state.S, a.state.S, rtol=1e-5, atol=1e-6), n
        assert torch.allclose(b.state.conv, a.state.conv, rtol=1e-5, atol=1e-6), n  # rows of other products: rounding


@pytest.mark.parametrize("path", ["eager", "static"])
@pytest.mark.parametrize("kind,draft_len", [("dflash", None), ("dflash", 2), ("eagle3", 3), ("eagle3", 6)])
def test_real_drafters_greedy_equals_plain(zoo, kind, draft_len, path):
    for i, prompt in enumerate(zoo["prompts"]):
        m = 20 + 3 * i
        res = spec(zoo, proposer(zoo, kind), prompt, m, path, draft_len)
        assert_same(res, plain(zoo, prompt, m))


@pytest.mark.parametrize("path", ["eager", "static"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rejection_at_every_position(zoo, seed, path):
    """Scripted drafts right for a prefix of every length 0..k of the block, wrong after: every accepted count."""
    for prompt in zoo["prompts"][seed::2]:
        m = 50  # at least 9 proposals: the first 9 emit at most 0 + 1 + ... + 8 + 9 = 45 tokens
        truth = list(prompt) + plain(zoo, prompt, m + 24).tokens
        drafter = Scripted(truth, VOCAB, max_draft=8, seed=seed, spread=8)
        res = spec(zoo, drafter, prompt, m, path, 8)
        assert_same(res, plain(zoo, prompt, m))
        assert set(drafter.log) == set(range(9))  # rejected after each position, and fully accepted


@pytest.mark.parametrize("path", ["eager", "static"])
def test_stop_inside_an_accepted_span_then_a_second_turn(zoo, path):
    """A stop id inside an accepted span cuts it: the state rewinds into the verify; the next turn on the same session
    (after the pending token) continues exactly as plain decoding's second turn does."""
    prompt, second = zoo["prompts"][3], zoo["prompts"][1]
    answer = plain(zoo, prompt, 60).tokens
    # A token inside the oracle's first block (answer[1:9]; answer[0] comes from the prefill), seen first there.
    cut = next(i for i in range(3, 8) if answer[i] not in answer[:i])
    stop = answer[cut]

    def turns(decoder, extra=0, between=None):
        session = Session(zoo["target"], MAX_LEN, path=path)
        first = generate(session, decoder, Request(list(prompt), GREEDY, 40, (stop,)))
        if between:
            between(decoder, session)
        again = generate(session, decoder, Request(list(second), GREEDY, 20 + extra))
        return first, again, session.length

    first, again, length = turns(PlainDecoder(queue_ahead=True))
    assert first.finish_reason == "stop" and first.tokens == answer[: cut + 1]
    _, longer, _ = turns(PlainDecoder(), extra=16)  # the second answer past max_tokens, for the oracle

    def second_oracle(decoder, session):  # the first oracle's truth went on past the stop
        oracle = Scripted(list(prompt) + first.tokens + list(second) + longer.tokens, VOCAB, max_draft=8)
        oracle.length = session.length
        decoder.proposer = oracle

    s_first, s_again, s_length = turns(SpeculativeDecoder(Scripted(list(prompt) + answer, VOCAB, max_draft=8), 8),
                                       between=second_oracle)
    assert s_first.steps[0].accepted == 8 and len(s_first.steps[0].emitted) == cut  # accepted rows after it dropped
    assert (s_first.tokens, s_first.finish_reason, s_again.tokens, s_length) == (
        first.tokens, first.finish_reason, again.tokens, length)


def test_two_chat_turns_with_dflash(zoo):
    a, b = zoo["prompts"][2], zoo["prompts"][0]
    results = []
    for make in (PlainDecoder, lambda: SpeculativeDecoder(proposer(zoo, "dflash"))):
        session, decoder = Session(zoo["target"], MAX_LEN, path="static"), make()
        results.append([generate(session, decoder, Request(list(p), GREEDY, 15)).tokens for p in (a, b)])
    assert results[0] == results[1]


def test_sampled_verify_runs(zoo):
    """Temperature > 0: the sampled verdict's accepted count folds the state the same way (no crash, in range)."""
    res = spec(zoo, proposer(zoo, "dflash"), zoo["prompts"][2], 16, "static")
    sampled = generate(Session(zoo["target"], MAX_LEN, path="static"), SpeculativeDecoder(proposer(zoo, "eagle3"), 4),
                       Request(zoo["prompts"][2], SamplingParams(temperature=0.8, seed=5), 16))
    assert len(res.tokens) == 16 and len(sampled.tokens) == 16 and all(0 <= t < VOCAB for t in sampled.tokens)


def test_generate_cli_with_a_drafter_folder(tmp_path, cli):
    """`dflash generate --draft FOLDER` on a hybrid target: the same greedy tokens as --draft none."""
    target = make_qwen35(tmp_path / "target", seed=8, num_hidden_layers=4)
    shape = qwen3_config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    drafter = make_dflash(tmp_path / "dflash", shape, seed=31, layers=1, block_size=4, target_layer_ids=[1, 2])
    runs = {}
    for draft in ("none", drafter):
        r = cli("generate", "-m", target, "-p", "import torch", "--raw", "--temperature", "0", "--json", "-n", "24",
                "--draft", draft, "--device", "cpu")
        assert r.code == 0, r.err
        runs[str(draft)] = r.json()
    plain_run, spec_run = runs["none"], runs[str(drafter)]
    assert spec_run["tokens"] == plain_run["tokens"] and spec_run["stats"]["draft_kind"] == "dflash"


def test_served_prefix_reuse_on_a_hybrid_target(tmp_path):
    """`dflash serve` keeps the longest prompt prefix its session holds; a recurrent state holds no older prefix than its
    last forward, so the engine feeds the whole prompt again there: same tokens as a fresh engine."""
    from dflash_cli.serve.engine_bridge import Engine, Job

    target = make_qwen35(tmp_path / "target", seed=9, num_hidden_layers=4)
    engine = Engine(str(target), "none", None, "cpu", "float32", context=128)
    first = list(range(5, 25))
    shared = first[:12] + [90, 91, 92]  # diverges inside the first prompt: before its last forward
    extended = None
    for prompt in (first, shared, "extend", shared[:14]):
        if prompt == "extend":  # the chat case: the new prompt extends everything held
            prompt = extended = engine.history + [7, 8]
        got = engine.run(Job(list(prompt), 6, GREEDY, ignore_eos=True)).tokens
        fresh = Engine(str(target), "none", None, "cpu", "float32", context=128)
        assert got == fresh.run(Job(list(prompt), 6, GREEDY, ignore_eos=True)).tokens, prompt
    assert extended is not None


# ---------------------------------------------------------------------------------------------
# Sampling on a hybrid target: the target's distribution with a DFlash drafter (as test_speculative_sampling's)

SAMPLED = {  # (params, draft length, runs)
    "T1-k1": (SamplingParams(temperature=1.0), 1, 1000),
    "topk-topp-k3": (SamplingParams(temperature=1.3, top_k=6, top_p=0.9), 3, 800),
}


@pytest.fixture(scope="module")
def small_hybrid(tmp_path_factory):
    """A hybrid target over 8 tokens (one Gated DeltaNet, one attention layer) with flat next-token distributions,
    and a DFlash drafter conditioned on both layers."""
    from test_speculative_sampling import VOCAB as V
    from tiny import make_predictable_qwen35

    root = tmp_path_factory.mktemp("small_hybrid")
    target = Qwen35Model.load(make_predictable_qwen35(
        root / "t", damp=1.0, head=0.2, seed=4, with_tokenizer=False, vocab_size=V, hidden_size=32,
        intermediate_size=64, num_hidden_layers=2, layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2))
    shape = qwen3_config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    drafter = DFlashDrafter.load(make_dflash(root / "dflash", shape, seed=5, layers=1, block_size=5,
                                             target_layer_ids=[0, 1], std=0.05), target)
    return target, drafter


@pytest.mark.parametrize("path,config", [("eager", "T1-k1"), ("static", "T1-k1"), ("static", "topk-topp-k3")])
def test_sampled_dflash_on_a_hybrid_keeps_the_target_distribution(small_hybrid, path, config):
    """The joint distribution of the first three tokens (the last two from a speculative step whose verify folds the
    recurrent state at the sampled accepted count) equals the plain sampler's exact one: chi-square."""
    from test_speculative_sampling import assert_joint_fits, exact_joint, sampled_joint

    target, drafter = small_hybrid
    params, draft_len, runs = SAMPLED[config]
    decoder = SpeculativeDecoder(DFlashProposer(drafter), draft_len)
    counts, accepted, drafted = sampled_joint(target, decoder, params, runs, path)
    assert 0.02 < accepted / drafted < 0.95, accepted / drafted  # both branches of the rejection sampler
    assert_joint_fits(counts, exact_joint(target, params), config)


# ---------------------------------------------------------------------------------------------
# Ctrl-C in a chat turn on a hybrid target: the next turn answers as a never-interrupted session does

@pytest.fixture(scope="module")
def chat_target(tmp_path_factory):
    from tiny import make_predictable_qwen35

    return make_predictable_qwen35(tmp_path_factory.mktemp("chat_hybrid") / "t", seed=9)


# Where the interrupt lands in the second turn: the n-th call of a Gated DeltaNet layer (3 per forward), raised
# before it runs ("mid") or after it ran ("after"), or the n-th start of a forward (RecurrentState.begin, before
# it keeps the state it starts from). Forward 1 is the turn's prefill; later ones its decode steps or verifies.
INTERRUPTS = {
    "prefill-mid-forward": ("delta_net", 2, "mid"),
    "prefill-after-forward": ("delta_net", 3, "after"),
    "answer-mid-forward": ("delta_net", 3 * 4 + 2, "mid"),
    "answer-after-forward": ("delta_net", 3 * 4 + 3, "after"),
    "prefill-before-forward": ("begin", 1, "mid"),
    "answer-before-forward": ("begin", 5, "mid"),
}


@pytest.mark.parametrize("draft", ["none", "mtp"])
@pytest.mark.parametrize("where", list(INTERRUPTS))
def test_chat_turn_interrupted_then_the_next_turn(chat_target, monkeypatch, draft, where):
    import io

    from rich.console import Console

    from dflash_cli.commands import chat as chat_cmd
    from dflash_cli.commands.chat import ChatOptions, ChatRepl
    from dflash_cli.layers.recurrent_state import RecurrentState

    turns = []  # (ids fed, request, result) of every generation
    real_generate = chat_cmd.generate

    def spy(session, decoder, req, **kw):
        ids = session.pending + list(req.prompt_ids)
        res = real_generate(session, decoder, req, **kw)
        turns.append((ids, req, res))
        return res

    monkeypatch.setattr(chat_cmd, "generate", spy)
    repl = ChatRepl(ChatOptions(model=str(chat_target), temperature=0.0, max_tokens=12, draft=draft),
                    Console(file=io.StringIO(), width=200))
    repl.bundle.tokenizer.stop_ids = []  # answers of max_tokens tokens
    repl.answer("Hello there, tell me about the weather.")

    owner, at, when = INTERRUPTS[where]
    from dflash_cli.models import qwen35

    cls = qwen35 if owner == "delta_net" else RecurrentState  # the DeltaNet: a function of the model's module
    real, calls = getattr(cls, owner), []

    def interrupting(*args, **kw):
        calls.append(1)
        if len(calls) == at and when == "mid":
            raise KeyboardInterrupt
        out = real(*args, **kw)
        if len(calls) == at:
            raise KeyboardInterrupt
        return out

    with monkeypatch.context() as m:
        m.setattr(cls, owner, interrupting)
        repl.answer("And tomorrow? Tell me a long story about it.")
    assert len(calls) >= at, "the interrupt never came"
    assert turns[1][2].interrupted
    repl.answer("Go on.")
    assert not turns[2][2].interrupted and turns[2][2].tokens

    # What the session holds: every turn that produced tokens (its ids and all its tokens but the pending last), then
    # the last turn's ids; a turn interrupted before any token left nothing (its pending token went back).
    history = []
    for ids, _, res in turns[:2]:
        if res.tokens:
            history += ids + res.tokens[:-1]
    ids, req, res = turns[2]
    fresh = generate(Session(repl.session.model, repl.session.max_len), PlainDecoder(),
                     Request(history + ids, GREEDY, req.max_tokens, req.stop_ids))
    assert res.tokens == fresh.tokens


@pytest.mark.parametrize("kind", ["none", "dflash", "eagle3"])
def test_capture_at_load_leaves_no_shape_for_hybrid_prompts(zoo, kind):
    """A hybrid's short prompts pad to one prefill graph like a Qwen3 one (held, the state folded to their last real
    row): after warmup.prepare, chat turns of other short lengths meet no new step shape, and give the eager path's
    tokens."""
    from dflash_cli.runtime import graphs
    from dflash_cli.runtime.warmup import prepare

    def decoder():
        return PlainDecoder() if kind == "none" else SpeculativeDecoder(proposer(zoo, kind))

    turns = [[5, 9, 200, 31, 7, 66, 2, 90, 14, 3, 8], [77, 4], list(range(100, 129))]
    eager, ref = Session(zoo["target"], MAX_LEN, path="eager"), []
    dec = decoder()
    for turn in turns:
        ref.append(generate(eager, dec, Request(turn, GREEDY, 20)).tokens)
    session, dec = Session(zoo["target"], MAX_LEN, path="static"), decoder()
    prepare(session, dec, GREEDY)
    before = graphs.Totals.shapes
    assert [generate(session, dec, Request(turn, GREEDY, 20)).tokens for turn in turns] == ref
    assert graphs.Totals.shapes == before
