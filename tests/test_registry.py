"""models.toml, how a model argument resolves, the Hugging Face cache offline, and `dflash pull`."""

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from dflash_cli import tuning
from dflash_cli.errors import DflashError
from dflash_cli.registry import PACKAGED, Registry

QWEN_DEFAULTS = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}


@pytest.fixture(autouse=True)
def hub_cache(tmp_path, monkeypatch):
    """huggingface_hub reads HF_HOME once, at import: point its cache at this test's HF_HOME too."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-home" / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("COLUMNS", "250")  # keep `dflash models` table cells on one line
    return cache


def registry(tmp_path, monkeypatch, text: str) -> Path:
    path = tmp_path / "reg" / "models.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    monkeypatch.setenv("DFLASH_REGISTRY", str(path))
    monkeypatch.setattr(tuning, "KNOBS", tuning.read())
    return path


def fake_cached(cache: Path, repo: str, src: Path, files=None) -> Path:
    """Lay `src`'s files out as huggingface_hub caches them: blobs, a snapshot of symlinks, refs/main."""
    root = cache / ("models--" + repo.replace("/", "--"))
    sha = hashlib.sha1(repo.encode()).hexdigest()
    snap = root / "snapshots" / sha
    snap.mkdir(parents=True)
    (root / "blobs").mkdir()
    for f in sorted(src.iterdir()):
        if files is not None and f.name not in files:
            continue
        data = f.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(sha)
    return snap


def assert_one_line_error(res, *needles):
    assert res.code == 1, (res.code, res.out, res.err)
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.err
    assert "Traceback" not in res.err
    for needle in needles:
        assert needle in lines[0]


def test_packaged_registry_has_the_qwen3_entries():
    reg = Registry.load()
    assert reg.path == PACKAGED and PACKAGED.is_file()
    assert reg.default == "demo"
    for size in ("4b", "8b"):
        e = reg.entries[f"qwen3-{size}"]
        assert e.target.ref == f"Qwen/Qwen3-{size.upper()}"
        assert set(e.drafters) == {"dflash", "dflash2", "eagle3"}
        assert e.drafters["dflash2"].ref == f"RedHatAI/Qwen3-{size.upper()}-speculator.dflash2"
        assert all("/" in src.ref and not src.is_local for src in e.drafters.values())
        assert e.generation == QWEN_DEFAULTS
        assert e.context and e.context >= 4096


def test_resolution_order_registry_then_folder_then_hub(tmp_path, monkeypatch, tiny_model):
    registry(tmp_path, monkeypatch, 'default = "shadow"\n[models.shadow]\ntarget = "./tiny"\n')
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shadow").mkdir()  # a folder with the entry's name loses to the entry
    (tmp_path / "Org" / "Local").mkdir(parents=True)  # a folder that looks like a repo id wins over the Hub
    reg = Registry.load()

    assert reg.resolve("shadow").target.ref == str(tmp_path / "reg" / "tiny")  # relative to the registry file
    assert reg.resolve(None).name == "shadow"
    local = reg.resolve("Org/Local").target
    assert local.is_local and Path(local.ref) == Path("Org/Local")
    hub = reg.resolve("Org/Remote").target
    assert hub.ref == "Org/Remote" and not hub.is_local
    with pytest.raises(DflashError, match="unknown model 'no such model'.*shadow"):
        reg.resolve("no such model")


def test_custom_registry_with_a_local_entry(tmp_path, monkeypatch, tiny_model, cli):
    reg = registry(tmp_path, monkeypatch,
                   'default = "tiny"\n[models.tiny]\ntarget = "./tiny"\ncontext = 40\n'
                   'generation = { temperature = 0.0 }\n')
    shutil.copytree(tiny_model, reg.parent / "tiny")

    # The entry's greedy default overrides the checkpoint's generation_config (temperature 0.6).
    runs = [cli("generate", "-p", "hi", "-n", "4", "--json") for _ in range(2)]
    assert all(r.code == 0 for r in runs), runs[0].err
    explicit = cli("generate", "--model", tiny_model, "-p", "hi", "-n", "4", "--json", "--temperature", "0")
    assert runs[0].json()["tokens"] == runs[1].json()["tokens"] == explicit.json()["tokens"]

    # Its context (40) caps the checkpoint's 512 positions.
    assert_one_line_error(cli("generate", "-m", "tiny", "-p", "word " * 60), "context holds 40")

    listing = cli("models")
    assert listing.code == 0
    assert f"tiny (default)\t—\t{reg.parent / 'tiny'}\t✓" in listing.out


