/*
dev/cuda/trunk.cu: test lab of the GPT-2 trunk kernels: kernels/matmul.cuh, norm.cuh, encoder.cuh,
classifier.cuh, adamw.cuh and activations.cuh.

Build (in dev/cuda):
  nvcc -O3 -arch=sm_90 -std=c++17 trunk.cu -lcublasLt -lcublas -o trunk_bin
  nvcc -O3 -arch=sm_90 -std=c++17 -DENABLE_FP32 trunk.cu -lcublasLt -lcublas -o trunk_fp32_bin
Run: ./trunk_bin (or ./trunk_fp32_bin). Prints PASS/FAIL per function and case, then timings; exits 1 if any
check failed.

Every function gets random inputs and is compared with a plain CPU reference written here in double
precision. The reference reads exactly the values the GPU reads (floatX inputs are rounded first, then
widened), so the error measured is the GPU's own. The measure is the relative L2 error
||gpu - ref|| / ||ref|| over the whole output. Tolerances:
  FP32 build 1e-5: every operation is fp32 with fp32 accumulation; a rounding error of 2^-24 (6e-8) per
    operation grows like sqrt(K) over sums of K <= 4096 terms and through softmax/normalisation, i.e. stays near
    1e-6, while any indexing or math mistake gives errors of order 1.
    Exception: a matmul output summing K > 4096 products (the LM head's input gradient, K = 50304) may reach
    about 2^-24 sqrt(K) / 2.5 = 5e-6 by the same estimate, so matmul checks allow 1e-5 * sqrt(K / 4096) there.
  BF16 build 1e-2: activations and their gradients are stored in bf16 (8 significant bits, unit roundoff
    2^-9 = 2e-3), so every floatX output carries up to 0.2% rounding error, a few times that where an input was
    rounded too (pre-activation then GELU, residual then norm); 1e-2 admits that and still catches mistakes.
The FP32 build computes GELU with its own kernel (matmul_fuse_gelu = 0); its check of the cuBLASLt GELU
epilogue is printed as INFO and does not count.
The reductions (bias, norm weight and embedding gradients, the gradient norm) are also run twice from the same
state and must agree bit for bit.

Versions. The lab keeps the previous versions of AdamW and the classifier beside the trainer's and times both
in the same run. AdamW's must give the same bits; both classifiers are checked against the reference:
  adamw_update      version 1: one launch per tensor, one element per thread; version 2 (kernels/adamw.cuh): one
                    launch over every tensor of a plan, four elements per thread loaded before any is updated.
  fused_classifier  version 1: expf per element in both passes; version 2 (kernels/classifier.cuh): the softmax in
                    base 2, one fma and one ex2.approx per element, pass 1 over whole packs without bounds checks.
*/
#include <math.h>
#include <string.h>
#include <vector>

#include "../../kernels/activations.cuh"
#include "../../kernels/matmul.cuh"
#include "../../kernels/norm.cuh"
#include "../../kernels/encoder.cuh"
#include "../../kernels/classifier.cuh"
#include "../../kernels/adamw.cuh"

#if defined(ENABLE_FP32)
static const double TOL = 1e-5;
#else
static const double TOL = 1e-2;
#endif

typedef std::vector<double> Vec;
static cudaStream_t stream;
static int num_failed = 0;

// ----------------------------------------------------------------------------------------------------------
// random numbers, host <-> device

static uint64_t rng_state = 0x1234567887654321ull;
// uniform in [-1, 1) (splitmix64)
static double rand_uniform(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / (double)(1ull << 52) - 1.0;
}

static floatX host_to_floatX(double x) {
#if defined(ENABLE_FP32)
    return (float)x;
#else
    return __float2bfloat16((float)x);
#endif
}
static double host_from_floatX(floatX x) {
#if defined(ENABLE_FP32)
    return x;
#else
    return __bfloat162float(x);
#endif
}

