/*
kernels/mixers/kalman.cuh: the kalman row of train_kla.cu's mixer table (kernels/mixers/mixer.cuh): Kalman Linear
Attention, spec/kalman.md, presets plain and mamba. The CPU version is kalman_forward / kalman_backward /
kalman_decode_step in train_kla.c; Dk = expand * C is the inner width (the spec's D). The layer, spec 1.3:

    h = x W_in^T                                  blocks z0 | gate (Dk each)
    zc = conv(z0) + b_conv, u = SiLU(zc)          depthwise causal conv, K taps, zeros before the sequence
    plain: s = u W_s^T = v | ls | kr | qr         mamba: ls_r | kr | qr = u W_s^T, ls = ls_r W_var^T, v = u
    k = kr/max(||kr||, 1e-12), q likewise, Lv = 1/(softplus(ls) + 1e-4)                       (fp32)
    abar, pbar from delta_raw, lambda_log, p_raw                                               (fp32)
    ys = filter(v, Lv, k, q, abar, pbar)          kernels/kalman_scan.cuh, fp32 state in both builds
    yg = (ys + lambda_skip u) SiLU(gate), out = yg W_out^T

Backward: spec 1.7 around the filter's adjoint (spec 2.4). Decode: spec 4 (conv cache and the state lam, eta).
*/
#ifndef TRAIN_KLA_KERNELS_MIXERS_KALMAN_CUH
#define TRAIN_KLA_KERNELS_MIXERS_KALMAN_CUH

#include "mixer.cuh"
#include "../matmul.cuh"
#include "../shortconv.cuh"
#include "../column_sum.cuh"
#include "../kalman_scan.cuh"

// one kalman layer's settings (spec 1.2-1.3; FORMATS.md)
typedef struct {
    int Dk, N, K, mamba, R;
    int Ws;   // sensor rows: plain 2 Dk + 2N, mamba R + 2N
} KalmanShape;

// what the forward saves for the backward (the decode step keeps the same buffers for one token)
typedef struct {
    floatX* h;       // (B,T,2Dk) in_proj output z0 | gate
    float* zc;       // (B,T,Dk) conv pre-activation (bias included)
    floatX* u;       // (B,T,Dk) SiLU(zc)
    floatX* s;       // plain (B,T,Ws) v | ls | kr | qr; mamba (B,T,R) ls_r
    floatX* kqr;     // mamba (B,T,2N) kr | qr (plain: inside s)
    floatX* ls;      // mamba (B,T,Dk) ls_r W_var^T (plain: inside s)
    float *Lv, *k, *q, *kn, *qn;   // (B,T,Dk), (B,T,N) x2, (B,T) x2
    float *abar, *pbar;            // (Dk,N)
    float* ck;       // the filter's checkpoints (kernels/kalman_scan.cuh; NULL in decode)
    float* ys;       // (B,T,Dk) filter output
    floatX* yg;      // (B,T,Dk) out_proj input
} KalmanActs;

typedef struct {
    float *conv, *lam, *eta;   // (K-1, Dk) the last pre-conv inputs z0, oldest first; (Dk, N) x2 the filter state
    KalmanActs step;           // the step's buffers (B = T = 1)
} KalmanDecodeState;

static void kalman_build(void* settings, const Config* c, int layer) {
    (void)layer;
    KalmanShape* s = (KalmanShape*)settings;
    s->Dk = c->kalman_expand * c->channels;
    s->N = c->kalman_n;
    s->K = c->conv_size;
    s->mamba = c->kalman_preset == KALMAN_MAMBA;
    s->R = c->kalman_rank;
    s->Ws = s->mamba ? s->R + 2 * s->N : 2 * s->Dk + 2 * s->N;
    kalman_group(s->N);   // dies with a message if the filter kernels do not run this N
}

// where v, ls and kr | qr live, per preset (spec 1.3 step 3)
static const floatX* kalman_v(const KalmanShape* s, const KalmanActs* a, int* ld) { *ld = s->mamba ? s->Dk : s->Ws; return s->mamba ? a->u : a->s; }
static const floatX* kalman_ls(const KalmanShape* s, const KalmanActs* a, int* ld) { *ld = s->mamba ? s->Dk : s->Ws; return s->mamba ? a->ls : a->s + s->Dk; }
static const floatX* kalman_kqr(const KalmanShape* s, const KalmanActs* a, int* ld) { *ld = s->mamba ? 2 * s->N : s->Ws; return s->mamba ? a->kqr : a->s + 2 * s->Dk; }

