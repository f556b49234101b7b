/*
kernels/mixers/gka.cuh: the gka row of train_kla.cu's mixer table (kernels/mixers/mixer.cuh), for `gka` (Gated
KalmaNet), with the GQA option (--gka-kv-heads: Hkv key/value heads read by H query heads). The layer, spec 2.3:

    proj = x W_in^T                                    blocks q | k | v | gate | a | b | alpha (FORMATS.md)
    u = SiLU(causal conv(proj[q|k|v]))                 kernels/shortconv.cuh (the D un-expanded channels)
    q_hat, k, v (GQA expand), beta, alpha, g (fp32)    kernels/gka.cuh (features)
    o = s U_t^T (q_hat + alpha (CHEB(H_t, q_hat) - q_hat))   kernels/gka.cuh (core, recurrent; H_0 = U_0 = 0)
    out = W_o gated_rmsnorm(o, gate)                   kernels/gated_norm.cuh (swish gate, as gdn)

Backward: spec 3.2-3.3, the core's implicit-differentiation backward from states checkpointed every 64 tokens.
Decode: spec 7 (conv cache, H and U). This is the first GPU slice of gka: its core is the sequential recurrence
(one CTA per (sequence, head)); the chunkwise tensor-core algorithm of spec 5 is the next one.
*/
#ifndef TRAIN_KLA_KERNELS_MIXERS_GKA_CUH
#define TRAIN_KLA_KERNELS_MIXERS_GKA_CUH

#include "mixer.cuh"
#include "../matmul.cuh"
#include "../shortconv.cuh"
#include "../gated_norm.cuh"
#include "../gka.cuh"

// one gka layer's settings (spec/gka.md 2.1-2.4; FORMATS.md in_proj blocks)
typedef struct {
    int H, Hkv, dk, dv, W;
    int D;      // H*dk + Hkv*(dk + dv): the conv'ed channels q | k | v, un-expanded
    int DE;     // 2*H*dk + H*dv: the core inputs q_hat | k | v, expanded to H heads
    int P;      // D + H*dv + 3*H: the in_proj rows
    int ldP;    // P rounded up to a multiple of 8: the row stride of proj and dproj
    int iters;  // r, Chebyshev iterations per solve
    float ridge, onorm_eps;
} GKAShape;

// what the forward saves for the backward
typedef struct {
    floatX *proj, *u, *qkv, *o, *y;                  // (B,T,ldP), (B,T,D), (B,T,DE), (B,T,H*dv) x2
    float *qn, *kn, *beta, *alpha, *g, *f, *rstd;    // (B,T,H) each
    float *x, *Hck, *Uck;                            // (B,T,H*dk) CHEB solutions; segment-start states
    __nv_bfloat16* H0t;                              // the wgmma solves' H0 tiles (bf16 build; else NULL)
    float* h0sq;                                     // (B,H,NT) their ||H0||^2
} GKAActs;

typedef struct {
    float *conv, *Hs, *Us;                           // zeroed at start: (W-1, D) pre-conv inputs, (H,dk,dk), (H,dk,dv)
    floatX *proj, *u, *qkv, *o, *y;                  // the step's (P), (D), (DE), (H*dv) x2
    float *qn, *kn, *beta, *alpha, *g, *f, *rstd;    // (H) each
    float* x;                                        // (H*dk)
} GKADecodeState;

static void gka_build(void* settings, const Config* c, int layer) {
    (void)layer;
    GKAShape* s = (GKAShape*)settings;
    s->H = c->lin_heads;
    s->Hkv = c->gka_kv_heads;
    s->dk = c->lin_dk;
    s->dv = c->lin_dv;
    s->W = c->conv_size;
    s->D = s->H * s->dk + s->Hkv * (s->dk + s->dv);
    s->DE = 2 * s->H * s->dk + s->H * s->dv;
    s->P = s->D + s->H * s->dv + 3 * s->H;
    s->ldP = rows_padded(s->P);
    s->iters = c->gka_iters;
    s->ridge = c->gka_ridge;
    s->onorm_eps = c->gka_onorm_eps;
}

