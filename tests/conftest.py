import io
import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
# Tiny models: one thread is as fast and keeps timings steady when other jobs share the CPU.
torch.set_num_threads(1)

from tiny import make_qwen3  # noqa: E402


@pytest.fixture(scope="module")
def one_thread():
    """Thousands of tiny forwards: one intra-op thread is as fast, and much faster on a busy machine (a CLI test run
    in-process may have set more)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A random-weight Qwen3 checkpoint in Hub layout (sharded, untied head)."""
    return make_qwen3(tmp_path_factory.mktemp("tiny-qwen3"), seed=0, shards=2)


@pytest.fixture(autouse=True)
def isolated_hub(tmp_path, monkeypatch):
    """No test touches the real Hugging Face cache or the network."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("DFLASH_REGISTRY", raising=False)
    from dflash_cli import tuning

    monkeypatch.setattr(tuning, "KNOBS", tuning.read())  # the CLI re-reads them; tests calling the code directly
    # huggingface_hub reads HF_HOME once, at import (transformers imports it during collection).
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


class CliResult:
    def __init__(self, code, out, err):
        self.code, self.out, self.err = code, out, err

    def json(self):
        return json.loads(self.out)


@pytest.fixture
def cli(monkeypatch, capsys):
    """Run `dflash ARGS` in-process with optional stdin; returns exit code, stdout, stderr."""
    from dflash_cli.cli.app import main

    def run(*args, stdin: str = ""):
        monkeypatch.setattr(sys, "argv", ["dflash", *map(str, args)])
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        capsys.readouterr()
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code or 0
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run
