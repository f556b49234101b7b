/*
kernels/gated_norm.cuh: the gated output RMSNorm that the recurrent mixers put after their core (gdn/kaczmarz
spec/gdn_kaczmarz.md 1.2 step 8, the pdn family and gka likewise): per (token, head),
y = o * rstd * w * SiLU(z), rstd = 1 / sqrt(mean(o^2) + eps), with w [dv] shared by the heads; and its backward
(spec 1.6). The CPU version is gated_norm_row / gated_norm_backward in train_kla.c.
The same kernels take the gate as a mode: NORM_GATE_SILU (the above), NORM_GATE_SIGMOID (pkda, spec/pdn.md 1.5:
y = o * rstd * w * sigmoid(z)) and NORM_GATE_NONE (pdn, pgdn: plain RMSNorm, z unused); the CPU versions of the
last two are pdn_norm_row and the norm loop of pdn_backward.
*/
#ifndef TRAIN_KLA_KERNELS_GATED_NORM_CUH
#define TRAIN_KLA_KERNELS_GATED_NORM_CUH

#include "common.cuh"
#include "column_sum.cuh"

#define GATED_NORM_WARPS 8            // warps per block, one (row, head) pair per warp in the forward
#define GATED_NORM_PAIRS_PER_WARP 8   // (row, head) pairs one warp of gated_rmsnorm_backward walks

enum { NORM_GATE_SILU, NORM_GATE_SIGMOID, NORM_GATE_NONE };

// the gate s(z) of the mode and its derivative s'(z)
__device__ __forceinline__ float norm_gate(int gate, float z) {
    return gate == NORM_GATE_SILU ? z * sigmoidf_dev(z) : gate == NORM_GATE_SIGMOID ? sigmoidf_dev(z) : 1.0f;
}
__device__ __forceinline__ float norm_dgate(int gate, float z) {
    const float sz = sigmoidf_dev(z);
    return gate == NORM_GATE_SILU ? sz * (1.0f + z * (1.0f - sz)) : gate == NORM_GATE_SIGMOID ? sz * (1.0f - sz) : 0.0f;
}

// ----------------------------------------------------------------------------------------------------------
// gated RMSNorm (spec 1.2 step 8), one warp per (row, head):
//   rstd = 1 / sqrt(mean_i o_i^2 + eps),  y = o * rstd * w * SiLU(z)
// z = proj + D with row stride ld_z = P; w [dv] is shared by the heads. gate: NORM_GATE_* (NONE: z unread).
// Lane l takes the packs of V columns starting at i = V (l + 32 k) (warp_row_pack picks V).

template <int V>
__global__ void gated_rmsnorm_forward_kernel(floatX* y, float* rstd, const floatX* o, const floatX* z, int ld_z,
                                             const float* w, int BT, int H, int dv, float eps, int gate) {
    const int pair = blockIdx.x * GATED_NORM_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (pair >= BT * H) { return; }
    const int r = pair / H, hh = pair % H;
    const size_t off = (size_t)r * H * dv + hh * dv;
    const floatX* oh = o + off;
    const floatX* zh = z + (size_t)r * ld_z + hh * dv;
    float ss = 0.0f;
    for (int i = lane * V; i < dv; i += 32 * V) {
        const XPack<V> op = pack_load<V>(oh + i);
        for (int k = 0; k < V; k++) { ss += to_float(op.v[k]) * to_float(op.v[k]); }
    }
    ss = warp_reduce_sum(ss);
    const float rs = 1.0f / sqrtf(ss / dv + eps);
    for (int i = lane * V; i < dv; i += 32 * V) {
        const XPack<V> op = pack_load<V>(oh + i);
        XPack<V> zp, yp;
        if (gate != NORM_GATE_NONE) { zp = pack_load<V>(zh + i); }
        for (int k = 0; k < V; k++) {
            const float sg = gate == NORM_GATE_NONE ? 1.0f : norm_gate(gate, to_float(zp.v[k]));
            yp.v[k] = from_float<floatX>(to_float(op.v[k]) * rs * w[i + k] * sg);
        }
        pack_store(y + off + i, yp);
    }
    if (lane == 0) { rstd[(size_t)r * H + hh] = rs; }
}

