/*
kernels/pdn.cuh: the per-token parts and the recurrent core of the pdn / pgdn / pkda layer (spec/pdn.md): the token
features (l2 norms, gains, decays; 1.1-1.2) and their backward (2.4), the recurrent core forward (spec 2.1), and the
preconditioner scans of the chunkwise core. The CPU versions are pdn_token_features, pdn_core_forward and the
per-token loops of pdn_backward in train_kla.c; the math is the same, line for line (sums over the state may run in
another order).

The recurrent core: one CTA per (sequence, head) walks the tokens in order with the fp32 state S [dk, dv] and the
preconditioner state A [dk] in shared memory; every variant decodes with it (its exact reverse-time backward, spec
2.2-2.3, is dev/cuda/pdn_recurrent_backward.cuh: the lab's version 1 and the emulator's reference). Every variant
trains on the chunkwise form of spec 3: the preconditioner scan here (pdn_precond_forward / _backward), the main
recurrence on kernels/gdn_chunk.cuh's tensor-core chunk kernels with the write key k~ = m k (pkda with its
per-channel decay, GDN_DECAY_CHANNEL).

Layouts (row-major), with D = 2*H*dk + H*dv, HK = H*dk, HV = H*dv, BT = B*T rows:
  proj [BT, ld_proj] floatX  in_proj output, column blocks q | k | v | b | aP | bP, then pgdn a (H), pkda f1 | g1 (dv)
  qkv  [BT, D] floatX        conv + SiLU output, blocks q | k | v; q and k l2-normalised in place
  qn, kn, beta, gP, bP [BT, H] fp32; g, A, m [BT, HK] fp32 (g: the main log decay per key channel, pdn 0)
  fpre [BT, HK] floatX       pkda: f1 f2^T (pre-softplus decay)
  kt [BT, HK] floatX         the write key k~ = m k of the chunkwise core
  o [BT, HV] floatX          core output
  Sck [B, H, NT, dk, dv]     fp32, S at the start of each PDN_CHECKPOINT-token segment (NT = ceil(T / 64)), for the
                             recurrent backward of dev/cuda/pdn_recurrent_backward.cuh
Parameter gradients are reduced without atomics (ordered_column_sum and fixed-order loops): runs are bitwise
reproducible.
*/
#ifndef TRAIN_KLA_KERNELS_PDN_CUH
#define TRAIN_KLA_KERNELS_PDN_CUH

#include "common.cuh"
#include "column_sum.cuh"

#define PDN_TOKEN_WARPS 8        // warps per block of the per-(row, head) kernels
#define PDN_CORE_THREADS 128     // threads of a core CTA (one (sequence, head))
#define PDN_CHECKPOINT 64        // tokens between the saved states of the core backward's recomputation

__host__ __device__ inline int pdn_segments(int T) { return (T + PDN_CHECKPOINT - 1) / PDN_CHECKPOINT; }

// ----------------------------------------------------------------------------------------------------------
// token features (spec 1.1 steps 4-5, 1.2), one warp per (row, head):
//   q, k <- l2n (qn, kn the norms); beta = sigmoid(b); gP = -exp(A_log_P) softplus(aP + dt_bias_P); bP = sigmoid(bP)
//   g [dk]: pdn 0; pgdn -exp(A_log) softplus(a + dt_bias) on every channel; pkda -exp(A_log) softplus(f + dt_bias)

