/*
kernels/kalman_scan.cuh: the filter of the kalman mixer (spec/kalman.md 2.3-2.5) and its static dynamics (spec 1.3
step 6, backward 1.7). The CPU versions are kalman_filter_forward, kalman_filter_backward, kalman_dynamics and the
end of kalman_backward in train_kla.c.

A lane is (b, d, n). Per lane, with phi = Lv k^2 and r = v Lv k (spec 2.3, floors of spec 2.5):
    rho = 1 / max(max(abar^2, 1e-12) + pbar lam, 1e-12)
    eta <- abar rho eta + r,  lam <- lam rho + phi,  y[b,t,d] = sum_n q[n] eta[n] / max(lam[n], 1e-12)
    lam_0 = 1, eta_0 = 0 at the start of every sequence

This is the sequential version of spec 3.5: one thread per lane runs the recurrence serially over T with its state
(lam, eta) in fp32 registers in both builds. A block holds KALMAN_CPB channels of one sequence, each as a group of
G = N rounded up to a power of two threads (lanes n >= N idle), so the read-out sum over n is a fixed shuffle tree
inside the group. The forward checkpoints (lam, eta) every KALMAN_CK tokens; the backward (spec 2.4, the exact
reverse-time adjoint) runs the segments from the last to the first, replaying each one's states from its
checkpoint into a per-thread array (local memory) and then stepping the adjoint back through it.

Layouts (row-major): v [B*T, ldv] floatX (its first Dk columns), Lv, dys, dv, dLv [B*T, Dk] fp32, k, q, dk, dq
[B*T, N] fp32, abar, pbar, dabar, dpbar [Dk, N] fp32, checkpoints [B, NT, Dk, 2N] fp32 (lam | eta).

Determinism, no atomics: dk and dq (sums over the channels) are reduced in a fixed tree inside a block, written as
one partial row per block, then summed over the blocks in order; dabar and dpbar (sums over b and t) are summed
over t in each thread and over b in order by a second kernel.
*/
#ifndef TRAIN_KLA_KERNELS_KALMAN_SCAN_CUH
#define TRAIN_KLA_KERNELS_KALMAN_SCAN_CUH

#include "common.cuh"

#define KALMAN_FLOOR 1e-12f   // the floors of spec 2.5 (abar^2, den, lam, pbar) and the L2-norm floor
#define KALMAN_CK 64          // checkpoint interval of the filter (spec 3.5)
#define KALMAN_CPB 32         // channels per block of the filter kernels
#define KALMAN_MAX_N 32       // the largest N the filter kernels run (a group of N lanes lives in one warp)

static inline int kalman_group(int N) {
    if (N < 1 || N > KALMAN_MAX_N) {
        die("--kalman-n: %d states per channel is not supported by train_kla.cu (1..%d; train_kla runs any N)", N,
            KALMAN_MAX_N);
    }
    int G = 1;
    while (G < N) { G *= 2; }
    return G;
}
static inline int kalman_num_ck(int T) { return ceil_div(T, KALMAN_CK); }
static inline int kalman_num_blocks(int Dk) { return ceil_div(Dk, KALMAN_CPB); }

// the checkpoints the forward saves for the backward
static size_t kalman_checkpoint_floats(int B, int T, int Dk, int N) {
    return (size_t)B * kalman_num_ck(T) * Dk * 2 * N;
}
// the backward's partial sums: dk | dq per (b, channel block, t) [B, NDB, T, 2N], dabar | dpbar per (b, d) [B, Dk, 2N]
static size_t kalman_filter_backward_scratch_bytes(int B, int T, int Dk, int N) {
    return ((size_t)B * kalman_num_blocks(Dk) * T * 2 * N + (size_t)B * Dk * 2 * N) * sizeof(float);
}

// sum over the G lanes of a group (a fixed tree: the same order for every call)
__device__ __forceinline__ float kalman_group_sum(float x, int G) {
    for (int o = G / 2; o > 0; o >>= 1) { x += __shfl_xor_sync(0xffffffffu, x, o, G); }
    return x;
}

// ----------------------------------------------------------------------------------------------------------
// forward (spec 2.3)

