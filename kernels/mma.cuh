/*
kernels/mma.cuh: warp-level tensor-core primitives shared by the kernels that keep their tiles in registers
(kernels/attention.cuh's flash attention, kernels/gka.cuh's Chebyshev solve, kernels/gdn_chunk.cuh's state passes):
ldmatrix fragment loads from shared memory and the lane offsets they take, mma.sync m16n8k16 (bf16 inputs, fp32
accumulation), the bf16 packing of fp32 values, named barriers (a part of a CTA waiting for itself), cp.async
(global to shared memory copies in flight while the CTA computes), and Hopper's warpgroup MMA, wgmma (operands read
from shared memory by the tensor cores; gka's solve, its section below).

mma.sync m16n8k16 fragments (lane = 4 * g + t4):
  A (16x16, row-major): a[0] = A[g][2t4..+1], a[1] = A[g+8][2t4..+1], a[2] = A[g][2t4+8..+9], a[3] = A[g+8][2t4+8..+9]
  B (16x8, k x n):      b[0] = B[2t4..+1][g], b[1] = B[2t4+8..+9][g]
  C (16x8, fp32):       c[0..1] = C[g][2t4..+1], c[2..3] = C[g+8][2t4..+1]
so the C fragments of two adjacent n-tiles (cols 0-7 and 8-15) hold exactly the A fragment of the 16x16 block.
Shared-memory tiles of bf16 rows padded by 16 bytes (row stride = 8 mod 64 elements) put the 8 rows that one
ldmatrix phase reads into distinct bank groups.
*/
#ifndef TRAIN_KLA_KERNELS_MMA_CUH
#define TRAIN_KLA_KERNELS_MMA_CUH

#include <stdint.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// the threads of named barrier id (1..15; 0 is __syncthreads') wait for each other; threads a multiple of 32
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads));
}