// Lane l takes the channels of its packs d = V (l + 32 j) (warp_row_pack picks V).
template <int V>
__global__ void pdn_features_forward_kernel(floatX* qkv, float* qn, float* kn, float* beta, float* gP, float* bP,
                                            float* g, const floatX* proj, int ld_proj, const floatX* fpre,
                                            const float* A_log, const float* dt_bias, const float* A_log_P,
                                            const float* dt_bias_P, int BT, int H, int dk, int dv, int variant,
                                            float l2norm_eps) {
    const int pair = blockIdx.x * PDN_TOKEN_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (pair >= BT * H) { return; }
    const int r = pair / H, hh = pair % H;
    const int D = 2 * H * dk + H * dv;
    const size_t e = (size_t)r * H + hh;
    floatX* q = qkv + (size_t)r * D + hh * dk;
    floatX* k = qkv + (size_t)r * D + H * dk + hh * dk;
    float qq = 0.0f, kk = 0.0f;
    for (int d = lane * V; d < dk; d += 32 * V) {
        const XPack<V> qp = pack_load<V>(q + d), kp = pack_load<V>(k + d);
        for (int i = 0; i < V; i++) {
            qq += to_float(qp.v[i]) * to_float(qp.v[i]);
            kk += to_float(kp.v[i]) * to_float(kp.v[i]);
        }
    }
    qq = warp_reduce_sum(qq);
    kk = warp_reduce_sum(kk);
    const float q_norm = sqrtf(qq + l2norm_eps), k_norm = sqrtf(kk + l2norm_eps);
    const float qs = 1.0f / q_norm, ks = 1.0f / k_norm;
    const floatX* prow = proj + (size_t)r * ld_proj + D;   // b | aP | bP | a (pgdn)
    const float ea = variant == 0 ? 0.0f : -expf(A_log[hh]);
    const float gs = variant == 1 ? ea * softplusf_dev(to_float(prow[3 * H + hh]) + dt_bias[hh]) : 0.0f;
    const floatX* f = variant == 2 ? fpre + (size_t)r * H * dk + hh * dk : NULL;
    float* gh = g + e * dk;
    for (int d = lane * V; d < dk; d += 32 * V) {
        XPack<V> qp = pack_load<V>(q + d), kp = pack_load<V>(k + d), fp;
        Pack<float, V> gp;
        if (variant == 2) { fp = pack_load<V>(f + d); }
        for (int i = 0; i < V; i++) {
            qp.v[i] = from_float<floatX>(to_float(qp.v[i]) * qs);
            kp.v[i] = from_float<floatX>(to_float(kp.v[i]) * ks);
            // g: pdn 0, pgdn the head's scalar decay on every channel, pkda the channel's own
            gp.v[i] = variant == 2 ? ea * softplusf_dev(to_float(fp.v[i]) + dt_bias[hh * dk + d + i]) : gs;
        }
        pack_store(q + d, qp);
        pack_store(k + d, kp);
        pack_store(gh + d, gp);
    }
    if (lane == 0) {
        qn[e] = q_norm;
        kn[e] = k_norm;
        beta[e] = sigmoidf_dev(to_float(prow[hh]));
        gP[e] = -expf(A_log_P[hh]) * softplusf_dev(to_float(prow[H + hh]) + dt_bias_P[hh]);
        bP[e] = sigmoidf_dev(to_float(prow[2 * H + hh]));
    }
}

static void pdn_features_forward(floatX* qkv, float* qn, float* kn, float* beta, float* gP, float* bP, float* g,
                                 const floatX* proj, int ld_proj, const floatX* fpre, const float* A_log,
                                 const float* dt_bias, const float* A_log_P, const float* dt_bias_P, int BT, int H,
                                 int dk, int dv, int variant, float l2norm_eps, cudaStream_t stream) {
    const int V = warp_row_pack(dk, {2 * H * dk + H * dv, H * dk}, {qkv, g, variant == 2 ? (const void*)fpre : g});
    PACK_DISPATCH(V, pdn_features_forward_kernel<VW><<<ceil_div(BT * H, PDN_TOKEN_WARPS), PDN_TOKEN_WARPS * 32, 0,
                                                       stream>>>(qkv, qn, kn, beta, gP, bP, g, proj, ld_proj, fpre,
                                                                 A_log, dt_bias, A_log_P, dt_bias_P, BT, H, dk, dv,
                                                                 variant, l2norm_eps));
}

// ----------------------------------------------------------------------------------------------------------
// token features backward (spec 2.4), one warp per (row, head). On entry dqkv [BT, D] holds the core's gradients
// w.r.t. the normalised q, k and v; on exit dL/d(SiLU output) (l2 norm backward of q and k). Writes the b, aP,
// bP (and pgdn a) columns of dproj, pkda's dfpre [BT, HK], and the per-row terms of the parameter gradients into
// stage [BT, ncols], columns dA_log_P (H) | ddt_bias_P (H) | dA_log (H) | ddt_bias (pgdn H, pkda HK).
// dg: the core's gradient of the main log decay, dg_channels per (row, head): 1 for pgdn's scalar decay, dk for
// pkda's per-channel one (and from the recurrent core's backward, per channel for every variant).

__host__ __device__ inline int pdn_stage_cols(int H, int dk, int variant) {
    return 3 * H + (variant == 1 ? H : variant == 2 ? H * dk : 0);
}

