/*
kernels/mixers/pdn.cuh: the pdn row of train_kla.cu's mixer table (kernels/mixers/mixer.cuh), for `pdn`
(Preconditioned DeltaNet), `pgdn` (+ a scalar decay per head) and `pkda` (+ a low-rank per-channel decay and a
sigmoid output gate); the settings say which variant (spec/pdn.md 1). The layer, spec 1.1-1.5:

    proj = x W_in^T                                    blocks q | k | v | b | aP | bP [| a (pgdn) | f1 | g1 (pkda)]
    pkda: fpre = f1 f2^T, gate = g1 g2^T + g2_b        kernels/matmul.cuh
    q|k|v = SiLU(causal conv(proj[q|k|v]))             kernels/shortconv.cuh
    q, k normalised, beta, gP, bP, g (fp32)            kernels/pdn.cuh (features)
    o = the preconditioned delta rule (spec 2.1), S_0 = 0, A_0 = 0, chunkwise (spec 3):
        the preconditioner scan                               kernels/pdn.cuh (pdn_precond_forward)
        then the delta rule with the write key k~ = m k      kernels/gdn_chunk.cuh (pkda: GDN_DECAY_CHANNEL)
    out = W_o RMSNorm(o) (* sigmoid(gate) for pkda)    kernels/gated_norm.cuh (gate modes NONE, SIGMOID)

Backward: spec 2.4 around the core's: spec 3.4 (gdn_chunk_backward, which returns the read and the write key's
gradients apart) then 2.3's preconditioner backward. Decode: spec 4 (conv cache, S and A), the recurrent core
(kernels/pdn.cuh's pdn_core_forward) for every variant.
*/
#ifndef TRAIN_KLA_KERNELS_MIXERS_PDN_CUH
#define TRAIN_KLA_KERNELS_MIXERS_PDN_CUH

#include "mixer.cuh"
#include "../matmul.cuh"
#include "../shortconv.cuh"
#include "../gated_norm.cuh"
#include "../pdn.cuh"
#include "../gdn_chunk.cuh"

// one pdn-family layer's settings (spec/pdn.md 1; FORMATS.md in_proj blocks)
typedef struct {
    int H, dk, dv, W;
    int variant;   // 0 pdn, 1 pgdn, 2 pkda
    int D;         // 2*H*dk + H*dv: the conv'ed channels q | k | v
    int P;         // the in_proj rows: D + 3H (pdn), + H (pgdn), + 2*dv (pkda)
    int ldP;       // P rounded up to a multiple of 8: the row stride of proj and dproj
} PDNShape;

// what the forward saves for the backward
typedef struct {
    floatX *proj, *qkv, *o, *y;              // (B,T,ldP), (B,T,D), (B,T,H*dv) x2
    float *qn, *kn, *beta, *gP, *bP, *rstd;  // (B,T,H) each
    float *g, *A, *m;                        // (B,T,H*dk) each: main log decay, preconditioner state, multiplier
    floatX* kt;                              // (B,T,H*dk) the write key k~ = m k
    void* chunk_saved;                       // what gdn_chunk_forward saves for its backward
    floatX *f1, *g1, *fpre, *gate;           // pkda: (B,T,dv) x2, (B,T,H*dk), (B,T,H*dv); else NULL
} PDNActs;

typedef struct {
    float *conv, *S, *A;                     // zeroed at start: (W-1, D) pre-conv inputs, (H,dk,dv), (H,dk)
    floatX *proj, *qkv, *o, *y;              // the step's (P), (D), (H*dv), (H*dv)
    float *qn, *kn, *beta, *gP, *bP, *rstd;  // (H) each
    float *g, *Ah, *m;                       // (H*dk) each (Ah: the step's A, written by the core)
    floatX *f1, *g1, *fpre, *gate;           // pkda: (dv) x2, (H*dk), (H*dv)
} PDNDecodeState;

static void pdn_build(void* settings, const Config* c, int layer) {
    PDNShape* s = (PDNShape*)settings;
    s->H = c->lin_heads;
    s->dk = c->lin_dk;
    s->dv = c->lin_dv;
    s->W = c->conv_size;
    s->variant = c->mixer[layer] == MIXER_PDN ? 0 : c->mixer[layer] == MIXER_PGDN ? 1 : 2;
    s->D = 2 * s->H * s->dk + s->H * s->dv;
    s->P = s->D + 3 * s->H + (s->variant == 1 ? s->H : s->variant == 2 ? 2 * s->dv : 0);
    s->ldP = rows_padded(s->P);
}

