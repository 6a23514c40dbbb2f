"""The model registry (`models.toml`) and how a model argument resolves to files on disk."""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from . import hub, tuning
from .errors import DflashError

PACKAGED = Path(__file__).with_name("models.toml")
PACKAGE_PREFIX = "pkg:"  # a folder shipped inside the package (the embedded demo)
DRAFT_KINDS = ("dflash", "dflash2", "eagle3", "mtp")  # mtp: the target's own multi-token-prediction layer
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_like_repo_id(ref: str) -> bool:
    """owner/name, as the Hub spells repo ids."""
    return bool(_REPO_ID.match(ref))


def check_not_a_path(ref: str, flag: str) -> None:
    """A checkpoint argument that is no folder: a file (a .safetensors, say) or a path that is not there is an error
    saying so, not a Hub repo id that cannot be reached."""
    if Path(ref).expanduser().exists():
        raise DflashError(f"{flag} {ref} is a file: give the folder that holds the checkpoint (config.json, weights)")
    if ref.startswith((".", "/", "~")) or ref.endswith("/"):  # never a repo id
        raise DflashError(f"{flag} {ref}: no such folder")


def draft_kind(value: str) -> str | None:
    """A --draft value as "none" or a drafter kind whatever its case (EAGLE3 is eagle3); None for anything else."""
    low = value.strip().lower()
    return low if low in ("none", *DRAFT_KINDS) else None


@dataclass(frozen=True)
class Source:
    """A checkpoint: a local folder, or a Hub repo id (+ revision)."""

    ref: str
    revision: str | None = None
    label: str | None = None  # how listings name it (a `pkg:` path rather than where the package lives)
    pull_as: str | None = None  # what `dflash pull` takes to fetch it: a target's registry entry (with its drafters)

    @property
    def name(self) -> str:
        return self.label or self.ref

    @property
    def is_local(self) -> bool:
        return Path(self.ref).expanduser().is_dir()

    def cached(self) -> Path | None:
        if self.is_local:
            return Path(self.ref).expanduser()
        return hub.cached_snapshot(self.ref, self.revision)

    def path(self, download: bool = True) -> Path:
        """The folder with the checkpoint, downloading it if needed and allowed."""
        found = self.cached()
        if found is not None:
            return found
        if not looks_like_repo_id(self.ref):
            raise DflashError(f"no such model folder, registry entry or Hub repo id: {self.ref}")
        if not download or hub.offline():
            raise DflashError(
                f"{self.ref} is not downloaded (offline): run `dflash pull {self.pull_as or self.ref}` with network access"
            )
        return hub.download(self.ref, self.revision, or_else=", or use a local folder")


@dataclass(frozen=True)
class ModelEntry:
    name: str
    target: Source
    drafters: dict[str, Source] = field(default_factory=dict)
    context: int | None = None
    draft_len: int | None = None
    generation: dict = field(default_factory=dict)  # temperature, top_p, top_k
    description: str = ""
    bench_prompts: Path | None = None  # `dflash bench`'s default prompt set for this model (JSONL)


