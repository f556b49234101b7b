/*
kernels/common.cuh: what every CUDA file of train_kla shares: the activation type floatX, error checks, host ->
device uploads that do not wait for the GPU (PinnedUpload), and a few device helpers.

Mixed precision (issue: "bf16 weights and activations for the matmuls, fp32 master weights and AdamW state,
gradients accumulated in fp32"):
  - PRECISION=BF16 (default) builds with ENABLE_BF16: floatX = __nv_bfloat16. PRECISION=FP32 builds with
    ENABLE_FP32: floatX = float, and every matmul runs in true fp32 (no TF32), for tight parity tests.
  - Parameters: an fp32 master copy (what AdamW updates and what checkpoints hold) and a floatX copy that the
    matmuls read (the same memory in the FP32 build). Kernels other than matmuls read the fp32 master.
  - Parameter gradients are fp32 and are accumulated (+=) across micro-steps.
  - Activations and activation gradients are floatX, except per-token statistics (mean, rstd), losses and the
    recurrent mixers' decay/gate/state arithmetic, which stay fp32 (spec/gdn_kaczmarz.md 5).
  - No floating-point atomics anywhere: every reduction has a fixed order, so a run is bit-for-bit
    reproducible (resume equality depends on it).
*/
#ifndef TRAIN_KLA_KERNELS_COMMON_CUH
#define TRAIN_KLA_KERNELS_COMMON_CUH

#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <initializer_list>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cublasLt.h>
#include <cublas_v2.h>

#include "../utils.h"

#if defined(ENABLE_FP32)
typedef float floatX;
#define PRECISION_NAME "fp32"
#else
#ifndef ENABLE_BF16
#define ENABLE_BF16
#endif
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "bf16"
#endif

// ----------------------------------------------------------------------------------------------------------
// error checks: one line naming the call site, exit 1 (utils.h die)

static inline void cuda_check(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) {
        if (err == cudaErrorMemoryAllocation) {
            die("CUDA out of memory at %s:%d (lower the batch size -b or the sequence length -t, or use -r 1)", file, line);
        }
        die("CUDA error at %s:%d: %s", file, line, cudaGetErrorString(err));
    }
}
#define cudaCheck(err) (cuda_check((err), __FILE__, __LINE__))

static inline void cublas_check(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) { die("cuBLAS error %d at %s:%d", (int)status, file, line); }
}
#define cublasCheck(status) (cublas_check((status), __FILE__, __LINE__))

// check the last kernel launch (cheap; does not synchronise)
#define cudaCheckLaunch() cudaCheck(cudaGetLastError())

// bytes allocated through cuda_malloc_or_die so far (frees are not subtracted: a high-water mark)
static size_t cuda_bytes_allocated = 0;

// cudaMalloc that names what it allocates when memory runs out
static inline void* cuda_malloc_or_die(size_t bytes, const char* what) {
    void* p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes > 0 ? bytes : 1);
    if (err == cudaErrorMemoryAllocation) {
        size_t free_b = 0, total_b = 0;
        cudaGetLastError();
        cudaMemGetInfo(&free_b, &total_b);
        die("out of GPU memory allocating %.2f GiB for %s (%.2f GiB free of %.2f): lower the batch size -b or the "
            "sequence length -t, or recompute activations with -r 1",
            bytes / 1073741824.0, what, free_b / 1073741824.0, total_b / 1073741824.0);
    }
    cudaCheck(err);
    cuda_bytes_allocated += bytes;
    return p;
}

// ----------------------------------------------------------------------------------------------------------
// host -> device copies that do not wait for the GPU. A cudaMemcpyAsync from pageable memory may make the host
// wait for the stream (the driver stages the bytes); from pinned memory it is a DMA the stream runs in its turn.
// Two pinned buffers are used in turn, each refilled only once its previous copy is done (an event per buffer):
// the host then waits only if the GPU is two copies behind it, not in the steady state of a training loop.
//   void* host = pinned_upload_begin(&u, bytes);   fill host[0 .. bytes)
//   pinned_upload_end(&u, dev, bytes, stream);      copy it to dev on the stream
typedef struct {
    void* host[2];            // the pinned buffers (NULL until first used)
    size_t bytes[2];          // their sizes
    cudaEvent_t copied[2];    // recorded after each buffer's last copy
    int turn;                 // the buffer the next upload fills
} PinnedUpload;

// the buffer of the next upload, at least `bytes` long, once its previous copy is done
static void* pinned_upload_begin(PinnedUpload* u, size_t bytes) {
    const int i = u->turn;
    if (u->copied[i] == NULL) { cudaCheck(cudaEventCreateWithFlags(&u->copied[i], cudaEventDisableTiming)); }
    cudaCheck(cudaEventSynchronize(u->copied[i]));
    if (bytes > u->bytes[i]) {
        if (u->host[i] != NULL) { cudaCheck(cudaFreeHost(u->host[i])); }
        cudaCheck(cudaMallocHost(&u->host[i], bytes));
        u->bytes[i] = bytes;
    }
    return u->host[i];
}