// n random floatX values in [-scale, scale) on the device; ref gets the exact (rounded) values
static floatX* random_x(size_t n, double scale, Vec& ref) {
    std::vector<floatX> h(n);
    ref.resize(n);
    for (size_t i = 0; i < n; i++) {
        h[i] = host_to_floatX(scale * rand_uniform());
        ref[i] = host_from_floatX(h[i]);
    }
    floatX* d = (floatX*)cuda_malloc_or_die(n * sizeof(floatX), "a test buffer");
    cudaCheck(cudaMemcpy(d, h.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    return d;
}

// n random fp32 values in [offset - scale, offset + scale) on the device; ref gets the exact values
static float* random_f(size_t n, double scale, Vec& ref, double offset = 0.0) {
    std::vector<float> h(n);
    ref.resize(n);
    for (size_t i = 0; i < n; i++) {
        h[i] = (float)(offset + scale * rand_uniform());
        ref[i] = h[i];
    }
    float* d = (float*)cuda_malloc_or_die(n * sizeof(float), "a test buffer");
    cudaCheck(cudaMemcpy(d, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static float* upload_f(const Vec& v) {
    std::vector<float> h(v.begin(), v.end());
    float* d = (float*)cuda_malloc_or_die(v.size() * sizeof(float), "a test buffer");
    cudaCheck(cudaMemcpy(d, h.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

static Vec download_x(const floatX* d, size_t n) {
    cudaCheck(cudaStreamSynchronize(stream));
    std::vector<floatX> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    Vec v(n);
    for (size_t i = 0; i < n; i++) { v[i] = host_from_floatX(h[i]); }
    return v;
}

static Vec download_f(const float* d, size_t n) {
    cudaCheck(cudaStreamSynchronize(stream));
    std::vector<float> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return Vec(h.begin(), h.end());
}

static std::vector<unsigned char> download_bytes(const void* d, size_t bytes) {
    cudaCheck(cudaStreamSynchronize(stream));
    std::vector<unsigned char> h(bytes);
    cudaCheck(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost));
    return h;
}

// ----------------------------------------------------------------------------------------------------------
// checks

// relative L2 error of gpu against ref (absolute when ref is all zeros); non-finite values fail.
// counted = 0: print INFO instead of PASS/FAIL, and do not count a failure
static void check_tol(const char* name, const Vec& gpu, const Vec& ref, double tol, int counted) {
    double err = 0.0, norm = 0.0;
    int finite = gpu.size() == ref.size();
    for (size_t i = 0; finite && i < ref.size(); i++) {
        if (!isfinite(gpu[i])) { finite = 0; }
        err += (gpu[i] - ref[i]) * (gpu[i] - ref[i]);
        norm += ref[i] * ref[i];
    }
    const double rel = norm > 0.0 ? sqrt(err / norm) : sqrt(err);
    const int ok = finite && rel <= tol;
    printf("%s %-58s rel_l2 %.3e (tol %.1e)%s\n", !counted ? "INFO" : ok ? "PASS" : "FAIL", name, rel, tol,
           finite ? "" : " non-finite or wrong size");
    if (counted && !ok) { num_failed++; }
}

static void check(const char* name, const Vec& gpu, const Vec& ref) { check_tol(name, gpu, ref, TOL, 1); }

// the tolerance of a matmul output that sums K products (see the top of the file)
static double matmul_tol(int K) {
#if defined(ENABLE_FP32)
    return K > 4096 ? TOL * sqrt(K / 4096.0) : TOL;
#else
    (void)K;
    return TOL;
#endif
}

// two runs from the same state must give the same bytes
static void check_same(const char* name, const std::vector<unsigned char>& a, const std::vector<unsigned char>& b) {
    const int ok = a.size() == b.size() && memcmp(a.data(), b.data(), a.size()) == 0;
    printf("%s %-58s %s\n", ok ? "PASS" : "FAIL", name, ok ? "bitwise identical" : "runs differ");
    if (!ok) { num_failed++; }
}

static double ref_gelu(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
static double ref_gelu_derivative(double x) {
    const double k = sqrt(2.0 / M_PI), th = tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}
static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

// ----------------------------------------------------------------------------------------------------------
// matmul

enum { GELU_NONE, GELU_FUSED, GELU_SEPARATE };

static void test_matmul_forward(int N, int C, int OC, int with_bias, int gelu) {
    Vec inp, w, bias;
    floatX* d_inp = random_x((size_t)N * C, 1.0, inp);
    floatX* d_w = random_x((size_t)OC * C, 1.0 / sqrt((double)C), w);
    floatX* d_bias = with_bias ? random_x(OC, 0.5, bias) : NULL;
    floatX* d_out = (floatX*)cuda_malloc_or_die((size_t)N * OC * sizeof(floatX), "out");
    floatX* d_pre = gelu != GELU_NONE ? (floatX*)cuda_malloc_or_die((size_t)N * OC * sizeof(floatX), "pre") : NULL;

    const int saved_fuse = matmul_fuse_gelu;
    matmul_fuse_gelu = gelu == GELU_FUSED;
    matmul_forward(d_out, d_inp, d_w, d_bias, N, C, OC, d_pre, stream);
    if (gelu == GELU_FUSED && !matmul_fuse_gelu) { printf("note: the fused GELU epilogue fell back to the kernel\n"); }
    matmul_fuse_gelu = saved_fuse;

    Vec pre((size_t)N * OC), out((size_t)N * OC);
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            double s = with_bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) { s += inp[(size_t)n * C + c] * w[(size_t)o * C + c]; }
            pre[(size_t)n * OC + o] = s;
            out[(size_t)n * OC + o] = gelu != GELU_NONE ? ref_gelu(s) : s;
        }
    }
    char name[128];
    const char* gelu_name[] = {"", " gelu fused", " gelu separate"};
#if defined(ENABLE_FP32)
    const int counted = gelu != GELU_FUSED;   // the FP32 build does not use the epilogue's GELU
#else
    const int counted = 1;
#endif
    snprintf(name, sizeof(name), "matmul_forward N=%d C=%d OC=%d%s%s: out", N, C, OC, with_bias ? " bias" : "",
             gelu_name[gelu]);
    check_tol(name, download_x(d_out, (size_t)N * OC), out, matmul_tol(C), counted);
    if (d_pre != NULL) {
        snprintf(name, sizeof(name), "matmul_forward N=%d C=%d OC=%d%s%s: pre_gelu", N, C, OC,
                 with_bias ? " bias" : "", gelu_name[gelu]);
        check_tol(name, download_x(d_pre, (size_t)N * OC), pre, matmul_tol(C), counted);
    }
    cudaCheck(cudaFree(d_inp));
    cudaCheck(cudaFree(d_w));
    cudaCheck(cudaFree(d_bias));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_pre));
}

static void test_matmul_backward(int N, int C, int OC, int with_bias, int accumulate) {
    Vec inp, w, dout, dinp0, dw0, db0;
    floatX* d_inp = random_x((size_t)N * C, 1.0, inp);
    floatX* d_w = random_x((size_t)OC * C, 1.0 / sqrt((double)C), w);
    floatX* d_dout = random_x((size_t)N * OC, 1.0, dout);
    floatX* d_dinp = random_x((size_t)N * C, 1.0, dinp0);
    float* d_dw = random_f((size_t)OC * C, 1.0, dw0);
    float* d_db = with_bias ? random_f(OC, 1.0, db0) : NULL;
    float* d_scratch = (float*)cuda_malloc_or_die(matmul_backward_scratch_bytes(N, OC), "scratch");
    floatX* d_dinp_start = (floatX*)cuda_malloc_or_die((size_t)N * C * sizeof(floatX), "dinp copy");
    float* d_dw_start = (float*)cuda_malloc_or_die((size_t)OC * C * sizeof(float), "dw copy");
    float* d_db_start = (float*)cuda_malloc_or_die((size_t)OC * sizeof(float), "db copy");
    cudaCheck(cudaMemcpy(d_dinp_start, d_dinp, (size_t)N * C * sizeof(floatX), cudaMemcpyDeviceToDevice));
    cudaCheck(cudaMemcpy(d_dw_start, d_dw, (size_t)OC * C * sizeof(float), cudaMemcpyDeviceToDevice));
    if (with_bias) { cudaCheck(cudaMemcpy(d_db_start, d_db, (size_t)OC * sizeof(float), cudaMemcpyDeviceToDevice)); }

    matmul_backward(d_dinp, d_dw, d_db, d_scratch, d_dout, d_inp, d_w, N, C, OC, accumulate, stream);
    const Vec g_dinp = download_x(d_dinp, (size_t)N * C), g_dw = download_f(d_dw, (size_t)OC * C);
    const std::vector<unsigned char> run1_dw = download_bytes(d_dw, (size_t)OC * C * sizeof(float));
    std::vector<unsigned char> run1_db, run2_db;
    if (with_bias) { run1_db = download_bytes(d_db, (size_t)OC * sizeof(float)); }

    Vec dinp((size_t)N * C), dw((size_t)OC * C), db(OC);
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            double s = accumulate ? dinp0[(size_t)n * C + c] : 0.0;
            for (int o = 0; o < OC; o++) { s += dout[(size_t)n * OC + o] * w[(size_t)o * C + c]; }
            dinp[(size_t)n * C + c] = s;
        }
    }
    for (int o = 0; o < OC; o++) {
        for (int c = 0; c < C; c++) {
            double s = dw0[(size_t)o * C + c];
            for (int n = 0; n < N; n++) { s += dout[(size_t)n * OC + o] * inp[(size_t)n * C + c]; }
            dw[(size_t)o * C + c] = s;
        }
        if (with_bias) {
            double s = db0[o];
            for (int n = 0; n < N; n++) { s += dout[(size_t)n * OC + o]; }
            db[o] = s;
        }
    }
    char name[128];
    snprintf(name, sizeof(name), "matmul_backward N=%d C=%d OC=%d%s: dinp", N, C, OC, accumulate ? " (+=)" : "");
    check_tol(name, g_dinp, dinp, matmul_tol(OC), 1);
    snprintf(name, sizeof(name), "matmul_backward N=%d C=%d OC=%d: dweight (+=)", N, C, OC);
    check_tol(name, g_dw, dw, matmul_tol(N), 1);
    if (with_bias) {
        snprintf(name, sizeof(name), "matmul_backward N=%d C=%d OC=%d: dbias (+=)", N, C, OC);
        check(name, download_f(d_db, OC), db);
    }

    // second run from the same state: the gradients must be bitwise identical
    cudaCheck(cudaMemcpy(d_dinp, d_dinp_start, (size_t)N * C * sizeof(floatX), cudaMemcpyDeviceToDevice));
    cudaCheck(cudaMemcpy(d_dw, d_dw_start, (size_t)OC * C * sizeof(float), cudaMemcpyDeviceToDevice));
    if (with_bias) { cudaCheck(cudaMemcpy(d_db, d_db_start, (size_t)OC * sizeof(float), cudaMemcpyDeviceToDevice)); }
    matmul_backward(d_dinp, d_dw, d_db, d_scratch, d_dout, d_inp, d_w, N, C, OC, accumulate, stream);
    snprintf(name, sizeof(name), "matmul_backward N=%d C=%d OC=%d: dweight rerun", N, C, OC);
    check_same(name, run1_dw, download_bytes(d_dw, (size_t)OC * C * sizeof(float)));
    if (with_bias) {
        run2_db = download_bytes(d_db, (size_t)OC * sizeof(float));
        snprintf(name, sizeof(name), "matmul_backward N=%d C=%d OC=%d: dbias rerun", N, C, OC);
        check_same(name, run1_db, run2_db);
    }
    cudaCheck(cudaFree(d_inp));
    cudaCheck(cudaFree(d_w));
    cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_dinp));
    cudaCheck(cudaFree(d_dw));
    cudaCheck(cudaFree(d_db));
    cudaCheck(cudaFree(d_scratch));
    cudaCheck(cudaFree(d_dinp_start));
    cudaCheck(cudaFree(d_dw_start));
    cudaCheck(cudaFree(d_db_start));
}

