"""Our DFlash 2 drafter and spec loop against z-lab's reference (`dflash` package, DFlash2DraftModel) on random
weights: every step's drafts and logits over whole generations, selector on and off, both checkpoint layouts."""

import json

import pytest
import torch

from dflash_cli.errors import DflashError
from dflash_cli.models.dflash import DFlashDrafter
from dflash_cli.models.dflash2 import DFlash2Drafter, convolve
from dflash_cli.models.qwen3 import Qwen3Model
from dflash_cli.runtime.drafters import detect_kind
from dflash_cli.runtime.drafters.dflash2 import DFlash2Proposer
from dflash_cli.runtime.generation import Request, generate
from dflash_cli.runtime.sampling import SamplingParams
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.speculative import SpeculativeDecoder
from test_dflash_parity import assert_matches_reference
from tiny import make_dflash2, make_qwen3

transformers = pytest.importorskip("transformers")
zlab = pytest.importorskip("dflash.model")


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: thousands of tiny forwards


@pytest.fixture(scope="module", params=[(4, 2), (8, 3)], ids=["b4-taps2", "b8-taps3"])
def setup(request, tmp_path_factory):
    block, taps = request.param
    root = tmp_path_factory.mktemp(f"dflash2-b{block}")
    target_dir = make_qwen3(root / "target", seed=5, num_hidden_layers=5, with_tokenizer=False)
    cfg = json.loads((target_dir / "config.json").read_text())
    kw = dict(seed=6, layers=2, block_size=block, target_layer_ids=[1, 3], kernel_size=taps, top_k=5)
    zdir = make_dflash2(root / "zlab", cfg, **kw)
    sdir = make_dflash2(root / "speculators", cfg, layout="speculators", **kw)
    ours_t = Qwen3Model.load(target_dir)
    ref_t = transformers.Qwen3ForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    ref_d = zlab.DFlash2DraftModel.from_pretrained(zdir, dtype=torch.float32).eval()
    return ours_t, zdir, sdir, ref_t, ref_d


def reference_run(ref_t, ref_d, prompt, max_new, monkeypatch):
    """z-lab's generation loop, recording each step's drafts and block logits."""
    import time

    monkeypatch.setattr(zlab, "_cuda_time", time.perf_counter)  # the reference times with CUDA syncs
    logits, drafts = [], []
    orig_logits, orig_propose = ref_d.compute_logits, ref_d.propose

    def compute_logits(hidden, head):
        logits.append(orig_logits(hidden, head)[0])
        return logits[-1][None]

    def propose(*args):
        out = orig_propose(*args)
        drafts.append(out[0][0].tolist())
        return out

    monkeypatch.setattr(ref_d, "compute_logits", compute_logits)
    monkeypatch.setattr(ref_d, "propose", propose)
    ref = zlab.dflash_generate(ref_d, ref_t, prompt[None], max_new, stop_token_ids=None, return_stats=True)
    return ref, logits, drafts


def our_run(ours_d, prompt, max_new, path="eager"):
    logits = []
    orig = ours_d.normed_logits
    ours_d.normed_logits = lambda x: logits.append(orig(x)) or logits[-1]
    try:
        # A cache that ends where z-lab's generation does.
        session = Session(ours_d.target, max_len=prompt.shape[0] + max_new, path=path)
        res = generate(session, SpeculativeDecoder(DFlash2Proposer(ours_d)),
                       Request(prompt.tolist(), SamplingParams(), max_tokens=max_new))
    finally:
        del ours_d.normed_logits
    return res, logits


@pytest.mark.parametrize("selector", [True, False], ids=["selector", "argmax"])
@pytest.mark.parametrize("seed", [0, 1])
def test_drafts_and_logits_match_reference(setup, seed, selector, monkeypatch):
    ours_t, zdir, _, ref_t, ref_d = setup
    ours_d = DFlash2Drafter.load(zdir, ours_t, selector=selector)
    if not selector:  # the reference with one candidate per row: each row's argmax
        monkeypatch.setattr(ref_d.candidate_selector, "top_k", 1)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 300, (11 + seed,), generator=g)
    max_new = 40
    ref, ref_logits, ref_drafts = reference_run(ref_t, ref_d, prompt, max_new, monkeypatch)
    res, our_logits = our_run(ours_d, prompt, max_new)

    assert_matches_reference(res, ref, prompt.shape[0], our_logits, ref_logits, ours_d.block_size, ref_drafts)
    if selector:  # the walk is not each row's argmax: the selector changes drafts
        assert any(d != ref_l.argmax(-1).tolist() for d, ref_l in zip(ref_drafts, ref_logits))


