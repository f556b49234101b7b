/*
kernels/mixers/gdn.cuh: the gdn row of train_kla.cu's mixer table (kernels/mixers/mixer.cuh), for `gdn` (Gated
DeltaNet) and `kaczmarz` (Kaczmarz Linear Attention), which differ only in the key normalisation and the write
coefficient (spec/gdn_kaczmarz.md 1.2 steps 4-5). The layer, spec 1.2:

    proj = x W_in^T                                    blocks q | k | v | z | a | b (FORMATS.md)
    q|k|v = SiLU(causal conv(proj[q|k|v]))             kernels/shortconv.cuh
    q, k normalised, beta, g = log decay (fp32)        kernels/gdn.cuh (features)
    o = chunkwise delta rule (spec 3, S_0 = 0)         kernels/gdn_chunk.cuh
    out = W_o gated_rmsnorm(o, z)                      kernels/gated_norm.cuh

Backward: spec 1.6 with the chunkwise core backward of spec 3.4. Decode: spec 4 (conv cache and state S).
*/
#ifndef TRAIN_KLA_KERNELS_MIXERS_GDN_CUH
#define TRAIN_KLA_KERNELS_MIXERS_GDN_CUH

#include "mixer.cuh"
#include "../matmul.cuh"
#include "../shortconv.cuh"
#include "../gated_norm.cuh"
#include "../gdn.cuh"
#include "../gdn_chunk.cuh"

// one gdn/kaczmarz layer's settings (spec/gdn_kaczmarz.md 0; FORMATS.md in_proj blocks q|k|v|z|a|b)
typedef struct {
    int H, dk, dv, W, kaczmarz;
    int D;    // 2*H*dk + H*dv: the conv'ed channels q | k | v
    int P;    // D + H*dv + 2*H: the in_proj rows
    int ldP;  // P rounded up to a multiple of 8: the row stride of proj and dproj (cuBLASLt's fast kernels want it)
} GDNShape;

// what the forward saves for the backward
typedef struct {
    floatX *proj, *gqkv, *o, *y;        // (B,T,ldP) in_proj out, (B,T,D) core q|k|v, (B,T,H*dv) core out, gated norm out
    float *qn, *kn, *beta, *g, *rstd;   // (B,T,H) each (kernels/gdn.cuh)
    void* chunk_saved;                  // what gdn_chunk_forward saves for its backward
} GDNActs;

typedef struct {
    float *conv, *S;                    // zeroed at start: (W-1, D) pre-conv inputs, (H, dk, dv) state
    floatX *proj, *gqkv, *o, *y;        // the step's (P), (D), (H*dv), (H*dv)
    float *qn, *kn, *beta, *g, *rstd;   // the step's (H) each
} GDNDecodeState;

static void gdn_build(void* settings, const Config* c, int layer) {
    GDNShape* s = (GDNShape*)settings;
    s->H = c->lin_heads;
    s->dk = c->lin_dk;
    s->dv = c->lin_dv;
    s->W = c->conv_size;
    s->kaczmarz = c->mixer[layer] == MIXER_KACZMARZ;
    s->D = 2 * s->H * s->dk + s->H * s->dv;
    s->P = s->D + s->H * s->dv + 2 * s->H;
    s->ldP = rows_padded(s->P);
}

static void gdn_layout_acts(void* acts, const void* settings, const Config* c, char* base, size_t* cur, int B, int T) {
    (void)c;
    GDNActs* a = (GDNActs*)acts;
    const GDNShape* s = (const GDNShape*)settings;
    size_t BT = (size_t)B * T, HV = (size_t)s->H * s->dv;
    a->proj = carve_x(base, cur, BT * s->ldP);
    a->gqkv = carve_x(base, cur, BT * s->D);
    a->o = carve_x(base, cur, BT * HV);
    a->y = carve_x(base, cur, BT * HV);
    a->qn = carve_f(base, cur, BT * s->H);
    a->kn = carve_f(base, cur, BT * s->H);
    a->beta = carve_f(base, cur, BT * s->H);
    a->g = carve_f(base, cur, BT * s->H);
    a->rstd = carve_f(base, cur, BT * s->H);
    a->chunk_saved = carve(base, cur, gdn_chunk_saved_bytes(B, T, s->H, s->dk, s->dv, GDN_DECAY_HEAD));
}

// the backward's own scratch, carved in this order from MixerContext.own
typedef struct {
    floatX *dproj, *dy, *dout_o;        // (B,T,ldP), (B,T,H*dv) x2
    float *dgqkv, *dbeta, *dg;          // (B,T,D), (B,T,H) x2, fp32
} GDNScratch;

static void gdn_layout_scratch(GDNScratch* g, const GDNShape* s, char* base, size_t* cur, int B, int T) {
    size_t BT = (size_t)B * T, HV = (size_t)s->H * s->dv;
    g->dproj = carve_x(base, cur, BT * s->ldP);
    g->dy = carve_x(base, cur, BT * HV);
    g->dout_o = carve_x(base, cur, BT * HV);
    g->dgqkv = carve_f(base, cur, BT * s->D);
    g->dbeta = carve_f(base, cur, BT * s->H);
    g->dg = carve_f(base, cur, BT * s->H);
}

