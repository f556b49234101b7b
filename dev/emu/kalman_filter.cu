/*
dev/emu/kalman_filter.cu: the kalman filter kernels (kernels/kalman_scan.cuh, forward and backward) against the
double-precision reference of dev/cuda/kalman_reference.h, run on the CPU by dev/emu/emu.h's emulator (fp32 build).
Shapes cover the kernels' edges: T not a multiple of the 32-token tile (its last tile ends in the first or the
second half of the backward's two halves), Dk not a multiple of the block's channels, and N below its lane group
(idle lanes). Inputs at a trained layer's scales, as in the lab dev/cuda/kalman_scan.cu: v in [-1, 1], Lv =
1/(softplus(N(0,1)) + 1e-4), unit k and q, abar in [0.905, 0.999], pbar = 0.01 (1 - abar^2) / 2, dys in [-1, 1].
Checks, relative L2 per output: ys, dv, dLv, dk, dq, dabar, dpbar within 1e-5 (fp32 round-off over T <= 150
contracting steps and sums of at most B*T*Dk terms: measured up to 3.1e-6; a wrong or missing term is of the order
of the output), with one segment and with time segments (S = 2 and 5 requested: the segment count changes
nothing beyond round-off; ys also against one segment's, same bound). Decode: the forward run one token at a time
through its carried state (lam_io, eta_io), as the trainer's decode step does, must equal the whole-sequence
forward bit for bit (the same step function and the same butterfly tree for every token of a tile).
Run through dev/emu/run.sh (it transforms the kernels and builds this file). Usage: kalman_filter [B T Dk N]
(default 2 150 20 32). Exit status 1 when a check fails or an output holds a NaN (the emulator fills shared memory
with NaN, so a read of an unwritten element shows).
*/
#include "emu.h"
#include "kernels/common.cuh"
#undef cudaCheckLaunch
#define cudaCheckLaunch() do {} while (0)
#include "kernels/kalman_scan.cuh"
#include "kalman_reference.h"
#include <random>

static const double TOLERANCE = 1e-5;

static int check(const char* what, const std::vector<float>& got, const std::vector<double>& ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) { num += (got[i] - ref[i]) * (got[i] - ref[i]); den += ref[i] * ref[i]; }
    const double e = sqrt(num / (den > 0 ? den : 1));
    const int ok = e <= TOLERANCE;   // a NaN fails the comparison too
    printf("  %-10s rel L2 %.3e  %s\n", what, e, ok ? "PASS" : "FAIL");
    return ok;
}

int main(int argc, char** argv) {
    const int B = argc > 1 ? atoi(argv[1]) : 2, T = argc > 2 ? atoi(argv[2]) : 150;
    const int Dk = argc > 3 ? atoi(argv[3]) : 20, N = argc > 4 ? atoi(argv[4]) : 32;
    const size_t BT = (size_t)B * T;
    printf("kalman filter kernels against the double reference: B %d T %d Dk %d N %d\n", B, T, Dk, N);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> U(0.0f, 1.0f);
    std::normal_distribution<float> Nrm(0.0f, 1.0f);
    std::vector<float> v(BT * Dk), Lv(BT * Dk), dys(BT * Dk), k(BT * N), q(BT * N), abar((size_t)Dk * N),
        pbar(abar.size());
    for (size_t i = 0; i < v.size(); i++) {
        v[i] = 2 * U(rng) - 1;
        Lv[i] = (float)(1.0 / (log1p(exp((double)Nrm(rng))) + 1e-4));
        dys[i] = 2 * U(rng) - 1;
    }
    for (size_t r = 0; r < BT; r++) {
        for (float* x : {k.data() + r * N, q.data() + r * N}) {
            double s = 0;
            for (int n = 0; n < N; n++) { x[n] = Nrm(rng); s += (double)x[n] * x[n]; }
            for (int n = 0; n < N; n++) { x[n] = (float)(x[n] / sqrt(s)); }
        }
    }
    for (size_t i = 0; i < abar.size(); i++) {
        abar[i] = 0.905f + 0.094f * U(rng);
        pbar[i] = 0.01f * (1.0f - abar[i] * abar[i]) / 2.0f;
    }
    std::vector<double> ref[KALMAN_OUTPUTS];
    kalman_reference(ref, v, Lv, k, q, abar, pbar, dys, B, T, Dk, N);
    int ok = 1;
    // one segment, then time segments (spec 3.5): each against the reference, and against one segment's outputs
    std::vector<float> ys;
    for (int S : {1, 2, 5}) {
        std::vector<float> y(BT * Dk), ck(kalman_checkpoint_floats(B, T, Dk, N)), dv(BT * Dk), dLv(BT * Dk),
            dk(BT * N), dq(BT * N), dabar(abar.size()), dpbar(abar.size());
        std::vector<float> fwd_scratch(kalman_filter_forward_scratch_bytes(B, Dk, N, S) / sizeof(float) + 1);
        std::vector<float> scratch(kalman_filter_backward_scratch_bytes(B, T, Dk, N, S) / sizeof(float));
        kalman_filter_forward(y.data(), ck.data(), NULL, NULL, 1, v.data(), Dk, Lv.data(), k.data(), q.data(),
                              abar.data(), pbar.data(), B, T, Dk, N, S, fwd_scratch.data(), 0);
        kalman_filter_backward(dv.data(), dLv.data(), dk.data(), dq.data(), dabar.data(), dpbar.data(), dys.data(),
                               ck.data(), v.data(), Dk, Lv.data(), k.data(), q.data(), abar.data(), pbar.data(), B, T,
                               Dk, N, S, scratch.data(), 0);
        printf(" %d segment(s) of up to %d tiles\n", kalman_effective_segments(T, S), kalman_tiles_per_segment(T, S));
        const std::vector<float>* got[KALMAN_OUTPUTS] = {&y, &dv, &dLv, &dk, &dq, &dabar, &dpbar};
        for (int i = 0; i < KALMAN_OUTPUTS; i++) { ok &= check(KALMAN_OUTPUT_NAMES[i], *got[i], ref[i]); }
        if (S == 1) {
            ys = y;
        } else {   // the forward's output against one segment's
            ok &= check("ys vs S=1", y, std::vector<double>(ys.begin(), ys.end()));
        }
    }
    // decode: sequence 0 one token at a time, its state carried in lam_io, eta_io
    std::vector<float> lam((size_t)Dk * N), eta((size_t)Dk * N), y1(Dk);
    size_t differ = 0;
    for (int t = 0; t < T; t++) {
        const size_t r = t;
        kalman_filter_forward(y1.data(), NULL, lam.data(), eta.data(), t == 0, v.data() + r * Dk, Dk,
                              Lv.data() + r * Dk, k.data() + r * N, q.data() + r * N, abar.data(), pbar.data(), 1, 1,
                              Dk, N, 1, NULL, 0);
        for (int d = 0; d < Dk; d++) { differ += memcmp(&y1[d], &ys[r * Dk + d], sizeof(float)) != 0; }
    }
    printf("  decode   %zu of %d outputs differ from the forward's bits  %s\n", differ, T * Dk,
           differ ? "FAIL" : "PASS");
    ok &= differ == 0;
    printf("%s\n", ok ? "PASS kalman filter" : "FAIL kalman filter");
    return ok ? 0 : 1;
}
