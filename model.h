/*
model.h: what train_kla.c and train_kla.cu share: the model configuration and the mixer pattern, the parameter
layout (FORMATS.md "Tensor order and names"), initialisation, the checkpoint files (FORMATS.md), the
learning-rate schedules, sampling, and the command-line flags. Everything here runs on the host in fp32, so a
checkpoint written by either program is read by the other.
*/
#ifndef TRAIN_KLA_MODEL_H
#define TRAIN_KLA_MODEL_H

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "utils.h"
#include "dataloader.h"
#include "tasks.h"

// ----------------------------------------------------------------------------------------------------------
// model configuration and the mixer pattern

enum { MIXER_ATTN, MIXER_GDN, MIXER_KACZMARZ, MIXER_PDN, MIXER_PGDN, MIXER_PKDA, MIXER_GKA, MIXER_KALMAN, NUM_MIXERS };
static const char* MIXER_NAMES[NUM_MIXERS] = {"attn", "gdn", "kaczmarz", "pdn", "pgdn", "pkda", "gka", "kalman"};
enum { KALMAN_PLAIN = 0, KALMAN_MAMBA = 1, NUM_KALMAN_PRESETS = 2 };
static const char* KALMAN_PRESET_NAMES[NUM_KALMAN_PRESETS] = {"plain", "mamba"};
// trunk options (FORMATS.md header slots 20-22)
enum { NORM_LAYERNORM = 0, NORM_RMSNORM = 1, NUM_NORMS = 2 };
static const char* NORM_NAMES[NUM_NORMS] = {"layernorm", "rmsnorm"};
enum { MLP_GELU = 0, MLP_SWIGLU = 1, MLP_NONE = 2, NUM_MLPS = 3 };
static const char* MLP_NAMES[NUM_MLPS] = {"gelu", "swiglu", "none"};
#define MAX_LAYERS 128

typedef struct {
    int vocab_size;         // V, 50257 for GPT-2
    int padded_vocab_size;  // Vp, V rounded up to a multiple of 128
    int max_seq_len;        // rows of wpe (only present when every layer is attn)
    int num_layers;         // L
    int channels;           // C
    int num_heads;          // attention heads, head size C / num_heads
    int lin_heads;          // H of gdn/kaczmarz
    int lin_dk, lin_dv;     // per-head key and value dims of gdn/kaczmarz
    int conv_size;          // W, the short causal conv of gdn/kaczmarz
    int norm;               // NORM_*: the block and final norms
    int mlp;                // MLP_*: the block's MLP
    int mlp_hidden;         // hidden width of the MLP (0 without one)
    float norm_eps;         // eps of the block and final norms (1e-5)
    float l2norm_eps;       // q/k L2 normalisation eps inside the sqrt (spec 1.2 step 4: 1e-6)
    float onorm_eps;        // gated output RMSNorm eps (spec 1.2 step 8: 1e-5)
    float kaczmarz_eps;     // beta = eta / (||k||^2 + eps) (spec 1.2 step 5: 1e-6)
    float precond_x;        // pdn family: the squash keeps the key multiplier in (1/x, x) (spec/pdn.md 1.3: 1.5)
    float precond_eps;      // pdn family: r = log(A + eps) - c (spec/pdn.md 1.3: 1e-6)
    float precond_onorm_eps;  // pdn family: output RMSNorm eps (spec/pdn.md 1.5: 1e-6)
    int gka_iters;          // gka: r, Chebyshev iterations per solve (spec/gka.md 2.1: 30)
    float gka_ridge;        // gka: a in lambda_t = a ||H_t||_F (spec/gka.md 2.1: 0.02)
    float gka_onorm_eps;    // gka: output RMSNorm eps (spec/gka.md 2.1: 1e-6)
    int gka_kv_heads;       // gka: key/value heads Hkv (GQA when < lin_heads; spec/gka.md 2.4)
    int kalman_expand;      // kalman: inner width Dk = expand * C (spec/kalman.md 1.4: 1 for the LM)
    int kalman_n;           // kalman: N, states per channel
    int kalman_preset;      // kalman: KALMAN_PLAIN or KALMAN_MAMBA (spec/kalman.md 1.3)
    int kalman_rank;        // kalman: R = ceil(C/8) of the mamba preset's variance path, 0 for plain
    int mixer[MAX_LAYERS];  // MIXER_* per layer
    Task task;              // the synthetic task the model is trained on (kind TASK_NONE: token shards)
} Config;

// Parse a pattern `name[:count],...` into per-layer mixer ids; returns the number of layers.
// `what` names the flag or file the pattern came from, for the error message.
static int parse_mixer_pattern(const char* pattern, int* mixer, const char* what) {
    int n = 0;
    const char* p = pattern;
    if (*p == '\0') { die("%s: empty mixer pattern", what); }
    while (*p) {
        const char* end = p;
        while (*end && *end != ':' && *end != ',') { end++; }
        size_t len = (size_t)(end - p);
        int id = -1;
        for (int m = 0; m < NUM_MIXERS; m++) {
            if (strlen(MIXER_NAMES[m]) == len && strncmp(p, MIXER_NAMES[m], len) == 0) { id = m; }
        }
        if (id < 0) {
            if (len == 3 && strncmp(p, "kla", 3) == 0) {
                die("%s: mixer 'kla' is ambiguous: use 'kaczmarz' (Kaczmarz Linear Attention) or 'kalman' (Kalman Linear Attention)", what);
            }
            die("%s: unknown mixer '%.*s' in pattern '%s' (known: attn, gdn, kaczmarz, pdn, pgdn, pkda, gka, kalman)", what, (int)len, p, pattern);
        }
        long count = 1;
        if (*end == ':') {
            char* num_end;
            count = strtol(end + 1, &num_end, 10);
            if (num_end == end + 1 || (*num_end != ',' && *num_end != '\0') || count < 1) {
                die("%s: bad layer count after '%.*s' in pattern '%s' (want name:count with count >= 1)", what, (int)len, p, pattern);
            }
            end = num_end;
        }
        if (n + count > MAX_LAYERS) { die("%s: pattern '%s' has more than %d layers", what, pattern, MAX_LAYERS); }
        for (long i = 0; i < count; i++) { mixer[n++] = id; }
        p = end;
        if (*p == ',') {
            p++;
            if (*p == '\0') { die("%s: pattern '%s' ends with a comma", what, pattern); }
        }
    }
    return n;
}

// The canonical run-length form of the pattern (consecutive equal mixers merged), as stored in checkpoints.
static void format_mixer_pattern(const Config* c, char* buf, size_t size) {
    size_t pos = 0;
    buf[0] = '\0';
    for (int l = 0; l < c->num_layers;) {
        int run = 1;
        while (l + run < c->num_layers && c->mixer[l + run] == c->mixer[l]) { run++; }
        pos += (size_t)snprintf(buf + pos, size - pos, "%s%s:%d", l ? "," : "", MIXER_NAMES[c->mixer[l]], run);
        l += run;
    }
}

// GPT-2 has a learned position embedding; models with any recurrent mixer have none (DESIGN.md).
static int config_has_wpe(const Config* c) {
    for (int l = 0; l < c->num_layers; l++) { if (c->mixer[l] != MIXER_ATTN) { return 0; } }
    return 1;
}

static int config_has_mixer(const Config* c, int mixer) {
    for (int l = 0; l < c->num_layers; l++) { if (c->mixer[l] == mixer) { return 1; } }
    return 0;
}


// the layer's tensors in FORMATS.md order; the same struct holds their gradients
typedef struct {
    float* in_proj_w;   // (P, C)
    float* conv_w;      // (D, W)
    float* b_bias;      // (H)
    float* A_log;       // (H)
    float* dt_bias;     // (H)
    float* onorm_w;     // (dv)
    float* out_proj_w;  // (C, H*dv)
} GDNParams;


// the layer's tensors in FORMATS.md order; those absent for a variant are NULL; the same struct holds gradients
typedef struct {
    float* in_proj_w;   // (P, C)
    float* conv_w;      // (D, W)
    float* A_log;       // (H)            pgdn, pkda
    float* dt_bias;     // (H) pgdn, (H*dk) pkda
    float* f2_w;        // (H*dk, dv)     pkda
    float* g2_w;        // (H*dv, dv)     pkda
    float* g2_b;        // (H*dv)         pkda
    float* A_log_P;     // (H)
    float* dt_bias_P;   // (H)
    float* log_scale;   // (H)  c, the squash centre
    float* onorm_w;     // (dv)
    float* out_proj_w;  // (C, H*dv)
} PDNParams;


// the layer's tensors in FORMATS.md order; the same struct holds their gradients
typedef struct {
    float* in_proj_w;   // (P, C)
    float* conv_w;      // (D, W), D the un-expanded conv channels
    float* b_bias;      // (H)
    float* alpha_bias;  // (H)
    float* A_log;       // (H)
    float* dt_bias;     // (H)
    float* onorm_w;     // (dv)
    float* out_proj_w;  // (C, H*dv)
} GKAParams;


// the layer's tensors in FORMATS.md order (var_w NULL for the plain preset); the same struct holds gradients
typedef struct {
    float* in_proj_w;    // (2*Dk, C)
    float* conv_w;       // (Dk, K)
    float* conv_b;       // (Dk)
    float* sensor_w;     // (Ws, Dk)
    float* var_w;        // (Dk, R)  mamba only
    float* out_proj_w;   // (C, Dk)
    float* delta_raw;    // (Dk, N)
    float* lambda_log;   // (Dk, N)
    float* p_raw;        // (Dk, N)
    float* lambda_skip;  // (1)
} KalmanParams;


// ----------------------------------------------------------------------------------------------------------
// parameters: a table of named tensors over one allocation (FORMATS.md "Tensor order and names")

typedef struct {
    float *ln1w, *ln1b;
    float *qkvw, *qkvb, *attprojw, *attprojb;  // attn
    GDNParams gdn;                              // gdn, kaczmarz
    PDNParams pdn;                              // pdn, pgdn, pkda
    GKAParams gka;                              // gka
    KalmanParams kalman;                        // kalman
    float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
} LayerParams;

typedef struct {
    float* wte;  // (Vp, C)
    float* wpe;  // (max_seq_len, C) or NULL
    LayerParams layer[MAX_LAYERS];
    float *lnfw, *lnfb;
} ParameterTensors;

typedef struct {
    char name[96];
    int ndim;
    int shape[4];
    size_t numel;
    size_t offset;  // in floats from the start of the block
    int decay;      // AdamW weight decay applies (FORMATS.md "Weight decay")
    float lr_scale; // the tensor's learning rate is lr * lr_scale (FORMATS.md "Learning-rate groups")
    int init;       // how train_kla initialises it: one of the INIT_* below
    float std;      // for INIT_NORMAL
} TensorInfo;

enum { INIT_ZERO, INIT_ONE, INIT_NORMAL, INIT_A_LOG, INIT_A_LOG_1_16, INIT_DT_BIAS, INIT_LOG_SCALE, INIT_CONV_UNIFORM,
       INIT_P_RAW, INIT_LAMBDA_SKIP };
#define MAX_TENSORS (4 + 16 * MAX_LAYERS)

typedef struct {
    TensorInfo t[MAX_TENSORS];
    int num_tensors;
    size_t num_parameters;  // floats the layout spans (the parameters, plus the padding of an aligned layout)
    size_t align;           // every tensor starts at a multiple of this many floats (1: contiguous, as in files;
                            // above 1 a 2-D tensor's rows are also padded to a multiple of 8, see add_tensor)
} TensorTable;

// P rounded up to a multiple of 8: the rows of a 2-D tensor in an aligned layout, and the row stride of the
// recurrent mixers' in_proj outputs
static inline int rows_padded(int P) { return (P + 7) / 8 * 8; }

