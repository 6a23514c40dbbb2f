// A whole decode step of a Qwen3 target (one token, batch size 1) in one persistent kernel.
//
// Why: a decode step is a stream of weights (8.04 GB for Qwen3-4B, 2.69 ms at the H100's copy bandwidth). Cut into
// ~300 kernels, each boundary is a dependency that drains the memory pipeline: the split kernels reached 85% of
// that floor, and every form of overlap at the boundaries was measured and lost (benchmarks/2026-11-2x-h100/).
// Here each SM runs one block for the whole step. Its producer warp streams the SM's share of every weight, and of
// the KV cache, into a ring of shared-memory slots with the bulk-copy engine (cp.async.bulk), in step order; it
// waits only for free slots, never for the other SMs. Eight consumer warps compute on the slots; a phase that needs
// the whole of an activation (the norm before q/k/v, attention, the merge of its splits, o, the norm before
// gate/up, down, the head) waits behind a grid-wide barrier, while the ring holds the next phases' weights.
//
// Status (benchmarks/2026-11-25-h100/megakernel/): correct (as close to float32 as the kernel-per-op step), but
// slower: 3.60 ms against 3.15 ms at ctx 1024 on the H100, so it is opt-in (DFLASH_MEGAKERNEL=1). Its trace
// (DecodeStep(trace=True)) puts the loss in the chain between products: the ring (160 KB, 7 us of an SM's share
// of HBM) covers less than the ~24 us a layer spends beyond its bytes' time in grid barriers (~1.1 us each to
// release, 1-3 us of arrival skew), attention and merge (2.7-3.9 us for the first loads after each barrier, cause
// open). Tried and measured worse or no better: an L2 prefetch warp running ahead of the producer, holding o's
// weights until attention or the merge is done, an arrival per warp, a flag per block, scratch in one allocation;
// fewer copies in flight (INFLIGHT=2) gained 4%, every load of a phase issued at once 11%, the merge's loads in
// groups of 8 another 4%.
//
// Phases of layer l (every SM): QKV  x = rms_norm(h) (weight folded into W), its tiles of [q; k; v] = x @ Wqkv^T
//                                ATTN its range of cache positions for every head (online softmax, exp2), the
//                                     fresh key from q/k/v (q/k RMSNorm + RoPE; the last SM writes k, v to the cache)
//                                MERGE its 32 dims of one head from every range's partial state
//                                O    h += attn @ Wo^T over its tiles
//                                GU   x = rms_norm(h); act = silu(x @ Wg^T) * (x @ Wu^T) over its tiles
//                                DOWN h += act @ Wd^T over its tiles
// then HEAD: x = rms_norm(h) * w_final, logits (float32) over its tiles of the vocabulary.
// Rounding follows the torch reference path (engine/ops.py) as the split kernels do: products and the norms' outputs
// to bf16, residual adds on the bf16 product, q/k norm and RoPE step by step.
//
// Which tiles each SM takes is a host table (engine/kernels/megakernel.py: balanced so every SM streams the same
// bytes). Launched cooperatively (all blocks resident): one block per SM, the ring filling its shared memory.

#include <cuda_bf16.h>
#include <stdint.h>

