"""The text of a generation as it grows: stop sequences cut it, and streaming holds back what might be one."""

from __future__ import annotations


class StopText:
    """Feed it the visible token ids; it says which new text is safe to send and whether a stop sequence appeared.

    The whole visible text is decoded again at each step (a few thousand tokens at most), so the text sent is
    exactly `decode(tokens)` cut at the first stop sequence, never a piece decoded differently in isolation."""

    def __init__(self, decode, stops: list[str]):
        self.decode = decode
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0
        self.hit = False
        self.used = 0  # after a hit: how many of the ids it took to write the stop sequence

    def push(self, ids: list[int]) -> str:
        """Add tokens; returns the new text that is certain (no half character, no possible stop prefix)."""
        if self.hit:
            return ""
        self.ids.extend(ids)
        text = self.decode(self.ids)
        cut = self._first_stop(text)
        if cut is not None:
            self.hit = True
            self.text = text[:cut]
            # A speculative step commits several tokens at once: those after the stop sequence are no answer.
            n = len(self.ids) - len(ids) + 1
            while n < len(self.ids) and self._first_stop(self.decode(self.ids[:n])) is None:
                n += 1
            self.used = n
            return self._take(len(self.text))
        self.text = text
        safe = len(text.rstrip("\ufffd")) - self.hold  # a broken UTF-8 tail may still complete
        return self._take(max(safe, self.sent))

    def tokens_through(self, tokens: list[int], stop_ids) -> list[int]:
        """A generation's ids (stop tokens included) up to the one that completed the stop sequence; all of them
        where none appeared (`used` counts visible ids, the stop tokens left out)."""
        if not self.hit:
            return tokens
        seen = 0
        for i, t in enumerate(tokens):
            seen += t not in stop_ids
            if seen == self.used:
                return tokens[: i + 1]
        return tokens

    def finish(self) -> str:
        """Whatever was held back, once the generation has ended."""
        return self._take(len(self.text))

    def _first_stop(self, text: str) -> int | None:
        hits = [i for i in (text.find(s, max(0, self.sent - len(s))) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def _take(self, upto: int) -> str:
        piece = self.text[self.sent:upto]
        self.sent = max(self.sent, upto)
        return piece
