/*
Kernel lab for the filter of the kalman mixer (spec/kalman.md 2.3-2.5, 3.5): forward (with its checkpoints) and
backward (the exact reverse-time adjoint, replaying each segment from its checkpoint). Checked against the double
precision reference of kalman_reference.h, then timed, at B = 16, T = 2048, Dk = 768 channels, N = 32 and N = 16
(the 124M LM shape of spec 1.4 with its N, and the package default N), and B = 1, T = 16384, N = 32 (long
context at the same tokens per step).

Compile and run from dev/cuda:
nvcc -O3 -arch=sm_90 -std=c++17 kalman_scan.cu -o kalman_scan_bin
nvcc -O3 -arch=sm_90 -std=c++17 -DENABLE_FP32 kalman_scan.cu -o kalman_scan_fp32_bin
./kalman_scan_bin 3        (the argument picks the version that is checked and timed; default 3; a second
                            argument "time" skips the check)

version 1 (below): one thread per lane (b, d, n) runs the recurrence serially over T with its fp32 state in
registers, 32 channels per 1024-thread block; every input is loaded from global memory at every token, the read-out
sum over n is a 5-level shuffle tree per token, and the reciprocals are IEEE divisions; the backward replays each
64-token segment into a per-thread array (local memory) and sums dk, dq over the block's 32 warps with one barrier
per token. Tried and measured (H200, 2026-11-26, not kept): version 1's arithmetic with the tokens in blocks whose
inputs are loaded together ahead of their steps: no faster (N=32 forward 4.78 ms at best against 4.87). So it
does not wait on its loads: it issues too many instructions per lane and token (about 45 forward, 110 backward).
version 2 is kernels/kalman_scan.cuh, the same recurrence with fewer instructions per lane and token: 32-token
tiles staged in shared memory and unrolled, the read-out summed by one butterfly per tile (31 shuffles for 32
tokens instead of 160), approximate reciprocals, checkpoints every tile; the backward replays a tile into
registers in two halves of 16 tokens and sums dk, dq over the block's channels once per half, 8-warp blocks; the
next tile's loads are issued before the current tile's walk (H200, 2026-11-27: N=32 5.37 -> 5.07 ms forward +
backward, B=1 forward 1.665 -> 1.336 ms).
version 3 is version 2 with time segments (spec 3.5's two-level scan), as many as kalman_segments picks for the
shape and the GPU: summary passes (the segments' Mobius precision maps, their affine information maps, the
backward's carry maps), then every segment from the maps before (after) it. At B = 16 it picks one segment
(version 2); at B = 1 T = 16384 one forward and 12 backward (backward 3.60 -> 3.12 ms on an H200).

Inputs are drawn at the scales of a trained layer: v ~ N(0, 1) (rounded to floatX: the filter reads v as the
layer stores it), Lv = 1/(softplus(N(0,1)) + 1e-4), k, q unit vectors, abar in [0.905, 0.999] and pbar
0.01 (1 - abar^2) / 2 (spec 1.2 at init), dys ~ N(0, 1). The reference is fed exactly these values.
Checks: relative L2 error ||gpu - ref|| / ||ref|| per output. Tolerance 1e-4 in both builds: the filter computes
in fp32 in both (only v's storage differs, and the reference reads the rounded v), so fp32 rounding (1e-7 per
operation) grown over T = 2048 contracting steps and sums of up to B*T = 32768 terms (dabar, dpbar) is all that
separates them. Exit status 1 if any check fails.
*/
#include <math.h>
#include <stdint.h>
#include <vector>
#include "../../kernels/kalman_scan.cuh"
#include "kalman_reference.h"

static const double TOLERANCE = 1e-4;
static int check_outputs = 1;   // 0: timings only (the argument "time")