static void gka_layout_acts(void* acts, const void* settings, const Config* c, char* base, size_t* cur, int B, int T) {
    (void)c;
    GKAActs* a = (GKAActs*)acts;
    const GKAShape* s = (const GKAShape*)settings;
    size_t BT = (size_t)B * T, HV = (size_t)s->H * s->dv, NS = (size_t)B * s->H * gka_segments(T);
    a->proj = carve_x(base, cur, BT * s->ldP);
    a->u = carve_x(base, cur, BT * s->D);
    a->qkv = carve_x(base, cur, BT * s->DE);
    a->o = carve_x(base, cur, BT * HV);
    a->y = carve_x(base, cur, BT * HV);
    a->qn = carve_f(base, cur, BT * s->H);
    a->kn = carve_f(base, cur, BT * s->H);
    a->beta = carve_f(base, cur, BT * s->H);
    a->alpha = carve_f(base, cur, BT * s->H);
    a->g = carve_f(base, cur, BT * s->H);
    a->f = carve_f(base, cur, BT * s->H);
    a->rstd = carve_f(base, cur, BT * s->H);
    a->x = carve_f(base, cur, BT * s->H * s->dk);
    a->Hck = carve_f(base, cur, NS * s->dk * s->dk);
    a->Uck = carve_f(base, cur, NS * s->dk * s->dv);
    const bool tiles = GKA_PRODUCTS >= GKA_PRODUCTS_WGMMA;   // kernels/gka.cuh's gka_h0_tiles_kernel
    a->H0t = tiles ? (__nv_bfloat16*)carve(base, cur, gka_h0_tiles_elems(B, T, s->H) * sizeof(__nv_bfloat16)) : NULL;
    a->h0sq = tiles ? carve_f(base, cur, NS) : NULL;
}

// the backward's own scratch, carved in this order from MixerContext.own
typedef struct {
    floatX *dproj, *dy, *dout_o;        // (B,T,ldP), (B,T,H*dv) x2
    float *dqkv, *du, *dalpha, *dg;     // (B,T,DE), (B,T,D), (B,T,H) x2
    float* core;                        // the core backward's segment states
} GKAScratch;

static void gka_layout_scratch(GKAScratch* g, const GKAShape* s, char* base, size_t* cur, int B, int T) {
    size_t BT = (size_t)B * T, HV = (size_t)s->H * s->dv;
    g->dproj = carve_x(base, cur, BT * s->ldP);
    g->dy = carve_x(base, cur, BT * HV);
    g->dout_o = carve_x(base, cur, BT * HV);
    g->dqkv = carve_f(base, cur, BT * s->DE);
    g->du = carve_f(base, cur, BT * s->D);
    g->dalpha = carve_f(base, cur, BT * s->H);
    g->dg = carve_f(base, cur, BT * s->H);
    g->core = carve_f(base, cur, gka_core_backward_scratch_floats(B, T, s->H, s->dk, s->dv));
}

static void gka_scratch_bytes(const void* settings, const Config* c, int B, int T, size_t* own, size_t* reduce,
                              size_t* work) {
    (void)c;
    const GKAShape* s = (const GKAShape*)settings;
    GKAScratch unused;
    size_t cur = 0;
    int BT = B * T;
    gka_layout_scratch(&unused, s, NULL, &cur, B, T);
    *own = cur;
    const size_t needs[3] = {shortconv_backward_scratch_bytes(B, T, s->D, s->W),
                             gka_features_backward_scratch_bytes(BT, s->H),
                             gated_rmsnorm_backward_scratch_bytes(BT, s->H, s->dv)};
    *reduce = 0;
    for (int i = 0; i < 3; i++) { if (needs[i] > *reduce) { *reduce = needs[i]; } }
    *work = 0;
}