// dinp = (dout weight) * GELU'(pre): matmul_backward_gelu, with cuBLASLt's DGELU epilogue (fused) or the plain
// matmul then gelu_backward_inplace (separate); the weight and bias gradients are matmul_backward's (tested above)
static void test_matmul_backward_gelu(int N, int C, int OC, int gelu) {
    Vec pre, w, dout, unused;
    floatX* d_pre = random_x((size_t)N * C, 2.0, pre);
    floatX* d_w = random_x((size_t)OC * C, 1.0 / sqrt((double)C), w);
    floatX* d_dout = random_x((size_t)N * OC, 1.0, dout);
    floatX* d_dinp = random_x((size_t)N * C, 1.0, unused);
    const int saved_fuse = matmul_fuse_gelu;
    matmul_fuse_gelu = gelu == GELU_FUSED;
    matmul_backward_gelu(d_dinp, NULL, NULL, NULL, d_dout, NULL, d_w, d_pre, N, C, OC, stream);
    if (gelu == GELU_FUSED && !matmul_fuse_gelu) {
        printf("note: the fused DGELU epilogue fell back to the kernels\n");
    }
    matmul_fuse_gelu = saved_fuse;
    Vec dinp((size_t)N * C);
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            double s = 0.0;
            for (int o = 0; o < OC; o++) { s += dout[(size_t)n * OC + o] * w[(size_t)o * C + c]; }
            dinp[(size_t)n * C + c] = s * ref_gelu_derivative(pre[(size_t)n * C + c]);
        }
    }
#if defined(ENABLE_FP32)
    const int counted = gelu != GELU_FUSED;   // the FP32 build does not use the epilogue's GELU'
#else
    const int counted = 1;
#endif
    char name[128];
    snprintf(name, sizeof(name), "matmul_backward_gelu N=%d C=%d OC=%d (%s): dinp", N, C, OC,
             gelu == GELU_FUSED ? "DGELU epilogue" : "separate kernel");
    check_tol(name, download_x(d_dinp, (size_t)N * C), dinp, matmul_tol(OC), counted);
    void* buffers[] = {d_pre, d_w, d_dout, d_dinp};
    for (void* p : buffers) { cudaCheck(cudaFree(p)); }
}

// ----------------------------------------------------------------------------------------------------------
// elementwise

static void test_activations(void) {
    const size_t n = 100003;
    const int N = 37, Hm = 1000;
    Vec a, b, pre, d0;
    floatX* d_a = random_x(n, 2.0, a);
    floatX* d_b = random_x(n, 2.0, b);
    floatX* d_pre = random_x(n, 4.0, pre);
    floatX* d_d = random_x(n, 1.0, d0);
    floatX* d_out = (floatX*)cuda_malloc_or_die(n * sizeof(floatX), "out");
    Vec ref(n);

    residual_forward(d_out, d_a, d_b, n, stream);
    for (size_t i = 0; i < n; i++) { ref[i] = a[i] + b[i]; }
    check("residual_forward n=100003", download_x(d_out, n), ref);

    gelu_forward(d_out, d_pre, n, stream);
    for (size_t i = 0; i < n; i++) { ref[i] = ref_gelu(pre[i]); }
    check("gelu_forward n=100003", download_x(d_out, n), ref);

    gelu_backward_inplace(d_d, d_pre, n, stream);
    for (size_t i = 0; i < n; i++) { ref[i] = d0[i] * ref_gelu_derivative(pre[i]); }
    check("gelu_backward_inplace n=100003", download_x(d_d, n), ref);

    Vec inp, dout;
    floatX* d_inp = random_x((size_t)N * 2 * Hm, 4.0, inp);
    floatX* d_dout = random_x((size_t)N * Hm, 1.0, dout);
    floatX* d_sw = (floatX*)cuda_malloc_or_die((size_t)N * 2 * Hm * sizeof(floatX), "swiglu");
    Vec out((size_t)N * Hm), dinp((size_t)N * 2 * Hm);
    for (int r = 0; r < N; r++) {
        for (int j = 0; j < Hm; j++) {
            const double gate = inp[(size_t)r * 2 * Hm + j], up = inp[(size_t)r * 2 * Hm + Hm + j];
            const double d = dout[(size_t)r * Hm + j], sg = ref_sigmoid(gate);
            out[(size_t)r * Hm + j] = gate * sg * up;
            dinp[(size_t)r * 2 * Hm + j] = d * up * sg * (1.0 + gate * (1.0 - sg));
            dinp[(size_t)r * 2 * Hm + Hm + j] = d * gate * sg;
        }
    }
    swiglu_forward(d_sw, d_inp, N, Hm, stream);
    check("swiglu_forward N=37 Hm=1000", download_x(d_sw, (size_t)N * Hm), out);
    swiglu_backward(d_sw, d_inp, d_dout, N, Hm, stream);
    check("swiglu_backward N=37 Hm=1000", download_x(d_sw, (size_t)N * 2 * Hm), dinp);

    cudaCheck(cudaFree(d_a));
    cudaCheck(cudaFree(d_b));
    cudaCheck(cudaFree(d_pre));
    cudaCheck(cudaFree(d_d));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_inp));
    cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_sw));
}

// ----------------------------------------------------------------------------------------------------------
// norms

// reference forward of one row set: fills out, mean, rstd from x (kind as in norm.cuh)
static void ref_norm_forward(int kind, Vec& out, Vec& mean, Vec& rstd, const Vec& x, const Vec& w, const Vec& b,
                             int N, int C, double eps) {
    out.resize((size_t)N * C);
    mean.assign(N, 0.0);
    rstd.resize(N);
    for (int n = 0; n < N; n++) {
        const double* xr = &x[(size_t)n * C];
        double m = 0.0, v = 0.0;
        if (kind == NORM_LAYERNORM) {
            for (int i = 0; i < C; i++) { m += xr[i]; }
            m /= C;
        }
        for (int i = 0; i < C; i++) { v += (xr[i] - m) * (xr[i] - m); }
        const double s = 1.0 / sqrt(v / C + eps);
        for (int i = 0; i < C; i++) {
            const double xhat = (xr[i] - m) * s;
            out[(size_t)n * C + i] = kind == NORM_LAYERNORM ? xhat * w[i] + b[i] : xhat * w[i];
        }
        mean[n] = m;
        rstd[n] = s;
    }
}