static void kalman_carve_acts(KalmanActs* a, const KalmanShape* s, char* base, size_t* cur, int B, int T, int checkpoints) {
    size_t BT = (size_t)B * T, Dk = s->Dk, N = s->N;
    a->h = carve_x(base, cur, BT * 2 * Dk);
    a->zc = carve_f(base, cur, BT * Dk);
    a->u = carve_x(base, cur, BT * Dk);
    a->s = carve_x(base, cur, BT * (s->mamba ? s->R : s->Ws));
    a->kqr = s->mamba ? carve_x(base, cur, BT * 2 * N) : NULL;
    a->ls = s->mamba ? carve_x(base, cur, BT * Dk) : NULL;
    a->Lv = carve_f(base, cur, BT * Dk);
    a->k = carve_f(base, cur, BT * N);
    a->q = carve_f(base, cur, BT * N);
    a->kn = carve_f(base, cur, BT);
    a->qn = carve_f(base, cur, BT);
    a->abar = carve_f(base, cur, Dk * N);
    a->pbar = carve_f(base, cur, Dk * N);
    a->ck = checkpoints ? carve_f(base, cur, kalman_checkpoint_floats(B, T, s->Dk, s->N)) : NULL;
    a->ys = carve_f(base, cur, BT * Dk);
    a->yg = carve_x(base, cur, BT * Dk);
}

static void kalman_layout_acts(void* acts, const void* settings, const Config* c, char* base, size_t* cur, int B, int T) {
    (void)c;
    kalman_carve_acts((KalmanActs*)acts, (const KalmanShape*)settings, base, cur, B, T, 1);
}

// the backward's own scratch, carved in this order from MixerContext.own
typedef struct {
    floatX *dyg, *dh, *du;            // (B,T,Dk), (B,T,2Dk), (B,T,Dk)
    floatX *ds, *dls, *dkq;           // plain: ds (B,T,Ws); mamba: ds (B,T,R) d ls_r, dls (B,T,Dk), dkq (B,T,2N)
    float *dys, *skip, *dv, *dLv, *dzc;   // (B,T,Dk) fp32 each; skip = dy1 u, the terms of dlambda_skip
    float *dk, *dq;                   // (B,T,N)
    float *dabar, *dpbar, *skip_cols; // (Dk,N) x2, (Dk) column sums of skip
} KalmanScratch;

static void kalman_layout_scratch(KalmanScratch* g, const KalmanShape* s, char* base, size_t* cur, int B, int T) {
    size_t BT = (size_t)B * T, Dk = s->Dk, N = s->N;
    g->dyg = carve_x(base, cur, BT * Dk);
    g->dh = carve_x(base, cur, BT * 2 * Dk);
    g->du = carve_x(base, cur, BT * Dk);
    g->ds = carve_x(base, cur, BT * (s->mamba ? s->R : s->Ws));
    g->dls = s->mamba ? carve_x(base, cur, BT * Dk) : NULL;
    g->dkq = s->mamba ? carve_x(base, cur, BT * 2 * N) : NULL;
    g->dys = carve_f(base, cur, BT * Dk);
    g->skip = carve_f(base, cur, BT * Dk);
    g->dv = carve_f(base, cur, BT * Dk);
    g->dLv = carve_f(base, cur, BT * Dk);
    g->dzc = carve_f(base, cur, BT * Dk);
    g->dk = carve_f(base, cur, BT * N);
    g->dq = carve_f(base, cur, BT * N);
    g->dabar = carve_f(base, cur, Dk * N);
    g->dpbar = carve_f(base, cur, Dk * N);
    g->skip_cols = carve_f(base, cur, Dk);
}

static void kalman_scratch_bytes(const void* settings, const Config* c, int B, int T, size_t* own, size_t* reduce,
                                 size_t* work) {
    (void)c;
    const KalmanShape* s = (const KalmanShape*)settings;
    KalmanScratch unused;
    size_t cur = 0;
    kalman_layout_scratch(&unused, s, NULL, &cur, B, T);
    *own = cur;
    size_t r = shortconv_backward_scratch_bytes(B, T, s->Dk, s->K);
    size_t cs = (size_t)colsum_splits(B * T) * s->Dk * sizeof(float);
    *reduce = r > cs ? r : cs;
    // the filter's: the backward's partial sums, or the forward's segment summaries when those are larger
    const size_t fwd = kalman_filter_forward_scratch_bytes(B, s->Dk, s->N, kalman_segments(B, T, s->Dk, s->N, 0));
    const size_t bwd = kalman_filter_backward_scratch_bytes(B, T, s->Dk, s->N, kalman_segments(B, T, s->Dk, s->N, 1));
    *work = fwd > bwd ? fwd : bwd;
}

