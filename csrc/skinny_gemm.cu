// Skinny bf16 GEMM for batch-size-1 steps: out[M, N] = x[M, K] @ W[N, K]^T, M <= 16, fp32 accumulation.
//
// At M = 1..16 the product is a weight stream, so the kernel is built around the loads of W:
// every thread issues 16-byte loads of W straight into the register layout of the tensor-core
// instruction mma.m16n8k16, with no shared-memory staging. Tokens are the mma's rows (A, padded
// to 16 with zeros) and 8 rows of W are its columns (B). Within each 32-wide chunk of K a
// thread's 16 bytes are 8 consecutive k; since the dot product does not care about the order of
// k, those 8 are mapped onto the mma's k slots {2t, 2t+1, 2t+8, 2t+9} of two mmas, and x is loaded
// with the same mapping, so both operands come from plain vector loads.
//
// Work: a block is NW warps on one 8-row tile of W; each warp takes a slice of K, the warps add up
// through shared memory, and with S > 1 the K range is also split over S blocks whose fp32 partial
// tiles meet in a workspace: the last block of a tile to finish (an atomic counter) adds the S
// partials in a fixed order, writes bf16 and resets the counter. No memset, deterministic sums.
//
// Fusions (MODE bits): SWIGLU (the activation of an MLP's [gate; up] product in the epilogue), NORM (an RMSNorm
// without weight folded in: x is the residual stream h, the mma reads h itself, and the epilogue scales each
// token's sums by rsqrt(mean(h^2) + eps), the squares summed from the same loads of h; the model folds the norm's
// weight into W's columns), RESID (the residual add in the epilogue: out = bf16(residual + bf16(x @ W^T)), as
// the unfused product then add rounds). A layer's two norms and two residual adds then cost no kernels of their
// own. (Loading the norm's weight beside x instead cost 16 registers at unroll 4, two fewer blocks per SM and
// more than the norm kernel it replaced: benchmarks/2026-11-23-h100/session8/.)
// At one row two more fusions hand the norm's sum of squares from the product that writes the residual stream to the
// product that normalises it: SQUARES (with RESID) also writes, per tile, the sum of the squares of each token's 8
// outputs as rounded, and SCALE (one token) takes the norm's scale from those partial sums instead of summing the
// squares of its x in its loop (NORM). The add + norm kernel between o and gate/up then goes, and gate/up keeps the
// plain product's loop (with NORM inside, it streamed at 2766 GB/s against 2971: benchmarks/2026-11-25-h100/).

#include <cuda_bf16.h>
#include <stdint.h>

namespace {

// L2 prefetch size of the weight loads (PTX .L2::64B / 128B / 256B; 0: none): the load also asks L2 for the rest
// of its block, which the warp's next loads of the row read. H100 graph replays (benchmarks/2026-11-23-h100/
// session13/), ms, none / 256 bytes / 128 bytes: with 8-row tiles decode 3.264 / 3.232 / 3.188, verify 8 rows
// 3.465 / 3.427 / 3.377, ctx 8192 3.766 / 3.734 / 3.691; with 16-row tiles verify 16 rows 3.548 / 3.633 / 3.487,
// DFlash draft 0.747 / 0.770 / 0.740. Comparisons: DFLASH_GEMM_NVCC_FLAGS=-DWIDE=n (both), -DWIDE_TILE8=n or
// -DWIDE_TILE16=n.
#ifdef WIDE
#define WIDE_TILE8 WIDE
#define WIDE_TILE16 WIDE
#endif
#ifndef WIDE_TILE8
#define WIDE_TILE8 128
#endif
#ifndef WIDE_TILE16
#define WIDE_TILE16 128
#endif

// L1 policy of the weight loads, read once per step: evict-first (L1_POLICY 1, the default), no allocation (0), or
// none (2). H100 graph replays with 128-byte L2 blocks (session13/l1/), ms, no allocation / evict-first / none:
// decode 3.190 / 3.165 / 3.279, verify 16 rows 3.488 / 3.474 / 3.614, verify 8 rows 3.386 / 3.349 / 3.504,
// ctx 8192 3.696 / 3.675 / 3.734, DFlash draft 0.741 / 0.737 / 0.759.
// Comparisons: DFLASH_GEMM_NVCC_FLAGS=-DL1_POLICY=n.
#ifndef L1_POLICY
#define L1_POLICY 1
#endif
#if L1_POLICY == 1
#define LD_W "ld.global.nc.L1::evict_first"
#elif L1_POLICY == 2
#define LD_W "ld.global.nc"
#else
#define LD_W "ld.global.nc.L1::no_allocate"
#endif

// Batches of W (U chunks each) that each warp of a 16-row tile asks for before its wait for the previous kernel: 1
// (the loop's first) or 2 (the second too, into the registers the loop's next batch uses, and the first batch's
// products peeled off the loop). More of the weight stream is then in flight across the kernel boundary. H100 graph
// replays, ms, 1 -> 2 (benchmarks/2026-11-23-h100/session14/), registers unchanged: verify 16 rows 3.481 -> 3.453,
// DFlash draft 0.740 -> 0.737. The 8-row tiles (skinny_tile) keep 1: with 2 (built as in 643b0b0) they needed 80
// registers instead of 72 (4-warp blocks: 6 per SM instead of 7), decode 3.162 -> 3.245 ms, verify 8 rows 3.356 ->
// 3.473; capped at 72 still 3.199 and 3.426; and any one decode product alone with 2 was slower or the same (qkv
// +20 us, gate_up +25, o 0). Comparisons: DFLASH_GEMM_NVCC_FLAGS=-DPRE_DEPTH=1.
#ifndef PRE_DEPTH
#define PRE_DEPTH 2
#endif

// L2 policy of the weight loads: evict-first (L2_POLICY 1: read once per step, they then leave L2 before the
// activations, the KV cache and the next weight's warmed rows) or none (0, the default). Worth 8% to the
// megakernel's bulk copies, but neutral here: H100 graph replays, ms, none / evict-first
// (benchmarks/2026-11-25-h100/l2_policy/): decode 3.160-3.161 / 3.162-3.164, verify 16 rows 3.447-3.455 /
// 3.447-3.452, ctx 8192 3.683 / 3.678-3.683, DFlash draft 0.736-0.738 / 0.729-0.731. Comparisons:
// DFLASH_GEMM_NVCC_FLAGS=-DL2_POLICY=n.
#ifndef L2_POLICY
#define L2_POLICY 0
#endif

// One 16-byte load of W with the L1 policy above, the L2 policy and the L2 block suffix HINT (a string: "" or
// ".L2::128B", ...).
#if L2_POLICY
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));  // pure: hoisted and shared
  return policy;
}
#define LOAD_W(v, p, HINT)                                                                               \
  asm volatile(LD_W ".L2::cache_hint" HINT ".v4.u32 {%0, %1, %2, %3}, [%4], %5;"                       \
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)                                             \
               : "l"(p), "l"(l2_evict_first()))
