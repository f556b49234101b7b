/*
Kernel lab: causal softmax self-attention (kernels/attention.cuh), forward, backward and decode.

Build (from dev/cuda):
  nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo attention.cu -o attention_bin                     (bf16)
  nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo -DENABLE_FP32 attention.cu -o attention_fp32_bin   (fp32)
  with version 3 (cuDNN; the cudnn-frontend headers are not in the repository):
  nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo -DUSE_CUDNN -I/path/to/cudnn-frontend/include attention.cu \
       ../../kernels/attention_cudnn.cpp -lcudnn -lnvrtc -o attention_cudnn_bin
Run:
  ./attention_bin [version]       validates (and, in bf16, times) the given version, or all of them
  ./attention_fp32_bin [version]  validates in fp32

version 1: SIMT, one warp per query row (per key row in the dk/dv pass), 32-key tiles in shared memory, exact
           fp32 arithmetic. kernels/ keeps it for the FP32 build and for head sizes without a version 2.
version 2: tensor cores (mma.sync m16n8k16 bf16 -> fp32), FlashAttention-2 style: a CTA of 4 warps per
           (b, h, 64-row tile), 16 rows per warp, double-buffered K/V (Q/dO) tiles; the backward in two
           atomic-free passes (dq and D per query tile, then dk/dv per key tile). The BF16 build's kernels/ path.
version 3: cuDNN flash attention through cudnn-frontend (kernels/attention_cudnn.cpp), USE_CUDNN builds only.

Validation: B=2, T=37, C=64, NH=4 (hs 16, T not a multiple of any tile) and B=2, T=300, C=768, NH=12 (hs 64),
against a float64 CPU reference computed from the same (rounded) inputs. Tolerances on the relative L2 error
||gpu - ref|| / ||ref||:
  fp32 1e-4: every operation is fp32 (no TF32); the error is a few ulps of the accumulations (~1e-6).
  bf16 2e-2: the outputs are rounded to bf16 (2^-9 relative, ~2e-3 in L2), and version 2 also rounds the
             probabilities P and the score gradients dS to bf16 for the second matmul of each pair.
Also checked: bitwise equality of two runs (determinism) and attention_decode against the reference rows.
Timing (bf16): B=16, C=768, NH=12 at T=1024 and 4096. FLOPs: forward 2 matmuls of 2 * B*NH * (T*T/2) * hs
(causal half), backward 2.5x that (5 matmuls, as FlashAttention counts it; version 2 actually does 7).
*/
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../../kernels/attention.cuh"

#if defined(USE_CUDNN)
static const int n_versions = 3;
#else
static const int n_versions = 2;
#endif

// ----------------------------------------------------------------------------------------------------------
// float64 CPU reference: forward (out, lse) and backward (dqkv) of causal attention, naive