def test_speculators_layout_loads_to_identical_outputs(setup):
    ours_t, zdir, sdir, _, _ = setup
    assert detect_kind(zdir) == detect_kind(sdir) == "dflash2"
    z, s = DFlash2Drafter.load(zdir, ours_t, selector=True), DFlash2Drafter.load(sdir, ours_t, selector=True)
    assert z.capture == s.capture and z.block_size == s.block_size and z.c.mask_token_id == s.c.mask_token_id
    prompt = torch.randint(0, 300, (13,), generator=torch.Generator().manual_seed(3))
    (a, la), (b, lb) = our_run(z, prompt, 30), our_run(s, prompt, 30)
    assert a.tokens == b.tokens and [x.draft for x in a.steps] == [x.draft for x in b.steps]
    assert all(torch.equal(x, y) for x, y in zip(la, lb))


@pytest.mark.parametrize("window", [None, 5])
def test_static_path_gives_the_eager_tokens(setup, window):
    """The device-position forward (what the GPU's graphs capture), conv and selector inside the draft step; with a
    window (DFLASH_DRAFT_WINDOW's) shorter than the context, both paths mask the same keys."""
    ours_t, zdir, _, _, _ = setup
    d = DFlash2Drafter.load(zdir, ours_t, selector=True, window=window)
    if window:
        assert all(a.window == window for a in d.c.attention)
    prompt = torch.randint(0, 300, (9,), generator=torch.Generator().manual_seed(4))
    (eager, _), (static, _) = our_run(d, prompt, 40), our_run(d, prompt, 40, path="static")
    assert static.tokens == eager.tokens
    assert [s.draft for s in static.steps] == [s.draft for s in eager.steps]


def test_convolution_stays_inside_the_block():
    """Row t mixes rows t, t-1, ... of its own block only: changing later rows leaves earlier outputs alone, and
    the taps past the block's first row read zeros (a one-row block: only tap 0)."""
    g = torch.Generator().manual_seed(0)
    x, delta, base = torch.randn(5, 8, generator=g), torch.randn(5, 3, 2, generator=g), torch.randn(3, 8, generator=g)
    out = convolve(x, delta, base)
    y = x.clone()
    y[3:] += 1
    assert torch.equal(convolve(y, delta, base)[:3], out[:3])
    want = sum((base[j] + delta[:, j].repeat_interleave(4, -1)) * torch.cat([torch.zeros(j, 8), x[: 5 - j]])
               for j in range(3))
    assert torch.allclose(out, want, atol=1e-6)
    assert torch.allclose(convolve(x[:1], delta[:1], base), (base[0] + delta[0, 0].repeat_interleave(4)) * x[:1])


def test_dflash_loader_points_dflash2_checkpoints_to_their_kind(setup):
    ours_t, zdir, *_ = setup
    with pytest.raises(DflashError, match="DFlash 2 drafter"):
        DFlashDrafter.load(zdir, ours_t)


def test_bad_dflash2_configs_are_one_clear_error(setup, tmp_path):
    ours_t, zdir, sdir, *_ = setup
    z = json.loads((zdir / "config.json").read_text())
    s = json.loads((sdir / "config.json").read_text())
    cases = [
        (sdir, dict(s, draft_vocab_size=100), "full target vocabulary"),
        (sdir, {k: v for k, v in s.items() if k != "aux_hidden_state_layer_ids"}, "aux_hidden_state_layer_ids"),
        (zdir, dict(z, dflash_config={k: v for k, v in z["dflash_config"].items() if k != "selector_rank"}),
         "selector_rank"),
        (zdir, dict(z, dflash_config=dict(z["dflash_config"], conv_group_size=24)), "does not divide"),
        (zdir, dict(z, dflash_config=dict(z["dflash_config"], selector_top_k=0)), "selector_top_k 0"),
    ]
    for i, (src, cfg, needle) in enumerate(cases):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
        (folder / "model.safetensors").symlink_to(src / "model.safetensors")
        with pytest.raises(DflashError, match=needle):
            DFlash2Drafter.load(folder, ours_t)
    # A q row holds at most min(K_MAX, vocab) candidates: a wider selector is refused when the proposer is made.
    wide = DFlash2Drafter.load(zdir, ours_t, selector=True)
    wide.selector.top_k = 65
    with pytest.raises(DflashError, match="selector_top_k 65"):
        DFlash2Proposer(wide)


def test_selector_knob(setup, monkeypatch):
    from dflash_cli import tuning

    ours_t, zdir, *_ = setup
    monkeypatch.setattr(tuning, "KNOBS", tuning.read({"DFLASH_SELECTOR": "0"}))
    assert DFlash2Drafter.load(zdir, ours_t).use_selector is False
    monkeypatch.setattr(tuning, "KNOBS", tuning.read({}))
    assert DFlash2Drafter.load(zdir, ours_t).use_selector is True
    with pytest.raises(DflashError, match="DFLASH_SELECTOR"):
        tuning.read({"DFLASH_SELECTOR": "maybe"})
