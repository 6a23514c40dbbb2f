// Decode attention in one kernel: a thread-block cluster per KV head, its blocks sharing the visible keys
// evenly (the length read from device memory), their partial softmax states merged through distributed shared
// memory, so no merge kernel runs and no partial state goes through global memory.
//
// Grid (C, KV heads), cluster (C, 1, 1), WARPS warps a block. Each warp reads key pairs (a half-warp per key,
// 16 bytes a lane: D = 128 bf16), U pairs in flight, and keeps an online softmax per half-warp for the G query
// heads of its KV head. Warps merge in shared memory, then blocks across the cluster: block r writes the
// outputs r*per .. (r+1)*per - 1 of its KV head's G*D.
#include <cooperative_groups.h>
#include <cuda_bf16.h>

namespace cg = cooperative_groups;

constexpr int D = 128;
constexpr int WARPS = 8;

__device__ __forceinline__ void unpack8(uint4 raw, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float2 x = __bfloat1622float2(h[i]);
        f[2 * i] = x.x;
        f[2 * i + 1] = x.y;
    }
}

template <int G, int U>
__device__ __forceinline__ void attend(const __nv_bfloat16* __restrict__ q, int q_sh,
                                       const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
                                       int k_ss, int k_sh, int v_ss, int v_sh, const long long* __restrict__ limit,
                                       __nv_bfloat16* __restrict__ out, float scale, int pdl) {
    cg::cluster_group cluster = cg::this_cluster();
    const int C = cluster.num_blocks(), rank = cluster.block_rank();
    const int kvh = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane / 16, sub = lane % 16;
    __shared__ float w_m[WARPS][G], w_l[WARPS][G];
    __shared__ __align__(16) float w_acc[WARPS][G][D];
    __shared__ float c_m[G], c_l[G];
    __shared__ __align__(16) float c_acc[G][D];

    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (pdl) asm volatile("griddepcontrol.launch_dependents;");
    const int n = (int)limit[0] + 1;
    const int chunk = (((n + C - 1) / C) + 1) & ~1;
    const int lo = rank * chunk, hi = min(n, lo + chunk);

    const float sc = scale * 1.4426950408889634f;  // exp2 below
    float qf[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        unpack8(*reinterpret_cast<const uint4*>(q + (kvh * G + g) * q_sh + sub * 8), qf[g]);
#pragma unroll
        for (int i = 0; i < 8; ++i) qf[g][i] *= sc;
    }
    float m[G], l[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = -1e30f;
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
    }
    const __nv_bfloat16* kb = k + kvh * k_sh + sub * 8;
    const __nv_bfloat16* vb = v + kvh * v_sh + sub * 8;
    for (int base = lo + 2 * warp + half; base - half < hi; base += 2 * WARPS * U) {
        uint4 kr[U], vr[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = base + 2 * WARPS * u;
            if (j < hi) {
                kr[u] = __ldcs(reinterpret_cast<const uint4*>(kb + (long long)j * k_ss));
                vr[u] = __ldcs(reinterpret_cast<const uint4*>(vb + (long long)j * v_ss));
            } else {
                kr[u] = make_uint4(0, 0, 0, 0);
                vr[u] = make_uint4(0, 0, 0, 0);
            }
        }
        float s[U][G];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float kf[8];
            unpack8(kr[u], kf);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float d = 0.f;
#pragma unroll
                for (int i = 0; i < 8; ++i) d = fmaf(qf[g][i], kf[i], d);
                s[u][g] = d;
            }
        }
