/*
Kernel lab: the Gated DeltaNet core backward (spec/gdn_kaczmarz.md 2.4, 3.4), kernels/gdn_chunk.cuh.

Build and run (from dev/cuda):
  nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo -I../.. gdn_chunk_bwd.cu -o gdn_chunk_bwd_bin
  ./gdn_chunk_bwd_bin 5
  ./gdn_chunk_bwd_bin 5 profile   (one forward and backward at each timing shape, no checks: for ncu / nsys)

Versions (first argument):
  1  the chunkwise kernels with fp32 CUDA-core products also for bf16 inputs (gdn_chunk_*_impl<Tin, float>)
  2  the previous kernels/gdn_chunk.cuh (copied below, names prefixed gdn_prev_), bf16 inputs on tensor cores
  3  the chunkwise kernels of kernels/gdn_chunk.cuh as the trainer calls them (bf16 inputs: tensor cores):
     version 2 with fewer memory round trips in the fused chunk kernel (beta with G, Tm with the first phase-1
     slab, q / k / kbg in tiles of their own loaded with the first dv slab of each dk slab, phase 4 reading dk
     back during its K load instead of element by element), the state kernel on 256 threads instead of 128,
     and the forward changes of gdn_chunk_fwd version 4. (Prefetching the state kernel's next-chunk tiles into
     registers was measured slower at 128 threads: 0.84 vs 0.68 ms, register spills at 3 CTAs per SM.) It is
     now the trainer's kernels with the shared-memory kernels throughout (which the fp32 build keeps)
  4  the trainer's kernels (bf16 inputs): version 3 with both state passes, the output and the dvlocal kernel on
     register tiles (gdn_fwd_state_mma_kernel, gdn_bwd_state_mma_kernel: the state in mma.sync fragments for the
     whole sequence, the next chunk's tiles copied by cp.async during the current one; H200: backward state
     0.643 -> 0.264 ms, forward+backward 3.77 -> 3.10 ms; gdn_fwd_output_mma_kernel, gdn_bwd_dvlocal_mma_kernel:
     one CTA of 8 warps per chunk, the masked chunk product kept in registers as the next product's A fragments;
     the intra kernel's products), and the fused chunk kernel on register tiles (gdn_bwd_chunk_mma_kernel: 16 warps,
     dT and K Kw^T in fragments from phase 1 to phase 3, the tiles by cp.async; H200: chunk 1.789 -> 0.911 ms,
     backward 2.601 -> 1.268 ms, forward+backward 3.768 -> 1.814 ms against version 3 in one run). Since
     2026-11-28 both state passes split along the sequence where B*H leaves the GPU idle (GdnSegments in
     kernels/gdn_chunk.cuh; H200, B=1 T=16384: forward+backward 1.359 ms, against 0.868 ms at B=16 T=1024). It is
     now version 5 with the state passes compiled for a runtime dk and the forward's general output kernel
     (specialised = false)
  5  the trainer's kernels (bf16 inputs): version 4 with both state passes compiled for dk = GDN_FIXED_DK = 128
     where dk is that, and the forward's output kernel of gdn_chunk_fwd.cu version 6 (the copies' and the saved
     states' index arithmetic folded; Vn in Kw's tile). H200, B=16 T=2048, versions side by side in one run (before
     the output kernel change): forward state 0.166 -> 0.144 ms, backward state 0.240 -> 0.212 ms (101.0M
     instructions, 110.5M with the copies alone folded), forward+backward 1.626 -> 1.579 ms; the same errors to
     every printed digit. Since 2026-12-02 also gdn_chunk_fwd.cu version 6's intra, output and state-pass changes
     (the backward's masked dvlocal product skips its all-zero blocks and both chunk kernels take the hardware
     exponential per element: dvlocal 0.104 -> 0.091 ms, chunk 0.828 -> 0.824 ms)

Validation: gradients of L = sum(o * dO) (dS_T = 0) against a float64 CPU reference, the exact reverse-time
recurrence of spec 2.4 over all states of the float64 forward recurrence (spec 2.1), at four shapes
(B=2, H=2, dk=16, dv=24, T=80 and T=37: partial last chunks; B=2, T=256, H=2, dk=dv=128: production head size;
B=1, T=2048, H=2, dk=dv=128: the bf16 state passes split into 4 segments of 8 chunks),
GDN-like inputs (l2-normalised q, k, beta = sigmoid) and KLA-like inputs (raw keys with norms over two
decades, beta = sigmoid/(||k||^2 + 1e-6) up to ~1e3), fp32 and bf16. The reference runs on the inputs as the
kernels see them (q, k, v, dO rounded to bf16 for bf16), so the errors are the kernels' arithmetic alone.
Tolerances on the relative L2 error of each of o, dq, dk, dv, dbeta, dg:
  fp32 1e-4: summation order differs from the recurrence (~1e-6), the products through Tm = (I + A)^-1 and
       the fp32 cumsum G (|G| up to ~100: ~1e-5 relative on exp(G_i - G_j)) amplify it somewhat; a wrong
       term gives O(1) errors.
  bf16 2e-2: the products' operands (Tm, W, Vn, h, P, dT, dE, dVn, ...) are rounded to bf16 (2e-3 relative each);
       spec 5 measures ~4e-3 for the forward, the backward compounds a few more roundings.
Each run is repeated and must be bitwise identical. Then timing at B=16, T=2048, H=6, dk=dv=128, bf16 (issue
9's shape), and at 16K tokens B=16 T=1024 against B=1 T=16384 (long context): backward alone and forward +
backward, and the time of each forward and backward kernel (cudaEvents between the launches; a split state pass
counts its three steps as its kernel),
TFLOP/s from spec 3.7 (F_bwd = 16 dk dv + 18 BT dk + 10 BT dv + 4 BT^2
minus 4 dk dv + 2 BT (dk + dv), since h and W are saved by the forward).
*/
#include <math.h>
#include <string.h>
#include "gdn_chunk_lab.cuh"