template <int V>
__global__ void pdn_features_backward_kernel(float* dqkv, floatX* dproj, int ld_proj, floatX* dfpre, float* stage,
                                             const float* dbeta, const float* dgP, const float* dbP, const float* dg,
                                             int dg_channels, const floatX* qkv, const float* qn, const float* kn,
                                             const float* beta, const float* gP, const float* bP, const float* g,
                                             const floatX* proj, const floatX* fpre, const float* A_log,
                                             const float* dt_bias, const float* A_log_P, const float* dt_bias_P, int BT,
                                             int H, int dk, int dv, int variant) {
    const int pair = blockIdx.x * PDN_TOKEN_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (pair >= BT * H) { return; }
    const int r = pair / H, hh = pair % H;
    const int D = 2 * H * dk + H * dv, HK = H * dk;
    const int ncols = pdn_stage_cols(H, dk, variant);
    const size_t e = (size_t)r * H + hh;
    // l2 norm backward: du = (du_hat - u_hat (u_hat . du_hat)) / n, for q and k
    for (int which = 0; which < 2; which++) {
        const floatX* u = qkv + (size_t)r * D + which * HK + hh * dk;
        float* du = dqkv + (size_t)r * D + which * HK + hh * dk;
        float dot = 0.0f;
        for (int d = lane * V; d < dk; d += 32 * V) {
            const XPack<V> up = pack_load<V>(u + d);
            const Pack<float, V> dp = pack_load<V>(du + d);
            for (int i = 0; i < V; i++) { dot += to_float(up.v[i]) * dp.v[i]; }
        }
        dot = warp_reduce_sum(dot);
        const float n = which == 0 ? qn[e] : kn[e];
        for (int d = lane * V; d < dk; d += 32 * V) {
            const XPack<V> up = pack_load<V>(u + d);
            Pack<float, V> dp = pack_load<V>(du + d);
            for (int i = 0; i < V; i++) { dp.v[i] = (dp.v[i] - to_float(up.v[i]) * dot) / n; }
            pack_store(du + d, dp);
        }
    }
    const floatX* prow = proj + (size_t)r * ld_proj + D;
    floatX* dprow = dproj + (size_t)r * ld_proj + D;
    float* st = stage + (size_t)r * ncols;
    const float* dgh = dg + e * dg_channels;
    const float* gh = g + e * dk;
    if (variant == 2) {   // pkda: dfpre = dg (-exp(A_log)) softplus'(f + dt_bias); dA_log = sum_d dg g
        const float ea = -expf(A_log[hh]);
        const floatX* f = fpre + (size_t)r * HK + hh * dk;
        float s = 0.0f;
        for (int d = lane * V; d < dk; d += 32 * V) {
            const Pack<float, V> dgp = pack_load<V>(dgh + d), gp = pack_load<V>(gh + d);
            const XPack<V> fp = pack_load<V>(f + d);
            XPack<V> dfp;
            for (int i = 0; i < V; i++) {
                const float df = dgp.v[i] * ea * dsoftplusf_dev(to_float(fp.v[i]) + dt_bias[hh * dk + d + i]);
                dfp.v[i] = from_float<floatX>(df);
                st[3 * H + hh * dk + d + i] = df;
                s += dgp.v[i] * gp.v[i];
            }
            pack_store(dfpre + (size_t)r * HK + hh * dk + d, dfp);
        }
        s = warp_reduce_sum(s);
        if (lane == 0) { st[2 * H + hh] = s; }
    }
    float dgs = 0.0f;   // pgdn: the scalar decay's gradient, the sum over the channels
    if (variant == 1) {
        for (int d = lane; d < dg_channels; d += 32) { dgs += dgh[d]; }
        dgs = warp_reduce_sum(dgs);
    }
    if (lane == 0) {
        const float bt = beta[e], bp = bP[e];
        dprow[hh] = from_float<floatX>(dbeta[e] * bt * (1.0f - bt));
        dprow[2 * H + hh] = from_float<floatX>(dbP[e] * bp * (1.0f - bp));
        const float daP = dgP[e] * -expf(A_log_P[hh]) * dsoftplusf_dev(to_float(prow[H + hh]) + dt_bias_P[hh]);
        dprow[H + hh] = from_float<floatX>(daP);
        st[hh] = dgP[e] * gP[e];
        st[H + hh] = daP;
        if (variant == 0) {
            st[2 * H + hh] = 0.0f;
        } else if (variant == 1) {
            const float da = dgs * -expf(A_log[hh]) * dsoftplusf_dev(to_float(prow[3 * H + hh]) + dt_bias[hh]);
            dprow[3 * H + hh] = from_float<floatX>(da);
            st[2 * H + hh] = dgs * gh[0];
            st[3 * H + hh] = da;
        }
    }
}

// adds the reduced stage columns [ncols] into the gradients (A_log, dt_bias absent for pdn)
__global__ void pdn_gate_grads_add_kernel(float* dA_log_P, float* ddt_bias_P, float* dA_log, float* ddt_bias,
                                          const float* sums, int H, int ndt) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < H) {
        dA_log_P[i] += sums[i];
        ddt_bias_P[i] += sums[H + i];
        if (dA_log) { dA_log[i] += sums[2 * H + i]; }
    }
    if (i < ndt) { ddt_bias[i] += sums[3 * H + i]; }
}