static void test_norm(int kind, int N, int C) {
    const double eps = 1e-5;
    const char* kind_name = kind == NORM_LAYERNORM ? "layernorm" : "rmsnorm";
    char name[128];
    Vec x, x2, w, b, dout, dinp0, dw0, db0;
    floatX* d_x = random_x((size_t)N * C, 2.0, x);
    floatX* d_x2 = random_x((size_t)N * C, 1.0, x2);
    float* d_w = random_f(C, 0.5, w, 1.0);
    float* d_b = random_f(C, 0.5, b);
    floatX* d_out = (floatX*)cuda_malloc_or_die((size_t)N * C * sizeof(floatX), "out");
    floatX* d_res = (floatX*)cuda_malloc_or_die((size_t)N * C * sizeof(floatX), "residual");
    float* d_mean = (float*)cuda_malloc_or_die(N * sizeof(float), "mean");
    float* d_rstd = (float*)cuda_malloc_or_die(N * sizeof(float), "rstd");

    // forward
    Vec out, mean, rstd;
    ref_norm_forward(kind, out, mean, rstd, x, w, b, N, C, eps);
    norm_forward(kind, d_out, d_mean, d_rstd, d_x, d_w, kind == NORM_LAYERNORM ? d_b : NULL, N, C, (float)eps, stream);
    snprintf(name, sizeof(name), "norm_forward %s N=%d C=%d: out", kind_name, N, C);
    check(name, download_x(d_out, (size_t)N * C), out);
    if (kind == NORM_LAYERNORM) {
        snprintf(name, sizeof(name), "norm_forward %s N=%d C=%d: mean", kind_name, N, C);
        check(name, download_f(d_mean, N), mean);
    }
    snprintf(name, sizeof(name), "norm_forward %s N=%d C=%d: rstd", kind_name, N, C);
    check(name, download_f(d_rstd, N), rstd);

    // fused residual + norm: the residual is rounded to floatX, and that stored value is normalised
    Vec res((size_t)N * C);
    for (size_t i = 0; i < res.size(); i++) { res[i] = host_from_floatX(host_to_floatX(x[i] + x2[i])); }
    ref_norm_forward(kind, out, mean, rstd, res, w, b, N, C, eps);
    fused_residual_norm_forward(kind, d_res, d_out, d_mean, d_rstd, d_x, d_x2, d_w, kind == NORM_LAYERNORM ? d_b : NULL,
                                N, C, (float)eps, stream);
    snprintf(name, sizeof(name), "fused_residual_norm_forward %s N=%d C=%d: residual", kind_name, N, C);
    check(name, download_x(d_res, (size_t)N * C), res);
    snprintf(name, sizeof(name), "fused_residual_norm_forward %s N=%d C=%d: out", kind_name, N, C);
    check(name, download_x(d_out, (size_t)N * C), out);
    snprintf(name, sizeof(name), "fused_residual_norm_forward %s N=%d C=%d: rstd", kind_name, N, C);
    check(name, download_f(d_rstd, N), rstd);
    // in place: the residual written over its first input
    fused_residual_norm_forward(kind, d_x, d_out, d_mean, d_rstd, d_x, d_x2, d_w, kind == NORM_LAYERNORM ? d_b : NULL,
                                N, C, (float)eps, stream);
    snprintf(name, sizeof(name), "fused_residual_norm_forward %s N=%d C=%d: in place", kind_name, N, C);
    check(name, download_x(d_out, (size_t)N * C), out);

    // backward, on the stored residual, with the statistics as fp32 (what the GPU reads)
    for (int n = 0; n < N; n++) {
        mean[n] = (float)mean[n];
        rstd[n] = (float)rstd[n];
    }
    float* d_mean_in = upload_f(mean);
    float* d_rstd_in = upload_f(rstd);
    floatX* d_dout = random_x((size_t)N * C, 1.0, dout);
    floatX* d_dinp = random_x((size_t)N * C, 1.0, dinp0);
    float* d_dw = random_f(C, 1.0, dw0);
    float* d_db = random_f(C, 1.0, db0);
    float* d_scratch = (float*)cuda_malloc_or_die(norm_backward_scratch_bytes(N, C), "scratch");
    floatX* d_dinp_start = (floatX*)cuda_malloc_or_die((size_t)N * C * sizeof(floatX), "dinp copy");
    cudaCheck(cudaMemcpy(d_dinp_start, d_dinp, (size_t)N * C * sizeof(floatX), cudaMemcpyDeviceToDevice));

    Vec dinp(dinp0), dw(dw0), db(db0);
    for (int n = 0; n < N; n++) {
        const double m = mean[n], s = rstd[n];
        double mean_dxhat = 0.0, mean_dxhat_xhat = 0.0;
        for (int i = 0; i < C; i++) {
            const double xhat = (res[(size_t)n * C + i] - m) * s, dxhat = dout[(size_t)n * C + i] * w[i];
            mean_dxhat += dxhat;
            mean_dxhat_xhat += dxhat * xhat;
            dw[i] += dout[(size_t)n * C + i] * xhat;
            db[i] += dout[(size_t)n * C + i];
        }
        mean_dxhat = kind == NORM_LAYERNORM ? mean_dxhat / C : 0.0;
        mean_dxhat_xhat /= C;
        for (int i = 0; i < C; i++) {
            const double xhat = (res[(size_t)n * C + i] - m) * s, dxhat = dout[(size_t)n * C + i] * w[i];
            dinp[(size_t)n * C + i] += (dxhat - mean_dxhat - xhat * mean_dxhat_xhat) * s;
        }
    }
    // d_x holds the stored residual now (the in-place call above)
    norm_backward(kind, d_dinp, d_dw, kind == NORM_LAYERNORM ? d_db : NULL, d_scratch, d_dout, d_x, d_w, d_mean_in,
                  d_rstd_in, N, C, stream);
    snprintf(name, sizeof(name), "norm_backward %s N=%d C=%d: dinp (+=)", kind_name, N, C);
    check(name, download_x(d_dinp, (size_t)N * C), dinp);
    snprintf(name, sizeof(name), "norm_backward %s N=%d C=%d: dw (+=)", kind_name, N, C);
    check(name, download_f(d_dw, C), dw);
    if (kind == NORM_LAYERNORM) {
        snprintf(name, sizeof(name), "norm_backward %s N=%d C=%d: db (+=)", kind_name, N, C);
        check(name, download_f(d_db, C), db);
    }
    // rerun from the same state
    const std::vector<unsigned char> run1_dw = download_bytes(d_dw, C * sizeof(float));
    const std::vector<unsigned char> run1_db = download_bytes(d_db, C * sizeof(float));
    const std::vector<unsigned char> run1_dinp = download_bytes(d_dinp, (size_t)N * C * sizeof(floatX));
    float* d_dw_start = upload_f(dw0);
    float* d_db_start = upload_f(db0);
    cudaCheck(cudaMemcpy(d_dinp, d_dinp_start, (size_t)N * C * sizeof(floatX), cudaMemcpyDeviceToDevice));
    cudaCheck(cudaMemcpy(d_dw, d_dw_start, C * sizeof(float), cudaMemcpyDeviceToDevice));
    cudaCheck(cudaMemcpy(d_db, d_db_start, C * sizeof(float), cudaMemcpyDeviceToDevice));
    norm_backward(kind, d_dinp, d_dw, kind == NORM_LAYERNORM ? d_db : NULL, d_scratch, d_dout, d_x, d_w, d_mean_in,
                  d_rstd_in, N, C, stream);
    snprintf(name, sizeof(name), "norm_backward %s N=%d C=%d: rerun", kind_name, N, C);
    std::vector<unsigned char> run2 = download_bytes(d_dw, C * sizeof(float)), run1 = run1_dw;
    const std::vector<unsigned char> run2_db = download_bytes(d_db, C * sizeof(float));
    const std::vector<unsigned char> run2_dinp = download_bytes(d_dinp, (size_t)N * C * sizeof(floatX));
    run1.insert(run1.end(), run1_db.begin(), run1_db.end());
    run1.insert(run1.end(), run1_dinp.begin(), run1_dinp.end());
    run2.insert(run2.end(), run2_db.begin(), run2_db.end());
    run2.insert(run2.end(), run2_dinp.begin(), run2_dinp.end());
    check_same(name, run1, run2);

    void* buffers[] = {d_x, d_x2, d_w, d_b, d_out, d_res, d_mean, d_rstd, d_mean_in, d_rstd_in, d_dout, d_dinp,
                       d_dw, d_db, d_scratch, d_dinp_start, d_dw_start, d_db_start};
    for (void* p : buffers) { cudaCheck(cudaFree(p)); }
}

// ----------------------------------------------------------------------------------------------------------
// encoder