// CPU reference in double: the reverse-time backward of spec 2.4 with dS_T = 0, from every state of the
// forward recurrence. dqkv [B*T, ld] (q, k, v column blocks), dbeta and dg [B*T*H]; dO [B*T, H*dv].

static void gdn_backward_reference(double* dqkv, double* dbeta, double* dg, const float* dO, const Inputs& in, Shape s) {
    const int dk = s.dk, dv = s.dv;
    const size_t dkdv = (size_t)dk * dv;
    const double scale = 1.0 / sqrt((double)dk);
    double* states = (double*)malloc_or_die((size_t)(s.T + 1) * dkdv * sizeof(double));   // S_{t-1}, t = 0..T
    double* res = (double*)malloc_or_die((size_t)s.T * dv * sizeof(double));               // r_t
    double* D = (double*)malloc_or_die(dkdv * sizeof(double));
    double* du = (double*)malloc_or_die((size_t)dv * sizeof(double));
    double* dr = (double*)malloc_or_die((size_t)dv * sizeof(double));
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.H; h++) {
            // forward recurrence, keeping every state
            memset(states, 0, dkdv * sizeof(double));
            for (int t = 0; t < s.T; t++) {
                const size_t row = (size_t)b * s.T + t;
                const float* k = in.qkv + row * in.ld + s.H * dk + h * dk;
                const float* v = in.qkv + row * in.ld + 2 * s.H * dk + h * dv;
                const double alpha = exp((double)in.g[row * s.H + h]), bt = in.beta[row * s.H + h];
                const double* Sp = states + (size_t)t * dkdv;
                double* St = states + (size_t)(t + 1) * dkdv;
                double* r = res + (size_t)t * dv;
                for (int j = 0; j < dv; j++) { r[j] = v[j]; }
                for (int i = 0; i < dk; i++) {
                    for (int j = 0; j < dv; j++) { r[j] -= alpha * Sp[i * dv + j] * k[i]; }
                }
                for (int i = 0; i < dk; i++) {
                    for (int j = 0; j < dv; j++) { St[i * dv + j] = alpha * Sp[i * dv + j] + k[i] * bt * r[j]; }
                }
            }
            // reverse loop; D = dL/dS_t on entry of step t, dL/dS_{t-1} on exit
            memset(D, 0, dkdv * sizeof(double));
            for (int t = s.T - 1; t >= 0; t--) {
                const size_t row = (size_t)b * s.T + t;
                const float* q = in.qkv + row * in.ld + h * dk;
                const float* k = q + s.H * dk;
                const float* dOt = dO + row * s.H * dv + h * dv;
                const double alpha = exp((double)in.g[row * s.H + h]), bt = in.beta[row * s.H + h];
                const double* Sp = states + (size_t)t * dkdv;
                const double* St = states + (size_t)(t + 1) * dkdv;
                const double* r = res + (size_t)t * dv;
                double* dq = dqkv + row * in.ld + h * dk;
                double* dkk = dqkv + row * in.ld + s.H * dk + h * dk;
                double* dvv = dqkv + row * in.ld + 2 * s.H * dk + h * dv;
                for (int j = 0; j < dv; j++) { du[j] = 0.0; }
                for (int i = 0; i < dk; i++) {
                    double sq = 0.0, sk = 0.0;
                    for (int j = 0; j < dv; j++) {
                        D[i * dv + j] += scale * q[i] * dOt[j];            // o_t = S_t^T (scale q_t)
                        sq += St[i * dv + j] * dOt[j];
                        du[j] += D[i * dv + j] * k[i];                      // du = D^T k
                        sk += D[i * dv + j] * bt * r[j];                    // dk = D u
                    }
                    dq[i] = scale * sq;
                    dkk[i] = sk;
                }
                double db = 0.0;
                for (int j = 0; j < dv; j++) { db += du[j] * r[j]; dr[j] = bt * du[j]; dvv[j] = dr[j]; }
                dbeta[row * s.H + h] = db;
                double dgs = 0.0;
                for (int i = 0; i < dk; i++) {
                    double sd = 0.0;
                    for (int j = 0; j < dv; j++) {
                        sd += alpha * Sp[i * dv + j] * dr[j];                // dk -= Sbar dr
                        const double dsbar = D[i * dv + j] - k[i] * dr[j];   // DSbar = D - k dr^T
                        dgs += dsbar * alpha * Sp[i * dv + j];               // dg = <DSbar, Sbar>
                        D[i * dv + j] = alpha * dsbar;
                    }
                    dkk[i] -= sd;
                }
                dg[row * s.H + h] = dgs;
            }
        }
    }
    free(states); free(res); free(D); free(du); free(dr);
}