namespace {

typedef __nv_bfloat16 bf16;

constexpr int NCW = 8;                   // consumer warps
constexpr int CONSUMERS = NCW * 32;
constexpr int THREADS = CONSUMERS + 32;  // and a producer warp
constexpr int SLOT = 20480;              // bytes of a ring slot
constexpr int RING = NCW;                // slots: slot s belongs to consumer warp s % NCW in a product
constexpr int HD = 128;                  // head dim
constexpr int GQA = 4;                   // q heads per KV head
constexpr int KV_HEADS = NCW;            // one consumer warp per KV head in attention
constexpr int KV_ROW = KV_HEADS * HD * 2;             // bytes of one cache position (every KV head)
constexpr int CHUNK_POS = SLOT / KV_ROW;              // cache positions per slot
constexpr int KINDS = 4;                 // a layer's products: qkv, o, gate_up, down; the head is kind 4
constexpr int QKV = 0, O = 1, GU = 2, DOWN = 3, HEAD = 4;
constexpr int MAX_ROWS = 4;              // weight rows of a tile
constexpr int MERGE_SPLITS = 24;         // ranges per merge warp: up to NCW * 24 SMs
#ifndef MERGE_UNROLL
#define MERGE_UNROLL 8  // the merge's loads in flight at once, per group (divides MERGE_SPLITS): 3.545 ms a step
                       // against 3.695 with 24 (all at once), 3.560 with 4 (megakernel/merge_unroll.log)
#endif
constexpr long long SPIN_LIMIT = 1ll << 22;  // a wait this long is a stall: reported, and every wait gives up
constexpr int STALL_POLL = 1024;             // waits look for a reported stall this often

#ifndef INFLIGHT
#define INFLIGHT 2  // slots the producer has in flight (issued, not landed) at most (2: fastest of 1-4, 8)
#endif

#ifndef EVICT_FIRST
#define EVICT_FIRST 1  // weights and cache rows are read once a step: L2 evict-first
#endif

struct Product {  // how one kind of product is cut (host): a tile is `rows` whole rows, one slot
  int K;          // inner dimension
  int rows;       // weight rows of a tile (gate_up: half gate rows, half the matching up rows)
};

struct LayerW {
  const bf16* w[KINDS];  // qkv [(H + 2 KV) D, hidden], o [hidden, H D], gate_up [2 I, hidden], down [hidden, I]
  const bf16* q_norm;
  const bf16* k_norm;
  const bf16* in_norm;    // nullptr where folded into qkv's columns
  const bf16* post_norm;  // nullptr where folded into gate_up's
};

struct Params {
  const LayerW* layers;
  const bf16* embed;  // [vocab, hidden]
  const bf16* final_norm;
  const bf16* head;   // [vocab, hidden]
  const float* cos;   // [positions, HD]
  const float* sin;
  bf16* k_cache;      // [layers, max_len, KV, HD]
  bf16* v_cache;
  bf16* h;            // [hidden] residual stream
  bf16* qkv;          // [(H + 2 KV) HD]
  bf16* attn;         // [H HD]
  bf16* act;          // [I]
  float* part_o;      // [SMs, H, HD] a range's unnormalised output
  float* part_ml;     // [SMs, H, 2] its running max (log2 units) and sum
  unsigned* counters; // [0] grid barrier arrivals, [1] exits (both back to 0 at the end), [2..6] a stall: what
                      // waited (1 slot data, 2 free slot, 3 grid barrier, 5 a landed slot: the producer's
                      // in-flight limit), block, thread, sequence,
                      // target
  const int* tiles;   // [layers * KINDS + 1][SMs + 1] first tile of each SM, per product in step order
  Product prod[KINDS + 1];
  int n_layers, hidden, heads, inter, vocab, max_len, xbuf_bytes;
  float eps, qk_scale;  // softmax scale * log2(e)
  // Where not null, timings (globaltimer ns) per block, [SMs][2 * 6 * n_layers + 10]: each grid barrier's
  // arrival and release, then the consumers' start and end, the producer's waiting, a spare, then thread 0's sums
  // (Consumer::sums).
  unsigned long long* trace;
};

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned long long* trace_row(const Params& p) {
  return p.trace + (size_t)blockIdx.x * (12 * p.n_layers + 10);
}

// ---------------------------------------------------------------- small helpers

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ float bf_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float bf2f(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float rb(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__device__ __forceinline__ void unpack8(const uint4 v, float (&f)[8]) {
  f[0] = bf_lo(v.x); f[1] = bf_hi(v.x); f[2] = bf_lo(v.y); f[3] = bf_hi(v.y);
  f[4] = bf_lo(v.z); f[5] = bf_hi(v.z); f[6] = bf_lo(v.w); f[7] = bf_hi(v.w);
}

__device__ __forceinline__ void unpack4(const uint2 v, float (&f)[4]) {
  f[0] = bf_lo(v.x); f[1] = bf_hi(v.x); f[2] = bf_lo(v.y); f[3] = bf_hi(v.y);
}

__device__ __forceinline__ uint32_t pack2(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Loads of what other SMs wrote during this launch: from L2 (.cg), never a stale L1 line.
__device__ __forceinline__ uint4 ld_l2(const void* p) { return __ldcg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ uint2 ld_l2_8(const void* p) { return __ldcg(reinterpret_cast<const uint2*>(p)); }

// Sum over the 16 lanes of a lane group (lanes 0-15, 16-31).
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// This lane's 8 dims of a cached head row (norm_rope's dims) from shared memory.
__device__ __forceinline__ void head_dims(const unsigned char* row, int dg, float (&f)[8]) {
  float lo[4], hi[4];
  unpack4(*reinterpret_cast<const uint2*>(row + dg * 8), lo);
  unpack4(*reinterpret_cast<const uint2*>(row + 128 + dg * 8), hi);
#pragma unroll
  for (int i = 0; i < 4; ++i) { f[i] = lo[i]; f[4 + i] = hi[i]; }
}

// The GQA heads' scores against one key: each lane's 8 dims, summed over its lane group.
__device__ __forceinline__ void scores(const float (&q)[GQA][8], const float (&k)[8], float (&d)[GQA]) {
#pragma unroll
  for (int g = 0; g < GQA; ++g) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc = fmaf(q[g][i], k[i], acc);
    d[g] = group_sum(acc);
  }
}

__device__ __forceinline__ void consumer_bar() { asm volatile("bar.sync 1, %0;" ::"n"(CONSUMERS) : "memory"); }

// ---------------------------------------------------------------- mbarriers and the bulk copy

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar, uint32_t count) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0], %1; }" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}

// ---------------------------------------------------------------- stalls
// A wait that never ends (a bug) must not hang the GPU, nor trap (which loses the CUDA context and the user's
// session with it): the first to pass SPIN_LIMIT records what it waited for in counters[2..6], and every wait
// then gives up. The step's output is garbage; the host reads the record (megakernel.py: DecodeStep.stall).

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __noinline__ void report_stall(unsigned* counters, unsigned what, unsigned seq, unsigned target) {
  if (atomicCAS(counters + 2, 0u, what) == 0u) {
    counters[3] = blockIdx.x;
    counters[4] = threadIdx.x;
    counters[5] = seq;
    counters[6] = target;
  }
}

// Whether a wait `spins` long should give up (polled every STALL_POLL spins).
__device__ __forceinline__ bool give_up(unsigned* counters, long long spins, unsigned what, unsigned seq,
                                        unsigned target) {
  if (spins % STALL_POLL != STALL_POLL - 1) return false;
  if (spins > SPIN_LIMIT) report_stall(counters, what, seq, target);
  return ld_acquire(counters + 2) != 0u;
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity, unsigned* counters, unsigned what,
                                          unsigned seq) {
  const uint32_t addr = smem_u32(bar);
  for (long long spins = 0;; ++spins) {
    uint32_t ok;
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(ok)
        : "r"(addr), "r"(parity)
        : "memory");
    if (ok || give_up(counters, spins, what, seq, parity)) return;
  }
}