static void test_encoder(int B, int T, int C, int V, int with_wpe) {
    const int BT = B * T;
    char name[128];
    // a skewed token distribution: token 7 at about 40% of the positions (split into many work items), token
    // 0 at about 10%, the rest uniform
    std::vector<int> tokens(BT);
    for (int i = 0; i < BT; i++) {
        const double u = 0.5 * (rand_uniform() + 1.0);
        tokens[i] = u < 0.4 ? 7 : u < 0.5 ? 0 : (int)(0.5 * (rand_uniform() + 1.0) * V) % V;
    }
    int* d_tokens = (int*)cuda_malloc_or_die(BT * sizeof(int), "tokens");
    cudaCheck(cudaMemcpy(d_tokens, tokens.data(), BT * sizeof(int), cudaMemcpyHostToDevice));
    Vec wte, wpe, dout, dwte0, dwpe0;
    float* d_wte = random_f((size_t)V * C, 1.0, wte);
    float* d_wpe = with_wpe ? random_f((size_t)T * C, 1.0, wpe) : NULL;
    floatX* d_out = (floatX*)cuda_malloc_or_die((size_t)BT * C * sizeof(floatX), "out");

    Vec out((size_t)BT * C);
    for (int bt = 0; bt < BT; bt++) {
        for (int c = 0; c < C; c++) {
            const double pos = with_wpe ? wpe[(size_t)(bt % T) * C + c] : 0.0;
            out[(size_t)bt * C + c] = wte[(size_t)tokens[bt] * C + c] + pos;
        }
    }
    encoder_forward(d_out, d_tokens, d_wte, d_wpe, B, T, C, stream);
    snprintf(name, sizeof(name), "encoder_forward B=%d T=%d C=%d%s", B, T, C, with_wpe ? " wpe" : "");
    check(name, download_x(d_out, (size_t)BT * C), out);

    floatX* d_dout = random_x((size_t)BT * C, 1.0, dout);
    float* d_dwte = random_f((size_t)V * C, 1.0, dwte0);
    float* d_dwpe = with_wpe ? random_f((size_t)T * C, 1.0, dwpe0) : NULL;
    void* d_scratch = cuda_malloc_or_die(encoder_backward_scratch_bytes(B, T, C), "scratch");
    Vec dwte(dwte0), dwpe(dwpe0);
    for (int bt = 0; bt < BT; bt++) {
        for (int c = 0; c < C; c++) {
            dwte[(size_t)tokens[bt] * C + c] += dout[(size_t)bt * C + c];
            if (with_wpe) { dwpe[(size_t)(bt % T) * C + c] += dout[(size_t)bt * C + c]; }
        }
    }
    encoder_backward(d_dwte, d_dwpe, d_scratch, d_dout, d_tokens, V, B, T, C, stream);
    snprintf(name, sizeof(name), "encoder_backward B=%d T=%d C=%d: dwte (+=)", B, T, C);
    check(name, download_f(d_dwte, (size_t)V * C), dwte);
    if (with_wpe) {
        snprintf(name, sizeof(name), "encoder_backward B=%d T=%d C=%d: dwpe (+=)", B, T, C);
        check(name, download_f(d_dwpe, (size_t)T * C), dwpe);
    }
    // rerun from the same state
    const std::vector<unsigned char> run1 = download_bytes(d_dwte, (size_t)V * C * sizeof(float));
    float* d_dwte_start = upload_f(dwte0);
    cudaCheck(cudaMemcpy(d_dwte, d_dwte_start, (size_t)V * C * sizeof(float), cudaMemcpyDeviceToDevice));
    encoder_backward(d_dwte, NULL, d_scratch, d_dout, d_tokens, V, B, T, C, stream);
    snprintf(name, sizeof(name), "encoder_backward B=%d T=%d C=%d: dwte rerun", B, T, C);
    check_same(name, run1, download_bytes(d_dwte, (size_t)V * C * sizeof(float)));

    void* buffers[] = {d_tokens, d_wte, d_wpe, d_out, d_dout, d_dwte, d_dwpe, d_scratch, d_dwte_start};
    for (void* p : buffers) { cudaCheck(cudaFree(p)); }
}

// ----------------------------------------------------------------------------------------------------------
// classifier

// (m, s) := the (max, sum of exp(x - max)) of the union of two sets given as (m, s) and (m2, s2).
// An empty set is (-inf, 0), and contributes nothing (without computing exp(-inf - -inf) = exp(nan)).
__device__ __forceinline__ void softmax_stats_merge_v1(float& m, float& s, float m2, float s2) {
    const float m_new = fmaxf(m, m2);
    const float a = s == 0.0f ? 0.0f : s * expf(m - m_new);
    const float b = s2 == 0.0f ? 0.0f : s2 * expf(m2 - m_new);
    m = m_new;
    s = a + b;
}

// version 1: grid BT, block CLASSIFIER_BLOCK: one row per block, expf per element in both passes
__global__ void __launch_bounds__(CLASSIFIER_BLOCK) fused_classifier_v1_kernel(floatX* logits, float* losses,
                                                                           const int* targets, float dloss, int V,
                                                                           int Vp, int write_dlogits) {
    __shared__ float warp_m[CLASSIFIER_BLOCK / 32], warp_s[CLASSIFIER_BLOCK / 32];
    const int row = blockIdx.x;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    floatX* z = logits + (size_t)row * Vp;
    const int target = targets != NULL ? targets[row] : -1;
    // the target's logit, read before any thread may overwrite it with its gradient (after the barrier below)
    const float z_target = (threadIdx.x == 0 && target >= 0) ? to_float(z[target]) : 0.0f;

    // pass 1: each thread's running (max, sum) over its 16-byte packs of the first V columns
    float m = -INFINITY, s = 0.0f;
    for (int i = threadIdx.x * CLASSIFIER_VEC; i < V; i += CLASSIFIER_BLOCK * CLASSIFIER_VEC) {
        const ClassifierPack pack = *(const ClassifierPack*)(z + i);
        float pack_max = -INFINITY;
        for (int k = 0; k < CLASSIFIER_VEC; k++) {
            if (i + k < V) { pack_max = fmaxf(pack_max, to_float(pack.v[k])); }
        }
        const float m_new = fmaxf(m, pack_max);
        s *= expf(m - m_new);   // m = -inf on the first pack: s is 0 and exp(-inf) = 0
        for (int k = 0; k < CLASSIFIER_VEC; k++) {
            if (i + k < V) { s += expf(to_float(pack.v[k]) - m_new); }
        }
        m = m_new;
    }
    // combine: within each warp, then the warps' results in warp 0
    for (int o = 16; o > 0; o >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        softmax_stats_merge_v1(m, s, m2, s2);
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
            softmax_stats_merge_v1(m, s, m2, s2);
        }
        if (lane == 0) {
            warp_m[0] = m;
            warp_s[0] = s;
            if (losses != NULL && targets != NULL) { losses[row] = target >= 0 ? logf(s) - (z_target - m) : 0.0f; }
        }
    }
    __syncthreads();
    if (!write_dlogits) { return; }
    const float row_max = warp_m[0], inv_sum = 1.0f / warp_s[0];

    // pass 2: dlogits = (p - onehot(target)) * dloss over the first V columns, 0 over the padding
    for (int i = threadIdx.x * CLASSIFIER_VEC; i < Vp; i += CLASSIFIER_BLOCK * CLASSIFIER_VEC) {
        ClassifierPack pack = *(const ClassifierPack*)(z + i);
        for (int k = 0; k < CLASSIFIER_VEC; k++) {
            const int j = i + k;
            float d = 0.0f;
            if (j < V && target >= 0) {
                const float p = expf(to_float(pack.v[k]) - row_max) * inv_sum;
                d = (p - (j == target ? 1.0f : 0.0f)) * dloss;
            }
            pack.v[k] = from_float<floatX>(d);
        }
        *(ClassifierPack*)(z + i) = pack;
    }
}

static void fused_classifier_v1(floatX* logits, float* losses, const int* targets, float dloss, int BT, int V, int Vp,
                                int write_dlogits) {
    fused_classifier_v1_kernel<<<BT, CLASSIFIER_BLOCK, 0, stream>>>(logits, losses, targets, dloss, V, Vp,
                                                                    write_dlogits);
    cudaCheckLaunch();
}