// four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, r[i] receives matrix i
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// element offsets, in a tile of row stride ld, of the row each lane hands to ldmatrix.x4 for one fragment:
// the A fragment (rows m0 .., columns k0 .., 16 x 16) of A stored [m][k] (ldsm_x4) or stored [k][m] (A = the stored
// tile transposed; ldsm_x4_trans); the B fragments of two n-tiles (k0 .. k0 + 15, n0 .. n0 + 15; r[0..1] the first
// n-tile's b0, b1, r[2..3] the second's) of B stored [k][n] (ldsm_x4_trans) or stored [n][k] (ldsm_x4)
__device__ __forceinline__ int ldsm_a_off(int ld, int m0, int k0, int lane) {
    return (m0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8;
}
__device__ __forceinline__ int ldsm_a_km_off(int ld, int m0, int k0, int lane) {
    return (k0 + (lane & 7) + (lane >> 4) * 8) * ld + m0 + ((lane >> 3) & 1) * 8;
}
__device__ __forceinline__ int ldsm_b_kn_off(int ld, int k0, int n0, int lane) {
    return (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8;
}
__device__ __forceinline__ int ldsm_b_nk_off(int ld, int k0, int n0, int lane) {
    return (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8;
}

// c += a * b (m16n8k16, bf16 inputs, fp32 accumulation)
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo -> low 16 bits (the lower column)
    return *reinterpret_cast<uint32_t*>(&v);
}

// the A fragment (16 rows x 16 cols kc*16..) of fp32 C fragments c[2kc], c[2kc+1], rounded to bf16
__device__ __forceinline__ void c_frags_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = pack_bf16(c0[0], c0[1]);
    a[1] = pack_bf16(c0[2], c0[3]);
    a[2] = pack_bf16(c1[0], c1[1]);
    a[3] = pack_bf16(c1[2], c1[3]);
}

// 16 bytes from global src to shared dst, asynchronously (cp.async.cg: through L2 only); the last 16 - src_bytes
// bytes are zeros (src_bytes = 0: all zeros, src is not read). A thread's copies are complete after its
// cp_async_wait; other threads see them after a barrier that follows the wait.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
// closes the group of this thread's copies issued since the last commit
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
// waits until at most N of this thread's committed groups (the newest) are still in flight
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- Hopper warpgroup MMA (wgmma.mma_async, sm_90a): the four warps of a warpgroup (128 consecutive threads, the
// first a multiple of 128) compute D[64][N] (+)= A[64][16] B[16][N], bf16 inputs, fp32 accumulation, with A and B
// read by the tensor cores from shared memory through matrix descriptors. D's fragments: warp w of the warpgroup
// holds rows 16 w .. 16 w + 15 as mma.sync's C fragments of the N / 8 n-tiles in order, d[4 t .. 4 t + 3] = n-tile
// t (header). The shared tiles are K-major without swizzling: 8 x 8 "core matrices" (8 rows of 16 contiguous
// bytes, 128 bytes in all), element (r, k) of a tile of kd columns at wgmma_tile_off(r, k, kd); A is stored [m][k],
// B [n][k]. The operation runs asynchronously: shared-memory writes it must see need fence.proxy.async (then a
// barrier), accumulator registers written by other code need wgmma_fence before it, and its results are there
// only after wgmma_commit and wgmma_wait. wgmma exists only in the arch-specific target sm_90a (nvcc -gencode
// arch=compute_90a,code=sm_90a, as the Makefile builds; -arch=sm_90a adds compute_90 PTX): elsewhere WGMMA_ASM
// is a trap, and wgmma_image, 1 only in an sm_90a image, lets the host check what it runs (gka_solve_launch).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA_ASM(...) asm volatile(__VA_ARGS__)
static __device__ int wgmma_image = 1;
#else
#define WGMMA_ASM(...) __trap()
static __device__ int wgmma_image = 0;
#endif

// element offset of (r, k) in a K-major tile of kd columns (kd a multiple of 8): core matrix (r / 8, k / 8), row
// r % 8, column k % 8; the core matrices of a row group follow each other along k
__host__ __device__ __forceinline__ int wgmma_tile_off(int r, int k, int kd) {
    return ((r >> 3) * (kd >> 3) + (k >> 3)) * 64 + (r & 7) * 8 + (k & 7);
}
// the descriptor of rows r0 .. (r0 a multiple of 8) and the 16 columns k0 .. k0 + 15 (k0 a multiple of 16) of such a
// tile at p: start address, leading byte offset 128 (the next core matrix along k), stride byte offset 16 kd (the
// next 8 rows); no swizzle
// (the address passes through an empty volatile asm, so that the compiler makes each descriptor where it is used
// instead of holding every k-step's in registers across a loop)
template <typename E>   // a 16-bit element: __nv_bfloat16 or __half
__device__ __forceinline__ uint64_t wgmma_desc(const E* p, int r0, int k0, int kd) {
    static_assert(sizeof(E) == 2, "wgmma_desc: 16-bit elements");
    uint32_t base = smem_addr(p);
    asm volatile("" : "+r"(base));
    const uint64_t a = base + 2 * wgmma_tile_off(r0, k0, kd);
    return ((a & 0x3ffff) >> 4) | ((uint64_t)(128 >> 4) << 16) | ((uint64_t)((16 * kd) >> 4) << 32);
}
// the descriptor d moved k columns along k (k a multiple of 8): 16 k bytes further, which is k in its start address
// field (16-byte units); the field does not carry into the next (shared addresses are below 256 KB)
__device__ __forceinline__ uint64_t wgmma_desc_advance(uint64_t d, int k) { return d + (uint64_t)k; }
// D (+)= A B (accumulate 0: D = A B) for N = 32 and 64, inputs bf16 or, with F16, fp16 (IEEE half: 11 significand
// bits at the same rate, a smaller range); wgmma_m64k16<N, F16> picks one. The two input types differ only in the
// instruction's type suffix (TYPES); WGMMA_D16 and WGMMA_D32 are the accumulator operands d[0 .. 15], d[0 .. 31].
#define WGMMA_D16                                                                                                  \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),    \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define WGMMA_D32                                                                                                  \
    WGMMA_D16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),         \
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),     \
        "+f"(d[31])
#define WGMMA_SS32(TYPES)                                                                                           \
    WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                         \
              "wgmma.mma_async.sync.aligned.m64n32k16.f32" TYPES " {"                                               \
              "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"                                \
              "}, %16, %17, p, 1, 1, 0, 0;\n}\n"                                                                    \
              : WGMMA_D16                                                                                           \
              : "l"(desc_a), "l"(desc_b), "r"(accumulate))
#define WGMMA_SS64(TYPES)                                                                                           \
    WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                         \
              "wgmma.mma_async.sync.aligned.m64n64k16.f32" TYPES " {"                                               \
              "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                              \
              "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"                      \
              "}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                                                    \
              : WGMMA_D32                                                                                           \
              : "l"(desc_a), "l"(desc_b), "r"(accumulate))