__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                          uint64_t policy) {
#if EVICT_FIRST
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
#else
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
#endif
}

// ---------------------------------------------------------------- the grid barrier

// Every consumer thread of every block: this block's writes so far are visible to all blocks after it, and it
// returns once all blocks have called it `index + 1` times. Thread 0 adds the block's arrival to one counter with
// release semantics (bar.sync first, so it releases the block's writes) and polls it with acquire loads.
// Measured alternatives (benchmarks/2026-11-25-h100/megakernel/): an arrival per warp (8x the atomics on one
// address: 3.79 against 3.65 ms a step) and a byte per block polled by every block (4.32 ms) were slower.
__device__ __forceinline__ void grid_sync(unsigned* counter, unsigned index, unsigned long long* trace,
                                          unsigned long long* sums) {
  consumer_bar();
  if (threadIdx.x == 0) {
    unsigned long long t0 = 0;
    if (trace) trace[2 * index] = t0 = now_ns();
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
    if (trace) sums[1] += now_ns() - t0;
    const unsigned target = (index + 1) * gridDim.x;
    for (long long spins = 0; ld_acquire(counter) < target; ++spins)
      if (give_up(counter, spins, 3, index, target)) break;
    if (trace) trace[2 * index + 1] = now_ns();
  }
  consumer_bar();  // thread 0's acquire passes on to the block
}

// ---------------------------------------------------------------- the ring

// RING slots, filled in sequence. A parity wait cannot tell a phase from the one two phases later, so every
// waiter must see each phase of a slot in order: in a product slot s belongs to warp s % NCW alone (RING = NCW, so
// each warp owns one slot for the whole step), in attention every warp waits on every slot; the grid barrier
// between phases orders the two.
struct Ring {
  unsigned char* slots;
  uint64_t* full;   // the producer's bytes have landed
  uint64_t* empty;  // NCW arrivals: the consumers are done with it
  unsigned* counters;
  __device__ __forceinline__ unsigned char* slot(uint32_t seq) const { return slots + (size_t)(seq % RING) * SLOT; }
  __device__ __forceinline__ uint32_t parity(uint32_t seq) const { return (seq / RING) & 1u; }
  __device__ __forceinline__ const unsigned char* wait_full(uint32_t seq) const {
    mbar_wait(full + seq % RING, parity(seq), counters, 1, seq);
    return slot(seq);
  }
  // A warp is done with slot seq: `count` of its NCW arrivals (NCW where one warp alone used it).
  __device__ __forceinline__ void release(uint32_t seq, uint32_t count) const {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(empty + seq % RING, count);
  }
};

// ---------------------------------------------------------------- the producer

// The cached positions [a, e) whose attention this SM computes: its share of [0, pos) over all SMs but the last,
// which takes pos itself, the fresh key, from the step's own k/v (and writes it to the cache).
__device__ __forceinline__ void my_range(int pos, int& a, int& e) {
  const int shares = gridDim.x - 1;
  const int b = min((int)blockIdx.x, shares);
  a = (int)((long long)pos * b / shares);
  e = (int)((long long)pos * min(b + 1, shares) / shares);
}

// This SM's stream, in step order: visit(src, bytes, slot_bytes) for each bulk copy, slot_bytes (the slot's total)
// on the first copy of a slot, 0 on the others. Per layer: its tiles of qkv, its cached positions (keys then
// values, chunk by chunk), its tiles of o, gate/up (rows/2 gate rows, then the matching up rows) and down; then
// the head.
template <class Visit>
__device__ __forceinline__ void product_stream(const Params& p, int m, int kind, const bf16* w, Visit& visit) {
  const Product& pr = p.prod[kind];
  const int* t = p.tiles + m * (gridDim.x + 1) + blockIdx.x;
  const uint32_t row = (uint32_t)pr.K * 2, bytes = pr.rows * row;
  for (int tile = t[0]; tile < t[1]; ++tile) {
    if (kind == GU) {
      const int half = pr.rows / 2;
      visit(w + (size_t)tile * half * pr.K, half * row, bytes);
      visit(w + ((size_t)p.inter + tile * half) * pr.K, half * row, 0u);
    } else {
      visit(w + (size_t)tile * pr.rows * pr.K, bytes, bytes);
    }
  }
}

