/*
kernels/attention.cuh: causal softmax self-attention (GPT-2), forward, backward and single-token decode, without
ever storing a T x T matrix (flash-attention style). The kernel lab is dev/cuda/attention.cu.

Layout (the same as train_kla.c attention_forward): qkv [B, T, 3C], row (b, t) = q (C) | k (C) | v (C); head h
uses columns h*hs .. h*hs+hs-1 of each block, hs = C / NH. out [B, T, C], head h at columns h*hs...

Math, per (b, h), with s_ij = scale * q_i . k_j (scale = 1/sqrt(hs)), j <= i:
  forward:  m_i = max_j s_ij, l_i = sum_j exp(s_ij - m_i), lse_i = m_i + log(l_i), o_i = sum_j exp(s_ij - lse_i) v_j.
            The keys are visited in tiles with an online softmax: when a tile raises the running max from m to
            m', the running sum and output are rescaled by exp(m - m') before the tile's terms are added.
  backward: p_ij = exp(s_ij - lse_i) is recomputed from the saved lse (no T x T storage), D_i = do_i . o_i, and
            dp_ij = do_i . v_j, ds_ij = p_ij (dp_ij - D_i)             (softmax backward: sum_j p_ij dp_ij = D_i)
            dv_j = sum_i p_ij do_i,  dk_j = scale sum_i ds_ij q_i,  dq_i = scale sum_j ds_ij k_j.
            Deterministic without atomics: one kernel owns a tile of keys and loops over the query tiles to
            accumulate dk, dv; a second kernel owns a tile of queries and loops over the key tiles for dq (s and
            dp are computed twice, the price of the fixed summation order). D is computed by a small kernel
            (SIMT path) or inside the dq pass, which then runs first (tensor-core path).

Two implementations:
  - SIMT (any floatX, any hs <= 128): one warp per query row (or key row in the dk/dv pass), tiles of 32
    keys (queries) in shared memory, lane j owns key j of the tile for the scores and the output dims
    lane, lane+32, ... for the accumulations. Exact fp32 arithmetic: the FP32 build uses it.
  - tensor cores (BF16 build, hs in {16, 32, 64, 128}): FlashAttention-2 style, a CTA of 4 warps per
    (b, h, 64-row tile), each warp owning 16 rows; mma.sync m16n8k16 bf16 -> fp32, K/V (or Q/dO) tiles
    double-buffered in shared memory with cp.async; softmax statistics and all accumulators in fp32. The
    probabilities (and ds) are rounded to bf16 as the A operand of the second matmul, straight from the
    accumulator registers (the m16n8 C fragment of two adjacent n-tiles is the m16k16 A fragment).
*/
#ifndef TRAIN_KLA_KERNELS_ATTENTION_CUH
#define TRAIN_KLA_KERNELS_ATTENTION_CUH

#include <math.h>
#include <stdint.h>
#include "common.cuh"
#include "mma.cuh"

#define ATT_LOG2E 1.4426950408889634f
#define ATT_LN2 0.6931471805599453f

// ----------------------------------------------------------------------------------------------------------
// SIMT kernels (exact fp32 arithmetic on floatX inputs)

#define ATT_SIMT_ROWS 8   // warps per CTA: each owns one query row (key row in the dk/dv pass)
#define ATT_SIMT_TILE 32  // keys (queries) per shared-memory tile: one per lane
#define ATT_MAX_HS 128    // the SIMT kernels keep hs / 32 <= 4 accumulators per lane

// forward: CTA = ATT_SIMT_ROWS consecutive query rows of one (b, h); grid (B*NH, ceil(T/ROWS)), heavy tiles first
template <typename Tp>
__global__ void attention_forward_simt_kernel(Tp* out, float* lse, const Tp* qkv, int T, int C, int NH, float scale) {
    extern __shared__ float att_simt_smem[];
    const int hs = C / NH;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * ATT_SIMT_ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* qs = att_simt_smem;                     // [ROWS][hs]
    float* ks = qs + ATT_SIMT_ROWS * hs;           // [TILE][hs+1] (padded: lane j reads row j, no bank conflicts)
    float* vs = ks + ATT_SIMT_TILE * (hs + 1);     // [TILE][hs]
    const size_t ld = 3 * (size_t)C;
    const Tp* base = qkv + (size_t)b * T * ld + h * hs;

    for (int i = threadIdx.x; i < ATT_SIMT_ROWS * hs; i += blockDim.x) {
        int t = q0 + i / hs;
        qs[i] = t < T ? to_float(base[(size_t)t * ld + i % hs]) : 0.0f;
    }
    const int t = q0 + warp;  // this warp's query row
    float m = -INFINITY, l = 0.0f, o[ATT_MAX_HS / 32] = {0.0f};
    const int kend = min(q0 + ATT_SIMT_ROWS, T);  // keys 0 .. kend-1 are seen by some row of the CTA
    for (int k0 = 0; k0 < kend; k0 += ATT_SIMT_TILE) {
        __syncthreads();  // the previous tile is consumed (and the queries are loaded)
        for (int i = threadIdx.x; i < ATT_SIMT_TILE * hs; i += blockDim.x) {
            int r = i / hs, d = i % hs, tk = k0 + r;
            bool ok = tk < T;
            ks[r * (hs + 1) + d] = ok ? to_float(base[(size_t)tk * ld + C + d]) : 0.0f;
            vs[r * hs + d] = ok ? to_float(base[(size_t)tk * ld + 2 * C + d]) : 0.0f;
        }
        __syncthreads();
        const int nk = min(ATT_SIMT_TILE, t + 1 - k0);  // keys of this tile visible to row t (warp-uniform)
        if (nk <= 0) { continue; }
        float s = -INFINITY;
        if (lane < nk) {
            float acc = 0.0f;
            for (int d = 0; d < hs; d++) { acc = fmaf(qs[warp * hs + d], ks[lane * (hs + 1) + d], acc); }
            s = acc * scale;
        }
        // online softmax: rescale the running sum and output to the new max
        float m_new = fmaxf(m, warp_reduce_max(s));
        float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
        float p = expf(s - m_new);      // 0 for the masked lanes
        l = l * alpha + warp_reduce_sum(p);
        m = m_new;
        for (int i = 0; i < ATT_MAX_HS / 32; i++) { o[i] *= alpha; }
        for (int j = 0; j < nk; j++) {
            float pj = __shfl_sync(0xffffffffu, p, j);
            for (int i = 0; i < ATT_MAX_HS / 32; i++) {
                int d = lane + 32 * i;
                if (d < hs) { o[i] = fmaf(pj, vs[j * hs + d], o[i]); }
            }
        }
    }
    if (t < T) {
        Tp* orow = out + ((size_t)b * T + t) * C + h * hs;
        for (int i = 0; i < ATT_MAX_HS / 32; i++) {
            int d = lane + 32 * i;
            if (d < hs) { orow[d] = from_float<Tp>(o[i] / l); }
        }
        if (lane == 0) { lse[(size_t)bh * T + t] = m + logf(l); }
    }
}