static float** add_tensor(TensorTable* tt, float** ptr_slot, float* base, const char* name, int decay, int init,
                          float std, int ndim, int d0, int d1) {
    TensorInfo* t = &tt->t[tt->num_tensors++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%.*s", (int)sizeof(t->name) - 1, name);  // names are shorter (FORMATS.md)
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 0;
    t->numel = (size_t)d0 * (ndim > 1 ? (size_t)d1 : 1);
    t->offset = tt->align > 1 ? (tt->num_parameters + tt->align - 1) / tt->align * tt->align : tt->num_parameters;
    t->decay = decay;
    t->lr_scale = 1.0f;
    t->init = init;
    t->std = std;
    // an aligned layout also leaves a 2-D tensor's rows padded to a multiple of 8 (the padding zero, never
    // updated): a weight of P rows is then a weight of rows_padded(P) rows whose last ones are zero (the fused
    // in_proj of the recurrent mixers: one product over P rounded up, kernels/mixers/mixer.cuh)
    const size_t span = ndim > 1 && tt->align > 1 ? (size_t)rows_padded(d0) * d1 : t->numel;
    tt->num_parameters = t->offset + span;
    if (base != NULL) { *ptr_slot = base + t->offset; }
    return ptr_slot;
}

// Lay out every tensor of the model in FORMATS.md order, each starting at a multiple of `align` floats (1: the
// contiguous layout of the files; train_kla.cu aligns its device copy). Fills the table and, when base is not
// NULL, points the ParameterTensors at base (used for the parameters and, with the same layout, their gradients).
// Each mixer lays out its own tensors (MIXER_PARAMETER_LAYOUT); the trunk does the rest.

// what a mixer's layout function works with: the table being built, the block its pointers point into (NULL: the
// table only), the layer, GPT-2's init scales and a name buffer
typedef struct {
    TensorTable* tt;
    float* base;
    float* unused;   // the pointer slot written when there is no LayerParams to point
    int layer;
    float std, std_resid;
    char name[96];
} LayoutContext;

#define T2(slot, nm, decay, init, sd, d0, d1) add_tensor(k->tt, lp ? &(slot) : &k->unused, k->base, nm, decay, init, sd, 2, d0, d1)
#define T1(slot, nm, init, d0) add_tensor(k->tt, lp ? &(slot) : &k->unused, k->base, nm, 0, init, 0.0f, 1, d0, 0)
#define MNAME(suffix) (snprintf(k->name, sizeof(k->name), "h%d.%s.%s", k->layer, MIXER_NAMES[c->mixer[k->layer]], suffix), k->name)

static void attn_parameter_layout(LayoutContext* k, LayerParams* lp, const Config* c) {
    int C = c->channels;
    float std = k->std, std_resid = k->std_resid;
    T2(lp->qkvw, MNAME("qkv.w"), 1, INIT_NORMAL, std, 3 * C, C);
    T1(lp->qkvb, MNAME("qkv.b"), INIT_ZERO, 3 * C);
    T2(lp->attprojw, MNAME("proj.w"), 1, INIT_NORMAL, std_resid, C, C);
    T1(lp->attprojb, MNAME("proj.b"), INIT_ZERO, C);
}

static void gdn_parameter_layout(LayoutContext* k, LayerParams* lp, const Config* c) {
    int C = c->channels;
    float std = k->std, std_resid = k->std_resid;
    int H = c->lin_heads, dk = c->lin_dk, dv = c->lin_dv;
    int P = 2 * H * dk + 2 * H * dv + 2 * H, D = 2 * H * dk + H * dv;
    T2(lp->gdn.in_proj_w, MNAME("in_proj.w"), 1, INIT_NORMAL, std, P, C);
    T2(lp->gdn.conv_w, MNAME("conv.w"), 1, INIT_NORMAL, std, D, c->conv_size);
    T1(lp->gdn.b_bias, MNAME("b_bias"), INIT_ZERO, H);
    T1(lp->gdn.A_log, MNAME("A_log"), INIT_A_LOG, H);
    T1(lp->gdn.dt_bias, MNAME("dt_bias"), INIT_DT_BIAS, H);
    T1(lp->gdn.onorm_w, MNAME("onorm.w"), INIT_ONE, dv);
    T2(lp->gdn.out_proj_w, MNAME("out_proj.w"), 1, INIT_NORMAL, std_resid, C, H * dv);
}

// spec/kalman.md 1.2; FORMATS.md
static void kalman_parameter_layout(LayoutContext* k, LayerParams* lp, const Config* c) {
    int C = c->channels;
    float std = k->std, std_resid = k->std_resid;
    int Dk = c->kalman_expand * C, N = c->kalman_n, R = c->kalman_rank;
    int Ws = c->kalman_preset == KALMAN_MAMBA ? R + 2 * N : 2 * Dk + 2 * N;
    T2(lp->kalman.in_proj_w, MNAME("in_proj.w"), 1, INIT_NORMAL, std, 2 * Dk, C);
    T2(lp->kalman.conv_w, MNAME("conv.w"), 0, INIT_CONV_UNIFORM, 0.0f, Dk, c->conv_size);  // 1-D group: no decay
    T1(lp->kalman.conv_b, MNAME("conv.b"), INIT_ZERO, Dk);
    T2(lp->kalman.sensor_w, MNAME("sensor.w"), 1, INIT_NORMAL, std, Ws, Dk);
    if (c->kalman_preset == KALMAN_MAMBA) { T2(lp->kalman.var_w, MNAME("var.w"), 1, INIT_NORMAL, std, Dk, R); }
    T2(lp->kalman.out_proj_w, MNAME("out_proj.w"), 1, INIT_NORMAL, std_resid, C, Dk);
    // the state-space parameters: 0.1x learning rate, no weight decay (FORMATS.md "Learning-rate groups")
    T2(lp->kalman.delta_raw, MNAME("delta_raw"), 0, INIT_DT_BIAS, 0.0f, Dk, N);
    k->tt->t[k->tt->num_tensors - 1].lr_scale = 0.1f;
    T2(lp->kalman.lambda_log, MNAME("lambda_log"), 0, INIT_ZERO, 0.0f, Dk, N);
    k->tt->t[k->tt->num_tensors - 1].lr_scale = 0.1f;
    T2(lp->kalman.p_raw, MNAME("p_raw"), 0, INIT_P_RAW, 0.0f, Dk, N);
    k->tt->t[k->tt->num_tensors - 1].lr_scale = 0.1f;
    T1(lp->kalman.lambda_skip, MNAME("lambda_skip"), INIT_LAMBDA_SKIP, 1);
    k->tt->t[k->tt->num_tensors - 1].lr_scale = 0.1f;
}

// in_proj rows [q (H) | k (Hkv) | v (Hkv) | gate | a | b | alpha]
static void gka_parameter_layout(LayoutContext* k, LayerParams* lp, const Config* c) {
    int C = c->channels;
    float std = k->std, std_resid = k->std_resid;
    int H = c->lin_heads, dk = c->lin_dk, dv = c->lin_dv, Hkv = c->gka_kv_heads;
    int D = H * dk + Hkv * (dk + dv), P = D + H * dv + 3 * H;
    T2(lp->gka.in_proj_w, MNAME("in_proj.w"), 1, INIT_NORMAL, std, P, C);
    T2(lp->gka.conv_w, MNAME("conv.w"), 1, INIT_NORMAL, std, D, c->conv_size);
    T1(lp->gka.b_bias, MNAME("b_bias"), INIT_ZERO, H);
    T1(lp->gka.alpha_bias, MNAME("alpha_bias"), INIT_ZERO, H);
    T1(lp->gka.A_log, MNAME("A_log"), INIT_A_LOG, H);
    T1(lp->gka.dt_bias, MNAME("dt_bias"), INIT_DT_BIAS, H);
    T1(lp->gka.onorm_w, MNAME("onorm.w"), INIT_ONE, dv);
    T2(lp->gka.out_proj_w, MNAME("out_proj.w"), 1, INIT_NORMAL, std_resid, C, H * dv);
}

// pdn family (FORMATS.md): in_proj rows [q | k | v | b | aP | bP] then pgdn [a], pkda [f1 | g1]
static void pdn_parameter_layout(LayoutContext* k, LayerParams* lp, const Config* c) {
    int C = c->channels;
    float std = k->std, std_resid = k->std_resid;
    int H = c->lin_heads, dk = c->lin_dk, dv = c->lin_dv, D = 2 * H * dk + H * dv, mixer = c->mixer[k->layer];
    int P = D + 3 * H + (mixer == MIXER_PGDN ? H : mixer == MIXER_PKDA ? 2 * dv : 0);
    T2(lp->pdn.in_proj_w, MNAME("in_proj.w"), 1, INIT_NORMAL, std, P, C);
    T2(lp->pdn.conv_w, MNAME("conv.w"), 1, INIT_NORMAL, std, D, c->conv_size);
    if (mixer != MIXER_PDN) {
        T1(lp->pdn.A_log, MNAME("A_log"), INIT_A_LOG_1_16, H);
        T1(lp->pdn.dt_bias, MNAME("dt_bias"), INIT_DT_BIAS, mixer == MIXER_PKDA ? H * dk : H);
    }
    if (mixer == MIXER_PKDA) {
        T2(lp->pdn.f2_w, MNAME("f2.w"), 1, INIT_NORMAL, std, H * dk, dv);
        T2(lp->pdn.g2_w, MNAME("g2.w"), 1, INIT_NORMAL, std, H * dv, dv);
        T1(lp->pdn.g2_b, MNAME("g2.b"), INIT_ZERO, H * dv);
    }
    T1(lp->pdn.A_log_P, MNAME("A_log_P"), INIT_A_LOG_1_16, H);
    T1(lp->pdn.dt_bias_P, MNAME("dt_bias_P"), INIT_DT_BIAS, H);
    T1(lp->pdn.log_scale, MNAME("log_scale"), INIT_LOG_SCALE, H);
    T1(lp->pdn.onorm_w, MNAME("onorm.w"), INIT_ONE, dv);
    T2(lp->pdn.out_proj_w, MNAME("out_proj.w"), 1, INIT_NORMAL, std_resid, C, H * dv);
}
#undef MNAME

// indexed by MIXER_*: each mixer's tensors of one layer
typedef void (*MixerParameterLayout)(LayoutContext* k, LayerParams* lp, const Config* c);
static const MixerParameterLayout MIXER_PARAMETER_LAYOUT[NUM_MIXERS] = {
    attn_parameter_layout,    // attn
    gdn_parameter_layout,     // gdn
    gdn_parameter_layout,     // kaczmarz
    pdn_parameter_layout,     // pdn
    pdn_parameter_layout,     // pgdn
    pdn_parameter_layout,     // pkda
    gka_parameter_layout,     // gka
    kalman_parameter_layout,  // kalman
};

static void build_parameter_layout_aligned(const Config* c, TensorTable* tt, ParameterTensors* p, float* base,
                                           size_t align) {
    int C = c->channels, L = c->num_layers;
    LayoutContext ctx = {tt, base, NULL, 0, 0.02f, 0.02f / sqrtf(2.0f * L), ""};  // GPT-2: residual projections / sqrt(2L)
    LayoutContext* k = &ctx;
    float std = ctx.std, std_resid = ctx.std_resid;
    memset(tt, 0, sizeof(*tt));
    tt->align = align;
    if (p != NULL) { memset(p, 0, sizeof(*p)); }
#define LNAME(suffix) (snprintf(k->name, sizeof(k->name), "h%d.%s", l, suffix), k->name)
    LayerParams* lp = p ? &p->layer[0] : NULL;  // non-NULL exactly when p is: T1/T2 then fill the slots
    T2(p->wte, "wte", 0, INIT_NORMAL, std, c->padded_vocab_size, C);
    if (config_has_wpe(c)) { T2(p->wpe, "wpe", 0, INIT_NORMAL, std, c->max_seq_len, C); }
    for (int l = 0; l < L; l++) {
        lp = p ? &p->layer[l] : NULL;
        k->layer = l;
        T1(lp->ln1w, LNAME("ln1.w"), INIT_ONE, C);
        if (c->norm == NORM_LAYERNORM) { T1(lp->ln1b, LNAME("ln1.b"), INIT_ZERO, C); }
        MIXER_PARAMETER_LAYOUT[c->mixer[l]](k, lp, c);
        if (c->mlp == MLP_NONE) { continue; }
        int Hm = c->mlp_hidden;
        T1(lp->ln2w, LNAME("ln2.w"), INIT_ONE, C);
        if (c->norm == NORM_LAYERNORM) { T1(lp->ln2b, LNAME("ln2.b"), INIT_ZERO, C); }
        if (c->mlp == MLP_GELU) {
            T2(lp->fcw, LNAME("mlp.fc.w"), 1, INIT_NORMAL, std, Hm, C);
            T1(lp->fcb, LNAME("mlp.fc.b"), INIT_ZERO, Hm);
            T2(lp->fcprojw, LNAME("mlp.proj.w"), 1, INIT_NORMAL, std_resid, C, Hm);
            T1(lp->fcprojb, LNAME("mlp.proj.b"), INIT_ZERO, C);
        } else {  // SwiGLU: rows [gate | up], no biases
            T2(lp->fcw, LNAME("mlp.fc.w"), 1, INIT_NORMAL, std, 2 * Hm, C);
            T2(lp->fcprojw, LNAME("mlp.proj.w"), 1, INIT_NORMAL, std_resid, C, Hm);
        }
    }
    T1(p->lnfw, "lnf.w", INIT_ONE, C);
    if (c->norm == NORM_LAYERNORM) { T1(p->lnfb, "lnf.b", INIT_ZERO, C); }
#undef T2
#undef T1
#undef LNAME
}

// the contiguous layout of the checkpoint files and of train_kla.c
static void build_parameter_layout(const Config* c, TensorTable* tt, ParameterTensors* p, float* base) {
    build_parameter_layout_aligned(c, tt, p, base, 1);
}


// ----------------------------------------------------------------------------------------------------------
// Training FLOPs per token (forward + backward): the one count behind both trainers' MFU, the run table and
// scripts/model_table.sh. It is a property of the model and T, not of an implementation:
//  - 6 per matmul weight (2 forward, 4 backward; llm.c's 6N): wte as the LM head and every 2-D `.w` tensor
//    except the depthwise conv taps; not the position embedding (a lookup) nor kalman's per-lane state-space
//    parameters (elementwise), nor biases, norms and gates (elementwise, O(C) per token);
//  - each layer's mixer core, forward + backward, as its spec counts it (2 flops per multiply-add, the chunked
//    parallel form with chunks of FLOP_CHUNK = 64, dense chunk products counted in full, elementwise work left out).
#define FLOP_CHUNK 64

static int tensor_is_matmul_weight(const TensorInfo* t) {
    size_t n = strlen(t->name);
    if (strcmp(t->name, "wte") == 0) { return 1; }
    return t->ndim == 2 && n > 2 && strcmp(t->name + n - 2, ".w") == 0 && (n < 7 || strcmp(t->name + n - 7, ".conv.w") != 0);
}

// The mixer core of one layer, per token.
static double mixer_core_flops_per_token(const Config* c, int mixer, int T) {
    double C = c->channels, H = c->lin_heads, K = c->lin_dk, V = c->lin_dv, BT = FLOP_CHUNK;
    double padded = ceil((double)T / FLOP_CHUNK) * FLOP_CHUNK / T;  // whole chunks: the padded tail is computed too
    switch (mixer) {
    case MIXER_ATTN:  // causal: QK^T and AV over (on average) T/2 keys, 2*C*T forward, 3x that with the backward
        return 6.0 * C * T;
    case MIXER_GDN:
    case MIXER_KACZMARZ: {  // spec/gdn_kaczmarz.md 3.7 (the backward in FLA's order, recomputing W, U, h)
        double fwd = 6 * K * V + 6 * BT * K + 4 * BT * V + BT * BT / 3;
        double bwd = 16 * K * V + 18 * BT * K + 10 * BT * V + 4 * BT * BT;
        return H * (fwd + bwd) * padded;
    }
    case MIXER_PDN:
    case MIXER_PGDN:
    case MIXER_PKDA: {  // spec/pdn.md 3.7, the preconditioned forms (a short last chunk does proportionally less)
        double fwd = 6 * K * V + BT * (8 * K + 4 * V) + BT * BT / 3 + 15 * K;
        double bwd = 16 * K * V + BT * (24 * K + 10 * V) + 4 * BT * BT + 30 * K;
        return H * (fwd + bwd);
    }
    case MIXER_GKA: {  // spec/gka.md 6 with D = dk, per query head (r Chebyshev iterations in each of the two solves)
        double r = c->gka_iters, D = K;
        double fwd = (8 + 2 * r) * D * D + (6 + 4 * r) * BT * D + 2 * BT * BT;
        double bwd = (22 + 2 * r) * D * D + (28 + 4 * r) * BT * D + 2 * BT * BT;
        return H * (fwd + bwd) * padded;
    }
    case MIXER_KALMAN:  // spec/kalman.md 3.6: ~15 flops forward and ~57 backward (with the replay) per lane
        return 72.0 * c->kalman_expand * C * c->kalman_n;
    }
    return 0.0;
}

// The whole model per token; *core_flops (when not NULL) gets the mixer cores' share.
static inline double model_flops_per_token(const Config* c, int T, double* core_flops) {
    TensorTable tt;
    build_parameter_layout(c, &tt, NULL, NULL);
    double flops = 0.0;
    for (int i = 0; i < tt.num_tensors; i++) {
        if (tensor_is_matmul_weight(&tt.t[i])) { flops += 6.0 * (double)tt.t[i].numel; }
    }
    double cores = 0.0;
    for (int l = 0; l < c->num_layers; l++) { cores += mixer_core_flops_per_token(c, c->mixer[l], T); }
    if (core_flops != NULL) { *core_flops = cores; }
    return flops + cores;
}

// ----------------------------------------------------------------------------------------------------------
// random numbers: splitmix64 (init and sampling; rng_next is in utils.h); the state is one uint64

// uniform in [0, 1) with 24 random bits
static float rng_uniform(uint64_t* state) { return (float)(rng_next(state) >> 40) / 16777216.0f; }
// standard normal by Box-Muller (one value per call; simple and plenty for initialisation)
static float rng_normal(uint64_t* state) {
    double u1 = ((double)(rng_next(state) >> 11) + 1.0) / 9007199254740993.0;  // (0, 1]
    double u2 = (double)(rng_next(state) >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

// Initialise every tensor as FORMATS.md "Initialisation" says.
static inline void init_parameters(float* params, const Config* c, const TensorTable* tt, uint64_t seed) {
    uint64_t rng = seed;
    for (int i = 0; i < tt->num_tensors; i++) {
        const TensorInfo* t = &tt->t[i];
        float* w = params + t->offset;
        for (size_t j = 0; j < t->numel; j++) {
            switch (t->init) {
                case INIT_ZERO: w[j] = 0.0f; break;
                case INIT_ONE: w[j] = 1.0f; break;
                case INIT_NORMAL: w[j] = t->std * rng_normal(&rng); break;
                case INIT_A_LOG: {  // spec 1.5: A ~ U(0, 16), A_log = log(A)
                    float A = 16.0f * rng_uniform(&rng);
                    w[j] = logf(A > 1e-30f ? A : 1e-30f);
                    break;
                }
                case INIT_A_LOG_1_16: {  // spec/pdn.md 10.7: A ~ U(1, 16), A_log = log(A)
                    w[j] = logf(1.0f + 15.0f * rng_uniform(&rng));
                    break;
                }
                case INIT_LOG_SCALE: w[j] = -0.2f; break;  // spec/pdn.md 10.7: the squash centre c starts at -0.2
                case INIT_CONV_UNIFORM: w[j] = rng_uniform(&rng) - 0.5f; break;  // spec/kalman.md 1.2: U(-1/sqrt(K), 1/sqrt(K)), K = 4
                case INIT_P_RAW: w[j] = 0.01f; break;                            // spec/kalman.md 1.2: process noise
                case INIT_LAMBDA_SKIP: w[j] = -1.0f; break;                      // spec/kalman.md 1.2
                case INIT_DT_BIAS: {  // spec 1.5: dt log-uniform in [1e-3, 1e-1], dt_bias = softplus^-1(dt)
                    double dt = exp(rng_uniform(&rng) * (log(0.1) - log(0.001)) + log(0.001));
                    if (dt < 1e-4) { dt = 1e-4; }
                    w[j] = (float)(dt + log(-expm1(-dt)));
                    break;
                }
            }
        }
        if (i == 0) {  // wte: the padding rows V..Vp-1 stay zero
            memset(w + (size_t)c->vocab_size * c->channels, 0,
                   (size_t)(c->padded_vocab_size - c->vocab_size) * c->channels * sizeof(float));
        }
    }
}


// ----------------------------------------------------------------------------------------------------------
// checkpoints (FORMATS.md): model file = header + tensor table + fp32 payload; state file = step, dataloader
// and AdamW state. Files are written to a temporary name, fsync'ed and renamed, so a file either exists
// complete or not at all; DONE_<step> is written last and marks a complete checkpoint. Every file carries
// CRC32C checksums (FORMATS.md "Checksums"), checked before anything in it is used, so a flipped bit in a
// weight or an AdamW moment is an error instead of a silently different run.

#define MODEL_MAGIC 20251121
#define MODEL_VERSION 2          // 2: checksums; version 1 files (no checksums) are refused
#define STATE_MAGIC 20251123
#define STATE_VERSION 2        // 2: checksums and the run's flags; version 1 files are refused
#define RUN_FLAGS_BYTES 8192    // the most bytes the run's flags take in a state file
#define TENSOR_ENTRY_BYTES 128
#define TENSOR_NAME_BYTES 92     // then the tensor's uint32 CRC32C at byte 92 of its entry
#define MODEL_CHECKSUM_SLOT 34   // CRC32C of the header (this slot zero) and the tensor table
#define STATE_CHECKSUM_SLOT 8    // slots 8, 9, 10: CRC32C of header + dataloader state + run flags, of m, of v
#define STATE_RUN_FLAGS_SLOT 11  // the bytes of the run's flags, which follow the dataloader state

typedef struct {
    char tmp[4096];
    const char* path;
    FILE* f;
} AtomicFile;

static void atomic_open(AtomicFile* af, const char* path) {
    af->path = path;
    if ((size_t)snprintf(af->tmp, sizeof(af->tmp), "%s.tmp", path) >= sizeof(af->tmp)) { die("%s: path too long", path); }
    af->f = fopen_or_die(af->tmp, "wb");
}

// A failed write (disk full, file-size limit) removes the temporary file, so only complete files remain.
static void atomic_fail(AtomicFile* af, const char* what) {
    int err = errno;
    fclose(af->f);
    remove(af->tmp);
    die("%s: %s failed (%s); the file was not written", af->path, what, strerror(err));
}

static void atomic_write(AtomicFile* af, const void* buf, size_t n) {
    if (n > 0 && fwrite(buf, 1, n, af->f) != n) { atomic_fail(af, "write"); }
}

static void atomic_commit(AtomicFile* af) {
    if (fflush(af->f) != 0 || fsync(fileno(af->f)) != 0) { atomic_fail(af, "write"); }
    if (fclose(af->f) != 0) { remove(af->tmp); die("%s: close failed (%s); the file was not written", af->path, strerror(errno)); }
    if (rename(af->tmp, af->path) != 0) { die("%s: rename to %s failed (%s)", af->tmp, af->path, strerror(errno)); }
    // make the rename itself durable
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", af->path);
    char* slash = strrchr(dir, '/');
    if (slash) { *slash = '\0'; } else { snprintf(dir, sizeof(dir), "."); }
    int fd = open(dir, O_RDONLY);
    if (fd >= 0) { fsync(fd); close(fd); }
}

static void write_model_file(const Config* c, const TensorTable* tt, const float* params, const char* path) {
    int32_t header[256] = {0};
    int n = tt->num_tensors;
    int64_t payload_offset = 1024 + (int64_t)TENSOR_ENTRY_BYTES * n;
    header[0] = MODEL_MAGIC;
    header[1] = MODEL_VERSION;
    header[2] = c->vocab_size;
    header[3] = c->padded_vocab_size;
    header[4] = c->max_seq_len;
    header[5] = c->num_layers;
    header[6] = c->channels;
    header[7] = c->num_heads;
    header[8] = c->lin_heads;
    header[9] = c->lin_dk;
    header[10] = c->lin_dv;
    header[11] = c->conv_size;
    header[12] = n;
    header[13] = 0;  // fp32
    header[14] = (int32_t)(payload_offset & 0xffffffff);
    header[15] = (int32_t)(payload_offset >> 32);
    header[16] = f32_to_slot(c->norm_eps);
    header[17] = f32_to_slot(c->l2norm_eps);
    header[18] = f32_to_slot(c->onorm_eps);
    header[19] = f32_to_slot(c->kaczmarz_eps);
    header[20] = c->norm;
    header[21] = c->mlp;
    header[22] = c->mlp_hidden;
    header[23] = f32_to_slot(c->precond_x);
    header[24] = f32_to_slot(c->precond_eps);
    header[25] = f32_to_slot(c->precond_onorm_eps);
    header[26] = c->gka_iters;
    header[27] = f32_to_slot(c->gka_ridge);
    header[28] = f32_to_slot(c->gka_onorm_eps);
    header[29] = c->kalman_expand;
    header[30] = c->kalman_n;
    header[31] = c->kalman_preset;
    header[32] = c->kalman_rank;
    header[33] = c->gka_kv_heads;
    header[35] = c->task.kind;
    header[36] = c->task.len;
    header[37] = c->task.pairs;
    format_mixer_pattern(c, (char*)header + 512, 512);
    unsigned char* table = (unsigned char*)calloc_or_die(n, TENSOR_ENTRY_BYTES);
    for (int i = 0; i < n; i++) {
        const TensorInfo* t = &tt->t[i];
        unsigned char* entry = table + (size_t)i * TENSOR_ENTRY_BYTES;
        int32_t ints[6] = {0, t->ndim, t->shape[0], t->shape[1], t->shape[2], t->shape[3]};
        int64_t offset = (int64_t)(t->offset * sizeof(float));
        uint32_t crc = crc32c(0, params + t->offset, t->numel * sizeof(float));
        if (strlen(t->name) >= TENSOR_NAME_BYTES) { die("%s: tensor name %s is too long for the file format", path, t->name); }
        memcpy(entry, t->name, strlen(t->name));
        memcpy(entry + TENSOR_NAME_BYTES, &crc, 4);
        memcpy(entry + 96, ints, sizeof(ints));
        memcpy(entry + 120, &offset, 8);
    }
    header[MODEL_CHECKSUM_SLOT] = (int32_t)crc32c(crc32c(0, header, sizeof(header)), table, (size_t)n * TENSOR_ENTRY_BYTES);
    AtomicFile af;
    atomic_open(&af, path);
    atomic_write(&af, header, sizeof(header));
    atomic_write(&af, table, (size_t)n * TENSOR_ENTRY_BYTES);
    atomic_write(&af, params, tt->num_parameters * sizeof(float));
    atomic_commit(&af);
    free(table);
}

// Extends *crc by the next n bytes of f, read in 1 MiB pieces; returns the bytes read (< n: the file ended).
static uint64_t crc32c_of_file_bytes(FILE* f, uint64_t n, uint32_t* crc) {
    static unsigned char buf[1 << 20];
    uint64_t done = 0;
    while (done < n) {
        size_t want = n - done < sizeof(buf) ? (size_t)(n - done) : sizeof(buf);
        size_t got = fread(buf, 1, want, f);
        *crc = crc32c(*crc, buf, got);
        done += got;
        if (got < want) { break; }
    }
    return done;
}

// Checks the checksums of a model or state file (FORMATS.md "Checksums") and nothing else, trusting no field
// before the checksum that covers it has matched. Returns 1 when the file is intact; otherwise 0 with one line
// in why naming the file and the part that differs (the header, a tensor, AdamW's m or v), or what is missing.
// The loaders call it before they parse a file; -y 1 calls it to skip a damaged checkpoint.
static int checkpoint_file_intact(const char* path, char* why, size_t why_size) {
    FILE* f = fopen(path, "rb");
    if (f == NULL) { snprintf(why, why_size, "%s: cannot open (%s)", path, strerror(errno)); return 0; }
    int32_t header[256];
    unsigned char* table = NULL;
    int ok = 0;
    if (fread(header, 1, sizeof(header), f) != sizeof(header)) {
        snprintf(why, why_size, "%s: truncated (shorter than its 1024-byte header)", path);
    } else if (header[0] != MODEL_MAGIC && header[0] != STATE_MAGIC) {
        snprintf(why, why_size, "%s: not a train_kla model or state file (magic %d)", path, header[0]);
    } else if (header[1] == 1) {
        snprintf(why, why_size, "%s: a version 1 %s file, written before files carried checksums; this program reads "
                 "version 2 only (write it again with the current train_kla)", path, header[0] == MODEL_MAGIC ? "model" : "state");
    } else if (header[1] != (header[0] == MODEL_MAGIC ? MODEL_VERSION : STATE_VERSION)) {
        snprintf(why, why_size, "%s: file version %d, this program reads version %d", path, header[1],
                 header[0] == MODEL_MAGIC ? MODEL_VERSION : STATE_VERSION);
    } else if (header[0] == MODEL_MAGIC) {
        // header + tensor table, then each tensor against the checksum in its table entry
        uint32_t stored = (uint32_t)header[MODEL_CHECKSUM_SLOT];
        int n = header[12];
        header[MODEL_CHECKSUM_SLOT] = 0;
        uint32_t crc = crc32c(0, header, sizeof(header));
        if (n < 1 || n > MAX_TENSORS) {
            snprintf(why, why_size, "%s: checksum mismatch in the header (it claims %d tensors)", path, n);
            goto done;
        }
        table = (unsigned char*)malloc_or_die((size_t)n * TENSOR_ENTRY_BYTES);
        if (fread(table, 1, (size_t)n * TENSOR_ENTRY_BYTES, f) != (size_t)n * TENSOR_ENTRY_BYTES) {
            snprintf(why, why_size, "%s: truncated in the tensor table", path);
            goto done;
        }
        crc = crc32c(crc, table, (size_t)n * TENSOR_ENTRY_BYTES);
        if (crc != stored) {
            snprintf(why, why_size, "%s: checksum mismatch in the header or tensor table (stored %08x, computed %08x)", path, stored, crc);
            goto done;
        }
        uint64_t payload_at = 0;
        for (int i = 0; i < n; i++) {
            unsigned char* entry = table + (size_t)i * TENSOR_ENTRY_BYTES;
            int32_t ints[6];
            uint32_t tensor_crc;
            memcpy(&tensor_crc, entry + TENSOR_NAME_BYTES, 4);
            memcpy(ints, entry + 96, sizeof(ints));
            entry[TENSOR_NAME_BYTES - 1] = '\0';
            uint64_t bytes = sizeof(float);
            for (int d = 0; d < 4; d++) {
                int dim = d < ints[1] ? ints[d + 2] : 1;
                if (ints[1] < 1 || ints[1] > 4 || dim < 1 || bytes > ((uint64_t)1 << 40)) {
                    snprintf(why, why_size, "%s: tensor table entry %d (%s) has an invalid shape", path, i, (char*)entry);
                    goto done;
                }
                bytes *= (uint64_t)dim;
            }
            crc = 0;
            if (crc32c_of_file_bytes(f, bytes, &crc) != bytes) {
                snprintf(why, why_size, "%s: truncated in tensor %s (payload bytes %llu..%llu)", path, (char*)entry,
                         (unsigned long long)payload_at, (unsigned long long)(payload_at + bytes));
                goto done;
            }
            if (crc != tensor_crc) {
                snprintf(why, why_size, "%s: checksum mismatch in tensor %s (payload bytes %llu..%llu; stored %08x, computed %08x)",
                         path, (char*)entry, (unsigned long long)payload_at, (unsigned long long)(payload_at + bytes), tensor_crc, crc);
                goto done;
            }
            payload_at += bytes;
        }
        if (fgetc(f) != EOF) { snprintf(why, why_size, "%s: file is longer than its tensors", path); goto done; }
        ok = 1;
    } else {
        // header + dataloader state + run flags, then m, then v
        uint32_t stored[3];
        memcpy(stored, header + STATE_CHECKSUM_SLOT, sizeof(stored));
        memset(header + STATE_CHECKSUM_SLOT, 0, sizeof(stored));
        uint64_t np = (uint64_t)(uint32_t)header[4] | ((uint64_t)(uint32_t)header[5] << 32);
        int32_t loader_bytes = header[6];
        if (loader_bytes < 0 || loader_bytes > (1 << 20) || np > ((uint64_t)1 << 40)) {
            snprintf(why, why_size, "%s: checksum mismatch in the header (it claims %d dataloader bytes, %llu parameters)", path,
                     loader_bytes, (unsigned long long)np);
            goto done;
        }
        int32_t flags_bytes = header[STATE_RUN_FLAGS_SLOT];
        if (flags_bytes < 0 || flags_bytes > RUN_FLAGS_BYTES) {
            snprintf(why, why_size, "%s: checksum mismatch in the header (it claims %d bytes of run flags)", path, flags_bytes);
            goto done;
        }
        uint32_t crc = crc32c(0, header, sizeof(header));
        if (crc32c_of_file_bytes(f, (uint64_t)loader_bytes, &crc) != (uint64_t)loader_bytes ||
            crc32c_of_file_bytes(f, (uint64_t)flags_bytes, &crc) != (uint64_t)flags_bytes) {
            snprintf(why, why_size, "%s: truncated in the dataloader state or the run's flags", path);
            goto done;
        }
        if (crc != stored[0]) {
            snprintf(why, why_size, "%s: checksum mismatch in the header, dataloader state or run flags (stored %08x, computed %08x)", path, stored[0], crc);
            goto done;
        }
        const char* names[2] = {"AdamW first moment m", "AdamW second moment v"};
        for (int k = 0; k < (header[7] ? 2 : 0); k++) {
            crc = 0;
            if (crc32c_of_file_bytes(f, np * sizeof(float), &crc) != np * sizeof(float)) {
                snprintf(why, why_size, "%s: truncated in the %s", path, names[k]);
                goto done;
            }
            if (crc != stored[1 + k]) {
                snprintf(why, why_size, "%s: checksum mismatch in the %s (stored %08x, computed %08x)", path, names[k], stored[1 + k], crc);
                goto done;
            }
        }
        if (fgetc(f) != EOF) { snprintf(why, why_size, "%s: file is longer than expected", path); goto done; }
        ok = 1;
    }
done:
    free(table);
    fclose(f);
    return ok;
}

// Read a model file's header into a Config, checking everything that can be checked without the flags.
// The magic, the version and the checksums were checked by checkpoint_file_intact.
static void read_model_header(const char* path, FILE* f, Config* c, int* num_tensors) {
    int32_t header[256];
    fread_or_die(header, sizeof(header), f, path);
    if (header[0] != MODEL_MAGIC) { die("%s: not a train_kla model file (magic %d, expected %d)", path, header[0], MODEL_MAGIC); }
    if (header[13] != 0) { die("%s: tensors stored as dtype %d; train_kla.c reads fp32 (dtype 0) only", path, header[13]); }
    memset(c, 0, sizeof(*c));
    c->vocab_size = header[2];
    c->padded_vocab_size = header[3];
    c->max_seq_len = header[4];
    c->num_layers = header[5];
    c->channels = header[6];
    c->num_heads = header[7];
    c->lin_heads = header[8];
    c->lin_dk = header[9];
    c->lin_dv = header[10];
    c->conv_size = header[11];
    *num_tensors = header[12];
    c->norm_eps = slot_to_f32(header[16]);
    c->l2norm_eps = slot_to_f32(header[17]);
    c->onorm_eps = slot_to_f32(header[18]);
    c->kaczmarz_eps = slot_to_f32(header[19]);
    c->norm = header[20];
    c->mlp = header[21];
    c->mlp_hidden = header[22];
    c->precond_x = slot_to_f32(header[23]);
    c->precond_eps = slot_to_f32(header[24]);
    c->precond_onorm_eps = slot_to_f32(header[25]);
    c->gka_iters = header[26];
    c->gka_ridge = slot_to_f32(header[27]);
    c->gka_onorm_eps = slot_to_f32(header[28]);
    c->kalman_expand = header[29];
    c->kalman_n = header[30];
    c->kalman_preset = header[31];
    c->kalman_rank = header[32];
    c->gka_kv_heads = header[33];
    // the task (slots 35-37; zero in a file of a model trained on token shards)
    c->task.kind = header[35];
    c->task.len = header[36];
    c->task.pairs = header[37];
    c->task.vocab = c->task.kind != TASK_NONE ? c->vocab_size : 0;
    if (c->task.kind < 0 || c->task.kind >= NUM_TASKS) { die("%s: unknown task id %d in the header", path, c->task.kind); }
    if (c->task.kind == TASK_NONE ? c->task.len != 0 || c->task.pairs != 0 : !task_is_valid(&c->task)) {
        die("%s: invalid %s task (vocab %d, length %d, pairs %d) in the header", path, TASK_NAMES[c->task.kind],
            c->task.vocab, c->task.len, c->task.pairs);
    }
    if (c->gka_kv_heads < 1 || c->lin_heads % c->gka_kv_heads != 0) {
        die("%s: gka key/value heads %d do not divide the %d heads", path, c->gka_kv_heads, c->lin_heads);
    }
    if (c->kalman_expand < 1 || c->kalman_n < 1 || c->kalman_preset < 0 || c->kalman_preset >= NUM_KALMAN_PRESETS ||
        c->kalman_rank != (c->kalman_preset == KALMAN_MAMBA ? (c->channels + 7) / 8 : 0)) {
        die("%s: invalid kalman expand %d / N %d / preset %d / rank %d in the header", path, c->kalman_expand, c->kalman_n,
            c->kalman_preset, c->kalman_rank);
    }
    if (c->gka_iters < 0 || !(c->gka_ridge >= 0.0f)) { die("%s: invalid gka iterations %d / ridge %g in the header", path, c->gka_iters, c->gka_ridge); }
    if (c->norm < 0 || c->norm >= NUM_NORMS) { die("%s: unknown norm kind %d in the header", path, c->norm); }
    if (c->mlp < 0 || c->mlp >= NUM_MLPS || (c->mlp != MLP_NONE) != (c->mlp_hidden > 0)) {
        die("%s: invalid MLP kind %d / hidden width %d in the header", path, c->mlp, c->mlp_hidden);
    }
    char pattern[513];
    memcpy(pattern, (char*)header + 512, 512);
    pattern[512] = '\0';
    char what[4200];
    snprintf(what, sizeof(what), "%s: mixer pattern", path);
    int L = parse_mixer_pattern(pattern, c->mixer, what);
    if (L != c->num_layers) { die("%s: mixer pattern '%s' has %d layers but the header says %d", path, pattern, L, c->num_layers); }
    if (c->vocab_size < 1 || c->padded_vocab_size < c->vocab_size || c->channels < 1 || c->max_seq_len < 1 ||
        c->num_heads < 1 || c->channels % c->num_heads != 0 || c->lin_heads < 0 || c->lin_dk < 0 || c->lin_dv < 0 || c->conv_size < 0) {
        die("%s: header holds an invalid model config", path);
    }
    // every tensor dimension of the layout must fit an int (found by fuzzing: a header with huge head counts
    // overflowed the layout's arithmetic); the file's size bounds the number of parameters
    const int64_t dims[] = {c->padded_vocab_size, c->max_seq_len, c->channels, c->lin_heads, c->lin_dk, c->lin_dv, c->conv_size,
                            c->mlp_hidden, c->kalman_n, (int64_t)c->lin_heads * c->lin_dk, (int64_t)c->lin_heads * c->lin_dv,
                            (int64_t)c->kalman_expand * c->channels};
    for (size_t i = 0; i < sizeof(dims) / sizeof(dims[0]); i++) {
        if (dims[i] > (1 << 20)) { die("%s: header holds an invalid model config (a dimension above 2^20)", path); }
    }
    int64_t payload_offset = (int64_t)((uint64_t)(uint32_t)header[14] | ((uint64_t)(uint32_t)header[15] << 32));
    if (*num_tensors < 1 || *num_tensors > MAX_TENSORS || payload_offset != 1024 + (int64_t)TENSOR_ENTRY_BYTES * *num_tensors) {
        die("%s: header has an inconsistent tensor count / payload offset", path);
    }
}

// Open a model file and check its header and tensor table: every tensor entry must match the layout the
// header's config implies. Fills c and tt; the file is left at the start of the fp32 payload, which
// read_model_payload reads.
static FILE* open_model_file(const char* path, Config* c, TensorTable* tt) {
    char why[4400];
    if (!checkpoint_file_intact(path, why, sizeof(why))) { die("%s", why); }
    FILE* f = fopen_or_die(path, "rb");
    int n;
    read_model_header(path, f, c, &n);
    build_parameter_layout(c, tt, NULL, NULL);
    if (n != tt->num_tensors) { die("%s: file lists %d tensors, the config in its header implies %d", path, n, tt->num_tensors); }
    for (int i = 0; i < n; i++) {
        const TensorInfo* t = &tt->t[i];
        unsigned char entry[TENSOR_ENTRY_BYTES];
        int32_t ints[6];
        int64_t offset;
        fread_or_die(entry, sizeof(entry), f, path);
        memcpy(ints, entry + 96, sizeof(ints));
        memcpy(&offset, entry + 120, 8);
        entry[TENSOR_NAME_BYTES - 1] = '\0';
        if (strcmp((char*)entry, t->name) != 0) { die("%s: tensor %d is '%s', expected '%s'", path, i, (char*)entry, t->name); }
        if (ints[0] != 0) { die("%s: tensor %s has dtype %d, expected 0 (fp32)", path, t->name, ints[0]); }
        if (ints[1] != t->ndim || ints[2] != t->shape[0] || ints[3] != t->shape[1] || ints[4] != 0 || ints[5] != 0) {
            die("%s: tensor %s has shape (%d, %d), expected (%d, %d)", path, t->name, ints[2], ints[3], t->shape[0], t->shape[1]);
        }
        if (offset != (int64_t)(t->offset * sizeof(float))) { die("%s: tensor %s at payload offset %lld, expected %zu", path, t->name, (long long)offset, t->offset * sizeof(float)); }
    }
    return f;
}

// Read the payload of a file opened by open_model_file into params (num_parameters floats); the size must be exact.
static void read_model_payload(FILE* f, const char* path, float* params, size_t num_parameters) {
    fread_or_die(params, num_parameters * sizeof(float), f, path);
    if (fgetc(f) != EOF) { die("%s: file is longer than its %zu parameters", path, num_parameters); }
    fclose(f);
}

typedef struct {
    int64_t step;       // optimizer updates done
    DataLoaderState loader;
    // the run's flags (FORMATS.md "State file"): name and value of each, every one a NUL-terminated string
    char run_flags[RUN_FLAGS_BYTES];
    int32_t run_flags_bytes;
} TrainState;

// m and v: AdamW's moments (num_parameters floats each), or NULL before the first update.
static void write_state_file(const TrainState* s, size_t num_parameters, const float* m, const float* v, const char* path) {
    int32_t header[256] = {0};
    header[0] = STATE_MAGIC;
    header[1] = STATE_VERSION;
    header[2] = (int32_t)(s->step & 0xffffffff);
    header[3] = (int32_t)(s->step >> 32);
    header[4] = (int32_t)(num_parameters & 0xffffffff);
    header[5] = (int32_t)((uint64_t)num_parameters >> 32);
    header[6] = (int32_t)sizeof(DataLoaderState);
    header[7] = m != NULL;
    header[STATE_RUN_FLAGS_SLOT] = s->run_flags_bytes;
    uint32_t crc = crc32c(crc32c(0, header, sizeof(header)), &s->loader, sizeof(DataLoaderState));
    header[STATE_CHECKSUM_SLOT] = (int32_t)crc32c(crc, s->run_flags, (size_t)s->run_flags_bytes);
    if (m) {
        header[STATE_CHECKSUM_SLOT + 1] = (int32_t)crc32c(0, m, num_parameters * sizeof(float));
        header[STATE_CHECKSUM_SLOT + 2] = (int32_t)crc32c(0, v, num_parameters * sizeof(float));
    }
    AtomicFile af;
    atomic_open(&af, path);
    atomic_write(&af, header, sizeof(header));
    atomic_write(&af, &s->loader, sizeof(DataLoaderState));
    atomic_write(&af, s->run_flags, (size_t)s->run_flags_bytes);
    if (m) {
        atomic_write(&af, m, num_parameters * sizeof(float));
        atomic_write(&af, v, num_parameters * sizeof(float));
    }
    atomic_commit(&af);
}

// Open a state file, after checking its checksums, and read everything before AdamW's moments into s; header
// receives the file's header.
static FILE* open_state_file(TrainState* s, int32_t header[256], const char* path) {
    char why[4400];
    if (!checkpoint_file_intact(path, why, sizeof(why))) { die("%s", why); }  // magic, version 2, every checksum
    FILE* f = fopen_or_die(path, "rb");
    fread_or_die(header, 256 * sizeof(int32_t), f, path);
    if (header[0] != STATE_MAGIC) { die("%s: not a train_kla state file (magic %d)", path, header[0]); }
    s->step = (int64_t)((uint64_t)(uint32_t)header[2] | ((uint64_t)(uint32_t)header[3] << 32));
    if (header[6] != (int32_t)sizeof(DataLoaderState)) { die("%s: dataloader state of %d bytes, expected %zu", path, header[6], sizeof(DataLoaderState)); }
    fread_or_die(&s->loader, sizeof(DataLoaderState), f, path);
    s->run_flags_bytes = header[STATE_RUN_FLAGS_SLOT];  // in range: checked with the checksums
    fread_or_die(s->run_flags, (size_t)s->run_flags_bytes, f, path);
    if (s->run_flags_bytes > 0 && s->run_flags[s->run_flags_bytes - 1] != '\0') { die("%s: the run's flags do not end with a NUL", path); }
    return f;
}

// Reads AdamW's moments into m and v (num_parameters floats each, allocated by the caller) when the file holds
// them; returns whether it did.
static int read_state_file(TrainState* s, size_t num_parameters, float* m, float* v, const char* path) {
    int32_t header[256];
    FILE* f = open_state_file(s, header, path);
    uint64_t np = (uint64_t)(uint32_t)header[4] | ((uint64_t)(uint32_t)header[5] << 32);
    if (np != num_parameters) { die("%s: state is for %llu parameters, the model has %zu", path, (unsigned long long)np, num_parameters); }
    if (header[7]) {
        fread_or_die(m, num_parameters * sizeof(float), f, path);
        fread_or_die(v, num_parameters * sizeof(float), f, path);
    }
    if (fgetc(f) != EOF) { die("%s: file is longer than expected", path); }
    fclose(f);
    return header[7] != 0;
}

// The highest step below `below` with a DONE_<step> marker in dir, or -1.
static inline int64_t find_checkpoint_below(const char* dir, int64_t below) {
    DIR* d = opendir(dir);
    if (d == NULL) { return -1; }
    int64_t best = -1;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        long long s;
        char rest;
        if (sscanf(e->d_name, "DONE_%lld%c", &s, &rest) == 1 && s > best && s < below) { best = s; }
    }
    closedir(d);
    return best;
}

// The highest step with a DONE_<step> marker in dir, or -1.
static inline int64_t find_latest_checkpoint(const char* dir) { return find_checkpoint_below(dir, INT64_MAX); }

static void checkpoint_path(char* buf, size_t size, const char* dir, const char* kind, int64_t step) {
    snprintf(buf, size, "%s/%s_%08lld%s", dir, kind, (long long)step, strcmp(kind, "DONE") == 0 ? "" : ".bin");
}

// -y 1: the newest complete checkpoint whose model and state files pass their checksums, or -1 when dir holds
// no complete checkpoint. A damaged one is skipped with one line naming it, the damage and the step used
// instead; when every one is damaged the run stops rather than silently starting from scratch.
static inline int64_t find_resumable_checkpoint(const char* dir) {
    int64_t step = find_latest_checkpoint(dir);
    if (step < 0) { return -1; }
    for (;;) {
        char model[4096], state[4096], why[4400];
        checkpoint_path(model, sizeof(model), dir, "model", step);
        checkpoint_path(state, sizeof(state), dir, "state", step);
        if (checkpoint_file_intact(model, why, sizeof(why)) && checkpoint_file_intact(state, why, sizeof(why))) { return step; }
        int64_t older = find_checkpoint_below(dir, step);
        if (older < 0) { die("-y 1: no intact checkpoint in %s (the oldest, step %lld: %s)", dir, (long long)step, why); }
        fprintf(stderr, "warning: -y 1: checkpoint %lld is damaged (%s); falling back to step %lld\n", (long long)step, why, (long long)older);
        step = older;
    }
}

// model_<step>.bin, state_<step>.bin, then the DONE_<step> marker. m, v: as write_state_file.
static void write_checkpoint(const Config* c, const TensorTable* tt, const float* params, const float* m, const float* v,
                             const TrainState* s, const char* dir) {
    char path[4096];
    checkpoint_path(path, sizeof(path), dir, "model", s->step);
    write_model_file(c, tt, params, path);
    checkpoint_path(path, sizeof(path), dir, "state", s->step);
    write_state_file(s, tt->num_parameters, m, v, path);
    checkpoint_path(path, sizeof(path), dir, "DONE", s->step);
    AtomicFile af;
    atomic_open(&af, path);
    atomic_commit(&af);
}

// Keep the newest `keep` complete checkpoints; the DONE marker goes first so a half-deleted one is never used.
static inline void delete_old_checkpoints(const char* dir, int keep) {
    if (keep <= 0) { return; }
    for (;;) {
        DIR* d = opendir(dir);
        if (d == NULL) { return; }
        int64_t oldest = -1;
        int count = 0;
        struct dirent* e;
        while ((e = readdir(d)) != NULL) {
            long long s;
            char rest;
            if (sscanf(e->d_name, "DONE_%lld%c", &s, &rest) == 1) {
                count++;
                if (oldest < 0 || s < oldest) { oldest = s; }
            }
        }
        closedir(d);
        if (count <= keep) { return; }
        const char* kinds[3] = {"DONE", "model", "state"};
        for (int k = 0; k < 3; k++) {
            char path[4096];
            checkpoint_path(path, sizeof(path), dir, kinds[k], oldest);
            remove(path);
        }
    }
}


// The k-th largest of a[0..n), k in [1, n]: quickselect (Hoare partition, descending) on a copy.
static inline float kth_largest(const float* a, int n, int k) {
    float* w = (float*)malloc_or_die((size_t)n * sizeof(float));
    memcpy(w, a, (size_t)n * sizeof(float));
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = w[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (w[i] > pivot) { i++; }
            while (w[j] < pivot) { j--; }
            if (i <= j) { float t = w[i]; w[i] = w[j]; w[j] = t; i++; j--; }
        }
        // now w[lo..j] >= pivot >= w[i..hi], and w[j+1..i-1] == pivot
        if (want <= j) { hi = j; } else if (want >= i) { lo = i; } else { break; }
    }
    float kth = w[want];
    free(w);
    return kth;
}

// Sample from softmax(logits[0..V)) / temperature by inverse CDF with a uniform coin in [0, 1). top_k > 0 keeps
// only the top_k largest logits (and any tied with the k-th), as GPT-2's sampling does; 0 keeps all.
static inline int sample_token(const float* logits, int V, float temperature, int top_k, float coin) {
    float cutoff = top_k > 0 && top_k < V ? kth_largest(logits, V, top_k) : -INFINITY;
    float maxv = -INFINITY;
    for (int i = 0; i < V; i++) { if (logits[i] > maxv) { maxv = logits[i]; } }
    double sum = 0.0;
    for (int i = 0; i < V; i++) { if (logits[i] >= cutoff) { sum += exp((logits[i] - maxv) / temperature); } }
    double cdf = 0.0, target = coin * sum;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (logits[i] < cutoff) { continue; }
        cdf += exp((logits[i] - maxv) / temperature);
        last = i;
        if (target < cdf) { return i; }
    }
    return last;  // only when round-off leaves target == sum
}