// grid (NDB, B), block KALMAN_CPB * G. ys [B*T, Dk] written. ck: checkpoints (NULL: none). lam_io, eta_io
// [B, Dk, N]: NULL, every sequence starts from the prior; else the state carried in (the prior when from_prior)
// and the final state written back (decode, spec 4).
__global__ void kalman_filter_forward_kernel(float* ys, float* ck, float* lam_io, float* eta_io, int from_prior,
                                             const floatX* v, int ldv, const float* Lv, const float* k,
                                             const float* q, const float* abar, const float* pbar, int T, int Dk,
                                             int N, int G) {
    const int n = threadIdx.x % G, d = blockIdx.x * KALMAN_CPB + threadIdx.x / G, b = blockIdx.y;
    const int active = n < N && d < Dk;
    const size_t lane = ((size_t)b * Dk + d) * N + n;
    const int NT = (T + KALMAN_CK - 1) / KALMAN_CK;
    float a = 0.0f, pb = 0.0f, lam = 1.0f, eta = 0.0f;
    if (active) {
        a = abar[(size_t)d * N + n];
        pb = pbar[(size_t)d * N + n];
        if (lam_io && !from_prior) { lam = lam_io[lane]; eta = eta_io[lane]; }
    }
    const float a2 = fmaxf(a * a, KALMAN_FLOOR);
    for (int t = 0; t < T; t++) {
        const size_t r = (size_t)b * T + t;
        float y = 0.0f;
        if (active) {
            if (ck && t % KALMAN_CK == 0) {
                float* cp = ck + (((size_t)b * NT + t / KALMAN_CK) * Dk + d) * 2 * N;
                cp[n] = lam;
                cp[N + n] = eta;
            }
            const float Lvt = Lv[r * Dk + d], kt = k[r * N + n];
            const float ut = to_float(v[r * ldv + d]) * Lvt;
            const float rho = 1.0f / fmaxf(a2 + pb * lam, KALMAN_FLOOR);
            eta = a * rho * eta + ut * kt;
            lam = lam * rho + Lvt * kt * kt;
            y = q[r * N + n] * eta / fmaxf(lam, KALMAN_FLOOR);
        }
        y = kalman_group_sum(y, G);
        if (n == 0 && d < Dk) { ys[r * Dk + d] = y; }
    }
    if (lam_io && active) { lam_io[lane] = lam; eta_io[lane] = eta; }
}

