// dev/emu/gka_inputs.h: the gka core's inputs as dev/cuda/gka_core.cu draws them (unit q_hat, beta-scaled k and v,
// alpha and log decays, a near-1 decay stretch over the middle third of the sequence, dO uniform in [-1, 1]), and
// Included after kernels/gka.cuh (floatX, from_float).
#pragma once
#include <random>
#include <vector>

struct GkaInputs {
    std::vector<floatX> qkv, dO;   // [B*T, 2 H dk + H dv], [B*T, H dv]
    std::vector<float> alpha, g;   // [B*T, H]
};

// wide: beta log-uniform in (1e-3, 0.95) (f down to 1e-6, |x| up to 5e7) and dO times 1e-6, for the fp16 solve's
// range (the same draws otherwise)
static GkaInputs gka_emu_inputs(int B, int T, int H, int dk, int dv, bool wide = false) {
    const int DE = 2 * H * dk + H * dv;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> U(0.0f, 1.0f);
    std::normal_distribution<float> N(0.0f, 1.0f);
    GkaInputs in;
    in.qkv.resize((size_t)B * T * DE);
    in.dO.resize((size_t)B * T * H * dv);
    in.alpha.resize((size_t)B * T * H);
    in.g.resize((size_t)B * T * H);
    for (int r = 0; r < B * T; r++) for (int h = 0; h < H; h++) {
        const float u = U(rng);
        float beta = wide ? expf(logf(1e-3f) + u * logf(950.0f)) : 0.05f + 0.9f * u, nq = 0, nk = 0;
        std::vector<float> q(dk), k(dk);
        for (int j = 0; j < dk; j++) { q[j] = N(rng); k[j] = N(rng); nq += q[j] * q[j]; nk += k[j] * k[j]; }
        for (int j = 0; j < dk; j++) {
            in.qkv[(size_t)r * DE + h * dk + j] = from_float<floatX>(q[j] / sqrtf(nq));
            in.qkv[(size_t)r * DE + H * dk + h * dk + j] = from_float<floatX>((beta + 1e-6f) * k[j] / sqrtf(nk));
        }
        for (int j = 0; j < dv; j++) { in.qkv[(size_t)r * DE + 2 * H * dk + h * dv + j] = from_float<floatX>((beta + 1e-6f) * (2 * U(rng) - 1)); }
        for (int j = 0; j < dv; j++) {
            in.dO[(size_t)r * H * dv + h * dv + j] = from_float<floatX>((2 * U(rng) - 1) * (wide ? 1e-6f : 1.0f));
        }
        const int t = r % T;
        in.alpha[(size_t)r * H + h] = 0.05f + 0.9f * U(rng);
        in.g[(size_t)r * H + h] = (t >= T / 3 && t < 2 * T / 3) ? -1e-3f * U(rng) : -U(rng);
    }
    return in;
}
