/*
Kernel lab for the per-token kernels of the gdn / kaczmarz layer (spec/gdn_kaczmarz.md): the short causal conv
+ SiLU of kernels/shortconv.cuh (forward, backward, decode), and the kernels of kernels/gdn.cuh around the
chunkwise core (token features forward/backward, gated RMSNorm forward/backward, the decode recurrent step).
Every kernel is checked against a CPU reference in double precision; the conv is then timed.

Compile and run from dev/cuda:
nvcc -O3 -arch=sm_90 -std=c++17 shortconv.cu -o shortconv_bin
nvcc -O3 -arch=sm_90 -std=c++17 -DENABLE_FP32 shortconv.cu -o shortconv_fp32_bin
./shortconv_bin 4        (the argument picks the conv version that is checked and timed; default 4)

version 1 is the direct port: the forward runs one thread per output element and loads all W taps from
global memory; the backward makes three passes (dL/d(pre-activation) per element into a buffer, dproj per
element from it, and dconv_w with one thread per tap summing every row in order).
version 2: one thread per channel walks a tile of 64 tokens keeping the conv window in registers (each input
loaded once); the backward writes dpre over dy with per-tile dconv_w partials (that a third kernel sums in a
fixed order), then a second kernel forms dproj from dpre, one thread per element.
version 3: version 2 with the backward in one pass: the thread of a channel also keeps a window of dpre and
writes dproj as it walks (the W-1 tokens after its tile recomputed), so dpre never goes through global memory: dy
and proj are read once and dproj written once.
version 4 is kernels/shortconv.cuh: version 3 with V adjacent channels per thread, each row's V moved as one pack
(up to 16 bytes: 8 bf16 forward; 4 channels backward, where four windows per channel hold the registers): a warp
moves 512 bytes per row instead of 64, with the same per-channel arithmetic in the same order.

Checks: relative L2 error ||gpu - ref|| / ||ref|| per output, against a double reference fed the exact inputs
the GPU sees (floatX inputs are rounded first). Tolerance 1e-5 in the fp32 build: the kernels compute in fp32,
so only fp32 rounding (relative ~1e-7, grown by sums of up to a few thousand terms) separates them from the
reference. 1e-2 in the bf16 build: floatX outputs are rounded to bf16 (8 significant bits, relative error up
to 2^-9 = 2e-3 per element), and the normalised q, k stored in bf16 feed the features backward.
Exit status 1 if any check fails.
*/
#include <math.h>
#include <stdint.h>
#include <algorithm>
#include <vector>
#include "../../kernels/shortconv.cuh"
#include "../../kernels/gdn.cuh"
#include "../../kernels/gated_norm.cuh"

#if defined(ENABLE_FP32)
static const double TOLERANCE = 1e-5;
#else
static const double TOLERANCE = 1e-2;
#endif
#include "lab_common.cuh"   // after TOLERANCE

// ----------------------------------------------------------------------------------------------------------
// version 1 of the conv (see the header comment)

__global__ void shortconv_forward_kernel1(floatX* out, const floatX* proj, int ld_proj, const float* conv_w,
                                          int BT, int T, int D, int W) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * D) { return; }
    const int r = (int)(idx / D), ch = (int)(idx % D), t = r % T;
    float pre = 0.0f;
    for (int j = 0; j < W; j++) {
        const int back = W - 1 - j;
        if (back <= t) { pre += conv_w[ch * W + j] * to_float(proj[(size_t)(r - back) * ld_proj + ch]); }
    }
    out[idx] = from_float<floatX>(shortconv_silu(pre));
}

__global__ void shortconv_dpre_kernel1(float* dpre, const float* dy, const floatX* proj, int ld_proj,
                                       const float* conv_w, int BT, int T, int D, int W) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * D) { return; }
    const int r = (int)(idx / D), ch = (int)(idx % D), t = r % T;
    float pre = 0.0f;
    for (int j = 0; j < W; j++) {
        const int back = W - 1 - j;
        if (back <= t) { pre += conv_w[ch * W + j] * to_float(proj[(size_t)(r - back) * ld_proj + ch]); }
    }
    dpre[idx] = dy[idx] * shortconv_dsilu(pre);
}

__global__ void shortconv_dproj_kernel1(floatX* dproj, int ld_proj, const float* dpre, const float* conv_w,
                                        int BT, int T, int D, int W) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * D) { return; }
    const int r = (int)(idx / D), ch = (int)(idx % D), t = r % T;
    float d = 0.0f;
    for (int j = 0; j < W; j++) {
        const int fwd = W - 1 - j;   // this input is tap j of token t + fwd
        if (t + fwd < T) { d += conv_w[ch * W + j] * dpre[(size_t)(r + fwd) * D + ch]; }
    }
    dproj[(size_t)r * ld_proj + ch] = from_float<floatX>(d);
}

__global__ void shortconv_dw_kernel1(float* dconv_w, const float* dpre, const floatX* proj, int ld_proj,
                                     int BT, int T, int D, int W) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= D * W) { return; }
    const int ch = idx / W, j = idx % W, back = W - 1 - j;
    float acc = 0.0f;
    for (int r = 0; r < BT; r++) {
        if (r % T >= back) { acc += dpre[(size_t)r * D + ch] * to_float(proj[(size_t)(r - back) * ld_proj + ch]); }
    }
    dconv_w[idx] += acc;
}

// ----------------------------------------------------------------------------------------------------------
// version 2 of the conv backward (see the header comment): dpre through global memory (over dy, in place)

// grid (ceil(D / SHORTCONV_BLOCK), ceil(T / SHORTCONV_T_TILE), B): the thread of channel ch walks the tokens of
// its tile in order with the conv window in registers (one new input per token): it recomputes the
// pre-activation, overwrites dy with dpre = dy SiLU'(pre), and sums dpre[t, ch] * in[t - (W-1-j), ch] for every
// tap j into its partial row of dconv_w
template <int W>
__global__ void shortconv_dpre_dw_kernel2(float* __restrict__ dy, float* __restrict__ dw_partial,
                                         const floatX* __restrict__ proj, int ld_proj,
                                         const float* __restrict__ conv_w, int T, int D) {
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= D) { return; }
    const int b = blockIdx.z, tile = blockIdx.y;
    const int t0 = tile * SHORTCONV_T_TILE, t1 = min(t0 + SHORTCONV_T_TILE, T);
    const floatX* in = proj + (size_t)b * T * ld_proj + ch;
    float* d = dy + (size_t)b * T * D + ch;
    float w[W], win[W], acc[W];
    #pragma unroll
    for (int j = 0; j < W; j++) {
        w[j] = conv_w[ch * W + j];
        const int s = t0 - (W - 1) + j;   // win[j] = the input at t - (W-1) + j, for t = t0
        win[j] = s >= 0 ? to_float(in[(size_t)s * ld_proj]) : 0.0f;
        acc[j] = 0.0f;
    }
    for (int t = t0; t < t1; t++) {
        float pre = 0.0f;
        #pragma unroll
        for (int j = 0; j < W; j++) { pre += w[j] * win[j]; }
        const float dpre = d[(size_t)t * D] * shortconv_dsilu(pre);
        d[(size_t)t * D] = dpre;
        #pragma unroll
        for (int j = 0; j < W; j++) { acc[j] += dpre * win[j]; }
        #pragma unroll
        for (int j = 0; j < W - 1; j++) { win[j] = win[j + 1]; }
        win[W - 1] = t + 1 < T ? to_float(in[(size_t)(t + 1) * ld_proj]) : 0.0f;
    }
    float* part = dw_partial + ((size_t)b * gridDim.y + tile) * D * W + (size_t)ch * W;
    #pragma unroll
    for (int j = 0; j < W; j++) { part[j] = acc[j]; }
}

