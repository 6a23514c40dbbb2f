"""Speculative statistics of a remote answer: the `dflash` field of `dflash serve`, else the difference of the
server's vLLM-style spec-decode counters on /metrics (or SGLang's accept-length gauge), and their footer line."""

from __future__ import annotations

import re

from ..ui.stream import histogram

_SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)')
_POSITION = re.compile(r'position="(\d+)"')
SPEC = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"  # a gauge (recent mean committed length), not a counter


def parse_counters(text: str) -> dict | None:
    """/metrics text -> {drafts, draft_tokens, accepted, per_pos: {i: n}} and/or {accept_length}; None if neither."""
    out: dict = {"per_pos": {}}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        try:
            v = float(value)
        except ValueError:
            continue
        if name in SPEC:
            out[SPEC[name]] = out.get(SPEC[name], 0.0) + v
        elif name == PER_POS and labels and (pos := _POSITION.search(labels)):
            out["per_pos"][int(pos.group(1))] = out["per_pos"].get(int(pos.group(1)), 0.0) + v
        elif name == SGLANG_ACCEPT_LENGTH:
            out["accept_length"] = v
    return out if "drafts" in out or "accept_length" in out else None


def stats(reply: dict, before: dict | None, after: dict | None) -> dict:
    """Our statistics from the reply's `dflash` field, else the spec-decode counters' difference."""
    if reply.get("dflash"):
        return {"source": "dflash", **reply["dflash"]}
    out: dict = {"source": "none"}
    usage = reply.get("usage") or {}
    n = usage.get("completion_tokens")
    if n and reply.get("ttft_s") is not None and reply["elapsed_s"] > reply["ttft_s"]:
        out["decode_tokens_per_s"] = round((n - 1) / (reply["elapsed_s"] - reply["ttft_s"]), 3)
        out["ttft_s"] = round(reply["ttft_s"], 6)
    if before and after and "drafts" not in after and "accept_length" in after:
        out.update(source="gauge", tau=round(after["accept_length"], 4))
    elif before and after and "drafts" in after:
        drafts = after["drafts"] - before.get("drafts", 0)
        if drafts > 0:
            accepted = after.get("accepted", 0) - before.get("accepted", 0)
            width = max(after["per_pos"], default=-1) + 1
            per_pos = [after["per_pos"].get(i, 0) - before["per_pos"].get(i, 0) for i in range(width)]
            out.update(source="metrics", drafts=int(drafts), tau=round(1 + accepted / drafts, 4),
                       acceptance_by_position=[round(p / drafts, 4) for p in per_pos])
    return out


# The remote names of what local `generate --json` reports too, and the local names (ui/stream.JSON_NAMES), so that a
# script reads one `stats` whether the answer came from the engine here or from --url.
LOCAL_NAMES = {"tau": "tau_tokens_per_step", "accepted_length_histogram": "accepted_drafts_hist",
               "acceptance_by_position": "accept_rate_by_position", "draft": "draft_kind",
               "decode_tokens_per_s": "decode_tok_per_s"}


def json_stats(st: dict) -> dict:
    """`stats` as `generate --url --json` prints it: the local --json's names where they mean the same."""
    return {LOCAL_NAMES.get(k, k): v for k, v in st.items()}


def footer(st: dict, n_tokens: int | None) -> str:
    parts = [f"{n_tokens} tok"] if n_tokens is not None else []
    if "decode_tokens_per_s" in st:
        parts.append(f"{st['decode_tokens_per_s']:.1f} tok/s")
    if st.get("ttft_s") is not None:
        parts.append(f"ttft {st['ttft_s'] * 1000:.0f} ms")
    if "tau" in st:
        parts.append(f"τ {st['tau']:.2f}")
    if st.get("accepted_length_histogram"):
        parts.append("accepted " + histogram(st["accepted_length_histogram"]))
    if st.get("acceptance_by_position"):
        parts.append("by pos " + " ".join(f"{p * 100:.0f}" for p in st["acceptance_by_position"][:8]))
    if st["source"] == "metrics":
        parts.append("(server /metrics)")
    elif st["source"] == "gauge":
        parts.append("(server's recent mean)")
    return " · ".join(parts)