// ----------------------------------------------------------------------------------------------------------
// learning-rate schedules (llm.c's): warmup is linear from lr/W to lr over the first W steps

enum { SCHED_COSINE, SCHED_LINEAR, SCHED_CONSTANT, SCHED_WSD };
static const char* SCHED_NAMES[] = {"cosine", "linear", "constant", "wsd"};

static inline float learning_rate(int sched, int step, int total, int warmup, float lr, float final_frac) {
    float min_lr = lr * final_frac;
    if (sched != SCHED_CONSTANT && step < warmup) { return lr * (step + 1) / warmup; }
    if (sched == SCHED_CONSTANT) { return lr; }
    if (sched == SCHED_WSD) {  // warmup, stable, then decay over the last 20% by 1 - sqrt
        int decay_start = (int)(0.8f * total);
        if (decay_start < warmup) { decay_start = warmup; }
        if (step < decay_start) { return lr; }
        float r = (float)(step - decay_start) / (float)(total - decay_start > 0 ? total - decay_start : 1);
        return min_lr + (1.0f - sqrtf(r)) * (lr - min_lr);
    }
    float r = (float)(step - warmup) / (float)(total - warmup > 0 ? total - warmup : 1);
    if (r > 1.0f) { r = 1.0f; }
    if (sched == SCHED_LINEAR) { return lr - r * (lr - min_lr); }
    return min_lr + 0.5f * (1.0f + cosf((float)M_PI * r)) * (lr - min_lr);
}