template <class Visit>
__device__ __forceinline__ void stream(const Params& p, int pos, Visit& visit) {
  int a, e;
  my_range(pos, a, e);
  for (int l = 0; l < p.n_layers; ++l) {
    const LayerW& lw = p.layers[l];
    product_stream(p, l * KINDS + QKV, QKV, lw.w[QKV], visit);
    for (int c = a; c < e; c += CHUNK_POS) {
      const uint32_t bytes = min(CHUNK_POS, e - c) * KV_ROW;
      const size_t at = ((size_t)l * p.max_len + c) * KV_HEADS * HD;
      visit(p.k_cache + at, bytes, bytes);
      visit(p.v_cache + at, bytes, bytes);
    }
    product_stream(p, l * KINDS + O, O, lw.w[O], visit);
    product_stream(p, l * KINDS + GU, GU, lw.w[GU], visit);
    product_stream(p, l * KINDS + DOWN, DOWN, lw.w[DOWN], visit);
  }
  product_stream(p, p.n_layers * KINDS, HEAD, p.head, visit);
}

// The producer: the stream into the ring, each slot once free, at most INFLIGHT slots in flight.
struct Filler {
  Ring ring;
  uint64_t policy;
  bool timed;
  uint32_t seq = ~0u;  // the slot being filled
  uint32_t off = 0;
  unsigned char* dst = nullptr;
  unsigned long long waited = 0;

  __device__ __forceinline__ void operator()(const void* src, uint32_t bytes, uint32_t slot_bytes) {
    if (slot_bytes) {
      ++seq;
      off = 0;
      const unsigned long long t0 = timed ? now_ns() : 0;
      mbar_wait(ring.empty + seq % RING, ring.parity(seq) ^ 1u, ring.counters, 2, seq);
      // Bytes in flight only queue: every SM's extra outstanding copies delay the barriers' and activations'
      // small reads behind them. Wait for slot seq - INFLIGHT to land (waited in order: parities unambiguous).
      if (INFLIGHT < RING && seq >= INFLIGHT)
        mbar_wait(ring.full + (seq - INFLIGHT) % RING, ring.parity(seq - INFLIGHT), ring.counters, 5, seq);
      if (timed) waited += now_ns() - t0;
      mbar_expect_tx(ring.full + seq % RING, slot_bytes);
      dst = ring.slot(seq);
    }
    bulk_load(dst + off, src, bytes, ring.full + seq % RING, policy);
    off += bytes;
  }
};

// ---------------------------------------------------------------- consumer: vectors into shared memory

// xs = bf16(v * r) (with w: bf16(bf16(v * r) * w)), r = 1 / sqrt(mean(v^2) + eps): v [n] bf16 from global.
__device__ __noinline__ void norm_into(const bf16* v, const bf16* w, int n, float eps, bf16* xs, float* red) {
  constexpr int MAXV = 4;  // n <= 4 * 8 * CONSUMERS
  const int t = threadIdx.x, vecs = n / 8;
  uint4 raw[MAXV];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < MAXV; ++i) {
    const int j = t + i * CONSUMERS;
    if (j < vecs) {
      raw[i] = ld_l2(v + j * 8);
      float f[8];
      unpack8(raw[i], f);
#pragma unroll
      for (int k = 0; k < 8; ++k) ss = fmaf(f[k], f[k], ss);
    }
  }
  ss = warp_sum(ss);
  if ((t & 31) == 0) red[t >> 5] = ss;
  consumer_bar();
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < NCW; ++i) total += red[i];
  const float r = 1.f / sqrtf(total / n + eps);
#pragma unroll
  for (int i = 0; i < MAXV; ++i) {
    const int j = t + i * CONSUMERS;
    if (j < vecs) {
      float f[8];
      unpack8(raw[i], f);
      if (w != nullptr) {
        float g[8];
        unpack8(__ldg(reinterpret_cast<const uint4*>(w + j * 8)), g);
#pragma unroll
        for (int k = 0; k < 8; ++k) f[k] = rb(f[k] * r) * g[k];
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) f[k] *= r;
      }
      reinterpret_cast<uint4*>(xs)[j] = make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]),
                                                   pack2(f[6], f[7]));
    }
  }
  consumer_bar();  // xs complete; red free again
}

// xs = src [n] (bf16, from global).
__device__ __noinline__ void copy_into(const bf16* src, int n, bf16* xs) {
  constexpr int MAXV = 8;  // n <= 8 * 8 * CONSUMERS
  const int t = threadIdx.x, vecs = n / 8;
  uint4 raw[MAXV];
#pragma unroll
  for (int i = 0; i < MAXV; ++i)
    if (t + i * CONSUMERS < vecs) raw[i] = ld_l2(src + (t + i * CONSUMERS) * 8);
#pragma unroll
  for (int i = 0; i < MAXV; ++i)
    if (t + i * CONSUMERS < vecs) reinterpret_cast<uint4*>(xs)[t + i * CONSUMERS] = raw[i];
  consumer_bar();
}

// ---------------------------------------------------------------- consumer: products

