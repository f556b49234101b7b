/*
kernels/norm.cuh: the trunk's normalisation (--norm): LayerNorm with bias (kind NORM_LAYERNORM) or RMSNorm
without (kind NORM_RMSNORM), over the last dimension C of [N, C] rows. The CPU versions are
layernorm_forward/backward and rmsnorm_forward/backward in train_kla.c.

  LayerNorm  mean = sum(x) / C,  rstd = 1 / sqrt(sum((x - mean)^2) / C + eps),  out = (x - mean) rstd w + b
  RMSNorm    rstd = 1 / sqrt(sum(x^2) / C + eps),                                out = x rstd w
Both write xhat w (+ b) with xhat = (x - mean) rstd, where mean = 0 for RMSNorm. So one backward serves both:
  dxhat = dout w
  dinp += (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) rstd   (the mean(dxhat) term only for LayerNorm)
  dw += sum over rows of dout xhat,  db += sum over rows of dout   (db only for LayerNorm)

Forward and the dinp part of the backward: one warp per row (a row is read a few times; the re-reads hit the
cache), fp32 math, warp sums by shuffles (a fixed tree). The residual variant adds the two inputs first,
rounds the sum to floatX, stores it, and normalises exactly the stored value.

dw and db are sums over all rows, done without atomics: a column kernel sums fixed chunks of rows into
scratch [num_chunks, 2C] (dw partials, then db partials; each thread 16 bytes of a row, a warp 512 contiguous
bytes), and a second kernel adds the chunks in a fixed tree (fixed groups of consecutive chunks in order, then
the groups in order). The chunk count depends only on N, so the result is bitwise the same on every run.
The backward uses 16-byte loads (8 bf16 / 4 fp32) whenever C and the pointers allow, else scalar loads.
*/
#ifndef TRAIN_KLA_KERNELS_NORM_CUH
#define TRAIN_KLA_KERNELS_NORM_CUH

#include "common.cuh"

#define NORM_LAYERNORM 0
#define NORM_RMSNORM 1

#define NORM_ROWS_PER_BLOCK 8         // warps (rows) per block of the row kernels
#define NORM_MAX_CHUNKS 256           // row chunks of the dw/db reduction
#define NORM_MIN_CHUNK_ROWS 32
#define NORM_ROW_LANES 8              // row lanes in a block of the dw/db kernel (32 column vectors x 8 lanes)
#define NORM_FINISH_GROUPS 8          // chunk groups summed in parallel by the dw/db finish kernel

// ----------------------------------------------------------------------------------------------------------
// forward

// Vector width VEC: 16 / sizeof(floatX) elements (one 16-byte access: xpack_to_floats, floats_to_xpack) when C is
// a multiple of it and the row pointers are 16-byte aligned, else 1 (scalar). Both widths do the same fp32 math in
// the same order per element. The fp32 weights: float4 loads.
template <int VEC> __device__ __forceinline__ void norm_load_f(float* dst, const float* src) {
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int k = 0; k < VEC / 4; k++) {
            const float4 t = reinterpret_cast<const float4*>(src)[k];
            dst[4 * k] = t.x;
            dst[4 * k + 1] = t.y;
            dst[4 * k + 2] = t.z;
            dst[4 * k + 3] = t.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) { dst[k] = src[k]; }
    }
}