// ----------------------------------------------------------------------------------------------------------
// version 3 of the conv (see the header comment): one channel per thread

// grid (ceil(D / SHORTCONV_BLOCK), ceil(T / SHORTCONV_T_TILE), B), block SHORTCONV_BLOCK
template <int W>
__global__ void shortconv_silu_forward_kernel3(floatX* __restrict__ out, const floatX* __restrict__ proj, int ld_proj,
                                              const float* __restrict__ conv_w, int T, int D) {
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= D) { return; }
    const int b = blockIdx.z;
    const int t0 = blockIdx.y * SHORTCONV_T_TILE;
    const int t1 = min(t0 + SHORTCONV_T_TILE, T);
    const floatX* in = proj + (size_t)b * T * ld_proj + ch;   // input of token s of this sequence: in[s * ld_proj]
    floatX* dst = out + (size_t)b * T * D + ch;

    float w[W];
    #pragma unroll
    for (int j = 0; j < W; j++) { w[j] = conv_w[ch * W + j]; }
    // win[j] = input at token t - (W-1) + j; the first W-1 entries are the halo before the tile
    float win[W];
    #pragma unroll
    for (int j = 0; j < W - 1; j++) {
        const int s = t0 - (W - 1) + j;
        win[j] = s >= 0 ? to_float(in[(size_t)s * ld_proj]) : 0.0f;
    }
    #pragma unroll 4
    for (int t = t0; t < t1; t++) {
        win[W - 1] = to_float(in[(size_t)t * ld_proj]);
        float pre = 0.0f;
        #pragma unroll
        for (int j = 0; j < W; j++) { pre += w[j] * win[j]; }
        dst[(size_t)t * D] = from_float<floatX>(shortconv_silu(pre));
        #pragma unroll
        for (int j = 0; j < W - 1; j++) { win[j] = win[j + 1]; }
    }
}

// grid (ceil(D / SHORTCONV_BLOCK), ceil(T / SHORTCONV_T_TILE), B): the thread of channel ch walks the tokens t of
// its tile and the W-1 after it in order, with a window of inputs and one of dpre in registers: at token t it
// recomputes the pre-activation and dpre[t] (0 past the sequence end), adds dpre[t] * in[t - (W-1-j)] into its
// partial of dconv_w[ch, j] (t in its tile only), and writes dproj[s] = sum_j w[j] dpre[s + W-1-j] for
// s = t - (W-1) (s in its tile only). The W-1 tokens after the tile are the next tile's too, recomputed there, so
// dpre never goes through global memory: one pass reads dy and proj and writes dproj.
template <int W>
__global__ void shortconv_backward_kernel3(floatX* __restrict__ dproj, int ld_proj, float* __restrict__ dw_partial,
                                          const float* __restrict__ dy, const floatX* __restrict__ proj,
                                          const float* __restrict__ conv_w, int T, int D) {
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= D) { return; }
    const int b = blockIdx.z, tile = blockIdx.y;
    const int t0 = tile * SHORTCONV_T_TILE, t1 = min(t0 + SHORTCONV_T_TILE, T);
    const floatX* in = proj + (size_t)b * T * ld_proj + ch;
    const float* d = dy + (size_t)b * T * D + ch;
    floatX* out = dproj + (size_t)b * T * ld_proj + ch;
    float w[W], win[W], dwin[W], acc[W];   // dwin[W-1-j] = dpre[t - j]
    #pragma unroll
    for (int j = 0; j < W; j++) {
        w[j] = conv_w[ch * W + j];
        const int s = t0 - (W - 1) + j;   // win[j] = the input at t - (W-1) + j, for t = t0
        win[j] = s >= 0 ? to_float(in[(size_t)s * ld_proj]) : 0.0f;
        dwin[j] = 0.0f;
        acc[j] = 0.0f;
    }
    for (int t = t0; t < t1 + W - 1; t++) {
        float dpre = 0.0f;
        if (t < T) {
            float pre = 0.0f;
            #pragma unroll
            for (int j = 0; j < W; j++) { pre += w[j] * win[j]; }
            dpre = d[(size_t)t * D] * shortconv_dsilu(pre);
        }
        if (t < t1) {
            #pragma unroll
            for (int j = 0; j < W; j++) { acc[j] += dpre * win[j]; }
        }
        #pragma unroll
        for (int j = 0; j < W - 1; j++) {
            win[j] = win[j + 1];
            dwin[j] = dwin[j + 1];
        }
        win[W - 1] = t + 1 < T ? to_float(in[(size_t)(t + 1) * ld_proj]) : 0.0f;
        dwin[W - 1] = dpre;
        if (t - (W - 1) >= t0) {
            float x = 0.0f;
            #pragma unroll
            for (int j = 0; j < W; j++) { x += w[j] * dwin[W - 1 - j]; }
            out[(size_t)(t - (W - 1)) * ld_proj] = from_float<floatX>(x);
        }
    }
    float* part = dw_partial + ((size_t)b * gridDim.y + tile) * D * W + (size_t)ch * W;
    #pragma unroll
    for (int j = 0; j < W; j++) { part[j] = acc[j]; }
}