// acc[r] += row r of the slot (kp elements each) . xs[0, kp), over this lane's share of the row.
template <int R>
__device__ __forceinline__ void dot_rows(const unsigned char* slot, const bf16* xs, int kp, float (&acc)[MAX_ROWS]) {
  const uint4* w = reinterpret_cast<const uint4*>(slot);
  const uint4* x = reinterpret_cast<const uint4*>(xs);
  const int nv = kp / 8;
#pragma unroll 2
  for (int i = threadIdx.x & 31; i < nv; i += 32) {
    float xf[8];
    unpack8(x[i], xf);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float wf[8];
      unpack8(w[r * nv + i], wf);
      float s = acc[r];
#pragma unroll
      for (int k = 0; k < 8; ++k) s = fmaf(wf[k], xf[k], s);
      acc[r] = s;
    }
  }
}

__device__ __forceinline__ void dot_tile(int rows, const unsigned char* slot, const bf16* xs, int kp,
                                         float (&acc)[MAX_ROWS]) {
  switch (rows) {
    case 1: dot_rows<1>(slot, xs, kp, acc); break;
    case 2: dot_rows<2>(slot, xs, kp, acc); break;
    default: dot_rows<4>(slot, xs, kp, acc); break;
  }
}

__device__ __forceinline__ float silu_mul(float g, float u) {  // as the unfused path rounds (ops.silu_mul)
  g = rb(g);
  return rb(g / (1.f + __expf(-g))) * rb(u);
}

struct Consumer {
  const Params& p;
  Ring ring;
  bf16* xs;
  float* red;
  uint32_t seq = 0;
  unsigned syncs = 0;
  int pos = 0;

  __device__ __forceinline__ void sync() {
    grid_sync(p.counters, syncs++, p.trace ? trace_row(p) : nullptr, p.trace ? sums() : nullptr);
  }
  // Trace sums (thread 0): [0] spare, [1] barrier releases, [2] merge loads, [3] merge rest,
  // [4] attention's q, [5] attention's rest.
  __device__ __forceinline__ unsigned long long* sums() const { return trace_row(p) + 12 * p.n_layers + 4; }
  __device__ __forceinline__ void mark(int i, unsigned long long& t) const {
    if (p.trace && threadIdx.x == 0) {
      const unsigned long long n = now_ns();
      sums()[i] += n - t;
      t = n;
    }
  }

  // This SM's tiles of product instance m, one slot each: warp w takes the tiles in slots s with s % NCW == w.
  // resid: the residual stream of O / DOWN (h, or the embedding row in layer 0); out: where results go.
  __device__ __noinline__ void product(int m, int kind, const bf16* resid, void* out) {
    const Product& pr = p.prod[kind];
    const int* t = p.tiles + m * (gridDim.x + 1) + blockIdx.x;
    const int t0 = t[0], tiles = t[1] - t0;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int j = (warp - (int)(seq % NCW) + NCW) % NCW; j < tiles; j += NCW) {
      float acc[MAX_ROWS] = {0.f, 0.f, 0.f, 0.f};
      const uint32_t s = seq + (uint32_t)j;
      const int tile = t0 + j;
      // O, DOWN: this lane's residual row, loaded before the product so its latency hides under it.
      float hr = 0.f;
      if ((kind == O || kind == DOWN) && lane < pr.rows) hr = bf2f(__ldcg(resid + tile * pr.rows + lane));
      dot_tile(pr.rows, ring.wait_full(s), xs, pr.K, acc);
      ring.release(s, NCW);
#pragma unroll
      for (int r = 0; r < MAX_ROWS; ++r) acc[r] = warp_sum(acc[r]);
      if (kind == GU) {  // gate rows then up rows: half is 1 or 2 (constant indices keep acc in registers)
        bf16* act = static_cast<bf16*>(out);
        if (pr.rows == 4) {
          if (lane < 2)
            act[tile * 2 + lane] = __float2bfloat16_rn(silu_mul(lane ? acc[1] : acc[0], lane ? acc[3] : acc[2]));
        } else if (lane == 0) {
          act[tile] = __float2bfloat16_rn(silu_mul(acc[0], acc[1]));
        }
      } else {
#pragma unroll
        for (int r = 0; r < MAX_ROWS; ++r) {
          if (lane != r || r >= pr.rows) continue;
          const int row = tile * pr.rows + r;
          if (kind == HEAD) {
            static_cast<float*>(out)[row] = acc[r];
          } else if (kind == QKV) {
            static_cast<bf16*>(out)[row] = __float2bfloat16_rn(acc[r]);
          } else {  // O, DOWN: h = bf16(h + bf16(product))
            static_cast<bf16*>(out)[row] = __float2bfloat16_rn(hr + rb(acc[r]));
          }
        }
      }
    }
    seq += (uint32_t)tiles;
  }

  // ------------------------------------------------------------ attention of this SM's range of positions

  // A head's 8 dims held by this lane: [4 dg, 4 dg + 4) and their RoPE partners [64 + 4 dg, ...) (dg = lane % 16),
  // loaded by the caller (every load of the phase at once: each serial L2 round trip costs ~1 us under load):
  // RMSNorm by w over the whole head (16 lanes), then RoPE at pos, rounded as the reference (elementwise.norm_rope).
  struct Rope {  // this lane's cos and sin at pos, dims [4 dg, 4 dg + 4) and [64 + 4 dg, ...)
    float4 c_lo, c_hi, s_lo, s_hi;
  };

  __device__ __forceinline__ Rope rope_at(int dg) const {
    const float* cs = p.cos + (size_t)pos * HD + dg * 4;
    const float* sn = p.sin + (size_t)pos * HD + dg * 4;
    return Rope{__ldg(reinterpret_cast<const float4*>(cs)), __ldg(reinterpret_cast<const float4*>(cs + 64)),
                __ldg(reinterpret_cast<const float4*>(sn)), __ldg(reinterpret_cast<const float4*>(sn + 64))};
  }

  __device__ __forceinline__ void norm_rope(uint2 a, uint2 b, uint2 wa, uint2 wb, const Rope& rr, float* out) const {
    float lo[4], hi[4], wl[4], wh[4];
    unpack4(a, lo);
    unpack4(b, hi);
    unpack4(wa, wl);
    unpack4(wb, wh);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) ss = fmaf(lo[i], lo[i], fmaf(hi[i], hi[i], ss));
    ss = group_sum(ss);
    const float r = 1.f / sqrtf(ss / HD + p.eps);
    const float cl[4] = {rr.c_lo.x, rr.c_lo.y, rr.c_lo.z, rr.c_lo.w};
    const float ch[4] = {rr.c_hi.x, rr.c_hi.y, rr.c_hi.z, rr.c_hi.w};
    const float sl[4] = {rr.s_lo.x, rr.s_lo.y, rr.s_lo.z, rr.s_lo.w};
    const float sh[4] = {rr.s_hi.x, rr.s_hi.y, rr.s_hi.z, rr.s_hi.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float y = rb(rb(lo[i] * r) * wl[i]), yp = rb(rb(hi[i] * r) * wh[i]);
      out[i] = rb(rb(y * rb(cl[i])) + rb(-yp * rb(sl[i])));
      out[4 + i] = rb(rb(yp * rb(ch[i])) + rb(y * rb(sh[i])));
    }
  }

  // Attention of this SM's range of cached positions for every head, plus the fresh key on the last SM, as a
  // partial softmax state per head (part_o, part_ml). Warp w takes KV head w and its GQA q heads; in a chunk, lane
  // group pg (16 lanes) takes positions pg, pg + 2, ..., each lane 8 of the head's dims (norm_rope's).
  __device__ __noinline__ void attention(int l, const bf16* q_norm, const bf16* k_norm) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pg = lane >> 4, dg = lane & 15, kh = warp;
    const bool fresh = blockIdx.x == gridDim.x - 1;  // the last SM also attends the step's own key
    unsigned long long t = p.trace ? now_ns() : 0;
    // Every load first: q of the warp's GQA heads, the fresh k and v, the norms' weights, cos and sin.
    uint2 qa[GQA], qb[GQA], ka = {}, kb = {}, va = {}, vb = {};