static void attention_reference(double* out, double* lse, double* dqkv, const double* qkv, const double* dout, int B,
                                int T, int C, int NH) {
    const int hs = C / NH;
    const double scale = 1.0 / sqrt((double)hs);
    const size_t ld = 3 * (size_t)C;
    double* p = (double*)malloc_or_die(T * sizeof(double));
    double* dp = (double*)malloc_or_die(T * sizeof(double));
    memset(dqkv, 0, (size_t)B * T * ld * sizeof(double));
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const double* q = qkv + ((size_t)b * T + t) * ld + h * hs;
                double m = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    const double* k = qkv + ((size_t)b * T + j) * ld + C + h * hs;
                    double s = 0.0;
                    for (int d = 0; d < hs; d++) { s += q[d] * k[d]; }
                    p[j] = s * scale;
                    m = fmax(m, p[j]);
                }
                double l = 0.0;
                for (int j = 0; j <= t; j++) { p[j] = exp(p[j] - m); l += p[j]; }
                lse[((size_t)b * NH + h) * T + t] = m + log(l);
                double* o = out + ((size_t)b * T + t) * C + h * hs;
                const double* dy = dout + ((size_t)b * T + t) * C + h * hs;
                for (int d = 0; d < hs; d++) { o[d] = 0.0; }
                double D = 0.0;  // sum_j p_j dp_j
                for (int j = 0; j <= t; j++) {
                    p[j] /= l;
                    const double* v = qkv + ((size_t)b * T + j) * ld + 2 * C + h * hs;
                    dp[j] = 0.0;
                    for (int d = 0; d < hs; d++) { o[d] += p[j] * v[d]; dp[j] += dy[d] * v[d]; }
                    D += p[j] * dp[j];
                }
                double* dq = dqkv + ((size_t)b * T + t) * ld + h * hs;
                for (int j = 0; j <= t; j++) {
                    const double ds = p[j] * (dp[j] - D) * scale;
                    const double* k = qkv + ((size_t)b * T + j) * ld + C + h * hs;
                    double* dk = dqkv + ((size_t)b * T + j) * ld + C + h * hs;
                    double* dv = dk + C;
                    for (int d = 0; d < hs; d++) {
                        dq[d] += ds * k[d];
                        dk[d] += ds * q[d];
                        dv[d] += p[j] * dy[d];
                    }
                }
            }
        }
    }
    free(p);
    free(dp);
}

// ----------------------------------------------------------------------------------------------------------
// the versions

static bool version_available(int version, int C, int NH) {
#if defined(ENABLE_BF16)
    return version == 1 || (version == 2 && attention_has_mma(C, NH)) || version == 3;
#else
    (void)C; (void)NH;
    return version == 1;
#endif
}

static void run_forward(int version, floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {
    if (version == 1) {
        attention_forward_simt(out, lse, qkv, B, T, C, NH, 0);
#if defined(USE_CUDNN)
    } else if (version == 3) {
        attention_forward_cudnn(out, lse, qkv, B, T, C, NH, 0);
#endif
    } else {
        attention_forward(out, lse, qkv, B, T, C, NH, 0);
    }
}

static void run_backward(int version, floatX* dqkv, void* scratch, const floatX* dout, const floatX* qkv,
                         const floatX* out, const float* lse, int B, int T, int C, int NH) {
    if (version == 1) {
        attention_backward_rowdot((float*)scratch, dout, out, B, T, C, NH, 0);
        attention_backward_simt(dqkv, (float*)scratch, dout, qkv, lse, B, T, C, NH, 0);
#if defined(USE_CUDNN)
    } else if (version == 3) {
        attention_backward_cudnn(dqkv, dout, qkv, out, lse, B, T, C, NH, 0);
#endif
    } else {
        attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, C, NH, 0);
    }
}

// ----------------------------------------------------------------------------------------------------------
// validation