// ----------------------------------------------------------------------------------------------------------
// dispatch: version 1 runs the chunk kernels with fp32 operands, version 2 with Tc = Tin

template <typename Tin>
static void run_forward(int version, Tin* o, int ld_o, void* saved, void* work, const Tin* qkv, int ld,
                        const float* beta, const float* g, Shape s, float scale, cudaEvent_t* marks = nullptr) {
    const Tin* q = qkv;
    const Tin* k = qkv + s.H * s.dk;
    const Tin* v = qkv + 2 * s.H * s.dk;
    if (version == 1) {
        gdn_chunk_forward_impl<Tin, float>(o, ld_o, saved, work, q, k, v, ld, k, ld, beta, g, 1, GDN_DECAY_HEAD, s.B, s.T,
                                           s.H, s.dk, s.dv, scale, 0, marks);
    } else if (version == 2) {
        gdn_prev_chunk_forward_impl<Tin, Tin>(o, ld_o, saved, work, q, k, v, ld, beta, g, s.B, s.T, s.H, s.dk, s.dv,
                                                   scale, 0);
    } else {   // version 3: the shared-memory state kernel; 4: the register-tile state passes for a runtime dk
        gdn_chunk_forward_impl<Tin, Tin>(o, ld_o, saved, work, q, k, v, ld, k, ld, beta, g, 1, GDN_DECAY_HEAD, s.B, s.T, s.H, s.dk, s.dv,
                                         scale, 0, marks, version >= 4, version >= 5);
    }
}