def test_bench_prompts_are_relative_to_the_registry_file(tmp_path, monkeypatch):
    path = registry(tmp_path, monkeypatch, '[models.a]\ntarget = "Org/A"\nbench_prompts = "prompts/a.jsonl"\n'
                                           '[models.b]\ntarget = "Org/B"\nbench_prompts = "./b.jsonl"\n'
                                           '[models.c]\ntarget = "Org/C"\nbench_prompts = "/abs/c.jsonl"\n')
    monkeypatch.chdir(tmp_path)  # not the registry's folder
    entries = Registry.load().entries
    assert entries["a"].bench_prompts == path.parent / "prompts" / "a.jsonl"  # was the cwd's prompts/a.jsonl
    assert entries["b"].bench_prompts == path.parent / "b.jsonl"
    assert entries["c"].bench_prompts == Path("/abs/c.jsonl")


BAD_REGISTRIES = {
    "syntax": ('default = "a"\n[models.a\n', "not valid TOML"),
    "no target": ('[models.a]\ndescription = "?"\n', "entry 'a' needs a 'target'"),
    "drafter kind": ('[models.a]\ntarget = "Org/A"\ndrafters = { medusa = "Org/M" }\n', "unknown drafter kind 'medusa'"),
    "drafter repo": ('[models.a]\ntarget = "Org/A"\ndrafters = { dflash = { revision = "v1" } }\n',
                     "drafter 'dflash' needs a repo"),
    "default": ('default = "b"\n[models.a]\ntarget = "Org/A"\n', "default 'b' is not an entry"),
    "models": ("models = 3\n", "'models' must be a table"),
    # Values of the wrong type: each names its key (they were TypeErrors, or passed on as they were).
    "drafters table": ('[models.a]\ntarget = "Org/A"\ndrafters = "Org/D"\n', "'drafters' must be a table"),
    "generation table": ('[models.a]\ntarget = "Org/A"\ngeneration = 3\n', "'generation' must be a table"),
    "generation value": ('[models.a]\ntarget = "Org/A"\ngeneration = { temperature = "hot" }\n',
                         "'generation' temperature must be a number"),
    "generation key": ('[models.a]\ntarget = "Org/A"\ngeneration = { temprature = 0.6 }\n',
                       "unknown 'generation' key 'temprature'"),
    "context": ('[models.a]\ntarget = "Org/A"\ncontext = "32k"\n', "'context' must be a whole number >= 1"),
    "draft_len": ('[models.a]\ntarget = "Org/A"\ndraft_len = 0\n', "'draft_len' must be a whole number >= 1"),
    "description": ('[models.a]\ntarget = "Org/A"\ndescription = 5\n', "'description' must be a string"),
    "revision": ('[models.a]\ntarget = "Org/A"\nrevision = 3\n', "'revision' must be a string"),
    "drafter revision": ('[models.a]\ntarget = "Org/A"\ndrafters = { dflash = { repo = "Org/D", revision = 7 } }\n',
                         "drafter 'dflash': 'revision' must be a string"),
}


@pytest.mark.parametrize("case", list(BAD_REGISTRIES))
def test_bad_registry_is_one_error_line(tmp_path, monkeypatch, cli, case):
    text, needle = BAD_REGISTRIES[case]
    path = registry(tmp_path, monkeypatch, text)
    assert_one_line_error(cli("models"), needle, str(path))


def test_missing_registry_file_and_unknown_name(tmp_path, monkeypatch, cli):
    assert_one_line_error(cli("generate", "--model", "qwen3-99b", "-p", "hi"), "unknown model 'qwen3-99b'", "qwen3-4b")
    monkeypatch.setenv("DFLASH_REGISTRY", str(tmp_path / "nope.toml"))
    assert_one_line_error(cli("models"), "registry not found", "nope.toml")


@pytest.mark.parametrize("command", [["generate", "--model", "qwen3-4b", "-p", "hi"], ["chat", "qwen3-4b"],
                                     ["generate", "--model", "Org/Missing", "-p", "hi"]])
def test_offline_and_not_cached_says_what_is_missing(cli, command):
    """A registry entry's target: pull the entry, which brings its drafters too (pulling the repo id did not, and the
    next command then asked for the drafter)."""
    repo, pull = ("Qwen/Qwen3-4B", "qwen3-4b") if "qwen3-4b" in command else ("Org/Missing", "Org/Missing")
    res = cli(*command)
    assert_one_line_error(res, repo, "not downloaded", f"`dflash pull {pull}`")
    assert res.out == ""


