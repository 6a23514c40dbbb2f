"""The device-position forward (what CUDA graphs capture) against the eager reference, on CPU."""

import json

import pytest
import torch

from dflash_cli.runtime.generation import PlainDecoder, Request, generate
from dflash_cli.runtime import graphs
from dflash_cli.runtime.graphs import padded_prefill, prefill_rows
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


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("static")
    target_dir = make_qwen3(root / "t", seed=11, num_hidden_layers=5, max_position_embeddings=2048)
    cfg = json.loads((target_dir / "config.json").read_text())
    target = Qwen3Model.load(target_dir)
    dflash = DFlashDrafter.load(make_dflash(root / "d", cfg, seed=12, block_size=6, target_layer_ids=[1, 3]), target)
    eagle = Eagle3Drafter.load(make_eagle3(root / "e", cfg, seed=13), target)
    return target, dflash, eagle


@pytest.fixture(scope="module")
def dflash2(models, tmp_path_factory):
    """A DFlash 2 drafter for the same target: its convolutions and selector walk inside the draft step."""
    target = models[0]
    cfg = dict(target.cfg.extra)  # the target's config.json
    folder = make_dflash2(tmp_path_factory.mktemp("static2") / "d2", cfg, seed=14, block_size=6, top_k=5,
                          target_layer_ids=[1, 3])
    return DFlash2Drafter.load(folder, target, selector=True)


def speculative(kind: str, models, dflash2, draft_len=None):
    _, dflash, eagle = models
    if kind == "dflash2":
        return SpeculativeDecoder(DFlash2Proposer(dflash2), draft_len)
    if kind == "dflash":
        return SpeculativeDecoder(DFlashProposer(dflash), draft_len)
    return SpeculativeDecoder(Eagle3Proposer(eagle), draft_len or 4)


def test_static_logits_match_eager_across_window_boundaries(models):
    target = models[0]
    prompt = list(range(3, 250))
    eager, static = Session(target, 600, path="eager"), Session(target, 600, path="static")
    eager.forward(prompt), static.forward(prompt)
    for step in range(12):  # crosses the 256-row window into the 512 one
        ids = [7 + step] if step % 3 else [7 + step, 9, 11, 13]
        a = eager.forward(ids, capture=(1, 3), all_logits=True)
        b = static.forward(ids, capture=(1, 3), all_logits=True)
        assert torch.allclose(a.logits, b.logits, rtol=1e-5, atol=1e-5)
        assert torch.allclose(a.hidden, b.hidden, rtol=1e-5, atol=1e-5)
        if step % 4 == 3:  # roll back one row, as a rejected draft does
            eager.length -= 1
            static.length -= 1




def test_prefill_sizes_are_padded_buckets():
    assert [prefill_rows(n, 0, 4096) for n in (33, 64, 65, 200, 257, 2048, 2049, 4096)] == [
        64, 64, 128, 256, 512, 2048, 2304, 4096]
    assert prefill_rows(4097, 0, 8192) is None  # longer prompts run eagerly
    assert prefill_rows(300, 3600, 4096) is None and prefill_rows(300, 3584, 4096) == 512  # padding must fit
    ids, pos = padded_prefill([5, 6, 7], 10, 5)
    assert ids == [0, 0, 5, 6, 7] and pos == [13, 14, 10, 11, 12]


