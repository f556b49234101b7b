/*
kernels/classifier.cuh: softmax + cross-entropy loss + its gradient, fused, over the LM head's logits. The CPU
versions are softmax_crossentropy_forward and softmax_crossentropy_backward in train_kla.c.

Per row i of logits [BT, Vp] (only the first V columns are real tokens):
  p = softmax(logits[i, :V])                 in fp32
  losses[i] = -log p[target[i]] = log(sum_j exp(z_j - max)) - (z_target - max)
  with write_dlogits: logits[i, :] is overwritten in place by dlogits = (p - onehot(target)) * dloss, and the
  padding columns V..Vp-1 by 0. The probabilities themselves are never stored.
A negative target (TASK_IGNORE of tasks.h: a synthetic task's unlabelled position) costs nothing: its loss is 0
and its whole dlogits row 0.

One block of CLASSIFIER_BLOCK threads per row, which is read exactly twice: once for the running max and sum
(an "online" softmax: when the max grows, the sum so far is rescaled by exp(old max - new max); in base 2, see
fused_classifier_kernel), and once to write the gradient. Loads and stores are 16 bytes wide (8 bf16 or 4
floats), which needs Vp to be a multiple of 8 (bf16) or 4 (fp32): Vp is a multiple of 128. The per-thread (max,
sum) pairs are combined in a fixed tree (warp shuffles, then the warps' results in one warp), so the result is the
same on every run.

argmax_rows: the index of each row's largest logit among the first V columns, the first one where several are
equal (tasks.h's task_count_correct on the CPU picks the same), for the synthetic tasks' accuracy. One block of
ARGMAX_BLOCK threads per row; only the N indices go to the host, not the logits.
*/
#ifndef TRAIN_KLA_KERNELS_CLASSIFIER_CUH
#define TRAIN_KLA_KERNELS_CLASSIFIER_CUH

#include <stdint.h>
#include "common.cuh"

#define CLASSIFIER_BLOCK 1024
#define CLASSIFIER_VEC XPACK   // elements per 16-byte access of a logits row
#define CLASSIFIER_LOG2E 1.4426950408889634f
typedef XPack<XPACK> ClassifierPack;

// (m, s) := the (max, sum of 2^(x - max)) of the union of two sets given as (m, s) and (m2, s2).
// An empty set is (-inf, 0), and contributes nothing (without computing 2^(-inf - -inf) = 2^nan).
__device__ __forceinline__ void softmax_stats_merge(float& m, float& s, float m2, float s2) {
    const float m_new = fmaxf(m, m2);
    const float a = s == 0.0f ? 0.0f : s * exp2f(m - m_new);
    const float b = s2 == 0.0f ? 0.0f : s2 * exp2f(m2 - m_new);
    m = m_new;
    s = a + b;
}

// 2^x by the special-function unit alone: ex2.approx.ftz, relative error below 2^-22 (PTX ISA), results below
// 2^-126 flushed to 0. exp2f adds the subnormal range's fix-up around the same instruction; here every term is
// divided by a row sum >= 1 (the max's own term), so a term below 2^-126 weighs nothing.
__device__ __forceinline__ float classifier_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// grid BT, block CLASSIFIER_BLOCK: one row per block.
// The softmax is taken in base 2, e^(z - max) = 2^(z log2(e) - max log2(e)), so that each element costs one fma
// and one ex2 of the special-function unit (expf costs a range reduction of several instructions around the
// same ex2); these per-element instructions, not memory traffic, bound the kernel: 1.53 ms with expf, 0.95 ms so
// (dev/cuda/trunk.cu's two versions, BT = 16384 rows of 50304 bf16, one H200). m below is the row's running max
// of z, scaled by log2(e): rounding is monotone, so the max of the scaled logits is the scaled max.
__global__ void __launch_bounds__(CLASSIFIER_BLOCK) fused_classifier_kernel(floatX* logits, float* losses,
                                                                           const int* targets, float dloss, int V,
                                                                           int Vp, int write_dlogits) {
    __shared__ float warp_m[CLASSIFIER_BLOCK / 32], warp_s[CLASSIFIER_BLOCK / 32];
    const int row = blockIdx.x;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    floatX* z = logits + (size_t)row * Vp;
    const int target = targets != NULL ? targets[row] : -1;
    // the target's logit, read before any thread may overwrite it with its gradient (after the barrier below)
    const float z_target = (threadIdx.x == 0 && target >= 0) ? to_float(z[target]) : 0.0f;
    const int V_packs = V - V % CLASSIFIER_VEC;   // the columns in whole packs; the rest, V_packs..V-1, one by one

    // pass 1: each thread's running (max, sum) over its 16-byte packs of the first V_packs columns, then over
    // the last V % CLASSIFIER_VEC columns, one each for the first threads
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x * CLASSIFIER_VEC; i < V_packs; i += CLASSIFIER_BLOCK * CLASSIFIER_VEC) {
        const ClassifierPack pack = *(const ClassifierPack*)(z + i);
        float pack_max = to_float(pack.v[0]);
        for (int k = 1; k < CLASSIFIER_VEC; k++) { pack_max = fmaxf(pack_max, to_float(pack.v[k])); }
        const float m_new = fmaxf(m, pack_max * CLASSIFIER_LOG2E);
        s *= classifier_exp2(m - m_new);   // m = -inf on the first pack: s is 0 and 2^-inf = 0
        for (int k = 0; k < CLASSIFIER_VEC; k++) {
            s += classifier_exp2(fmaf(to_float(pack.v[k]), CLASSIFIER_LOG2E, -m_new));
        }
        m = m_new;
    }
    if (V_packs + threadIdx.x < V) {
        softmax_stats_merge(m, s, to_float(z[V_packs + threadIdx.x]) * CLASSIFIER_LOG2E, 1.0f);
    }
    // combine: within each warp, then the warps' results in warp 0
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        softmax_stats_merge(m, s, m2, s2);
    }
    if (lane == 0) {
        warp_m[warp] = m;
        warp_s[warp] = s;
    }
    __syncthreads();
    if (warp == 0) {
        m = lane < CLASSIFIER_BLOCK / 32 ? warp_m[lane] : -INFINITY;
        s = lane < CLASSIFIER_BLOCK / 32 ? warp_s[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            softmax_stats_merge(m, s, m2, s2);
        }
        if (lane == 0) {
            warp_m[0] = m;
            warp_s[0] = s;
            // -log p[target] = ln(sum_j e^(z_j - max)) - (z_target - max), with m = max log2(e)
            if (losses != NULL && targets != NULL) {
                losses[row] = target >= 0 ? logf(s) - (z_target - m * (1.0f / CLASSIFIER_LOG2E)) : 0.0f;
            }
        }
    }
    __syncthreads();
    if (!write_dlogits) { return; }
    const float row_max = warp_m[0], p_scale = dloss / warp_s[0];

    // pass 2: dlogits = p * dloss - onehot(target) * dloss over the first V columns, 0 over the padding and
    // over the whole row of an ignored target
    for (int i = threadIdx.x * CLASSIFIER_VEC; i < Vp; i += CLASSIFIER_BLOCK * CLASSIFIER_VEC) {
        ClassifierPack pack = *(const ClassifierPack*)(z + i);
        for (int k = 0; k < CLASSIFIER_VEC; k++) {
            const int j = i + k;
            float d = 0.0f;
            if (j < V && target >= 0) {
                d = classifier_exp2(fmaf(to_float(pack.v[k]), CLASSIFIER_LOG2E, -row_max)) * p_scale;
                if (j == target) { d -= dloss; }
            }
            pack.v[k] = from_float<floatX>(d);
        }
        *(ClassifierPack*)(z + i) = pack;
    }
}