static void conv_forward(int version, floatX* out, const floatX* proj, int ld_proj, const float* conv_w,
                         int B, int T, int D, int W) {
    const int block = 256;
    switch (version) {
        case 1:
            shortconv_forward_kernel1<<<(unsigned)ceil_div_z((size_t)B * T * D, block), block>>>(out, proj, ld_proj,
                                                                                              conv_w, B * T, T, D, W);
            cudaCheckLaunch();
            break;
        case 2:
        case 3: {
            const dim3 grid(ceil_div(D, SHORTCONV_BLOCK), ceil_div(T, SHORTCONV_T_TILE), B);
            shortconv_dispatch_w(W, [&](auto w) {
                shortconv_silu_forward_kernel3<decltype(w)::value><<<grid, SHORTCONV_BLOCK>>>(out, proj, ld_proj,
                                                                                             conv_w, T, D);
            });
            cudaCheckLaunch();
            break;
        }
        case 4: shortconv_silu_forward(out, proj, ld_proj, conv_w, B, T, D, W, 0); break;
        default: die("unknown version %d", version);
    }
}

// scratch: conv_scratch_bytes(version, ...)
static size_t conv_scratch_bytes(int version, int B, int T, int D, int W) {
    return version == 1 ? (size_t)B * T * D * sizeof(float) : shortconv_backward_scratch_bytes(B, T, D, W);
}

static void conv_backward(int version, floatX* dproj, int ld_proj, float* dconv_w, float* scratch, float* dy,
                          const floatX* proj, const float* conv_w, int B, int T, int D, int W) {
    const int block = 256;
    const unsigned elem_blocks = (unsigned)ceil_div_z((size_t)B * T * D, block);
    switch (version) {
        case 1:
            shortconv_dpre_kernel1<<<elem_blocks, block>>>(scratch, dy, proj, ld_proj, conv_w, B * T, T, D, W);
            cudaCheckLaunch();
            shortconv_dproj_kernel1<<<elem_blocks, block>>>(dproj, ld_proj, scratch, conv_w, B * T, T, D, W);
            cudaCheckLaunch();
            shortconv_dw_kernel1<<<ceil_div(D * W, block), block>>>(dconv_w, scratch, proj, ld_proj, B * T, T, D, W);
            cudaCheckLaunch();
            break;
        case 2: {
            const dim3 grid(ceil_div(D, SHORTCONV_BLOCK), ceil_div(T, SHORTCONV_T_TILE), B);
            shortconv_dispatch_w(W, [&](auto w) {
                constexpr int WW = decltype(w)::value;
                shortconv_dpre_dw_kernel2<WW><<<grid, SHORTCONV_BLOCK>>>(dy, scratch, proj, ld_proj, conv_w, T, D);
                shortconv_dproj_kernel<WW><<<elem_blocks, block>>>(dproj, ld_proj, dy, conv_w, B * T, T, D);
            });
            cudaCheckLaunch();
            const int rows = B * ceil_div(T, SHORTCONV_T_TILE), cols = D * W;
            shortconv_dw_reduce_kernel<<<ceil_div(cols, 32), dim3(32, SHORTCONV_RED_ROWS)>>>(dconv_w, scratch, rows, cols);
            cudaCheckLaunch();
            break;
        }
        case 3: {
            const dim3 grid(ceil_div(D, SHORTCONV_BLOCK), ceil_div(T, SHORTCONV_T_TILE), B);
            shortconv_dispatch_w(W, [&](auto w) {
                constexpr int WW = decltype(w)::value;
                shortconv_backward_kernel3<WW><<<grid, SHORTCONV_BLOCK>>>(dproj, ld_proj, scratch, dy, proj, conv_w, T, D);
            });
            cudaCheckLaunch();
            const int rows = B * ceil_div(T, SHORTCONV_T_TILE), cols = D * W;
            shortconv_dw_reduce_kernel<<<ceil_div(cols, 32), dim3(32, SHORTCONV_RED_ROWS)>>>(dconv_w, scratch, rows, cols);
            cudaCheckLaunch();
            break;
        }
        case 4: shortconv_silu_backward(dproj, ld_proj, dconv_w, scratch, dy, proj, conv_w, B, T, D, W, 0); break;
        default: die("unknown version %d", version);
    }
}

// every value must still be `sentinel` (columns a kernel must not write)
static void check_untouched(const char* what, const std::vector<float>& gpu, float sentinel) {
    size_t changed = 0;
    for (float v : gpu) { changed += v != sentinel; }
    printf("  %-34s %zu changed  %s\n", what, changed, changed ? "FAIL" : "PASS");
    if (changed) { failures++; }
}

static double silu_d(double u) { return u / (1.0 + exp(-u)); }
static double dsilu_d(double u) {
    const double s = 1.0 / (1.0 + exp(-u));
    return s * (1.0 + u * (1.0 - s));
}
static double sigmoid_d(double u) { return 1.0 / (1.0 + exp(-u)); }
static double softplus_d(double u) { return u > 20.0 ? u : log1p(exp(u)); }

// ----------------------------------------------------------------------------------------------------------
// CPU references in double (spec 1.2 step 2, 1.6)

// pre [B*T, D] = conv pre-activation; out = SiLU(pre)
static void conv_forward_ref(std::vector<double>& pre, std::vector<double>& out, const std::vector<float>& proj,
                             int ld, const std::vector<float>& w, int B, int T, int D, int W) {
    pre.assign((size_t)B * T * D, 0.0);
    out.assign((size_t)B * T * D, 0.0);
    for (int r = 0; r < B * T; r++) {
        const int t = r % T;
        for (int ch = 0; ch < D; ch++) {
            double acc = 0.0;
            for (int j = 0; j < W; j++) {
                const int back = W - 1 - j;
                if (back <= t) { acc += (double)w[ch * W + j] * proj[(size_t)(r - back) * ld + ch]; }
            }
            pre[(size_t)r * D + ch] = acc;
            out[(size_t)r * D + ch] = silu_d(acc);
        }
    }
}

// dproj [B*T, D]; dw += sum of the tap products
static void conv_backward_ref(std::vector<double>& dproj, std::vector<double>& dw, const std::vector<float>& dy,
                              const std::vector<double>& pre, const std::vector<float>& proj, int ld,
                              const std::vector<float>& w, int B, int T, int D, int W) {
    std::vector<double> dpre((size_t)B * T * D);
    for (size_t i = 0; i < dpre.size(); i++) { dpre[i] = dy[i] * dsilu_d(pre[i]); }
    dproj.assign((size_t)B * T * D, 0.0);
    for (int r = 0; r < B * T; r++) {
        const int t = r % T;
        for (int ch = 0; ch < D; ch++) {
            for (int j = 0; j < W; j++) {
                const int fwd = W - 1 - j;
                if (t + fwd < T) { dproj[(size_t)r * D + ch] += w[ch * W + j] * dpre[(size_t)(r + fwd) * D + ch]; }
                if (t >= fwd) { dw[ch * W + j] += dpre[(size_t)r * D + ch] * proj[(size_t)(r - fwd) * ld + ch]; }
            }
        }
    }
}

