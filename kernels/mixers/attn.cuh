/*
kernels/mixers/attn.cuh: the attn row of train_kla.cu's mixer table (kernels/mixers/mixer.cuh): GPT-2's causal
softmax attention, qkv = x W_qkv^T + b, y = attention(qkv), out = y W_proj^T + b. The attention itself is
cuDNN's fused flash attention when built with USE_CUDNN=1 (kernels/attention_cudnn.cpp), else our own kernels
(kernels/attention.cuh); same layouts and the same saved log-sum-exp either way. Decode keeps a KV cache.
*/
#ifndef TRAIN_KLA_KERNELS_MIXERS_ATTN_CUH
#define TRAIN_KLA_KERNELS_MIXERS_ATTN_CUH

#include "mixer.cuh"
#include "../matmul.cuh"
#include "../attention.cuh"

#ifdef USE_CUDNN
#define ATTENTION_NAME "cuDNN"
static void attention_forward_step(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH, cudaStream_t st) {
    attention_forward_cudnn(out, lse, qkv, B, T, C, NH, st);
}
static void attention_backward_step(floatX* dqkv, void* scratch, const floatX* dout, const floatX* qkv, const floatX* out,
                                    const float* lse, int B, int T, int C, int NH, cudaStream_t st) {
    (void)scratch;
    attention_backward_cudnn(dqkv, dout, qkv, out, lse, B, T, C, NH, st);
}
#else
#define ATTENTION_NAME "train_kla kernels"
#define attention_forward_step attention_forward
#define attention_backward_step attention_backward
#endif

typedef struct {
    floatX *qkv, *atty;     // (B,T,3C), (B,T,C)
    float* lse;             // (B,NH,T) log-sum-exp of each query row
} AttnActs;

typedef struct {
    int max_len;
    floatX *kcache, *vcache;  // (max_len, C)
    floatX *qkv, *att;        // the step's (3C) and (C)
} AttnDecodeState;

// attn has no settings beyond the config (C, num_heads)
static void attn_build(void* settings, const Config* c, int layer) { (void)settings; (void)c; (void)layer; }

static void attn_layout_acts(void* acts, const void* settings, const Config* c, char* base, size_t* cur, int B, int T) {
    (void)settings;
    AttnActs* a = (AttnActs*)acts;
    size_t BT = (size_t)B * T, C = c->channels;
    a->qkv = carve_x(base, cur, BT * 3 * C);
    a->atty = carve_x(base, cur, BT * C);
    a->lse = carve_f(base, cur, BT * c->num_heads);
}

// own: dqkv (B,T,3C) and d(atty) (B,T,C)
static void attn_scratch_bytes(const void* settings, const Config* c, int B, int T, size_t* own, size_t* reduce,
                               size_t* work) {
    (void)settings;
    size_t BT = (size_t)B * T, C = c->channels, cur = 0;
    carve_x(NULL, &cur, BT * 3 * C);
    carve_x(NULL, &cur, BT * C);
    *own = cur;
    *reduce = matmul_backward_scratch_bytes((int)BT, (int)(3 * C));
    *work = attention_backward_scratch_bytes(B, T, (int)C, c->num_heads);
}

static void attn_forward(const MixerContext* mc, const void* settings, const LayerParams* lp, void* acts, floatX* out,
                         const floatX* x, int B, int T) {
    (void)settings;
    AttnActs* a = (AttnActs*)acts;
    const Config* c = mc->config;
    int C = c->channels, BT = B * T;
    matmul_forward(a->qkv, x, X(mc, lp->qkvw), X(mc, lp->qkvb), BT, C, 3 * C, NULL, mc->stream);
    profile_mark("fwd attn qkv matmul");
    attention_forward_step(a->atty, a->lse, a->qkv, B, T, C, c->num_heads, mc->stream);
    profile_mark("fwd attention");
    matmul_forward(out, a->atty, X(mc, lp->attprojw), X(mc, lp->attprojb), BT, C, C, NULL, mc->stream);
    profile_mark("fwd attn proj matmul");
}

static void attn_backward(const MixerContext* mc, const void* settings, const LayerParams* lp, LayerParams* lg,
                          const void* acts, floatX* dx, const floatX* dout, const floatX* x, int B, int T) {
    (void)settings;
    const AttnActs* a = (const AttnActs*)acts;
    const Config* c = mc->config;
    int C = c->channels, BT = B * T;
    size_t cur = 0;
    floatX* dqkv = carve_x((char*)mc->own, &cur, (size_t)BT * 3 * C);
    floatX* datty = carve_x((char*)mc->own, &cur, (size_t)BT * C);
    matmul_backward(datty, lg->attprojw, lg->attprojb, mc->reduce, dout, a->atty, X(mc, lp->attprojw), BT, C, C, 0,
                    mc->stream);
    profile_mark("bwd attn proj matmul");
    attention_backward_step(dqkv, mc->work, datty, a->qkv, a->atty, a->lse, B, T, C, c->num_heads, mc->stream);
    profile_mark("bwd attention");
    matmul_backward(dx, lg->qkvw, lg->qkvb, mc->reduce, dqkv, x, X(mc, lp->qkvw), BT, C, 3 * C, 0, mc->stream);
    profile_mark("bwd attn qkv matmul");
}

static void attn_layout_decode(void* state, const void* settings, const Config* c, char* base, size_t* cur, int max_len) {
    (void)settings;
    AttnDecodeState* d = (AttnDecodeState*)state;
    size_t C = c->channels;
    d->max_len = max_len;
    d->kcache = carve_x(base, cur, (size_t)max_len * C);
    d->vcache = carve_x(base, cur, (size_t)max_len * C);
    d->qkv = carve_x(base, cur, 3 * C);
    d->att = carve_x(base, cur, C);
}

// the token's k and v join the cache at row t; its query attends over rows 0..t
static void attn_decode_step(const MixerContext* mc, const void* settings, const LayerParams* lp, void* state,
                             floatX* out, const floatX* x, int t) {
    (void)settings;
    AttnDecodeState* d = (AttnDecodeState*)state;
    const Config* c = mc->config;
    int C = c->channels;
    cudaStream_t st = mc->stream;
    matmul_forward(d->qkv, x, X(mc, lp->qkvw), X(mc, lp->qkvb), 1, C, 3 * C, NULL, st);
    cudaCheck(cudaMemcpyAsync(d->kcache + (size_t)t * C, d->qkv + C, C * sizeof(floatX), cudaMemcpyDeviceToDevice, st));
    cudaCheck(cudaMemcpyAsync(d->vcache + (size_t)t * C, d->qkv + 2 * C, C * sizeof(floatX), cudaMemcpyDeviceToDevice, st));
    attention_decode(d->att, d->qkv, d->kcache, d->vcache, 1, t, d->max_len, C, c->num_heads, st);
    matmul_forward(out, d->att, X(mc, lp->attprojw), X(mc, lp->attprojb), 1, C, C, NULL, st);
}

static const MixerOps ATTN_MIXER = {"attn", attn_build, attn_layout_acts, attn_scratch_bytes, attn_forward,
                                    attn_backward, attn_layout_decode, attn_decode_step};

#endif // TRAIN_KLA_KERNELS_MIXERS_ATTN_CUH