// wall-clock seconds (monotonic): the step line's timing, and test_kla.cu's check that a micro-step does not wait
static inline double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// ----------------------------------------------------------------------------------------------------------
// command-line flags (the programs' main; not compiled into the tests)
#ifndef TESTING

typedef enum { FLAG_INT, FLAG_FLOAT, FLAG_STRING } FlagType;
typedef struct {
    const char* name;
    FlagType type;
    void* value;
    const char* help;
    int run_flag;  // 1: a setting of the training run (not of the model or the output dir), kept in the state file
                   // and taken back by -y 1 (FORMATS.md "State file")
    int given;     // set by the parser when the flag is on the command line
} Flag;

// The flag's value as text: a string as it is ("(none)" when unset), a number in the shortest %g form that reads
// back as the same value (so the state file keeps it exactly, and -h shows 0.003 rather than 0.00300000003).
static const char* flag_value_text(const Flag* f, char* buf, size_t size) {
    if (f->type == FLAG_STRING) { return *(char**)f->value ? *(char**)f->value : "(none)"; }
    if (f->type == FLAG_INT) { snprintf(buf, size, "%d", *(int*)f->value); return buf; }
    float x = *(float*)f->value;
    for (int digits = 6; digits <= 9; digits++) {  // 9 significant digits always read back a float exactly
        snprintf(buf, size, "%.*g", digits, x);
        if (strtof(buf, NULL) == x) { break; }
    }
    return buf;
}