// spec/gka.md 2.3
static void gka_forward(const MixerContext* mc, const void* settings, const LayerParams* lp, void* acts, floatX* out,
                        const floatX* x, int B, int T) {
    const Config* c = mc->config;
    const GKAShape* s = (const GKAShape*)settings;
    const GKAParams* p = &lp->gka;
    GKAActs* a = (GKAActs*)acts;
    int BT = B * T, HV = s->H * s->dv;
    cudaStream_t st = mc->stream;
    // step 1: the fused projection, blocks q | k | v | gate | a | b | alpha
    in_proj_forward(mc, p->in_proj_w, a->proj, s->ldP, x, BT);
    profile_mark("fwd gka in_proj matmul");
    // steps 2-7: causal conv + SiLU on the un-expanded q|k|v, GQA expand, l2 norms, beta, alpha, g (fp32)
    shortconv_silu_forward(a->u, a->proj, s->ldP, p->conv_w, B, T, s->D, s->W, st);
    gka_features_forward(a->qkv, a->qn, a->kn, a->beta, a->alpha, a->g, a->u, a->proj, s->ldP, p->b_bias,
                         p->alpha_bias, p->A_log, p->dt_bias, BT, s->H, s->Hkv, s->dk, s->dv, st);
    profile_mark("fwd gka conv + features");
    // step 8: the core (spec 3), H_0 = U_0 = 0
    gka_core_forward(a->o, a->x, a->f, a->Hck, a->Uck, a->H0t, a->h0sq, a->qkv, a->alpha, a->g, B, T, s->H, s->dk,
                     s->dv, s->iters, s->ridge, GKA_PRODUCTS, st);
    profile_mark("fwd gka chunk core");
    // steps 9-10: gated RMSNorm with the gate block, then the output projection
    gated_rmsnorm_forward(a->y, a->rstd, a->o, a->proj + s->D, s->ldP, p->onorm_w, BT, s->H, s->dv, s->onorm_eps, st);
    matmul_forward(out, a->y, X(mc, p->out_proj_w), NULL, BT, HV, c->channels, NULL, st);
    profile_mark("fwd gka out norm + out_proj");
}

// spec/gka.md 3.2-3.3. dout (B,T,C) -> dx (B,T,C) overwritten; parameter gradients accumulate.
static void gka_backward(const MixerContext* mc, const void* settings, const LayerParams* lp, LayerParams* lg,
                         const void* acts, floatX* dx, const floatX* dout, const floatX* x, int B, int T) {
    const Config* c = mc->config;
    const GKAShape* sh = (const GKAShape*)settings;
    const GKAParams* p = &lp->gka;
    GKAParams* gr = &lg->gka;
    const GKAActs* a = (const GKAActs*)acts;
    GKAScratch s;
    size_t cur = 0;
    gka_layout_scratch(&s, sh, (char*)mc->own, &cur, B, T);
    int BT = B * T, HV = sh->H * sh->dv;
    cudaStream_t st = mc->stream;
    // out = y W_o^T
    matmul_backward(s.dy, gr->out_proj_w, NULL, mc->reduce, dout, a->y, X(mc, p->out_proj_w), BT, HV, c->channels, 0,
                    st);
    // gated RMSNorm: dL/do, and dL/dgate into the gate block of dproj
    gated_rmsnorm_backward(s.dout_o, s.dproj + sh->D, sh->ldP, gr->onorm_w, mc->reduce, s.dy, a->o, a->proj + sh->D,
                           a->rstd, p->onorm_w, BT, sh->H, sh->dv, st);
    profile_mark("bwd gka out_proj + out norm");
    // the core (spec 3.2), final-state gradients 0: fp32 dq_hat | dk | dv, dalpha, dg
    gka_core_backward(s.dqkv, s.dalpha, s.dg, s.core, s.dout_o, a->Hck, a->Uck, a->H0t, a->h0sq, a->qkv, a->alpha,
                      a->g, a->x, a->f, B, T, sh->H, sh->dk, sh->dv, sh->iters, sh->ridge, GKA_PRODUCTS,
                      GKA_CHUNKED_BACKWARD, st);
    profile_mark("bwd gka core");
    // l2 norms, beta, alpha, decay, GQA reduce: dL/d(SiLU out), the a | b | alpha columns of dproj
    gka_features_backward(s.du, s.dproj, sh->ldP, gr->A_log, gr->dt_bias, gr->b_bias, gr->alpha_bias, mc->reduce,
                          s.dqkv, s.dalpha, s.dg, a->qkv, a->qn, a->kn, a->beta, a->alpha, a->g, a->proj, p->A_log,
                          p->dt_bias, BT, sh->H, sh->Hkv, sh->dk, sh->dv, st);
    // SiLU and the causal conv: dL/d(q|k|v block of proj)
    shortconv_silu_backward(s.dproj, sh->ldP, gr->conv_w, mc->reduce, s.du, a->proj, p->conv_w, B, T, sh->D, sh->W,
                            st);
    profile_mark("bwd gka features + conv");
    // proj = x W_in^T
    in_proj_backward(mc, p->in_proj_w, gr->in_proj_w, dx, s.dproj, sh->P, sh->ldP, x, BT);
    profile_mark("bwd gka in_proj matmul");
}