// ----------------------------------------------------------------------------------------------------------
// the conv checks: forward, backward, decode from scratch and after a prefill

static void check_conv(int version, int B, int T, int H, int dk, int dv, int W) {
    const int D = 2 * H * dk + H * dv, P = D + H * dv + 2 * H, BT = B * T;
    printf("short conv, version %d: B=%d T=%d D=%d (H=%d dk=%d dv=%d) W=%d, proj row stride %d\n",
           version, B, T, D, H, dk, dv, W, P);
    std::vector<float> proj = random_vector((size_t)BT * P, -2.0f, 2.0f);
    std::vector<float> conv_w = random_vector((size_t)D * W, -0.5f, 0.5f);
    std::vector<float> dy = random_vector((size_t)BT * D, -1.0f, 1.0f);
    std::vector<float> dw0 = random_vector((size_t)D * W, -1.0f, 1.0f);
    floatX* d_proj = upload_floatX(proj);
    float* d_w = upload_f32(conv_w);
    float* d_dy = upload_f32(dy);
    float* d_dw = upload_f32(dw0);
    floatX* d_out = (floatX*)cuda_malloc_or_die((size_t)BT * D * sizeof(floatX), "out");
    // dproj starts filled with a sentinel: the columns past D must keep it (exact in bf16)
    const float sentinel = 3.0f;
    std::vector<float> fill((size_t)BT * P, sentinel);
    floatX* d_dproj = upload_floatX(fill);
    float* d_scratch = (float*)cuda_malloc_or_die(conv_scratch_bytes(version, B, T, D, W), "scratch");

    std::vector<double> pre, out_ref, dproj_ref;
    conv_forward_ref(pre, out_ref, proj, P, conv_w, B, T, D, W);
    std::vector<double> dw_ref(dw0.begin(), dw0.end());
    conv_backward_ref(dproj_ref, dw_ref, dy, pre, proj, P, conv_w, B, T, D, W);

    conv_forward(version, d_out, d_proj, P, d_w, B, T, D, W);
    check("forward out", download_floatX(d_out, (size_t)BT * D), out_ref);

    conv_backward(version, d_dproj, P, d_dw, d_scratch, d_dy, d_proj, d_w, B, T, D, W);
    const std::vector<float> dproj_gpu = download_floatX(d_dproj, (size_t)BT * P);
    check("backward dproj", columns(dproj_gpu, BT, P, 0, D), dproj_ref);
    check_untouched("backward dproj columns >= D", columns(dproj_gpu, BT, P, D, P - D), sentinel);
    check("backward dconv_w (accumulated)", download_f32(d_dw, (size_t)D * W), dw_ref);

    // decode token by token from a zero cache; token t of every sequence is proj + t*P with row stride T*P
    float* d_cache = (float*)cuda_malloc_or_die((size_t)B * (W - 1) * D * sizeof(float), "cache");
    floatX* d_step = (floatX*)cuda_malloc_or_die((size_t)B * D * sizeof(floatX), "step out");
    floatX* d_dec = (floatX*)cuda_malloc_or_die((size_t)BT * D * sizeof(floatX), "decode out");
    auto decode_tokens = [&](int t_begin) {
        for (int t = t_begin; t < T; t++) {
            shortconv_silu_decode(d_step, d_cache, d_proj + (size_t)t * P, T * P, d_w, B, D, W, 0);
            cudaCheck(cudaMemcpy2D(d_dec + (size_t)t * D, (size_t)T * D * sizeof(floatX), d_step, D * sizeof(floatX),
                                   D * sizeof(floatX), B, cudaMemcpyDeviceToDevice));
        }
    };
    cudaCheck(cudaMemset(d_cache, 0, (size_t)B * (W - 1) * D * sizeof(float)));
    decode_tokens(0);
    check("decode from an empty cache", download_floatX(d_dec, (size_t)BT * D), out_ref);

    // prefill the first T0 tokens (their own [B*T0, P] buffer), fill the cache, decode the rest
    const int T0 = T / 2 + 1;
    floatX* d_prefix = (floatX*)cuda_malloc_or_die((size_t)B * T0 * P * sizeof(floatX), "prefix");
    for (int b = 0; b < B; b++) {
        cudaCheck(cudaMemcpy(d_prefix + (size_t)b * T0 * P, d_proj + (size_t)b * T * P, (size_t)T0 * P * sizeof(floatX),
                             cudaMemcpyDeviceToDevice));
    }
    shortconv_fill_cache(d_cache, d_prefix, P, B, T0, D, W, 0);
    decode_tokens(T0);
    std::vector<float> dec_gpu = download_floatX(d_dec, (size_t)BT * D);
    std::vector<float> tail_gpu;
    std::vector<double> tail_ref;
    for (int b = 0; b < B; b++) {
        for (int t = T0; t < T; t++) {
            for (int ch = 0; ch < D; ch++) {
                const size_t i = ((size_t)b * T + t) * D + ch;
                tail_gpu.push_back(dec_gpu[i]);
                tail_ref.push_back(out_ref[i]);
            }
        }
    }
    check("decode after a prefill", tail_gpu, tail_ref);

    cudaCheck(cudaFree(d_prefix));
    cudaCheck(cudaFree(d_dec));
    cudaCheck(cudaFree(d_step));
    cudaCheck(cudaFree(d_cache));
    cudaCheck(cudaFree(d_scratch));
    cudaCheck(cudaFree(d_dproj));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_dw));
    cudaCheck(cudaFree(d_dy));
    cudaCheck(cudaFree(d_w));
    cudaCheck(cudaFree(d_proj));
}

// ----------------------------------------------------------------------------------------------------------
// the gdn.cuh checks

struct LayerDims {
    int B, T, H, dk, dv;
    int BT() const { return B * T; }
    int D() const { return 2 * H * dk + H * dv; }
    int HV() const { return H * dv; }
    int P() const { return D() + HV() + 2 * H; }
};