#pragma unroll
        for (int off = 8; off >= 1; off >>= 1)
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int g = 0; g < G; ++g) s[u][g] += __shfl_xor_sync(0xffffffffu, s[u][g], off);
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (base + 2 * WARPS * u >= hi)
#pragma unroll
                for (int g = 0; g < G; ++g) s[u][g] = -INFINITY;
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < U; ++u) mx = fmaxf(mx, s[u][g]);
            const float corr = exp2f(m[g] - mx);
            l[g] *= corr;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] *= corr;
            m[g] = mx;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float vf[8];
            unpack8(vr[u], vf);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float p = exp2f(s[u][g] - m[g]);
                l[g] += p;
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(p, vf[i], acc[g][i]);
            }
        }
    }
    // The warp's two half-warps (the same dims of different keys), then the block's warps.
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float mo = __shfl_xor_sync(0xffffffffu, m[g], 16), lo_ = __shfl_xor_sync(0xffffffffu, l[g], 16);
        const float mx = fmaxf(m[g], mo), a = exp2f(m[g] - mx), b = exp2f(mo - mx);
        l[g] = l[g] * a + lo_ * b;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = acc[g][i] * a + __shfl_xor_sync(0xffffffffu, acc[g][i], 16) * b;
        m[g] = mx;
        if (half == 0) {
#pragma unroll
            for (int i = 0; i < 8; ++i) w_acc[warp][g][sub * 8 + i] = acc[g][i];
            if (sub == 0) {
                w_m[warp][g] = m[g];
                w_l[warp][g] = l[g];
            }
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < G * D; t += WARPS * 32) {
        const int g = t / D, d = t % D;
        float mx = -1e30f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, w_m[w][g]);
        float ls = 0.f, a = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float e = exp2f(w_m[w][g] - mx);
            ls += w_l[w][g] * e;
            a += w_acc[w][g][d] * e;
        }
        c_acc[g][d] = a;
        if (d == 0) {
            c_m[g] = mx;
            c_l[g] = ls;
        }
    }
    cluster.sync();
    const int per = (G * D + C - 1) / C;
    if (threadIdx.x < per) {
        const int t = rank * per + threadIdx.x;
        if (t < G * D) {
            const int g = t / D, d = t % D;
            float ms[16], ls[16], as[16];
            float mx = -1e30f;
#pragma unroll
            for (int r = 0; r < 16; ++r)
                if (r < C) {
                    ms[r] = *cluster.map_shared_rank(&c_m[g], r);
                    ls[r] = *cluster.map_shared_rank(&c_l[g], r);
                    as[r] = *cluster.map_shared_rank(&c_acc[g][d], r);
                }
#pragma unroll
            for (int r = 0; r < 16; ++r)
                if (r < C) mx = fmaxf(mx, ms[r]);
            float L = 0.f, A = 0.f;
#pragma unroll
            for (int r = 0; r < 16; ++r)
                if (r < C) {
                    const float e = exp2f(ms[r] - mx);
                    L += ls[r] * e;
                    A += as[r] * e;
                }
            out[(kvh * G + g) * D + d] = __float2bfloat16(A / L);
        }
    }
    cluster.sync();  // no block leaves while another still reads its shared memory
}


