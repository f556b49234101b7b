/*
dev/emu/gdn_mma.cu: kernels/gdn_chunk.cuh's register-tile kernels (the bf16 trainer's, dev/cuda/gdn_chunk_fwd.cu
version 6 / gdn_chunk_bwd.cu version 5): the state passes (gdn_fwd_state_mma_kernel, gdn_bwd_state_mma_kernel;
unsplit, and split along the sequence into segments of one chunk with gdn_state_combine_kernel between), the
output kernels (gdn_fwd_output_mma_kernel, per head also gdn_fwd_output_head_mma_kernel), the dvlocal kernel
(gdn_bwd_dvlocal_mma_kernel), per head the intra kernel (gdn_fwd_intra_mma_kernel) and the backward chunk kernel (gdn_bwd_chunk_mma_kernel), with the write key the
read key's and apart, and per channel the intra kernel (gdn_fwd_intra_channel_mma_kernel) and the backward chunk
kernel (gdn_bwd_chunk_channel_mma_kernel, the key gradients' Z1 terms fused in), against the
shared-memory kernels with fp32 CUDA-core products (Tc = float), both run on the CPU by dev/emu/emu.h's emulator
(ldmatrix, mma.sync and cp.async emulated), for both decay kinds (per head: gdn, kaczmarz, pdn, pgdn; per channel:
pkda). Each kernel gets the same inputs, drawn here as the kernels before it leave them (W, U, Vn, Kwe, Qg, Aqk zero
on a partial chunk's padded rows, G a chunk cumsum of log decays in [-0.2, 0] per head, per channel of
channel-dependent strength up to 2 per token), the bf16 kernels as bf16 and the fp32 ones as the same values in
fp32; dVl (fp32) is the dvlocal kernel's output.
Outputs: h, Vn (forward state), dE and dVn (backward state), o (output), dVl (dvlocal), Tm, G, W and U (intra; k,
v, beta in [0.05, 0.95] and g in [-0.2, 0] drawn per token), dq, dk, dv, dkw, dbeta and dg (backward chunk kernel;
Tm unit lower triangular with entries of order 0.1), by relative L2 error.
Tolerance 1e-2: the register tiles round the state operand (h, dE), the state passes' second operand
(Vn exp(G_BT - G) or -dVn), the scaled dO and the masked chunk products to bf16 (2^-9 relative each), where the fp32
kernels keep fp32, and store h, Vn and o in bf16; a few such roundings compound to a few 1e-3, while a missing or
wrong term is O(1) off. Shapes: dk, dv = 24, 40 at T = 150 (dk padded to 32: warps without state rows; a state
CTA with 8 of its 32 columns, an output block of 64 with 40; a partial last chunk), dk, dv = 136, 24 at T = 100
(two state row blocks per warp, dk above the chunk length in the products), and dk, dv = 128, 40 at T = 70 (the state
passes compiled for dk = GDN_FIXED_DK, as the launchers run them at the production head size).
Measured at T = 150, dk, dv = 24, 40: per head h 2.5e-3, Vn 1.6e-3, dE 2.3e-3, dVn 8.0e-4, o 2.2e-3, dVl 1.7e-3;
per channel h 2.5e-3, Vn 2.5e-3, dE 2.8e-3, dVn 2.3e-3, o 1.7e-3, dVl 3.9e-8 (h, Vn and o are stored in bf16: 2^-9
relative rounding alone; per channel dVl = Aqk^T dO has bf16 inputs on both sides and no rounding in between);
split state passes (3 segments) per head h 2.4e-3, Vn 1.6e-3, dE 2.3e-3, dVn 7.6e-4, per channel 1.7e-3, 2.1e-3,
2.4e-3, 1.9e-3;
intra (kw = k and apart) Tm 5.6e-9 (K Kw^T of bf16 inputs in fp32 on both sides, then the same fp32 solve), G 0
(the same sums in the same order), W 2.4e-3, U 2.4e-3 (stored in bf16); backward chunk kernel (kw = k / apart) dq
1.4e-3, dk 2.2e-3 / 3.1e-3, dv 1.9e-3, dkw 1.7e-3, dbeta 1.9e-3 / 2.0e-3, dg 1.4e-3 / 1.9e-3 (the register tiles
also round Tm and dVn to bf16, which the fp32 kernel keeps in fp32). Per channel, at decay strength 2 / 16 (every
diagonal block on tensor cores / per element): intra Tm 2.8e-4 / 2.2e-5, G 0, W 2.8e-3, U 2.2e-3, A0 2.2e-3 /
5.6e-4, Aqk 2.7e-3 / 1.8e-3, Qg 1.7e-3 / 1.4e-3, Kwe 1.3e-3 / 5.9e-4 (both kernels round the decayed operands to
bf16, each its own way; W, U, Aqk, Qg and Kwe are stored in bf16); backward chunk kernel (against the fp32 chunk
kernel and key kernel) dq 2.0e-3 / 1.7e-3, dk 3.0e-3 / 3.1e-3, dv 1.9e-3, dkw 1.6e-3 / 8.5e-4, dbeta 2.1e-3 / 2.1e-3,
dg 2.8e-3 / 2.0e-3.
Negative controls (dev/emu/run.sh): the backward state pass without dE -= W^T dVn, the split state passes'
phase 3 from zero states (h 1.0) or phase 1 without its identity columns (h 3.1e-1), the output kernel without
the decay diag(gam) on Q h_n, the intra kernel without beta in A, the backward chunk kernel without phase 2's
part of dT (dk 1.5e-1, dg 1.5e-1), the per-channel intra kernel without exp(G_r - G_f) on its row blocks' rows (A0
5.5e-1) or without its per-element diagonal blocks, and the per-channel backward chunk kernel without the diagonal
blocks of rows(dAqk, Kw) and rows(Z1, Kw) per element (strength 16: dq 9.5e-1, dk 6.8e-1, dg 2.1) or on tensor
cores (strength 2) or without cols(dAqk, Q) (dkw 1.7e-1), must fail.
Usage: gdn_mma T dk dv. Exit status 1 when an output misses its tolerance or holds a NaN.
*/
#include "emu.h"
#include "kernels/common.cuh"
#undef cudaCheckLaunch
#define cudaCheckLaunch() do {} while (0)
#include "kernels/gdn_chunk.cuh"
#include <random>

