/*
kernels/encoder.cuh: token (+ position) embedding. The CPU versions are encoder_forward and encoder_backward
in train_kla.c.

  forward   out[b, t, :] = wte[inp[b, t], :] (+ wpe[t, :])   (fp32 master weights in, floatX out)
  backward  dwte[v, :] += sum of dout[b, t, :] over the positions (b, t) holding token v
            dwpe[t, :] += sum over b of dout[b, t, :]          (fp32)

The backward is deterministic without atomics, and all on the device (it reads the forward's ids there; the host
neither sorts nor waits):
  0. a stable radix sort (cub::DeviceRadixSort::SortPairs, a fixed algorithm) orders the pairs (token, position)
     by token, positions increasing within a token.
  1. the sorted pairs are cut into blocks of ENCODER_CHUNK; one CUDA block per (block, channel slice) sums each
     maximal run of one token inside it, in order. A run wholly inside the block is added into its dwte row
     (the row's only writer); the piece that starts a run continuing past the block goes to partial_own[k],
     the piece that continues a run from an earlier block goes to partial_cont[k].
  2. the block where a spanning run starts adds partial_own[k] + partial_cont[k + 1] + ... in order into dwte.
Every dwte row has exactly one writer, and every sum has a fixed order. Frequent tokens (",", EOT: thousands of
positions) are spread over many blocks, so no block's serial chain exceeds ENCODER_CHUNK rows (plus the short
chain of partials in step 2). 16-byte loads (8 bf16 / 4 fp32 channels per thread) whenever C allows.
dwpe: one thread per (t, channel), summing over b in order.
*/
#ifndef TRAIN_KLA_KERNELS_ENCODER_CUH
#define TRAIN_KLA_KERNELS_ENCODER_CUH

#include <limits.h>
#include <stdint.h>
#include <cub/cub.cuh>

#include "common.cuh"

#define ENCODER_BLOCK 256
#define ENCODER_CHUNK 32            // sorted positions per block of the backward
#define ENCODER_PREFETCH 4          // dout rows loaded ahead by a thread of the backward
#define ENCODER_BWD_BLOCK 128       // threads per block of the backward kernels (VEC channels each)

// ----------------------------------------------------------------------------------------------------------
// forward

// one thread per output element (bt, c)
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const float* wte, const float* wpe, int T, int C,
                                       size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    const size_t bt = i / C, c = i % C;
    float v = wte[(size_t)inp[bt] * C + c];
    if (wpe != NULL) { v += wpe[(bt % T) * C + c]; }
    out[i] = from_float<floatX>(v);
}

// out [B, T, C] floatX; inp [B, T] token ids on the device; wte [V(p), C], wpe [maxT, C] fp32 (wpe may be NULL)
static void encoder_forward(floatX* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C,
                            cudaStream_t stream) {
    const size_t n = (size_t)B * T * C;
    if (n == 0) { return; }
    encoder_forward_kernel<<<(unsigned int)ceil_div_z(n, ENCODER_BLOCK), ENCODER_BLOCK, 0, stream>>>(out, inp, wte, wpe,
                                                                                                    T, C, n);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// backward

// Bounds for B*T = BT positions: the sorted positions are cut into ceil(BT / ENCODER_CHUNK) blocks.
static size_t encoder_num_blocks(size_t BT) { return ceil_div_z(BT, ENCODER_CHUNK); }
static size_t encoder_align(size_t bytes) { return ceil_div_z(bytes, 256) * 256; }

// temporary storage of the radix sort (the largest, for all 32 key bits)
static size_t encoder_sort_temp_bytes(size_t BT) {
    size_t bytes = 0;
    cudaCheck(cub::DeviceRadixSort::SortPairs(NULL, bytes, (const int*)NULL, (int*)NULL, (const int*)NULL, (int*)NULL,
                                              (int)BT, 0, 32));
    return bytes;
}

// The scratch: ids [BT] | positions [BT] | sorted ids [BT] | sorted positions [BT] (int, each 256-aligned), the
// sort's temporary storage, then the partial sums fp32 [num_blocks, C] twice (owner pieces, continuation pieces).
struct EncoderScratch {
    int* pos;
    int* sorted_ids;
    int* sorted_pos;
    void* sort_temp;
    size_t sort_temp_bytes;
    float* partial_own;
    float* partial_cont;
};
static EncoderScratch encoder_scratch_layout(void* scratch, size_t BT, int C) {
    EncoderScratch l;
    char* p = (char*)scratch;
    const size_t ints = encoder_align(BT * sizeof(int));
    l.pos = (int*)p;
    l.sorted_ids = (int*)(p + ints);
    l.sorted_pos = (int*)(p + 2 * ints);
    l.sort_temp = p + 3 * ints;
    l.sort_temp_bytes = encoder_align(encoder_sort_temp_bytes(BT));
    l.partial_own = (float*)(p + 3 * ints + l.sort_temp_bytes);
    l.partial_cont = l.partial_own + encoder_num_blocks(BT) * C;
    return l;
}

// scratch needed by encoder_backward
static size_t encoder_backward_scratch_bytes(int B, int T, int C) {
    const size_t BT = (size_t)B * T;
    const size_t partial_bytes = encoder_align(encoder_num_blocks(BT) * C * sizeof(float));
    return 3 * encoder_align(BT * sizeof(int)) + encoder_align(encoder_sort_temp_bytes(BT)) + 2 * partial_bytes;
}

// positions 0 .. n - 1 (the values of the sort)
__global__ void encoder_iota_kernel(int* pos, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { pos[i] = i; }
}

// VEC channels: 16-byte loads of dout when possible (template VEC = 16 / sizeof(floatX), xpack_to_floats), else 1
// dst[k] += src[k] (fp32 row of dwte; float4 when VEC is a multiple of 4)
template <int VEC> __device__ __forceinline__ void encoder_add_f(float* dst, const float* src) {
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int k = 0; k < VEC / 4; k++) {
            float4 t = reinterpret_cast<float4*>(dst)[k];
            t.x += src[4 * k];
            t.y += src[4 * k + 1];
            t.z += src[4 * k + 2];
            t.w += src[4 * k + 3];
            reinterpret_cast<float4*>(dst)[k] = t;
        }
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) { dst[k] += src[k]; }
    }
}
template <int VEC> __device__ __forceinline__ void encoder_store_f(float* dst, const float* src) {
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int k = 0; k < VEC / 4; k++) {
            reinterpret_cast<float4*>(dst)[k] = make_float4(src[4 * k], src[4 * k + 1], src[4 * k + 2], src[4 * k + 3]);
        }
    } else {
#pragma unroll
        for (int k = 0; k < VEC; k++) { dst[k] = src[k]; }
    }
}