template <bool F16>
__device__ __forceinline__ void wgmma_m64n32k16(float d[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    if constexpr (F16) { WGMMA_SS32(".f16.f16"); } else { WGMMA_SS32(".bf16.bf16"); }
}
template <bool F16>
__device__ __forceinline__ void wgmma_m64n64k16(float d[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    if constexpr (F16) { WGMMA_SS64(".f16.f16"); } else { WGMMA_SS64(".bf16.bf16"); }
}
template <int N, bool F16 = false>
__device__ __forceinline__ void wgmma_m64k16(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate) {
    static_assert(N == 32 || N == 64, "wgmma_m64k16: N is 32 or 64");
    if (N == 32) { wgmma_m64n32k16<F16>(d, desc_a, desc_b, accumulate); }
    if (N == 64) { wgmma_m64n64k16<F16>(d, desc_a, desc_b, accumulate); }
}
// the same with A from registers: warp w of the warpgroup gives rows 16 w .. 16 w + 15 of A as mma.sync's A fragment
// a[4] (the header); the registers must keep their values until a wgmma_wait covers the operation (wgmma_hold_a)
#define WGMMA_RS32(TYPES)                                                                                           \
    WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                         \
              "wgmma.mma_async.sync.aligned.m64n32k16.f32" TYPES " {"                                               \
              "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"                                \
              "}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"                                                      \
              : WGMMA_D16                                                                                           \
              : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
#define WGMMA_RS64(TYPES)                                                                                           \
    WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                         \
              "wgmma.mma_async.sync.aligned.m64n64k16.f32" TYPES " {"                                               \
              "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                              \
              "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"                      \
              "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                                                      \
              : WGMMA_D32                                                                                           \
              : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
template <bool F16>
__device__ __forceinline__ void wgmma_m64n32k16_rs(float d[16], const uint32_t a[4], uint64_t desc_b, int accumulate) {
    if constexpr (F16) { WGMMA_RS32(".f16.f16"); } else { WGMMA_RS32(".bf16.bf16"); }
}
template <bool F16>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float d[32], const uint32_t a[4], uint64_t desc_b, int accumulate) {
    if constexpr (F16) { WGMMA_RS64(".f16.f16"); } else { WGMMA_RS64(".bf16.bf16"); }
}
template <int N, bool F16 = false>
__device__ __forceinline__ void wgmma_m64k16_rs(float* d, const uint32_t a[4], uint64_t desc_b, int accumulate) {
    static_assert(N == 32 || N == 64, "wgmma_m64k16_rs: N is 32 or 64");
    if (N == 32) { wgmma_m64n32k16_rs<F16>(d, a, desc_b, accumulate); }
    if (N == 64) { wgmma_m64n64k16_rs<F16>(d, a, desc_b, accumulate); }
}
// orders this thread's register and shared-memory accesses before the next wgmma_m64n*k16
__device__ __forceinline__ void wgmma_fence() {
    WGMMA_ASM("wgmma.fence.sync.aligned;\n" ::: "memory");
}
// makes this thread's generic-proxy shared-memory writes visible to the tensor cores' (async proxy) reads
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// closes the group of wgmma operations issued since the last commit
__device__ __forceinline__ void wgmma_commit() {
    WGMMA_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// waits until at most N committed groups are in flight; the accumulators of the finished ones may then be read
// (wgmma_hold keeps the compiler from moving their reads above the wait)
template <int N> __device__ __forceinline__ void wgmma_wait() {
    WGMMA_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void wgmma_hold1(float& v) {
    asm volatile("" : "+f"(v)::"memory");
}
template <int R> __device__ __forceinline__ void wgmma_hold(float d[R]) {
    #pragma unroll
    for (int i = 0; i < R; i++) { wgmma_hold1(d[i]); }
}
// keeps register A operands (R words) alive and unchanged up to here: after the wgmma_wait that covers their products
template <int R> __device__ __forceinline__ void wgmma_hold_a(uint32_t* a) {
    #pragma unroll
    for (int i = 0; i < R; i++) { asm volatile("" : "+r"(a[i])::"memory"); }
}

#endif // TRAIN_KLA_KERNELS_MMA_CUH