typedef __nv_bfloat16 bf16;

static std::vector<bf16> to_bf16(const std::vector<float>& v) {
    std::vector<bf16> out(v.size());
    for (size_t i = 0; i < v.size(); i++) { out[i] = __float2bfloat16(v[i]); }
    return out;
}
static std::vector<float> to_floats(const std::vector<bf16>& v) {
    std::vector<float> out(v.size());
    for (size_t i = 0; i < v.size(); i++) { out[i] = __bfloat162float(v[i]); }
    return out;
}

// per-chunk cumulative log decays per channel [nch][BT][dk]: channel d falls by up to strength (d + 1) / dk per token
// (and stays put past T)
static std::vector<float> draw_channel_G(std::mt19937& rng, int nch, int NT, int T, int dk, float strength) {
    const int BT = GDN_CHUNK;
    std::uniform_real_distribution<float> U(0.0f, 1.0f);
    std::vector<float> G((size_t)nch * BT * dk);
    for (int c = 0; c < nch; c++) for (int d = 0; d < dk; d++) {
        float acc = 0.0f;
        for (int r = 0; r < BT; r++) {
            if ((c % NT) * BT + r < T) { acc -= strength * (d + 1) / dk * U(rng); }
            G[((size_t)c * BT + r) * dk + d] = acc;
        }
    }
    return G;
}

// what both backward chunk kernels read: rows q | k | kw | v (ld = 3 H dk + H dv), dO, beta; the saved Tm (drawn unit
// lower triangular, the inverse of I + A for a small strictly lower A: entries of order 0.1), h and Vn (zero on
// padded rows); the work tensors dVn and dE
struct BwdChunkInputs {
    std::vector<float> qkv, dO, beta, Tm, h, Vn, dVn, dE;
};

static BwdChunkInputs draw_bwd_chunk_inputs(std::mt19937& rng, int B, int T, int H, int dk, int dv) {
    const int BT = GDN_CHUNK, NT = ceil_div(T, BT), nch = B * H * NT, ld = 3 * H * dk + H * dv, HV = H * dv;
    std::normal_distribution<float> N(0.0f, 1.0f);
    std::uniform_real_distribution<float> U(0.0f, 1.0f);
    const auto bf = [](float x) { return __bfloat162float(__float2bfloat16(x)); };
    BwdChunkInputs in;
    in.qkv.resize((size_t)B * T * ld);
    in.dO.resize((size_t)B * T * HV);
    in.beta.resize((size_t)B * T * H);
    for (int r = 0; r < B * T; r++) {
        for (int j = 0; j < 3 * H * dk; j++) { in.qkv[(size_t)r * ld + j] = bf(N(rng) / sqrtf((float)dk)); }
        for (int j = 0; j < HV; j++) { in.qkv[(size_t)r * ld + 3 * H * dk + j] = bf(N(rng)); }
        for (int j = 0; j < HV; j++) { in.dO[(size_t)r * HV + j] = bf(2 * U(rng) - 1); }
    }
    for (auto& x : in.beta) { x = 0.05f + 0.9f * U(rng); }
    in.Tm.resize((size_t)nch * BT * BT);
    in.Vn.resize((size_t)nch * BT * dv);
    in.dVn.resize(in.Vn.size());
    for (int c = 0; c < nch; c++) {
        for (int i = 0; i < BT; i++) {
            const bool valid = (c % NT) * BT + i < T;
            for (int j = 0; j < BT; j++) {
                in.Tm[((size_t)c * BT + i) * BT + j] = i == j ? 1.0f : i > j ? 0.1f * N(rng) : 0.0f;
            }
            for (int j = 0; j < dv; j++) {
                in.Vn[((size_t)c * BT + i) * dv + j] = valid ? bf(N(rng)) : 0.0f;
                in.dVn[((size_t)c * BT + i) * dv + j] = N(rng);
            }
        }
    }
    in.h.resize((size_t)nch * dk * dv);
    in.dE.resize(in.h.size());
    for (auto& x : in.h) { x = bf(N(rng)); }
    for (auto& x : in.dE) { x = bf(N(rng)); }
    return in;
}

