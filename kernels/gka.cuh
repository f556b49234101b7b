/*
kernels/gka.cuh: the per-token parts and the core of the gka layer (spec/gka.md): the token features
(GQA expand, l2 norms, the write gate beta, the alpha connection's alpha, the log decay; 2.3 steps 3-7) and their
backward (3.3), and the core: H_t = gamma H_{t-1} + k k^T, U_t = gamma U_{t-1} + k v^T, f_t = ||H_t||_F,
x_t = CHEB(H_t, f_t, q_hat_t) (r Chebyshev iterations, 3.1), o_t = s U_t^T (q_hat + alpha (x_t - q_hat)), with the
implicit-differentiation backward of 3.2 (one adjoint CHEB solve per token, the bp_lambda term w_t). The CPU
versions are gka_token_features, gka_core_forward, gka_core_backward and the per-token loop of gka_backward in
train_kla.c; the math is the same, line for line (sums over the state may run in another order).

The core comes in two forms:
  - the recurrence (gka_recurrent_forward, gka_core_forward_kernel, gka_core_backward_kernel): one CTA per
    (sequence, head) walks the tokens in order with the fp32 states H [dk, dk] and U [dk, dv] in shared memory;
    each of the r iterations is one mat-vec with H (four threads per row) and one __syncthreads(). Decode runs its
    forward (one token); its backward recomputes each GKA_CHECKPOINT-token segment's states from the checkpoint
    the forward saved into a global buffer, then walks the segment backwards (never H_{t-1} = (H_t - k k^T)/gamma,
    spec 3.2). It is the baseline of dev/cuda/gka_core.cu (version 1; versions 2 and 3 keep its backward) and of
    dev/emu's checks of the chunked backward.
  - the chunkwise form of spec 5 (gka_core_forward, gka_core_backward, from "the chunkwise core" below), which
    the trainer runs: the chunk states by a scan over the chunks, the solves of each chunk's 64 tokens at once,
    the readout, and the backward's three passes on the chunks (GKA_CHUNKED_BACKWARD). Its tile products are
    chosen by GkaProducts: the fp32 build's are 3xTF32 on tensor cores from shared-memory tiles
    (GKA_PRODUCTS_TF32); the bf16 build's are bf16 tensor-core products with fp32 accumulation
    (GKA_PRODUCTS_MMA_STATES: the solves on wgmma, sm_90a, the rest on mma.sync register tiles), with the
    operands the solve amplifies in two bf16 pieces (hi + lo; the solve kernel's comment has the error budget).

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
#include "chunk_tiles.cuh"
#include <type_traits>
#include "mma.cuh"

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

// spec 3.1: omega_1..omega_r (omega_0 = 2, rho = 1/(1 + 2a)), in double, by one thread into shared memory
__device__ void gka_omegas(double* om, int r, float ridge, int thread = 0) {
    if (threadIdx.x == thread) {
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
    if (dk > 128 || dv > 128 || dk % 8 != 0 || dv % 8 != 0) {   // the chunk kernels' 16-byte tile loads want the 8
        die("gka on the GPU: dk = %d, dv = %d; the recurrent core takes dk, dv <= 128, multiples of 8", dk, dv);
    }
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

static void gka_recurrent_forward(floatX* o, float* x, float* f, float* Hck, float* Uck, float* H_io, float* U_io,
                                  const floatX* qkv, const float* alpha, const float* g, int B, int T, int H, int dk,
                                  int dv, int iters, float ridge, cudaStream_t stream) {
    const size_t smem = gka_core_forward_smem(dk, dv, iters);
    gka_core_check(smem, dk, dv);
    cudaCheck(cudaFuncSetAttribute(gka_core_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    gka_core_forward_kernel<<<B * H, GKA_CORE_THREADS, smem, stream>>>(o, x, f, Hck, Uck, H_io, U_io, qkv, alpha, g, T,
                                                                       H, dk, dv, iters, ridge,
                                                                       1.0f / sqrtf((float)dk));
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// the chunkwise core (spec 5). Chunks of GKA_CHECKPOINT = BT = 64 tokens, so that the chunk states H0(n), U0(n)
// of spec 5.1(a) are the checkpoints the backward's recurrent part starts its segments from. Per (b, head), in
// chunk n with local index c, gl the chunk-local inclusive cumsum of g (every exponent below is <= 0):
//   zeta_c = exp(gl_c),  e_c = exp(gl_BT - gl_c),  M[c][j] = exp(gl_c - gl_j) for j <= c, else 0
//   H_t y_t (all rows at once)  = diag(zeta) Y H0 + ((Y K^T) (.) M) K                      spec 5.1(c)
//   f_c^2 = zeta_c^2 ||H0||^2 + 2 zeta_c sum_j M[c][j] k_j^T H0 k_j + sum_ij M[c][i] M[c][j] (k_i.k_j)^2   5.1(b)
//   o = s [diag(zeta) Qt U0 + ((Qt K^T) (.) M) V],  Qt = Q_hat + diag(alpha) (X - Q_hat)   5.1(e, f)
//   dQt = s [diag(zeta) dO U0^T + ((dO V^T) (.) M) K]                                       5.2 pass 1
// The CUDA-core kernels that follow multiply their tiles in fp32 (cta_mm of kernels/chunk_tiles.cuh, fixed
// summation order; GKA_PRODUCTS_FP32, dev/emu's reference) or on tensor cores in 3xTF32 (gka_mm with TC:
// cta_mm_tf32, fp32's accuracy; GKA_PRODUCTS_TF32, the fp32 trainer's): the solve's 30 iterations amplify operand
// rounding by up to the condition bound 51 (spec 8). The bf16 trainer's register-tile and wgmma kernels further
// down keep that accuracy with two bf16 pieces per amplified operand. Tiles are padded to multiples of 16 with
// zeros (dk, dv any size up to 128) and have row strides of the padded size + 4.

#define GKA_CHUNK_THREADS 512   // threads of the per-chunk kernels
#define GKA_STATE_COLS 32       // state columns per CTA of the state kernel
#define GKA_STATE_THREADS 256

__host__ __device__ inline int gka_pad(int n) { return (n + 15) / 16 * 16; }
__host__ __device__ inline int gka_lds(int n) { return gka_pad(n) + 4; }
__host__ __device__ inline int gka_chunks(int T) { return gka_segments(T); }

// a chunk's start state H0 as the solves read it: Hck (fp32; the CUDA-core, 3xTF32 and register-tile solves), or the
// wgmma solve's tiles, gka_h0_tiles_kernel's bf16 pieces, with ||H0||_F^2 per chunk in sq
struct GkaH0 {
    const float* Hck;
    const __nv_bfloat16* tiles;
    const float* sq;
};

// the per-chunk kernels' element-by-element loads from global memory keep GKA_LOAD_BATCH of each thread's loads in
// flight (cta_batched, tile_set; ncu, H200: the solve's loads of H0 and K one by one were 9% of its warps' stalls,
// one CTA per SM leaving nothing to hide them)
#define GKA_LOAD_BATCH 8

// per-chunk decay factors in shared memory: gl (the chunk-local inclusive cumsum of g, 0 past the sequence's end)
// and zeta = exp(gl). The chunk's g are fetched by one thread each (staged in zeta) and summed in order by one
// thread, which reads them 16 at a time before it sums and stores them: a single thread fetching them one by one had
// to wait for each load in turn, its stores to shared memory through generic pointers keeping the compiler from
// hoisting the next load. Block of at least BT threads.
#define GKA_DECAY_BATCH 16
__device__ void gka_chunk_decays(float* gl, float* zeta, const float* g, size_t e0, int H, int L) {
    const int tid = threadIdx.x;
    if (tid < GKA_CHECKPOINT) { zeta[tid] = tid < L ? g[e0 + (size_t)tid * H] : 0.0f; }
    __syncthreads();
    if (tid == 0) {
        float acc = 0.0f;
        for (int c0 = 0; c0 < GKA_CHECKPOINT; c0 += GKA_DECAY_BATCH) {
            float v[GKA_DECAY_BATCH];
            #pragma unroll
            for (int u = 0; u < GKA_DECAY_BATCH; u++) { v[u] = zeta[c0 + u]; }
            #pragma unroll
            for (int u = 0; u < GKA_DECAY_BATCH; u++) {
                acc += v[u];
                gl[c0 + u] = acc;
            }
        }
    }
    __syncthreads();
    if (tid < GKA_CHECKPOINT) { zeta[tid] = expf(gl[tid]); }
    __syncthreads();
}

// S [BT][lds] (fp32) <- S (.) M (M of gl; 0 above the diagonal); rows of Y [BT][ldy] scaled by zeta
__device__ void gka_mask_scale(float* S, int lds, float* Y, int ldy, int ny, const float* gl, const float* zeta) {
    const int BT = GKA_CHECKPOINT;
    for (int idx = threadIdx.x; idx < BT * BT; idx += blockDim.x) {
        const int c = idx / BT, j = idx % BT;
        S[c * lds + j] = j <= c ? S[c * lds + j] * expf(gl[c] - gl[j]) : 0.0f;
    }
    for (int idx = threadIdx.x; idx < BT * ny; idx += blockDim.x) {
        const int c = idx / ny, j = idx % ny;
        Y[c * ldy + j] *= zeta[c];
    }
    __syncthreads();
}

// rows [t0, t0 + BT) of a (B*T, ld) matrix of one head (columns col0 .. col0 + n), as fp32 into a [BT][lds] tile,
// zero past the sequence's end (L rows) and in the padding columns (n .. pad(n))
template <typename Tg>
__device__ void gka_load_rows(float* s, int lds, const Tg* m, size_t ld, size_t r0, int col0, int n, int L) {
    tile_set<GKA_LOAD_BATCH>(s, lds, GKA_CHECKPOINT, gka_pad(n), [&](int c, int j) {
        return c < L && j < n ? to_float(m[(r0 + c) * ld + col0 + j]) : 0.0f;
    });
}

// Qt = q_hat + alpha (x - q_hat) at row c (token-head row e0 + c H), column j of the chunk starting at row r0; 0
// past L rows and dk columns. gka_load_qt: the chunk's rows into a [BT][ld] tile (up to pad(dk) columns), no barrier
__device__ __forceinline__ float gka_qt(const floatX* qkv, const float* alpha, const float* x, size_t r0, size_t e0,
                                        int c, int j, int H, int hh, int dk, int DE, int L) {
    if (c >= L || j >= dk) { return 0.0f; }
    const size_t e = e0 + (size_t)c * H;
    const float q = to_float(qkv[(r0 + c) * DE + hh * dk + j]);
    return q + alpha[e] * (x[e * dk + j] - q);
}
__device__ void gka_load_qt(float* Qs, int ld, const floatX* qkv, const float* alpha, const float* x, size_t r0,
                            size_t e0, int H, int hh, int dk, int DE, int L) {
    tile_set<GKA_LOAD_BATCH>(Qs, ld, GKA_CHECKPOINT, gka_pad(dk), [&](int c, int j) {
        return gka_qt(qkv, alpha, x, r0, e0, c, j, H, hh, dk, DE, L);
    });
}

// a [rows][cols] fp32 state (global, row-major) into a padded [pad(rows)][lds] tile
__device__ void gka_load_state(float* s, int lds, const float* m, int rows, int cols) {
    tile_set<GKA_LOAD_BATCH>(s, lds, gka_pad(rows), gka_pad(cols), [&](int i, int j) {
        return i < rows && j < cols ? m[(size_t)i * cols + j] : 0.0f;
    });
}

// ---- forward 1: the chunk states (spec 5.1(a)): Hck/Uck[bh, n] = the states before chunk n, with H_0 = U_0 = 0 and
// H <- zeta_BT H + K^T diag(e) K, U <- zeta_BT U + K^T diag(e) V over the chunks. A linear recurrence whose
// coefficients do not depend on the states, so it runs in two steps, both parallel beyond B x H: every chunk's term
// at once (gka_chunk_state_terms_kernel, into the slot of the state after it), then the recurrence element by element
// over the chunks (gka_state_scan_kernel). Each element is computed as the sequential pass over the chunks computed it
// (the same 64 terms in token order, then zeta_BT S + term): the same results to the last bit, with NT - 1 chunks'
// work in parallel instead of one after another (ncu, H200, B=16 T=2048: 1.73 ms sequentially). The bf16 build makes
// the terms of both passes on tensor cores instead, inside one walk over the chunks that also runs the recurrence
// (gka_chunk_states_mma_kernel, gka_chunk_adjoints_mma_kernel).

#define GKA_STATE_LDR 132                    // row stride of the [BT][128] row operand (16-byte rows)
#define GKA_STATE_LDC (GKA_STATE_COLS + 4)   // row stride of the [BT][32] column operand
static_assert(GKA_STATE_THREADS == (128 / 4) * (GKA_STATE_COLS / 4), "a state CTA's threads tile 128 x 32 by 4 x 4");

// the thread's 4 x 4 block of rows 4 ri .. and columns 4 ci .. of sum_c R[c][i] Src[c][j], c = 0 .. BT-1 in order
__device__ __forceinline__ void gka_state_block(float acc[4][4], const float* R, const float* Src, int ri, int ci) {
    #pragma unroll
    for (int a = 0; a < 4; a++) { acc[a][0] = acc[a][1] = acc[a][2] = acc[a][3] = 0.0f; }
    #pragma unroll 4
    for (int c = 0; c < GKA_CHECKPOINT; c++) {
        const float4 r = *reinterpret_cast<const float4*>(R + c * GKA_STATE_LDR + 4 * ri);
        const float4 v = *reinterpret_cast<const float4*>(Src + c * GKA_STATE_LDC + 4 * ci);
        const float rr[4] = {r.x, r.y, r.z, r.w}, vv[4] = {v.x, v.y, v.z, v.w};
        #pragma unroll
        for (int a = 0; a < 4; a++) {
            #pragma unroll
            for (int q = 0; q < 4; q++) { acc[a][q] += rr[a] * vv[q]; }
        }
    }
}

// chunk n's term K^T diag(e) K | K^T diag(e) V (n < NT - 1: the last chunk's is not needed) into Hck/Uck[bh, n + 1].
// Grid (1, NT - 1, B*H), block GKA_STATE_THREADS: the row operand diag(e) K loaded once, then the concatenated [H | U]
// state GKA_STATE_COLS columns at a time, each thread a 4 x 4 block of the CTA's 128 x 32 part (gka_state_block).
// (A CTA per column block, each loading the row operand: 0.67 ms, H200, B=16 T=2048.)
__global__ void __launch_bounds__(GKA_STATE_THREADS)
gka_chunk_state_terms_kernel(float* Hck, float* Uck, const floatX* qkv, const float* g, int T, int H, int dk, int dv) {
    __shared__ __align__(16) float Ks[GKA_CHECKPOINT * GKA_STATE_LDR];
    __shared__ __align__(16) float Src[GKA_CHECKPOINT * GKA_STATE_LDC];
    __shared__ float e[GKA_CHECKPOINT + 1];
    const int n = blockIdx.y, bh = blockIdx.z, b = bh / H, hh = bh % H, tid = threadIdx.x;
    const int ri = tid / (GKA_STATE_COLS / 4), ci = tid % (GKA_STATE_COLS / 4);   // rows 4 ri .., columns 4 ci ..
    const int DE = 2 * H * dk + H * dv, NT = gka_chunks(T);
    const size_t dkdk = (size_t)dk * dk, dkdv = (size_t)dk * dv;
    const size_t r0 = (size_t)b * T + (size_t)n * GKA_CHECKPOINT;   // a full chunk: n < NT - 1
    // e_c = exp(gl_BT - gl_c): the chunk's g fetched by one thread each, summed in order by one (gka_chunk_decays)
    if (tid < GKA_CHECKPOINT) { e[tid] = g[(r0 + tid) * H + hh]; }
    __syncthreads();
    if (tid == 0) {
        float acc = 0.0f;
        for (int c = 0; c < GKA_CHECKPOINT; c++) { acc += e[c]; e[c] = acc; }
        e[GKA_CHECKPOINT] = acc;
    }
    __syncthreads();
    if (tid < GKA_CHECKPOINT) { e[tid] = expf(e[GKA_CHECKPOINT] - e[tid]); }
    __syncthreads();
    // the row operand diag(e) K, then per block the column operand: the block's columns of [K | V], those of K (kc, a
    // multiple of 8 as dk is) and then those of V from its column vc0
    const floatX* rows = qkv + r0 * DE;
    tile_load<4>(make_tile_load(Ks, GKA_STATE_LDR, GKA_CHECKPOINT, 128, rows + H * dk + hh * dk, (size_t)DE,
                                GKA_CHECKPOINT, dk, e));
    for (int cb = 0; cb < dk + dv; cb += GKA_STATE_COLS) {
        const int kc = min(GKA_STATE_COLS, max(0, dk - cb)), vc0 = cb + kc - dk;
        tile_load<1>(make_tile_load(Src, GKA_STATE_LDC, GKA_CHECKPOINT, kc, rows + H * dk + hh * dk + cb, (size_t)DE,
                                    GKA_CHECKPOINT, kc),
                     make_tile_load(Src + kc, GKA_STATE_LDC, GKA_CHECKPOINT, GKA_STATE_COLS - kc,
                                    rows + 2 * H * dk + hh * dv + vc0, (size_t)DE, GKA_CHECKPOINT, dv - vc0));
        float acc[4][4];
        gka_state_block(acc, Ks, Src, ri, ci);
        __syncthreads();   // Src read by every thread before the next block's
        const int col0 = cb + 4 * ci;   // this thread's first column of [H | U]
        for (int a = 0; a < 4; a++) {
            const int i = 4 * ri + a;
            for (int q = 0; q < 4 && i < dk; q++) {
                const int col = col0 + q;
                if (col < dk) {
                    Hck[((size_t)bh * NT + n + 1) * dkdk + (size_t)i * dk + col] = acc[a][q];
                } else if (col < dk + dv) {
                    Uck[((size_t)bh * NT + n + 1) * dkdv + (size_t)i * dv + col - dk] = acc[a][q];
                }
            }
        }
    }
}

// the recurrence over the chunks of per-chunk states (count floats each, NT per b*H, slots [bh][n][count]) whose slots
// hold the chunks' terms: forward (the chunk states), slot 0 = 0 and slot n + 1 = zeta_BT(n) slot n + slot n + 1 for
// n = 0 .. NT-2; reverse (the backward's adjoint states), slot NT - 1 = 0 and slot n - 1 = zeta_BT(n) slot n +
// slot n - 1 for n = NT-1 .. 1. zeta_BT(n) = exp(sum of chunk n's log decays in token order), as the per-chunk
// kernels compute it. Grid (ceil(count / GKA_SCAN_THREADS), B*H), a thread per element; the chunks' decays
// GKA_SCAN_THREADS at a time in shared memory, each summed by one thread.
#define GKA_SCAN_THREADS 256
__global__ void __launch_bounds__(GKA_SCAN_THREADS)
gka_state_scan_kernel(float* slots, int count, const float* g, int T, int H, int reverse) {
    __shared__ float zeta[GKA_SCAN_THREADS];
    const int bh = blockIdx.y, b = bh / H, hh = bh % H, tid = threadIdx.x, NT = gka_chunks(T);
    const int i = blockIdx.x * GKA_SCAN_THREADS + tid;
    float* s = slots + (size_t)bh * NT * count + i;
    float acc = 0.0f;   // the state after the chunks so far
    if (i < count) { s[(size_t)(reverse ? NT - 1 : 0) * count] = 0.0f; }
    for (int k0 = 1; k0 < NT; k0 += GKA_SCAN_THREADS) {   // the k-th step adds chunk n = k - 1 (reverse: NT - k)
        __syncthreads();   // the previous batch's decays are consumed
        const int k = k0 + tid;
        if (k < NT) {
            const int n = reverse ? NT - k : k - 1, L = min(GKA_CHECKPOINT, T - n * GKA_CHECKPOINT);
            float gs = 0.0f;
            for (int c = 0; c < L; c++) { gs += g[((size_t)b * T + (size_t)n * GKA_CHECKPOINT + c) * H + hh]; }
            zeta[tid] = expf(gs);
        }
        __syncthreads();
        if (i >= count) { continue; }
        const int kn = min(NT - k0, GKA_SCAN_THREADS);
        for (int u0 = 0; u0 < kn; u0 += GKA_LOAD_BATCH) {   // a batch of terms in flight, then the recurrence
            float t[GKA_LOAD_BATCH];
            #pragma unroll
            for (int u = 0; u < GKA_LOAD_BATCH; u++) {
                const int k = k0 + u0 + u, slot = reverse ? NT - 1 - k : k;
                t[u] = u0 + u < kn ? s[(size_t)slot * count] : 0.0f;
            }
            #pragma unroll
            for (int u = 0; u < GKA_LOAD_BATCH; u++) {
                const int k = k0 + u0 + u, slot = reverse ? NT - 1 - k : k;
                if (u0 + u < kn) {
                    acc = zeta[u0 + u] * acc + t[u];
                    s[(size_t)slot * count] = acc;
                }
            }
        }
    }
}

// ---- the solve (spec 5.1(b-d)), one CTA of GKA_CHUNK_THREADS per (chunk, b*H + h): sol = CHEB(H_t, f_t, rhs_t) for
// the chunk's BT tokens at once, each iteration one H_t-product of all rows (two tile products and a masked
// one). compute_f: f_t from 5.1(b), written to f; else f is read (the backward's adjoint solve, with the
// forward's f). The right-hand sides: q_hat (rhs == NULL), or alpha_t * rhs_t (the backward: rhs = dQt).
// x_c, x_prev_c and rhs_c stay in registers: thread tid owns the elements tid, tid + 512, ... of the [BT][dk] tile.

#define GKA_SOLVE_ELEMS (GKA_CHECKPOINT * 128 / GKA_CHUNK_THREADS)   // elements of the [BT][dk] tile per thread
// the omegas' doubles rounded up to 32 bytes, so that the float tiles after them start 32-byte aligned (wmma)
__host__ __device__ inline int gka_omega_slots(int iters) { return (iters + 3) / 4 * 4; }

// the chunk kernels' tile products: fp32 on CUDA cores, or with TC on tensor cores as 3xTF32 in both builds. Plain
// TF32, as the official kernels run it, was measured on an H200 (dev/cuda/gka_core.cu version 3, 2026-11-26) and
// misses the solve's accuracy: the ridge solution x 9e-4 .. 2e-3 off the exact one where fp32 gives 2e-6 (bound
// 1e-4), and the bf16 layer's o, dv and dalpha 1.0e-2 .. 1.8e-2 off the float64 reference (bound 1e-2; CUDA-core
// fp32: 1.7e-3 and below): the 30 Chebyshev steps and the condition number (up to 51, spec 8) grow TF32's 2^-11 per
// product.
template <bool TC, bool A_T, bool B_T>
__device__ __forceinline__ void gka_mm(float* C, int ldc, const float* A, int lda, const float* Bm, int ldb, int M, int N,
                                       int K, bool acc, bool sync = true) {
    if (TC) { cta_mm_tf32<A_T, B_T>(C, ldc, A, lda, Bm, ldb, M, N, K, acc, sync); }
    else { cta_mm<A_T, B_T>(C, ldc, A, lda, Bm, ldb, M, N, K, acc, sync); }
}

static size_t gka_chunk_solve_smem(int dk, int iters) {
    const size_t BT = GKA_CHECKPOINT, ldk = gka_lds(dk), ldb = gka_lds(BT);
    return (size_t)gka_omega_slots(iters) * sizeof(double) + BT * sizeof(double)
           + ((size_t)gka_pad(dk) * ldk + 3 * BT * ldk + 2 * BT * ldb + 6 * BT + 32) * sizeof(float);
}

template <bool TC>
__global__ void __launch_bounds__(GKA_CHUNK_THREADS)
gka_chunk_solve_kernel(float* sol, float* f, int compute_f, const float* rhs, const float* alpha, const floatX* qkv,
                       const float* g, GkaH0 h0, int T, int H, int dk, int dv, int iters, float ridge) {
    extern __shared__ double gka_smem_solve[];
    const int BT = GKA_CHECKPOINT, n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H, tid = threadIdx.x;
    const int NT = gka_chunks(T), L = min(BT, T - n * BT), DE = 2 * H * dk + H * dv;
    const int dkp = gka_pad(dk), ldk = gka_lds(dk), ldb = gka_lds(BT);
    double* om = gka_smem_solve;
    double* tau = om + gka_omega_slots(iters);   // [BT] per row
    float* H0 = (float*)(tau + BT);        // [dkp][ldk]
    float* Ks = H0 + dkp * ldk;            // [BT][ldk]
    float* Xs = Ks + BT * ldk;             // [BT][ldk] the iterate, as the products' operand
    float* HY = Xs + BT * ldk;             // [BT][ldk]
    float* S = HY + BT * ldk;              // [BT][ldb]
    float* W = S + BT * ldb;               // [BT][ldb] f's (k_i.k_j)^2 terms
    float* gl = W + BT * ldb;              // [BT]
    float* zeta = gl + BT;                 // [BT]
    float* fr = zeta + BT;                 // [BT] f of each row
    float* lam = fr + BT;                  // [BT]
    float* quad = lam + BT;                // [BT]
    float* al = quad + BT;                 // [BT] alpha (backward)
    float* red = al + BT;                  // [32]
    const size_t r0 = (size_t)b * T + (size_t)n * BT, e0 = r0 * H + hh;
    gka_omegas(om, iters, ridge);
    gka_chunk_decays(gl, zeta, g, e0, H, L);
    gka_load_state(H0, ldk, h0.Hck + ((size_t)bh * NT + n) * dk * dk, dk, dk);
    gka_load_rows(Ks, ldk, qkv, DE, r0, H * dk + hh * dk, dk, L);
    if (tid < BT) { al[tid] = rhs && tid < L ? alpha[e0 + (size_t)tid * H] : 1.0f; }
    __syncthreads();
    if (compute_f) {
        // f_c^2 = zeta_c^2 ||H0||^2 + 2 zeta_c sum_j M[c][j] quad_j + sum_ij M[c][i] M[c][j] (k_i.k_j)^2
        float hh2 = 0.0f;
        for (int idx = tid; idx < dk * dk; idx += blockDim.x) {
            const float v = H0[(idx / dk) * ldk + idx % dk];
            hh2 += v * v;
        }
        const float h0f2 = gka_block_sum(hh2, red);
        gka_mm<TC, false, false>(HY, ldk, Ks, ldk, H0, ldk, BT, dkp, dkp, false, false);   // K H0
        gka_mm<TC, false, true>(S, ldb, Ks, ldk, Ks, ldk, BT, BT, dkp, false);             // Gm = K K^T
        cta_rows<1>(BT, dk, [&](int r, int c, float* acc) { acc[0] += HY[r * ldk + c] * Ks[r * ldk + c]; },
                    [&](int r, float* acc) { quad[r] = acc[0]; });
        // W[i][c] = sum_{j <= c} (k_i.k_j)^2 M[c][j]: then term 3 of row c is sum_{i <= c} M[c][i] W[i][c]
        cta_for_each(BT, BT, [&](int i, int c) {
            float acc = 0.0f;
            for (int j = 0; j <= c; j++) { const float gm = S[i * ldb + j]; acc += gm * gm * expf(gl[c] - gl[j]); }
            W[i * ldb + c] = acc;
        });
        cta_rows<1>(BT, BT, [&](int c, int i, float* acc) {
                        if (i <= c) {
                            const float m = expf(gl[c] - gl[i]);
                            acc[0] += m * (2.0f * zeta[c] * quad[i] + W[i * ldb + c]);
                        }
                    },
                    [&](int c, float* acc) {
                        const float f2 = zeta[c] * zeta[c] * h0f2 + acc[0];
                        fr[c] = sqrtf(fmaxf(f2, 0.0f));
                    });
    } else if (tid < BT) {
        fr[tid] = tid < L ? f[e0 + (size_t)tid * H] : 1.0f;
    }
    if (tid < BT) {
        tau[tid] = fr[tid] > 0.0f ? 2.0 / ((double)fr[tid] * (1.0 + 2.0 * (double)ridge)) : 0.0;
        lam[tid] = ridge * fr[tid];
    }
    __syncthreads();
    // x_prev = 0, x = tau b; r times x <- omega x - tau omega (H x + a f x - b) - (omega - 1) x_prev
    float x[GKA_SOLVE_ELEMS], xp[GKA_SOLVE_ELEMS], bv[GKA_SOLVE_ELEMS];
    #pragma unroll
    for (int m = 0; m < GKA_SOLVE_ELEMS; m++) {
        const int idx = tid + m * GKA_CHUNK_THREADS, c = idx / dkp, j = idx % dkp;
        float v = 0.0f;
        if (c < L && j < dk) {
            const size_t e = e0 + (size_t)c * H;
            v = rhs ? al[c] * rhs[e * dk + j] : to_float(qkv[(r0 + c) * DE + hh * dk + j]);
        }
        bv[m] = idx < BT * dkp ? v : 0.0f;
        x[m] = (float)tau[c < BT ? c : 0] * bv[m];
        xp[m] = 0.0f;
    }
    for (int it = 0; it < iters; it++) {
        #pragma unroll
        for (int m = 0; m < GKA_SOLVE_ELEMS; m++) {
            const int idx = tid + m * GKA_CHUNK_THREADS;
            if (idx < BT * dkp) { Xs[(idx / dkp) * ldk + idx % dkp] = x[m]; }
        }
        __syncthreads();
        gka_mm<TC, false, false>(HY, ldk, Xs, ldk, H0, ldk, BT, dkp, dkp, false, false);   // X H0
        gka_mm<TC, false, true>(S, ldb, Xs, ldk, Ks, ldk, BT, BT, dkp, false);             // X K^T
        gka_mask_scale(S, ldb, HY, ldk, dkp, gl, zeta);
        gka_mm<TC, false, false>(HY, ldk, S, ldb, Ks, ldk, BT, dkp, BT, true);              // + ((X K^T) (.) M) K
        const float c2 = (float)om[it], c3 = (float)(om[it] - 1.0);
        #pragma unroll
        for (int m = 0; m < GKA_SOLVE_ELEMS; m++) {
            const int idx = tid + m * GKA_CHUNK_THREADS, c = idx / dkp;
            if (idx >= BT * dkp) { continue; }
            const float c1 = (float)(tau[c] * om[it]);
            const float hx = HY[c * ldk + idx % dkp];
            const float xn = c2 * x[m] - c1 * (hx + lam[c] * x[m] - bv[m]) - c3 * xp[m];
            xp[m] = x[m];
            x[m] = tau[c] > 0.0 ? xn : 0.0f;   // f = 0 (all keys zero): x = 0, not 0/0
        }
        __syncthreads();   // HY and Xs are read before the next iteration writes them
    }
    #pragma unroll
    for (int m = 0; m < GKA_SOLVE_ELEMS; m++) {
        const int idx = tid + m * GKA_CHUNK_THREADS, c = idx / dkp, j = idx % dkp;
        if (idx < BT * dkp && c < L && j < dk) { sol[(e0 + (size_t)c * H) * dk + j] = x[m]; }
    }
    if (compute_f && tid < L) { f[e0 + (size_t)tid * H] = fr[tid]; }
}

// ---- the solve on register tiles (dev/cuda/gka_core.cu versions 5 to 7): the same CHEB of
// the chunk's BT = 64 tokens as gka_chunk_solve_kernel, with the iterate x [64][128] (dk padded to 128 with zeros)
// held in mma.sync C fragments (kernels/mma.cuh) across all r iterations. Sixteen warps in four blocks of
// GKA_SOLVE_WPR = 4; block b owns rows 16 b .. +15 and its warps share everything an iteration needs, so a block
// meets at its own named barrier of 128 threads, never the whole CTA. Warp p of a block:
//   1. stores its 16 x 32 part of x into Xs (columns 32 p ..);
//   2. S = (X K^T) (.) M for its 16 rows x 16 columns 16 p .. of the chunk's keys, into Ss;
//   3. HY = diag(zeta) X H0 + S K for its 16 rows x 32 columns, in registers (spec 5.1(c)), and the update of
//      x in place: spec 3.1's x <- omega x - tau omega (HY + a f x - b) - (omega - 1) x_prev (gka_cheb_step).
// (Two warps per block, 64 columns each, measured 5% slower: 25.85 against 24.48 ms forward+backward of the lab's
// benchmark, 2026-11-27, H200.)
// The right-hand side b (fp32) waits in shared memory in the lanes' own fragment order (no barrier guards it).
// f (compute_f) comes from the same products once: quad_c = k_c^T H0 k_c from K H0, the Gram matrix from K K^T,
// and then, per token, the recurrence ||H_c||^2 = gamma_c^2 ||H_{c-1}||^2 + 2 gamma_c k_c^T H_{c-1} k_c + |k_c|^4
// with gamma_c k_c^T H_{c-1} k_c = zeta_c quad_c + sum_{j<c} M[c][j] (k_c.k_j)^2 (spec 5.1(b) row by row).
// Operands: bf16 pieces, hi = bf16(v) and lo = bf16(v - hi), for x, H0 and S (the keys are bf16 already), each
// product a.hi b.hi + a.lo b.hi + a.hi b.lo (16 of fp32's 24 bits). Why: early or low-beta tokens have a large x
// along directions no key spans (|x| up to 1/(a f), spec 8). The readout s U^T x cancels that part, and the
// backward's dk multiplies it, so a rounding error of size 2^-9 |x| in x, or of 2^-9 H0 x, reaches o and dk
// magnified. Simulated in float64 on the lab's inputs (T = 256, D = 128; o and x relative L2 against the exact
// CHEB): everything in one piece o 7.9e-2, x 1.1e-3 (the lab measured o 9e-2 on an H200); x in two pieces o 2.9e-3,
// x 1.4e-4 (measured: o passes, dk 3e-2 .. 1.7e-1 fails the lab's 1e-2); x and H0 o 1.8e-3, x 1.2e-5; x, H0 and S
// o 1.1e-4, x 1.5e-6. The right-hand side in bf16 (measured: dq 2e-2, as the adjoint's dQt lies where A^-1 is
// small and its rounding does not) is kept fp32. One CTA per SM (173 KB of shared memory).
// dev/cuda/gka_solve_precision.py simulates these schemes and others (fp16 pieces among them) in float64.
// The fp32 build keeps gka_chunk_solve_kernel's 3xTF32: bf16 pieces reach fp32's accuracy only with three of every
// operand, 270 KB of shared memory.

#define GKA_SOLVE_DK 128                      // the padded key width of the register tiles
// the wgmma solves' H0 tiles (gka_h0_tiles_kernel, below): bf16 elements per chunk, and in all
#define GKA_H0T_ELEMS (2 * GKA_SOLVE_DK * GKA_SOLVE_DK)
static size_t gka_h0_tiles_elems(int B, int T, int H) { return (size_t)B * H * gka_chunks(T) * GKA_H0T_ELEMS; }

#if defined(ENABLE_BF16)

#define GKA_SOLVE_LDK (GKA_SOLVE_DK + 8)     // bf16 row stride of the [*][dk] tiles (16-byte padding)
#define GKA_SOLVE_LDS (GKA_CHECKPOINT + 8)   // bf16 row stride of S [BT][BT]
#define GKA_SOLVE_WPR 4                        // warps per 16-row block (the group that meets at its barrier)
#define GKA_SOLVE_WARPS (4 * GKA_SOLVE_WPR)    // four row blocks of the chunk's 64 tokens
#define GKA_SOLVE_THREADS (GKA_SOLVE_WARPS * 32)
#define GKA_SOLVE_NTH (GKA_SOLVE_DK / 8 / GKA_SOLVE_WPR)       // n-tiles of a warp's part of HY and x
#define GKA_SOLVE_NTS (GKA_CHECKPOINT / 8 / GKA_SOLVE_WPR)     // n-tiles of its part of S

// two adjacent elements as one word of two 16-bit elements: bf16, or with F16 IEEE half (the fp16 solve's tiles,
// gka_chunk_solve_wgmma_kernel<true>, hold half bits in GkaTile's bf16 storage), and back
template <bool F16> __device__ __forceinline__ uint32_t gka_pack2(float v0, float v1) {
    if constexpr (F16) {
        const __half2 h = __floats2half2_rn(v0, v1);
        return *reinterpret_cast<const uint32_t*>(&h);
    } else {
        return pack_bf16(v0, v1);
    }
}
template <bool F16> __device__ __forceinline__ float2 gka_unpack2(uint32_t w) {
    if constexpr (F16) {
        return __half22float2(*reinterpret_cast<const __half2*>(&w));
    } else {
        return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
    }
}
template <bool F16> __device__ __forceinline__ float gka_elem(const __nv_bfloat16* p) {
    if constexpr (F16) { return __half2float(*reinterpret_cast<const __half*>(p)); } else { return __bfloat162float(*p); }
}
// two adjacent elements v0, v1 as two pieces, the words (hi, lo): hi = bf16(v), lo = bf16(v - hi) (F16: half)
template <bool F16 = false> __device__ __forceinline__ uint2 gka_pieces2(float v0, float v1) {
    const uint32_t h = gka_pack2<F16>(v0, v1);
    const float2 hf = gka_unpack2<F16>(h);
    return make_uint2(h, gka_pack2<F16>(v0 - hf.x, v1 - hf.y));
}
// the same stored at hi[0 .. 1] and lo[0 .. 1]; returns the two words
template <bool F16 = false>
__device__ __forceinline__ uint2 gka_store2_pieces(__nv_bfloat16* hi, __nv_bfloat16* lo, float v0, float v1) {
    const uint2 w = gka_pieces2<F16>(v0, v1);
    *reinterpret_cast<uint32_t*>(hi) = w.x;
    *reinterpret_cast<uint32_t*>(lo) = w.y;
    return w;
}

// a bf16 tile, hi = bf16(v), and a second piece lo = bf16(v - hi) (lo == nullptr: one piece, the keys)
struct GkaTile {
    __nv_bfloat16* hi;
    __nv_bfloat16* lo;
    __device__ void set(int idx, float v) {
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        hi[idx] = h;
        if (lo) { lo[idx] = __float2bfloat16_rn(v - __bfloat162float(h)); }
    }
    __device__ void set2(int idx, float v0, float v1) {   // idx even: two adjacent columns
        if (lo) {
            gka_store2_pieces(hi + idx, lo + idx, v0, v1);
        } else {
            *reinterpret_cast<uint32_t*>(hi + idx) = pack_bf16(v0, v1);
        }
    }
};

// a tile of n bf16 elements carved from shared memory: hi, then lo when two_pieces (else lo = nullptr)
__host__ __device__ inline GkaTile gka_take_tile(SmemCarver& c, size_t n, bool two_pieces) {
    GkaTile t;
    t.hi = c.take<__nv_bfloat16>(n);
    t.lo = two_pieces ? c.take<__nv_bfloat16>(n) : nullptr;
    return t;
}

// the rows [0, nr) x columns [0, GKA_SOLVE_DK) of a row-major global matrix g (row stride ld; g 16-byte aligned, ld
// a multiple of 8), eight elements at a time: use(r, c0, x[8]) for each group, zeros past rows and cols (cols a
// multiple of 8), N groups of this thread in flight (chunk_tiles.cuh's tile_load_each); no barrier
#define GKA_LOAD_GROUPS 4   // groups of eight elements in flight per thread
template <int N, typename Tg, typename Use>
__device__ __forceinline__ void gka_load_rows8(const Tg* g, size_t ld, int rows, int cols, int nr, Use use) {
    tile_load_each<N>(make_tile_load((float*)nullptr, 0, nr, GKA_SOLVE_DK, g, ld, rows, cols), use);
}

// the norms f_c = ||H_c||_F of the chunk's tokens (spec 5.1(b)) from f_c^2 = gamma_c^2 f_{c-1}^2 + a_c, f_{-1}^2 =
// ||H0||^2 = h0f2, a_c = 2 zeta_c quad_c + the Gram part gram_c (parts [BT][P], summed in order): the affine maps
// f^2 -> gamma_c^2 f^2 + a_c composed by a scan over the lanes of warp 0 (two tokens per lane); into fr
template <int P>
__device__ void gka_norm_scan(float* fr, const float* gl, const float* zeta, const float* quad, const float* gram,
                              float h0f2) {
    if (threadIdx.x >= 32) { return; }
    const int lane = threadIdx.x;
    float A[2], Bc[2];
    #pragma unroll
    for (int e = 0; e < 2; e++) {
        const int c = 2 * lane + e;
        const float gam = __expf(gl[c] - (c ? gl[c - 1] : 0.0f));
        float q = 0.0f, w = 0.0f;
        #pragma unroll
        for (int p = 0; p < P; p++) {
            q += quad[P * c + p];
            w += gram[P * c + p];
        }
        A[e] = gam * gam;
        Bc[e] = 2.0f * zeta[c] * q + w;
    }
    float a = A[1] * A[0], bsum = A[1] * Bc[0] + Bc[1];   // the lane's two maps, composed
    #pragma unroll
    for (int off = 1; off < 32; off *= 2) {
        const float a_up = __shfl_up_sync(0xffffffffu, a, off), b_up = __shfl_up_sync(0xffffffffu, bsum, off);
        if (lane >= off) {
            bsum = a * b_up + bsum;
            a = a * a_up;
        }
    }
    // f^2 before the lane's first token: the maps of the lanes below applied to h0f2
    const float a_ex = __shfl_up_sync(0xffffffffu, a, 1), b_ex = __shfl_up_sync(0xffffffffu, bsum, 1);
    float f2 = lane ? a_ex * h0f2 + b_ex : h0f2;
    #pragma unroll
    for (int e = 0; e < 2; e++) {
        f2 = A[e] * f2 + Bc[e];
        fr[2 * lane + e] = sqrtf(fmaxf(f2, 0.0f));
    }
}

// ---- what the two bf16 solve kernels share (gka_chunk_solve_mma_kernel, gka_chunk_solve_wgmma_kernel): a chunk's
// per-row data, and this thread's fragment elements of x, its last step dx and b: rows ca and ca + 8, columns
// c0 + 8 t + 2 t4 (+ 1) of the NT n-tiles t, the accumulator layout (kernels/mma.cuh)

// the per-row data, carved first: tau (double), the decays, f, a f, a reduction slot, and the parts [BT][parts] of
// quad_c and of f's Gram term
struct GkaSolveRows {
    double* tau;
    float *gl, *zeta, *fr, *lam, *red, *quad, *gram;
    __host__ __device__ void take_rows(SmemCarver& c, int parts) {
        const int BT = GKA_CHECKPOINT;
        tau = c.take<double>(BT);
        gl = c.take<float>(BT);
        zeta = c.take<float>(BT);
        fr = c.take<float>(BT);
        lam = c.take<float>(BT);
        red = c.take<float>(32);
        quad = c.take<float>((size_t)parts * BT);
        gram = c.take<float>((size_t)parts * BT);
    }
};

// alpha of the chunk's row c, the adjoint's b's row factor (0 past the sequence's end, and for the forward)
__device__ __forceinline__ float gka_b_alpha(const float* rhs, const float* alpha, size_t e0, int H, int L, int c) {
    return rhs && c < L ? alpha[e0 + (size_t)c * H] : 0.0f;
}

// b (q_hat for the forward, rhs == NULL; alpha rhs for the adjoint) in pairs at bl[(2 t + h) stride], h = 0 for
// row ca, 1 for ca + 8 (shared memory in the threads' own order: no barrier guards it)
template <int NT>
__device__ void gka_load_b_frags(float2* bl, int stride, const float* rhs, const float* alpha, const floatX* qkv,
                                 size_t row0, size_t e0, int H, int hh, int dk, int DE, int L, int ca, int c0, int t4) {
    #pragma unroll
    for (int h = 0; h < 2; h++) {
        const int c = ca + 8 * h;
        const size_t e = e0 + (size_t)c * H;
        const float al = gka_b_alpha(rhs, alpha, e0, H, L, c);
        #pragma unroll
        for (int t = 0; t < NT; t++) {
            const int j = c0 + 8 * t + 2 * t4;   // even, and dk a multiple of 8: j < dk holds both columns
            float2 v = make_float2(0.0f, 0.0f);
            if (c < L && j < dk) {
                if (rhs) {
                    v = *reinterpret_cast<const float2*>(rhs + e * dk + j);
                    v = make_float2(al * v.x, al * v.y);
                } else {
                    v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(qkv + (row0 + c) * DE + hh * dk + j));
                }
            }
            bl[(t * 2 + h) * stride] = v;
        }
    }
}

// the sum over the four lanes (t4 = 0 .. 3) that hold a fragment row's columns, in every one of them
__device__ __forceinline__ float gka_row_lanes_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// this warp's parts of quad_c = k_c^T H0 k_c and of f's Gram term sum_{j <= c} (1 or 2) M[c][j] (k_c.k_j)^2 (weight
// 2 for j < c, 1 for j = c: the |k_c|^4 term) for its rows, from its fragments kh of K H0 (columns hc0 .., NTH
// n-tiles) and gm of K K^T (columns sc0 .., NTS n-tiles), key(c, j) = k_c[j]; into quad, gram [c][part]
template <int NTH, int NTS, typename Key>
__device__ void gka_quad_gram_part(GkaSolveRows& r, int parts, int part, const float* kh, const float* gm, int ca,
                                   int hc0, int sc0, int t4, Key key) {
    #pragma unroll
    for (int h = 0; h < 2; h++) {
        const int c = ca + 8 * h;
        float q = 0.0f, w = 0.0f;
        #pragma unroll
        for (int t = 0; t < NTH; t++) {
            #pragma unroll
            for (int u = 0; u < 2; u++) { q += kh[4 * t + 2 * h + u] * key(c, hc0 + 8 * t + 2 * t4 + u); }
        }
        #pragma unroll
        for (int t = 0; t < NTS; t++) {
            #pragma unroll
            for (int u = 0; u < 2; u++) {
                const int j = sc0 + 8 * t + 2 * t4 + u;
                const float v = gm[4 * t + 2 * h + u];
                if (j <= c) { w += (j < c ? 2.0f : 1.0f) * __expf(r.gl[c] - r.gl[j]) * v * v; }
            }
        }
        q = gka_row_lanes_sum(q);
        w = gka_row_lanes_sum(w);
        if (t4 == 0) {
            r.quad[parts * c + part] = q;
            r.gram[parts * c + part] = w;
        }
    }
}

// f per row (compute_f: from the parts by gka_norm_scan; else read back from f), then tau = 2 / (f (1 + 2a)) and
// a f; ends with a barrier
template <int P>
__device__ void gka_solve_rows_finish(GkaSolveRows& r, int compute_f, const float* f, size_t e0, int H, int L,
                                      float h0f2, float ridge) {
    const int tid = threadIdx.x;
    if (compute_f) {
        __syncthreads();   // the parts
        gka_norm_scan<P>(r.fr, r.gl, r.zeta, r.quad, r.gram, h0f2);
    } else if (tid < GKA_CHECKPOINT) {
        r.fr[tid] = tid < L ? f[e0 + (size_t)tid * H] : 1.0f;
    }
    __syncthreads();
    if (tid < GKA_CHECKPOINT) {
        r.tau[tid] = r.fr[tid] > 0.0f ? 2.0 / ((double)r.fr[tid] * (1.0 + 2.0 * (double)ridge)) : 0.0;
        r.lam[tid] = ridge * r.fr[tid];
    }
    __syncthreads();
}

// x = tau b, and the step dx = x - x_prev = x (x_prev = 0)
template <int NT>
__device__ __forceinline__ void gka_cheb_start(float (*x)[4], float (*dx)[4], const float2* bl, int stride,
                                               float tau_a, float tau_b) {
    #pragma unroll
    for (int t = 0; t < NT; t++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 bb = bl[(t * 2 + i / 2) * stride];
            x[t][i] = (i < 2 ? tau_a : tau_b) * (i % 2 ? bb.y : bb.x);
            dx[t][i] = x[t][i];
        }
    }
}

// one Chebyshev step of spec 3.1 on this thread's elements, hy = H x: spec 3.1's x <- omega x - c1 (hy + a f x - b)
// - (omega - 1) x_prev, with c1 = tau omega (fp32) of each row, written for the step dx = x - x_prev:
// dx <- (omega - 1) dx - c1 (hy + a f x - b), x <- x + dx (the same in exact arithmetic; two operations and a copy
// fewer than x, x_prev: solve 2.59 -> 2.54 ms, adjoint solve 2.54 -> 2.48 ms, H200; the lab's errors move either way
// in the third digit, r = 400's ridge solve unchanged). The residual hy + a f x - b is formed first (it is small
// near convergence: (omega - c1 a f) x + c1 (b - hy) would round two large terms, measured 2x the error in x). om1 =
// omega - 1 rounded from double. A row with f = 0 (all keys zero) has tau = 0 and keeps x = dx = 0 (H x = 0).
struct GkaChebRow {
    float tau, lam;   // tau = 2 / (f (1 + 2a)) (0 where f = 0) and a f of the row
};
__device__ __forceinline__ GkaChebRow gka_cheb_row(const GkaSolveRows& r, int c) {
    return {(float)r.tau[c], r.lam[c]};
}
template <int NT>
__device__ __forceinline__ void gka_cheb_step(float (*x)[4], float (*dx)[4], const float* hy, const float2* bl,
                                              int stride, const GkaChebRow& ra, const GkaChebRow& rb, float om,
                                              float om1) {
    const float c1a = ra.tau * om, c1b = rb.tau * om;
    #pragma unroll
    for (int t = 0; t < NT; t++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 bb = bl[(t * 2 + i / 2) * stride];
            const float bv = i % 2 ? bb.y : bb.x;
            const float lam = i < 2 ? ra.lam : rb.lam;
            dx[t][i] = om1 * dx[t][i] - (i < 2 ? c1a : c1b) * (hy[4 * t + i] + lam * x[t][i] - bv);
            x[t][i] += dx[t][i];
        }
    }
}

// the incremental form's start (gka_chunk_solve_wgmma_kernel<false, false, true>), after gka_cheb_start: the first
// step d = x rounded to bf16 (one piece, the products' operand), and x = d
template <int NT> __device__ __forceinline__ void gka_cheb_start_increment(float (*x)[4], float (*dx)[4]) {
    #pragma unroll
    for (int t = 0; t < NT; t++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            dx[t][i] = __bfloat162float(__float2bfloat16_rn(dx[t][i]));
            x[t][i] = dx[t][i];
        }
    }
}
// its residual, after the products of the last step d: y = H x - b (yb, b's fragment order) <- y + hy, hy = H d
template <int NT> __device__ __forceinline__ void gka_residual_increment(float2* yb, const float* hy) {
    #pragma unroll
    for (int t = 0; t < NT; t++) {
        yb[2 * t].x += hy[4 * t];
        yb[2 * t].y += hy[4 * t + 1];
        yb[2 * t + 1].x += hy[4 * t + 2];
        yb[2 * t + 1].y += hy[4 * t + 3];
    }
}
// then its Chebyshev step on the n-tiles t0, t0 + 1 (a k-step of the products' operand): gka_cheb_step's
// dx <- (omega - 1) dx - c1 (y + a f x), rounded to bf16, and x <- x + dx
__device__ __forceinline__ void gka_cheb_step_increment(float (*x)[4], float (*dx)[4], const float2* yb, int t0,
                                                        const GkaChebRow& ra, const GkaChebRow& rb, float om,
                                                        float om1) {
    const float c1a = ra.tau * om, c1b = rb.tau * om;
    #pragma unroll
    for (int t = t0; t < t0 + 2; t++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 yy = yb[t * 2 + i / 2];
            const float y = i % 2 ? yy.y : yy.x;
            const float lam = i < 2 ? ra.lam : rb.lam;
            const float step = om1 * dx[t][i] - (i < 2 ? c1a : c1b) * (y + lam * x[t][i]);
            dx[t][i] = __bfloat162float(__float2bfloat16_rn(step));
            x[t][i] += dx[t][i];   // by the rounded step, the one the products take
        }
    }
}

// the accumulator fragments acc (NT n-tiles) with row ca's elements times va, row ca + 8's times vb
template <int NT> __device__ __forceinline__ void gka_frags_scale_rows(float* acc, float va, float vb) {
    #pragma unroll
    for (int t = 0; t < NT; t++) {
        acc[4 * t] *= va;
        acc[4 * t + 1] *= va;
        acc[4 * t + 2] *= vb;
        acc[4 * t + 3] *= vb;
    }
}

// x's rows ca, ca + 8 (those before the sequence's end) into sol
template <int NT>
__device__ __forceinline__ void gka_store_x_frags(float* sol, const float (*x)[4], size_t e0, int H, int dk, int L,
                                                  int ca, int c0, int t4) {
    #pragma unroll
    for (int h = 0; h < 2; h++) {
        const int c = ca + 8 * h;
        if (c >= L) { continue; }
        float* dst = sol + (e0 + (size_t)c * H) * dk;
        #pragma unroll
        for (int t = 0; t < NT; t++) {
            const int j = c0 + 8 * t + 2 * t4;
            if (j < dk) { dst[j] = x[t][2 * h]; }
            if (j + 1 < dk) { dst[j + 1] = x[t][2 * h + 1]; }
        }
    }
}

struct GkaSolveSmem : GkaSolveRows {   // quad, gram parts: the warps of a row block
    GkaTile H0, K, X, S;   // [128][LDK], [BT][LDK], [BT][LDK], [BT][LDS]; two pieces but K
    float2* b;       // [warps][2 NTH fragment element pairs][32 lanes]
    double* om;      // [iters] the omegas
    __host__ __device__ GkaSolveSmem(size_t base, int iters, size_t* bytes) {
        const int BT = GKA_CHECKPOINT;
        SmemCarver c(base);
        take_rows(c, GKA_SOLVE_WPR);
        H0 = gka_take_tile(c, (size_t)GKA_SOLVE_DK * GKA_SOLVE_LDK, true);
        K = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDK, false);
        X = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDK, true);
        S = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDS, true);
        b = c.take<float2>((size_t)GKA_SOLVE_WARPS * 2 * GKA_SOLVE_NTH * 32);
        om = c.take<double>(iters);   // last: the other offsets are compile-time constants
        if (bytes) { *bytes = c.off; }
    }
};

static size_t gka_chunk_solve_mma_smem(int iters) {
    size_t bytes = 0;
    GkaSolveSmem sm(0, iters, &bytes);
    return bytes;
}

// c += a b over the pieces: a.hi b.hi, then a.lo b.hi (A_LO), then a.hi b.lo (B_LO)
template <bool A_LO, bool B_LO>
__device__ __forceinline__ void gka_mma_pieces(float c[4], const uint32_t ah[4], const uint32_t al[4], uint32_t bh0,
                                               uint32_t bh1, uint32_t bl0, uint32_t bl1) {
    mma_bf16(c, ah, bh0, bh1);
    if (A_LO) { mma_bf16(c, al, bh0, bh1); }
    if (B_LO) { mma_bf16(c, ah, bl0, bl1); }
}

// acc[NT] += A[row0 .. row0 + 15][0 .. KD) B[0 .. KD)[n0 .. n0 + 8 NT) (A row stride lda). A is stored [m][k], or
// with A_KM [k][m] (A = the stored tile transposed, read through ldmatrix.trans: the chunk-state terms' row
// operands). B is stored [n][k] (B = the stored tile transposed: the rows n0 .. of a [rows][k] tile, as the keys in
// X K^T), or with B_KN [k][n] (read through ldmatrix.trans: H0, and the keys in S K); row stride ldb. With the second
// pieces A_LO and B_LO: + A.lo B.hi, + A.hi B.lo after each A.hi B.hi (A.lo B.lo is below fp32's rounding of the sum).
template <int NT, int KD, bool B_KN, bool A_LO, bool B_LO, bool A_KM = false>
__device__ __forceinline__ void gka_warp_mma(float acc[NT][4], const GkaTile& A, int lda, int row0, const GkaTile& Bm,
                                             int ldb, int n0, int lane) {
    #pragma unroll 2
    for (int kc = 0; kc < KD / 16; kc++) {
        const int ao = A_KM ? ldsm_a_km_off(lda, row0, kc * 16, lane) : ldsm_a_off(lda, row0, kc * 16, lane);
        uint32_t ah[4], al[4];
        if (A_KM) {
            ldsm_x4_trans(ah, A.hi + ao);
            if (A_LO) { ldsm_x4_trans(al, A.lo + ao); }
        } else {
            ldsm_x4(ah, A.hi + ao);
            if (A_LO) { ldsm_x4(al, A.lo + ao); }
        }
        #pragma unroll
        for (int p = 0; p < NT / 2; p++) {   // n-tiles 2p and 2p + 1
            const int bo = B_KN ? ldsm_b_kn_off(ldb, kc * 16, n0 + p * 16, lane) : ldsm_b_nk_off(ldb, kc * 16, n0 + p * 16, lane);
            uint32_t bf[4], bl[4];
            if (B_KN) { ldsm_x4_trans(bf, Bm.hi + bo); } else { ldsm_x4(bf, Bm.hi + bo); }
            if (B_LO) {
                if (B_KN) { ldsm_x4_trans(bl, Bm.lo + bo); } else { ldsm_x4(bl, Bm.lo + bo); }
            }
            gka_mma_pieces<A_LO, B_LO>(acc[2 * p], ah, al, bf[0], bf[1], bl[0], bl[1]);
            gka_mma_pieces<A_LO, B_LO>(acc[2 * p + 1], ah, al, bf[2], bf[3], bl[2], bl[3]);
        }
    }
}

template <int NT> __device__ __forceinline__ void gka_frags_zero(float acc[NT][4]) {
    #pragma unroll
    for (int t = 0; t < NT; t++) { acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f; }
}

// P = diag(zeta) A Ust + S Ct (spec 5.1(c) and (f)) for the warp's 16 rows r0 .. and the 32 columns n0 ..: A in
// A_LO pieces, Ust (two pieces) stored [k][n] with UST_KN, else [n][k]; S in two pieces, Ct stored [k][n];
// zeta_a, zeta_b the decays of the lane's rows r0 + g and r0 + g + 8
template <bool UST_KN, bool A_LO>
__device__ __forceinline__ void gka_chunk_rows_product(float p[4][4], const GkaTile& A, const GkaTile& Ust,
                                                       const GkaTile& S, const GkaTile& Ct, float zeta_a, float zeta_b,
                                                       int r0, int n0, int lane) {
    gka_frags_zero<4>(p);
    gka_warp_mma<4, GKA_SOLVE_DK, UST_KN, A_LO, true>(p, A, GKA_SOLVE_LDK, r0, Ust, GKA_SOLVE_LDK, n0, lane);
    #pragma unroll
    for (int t = 0; t < 4; t++) {
        p[t][0] *= zeta_a;
        p[t][1] *= zeta_a;
        p[t][2] *= zeta_b;
        p[t][3] *= zeta_b;
    }
    gka_warp_mma<4, GKA_CHECKPOINT, true, true, false>(p, S, GKA_SOLVE_LDS, r0, Ct, GKA_SOLVE_LDK, n0, lane);
}

// the decay masks of spec 5: M[c][j] = exp(gl_c - gl_j) for j <= c (the forward's), and its transpose
struct GkaMaskLower {
    const float* gl;
    __device__ __forceinline__ float operator()(int c, int j) const { return j <= c ? __expf(gl[c] - gl[j]) : 0.0f; }
};
struct GkaMaskUpper {
    const float* gl;
    __device__ __forceinline__ float operator()(int c, int j) const { return j >= c ? __expf(gl[j] - gl[c]) : 0.0f; }
};

// S = (A Bt^T) (.) mask (Bt's rows are the n dimension; A and Bt in A_LO, B_LO pieces) of the warp's rows r0 + g
// (+ 8) and columns n0 + 8 t + 2 t4 (+ 1), into S (two pieces): with M, the solve's X K^T, the readout's Qt K^T,
// dQt's dO V^T, pass 3a's X K^T; with M^T, pass 3a's K X^T and K Z^T
template <bool A_LO, bool B_LO, typename Mask>
__device__ __forceinline__ void gka_masked_s(GkaTile& S, const GkaTile& A, const GkaTile& Bt, int r0, int n0, int lane,
                                             Mask mask) {
    float s[GKA_SOLVE_NTS][4];
    gka_frags_zero<GKA_SOLVE_NTS>(s);
    gka_warp_mma<GKA_SOLVE_NTS, GKA_SOLVE_DK, false, A_LO, B_LO>(s, A, GKA_SOLVE_LDK, r0, Bt, GKA_SOLVE_LDK, n0, lane);
    const int g = lane >> 2, t4 = lane & 3;
    #pragma unroll
    for (int t = 0; t < GKA_SOLVE_NTS; t++) {
        #pragma unroll
        for (int h = 0; h < 2; h++) {
            const int c = r0 + g + 8 * h, j = n0 + 8 * t + 2 * t4;
            S.set2(c * GKA_SOLVE_LDS + j, s[t][2 * h] * mask(c, j), s[t][2 * h + 1] * mask(c, j + 1));
        }
    }
}

// rows x cols of an fp32 or bf16 matrix (row stride ld, 16-byte aligned rows, cols a multiple of 8), row i times
// rs[i] where rs is given, into a two-piece tile of nr rows of GKA_SOLVE_DK columns, zero past rows and cols, 16
// bytes at a time (N groups of eight in flight per thread); no barrier
template <int N = GKA_LOAD_GROUPS, typename Tg>
__device__ void gka_set_pieces(GkaTile& t, const Tg* m, size_t ld, int rows, int cols, int nr,
                               const float* rs = nullptr) {
    gka_load_rows8<N>(m, ld, rows, cols, nr, [&](int i, int j0, const float* v) {
        const float si = rs ? rs[i] : 1.0f;
        #pragma unroll
        for (int e = 0; e < 8; e += 2) { t.set2(i * GKA_SOLVE_LDK + j0 + e, si * v[e], si * v[e + 1]); }
    });
}

// the chunk's Qt = q_hat + alpha (x - q_hat) (gka_qt), row c times mul rs[c] where rs is given, into a two-piece
// [BT][LDK] tile, zero past L rows and dk columns, eight elements at a time (16 bytes of q_hat and 32 of x per group,
// N groups of this thread in flight); no barrier
template <int N = GKA_LOAD_GROUPS>
__device__ void gka_set_qt_pieces(GkaTile& t, const floatX* qkv, const float* alpha, const float* x, size_t r0,
                                  size_t e0, int H, int hh, int dk, int DE, int L, const float* rs = nullptr,
                                  float mul = 1.0f) {
    const int per_row = GKA_SOLVE_DK / 8, n = GKA_CHECKPOINT * per_row;
    const uint4 zero = make_uint4(0, 0, 0, 0);
    for (int base = threadIdx.x; base < n; base += N * blockDim.x) {
        Raw8<floatX> qr[N];
        Raw8<float> xr[N];
        float al[N];
        #pragma unroll
        for (int u = 0; u < N; u++) {
            const int idx = base + u * blockDim.x, c = idx / per_row, j0 = idx % per_row * 8;
            const bool in = idx < n && c < L && j0 < dk;
            const size_t e = e0 + (size_t)c * H;
            const uint4* xg = reinterpret_cast<const uint4*>(x + e * dk + j0);
            qr[u].u[0] = in ? *reinterpret_cast<const uint4*>(qkv + (r0 + c) * DE + hh * dk + j0) : zero;
            xr[u].u[0] = in ? xg[0] : zero;
            xr[u].u[1] = in ? xg[1] : zero;
            al[u] = in ? alpha[e] : 0.0f;
        }
        #pragma unroll
        for (int u = 0; u < N; u++) {
            const int idx = base + u * blockDim.x, c = idx / per_row, j0 = idx % per_row * 8;
            if (idx >= n) { continue; }
            float q[8], xv[8];
            unpack8(q, qr[u]);
            unpack8(xv, xr[u]);
            const float sc = rs ? mul * rs[c] : 1.0f;
            #pragma unroll
            for (int e = 0; e < 8; e += 2) {
                t.set2(c * GKA_SOLVE_LDK + j0 + e, sc * (q[e] + al[u] * (xv[e] - q[e])),
                       sc * (q[e + 1] + al[u] * (xv[e + 1] - q[e + 1])));
            }
        }
    }
}

// rows [r0, r0 + BT) of a (B*T, ld) bf16 matrix of one head (columns col0 .. col0 + n, n a multiple of 8) into a
// [BT][LDK] tile, zero past the sequence's end (L rows) and in the columns n .. 128, 16 bytes at a time (bf16 ->
// fp32 -> bf16: exact; N groups of eight in flight per thread)
template <int N = GKA_LOAD_GROUPS>
__device__ void gka_load_bf16_rows(__nv_bfloat16* s, const __nv_bfloat16* m, size_t ld, size_t r0, int col0, int n,
                                   int L) {
    gka_load_rows8<N>(m + r0 * ld + col0, ld, L, n, GKA_CHECKPOINT, [&](int c, int j0, const float* v) {
        store8_scaled(s + c * GKA_SOLVE_LDK + j0, v, 1.0f);
    });
}

__global__ void __launch_bounds__(GKA_SOLVE_THREADS, 1)
gka_chunk_solve_mma_kernel(float* sol, float* f, int compute_f, const float* rhs, const float* alpha,
                           const floatX* qkv, const float* g, GkaH0 h0, int T, int H, int dk, int dv, int iters,
                           float ridge) {
    extern __shared__ __align__(128) unsigned char gka_smem_solve_mma[];
    GkaSolveSmem sm((size_t)gka_smem_solve_mma, iters, NULL);
    const int BT = GKA_CHECKPOINT, n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H, tid = threadIdx.x;
    const int lane = tid % 32, warp = tid / 32, blk = warp / GKA_SOLVE_WPR, part = warp % GKA_SOLVE_WPR;
    const int gq = lane >> 2, t4 = lane & 3, r0 = 16 * blk;
    const int hc0 = 8 * GKA_SOLVE_NTH * part, sc0 = 8 * GKA_SOLVE_NTS * part;   // first columns of its HY and S
    const int NT = gka_chunks(T), L = min(BT, T - n * BT), DE = 2 * H * dk + H * dv, LDK = GKA_SOLVE_LDK;
    const size_t row0 = (size_t)b * T + (size_t)n * BT, e0 = row0 * H + hh;
    gka_omegas(sm.om, iters, ridge);
    gka_chunk_decays(sm.gl, sm.zeta, g, e0, H, L);
    // H0 and K as bf16 tiles (zero padding), ||H0||^2 in fp32
    const float* H0g = h0.Hck + ((size_t)bh * NT + n) * dk * dk;
    float h0sq = 0.0f;
    cta_batched<GKA_LOAD_BATCH>(GKA_SOLVE_DK * GKA_SOLVE_DK, [&](int idx) {
        const int i = idx / GKA_SOLVE_DK, j = idx % GKA_SOLVE_DK;
        return i < dk && j < dk ? H0g[(size_t)i * dk + j] : 0.0f;
    }, [&](int idx, float v) {
        h0sq += v * v;
        sm.H0.set((idx / GKA_SOLVE_DK) * LDK + idx % GKA_SOLVE_DK, v);
    });
    gka_load_bf16_rows(sm.K.hi, qkv, DE, row0, H * dk + hh * dk, dk, L);
    const int ca = r0 + gq, cb = ca + 8;   // this lane's rows
    float2* bl = sm.b + (size_t)warp * 2 * GKA_SOLVE_NTH * 32 + lane;
    gka_load_b_frags<GKA_SOLVE_NTH>(bl, 32, rhs, alpha, qkv, row0, e0, H, hh, dk, DE, L, ca, hc0, t4);
    const float h0f2 = gka_block_sum(h0sq, sm.red);   // its barriers publish the tiles too
    if (compute_f) {
        // quad_c = k_c^T H0 k_c: this warp's part of K H0, times K, summed over its columns
        float acc[GKA_SOLVE_NTH][4];
        gka_frags_zero<GKA_SOLVE_NTH>(acc);
        gka_warp_mma<GKA_SOLVE_NTH, GKA_SOLVE_DK, true, false, true>(acc, sm.K, LDK, r0, sm.H0, LDK, hc0, lane);
        // (k_c.k_j)^2 M[c][j] weighted 2 for j < c, 1 for j = c (the |k_c|^4 term), 0 above: this warp's columns
        float s[GKA_SOLVE_NTS][4];
        gka_frags_zero<GKA_SOLVE_NTS>(s);
        gka_warp_mma<GKA_SOLVE_NTS, GKA_SOLVE_DK, false, false, false>(s, sm.K, LDK, r0, sm.K, LDK, sc0, lane);
        gka_quad_gram_part<GKA_SOLVE_NTH, GKA_SOLVE_NTS>(sm, GKA_SOLVE_WPR, part, &acc[0][0], &s[0][0], ca, hc0, sc0, t4,
                                                         [&](int c, int j) { return __bfloat162float(sm.K.hi[c * LDK + j]); });
    }
    gka_solve_rows_finish<GKA_SOLVE_WPR>(sm, compute_f, f, e0, H, L, h0f2, ridge);
    // this lane's rows: their a f and zeta

    const GkaChebRow ra = gka_cheb_row(sm, ca), rb = gka_cheb_row(sm, cb);
    const float zeta_a = sm.zeta[ca], zeta_b = sm.zeta[cb];
    float x[GKA_SOLVE_NTH][4], dx[GKA_SOLVE_NTH][4];
    gka_cheb_start<GKA_SOLVE_NTH>(x, dx, bl, 32, ra.tau, rb.tau);
    for (int it = 0; it < iters; it++) {
        #pragma unroll
        for (int t = 0; t < GKA_SOLVE_NTH; t++) {
            const int j = hc0 + 8 * t + 2 * t4;
            sm.X.set2(ca * LDK + j, x[t][0], x[t][1]);
            sm.X.set2(cb * LDK + j, x[t][2], x[t][3]);
        }
        named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);
        gka_masked_s<true, false>(sm.S, sm.X, sm.K, r0, sc0, lane, GkaMaskLower{sm.gl});
        named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);
        const float om = (float)sm.om[it], om1 = (float)(sm.om[it] - 1.0);
        #pragma unroll
        for (int q = 0; q < GKA_SOLVE_NTH / 4; q++) {   // the warp's columns 32 at a time (fewer live registers)
            float hy[4][4];
            const int n0 = hc0 + 32 * q;
            gka_chunk_rows_product<true, true>(hy, sm.X, sm.H0, sm.S, sm.K, zeta_a, zeta_b, r0, n0, lane);
            gka_cheb_step<4>(x + 4 * q, dx + 4 * q, &hy[0][0], bl + 4 * q * 2 * 32, 32, ra, rb, om, om1);
        }
        named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);   // the block is done with Xs before it is written again
    }
    gka_store_x_frags<GKA_SOLVE_NTH>(sol, x, e0, H, dk, L, ca, hc0, t4);
    if (compute_f && tid < L) { f[e0 + (size_t)tid * H] = sm.fr[tid]; }
}

// ---- the wgmma solves' H0 operand, once per forward (spec 5.1(b, c)): each chunk's start state as the B operand of
// X H0 (element (n, k) = H0[k][n] at wgmma_tile_off(n, k, GKA_SOLVE_DK), zero padded to GKA_SOLVE_DK^2) in two bf16
// pieces, hi = bf16(H0) then lo = bf16(H0 - hi), and ||H0||_F^2 (fp32, a fixed order). Both solves copy a chunk's
// 64 KB into shared memory as they are (cp.async): converted in the solve itself, H0's load was 13% of its time
// (ncu, H200), one CTA per SM waiting on its global loads with nothing else to run.
#define GKA_H0T_THREADS 256

// The fp16 solve (F16) keeps half's range: its tiles hold 2^-e H0, 2^e the power of two at or above ||H0||_F (so
// every entry is at most 1), and its X H0 products are scaled back by 2^e (gka_h0_scale_back, from sq: the same
// value in both kernels). The norm is summed first, in a pass of its own.
__device__ __forceinline__ float gka_h0_scale_back(float h0f2) {
    int e = 0;
    frexpf(sqrtf(h0f2), &e);   // sqrt = m 2^e, m in [0.5, 1)
    return h0f2 > 0.0f ? ldexpf(1.0f, e) : 1.0f;
}

// grid: one CTA per chunk (b*H + h) * NT + n, Hck's order
template <bool F16>
__global__ void __launch_bounds__(GKA_H0T_THREADS)
gka_h0_tiles_kernel(__nv_bfloat16* tiles, float* sq, const float* Hck, int dk) {
    __shared__ float red[GKA_H0T_THREADS / 32];
    const int D = GKA_SOLVE_DK;
    const float* H0 = Hck + (size_t)blockIdx.x * dk * dk;
    __nv_bfloat16* hi = tiles + (size_t)blockIdx.x * GKA_H0T_ELEMS;
    __nv_bfloat16* lo = hi + D * D;
    float acc = 0.0f, total = 0.0f, scale = 1.0f;
    if constexpr (F16) {
        for (int idx = threadIdx.x; idx < dk * dk; idx += blockDim.x) { acc += H0[idx] * H0[idx]; }
        total = gka_block_sum(acc, red);
        scale = 1.0f / gka_h0_scale_back(total);
    }
    // n fastest: a warp reads 32 consecutive columns of a row of H0 and writes four core-matrix rows of 128 bytes
    for (int idx = threadIdx.x; idx < D * D / 8; idx += blockDim.x) {
        const int n = idx % D, k0 = idx / D * 8;
        float v[8];
        #pragma unroll
        for (int e = 0; e < 8; e++) {
            v[e] = n < dk && k0 + e < dk ? H0[(size_t)(k0 + e) * dk + n] : 0.0f;
            if constexpr (F16) { v[e] *= scale; } else { acc += v[e] * v[e]; }
        }
        uint2 w[4];
        #pragma unroll
        for (int e = 0; e < 4; e++) { w[e] = gka_pieces2<F16>(v[2 * e], v[2 * e + 1]); }
        *reinterpret_cast<uint4*>(hi + wgmma_tile_off(n, k0, D)) = make_uint4(w[0].x, w[1].x, w[2].x, w[3].x);
        *reinterpret_cast<uint4*>(lo + wgmma_tile_off(n, k0, D)) = make_uint4(w[0].y, w[1].y, w[2].y, w[3].y);
    }
    if constexpr (!F16) { total = gka_block_sum(acc, red); }
    if (threadIdx.x == 0) { sq[blockIdx.x] = total; }
}

static void gka_h0_tiles(__nv_bfloat16* tiles, float* sq, const float* Hck, int chunks, int dk, bool f16,
                         cudaStream_t stream) {
    if (f16) {
        gka_h0_tiles_kernel<true><<<chunks, GKA_H0T_THREADS, 0, stream>>>(tiles, sq, Hck, dk);
    } else {
        gka_h0_tiles_kernel<false><<<chunks, GKA_H0T_THREADS, 0, stream>>>(tiles, sq, Hck, dk);
    }
    cudaCheckLaunch();
}

// ---- the solve on warpgroup MMAs (dev/cuda/gka_core.cu version 8; what the bf16 trainer runs): the CHEB of
// gka_chunk_solve_mma_kernel with the same bf16 pieces, GKA_WG_GROUPS warpgroups per (chunk, b*H + h). The
// register-tile solve above is bound by its own fragment loads: sixteen warps each read their A and B fragments
// through ldmatrix, X four times over and H0 four times per iteration (H200, ncu: shared-memory pipe 68% busy, the
// tensor pipe 40%, short-scoreboard the first stall). Here the tensor cores read the operands from shared memory
// themselves (kernels/mma.cuh's wgmma): H0 once per iteration, X once per warpgroup, except a warpgroup's own
// columns of X and of S, which its products take from registers (gka_wgmma_ra: the shared-memory pipe had been 68%
// busy, nearly all of it operand fetches; 2.78 -> 2.71 ms per solve, H200). Warpgroup q owns the columns
// GKA_WG_NH q .. of x and HY and the columns GKA_WG_NS q .. of S; its warp w the rows 16 w .. 16 w + 15 of them
// (the accumulator layout). An iteration (spec 5.1(c), 3.1):
//   1. S = X K^T (two pieces of X) and HY = X H0 (X.hi H0.hi + X.lo H0.hi + X.hi H0.lo) over the warpgroup's own
//      k-steps, from registers; while they run, x into Xs (two pieces); a barrier;
//   2. the other k-steps of both from Xs; while HY runs, S (.) M into Ss (two pieces);
//   3. HY = diag(zeta) HY, then HY += S K (two pieces of S): the own k-steps from registers; a barrier (Ss
//      written, Xs read by every warpgroup); the other k-steps from Ss; the update of x in registers.
// A barrier thus finds the tensor cores busy with the products that need no other warpgroup's columns (before: x
// stored, barrier, all k-steps).
// (Tried: Xs in two tiles used in turn, S K in its own accumulator queued behind X H0 without the wait for it
// before the barrier: 2.86 against 2.76 ms per solve, H200.) The keys are bf16 in two K-major tiles, K [c][d] for
// X K^T and Kt [d][c] for S K; H0 is stored as B of X H0 ([n][k], element (n, k) = H0[k][n]), copied from
// gka_h0_tiles_kernel's image; the decay mask M of this thread's elements of S stays in registers. f (compute_f)
// from the same tiles: quad_c from K H0, the Gram matrix K K^T, then gka_norm_scan.

#define GKA_WG_GROUPS 2   // (four, 32 columns each, measured 10% slower: 4.52 against 4.11 ms per solve, H200)
#define GKA_WG_THREADS (128 * GKA_WG_GROUPS)
#define GKA_WG_NH (GKA_SOLVE_DK / GKA_WG_GROUPS)      // columns of x and HY per warpgroup
#define GKA_WG_NS (GKA_CHECKPOINT / GKA_WG_GROUPS)    // columns of S per warpgroup
#define GKA_WG_NTH (GKA_WG_NH / 8)                    // their n-tiles
#define GKA_WG_NTS (GKA_WG_NS / 8)

struct GkaSolveWgSmem : GkaSolveRows {   // quad, gram parts: the warpgroups
    GkaTile H0, K, Kt, X, S;   // [128][128] (two pieces), [BT][128], [128][BT], [BT][128] (two), [BT][BT] (two)
    float2* b;      // [2 GKA_WG_NTH fragment element pairs][GKA_WG_THREADS]
    float* bnorm;   // [GKA_WG_GROUPS][BT]: the warpgroups' parts of ||b_c||^2 (the fp16 solve's row scales)
    double* om;     // [iters]
    __host__ __device__ GkaSolveWgSmem(size_t base, int iters, size_t* bytes) {
        const int BT = GKA_CHECKPOINT, D = GKA_SOLVE_DK;
        SmemCarver c(base);
        take_rows(c, GKA_WG_GROUPS);
        H0 = gka_take_tile(c, (size_t)D * D, true);
        K = gka_take_tile(c, (size_t)BT * D, false);
        Kt = gka_take_tile(c, (size_t)D * BT, false);
        X = gka_take_tile(c, (size_t)BT * D, true);
        S = gka_take_tile(c, (size_t)BT * BT, true);
        b = c.take<float2>((size_t)2 * GKA_WG_NTH * GKA_WG_THREADS);
        bnorm = c.take<float>((size_t)GKA_WG_GROUPS * BT);
        om = c.take<double>(iters);
        if (bytes) { *bytes = c.off; }
    }
};

// the bytes of a solve's shared-memory plan (Smem carved from 0)
template <typename Smem> static size_t gka_solve_smem_bytes(int iters) {
    size_t bytes = 0;
    Smem sm(0, iters, &bytes);
    return bytes;
}
static size_t gka_chunk_solve_wgmma_smem(int iters) { return gka_solve_smem_bytes<GkaSolveWgSmem>(iters); }

// acc (+)= A B[n0 .. n0 + N) over the k-steps kc0 .. kc0 + NKC - 1 (16 columns each) of K-major tiles A [64][KD]
// and B [*][KD] in their pieces: A.hi B.hi, then A.lo B.hi (A_LO), then A.hi B.lo (B_LO); accumulate 0 starts from
// zero
template <int N, int KD, bool A_LO, bool B_LO, int NKC = KD / 16, bool F16 = false>
__device__ __forceinline__ void gka_wgmma(float* acc, const GkaTile& A, const GkaTile& Bm, int n0, int accumulate,
                                          int kc0 = 0) {
    const uint64_t ah = wgmma_desc(A.hi, 0, 16 * kc0, KD), bh = wgmma_desc(Bm.hi, n0, 16 * kc0, KD);
    const uint64_t al = A_LO ? wgmma_desc(A.lo, 0, 16 * kc0, KD) : 0;
    const uint64_t bl = B_LO ? wgmma_desc(Bm.lo, n0, 16 * kc0, KD) : 0;
    #pragma unroll
    for (int kc = 0; kc < NKC; kc++) {
        const uint64_t ahk = wgmma_desc_advance(ah, 16 * kc), bhk = wgmma_desc_advance(bh, 16 * kc);
        wgmma_m64k16<N, F16>(acc, ahk, bhk, accumulate || kc > 0);
        if (A_LO) { wgmma_m64k16<N, F16>(acc, wgmma_desc_advance(al, 16 * kc), bhk, 1); }
        if (B_LO) { wgmma_m64k16<N, F16>(acc, ahk, wgmma_desc_advance(bl, 16 * kc), 1); }
    }
}

// the same with A in two pieces from registers: a[j][piece] the A fragments of k-step kc0 + j (the accumulator
// fragments of this warpgroup's columns, packed as gka_pieces2 does), B [*][KD] in B_LO pieces; A_LO false: A's
// first piece alone
template <int N, int NKC, int KD, bool B_LO, bool F16 = false, bool A_LO = true>
__device__ __forceinline__ void gka_wgmma_ra(float* acc, const uint32_t (*a)[2][4], int kc0, const GkaTile& Bm,
                                             int n0, int accumulate) {
    const uint64_t bh = wgmma_desc(Bm.hi, n0, 16 * kc0, KD), bl = B_LO ? wgmma_desc(Bm.lo, n0, 16 * kc0, KD) : 0;
    #pragma unroll
    for (int j = 0; j < NKC; j++) {
        const uint64_t bhk = wgmma_desc_advance(bh, 16 * j);
        wgmma_m64k16_rs<N, F16>(acc, a[j][0], bhk, accumulate || j > 0);
        if (A_LO) { wgmma_m64k16_rs<N, F16>(acc, a[j][1], bhk, 1); }
        if (B_LO) { wgmma_m64k16_rs<N, F16>(acc, a[j][0], wgmma_desc_advance(bl, 16 * j), 1); }
    }
}

// the A fragments of this thread's n-tile t of a warpgroup accumulator as an A operand (gka_wgmma_ra): k-step t / 2,
// rows ca (words wa) and cb = ca + 8 (wb), columns 8 (t % 2) .. of it
__device__ __forceinline__ void gka_frag_words(uint32_t (*a)[2][4], int t, uint2 wa, uint2 wb) {
    a[t / 2][0][2 * (t % 2)] = wa.x;
    a[t / 2][0][2 * (t % 2) + 1] = wb.x;
    a[t / 2][1][2 * (t % 2)] = wa.y;
    a[t / 2][1][2 * (t % 2) + 1] = wb.y;
}

// The fp16 solve (F16; dev/cuda/gka_core.cu version 10): the same products in IEEE half, 11 significand bits at
// bf16's rate, so H0 needs one piece (dev/cuda/gka_solve_precision.py's scheme 2, 1, 2, 2: x and S in two pieces,
// H0 and the keys in one; 4.19M multiply-adds per chunk-iteration against 5.24M). Half's range is kept by exact
// power-of-two scales: H0 by gka_h0_tiles_kernel<true> (scaled back in diag(zeta)); each row's system, b and so x,
// by gka_f16_row_scale, so that |x| <= ||b|| / (a f) maps to at most 2^GKA_F16_ROW_EXP (x is scaled back as it is
// stored); the keys are converted as they are. H0's second piece serves f's quad_c only (the forward).
#define GKA_F16_ROW_EXP 10
// ||b_c||^2 from the G warpgroups' parts (gka_wg_b_norm_parts)
template <int G = GKA_WG_GROUPS> __device__ __forceinline__ float gka_wg_b_norm2(const float* bnorm, int c) {
    float n2 = 0.0f;
    #pragma unroll
    for (int g = 0; g < G; g++) { n2 += bnorm[g * GKA_CHECKPOINT + c]; }
    return n2;
}

template <int G = GKA_WG_GROUPS>
__device__ __forceinline__ float gka_f16_row_scale(const float* bnorm, float fr, int c, float ridge) {
    const float r = ridge * fr / sqrtf(gka_wg_b_norm2<G>(bnorm, c));   // the bound's inverse; b = 0 or f = 0: no scale
    float scale = 1.0f;
    if (r > 0.0f && !isinf(r)) {
        int e;
        frexpf(r, &e);                                  // r = m 2^e, m in [0.5, 1): 2^(e - 1) <= r
        scale = ldexpf(1.0f, min(GKA_F16_ROW_EXP + e - 1, 100));
    }
    return scale;
}

// The lean solve's b waits in shared memory as half, each row at a power of two of its own: stored 2^-e' b with
// ||2^-e' b|| in [2^13, 2^14) (half's largest value is 65504), undone as it is read. The row scale alone would leave
// ||b|| at 2^GKA_F16_ROW_EXP a f, which for a row of tiny f (beta ~ 1e-3) lies among half's subnormals (the emulator's
// wide inputs: dk 1.8e-1 off). Returns 2^e' for row c, whose system is scaled by rs.
#define GKA_LEAN_B_EXP 14
__device__ __forceinline__ float gka_lean_b_unscale(const float* bnorm, int c, float rs) {
    const float nb = sqrtf(gka_wg_b_norm2(bnorm, c)) * rs;
    int e = GKA_LEAN_B_EXP;   // b = 0: any scale
    if (nb > 0.0f && !isinf(nb)) { frexpf(nb, &e); }   // ||b|| < 2^e
    return ldexpf(1.0f, max(-100, min(e - GKA_LEAN_B_EXP, 100)));
}

// The wgmma solves' setup (the wgmma solve's and the lean one's). Their copies, in flight while the rest loads:
// h0_groups 16-byte groups of H0's tiles (gka_h0_tiles_kernel's image: both pieces, 64 KB, or the first) and the
// keys K [c][d] (bf16, zero past L rows and dk columns) as they are, c fastest (4-way bank conflicts below, not 16);
// by the CTA's THREADS threads
template <int THREADS = GKA_WG_THREADS, typename Smem>
__device__ __forceinline__ void gka_wg_copy_h0_keys(Smem& sm, const __nv_bfloat16* h0t, int h0_groups,
                                                    const floatX* kq, int L, int dk, int DE, int tid) {
    const int BT = GKA_CHECKPOINT, D = GKA_SOLVE_DK;
    for (int i = tid; i < h0_groups; i += THREADS) {
        cp_async16(i < D * D / 8 ? sm.H0.hi + 8 * i : sm.H0.lo + 8 * (i - D * D / 8), h0t + 8 * i, 16);
    }
    for (int i = tid; i < BT * D / 8; i += THREADS) {
        const int c = i % BT, j0 = i / BT * 8;
        const bool in = c < L && j0 < dk;
        cp_async16(sm.K.hi + wgmma_tile_off(c, j0, D), in ? kq + (size_t)c * DE + j0 : kq, in ? 16 : 0);
    }
    cp_async_commit();
}

// the warpgroup's parts of ||b||^2 for rows ca, cb (this thread's elements of b at bl[i * stride], NT n-tiles; read
// after the barriers that follow)
template <int NT = GKA_WG_NTH>
__device__ __forceinline__ void gka_wg_b_norm_parts(float* bnorm, const float2* bl, int stride, int grp, int ca,
                                                    int cb, int t4) {
    float na = 0.0f, nb = 0.0f;
    #pragma unroll
    for (int t = 0; t < NT; t++) {
        const float2 va = bl[2 * t * stride], vb = bl[(2 * t + 1) * stride];
        na += va.x * va.x + va.y * va.y;
        nb += vb.x * vb.x + vb.y * vb.y;
    }
    na = gka_row_lanes_sum(na);
    nb = gka_row_lanes_sum(nb);
    if (t4 == 0) {
        bnorm[grp * GKA_CHECKPOINT + ca] = na;
        bnorm[grp * GKA_CHECKPOINT + cb] = nb;
    }
}

// Kt [d][c] from K, after the copies have landed (F16: both converted to half, exact above 6.1e-5; each thread its
// own groups of the CTA's THREADS), fenced for the tensor cores
template <bool F16, int THREADS = GKA_WG_THREADS, typename Smem>
__device__ __forceinline__ void gka_wg_keys_transpose(Smem& sm, int tid) {
    const int BT = GKA_CHECKPOINT, D = GKA_SOLVE_DK;
    for (int i = tid; i < BT * D / 8; i += THREADS) {
        const int c = i % BT, j0 = i / BT * 8;
        __nv_bfloat16* kp = sm.K.hi + wgmma_tile_off(c, j0, D);
        uint4 v = *reinterpret_cast<const uint4*>(kp);
        if constexpr (F16) {
            uint32_t* w = reinterpret_cast<uint32_t*>(&v);
            #pragma unroll
            for (int q = 0; q < 4; q++) {
                const float2 kf = gka_unpack2<false>(w[q]);
                w[q] = gka_pack2<true>(kf.x, kf.y);
            }
            *reinterpret_cast<uint4*>(kp) = v;
        }
        const __nv_bfloat16* k8 = reinterpret_cast<const __nv_bfloat16*>(&v);
        #pragma unroll
        for (int e = 0; e < 8; e++) { sm.Kt.hi[wgmma_tile_off(j0 + e, c, BT)] = k8[e]; }
    }
    fence_proxy_async();
}

// The forward's f: quad_c = k_c^T H0 k_c from K H0 (both pieces of H0; F16: its tiles' scale undone by h0_back);
// (k_c.k_j)^2 M[c][j] weighted 2 for j < c, 1 for j = c (the |k_c|^4 term), 0 above, from K K^T: this
// warpgroup's columns of each (G warpgroups: 128 / G and 64 / G of them, in products of at most 64 columns), into
// the rows' parts. hy and s are the solve's accumulators, free here.
template <bool F16, int G = GKA_WG_GROUPS, typename Smem>
__device__ __forceinline__ void gka_wg_quad_gram(Smem& sm, float* hy, float* s, float h0_back, int grp, int ca,
                                                 int hc0, int sc0, int t4) {
    constexpr int NH = GKA_SOLVE_DK / G, NS = GKA_CHECKPOINT / G, NPH = NH < 64 ? NH : 64;
    wgmma_fence();
    #pragma unroll
    for (int q = 0; q < NH / NPH; q++) {
        gka_wgmma<NPH, 128, false, true, 8, F16>(hy + NPH / 2 * q, sm.K, sm.H0, hc0 + NPH * q, 0);
    }
    gka_wgmma<NS, 128, false, false, 8, F16>(s, sm.K, sm.K, sc0, 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold<NH / 2>(hy);
    wgmma_hold<NS / 2>(s);
    if constexpr (F16) {
        #pragma unroll
        for (int i = 0; i < NH / 2; i++) { hy[i] *= h0_back; }
    }
    gka_quad_gram_part<NH / 8, NS / 8>(sm, G, grp, hy, s, ca, hc0, sc0, t4, [&](int c, int j) {
        return gka_elem<F16>(sm.K.hi + wgmma_tile_off(c, j, GKA_SOLVE_DK));
    });
}

// The mixed solve (MIXED; dev/cuda/gka_core.cu version 11, bf16): the first GKA_MIXED_CHEAP_ITERS iterations (when
// at least as many follow; none at r < 30) take X H0 with x and H0 in one piece each (1 of its 3 products; X K^T
// and S K keep both pieces), the rest all of the trainer's pieces. The later iterations damp what the early ones got
// wrong (roughly by R^n over n iterations, spec 3.1's rate R = 0.754) and keep the trainer's fixed point; at r = 30,
// dev/cuda/gka_solve_precision.py's mixed table: 0.80 of the multiply-adds, o 1.3e-4 and dk 1.9e-4 against the
// trainer's 9.9e-5 and 1.1e-4; on one H200 (the lab, B=16 T=2048 H=6 dk=dv=128): forward 2.675 against 2.873 ms,
// forward+backward 7.15 against 7.54 ms.
#define GKA_MIXED_CHEAP_ITERS 15
// The incremental form (INCREMENT; dev/cuda/gka_core.cu version 15, the bf16 trainer's): the products take the
// iteration's step d = x - x_prev, rounded to one bf16 piece and applied as rounded (x <- x + d, exact in fp32 up to
// its own rounding), instead of x in two pieces; y = H x - b is kept up to date, y <- y + H d
// (gka_cheb_step_increment). H d is as exact as version 9's products make H x (H0 and S in two pieces, the keys
// exact), so y stays H x - b of the x the iteration holds, and the rounding of d is a perturbation of the iterate
// that the later iterations damp as they damp the initial error (spec 3.1's rate R per iteration: the step shrinks
// as R^n, its rounding with it), where x's own rounding in X H0 is not. 3.67M multiply-adds per chunk-iteration
// (d H0 in two products, d K^T in one, S K in two), 0.70 of version 9's 5.24M; dev/cuda/gka_solve_precision.py's
// incremental rows: x 1.5e-5, z 3.1e-5, o 1.3e-5, dk 4.2e-5 on the lab's inputs (version 9: 2.6e-6, 6.4e-6, 9.9e-5,
// 1.1e-4), the same fixed point at r = 400. H200: solve 1.62 ms under ncu, core forward 2.65 -> 2.35 ms,
// forward+backward 7.28 -> 6.65 ms (README: "gka's solve: the incremental form").
template <bool F16, bool MIXED = false, bool INCREMENT = false>
__global__ void __launch_bounds__(GKA_WG_THREADS, 1)
gka_chunk_solve_wgmma_kernel(float* sol, float* f, int compute_f, const float* rhs, const float* alpha,
                             const floatX* qkv, const float* g, GkaH0 h0, int T, int H, int dk, int dv, int iters,
                             float ridge) {
    static_assert(!INCREMENT || (!F16 && !MIXED), "the incremental form is the bf16 pieces' alone");
    extern __shared__ __align__(128) unsigned char gka_smem_solve_wg[];
    GkaSolveWgSmem sm((size_t)gka_smem_solve_wg, iters, NULL);
    const int BT = GKA_CHECKPOINT, D = GKA_SOLVE_DK, n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H;
    // the warpgroup broadcast from lane 0: the compiler then knows it uniform over the warp and makes the wgmma
    // descriptors, which depend on it, in uniform registers (an R2UR per descriptor before: the solve's
    // instructions 730M -> 590M, 2.69 -> 2.68 ms, H200)
    const int tid = threadIdx.x, grp = __shfl_sync(0xffffffffu, tid / 128, 0), lane = tid % 32, gq = lane >> 2;
    const int t4 = lane & 3, ca = 16 * (tid % 128 / 32) + gq, cb = ca + 8;   // this lane's rows ca, cb
    const int hc0 = GKA_WG_NH * grp, sc0 = GKA_WG_NS * grp;             // its warpgroup's first columns of HY, S
    const int NT = gka_chunks(T), L = min(BT, T - n * BT), DE = 2 * H * dk + H * dv;
    const size_t row0 = (size_t)b * T + (size_t)n * BT, e0 = row0 * H + hh;
    const size_t ck = (size_t)bh * NT + n;
    const int h0_groups = F16 && !compute_f ? D * D / 8 : GKA_H0T_ELEMS / 8;   // the fp16 adjoint: one piece
    gka_wg_copy_h0_keys(sm, h0.tiles + ck * GKA_H0T_ELEMS, h0_groups, qkv + row0 * DE + H * dk + hh * dk, L, dk, DE,
                        tid);
    float2* bl = sm.b + tid;
    gka_load_b_frags<GKA_WG_NTH>(bl, GKA_WG_THREADS, rhs, alpha, qkv, row0, e0, H, hh, dk, DE, L, ca, hc0, t4);
    if constexpr (F16) { gka_wg_b_norm_parts(sm.bnorm, bl, GKA_WG_THREADS, grp, ca, cb, t4); }
    gka_omegas(sm.om, iters, ridge, 32);   // by warp 1, while warp 0's thread 0 sums the decays
    gka_chunk_decays(sm.gl, sm.zeta, g, e0, H, L);
    cp_async_wait<0>();
    __syncthreads();
    gka_wg_keys_transpose<F16>(sm, tid);
    __syncthreads();
    const float h0f2 = h0.sq[ck];
    const float h0_back = F16 ? gka_h0_scale_back(h0f2) : 1.0f;   // the tiles' 2^-e of H0, undone
    float hy[4 * GKA_WG_NTH], s[4 * GKA_WG_NTS];
    if (compute_f) { gka_wg_quad_gram<F16>(sm, hy, s, h0_back, grp, ca, hc0, sc0, t4); }
    gka_solve_rows_finish<GKA_WG_GROUPS>(sm, compute_f, f, e0, H, L, h0f2, ridge);
    const GkaChebRow ra = gka_cheb_row(sm, ca), rb = gka_cheb_row(sm, cb);
    const float zeta_a = sm.zeta[ca] * h0_back, zeta_b = sm.zeta[cb] * h0_back;
    const float rs_a = F16 ? gka_f16_row_scale(sm.bnorm, sm.fr[ca], ca, ridge) : 1.0f;
    const float rs_b = F16 ? gka_f16_row_scale(sm.bnorm, sm.fr[cb], cb, ridge) : 1.0f;
    if constexpr (F16) {   // the rows' systems scaled: this thread's elements of b
        #pragma unroll
        for (int t = 0; t < GKA_WG_NTH; t++) {
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                float2& v = bl[(2 * t + h) * GKA_WG_THREADS];
                v = make_float2(v.x * (h ? rs_b : rs_a), v.y * (h ? rs_b : rs_a));
            }
        }
    }
    float x[GKA_WG_NTH][4], dx[GKA_WG_NTH][4];
    gka_cheb_start<GKA_WG_NTH>(x, dx, bl, GKA_WG_THREADS, ra.tau, rb.tau);
    // b in registers for the update (from shared memory: 2.69 -> 2.60 ms, H200); the incremental form's y = H x - b,
    // x_prev = 0: -b, and its first step d = x rounded
    float2 b_frags[2 * GKA_WG_NTH];
    #pragma unroll
    for (int i = 0; i < 2 * GKA_WG_NTH; i++) {
        const float2 v = bl[i * GKA_WG_THREADS];
        b_frags[i] = INCREMENT ? make_float2(-v.x, -v.y) : v;
    }
    if constexpr (INCREMENT) { gka_cheb_start_increment<GKA_WG_NTH>(x, dx); }
    float mk[4 * GKA_WG_NTS];   // M at this thread's elements of S, the same every iteration
    #pragma unroll
    for (int t = 0; t < GKA_WG_NTS; t++) {
        #pragma unroll
        for (int i = 0; i < 4; i++) { mk[4 * t + i] = GkaMaskLower{sm.gl}(i < 2 ? ca : cb, sc0 + 8 * t + 2 * t4 + i % 2); }
    }
    // this thread's elements in Xs and Ss: (ca, c0 + 8 t + 2 t4) at xo + 64 t, and row cb = ca + 8 a core matrix row
    // group (8 kd elements) further
    const int xo = wgmma_tile_off(ca, hc0 + 2 * t4, D), so = wgmma_tile_off(ca, sc0 + 2 * t4, BT);
    // a warpgroup's own columns of x and of S are register operands (gka_wgmma_ra) of its own k-steps, which
    // need nothing from the other warpgroup: they go to the tensor cores before the barrier that publishes the
    // other columns through Xs and Ss, and the other k-steps after it
    uint32_t xa[GKA_WG_NTH / 2][2][4];   // x's pieces (the incremental form: d's one), A fragments of its k-steps
    uint32_t sa[GKA_WG_NTS / 2][2][4];   // the masked S's pieces, the same
    const int kx_own = GKA_WG_NTH / 2 * grp, kx_other = GKA_WG_NTH / 2 - kx_own;   // k-steps of X (of 8)
    const int ks_own = GKA_WG_NTS / 2 * grp, ks_other = GKA_WG_NTS / 2 - ks_own;   // k-steps of S (of 4)
    constexpr bool X_LO = !INCREMENT;   // the products' operand's second piece (in X K^T; X H0 below)
    // the products' own k-step kk (of GKA_WG_NTH / 2): x's n-tiles 2 kk, 2 kk + 1 (the incremental form: d's) into
    // xa[kk], then S (+)= xa[kk] K^T and HY (+)= xa[kk] H0 at k-step kx_own + kk, queued (the caller commits); h0_lo
    // (std::true_type): X H0 with the second pieces of x and H0 (all but the mixed solve's first iterations)
    auto own_kstep = [&](int kk, auto h0_lo) {
        constexpr bool XH_LO = X_LO && decltype(h0_lo)::value, H0_LO = !F16 && (INCREMENT || decltype(h0_lo)::value);
        const float(*xop)[4] = INCREMENT ? dx : x;
        #pragma unroll
        for (int t = 2 * kk; t < 2 * kk + 2; t++) {
            gka_frag_words(xa, t, gka_pieces2<F16>(xop[t][0], xop[t][1]), gka_pieces2<F16>(xop[t][2], xop[t][3]));
        }
        wgmma_fence();
        gka_wgmma_ra<GKA_WG_NS, 1, D, false, F16, X_LO>(s, xa + kk, kx_own + kk, sm.K, sc0, kk > 0);
        gka_wgmma_ra<GKA_WG_NH, 1, D, H0_LO, F16, XH_LO>(hy, xa + kk, kx_own + kk, sm.H0, hc0, kk > 0);
    };
    // an iteration's products, HY = H x (the incremental form: H d), after its own k-steps have been queued (by
    // own_kstep: the other forms queue them just before, the incremental form as its update makes them)
    auto products = [&](auto h0_lo) {
        using H0Lo = decltype(h0_lo);
        constexpr bool XH_LO = X_LO && H0Lo::value, H0_LO = !F16 && (INCREMENT || H0Lo::value);
        #pragma unroll
        for (int t = 0; t < GKA_WG_NTH; t++) {   // the pieces into Xs while those run
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int o = xo + 64 * t + 8 * D * h, e = 2 * (t % 2) + h;
                *reinterpret_cast<uint32_t*>(sm.X.hi + o) = xa[t / 2][0][e];
                if (X_LO) { *reinterpret_cast<uint32_t*>(sm.X.lo + o) = xa[t / 2][1][e]; }
            }
        }
        fence_proxy_async();
        __syncthreads();   // Xs written by every warp
        wgmma_fence();
        gka_wgmma<GKA_WG_NS, D, X_LO, false, GKA_WG_NTH / 2, F16>(s, sm.X, sm.K, sc0, 1, kx_other);
        wgmma_commit();
        gka_wgmma<GKA_WG_NH, D, XH_LO, H0_LO, GKA_WG_NTH / 2, F16>(hy, sm.X, sm.H0, hc0, 1, kx_other);
        wgmma_commit();
        wgmma_wait<1>();   // the own k-steps and S's other ones
        wgmma_hold<4 * GKA_WG_NTS>(s);
        #pragma unroll
        for (int j = 0; j < GKA_WG_NTH / 2; j++) {
            wgmma_hold_a<4>(xa[j][0]);
            if (X_LO) { wgmma_hold_a<4>(xa[j][1]); }
        }
        #pragma unroll
        for (int t = 0; t < GKA_WG_NTS; t++) {   // S (.) M in pieces, into Ss while X H0 runs
            uint2 w[2];
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int o = so + 64 * t + 8 * BT * h, e = 4 * t + 2 * h;
                w[h] = gka_store2_pieces<F16>(sm.S.hi + o, sm.S.lo + o, s[e] * mk[e], s[e + 1] * mk[e + 1]);
            }
            gka_frag_words(sa, t, w[0], w[1]);
        }
        fence_proxy_async();
        wgmma_wait<0>();
        wgmma_hold<4 * GKA_WG_NTH>(hy);
        gka_frags_scale_rows<GKA_WG_NTH>(hy, zeta_a, zeta_b);   // HY = diag(zeta) HY
        wgmma_fence();
        gka_wgmma_ra<GKA_WG_NH, GKA_WG_NTS / 2, BT, false, F16>(hy, sa, ks_own, sm.Kt, hc0, 1);
        wgmma_commit();
        __syncthreads();   // Ss written by every warp, Xs read by every warpgroup's products
        wgmma_fence();
        gka_wgmma<GKA_WG_NH, BT, true, false, GKA_WG_NTS / 2, F16>(hy, sm.S, sm.Kt, hc0, 1, ks_other);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_hold<4 * GKA_WG_NTH>(hy);
        wgmma_hold_a<GKA_WG_NTS * 4>(&sa[0][0][0]);
    };
    if constexpr (INCREMENT) {
        // The update of iteration it queues the products' own k-steps of the next step d as it makes them (queue_next,
        // a compile-time constant: all but the last iteration), so that the tensor cores start on them while the rest
        // of the update runs (the same products in the same order on each accumulator as before: the same results,
        // bit for bit; H100, the lab: the two solves 4.02 -> 3.82 ms under ncu, core forward+backward 6.86 -> 6.75
        // ms). The loop is rotated, the update before the products, so that no wgmma is in flight at its back edge
        // (with one in flight there, or queued under a runtime test, ptxas serializes the solve's wgmmas: C7514)
        auto update = [&](int it, auto queue_next) {
            const float om = (float)sm.om[it], om1 = (float)(sm.om[it] - 1.0);
            gka_residual_increment<GKA_WG_NTH>(b_frags, hy);   // hy is free from here
            // y's sums made here, before the products that overwrite hy are queued: moved below them, the sums
            // would keep hy's old values in registers beside the products' (ptxas then serializes them: C7511)
            wgmma_hold<4 * GKA_WG_NTH>(&b_frags[0].x);
            #pragma unroll
            for (int kk = 0; kk < GKA_WG_NTH / 2; kk++) {
                gka_cheb_step_increment(x, dx, b_frags, 2 * kk, ra, rb, om, om1);
                if constexpr (decltype(queue_next)::value) { own_kstep(kk, std::true_type{}); }
            }
            if constexpr (decltype(queue_next)::value) { wgmma_commit(); }
        };
        #pragma unroll
        for (int kk = 0; kk < GKA_WG_NTH / 2; kk++) { own_kstep(kk, std::true_type{}); }   // the first step's
        wgmma_commit();
        products(std::true_type{});
        for (int it = 1; it < iters; it++) {   // iters >= 1 (the trainer's flags: [1, 1000])
            update(it - 1, std::true_type{});
            products(std::true_type{});
        }
        update(iters - 1, std::false_type{});
    } else {
        auto iteration = [&](int it, auto h0_lo) {
            #pragma unroll
            for (int kk = 0; kk < GKA_WG_NTH / 2; kk++) { own_kstep(kk, h0_lo); }
            wgmma_commit();
            products(h0_lo);
            const float om = (float)sm.om[it], om1 = (float)(sm.om[it] - 1.0);
            gka_cheb_step<GKA_WG_NTH>(x, dx, hy, b_frags, 1, ra, rb, om, om1);
        };
        // the mixed solve's first iterations, when at least as many follow in every piece
        const int cheap_iters = MIXED ? max(0, min(GKA_MIXED_CHEAP_ITERS, iters - GKA_MIXED_CHEAP_ITERS)) : 0;
        if constexpr (MIXED) {
            for (int it = 0; it < cheap_iters; it++) { iteration(it, std::false_type{}); }
        }
        for (int it = cheap_iters; it < iters; it++) { iteration(it, std::true_type{}); }
    }
    if constexpr (F16) {   // the rows' scales undone (powers of two: exact)
        gka_frags_scale_rows<GKA_WG_NTH>(&x[0][0], 1.0f / rs_a, 1.0f / rs_b);
    }
    gka_store_x_frags<GKA_WG_NTH>(sol, x, e0, H, dk, L, ca, hc0, t4);
    if (compute_f && tid < L) { f[e0 + (size_t)tid * H] = sm.fr[tid]; }
}

// ---- the lean solve (dev/cuda/gka_core.cu version 12, bf16 build, sm_90a): the fp16 solve with every operand in one
// piece (dev/cuda/gka_solve_precision.py's fp16 scheme 1, 1, 1, 1: 2.10M multiply-adds per chunk-iteration, 0.40 of the
// trainer's; half's 11 significand bits are TF32's, so this is the precision class of the official kernels' one TF32
// dot per product), laid out so that two CTAs share an SM. The wgmma solve above holds x, x's step, b, HY, S and the
// mask of its chunk in registers (214 of them per thread) and 183 KB of shared memory, one chunk per SM, whose
// iteration is a chain (products, a barrier, products, the update) that leaves the tensor cores idle half the time
// (ncu: tensor pipe 50%, 0.5 eligible warps per scheduler). Here a CTA keeps only x, its step and one accumulator at a
// time in registers (at most 128 with __launch_bounds__(.., 2)); b waits in shared memory as half, at a power of two of
// its row's own (gka_lean_b_unscale; the forward's q_hat is bf16 and exact in half at any scale that keeps it in
// range; the adjoint's alpha dQt rounds to 2^-12 there), and the mask is made again from the log decays in every iteration. Shared memory, 108 KB (110,976 bytes
// at r = 30): H0 (one piece, scaled as the fp16 solve's), K, Kt, and a region that holds H0's second piece while the
// forward makes quad_c, then X, S and b. An iteration: x into Xs, a barrier; S = X K^T and HY = X H0 queued together; S
// (.) M into Ss; HY = diag(zeta) HY; a barrier; HY += S K; the update.
#define GKA_LEAN_LDB (GKA_SOLVE_DK + 8)   // half row stride of the b tile (padded: a warp's pairs hit 32 banks)

struct GkaSolveLeanSmem : GkaSolveRows {   // quad, gram parts: the warpgroups
    GkaTile H0, K, Kt, X, S;   // one piece each: [128][128], [BT][128], [128][BT], [BT][128], [BT][BT]
    __half* b;                 // [BT][GKA_LEAN_LDB], this thread's elements of b (each read by its writer only)
    float* bnorm;              // [GKA_WG_GROUPS][BT]: the warpgroups' parts of ||b_c||^2
    double* om;                // [iters]
    __host__ __device__ GkaSolveLeanSmem(size_t base, int iters, size_t* bytes) {
        const int BT = GKA_CHECKPOINT, D = GKA_SOLVE_DK;
        SmemCarver c(base);
        take_rows(c, GKA_WG_GROUPS);
        H0 = gka_take_tile(c, (size_t)D * D, false);
        K = gka_take_tile(c, (size_t)BT * D, false);
        Kt = gka_take_tile(c, (size_t)D * BT, false);
        X = gka_take_tile(c, (size_t)BT * D, false);   // X, S and b follow each other: H0.lo's region (below)
        S = gka_take_tile(c, (size_t)BT * BT, false);
        b = c.take<__half>((size_t)BT * GKA_LEAN_LDB);
        H0.lo = X.hi;   // the forward's setup only (quad_c), before the first x is stored
        bnorm = c.take<float>((size_t)GKA_WG_GROUPS * BT);
        om = c.take<double>(iters);
        if (bytes) { *bytes = c.off; }
    }
};
static_assert((GKA_CHECKPOINT * GKA_SOLVE_DK + GKA_CHECKPOINT * GKA_CHECKPOINT + GKA_CHECKPOINT * GKA_LEAN_LDB)
                  >= GKA_SOLVE_DK * GKA_SOLVE_DK, "the lean solve: H0's second piece fits in the region of X, S, b");

static size_t gka_chunk_solve_lean_smem(int iters) { return gka_solve_smem_bytes<GkaSolveLeanSmem>(iters); }

__global__ void __launch_bounds__(GKA_WG_THREADS, 2)
gka_chunk_solve_lean_kernel(float* sol, float* f, int compute_f, const float* rhs, const float* alpha,
                            const floatX* qkv, const float* g, GkaH0 h0, int T, int H, int dk, int dv, int iters,
                            float ridge) {
    extern __shared__ __align__(128) unsigned char gka_smem_solve_lean[];
    GkaSolveLeanSmem sm((size_t)gka_smem_solve_lean, iters, NULL);
    const int BT = GKA_CHECKPOINT, D = GKA_SOLVE_DK, n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H;
    const int tid = threadIdx.x, grp = __shfl_sync(0xffffffffu, tid / 128, 0), lane = tid % 32, gq = lane >> 2;
    const int t4 = lane & 3, ca = 16 * (tid % 128 / 32) + gq, cb = ca + 8;
    const int hc0 = GKA_WG_NH * grp, sc0 = GKA_WG_NS * grp;
    const int NT = gka_chunks(T), L = min(BT, T - n * BT), DE = 2 * H * dk + H * dv;
    const size_t row0 = (size_t)b * T + (size_t)n * BT, e0 = row0 * H + hh;
    const size_t ck = (size_t)bh * NT + n;
    const int h0_groups = compute_f ? GKA_H0T_ELEMS / 8 : D * D / 8;   // the forward's quad_c: both pieces
    gka_wg_copy_h0_keys(sm, h0.tiles + ck * GKA_H0T_ELEMS, h0_groups, qkv + row0 * DE + H * dk + hh * dk, L, dk, DE,
                        tid);
    float2 bl[2 * GKA_WG_NTH];   // b in registers until its rows' scales are known
    gka_load_b_frags<GKA_WG_NTH>(bl, 1, rhs, alpha, qkv, row0, e0, H, hh, dk, DE, L, ca, hc0, t4);
    gka_wg_b_norm_parts(sm.bnorm, bl, 1, grp, ca, cb, t4);
    gka_omegas(sm.om, iters, ridge, 32);
    gka_chunk_decays(sm.gl, sm.zeta, g, e0, H, L);
    cp_async_wait<0>();
    __syncthreads();
    gka_wg_keys_transpose<true>(sm, tid);   // K to half in place, and Kt
    __syncthreads();
    const float h0f2 = h0.sq[ck];
    const float h0_back = gka_h0_scale_back(h0f2);
    float hy[4 * GKA_WG_NTH], s[4 * GKA_WG_NTS];
    if (compute_f) { gka_wg_quad_gram<true>(sm, hy, s, h0_back, grp, ca, hc0, sc0, t4); }   // H0 in both pieces
    gka_solve_rows_finish<GKA_WG_GROUPS>(sm, compute_f, f, e0, H, L, h0f2, ridge);   // its barriers end H0.lo's use
    const GkaChebRow ra = gka_cheb_row(sm, ca), rb = gka_cheb_row(sm, cb);
    const float zeta_a = sm.zeta[ca] * h0_back, zeta_b = sm.zeta[cb] * h0_back;
    // the rows' systems scaled (the scales made again after the iterations: fewer registers across them); b into
    // its tile
    const float rs_a = gka_f16_row_scale(sm.bnorm, sm.fr[ca], ca, ridge);
    const float rs_b = gka_f16_row_scale(sm.bnorm, sm.fr[cb], cb, ridge);
    const float bu_a = gka_lean_b_unscale(sm.bnorm, ca, rs_a), bu_b = gka_lean_b_unscale(sm.bnorm, cb, rs_b);
    const int bo = ca * GKA_LEAN_LDB + hc0 + 2 * t4;   // this thread's element (ca, hc0 + 2 t4); + 8 t, + 8 rows
    #pragma unroll
    for (int t = 0; t < GKA_WG_NTH; t++) {
        #pragma unroll
        for (int h = 0; h < 2; h++) {
            float2& v = bl[2 * t + h];
            v = make_float2(v.x * (h ? rs_b : rs_a), v.y * (h ? rs_b : rs_a));
            const float st = 1.0f / (h ? bu_b : bu_a);   // a power of two: exact
            *reinterpret_cast<__half2*>(sm.b + bo + 8 * t + 8 * GKA_LEAN_LDB * h) = __floats2half2_rn(v.x * st,
                                                                                                      v.y * st);
        }
    }
    float x[GKA_WG_NTH][4], dx[GKA_WG_NTH][4];
    gka_cheb_start<GKA_WG_NTH>(x, dx, bl, 1, ra.tau, rb.tau);
    const int xo = wgmma_tile_off(ca, hc0 + 2 * t4, D), so = wgmma_tile_off(ca, sc0 + 2 * t4, BT);
    const GkaMaskLower mask{sm.gl};
    for (int it = 0; it < iters; it++) {
        #pragma unroll
        for (int t = 0; t < GKA_WG_NTH; t++) {   // x into Xs (half, one piece)
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                *reinterpret_cast<uint32_t*>(sm.X.hi + xo + 64 * t + 8 * D * h) = gka_pack2<true>(x[t][2 * h],
                                                                                                 x[t][2 * h + 1]);
            }
        }
        fence_proxy_async();
        __syncthreads();   // Xs written by every warp; Ss read by every warpgroup's S K before
        wgmma_fence();
        gka_wgmma<GKA_WG_NS, D, false, false, D / 16, true>(s, sm.X, sm.K, sc0, 0);
        wgmma_commit();
        gka_wgmma<GKA_WG_NH, D, false, false, D / 16, true>(hy, sm.X, sm.H0, hc0, 0);
        wgmma_commit();
        wgmma_wait<1>();
        wgmma_hold<4 * GKA_WG_NTS>(s);
        #pragma unroll
        for (int t = 0; t < GKA_WG_NTS; t++) {   // S (.) M into Ss while X H0 runs
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int e = 4 * t + 2 * h, c = h ? cb : ca, j = sc0 + 8 * t + 2 * t4;
                *reinterpret_cast<uint32_t*>(sm.S.hi + so + 64 * t + 8 * BT * h) =
                    gka_pack2<true>(s[e] * mask(c, j), s[e + 1] * mask(c, j + 1));
            }
        }
        fence_proxy_async();
        wgmma_wait<0>();
        wgmma_hold<4 * GKA_WG_NTH>(hy);
        gka_frags_scale_rows<GKA_WG_NTH>(hy, zeta_a, zeta_b);   // HY = diag(zeta) HY
        __syncthreads();   // Ss written by every warp, Xs read by every warpgroup's products
        wgmma_fence();
        gka_wgmma<GKA_WG_NH, BT, false, false, BT / 16, true>(hy, sm.S, sm.Kt, hc0, 1);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_hold<4 * GKA_WG_NTH>(hy);
        float2 bq[2 * GKA_WG_NTH];
        #pragma unroll
        for (int t = 0; t < GKA_WG_NTH; t++) {
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const __half2* bp = reinterpret_cast<const __half2*>(sm.b + bo + 8 * t + 8 * GKA_LEAN_LDB * h);
                const float2 v = __half22float2(*bp);
                bq[2 * t + h] = make_float2(v.x * (h ? bu_b : bu_a), v.y * (h ? bu_b : bu_a));
            }
        }
        const float om = (float)sm.om[it], om1 = (float)(sm.om[it] - 1.0);
        gka_cheb_step<GKA_WG_NTH>(x, dx, hy, bq, 1, ra, rb, om, om1);
    }
    const float us_a = 1.0f / gka_f16_row_scale(sm.bnorm, sm.fr[ca], ca, ridge);
    const float us_b = 1.0f / gka_f16_row_scale(sm.bnorm, sm.fr[cb], cb, ridge);
    gka_frags_scale_rows<GKA_WG_NTH>(&x[0][0], us_a, us_b);   // the rows' scales undone (powers of two: exact)
    gka_store_x_frags<GKA_WG_NTH>(sol, x, e0, H, dk, L, ca, hc0, t4);
    if (compute_f && tid < L) { f[e0 + (size_t)tid * H] = sm.fr[tid]; }
}

// ---- the solo solve (dev/cuda/gka_core.cu version 13, bf16 build, sm_90a): a warpgroup alone on its chunk, two
// chunks per SM. The wgmma solve above splits a chunk's columns between two warpgroups, which must meet twice per
// iteration (x's other columns through Xs, then S's through Ss) and so run one chain (products, barrier, products,
// barrier, update) with nothing beside it: ncu measured its tensor pipe half idle. Here one warpgroup owns all 128
// columns of its 64 rows, so x and S are register operands of every k-step (gka_wgmma_ra) and an iteration has no
// barrier at all: S = X K^T, then HY = X H0 queued behind it; S (.) M into pieces while X H0 runs; HY = diag(zeta) HY;
// HY += S K; the update. A CTA is the one warpgroup (GKA_SOLO_THREADS), and two fit an SM (__launch_bounds__(.., 2):
// 255 registers a thread, 111 KB of shared memory each), so that one chunk's products run while the other's
// elementwise work does. The same operand pieces as the wgmma solve (F16: as its fp16 solve), with two
// differences that the register file asks for: x lives only as its two pieces, the A fragments (x_k + dx rounded to
// them in every iteration: 16 of fp32's 24 significand bits, 22 with F16; the emulator measures x as accurate as the
// wgmma solve's), and b is read again from global memory (L2) in every update instead of kept (with b's loads in
// the update, 64 more registers would be live); the decay mask is made again in every iteration (the lean solve's
// way), and the steps dx of x's first GKA_SOLO_DXS n-tiles wait in shared memory (ptxas spilled 500 bytes without).
// Shared memory: H0 (two pieces: 64 KB; with F16 the second serves the forward's quad_c only), K, Kt, those steps.
#define GKA_SOLO_THREADS 128
#define GKA_SOLO_NTH (GKA_SOLVE_DK / 8)     // n-tiles of x and HY per thread
#define GKA_SOLO_NTS (GKA_CHECKPOINT / 8)   // of S
#define GKA_SOLO_DXS 6                      // x's first n-tiles whose steps dx wait in shared memory (registers)

struct GkaSolveSoloSmem : GkaSolveRows {   // quad, gram: one part
    GkaTile H0, K, Kt;   // [128][128] (two pieces), [BT][128], [128][BT]
    float* bnorm;        // [BT] ||b_c||^2 (the fp16 solve's row scales)
    float* dxs;          // [GKA_SOLO_DXS][4][GKA_SOLO_THREADS]: those steps, each thread's own
    double* om;          // [iters]
    __host__ __device__ GkaSolveSoloSmem(size_t base, int iters, size_t* bytes) {
        const int BT = GKA_CHECKPOINT, D = GKA_SOLVE_DK;
        SmemCarver c(base);
        take_rows(c, 1);
        H0 = gka_take_tile(c, (size_t)D * D, true);
        K = gka_take_tile(c, (size_t)BT * D, false);
        Kt = gka_take_tile(c, (size_t)D * BT, false);
        bnorm = c.take<float>(BT);
        dxs = c.take<float>((size_t)GKA_SOLO_DXS * 4 * GKA_SOLO_THREADS);
        om = c.take<double>(iters);
        if (bytes) { *bytes = c.off; }
    }
};

static size_t gka_chunk_solve_solo_smem(int iters) { return gka_solve_smem_bytes<GkaSolveSoloSmem>(iters); }

// n-tile t of x from its pieces in the A fragments (the inverse of gka_frag_words): x4[0 .. 1] of row ca, x4[2 .. 3]
// of row cb
template <bool F16>
__device__ __forceinline__ void gka_frag_x(float x4[4], const uint32_t (*a)[2][4], int t) {
    #pragma unroll
    for (int h = 0; h < 2; h++) {
        const float2 hi = gka_unpack2<F16>(a[t / 2][0][2 * (t % 2) + h]);
        const float2 lo = gka_unpack2<F16>(a[t / 2][1][2 * (t % 2) + h]);
        x4[2 * h] = hi.x + lo.x;
        x4[2 * h + 1] = hi.y + lo.y;
    }
}

template <bool F16>
__global__ void __launch_bounds__(GKA_SOLO_THREADS, 2)
gka_chunk_solve_solo_wgmma_kernel(float* sol, float* f, int compute_f, const float* rhs, const float* alpha,
                                  const floatX* qkv, const float* g, GkaH0 h0, int T, int H, int dk, int dv,
                                  int iters, float ridge) {
    extern __shared__ __align__(128) unsigned char gka_smem_solve_solo[];
    GkaSolveSoloSmem sm((size_t)gka_smem_solve_solo, iters, NULL);
    const int BT = GKA_CHECKPOINT, D = GKA_SOLVE_DK, n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H;
    const int tid = threadIdx.x, lane = tid % 32, gq = lane >> 2, t4 = lane & 3;
    const int ca = 16 * __shfl_sync(0xffffffffu, tid / 32, 0) + gq, cb = ca + 8;   // this lane's rows ca, cb
    const int NT = gka_chunks(T), L = min(BT, T - n * BT), DE = 2 * H * dk + H * dv;
    const size_t row0 = (size_t)b * T + (size_t)n * BT, e0 = row0 * H + hh;
    const size_t ck = (size_t)bh * NT + n;
    const int h0_groups = F16 && !compute_f ? D * D / 8 : GKA_H0T_ELEMS / 8;   // the fp16 adjoint: one piece
    gka_wg_copy_h0_keys<GKA_SOLO_THREADS>(sm, h0.tiles + ck * GKA_H0T_ELEMS, h0_groups,
                                          qkv + row0 * DE + H * dk + hh * dk, L, dk, DE, tid);
    float2 bl[2 * GKA_SOLO_NTH];   // b, for x's start and the row scales
    gka_load_b_frags<GKA_SOLO_NTH>(bl, 1, rhs, alpha, qkv, row0, e0, H, hh, dk, DE, L, ca, 0, t4);
    if constexpr (F16) { gka_wg_b_norm_parts<GKA_SOLO_NTH>(sm.bnorm, bl, 1, 0, ca, cb, t4); }
    gka_omegas(sm.om, iters, ridge, 32);   // by warp 1, while warp 0's thread 0 sums the decays
    gka_chunk_decays(sm.gl, sm.zeta, g, e0, H, L);
    cp_async_wait<0>();
    __syncthreads();
    gka_wg_keys_transpose<F16, GKA_SOLO_THREADS>(sm, tid);
    __syncthreads();
    const float h0f2 = h0.sq[ck];
    const float h0_back = F16 ? gka_h0_scale_back(h0f2) : 1.0f;   // the tiles' 2^-e of H0, undone
    float hy[4 * GKA_SOLO_NTH], s[4 * GKA_SOLO_NTS];
    if (compute_f) { gka_wg_quad_gram<F16, 1>(sm, hy, s, h0_back, 0, ca, 0, 0, t4); }
    gka_solve_rows_finish<1>(sm, compute_f, f, e0, H, L, h0f2, ridge);
    const GkaChebRow ra = gka_cheb_row(sm, ca), rb = gka_cheb_row(sm, cb);
    const float zeta_a = sm.zeta[ca] * h0_back, zeta_b = sm.zeta[cb] * h0_back;
    const float rs_a = F16 ? gka_f16_row_scale<1>(sm.bnorm, sm.fr[ca], ca, ridge) : 1.0f;
    const float rs_b = F16 ? gka_f16_row_scale<1>(sm.bnorm, sm.fr[cb], cb, ridge) : 1.0f;
    // b's rows as the updates read them again: alpha (the adjoint's) times the row's scale (a power of two: the
    // same products as bl's, scaled below)
    // 0 past the sequence's end, where the row's source is the chunk's first row
    auto b_scale = [&](int c, float rs) { return (rhs ? gka_b_alpha(rhs, alpha, e0, H, L, c) : c < L) * rs; };
    auto b_src = [&](int c) {
        const size_t r = c < L ? c : 0;
        return rhs ? (e0 + r * H) * dk : (row0 + r) * DE + hh * dk;
    };
    const float bs_a = b_scale(ca, rs_a), bs_b = b_scale(cb, rs_b);
    const size_t src_a = b_src(ca), src_b = b_src(cb);
    if constexpr (F16) {
        #pragma unroll
        for (int i = 0; i < 2 * GKA_SOLO_NTH; i++) {
            const float r = i % 2 ? rs_b : rs_a;
            bl[i] = make_float2(bl[i].x * r, bl[i].y * r);
        }
    }
    uint32_t xa[GKA_SOLO_NTH / 2][2][4];   // x: its pieces as the A fragments of its 16-column k-steps
    uint32_t sa[GKA_SOLO_NTS / 2][2][4];   // the masked S's pieces, the same
    float dx[GKA_SOLO_NTH][4];   // its first GKA_SOLO_DXS n-tiles in sm.dxs
    float* dxs = sm.dxs + tid;
    {
        float x[GKA_SOLO_NTH][4];
        gka_cheb_start<GKA_SOLO_NTH>(x, dx, bl, 1, ra.tau, rb.tau);
        #pragma unroll
        for (int t = 0; t < GKA_SOLO_NTH; t++) {
            gka_frag_words(xa, t, gka_pieces2<F16>(x[t][0], x[t][1]), gka_pieces2<F16>(x[t][2], x[t][3]));
            #pragma unroll
            for (int i = 0; i < 4 && t < GKA_SOLO_DXS; i++) { dxs[(4 * t + i) * GKA_SOLO_THREADS] = dx[t][i]; }
        }
    }
    const float gla = sm.gl[ca], glb = sm.gl[cb];
    for (int it = 0; it < iters; it++) {
        wgmma_fence();
        gka_wgmma_ra<64, GKA_SOLO_NTH / 2, D, false, F16>(s, xa, 0, sm.K, 0, 0);   // S = X K^T
        wgmma_commit();
        #pragma unroll
        for (int q = 0; q < 2; q++) {   // HY = X H0, in two products of 64 columns
            gka_wgmma_ra<64, GKA_SOLO_NTH / 2, D, !F16, F16>(hy + 32 * q, xa, 0, sm.H0, 64 * q, 0);
        }
        wgmma_commit();
        wgmma_wait<1>();
        wgmma_hold<4 * GKA_SOLO_NTS>(s);
        #pragma unroll
        for (int t = 0; t < GKA_SOLO_NTS; t++) {   // S (.) M in pieces while X H0 runs
            const int j = 8 * t + 2 * t4;
            const float2 glj = *reinterpret_cast<const float2*>(sm.gl + j);
            uint2 w[2];
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int c = h ? cb : ca, e = 4 * t + 2 * h;
                const float glc = h ? glb : gla;
                const float m0 = j <= c ? __expf(glc - glj.x) : 0.0f, m1 = j + 1 <= c ? __expf(glc - glj.y) : 0.0f;
                w[h] = gka_pieces2<F16>(s[e] * m0, s[e + 1] * m1);
            }
            gka_frag_words(sa, t, w[0], w[1]);
        }
        wgmma_wait<0>();
        wgmma_hold<4 * GKA_SOLO_NTH>(hy);
        wgmma_hold_a<GKA_SOLO_NTH * 4>(&xa[0][0][0]);
        gka_frags_scale_rows<GKA_SOLO_NTH>(hy, zeta_a, zeta_b);   // HY = diag(zeta) HY
        wgmma_fence();
        #pragma unroll
        for (int q = 0; q < 2; q++) {   // HY += S K
            gka_wgmma_ra<64, GKA_SOLO_NTS / 2, BT, false, F16>(hy + 32 * q, sa, 0, sm.Kt, 64 * q, 1);
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_hold<4 * GKA_SOLO_NTH>(hy);
        wgmma_hold_a<GKA_SOLO_NTS * 4>(&sa[0][0][0]);
        const float om = (float)sm.om[it], om1 = (float)(sm.om[it] - 1.0);
        #pragma unroll
        for (int t = 0; t < GKA_SOLO_NTH; t++) {   // the update, an n-tile at a time
            float x[1][4];
            gka_frag_x<F16>(x[0], xa, t);
            float2 bq[2] = {make_float2(0.0f, 0.0f), make_float2(0.0f, 0.0f)};
            if (8 * t < dk) {   // dk a multiple of 8
                #pragma unroll
                for (int h = 0; h < 2; h++) {
                    const size_t o = (h ? src_b : src_a) + 8 * t + 2 * t4;
                    const float2 v = rhs ? *reinterpret_cast<const float2*>(rhs + o)
                                         : __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(qkv + o));
                    const float bs = h ? bs_b : bs_a;
                    bq[h] = make_float2(v.x * bs, v.y * bs);
                }
            }
            if (t < GKA_SOLO_DXS) {
                #pragma unroll
                for (int i = 0; i < 4; i++) { dx[t][i] = dxs[(4 * t + i) * GKA_SOLO_THREADS]; }
            }
            gka_cheb_step<1>(x, reinterpret_cast<float(*)[4]>(dx[t]), hy + 4 * t, bq, 1, ra, rb, om, om1);
            if (t < GKA_SOLO_DXS) {
                #pragma unroll
                for (int i = 0; i < 4; i++) { dxs[(4 * t + i) * GKA_SOLO_THREADS] = dx[t][i]; }
            }
            gka_frag_words(xa, t, gka_pieces2<F16>(x[0][0], x[0][1]), gka_pieces2<F16>(x[0][2], x[0][3]));
        }
    }
    float x[GKA_SOLO_NTH][4];
    #pragma unroll
    for (int t = 0; t < GKA_SOLO_NTH; t++) { gka_frag_x<F16>(x[t], xa, t); }
    if constexpr (F16) {   // the rows' scales undone (powers of two: exact)
        gka_frags_scale_rows<GKA_SOLO_NTH>(&x[0][0], 1.0f / rs_a, 1.0f / rs_b);
    }
    gka_store_x_frags<GKA_SOLO_NTH>(sol, x, e0, H, dk, L, ca, 0, t4);
    if (compute_f && tid < L) { f[e0 + (size_t)tid * H] = sm.fr[tid]; }
}

// ---- the readout and dQt on register tiles (version 5's, with the solve's warp layout and bf16 pieces): P =
// diag(zeta) A Ust + ((A Bt^T) (.) M) Ct, as gka_chunk_product_kernel, one CTA of GKA_SOLVE_THREADS per (chunk,
// b*H + h); block b of four warps owns rows 16 b .., warp p of it the columns 32 p .. of P and 16 p .. of S.
//   readout (DQT false): A = Qt (two pieces: it carries x), Bt = K, Ct = V, Ust = U0 (stored [k][n]); o = s P
//   dQt (DQT true):      A = dO (bf16),                  Bt = V, Ct = K, Ust = U0^T (U0 read as [n][k]); dQt = s P
// U0 and S in two pieces each: Qt's large part along directions no key spans meets every entry of U0, and dQt
// feeds the adjoint solve, which magnifies an error off the keys' span (the solve kernel's header); the keys and
// values are bf16 already. Padded to 128 columns with zeros (dk, dv <= 128).

struct GkaProductSmem {
    float *gl, *zeta;   // [BT] each
    GkaTile A, U, Bt, Ct, S;   // [BT][LDK] (two pieces for Qt), [128][LDK] (two), [BT][LDK], [BT][LDK], [BT][LDS] (two)
    __host__ __device__ GkaProductSmem(size_t base, size_t* bytes) {
        const int BT = GKA_CHECKPOINT;
        SmemCarver c(base);
        gl = c.take<float>(BT);
        zeta = c.take<float>(BT);
        A = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDK, true);
        U = gka_take_tile(c, (size_t)GKA_SOLVE_DK * GKA_SOLVE_LDK, true);
        Bt = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDK, false);
        Ct = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDK, false);
        S = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDS, true);
        if (bytes) { *bytes = c.off; }
    }
};

static size_t gka_chunk_product_mma_smem() {
    size_t bytes = 0;
    GkaProductSmem sm(0, &bytes);
    return bytes;
}

template <bool DQT>
__global__ void __launch_bounds__(GKA_SOLVE_THREADS, 1)
gka_chunk_product_mma_kernel(floatX* o, float* dQt, const float* x, const floatX* dO, const floatX* qkv,
                             const float* alpha, const float* g, const float* Uck, int T, int H, int dk, int dv,
                             float scale) {
    extern __shared__ __align__(128) unsigned char gka_smem_product_mma[];
    GkaProductSmem sm((size_t)gka_smem_product_mma, NULL);
    const int BT = GKA_CHECKPOINT, n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H, tid = threadIdx.x;
    const int lane = tid % 32, warp = tid / 32, blk = warp / GKA_SOLVE_WPR, part = warp % GKA_SOLVE_WPR;
    const int gq = lane >> 2, t4 = lane & 3, r0 = 16 * blk;
    const int hc0 = 8 * GKA_SOLVE_NTH * part, sc0 = 8 * GKA_SOLVE_NTS * part;
    const int NT = gka_chunks(T), L = min(BT, T - n * BT), DE = 2 * H * dk + H * dv;
    const size_t row0 = (size_t)b * T + (size_t)n * BT, e0 = row0 * H + hh;
    gka_chunk_decays(sm.gl, sm.zeta, g, e0, H, L);
    const float* U0 = Uck + ((size_t)bh * NT + n) * dk * dv;
    gka_set_pieces(sm.U, U0, dv, dk, dv, GKA_SOLVE_DK);
    const __nv_bfloat16* kq = qkv + H * dk + hh * dk;        // the head's keys, values in qkv's rows
    const __nv_bfloat16* vq = qkv + 2 * H * dk + hh * dv;
    gka_load_bf16_rows(sm.Bt.hi, DQT ? vq : kq, DE, row0, 0, DQT ? dv : dk, L);
    gka_load_bf16_rows(sm.Ct.hi, DQT ? kq : vq, DE, row0, 0, DQT ? dk : dv, L);
    if (DQT) {
        gka_load_bf16_rows(sm.A.hi, dO, (size_t)H * dv, row0, hh * dv, dv, L);
    } else {
        gka_set_qt_pieces(sm.A, qkv, alpha, x, row0, e0, H, hh, dk, DE, L);
    }
    __syncthreads();
    gka_masked_s<!DQT, false>(sm.S, sm.A, sm.Bt, r0, sc0, lane, GkaMaskLower{sm.gl});   // this warp's 16 rows x columns sc0 ..
    named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);
    // P = diag(zeta) A Ust + S Ct: this warp's 16 rows x columns hc0 .. (32 at a time)
    const float zeta_a = sm.zeta[r0 + gq], zeta_b = sm.zeta[r0 + gq + 8];
    #pragma unroll
    for (int q = 0; q < GKA_SOLVE_NTH / 4; q++) {
        float p[4][4];
        const int n0 = hc0 + 32 * q;
        gka_chunk_rows_product<!DQT, !DQT>(p, sm.A, sm.U, sm.S, sm.Ct, zeta_a, zeta_b, r0, n0, lane);
        #pragma unroll
        for (int h = 0; h < 2; h++) {
            const int c = r0 + gq + 8 * h;
            if (c >= L) { continue; }
            #pragma unroll
            for (int t = 0; t < 4; t++) {
                #pragma unroll
                for (int u = 0; u < 2; u++) {
                    const int j = n0 + 8 * t + 2 * t4 + u;
                    const float v = scale * p[t][2 * h + u];
                    if (DQT && j < dk) { dQt[(e0 + (size_t)c * H) * dk + j] = v; }
                    if (!DQT && j < dv) { o[(row0 + c) * H * dv + hh * dv + j] = from_float<floatX>(v); }
                }
            }
        }
    }
}

#endif // ENABLE_BF16

// ---- the readout (spec 5.1(e, f)) and the backward's dQt (5.2 pass 1), one CTA of GKA_CHUNK_THREADS per
// (chunk, b*H + h). Both are P = diag(zeta) A Ust + ((A Bt^T) (.) M) Ct for row tiles A, Bt, Ct of the chunk and a
// state Ust (U0 for the readout, U0^T for dQt):
//   readout: A = Qt = q_hat + alpha (x - q_hat), Bt = K, Ct = V, Ust = U0;   o = s P           [BT][dv]
//   dQt:     A = dO, Bt = V, Ct = K, Ust = U0^T;                             dQt = s P         [BT][dk]

static size_t gka_chunk_product_smem(int dk, int dv) {
    const size_t BT = GKA_CHECKPOINT, ldk = gka_lds(dk), ldv = gka_lds(dv), ldb = gka_lds(BT);
    return ((size_t)gka_pad(dk) * ldv + BT * (2 * ldk + 2 * ldv) + BT * ldb + 2 * BT) * sizeof(float);
}

// readout (dqt = 0): o = s [diag(zeta) Qt U0 + ((Qt K^T) (.) M) V]; dQt (dqt = 1): s [diag(zeta) dO U0^T + ((dO V^T) (.) M) K]
template <bool TC>
__global__ void __launch_bounds__(GKA_CHUNK_THREADS)
gka_chunk_product_kernel(floatX* o, float* dQt, const float* x, const floatX* dO, const floatX* qkv,
                         const float* alpha, const float* g, const float* Uck, int T, int H, int dk, int dv,
                         float scale) {
    extern __shared__ float gka_smem_prod[];
    const int BT = GKA_CHECKPOINT, n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H, tid = threadIdx.x;
    const int NT = gka_chunks(T), L = min(BT, T - n * BT), DE = 2 * H * dk + H * dv;
    const int dkp = gka_pad(dk), dvp = gka_pad(dv), ldk = gka_lds(dk), ldv = gka_lds(dv), ldb = gka_lds(BT);
    float* U0 = gka_smem_prod;             // [dkp][ldv]
    float* Ks = U0 + dkp * ldv;            // [BT][ldk]
    float* Qs = Ks + BT * ldk;             // [BT][ldk] Qt (readout) or the product (dQt)
    float* Vs = Qs + BT * ldk;             // [BT][ldv]
    float* Ds = Vs + BT * ldv;             // [BT][ldv] dO (dQt)
    float* Os = Ds;                        // [BT][ldv] the product (readout: it has no dO)
    float* S = Os + BT * ldv;              // [BT][ldb]
    float* gl = S + BT * ldb;
    float* zeta = gl + BT;
    const size_t r0 = (size_t)b * T + (size_t)n * BT, e0 = r0 * H + hh;
    const int dqt = dQt != NULL;
    gka_chunk_decays(gl, zeta, g, e0, H, L);
    gka_load_state(U0, ldv, Uck + ((size_t)bh * NT + n) * dk * dv, dk, dv);
    gka_load_rows(Ks, ldk, qkv, DE, r0, H * dk + hh * dk, dk, L);
    gka_load_rows(Vs, ldv, qkv, DE, r0, 2 * H * dk + hh * dv, dv, L);
    if (dqt) {
        gka_load_rows(Ds, ldv, dO, (size_t)H * dv, r0, hh * dv, dv, L);
    } else {
        gka_load_qt(Qs, ldk, qkv, alpha, x, r0, e0, H, hh, dk, DE, L);
    }
    __syncthreads();
    if (dqt) {
        gka_mm<TC, false, true>(Qs, ldk, Ds, ldv, U0, ldv, BT, dkp, dvp, false, false);   // dO U0^T
        gka_mm<TC, false, true>(S, ldb, Ds, ldv, Vs, ldv, BT, BT, dvp, false);            // dO V^T
        gka_mask_scale(S, ldb, Qs, ldk, dkp, gl, zeta);
        gka_mm<TC, false, false>(Qs, ldk, S, ldb, Ks, ldk, BT, dkp, BT, true);             // + (. (.) M) K
        for (int idx = tid; idx < L * dk; idx += blockDim.x) {
            const int c = idx / dk, j = idx % dk;
            dQt[(e0 + (size_t)c * H) * dk + j] = scale * Qs[c * ldk + j];
        }
    } else {
        gka_mm<TC, false, false>(Os, ldv, Qs, ldk, U0, ldv, BT, dvp, dkp, false, false);   // Qt U0
        gka_mm<TC, false, true>(S, ldb, Qs, ldk, Ks, ldk, BT, BT, dkp, false);             // Qt K^T
        gka_mask_scale(S, ldb, Os, ldv, dvp, gl, zeta);
        gka_mm<TC, false, false>(Os, ldv, S, ldb, Vs, ldv, BT, dvp, BT, true);             // + (. (.) M) V
        for (int idx = tid; idx < L * dv; idx += blockDim.x) {
            const int c = idx / dv, j = idx % dv;
            o[(r0 + c) * H * dv + hh * dv + j] = from_float<floatX>(scale * Os[c * ldv + j]);
        }
    }
}

// ---- backward 3: the rest of spec 3.2, recurrent, grid B*H, block GKA_CORE_THREADS. With dqt_t (dQt) and z_t (Z,
// the adjoint solve) from the chunk kernels, per token backwards:
//   dq_hat = (1 - alpha) dqt + z;  dalpha = dqt.(x - q_hat);  w = 2a (x.z)/f
//   DU <- gp DU + s qt dO^T;  DH <- gp DH - (z x^T + (w/2) H_t)
//   dk = (DH + DH^T) k + DU v;  dv = DU^T k;  dg = gamma (<DH, H_{t-1}> + <DU, U_{t-1}>)
// gp is the pending decay (the gamma of the token after this one: DH, DU <- gamma DH, gamma DU is applied lazily).
// DH, DU live in shared memory; each segment's states, recomputed from its checkpoint, stream through seg (global,
// GKA_CHECKPOINT states per CTA; never H_{t-1} = (H_t - k k^T)/gamma).

static size_t gka_core_backward_smem(int dk, int dv) {
    return ((size_t)dk * gka_ld(dk) + (size_t)dk * gka_ld(dv) + 6 * (size_t)dk + 2 * (size_t)dv + 8 * 128 + 32)
           * sizeof(float);
}

// The backward's recomputation of one segment (spec 3.2): from its checkpoint (Hc, Uc, the states before its first
// token), segH[s] = H_t and segU[s] = U_t of its L tokens t = r0 .. r0 + L - 1 (global rows of the head), one
// token after the other (never H_{t-1} = (H_t - k k^T)/gamma). k, v: shared [dk], [dv] workspace. Ends with
// __syncthreads(): the states are visible to the whole CTA.
__device__ void gka_recompute_segment(float* segH, float* segU, const float* Hc, const float* Uc, float* k, float* v,
                                      const floatX* qkv, const float* g, size_t r0, int L, int H, int hh, int dk,
                                      int dv) {
    const int tid = threadIdx.x, nth = blockDim.x, DE = 2 * H * dk + H * dv;
    const size_t dkdk = (size_t)dk * dk, dkdv = (size_t)dk * dv;
    for (int s = 0; s < L; s++) {
        const size_t r = r0 + s;
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
    __syncthreads();
}

__global__ void __launch_bounds__(GKA_CORE_THREADS)
gka_core_backward_kernel(float* dqkv, float* dalpha, float* dg, float* seg, const float* dQt, const float* Z,
                         const floatX* dO, const float* Hck, const float* Uck, const floatX* qkv, const float* alpha,
                         const float* g, const float* x, const float* f, int T, int H, int dk, int dv, float ridge,
                         float scale) {
    extern __shared__ float gka_smem_bwd[];
    float* DH = gka_smem_bwd;              // [dk][dk + 4]
    float* DU = DH + dk * gka_ld(dk);      // [dk][dv + 4]
    float* q = DU + dk * gka_ld(dv);
    float* k = q + dk;
    float* xt = k + dk;
    float* qt = xt + dk;
    float* z = qt + dk;
    float* rowsum = z + dk;                // (DH k + DU v), the row map's part of dk
    float* v = rowsum + dk;
    float* dOt = v + dv;
    float* colH = dOt + dv;                // [4][128] column-map partial sums of DH^T k
    float* colU = colH + 4 * 128;          // [4][128] ... of DU^T k
    float* red = colU + 4 * 128;
    const int bh = blockIdx.x, b = bh / H, hh = bh % H, tid = threadIdx.x, nth = blockDim.x;
    const int i = tid >> 2, quarter = tid & 3, j = tid & 127, part = tid >> 7;
    const int DE = 2 * H * dk + H * dv, NT = gka_segments(T), ldh = gka_ld(dk), ldu = gka_ld(dv);
    const size_t dkdk = (size_t)dk * dk, dkdv = (size_t)dk * dv;
    float* segH = seg + (size_t)bh * GKA_CHECKPOINT * (dkdk + dkdv);   // [CK][dk][dk] H_t of the segment's tokens
    float* segU = segH + (size_t)GKA_CHECKPOINT * dkdk;                // [CK][dk][dv]
    for (int idx = tid; idx < dk * ldh; idx += nth) { DH[idx] = 0.0f; }
    for (int idx = tid; idx < dk * ldu; idx += nth) { DU[idx] = 0.0f; }
    float gp = 1.0f;
    for (int n = NT - 1; n >= 0; n--) {
        const int t0 = n * GKA_CHECKPOINT, L = min(GKA_CHECKPOINT, T - t0);
        const float* Hc = Hck + ((size_t)bh * NT + n) * dkdk;
        const float* Uc = Uck + ((size_t)bh * NT + n) * dkdv;
        gka_recompute_segment(segH, segU, Hc, Uc, k, v, qkv, g, (size_t)b * T + t0, L, H, hh, dk, dv);
        for (int s = L - 1; s >= 0; s--) {
            const size_t r = (size_t)b * T + t0 + s, e = r * H + hh;
            const float* Ht = segH + (size_t)s * dkdk;
            const float* Hp = s == 0 ? Hc : segH + (size_t)(s - 1) * dkdk;
            const float* Up = s == 0 ? Uc : segU + (size_t)(s - 1) * dkdv;
            const floatX* row = qkv + r * DE;
            const float al = alpha[e], ft = f[e], gam = expf(g[e]);
            float dqt = 0.0f;
            if (tid < dk) {
                q[tid] = to_float(row[hh * dk + tid]);
                k[tid] = to_float(row[H * dk + hh * dk + tid]);
                xt[tid] = x[e * dk + tid];
                qt[tid] = q[tid] + al * (xt[tid] - q[tid]);
                z[tid] = Z[e * dk + tid];
                dqt = dQt[e * dk + tid];
                dqkv[r * DE + hh * dk + tid] = (1.0f - al) * dqt + z[tid];
            }
            if (tid < dv) {
                v[tid] = to_float(row[2 * H * dk + hh * dv + tid]);
                dOt[tid] = to_float(dO[r * H * dv + hh * dv + tid]);
            }
            const float da = gka_block_sum(tid < dk ? dqt * (xt[tid] - q[tid]) : 0.0f, red);   // also publishes the loads
            const float xz = gka_block_sum(tid < dk ? xt[tid] * z[tid] : 0.0f, red);
            const float hw = ft > 0.0f ? 0.5f * (2.0f * ridge * xz / ft) : 0.0f;
            // DH, DU and the sums of dg (element map: consecutive threads read consecutive addresses)
            float pg = 0.0f;
            for (int idx = tid; idx < dk * dk; idx += nth) {
                const int i2 = idx / dk, c = idx % dk;
                float* dh = DH + i2 * ldh + c;
                *dh = gp * *dh - (z[i2] * xt[c] + hw * Ht[idx]);
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
            __syncthreads();   // rowsum, colH, colU and the token's vectors are read before the next token writes them
        }
    }
}

// ---- backward passes 2 and 3 (spec 5.2) on the chunks, in place of the recurrent remainder: dev/cuda/gka_core.cu's
// version 4. Per token: w_t = 2a (x_t.z_t)/f_t (0 where f_t = 0); per chunk, with the decays above:
//   b_j = sum_{c >= j} M[c][j] zeta_c w_c,   W_j = sum_{t >= j} w_t exp(2 (gl_t - gl_j)),
//   Mw[c][j] = (M^T diag(w) M)[c][j] = exp(gl_m - gl_m') W_m,  m = max(c, j), m' = min(c, j)
// (every exponent <= 0: the log decays are <= 0, so gl falls along the chunk).
//   pass 2, sequential over the chunks from the last: the gradients at each chunk's end from the chunks after it,
//     Zend <- zeta_BT Zend + (diag(zeta) Z)^T X,  Bend <- zeta_BT Bend + (sum_c zeta_c^2 w_c) H0 + K^T diag(b) K,
//     DUend <- zeta_BT DUend + s (diag(zeta) Qt)^T dO
//   pass 3a, per chunk: HX = diag(zeta) X H0 + ((X K^T) (.) M) K and
//     -dK_H = ((K X^T) (.) M^T) Z + ((K Z^T) (.) M^T) X + (Gm (.) Mw) K + diag(b) K H0 + diag(e) K (Zend + Zend^T + Bend)
//     dG_c (H part) = -z_c.HX_c - (w_c/2) f_c^2 - (1/2) k_c.dK_H[c]
//   pass 3b, per chunk: dV = s ((K Qt^T) (.) M^T) dO + diag(e) K DUend,
//     dK_U = s ((V dO^T) (.) M^T) Qt + diag(e) V DUend^T,  dK = dK_H + dK_U,
//     dG_c += qt_c.dQt[c] - k_c.dK_U[c],  dalpha_c = dQt[c].(x_c - q_hat_c),  dq_hat = (1 - alpha) dQt + Z
//   dg_t = sum_{s >= t} dG_s over the whole sequence (a reverse scan per (b, head)).
// The adjoint states of pass 2 are kept per chunk: adj [B*H, NT, 2 dk^2 + dk dv] = [Zend | Bend | DUend].

#define GKA_ADJ_THREADS GKA_STATE_THREADS   // the same 4 x 4 blocks as the forward's chunk states

// w_t for every (token, head) row e: one warp per row (consecutive lanes read consecutive columns), the dot summed
// in a fixed order (lane-strided partial sums, then warp_reduce_sum's tree)
#define GKA_W_WARPS 8
__global__ void gka_w_kernel(float* w, const float* x, const float* Z, const float* f, int rows, int dk, float ridge) {
    const int e = blockIdx.x * GKA_W_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (e >= rows) { return; }
    float xz = 0.0f;
    for (int j = lane; j < dk; j += 32) { xz += x[(size_t)e * dk + j] * Z[(size_t)e * dk + j]; }
    xz = warp_reduce_sum(xz);
    if (lane == 0) { w[e] = f[e] > 0.0f ? 2.0f * ridge * xz / f[e] : 0.0f; }
}

// e_c = exp(gl_BT - gl_c): the decay from token c to the chunk's end (gl: gka_chunk_decays of the chunk)
__device__ __forceinline__ float gka_end_decay(const float* gl, int c) { return expf(gl[GKA_CHECKPOINT - 1] - gl[c]); }

// the per-chunk scalars in shared memory, from gl (gka_chunk_decays, 0 past the end of the sequence) and w: e_c,
// b_c, W_c (c < BT; not where Wsum is NULL), and at [BT] of e: zeta_BT; of b: sum_c zeta_c^2 w_c. ws: w of the chunk's tokens (0 past L).
__device__ void gka_chunk_adjoint_scalars(float* ws, float* e, float* bsum, float* Wsum, const float* gl, const float* zeta,
                                          const float* w, size_t e0, int H, int L) {
    const int BT = GKA_CHECKPOINT, tid = threadIdx.x;
    if (tid < BT) { ws[tid] = tid < L ? w[e0 + (size_t)tid * H] : 0.0f; }
    __syncthreads();
    if (tid < BT) {
        const int j = tid;
        float bj = 0.0f, Wj = 0.0f;
        for (int c = j; c < BT; c++) {
            bj += expf(gl[c] - gl[j]) * zeta[c] * ws[c];
            if (Wsum) { Wj += ws[c] * expf(2.0f * (gl[c] - gl[j])); }
        }
        bsum[j] = bj;
        if (Wsum) { Wsum[j] = Wj; }
        e[j] = gka_end_decay(gl, j);
    }
    if (tid == 0) {
        float s = 0.0f;
        for (int c = 0; c < BT; c++) { s += zeta[c] * zeta[c] * ws[c]; }
        bsum[BT] = s;
        e[BT] = zeta[BT - 1];
    }
    __syncthreads();
}

// ---- pass 2: adj[bh, n] = the end adjoints (Zend | Bend | DUend) from the chunks after n, adj[bh, NT-1] = 0, each
// chunk n >= 1 adding its part to zeta_BT(n) times the state after it: a linear recurrence run as the forward's chunk
// states are (the same results as the sequential pass to the last bit; ncu, H200, B=16 T=2048: 3.33 ms
// sequentially): every chunk's part at once, then gka_state_scan_kernel in reverse.
// chunk n's part (n = 1 .. NT-1) into adj[bh, n - 1]. Grid (3, NT - 1, B*H), block GKA_ADJ_THREADS: CTA 0 makes
// Zend, 1 Bend, 2 DUend, GKA_STATE_COLS columns at a time with the row operand loaded once; a thread keeps a 4 x 4
// block of its matrix, as the forward's chunk states. (A CTA per column block, the row operand and the chunk's scalars
// made by each: 1.43 ms, H200, B=16 T=2048.)
__global__ void __launch_bounds__(GKA_ADJ_THREADS)
gka_chunk_adjoint_terms_kernel(float* adj, const float* Z, const float* x, const float* w, const floatX* dO,
                               const floatX* qkv, const float* alpha, const float* g, const float* Hck, int T, int H,
                               int dk, int dv, float scale) {
    __shared__ __align__(16) float Rs[GKA_CHECKPOINT * GKA_STATE_LDR];
    __shared__ __align__(16) float Src[GKA_CHECKPOINT * GKA_STATE_LDC];
    __shared__ float gl[GKA_CHECKPOINT], zeta[GKA_CHECKPOINT], ws[GKA_CHECKPOINT], e[GKA_CHECKPOINT + 1],
        bsum[GKA_CHECKPOINT + 1], Wsum[GKA_CHECKPOINT];
    const int n = blockIdx.y + 1, bh = blockIdx.z, b = bh / H, hh = bh % H, tid = threadIdx.x;
    const int ri = tid / (GKA_STATE_COLS / 4), ci = tid % (GKA_STATE_COLS / 4);   // rows 4 ri .., columns 4 ci ..
    const int which = blockIdx.x;   // Zend, Bend, DUend
    const int ncols = which == 2 ? dv : dk;
    const int DE = 2 * H * dk + H * dv, NT = gka_chunks(T);
    const size_t dkdk = (size_t)dk * dk, per_chunk = 2 * dkdk + (size_t)dk * dv;
    const size_t offset = which == 0 ? 0 : which == 1 ? dkdk : 2 * dkdk;
    const size_t r0 = (size_t)b * T + (size_t)n * GKA_CHECKPOINT, e0 = r0 * H + hh;
    const int L = min(GKA_CHECKPOINT, T - n * GKA_CHECKPOINT);
    gka_chunk_decays(gl, zeta, g, e0, H, L);
    gka_chunk_adjoint_scalars(ws, e, bsum, Wsum, gl, zeta, w, e0, H, L);
    // the row operand R [c][i] (rows i of the matrix; 16-byte loads but the adjoint of Qt's, which is computed:
    // gka_set_qt_pieces's 16-byte loads measured slower here, 1.43 -> 1.68 ms) and, per column block, the column
    // operand Src [c][col]
    const floatX* rows = qkv + r0 * DE;
    if (which == 0) {   // zeta_c z_c
        tile_load<4>(make_tile_load(Rs, GKA_STATE_LDR, GKA_CHECKPOINT, 128, Z + e0 * dk, (size_t)H * dk, L, dk, zeta));
    } else if (which == 1) {   // b_c k_c
        tile_load<4>(make_tile_load(Rs, GKA_STATE_LDR, GKA_CHECKPOINT, 128, rows + H * dk + hh * dk, (size_t)DE, L, dk,
                                    bsum));
    } else {   // s zeta_c qt_c
        tile_set<GKA_LOAD_BATCH>(Rs, GKA_STATE_LDR, GKA_CHECKPOINT, 128, [&](int c, int i) {
            const size_t ec = e0 + (size_t)c * H;
            if (c >= L || i >= dk) { return 0.0f; }
            const float q = to_float(qkv[(r0 + c) * DE + hh * dk + i]);
            return scale * zeta[c] * (q + alpha[ec] * (x[ec * dk + i] - q));
        });
    }
    const float* H0 = Hck + ((size_t)bh * NT + n) * dkdk;
    float* out = adj + ((size_t)bh * NT + n - 1) * per_chunk + offset;
    for (int cb0 = 0; cb0 < ncols; cb0 += GKA_STATE_COLS) {
        if (which == 0) {   // x
            tile_load<1>(make_tile_load(Src, GKA_STATE_LDC, GKA_CHECKPOINT, GKA_STATE_COLS, x + e0 * dk + cb0,
                                        (size_t)H * dk, L, dk - cb0));
        } else if (which == 1) {   // K
            tile_load<1>(make_tile_load(Src, GKA_STATE_LDC, GKA_CHECKPOINT, GKA_STATE_COLS,
                                        rows + H * dk + hh * dk + cb0, (size_t)DE, L, dk - cb0));
        } else {   // dO
            tile_load<1>(make_tile_load(Src, GKA_STATE_LDC, GKA_CHECKPOINT, GKA_STATE_COLS,
                                        dO + r0 * H * dv + hh * dv + cb0, (size_t)H * dv, L, dv - cb0));
        }
        float acc[4][4];
        gka_state_block(acc, Rs, Src, ri, ci);
        __syncthreads();   // Src read by every thread before the next block's
        const int col0 = cb0 + 4 * ci;   // this thread's first column
        for (int a = 0; a < 4; a++) {
            const int i = 4 * ri + a;
            for (int q = 0; q < 4; q++) {
                const int col = col0 + q;
                if (which == 1 && i < dk && col < dk) { acc[a][q] += bsum[GKA_CHECKPOINT] * H0[(size_t)i * dk + col]; }
                if (i < dk && col < ncols) { out[(size_t)i * ncols + col] = acc[a][q]; }
            }
        }
    }
}

// S [BT][lds] <- S (.) M^T (M^T[c][j] = exp(gl_j - gl_c) for j >= c, else 0), times mul
__device__ void gka_mask_upper(float* S, int lds, const float* gl, float mul) {
    const int BT = GKA_CHECKPOINT;
    for (int idx = threadIdx.x; idx < BT * BT; idx += blockDim.x) {
        const int c = idx / BT, j = idx % BT;
        S[c * lds + j] = j >= c ? mul * S[c * lds + j] * expf(gl[j] - gl[c]) : 0.0f;
    }
    __syncthreads();
}

// rows c of the [BT][n] tile P scaled by v[c]
__device__ void gka_scale_rows(float* P, int ldp, int n, const float* v) {
    for (int idx = threadIdx.x; idx < GKA_CHECKPOINT * n; idx += blockDim.x) {
        const int c = idx / n, j = idx % n;
        P[c * ldp + j] *= v[c];
    }
    __syncthreads();
}

// dst [BT][n] = v[c] * src [BT][n] (row-scaled copy)
__device__ void gka_scaled_copy(float* dst, const float* src, int ld, int n, const float* v) {
    for (int idx = threadIdx.x; idx < GKA_CHECKPOINT * n; idx += blockDim.x) {
        const int c = idx / n, j = idx % n;
        dst[c * ld + j] = v[c] * src[c * ld + j];
    }
    __syncthreads();
}

// out[c] = a[c].b[c] over n columns, one warp per row (lanes in a fixed tree)
__device__ void gka_row_dots(float* out, const float* A, int lda, const float* Bm, int ldb, int n) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
    for (int c = warp; c < GKA_CHECKPOINT; c += nwarps) {
        float s = 0.0f;
        for (int j = lane; j < n; j += 32) { s += A[c * lda + j] * Bm[c * ldb + j]; }
        for (int o = 16; o > 0; o >>= 1) { s += __shfl_xor_sync(0xffffffffu, s, o); }
        if (lane == 0) { out[c] = s; }
    }
    __syncthreads();
}

static size_t gka_chunk_dk_h_smem(int dk) {
    const size_t BT = GKA_CHECKPOINT, ldk = gka_lds(dk), ldb = gka_lds(BT);
    return ((size_t)gka_pad(dk) * ldk + 4 * BT * ldk + BT * ldb + 10 * (BT + 1)) * sizeof(float);
}

// ---- pass 3a, grid (NT, B*H), block GKA_CHUNK_THREADS: dK_H into dqkv's k part (pass 3b adds dK_U), dG's H part
// into dG
template <bool TC>
__global__ void __launch_bounds__(GKA_CHUNK_THREADS)
gka_chunk_dk_h_kernel(float* dqkv, float* dG, const float* adj, const float* Z, const float* x, const float* f,
                      const float* w, const floatX* qkv, const float* g, const float* Hck, int T, int H, int dk,
                      int dv) {
    extern __shared__ float gka_smem_dkh[];
    const int BT = GKA_CHECKPOINT, n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H, tid = threadIdx.x;
    const int NT = gka_chunks(T), L = min(BT, T - n * BT), DE = 2 * H * dk + H * dv;
    const int dkp = gka_pad(dk), ldk = gka_lds(dk), ldb = gka_lds(BT);
    float* Ss = gka_smem_dkh;              // [dkp][ldk] H0, then Zend + Zend^T + Bend
    float* Ks = Ss + dkp * ldk;            // [BT][ldk]
    float* Xs = Ks + BT * ldk;             // [BT][ldk] X, then diag(b) K
    float* Zs = Xs + BT * ldk;             // [BT][ldk] Z, then diag(e) K
    float* Ps = Zs + BT * ldk;             // [BT][ldk] HX, then -dK_H
    float* S = Ps + BT * ldk;              // [BT][ldb]
    float* gl = S + BT * ldb;
    float* zeta = gl + BT + 1;
    float* ws = zeta + BT + 1;
    float* e = ws + BT + 1;
    float* bsum = e + BT + 1;
    float* Wsum = bsum + BT + 1;
    float* zhx = Wsum + BT + 1;
    float* khk = zhx + BT + 1;
    const size_t r0 = (size_t)b * T + (size_t)n * BT, e0 = r0 * H + hh, dkdk = (size_t)dk * dk;
    const float* adjn = adj + ((size_t)bh * NT + n) * (2 * dkdk + (size_t)dk * dv);
    gka_chunk_decays(gl, zeta, g, e0, H, L);
    gka_chunk_adjoint_scalars(ws, e, bsum, Wsum, gl, zeta, w, e0, H, L);
    gka_load_state(Ss, ldk, Hck + ((size_t)bh * NT + n) * dkdk, dk, dk);
    gka_load_rows(Ks, ldk, qkv, DE, r0, H * dk + hh * dk, dk, L);
    gka_load_rows(Xs, ldk, x + e0 * dk, (size_t)H * dk, 0, 0, dk, L);
    gka_load_rows(Zs, ldk, Z + e0 * dk, (size_t)H * dk, 0, 0, dk, L);
    __syncthreads();
    // HX = diag(zeta) X H0 + ((X K^T) (.) M) K, then z_c.HX_c
    gka_mm<TC, false, false>(Ps, ldk, Xs, ldk, Ss, ldk, BT, dkp, dkp, false, false);
    gka_mm<TC, false, true>(S, ldb, Xs, ldk, Ks, ldk, BT, BT, dkp, false);
    gka_mask_scale(S, ldb, Ps, ldk, dkp, gl, zeta);
    gka_mm<TC, false, false>(Ps, ldk, S, ldb, Ks, ldk, BT, dkp, BT, true);
    gka_row_dots(zhx, Zs, ldk, Ps, ldk, dk);
    // -dK_H, the masked terms: ((K X^T) (.) M^T) Z + ((K Z^T) (.) M^T) X + (Gm (.) Mw) K
    gka_mm<TC, false, true>(S, ldb, Ks, ldk, Xs, ldk, BT, BT, dkp, false);
    gka_mask_upper(S, ldb, gl, 1.0f);
    gka_mm<TC, false, false>(Ps, ldk, S, ldb, Zs, ldk, BT, dkp, BT, false);
    gka_mm<TC, false, true>(S, ldb, Ks, ldk, Zs, ldk, BT, BT, dkp, false);
    gka_mask_upper(S, ldb, gl, 1.0f);
    gka_mm<TC, false, false>(Ps, ldk, S, ldb, Xs, ldk, BT, dkp, BT, true);
    gka_mm<TC, false, true>(S, ldb, Ks, ldk, Ks, ldk, BT, BT, dkp, false);
    for (int idx = tid; idx < BT * BT; idx += blockDim.x) {   // Gm (.) Mw
        const int c = idx / BT, j = idx % BT, hi = c > j ? c : j, lo = c > j ? j : c;
        S[c * ldb + j] *= expf(gl[hi] - gl[lo]) * Wsum[hi];
    }
    __syncthreads();
    gka_mm<TC, false, false>(Ps, ldk, S, ldb, Ks, ldk, BT, dkp, BT, true);
    // the state terms: diag(b) K H0 + diag(e) K (Zend + Zend^T + Bend)
    gka_scaled_copy(Xs, Ks, ldk, dkp, bsum);
    gka_mm<TC, false, false>(Ps, ldk, Xs, ldk, Ss, ldk, BT, dkp, dkp, true);
    for (int idx = tid; idx < dkp * dkp; idx += blockDim.x) {
        const int i = idx / dkp, j = idx % dkp;
        Ss[i * ldk + j] = i < dk && j < dk ? adjn[(size_t)i * dk + j] + adjn[(size_t)j * dk + i] + adjn[dkdk + (size_t)i * dk + j]
                                           : 0.0f;
    }
    gka_scaled_copy(Zs, Ks, ldk, dkp, e);   // its sync also publishes Ss
    gka_mm<TC, false, false>(Ps, ldk, Zs, ldk, Ss, ldk, BT, dkp, dkp, true);
    // dK_H = -Ps; dG (H part) = -z.HX - (w/2) f^2 - (1/2) k.dK_H
    gka_row_dots(khk, Ks, ldk, Ps, ldk, dk);
    for (int idx = tid; idx < L * dk; idx += blockDim.x) {
        const int c = idx / dk, j = idx % dk;
        dqkv[(r0 + c) * DE + H * dk + hh * dk + j] = -Ps[c * ldk + j];
    }
    if (tid < L) {
        const float fc = f[e0 + (size_t)tid * H];
        dG[e0 + (size_t)tid * H] = -zhx[tid] - 0.5f * ws[tid] * fc * fc + 0.5f * khk[tid];
    }
}

#if defined(ENABLE_BF16)

// ---- the chunk-state terms of the forward and of pass 2 on register tiles (the bf16 build's; dev/cuda/gka_core.cu
// version 9): gka_chunk_state_terms_kernel's and gka_chunk_adjoint_terms_kernel's matrices, each a product
// R^T C over the chunk's BT tokens, R [BT][dk] a row-scaled operand (diag(e) K, diag(zeta) Z, diag(b) K or
// s diag(zeta) Qt) and C [BT][ncols] the column operand (K, V or dO, bf16 already and kept in one piece, exact; x in
// two). R in two bf16 pieces, each product R.hi C.hi + R.lo C.hi (+ R.hi C.lo): 16 of fp32's 24 bits of the terms,
// as the solves' H0 and pass 3's products have them. GKA_STATE_MMA_WARPS warps, warp w the rows 16 w .. 16 w + 15
// of the matrix, R read as A through ldmatrix.trans (stored [k][m]), C as B stored [k][n]. The CUDA-core kernels
// were bound by their shared-memory operand reads (ncu, H200, B=16 T=2048: L1/shared 78%, FMA pipe 42%; 0.61 and
// 1.04 ms; a CTA per matrix and chunk on register tiles: 0.23 and 0.54 ms, before the scans).
#define GKA_STATE_MMA_WARPS (GKA_SOLVE_DK / 16)
#define GKA_STATE_MMA_THREADS (GKA_STATE_MMA_WARPS * 32)
#define GKA_STATE_MMA_COLS 64   // a warp's columns per product (its accumulators: 32 registers, three CTAs per SM)

struct GkaStateMmaSmem {
    GkaTile R, C;   // [BT][LDK] each, two pieces (C's second only for x)
    __host__ __device__ GkaStateMmaSmem(size_t base, size_t* bytes) {
        SmemCarver c(base);
        R = gka_take_tile(c, (size_t)GKA_CHECKPOINT * GKA_SOLVE_LDK, true);
        C = gka_take_tile(c, (size_t)GKA_CHECKPOINT * GKA_SOLVE_LDK, true);
        if (bytes) { *bytes = c.off; }
    }
};

static size_t gka_state_mma_smem() {
    size_t bytes = 0;
    GkaStateMmaSmem sm(0, &bytes);
    return bytes;
}

// ---- the forward's chunk states and pass 2's end adjoints in one pass over the chunks each, the terms on register
// tiles and the recurrence fused (the bf16 build's): a CTA per GKA_STATE_MMA_COLS columns of a state (or end adjoint)
// and (b, h) walks the chunks in order (pass 2: from the last), and each step is
//     next = zeta_BT(n) prev + R^T C     (R^T C: chunk n's term; prev the state written in the step before, or 0)
// with R^T C made in its own accumulators (as the separate terms kernels made them) and zeta_BT(n) = zeta[BT - 1] of
// gka_chunk_decays, the same fp32 sum in token order as gka_state_scan_kernel's: every element is the sum the terms
// kernels followed by the scans made, in the same order (on an H100 the lab's errors printed identical), and each
// state is written once (the terms kernels wrote every term and the scans read and wrote every state again: 1.2 GB
// in the forward at B=16 T=2048 H=6 of 128, 1.8 GB in pass 2). The state stays in registers, the accumulators of its
// CTA's warps (read back from global memory, as first written, those loads had half of the forward walk's stall
// samples: ncu, H100), and pass 2's loads of a chunk's operands
// keep two groups in flight (with four, 548 bytes spilled beside the state): three CTAs per SM, so the grids of 384
// and 576 CTAs at that shape run in one wave, as a walk over the chunks needs.

// acc = zb acc + (R^T C) (+ add_scale add where add is given: [dk][dk], row stride dk), then acc into next ([dk][cols],
// row stride cols): the warp's rows r0 .. r0 + 15 (i < dk) and the CTA's columns n0 .. n0 + GKA_STATE_MMA_COLS
// (j < cols), acc in the accumulator layout; C holds column n0 at 0; the tiles published by a barrier before
template <bool C_LO>
__device__ __forceinline__ void gka_state_step(float acc[GKA_STATE_MMA_COLS / 8][4], float* next, int dk, int cols,
                                               int n0, const GkaTile& R, const GkaTile& C, float zb, const float* add,
                                               float add_scale) {
    constexpr int NTL = GKA_STATE_MMA_COLS / 8;   // n-tiles, two halves of 32 columns (registers)
    const int lane = threadIdx.x % 32, r0 = 16 * (threadIdx.x / 32), gq = lane >> 2, t4 = lane & 3;
    if (r0 >= dk) { return; }
    #pragma unroll
    for (int p = 0; p < 2; p++) {
        float term[NTL / 2][4];
        gka_frags_zero<NTL / 2>(term);
        gka_warp_mma<NTL / 2, GKA_CHECKPOINT, true, true, C_LO, true>(term, R, GKA_SOLVE_LDK, r0, C, GKA_SOLVE_LDK,
                                                                      4 * NTL * p, lane);
        #pragma unroll
        for (int t = 0; t < NTL / 2; t++) {
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                const int i = r0 + gq + 8 * h, j = n0 + 32 * p + 8 * t + 2 * t4;
                if (i >= dk || j >= cols) { continue; }
                float2 v = make_float2(term[t][2 * h], term[t][2 * h + 1]);
                if (add) {
                    const float2 a = *reinterpret_cast<const float2*>(add + (size_t)i * dk + j);
                    v.x += add_scale * a.x;
                    v.y += add_scale * a.y;
                }
                float* a = &acc[NTL / 2 * p + t][2 * h];
                a[0] = zb * a[0] + v.x;
                a[1] = zb * a[1] + v.y;
                *reinterpret_cast<float2*>(next + (size_t)i * cols + j) = make_float2(a[0], a[1]);
            }
        }
    }
}

// slot 0 of a walk: zeros in the CTA's columns n0 .. n0 + GKA_STATE_MMA_COLS (j < cols) of a [dk][cols] state
__device__ void gka_state_zero(float* slot, int dk, int cols, int n0) {
    for (int idx = threadIdx.x; idx < dk * GKA_STATE_MMA_COLS; idx += blockDim.x) {
        const int i = idx / GKA_STATE_MMA_COLS, j = n0 + idx % GKA_STATE_MMA_COLS;
        if (j < cols) { slot[(size_t)i * cols + j] = 0.0f; }
    }
}

// forward: the chunk states Hck/Uck[bh, n] (spec 5.1(a)): slot 0 = 0, slot n + 1 = zeta_BT(n) slot n + K^T diag(e) K
// (or K^T diag(e) V) of chunk n, n = 0 .. NT-2. Grid (gka_state_blocks: the column blocks of H, then of U; B*H)
static int gka_state_blocks(int dk, int dv) { return ceil_div(dk, GKA_STATE_MMA_COLS) + ceil_div(dv, GKA_STATE_MMA_COLS); }

__global__ void __launch_bounds__(GKA_STATE_MMA_THREADS, 3)
gka_chunk_states_mma_kernel(float* Hck, float* Uck, const floatX* qkv, const float* g, int T, int H, int dk, int dv) {
    extern __shared__ __align__(128) unsigned char gka_smem_state_mma[];
    GkaStateMmaSmem sm((size_t)gka_smem_state_mma, NULL);
    __shared__ float gl[GKA_CHECKPOINT], zeta[GKA_CHECKPOINT], e[GKA_CHECKPOINT];
    const int BT = GKA_CHECKPOINT, bh = blockIdx.y, b = bh / H, hh = bh % H, tid = threadIdx.x;
    const int DE = 2 * H * dk + H * dv, NT = gka_chunks(T);
    const int hblocks = (dk + GKA_STATE_MMA_COLS - 1) / GKA_STATE_MMA_COLS;
    const bool is_h = (int)blockIdx.x < hblocks;   // columns of H, else of U
    const int cols = is_h ? dk : dv, n0 = GKA_STATE_MMA_COLS * (is_h ? blockIdx.x : blockIdx.x - hblocks);
    const int src0 = (is_h ? H * dk + hh * dk : 2 * H * dk + hh * dv) + n0;   // the columns' first in a qkv row
    const size_t slot = (size_t)dk * cols;
    float* out = (is_h ? Hck : Uck) + (size_t)bh * NT * slot;
    gka_state_zero(out, dk, cols, n0);
    float acc[GKA_STATE_MMA_COLS / 8][4];   // the state after the chunks so far (gka_state_step)
    gka_frags_zero<GKA_STATE_MMA_COLS / 8>(acc);
    for (int n = 0; n < NT - 1; n++) {
        const size_t row0 = (size_t)b * T + (size_t)n * BT, e0 = row0 * H + hh;   // a full chunk: n < NT - 1
        gka_chunk_decays(gl, zeta, g, e0, H, BT);   // its first barrier: the previous chunk's tiles are read
        if (tid < BT) { e[tid] = gka_end_decay(gl, tid); }
        __syncthreads();
        gka_set_pieces(sm.R, qkv + row0 * DE + H * dk + hh * dk, (size_t)DE, BT, dk, BT, e);
        gka_load_bf16_rows(sm.C.hi, qkv, DE, row0, src0, min(GKA_STATE_MMA_COLS, cols - n0), BT);
        const float zb = zeta[BT - 1];   // read before the barrier after which the next chunk's decays are written
        __syncthreads();
        gka_state_step<false>(acc, out + (n + 1) * slot, dk, cols, n0, sm.R, sm.C, zb, NULL, 0.0f);
    }
}

// pass 2 (spec 5.2): the end adjoints adj[bh, n] = [Zend | Bend | DUend] from the chunks after n: adj[bh, NT-1] = 0,
// adj[bh, n - 1] = zeta_BT(n) adj[bh, n] + chunk n's part, n = NT-1 .. 1, the part (diag(zeta) Z)^T X,
// K^T diag(b) K + (sum_c zeta_c^2 w_c) H0 or s (diag(zeta) Qt)^T dO. Grid (gka_adjoint_blocks: the column blocks of
// Zend, Bend, then DUend; B*H)
static int gka_adjoint_blocks(int dk, int dv) {
    return 2 * ceil_div(dk, GKA_STATE_MMA_COLS) + ceil_div(dv, GKA_STATE_MMA_COLS);
}

__global__ void __launch_bounds__(GKA_STATE_MMA_THREADS, 3)
gka_chunk_adjoints_mma_kernel(float* adj, const float* Z, const float* x, const float* w, const floatX* dO,
                              const floatX* qkv, const float* alpha, const float* g, const float* Hck, int T, int H,
                              int dk, int dv, float scale) {
    extern __shared__ __align__(128) unsigned char gka_smem_state_mma[];
    GkaStateMmaSmem sm((size_t)gka_smem_state_mma, NULL);
    __shared__ float gl[GKA_CHECKPOINT], zeta[GKA_CHECKPOINT], ws[GKA_CHECKPOINT], e[GKA_CHECKPOINT + 1],
        bsum[GKA_CHECKPOINT + 1];
    const int BT = GKA_CHECKPOINT, bh = blockIdx.y, b = bh / H, hh = bh % H;
    const int DE = 2 * H * dk + H * dv, NT = gka_chunks(T);
    const int kblocks = (dk + GKA_STATE_MMA_COLS - 1) / GKA_STATE_MMA_COLS;
    const int which = min(2, (int)blockIdx.x / kblocks);   // Zend, Bend, DUend
    const int cols = which == 2 ? dv : dk, n0 = GKA_STATE_MMA_COLS * (blockIdx.x - which * kblocks);
    const int nc = min(GKA_STATE_MMA_COLS, cols - n0);
    const size_t dkdk = (size_t)dk * dk, slot = 2 * dkdk + (size_t)dk * dv;
    float* out = adj + (size_t)bh * NT * slot + which * dkdk;
    gka_state_zero(out + (NT - 1) * slot, dk, cols, n0);
    float acc[GKA_STATE_MMA_COLS / 8][4];   // the end adjoint after the chunks so far (gka_state_step)
    gka_frags_zero<GKA_STATE_MMA_COLS / 8>(acc);
    for (int n = NT - 1; n > 0; n--) {
        const size_t row0 = (size_t)b * T + (size_t)n * BT, e0 = row0 * H + hh;
        const int L = min(BT, T - n * BT);
        gka_chunk_decays(gl, zeta, g, e0, H, L);   // its first barrier: the previous chunk's tiles are read
        if (which == 0) {
            gka_set_pieces<2>(sm.R, Z + e0 * dk, (size_t)H * dk, L, dk, BT, zeta);
            gka_set_pieces<2>(sm.C, x + e0 * dk + n0, (size_t)H * dk, L, nc, BT);
        } else if (which == 1) {
            gka_chunk_adjoint_scalars(ws, e, bsum, NULL, gl, zeta, w, e0, H, L);
            gka_set_pieces<2>(sm.R, qkv + row0 * DE + H * dk + hh * dk, (size_t)DE, L, dk, BT, bsum);
            gka_load_bf16_rows<2>(sm.C.hi, qkv, DE, row0, H * dk + hh * dk + n0, nc, L);
        } else {
            gka_set_qt_pieces<2>(sm.R, qkv, alpha, x, row0, e0, H, hh, dk, DE, L, zeta, scale);
            gka_load_bf16_rows<2>(sm.C.hi, dO, (size_t)H * dv, row0, hh * dv + n0, nc, L);
        }
        // read before the barrier after which the next chunk's scalars are written
        const float zb = zeta[BT - 1], h0_scale = which == 1 ? bsum[BT] : 0.0f;
        __syncthreads();
        float* next = out + (n - 1) * slot;
        if (which == 0) {
            gka_state_step<true>(acc, next, dk, cols, n0, sm.R, sm.C, zb, NULL, 0.0f);
        } else {
            gka_state_step<false>(acc, next, dk, cols, n0, sm.R, sm.C, zb,
                                  which == 1 ? Hck + ((size_t)bh * NT + n) * dkdk : NULL, h0_scale);
        }
    }
}

// ---- pass 3a on register tiles (the bf16 build's; dev/cuda/gka_core.cu version 6): gka_chunk_dk_h_kernel's products
// with the solve's warp layout. Block b of four warps owns rows 16 b .. of HX and dK_H, warp p of it their columns
// 32 p .. and the columns 16 p .. of each masked S, which the block's warps meet at their named barrier to use.
// Operands in bf16 pieces as the solve's: H0, X, Z, the end adjoints and every S in two, the keys in one (exact).
// The row scalings diag(b) and diag(e) of the state terms act on the fp32 products K H0 and K (Zend + Zend^T +
// Bend), not on K, which then stays exact.

struct GkaDkhSmem {
    float *gl, *zeta, *ws, *e, *bsum, *Wsum;   // [BT + 1] each (gka_chunk_adjoint_scalars)
    float *zhx, *khk;                          // [BT][WPR]: the warps' parts of z_c.HX_c and k_c.dK_H[c]
    GkaTile Hs, K, X, Zt, S;   // [128][LDK] H0, then Zend + Zend^T + Bend; [BT][LDK] x3 (K one piece); [BT][LDS]
    __host__ __device__ GkaDkhSmem(size_t base, size_t* bytes) {
        const int BT = GKA_CHECKPOINT;
        SmemCarver c(base);
        gl = c.take<float>(BT + 1);
        zeta = c.take<float>(BT + 1);
        ws = c.take<float>(BT + 1);
        e = c.take<float>(BT + 1);
        bsum = c.take<float>(BT + 1);
        Wsum = c.take<float>(BT + 1);
        zhx = c.take<float>(GKA_SOLVE_WPR * BT);
        khk = c.take<float>(GKA_SOLVE_WPR * BT);
        Hs = gka_take_tile(c, (size_t)GKA_SOLVE_DK * GKA_SOLVE_LDK, true);
        K = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDK, false);
        X = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDK, true);
        Zt = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDK, true);
        S = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDS, true);
        if (bytes) { *bytes = c.off; }
    }
};

// Zend's fp32 staging in pass 3a: row stride 129 (odd: its transpose's reads fall in different banks), in the space
// of the tiles X and Zt
#define GKA_DKH_LDZ (GKA_SOLVE_DK + 1)
static_assert(GKA_SOLVE_DK * GKA_DKH_LDZ * sizeof(float) <= 4 * GKA_CHECKPOINT * GKA_SOLVE_LDK * sizeof(__nv_bfloat16),
              "Zend's staging fits in the two-piece tiles X and Zt");

static size_t gka_chunk_dk_h_mma_smem() {
    size_t bytes = 0;
    GkaDkhSmem sm(0, &bytes);
    return bytes;
}

// Gm (.) Mw: exp(gl_hi - gl_lo) Wsum_hi with hi = max(c, j), lo = min(c, j) (spec 5.2 pass 3, the f^2 term's Gram part)
struct GkaMaskGram {
    const float *gl, *Wsum;
    __device__ __forceinline__ float operator()(int c, int j) const {
        const int hi = c > j ? c : j, lo = c > j ? j : c;
        return __expf(gl[hi] - gl[lo]) * Wsum[hi];
    }
};

// p += diag(v) (A Bm) for the warp's 16 rows r0 .. and 32 columns n0 .. (A one piece, the keys or values; Bm two
// pieces, stored [k][n] with B_KN, else [n][k])
template <bool B_KN>
__device__ __forceinline__ void gka_add_row_scaled_product(float p[4][4], const GkaTile& A, const GkaTile& Bm,
                                                           const float* v, int r0, int n0, int lane) {
    float t[4][4];
    gka_frags_zero<4>(t);
    gka_warp_mma<4, GKA_SOLVE_DK, B_KN, false, true>(t, A, GKA_SOLVE_LDK, r0, Bm, GKA_SOLVE_LDK, n0, lane);
    const float va = v[r0 + (lane >> 2)], vb = v[r0 + (lane >> 2) + 8];
    #pragma unroll
    for (int i = 0; i < 4; i++) {
        p[i][0] += va * t[i][0];
        p[i][1] += va * t[i][1];
        p[i][2] += vb * t[i][2];
        p[i][3] += vb * t[i][3];
    }
}

// the warp's 16 x 32 fragments p (rows r0 + g (+ 8), columns n0 + 8 t + 2 t4 (+ 1)) into the rows c < L and columns
// j < n of dst (row stride ld): dst = mul p, or with ADD dst += mul p
template <bool ADD>
__device__ __forceinline__ void gka_frags_store(float* dst, size_t ld, const float p[4][4], float mul, int r0, int n0,
                                                int L, int n, int lane) {
    const int gq = lane >> 2, t4 = lane & 3;
    #pragma unroll
    for (int h = 0; h < 2; h++) {
        const int c = r0 + gq + 8 * h;
        if (c >= L) { continue; }
        float* row = dst + (size_t)c * ld;
        #pragma unroll
        for (int t = 0; t < 4; t++) {
            #pragma unroll
            for (int u = 0; u < 2; u++) {
                const int j = n0 + 8 * t + 2 * t4 + u;
                if (j < n) { row[j] = ADD ? row[j] + mul * p[t][2 * h + u] : mul * p[t][2 * h + u]; }
            }
        }
    }
}

// this warp's part of the row dots sum_j a(c, j) p[c][j] over its 32 columns n0 .., into part_out[WPR c + part]
template <typename Fa>
__device__ __forceinline__ void gka_row_dots_part(float* part_out, const float p[4][4], int r0, int n0, int part,
                                                  int lane, Fa a) {
    const int gq = lane >> 2, t4 = lane & 3;
    #pragma unroll
    for (int h = 0; h < 2; h++) {
        const int c = r0 + gq + 8 * h;
        float s = 0.0f;
        #pragma unroll
        for (int t = 0; t < 4; t++) {
            #pragma unroll
            for (int u = 0; u < 2; u++) { s += a(c, n0 + 8 * t + 2 * t4 + u) * p[t][2 * h + u]; }
        }
        s += __shfl_xor_sync(0xffffffffu, s, 1);
        s += __shfl_xor_sync(0xffffffffu, s, 2);
        if (t4 == 0) { part_out[GKA_SOLVE_WPR * c + part] = s; }
    }
}

__global__ void __launch_bounds__(GKA_SOLVE_THREADS, 1)
gka_chunk_dk_h_mma_kernel(float* dqkv, float* dG, const float* adj, const float* Z, const float* x, const float* f,
                          const float* w, const floatX* qkv, const float* g, const float* Hck, int T, int H, int dk,
                          int dv) {
    extern __shared__ __align__(128) unsigned char gka_smem_dkh_mma[];
    GkaDkhSmem sm((size_t)gka_smem_dkh_mma, NULL);
    const int BT = GKA_CHECKPOINT, n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H, tid = threadIdx.x;
    const int lane = tid % 32, warp = tid / 32, blk = warp / GKA_SOLVE_WPR, part = warp % GKA_SOLVE_WPR;
    const int gq = lane >> 2, r0 = 16 * blk, LDK = GKA_SOLVE_LDK, LDS = GKA_SOLVE_LDS;
    const int hc0 = 8 * GKA_SOLVE_NTH * part, sc0 = 8 * GKA_SOLVE_NTS * part;   // its columns of HX / dK_H and of S
    const int NT = gka_chunks(T), L = min(BT, T - n * BT), DE = 2 * H * dk + H * dv;
    const size_t row0 = (size_t)b * T + (size_t)n * BT, e0 = row0 * H + hh, dkdk = (size_t)dk * dk;
    const float* adjn = adj + ((size_t)bh * NT + n) * (2 * dkdk + (size_t)dk * dv);
    gka_chunk_decays(sm.gl, sm.zeta, g, e0, H, L);
    gka_chunk_adjoint_scalars(sm.ws, sm.e, sm.bsum, sm.Wsum, sm.gl, sm.zeta, w, e0, H, L);
    gka_set_pieces(sm.Hs, Hck + ((size_t)bh * NT + n) * dkdk, dk, dk, dk, GKA_SOLVE_DK);
    gka_load_bf16_rows(sm.K.hi, qkv, DE, row0, H * dk + hh * dk, dk, L);
    gka_set_pieces(sm.X, x + e0 * dk, (size_t)H * dk, L, dk, BT);
    gka_set_pieces(sm.Zt, Z + e0 * dk, (size_t)H * dk, L, dk, BT);
    __syncthreads();
    // HX = diag(zeta) X H0 + ((X K^T) (.) M) K, then this warp's part of z_c.HX_c (z in fp32 from global memory)
    float p[4][4];
    gka_masked_s<true, false>(sm.S, sm.X, sm.K, r0, sc0, lane, GkaMaskLower{sm.gl});
    named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);
    gka_chunk_rows_product<true, true>(p, sm.X, sm.Hs, sm.S, sm.K, sm.zeta[r0 + gq], sm.zeta[r0 + gq + 8], r0, hc0,
                                       lane);
    gka_row_dots_part(sm.zhx, p, r0, hc0, part, lane, [&](int c, int j) {
        return c < L && j < dk ? Z[(e0 + (size_t)c * H) * dk + j] : 0.0f;
    });
    // -dK_H, the masked terms: ((K X^T) (.) M^T) Z + ((K Z^T) (.) M^T) X + (Gm (.) Mw) K, each S the block's own
    gka_frags_zero<4>(p);
    named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);   // the block is done with S before it is written again
    gka_masked_s<false, true>(sm.S, sm.K, sm.X, r0, sc0, lane, GkaMaskUpper{sm.gl});
    named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);
    gka_warp_mma<4, GKA_CHECKPOINT, true, true, true>(p, sm.S, LDS, r0, sm.Zt, LDK, hc0, lane);
    named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);
    gka_masked_s<false, true>(sm.S, sm.K, sm.Zt, r0, sc0, lane, GkaMaskUpper{sm.gl});
    named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);
    gka_warp_mma<4, GKA_CHECKPOINT, true, true, true>(p, sm.S, LDS, r0, sm.X, LDK, hc0, lane);
    named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);
    gka_masked_s<false, false>(sm.S, sm.K, sm.K, r0, sc0, lane, GkaMaskGram{sm.gl, sm.Wsum});
    named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);
    gka_warp_mma<4, GKA_CHECKPOINT, true, true, false>(p, sm.S, LDS, r0, sm.K, LDK, hc0, lane);
    // the state terms: diag(b) K H0 + diag(e) K (Zend + Zend^T + Bend)
    gka_add_row_scaled_product<true>(p, sm.K, sm.Hs, sm.bsum, r0, hc0, lane);
    __syncthreads();   // every warp is done with H0, X, Z and S
    // Zend + Zend^T + Bend, Zend staged in fp32 in X's and Z's tiles (free now, carved one after another) so that its
    // transpose is read from shared memory; the same sums in the same order as element by element from global memory
    float* zend = reinterpret_cast<float*>(sm.X.hi);   // [128][GKA_DKH_LDZ]
    gka_load_rows8<GKA_LOAD_GROUPS>(adjn, dk, dk, dk, GKA_SOLVE_DK, [&](int i, int j0, const float* v) {
        #pragma unroll
        for (int e = 0; e < 8; e++) { zend[i * GKA_DKH_LDZ + j0 + e] = v[e]; }
    });
    __syncthreads();
    gka_load_rows8<GKA_LOAD_GROUPS>(adjn + dkdk, dk, dk, dk, GKA_SOLVE_DK, [&](int i, int j0, const float* v) {
        #pragma unroll
        for (int e = 0; e < 8; e += 2) {
            const int j = j0 + e;
            sm.Hs.set2(i * LDK + j, zend[i * GKA_DKH_LDZ + j] + zend[j * GKA_DKH_LDZ + i] + v[e],
                       zend[i * GKA_DKH_LDZ + j + 1] + zend[(j + 1) * GKA_DKH_LDZ + i] + v[e + 1]);
        }
    });
    __syncthreads();
    gka_add_row_scaled_product<true>(p, sm.K, sm.Hs, sm.e, r0, hc0, lane);
    // dK_H = -p: this warp's part of k_c.dK_H[c] (the sign is dG's), then dqkv's k part
    gka_row_dots_part(sm.khk, p, r0, hc0, part, lane, [&](int c, int j) {
        return __bfloat162float(sm.K.hi[c * LDK + j]);
    });
    gka_frags_store<false>(dqkv + row0 * DE + H * dk + hh * dk, DE, p, -1.0f, r0, hc0, L, dk, lane);
    __syncthreads();
    if (tid < L) {   // dG (H part) = -z.HX - (w/2) f^2 - (1/2) k.dK_H, the warps' parts in a fixed order
        float zhx = 0.0f, khk = 0.0f;
        for (int q = 0; q < GKA_SOLVE_WPR; q++) {
            zhx += sm.zhx[GKA_SOLVE_WPR * tid + q];
            khk += sm.khk[GKA_SOLVE_WPR * tid + q];
        }
        const float fc = f[e0 + (size_t)tid * H];
        dG[e0 + (size_t)tid * H] = -zhx - 0.5f * sm.ws[tid] * fc * fc + 0.5f * khk;
    }
}

#endif // ENABLE_BF16

static size_t gka_chunk_du_smem(int dk, int dv) {
    const size_t BT = GKA_CHECKPOINT, ldm = gka_lds(dk > dv ? dk : dv), ldb = gka_lds(BT);
    return ((size_t)gka_pad(dk) * ldm + 4 * BT * ldm + BT * ldb + 6 * (BT + 1)) * sizeof(float);
}

// ---- pass 3b, grid (NT, B*H), block GKA_CHUNK_THREADS: dV into dqkv's v part, dK = dK_H (from pass 3a) + dK_U into
// its k part, dq_hat into its q part, dalpha, and dG's U part added to dG
template <bool TC>
__global__ void __launch_bounds__(GKA_CHUNK_THREADS)
gka_chunk_du_kernel(float* dqkv, float* dalpha, float* dG, const float* adj, const float* dQt, const float* Z,
                    const floatX* dO, const float* x, const floatX* qkv, const float* alpha, const float* g, int T,
                    int H, int dk, int dv, float scale) {
    extern __shared__ float gka_smem_du[];
    const int BT = GKA_CHECKPOINT, n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H, tid = threadIdx.x;
    const int NT = gka_chunks(T), L = min(BT, T - n * BT), DE = 2 * H * dk + H * dv;
    const int dkp = gka_pad(dk), dvp = gka_pad(dv), ldm = gka_lds(dk > dv ? dk : dv), ldb = gka_lds(BT);
    float* DUs = gka_smem_du;              // [dkp][ldm] DUend
    float* Ks = DUs + dkp * ldm;           // [BT][ldm]
    float* Qs = Ks + BT * ldm;             // [BT][ldm] Qt
    float* Ds = Qs + BT * ldm;             // [BT][ldm] dO, then dK_U
    float* Ps = Ds + BT * ldm;             // [BT][ldm] dV, then V
    float* S = Ps + BT * ldm;              // [BT][ldb]
    float* gl = S + BT * ldb;
    float* zeta = gl + BT + 1;
    float* e = zeta + BT + 1;
    float* qdq = e + BT + 1;
    float* kdk = qdq + BT + 1;
    const size_t r0 = (size_t)b * T + (size_t)n * BT, e0 = r0 * H + hh, dkdk = (size_t)dk * dk;
    gka_chunk_decays(gl, zeta, g, e0, H, L);
    if (tid < BT) { e[tid] = gka_end_decay(gl, tid); }
    gka_load_state(DUs, ldm, adj + ((size_t)bh * NT + n) * (2 * dkdk + (size_t)dk * dv) + 2 * dkdk, dk, dv);
    gka_load_rows(Ks, ldm, qkv, DE, r0, H * dk + hh * dk, dk, L);
    gka_load_rows(Ds, ldm, dO, (size_t)H * dv, r0, hh * dv, dv, L);
    gka_load_qt(Qs, ldm, qkv, alpha, x, r0, e0, H, hh, dk, DE, L);
    __syncthreads();
    // dV = diag(e) K DUend + s ((K Qt^T) (.) M^T) dO
    gka_mm<TC, false, false>(Ps, ldm, Ks, ldm, DUs, ldm, BT, dvp, dkp, false);
    gka_scale_rows(Ps, ldm, dvp, e);
    gka_mm<TC, false, true>(S, ldb, Ks, ldm, Qs, ldm, BT, BT, dkp, false);
    gka_mask_upper(S, ldb, gl, scale);
    gka_mm<TC, false, false>(Ps, ldm, S, ldb, Ds, ldm, BT, dvp, BT, true);
    for (int idx = tid; idx < L * dv; idx += blockDim.x) {
        const int c = idx / dv, j = idx % dv;
        dqkv[(r0 + c) * DE + 2 * H * dk + hh * dv + j] = Ps[c * ldm + j];
    }
    __syncthreads();   // dV is written out before V replaces it
    gka_load_rows(Ps, ldm, qkv, DE, r0, 2 * H * dk + hh * dv, dv, L);
    __syncthreads();
    // dK_U = diag(e) V DUend^T + s ((V dO^T) (.) M^T) Qt
    gka_mm<TC, false, true>(S, ldb, Ps, ldm, Ds, ldm, BT, BT, dvp, false);
    gka_mask_upper(S, ldb, gl, scale);
    gka_mm<TC, false, true>(Ds, ldm, Ps, ldm, DUs, ldm, BT, dkp, dvp, false);
    gka_scale_rows(Ds, ldm, dkp, e);
    gka_mm<TC, false, false>(Ds, ldm, S, ldb, Qs, ldm, BT, dkp, BT, true);
    // the dots of dG's U part: qt_c.dQt[c] (dQt from global into Ps, free again) and k_c.dK_U[c]
    gka_load_rows(Ps, ldm, dQt + e0 * dk, (size_t)H * dk, 0, 0, dk, L);
    __syncthreads();
    gka_row_dots(qdq, Qs, ldm, Ps, ldm, dk);
    gka_row_dots(kdk, Ks, ldm, Ds, ldm, dk);
    for (int idx = tid; idx < L * dk; idx += blockDim.x) {
        const int c = idx / dk, j = idx % dk;
        const size_t r = r0 + c, ec = e0 + (size_t)c * H;
        float* dkr = dqkv + r * DE + H * dk + hh * dk + j;
        *dkr = *dkr + Ds[c * ldm + j];
        dqkv[r * DE + hh * dk + j] = (1.0f - alpha[ec]) * Ps[c * ldm + j] + Z[ec * dk + j];
    }
    // dalpha_c = dQt[c].(x_c - q_hat_c), one warp per row
    {
        const int warp = tid / 32, lane = tid % 32, nwarps = blockDim.x / 32;
        for (int c = warp; c < L; c += nwarps) {
            const size_t ec = e0 + (size_t)c * H;
            float s = 0.0f;
            for (int j = lane; j < dk; j += 32) {
                const float q = to_float(qkv[(r0 + c) * DE + hh * dk + j]);
                s += Ps[c * ldm + j] * (x[ec * dk + j] - q);
            }
            for (int o = 16; o > 0; o >>= 1) { s += __shfl_xor_sync(0xffffffffu, s, o); }
            if (lane == 0) { dalpha[ec] = s; }
        }
    }
    if (tid < L) { dG[e0 + (size_t)tid * H] += qdq[tid] - kdk[tid]; }
}

#if defined(ENABLE_BF16)

// ---- pass 3b on register tiles (the bf16 build's; dev/cuda/gka_core.cu version 7): gka_chunk_du_kernel's products
// with pass 3a's layout (gka_chunk_dk_h_mma_kernel): block b of four warps owns rows 16 b .. of dV and dK_U, warp p
// of it their columns 32 p .. and the columns 16 p .. of each masked S. DUend, Qt and every S in two bf16 pieces,
// the keys, values and dO in one (exact); diag(e) acts on the fp32 products K DUend and V DUend^T. The elementwise
// rest (dq_hat, dalpha, qt_c.dQt[c]) reads its operands from global memory, a warp per row.

struct GkaDuSmem {
    float *gl, *zeta, *e, *qdq;   // [BT] each
    float* kdk;                   // [BT][WPR]: the warps' parts of k_c.dK_U[c]
    GkaTile DU, K, V, dO, Qt, S;  // [128][LDK] DUend (two pieces); [BT][LDK] x4 (Qt two pieces); [BT][LDS]
    __host__ __device__ GkaDuSmem(size_t base, size_t* bytes) {
        const int BT = GKA_CHECKPOINT;
        SmemCarver c(base);
        gl = c.take<float>(BT);
        zeta = c.take<float>(BT);
        e = c.take<float>(BT);
        qdq = c.take<float>(BT);
        kdk = c.take<float>(GKA_SOLVE_WPR * BT);
        DU = gka_take_tile(c, (size_t)GKA_SOLVE_DK * GKA_SOLVE_LDK, true);
        K = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDK, false);
        V = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDK, false);
        dO = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDK, false);
        Qt = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDK, true);
        S = gka_take_tile(c, (size_t)BT * GKA_SOLVE_LDS, true);
        if (bytes) { *bytes = c.off; }
    }
};

static size_t gka_chunk_du_mma_smem() {
    size_t bytes = 0;
    GkaDuSmem sm(0, &bytes);
    return bytes;
}

__global__ void __launch_bounds__(GKA_SOLVE_THREADS, 1)
gka_chunk_du_mma_kernel(float* dqkv, float* dalpha, float* dG, const float* adj, const float* dQt, const float* Z,
                        const floatX* dO, const float* x, const floatX* qkv, const float* alpha, const float* g, int T,
                        int H, int dk, int dv, float scale) {
    extern __shared__ __align__(128) unsigned char gka_smem_du_mma[];
    GkaDuSmem sm((size_t)gka_smem_du_mma, NULL);
    const int BT = GKA_CHECKPOINT, n = blockIdx.x, bh = blockIdx.y, b = bh / H, hh = bh % H, tid = threadIdx.x;
    const int lane = tid % 32, warp = tid / 32, blk = warp / GKA_SOLVE_WPR, part = warp % GKA_SOLVE_WPR;
    const int r0 = 16 * blk, LDK = GKA_SOLVE_LDK, LDS = GKA_SOLVE_LDS;
    const int hc0 = 8 * GKA_SOLVE_NTH * part, sc0 = 8 * GKA_SOLVE_NTS * part;   // its columns of dV / dK_U and of S
    const int NT = gka_chunks(T), L = min(BT, T - n * BT), DE = 2 * H * dk + H * dv;
    const size_t row0 = (size_t)b * T + (size_t)n * BT, e0 = row0 * H + hh, dkdk = (size_t)dk * dk;
    gka_chunk_decays(sm.gl, sm.zeta, g, e0, H, L);
    if (tid < BT) { sm.e[tid] = expf(sm.gl[BT - 1] - sm.gl[tid]); }
    gka_set_pieces(sm.DU, adj + ((size_t)bh * NT + n) * (2 * dkdk + (size_t)dk * dv) + 2 * dkdk, dv, dk, dv,
                   GKA_SOLVE_DK);
    gka_load_bf16_rows(sm.K.hi, qkv, DE, row0, H * dk + hh * dk, dk, L);
    gka_load_bf16_rows(sm.V.hi, qkv, DE, row0, 2 * H * dk + hh * dv, dv, L);
    gka_load_bf16_rows(sm.dO.hi, dO, (size_t)H * dv, row0, hh * dv, dv, L);
    gka_set_qt_pieces(sm.Qt, qkv, alpha, x, row0, e0, H, hh, dk, DE, L);
    __syncthreads();
    const auto mask = [&](int c, int j) { return scale * GkaMaskUpper{sm.gl}(c, j); };   // s M^T
    // dV = diag(e) K DUend + s ((K Qt^T) (.) M^T) dO
    float p[4][4];
    gka_frags_zero<4>(p);
    gka_masked_s<false, true>(sm.S, sm.K, sm.Qt, r0, sc0, lane, mask);
    gka_add_row_scaled_product<true>(p, sm.K, sm.DU, sm.e, r0, hc0, lane);
    named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);
    gka_warp_mma<4, GKA_CHECKPOINT, true, true, false>(p, sm.S, LDS, r0, sm.dO, LDK, hc0, lane);
    gka_frags_store<false>(dqkv + row0 * DE + 2 * H * dk + hh * dv, DE, p, 1.0f, r0, hc0, L, dv, lane);
    // dK_U = diag(e) V DUend^T + s ((V dO^T) (.) M^T) Qt, added to pass 3a's dK_H in dqkv's k part
    gka_frags_zero<4>(p);
    named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);   // the block is done with S before it is written again
    gka_masked_s<false, false>(sm.S, sm.V, sm.dO, r0, sc0, lane, mask);
    gka_add_row_scaled_product<false>(p, sm.V, sm.DU, sm.e, r0, hc0, lane);
    named_barrier_sync(1 + blk, 32 * GKA_SOLVE_WPR);
    gka_warp_mma<4, GKA_CHECKPOINT, true, true, true>(p, sm.S, LDS, r0, sm.Qt, LDK, hc0, lane);
    gka_row_dots_part(sm.kdk, p, r0, hc0, part, lane, [&](int c, int j) {
        return __bfloat162float(sm.K.hi[c * LDK + j]);
    });
    gka_frags_store<true>(dqkv + row0 * DE + H * dk + hh * dk, DE, p, 1.0f, r0, hc0, L, dk, lane);
    // dq_hat = (1 - alpha) dQt + Z, dalpha_c = dQt[c].(x_c - q_hat_c) and qt_c.dQt[c], a warp per row (rows warp +
    // 16 i), lane-strided sums then a fixed tree. Each lane's operands of all its warp's rows are loaded before any is
    // used: one memory latency instead of one per element (ncu, H200: the element-by-element loop's waits for its
    // loads were a fifth of the kernel's stall samples)
    constexpr int RW = GKA_CHECKPOINT / GKA_SOLVE_WARPS, PL = GKA_SOLVE_DK / 32;   // rows per warp, columns per lane
    float qv[RW][PL], xv[RW][PL], dqv[RW][PL], zv[RW][PL], alv[RW];
    #pragma unroll
    for (int i = 0; i < RW; i++) {
        const int c = warp + GKA_SOLVE_WARPS * i;
        const size_t ec = e0 + (size_t)c * H;
        alv[i] = c < L ? alpha[ec] : 0.0f;
        #pragma unroll
        for (int u = 0; u < PL; u++) {
            const int j = lane + 32 * u;
            const bool in = c < L && j < dk;
            qv[i][u] = in ? to_float(qkv[(row0 + c) * DE + hh * dk + j]) : 0.0f;
            xv[i][u] = in ? x[ec * dk + j] : 0.0f;
            dqv[i][u] = in ? dQt[ec * dk + j] : 0.0f;
            zv[i][u] = in ? Z[ec * dk + j] : 0.0f;
        }
    }
    #pragma unroll
    for (int i = 0; i < RW; i++) {
        const int c = warp + GKA_SOLVE_WARPS * i;
        if (c >= L) { continue; }   // the whole warp
        const size_t ec = e0 + (size_t)c * H;
        float da = 0.0f, qd = 0.0f;
        #pragma unroll
        for (int u = 0; u < PL; u++) {
            const int j = lane + 32 * u;
            if (j >= dk) { continue; }
            const float q = qv[i][u], xq = xv[i][u] - q, d = dqv[i][u];
            dqkv[(row0 + c) * DE + hh * dk + j] = (1.0f - alv[i]) * d + zv[i][u];
            da += d * xq;
            qd += (q + alv[i] * xq) * d;
        }
        for (int o = 16; o > 0; o >>= 1) {
            da += __shfl_xor_sync(0xffffffffu, da, o);
            qd += __shfl_xor_sync(0xffffffffu, qd, o);
        }
        if (lane == 0) {
            dalpha[ec] = da;
            sm.qdq[c] = qd;
        }
    }
    __syncthreads();
    if (tid < L) {   // dG (U part) = qt.dQt - k.dK_U, the warps' parts in a fixed order
        float kd = 0.0f;
        for (int q = 0; q < GKA_SOLVE_WPR; q++) { kd += sm.kdk[GKA_SOLVE_WPR * tid + q]; }
        dG[e0 + (size_t)tid * H] += sm.qdq[tid] - kd;
    }
}

#endif // ENABLE_BF16

// dg_t = sum_{s >= t} dG_s over each sequence: one warp per (b, head), lane i taking the i-th of 32 contiguous
// segments of the sequence. Each lane sums its segment, adds the totals of the segments after it (in lane order)
// and walks its segment backwards: the same sums in the same order on every run.
#define GKA_SCAN_WARPS 8
__global__ void __launch_bounds__(GKA_SCAN_WARPS * 32)
gka_dg_scan_kernel(float* dg, const float* dG, int B, int T, int H) {
    __shared__ float totals[GKA_SCAN_WARPS][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, bh = blockIdx.x * GKA_SCAN_WARPS + warp;
    const int b = bh / H, hh = bh % H, seg = (T + 31) / 32, t0 = min(T, lane * seg), t1 = min(T, t0 + seg);
    const bool live = bh < B * H;
    float acc = 0.0f;
    for (int t = t1 - 1; live && t >= t0; t--) { acc += dG[((size_t)b * T + t) * H + hh]; }
    totals[warp][lane] = acc;
    __syncthreads();
    float later = 0.0f;
    for (int l = 31; l > lane; l--) { later += totals[warp][l]; }
    for (int t = t1 - 1; live && t >= t0; t--) {
        const size_t e = ((size_t)b * T + t) * H + hh;
        later += dG[e];
        dg[e] = later;
    }
}

// ---- host side

static void gka_kernel_smem(const void* kernel, size_t smem, int dk, int dv) {
    gka_core_check(smem, dk, dv);
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
}

// the chunk kernels' tile products, as dev/cuda/gka_core.cu's versions run them: fp32 on CUDA cores (version 2, and
// dev/emu's), 3xTF32 wmma (gka_mm's TC; versions 3 and 4), the two solves, the readout and dQt on register tiles
// (gka_chunk_solve_mma_kernel, gka_chunk_product_mma_kernel) and the rest of the backward 3xTF32 (version 5), or
// pass 3a on register tiles too (gka_chunk_dk_h_mma_kernel; version 6), or pass 3b too (gka_chunk_du_mma_kernel;
// version 7), or the solves on warpgroup MMAs too (gka_chunk_solve_wgmma_kernel; version 8, sm_90a), or the
// chunk-state terms of the forward and of pass 2 on register tiles too, each walk over the chunks with its recurrence
// in one kernel (gka_chunk_states_mma_kernel, gka_chunk_adjoints_mma_kernel; version 9), or the wgmma solves in fp16 with H0 in one piece
// (gka_chunk_solve_wgmma_kernel<true>; version 10: 5.8% faster, errors 10-40x), or the bf16 solves with X H0 in
// one piece over their first iterations (gka_chunk_solve_wgmma_kernel<false, true>; version 11), or lean
// (gka_chunk_solve_lean_kernel; version 12), or solo, a warpgroup per chunk (gka_chunk_solve_solo_wgmma_kernel; version 13,
// and with F16 version 14), or the incremental form's (gka_chunk_solve_wgmma_kernel<false, false, true>; version
// 15, the trainer's). The register tiles are the bf16 build's (gka_chunk_solve_mma_kernel's header says why).
enum GkaProducts { GKA_PRODUCTS_FP32, GKA_PRODUCTS_TF32, GKA_PRODUCTS_MMA, GKA_PRODUCTS_MMA_DKH, GKA_PRODUCTS_MMA_PASS3,
                   GKA_PRODUCTS_WGMMA, GKA_PRODUCTS_MMA_STATES, GKA_PRODUCTS_F16_SOLVE, GKA_PRODUCTS_MIXED_SOLVE,
                   GKA_PRODUCTS_LEAN_SOLVE, GKA_PRODUCTS_SOLO_SOLVE, GKA_PRODUCTS_SOLO_F16_SOLVE,
                   GKA_PRODUCTS_INCREMENT_SOLVE };
// whether the solves read H0's tiles made for fp16 (gka_h0_tiles' f16)
static bool gka_products_f16_h0(GkaProducts p) {
    return p == GKA_PRODUCTS_F16_SOLVE || p == GKA_PRODUCTS_LEAN_SOLVE || p == GKA_PRODUCTS_SOLO_F16_SOLVE;
}
// what the trainer runs
#if defined(ENABLE_FP32)
#define GKA_PRODUCTS GKA_PRODUCTS_TF32
#else
#define GKA_PRODUCTS GKA_PRODUCTS_INCREMENT_SOLVE
#endif
// what the trainer runs: the backward's passes 2 and 3 on the chunks (dev/cuda/gka_core.cu version 4; the recurrent
// remainder, version 3, stays as the lab's baseline and dev/emu's reference)
#define GKA_CHUNKED_BACKWARD true

// a chunk kernel of the chosen products, with its block size and shared memory (gka_kernel_smem sets it)
template <typename Kernel> struct GkaLaunch {
    Kernel kernel;
    int threads;
    size_t smem;
};
// the FP32 build's one-line error when a register-tile kernel (the bf16 build's) is asked for
#define GKA_MMA_BF16_ONLY "gka on the GPU: the register-tile kernels (GKA_PRODUCTS_MMA and after) are the bf16 build's"
#if defined(ENABLE_FP32)
#define GKA_MMA_LAUNCH(...) die(GKA_MMA_BF16_ONLY)
static void gka_h0_tiles(__nv_bfloat16*, float*, const float*, int, int, bool, cudaStream_t) {
    die("gka on the GPU: the wgmma solve's H0 tiles are the bf16 build's");
}
#else
#define GKA_MMA_LAUNCH(...) (l = {__VA_ARGS__})
#endif

// the solve
typedef void (*GKASolveKernel)(float*, float*, int, const float*, const float*, const floatX*, const float*, GkaH0,
                               int, int, int, int, int, float);
static GkaLaunch<GKASolveKernel> gka_solve_launch(GkaProducts products, int dk, int dv, int iters) {
    GkaLaunch<GKASolveKernel> l = {products == GKA_PRODUCTS_TF32 ? gka_chunk_solve_kernel<true>
                                                                 : gka_chunk_solve_kernel<false>,
                                   GKA_CHUNK_THREADS, gka_chunk_solve_smem(dk, iters)};
    if (products >= GKA_PRODUCTS_MMA) {
        GKA_MMA_LAUNCH(gka_chunk_solve_mma_kernel, GKA_SOLVE_THREADS, gka_chunk_solve_mma_smem(iters));
    }
    if (products >= GKA_PRODUCTS_WGMMA) {
        static int in_image = -1;   // asked once: whether the device code running is sm_90a's (kernels/mma.cuh)
        if (in_image < 0) { cudaCheck(cudaMemcpyFromSymbol(&in_image, wgmma_image, sizeof(int))); }
        if (!in_image) { die("gka: the bf16 solve runs on wgmma, which needs device code built for sm_90a (make's GPU_COMPUTE_CAPABILITY=90)"); }
        if (products == GKA_PRODUCTS_F16_SOLVE) {
            GKA_MMA_LAUNCH(gka_chunk_solve_wgmma_kernel<true>, GKA_WG_THREADS, gka_chunk_solve_wgmma_smem(iters));
        } else if (products == GKA_PRODUCTS_LEAN_SOLVE) {
            GKA_MMA_LAUNCH(gka_chunk_solve_lean_kernel, GKA_WG_THREADS, gka_chunk_solve_lean_smem(iters));
        } else if (products == GKA_PRODUCTS_SOLO_SOLVE) {
            GKA_MMA_LAUNCH(gka_chunk_solve_solo_wgmma_kernel<false>, GKA_SOLO_THREADS, gka_chunk_solve_solo_smem(iters));
        } else if (products == GKA_PRODUCTS_SOLO_F16_SOLVE) {
            GKA_MMA_LAUNCH(gka_chunk_solve_solo_wgmma_kernel<true>, GKA_SOLO_THREADS, gka_chunk_solve_solo_smem(iters));
        } else if (products == GKA_PRODUCTS_INCREMENT_SOLVE) {
            GKA_MMA_LAUNCH((gka_chunk_solve_wgmma_kernel<false, false, true>), GKA_WG_THREADS,
                           gka_chunk_solve_wgmma_smem(iters));
        } else if (products == GKA_PRODUCTS_MIXED_SOLVE) {
            GKA_MMA_LAUNCH((gka_chunk_solve_wgmma_kernel<false, true>), GKA_WG_THREADS,
                           gka_chunk_solve_wgmma_smem(iters));
        } else {
            GKA_MMA_LAUNCH(gka_chunk_solve_wgmma_kernel<false>, GKA_WG_THREADS, gka_chunk_solve_wgmma_smem(iters));
        }
    }
    gka_kernel_smem((const void*)l.kernel, l.smem, dk, dv);
    return l;
}

// the readout, or with dqt the backward's dQt
typedef void (*GKAProductKernel)(floatX*, float*, const float*, const floatX*, const floatX*, const float*,
                                 const float*, const float*, int, int, int, int, float);
static GkaLaunch<GKAProductKernel> gka_product_launch(GkaProducts products, bool dqt, int dk, int dv) {
    GkaLaunch<GKAProductKernel> l = {products == GKA_PRODUCTS_TF32 ? gka_chunk_product_kernel<true>
                                                                   : gka_chunk_product_kernel<false>,
                                     GKA_CHUNK_THREADS, gka_chunk_product_smem(dk, dv)};
    if (products >= GKA_PRODUCTS_MMA) {
        GKA_MMA_LAUNCH(dqt ? gka_chunk_product_mma_kernel<true> : gka_chunk_product_mma_kernel<false>,
                       GKA_SOLVE_THREADS, gka_chunk_product_mma_smem());
    }
    gka_kernel_smem((const void*)l.kernel, l.smem, dk, dv);
    return l;
}

// the backward's pass 3a (dK_H, dG's H part)
typedef void (*GKADkhKernel)(float*, float*, const float*, const float*, const float*, const float*, const float*,
                             const floatX*, const float*, const float*, int, int, int, int);
static GkaLaunch<GKADkhKernel> gka_dk_h_launch(GkaProducts products, int dk, int dv) {
    GkaLaunch<GKADkhKernel> l = {products == GKA_PRODUCTS_FP32 ? gka_chunk_dk_h_kernel<false>
                                                               : gka_chunk_dk_h_kernel<true>,
                                 GKA_CHUNK_THREADS, gka_chunk_dk_h_smem(dk)};
    if (products >= GKA_PRODUCTS_MMA_DKH) {
        GKA_MMA_LAUNCH(gka_chunk_dk_h_mma_kernel, GKA_SOLVE_THREADS, gka_chunk_dk_h_mma_smem());
    }
    gka_kernel_smem((const void*)l.kernel, l.smem, dk, dv);
    return l;
}

// pass 3b (dV, dK_U, dq_hat, dalpha, dG's U part)
typedef void (*GKADuKernel)(float*, float*, float*, const float*, const float*, const float*, const floatX*,
                            const float*, const floatX*, const float*, const float*, int, int, int, int, float);
static GkaLaunch<GKADuKernel> gka_du_launch(GkaProducts products, int dk, int dv) {
    GkaLaunch<GKADuKernel> l = {products == GKA_PRODUCTS_FP32 ? gka_chunk_du_kernel<false> : gka_chunk_du_kernel<true>,
                                GKA_CHUNK_THREADS, gka_chunk_du_smem(dk, dv)};
    if (products >= GKA_PRODUCTS_MMA_PASS3) {
        GKA_MMA_LAUNCH(gka_chunk_du_mma_kernel, GKA_SOLVE_THREADS, gka_chunk_du_mma_smem());
    }
    gka_kernel_smem((const void*)l.kernel, l.smem, dk, dv);
    return l;
}

// the forward's chunk states Hck, Uck (spec 5.1(a)): on CUDA cores every chunk's term (gka_chunk_state_terms_kernel),
// then the recurrence over the chunks (gka_state_scan_kernel); with GKA_PRODUCTS_MMA_STATES both in one pass on
// register tiles (gka_chunk_states_mma_kernel), the same values
static void gka_chunk_states(GkaProducts products, float* Hck, float* Uck, const floatX* qkv, const float* g, int B,
                             int T, int H, int dk, int dv, cudaStream_t stream) {
    const int NT = gka_chunks(T);
    if (products < GKA_PRODUCTS_MMA_STATES) {
        if (NT > 1) {
            gka_chunk_state_terms_kernel<<<dim3(1, NT - 1, B * H), GKA_STATE_THREADS, 0, stream>>>(Hck, Uck, qkv, g,
                                                                                                 T, H, dk, dv);
            cudaCheckLaunch();
        }
        gka_state_scan_kernel<<<dim3(ceil_div(dk * dk, GKA_SCAN_THREADS), B * H), GKA_SCAN_THREADS, 0, stream>>>(
            Hck, dk * dk, g, T, H, 0);
        cudaCheckLaunch();
        gka_state_scan_kernel<<<dim3(ceil_div(dk * dv, GKA_SCAN_THREADS), B * H), GKA_SCAN_THREADS, 0, stream>>>(
            Uck, dk * dv, g, T, H, 0);
        cudaCheckLaunch();
        return;
    }
#if defined(ENABLE_BF16)
    const size_t smem = gka_state_mma_smem();
    gka_kernel_smem((const void*)gka_chunk_states_mma_kernel, smem, dk, dv);
    gka_chunk_states_mma_kernel<<<dim3(gka_state_blocks(dk, dv), B * H), GKA_STATE_MMA_THREADS, smem, stream>>>(
        Hck, Uck, qkv, g, T, H, dk, dv);
    cudaCheckLaunch();
#else
    die(GKA_MMA_BF16_ONLY);
#endif
}
// pass 2's end adjoints adj (spec 5.2): on CUDA cores every chunk's part (gka_chunk_adjoint_terms_kernel), then the
// reverse recurrence (gka_state_scan_kernel); with GKA_PRODUCTS_MMA_STATES both in one pass on register tiles
// (gka_chunk_adjoints_mma_kernel), the same values
static void gka_adjoints(GkaProducts products, float* adj, const float* Z, const float* x, const float* w,
                         const floatX* dO, const floatX* qkv, const float* alpha, const float* g, const float* Hck,
                         int B, int T, int H, int dk, int dv, float scale, cudaStream_t stream) {
    const int NT = gka_chunks(T);
    if (products < GKA_PRODUCTS_MMA_STATES) {
        if (NT > 1) {
            gka_chunk_adjoint_terms_kernel<<<dim3(3, NT - 1, B * H), GKA_ADJ_THREADS, 0, stream>>>(
                adj, Z, x, w, dO, qkv, alpha, g, Hck, T, H, dk, dv, scale);
            cudaCheckLaunch();
        }
        gka_state_scan_kernel<<<dim3(ceil_div(2 * dk * dk + dk * dv, GKA_SCAN_THREADS), B * H), GKA_SCAN_THREADS, 0,
                                stream>>>(adj, 2 * dk * dk + dk * dv, g, T, H, 1);
        cudaCheckLaunch();
        return;
    }
#if defined(ENABLE_BF16)
    const size_t smem = gka_state_mma_smem();
    gka_kernel_smem((const void*)gka_chunk_adjoints_mma_kernel, smem, dk, dv);
    gka_chunk_adjoints_mma_kernel<<<dim3(gka_adjoint_blocks(dk, dv), B * H), GKA_STATE_MMA_THREADS, smem, stream>>>(
        adj, Z, x, w, dO, qkv, alpha, g, Hck, T, H, dk, dv, scale);
    cudaCheckLaunch();
#else
    die(GKA_MMA_BF16_ONLY);
#endif
}

// spec 5.1: o, x, f, and the chunk states Hck, Uck (the backward's checkpoints); H_0 = U_0 = 0; with
// GKA_PRODUCTS_WGMMA and after also H0t, h0sq (gka_h0_tiles_elems and B*H*NT; else they may be NULL), which the
// backward's solve reads too. products: the chunk kernels' tile products (GkaProducts).
static void gka_core_forward(floatX* o, float* x, float* f, float* Hck, float* Uck, __nv_bfloat16* H0t, float* h0sq,
                             const floatX* qkv, const float* alpha, const float* g, int B, int T, int H, int dk,
                             int dv, int iters, float ridge, GkaProducts products, cudaStream_t stream) {
    const int NT = gka_chunks(T);
    const GkaLaunch<GKASolveKernel> solve = gka_solve_launch(products, dk, dv, iters);
    const GkaLaunch<GKAProductKernel> readout = gka_product_launch(products, false, dk, dv);
    gka_chunk_states(products, Hck, Uck, qkv, g, B, T, H, dk, dv, stream);
    if (products >= GKA_PRODUCTS_WGMMA) {
        if (H0t == NULL || h0sq == NULL) { die("gka_core_forward: the wgmma solves need the H0 tiles (H0t, h0sq)"); }
        gka_h0_tiles(H0t, h0sq, Hck, B * H * NT, dk, gka_products_f16_h0(products), stream);
    }
    solve.kernel<<<dim3(NT, B * H), solve.threads, solve.smem, stream>>>(x, f, 1, NULL, alpha, qkv, g,
                                                                        GkaH0{Hck, H0t, h0sq}, T, H, dk, dv, iters,
                                                                        ridge);
    cudaCheckLaunch();
    readout.kernel<<<dim3(NT, B * H), readout.threads, readout.smem, stream>>>(o, NULL, x, NULL, qkv, alpha, g, Uck, T,
                                                                              H, dk, dv, 1.0f / sqrtf((float)dk));
    cudaCheckLaunch();
}

// the backward's scratch: dQt and Z [B*T, H*dk], then the recurrent part's segment states, or (chunked) the adjoint
// states of pass 2 and w, dG [B*T, H]
static size_t gka_core_backward_scratch_floats(int B, int T, int H, int dk, int dv) {
    const size_t seg = (size_t)B * H * GKA_CHECKPOINT * ((size_t)dk * dk + (size_t)dk * dv);
    const size_t adj = (size_t)B * H * gka_chunks(T) * (2 * (size_t)dk * dk + (size_t)dk * dv) + 2 * (size_t)B * T * H;
    return 2 * (size_t)B * T * H * dk + (seg > adj ? seg : adj);
}

// spec 5.2 pass 1 (dQt, the adjoint solve Z) on the chunks (products, H0t, h0sq: gka_core_forward's), then the rest:
// chunked, passes 2 and 3 on the chunks (on tensor cores unless products is GKA_PRODUCTS_FP32); else the rest of
// 3.2 as the recurrence. Final-state gradients 0. Writes dqkv (dL/d q_hat | k | v), dalpha, dg.
static void gka_core_backward(float* dqkv, float* dalpha, float* dg, float* scratch, const floatX* dO,
                              const float* Hck, const float* Uck, const __nv_bfloat16* H0t, const float* h0sq,
                              const floatX* qkv, const float* alpha, const float* g,
                              const float* x, const float* f, int B, int T, int H, int dk, int dv, int iters,
                              float ridge, GkaProducts products, bool chunked, cudaStream_t stream) {
    const int NT = gka_chunks(T);
    const float scale = 1.0f / sqrtf((float)dk);
    float* dQt = scratch;
    float* Z = dQt + (size_t)B * T * H * dk;
    float* rest = Z + (size_t)B * T * H * dk;
    const GkaLaunch<GKASolveKernel> solve = gka_solve_launch(products, dk, dv, iters);
    const GkaLaunch<GKAProductKernel> dqt = gka_product_launch(products, true, dk, dv);
    dqt.kernel<<<dim3(NT, B * H), dqt.threads, dqt.smem, stream>>>(NULL, dQt, NULL, dO, qkv, alpha, g, Uck, T, H, dk, dv,
                                                                  scale);
    cudaCheckLaunch();
    solve.kernel<<<dim3(NT, B * H), solve.threads, solve.smem, stream>>>(Z, (float*)f, 0, dQt, alpha, qkv, g,
                                                                        GkaH0{Hck, H0t, h0sq}, T, H, dk, dv, iters,
                                                                        ridge);
    cudaCheckLaunch();
    if (!chunked) {
        const size_t rec = gka_core_backward_smem(dk, dv);
        gka_kernel_smem((const void*)gka_core_backward_kernel, rec, dk, dv);
        gka_core_backward_kernel<<<B * H, GKA_CORE_THREADS, rec, stream>>>(dqkv, dalpha, dg, rest, dQt, Z, dO, Hck, Uck,
                                                                           qkv, alpha, g, x, f, T, H, dk, dv, ridge,
                                                                           scale);
        cudaCheckLaunch();
        return;
    }
    const int rows = B * T * H;
    float* adj = rest;
    float* w = adj + (size_t)B * H * NT * (2 * (size_t)dk * dk + (size_t)dk * dv);
    float* dG = w + rows;
    const GkaLaunch<GKADkhKernel> dkh = gka_dk_h_launch(products, dk, dv);
    const GkaLaunch<GKADuKernel> du = gka_du_launch(products, dk, dv);
    gka_w_kernel<<<ceil_div(rows, GKA_W_WARPS), GKA_W_WARPS * 32, 0, stream>>>(w, x, Z, f, rows, dk, ridge);
    cudaCheckLaunch();
    gka_adjoints(products, adj, Z, x, w, dO, qkv, alpha, g, Hck, B, T, H, dk, dv, scale, stream);
    dkh.kernel<<<dim3(NT, B * H), dkh.threads, dkh.smem, stream>>>(dqkv, dG, adj, Z, x, f, w, qkv, g, Hck, T, H, dk,
                                                                  dv);
    cudaCheckLaunch();
    du.kernel<<<dim3(NT, B * H), du.threads, du.smem, stream>>>(dqkv, dalpha, dG, adj, dQt, Z, dO, x, qkv, alpha, g, T,
                                                                  H, dk, dv, scale);
    cudaCheckLaunch();
    gka_dg_scan_kernel<<<ceil_div(B * H, GKA_SCAN_WARPS), GKA_SCAN_WARPS * 32, 0, stream>>>(dg, dG, B, T, H);
    cudaCheckLaunch();
}

#endif // TRAIN_KLA_KERNELS_GKA_CUH
