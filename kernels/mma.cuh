/*
kernels/mma.cuh: warp-level tensor-core primitives shared by the kernels that keep their tiles in registers
(kernels/attention.cuh's flash attention, kernels/gka.cuh's Chebyshev solve, kernels/gdn_chunk.cuh's state passes):
ldmatrix fragment loads from shared memory and the lane offsets they take, mma.sync m16n8k16 (bf16 inputs, fp32
accumulation), the bf16 packing of fp32 values, named barriers (a part of a CTA waiting for itself), and cp.async
(global to shared memory copies in flight while the CTA computes).

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

#endif // TRAIN_KLA_KERNELS_MMA_CUH