template <typename Tin>
static void run_backward(int version, float* dqkv, float* dbeta, float* dg, const Tin* dO, int ld_o,
                         const void* saved, void* work, const Tin* qkv, int ld,
                         const float* beta, const float* g, Shape s, float scale, cudaEvent_t* marks = nullptr) {
    const Tin* q = qkv;
    const Tin* k = qkv + s.H * s.dk;
    const Tin* v = qkv + 2 * s.H * s.dk;
    float* dq = dqkv;
    float* dk = dqkv + s.H * s.dk;
    float* dv = dqkv + 2 * s.H * s.dk;
    if (version == 1) {
        gdn_chunk_backward_impl<Tin, float>(dq, dk, dv, ld, nullptr, 0, dbeta, dg, dO, ld_o, saved, work, q, k, v, ld, k, ld, beta, GDN_DECAY_HEAD,
                                            s.B, s.T, s.H, s.dk, s.dv, scale, 0, marks);
    } else if (version == 2) {
        gdn_prev_chunk_backward_impl<Tin, Tin>(dq, dk, dv, ld, dbeta, dg, dO, ld_o, saved, work, q, k, v, ld, beta,
                                               g, s.B, s.T, s.H, s.dk, s.dv, scale, 0, marks);
    } else if (marks || version < 5) {   // the launches of gdn_chunk_backward, with the per-kernel marks
        gdn_chunk_backward_impl<Tin, Tin>(dq, dk, dv, ld, nullptr, 0, dbeta, dg, dO, ld_o, saved, work, q, k, v, ld, k, ld, beta, GDN_DECAY_HEAD,
                                          s.B, s.T, s.H, s.dk, s.dv, scale, 0, marks, version >= 4, version >= 5);
    } else {
        gdn_chunk_backward<Tin>(dq, dk, dv, ld, nullptr, 0, dbeta, dg, dO, ld_o, saved, work, q, k, v, ld, k, ld, beta, GDN_DECAY_HEAD,
                                s.B, s.T, s.H, s.dk, s.dv, scale, 0);
    }
}

// columns [c0, c0 + width) of every row of a [rows, ld] matrix, for comparing the q, k and v blocks separately
template <typename T>
static T* gather_cols(const T* x, size_t rows, int ld, int c0, int width) {
    T* out = (T*)malloc_or_die(rows * width * sizeof(T));
    for (size_t r = 0; r < rows; r++) {
        for (int c = 0; c < width; c++) { out[r * width + c] = x[r * ld + c0 + c]; }
    }
    return out;
}