// ----------------------------------------------------------------------------------------------------------
// per-token kernels (one thread per element or per token; pure maps, so independent of the launch shape)

// spec 1.3 step 2: zc = b_conv + sum_j w[d, j] z0[t - (K-1) + j] (zeros before the sequence), u = SiLU(zc)
__global__ void kalman_conv_forward_kernel(float* zc, floatX* u, const floatX* h, const float* conv_w,
                                           const float* conv_b, int BT, int T, int Dk, int K) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * Dk) { return; }
    const int r = (int)(idx / Dk), d = (int)(idx % Dk), t = r % T;
    float z = conv_b[d];
    for (int j = 0; j < K; j++) {
        const int back = K - 1 - j;
        if (back <= t) { z += conv_w[d * K + j] * to_float(h[(size_t)(r - back) * 2 * Dk + d]); }
    }
    zc[idx] = z;
    u[idx] = from_float<floatX>(shortconv_silu(z));
}

// decode: the same sum with the taps before the token read from the cache (K-1, Dk), which then shifts
__global__ void kalman_conv_decode_kernel(float* zc, floatX* u, float* cache, const floatX* h, const float* conv_w,
                                          const float* conv_b, int Dk, int K) {
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= Dk) { return; }
    const float x = to_float(h[d]);
    float z = conv_b[d];
    for (int j = 0; j < K - 1; j++) { z += conv_w[d * K + j] * cache[(size_t)j * Dk + d]; }
    z += conv_w[d * K + K - 1] * x;
    zc[d] = z;
    u[d] = from_float<floatX>(shortconv_silu(z));
    if (K > 1) {
        for (int j = 0; j < K - 2; j++) { cache[(size_t)j * Dk + d] = cache[(size_t)(j + 1) * Dk + d]; }
        cache[(size_t)(K - 2) * Dk + d] = x;
    }
}

// spec 1.3 step 4, one thread per token: k = kr / max(||kr||, 1e-12), q likewise
__global__ void kalman_kq_forward_kernel(float* k, float* q, float* kn, float* qn, const floatX* kqr, int ld, int BT,
                                         int N) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= BT) { return; }
    const floatX* kr = kqr + (size_t)r * ld;
    const floatX* qr = kr + N;
    float sk = 0.0f, sq = 0.0f;
    for (int n = 0; n < N; n++) {
        const float a = to_float(kr[n]), b = to_float(qr[n]);
        sk += a * a;
        sq += b * b;
    }
    const float nk = fmaxf(sqrtf(sk), KALMAN_FLOOR), nq = fmaxf(sqrtf(sq), KALMAN_FLOOR);
    kn[r] = nk;
    qn[r] = nq;
    for (int n = 0; n < N; n++) {
        k[(size_t)r * N + n] = to_float(kr[n]) / nk;
        q[(size_t)r * N + n] = to_float(qr[n]) / nq;
    }
}

// spec 1.3 step 5: Lv = 1 / (softplus(ls) + 1e-4)
__global__ void kalman_lv_forward_kernel(float* Lv, const floatX* ls, int ld, int BT, int Dk) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * Dk) { return; }
    const size_t r = idx / Dk, d = idx % Dk;
    Lv[idx] = 1.0f / (softplusf_dev(to_float(ls[r * ld + d])) + 1e-4f);
}

// spec 1.3 step 8: yg = (ys + lambda_skip u) SiLU(gate), gate = h[:, Dk:2Dk]
__global__ void kalman_gate_forward_kernel(floatX* yg, const float* ys, const floatX* u, const floatX* h,
                                           const float* lambda_skip, int BT, int Dk) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * Dk) { return; }
    const size_t r = idx / Dk, d = idx % Dk;
    const float g = to_float(h[r * 2 * Dk + Dk + d]);
    yg[idx] = from_float<floatX>((ys[idx] + lambda_skip[0] * to_float(u[idx])) * g * sigmoidf_dev(g));
}