// grid (num_blocks, ceil(C / (ENCODER_BWD_BLOCK VEC))), block ENCODER_BWD_BLOCK. Block k takes the sorted entries
// [k ENCODER_CHUNK, min(BT, (k + 1) ENCODER_CHUNK)); each thread sums its VEC channels over them in order, one
// piece (a maximal run of one token inside the block) at a time. A piece whose token run lies wholly in the
// block is added into dwte (the run's only writer); the piece that starts a run continuing past the block goes
// to partial_own[k]; the piece that continues a run begun in an earlier block goes to partial_cont[k].
template <int VEC>
__global__ void __launch_bounds__(ENCODER_BWD_BLOCK)
encoder_backward_blocks_kernel(float* dwte, float* partial_own, float* partial_cont, const int* sorted_ids,
                               const int* sorted_pos, const floatX* dout, int BT, int C) {
    __shared__ int s_id[ENCODER_CHUNK];
    __shared__ int s_pos[ENCODER_CHUNK];
    const int k = blockIdx.x;
    const int beg = k * ENCODER_CHUNK;
    const int n = min(BT - beg, ENCODER_CHUNK);
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        s_id[j] = sorted_ids[beg + j];
        s_pos[j] = sorted_pos[beg + j];
    }
    __syncthreads();
    const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
    if (c0 >= C) { return; }
    const bool first_is_cont = beg > 0 && sorted_ids[beg - 1] == s_id[0];
    const bool last_continues = beg + n < BT && sorted_ids[beg + n] == s_id[n - 1];

    float acc[VEC];
#pragma unroll
    for (int q = 0; q < VEC; q++) { acc[q] = 0.0f; }
    int piece_start = 0;
    for (int j0 = 0; j0 < n; j0 += ENCODER_PREFETCH) {
        // issue up to ENCODER_PREFETCH independent row loads, then add them in order
        float v[ENCODER_PREFETCH][VEC];
#pragma unroll
        for (int u = 0; u < ENCODER_PREFETCH; u++) {
            if (j0 + u < n) { xpack_to_floats<VEC>(v[u], dout + (size_t)s_pos[j0 + u] * C + c0); }
        }
#pragma unroll
        for (int u = 0; u < ENCODER_PREFETCH; u++) {
            const int j = j0 + u;
            if (j >= n) { break; }
#pragma unroll
            for (int q = 0; q < VEC; q++) { acc[q] += v[u][q]; }
            if (j == n - 1 || s_id[j + 1] != s_id[j]) {   // the piece ends at j
                const int token = s_id[j];
                if (piece_start == 0 && first_is_cont) {
                    encoder_store_f<VEC>(partial_cont + (size_t)k * C + c0, acc);
                } else if (j == n - 1 && last_continues) {
                    encoder_store_f<VEC>(partial_own + (size_t)k * C + c0, acc);
                } else {
                    encoder_add_f<VEC>(dwte + (size_t)token * C + c0, acc);
                }
#pragma unroll
                for (int q = 0; q < VEC; q++) { acc[q] = 0.0f; }
                piece_start = j + 1;
            }
        }
    }
}