// backward preprocessing: Dsum[b, h, t] = do_t . o_t for head h. One warp per (b, t, h).
template <typename Tp>
__global__ void attention_backward_rowdot_kernel(float* Dsum, const Tp* dout, const Tp* out, int B, int T, int C,
                                                 int NH) {
    const int hs = C / NH;
    const size_t idx = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (idx >= (size_t)B * T * NH) { return; }
    const int h = idx % NH;
    const size_t bt = idx / NH;
    const int b = bt / T, t = bt % T;
    const Tp* dy = dout + bt * C + h * hs;
    const Tp* y = out + bt * C + h * hs;
    float acc = 0.0f;
    for (int d = lane; d < hs; d += 32) { acc = fmaf(to_float(dy[d]), to_float(y[d]), acc); }
    acc = warp_reduce_sum(acc);
    if (lane == 0) { Dsum[((size_t)b * NH + h) * T + t] = acc; }
}

// dk, dv: CTA = ATT_SIMT_ROWS consecutive key rows of one (b, h), looping over the tiles of queries i >= key
template <typename Tp>
__global__ void attention_backward_dkv_simt_kernel(Tp* dqkv, const Tp* dout, const Tp* qkv, const float* lse,
                                                   const float* Dsum, int T, int C, int NH, float scale) {
    extern __shared__ float att_simt_smem[];
    const int hs = C / NH;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int k0 = blockIdx.y * ATT_SIMT_ROWS;  // the low key rows see the most queries: they go first
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* kr = att_simt_smem;                  // [ROWS][hs] this CTA's keys
    float* vr = kr + ATT_SIMT_ROWS * hs;        // [ROWS][hs] and values
    float* qs = vr + ATT_SIMT_ROWS * hs;        // [TILE][hs+1] query tile
    float* dos = qs + ATT_SIMT_TILE * (hs + 1); // [TILE][hs+1] its output gradients
    float* ls = dos + ATT_SIMT_TILE * (hs + 1); // [TILE] its lse
    float* ds_ = ls + ATT_SIMT_TILE;            // [TILE] its D
    const size_t ld = 3 * (size_t)C;
    const Tp* base = qkv + (size_t)b * T * ld + h * hs;
    const Tp* dbase = dout + (size_t)b * T * C + h * hs;

    for (int i = threadIdx.x; i < ATT_SIMT_ROWS * hs; i += blockDim.x) {
        int tk = k0 + i / hs, d = i % hs;
        kr[i] = tk < T ? to_float(base[(size_t)tk * ld + C + d]) : 0.0f;
        vr[i] = tk < T ? to_float(base[(size_t)tk * ld + 2 * C + d]) : 0.0f;
    }
    const int key = k0 + warp;
    float dk[ATT_MAX_HS / 32] = {0.0f}, dv[ATT_MAX_HS / 32] = {0.0f};
    for (int q0 = k0 - k0 % ATT_SIMT_TILE; q0 < T; q0 += ATT_SIMT_TILE) {
        __syncthreads();
        for (int i = threadIdx.x; i < ATT_SIMT_TILE * hs; i += blockDim.x) {
            int r = i / hs, d = i % hs, tq = q0 + r;
            bool ok = tq < T;
            qs[r * (hs + 1) + d] = ok ? to_float(base[(size_t)tq * ld + d]) : 0.0f;
            dos[r * (hs + 1) + d] = ok ? to_float(dbase[(size_t)tq * C + d]) : 0.0f;
        }
        for (int i = threadIdx.x; i < ATT_SIMT_TILE; i += blockDim.x) {
            int tq = q0 + i;
            ls[i] = tq < T ? lse[(size_t)bh * T + tq] : 0.0f;
            ds_[i] = tq < T ? Dsum[(size_t)bh * T + tq] : 0.0f;
        }
        __syncthreads();
        // lane i: query q0 + i against this warp's key
        const int tq = q0 + lane;
        float p = 0.0f, ds = 0.0f;
        if (tq >= key && tq < T && key < T) {
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < hs; d++) {
                s = fmaf(qs[lane * (hs + 1) + d], kr[warp * hs + d], s);
                dp = fmaf(dos[lane * (hs + 1) + d], vr[warp * hs + d], dp);
            }
            p = expf(s * scale - ls[lane]);
            ds = p * (dp - ds_[lane]);
        }
        for (int j = 0; j < ATT_SIMT_TILE; j++) {
            float pj = __shfl_sync(0xffffffffu, p, j);
            float dsj = __shfl_sync(0xffffffffu, ds, j);
            for (int i = 0; i < ATT_MAX_HS / 32; i++) {
                int d = lane + 32 * i;
                if (d < hs) {
                    dv[i] = fmaf(pj, dos[j * (hs + 1) + d], dv[i]);
                    dk[i] = fmaf(dsj, qs[j * (hs + 1) + d], dk[i]);
                }
            }
        }
    }
    if (key < T) {
        Tp* row = dqkv + ((size_t)b * T + key) * ld + h * hs;
        for (int i = 0; i < ATT_MAX_HS / 32; i++) {
            int d = lane + 32 * i;
            if (d < hs) {
                row[C + d] = from_float<Tp>(dk[i] * scale);
                row[2 * C + d] = from_float<Tp>(dv[i]);
            }
        }
    }
}

