/*
kernels/adamw.cuh: the optimizer step and the gradient norm. The CPU versions are model_update and
model_grad_norm in train_kla.c.

  adamw_update         AdamW on one tensor (the caller launches it per tensor: learning rate and weight decay
                       differ between tensors), fp32 master weights and moments, then the floatX copy that the
                       matmuls read (round to nearest)
  global_norm_squared  sum of squares of a gradient buffer, deterministic (fixed partition, fixed trees,
                       double partial sums like the CPU version); the caller takes the square root
  copy_to_floatX       fp32 -> floatX (the matmul copy of the weights, e.g. after loading a checkpoint)
*/
#ifndef TRAIN_KLA_KERNELS_ADAMW_CUH
#define TRAIN_KLA_KERNELS_ADAMW_CUH

#include "common.cuh"

#define ADAMW_BLOCK 256
#define GLOBAL_NORM_BLOCKS 1024   // fixed, not a function of the GPU, so the sum's order never changes
#define GLOBAL_NORM_THREADS 256

// one thread per element:
//   g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr (m / bc1 / (sqrt(v / bc2) + eps) + wd p)
__global__ void adamw_kernel(float* params, floatX* params_x, const float* grads, float* m, float* v, size_t n,
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

// params, grads, m, v fp32 [n]; params_x floatX [n] or NULL (FP32 build: the master is the copy);
// bias_correction1/2 = 1 - beta1^t, 1 - beta2^t with t the 1-based update count
static void adamw_update(float* params, floatX* params_x, const float* grads, float* m, float* v, size_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                         float bias_correction1, float bias_correction2, cudaStream_t stream) {
    if (n == 0) { return; }
    adamw_kernel<<<(unsigned int)ceil_div_z(n, ADAMW_BLOCK), ADAMW_BLOCK, 0, stream>>>(
        params, params_x, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, bias_correction1,
        bias_correction2);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// global norm

__device__ __forceinline__ double warp_reduce_sum_double(double v) {
    for (int o = 16; o > 0; o >>= 1) { v += __shfl_xor_sync(0xffffffffu, v, o); }
    return v;
}

// the block's sum of v in a fixed order: warps by shuffles, then the warps' sums in warp 0 (blockDim.x is a
// multiple of 32, at most 1024); the result is valid in thread 0
__device__ double block_reduce_sum_double(double v) {
    __shared__ double warp_sums[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
    v = warp_reduce_sum_double(v);
    if (lane == 0) { warp_sums[warp] = v; }
    __syncthreads();
    v = 0.0;
    if (warp == 0) {
        v = lane < num_warps ? warp_sums[lane] : 0.0;
        v = warp_reduce_sum_double(v);
    }
    return v;
}

// grid GLOBAL_NORM_BLOCKS, block GLOBAL_NORM_THREADS: thread t of block b sums the squares of elements
// b * threads + t + k * (blocks * threads), k = 0, 1, ...; partial[b] = the block's sum
__global__ void global_norm_partial_kernel(double* partial, const float* grads, size_t n) {
    double acc = 0.0;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const double g = grads[i];
        acc += g * g;
    }
    acc = block_reduce_sum_double(acc);
    if (threadIdx.x == 0) { partial[blockIdx.x] = acc; }
}

// one block of GLOBAL_NORM_BLOCKS threads: out[0] = the sum of the partials
__global__ void global_norm_finish_kernel(float* out, const double* partial) {
    const double sum = block_reduce_sum_double(partial[threadIdx.x]);
    if (threadIdx.x == 0) { out[0] = (float)sum; }
}

// scratch needed by global_norm_squared
static size_t global_norm_scratch_bytes(void) { return GLOBAL_NORM_BLOCKS * sizeof(double); }

// out[0] (device, fp32) = sum of grads[i]^2 over n elements; scratch: global_norm_scratch_bytes()
static void global_norm_squared(float* out, float* scratch, const float* grads, size_t n, cudaStream_t stream) {
    double* partial = (double*)scratch;
    global_norm_partial_kernel<<<GLOBAL_NORM_BLOCKS, GLOBAL_NORM_THREADS, 0, stream>>>(partial, grads, n);
    cudaCheckLaunch();
    global_norm_finish_kernel<<<1, GLOBAL_NORM_BLOCKS, 0, stream>>>(out, partial);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------

__global__ void copy_to_floatX_kernel(floatX* dst, const float* src, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { dst[i] = from_float<floatX>(src[i]); }
}

// dst[i] = floatX(src[i]) (round to nearest)
static void copy_to_floatX(floatX* dst, const float* src, size_t n, cudaStream_t stream) {
    if (n == 0) { return; }
    copy_to_floatX_kernel<<<(unsigned int)ceil_div_z(n, ADAMW_BLOCK), ADAMW_BLOCK, 0, stream>>>(dst, src, n);
    cudaCheckLaunch();
}

#endif // TRAIN_KLA_KERNELS_ADAMW_CUH