// stage [BT, ncols], the level-1 partials of its column sums, and the [ncols] sums
static size_t pdn_features_backward_scratch_bytes(int BT, int H, int dk, int variant) {
    return ((size_t)BT + colsum_splits(BT) + 1) * pdn_stage_cols(H, dk, variant) * sizeof(float);
}

static void pdn_features_backward(float* dqkv, floatX* dproj, int ld_proj, floatX* dfpre, float* dA_log,
                                  float* ddt_bias, float* dA_log_P, float* ddt_bias_P, float* scratch,
                                  const float* dbeta, const float* dgP, const float* dbP, const float* dg,
                                  int dg_channels, const floatX* qkv, const float* qn, const float* kn, const float* beta,
                                  const float* gP, const float* bP, const float* g, const floatX* proj,
                                  const floatX* fpre, const float* A_log, const float* dt_bias, const float* A_log_P,
                                  const float* dt_bias_P, int BT, int H, int dk, int dv, int variant,
                                  cudaStream_t stream) {
    const int ncols = pdn_stage_cols(H, dk, variant), ndt = ncols - 3 * H;
    float* stage = scratch;
    float* partials = stage + (size_t)BT * ncols;
    float* sums = partials + (size_t)colsum_splits(BT) * ncols;
    const bool pkda = variant == 2;   // only pkda walks dg, g, fpre and dfpre in packs
    const int V = warp_row_pack(dk, {2 * H * dk + H * dv}, {dqkv, qkv, pkda ? dg : dqkv, pkda ? g : dqkv,
                                                             pkda ? fpre : qkv, pkda ? dfpre : qkv});
    PACK_DISPATCH(V, pdn_features_backward_kernel<VW><<<ceil_div(BT * H, PDN_TOKEN_WARPS), PDN_TOKEN_WARPS * 32, 0,
                                                        stream>>>(dqkv, dproj, ld_proj, dfpre, stage, dbeta, dgP, dbP,
                                                                  dg, dg_channels, qkv, qn, kn, beta, gP, bP, g, proj,
                                                                  fpre, A_log, dt_bias, A_log_P, dt_bias_P, BT, H, dk,
                                                                  dv, variant));
    ordered_column_sum(sums, partials, stage, BT, ncols, 0, stream);
    const int n = ndt > H ? ndt : H;
    pdn_gate_grads_add_kernel<<<ceil_div(n, 128), 128, 0, stream>>>(dA_log_P, ddt_bias_P, variant ? dA_log : NULL,
                                                                    ddt_bias, sums, H, ndt);
    cudaCheckLaunch();
}

// pkda's f1 | g1 block of proj (dv columns each, rows ld apart) and the dense f1, g1 [rows, dv]: TO_BLOCK false
// copies the block out into f1, g1 (the forward), true copies f1, g1 into the block (the backward's df1, dg1 into
// dproj). One thread per pack of V elements (V divides dv, ld and the block's offset).
template <bool TO_BLOCK, int V>
__global__ void pdn_lowrank_copy_kernel(floatX* block, int ld, floatX* f1, floatX* g1, int rows, int dv) {
    const int packs = dv / V;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * 2 * packs) { return; }
    const size_t r = idx / (2 * packs);
    const int q = (int)(idx - r * 2 * packs), half = q / packs, c = (q - half * packs) * V;
    floatX* b = block + r * ld + half * dv + c;
    floatX* d = (half ? g1 : f1) + r * dv + c;
    if (TO_BLOCK) { pack_store(b, pack_load<V>(d)); }
    else { pack_store(d, pack_load<V>(b)); }
}

template <bool TO_BLOCK>
static void pdn_lowrank_copy(floatX* block, int ld, floatX* f1, floatX* g1, int rows, int dv, cudaStream_t stream) {
    int V = xpack_width(dv, {block, f1, g1});
    while (ld % V != 0) { V /= 2; }
    const unsigned grid = (unsigned)ceil_div_z((size_t)rows * 2 * dv / V, 256);
    PACK_DISPATCH(V, pdn_lowrank_copy_kernel<TO_BLOCK, VW><<<grid, 256, 0, stream>>>(block, ld, f1, g1, rows, dv));
}

// ----------------------------------------------------------------------------------------------------------
// the preconditioner's per-channel terms (spec 1.3, 2.3), shared by the recurrent core and the chunked scans:
// the multiplier m = exp(-ln(x) softsign(r)) with r = log(A + eps) - c, and the backward's dr, the gradient of r
// from dk~ (dA_loc = dr / (A + eps) is the term before the carry)
__device__ __forceinline__ float pdn_multiplier(float A, float c, float lnx, float eps) {
    const float rr = logf(A + eps) - c;
    return expf(-lnx * (rr / (1.0f + fabsf(rr))));
}

