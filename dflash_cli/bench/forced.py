"""Synthetic acceptance: a proposer wrapper that forces a chosen mean committed length.

The real drafter runs at full cost; then its proposal is overwritten with the
target's known greedy continuation for the first n positions and a wrong token
at position n, with n drawn so that the mean committed length (n + 1) is tau.
This measures the engine's per-step cost at a given acceptance on random weights.

In bf16 a verify span and a one-token decode round differently, and random
weights leave many near-ties, so the target would often disagree with its own
plain continuation: ForcedDecoder runs the real acceptance (same cost) and then
commits exactly the forced count, so the measured τ is the one asked for.
"""

from __future__ import annotations

import math
import random

import torch

from ..layers import ops
from ..runtime.drafters.base import Drafter
from ..runtime.graphs import upload
from ..runtime.speculative import SpeculativeDecoder


class ForcedAcceptance(Drafter):
    def __init__(self, inner, sequence: list[int], tau: float, vocab_size: int, seed: int = 0):
        self.inner = inner
        self.kind = inner.kind
        self.capture = inner.capture
        self.max_draft = inner.max_draft
        self.prefix_drafts = inner.prefix_drafts
        self.sequence = sequence  # prompt + the target's greedy continuation
        self.tau = tau
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)
        self.pos = 0  # position of the last committed token (the next proposal follows it)
        self.forced = 0  # drafts the current step must commit
        self._on_device = None  # (sequence, each token + 1): forced proposals are sliced from them, not uploaded

    def reset(self, max_len: int, path: str = "eager") -> None:
        self.inner.reset(max_len, path)
        self.pos = 0

    def absorb(self, hidden, start: int, tokens: list[int]) -> None:
        self.inner.absorb(hidden, start, tokens)
        self.pos = start + len(tokens)

    def rollback(self, length: int) -> None:
        self.inner.rollback(length)
        self.pos = min(self.pos, length)

    def _n_right(self, k: int) -> int:
        # Two-point distribution around tau - 1: exact at tau = 1 and tau = k + 1.
        mean = min(max(self.tau - 1.0, 0.0), float(k))
        lo = math.floor(mean)
        return lo + (1 if self.rng.random() < mean - lo else 0)

    @property
    def default_draft(self) -> int:
        return self.inner.default_draft

    def can_queue_ahead(self, params) -> bool:
        return self.inner.can_queue_ahead(params)

    def absorbs_verified(self) -> bool:
        return self.inner.absorbs_verified()

    def absorb_verified(self, hidden, ids, start: int) -> None:
        self.inner.absorb_verified(hidden, ids, start)  # `commit` then names the committed length

    def propose(self, last: int, k: int, params):
        return self._force(self.pos, k, *self.inner.propose(last, k, params))

    def propose_ahead(self, hidden, ids, start: int, accepted, bonus, k: int, params):
        # `accepted` is this step's forced count: the host knows where the next proposal starts.
        at = start + self.forced + 1
        return self._force(at, k, *self.inner.propose_ahead(hidden, ids, start, accepted, bonus, k, params))

    def commit(self, length: int) -> None:
        self.inner.commit(length)
        self.pos = length

    def _force(self, pos: int, k: int, drafts, probs):
        """Overwrite the proposal after position `pos` with the forced continuation: its first n tokens, then
        a wrong one (surely rejected). One kernel on the device (the proposal is never read back here): the
        forcing should cost the measured step as little as it can."""
        n = self.forced = self._n_right(k)
        a = pos + 1
        head = min(n + 1, k, max(0, len(self.sequence) - a))  # forced tokens: as many as the sequence holds
        if not head:
            return drafts, probs
        if self._on_device is None:
            truth = upload(self.sequence, drafts.device)
            self._on_device = truth, (truth + 1) % self.vocab_size
        truth, wrong = self._on_device
        right = min(n, head)
        return torch.cat([truth[a : a + right], wrong[a + right : a + head], drafts[head:]]), probs


class ForcedDecoder(SpeculativeDecoder):
    """A speculative decoder whose proposer is a ForcedAcceptance: commits its forced count."""

    _counts: torch.Tensor | None = None  # 0..max_draft on the device

    def accept(self, ids, q, out, params):
        verdict = super().accept(ids, q, out, params)  # keep the real acceptance's cost
        n = min(self.proposer.forced, ids.shape[0] - 1)
        # Built anew (the real verdict may be a graph's output). Not `verdict[0] = n`: setting an element
        # from a host number copies from pageable memory, which waits for the device. The count is a slice of
        # a device range made once (no kernel).
        if self._counts is None or self._counts.device != verdict.device:
            self._counts = torch.arange(self.proposer.max_draft + 1, dtype=verdict.dtype, device=verdict.device)
        return torch.cat([self._counts[n : n + 1], ops.argmax_rows(out.logits[n : n + 1]), verdict[2:]])


def forced_generate(session, decoder: SpeculativeDecoder, prompt: list[int], max_tokens: int,
                    tau: float) -> ForcedDecoder:
    """`generate` at a chosen τ (DFLASH_FORCE_TAU): the same drafter, session and graphs, its drafts forced to the
    target's greedy continuation of `prompt`, which `decoder` generates first (greedy speculative output is the plain
    one). Then the forced decoder runs once untimed, as the bench's warm-up repetition does, so that the timed run
    launches nothing for the first time in the process (the forced acceptance's one-row argmax is a Triton
    specialisation no other step uses), and that argmax takes the step's L1 / shared split (kernels/carveout.py): a
    capture sets it on every kernel loaded before it, and generate captured everything at load, before this kernel
    was ever launched (in the bench a capture follows its first launch). The session is given back empty."""
    from ..kernels import carveout
    from ..runtime.generation import Request, generate
    from ..runtime.sampling import SamplingParams

    plain = generate(session, decoder, Request(list(prompt), SamplingParams(), max_tokens))
    session.reset()
    decoder.sync(session)
    sequence, vocab = list(prompt) + plain.tokens, session.model.cfg.vocab_size
    forced = ForcedDecoder(ForcedAcceptance(decoder.proposer, sequence, tau, vocab), decoder.draft_len)
    generate(session, forced, Request(list(prompt), SamplingParams(), max_tokens))
    if session.device.type == "cuda":
        carveout.apply()  # on the argmax that run loaded: one split for every kernel of a step
    session.reset()
    forced.sync(session)
    forced.proposer = ForcedAcceptance(decoder.proposer, sequence, tau, vocab)  # as the bench: its draws start over
    return forced