// backward of the gate and the skip: dgate into dh[:, Dk:2Dk]; dys = dy1 = dyg SiLU(gate); skip = dy1 u
__global__ void kalman_gate_backward_kernel(floatX* dh, float* dys, float* skip, const floatX* dyg, const float* ys,
                                            const floatX* u, const floatX* h, const float* lambda_skip, int BT,
                                            int Dk) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * Dk) { return; }
    const size_t r = idx / Dk, d = idx % Dk;
    const float g = to_float(h[r * 2 * Dk + Dk + d]), sg = sigmoidf_dev(g), dy = to_float(dyg[idx]);
    const float uu = to_float(u[idx]), y1 = ys[idx] + lambda_skip[0] * uu;
    dh[r * 2 * Dk + Dk + d] = from_float<floatX>(dy * y1 * sg * (1.0f + g * (1.0f - sg)));
    const float dy1 = dy * g * sg;
    dys[idx] = dy1;
    skip[idx] = dy1 * uu;
}

// per element: dls = dLv * d(1/(softplus(ls) + 1e-4))/dls = -dLv Lv^2 softplus'(ls); plain: dv into the v block
// of ds; du = lambda_skip dy1 (+ dv in the mamba preset, where v = u)
__global__ void kalman_sensor_backward_kernel(floatX* dls, int ld_dls, floatX* dv_out, int ld_dv, floatX* du,
                                              const float* dLv, const float* dv, const float* dys, const float* Lv,
                                              const floatX* ls, int ld_ls, const float* lambda_skip, int mamba,
                                              int BT, int Dk) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * Dk) { return; }
    const size_t r = idx / Dk, d = idx % Dk;
    const float lv = Lv[idx];
    dls[r * ld_dls + d] = from_float<floatX>(dLv[idx] * (-lv * lv * dsoftplusf_dev(to_float(ls[r * ld_ls + d]))));
    float g = lambda_skip[0] * dys[idx];
    if (mamba) { g += dv[idx]; } else { dv_out[r * ld_dv + d] = from_float<floatX>(dv[idx]); }
    du[idx] = from_float<floatX>(g);
}

// backward of the L2 norms, one thread per token: dkr = (dk - k (k . dk)) / kn (no projection where the floor binds)
__global__ void kalman_kq_backward_kernel(floatX* dkqr, int ld, const float* dk, const float* dq, const float* k,
                                          const float* q, const float* kn, const float* qn, int BT, int N) {
    const int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= BT) { return; }
    const float* kt = k + (size_t)r * N;
    const float* qt = q + (size_t)r * N;
    const float* dkt = dk + (size_t)r * N;
    const float* dqt = dq + (size_t)r * N;
    float ck = 0.0f, cq = 0.0f;
    for (int n = 0; n < N; n++) { ck += kt[n] * dkt[n]; cq += qt[n] * dqt[n]; }
    if (kn[r] <= KALMAN_FLOOR) { ck = 0.0f; }
    if (qn[r] <= KALMAN_FLOOR) { cq = 0.0f; }
    floatX* out = dkqr + (size_t)r * ld;
    for (int n = 0; n < N; n++) {
        out[n] = from_float<floatX>((dkt[n] - kt[n] * ck) / kn[r]);
        out[N + n] = from_float<floatX>((dqt[n] - qt[n] * cq) / qn[r]);
    }
}

// u = SiLU(zc): dzc = du SiLU'(zc)
__global__ void kalman_dsilu_kernel(float* dzc, const floatX* du, const float* zc, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { dzc[i] = to_float(du[i]) * shortconv_dsilu(zc[i]); }
}

// dconv_w partials, as kernels/shortconv.cuh: one row of Dk*K floats per (sequence, token tile);
// grid (ceil(Dk / SHORTCONV_BLOCK), ceil(T / SHORTCONV_T_TILE), B)
__global__ void kalman_conv_dw_kernel(float* dw_partial, const float* dzc, const floatX* h, int T, int Dk, int K) {
    const int d = blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= Dk) { return; }
    const int b = blockIdx.z, tile = blockIdx.y;
    const int t0 = tile * SHORTCONV_T_TILE, t1 = min(t0 + SHORTCONV_T_TILE, T);
    float acc[SHORTCONV_MAX_W];
    for (int j = 0; j < K; j++) { acc[j] = 0.0f; }
    for (int t = t0; t < t1; t++) {
        const float dz = dzc[((size_t)b * T + t) * Dk + d];
        for (int j = 0; j < K; j++) {
            const int back = K - 1 - j;
            if (back <= t) { acc[j] += dz * to_float(h[((size_t)b * T + t - back) * 2 * Dk + d]); }
        }
    }
    float* part = dw_partial + ((size_t)b * gridDim.y + tile) * Dk * K + (size_t)d * K;
    for (int j = 0; j < K; j++) { part[j] = acc[j]; }
}

