"""The DFlash 2 drafter (Inco AI / z-lab, 2026; z-lab's `DFlash2DraftModel`, e.g. z-lab/Qwen3.8-27B-DFlash2).

DFlash's one-pass block draft (models/dflash.py: the same layers, context rows and block) with two additions:

1. A grouped dynamic causal convolution around each sublayer. Every attention and MLP sublayer reads its normed input
   through one convolution and passes its output through a second, before the residual add:

       out[t, c] = sum_j (base[j, c] + delta[t, j, g(c)]) * x[t - j, c]      (x[t < 0] = 0)

   over the block's rows t (taps never reach past the block's first row), j < conv_kernel_size. `base` is a learned
   per-channel kernel; `delta`, a per-row correction shared by the channels of a group of conv_group_size, is
   projected from the sublayer's normed input (one projection gives both convolutions' corrections).
2. A candidate selector. Per draft row keep the top-K (selector_top_k) tokens of the block's logits; score the
   step from a predecessor p to a candidate c as

       score(p -> c) = logit[c] + < A[p] * (W h), B[c] >

   (A, B: predecessor and successor codebooks of rank selector_rank; W h: the row's state projected to that rank)
   and walk the block from the anchor (the last committed token) left to right: each row takes the argmax of its
   scores given the token the row before took, or at temperature T draws from softmax(scores / T), whose row is
   then that draft's q for the verify (lossless).

Selector off (`selector=False`, tuning's DFLASH_SELECTOR=0): each row's argmax of the block's logits, the walk with one
candidate per row (z-lab's reference with selector_top_k = 1; sampled, a one-hot q).

Checkpoints in two layouts, the same tensors under both (the comment on the speculators layout below).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .. import tuning
from ..errors import DflashError
from ..layers import ops
from ..loading.config import read_json
from ..loading.weights import load_tensors
from .decoder import self_attention
from .dflash import DFLASH2_MARKERS, DFlashConfig, DFlashDrafter, checkpoint_shapes as dflash_shapes

SIZES = DFLASH2_MARKERS  # conv_kernel_size, conv_group_size, selector_rank, selector_top_k
# dflash_config fields a speculators config holds at its top level
BLOCK_FIELDS = SIZES + ("block_size", "mask_token_id", "input_embedding_scale", "output_multiplier",
                        "final_logit_softcapping")

# The speculators layout (RedHatAI/Qwen3-*-speculator.dflash2). Sources: vllm-project/speculators
# src/speculators/models/dflash2/config.py (DFlash2SpeculatorConfig, a DFlashSpeculatorConfig) and
# model_definitions.py (the module names), and vLLM's speculators config translation
# (transformers_utils/configs/speculators/algos.py, update_dflash). config.json:
#   speculators_model_type "dflash2"; transformer_layer_config: the draft's Qwen3 fields (serialised with
#   to_diff_dict, so a field at transformers' default may be absent: QWEN3_DEFAULTS); block_size, mask_token_id and
#   the four module sizes at the top level; aux_hidden_state_layer_ids: target hidden-state indices, z-lab's
#   target_layer_ids + 1 (vLLM's update_dflash maps them back with i - 1); draft_vocab_size: DFlash 2 requires the
#   full target vocabulary.
# Tensors: z-lab's names (layers.*, fc, hidden_norm, norm, layers.N.{attention,mlp}_conv.{base_kernel,
#   kernel_projection.weight}, candidate_selector.hidden_projection.weight, candidate_selector.{predecessor,
#   successor}_codebook as raw parameters; the dflash2 branch's nn.Embedding variant adds `.weight`, read too), plus
#   the verifier's embed_tokens / lm_head copies (verifier_norm, d2t, t2d in some exports), skipped: the drafter
#   reads the target's own embeddings and head, as z-lab's does.
# z-lab's layout: Qwen3 fields at the top level, the rest in dflash_config; the codebooks without `.weight` (its
#   from_pretrained maps them onto nn.Embedding's).
QWEN3_DEFAULTS = {"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "head_dim": 128, "rms_norm_eps": 1e-6,
                  "max_position_embeddings": 32768}
IGNORED = ("lm_head.", "embed_tokens.", "model.embed_tokens.", "verifier_lm_head.", "verifier_norm.", "d2t", "t2d")


def is_speculators(raw: dict) -> bool:
    return "speculators_model_type" in raw or "transformer_layer_config" in raw


def zlab_form(raw: dict, path: Path) -> dict:
    """A speculators-layout config.json as z-lab's (see SPECULATORS above)."""
    layer, aux = raw.get("transformer_layer_config"), raw.get("aux_hidden_state_layer_ids")
    if not isinstance(layer, dict) or not aux:
        raise DflashError(f"{path}: a speculators DFlash 2 config needs transformer_layer_config and "
                          "aux_hidden_state_layer_ids")
    out = dict(QWEN3_DEFAULTS, **layer)
    draft_vocab = raw.get("draft_vocab_size")
    if draft_vocab is not None and int(draft_vocab) != int(out["vocab_size"]):
        raise DflashError(f"{path}: a draft vocabulary of {draft_vocab} (target {out['vocab_size']}): DFlash 2 "
                          "drafts over the full target vocabulary")
    block = {k: raw[k] for k in BLOCK_FIELDS if raw.get(k) is not None}
    block["target_layer_ids"] = [int(i) - 1 for i in aux]
    out.update(architectures=["DFlash2DraftModel"], dflash_config=block)
    out.pop("num_target_layers", None)  # the draft's transformer config knows nothing of the target
    return out