// columns off .. off + w of the rows of m (ld apart)
static std::vector<float> columns(const std::vector<float>& m, int rows, int ld, int off, int w) {
    std::vector<float> x((size_t)rows * w);
    for (int r = 0; r < rows; r++) for (int j = 0; j < w; j++) { x[(size_t)r * w + j] = m[(size_t)r * ld + off + j]; }
    return x;
}

// prints the relative L2 error of every output (mine[i] against ref[i], empty ones skipped) and a PASS / FAIL line
// naming what; returns 1 when all are within 1e-2 (a NaN fails the comparison too)
static int report(const char* what, const char* const* names, const std::vector<float>* mine,
                  const std::vector<float>* ref, int n) {
    printf("%s: register tiles against the fp32 kernels, relative L2\n ", what);
    int ok = 1;
    for (int i = 0; i < n; i++) {
        if (ref[i].empty()) { continue; }
        const double e = rel(mine[i], ref[i], 0, 1, 1, ref[i].size());
        printf(" %s %.3e", names[i], e);
        ok &= e <= 1e-2;
    }
    printf("\n%s %s: register tiles = fp32 kernels within 1e-2\n", ok ? "PASS" : "FAIL", what);
    return ok;
}

template <GdnDecay DECAY>
static int check(int B, int T, int H, int dk, int dv) {
    constexpr bool CH = DECAY == GDN_DECAY_CHANNEL;
    const int BT = GDN_CHUNK, NT = ceil_div(T, BT), nch = B * H * NT, GW = CH ? dk : 1;
    const float scale = 1.0f / sqrtf((float)dk);
    std::mt19937 rng(11);
    std::normal_distribution<float> N(0.0f, 1.0f);
    std::uniform_real_distribution<float> U(0.0f, 1.0f);
    const auto bf = [](float x) { return __bfloat162float(__float2bfloat16(x)); };   // bf16-representable values
    // per-chunk inputs [c][BT][width], zero on the padded rows of the last chunk
    const auto chunk_rows = [&](int width, float sd) {
        std::vector<float> x((size_t)nch * BT * width);
        for (int c = 0; c < nch; c++) for (int r = 0; r < BT; r++) for (int j = 0; j < width; j++) {
            x[((size_t)c * BT + r) * width + j] = (c % NT) * BT + r < T ? bf(sd * N(rng)) : 0.0f;
        }
        return x;
    };
    std::vector<float> W = chunk_rows(dk, 1.0f / sqrtf((float)dk)), Uw = chunk_rows(dv, 1.0f);
    std::vector<float> Kwe = chunk_rows(dk, 1.0f / sqrtf((float)dk)), Qg = chunk_rows(dk, scale / sqrtf((float)dk));
    std::vector<float> Vn_in = chunk_rows(dv, 1.0f), Aqk((size_t)nch * BT * BT);
    for (int c = 0; c < nch; c++) for (int i = 0; i < BT; i++) for (int j = 0; j < BT; j++) {   // lower, scale included
        Aqk[((size_t)c * BT + i) * BT + j] = i >= j && (c % NT) * BT + i < T ? bf(scale * N(rng) / sqrtf(1.0f + i)) : 0.0f;
    }
    std::vector<float> h_in((size_t)nch * dk * dv);
    for (auto& x : h_in) { x = bf(N(rng)); }
    std::vector<float> dVl((size_t)nch * BT * dv);
    for (auto& x : dVl) { x = N(rng); }
    std::vector<float> kw((size_t)B * T * H * dk), q(kw.size()), dO((size_t)B * T * H * dv);
    for (auto& x : kw) { x = bf(N(rng) / sqrtf((float)dk)); }
    for (auto& x : q) { x = bf(N(rng) / sqrtf((float)dk)); }
    for (auto& x : dO) { x = bf(2 * U(rng) - 1); }
    std::vector<float> G((size_t)nch * BT * GW);   // chunk cumsums; g = 0 on padded rows
    for (int c = 0; c < nch; c++) for (int j = 0; j < GW; j++) {
        float acc = 0.0f;
        const float strength = CH ? 2.0f * (j + 1) / GW : 0.2f;
        for (int r = 0; r < BT; r++) {
            if ((c % NT) * BT + r < T) { acc -= strength * U(rng); }
            G[((size_t)c * BT + r) * GW + j] = acc;
        }
    }
    const dim3 grid(ceil_div(dv, GDN_STATE_BV), B * H), block(GDN_STATE_THREADS);
    const int HV = H * dv;
    std::vector<float> out[2][11];   // [fp32 kernels, register tiles][h, Vn, dE, dVn, o, dVl, h .. dVn split, o head]
    {   // the shared-memory kernels, fp32
        std::vector<float> h((size_t)nch * dk * dv, NAN), Vn((size_t)nch * BT * dv, NAN), dE(h.size(), NAN), dVn = dVl;
        emu_launch(grid, block, [&]() {
            gdn_fwd_state_kernel<float, float, DECAY>(h.data(), Vn.data(), G.data(), W.data(), Uw.data(), kw.data(), H * dk,
                                                      Kwe.data(), T, H, NT, dk, dv);
        });
        emu_launch(grid, block, [&]() {
            gdn_bwd_state_kernel<float, float, DECAY>(dVn.data(), dE.data(), dO.data(), H * dv, q.data(), H * dk, kw.data(),
                                                      H * dk, G.data(), W.data(), Qg.data(), Kwe.data(), T, H, NT, dk, dv,
                                                      scale);
        });
        std::vector<float> o((size_t)B * T * HV, NAN), dvl((size_t)nch * BT * dv, NAN);
        emu_launch(dim3(nch, ceil_div(round16(dv), GdnTile<float>::VO)), block, [&]() {
            gdn_fwd_output_kernel<float, float, DECAY>(o.data(), HV, Aqk.data(), q.data(), H * dk, kw.data(), H * dk,
                                                       G.data(), h_in.data(), Vn_in.data(), Qg.data(), T, H, NT, dk, dv,
                                                       scale);
        });
        emu_launch(dim3(nch), block, [&]() {
            gdn_bwd_dvlocal_kernel<float, float, DECAY>(dvl.data(), dO.data(), HV, q.data(), H * dk, kw.data(), H * dk,
                                                        G.data(), Aqk.data(), T, H, NT, dk, dv, scale);
        });
        out[0][0] = h; out[0][1] = Vn; out[0][2] = dE; out[0][3] = dVn; out[0][4] = o; out[0][5] = dvl;
        out[0][6] = h; out[0][7] = Vn; out[0][8] = dE; out[0][9] = dVn; out[0][10] = o;
    }
    {   // the register tiles, bf16
        const std::vector<bf16> Wb = to_bf16(W), Ub = to_bf16(Uw), Kweb = to_bf16(Kwe), Qgb = to_bf16(Qg), kwb = to_bf16(kw),
            qb = to_bf16(q), dOb = to_bf16(dO);
        std::vector<bf16> h((size_t)nch * dk * dv, __float2bfloat16(NAN)), Vn((size_t)nch * BT * dv, __float2bfloat16(NAN)),
            dE(h.size(), __float2bfloat16(NAN));
        std::vector<float> dVn = dVl;
        // the state passes unsplit (one segment) and split into segments of one chunk (the launchers' three steps)
        const auto state_passes = [&](int len, std::vector<bf16>& h, std::vector<bf16>& Vn, std::vector<bf16>& dE,
                                      std::vector<float>& dVn) {
            const int count = ceil_div(NT, len);
            std::vector<float> first((size_t)B * H * count * dk * dv, NAN), last((size_t)B * H * count * dk * (dv + dk), NAN);
            const dim3 grid1(ceil_div(dv + dk, GDN_STATE_BV), B * H, count - 1), grid3(grid.x, B * H, count);
            const dim3 grid_c(dv / GDN_COMBINE_BV, B * H);
            const GdnSegments p3 = {count > 1 ? first.data() : nullptr, nullptr, len, count, 0};
            // one CTA's body, the kernels compiled for dk = GDN_FIXED_DK where it is that (as the launchers pick)
            const auto state_cta = [&](int backward, const GdnSegments& sg) {
                const auto run = [&](auto bwd_kernel, auto fwd_kernel) {
                    if (backward) {
                        bwd_kernel(dVn.data(), dE.data(), dOb.data(), H * dv, qb.data(), H * dk, kwb.data(), H * dk,
                                   G.data(), Wb.data(), Qgb.data(), Kweb.data(), sg, T, H, NT, dk, dv, scale);
                    } else {
                        fwd_kernel(h.data(), Vn.data(), G.data(), Wb.data(), Ub.data(), kwb.data(), H * dk, Kweb.data(),
                                   sg, T, H, NT, dk, dv);
                    }
                };
                if (dk == GDN_FIXED_DK) {
                    run(gdn_bwd_state_mma_kernel<DECAY, GDN_FIXED_DK>, gdn_fwd_state_mma_kernel<DECAY, GDN_FIXED_DK>);
                } else {
                    run(gdn_bwd_state_mma_kernel<DECAY, 0>, gdn_fwd_state_mma_kernel<DECAY, 0>);
                }
            };
            for (int backward = 0; backward < 2; backward++) {
                const GdnSegments p1 = {nullptr, last.data(), len, count, backward};
                if (count > 1) {
                    emu_launch(grid1, block, [&]() { state_cta(backward, p1); });
                    emu_launch(grid_c, dim3(256), [&]() {   // rows of 32 MR >= dk, as gdn_state_combine picks
                        if (dk <= 32) {
                            gdn_state_combine_kernel<1>(first.data(), last.data(), count, dk, dv, backward);
                        } else {
                            gdn_state_combine_kernel<8>(first.data(), last.data(), count, dk, dv, backward);
                        }
                    });
                }
                emu_launch(grid3, block, [&]() { state_cta(backward, p3); });
            }
        };
        state_passes(NT, h, Vn, dE, dVn);
        std::vector<bf16> hs(h.size(), __float2bfloat16(NAN)), Vns(Vn.size(), __float2bfloat16(NAN)),
            dEs(dE.size(), __float2bfloat16(NAN));
        std::vector<float> dVns = dVl;
        state_passes(1, hs, Vns, dEs, dVns);
        const std::vector<bf16> Aqkb = to_bf16(Aqk), hb = to_bf16(h_in), Vnb = to_bf16(Vn_in);
        std::vector<bf16> o((size_t)B * T * HV, __float2bfloat16(NAN)), oh(o.size(), __float2bfloat16(NAN));
        std::vector<float> dvl((size_t)nch * BT * dv, NAN);
        emu_launch(dim3(nch), block, [&]() {
            gdn_fwd_output_mma_kernel<DECAY>(o.data(), HV, Aqkb.data(), qb.data(), H * dk, kwb.data(), H * dk, G.data(),
                                             hb.data(), Vnb.data(), Qgb.data(), T, H, NT, dk, dv, scale);
        });
        if (!CH) {   // per head the launchers' kernel at dv <= 128 (Vn in Kw's tile)
            emu_launch(dim3(nch), block, [&]() {
                gdn_fwd_output_head_mma_kernel<0>(oh.data(), HV, qb.data(), H * dk, kwb.data(), H * dk, G.data(),
                                                  hb.data(), Vnb.data(), T, H, NT, dk, dv, scale);
            });
        }
        emu_launch(dim3(nch), block, [&]() {
            gdn_bwd_dvlocal_mma_kernel<DECAY>(dvl.data(), dOb.data(), HV, qb.data(), H * dk, kwb.data(), H * dk, G.data(),
                                              Aqkb.data(), T, H, NT, dk, dv, scale);
        });
        out[1][0] = to_floats(h); out[1][1] = to_floats(Vn); out[1][2] = to_floats(dE); out[1][3] = dVn;
        out[1][4] = to_floats(o); out[1][5] = dvl;
        out[1][6] = to_floats(hs); out[1][7] = to_floats(Vns); out[1][8] = to_floats(dEs); out[1][9] = dVns;
        out[1][10] = to_floats(oh);
    }
    const char* names[11] = {"h", "Vn", "dE", "dVn", "o", "dVl", "h(split)", "Vn(split)", "dE(split)", "dVn(split)",
                             "o(head kernel)"};
    char what[160];
    snprintf(what, sizeof what, "%s decay, T=%d H=%d dk=%d dv=%d", CH ? "per-channel" : "per-head", T, H, dk, dv);
    return report(what, names, out[1], out[0], CH ? 10 : 11);   // (the head kernel: per head only)
}