// spec 1.2 steps 4-6 in double from the raw SiLU output qkv_raw
static void features_forward_ref(std::vector<double>& qkv, std::vector<double>& qn, std::vector<double>& kn,
                                 std::vector<double>& beta, std::vector<double>& g, const std::vector<float>& qkv_raw,
                                 const std::vector<float>& proj, const std::vector<float>& b_bias,
                                 const std::vector<float>& A_log, const std::vector<float>& dt_bias, const LayerDims& L,
                                 int kaczmarz, double l2_eps, double kz_eps) {
    const int H = L.H, dk = L.dk, D = L.D(), P = L.P(), HV = L.HV();
    qkv.assign(qkv_raw.begin(), qkv_raw.end());
    qn.assign((size_t)L.BT() * H, 0.0);
    kn = qn;
    beta = qn;
    g = qn;
    for (int r = 0; r < L.BT(); r++) {
        for (int hh = 0; hh < H; hh++) {
            const size_t e = (size_t)r * H + hh;
            double* q = &qkv[(size_t)r * D + hh * dk];
            double* k = &qkv[(size_t)r * D + H * dk + hh * dk];
            double qq = 0.0, kk = 0.0;
            for (int d = 0; d < dk; d++) { qq += q[d] * q[d]; kk += k[d] * k[d]; }
            qn[e] = sqrt(qq + l2_eps);
            for (int d = 0; d < dk; d++) { q[d] /= qn[e]; }
            const double eta = sigmoid_d((double)proj[(size_t)r * P + D + HV + H + hh] + b_bias[hh]);
            if (kaczmarz) {
                kn[e] = kk + kz_eps;
                beta[e] = eta / kn[e];
            } else {
                kn[e] = sqrt(kk + l2_eps);
                for (int d = 0; d < dk; d++) { k[d] /= kn[e]; }
                beta[e] = eta;
            }
            g[e] = -exp((double)A_log[hh]) * softplus_d((double)proj[(size_t)r * P + D + HV + hh] + dt_bias[hh]);
        }
    }
}

// spec 1.6 in double: dqkv (in: core gradients, out: dL/d(SiLU output)), da, db [BT, H], parameter sums added
static void features_backward_ref(std::vector<double>& dqkv, std::vector<double>& da, std::vector<double>& db,
                                  std::vector<double>& dA_log, std::vector<double>& ddt_bias,
                                  std::vector<double>& db_bias, const std::vector<float>& dbeta,
                                  const std::vector<float>& dg, const std::vector<float>& qkv_raw,
                                  const std::vector<float>& proj, const std::vector<float>& b_bias_p,
                                  const std::vector<float>& A_log, const std::vector<float>& dt_bias,
                                  const LayerDims& L, int kaczmarz, double l2_eps, double kz_eps) {
    const int H = L.H, dk = L.dk, D = L.D(), P = L.P(), HV = L.HV();
    da.assign((size_t)L.BT() * H, 0.0);
    db.assign((size_t)L.BT() * H, 0.0);
    // l2 norm backward of u_hat = u / n, n = sqrt(||u||^2 + eps)
    auto l2norm_backward = [&](double* du, const float* u) {
        double uu = 0.0, dot = 0.0;
        for (int d = 0; d < dk; d++) { uu += (double)u[d] * u[d]; }
        const double n = sqrt(uu + l2_eps);
        for (int d = 0; d < dk; d++) { dot += u[d] / n * du[d]; }
        for (int d = 0; d < dk; d++) { du[d] = (du[d] - u[d] / n * dot) / n; }
    };
    for (int r = 0; r < L.BT(); r++) {
        const float* prow = &proj[(size_t)r * P];
        for (int hh = 0; hh < H; hh++) {
            const size_t e = (size_t)r * H + hh;
            const float* q = &qkv_raw[(size_t)r * D + hh * dk];
            const float* k = &qkv_raw[(size_t)r * D + H * dk + hh * dk];
            double* dq = &dqkv[(size_t)r * D + hh * dk];
            double* dkk = &dqkv[(size_t)r * D + H * dk + hh * dk];
            l2norm_backward(dq, q);
            const double eta = sigmoid_d((double)prow[D + HV + H + hh] + b_bias_p[hh]);
            double deta;
            if (kaczmarz) {
                double kk = 0.0;
                for (int d = 0; d < dk; d++) { kk += (double)k[d] * k[d]; }
                const double s2 = kk + kz_eps, beta = eta / s2;
                for (int d = 0; d < dk; d++) { dkk[d] += -2.0 * dbeta[e] * beta / s2 * k[d]; }
                deta = dbeta[e] / s2;
            } else {
                l2norm_backward(dkk, k);
                deta = dbeta[e];
            }
            db[e] = deta * eta * (1.0 - eta);
            const double u = (double)prow[D + HV + hh] + dt_bias[hh];
            const double softplus_grad = u > 20.0 ? 1.0 : sigmoid_d(u);
            da[e] = dg[e] * -exp((double)A_log[hh]) * softplus_grad;
            const double g = -exp((double)A_log[hh]) * softplus_d(u);
            dA_log[hh] += dg[e] * g;
            ddt_bias[hh] += da[e];
            db_bias[hh] += db[e];
        }
    }
}