static uint64_t rng_state = 42;
static double uniform01(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return ((rng_state >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static double normal01(void) { return sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()); }

// ----------------------------------------------------------------------------------------------------------
// version 1 (the trainer's filter until 2026-11-27): one thread per lane over a 1024-thread block of 32 channels;
// a global load of every input per token, a shuffle tree per token for the read-out, IEEE divisions; the backward
// replays 64-token segments into per-thread arrays and sums dk, dq over the block with one barrier per token.

#define V1_CK 64    // its checkpoint interval
#define V1_CPB 32   // its channels per block
static int v1_group(int N) { int G = 1; while (G < N) { G *= 2; } return G; }

// sum over the G lanes of a group (a fixed tree: the same order for every call)
__device__ __forceinline__ float v1_group_sum(float x, int G) {
    for (int o = G / 2; o > 0; o >>= 1) { x += __shfl_xor_sync(0xffffffffu, x, o, G); }
    return x;
}

// ----------------------------------------------------------------------------------------------------------
// forward (spec 2.3)

// grid (NDB, B), block V1_CPB * G. ys [B*T, Dk] written. ck: checkpoints (NULL: none). lam_io, eta_io
// [B, Dk, N]: NULL, every sequence starts from the prior; else the state carried in (the prior when from_prior)
// and the final state written back (decode, spec 4).
__global__ void v1_forward_kernel(float* ys, float* ck, float* lam_io, float* eta_io, int from_prior,
                                             const floatX* v, int ldv, const float* Lv, const float* k,
                                             const float* q, const float* abar, const float* pbar, int T, int Dk,
                                             int N, int G) {
    const int n = threadIdx.x % G, d = blockIdx.x * V1_CPB + threadIdx.x / G, b = blockIdx.y;
    const int active = n < N && d < Dk;
    const size_t lane = ((size_t)b * Dk + d) * N + n;
    const int NT = (T + V1_CK - 1) / V1_CK;
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
            if (ck && t % V1_CK == 0) {
                float* cp = ck + (((size_t)b * NT + t / V1_CK) * Dk + d) * 2 * N;
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
        y = v1_group_sum(y, G);
        if (n == 0 && d < Dk) { ys[r * Dk + d] = y; }
    }
    if (lam_io && active) { lam_io[lane] = lam; eta_io[lane] = eta; }
}


// ----------------------------------------------------------------------------------------------------------
// backward (spec 2.4): exact reverse-time adjoint, no gradient of the final state; zero subgradient where a
// floor binds (spec 2.5)

// grid (NDB, B), block V1_CPB * G (G warps). Writes dv, dLv [B*T, Dk], the block's partial row of dk | dq per
// token into kq_part [B, NDB, T, 2N] and the lane's dabar | dpbar (summed over t) into ap_part [B, Dk, 2N].
__global__ void v1_backward_kernel(float* dv, float* dLv, float* kq_part, float* ap_part,
                                              const float* dys, const float* ck, const floatX* v, int ldv,
                                              const float* Lv, const float* k, const float* q, const float* abar,
                                              const float* pbar, int T, int Dk, int N, int G) {
    // the warps' sums of dk | dq over their channels, double-buffered by token parity (one barrier per token)
    __shared__ float warp_sums[2][KALMAN_MAX_N][2][KALMAN_MAX_N];
    const int n = threadIdx.x % G, d = blockIdx.x * V1_CPB + threadIdx.x / G, b = blockIdx.y;
    const int warp = threadIdx.x / 32, lane32 = threadIdx.x % 32, num_warps = blockDim.x / 32;
    const int active = n < N && d < Dk;
    const int NT = (T + V1_CK - 1) / V1_CK, NDB = gridDim.x;
    float seg_lam[V1_CK + 1], seg_eta[V1_CK + 1];   // the segment's states lam_{t0-1+i}, eta_{t0-1+i}
    float a = 0.0f, pb = 0.0f;
    if (active) { a = abar[(size_t)d * N + n]; pb = pbar[(size_t)d * N + n]; }
    const float a2raw = a * a, a2 = fmaxf(a2raw, KALMAN_FLOOR);
    float Gl = 0.0f, Ge = 0.0f, gab = 0.0f, gpb = 0.0f;   // dL/dlam_t, dL/deta_t carried back; dabar, dpbar
    for (int sg = NT - 1; sg >= 0; sg--) {
        const int t0 = sg * V1_CK, L = min(V1_CK, T - t0);
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
                const KalmanAdjointTerms g = kalman_adjoint_token(Gl, Ge, gab, gpb, lp, ep, lt, et, denraw,
                                                                  1.0f / fmaxf(denraw, KALMAN_FLOOR),
                                                                  1.0f / fmaxf(lt, KALMAN_FLOOR), a, a2raw, pb, Lvt,
                                                                  vt, dy, kk, qt);
                sLv = g.sLv;
                sv = g.sv;
                cdk = g.cdk;
                cdq = g.cdq;
            }
            sLv = v1_group_sum(sLv, G);
            sv = v1_group_sum(sv, G);
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

static void v1_forward(float* ys, float* ck, const floatX* v, int ldv, const float* Lv, const float* k,
                       const float* q, const float* abar, const float* pbar, int B, int T, int Dk, int N) {
    const int G = v1_group(N);
    v1_forward_kernel<<<dim3(ceil_div(Dk, V1_CPB), B), V1_CPB * G>>>(ys, ck, NULL, NULL, 1, v, ldv, Lv, k, q, abar,
                                                                     pbar, T, Dk, N, G);
    cudaCheckLaunch();
}
static void v1_backward(float* dv, float* dLv, float* dk, float* dq, float* dabar, float* dpbar, const float* dys,
                        const float* ck, const floatX* v, int ldv, const float* Lv, const float* k, const float* q,
                        const float* abar, const float* pbar, int B, int T, int Dk, int N, void* scratch) {
    const int G = v1_group(N), NDB = ceil_div(Dk, V1_CPB);
    float* kq_part = (float*)scratch;
    float* ap_part = kq_part + (size_t)B * NDB * T * 2 * N;
    v1_backward_kernel<<<dim3(NDB, B), V1_CPB * G>>>(dv, dLv, kq_part, ap_part, dys, ck, v, ldv, Lv, k, q, abar, pbar,
                                                     T, Dk, N, G);
    cudaCheckLaunch();
    kalman_kq_reduce_kernel<<<ceil_div(B * T * 2 * N, 256), 256>>>(dk, dq, kq_part, B, T, N, NDB);
    cudaCheckLaunch();
    kalman_ap_reduce_kernel<<<ceil_div(Dk * N, 256), 256>>>(dabar, dpbar, ap_part, B, Dk, N);
    cudaCheckLaunch();
}

static int check(const char* name, const float* dev, const std::vector<double>& ref) {
    std::vector<float> got(ref.size());
    cudaCheck(cudaMemcpy(got.data(), dev, ref.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < ref.size(); i++) { num += (got[i] - ref[i]) * (got[i] - ref[i]); den += ref[i] * ref[i]; }
    const double err = sqrt(num / (den > 0.0 ? den : 1.0));
    const int ok = err <= TOLERANCE;
    printf("%s %s: relative L2 error %.2e (tol %.0e)\n", ok ? "PASS" : "FAIL", name, err, TOLERANCE);
    return ok;
}

template <typename T> static T* to_device(const std::vector<T>& h) {
    T* d = (T*)cuda_malloc_or_die(h.size() * sizeof(T), "lab buffer");
    cudaCheck(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

// one shape: validation, then the timing of forward and backward; returns 1 if every check passed
static int run_shape(int version, int B, int T, int Dk, int N) {
    const size_t BT = (size_t)B * T;
    std::vector<float> v(BT * Dk), Lv(BT * Dk), k(BT * N), q(BT * N), abar((size_t)Dk * N), pbar((size_t)Dk * N),
        dys(BT * Dk);
    std::vector<floatX> v_x(BT * Dk);
    for (size_t i = 0; i < v.size(); i++) {
        v_x[i] = (floatX)(float)normal01();
        v[i] = (float)v_x[i];   // the reference reads v as stored
        const double ls = normal01();
        Lv[i] = (float)(1.0 / (log1p(exp(ls)) + 1e-4));
        dys[i] = (float)normal01();
    }
    for (size_t r = 0; r < BT; r++) {
        for (int which = 0; which < 2; which++) {
            float* x = (which ? q.data() : k.data()) + r * N;
            double s = 0.0;
            for (int n = 0; n < N; n++) { x[n] = (float)normal01(); s += (double)x[n] * x[n]; }
            for (int n = 0; n < N; n++) { x[n] = (float)(x[n] / sqrt(s)); }
        }
    }
    for (size_t i = 0; i < abar.size(); i++) {
        abar[i] = (float)(0.905 + 0.094 * uniform01());
        pbar[i] = (float)(0.01 * (1.0 - (double)abar[i] * abar[i]) / 2.0);
    }
    floatX* d_v = to_device(v_x);
    float *d_Lv = to_device(Lv), *d_k = to_device(k), *d_q = to_device(q), *d_abar = to_device(abar),
          *d_pbar = to_device(pbar), *d_dys = to_device(dys);
    float* d_ys = (float*)cuda_malloc_or_die(BT * Dk * sizeof(float), "ys");
    float* d_ck = (float*)cuda_malloc_or_die(kalman_checkpoint_floats(B, T, Dk, N) * sizeof(float), "ck");
    float* d_dv = (float*)cuda_malloc_or_die(BT * Dk * sizeof(float), "dv");
    float* d_dLv = (float*)cuda_malloc_or_die(BT * Dk * sizeof(float), "dLv");
    float* d_dk = (float*)cuda_malloc_or_die(BT * N * sizeof(float), "dk");
    float* d_dq = (float*)cuda_malloc_or_die(BT * N * sizeof(float), "dq");
    float* d_dabar = (float*)cuda_malloc_or_die((size_t)Dk * N * sizeof(float), "dabar");
    float* d_dpbar = (float*)cuda_malloc_or_die((size_t)Dk * N * sizeof(float), "dpbar");
    // version 2: one segment; version 3: the segments kalman_segments picks for this shape and GPU
    const int S_f = version == 3 ? kalman_segments(B, T, Dk, N, 0) : 1;
    const int S_b = version == 3 ? kalman_segments(B, T, Dk, N, 1) : 1;
    void* scratch = cuda_malloc_or_die(kalman_filter_backward_scratch_bytes(B, T, Dk, N, S_b), "scratch");
    void* fwd_scratch =
        S_f > 1 ? cuda_malloc_or_die(kalman_filter_forward_scratch_bytes(B, Dk, N, S_f), "segments") : NULL;
    // sizes: version 2's checkpoints (every 32 tokens) and partial rows (8 to 32 channels per block) are the larger
    auto forward = [&]() {
        if (version == 1) {
            v1_forward(d_ys, d_ck, d_v, Dk, d_Lv, d_k, d_q, d_abar, d_pbar, B, T, Dk, N);
        } else {
            kalman_filter_forward(d_ys, d_ck, NULL, NULL, 1, d_v, Dk, d_Lv, d_k, d_q, d_abar, d_pbar, B, T, Dk, N, S_f,
                                  fwd_scratch, 0);
        }
    };
    auto backward = [&]() {
        if (version == 1) {
            v1_backward(d_dv, d_dLv, d_dk, d_dq, d_dabar, d_dpbar, d_dys, d_ck, d_v, Dk, d_Lv, d_k, d_q, d_abar, d_pbar,
                        B, T, Dk, N, scratch);
        } else {
            kalman_filter_backward(d_dv, d_dLv, d_dk, d_dq, d_dabar, d_dpbar, d_dys, d_ck, d_v, Dk, d_Lv, d_k, d_q,
                                   d_abar, d_pbar, B, T, Dk, N, S_b, scratch, 0);
        }
    };
    forward();
    backward();
    cudaCheck(cudaDeviceSynchronize());

    printf("B %d T %d Dk %d N %d, version %d", B, T, Dk, N, version);
    if (version > 1) { printf(", segments: forward %d, backward %d", S_f, S_b); }
    printf("\n");
    int ok = 1;
    if (check_outputs) {
        std::vector<double> ref[KALMAN_OUTPUTS];
        kalman_reference(ref, v, Lv, k, q, abar, pbar, dys, B, T, Dk, N);
        const float* got[KALMAN_OUTPUTS] = {d_ys, d_dv, d_dLv, d_dk, d_dq, d_dabar, d_dpbar};
        for (int i = 0; i < KALMAN_OUTPUTS; i++) { ok &= check(KALMAN_OUTPUT_NAMES[i], got[i], ref[i]); }
    }

    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    const int reps = 10;
    float ms_f, ms_b;
    cudaCheck(cudaEventRecord(start));
    for (int i = 0; i < reps; i++) { forward(); }
    cudaCheck(cudaEventRecord(stop));
    cudaCheck(cudaEventSynchronize(stop));
    cudaCheck(cudaEventElapsedTime(&ms_f, start, stop));
    cudaCheck(cudaEventRecord(start));
    for (int i = 0; i < reps; i++) { backward(); }
    cudaCheck(cudaEventRecord(stop));
    cudaCheck(cudaEventSynchronize(stop));
    cudaCheck(cudaEventElapsedTime(&ms_b, start, stop));
    // spec 3.6: ~15 flops per lane and token forward, ~57 backward with the replay
    const double lanes_tokens = (double)BT * Dk * N;
    printf("forward  %8.3f ms  (%.2f TFLOP/s at 15 flops per lane-token)\n", ms_f / reps,
           15.0 * lanes_tokens / (ms_f / reps * 1e-3) / 1e12);
    printf("backward %8.3f ms  (%.2f TFLOP/s at 57 flops per lane-token)\n", ms_b / reps,
           57.0 * lanes_tokens / (ms_b / reps * 1e-3) / 1e12);
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    cudaFree(d_v); cudaFree(d_Lv); cudaFree(d_k); cudaFree(d_q); cudaFree(d_abar); cudaFree(d_pbar); cudaFree(d_dys);
    cudaFree(d_ys); cudaFree(d_ck); cudaFree(d_dv); cudaFree(d_dLv); cudaFree(d_dk); cudaFree(d_dq);
    cudaFree(d_dabar); cudaFree(d_dpbar); cudaFree(scratch); cudaFree(fwd_scratch);
    return ok;
}

int main(int argc, char** argv) {
    const int version = argc > 1 ? atoi(argv[1]) : 3;
    if (version < 1 || version > 3 || (argc > 2 && strcmp(argv[2], "time") != 0)) {
        die("usage: %s [version 1, 2 or 3, default 3] [time: timings only, no check]", argv[0]);
    }
    check_outputs = argc <= 2;
    int ok = 1;
    ok &= run_shape(version, 16, 2048, 768, 32);
    ok &= run_shape(version, 16, 2048, 768, 16);
    ok &= run_shape(version, 1, 16384, 768, 32);   // long context: 1/16 of the lanes
    printf("%s\n", ok ? "all checks passed" : "some checks FAILED");
    return ok ? 0 : 1;
}