def test_missing_drafter_is_named_and_draft_none_still_works(tmp_path, monkeypatch, tiny_model, cli):
    registry(tmp_path, monkeypatch, f'[models.t]\ntarget = "{tiny_model}"\ndrafters = {{ dflash = "Org/Drafter" }}\n')
    assert_one_line_error(cli("generate", "-m", "t", "-p", "hi", "-n", "2"), "Org/Drafter", "dflash pull")
    assert cli("generate", "-m", "t", "-p", "hi", "-n", "2", "--draft", "none").code == 0


def _size(n: int) -> str:
    return f"{n / 1000:.1f} KB" if n < 1_000_000 else f"{n / 1e6:.1f} MB"


def test_hub_cache_is_found_offline(tmp_path, monkeypatch, hub_cache, tiny_model, cli):
    snap = fake_cached(hub_cache, "Org/Tiny", tiny_model)
    fake_cached(hub_cache, "Org/Partial", tiny_model, files={"tokenizer.json"})  # interrupted: no config.json
    registry(tmp_path, monkeypatch, '[models.cached]\ntarget = "Org/Tiny"\n[models.absent]\ntarget = "Org/Absent"\n')

    listing = cli("models")
    assert listing.code == 0, listing.err
    rows = {line.split("\t")[0]: line for line in listing.out.splitlines()}
    total = sum(f.stat().st_size for f in tiny_model.iterdir())
    assert f"✓ {_size(total)}" in rows["cached"]
    assert "✓" not in rows["absent"] and "—" in rows["absent"]

    res = cli("generate", "--model", "Org/Tiny", "--draft", "none", "-p", "hi", "-n", "3", "--json", "--temperature", "0")
    assert res.code == 0, res.err
    direct = cli("generate", "--model", snap, "--draft", "none", "-p", "hi", "-n", "3", "--json", "--temperature", "0")
    assert res.json()["tokens"] == direct.json()["tokens"]

    assert_one_line_error(cli("generate", "--model", "Org/Partial", "-p", "hi"), "Org/Partial", "not downloaded")


def test_a_snapshot_without_its_weights_is_not_downloaded(tmp_path, monkeypatch, hub_cache, tiny_model, cli):
    """An interrupted pull where huggingface_hub kept no file list (older versions, single-file downloads): the hub
    returns the snapshot as whole; its config without the weights it lists is still not downloaded."""
    import huggingface_hub
    from dflash_cli import hub

    shard = "model-00002-of-00002.safetensors"
    partial = fake_cached(hub_cache, "Org/Half", tiny_model, files={f.name for f in tiny_model.iterdir()} - {shard})
    fake_cached(hub_cache, "Org/NoWeights", tiny_model, files={"config.json", "tokenizer.json"})
    registry(tmp_path, monkeypatch, '[models.half]\ntarget = "Org/Half"\n[models.none]\ntarget = "Org/NoWeights"\n')
    hub._confirm(partial)  # as an earlier dflash recorded it
    rows = {line.split("\t")[0]: line for line in cli("models").out.splitlines()}
    assert "✓" not in rows["half"] and "✓" not in rows["none"]
    assert_one_line_error(cli("generate", "-m", "half", "-p", "hi"), "Org/Half", "not downloaded", "dflash pull")

    # The Hub unreachable: huggingface_hub falls back to the partial snapshot, which pull does not call done.
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **kw: str(partial))
    assert_one_line_error(cli("pull", "half"), "Org/Half", "incomplete", shard, "again")


def test_pull_offline_is_one_error_line(cli):
    res = cli("pull", "qwen3-4b")
    assert_one_line_error(res, "Qwen/Qwen3-4B", "HF_HUB_OFFLINE")
    assert "dflash pull" not in res.err and "--model" not in res.err
    demo = cli("pull")  # the default is the embedded demo: nothing to download
    assert demo.code == 0 and demo.out.count("local folder") == 4  # target, dflash and dflash2 (one folder), eagle3
    assert_one_line_error(cli("pull", "Org/Model"), "Org/Model")


