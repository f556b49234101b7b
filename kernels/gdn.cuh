/*
kernels/gdn.cuh: the per-token parts of the gdn / kaczmarz layer around the chunkwise core
(spec/gdn_kaczmarz.md): the token features (l2 norms, beta, log decay; 1.2 steps 4-6, 2.2), their backward
(1.6), and the one-token recurrent step of decode (2.1, 4). The gated output RMSNorm (1.2 step 8) is shared by
the recurrent mixers and lives in kernels/gated_norm.cuh. The CPU versions are gdn_token_features, the per-token
loop of gdn_backward and gdn_core_recurrent in train_kla.c; the math is the same, line for line.

Layouts (row-major), with P = 2*H*dk + 2*H*dv + 2*H, D = 2*H*dk + H*dv, HV = H*dv, BT = B*T rows:
  proj [BT, P] floatX       in_proj output, column blocks q | k | v | z | a | b (rows ld_proj >= P apart)
  qkv  [BT, D] floatX       conv + SiLU output, blocks q | k | v; gdn_features_forward normalises q (and k for gdn)
  qn, kn, beta, g [BT, H]   fp32: qn = sqrt(||q||^2 + l2norm_eps) of the raw q; kn = sqrt(||k||^2 + l2norm_eps)
                            (gdn) or ||k||^2 + kaczmarz_eps (kaczmarz); beta the write coefficient; g the log decay
  o [BT, HV] floatX         core output
  S    [B, H, dk, dv] fp32  recurrent state ("K-first", spec 0)

Per-token statistics, gates, decays and the state are fp32; parameters are read from the fp32 master copy.
Parameter gradients are reduced without atomics: per-row values go to scratch and are summed in a fixed order
(ordered_column_sum, kernels/column_sum.cuh), so runs are bitwise reproducible.
*/
#ifndef TRAIN_KLA_KERNELS_GDN_CUH
#define TRAIN_KLA_KERNELS_GDN_CUH

#include "common.cuh"
#include "column_sum.cuh"

#define GDN_TOKEN_WARPS 8           // warps per block of the per-(row, head) kernels
#define GDN_DECODE_ROWS 8           // key-dimension groups of a gdn_recurrent_step block (32 columns x 8)

// ----------------------------------------------------------------------------------------------------------
// token features (spec 1.2 steps 4-6, 2.2), one warp per (row, head):
//   q <- q / qn, qn = sqrt(||q||^2 + l2norm_eps)
//   gdn:      k <- k / kn, kn = sqrt(||k||^2 + l2norm_eps), beta = eta
//   kaczmarz: k raw,       kn = ||k||^2 + kaczmarz_eps,     beta = eta / kn
//   eta = sigmoid(b + b_bias), g = -exp(A_log) softplus(a + dt_bias)
// The sums of squares are fp32 sums of the floatX values.