class DFlash2Config(DFlashConfig):
    dflash2 = True

    def __init__(self, raw: dict, path: Path, window: int | None = None):
        if is_speculators(raw):
            raw = zlab_form(raw, path)
        super().__init__(raw, path, window)
        block = raw.get("dflash_config") or {}
        missing = [k for k in SIZES if block.get(k, raw.get(k)) is None]
        if missing:
            raise DflashError(f"{path}: a DFlash 2 config needs {', '.join(missing)}")
        self.kernel_size, self.group_size, self.rank, self.top_k = (int(block.get(k, raw.get(k))) for k in SIZES)
        hidden = self.model.hidden_size
        if self.group_size < 1 or hidden % self.group_size:
            raise DflashError(f"{path}: conv_group_size {self.group_size} does not divide hidden_size {hidden}")
        if not 1 <= self.kernel_size <= self.block_size:
            raise DflashError(f"{path}: conv_kernel_size {self.kernel_size} outside 1..block_size {self.block_size}")
        if not 1 <= self.top_k <= self.model.vocab_size or self.rank < 1:
            raise DflashError(f"{path}: selector_top_k {self.top_k} / selector_rank {self.rank} out of range")
        self.groups = hidden // self.group_size


def checkpoint_shapes(c: DFlash2Config) -> dict[str, tuple[int, ...]]:
    m = c.model
    shapes = dflash_shapes(c)
    for i in range(m.num_hidden_layers):
        for conv in ("attention_conv", "mlp_conv"):
            shapes[f"layers.{i}.{conv}.base_kernel"] = (2, c.kernel_size, m.hidden_size)
            shapes[f"layers.{i}.{conv}.kernel_projection.weight"] = (2 * c.kernel_size * c.groups, m.hidden_size)
    shapes["candidate_selector.predecessor_codebook"] = (m.vocab_size, c.rank)
    shapes["candidate_selector.successor_codebook"] = (m.vocab_size, c.rank)
    shapes["candidate_selector.hidden_projection.weight"] = (c.rank, m.hidden_size)
    return shapes


def rename(name: str) -> str:
    """A checkpoint tensor's name as ours: "model." prefixes off (some exports), codebooks without `.weight`."""
    name = name[6:] if name.startswith("model.") else name
    if name.startswith("candidate_selector.") and name.endswith("_codebook.weight"):
        name = name[: -len(".weight")]
    return name