// logits [BT, Vp] floatX; losses [BT] fp32 (written when not NULL and targets is not NULL); targets [BT] on the
// device, in 0..V-1 or negative (ignored; needed when write_dlogits). dloss: the gradient of the total loss w.r.t.
// each labelled row's loss, e.g. 1 / (labelled rows * grad_accum) for a mean.
static void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss, int BT, int V, int Vp,
                             int write_dlogits, cudaStream_t stream) {
    if (Vp % CLASSIFIER_VEC != 0 || (uintptr_t)logits % 16 != 0) {
        die("fused_classifier: the padded vocabulary %d must be a multiple of %d and the logits 16-byte aligned",
            Vp, CLASSIFIER_VEC);
    }
    if (V <= 0 || V > Vp) { die("fused_classifier: vocabulary %d must be in 1..%d (the padded vocabulary)", V, Vp); }
    if (write_dlogits && targets == NULL) { die("fused_classifier: the gradient needs targets"); }
    if (BT == 0) { return; }
    fused_classifier_kernel<<<BT, CLASSIFIER_BLOCK, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_dlogits);
    cudaCheckLaunch();
}

#define ARGMAX_BLOCK 256

// (value, index) pairs: a wins over b when it is larger, or equal at a smaller index (the first maximum)
__device__ __forceinline__ void argmax_combine(float* v, int* i, float ov, int oi) {
    if (ov > *v || (ov == *v && oi < *i)) { *v = ov; *i = oi; }
}

__global__ void __launch_bounds__(ARGMAX_BLOCK) argmax_rows_kernel(int* best, const floatX* logits, int V, int Vp) {
    __shared__ float warp_v[ARGMAX_BLOCK / 32];
    __shared__ int warp_i[ARGMAX_BLOCK / 32];
    const floatX* z = logits + (size_t)blockIdx.x * Vp;
    float v = to_float(z[0]);
    int idx = 0;
    for (int j = threadIdx.x; j < V; j += ARGMAX_BLOCK) { argmax_combine(&v, &idx, to_float(z[j]), j); }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        argmax_combine(&v, &idx, ov, oi);
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) { warp_v[warp] = v; warp_i[warp] = idx; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_BLOCK / 32; w++) { argmax_combine(&v, &idx, warp_v[w], warp_i[w]); }
        best[blockIdx.x] = idx;
    }
}

// best [N] on the device = the argmax of each row of logits [N, Vp] over its first V columns (the first maximum)
static void argmax_rows(int* best, const floatX* logits, int N, int V, int Vp, cudaStream_t stream) {
    if (V <= 0 || V > Vp) { die("argmax_rows: vocabulary %d must be in 1..%d (the padded vocabulary)", V, Vp); }
    if (N == 0) { return; }
    argmax_rows_kernel<<<N, ARGMAX_BLOCK, 0, stream>>>(best, logits, V, Vp);
    cudaCheckLaunch();
}

#endif // TRAIN_KLA_KERNELS_CLASSIFIER_CUH