@dataclass(frozen=True)
class Registry:
    default: str
    entries: dict[str, ModelEntry]
    path: Path

    @classmethod
    def load(cls, path: Path | None = None) -> "Registry":
        path = Path(path or tuning.KNOBS.registry or PACKAGED)
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DflashError(f"model registry not found: {path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise DflashError(f"model registry {path} is not valid TOML: {exc}") from None
        models = raw.get("models", {})
        if not isinstance(models, dict):
            raise DflashError(f"registry {path}: 'models' must be a table of [models.NAME] entries")
        entries = {}
        for name, spec in models.items():
            entries[name] = _entry(name, spec, path)
        default = raw.get("default", "")
        if default and default not in entries:
            raise DflashError(f"registry {path}: default '{default}' is not an entry")
        return cls(default=default, entries=entries, path=path)

    def resolve(self, model: str | None) -> ModelEntry:
        """Registry name, then local folder, then Hub repo id."""
        model = model or self.default
        if not model:
            raise DflashError("no --model given and the registry has no default")
        if model in self.entries:
            return self.entries[model]
        if Path(model).expanduser().is_dir():
            folder = Path(model).expanduser()
            return trained_run(folder) or ModelEntry(name=folder.name, target=Source(str(folder)))
        check_not_a_path(model, "--model")
        if looks_like_repo_id(model):
            return ModelEntry(name=model, target=Source(model))
        known = ", ".join(sorted(self.entries)) or "none"
        raise DflashError(f"unknown model '{model}': not a registry entry ({known}), folder or Hub repo id")


def trained_run(folder: Path) -> ModelEntry | None:
    """A `dflash train` output folder (target/, dflash/, dflash2/, eagle3/): its target with the
    drafters trained so far, the EAGLE-3 chain length it was evaluated at, and the demo's Python bench prompts."""
    if (folder / "config.json").is_file() or not ((folder / "target").is_dir() or (folder / "training_info.json").is_file()):
        return None
    if not (folder / "target" / "config.json").is_file():
        raise DflashError(f"{folder} is a dflash train folder without a trained target yet: resume its training "
                          f"(dflash train {folder} ...)")
    try:
        preset = json.loads((folder / "training_info.json").read_text()).get("preset", {})
    except (OSError, ValueError, AttributeError):
        preset = {}
    preset = preset if isinstance(preset, dict) else {}
    drafters = {k: Source(str(folder / k)) for k in ("dflash", "dflash2", "eagle3")
                if (folder / k / "model.safetensors").is_file()}
    return ModelEntry(name=folder.name, target=Source(str(folder / "target")), drafters=drafters,
                      draft_len=preset.get("draft_len") if isinstance(preset.get("draft_len"), int) else None,
                      bench_prompts=PACKAGED.with_name("bench") / "python.jsonl")


SAMPLED_KEYS = ("temperature", "top_p", "top_k")  # what the built-in engine samples with
# serve hands all of them to an external engine (vLLM, SGLang), which takes the penalties and min_p the model cards
# give (Qwen3.5's presence_penalty).
GENERATION_KEYS = SAMPLED_KEYS + ("min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


def _check_values(name: str, spec: dict, path: Path) -> None:
    """A value of the wrong type is one error naming its key (it was a TypeError where the value was first used, or
    the value was passed on, a string context compared with numbers)."""
    def bad(what: str):
        raise DflashError(f"registry {path}: entry '{name}': {what}")

    for key in ("context", "draft_len"):
        value = spec.get(key)
        if value is not None and (type(value) is not int or value < 1):
            bad(f"'{key}' must be a whole number >= 1 (got {value!r})")
    for key in ("description", "revision", "bench_prompts"):
        if key in spec and not isinstance(spec[key], str):
            bad(f"'{key}' must be a string (got {spec[key]!r})")
    if not isinstance(spec.get("drafters", {}), dict):
        bad("'drafters' must be a table: { dflash = \"owner/name\", ... }")
    generation = spec.get("generation", {})
    if not isinstance(generation, dict):
        bad(f"'generation' must be a table of {', '.join(GENERATION_KEYS)}")
    for key, value in generation.items():
        if key not in GENERATION_KEYS:
            bad(f"unknown 'generation' key '{key}' (known: {', '.join(GENERATION_KEYS)})")
        if type(value) not in (int, float):
            bad(f"'generation' {key} must be a number (got {value!r})")


def _entry(name: str, spec: dict, path: Path) -> ModelEntry:
    if not isinstance(spec, dict) or not isinstance(spec.get("target"), str):
        raise DflashError(f"registry {path}: entry '{name}' needs a 'target' (Hub repo id or folder)")
    _check_values(name, spec, path)
    base = path.parent

    def src(ref: str, revision=None, pull_as=None) -> Source:
        # Relative local paths in the registry are relative to the registry file.
        if ref.startswith(PACKAGE_PREFIX):
            return Source(str(Path(__file__).parent / ref[len(PACKAGE_PREFIX) :]), label=ref)
        if ref.startswith((".", "/")):
            ref = str((base / ref).resolve())
        return Source(ref, revision, pull_as=pull_as)

    def prompts(ref: str) -> Path:
        # A file, never a repo id: relative to the registry file with or without a leading ./ (it was the cwd's)
        return Path(src(ref).ref) if ref.startswith(PACKAGE_PREFIX) else (base / Path(ref).expanduser()).resolve()

    drafters = {}
    for kind, d in spec.get("drafters", {}).items():
        if kind not in DRAFT_KINDS:
            raise DflashError(f"registry {path}: entry '{name}' has unknown drafter kind '{kind}'")
        ref = d.get("repo") if isinstance(d, dict) else d
        if not isinstance(ref, str):
            raise DflashError(f"registry {path}: entry '{name}' drafter '{kind}' needs a repo id or folder")
        revision = d.get("revision") if isinstance(d, dict) else None
        if revision is not None and not isinstance(revision, str):
            raise DflashError(f"registry {path}: entry '{name}' drafter '{kind}': 'revision' must be a string")
        drafters[kind] = src(ref, revision)
    return ModelEntry(
        name=name,
        target=src(spec["target"], spec.get("revision"), pull_as=name),
        drafters=drafters,
        context=spec.get("context"),
        draft_len=spec.get("draft_len"),
        generation=dict(spec.get("generation", {})),
        description=spec.get("description", ""),
        bench_prompts=prompts(spec["bench_prompts"]) if "bench_prompts" in spec else None,
    )
