/*
dev/emu/pdn_chunk.cu: the chunkwise core of pdn, pgdn and pkda (kernels/pdn.cuh's preconditioner scan and its
backward, kernels/gdn_chunk.cuh's chunk kernels with the write key k~ = m k; spec/pdn.md 3) against the recurrent core
(pdn_core_forward and dev/cuda/pdn_recurrent_backward.cuh's pdn_core_backward, the version validated on GPUs
against PyTorch), both run on the CPU by
dev/emu/emu.h's emulator: the kernels' own code, CUDA-core products (the tensor-core ones need a GPU), fp32 build.
Inputs shaped as in the layer: unit q and k, v in [-1, 1], beta and bP in (0.05, 0.95), the preconditioner's log
decay gP in [-1, 0], c = -0.2 on one head and 0.3 on the other; pgdn: the main log decay g in [-1, 0] per (token,
head), in [-1e-3, 0] over the middle third (gamma ~ 1, the state grows); pdn: g = 0; pkda: g per channel,
channel d's in [-s_d, 0] with s_d from 0.01 to 4 (log-spaced: some channels hardly decay, in others the chunk's
cumulative decay reaches about exp(-128), beyond fp32's exp range, which the blocked exponents of the chunk kernels
must survive), in [-1e-3, 0] over the middle third. B = 1, H = 2, dO in [-1, 1].
Checks, relative L2 per output: o, dq, dk (read + write + second-moment paths), dv, dbeta, dg (pgdn: the recurrent
core's per-channel dg summed over the channels; pkda: per channel), dgP, dbP, dlog_scale. Tolerance 1e-4: the two paths compute the
same sums in other orders in fp32 (the chunk form is algebraically identical, spec 3.1); a wrong or missing term
is of the order of the output itself. A second check: the same chunk kernels with the write key given as a copy
of the read key (their split path) against gdn's fused path (kw = k, one dk): dk + dkw = dk within 1e-4.
Run through dev/emu/run.sh (it transforms the kernels and builds this file). Usage: pdn_chunk [T dk dv]
(default 150 16 24). Exit status 1 when an output misses the tolerance or holds a NaN (the emulator fills shared
memory with NaN, so a read of an unwritten element shows).
*/
#include "emu.h"
#include "kernels/common.cuh"
#undef cudaCheckLaunch
#define cudaCheckLaunch() do {} while (0)
#include "kernels/pdn.cuh"
#include "kernels/pdn_recurrent_backward.cuh"
#include "kernels/gdn_chunk.cuh"
#include <random>

static const double TOLERANCE = 1e-4;

static int check(const char* what, double e) {
    const int ok = e <= TOLERANCE;   // a NaN fails the comparison too
    printf("  %-10s rel L2 %.3e  %s\n", what, e, ok ? "PASS" : "FAIL");
    return ok;
}