#else
#define LOAD_W(v, p, HINT) \
  asm volatile(LD_W HINT ".v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p))
#endif

template <int BLOCK>
__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  if (BLOCK == 256) LOAD_W(v, p, ".L2::256B");
  else if (BLOCK == 128) LOAD_W(v, p, ".L2::128B");
  else if (BLOCK == 64) LOAD_W(v, p, ".L2::64B");
  else LOAD_W(v, p, "");
  return v;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Programmatic dependent launch (Hopper): the next kernel may start once every block of this one has
// signalled, and `wait` blocks until the previous kernel has finished and its writes are visible. Weights
// never depend on the previous kernel, so their first loads are issued before the wait and overlap its tail.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// TRACE=1 (a diagnostic build, engine/kernels/block_trace.py): each block's thread 0 records %globaltimer at its
// start, after its wait and at its end, then its SM and index, into the launch's own buffer (the `trace` argument).
#ifndef TRACE
#define TRACE 0
#endif

#if TRACE
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned long long* block_times() {  // thread 0's start and time after its wait (TRACE)
  __shared__ unsigned long long t[2];
  return t;
}
#endif

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if TRACE
  if (threadIdx.x == 0) block_times()[1] = now_ns();
#endif
}

// A block's record (TRACE): thread 0 is in warp 0, which every kernel here keeps to its end.
// The times wait in shared memory, not registers: a traced build keeps the plain build's blocks per SM.
struct BlockTrace {
#if TRACE
  unsigned long long* trace;
  __device__ __forceinline__ explicit BlockTrace(unsigned long long* t) : trace(t) {
    if (threadIdx.x == 0) block_times()[0] = block_times()[1] = now_ns();
  }
  __device__ __forceinline__ ~BlockTrace() {
    if (!trace || threadIdx.x != 0) return;
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const unsigned block = blockIdx.y * gridDim.x + blockIdx.x;
    unsigned long long* rec = trace + 5 * block;
    rec[0] = block_times()[0];
    rec[1] = block_times()[1];
    rec[2] = now_ns();
    rec[3] = sm;
    rec[4] = block;
  }
#else
  __device__ __forceinline__ explicit BlockTrace(unsigned long long*) {}
#endif
};

// The L2 warm-up for the product read next: up to two byte ranges (a weight's first rows, or the first rows of
// each half of [gate; up]) that each block, once its own loads are done, asks to be fetched into L2 (its share of
// them). The next product then finds its first rows in L2 when it starts. A hint: nothing waits on it. Measured on
// the H100 (benchmarks/2026-11-23-h100/session4/): a few MB win, more loses, and so does warming only from the blocks
// that finish last.
// (The attention's split asks for o's rows the same way, from Triton: dflash_cli/engine/kernels/attention.py.)
struct Warm {
  const char* a;
  const char* b;
  int a_bytes, b_bytes;
};

