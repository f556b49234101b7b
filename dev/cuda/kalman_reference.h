/*
dev/cuda/kalman_reference.h: the kalman filter in double precision, forward (spec 2.3) and the exact adjoint (spec
2.4) per lane, every state kept (no checkpoints, no floors but the forward's). The reference of the kernel lab
dev/cuda/kalman_scan.cu and of the emulator check dev/emu/kalman_filter.cu, which check the filter's outputs in
the order of KALMAN_OUTPUT_NAMES. Layouts as in kernels/kalman_scan.cuh, v with row stride Dk.
*/
#pragma once
#include <math.h>
#include <vector>

enum { KALMAN_YS, KALMAN_DV, KALMAN_DLV, KALMAN_DK, KALMAN_DQ, KALMAN_DABAR, KALMAN_DPBAR, KALMAN_OUTPUTS };
static const char* const KALMAN_OUTPUT_NAMES[KALMAN_OUTPUTS] = {"ys", "dv", "dLv", "dk", "dq", "dabar", "dpbar"};

// out[KALMAN_YS] = ys [B*T, Dk], ... out[KALMAN_DPBAR] = dpbar [Dk, N]: sized and written here
static void kalman_reference(std::vector<double> (&out)[KALMAN_OUTPUTS], const std::vector<float>& v,
                             const std::vector<float>& Lv, const std::vector<float>& k, const std::vector<float>& q,
                             const std::vector<float>& abar, const std::vector<float>& pbar,
                             const std::vector<float>& dys, int B, int T, int Dk, int N) {
    const size_t BT = (size_t)B * T;
    const size_t sizes[KALMAN_OUTPUTS] = {BT * Dk, BT * Dk, BT * Dk, BT * N, BT * N, (size_t)Dk * N, (size_t)Dk * N};
    for (int i = 0; i < KALMAN_OUTPUTS; i++) { out[i].assign(sizes[i], 0.0); }
    std::vector<double> &ys = out[KALMAN_YS], &dv = out[KALMAN_DV], &dLv = out[KALMAN_DLV], &dk = out[KALMAN_DK];
    std::vector<double> &dq = out[KALMAN_DQ], &dabar = out[KALMAN_DABAR], &dpbar = out[KALMAN_DPBAR];
    const double F = 1e-12;
    std::vector<double> lam((size_t)(T + 1) * N), eta((size_t)(T + 1) * N);
    for (int b = 0; b < B; b++) {
        for (int d = 0; d < Dk; d++) {
            for (int n = 0; n < N; n++) { lam[n] = 1.0; eta[n] = 0.0; }
            for (int t = 0; t < T; t++) {
                const size_t r = (size_t)b * T + t;
                double y = 0.0;
                for (int n = 0; n < N; n++) {
                    const double a = abar[(size_t)d * N + n], pb = pbar[(size_t)d * N + n];
                    const double lp = lam[(size_t)t * N + n], ep = eta[(size_t)t * N + n];
                    const double rho = 1.0 / fmax(fmax(a * a, F) + pb * lp, F);
                    const double kk = k[r * N + n];
                    const double et = a * rho * ep + (double)v[r * Dk + d] * Lv[r * Dk + d] * kk;
                    const double lt = lp * rho + (double)Lv[r * Dk + d] * kk * kk;
                    eta[(size_t)(t + 1) * N + n] = et;
                    lam[(size_t)(t + 1) * N + n] = lt;
                    y += q[r * N + n] * et / fmax(lt, F);
                }
                ys[r * Dk + d] = y;
            }
            std::vector<double> Gl(N, 0.0), Ge(N, 0.0);
            for (int t = T - 1; t >= 0; t--) {
                const size_t r = (size_t)b * T + t;
                const double dy = dys[r * Dk + d], vt = v[r * Dk + d], Lvt = Lv[r * Dk + d];
                double sLv = 0.0, sv = 0.0;
                for (int n = 0; n < N; n++) {
                    const double a = abar[(size_t)d * N + n], pb = pbar[(size_t)d * N + n];
                    const double lp = lam[(size_t)t * N + n], ep = eta[(size_t)t * N + n];
                    const double lt = lam[(size_t)(t + 1) * N + n], et = eta[(size_t)(t + 1) * N + n];
                    const double den = a * a + pb * lp, rho = 1.0 / den, var = 1.0 / lt;
                    const double kk = k[r * N + n], gmean = dy * q[r * N + n];
                    const double ge = Ge[n] + gmean * var, gl = Gl[n] - gmean * et * var * var;
                    dq[r * N + n] += dy * et * var;
                    const double gden = -(gl * lp + ge * ep * a) * rho * rho;
                    dabar[(size_t)d * N + n] += ge * ep * rho + 2.0 * a * gden;
                    dpbar[(size_t)d * N + n] += gden * lp;
                    Gl[n] = (gl * a * a - ge * ep * a * pb) * rho * rho;
                    Ge[n] = a * rho * ge;
                    sLv += gl * kk * kk + ge * vt * kk;
                    sv += ge * kk;
                    dk[r * N + n] += 2.0 * gl * Lvt * kk + ge * vt * Lvt;
                }
                dLv[r * Dk + d] = sLv;
                dv[r * Dk + d] = sv * Lvt;
            }
        }
    }
}

