"""What a command imports on its way to the first token, each in a fresh Python (the measure of start-up): `--help`
no torch; `generate` no other command's modules; an input error no torch; a Hub model found before, no huggingface_hub API; a step's
capture, no kernels of the models it does not run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_registry import fake_cached

ROOT = Path(__file__).resolve().parents[1]


def modules_after(script: str) -> set[str]:
    """The modules a fresh Python has imported once `script` ran."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", script + "\nimport sys\nprint('\\n' + ' '.join(sys.modules))"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return set(r.stdout.splitlines()[-1].split())


def cli_run(*args: str) -> str:
    return (f"import sys\nsys.argv = ['dflash', *{list(args)!r}]\nfrom dflash_cli.cli.app import main\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n")


def test_help_imports_no_torch():
    assert "torch" not in modules_after(cli_run("--help"))


def test_generate_imports_none_of_the_other_commands():
    loaded = modules_after(cli_run("generate", "--model", "demo", "-p", "def f", "-n", "2", "--json"))
    assert "dflash_cli.runtime.warmup" in loaded  # it ran
    others = ("dflash_cli.commands.chat", "dflash_cli.commands.bench", "dflash_cli.commands.serve",
              "dflash_cli.commands.train", "dflash_cli.commands.remote", "dflash_cli.serve", "dflash_cli.training",
              "dflash_cli.bench", "dflash_cli.remote", "huggingface_hub", "prompt_toolkit", "fastapi", "uvicorn",
              "matplotlib", "transformers", "triton")  # triton: the CPU runs no kernels
    assert not {m for m in loaded for o in others if m == o or m.startswith(o + ".")}


@pytest.mark.parametrize("args", [["-p", ""], ["-p", "x", "-n", "0"], ["-p", "x", "--temperature", "-1"],
                                  ["-f", "missing.txt"], ["-m", "no-such-model", "-p", "x"]])
def test_generate_input_errors_come_before_torch(args):
    """Before: `generate -p ''` and the like answered only after the seconds torch's import takes."""
    script = (f"import sys\nsys.argv = ['dflash', 'generate', *{args!r}]\nfrom dflash_cli.cli.app import main\n"
              "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 1, exc.code\n")
    assert "torch" not in modules_after(script)


def test_chat_input_errors_come_before_torch():
    script = ("import sys\nsys.argv = ['dflash', 'chat', '--top-p', '2']\nfrom dflash_cli.cli.app import main\n"
              "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 1, exc.code\n")
    assert "torch" not in modules_after(script)


def test_a_snapshot_found_before_needs_no_hub_api(tmp_path, tiny_model):
    from dflash_cli import hub

    snap = fake_cached(tmp_path / "hf-home" / "hub", "Org/Tiny", tiny_model)  # conftest's HF_HOME: this test's
    assert hub.cached_snapshot("Org/Tiny") == snap.resolve()  # huggingface_hub's answer, recorded
    loaded = modules_after(f"from dflash_cli import hub\nassert hub.cached_snapshot('Org/Tiny').name == {snap.name!r}")
    assert {m for m in loaded if m.startswith("huggingface_hub")} == {"huggingface_hub", "huggingface_hub.constants"}


def test_the_carveout_imports_no_kernels_a_step_did_not():
    pytest.importorskip("triton")
    loaded = modules_after("from dflash_cli.kernels import carveout, elementwise\nlist(carveout._handles())")
    assert not {"dflash_cli.kernels.delta_rule", "dflash_cli.kernels.dflash2", "dflash_cli.kernels.sampling"} & loaded