// The cluster's partial states merged as in `attend`: block r writes outputs r*per .. of its KV head.
template <int G>
__device__ __forceinline__ void cluster_merge(float* m, float* l, float (*acc)[8], int half, int sub, int warp,
                                              int kvh, __nv_bfloat16* __restrict__ out) {
    cg::cluster_group cluster = cg::this_cluster();
    const int C = cluster.num_blocks(), rank = cluster.block_rank();
    __shared__ float w_m[WARPS][G], w_l[WARPS][G];
    __shared__ __align__(16) float w_acc[WARPS][G][D];
    __shared__ float c_m[G], c_l[G];
    __shared__ __align__(16) float c_acc[G][D];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        const float mo = __shfl_xor_sync(0xffffffffu, m[g], 16), lo_ = __shfl_xor_sync(0xffffffffu, l[g], 16);
        const float mx = fmaxf(m[g], mo), a = exp2f(m[g] - mx), b = exp2f(mo - mx);
        l[g] = l[g] * a + lo_ * b;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = acc[g][i] * a + __shfl_xor_sync(0xffffffffu, acc[g][i], 16) * b;
        m[g] = mx;
        if (half == 0) {
#pragma unroll
            for (int i = 0; i < 8; ++i) w_acc[warp][g][sub * 8 + i] = acc[g][i];
            if (sub == 0) {
                w_m[warp][g] = m[g];
                w_l[warp][g] = l[g];
            }
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < G * D; t += WARPS * 32) {
        const int g = t / D, d = t % D;
        float mx = -1e30f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, w_m[w][g]);
        float ls = 0.f, a = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float e = exp2f(w_m[w][g] - mx);
            ls += w_l[w][g] * e;
            a += w_acc[w][g][d] * e;
        }
        c_acc[g][d] = a;
        if (d == 0) {
            c_m[g] = mx;
            c_l[g] = ls;
        }
    }
    cluster.sync();
    const int per = (G * D + C - 1) / C;
    if (threadIdx.x < per && rank * per + threadIdx.x < G * D) {
        const int t = rank * per + threadIdx.x, g = t / D, d = t % D;
        float ms[16], ls[16], as[16];
        float mx = -1e30f;
#pragma unroll
        for (int r = 0; r < 16; ++r)
            if (r < C) {
                ms[r] = *cluster.map_shared_rank(&c_m[g], r);
                ls[r] = *cluster.map_shared_rank(&c_l[g], r);
                as[r] = *cluster.map_shared_rank(&c_acc[g][d], r);
            }
#pragma unroll
        for (int r = 0; r < 16; ++r)
            if (r < C) mx = fmaxf(mx, ms[r]);
        float L = 0.f, A = 0.f;
#pragma unroll
        for (int r = 0; r < 16; ++r)
            if (r < C) {
                const float e = exp2f(ms[r] - mx);
                L += ls[r] * e;
                A += as[r] * e;
            }
        out[(kvh * G + g) * D + d] = __float2bfloat16(A / L);
    }
    cluster.sync();
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}

// As `attend`, the keys streamed through a ring of STAGES shared-memory stages of KEYS keys (cp.async), so a
// block keeps (STAGES - 1) * KEYS * 512 bytes in flight while it computes.
template <int G, int STAGES, int KEYS>
__device__ __forceinline__ void attend_pipe(const __nv_bfloat16* __restrict__ q, int q_sh,
                                            const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
                                            int k_ss, int k_sh, int v_ss, int v_sh,
                                            const long long* __restrict__ limit, __nv_bfloat16* __restrict__ out,
                                            float scale, int pdl) {
    extern __shared__ __align__(16) unsigned char ring[];
    constexpr int CHUNKS = KEYS * 16;           // 16-byte pieces of one stage's K (or V)
    constexpr int STAGE_BYTES = 2 * KEYS * D * 2;
    constexpr int PER_WARP = KEYS / WARPS;      // keys a warp scores per stage, 2 at a time
    const int C = cg::this_cluster().num_blocks(), rank = cg::this_cluster().block_rank();
    const int kvh = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane / 16, sub = lane % 16;
    if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
    uint4 qraw[G];
#pragma unroll
    for (int g = 0; g < G; ++g) qraw[g] = *reinterpret_cast<const uint4*>(q + (kvh * G + g) * q_sh + sub * 8);
    const int n = (int)limit[0] + 1;
    if (pdl) asm volatile("griddepcontrol.launch_dependents;");
    const int chunk = (((n + C - 1) / C) + KEYS - 1) / KEYS * KEYS;
    const int lo = rank * chunk, hi = min(n, lo + chunk);
    const int stages = hi > lo ? (hi - lo + KEYS - 1) / KEYS : 0;
    const unsigned ring_base = (unsigned)__cvta_generic_to_shared(ring);
    const __nv_bfloat16* kh = k + kvh * k_sh;
    const __nv_bfloat16* vh = v + kvh * v_sh;
    auto issue = [&](int st) {
        if (st < stages) {
            const int j0 = lo + st * KEYS;
            const unsigned slot = ring_base + (st % STAGES) * STAGE_BYTES;
#pragma unroll
            for (int idx = threadIdx.x; idx < 2 * CHUNKS; idx += WARPS * 32) {
                const int isv = idx / CHUNKS, rem = idx % CHUNKS, key = rem / 16, c = rem % 16;
                const int j = j0 + key;
                const bool ok = j < hi;
                const __nv_bfloat16* src = (isv ? vh + (long long)(ok ? j : lo) * v_ss : kh + (long long)(ok ? j : lo) * k_ss) + c * 8;
                cp_async16(slot + isv * (KEYS * D * 2) + key * (D * 2) + c * 16, src, ok);
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) issue(st);

    const float sc = scale * 1.4426950408889634f;
    float qf[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        unpack8(qraw[g], qf[g]);
#pragma unroll
        for (int i = 0; i < 8; ++i) qf[g][i] *= sc;
    }
    float m[G], l[G], acc[G][8];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = -1e30f;
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[g][i] = 0.f;
    }
    for (int st = 0; st < stages; ++st) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2));
        __syncthreads();  // stage st landed for all; every warp is done with stage st - 1 (its slot is refilled next)
        issue(st + STAGES - 1);
        const unsigned char* slot = ring + (st % STAGES) * STAGE_BYTES;
        const int j0 = lo + st * KEYS;
        constexpr int U = PER_WARP / 2;
        float s[U][G];
        uint4 vr[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int key = warp * PER_WARP + 2 * u + half;
            float kf[8];
            unpack8(*reinterpret_cast<const uint4*>(slot + key * (D * 2) + sub * 16), kf);
            vr[u] = *reinterpret_cast<const uint4*>(slot + KEYS * D * 2 + key * (D * 2) + sub * 16);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float d = 0.f;
#pragma unroll
                for (int i = 0; i < 8; ++i) d = fmaf(qf[g][i], kf[i], d);
                s[u][g] = d;
            }
        }