@pytest.fixture
def fake_download(tmp_path, monkeypatch):
    """Online, with huggingface_hub's snapshot_download replaced by a recorder that writes a config.json."""
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    calls = []

    def snapshot_download(repo_id, revision=None, allow_patterns=None, local_files_only=False, **kw):
        assert not local_files_only
        calls.append((repo_id, allow_patterns))
        out = tmp_path / "downloads" / repo_id
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text("{}" * 100)
        if "legacy" not in repo_id and allow_patterns != ["pytorch_model.bin"]:
            (out / "model.safetensors").write_bytes(b"")
        if allow_patterns == ["pytorch_model.bin"]:
            (out / "pytorch_model.bin").write_bytes(b"")
        return str(out)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_pull_downloads_target_and_drafters_with_only_the_needed_files(fake_download, cli):
    from huggingface_hub.utils import filter_repo_objects

    res = cli("pull", "qwen3-4b")
    assert res.code == 0, res.err
    assert [repo for repo, _ in fake_download] == ["Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16",
                                                   "RedHatAI/Qwen3-4B-speculator.dflash2", "AngelSlim/Qwen3-4B_eagle3"]
    assert "✓" in res.out and "200 B" in res.out

    needed = ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "model.safetensors.index.json", "model-00001-of-00003.safetensors", "model.safetensors"]
    unwanted = ["README.md", ".gitattributes", "original/consolidated.00.pth", "model-q4.gguf", "onnx/model.onnx",
                "optimizer.pt", "training_args.bin", "assets/benchmark.png"]
    for _, patterns in fake_download:
        kept = set(filter_repo_objects(needed + unwanted, allow_patterns=patterns))
        assert kept == set(needed)

    fake_download.clear()
    assert cli("pull", "qwen3-8b", "--no-drafters").code == 0
    assert [repo for repo, _ in fake_download] == ["Qwen/Qwen3-8B"]


def test_pytorch_bin_is_fetched_only_when_a_repo_has_no_safetensors(fake_download):
    from dflash_cli import hub

    hub.download("Org/legacy-eagle3", progress=False)
    assert fake_download[-1] == ("Org/legacy-eagle3", ["pytorch_model.bin"])
    fake_download.clear()
    hub.download("Org/modern", progress=False)
    assert len(fake_download) == 1 and "pytorch_model.bin" not in fake_download[0][1]


def test_a_repo_without_weights_dflash_reads_says_the_repo_may_have_none(fake_download, monkeypatch):
    """A repo with neither safetensors nor pytorch_model.bin (GGUF only, sharded .bin): the download went through,
    and running it again (the only remedy the error gave, and "no its weights") would fail alike."""
    import huggingface_hub
    from dflash_cli import hub

    recorder = huggingface_hub.snapshot_download

    def config_only(repo_id, **kw):
        folder = Path(recorder(repo_id, **kw))
        for f in folder.iterdir():
            if f.name != "config.json":
                f.unlink()
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", config_only)
    with pytest.raises(DflashError) as err:
        hub.download("Org/gguf-only", progress=False)
    assert "no weights (*.safetensors or pytorch_model.bin)" in str(err.value)
    assert "the repo itself has none" in str(err.value)


def test_pull_skips_local_entries(tmp_path, monkeypatch, tiny_model, fake_download, cli):
    registry(tmp_path, monkeypatch, f'[models.t]\ntarget = "{tiny_model}"\ndrafters = {{ dflash = "Org/D" }}\n')
    res = cli("pull", "t")
    assert res.code == 0, res.err
    assert "local folder" in res.out
    assert [repo for repo, _ in fake_download] == ["Org/D"]