__global__ void gdn_features_forward_kernel(floatX* qkv, float* qn, float* kn, float* beta, float* g,
                                            const floatX* proj, const float* b_bias, const float* A_log,
                                            const float* dt_bias, int BT, int H, int dk, int dv, int ld_proj,
                                            int kaczmarz, float l2norm_eps, float kaczmarz_eps) {
    const int pair = blockIdx.x * GDN_TOKEN_WARPS + threadIdx.x / 32;   // the same for the whole warp
    const int lane = threadIdx.x % 32;
    if (pair >= BT * H) { return; }
    const int r = pair / H, hh = pair % H;
    const int D = 2 * H * dk + H * dv;
    const int P = ld_proj;
    floatX* q = qkv + (size_t)r * D + hh * dk;
    floatX* k = qkv + (size_t)r * D + H * dk + hh * dk;

    float qq = 0.0f, kk = 0.0f;
    for (int d = lane; d < dk; d += 32) {
        const float qd = to_float(q[d]);
        const float kd = to_float(k[d]);
        qq += qd * qd;
        kk += kd * kd;
    }
    qq = warp_reduce_sum(qq);
    kk = warp_reduce_sum(kk);

    const float q_norm = sqrtf(qq + l2norm_eps);
    const float q_scale = 1.0f / q_norm;
    for (int d = lane; d < dk; d += 32) { q[d] = from_float<floatX>(to_float(q[d]) * q_scale); }

    const float a_pre = to_float(proj[(size_t)r * P + D + H * dv + hh]);
    const float b_pre = to_float(proj[(size_t)r * P + D + H * dv + H + hh]);
    const float eta = sigmoidf_dev(b_pre + b_bias[hh]);
    float k_stat, beta_rh;
    if (kaczmarz) {
        k_stat = kk + kaczmarz_eps;
        beta_rh = eta / k_stat;
    } else {
        k_stat = sqrtf(kk + l2norm_eps);
        const float k_scale = 1.0f / k_stat;
        for (int d = lane; d < dk; d += 32) { k[d] = from_float<floatX>(to_float(k[d]) * k_scale); }
        beta_rh = eta;
    }
    if (lane == 0) {
        const size_t e = (size_t)r * H + hh;
        qn[e] = q_norm;
        kn[e] = k_stat;
        beta[e] = beta_rh;
        g[e] = -expf(A_log[hh]) * softplusf_dev(a_pre + dt_bias[hh]);
    }
}

