"""Checkpoint files through huggingface_hub: the local cache first, a download when allowed."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from . import tuning
from .errors import DflashError

# Only what the engine reads: never optimizer states, .bin duplicates or images.
ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "*.safetensors",
    "model.safetensors.index.json",
]
LEGACY_WEIGHTS = "pytorch_model.bin"  # fetched only when a repo has no safetensors (some EAGLE-3 exports)


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def cached_snapshot(repo: str, revision: str | None = None) -> Path | None:
    """The complete cached snapshot of `repo`, or None when it is not (fully) downloaded. huggingface_hub decides; a
    snapshot it found complete is found again without importing its API (about 0.1 s of every start-up), from the
    files the snapshot had then (`_confirmed`)."""
    found = _confirmed(repo, revision)
    if found is not None:
        return found
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo, revision=revision, allow_patterns=ALLOW_PATTERNS, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, FileNotFoundError, OSError):
        return None
    except Exception:  # a missing file inside a partial snapshot raises other hub errors
        return None
    if missing(path):
        return None
    _confirm(path)
    return path


def missing(snapshot: Path) -> str | None:
    """What a snapshot lacks to run (its config, the shards its index lists, any weights), or None. huggingface_hub
    checks a cached snapshot only against the file list it saved while downloading, which older versions do not save
    (nor do single-file downloads): a pull interrupted there leaves a snapshot the hub returns as whole."""
    if not (snapshot / "config.json").is_file():
        return "config.json"
    try:
        shards = set(json.loads((snapshot / "model.safetensors.index.json").read_text())["weight_map"].values())
    except FileNotFoundError:
        shards = None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # a corrupt index: the loader says so, with its path
    if shards is not None:
        absent = sorted(s for s in shards if not (snapshot / s).is_file())
        return ", ".join(absent[:2]) + (f" and {len(absent) - 2} more" if len(absent) > 2 else "") if absent else None
    if any(snapshot.glob("*.safetensors")) or (snapshot / LEGACY_WEIGHTS).is_file():
        return None
    return "weights (*.safetensors or pytorch_model.bin)"


def _marker(snapshot: Path) -> Path:
    """Where `_confirm` lists the files of `snapshot`: beside the repo's refs/ and snapshots/, as the hub's own
    .no_exist/ is (deleted with the repo, passed over by its cache scan), keyed by the patterns and the hub version
    that judged it."""
    import huggingface_hub

    key = hashlib.sha256("\n".join([huggingface_hub.__version__, *ALLOW_PATTERNS]).encode()).hexdigest()[:8]
    return snapshot.parents[1] / ".dflash" / f"{snapshot.name}-{key}"


def _confirm(snapshot: Path) -> None:
    """Record the files of a snapshot huggingface_hub found complete."""
    try:
        files = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
        marker = _marker(snapshot)
        marker.parent.mkdir(exist_ok=True)
        partial = marker.with_name(f"{marker.name}.{os.getpid()}")
        partial.write_text("\n".join(files), encoding="utf-8")
        os.replace(partial, marker)  # whole or absent for a concurrent reader
    except OSError:
        pass  # a read-only cache: huggingface_hub is asked each time


def _confirmed(repo: str, revision: str | None) -> Path | None:
    """The snapshot of `repo` at `revision` that `_confirm` recorded, where `revision` still resolves to it as the hub
    resolves it (a commit, else refs/<revision>), every file it had then is still there and none it needs is missing
    (an earlier dflash recorded partial snapshots); else None."""
    from huggingface_hub import constants  # the cache folder as the hub reads it from the environment (1 ms)

    try:
        storage = Path(constants.HF_HUB_CACHE).expanduser().resolve() / ("models--" + repo.replace("/", "--"))
        revision = revision or "main"
        commit = revision if re.fullmatch(r"[0-9a-f]{40}", revision) else (storage / "refs" / revision).read_text()
        snapshot = storage / "snapshots" / commit
        files = _marker(snapshot).read_text(encoding="utf-8").split("\n")
        return snapshot if all((snapshot / f).is_file() for f in files) and not missing(snapshot) else None
    except Exception:  # no record, or anything unexpected: huggingface_hub decides
        return None


def download(repo: str, revision: str | None = None, progress: bool = True, or_else: str = "",
             again: str = "the same command") -> Path:
    """Download (or resume) the files of `repo` the engine needs; returns the snapshot folder. `or_else`: what else
    the command that asked can do when the Hub cannot be reached (", or use a local folder"); `again`: the command that
    downloads the rest after a Ctrl-C."""
    if offline():
        raise DflashError(f"cannot download {repo}: HF_HUB_OFFLINE is set (unset it to download){or_else}")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    (enable_progress_bars if progress else disable_progress_bars)()
    try:
        with _stop_at_once(repo, again):
            path = Path(snapshot_download(repo, revision=revision, allow_patterns=ALLOW_PATTERNS))
            if not any(path.glob("*.safetensors")):
                path = Path(snapshot_download(repo, revision=revision, allow_patterns=[LEGACY_WEIGHTS]))
    except GatedRepoError:
        raise DflashError(f"{repo} is gated: accept its licence on the Hub and log in (`hf auth login`)") from None
    except RepositoryNotFoundError:
        raise DflashError(f"no such repository on the Hub: {repo}") from None
    except RevisionNotFoundError:
        raise DflashError(f"{repo} has no revision '{revision}'") from None
    except HFValidationError as exc:
        raise DflashError(f"not a valid model reference: {repo} ({str(exc).splitlines()[0]})") from None
    except LocalEntryNotFoundError:
        raise DflashError(f"cannot reach the Hub to download {repo}, and it is not in the cache: check the network "
                          f"connection and try again{or_else}") from None
    except OSError as exc:  # a full disk, a read-only cache
        raise DflashError(f"download of {repo} failed: {exc}; {kept(again)}") from None
    except Exception as exc:  # the connection lost mid-file: the HTTP client's own errors (httpx's are no OSError)
        if tuning.KNOBS.debug:
            raise
        raise DflashError(f"download of {repo} failed ({type(exc).__name__}: {exc}); "
                          f"{kept(again)}") from None
    lacking = missing(path)
    if lacking:  # the Hub unreachable and an older partial download in the cache, or a repo without such weights
        raise DflashError(f"{repo} is incomplete in {path}: no {lacking} (if the Hub was unreachable, run the "
                          f"download again once it is; if not, the repo itself has none)")
    return path


def kept(again: str) -> str:
    """What a download that stopped halfway left: finished files are renamed whole into blobs/, then linked."""
    return f"the files downloaded so far are kept, and {again} downloads the rest"


def interrupted(again: str) -> str:
    return f"\ninterrupted: {kept(again)}"


_keep_process = threading.local()  # set by keep_process_on_ctrl_c: a Ctrl-C in a download returns to the caller


@contextmanager
def keep_process_on_ctrl_c():
    """Within: a Ctrl-C during a download raises KeyboardInterrupt to the caller once the files in progress are done,
    instead of ending the process (chat's /set draft: the conversation outlives a download the user stops)."""
    _keep_process.on = True
    try:
        yield
    finally:
        _keep_process.on = False


@contextmanager
def _stop_at_once(repo: str, again: str):
    """Within: Ctrl-C ends the process at once. huggingface_hub's worker threads would otherwise finish the files they
    are on first (all of a model's shards at once: the whole download, without a word). Finished files are in place
    (each renamed whole into blobs/, then linked); the partial ones this download wrote are deleted, as the hub does
    after a failure (their names, unique to a process, cannot be resumed), not left to fill the disk."""
    if threading.current_thread() is not threading.main_thread() or getattr(_keep_process, "on", False):
        yield
        return
    from huggingface_hub import constants

    blobs = Path(constants.HF_HUB_CACHE).expanduser() / ("models--" + repo.replace("/", "--")) / "blobs"
    before = set(blobs.glob("*.incomplete"))

    def stop(signum, frame):
        for f in set(blobs.glob("*.incomplete")) - before:
            if re.fullmatch(r"\w+\.[0-9a-f]{8}\.incomplete", f.name):  # a hub's that resumes keeps <etag>.incomplete
                f.unlink(missing_ok=True)
        sys.stdout.flush()
        _show_cursor()
        os.write(2, (interrupted(again) + "\n").encode())
        os._exit(130)

    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _show_cursor() -> None:
    """The cursor shown again on a terminal: the status spinner around generate's, chat's and bench's loading (rich's
    Live, within which they download on first use) hid it, and os._exit skips its exit, which would show it."""
    if os.environ.get("TERM", "").lower() in ("dumb", "unknown"):  # rich hides nothing there
        return
    for fd in (1, 2):
        if os.isatty(fd):
            os.write(fd, b"\x1b[?25h")


def size_on_disk(path: Path) -> int:
    """Bytes the snapshot's files take (cache entries are symlinks into blobs)."""
    total = 0
    for f in Path(path).rglob("*"):
        if f.is_file():
            total += f.resolve().stat().st_size
    return total
