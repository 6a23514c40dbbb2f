"""Tokenizer, chat template and stop ids of a checkpoint, plus streaming detokenization."""

from __future__ import annotations

import json
from pathlib import Path

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from ..errors import DflashError
from .config import read_json

END_OF_TURN_CANDIDATES = ("<|im_end|>", "<|eot_id|>", "<|end|>")


def _raise(message: str):
    raise TemplateError(message)


class ChatTokenizer:
    def __init__(self, model_dir: Path):
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise DflashError(f"tokenizer.json not found in {model_dir}")
        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise DflashError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None
        cfg_path = model_dir / "tokenizer_config.json"
        self.config = read_json(cfg_path, "tokenizer config") if cfg_path.is_file() else {}
        self.template_text = self._find_template(model_dir)
        self.end_of_turn = next((t for t in END_OF_TURN_CANDIDATES if self.tok.token_to_id(t) is not None), None)
        self.stop_ids = self._stop_ids(model_dir)
        self._template = None

    def _find_template(self, model_dir: Path) -> str | None:
        jinja_file = model_dir / "chat_template.jinja"
        if jinja_file.is_file():
            return jinja_file.read_text(encoding="utf-8")
        tpl = self.config.get("chat_template")
        if isinstance(tpl, list):  # named templates: take the default one
            tpl = next((t["template"] for t in tpl if t.get("name") == "default"), None)
        return tpl

    def _token_id(self, value) -> int | None:
        if isinstance(value, dict):
            value = value.get("content")
        return self.tok.token_to_id(value) if isinstance(value, str) else None

    def _stop_ids(self, model_dir: Path) -> list[int]:
        ids: list[int] = []
        gen = model_dir / "generation_config.json"
        sources = [read_json(gen, "generation config").get("eos_token_id")] if gen.is_file() else []
        cfg = model_dir / "config.json"
        if cfg.is_file():
            sources.append(read_json(cfg, "model config").get("eos_token_id"))
        for src in sources:
            ids.extend(src if isinstance(src, list) else [src] if isinstance(src, int) else [])
        for extra in (self._token_id(self.config.get("eos_token")), self._token_id(self.end_of_turn)):
            if extra is not None:
                ids.append(extra)
        return sorted(set(ids))

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Tokenize as is: special-token strings map to their ids, nothing is added."""
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        return self.tok.decode(ids, skip_special_tokens=skip_special)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, think: bool | None = None) -> str:
        if not self.template_text:
            raise DflashError("this tokenizer has no chat template: use --raw to send the prompt as is")
        if self._template is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = _raise
            env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, indent=indent, ensure_ascii=False)
            try:
                self._template = env.from_string(self.template_text)
            except TemplateError as exc:
                raise DflashError(f"the chat template does not parse: {exc}") from None
        extra = {} if think is None else {"enable_thinking": think}
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.config.get("bos_token") or "",
                eos_token=self.config.get("eos_token") or "",
                **extra,
            )
        except TemplateError as exc:
            raise DflashError(f"chat template failed: {exc}") from None


class StreamDecoder:
    """Turns a growing token list into text pieces, never emitting half a UTF-8 character.

    Decodes a short window of recent tokens twice (with and without the new ones)
    and emits the difference once it no longer ends in a replacement character.
    """

    def __init__(self, tokenizer: ChatTokenizer, skip_special: bool = False):
        self.tokenizer, self.skip_special = tokenizer, skip_special
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        dec = self.tokenizer.decode
        prefix = dec(self.ids[self.prefix_offset : self.read_offset], self.skip_special)
        full = dec(self.ids[self.prefix_offset :], self.skip_special)
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix) :]

    def flush(self) -> str:
        """Whatever is held back at the end (a genuinely broken sequence shows as U+FFFD)."""
        dec = self.tokenizer.decode
        prefix = dec(self.ids[self.prefix_offset : self.read_offset], self.skip_special)
        full = dec(self.ids[self.prefix_offset :], self.skip_special)
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :] if len(full) > len(prefix) else ""
