// dev/emu/emu.h: a CPU emulator of the CUDA execution model, for kernel headers that dev/emu/transform.py has turned
// into host C++ (compile the result with nvcc as host code, -std=c++20). One std::thread per CUDA thread; the CTAs of a
// launch run one after another, so the function-static __shared__ arrays are the CTA's; __syncthreads is a std::barrier
// of the CTA's threads; a warp shuffle writes every lane's value to the warp's buffer and reads its partner's between
// two barriers of the warp; __syncwarp is a barrier of the warp. Dynamic shared memory is filled with NaN before every
// CTA, so a read of an unwritten element shows in the results. Only 1-D blocks; the runtime calls the kernels' host
// code makes (cudaFuncSetAttribute, cudaDeviceGetAttribute, cudaGetDevice, cudaMemcpyFromSymbol) are answered here.
// kernels/mma.cuh's warp-wide instructions are emulated the same way: ldmatrix (each lane's row address through the
// warp's buffer, then the PTX fragment layout), mma.sync m16n8k16 (every lane's fragments through the buffer, then each
// lane's C elements as fp32 sums in k order; the tensor cores' own order and rounding may differ in the last bits) and
// named barriers (one std::barrier per id and CTA, sized by its first arrival); a cp.async copies at once.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <barrier>
#include <thread>
#include <vector>
#include <functional>
#include <cstring>
#include <cmath>
#include <memory>
#include <mutex>

// slot: the shuffles' buffer; addr, frag: ldmatrix's and mma's, double-buffered by the parity of each lane's count
// of those calls (calls), so that one barrier per call suffices: the buffer of call k + 2 is written only after
// every lane has passed call k + 1's barrier, so has read call k's
struct EmuWarp {
    std::unique_ptr<std::barrier<>> bar;
    uint64_t slot[32];
    const void* addr[2][32];
    uint32_t frag[2][32][6];
    unsigned calls[32];
};
struct EmuCta {
    std::unique_ptr<std::barrier<>> bar;
    std::vector<EmuWarp> warps;
    std::mutex named_mutex;
    std::unique_ptr<std::barrier<>> named[16];
};
static thread_local uint3 emu_threadIdx, emu_blockIdx;
static thread_local dim3 emu_blockDim, emu_gridDim;
static thread_local EmuCta* emu_cta;
static std::vector<float> emu_smem(70000);   // dynamic shared memory: 280 KB, above the 227 KB a CTA may opt in to