// The README's flag table is tested against this output (dev/test/test_train.sh): keep the form "name help
// default: value".
static void print_usage(const Flag* flags, int n) {
    printf("usage: ./train_kla [flags]   (each flag takes one value)\n");
    for (int i = 0; i < n; i++) {
        char buf[64];
        printf("  %-14s %-62s default: %s\n", flags[i].name, flags[i].help, flag_value_text(&flags[i], buf, sizeof(buf)));
    }
}

// Levenshtein distance (insertions, deletions, substitutions of one character), for the "did you mean" of an
// unknown flag. b is a flag name (shorter than 64 characters); a may be anything the user typed.
static int edit_distance(const char* a, const char* b) {
    size_t nb = strlen(b);
    int row[64];
    if (nb >= 64) { die("internal: flag name %s is too long", b); }
    for (size_t j = 0; j <= nb; j++) { row[j] = (int)j; }
    for (size_t i = 1; a[i - 1] != '\0'; i++) {
        int diag = row[0];  // the distance of a[0..i-1) to b[0..j-1) from the row above
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) { best = up + 1; }
            if (row[j - 1] + 1 < best) { best = row[j - 1] + 1; }
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

static void parse_flags(Flag* flags, int n, int argc, char** argv) {
    for (int a = 1; a < argc; a += 2) {
        if (strcmp(argv[a], "-h") == 0 || strcmp(argv[a], "--help") == 0) { print_usage(flags, n); exit(0); }
        Flag* f = NULL;
        for (int i = 0; i < n; i++) { if (strcmp(argv[a], flags[i].name) == 0) { f = &flags[i]; } }
        if (f == NULL) {
            // suggest the nearest flag (the first of equals, in table order) when at most half the typed
            // characters would have to change: --mixr gives --mixer, a word far from every flag gives nothing
            const Flag* nearest = NULL;
            int best = 0;
            for (int i = 0; i < n; i++) {
                int d = edit_distance(argv[a], flags[i].name);
                if (nearest == NULL || d < best) { nearest = &flags[i]; best = d; }
            }
            if (2 * best <= (int)strlen(argv[a])) { die("unknown flag '%s': did you mean %s? (./train_kla -h lists them)", argv[a], nearest->name); }
            die("unknown flag '%s' (./train_kla -h lists them)", argv[a]);
        }
        if (a + 1 >= argc) { die("flag %s needs a value", argv[a]); }
        const char* v = argv[a + 1];
        char* end = NULL;
        errno = 0;
        if (f->type == FLAG_INT) {
            long x = strtol(v, &end, 10);
            if (end == v || *end != '\0' || errno != 0 || x < -2147483647L || x > 2147483647L) { die("flag %s: '%s' is not an integer", f->name, v); }
            *(int*)f->value = (int)x;
        } else if (f->type == FLAG_FLOAT) {
            float x = strtof(v, &end);
            if (end == v || *end != '\0' || errno != 0 || !isfinite(x)) { die("flag %s: '%s' is not a finite number", f->name, v); }
            *(float*)f->value = x;
        } else {
            *(char**)f->value = argv[a + 1];
        }
        f->given = 1;
    }
}

static Flag* find_flag(Flag* flags, int n, const char* name) {
    for (int i = 0; i < n; i++) { if (strcmp(flags[i].name, name) == 0) { return &flags[i]; } }
    return NULL;
}

static void require(int ok, const char* flag, const char* what) {
    if (!ok) { die("flag %s: %s", flag, what); }
}

// The index of value in names, or die naming the flag and the choices.
static int parse_choice(const char* value, const char** names, int n, const char* flag) {
    char choices[256] = "";
    for (int i = 0; i < n; i++) {
        if (strcmp(value, names[i]) == 0) { return i; }
        snprintf(choices + strlen(choices), sizeof(choices) - strlen(choices), "%s%s", i ? ", " : "", names[i]);
    }
    die("flag %s: '%s' is not one of %s", flag, value, choices);
}

// Create dir (and parents) and prove it is writable, before any training happens.
static void prepare_output_dir(const char* dir) {
    char path[4096];
    snprintf(path, sizeof(path), "%s", dir);
    for (char* p = path + 1; *p; p++) {
        if (*p == '/') { *p = '\0'; mkdir(path, 0755); *p = '/'; }
    }
    if (mkdir(path, 0755) != 0 && errno != EEXIST) { die("-o %s: cannot create directory (%s)", dir, strerror(errno)); }
    snprintf(path, sizeof(path), "%s/.write_test", dir);
    FILE* f = fopen(path, "wb");
    if (f == NULL || fputc('x', f) == EOF || fclose(f) != 0) { die("-o %s: directory is not writable (%s)", dir, strerror(errno)); }
    remove(path);
    // One run per directory: two would interleave their checkpoints. The lock is an flock on dir/.lock, held
    // until the process ends; the kernel releases it however the process ends (kill -9 included), so a dead
    // run never leaves a stale lock. The file holds the owner's pid for the error message.
    snprintf(path, sizeof(path), "%s/.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) { die("-o %s: cannot create the lock file %s (%s)", dir, path, strerror(errno)); }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char owner[32] = "?";
        ssize_t got = read(fd, owner, sizeof(owner) - 1);
        owner[got > 0 ? got : 1] = '\0';
        owner[strcspn(owner, "\n")] = '\0';
        die("-o %s: another run (pid %s) is using this directory (lock file %s)", dir, owner, path);
    }
    char pid[32];
    int len = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || write(fd, pid, (size_t)len) != len) { die("-o %s: cannot write the lock file %s", dir, path); }
    // a file-size limit (ulimit -f) would kill the process with SIGXFSZ in the middle of a checkpoint; ignored,
    // the write fails with EFBIG instead and atomic_write reports it in one line
    signal(SIGXFSZ, SIG_IGN);
}

