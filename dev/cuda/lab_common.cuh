/*
dev/cuda/lab_common.cuh: the host side that the kernel labs share (dev/cuda/<op>.cu): a seeded generator of uniform
inputs, transfers that round the inputs to floatX first (so that a lab's CPU reference sees exactly what the GPU
sees), packing columns, the relative-L2 check, and event timing. Include it after defining TOLERANCE, the lab's
bound on the relative L2 error; `failures` counts the checks that missed it.
*/
#ifndef TRAIN_KLA_DEV_CUDA_LAB_COMMON_CUH
#define TRAIN_KLA_DEV_CUDA_LAB_COMMON_CUH

#include <math.h>
#include <stdint.h>
#include <vector>
#include "../../kernels/common.cuh"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float rand_uniform(float lo, float hi) {   // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    const uint64_t x = rng_state * 0x2545F4914F6CDD1Dull;
    return lo + (hi - lo) * (float)((x >> 40) * (1.0 / 16777216.0));
}
static std::vector<float> random_vector(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) { v[i] = rand_uniform(lo, hi); }
    return v;
}

// copies h to a new device floatX array, first rounding h in place to floatX so that the CPU reference
// sees exactly what the GPU sees
static floatX* upload_floatX(std::vector<float>& h) {
    std::vector<floatX> x(h.size());
    for (size_t i = 0; i < h.size(); i++) {
        x[i] = floatX(h[i]);
        h[i] = (float)x[i];
    }
    floatX* d = (floatX*)cuda_malloc_or_die(h.size() * sizeof(floatX), "lab buffer");
    cudaCheck(cudaMemcpy(d, x.data(), h.size() * sizeof(floatX), cudaMemcpyHostToDevice));
    return d;
}
static float* upload_f32(const std::vector<float>& h) {
    float* d = (float*)cuda_malloc_or_die(h.size() * sizeof(float), "lab buffer");
    cudaCheck(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}
static std::vector<float> download_floatX(const floatX* d, size_t n) {
    std::vector<floatX> x(n);
    cudaCheck(cudaMemcpy(x.data(), d, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    std::vector<float> h(n);
    for (size_t i = 0; i < n; i++) { h[i] = (float)x[i]; }
    return h;
}
static std::vector<float> download_f32(const float* d, size_t n) {
    std::vector<float> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}
// columns [c0, c0 + n) of every row of a [rows, ld] matrix, packed
static std::vector<float> columns(const std::vector<float>& m, int rows, int ld, int c0, int n) {
    std::vector<float> out((size_t)rows * n);
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < n; c++) { out[(size_t)r * n + c] = m[(size_t)r * ld + c0 + c]; }
    }
    return out;
}
static std::vector<double> columns(const std::vector<double>& m, int rows, int ld, int c0, int n) {
    std::vector<double> out((size_t)rows * n);
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < n; c++) { out[(size_t)r * n + c] = m[(size_t)r * ld + c0 + c]; }
    }
    return out;
}

static int failures = 0;

// relative L2 error of gpu against ref; fails on any non-finite gpu value
static void check(const char* what, const std::vector<float>& gpu, const std::vector<double>& ref) {
    if (gpu.size() != ref.size()) { die("check %s: %zu values against %zu", what, gpu.size(), ref.size()); }
    double num = 0.0, den = 0.0;
    size_t nonfinite = 0;
    for (size_t i = 0; i < gpu.size(); i++) {
        if (!isfinite(gpu[i])) { nonfinite++; }
        const double d = gpu[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    const double rel = sqrt(num / (den > 0.0 ? den : 1.0));
    const int ok = nonfinite == 0 && rel <= TOLERANCE;
    printf("  %-34s rel L2 %.3e%s  %s\n", what, rel, nonfinite ? " (non-finite values)" : "", ok ? "PASS" : "FAIL");
    if (!ok) { failures++; }
}

template <typename F>
static float time_ms(int repeats, F launch) {
    launch();   // warm-up
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    cudaCheck(cudaEventRecord(start));
    for (int i = 0; i < repeats; i++) { launch(); }
    cudaCheck(cudaEventRecord(stop));
    cudaCheck(cudaEventSynchronize(stop));
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, start, stop));
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    return ms / repeats;
}

#endif // TRAIN_KLA_DEV_CUDA_LAB_COMMON_CUH
