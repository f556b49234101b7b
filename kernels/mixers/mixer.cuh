/*
kernels/mixers/mixer.cuh: what train_kla.cu knows of a sequence mixer (DESIGN.md "Mixers are modules"). A mixer
family (kernels/mixers/<family>.cuh) is one row of MixerOps: how to build a layer's settings, where its saved
activations go, how much backward scratch it needs, its layer forward and backward, and its decode step. The model
(train_kla.cu) calls a layer's mixer only through its row, and keeps for each layer three opaque blocks that the
row owns: the settings (built once, when the model is built), the saved activations and the decode state; each
family casts them to its own structs (GDNShape, GDNActs, ...). train_kla.cu includes the family files after this
one and after its profile_mark, then lists the rows in MIXER_TABLE.

Memory: every block is carved from one of the model's allocations (carve below), so a family never allocates:
  - saved activations: per layer, in the activations block (kept from the forward to the backward);
  - the backward's own scratch: one region reused by every layer (sized by the largest layer), and the two
    buffers every layer shares with the trunk: `reduce` (partial sums of the deterministic parameter-gradient
    reductions) and `work` (a large workspace);
  - decode state: per layer, zeroed when decoding starts (recurrent states, conv caches, KV caches) plus the
    step's temporaries.
*/
#ifndef TRAIN_KLA_KERNELS_MIXERS_MIXER_CUH
#define TRAIN_KLA_KERNELS_MIXERS_MIXER_CUH

#include "../common.cuh"
#include "../../model.h"
#include "../matmul.cuh"

// What a mixer's layer code sees of the model: the config, the parameters' two copies (X below), the shared
// backward buffers and the stream.
typedef struct {
    const Config* config;
    const float* params;        // device fp32 master parameters (the device layout)
    const floatX* params_x;     // their floatX copy, what the matmuls read (== params in the FP32 build)
    float* reduce;              // backward: partial sums of the parameter-gradient reductions (shared by all layers)
    void* work;                 // backward: a large workspace (shared by all layers and the trunk)
    void* own;                  // backward: the mixer's own scratch, reused by every layer
    cudaStream_t stream;
} MixerContext;

// The floatX copy of a parameter tensor given its fp32 master pointer (both in the device layout).
static const floatX* X(const MixerContext* mc, const float* p) {
    return p ? mc->params_x + (p - mc->params) : NULL;
}

// bump allocator over one block, 256-byte aligned pieces; with base == NULL it only counts
static void* carve(char* base, size_t* cursor, size_t bytes) {
    void* p = base ? base + *cursor : NULL;
    *cursor += (bytes + 255) / 256 * 256;
    return p;
}
static floatX* carve_x(char* base, size_t* cursor, size_t n) { return (floatX*)carve(base, cursor, n * sizeof(floatX)); }
static float* carve_f(char* base, size_t* cursor, size_t n) { return (float*)carve(base, cursor, n * sizeof(float)); }

// A fused in_proj of P rows, its output rows ldP = rows_padded(P) apart: on the device the weight's rows are padded
// to ldP by zero rows (model.h's aligned layout), so one product over ldP rows writes proj (BT, ldP), its padding
// columns zero. One product with an odd P (3084 for gdn at 124M, 2578 for pkda) runs on slower cuBLASLt kernels, and
// a second product for the rows past a multiple of 8 costs as much as a tenth of the first. w is the weight's fp32
// master (P, C).
static void in_proj_forward(const MixerContext* mc, const float* w_master, floatX* proj, int ldP, const floatX* x,
                            int BT) {
    matmul_forward(proj, x, X(mc, w_master), NULL, BT, mc->config->channels, ldP, NULL, mc->stream);
}

// its backward: dx (BT, C) overwritten, the weight gradient dw (P, C) accumulated. dproj's padding columns P .. ldP
// are zeroed first: then the padding rows contribute nothing to dx and their gradient stays zero.
static void in_proj_backward(const MixerContext* mc, const float* w_master, float* dw, floatX* dx, floatX* dproj,
                             int P, int ldP, const floatX* x, int BT) {
    if (ldP > P) {
        cudaCheck(cudaMemset2DAsync(dproj + P, ldP * sizeof(floatX), 0, (ldP - P) * sizeof(floatX), BT, mc->stream));
    }
    matmul_backward(dx, dw, NULL, NULL, dproj, x, X(mc, w_master), BT, mc->config->channels, ldP, 0, mc->stream);
}

// One row per mixer family. `settings`, `acts` and `state` are the layer's blocks (the family's structs).
typedef struct {
    const char* name;
    // the layer's settings from the config (called once, by model_build)
    void (*build)(void* settings, const Config* c, int layer);
    // carve the layer's saved activations for a batch of B x T tokens (base NULL: count only)
    void (*layout_acts)(void* acts, const void* settings, const Config* c, char* base, size_t* cursor, int B, int T);
    // the backward's needs in bytes: its own scratch, and of the shared reduce and work buffers
    void (*scratch_bytes)(const void* settings, const Config* c, int B, int T, size_t* own, size_t* reduce, size_t* work);
    // out (B,T,C) = mixer(x), saving what the backward needs in acts
    void (*forward)(const MixerContext* mc, const void* settings, const LayerParams* p, void* acts, floatX* out,
                    const floatX* x, int B, int T);
    // dx (B,T,C) overwritten from dout; the parameter gradients accumulate into grads
    void (*backward)(const MixerContext* mc, const void* settings, const LayerParams* p, LayerParams* grads,
                     const void* acts, floatX* dx, const floatX* dout, const floatX* x, int B, int T);
    // carve the layer's decode state for sequences of up to max_len tokens (zeroed before the first step)
    void (*layout_decode)(void* state, const void* settings, const Config* c, char* base, size_t* cursor, int max_len);
    // one token at position t of one sequence: out (C) = mixer(x (C)), advancing the state
    void (*decode_step)(const MixerContext* mc, const void* settings, const LayerParams* p, void* state, floatX* out,
                        const floatX* x, int t);
} MixerOps;

#endif // TRAIN_KLA_KERNELS_MIXERS_MIXER_CUH