def test_pull_goes_on_past_a_drafter_that_fails(fake_download, monkeypatch, cli):
    """A drafter that fails (its repo gone, gated, the connection lost) does not keep the drafters after it from
    downloading: one error line at the end names it; a path is never broken across lines in piped output."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    recorder = huggingface_hub.snapshot_download

    def dflash2_gone(repo_id, **kw):
        if "dflash2" in repo_id:
            raise LocalEntryNotFoundError("connection reset")
        return recorder(repo_id, **kw)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", dflash2_gone)
    res = cli("pull", "qwen3-4b")
    assert_one_line_error(res, "could not download dflash2 (RedHatAI/Qwen3-4B-speculator.dflash2)")
    assert [repo for repo, _ in fake_download] == ["Qwen/Qwen3-4B", "z-lab/Qwen3-4B-DFlash-b16",
                                                   "AngelSlim/Qwen3-4B_eagle3"]
    assert "✗ cannot reach the Hub to download RedHatAI/Qwen3-4B-speculator.dflash2" in res.out
    assert res.out.count("✓ ") == 3 and all(line.endswith(" B)") for line in res.out.splitlines() if "✓" in line)


def test_pull_offline_of_what_is_downloaded_is_done(hub_cache, tiny_model, tmp_path, monkeypatch, cli):
    snap = fake_cached(hub_cache, "Org/Tiny", tiny_model)
    registry(tmp_path, monkeypatch, '[models.t]\ntarget = "Org/Tiny"\ndrafters = { dflash = "Org/D" }\n')
    res = cli("pull", "t", "--no-drafters")
    assert res.code == 0, res.err
    assert f"✓ {snap.resolve()}" in res.out
    res = cli("pull", "t")
    assert_one_line_error(res, "could not download dflash (Org/D)")
    assert "✗ cannot download Org/D: HF_HUB_OFFLINE is set" in res.out


def test_pull_interrupted_keeps_what_it_downloaded_and_says_how_to_resume(fake_download, monkeypatch, cli):
    import huggingface_hub

    recorder = huggingface_hub.snapshot_download

    def ctrl_c_in_the_second(repo_id, **kw):
        if len(fake_download) == 1:
            raise KeyboardInterrupt
        return recorder(repo_id, **kw)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", ctrl_c_in_the_second)
    res = cli("pull", "qwen3-4b")
    assert res.code == 130
    assert res.err.strip() == ("interrupted: the files downloaded so far are kept, and `dflash pull qwen3-4b` "
                               "downloads the rest")
    assert res.out.count("✓") == 1 and "z-lab/Qwen3-4B-DFlash-b16" in res.out


def test_ctrl_c_during_a_download_stops_at_once(hub_cache, monkeypatch, capfd):
    """huggingface_hub's worker threads would finish the files they are on (a model's shards: the whole download)
    before a Ctrl-C ends the process: it ends at once, with the finished files kept and this download's partial
    ones deleted (another download's, and a resumable <etag>.incomplete, stay)."""
    import signal

    import huggingface_hub
    from dflash_cli import hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    blobs = hub_cache / "models--Org--Big" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "aa11.0123abcd.incomplete").write_bytes(b"another download's")
    (blobs / "bb22.incomplete").write_bytes(b"resumable")

    def download_then_ctrl_c(repo_id, **kw):
        (blobs / "cc33").write_bytes(b"a finished file")
        (blobs / "dd44.89abcdef.incomplete").write_bytes(b"half a shard")
        signal.raise_signal(signal.SIGINT)
        raise AssertionError("the download went on after Ctrl-C")

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download_then_ctrl_c)
    monkeypatch.setattr(os, "_exit", exit_now)
    with pytest.raises(SystemExit) as stopped:
        hub.download("Org/Big", progress=False, again="`dflash pull big`")
    assert stopped.value.code == 130
    assert sorted(f.name for f in blobs.iterdir()) == ["aa11.0123abcd.incomplete", "bb22.incomplete", "cc33"]
    assert "the files downloaded so far are kept, and `dflash pull big` downloads the rest" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_during_a_download_shows_the_cursor_again(monkeypatch, capfd):
    """generate, chat and bench download on first use under a status spinner (rich's Live), which hid the cursor:
    ending at once skips the spinner's exit, so the handler shows the cursor on the terminal itself."""
    import signal

    import huggingface_hub
    from dflash_cli import hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.setattr(os, "isatty", lambda fd: fd == 2)  # stderr a terminal (capfd makes it a file)

    def ctrl_c(repo_id, **kw):
        signal.raise_signal(signal.SIGINT)

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", ctrl_c)
    monkeypatch.setattr(os, "_exit", exit_now)
    with pytest.raises(SystemExit):
        hub.download("Org/Big", progress=False)
    assert capfd.readouterr().err.startswith("\x1b[?25h\ninterrupted: ")


def test_hub_unreachable_is_one_error_line(monkeypatch, cli):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.delenv("HF_HUB_OFFLINE")

    def unreachable(*args, **kwargs):
        raise LocalEntryNotFoundError("connection error and no cached snapshot")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    # Each command's own remedy: pull has no --model, and pull itself cannot advise `dflash pull`.
    res = cli("pull", "Org/Model")
    assert_one_line_error(res, "cannot reach the Hub", "Org/Model", "try again")
    assert "dflash pull" not in res.err and "--model" not in res.err and "local folder" not in res.err
    assert_one_line_error(cli("generate", "--model", "Org/Model", "-p", "hi"), "cannot reach the Hub", "local folder")