// both versions against the double-precision reference; every 5th row's target is ignored (negative)
static void test_classifier(int BT, int V, int Vp) {
    char name[128];
    Vec logits;
    floatX* d_logits = random_x((size_t)BT * Vp, 4.0, logits);
    const std::vector<unsigned char> logits_bytes = download_bytes(d_logits, (size_t)BT * Vp * sizeof(floatX));
    std::vector<int> targets(BT);
    for (int i = 0; i < BT; i++) { targets[i] = i % 5 == 4 ? -1 : (int)(0.5 * (rand_uniform() + 1.0) * V) % V; }
    int* d_targets = (int*)cuda_malloc_or_die(BT * sizeof(int), "targets");
    cudaCheck(cudaMemcpy(d_targets, targets.data(), BT * sizeof(int), cudaMemcpyHostToDevice));
    float* d_losses = (float*)cuda_malloc_or_die(BT * sizeof(float), "losses");
    const double dloss = 1.0 / BT;

    Vec losses(BT, 0.0), dlogits((size_t)BT * Vp, 0.0);
    for (int r = 0; r < BT; r++) {
        if (targets[r] < 0) { continue; }
        const double* z = &logits[(size_t)r * Vp];
        double m = -INFINITY, s = 0.0;
        for (int i = 0; i < V; i++) { m = fmax(m, z[i]); }
        for (int i = 0; i < V; i++) { s += exp(z[i] - m); }
        losses[r] = -(z[targets[r]] - m - log(s));
        for (int i = 0; i < V; i++) {
            dlogits[(size_t)r * Vp + i] = (exp(z[i] - m) / s - (i == targets[r] ? 1.0 : 0.0)) * dloss;
        }
    }
    for (int version = 1; version <= 2; version++) {
        auto classifier = [&](int write_dlogits) {
            if (version == 1) {
                fused_classifier_v1(d_logits, d_losses, d_targets, (float)dloss, BT, V, Vp, write_dlogits);
            } else {
                fused_classifier(d_logits, d_losses, d_targets, (float)dloss, BT, V, Vp, write_dlogits, stream);
            }
        };
        cudaCheck(cudaMemcpy(d_logits, logits_bytes.data(), logits_bytes.size(), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemset(d_losses, 0xff, BT * sizeof(float)));   // NaN: every loss must be written
        classifier(0);
        snprintf(name, sizeof(name), "fused_classifier v%d BT=%d V=%d Vp=%d: losses", version, BT, V, Vp);
        check(name, download_f(d_losses, BT), losses);
        snprintf(name, sizeof(name), "fused_classifier v%d BT=%d V=%d Vp=%d: logits kept", version, BT, V, Vp);
        check(name, download_x(d_logits, (size_t)BT * Vp), logits);
        cudaCheck(cudaMemset(d_losses, 0xff, BT * sizeof(float)));
        classifier(1);
        snprintf(name, sizeof(name), "fused_classifier v%d BT=%d V=%d Vp=%d: losses (with dlogits)", version, BT, V, Vp);
        check(name, download_f(d_losses, BT), losses);
        snprintf(name, sizeof(name), "fused_classifier v%d BT=%d V=%d Vp=%d: dlogits", version, BT, V, Vp);
        check(name, download_x(d_logits, (size_t)BT * Vp), dlogits);
    }

    cudaCheck(cudaFree(d_logits));
    cudaCheck(cudaFree(d_targets));
    cudaCheck(cudaFree(d_losses));
}

// ----------------------------------------------------------------------------------------------------------
// optimizer

// version 1 (the trainer's before version 2): one launch per tensor, one element per thread
__global__ void adamw_v1_kernel(float* params, floatX* params_x, const float* grads, float* m, float* v, size_t n,
                                float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                                float bias_correction1, float bias_correction2) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    const float g = grads[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bias_correction1, vhat = vi / bias_correction2;
    float p = params[i];
    p -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * p);
    params[i] = p;
    if (params_x != NULL) { params_x[i] = from_float<floatX>(p); }
}

// version 1 over the spans, as the trainer launched it per tensor
static void adamw_v1_update(const AdamWSpan* spans, int num_spans, float* params, floatX* params_x, const float* grads,
                            float* m, float* v, float lr, float beta1, float beta2, float eps, float wd,
                            float grad_scale, float bc1, float bc2) {
    for (int k = 0; k < num_spans; k++) {
        const AdamWSpan* sp = &spans[k];
        adamw_v1_kernel<<<(unsigned int)ceil_div_z(sp->n, ADAMW_BLOCK), ADAMW_BLOCK, 0, stream>>>(
            params + sp->offset, params_x != NULL ? params_x + sp->offset : NULL, grads + sp->offset,
            m + sp->state_offset, v + sp->state_offset, sp->n, lr * sp->lr_scale, beta1, beta2, eps,
            sp->decay ? wd : 0.0f, grad_scale, bc1, bc2);
        cudaCheckLaunch();
    }
}

// AdamW over a plan of four tensors (sizes that do not fill a block, learning-rate scales, with and without weight
// decay, m and v offset from the parameters as a ZeRO slice has them, a gap that must stay untouched) against the
// double-precision reference, then version 1 on the same state: the same bits
static void test_adamw(void) {
    const float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, grad_scale = 0.5f;
    const int t = 3;
    const float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
    AdamWSpan spans[4] = {{5, 0, 100003, 1.0f, 1, 0}, {100064, 100059, 1000, 0.5f, 0, 0},
                          {101100, 101095, 1, 2.0f, 1, 0}, {101200, 101195, 3000, 1.0f, 0, 0}};
    const size_t n = 104200, n_state = n - 5;   // the element before the first span and the gaps are not updated
    Vec p, g, m, v;
    float* d_p = random_f(n, 1.0, p);
    float* d_g = random_f(n, 1.0, g);
    float* d_m = random_f(n_state, 0.1, m);
    float* d_v = random_f(n_state, 0.005, v, 0.005);
    floatX* d_px = (floatX*)cuda_malloc_or_die(n * sizeof(floatX), "params_x");
    cudaCheck(cudaMemset(d_px, 0, n * sizeof(floatX)));
    const Vec p0 = p, m0 = m, v0 = v;
    Vec px(n, 0.0);
    for (const AdamWSpan& sp : spans) {
        const double span_lr = (double)(lr * sp.lr_scale), span_wd = sp.decay ? wd : 0.0;
        for (size_t j = 0; j < sp.n; j++) {
            const size_t i = sp.offset + j, is = sp.state_offset + j;
            const double gi = g[i] * grad_scale;
            m[is] = beta1 * m[is] + (1.0 - beta1) * gi;
            v[is] = beta2 * v[is] + (1.0 - beta2) * gi * gi;
            const double mhat = m[is] / bc1, vhat = v[is] / bc2;
            p[i] -= span_lr * (mhat / (sqrt(vhat) + eps) + span_wd * p[i]);
            px[i] = p[i];
        }
    }
    AdamWPlan plan;
    adamw_plan_build(&plan, spans, 4);
    adamw_update(&plan, d_p, d_px, d_g, d_m, d_v, lr, beta1, beta2, eps, wd, grad_scale, bc1, bc2, stream);
    check("adamw_update 4 tensors: params", download_f(d_p, n), p);
    check("adamw_update 4 tensors: params_x", download_x(d_px, n), px);
    check("adamw_update 4 tensors: m", download_f(d_m, n_state), m);
    check("adamw_update 4 tensors: v", download_f(d_v, n_state), v);
    const std::vector<unsigned char> v2_bits[4] = {download_bytes(d_p, n * sizeof(float)),
                                                   download_bytes(d_px, n * sizeof(floatX)),
                                                   download_bytes(d_m, n_state * sizeof(float)),
                                                   download_bytes(d_v, n_state * sizeof(float))};
    // version 1 from the same state
    float* d_p1 = upload_f(p0);
    float* d_m1 = upload_f(m0);
    float* d_v1 = upload_f(v0);
    cudaCheck(cudaMemset(d_px, 0, n * sizeof(floatX)));
    adamw_v1_update(spans, 4, d_p1, d_px, d_g, d_m1, d_v1, lr, beta1, beta2, eps, wd, grad_scale, bc1, bc2);
    check_same("adamw_update 4 tensors: params as version 1", v2_bits[0], download_bytes(d_p1, n * sizeof(float)));
    check_same("adamw_update 4 tensors: params_x as version 1", v2_bits[1], download_bytes(d_px, n * sizeof(floatX)));
    check_same("adamw_update 4 tensors: m as version 1", v2_bits[2], download_bytes(d_m1, n_state * sizeof(float)));
    check_same("adamw_update 4 tensors: v as version 1", v2_bits[3], download_bytes(d_v1, n_state * sizeof(float)));
    adamw_plan_free(&plan);
    void* v1_buffers[] = {d_p1, d_m1, d_v1};
    for (void* b : v1_buffers) { cudaCheck(cudaFree(b)); }

    const size_t ng = 1234567;
    Vec grads;
    float* d_grads = random_f(ng, 1.0, grads);
    float* d_norm = (float*)cuda_malloc_or_die(sizeof(float), "norm");
    float* d_scratch = (float*)cuda_malloc_or_die(global_norm_scratch_bytes(), "scratch");
    double sum = 0.0;
    for (size_t i = 0; i < ng; i++) { sum += grads[i] * grads[i]; }
    global_norm_squared(d_norm, d_scratch, d_grads, ng, stream);
    check("global_norm_squared n=1234567", download_f(d_norm, 1), Vec(1, sum));
    const std::vector<unsigned char> run1 = download_bytes(d_norm, sizeof(float));
    global_norm_squared(d_norm, d_scratch, d_grads, ng, stream);
    check_same("global_norm_squared n=1234567: rerun", run1, download_bytes(d_norm, sizeof(float)));

    copy_to_floatX(d_px, d_grads, n, stream);
    check("copy_to_floatX n=104200", download_x(d_px, n), Vec(grads.begin(), grads.begin() + n));

    void* buffers[] = {d_p, d_g, d_m, d_v, d_px, d_grads, d_norm, d_scratch};
    for (void* p_ : buffers) { cudaCheck(cudaFree(p_)); }
}