static unsigned kalman_grid(size_t n) { return (unsigned)ceil_div_z(n, 256); }

// ----------------------------------------------------------------------------------------------------------
// the layer

// spec 1.3 steps 3-6 on the tokens of a (u filled): the sensor projection, k, q, Lv, the dynamics
static void kalman_sensor_forward(const MixerContext* mc, const KalmanShape* s, const KalmanParams* p, KalmanActs* a,
                                  int BT) {
    cudaStream_t st = mc->stream;
    const floatX* ws = X(mc, p->sensor_w);
    if (s->mamba) {
        matmul_forward(a->s, a->u, ws, NULL, BT, s->Dk, s->R, NULL, st);
        matmul_forward(a->kqr, a->u, ws + (size_t)s->R * s->Dk, NULL, BT, s->Dk, 2 * s->N, NULL, st);
        matmul_forward(a->ls, a->s, X(mc, p->var_w), NULL, BT, s->R, s->Dk, NULL, st);
    } else {
        matmul_forward(a->s, a->u, ws, NULL, BT, s->Dk, s->Ws, NULL, st);
    }
    int ld_kq, ld_ls;
    const floatX* kqr = kalman_kqr(s, a, &ld_kq);
    const floatX* ls = kalman_ls(s, a, &ld_ls);
    kalman_kq_forward_kernel<<<ceil_div(BT, 256), 256, 0, st>>>(a->k, a->q, a->kn, a->qn, kqr, ld_kq, BT, s->N);
    kalman_lv_forward_kernel<<<kalman_grid((size_t)BT * s->Dk), 256, 0, st>>>(a->Lv, ls, ld_ls, BT, s->Dk);
    cudaCheckLaunch();
    kalman_dynamics(a->abar, a->pbar, p->delta_raw, p->lambda_log, p->p_raw, s->Dk * s->N, st);
}

// spec 1.3 step 8: skip, gate, out_proj
static void kalman_output_forward(const MixerContext* mc, const KalmanShape* s, const KalmanParams* p, KalmanActs* a,
                                  floatX* out, int BT) {
    kalman_gate_forward_kernel<<<kalman_grid((size_t)BT * s->Dk), 256, 0, mc->stream>>>(a->yg, a->ys, a->u, a->h,
                                                                                        p->lambda_skip, BT, s->Dk);
    cudaCheckLaunch();
    matmul_forward(out, a->yg, X(mc, p->out_proj_w), NULL, BT, s->Dk, mc->config->channels, NULL, mc->stream);
}

static void kalman_forward(const MixerContext* mc, const void* settings, const LayerParams* lp, void* acts,
                           floatX* out, const floatX* x, int B, int T) {
    const KalmanShape* s = (const KalmanShape*)settings;
    const KalmanParams* p = &lp->kalman;
    KalmanActs* a = (KalmanActs*)acts;
    int BT = B * T, ldv;
    cudaStream_t st = mc->stream;
    matmul_forward(a->h, x, X(mc, p->in_proj_w), NULL, BT, mc->config->channels, 2 * s->Dk, NULL, st);
    kalman_conv_forward_kernel<<<kalman_grid((size_t)BT * s->Dk), 256, 0, st>>>(a->zc, a->u, a->h, p->conv_w,
                                                                                p->conv_b, BT, T, s->Dk, s->K);
    cudaCheckLaunch();
    profile_mark("fwd kalman in_proj + conv");
    kalman_sensor_forward(mc, s, p, a, BT);
    profile_mark("fwd kalman sensor");
    const floatX* v = kalman_v(s, a, &ldv);
    kalman_filter_forward(a->ys, a->ck, NULL, NULL, 1, v, ldv, a->Lv, a->k, a->q, a->abar, a->pbar, B, T, s->Dk,
                          s->N, kalman_segments(B, T, s->Dk, s->N, 0), mc->work, st);
    profile_mark("fwd kalman filter");
    kalman_output_forward(mc, s, p, a, out, BT);
    profile_mark("fwd kalman gate + out_proj");
}