static void gka_layout_decode(void* state, const void* settings, const Config* c, char* base, size_t* cur, int max_len) {
    (void)c;
    (void)max_len;
    GKADecodeState* d = (GKADecodeState*)state;
    const GKAShape* s = (const GKAShape*)settings;
    const size_t HK = (size_t)s->H * s->dk, HV = (size_t)s->H * s->dv;
    d->conv = carve_f(base, cur, (size_t)(s->W - 1) * s->D);
    d->Hs = carve_f(base, cur, HK * s->dk);
    d->Us = carve_f(base, cur, HK * s->dv);
    d->proj = carve_x(base, cur, s->P);
    d->u = carve_x(base, cur, s->D);
    d->qkv = carve_x(base, cur, s->DE);
    d->o = carve_x(base, cur, HV);
    d->y = carve_x(base, cur, HV);
    d->qn = carve_f(base, cur, s->H);
    d->kn = carve_f(base, cur, s->H);
    d->beta = carve_f(base, cur, s->H);
    d->alpha = carve_f(base, cur, s->H);
    d->g = carve_f(base, cur, s->H);
    d->f = carve_f(base, cur, s->H);
    d->rstd = carve_f(base, cur, s->H);
    d->x = carve_f(base, cur, HK);
}

// spec 7: the layer on one token, with the conv cache and the states H and U carried
static void gka_decode_step(const MixerContext* mc, const void* settings, const LayerParams* lp, void* state,
                            floatX* out, const floatX* x, int t) {
    (void)t;
    const Config* c = mc->config;
    const GKAShape* s = (const GKAShape*)settings;
    const GKAParams* p = &lp->gka;
    GKADecodeState* d = (GKADecodeState*)state;
    int C = c->channels, HV = s->H * s->dv;
    cudaStream_t st = mc->stream;
    matmul_forward(d->proj, x, X(mc, p->in_proj_w), NULL, 1, C, s->P, NULL, st);
    shortconv_silu_decode(d->u, d->conv, d->proj, s->P, p->conv_w, 1, s->D, s->W, st);
    gka_features_forward(d->qkv, d->qn, d->kn, d->beta, d->alpha, d->g, d->u, d->proj, s->P, p->b_bias, p->alpha_bias,
                         p->A_log, p->dt_bias, 1, s->H, s->Hkv, s->dk, s->dv, st);
    gka_recurrent_forward(d->o, d->x, d->f, NULL, NULL, d->Hs, d->Us, d->qkv, d->alpha, d->g, 1, 1, s->H, s->dk,
                          s->dv, s->iters, s->ridge, st);
    gated_rmsnorm_forward(d->y, d->rstd, d->o, d->proj + s->D, s->P, p->onorm_w, 1, s->H, s->dv, s->onorm_eps, st);
    matmul_forward(out, d->y, X(mc, p->out_proj_w), NULL, 1, HV, C, NULL, st);
}

static const MixerOps GKA_MIXER = {"gka", gka_build, gka_layout_acts, gka_scratch_bytes, gka_forward, gka_backward,
                                   gka_layout_decode, gka_decode_step};

#endif // TRAIN_KLA_KERNELS_MIXERS_GKA_CUH
