"""Our DFlash drafter and spec loop against z-lab's reference (`dflash` package) on random weights."""

import json

import pytest
import torch

from dflash_cli.runtime.generation import Request, generate
from dflash_cli.runtime.drafters.dflash import DFlashProposer
from dflash_cli.runtime.sampling import SamplingParams
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.speculative import SpeculativeDecoder
from dflash_cli.models.dflash import DFlashDrafter
from dflash_cli.models.qwen3 import Qwen3Model
from tiny import make_dflash, make_qwen3

transformers = pytest.importorskip("transformers")
zlab = pytest.importorskip("dflash.model")


@pytest.fixture(scope="module", params=[4, 8])
def setup(request, tmp_path_factory):
    block = request.param
    root = tmp_path_factory.mktemp(f"dflash-b{block}")
    target_dir = make_qwen3(root / "target", seed=5, num_hidden_layers=5)
    cfg = json.loads((target_dir / "config.json").read_text())
    draft_dir = make_dflash(root / "draft", cfg, seed=6, layers=2, block_size=block, target_layer_ids=[1, 3])
    ours_t = Qwen3Model.load(target_dir)
    ours_d = DFlashDrafter.load(draft_dir, ours_t)
    ref_t = transformers.Qwen3ForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    ref_d = zlab.DFlashDraftModel.from_pretrained(draft_dir, dtype=torch.float32).eval()
    return ours_t, ours_d, ref_t, ref_d


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def run_reference(ref_d, ref_t, prompt, max_new, monkeypatch):
    """z-lab's dflash_generate over `prompt`: its result and every draft step's logits (the drafter's compute_logits
    recorded)."""
    import time

    monkeypatch.setattr(zlab, "_cuda_time", time.perf_counter)  # the reference times with CUDA syncs
    logits = []
    orig = ref_d.compute_logits
    ref_d.compute_logits = lambda hidden, head: logits.append(orig(hidden, head)[0]) or logits[-1][None]
    try:
        ref = zlab.dflash_generate(ref_d, ref_t, prompt[None], max_new, stop_token_ids=None, return_stats=True)
    finally:
        ref_d.compute_logits = orig
    return ref, logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_draft_logits_and_accepted_lengths_match_reference(setup, seed, monkeypatch):
    ours_t, ours_d, ref_t, ref_d = setup
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 300, (11 + seed,), generator=g)
    max_new = 40
    ref, ref_logits = run_reference(ref_d, ref_t, prompt, max_new, monkeypatch)

    our_logits = []
    proposer = DFlashProposer(ours_d)
    orig_ours = proposer.draft_logits
    proposer.draft_logits = lambda last, k: our_logits.append(orig_ours(last, k)) or our_logits[-1]
    # A cache that ends where z-lab's generation does. Near that end z-lab's loop drafts a shorter block (fewer mask
    # rows: other logits); ours drafts the whole block and verifies its first drafts. The steps before that match.
    session = Session(ours_t, max_len=prompt.shape[0] + max_new)
    res = generate(session, SpeculativeDecoder(proposer), Request(prompt.tolist(), SamplingParams(), max_tokens=max_new))

    assert_matches_reference(res, ref, prompt.shape[0], our_logits, ref_logits, ours_d.block_size)


def assert_matches_reference(res, ref, prompt_len: int, our_logits, ref_logits, block: int, ref_drafts=None):
    """Our generation `res` against z-lab's `ref`: the same tokens; until the reference's loop shrinks its block near
    the cache's end (fewer mask rows: other logits; ours drafts the whole block and verifies its first drafts), the
    same accepted lengths, draft logits (<= 1e-4 relative) and, where given, drafts, at every step."""
    assert res.tokens == ref.output_ids[0, prompt_len:].tolist()
    whole = next((i for i, b in enumerate(ref_logits) if b.shape[0] < block - 1), len(ref_logits))
    assert whole >= 5 and len(our_logits) >= whole
    assert [len(s.emitted) for s in res.steps][:whole] == ref.acceptance_lengths[:whole]
    if ref_drafts is not None:
        assert [s.draft for s in res.steps][:whole] == ref_drafts[:whole]  # token for token
    for a, b in zip(our_logits[:whole], ref_logits[:whole]):
        assert a.shape == b.shape
        assert rel_err(a, b) <= 1e-4
