"""Turning logits into tokens: greedy, temperature with top-k/top-p, and lossless rejection sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import DflashError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise DflashError(f"--temperature must be >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise DflashError(f"--top-p must be in (0, 1] (got {self.top_p})")
        if self.top_k < 0:
            raise DflashError(f"--top-k must be >= 0 (got {self.top_k})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self, device) -> torch.Generator:
        g = torch.Generator(device=device)
        if self.seed is not None:
            g.manual_seed(self.seed)
        else:
            g.seed()
        return g


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution actually sampled from: softmax(logits / T) restricted by top-k then top-p.

    Applied identically to target and drafter rows, which is what makes
    rejection sampling lossless with respect to this (filtered) target distribution.
    """
    scores = logits.float() / params.temperature
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def draw(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One sample per row of `probs` ([..., V]) -> [...]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).reshape(probs.shape[:-1])


def sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> torch.Tensor:
    """logits [..., V] -> token ids [...]."""
    if params.greedy:
        return logits.argmax(-1)
    return draw(probabilities(logits, params), gen)


def accept_sampled(
    drafts: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative rejection sampling (Leviathan et al. / Chen et al.).

    drafts [k] were drawn from draft_probs [k, V]; target_probs is [k+1, V].
    Accept draft i with probability min(1, p/q); at the first rejection draw from
    normalised max(p - q, 0); if all are accepted draw the bonus from the last row.
    Returns (accepted count, the next token) as device scalars, without a host sync.
    """
    k = drafts.shape[0]
    idx = torch.arange(k, device=drafts.device)
    p = target_probs[idx, drafts]
    q = draft_probs[idx, drafts]
    u = torch.rand(k, generator=gen, device=drafts.device)
    ok = (u * q < p).to(torch.int64)  # u < p/q without dividing by a zero q
    n = ok.cumprod(0).sum()
    if k == 0:
        return n, draw(target_probs[0], gen)
    # The bonus row is chosen on the device; one draw either way, so the generator advances alike.
    at = n.clamp(max=k - 1).view(1)
    target_row = target_probs.index_select(0, at)[0]
    residual = (target_row - draft_probs.index_select(0, at)[0]).clamp_min(0)
    total = residual.sum()
    dist = torch.where(total > 0, residual / total, target_row)
    return n, draw(torch.where(n == k, target_probs[k], dist), gen)