__device__ __forceinline__ void warm_share(const char* base, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (bytes <= 0 || (threadIdx.x >> 5) != 0) return;
  const int blocks = gridDim.x * gridDim.y, block = blockIdx.y * gridDim.x + blockIdx.x;
  const int share = ((bytes + blocks - 1) / blocks + 15) & ~15;  // 16-byte granules, as the instruction needs
  const int start = block * share, end = min(bytes, start + share);
  constexpr int PIECE = 4096;
  for (int o = start + (threadIdx.x & 31) * PIECE; o < end; o += 32 * PIECE)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + o), "r"(min(PIECE, end - o)) : "memory");
#endif
}

__device__ __forceinline__ void warm_l2(const Warm& warm) {
  warm_share(warm.a, warm.a_bytes);
  warm_share(warm.b, warm.b_bytes);
}

// A thread's place in a launch: lane, quad row g and column t (the mma fragment coordinates), its tile
// (blockIdx.x) and K split (blockIdx.y), and the range [c0, c1) of 32-wide K chunks its warp takes: the K range is
// cut over splits x warps.
// align (tile16: its U): the range is cut in whole batches of `align` chunks (the last part takes any rest, where
// K / 32 is not a multiple of align), so that no other warp ends on a short batch, which tile16 runs as a loop of
// single chunks, a memory latency each (down_proj: 304 chunks over 8 warps are 38 each, or 40 and 36 in batches of
// 4). The longest warp may get up to align - 1 chunks more than an even cut gives it (Qwen3's default plans: at most
// 2; a plan of unroll 8 over 8 warps at K = 2560 would get 16 against 10). skinny_tile asks for a short last
// batch with the batch before instead (below); in tile16 that took 144 registers instead of 128 (one 8-warp block an
// SM). H100 graph replays with both (benchmarks/2026-11-25-h100/session38/aligned.log), ms, before -> after: decode
// 3.108/3.109 -> 3.082/3.082, verify 16 rows 3.418/3.422 -> 3.394/3.398, verify 8 rows 3.291/3.289 -> 3.278/3.276,
// DFlash draft 0.703 -> 0.700, decode at ctx 8192 3.423/3.424 -> 3.407/3.408, verify 16 rows there 3.938/3.943 ->
// 3.917/3.918.
struct Place {
  int lane, warp, nw, g, t, tile, split, splits, c0, c1;
  __device__ __forceinline__ explicit Place(int K, int align = 1)
      : lane(threadIdx.x & 31), warp(threadIdx.x >> 5), nw(blockDim.x >> 5), g(lane >> 2), t(lane & 3),
        tile(blockIdx.x), split(blockIdx.y), splits(gridDim.y) {
    const int chunks = K >> 5, parts = splits * nw, part = split * nw + warp;
    if (align == 1) {
      c0 = (int)((long long)chunks * part / parts);
      c1 = (int)((long long)chunks * (part + 1) / parts);
    } else {
      const int units = chunks / align;
      c0 = align * (int)((long long)units * part / parts);
      c1 = part + 1 == parts ? chunks : align * (int)((long long)units * (part + 1) / parts);
    }
  }
};

// Adds the warps' partial tiles (F floats per lane, the same fragment layout in every warp) through shared
// memory red [NW][32][F] into warp 0's acc. False in the other warps, which are then done.
template <int F>
__device__ __forceinline__ bool sum_warps(float* acc, float* red, const Place& p) {
  if (p.nw == 1) return true;
  float* mine = red + (p.warp * 32 + p.lane) * F;
#pragma unroll
  for (int i = 0; i < F; ++i) mine[i] = acc[i];
  __syncthreads();
  if (p.warp != 0) return false;
  for (int v = 1; v < p.nw; ++v) {
    const float* other = red + (v * 32 + p.lane) * F;
#pragma unroll
    for (int i = 0; i < F; ++i) acc[i] += other[i];
  }
  return true;
}

// K splits over blocks: each block's partial tile goes to its slot of the workspace (splits x tiles x 32 x F);
// the last block of the tile to arrive (an atomic counter) adds every slot in a fixed order into acc, so the
// result does not depend on which block came last, and resets the counter (no memset). False in the others.
template <int F>
__device__ __forceinline__ bool gather_splits(float* acc, float* __restrict__ ws, int* __restrict__ counters,
                                              const Place& p) {
  if (p.splits == 1) return true;
  const size_t lane_slot = ((size_t)p.tile * 32 + p.lane) * F, per_split = (size_t)gridDim.x * 32 * F;
  float* slot = ws + (size_t)p.split * per_split + lane_slot;
#pragma unroll
  for (int i = 0; i < F; i += 4)
    *reinterpret_cast<float4*>(slot + i) = make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
  __threadfence();  // this warp's partial is visible device-wide before the tile's counter moves
  __syncwarp();
  int last = 0;
  if (p.lane == 0) last = atomicAdd(counters + p.tile, 1) == p.splits - 1;
  if (!__shfl_sync(0xffffffffu, last, 0)) return false;
  __threadfence();
#pragma unroll
  for (int i = 0; i < F; ++i) acc[i] = 0.f;
  for (int s = 0; s < p.splits; ++s) {
    const float* part = ws + (size_t)s * per_split + lane_slot;
#pragma unroll
    for (int i = 0; i < F; i += 4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(part + i));
      acc[i] += v.x; acc[i + 1] += v.y; acc[i + 2] += v.z; acc[i + 3] += v.w;
    }
  }
  if (p.lane == 0) counters[p.tile] = 0;
  return true;
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// silu(gate) * up rounded as the unfused path rounds: the GEMM's bf16 outputs, then silu in bf16, then the product.
__device__ __forceinline__ __nv_bfloat162 swiglu2(float g0, float g1, float u0, float u1) {
  g0 = round_bf16(g0); g1 = round_bf16(g1);
  const float s0 = round_bf16(g0 / (1.f + __expf(-g0))), s1 = round_bf16(g1 / (1.f + __expf(-g1)));
  return __floats2bfloat162_rn(s0 * round_bf16(u0), s1 * round_bf16(u1));
}