template <typename Tin>
static int validate(int version, Shape s, int kla) {
    const int bf16 = sizeof(Tin) == 2;
    const Inputs in = make_inputs(s, kla, bf16);
    const size_t rows = (size_t)s.B * s.T, no = rows * s.H * s.dv, nqkv = rows * in.ld, nbh = rows * s.H;
    const float scale = 1.0f / sqrtf((float)s.dk);
    float* dO = (float*)malloc_or_die(no * sizeof(float));
    for (size_t i = 0; i < no; i++) { dO[i] = (float)rand_normal(); if (bf16) { dO[i] = round_bf16(dO[i]); } }
    double* o_ref = (double*)malloc_or_die(no * sizeof(double));
    double* dqkv_ref = (double*)malloc_or_die(nqkv * sizeof(double));
    double* dbeta_ref = (double*)malloc_or_die(nbh * sizeof(double));
    double* dg_ref = (double*)malloc_or_die(nbh * sizeof(double));
    gdn_forward_reference(o_ref, in, s);
    gdn_backward_reference(dqkv_ref, dbeta_ref, dg_ref, dO, in, s);

    Tin* d_qkv = to_device<Tin>(in.qkv, nqkv);
    Tin* d_dO = to_device<Tin>(dO, no);
    float* d_beta = to_device_f(in.beta, nbh);
    float* d_g = to_device_f(in.g, nbh);
    Tin* d_o = (Tin*)cuda_malloc_or_die(no * sizeof(Tin), "o");
    float* d_dqkv = (float*)cuda_malloc_or_die(nqkv * sizeof(float), "dqkv");
    float* d_dbeta = (float*)cuda_malloc_or_die(nbh * sizeof(float), "dbeta");
    float* d_dg = (float*)cuda_malloc_or_die(nbh * sizeof(float), "dg");
    void* saved = cuda_malloc_or_die(gdn_chunk_saved_bytes(s.B, s.T, s.H, s.dk, s.dv, GDN_DECAY_HEAD), "saved");
    void* work = cuda_malloc_or_die(gdn_chunk_workspace_bytes(s.B, s.T, s.H, s.dk, s.dv, GDN_DECAY_HEAD), "workspace");

    // two complete runs; outputs preset to NaN so that every element must be written
    float* o_h = (float*)malloc_or_die(no * sizeof(float));
    float* res[2][3];
    for (int rep = 0; rep < 2; rep++) {
        cudaCheck(cudaMemset(d_o, 0xff, no * sizeof(Tin)));
        cudaCheck(cudaMemset(d_dqkv, 0xff, nqkv * sizeof(float)));
        cudaCheck(cudaMemset(d_dbeta, 0xff, nbh * sizeof(float)));
        cudaCheck(cudaMemset(d_dg, 0xff, nbh * sizeof(float)));
        run_forward<Tin>(version, d_o, s.H * s.dv, saved, work, d_qkv, in.ld, d_beta, d_g, s, scale);
        run_backward<Tin>(version, d_dqkv, d_dbeta, d_dg, d_dO, s.H * s.dv, saved, work, d_qkv, in.ld, d_beta, d_g,
                          s, scale);
        cudaCheck(cudaDeviceSynchronize());
        res[rep][0] = (float*)malloc_or_die(nqkv * sizeof(float));
        res[rep][1] = (float*)malloc_or_die(nbh * sizeof(float));
        res[rep][2] = (float*)malloc_or_die(nbh * sizeof(float));
        to_host_f(res[rep][0], d_dqkv, nqkv);
        to_host_f(res[rep][1], d_dbeta, nbh);
        to_host_f(res[rep][2], d_dg, nbh);
        if (rep == 0) { to_host_f(o_h, d_o, no); }
    }

    printf("  %s B=%d T=%d H=%d dk=%d dv=%d %s inputs:\n", bf16 ? "bf16" : "fp32", s.B, s.T, s.H, s.dk, s.dv,
           kla ? "KLA-like" : "GDN-like");
    const double tol = bf16 ? 2e-2 : 1e-4;
    int ok = compare("o", o_h, o_ref, no, tol);
    const char* names[3] = { "dq", "dk", "dv" };
    const int c0[3] = { 0, s.H * s.dk, 2 * s.H * s.dk }, width[3] = { s.H * s.dk, s.H * s.dk, s.H * s.dv };
    for (int i = 0; i < 3; i++) {
        float* got = gather_cols(res[0][0], rows, in.ld, c0[i], width[i]);
        double* ref = gather_cols(dqkv_ref, rows, in.ld, c0[i], width[i]);
        ok &= compare(names[i], got, ref, rows * width[i], tol);
        free(got); free(ref);
    }
    ok &= compare("dbeta", res[0][1], dbeta_ref, nbh, tol);
    ok &= compare("dg", res[0][2], dg_ref, nbh, tol);
    const int same = memcmp(res[0][0], res[1][0], nqkv * sizeof(float)) == 0 &&
                     memcmp(res[0][1], res[1][1], nbh * sizeof(float)) == 0 &&
                     memcmp(res[0][2], res[1][2], nbh * sizeof(float)) == 0;
    printf("    repeat run bitwise identical: %s\n", same ? "yes" : "NO (FAIL)");
    ok = ok && same;

    for (int rep = 0; rep < 2; rep++) { for (int i = 0; i < 3; i++) { free(res[rep][i]); } }
    free(o_h); free(dO); free(o_ref); free(dqkv_ref); free(dbeta_ref); free(dg_ref);
    cudaCheck(cudaFree(d_qkv)); cudaCheck(cudaFree(d_dO)); cudaCheck(cudaFree(d_beta)); cudaCheck(cudaFree(d_g));
    cudaCheck(cudaFree(d_o)); cudaCheck(cudaFree(d_dqkv)); cudaCheck(cudaFree(d_dbeta)); cudaCheck(cudaFree(d_dg));
    cudaCheck(cudaFree(saved)); cudaCheck(cudaFree(work));
    free_inputs(in);
    return ok;
}