static void gated_rmsnorm_forward_mode(floatX* y, float* rstd, const floatX* o, const floatX* z, int ld_z,
                                       const float* w, int BT, int H, int dv, float eps, int gate,
                                       cudaStream_t stream) {
    const bool gated = gate != NORM_GATE_NONE;
    const int V = warp_row_pack(dv, {gated ? ld_z : dv}, {y, o, gated ? z : o});
    PACK_DISPATCH(V, gated_rmsnorm_forward_kernel<VW><<<ceil_div(BT * H, GATED_NORM_WARPS), GATED_NORM_WARPS * 32, 0,
                                                        stream>>>(y, rstd, o, z, ld_z, w, BT, H, dv, eps, gate));
}

static void gated_rmsnorm_forward(floatX* y, float* rstd, const floatX* o, const floatX* z, int ld_z, const float* w,
                                  int BT, int H, int dv, float eps, cudaStream_t stream) {
    gated_rmsnorm_forward_mode(y, rstd, o, z, ld_z, w, BT, H, dv, eps, NORM_GATE_SILU, stream);
}

// backward (spec 1.6), with xh = o rstd, s = SiLU(z) (the mode's gate s(z)):
//   dz = dy xh w s'(z) (not written for NORM_GATE_NONE),  dxh = dy w s,  do = rstd (dxh - xh mean_i(dxh xh)),
//   dw += sum over rows and heads of dy xh s
// A block of GATED_NORM_WARPS warps takes GATED_NORM_WARPS * GATED_NORM_PAIRS_PER_WARP consecutive (row, head) pairs,
// each warp GATED_NORM_PAIRS_PER_WARP of them in order. Lane l owns the columns of its packs (as in the forward) in
// its warp's dw accumulator in shared memory; at the end the warps' accumulators are added in warp order into the
// block's partial row dw_partial [blocks, dv], which ordered_column_sum reduces. dout_o may alias dy (each element
// is read before the same thread writes it).

static inline int gated_rmsnorm_backward_blocks(int BT, int H) {
    return ceil_div(BT * H, GATED_NORM_WARPS * GATED_NORM_PAIRS_PER_WARP);
}