def convolve(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """The grouped dynamic causal convolution over one block's rows: x [T, H], delta [T, taps, G] (each row's
    correction per tap and channel group), base [taps, H] -> [T, H]; out[t] = sum_j (base[j] + delta[t, j]) * x[t - j],
    rows before the block's first zero. residual: residual + out (the sublayer's residual add). One kernel on the
    GPU (kernels/dflash2.dynamic_conv)."""
    if (k := ops.model_kernels(x, "dflash2")) and k.conv_fits(x, delta, base, residual):
        return k.dynamic_conv(x, delta, base, residual)
    rows, taps, groups = delta.shape
    xs = x.view(rows, groups, -1)
    base = base.view(taps, groups, -1)
    out = (base[0] + delta[:, 0, :, None]) * xs
    for j in range(1, min(taps, rows)):
        shifted = torch.cat([xs.new_zeros(j, *xs.shape[1:]), xs[:-j]])
        out = out + (base[j] + delta[:, j, :, None]) * shifted
    out = out.view(rows, -1)
    return out if residual is None else residual + out


@dataclass
class DynamicConv:
    """The two convolutions around one sublayer: `prepare` its input, `finish` its output."""

    base: torch.Tensor  # [2, taps, H]: the input's kernel, then the output's
    projection: torch.Tensor  # [2 * taps * G, H]: both corrections from the sublayer's normed input

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, H] (normed) -> (the input convolved, the output convolution's correction [T, taps, G])."""
        taps = self.base.shape[1]
        delta = ops.linear(x, self.projection).view(x.shape[0], 2, taps, -1)
        return convolve(x, delta[:, 0], self.base[0]), delta[:, 1]

    def finish(self, y: torch.Tensor, delta: torch.Tensor, residual: torch.Tensor, norm: torch.Tensor | None = None,
               eps: float = 0.0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The sublayer's output y [T, H] convolved with prepare's correction, plus the residual: h; and h's
        RMSNorm by `norm` (the next sublayer's input) where given, else None. One kernel on the GPU."""
        if norm is None:
            return convolve(y, delta, self.base[1], residual), None
        k = ops.model_kernels(y, "dflash2")
        if k and k.conv_fits(y, delta, self.base[1], residual) and norm.dtype == y.dtype and norm.is_contiguous():
            return k.conv_add_rms_norm(y, delta, self.base[1], residual, norm, eps)
        h = convolve(y, delta, self.base[1], residual)
        return h, ops.rms_norm(h, norm, eps)

    def is_identity(self) -> bool:
        """Base kernel 1 on the row itself and 0 before it, no correction: out = x exactly (the selector stage's)."""
        return bool(torch.all(self.base[:, 0] == 1) and torch.all(self.base[:, 1:] == 0)
                    and torch.all(self.projection == 0))

    @classmethod
    def take(cls, t: dict[str, torch.Tensor], prefix: str) -> "DynamicConv":
        return cls(t.pop(f"{prefix}base_kernel"), t.pop(f"{prefix}kernel_projection.weight"))


@dataclass
class CandidateSelector:
    predecessor: torch.Tensor  # [V, R]: A
    successor: torch.Tensor  # [V, R]: B
    projection: torch.Tensor  # [R, H]: W
    top_k: int

    def scores(self, x: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor):
        """The draft rows' states x [k, H] (after the final norm), their logits [k, V] and the anchor token [1] ->
        (candidates [k, K], scores [k, K, K]): scores[i, a, b] for row i taking candidate b after row i - 1 took its
        candidate a (row 0: after the anchor, every a alike). One batched product for the whole block."""
        k = ops.model_kernels(x, "dflash2")
        if k and k.top_k_fits(logits, self.top_k):  # exact as torch's (sampling_cost.py times both)
            unary, candidates = k.top_k(logits, self.top_k)
        else:
            unary, candidates = torch.topk(logits, self.top_k, dim=-1)
        projected = ops.linear(x, self.projection)  # [k, R]
        if k and k.scores_fit(candidates, unary, projected, self.predecessor, self.successor):
            return candidates, k.selector_scores(candidates, unary, anchor, projected, self.predecessor,
                                                 self.successor)  # the gathers and products in one kernel
        before = torch.cat([anchor.view(1, 1).expand(1, self.top_k), candidates[:-1]])  # [k, K]
        context = self.predecessor[before] * projected[:, None]  # [k, K, R]
        edges = torch.bmm(context, self.successor[candidates].transpose(1, 2))  # [k, K(a), K(b)]
        return candidates, unary[:, None, :] + edges

    @staticmethod
    def walk(candidates: torch.Tensor, scores: torch.Tensor, temperature=None, draw=None, noise=None):
        """The path from the anchor: each row's pick given the row before's -> (tokens [k], the picks' rows
        softmax(scores / T) [k, K] or None). Greedy (temperature None): the argmax. Sampled: draw(probs [1, K]) ->
        index [1], the exponential race (runtime/sampling.race); noise(shape) -> Exp(1) float32 noise of that shape
        from race's generator, where given, lets the GPU walk the whole block in one kernel (row i's draw:
        argmax(q_i / noise[i]), race's, on noise drawn at once). On the device, shape-static: no host sync."""
        if (k := ops.model_kernels(scores, "dflash2")) and (temperature is None or noise is not None):
            if temperature is not None and not isinstance(temperature, torch.Tensor):
                temperature = torch.full((1,), float(temperature), dtype=torch.float32, device=scores.device)
            if k.walk_fits(candidates, scores, temperature):
                return k.selector_walk(candidates, scores, temperature,
                                       None if temperature is None else noise(candidates.shape))
        pick = torch.zeros(1, dtype=torch.long, device=scores.device)
        picks, rows = [], []
        for i in range(scores.shape[0]):
            row = scores[i].index_select(0, pick)  # [1, K]
            if temperature is None:
                pick = row.argmax(-1)
            else:
                q = torch.softmax(row.float() / temperature, dim=-1)
                pick = draw(q)
                rows.append(q)
            picks.append(pick)
        tokens = candidates.gather(1, torch.stack(picks)).view(-1)
        return tokens, torch.cat(rows) if rows else None


def read_checkpoint(path: Path, target, window: int | None) -> tuple[DFlash2Config, dict[str, torch.Tensor]]:
    """A DFlash 2 checkpoint's config and tensors for `target` (window: as DFlashDrafter.load's; None: tuning's
    DFLASH_DRAFT_WINDOW)."""
    window = tuning.KNOBS.draft_window if window is None else window
    c = DFlash2Config(read_json(path / "config.json", "drafter config"), path / "config.json", window)
    return c, load_tensors(path, checkpoint_shapes(c), target.dtype, target.device, ignore_prefixes=IGNORED,
                           rename=rename, role="DFlash 2 drafter")


def load_block_drafter(path: Path, target, window: int | None = None) -> DFlashDrafter:
    """A DFlash 2 checkpoint whose convolutions are all the identity (base kernel 1 on the row itself and 0 before
    it, no correction: `dflash train`'s selector stage writes these) is a DFlash drafter with a candidate selector:
    its DFlash drafter alone (the selector's tensors unread), the same drafts as DFlash 2's with the selector off.
    Any other DFlash 2 checkpoint is DFlash 2's only. window: as DFlashDrafter.load's."""
    c, tensors = read_checkpoint(Path(path), target, window)
    for i in range(c.model.num_hidden_layers):
        for conv in ("attention_conv", "mlp_conv"):
            if not DynamicConv.take(tensors, f"layers.{i}.{conv}.").is_identity():
                raise DflashError(f"{path} is a DFlash 2 drafter (dynamic convolutions, candidate selector): "
                                  "load it as one (--draft dflash2, or its folder)")
    for name in [k for k in tensors if k.startswith("candidate_selector.")]:
        del tensors[name]
    return DFlashDrafter(c, tensors, target, source=str(path))


class DFlash2Drafter(DFlashDrafter):
    def __init__(self, c: DFlash2Config, tensors: dict[str, torch.Tensor], target, source: str = "drafter",
                 selector: bool | None = None):
        """selector: walk the candidate selector (None: tuning's DFLASH_SELECTOR), or each row's argmax."""
        n = c.model.num_hidden_layers
        self.convs = [(DynamicConv.take(tensors, f"layers.{i}.attention_conv."),
                       DynamicConv.take(tensors, f"layers.{i}.mlp_conv.")) for i in range(n)]
        s = "candidate_selector."
        self.selector = CandidateSelector(tensors.pop(f"{s}predecessor_codebook"), tensors.pop(f"{s}successor_codebook"),
                                          tensors.pop(f"{s}hidden_projection.weight"), c.top_k)
        self.use_selector = tuning.KNOBS.selector if selector is None else selector
        # Convolutions that are all the identity (out = x: the selector stage's drafters) are skipped: DFlash's
        # layers, norms folded as DFlash's. Else unfolded norms: each layer's norm feeds a convolution.
        self.identity_convs = all(conv.is_identity() for pair in self.convs for conv in pair)
        super().__init__(c, tensors, target, source, fold=self.identity_convs)

    @classmethod
    def load(cls, path: Path, target, selector: bool | None = None, window: int | None = None) -> "DFlash2Drafter":
        """window: as DFlashDrafter.load's (None: tuning's DFLASH_DRAFT_WINDOW)."""
        path = Path(path)
        c, tensors = read_checkpoint(path, target, window)
        return cls(c, tensors, target, source=str(path), selector=selector)

    def block_states(self, block: torch.Tensor, span, final_norm: bool = False) -> torch.Tensor:
        """DFlash's layers with each sublayer between its two convolutions:
        h + finish(Attention(prepare(RMSNorm(h)))), then h + finish(MLP(prepare(RMSNorm(h)))).
        `finish` adds the residual and gives the next sublayer's RMSNorm too (after the last, the final norm).
        Identity convolutions (`identity_convs`): DFlash's layers, the same values."""
        if self.identity_convs:
            return super().block_states(block, span, final_norm)
        m, c = self.cfg, self.c
        h = self.target.embed[block]
        if c.embedding_scale != 1.0:
            h = h * c.embedding_scale
        sublayers = []  # (its convolutions, the norm before it, the sublayer)
        for i, (layer, (attn_conv, mlp_conv)) in enumerate(zip(self.layers, self.convs)):
            def attention(x, layer=layer, i=i):
                return ops.linear(self_attention(layer, x, m, span, i, self.scale), layer.o)

            def mlp(x, layer=layer):
                return ops.linear(ops.swiglu(x, layer.gate_up), layer.down)

            sublayers += [(attn_conv, layer.input_norm, attention), (mlp_conv, layer.post_norm, mlp)]
        norms = [norm for _, norm, _ in sublayers[1:]] + [self.norm if final_norm else None]
        x = ops.rms_norm(h, sublayers[0][1], m.rms_norm_eps)
        for (conv, _, sublayer), norm in zip(sublayers, norms):
            y, delta = conv.prepare(x)
            h, x = conv.finish(sublayer(y), delta, h, norm, m.rms_norm_eps)
        return x if final_norm else h

    def draft(self, block: torch.Tensor, span, temperature=None, draw=None, noise=None):
        """The block [anchor, masks...] at `span` -> (drafts [k], their q rows as (candidate ids [k, K], probs
        [k, K]) when sampling, else None). Greedy: the selector's argmax walk; sampled (temperature: a float or a
        device scalar; draw and noise as CandidateSelector.walk's): its drawn walk."""
        x = self.block_states(block, span, final_norm=True)[1:]
        logits = self.normed_logits(x)
        if not self.use_selector:  # one candidate per row: its argmax, certain (q one-hot)
            tokens = ops.argmax_rows(logits)
            if temperature is None:
                return tokens, None
            return tokens, (tokens[:, None], torch.ones(tokens.shape[0], 1, device=tokens.device))
        candidates, scores = self.selector.scores(x, logits, block[:1])
        tokens, probs = self.selector.walk(candidates, scores, temperature, draw, noise)
        return tokens, None if probs is None else (candidates, probs)