// The residual add as the unfused path rounds it: the product rounded to bf16, then the sum rounded.
__device__ __forceinline__ __nv_bfloat162 add_resid2(__nv_bfloat162 res, float a0, float a1) {
  const float2 r = __bfloat1622float2(res);
  return __floats2bfloat162_rn(r.x + round_bf16(a0), r.y + round_bf16(a1));
}

enum : int { SWIGLU_BIT = 1, NORM_BIT = 2, RESID_BIT = 4, SQUARES_BIT = 8, SCALE_BIT = 16 };

// SCALE: the block copies the partial sums into shared memory (sq_s) right after the wait, asynchronously: the copy
// holds no registers through the loop and is done long before the epilogue. (Loaded from global memory in the
// epilogue instead, after an L1 prefetch, they cost each block a few L2 round trips behind the weight stream: decode
// 3.126 -> 3.296 ms.)
__device__ __forceinline__ void copy_squares(float* sq_s, const float* sq, int tiles) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  for (int i = threadIdx.x; i < (tiles >> 2); i += blockDim.x) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(sq_s + 4 * i));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(sq + 4 * i) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

__device__ __forceinline__ void squares_copied() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
  __syncthreads();
}

// SCALE: the one token's rsqrt(mean(h^2) + eps) from the `tiles` partial sums in shared memory, in a fixed order:
// every lane of the warp gets the same value.
__device__ __forceinline__ float scale_from_squares(const float* sq_s, int tiles, int K, float eps, const Place& p) {
  float s = 0.f;
  for (int j = p.lane; j < tiles; j += 32) s += sq_s[j];
#pragma unroll
  for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return rsqrtf(s / (float)K + eps);
}

// SQUARES: a token's sum of squares of the quad's 8 outputs (2 a lane), in every lane of the quad.
__device__ __forceinline__ float quad_squares(__nv_bfloat162 o, bool real) {
  const float2 f = __bfloat1622float2(o);
  float s = real ? fmaf(f.x, f.x, f.y * f.y) : 0.f;
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  return s + __shfl_xor_sync(0xffffffffu, s, 2);
}

// NORM: the squares of eight k of a token's h (a fragment past M is zeros and adds nothing).
__device__ __forceinline__ void add_squares(uint4 h, float& ss) {
  const __nv_bfloat162* hp = reinterpret_cast<const __nv_bfloat162*>(&h);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(hp[i]);
    ss = fmaf(f.x, f.x, fmaf(f.y, f.y, ss));
  }
}

// NORM: the quad's lanes hold squares of disjoint k of token g (after the warp and split sums): their total
// gives the token's rsqrt(mean(h^2) + eps), the scale of its sums.
__device__ __forceinline__ float norm_scale(float ss, int K, float eps) {
  ss += __shfl_xor_sync(0xffffffffu, ss, 1);
  ss += __shfl_xor_sync(0xffffffffu, ss, 2);
  return rsqrtf(ss / (float)K + eps);
}