// qkv is normalised in place; qn, kn, beta, g [BT, H] are written; proj's rows are ld_proj >= P apart
static void gdn_features_forward(floatX* qkv, float* qn, float* kn, float* beta, float* g, const floatX* proj,
                                 int ld_proj, const float* b_bias, const float* A_log, const float* dt_bias, int BT,
                                 int H, int dk, int dv, int kaczmarz, float l2norm_eps, float kaczmarz_eps,
                                 cudaStream_t stream) {
    gdn_features_forward_kernel<<<ceil_div(BT * H, GDN_TOKEN_WARPS), GDN_TOKEN_WARPS * 32, 0, stream>>>(
        qkv, qn, kn, beta, g, proj, b_bias, A_log, dt_bias, BT, H, dk, dv, ld_proj, kaczmarz, l2norm_eps,
        kaczmarz_eps);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// token features backward (spec 1.6), one warp per (row, head). On entry dqkv [BT, D] holds the core's
// gradients w.r.t. the normalised q, the k the core saw, and v; on exit dL/d(SiLU output):
//   l2 norm backward (q; k for gdn): du = (du_hat - u_hat (u_hat . du_hat)) / n
//   kaczmarz beta chain, s2 = kn = ||k||^2 + eps: dk += -2 dbeta beta / s2 k, deta = dbeta / s2 (gdn: deta = dbeta)
//   db = deta eta (1 - eta), da = dg (-exp(A_log)) softplus'(a + dt_bias)
// da and db go to the a and b columns of dproj; dg g, da, db go to stage [BT, 3H] (columns dA_log | ddt_bias |
// db_bias) for the ordered parameter-gradient sums.

__global__ void gdn_features_backward_kernel(float* dqkv, floatX* dproj, float* stage, const float* dbeta,
                                             const float* dg, const floatX* qkv, const float* qn, const float* kn,
                                             const float* beta, const float* g, const floatX* proj,
                                             const float* b_bias, const float* A_log, const float* dt_bias,
                                             int BT, int H, int dk, int dv, int ld_proj, int kaczmarz) {
    const int pair = blockIdx.x * GDN_TOKEN_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (pair >= BT * H) { return; }
    const int r = pair / H, hh = pair % H;
    const int D = 2 * H * dk + H * dv;
    const int HV = H * dv;
    const int P = ld_proj;
    const size_t e = (size_t)r * H + hh;
    const floatX* q_hat = qkv + (size_t)r * D + hh * dk;
    const floatX* k_row = qkv + (size_t)r * D + H * dk + hh * dk;   // normalised (gdn) or raw (kaczmarz) k
    float* dq = dqkv + (size_t)r * D + hh * dk;
    float* dk_row = dqkv + (size_t)r * D + H * dk + hh * dk;

    // q: l2 norm backward
    float qdot = 0.0f;
    for (int d = lane; d < dk; d += 32) { qdot += to_float(q_hat[d]) * dq[d]; }
    qdot = warp_reduce_sum(qdot);
    const float q_norm = qn[e];
    for (int d = lane; d < dk; d += 32) { dq[d] = (dq[d] - to_float(q_hat[d]) * qdot) / q_norm; }

    // k: kaczmarz beta chain, or l2 norm backward; deta
    float deta;
    if (kaczmarz) {
        const float s2 = kn[e];
        const float ck = -2.0f * dbeta[e] * beta[e] / s2;
        for (int d = lane; d < dk; d += 32) { dk_row[d] += ck * to_float(k_row[d]); }
        deta = dbeta[e] / s2;
    } else {
        float kdot = 0.0f;
        for (int d = lane; d < dk; d += 32) { kdot += to_float(k_row[d]) * dk_row[d]; }
        kdot = warp_reduce_sum(kdot);
        const float k_norm = kn[e];
        for (int d = lane; d < dk; d += 32) { dk_row[d] = (dk_row[d] - to_float(k_row[d]) * kdot) / k_norm; }
        deta = dbeta[e];
    }

    if (lane == 0) {
        const floatX* prow = proj + (size_t)r * P;
        // eta = sigmoid(b + b_bias)
        const float eta = sigmoidf_dev(to_float(prow[D + HV + H + hh]) + b_bias[hh]);
        const float db = deta * eta * (1.0f - eta);
        // g = -exp(A_log) softplus(a + dt_bias)
        const float u = to_float(prow[D + HV + hh]) + dt_bias[hh];
        const float da = dg[e] * -expf(A_log[hh]) * dsoftplusf_dev(u);
        floatX* dprow = dproj + (size_t)r * P;
        dprow[D + HV + hh] = from_float<floatX>(da);
        dprow[D + HV + H + hh] = from_float<floatX>(db);
        float* st = stage + (size_t)r * 3 * H;
        st[hh] = dg[e] * g[e];
        st[H + hh] = da;
        st[2 * H + hh] = db;
    }
}

// adds the three column groups of the reduced stage ([3H]: dA_log | ddt_bias | db_bias) into the gradients
__global__ void gdn_gate_grads_add_kernel(float* dA_log, float* ddt_bias, float* db_bias, const float* sums, int H) {
    const int hh = blockIdx.x * blockDim.x + threadIdx.x;
    if (hh >= H) { return; }
    dA_log[hh] += sums[hh];
    ddt_bias[hh] += sums[H + hh];
    db_bias[hh] += sums[2 * H + hh];
}

// stage [BT, 3H], the level-1 partials of its column sums, and the [3H] sums
static size_t gdn_features_backward_scratch_bytes(int BT, int H) {
    return ((size_t)BT + colsum_splits(BT) + 1) * 3 * H * sizeof(float);
}

static void gdn_features_backward(float* dqkv, floatX* dproj, float* dA_log, float* db_bias, float* ddt_bias,
                                  float* scratch, const float* dbeta, const float* dg, const floatX* qkv,
                                  const float* qn, const float* kn, const float* beta, const float* g,
                                  const floatX* proj, int ld_proj, const float* b_bias, const float* A_log,
                                  const float* dt_bias, int BT, int H, int dk, int dv, int kaczmarz,
                                  cudaStream_t stream) {
    float* stage = scratch;
    float* partials = stage + (size_t)BT * 3 * H;
    float* sums = partials + (size_t)colsum_splits(BT) * 3 * H;
    gdn_features_backward_kernel<<<ceil_div(BT * H, GDN_TOKEN_WARPS), GDN_TOKEN_WARPS * 32, 0, stream>>>(
        dqkv, dproj, stage, dbeta, dg, qkv, qn, kn, beta, g, proj, b_bias, A_log, dt_bias, BT, H, dk, dv, ld_proj,
        kaczmarz);
    cudaCheckLaunch();
    ordered_column_sum(sums, partials, stage, BT, 3 * H, 0, stream);
    gdn_gate_grads_add_kernel<<<ceil_div(H, 32), 32, 0, stream>>>(dA_log, ddt_bias, db_bias, sums, H);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// decode: one token of the recurrence per sequence (spec 2.1, 4), fp32 state:
//   Sbar = exp(g) S;  r = v - Sbar^T k;  S = Sbar + k (beta r)^T;  o = scale S^T q,  scale = dk^-1/2
// qkv [B, D] after gdn_features_forward; beta, g [B, H]; o [B, HV]; S [B, H, dk, dv].
// grid (ceil(dv / 32), H, B), block (32, GDN_DECODE_ROWS): thread (x, y) owns column j = 32 blockIdx.x + x of S
// and its rows i = y (mod GDN_DECODE_ROWS); the column sums over i are added across y in order through shared
// memory. Each S entry is read and written by one thread only.

__global__ void gdn_recurrent_step_kernel(floatX* o, float* S, const floatX* qkv, const float* beta, const float* g,
                                          int H, int dk, int dv) {
    extern __shared__ float qk[];   // q [dk], then k [dk]
    __shared__ float group_sum[GDN_DECODE_ROWS][32];
    const int hh = blockIdx.y, b = blockIdx.z;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int j = blockIdx.x * 32 + tx;
    const int D = 2 * H * dk + H * dv;
    const floatX* row = qkv + (size_t)b * D;
    float* qs = qk;
    float* ks = qk + dk;
    for (int i = ty * 32 + tx; i < dk; i += 32 * GDN_DECODE_ROWS) {
        qs[i] = to_float(row[hh * dk + i]);
        ks[i] = to_float(row[H * dk + hh * dk + i]);
    }
    __syncthreads();

    const size_t e = (size_t)b * H + hh;
    const float alpha = expf(g[e]);
    const float bt = beta[e];
    float* Sh = S + e * dk * dv;

    // r_j = v_j - alpha (S^T k)_j
    float part = 0.0f;
    if (j < dv) {
        for (int i = ty; i < dk; i += GDN_DECODE_ROWS) { part += ks[i] * Sh[(size_t)i * dv + j]; }
    }
    group_sum[ty][tx] = part;
    __syncthreads();
    float kS = 0.0f;
    for (int y = 0; y < GDN_DECODE_ROWS; y++) { kS += group_sum[y][tx]; }
    const float r = j < dv ? to_float(row[2 * H * dk + hh * dv + j]) - alpha * kS : 0.0f;
    __syncthreads();   // everyone has read group_sum before it is reused

    // S_ij = alpha S_ij + (beta k_i) r_j, and the read-out partial sum of q_i S_ij
    part = 0.0f;
    if (j < dv) {
        for (int i = ty; i < dk; i += GDN_DECODE_ROWS) {
            float* s = Sh + (size_t)i * dv + j;
            const float s_new = alpha * *s + (bt * ks[i]) * r;
            *s = s_new;
            part += qs[i] * s_new;
        }
    }
    group_sum[ty][tx] = part;
    __syncthreads();
    if (ty == 0 && j < dv) {
        float qS = 0.0f;
        for (int y = 0; y < GDN_DECODE_ROWS; y++) { qS += group_sum[y][tx]; }
        o[e * dv + j] = from_float<floatX>((1.0f / sqrtf((float)dk)) * qS);
    }
}

static void gdn_recurrent_step(floatX* o, float* S, const floatX* qkv, const float* beta, const float* g, int B, int H,
                               int dk, int dv, cudaStream_t stream) {
    const dim3 grid(ceil_div(dv, 32), H, B);
    const size_t smem = 2 * (size_t)dk * sizeof(float);
    gdn_recurrent_step_kernel<<<grid, dim3(32, GDN_DECODE_ROWS), smem, stream>>>(o, S, qkv, beta, g, H, dk, dv);
    cudaCheckLaunch();
}

#endif // TRAIN_KLA_KERNELS_GDN_CUH