static float* emu_dynamic_smem() { return emu_smem.data(); }
static void emu_syncthreads() { emu_cta->bar->arrive_and_wait(); }
// every lane of the warp gives v and gets lane src's (the warp shuffles below)
template <typename T> static T emu_lane_value(T v, int src) {
    EmuWarp& W = emu_cta->warps[emu_threadIdx.x / 32];
    uint64_t b = 0; memcpy(&b, &v, sizeof(T));
    W.slot[emu_threadIdx.x % 32] = b;
    W.bar->arrive_and_wait();
    T r; memcpy(&r, &W.slot[src], sizeof(T));
    W.bar->arrive_and_wait();
    return r;
}
template <typename T> static T emu_shfl_xor(T v, int o, int width = 32) {
    const int lane = emu_threadIdx.x % 32, src = lane ^ o;
    return emu_lane_value(v, src / width != lane / width ? lane : src);
}
template <typename T> static T emu_shfl_up(T v, int o) {   // lanes below o keep their own value
    const int lane = emu_threadIdx.x % 32;
    return emu_lane_value(v, lane >= o ? lane - o : lane);
}
template <typename T> static T emu_shfl(T v, int src) { return emu_lane_value(v, src); }   // __shfl_sync, src < 32
static EmuWarp& emu_warp() { return emu_cta->warps[emu_threadIdx.x / 32]; }
static void emu_syncwarp() { emu_warp().bar->arrive_and_wait(); }   // __syncwarp() of all 32 lanes
// bar.sync id, threads
static void emu_named_barrier(int id, int threads) {
    std::barrier<>* b;
    {
        std::lock_guard<std::mutex> lock(emu_cta->named_mutex);
        if (!emu_cta->named[id]) { emu_cta->named[id] = std::make_unique<std::barrier<>>(threads); }
        b = emu_cta->named[id].get();
    }
    b->arrive_and_wait();
}
static uint32_t emu_b16(const void* row, int i) { uint16_t v; memcpy(&v, (const char*)row + 2 * i, 2); return v; }
static float emu_bf16_float(uint32_t bits16) { const uint32_t u = bits16 << 16; float f; memcpy(&f, &u, 4); return f; }
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lanes 8i .. 8i+7 give the row addresses of matrix i; lane l
// receives row l/4, columns 2(l%4), 2(l%4)+1 of matrix i (trans: column l/4, rows 2(l%4), 2(l%4)+1)
static void emu_ldsm_x4(uint32_t r[4], const void* p, bool trans) {
    EmuWarp& W = emu_warp();
    const int lane = emu_threadIdx.x % 32, g = lane / 4, t = lane % 4, buf = W.calls[lane]++ % 2;
    const void** addr = W.addr[buf];
    addr[lane] = p;
    W.bar->arrive_and_wait();
    for (int i = 0; i < 4; i++) {
        const uint32_t lo = trans ? emu_b16(addr[8 * i + 2 * t], g) : emu_b16(addr[8 * i + g], 2 * t);
        const uint32_t hi = trans ? emu_b16(addr[8 * i + 2 * t + 1], g) : emu_b16(addr[8 * i + g], 2 * t + 1);
        r[i] = lo | hi << 16;
    }
}
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, fragments as kernels/mma.cuh's header gives them
static void emu_mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    EmuWarp& W = emu_warp();
    const int lane = emu_threadIdx.x % 32, g = lane / 4, t = lane % 4, buf = W.calls[lane]++ % 2;
    uint32_t (*frag)[6] = W.frag[buf];
    for (int i = 0; i < 4; i++) { frag[lane][i] = a[i]; }
    frag[lane][4] = b0;
    frag[lane][5] = b1;
    W.bar->arrive_and_wait();
    // this lane's rows g, g + 8 of A and columns 2t, 2t + 1 of B, from the lanes that hold them
    float A[2][16], Bm[16][2];
    for (int l = 0; l < 32; l++) {
        const int lg = l / 4, lt = l % 4;
        for (int h = 0; h < 2; h++) {
            if (lg == g) {
                A[0][2 * lt + h] = emu_bf16_float((frag[l][0] >> (16 * h)) & 0xffff);
                A[1][2 * lt + h] = emu_bf16_float((frag[l][1] >> (16 * h)) & 0xffff);
                A[0][2 * lt + 8 + h] = emu_bf16_float((frag[l][2] >> (16 * h)) & 0xffff);
                A[1][2 * lt + 8 + h] = emu_bf16_float((frag[l][3] >> (16 * h)) & 0xffff);
            }
            if (lg / 2 == t) {   // B's column lg is 2t or 2t + 1
                Bm[2 * lt + h][lg % 2] = emu_bf16_float((frag[l][4] >> (16 * h)) & 0xffff);
                Bm[2 * lt + 8 + h][lg % 2] = emu_bf16_float((frag[l][5] >> (16 * h)) & 0xffff);
            }
        }
    }
    for (int i = 0; i < 4; i++) {
        float sum = 0.0f;
        for (int k = 0; k < 16; k++) { sum += A[i / 2][k] * Bm[k][i % 2]; }
        c[i] += sum;
    }
}
// wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16 (or .f16.f16) with A and B in shared memory (kernels/mma.cuh): here a
// descriptor is the operand's host address with its stride byte offset SBO >> 4 in the top 16 bits, the leading
// byte offset being the 128 of kernels/mma.cuh's K-major tiles. Element (r, k) of an operand lies at start + (r / 8)
// SBO + (k / 8) 128 + (r % 8) 16 + (k % 8) 2 bytes (PTX's core matrices without swizzle). Each thread of the
// warpgroup computes its own elements of D (warp w: rows 16 w + g (+ 8), n-tile t: columns 8 t + 2 t4 (+ 1)) at
// once, fp32 sums in k order, so the fences, commits and waits do nothing.
static uint64_t emu_wgmma_desc(const void* start, int sbo) {
    return (uint64_t)(uintptr_t)start | ((uint64_t)(sbo >> 4) << 48);
}
// a 16-bit element as float: bf16, or IEEE half (f16)
static float emu_b16_float(uint32_t bits16, bool f16) {
    if (!f16) { return emu_bf16_float(bits16); }
    __half_raw raw;
    raw.x = (unsigned short)bits16;
    return __half2float(__half(raw));
}
static float emu_wgmma_elem(uint64_t desc, int r, int k, bool f16) {
    const char* start = (const char*)(uintptr_t)(desc & ((1ull << 48) - 1));
    const size_t sbo = (size_t)(desc >> 48) << 4;
    return emu_b16_float(emu_b16(start + (r / 8) * sbo + (k / 8) * 128 + (r % 8) * 16, k % 8), f16);
}
static void emu_wgmma(float* d, int N, uint64_t desc_a, uint64_t desc_b, int accumulate, bool f16) {
    const int t = emu_threadIdx.x % 128, w = t / 32, g = t % 32 / 4, t4 = t % 4;
    for (int nt = 0; nt < N / 8; nt++) {
        for (int i = 0; i < 4; i++) {
            const int r = 16 * w + g + 8 * (i / 2), n = 8 * nt + 2 * t4 + i % 2;
            float sum = 0.0f;
            for (int k = 0; k < 16; k++) { sum += emu_wgmma_elem(desc_a, r, k, f16) * emu_wgmma_elem(desc_b, n, k, f16); }
            d[4 * nt + i] = (accumulate ? d[4 * nt + i] : 0.0f) + sum;
        }
    }
}
// the same with A from registers (wgmma_m64n*k16_rs): warp w's lanes hold rows 16 w .. 16 w + 15 of A as mma.sync's
// A fragments, exchanged within the warp as emu_mma_bf16 does; the lane's elements of D from its rows g, g + 8
static void emu_wgmma_rs(float* d, int N, const uint32_t a[4], uint64_t desc_b, int accumulate, bool f16) {
    EmuWarp& W = emu_warp();
    const int lane = emu_threadIdx.x % 32, g = lane / 4, t4 = lane % 4, buf = W.calls[lane]++ % 2;
    uint32_t (*frag)[6] = W.frag[buf];
    for (int i = 0; i < 4; i++) { frag[lane][i] = a[i]; }
    W.bar->arrive_and_wait();
    float A[2][16];
    for (int lt = 0; lt < 4; lt++) {
        const uint32_t* f = frag[4 * g + lt];
        for (int h = 0; h < 2; h++) {
            A[0][2 * lt + h] = emu_b16_float((f[0] >> (16 * h)) & 0xffff, f16);
            A[1][2 * lt + h] = emu_b16_float((f[1] >> (16 * h)) & 0xffff, f16);
            A[0][2 * lt + 8 + h] = emu_b16_float((f[2] >> (16 * h)) & 0xffff, f16);
            A[1][2 * lt + 8 + h] = emu_b16_float((f[3] >> (16 * h)) & 0xffff, f16);
        }
    }
    for (int nt = 0; nt < N / 8; nt++) {
        for (int i = 0; i < 4; i++) {
            const int n = 8 * nt + 2 * t4 + i % 2;
            float sum = 0.0f;
            for (int k = 0; k < 16; k++) { sum += A[i / 2][k] * emu_wgmma_elem(desc_b, n, k, f16); }
            d[4 * nt + i] = (accumulate ? d[4 * nt + i] : 0.0f) + sum;
        }
    }
}
// cp.async.cg.shared.global [dst], [src], 16, src_bytes: done at once (the zeros too), so commit and wait are no-ops
static void emu_cp_async16(void* dst, const void* src, int src_bytes) {
    memcpy(dst, src, src_bytes);
    memset((char*)dst + src_bytes, 0, 16 - src_bytes);
}
static void emu_launch(dim3 grid, dim3 block, const std::function<void()>& body) {
    if (block.y != 1 || block.z != 1) { fprintf(stderr, "emu: 1-D blocks only\n"); exit(1); }
    for (unsigned bz = 0; bz < grid.z; bz++) for (unsigned by = 0; by < grid.y; by++) for (unsigned bx = 0; bx < grid.x; bx++) {
        for (auto& x : emu_smem) { x = NAN; }
        EmuCta cta;
        cta.bar = std::make_unique<std::barrier<>>(block.x);
        cta.warps.resize((block.x + 31) / 32);
        for (auto& w : cta.warps) {
            w.bar = std::make_unique<std::barrier<>>(32);
            memset(w.calls, 0, sizeof(w.calls));
        }
        std::vector<std::thread> th;
        for (unsigned t = 0; t < block.x; t++) {
            th.emplace_back([&, t]() {
                emu_threadIdx = make_uint3(t, 0, 0); emu_blockIdx = make_uint3(bx, by, bz);
                emu_blockDim = block; emu_gridDim = grid; emu_cta = &cta;
                body();
            });
        }
        for (auto& x : th) { x.join(); }
    }
}
// the checks' measure: sqrt(sum (a - b)^2 / sum b^2) over cnt rows of n columns from off, row stride stride
static double rel(const std::vector<float>& a, const std::vector<float>& b, size_t off, size_t stride, size_t n, size_t cnt) {
    double num = 0, den = 0;
    for (size_t r = 0; r < cnt; r++) for (size_t j = 0; j < n; j++) {
        double x = a[r * stride + off + j], y = b[r * stride + off + j];
        num += (x - y) * (x - y); den += y * y;
    }
    return sqrt(num / (den > 0 ? den : 1));
}
static cudaError_t emu_ok(...) { return cudaSuccess; }
static cudaError_t emu_attr(int* v, ...) { *v = 232448; return cudaSuccess; }   // an H100/H200's opt-in shared memory
static cudaError_t emu_device(int* d) { *d = 0; return cudaSuccess; }
#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim
#define __syncthreads() emu_syncthreads()
#define __syncwarp() emu_syncwarp()
#define __shfl_xor_sync(mask, ...) emu_shfl_xor(__VA_ARGS__)
#define __shfl_up_sync(mask, ...) emu_shfl_up(__VA_ARGS__)
#define __shfl_sync(mask, ...) emu_shfl(__VA_ARGS__)
#define __fdividef(a, b) ((a) / (b))   // the approximate division: exact here
#define __expf(x) expf(x)              // the approximate exponential: exact here
#define __umulhi(a, b) ((uint32_t)(((uint64_t)(a) * (uint64_t)(b)) >> 32))   // the high word of the 64-bit product
#define cudaFuncSetAttribute(...) emu_ok(__VA_ARGS__)
#define cudaDeviceGetAttribute(v, ...) emu_attr(v, __VA_ARGS__)
#define cudaGetDevice(d) emu_device(d)
#define cudaMemcpyFromSymbol(dst, symbol, bytes) (memcpy(dst, &(symbol), bytes), cudaSuccess)