static void kalman_filter_forward(float* ys, float* ck, float* lam_io, float* eta_io, int from_prior,
                                  const floatX* v, int ldv, const float* Lv, const float* k, const float* q,
                                  const float* abar, const float* pbar, int B, int T, int Dk, int N,
                                  cudaStream_t stream) {
    const int G = kalman_group(N);
    kalman_filter_forward_kernel<<<dim3(kalman_num_blocks(Dk), B), KALMAN_CPB * G, 0, stream>>>(
        ys, ck, lam_io, eta_io, from_prior, v, ldv, Lv, k, q, abar, pbar, T, Dk, N, G);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// backward (spec 2.4): exact reverse-time adjoint, no gradient of the final state; zero subgradient where a
// floor binds (spec 2.5)

// grid (NDB, B), block KALMAN_CPB * G (G warps). Writes dv, dLv [B*T, Dk], the block's partial row of dk | dq per
// token into kq_part [B, NDB, T, 2N] and the lane's dabar | dpbar (summed over t) into ap_part [B, Dk, 2N].
__global__ void kalman_filter_backward_kernel(float* dv, float* dLv, float* kq_part, float* ap_part,
                                              const float* dys, const float* ck, const floatX* v, int ldv,
                                              const float* Lv, const float* k, const float* q, const float* abar,
                                              const float* pbar, int T, int Dk, int N, int G) {
    // the warps' sums of dk | dq over their channels, double-buffered by token parity (one barrier per token)
    __shared__ float warp_sums[2][KALMAN_MAX_N][2][KALMAN_MAX_N];
    const int n = threadIdx.x % G, d = blockIdx.x * KALMAN_CPB + threadIdx.x / G, b = blockIdx.y;
    const int warp = threadIdx.x / 32, lane32 = threadIdx.x % 32, num_warps = blockDim.x / 32;
    const int active = n < N && d < Dk;
    const int NT = (T + KALMAN_CK - 1) / KALMAN_CK, NDB = gridDim.x;
    float seg_lam[KALMAN_CK + 1], seg_eta[KALMAN_CK + 1];   // the segment's states lam_{t0-1+i}, eta_{t0-1+i}
    float a = 0.0f, pb = 0.0f;
    if (active) { a = abar[(size_t)d * N + n]; pb = pbar[(size_t)d * N + n]; }
    const float a2raw = a * a, a2 = fmaxf(a2raw, KALMAN_FLOOR);
    float Gl = 0.0f, Ge = 0.0f, gab = 0.0f, gpb = 0.0f;   // dL/dlam_t, dL/deta_t carried back; dabar, dpbar
    for (int sg = NT - 1; sg >= 0; sg--) {
        const int t0 = sg * KALMAN_CK, L = min(KALMAN_CK, T - t0);
        float lam = 1.0f, eta = 0.0f;
        if (active) {
            const float* cp = ck + (((size_t)b * NT + sg) * Dk + d) * 2 * N;
            lam = cp[n];
            eta = cp[N + n];
        }
        // replay the segment (the forward's arithmetic exactly)
        for (int i = 0; i < L; i++) {
            seg_lam[i] = lam;
            seg_eta[i] = eta;
            if (active) {
                const size_t r = (size_t)b * T + t0 + i;
                const float Lvt = Lv[r * Dk + d], kt = k[r * N + n];
                const float ut = to_float(v[r * ldv + d]) * Lvt;
                const float rho = 1.0f / fmaxf(a2 + pb * lam, KALMAN_FLOOR);
                eta = a * rho * eta + ut * kt;
                lam = lam * rho + Lvt * kt * kt;
            }
        }
        seg_lam[L] = lam;
        seg_eta[L] = eta;
        for (int i = L - 1; i >= 0; i--) {
            const int t = t0 + i;
            const size_t r = (size_t)b * T + t;
            float sLv = 0.0f, sv = 0.0f, cdk = 0.0f, cdq = 0.0f, Lvt = 0.0f;
            if (active) {
                const float lp = seg_lam[i], ep = seg_eta[i], lt = seg_lam[i + 1], et = seg_eta[i + 1];
                const float kk = k[r * N + n], qt = q[r * N + n], dy = dys[r * Dk + d];
                const float vt = to_float(v[r * ldv + d]);
                Lvt = Lv[r * Dk + d];
                const float denraw = a2 + pb * lp;
                const float rho = 1.0f / fmaxf(denraw, KALMAN_FLOOR);
                const float var = 1.0f / fmaxf(lt, KALMAN_FLOOR);
                const float gmean = dy * qt;
                const float ge = Ge + gmean * var;
                const float gl = lt > KALMAN_FLOOR ? Gl - gmean * et * var * var : Gl;
                cdq = dy * et * var;
                // through den = a2 + pbar lam_{t-1}: gden = dL/dden
                const float gden = denraw > KALMAN_FLOOR ? -(gl * lp + ge * ep * a) * rho * rho : 0.0f;
                gab += ge * ep * rho + (a2raw > KALMAN_FLOOR ? 2.0f * a * gden : 0.0f);
                gpb += gden * lp;
                Gl = denraw > KALMAN_FLOOR ? (gl * a2 - ge * ep * a * pb) * rho * rho : gl * rho;
                Ge = a * rho * ge;
                // the token's inputs: phi = Lv k^2, r = v Lv k
                sLv = gl * kk * kk + ge * vt * kk;
                sv = ge * kk;
                cdk = 2.0f * gl * Lvt * kk + ge * vt * Lvt;
            }
            sLv = kalman_group_sum(sLv, G);
            sv = kalman_group_sum(sv, G);
            if (n == 0 && d < Dk) {
                dLv[r * Dk + d] = sLv;
                dv[r * Dk + d] = sv * Lvt;
            }
            // dk, dq: the warp's channels (lanes n, n + G, ...) by a shuffle tree, then the warps in order
            for (int o = G; o < 32; o <<= 1) {
                cdk += __shfl_xor_sync(0xffffffffu, cdk, o);
                cdq += __shfl_xor_sync(0xffffffffu, cdq, o);
            }
            const int buf = t & 1;
            if (lane32 < G) {
                warp_sums[buf][warp][0][lane32] = cdk;
                warp_sums[buf][warp][1][lane32] = cdq;
            }
            __syncthreads();
            if (threadIdx.x < 2 * G) {
                const int which = threadIdx.x / G, m = threadIdx.x % G;
                if (m < N) {
                    float s = 0.0f;
                    for (int w = 0; w < num_warps; w++) { s += warp_sums[buf][w][which][m]; }
                    kq_part[(((size_t)b * NDB + blockIdx.x) * T + t) * 2 * N + which * N + m] = s;
                }
            }
        }
    }
    if (active) {
        float* part = ap_part + ((size_t)b * Dk + d) * 2 * N;
        part[n] = gab;
        part[N + n] = gpb;
    }
}

// dk, dq [B*T, N]: one thread per (row, n): the blocks' partials in block order
__global__ void kalman_kq_reduce_kernel(float* dk, float* dq, const float* kq_part, int B, int T, int N, int NDB) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * T * 2 * N) { return; }
    const int m = idx % (2 * N), r = idx / (2 * N), b = r / T, t = r % T;
    float s = 0.0f;
    for (int j = 0; j < NDB; j++) { s += kq_part[(((size_t)b * NDB + j) * T + t) * 2 * N + m]; }
    if (m < N) { dk[(size_t)r * N + m] = s; } else { dq[(size_t)r * N + m - N] = s; }
}