#pragma unroll
    for (int g = 0; g < GQA; ++g) {
      qa[g] = ld_l2_8(p.qkv + (kh * GQA + g) * HD + dg * 4);
      qb[g] = ld_l2_8(p.qkv + (kh * GQA + g) * HD + 64 + dg * 4);
    }
    {  // every SM (no shuffles under a branch): only the last uses them
      const bf16* ksrc = p.qkv + (p.heads + kh) * HD;
      const bf16* vsrc = p.qkv + (p.heads + KV_HEADS + kh) * HD;
      ka = ld_l2_8(ksrc + dg * 4), kb = ld_l2_8(ksrc + 64 + dg * 4);
      va = ld_l2_8(vsrc + dg * 4), vb = ld_l2_8(vsrc + 64 + dg * 4);
    }
    const uint2 wqa = __ldg(reinterpret_cast<const uint2*>(q_norm + dg * 4));
    const uint2 wqb = __ldg(reinterpret_cast<const uint2*>(q_norm + 64 + dg * 4));
    const uint2 wka = __ldg(reinterpret_cast<const uint2*>(k_norm + dg * 4));
    const uint2 wkb = __ldg(reinterpret_cast<const uint2*>(k_norm + 64 + dg * 4));
    float q[GQA][8], kf[8];
    {
      const Rope rr = rope_at(dg);
#pragma unroll
      for (int g = 0; g < GQA; ++g) {
        float t[8];
        norm_rope(qa[g], qb[g], wqa, wqb, rr, t);
#pragma unroll
        for (int i = 0; i < 8; ++i) q[g][i] = t[i] * p.qk_scale;
      }
      norm_rope(ka, kb, wka, wkb, rr, kf);
    }
    mark(4, t);
    float m[GQA], sum[GQA], acc[GQA][8];
#pragma unroll
    for (int g = 0; g < GQA; ++g) {
      m[g] = -INFINITY;
      sum[g] = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
    }
    int a, e;
    my_range(pos, a, e);
    for (int c = a; c < e; c += CHUNK_POS) {
      const int n = min(CHUNK_POS, e - c);
      const unsigned char* ks = ring.wait_full(seq);
      const unsigned char* vs = ring.wait_full(seq + 1);
      // Four positions at a time: lane group pg takes j0 + pg and j0 + 2 + pg.
      for (int j0 = 0; j0 < n; j0 += 4) {
        float s[GQA][2];  // scores, then their exp2 weights
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int j = j0 + pg + 2 * jj;
          float kf[8];
          if (j < n) {
            head_dims(ks + (size_t)(j * KV_HEADS + kh) * HD * 2, dg, kf);
          } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) kf[i] = 0.f;
          }
          float d[GQA];
          scores(q, kf, d);
