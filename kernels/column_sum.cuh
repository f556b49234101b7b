/*
kernels/column_sum.cuh: deterministic column sums of an fp32 matrix, the reduction behind the parameter gradients
of the mixers' per-token kernels (gate biases, norm weights). No atomics: every sum runs in a fixed order, so runs
are bitwise reproducible.
*/
#ifndef TRAIN_KLA_KERNELS_COLUMN_SUM_CUH
#define TRAIN_KLA_KERNELS_COLUMN_SUM_CUH

#include "common.cuh"

#define COLSUM_ROWS 8   // row groups of an ordered_column_sum block (32 columns x 8 row groups)

// ----------------------------------------------------------------------------------------------------------
// deterministic column sums: out[c] += sum_r in[r, c] over a [rows, cols] fp32 matrix, in two levels.
// Level 1 cuts the rows into splits of rows_per_split and writes one partial row per split into tmp;
// level 2 adds the partials (one split holding all of them) into out. Every sum runs in a fixed order.

// at least 256 rows per split, and at most 256 splits
static inline int colsum_rows_per_split(int rows) {
    const int even = ceil_div(rows, 256);
    return even > 256 ? even : 256;
}
static inline int colsum_splits(int rows) { return ceil_div(rows, colsum_rows_per_split(rows)); }

// grid (ceil(cols / 32), splits), block (32, COLSUM_ROWS). Block (x, s) sums rows [s * rows_per_split,
// (s+1) * rows_per_split) of its 32 columns: thread y takes rows y, y + COLSUM_ROWS, ..., then the row
// groups are added in order. accumulate = 0: out[s, c] = sum; 1: out[s, c] += sum.
__global__ void ordered_column_sum_kernel(float* out, const float* in, int rows, int cols, int rows_per_split,
                                          int accumulate) {
    __shared__ float group_sum[COLSUM_ROWS][32];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const int r0 = blockIdx.y * rows_per_split;
    const int r1 = min(r0 + rows_per_split, rows);
    float acc = 0.0f;
    if (col < cols) {
        for (int r = r0 + threadIdx.y; r < r1; r += COLSUM_ROWS) { acc += in[(size_t)r * cols + col]; }
    }
    group_sum[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float sum = 0.0f;
        for (int y = 0; y < COLSUM_ROWS; y++) { sum += group_sum[y][threadIdx.x]; }
        float* dst = out + (size_t)blockIdx.y * cols + col;
        *dst = accumulate ? *dst + sum : sum;
    }
}

// out[c] (+)= sum_r in[r, c] (accumulate 0: =, 1: +=); tmp: colsum_splits(rows) * cols floats
static void ordered_column_sum(float* out, float* tmp, const float* in, int rows, int cols, int accumulate,
                               cudaStream_t stream) {
    const int rows_per_split = colsum_rows_per_split(rows);
    const int splits = colsum_splits(rows);
    const dim3 block(32, COLSUM_ROWS);
    ordered_column_sum_kernel<<<dim3(ceil_div(cols, 32), splits), block, 0, stream>>>(tmp, in, rows, cols,
                                                                                          rows_per_split, 0);
    cudaCheckLaunch();
    ordered_column_sum_kernel<<<dim3(ceil_div(cols, 32), 1), block, 0, stream>>>(out, tmp, splits, cols, splits,
                                                                                     accumulate);
    cudaCheckLaunch();
}

#endif // TRAIN_KLA_KERNELS_COLUMN_SUM_CUH