// aux: the residual [M, N] with RESID; eps: the norm's, with NORM or SCALE. sq: with SQUARES, the per-tile sums of
// squares the epilogue writes ([M, N / 8]); with SCALE, those the product before wrote, sq_tiles of them (M == 1).
// HIGH: tokens 8..15 exist (M > 8); otherwise the upper half of A is zeros and never loaded.
// SWIGLU: W is [gate; up] (N rows, N/2 each) and out is silu(x @ gate^T) * (x @ up^T) [M, N/2]: tile j reads
// gate rows 4j..4j+3 as its columns 0..3 and the matching up rows as 4..7, so lanes t and t + 2 of a quad
// hold a gate and its up after the reduction, and the activation costs no kernel of its own.
template <bool HIGH, int U, int MODE>
__device__ __forceinline__ void skinny_tile(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                            __nv_bfloat16* __restrict__ out, float* __restrict__ ws,
                                            int* __restrict__ counters, int M, int N, int K, const Warm& warm,
                                            const __nv_bfloat16* __restrict__ aux, float eps, float* __restrict__ sq,
                                            int sq_tiles) {
  constexpr bool SWIGLU = MODE & SWIGLU_BIT, NORM = MODE & NORM_BIT, RESID = MODE & RESID_BIT;
  constexpr bool SQUARES = MODE & SQUARES_BIT, SCALE = MODE & SCALE_BIT;
  static_assert(!(SCALE && (NORM || HIGH)) && (!SQUARES || RESID), "SCALE: one token, no NORM; SQUARES: with RESID");
  constexpr int F = NORM ? 8 : 4;  // per lane: the 4 sums, and with NORM the squares of tokens g, g + 8 (and 2 pad)
  extern __shared__ float red[];  // [NW][32][F]
  const Place p(K);
  const int g = p.g, t = p.t, tile = p.tile, c1 = p.c1;

  const int wr = SWIGLU ? (g < 4 ? tile * 4 + g : (N >> 1) + tile * 4 + g - 4) : tile * 8 + g;
  const __nv_bfloat16* wrow = w + (size_t)wr * K + t * 8;
  const bool lo_ok = g < M, hi_ok = HIGH && g + 8 < M;
  const __nv_bfloat16* xlo = x + (size_t)(lo_ok ? g : 0) * K + t * 8;
  const __nv_bfloat16* xhi = x + (size_t)(hi_ok ? g + 8 : 0) * K + t * 8;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  float ss[2] = {0.f, 0.f};
  int c = p.c0;
  // W is double-buffered: the next U chunks are in flight while the current ones are multiplied.
  // (Double-buffering x as well was measured slower: 13.4 vs 10.9 us on o_proj, more registers.)
  // A warp's last batch may hold fewer than U chunks (down_proj: 38 a warp): it is asked for with the batch before,
  // its missing chunks zeros, which add nothing. (A loop of single chunks after the batches waited a memory latency
  // per chunk at the end of every warp: decode 3.108 -> 3.085 ms without it, session38/aligned.log.)
  uint4 wv[U];
#pragma unroll
  for (int u = 0; u < U; ++u) wv[u] = c + u < c1 ? load_stream<WIDE_TILE8>(wrow + (size_t)(c + u) * 32) : zero;
  pdl_launch_dependents();
  pdl_wait();  // x (and the output buffer) belong to earlier kernels: nothing of them is touched before this
  float* sq_s = red + p.nw * 32 * F;  // SCALE: the partial sums, after the warps' sums
  if (SCALE) copy_squares(sq_s, sq, sq_tiles);
  // RESID: the residual is loaded now, its latency hidden under the product's instead of added to the epilogue's.
  const int col = tile * 8 + 2 * t;
  __nv_bfloat162 res[2];
  if (RESID) {
    res[0] = lo_ok ? *reinterpret_cast<const __nv_bfloat162*>(aux + (size_t)g * N + col) : __nv_bfloat162();
    res[1] = hi_ok ? *reinterpret_cast<const __nv_bfloat162*>(aux + (size_t)(g + 8) * N + col) : __nv_bfloat162();
  }
  // One batch from chunk c (wv): x's chunks loaded (zeros past c1 where `partial`), the next batch asked for, the
  // products.
  auto batch = [&](bool partial) {
    uint4 xl[U], xh[U], nx[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool in = !partial || c + u < c1;
      xl[u] = lo_ok && in ? __ldg(reinterpret_cast<const uint4*>(xlo + (c + u) * 32)) : zero;
      xh[u] = hi_ok && in ? __ldg(reinterpret_cast<const uint4*>(xhi + (c + u) * 32)) : zero;
    }
    const int next = c + U;
    const bool more = next < c1;
    if (more) {
      if (next + U <= c1) {
#pragma unroll
        for (int u = 0; u < U; ++u) nx[u] = load_stream<WIDE_TILE8>(wrow + (size_t)(next + u) * 32);
      } else {
#pragma unroll
        for (int u = 0; u < U; ++u)
          nx[u] = next + u < c1 ? load_stream<WIDE_TILE8>(wrow + (size_t)(next + u) * 32) : zero;
      }
    }
    if (NORM) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        add_squares(xl[u], ss[0]);
        if (HIGH) add_squares(xh[u], ss[1]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      mma_bf16(acc, xl[u].x, xh[u].x, xl[u].y, xh[u].y, wv[u].x, wv[u].y);
      mma_bf16(acc, xl[u].z, xh[u].z, xl[u].w, xh[u].w, wv[u].z, wv[u].w);
    }
    if (more) {
#pragma unroll
      for (int u = 0; u < U; ++u) wv[u] = nx[u];
    }
  };
  for (; c + U <= c1; c += U) batch(false);
  if (c < c1) batch(true);

  warm_l2(warm);
  float all[F];
#pragma unroll
  for (int i = 0; i < 4; ++i) all[i] = acc[i];
  if (NORM) {
    all[4] = ss[0]; all[5] = ss[1];
#pragma unroll
    for (int i = 6; i < F; ++i) all[i] = 0.f;
  }
  if (SCALE) squares_copied();
  if (!sum_warps<F>(all, red, p) || !gather_splits<F>(all, ws, counters, p)) return;
  // all[0..1]: token g, columns 2t, 2t+1 of the tile; all[2..3]: token g+8.
  if (NORM) {
    const float r0 = norm_scale(all[4], K, eps), r1 = norm_scale(all[5], K, eps);
    all[0] *= r0; all[1] *= r0; all[2] *= r1; all[3] *= r1;
  }
  if (SCALE) {  // here, not before the warps' sum: there it cost 2 registers (a block less per SM at 4 warps)
    const float r = scale_from_squares(sq_s, sq_tiles, K, eps, p);
    all[0] *= r; all[1] *= r;
  }
  if (SWIGLU) {
    float up[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) up[i] = __shfl_xor_sync(0xffffffffu, all[i], 2);  // lane t < 2 gets t + 2's
    if (t >= 2) return;
    const int half = N >> 1, c = tile * 4 + 2 * t;
    if (g < M) *reinterpret_cast<__nv_bfloat162*>(out + (size_t)g * half + c) = swiglu2(all[0], all[1], up[0], up[1]);
    if (HIGH && g + 8 < M)
      *reinterpret_cast<__nv_bfloat162*>(out + (size_t)(g + 8) * half + c) = swiglu2(all[2], all[3], up[2], up[3]);
    return;
  }
  if (RESID) {
    const __nv_bfloat162 o0 = add_resid2(res[0], all[0], all[1]);
    if (g < M) *reinterpret_cast<__nv_bfloat162*>(out + (size_t)g * N + col) = o0;
    if (SQUARES) {
      const float s0 = quad_squares(o0, g < M);
      if (t == 0 && g < M) sq[(size_t)g * gridDim.x + tile] = s0;
    }
    if (HIGH) {
      const __nv_bfloat162 o1 = add_resid2(res[1], all[2], all[3]);
      if (g + 8 < M) *reinterpret_cast<__nv_bfloat162*>(out + (size_t)(g + 8) * N + col) = o1;
      if (SQUARES) {
        const float s1 = quad_squares(o1, g + 8 < M);
        if (t == 0 && g + 8 < M) sq[(size_t)(g + 8) * gridDim.x + tile] = s1;
      }
    }
    return;
  }
  if (g < M)
    *reinterpret_cast<__nv_bfloat162*>(out + (size_t)g * N + col) = __floats2bfloat162_rn(all[0], all[1]);
  if (HIGH && g + 8 < M)
    *reinterpret_cast<__nv_bfloat162*>(out + (size_t)(g + 8) * N + col) = __floats2bfloat162_rn(all[2], all[3]);
}