// the per-head intra kernel (gdn_fwd_intra_mma_kernel) against gdn_fwd_intra_kernel<float, float>, with the write
// key the read key's (gdn, kaczmarz) or its own (pdn, pgdn): Tm, G, W, U
static int check_intra(int B, int T, int H, int dk, int dv, bool split) {
    const int BT = GDN_CHUNK, NT = ceil_div(T, BT), nch = B * H * NT, ld = H * dk + H * dv;
    std::mt19937 rng(13);
    std::normal_distribution<float> N(0.0f, 1.0f);
    std::uniform_real_distribution<float> U(0.0f, 1.0f);
    const auto bf = [](float x) { return __bfloat162float(__float2bfloat16(x)); };
    std::vector<float> kv((size_t)B * T * ld), kw((size_t)B * T * H * dk), beta((size_t)B * T * H), g(beta.size());
    for (int r = 0; r < B * T; r++) {
        for (int j = 0; j < H * dk; j++) { kv[(size_t)r * ld + j] = bf(N(rng) / sqrtf((float)dk)); }
        for (int j = 0; j < H * dv; j++) { kv[(size_t)r * ld + H * dk + j] = bf(N(rng)); }
    }
    for (auto& x : kw) { x = bf(N(rng) / sqrtf((float)dk)); }
    for (auto& x : beta) { x = 0.05f + 0.9f * U(rng); }
    for (auto& x : g) { x = -0.2f * U(rng); }
    const float* k = kv.data();
    const float* kwp = split ? kw.data() : k;
    const int ld_kw = split ? H * dk : ld;
    std::vector<float> out[2][4];   // [fp32 kernel, register tiles][Tm, G, W, U]
    {
        std::vector<float> Tm((size_t)nch * BT * BT, NAN), G((size_t)nch * BT, NAN), W((size_t)nch * BT * dk, NAN),
            Uw((size_t)nch * BT * dv, NAN);
        emu_launch(dim3(nch), dim3(GDN_THREADS), [&]() {
            gdn_fwd_intra_kernel<float, float, GDN_DECAY_HEAD>(Tm.data(), G.data(), W.data(), Uw.data(), nullptr, nullptr,
                                                               nullptr, nullptr, k, k, k + H * dk, ld, kwp, ld_kw,
                                                               beta.data(), g.data(), 1, T, H, NT, dk, dv, 1.0f);
        });
        out[0][0] = Tm; out[0][1] = G; out[0][2] = W; out[0][3] = Uw;
    }
    {
        const std::vector<bf16> kvb = to_bf16(kv), kwb = to_bf16(kw);
        const bf16* kb = kvb.data();
        std::vector<float> Tm((size_t)nch * BT * BT, NAN), G((size_t)nch * BT, NAN);
        std::vector<bf16> W((size_t)nch * BT * dk, __float2bfloat16(NAN)), Uw((size_t)nch * BT * dv, __float2bfloat16(NAN));
        emu_launch(dim3(nch), dim3(GDN_THREADS), [&]() {
            gdn_fwd_intra_mma_kernel<0>(Tm.data(), G.data(), W.data(), Uw.data(), kb, kb + H * dk, ld,
                                        split ? kwb.data() : kb, ld_kw, beta.data(), g.data(), 1, T, H, NT, dk, dv);
        });
        out[1][0] = Tm; out[1][1] = G; out[1][2] = to_floats(W); out[1][3] = to_floats(Uw);
    }
    const char* names[4] = {"Tm", "G", "W", "U"};
    char what[160];
    snprintf(what, sizeof what, "per-head intra kernel, %s, T=%d H=%d dk=%d dv=%d", split ? "kw apart" : "kw = k", T, H,
             dk, dv);
    return report(what, names, out[1], out[0], 4);
}

