"""Pieces every generating command shares: prompt input, sampling defaults, sessions."""

from __future__ import annotations

import sys
from pathlib import Path

from ..runtime.sampling import SamplingParams
from ..errors import DflashError
from ..runtime.bundle import Bundle

DEFAULT_MAX_TOKENS = 512


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    if prompt is not None and prompt_file is not None:
        raise DflashError("give either --prompt or --prompt-file, not both")
    if prompt is not None:
        return prompt
    if prompt_file is not None:
        try:
            return Path(prompt_file).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DflashError(f"cannot read prompt file {prompt_file}: {getattr(exc, 'strerror', None) or exc}") from None
    if not sys.stdin.isatty():
        text = sys.stdin.read()
        if text:
            return text
    raise DflashError("no prompt: use --prompt TEXT, --prompt-file FILE or pipe text on stdin")


def sampling_params(bundle: Bundle, temperature, top_p, top_k, seed) -> SamplingParams:
    """Flags first, then the model's recommended defaults; greedy when nothing says otherwise."""
    d = bundle.sampling_defaults()
    temperature = d.get("temperature", 0.0) if temperature is None else temperature
    top_p = d.get("top_p", 1.0) if top_p is None else top_p
    top_k = d.get("top_k", 0) if top_k is None else top_k
    return SamplingParams(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k), seed=seed)