// spec 1.7 + 2.4. dout (B,T,C) -> dx (B,T,C) overwritten; parameter gradients accumulate in fixed-order sums.
static void kalman_backward(const MixerContext* mc, const void* settings, const LayerParams* lp, LayerParams* lg,
                            const void* acts, floatX* dx, const floatX* dout, const floatX* x, int B, int T) {
    const int C = mc->config->channels;
    const KalmanShape* sh = (const KalmanShape*)settings;
    const KalmanParams* p = &lp->kalman;
    KalmanParams* gr = &lg->kalman;
    const KalmanActs* a = (const KalmanActs*)acts;
    KalmanScratch s;
    size_t cur = 0;
    kalman_layout_scratch(&s, sh, (char*)mc->own, &cur, B, T);
    const int BT = B * T, Dk = sh->Dk, N = sh->N, K = sh->K;
    const size_t BTD = (size_t)BT * Dk;
    cudaStream_t st = mc->stream;
    // out = yg W_out^T
    matmul_backward(s.dyg, gr->out_proj_w, NULL, NULL, dout, a->yg, X(mc, p->out_proj_w), BT, Dk, C, 0, st);
    // gate and skip; dlambda_skip = sum of dy1 u (columns, then the column sums)
    kalman_gate_backward_kernel<<<kalman_grid(BTD), 256, 0, st>>>(s.dh, s.dys, s.skip, s.dyg, a->ys, a->u, a->h,
                                                                   p->lambda_skip, BT, Dk);
    cudaCheckLaunch();
    ordered_column_sum(s.skip_cols, mc->reduce, s.skip, BT, Dk, 0, st);
    ordered_column_sum(gr->lambda_skip, mc->reduce, s.skip_cols, Dk, 1, 1, st);
    profile_mark("bwd kalman out_proj + gate");
    // the filter (spec 2.4)
    int ldv, ld_ls, ld_kq;
    const floatX* v = kalman_v(sh, a, &ldv);
    kalman_filter_backward(s.dv, s.dLv, s.dk, s.dq, s.dabar, s.dpbar, s.dys, a->ck, v, ldv, a->Lv, a->k, a->q,
                           a->abar, a->pbar, B, T, Dk, N, kalman_segments(B, T, Dk, N, 1), mc->work, st);
    profile_mark("bwd kalman filter");
    // Lv, the L2 norms and v into the sensor output's gradient; du = lambda_skip dy1 (+ dv in mamba)
    const floatX* ls = kalman_ls(sh, a, &ld_ls);
    floatX* dls = sh->mamba ? s.dls : s.ds + Dk;
    floatX* dkqr = sh->mamba ? s.dkq : s.ds + 2 * Dk;
    ld_kq = sh->mamba ? 2 * N : sh->Ws;
    kalman_sensor_backward_kernel<<<kalman_grid(BTD), 256, 0, st>>>(dls, sh->mamba ? Dk : sh->Ws, s.ds, sh->Ws, s.du,
                                                                     s.dLv, s.dv, s.dys, a->Lv, ls, ld_ls,
                                                                     p->lambda_skip, sh->mamba, BT, Dk);
    kalman_kq_backward_kernel<<<ceil_div(BT, 256), 256, 0, st>>>(dkqr, ld_kq, s.dk, s.dq, a->k, a->q, a->kn, a->qn,
                                                                  BT, N);
    cudaCheckLaunch();
    // the sensor projection (mamba: ls = ls_r W_var^T first), its input gradient added to du
    const floatX* ws = X(mc, p->sensor_w);
    if (sh->mamba) {
        matmul_backward(s.ds, gr->var_w, NULL, NULL, s.dls, a->s, X(mc, p->var_w), BT, sh->R, Dk, 0, st);
        matmul_backward(s.du, gr->sensor_w, NULL, NULL, s.ds, a->u, ws, BT, Dk, sh->R, 1, st);
        matmul_backward(s.du, gr->sensor_w + (size_t)sh->R * Dk, NULL, NULL, s.dkq, a->u, ws + (size_t)sh->R * Dk, BT,
                        Dk, 2 * N, 1, st);
    } else {
        matmul_backward(s.du, gr->sensor_w, NULL, NULL, s.ds, a->u, ws, BT, Dk, sh->Ws, 1, st);
    }
    profile_mark("bwd kalman sensor");
    // SiLU, conv bias, conv weights (per-tile partials summed in order), conv input into dh[:, 0:Dk]
    kalman_dsilu_kernel<<<kalman_grid(BTD), 256, 0, st>>>(s.dzc, s.du, a->zc, BTD);
    cudaCheckLaunch();
    ordered_column_sum(gr->conv_b, mc->reduce, s.dzc, BT, Dk, 1, st);
    const dim3 grid(ceil_div(Dk, SHORTCONV_BLOCK), ceil_div(T, SHORTCONV_T_TILE), B);
    kalman_conv_dw_kernel<<<grid, SHORTCONV_BLOCK, 0, st>>>(mc->reduce, s.dzc, a->h, T, Dk, K);
    cudaCheckLaunch();
    shortconv_dw_reduce_kernel<<<ceil_div(Dk * K, 32), dim3(32, SHORTCONV_RED_ROWS), 0, st>>>(
        gr->conv_w, mc->reduce, B * ceil_div(T, SHORTCONV_T_TILE), Dk * K);
    cudaCheckLaunch();
    shortconv_dispatch_w(K, [&](auto w) {
        shortconv_dproj_kernel<decltype(w)::value><<<kalman_grid(BTD), 256, 0, st>>>(s.dh, 2 * Dk, s.dzc, p->conv_w,
                                                                                     BT, T, Dk);
    });
    cudaCheckLaunch();
    // h = x W_in^T
    matmul_backward(dx, gr->in_proj_w, NULL, NULL, s.dh, x, X(mc, p->in_proj_w), BT, C, 2 * Dk, 0, st);
    // the static dynamics (spec 1.7)
    kalman_dynamics_backward(gr->delta_raw, gr->lambda_log, gr->p_raw, s.dabar, s.dpbar, a->abar, p->delta_raw,
                             p->lambda_log, p->p_raw, Dk * N, st);
    profile_mark("bwd kalman conv + in_proj");
}

