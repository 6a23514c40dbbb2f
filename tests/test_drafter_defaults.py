"""Drafter defaults: an EAGLE-3 drafter given as a path (not a registry kind) chains its config's length, else 7,
not the 16-token maximum; a registry kind takes the registry's; a DFlash block past a step's rows drafts what fits."""

import json
import shutil
from pathlib import Path

import dflash_cli
from dflash_cli.registry import Registry
from dflash_cli.runtime.bundle import open_bundle
from dflash_cli.runtime.decoders import make_decoder

DEMO_EAGLE3 = Path(dflash_cli.__file__).parent / "demo" / "eagle3"


def test_an_eagle3_drafter_given_as_a_path_gets_its_own_chain_length(tmp_path):
    bundle = open_bundle(Registry.load().resolve("demo"), "cpu", "float32")
    speculators = {"speculators_config": {"proposal_methods": [{"speculative_tokens": 5}]}}
    for extra, want in (({}, 7), (speculators, 5), ({"num_speculative_tokens": 4}, 4)):
        folder = tmp_path / f"eagle3-{want}"
        shutil.copytree(DEMO_EAGLE3, folder)
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **extra}))
        assert make_decoder(bundle, str(folder)).draft_len == want
    assert make_decoder(bundle, "eagle3").draft_len == bundle.entry.draft_len
    assert make_decoder(bundle, str(tmp_path / "eagle3-7"), draft_len=3).draft_len == 3


def test_a_dflash_block_past_a_steps_rows_drafts_what_fits(cli, tiny_model, tmp_path):
    """A DFlash block of 40 (past MAX_STEP_ROWS = 32 rows with its anchor) drafts 31 a step: greedy equals plain, and
    sampling runs (its q rows fit the sampler's buffer)."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from tiny import make_dflash

    cfg = json.loads((tiny_model / "config.json").read_text())
    draft = make_dflash(tmp_path / "b40", cfg, seed=3, layers=1, block_size=40, target_layer_ids=[0, 1])
    args = ("generate", "--model", tiny_model, "-p", "hi", "-n", "40", "--json")
    plain = cli(*args, "--draft", "none", "--temperature", "0")
    spec = cli(*args, "--draft", draft, "--temperature", "0")
    assert plain.code == 0 and spec.code == 0, spec.err
    assert json.loads(spec.out)["tokens"] == json.loads(plain.out)["tokens"]
    assert len(json.loads(spec.out)["stats"]["accepted_drafts_hist"]) == 32  # 0..31 accepted drafts
    sampled = cli(*args, "--draft", draft, "--temperature", "0.8", "--seed", "1")
    assert sampled.code == 0, sampled.err