// A single mixer name without a count (`gdn`) means every layer: it is repeated to the depth (README, "Patterns").
static int pattern_is_single_name(const char* pattern) { return strpbrk(pattern, ":,") == NULL; }

// The layers of --mixer: a single name is repeated to `depth`; any other pattern gives its own layer count, which
// must equal `depth` when the depth was given explicitly. Returns the number of layers.
static int expand_mixer_pattern(const char* pattern, int* mixer, int depth, int depth_given, const char* what) {
    int L = parse_mixer_pattern(pattern, mixer, what);
    if (pattern_is_single_name(pattern)) {
        for (int l = 1; l < depth; l++) { mixer[l] = mixer[0]; }
        return depth;
    }
    if (depth_given && L != depth) { die("%s: pattern '%s' has %d layers but --depth is %d", what, pattern, L, depth); }
    return L;
}

// Flags that describe the model must agree with a model loaded from a file.
static void check_model_flags(const Config* c, Flag* flags, int n, const char* path) {
    struct { const char* flag; int value; } fields[] = {
        {"--depth", c->num_layers}, {"--width", c->channels}, {"--heads", c->num_heads}, {"--lin-heads", c->lin_heads},
        {"--dk", c->lin_dk}, {"--dv", c->lin_dv}, {"--max-seq-len", c->max_seq_len}, {"--vocab-size", c->vocab_size},
        {"--mlp-hidden", c->mlp_hidden}, {"--gka-iters", c->gka_iters}, {"--gka-kv-heads", c->gka_kv_heads},
        {"--kalman-expand", c->kalman_expand},
        {"--kalman-n", c->kalman_n},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        Flag* f = find_flag(flags, n, fields[i].flag);
        if (f->given && *(int*)f->value != fields[i].value) {
            die("%s: the checkpoint has %s %d but the flags ask for %d", path, fields[i].flag, fields[i].value, *(int*)f->value);
        }
    }
    struct { const char* flag; const char** names; int count, value; } choices[] = {
        {"--norm", NORM_NAMES, NUM_NORMS, c->norm}, {"--mlp", MLP_NAMES, NUM_MLPS, c->mlp},
        {"--kalman-preset", KALMAN_PRESET_NAMES, NUM_KALMAN_PRESETS, c->kalman_preset},
    };
    for (size_t i = 0; i < sizeof(choices) / sizeof(choices[0]); i++) {
        Flag* f = find_flag(flags, n, choices[i].flag);
        if (f->given && parse_choice(*(char**)f->value, choices[i].names, choices[i].count, choices[i].flag) != choices[i].value) {
            die("%s: the checkpoint has %s %s but the flags ask for %s", path, choices[i].flag, choices[i].names[choices[i].value], *(char**)f->value);
        }
    }
    Flag* f = find_flag(flags, n, "--mixer");
    if (f->given) {
        int mixer[MAX_LAYERS];
        int L = expand_mixer_pattern(*(char**)f->value, mixer, c->num_layers, 0, "--mixer");
        char have[512];
        format_mixer_pattern(c, have, sizeof(have));
        if (L != c->num_layers || memcmp(mixer, c->mixer, L * sizeof(int)) != 0) {
            die("%s: the checkpoint's mixer pattern is '%s' but --mixer asks for '%s'", path, have, *(char**)f->value);
        }
    }
}

#define MAX_FLAGS 80
#define MAX_EVAL_LENS 16

// Everything the command line sets (defaults in parse_options), and the model config the flags describe.
typedef struct {
    const char *train_glob, *val_glob, *out_dir, *init_file, *mixer, *schedule, *prompt, *tokenizer_path;
    const char *kalman_preset, *norm, *mlp;
    // total_batch: -d; 0 (the default) until train_main makes it one micro-batch per rank, B*T*ranks
    int B, T, total_batch, max_steps, warmup, val_every, val_batches, sample_every, gen_tokens, ckpt_every, ckpt_keep;
    int resume, depth, width, heads, lin_heads, dk, dv, max_seq_len, vocab_size, seed, shuffle, chunk, mlp_hidden;
    const char* rows_name;  // --rows, parsed into rows (DL_ROWS_*)
    int rows;
    int gka_iters, gka_kv_heads, kalman_expand, kalman_n, recompute, zero, overwrite;
    int generate, eval, samples, top_k, sample_seed;  // use -e without training (--generate, --eval), and sampling
    const char *task_name, *task_eval;      // --task, --task-eval
    const char* hellaswag;                  // --hellaswag: the multiple-choice eval file (dataloader.h's EvalFile)
    int hellaswag_every, hellaswag_max;     // --hellaswag-every, --hellaswag-max
    int task_vocab, task_len, task_pairs;   // --task-vocab, --task-len, --task-pairs (0 = the task's default)
    Task task;                              // the task the run trains on (kind TASK_NONE: token shards)
    int eval_lens[MAX_EVAL_LENS];           // --task-eval: extra evaluation lengths (task length parameter)
    int num_eval_lens;
    float norm_eps, lr, final_frac, weight_decay, beta1, beta2, adam_eps, grad_clip, temperature;
    int sched;            // SCHED_* of -k
    Config config;        // the model the flags describe (used for a fresh initialisation)
    Flag flags[MAX_FLAGS];  // the table, with `given` set, for check_model_flags
    int num_flags;
    char run_flags[RUN_FLAGS_BYTES];  // the run flags as given or defaulted, as the state file keeps them
    int run_flags_bytes;
} Options;

// --generate and --eval use the model of -e and exit without training. A flag that only training reads, or only
// the mode that was not asked for, would be silently ignored, so it is refused. Then -g takes the --generate
// length, and --eval's -m defaults to the whole split.
static void check_checkpoint_use_flags(Options* o) {
    const char* mode = o->generate > 0 ? "--generate" : "--eval";
    if (o->init_file == NULL) { die("flag %s: needs the model to use (-e model.bin)", mode); }
    static const char* training[] = {"-i", "-y", "-d", "-x", "-k", "-l", "-u", "-q", "-c", "-v", "-s", "-g", "-n", "-nk",
                                     "--seed", "--rows", "--shuffle", "--beta1", "--beta2", "--adam-eps", "--grad-clip", "-r", "-z",
                                     "--hellaswag-every"};
    static const char* of_eval[] = {"-j", "-m", "-b", "-t", "-o", "--hellaswag", "--hellaswag-max"};
    static const char* of_generate[] = {"--prompt", "--temperature", "--top-k", "--samples", "--sample-seed", "--tokenizer"};
    for (size_t i = 0; i < sizeof(training) / sizeof(training[0]); i++) {
        if (find_flag(o->flags, o->num_flags, training[i])->given) {
            die("flag %s: a training flag, but %s uses -e without training", training[i], mode);
        }
    }
    for (size_t i = 0; i < sizeof(of_eval) / sizeof(of_eval[0]) && !o->eval; i++) {
        if (find_flag(o->flags, o->num_flags, of_eval[i])->given) { die("flag %s: only --eval uses it, and --eval is not given", of_eval[i]); }
    }
    for (size_t i = 0; i < sizeof(of_generate) / sizeof(of_generate[0]) && o->generate == 0; i++) {
        if (find_flag(o->flags, o->num_flags, of_generate[i])->given) { die("flag %s: only --generate uses it, and --generate is not given", of_generate[i]); }
    }
    o->gen_tokens = o->generate;
    if (o->eval && !find_flag(o->flags, o->num_flags, "-m")->given) { o->val_batches = -1; }
}

// With a task the data come from its generator (tasks.h): the sequence length and the vocabulary are the task's,
// and the flags about token shards and GPT-2 text are errors. Used for --task, and for a checkpoint whose header
// names a task (use_checkpoint_task).
static const char* TASK_SHARD_FLAGS[] = {"-i", "-j", "-t", "--vocab-size", "--rows", "--shuffle", "--prompt", "--tokenizer",
                                         "--hellaswag"};
#define NUM_TASK_SHARD_FLAGS ((int)(sizeof(TASK_SHARD_FLAGS) / sizeof(TASK_SHARD_FLAGS[0])))

// A flag that has no meaning with a task: those of token shards and GPT-2 text, and -g (samples)
static int task_ignores_flag(const char* name) {
    for (int i = 0; i < NUM_TASK_SHARD_FLAGS; i++) { if (strcmp(name, TASK_SHARD_FLAGS[i]) == 0) { return 1; } }
    return strcmp(name, "-g") == 0;
}

static void options_use_task(Options* o, const Task* t) {
    for (int i = 0; i < NUM_TASK_SHARD_FLAGS; i++) {
        if (find_flag(o->flags, o->num_flags, TASK_SHARD_FLAGS[i])->given) {
            die("flag %s: not used with a task (%s generates its data; the length is --task-len, the vocabulary --task-vocab)",
                TASK_SHARD_FLAGS[i], TASK_NAMES[t->kind]);
        }
    }
    if (find_flag(o->flags, o->num_flags, "-g")->given && o->gen_tokens > 0) {
        die("flag -g: a task is scored by accuracy, not by GPT-2 samples (leave -g out or set 0)");
    }
    require(o->max_steps != -1, "-x", "a task has no epochs: give the number of steps");
    char why[160];
    for (int i = 0; i < o->num_eval_lens; i++) {
        if (task_length_problem(t, o->eval_lens[i], why, sizeof(why))) { die("flag --task-eval: %s: %s", TASK_NAMES[t->kind], why); }
    }
    o->task = *t;
    o->T = task_seq_len(t, t->len);
    o->vocab_size = t->vocab;
    o->gen_tokens = 0;
    if (o->total_batch % (o->B * o->T) != 0) { die("flag -d: %d is not a multiple of B*T = %d*%d (T: the task's sequence length)", o->total_batch, o->B, o->T); }
}