static float host_to_float(floatX x) {
#if defined(ENABLE_FP32)
    return x;
#else
    return __bfloat162float(x);
#endif
}
static floatX host_from_float(float x) {
#if defined(ENABLE_FP32)
    return x;
#else
    return __float2bfloat16(x);
#endif
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double rand_uniform() {  // xorshift64*, (0, 1)
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return ((rng_state * 0x2545F4914F6CDD1Dull >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static double rand_normal() { return sqrt(-2.0 * log(rand_uniform())) * cos(6.283185307179586 * rand_uniform()); }

// fill n floatX values ~ N(0, std^2), and the same (rounded) values as doubles
static void fill_random(floatX* x, double* xd, size_t n, double std) {
    for (size_t i = 0; i < n; i++) {
        x[i] = host_from_float((float)(std * rand_normal()));
        xd[i] = host_to_float(x[i]);
    }
}

// compare n values at stride/offset: gpu[off + i*stride + j], ref likewise, rows of width w
static bool check(const char* name, const floatX* gpu_x, const float* gpu_f, const double* ref, size_t rows, int w,
                  size_t stride, size_t off, double tol) {
    double max_abs = 0.0, num = 0.0, den = 0.0;
    for (size_t r = 0; r < rows; r++) {
        for (int j = 0; j < w; j++) {
            size_t i = off + r * stride + j;
            double g = gpu_x ? host_to_float(gpu_x[i]) : gpu_f[i];
            double e = g - ref[i];
            if (!(fabs(e) <= max_abs)) { max_abs = fabs(e); }  // also catches NaN
            num += e * e;
            den += ref[i] * ref[i];
        }
    }
    double rel = sqrt(num / den);
    bool ok = rel <= tol;  // false for NaN
    printf("    %-6s max abs %.3e  rel L2 %.3e  %s\n", name, max_abs, rel, ok ? "PASS" : "FAIL");
    return ok;
}

static bool validate(int version, int B, int T, int C, int NH) {
#if defined(ENABLE_FP32)
    const double tol = 1e-4;
#else
    const double tol = 2e-2;
#endif
    const size_t ld = 3 * (size_t)C, n_qkv = (size_t)B * T * ld, n_out = (size_t)B * T * C, n_lse = (size_t)B * NH * T;
    printf("version %d, %s, B=%d T=%d C=%d NH=%d (tolerance rel L2 %.0e)\n", version, PRECISION_NAME, B, T, C, NH, tol);
    floatX* qkv = (floatX*)malloc_or_die(n_qkv * sizeof(floatX));
    floatX* dout = (floatX*)malloc_or_die(n_out * sizeof(floatX));
    double* qkv_d = (double*)malloc_or_die(n_qkv * sizeof(double));
    double* dout_d = (double*)malloc_or_die(n_out * sizeof(double));
    fill_random(qkv, qkv_d, n_qkv, 1.0);
    fill_random(dout, dout_d, n_out, 1.0);
    double* out_ref = (double*)malloc_or_die(n_out * sizeof(double));
    double* lse_ref = (double*)malloc_or_die(n_lse * sizeof(double));
    double* dqkv_ref = (double*)malloc_or_die(n_qkv * sizeof(double));
    attention_reference(out_ref, lse_ref, dqkv_ref, qkv_d, dout_d, B, T, C, NH);

    floatX *d_qkv, *d_dout, *d_out, *d_dqkv;
    float* d_lse;
    void* d_scratch;
    const size_t scratch_bytes = attention_backward_scratch_bytes(B, T, C, NH);
    cudaCheck(cudaMalloc(&d_qkv, n_qkv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_dqkv, n_qkv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_dout, n_out * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_out, n_out * sizeof(floatX)));
    cudaCheck(cudaMalloc(&d_lse, n_lse * sizeof(float)));
    cudaCheck(cudaMalloc(&d_scratch, scratch_bytes));
    cudaCheck(cudaMemcpy(d_qkv, qkv, n_qkv * sizeof(floatX), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(d_dout, dout, n_out * sizeof(floatX), cudaMemcpyHostToDevice));
    // NaN-fill the outputs: every element must be written
    cudaCheck(cudaMemset(d_dqkv, 0xff, n_qkv * sizeof(floatX)));
    cudaCheck(cudaMemset(d_out, 0xff, n_out * sizeof(floatX)));

    floatX* out = (floatX*)malloc_or_die(n_out * sizeof(floatX));
    floatX* dqkv = (floatX*)malloc_or_die(n_qkv * sizeof(floatX));
    float* lse = (float*)malloc_or_die(n_lse * sizeof(float));
    floatX* out2 = (floatX*)malloc_or_die(n_out * sizeof(floatX));
    floatX* dqkv2 = (floatX*)malloc_or_die(n_qkv * sizeof(floatX));
    float* lse2 = (float*)malloc_or_die(n_lse * sizeof(float));
    for (int rep = 0; rep < 2; rep++) {
        run_forward(version, d_out, d_lse, d_qkv, B, T, C, NH);
        run_backward(version, d_dqkv, d_scratch, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaMemcpy(rep ? out2 : out, d_out, n_out * sizeof(floatX), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(rep ? lse2 : lse, d_lse, n_lse * sizeof(float), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemcpy(rep ? dqkv2 : dqkv, d_dqkv, n_qkv * sizeof(floatX), cudaMemcpyDeviceToHost));
        cudaCheck(cudaMemset(d_dqkv, 0xff, n_qkv * sizeof(floatX)));  // the second run must rewrite everything
    }
    bool ok = true;
    ok &= check("out", out, NULL, out_ref, (size_t)B * T, C, C, 0, tol);
    ok &= check("lse", NULL, lse, lse_ref, n_lse, 1, 1, 0, tol);
    ok &= check("dq", dqkv, NULL, dqkv_ref, (size_t)B * T, C, ld, 0, tol);
    ok &= check("dk", dqkv, NULL, dqkv_ref, (size_t)B * T, C, ld, C, tol);
    ok &= check("dv", dqkv, NULL, dqkv_ref, (size_t)B * T, C, ld, 2 * C, tol);
    bool same = memcmp(out, out2, n_out * sizeof(floatX)) == 0 && memcmp(lse, lse2, n_lse * sizeof(float)) == 0 &&
                memcmp(dqkv, dqkv2, n_qkv * sizeof(floatX)) == 0;
    printf("    deterministic (two runs bitwise equal): %s\n", same ? "PASS" : "FAIL");
    ok &= same;

    // decode: caches of max_len = T + 3 rows filled from k, v; the new query at pos is q of row pos
    if (version == 1) {
        const int max_len = T + 3, npos = 3, positions[npos] = {0, T / 2, T - 1};
        floatX* kc = (floatX*)malloc_or_die((size_t)B * max_len * C * sizeof(floatX));
        floatX* vc = (floatX*)malloc_or_die((size_t)B * max_len * C * sizeof(floatX));
        memset(kc, 0, (size_t)B * max_len * C * sizeof(floatX));
        memset(vc, 0, (size_t)B * max_len * C * sizeof(floatX));
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                memcpy(kc + ((size_t)b * max_len + t) * C, qkv + ((size_t)b * T + t) * ld + C, C * sizeof(floatX));
                memcpy(vc + ((size_t)b * max_len + t) * C, qkv + ((size_t)b * T + t) * ld + 2 * C, C * sizeof(floatX));
            }
        }
        floatX *d_kc, *d_vc, *d_q, *d_o;
        cudaCheck(cudaMalloc(&d_kc, (size_t)B * max_len * C * sizeof(floatX)));
        cudaCheck(cudaMalloc(&d_vc, (size_t)B * max_len * C * sizeof(floatX)));
        cudaCheck(cudaMalloc(&d_q, (size_t)B * C * sizeof(floatX)));
        cudaCheck(cudaMalloc(&d_o, (size_t)B * C * sizeof(floatX)));
        cudaCheck(cudaMemcpy(d_kc, kc, (size_t)B * max_len * C * sizeof(floatX), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_vc, vc, (size_t)B * max_len * C * sizeof(floatX), cudaMemcpyHostToDevice));
        floatX* q = (floatX*)malloc_or_die((size_t)B * C * sizeof(floatX));
        floatX* o = (floatX*)malloc_or_die((size_t)B * C * sizeof(floatX));
        double* o_ref = (double*)malloc_or_die((size_t)B * C * sizeof(double));
        double num = 0.0, den = 0.0, max_abs = 0.0;
        for (int ip = 0; ip < npos; ip++) {
            const int pos = positions[ip];
            for (int b = 0; b < B; b++) {
                memcpy(q + (size_t)b * C, qkv + ((size_t)b * T + pos) * ld, C * sizeof(floatX));
                memcpy(o_ref + (size_t)b * C, out_ref + ((size_t)b * T + pos) * C, C * sizeof(double));
            }
            cudaCheck(cudaMemcpy(d_q, q, (size_t)B * C * sizeof(floatX), cudaMemcpyHostToDevice));
            attention_decode(d_o, d_q, d_kc, d_vc, B, pos, max_len, C, NH, 0);
            cudaCheck(cudaMemcpy(o, d_o, (size_t)B * C * sizeof(floatX), cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < (size_t)B * C; i++) {
                double e = host_to_float(o[i]) - o_ref[i];
                if (!(fabs(e) <= max_abs)) { max_abs = fabs(e); }
                num += e * e;
                den += o_ref[i] * o_ref[i];
            }
        }
        const double rel = sqrt(num / den);
        const bool dec_ok = rel <= tol;
        printf("    decode (pos 0, %d, %d) max abs %.3e  rel L2 %.3e  %s\n", T / 2, T - 1, max_abs, rel,
               dec_ok ? "PASS" : "FAIL");
        ok &= dec_ok;
        cudaCheck(cudaFree(d_kc)); cudaCheck(cudaFree(d_vc)); cudaCheck(cudaFree(d_q)); cudaCheck(cudaFree(d_o));
        free(kc); free(vc); free(q); free(o); free(o_ref);
    }

    cudaCheck(cudaFree(d_qkv)); cudaCheck(cudaFree(d_dqkv)); cudaCheck(cudaFree(d_dout)); cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_lse)); cudaCheck(cudaFree(d_scratch));
    free(qkv); free(dout); free(qkv_d); free(dout_d); free(out_ref); free(lse_ref); free(dqkv_ref);
    free(out); free(dqkv); free(lse); free(out2); free(dqkv2); free(lse2);
    return ok;
}

// ----------------------------------------------------------------------------------------------------------
// timing (bf16)
#if defined(ENABLE_BF16)

// x[i] = amp * uniform(-1, 1) from a hash of i
__global__ void fill_hash_kernel(floatX* x, size_t n, uint32_t seed, float amp) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    uint32_t hsh = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32) ^ seed;
    hsh ^= hsh >> 16; hsh *= 0x7feb352du; hsh ^= hsh >> 15; hsh *= 0x846ca68bu; hsh ^= hsh >> 16;
    x[i] = from_float<floatX>(amp * ((hsh >> 8) * (2.0f / 16777216.0f) - 1.0f));
}

static void time_version(int version, int B, int T, int C, int NH) {
    const size_t n_qkv = (size_t)B * T * 3 * C, n_out = (size_t)B * T * C;
    floatX *qkv, *dqkv, *out, *dout;
    float* lse;
    void* scratch;
    cudaCheck(cudaMalloc(&qkv, n_qkv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dqkv, n_qkv * sizeof(floatX)));
    cudaCheck(cudaMalloc(&out, n_out * sizeof(floatX)));
    cudaCheck(cudaMalloc(&dout, n_out * sizeof(floatX)));
    cudaCheck(cudaMalloc(&lse, (size_t)B * NH * T * sizeof(float)));
    cudaCheck(cudaMalloc(&scratch, attention_backward_scratch_bytes(B, T, C, NH)));
    fill_hash_kernel<<<(unsigned)ceil_div_z(n_qkv, 256), 256>>>(qkv, n_qkv, 1u, 1.0f);
    cudaCheckLaunch();
    fill_hash_kernel<<<(unsigned)ceil_div_z(n_out, 256), 256>>>(dout, n_out, 2u, 1.0f);
    cudaCheckLaunch();

    const int iters = version == 1 ? (T > 1024 ? 1 : 3) : (T > 1024 ? 10 : 20);
    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0));
    cudaCheck(cudaEventCreate(&e1));
    float ms_f = 0.0f, ms_b = 0.0f;
    run_forward(version, out, lse, qkv, B, T, C, NH);  // warmup
    run_backward(version, dqkv, scratch, dout, qkv, out, lse, B, T, C, NH);
    cudaCheck(cudaEventRecord(e0));
    for (int i = 0; i < iters; i++) { run_forward(version, out, lse, qkv, B, T, C, NH); }
    cudaCheck(cudaEventRecord(e1));
    cudaCheck(cudaEventSynchronize(e1));
    cudaCheck(cudaEventElapsedTime(&ms_f, e0, e1));
    cudaCheck(cudaEventRecord(e0));
    for (int i = 0; i < iters; i++) { run_backward(version, dqkv, scratch, dout, qkv, out, lse, B, T, C, NH); }
    cudaCheck(cudaEventRecord(e1));
    cudaCheck(cudaEventSynchronize(e1));
    cudaCheck(cudaEventElapsedTime(&ms_b, e0, e1));
    ms_f /= iters;
    ms_b /= iters;
    const double flops_f = 4.0 * B * NH * ((double)T * T / 2) * (C / NH), flops_b = 2.5 * flops_f;
    printf("version %d timing B=%d T=%d C=%d NH=%d: forward %.3f ms (%.1f TFLOP/s), backward %.3f ms (%.1f TFLOP/s)\n",
           version, B, T, C, NH, ms_f, flops_f / ms_f * 1e-9, ms_b, flops_b / ms_b * 1e-9);
    if (version == 2 && C / NH == 64) {  // the backward's two kernels separately
        float ms[2];
        for (int k = 0; k < 2; k++) {
            cudaCheck(cudaEventRecord(e0));
            for (int i = 0; i < iters; i++) {
                if (k == 0) { attention_backward_dq_mma<64>(dqkv, (float*)scratch, dout, qkv, out, lse, B, T, C, NH, 0); }
                if (k == 1) { attention_backward_dkv_mma<64>(dqkv, (float*)scratch, dout, qkv, lse, B, T, C, NH, 0); }
            }
            cudaCheck(cudaEventRecord(e1));
            cudaCheck(cudaEventSynchronize(e1));
            cudaCheck(cudaEventElapsedTime(&ms[k], e0, e1));
            ms[k] /= iters;
        }
        printf("    backward: dq (and D) %.3f ms (%.1f TFLOP/s of its 3 matmuls), dk/dv %.3f ms (%.1f of its 4)\n",
               ms[0], 1.5 * flops_f / ms[0] * 1e-9, ms[1], 2.0 * flops_f / ms[1] * 1e-9);
    }
    cudaCheck(cudaEventDestroy(e0));
    cudaCheck(cudaEventDestroy(e1));
    cudaCheck(cudaFree(qkv)); cudaCheck(cudaFree(dqkv)); cudaCheck(cudaFree(out)); cudaCheck(cudaFree(dout));
    cudaCheck(cudaFree(lse)); cudaCheck(cudaFree(scratch));
}
#endif  // ENABLE_BF16