// ----------------------------------------------------------------------------------------------------------
// timing

// fills x[i] with a hash of i in [-scale, scale)
__global__ void fill_kernel(floatX* x, size_t n, float scale, unsigned int seed) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    unsigned int h = (unsigned int)i * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    x[i] = from_float<floatX>(scale * ((float)(h & 0xffffff) / 8388608.0f - 1.0f));
}

static floatX* random_device_x(size_t n, float scale, unsigned int seed) {
    floatX* d = (floatX*)cuda_malloc_or_die(n * sizeof(floatX), "a timing buffer");
    fill_kernel<<<(unsigned int)ceil_div_z(n, 256), 256, 0, stream>>>(d, n, scale, seed);
    cudaCheckLaunch();
    return d;
}

// mean milliseconds of fn() over `reps` calls after 2 warm-up calls
template <typename Fn>
static float time_ms(Fn fn, int reps) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    fn();
    fn();
    cudaCheck(cudaEventRecord(start, stream));
    for (int i = 0; i < reps; i++) { fn(); }
    cudaCheck(cudaEventRecord(stop, stream));
    cudaCheck(cudaEventSynchronize(stop));
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, start, stop));
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    return ms / reps;
}

static void time_matmuls(void) {
    const int N = 16384, C = 768, OC = 3072, Vp = 50304;
    floatX* inp = random_device_x((size_t)N * C, 1.0f, 1);
    floatX* w = random_device_x((size_t)Vp * C, 0.03f, 2);
    floatX* bias = random_device_x(OC, 0.1f, 3);
    floatX* out = (floatX*)cuda_malloc_or_die((size_t)N * Vp * sizeof(floatX), "out");
    floatX* pre = (floatX*)cuda_malloc_or_die((size_t)N * OC * sizeof(floatX), "pre");
    floatX* dout = random_device_x((size_t)N * OC, 1.0f, 4);
    floatX* dinp = (floatX*)cuda_malloc_or_die((size_t)N * C * sizeof(floatX), "dinp");
    float* dw = (float*)cuda_malloc_or_die((size_t)OC * C * sizeof(float), "dw");
    float* db = (float*)cuda_malloc_or_die(OC * sizeof(float), "db");
    float* scratch = (float*)cuda_malloc_or_die(matmul_backward_scratch_bytes(N, OC), "scratch");
    cudaCheck(cudaMemset(dw, 0, (size_t)OC * C * sizeof(float)));
    cudaCheck(cudaMemset(db, 0, OC * sizeof(float)));

    float ms = time_ms([&] { matmul_forward(out, inp, w, bias, N, C, OC, pre, stream); }, 20);
    printf("timing matmul_forward N=%d C=%d OC=%d bias+GELU (%s): %.3f ms, %.1f TFLOP/s\n", N, C, OC,
           matmul_fuse_gelu ? "fused" : "separate kernel", ms, 2.0 * N * C * OC / (ms * 1e-3) / 1e12);
    ms = time_ms([&] { matmul_forward(out, inp, w, bias, N, C, OC, NULL, stream); }, 20);
    printf("timing matmul_forward N=%d C=%d OC=%d bias: %.3f ms, %.1f TFLOP/s\n", N, C, OC, ms,
           2.0 * N * C * OC / (ms * 1e-3) / 1e12);
    ms = time_ms([&] { matmul_forward(out, inp, w, NULL, N, C, Vp, NULL, stream); }, 10);
    printf("timing matmul_forward N=%d C=%d OC=%d (LM head): %.3f ms, %.1f TFLOP/s\n", N, C, Vp, ms,
           2.0 * N * C * Vp / (ms * 1e-3) / 1e12);
    ms = time_ms([&] { matmul_backward(dinp, dw, db, scratch, dout, inp, w, N, C, OC, 0, stream); }, 20);
    printf("timing matmul_backward N=%d C=%d OC=%d (dinp, dweight, dbias): %.3f ms, %.1f TFLOP/s\n", N, C, OC, ms,
           4.0 * N * C * OC / (ms * 1e-3) / 1e12);
    // the MLP's fcproj backward: dinp [N, OC] = (dout [N, C] fcprojw [C, OC]) * GELU'(pre), both ways
    const int saved_fuse = matmul_fuse_gelu;
    for (int fused = 0; fused <= 1; fused++) {
        matmul_fuse_gelu = fused;
        ms = time_ms([&] { matmul_backward_gelu(dout, NULL, NULL, NULL, inp, NULL, w, pre, N, OC, C, stream); }, 20);
        printf("timing matmul_backward_gelu N=%d C=%d OC=%d (dinp with GELU', %s): %.3f ms, %.1f TFLOP/s\n", N, OC, C,
               matmul_fuse_gelu ? "DGELU epilogue" : "separate kernel", ms, 2.0 * N * C * OC / (ms * 1e-3) / 1e12);
    }
    matmul_fuse_gelu = saved_fuse;

    void* buffers[] = {inp, w, bias, out, pre, dout, dinp, dw, db, scratch};
    for (void* p : buffers) { cudaCheck(cudaFree(p)); }
}

static void time_norm_encoder(void) {
    // norm_backward at the GPT-2 124M shape; traffic counted: read dout and inp, read and write dinp
    const int N = 16384, C = 768;
    floatX* dout = random_device_x((size_t)N * C, 1.0f, 6);
    floatX* inp = random_device_x((size_t)N * C, 1.0f, 7);
    floatX* dinp = random_device_x((size_t)N * C, 1.0f, 8);
    float* w = (float*)cuda_malloc_or_die(C * sizeof(float), "w");
    float* dw = (float*)cuda_malloc_or_die(C * sizeof(float), "dw");
    float* db = (float*)cuda_malloc_or_die(C * sizeof(float), "db");
    float* mean = (float*)cuda_malloc_or_die(N * sizeof(float), "mean");
    float* rstd = (float*)cuda_malloc_or_die(N * sizeof(float), "rstd");
    float* scratch = (float*)cuda_malloc_or_die(norm_backward_scratch_bytes(N, C), "scratch");
    cudaCheck(cudaMemset(w, 0, C * sizeof(float)));
    cudaCheck(cudaMemset(dw, 0, C * sizeof(float)));
    cudaCheck(cudaMemset(db, 0, C * sizeof(float)));
    cudaCheck(cudaMemset(mean, 0, N * sizeof(float)));
    cudaCheck(cudaMemset(rstd, 0, N * sizeof(float)));
    const double norm_bytes = 4.0 * N * C * sizeof(floatX);
    for (int kind = NORM_LAYERNORM; kind <= NORM_RMSNORM; kind++) {
        const float ms = time_ms([&] { norm_backward(kind, dinp, dw, db, scratch, dout, inp, w, mean, rstd, N, C,
                                                     stream); }, 20);
        printf("timing norm_backward %s N=%d C=%d: %.3f ms, %.0f GB/s (read dout, inp; read + write dinp)\n",
               kind == NORM_LAYERNORM ? "layernorm" : "rmsnorm", N, C, ms, norm_bytes / (ms * 1e-3) / 1e9);
    }

    // encoder_backward at B=16, T=1024, C=768, V=50304, uniformly random tokens (on the device, as the forward left
    // them), with dwpe; traffic counted: read dout, read + write the touched dwte rows and dwpe
    const int B = 16, T = 1024, V = 50304, BT = B * T;
    std::vector<int> tokens(BT);
    std::vector<char> seen(V, 0);
    int distinct = 0;
    for (int i = 0; i < BT; i++) {
        tokens[i] = (int)(0.5 * (rand_uniform() + 1.0) * V) % V;
        if (!seen[tokens[i]]) { seen[tokens[i]] = 1; distinct++; }
    }
    floatX* edout = random_device_x((size_t)BT * C, 1.0f, 9);
    float* dwte = (float*)cuda_malloc_or_die((size_t)V * C * sizeof(float), "dwte");
    float* dwpe = (float*)cuda_malloc_or_die((size_t)T * C * sizeof(float), "dwpe");
    void* escratch = cuda_malloc_or_die(encoder_backward_scratch_bytes(B, T, C), "scratch");
    cudaCheck(cudaMemset(dwte, 0, (size_t)V * C * sizeof(float)));
    cudaCheck(cudaMemset(dwpe, 0, (size_t)T * C * sizeof(float)));
    int* d_tokens = (int*)cuda_malloc_or_die(BT * sizeof(int), "tokens");
    cudaCheck(cudaMemcpy(d_tokens, tokens.data(), BT * sizeof(int), cudaMemcpyHostToDevice));
    const float ms = time_ms([&] { encoder_backward(dwte, dwpe, escratch, edout, d_tokens, V, B, T, C, stream); }, 20);
    const double enc_bytes = (double)BT * C * sizeof(floatX) + 2.0 * ((double)distinct + T) * C * sizeof(float);
    printf("timing encoder_backward B=%d T=%d C=%d V=%d (random tokens, %d distinct): %.3f ms, %.0f GB/s (read dout, "
           "read + write touched dwte rows and dwpe)\n", B, T, C, V, distinct, ms, enc_bytes / (ms * 1e-3) / 1e9);

    void* buffers[] = {dout, inp, dinp, w, dw, db, mean, rstd, scratch, edout, dwte, dwpe, escratch, d_tokens};
    for (void* p : buffers) { cudaCheck(cudaFree(p)); }
}