// the per-channel intra kernel (gdn_fwd_intra_channel_mma_kernel) against gdn_fwd_intra_kernel<float, float,
// GDN_DECAY_CHANNEL> (pkda: a write key of its own): Tm, G, W, U, A0, Aqk, Qg, Kwe. The log decays per channel are
// drawn channel j of strength up to strength (j + 1) / dk per token: at strength 2 (as check's) the last channels
// decay by up to e^-32 over a 16-row block and e^-128 over a chunk, beyond fp32's range, which the blocked products
// must survive, and every diagonal block is within GDN_SPAN_MAX (on tensor cores); at 16 the strongest channels
// decay by about e^-120 over a block, and the diagonal blocks take the per-element path.
static int check_intra_channel(int B, int T, int H, int dk, int dv, float strength) {
    const int BT = GDN_CHUNK, NT = ceil_div(T, BT), nch = B * H * NT, ld = 2 * H * dk + H * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    std::mt19937 rng(17);
    std::normal_distribution<float> N(0.0f, 1.0f);
    std::uniform_real_distribution<float> U(0.0f, 1.0f);
    const auto bf = [](float x) { return __bfloat162float(__float2bfloat16(x)); };
    std::vector<float> qkv((size_t)B * T * ld), kw((size_t)B * T * H * dk), beta((size_t)B * T * H);
    std::vector<float> g((size_t)B * T * H * dk);
    for (int r = 0; r < B * T; r++) {
        for (int j = 0; j < 2 * H * dk; j++) { qkv[(size_t)r * ld + j] = bf(N(rng) / sqrtf((float)dk)); }
        for (int j = 0; j < H * dv; j++) { qkv[(size_t)r * ld + 2 * H * dk + j] = bf(N(rng)); }
        for (int j = 0; j < H * dk; j++) { g[(size_t)r * H * dk + j] = -strength * (j % dk + 1) / dk * U(rng); }
    }
    for (auto& x : kw) { x = bf(N(rng) / sqrtf((float)dk)); }
    for (auto& x : beta) { x = 0.05f + 0.9f * U(rng); }
    const float* q = qkv.data();
    std::vector<float> out[2][8];   // [fp32 kernel, register tiles][Tm, G, W, U, A0, Aqk, Qg, Kwe]
    {
        std::vector<float> Tm((size_t)nch * BT * BT, NAN), G((size_t)nch * BT * dk, NAN), W(G.size(), NAN),
            Uw((size_t)nch * BT * dv, NAN), A0(Tm.size(), NAN), Aqk(Tm.size(), NAN), Qg(G.size(), NAN), Kwe(G.size(), NAN);
        emu_launch(dim3(nch), dim3(gdn_intra_threads(GDN_DECAY_CHANNEL)), [&]() {
            gdn_fwd_intra_kernel<float, float, GDN_DECAY_CHANNEL>(Tm.data(), G.data(), W.data(), Uw.data(), A0.data(),
                                                                  Aqk.data(), Qg.data(), Kwe.data(), q, q + H * dk,
                                                                  q + 2 * H * dk, ld, kw.data(), H * dk, beta.data(),
                                                                  g.data(), dk, T, H, NT, dk, dv, scale);
        });
        out[0][0] = Tm; out[0][1] = G; out[0][2] = W; out[0][3] = Uw; out[0][4] = A0; out[0][5] = Aqk; out[0][6] = Qg;
        out[0][7] = Kwe;
    }
    {
        const std::vector<bf16> qkvb = to_bf16(qkv), kwb = to_bf16(kw);
        const bf16* qb = qkvb.data();
        std::vector<float> Tm((size_t)nch * BT * BT, NAN), G((size_t)nch * BT * dk, NAN), A0(Tm.size(), NAN);
        std::vector<bf16> W(G.size(), __float2bfloat16(NAN)), Uw((size_t)nch * BT * dv, __float2bfloat16(NAN)),
            Aqk(Tm.size(), __float2bfloat16(NAN)), Qg(G.size(), __float2bfloat16(NAN)), Kwe(G.size(), __float2bfloat16(NAN));
        emu_launch(dim3(nch), dim3(GDN_THREADS), [&]() {
            gdn_fwd_intra_channel_mma_kernel(Tm.data(), G.data(), W.data(), Uw.data(), A0.data(), Aqk.data(), Qg.data(),
                                             Kwe.data(), qb, qb + H * dk, qb + 2 * H * dk, ld, kwb.data(), H * dk,
                                             beta.data(), g.data(), T, H, NT, dk, dv, scale);
        });
        out[1][0] = Tm; out[1][1] = G; out[1][2] = to_floats(W); out[1][3] = to_floats(Uw); out[1][4] = A0;
        out[1][5] = to_floats(Aqk); out[1][6] = to_floats(Qg); out[1][7] = to_floats(Kwe);
    }
    const char* names[8] = {"Tm", "G", "W", "U", "A0", "Aqk", "Qg", "Kwe"};
    char what[160];
    snprintf(what, sizeof what, "per-channel intra kernel, decay strength %g, T=%d H=%d dk=%d dv=%d", strength, T, H,
             dk, dv);
    return report(what, names, out[1], out[0], 8);
}