// the chunk kernels' decay kind: pkda's is per channel, pgdn's per head (pdn's 0), read from g's first channel
static GdnDecay pdn_decay(const PDNShape* s) { return s->variant == 2 ? GDN_DECAY_CHANNEL : GDN_DECAY_HEAD; }

static void pdn_layout_acts(void* acts, const void* settings, const Config* c, char* base, size_t* cur, int B, int T) {
    (void)c;
    PDNActs* a = (PDNActs*)acts;
    const PDNShape* s = (const PDNShape*)settings;
    size_t BT = (size_t)B * T, HV = (size_t)s->H * s->dv, HK = (size_t)s->H * s->dk;
    a->proj = carve_x(base, cur, BT * s->ldP);
    a->qkv = carve_x(base, cur, BT * s->D);
    a->o = carve_x(base, cur, BT * HV);
    a->y = carve_x(base, cur, BT * HV);
    a->qn = carve_f(base, cur, BT * s->H);
    a->kn = carve_f(base, cur, BT * s->H);
    a->beta = carve_f(base, cur, BT * s->H);
    a->gP = carve_f(base, cur, BT * s->H);
    a->bP = carve_f(base, cur, BT * s->H);
    a->rstd = carve_f(base, cur, BT * s->H);
    a->g = carve_f(base, cur, BT * HK);
    a->A = carve_f(base, cur, BT * HK);
    a->m = carve_f(base, cur, BT * HK);
    a->kt = carve_x(base, cur, BT * HK);
    a->chunk_saved = carve(base, cur, gdn_chunk_saved_bytes(B, T, s->H, s->dk, s->dv, pdn_decay(s)));
    a->f1 = a->g1 = a->fpre = a->gate = NULL;
    if (s->variant == 2) {
        a->f1 = carve_x(base, cur, BT * s->dv);
        a->g1 = carve_x(base, cur, BT * s->dv);
        a->fpre = carve_x(base, cur, BT * HK);
        a->gate = carve_x(base, cur, BT * HV);
    }
}

// the backward's own scratch, carved in this order from MixerContext.own
typedef struct {
    floatX *dproj, *dy, *dout_o;             // (B,T,ldP), (B,T,H*dv) x2
    float *dqkv, *dbeta, *dgP, *dbP, *dg;    // (B,T,D), (B,T,H) x3, dg: (B,T,H) (pkda (B,T,H*dk))
    float* dcs;                              // dL/dc partials (B*H*NT)
    float* dkt;                              // (B,T,H*dk) dL/dk~
    floatX *dfpre, *dgate, *df1, *dg1;       // pkda: (B,T,H*dk), (B,T,H*dv), (B,T,dv) x2
} PDNScratch;

static void pdn_layout_scratch(PDNScratch* g, const PDNShape* s, char* base, size_t* cur, int B, int T) {
    size_t BT = (size_t)B * T, HV = (size_t)s->H * s->dv, HK = (size_t)s->H * s->dk;
    g->dproj = carve_x(base, cur, BT * s->ldP);
    g->dy = carve_x(base, cur, BT * HV);
    g->dout_o = carve_x(base, cur, BT * HV);
    g->dqkv = carve_f(base, cur, BT * s->D);
    g->dbeta = carve_f(base, cur, BT * s->H);
    g->dgP = carve_f(base, cur, BT * s->H);
    g->dbP = carve_f(base, cur, BT * s->H);
    g->dg = carve_f(base, cur, s->variant == 2 ? BT * HK : BT * s->H);
    g->dcs = carve_f(base, cur, (size_t)B * s->H * pdn_precond_chunks(T));
    g->dkt = carve_f(base, cur, BT * HK);
    g->dfpre = g->dgate = g->df1 = g->dg1 = NULL;
    if (s->variant == 2) {
        g->dfpre = carve_x(base, cur, BT * HK);
        g->dgate = carve_x(base, cur, BT * HV);
        g->df1 = carve_x(base, cur, BT * s->dv);
        g->dg1 = carve_x(base, cur, BT * s->dv);
    }
}