static void time_classifier(void) {
    const int BT = 16384, V = 50257, Vp = 50304;
    floatX* logits = random_device_x((size_t)BT * Vp, 4.0f, 5);
    std::vector<int> targets(BT);
    for (int i = 0; i < BT; i++) { targets[i] = (i * 7919) % V; }
    int* d_targets = (int*)cuda_malloc_or_die(BT * sizeof(int), "targets");
    cudaCheck(cudaMemcpy(d_targets, targets.data(), BT * sizeof(int), cudaMemcpyHostToDevice));
    float* losses = (float*)cuda_malloc_or_die(BT * sizeof(float), "losses");
    const float ms1 = time_ms([&] { fused_classifier_v1(logits, losses, d_targets, 1.0f / BT, BT, V, Vp, 1); }, 10);
    const float ms2 = time_ms([&] { fused_classifier(logits, losses, d_targets, 1.0f / BT, BT, V, Vp, 1, stream); }, 10);
    // the kernel reads each row twice (the second read mostly from L2) and writes it once; counted here: one read
    // and one write of the logits, the traffic to memory that cannot be avoided
    const double bytes = 2.0 * BT * Vp * sizeof(floatX);
    printf("timing fused_classifier BT=%d V=%d Vp=%d: version 1 %.3f ms (%.0f GB/s), version 2 %.3f ms (%.0f GB/s) "
           "(one read + one write of the logits)\n", BT, V, Vp, ms1, bytes / (ms1 * 1e-3) / 1e9, ms2,
           bytes / (ms2 * 1e-3) / 1e9);
    cudaCheck(cudaFree(logits));
    cudaCheck(cudaFree(d_targets));
    cudaCheck(cudaFree(losses));
}

// AdamW over GPT-2 124M's tensors (the device layout's 256-byte alignment): the padded embeddings, then per layer
// the LayerNorms, attention and MLP weights and biases, then the final LayerNorm
static void time_adamw(void) {
    const int L = 12, C = 768, Vp = 50304, Tmax = 1024;
    const size_t C2 = (size_t)C * C;
    // ln1 w, b; qkv w, b; attention proj w, b; ln2 w, b; fc w, b; fcproj w, b
    const size_t layer_sizes[12] = {(size_t)C, (size_t)C, 3 * C2, (size_t)3 * C, C2, (size_t)C,
                                    (size_t)C, (size_t)C, 4 * C2, (size_t)4 * C, 4 * C2, (size_t)C};
    std::vector<AdamWSpan> spans;
    size_t offset = 0;
    auto add = [&](size_t n, int decay) {
        spans.push_back({offset, offset, n, 1.0f, decay, 0});
        offset += ceil_div_z(n, 64) * 64;
    };
    add((size_t)Vp * C, 0);
    add((size_t)Tmax * C, 0);
    for (int l = 0; l < L; l++) {
        for (int k = 0; k < 12; k++) { add(layer_sizes[k], k == 2 || k == 4 || k == 8 || k == 10); }
    }
    add(C, 0);
    add(C, 0);
    const size_t n = offset;
    float* buf[4];
    for (int i = 0; i < 4; i++) {
        buf[i] = (float*)cuda_malloc_or_die(n * sizeof(float), "an AdamW timing buffer");
        cudaCheck(cudaMemset(buf[i], 0, n * sizeof(float)));
    }
    floatX* px = (floatX*)cuda_malloc_or_die(n * sizeof(floatX), "params_x");
    AdamWPlan plan;
    adamw_plan_build(&plan, spans.data(), (int)spans.size());
    // read: params, grads, m, v; written: params, m, v, params_x
    const double bytes = (double)n * (7 * sizeof(float) + sizeof(floatX));
    const float ms1 = time_ms([&] {
        adamw_v1_update(spans.data(), (int)spans.size(), buf[0], px, buf[1], buf[2], buf[3], 1e-3f, 0.9f, 0.95f, 1e-8f,
                        0.1f, 1.0f, 0.5f, 0.5f);
    }, 20);
    const float ms2 = time_ms([&] {
        adamw_update(&plan, buf[0], px, buf[1], buf[2], buf[3], 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 0.5f, 0.5f,
                     stream);
    }, 20);
    printf("timing adamw_update %zu tensors, %.1fM floats: version 1 %.3f ms (%.0f GB/s), version 2 %.3f ms "
           "(%.0f GB/s)\n", spans.size(), n / 1e6, ms1, bytes / (ms1 * 1e-3) / 1e9, ms2, bytes / (ms2 * 1e-3) / 1e9);
    adamw_plan_free(&plan);
    for (int i = 0; i < 4; i++) { cudaCheck(cudaFree(buf[i])); }
    cudaCheck(cudaFree(px));
}

// ----------------------------------------------------------------------------------------------------------

int main(void) {
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("trunk lab, %s build, %s (%d SMs)\n", PRECISION_NAME, prop.name, prop.multiProcessorCount);
    cudaCheck(cudaStreamCreate(&stream));
    matmul_setup();

    test_matmul_forward(256, 192, 320, 1, GELU_NONE);
    test_matmul_forward(256, 192, 320, 0, GELU_NONE);
    test_matmul_forward(100, 72, 40, 1, GELU_NONE);
    test_matmul_forward(256, 192, 768, 1, GELU_FUSED);
    test_matmul_forward(256, 192, 768, 0, GELU_FUSED);
    test_matmul_forward(256, 192, 768, 1, GELU_SEPARATE);
    test_matmul_forward(16, 768, 50304, 0, GELU_NONE);
    test_matmul_backward(256, 192, 320, 1, 0);
    test_matmul_backward(256, 192, 320, 1, 1);
    test_matmul_backward(100, 72, 40, 1, 0);
    test_matmul_backward(5000, 64, 96, 1, 1);
    test_matmul_backward(16, 768, 50304, 0, 0);
    test_activations();
    for (int kind = NORM_LAYERNORM; kind <= NORM_RMSNORM; kind++) {
        test_norm(kind, 256, 768);
        test_norm(kind, 37, 100);
        test_norm(kind, 16, 4096);
        test_norm(kind, 5000, 64);
    }
    test_encoder(8, 256, 192, 500, 1);
    test_encoder(4, 64, 768, 50257, 0);
    test_matmul_backward_gelu(256, 192, 320, GELU_FUSED);
    test_matmul_backward_gelu(256, 192, 320, GELU_SEPARATE);
    test_matmul_backward_gelu(100, 72, 40, GELU_FUSED);
    test_classifier(64, 1000, 1024);
    test_classifier(16, 1003, 1024);
    test_classifier(8, 50257, 50304);
    test_classifier(4, 100000, 100096);
    test_adamw();

    printf("%s: %d check(s) failed\n", num_failed ? "FAIL" : "PASS", num_failed);
    time_matmuls();
    time_classifier();
    time_adamw();
    time_norm_encoder();

    matmul_teardown();
    cudaCheck(cudaStreamDestroy(stream));
    return num_failed ? 1 : 0;
}