// grid ceil(N / NORM_ROWS_PER_BLOCK), block 32 * NORM_ROWS_PER_BLOCK; one warp per row, lane l handles elements
// [VEC (l + 32 j), VEC (l + 32 j) + VEC); the later passes re-read the row (L1/L2 hits).
// inp2 == NULL: x = inp1. inp2 != NULL: x = floatX(inp1 + inp2) is written to residual_out first (which may be
// inp1 or inp2 itself: each element is read and written by the same thread, reads first).
// mean (LayerNorm) and rstd are written when not NULL.
template <int VEC>
__global__ void __launch_bounds__(32 * NORM_ROWS_PER_BLOCK)
norm_forward_kernel(int kind, floatX* out, float* mean, float* rstd, floatX* residual_out, const floatX* inp1,
                    const floatX* inp2, const float* w, const float* b, int N, int C, float eps) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= N) { return; }
    const size_t base = (size_t)row * C;
    const floatX* x = inp1 + base;

    // pass 1: the residual sum (when fused), and sum(x) (LayerNorm) or sum(x^2) (RMSNorm)
    float sum = 0.0f;
    for (int i = lane * VEC; i < C; i += 32 * VEC) {
        float v[VEC];
        xpack_to_floats<VEC>(v, x + i);
        if (inp2 != NULL) {
            float v2[VEC];
            xpack_to_floats<VEC>(v2, inp2 + base + i);
#pragma unroll
            for (int k = 0; k < VEC; k++) { v[k] = to_float(from_float<floatX>(v[k] + v2[k])); }
            floats_to_xpack<VEC>(residual_out + base + i, v);
        }
#pragma unroll
        for (int k = 0; k < VEC; k++) { sum += kind == NORM_LAYERNORM ? v[k] : v[k] * v[k]; }
    }
    if (inp2 != NULL) { x = residual_out + base; }
    sum = warp_reduce_sum(sum);

    float m = 0.0f, s;
    if (kind == NORM_LAYERNORM) {
        // pass 2: the variance around the mean (two passes, as the CPU version: no cancellation)
        m = sum / C;
        float var = 0.0f;
        for (int i = lane * VEC; i < C; i += 32 * VEC) {
            float v[VEC];
            xpack_to_floats<VEC>(v, x + i);
#pragma unroll
            for (int k = 0; k < VEC; k++) { var += (v[k] - m) * (v[k] - m); }
        }
        var = warp_reduce_sum(var);
        s = 1.0f / sqrtf(var / C + eps);
    } else {
        s = 1.0f / sqrtf(sum / C + eps);
    }

    // last pass: the normalised output
    for (int i = lane * VEC; i < C; i += 32 * VEC) {
        float v[VEC], wv[VEC], bv[VEC];
        xpack_to_floats<VEC>(v, x + i);
        norm_load_f<VEC>(wv, w + i);
        if (kind == NORM_LAYERNORM) { norm_load_f<VEC>(bv, b + i); }
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            const float xhat = (v[k] - m) * s;
            v[k] = kind == NORM_LAYERNORM ? xhat * wv[k] + bv[k] : xhat * wv[k];
        }
        floats_to_xpack<VEC>(out + base + i, v);
    }
    if (lane == 0) {
        if (mean != NULL && kind == NORM_LAYERNORM) { mean[row] = m; }
        if (rstd != NULL) { rstd[row] = s; }
    }
}

static void norm_check_kind(int kind) {
    if (kind != NORM_LAYERNORM && kind != NORM_RMSNORM) { die("norm: unknown kind %d", kind); }
}

static inline int norm_aligned16(const void* p) { return p == NULL || ((uintptr_t)p % 16) == 0; }

// the forward's launch: 16-byte loads where C and every pointer allow (the same fp32 math per element either way)
static void norm_forward_launch(int kind, floatX* out, float* mean, float* rstd, floatX* residual_out,
                                const floatX* inp1, const floatX* inp2, const float* w, const float* b, int N, int C,
                                float eps, cudaStream_t stream) {
    constexpr int VEC = 16 / (int)sizeof(floatX);
    const dim3 grid(ceil_div(N, NORM_ROWS_PER_BLOCK)), block(32 * NORM_ROWS_PER_BLOCK);
    if (C % VEC == 0 && norm_aligned16(out) && norm_aligned16(residual_out) && norm_aligned16(inp1) &&
        norm_aligned16(inp2) && norm_aligned16(w) && norm_aligned16(b)) {
        norm_forward_kernel<VEC><<<grid, block, 0, stream>>>(kind, out, mean, rstd, residual_out, inp1, inp2, w, b, N,
                                                             C, eps);
    } else {
        norm_forward_kernel<1><<<grid, block, 0, stream>>>(kind, out, mean, rstd, residual_out, inp1, inp2, w, b, N, C,
                                                           eps);
    }
    cudaCheckLaunch();
}

// out = norm(inp) [N, C]; mean, rstd fp32 [N] (mean only for LayerNorm; either may be NULL when the backward
// will not run); w, b fp32 [C] (b only for LayerNorm)
static void norm_forward(int kind, floatX* out, float* mean, float* rstd, const floatX* inp, const float* w,
                         const float* b, int N, int C, float eps, cudaStream_t stream) {
    norm_check_kind(kind);
    if (N == 0) { return; }
    norm_forward_launch(kind, out, mean, rstd, NULL, inp, NULL, w, b, N, C, eps, stream);
}

// residual_out = inp1 + inp2 (rounded to floatX; may be inp1 or inp2 itself), norm_out = norm(residual_out)
static void fused_residual_norm_forward(int kind, floatX* residual_out, floatX* norm_out, float* mean, float* rstd,
                                        const floatX* inp1, const floatX* inp2, const float* w, const float* b,
                                        int N, int C, float eps, cudaStream_t stream) {
    norm_check_kind(kind);
    if (N == 0) { return; }
    norm_forward_launch(kind, norm_out, mean, rstd, residual_out, inp1, inp2, w, b, N, C, eps, stream);
}

// ----------------------------------------------------------------------------------------------------------
// backward

