"""The persistent decode step (csrc/megakernel.cu): a Qwen3 target's whole one-token forward in one kernel.

Each SM runs one block for the whole step: a producer warp streams the SM's share of every weight and of the KV
cache into a ring of shared-memory slots, consumer warps compute behind grid-wide barriers (the kernel's header
says why and how). This module cuts each product into tiles of whole rows that fit a slot (`tile_rows`), shares
the tiles out so every SM streams the same bytes (`balance`, pure Python: tested on CPU), and launches the kernel
with its parameters, scratch buffers and tables.

Only Hopper (sm_90) runs it, for bf16 Qwen3 targets with 128-dim heads, 8 KV heads and 4 query heads per KV head
whose weight rows fit a slot (Qwen3-4B; not -8B, whose down rows are 24 KB); elsewhere `decode_step` says why not and
the step keeps its kernel-per-op forward. It is an experiment, off unless DFLASH_MEGAKERNEL=1 (`ENABLED`).
"""

from __future__ import annotations

import ctypes
import os

import torch

from . import cubin

SLOT = 20480  # bytes of a ring slot (csrc/megakernel.cu)
RING = 8  # slots, one per consumer warp
THREADS = 288  # eight consumer warps and a producer
HEAD_DIM, KV_HEADS, GQA = 128, 8, 4
MAX_ROWS = 4  # weight rows of a tile
MERGE_SMS = 8 * 24  # the merge reads at most this many SMs' partial states
EXTRA_BYTES = 3 * 8 * 32 * 4  # the consumers' reduction scratch, after the ring's barriers
QKV, O, GU, DOWN, HEAD = range(5)
# Opt-in: on the H100 it is slower than the kernel-per-op step (3.60 against 3.15 ms at ctx 1024,
# benchmarks/2026-11-25-h100/megakernel/): the graphed decode step uses it only with DFLASH_MEGAKERNEL=1.
ENABLED = os.environ.get("DFLASH_MEGAKERNEL", "0") == "1"