__device__ __forceinline__ float pdn_precond_dr(float dkt, float md, float kd, float At, float c, float lnx,
                                                float eps) {
    const float rr = logf(At + eps) - c;
    const float den = 1.0f + fabsf(rr);
    return -lnx * md * (dkt * kd) / (den * den);
}

// ----------------------------------------------------------------------------------------------------------
// the core forward (spec 2.1), grid B*H, block PDN_CORE_THREADS; per token t of head h:
//   A = exp(gP) A + bP k^2;  r = log(A + eps) - c;  m = exp(-ln(x) softsign(r))      (thread per key channel d)
//   p = v - (exp(g) k)^T S;  S = exp(g) S + (beta m k) p^T;  o = qscale S^T q        (thread per value column j)
// S lives in shared memory as [dk][dv + 1] (the padding keeps row-wise walks free of bank conflicts).
// S_io [B, H, dk, dv], A_io [B, H, dk]: initial states in and final states out (NULL: zero start, not written).
// Writes o, A and m [BT, HK] (the backward's inputs) and, if Sck, the segment-start states.

static size_t pdn_core_forward_smem(int dk, int dv) {
    return ((size_t)dk * (dv + 1) + 5 * (size_t)dk) * sizeof(float);
}

__global__ void pdn_core_forward_kernel(floatX* o, float* A_out, float* m_out, float* Sck, float* S_io, float* A_io,
                                        const floatX* qkv, const float* beta, const float* g, const float* gP,
                                        const float* bP, const float* cs, int T, int H, int dk, int dv, float qscale,
                                        float lnx, float eps) {
    extern __shared__ float smem[];
    const int ld = dv + 1;
    float* S = smem;                 // [dk][ld]
    float* A = S + dk * ld;          // [dk] preconditioner state
    float* qv = A + dk;              // [dk] q of the token
    float* ek = qv + dk;             // [dk] exp(g) k
    float* al = ek + dk;             // [dk] exp(g)
    float* wk = al + dk;             // [dk] beta m k
    const int bh = blockIdx.x, b = bh / H, hh = bh % H, tid = threadIdx.x;
    const int D = 2 * H * dk + H * dv, NT = pdn_segments(T);
    const size_t dkdv = (size_t)dk * dv;
    for (int i = tid; i < dk * dv; i += blockDim.x) { S[(i / dv) * ld + i % dv] = S_io ? S_io[bh * dkdv + i] : 0.0f; }
    for (int d = tid; d < dk; d += blockDim.x) { A[d] = A_io ? A_io[(size_t)bh * dk + d] : 0.0f; }
    const float c = cs[hh];
    __syncthreads();
    for (int t = 0; t < T; t++) {
        const size_t r = (size_t)b * T + t, e = r * H + hh;
        if (Sck && t % PDN_CHECKPOINT == 0) {
            float* dst = Sck + ((size_t)bh * NT + t / PDN_CHECKPOINT) * dkdv;
            for (int i = tid; i < dk * dv; i += blockDim.x) { dst[i] = S[(i / dv) * ld + i % dv]; }
        }
        const floatX* row = qkv + r * D;
        const float bt = beta[e], eg = expf(gP[e]), bp = bP[e];
        for (int d = tid; d < dk; d += blockDim.x) {
            const float kd = to_float(row[H * dk + hh * dk + d]);
            const float a = eg * A[d] + bp * kd * kd;
            const float md = pdn_multiplier(a, c, lnx, eps);
            A[d] = a;
            A_out[e * dk + d] = a;
            m_out[e * dk + d] = md;
            const float ad = expf(g[e * dk + d]);
            qv[d] = to_float(row[hh * dk + d]);
            al[d] = ad;
            ek[d] = ad * kd;
            wk[d] = bt * md * kd;
        }
        __syncthreads();
        for (int j = tid; j < dv; j += blockDim.x) {
            float p = to_float(row[2 * H * dk + hh * dv + j]);
            for (int d = 0; d < dk; d++) { p -= ek[d] * S[d * ld + j]; }
            float oj = 0.0f;
            for (int d = 0; d < dk; d++) {
                const float s = al[d] * S[d * ld + j] + wk[d] * p;
                S[d * ld + j] = s;
                oj += qv[d] * s;
            }
            o[e * dv + j] = from_float<floatX>(qscale * oj);
        }
        __syncthreads();
    }
    if (S_io) {
        for (int i = tid; i < dk * dv; i += blockDim.x) { S_io[bh * dkdv + i] = S[(i / dv) * ld + i % dv]; }
    }
    if (A_io) {
        for (int d = tid; d < dk; d += blockDim.x) { A_io[(size_t)bh * dk + d] = A[d]; }
    }
}