int main(int argc, char** argv) {
    const int B = 1, T = argc > 1 ? atoi(argv[1]) : 150, H = 2, dk = argc > 2 ? atoi(argv[2]) : 16;
    const int dv = argc > 3 ? atoi(argv[3]) : 24;
    const int D = 2 * H * dk + H * dv, HK = H * dk, HV = H * dv, BT = B * T;
    const float qscale = 1.0f / sqrtf((float)dk), lnx = logf(1.5f), eps = 1e-6f;
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> U(0.0f, 1.0f);
    std::normal_distribution<float> N(0.0f, 1.0f);
    std::vector<float> qkv((size_t)BT * D), dO((size_t)BT * HV), beta((size_t)BT * H), gP((size_t)BT * H);
    std::vector<float> bP((size_t)BT * H), g_pgdn((size_t)BT * HK), g_pdn((size_t)BT * HK, 0.0f), cs = {-0.2f, 0.3f};
    std::vector<float> g_pkda((size_t)BT * HK);
    for (int r = 0; r < BT; r++) for (int h = 0; h < H; h++) {
        for (int blk = 0; blk < 2; blk++) {
            std::vector<float> u(dk);
            float n = 0;
            for (int j = 0; j < dk; j++) { u[j] = N(rng); n += u[j] * u[j]; }
            for (int j = 0; j < dk; j++) { qkv[(size_t)r * D + blk * HK + h * dk + j] = u[j] / sqrtf(n); }
        }
        for (int j = 0; j < dv; j++) { qkv[(size_t)r * D + 2 * HK + h * dv + j] = 2 * U(rng) - 1; }
        for (int j = 0; j < dv; j++) { dO[(size_t)r * HV + h * dv + j] = 2 * U(rng) - 1; }
        const size_t e = (size_t)r * H + h;
        const int t = r % T;
        beta[e] = 0.05f + 0.9f * U(rng);
        bP[e] = 0.05f + 0.9f * U(rng);
        gP[e] = -U(rng);
        const float gs = (t >= T / 3 && t < 2 * T / 3) ? -1e-3f * U(rng) : -U(rng);
        for (int d = 0; d < dk; d++) { g_pgdn[e * dk + d] = gs; }
        for (int d = 0; d < dk; d++) {
            const float sd = 0.01f * powf(400.0f, (float)d / (float)(dk - 1));
            g_pkda[e * dk + d] = (t >= T / 3 && t < 2 * T / 3) ? -1e-3f * U(rng) : -sd * U(rng);
        }
    }
    int ok = 1;
    const char* names[3] = {"pdn", "pgdn", "pkda"};
    for (int variant = 0; variant < 3; variant++) {
        const std::vector<float>& g = variant == 0 ? g_pdn : variant == 1 ? g_pgdn : g_pkda;
        const GdnDecay decay = variant == 2 ? GDN_DECAY_CHANNEL : GDN_DECAY_HEAD;
        // the recurrent core
        std::vector<float> o1((size_t)BT * HV), A1((size_t)BT * HK), m1((size_t)BT * HK);
        std::vector<float> Sck((size_t)B * H * pdn_segments(T) * dk * dv);
        std::vector<float> dqkv1((size_t)BT * D, NAN), dbeta1((size_t)BT * H), dg1((size_t)BT * HK);
        std::vector<float> dgP1((size_t)BT * H), dbP1((size_t)BT * H), dlog1(H, 0.0f), dcs1(B * H);
        std::vector<float> core(pdn_core_backward_scratch_floats(B, H, dk, dv));
        pdn_core_forward(o1.data(), A1.data(), m1.data(), Sck.data(), NULL, NULL, qkv.data(), beta.data(), g.data(),
                         gP.data(), bP.data(), cs.data(), B, T, H, dk, dv, qscale, lnx, eps, 0);
        pdn_core_backward(dqkv1.data(), dbeta1.data(), dg1.data(), dgP1.data(), dbP1.data(), dlog1.data(), dcs1.data(),
                          core.data(), dO.data(), Sck.data(), qkv.data(), beta.data(), g.data(), gP.data(), bP.data(),
                          A1.data(), m1.data(), cs.data(), B, T, H, dk, dv, qscale, lnx, eps, 0);
        // the chunkwise core: the preconditioner scan, the chunk kernels along k~, then the scan's backward
        std::vector<float> o2((size_t)BT * HV), A2((size_t)BT * HK), m2((size_t)BT * HK), kt((size_t)BT * HK);
        std::vector<float> saved(gdn_chunk_saved_bytes(B, T, H, dk, dv, decay) / 4 + 64);
        std::vector<float> work(gdn_chunk_workspace_bytes(B, T, H, dk, dv, decay) / 4 + 64);
        std::vector<float> dqkv2((size_t)BT * D, NAN), dkt((size_t)BT * HK, NAN), dbeta2((size_t)BT * H);
        std::vector<float> dg2((size_t)BT * (variant == 2 ? HK : H)), dgP2((size_t)BT * H), dbP2((size_t)BT * H), dlog2(H, 0.0f);
        std::vector<float> dcs2((size_t)B * H * pdn_precond_chunks(T));
        std::vector<float> scan(pdn_precond_scratch_bytes(B, T, H, dk) / 4);
        const float* q = qkv.data();
        pdn_precond_forward(A2.data(), m2.data(), kt.data(), scan.data(), q, gP.data(), bP.data(), cs.data(), B, T, H,
                            dk, dv, lnx, eps, 0);
        gdn_chunk_forward<float>(o2.data(), HV, saved.data(), work.data(), q, q + HK, q + 2 * HK, D, kt.data(), HK,
                                 beta.data(), g.data(), dk, decay, B, T, H, dk, dv, qscale, 0);
        gdn_chunk_backward<float>(dqkv2.data(), dqkv2.data() + HK, dqkv2.data() + 2 * HK, D, dkt.data(), HK,
                                  dbeta2.data(), dg2.data(), dO.data(), HV, saved.data(), work.data(), q, q + HK,
                                  q + 2 * HK, D, kt.data(), HK, beta.data(), decay, B, T, H, dk, dv, qscale, 0);
        pdn_precond_backward(dqkv2.data(), dgP2.data(), dbP2.data(), dlog2.data(), dcs2.data(), scan.data(),
                             dkt.data(), q, A2.data(), m2.data(), gP.data(), bP.data(), cs.data(), B, T, H, dk, dv, lnx,
                             eps, 0);
        // dg per (token, head): the recurrent core's channels summed
        std::vector<float> dg1s((size_t)BT * H, 0.0f);
        for (size_t e = 0; e < (size_t)BT * H; e++) for (int d = 0; d < dk; d++) { dg1s[e] += dg1[e * dk + d]; }
        printf("%s T=%d H=%d dk=%d dv=%d: chunkwise core against the recurrent one\n", names[variant], T, H, dk, dv);
        ok &= check("o", rel(o2, o1, 0, 1, 1, o1.size()));
        ok &= check("dq", rel(dqkv2, dqkv1, 0, D, HK, BT));
        ok &= check("dk", rel(dqkv2, dqkv1, HK, D, HK, BT));
        ok &= check("dv", rel(dqkv2, dqkv1, 2 * HK, D, HV, BT));
        ok &= check("dbeta", rel(dbeta2, dbeta1, 0, 1, 1, dbeta1.size()));
        if (variant == 1) { ok &= check("dg", rel(dg2, dg1s, 0, 1, 1, dg1s.size())); }
        if (variant == 2) { ok &= check("dg", rel(dg2, dg1, 0, 1, 1, dg1.size())); }
        ok &= check("dgP", rel(dgP2, dgP1, 0, 1, 1, dgP1.size()));
        ok &= check("dbP", rel(dbP2, dbP1, 0, 1, 1, dbP1.size()));
        ok &= check("dlog_scale", rel(dlog2, dlog1, 0, 1, 1, H));
        if (variant == 1) {
            // the split path with kw a copy of k against the fused path (kw = k): dk + dkw = dk
            std::vector<float> kcopy((size_t)BT * HK);
            for (int r = 0; r < BT; r++) for (int j = 0; j < HK; j++) { kcopy[(size_t)r * HK + j] = qkv[(size_t)r * D + HK + j]; }
            std::vector<float> dsplit((size_t)BT * D, NAN), dkw((size_t)BT * HK, NAN), dfused((size_t)BT * D, NAN);
            std::vector<float> db((size_t)BT * H), dgx((size_t)BT * H);
            gdn_chunk_forward<float>(o2.data(), HV, saved.data(), work.data(), q, q + HK, q + 2 * HK, D, kcopy.data(), HK,
                                     beta.data(), g.data(), dk, GDN_DECAY_HEAD, B, T, H, dk, dv,
                                     qscale, 0);
            gdn_chunk_backward<float>(dsplit.data(), dsplit.data() + HK, dsplit.data() + 2 * HK, D, dkw.data(), HK,
                                      db.data(), dgx.data(), dO.data(), HV, saved.data(), work.data(), q, q + HK,
                                      q + 2 * HK, D, kcopy.data(), HK, beta.data(), GDN_DECAY_HEAD, B, T, H, dk,
                                      dv, qscale, 0);
            gdn_chunk_forward<float>(o2.data(), HV, saved.data(), work.data(), q, q + HK, q + 2 * HK, D, q + HK, D,
                                     beta.data(), g.data(), dk, GDN_DECAY_HEAD, B, T, H, dk, dv,
                                     qscale, 0);
            gdn_chunk_backward<float>(dfused.data(), dfused.data() + HK, dfused.data() + 2 * HK, D, NULL, 0, db.data(),
                                      dgx.data(), dO.data(), HV, saved.data(), work.data(), q, q + HK, q + 2 * HK, D,
                                      q + HK, D, beta.data(), GDN_DECAY_HEAD, B, T, H, dk, dv, qscale, 0);
            for (int r = 0; r < BT; r++) for (int j = 0; j < HK; j++) { dsplit[(size_t)r * D + HK + j] += dkw[(size_t)r * HK + j]; }
            printf("gdn T=%d H=%d dk=%d dv=%d: the split path with kw = a copy of k against the fused one\n", T, H, dk, dv);
            ok &= check("dk + dkw", rel(dsplit, dfused, HK, D, HK, BT));
        }
    }
    printf("%s chunkwise pdn / pgdn / pkda core = recurrent core within %.0e (T=%d dk=%d dv=%d)\n", ok ? "PASS" : "FAIL",
           TOLERANCE, T, dk, dv);
    return ok ? 0 : 1;
}