def tile_rows(k: int, n: int, gated: bool = False) -> int | None:
    """Weight rows of a tile (one slot) for a product of inner size k over n outputs: as many whole rows as fit a
    slot, up to MAX_ROWS, dividing n. gated: a gate/up product whose tile holds rows/2 gate rows and the matching
    up rows (n: the activations). None where a row (or a gate/up pair) does not fit a slot."""
    if k % 8:  # rows are copied in 16-byte vectors
        return None
    for rows in (4, 2, 1):  # the kernel's tile shapes (one copy of the product's code each)
        if rows > min(MAX_ROWS, SLOT // (2 * k)):
            continue
        if (not gated or rows % 2 == 0) and n % (rows // 2 if gated else rows) == 0:
            return rows
    return None


def balance(sms: int, products: list[tuple[int, int]]) -> list[list[int]]:
    """Each product's tiles cut into one contiguous range per SM, in stream order: products [(tiles, bytes per
    tile)] -> per product the first tile of each SM and the end ([sms + 1]). A product's leftover tiles go to the
    SMs that have streamed the fewest bytes so far, so every SM's stream stays within a tile of the others'."""
    load = [0] * sms
    out = []
    for tiles, nbytes in products:
        base, extra = divmod(tiles, sms)
        counts = [base] * sms
        for b in sorted(range(sms), key=lambda i: (load[i], i))[:extra]:
            counts[b] += 1
        offsets = [0]
        for b, c in enumerate(counts):
            load[b] += c * nbytes
            offsets.append(offsets[-1] + c)
        out.append(offsets)
    return out


class _Product(ctypes.Structure):
    _fields_ = [("K", ctypes.c_int), ("rows", ctypes.c_int)]


class _Params(ctypes.Structure):  # Params in csrc/megakernel.cu, field for field
    _fields_ = [(name, ctypes.c_void_p) for name in (
        "layers", "embed", "final_norm", "head", "cos", "sin", "k_cache", "v_cache", "h", "qkv", "attn", "act",
        "part_o", "part_ml", "counters", "tiles")] + [("prod", _Product * 5)] + [(name, ctypes.c_int) for name in (
            "n_layers", "hidden", "heads", "inter", "vocab", "max_len", "xbuf_bytes")] + [
        ("eps", ctypes.c_float), ("qk_scale", ctypes.c_float), ("trace", ctypes.c_void_p)]


def _arch(major: int, minor: int) -> str:
    if major != 9:
        raise RuntimeError(f"built for Hopper (sm_90), not sm_{major}{minor}")
    return "sm_90a"


def _module(device: torch.device) -> cubin.Module | str:
    # DFLASH_MEGAKERNEL_NVCC_FLAGS: comparisons, e.g. -DEVICT_FIRST=0
    return cubin.load("megakernel.cu", device, _arch, "DFLASH_MEGAKERNEL_NVCC_FLAGS", "megakernel")


def unsupported(model) -> str | None:
    """Why this model's decode step cannot run as the megakernel (None: it can)."""
    c = model.cfg
    if model.device.type != "cuda" or model.dtype != torch.bfloat16:
        return "needs a bf16 model on CUDA"
    if (c.head_dim, c.num_key_value_heads, c.num_attention_heads) != (HEAD_DIM, KV_HEADS, KV_HEADS * GQA):
        return "needs 128-dim heads, 8 KV heads and 32 query heads"
    if any(layer.qkv_bias is not None for layer in model.layers):
        return "q/k/v biases"
    if c.hidden_size % 8 or c.hidden_size > 8192 or c.intermediate_size > 16384:
        return "hidden size over 8192 or intermediate over 16384"
    if torch.cuda.get_device_properties(model.device).multi_processor_count > MERGE_SMS:
        return f"more than {MERGE_SMS} SMs"
    return None


class DecodeStep:
    """The megakernel over one model and cache: call it with a one-token step's device ids and positions
    (int64 [1], static buffers of a graph) to get its logits [1, vocab] in float32."""

    def __init__(self, model, cache, module: cubin.Module, trace: bool = False):
        self.model, self.cache, self.mod = model, cache, module
        c, dev = model.cfg, model.device
        self.sms = torch.cuda.get_device_properties(dev).multi_processor_count
        hidden, heads, inter, vocab = c.hidden_size, c.num_attention_heads, c.intermediate_size, c.vocab_size
        qkv_rows = (heads + 2 * KV_HEADS) * HEAD_DIM
        # Per kind: (inner size, outputs, gated); a tile's outputs are its rows (gate/up: half of them).
        kinds = [(hidden, qkv_rows, False), (heads * HEAD_DIM, hidden, False), (hidden, inter, True),
                 (inter, hidden, False), (hidden, vocab, False)]
        self.shapes = [tile_rows(k, n, g) for k, n, g in kinds]
        if any(s is None for s in self.shapes):
            raise RuntimeError("a weight row does not fit a ring slot")
        per_kind = [(n // (rows // 2 if g else rows), rows * k * 2) for (k, n, g), rows in zip(kinds, self.shapes)]
        table = balance(self.sms, per_kind[:4] * c.num_hidden_layers + per_kind[4:])
        self.tiles = torch.tensor(table, dtype=torch.int32, device=dev)
        f32, bf16 = dict(dtype=torch.float32, device=dev), dict(dtype=torch.bfloat16, device=dev)
        self.h = torch.empty(hidden, **bf16)
        self.qkv = torch.empty(qkv_rows, **bf16)
        self.attn = torch.empty(heads * HEAD_DIM, **bf16)
        self.act = torch.empty(inter, **bf16)
        self.part_o = torch.empty(self.sms * heads * HEAD_DIM, **f32)
        self.part_ml = torch.empty(self.sms * heads * 2, **f32)
        self.counters = torch.zeros(8, dtype=torch.int32, device=dev)  # barrier, exits, a stall's record
        # trace: per block each grid barrier's arrival and release (ns), the consumers' start and end, the
        # producer's time spent waiting, a spare, thread 0's sums (benchmarks/megakernel_check.py reads it).
        self.trace = (torch.zeros((self.sms, 12 * c.num_hidden_layers + 10), dtype=torch.int64, device=dev)
                      if trace else None)
        self.xbuf = -(-max(hidden, heads * HEAD_DIM, inter) * 2 // 128) * 128
        self.smem = RING * (SLOT + 16) + self.xbuf + EXTRA_BYTES  # each slot with two barriers
        if self.smem > module.shared_optin():
            raise RuntimeError(f"needs {self.smem} B of shared memory a block")
        module.allow_shared("decode_step", self.smem)
        self.attrs = (cubin.attribute(cubin.COOPERATIVE),)
        self._bind()

    def _bind(self) -> None:
        """The kernel's parameters from the model's and cache's current tensors (the RoPE tables may be replaced)."""
        m, c = self.model, self.model.cfg
        self.rope = m.cos
        rows = []
        for layer in m.layers:
            folded = layer.norms_folded
            rows.append([t.data_ptr() for t in (layer.qkv, layer.o, layer.gate_up, layer.down, layer.q_norm,
                                                layer.k_norm)]
                        + [0 if folded else layer.input_norm.data_ptr(), 0 if folded else layer.post_norm.data_ptr()])
        self.layer_table = torch.tensor(rows, dtype=torch.int64, device=m.device)
        p = _Params()
        for name, t in (("layers", self.layer_table), ("embed", m.embed), ("final_norm", m.norm), ("head", m.lm_head),
                        ("cos", m.cos), ("sin", m.sin), ("k_cache", self.cache.k), ("v_cache", self.cache.v),
                        ("h", self.h), ("qkv", self.qkv), ("attn", self.attn), ("act", self.act),
                        ("part_o", self.part_o), ("part_ml", self.part_ml), ("counters", self.counters),
                        ("tiles", self.tiles)):
            assert t.is_contiguous() and t.data_ptr() % 16 == 0, name
            setattr(p, name, t.data_ptr())
        ks = [c.hidden_size, c.num_attention_heads * HEAD_DIM, c.hidden_size, c.intermediate_size, c.hidden_size]
        for i, (k, rows) in enumerate(zip(ks, self.shapes)):
            p.prod[i] = _Product(k, rows)
        p.n_layers, p.hidden, p.heads = c.num_hidden_layers, c.hidden_size, c.num_attention_heads
        p.inter, p.vocab, p.max_len = c.intermediate_size, c.vocab_size, self.cache.max_len
        p.xbuf_bytes = self.xbuf
        p.eps, p.qk_scale = c.rms_norm_eps, m.scale * 1.4426950408889634  # softmax in exp2
        p.trace = self.trace.data_ptr() if self.trace is not None else 0
        self.params = p

    def stall(self) -> str | None:
        """What the first stalled wait of the launches so far waited for (None: none stalled). Reads the device
        (a sync): for checks, not for the hot path. A stall is a bug: its steps' outputs are garbage."""
        what, block, thread, seq, target = self.counters[2:7].tolist()
        if what == 0:
            return None
        kind = {1: "slot data", 2: "a free slot", 3: "the grid barrier", 5: "a landed slot"}.get(what, str(what))
        return f"block {block} thread {thread} waited for {kind} (sequence {seq}, target {target})"

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.model.cos is not self.rope:
            self._bind()
        logits = torch.empty((1, self.model.cfg.vocab_size), dtype=torch.float32, device=ids.device)
        self.mod.launch("decode_step", (self.sms, 1), THREADS, self.smem,
                        [self.params, cubin.Ptr(ids.data_ptr()), cubin.Ptr(positions.data_ptr()),
                         cubin.Ptr(logits.data_ptr())], self.attrs)
        return logits


def decode_step(model, cache) -> DecodeStep | str:
    """The megakernel for this model and cache, or why it cannot run here (a str)."""
    why = unsupported(model)
    if why is not None:
        return why
    mod = _module(model.device)
    if isinstance(mod, str):
        return mod
    try:
        return DecodeStep(model, cache, mod)
    except RuntimeError as exc:
        return f"megakernel unavailable: {exc}"