#pragma unroll
          for (int g = 0; g < GQA; ++g) s[g][jj] = j < n ? d[g] : -INFINITY;
        }
#pragma unroll
        for (int g = 0; g < GQA; ++g) {
          const float mx = fmaxf(m[g], fmaxf(s[g][0], s[g][1]));
          const float alpha = mx == -INFINITY ? 1.f : exp2f(m[g] - mx);  // exp2(-inf) = 0 before a first key
#pragma unroll
          for (int jj = 0; jj < 2; ++jj) s[g][jj] = s[g][jj] == -INFINITY ? 0.f : exp2f(s[g][jj] - mx);
          sum[g] = sum[g] * alpha + s[g][0] + s[g][1];
          m[g] = mx;
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[g][i] *= alpha;
        }
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
          const int j = j0 + pg + 2 * jj;
          if (j >= n) continue;
          float vf[8];
          head_dims(vs + (size_t)(j * KV_HEADS + kh) * HD * 2, dg, vf);
#pragma unroll
          for (int g = 0; g < GQA; ++g)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(s[g][jj], vf[i], acc[g][i]);
        }
      }
      ring.release(seq++, 1);
      ring.release(seq++, 1);
    }
    float dk[GQA];  // the fresh key's scores (every SM: no shuffles under a branch)
    scores(q, kf, dk);
    if (fresh) {
      // The fresh key and value at pos: into the cache for later steps, and attended here from registers.
      float vf[8];
      const uint2 vlo = va, vhi = vb;
      float v4[4];
      unpack4(vlo, v4);
#pragma unroll
      for (int i = 0; i < 4; ++i) vf[i] = v4[i];
      unpack4(vhi, v4);
#pragma unroll
      for (int i = 0; i < 4; ++i) vf[4 + i] = v4[i];
      if (pg == 0) {
        const size_t at = (((size_t)l * p.max_len + pos) * KV_HEADS + kh) * HD;
        *reinterpret_cast<uint2*>(p.k_cache + at + dg * 4) = make_uint2(pack2(kf[0], kf[1]), pack2(kf[2], kf[3]));
        *reinterpret_cast<uint2*>(p.k_cache + at + 64 + dg * 4) = make_uint2(pack2(kf[4], kf[5]), pack2(kf[6], kf[7]));
        *reinterpret_cast<uint2*>(p.v_cache + at + dg * 4) = vlo;
        *reinterpret_cast<uint2*>(p.v_cache + at + 64 + dg * 4) = vhi;
      }
#pragma unroll
      for (int g = 0; g < GQA; ++g) {
        const float d = dk[g];
        if (pg == 0) {  // one lane group takes it
          const float mx = fmaxf(m[g], d);
          const float alpha = exp2f(m[g] - mx), pv = exp2f(d - mx);
          sum[g] = sum[g] * alpha + pv;
          m[g] = mx;
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(acc[g][i], alpha, pv * vf[i]);
        }
      }
    }
    // The warp's two lane groups into one state.
#pragma unroll
    for (int g = 0; g < GQA; ++g) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], 16);
      const float so = __shfl_xor_sync(0xffffffffu, sum[g], 16);
      const float mx = fmaxf(m[g], mo);
      const float fa = m[g] == -INFINITY ? 0.f : exp2f(m[g] - mx);
      const float fb = mo == -INFINITY ? 0.f : exp2f(mo - mx);
      sum[g] = sum[g] * fa + so * fb;
      m[g] = mx;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[g][i] = acc[g][i] * fa + __shfl_xor_sync(0xffffffffu, acc[g][i], 16) * fb;
    }
    if (pg == 0) {
#pragma unroll
      for (int g = 0; g < GQA; ++g) {
        const int head = kh * GQA + g;
        float* po = p.part_o + ((size_t)blockIdx.x * p.heads + head) * HD;
        *reinterpret_cast<float4*>(po + dg * 4) = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
        *reinterpret_cast<float4*>(po + 64 + dg * 4) = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
        if (dg == 0)
          *reinterpret_cast<float2*>(p.part_ml + ((size_t)blockIdx.x * p.heads + head) * 2) = make_float2(m[g], sum[g]);
      }
    }
    mark(5, t);
  }

  // ------------------------------------------------------------ merge: 32 dims of one head per SM

  __device__ __noinline__ void merge() {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int slices = p.heads * (HD / 32), S = gridDim.x;
    float* rm = red;              // [NCW][32] each warp's max, sum, output
    float* rs = red + NCW * 32;
    float* ro = red + 2 * NCW * 32;
    unsigned long long t = p.trace ? now_ns() : 0;
    for (int sl = blockIdx.x; sl < slices; sl += gridDim.x) {
      const int head = sl / (HD / 32), d = (sl % (HD / 32)) * 32 + lane;
      // Groups of MERGE_UNROLL splits, each group's loads in flight at once, merged online.
      float mx = -INFINITY, sum = 0.f, out = 0.f;
#pragma unroll 1
      for (int i0 = 0; i0 < MERGE_SPLITS; i0 += MERGE_UNROLL) {
        float2 ml[MERGE_UNROLL];
        float o[MERGE_UNROLL];
#pragma unroll
        for (int u = 0; u < MERGE_UNROLL; ++u) {  // unconditional (clamped) loads
          const int s = min(warp + (i0 + u) * NCW, S - 1);
          ml[u] = __ldcg(reinterpret_cast<const float2*>(p.part_ml + ((size_t)s * p.heads + head) * 2));
          o[u] = __ldcg(p.part_o + ((size_t)s * p.heads + head) * HD + d);
        }
        float gm = mx;
#pragma unroll
        for (int u = 0; u < MERGE_UNROLL; ++u)
          if (warp + (i0 + u) * NCW < S) gm = fmaxf(gm, ml[u].x);
        if (gm == -INFINITY) continue;
        const float r = mx == -INFINITY ? 0.f : exp2f(mx - gm);
        sum *= r;
        out *= r;
        mx = gm;
#pragma unroll
        for (int u = 0; u < MERGE_UNROLL; ++u) {
          if (warp + (i0 + u) * NCW >= S || ml[u].x == -INFINITY) continue;
          const float f = exp2f(ml[u].x - mx);
          sum = fmaf(ml[u].y, f, sum);
          out = fmaf(o[u], f, out);
        }
      }
      rm[warp * 32 + lane] = mx;
      rs[warp * 32 + lane] = sum;
      ro[warp * 32 + lane] = out;
      consumer_bar();
      mark(2, t);
      if (warp == 0) {
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < NCW; ++w) M = fmaxf(M, rm[w * 32 + lane]);
        float L = 0.f, A = 0.f;
#pragma unroll
        for (int w = 0; w < NCW; ++w) {
          const float mw = rm[w * 32 + lane];
          if (mw == -INFINITY) continue;
          const float f = exp2f(mw - M);
          L = fmaf(rs[w * 32 + lane], f, L);
          A = fmaf(ro[w * 32 + lane], f, A);
        }
        p.attn[head * HD + d] = __float2bfloat16_rn(A / L);
      }
      consumer_bar();
      mark(3, t);
    }
  }
};

}  // namespace

