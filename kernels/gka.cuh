/*
kernels/gka.cuh: the per-token parts and the recurrent core of the gka layer (spec/gka.md): the token features
(GQA expand, l2 norms, the write gate beta, the alpha connection's alpha, the log decay; 2.3 steps 3-7) and their
backward (3.3), and the core: H_t = gamma H_{t-1} + k k^T, U_t = gamma U_{t-1} + k v^T, f_t = ||H_t||_F,
x_t = CHEB(H_t, f_t, q_hat_t) (r Chebyshev iterations, 3.1), o_t = s U_t^T (q_hat + alpha (x_t - q_hat)), with the
implicit-differentiation backward of 3.2 (one adjoint CHEB solve per token, the bp_lambda term w_t). The CPU
versions are gka_token_features, gka_core_forward, gka_core_backward and the per-token loop of gka_backward in
train_kla.c; the math is the same, line for line (sums over the state may run in another order).

The core is the first, recurrent slice of GPU gka: one CTA per (sequence, head) walks the tokens in order with the
fp32 states H [dk, dk] and U [dk, dv] in shared memory; each of the r iterations is one mat-vec with H (four
threads per row) and one __syncthreads(). The chunkwise tensor-core form of spec 5 is not here yet. The backward
recomputes each GKA_CHECKPOINT-token segment's states from the checkpoint the forward saved into a global buffer,
then walks the segment backwards (never H_{t-1} = (H_t - k k^T)/gamma, spec 3.2).

Layouts (row-major), with D = H*dk + Hkv*(dk + dv) (the conv channels, un-expanded), DE = 2*H*dk + H*dv (the core
inputs, expanded to H heads), HV = H*dv, G = H/Hkv, BT = B*T rows:
  proj [BT, ld_proj] floatX  in_proj output, column blocks q (H*dk) | k (Hkv*dk) | v (Hkv*dv) | gate (HV) | a | b | alpha
  u    [BT, D] floatX        conv + SiLU output of the first D columns of proj
  qkv  [BT, DE] floatX       core inputs q_hat | k | v: q_hat = q/(||q|| + 1e-6), k = (beta + 1e-6) k/(||k|| + 1e-6),
                             v = (beta + 1e-6) v; expanded head e reads source head e/G of k and v
  qn, kn, beta, alpha, g, f [BT, H] fp32;  x [BT, H*dk] fp32 (the CHEB solutions);  o [BT, HV] floatX
  Hck [B, H, NT, dk, dk], Uck [B, H, NT, dk, dv]  fp32, the states before each GKA_CHECKPOINT-token segment
Parameter gradients are reduced without atomics (ordered_column_sum and fixed-order loops): runs are bitwise
reproducible.
*/
#ifndef TRAIN_KLA_KERNELS_GKA_CUH
#define TRAIN_KLA_KERNELS_GKA_CUH

#include "common.cuh"
#include "column_sum.cuh"

#define GKA_TOKEN_WARPS 8        // warps per block of the per-(row, head) kernels
#define GKA_CORE_THREADS 512     // threads of a core CTA (one (sequence, head)); four per row of H
#define GKA_CHECKPOINT 64        // tokens between the saved states of the core backward's recomputation
#define GKA_L2_EPS 1e-6f         // q/k l2 norm: eps added to the norm (spec 2.1)
#define GKA_BETA_EPS 1e-6f       // added to the write gate (spec 2.3 step 5)

__host__ __device__ inline int gka_segments(int T) { return (T + GKA_CHECKPOINT - 1) / GKA_CHECKPOINT; }

// ----------------------------------------------------------------------------------------------------------
// token features (spec 2.3 steps 3-7), one warp per (row, expanded head e), source head e/G:
//   qn = ||q||, kn = ||k|| (fp32 sums of the floatX conv outputs); beta = sigmoid(b + b_bias);
//   q_hat = q/(qn + 1e-6), k = (beta + 1e-6) k/(kn + 1e-6), v = (beta + 1e-6) v;
//   alpha = sigmoid(alpha_pre + alpha_bias); g = -exp(A_log) softplus(a + dt_bias)