// grid ceil(N / NORM_ROWS_PER_BLOCK), block 32 * NORM_ROWS_PER_BLOCK; one warp per row: dinp += ...
// Lane l handles elements [VEC (l + 32 j), VEC (l + 32 j) + VEC). The second pass re-reads the row (L1/L2 hits).
template <int VEC>
__global__ void __launch_bounds__(32 * NORM_ROWS_PER_BLOCK)
norm_backward_dinp_kernel(int kind, floatX* dinp, const floatX* dout, const floatX* inp, const float* w,
                          const float* mean, const float* rstd, int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row >= N) { return; }
    const size_t base = (size_t)row * C;
    const float m = kind == NORM_LAYERNORM ? mean[row] : 0.0f, s = rstd[row];

    // mean(dxhat) and mean(dxhat xhat) over the row
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
    for (int i = lane * VEC; i < C; i += 32 * VEC) {
        float x[VEC], d[VEC], wv[VEC];
        xpack_to_floats<VEC>(x, inp + base + i);
        xpack_to_floats<VEC>(d, dout + base + i);
        norm_load_f<VEC>(wv, w + i);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            const float xhat = (x[k] - m) * s;
            const float dxhat = d[k] * wv[k];
            sum_dxhat += dxhat;
            sum_dxhat_xhat += dxhat * xhat;
        }
    }
    const float mean_dxhat = kind == NORM_LAYERNORM ? warp_reduce_sum(sum_dxhat) / C : 0.0f;
    const float mean_dxhat_xhat = warp_reduce_sum(sum_dxhat_xhat) / C;

    for (int i = lane * VEC; i < C; i += 32 * VEC) {
        float x[VEC], d[VEC], wv[VEC], g[VEC];
        xpack_to_floats<VEC>(x, inp + base + i);
        xpack_to_floats<VEC>(d, dout + base + i);
        norm_load_f<VEC>(wv, w + i);
        xpack_to_floats<VEC>(g, dinp + base + i);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            const float xhat = (x[k] - m) * s;
            const float dxhat = d[k] * wv[k];
            const float dx = (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * s;
            g[k] = g[k] + dx;
        }
        floats_to_xpack<VEC>(dinp + base + i, g);
    }
}

// Rows are cut into a number of chunks that depends only on N.
static int norm_num_chunks(int N) {
    const int chunks = ceil_div(N, NORM_MIN_CHUNK_ROWS);
    return chunks < 1 ? 1 : chunks > NORM_MAX_CHUNKS ? NORM_MAX_CHUNKS : chunks;
}

// scratch needed by norm_backward: one row of dw and db partial sums per chunk
static size_t norm_backward_scratch_bytes(int N, int C) {
    return (size_t)norm_num_chunks(N) * 2 * C * sizeof(float);
}