// dq: CTA = ATT_SIMT_ROWS consecutive query rows of one (b, h), looping over the key tiles j <= query
template <typename Tp>
__global__ void attention_backward_dq_simt_kernel(Tp* dqkv, const Tp* dout, const Tp* qkv, const float* lse,
                                                  const float* Dsum, int T, int C, int NH, float scale) {
    extern __shared__ float att_simt_smem[];
    const int hs = C / NH;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * ATT_SIMT_ROWS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* qr = att_simt_smem;                 // [ROWS][hs] this CTA's queries
    float* dor = qr + ATT_SIMT_ROWS * hs;      // [ROWS][hs] and their output gradients
    float* ks = dor + ATT_SIMT_ROWS * hs;      // [TILE][hs+1] key tile
    float* vs = ks + ATT_SIMT_TILE * (hs + 1); // [TILE][hs+1] value tile
    const size_t ld = 3 * (size_t)C;
    const Tp* base = qkv + (size_t)b * T * ld + h * hs;

    for (int i = threadIdx.x; i < ATT_SIMT_ROWS * hs; i += blockDim.x) {
        int tq = q0 + i / hs, d = i % hs;
        qr[i] = tq < T ? to_float(base[(size_t)tq * ld + d]) : 0.0f;
        dor[i] = tq < T ? to_float(dout[((size_t)b * T + tq) * C + h * hs + d]) : 0.0f;
    }
    const int t = q0 + warp;
    const float lse_t = t < T ? lse[(size_t)bh * T + t] : 0.0f;
    const float D_t = t < T ? Dsum[(size_t)bh * T + t] : 0.0f;
    float dq[ATT_MAX_HS / 32] = {0.0f};
    const int kend = min(q0 + ATT_SIMT_ROWS, T);
    for (int k0 = 0; k0 < kend; k0 += ATT_SIMT_TILE) {
        __syncthreads();
        for (int i = threadIdx.x; i < ATT_SIMT_TILE * hs; i += blockDim.x) {
            int r = i / hs, d = i % hs, tk = k0 + r;
            bool ok = tk < T;
            ks[r * (hs + 1) + d] = ok ? to_float(base[(size_t)tk * ld + C + d]) : 0.0f;
            vs[r * (hs + 1) + d] = ok ? to_float(base[(size_t)tk * ld + 2 * C + d]) : 0.0f;
        }
        __syncthreads();
        const int nk = min(ATT_SIMT_TILE, t + 1 - k0);  // keys of this tile visible to row t
        if (nk <= 0 || t >= T) { continue; }
        float ds = 0.0f;
        if (lane < nk) {
            float s = 0.0f, dp = 0.0f;
            for (int d = 0; d < hs; d++) {
                s = fmaf(qr[warp * hs + d], ks[lane * (hs + 1) + d], s);
                dp = fmaf(dor[warp * hs + d], vs[lane * (hs + 1) + d], dp);
            }
            float p = expf(s * scale - lse_t);
            ds = p * (dp - D_t);
        }
        for (int j = 0; j < nk; j++) {
            float dsj = __shfl_sync(0xffffffffu, ds, j);
            for (int i = 0; i < ATT_MAX_HS / 32; i++) {
                int d = lane + 32 * i;
                if (d < hs) { dq[i] = fmaf(dsj, ks[j * (hs + 1) + d], dq[i]); }
            }
        }
    }
    if (t < T) {
        Tp* row = dqkv + ((size_t)b * T + t) * ld + h * hs;
        for (int i = 0; i < ATT_MAX_HS / 32; i++) {
            int d = lane + 32 * i;
            if (d < hs) { row[d] = from_float<Tp>(dq[i] * scale); }
        }
    }
}

static void attention_check_shape(int C, int NH) {
    if (NH <= 0 || C % NH != 0 || C / NH > ATT_MAX_HS) {
        die("attention: C=%d, NH=%d: the head size must divide C and be at most %d", C, NH, ATT_MAX_HS);
    }
}

static void attention_forward_simt(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                                   cudaStream_t stream) {
    attention_check_shape(C, NH);
    const int hs = C / NH;
    const size_t smem = (ATT_SIMT_ROWS * hs + ATT_SIMT_TILE * (2 * hs + 1)) * sizeof(float);
    dim3 grid(B * NH, ceil_div(T, ATT_SIMT_ROWS));
    attention_forward_simt_kernel<floatX><<<grid, ATT_SIMT_ROWS * 32, smem, stream>>>(out, lse, qkv, T, C, NH,
                                                                                     1.0f / sqrtf((float)hs));
    cudaCheckLaunch();
}

static void attention_backward_rowdot(float* Dsum, const floatX* dout, const floatX* out, int B, int T, int C, int NH,
                                      cudaStream_t stream) {
    const int warps = 8;
    const size_t n = (size_t)B * T * NH;
    attention_backward_rowdot_kernel<floatX><<<(unsigned)ceil_div_z(n, warps), warps * 32, 0, stream>>>(
        Dsum, dout, out, B, T, C, NH);
    cudaCheckLaunch();
}

static void attention_backward_simt(floatX* dqkv, float* Dsum, const floatX* dout, const floatX* qkv,
                                    const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
    attention_check_shape(C, NH);
    const int hs = C / NH;
    const float scale = 1.0f / sqrtf((float)hs);
    const size_t smem = (2 * ATT_SIMT_ROWS * hs + 2 * ATT_SIMT_TILE * (hs + 1) + 2 * ATT_SIMT_TILE) * sizeof(float);
    dim3 grid(B * NH, ceil_div(T, ATT_SIMT_ROWS));
    attention_backward_dkv_simt_kernel<floatX><<<grid, ATT_SIMT_ROWS * 32, smem, stream>>>(dqkv, dout, qkv, lse, Dsum,
                                                                                          T, C, NH, scale);
    cudaCheckLaunch();
    attention_backward_dq_simt_kernel<floatX><<<grid, ATT_SIMT_ROWS * 32, smem, stream>>>(dqkv, dout, qkv, lse, Dsum,
                                                                                         T, C, NH, scale);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// tensor-core kernels (BF16 build), on kernels/mma.cuh's fragments (its header gives their layout). Shared-memory
// tiles are [rows][HS + 8] bf16: the 16-byte row padding puts the 8 rows that one ldmatrix phase reads into
// distinct bank groups.
#if defined(ENABLE_BF16)

#define ATT_MMA_WARPS 4
#define ATT_MMA_THREADS (ATT_MMA_WARPS * 32)
#define ATT_MMA_ROWS 64  // rows of a CTA's own tile (queries, or keys in the dk/dv pass): 16 per warp
#define ATT_MMA_TILE 64  // rows of the streamed K/V tiles (forward, dq)

__device__ __forceinline__ int att_ceil_div(int a, int b) { return (a + b - 1) / b; }

// 4-byte global -> shared copy (lse and D rows are not 16-byte aligned; kernels/mma.cuh has the 16-byte one),
// zero-filling the destination when !valid; in flight until cp_async_wait as cp_async16's
__device__ __forceinline__ void att_cp_async4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}

