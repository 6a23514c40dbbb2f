"""Turning logits into tokens on the device: greedy, temperature with top-k/top-p, and lossless block verification.

Everything here is shape-static and free of host syncs, so that it runs inside the CUDA graphs of the decode,
verify and draft steps. The sampling parameters live in small device tensors (`Sampler`), written before each
generation: one graph serves every temperature, top-p and top-k of its mode (`mode`). Draws use the exponential
race (argmax(p / Exp(1)) samples p), with noise from the default CUDA generator (graph-safe: each replay advances
its Philox offset) or, on CPU, from the sampler's own seeded generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..layers import ops
from ..layers.spans import MAX_STEP_ROWS
from .sampling_ranges import check_sampling

# Candidates per row where top-k is set: torch.topk to this many, then temperature / top-k / top-p on them (a
# full-vocabulary sort per row costs a decode step more than the 5% it may). Covers the usual top-k (Qwen3's 20).
K_MAX = 64
MAX_ROWS = MAX_STEP_ROWS  # rows of a drafter's q buffer: the most rows of any step
NO_LIMIT = 1 << 40  # top_k = 0 on the device


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self):
        check_sampling(self.temperature, self.top_p, self.top_k, self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


TOP_K = "top-k"  # 1 <= top_k <= K_MAX: the K_MAX largest logits are the candidates
ALL = "all"  # no top-k, top-p 1: every token, softmax(logits / T) as it is (no sort)
FULL = "full"  # otherwise: every token is a candidate (a full sort per row, exact)
MODES = (TOP_K, ALL, FULL)


def mode(params: SamplingParams) -> str | None:
    """The sampled graphs' mode for these params (part of their keys), None when greedy."""
    if params.greedy:
        return None
    if 0 < params.top_k <= K_MAX:
        return TOP_K
    return ALL if params.top_k == 0 and params.top_p == 1 else FULL


def accept_mode(params: SamplingParams):
    """Session.forward's `accept` for these params: True (the greedy verdict) or the sampled mode."""
    return True if params.greedy else mode(params)


@dataclass(frozen=True)
class Filtered:
    """Rows of a filtered distribution over candidate tokens: ids long [R, K], probs float [R, K] (rows sum to 1;
    zero for candidates that top-k/top-p cut, or padding). A row's ids are distinct, but for padding at
    probability 0. ordered: the ids are 0 .. V-1 on every row (the all-token mode), so probs is the dense row."""

    ids: torch.Tensor
    probs: torch.Tensor
    ordered: bool = False

    def __getitem__(self, rows) -> "Filtered":
        """Rows (not columns: a column slice is not in vocabulary order)."""
        return Filtered(self.ids[rows], self.probs[rows], self.ordered and not isinstance(rows, tuple))

    def at(self, ids: torch.Tensor, vocab: int) -> torch.Tensor:
        """Each row's probabilities of `ids` [R, n] (0 for an id not among the row's): a gather where ordered; a
        comparison of the ids ([R, n, K], as the verdict kernel's) where no larger than a dense row or the top-k
        mode's 64 x 64; else the dense rows' gather."""
        if self.ordered:
            return self.probs.gather(1, ids)
        if ids.shape[1] * self.ids.shape[1] <= max(vocab, K_MAX * K_MAX):
            return ((self.ids[:, None, :] == ids[:, :, None]) * self.probs[:, None, :]).sum(-1)
        return self.dense(vocab).gather(1, ids)

    def write(self, rows: "Filtered") -> "Filtered":
        """Copy `rows` into these rows (buffer rows: zero past their width, a draft vocabulary may be narrower)."""
        w = rows.ids.shape[1]
        self.ids[:, :w].copy_(rows.ids)
        self.probs[:, :w].copy_(rows.probs)
        if w < self.ids.shape[1]:
            self.ids[:, w:].zero_()
            self.probs[:, w:].zero_()
        return self

    def dense(self, vocab: int) -> torch.Tensor:
        """The rows as [R, vocab] probabilities."""
        out = torch.zeros(self.probs.shape[0], vocab, dtype=self.probs.dtype, device=self.probs.device)
        return out.scatter_add_(1, self.ids, self.probs)