// The 16-row variant: W is the mma's A operand, so a warp's tile is 16 rows of W (rows g and g + 8 of it per
// thread, the k mapping as above) and the tokens are B's 8 columns, twice with 9..16 tokens. Every x fragment
// then serves 16 rows of W instead of 8: per chunk a thread loads as many bytes of x as of W at 16 tokens
// (twice as many in the kernel above), half as many at 8 or fewer. Warps split K as above.
// SWIGLU: tile j reads gate rows 8j..8j+7 as rows 0..7 and the matching up rows as 8..15, so each thread
// holds a gate and its up (C rows g and g + 8) after the reduction.
template <int TOK, int U, int MODE>
__device__ __forceinline__ void tile16(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                       __nv_bfloat16* __restrict__ out, float* __restrict__ ws,
                                       int* __restrict__ counters, int M, int N, int K, const Warm& warm,
                                       const __nv_bfloat16* __restrict__ aux, float eps, float*, int) {
  constexpr bool SWIGLU = MODE & SWIGLU_BIT, NORM = MODE & NORM_BIT, RESID = MODE & RESID_BIT;
  constexpr int A = TOK > 8 ? 8 : 4;  // sums per lane: tokens 0..7, and 8..15 with TOK 16
  constexpr int F = NORM ? A + 4 : A;  // with NORM, the squares of tokens g and g + 8 (and 2 pad)
  extern __shared__ float red[];  // [NW][32][F]
  const Place p(K, U);
  const int g = p.g, t = p.t, tile = p.tile, c1 = p.c1;
  const int r0 = SWIGLU ? tile * 8 + g : tile * 16 + g, r1 = SWIGLU ? (N >> 1) + tile * 8 + g : r0 + 8;
  const __nv_bfloat16* wlo = w + (size_t)r0 * K + t * 8;
  const __nv_bfloat16* whi = w + (size_t)r1 * K + t * 8;
  const bool lo_ok = g < M, hi_ok = TOK > 8 && g + 8 < M;
  const __nv_bfloat16* xlo = x + (size_t)(lo_ok ? g : 0) * K + t * 8;
  const __nv_bfloat16* xhi = x + (size_t)(hi_ok ? g + 8 : 0) * K + t * 8;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  // Rows r0 and r1 of W's U chunks from chunk `from`, into l and h.
  auto fetch = [&](uint4(&l)[U], uint4(&h)[U], int from) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      l[u] = load_stream<WIDE_TILE16>(wlo + (size_t)(from + u) * 32);
      h[u] = load_stream<WIDE_TILE16>(whi + (size_t)(from + u) * 32);
    }
  };
  uint4 wl[U], wh[U], pl[U], ph[U];  // pl, ph: the second batch, when asked for before the wait
  int c = p.c0;
  if (c + U <= c1) fetch(wl, wh, c);
  const bool pre = PRE_DEPTH > 1 && c + 2 * U <= c1;  // the second batch asked for before the wait too
  if (pre) fetch(pl, ph, c + U);
  pdl_launch_dependents();
  pdl_wait();

  float acc[2][4] = {};
  float(&lo)[4] = acc[0];  // tokens 0..7
  float(&hi)[4] = acc[1];  // tokens 8..15
  float ss[2] = {0.f, 0.f};
  // One batch: x's chunks c.. loaded, W's next batch asked for (unless `fetched` before the wait), the products.
  auto batch = [&](uint4(&nl)[U], uint4(&nh)[U], bool fetched) {
    uint4 xl[U], xh[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      xl[u] = lo_ok ? __ldg(reinterpret_cast<const uint4*>(xlo + (c + u) * 32)) : zero;
      if (TOK > 8) xh[u] = hi_ok ? __ldg(reinterpret_cast<const uint4*>(xhi + (c + u) * 32)) : zero;
    }
    const bool more = c + 2 * U <= c1;
    if (more && !fetched) fetch(nl, nh, c + U);
    if (NORM) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        add_squares(xl[u], ss[0]);
        if (TOK > 8) add_squares(xh[u], ss[1]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      mma_bf16(lo, wl[u].x, wh[u].x, wl[u].y, wh[u].y, xl[u].x, xl[u].y);
      mma_bf16(lo, wl[u].z, wh[u].z, wl[u].w, wh[u].w, xl[u].z, xl[u].w);
      if (TOK > 8) {
        mma_bf16(hi, wl[u].x, wh[u].x, wl[u].y, wh[u].y, xh[u].x, xh[u].y);
        mma_bf16(hi, wl[u].z, wh[u].z, wl[u].w, wh[u].w, xh[u].z, xh[u].w);
      }
    }
    if (more) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        wl[u] = nl[u];
        wh[u] = nh[u];
      }
    }
  };
  if (pre) {
    batch(pl, ph, true);
    c += U;
  }
  for (; c + U <= c1; c += U) {
    uint4 nl[U], nh[U];
    batch(nl, nh, false);
  }
  for (; c < c1; ++c) {
    const uint4 a = load_stream<WIDE_TILE16>(wlo + (size_t)c * 32);
    const uint4 a2 = load_stream<WIDE_TILE16>(whi + (size_t)c * 32);
    const uint4 b = lo_ok ? __ldg(reinterpret_cast<const uint4*>(xlo + c * 32)) : zero;
    if (NORM) add_squares(b, ss[0]);
    mma_bf16(lo, a.x, a2.x, a.y, a2.y, b.x, b.y);
    mma_bf16(lo, a.z, a2.z, a.w, a2.w, b.z, b.w);
    if (TOK > 8) {
      const uint4 b2 = hi_ok ? __ldg(reinterpret_cast<const uint4*>(xhi + c * 32)) : zero;
      if (NORM) add_squares(b2, ss[1]);
      mma_bf16(hi, a.x, a2.x, a.y, a2.y, b2.x, b2.y);
      mma_bf16(hi, a.z, a2.z, a.w, a2.w, b2.z, b2.w);
    }
  }

  // Token j's outputs are rows n and n + 8 of the tile: (j, v) in the epilogue is token tok + j (j = 0, 1, 8, 9).
  // RESID: warp 0 (which stores) loads their residuals here, their latency under the warm-up and the warps' sum
  // (at the kernel's start they held 14 more registers through the loop: one block per SM instead of two).
  const int tok = 2 * t, n = tile * 16 + g;
  const int js[4] = {0, 1, 8, 9};
  constexpr int J = TOK > 8 ? 4 : 2;
  __nv_bfloat162 res[J];  // token j's residuals at rows n and n + 8
  if (RESID && p.warp == 0) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const size_t at = (size_t)(tok + js[j]) * N + n;
      res[j] = tok + js[j] < M ? __halves2bfloat162(aux[at], aux[at + 8]) : __nv_bfloat162();
    }
  }
  warm_l2(warm);
  float all[F];