// grid (num_blocks, ceil(C / (ENCODER_BWD_BLOCK VEC))), block ENCODER_BWD_BLOCK. Block k owns the run that starts
// in it and continues past it (if any): dwte[token] += partial_own[k] + partial_cont[k + 1] + ..., in that order,
// over the following blocks the run covers.
template <int VEC>
__global__ void __launch_bounds__(ENCODER_BWD_BLOCK)
encoder_backward_runs_kernel(float* dwte, const float* partial_own, const float* partial_cont, const int* sorted_ids,
                             int BT, int C) {
    const int k = blockIdx.x;
    const int beg = k * ENCODER_CHUNK;
    const int end = beg + ENCODER_CHUNK;   // the run continues past the block only if the block is full
    if (end >= BT) { return; }
    const int token = sorted_ids[end - 1];
    if (sorted_ids[end] != token) { return; }                    // no run continues past the block
    if (beg > 0 && sorted_ids[beg - 1] == token) { return; }     // the run began in an earlier block
    const int c0 = (blockIdx.y * blockDim.x + threadIdx.x) * VEC;
    if (c0 >= C) { return; }
    float acc[VEC], v[VEC];
#pragma unroll
    for (int q = 0; q < VEC; q++) { acc[q] = partial_own[(size_t)k * C + c0 + q]; }
    for (int b = k + 1; b * ENCODER_CHUNK < BT && sorted_ids[b * ENCODER_CHUNK] == token; b++) {
#pragma unroll
        for (int q = 0; q < VEC; q++) { v[q] = partial_cont[(size_t)b * C + c0 + q]; }
#pragma unroll
        for (int q = 0; q < VEC; q++) { acc[q] += v[q]; }
    }
    encoder_add_f<VEC>(dwte + (size_t)token * C + c0, acc);
}

// one thread per (t, c): dwpe[t, c] += sum over b of dout[b, t, c], b = 0 first
__global__ void encoder_backward_wpe_kernel(float* dwpe, const floatX* dout, int B, int T, int C) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) { return; }
    float sum = 0.0f;
    for (int b = 0; b < B; b++) { sum += to_float(dout[(size_t)b * T * C + i]); }
    dwpe[i] += sum;
}

template <int VEC>
static void encoder_backward_launch(float* dwte, const EncoderScratch& l, const floatX* dout, int BT, int C,
                                    cudaStream_t stream) {
    const dim3 grid((unsigned int)encoder_num_blocks(BT), ceil_div(C, ENCODER_BWD_BLOCK * VEC));
    encoder_backward_blocks_kernel<VEC><<<grid, ENCODER_BWD_BLOCK, 0, stream>>>(
        dwte, l.partial_own, l.partial_cont, l.sorted_ids, l.sorted_pos, dout, BT, C);
    cudaCheckLaunch();
    encoder_backward_runs_kernel<VEC><<<grid, ENCODER_BWD_BLOCK, 0, stream>>>(dwte, l.partial_own, l.partial_cont,
                                                                              l.sorted_ids, BT, C);
    cudaCheckLaunch();
}

// dwte [V(p), C], dwpe [maxT, C] fp32 += (dwpe may be NULL); dout [B, T, C] floatX; inp [B, T]: the forward's token
// ids on the device, each in [0, vocab) (the caller checked them on the host); scratch:
// encoder_backward_scratch_bytes(B, T, C) on the device. The grouping by token is a stable radix sort on the device
// (cub, deterministic) over the bits of vocab - 1, so positions stay in increasing order within a token and every
// sum has a fixed order.
static void encoder_backward(float* dwte, float* dwpe, void* scratch, const floatX* dout, const int* inp, int vocab,
                             int B, int T, int C, cudaStream_t stream) {
    const size_t BT = (size_t)B * T;
    if (BT == 0) { return; }
    if (BT > (size_t)INT_MAX / 2) { die("encoder_backward: B*T = %zu too large", BT); }
    if (vocab < 1) { die("encoder_backward: vocabulary size %d", vocab); }
    if (dwpe != NULL) {
        const unsigned int blocks = (unsigned int)ceil_div_z((size_t)T * C, ENCODER_BLOCK);
        encoder_backward_wpe_kernel<<<blocks, ENCODER_BLOCK, 0, stream>>>(dwpe, dout, B, T, C);
        cudaCheckLaunch();
    }
    int end_bit = 1;
    while (end_bit < 31 && ((vocab - 1) >> end_bit) != 0) { end_bit++; }

    const EncoderScratch l = encoder_scratch_layout(scratch, BT, C);
    encoder_iota_kernel<<<(unsigned int)ceil_div_z(BT, 256), 256, 0, stream>>>(l.pos, (int)BT);
    cudaCheckLaunch();
    size_t temp_bytes = l.sort_temp_bytes;
    cudaCheck(cub::DeviceRadixSort::SortPairs(l.sort_temp, temp_bytes, inp, l.sorted_ids,
                                              (const int*)l.pos, l.sorted_pos, (int)BT, 0, end_bit, stream));

    constexpr int VEC = 16 / (int)sizeof(floatX);
    if (C % VEC == 0 && ((uintptr_t)dout % 16) == 0 && ((uintptr_t)dwte % 16) == 0) {
        encoder_backward_launch<VEC>(dwte, l, dout, (int)BT, C, stream);
    } else {
        encoder_backward_launch<1>(dwte, l, dout, (int)BT, C, stream);
    }
}

#endif // TRAIN_KLA_KERNELS_ENCODER_CUH
