/*
dev/emu/gka_backward.cu: kernels/gka.cuh's chunked backward (spec 5.2 passes 2 and 3, gka_core_backward with
chunked) against its recurrent remainder (the version validated on GPUs), both run from the same forward on the CPU
by dev/emu/emu.h's emulator: the kernels' own code, CUDA-core products (the tensor-core ones need a GPU), fp32 build.
Inputs as dev/cuda/gka_core.cu draws them (unit q_hat, beta-scaled k and v, alpha and log decays, a near-1 decay
stretch over a third of the sequence), B = 1, H = 2.
Tolerance 1e-4 relative L2 per output: the two compute the same sums in other orders in fp32 (measured 2e-6 for dk
and dv, 1.8e-5 for dg, whose reverse scan adds a T-long sum); a wrong term is of the order of the output itself.
Run through dev/emu/run.sh (it transforms the kernels and builds this file). Usage: gka_backward [T dk dv]
(default 150 16 24). Exit status 1 when an output misses the tolerance or holds a NaN (the emulator fills shared
memory with NaN, so a read of an unwritten element shows).
*/
#include "emu.h"
#include "kernels/common.cuh"
#undef cudaCheckLaunch
#define cudaCheckLaunch() do {} while (0)
#include "kernels/gka.cuh"
#include "gka_inputs.h"

int main(int argc, char** argv) {
    const int B = 1, T = argc > 1 ? atoi(argv[1]) : 150, H = 2, dk = argc > 2 ? atoi(argv[2]) : 16, dv = argc > 3 ? atoi(argv[3]) : 24;
    const int iters = 30, NT = gka_chunks(T), DE = 2 * H * dk + H * dv;
    const float ridge = 0.02f;
    GkaInputs in = gka_emu_inputs(B, T, H, dk, dv);
    std::vector<floatX> o((size_t)B * T * H * dv);
    std::vector<float> x((size_t)B * T * H * dk), f((size_t)B * T * H), Hck((size_t)B * H * NT * dk * dk), Uck((size_t)B * H * NT * dk * dv);
    gka_core_forward(o.data(), x.data(), f.data(), Hck.data(), Uck.data(), NULL, NULL, in.qkv.data(), in.alpha.data(), in.g.data(), B, T, H, dk, dv,
                     iters, ridge, GKA_PRODUCTS_FP32, 0);
    std::vector<float> out[2][3];
    for (int chunked = 0; chunked < 2; chunked++) {
        std::vector<float> dqkv((size_t)B * T * DE, NAN), dal((size_t)B * T * H, NAN), dg((size_t)B * T * H, NAN);
        std::vector<float> scratch(gka_core_backward_scratch_floats(B, T, H, dk, dv), NAN);
        gka_core_backward(dqkv.data(), dal.data(), dg.data(), scratch.data(), in.dO.data(), Hck.data(), Uck.data(), NULL, NULL, in.qkv.data(),
                          in.alpha.data(), in.g.data(), x.data(), f.data(), B, T, H, dk, dv, iters, ridge, GKA_PRODUCTS_FP32, chunked == 1, 0);
        out[chunked][0] = dqkv; out[chunked][1] = dal; out[chunked][2] = dg;
    }
    const size_t rows = (size_t)B * T;
    printf("T=%d H=%d dk=%d dv=%d: chunked against recurrent, relative L2\n", T, H, dk, dv);
    const double errs[5] = {rel(out[1][0], out[0][0], 0, DE, H * dk, rows), rel(out[1][0], out[0][0], H * dk, DE, H * dk, rows),
                            rel(out[1][0], out[0][0], 2 * H * dk, DE, H * dv, rows), rel(out[1][1], out[0][1], 0, 1, 1, rows * H),
                            rel(out[1][2], out[0][2], 0, 1, 1, rows * H)};
    printf("  dq %.3e  dk %.3e  dv %.3e  dalpha %.3e  dg %.3e\n", errs[0], errs[1], errs[2], errs[3], errs[4]);
    int ok = 1;
    for (double e : errs) { ok &= e <= 1e-4; }   // a NaN fails the comparison too
    printf("%s chunked backward = recurrent remainder within 1e-4 (T=%d dk=%d dv=%d)\n", ok ? "PASS" : "FAIL", T, dk, dv);
    return ok ? 0 : 1;
}