static void check_features(const LayerDims& L, int kaczmarz) {
    const int BT = L.BT(), H = L.H, dk = L.dk, D = L.D(), P = L.P(), HV = L.HV();
    const float l2_eps = 1e-6f, kz_eps = 1e-6f;
    printf("token features (%s): B=%d T=%d H=%d dk=%d dv=%d\n", kaczmarz ? "kaczmarz" : "gdn", L.B, L.T, H, dk, L.dv);
    // post-SiLU values lie above -0.28; some (row, head) keys are made small (kaczmarz: large beta)
    std::vector<float> qkv_raw = random_vector((size_t)BT * D, -0.25f, 2.0f);
    for (int r = 0; r < BT; r++) {
        for (int hh = 0; hh < H; hh++) {
            if ((r * H + hh) % 7 == 3) {
                for (int d = 0; d < dk; d++) { qkv_raw[(size_t)r * D + H * dk + hh * dk + d] *= 0.05f; }
            }
        }
    }
    std::vector<float> proj = random_vector((size_t)BT * P, -4.0f, 4.0f);
    for (int r = 0; r < BT; r += 13) {   // a + dt_bias above softplus's threshold 20 on some rows
        for (int hh = 0; hh < H; hh++) { proj[(size_t)r * P + D + HV + hh] = 25.0f; }
    }
    std::vector<float> b_bias = random_vector(H, -1.0f, 1.0f), A_log(H), dt_bias(H);
    for (int hh = 0; hh < H; hh++) {
        A_log[hh] = logf(rand_uniform(1.0f, 16.0f));
        const float dt = expf(rand_uniform(logf(1e-3f), logf(1e-1f)));
        dt_bias[hh] = dt + logf(-expm1f(-dt));   // softplus^-1 (spec 1.5)
    }
    floatX* d_qkv = upload_floatX(qkv_raw);
    floatX* d_proj = upload_floatX(proj);
    float* d_b_bias = upload_f32(b_bias);
    float* d_A_log = upload_f32(A_log);
    float* d_dt_bias = upload_f32(dt_bias);
    float* d_stats = (float*)cuda_malloc_or_die((size_t)4 * BT * H * sizeof(float), "stats");
    float *d_qn = d_stats, *d_kn = d_qn + (size_t)BT * H, *d_beta = d_kn + (size_t)BT * H, *d_g = d_beta + (size_t)BT * H;

    std::vector<double> qkv_ref, qn_ref, kn_ref, beta_ref, g_ref;
    features_forward_ref(qkv_ref, qn_ref, kn_ref, beta_ref, g_ref, qkv_raw, proj, b_bias, A_log, dt_bias, L, kaczmarz,
                         l2_eps, kz_eps);
    gdn_features_forward(d_qkv, d_qn, d_kn, d_beta, d_g, d_proj, P, d_b_bias, d_A_log, d_dt_bias, BT, H, dk, L.dv,
                         kaczmarz, l2_eps, kz_eps, 0);
    const std::vector<float> qkv_gpu = download_floatX(d_qkv, (size_t)BT * D);
    check("forward q (normalised)", columns(qkv_gpu, BT, D, 0, H * dk), columns(qkv_ref, BT, D, 0, H * dk));
    check("forward k", columns(qkv_gpu, BT, D, H * dk, H * dk), columns(qkv_ref, BT, D, H * dk, H * dk));
    check("forward v (untouched)", columns(qkv_gpu, BT, D, 2 * H * dk, HV), columns(qkv_ref, BT, D, 2 * H * dk, HV));
    check("forward qn", download_f32(d_qn, (size_t)BT * H), qn_ref);
    check("forward kn", download_f32(d_kn, (size_t)BT * H), kn_ref);
    check("forward beta", download_f32(d_beta, (size_t)BT * H), beta_ref);
    check("forward g", download_f32(d_g, (size_t)BT * H), g_ref);

    // backward, fed what the GPU forward produced (as the trainer does)
    std::vector<float> dqkv = random_vector((size_t)BT * D, -1.0f, 1.0f);
    std::vector<float> dbeta = random_vector((size_t)BT * H, -1.0f, 1.0f);
    std::vector<float> dg = random_vector((size_t)BT * H, -1.0f, 1.0f);
    std::vector<float> dA_log0 = random_vector(H, -1.0f, 1.0f), ddt0 = random_vector(H, -1.0f, 1.0f);
    std::vector<float> dbb0 = random_vector(H, -1.0f, 1.0f);
    float* d_dqkv = upload_f32(dqkv);
    float* d_dbeta = upload_f32(dbeta);
    float* d_dg = upload_f32(dg);
    float* d_dA_log = upload_f32(dA_log0);
    float* d_ddt = upload_f32(ddt0);
    float* d_dbb = upload_f32(dbb0);
    floatX* d_dproj = (floatX*)cuda_malloc_or_die((size_t)BT * P * sizeof(floatX), "dproj");
    cudaCheck(cudaMemset(d_dproj, 0, (size_t)BT * P * sizeof(floatX)));
    float* d_scratch = (float*)cuda_malloc_or_die(gdn_features_backward_scratch_bytes(BT, H), "scratch");

    std::vector<double> dqkv_ref(dqkv.begin(), dqkv.end()), da_ref, db_ref;
    std::vector<double> dA_log_ref(dA_log0.begin(), dA_log0.end()), ddt_ref(ddt0.begin(), ddt0.end());
    std::vector<double> dbb_ref(dbb0.begin(), dbb0.end());
    features_backward_ref(dqkv_ref, da_ref, db_ref, dA_log_ref, ddt_ref, dbb_ref, dbeta, dg, qkv_raw, proj, b_bias,
                          A_log, dt_bias, L, kaczmarz, l2_eps, kz_eps);
    gdn_features_backward(d_dqkv, d_dproj, d_dA_log, d_dbb, d_ddt, d_scratch, d_dbeta, d_dg, d_qkv, d_qn, d_kn, d_beta,
                          d_g, d_proj, P, d_b_bias, d_A_log, d_dt_bias, BT, H, dk, L.dv, kaczmarz, 0);
    const std::vector<float> dqkv_gpu = download_f32(d_dqkv, (size_t)BT * D);
    check("backward dq", columns(dqkv_gpu, BT, D, 0, H * dk), columns(dqkv_ref, BT, D, 0, H * dk));
    check("backward dk", columns(dqkv_gpu, BT, D, H * dk, H * dk), columns(dqkv_ref, BT, D, H * dk, H * dk));
    check("backward dv (untouched)", columns(dqkv_gpu, BT, D, 2 * H * dk, HV), columns(dqkv_ref, BT, D, 2 * H * dk, HV));
    const std::vector<float> dproj_gpu = download_floatX(d_dproj, (size_t)BT * P);
    check("backward da (dproj a columns)", columns(dproj_gpu, BT, P, D + HV, H), da_ref);
    check("backward db (dproj b columns)", columns(dproj_gpu, BT, P, D + HV + H, H), db_ref);
    check_untouched("backward other dproj columns", columns(dproj_gpu, BT, P, 0, D + HV), 0.0f);
    check("backward dA_log (accumulated)", download_f32(d_dA_log, H), dA_log_ref);
    check("backward ddt_bias (accumulated)", download_f32(d_ddt, H), ddt_ref);
    check("backward db_bias (accumulated)", download_f32(d_dbb, H), dbb_ref);

    for (void* p : std::vector<void*>{d_qkv, d_proj, d_b_bias, d_A_log, d_dt_bias, d_stats, d_dqkv, d_dbeta, d_dg,
                                      d_dA_log, d_ddt, d_dbb, d_dproj, d_scratch}) {
        cudaCheck(cudaFree(p));
    }
}