#pragma unroll
        for (int off = 8; off >= 1; off >>= 1)
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int g = 0; g < G; ++g) s[u][g] += __shfl_xor_sync(0xffffffffu, s[u][g], off);
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (j0 + warp * PER_WARP + 2 * u + half >= hi)
#pragma unroll
                for (int g = 0; g < G; ++g) s[u][g] = -INFINITY;
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float mx = m[g];
#pragma unroll
            for (int u = 0; u < U; ++u) mx = fmaxf(mx, s[u][g]);
            const float corr = exp2f(m[g] - mx);
            l[g] *= corr;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] *= corr;
            m[g] = mx;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float vf[8];
            unpack8(vr[u], vf);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float p = exp2f(s[u][g] - m[g]);
                l[g] += p;
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(p, vf[i], acc[g][i]);
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    cluster_merge<G>(m, l, acc, half, sub, warp, kvh, out);
}

#define CLUSTER_PIPE(G, S, K)                                                                                   \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) cluster_pipe_g##G##_s##S##_k##K(                  \
        const __nv_bfloat16* q, int q_sh, const __nv_bfloat16* k, const __nv_bfloat16* v, int k_ss, int k_sh,  \
        int v_ss, int v_sh, const long long* limit, __nv_bfloat16* out, float scale, int pdl) {                \
        attend_pipe<G, S, K>(q, q_sh, k, v, k_ss, k_sh, v_ss, v_sh, limit, out, scale, pdl);                   \
    }

CLUSTER_PIPE(4, 4, 32)
CLUSTER_PIPE(4, 6, 32)
CLUSTER_PIPE(4, 4, 64)
CLUSTER_PIPE(4, 3, 64)

#define CLUSTER_ATTN(G, U)                                                                                      \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) cluster_attn_g##G##_u##U(                         \
        const __nv_bfloat16* q, int q_sh, const __nv_bfloat16* k, const __nv_bfloat16* v, int k_ss, int k_sh,  \
        int v_ss, int v_sh, const long long* limit, __nv_bfloat16* out, float scale, int pdl) {                \
        attend<G, U>(q, q_sh, k, v, k_ss, k_sh, v_ss, v_sh, limit, out, scale, pdl);                           \
    }

CLUSTER_ATTN(4, 4)
CLUSTER_ATTN(4, 8)
CLUSTER_ATTN(2, 4)
CLUSTER_ATTN(8, 4)