__global__ void gka_features_forward_kernel(floatX* qkv, float* qn, float* kn, float* beta, float* alpha, float* g,
                                            const floatX* u, const floatX* proj, int ld_proj, const float* b_bias,
                                            const float* alpha_bias, const float* A_log, const float* dt_bias, int BT,
                                            int H, int Hkv, int dk, int dv) {
    const int pair = blockIdx.x * GKA_TOKEN_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (pair >= BT * H) { return; }
    const int r = pair / H, e = pair % H, j = e / (H / Hkv);
    const int D = H * dk + Hkv * (dk + dv), DE = 2 * H * dk + H * dv;
    const size_t pe = (size_t)r * H + e;
    const floatX* uq = u + (size_t)r * D + e * dk;
    const floatX* uk = u + (size_t)r * D + H * dk + j * dk;
    const floatX* uv = u + (size_t)r * D + H * dk + Hkv * dk + j * dv;
    float qq = 0.0f, kk = 0.0f;
    for (int d = lane; d < dk; d += 32) {
        const float qd = to_float(uq[d]), kd = to_float(uk[d]);
        qq += qd * qd;
        kk += kd * kd;
    }
    qq = warp_reduce_sum(qq);
    kk = warp_reduce_sum(kk);
    const float q_norm = sqrtf(qq), k_norm = sqrtf(kk);
    const floatX* prow = proj + (size_t)r * ld_proj + D + H * dv;   // a | b | alpha
    const float bt = sigmoidf_dev(to_float(prow[H + e]) + b_bias[e]), bs = bt + GKA_BETA_EPS;
    const float qs = 1.0f / (q_norm + GKA_L2_EPS), ks = bs / (k_norm + GKA_L2_EPS);
    floatX* row = qkv + (size_t)r * DE;
    for (int d = lane; d < dk; d += 32) {
        row[e * dk + d] = from_float<floatX>(to_float(uq[d]) * qs);
        row[H * dk + e * dk + d] = from_float<floatX>(to_float(uk[d]) * ks);
    }
    for (int d = lane; d < dv; d += 32) { row[2 * H * dk + e * dv + d] = from_float<floatX>(to_float(uv[d]) * bs); }
    if (lane == 0) {
        qn[pe] = q_norm;
        kn[pe] = k_norm;
        beta[pe] = bt;
        alpha[pe] = sigmoidf_dev(to_float(prow[2 * H + e]) + alpha_bias[e]);
        g[pe] = -expf(A_log[e]) * softplusf_dev(to_float(prow[e]) + dt_bias[e]);
    }
}