static void pdn_core_forward(floatX* o, float* A_out, float* m_out, float* Sck, float* S_io, float* A_io,
                             const floatX* qkv, const float* beta, const float* g, const float* gP, const float* bP,
                             const float* cs, int B, int T, int H, int dk, int dv, float qscale, float lnx, float eps,
                             cudaStream_t stream) {
    const size_t smem = pdn_core_forward_smem(dk, dv);
    cudaCheck(cudaFuncSetAttribute(pdn_core_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    pdn_core_forward_kernel<<<B * H, PDN_CORE_THREADS, smem, stream>>>(o, A_out, m_out, Sck, S_io, A_io, qkv, beta,
                                                                       g, gP, bP, cs, T, H, dk, dv, qscale, lnx, eps);
    cudaCheckLaunch();
}

// dlog_scale[h] += the sum of dcs[(b*H + h)*parts + i] over the sequences b and the parts i, in order
__global__ void pdn_log_scale_grad_kernel(float* dlog_scale, const float* dcs, int B, int H, int parts) {
    const int hh = blockIdx.x * blockDim.x + threadIdx.x;
    if (hh >= H) { return; }
    float s = 0.0f;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < parts; i++) { s += dcs[((size_t)b * H + hh) * parts + i]; }
    }
    dlog_scale[hh] += s;
}

// ----------------------------------------------------------------------------------------------------------
// the preconditioner of the chunkwise core (spec 3.3), for every variant, whose main recurrence runs on
// kernels/gdn_chunk.cuh with the write key k~ = m k. Per (sequence, head, key channel d) it is the linear scan
//   A_t = exp(gP_t) A_{t-1} + bP_t k_t^2                                          (A_0 = 0)
// then per token r = log(A + eps) - c;  m = exp(-ln(x) softsign(r));  k~ = m k   (pdn_core_forward_kernel's step).
// On chunks of PDN_PRECOND_CHUNK tokens, two kernels, grid (chunk, sequence * head), one thread per channel:
//   1 pdn_precond_summary_kernel   the chunk's own scan from 0: a_n = A at its last token, lam_n = sum of its gP
//   2 pdn_precond_forward_kernel   A at the chunk's start from the earlier summaries (A = exp(lam_j) A + a_j, j < n,
//                                  in order; spec 3.3's stage 2, redone per chunk: at most T/64 steps), then the
//                                  chunk's tokens: A, m [BT, HK] fp32 (the backward's inputs), k~ [BT, HK] floatX
// The scratch holds a [B*H*NT*dk] and lam [B*H*NT] (pdn_precond_scratch_bytes).
#define PDN_PRECOND_CHUNK 64

__host__ __device__ inline int pdn_precond_chunks(int T) { return (T + PDN_PRECOND_CHUNK - 1) / PDN_PRECOND_CHUNK; }

static size_t pdn_precond_scratch_bytes(int B, int T, int H, int dk) {
    return (size_t)B * H * pdn_precond_chunks(T) * (dk + 1) * sizeof(float);
}

// the k of (row r, head hh, channel d) in qkv's k block
__device__ __forceinline__ float pdn_key(const floatX* qkv, size_t r, int H, int hh, int dk, int dv, int d) {
    return to_float(qkv[r * (2 * H * dk + H * dv) + H * dk + hh * dk + d]);
}

__global__ void pdn_precond_summary_kernel(float* a_end, float* lam, const floatX* qkv, const float* gP,
                                           const float* bP, int T, int H, int dk, int dv) {
    const int n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H, d = threadIdx.x, NT = gridDim.x;
    const int t0 = n * PDN_PRECOND_CHUNK, t1 = min(T, t0 + PDN_PRECOND_CHUNK);
    float A = 0.0f, L = 0.0f;
    for (int t = t0; t < t1; t++) {
        const size_t r = (size_t)b * T + t, e = r * H + hh;
        const float kd = d < dk ? pdn_key(qkv, r, H, hh, dk, dv, d) : 0.0f;
        A = expf(gP[e]) * A + bP[e] * kd * kd;
        L += gP[e];
    }
    const size_t c = (size_t)bh * NT + n;
    if (d < dk) { a_end[c * dk + d] = A; }
    if (d == 0) { lam[c] = L; }
}