// timing at shape s, bf16 (profile: one forward and backward, no timing)
static void time_shape(int version, Shape s, int profile) {
    const Inputs in = make_inputs(s, 0, 1);
    const size_t rows = (size_t)s.B * s.T, no = rows * s.H * s.dv, nqkv = rows * in.ld, nbh = rows * s.H;
    const float scale = 1.0f / sqrtf((float)s.dk);
    float* dO = (float*)malloc_or_die(no * sizeof(float));
    for (size_t i = 0; i < no; i++) { dO[i] = (float)rand_normal(); }
    __nv_bfloat16* d_qkv = to_device<__nv_bfloat16>(in.qkv, nqkv);
    __nv_bfloat16* d_dO = to_device<__nv_bfloat16>(dO, no);
    float* d_beta = to_device_f(in.beta, nbh);
    float* d_g = to_device_f(in.g, nbh);
    __nv_bfloat16* d_o = (__nv_bfloat16*)cuda_malloc_or_die(no * sizeof(__nv_bfloat16), "o");
    float* d_dqkv = (float*)cuda_malloc_or_die(nqkv * sizeof(float), "dqkv");
    float* d_dbeta = (float*)cuda_malloc_or_die(nbh * sizeof(float), "dbeta");
    float* d_dg = (float*)cuda_malloc_or_die(nbh * sizeof(float), "dg");
    void* saved = cuda_malloc_or_die(gdn_chunk_saved_bytes(s.B, s.T, s.H, s.dk, s.dv, GDN_DECAY_HEAD), "saved");
    void* work = cuda_malloc_or_die(gdn_chunk_workspace_bytes(s.B, s.T, s.H, s.dk, s.dv, GDN_DECAY_HEAD), "workspace");
    if (profile) {
        run_forward<__nv_bfloat16>(version, d_o, s.H * s.dv, saved, work, d_qkv, in.ld, d_beta, d_g, s, scale);
        run_backward<__nv_bfloat16>(version, d_dqkv, d_dbeta, d_dg, d_dO, s.H * s.dv, saved, work, d_qkv, in.ld, d_beta,
                                    d_g, s, scale);
        cudaCheck(cudaDeviceSynchronize());
    } else {
        const int warmup = 3, iters = 10;
        cudaEvent_t e0, e1;
        cudaCheck(cudaEventCreate(&e0));
        cudaCheck(cudaEventCreate(&e1));
        float ms[2];
        for (int with_fwd = 0; with_fwd < 2; with_fwd++) {
            run_forward<__nv_bfloat16>(version, d_o, s.H * s.dv, saved, work, d_qkv, in.ld, d_beta, d_g, s, scale);
            for (int i = 0; i < warmup + iters; i++) {
                if (i == warmup) { cudaCheck(cudaEventRecord(e0)); }
                if (with_fwd) {
                    run_forward<__nv_bfloat16>(version, d_o, s.H * s.dv, saved, work, d_qkv, in.ld, d_beta, d_g, s,
                                               scale);
                }
                run_backward<__nv_bfloat16>(version, d_dqkv, d_dbeta, d_dg, d_dO, s.H * s.dv, saved, work, d_qkv, in.ld,
                                            d_beta, d_g, s, scale);
            }
            cudaCheck(cudaEventRecord(e1));
            cudaCheck(cudaEventSynchronize(e1));
            cudaCheck(cudaEventElapsedTime(&ms[with_fwd], e0, e1));
            ms[with_fwd] /= iters;
        }
        const double BT = GDN_CHUNK, dk = s.dk, dv = s.dv;
        const double tokens = (double)s.B * ceil_div(s.T, GDN_CHUNK) * GDN_CHUNK * s.H;
        const double f_fwd = tokens * (6 * dk * dv + 6 * BT * dk + 4 * BT * dv + BT * BT / 3);
        const double f_bwd = tokens * (16 * dk * dv + 18 * BT * dk + 10 * BT * dv + 4 * BT * BT
                                       - (4 * dk * dv + 2 * BT * (dk + dv)));
        printf("timing B=%d T=%d H=%d dk=%d dv=%d bf16: backward %.4f ms, %.1f TFLOP/s (%.2f GFLOP); "
               "forward+backward %.4f ms, %.1f TFLOP/s (%.2f GFLOP)\n", s.B, s.T, s.H, s.dk, s.dv,
               ms[0], f_bwd / (ms[0] * 1e-3) / 1e12, f_bwd / 1e9, ms[1], (f_fwd + f_bwd) / (ms[1] * 1e-3) / 1e12,
               (f_fwd + f_bwd) / 1e9);
        if (version != 2) {   // (version 2's forward launcher has no marks)
            const char* const fwd_names[3] = { "intra", "state", "output" };
            print_kernel_times("forward", fwd_names, iters, [&](cudaEvent_t* marks) {
                run_forward<__nv_bfloat16>(version, d_o, s.H * s.dv, saved, work, d_qkv, in.ld, d_beta, d_g, s, scale,
                                           marks);
            });
        }
        const char* const names[3] = { "dvlocal", "state", "chunk" };
        print_kernel_times("backward", names, iters, [&](cudaEvent_t* marks) {
            run_backward<__nv_bfloat16>(version, d_dqkv, d_dbeta, d_dg, d_dO, s.H * s.dv, saved, work, d_qkv, in.ld,
                                        d_beta, d_g, s, scale, marks);
        });
    }
    free(dO);
    cudaCheck(cudaFree(d_qkv)); cudaCheck(cudaFree(d_dO)); cudaCheck(cudaFree(d_beta)); cudaCheck(cudaFree(d_g));
    cudaCheck(cudaFree(d_o)); cudaCheck(cudaFree(d_dqkv)); cudaCheck(cudaFree(d_dbeta)); cudaCheck(cudaFree(d_dg));
    cudaCheck(cudaFree(saved)); cudaCheck(cudaFree(work));
    free_inputs(in);
}