static void gka_features_forward(floatX* qkv, float* qn, float* kn, float* beta, float* alpha, float* g,
                                 const floatX* u, const floatX* proj, int ld_proj, const float* b_bias,
                                 const float* alpha_bias, const float* A_log, const float* dt_bias, int BT, int H,
                                 int Hkv, int dk, int dv, cudaStream_t stream) {
    gka_features_forward_kernel<<<ceil_div(BT * H, GKA_TOKEN_WARPS), GKA_TOKEN_WARPS * 32, 0, stream>>>(
        qkv, qn, kn, beta, alpha, g, u, proj, ld_proj, b_bias, alpha_bias, A_log, dt_bias, BT, H, Hkv, dk, dv);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// token features backward (spec 3.3), one warp per (row, source head j), its G expanded heads in order (the GQA
// reduce sums their k and v gradients in head order, as the CPU's gka_reduce_row). dqkv [BT, DE] holds the core's
// gradients w.r.t. q_hat, the scaled k and the scaled v; writes du [BT, D] = dL/d(SiLU output), the a | b | alpha
// columns of dproj, and the per-row parameter-gradient terms into stage [BT, 4H]: dA_log | ddt_bias | db_bias |
// dalpha_bias.
//   q:    du_q = dq/(qn + eps) - q_hat (q_hat.dq)/qn
//   beta: dbeta = (k.dk + v.dv)/(beta + eps);  du_v = (beta + eps) dv
//   k:    du_k = (beta + eps) dk/(kn + eps) - k (k.dk)/((beta + eps) kn)      (k the scaled key)
//   gates: db = dbeta beta (1 - beta), dalpha_pre = dalpha alpha (1 - alpha), da = dg (-exp(A_log)) softplus'(.)

__global__ void gka_features_backward_kernel(float* du, floatX* dproj, int ld_proj, float* stage, const float* dqkv,
                                             const float* dalpha, const float* dg, const floatX* qkv, const float* qn,
                                             const float* kn, const float* beta, const float* alpha, const float* g,
                                             const floatX* proj, const float* A_log, const float* dt_bias, int BT,
                                             int H, int Hkv, int dk, int dv) {
    const int pair = blockIdx.x * GKA_TOKEN_WARPS + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (pair >= BT * Hkv) { return; }
    const int r = pair / Hkv, j = pair % Hkv, G = H / Hkv;
    const int D = H * dk + Hkv * (dk + dv), DE = 2 * H * dk + H * dv, HV = H * dv;
    const floatX* row = qkv + (size_t)r * DE;
    const float* drow = dqkv + (size_t)r * DE;
    float* durow = du + (size_t)r * D;
    const floatX* prow = proj + (size_t)r * ld_proj + D + HV;
    floatX* dprow = dproj + (size_t)r * ld_proj + D + HV;
    float* st = stage + (size_t)r * 4 * H;
    for (int m = 0; m < G; m++) {
        const int e = j * G + m;
        const size_t pe = (size_t)r * H + e;
        // q (every expanded head has its own query)
        const floatX* qh = row + e * dk;
        const float* dq = drow + e * dk;
        float cq = 0.0f;
        for (int d = lane; d < dk; d += 32) { cq += to_float(qh[d]) * dq[d]; }
        cq = warp_reduce_sum(cq);
        const float nq = qn[pe], iq = 1.0f / (nq + GKA_L2_EPS), cq2 = nq > 0.0f ? cq / nq : 0.0f;
        for (int d = lane; d < dk; d += 32) { durow[e * dk + d] = dq[d] * iq - to_float(qh[d]) * cq2; }
        // k and v of source head j: the G copies summed in head order
        const floatX* ks = row + H * dk + e * dk;
        const float* dks = drow + H * dk + e * dk;
        const floatX* vs = row + 2 * H * dk + e * dv;
        const float* dvs = drow + 2 * H * dk + e * dv;
        float ck = 0.0f, cv = 0.0f;
        for (int d = lane; d < dk; d += 32) { ck += to_float(ks[d]) * dks[d]; }
        for (int d = lane; d < dv; d += 32) { cv += to_float(vs[d]) * dvs[d]; }
        ck = warp_reduce_sum(ck);
        cv = warp_reduce_sum(cv);
        const float bt = beta[pe], bs = bt + GKA_BETA_EPS, dbeta = (ck + cv) / bs;
        const float nk = kn[pe], ik = 1.0f / (nk + GKA_L2_EPS), ck2 = nk > 0.0f ? ck / (bs * nk) : 0.0f;
        float* duk = durow + H * dk + j * dk;
        float* duv = durow + H * dk + Hkv * dk + j * dv;
        for (int d = lane; d < dk; d += 32) {
            const float v = bs * dks[d] * ik - to_float(ks[d]) * ck2;
            duk[d] = m == 0 ? v : duk[d] + v;
        }
        for (int d = lane; d < dv; d += 32) {
            const float v = bs * dvs[d];
            duv[d] = m == 0 ? v : duv[d] + v;
        }
        if (lane == 0) {
            const float al = alpha[pe];
            const float db = dbeta * bt * (1.0f - bt), dal = dalpha[pe] * al * (1.0f - al);
            const float da = dg[pe] * -expf(A_log[e]) * dsoftplusf_dev(to_float(prow[e]) + dt_bias[e]);
            dprow[e] = from_float<floatX>(da);
            dprow[H + e] = from_float<floatX>(db);
            dprow[2 * H + e] = from_float<floatX>(dal);
            st[e] = dg[pe] * g[pe];
            st[H + e] = da;
            st[2 * H + e] = db;
            st[3 * H + e] = dal;
        }
    }
}

// adds the reduced stage columns [4H] into the gradients
__global__ void gka_gate_grads_add_kernel(float* dA_log, float* ddt_bias, float* db_bias, float* dalpha_bias,
                                          const float* sums, int H) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= H) { return; }
    dA_log[i] += sums[i];
    ddt_bias[i] += sums[H + i];
    db_bias[i] += sums[2 * H + i];
    dalpha_bias[i] += sums[3 * H + i];
}

// stage [BT, 4H], the level-1 partials of its column sums, and the [4H] sums
static size_t gka_features_backward_scratch_bytes(int BT, int H) {
    return ((size_t)BT + colsum_splits(BT) + 1) * 4 * H * sizeof(float);
}