#pragma unroll
  for (int i = 0; i < A; ++i) all[i] = acc[i / 4][i % 4];
  if (NORM) {
    all[A] = ss[0]; all[A + 1] = ss[1]; all[A + 2] = 0.f; all[A + 3] = 0.f;
  }
  if (!sum_warps<F>(all, red, p) || !gather_splits<F>(all, ws, counters, p)) return;
#pragma unroll
  for (int i = 0; i < A; ++i) acc[i / 4][i % 4] = all[i];
  // C fragment: [0], [1] are A row g for tokens 2t, 2t + 1; [2], [3] row g + 8 (lo: tokens 0..7, hi: 8..15).
  if (NORM) {
    // Lane g * 4 + j holds token g's scale (and g + 8's): tokens 2t and 2t + 1 are at lanes 8t and 8t + 4.
    const float rg = norm_scale(all[A], K, eps), rh = norm_scale(all[A + 1], K, eps);
    const float s0 = __shfl_sync(0xffffffffu, rg, 8 * t), s1 = __shfl_sync(0xffffffffu, rg, 8 * t + 4);
    const float s8 = __shfl_sync(0xffffffffu, rh, 8 * t), s9 = __shfl_sync(0xffffffffu, rh, 8 * t + 4);
    lo[0] *= s0; lo[2] *= s0; lo[1] *= s1; lo[3] *= s1;
    if (TOK > 8) {
      hi[0] *= s8; hi[2] *= s8; hi[1] *= s9; hi[3] *= s9;
    }
  }
  if (SWIGLU) {
    const int half = N >> 1, row = tile * 8 + g;
    const __nv_bfloat162 a = swiglu2(lo[0], lo[1], lo[2], lo[3]);
    if (tok < M) out[(size_t)tok * half + row] = a.x;
    if (tok + 1 < M) out[(size_t)(tok + 1) * half + row] = a.y;
    if (TOK > 8) {
      const __nv_bfloat162 b = swiglu2(hi[0], hi[1], hi[2], hi[3]);
      if (tok + 8 < M) out[(size_t)(tok + 8) * half + row] = b.x;
      if (tok + 9 < M) out[(size_t)(tok + 9) * half + row] = b.y;
    }
    return;
  }
  const float vals[4][2] = {{lo[0], lo[2]}, {lo[1], lo[3]}, {hi[0], hi[2]}, {hi[1], hi[3]}};