class Sampler:
    """One device's sampling state: the parameters as device tensors (read in place by captured graphs), the RNG,
    and the buffers through which a drafter's q rows reach the verify's acceptance."""

    def __init__(self, device: torch.device):
        self.device = device
        self.temperature = torch.ones(1, dtype=torch.float32, device=device)
        self.top_p = torch.ones(1, dtype=torch.float32, device=device)
        self.top_k = torch.full((1,), NO_LIMIT, dtype=torch.long, device=device)
        # CUDA: the default generator (captured graphs draw from it); CPU: our own, seeded per generation.
        self.gen = None if device.type == "cuda" else torch.Generator(device=device)
        self._q: dict = {}  # (mode, width) -> (ids, probs) [MAX_ROWS, width]

    def load(self, params: SamplingParams) -> None:
        """Write a generation's params: kernels with scalar arguments, no copy from the host."""
        self.temperature.fill_(params.temperature)
        self.top_p.fill_(params.top_p)
        self.top_k.fill_(params.top_k or NO_LIMIT)

    def seed(self, seed: int | None) -> None:
        """Seed the RNG the draws use (None: from fresh entropy); the same seed gives the same draws."""
        gen = self.gen if self.gen is not None else torch.cuda.default_generators[self.device.index]
        if seed is not None:
            gen.manual_seed(seed)
        else:
            gen.seed()

    def q(self, mode: str, vocab: int) -> Filtered:
        """The q buffer of `mode` for a target of `vocab` tokens: the drafter's graph writes its rows, the verify's
        reads them. Allocated once, so graphs captured at load read it in place."""
        width = min(K_MAX, vocab) if mode == TOP_K else vocab
        buf = self._q.get((mode, width))
        if buf is None:
            buf = self._q[(mode, width)] = Filtered(
                torch.zeros(MAX_ROWS, width, dtype=torch.long, device=self.device),
                torch.zeros(MAX_ROWS, width, dtype=torch.float32, device=self.device))
        return buf

    def write_q(self, mode: str, vocab: int, rows: Filtered) -> Filtered:
        """Copy a proposal's q rows into the buffer (zero past their width: a draft vocabulary may be narrower)."""
        return self.q(mode, vocab)[: rows.ids.shape[0]].write(rows)


_samplers: dict = {}


def sampler(device) -> Sampler:
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    s = _samplers.get(device)
    if s is None:
        s = _samplers[device] = Sampler(device)
    return s


def begin(params: SamplingParams, device) -> Sampler | None:
    """Before a generation: its params on the device and the RNG seeded (None when greedy: nothing to draw)."""
    if params.greedy:
        return None
    s = sampler(device)
    s.load(params)
    s.seed(params.seed)
    return s