// --task and its parameters; the --task-* flags without --task are errors.
static void parse_task_flags(Options* o) {
    const char* task_flags[] = {"--task-vocab", "--task-len", "--task-pairs", "--task-eval"};
    if (o->task_name == NULL) {
        for (size_t i = 0; i < sizeof(task_flags) / sizeof(task_flags[0]); i++) {
            if (find_flag(o->flags, o->num_flags, task_flags[i])->given) { die("flag %s: needs --task", task_flags[i]); }
        }
        return;
    }
    for (const char* p = o->task_eval; p && *p;) {  // a comma-separated list of positive lengths
        char* end;
        long len = strtol(p, &end, 10);
        if (end == p || len < 1 || len > 1 << 24 || (*end != ',' && *end != '\0') || (*end == ',' && end[1] == '\0')) {
            die("flag --task-eval: '%s' is not a comma-separated list of lengths >= 1", o->task_eval);
        }
        if (o->num_eval_lens == MAX_EVAL_LENS) { die("flag --task-eval: more than %d lengths", MAX_EVAL_LENS); }
        o->eval_lens[o->num_eval_lens++] = (int)len;
        p = *end == ',' ? end + 1 : end;
    }
    Task t = {0};
    t.kind = 1 + parse_choice(o->task_name, TASK_NAMES + 1, NUM_TASKS - 1, "--task");
    require(o->task_vocab >= 0 && o->task_vocab <= 1 << 24, "--task-vocab", "must be in [0, 2^24] (0 = the task's default)");
    require(o->task_len >= 0, "--task-len", "must be >= 0 (0 = the task's default)");
    require(o->task_pairs >= 0, "--task-pairs", "must be >= 0 (0 = the task's default)");
    task_defaults(t.kind, &t.vocab, &t.len, &t.pairs);
    if (o->task_vocab != 0) { t.vocab = o->task_vocab; }
    if (o->task_len != 0) { t.len = o->task_len; }
    if (o->task_pairs != 0) { t.pairs = o->task_pairs; }
    char why[160];
    if (task_vocab_problem(&t, why, sizeof(why))) { die("flag --task-vocab: %s: %s", TASK_NAMES[t.kind], why); }
    if (task_pairs_problem(&t, why, sizeof(why))) { die("flag --task-pairs: %s: %s", TASK_NAMES[t.kind], why); }
    if (task_length_problem(&t, t.len, why, sizeof(why))) { die("flag --task-len: %s: %s", TASK_NAMES[t.kind], why); }
    options_use_task(o, &t);
}

// A model read from a file (-e, -y 1) keeps its task: --task and the --task-* flags given must agree with the
// checkpoint's, and a checkpoint that names a task makes the run use it (a file without one holds an LM).
static inline void use_checkpoint_task(Options* o, const Config* c, const char* path) {
    const Task* t = &c->task;
    if (o->task.kind != t->kind && o->task.kind != TASK_NONE) {
        die("%s: the checkpoint was trained on %s but --task asks for %s", path,
            t->kind == TASK_NONE ? "token shards (no task)" : TASK_NAMES[t->kind], TASK_NAMES[o->task.kind]);
    }
    if (t->kind == TASK_NONE) { return; }
    struct { const char* flag; int have; int want; } fields[] = {
        {"--task-vocab", t->vocab, o->task_vocab}, {"--task-len", t->len, o->task_len}, {"--task-pairs", t->pairs, o->task_pairs},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (find_flag(o->flags, o->num_flags, fields[i].flag)->given && fields[i].want != fields[i].have) {
            die("%s: the checkpoint's task has %s %d but the flags ask for %d", path, fields[i].flag, fields[i].have, fields[i].want);
        }
    }
    options_use_task(o, t);
}

// the data and tokenizer `make data` writes, the defaults of -i, -j and --tokenizer
#define DEFAULT_TRAIN_GLOB "data/demo/demo_train_*.bin"
#define DEFAULT_VAL_GLOB "data/demo/demo_val_*.bin"
#define DEFAULT_TOKENIZER "data/tokenizer.bin"