// ROWS x HS bf16 rows r0.. of a global matrix (row stride ld elements) -> shared [ROWS][HS+8]; rows >= T zero
template <int HS, int ROWS>
__device__ __forceinline__ void att_load_tile(__nv_bfloat16* s, const __nv_bfloat16* g, size_t ld, int r0, int T) {
    constexpr int CHUNKS = HS / 8;  // 16-byte chunks per row
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += ATT_MMA_THREADS) {
        int r = i / CHUNKS, c = i % CHUNKS, t = r0 + r;
        bool ok = t < T;
        cp_async16(s + r * (HS + 8) + c * 8, g + (size_t)(ok ? t : 0) * ld + c * 8, ok ? 16 : 0);
    }
}

// the A fragments of a warp's 16 rows (row0..row0+15) of a shared tile, all HS columns
template <int HS>
__device__ __forceinline__ void att_load_a(uint32_t a[HS / 16][4], const __nv_bfloat16* s, int row0, int lane) {
#pragma unroll
    for (int kc = 0; kc < HS / 16; kc++) {
        ldsm_x4(a[kc], s + ldsm_a_off(HS + 8, row0, kc * 16, lane));
    }
}

// c[n] += A * X^T over n-tiles of 8 rows of X: X is a shared [NROWS][HS+8] tile read as the k x n operand
// (B[d][j] = X[j][d]), A is the warp's 16 x HS fragment set. Used for Q K^T, dO V^T, K Q^T, V dO^T.
template <int HS, int NROWS>
__device__ __forceinline__ void att_mma_abt(float c[NROWS / 8][4], const uint32_t a[HS / 16][4],
                                            const __nv_bfloat16* x, int lane) {
#pragma unroll
    for (int kc = 0; kc < HS / 16; kc++) {
#pragma unroll
        for (int np = 0; np < NROWS / 16; np++) {
            // matrices: rows np*16+0..7 / +8..15 of X, columns kc*16+0..7 / +8..15 -> b of n-tiles 2np, 2np+1
            uint32_t r[4];
            ldsm_x4(r, x + ldsm_b_nk_off(HS + 8, kc * 16, np * 16, lane));
            mma_bf16(c[2 * np], a[kc], r[0], r[1]);
            mma_bf16(c[2 * np + 1], a[kc], r[2], r[3]);
        }
    }
}

// acc[n] += P * X over the KROWS rows of a shared [KROWS][HS+8] tile X (the k x n operand B = X, read
// transposed by ldmatrix.trans); P is given as fp32 C fragments p[KROWS/8][4] (16 x KROWS), rounded to bf16.
// Used for P V, dS K, P^T dO, dS^T Q.
template <int HS, int KROWS>
__device__ __forceinline__ void att_mma_px(float acc[HS / 8][4], const float p[KROWS / 8][4], const __nv_bfloat16* x,
                                           int lane) {
#pragma unroll
    for (int kc = 0; kc < KROWS / 16; kc++) {
        uint32_t a[4];
        c_frags_to_a(a, p[2 * kc], p[2 * kc + 1]);
#pragma unroll
        for (int dp = 0; dp < HS / 16; dp++) {
            // matrices: rows kc*16+0..7 / +8..15, columns dp*16+0..7 -> b[0], b[1] of n-tile 2dp; columns +8.. -> 2dp+1
            uint32_t r[4];
            ldsm_x4_trans(r, x + ldsm_b_kn_off(HS + 8, kc * 16, dp * 16, lane));
            mma_bf16(acc[2 * dp], a, r[0], r[1]);
            mma_bf16(acc[2 * dp + 1], a, r[2], r[3]);
        }
    }
}

// write a warp's 16 x HS fp32 C fragments (times mul) as bf16 rows row0 (= its row g) and row0 + 8 of dst
// (row stride ld), skipping rows >= T
template <int HS>
__device__ __forceinline__ void att_store_rows(__nv_bfloat16* dst, size_t ld, const float acc[HS / 8][4], int row0,
                                               int T, float mul0, float mul1, int lane) {
    const int t4 = lane & 3;
#pragma unroll
    for (int dt = 0; dt < HS / 8; dt++) {
        if (row0 < T) {
            *reinterpret_cast<uint32_t*>(dst + (size_t)row0 * ld + dt * 8 + 2 * t4) =
                pack_bf16(acc[dt][0] * mul0, acc[dt][1] * mul0);
        }
        if (row0 + 8 < T) {
            *reinterpret_cast<uint32_t*>(dst + (size_t)(row0 + 8) * ld + dt * 8 + 2 * t4) =
                pack_bf16(acc[dt][2] * mul1, acc[dt][3] * mul1);
        }
    }
}