__global__ void pdn_precond_forward_kernel(float* A_out, float* m_out, floatX* kt, const float* a_end,
                                           const float* lam, const floatX* qkv, const float* gP, const float* bP,
                                           const float* cs, int T, int H, int dk, int dv, float lnx, float eps) {
    const int n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H, d = threadIdx.x, NT = gridDim.x;
    if (d >= dk) { return; }
    const int t0 = n * PDN_PRECOND_CHUNK, t1 = min(T, t0 + PDN_PRECOND_CHUNK);
    float A = 0.0f;
    for (int j = 0; j < n; j++) {
        const size_t c = (size_t)bh * NT + j;
        A = expf(lam[c]) * A + a_end[c * dk + d];
    }
    const float c = cs[hh];
    for (int t = t0; t < t1; t++) {
        const size_t r = (size_t)b * T + t, e = r * H + hh;
        const float kd = pdn_key(qkv, r, H, hh, dk, dv, d);
        A = expf(gP[e]) * A + bP[e] * kd * kd;
        const float md = pdn_multiplier(A, c, lnx, eps);
        A_out[e * dk + d] = A;
        m_out[e * dk + d] = md;
        kt[e * dk + d] = from_float<floatX>(md * kd);
    }
}

static void pdn_precond_check(int dk) {
    if (dk > 256) { die("pdn: the preconditioner kernels take dk <= 256 (got %d)", dk); }
}

// scratch: pdn_precond_scratch_bytes(B, T, H, dk)
static void pdn_precond_forward(float* A_out, float* m_out, floatX* kt, void* scratch, const floatX* qkv,
                                const float* gP, const float* bP, const float* cs, int B, int T, int H, int dk, int dv,
                                float lnx, float eps, cudaStream_t stream) {
    pdn_precond_check(dk);
    const int NT = pdn_precond_chunks(T);
    float* a_end = (float*)scratch;
    float* lam = a_end + (size_t)B * H * NT * dk;
    const dim3 grid(NT, B * H), block(ceil_div(dk, 32) * 32);
    pdn_precond_summary_kernel<<<grid, block, 0, stream>>>(a_end, lam, qkv, gP, bP, T, H, dk, dv);
    cudaCheckLaunch();
    pdn_precond_forward_kernel<<<grid, block, 0, stream>>>(A_out, m_out, kt, a_end, lam, qkv, gP, bP, cs, T, H, dk,
                                                           dv, lnx, eps);
    cudaCheckLaunch();
}

// its backward (spec 2.3), given dk~ [BT, HK] fp32 from the chunk backward. Per channel, in reverse,
//   dr = -ln(x) m (dk~ k) / (1 + |r|)^2;  dc -= dr;  dA = dr / (A + eps) + carry;  carry = exp(gP) dA
//   dk += m dk~ + 2 bP k dA;  dgP = sum_d dA (A - bP k^2);  dbP = sum_d dA k^2
// where the carry is a reverse linear scan, chunked as the forward's:
//   1 pdn_precond_carry_kernel     the chunk's own reverse scan from a zero carry: the carry it passes to the
//                                  token before it (C_n), and lam_n = sum of its gP
//   2 pdn_precond_backward_kernel  the carry into the chunk from the later summaries (C = exp(lam_j) C + C_j,
//                                  j = NT-1 .. n+1), then the chunk's tokens in reverse. dk adds into dqkv's k block
//                                  (the chunk backward's read-key gradient). The per-token sums over the channels
//                                  are warp sums, then the warps' partials in order; dcs[(b*H + h)*NT + n] is the
//                                  CTA's dL/dc, summed in a fixed order.
__global__ void pdn_precond_carry_kernel(float* c_out, float* lam, const float* dkt, const floatX* qkv,
                                         const float* A, const float* m, const float* gP, const float* cs, int T,
                                         int H, int dk, int dv, float lnx, float eps) {
    const int n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H, d = threadIdx.x, NT = gridDim.x;
    const int t0 = n * PDN_PRECOND_CHUNK, t1 = min(T, t0 + PDN_PRECOND_CHUNK);
    const float c = cs[hh];
    float carry = 0.0f, L = 0.0f;
    for (int t = t1 - 1; t >= t0; t--) {
        const size_t r = (size_t)b * T + t, e = r * H + hh;
        if (d < dk) {
            const float At = A[e * dk + d];
            const float dr = pdn_precond_dr(dkt[e * dk + d], m[e * dk + d], pdn_key(qkv, r, H, hh, dk, dv, d), At, c,
                                            lnx, eps);
            carry = expf(gP[e]) * (dr / (At + eps) + carry);
        }
        L += gP[e];
    }
    const size_t cc = (size_t)bh * NT + n;
    if (d < dk) { c_out[cc * dk + d] = carry; }
    if (d == 0) { lam[cc] = L; }
}