// Parse and check every flag (one-line error and exit 1 on anything wrong), before anything is read or written.
static void parse_options(Options* o, int argc, char** argv) {
    memset(o, 0, sizeof(*o));
    o->train_glob = DEFAULT_TRAIN_GLOB;
    o->val_glob = DEFAULT_VAL_GLOB;
    o->out_dir = NULL;
    o->init_file = NULL;
    o->mixer = "gdn";
    o->schedule = "cosine";
    o->prompt = NULL;
    o->tokenizer_path = DEFAULT_TOKENIZER;
    o->B = 8;
    o->T = 64;
    o->total_batch = 0;
    o->max_steps = -1;
    o->warmup = 20;
    o->val_every = 20;
    o->val_batches = 20;
    o->sample_every = 0;
    o->gen_tokens = 64;
    o->ckpt_every = 0;
    o->ckpt_keep = 0;
    o->resume = 0;
    o->depth = 4;
    o->width = 128;
    o->heads = 4;
    o->lin_heads = 0;
    o->dk = 0;
    o->dv = 0;
    o->max_seq_len = 1024;
    o->vocab_size = 50257;
    o->seed = 1337;
    o->rows_name = "independent";
    o->shuffle = 1;
    o->chunk = 64;
    o->mlp_hidden = 0;
    o->gka_iters = 30;
    o->gka_kv_heads = 0;
    o->kalman_expand = 1;
    o->kalman_n = 16;
    o->kalman_preset = "plain";
    o->norm = "layernorm";
    o->mlp = "gelu";
    o->norm_eps = 1e-5f;
    o->lr = 3e-3f;
    o->final_frac = 0.1f;
    o->weight_decay = 0.0f;
    o->beta1 = 0.9f;
    o->beta2 = 0.95f;
    o->adam_eps = 1e-8f;
    o->grad_clip = 1.0f;
    o->temperature = 1.0f;
    o->recompute = 0;
    o->generate = 0;
    o->eval = 0;
    o->samples = 1;
    o->top_k = 0;
    o->sample_seed = 1337;
    o->overwrite = 0;
    o->hellaswag = NULL;
    o->hellaswag_every = 0;
    o->hellaswag_max = 0;
    // the 1 after the help marks a run flag (Flag.run_flag): kept in the state file, taken back by -y 1; then `given`
    Flag flags[] = {
        {"-i", FLAG_STRING, &o->train_glob, "train token shards (glob)", 1, 0},
        {"-j", FLAG_STRING, &o->val_glob, "validation token shards (glob)", 1, 0},
        {"-o", FLAG_STRING, &o->out_dir, "output dir for main.log and checkpoints", 0, 0},
        {"-e", FLAG_STRING, &o->init_file, "initialise from this model file (else random init)", 0, 0},
        {"-y", FLAG_INT, &o->resume, "1 = resume from the newest intact complete checkpoint in -o", 0, 0},
        {"--overwrite", FLAG_INT, &o->overwrite, "1 = first delete the log and checkpoints of a run in -o", 0, 0},
        {"-b", FLAG_INT, &o->B, "micro-batch size (sequences)", 1, 0},
        {"-t", FLAG_INT, &o->T, "sequence length", 1, 0},
        {"-d", FLAG_INT, &o->total_batch, "total batch in tokens, a multiple of B*T*ranks (0 = B*T*ranks)", 1, 0},
        {"-x", FLAG_INT, &o->max_steps, "optimizer steps (-1 = one epoch of the train shards)", 1, 0},
        {"-k", FLAG_STRING, &o->schedule, "lr schedule: cosine, linear, constant, wsd", 1, 0},
        {"-l", FLAG_FLOAT, &o->lr, "peak learning rate", 1, 0},
        {"-u", FLAG_INT, &o->warmup, "warmup steps", 1, 0},
        {"-q", FLAG_FLOAT, &o->final_frac, "final lr as a fraction of the peak", 1, 0},
        {"-c", FLAG_FLOAT, &o->weight_decay, "AdamW weight decay (matrices only)", 1, 0},
        {"-v", FLAG_INT, &o->val_every, "validation loss every N steps (0 = only at the end)", 1, 0},
        {"-m", FLAG_INT, &o->val_batches, "validation batches (-1 = the whole val split)", 1, 0},
        {"-s", FLAG_INT, &o->sample_every, "print a sample every N steps (0 = only at the end)", 1, 0},
        {"-g", FLAG_INT, &o->gen_tokens, "tokens per sample during training (0 = no samples)", 1, 0},
        {"-n", FLAG_INT, &o->ckpt_every, "checkpoint every N steps (0 = only at the end; needs -o)", 1, 0},
        {"-nk", FLAG_INT, &o->ckpt_keep, "keep only the newest N checkpoints (0 = keep all)", 1, 0},
        {"--mixer", FLAG_STRING, &o->mixer, "mixer pattern: one name for every layer (gdn), or counts (attn:2,gdn:1,kaczmarz:1)", 0, 0},
        {"--depth", FLAG_INT, &o->depth, "layers: a one-name pattern is repeated to it; a pattern with counts must match it", 0, 0},
        {"--width", FLAG_INT, &o->width, "model width C", 0, 0},
        {"--heads", FLAG_INT, &o->heads, "attention heads (head size C/heads)", 0, 0},
        {"--lin-heads", FLAG_INT, &o->lin_heads, "heads of gdn, kaczmarz, pdn, pgdn, pkda, gka (0 = heads/2)", 0, 0},
        {"--dk", FLAG_INT, &o->dk, "their key head dim (0 = 2*C/heads)", 0, 0},
        {"--dv", FLAG_INT, &o->dv, "their value head dim (0 = dk)", 0, 0},
        {"--norm", FLAG_STRING, &o->norm, "block norms: layernorm (GPT-2) or rmsnorm", 0, 0},
        {"--norm-eps", FLAG_FLOAT, &o->norm_eps, "eps of the block norms", 0, 0},
        {"--mlp", FLAG_STRING, &o->mlp, "block MLP: gelu (GPT-2), swiglu or none", 0, 0},
        {"--mlp-hidden", FLAG_INT, &o->mlp_hidden, "MLP hidden width (0 = 4C for gelu, FLA's 8C/3 rule for swiglu)", 0, 0},
        {"--gka-iters", FLAG_INT, &o->gka_iters, "Chebyshev iterations of gka's solve", 0, 0},
        {"--gka-kv-heads", FLAG_INT, &o->gka_kv_heads, "gka key/value heads, GQA when below --lin-heads (0 = all)", 0, 0},
        {"--kalman-expand", FLAG_INT, &o->kalman_expand, "kalman inner width = expand * C", 0, 0},
        {"--kalman-n", FLAG_INT, &o->kalman_n, "kalman states per channel (N)", 0, 0},
        {"--kalman-preset", FLAG_STRING, &o->kalman_preset, "kalman sensor map: plain or mamba", 0, 0},
        {"--max-seq-len", FLAG_INT, &o->max_seq_len, "position-embedding rows (all-attn models)", 0, 0},
        {"--vocab-size", FLAG_INT, &o->vocab_size, "vocabulary size of a new model", 0, 0},
        {"--seed", FLAG_INT, &o->seed, "seed of the initialisation and of the data shuffling", 1, 0},
        {"--rows", FLAG_STRING, &o->rows_name, "rows of a batch: independent windows, or contiguous (llm.c)", 1, 0},
        {"--shuffle", FLAG_INT, &o->shuffle, "1 = a new order of the windows every epoch", 1, 0},
        {"--beta1", FLAG_FLOAT, &o->beta1, "AdamW beta1", 1, 0},
        {"--beta2", FLAG_FLOAT, &o->beta2, "AdamW beta2", 1, 0},
        {"--adam-eps", FLAG_FLOAT, &o->adam_eps, "AdamW epsilon", 1, 0},
        {"--grad-clip", FLAG_FLOAT, &o->grad_clip, "clip the global gradient norm to this (0 = off)", 1, 0},
        {"-r", FLAG_INT, &o->recompute, "train_kla.cu: recompute activations in the backward to save memory (0 = off, 1 = on)", 0, 0},
        {"-z", FLAG_INT, &o->zero, "train_kla.cu on several GPUs: 1 = shard AdamW's state over the ranks (ZeRO-1)", 0, 0},
        {"--chunk", FLAG_INT, &o->chunk, "gdn/kaczmarz chunk length; the other recurrent mixers' state-checkpoint interval", 0, 0},
        {"--prompt", FLAG_STRING, &o->prompt, "text the samples continue (default: start from EOT)", 1, 0},
        {"--temperature", FLAG_FLOAT, &o->temperature, "sampling temperature", 1, 0},
        {"--top-k", FLAG_INT, &o->top_k, "sample among the k most likely tokens (0 = all)", 1, 0},
        {"--samples", FLAG_INT, &o->samples, "samples printed each time (each from the prompt)", 1, 0},
        {"--sample-seed", FLAG_INT, &o->sample_seed, "seed of the sampling (the same seed, the same samples)", 1, 0},
        {"--generate", FLAG_INT, &o->generate, "N > 0: print samples of N tokens from -e, exit (no training)", 0, 0},
        {"--eval", FLAG_INT, &o->eval, "1: print loss and perplexity of -e on -j, exit (no training)", 0, 0},
        {"--tokenizer", FLAG_STRING, &o->tokenizer_path, "tokenizer file (made by make data)", 1, 0},
        {"--hellaswag", FLAG_STRING, &o->hellaswag, "multiple-choice eval file (llm.c's format, e.g. HellaSwag)", 1, 0},
        {"--hellaswag-every", FLAG_INT, &o->hellaswag_every, "its accuracy every N steps (0 = only at the end)", 1, 0},
        {"--hellaswag-max", FLAG_INT, &o->hellaswag_max, "examples of --hellaswag scored: the first N (0 = all)", 1, 0},
        {"--task", FLAG_STRING, &o->task_name, "synthetic task instead of shards: mqar, mqar-zoology, sniah, palindrome, stack, a5", 0, 0},
        {"--task-vocab", FLAG_INT, &o->task_vocab, "task vocabulary (0 = the task's: 8192 mqar/sniah, 128 palindrome)", 0, 0},
        {"--task-len", FLAG_INT, &o->task_len, "task length: tokens per sequence, palindrome: source tokens (0 = spec's)", 0, 0},
        {"--task-pairs", FLAG_INT, &o->task_pairs, "key-value pairs of mqar and mqar-zoology (0 = 32)", 0, 0},
        {"--task-eval", FLAG_STRING, &o->task_eval, "more accuracy lengths besides --task-len, e.g. 512,1024,2048", 0, 0},
    };
    int num_flags = (int)(sizeof(flags) / sizeof(flags[0]));
    if (num_flags > MAX_FLAGS) { die("internal: more than %d flags", MAX_FLAGS); }
    parse_flags(flags, num_flags, argc, argv);
    memcpy(o->flags, flags, sizeof(flags));
    o->num_flags = num_flags;
    // the run flags as given or defaulted, before any value is derived from them (-d 0 stays 0): name, value,
    // each NUL-terminated (FORMATS.md "State file"); an unset string (no --prompt) is left out
    o->run_flags_bytes = 0;
    for (int i = 0; i < num_flags; i++) {
        char buf[64];
        if (!flags[i].run_flag || (flags[i].type == FLAG_STRING && *(char**)flags[i].value == NULL)) { continue; }
        const char* parts[2] = {flags[i].name, flag_value_text(&flags[i], buf, sizeof(buf))};
        for (int k = 0; k < 2; k++) {
            size_t len = strlen(parts[k]) + 1;
            if (o->run_flags_bytes + len > RUN_FLAGS_BYTES) { die("flag %s: the run's flags take more than %d bytes", flags[i].name, RUN_FLAGS_BYTES); }
            memcpy(o->run_flags + o->run_flags_bytes, parts[k], len);
            o->run_flags_bytes += (int)len;
        }
    }

    // ---- check every value before anything is read or written
    require(o->B >= 1, "-b", "must be >= 1");
    require(o->T >= 1, "-t", "must be >= 1");
    require(o->total_batch >= 0, "-d", "must be >= 0");
    parse_task_flags(o);
    require(o->total_batch % (o->B * o->T) == 0, "-d", "must be a multiple of B*T");  // 0: train_main's default
    require(o->max_steps >= -1 && o->max_steps != 0, "-x", "must be >= 1, or -1 for one epoch");
    o->sched = -1;
    for (int i = 0; i < 4; i++) { if (strcmp(o->schedule, SCHED_NAMES[i]) == 0) { o->sched = i; } }
    require(o->sched >= 0, "-k", "must be one of cosine, linear, constant, wsd");
    require(o->lr > 0.0f, "-l", "must be > 0");
    require(o->warmup >= 0, "-u", "must be >= 0");
    require(o->final_frac >= 0.0f && o->final_frac <= 1.0f, "-q", "must be in [0, 1]");
    require(o->weight_decay >= 0.0f, "-c", "must be >= 0");
    require(o->val_every >= 0, "-v", "must be >= 0");
    require(o->val_batches >= 1 || o->val_batches == -1, "-m", "must be >= 1 or -1");
    require(o->sample_every >= 0, "-s", "must be >= 0");
    require(o->gen_tokens >= 0, "-g", "must be >= 0");
    require(o->ckpt_every >= 0, "-n", "must be >= 0");
    require(o->ckpt_keep >= 0, "-nk", "must be >= 0");
    require(o->ckpt_every == 0 || o->out_dir != NULL, "-n", "checkpoints need an output dir (-o)");
    require(o->ckpt_keep == 0 || o->out_dir != NULL, "-nk", "checkpoints need an output dir (-o)");
    require(o->resume == 0 || o->resume == 1, "-y", "must be 0 or 1");
    require(o->resume == 0 || o->out_dir != NULL, "-y", "resuming needs an output dir (-o)");
    require(o->overwrite == 0 || o->overwrite == 1, "--overwrite", "must be 0 or 1");
    require(o->overwrite == 0 || o->out_dir != NULL, "--overwrite", "needs an output dir (-o)");
    require(o->overwrite == 0 || o->resume == 0, "--overwrite", "deletes the run that -y 1 would resume; give one of them");
    o->rows = parse_choice(o->rows_name, DL_ROWS_NAMES, 2, "--rows");
    require(o->shuffle == 0 || o->shuffle == 1, "--shuffle", "must be 0 or 1");
    require(o->beta1 >= 0.0f && o->beta1 < 1.0f, "--beta1", "must be in [0, 1)");
    require(o->beta2 >= 0.0f && o->beta2 < 1.0f, "--beta2", "must be in [0, 1)");
    require(o->adam_eps > 0.0f, "--adam-eps", "must be > 0");
    require(o->grad_clip >= 0.0f, "--grad-clip", "must be >= 0");
    require(o->recompute == 0 || o->recompute == 1, "-r", "must be 0 or 1");
    require(o->zero == 0 || o->zero == 1, "-z", "must be 0 or 1");
    require(o->chunk >= 1 && o->chunk <= 256, "--chunk", "must be in [1, 256]");
    require(o->temperature > 0.0f, "--temperature", "must be > 0");
    require(o->top_k >= 0, "--top-k", "must be >= 0");
    require(o->samples >= 1, "--samples", "must be >= 1");
    require(o->generate >= 0, "--generate", "must be >= 0");
    require(o->eval == 0 || o->eval == 1, "--eval", "must be 0 or 1");
    require(o->hellaswag_every >= 0, "--hellaswag-every", "must be >= 0");
    require(o->hellaswag_max >= 0, "--hellaswag-max", "must be >= 0");
    // by value, not by `given`: -y 1 gives back the run's defaults of both with no --hellaswag
    require(o->hellaswag_every == 0 || o->hellaswag != NULL, "--hellaswag-every", "needs --hellaswag FILE");
    require(o->hellaswag_max == 0 || o->hellaswag != NULL, "--hellaswag-max", "needs --hellaswag FILE");
    if (o->generate > 0 || o->eval) { check_checkpoint_use_flags(o); }
    require(o->depth >= 1 && o->depth <= MAX_LAYERS, "--depth", "must be in [1, 128]");
    require(o->width >= 1, "--width", "must be >= 1");
    require(o->heads >= 1 && o->width % o->heads == 0, "--heads", "must be >= 1 and divide --width");
    require(o->max_seq_len >= 1, "--max-seq-len", "must be >= 1");
    require(o->vocab_size >= 2 && o->vocab_size <= 1 << 24, "--vocab-size", "must be in [2, 2^24]");
    Config* fc = &o->config;
    memset(fc, 0, sizeof(*fc));
    o->depth = expand_mixer_pattern(o->mixer, fc->mixer, o->depth, find_flag(o->flags, o->num_flags, "--depth")->given, "--mixer");
    if (o->lin_heads == 0) { o->lin_heads = o->heads / 2 > 0 ? o->heads / 2 : 1; }
    if (o->dk == 0) { o->dk = 2 * o->width / o->heads; }
    if (o->dv == 0) { o->dv = o->dk; }
    require(o->lin_heads >= 1, "--lin-heads", "must be >= 1");
    require(o->dk >= 1, "--dk", "must be >= 1");
    require(o->dv >= 1, "--dv", "must be >= 1");
    fc->vocab_size = o->vocab_size;
    fc->task = o->task;
    fc->padded_vocab_size = (o->vocab_size + 127) / 128 * 128;
    fc->max_seq_len = o->max_seq_len;
    fc->num_layers = o->depth;
    fc->channels = o->width;
    fc->num_heads = o->heads;
    fc->lin_heads = o->lin_heads;
    fc->lin_dk = o->dk;
    fc->lin_dv = o->dv;
    fc->conv_size = 4;
    fc->norm = parse_choice(o->norm, NORM_NAMES, NUM_NORMS, "--norm");
    fc->mlp = parse_choice(o->mlp, MLP_NAMES, NUM_MLPS, "--mlp");
    require(o->mlp_hidden >= 0, "--mlp-hidden", "must be >= 0");
    require(o->gka_iters >= 1 && o->gka_iters <= 1000, "--gka-iters", "must be in [1, 1000]");
    require(o->norm_eps > 0.0f, "--norm-eps", "must be > 0");
    if (o->mlp_hidden == 0) {  // FLA's SwiGLU rule: floor(8C/3) rounded up to a multiple of 256
        o->mlp_hidden = fc->mlp == MLP_GELU ? 4 * o->width : (o->width * 8 / 3 + 255) / 256 * 256;
    }
    fc->mlp_hidden = fc->mlp == MLP_NONE ? 0 : o->mlp_hidden;
    fc->norm_eps = o->norm_eps;
    fc->l2norm_eps = 1e-6f;
    fc->onorm_eps = 1e-5f;
    fc->kaczmarz_eps = 1e-6f;
    fc->precond_x = 1.5f;
    fc->precond_eps = 1e-6f;
    fc->precond_onorm_eps = 1e-6f;
    fc->gka_iters = o->gka_iters;
    fc->gka_ridge = 0.02f;
    fc->gka_onorm_eps = 1e-6f;
    if (o->gka_kv_heads == 0) { o->gka_kv_heads = o->lin_heads; }
    require(o->gka_kv_heads >= 1 && o->lin_heads % o->gka_kv_heads == 0, "--gka-kv-heads", "must divide --lin-heads");
    fc->gka_kv_heads = o->gka_kv_heads;
    require(o->kalman_expand >= 1, "--kalman-expand", "must be >= 1");
    require(o->kalman_n >= 1, "--kalman-n", "must be >= 1");
    fc->kalman_expand = o->kalman_expand;
    fc->kalman_n = o->kalman_n;
    fc->kalman_preset = parse_choice(o->kalman_preset, KALMAN_PRESET_NAMES, NUM_KALMAN_PRESETS, "--kalman-preset");
    fc->kalman_rank = fc->kalman_preset == KALMAN_MAMBA ? (o->width + 7) / 8 : 0;

}

// The run's settings as a table, before training starts. compute: where it runs ("CPU, fp32, 2 threads", a GPU).
static void print_run_table(const Config* cfg, size_t num_parameters, const Options* o, size_t train_tokens,
                            size_t val_tokens, int resumed, int grad_accum, int num_ranks, int max_steps, const char* compute) {
    char pattern[512];
    format_mixer_pattern(cfg, pattern, sizeof(pattern));
    printf("+-----------------------+----------------------------------------------------+\n");
    printf("| %-21s | %-50s |\n", "mixer pattern", pattern);
    printf("| %-21s | %-50d |\n", "layers L", cfg->num_layers);
    printf("| %-21s | %-50d |\n", "width C", cfg->channels);
    if (config_has_mixer(cfg, MIXER_ATTN)) { printf("| %-21s | %-50d |\n", "attn heads", cfg->num_heads); }
    if (config_has_wpe(cfg) == 0) {
        char s[64];
        snprintf(s, sizeof(s), "%d x (dk %d, dv %d)", cfg->lin_heads, cfg->lin_dk, cfg->lin_dv);
        printf("| %-21s | %-50s |\n", "recurrent heads", s);
    }
    char trunk[64];
    snprintf(trunk, sizeof(trunk), "%s, mlp %s (hidden %d)", NORM_NAMES[cfg->norm], MLP_NAMES[cfg->mlp], cfg->mlp_hidden);
    printf("| %-21s | %-50s |\n", "trunk", trunk);
    printf("| %-21s | %-50zu |\n", "parameters", num_parameters);
    char flops[64];
    double cores, total = model_flops_per_token(cfg, o->T, &cores);
    snprintf(flops, sizeof(flops), "%.4g, mixer cores %.4g (T = %d)", total, cores, o->T);
    printf("| %-21s | %-50s |\n", "train FLOPs per token", flops);
    if (o->task.kind != TASK_NONE) {  // generated on the fly: no token counts
        char task[64];
        snprintf(task, sizeof(task), "%s, vocab %d, length %d, pairs %d", TASK_NAMES[o->task.kind], o->task.vocab, o->task.len, o->task.pairs);
        printf("| %-21s | %-50s |\n", "task", task);
    } else {
        printf("| %-21s | %-50s |\n", "train data", o->train_glob);
        printf("| %-21s | %-50zu |\n", "train tokens", train_tokens);
        printf("| %-21s | %-50zu |\n", "val tokens", val_tokens);
    }
    printf("| %-21s | %-50s |\n", "init", resumed ? "resume" : o->init_file ? o->init_file : "random");
    char batch[96], ranks[32] = "";
    if (num_ranks > 1) { snprintf(ranks, sizeof(ranks), ", %d ranks", num_ranks); }
    snprintf(batch, sizeof(batch), "B %d, T %d, grad accum %d%s = %d tokens", o->B, o->T, grad_accum, ranks, o->total_batch);
    printf("| %-21s | %-50s |\n", "batch", batch);
    if (o->task.kind == TASK_NONE) { printf("| %-21s | %-50s |\n", "batch rows", DL_ROWS_NAMES[o->rows]); }
    printf("| %-21s | %-50d |\n", "steps", max_steps);
    char lrs[64];
    snprintf(lrs, sizeof(lrs), "%s, peak %g, warmup %d, final %g", o->schedule, o->lr, o->warmup, o->final_frac);
    printf("| %-21s | %-50s |\n", "lr schedule", lrs);
    printf("| %-21s | %-50g |\n", "weight decay", o->weight_decay);
    printf("| %-21s | %-50s |\n", "compute", compute);
    printf("| %-21s | %-50s |\n", "output dir", o->out_dir ? o->out_dir : "(none)");
    printf("+-----------------------+----------------------------------------------------+\n");
}

#endif // TESTING

#endif // TRAIN_KLA_MODEL_H