extern "C" __global__ void __launch_bounds__(THREADS, 1)
    decode_step(const __grid_constant__ Params p, const long long* ids, const long long* positions, float* logits) {
  extern __shared__ __align__(128) unsigned char smem[];
  Ring ring;
  ring.slots = smem;
  ring.counters = p.counters;
  bf16* xs = reinterpret_cast<bf16*>(smem + (size_t)RING * SLOT);
  ring.full = reinterpret_cast<uint64_t*>(smem + (size_t)RING * SLOT + p.xbuf_bytes);
  ring.empty = ring.full + RING;
  float* red = reinterpret_cast<float*>(ring.empty + RING);
  if (threadIdx.x == 0) {
    for (int s = 0; s < RING; ++s) {
      mbar_init(ring.full + s, 1);
      mbar_init(ring.empty + s, NCW);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int pos = (int)positions[0];

  if (threadIdx.x == CONSUMERS) {  // the producer warp: one thread streams
    uint64_t policy = 0;
#if EVICT_FIRST
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#endif
    Filler f{ring, policy, p.trace != nullptr};
    stream(p, pos, f);
    if (p.trace) trace_row(p)[12 * p.n_layers + 2] = f.waited;
    return;
  }
  if (threadIdx.x >= CONSUMERS) return;

  Consumer c{p, ring, xs, red};
  c.pos = pos;
  if (p.trace && threadIdx.x == 0) trace_row(p)[12 * p.n_layers] = now_ns();
  const bf16* embed_row = p.embed + (size_t)ids[0] * p.hidden;
  for (int l = 0; l < p.n_layers; ++l) {
    const LayerW lw = p.layers[l];  // by value: its pointers loaded once, early
    if (l > 0) c.sync();
    norm_into(l == 0 ? embed_row : p.h, lw.in_norm, p.hidden, p.eps, xs, red);
    c.product(l * KINDS + QKV, QKV, nullptr, p.qkv);
    c.sync();
    c.attention(l, lw.q_norm, lw.k_norm);
    c.sync();
    c.merge();
    c.sync();
    copy_into(p.attn, p.heads * HD, xs);
    c.product(l * KINDS + O, O, l == 0 ? embed_row : p.h, p.h);
    c.sync();
    norm_into(p.h, lw.post_norm, p.hidden, p.eps, xs, red);
    c.product(l * KINDS + GU, GU, nullptr, p.act);
    c.sync();
    copy_into(p.act, p.inter, xs);
    c.product(l * KINDS + DOWN, DOWN, p.h, p.h);
  }
  c.sync();
  norm_into(p.h, p.final_norm, p.hidden, p.eps, xs, red);
  c.product(p.n_layers * KINDS, HEAD, nullptr, logits);
  // The last block out resets the counters for the next launch (every block has passed every barrier by now).
  consumer_bar();
  if (threadIdx.x == 0) {
    if (p.trace) trace_row(p)[12 * p.n_layers + 1] = now_ns();
    __threadfence();
    if (atomicAdd(p.counters + 1, 1u) == gridDim.x - 1) {
      atomicExch(p.counters, 0u);
      atomicExch(p.counters + 1, 0u);
    }
  }
}
