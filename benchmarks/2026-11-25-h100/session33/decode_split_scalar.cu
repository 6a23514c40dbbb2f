// The split half of a decode step's attention (one query row, the window cut into 64-key splits), by hand.
//
// Why: at short windows the split is latency, not bytes. The Triton split (engine/kernels/attention.py) takes
// 4.6-5.1 us per program on the H100 for 32 KB of keys and values: ~1100 instructions per thread with 18 block
// barriers, mostly layout changes around two 16-row tensor-core products of which a decode row fills 4 rows.
// Here each warp is one query head of the KV group and works in registers: the loads that do not depend on the
// position go out first, the keys and values as asynchronous copies into shared memory once the position is
// known, and q's norm and RoPE run while they are in flight. Two block barriers.
//
// Grid (KV heads, splits), G warps (the query heads of a KV head). Program (kvh, sp) covers cache rows
// [64 sp, 64 sp + 64) of KV head kvh, those at or below limit[0] visible. The program whose split holds the new
// row pos[0] normalises and rotates its key, stores key and value into the cache and uses them from registers'
// copies in shared memory. It writes the partial softmax state of its G rows (row r = query head r of the group)
// as the Triton split does: part_o [KV][nsplit][ROWS][128] fp32, part_ml [KV][nsplit][ROWS][2] (max, sum); the
// Triton merge reads them. Rounding follows elementwise.norm_rope (the torch reference's steps) for q and the key;
// the probabilities go to bf16 before the product with the values, as in the Triton split.
//
// The kernel lets the next one (the merge, launched early) start at once; it is not launched early itself.

#include <cuda_bf16.h>
#include <stdint.h>

namespace {

typedef __nv_bfloat16 bf16;

constexpr int D = 128;               // head dim: a lane holds 4 dims
constexpr int KEYS = 64;             // keys per split
constexpr int KROW = D * 2 + 16;     // bytes of a key row in shared memory, padded: 16-byte reads of 8 lanes
                                     // at one offset of 8 rows fall in distinct banks
constexpr int VROW = D * 2;

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

__device__ __forceinline__ void unpack4(uint2 u, float (&f)[4]) {
  const __nv_bfloat162 a = *reinterpret_cast<const __nv_bfloat162*>(&u.x);
  const __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&u.y);
  f[0] = __low2float(a); f[1] = __high2float(a); f[2] = __low2float(b); f[3] = __high2float(b);
}

__device__ __forceinline__ void unpack8(uint4 u, float (&f)[8]) {
  float lo[4], hi[4];
  unpack4(make_uint2(u.x, u.y), lo);
  unpack4(make_uint2(u.z, u.w), hi);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[i] = lo[i];
    f[i + 4] = hi[i];
  }
}

__device__ __forceinline__ uint2 pack4(const float (&f)[4]) {
  __nv_bfloat162 a = __floats2bfloat162_rn(f[0], f[1]), b = __floats2bfloat162_rn(f[2], f[3]);
  return make_uint2(*reinterpret_cast<uint32_t*>(&a), *reinterpret_cast<uint32_t*>(&b));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// RMSNorm by w then RoPE of one head vector, a lane's 4 dims (4 lane .. 4 lane + 3) in x: rounded step by step as
// elementwise.norm_rope. c, s: this lane's cos and sin at the row's position. The rotate_half partner of dim d < 64
// is d + 64, held by lane + 16.
__device__ __forceinline__ void norm_rope4(float (&x)[4], const float (&w)[4], const float (&c)[4],
                                           const float (&s)[4], float eps, int lane) {
  float ss = x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3];
  const float r = 1.0f / sqrtf(warp_sum(ss) / (float)D + eps);
  float y[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) y[i] = round_bf16(round_bf16(x[i] * r) * w[i]);
  const float sign = lane < 16 ? -1.0f : 1.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float yp = __shfl_xor_sync(0xffffffffu, y[i], 16);
    x[i] = round_bf16(round_bf16(y[i] * round_bf16(c[i])) + round_bf16(sign * yp * round_bf16(s[i])));
  }
}

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A block's record for engine/kernels/block_trace.py: start, keys in shared memory, end, SM, block.
__device__ __forceinline__ void record(unsigned long long* trace, unsigned long long t0, unsigned long long t1) {
  unsigned int sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const unsigned int block = blockIdx.x + gridDim.x * blockIdx.y;
  unsigned long long* rec = trace + 5 * block;
  rec[0] = t0;
  rec[1] = t1;
  rec[2] = now_ns();
  rec[3] = sm;
  rec[4] = block;
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
}

