"""Drafter defaults: an EAGLE-3 drafter given as a path (not a registry kind) chains its config's length, else 7,
not the 16-token maximum; a registry kind takes the registry's."""

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