static void pdn_scratch_bytes(const void* settings, const Config* c, int B, int T, size_t* own, size_t* reduce,
                              size_t* work) {
    (void)c;
    const PDNShape* s = (const PDNShape*)settings;
    PDNScratch unused;
    size_t cur = 0;
    int BT = B * T;
    pdn_layout_scratch(&unused, s, NULL, &cur, B, T);
    *own = cur;
    const size_t needs[4] = {shortconv_backward_scratch_bytes(B, T, s->D, s->W),
                             pdn_features_backward_scratch_bytes(BT, s->H, s->dk, s->variant),
                             gated_rmsnorm_backward_scratch_bytes(BT, s->H, s->dv),
                             matmul_backward_scratch_bytes(BT, s->H * s->dv)};   // the last: pkda's g2_b
    *reduce = 0;
    for (int i = 0; i < 4; i++) { if (needs[i] > *reduce) { *reduce = needs[i]; } }
    // gdn_chunk's workspace, and the preconditioner scans' (used before or after gdn_chunk's)
    const size_t chunk = gdn_chunk_workspace_bytes(B, T, s->H, s->dk, s->dv, pdn_decay(s));
    const size_t scan = pdn_precond_scratch_bytes(B, T, s->H, s->dk);
    *work = chunk > scan ? chunk : scan;
}

static float pdn_qscale(const PDNShape* s) { return 1.0f / sqrtf((float)s->dk); }

// pkda (spec 1.4, 1.5): f1 | g1 out of proj's rows (N of them, ld_proj apart), fpre = f1 f2^T, gate = g1 g2^T + g2_b
static void pdn_lowrank_forward(const MixerContext* mc, const PDNParams* p, const PDNShape* s, floatX* f1, floatX* g1,
                                floatX* fpre, floatX* gate, floatX* proj, int ld_proj, int N) {
    const int off = s->D + 3 * s->H;
    pdn_lowrank_copy<false>(proj + off, ld_proj, f1, g1, N, s->dv, mc->stream);
    matmul_forward(fpre, f1, X(mc, p->f2_w), NULL, N, s->dv, s->H * s->dk, NULL, mc->stream);
    matmul_forward(gate, g1, X(mc, p->g2_w), X(mc, p->g2_b), N, s->dv, s->H * s->dv, NULL, mc->stream);
}

// spec/pdn.md 1.1-1.5
static void pdn_forward(const MixerContext* mc, const void* settings, const LayerParams* lp, void* acts, floatX* out,
                        const floatX* x, int B, int T) {
    const Config* c = mc->config;
    const PDNShape* s = (const PDNShape*)settings;
    const PDNParams* p = &lp->pdn;
    PDNActs* a = (PDNActs*)acts;
    int BT = B * T, HV = s->H * s->dv;
    cudaStream_t st = mc->stream;
    in_proj_forward(mc, p->in_proj_w, a->proj, s->ldP, x, BT);
    if (s->variant == 2) { pdn_lowrank_forward(mc, p, s, a->f1, a->g1, a->fpre, a->gate, a->proj, s->ldP, BT); }
    profile_mark("fwd pdn in_proj matmul");
    shortconv_silu_forward(a->qkv, a->proj, s->ldP, p->conv_w, B, T, s->D, s->W, st);
    pdn_features_forward(a->qkv, a->qn, a->kn, a->beta, a->gP, a->bP, a->g, a->proj, s->ldP, a->fpre, p->A_log,
                         p->dt_bias, p->A_log_P, p->dt_bias_P, BT, s->H, s->dk, s->dv, s->variant, c->l2norm_eps, st);
    profile_mark("fwd pdn conv + features");
    {   // the backward's workspace is free now
        const int HK = s->H * s->dk;
        const floatX* q = a->qkv;
        pdn_precond_forward(a->A, a->m, a->kt, mc->work, a->qkv, a->gP, a->bP, p->log_scale, B, T, s->H, s->dk, s->dv,
                            logf(c->precond_x), c->precond_eps, st);
        gdn_chunk_forward<floatX>(a->o, HV, a->chunk_saved, mc->work, q, q + HK, q + 2 * HK, s->D, a->kt, HK, a->beta,
                                  a->g, s->dk, pdn_decay(s), B, T, s->H, s->dk, s->dv, pdn_qscale(s), st);
        profile_mark("fwd pdn chunk core");
    }
    gated_rmsnorm_forward_mode(a->y, a->rstd, a->o, a->gate, HV, p->onorm_w, BT, s->H, s->dv, c->precond_onorm_eps,
                               s->variant == 2 ? NORM_GATE_SIGMOID : NORM_GATE_NONE, st);
    matmul_forward(out, a->y, X(mc, p->out_proj_w), NULL, BT, HV, c->channels, NULL, st);
    profile_mark("fwd pdn out norm + out_proj");
}