@pytest.mark.parametrize("error", ["connection lost", "disk full"])
def test_a_download_that_fails_halfway_names_the_repo_and_how_to_go_on(monkeypatch, cli, error):
    """The connection lost mid-file raises the hub's HTTP client's own error (httpx's is no OSError: it was
    `error: ConnectError: ...` naming no repo, and it ended pull before the drafters after it); a full disk, an OSError."""
    import errno

    import huggingface_hub

    class ConnectError(Exception):  # as httpx's: no OSError
        pass

    monkeypatch.delenv("HF_HUB_OFFLINE")
    failure = ConnectError("[Errno 111] Connection refused") if error == "connection lost" else \
        OSError(errno.ENOSPC, "No space left on device")

    def fails(repo_id, **kw):
        raise failure

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fails)
    res = cli("generate", "--model", "Org/Model", "-p", "hi")
    assert_one_line_error(res, "download of Org/Model failed", str(failure.args[-1]),
                          "the files downloaded so far are kept, and the same command downloads the rest")
    res = cli("pull", "Org/Model")
    assert_one_line_error(res, "`dflash pull Org/Model` downloads the rest")


def test_a_snapshot_the_hub_found_complete_is_found_again_without_asking_it(hub_cache, tiny_model, monkeypatch):
    import huggingface_hub
    from dflash_cli import hub

    asked = []
    real = huggingface_hub.snapshot_download

    def recorded(repo_id, **kw):
        asked.append(repo_id)
        return real(repo_id, **kw)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", recorded)
    snap = fake_cached(hub_cache, "Org/Tiny", tiny_model).resolve()
    assert hub.cached_snapshot("Org/Tiny") == snap and asked == ["Org/Tiny"]
    assert hub.cached_snapshot("Org/Tiny") == snap and asked == ["Org/Tiny"]  # from the record
    assert hub.cached_snapshot("Org/Tiny", snap.name) == snap and asked == ["Org/Tiny"]  # the commit itself
    assert hub.size_on_disk(snap) == sum(f.stat().st_size for f in tiny_model.iterdir())  # the record is not in it

    # What the hub judges again: a file gone since (an incomplete snapshot: its answer), a ref moved, another revision.
    (snap / "tokenizer.json").unlink()
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **kw: asked.append(repo_id) or 1 / 0)
    assert hub.cached_snapshot("Org/Tiny") is None and len(asked) == 2
    (snap.parents[1] / "refs" / "main").write_text("f" * 40)
    assert hub.cached_snapshot("Org/Tiny") is None and len(asked) == 3
    assert hub.cached_snapshot("Org/Tiny", "v2") is None and len(asked) == 4


def test_generation_keys_for_an_external_engine_load_and_are_passed_on(tmp_path, monkeypatch):
    """The penalties and min_p of a model card: the built-in engine samples with temperature, top_p and top_k only,
    serve's external engines take them all (a user registry with Qwen3.5's presence_penalty loaded before)."""
    from dflash_cli.serve.external import launch_command

    registry(tmp_path, monkeypatch, '[models.a]\ntarget = "Org/A"\ncontext = 4096\n'
             'generation = { temperature = 0.7, presence_penalty = 1.5, min_p = 0.0 }\n')
    entry = Registry.load().entries["a"]
    argv = launch_command("vllm", entry, draft="none", tensor_parallel=1, host="127.0.0.1", port=8000, api_key=None)
    override = json.loads(argv[argv.index("--override-generation-config") + 1])
    assert override == {"temperature": 0.7, "presence_penalty": 1.5, "min_p": 0.0}


def test_ctrl_c_during_a_download_chat_asked_for_returns_to_it(hub_cache, monkeypatch):
    """Within hub.keep_process_on_ctrl_c (chat's commands: /set draft downloads a drafter) a Ctrl-C is a
    KeyboardInterrupt for the caller, not the end of the process (and of the conversation)."""
    import signal

    import huggingface_hub
    from dflash_cli import hub

    monkeypatch.delenv("HF_HUB_OFFLINE")

    def ctrl_c(repo_id, **kw):
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", ctrl_c)
    monkeypatch.setattr(os, "_exit", lambda code: pytest.fail("the process was ended"))
    with pytest.raises(KeyboardInterrupt), hub.keep_process_on_ctrl_c():
        hub.download("Org/Big", progress=False)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