// the per-head backward chunk kernel (gdn_bwd_chunk_mma_kernel) against gdn_bwd_chunk_kernel<float, float>, with the
// write key the read key's or its own: dq, dk, dv, dkw, dbeta, dg. Tm is drawn unit lower triangular (the inverse
// of I + A for a small strictly lower A: entries of order 0.1), the other saved and work tensors as above.
static int check_bwd_chunk(int B, int T, int H, int dk, int dv, bool split) {
    const int BT = GDN_CHUNK, NT = ceil_div(T, BT), nch = B * H * NT, ld = 3 * H * dk + H * dv, HV = H * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    std::mt19937 rng(17);
    std::normal_distribution<float> N(0.0f, 1.0f);
    std::uniform_real_distribution<float> U(0.0f, 1.0f);
    // kw used only with split; G per head
    const BwdChunkInputs in = draw_bwd_chunk_inputs(rng, B, T, H, dk, dv);
    const std::vector<float>&qkv = in.qkv, &dO = in.dO, &beta = in.beta, &Tm = in.Tm, &h = in.h, &Vn = in.Vn,
                            &dVn = in.dVn, &dE = in.dE;
    std::vector<float> G((size_t)nch * BT);
    for (int c = 0; c < nch; c++) {
        float acc = 0.0f;
        for (int i = 0; i < BT; i++) {
            if ((c % NT) * BT + i < T) { acc -= 0.2f * U(rng); }
            G[(size_t)c * BT + i] = acc;
        }
    }
    const float* q = qkv.data();
    const float* k = q + H * dk;
    const float* kw = split ? q + 2 * H * dk : k;
    const float* v = q + 3 * H * dk;
    std::vector<float> out[2][6];   // [fp32 kernel, register tiles][dq, dk, dv, dkw, dbeta, dg] (dq | dk | dv share rows)
    for (int version = 0; version < 2; version++) {
        std::vector<float> dqkv((size_t)B * T * ld, NAN), dbeta((size_t)B * T * H, NAN), dg(dbeta.size(), NAN);
        float* dq = dqkv.data();
        float* dk_ = dq + H * dk;
        float* dkw = split ? dq + 2 * H * dk : nullptr;
        float* dv_ = dq + 3 * H * dk;
        if (version == 0) {
            emu_launch(dim3(nch), dim3(GDN_BWD_THREADS), [&]() {
                gdn_bwd_chunk_kernel<float, float>(dq, dk_, dv_, ld, dkw, ld, dbeta.data(), dg.data(), dO.data(), HV, q, k, v,
                                                   ld, kw, ld, beta.data(), Tm.data(), G.data(), h.data(), Vn.data(),
                                                   dVn.data(), dE.data(), T, H, NT, dk, dv, scale);
            });
        } else {
            const std::vector<bf16> qkvb = to_bf16(qkv), dOb = to_bf16(dO), hb = to_bf16(h), Vnb = to_bf16(Vn), dEb = to_bf16(dE);
            const bf16* qb = qkvb.data();
            emu_launch(dim3(nch), dim3(GDN_BWD_THREADS), [&]() {
                gdn_bwd_chunk_mma_kernel(dq, dk_, dv_, ld, dkw, ld, dbeta.data(), dg.data(), dOb.data(), HV, qb, qb + H * dk,
                                         qb + 3 * H * dk, ld, split ? qb + 2 * H * dk : qb + H * dk, ld, beta.data(),
                                         Tm.data(), G.data(), hb.data(), Vnb.data(), dVn.data(), dEb.data(), T, H, NT, dk,
                                         dv, scale);
            });
        }
        const auto cols = [&](int off, int w) { return columns(dqkv, B * T, ld, off, w); };
        out[version][0] = cols(0, H * dk);
        out[version][1] = cols(H * dk, H * dk);
        out[version][2] = cols(3 * H * dk, H * dv);
        out[version][3] = split ? cols(2 * H * dk, H * dk) : std::vector<float>();
        out[version][4] = dbeta;
        out[version][5] = dg;
    }
    const char* names[6] = {"dq", "dk", "dv", "dkw", "dbeta", "dg"};
    char what[160];
    snprintf(what, sizeof what, "per-head backward chunk kernel, %s, T=%d H=%d dk=%d dv=%d", split ? "kw apart" : "kw = k",
             T, H, dk, dv);
    return report(what, names, out[1], out[0], 6);
}