template <int V>
__global__ void gated_rmsnorm_backward_kernel(floatX* dout_o, floatX* dz, int ld_z, float* dw_partial,
                                              const floatX* dy, const floatX* o, const floatX* z, const float* rstd,
                                              const float* w, int BT, int H, int dv, int gate) {
    extern __shared__ float dw_acc[];   // [GATED_NORM_WARPS, dv]
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    float* acc = dw_acc + warp * dv;
    for (int i = lane; i < dv; i += 32) { acc[i] = 0.0f; }

    const int first = (blockIdx.x * GATED_NORM_WARPS + warp) * GATED_NORM_PAIRS_PER_WARP;
    for (int p = 0; p < GATED_NORM_PAIRS_PER_WARP; p++) {
        const int pair = first + p;
        if (pair >= BT * H) { break; }
        const int r = pair / H, hh = pair % H;
        const size_t off = (size_t)r * H * dv + hh * dv;
        const size_t zoff = (size_t)r * ld_z + hh * dv;
        const float rs = rstd[(size_t)r * H + hh];
        // both passes read the packs of dy, o and (gated) z at columns i ..; zi: the gate input (0 ungated)
        XPack<V> dyp, op, zp;
        const auto load = [&](int i) {
            dyp = pack_load<V>(dy + off + i);
            op = pack_load<V>(o + off + i);
            if (gate != NORM_GATE_NONE) { zp = pack_load<V>(z + zoff + i); }
        };
        const auto zi_of = [&](int k) { return gate == NORM_GATE_NONE ? 0.0f : to_float(zp.v[k]); };
        float m = 0.0f;
        for (int i = lane * V; i < dv; i += 32 * V) {
            load(i);
            XPack<V> dzp;
            for (int k = 0; k < V; k++) {
                const float dyi = to_float(dyp.v[k]);
                const float xh = to_float(op.v[k]) * rs;
                const float zi = zi_of(k);
                const float sw = norm_gate(gate, zi);
                acc[i + k] += dyi * xh * sw;
                if (gate != NORM_GATE_NONE) { dzp.v[k] = from_float<floatX>(dyi * xh * w[i + k] * norm_dgate(gate, zi)); }
                m += dyi * w[i + k] * sw * xh;
            }
            if (gate != NORM_GATE_NONE) { pack_store(dz + zoff + i, dzp); }
        }
        m = warp_reduce_sum(m) / dv;
        for (int i = lane * V; i < dv; i += 32 * V) {
            load(i);
            XPack<V> dop;
            for (int k = 0; k < V; k++) {
                const float oi = to_float(op.v[k]);
                const float dxh = to_float(dyp.v[k]) * w[i + k] * norm_gate(gate, zi_of(k));
                dop.v[k] = from_float<floatX>(rs * (dxh - oi * rs * m));
            }
            pack_store(dout_o + off + i, dop);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < dv; i += blockDim.x) {
        float sum = 0.0f;
        for (int wi = 0; wi < GATED_NORM_WARPS; wi++) { sum += dw_acc[wi * dv + i]; }
        dw_partial[(size_t)blockIdx.x * dv + i] = sum;
    }
}

// block partials [blocks, dv] and the level-1 partials of their column sums
static size_t gated_rmsnorm_backward_scratch_bytes(int BT, int H, int dv) {
    const int blocks = gated_rmsnorm_backward_blocks(BT, H);
    return ((size_t)blocks + colsum_splits(blocks)) * dv * sizeof(float);
}

static void gated_rmsnorm_backward_mode(floatX* dout_o, floatX* dz, int ld_z, float* dw, float* scratch,
                                        const floatX* dy, const floatX* o, const floatX* z, const float* rstd,
                                        const float* w, int BT, int H, int dv, int gate, cudaStream_t stream) {
    const int blocks = gated_rmsnorm_backward_blocks(BT, H);
    const size_t smem = (size_t)GATED_NORM_WARPS * dv * sizeof(float);
    if (smem > 48 * 1024) {
        die("gated_rmsnorm_backward: dv = %d is too large (at most %d)", dv, 48 * 1024 / 4 / GATED_NORM_WARPS);
    }
    float* dw_partial = scratch;
    float* partials = dw_partial + (size_t)blocks * dv;
    const bool gated = gate != NORM_GATE_NONE;
    const int V = warp_row_pack(dv, {gated ? ld_z : dv}, {dout_o, dy, o, gated ? z : o, gated ? dz : o});
    PACK_DISPATCH(V, gated_rmsnorm_backward_kernel<VW><<<blocks, GATED_NORM_WARPS * 32, smem, stream>>>(
                         dout_o, dz, ld_z, dw_partial, dy, o, z, rstd, w, BT, H, dv, gate));
    ordered_column_sum(dw, partials, dw_partial, blocks, dv, 1, stream);
}

static void gated_rmsnorm_backward(floatX* dout_o, floatX* dz, int ld_z, float* dw, float* scratch, const floatX* dy,
                                   const floatX* o, const floatX* z, const float* rstd, const float* w, int BT, int H,
                                   int dv, cudaStream_t stream) {
    gated_rmsnorm_backward_mode(dout_o, dz, ld_z, dw, scratch, dy, o, z, rstd, w, BT, H, dv, NORM_GATE_SILU, stream);
}

#endif // TRAIN_KLA_KERNELS_GATED_NORM_CUH
