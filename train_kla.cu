/*
train_kla.cu: the CUDA trainer of train_kla. bf16 mixed precision (or fp32 with PRECISION=FP32), cuBLASLt
matmuls, hand-written kernels for everything else (kernels/).

The model, the flags, the checkpoint files and the logs are those of train_kla.c (model.h holds what the two
programs share), so a checkpoint written by one program is read by the other. The model knows a mixer only
through its row of MIXER_TABLE (kernels/mixers/mixer.cuh): `attn` (kernels/mixers/attn.cuh), `gdn`,
`kaczmarz` (kernels/mixers/gdn.cuh, spec/gdn_kaczmarz.md), `pdn`, `pgdn`, `pkda` (kernels/mixers/pdn.cuh,
spec/pdn.md), `gka` (kernels/mixers/gka.cuh, spec/gka.md) and `kalman` (kernels/mixers/kalman.cuh, spec/kalman.md):
every mixer of model.h has its row.

Mixed precision (kernels/common.cuh): the parameters live in fp32 (the master copy, what AdamW updates and
what checkpoints hold) and in floatX (what the matmuls read); parameter gradients are fp32 and accumulate
across micro-steps; activations are floatX except the per-token statistics, the losses and the recurrent
mixers' gate, decay and state arithmetic, which are fp32.

Memory plan, as llm.c: one device allocation for the fp32 parameters, one for the floatX copy, one for the
gradients, one each for AdamW's m and v, one for the activations the backward needs (all layers; each layer's
mixer carves its own saved activations), one for the backward's scratch (shared by all layers). With -r 1 the norms' outputs and the MLP's activation output are not
kept per layer but recomputed in the backward into one shared buffer.

When compiled with -DTESTING the file provides everything but main(), for test_kla.cu.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "utils.h"
#include "tokenizer.h"
#include "dataloader.h"
#include "model.h"
#include "kernels/common.cuh"
#include "kernels/activations.cuh"
#include "kernels/matmul.cuh"
#include "kernels/norm.cuh"
#include "kernels/encoder.cuh"
#include "kernels/classifier.cuh"
#include "kernels/adamw.cuh"
#include "multi_gpu.cuh"

// ----------------------------------------------------------------------------------------------------------
// small kernels of this file

// floatX -> fp32 (logits and activations brought back to the host)
__global__ void convert_to_float_kernel(float* out, const floatX* in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = to_float(in[i]); }
}

static void convert_to_float(float* out, const floatX* in, size_t n, cudaStream_t stream) {
    if (n == 0) { return; }
    convert_to_float_kernel<<<(unsigned)ceil_div_z(n, 256), 256, 0, stream>>>(out, in, n);
    cudaCheckLaunch();
}

// *total += mean / micro_steps, mean = the mean of losses[0 .. BT) over the n labelled positions (0 without labels),
// in the host's arithmetic of model_mean_loss: the sum in double, the mean rounded to float, the division in float
// (__fdiv_rn: IEEE whatever the flags). One block, each thread a strided sum, then a tree: a fixed order, no atomics.
#define LOSS_BLOCK 512
__global__ void __launch_bounds__(LOSS_BLOCK)
accumulate_loss_kernel(double* total, const float* losses, int BT, int n, int micro_steps) {
    __shared__ double partial[LOSS_BLOCK];
    double sum = 0.0;
    for (int i = threadIdx.x; i < BT; i += LOSS_BLOCK) { sum += losses[i]; }   // 0 at the ignored positions
    partial[threadIdx.x] = sum;
    __syncthreads();
    for (int stride = LOSS_BLOCK / 2; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) { partial[threadIdx.x] += partial[threadIdx.x + stride]; }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const float mean = n > 0 ? (float)(partial[0] / n) : 0.0f;
        *total += (double)__fdiv_rn(mean, (float)micro_steps);
    }
}

// ----------------------------------------------------------------------------------------------------------
// the step's time by phase (TRAIN_KLA_PROFILE=1 in the environment): profile_mark(name) closes the phase that
// began at the previous mark and names it; the GPU time of each name is summed over the steps and printed at the
// end of the run. Off, a mark costs one branch.

#define PROFILE_MAX_MARKS 1024
#define PROFILE_MAX_PHASES 64
typedef struct {
    int enabled, num_marks, num_phases;
    cudaEvent_t events[PROFILE_MAX_MARKS];
    const char* mark_names[PROFILE_MAX_MARKS];
    const char* phase_names[PROFILE_MAX_PHASES];
    double phase_ms[PROFILE_MAX_PHASES];
    cudaStream_t stream;
} Profile;
static Profile profile;

static void profile_mark(const char* name) {
    if (!profile.enabled || profile.num_marks == PROFILE_MAX_MARKS) { return; }
    profile.mark_names[profile.num_marks] = name;
    cudaCheck(cudaEventRecord(profile.events[profile.num_marks++], profile.stream));
}

// ----------------------------------------------------------------------------------------------------------
// the mixers: one row each (kernels/mixers/mixer.cuh), indexed by MIXER_* of model.h. A NULL row is a mixer this
// trainer does not run yet; model_build refuses it with a message.

#include "kernels/mixers/mixer.cuh"
#include "kernels/mixers/attn.cuh"
#include "kernels/mixers/gdn.cuh"
#include "kernels/mixers/pdn.cuh"
#include "kernels/mixers/gka.cuh"
#include "kernels/mixers/kalman.cuh"

static const MixerOps* const MIXER_TABLE[NUM_MIXERS] = {
    &ATTN_MIXER,  // attn
    &GDN_MIXER,   // gdn
    &GDN_MIXER,   // kaczmarz
    &PDN_MIXER,   // pdn
    &PDN_MIXER,   // pgdn
    &PDN_MIXER,   // pkda
    &GKA_MIXER,   // gka
    &KALMAN_MIXER, // kalman
};
static_assert(NUM_MIXERS == 8, "MIXER_TABLE lists every mixer of model.h");

// a layer's blocks that its row owns (each row casts them to its own structs)
typedef union { GDNShape gdn; PDNShape pdn; GKAShape gka; KalmanShape kalman; } MixerSettings;
typedef union { AttnActs attn; GDNActs gdn; PDNActs pdn; GKAActs gka; KalmanActs kalman; } MixerActs;
typedef union {
    AttnDecodeState attn; GDNDecodeState gdn; PDNDecodeState pdn; GKADecodeState gka; KalmanDecodeState kalman;
} MixerDecodeState;

// ----------------------------------------------------------------------------------------------------------
// the model's activations and scratch

typedef struct {
    floatX* ln1;                        // (B,T,C) LN1 output = the mixer input (shared buffer with -r 1)
    float *ln1_mean, *ln1_rstd;         // (B,T)
    MixerActs mixer;                    // what the layer's mixer saves for its backward (its row's struct)
    floatX* residual2;                  // (B,T,C) residual after the mixer
    floatX* ln2;                        // (B,T,C) LN2 output (shared with -r 1); NULL without an MLP
    float *ln2_mean, *ln2_rstd;
    floatX* fch;                        // (B,T,Hm) GELU pre-activation, or (B,T,2Hm) SwiGLU input
    floatX* fch_act;                    // (B,T,Hm) the MLP's activation output (shared with -r 1)
    floatX* residual3;                  // (B,T,C) block output (= residual2 without an MLP)
} LayerActivations;

typedef struct {
    floatX* encoded;                    // (B,T,C)
    LayerActivations layer[MAX_LAYERS];
    floatX* lnf;                        // (B,T,C)
    float *lnf_mean, *lnf_rstd;
    floatX* logits;                     // (B,T,Vp); the backward overwrites it with dlogits
    float* losses;                      // (B,T)
    floatX* block_out;                  // (B,T,C) a sublayer's output before it joins the residual
} Activations;

// the backward's working memory, shared by all layers
typedef struct {
    floatX *dresidual, *dln;            // (B,T,C)
    floatX *dfch, *dfch_act;            // like fch and fch_act
    void* mixer;                        // the mixers' own scratch (the largest of any layer's; MixerContext.own)
    float* reduce;                      // partial sums of the deterministic parameter-gradient reductions
    void* work;                         // the mixers' workspaces / encoder backward scratch
    float* norm_sq;                     // (1) the squared global gradient norm
} BackwardScratch;

typedef struct {
    Config config;
    TensorTable table;                  // the files' contiguous layout (FORMATS.md), of host_params
    TensorTable dev_table;              // the device layout: the same tensors, each on a 256-byte boundary (rows of
                                        // 2-D tensors padded to a multiple of 8)
    ParameterTensors params, grads;     // device pointers into params_memory / grads_memory (dev_table layout)
    float *params_memory, *grads_memory, *m_memory, *v_memory;  // device, fp32, dev_table.num_parameters floats
    AdamWPlan adam_plan;                // the tensors AdamW updates (made with m_memory, v_memory)
    floatX* params_x;                   // device floatX copy of the parameters (== params_memory in the FP32 build)
    float* host_params;                 // host, the files' layout: checkpoints and initialisation
    float* host_staging;                // host, the device layout: transfers
    size_t num_parameters;              // parameters (the files' count)
    size_t num_device_floats;           // dev_table.num_parameters: with the alignment padding
    size_t num_alloc_floats;            // the device buffers' length: num_device_floats rounded up to num_ranks
                                        // slices of a multiple of 64 floats (multi_gpu.cuh)
    size_t shard_start, shard_floats;   // this rank's slice of them: its part of the gradient norm, and with -z 1
                                        // the parameters whose AdamW state it keeps (m_memory, v_memory)
    int recompute;                      // -r: 1 = recompute norm and MLP activations in the backward
    const MixerOps* mixer[MAX_LAYERS];  // each layer's row of MIXER_TABLE
    MixerSettings settings[MAX_LAYERS]; // each layer's mixer settings, built once by model_build
    MixerContext ctx;                   // what the mixers see of the model (pointers set by model_build and
                                        // model_size_activations)
    int B, T;                           // the activations are sized for this batch
    Activations acts;
    BackwardScratch scratch;
    void *acts_memory, *scratch_memory;
    int *inputs, *targets;              // device copies of the last forward's batch
    PinnedUpload inputs_upload, targets_upload;  // their pinned staging (kernels/common.cuh: no wait on the GPU)
    int has_targets;
    int num_labelled;                   // positions of the last forward whose target is >= 0 (negative = ignored)
    int losses_state;                   // where the last forward's losses are: LOSSES_PENDING, _ON_DEVICE, _ON_HOST
    float* losses_host;                 // (B,T), once LOSSES_ON_HOST
    float mean_loss;                    // of the last forward with targets, once LOSSES_ON_HOST
    double* step_loss;                  // device (1): the sum model_accumulate_loss makes, read by model_take_step_loss
    cudaStream_t stream;
} Model;

// The classifier of a forward with targets runs once, where its losses are first needed: model_backward runs it
// with the logits' gradient in the same pass over the logits (fused_classifier's write_dlogits), and
// model_mean_loss / model_position_losses / model_accumulate_loss run it alone where no backward ran it
// (validation, evaluation). The losses come to the host only when asked for: the training loop sums them on the
// device (model_accumulate_loss) and reads the step's loss once (model_take_step_loss).
enum { LOSSES_PENDING, LOSSES_ON_DEVICE, LOSSES_ON_HOST };

#define CARVE_X(n) ((floatX*)carve(base, &cur, (size_t)(n) * sizeof(floatX)))
#define CARVE_F(n) ((float*)carve(base, &cur, (size_t)(n) * sizeof(float)))

static size_t layout_activations(Model* m, char* base, int B, int T) {
    const Config* c = &m->config;
    size_t C = c->channels, BT = (size_t)B * T, Vp = c->padded_vocab_size, cur = 0, Hm = c->mlp_hidden;
    size_t fch_width = Hm * (c->mlp == MLP_SWIGLU ? 2 : 1);
    Activations* a = &m->acts;
    a->encoded = CARVE_X(BT * C);
    // with -r 1 the norm outputs and the MLP activation output share one buffer each over the layers
    floatX* shared_ln = m->recompute ? CARVE_X(BT * C) : NULL;
    floatX* shared_act = m->recompute && c->mlp != MLP_NONE ? CARVE_X(BT * Hm) : NULL;
    for (int l = 0; l < c->num_layers; l++) {
        LayerActivations* la = &a->layer[l];
        memset(la, 0, sizeof(*la));
        la->ln1 = m->recompute ? shared_ln : CARVE_X(BT * C);
        la->ln1_mean = CARVE_F(BT);
        la->ln1_rstd = CARVE_F(BT);
        m->mixer[l]->layout_acts(&la->mixer, &m->settings[l], c, base, &cur, B, T);
        la->residual2 = CARVE_X(BT * C);
        if (c->mlp == MLP_NONE) {
            la->residual3 = la->residual2;
            continue;
        }
        la->ln2 = m->recompute ? shared_ln : CARVE_X(BT * C);
        la->ln2_mean = CARVE_F(BT);
        la->ln2_rstd = CARVE_F(BT);
        la->fch = CARVE_X(BT * fch_width);
        la->fch_act = m->recompute ? shared_act : CARVE_X(BT * Hm);
        la->residual3 = CARVE_X(BT * C);
    }
    a->lnf = CARVE_X(BT * C);
    a->lnf_mean = CARVE_F(BT);
    a->lnf_rstd = CARVE_F(BT);
    a->logits = CARVE_X(BT * Vp);
    a->losses = CARVE_F(BT);
    a->block_out = CARVE_X(BT * C);
    return cur;
}

static size_t max_z(size_t a, size_t b) { return a > b ? a : b; }

static size_t layout_scratch(Model* m, char* base, int B, int T) {
    const Config* c = &m->config;
    size_t C = c->channels, BT = (size_t)B * T, cur = 0, Hm = c->mlp_hidden;
    BackwardScratch* s = &m->scratch;
    s->dresidual = CARVE_X(BT * C);
    s->dln = CARVE_X(BT * C);
    s->dfch = CARVE_X(BT * Hm * (c->mlp == MLP_SWIGLU ? 2 : 1));
    s->dfch_act = CARVE_X(BT * Hm);
    // reductions and workspace: the largest over every use (bias gradients up to Vp wide are not used: the LM
    // head has no bias), the trunk's and each layer's mixer's
    size_t reduce = max_z(matmul_backward_scratch_bytes((int)BT, (int)(Hm > 3 * C ? 2 * Hm : 3 * C)),
                          norm_backward_scratch_bytes((int)BT, (int)C));
    size_t work = max_z(encoder_backward_scratch_bytes(B, T, (int)C), global_norm_scratch_bytes()), own = 0;
    for (int l = 0; l < c->num_layers; l++) {
        size_t mixer_own, mixer_reduce, mixer_work;
        m->mixer[l]->scratch_bytes(&m->settings[l], c, B, T, &mixer_own, &mixer_reduce, &mixer_work);
        own = max_z(own, mixer_own);
        reduce = max_z(reduce, mixer_reduce);
        work = max_z(work, mixer_work);
    }
    s->mixer = carve(base, &cur, own);
    s->reduce = (float*)carve(base, &cur, reduce);
    s->work = carve(base, &cur, work);
    s->norm_sq = CARVE_F(1);
    return cur;
}
#undef CARVE_X
#undef CARVE_F

// Allocate the parameters (left for the caller to fill through host_params + model_upload_parameters).
static void model_build(Model* m, const Config* c, int recompute) {
    memset(m, 0, sizeof(*m));
    m->config = *c;
    m->recompute = recompute;
    for (int l = 0; l < c->num_layers; l++) {
        m->mixer[l] = MIXER_TABLE[c->mixer[l]];
        m->mixer[l]->build(&m->settings[l], &m->config, l);
    }
    build_parameter_layout(c, &m->table, NULL, NULL);
    m->num_parameters = m->table.num_parameters;
    // on the device every tensor starts on a 256-byte boundary (64 floats, 128 bytes of its bf16 copy): in the
    // files' layout small tensors (gate biases of H floats) leave the following ones 4-byte aligned, and
    // cuBLASLt and the vectorised kernels then fall back to slow paths; and a 2-D tensor's rows are padded to a
    // multiple of 8 with zeros (the recurrent mixers' in_proj is then one fast product, kernels/mixers/mixer.cuh)
    build_parameter_layout_aligned(c, &m->dev_table, NULL, NULL, 64);
    m->num_device_floats = m->dev_table.num_parameters;
    size_t slice_unit = 64 * (size_t)multi.num_ranks;
    size_t n = m->num_alloc_floats = ceil_div_z(m->num_device_floats, slice_unit) * slice_unit;
    m->shard_floats = n / multi.num_ranks;
    m->shard_start = (size_t)multi.rank * m->shard_floats;
    m->params_memory = (float*)cuda_malloc_or_die(n * sizeof(float), "the parameters");
    m->grads_memory = (float*)cuda_malloc_or_die(n * sizeof(float), "the gradients");
    cudaCheck(cudaMemset(m->params_memory, 0, n * sizeof(float)));
    cudaCheck(cudaMemset(m->grads_memory, 0, n * sizeof(float)));
#ifdef ENABLE_FP32
    m->params_x = m->params_memory;
#else
    m->params_x = (floatX*)cuda_malloc_or_die(n * sizeof(floatX), "the bf16 copy of the parameters");
#endif
    m->host_params = (float*)malloc_or_die(m->num_parameters * sizeof(float));
    m->host_staging = (float*)calloc_or_die(m->num_device_floats, sizeof(float));
    build_parameter_layout_aligned(c, &m->dev_table, &m->params, m->params_memory, 64);
    build_parameter_layout_aligned(c, &m->dev_table, &m->grads, m->grads_memory, 64);
    m->step_loss = (double*)cuda_malloc_or_die(sizeof(double), "the step's loss");
    cudaCheck(cudaMemset(m->step_loss, 0, sizeof(double)));
    cudaCheck(cudaStreamCreate(&m->stream));
    m->ctx.config = &m->config;
    m->ctx.params = m->params_memory;
    m->ctx.params_x = m->params_x;
    m->ctx.stream = m->stream;
}

// host array in the files' layout -> device array in the device layout (padding left as it is): the floats
// [first, first + count) of the device layout, at dev[0 .. count) (the part beyond the layout's end is left)
static void model_to_device_range(Model* m, float* dev, const float* host, size_t first, size_t count) {
    for (int k = 0; k < m->table.num_tensors; k++) {
        memcpy(m->host_staging + m->dev_table.t[k].offset, host + m->table.t[k].offset, m->table.t[k].numel * sizeof(float));
    }
    cudaCheck(cudaStreamSynchronize(m->stream));
    size_t n = m->num_device_floats, end = first + count < n ? first + count : n;
    if (first < end) { cudaCheck(cudaMemcpy(dev, m->host_staging + first, (end - first) * sizeof(float), cudaMemcpyHostToDevice)); }
}

static void model_to_device(Model* m, float* dev, const float* host) { model_to_device_range(m, dev, host, 0, m->num_device_floats); }

// device array in the device layout -> host array in the files' layout
static void model_to_host(Model* m, float* host, const float* dev) {
    cudaCheck(cudaStreamSynchronize(m->stream));
    cudaCheck(cudaMemcpy(m->host_staging, dev, m->num_device_floats * sizeof(float), cudaMemcpyDeviceToHost));
    for (int k = 0; k < m->table.num_tensors; k++) {
        memcpy(host + m->table.t[k].offset, m->host_staging + m->dev_table.t[k].offset, m->table.t[k].numel * sizeof(float));
    }
}

// host_params -> the device's fp32 master copy and its floatX copy
static void model_upload_parameters(Model* m) {
    model_to_device(m, m->params_memory, m->host_params);
#ifndef ENABLE_FP32
    copy_to_floatX(m->params_x, m->params_memory, m->num_device_floats, m->stream);
#endif
    cudaCheck(cudaStreamSynchronize(m->stream));
}

// the device's fp32 parameters -> host_params (for checkpoints)
static void model_download_parameters(Model* m) { model_to_host(m, m->host_params, m->params_memory); }

static void model_load(Model* m, const char* path, int recompute) {
    Config c;
    TensorTable tt;
    FILE* f = open_model_file(path, &c, &tt);
    model_build(m, &c, recompute);
    read_model_payload(f, path, m->host_params, m->num_parameters);
    model_upload_parameters(m);
}

static void model_free(Model* m) {
    cudaCheck(cudaStreamSynchronize(m->stream));
    cudaFree(m->params_memory);
    cudaFree(m->grads_memory);
#ifndef ENABLE_FP32
    cudaFree(m->params_x);
#endif
    cudaFree(m->m_memory);
    cudaFree(m->v_memory);
    adamw_plan_free(&m->adam_plan);
    cudaFree(m->acts_memory);
    cudaFree(m->scratch_memory);
    cudaFree(m->inputs);
    cudaFree(m->targets);
    pinned_upload_free(&m->inputs_upload);
    pinned_upload_free(&m->targets_upload);
    cudaFree(m->step_loss);
    free(m->losses_host);
    free(m->host_params);
    free(m->host_staging);
    cudaStreamDestroy(m->stream);
}

// (Re)size the activations and the backward scratch for a batch of B sequences of T tokens.
static void model_size_activations(Model* m, int B, int T) {
    if (m->acts_memory && m->B == B && m->T == T) { return; }
    cudaCheck(cudaStreamSynchronize(m->stream));
    cudaFree(m->acts_memory);
    cudaFree(m->scratch_memory);
    cudaFree(m->inputs);
    cudaFree(m->targets);
    free(m->losses_host);
    m->B = B;
    m->T = T;
    size_t na = layout_activations(m, NULL, B, T), ns = layout_scratch(m, NULL, B, T);
    m->acts_memory = cuda_malloc_or_die(na, "the activations");
    m->scratch_memory = cuda_malloc_or_die(ns, "the backward's scratch");
    layout_activations(m, (char*)m->acts_memory, B, T);
    layout_scratch(m, (char*)m->scratch_memory, B, T);
    m->ctx.reduce = m->scratch.reduce;
    m->ctx.work = m->scratch.work;
    m->ctx.own = m->scratch.mixer;
    size_t BT = (size_t)B * T;
    m->inputs = (int*)cuda_malloc_or_die(BT * sizeof(int), "the input tokens");
    m->targets = (int*)cuda_malloc_or_die(BT * sizeof(int), "the target tokens");
    m->losses_host = (float*)malloc_or_die(BT * sizeof(float));
}

// ----------------------------------------------------------------------------------------------------------
// forward

static void mlp_forward(Model* m, int l, floatX* out, int BT) {
    const Config* c = &m->config;
    const LayerParams* lp = &m->params.layer[l];
    LayerActivations* la = &m->acts.layer[l];
    int C = c->channels, Hm = c->mlp_hidden;
    if (c->mlp == MLP_GELU) {
        matmul_forward(la->fch_act, la->ln2, X(&m->ctx, lp->fcw), X(&m->ctx, lp->fcb), BT, C, Hm, la->fch, m->stream);
    } else {
        matmul_forward(la->fch, la->ln2, X(&m->ctx, lp->fcw), NULL, BT, C, 2 * Hm, NULL, m->stream);
        swiglu_forward(la->fch_act, la->fch, BT, Hm, m->stream);
    }
    matmul_forward(out, la->fch_act, X(&m->ctx, lp->fcprojw), X(&m->ctx, lp->fcprojb), BT, Hm, C, NULL, m->stream);
}

// The norm that follows layer l's mixer (after_mixer) or its MLP: LN2 of the layer, LN1 of the next, or LNf.
typedef struct {
    floatX* out;
    float *mean, *rstd;
    const float *w, *b;
} NormTarget;

static NormTarget next_norm(Model* m, int l, int after_mixer) {
    const Config* c = &m->config;
    NormTarget t;
    if (after_mixer && c->mlp != MLP_NONE) {
        LayerActivations* la = &m->acts.layer[l];
        t.out = la->ln2; t.mean = la->ln2_mean; t.rstd = la->ln2_rstd;
        t.w = m->params.layer[l].ln2w; t.b = m->params.layer[l].ln2b;
    } else if (l + 1 < c->num_layers) {
        LayerActivations* la = &m->acts.layer[l + 1];
        t.out = la->ln1; t.mean = la->ln1_mean; t.rstd = la->ln1_rstd;
        t.w = m->params.layer[l + 1].ln1w; t.b = m->params.layer[l + 1].ln1b;
    } else {
        Activations* a = &m->acts;
        t.out = a->lnf; t.mean = a->lnf_mean; t.rstd = a->lnf_rstd;
        t.w = m->params.lnfw; t.b = m->params.lnfb;
    }
    return t;
}

static void check_tokens(const Config* c, const int* inputs, const int* targets, int B, int T) {
    int V = c->vocab_size;
    for (int i = 0; i < B * T; i++) {
        if (inputs[i] < 0 || inputs[i] >= V) { die("input token %d at position %d is outside [0, %d)", inputs[i], i, V); }
        if (targets && targets[i] >= V) { die("target token %d at position %d is outside [0, %d)", targets[i], i, V); }
    }
    if (config_has_wpe(c) && T > c->max_seq_len) { die("sequence length %d exceeds the model's max_seq_len %d", T, c->max_seq_len); }
}

// Forward pass of a batch (host token arrays). With targets, model_mean_loss(m) is then the mean cross-entropy over
// the labelled positions: all B*T for token shards; a task's targets mark the positions that cost nothing with a
// negative id (TASK_IGNORE, tasks.h). The logits stay on the device in m->acts.logits until model_backward. The
// host does not wait for the GPU here, unless the batch's shape changes (model_size_activations): the tokens go up
// through pinned buffers.
static void model_forward(Model* m, const int* inputs, const int* targets, int B, int T) {
    const Config* c = &m->config;
    check_tokens(c, inputs, targets, B, T);
    model_size_activations(m, B, T);
    int C = c->channels, BT = B * T, L = c->num_layers;
    cudaStream_t st = m->stream;
    ParameterTensors* p = &m->params;
    Activations* a = &m->acts;
    pinned_upload(&m->inputs_upload, m->inputs, inputs, (size_t)BT * sizeof(int), st);
    m->has_targets = targets != NULL;
    if (targets) { pinned_upload(&m->targets_upload, m->targets, targets, (size_t)BT * sizeof(int), st); }

    profile_mark("host");
    encoder_forward(a->encoded, m->inputs, p->wte, p->wpe, B, T, C, st);
    norm_forward(c->norm, a->layer[0].ln1, a->layer[0].ln1_mean, a->layer[0].ln1_rstd, a->encoded, p->layer[0].ln1w,
                 p->layer[0].ln1b, BT, C, c->norm_eps, st);
    profile_mark("fwd encoder + norms");
    for (int l = 0; l < L; l++) {
        LayerParams* lp = &p->layer[l];
        LayerActivations* la = &a->layer[l];
        const floatX* residual = l == 0 ? a->encoded : a->layer[l - 1].residual3;
        m->mixer[l]->forward(&m->ctx, &m->settings[l], lp, &la->mixer, a->block_out, la->ln1, B, T);
        // residual2 = residual + mixer output, and the norm after it (LN2, or the next LN1 / LNf without an MLP)
        NormTarget n = next_norm(m, l, 1);
        fused_residual_norm_forward(c->norm, la->residual2, n.out, n.mean, n.rstd, residual, a->block_out, n.w, n.b,
                                    BT, C, c->norm_eps, st);
        profile_mark("fwd encoder + norms");
        if (c->mlp != MLP_NONE) {
            mlp_forward(m, l, a->block_out, BT);
            profile_mark("fwd mlp");
            n = next_norm(m, l, 0);
            fused_residual_norm_forward(c->norm, la->residual3, n.out, n.mean, n.rstd, la->residual2, a->block_out,
                                        n.w, n.b, BT, C, c->norm_eps, st);
            profile_mark("fwd encoder + norms");
        }
    }
    matmul_forward(a->logits, a->lnf, X(&m->ctx, p->wte), NULL, BT, C, c->padded_vocab_size, NULL, st);
    profile_mark("fwd lm head matmul");
    if (targets) {   // the classifier runs later (LOSSES_PENDING above)
        int n = 0;
        for (int i = 0; i < BT; i++) { n += targets[i] >= 0; }
        m->num_labelled = n;
        m->losses_state = LOSSES_PENDING;
    }
}

// the losses of the last forward with targets in m->acts.losses (the classifier alone if no backward ran it)
static void model_losses_on_device(Model* m) {
    if (!m->has_targets) { die("internal: the losses need a forward pass with targets"); }
    if (m->losses_state != LOSSES_PENDING) { return; }
    const Config* c = &m->config;
    fused_classifier(m->acts.logits, m->acts.losses, m->targets, 0.0f, m->B * m->T, c->vocab_size, c->padded_vocab_size,
                     0, m->stream);
    m->losses_state = LOSSES_ON_DEVICE;
}

// the losses of the last forward with targets on the host, and their mean
static void model_fetch_losses(Model* m) {
    model_losses_on_device(m);
    const int BT = m->B * m->T;
    cudaStream_t st = m->stream;
    if (m->losses_state == LOSSES_ON_DEVICE) {
        cudaCheck(cudaMemcpyAsync(m->losses_host, m->acts.losses, (size_t)BT * sizeof(float), cudaMemcpyDeviceToHost,
                                  st));
        cudaCheck(cudaStreamSynchronize(st));
        double sum = 0.0;
        for (int i = 0; i < BT; i++) { sum += m->losses_host[i]; }   // 0 at the ignored positions
        const int n = m->num_labelled;
        m->mean_loss = n > 0 ? (float)(sum / n) : 0.0f;   // a batch without labels costs nothing
        m->losses_state = LOSSES_ON_HOST;
    }
}

// the mean loss of the last forward with targets (waits for the GPU: validation and evaluation)
static float model_mean_loss(Model* m) {
    model_fetch_losses(m);
    return m->mean_loss;
}

// The step's loss += the last forward's mean loss / micro_steps, what the host would add with model_mean_loss(m) /
// micro_steps, but summed on the device: a training micro-step does not wait for the GPU.
static void model_accumulate_loss(Model* m, int micro_steps) {
    profile_mark("host");
    model_losses_on_device(m);
    accumulate_loss_kernel<<<1, LOSS_BLOCK, 0, m->stream>>>(m->step_loss, m->acts.losses, m->B * m->T, m->num_labelled,
                                                           micro_steps);
    cudaCheckLaunch();
    profile_mark("step loss");
}

// The sum model_accumulate_loss made since the last call, and 0 for the next step: the one wait of a training step
// for its loss (the loop takes it after model_grad_norm, which waits for the gradients anyway).
static double model_take_step_loss(Model* m) {
    double loss;
    cudaCheck(cudaMemcpyAsync(&loss, m->step_loss, sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
    cudaCheck(cudaMemsetAsync(m->step_loss, 0, sizeof(double), m->stream));
    return loss;
}

// ----------------------------------------------------------------------------------------------------------
// backward

// Backward of the last forward (which must have had targets). Gradients accumulate into m->grads, scaled so
// that `loss_scale` = 1/(number of micro-batches) gives the gradient of the mean loss over all of them.
static void model_backward(Model* m, float loss_scale) {
    const Config* c = &m->config;
    if (!m->has_targets) { die("internal: model_backward needs a forward pass with targets"); }
    int B = m->B, T = m->T, C = c->channels, BT = B * T, L = c->num_layers, Hm = c->mlp_hidden;
    ParameterTensors *p = &m->params, *g = &m->grads;
    Activations* a = &m->acts;
    BackwardScratch* s = &m->scratch;
    cudaStream_t st = m->stream;
    // classifier: the losses, and dlogits overwriting the logits, in one pass; dlnf -> dresidual
    profile_mark("host");
    const float dloss = m->num_labelled > 0 ? loss_scale / m->num_labelled : 0.0f;
    fused_classifier(a->logits, a->losses, m->targets, dloss, BT, c->vocab_size, c->padded_vocab_size, 1, st);
    if (m->losses_state == LOSSES_PENDING) { m->losses_state = LOSSES_ON_DEVICE; }
    profile_mark("bwd classifier");
    matmul_backward(s->dln, g->wte, NULL, s->reduce, a->logits, a->lnf, X(&m->ctx, p->wte), BT, C, c->padded_vocab_size, 0, st);
    profile_mark("bwd lm head matmul");
    cudaCheck(cudaMemsetAsync(s->dresidual, 0, (size_t)BT * C * sizeof(floatX), st));
    const floatX* last = a->layer[L - 1].residual3;
    norm_backward(c->norm, s->dresidual, g->lnfw, g->lnfb, s->reduce, s->dln, last, p->lnfw, a->lnf_mean, a->lnf_rstd,
                  BT, C, st);
    profile_mark("bwd norms + encoder");
    for (int l = L - 1; l >= 0; l--) {
        LayerParams *lp = &p->layer[l], *lg = &g->layer[l];
        LayerActivations* la = &a->layer[l];
        const floatX* residual = l == 0 ? a->encoded : a->layer[l - 1].residual3;
        if (c->mlp != MLP_NONE) {
            if (m->recompute) {  // LN2 output and the MLP activation, into the shared buffers
                norm_forward(c->norm, la->ln2, la->ln2_mean, la->ln2_rstd, la->residual2, lp->ln2w, lp->ln2b, BT, C,
                             c->norm_eps, st);
                if (c->mlp == MLP_GELU) { gelu_forward(la->fch_act, la->fch, (size_t)BT * Hm, st); }
                else { swiglu_forward(la->fch_act, la->fch, BT, Hm, st); }
            }
            if (c->mlp == MLP_GELU) {   // dfch_act: the gradient of the pre-activation fch (GELU' applied)
                matmul_backward_gelu(s->dfch_act, lg->fcprojw, lg->fcprojb, s->reduce, s->dresidual, la->fch_act,
                                     X(&m->ctx, lp->fcprojw), la->fch, BT, Hm, C, st);
                matmul_backward(s->dln, lg->fcw, lg->fcb, s->reduce, s->dfch_act, la->ln2, X(&m->ctx, lp->fcw), BT, C, Hm, 0, st);
            } else {
                matmul_backward(s->dfch_act, lg->fcprojw, lg->fcprojb, s->reduce, s->dresidual, la->fch_act,
                                X(&m->ctx, lp->fcprojw), BT, Hm, C, 0, st);
                swiglu_backward(s->dfch, la->fch, s->dfch_act, BT, Hm, st);
                matmul_backward(s->dln, lg->fcw, NULL, s->reduce, s->dfch, la->ln2, X(&m->ctx, lp->fcw), BT, C, 2 * Hm, 0, st);
            }
            profile_mark("bwd mlp");
            norm_backward(c->norm, s->dresidual, lg->ln2w, lg->ln2b, s->reduce, s->dln, la->residual2, lp->ln2w,
                          la->ln2_mean, la->ln2_rstd, BT, C, st);
        }
        profile_mark("bwd norms + encoder");
        if (m->recompute) {
            norm_forward(c->norm, la->ln1, la->ln1_mean, la->ln1_rstd, residual, lp->ln1w, lp->ln1b, BT, C, c->norm_eps, st);
        }
        m->mixer[l]->backward(&m->ctx, &m->settings[l], lp, lg, &la->mixer, s->dln, s->dresidual, la->ln1, B, T);
        norm_backward(c->norm, s->dresidual, lg->ln1w, lg->ln1b, s->reduce, s->dln, residual, lp->ln1w, la->ln1_mean,
                      la->ln1_rstd, BT, C, st);
        profile_mark("bwd norms + encoder");
    }
    encoder_backward(g->wte, g->wpe, s->work, s->dresidual, m->inputs, c->vocab_size, B, T, C, st);
    profile_mark("bwd norms + encoder");
}

static void model_zero_grad(Model* m) {
    cudaCheck(cudaMemsetAsync(m->grads_memory, 0, m->num_alloc_floats * sizeof(float), m->stream));
}

// Several ranks (multi_gpu.cuh): every rank's gradients -> their mean over the ranks, the gradient of the global
// batch; on every rank (all-reduce), or with -z 1 on this rank's slice only (reduce-scatter), which is all that
// its part of the norm and its AdamW update read. One rank: nothing to do.
static void model_reduce_gradients(Model* m) {
    if (multi.num_ranks == 1) { return; }
#ifdef MULTI_GPU
    profile_mark("host");
    if (multi.zero) {
        ncclCheck(ncclReduceScatter(m->grads_memory, m->grads_memory + m->shard_start, m->shard_floats, ncclFloat32, ncclAvg,
                                    multi.comm, m->stream));
    } else {
        ncclCheck(ncclAllReduce(m->grads_memory, m->grads_memory, m->num_alloc_floats, ncclFloat32, ncclAvg, multi.comm, m->stream));
    }
    profile_mark("gradient all-reduce");
#endif
}

// Global L2 norm of all gradients (deterministic: fixed-order partial sums). With several ranks, the sum over the
// ranks of each one's squared norm of its slice, in double, whether or not AdamW's state is sharded.
static float model_grad_norm(Model* m) {
    float norm_sq;
    profile_mark("host");
    size_t first = multi.num_ranks > 1 ? m->shard_start : 0, n = multi.num_ranks > 1 ? m->shard_floats : m->num_device_floats;
    global_norm_squared(m->scratch.norm_sq, (float*)m->scratch.work, m->grads_memory + first, n, m->stream);
    profile_mark("grad norm");
    cudaCheck(cudaMemcpyAsync(&norm_sq, m->scratch.norm_sq, sizeof(float), cudaMemcpyDeviceToHost, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
    if (multi.num_ranks == 1) { return sqrtf(norm_sq); }
    double total = norm_sq;
    multi_gpu_sum(&total, 1);
    return sqrtf((float)total);
}

// The parameters whose AdamW state this rank keeps: all of them, or with -z 1 its slice (multi_gpu.cuh).
static size_t adam_first(const Model* m) { return multi.zero ? m->shard_start : 0; }
static size_t adam_floats(const Model* m) { return multi.zero ? m->shard_floats : m->num_alloc_floats; }

// AdamW's m and v (zero), and its plan: each tensor's part of this rank's parameters (all of a tensor, or with -z 1
// the part that lies in its slice), with its learning-rate group and weight decay (FORMATS.md)
static void model_alloc_adam(Model* m) {
    if (m->m_memory != NULL) { return; }
    size_t bytes = adam_floats(m) * sizeof(float);
    m->m_memory = (float*)cuda_malloc_or_die(bytes, "AdamW's m");
    m->v_memory = (float*)cuda_malloc_or_die(bytes, "AdamW's v");
    cudaCheck(cudaMemset(m->m_memory, 0, bytes));
    cudaCheck(cudaMemset(m->v_memory, 0, bytes));
    size_t first = adam_first(m), end = first + adam_floats(m);
    AdamWSpan* spans = (AdamWSpan*)malloc_or_die((size_t)m->dev_table.num_tensors * sizeof(AdamWSpan));
    int num_spans = 0;
    for (int k = 0; k < m->dev_table.num_tensors; k++) {
        const TensorInfo* ti = &m->dev_table.t[k];
        size_t lo = ti->offset > first ? ti->offset : first, hi = ti->offset + ti->numel < end ? ti->offset + ti->numel : end;
        if (lo >= hi) { continue; }
        AdamWSpan* sp = &spans[num_spans++];
        sp->offset = lo;
        sp->state_offset = lo - first;
        sp->n = hi - lo;
        sp->lr_scale = ti->lr_scale;
        sp->decay = ti->decay != 0;
    }
    adamw_plan_build(&m->adam_plan, spans, num_spans);
    free(spans);
}

// AdamW as train_kla.c's model_update: per tensor, with its learning-rate group and weight decay (FORMATS.md), all
// tensors in one launch (model_alloc_adam's plan). With -z 1 each rank updates the part of each tensor that lies in
// its slice, and an all-gather then gives every rank all the parameters (the fp32 master and the floatX copy).
static void model_update(Model* m, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t) {
    model_alloc_adam(m);
    float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
#ifdef ENABLE_FP32
    floatX* px = NULL;  // the master is the copy
#else
    floatX* px = m->params_x;
#endif
    adamw_update(&m->adam_plan, m->params_memory, px, m->grads_memory, m->m_memory, m->v_memory, lr, beta1, beta2, eps,
                 weight_decay, grad_scale, bc1, bc2, m->stream);
    profile_mark("adamw");
#ifdef MULTI_GPU
    if (multi.zero && multi.num_ranks > 1) {
        const size_t first = adam_first(m);
        ncclCheck(ncclAllGather(m->params_memory + first, m->params_memory, m->shard_floats, ncclFloat32, multi.comm, m->stream));
#ifndef ENABLE_FP32
        ncclCheck(ncclAllGather(m->params_x + first, m->params_x, m->shard_floats, ncclBfloat16, multi.comm, m->stream));
#endif
        profile_mark("parameter all-gather");
    }
#endif
}

// ----------------------------------------------------------------------------------------------------------
// checkpoints: the files of model.h, through host copies

// AdamW state to rank 0's host (NULL pointers before the first update, and on the other ranks); caller frees.
// Sharded (-z 1), every rank must call it: the slices are gathered into the gradient buffer, free between steps.
static void model_download_adam(Model* m, float** mh, float** vh) {
    *mh = *vh = NULL;
    if (m->m_memory == NULL) { return; }
    size_t bytes = m->num_parameters * sizeof(float);
    float* state[2] = {m->m_memory, m->v_memory};
    float** host[2] = {mh, vh};
    for (int i = 0; i < 2; i++) {
        const float* full = state[i];
#ifdef MULTI_GPU
        if (multi.zero && multi.num_ranks > 1) {
            ncclCheck(ncclAllGather(state[i], m->grads_memory, m->shard_floats, ncclFloat32, multi.comm, m->stream));
            full = m->grads_memory;
        }
#endif
        if (multi.rank != 0) { continue; }
        *host[i] = (float*)malloc_or_die(bytes);
        model_to_host(m, *host[i], full);
    }
}

// Every rank calls it (the sharded AdamW state is gathered); rank 0 writes the files.
static void model_write_checkpoint(Model* m, const TrainState* s, const char* dir) {
    float *mh, *vh;
    model_download_adam(m, &mh, &vh);
    if (multi.rank == 0) {
        model_download_parameters(m);
        write_checkpoint(&m->config, &m->table, m->host_params, mh, vh, s, dir);
    }
    free(mh);
    free(vh);
}

static void model_read_state(Model* m, TrainState* s, const char* path) {
    size_t n = m->num_parameters, bytes = n * sizeof(float);
    float* mh = (float*)malloc_or_die(bytes);
    float* vh = (float*)malloc_or_die(bytes);
    if (read_state_file(s, n, mh, vh, path)) {  // the whole state, whatever the ranks that wrote it: this rank's part
        model_alloc_adam(m);
        model_to_device_range(m, m->m_memory, mh, adam_first(m), adam_floats(m));
        model_to_device_range(m, m->v_memory, vh, adam_first(m), adam_floats(m));
    }
    free(mh);
    free(vh);
}

// ----------------------------------------------------------------------------------------------------------
// decoding one token at a time (one sequence): each layer's mixer keeps its decode state (a KV cache for attn,
// the recurrent state and conv cache for gdn/kaczmarz), the trunk its per-step buffers

typedef struct {
    int max_len, pos;
    MixerDecodeState layer[MAX_LAYERS];                // each layer's mixer state (its row's struct)
    floatX *x, *ln, *y, *pre, *hidden, *logits_x;      // (C) x3, the MLP's (2Hm) and (Hm), (Vp)
    float* stats;                                      // (2) the norm's mean and rstd
    float* logits_f;                                   // (Vp) device fp32
    float* logits;                                     // (Vp) host: the next-token logits after a step
    int* token;                                        // (1) device
    void* memory;
} DecodeState;

static void decode_init(DecodeState* d, const Model* m, int max_len) {
    const Config* c = &m->config;
    size_t C = c->channels, Vp = c->padded_vocab_size, Hm = c->mlp_hidden, cur = 0;
    memset(d, 0, sizeof(*d));
    d->max_len = max_len;
    for (int pass = 0; pass < 2; pass++) {  // pass 0 counts, pass 1 carves
        char* base = (char*)d->memory;
        cur = 0;
        for (int l = 0; l < c->num_layers; l++) {
            m->mixer[l]->layout_decode(&d->layer[l], &m->settings[l], c, base, &cur, max_len);
        }
        d->x = carve_x(base, &cur, C); d->ln = carve_x(base, &cur, C); d->y = carve_x(base, &cur, C);
        d->pre = carve_x(base, &cur, 2 * Hm + 1); d->hidden = carve_x(base, &cur, Hm + 1);
        d->logits_x = carve_x(base, &cur, Vp);
        d->stats = carve_f(base, &cur, 2);
        d->logits_f = carve_f(base, &cur, Vp);
        d->token = (int*)carve(base, &cur, sizeof(int));
        if (pass == 0) {
            d->memory = cuda_malloc_or_die(cur, "the decode state");
            cudaCheck(cudaMemset(d->memory, 0, cur));  // the mixers' states and caches start at zero
        }
    }
    d->logits = (float*)malloc_or_die(Vp * sizeof(float));
}

static void decode_free(DecodeState* d) {
    cudaFree(d->memory);
    free(d->logits);
}

// Consume one token; d->logits then holds the next-token logits (Vp floats).
static void model_decode_step(Model* m, DecodeState* d, int token) {
    const Config* c = &m->config;
    const ParameterTensors* p = &m->params;
    int C = c->channels, t = d->pos, Hm = c->mlp_hidden;
    cudaStream_t st = m->stream;
    if (t >= d->max_len) { die("internal: decode past its %d-token capacity", d->max_len); }
    cudaCheck(cudaMemcpyAsync(d->token, &token, sizeof(int), cudaMemcpyHostToDevice, st));
    // the embedding of one token at position t: wpe's row t is row 0 of wpe + t*C
    encoder_forward(d->x, d->token, p->wte, p->wpe ? p->wpe + (size_t)t * C : NULL, 1, 1, C, st);
    for (int l = 0; l < c->num_layers; l++) {
        const LayerParams* lp = &p->layer[l];
        norm_forward(c->norm, d->ln, d->stats, d->stats + 1, d->x, lp->ln1w, lp->ln1b, 1, C, c->norm_eps, st);
        m->mixer[l]->decode_step(&m->ctx, &m->settings[l], lp, &d->layer[l], d->y, d->ln, t);
        residual_forward(d->x, d->x, d->y, C, st);
        if (c->mlp != MLP_NONE) {
            norm_forward(c->norm, d->ln, d->stats, d->stats + 1, d->x, lp->ln2w, lp->ln2b, 1, C, c->norm_eps, st);
            if (c->mlp == MLP_GELU) {
                matmul_forward(d->hidden, d->ln, X(&m->ctx, lp->fcw), X(&m->ctx, lp->fcb), 1, C, Hm, d->pre, st);
            } else {
                matmul_forward(d->pre, d->ln, X(&m->ctx, lp->fcw), NULL, 1, C, 2 * Hm, NULL, st);
                swiglu_forward(d->hidden, d->pre, 1, Hm, st);
            }
            matmul_forward(d->y, d->hidden, X(&m->ctx, lp->fcprojw), X(&m->ctx, lp->fcprojb), 1, Hm, C, NULL, st);
            residual_forward(d->x, d->x, d->y, C, st);
        }
    }
    norm_forward(c->norm, d->ln, d->stats, d->stats + 1, d->x, p->lnfw, p->lnfb, 1, C, c->norm_eps, st);
    matmul_forward(d->logits_x, d->ln, X(&m->ctx, p->wte), NULL, 1, C, c->padded_vocab_size, NULL, st);
    convert_to_float(d->logits_f, d->logits_x, c->padded_vocab_size, st);
    cudaCheck(cudaMemcpyAsync(d->logits, d->logits_f, c->padded_vocab_size * sizeof(float), cudaMemcpyDeviceToHost, st));
    cudaCheck(cudaStreamSynchronize(st));
    d->pos++;
}

// ----------------------------------------------------------------------------------------------------------
// dense peak of the arithmetic the matmuls use, H100/H200 SXM datasheet: bf16 989 TFLOP/s, fp32 67 TFLOP/s
#ifdef ENABLE_FP32
#define PEAK_FLOPS 67e12
#else
#define PEAK_FLOPS 989e12
#endif

// ----------------------------------------------------------------------------------------------------------
// main: flags, the training loop, evaluation, sampling, checkpoints (as train_kla.c)
#ifndef TESTING

static void profile_init(cudaStream_t stream) {
    const char* env = getenv("TRAIN_KLA_PROFILE");
    profile.enabled = env != NULL && strcmp(env, "0") != 0;
    profile.stream = stream;
    if (!profile.enabled) { return; }
    for (int i = 0; i < PROFILE_MAX_MARKS; i++) { cudaCheck(cudaEventCreate(&profile.events[i])); }
}

// the end of a step: add the phases' times up by name
static void profile_collect(void) {
    if (!profile.enabled) { return; }
    cudaCheck(cudaEventSynchronize(profile.events[profile.num_marks - 1]));
    for (int i = 1; i < profile.num_marks; i++) {
        float ms;
        cudaCheck(cudaEventElapsedTime(&ms, profile.events[i - 1], profile.events[i]));
        int k = 0;
        while (k < profile.num_phases && strcmp(profile.phase_names[k], profile.mark_names[i]) != 0) { k++; }
        if (k == profile.num_phases && k < PROFILE_MAX_PHASES) { profile.phase_names[profile.num_phases++] = profile.mark_names[i]; }
        if (k < PROFILE_MAX_PHASES) { profile.phase_ms[k] += ms; }
    }
    profile.num_marks = 0;
}

static void profile_print(int steps) {
    if (!profile.enabled || steps == 0) { return; }
    double total = 0.0;
    for (int k = 0; k < profile.num_phases; k++) { total += profile.phase_ms[k]; }
    printf("profile: GPU time per step by phase (%d steps)\n", steps);
    for (int k = 0; k < profile.num_phases; k++) {
        printf("  %-28s %8.3f ms  %5.1f%%\n", profile.phase_names[k], profile.phase_ms[k] / steps, 100.0 * profile.phase_ms[k] / total);
    }
    printf("  %-28s %8.3f ms\n", "total", total / steps);
}

// ---- what the training program of train_common.h asks of a trainer (its comment there)

static void trainer_open_model(Model* m, const char* path, const Options* opt) {
    if (path) {
        model_load(m, path, opt->recompute);
    } else {
        model_build(m, &opt->config, opt->recompute);
        init_parameters(m->host_params, &m->config, &m->table, (uint64_t)opt->seed);
        model_upload_parameters(m);
    }
    profile_init(m->stream);
}

// the labelled positions of the last forward (targets >= 0) and how many of them the logits' argmax predicts
static void model_count_correct(Model* m, const int* targets, int N, long* labelled, long* correct) {
    const Config* c = &m->config;
    int* best_dev = NULL;
    cudaCheck(cudaMalloc((void**)&best_dev, (size_t)N * sizeof(int)));
    int* best = (int*)malloc_or_die((size_t)N * sizeof(int));
    argmax_rows(best_dev, m->acts.logits, N, c->vocab_size, c->padded_vocab_size, m->stream);
    cudaCheck(cudaMemcpyAsync(best, best_dev, (size_t)N * sizeof(int), cudaMemcpyDeviceToHost, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
    for (int i = 0; i < N; i++) {
        if (targets[i] < 0) { continue; }
        *labelled += 1;
        *correct += best[i] == targets[i];
    }
    free(best);
    cudaCheck(cudaFree(best_dev));
}

// the loss at each of the B*T positions of the last forward with targets (0 where the target is ignored), on the host
static const float* model_position_losses(Model* m) {
    model_fetch_losses(m);
    return m->losses_host;
}

static cudaDeviceProp device_properties;   // of this rank's device, read by main

static void trainer_describe(char* buf, size_t n, const Config* c) {
    char gpus[32] = "";
    if (multi.num_ranks > 1) { snprintf(gpus, sizeof(gpus), "%d x ", multi.num_ranks); }
    snprintf(buf, n, "%s%s, %s, attention: %s", gpus, device_properties.name, PRECISION_NAME,
             config_has_mixer(c, MIXER_ATTN) ? ATTENTION_NAME : "none");
}

// the MFU of the step line is per GPU
static double trainer_peak_flops(void) { return PEAK_FLOPS * multi.num_ranks; }

static void trainer_step_begin(Model* m) {
    (void)m;
    profile.num_marks = 0;
}

// the step is timed once the GPU has finished it; the profile counts the timed steps only
static void trainer_step_end(Model* m, int timed) {
    cudaCheck(cudaStreamSynchronize(m->stream));
    if (timed) { profile_collect(); } else { profile.num_marks = 0; }
}

static void trainer_finish(Model* m, int timed_steps) {
    (void)m;
    profile_print(timed_steps);
}

static void trainer_memory(char* buf, size_t n) { snprintf(buf, n, " | peak mem %.0f MiB", cuda_bytes_allocated / 1048576.0); }
static void trainer_ranks(int* rank, int* num_ranks) { *rank = multi.rank; *num_ranks = multi.num_ranks; }
static void trainer_sum_over_ranks(double* values, int n) { multi_gpu_sum(values, n); }

#include "train_common.h"

int main(int argc, char** argv) {
    Options opt;
    parse_options(&opt, argc, argv);
    require(opt.chunk == GDN_CHUNK, "--chunk", "train_kla.cu's gdn/kaczmarz kernels use chunks of 64 tokens");
    multi_gpu_init(opt.zero);  // the rank's GPU, and NCCL between the ranks
    int device;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaGetDeviceProperties(&device_properties, device));
    matmul_setup();
    int code = train_main(&opt, argc, argv);
    matmul_teardown();
#ifdef USE_CUDNN
    attention_cudnn_destroy();
#endif
    multi_gpu_finish();
    return code;
}
#endif // TESTING