static void kalman_layout_decode(void* state, const void* settings, const Config* c, char* base, size_t* cur, int max_len) {
    (void)c;
    (void)max_len;
    KalmanDecodeState* d = (KalmanDecodeState*)state;
    const KalmanShape* s = (const KalmanShape*)settings;
    d->conv = carve_f(base, cur, (size_t)(s->K - 1) * s->Dk);
    d->lam = carve_f(base, cur, (size_t)s->Dk * s->N);
    d->eta = carve_f(base, cur, (size_t)s->Dk * s->N);
    kalman_carve_acts(&d->step, s, base, cur, 1, 1, 0);
}

// spec 4: the layer on one token; the conv cache starts at zero and the filter state at the prior (t == 0)
static void kalman_decode_step(const MixerContext* mc, const void* settings, const LayerParams* lp, void* state,
                               floatX* out, const floatX* x, int t) {
    const KalmanShape* s = (const KalmanShape*)settings;
    const KalmanParams* p = &lp->kalman;
    KalmanDecodeState* d = (KalmanDecodeState*)state;
    KalmanActs* a = &d->step;
    cudaStream_t st = mc->stream;
    int ldv;
    matmul_forward(a->h, x, X(mc, p->in_proj_w), NULL, 1, mc->config->channels, 2 * s->Dk, NULL, st);
    kalman_conv_decode_kernel<<<ceil_div(s->Dk, 256), 256, 0, st>>>(a->zc, a->u, d->conv, a->h, p->conv_w, p->conv_b,
                                                                    s->Dk, s->K);
    cudaCheckLaunch();
    kalman_sensor_forward(mc, s, p, a, 1);
    const floatX* v = kalman_v(s, a, &ldv);
    kalman_filter_forward(a->ys, NULL, d->lam, d->eta, t == 0, v, ldv, a->Lv, a->k, a->q, a->abar, a->pbar, 1, 1,
                          s->Dk, s->N, 1, NULL, st);
    kalman_output_forward(mc, s, p, a, out, 1);
}

static const MixerOps KALMAN_MIXER = {"kalman", kalman_build, kalman_layout_acts, kalman_scratch_bytes,
                                      kalman_forward, kalman_backward, kalman_layout_decode, kalman_decode_step};

#endif // TRAIN_KLA_KERNELS_MIXERS_KALMAN_CUH