// the per-channel backward chunk kernel (gdn_bwd_chunk_channel_mma_kernel, the key gradients' Z1 terms fused in)
// against gdn_bwd_chunk_channel_kernel<float, float> followed by gdn_bwd_keys_channel_kernel<float, float> (pkda): dq,
// dk, dv, dkw, dbeta, dg. Tm as check_bwd_chunk's, A0 strictly lower of order 0.1, G per channel of the given strength
// (check_intra_channel's), the other saved and work tensors as check_bwd_chunk's.
static int check_bwd_chunk_channel(int B, int T, int H, int dk, int dv, float strength) {
    const int BT = GDN_CHUNK, NT = ceil_div(T, BT), nch = B * H * NT, ld = 3 * H * dk + H * dv, HV = H * dv, HK = H * dk;
    const float scale = 1.0f / sqrtf((float)dk);
    std::mt19937 rng(23);
    std::normal_distribution<float> N(0.0f, 1.0f);
    const BwdChunkInputs in = draw_bwd_chunk_inputs(rng, B, T, H, dk, dv);
    const std::vector<float>&qkv = in.qkv, &dO = in.dO, &beta = in.beta, &Tm = in.Tm, &h = in.h, &Vn = in.Vn,
                            &dVn = in.dVn, &dE = in.dE;
    std::vector<float> A0(Tm.size());
    for (int c = 0; c < nch; c++) for (int i = 0; i < BT; i++) for (int j = 0; j < BT; j++) {
        A0[((size_t)c * BT + i) * BT + j] = i > j && (c % NT) * BT + i < T ? 0.1f * N(rng) : 0.0f;
    }
    const std::vector<float> G = draw_channel_G(rng, nch, NT, T, dk, strength);
    const float* q = qkv.data();
    std::vector<float> out[2][6];   // [fp32 kernels, register tiles][dq, dk, dv, dkw, dbeta, dg]
    for (int version = 0; version < 2; version++) {
        std::vector<float> dqkv((size_t)B * T * ld, NAN), dbeta((size_t)B * T * H, NAN), dg((size_t)B * T * HK, NAN);
        float* dq = dqkv.data();
        if (version == 0) {
            std::vector<float> Z((size_t)nch * BT * BT, NAN), ce((size_t)nch * dk, NAN);
            emu_launch(dim3(nch), dim3(GDN_BWD_THREADS), [&]() {
                gdn_bwd_chunk_channel_kernel<float, float>(dq, dq + HK, dq + 3 * HK, ld, dq + 2 * HK, ld, dbeta.data(),
                                                           dg.data(), dO.data(), HV, q, q + HK, q + 3 * HK, ld, q + 2 * HK,
                                                           ld, beta.data(), Tm.data(), G.data(), h.data(), Vn.data(),
                                                           A0.data(), dVn.data(), dE.data(), Z.data(), ce.data(), T, H, NT,
                                                           dk, dv, scale);
            });
            emu_launch(dim3(nch), dim3(GDN_KEYS_THREADS), [&]() {
                gdn_bwd_keys_channel_kernel<float, float>(dq + HK, ld, dq + 2 * HK, ld, dg.data(), q + HK, ld, q + 2 * HK,
                                                          ld, G.data(), Z.data(), ce.data(), T, H, NT, dk);
            });
        } else {
            const std::vector<bf16> qkvb = to_bf16(qkv), dOb = to_bf16(dO), hb = to_bf16(h), Vnb = to_bf16(Vn), dEb = to_bf16(dE);
            const bf16* qb = qkvb.data();
            emu_launch(dim3(nch), dim3(GDN_BWD_THREADS), [&]() {
                gdn_bwd_chunk_channel_mma_kernel(dq, dq + HK, dq + 3 * HK, ld, dq + 2 * HK, ld, dbeta.data(), dg.data(),
                                                 dOb.data(), HV, qb, qb + HK, qb + 3 * HK, ld, qb + 2 * HK, ld, beta.data(),
                                                 Tm.data(), G.data(), hb.data(), Vnb.data(), A0.data(), dVn.data(),
                                                 dEb.data(), T, H, NT, dk, dv, scale);
            });
        }
        const auto cols = [&](int off, int w) { return columns(dqkv, B * T, ld, off, w); };
        out[version][0] = cols(0, HK);
        out[version][1] = cols(HK, HK);
        out[version][2] = cols(3 * HK, HV);
        out[version][3] = cols(2 * HK, HK);
        out[version][4] = dbeta;
        out[version][5] = dg;
    }
    const char* names[6] = {"dq", "dk", "dv", "dkw", "dbeta", "dg"};
    char what[160];
    snprintf(what, sizeof what, "per-channel backward chunk kernel, decay strength %g, T=%d H=%d dk=%d dv=%d", strength,
             T, H, dk, dv);
    return report(what, names, out[1], out[0], 6);
}

int main(int argc, char** argv) {
    if (argc != 4) { fprintf(stderr, "usage: gdn_mma T dk dv\n"); return 1; }
    const int T = atoi(argv[1]), dk = atoi(argv[2]), dv = atoi(argv[3]);
    const int ok = check<GDN_DECAY_HEAD>(1, T, 2, dk, dv) & check<GDN_DECAY_CHANNEL>(1, T, 2, dk, dv) &
                   check_intra(1, T, 2, dk, dv, false) & check_intra(1, T, 2, dk, dv, true) &
                   check_intra_channel(1, T, 2, dk, dv, 2.0f) & check_intra_channel(1, T, 2, dk, dv, 16.0f) &
                   check_bwd_chunk_channel(1, T, 2, dk, dv, 2.0f) & check_bwd_chunk_channel(1, T, 2, dk, dv, 16.0f) &
                   check_bwd_chunk(1, T, 2, dk, dv, false) & check_bwd_chunk(1, T, 2, dk, dv, true);
    return ok ? 0 : 1;
}
