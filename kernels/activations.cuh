/*
kernels/activations.cuh: the trunk's elementwise layers. The CPU versions are residual_forward,
gelu_forward, gelu_backward, swiglu_forward and swiglu_backward in train_kla.c.

  residual_forward        out = a + b
  gelu_forward            out = GELU(inp), tanh approximation (used when the matmul's GELU epilogue is not)
  gelu_backward_inplace   d = d * GELU'(pre): turns the gradient of the MLP's GELU output into the gradient
                          of its pre-activation (dfch_act -> dfch), in place
  swiglu_forward          out[r, j] = SiLU(gate[r, j]) * up[r, j], rows of inp are [gate (Hm) | up (Hm)]
  swiglu_backward         dinp = (d gate | d up), overwritten

Inputs and outputs are floatX; the math is fp32. One thread per 16-byte pack of elements where the sizes and
addresses allow (XPack, kernels/common.cuh), else per smaller pack; every kernel is a pure map, so the results do not
depend on the launch configuration.
*/
#ifndef TRAIN_KLA_KERNELS_ACTIVATIONS_CUH
#define TRAIN_KLA_KERNELS_ACTIVATIONS_CUH

#include "common.cuh"

#define ACT_BLOCK 256
#define GELU_SQRT_2_OVER_PI 0.7978845608028654f  // sqrt(2 / pi)
#define GELU_CUBIC 0.044715f

// GELU(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)
__device__ __forceinline__ float gelu_tanh(float x) {
    const float u = GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

// GELU'(x) = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
__device__ __forceinline__ float gelu_tanh_derivative(float x) {
    const float u = GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    const float th = tanhf(u);
    const float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC * x * x);
}

// a grid of one thread per V elements
static inline unsigned int act_grid(size_t n, int V) { return (unsigned int)ceil_div_z(n / V, ACT_BLOCK); }

// ----------------------------------------------------------------------------------------------------------
// kernels: one thread per V consecutive elements (one XPack<V> access per operand; V divides n and, for swiglu, Hm)

template <int V> __global__ void residual_forward_kernel(floatX* out, const floatX* a, const floatX* b, size_t n) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (i >= n) { return; }
    const XPack<V> x = pack_load<V>(a + i), y = pack_load<V>(b + i);
    XPack<V> o;
    for (int k = 0; k < V; k++) { o.v[k] = from_float<floatX>(to_float(x.v[k]) + to_float(y.v[k])); }
    pack_store(out + i, o);
}

template <int V> __global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t n) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (i >= n) { return; }
    const XPack<V> x = pack_load<V>(inp + i);
    XPack<V> o;
    for (int k = 0; k < V; k++) { o.v[k] = from_float<floatX>(gelu_tanh(to_float(x.v[k]))); }
    pack_store(out + i, o);
}

template <int V> __global__ void gelu_backward_inplace_kernel(floatX* d, const floatX* pre, size_t n) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (i >= n) { return; }
    const XPack<V> x = pack_load<V>(pre + i);
    XPack<V> g = pack_load<V>(d + i);
    for (int k = 0; k < V; k++) { g.v[k] = from_float<floatX>(to_float(g.v[k]) * gelu_tanh_derivative(to_float(x.v[k]))); }
    pack_store(d + i, g);
}

// elements i .. i + V - 1 = r * Hm + j .. of the output; gate at inp[r * 2Hm + j], up at inp[r * 2Hm + Hm + j]
template <int V> __global__ void swiglu_forward_kernel(floatX* out, const floatX* inp, size_t n, int Hm) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (i >= n) { return; }
    const size_t r = i / Hm, j = i % Hm;
    const XPack<V> g = pack_load<V>(inp + r * 2 * Hm + j), u = pack_load<V>(inp + r * 2 * Hm + Hm + j);
    XPack<V> o;
    for (int k = 0; k < V; k++) {
        const float gate = to_float(g.v[k]);
        o.v[k] = from_float<floatX>(gate * sigmoidf_dev(gate) * to_float(u.v[k]));
    }
    pack_store(out + i, o);
}

// d up = d * SiLU(gate) = d * gate * sigmoid(gate);
// d gate = d * up * SiLU'(gate), SiLU'(u) = sigmoid(u) (1 + u (1 - sigmoid(u)))
template <int V>
__global__ void swiglu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t n, int Hm) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (i >= n) { return; }
    const size_t r = i / Hm, j = i % Hm;
    const XPack<V> g = pack_load<V>(inp + r * 2 * Hm + j), u = pack_load<V>(inp + r * 2 * Hm + Hm + j);
    const XPack<V> d = pack_load<V>(dout + i);
    XPack<V> dg, du;
    for (int k = 0; k < V; k++) {
        const float gate = to_float(g.v[k]), up = to_float(u.v[k]), dk = to_float(d.v[k]), sg = sigmoidf_dev(gate);
        dg.v[k] = from_float<floatX>(dk * up * sg * (1.0f + gate * (1.0f - sg)));
        du.v[k] = from_float<floatX>(dk * gate * sg);
    }
    pack_store(dinp + r * 2 * Hm + j, dg);
    pack_store(dinp + r * 2 * Hm + Hm + j, du);
}

// ----------------------------------------------------------------------------------------------------------
// launchers: the widest pack that n (Hm for swiglu) and the buffers' addresses allow

static void residual_forward(floatX* out, const floatX* a, const floatX* b, size_t n, cudaStream_t stream) {
    if (n == 0) { return; }
    const int V = xpack_width(n, {out, a, b});
    PACK_DISPATCH(V, residual_forward_kernel<VW><<<act_grid(n, VW), ACT_BLOCK, 0, stream>>>(out, a, b, n));
}

static void gelu_forward(floatX* out, const floatX* inp, size_t n, cudaStream_t stream) {
    if (n == 0) { return; }
    const int V = xpack_width(n, {out, inp});
    PACK_DISPATCH(V, gelu_forward_kernel<VW><<<act_grid(n, VW), ACT_BLOCK, 0, stream>>>(out, inp, n));
}

// d = d * GELU'(pre), elementwise (d: the gradient of GELU(pre) in, the gradient of pre out)
static void gelu_backward_inplace(floatX* d, const floatX* pre, size_t n, cudaStream_t stream) {
    if (n == 0) { return; }
    const int V = xpack_width(n, {d, pre});
    PACK_DISPATCH(V, gelu_backward_inplace_kernel<VW><<<act_grid(n, VW), ACT_BLOCK, 0, stream>>>(d, pre, n));
}

// out [N, Hm] from inp [N, 2Hm]
static void swiglu_forward(floatX* out, const floatX* inp, int N, int Hm, cudaStream_t stream) {
    const size_t n = (size_t)N * Hm;
    if (n == 0) { return; }
    const int V = xpack_width(Hm, {out, inp});
    PACK_DISPATCH(V, swiglu_forward_kernel<VW><<<act_grid(n, VW), ACT_BLOCK, 0, stream>>>(out, inp, n, Hm));
}

// dinp [N, 2Hm] = (d gate | d up) from dout [N, Hm], overwritten (not accumulated)
static void swiglu_backward(floatX* dinp, const floatX* inp, const floatX* dout, int N, int Hm, cudaStream_t stream) {
    const size_t n = (size_t)N * Hm;
    if (n == 0) { return; }
    const int V = xpack_width(Hm, {dinp, inp, dout});
    PACK_DISPATCH(V, swiglu_backward_kernel<VW><<<act_grid(n, VW), ACT_BLOCK, 0, stream>>>(dinp, inp, dout, n, Hm));
}

#endif // TRAIN_KLA_KERNELS_ACTIVATIONS_CUH