// spec/pdn.md 2.2-2.4. dout (B,T,C) -> dx (B,T,C) overwritten; parameter gradients accumulate.
static void pdn_backward(const MixerContext* mc, const void* settings, const LayerParams* lp, LayerParams* lg,
                         const void* acts, floatX* dx, const floatX* dout, const floatX* x, int B, int T) {
    const Config* c = mc->config;
    const PDNShape* sh = (const PDNShape*)settings;
    const PDNParams* p = &lp->pdn;
    PDNParams* gr = &lg->pdn;
    const PDNActs* a = (const PDNActs*)acts;
    PDNScratch s;
    size_t cur = 0;
    pdn_layout_scratch(&s, sh, (char*)mc->own, &cur, B, T);
    int BT = B * T, HV = sh->H * sh->dv, HK = sh->H * sh->dk;
    cudaStream_t st = mc->stream;
    // out = y W_o^T
    matmul_backward(s.dy, gr->out_proj_w, NULL, mc->reduce, dout, a->y, X(mc, p->out_proj_w), BT, HV, c->channels, 0,
                    st);
    // output norm (and pkda's gate): dL/do, dgate
    gated_rmsnorm_backward_mode(s.dout_o, s.dgate, HV, gr->onorm_w, mc->reduce, s.dy, a->o, a->gate, a->rstd,
                                p->onorm_w, BT, sh->H, sh->dv, sh->variant == 2 ? NORM_GATE_SIGMOID : NORM_GATE_NONE,
                                st);
    profile_mark("bwd pdn out_proj + out norm");
    // the recurrence and the preconditioner (spec 2.2, 2.3), dS_T = 0, dA_T = 0
    {   // spec 3.4: dq, the read key's dk, dv, dk~, dbeta, dg; then 2.3 maps dk~ into dk
        const floatX* q = a->qkv;
        gdn_chunk_backward<floatX>(s.dqkv, s.dqkv + HK, s.dqkv + 2 * HK, sh->D, s.dkt, HK, s.dbeta, s.dg, s.dout_o, HV,
                                   a->chunk_saved, mc->work, q, q + HK, q + 2 * HK, sh->D, a->kt, HK, a->beta,
                                   pdn_decay(sh), B, T, sh->H, sh->dk, sh->dv, pdn_qscale(sh), st);
        pdn_precond_backward(s.dqkv, s.dgP, s.dbP, gr->log_scale, s.dcs, mc->work, s.dkt, a->qkv, a->A, a->m, a->gP,
                             a->bP, p->log_scale, B, T, sh->H, sh->dk, sh->dv, logf(c->precond_x), c->precond_eps,
                             st);
        profile_mark("bwd pdn chunk core");
    }
    // l2 norms, gains and decays (spec 2.4): dL/d(SiLU out) in place, the b | aP | bP (| a) columns of dproj
    pdn_features_backward(s.dqkv, s.dproj, sh->ldP, s.dfpre, gr->A_log, gr->dt_bias, gr->A_log_P, gr->dt_bias_P,
                          mc->reduce, s.dbeta, s.dgP, s.dbP, s.dg, sh->variant == 2 ? sh->dk : 1, a->qkv, a->qn, a->kn,
                          a->beta, a->gP, a->bP, a->g, a->proj, a->fpre, p->A_log, p->dt_bias, p->A_log_P,
                          p->dt_bias_P, BT, sh->H, sh->dk, sh->dv, sh->variant, st);
    // pkda's low-rank projections: df1, dg1 into the f1 | g1 columns of dproj
    if (sh->variant == 2) {
        const int off = sh->D + 3 * sh->H;
        matmul_backward(s.df1, gr->f2_w, NULL, NULL, s.dfpre, a->f1, X(mc, p->f2_w), BT, sh->dv, HK, 0, st);
        matmul_backward(s.dg1, gr->g2_w, gr->g2_b, mc->reduce, s.dgate, a->g1, X(mc, p->g2_w), BT, sh->dv, HV, 0, st);
        pdn_lowrank_copy<true>(s.dproj + off, sh->ldP, s.df1, s.dg1, BT, sh->dv, st);
    }
    // SiLU and the causal conv: dL/d(q|k|v block of proj)
    shortconv_silu_backward(s.dproj, sh->ldP, gr->conv_w, mc->reduce, s.dqkv, a->proj, p->conv_w, B, T, sh->D, sh->W,
                            st);
    profile_mark("bwd pdn features + conv");
    // proj = x W_in^T
    in_proj_backward(mc, p->in_proj_w, gr->in_proj_w, dx, s.dproj, sh->P, sh->ldP, x, BT);
    profile_mark("bwd pdn in_proj matmul");
}