// grid (ceil(C / (32 VEC)), num_chunks), block (32, NORM_ROW_LANES). Thread (x, y) sums the VEC channels
// (blockIdx.x * 32 + x) VEC + k over rows y, y + NORM_ROW_LANES, ... of chunk blockIdx.y (one 16-byte load of
// dout and of inp per row: a warp reads 512 contiguous bytes); the row lanes are then added in order (y = 0
// first) into partial[chunk][c] (dw) and partial[chunk][C + c] (db).
template <int VEC>
__global__ void __launch_bounds__(32 * NORM_ROW_LANES)
norm_backward_dwdb_partial_kernel(int kind, float* partial, const floatX* dout, const floatX* inp,
                                  const float* mean, const float* rstd, int N, int C, int rows_per_chunk) {
    __shared__ float lane_dw[NORM_ROW_LANES][32 * VEC];
    __shared__ float lane_db[NORM_ROW_LANES][32 * VEC];
    const int c0 = (blockIdx.x * 32 + threadIdx.x) * VEC;
    const int row_begin = blockIdx.y * rows_per_chunk;
    const int row_end = min(N, row_begin + rows_per_chunk);
    float dw[VEC], db[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) { dw[k] = 0.0f; db[k] = 0.0f; }
    if (c0 < C) {
#pragma unroll 4
        for (int r = row_begin + threadIdx.y; r < row_end; r += NORM_ROW_LANES) {
            const float m = kind == NORM_LAYERNORM ? mean[r] : 0.0f, s = rstd[r];
            float x[VEC], d[VEC];
            xpack_to_floats<VEC>(x, inp + (size_t)r * C + c0);
            xpack_to_floats<VEC>(d, dout + (size_t)r * C + c0);
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                const float xhat = (x[k] - m) * s;
                dw[k] += d[k] * xhat;
                db[k] += d[k];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        lane_dw[threadIdx.y][threadIdx.x * VEC + k] = dw[k];
        lane_db[threadIdx.y][threadIdx.x * VEC + k] = db[k];
    }
    __syncthreads();
    const int tid = threadIdx.y * 32 + threadIdx.x;
    for (int j = tid; j < 32 * VEC; j += 32 * NORM_ROW_LANES) {
        const int c = blockIdx.x * 32 * VEC + j;
        if (c >= C) { continue; }
        float sum_dw = 0.0f, sum_db = 0.0f;
#pragma unroll
        for (int y = 0; y < NORM_ROW_LANES; y++) {
            sum_dw += lane_dw[y][j];
            sum_db += lane_db[y][j];
        }
        partial[(size_t)blockIdx.y * 2 * C + c] = sum_dw;
        partial[(size_t)blockIdx.y * 2 * C + C + c] = sum_db;
    }
}

// grid ceil(2C / 32), block (32, NORM_FINISH_GROUPS). Column j of the partials (j < C: dw[j], else db[j - C]):
// thread (x, y) adds the chunks of group y (a contiguous range of chunks, first chunk first), then the groups
// are added in order (y = 0 first). A fixed order for a given N, with NORM_FINISH_GROUPS loads in flight per
// column instead of one long serial chain.
__global__ void __launch_bounds__(32 * NORM_FINISH_GROUPS)
norm_backward_dwdb_finish_kernel(float* dw, float* db, const float* partial, int C, int num_chunks) {
    __shared__ float group_sum[NORM_FINISH_GROUPS][32];
    const int j = blockIdx.x * 32 + threadIdx.x;
    const int per_group = (num_chunks + NORM_FINISH_GROUPS - 1) / NORM_FINISH_GROUPS;
    const int k_begin = threadIdx.y * per_group;
    const int k_end = min(num_chunks, k_begin + per_group);
    float sum = 0.0f;
    if (j < 2 * C) {
#pragma unroll 4
        for (int k = k_begin; k < k_end; k++) { sum += partial[(size_t)k * 2 * C + j]; }
    }
    group_sum[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y != 0 || j >= 2 * C) { return; }
    float total = 0.0f;
#pragma unroll
    for (int y = 0; y < NORM_FINISH_GROUPS; y++) { total += group_sum[y][threadIdx.x]; }
    if (j < C) {
        dw[j] += total;
    } else if (db != NULL) {
        db[j - C] += total;
    }
}

template <int VEC>
static void norm_backward_launch(int kind, floatX* dinp, float* dw, float* db, float* scratch, const floatX* dout,
                                 const floatX* inp, const float* w, const float* mean, const float* rstd, int N,
                                 int C, cudaStream_t stream) {
    const int num_chunks = norm_num_chunks(N);
    const int rows_per_chunk = ceil_div(N, num_chunks);
    norm_backward_dwdb_partial_kernel<VEC><<<dim3(ceil_div(C, 32 * VEC), num_chunks), dim3(32, NORM_ROW_LANES), 0,
                                             stream>>>(kind, scratch, dout, inp, mean, rstd, N, C, rows_per_chunk);
    cudaCheckLaunch();
    norm_backward_dwdb_finish_kernel<<<ceil_div(2 * C, 32), dim3(32, NORM_FINISH_GROUPS), 0, stream>>>(
        dw, kind == NORM_LAYERNORM ? db : NULL, scratch, C, num_chunks);
    cudaCheckLaunch();
    norm_backward_dinp_kernel<VEC><<<ceil_div(N, NORM_ROWS_PER_BLOCK), 32 * NORM_ROWS_PER_BLOCK, 0, stream>>>(
        kind, dinp, dout, inp, w, mean, rstd, N, C);
    cudaCheckLaunch();
}

// dinp [N, C] floatX +=; dw, db fp32 [C] += (db only for LayerNorm, may be NULL for RMSNorm);
// scratch: norm_backward_scratch_bytes(N, C); inp: the forward's input (the stored residual), mean/rstd: what
// the forward saved (mean unused for RMSNorm). dinp must not alias dout or inp.
// Kernels: dw/db partials per row chunk (16-byte loads, coalesced), their ordered sum (parallel over chunk
// groups), then dinp (one warp per row, 16-byte loads). The vector width depends only on C and the pointers'
// alignment, so a given call is bitwise reproducible.
static void norm_backward(int kind, floatX* dinp, float* dw, float* db, float* scratch, const floatX* dout,
                          const floatX* inp, const float* w, const float* mean, const float* rstd, int N, int C,
                          cudaStream_t stream) {
    norm_check_kind(kind);
    if (N == 0) { return; }
    constexpr int VEC = 16 / (int)sizeof(floatX);
    if (C % VEC == 0 && norm_aligned16(dinp) && norm_aligned16(dout) && norm_aligned16(inp) && norm_aligned16(w)) {
        norm_backward_launch<VEC>(kind, dinp, dw, db, scratch, dout, inp, w, mean, rstd, N, C, stream);
    } else {
        norm_backward_launch<1>(kind, dinp, dw, db, scratch, dout, inp, w, mean, rstd, N, C, stream);
    }
}

#endif // TRAIN_KLA_KERNELS_NORM_CUH