static void check_gated_rmsnorm(const LayerDims& L) {
    const int BT = L.BT(), H = L.H, dv = L.dv, D = L.D(), P = L.P(), HV = L.HV();
    const float eps = 1e-5f;
    printf("gated RMSNorm: B=%d T=%d H=%d dv=%d\n", L.B, L.T, H, dv);
    std::vector<float> o = random_vector((size_t)BT * HV, -1.0f, 1.0f);
    for (size_t i = 0; i < (size_t)BT * H; i += 5) {   // some heads with a small RMS, where eps matters
        for (int c = 0; c < dv; c++) { o[i * dv + c] *= 0.003f; }
    }
    std::vector<float> proj = random_vector((size_t)BT * P, -4.0f, 4.0f);
    std::vector<float> w = random_vector(dv, 0.5f, 1.5f);
    std::vector<float> dy = random_vector((size_t)BT * HV, -1.0f, 1.0f);
    std::vector<float> dw0 = random_vector(dv, -1.0f, 1.0f);
    floatX* d_o = upload_floatX(o);
    floatX* d_proj = upload_floatX(proj);
    float* d_w = upload_f32(w);
    floatX* d_dyo = upload_floatX(dy);   // dL/dy in, dL/do out (in place)
    float* d_dw = upload_f32(dw0);
    floatX* d_y = (floatX*)cuda_malloc_or_die((size_t)BT * HV * sizeof(floatX), "y");
    float* d_rstd = (float*)cuda_malloc_or_die((size_t)BT * H * sizeof(float), "rstd");
    floatX* d_dproj = (floatX*)cuda_malloc_or_die((size_t)BT * P * sizeof(floatX), "dproj");
    cudaCheck(cudaMemset(d_dproj, 0, (size_t)BT * P * sizeof(floatX)));
    float* d_scratch = (float*)cuda_malloc_or_die(gated_rmsnorm_backward_scratch_bytes(BT, H, dv), "scratch");

    std::vector<double> y_ref((size_t)BT * HV), rstd_ref((size_t)BT * H), do_ref((size_t)BT * HV), dz_ref((size_t)BT * HV);
    std::vector<double> dw_ref(dw0.begin(), dw0.end());
    for (int r = 0; r < BT; r++) {
        for (int hh = 0; hh < H; hh++) {
            const size_t off = (size_t)r * HV + hh * dv;
            const float* z = &proj[(size_t)r * P + D + hh * dv];
            double ss = 0.0, m = 0.0;
            for (int i = 0; i < dv; i++) { ss += (double)o[off + i] * o[off + i]; }
            const double rs = 1.0 / sqrt(ss / dv + eps);
            rstd_ref[(size_t)r * H + hh] = rs;
            for (int i = 0; i < dv; i++) {
                const double xh = o[off + i] * rs, s = silu_d(z[i]);
                y_ref[off + i] = xh * w[i] * s;
                dz_ref[off + i] = dy[off + i] * xh * w[i] * dsilu_d(z[i]);
                dw_ref[i] += dy[off + i] * xh * s;
                m += dy[off + i] * w[i] * s * xh;
            }
            m /= dv;
            for (int i = 0; i < dv; i++) {
                const double dxh = dy[off + i] * w[i] * silu_d(z[i]);
                do_ref[off + i] = rs * (dxh - o[off + i] * rs * m);
            }
        }
    }
    gated_rmsnorm_forward(d_y, d_rstd, d_o, d_proj + D, P, d_w, BT, H, dv, eps, 0);
    check("forward y", download_floatX(d_y, (size_t)BT * HV), y_ref);
    check("forward rstd", download_f32(d_rstd, (size_t)BT * H), rstd_ref);
    gated_rmsnorm_backward(d_dyo, d_dproj + D, P, d_dw, d_scratch, d_dyo, d_o, d_proj + D, d_rstd, d_w, BT, H, dv, 0);
    check("backward do (in place on dy)", download_floatX(d_dyo, (size_t)BT * HV), do_ref);
    const std::vector<float> dproj_gpu = download_floatX(d_dproj, (size_t)BT * P);
    check("backward dz (dproj z columns)", columns(dproj_gpu, BT, P, D, HV), dz_ref);
    check_untouched("backward other dproj columns", columns(dproj_gpu, BT, P, 0, D), 0.0f);
    check_untouched("backward dproj a, b columns", columns(dproj_gpu, BT, P, D + HV, 2 * H), 0.0f);
    check("backward dw (accumulated)", download_f32(d_dw, dv), dw_ref);

    for (void* p : std::vector<void*>{d_o, d_proj, d_w, d_dyo, d_dw, d_y, d_rstd, d_dproj, d_scratch}) {
        cudaCheck(cudaFree(p));
    }
}

// a few decode tokens of the recurrence (spec 2.1) from a random state
static void check_recurrent_step(const LayerDims& L) {
    const int B = L.B, H = L.H, dk = L.dk, dv = L.dv, D = L.D(), HV = L.HV();
    const int steps = 3;
    printf("decode recurrent step: B=%d H=%d dk=%d dv=%d, %d tokens\n", B, H, dk, dv, steps);
    std::vector<float> S0 = random_vector((size_t)B * H * dk * dv, -0.3f, 0.3f);
    std::vector<double> S_ref(S0.begin(), S0.end()), o_ref;
    std::vector<float> o_gpu;
    float* d_S = upload_f32(S0);
    floatX* d_o = (floatX*)cuda_malloc_or_die((size_t)B * HV * sizeof(floatX), "o");
    const double scale = 1.0 / sqrt((double)dk);
    for (int step = 0; step < steps; step++) {
        std::vector<float> qkv = random_vector((size_t)B * D, -0.5f, 1.0f);
        std::vector<float> beta = random_vector((size_t)B * H, 0.0f, 1.0f);
        std::vector<float> g = random_vector((size_t)B * H, -2.0f, 0.0f);
        floatX* d_qkv = upload_floatX(qkv);
        float* d_beta = upload_f32(beta);
        float* d_g = upload_f32(g);
        gdn_recurrent_step(d_o, d_S, d_qkv, d_beta, d_g, B, H, dk, dv, 0);
        const std::vector<float> o_step = download_floatX(d_o, (size_t)B * HV);
        o_gpu.insert(o_gpu.end(), o_step.begin(), o_step.end());
        for (int b = 0; b < B; b++) {
            for (int hh = 0; hh < H; hh++) {
                const float* q = &qkv[(size_t)b * D + hh * dk];
                const float* k = &qkv[(size_t)b * D + H * dk + hh * dk];
                const float* v = &qkv[(size_t)b * D + 2 * H * dk + hh * dv];
                double* S = &S_ref[((size_t)b * H + hh) * dk * dv];
                const double alpha = exp((double)g[b * H + hh]);
                for (int j = 0; j < dv; j++) {
                    double kS = 0.0;
                    for (int i = 0; i < dk; i++) { kS += k[i] * S[(size_t)i * dv + j]; }
                    const double u = beta[b * H + hh] * (v[j] - alpha * kS);
                    double qS = 0.0;
                    for (int i = 0; i < dk; i++) {
                        S[(size_t)i * dv + j] = alpha * S[(size_t)i * dv + j] + k[i] * u;
                        qS += q[i] * S[(size_t)i * dv + j];
                    }
                    o_ref.push_back(scale * qS);
                }
            }
        }
        cudaCheck(cudaFree(d_qkv));
        cudaCheck(cudaFree(d_beta));
        cudaCheck(cudaFree(d_g));
    }
    check("o of every token", o_gpu, o_ref);
    check("final state S", download_f32(d_S, (size_t)B * H * dk * dv), S_ref);
    cudaCheck(cudaFree(d_o));
    cudaCheck(cudaFree(d_S));
}