int main(int argc, char** argv) {
    const int version = argc > 1 ? atoi(argv[1]) : 5;
    if (version < 1 || version > 5) { die("version must be 1 .. 5 (got %s)", argv[1]); }
    const int profile = argc > 2 && strcmp(argv[2], "profile") == 0;
    printf("gdn_chunk_bwd version %d%s\n", version, profile ? ", profile: one forward and backward, no checks" : "");

    int ok = 1;
    const Shape shapes[4] = { {2, 80, 2, 16, 24}, {2, 37, 2, 16, 24}, {2, 256, 2, 128, 128}, {1, 2048, 2, 128, 128} };
    for (int si = 0; si < (profile ? 0 : 4); si++) {
        for (int kla = 0; kla < 2; kla++) {
            ok &= validate<float>(version, shapes[si], kla);
            ok &= validate<__nv_bfloat16>(version, shapes[si], kla);
        }
    }

    // timing: the production shape, and at 16K tokens B=16 T=1024 against B=1 T=16384 (the state passes split along
    // the sequence)
    const Shape timed[3] = { {16, 2048, 6, 128, 128}, {16, 1024, 6, 128, 128}, {1, 16384, 6, 128, 128} };
    for (int i = 0; i < 3; i++) { time_shape(version, timed[i], profile); }
    if (profile) { return 0; }
    printf("%s\n", ok ? "ALL PASS" : "SOME FAILED");
    return ok ? 0 : 1;
}