static void gdn_scratch_bytes(const void* settings, const Config* c, int B, int T, size_t* own, size_t* reduce,
                              size_t* work) {
    (void)c;
    const GDNShape* s = (const GDNShape*)settings;
    GDNScratch unused;
    size_t cur = 0;
    int BT = B * T;
    gdn_layout_scratch(&unused, s, NULL, &cur, B, T);
    *own = cur;
    size_t r = shortconv_backward_scratch_bytes(B, T, s->D, s->W);
    if (gdn_features_backward_scratch_bytes(BT, s->H) > r) { r = gdn_features_backward_scratch_bytes(BT, s->H); }
    if (gated_rmsnorm_backward_scratch_bytes(BT, s->H, s->dv) > r) { r = gated_rmsnorm_backward_scratch_bytes(BT, s->H, s->dv); }
    *reduce = r;
    *work = gdn_chunk_workspace_bytes(B, T, s->H, s->dk, s->dv, GDN_DECAY_HEAD);
}

// spec/gdn_kaczmarz.md 1.2: out = W_o gated_rmsnorm(core(features(SiLU(conv(W_in x)))))
static void gdn_forward(const MixerContext* mc, const void* settings, const LayerParams* lp, void* acts, floatX* out,
                        const floatX* x, int B, int T) {
    const Config* c = mc->config;
    const GDNShape* s = (const GDNShape*)settings;
    const GDNParams* p = &lp->gdn;
    GDNActs* a = (GDNActs*)acts;
    int BT = B * T, HV = s->H * s->dv;
    cudaStream_t st = mc->stream;
    // step 1: the fused projection, blocks q | k | v | z | a | b
    in_proj_forward(mc, p->in_proj_w, a->proj, s->ldP, x, BT);
    profile_mark("fwd gdn in_proj matmul");
    // steps 2-6: causal conv + SiLU on q|k|v, then l2 norms, beta and the log decay g (fp32)
    shortconv_silu_forward(a->gqkv, a->proj, s->ldP, p->conv_w, B, T, s->D, s->W, st);
    gdn_features_forward(a->gqkv, a->qn, a->kn, a->beta, a->g, a->proj, s->ldP, p->b_bias, p->A_log, p->dt_bias, BT,
                         s->H, s->dk, s->dv, s->kaczmarz, c->l2norm_eps, c->kaczmarz_eps, st);
    profile_mark("fwd gdn conv + features");
    // step 7: the chunkwise recurrence (spec 3), S_0 = 0, scale dk^-1/2; the backward's workspace is free now
    const floatX* q = a->gqkv;
    const floatX* k = q + s->H * s->dk;   // also the write key
    gdn_chunk_forward<floatX>(a->o, HV, a->chunk_saved, mc->work, q, k, q + 2 * s->H * s->dk, s->D, k, s->D, a->beta,
                              a->g, 1, GDN_DECAY_HEAD, B, T, s->H, s->dk, s->dv, 1.0f / sqrtf((float)s->dk), st);
    profile_mark("fwd gdn chunk core");
    // step 8: gated RMSNorm with the z block, then the output projection
    gated_rmsnorm_forward(a->y, a->rstd, a->o, a->proj + s->D, s->ldP, p->onorm_w, BT, s->H, s->dv, c->onorm_eps, st);
    matmul_forward(out, a->y, X(mc, p->out_proj_w), NULL, BT, HV, c->channels, NULL, st);
    profile_mark("fwd gdn out norm + out_proj");
}

