"""A chat's messages and the tokens each new turn adds to a cache that already holds the rest."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DflashError
from .loading.tokenizer import ChatTokenizer

_SENTINEL = "\x00DFLASH-SENTINEL\x00"
# A leading thinking block: "<think>...</think>" as Qwen3 writes it, or "...</think>" where the template opened the
# block itself (Qwen3.5's generation prompt ends in "<think>\n" when thinking is on).
_THINK = re.compile(r"^\s*(?:<think>)?(?:(?!<think>).)*?</think>\s*", re.S)


@dataclass
class Conversation:
    tokenizer: ChatTokenizer
    system: str | None = None
    think: bool | None = None
    messages: list[dict] = field(default_factory=list)  # user/assistant turns, thinking removed

    def all_messages(self, extra: list[dict] = (), turns: list[dict] | None = None) -> list[dict]:
        """The system prompt, then `turns` (default: every message), then `extra`."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + (self.messages if turns is None else turns) + list(extra)

    def prompt_ids(self, user_text: str, pending: list[int], fresh: bool) -> tuple[list[int], bool]:
        """Token ids to feed (after `pending`) for a new user turn.

        Returns (ids, reset): with `reset` the caller must clear the cache and
        feed `ids` from position 0 (first turn, or a template whose turns do not
        simply append).
        """
        tok = self.tokenizer
        new = {"role": "user", "content": user_text}
        full = tok.render_chat(self.all_messages([new]), think=self.think)
        if fresh or not self.messages:
            return tok.encode(full), True
        turn = tok.render_chat([new], think=self.think)
        if not full.endswith(turn):
            return tok.encode(full), True
        closing = self._closing()
        eot = tok.end_of_turn
        if eot and closing.startswith(eot) and pending and tok.decode(pending[-1:]) == eot:
            closing = closing[len(eot) :]  # the answer's own stop token already is the end of turn
        return tok.encode(closing + turn), False

    def _closing(self) -> str:
        """What the template writes after an assistant message's content (e.g. '<|im_end|>\\n')."""
        text = self.tokenizer.render_chat(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}],
            add_generation_prompt=False,
            think=self.think,
        )
        return text.split(_SENTINEL, 1)[1] if _SENTINEL in text else ""

    def add_exchange(self, user_text: str, answer: str) -> None:
        self.messages.append({"role": "user", "content": user_text})
        # As written, less a thinking block: a code answer's leading newline and indent are part of it.
        self.messages.append({"role": "assistant", "content": _THINK.sub("", answer)})

    def save(self, path: Path, model: str) -> None:
        data = {"model": model, "system": self.system, "messages": self.all_messages()}
        try:
            Path(path).expanduser().write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        except OSError as exc:
            raise DflashError(f"cannot save to {path}: {exc.strerror}") from None
