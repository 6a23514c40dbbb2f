"""The EAGLE-3 drafter: one Llama-style decoder layer fed fused low/mid/high target states.

Row p of the drafter pairs the target's state at position p (three layers'
states concatenated and projected by `fc`) with the embedding of the token at
p+1, and predicts the token at p+2. Inside the layer the normed embedding and
the normed state are concatenated (2H) into q/k/v; the residual stream is the
state. Chained steps feed the layer's own (pre-norm) output back as the state.
The head covers a reduced draft vocabulary; `d2t[i]` is the offset from draft
id i to its target id.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..layers import ops
from ..runtime.graphs import MAX_ROWS, host_ids, upload, window_for
from ..layers.kv_cache import KVCache
from ..layers.spans import Span, StaticSpan
from ..errors import DflashError
from ..loading.config import Qwen3Config, read_json
from ..loading.weights import load_tensors

LAYER_PREFIXES = ("midlayer.", "layers.0.", "model.layers.0.")


class Eagle3Config:
    """Native layout (EAGLE / SpecForge / AngelSlim: flat Llama config + draft_vocab_size) or
    speculators' (`transformer_layer_config` nested, flags at the top level)."""

    def __init__(self, raw: dict, path: Path, target: Qwen3Config):
        self.path = path
        layer = raw.get("transformer_layer_config") or raw  # speculators nests the layer's config
        speculators = layer is not raw
        if int(layer.get("num_hidden_layers", 1)) != 1:
            raise DflashError(f"{path}: EAGLE-3 drafters with {layer.get('num_hidden_layers')} layers are not supported")
        for flag in ("fc_norm", "norm_output"):
            if raw.get(flag):
                raise DflashError(f"{path}: EAGLE-3 variant with {flag}=true is not supported")
        self.hidden = int(layer["hidden_size"])
        self.heads = int(layer["num_attention_heads"])
        self.kv_heads = int(layer.get("num_key_value_heads") or self.heads)
        # The Qwen3-4B drafters use head_dim 128 != hidden/heads: never derive it when the config names it.
        self.head_dim = int(layer.get("head_dim") or self.hidden // self.heads)
        self.intermediate = int(layer["intermediate_size"])
        self.eps = float(layer.get("rms_norm_eps", 1e-6))
        self.rope_theta = float((layer.get("rope_parameters") or {}).get("rope_theta", layer.get("rope_theta", 10000.0)))
        scaling = layer.get("rope_scaling") or {}
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise DflashError(f"{path}: unsupported rope_scaling {scaling}")
        self.qk_norm = layer.get("model_type") == "qwen3"  # speculators' Qwen3-style layer has q/k norms
        self.vocab = int(layer.get("vocab_size", target.vocab_size))
        self.draft_vocab = int(raw.get("draft_vocab_size") or layer.get("draft_vocab_size") or self.vocab)
        self.target_hidden = int(raw.get("target_hidden_size") or target.hidden_size)
        # speculators exports default to the residual taken after hidden_norm (as vLLM reads them).
        self.norm_before_residual = bool(raw.get("norm_before_residual", speculators))
        self.norm_before_fc = bool(raw.get("norm_before_fc", False))
        eagle = raw.get("eagle_config") or {}
        layers = eagle.get("eagle_aux_hidden_state_layer_ids") or raw.get("eagle_aux_hidden_state_layer_ids")
        n = target.num_hidden_layers
        # Default (EAGLE-3 paper / reference code): inputs of layers 2, L/2 and L-3, i.e. transformers'
        # hidden_states[2], [L//2], [L-3]; explicit ids follow vLLM's convention (input of layer i).
        self.aux_layers = [int(i) for i in (layers or (2, n // 2, n - 3))]
        if self.vocab != target.vocab_size or self.target_hidden != target.hidden_size:
            raise DflashError(
                f"EAGLE-3 drafter {path.parent} was made for a different target: vocabulary {self.vocab} vs "
                f"{target.vocab_size}, hidden size {self.target_hidden} vs {target.hidden_size}")
        if self.hidden != target.hidden_size:
            raise DflashError(f"{path}: drafter hidden size {self.hidden} differs from the target's embeddings")
        if max(self.aux_layers) >= n or min(self.aux_layers) < 0:
            raise DflashError(f"{path}: auxiliary layer {max(self.aux_layers)} does not exist in the target")

    def checkpoint_shapes(self, prefix: str = "midlayer.") -> dict[str, tuple[int, ...]]:
        h, d = self.hidden, self.head_dim
        a = prefix + "self_attn."
        return {
            "fc.weight": (h, len(self.aux_layers) * self.target_hidden),
            a + "q_proj.weight": (self.heads * d, 2 * h),
            a + "k_proj.weight": (self.kv_heads * d, 2 * h),
            a + "v_proj.weight": (self.kv_heads * d, 2 * h),
            a + "o_proj.weight": (h, self.heads * d),
            prefix + "mlp.gate_proj.weight": (self.intermediate, h),
            prefix + "mlp.up_proj.weight": (self.intermediate, h),
            prefix + "mlp.down_proj.weight": (h, self.intermediate),
            prefix + "hidden_norm.weight": (h,),
            prefix + "input_layernorm.weight": (h,),
            prefix + "post_attention_layernorm.weight": (h,),
            "norm.weight": (h,),
            "lm_head.weight": (self.draft_vocab, h),
            **({a + "q_norm.weight": (d,), a + "k_norm.weight": (d,)} if self.qk_norm else {}),
            **({"input_norm.weight": (len(self.aux_layers) * self.target_hidden,)} if self.norm_before_fc else {}),
        }

    def identity_maps(self, device) -> dict[str, torch.Tensor]:
        """d2t/t2d for a drafter whose head covers the first draft_vocab target ids (synthetic use)."""
        t2d = torch.zeros(self.vocab, dtype=torch.bool, device=device)
        t2d[: self.draft_vocab] = True
        return {"d2t": torch.zeros(self.draft_vocab, dtype=torch.int64, device=device), "t2d": t2d}


class Eagle3Drafter:
    def __init__(self, c: Eagle3Config, t: dict[str, torch.Tensor], target, source: str = "drafter"):
        self.c, self.target = c, target
        self.device, self.dtype = target.device, target.dtype
        p, a = "midlayer.", "midlayer.self_attn."
        self.fc = t.pop("fc.weight")
        self.qkv = torch.cat([t.pop(a + "q_proj.weight"), t.pop(a + "k_proj.weight"), t.pop(a + "v_proj.weight")])
        self.o = t.pop(a + "o_proj.weight")
        self.gate_up = torch.cat([t.pop(p + "mlp.gate_proj.weight"), t.pop(p + "mlp.up_proj.weight")])
        self.down = t.pop(p + "mlp.down_proj.weight")
        self.hidden_norm = t.pop(p + "hidden_norm.weight")
        self.input_norm = t.pop(p + "input_layernorm.weight")
        self.post_norm = t.pop(p + "post_attention_layernorm.weight")
        self.norm = t.pop("norm.weight")
        self.q_norm = t.pop(a + "q_norm.weight", None)
        self.k_norm = t.pop(a + "k_norm.weight", None)
        self.fc_input_norm = t.pop("input_norm.weight", None)
        self.lm_head = t.pop("lm_head.weight")
        self.embed = t.pop("embed_tokens.weight", None)
        if self.embed is None:
            self.embed = target.embed
        d2t = t.pop("d2t", None)
        base = torch.arange(c.draft_vocab, device=self.device)
        # Draft id -> target id (checkpoints store the offset d2t[i] = target_id - i).
        self.draft_to_target = base + d2t.to(device=self.device, dtype=torch.long) if d2t is not None else base
        if int(self.draft_to_target.max()) >= c.vocab or int(self.draft_to_target.min()) < 0:
            raise DflashError(f"{source}: d2t maps draft ids outside the target vocabulary")
        self.scale = c.head_dim**-0.5
        # Hidden-state indices as in transformers' `hidden_states`: the input of layer i is index i.
        self.capture = tuple(c.aux_layers)
        self.cache: KVCache | None = None
        self.graphs = self.fast = None
        self.fused: torch.Tensor | None = None  # fc-projected target states by position
        self.rows = 0  # drafter rows (positions) whose KV is valid

    @classmethod
    def load(cls, path: Path, target) -> "Eagle3Drafter":
        path = Path(path)
        raw = read_json(path / "config.json", "drafter config")
        c = Eagle3Config(raw, path / "config.json", target.cfg)
        shapes = c.checkpoint_shapes()
        shapes["d2t"] = (c.draft_vocab,)
        shapes["t2d"] = (c.vocab,)
        shapes["embed_tokens.weight"] = (c.vocab, c.hidden)

        def rename(name: str) -> str | None:
            if name.startswith("model.") and not name.startswith("model.layers."):
                name = name[len("model.") :]
            for prefix in LAYER_PREFIXES:
                if name.startswith(prefix):
                    return "midlayer." + name[len(prefix) :]
            return name

        tensors = load_tensors(path, shapes, target.dtype, target.device,
                               optional={"d2t", "t2d", "embed_tokens.weight"}, rename=rename,
                               ignore_prefixes=("midlayer.self_attn.rotary_emb",))
        return cls(c, tensors, target, str(path))

    # -- state -----------------------------------------------------------------------------
    def reset(self, max_len: int, path: str = "eager") -> None:
        c = self.c
        rows = max_len + 64  # chained rows run past the committed end
        if self.cache is None or self.cache.max_len < rows:
            self.cache = KVCache.allocate(1, rows, c.kv_heads, c.head_dim, self.dtype, self.device)
            self.fused = torch.zeros(rows, c.hidden, dtype=self.dtype, device=self.device)
            self.cos, self.sin = ops.rope_tables(c.head_dim, c.rope_theta, rows, self.device)
            self.graphs = None
        use = path == "graphs"
        # Graphs built for another path (replay vs eager static forward) are rebuilt, not reused.
        if path in ("graphs", "static") and (self.graphs is None or self.graphs[0].requested != use):
            from ..runtime.graphs import Graphs

            self.graphs = (Graphs(self._greedy_chain, self.device, self.cache.max_len, use_graphs=use),
                           Graphs(self._absorb_rows, self.device, self.cache.max_len, use_graphs=use))
            self.next_ids = torch.zeros(MAX_ROWS, dtype=torch.long, device=self.device)
            self.offsets = torch.arange(MAX_ROWS, device=self.device)
        self.fast, self.fast_absorb = self.graphs if path in ("graphs", "static") else (None, None)
        self.rows = 0
        self.committed = 0

    def rollback(self, length: int) -> None:
        # Row p needs the token at p+1, so rows up to length-2 stay valid.
        self.committed = min(self.committed, length)
        self.rows = min(self.rows, max(length - 1, 0))

    def absorb(self, hidden: torch.Tensor, start: int, tokens: list[int]) -> None:
        """Target states for positions [start, start+m) and the tokens at those positions."""
        if start != self.committed:
            raise RuntimeError(f"EAGLE-3 drafter out of step: has {self.committed}, got rows from {start}")
        m = hidden.shape[0]
        if self.fast_absorb is not None and 0 < start and m <= MAX_ROWS:  # per-step commits; prompts run eagerly
            self._absorb_fast(hidden, start, host_ids(tokens, self.device))
            self.commit(start + m)
            return
        self.fused[start : start + m] = self._fuse(hidden)
        self.committed = start + m
        # Rows [start-1, start+m-2]: state at p with the token at p+1 (row start-1 waited for tokens[0]).
        first = max(start - 1, 0)
        nxt = upload(tokens[first + 1 - start :], self.device)
        if nxt.numel():
            span = Span(self.cache, first, nxt.numel(), self.cos, self.sin)
            self._rows(span, self.fused[first : first + nxt.numel()], nxt)
        self.rows = first + nxt.numel()

    def chain_after(self, hidden: torch.Tensor, ids: torch.Tensor, start: int, accepted: torch.Tensor,
                    bonus: torch.Tensor, k: int) -> torch.Tensor:
        """The next greedy chain, queued before the host knows how this verify ended (fast paths only).

        Absorbs every verified row: target states `hidden` at [start, start + m) with their tokens `ids` (the
        verify input, on the device). Rows past the accepted ones pair states with rejected tokens: the chain
        and later absorbs overwrite them, and causal attention hides them from the rows before. Then chains k
        drafts after `bonus` at start + accepted + 1 (`accepted`, `bonus`: device scalars). `commit` names the
        committed length once the host knows it; until then the drafter counts as committed to `start`."""
        if start != self.committed or start < 1:
            raise RuntimeError(f"EAGLE-3 drafter out of step: has {self.committed}, got rows from {start}")
        m = hidden.shape[0]
        self._absorb_fast(hidden, start, ids)
        # The chain's rows sit at committed-1 ... committed+k-2 (committed = start + accepted + 1).
        positions = self.offsets[:k] + (accepted + start)
        return self.fast(bonus.view(1), start, k, end=start + m + k, positions=positions)

    def commit(self, length: int) -> None:
        """The committed length, after chain_after."""
        self.committed, self.rows = length, length - 1

    def _absorb_fast(self, hidden: torch.Tensor, start: int, ids: torch.Tensor) -> None:
        """absorb's graph replay (start >= 1): the rows' tokens `ids` staged in next_ids, then `_absorb_rows`."""
        m = hidden.shape[0]
        self.next_ids[:m].copy_(ids, non_blocking=True)
        self.fast_absorb(hidden, start, end=start + m - 1)

    def _fuse(self, hidden: torch.Tensor) -> torch.Tensor:
        """Target states [m, 3H] -> the drafter's fused states [m, H]."""
        if self.fc_input_norm is not None:
            hidden = ops.rms_norm(hidden, self.fc_input_norm, self.c.eps)
        return ops.linear(hidden, self.fc)

    def _absorb_rows(self, hidden: torch.Tensor, positions: torch.Tensor, window: int) -> None:
        """absorb on device positions [start, start + m) (start >= 1): fused rows at the positions, drafter
        rows at start-1 ... start+m-2 fed the tokens staged in next_ids[:m]."""
        self.fused.index_copy_(0, positions, self._fuse(hidden))
        rows = positions - 1
        span = StaticSpan(self.cache, rows, window, self.cos, self.sin)
        self._rows(span, self.fused.index_select(0, rows), self.next_ids[: positions.shape[0]])

    def _rows(self, span, state: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """Run the layer on the span's rows (writing their KV); returns pre-norm outputs."""
        c = self.c
        n = state.shape[0]
        emb = ops.rms_norm(self.embed[next_ids], self.input_norm, c.eps)
        normed = ops.rms_norm(state, self.hidden_norm, c.eps)
        x = torch.cat([emb, normed], dim=-1)
        q, k, v = ops.linear(x, self.qkv).split([c.heads * c.head_dim, c.kv_heads * c.head_dim,
                                                c.kv_heads * c.head_dim], dim=-1)
        cos, sin = span.cos, span.sin
        q, k = q.reshape(n, c.heads, c.head_dim), k.reshape(n, c.kv_heads, c.head_dim)
        if self.q_norm is not None:
            q, k = ops.rms_norm(q, self.q_norm, c.eps), ops.rms_norm(k, self.k_norm, c.eps)
        q, k = ops.apply_rope(q, cos, sin), ops.apply_rope(k, cos, sin)
        attn = span.attend(0, q, k, v.reshape(n, c.kv_heads, c.head_dim), self.scale)
        h = (normed if c.norm_before_residual else state) + ops.linear(attn, self.o)
        x = ops.rms_norm(h, self.post_norm, c.eps)
        return h + ops.linear(ops.swiglu(x, self.gate_up), self.down)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of pre-norm outputs."""
        return ops.logits(ops.rms_norm(out, self.norm, self.c.eps), self.lm_head)

    def chain_step(self, pos: int, state: torch.Tensor, token) -> tuple[torch.Tensor, torch.Tensor]:
        """One chained row at `pos` fed `token` (an id, or a device tensor of one):
        returns (draft-vocab logits [Vd], pre-norm output [1, H])."""
        if self.fast is not None:  # device positions and a window bucket: no attention shape per position
            where = upload([pos], self.device)
            span = StaticSpan(self.cache, where, window_for(pos + 1, self.cache.max_len), self.cos, self.sin)
        else:
            span = Span(self.cache, pos, 1, self.cos, self.sin)
        out = self._rows(span, state, upload(token, self.device))
        return self.logits(out)[0], out

    def first_state(self) -> tuple[int, torch.Tensor]:
        """Position and state of the first chained row: the latest committed target position."""
        pos = self.committed - 1
        return pos, self.fused[pos : pos + 1]

    def greedy_chain(self, last: int, k: int) -> torch.Tensor:
        """k greedy chained drafts (target ids, [k] on the device) after `last`; the tokens never
        leave the device (on the fast path: one graph replay)."""
        if self.fast is not None:  # the chain's rows sit at committed-1 ... committed+k-2
            return self.fast([last], self.committed, k, end=self.committed + k,
                             positions=range(self.committed - 1, self.committed - 1 + k))
        pos, state = self.first_state()
        token, drafts = last, []
        for i in range(k):
            logits, state = self.chain_step(pos + i, state, token)
            token = self.draft_to_target[logits.argmax(-1, keepdim=True)]
            drafts.append(token)
        return torch.cat(drafts)

    def _greedy_chain(self, last: torch.Tensor, positions: torch.Tensor, window: int, k: int) -> torch.Tensor:
        """The chain on device (positions [k]: its rows'): states and tokens never leave the GPU."""
        state = self.fused.index_select(0, positions[:1])
        token, drafts = last, []
        for i in range(k):
            span = StaticSpan(self.cache, positions[i : i + 1], window, self.cos, self.sin)
            state = self._rows(span, state, token)
            token = self.draft_to_target[ops.argmax_rows(self.logits(state))]
            drafts.append(token)
        return torch.cat(drafts)