// forward. grid (B*NH, ceil(T/64)), the query tiles near the end of the sequence (the most keys) first.
// The running max m is kept on the raw scores q.k (the scale is positive); the exponentials are taken in base 2,
// exp(scale * (x - m)) = exp2(x * c - m * c) with c = scale * log2(e): one FFMA and one EX2 per score.
template <int HS>
__global__ void __launch_bounds__(ATT_MMA_THREADS)
attention_forward_mma_kernel(__nv_bfloat16* out, float* lse, const __nv_bfloat16* qkv, int T, int C, int NH,
                             float scale_log2) {
    constexpr int BQ = ATT_MMA_ROWS, BK = ATT_MMA_TILE, SROW = HS + 8;
    extern __shared__ __align__(16) unsigned char att_mma_smem[];
    __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(att_mma_smem);  // [BQ][SROW]
    __nv_bfloat16* ks = qs + BQ * SROW;                                   // [2][BK][SROW]
    __nv_bfloat16* vs = ks + 2 * BK * SROW;                               // [2][BK][SROW]
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BQ;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
    const size_t ld = 3 * (size_t)C;
    const __nv_bfloat16* qg = qkv + (size_t)b * T * ld + h * HS;
    const __nv_bfloat16* kg = qg + C;
    const __nv_bfloat16* vg = qg + 2 * C;
    const int n_kt = att_ceil_div(min(q0 + BQ, T), BK);  // key tiles seen by some row of the CTA

    att_load_tile<HS, BQ>(qs, qg, ld, q0, T);
    att_load_tile<HS, BK>(ks, kg, ld, 0, T);
    att_load_tile<HS, BK>(vs, vg, ld, 0, T);
    cp_async_commit();

    const int wrow = q0 + warp * 16;  // the warp's first query row; this thread's rows are wrow + g, wrow + g + 8
    uint32_t qf[HS / 16][4];
    float o[HS / 8][4] = {};
    float m[2] = {-INFINITY, -INFINITY}, mc[2];  // running max of the raw scores of rows g, g+8, and m * c
    float l[2] = {0.0f, 0.0f};                     // this thread's partial sums (16 terms per tile)
    for (int kt = 0; kt < n_kt; kt++) {
        if (kt + 1 < n_kt) {  // prefetch the next K/V tile into the other buffer
            att_load_tile<HS, BK>(ks + ((kt + 1) & 1) * BK * SROW, kg, ld, (kt + 1) * BK, T);
            att_load_tile<HS, BK>(vs + ((kt + 1) & 1) * BK * SROW, vg, ld, (kt + 1) * BK, T);
        }
        cp_async_commit();
        cp_async_wait<1>();  // everything but the prefetch has landed
        __syncthreads();
        if (kt == 0) { att_load_a<HS>(qf, qs, warp * 16, lane); }
        const __nv_bfloat16* kt_s = ks + (kt & 1) * BK * SROW;
        const __nv_bfloat16* vt_s = vs + (kt & 1) * BK * SROW;

        float s[BK / 8][4] = {};
        att_mma_abt<HS, BK>(s, qf, kt_s, lane);  // S = Q K^T (unscaled)
        if (kt * BK + BK - 1 > wrow) {  // causal mask, on the tiles that reach past the warp's first row
#pragma unroll
            for (int nt = 0; nt < BK / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = kt * BK + nt * 8 + 2 * t4 + (e & 1), row = wrow + g + (e >> 1) * 8;
                    if (key > row) { s[nt][e] = -INFINITY; }
                }
            }
        }
        // online softmax. The row max over the tile: the thread's 16 values, then the 4 lanes of the quad.
        // Key tile 0 always holds key 0 <= row, so the running max is finite from the first tile on.
        float mt[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++) {
            mt[0] = fmaxf(mt[0], fmaxf(s[nt][0], s[nt][1]));
            mt[1] = fmaxf(mt[1], fmaxf(s[nt][2], s[nt][3]));
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 1));
            mt[r] = fmaxf(mt[r], __shfl_xor_sync(0xffffffffu, mt[r], 2));
            const float alpha = exp2f((m[r] - mt[r]) * scale_log2);  // 0 on the first tile
            m[r] = mt[r];
            mc[r] = m[r] * scale_log2;
            l[r] *= alpha;
#pragma unroll
            for (int dt = 0; dt < HS / 8; dt++) {
                o[dt][2 * r] *= alpha;
                o[dt][2 * r + 1] *= alpha;
            }
        }
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++) {
            s[nt][0] = exp2f(fmaf(s[nt][0], scale_log2, -mc[0]));
            s[nt][1] = exp2f(fmaf(s[nt][1], scale_log2, -mc[0]));
            s[nt][2] = exp2f(fmaf(s[nt][2], scale_log2, -mc[1]));
            s[nt][3] = exp2f(fmaf(s[nt][3], scale_log2, -mc[1]));
            l[0] += s[nt][0] + s[nt][1];
            l[1] += s[nt][2] + s[nt][3];
        }
        att_mma_px<HS, BK>(o, s, vt_s, lane);  // O += P V
        __syncthreads();  // this buffer is refilled by the prefetch of the next iteration
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    att_store_rows<HS>(out + (size_t)b * T * C + h * HS, C, o, wrow + g, T, 1.0f / l[0], 1.0f / l[1], lane);
    if (t4 == 0) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int row = wrow + g + 8 * r;
            if (row < T) { lse[(size_t)bh * T + row] = (mc[r] + log2f(l[r])) * ATT_LN2; }
        }
    }
}

// backward, dk and dv. grid (B*NH, ceil(T/64)): a CTA owns 64 keys (16 per warp, kept as A fragments in
// registers) and loops over the query tiles from the diagonal on, Q/dO/lse/D tiles double-buffered. Each warp
// computes the transposed tiles S^T = K Q^T and dP^T = V dO^T (keys as rows), so that P^T and dS^T come out
// as A fragments for dV += P^T dO and dK += dS^T Q without leaving the registers.
template <int HS>
__global__ void __launch_bounds__(ATT_MMA_THREADS)
attention_backward_dkv_mma_kernel(__nv_bfloat16* dqkv, const __nv_bfloat16* dout, const __nv_bfloat16* qkv,
                                  const float* lse, const float* Dsum, int T, int C, int NH, float scale,
                                  float scale_log2) {
    constexpr int BKV = ATT_MMA_ROWS, BQ = HS <= 64 ? 64 : 32, SROW = HS + 8;  // BQ 32 at hs 128: registers
    extern __shared__ __align__(16) unsigned char att_mma_smem[];
    __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(att_mma_smem);  // [BKV][SROW]
    __nv_bfloat16* vs = ks + BKV * SROW;                                  // [BKV][SROW]
    __nv_bfloat16* qs = vs + BKV * SROW;                                  // [2][BQ][SROW]
    __nv_bfloat16* dos = qs + 2 * BQ * SROW;                              // [2][BQ][SROW]
    float* ls = reinterpret_cast<float*>(dos + 2 * BQ * SROW);            // [2][BQ] lse * log2(e)
    float* dsum = ls + 2 * BQ;                                            // [2][BQ] D
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int k0 = blockIdx.y * BKV;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
    const size_t ld = 3 * (size_t)C;
    const __nv_bfloat16* qg = qkv + (size_t)b * T * ld + h * HS;
    const __nv_bfloat16* dog = dout + (size_t)b * T * C + h * HS;
    const float* lg = lse + (size_t)bh * T;
    const float* dg = Dsum + (size_t)bh * T;
    const int qt0 = k0 / BQ, n_qt = att_ceil_div(T, BQ);

    // one pipeline stage: the Q, dO, lse, D rows of query tile qt into buffer buf
    auto load_q_tile = [&](int qt, int buf) {
        att_load_tile<HS, BQ>(qs + buf * BQ * SROW, qg, ld, qt * BQ, T);
        att_load_tile<HS, BQ>(dos + buf * BQ * SROW, dog, C, qt * BQ, T);
        for (int i = threadIdx.x; i < BQ; i += ATT_MMA_THREADS) {
            const int t = qt * BQ + i;
            const bool ok = t < T;
            att_cp_async4(ls + buf * BQ + i, lg + (ok ? t : 0), ok);
            att_cp_async4(dsum + buf * BQ + i, dg + (ok ? t : 0), ok);
        }
    };
    att_load_tile<HS, BKV>(ks, qg + C, ld, k0, T);
    att_load_tile<HS, BKV>(vs, qg + 2 * C, ld, k0, T);
    load_q_tile(qt0, 0);
    cp_async_commit();

    const int wkey = k0 + warp * 16;  // the warp's first key; this thread's keys are wkey + g, wkey + g + 8
    uint32_t kf[HS / 16][4], vf[HS / 16][4];
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
    for (int qt = qt0; qt < n_qt; qt++) {
        const int buf = (qt - qt0) & 1;
        if (qt + 1 < n_qt) { load_q_tile(qt + 1, buf ^ 1); }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (qt == qt0) {
            att_load_a<HS>(kf, ks, warp * 16, lane);
            att_load_a<HS>(vf, vs, warp * 16, lane);
        }
        const __nv_bfloat16* q_s = qs + buf * BQ * SROW;
        const __nv_bfloat16* do_s = dos + buf * BQ * SROW;
        const float* l_s = ls + buf * BQ;
        const float* d_s = dsum + buf * BQ;

        float st[BQ / 8][4] = {}, dpt[BQ / 8][4] = {};
        att_mma_abt<HS, BQ>(st, kf, q_s, lane);    // S^T = K Q^T
        att_mma_abt<HS, BQ>(dpt, vf, do_s, lane);  // dP^T = V dO^T
        // P^T = exp(s - lse) on query >= key, query < T; dS^T = P^T (dP^T - D)
#pragma unroll
        for (int nt = 0; nt < BQ / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = nt * 8 + 2 * t4 + (e & 1), query = qt * BQ + qi, key = wkey + g + (e >> 1) * 8;
                const float p = (query >= key && query < T) ? exp2f(st[nt][e] * scale_log2 - l_s[qi] * ATT_LOG2E)
                                                            : 0.0f;
                st[nt][e] = p;
                dpt[nt][e] = p * (dpt[nt][e] - d_s[qi]);
            }
        }
        att_mma_px<HS, BQ>(dv, st, do_s, lane);  // dV += P^T dO
        att_mma_px<HS, BQ>(dk, dpt, q_s, lane);  // dK += dS^T Q
        __syncthreads();
    }
    __nv_bfloat16* dkg = dqkv + (size_t)b * T * ld + C + h * HS;
    att_store_rows<HS>(dkg, ld, dk, wkey + g, T, scale, scale, lane);
    att_store_rows<HS>(dkg + C, ld, dv, wkey + g, T, 1.0f, 1.0f, lane);
}