def filtered(logits: torch.Tensor, mode: str, s: Sampler) -> Filtered:
    """logits [R, V] -> the distribution sampled from: softmax(logits / T) restricted to the top_k largest, then to
    the smallest prefix (by probability) whose mass reaches top_p, the first always kept.

    Applied identically to target and drafter rows, which is what makes rejection sampling lossless with respect to
    this (filtered) target distribution."""
    kernels = _kernels(logits, mode)
    if kernels is not None:
        out = _rows(logits.shape[0], logits.device)
        kernels.filtered(logits, K_MAX, s.temperature, s.top_p, s.top_k, out.ids, out.probs)
        return out
    if mode == ALL:  # nothing cut: a 16-row sort of even a 4096-token vocabulary costs a CPU draft step 4 ms
        ids = torch.arange(logits.shape[-1], device=logits.device).expand(logits.shape)
        return Filtered(ids, torch.softmax(logits.float() / s.temperature, dim=-1), ordered=True)
    if mode == TOP_K:
        values, ids = torch.topk(logits, min(K_MAX, logits.shape[-1]), dim=-1)  # sorted, largest first
    else:
        values, ids = torch.sort(logits, dim=-1, descending=True)
    rank = torch.arange(values.shape[-1], device=logits.device)
    scores = (values.float() / s.temperature).masked_fill(rank >= s.top_k, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    drop = (probs.cumsum(-1) - probs) >= s.top_p
    probs = probs.masked_fill(drop, 0.0)
    return Filtered(ids, probs / probs.sum(-1, keepdim=True))


def filtered_draw(logits: torch.Tensor, mode: str, s: Sampler, out: Filtered | None = None,
                  to_target: torch.Tensor | None = None) -> tuple[torch.Tensor, Filtered]:
    """One token per row of logits [R, V] drawn from its filtered row, and those rows: written into `out` when given
    (rows of the sampler's q buffer: zero past their width), their ids mapped by `to_target` (a draft head's ids ->
    the target's)."""
    kernels = _kernels(logits, mode)
    if kernels is not None and (out is None or out.ids.shape[1] == K_MAX):
        out = out if out is not None else _rows(logits.shape[0], logits.device)
        tokens = kernels.filtered(logits, K_MAX, s.temperature, s.top_p, s.top_k, out.ids, out.probs, draw=True,
                                  to_target=to_target)
        return tokens, out
    rows = filtered(logits, mode, s)
    if to_target is not None:
        rows = Filtered(to_target[rows.ids], rows.probs)
    if out is not None:
        rows = out.write(rows)
    return draw(rows, s.gen), rows


def _kernels(logits: torch.Tensor, mode: str):
    """kernels/sampling where it runs these rows (the top-k mode, CUDA, the kernels on, their shapes), else None.
    They beat torch's at every vocabulary measured (H200, docs/TUNING.md "Sampling on the device")."""
    if mode != TOP_K:
        return None
    kernels = ops.model_kernels(logits, "sampling")
    return kernels if kernels is not None and kernels.fits(logits, K_MAX) else None


def _rows(n: int, device) -> Filtered:
    return Filtered(torch.empty(n, K_MAX, dtype=torch.long, device=device),
                    torch.empty(n, K_MAX, dtype=torch.float32, device=device))


def race(weights: torch.Tensor, gen) -> torch.Tensor:
    """One index per row of `weights` ([..., K], >= 0, not necessarily normalised), drawn with probability
    proportional to its weight: argmax(w / Exp(1)) (the exponential race). A zero weight never wins."""
    e = race_noise(weights.shape, weights.device, gen)
    return (weights / e.clamp_min(torch.finfo(torch.float32).tiny)).argmax(-1)


def race_noise(shape, device, gen) -> torch.Tensor:
    """The race's noise: Exp(1) float32 of `shape` from `gen` (a kernel that races many rows draws theirs at once).
    On CPU by inversion, -log(U): torch's CPU exponential_ draws 4x slower (1.4 ms for a 16-row block of a
    4096-token vocabulary); on CUDA exponential_ is one kernel. Not -log(1 - U): U is 0 once in 2^24 draws, and
    noise 0 makes its token win whatever its weight (a uniform token 1% of the time over a 152k vocabulary). U = 0
    counts as 2^-25 (its bucket's middle): noise inf would tie a row's only candidate with its zero weights."""
    if torch.device(device).type == "cuda":
        return torch.empty(shape, dtype=torch.float32, device=device).exponential_(generator=gen)
    return torch.rand(shape, dtype=torch.float32, device=device, generator=gen).clamp_min_(2.0**-25).log_().neg_()


def draw(rows: Filtered, gen) -> torch.Tensor:
    """One token per row of `rows` -> long [R]."""
    return rows.ids.gather(-1, race(rows.probs, gen).unsqueeze(-1)).squeeze(-1)


def sample(logits: torch.Tensor, params: SamplingParams, s: Sampler | None) -> torch.Tensor:
    """logits [..., V] -> token ids [...] (s: the generation's sampler, from `begin`)."""
    if params.greedy:
        return logits.argmax(-1)
    flat = logits.reshape(-1, logits.shape[-1])
    return filtered_draw(flat, mode(params), s)[0].reshape(logits.shape[:-1])


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution actually sampled from, as dense [..., V] probabilities (for tests and measurements)."""
    s = Sampler(logits.device)
    s.load(params)
    flat = logits.reshape(-1, logits.shape[-1])
    return filtered(flat, mode(params), s).dense(flat.shape[-1]).reshape(logits.shape)


def block_weights(drafts: torch.Tensor, q: Filtered, p: Filtered, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's odds (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR 2025) for
    drafts [k] drawn from q's rows [k] (row i: draft i's distribution given the drafts before it), p the target's
    rows [k+1] (ids < vocab; they may differ row to row, and from q's) -> (h [k]: h[i - 1] = h_i, w [k + 1]).

    With w_0 = 1 and w_i = min(1, w_{i-1} p_i(x_i) / q_i(x_i)), the residual after i < k drafts is
    max(w_i p_i - q_i, 0) (`next_weights`), of mass m_i, and h_i = m_i / (m_i + 1 - w_i); h_k = w_k. The step keeps
    the last i whose uniform u_i < h_i (none: 0) and draws the next token from that residual, or from p's last row
    when all k are kept: lossless, like token-by-token rejection sampling (Leviathan et al. / Chen et al.), and
    never fewer tokens a step on average (the most any verifier of one draft path keeps: the paper's optimality),
    more where drafts are long. Token by token stops at the first draft it rejects; this weighs the whole block,
    so a draft rejected alone may be kept with the ones after it."""
    k = drafts.shape[0]
    tiny = torch.finfo(torch.float32).tiny
    pd, qd = p[:k].at(drafts[:, None], vocab)[:, 0], q[:k].at(drafts[:, None], vocab)[:, 0]
    # w_i = min over j <= i of prod(p/q, j < l <= i): exp(S_i - max(S_0 .. S_i)), S the cumulative log ratio,
    # S_0 = 0 (q of a drawn draft is never 0; p 0: log -inf, every later w 0).
    logs = torch.cat([torch.zeros(1, dtype=pd.dtype, device=pd.device), (pd / qd.clamp_min(tiny)).log().cumsum(0)])
    w = torch.exp(logs - logs.cummax(0).values)  # [k + 1], w_0 = 1
    if p.ordered:  # m_i = w_i sum(p_i) - sum(min(w_i p_i, q_i)) over q's ids: p gathered, no dense row of q
        overlap = torch.minimum(w[:k, None] * p[:k].at(q.ids[:k], vocab), q.probs[:k]).sum(-1)
        mass = (w[:k] * p.probs[:k].sum(-1) - overlap).clamp_min(0)
    else:  # the residual itself over p's ids (narrow in the top-k mode): as the verdict kernel sums it
        mass = (w[:k, None] * p.probs[:k] - q[:k].at(p.ids[:k], vocab)).clamp_min(0).sum(-1)
    room = mass + (1 - w[:k])  # (1 - w exact: a mass below half an ulp of 1 is not rounded away)
    h = torch.where(room > 0, mass / room.clamp_min(tiny), 1.0)  # w_i = 1 and no residual: the first i kept
    return torch.cat([h[1:], w[k:]]), w


def next_weights(n: torch.Tensor, w: torch.Tensor, q: Filtered, p: Filtered, vocab: int):
    """The next token's candidates and unnormalised distribution when the first n drafts (a device scalar) are kept:
    p's row n ids [P] and max(w_n p_n - q_n, 0) on them, p's last row itself when all k are, and p's row n where
    the residual is empty."""
    k = w.shape[0] - 1
    row, at = n.view(1), n.clamp(max=k - 1).view(1)
    p_ids, p_probs = p.ids.index_select(0, row), p.probs.index_select(0, row)[0]
    q_on_p = Filtered(q.ids.index_select(0, at), q.probs.index_select(0, at)).at(p_ids, vocab)[0] * (n < k)
    weights = (torch.where(n < k, w.index_select(0, row), 1.0) * p_probs - q_on_p).clamp_min(0)
    return p_ids[0], torch.where(weights.sum() > 0, weights, p_probs)


def accept(drafts: torch.Tensor, q: Filtered, p: Filtered, vocab: int, gen) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification (block_weights) on the device: drafts [k] drawn from q's rows [k], p the target's rows
    [k+1] -> (accepted count, the next token) as device scalars. The same noise is drawn whatever is accepted, so
    the RNG advances alike."""
    k = drafts.shape[0]
    if k == 0:
        return torch.zeros((), dtype=torch.long, device=drafts.device), draw(p[:1], gen)[0]
    h, w = block_weights(drafts, q, p, vocab)
    u = torch.rand(k, generator=gen, device=drafts.device)
    n = ((u < h) * torch.arange(1, k + 1, device=drafts.device)).max()  # the last draft kept, 0: none
    ids, weights = next_weights(n, w, q, p, vocab)
    return n, ids.gather(0, race(weights, gen).view(1))[0]  # (indexing by a 0-d tensor would read it on the host)


def verdict(ids: torch.Tensor, logits: torch.Tensor, mode: str, feed=None) -> torch.Tensor:
    """The sampled counterpart of ops.greedy_verdict: ids [k+1] = [last, drafts...] and their logits [k+1, V] ->
    long [2 + k] = [accepted drafts, the next token, drafts...], the drafts' q rows read from the sampler's buffer
    (written by the drafter's step). feed as greedy_verdict's (one row): the token also becomes the row's next
    input and is recorded at fed[position + 1]."""
    s = sampler(ids.device)
    k = ids.shape[0] - 1
    vocab = logits.shape[-1]
    p, q = filtered(logits, mode, s), s.q(mode, vocab)
    kernels = _kernels(logits, mode)
    if kernels is not None and ids.is_contiguous():
        out = kernels.accept(ids, q.ids, q.probs, p.ids, p.probs)
    else:
        n, tok = accept(ids[1:], q[:k], p, vocab, s.gen)
        out = torch.cat([n.view(1), tok.view(1), ids[1:]])
    ops.feed_token(ids, out[1:2], feed)
    return out


def accept_sampled(drafts: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor, gen):
    """accept() on dense rows: drafts [k] drawn from draft_probs [k, V], target_probs [k+1, V]."""
    def dense(probs):
        return Filtered(torch.arange(probs.shape[-1], device=probs.device).expand(probs.shape), probs, ordered=True)

    return accept(drafts, dense(draft_probs), dense(target_probs), target_probs.shape[-1], gen)