__global__ void pdn_precond_backward_kernel(float* dqkv, float* dgP, float* dbP, float* dcs, const float* c_in,
                                            const float* lam, const float* dkt, const floatX* qkv, const float* A,
                                            const float* m, const float* gP, const float* bP, const float* cs, int T,
                                            int H, int dk, int dv, float lnx, float eps) {
    __shared__ float part[2][8][PDN_PRECOND_CHUNK];   // per warp (dk <= 256: 8 warps), per token of the chunk
    __shared__ float dc_warp[8];
    const int n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H, d = threadIdx.x, NT = gridDim.x;
    const int lane = d % 32, warp = d / 32, nwarps = blockDim.x / 32;
    const int t0 = n * PDN_PRECOND_CHUNK, t1 = min(T, t0 + PDN_PRECOND_CHUNK);
    const int D = 2 * H * dk + H * dv, HK = H * dk;
    const bool on = d < dk;
    const float c = cs[hh];
    float carry = 0.0f, dc = 0.0f;
    if (on) {
        for (int j = NT - 1; j > n; j--) {
            const size_t cj = (size_t)bh * NT + j;
            carry = expf(lam[cj]) * carry + c_in[cj * dk + d];
        }
    }
    for (int t = t1 - 1; t >= t0; t--) {
        const size_t r = (size_t)b * T + t, e = r * H + hh;
        float s1 = 0.0f, s2 = 0.0f;
        if (on) {
            const float kd = pdn_key(qkv, r, H, hh, dk, dv, d);
            const float md = m[e * dk + d], At = A[e * dk + d], dkt_d = dkt[e * dk + d], bp = bP[e];
            const float dr = pdn_precond_dr(dkt_d, md, kd, At, c, lnx, eps);
            dc -= dr;
            const float dA = dr / (At + eps) + carry;
            const float kk = kd * kd;
            s1 = dA * (At - bp * kk);
            s2 = dA * kk;
            dqkv[r * D + HK + hh * dk + d] += dkt_d * md + 2.0f * bp * kd * dA;
            carry = expf(gP[e]) * dA;
        }
        s1 = warp_reduce_sum(s1);
        s2 = warp_reduce_sum(s2);
        if (lane == 0) {
            part[0][warp][t - t0] = s1;
            part[1][warp][t - t0] = s2;
        }
    }
    dc = warp_reduce_sum(dc);
    if (lane == 0) { dc_warp[warp] = dc; }
    __syncthreads();
    for (int j = d; j < 2 * PDN_PRECOND_CHUNK; j += blockDim.x) {   // per (quantity, token of the chunk)
        const int which = j / PDN_PRECOND_CHUNK, i = j % PDN_PRECOND_CHUNK;
        if (t0 + i < t1) {
            float s = 0.0f;
            for (int w = 0; w < nwarps; w++) { s += part[which][w][i]; }
            (which == 0 ? dgP : dbP)[((size_t)b * T + t0 + i) * H + hh] = s;
        }
    }
    if (d == 0) {
        float s = 0.0f;
        for (int w = 0; w < nwarps; w++) { s += dc_warp[w]; }
        dcs[(size_t)bh * NT + n] = s;
    }
}

// dkt: the chunk backward's dL/dk~ [BT, HK]; dqkv's k block += the preconditioner's key gradients; dgP, dbP [BT, H]
// overwritten; dlog_scale[h] += dL/dc (through dcs, [B*H*NT] floats); scratch: pdn_precond_scratch_bytes
static void pdn_precond_backward(float* dqkv, float* dgP, float* dbP, float* dlog_scale, float* dcs, void* scratch,
                                 const float* dkt, const floatX* qkv, const float* A, const float* m, const float* gP,
                                 const float* bP, const float* cs, int B, int T, int H, int dk, int dv, float lnx,
                                 float eps, cudaStream_t stream) {
    pdn_precond_check(dk);
    const int NT = pdn_precond_chunks(T);
    float* c_end = (float*)scratch;
    float* lam = c_end + (size_t)B * H * NT * dk;
    const dim3 grid(NT, B * H), block(ceil_div(dk, 32) * 32);
    pdn_precond_carry_kernel<<<grid, block, 0, stream>>>(c_end, lam, dkt, qkv, A, m, gP, cs, T, H, dk, dv, lnx, eps);
    cudaCheckLaunch();
    pdn_precond_backward_kernel<<<grid, block, 0, stream>>>(dqkv, dgP, dbP, dcs, c_end, lam, dkt, qkv, A, m, gP, bP,
                                                            cs, T, H, dk, dv, lnx, eps);
    cudaCheckLaunch();
    pdn_log_scale_grad_kernel<<<ceil_div(H, 32), 32, 0, stream>>>(dlog_scale, dcs, B, H, NT);
    cudaCheckLaunch();
}

#endif // TRAIN_KLA_KERNELS_PDN_CUH
