"""Evaluation prompts by category, cut from the held-out files (never trained on, never distilled from:
the distillation prompts are windows of the training files or written by the target itself).

The held-out files are split in two: even-numbered ones give the prompts that choose the block size,
odd-numbered ones the prompts of the final evaluation, so the choice is not scored on its own test."""

from __future__ import annotations

import re

# Where a prompt ends, as a pattern whose match end is the cut: what the drafter then has to write.
CATEGORIES = {
    "function body": re.compile(r"^[ \t]*def [^\n]*:[ \t]*\n", re.M),  # after a def line
    "class body": re.compile(r"^[ \t]*class [^\n]*:[ \t]*\n", re.M),
    "docstring": re.compile(r'^[ \t]*"""', re.M),  # inside an opening docstring
    "statement": re.compile(r"^[ \t]+(?=[a-z_])", re.M),  # an indented line, after its indentation
    "file start": None,  # the file's first tokens, continued
}
SELECT, TEST = 0, 1  # which half of the held-out files


def category_prompts(texts: list[str], tok, per_category: int, length: int, half: int) -> list[tuple[str, list[int]]]:
    """per_category prompts of each category, at most `length` tokens each (the text before the cut), taken
    evenly over the matches in the chosen half of the held-out files; (category, ids) pairs."""
    files = [t for i, t in enumerate(texts) if i % 2 == half] or texts
    out = []
    for name, pattern in CATEGORIES.items():
        cuts = []
        for f, text in enumerate(files):
            if pattern is None:
                cuts.append((f, None))
            else:
                cuts.extend((f, m.end()) for m in pattern.finditer(text) if m.end() > 200 and m.end() < len(text) - 200)
        if not cuts:
            continue
        step = len(cuts) / per_category
        for k in range(min(per_category, len(cuts))):
            f, end = cuts[int(k * step)]
            text = files[f]
            if end is None:
                ids = tok.encode(text[: 16 * length], add_special_tokens=False).ids[:length]
            else:
                ids = tok.encode(text[max(0, end - 16 * length) : end], add_special_tokens=False).ids[-length:]
            if len(ids) >= 4:
                out.append((name, ids))
    return out