// backward, dq (runs first). grid (B*NH, ceil(T/64)): a CTA owns 64 queries (16 per warp, Q and dO as A
// fragments); it computes their D = rowsum(dO * O) (also written to Dsum for the dk/dv pass) and loops over the
// key tiles up to the diagonal, K/V double-buffered: S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K.
template <int HS>
__global__ void __launch_bounds__(ATT_MMA_THREADS)
attention_backward_dq_mma_kernel(__nv_bfloat16* dqkv, float* Dsum, const __nv_bfloat16* dout,
                                 const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* lse, int T, int C,
                                 int NH, float scale, float scale_log2) {
    static_assert(ATT_MMA_THREADS == 2 * ATT_MMA_ROWS, "D: two threads per query row");
    __shared__ float drow[ATT_MMA_ROWS];
    constexpr int BQ = ATT_MMA_ROWS, BK = ATT_MMA_TILE, SROW = HS + 8;
    extern __shared__ __align__(16) unsigned char att_mma_smem[];
    __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(att_mma_smem);  // [BQ][SROW]
    __nv_bfloat16* dos = qs + BQ * SROW;                                  // [BQ][SROW]
    __nv_bfloat16* ks = dos + BQ * SROW;                                  // [2][BK][SROW]
    __nv_bfloat16* vs = ks + 2 * BK * SROW;                               // [2][BK][SROW]
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * BQ;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t4 = lane & 3;
    const size_t ld = 3 * (size_t)C;
    const __nv_bfloat16* qg = qkv + (size_t)b * T * ld + h * HS;
    const __nv_bfloat16* kg = qg + C;
    const __nv_bfloat16* vg = qg + 2 * C;
    const int n_kt = att_ceil_div(min(q0 + BQ, T), BK);

    att_load_tile<HS, BQ>(qs, qg, ld, q0, T);
    att_load_tile<HS, BQ>(dos, dout + (size_t)b * T * C + h * HS, C, q0, T);
    att_load_tile<HS, BK>(ks, kg, ld, 0, T);
    att_load_tile<HS, BK>(vs, vg, ld, 0, T);
    cp_async_commit();

    const int wrow = q0 + warp * 16;
    float lse2[2], dr[2];  // lse * log2(e) and D of this thread's rows wrow + g, wrow + g + 8
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = wrow + g + 8 * r;
        lse2[r] = row < T ? lse[(size_t)bh * T + row] * ATT_LOG2E : 0.0f;
    }
    uint32_t qf[HS / 16][4], df[HS / 16][4];
    float dq[HS / 8][4] = {};
    for (int kt = 0; kt < n_kt; kt++) {
        if (kt + 1 < n_kt) {
            att_load_tile<HS, BK>(ks + ((kt + 1) & 1) * BK * SROW, kg, ld, (kt + 1) * BK, T);
            att_load_tile<HS, BK>(vs + ((kt + 1) & 1) * BK * SROW, vg, ld, (kt + 1) * BK, T);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (kt == 0) {
            att_load_a<HS>(qf, qs, warp * 16, lane);
            att_load_a<HS>(df, dos, warp * 16, lane);
            // D: thread pair (2r, 2r+1) takes the two halves of row q0 + r, dO from shared memory, O from global
            const int r = threadIdx.x >> 1, half = threadIdx.x & 1, row = q0 + r;
            float acc = 0.0f;
            if (row < T) {
                const __nv_bfloat16* orow = out + ((size_t)b * T + row) * C + h * HS + half * (HS / 2);
                const __nv_bfloat16* drow_s = dos + r * SROW + half * (HS / 2);
#pragma unroll
                for (int c = 0; c < HS / 16; c++) {  // 8 elements (16 bytes) at a time
                    const uint4 ov = *reinterpret_cast<const uint4*>(orow + c * 8);
                    const uint4 dv = *reinterpret_cast<const uint4*>(drow_s + c * 8);
                    const __nv_bfloat162* o2 = reinterpret_cast<const __nv_bfloat162*>(&ov);
                    const __nv_bfloat162* d2 = reinterpret_cast<const __nv_bfloat162*>(&dv);
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const float2 of = __bfloat1622float2(o2[i]), df2 = __bfloat1622float2(d2[i]);
                        acc = fmaf(of.x, df2.x, acc);
                        acc = fmaf(of.y, df2.y, acc);
                    }
                }
            }
            acc += __shfl_xor_sync(0xffffffffu, acc, 1);
            if (half == 0) {
                drow[r] = acc;
                if (row < T) { Dsum[(size_t)bh * T + row] = acc; }
            }
            __syncthreads();
            dr[0] = drow[warp * 16 + g];
            dr[1] = drow[warp * 16 + g + 8];
        }
        const __nv_bfloat16* kt_s = ks + (kt & 1) * BK * SROW;
        const __nv_bfloat16* vt_s = vs + (kt & 1) * BK * SROW;

        float s[BK / 8][4] = {}, dp[BK / 8][4] = {};
        att_mma_abt<HS, BK>(s, qf, kt_s, lane);   // S = Q K^T
        att_mma_abt<HS, BK>(dp, df, vt_s, lane);  // dP = dO V^T
#pragma unroll
        for (int nt = 0; nt < BK / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1, key = kt * BK + nt * 8 + 2 * t4 + (e & 1), row = wrow + g + 8 * r;
                const float p = (key <= row && row < T) ? exp2f(s[nt][e] * scale_log2 - lse2[r]) : 0.0f;
                s[nt][e] = p * (dp[nt][e] - dr[r]);  // dS
            }
        }
        att_mma_px<HS, BK>(dq, s, kt_s, lane);  // dQ += dS K
        __syncthreads();
    }
    att_store_rows<HS>(dqkv + (size_t)b * T * ld + h * HS, ld, dq, wrow + g, T, scale, scale, lane);
}