static void gka_features_backward(float* du, floatX* dproj, int ld_proj, float* dA_log, float* ddt_bias,
                                  float* db_bias, float* dalpha_bias, float* scratch, const float* dqkv,
                                  const float* dalpha, const float* dg, const floatX* qkv, const float* qn,
                                  const float* kn, const float* beta, const float* alpha, const float* g,
                                  const floatX* proj, const float* A_log, const float* dt_bias, int BT, int H, int Hkv,
                                  int dk, int dv, cudaStream_t stream) {
    float* stage = scratch;
    float* partials = stage + (size_t)BT * 4 * H;
    float* sums = partials + (size_t)colsum_splits(BT) * 4 * H;
    gka_features_backward_kernel<<<ceil_div(BT * Hkv, GKA_TOKEN_WARPS), GKA_TOKEN_WARPS * 32, 0, stream>>>(
        du, dproj, ld_proj, stage, dqkv, dalpha, dg, qkv, qn, kn, beta, alpha, g, proj, A_log, dt_bias, BT, H, Hkv,
        dk, dv);
    cudaCheckLaunch();
    ordered_column_sum(sums, partials, stage, BT, 4 * H, 0, stream);
    gka_gate_grads_add_kernel<<<ceil_div(H, 128), 128, 0, stream>>>(dA_log, ddt_bias, db_bias, dalpha_bias, sums, H);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// the core's CTA-level pieces. A core CTA has GKA_CORE_THREADS = 512 threads and takes dk, dv <= 128. Two thread
// maps cover a state matrix M [dk][n] in shared memory, stored with row stride n + 4:
//   rows:    thread (i = tid/4, quarter = tid%4) walks row i at columns quarter, quarter + 4, ...; its partial sums
//            meet through two shuffles. With the + 4 padding the 32 lanes of a warp (8 rows x 4 quarters) hit 32
//            banks when n is a multiple of 8.
//   columns: thread (j = tid%128, part = tid/128) walks column j at rows part, part + 4, ...; the 4 partial sums
//            meet through shared memory (consecutive lanes read consecutive addresses).
// Every loop keeps two accumulators, so that the shared-memory loads of one term overlap the FMA of the other.

__host__ __device__ inline int gka_ld(int n) { return n + 4; }

// the sum of v over the CTA, in a fixed order (bitwise reproducible); red: 32 floats of shared memory
__device__ float gka_block_sum(float v, float* red) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = warp_reduce_sum(v);
    __syncthreads();   // red may still be read by the previous call
    if (lane == 0) { red[warp] = v; }
    __syncthreads();
    float s = 0.0f;
    for (int w = 0; w < nw; w++) { s += red[w]; }
    return s;
}

// row map: sum over the columns c = quarter, quarter + 4, ... < n of row[c] * vec[c], summed over the 4 quarters
__device__ __forceinline__ float gka_row_dot(const float* row, const float* vec, int n, int quarter) {
    float s0 = 0.0f, s1 = 0.0f;
    int c = quarter;
    for (; c + 4 < n; c += 8) {
        s0 += row[c] * vec[c];
        s1 += row[c + 4] * vec[c + 4];
    }
    if (c < n) { s0 += row[c] * vec[c]; }
    float s = s0 + s1;
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    return s;
}

// column map: part (one of 4) of the sum over rows r of M[r][j] * vec[r]; ld the row stride
__device__ __forceinline__ float gka_col_dot_part(const float* M, int ld, const float* vec, int rows, int j, int part) {
    float s0 = 0.0f, s1 = 0.0f;
    int r = part;
    for (; r + 4 < rows; r += 8) {
        s0 += M[r * ld + j] * vec[r];
        s1 += M[(r + 4) * ld + j] * vec[r + 4];
    }
    if (r < rows) { s0 += M[r * ld + j] * vec[r]; }
    return s0 + s1;
}

// spec 3.1: omega_1..omega_r (omega_0 = 2, rho = 1/(1 + 2a)), in double, by thread 0 into shared memory
__device__ void gka_omegas(double* om, int r, float ridge) {
    if (threadIdx.x == 0) {
        const double rho = 1.0 / (1.0 + 2.0 * (double)ridge), rho4 = rho * rho / 4.0;
        double w = 2.0;
        for (int i = 0; i < r; i++) { w = 1.0 / (1.0 - rho4 * w); om[i] = w; }
    }
}

// spec 3.1: sol = CHEB(Hs, f, rhs) ~ (Hs + a f I)^-1 rhs (Hs symmetric, row stride gka_ld(dk)); xb [2][dk] shared
// workspace; the result is left in sol (shared, dk). x_prev = 0, x = tau rhs; r times
// x <- omega x - tau omega (Hs x + a f x - rhs) - (omega - 1) x_prev. f = 0 (all keys zero) gives 0, not 0/0.
// Each iteration is one mat-vec in the row map; the 4 threads of row i keep x_i and x_prev_i in registers.
__device__ void gka_cheb_block(float* sol, float* xb, const float* Hs, const float* rhs, float f, const double* om,
                               int r, float ridge, int dk) {
    const int i = threadIdx.x >> 2, quarter = threadIdx.x & 3, ld = gka_ld(dk);
    const bool row = i < dk;
    if (!(f > 0.0f)) {
        if (row && quarter == 0) { sol[i] = 0.0f; }
        __syncthreads();
        return;
    }
    const double tau = 2.0 / ((double)f * (1.0 + 2.0 * (double)ridge));
    const float lam = ridge * f, b = row ? rhs[i] : 0.0f;
    float x = (float)tau * b, xp = 0.0f;
    if (row && quarter == 0) { xb[i] = x; }
    __syncthreads();
    int cur = 0;
    for (int it = 0; it < r; it++) {
        const float c1 = (float)(tau * om[it]), c2 = (float)om[it], c3 = (float)(om[it] - 1.0);
        const float s = gka_row_dot(Hs + (row ? i : 0) * ld, xb + cur * dk, row ? dk : 0, quarter);
        const float xn = c2 * x - c1 * (s + lam * x - b) - c3 * xp;
        xp = x;
        x = xn;
        cur ^= 1;
        if (row && quarter == 0) { xb[cur * dk + i] = x; }
        __syncthreads();
    }
    if (row && quarter == 0) { sol[i] = x; }
    __syncthreads();
}