def test_padded_prefill_matches_eager(models):
    """Prefills past MAX_ROWS on the static path: uncaptured (no shape kept), unless capture_prefills (the bench):
    then padded to a bucket, the padding rows first at positions after the prompt, built on a size's first use,
    replayed with new inputs on later ones. Logits,
    captured states and every later step agree with the eager forward; a prefill whose padding would pass the
    cache's end runs eagerly."""
    target = models[0]
    eager, static = Session(target, 700, path="eager"), Session(target, 700, path="static")

    def same(ids, all_logits):
        a = eager.forward(ids, capture=(0, 2), all_logits=all_logits)
        b = static.forward(ids, capture=(0, 2), all_logits=all_logits)
        assert a.logits.shape == b.logits.shape and a.hidden.shape == b.hidden.shape
        assert torch.allclose(a.logits, b.logits, rtol=1e-5, atol=1e-5)
        assert torch.allclose(a.hidden, b.hidden, rtol=1e-5, atol=1e-5)
        a, b = eager.forward([11], all_logits=True), static.forward([11], all_logits=True)
        assert torch.allclose(a.logits, b.logits, rtol=1e-5, atol=1e-5)

    # Different prompts of one bucket (64 rows) from position 0: uncaptured; then, captured, built and replayed
    # with their own ids and positions; for last-row logits and for every row's.
    g = torch.Generator().manual_seed(3)
    for capture in (False, True):
        static.fast.capture_prefills = capture
        for use in range(8):
            eager.reset(), static.reset()
            same(torch.randint(0, 300, (int(torch.randint(33, 65, (1,), generator=g)),), generator=g).tolist(),
                 all_logits=use >= 4)
        assert [key[0] for key in static.fast.steps if key[0] > 32] == ([64, 64] if capture else [])
    # One session growing: prefills after earlier turns (the first and third share a key).
    eager.reset(), static.reset()
    for i, ids in enumerate([list(range(3, 63)), [5] * 40, list(range(200, 250)), list(range(9, 120))]):
        same(ids, all_logits=i % 2 == 1)
    tail = [i % 300 for i in range(700 - eager.length)]  # fills the cache: no room for padding
    assert torch.allclose(eager.forward(tail).logits, static.forward(tail).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["none", "dflash", "eagle3", "dflash2"])
def test_generation_is_identical_on_the_static_path(models, dflash2, kind):
    target = models[0]
    prompt = list(range(20, 60))

    def run(path):
        decoder = PlainDecoder() if kind == "none" else speculative(kind, models, dflash2)
        session = Session(target, 400, path=path)
        return generate(session, decoder, Request(prompt, SamplingParams(), max_tokens=240)).tokens

    assert run("static") == run("eager")


