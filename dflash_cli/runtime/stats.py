"""Acceptance statistics over decoder steps (what the live footer and --json report)."""

from __future__ import annotations


def acceptance_stats(steps) -> dict:
    """Mean committed tokens per step (tau), histogram of accepted drafts, per-position acceptance."""
    if not steps:
        return {"mean_accepted": 0.0, "accept_hist": [], "accept_by_position": []}
    max_draft = max((len(s.draft) for s in steps), default=0)
    hist = [0] * (max_draft + 1)
    reached = [0] * max_draft  # steps whose draft had position i
    taken = [0] * max_draft  # steps that accepted position i
    for s in steps:
        hist[s.accepted] += 1
        for i in range(len(s.draft)):
            reached[i] += 1
            taken[i] += i < s.accepted
    return {
        "mean_accepted": round(sum(len(s.emitted) for s in steps) / len(steps), 4),
        "accept_hist": hist,
        "accept_by_position": [round(t / r, 4) if r else 0.0 for t, r in zip(taken, reached)],
    }


def step_stats(steps) -> dict:
    """acceptance_stats and the draft/verify time sums. Step times are read from device marks: after the
    generation they cost nothing; mid-generation the latest may wait for the device (the footer skips them)."""
    return {
        **acceptance_stats(steps),
        "draft_s": round(sum((s.draft_s for s in steps), 0.0), 6),
        "verify_s": round(sum((s.verify_s for s in steps), 0.0), 6),
    }