int main(int argc, char** argv) {
    int v_first = 1, v_last = n_versions;
    if (argc > 1) {
        v_first = v_last = atoi(argv[1]);
        if (v_first < 1 || v_first > n_versions) { die("version must be 1..%d", n_versions); }
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, precision %s\n", prop.name, PRECISION_NAME);
    bool ok = true;
    const int shapes[2][4] = {{2, 37, 64, 4}, {2, 300, 768, 12}};
    for (int v = v_first; v <= v_last; v++) {
        for (int s = 0; s < 2; s++) {
            const int B = shapes[s][0], T = shapes[s][1], C = shapes[s][2], NH = shapes[s][3];
            if (!version_available(v, C, NH)) {
                printf("version %d: not available in the %s build for hs=%d\n", v, PRECISION_NAME, C / NH);
                continue;
            }
            ok &= validate(v, B, T, C, NH);
        }
    }
    printf("validation: %s\n", ok ? "PASS" : "FAIL");
#if defined(ENABLE_BF16)
    if (ok) {
        for (int v = v_first; v <= v_last; v++) {
            if (!version_available(v, 768, 12)) { continue; }
            time_version(v, 16, 1024, 768, 12);
            time_version(v, 16, 4096, 768, 12);
        }
    }
#endif
#if defined(USE_CUDNN)
    attention_cudnn_destroy();
#endif
    return ok ? 0 : 1;
}
