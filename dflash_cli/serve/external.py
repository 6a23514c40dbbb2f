"""A registry entry as the launch command of another engine: vLLM (`vllm serve`) or SGLang (`sglang.launch_server`).

Both serve the same OpenAI API, so `dflash chat --url` / `dflash generate --url` talk to them as to `dflash serve`.
Flag names follow each engine's documented server arguments (tests/test_serve_external.py lists them)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys

from ..errors import DflashError
from ..loading.config import read_json
from ..registry import ModelEntry, draft_kind

DFLASH_DEFAULT_BLOCK = 16  # a DFlash checkpoint's block_size when its config.json is not on disk (z-lab's -b16)
# Each drafter kind as the engines name it: vLLM's --speculative-config method, SGLang's --speculative-algorithm.
# DFlash 2 runs as DFlash in both, which switch its convolutions and selector on from the checkpoint (vLLM #52816:
# architecture DFlash2DraftModel under method "dflash"; SGLang #35371: the four module sizes in its config).
METHODS = {"dflash": ("dflash", "DFLASH"), "dflash2": ("dflash", "DFLASH"), "eagle3": ("eagle3", "EAGLE3")}


def installed(engine: str) -> bool:
    if engine == "vllm":
        return shutil.which("vllm") is not None
    return importlib.util.find_spec("sglang") is not None


def pick_draft(entry: ModelEntry, draft: str | None) -> str:
    draft = draft or ("dflash" if "dflash" in entry.drafters else "none")
    draft = draft_kind(draft) or draft
    if draft != "none" and draft not in METHODS:
        raise DflashError(f"with --engine vllm or sglang, --draft takes none, dflash, dflash2 or eagle3 (got '{draft}')")
    if draft != "none" and draft not in entry.drafters:
        raise DflashError(f"model '{entry.name}' has no {draft} drafter in the registry")
    return draft


def draft_tokens(entry: ModelEntry, draft: str, draft_len: int | None) -> int:
    """Draft tokens per step: --draft-len, else what our engine would use (DFlash, DFlash 2: the checkpoint's
    block - 1, EAGLE-3: the registry's draft_len)."""
    if draft_len is not None:
        if draft_len < 1:
            raise DflashError(f"--draft-len must be >= 1 (got {draft_len})")
        return draft_len
    if draft == "eagle3":
        return entry.draft_len or 7
    block = DFLASH_DEFAULT_BLOCK
    folder = entry.drafters[draft].cached()
    if folder is not None and (folder / "config.json").is_file():
        raw = read_json(folder / "config.json", "drafter config")  # top level, or z-lab's DFlash 2 dflash_config
        block = int(raw.get("block_size") or (raw.get("dflash_config") or {}).get("block_size") or block)
    return block - 1


def launch_command(engine: str, entry: ModelEntry, *, draft: str | None = None, draft_len: int | None = None,
                   tensor_parallel: int = 1, host: str = "127.0.0.1", port: int = 8000,
                   api_key: str | None = None, context: int | None = None) -> list[str]:
    """context: the longest sequence (default: the registry entry's)."""
    if tensor_parallel < 1:
        raise DflashError(f"--tensor-parallel must be >= 1 (got {tensor_parallel})")
    draft = pick_draft(entry, draft)
    k = draft_tokens(entry, draft, draft_len) if draft != "none" else 0
    target = entry.target.ref
    drafter = entry.drafters[draft].ref if draft != "none" else None
    sampling = json.dumps(entry.generation, sort_keys=True) if entry.generation else None
    context = context or entry.context
    if context is not None and context < 16:
        raise DflashError(f"--context must be >= 16 (got {context})")
    if engine == "vllm":
        argv = ["vllm", "serve", target, "--served-model-name", entry.name]
        if drafter:
            spec = {"method": METHODS[draft][0], "model": drafter, "num_speculative_tokens": k}
            argv += ["--speculative-config", json.dumps(spec)]
        argv += ["--tensor-parallel-size", str(tensor_parallel)]
        if context:
            argv += ["--max-model-len", str(context)]
        if sampling:
            argv += ["--override-generation-config", sampling]
    elif engine == "sglang":
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", target, "--served-model-name", entry.name]
        if drafter:
            argv += ["--speculative-algorithm", METHODS[draft][1],
                     "--speculative-draft-model-path", drafter]
            if draft == "eagle3":  # a chain of k drafts: k steps, one candidate each, k + 1 verified tokens
                argv += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
            argv += ["--speculative-num-draft-tokens", str(k + 1)]  # DFlash: the block, bonus token included
        argv += ["--tp-size", str(tensor_parallel)]
        if context:
            argv += ["--context-length", str(context)]
        if sampling:
            argv += ["--preferred-sampling-params", sampling]
        argv += ["--enable-metrics"]  # /metrics, which `dflash chat --url` reads
    else:
        raise DflashError(f"unknown engine '{engine}' (use vllm or sglang)")
    argv += ["--host", host, "--port", str(port)]
    if api_key:
        argv += ["--api-key", api_key]
    return argv
