"""The embedded demo pair: registered as `demo`, loads offline through the real loaders, runs
speculative decoding on CPU with its statistics, and is in the published layouts (transformers
and z-lab's reference load it and agree with us)."""

import json

import pytest
import torch

from dflash_cli.runtime.generation import Request, generate
from dflash_cli.runtime.drafters import load as load_drafter
from dflash_cli.runtime.sampling import SamplingParams
from dflash_cli.runtime.session import Session
from dflash_cli.runtime.speculative import SpeculativeDecoder
from dflash_cli.loading.tokenizer import ChatTokenizer
from dflash_cli.models.qwen3 import Qwen3Model
from dflash_cli.registry import Registry

DEMO = Registry.load().entries["demo"]
TARGET, DFLASH, EAGLE3 = DEMO.target.path(), DEMO.drafters["dflash"].path(), DEMO.drafters["eagle3"].path()


def test_demo_is_the_default_entry_and_fits_the_budget():
    reg = Registry.load()
    assert reg.default == "demo"
    size = sum(f.stat().st_size for d in (TARGET, DFLASH, EAGLE3) for f in d.iterdir())
    assert size <= 30_000_000  # issue 44's budget for the shipped demo (training/presets.py SHIPPED_LIMIT)
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (TARGET / f).is_file()


@pytest.mark.parametrize("draft", ["dflash", "dflash2", "eagle3"])
def test_generate_demo_offline_with_speculation(cli, monkeypatch, draft):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = cli("generate", "--model", "demo", "--prompt", "def fibonacci(n):", "--draft", draft, "--max-tokens", "48",
            "--json")
    assert r.code == 0, r.err
    res = json.loads(r.out)
    plain = json.loads(cli("generate", "--model", "demo", "--prompt", "def fibonacci(n):", "--draft", "none",
                           "--max-tokens", "48", "--json").out)
    assert res["tokens"] == plain["tokens"]  # greedy by the registry's default: lossless
    assert res["stats"]["draft_kind"] == draft and res["stats"]["tau_tokens_per_step"] > 1.0
    assert res["text"].strip()


def test_generate_demo_streams_with_the_live_footer(cli):
    r = cli("generate", "--prompt", "import os\n", "--max-tokens", "24")
    assert r.code == 0, r.err
    assert r.out.strip()


def test_transformers_runs_the_demo_target_like_us():
    transformers = pytest.importorskip("transformers")
    ref = transformers.Qwen3ForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    ours = Qwen3Model.load(TARGET)
    ids = torch.tensor(ChatTokenizer(TARGET).encode("def fibonacci(n):\n    if n < 2:\n"))
    with torch.no_grad():
        expected = ref(ids[None]).logits[0]
    got = ours.forward(ids, 0, ours.new_cache(64), all_logits=True).logits
    assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-4


def test_zlab_reference_loads_the_demo_and_accepts_what_we_accept(monkeypatch):
    transformers = pytest.importorskip("transformers")
    zlab = pytest.importorskip("dflash.model")
    from test_dflash_parity import assert_matches_reference, run_reference

    ref_t = transformers.Qwen3ForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    ref_d = zlab.DFlashDraftModel.from_pretrained(DFLASH, dtype=torch.float32).eval()
    prompt = torch.tensor(ChatTokenizer(TARGET).encode("class Stack:\n    def __init__(self):\n"))
    ref, ref_logits = run_reference(ref_d, ref_t, prompt, 48, monkeypatch)
    ours_t = Qwen3Model.load(TARGET)
    proposer = load_drafter("dflash", DFLASH, ours_t)  # the shipped DFlash 2 folder's block drafter alone
    our_logits, draft_logits = [], proposer.draft_logits
    proposer.draft_logits = lambda last, k: our_logits.append(draft_logits(last, k)) or our_logits[-1]
    session = Session(ours_t, max_len=prompt.shape[0] + 48 + 1)
    res = generate(session, SpeculativeDecoder(proposer), Request(prompt.tolist(), SamplingParams(), max_tokens=48))
    assert_matches_reference(res, ref, prompt.shape[0], our_logits, ref_logits, proposer.model.block_size)
    assert max(ref.acceptance_lengths) > 1  # the drafter predicts its target


def test_zlab_reference_loads_the_demo_dflash2_and_drafts_what_we_draft(monkeypatch):
    """The shipped block drafter with its selector (DFlash 2 form): z-lab's DFlash2DraftModel drafts the same tokens
    every step, greedy, over a whole generation."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("dflash.model")
    from dflash_cli.models.dflash2 import DFlash2Drafter
    from test_dflash2_parity import assert_matches_reference, our_run, reference_run, zlab

    folder = DEMO.drafters["dflash2"].path()
    ref_t = transformers.Qwen3ForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    ref_d = zlab.DFlash2DraftModel.from_pretrained(folder, dtype=torch.float32).eval()
    prompt = torch.tensor(ChatTokenizer(TARGET).encode("class Stack:\n    def __init__(self):\n"))
    ref, ref_logits, ref_drafts = reference_run(ref_t, ref_d, prompt, 48, monkeypatch)
    ours_d = DFlash2Drafter.load(folder, Qwen3Model.load(TARGET), selector=True)
    res, our_logits = our_run(ours_d, prompt, 48)
    assert_matches_reference(res, ref, prompt.shape[0], our_logits, ref_logits, ours_d.block_size, ref_drafts)
    assert max(ref.acceptance_lengths) > 1