def test_stacked_context_projection_matches_per_layer(models):
    """The drafter's per-step context update (one product over every layer's k/v weights) writes the same
    cache rows as the per-layer path that prompts and training use."""
    from dflash_cli.layers.spans import Span, StaticSpan

    _, dflash, _ = models
    hidden = torch.randn(7, len(dflash.capture) * dflash.cfg.hidden_size)
    run = DFlashProposer(dflash)
    run.reset(64, "eager")
    run.cache.k.zero_(), run.cache.v.zero_()
    dflash.context_rows(hidden, Span(run.cache, 3, 7, run.cos, run.sin))
    k, v = run.cache.k.clone(), run.cache.v.clone()
    run.cache.k.zero_(), run.cache.v.zero_()
    assert k[:, 3:10].abs().sum() > 0
    positions = torch.arange(3, 10)
    for span in (Span(run.cache, 3, 7, run.cos, run.sin),
                 StaticSpan(run.cache, positions, 16, run.cos, run.sin)):  # all layers in one kernel
        run.cache.k.zero_(), run.cache.v.zero_()
        dflash.context_rows(hidden, span, stacked=True)
        torch.testing.assert_close(run.cache.k, k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(run.cache.v, v, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("which", ["dflash", "eagle3"])
def test_drafter_graphs_follow_the_session_path(models, which):
    """Graphs built for "static" (eager replay) are rebuilt for "graphs" and back, reused otherwise."""
    drafter = DFlashProposer(models[1]) if which == "dflash" else Eagle3Proposer(models[2])

    def current():
        g = drafter.graphs
        return g if isinstance(g, tuple) else (g,)

    drafter.reset(300, "static")
    first = current()
    assert all(g.requested is False for g in first)
    drafter.reset(300, "eager")
    drafter.reset(300, "static")
    assert current() == first  # same path: the same objects, captured steps kept
    drafter.reset(300, "graphs")
    second = current()
    assert all(g.requested is True for g in second) and not set(map(id, second)) & set(map(id, first))
    drafter.reset(300, "graphs")
    assert current() == second
    drafter.reset(300, "static")
    assert all(g.requested is False for g in current())


def test_rope_tables_cover_every_position_from_load(tmp_path):
    """The target's RoPE tables hold every position it has from load on: a longer session never replaces tensors
    that earlier sessions' graphs read in place."""
    target = Qwen3Model.load(make_qwen3(tmp_path / "t", seed=21, num_hidden_layers=2, max_position_embeddings=8192))
    cos = target.cos
    assert cos.shape[0] == 8192
    eager, static = Session(target, 300, path="eager"), Session(target, 300, path="static")
    prompt = list(range(5, 45))
    eager.forward(prompt), static.forward(prompt)
    Session(target, 8192, path="static")
    assert target.cos is cos
    for tok in (9, 10):
        a, b = eager.forward([tok]), static.forward([tok])
        assert torch.allclose(a.logits, b.logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["eager", "static"])
def test_plain_queue_ahead_changes_no_token(models, path):
    """The queued next forward (on by default on CUDA) against plain steps: same tokens at stop ids, at
    max_tokens, at a full context, across a continued conversation and with sampling."""
    target = models[0]
    prompt = list(range(30, 70))
    ref = generate(Session(target, 200, path=path), PlainDecoder(queue_ahead=False), Request(prompt, GREEDY, 40)).tokens
    stop = ref[9]
    for max_len, max_tokens, stops in ((200, 40, ()), (200, 7, ()), (200, 40, (stop,)), (len(prompt) + 12, 40, ())):
        runs = []
        for queue_ahead in (False, True):
            s = Session(target, max_len, path=path)
            first = generate(s, PlainDecoder(queue_ahead), Request(prompt, GREEDY, max_tokens, stops))
            more = generate(s, PlainDecoder(queue_ahead), Request([5, 6], GREEDY, 3)) if s.room() > 6 else None
            runs.append((first.tokens, first.finish_reason, first.context_full, s.length, s.pending,
                         more and more.tokens))
        assert runs[0] == runs[1]
    sampled = [generate(Session(target, 200, path=path), PlainDecoder(queue_ahead),
                        Request(prompt, SamplingParams(temperature=0.8, seed=3), 20)).tokens for queue_ahead in (0, 1)]
    assert sampled[0] == sampled[1]


def test_a_greedy_plain_step_feeds_its_next_inputs(models, monkeypatch):
    """With queue-ahead on the static path, each decode step's verdict stages the next step's token and position
    itself: after the first step nothing is staged, and the tokens are the eager path's."""
    target = models[0]
    prompt = [3 + i * 7 % 90 for i in range(230)]
    ref = generate(Session(target, 400, path="eager"), PlainDecoder(queue_ahead=False), Request(prompt, GREEDY, 50))
    staged = []
    for name in ("stage_step", "stage"):
        real = getattr(graphs, name)
        monkeypatch.setattr(graphs, name, lambda *a, _real=real, _name=name: (staged.append(_name), _real(*a))[1])
    continued = []  # whether each call of a built step continued the last fed one
    real_continues = graphs.Graphs._continues
    monkeypatch.setattr(graphs.Graphs, "_continues",
                        lambda self, *a: continued.append(real_continues(self, *a)) or continued[-1])
    session = Session(target, 400, path="static")
    got = generate(session, PlainDecoder(queue_ahead=True), Request(prompt, GREEDY, 50))
    assert got.tokens == ref.tokens and staged == [] and [k for k in session.fast.steps if k[0] == 1] == [(1, (), False, True)]
    # One forward a step (the first step's own, then each step's queued one; the last step queues none): all but
    # the one that built the step (the first, on host ids) continued the fed one.
    assert continued == [True] * (len(got.steps) - 1)
    assert session.fed_token(session.length - 1) is not None  # the last queued forward's record
    more = generate(session, PlainDecoder(queue_ahead=True), Request([5, 6], GREEDY, 3))  # host ids: staged anew
    again = Session(target, 400, path="eager")
    generate(again, PlainDecoder(queue_ahead=False), Request(prompt, GREEDY, 50))
    assert more.tokens == generate(again, PlainDecoder(queue_ahead=False), Request([5, 6], GREEDY, 3)).tokens


@pytest.mark.parametrize("kind", ["dflash", "eagle3", "dflash2"])
@pytest.mark.parametrize("draft_len", [1, 3, 5])
def test_queued_proposals_change_no_draft(models, dflash2, kind, draft_len):
    """On the device-position path the next proposal is queued before the host reads the accepted count
    (absorbing every verified row, rejected ones included). Against the eager path, which absorbs after the
    read: the same drafts, acceptances and tokens at stop ids inside a span, at max_tokens, at a full
    context, across a second turn and with sampling (EAGLE-3 queues greedy chains only); and the queued
    proposals are the ones used."""
    target, dflash, eagle = models
    make = {"dflash": lambda: DFlashProposer(dflash), "eagle3": lambda: Eagle3Proposer(eagle),
            "dflash2": lambda: DFlash2Proposer(dflash2)}[kind]
    prompt = list(range(30, 70))
    ref = generate(Session(target, 300, path="eager"), PlainDecoder(), Request(prompt, GREEDY, 60)).tokens
    greedy_cases = [(300, 60, ()), (300, 11, ()), (300, 60, (ref[17],)), (300, 60, (ref[30],)),
                    (len(prompt) + 21, 60, ())]
    sampled = SamplingParams(temperature=0.8, seed=5)
    proposals, steps = [0, 0], [0, 0]  # fresh proposals and steps, per path
    for max_len, max_tokens, stops in greedy_cases + [(300, 40, "sampled")]:
        params = sampled if stops == "sampled" else GREEDY
        stops = () if stops == "sampled" else stops
        runs = []
        for i, path in enumerate(("eager", "static")):
            proposer = make()
            calls = []
            real = proposer.propose
            proposer.propose = lambda *a, real=real, calls=calls: calls.append(1) or real(*a)
            s, decoder = Session(target, max_len, path=path), SpeculativeDecoder(proposer, draft_len)
            first = generate(s, decoder, Request(prompt, params, max_tokens, stops))
            more = generate(s, decoder, Request([5, 6], params, 9)) if s.room() > 12 else None
            runs.append((first.tokens, first.finish_reason, first.context_full, s.length, s.pending,
                         [(st.draft, st.accepted) for st in first.steps], more and more.tokens,
                         more and [(st.draft, st.accepted) for st in more.steps]))
            proposals[i] += len(calls)
            steps[i] += len(first.steps) + (len(more.steps) if more else 0)
        assert runs[0] == runs[1]
    # Eager: every proposal made after the read; static: all but the first of each generation and those
    # near its end (short second turns: never) were queued.
    assert proposals[0] == steps[0] and proposals[1] < steps[1] / 2


def test_folded_norm_weights_give_the_same_model(tmp_path):
    """Folding each layer's norm weights into qkv / gate_up (what a bf16 model on the GPU does at load, so that
    its products run the norms) leaves the model's logits and captured states as they were, up to rounding."""
    from dflash_cli.models.decoder import fold_norms

    target_dir = make_qwen3(tmp_path / "t", seed=21, num_hidden_layers=3)
    plain, folded = Qwen3Model.load(target_dir), Qwen3Model.load(target_dir)
    ones = torch.ones(folded.cfg.hidden_size)
    for layer in folded.layers:
        fold_norms(layer, ones)
    ids = torch.tensor([3, 17, 5, 99, 42])
    a = plain.forward(ids, 0, plain.new_cache(16), capture=(1, 3), all_logits=True)
    b = folded.forward(ids, 0, folded.new_cache(16), capture=(1, 3), all_logits=True)
    assert torch.allclose(a.logits, b.logits, rtol=1e-4, atol=1e-5)
    assert torch.allclose(a.hidden, b.hidden, rtol=1e-4, atol=1e-5)
    assert all(layer.norms_folded for layer in folded.layers) and not plain.layers[0].norms_folded


@pytest.mark.parametrize("path", ["eager", "static"])
@pytest.mark.parametrize("fused", [False, True])
def test_folded_dflash_drafter_drafts_as_the_unfolded_one(tmp_path, monkeypatch, path, fused):
    """A DFlash drafter loaded where the GPU folds norm weights (ops.folds_norms) folds its layers' norms into
    their products and hidden_norm into the stacked context k/v product, built from the layers' unfolded k/v rows
    (the context skips the layers' input norm): its context rows and drafts are the unfolded drafter's, up to
    rounding, on the eager and the device-position paths, with the norms in their own kernels or inside the
    products (`fused`, what the GPU runs)."""
    from dflash_cli.layers import ops

    target_dir = make_qwen3(tmp_path / "t", seed=31, num_hidden_layers=4)
    cfg = json.loads((target_dir / "config.json").read_text())
    target = Qwen3Model.load(target_dir)
    drafter_dir = make_dflash(tmp_path / "d", cfg, seed=32, block_size=6, target_layer_ids=[1, 2])
    plain = DFlashDrafter.load(drafter_dir, target)
    monkeypatch.setattr(ops, "folds_norms", lambda device, dtype: True)
    folded = DFlashDrafter.load(drafter_dir, target)
    assert folded.norms_folded and all(layer.norms_folded for layer in folded.layers) and not plain.norms_folded
    if fused:
        monkeypatch.setattr(ops, "fuses_norms", lambda h, w: True)
    hidden = torch.randn(9, len(plain.capture) * plain.cfg.hidden_size)
    plain, folded = DFlashProposer(plain), DFlashProposer(folded)
    for d in (plain, folded):
        d.reset(64, path)
        d.absorb(hidden[:7], 0)  # a prompt: the eager context path
        d.absorb(hidden[7:], 7)  # a step's rows: the stacked one (a graph's on "static")
    torch.testing.assert_close(folded.cache.k[:, :9], plain.cache.k[:, :9], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(folded.cache.v[:, :9], plain.cache.v[:, :9], rtol=1e-4, atol=1e-5)
    for n in (5, 1):
        torch.testing.assert_close(folded.draft_logits(42, n), plain.draft_logits(42, n), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mlp_fused", [True, False])
def test_norms_inside_the_products_compute_the_kernel_path(tmp_path, monkeypatch, mlp_fused):
    """A folded model's layers with the norms and residual adds inside the products (what the GPU runs: every one
    of them from 9 rows, those of qkv and down only below that) compute what the add + norm kernels compute. On the
    CPU a product's norm and residual are their composition, so the logits are equal bit for bit."""
    from dflash_cli.layers import ops
    from dflash_cli.models.decoder import fold_norms

    model = Qwen3Model.load(make_qwen3(tmp_path / "t", seed=22, num_hidden_layers=3))
    ones = torch.ones(model.cfg.hidden_size)
    for layer in model.layers:
        fold_norms(layer, ones)
    ids = torch.tensor([3, 17, 5, 99, 42])
    plain = model.forward(ids, 0, model.new_cache(16), capture=(1, 3), all_logits=True)
    one = model.forward(ids[:1], 0, model.new_cache(16), capture=(1, 3), all_logits=True)  # a one-row step
    monkeypatch.setattr(ops, "fuses_norms", lambda h, w: True)
    monkeypatch.setattr(ops, "fuses_mlp_norm", lambda h: mlp_fused)
    fused = model.forward(ids, 0, model.new_cache(16), capture=(1, 3), all_logits=True)
    assert torch.equal(plain.logits, fused.logits) and torch.equal(plain.hidden, fused.hidden)
    # One row takes the hand-over of the norm's squares (ops.linear_squares: o and down, each layer), which on the
    # CPU keeps the norm.
    assert ops.fuses_squares(ids[:1].view(1, 1)) and not ops.fuses_squares(ids.view(-1, 1))
    calls = []
    real = ops.linear_squares
    monkeypatch.setattr(ops, "linear_squares", lambda *a, **k: calls.append(a[1].shape) or real(*a, **k))
    fused_one = model.forward(ids[:1], 0, model.new_cache(16), capture=(1, 3), all_logits=True)
    assert torch.equal(one.logits, fused_one.logits) and torch.equal(one.hidden, fused_one.hidden)
    # Rows that fuse the MLP's norm (mlp_fused, a verify's on the GPU) keep every add in the products (layers/fusion.py).
    assert len(calls) == (0 if mlp_fused else 2) * len(model.layers)


@pytest.mark.parametrize("kind", ["none", "dflash", "eagle3", "dflash2"])
def test_a_second_generation_meets_no_new_graph_shape(models, dflash2, kind):
    """Every step keeps its shapes: short prompts share one padded prefill, a block keeps its size near max_tokens,
    and a step's absorb takes all its verified rows; so once a session's shapes are built (same windows) by one
    greedy and one sampled generation (a load-time warm-up), another generation with another prompt length and
    budget builds none, greedy or sampled, whatever its temperature, top-p and top-k of the warmed sampling mode
    (they live in device tensors), queued proposals included."""
    target = models[0]
    decoder = PlainDecoder(queue_ahead=True) if kind == "none" else speculative(kind, models, dflash2)
    session = Session(target, 200, path="static")
    for params in (SamplingParams(), SamplingParams(temperature=0.6, top_p=0.95, top_k=20, seed=1)):
        generate(session, decoder, Request(list(range(5, 14)), params, 60))
        session.reset()
    before = graphs.Totals.shapes
    others = (SamplingParams(temperature=0.8, top_k=20, seed=2), SamplingParams(temperature=1.4, top_p=0.5, top_k=64),
              SamplingParams(temperature=0.2, top_p=0.9, top_k=1, seed=3))
    for (prompt, budget), params in zip((([7, 8, 9, 10], 37), (list(range(20, 45)), 23), ([3, 4], 51)), others):
        for p in (SamplingParams(), params):
            generate(session, decoder, Request(prompt, p, budget))
            session.reset()
    assert graphs.Totals.shapes == before


@pytest.mark.parametrize("kind", ["none", "dflash", "eagle3", "dflash2"])
def test_capture_at_load_leaves_no_shape_for_the_generations(models, dflash2, kind):
    """After warmup.prepare, greedy generations of any prompt and length meet no new step shape (on the GPU: no
    capture after load), and give the same tokens as without it."""
    from dflash_cli.runtime.warmup import prepare

    target = models[0]

    def decoder():
        return PlainDecoder() if kind == "none" else speculative(kind, models, dflash2)

    prompt = list(range(20, 27))
    ref = generate(Session(target, 300, path="eager"), decoder(), Request(prompt, GREEDY, 150)).tokens
    session, dec = Session(target, 300, path="static"), decoder()
    prepare(session, dec, GREEDY)
    assert session.length == 0 and not session.pending
    before = graphs.Totals.shapes
    assert generate(session, dec, Request(prompt, GREEDY, 150)).tokens == ref
    # a later turn: a short message after the first answer
    generate(session, dec, Request(list(range(40, 45)), GREEDY, 60))
    assert graphs.Totals.shapes == before


@pytest.mark.parametrize("kind", ["none", "dflash", "eagle3", "dflash2"])
def test_after_load_no_prompt_or_turn_attends_eagerly(models, dflash2, kind, monkeypatch):
    """After warmup.prepare, neither a fresh prompt nor a chat turn's new rows (more than one graph's rows included)
    run the eager attention (ops.attention): on the GPU that is SDPA, which builds a cuDNN plan for each new shape
    before the first token (an EAGLE-3 prompt absorbed eagerly: 50 ms to 1.4 s a shape on an H200). Every turn
    answers as plain greedy decoding does."""
    from dflash_cli.layers import ops
    from dflash_cli.runtime.warmup import prepare

    target = models[0]
    session = Session(target, 400, path="static")
    dec = PlainDecoder() if kind == "none" else speculative(kind, models, dflash2)
    prepare(session, dec, GREEDY)
    calls = []
    real = ops.attention
    monkeypatch.setattr(ops, "attention", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    before = graphs.Totals.shapes
    turns = [list(range(30, 30 + n)) for n in (9, 21, 45)]  # a fresh prompt, then turns after each answer
    answers = [generate(session, dec, Request(ids, GREEDY, 20)).tokens for ids in turns]
    assert calls == [] and graphs.Totals.shapes == before
    monkeypatch.setattr(ops, "attention", real)
    plain = Session(target, 400, path="eager")
    assert answers == [generate(plain, PlainDecoder(), Request(ids, GREEDY, 20)).tokens for ids in turns]


@pytest.mark.parametrize("sizes", [(45, 21), (1, 33), (32, 1)])
def test_a_chained_drafter_absorbs_in_padded_chunks_as_it_does_eagerly(models, sizes):
    """The graph path absorbs a prompt and a turn's rows MAX_ROWS at a time, the last chunk padded, and position 0
    apart: the chain then drafts from the same states as after the eager absorb."""
    target, _, eagle = models
    ids = list(range(20, 20 + sum(sizes) + 3))
    hidden = Session(target, 300).forward(ids, capture=eagle.capture).hidden  # the same states for both paths
    chains = {}
    for path in ("eager", "static"):
        p = Eagle3Proposer(eagle)
        p.reset(300, path)
        rows = []
        start = 0
        for n in sizes:
            p.absorb(hidden[start : start + n], start, ids[start : start + n])
            start += n
            pos, state = p.first_state()
            for i, token in enumerate(ids[start : start + 3]):  # the chain, fed the next tokens
                logits, state = p.chain_step(pos + i, state, token)
                rows.append(logits)
        assert (p.committed, p.rows) == (start, start - 1)
        chains[path] = torch.stack(rows)
    assert torch.allclose(chains["static"], chains["eager"], rtol=1e-4, atol=1e-4)