#pragma unroll
  for (int j = 0; j < J; ++j) {
    if (tok + js[j] >= M) continue;
    const size_t at = (size_t)(tok + js[j]) * N + n;
    const __nv_bfloat162 o = RESID ? add_resid2(res[j], vals[j][0], vals[j][1])
                                   : __floats2bfloat162_rn(vals[j][0], vals[j][1]);
    out[at] = o.x;
    out[at + 8] = o.y;
  }
}

}  // namespace

// Every entry has one signature: aux, eps, sq and sq_tiles are read only by the fusions that need them (see
// skinny_tile), trace only by a TRACE build.
#define GEMM_ENTRY(NAME, BODY, P, U, MODE)                                                                     \
  extern "C" __global__ void NAME(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* out, float* ws, \
                                  int* counters, int M, int N, int K, const char* warm_a, int warm_a_bytes,       \
                                  const char* warm_b, int warm_b_bytes, const __nv_bfloat16* aux, float eps,      \
                                  unsigned long long* trace, float* sq, int sq_tiles) {                           \
    BlockTrace traced(trace);                                                                                     \
    BODY<P, U, MODE>(x, w, out, ws, counters, M, N, K, Warm{warm_a, warm_b, warm_a_bytes, warm_b_bytes}, aux, eps, \
                     sq, sq_tiles);                                                                               \
  }

#define GEMM_MODES(PREFIX, BODY, P, U)                                       \
  GEMM_ENTRY(PREFIX##_u##U, BODY, P, U, 0)                                   \
  GEMM_ENTRY(PREFIX##_u##U##_swiglu, BODY, P, U, SWIGLU_BIT)                 \
  GEMM_ENTRY(PREFIX##_u##U##_norm, BODY, P, U, NORM_BIT)                     \
  GEMM_ENTRY(PREFIX##_u##U##_norm_swiglu, BODY, P, U, NORM_BIT | SWIGLU_BIT) \
  GEMM_ENTRY(PREFIX##_u##U##_resid, BODY, P, U, RESID_BIT)

GEMM_MODES(skinny_m8, skinny_tile, false, 2)
GEMM_MODES(skinny_m8, skinny_tile, false, 4)
GEMM_MODES(skinny_m8, skinny_tile, false, 8)

// The one-row hand-over of the norm's squares (SQUARES, SCALE): 8-row tiles only.
#define GEMM_SQUARES_MODES(PREFIX, U)                                                      \
  GEMM_ENTRY(PREFIX##_u##U##_resid_sq, skinny_tile, false, U, RESID_BIT | SQUARES_BIT)     \
  GEMM_ENTRY(PREFIX##_u##U##_scale, skinny_tile, false, U, SCALE_BIT)                      \
  GEMM_ENTRY(PREFIX##_u##U##_scale_swiglu, skinny_tile, false, U, SCALE_BIT | SWIGLU_BIT)

GEMM_SQUARES_MODES(skinny_m8, 2)
GEMM_SQUARES_MODES(skinny_m8, 4)
GEMM_SQUARES_MODES(skinny_m8, 8)
GEMM_MODES(skinny_m16, skinny_tile, true, 2)
GEMM_MODES(skinny_m16, skinny_tile, true, 4)
GEMM_MODES(skinny_m16, skinny_tile, true, 8)
GEMM_MODES(tile16_t8, tile16, 8, 2)
GEMM_MODES(tile16_t8, tile16, 8, 4)
GEMM_MODES(tile16_t8, tile16, 8, 8)
GEMM_MODES(tile16_t16, tile16, 16, 2)
GEMM_MODES(tile16_t16, tile16, 16, 4)
GEMM_MODES(tile16_t16, tile16, 16, 8)