template <int G>
__device__ __forceinline__ void split(const bf16* __restrict__ q, const bf16* __restrict__ kn,
                                      const bf16* __restrict__ vn, const bf16* __restrict__ qw,
                                      const bf16* __restrict__ kw, const float* __restrict__ cos_t,
                                      const float* __restrict__ sin_t, const long long* __restrict__ pos_p,
                                      const long long* __restrict__ limit_p, bf16* __restrict__ kc,
                                      bf16* __restrict__ vc, float* __restrict__ part_o, float* __restrict__ part_ml,
                                      int rows, float scale, float eps, unsigned long long* trace) {
  unsigned long long t0 = 0, t1 = 0;
  if (trace != nullptr && threadIdx.x == 0) t0 = now_ns();
  __shared__ __align__(16) unsigned char ks[KEYS * KROW];
  __shared__ __align__(16) unsigned char vs[KEYS * VROW];
  __shared__ __align__(16) bf16 qs[G][D];
  __shared__ float ps[G][KEYS];
  const int kvh = blockIdx.x, sp = blockIdx.y, nsplit = gridDim.y, kvn = gridDim.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  // What does not depend on the position: the position and limit themselves, q and the norm weights.
  const long long pos = *pos_p, limit = *limit_p;
  const int head = kvh * G + warp;
  float x[4], w[4];
  unpack4(*reinterpret_cast<const uint2*>(q + (size_t)head * D + 4 * lane), x);
  unpack4(*reinterpret_cast<const uint2*>(qw + 4 * lane), w);
  const long long first = (long long)sp * KEYS;
  const int n = (int)max(0LL, min((long long)KEYS, limit - first + 1));  // visible keys of this split
  const bool fresh = pos >= first && pos < first + KEYS;                  // holds the new row
  const int fresh_row = (int)(pos - first);
  const size_t state = ((size_t)kvh * nsplit + sp) * rows + warp;
  if (n == 0 && !fresh) {  // past the last visible key: an empty state (the merge weighs it 0)
    *reinterpret_cast<float4*>(part_o + state * D + 4 * lane) = make_float4(0.f, 0.f, 0.f, 0.f);
    if (lane == 0) *reinterpret_cast<float2*>(part_ml + state * 2) = make_float2(-INFINITY, 0.f);
    if (trace != nullptr && threadIdx.x == 0) record(trace, t0, t0);
    return;
  }
  // The keys and values: 16-byte asynchronous copies of the visible rows, the new row excepted.
  const size_t row_stride = (size_t)kvn * D;  // elements between cache rows
  const bf16* kg = kc + (size_t)first * row_stride + (size_t)kvh * D;
  const bf16* vg = vc + (size_t)first * row_stride + (size_t)kvh * D;
  for (int c = threadIdx.x; c < KEYS * 16; c += G * 32) {
    const int row = c >> 4, part = c & 15;
    if (row < n && !(fresh && row == fresh_row)) {
      cp_async16(ks + row * KROW + part * 16, kg + row * row_stride + part * 8);
      cp_async16(vs + row * VROW + part * 16, vg + row * row_stride + part * 8);
    } else if (row >= n) {  // zeros: the value product runs over every row (probability 0 times stale bytes
      *reinterpret_cast<uint4*>(vs + row * VROW + part * 16) = make_uint4(0, 0, 0, 0);  // could be NaN)
    }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  float c4[4], s4[4];
  {
    const float4 cv = *reinterpret_cast<const float4*>(cos_t + pos * D + 4 * lane);
    const float4 sv = *reinterpret_cast<const float4*>(sin_t + pos * D + 4 * lane);
    c4[0] = cv.x; c4[1] = cv.y; c4[2] = cv.z; c4[3] = cv.w;
    s4[0] = sv.x; s4[1] = sv.y; s4[2] = sv.z; s4[3] = sv.w;
  }
  if (fresh && warp == 0) {  // the new key, normed and rotated, and its value: into the cache and shared memory
    float k4[4], kw4[4];
    unpack4(*reinterpret_cast<const uint2*>(kn + (size_t)kvh * D + 4 * lane), k4);
    unpack4(*reinterpret_cast<const uint2*>(kw + 4 * lane), kw4);
    const uint2 v4 = *reinterpret_cast<const uint2*>(vn + (size_t)kvh * D + 4 * lane);
    norm_rope4(k4, kw4, c4, s4, eps, lane);
    const uint2 kp = pack4(k4);
    *reinterpret_cast<uint2*>(kc + (size_t)pos * row_stride + (size_t)kvh * D + 4 * lane) = kp;
    *reinterpret_cast<uint2*>(vc + (size_t)pos * row_stride + (size_t)kvh * D + 4 * lane) = v4;
    *reinterpret_cast<uint2*>(ks + fresh_row * KROW + 8 * lane) = kp;
    *reinterpret_cast<uint2*>(vs + fresh_row * VROW + 8 * lane) = v4;
  }
  norm_rope4(x, w, c4, s4, eps, lane);  // q, while the copies are in flight
  *reinterpret_cast<uint2*>(&qs[warp][4 * lane]) = pack4(x);  // exact: x is rounded to bf16 already
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  if (trace != nullptr && threadIdx.x == 0) t1 = now_ns();

  // Scores: lane holds keys lane and lane + 32, each a full 128-dim product, q (bf16) read from shared memory by
  // the whole warp at once (a broadcast). Rows past the visible keys hold stale bytes: their scores are masked.
  float a0[2] = {0.f, 0.f}, a1[2] = {0.f, 0.f};  // two accumulators per key: shorter dependent chains
  const unsigned char* k0 = ks + lane * KROW;
  const unsigned char* k1 = ks + (lane + 32) * KROW;
#pragma unroll
  for (int part = 0; part < 16; ++part) {
    const uint4 qv = *reinterpret_cast<const uint4*>(&qs[warp][part * 8]);
    const uint4 kv0 = *reinterpret_cast<const uint4*>(k0 + part * 16);
    const uint4 kv1 = *reinterpret_cast<const uint4*>(k1 + part * 16);
    float qf[8], f0[8], f1[8];
    unpack8(qv, qf);
    unpack8(kv0, f0);
    unpack8(kv1, f1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      a0[i & 1] = fmaf(qf[i], f0[i], a0[i & 1]);
      a1[i & 1] = fmaf(qf[i], f1[i], a1[i & 1]);
    }
  }
  const float sc0 = lane < n ? (a0[0] + a0[1]) * scale : -INFINITY;
  const float sc1 = lane + 32 < n ? (a1[0] + a1[1]) * scale : -INFINITY;
  const float m = warp_max(fmaxf(sc0, sc1));
  float o[4] = {0.f, 0.f, 0.f, 0.f};
  float l = 0.f;
  if (m != -INFINITY) {
    const float p0 = sc0 == -INFINITY ? 0.f : __expf(sc0 - m), p1 = sc1 == -INFINITY ? 0.f : __expf(sc1 - m);
    l = warp_sum(p0 + p1);
    ps[warp][lane] = round_bf16(p0);  // rounded to bf16 for the product with the values
    ps[warp][lane + 32] = round_bf16(p1);
    __syncwarp();
    // Values: lane holds dims 4 lane .. 4 lane + 3 over all 64 rows (those past the visible keys are zeros).
#pragma unroll 8
    for (int j = 0; j < KEYS; ++j) {
      const float pj = ps[warp][j];
      float v4[4];
      unpack4(*reinterpret_cast<const uint2*>(vs + j * VROW + 8 * lane), v4);
#pragma unroll
      for (int i = 0; i < 4; ++i) o[i] = fmaf(pj, v4[i], o[i]);
    }
  }
  *reinterpret_cast<float4*>(part_o + state * D + 4 * lane) = make_float4(o[0], o[1], o[2], o[3]);
  if (lane == 0) *reinterpret_cast<float2*>(part_ml + state * 2) = make_float2(m, l);
  if (trace != nullptr && threadIdx.x == 0) record(trace, t0, t1);
}

}  // namespace

#define DECODE_SPLIT(G)                                                                                          \
  extern "C" __global__ void __launch_bounds__(G * 32) decode_split_g##G(                                       \
      const bf16* q, const bf16* kn, const bf16* vn, const bf16* qw, const bf16* kw, const float* cos_t,         \
      const float* sin_t, const long long* pos, const long long* limit, bf16* kc, bf16* vc, float* part_o,      \
      float* part_ml, int rows, float scale, float eps, unsigned long long* trace) {                             \
    split<G>(q, kn, vn, qw, kw, cos_t, sin_t, pos, limit, kc, vc, part_o, part_ml, rows, scale, eps, trace);    \
  }

DECODE_SPLIT(1)
DECODE_SPLIT(2)
DECODE_SPLIT(4)
DECODE_SPLIT(8)
