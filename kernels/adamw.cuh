/*
kernels/adamw.cuh: the optimizer step and the gradient norm. The CPU versions are model_update and
model_grad_norm in train_kla.c.

  adamw_update         AdamW on every tensor of a plan (AdamWPlan: each tensor's elements, learning-rate scale and
                       weight decay) in one launch, fp32 master weights and moments, then the floatX copy that the
                       matmuls read (round to nearest)
  global_norm_squared  sum of squares of a gradient buffer, deterministic (fixed partition, fixed trees,
                       double partial sums like the CPU version); the caller takes the square root
  copy_to_floatX       fp32 -> floatX (the matmul copy of the weights, e.g. after loading a checkpoint)
*/
#ifndef TRAIN_KLA_KERNELS_ADAMW_CUH
#define TRAIN_KLA_KERNELS_ADAMW_CUH

#include "common.cuh"

#define ADAMW_BLOCK 256
#define ADAMW_UNROLL 4                             // elements per thread, all loaded before any is updated
#define ADAMW_CHUNK (ADAMW_BLOCK * ADAMW_UNROLL)   // elements per block, all of one tensor
#define GLOBAL_NORM_BLOCKS 1024   // fixed, not a function of the GPU, so the sum's order never changes
#define GLOBAL_NORM_THREADS 256

// One tensor's share of an AdamW step: elements [offset, offset + n) of the parameters, gradients and floatX copy,
// [state_offset, state_offset + n) of m and v (they differ when a rank keeps the state of a slice only); its
// learning rate is lr * lr_scale, and weight decay applies when decay is 1.
typedef struct {
    size_t offset, state_offset, n;
    float lr_scale;
    int decay;
    unsigned int first_block;   // the blocks of the spans before it (set by adamw_plan_build)
} AdamWSpan;

// The tensors of one optimizer, on the device: the spans, and for each block of ADAMW_CHUNK elements its span.
typedef struct {
    AdamWSpan* spans;
    unsigned int* block_span;
    int num_spans;
    unsigned int num_blocks;
} AdamWPlan;

// the plan of spans[0..num_spans) (host; their first_block is filled in); adamw_plan_free releases it
static void adamw_plan_build(AdamWPlan* plan, AdamWSpan* spans, int num_spans) {
    unsigned int num_blocks = 0;
    for (int k = 0; k < num_spans; k++) {
        spans[k].first_block = num_blocks;
        const size_t blocks = ceil_div_z(spans[k].n, ADAMW_CHUNK);
        if (num_blocks + blocks > 0x7fffffffu) {
            die("adamw: %zu blocks of %d parameters are too many", num_blocks + blocks, ADAMW_CHUNK);
        }
        num_blocks += (unsigned int)blocks;
    }
    const size_t list_blocks = num_blocks > 0 ? num_blocks : 1, list_spans = num_spans > 0 ? num_spans : 1;
    unsigned int* block_span = (unsigned int*)malloc_or_die(list_blocks * sizeof(unsigned int));
    for (int k = 0; k < num_spans; k++) {
        const unsigned int end = k + 1 < num_spans ? spans[k + 1].first_block : num_blocks;
        for (unsigned int b = spans[k].first_block; b < end; b++) { block_span[b] = (unsigned int)k; }
    }
    plan->num_spans = num_spans;
    plan->num_blocks = num_blocks;
    plan->spans = (AdamWSpan*)cuda_malloc_or_die(list_spans * sizeof(AdamWSpan), "AdamW's tensor list");
    plan->block_span = (unsigned int*)cuda_malloc_or_die(list_blocks * sizeof(unsigned int), "AdamW's block list");
    cudaCheck(cudaMemcpy(plan->spans, spans, (size_t)num_spans * sizeof(AdamWSpan), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(plan->block_span, block_span, (size_t)num_blocks * sizeof(unsigned int),
                         cudaMemcpyHostToDevice));
    free(block_span);
}

static void adamw_plan_free(AdamWPlan* plan) {
    cudaFree(plan->spans);
    cudaFree(plan->block_span);
    plan->spans = NULL;
    plan->block_span = NULL;
    plan->num_spans = 0;
    plan->num_blocks = 0;
}

// grid plan.num_blocks, block ADAMW_BLOCK: block b updates ADAMW_CHUNK elements of its span's tensor, thread t
// the elements t, t + ADAMW_BLOCK, ... of them (coalesced). Per element, with the span's lr and weight decay wd:
//   g = grad * grad_scale;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p -= lr (m / bc1 / (sqrt(v / bc2) + eps) + wd p)
__global__ void __launch_bounds__(ADAMW_BLOCK) adamw_kernel(const AdamWSpan* spans, const unsigned int* block_span,
                                                            float* params, floatX* params_x, const float* grads,
                                                            float* m, float* v, float lr, float beta1, float beta2,
                                                            float eps, float weight_decay, float grad_scale,
                                                            float bias_correction1, float bias_correction2) {
    const AdamWSpan sp = spans[block_span[blockIdx.x]];
    const float span_lr = lr * sp.lr_scale, span_wd = sp.decay ? weight_decay : 0.0f;
    const size_t begin = (size_t)(blockIdx.x - sp.first_block) * ADAMW_CHUNK + threadIdx.x;
    float g[ADAMW_UNROLL], mi[ADAMW_UNROLL], vi[ADAMW_UNROLL], p[ADAMW_UNROLL];
#pragma unroll
    for (int u = 0; u < ADAMW_UNROLL; u++) {
        const size_t j = begin + (size_t)u * ADAMW_BLOCK;
        if (j < sp.n) {
            g[u] = grads[sp.offset + j];
            p[u] = params[sp.offset + j];
            mi[u] = m[sp.state_offset + j];
            vi[u] = v[sp.state_offset + j];
        }
    }
#pragma unroll
    for (int u = 0; u < ADAMW_UNROLL; u++) {
        const size_t j = begin + (size_t)u * ADAMW_BLOCK;
        if (j >= sp.n) { break; }
        const float gu = g[u] * grad_scale;
        const float mu = beta1 * mi[u] + (1.0f - beta1) * gu;
        const float vu = beta2 * vi[u] + (1.0f - beta2) * gu * gu;
        m[sp.state_offset + j] = mu;
        v[sp.state_offset + j] = vu;
        const float mhat = mu / bias_correction1, vhat = vu / bias_correction2;
        float pu = p[u];
        pu -= span_lr * (mhat / (sqrtf(vhat) + eps) + span_wd * pu);
        params[sp.offset + j] = pu;
        if (params_x != NULL) { params_x[sp.offset + j] = from_float<floatX>(pu); }
    }
}

// AdamW on every span of the plan: params, grads fp32 and params_x floatX (or NULL: the FP32 build, where the
// master is the copy) indexed by the spans' offsets, m, v fp32 by their state offsets; bias_correction1/2 =
// 1 - beta1^t, 1 - beta2^t with t the 1-based update count
static void adamw_update(const AdamWPlan* plan, float* params, floatX* params_x, const float* grads, float* m, float* v,
                         float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                         float bias_correction1, float bias_correction2, cudaStream_t stream) {
    if (plan->num_blocks == 0) { return; }
    adamw_kernel<<<plan->num_blocks, ADAMW_BLOCK, 0, stream>>>(plan->spans, plan->block_span, params, params_x, grads,
                                                               m, v, lr, beta1, beta2, eps, weight_decay, grad_scale,
                                                               bias_correction1, bias_correction2);
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