static void pdn_layout_decode(void* state, const void* settings, const Config* c, char* base, size_t* cur, int max_len) {
    (void)c;
    (void)max_len;
    PDNDecodeState* d = (PDNDecodeState*)state;
    const PDNShape* s = (const PDNShape*)settings;
    const size_t HK = (size_t)s->H * s->dk, HV = (size_t)s->H * s->dv;
    d->conv = carve_f(base, cur, (size_t)(s->W - 1) * s->D);
    d->S = carve_f(base, cur, HK * s->dv);
    d->A = carve_f(base, cur, HK);
    d->proj = carve_x(base, cur, s->P);
    d->qkv = carve_x(base, cur, s->D);
    d->o = carve_x(base, cur, HV);
    d->y = carve_x(base, cur, HV);
    d->qn = carve_f(base, cur, s->H);
    d->kn = carve_f(base, cur, s->H);
    d->beta = carve_f(base, cur, s->H);
    d->gP = carve_f(base, cur, s->H);
    d->bP = carve_f(base, cur, s->H);
    d->rstd = carve_f(base, cur, s->H);
    d->g = carve_f(base, cur, HK);
    d->Ah = carve_f(base, cur, HK);
    d->m = carve_f(base, cur, HK);
    d->f1 = d->g1 = d->fpre = d->gate = NULL;
    if (s->variant == 2) {
        d->f1 = carve_x(base, cur, s->dv);
        d->g1 = carve_x(base, cur, s->dv);
        d->fpre = carve_x(base, cur, HK);
        d->gate = carve_x(base, cur, HV);
    }
}

// spec 4: the layer on one token, with the conv cache and the states S and A carried
static void pdn_decode_step(const MixerContext* mc, const void* settings, const LayerParams* lp, void* state,
                            floatX* out, const floatX* x, int t) {
    (void)t;
    const Config* c = mc->config;
    const PDNShape* s = (const PDNShape*)settings;
    const PDNParams* p = &lp->pdn;
    PDNDecodeState* d = (PDNDecodeState*)state;
    int C = c->channels, HV = s->H * s->dv;
    cudaStream_t st = mc->stream;
    matmul_forward(d->proj, x, X(mc, p->in_proj_w), NULL, 1, C, s->P, NULL, st);
    if (s->variant == 2) { pdn_lowrank_forward(mc, p, s, d->f1, d->g1, d->fpre, d->gate, d->proj, s->P, 1); }
    shortconv_silu_decode(d->qkv, d->conv, d->proj, s->P, p->conv_w, 1, s->D, s->W, st);
    pdn_features_forward(d->qkv, d->qn, d->kn, d->beta, d->gP, d->bP, d->g, d->proj, s->P, d->fpre, p->A_log,
                         p->dt_bias, p->A_log_P, p->dt_bias_P, 1, s->H, s->dk, s->dv, s->variant, c->l2norm_eps, st);
    pdn_core_forward(d->o, d->Ah, d->m, NULL, d->S, d->A, d->qkv, d->beta, d->g, d->gP, d->bP, p->log_scale, 1, 1,
                     s->H, s->dk, s->dv, pdn_qscale(s), logf(c->precond_x), c->precond_eps, st);
    gated_rmsnorm_forward_mode(d->y, d->rstd, d->o, d->gate, HV, p->onorm_w, 1, s->H, s->dv, c->precond_onorm_eps,
                               s->variant == 2 ? NORM_GATE_SIGMOID : NORM_GATE_NONE, st);
    matmul_forward(out, d->y, X(mc, p->out_proj_w), NULL, 1, HV, C, NULL, st);
}

static const MixerOps PDN_MIXER = {"pdn", pdn_build, pdn_layout_acts, pdn_scratch_bytes, pdn_forward, pdn_backward,
                                   pdn_layout_decode, pdn_decode_step};

#endif // TRAIN_KLA_KERNELS_MIXERS_PDN_CUH