// the first `bytes` of the buffer pinned_upload_begin gave -> dev, on the stream; the next upload takes the other buffer
static void pinned_upload_end(PinnedUpload* u, void* dev, size_t bytes, cudaStream_t stream) {
    const int i = u->turn;
    cudaCheck(cudaMemcpyAsync(dev, u->host[i], bytes, cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaEventRecord(u->copied[i], stream));
    u->turn ^= 1;
}

// host[0 .. bytes) -> dev through the next pinned buffer
static void pinned_upload(PinnedUpload* u, void* dev, const void* host, size_t bytes, cudaStream_t stream) {
    memcpy(pinned_upload_begin(u, bytes), host, bytes);
    pinned_upload_end(u, dev, bytes, stream);
}

// waits for the copies in flight, frees the buffers and events; u is then as new (all zero)
static void pinned_upload_free(PinnedUpload* u) {
    for (int i = 0; i < 2; i++) {
        if (u->copied[i] != NULL) {
            cudaCheck(cudaEventSynchronize(u->copied[i]));
            cudaCheck(cudaEventDestroy(u->copied[i]));
        }
        if (u->host[i] != NULL) { cudaCheck(cudaFreeHost(u->host[i])); }
    }
    memset(u, 0, sizeof(*u));
}

static inline int ceil_div(int a, int b) { return (a + b - 1) / b; }
static inline size_t ceil_div_z(size_t a, size_t b) { return (a + b - 1) / b; }

// ----------------------------------------------------------------------------------------------------------
// device helpers

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// N consecutive elements moved as one access of N * sizeof(T) bytes: the memory-bound kernels move 16-byte packs
// (XPACK floatX: 8 bf16 or 4 fp32) where the sizes and the addresses allow, else smaller ones
template <typename T, int N> struct alignas(N * sizeof(T)) Pack {
    T v[N];
};
template <int N> using XPack = Pack<floatX, N>;
#define XPACK ((int)(16 / sizeof(floatX)))
template <int N, typename T> __device__ __forceinline__ Pack<T, N> pack_load(const T* p) {
    return *reinterpret_cast<const Pack<T, N>*>(p);
}
template <int N, typename T> __device__ __forceinline__ void pack_store(T* p, const Pack<T, N>& x) {
    *reinterpret_cast<Pack<T, N>*>(p) = x;
}

// the V floatX at src (one pack, V * sizeof(floatX)-byte aligned) as floats, and V floats rounded into one at dst
template <int V> __device__ __forceinline__ void xpack_to_floats(float* dst, const floatX* src) {
    const XPack<V> x = pack_load<V>(src);
#pragma unroll
    for (int k = 0; k < V; k++) { dst[k] = to_float(x.v[k]); }
}
template <int V> __device__ __forceinline__ void floats_to_xpack(floatX* dst, const float* src) {
    XPack<V> x;
#pragma unroll
    for (int k = 0; k < V; k++) { x.v[k] = from_float<floatX>(src[k]); }
    pack_store(dst, x);
}

// the largest pack (XPACK, .., 2, 1 elements) that divides n and keeps every address in ptrs aligned to it
static inline int xpack_width(size_t n, std::initializer_list<const void*> ptrs) {
    int w = XPACK;
    while (w > 1) {
        bool ok = n % w == 0;
        for (const void* p : ptrs) { ok = ok && (uintptr_t)p % (w * sizeof(floatX)) == 0; }
        if (ok) { break; }
        w /= 2;
    }
    return w;
}

// the pack V of a warp that walks a row of len elements, lane l at V (l + 32 j): xpack_width's, also dividing every
// leading dimension in lds, leaving every lane a pack (32 V <= len), and with fp32 rows among ptrs 4V-byte aligned
static inline int warp_row_pack(int len, std::initializer_list<int> lds, std::initializer_list<const void*> ptrs) {
    int w = xpack_width(len, ptrs);
    const auto fits = [&](int v) {
        bool ok = 32 * v <= len;
        for (int ld : lds) { ok = ok && ld % v == 0; }
        for (const void* p : ptrs) { ok = ok && (uintptr_t)p % (v * sizeof(float)) == 0; }
        return ok;
    };
    while (w > 1 && !fits(w)) { w /= 2; }
    return w;
}

// runs the statement with the compile-time pack width VW = V (8, 4, 2 or 1): a kernel launch templated on it.
// PACK_DISPATCH_UPTO instantiates only the widths up to VMAX (a kernel whose registers bound its width); a wider V
// is an internal error
#define PACK_DISPATCH_WIDTH(V, VMAX, W, ...)                                                   \
    case W: {                                                                                  \
        if constexpr ((VMAX) >= W) { constexpr int VW = W; __VA_ARGS__; }                      \
        else { die("internal: pack width %d above the dispatch's %d", (int)(V), (int)(VMAX)); } \
        break;                                                                                 \
    }
#define PACK_DISPATCH_UPTO(V, VMAX, ...)                      \
    do {                                                      \
        switch (V) {                                          \
            PACK_DISPATCH_WIDTH(V, VMAX, 8, __VA_ARGS__)      \
            PACK_DISPATCH_WIDTH(V, VMAX, 4, __VA_ARGS__)      \
            PACK_DISPATCH_WIDTH(V, VMAX, 2, __VA_ARGS__)      \
            default: { constexpr int VW = 1; __VA_ARGS__; break; } \
        }                                                     \
        cudaCheckLaunch();                                    \
    } while (0)
#define PACK_DISPATCH(V, ...) PACK_DISPATCH_UPTO(V, 8, __VA_ARGS__)

__device__ __forceinline__ float warp_reduce_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) { v += __shfl_xor_sync(0xffffffffu, v, o); }
    return v;
}
__device__ __forceinline__ float warp_reduce_max(float v) {
    for (int o = 16; o > 0; o >>= 1) { v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o)); }
    return v;
}

__device__ __forceinline__ float sigmoidf_dev(float u) { return 1.0f / (1.0f + expf(-u)); }
// softplus with torch's threshold 20 (spec/gdn_kaczmarz.md 1.2 step 6) and its derivative
__device__ __forceinline__ float softplusf_dev(float u) { return u > 20.0f ? u : log1pf(expf(u)); }
__device__ __forceinline__ float dsoftplusf_dev(float u) { return u > 20.0f ? 1.0f : sigmoidf_dev(u); }

#endif // TRAIN_KLA_KERNELS_COMMON_CUH
