"""Attention of a few query rows over a fixed window of the static KV cache (split-K, GQA).

Which keys a row sees comes from `limit` in device memory (the last visible key
index per query row), so one compiled launch serves every position inside a CUDA
graph, and so does its grid: the programs read the current length (the largest
limit + 1) and cut it into splits themselves (`_split_size`), so a graph captured
once serves the whole context. A decode step (a few rows) cuts the length into
about PROGRAMS programs of up to SPLIT keys: the keys alone must fill the GPU; a
span into about SPAN_PROGRAMS. A window of up to GRID_KEYS keys cuts every
length into its own full length's splits (as a graph captured for that window
did; programs past the length load nothing); a longer one cuts each length into
splits of its own, growing them where its grid would not cover the length. All query heads of a KV group share
its K/V loads. A second kernel merges the splits' partial softmax states,
reading every split's state in vector loads (a loop of dependent loads cost a
memory latency per split: at context 8192 that merge took longer than the split
kernel). Where a row has many splits, its head dims are shared out over several
merge programs, so that each reads all its splits in one load (merge_shape).
A decode step's q, k and v can come straight from the projection (attention_fresh):
the split programs then do the q/k norm, RoPE (or a partial RoPE of the first dims)
and cache write themselves, and the merge multiplies in an output gate where one
is given (Qwen3.5's gated attention). In a decode step over a window of up to 4096
keys, the split and the merge let the kernels after them launch early. A
sliding-window layer (a DFlash drafter's) also passes `low`, the first key each
row sees: a specialisation of its own (WINDOWED), so full-attention layers compile
the kernels they did; keys below every row's low are not loaded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import block_trace
from .elementwise import norm_rope, rope_cos_sin, rope_pair
from . import pdl
from .pdl import launch_options, start as pdl_start

SPLIT = 256  # most keys per program
BLOCK_S = 64  # keys a program loads at once
# A decode step (few rows) splits its window into about PROGRAMS programs (about 4 an SM of an H100: the window
# alone must fill the GPU), spans of many rows into about SPAN_PROGRAMS in splits of SPAN_MIN_SPLIT keys or more.
PROGRAMS = 512
SPAN_PROGRAMS = 128
SPAN_MIN_SPLIT = 128
# Key blocks of a span that the RoPE kernel feeds (EAGLE-3's verify past FRESH_SPAN_WINDOW): 32 keys, so that two of
# its programs fit an SM's shared memory within the carveout (carveout.CARVEOUT).
SPAN_BLOCK_S = 32
# The grid has the split programs of the window's full length up to this many keys (past it, splits grow beyond SPLIT
# instead, rather than launch programs that short lengths leave idle).
GRID_KEYS = 16384
MERGE_WARPS = 1  # one warp a merge program: its split reductions stay inside the warp
# Triton's launch tuning of the split kernel (None: Triton's default, or _split_tuning's stages); the attention sweep
# (benchmarks/attention_sweep.py) sets them.
SPLIT_WARPS: int | None = None
SPLIT_STAGES: int | None = None
# Partial-output values one merge program (one warp) loads at once (64 registers a lane): a row's splits are read
# in one load each by up to MERGE_DSPLIT programs over the head's dims.
MERGE_ELEMS = 2048
MERGE_DSPLIT = 8
# A decode step's rows straight from the projection (attention_fresh): the split kernel normalises and rotates q and
# the new keys and writes the cache, and no RoPE kernel runs; only for up to FRESH_ROWS query rows a KV head (a span's
# 64 rows spilled registers), and for spans of up to FRESH_SPAN_ROWS (EAGLE-3's 8-row verify) over windows of up to
# FRESH_SPAN_WINDOW keys (each row block reads the split's keys again: longer windows lose).
FRESH_ROWS = 16
FRESH_SPAN_ROWS = 32
FRESH_SPAN_WINDOW = 2048
# Fresh spans of up to FRESH_BLOCK rows a KV head run in one row block of FRESH_WARPS warps (fewer registers a
# thread than 4 warps), not in blocks of FRESH_ROWS.
FRESH_BLOCK = FRESH_SPAN_ROWS
FRESH_WARPS = 8
# Early launches (kernels/pdl.py): a decode split lets the merge launch at its start and the merge lets the o product
# launch at its own, so their blocks are resident, the product's first weight loads in flight, while the split runs;
# spans' splits and decode splits of several key blocks are themselves launched early (one-block decode splits lose
# with it). That needs every kernel of a step to prefer one L1 / shared split (kernels/carveout.py), and long decode
# splits to pipeline 2 stages instead of 3, so that two programs an SM fit it.
TWO_STAGE_ROWS = 16  # most query rows a program of a 2-stage split holds
# A decode row's split of several key blocks loads its first block of cached keys before its wait for the qkv
# product (EARLY_KEYS); the new row's key and value, which the program writes itself, are patched in after it. Windows
# of one-block splits lose with it (EARLY_ONE). Constants, not knobs: the interpreter tests set both to check the form.
EARLY_KEYS = True
EARLY_ONE = False


@triton.jit
def _norm_rope_rows(base, mask, w_ptr, cos_ptr, sin_ptr, pos, eps, D: tl.constexpr, R: tl.constexpr,
                    dt: tl.constexpr):
    """Head vectors at the row pointers base [N]: RMSNorm by w, then RoPE of their first R dims at the rows'
    positions pos [N] (tables of R columns; elementwise.norm_rope) -> [N, D] in dt."""
    offs = tl.arange(0, D)
    pair = rope_pair(D, R)
    x = tl.load(base[:, None] + offs[None, :], mask=mask[:, None], other=0.0).to(tl.float32)
    xp = tl.load(base[:, None] + pair[None, :], mask=mask[:, None], other=0.0).to(tl.float32)
    c, s = rope_cos_sin(cos_ptr, sin_ptr, pos[:, None] * R, offs[None, :], mask[:, None], D, R, dt)
    return norm_rope(x, xp, tl.load(w_ptr + offs).to(tl.float32), tl.load(w_ptr + pair).to(tl.float32), c, s, eps,
                     D, R, dt)


@triton.jit
def _attend_block(q, k, v, offs_s, lim, scale, m_i, l_i, acc, low, WINDOWED: tl.constexpr):
    """One key block (keys k, values v at positions offs_s) into the rows' online softmax (m_i, l_i, acc); WINDOWED:
    keys below the rows' low are masked too."""
    s = tl.dot(q, tl.trans(k)) * scale
    s = tl.where(offs_s[None, :] <= lim[:, None], s, float("-inf"))
    if WINDOWED:
        s = tl.where(offs_s[None, :] >= low[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


# One 4 KB piece of a program's share a thread: thread t asks L2 for bytes [t * 4096, min(share, (t + 1) * 4096)) of
# the share at $1 (share: $2 bytes, a multiple of 16; nothing where it is <= 0). The CUDA GEMM's warm-up
# (csrc/skinny_gemm.cu, warm_share) does the same from its blocks.
_WARM_ASM = tl.constexpr("""{
.reg .u32 t;
.reg .s32 r;
.reg .u64 a;
.reg .pred p;
mov.u32 t, %tid.x;
mul.lo.s32 r, t, 4096;
sub.s32 r, $2, r;
min.s32 r, r, 4096;
setp.gt.s32 p, r, 0;
mul.wide.u32 a, t, 4096;
add.u64 a, a, $1;
@p cp.async.bulk.prefetch.L2.global [a], r;
mov.u32 $0, 0;
}""")


@triton.jit
def _warm_share(base, nbytes, after, STEPS: tl.constexpr, THREADS: tl.constexpr):
    """This program's share of the nbytes at base (a byte pointer, 16-byte aligned; nbytes a multiple of 16) asked
    into L2, once `after` (a value the requests must wait for) is known, in STEPS rounds of one 4 KB piece for each
    of the program's THREADS threads; a hint: nothing waits on it."""
    programs = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
    index = (tl.program_id(2) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(0) + tl.program_id(0)
    share = ((nbytes + programs - 1) // programs + 15) // 16 * 16
    start = index * share
    share = tl.where(after >= 0, tl.minimum(share, nbytes - start), 0)
    for i in tl.static_range(STEPS):
        done = i * THREADS * 4096
        tl.inline_asm_elementwise(_WARM_ASM, "=r,l,r", [base + start + done, share - done], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _split_size(limit_ptr, T, stride_lt, NSPLIT, BLOCK_T: tl.constexpr, LEAST: tl.constexpr, CAP: tl.constexpr,
                PROGRAMS: tl.constexpr, KVB: tl.constexpr, HOST_SPLIT: tl.constexpr, DYNAMIC: tl.constexpr):
    """(keys a split holds, the length: the largest limit of the T rows + 1), the same in every program of a launch
    and its merge: the window's HOST_SPLIT, or (DYNAMIC) the smallest power of two from LEAST that cuts the length
    into about PROGRAMS programs over KVB (KV heads x row blocks), at most CAP keys, unless NSPLIT splits of CAP
    would not cover it (split_size on the host)."""
    tt = tl.arange(0, BLOCK_T)
    length = tl.max(tl.load(limit_ptr + tt * stride_lt, mask=tt < T, other=-1), axis=0) + 1
    if DYNAMIC:
        split = LEAST
        while (split < CAP) & (split * PROGRAMS < length * KVB):
            split *= 2
        while split * NSPLIT < length:
            split *= 2
    else:
        split = HOST_SPLIT
    return split, length


def split_size(length: int, least: int, programs: int, kvb: int, nsplit: int | None = None) -> int:
    """_split_size on the host (CAP = SPLIT): the split the kernel picks at `length` (nsplit None: any grid)."""
    split = least
    while split < SPLIT and split * programs < length * kvb:
        split *= 2
    while nsplit is not None and split * nsplit < length:
        split *= 2
    return split


def grid_splits(window: int, least: int, programs: int, kvb: int) -> int:
    """Split programs per KV head and row block: those of the window's full length (at most GRID_KEYS keys), as a
    graph captured for that window had them. Past GRID_KEYS a length whose own split would need more programs takes
    larger splits instead (_split_size)."""
    top = min(window, GRID_KEYS)
    return triton.cdiv(top, split_size(top, least, programs, kvb))


@triton.jit
def _split_kernel(q_ptr, k_ptr, v_ptr, limit_ptr, part_o, part_ml, T, NSPLIT, stride_lt, stride_qt, stride_qh,
                  stride_ks, stride_kh, stride_vs, stride_vh, scale,
                  kn_ptr, vn_ptr, stride_knt, stride_knh, stride_vnt, stride_vnh, qw_ptr, kw_ptr, cos_ptr, sin_ptr,
                  pos_ptr, eps, trace_ptr,
                  G: tl.constexpr, D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
                  LEAST: tl.constexpr, CAP: tl.constexpr, PROGRAMS: tl.constexpr, KVB: tl.constexpr,
                  HOST_SPLIT: tl.constexpr, DYNAMIC: tl.constexpr,
                  FRESH: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr, R: tl.constexpr,
                  ROWS: tl.constexpr, TRACE: tl.constexpr, EARLY: tl.constexpr = False,
                  warm_ptr=None, warm_bytes=0, WARM: tl.constexpr = False, WARM_STEPS: tl.constexpr = 1,
                  WARM_THREADS: tl.constexpr = 128, low_ptr=None, WINDOWED: tl.constexpr = False):
    # FRESH: q, k, v come straight from the projection (q_ptr, kn_ptr, vn_ptr) for the rows at pos_ptr
    # (consecutive): every program normalises and rotates q itself (its first R dims, the tables' columns: R < D is
    # a partial RoPE), and a program whose split holds some of the rows' positions first stores those new keys
    # (normed, rotated) and values into the cache. The new keys were attended from registers in a block of their
    # own instead: that needed 255 registers and spilled.
    # A group's ROWS query rows (t * G + head in the group) are shared out in blocks of BLOCK_R over
    # program_id(2): a fresh span's programs then hold few rows (64 spilled), each block its own programs.
    # EARLY (one fresh row, see EARLY_KEYS): the row's limit and the split's first key block before it are loaded
    # before the wait; the new key and value are patched in after it.
    t0 = block_trace.now(TRACE)
    kvh = tl.program_id(0)
    sp = tl.program_id(1)
    r = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    t = r // G
    head = kvh * G + r % G
    rmask = t < T
    offs_d = tl.arange(0, D)
    dt = k_ptr.dtype.element_ty
    q_rows = q_ptr + t * stride_qt + head * stride_qh
    split, length = _split_size(limit_ptr, T, stride_lt, NSPLIT, BLOCK_T, LEAST, CAP, PROGRAMS, KVB, HOST_SPLIT,
                                DYNAMIC)
    live = sp * split < length  # a program past the length loads and stores nothing
    if EARLY:
        pdl.trigger(PDL)
        lim = tl.load(limit_ptr + t * stride_lt, mask=rmask, other=-1)
        max_lim = tl.max(lim, axis=0)
        offs_0 = sp * split + tl.arange(0, BLOCK_S)
        old_0 = (offs_0 < max_lim)[:, None]  # one row: its limit is its own (new) position
        k_0 = tl.load(k_ptr + offs_0[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :], mask=old_0, other=0.0)
        v_0 = tl.load(v_ptr + offs_0[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :], mask=old_0, other=0.0)
        pdl.wait(PDL)
    else:
        pdl_start(PDL)
    t1 = block_trace.now(TRACE)
    if FRESH:
        if EARLY:
            first_new = max_lim
        else:
            first_new = tl.load(pos_ptr)
        if (sp + 1) * split > first_new and sp * split < first_new + T:
            # The new keys (and values) of this split into the cache, before this program reads them.
            j = tl.arange(0, BLOCK_T)
            pos_j = first_new + j
            jmask = (j < T) & (pos_j >= sp * split) & (pos_j < (sp + 1) * split)
            kf = _norm_rope_rows(kn_ptr + j * stride_knt + kvh * stride_knh, jmask, kw_ptr, cos_ptr, sin_ptr,
                                 pos_j, eps, D, R, dt)
            vf = tl.load(vn_ptr + j[:, None] * stride_vnt + kvh * stride_vnh + offs_d[None, :],
                         mask=jmask[:, None], other=0.0)
            tl.store(k_ptr + pos_j[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :], kf, mask=jmask[:, None])
            tl.store(v_ptr + pos_j[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :], vf, mask=jmask[:, None])
            if EARLY:  # the row's key and value take their place in the early block
                new_0 = (offs_0 == first_new)[:, None]
                k_0 = tl.where(new_0, kf, k_0)
                v_0 = tl.where(new_0, vf, v_0)
            tl.debug_barrier()  # stored before any thread of this program loads them below
        q = _norm_rope_rows(q_rows, rmask, qw_ptr, cos_ptr, sin_ptr, tl.load(pos_ptr + t, mask=rmask, other=0),
                            eps, D, R, dt)
    else:
        q = tl.load(q_rows[:, None] + offs_d[None, :], mask=rmask[:, None], other=0.0)
    if not EARLY:
        lim = tl.load(limit_ptr + t * stride_lt, mask=rmask, other=-1)
        max_lim = tl.max(lim, axis=0)
    if WINDOWED:  # a sliding layer: the first key each row sees (low_ptr [T], contiguous); none below any row's
        low = tl.load(low_ptr + t, mask=rmask, other=0)
        min_low = tl.min(tl.where(rmask, low, max_lim), axis=0)
    else:
        low = lim
        min_low = 0
    m_i = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, D), tl.float32)
    if EARLY:
        m_i, l_i, acc = _attend_block(q, k_0, v_0, offs_0, lim, scale, m_i, l_i, acc, low, WINDOWED)
    # Windows of up to GRID_KEYS keys cut every length into their own split (HOST_SPLIT): a loop of a fixed trip
    # count, pipelined and unrolled as it compiles best (a second, dynamic loop beside it cost decode at ctx 8192 7%).
    # Longer windows cut the length (DYNAMIC).
    if DYNAMIC:
        for i in range(1 if EARLY else 0, tl.where(live, split // BLOCK_S, 0)):
            offs_s = sp * split + i * BLOCK_S + tl.arange(0, BLOCK_S)
            smask = offs_s <= max_lim  # masked-off rows cost no memory traffic
            if WINDOWED:
                smask = smask & (offs_s >= min_low)
            k = tl.load(k_ptr + offs_s[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :],
                        mask=smask[:, None], other=0.0)
            v = tl.load(v_ptr + offs_s[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :],
                        mask=smask[:, None], other=0.0)
            m_i, l_i, acc = _attend_block(q, k, v, offs_s, lim, scale, m_i, l_i, acc, low, WINDOWED)
    else:
        for i in range(1 if EARLY else 0, HOST_SPLIT // BLOCK_S):
            offs_s = sp * HOST_SPLIT + i * BLOCK_S + tl.arange(0, BLOCK_S)
            smask = offs_s <= max_lim  # past the length: nothing loaded
            if WINDOWED:
                smask = smask & (offs_s >= min_low)
            k = tl.load(k_ptr + offs_s[:, None] * stride_ks + kvh * stride_kh + offs_d[None, :],
                        mask=smask[:, None], other=0.0)
            v = tl.load(v_ptr + offs_s[:, None] * stride_vs + kvh * stride_vh + offs_d[None, :],
                        mask=smask[:, None], other=0.0)
            m_i, l_i, acc = _attend_block(q, k, v, offs_s, lim, scale, m_i, l_i, acc, low, WINDOWED)
    if WARM:  # after the keys: the request waits on l_i, which they made
        _warm_share(warm_ptr, warm_bytes, tl.max(l_i, axis=0), WARM_STEPS, WARM_THREADS)
    base = (kvh * NSPLIT + sp) * ROWS
    # The real rows only (the merge never reads the others): a decode row is 4 of a block's 16.
    keep = rmask & (r * 0 + sp * split < length)  # (a row vector: a scalar term fails in the interpreter)
    tl.store(part_o + (base + r)[:, None] * D + offs_d[None, :], acc, mask=keep[:, None])
    tl.store(part_ml + (base + r) * 2, m_i, mask=keep)
    tl.store(part_ml + (base + r) * 2 + 1, l_i, mask=keep)
    block_trace.record(trace_ptr, t0, t1, TRACE)


@triton.jit
def _merge_kernel(part_o, part_ml, out_ptr, limit_ptr, stride_lt, T, NSPLIT: tl.constexpr, stride_ot,
                  G: tl.constexpr, D: tl.constexpr, DB: tl.constexpr, BLOCK_R: tl.constexpr, SPLITS_P2: tl.constexpr,
                  CHUNK: tl.constexpr, BLOCK_T: tl.constexpr, LEAST: tl.constexpr, CAP: tl.constexpr,
                  PROGRAMS: tl.constexpr, KVB: tl.constexpr, HOST_SPLIT: tl.constexpr, DYNAMIC: tl.constexpr,
                  PDL: tl.constexpr, trace_ptr, TRACE: tl.constexpr, gate_ptr=None, stride_gt=0,
                  GATED: tl.constexpr = False):
    # GATED (Qwen3.5's gated attention): the output times sigmoid(gate), per head and dim, the gate [T, H*D] read
    # after the wait (the product before the split wrote it), rounded as the torch reference (ops.output_gate).
    t0 = block_trace.now(TRACE)
    # The limits are the step's, written before its first layer: read while the split kernel still runs.
    split, length = _split_size(limit_ptr, T, stride_lt, NSPLIT, BLOCK_T, LEAST, CAP, PROGRAMS, KVB, HOST_SPLIT,
                                DYNAMIC)
    used = (length + split - 1) // split  # the splits that hold keys: the others stored nothing
    pdl_start(PDL)
    t1 = block_trace.now(TRACE)
    kvh = tl.program_id(0)
    r = tl.program_id(1)
    t = r // G
    if t < T:
        head = kvh * G + r % G
        offs_d = tl.program_id(2) * DB + tl.arange(0, DB)  # this program's share of the head's dims
        # Every split's (max, sum) in one vector load: a loop of dependent loads costs a memory latency per
        # split (at context 8192 that made the merge slower than the split kernel itself).
        sp = tl.arange(0, SPLITS_P2)
        rows = (kvh * NSPLIT + sp) * BLOCK_R + r
        ms = tl.load(part_ml + rows * 2, mask=sp < used, other=float("-inf"))
        m = tl.max(ms, axis=0)
        w = tl.where(ms == float("-inf"), 0.0, tl.exp(ms - m))
        l = tl.sum(tl.load(part_ml + rows * 2 + 1, mask=sp < used, other=0.0) * w, axis=0)
        acc = tl.zeros((DB,), tl.float32)
        for c in range(0, SPLITS_P2 // CHUNK):  # the partial outputs, CHUNK splits per load
            cs = c * CHUNK + tl.arange(0, CHUNK)
            crow = (kvh * NSPLIT + cs) * BLOCK_R + r
            cm = tl.load(part_ml + crow * 2, mask=cs < used, other=float("-inf"))
            cw = tl.where(cm == float("-inf"), 0.0, tl.exp(cm - m))
            o = tl.load(part_o + crow[:, None] * D + offs_d[None, :], mask=(cs < used)[:, None], other=0.0)
            acc += tl.sum(o * cw[:, None], axis=0)
        dt = out_ptr.dtype.element_ty
        o = acc / l
        if GATED:
            g = tl.load(gate_ptr + t * stride_gt + head * D + offs_d).to(tl.float32)
            o = o.to(dt).to(tl.float32) * (1.0 / (1.0 + tl.exp(-g))).to(dt).to(tl.float32)
        tl.store(out_ptr + t * stride_ot + head * D + offs_d, o.to(dt))
    block_trace.record(trace_ptr, t0, t1, TRACE)


def merge_shape(nsplit: int, d: int) -> tuple[int, int]:
    """(programs per row over the head's dims, splits per load) of the merge: one warp per program holds at most
    MERGE_ELEMS partial-output values, so every split is read in one load where it fits (the loads of a loop
    wait on each other), and the dims are shared out over more programs when the splits alone would not fit."""
    splits_p2 = triton.next_power_of_2(nsplit)
    dsplit = 1
    while splits_p2 * d // dsplit > MERGE_ELEMS and d // dsplit > 16 and dsplit < MERGE_DSPLIT:
        dsplit *= 2
    return dsplit, max(1, min(splits_p2, MERGE_ELEMS // (d // dsplit)))


def _split_tuning(split: int, rows: int) -> dict:
    # Triton's defaults (4 warps, 3 stages) unless a sweep sets them, except 2 stages for decode splits (at most
    # TWO_STAGE_ROWS rows a program) of several key blocks, so that two programs an SM fit in the step's carveout;
    # spans keep 3, which measured faster for them (docs/TUNING.md).
    two = rows <= TWO_STAGE_ROWS and split > BLOCK_S
    stages = SPLIT_STAGES or (2 if two else None)
    return {k: v for k, v in (("num_warps", SPLIT_WARPS), ("num_stages", stages)) if v}


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    t, h, d = q.shape
    g = h // k.shape[1]
    return (t * g <= 64 and d in (64, 128, 256) and v.shape[-1] == d
            and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1)


def attention_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, limit: torch.Tensor,
                     scale: float, low: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, H, D]; k, v [S, KV, D] (the window); limit [T] int64 (any stride: a broadcast one for a
    non-causal block); low [T] int64 or None: a sliding layer's first key a row sees -> [T, H*D]."""
    return _attend(q, k, v, limit, scale, None, low=low)


def supports_fresh(q: torch.Tensor, k_cache: torch.Tensor, window: int) -> bool:
    """attention_fresh takes these rows: at most FRESH_ROWS query rows per KV head, or up to FRESH_SPAN_ROWS where
    a block of FRESH_ROWS holds whole tokens and the window is short, over a contiguous cache."""
    g = q.shape[1] // k_cache.shape[1]
    rows = q.shape[0] * g
    span = rows <= FRESH_SPAN_ROWS and FRESH_ROWS % g == 0 and window <= FRESH_SPAN_WINDOW
    return ((rows <= FRESH_ROWS or span) and k_cache.is_contiguous()
            and supports(q, k_cache[:window], k_cache[:window]))


def attention_fresh(q, k, v, q_weight, k_weight, eps: float, cos, sin, k_cache, v_cache, positions, window: int,
                    limit, scale: float, warm=None, low=None, gate=None) -> torch.Tensor:
    """ops.qk_norm_rope_write then attention_window over the cache's first `window` rows, in the split kernel:
    q, k, v [T, heads, D] straight from the projection, positions [T] consecutive, cos/sin whole tables [max
    positions, R] (R < D: a partial RoPE, the first R dims rotated). warm: (a uint8 tensor, bytes) that a decode
    row's split programs ask into L2 once their keys are in (ops.split_warm), or None. low: as attention_window's.
    gate [T, H*D] (unit stride in its last dim) or None: the output times sigmoid(gate), in the merge
    (ops.output_gate)."""
    fresh = (k, v, q_weight, k_weight, eps, cos, sin, positions)
    return _attend(q, k_cache[:window], v_cache[:window], limit, scale, fresh, warm, low, gate)


def _attend(q, k, v, limit, scale, fresh, warm=None, low=None, gate=None) -> torch.Tensor:
    t, h, d = q.shape
    s, kv, _ = k.shape
    g = h // kv
    block_r = max(16, triton.next_power_of_2(t * g))
    blocks = 1  # row blocks (grid axis 2): a fresh span's rows, FRESH_ROWS per program
    tuning = {}
    if fresh is not None and block_r > FRESH_BLOCK:
        block_r, blocks = FRESH_ROWS, triton.cdiv(t * g, FRESH_ROWS)
    elif fresh is not None and block_r > FRESH_ROWS:
        tuning.setdefault("num_warps", FRESH_WARPS)
    # A few query rows: about PROGRAMS programs over the keys (they alone must fill the GPU), splits of at least
    # BLOCK_S keys; counted with their row blocks. Spans: about SPAN_PROGRAMS, splits of at least SPAN_MIN_SPLIT
    # keys. Both at most SPLIT up to GRID_KEYS. The programs cut the current length themselves (_split_size); what
    # is fixed at launch (pipelining, early launches) follows the split of the window's full length.
    few = block_r <= 16
    least, programs = (BLOCK_S, PROGRAMS) if few else (SPAN_MIN_SPLIT, SPAN_PROGRAMS)
    block_s = SPAN_BLOCK_S if not few and block_r <= 32 and fresh is None else BLOCK_S
    nsplit = grid_splits(s, least, programs, kv * blocks)
    split = split_size(s, least, programs, kv * blocks, nsplit)
    sizing = dict(LEAST=least, CAP=SPLIT, PROGRAMS=programs, KVB=kv * blocks, BLOCK_T=triton.next_power_of_2(t),
                  HOST_SPLIT=split, DYNAMIC=s > GRID_KEYS)
    tuning = {**tuning, **_split_tuning(split, block_r)}
    rows = block_r * blocks
    part_o = torch.empty((kv, nsplit, rows, d), dtype=torch.float32, device=q.device)
    part_ml = torch.empty((kv, nsplit, rows, 2), dtype=torch.float32, device=q.device)
    out = torch.empty((t, h * d), dtype=q.dtype, device=q.device)
    kn, vn, qw, kw, eps, cos, sin, pos = fresh if fresh else (k, v, k, k, 0.0, k, k, limit)
    chain = few and blocks == 1
    decode = t * g <= 16
    early = t == 1 and chain and fresh is not None and (EARLY_ONE if split == BLOCK_S else EARLY_KEYS)
    launch_early = not decode or (chain and split > BLOCK_S) or early
    # Decode rows only (ops.split_warm).
    warm = warm if warm is not None and warm[1] > 0 and decode and pdl.hopper(q.device) else None
    threads, warm_steps = 32 * tuning.get("num_warps", 4), 1
    if warm is not None:
        if warm[0].dtype != torch.uint8 or warm[0].data_ptr() % 16 or warm[1] % 16 or warm[1] > warm[0].numel():
            raise ValueError("warm: a 16-byte aligned uint8 tensor and a multiple of 16 of its bytes")
        share = (triton.cdiv(warm[1], kv * nsplit * blocks) + 15) // 16 * 16  # a program's, as _warm_share cuts it
        warm_steps = triton.cdiv(share, threads * 4096)
    grid = (kv, nsplit, blocks)
    # A sliding layer's lower key limit: its own specialisation; full layers launch the kernel they always did.
    windowed = {} if low is None else dict(low_ptr=low.contiguous(), WINDOWED=True)
    _split_kernel[grid](q, k, v, limit, part_o, part_ml, t, nsplit, limit.stride(0), q.stride(0),
                        q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), scale,
                        kn, vn, kn.stride(0), kn.stride(1), vn.stride(0), vn.stride(1), qw, kw, cos,
                        sin, pos, eps, G=g, D=d, R=cos.shape[-1] if fresh else d, BLOCK_R=block_r,
                        BLOCK_S=block_s, **sizing,
                        FRESH=fresh is not None, ROWS=rows, EARLY=early,
                        warm_ptr=warm[0] if warm else k, warm_bytes=warm[1] if warm else 0, WARM=warm is not None,
                        WARM_STEPS=warm_steps, WARM_THREADS=threads,
                        **block_trace.args("split", grid, q),
                        **launch_options(q.device, launch_early, trigger=chain), **tuning, **windowed)
    dsplit, chunk = merge_shape(nsplit, d)
    grid = (kv, t * g, dsplit)
    # A gated output (Qwen3.5): its own specialisation; ungated attention launches the merge it always did.
    gated = {} if gate is None else dict(gate_ptr=gate, stride_gt=gate.stride(0), GATED=True)
    _merge_kernel[grid](part_o, part_ml, out, limit, limit.stride(0), t, nsplit, out.stride(0), G=g, D=d,
                        DB=d // dsplit, BLOCK_R=rows, SPLITS_P2=triton.next_power_of_2(nsplit), CHUNK=chunk, **sizing,
                        num_warps=MERGE_WARPS,
                        **block_trace.args("merge", grid, q),
                        **launch_options(q.device, launch_early or chain, trigger=True), **gated)
    return out
