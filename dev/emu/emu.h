// dev/emu/emu.h: a CPU emulator of the CUDA execution model, for kernel headers that dev/emu/transform.py has turned
// into host C++ (compile the result with nvcc as host code, -std=c++20). One std::thread per CUDA thread; the CTAs of
// a launch run one after another, so the function-static __shared__ arrays are the CTA's; __syncthreads is a
// std::barrier of the CTA's threads; a warp shuffle writes every lane's value to the warp's buffer and reads its
// partner's between two barriers of the warp. Dynamic shared memory is filled with NaN before every CTA, so a read
// of an unwritten element shows in the results. Only 1-D blocks; the runtime calls the kernels' host code makes
// (cudaFuncSetAttribute, cudaDeviceGetAttribute, cudaGetDevice) are answered here.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <mma.h>
#include <barrier>
#include <thread>
#include <vector>
#include <functional>
#include <cstring>
#include <cmath>
#include <memory>

struct EmuWarp { std::unique_ptr<std::barrier<>> bar; uint64_t slot[32]; };
struct EmuCta {
    std::unique_ptr<std::barrier<>> bar;
    std::vector<EmuWarp> warps;
};
static thread_local uint3 emu_threadIdx, emu_blockIdx;
static thread_local dim3 emu_blockDim, emu_gridDim;
static thread_local EmuCta* emu_cta;
static std::vector<float> emu_smem(70000);   // dynamic shared memory: 280 KB, above the 227 KB a CTA may opt in to

static float* emu_dynamic_smem() { return emu_smem.data(); }
static void emu_syncthreads() { emu_cta->bar->arrive_and_wait(); }
template <typename T> static T emu_shfl_xor(T v, int o, int width = 32) {
    EmuWarp& W = emu_cta->warps[emu_threadIdx.x / 32];
    const int lane = emu_threadIdx.x % 32;
    uint64_t b = 0; memcpy(&b, &v, sizeof(T));
    W.slot[lane] = b;
    W.bar->arrive_and_wait();
    int src = lane ^ o;
    if (src / width != lane / width) { src = lane; }
    T r; memcpy(&r, &W.slot[src], sizeof(T));
    W.bar->arrive_and_wait();
    return r;
}
static void emu_launch(dim3 grid, dim3 block, const std::function<void()>& body) {
    if (block.y != 1 || block.z != 1) { fprintf(stderr, "emu: 1-D blocks only\n"); exit(1); }
    for (unsigned bz = 0; bz < grid.z; bz++) for (unsigned by = 0; by < grid.y; by++) for (unsigned bx = 0; bx < grid.x; bx++) {
        for (auto& x : emu_smem) { x = NAN; }
        EmuCta cta;
        cta.bar = std::make_unique<std::barrier<>>(block.x);
        cta.warps.resize((block.x + 31) / 32);
        for (auto& w : cta.warps) { w.bar = std::make_unique<std::barrier<>>(32); }
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
static cudaError_t emu_ok(...) { return cudaSuccess; }
static cudaError_t emu_attr(int* v, ...) { *v = 232448; return cudaSuccess; }   // an H100/H200's opt-in shared memory
static cudaError_t emu_device(int* d) { *d = 0; return cudaSuccess; }
#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim
#define __syncthreads() emu_syncthreads()
#define __shfl_xor_sync(mask, ...) emu_shfl_xor(__VA_ARGS__)
#define __fdividef(a, b) ((a) / (b))   // the approximate division: exact here
#define __expf(x) expf(x)              // the approximate exponential: exact here
#define cudaFuncSetAttribute(...) emu_ok(__VA_ARGS__)
#define cudaDeviceGetAttribute(v, ...) emu_attr(v, __VA_ARGS__)
#define cudaGetDevice(d) emu_device(d)
