"""`dflash serve --engine vllm|sglang`: every registry entry becomes a launch command whose flags are the
engines' documented ones (neither engine installs on a CPU-only test machine, so the names are listed here)."""

import json
import shlex

import pytest

from dflash_cli.commands import serve as serve_cmd
from dflash_cli.registry import Registry
from dflash_cli.serve import external
from dflash_cli.serve.external import launch_command

# `vllm serve` arguments, from vLLM's CLI reference (docs.vllm.ai, "vllm serve" / engine arguments) and its
# speculative decoding guide (--speculative-config with method "eagle3" or "dflash", model, num_speculative_tokens).
VLLM_OPTIONS = {"--served-model-name", "--speculative-config", "--tensor-parallel-size", "--max-model-len",
                "--override-generation-config", "--host", "--port", "--api-key"}
VLLM_METHODS = {"eagle3", "dflash"}
# `python -m sglang.launch_server` arguments, from SGLang's server arguments page (docs.sglang.ai,
# advanced_features/server_arguments) and its speculative decoding page (EAGLE3 and DFLASH algorithms).
SGLANG_OPTIONS = {"--model-path", "--served-model-name", "--speculative-algorithm", "--speculative-draft-model-path",
                  "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--tp-size",
                  "--context-length", "--preferred-sampling-params", "--enable-metrics", "--host", "--port",
                  "--api-key"}
SGLANG_ALGORITHMS = {"EAGLE3", "DFLASH"}
FLAGS_WITHOUT_VALUE = {"--enable-metrics"}

REGISTRY = Registry.load()
CASES = [(name, draft) for name, e in REGISTRY.entries.items() for draft in ["none", *e.drafters]]


def options(argv, start):
    """{flag: value} of argv[start:]; fails on a stray positional."""
    out, i = {}, start
    while i < len(argv):
        flag = argv[i]
        assert flag.startswith("--"), argv
        if flag in FLAGS_WITHOUT_VALUE:
            out[flag], i = None, i + 1
        else:
            out[flag], i = argv[i + 1], i + 2
    return out


@pytest.mark.parametrize("name,draft", CASES)
def test_vllm_command_for_every_registry_entry(name, draft):
    e = REGISTRY.entries[name]
    argv = launch_command("vllm", e, draft=draft, tensor_parallel=2, host="0.0.0.0", port=9000, api_key="k")
    assert argv[:3] == ["vllm", "serve", e.target.ref]
    opts = options(argv, 3)
    assert set(opts) <= VLLM_OPTIONS, set(opts) - VLLM_OPTIONS
    assert opts["--tensor-parallel-size"] == "2" and opts["--max-model-len"] == str(e.context)
    assert (opts["--host"], opts["--port"], opts["--api-key"], opts["--served-model-name"]) == ("0.0.0.0", "9000", "k", name)
    assert json.loads(opts["--override-generation-config"]) == e.generation
    if draft == "none":
        assert "--speculative-config" not in opts
        return
    spec = json.loads(opts["--speculative-config"])
    assert set(spec) == {"method", "model", "num_speculative_tokens"} and spec["method"] in VLLM_METHODS
    assert spec["method"] == ("dflash" if draft == "dflash2" else draft) and spec["model"] == e.drafters[draft].ref
    assert spec["num_speculative_tokens"] == (e.draft_len if draft == "eagle3" else 15)  # DFlash: block 16 - 1


@pytest.mark.parametrize("name,draft", CASES)
def test_sglang_command_for_every_registry_entry(name, draft):
    e = REGISTRY.entries[name]
    argv = launch_command("sglang", e, draft=draft, tensor_parallel=4, draft_len=5)
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    opts = options(argv, 3)
    assert set(opts) <= SGLANG_OPTIONS, set(opts) - SGLANG_OPTIONS
    assert opts["--model-path"] == e.target.ref and opts["--tp-size"] == "4"
    assert opts["--context-length"] == str(e.context) and "--enable-metrics" in opts
    assert json.loads(opts["--preferred-sampling-params"]) == e.generation
    if draft == "none":
        assert not any(k.startswith("--speculative") for k in opts)
        return
    assert opts["--speculative-algorithm"] in SGLANG_ALGORITHMS
    assert opts["--speculative-algorithm"] == ("DFLASH" if draft == "dflash2" else draft.upper())
    assert opts["--speculative-draft-model-path"] == e.drafters[draft].ref
    assert opts["--speculative-num-draft-tokens"] == "6"  # --draft-len 5 and the bonus token
    if draft == "eagle3":
        assert (opts["--speculative-num-steps"], opts["--speculative-eagle-topk"]) == ("5", "1")


def test_print_shows_the_command_and_running_needs_the_engine(cli, monkeypatch):
    res = cli("serve", "qwen3-8b", "--engine", "vllm", "--tensor-parallel", "2", "--print")
    assert res.code == 0, res.err
    argv = shlex.split(res.out)
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"] and "--tensor-parallel-size" in argv
    monkeypatch.setattr(external, "installed", lambda engine: False)
    for engine in ("vllm", "sglang"):
        res = cli("serve", "demo", "--engine", engine)
        assert res.code == 1 and res.err.startswith(f"error: {engine} is not installed") and len(res.err.splitlines()) == 1
    ran = []
    monkeypatch.setattr(external, "installed", lambda engine: True)
    monkeypatch.setattr(serve_cmd.os, "execvp", lambda file, argv: ran.append(argv))
    assert cli("serve", "demo", "--engine", "sglang", "--draft", "eagle3").code == 0
    assert ran and "--speculative-algorithm" in ran[0] and "EAGLE3" in ran[0]


def test_bad_draft_for_an_external_engine(cli):
    res = cli("serve", "demo", "--engine", "vllm", "--draft", "/some/folder", "--print")
    assert res.code == 1 and "--draft takes none, dflash, dflash2 or eagle3" in res.err
    res = cli("serve", "demo", "--engine", "vllm", "--tensor-parallel", "0", "--print")
    assert res.code == 1 and "--tensor-parallel" in res.err
    res = cli("serve", "demo", "--engine", "sglang", "--context", "512", "--print")
    assert res.code == 0 and "--context-length 512" in res.out


def test_dflash2_runs_as_dflash_with_its_checkpoints_block(tmp_path):
    """A DFlash 2 drafter launches as the engines' DFlash (they switch its modules on from the checkpoint); its
    drafts per step come from its block size, at the top level (speculators) or in dflash_config (z-lab)."""
    from dflash_cli.registry import ModelEntry, Source

    for i, cfg in enumerate(({"block_size": 9}, {"dflash_config": {"block_size": 9}})):
        folder = tmp_path / str(i)
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg))
        e = ModelEntry(name="m", target=Source("Org/target"), drafters={"dflash2": Source(str(folder))})
        assert external.draft_tokens(e, "dflash2", None) == 8
        spec = json.loads(options(launch_command("vllm", e, draft="dflash2"), 3)["--speculative-config"])
        assert spec == {"method": "dflash", "model": str(folder), "num_speculative_tokens": 8}