template <int HS> static size_t attention_forward_mma_smem() {
    return (size_t)(ATT_MMA_ROWS + 4 * ATT_MMA_TILE) * (HS + 8) * sizeof(__nv_bfloat16);
}
template <int HS> static size_t attention_dkv_mma_smem() {
    constexpr int BQ = HS <= 64 ? 64 : 32;
    return (size_t)(2 * ATT_MMA_ROWS + 4 * BQ) * (HS + 8) * sizeof(__nv_bfloat16) + 4 * BQ * sizeof(float);
}
template <int HS> static size_t attention_dq_mma_smem() {
    return (size_t)(2 * ATT_MMA_ROWS + 4 * ATT_MMA_TILE) * (HS + 8) * sizeof(__nv_bfloat16);
}

template <int HS>
static void attention_forward_mma(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                                  cudaStream_t stream) {
    const size_t smem = attention_forward_mma_smem<HS>();
    cudaCheck(cudaFuncSetAttribute(attention_forward_mma_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)smem));
    dim3 grid(B * NH, ceil_div(T, ATT_MMA_ROWS));
    attention_forward_mma_kernel<HS><<<grid, ATT_MMA_THREADS, smem, stream>>>(
        out, lse, qkv, T, C, NH, ATT_LOG2E / sqrtf((float)HS));
    cudaCheckLaunch();
}

// the two backward passes (each overwrites its own part of dqkv): dq first, it also computes D for dk/dv
template <int HS>
static void attention_backward_dkv_mma(floatX* dqkv, const float* Dsum, const floatX* dout, const floatX* qkv,
                                       const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t smem = attention_dkv_mma_smem<HS>();
    cudaCheck(cudaFuncSetAttribute(attention_backward_dkv_mma_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)smem));
    dim3 grid(B * NH, ceil_div(T, ATT_MMA_ROWS));
    attention_backward_dkv_mma_kernel<HS><<<grid, ATT_MMA_THREADS, smem, stream>>>(
        dqkv, dout, qkv, lse, Dsum, T, C, NH, scale, scale * ATT_LOG2E);
    cudaCheckLaunch();
}
template <int HS>
static void attention_backward_dq_mma(floatX* dqkv, float* Dsum, const floatX* dout, const floatX* qkv,
                                      const floatX* out, const float* lse, int B, int T, int C, int NH,
                                      cudaStream_t stream) {
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t smem = attention_dq_mma_smem<HS>();
    cudaCheck(cudaFuncSetAttribute(attention_backward_dq_mma_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)smem));
    dim3 grid(B * NH, ceil_div(T, ATT_MMA_ROWS));
    attention_backward_dq_mma_kernel<HS><<<grid, ATT_MMA_THREADS, smem, stream>>>(
        dqkv, Dsum, dout, qkv, out, lse, T, C, NH, scale, scale * ATT_LOG2E);
    cudaCheckLaunch();
}
template <int HS>
static void attention_backward_mma(floatX* dqkv, float* Dsum, const floatX* dout, const floatX* qkv,
                                   const floatX* out, const float* lse, int B, int T, int C, int NH,
                                   cudaStream_t stream) {
    attention_backward_dq_mma<HS>(dqkv, Dsum, dout, qkv, out, lse, B, T, C, NH, stream);
    attention_backward_dkv_mma<HS>(dqkv, Dsum, dout, qkv, lse, B, T, C, NH, stream);
}

// the head sizes with a tensor-core kernel
static bool attention_has_mma(int C, int NH) {
    const int hs = C / NH;
    return C % NH == 0 && (hs == 16 || hs == 32 || hs == 64 || hs == 128);
}
#endif  // ENABLE_BF16

// ----------------------------------------------------------------------------------------------------------
// decode: one CTA of ATT_DEC_WARPS warps per (b, h). Warp w takes the key chunks w, w + WARPS, ... of 32 keys
// (lane j scores key j of the chunk) with its own online softmax; the warps' (max, sum, output) are then merged
// in warp order: O = sum_w exp(m_w - M) o_w / sum_w exp(m_w - M) l_w.

#define ATT_DEC_WARPS 4