// ----------------------------------------------------------------------------------------------------------
// timing of the conv (chosen version) and of the gdn.cuh kernels

static void benchmark(int version, int B, int T, int H, int dk, int dv, int W) {
    const int D = 2 * H * dk + H * dv, P = D + H * dv + 2 * H, BT = B * T, HV = H * dv;
    const int repeats = 50;
    printf("timing: B=%d T=%d D=%d (H=%d dk=%d dv=%d) W=%d, mean of %d runs\n", B, T, D, H, dk, dv, W, repeats);
    std::vector<float> proj = random_vector((size_t)BT * P, -2.0f, 2.0f);
    std::vector<float> conv_w = random_vector((size_t)D * W, -0.5f, 0.5f);
    std::vector<float> dy = random_vector((size_t)BT * D, -1.0f, 1.0f);
    // fp32 per-token stats (qn | kn | beta | g, then dbeta | dg), parameters (b_bias | A_log | dt_bias | norm w)
    // and their gradients; the values only need to be finite
    const size_t n_stats = (size_t)BT * H, n_par = (size_t)3 * H + dv;
    floatX* d_proj = upload_floatX(proj);
    float* d_w = upload_f32(conv_w);
    float* d_dy = upload_f32(dy);
    float* d_stats = upload_f32(random_vector(6 * n_stats, 0.5f, 1.0f));
    float* d_par = upload_f32(random_vector(n_par, 0.5f, 1.0f));
    float* d_grad = upload_f32(random_vector(n_par, 0.5f, 1.0f));
    float *qn = d_stats, *kn = qn + n_stats, *beta = kn + n_stats, *g = beta + n_stats;
    float *dbeta = g + n_stats, *dg = dbeta + n_stats;
    float *b_bias = d_par, *A_log = b_bias + H, *dt_bias = A_log + H, *norm_w = dt_bias + H;
    float *db_bias = d_grad, *dA_log = db_bias + H, *ddt_bias = dA_log + H, *dnorm_w = ddt_bias + H;
    float* d_dw = (float*)cuda_malloc_or_die((size_t)D * W * sizeof(float), "dw");
    cudaCheck(cudaMemset(d_dw, 0, (size_t)D * W * sizeof(float)));
    floatX* d_out = (floatX*)cuda_malloc_or_die((size_t)BT * D * sizeof(floatX), "out");
    floatX* d_dproj = (floatX*)cuda_malloc_or_die((size_t)BT * P * sizeof(floatX), "dproj");
    floatX* d_o = (floatX*)cuda_malloc_or_die((size_t)BT * HV * sizeof(floatX), "o");
    cudaCheck(cudaMemset(d_o, 0, (size_t)BT * HV * sizeof(floatX)));
    const size_t scratch_bytes = std::max(std::max(conv_scratch_bytes(version, B, T, D, W),
                                                   gdn_features_backward_scratch_bytes(BT, H)),
                                          gated_rmsnorm_backward_scratch_bytes(BT, H, dv));
    float* d_scratch = (float*)cuda_malloc_or_die(scratch_bytes, "scratch");
    const size_t x = sizeof(floatX);
    auto report = [](const char* what, float ms, double bytes) {
        printf("  %-28s %8.4f ms  %7.1f GB/s\n", what, ms, bytes / (ms * 1e-3) / 1e9);
    };

    float ms = time_ms(repeats, [&] { conv_forward(version, d_out, d_proj, P, d_w, B, T, D, W); });
    report("conv forward", ms, (double)BT * D * 2 * x);
    ms = time_ms(repeats, [&] { conv_backward(version, d_dproj, P, d_dw, d_scratch, d_dy, d_proj, d_w, B, T, D, W); });
    report("conv backward", ms, (double)BT * D * (4 + 2 * x));

    // gdn.cuh kernels on the same shapes: d_out plays qkv, d_dy plays dqkv, d_o plays o and dy
    ms = time_ms(repeats, [&] {
        gdn_features_forward(d_out, qn, kn, beta, g, d_proj, P, b_bias, A_log, dt_bias, BT, H, dk, dv, 1, 1e-6f, 1e-6f, 0);
    });
    report("features forward", ms, (double)BT * 2 * H * dk * 2 * x + (double)BT * H * 16);
    ms = time_ms(repeats, [&] {
        gdn_features_backward(d_dy, d_dproj, dA_log, db_bias, ddt_bias, d_scratch, dbeta, dg, d_out, qn, kn, beta, g,
                              d_proj, P, b_bias, A_log, dt_bias, BT, H, dk, dv, 1, 0);
    });
    report("features backward", ms, (double)BT * 2 * H * dk * (8 + x) + (double)BT * H * 32);
    ms = time_ms(repeats, [&] { gated_rmsnorm_forward(d_out, qn, d_o, d_proj + D, P, norm_w, BT, H, dv, 1e-5f, 0); });
    report("gated rmsnorm forward", ms, (double)BT * HV * 3 * x);
    ms = time_ms(repeats, [&] {
        gated_rmsnorm_backward(d_out, d_dproj + D, P, dnorm_w, d_scratch, d_o, d_o, d_proj + D, qn, norm_w, BT, H, dv, 0);
    });
    report("gated rmsnorm backward", ms, (double)BT * HV * 5 * x);

    for (void* p : std::vector<void*>{d_proj, d_w, d_dy, d_stats, d_par, d_grad, d_dw, d_out, d_dproj, d_o, d_scratch}) {
        cudaCheck(cudaFree(p));
    }
}

int main(int argc, char** argv) {
    const int version = argc > 1 ? atoi(argv[1]) : 4;
    if (version < 1 || version > 4) { die("usage: %s [version 1|2|3|4]", argv[0]); }
    printf("precision %s, tolerance %.0e (relative L2)\n", PRECISION_NAME, TOLERANCE);

    const LayerDims small = {2, 80, 2, 16, 24}, large = {4, 1024, 6, 128, 128};
    for (const LayerDims& L : {small, large}) {
        check_conv(version, L.B, L.T, L.H, L.dk, L.dv, 4);
        for (int kaczmarz = 0; kaczmarz <= 1; kaczmarz++) { check_features(L, kaczmarz); }
        check_gated_rmsnorm(L);
        check_recurrent_step(L);
    }
    check_conv(version, 2, 80, 2, 16, 24, 3);   // another window length (the kernels are templated on W)

    benchmark(version, 16, 1024, 6, 128, 128, 4);

    if (failures) {
        printf("FAIL: %d check(s) failed\n", failures);
        return 1;
    }
    printf("all checks PASS\n");
    return 0;
}