static void gka_core_check(size_t smem, int dk, int dv) {
    int device = 0, max_optin = 0;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaDeviceGetAttribute(&max_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (dk > 128 || dv > 128) { die("gka on the GPU: dk = %d, dv = %d; the recurrent core takes dk, dv <= 128", dk, dv); }
    if (smem > (size_t)max_optin) {
        die("gka on the GPU: dk = %d, dv = %d need %zu bytes of shared memory per block, the device has %d", dk, dv,
            smem, max_optin);
    }
}

// ----------------------------------------------------------------------------------------------------------
// the core forward (spec 3), grid B*H, block GKA_CORE_THREADS. H_io [B, H, dk, dk], U_io [B, H, dk, dv]: initial
// states in and final states out (NULL: zero start, not written). Writes o, x, f and, if Hck, the segment-start
// states.

static size_t gka_core_forward_smem(int dk, int dv, int iters) {
    return (size_t)iters * sizeof(double)
           + ((size_t)dk * gka_ld(dk) + (size_t)dk * gka_ld(dv) + 5 * (size_t)dk + dv + 4 * 128 + 32) * sizeof(float);
}

__global__ void __launch_bounds__(GKA_CORE_THREADS)
gka_core_forward_kernel(floatX* o, float* x_out, float* f_out, float* Hck, float* Uck, float* H_io, float* U_io,
                        const floatX* qkv, const float* alpha, const float* g, int T, int H, int dk, int dv, int iters,
                        float ridge, float scale) {
    extern __shared__ double gka_smem_fwd[];
    double* om = gka_smem_fwd;
    float* Hs = (float*)(om + iters);      // [dk][dk + 4]
    float* Us = Hs + dk * gka_ld(dk);      // [dk][dv + 4]
    float* q = Us + dk * gka_ld(dv);
    float* k = q + dk;
    float* xb = k + dk;                    // [2][dk]
    float* qt = xb + 2 * dk;
    float* v = qt + dk;
    float* col = v + dv;                   // [4][128] column-map partial sums
    float* red = col + 4 * 128;
    const int bh = blockIdx.x, b = bh / H, hh = bh % H, tid = threadIdx.x, nth = blockDim.x;
    const int i = tid >> 2, quarter = tid & 3, j = tid & 127, part = tid >> 7;
    const int DE = 2 * H * dk + H * dv, NT = gka_segments(T), ldh = gka_ld(dk), ldu = gka_ld(dv);
    const size_t dkdk = (size_t)dk * dk, dkdv = (size_t)dk * dv;
    gka_omegas(om, iters, ridge);
    for (int idx = tid; idx < dk * dk; idx += nth) {
        Hs[(idx / dk) * ldh + idx % dk] = H_io ? H_io[bh * dkdk + idx] : 0.0f;
    }
    for (int idx = tid; idx < dk * dv; idx += nth) {
        Us[(idx / dv) * ldu + idx % dv] = U_io ? U_io[bh * dkdv + idx] : 0.0f;
    }
    __syncthreads();
    for (int t = 0; t < T; t++) {
        const size_t r = (size_t)b * T + t, e = r * H + hh;
        if (Hck && t % GKA_CHECKPOINT == 0) {
            const size_t n = (size_t)bh * NT + t / GKA_CHECKPOINT;
            for (int idx = tid; idx < dk * dk; idx += nth) { Hck[n * dkdk + idx] = Hs[(idx / dk) * ldh + idx % dk]; }
            for (int idx = tid; idx < dk * dv; idx += nth) { Uck[n * dkdv + idx] = Us[(idx / dv) * ldu + idx % dv]; }
        }
        const floatX* row = qkv + r * DE;
        if (tid < dk) {
            q[tid] = to_float(row[hh * dk + tid]);
            k[tid] = to_float(row[H * dk + hh * dk + tid]);
        }
        if (tid < dv) { v[tid] = to_float(row[2 * H * dk + hh * dv + tid]); }
        const float gam = expf(g[e]);
        __syncthreads();
        // H <- gamma H + k k^T, U <- gamma U + k v^T (row map), f = ||H||_F
        float ff = 0.0f;
        if (i < dk) {
            const float ki = k[i];
            float* hrow = Hs + i * ldh;
            for (int c = quarter; c < dk; c += 4) {
                const float h = gam * hrow[c] + ki * k[c];
                hrow[c] = h;
                ff += h * h;
            }
            float* urow = Us + i * ldu;
            for (int c = quarter; c < dv; c += 4) { urow[c] = gam * urow[c] + ki * v[c]; }
        }
        const float f = sqrtf(gka_block_sum(ff, red));   // its syncs also publish H and U
        // x = CHEB(H, f, q_hat); qt = q_hat + alpha (x - q_hat)
        gka_cheb_block(qt, xb, Hs, q, f, om, iters, ridge, dk);
        const float al = alpha[e];
        if (tid < dk) {
            const float xd = qt[tid];
            x_out[e * dk + tid] = xd;
            qt[tid] = q[tid] + al * (xd - q[tid]);
        }
        if (tid == 0) { f_out[e] = f; }
        __syncthreads();
        // o = s U^T qt (column map)
        col[part * 128 + j] = j < dv ? gka_col_dot_part(Us, ldu, qt, dk, j, part) : 0.0f;
        __syncthreads();
        if (tid < dv) {
            o[r * H * dv + hh * dv + tid] = from_float<floatX>(scale * (col[tid] + col[128 + tid] + col[256 + tid]
                                                                        + col[384 + tid]));
        }
    }
    if (H_io) {
        for (int idx = tid; idx < dk * dk; idx += nth) { H_io[bh * dkdk + idx] = Hs[(idx / dk) * ldh + idx % dk]; }
        for (int idx = tid; idx < dk * dv; idx += nth) { U_io[bh * dkdv + idx] = Us[(idx / dv) * ldu + idx % dv]; }
    }
}

static void gka_core_forward(floatX* o, float* x, float* f, float* Hck, float* Uck, float* H_io, float* U_io,
                             const floatX* qkv, const float* alpha, const float* g, int B, int T, int H, int dk, int dv,
                             int iters, float ridge, cudaStream_t stream) {
    const size_t smem = gka_core_forward_smem(dk, dv, iters);
    gka_core_check(smem, dk, dv);
    cudaCheck(cudaFuncSetAttribute(gka_core_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    gka_core_forward_kernel<<<B * H, GKA_CORE_THREADS, smem, stream>>>(o, x, f, Hck, Uck, H_io, U_io, qkv, alpha, g, T,
                                                                       H, dk, dv, iters, ridge,
                                                                       1.0f / sqrtf((float)dk));
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// the core backward (spec 3.2), grid B*H, block GKA_CORE_THREADS, final-state gradients 0. Per token, backwards:
//   dqt = s U_t dO;  DU += s qt dO^T;  dalpha = dqt.(x - q_hat);  z = CHEB(H_t, f_t, alpha dqt)
//   dq_hat = (1 - alpha) dqt + z;  w = 2a (x.z)/f;  DH -= z x^T + (w/2) H_t
//   dk = (DH + DH^T) k + DU v;  dv = DU^T k;  dg = gamma (<DH, H_{t-1}> + <DU, U_{t-1}>);  DH, DU <- gamma DH, gamma DU
// (the last scaling is applied lazily, by the next token of the walk). DH, DU and H_t live in shared memory; the
// segment's recomputed states H_t, U_t stream through seg, a global buffer of GKA_CHECKPOINT states per CTA.

static size_t gka_core_backward_scratch_floats(int B, int H, int dk, int dv) {
    return (size_t)B * H * GKA_CHECKPOINT * ((size_t)dk * dk + (size_t)dk * dv);
}

static size_t gka_core_backward_smem(int dk, int dv, int iters) {
    return (size_t)iters * sizeof(double) + (2 * (size_t)dk * gka_ld(dk) + (size_t)dk * gka_ld(dv) + 10 * (size_t)dk
                                             + 2 * (size_t)dv + 8 * 128 + 32) * sizeof(float);
}

__global__ void __launch_bounds__(GKA_CORE_THREADS)
gka_core_backward_kernel(float* dqkv, float* dalpha, float* dg, float* seg, const floatX* dO, const float* Hck,
                         const float* Uck, const floatX* qkv, const float* alpha, const float* g, const float* x,
                         const float* f, int T, int H, int dk, int dv, int iters, float ridge, float scale) {
    extern __shared__ double gka_smem_bwd[];
    double* om = gka_smem_bwd;
    float* Hs = (float*)(om + iters);      // [dk][dk + 4] H_t
    float* DH = Hs + dk * gka_ld(dk);      // [dk][dk + 4]
    float* DU = DH + dk * gka_ld(dk);      // [dk][dv + 4]
    float* q = DU + dk * gka_ld(dv);
    float* k = q + dk;
    float* xt = k + dk;
    float* qt = xt + dk;
    float* dqt = qt + dk;
    float* rhs = dqt + dk;
    float* z = rhs + dk;
    float* rowsum = z + dk;                // (DH k + DU v), the row map's part of dk
    float* xb = rowsum + dk;               // [2][dk]
    float* v = xb + 2 * dk;
    float* dOt = v + dv;
    float* colH = dOt + dv;                // [4][128] column-map partial sums of DH^T k
    float* colU = colH + 4 * 128;          // [4][128] ... of DU^T k
    float* red = colU + 4 * 128;
    const int bh = blockIdx.x, b = bh / H, hh = bh % H, tid = threadIdx.x, nth = blockDim.x;
    const int lane = tid % 32, warp = tid / 32, nw = nth / 32;
    const int i = tid >> 2, quarter = tid & 3, j = tid & 127, part = tid >> 7;
    const int DE = 2 * H * dk + H * dv, NT = gka_segments(T), ldh = gka_ld(dk), ldu = gka_ld(dv);
    const size_t dkdk = (size_t)dk * dk, dkdv = (size_t)dk * dv;
    float* segH = seg + (size_t)bh * GKA_CHECKPOINT * (dkdk + dkdv);   // [CK][dk][dk] H_t of the segment's tokens
    float* segU = segH + (size_t)GKA_CHECKPOINT * dkdk;                // [CK][dk][dv]
    gka_omegas(om, iters, ridge);
    for (int idx = tid; idx < dk * ldh; idx += nth) { DH[idx] = 0.0f; }
    for (int idx = tid; idx < dk * ldu; idx += nth) { DU[idx] = 0.0f; }
    float gp = 1.0f;   // the pending decay of DH, DU (gamma of the token after this one)
    for (int n = NT - 1; n >= 0; n--) {
        const int t0 = n * GKA_CHECKPOINT, L = min(GKA_CHECKPOINT, T - t0);
        const float* Hc = Hck + ((size_t)bh * NT + n) * dkdk;
        const float* Uc = Uck + ((size_t)bh * NT + n) * dkdv;
        // recompute the segment's states from its checkpoint
        for (int s = 0; s < L; s++) {
            const size_t r = (size_t)b * T + t0 + s;
            __syncthreads();   // k, v of the previous token are consumed
            if (tid < dk) { k[tid] = to_float(qkv[r * DE + H * dk + hh * dk + tid]); }
            if (tid < dv) { v[tid] = to_float(qkv[r * DE + 2 * H * dk + hh * dv + tid]); }
            __syncthreads();
            const float gam = expf(g[r * H + hh]);
            const float* Hp = s == 0 ? Hc : segH + (size_t)(s - 1) * dkdk;
            const float* Up = s == 0 ? Uc : segU + (size_t)(s - 1) * dkdv;
            float* Hn = segH + (size_t)s * dkdk;
            float* Un = segU + (size_t)s * dkdv;
            for (int idx = tid; idx < dk * dk; idx += nth) { Hn[idx] = gam * Hp[idx] + k[idx / dk] * k[idx % dk]; }
            for (int idx = tid; idx < dk * dv; idx += nth) { Un[idx] = gam * Up[idx] + k[idx / dv] * v[idx % dv]; }
        }
        __syncthreads();   // the segment's states are visible to the whole CTA
        for (int s = L - 1; s >= 0; s--) {
            const size_t r = (size_t)b * T + t0 + s, e = r * H + hh;
            const float* Ht = segH + (size_t)s * dkdk;
            const float* Ut = segU + (size_t)s * dkdv;
            const float* Hp = s == 0 ? Hc : segH + (size_t)(s - 1) * dkdk;
            const float* Up = s == 0 ? Uc : segU + (size_t)(s - 1) * dkdv;
            const floatX* row = qkv + r * DE;
            const float al = alpha[e], ft = f[e], gam = expf(g[e]);
            if (tid < dk) {
                q[tid] = to_float(row[hh * dk + tid]);
                k[tid] = to_float(row[H * dk + hh * dk + tid]);
                xt[tid] = x[e * dk + tid];
                qt[tid] = q[tid] + al * (xt[tid] - q[tid]);
            }
            if (tid < dv) {
                v[tid] = to_float(row[2 * H * dk + hh * dv + tid]);
                dOt[tid] = to_float(dO[r * H * dv + hh * dv + tid]);
            }
            for (int idx = tid; idx < dk * dk; idx += nth) { Hs[(idx / dk) * ldh + idx % dk] = Ht[idx]; }
            __syncthreads();
            // dqt = s U_t dO (warp per row of U_t, lanes along dv: coalesced)
            for (int i2 = warp; i2 < dk; i2 += nw) {
                float acc = 0.0f;
                for (int c = lane; c < dv; c += 32) { acc += Ut[(size_t)i2 * dv + c] * dOt[c]; }
                acc = warp_reduce_sum(acc);
                if (lane == 0) {
                    dqt[i2] = scale * acc;
                    rhs[i2] = al * dqt[i2];
                }
            }
            __syncthreads();
            const float da = gka_block_sum(tid < dk ? dqt[tid] * (xt[tid] - q[tid]) : 0.0f, red);
            // z = CHEB(H_t, f_t, alpha dqt); dq_hat = (1 - alpha) dqt + z; w = 2a (x.z)/f
            gka_cheb_block(z, xb, Hs, rhs, ft, om, iters, ridge, dk);
            if (tid < dk) { dqkv[r * DE + hh * dk + tid] = (1.0f - al) * dqt[tid] + z[tid]; }
            const float xz = gka_block_sum(tid < dk ? xt[tid] * z[tid] : 0.0f, red);
            const float hw = ft > 0.0f ? 0.5f * (2.0f * ridge * xz / ft) : 0.0f;
            // DH <- gp DH - (z x^T + (w/2) H_t), DU <- gp DU + s qt dO^T, and the sums of dg (element map:
            // consecutive threads read consecutive addresses of H_{t-1}, U_{t-1})
            float pg = 0.0f;
            for (int idx = tid; idx < dk * dk; idx += nth) {
                const int i2 = idx / dk, c = idx % dk;
                float* dh = DH + i2 * ldh + c;
                *dh = gp * *dh - (z[i2] * xt[c] + hw * Hs[i2 * ldh + c]);
                pg += *dh * Hp[idx];
            }
            for (int idx = tid; idx < dk * dv; idx += nth) {
                const int i2 = idx / dv, c = idx % dv;
                float* du = DU + i2 * ldu + c;
                *du = gp * *du + scale * qt[i2] * dOt[c];
                pg += *du * Up[idx];
            }
            const float dgs = gka_block_sum(pg, red);   // its syncs also publish DH and DU
            // dk = DH k + DU v (row map) + DH^T k (column map); dv = DU^T k (column map)
            {
                const float sr = gka_row_dot(DH + (i < dk ? i : 0) * ldh, k, i < dk ? dk : 0, quarter)
                               + gka_row_dot(DU + (i < dk ? i : 0) * ldu, v, i < dk ? dv : 0, quarter);
                if (i < dk && quarter == 0) { rowsum[i] = sr; }
                colH[part * 128 + j] = j < dk ? gka_col_dot_part(DH, ldh, k, dk, j, part) : 0.0f;
                colU[part * 128 + j] = j < dv ? gka_col_dot_part(DU, ldu, k, dk, j, part) : 0.0f;
            }
            __syncthreads();
            if (tid < dk) {
                dqkv[r * DE + H * dk + hh * dk + tid] = rowsum[tid] + (colH[tid] + colH[128 + tid] + colH[256 + tid]
                                                                       + colH[384 + tid]);
            }
            if (tid < dv) {
                dqkv[r * DE + 2 * H * dk + hh * dv + tid] = colU[tid] + colU[128 + tid] + colU[256 + tid]
                                                            + colU[384 + tid];
            }
            if (tid == 0) {
                dalpha[e] = da;
                dg[e] = gam * dgs;
            }
            gp = gam;
        }
    }
}

static void gka_core_backward(float* dqkv, float* dalpha, float* dg, float* scratch, const floatX* dO,
                              const float* Hck, const float* Uck, const floatX* qkv, const float* alpha, const float* g,
                              const float* x, const float* f, int B, int T, int H, int dk, int dv, int iters,
                              float ridge, cudaStream_t stream) {
    const size_t smem = gka_core_backward_smem(dk, dv, iters);
    gka_core_check(smem, dk, dv);
    cudaCheck(cudaFuncSetAttribute(gka_core_backward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    gka_core_backward_kernel<<<B * H, GKA_CORE_THREADS, smem, stream>>>(dqkv, dalpha, dg, scratch, dO, Hck, Uck, qkv,
                                                                        alpha, g, x, f, T, H, dk, dv, iters, ridge,
                                                                        1.0f / sqrtf((float)dk));
    cudaCheckLaunch();
}

#endif // TRAIN_KLA_KERNELS_GKA_CUH