// dabar, dpbar [Dk, N]: one thread per (d, n): the sequences' partials in order
__global__ void kalman_ap_reduce_kernel(float* dabar, float* dpbar, const float* ap_part, int B, int Dk, int N) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= Dk * N) { return; }
    const int d = idx / N, n = idx % N;
    float sa = 0.0f, sp = 0.0f;
    for (int b = 0; b < B; b++) {
        const float* part = ap_part + ((size_t)b * Dk + d) * 2 * N;
        sa += part[n];
        sp += part[N + n];
    }
    dabar[idx] = sa;
    dpbar[idx] = sp;
}

// Outputs overwritten: dv, dLv [B*T, Dk], dk, dq [B*T, N], dabar, dpbar [Dk, N].
// scratch: kalman_filter_backward_scratch_bytes(B, T, Dk, N).
static void kalman_filter_backward(float* dv, float* dLv, float* dk, float* dq, float* dabar, float* dpbar,
                                   const float* dys, const float* ck, const floatX* v, int ldv, const float* Lv,
                                   const float* k, const float* q, const float* abar, const float* pbar, int B,
                                   int T, int Dk, int N, void* scratch, cudaStream_t stream) {
    const int G = kalman_group(N), NDB = kalman_num_blocks(Dk);
    float* kq_part = (float*)scratch;
    float* ap_part = kq_part + (size_t)B * NDB * T * 2 * N;
    kalman_filter_backward_kernel<<<dim3(NDB, B), KALMAN_CPB * G, 0, stream>>>(
        dv, dLv, kq_part, ap_part, dys, ck, v, ldv, Lv, k, q, abar, pbar, T, Dk, N, G);
    cudaCheckLaunch();
    kalman_kq_reduce_kernel<<<ceil_div(B * T * 2 * N, 256), 256, 0, stream>>>(dk, dq, kq_part, B, T, N, NDB);
    cudaCheckLaunch();
    kalman_ap_reduce_kernel<<<ceil_div(Dk * N, 256), 256, 0, stream>>>(dabar, dpbar, ap_part, B, Dk, N);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// static dynamics (spec 1.3 step 6, backward 1.7), one thread per (d, n), from the fp32 master parameters

__global__ void kalman_dynamics_kernel(float* abar, float* pbar, const float* delta_raw, const float* lambda_log,
                                       const float* p_raw, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    const float Delta = softplusf_dev(delta_raw[i]) + 1e-7f;
    const float kappa = expf(lambda_log[i]);
    const float pp = fmaxf(p_raw[i], 1e-7f);
    abar[i] = expf(-kappa * Delta);
    pbar[i] = fmaxf(pp / (2.0f * kappa) * -expm1f(-2.0f * kappa * Delta), KALMAN_FLOOR);
}

// gradients += from dabar, dpbar; E = exp(-2 kappa Delta); zero gradient where a clamp binds
__global__ void kalman_dynamics_backward_kernel(float* g_delta_raw, float* g_lambda_log, float* g_p_raw,
                                                const float* dabar, const float* dpbar, const float* abar,
                                                const float* delta_raw, const float* lambda_log,
                                                const float* p_raw, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    const float Delta = softplusf_dev(delta_raw[i]) + 1e-7f;
    const float kappa = expf(lambda_log[i]);
    const float pp = fmaxf(p_raw[i], 1e-7f);
    const float ab = abar[i];
    const float x2 = 2.0f * kappa * Delta;
    const float E = expf(-x2), omE = -expm1f(-x2);
    const float pbraw = pp / (2.0f * kappa) * omE;
    const float gp = pbraw > KALMAN_FLOOR ? dpbar[i] : 0.0f;
    const float dDelta = dabar[i] * (-kappa * ab) + gp * (pp * E);
    const float dkappa = dabar[i] * (-Delta * ab) + gp * (pp / kappa) * (Delta * E - omE / (2.0f * kappa));
    g_delta_raw[i] += dDelta * dsoftplusf_dev(delta_raw[i]);
    g_lambda_log[i] += dkappa * kappa;
    g_p_raw[i] += p_raw[i] > 1e-7f ? gp * omE / (2.0f * kappa) : 0.0f;
}

static void kalman_dynamics(float* abar, float* pbar, const float* delta_raw, const float* lambda_log,
                            const float* p_raw, int n, cudaStream_t stream) {
    kalman_dynamics_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(abar, pbar, delta_raw, lambda_log, p_raw, n);
    cudaCheckLaunch();
}

static void kalman_dynamics_backward(float* g_delta_raw, float* g_lambda_log, float* g_p_raw, const float* dabar,
                                     const float* dpbar, const float* abar, const float* delta_raw,
                                     const float* lambda_log, const float* p_raw, int n, cudaStream_t stream) {
    kalman_dynamics_backward_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(g_delta_raw, g_lambda_log, g_p_raw, dabar,
                                                                          dpbar, abar, delta_raw, lambda_log, p_raw, n);
    cudaCheckLaunch();
}

#endif // TRAIN_KLA_KERNELS_KALMAN_SCAN_CUH