template <typename Tp>
__global__ void attention_decode_kernel(Tp* out, const Tp* q, const Tp* kcache, const Tp* vcache, int pos,
                                        int max_len, int C, int NH, float scale) {
    __shared__ float qs[ATT_MAX_HS];
    __shared__ float wm[ATT_DEC_WARPS], wl[ATT_DEC_WARPS], wo[ATT_DEC_WARPS][ATT_MAX_HS];
    const int hs = C / NH;
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int d = threadIdx.x; d < hs; d += blockDim.x) { qs[d] = to_float(q[(size_t)b * C + h * hs + d]); }
    __syncthreads();
    const Tp* kb = kcache + (size_t)b * max_len * C + h * hs;
    const Tp* vb = vcache + (size_t)b * max_len * C + h * hs;
    const int n = pos + 1;
    float m = -INFINITY, l = 0.0f, o[ATT_MAX_HS / 32] = {0.0f};
    for (int k0 = warp * 32; k0 < n; k0 += ATT_DEC_WARPS * 32) {
        const int nk = min(32, n - k0);
        float s = -INFINITY;
        if (lane < nk) {
            const Tp* krow = kb + (size_t)(k0 + lane) * C;
            float acc = 0.0f;
            for (int d = 0; d < hs; d++) { acc = fmaf(qs[d], to_float(krow[d]), acc); }
            s = acc * scale;
        }
        const float m_new = fmaxf(m, warp_reduce_max(s));
        const float alpha = expf(m - m_new);
        const float p = expf(s - m_new);
        l = l * alpha + warp_reduce_sum(p);
        m = m_new;
        for (int i = 0; i < ATT_MAX_HS / 32; i++) { o[i] *= alpha; }
        for (int j = 0; j < nk; j++) {
            const float pj = __shfl_sync(0xffffffffu, p, j);
            const Tp* vrow = vb + (size_t)(k0 + j) * C;
            for (int i = 0; i < ATT_MAX_HS / 32; i++) {
                const int d = lane + 32 * i;
                if (d < hs) { o[i] = fmaf(pj, to_float(vrow[d]), o[i]); }
            }
        }
    }
    if (lane == 0) { wm[warp] = m; wl[warp] = l; }
    for (int i = 0; i < ATT_MAX_HS / 32; i++) {
        const int d = lane + 32 * i;
        if (d < hs) { wo[warp][d] = o[i]; }
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_DEC_WARPS; w++) { M = fmaxf(M, wm[w]); }  // finite: warp 0 holds key 0
    for (int d = threadIdx.x; d < hs; d += blockDim.x) {
        float L = 0.0f, O = 0.0f;
        for (int w = 0; w < ATT_DEC_WARPS; w++) {
            const float f = wm[w] == -INFINITY ? 0.0f : expf(wm[w] - M);  // warps without keys contribute 0
            L += f * wl[w];
            O += f * wo[w][d];
        }
        out[(size_t)b * C + h * hs + d] = from_float<Tp>(O / L);
    }
}

// ----------------------------------------------------------------------------------------------------------
// interface

// qkv [B, T, 3C] (floatX): row (b,t) holds q (C) | k (C) | v (C); head h uses columns h*hs .. h*hs+hs-1 of each
// block, hs = C / NH. out [B, T, C] (floatX): head h at columns h*hs... Causal, scale 1/sqrt(hs), softmax in fp32.
// lse [B, NH, T] (fp32): the log-sum-exp of each query row (scaled scores), saved for the backward.
static void attention_forward(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                              cudaStream_t stream) {
#if defined(ENABLE_BF16)
    if (attention_has_mma(C, NH)) {
        switch (C / NH) {
            case 16: attention_forward_mma<16>(out, lse, qkv, B, T, C, NH, stream); return;
            case 32: attention_forward_mma<32>(out, lse, qkv, B, T, C, NH, stream); return;
            case 64: attention_forward_mma<64>(out, lse, qkv, B, T, C, NH, stream); return;
            default: attention_forward_mma<128>(out, lse, qkv, B, T, C, NH, stream); return;
        }
    }
#endif
    attention_forward_simt(out, lse, qkv, B, T, C, NH, stream);
}

// scratch: D = rowsum(dO * O) per (b, h, t), fp32
static size_t attention_backward_scratch_bytes(int B, int T, int C, int NH) {
    (void)C;
    return (size_t)B * NH * T * sizeof(float);
}

// dqkv [B, T, 3C] (floatX) overwritten with the gradients of q, k, v. scratch: attention_backward_scratch_bytes(B,T,C,NH)
static void attention_backward(floatX* dqkv, void* scratch, const floatX* dout, const floatX* qkv, const floatX* out,
                               const float* lse, int B, int T, int C, int NH, cudaStream_t stream) {
    float* Dsum = (float*)scratch;
#if defined(ENABLE_BF16)
    if (attention_has_mma(C, NH)) {
        switch (C / NH) {
            case 16: attention_backward_mma<16>(dqkv, Dsum, dout, qkv, out, lse, B, T, C, NH, stream); return;
            case 32: attention_backward_mma<32>(dqkv, Dsum, dout, qkv, out, lse, B, T, C, NH, stream); return;
            case 64: attention_backward_mma<64>(dqkv, Dsum, dout, qkv, out, lse, B, T, C, NH, stream); return;
            default: attention_backward_mma<128>(dqkv, Dsum, dout, qkv, out, lse, B, T, C, NH, stream); return;
        }
    }
#endif
    attention_backward_rowdot(Dsum, dout, out, B, T, C, NH, stream);
    attention_backward_simt(dqkv, Dsum, dout, qkv, lse, B, T, C, NH, stream);
}

// decode: one new token per sequence at position pos (0-based). q [B, C] (floatX) is the new token's query;
// kcache, vcache [B, max_len, C] (floatX) already hold keys/values of positions 0..pos (the new one included).
// out [B, C] = causal attention of the new query over positions 0..pos.
static void attention_decode(floatX* out, const floatX* q, const floatX* kcache, const floatX* vcache, int B, int pos,
                             int max_len, int C, int NH, cudaStream_t stream) {
    attention_check_shape(C, NH);
    attention_decode_kernel<floatX><<<B * NH, ATT_DEC_WARPS * 32, 0, stream>>>(
        out, q, kcache, vcache, pos, max_len, C, NH, 1.0f / sqrtf((float)(C / NH)));
    cudaCheckLaunch();
}

#if defined(USE_CUDNN)
// the cuDNN alternative (kernels/attention_cudnn.cpp, its own translation unit, bf16 only): same layouts, lse is
// cuDNN's stats tensor; the backward manages its own workspace (no scratch)
void attention_forward_cudnn(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH,
                             cudaStream_t stream);
void attention_backward_cudnn(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                              const float* lse, int B, int T, int C, int NH, cudaStream_t stream);
void attention_cudnn_destroy(void);
#endif

#endif  // TRAIN_KLA_KERNELS_ATTENTION_CUH