// spec/gdn_kaczmarz.md 1.6. dout (B,T,C) -> dx (B,T,C) overwritten; parameter gradients accumulate.
static void gdn_backward(const MixerContext* mc, const void* settings, const LayerParams* lp, LayerParams* lg,
                         const void* acts, floatX* dx, const floatX* dout, const floatX* x, int B, int T) {
    const Config* c = mc->config;
    const GDNShape* sh = (const GDNShape*)settings;
    const GDNParams* p = &lp->gdn;
    GDNParams* gr = &lg->gdn;
    const GDNActs* a = (const GDNActs*)acts;
    GDNScratch s;
    size_t cur = 0;
    gdn_layout_scratch(&s, sh, (char*)mc->own, &cur, B, T);
    int BT = B * T, HV = sh->H * sh->dv, Hdk = sh->H * sh->dk;
    cudaStream_t st = mc->stream;
    // out = y W_o^T
    matmul_backward(s.dy, gr->out_proj_w, NULL, mc->reduce, dout, a->y, X(mc, p->out_proj_w), BT, HV, c->channels, 0, st);
    profile_mark("bwd gdn out_proj matmul");
    // gated RMSNorm: dL/do, and dL/dz into the z block of dproj
    gated_rmsnorm_backward(s.dout_o, s.dproj + sh->D, sh->ldP, gr->onorm_w, mc->reduce, s.dy, a->o, a->proj + sh->D,
                           a->rstd, p->onorm_w, BT, sh->H, sh->dv, st);
    profile_mark("bwd gdn out norm");
    // the chunkwise core backward (spec 3.4), dS_T = 0: fp32 dq | dk | dv, dbeta, dg
    const floatX* q = a->gqkv;
    gdn_chunk_backward<floatX>(s.dgqkv, s.dgqkv + Hdk, s.dgqkv + 2 * Hdk, sh->D, NULL, 0, s.dbeta, s.dg, s.dout_o, HV,
                               a->chunk_saved, mc->work, q, q + Hdk, q + 2 * Hdk, sh->D, q + Hdk, sh->D, a->beta,
                               GDN_DECAY_HEAD, B, T, sh->H, sh->dk, sh->dv, 1.0f / sqrtf((float)sh->dk), st);
    profile_mark("bwd gdn chunk core");
    // l2 norms, the kaczmarz beta chain, sigmoid and gate: dL/d(SiLU out) in place, da | db into dproj
    gdn_features_backward(s.dgqkv, s.dproj, gr->A_log, gr->b_bias, gr->dt_bias, mc->reduce, s.dbeta, s.dg, a->gqkv,
                          a->qn, a->kn, a->beta, a->g, a->proj, sh->ldP, p->b_bias, p->A_log, p->dt_bias, BT, sh->H,
                          sh->dk, sh->dv, sh->kaczmarz, st);
    // SiLU and the causal conv: dL/d(q|k|v block of proj)
    shortconv_silu_backward(s.dproj, sh->ldP, gr->conv_w, mc->reduce, s.dgqkv, a->proj, p->conv_w, B, T, sh->D, sh->W, st);
    profile_mark("bwd gdn features + conv");
    // proj = x W_in^T
    in_proj_backward(mc, p->in_proj_w, gr->in_proj_w, dx, s.dproj, sh->P, sh->ldP, x, BT);
    profile_mark("bwd gdn in_proj matmul");
}

static void gdn_layout_decode(void* state, const void* settings, const Config* c, char* base, size_t* cur, int max_len) {
    (void)c;
    (void)max_len;
    GDNDecodeState* d = (GDNDecodeState*)state;
    const GDNShape* s = (const GDNShape*)settings;
    d->conv = carve_f(base, cur, (size_t)(s->W - 1) * s->D);
    d->S = carve_f(base, cur, (size_t)s->H * s->dk * s->dv);
    d->proj = carve_x(base, cur, s->P);
    d->gqkv = carve_x(base, cur, s->D);
    d->o = carve_x(base, cur, (size_t)s->H * s->dv);
    d->y = carve_x(base, cur, (size_t)s->H * s->dv);
    d->qn = carve_f(base, cur, s->H);
    d->kn = carve_f(base, cur, s->H);
    d->beta = carve_f(base, cur, s->H);
    d->g = carve_f(base, cur, s->H);
    d->rstd = carve_f(base, cur, s->H);
}

// spec 4: the layer on one token, with the conv cache and the state S carried
static void gdn_decode_step(const MixerContext* mc, const void* settings, const LayerParams* lp, void* state,
                            floatX* out, const floatX* x, int t) {
    (void)t;
    const Config* c = mc->config;
    const GDNShape* s = (const GDNShape*)settings;
    const GDNParams* p = &lp->gdn;
    GDNDecodeState* d = (GDNDecodeState*)state;
    int C = c->channels;
    cudaStream_t st = mc->stream;
    matmul_forward(d->proj, x, X(mc, p->in_proj_w), NULL, 1, C, s->P, NULL, st);
    shortconv_silu_decode(d->gqkv, d->conv, d->proj, s->P, p->conv_w, 1, s->D, s->W, st);
    gdn_features_forward(d->gqkv, d->qn, d->kn, d->beta, d->g, d->proj, s->P, p->b_bias, p->A_log, p->dt_bias, 1,
                         s->H, s->dk, s->dv, s->kaczmarz, c->l2norm_eps, c->kaczmarz_eps, st);
    gdn_recurrent_step(d->o, d->S, d->gqkv, d->beta, d->g, 1, s->H, s->dk, s->dv, st);
    gated_rmsnorm_forward(d->y, d->rstd, d->o, d->proj + s->D, s->P, p->onorm_w, 1, s->H, s->dv, c->onorm_eps, st);
    matmul_forward(out, d->y, X(mc, p->out_proj_w), NULL, 1, s->H * s->dv, C, NULL, st);
}

static const MixerOps GDN_MIXER = {"gdn", gdn_build, gdn_layout_acts, gdn_scratch_bytes, gdn_forward, gdn_backward,
                                   gdn_layout_decode, gdn_decode_step};

#endif // TRAIN_KLA_KERNELS_MIXERS_GDN_CUH
