/*
train_kla.c: the CPU trainer of train_kla. fp32, OpenMP, every mixer forward and backward by hand.

The model is GPT-2's trunk with one sequence mixer per layer, chosen by a pattern such as `gdn`, `attn:12`
or `attn:2,gdn:1,kaczmarz:1`:

    x = wte[tokens] (+ wpe[t] when every layer is attn)
    for each layer:  x += mixer(LN1(x));  x += MLP(LN2(x))
    logits = LNf(x) @ wte^T

Mixers, in this file's order: `attn` (GPT-2 causal softmax attention); `gdn` (Gated DeltaNet) and `kaczmarz`
(Kaczmarz Linear Attention), spec/gdn_kaczmarz.md; `pdn`, `pgdn` and `pkda` (Preconditioned DeltaNet, Gated
DeltaNet and Kimi Delta Attention), spec/pdn.md; `gka` (Gated KalmaNet), spec/gka.md; `kalman` (Kalman Linear
Attention), spec/kalman.md. A single-name pattern (`gdn`) is repeated to --depth. FORMATS.md gives the checkpoint
and debug-state formats and the exact parameter layout; the code below follows it.

Memory plan, as llm.c: one allocation for the parameters (byte-identical to the checkpoint payload), one for
their gradients, one for AdamW's m and v, one for the activations saved by the forward pass, and one for
the backward's scratch. Each layer's forward/backward is a plain function over those arrays.

When compiled with -DTESTING the file provides everything but main(), for test_kla.c.
*/
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef OMP
#include <omp.h>
#endif

#include "utils.h"
#include "tokenizer.h"
#include "dataloader.h"
#include "model.h"

// ----------------------------------------------------------------------------------------------------------
// OpenMP helpers (the program also builds without OpenMP)

static int max_threads(void) {
#ifdef OMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
static int thread_id(void) {
#ifdef OMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

// ----------------------------------------------------------------------------------------------------------
// the trunk's layers (GPT-2), forward and backward. Backward functions accumulate (+=) into gradients.

// x[b,t,:] = wte[token] (+ wpe[t])
static void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C) {
    for (int bt = 0; bt < B * T; bt++) {
        const float* e = wte + (size_t)inp[bt] * C;
        const float* pe = wpe ? wpe + (size_t)(bt % T) * C : NULL;
        for (int i = 0; i < C; i++) { out[(size_t)bt * C + i] = e[i] + (pe ? pe[i] : 0.0f); }
    }
}

static void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T, int C) {
    for (int bt = 0; bt < B * T; bt++) {
        float* dw = dwte + (size_t)inp[bt] * C;
        float* dp = dwpe ? dwpe + (size_t)(bt % T) * C : NULL;
        for (int i = 0; i < C; i++) {
            dw[i] += dout[(size_t)bt * C + i];
            if (dp) { dp[i] += dout[(size_t)bt * C + i]; }
        }
    }
}

// LayerNorm over the last dim with biased variance; saves mean and 1/std per row for the backward
static void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                              int N, int C, float eps) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        float m = 0.0f, v = 0.0f;
        for (int i = 0; i < C; i++) { m += x[i]; }
        m /= C;
        for (int i = 0; i < C; i++) { float d = x[i] - m; v += d * d; }
        float s = 1.0f / sqrtf(v / C + eps);
        float* o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) { o[i] = (x[i] - m) * s * w[i] + b[i]; }
        mean[n] = m;
        rstd[n] = s;
    }
}

// dinp += (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) * rstd with dxhat = dout * w
static void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                               const float* mean, const float* rstd, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* d = dout + (size_t)n * C;
        float* dx = dinp + (size_t)n * C;
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - mean[n]) * rstd[n];
            float dnorm = w[i] * d[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * xhat;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int i = 0; i < C; i++) {
            float xhat = (x[i] - mean[n]) * rstd[n];
            float dnorm = w[i] * d[i];
            dx[i] += (dnorm - dnorm_mean - xhat * dnorm_norm_mean) * rstd[n];
        }
    }
    // the parameter gradients sum over rows: one thread per channel, rows in order (deterministic)
#pragma omp parallel for
    for (int i = 0; i < C; i++) {
        float sw = 0.0f, sb = 0.0f;
        for (int n = 0; n < N; n++) {
            float xhat = (inp[(size_t)n * C + i] - mean[n]) * rstd[n];
            sw += dout[(size_t)n * C + i] * xhat;
            sb += dout[(size_t)n * C + i];
        }
        dw[i] += sw;
        db[i] += sb;
    }
}

// RMSNorm: out = inp / sqrt(mean(inp^2) + eps) * w; saves 1/rms per row
static void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int N, int C, float eps) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        float ss = 0.0f;
        for (int i = 0; i < C; i++) { ss += x[i] * x[i]; }
        float s = 1.0f / sqrtf(ss / C + eps);
        float* o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) { o[i] = x[i] * s * w[i]; }
        rstd[n] = s;
    }
}

// dinp += rstd * (dxhat - xhat * mean(dxhat * xhat)) with xhat = inp * rstd, dxhat = dout * w
static void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                             const float* rstd, int N, int C) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* d = dout + (size_t)n * C;
        float* dx = dinp + (size_t)n * C;
        float dot = 0.0f;
        for (int i = 0; i < C; i++) { dot += d[i] * w[i] * x[i] * rstd[n]; }
        dot /= C;
        for (int i = 0; i < C; i++) { dx[i] += (d[i] * w[i] - x[i] * rstd[n] * dot) * rstd[n]; }
    }
#pragma omp parallel for
    for (int i = 0; i < C; i++) {
        float sw = 0.0f;
        for (int n = 0; n < N; n++) { sw += dout[(size_t)n * C + i] * inp[(size_t)n * C + i] * rstd[n]; }
        dw[i] += sw;
    }
}

// dot product of two contiguous vectors with 8 independent partial sums, which the compiler turns into SIMD
// without -ffast-math (the summation order is fixed, so results are the same on every run)
static inline float dot8(const float* a, const float* b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; j++) { acc[j] += a[i + j] * b[i + j]; }
    }
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++) { s += a[i] * b[i]; }
    return s;
}

// 8 floats as one GCC/Clang vector; aligned(4) lets it load from any float address
typedef float vec8 __attribute__((vector_size(32), aligned(4)));
static inline float vec8_sum(const vec8* v) { return (((*v)[0] + (*v)[1]) + ((*v)[2] + (*v)[3])) + (((*v)[4] + (*v)[5]) + ((*v)[6] + (*v)[7])); }

// out[m][n] = (accumulate ? out[m][n] : bias[n]) + A[m][:] . Bm[n][:]   (A: M x K, Bm: N x K, bias may be NULL)
// The product of a matrix with the transpose of another, the shape of every matmul below. Work is cut into
// blocks of 128 rows of Bm (which stay in cache) times tiles of 4 rows of A; a 4x4 tile of outputs is
// accumulated in 16 vector registers, so each loaded vector is used 4 times. Every output is computed by one
// thread in a fixed order, so results do not depend on the number of threads.
static void matmul_nt(float* out, const float* A, const float* Bm, const float* bias, int M, int K, int N, int accumulate) {
    const int NB = 128;
    int num_nblocks = (N + NB - 1) / NB, num_mtiles = (M + 3) / 4;
#pragma omp parallel for collapse(2) schedule(static)
    for (int nb = 0; nb < num_nblocks; nb++) {
        for (int mt = 0; mt < num_mtiles; mt++) {
            int m0 = mt * 4;
            for (int n0 = nb * NB; n0 < nb * NB + NB && n0 < N; n0 += 4) {
                if (m0 + 4 <= M && n0 + 4 <= N && K % 8 == 0) {
                    vec8 acc[4][4];
                    memset(acc, 0, sizeof(acc));
                    const float *x = A + (size_t)m0 * K, *w = Bm + (size_t)n0 * K;
                    for (int i = 0; i < K; i += 8) {
                        vec8 x0 = *(const vec8*)(x + i), x1 = *(const vec8*)(x + (size_t)K + i);
                        vec8 x2 = *(const vec8*)(x + 2 * (size_t)K + i), x3 = *(const vec8*)(x + 3 * (size_t)K + i);
                        for (int j = 0; j < 4; j++) {
                            vec8 wj = *(const vec8*)(w + (size_t)j * K + i);
                            acc[0][j] += x0 * wj;
                            acc[1][j] += x1 * wj;
                            acc[2][j] += x2 * wj;
                            acc[3][j] += x3 * wj;
                        }
                    }
                    for (int r = 0; r < 4; r++) {
                        for (int j = 0; j < 4; j++) {
                            float* o = out + (size_t)(m0 + r) * N + n0 + j;
                            *o = (accumulate ? *o : bias ? bias[n0 + j] : 0.0f) + vec8_sum(&acc[r][j]);
                        }
                    }
                } else {  // edges of the matrix, or K not a multiple of 8
                    for (int r = m0; r < m0 + 4 && r < M; r++) {
                        for (int n = n0; n < n0 + 4 && n < N; n++) {
                            float* o = out + (size_t)r * N + n;
                            *o = (accumulate ? *o : bias ? bias[n] : 0.0f) + dot8(A + (size_t)r * K, Bm + (size_t)n * K, K);
                        }
                    }
                }
            }
        }
    }
}

// out[bt][o] = bias[o] + inp[bt][:] . weight[o][:]   (inp: BT x C, weight: OC x C as nn.Linear, bias may be NULL)
static void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC) {
    matmul_nt(out, inp, weight, bias, BT, C, OC, 0);
}

// matmul_backward's workspace: the transpose of the weight it works on, grown to the largest weight seen
// (wte, Vp x C, after the first step). Only the main thread calls matmul_backward.
static float* weight_transpose = NULL;
static size_t weight_transpose_floats = 0;

// dinp += dout @ weight; dweight += dout^T @ inp; dbias += column sums of dout (dbias may be NULL)
static void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, int BT, int C, int OC) {
    // dinp = dout (BT x OC) times weight^T^T: transpose the weight (C x OC) and use matmul_nt
    if (weight_transpose_floats < (size_t)OC * C) {
        free(weight_transpose);
        weight_transpose_floats = (size_t)OC * C;
        weight_transpose = (float*)malloc_or_die(weight_transpose_floats * sizeof(float));
    }
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += 16) {
        for (int o = 0; o < OC; o++) {
            for (int c = c0; c < c0 + 16 && c < C; c++) { weight_transpose[(size_t)c * OC + o] = weight[(size_t)o * C + c]; }
        }
    }
    matmul_nt(dinp, dout, weight_transpose, NULL, BT, OC, C, 1);
    // dweight[o][:] += sum_r dout[r][o] * inp[r][:]: per tile of 4 weight rows, 32 channels of them live in 16
    // vector registers while the input rows stream by in order (each weight row belongs to one thread)
    int num_otiles = (OC + 3) / 4;
#pragma omp parallel for schedule(static)
    for (int ot = 0; ot < num_otiles; ot++) {
        int o0 = ot * 4;
        if (o0 + 4 <= OC && C % 32 == 0) {
            for (int c = 0; c < C; c += 32) {
                vec8 acc[4][4];
                for (int j = 0; j < 4; j++) {
                    for (int q = 0; q < 4; q++) { acc[j][q] = *(vec8*)(dweight + (size_t)(o0 + j) * C + c + 8 * q); }
                }
                for (int r = 0; r < BT; r++) {
                    const float* x = inp + (size_t)r * C + c;
                    vec8 x0 = *(const vec8*)x, x1 = *(const vec8*)(x + 8), x2 = *(const vec8*)(x + 16), x3 = *(const vec8*)(x + 24);
                    const float* d = dout + (size_t)r * OC + o0;
                    for (int j = 0; j < 4; j++) {
                        float dj = d[j];
                        acc[j][0] += dj * x0;
                        acc[j][1] += dj * x1;
                        acc[j][2] += dj * x2;
                        acc[j][3] += dj * x3;
                    }
                }
                for (int j = 0; j < 4; j++) {
                    for (int q = 0; q < 4; q++) { *(vec8*)(dweight + (size_t)(o0 + j) * C + c + 8 * q) = acc[j][q]; }
                }
            }
        } else {  // edges, or C not a multiple of 32
            for (int o = o0; o < o0 + 4 && o < OC; o++) {
                for (int r = 0; r < BT; r++) {
                    float d = dout[(size_t)r * OC + o];
                    for (int i = 0; i < C; i++) { dweight[(size_t)o * C + i] += d * inp[(size_t)r * C + i]; }
                }
            }
        }
        if (dbias) {
            for (int o = o0; o < o0 + 4 && o < OC; o++) {
                float s = 0.0f;
                for (int r = 0; r < BT; r++) { s += dout[(size_t)r * OC + o]; }
                dbias[o] += s;
            }
        }
    }
}

// GPT-2 causal self-attention on qkv (B, T, 3C) -> out (B, T, C); saves the probabilities att (B, NH, T, T)
// (only the causal part t2 <= t is written and read).
static void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < NH; h++) {
                const float* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float* a = att + (((size_t)b * NH + h) * T + t) * T;
                float maxv = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    a[t2] = dot8(q, k, hs) * scale;
                    if (a[t2] > maxv) { maxv = a[t2]; }
                }
                float sum = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) { a[t2] = expf(a[t2] - maxv); sum += a[t2]; }
                float inv = 1.0f / sum;
                float* o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) { o[i] = 0.0f; }
                for (int t2 = 0; t2 <= t; t2++) {
                    a[t2] *= inv;
                    const float* v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) { o[i] += a[t2] * v[i]; }
                }
            }
        }
    }
}

// Backward of attention_forward: dqkv += ... . One (b, h) per task, so the k/v gradients of all query rows
// of that head are accumulated by one thread in a fixed order. scratch: T floats per thread.
static void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, float* scratch,
                               int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float* datt = scratch + (size_t)thread_id() * T;
            for (int t = 0; t < T; t++) {
                const float* a = att + (((size_t)b * NH + h) * T + t) * T;
                const float* dy = dout + ((size_t)b * T + t) * C + h * hs;
                const float* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float* dq = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
                // datt = dy . v ;  dpre = att * (datt - sum(att * datt))  (softmax backward)
                float s = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    datt[t2] = dot8(dy, v, hs);
                    s += a[t2] * datt[t2];
                }
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    float* dk = dqkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    float* dv = dqkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    float dpre = a[t2] * (datt[t2] - s) * scale;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += dpre * k[i];
                        dk[i] += dpre * q[i];
                        dv[i] += a[t2] * dy[i];
                    }
                }
            }
        }
    }
}

#define GELU_SCALING_FACTOR 0.7978845608028654f  // sqrt(2 / pi)
static void gelu_forward(float* out, const float* inp, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALING_FACTOR * (x + 0.044715f * x * x * x)));
    }
}

static void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
#pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALING_FACTOR * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_SCALING_FACTOR * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += grad * dout[i];
    }
}

// SwiGLU: out[r][j] = SiLU(gate[r][j]) * up[r][j] with inp rows [gate (H) | up (H)]
static void swiglu_forward(float* out, const float* inp, int N, int H) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *gate = inp + (size_t)n * 2 * H, *up = gate + H;
        for (int j = 0; j < H; j++) { out[(size_t)n * H + j] = gate[j] / (1.0f + expf(-gate[j])) * up[j]; }
    }
}

// dinp += d(gate), d(up): SiLU'(u) = sigmoid(u) * (1 + u * (1 - sigmoid(u)))
static void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int H) {
#pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float *gate = inp + (size_t)n * 2 * H, *up = gate + H;
        float *dgate = dinp + (size_t)n * 2 * H, *dup = dgate + H;
        for (int j = 0; j < H; j++) {
            float sg = 1.0f / (1.0f + expf(-gate[j])), d = dout[(size_t)n * H + j];
            dup[j] += d * gate[j] * sg;
            dgate[j] += d * up[j] * sg * (1.0f + gate[j] * (1.0f - sg));
        }
    }
}

static void residual_forward(float* out, const float* a, const float* b, size_t N) {
    for (size_t i = 0; i < N; i++) { out[i] = a[i] + b[i]; }
}

// probs = softmax over the first V of Vp logits (padding probabilities set to 0);
// losses[bt] = -log probs[target] when targets is not NULL, 0 where the target is negative (ignored: tasks.h)
static void softmax_crossentropy_forward(float* probs, float* losses, const float* logits, const int* targets,
                                         int BT, int V, int Vp) {
#pragma omp parallel for
    for (int bt = 0; bt < BT; bt++) {
        const float* z = logits + (size_t)bt * Vp;
        float* p = probs + (size_t)bt * Vp;
        float maxv = -INFINITY;
        for (int i = 0; i < V; i++) { if (z[i] > maxv) { maxv = z[i]; } }
        double sum = 0.0;
        for (int i = 0; i < V; i++) { p[i] = expf(z[i] - maxv); sum += p[i]; }
        float inv = (float)(1.0 / sum);
        for (int i = 0; i < V; i++) { p[i] *= inv; }
        for (int i = V; i < Vp; i++) { p[i] = 0.0f; }
        if (targets) { losses[bt] = targets[bt] < 0 ? 0.0f : -logf(p[targets[bt]]); }
    }
}

// dlogits = (probs - onehot(target)) * dloss, written over the first V columns, padding 0; all 0 for a row whose
// target is negative (ignored)
static void softmax_crossentropy_backward(float* dlogits, const float* probs, const int* targets, float dloss,
                                          int BT, int V, int Vp) {
#pragma omp parallel for
    for (int bt = 0; bt < BT; bt++) {
        const float* p = probs + (size_t)bt * Vp;
        float* d = dlogits + (size_t)bt * Vp;
        float scale = targets[bt] < 0 ? 0.0f : dloss;
        for (int i = 0; i < V; i++) { d[i] = p[i] * scale; }
        for (int i = V; i < Vp; i++) { d[i] = 0.0f; }
        if (targets[bt] >= 0) { d[targets[bt]] -= dloss; }
    }
}

// ----------------------------------------------------------------------------------------------------------
// scalar and vector helpers of the recurrent mixers

static inline float sigmoidf(float u) { return 1.0f / (1.0f + expf(-u)); }
// softplus with torch's threshold (u above 20 passes through), and its derivative; used by every decay gate
static inline float softplusf(float u) { return u > 20.0f ? u : log1pf(expf(u)); }
static inline float dsoftplusf(float u) { return u > 20.0f ? 1.0f : sigmoidf(u); }

// dot product: 16 partial sums in a fixed order: vectorises without -ffast-math, same result for any thread count
static inline float vec_dot(const float* a, const float* b, int n) {
    float acc[16] = {0.0f};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        for (int l = 0; l < 16; l++) { acc[l] += a[i + l] * b[i + l]; }
    }
    for (; i < n; i++) { acc[0] += a[i] * b[i]; }
    for (int l = 0; l < 8; l++) { acc[l] += acc[l + 8]; }
    for (int l = 0; l < 4; l++) { acc[l] += acc[l + 4]; }
    for (int l = 0; l < 2; l++) { acc[l] += acc[l + 2]; }
    return acc[0] + acc[1];
}

// Backward of u_hat = u / n, n = sqrt(||u||^2 + eps) (spec/gdn_kaczmarz.md 1.6, spec/pdn.md 2.4): du = (du_hat - u_hat (u_hat . du_hat)) / n,
// in place on du (gka normalises with eps outside the sqrt and has its own).
static inline void l2norm_backward(float* du, const float* u_hat, float n, int d) {
    const float c = vec_dot(u_hat, du, d);
    for (int i = 0; i < d; i++) { du[i] = (du[i] - u_hat[i] * c) / n; }
}

// y += alpha * x
static inline void vec_axpy(float* y, float alpha, const float* x, int n) {
    for (int i = 0; i < n; i++) { y[i] += alpha * x[i]; }
}

// y[0:n] += alpha * sum_{k<K} c[k] X[k][0:n] (rows of X ldx apart), the vector-matrix product behind every
// "row accumulates many scaled rows" step. Slices of y are summed in registers over the whole k loop
// instead of being re-loaded and re-stored by K axpys (which is store-forwarding latency bound).
static inline void vec_vecmat(float* y, float alpha, const float* c, const float* X, size_t ldx, int K, int n) {
    int j = 0;
    for (; j + 32 <= n; j += 32) {
        float acc[32] = {0.0f};
        for (int k = 0; k < K; k++) {
            const float ck = c[k];
            const float* x = X + k * ldx + j;
            for (int l = 0; l < 32; l++) { acc[l] += ck * x[l]; }
        }
        for (int l = 0; l < 32; l++) { y[j + l] += alpha * acc[l]; }
    }
    for (; j + 8 <= n; j += 8) {
        float acc[8] = {0.0f};
        for (int k = 0; k < K; k++) {
            const float ck = c[k];
            const float* x = X + k * ldx + j;
            for (int l = 0; l < 8; l++) { acc[l] += ck * x[l]; }
        }
        for (int l = 0; l < 8; l++) { y[j + l] += alpha * acc[l]; }
    }
    for (; j < n; j++) {
        float acc = 0.0f;
        for (int k = 0; k < K; k++) { acc += c[k] * X[k * ldx + j]; }
        y[j] += alpha * acc;
    }
}

// ----------------------------------------------------------------------------------------------------------
// the gdn / kaczmarz mixer (spec/gdn_kaczmarz.md)

// ----------------------------------------------------------------------------
// gdn / kaczmarz mixer (Gated DeltaNet and Kaczmarz Linear Attention), fp32, OpenMP.
// Math: spec/gdn_kaczmarz.md ("spec"). Parameter layout: FORMATS.md.
// Both mixers share all code; kaczmarz differs only in the key normalisation and beta (spec 2.2).
// Layouts (row-major, last index fastest), with P = 2*H*dk + 2*H*dv + 2*H and D = 2*H*dk + H*dv:
//   proj [B,T,P]  in_proj output, blocks q | k | v | z | a | b (the first D channels go through the conv)
//   qkv  [B,T,D]  conv + SiLU output, blocks q | k | v, q l2-normalised, k l2-normalised (gdn) or raw (kaczmarz)
//   beta, g [B,T,H]; o, y [B,T,H*dv]; recurrent state S [dk, dv] per head ("K-first", spec 0)

typedef struct {
    int C, H, dk, dv, W;   // model width, heads, key/query head dim, value head dim, conv taps
    int kaczmarz;          // 0: gdn (k l2-normalised, beta = eta), 1: kaczmarz (k raw, beta = eta/(||k||^2+eps))
    float l2norm_eps, onorm_eps, kaczmarz_eps;
    int chunk;             // BT of the chunkwise forward (spec 3)
} GDNConfig;

// everything the backward needs, written by gdn_forward
typedef struct {
    float* proj;   // [B,T,P] in_proj output (pre-conv q|k|v, z, a, b)
    float* qkv;    // [B,T,D] inputs of the core: q, k, v after conv, SiLU and normalisation
    float* qn;     // [B,T,H] sqrt(||q||^2 + l2norm_eps) of the un-normalised q
    float* kn;     // [B,T,H] gdn: sqrt(||k||^2 + l2norm_eps); kaczmarz: ||k||^2 + kaczmarz_eps
    float* beta;   // [B,T,H] write coefficient
    float* g;      // [B,T,H] log decay
    float* h;      // [B,H,NT,dk,dv] chunk-start states h_n (spec 3.3)
    float* o;      // [B,T,H*dv] core output
    float* rstd;   // [B,T,H] gated RMSNorm 1/rms
    float* y;      // [B,T,H*dv] gated RMSNorm output = out_proj input
    float* work;   // forward-only workspace of the chunk kernel, nthr blocks of gdn_core_work_floats
    int nthr;      // threads the workspaces were sized for (omp_get_max_threads() at gdn_acts_point)
} GDNActs;

// decode state of one sequence (spec 4)
typedef struct {
    float* conv;   // [W-1, D] the last W-1 pre-conv inputs, oldest first (zeros at start)
    float* S;      // [H, dk, dv] recurrent state
} GDNState;

static inline int gdn_D(const GDNConfig* c) { return 2 * c->H * c->dk + c->H * c->dv; }
static inline int gdn_P(const GDNConfig* c) { return 2 * c->H * c->dk + 2 * c->H * c->dv + 2 * c->H; }
static inline int gdn_NT(int T, int BT) { return (T + BT - 1) / BT; }


// ----------------------------------------------------------------------------
// mixer core: inputs qkv [B,T,D], beta [B,T,H], g [B,T,H]; output o [B,T,H*dv]; scale = dk^-1/2

// spec 2.1, one token of one head: Sbar = alpha S_prev; r = v - Sbar^T k; S = Sbar + k (beta r)^T.
// S may alias S_prev (rows are read before they are written). r [dv] receives the residual.
static void gdn_delta_step(float* S, const float* S_prev, const float* k, const float* v,
                           float beta, float alpha, float* r, int dk, int dv) {
    for (int j = 0; j < dv; j++) { r[j] = v[j]; }
    vec_vecmat(r, -alpha, k, S_prev, dv, dk, dv);
    for (int i = 0; i < dk; i++) {
        const float* sp = S_prev + (size_t)i * dv;
        float* s = S + (size_t)i * dv;
        float bk = beta * k[i];
        for (int j = 0; j < dv; j++) { s[j] = alpha * sp[j] + bk * r[j]; }
    }
}

// spec 2.1: token-by-token recurrence. S [B,H,dk,dv]: initial state in, final state out.
static void gdn_core_recurrent(float* o, float* S, const float* qkv, const float* beta, const float* g,
                               int B, int T, int H, int dk, int dv) {
    const int D = 2 * H * dk + H * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, hh = bh % H;
        float* Sb = S + (size_t)bh * dk * dv;
        for (int t = 0; t < T; t++) {
            const size_t r = (size_t)b * T + t;
            const float* q = qkv + r * D + hh * dk;
            const float* k = qkv + r * D + H * dk + hh * dk;
            const float* v = qkv + r * D + 2 * H * dk + hh * dv;
            float* ot = o + (r * H + hh) * dv;
            // the o row holds the residual r_t until o_t is written
            gdn_delta_step(Sb, Sb, k, v, beta[r * H + hh], expf(g[r * H + hh]), ot, dk, dv);
            // o_t = S_t^T (scale q_t), read after write
            for (int j = 0; j < dv; j++) { ot[j] = 0.0f; }
            vec_vecmat(ot, scale, q, Sb, dv, dk, dv);
        }
    }
}

// per-thread workspace of gdn_core_chunk_forward: M, A [BT,BT], K^T [dk,BT], W [BT,dk], U/Vn [BT,dv]
static size_t gdn_core_work_floats(int BT, int dk, int dv) {
    return 2 * (size_t)BT * BT + 2 * (size_t)BT * dk + (size_t)BT * dv;
}

// spec 3.1-3.3: chunkwise forward, chunks of BT tokens; the last chunk may be shorter (L = T - n*BT tokens):
// every formula below holds with BT replaced by L, so no padding is needed.
// h [B,H,NT,dk,dv] receives the chunk-start states (h_0 = initial state).
// S [B,H,dk,dv]: initial state in, final state out; NULL means zero initial state, final state not returned.
// work: nthr * gdn_core_work_floats(BT, dk, dv) floats.
static void gdn_core_chunk_forward(float* o, float* h, float* S, const float* qkv, const float* beta, const float* g,
                                   int B, int T, int H, int dk, int dv, int BT, float* work, int nthr) {
    const int D = 2 * H * dk + H * dv;
    const int NT = gdn_NT(T, BT);
    const size_t dkdv = (size_t)dk * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    (void)nthr;   // read only by the OpenMP pragma
    #pragma omp parallel for num_threads(nthr) schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, hh = bh % H;
        float* M = work + (size_t)thread_id() * gdn_core_work_floats(BT, dk, dv); // [BT,BT] decays
        float* A = M + (size_t)BT * BT;         // [BT,BT]: A, then P
        float* Kt = A + (size_t)BT * BT;        // [dk,BT]: the chunk's keys, transposed
        float* Wm = Kt + (size_t)BT * dk;       // [BT,dk]
        float* Vn = Wm + (size_t)BT * dk;       // [BT,dv]: U, then Vn = U - W h_n in place
        float* hb = h + (size_t)bh * NT * dkdv;
        float* Sb = S ? S + (size_t)bh * dkdv : NULL;
        // cumulative log decay of a chunk, in double: with large decays |G_i| reaches 100s within a chunk,
        // and an fp32 G_i - G_j would carry an absolute error ~|G| 6e-8, i.e. ~1e-5 relative on exp(G_i - G_j)
        double G[BT];
        if (NT > 0) {
            if (Sb) { memcpy(hb, Sb, dkdv * sizeof(float)); } else { memset(hb, 0, dkdv * sizeof(float)); }
        }
        for (int n = 0; n < NT; n++) {
            const int t0 = n * BT;
            const int L = T - t0 < BT ? T - t0 : BT;
            const float* S0 = hb + n * dkdv;                     // state entering the chunk
            float* S1 = n + 1 < NT ? hb + (n + 1) * dkdv : Sb;  // state leaving it (NULL: not needed)
            const size_t r0 = (size_t)b * T + t0;                // row of the chunk's first token
            const float* Qc = qkv + r0 * D + hh * dk;           // token i of the chunk: Qc + i*D, ...
            const float* Kc = Qc + H * dk;
            const float* Vc = qkv + r0 * D + 2 * H * dk + hh * dv;
            // G_i = sum_{m<=i} g_m, reset at every chunk start (spec 3.1)
            double acc = 0.0;
            for (int i = 0; i < L; i++) { acc += g[(r0 + i) * H + hh]; G[i] = acc; }
            // M_ij = exp(G_i - G_j) for i >= j only, never i < j (spec 5); K^T for the state update
            for (int i = 0; i < L; i++) {
                for (int j = 0; j <= i; j++) { M[i * BT + j] = expf((float)(G[i] - G[j])); }
                for (int d = 0; d < dk; d++) { Kt[d * BT + i] = Kc[(size_t)i * D + d]; }
            }
            // A_ij = beta_i (k_i.k_j) M_ij for i > j
            for (int i = 0; i < L; i++) {
                const float bi = beta[(r0 + i) * H + hh];
                for (int j = 0; j < i; j++) {
                    A[i * BT + j] = bi * vec_dot(Kc + (size_t)i * D, Kc + (size_t)j * D, dk) * M[i * BT + j];
                }
            }
            // UT transform (spec 3.1/3.2): W = Tm diag(beta gam) K and U = Tm diag(beta) V with Tm = (I + A)^-1,
            // by forward substitution on (I + A) W = diag(beta gam) K and (I + A) U = diag(beta) V, row by row
            for (int i = 0; i < L; i++) {
                const float bi = beta[(r0 + i) * H + hh];
                const float bgi = bi * expf((float)G[i]);
                float* wi = Wm + (size_t)i * dk;
                float* ui = Vn + (size_t)i * dv;
                const float* ki = Kc + (size_t)i * D;
                const float* vi = Vc + (size_t)i * D;
                for (int d = 0; d < dk; d++) { wi[d] = bgi * ki[d]; }
                for (int d = 0; d < dv; d++) { ui[d] = bi * vi[d]; }
                vec_vecmat(wi, -1.0f, A + (size_t)i * BT, Wm, dk, i, dk);
                vec_vecmat(ui, -1.0f, A + (size_t)i * BT, Vn, dv, i, dv);
            }
            // Vn = U - W h_n: row i is exactly the write vector u_i of the recurrence (spec 3.1)
            for (int i = 0; i < L; i++) { vec_vecmat(Vn + (size_t)i * dv, -1.0f, Wm + (size_t)i * dk, S0, dv, dk, dv); }
            // O = scale (diag(gam) Q h_n + P Vn) with P = Q K^T (.) M, M_ij = exp(G_i - G_j) for j <= i (spec 3.1);
            // P overwrites A, which the UT transform no longer needs
            for (int i = 0; i < L; i++) {
                float* oi = o + ((r0 + i) * H + hh) * dv;
                const float* qi = Qc + (size_t)i * D;
                float* Pi = A + (size_t)i * BT;
                for (int j = 0; j <= i; j++) { Pi[j] = vec_dot(qi, Kc + (size_t)j * D, dk) * M[i * BT + j]; }
                for (int d = 0; d < dv; d++) { oi[d] = 0.0f; }
                vec_vecmat(oi, scale * expf((float)G[i]), qi, S0, dv, dk, dv);
                vec_vecmat(oi, scale, Pi, Vn, dv, i + 1, dv);
            }
            // S_end = gam_L h_n + K^T diag(exp(G_L - G)) Vn (spec 3.1, state kernel of 3.3); Vn is scaled in place
            if (S1) {
                const float gL = expf((float)G[L - 1]);
                for (size_t e = 0; e < dkdv; e++) { S1[e] = gL * S0[e]; }
                for (int i = 0; i < L; i++) {
                    const float ei = expf((float)(G[L - 1] - G[i]));
                    for (int d = 0; d < dv; d++) { Vn[(size_t)i * dv + d] *= ei; }
                }
                for (int d = 0; d < dk; d++) { vec_vecmat(S1 + d * dv, 1.0f, Kt + (size_t)d * BT, Vn, dv, L, dv); }
            }
        }
    }
}

// per-thread scratch of gdn_core_backward: the L+1 <= BT+1 states of a segment, the running dL/dS,
// the residuals r [BT,dv] and du [dv]
static size_t gdn_core_bwd_floats(int BT, int dk, int dv) {
    return (size_t)(BT + 2) * dk * dv + (size_t)BT * dv + dv;
}

// spec 2.4: exact reverse-time backward of the recurrence, per (b, head), segment by segment from the last
// chunk to the first; each segment's states are recomputed from its saved chunk-start state h_n.
// dO [B,T,H*dv] = dL/do; dST [B,H,dk,dv] = dL/dS_T (NULL: 0). Outputs (overwritten): dqkv [B,T,D] (gradients
// w.r.t. the core's q, k, v), dbeta, dg [B,T,H], dS0 [B,H,dk,dv] (NULL: not returned).
// scratch: nthr * gdn_core_bwd_floats(BT, dk, dv) floats.
static void gdn_core_backward(float* dqkv, float* dbeta, float* dg, float* dS0, const float* dO, const float* dST,
                              const float* h, const float* qkv, const float* beta, const float* g,
                              int B, int T, int H, int dk, int dv, int BT, float* scratch, int nthr) {
    const int D = 2 * H * dk + H * dv;
    const int NT = gdn_NT(T, BT);
    const size_t dkdv = (size_t)dk * dv;
    const float scale = 1.0f / sqrtf((float)dk);
    (void)nthr;   // read only by the OpenMP pragma
    #pragma omp parallel for num_threads(nthr) schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, hh = bh % H;
        float* Sbuf = scratch + (size_t)thread_id() * gdn_core_bwd_floats(BT, dk, dv); // [BT+1,dk,dv]
        float* Dm = Sbuf + (size_t)(BT + 1) * dkdv;   // D = dL/dS_t [dk,dv]
        float* rbuf = Dm + dkdv;                      // [BT,dv] residuals r_t of the segment
        float* du = rbuf + (size_t)BT * dv;           // [dv]
        if (dST) { memcpy(Dm, dST + bh * dkdv, dkdv * sizeof(float)); } else { memset(Dm, 0, dkdv * sizeof(float)); }
        for (int n = NT - 1; n >= 0; n--) {
            const int t0 = n * BT;
            const int L = T - t0 < BT ? T - t0 : BT;
            const size_t r0 = (size_t)b * T + t0;
            // recompute S_{t0-1+i} (Sbuf row i, i = 0..L) and r_t from h_n (spec 2.4 storage/recompute)
            memcpy(Sbuf, h + ((size_t)bh * NT + n) * dkdv, dkdv * sizeof(float));
            for (int i = 0; i < L; i++) {
                const size_t r = r0 + i;
                gdn_delta_step(Sbuf + (i + 1) * dkdv, Sbuf + i * dkdv, qkv + r * D + H * dk + hh * dk,
                               qkv + r * D + 2 * H * dk + hh * dv, beta[r * H + hh], expf(g[r * H + hh]),
                               rbuf + (size_t)i * dv, dk, dv);
            }
            // reverse loop over the segment; Dm enters as dL/dS_t and leaves as dL/dS_{t-1}
            for (int i = L - 1; i >= 0; i--) {
                const size_t r = r0 + i;
                const float* q = qkv + r * D + hh * dk;
                const float* k = qkv + r * D + H * dk + hh * dk;
                const float* St = Sbuf + (i + 1) * dkdv;   // S_t
                const float* Sp = Sbuf + i * dkdv;         // S_{t-1}; Sbar_t = alpha_t S_{t-1}
                const float* rt = rbuf + (size_t)i * dv;
                const float* dOt = dO + (r * H + hh) * dv;
                float* dq = dqkv + r * D + hh * dk;
                float* dk_ = dqkv + r * D + H * dk + hh * dk;
                float* dr = dqkv + r * D + 2 * H * dk + hh * dv;  // dv_t = dr_t
                const float bt = beta[r * H + hh];
                const float alpha = expf(g[r * H + hh]);
                // D += (scale q) dO^T; dq = scale S_t dO; du = D^T k; dk = D u  (u = beta r)
                for (int j = 0; j < dv; j++) { du[j] = 0.0f; }
                for (int d = 0; d < dk; d++) {
                    float* Dd = Dm + d * dv;
                    vec_axpy(Dd, scale * q[d], dOt, dv);
                    dq[d] = scale * vec_dot(St + d * dv, dOt, dv);
                    vec_axpy(du, k[d], Dd, dv);
                    dk_[d] = bt * vec_dot(Dd, rt, dv);
                }
                // dbeta = du.r; dr = beta du; dv = dr
                dbeta[r * H + hh] = vec_dot(du, rt, dv);
                for (int j = 0; j < dv; j++) { dr[j] = bt * du[j]; }
                // from r = v - Sbar^T k: dk -= Sbar dr; DSbar = D - k dr^T; dg = <DSbar, Sbar>_F; D <- alpha DSbar
                float dgs = 0.0f;
                for (int d = 0; d < dk; d++) {
                    float* Dd = Dm + d * dv;
                    dk_[d] -= alpha * vec_dot(Sp + d * dv, dr, dv);
                    vec_axpy(Dd, -k[d], dr, dv);
                    dgs += vec_dot(Dd, Sp + d * dv, dv);
                    for (int j = 0; j < dv; j++) { Dd[j] *= alpha; }
                }
                dg[r * H + hh] = alpha * dgs;
            }
        }
        if (dS0) { memcpy(dS0 + bh * dkdv, Dm, dkdv * sizeof(float)); }
    }
}

// ----------------------------------------------------------------------------
// per-token pieces of the layer, shared by the forward, the backward and decode

// The short causal depthwise conv (+ SiLU) in front of q, k, v; shared by the gdn and the pdn families.
// spec 1.2 step 2: causal depthwise conv pre-activation of the first D projection channels at time t of a
// sequence; proj_row points at the token's projection row, earlier tokens are P floats apart, taps that
// reach before the sequence start read zeros. Tap W-1 multiplies the current token.
static void shortconv_row(float* yc, const float* proj_row, int t, const float* conv_w, int D, int P, int W) {
    for (int ch = 0; ch < D; ch++) { yc[ch] = 0.0f; }
    for (int j = 0; j < W; j++) {
        const int back = W - 1 - j;
        if (back > t) { continue; }
        const float* src = proj_row - (ptrdiff_t)back * P;
        for (int ch = 0; ch < D; ch++) { yc[ch] += conv_w[ch * W + j] * src[ch]; }
    }
}

// Through the SiLU after the conv: drow *= SiLU'(y) with the pre-activation y recomputed into yrow;
// SiLU'(y) = sigmoid(y) (1 + y (1 - sigmoid(y)))
static void shortconv_silu_backward_row(float* drow, float* yrow, const float* proj_row, int t, const float* conv_w,
                                        int D, int P, int W) {
    shortconv_row(yrow, proj_row, t, conv_w, D, P, W);
    for (int ch = 0; ch < D; ch++) {
        const float sy = sigmoidf(yrow[ch]);
        drow[ch] *= sy * (1.0f + yrow[ch] * (1.0f - sy));
    }
}

// spec 1.6: dy [BT,D] = dL/d(conv output). Overwrites the first D channels of every dproj row [BT,P] with
// d in_s[ch] = sum_j w[ch,j] dy_{s+(W-1)-j}[ch] (within each sequence of T), and adds
// dw[ch,j] += sum_{b,t} dy_t[ch] in_{t-(W-1)+j}[ch] (blocks of channels in parallel, tokens in order).
static void shortconv_backward(float* dproj, float* dconv_w, const float* dy, const float* proj, const float* conv_w,
                               int BT, int T, int D, int P, int W) {
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const int t = r % T;
        float* dprow = dproj + (size_t)r * P;
        for (int ch = 0; ch < D; ch++) { dprow[ch] = 0.0f; }
        for (int j = 0; j < W; j++) {
            const int fwd = W - 1 - j;   // this input is tap j of token t + fwd
            if (t + fwd >= T) { continue; }
            const float* dyc = dy + (size_t)(r + fwd) * D;
            for (int ch = 0; ch < D; ch++) { dprow[ch] += conv_w[ch * W + j] * dyc[ch]; }
        }
    }
    const int CB = 32;
    #pragma omp parallel for schedule(static)
    for (int ch0 = 0; ch0 < D; ch0 += CB) {
        const int ch1 = ch0 + CB < D ? ch0 + CB : D;
        for (int r = 0; r < BT; r++) {
            const int t = r % T;
            const float* dyc = dy + (size_t)r * D;
            for (int j = 0; j < W; j++) {
                const int back = W - 1 - j;
                if (back > t) { continue; }
                const float* in = proj + (size_t)(r - back) * P;
                for (int ch = ch0; ch < ch1; ch++) { dconv_w[ch * W + j] += dyc[ch] * in[ch]; }
            }
        }
    }
}

// Decode (spec 4): the conv over the cached inputs (cache row j is tap j) and the current token (tap W-1),
// then SiLU into qkv [D]; the cache [W-1, D] then shifts by one token.
static void shortconv_decode_step(float* qkv, float* cache, const float* proj, const float* conv_w, int D, int W) {
    for (int ch = 0; ch < D; ch++) {
        float acc = conv_w[ch * W + W - 1] * proj[ch];
        for (int j = 0; j < W - 1; j++) { acc += conv_w[ch * W + j] * cache[(size_t)j * D + ch]; }
        qkv[ch] = acc * sigmoidf(acc);
    }
    if (W > 1) {
        memmove(cache, cache + D, (size_t)(W - 2) * D * sizeof(float));
        memcpy(cache + (size_t)(W - 2) * D, proj, (size_t)D * sizeof(float));
    }
}

// spec 1.2 steps 4-6 for one token, on the SiLU output qkv_row (modified in place): q <- l2n(q);
// gdn: k <- l2n(k), beta = eta; kaczmarz: k raw, beta = eta / (||k||^2 + eps); eta = sigmoid(b + b_bias);
// g = -exp(A_log) softplus(a + dt_bias). Writes qn, kn, beta, g [H] (see GDNActs).
static void gdn_token_features(float* qkv_row, float* qn, float* kn, float* beta, float* g,
                               const float* proj_row, const GDNParams* p, const GDNConfig* c) {
    const int H = c->H, dk = c->dk, D = gdn_D(c);
    const float* a_pre = proj_row + D + H * c->dv;   // a block
    const float* b_pre = a_pre + H;                  // b block
    for (int hh = 0; hh < H; hh++) {
        float* q = qkv_row + hh * dk;
        float* k = qkv_row + H * dk + hh * dk;
        qn[hh] = sqrtf(vec_dot(q, q, dk) + c->l2norm_eps);
        const float qs = 1.0f / qn[hh];
        for (int d = 0; d < dk; d++) { q[d] *= qs; }
        const float eta = sigmoidf(b_pre[hh] + p->b_bias[hh]);
        const float kk = vec_dot(k, k, dk);
        if (c->kaczmarz) {
            kn[hh] = kk + c->kaczmarz_eps;
            beta[hh] = eta / kn[hh];
        } else {
            kn[hh] = sqrtf(kk + c->l2norm_eps);
            const float ks = 1.0f / kn[hh];
            for (int d = 0; d < dk; d++) { k[d] *= ks; }
            beta[hh] = eta;
        }
        const float u = a_pre[hh] + p->dt_bias[hh];
        g[hh] = -expf(p->A_log[hh]) * softplusf(u);
    }
}

// spec 1.2 step 8 for one token: y = o * rstd * onorm_w * SiLU(z) per head, rstd = 1/sqrt(mean(o^2) + eps)
static void gated_norm_row(float* y, float* rstd, const float* o, const float* z, const float* w,
                               int H, int dv, float eps) {
    for (int hh = 0; hh < H; hh++) {
        const float* oh = o + hh * dv;
        const float rs = 1.0f / sqrtf(vec_dot(oh, oh, dv) / dv + eps);
        rstd[hh] = rs;
        for (int i = 0; i < dv; i++) {
            const float zi = z[hh * dv + i];
            y[hh * dv + i] = oh[i] * rs * w[i] * zi * sigmoidf(zi);
        }
    }
}

// Backward of gated_norm_row over BT rows (spec/gdn_kaczmarz.md 1.6; gka uses the same norm, spec/gka.md 3.3): with
// xh = o rstd and s = SiLU(z), z the gate block that starts at column D of each proj row [P]:
// dz = dy xh w SiLU'(z) is written at the same place of dproj, dw += sum over rows and heads of dy xh s (staged
// in `stage` [BT, H*dv], then summed in row order), and dyo [BT, H*dv] is replaced in place by
// do = rstd (dxh - xh mean(dxh xh)) with dxh = dy w s.
static void gated_norm_backward(float* dyo, float* dproj, float* donorm_w, float* stage, const float* o,
                                const float* proj, const float* rstd, const float* onorm_w, int BT, int H, int dv,
                                int P, int D) {
    const int HV = H * dv;
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        for (int hh = 0; hh < H; hh++) {
            const size_t off = (size_t)r * HV + hh * dv;
            float* dy = dyo + off;
            float* tw = stage + off;
            const float* oh = o + off;
            const float* z = proj + (size_t)r * P + D + hh * dv;
            float* dz = dproj + (size_t)r * P + D + hh * dv;
            const float rs = rstd[(size_t)r * H + hh];
            float m = 0.0f;
            for (int i = 0; i < dv; i++) {
                const float xh = oh[i] * rs;
                const float sz = sigmoidf(z[i]);
                const float sw = z[i] * sz;
                tw[i] = dy[i] * xh * sw;
                dz[i] = dy[i] * xh * onorm_w[i] * sz * (1.0f + z[i] * (1.0f - sz));
                const float dxh = dy[i] * onorm_w[i] * sw;
                dy[i] = dxh;
                m += dxh * xh;
            }
            m /= dv;
            for (int i = 0; i < dv; i++) { dy[i] = rs * (dy[i] - oh[i] * rs * m); }
        }
    }
    for (size_t e = 0; e < (size_t)BT * H; e++) {
        for (int i = 0; i < dv; i++) { donorm_w[i] += stage[e * dv + i]; }
    }
}

// ----------------------------------------------------------------------------
// layer forward / backward

static size_t gdn_acts_floats(int B, int T, const GDNConfig* c) {
    const size_t BT = (size_t)B * T;
    const size_t HV = (size_t)c->H * c->dv;
    return BT * gdn_P(c) + BT * gdn_D(c) + 5 * BT * c->H
         + (size_t)B * c->H * gdn_NT(T, c->chunk) * c->dk * c->dv + 2 * BT * HV
         + (size_t)max_threads() * gdn_core_work_floats(c->chunk, c->dk, c->dv);
}

static void gdn_acts_point(GDNActs* a, float* base, int B, int T, const GDNConfig* c) {
    const size_t BT = (size_t)B * T;
    const size_t HV = (size_t)c->H * c->dv;
    a->proj = base;                    base += BT * gdn_P(c);
    a->qkv = base;                     base += BT * gdn_D(c);
    a->qn = base;                      base += BT * c->H;
    a->kn = base;                      base += BT * c->H;
    a->beta = base;                    base += BT * c->H;
    a->g = base;                       base += BT * c->H;
    a->rstd = base;                    base += BT * c->H;
    a->h = base;                       base += (size_t)B * c->H * gdn_NT(T, c->chunk) * c->dk * c->dv;
    a->o = base;                       base += BT * HV;
    a->y = base;                       base += BT * HV;
    a->work = base;
    a->nthr = max_threads();
}

// scratch of gdn_backward: dy/do [BT,H*dv], dqkv [BT,D], dbeta [BT,H], dg [BT,H], dproj [BT,P], core scratch.
// Sized for omp_get_max_threads() at the time of the call (as GDNActs): do not raise the thread count later.
static size_t gdn_scratch_floats(int B, int T, const GDNConfig* c) {
    const size_t BT = (size_t)B * T;
    return BT * ((size_t)c->H * c->dv + gdn_D(c) + 2 * c->H + gdn_P(c))
         + (size_t)max_threads() * gdn_core_bwd_floats(c->chunk, c->dk, c->dv);
}

// spec 1.2. x [B,T,C] (the LayerNorm-ed mixer input); out [B,T,C] overwritten.
static void gdn_forward(float* out, GDNActs* a, const GDNParams* p, const float* x, int B, int T, const GDNConfig* c) {
    const int BT = B * T, C = c->C, H = c->H, dv = c->dv, D = gdn_D(c), P = gdn_P(c);
    // step 1: fused projection, blocks q | k | v | z | a | b
    matmul_forward(a->proj, x, p->in_proj_w, NULL, BT, C, P);
    // steps 2-6: conv + SiLU, l2n, beta, g
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        float* row = a->qkv + (size_t)r * D;
        const float* prow = a->proj + (size_t)r * P;
        shortconv_row(row, prow, r % T, p->conv_w, D, P, c->W);
        for (int ch = 0; ch < D; ch++) { row[ch] *= sigmoidf(row[ch]); }
        gdn_token_features(row, a->qn + (size_t)r * H, a->kn + (size_t)r * H, a->beta + (size_t)r * H,
                           a->g + (size_t)r * H, prow, p, c);
    }
    // step 7: the recurrence, chunkwise (spec 3), S_0 = 0
    gdn_core_chunk_forward(a->o, a->h, NULL, a->qkv, a->beta, a->g, B, T, H, c->dk, dv, c->chunk, a->work, a->nthr);
    // step 8: gated RMSNorm, output projection
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        gated_norm_row(a->y + (size_t)r * H * dv, a->rstd + (size_t)r * H, a->o + (size_t)r * H * dv,
                           a->proj + (size_t)r * P + D, p->onorm_w, H, dv, c->onorm_eps);
    }
    matmul_forward(out, a->y, p->out_proj_w, NULL, BT, H * dv, C);
}

// spec 1.6. dout [B,T,C]; dx += dL/dx; grads += dL/dparams. Parameter-gradient sums run in a fixed order,
// so the result does not depend on the thread count.
static void gdn_backward(float* dx, GDNParams* grads, const float* dout, const GDNActs* a, const GDNParams* p,
                         const float* x, float* scratch, int B, int T, const GDNConfig* c) {
    const int BT = B * T, C = c->C, H = c->H, dk = c->dk, dv = c->dv, W = c->W;
    const int HV = H * dv, D = gdn_D(c), P = gdn_P(c);
    float* dyo = scratch;                          // dL/dy, then dL/do in place
    float* dqkv = dyo + (size_t)BT * HV;           // dL/d(core q,k,v), then dL/d(conv pre-activation)
    float* dbeta = dqkv + (size_t)BT * D;
    float* dg = dbeta + (size_t)BT * H;
    float* dproj = dg + (size_t)BT * H;            // dL/dproj
    float* core_scratch = dproj + (size_t)BT * P;

    // out = y W_o^T
    memset(dyo, 0, (size_t)BT * HV * sizeof(float));
    matmul_backward(dyo, grads->out_proj_w, NULL, dout, a->y, p->out_proj_w, BT, HV, C);

    // gated RMSNorm (spec 1.6)
    gated_norm_backward(dyo, dproj, grads->onorm_w, dqkv, a->o, a->proj, a->rstd, p->onorm_w, BT, H, dv, P, D);

    // the recurrence (spec 2.4), dS_T = 0
    gdn_core_backward(dqkv, dbeta, dg, NULL, dyo, NULL, a->h, a->qkv, a->beta, a->g,
                      B, T, H, dk, dv, c->chunk, core_scratch, a->nthr);

    // per token: l2n, kaczmarz beta chain, sigmoid, gate (spec 1.6); then SiLU'(conv pre-activation),
    // recomputed into dproj[r, 0:D) which the conv backward below overwrites
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const float* prow = a->proj + (size_t)r * P;
        const float* row = a->qkv + (size_t)r * D;
        float* drow = dqkv + (size_t)r * D;
        float* dprow = dproj + (size_t)r * P;
        for (int hh = 0; hh < H; hh++) {
            const size_t e = (size_t)r * H + hh;
            l2norm_backward(drow + hh * dk, row + hh * dk, a->qn[e], dk);
            const float* kh = row + H * dk + hh * dk;
            float* dkk = drow + H * dk + hh * dk;
            float deta;
            if (c->kaczmarz) {
                // beta = eta / s2, s2 = ||k||^2 + eps: dk += -2 dbeta beta / s2 k, deta = dbeta / s2
                const float s2 = a->kn[e];
                const float ck = -2.0f * dbeta[e] * a->beta[e] / s2;
                for (int d = 0; d < dk; d++) { dkk[d] += ck * kh[d]; }
                deta = dbeta[e] / s2;
            } else {
                l2norm_backward(dkk, kh, a->kn[e], dk);
                deta = dbeta[e];
            }
            // eta = sigmoid(b + b_bias)
            const float eta = sigmoidf(prow[D + HV + H + hh] + p->b_bias[hh]);
            dprow[D + HV + H + hh] = deta * eta * (1.0f - eta);
            // g = -exp(A_log) softplus(a + dt_bias), softplus'(u) = sigmoid(u) (1 above the threshold 20)
            const float u = prow[D + HV + hh] + p->dt_bias[hh];
            dprow[D + HV + hh] = dg[e] * -expf(p->A_log[hh]) * dsoftplusf(u);
        }
        shortconv_silu_backward_row(drow, dprow, prow, r % T, p->conv_w, D, P, W);
    }
    // gate and beta parameters: dA_log = sum dg g, ddt_bias = sum da, db_bias = sum db
    for (size_t r = 0; r < (size_t)BT; r++) {
        for (int hh = 0; hh < H; hh++) {
            grads->A_log[hh] += dg[r * H + hh] * a->g[r * H + hh];
            grads->dt_bias[hh] += dproj[r * P + D + HV + hh];
            grads->b_bias[hh] += dproj[r * P + D + HV + H + hh];
        }
    }

    // conv backward (spec 1.6)
    shortconv_backward(dproj, grads->conv_w, dqkv, a->proj, p->conv_w, BT, T, D, P, W);

    // proj = x W_in^T
    matmul_backward(dx, grads->in_proj_w, NULL, dproj, x, p->in_proj_w, BT, C, P);
}

// ----------------------------------------------------------------------------
// decode (spec 4): one token of one sequence with the recurrent state carried in GDNState

static size_t gdn_state_floats(const GDNConfig* c) {
    return (size_t)(c->W - 1) * gdn_D(c) + (size_t)c->H * c->dk * c->dv;
}

static void gdn_state_point(GDNState* s, float* base, const GDNConfig* c) {
    s->conv = base;
    s->S = base + (size_t)(c->W - 1) * gdn_D(c);
}

static void gdn_state_reset(GDNState* s, const GDNConfig* c) {
    memset(s->conv, 0, gdn_state_floats(c) * sizeof(float));   // conv cache and S are contiguous
}

// scratch of gdn_decode_step: proj [P], qkv [D], qn, kn, beta, g, rstd [H each], o [H*dv], y [H*dv]
static size_t gdn_decode_scratch_floats(const GDNConfig* c) {
    return (size_t)gdn_P(c) + gdn_D(c) + 5 * c->H + 2 * c->H * c->dv;
}

static void gdn_decode_step(float* out, GDNState* s, const GDNParams* p, const float* x, float* scratch, const GDNConfig* c) {
    const int H = c->H, dv = c->dv, W = c->W, D = gdn_D(c), P = gdn_P(c);
    float* proj = scratch;
    float* qkv = proj + P;
    float* qn = qkv + D;
    float* kn = qn + H;
    float* beta = kn + H;
    float* g = beta + H;
    float* rstd = g + H;
    float* o = rstd + H;
    float* y = o + H * dv;
    matmul_forward(proj, x, p->in_proj_w, NULL, 1, c->C, P);
    shortconv_decode_step(qkv, s->conv, proj, p->conv_w, D, W);
    gdn_token_features(qkv, qn, kn, beta, g, proj, p, c);
    gdn_core_recurrent(o, s->S, qkv, beta, g, 1, 1, H, c->dk, dv);
    gated_norm_row(y, rstd, o, proj + D, p->onorm_w, H, dv, c->onorm_eps);
    matmul_forward(out, y, p->out_proj_w, NULL, 1, H * dv, c->C);
}

// ----------------------------------------------------------------------------------------------------------
// the pdn / pgdn / pkda mixers (spec/pdn.md)

// ----------------------------------------------------------------------------------------------------------
// the pdn / pgdn / pkda mixer (spec/pdn.md)

// ----------------------------------------------------------------------------
// Preconditioned DeltaNet family, fp32, OpenMP. Math: spec/pdn.md ("spec"). Parameter layout: FORMATS.md.
// One code path for the three variants (variant 0 pdn, 1 pgdn, 2 pkda): the main decay g is kept as a
// dk-vector per head and token (pdn: 0; pgdn: the per-head scalar broadcast; pkda: per channel), spec 2.
// Layouts (row-major, last index fastest), with D = 2*H*dk + H*dv and
// P = D + 3H (pdn), D + 4H (pgdn), D + 3H + 2*dv (pkda):
//   proj [B,T,P]  in_proj output, blocks q | k | v | b | aP | bP, then pgdn: a (H), pkda: f1 (dv) | g1 (dv)
//   qkv  [B,T,D]  conv + SiLU output, blocks q | k | v, q and k l2-normalised (q unscaled; the core scales it)
//   beta, gP, bP [B,T,H]; g, A, m [B,T,H*dk]; o, y [B,T,H*dv]; state S [dk, dv] per head ("K-first", spec 0)
// The core is the sequential recurrence of spec 2.1 (no chunk form on CPU, spec 2.5), parallel over (b, head),
// with S checkpointed every `chunk` tokens; the backward recomputes each segment from its checkpoint (spec 2.2).

typedef struct {
    int C, H, dk, dv, W;   // model width, heads, key/query head dim, value head dim, conv taps
    int variant;           // 0: pdn (no main decay), 1: pgdn (scalar decay per head), 2: pkda (diagonal decay, gate)
    float x;               // squash range precond_x: m in (1/x, x)
    float precond_eps, onorm_eps, l2norm_eps;
    int chunk;             // checkpoint interval of the backward's recomputation
} PDNConfig;

// everything the backward needs, written by pdn_forward
typedef struct {
    float* proj;   // [B,T,P] in_proj output
    float* qkv;    // [B,T,D] q, k (l2-normalised), v after conv and SiLU
    float* qn;     // [B,T,H] sqrt(||q||^2 + l2norm_eps) of the un-normalised q
    float* kn;     // [B,T,H] same for k
    float* beta;   // [B,T,H] sigmoid(b)
    float* gP;     // [B,T,H] preconditioner log decay
    float* bP;     // [B,T,H] preconditioner gain sigmoid(bP)
    float* g;      // [B,T,H*dk] main log decay (pdn: 0)
    float* A;      // [B,T,H*dk] preconditioner state A_t
    float* m;      // [B,T,H*dk] multiplier m_t (k~ = m k)
    float* Sck;    // [B,H,NT,dk,dv] S at the start of each checkpoint segment
    float* S;      // [B,H,dk,dv] final state S_T
    float* Af;     // [B,H,dk] final preconditioner state A_T
    float* o;      // [B,T,H*dv] core output
    float* rstd;   // [B,T,H] output RMSNorm 1/rms
    float* y;      // [B,T,H*dv] output norm (and gate) = out_proj input
    float* f1;     // [B,T,dv] pkda: contiguous copy of the f1 block of proj (else NULL)
    float* g1;     // [B,T,dv] pkda: contiguous copy of the g1 block
    float* fpre;   // [B,T,H*dk] pkda: f = f1 @ f2^T
    float* gate;   // [B,T,H*dv] pkda: g1 @ g2^T + g2_b (pre-sigmoid)
    int nthr;      // threads the scratch was sized for (max_threads() at pdn_acts_point)
} PDNActs;

// decode state of one sequence (spec 4)
typedef struct {
    float* conv;   // [W-1, D] the last W-1 pre-conv inputs, oldest first (zeros at start)
    float* S;      // [H, dk, dv] recurrent state
    float* A;      // [H, dk] preconditioner state
} PDNState;

static inline int pdn_D(const PDNConfig* c) { return 2 * c->H * c->dk + c->H * c->dv; }
static inline int pdn_P(const PDNConfig* c) {
    return pdn_D(c) + 3 * c->H + (c->variant == 1 ? c->H : 0) + (c->variant == 2 ? 2 * c->dv : 0);
}
static inline int pdn_NT(int T, int CK) { return (T + CK - 1) / CK; }

// ----------------------------------------------------------------------------
// mixer core (spec 2.1-2.3): inputs qkv [B,T,D] (q unscaled), beta, gP, bP [B,T,H], g [B,T,H*dk],
// cs [H] (log_scale); qscale multiplies q (dk^-1/2 in the layer); lnx = ln(x).

// preconditioner step for one token of one head: A <- exp(gP) A + bP k^2, m = exp(-lnx softsign(log(A+eps) - c))
static inline void pdn_precond_step(float* A, float* m, const float* k, float gP, float bP, float cs,
                                    float lnx, float eps, int dk) {
    const float eg = expf(gP);
    for (int d = 0; d < dk; d++) {
        A[d] = eg * A[d] + bP * k[d] * k[d];
        const float r = logf(A[d] + eps) - cs;
        m[d] = expf(-lnx * (r / (1.0f + fabsf(r))));
    }
}

// main step for one token of one head: S' = exp(g) S_prev (rows), p = v - S'^T k, S = S' + (m k)(beta p)^T.
// S may alias S_prev. p [dv] receives the prediction error; ek [dk] is workspace.
static inline void pdn_delta_step(float* S, const float* S_prev, const float* k, const float* v, const float* g,
                                  const float* m, float beta, float* p, float* ek, int dk, int dv) {
    for (int d = 0; d < dk; d++) { ek[d] = expf(g[d]) * k[d]; }
    for (int j = 0; j < dv; j++) { p[j] = v[j]; }
    vec_vecmat(p, -1.0f, ek, S_prev, dv, dk, dv);
    for (int d = 0; d < dk; d++) {
        const float* sp = S_prev + (size_t)d * dv;
        float* s = S + (size_t)d * dv;
        const float al = expf(g[d]), bk = beta * m[d] * k[d];
        for (int j = 0; j < dv; j++) { s[j] = al * sp[j] + bk * p[j]; }
    }
}

// spec 2.1. S [B,H,dk,dv] and Ast [B,H,dk]: initial states in, final states out. Writes o [B,T,H*dv],
// A and m [B,T,H*dk], and (if Sck) the states S_{t0} at t0 = 0, CK, 2CK, ... into Sck [B,H,NT,dk,dv].
static void pdn_core_forward(float* o, float* A, float* m, float* Sck, float* S, float* Ast,
                             const float* qkv, const float* beta, const float* g, const float* gP, const float* bP,
                             const float* cs, int B, int T, int H, int dk, int dv, int CK,
                             float qscale, float lnx, float eps) {
    const int D = 2 * H * dk + H * dv, NT = pdn_NT(T, CK);
    const size_t dkdv = (size_t)dk * dv;
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, hh = bh % H;
        float* Sb = S + (size_t)bh * dkdv;
        float* Ab = Ast + (size_t)bh * dk;
        float ek[dk];
        for (int t = 0; t < T; t++) {
            const size_t r = (size_t)b * T + t, e = r * H + hh;
            if (Sck && t % CK == 0) { memcpy(Sck + ((size_t)bh * NT + t / CK) * dkdv, Sb, dkdv * sizeof(float)); }
            const float* q = qkv + r * D + hh * dk;
            const float* k = qkv + r * D + H * dk + hh * dk;
            const float* v = qkv + r * D + 2 * H * dk + hh * dv;
            float* At = A + e * dk;
            float* mt = m + e * dk;
            pdn_precond_step(Ab, mt, k, gP[e], bP[e], cs[hh], lnx, eps, dk);
            memcpy(At, Ab, (size_t)dk * sizeof(float));
            float* ot = o + e * dv;   // holds p_t until o_t is written
            pdn_delta_step(Sb, Sb, k, v, g + e * dk, mt, beta[e], ot, ek, dk, dv);
            for (int j = 0; j < dv; j++) { ot[j] = 0.0f; }
            vec_vecmat(ot, qscale, q, Sb, dv, dk, dv);
        }
    }
}

// per-thread scratch of pdn_core_backward: the CK+1 states of a segment, dL/dS, p [CK,dv], du, ek
static size_t pdn_core_bwd_floats(int CK, int dk, int dv) {
    return (size_t)(CK + 2) * dk * dv + (size_t)CK * dv + dv + dk;
}

// spec 2.2 + 2.3: exact reverse-time backward per (b, head), segment by segment from the last; each segment's
// states are recomputed from its checkpoint. The preconditioner backward (2.3) runs in the same reverse loop:
// token t's dk~_t is known once the main step is done, and the A carry runs backwards too.
// dO [B,T,H*dv]; dST [B,H,dk,dv], dAT [B,H,dk] (NULL: 0). Outputs (overwritten): dqkv [B,T,D] (w.r.t. the
// unscaled normalised q, k and v), dbeta, dgP, dbP [B,T,H], dg [B,T,H*dk], dcs [B*H] (per (b,h) partial of
// dL/dc), dS0 [B,H,dk,dv] and dA0 [B,H,dk] (NULL: not returned). scratch: nthr * pdn_core_bwd_floats.
static void pdn_core_backward(float* dqkv, float* dbeta, float* dg, float* dgP, float* dbP, float* dcs,
                              float* dS0, float* dA0, const float* dO, const float* dST, const float* dAT,
                              const float* Sck, const float* qkv, const float* beta, const float* g,
                              const float* gP, const float* bP, const float* A, const float* m, const float* cs,
                              int B, int T, int H, int dk, int dv, int CK, float qscale, float lnx, float eps,
                              float* scratch, int nthr) {
    const int D = 2 * H * dk + H * dv, NT = pdn_NT(T, CK);
    const size_t dkdv = (size_t)dk * dv;
    (void)nthr;   // read only by the OpenMP pragma
    #pragma omp parallel for num_threads(nthr) schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, hh = bh % H;
        float* Sbuf = scratch + (size_t)thread_id() * pdn_core_bwd_floats(CK, dk, dv);  // [CK+1,dk,dv]
        float* Dm = Sbuf + (size_t)(CK + 1) * dkdv;    // dL/dS_t
        float* pbuf = Dm + dkdv;                        // [CK,dv] prediction errors p_t of the segment
        float* du = pbuf + (size_t)CK * dv;             // [dv]
        float* ek = du + dv;                            // [dk]
        float carry[dk];                                // dL/dA_t flowing from later tokens
        float dc = 0.0f;
        if (dST) { memcpy(Dm, dST + bh * dkdv, dkdv * sizeof(float)); } else { memset(Dm, 0, dkdv * sizeof(float)); }
        for (int d = 0; d < dk; d++) { carry[d] = dAT ? dAT[(size_t)bh * dk + d] : 0.0f; }
        for (int n = NT - 1; n >= 0; n--) {
            const int t0 = n * CK;
            const int L = T - t0 < CK ? T - t0 : CK;
            const size_t r0 = (size_t)b * T + t0;
            memcpy(Sbuf, Sck + ((size_t)bh * NT + n) * dkdv, dkdv * sizeof(float));
            for (int i = 0; i < L; i++) {
                const size_t e = (r0 + i) * H + hh;
                pdn_delta_step(Sbuf + (i + 1) * dkdv, Sbuf + i * dkdv, qkv + (r0 + i) * D + H * dk + hh * dk,
                               qkv + (r0 + i) * D + 2 * H * dk + hh * dv, g + e * dk, m + e * dk, beta[e],
                               pbuf + (size_t)i * dv, ek, dk, dv);
            }
            for (int i = L - 1; i >= 0; i--) {
                const size_t r = r0 + i, e = r * H + hh;
                const float* q = qkv + r * D + hh * dk;
                const float* k = qkv + r * D + H * dk + hh * dk;
                const float* St = Sbuf + (i + 1) * dkdv;   // S_t
                const float* Sp = Sbuf + i * dkdv;         // S_{t-1}; S'_t = exp(g_t) S_{t-1}
                const float* pt = pbuf + (size_t)i * dv;
                const float* dOt = dO + e * dv;
                const float* gt = g + e * dk;
                const float* mt = m + e * dk;
                const float* At = A + e * dk;
                float* dq = dqkv + r * D + hh * dk;
                float* dk_ = dqkv + r * D + H * dk + hh * dk;
                float* dvv = dqkv + r * D + 2 * H * dk + hh * dv;
                float* dgt = dg + e * dk;
                const float bt = beta[e];
                // Dm += (s q) dO^T; dq = s S_t dO; dk~ = Dm u (u = beta p); du = Dm^T k~
                for (int j = 0; j < dv; j++) { du[j] = 0.0f; }
                for (int d = 0; d < dk; d++) {
                    float* Dd = Dm + d * dv;
                    vec_axpy(Dd, qscale * q[d], dOt, dv);
                    dq[d] = qscale * vec_dot(St + d * dv, dOt, dv);
                    vec_axpy(du, mt[d] * k[d], Dd, dv);
                    ek[d] = bt * vec_dot(Dd, pt, dv);   // dk~_d (ek reused as workspace)
                }
                // dbeta = du.p; dv = beta du (du <- beta du below)
                dbeta[e] = vec_dot(du, pt, dv);
                for (int j = 0; j < dv; j++) { du[j] *= bt; dvv[j] = du[j]; }
                // read path: dk = -S' (beta du); dS' = Dm - k (beta du)^T; dg = rowsum(S' * dS'); Dm <- exp(g) dS'
                for (int d = 0; d < dk; d++) {
                    float* Dd = Dm + d * dv;
                    const float al = expf(gt[d]);
                    dk_[d] = -al * vec_dot(Sp + d * dv, du, dv);
                    vec_axpy(Dd, -k[d], du, dv);
                    dgt[d] = al * vec_dot(Dd, Sp + d * dv, dv);
                    for (int j = 0; j < dv; j++) { Dd[j] *= al; }
                }
                // preconditioner (spec 2.3): write-key path, squash, log, then the A recurrence
                float sgP = 0.0f, sbP = 0.0f;
                const float bPt = bP[e], egP = expf(gP[e]);
                for (int d = 0; d < dk; d++) {
                    const float dkt = ek[d];
                    dk_[d] += dkt * mt[d];
                    const float ds = -lnx * mt[d] * (dkt * k[d]);
                    const float rr = logf(At[d] + eps) - cs[hh];
                    const float den = 1.0f + fabsf(rr);
                    const float dr = ds / (den * den);
                    dc -= dr;
                    const float dAtot = dr / (At[d] + eps) + carry[d];
                    const float kk = k[d] * k[d];
                    sgP += dAtot * (At[d] - bPt * kk);
                    sbP += dAtot * kk;
                    dk_[d] += 2.0f * bPt * k[d] * dAtot;
                    carry[d] = egP * dAtot;
                }
                dgP[e] = sgP;
                dbP[e] = sbP;
            }
        }
        dcs[bh] = dc;
        if (dS0) { memcpy(dS0 + bh * dkdv, Dm, dkdv * sizeof(float)); }
        if (dA0) { memcpy(dA0 + (size_t)bh * dk, carry, (size_t)dk * sizeof(float)); }
    }
}

// ----------------------------------------------------------------------------
// per-token pieces of the layer, shared by the forward, the backward and decode

// spec 1.1 steps 4-5 and 1.2 for one token, on the SiLU output qkv_row (modified in place): q, k <- l2n;
// beta = sigmoid(b); gP = -exp(A_log_P) softplus(aP + dt_bias_P); bP = sigmoid(bP);
// g [H*dk]: pdn 0, pgdn -exp(A_log) softplus(a + dt_bias) broadcast over dk, pkda from fpre_row [H*dk].
static void pdn_token_features(float* qkv_row, float* qn, float* kn, float* beta, float* gP, float* bP, float* g,
                               const float* proj_row, const float* fpre_row, const PDNParams* p, const PDNConfig* c) {
    const int H = c->H, dk = c->dk, D = pdn_D(c);
    const float* b_pre = proj_row + D;
    const float* aP_pre = b_pre + H;
    const float* bP_pre = aP_pre + H;
    const float* a_pre = bP_pre + H;   // pgdn
    for (int hh = 0; hh < H; hh++) {
        float* q = qkv_row + hh * dk;
        float* k = qkv_row + H * dk + hh * dk;
        qn[hh] = sqrtf(vec_dot(q, q, dk) + c->l2norm_eps);
        kn[hh] = sqrtf(vec_dot(k, k, dk) + c->l2norm_eps);
        const float qs = 1.0f / qn[hh], ks = 1.0f / kn[hh];
        for (int d = 0; d < dk; d++) { q[d] *= qs; k[d] *= ks; }
        beta[hh] = sigmoidf(b_pre[hh]);
        gP[hh] = -expf(p->A_log_P[hh]) * softplusf(aP_pre[hh] + p->dt_bias_P[hh]);
        bP[hh] = sigmoidf(bP_pre[hh]);
        float* gh = g + hh * dk;
        if (c->variant == 0) {
            for (int d = 0; d < dk; d++) { gh[d] = 0.0f; }
        } else if (c->variant == 1) {
            const float gs = -expf(p->A_log[hh]) * softplusf(a_pre[hh] + p->dt_bias[hh]);
            for (int d = 0; d < dk; d++) { gh[d] = gs; }
        } else {
            const float ea = -expf(p->A_log[hh]);
            for (int d = 0; d < dk; d++) { gh[d] = ea * softplusf(fpre_row[hh * dk + d] + p->dt_bias[hh * dk + d]); }
        }
    }
}

// spec 1.5 for one token: y = o * rstd * onorm_w (* sigmoid(gate) if gate), rstd = 1/sqrt(mean(o^2) + eps)
static void pdn_norm_row(float* y, float* rstd, const float* o, const float* gate, const float* w,
                         int H, int dv, float eps) {
    for (int hh = 0; hh < H; hh++) {
        const float* oh = o + hh * dv;
        const float rs = 1.0f / sqrtf(vec_dot(oh, oh, dv) / dv + eps);
        rstd[hh] = rs;
        for (int i = 0; i < dv; i++) {
            const float sg = gate ? sigmoidf(gate[hh * dv + i]) : 1.0f;
            y[hh * dv + i] = oh[i] * rs * w[i] * sg;
        }
    }
}

// pkda: copy the f1 | g1 blocks of proj rows into contiguous [N,dv] rows, then fpre = f1 f2^T, gate = g1 g2^T + b
static void pdn_lowrank_forward(float* f1, float* g1, float* fpre, float* gate, const float* proj, const PDNParams* p,
                                int N, const PDNConfig* c) {
    const int P = pdn_P(c), dv = c->dv, off = pdn_D(c) + 3 * c->H;
    for (int r = 0; r < N; r++) {
        memcpy(f1 + (size_t)r * dv, proj + (size_t)r * P + off, (size_t)dv * sizeof(float));
        memcpy(g1 + (size_t)r * dv, proj + (size_t)r * P + off + dv, (size_t)dv * sizeof(float));
    }
    matmul_forward(fpre, f1, p->f2_w, NULL, N, dv, c->H * c->dk);
    matmul_forward(gate, g1, p->g2_w, p->g2_b, N, dv, c->H * dv);
}

// ----------------------------------------------------------------------------
// layer forward / backward

static size_t pdn_acts_floats(int B, int T, const PDNConfig* c) {
    const size_t BT = (size_t)B * T, HK = (size_t)c->H * c->dk, HV = (size_t)c->H * c->dv;
    size_t n = BT * pdn_P(c) + BT * pdn_D(c) + 6 * BT * c->H + 3 * BT * HK
             + (size_t)B * c->H * pdn_NT(T, c->chunk) * c->dk * c->dv + (size_t)B * HK * c->dv + (size_t)B * HK
             + 2 * BT * HV;
    if (c->variant == 2) { n += 2 * BT * c->dv + BT * HK + BT * HV; }
    return n;
}

static void pdn_acts_point(PDNActs* a, float* base, int B, int T, const PDNConfig* c) {
    const size_t BT = (size_t)B * T, HK = (size_t)c->H * c->dk, HV = (size_t)c->H * c->dv;
    a->proj = base;   base += BT * pdn_P(c);
    a->qkv = base;    base += BT * pdn_D(c);
    a->qn = base;     base += BT * c->H;
    a->kn = base;     base += BT * c->H;
    a->beta = base;   base += BT * c->H;
    a->gP = base;     base += BT * c->H;
    a->bP = base;     base += BT * c->H;
    a->rstd = base;   base += BT * c->H;
    a->g = base;      base += BT * HK;
    a->A = base;      base += BT * HK;
    a->m = base;      base += BT * HK;
    a->Sck = base;    base += (size_t)B * c->H * pdn_NT(T, c->chunk) * c->dk * c->dv;
    a->S = base;      base += (size_t)B * HK * c->dv;
    a->Af = base;     base += (size_t)B * HK;
    a->o = base;      base += BT * HV;
    a->y = base;      base += BT * HV;
    a->f1 = a->g1 = a->fpre = a->gate = NULL;
    if (c->variant == 2) {
        a->f1 = base;   base += BT * c->dv;
        a->g1 = base;   base += BT * c->dv;
        a->fpre = base; base += BT * HK;
        a->gate = base;
    }
    a->nthr = max_threads();
}

// scratch of pdn_backward: dy/do [BT,HV], dqkv [BT,D], dbeta, dgP, dbP [BT,H], dg [BT,H*dk], dproj [BT,P],
// dc partials [B*H], pkda: dfpre [BT,H*dk], dgate [BT,HV], df1, dg1 [BT,dv]; core scratch.
// Sized for max_threads() at the time of the call (as PDNActs): do not raise the thread count later.
static size_t pdn_scratch_floats(int B, int T, const PDNConfig* c) {
    const size_t BT = (size_t)B * T, HK = (size_t)c->H * c->dk, HV = (size_t)c->H * c->dv;
    size_t n = BT * (HV + pdn_D(c) + 3 * c->H + HK + pdn_P(c)) + (size_t)B * c->H
             + (size_t)max_threads() * pdn_core_bwd_floats(c->chunk, c->dk, c->dv);
    if (c->variant == 2) { n += BT * (HK + HV + 2 * c->dv); }
    return n;
}

// spec 1.1-1.5. x [B,T,C] (the normed mixer input); out [B,T,C] overwritten. S_0 = 0, A_0 = 0;
// the final states are left in a->S, a->Af.
static void pdn_forward(float* out, PDNActs* a, const PDNParams* p, const float* x, int B, int T, const PDNConfig* c) {
    const int BT = B * T, C = c->C, H = c->H, dk = c->dk, dv = c->dv, D = pdn_D(c), P = pdn_P(c);
    matmul_forward(a->proj, x, p->in_proj_w, NULL, BT, C, P);
    if (c->variant == 2) { pdn_lowrank_forward(a->f1, a->g1, a->fpre, a->gate, a->proj, p, BT, c); }
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        float* row = a->qkv + (size_t)r * D;
        const float* prow = a->proj + (size_t)r * P;
        shortconv_row(row, prow, r % T, p->conv_w, D, P, c->W);
        for (int ch = 0; ch < D; ch++) { row[ch] *= sigmoidf(row[ch]); }
        const size_t e = (size_t)r * H;
        pdn_token_features(row, a->qn + e, a->kn + e, a->beta + e, a->gP + e, a->bP + e, a->g + e * dk, prow,
                           c->variant == 2 ? a->fpre + e * dk : NULL, p, c);
    }
    memset(a->S, 0, (size_t)B * H * dk * dv * sizeof(float));
    memset(a->Af, 0, (size_t)B * H * dk * sizeof(float));
    pdn_core_forward(a->o, a->A, a->m, a->Sck, a->S, a->Af, a->qkv, a->beta, a->g, a->gP, a->bP, p->log_scale,
                     B, T, H, dk, dv, c->chunk, 1.0f / sqrtf((float)dk), logf(c->x), c->precond_eps);
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        pdn_norm_row(a->y + (size_t)r * H * dv, a->rstd + (size_t)r * H, a->o + (size_t)r * H * dv,
                     c->variant == 2 ? a->gate + (size_t)r * H * dv : NULL, p->onorm_w, H, dv, c->onorm_eps);
    }
    matmul_forward(out, a->y, p->out_proj_w, NULL, BT, H * dv, C);
}

// spec 2.2-2.4. dout [B,T,C]; dx += dL/dx; grads += dL/dparams. Parameter-gradient sums run in a fixed
// order, so the result does not depend on the thread count.
static void pdn_backward(float* dx, PDNParams* grads, const float* dout, const PDNActs* a, const PDNParams* p,
                         const float* x, float* scratch, int B, int T, const PDNConfig* c) {
    const int BT = B * T, C = c->C, H = c->H, dk = c->dk, dv = c->dv, W = c->W;
    const int HV = H * dv, HK = H * dk, D = pdn_D(c), P = pdn_P(c), pk = c->variant == 2;
    float* dyo = scratch;                          // dL/dy, then dL/do in place
    float* dqkv = dyo + (size_t)BT * HV;           // dL/d(core q,k,v), then dL/d(conv pre-activation)
    float* dbeta = dqkv + (size_t)BT * D;
    float* dgP = dbeta + (size_t)BT * H;
    float* dbP = dgP + (size_t)BT * H;
    float* dg = dbP + (size_t)BT * H;              // [BT,HK]
    float* dproj = dg + (size_t)BT * HK;
    float* dcs = dproj + (size_t)BT * P;           // [B*H]
    float* core_scratch = dcs + (size_t)B * H;
    float *dfpre = NULL, *dgate = NULL, *df1 = NULL, *dg1 = NULL;
    if (pk) {
        dfpre = core_scratch;                      core_scratch += (size_t)BT * HK;
        dgate = core_scratch;                      core_scratch += (size_t)BT * HV;
        df1 = core_scratch;                        core_scratch += (size_t)BT * dv;
        dg1 = core_scratch;                        core_scratch += (size_t)BT * dv;
    }

    // out = y W_o^T
    memset(dyo, 0, (size_t)BT * HV * sizeof(float));
    matmul_backward(dyo, grads->out_proj_w, NULL, dout, a->y, p->out_proj_w, BT, HV, C);

    // output norm (spec 2.4), xh = o rstd, sg = sigmoid(gate) (1 ungated): e = dy w sg,
    // do = rstd (e - xh mean(xh e)), dw += dy xh sg (staged in dqkv, reduced below), dgate = dy xh w sg (1-sg)
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        for (int hh = 0; hh < H; hh++) {
            const size_t off = (size_t)r * HV + hh * dv;
            float* dy = dyo + off;
            float* tw = dqkv + off;
            const float* o = a->o + off;
            const float rs = a->rstd[(size_t)r * H + hh];
            float mm = 0.0f;
            for (int i = 0; i < dv; i++) {
                const float xh = o[i] * rs;
                const float sg = pk ? sigmoidf(a->gate[off + i]) : 1.0f;
                tw[i] = dy[i] * xh * sg;
                if (pk) { dgate[off + i] = dy[i] * xh * p->onorm_w[i] * sg * (1.0f - sg); }
                const float ei = dy[i] * p->onorm_w[i] * sg;
                dy[i] = ei;
                mm += ei * xh;
            }
            mm /= dv;
            for (int i = 0; i < dv; i++) { dy[i] = rs * (dy[i] - o[i] * rs * mm); }
        }
    }
    for (size_t e = 0; e < (size_t)BT * H; e++) {
        for (int i = 0; i < dv; i++) { grads->onorm_w[i] += dqkv[e * dv + i]; }
    }

    // the recurrence and the preconditioner (spec 2.2, 2.3), dS_T = 0, dA_T = 0
    pdn_core_backward(dqkv, dbeta, dg, dgP, dbP, dcs, NULL, NULL, dyo, NULL, NULL, a->Sck, a->qkv, a->beta, a->g,
                      a->gP, a->bP, a->A, a->m, p->log_scale, B, T, H, dk, dv, c->chunk, 1.0f / sqrtf((float)dk),
                      logf(c->x), c->precond_eps, core_scratch, a->nthr);

    // per token: l2n, sigmoid gains, softplus decays (spec 2.4); then SiLU'(conv pre-activation),
    // recomputed into dproj[r, 0:D) which the conv backward below overwrites
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const float* prow = a->proj + (size_t)r * P;
        const float* row = a->qkv + (size_t)r * D;
        float* drow = dqkv + (size_t)r * D;
        float* dprow = dproj + (size_t)r * P;
        for (int hh = 0; hh < H; hh++) {
            const size_t e = (size_t)r * H + hh;
            l2norm_backward(drow + hh * dk, row + hh * dk, a->qn[e], dk);
            l2norm_backward(drow + HK + hh * dk, row + HK + hh * dk, a->kn[e], dk);
            const float bt = a->beta[e], bp = a->bP[e];
            dprow[D + hh] = dbeta[e] * bt * (1.0f - bt);
            dprow[D + 2 * H + hh] = dbP[e] * bp * (1.0f - bp);
            const float uP = prow[D + H + hh] + p->dt_bias_P[hh];
            dprow[D + H + hh] = dgP[e] * -expf(p->A_log_P[hh]) * dsoftplusf(uP);
            if (c->variant == 1) {
                float dgs = 0.0f;
                for (int d = 0; d < dk; d++) { dgs += dg[e * dk + d]; }
                const float u = prow[D + 3 * H + hh] + p->dt_bias[hh];
                dprow[D + 3 * H + hh] = dgs * -expf(p->A_log[hh]) * dsoftplusf(u);
            } else if (pk) {
                const float ea = -expf(p->A_log[hh]);
                for (int d = 0; d < dk; d++) {
                    const int i = hh * dk + d;
                    dfpre[(size_t)r * HK + i] = dg[e * dk + d] * ea
                                              * dsoftplusf(a->fpre[(size_t)r * HK + i] + p->dt_bias[i]);
                }
            }
        }
        shortconv_silu_backward_row(drow, dprow, prow, r % T, p->conv_w, D, P, W);
    }
    // decay, gain and centre parameters, tokens in order
    for (size_t r = 0; r < (size_t)BT; r++) {
        for (int hh = 0; hh < H; hh++) {
            const size_t e = r * H + hh;
            grads->A_log_P[hh] += dgP[e] * a->gP[e];
            grads->dt_bias_P[hh] += dproj[r * P + D + H + hh];
            if (c->variant == 1) {
                float dgs = 0.0f;
                for (int d = 0; d < dk; d++) { dgs += dg[e * dk + d]; }
                grads->A_log[hh] += dgs * a->g[e * dk];
                grads->dt_bias[hh] += dproj[r * P + D + 3 * H + hh];
            } else if (pk) {
                float s = 0.0f;
                for (int d = 0; d < dk; d++) {
                    s += dg[e * dk + d] * a->g[e * dk + d];
                    grads->dt_bias[hh * dk + d] += dfpre[r * HK + hh * dk + d];
                }
                grads->A_log[hh] += s;
            }
        }
    }
    for (int bh = 0; bh < B * H; bh++) { grads->log_scale[bh % H] += dcs[bh]; }

    // pkda low-rank projections: f = f1 f2^T, gate = g1 g2^T + b; df1, dg1 go to the f1 | g1 blocks of dproj
    if (pk) {
        memset(df1, 0, (size_t)BT * dv * sizeof(float));
        memset(dg1, 0, (size_t)BT * dv * sizeof(float));
        matmul_backward(df1, grads->f2_w, NULL, dfpre, a->f1, p->f2_w, BT, dv, HK);
        matmul_backward(dg1, grads->g2_w, grads->g2_b, dgate, a->g1, p->g2_w, BT, dv, HV);
        const int off = D + 3 * H;
        for (int r = 0; r < BT; r++) {
            memcpy(dproj + (size_t)r * P + off, df1 + (size_t)r * dv, (size_t)dv * sizeof(float));
            memcpy(dproj + (size_t)r * P + off + dv, dg1 + (size_t)r * dv, (size_t)dv * sizeof(float));
        }
    }

    // conv backward (spec 1.6)
    shortconv_backward(dproj, grads->conv_w, dqkv, a->proj, p->conv_w, BT, T, D, P, W);

    // proj = x W_in^T
    matmul_backward(dx, grads->in_proj_w, NULL, dproj, x, p->in_proj_w, BT, C, P);
}

// ----------------------------------------------------------------------------
// decode (spec 4): one token of one sequence with the recurrent state carried in PDNState

static size_t pdn_state_floats(const PDNConfig* c) {
    return (size_t)(c->W - 1) * pdn_D(c) + (size_t)c->H * c->dk * c->dv + (size_t)c->H * c->dk;
}

static void pdn_state_point(PDNState* s, float* base, const PDNConfig* c) {
    s->conv = base;
    s->S = base + (size_t)(c->W - 1) * pdn_D(c);
    s->A = s->S + (size_t)c->H * c->dk * c->dv;
}

static void pdn_state_reset(PDNState* s, const PDNConfig* c) {
    memset(s->conv, 0, pdn_state_floats(c) * sizeof(float));   // conv cache, S and A are contiguous
}

// scratch of pdn_decode_step: proj [P], qkv [D], qn, kn, beta, gP, bP, rstd [H each], g, A, m [H*dk],
// o, y [H*dv], pkda: f1, g1 [dv], fpre [H*dk], gate [H*dv]
static size_t pdn_decode_scratch_floats(const PDNConfig* c) {
    const size_t HK = (size_t)c->H * c->dk, HV = (size_t)c->H * c->dv;
    return (size_t)pdn_P(c) + pdn_D(c) + 6 * c->H + 3 * HK + 2 * HV + (c->variant == 2 ? 2 * c->dv + HK + HV : 0);
}

static void pdn_decode_step(float* out, PDNState* s, const PDNParams* p, const float* x, float* scratch,
                            const PDNConfig* c) {
    const int H = c->H, dk = c->dk, dv = c->dv, W = c->W, D = pdn_D(c), P = pdn_P(c);
    const int HK = H * dk, HV = H * dv;
    float* proj = scratch;
    float* qkv = proj + P;
    float* qn = qkv + D;
    float* kn = qn + H;
    float* beta = kn + H;
    float* gP = beta + H;
    float* bP = gP + H;
    float* rstd = bP + H;
    float* g = rstd + H;
    float* A = g + HK;
    float* m = A + HK;
    float* o = m + HK;
    float* y = o + HV;
    float *f1 = NULL, *g1 = NULL, *fpre = NULL, *gate = NULL;
    if (c->variant == 2) { f1 = y + HV; g1 = f1 + dv; fpre = g1 + dv; gate = fpre + HK; }
    matmul_forward(proj, x, p->in_proj_w, NULL, 1, c->C, P);
    if (c->variant == 2) { pdn_lowrank_forward(f1, g1, fpre, gate, proj, p, 1, c); }
    shortconv_decode_step(qkv, s->conv, proj, p->conv_w, D, W);
    pdn_token_features(qkv, qn, kn, beta, gP, bP, g, proj, fpre, p, c);
    pdn_core_forward(o, A, m, NULL, s->S, s->A, qkv, beta, g, gP, bP, p->log_scale, 1, 1, H, dk, dv, 1,
                     1.0f / sqrtf((float)dk), logf(c->x), c->precond_eps);
    pdn_norm_row(y, rstd, o, gate, p->onorm_w, H, dv, c->onorm_eps);
    matmul_forward(out, y, p->out_proj_w, NULL, 1, HV, c->C);
}

// ----------------------------------------------------------------------------------------------------------
// the gka mixer (spec/gka.md)

// ----------------------------------------------------------------------------
// Gated KalmaNet, fp32, OpenMP. Math: spec/gka.md ("spec") sections 2.3, 3, 3.1-3.3, 7. Layout: FORMATS.md.
// Per head, H_t = gamma_t H_{t-1} + k k^T (dk x dk), U_t = gamma_t U_{t-1} + k v^T (dk x dv), f_t = ||H_t||_F,
// x_t = CHEB(H_t, f_t, q_hat_t) ~ (H_t + a f_t I)^-1 q_hat_t (r Chebyshev iterations, spec 3.1, omega_0 = 2),
// o_t = s U_t^T (q_hat + alpha (x - q_hat)), s = dk^-1/2. Backward: implicit differentiation (spec 3.2), i.e.
// one adjoint CHEB solve per token, with the bp_lambda term w_t; not autograd through the iterations.
// GQA (spec 2.3 step 3, 2.4): H query heads, Hkv key/value heads (Hkv divides H, G = H/Hkv); the conv runs on
// the un-expanded channels, then k and v are repeated to H heads, expanded head e reading source head e / G
// (consecutive expanded heads share a source head); everything after that is per expanded head. The backward sums
// the gradients of the G copies into their source head. Hkv = H is the plain layer (G = 1, no copies).
// Layouts (row-major, last index fastest), with D = H*dk + Hkv*dk + Hkv*dv (conv channels, un-expanded),
// DE = 2*H*dk + H*dv (core inputs, expanded) and P = D + H*dv + 3*H:
//   proj [B,T,P]  in_proj output, blocks q | k | v | gate | a | b | alpha (the first D channels go through the conv)
//   qkv  [B,T,DE] core inputs, blocks q | k | v at H heads each: q_hat = q/(||q|| + 1e-6),
//                 k = (beta + 1e-6) k/(||k|| + 1e-6), v = (beta + 1e-6) v (k, v of the source head)
//   qn, kn, beta, alpha, g, f [B,T,H]; x [B,T,H*dk]; o, y [B,T,H*dv]; states H [dk,dk], U [dk,dv] per head
// The core is the sequential recurrence of spec 3 (no chunk form on CPU), parallel over (b, head), with H and U
// checkpointed every `chunk` tokens; the backward recomputes each segment's states from its checkpoint (spec 3.2).

#define GKA_L2_EPS 1e-6f     // q/k L2 norm: eps added to the norm (spec 2.1)
#define GKA_BETA_EPS 1e-6f   // added to the beta gate (spec 2.3 step 5)

typedef struct {
    int C, H, dk, dv, W;     // model width, heads, key/query head dim, value head dim, conv taps
    int Hkv;                 // key/value heads (header slot 33): divides H; Hkv = H without GQA
    int iters;               // r, Chebyshev iterations (header slot 26)
    float ridge, onorm_eps;  // a in lambda = a ||H||_F (slot 27); output RMSNorm eps (slot 28)
    int chunk;               // state checkpoint interval of the backward's recomputation
} GKAConfig;

// everything the backward needs, written by gka_forward
typedef struct {
    float* proj;   // [B,T,P] in_proj output
    float* qkv;    // [B,T,DE] core inputs q_hat, k (beta-scaled), v (beta-scaled), expanded to H heads
    float* qn;     // [B,T,H] ||q|| of the conv output (before the + 1e-6)
    float* kn;     // [B,T,H] ||k|| likewise (per expanded head: the G copies of a source head hold the same value)
    float* beta;   // [B,T,H] sigmoid(b + b_bias)
    float* alpha;  // [B,T,H] sigmoid(alpha + alpha_bias)
    float* g;      // [B,T,H] log decay
    float* f;      // [B,T,H] ||H_t||_F
    float* x;      // [B,T,H*dk] CHEB solutions x_t
    float* Hck;    // [B,H,NT,dk,dk] H at the start of each checkpoint segment
    float* Uck;    // [B,H,NT,dk,dv] U likewise
    float* Hf;     // [B,H,dk,dk] final state H_T
    float* Uf;     // [B,H,dk,dv] final state U_T
    float* o;      // [B,T,H*dv] core output
    float* rstd;   // [B,T,H] gated RMSNorm 1/rms
    float* y;      // [B,T,H*dv] gated RMSNorm output = out_proj input
    int nthr;      // threads the scratch was sized for (max_threads() at gka_acts_point)
} GKAActs;

// decode state of one sequence (spec 7)
typedef struct {
    float* conv;   // [W-1, D] the last W-1 pre-conv inputs (un-expanded), oldest first (zeros at start)
    float* H;      // [H, dk, dk]
    float* U;      // [H, dk, dv]
} GKAState;

static inline int gka_D(const GKAConfig* c) { return c->H * c->dk + c->Hkv * (c->dk + c->dv); }   // conv channels
static inline int gka_DE(const GKAConfig* c) { return 2 * c->H * c->dk + c->H * c->dv; }           // core inputs
static inline int gka_P(const GKAConfig* c) { return gka_D(c) + c->H * c->dv + 3 * c->H; }
static inline int gka_G(const GKAConfig* c) { return c->H / c->Hkv; }                            // GQA group
static inline int gka_NT(int T, int CK) { return (T + CK - 1) / CK; }

// ----------------------------------------------------------------------------
// mixer core

// spec 3.1: omega_1..omega_r (omega_0 = 2, rho = 1/(1 + 2a)), the same for every token and head, in double
static void gka_omegas(double* om, int r, double a) {
    const double rho = 1.0 / (1.0 + 2.0 * a), rho4 = rho * rho / 4.0;
    double w = 2.0;
    for (int i = 0; i < r; i++) { w = 1.0 / (1.0 - rho4 * w); om[i] = w; }
}

// spec 3.1: x = CHEB(Hm, f, b) ~ (Hm + a f I)^-1 b for one token of one head (Hm symmetric dk x dk).
// x_prev = 0, x = tau b; r times: x <- omega x - tau omega (Hm x + a f x - b) - (omega - 1) x_prev.
// xp, Ax [dk] workspace. f = 0 (all keys zero, H = 0; then U = 0 too) gives x = 0 instead of 0/0.
static void gka_cheb(float* x, float* xp, float* Ax, const float* Hm, const float* b, float f, const double* om,
                     int r, float a, int dk) {
    if (!(f > 0.0f)) {
        for (int i = 0; i < dk; i++) { x[i] = 0.0f; }
        return;
    }
    const double tau = 2.0 / ((double)f * (1.0 + 2.0 * (double)a));
    const float lam = a * f;
    for (int i = 0; i < dk; i++) { xp[i] = 0.0f; x[i] = (float)tau * b[i]; }
    for (int it = 0; it < r; it++) {
        const float c1 = (float)(tau * om[it]), c2 = (float)om[it], c3 = (float)(om[it] - 1.0);
        // Ax = Hm x (rows of the symmetric Hm summed as x^T Hm)
        for (int i = 0; i < dk; i++) { Ax[i] = 0.0f; }
        vec_vecmat(Ax, 1.0f, x, Hm, dk, dk, dk);
        for (int i = 0; i < dk; i++) {
            const float xn = c2 * x[i] - c1 * (Ax[i] + lam * x[i] - b[i]) - c3 * xp[i];
            xp[i] = x[i];
            x[i] = xn;
        }
    }
}

// one token of one head: H <- gamma H + k k^T, U <- gamma U + k v^T (in place); returns ||H||_F
static float gka_state_step(float* Hm, float* Um, const float* k, const float* v, float gamma, int dk, int dv) {
    double ff = 0.0;
    for (int i = 0; i < dk; i++) {
        float* h = Hm + (size_t)i * dk;
        float* u = Um + (size_t)i * dv;
        const float ki = k[i];
        for (int j = 0; j < dk; j++) { h[j] = gamma * h[j] + ki * k[j]; }
        for (int j = 0; j < dv; j++) { u[j] = gamma * u[j] + ki * v[j]; }
        ff += (double)vec_dot(h, h, dk);
    }
    return (float)sqrt(ff);
}

// spec 3. Hs [B,H,dk,dk], Us [B,H,dk,dv]: initial states in, final states out. Writes o [B,T,H*dv],
// x [B,T,H*dk], f [B,T,H] and (if Hck) the states at t0 = 0, CK, 2CK, ... into Hck, Uck [B,H,NT,...].
static void gka_core_forward(float* o, float* x, float* f, float* Hck, float* Uck, float* Hs, float* Us,
                             const float* qkv, const float* alpha, const float* g, int B, int T, int H, int dk, int dv,
                             int CK, int iters, float ridge) {
    const int D = 2 * H * dk + H * dv, NT = gka_NT(T, CK);   // D: the expanded core-input width (DE)
    const size_t dkdk = (size_t)dk * dk, dkdv = (size_t)dk * dv;
    const float s = 1.0f / sqrtf((float)dk);
    double om[iters + 1];
    gka_omegas(om, iters, ridge);
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, hh = bh % H;
        float* Hb = Hs + (size_t)bh * dkdk;
        float* Ub = Us + (size_t)bh * dkdv;
        float xp[dk], Ax[dk], qt[dk];
        for (int t = 0; t < T; t++) {
            const size_t r = (size_t)b * T + t, e = r * H + hh;
            if (Hck && t % CK == 0) {
                memcpy(Hck + ((size_t)bh * NT + t / CK) * dkdk, Hb, dkdk * sizeof(float));
                memcpy(Uck + ((size_t)bh * NT + t / CK) * dkdv, Ub, dkdv * sizeof(float));
            }
            const float* q = qkv + r * D + hh * dk;
            const float* k = qkv + r * D + H * dk + hh * dk;
            const float* v = qkv + r * D + 2 * H * dk + hh * dv;
            float* xt = x + e * dk;
            f[e] = gka_state_step(Hb, Ub, k, v, expf(g[e]), dk, dv);
            gka_cheb(xt, xp, Ax, Hb, q, f[e], om, iters, ridge, dk);
            const float al = alpha[e];
            for (int i = 0; i < dk; i++) { qt[i] = q[i] + al * (xt[i] - q[i]); }
            float* ot = o + e * dv;
            for (int j = 0; j < dv; j++) { ot[j] = 0.0f; }
            vec_vecmat(ot, s, qt, Ub, dv, dk, dv);
        }
    }
}

// per-thread scratch of gka_core_backward: the CK+1 states H, U of a segment, DH, DU, 7 vectors of dk
static size_t gka_core_bwd_floats(int CK, int dk, int dv) {
    return (size_t)(CK + 2) * ((size_t)dk * dk + (size_t)dk * dv) + 7 * (size_t)dk;
}

// spec 3.2: implicit-differentiation backward per (b, head), segment by segment from the last; each segment's
// states are recomputed forward from its checkpoint (never H_{t-1} = (H_t - k k^T)/gamma).
// dO [B,T,H*dv] = dL/do; dHT, dUT [B,H,...] = dL/d(final states) (NULL: 0). Outputs (overwritten): dqkv [B,T,D]
// (w.r.t. q_hat, the scaled k and the scaled v), dalpha, dg [B,T,H], dH0, dU0 [B,H,...] (NULL: not returned).
// scratch: nthr * gka_core_bwd_floats(CK, dk, dv) floats.
static void gka_core_backward(float* dqkv, float* dalpha, float* dg, float* dH0, float* dU0,
                              const float* dO, const float* dHT, const float* dUT, const float* Hck, const float* Uck,
                              const float* qkv, const float* alpha, const float* g, const float* x, const float* f,
                              int B, int T, int H, int dk, int dv, int CK, int iters, float ridge,
                              float* scratch, int nthr) {
    const int D = 2 * H * dk + H * dv, NT = gka_NT(T, CK);   // D: the expanded core-input width (DE)
    const size_t dkdk = (size_t)dk * dk, dkdv = (size_t)dk * dv;
    const float s = 1.0f / sqrtf((float)dk);
    double om[iters + 1];
    gka_omegas(om, iters, ridge);
    (void)nthr;   // read only by the OpenMP pragma
    #pragma omp parallel for num_threads(nthr) schedule(static)
    for (int bh = 0; bh < B * H; bh++) {
        const int b = bh / H, hh = bh % H;
        float* Hbuf = scratch + (size_t)thread_id() * gka_core_bwd_floats(CK, dk, dv);  // [CK+1,dk,dk]
        float* Ubuf = Hbuf + (size_t)(CK + 1) * dkdk;   // [CK+1,dk,dv]
        float* DH = Ubuf + (size_t)(CK + 1) * dkdv;     // dL/dH_t
        float* DU = DH + dkdk;                          // dL/dU_t
        float* qt = DU + dkdv;
        float* dqt = qt + dk;
        float* dxv = dqt + dk;
        float* z = dxv + dk;
        float* xp = z + dk;
        float* Ax = xp + dk;
        float* kcol = Ax + dk;                          // DH^T k
        if (dHT) { memcpy(DH, dHT + bh * dkdk, dkdk * sizeof(float)); } else { memset(DH, 0, dkdk * sizeof(float)); }
        if (dUT) { memcpy(DU, dUT + bh * dkdv, dkdv * sizeof(float)); } else { memset(DU, 0, dkdv * sizeof(float)); }
        for (int n = NT - 1; n >= 0; n--) {
            const int t0 = n * CK;
            const int L = T - t0 < CK ? T - t0 : CK;
            const size_t r0 = (size_t)b * T + t0;
            memcpy(Hbuf, Hck + ((size_t)bh * NT + n) * dkdk, dkdk * sizeof(float));
            memcpy(Ubuf, Uck + ((size_t)bh * NT + n) * dkdv, dkdv * sizeof(float));
            for (int i = 0; i < L; i++) {
                const size_t r = r0 + i, e = r * H + hh;
                memcpy(Hbuf + (i + 1) * dkdk, Hbuf + i * dkdk, dkdk * sizeof(float));
                memcpy(Ubuf + (i + 1) * dkdv, Ubuf + i * dkdv, dkdv * sizeof(float));
                gka_state_step(Hbuf + (i + 1) * dkdk, Ubuf + (i + 1) * dkdv, qkv + r * D + H * dk + hh * dk,
                               qkv + r * D + 2 * H * dk + hh * dv, expf(g[e]), dk, dv);
            }
            for (int i = L - 1; i >= 0; i--) {
                const size_t r = r0 + i, e = r * H + hh;
                const float* q = qkv + r * D + hh * dk;
                const float* k = qkv + r * D + H * dk + hh * dk;
                const float* v = qkv + r * D + 2 * H * dk + hh * dv;
                const float* Ht = Hbuf + (i + 1) * dkdk;
                const float* Hp = Hbuf + i * dkdk;
                const float* Ut = Ubuf + (i + 1) * dkdv;
                const float* Up = Ubuf + i * dkdv;
                const float* xt = x + e * dk;
                const float* dOt = dO + e * dv;
                float* dq = dqkv + r * D + hh * dk;
                float* dkk = dqkv + r * D + H * dk + hh * dk;
                float* dvv = dqkv + r * D + 2 * H * dk + hh * dv;
                const float al = alpha[e], ft = f[e], gam = expf(g[e]);
                // readout: dqt = s U_t dO; DU += s qt dO^T; dalpha = dqt.(x - q_hat); dx = alpha dqt
                float da = 0.0f;
                for (int d = 0; d < dk; d++) {
                    qt[d] = q[d] + al * (xt[d] - q[d]);
                    dqt[d] = s * vec_dot(Ut + (size_t)d * dv, dOt, dv);
                    vec_axpy(DU + (size_t)d * dv, s * qt[d], dOt, dv);
                    da += dqt[d] * (xt[d] - q[d]);
                    dxv[d] = al * dqt[d];
                }
                dalpha[e] = da;
                // adjoint solve z = CHEB(H_t, f_t, dx); dq_hat = (1 - alpha) dqt + z; w = 2a (x.z)/f
                gka_cheb(z, xp, Ax, Ht, dxv, ft, om, iters, ridge, dk);
                for (int d = 0; d < dk; d++) { dq[d] = (1.0f - al) * dqt[d] + z[d]; }
                const float w = ft > 0.0f ? 2.0f * ridge * vec_dot(xt, z, dk) / ft : 0.0f;
                // DH -= z x^T + (w/2) H_t; dk = (DH + DH^T) k + DU v; dv = DU^T k;
                // dg = gamma (<DH, H_{t-1}> + <DU, U_{t-1}>); DH, DU <- gamma DH, gamma DU
                for (int d = 0; d < dk; d++) { kcol[d] = 0.0f; }
                for (int j = 0; j < dv; j++) { dvv[j] = 0.0f; }
                double dgs = 0.0;
                for (int d = 0; d < dk; d++) {
                    float* Dd = DH + (size_t)d * dk;
                    const float* Hd = Ht + (size_t)d * dk;
                    const float zd = z[d], hw = 0.5f * w;
                    for (int j = 0; j < dk; j++) { Dd[j] -= zd * xt[j] + hw * Hd[j]; }
                    float* DUd = DU + (size_t)d * dv;
                    dkk[d] = vec_dot(Dd, k, dk) + vec_dot(DUd, v, dv);
                    vec_axpy(kcol, k[d], Dd, dk);
                    vec_axpy(dvv, k[d], DUd, dv);
                    dgs += (double)vec_dot(Dd, Hp + (size_t)d * dk, dk) + (double)vec_dot(DUd, Up + (size_t)d * dv, dv);
                    for (int j = 0; j < dk; j++) { Dd[j] *= gam; }
                    for (int j = 0; j < dv; j++) { DUd[j] *= gam; }
                }
                for (int d = 0; d < dk; d++) { dkk[d] += kcol[d]; }
                dg[e] = gam * (float)dgs;
            }
        }
        if (dH0) { memcpy(dH0 + bh * dkdk, DH, dkdk * sizeof(float)); }
        if (dU0) { memcpy(dU0 + bh * dkdv, DU, dkdv * sizeof(float)); }
    }
}

// ----------------------------------------------------------------------------
// per-token pieces of the layer, shared by the forward, the backward and decode

// spec 2.3 step 3 (GQA expand) for one token: u [D] (SiLU output, un-expanded) -> row [DE], expanded head e of
// k and v copying source head e / G
static void gka_expand_row(float* row, const float* u, const GKAConfig* c) {
    const int H = c->H, Hkv = c->Hkv, dk = c->dk, dv = c->dv, G = gka_G(c);
    memcpy(row, u, (size_t)H * dk * sizeof(float));
    for (int e = 0; e < H; e++) {
        memcpy(row + H * dk + e * dk, u + H * dk + (e / G) * dk, (size_t)dk * sizeof(float));
        memcpy(row + 2 * H * dk + e * dv, u + H * dk + Hkv * dk + (e / G) * dv, (size_t)dv * sizeof(float));
    }
}

// the backward of gka_expand_row (spec 3.3 "GQA expand"): drow [DE] -> du [D], the G copies of each source head
// of k and v summed in head order
static void gka_reduce_row(float* du, const float* drow, const GKAConfig* c) {
    const int H = c->H, Hkv = c->Hkv, dk = c->dk, dv = c->dv, G = gka_G(c);
    memcpy(du, drow, (size_t)H * dk * sizeof(float));
    for (int j = 0; j < Hkv; j++) {
        float* dks = du + H * dk + j * dk;
        float* dvs = du + H * dk + Hkv * dk + j * dv;
        memcpy(dks, drow + H * dk + (j * G) * dk, (size_t)dk * sizeof(float));
        memcpy(dvs, drow + 2 * H * dk + (j * G) * dv, (size_t)dv * sizeof(float));
        for (int m = 1; m < G; m++) {
            const float* dke = drow + H * dk + (j * G + m) * dk;
            const float* dve = drow + 2 * H * dk + (j * G + m) * dv;
            for (int d = 0; d < dk; d++) { dks[d] += dke[d]; }
            for (int d = 0; d < dv; d++) { dvs[d] += dve[d]; }
        }
    }
}

// spec 2.3 steps 4-7 for one token, on the SiLU output qkv_row (modified in place): q_hat = q/(||q|| + 1e-6),
// k_hat likewise; beta = sigmoid(b + b_bias), k = (beta + 1e-6) k_hat, v = (beta + 1e-6) v;
// alpha = sigmoid(alpha + alpha_bias); g = -exp(A_log) softplus(a + dt_bias). Writes qn, kn, beta, alpha, g [H].
static void gka_token_features(float* qkv_row, float* qn, float* kn, float* beta, float* alpha, float* g,
                               const float* proj_row, const GKAParams* p, const GKAConfig* c) {
    const int H = c->H, dk = c->dk, dv = c->dv, D = gka_D(c);
    const float* a_pre = proj_row + D + H * dv;   // a block (after gate)
    const float* b_pre = a_pre + H;               // b block
    const float* al_pre = b_pre + H;              // alpha block
    for (int hh = 0; hh < H; hh++) {
        float* q = qkv_row + hh * dk;
        float* k = qkv_row + H * dk + hh * dk;
        float* v = qkv_row + 2 * H * dk + hh * dv;
        qn[hh] = sqrtf(vec_dot(q, q, dk));
        kn[hh] = sqrtf(vec_dot(k, k, dk));
        beta[hh] = sigmoidf(b_pre[hh] + p->b_bias[hh]);
        const float qs = 1.0f / (qn[hh] + GKA_L2_EPS), bs = beta[hh] + GKA_BETA_EPS;
        const float ks = bs / (kn[hh] + GKA_L2_EPS);
        for (int d = 0; d < dk; d++) { q[d] *= qs; k[d] *= ks; }
        for (int d = 0; d < dv; d++) { v[d] *= bs; }
        alpha[hh] = sigmoidf(al_pre[hh] + p->alpha_bias[hh]);
        g[hh] = -expf(p->A_log[hh]) * softplusf(a_pre[hh] + p->dt_bias[hh]);
    }
}

// ----------------------------------------------------------------------------
// layer forward / backward

static size_t gka_acts_floats(int B, int T, const GKAConfig* c) {
    const size_t BT = (size_t)B * T, HK = (size_t)c->H * c->dk, HV = (size_t)c->H * c->dv;
    const size_t st = (size_t)c->dk * c->dk + (size_t)c->dk * c->dv;
    return BT * gka_P(c) + BT * gka_DE(c) + 7 * BT * c->H + BT * HK
         + (size_t)B * c->H * (gka_NT(T, c->chunk) + 1) * st + 2 * BT * HV;
}

static void gka_acts_point(GKAActs* a, float* base, int B, int T, const GKAConfig* c) {
    const size_t BT = (size_t)B * T, HK = (size_t)c->H * c->dk, HV = (size_t)c->H * c->dv;
    const size_t NS = (size_t)B * c->H * gka_NT(T, c->chunk);
    a->proj = base;   base += BT * gka_P(c);
    a->qkv = base;    base += BT * gka_DE(c);
    a->qn = base;     base += BT * c->H;
    a->kn = base;     base += BT * c->H;
    a->beta = base;   base += BT * c->H;
    a->alpha = base;  base += BT * c->H;
    a->g = base;      base += BT * c->H;
    a->f = base;      base += BT * c->H;
    a->rstd = base;   base += BT * c->H;
    a->x = base;      base += BT * HK;
    a->Hck = base;    base += NS * c->dk * c->dk;
    a->Uck = base;    base += NS * c->dk * c->dv;
    a->Hf = base;     base += (size_t)B * HK * c->dk;
    a->Uf = base;     base += (size_t)B * HK * c->dv;
    a->o = base;      base += BT * HV;
    a->y = base;
    a->nthr = max_threads();
}

// scratch of gka_backward: dy/do [BT,HV], dqkv [BT,DE], dalpha, dg [BT,H], dproj [BT,P], with GQA du [BT,D],
// core scratch. Sized for max_threads() at the time of the call (as GKAActs): do not raise the thread count later.
static size_t gka_scratch_floats(int B, int T, const GKAConfig* c) {
    const size_t BT = (size_t)B * T;
    return BT * ((size_t)c->H * c->dv + gka_DE(c) + 2 * c->H + gka_P(c) + (gka_G(c) > 1 ? gka_D(c) : 0))
         + (size_t)max_threads() * gka_core_bwd_floats(c->chunk, c->dk, c->dv);
}

// spec 2.3. x [B,T,C] (the normed mixer input); out [B,T,C] overwritten. H_0 = U_0 = 0; the final states are
// left in a->Hf, a->Uf.
static void gka_forward(float* out, GKAActs* a, const GKAParams* p, const float* x, int B, int T, const GKAConfig* c) {
    const int BT = B * T, C = c->C, H = c->H, dk = c->dk, dv = c->dv, D = gka_D(c), DE = gka_DE(c), P = gka_P(c);
    const int G = gka_G(c);
    // step 1: fused projection, blocks q | k | v | gate | a | b | alpha
    matmul_forward(a->proj, x, p->in_proj_w, NULL, BT, C, P);
    // steps 2-7: conv + SiLU on the D un-expanded channels, GQA expand, L2 norms, beta, alpha, g
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        float* row = a->qkv + (size_t)r * DE;
        const float* prow = a->proj + (size_t)r * P;
        if (G == 1) {   // D == DE: no copies
            shortconv_row(row, prow, r % T, p->conv_w, D, P, c->W);
            for (int ch = 0; ch < D; ch++) { row[ch] *= sigmoidf(row[ch]); }
        } else {
            float u[D];
            shortconv_row(u, prow, r % T, p->conv_w, D, P, c->W);
            for (int ch = 0; ch < D; ch++) { u[ch] *= sigmoidf(u[ch]); }
            gka_expand_row(row, u, c);
        }
        const size_t e = (size_t)r * H;
        gka_token_features(row, a->qn + e, a->kn + e, a->beta + e, a->alpha + e, a->g + e, prow, p, c);
    }
    // step 8: the core (spec 3), H_0 = U_0 = 0
    memset(a->Hf, 0, (size_t)B * H * dk * dk * sizeof(float));
    memset(a->Uf, 0, (size_t)B * H * dk * dv * sizeof(float));
    gka_core_forward(a->o, a->x, a->f, a->Hck, a->Uck, a->Hf, a->Uf, a->qkv, a->alpha, a->g, B, T, H, dk, dv,
                     c->chunk, c->iters, c->ridge);
    // steps 9-10: gated RMSNorm (swish gate, same form as gdn's), output projection
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        gated_norm_row(a->y + (size_t)r * H * dv, a->rstd + (size_t)r * H, a->o + (size_t)r * H * dv,
                           a->proj + (size_t)r * P + D, p->onorm_w, H, dv, c->onorm_eps);
    }
    matmul_forward(out, a->y, p->out_proj_w, NULL, BT, H * dv, C);
}

// spec 3.2-3.3. dout [B,T,C]; dx += dL/dx; grads += dL/dparams. Parameter-gradient sums run in a fixed order,
// so the result does not depend on the thread count.
static void gka_backward(float* dx, GKAParams* grads, const float* dout, const GKAActs* a, const GKAParams* p,
                         const float* x, float* scratch, int B, int T, const GKAConfig* c) {
    const int BT = B * T, C = c->C, H = c->H, dk = c->dk, dv = c->dv, W = c->W;
    const int HV = H * dv, HK = H * dk, D = gka_D(c), DE = gka_DE(c), P = gka_P(c), G = gka_G(c);
    float* dyo = scratch;                          // dL/dy, then dL/do in place
    float* dqkv = dyo + (size_t)BT * HV;           // [BT,DE] dL/d(core q_hat, k, v) (G = 1: then as du)
    float* dalpha = dqkv + (size_t)BT * DE;
    float* dg = dalpha + (size_t)BT * H;
    float* dproj = dg + (size_t)BT * H;            // dL/dproj
    float* du = G > 1 ? dproj + (size_t)BT * P : dqkv;   // [BT,D] dL/d(conv output), then d(pre-activation)
    float* core_scratch = dproj + (size_t)BT * P + (G > 1 ? (size_t)BT * D : 0);

    // out = y W_o^T
    memset(dyo, 0, (size_t)BT * HV * sizeof(float));
    matmul_backward(dyo, grads->out_proj_w, NULL, dout, a->y, p->out_proj_w, BT, HV, C);

    // gated RMSNorm (spec 3.3), the same as gdn's
    gated_norm_backward(dyo, dproj, grads->onorm_w, dqkv, a->o, a->proj, a->rstd, p->onorm_w, BT, H, dv, P, D);

    // the core (spec 3.2), final-state gradients 0
    gka_core_backward(dqkv, dalpha, dg, NULL, NULL, dyo, NULL, NULL, a->Hck, a->Uck, a->qkv, a->alpha, a->g, a->x,
                      a->f, B, T, H, dk, dv, c->chunk, c->iters, c->ridge, core_scratch, a->nthr);

    // per token (spec 3.3): beta gate, L2 norms, sigmoid gates, softplus decay (per expanded head: the L2-norm
    // backward is linear in dy and y = k_hat is the same for all G copies of a source head, so summing the copies'
    // dk after it equals backpropagating the summed d(k_hat) once); the GQA reduce; then SiLU'(conv
    // pre-activation), recomputed into dproj[r, 0:D) which the conv backward below overwrites
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const float* prow = a->proj + (size_t)r * P;
        const float* row = a->qkv + (size_t)r * DE;
        float* drow = dqkv + (size_t)r * DE;
        float* dprow = dproj + (size_t)r * P;
        for (int hh = 0; hh < H; hh++) {
            const size_t e = (size_t)r * H + hh;
            const float bt = a->beta[e], bs = bt + GKA_BETA_EPS;
            // L2 norm y = u/(n + eps): du = dy/(n + eps) - y (y.dy)/n
            const float* qh = row + hh * dk;
            float* dq = drow + hh * dk;
            const float nq = a->qn[e], cq = vec_dot(qh, dq, dk);
            const float cq2 = nq > 0.0f ? cq / nq : 0.0f, iq = 1.0f / (nq + GKA_L2_EPS);
            for (int d = 0; d < dk; d++) { dq[d] = dq[d] * iq - qh[d] * cq2; }
            // k = bs k_hat: dbeta = k_hat.dk, dk_hat = bs dk; v = bs v_in: dbeta += v_in.dv, dv_in = bs dv
            const float* ks = row + HK + hh * dk;   // bs k_hat
            float* dkk = drow + HK + hh * dk;
            const float* vs = row + 2 * HK + hh * dv;   // bs v_in
            float* dvv = drow + 2 * HK + hh * dv;
            const float dbeta = (vec_dot(ks, dkk, dk) + vec_dot(vs, dvv, dv)) / bs;
            for (int d = 0; d < dv; d++) { dvv[d] *= bs; }
            const float nk = a->kn[e], ik = 1.0f / (nk + GKA_L2_EPS);
            // with y = k_hat = ks / bs and dy = bs dk: y.dy = ks.dk
            const float ck = vec_dot(ks, dkk, dk), ck2 = nk > 0.0f ? ck / (bs * nk) : 0.0f;
            for (int d = 0; d < dk; d++) { dkk[d] = bs * dkk[d] * ik - ks[d] * ck2; }
            // beta = sigmoid(b + b_bias); alpha = sigmoid(alpha + alpha_bias); g = -exp(A_log) softplus(a + dt_bias)
            dprow[D + HV + H + hh] = dbeta * bt * (1.0f - bt);
            const float al = a->alpha[e];
            dprow[D + HV + 2 * H + hh] = dalpha[e] * al * (1.0f - al);
            const float u = prow[D + HV + hh] + p->dt_bias[hh];
            dprow[D + HV + hh] = dg[e] * -expf(p->A_log[hh]) * dsoftplusf(u);
        }
        float* durow = du + (size_t)r * D;
        if (G > 1) { gka_reduce_row(durow, drow, c); }   // G = 1: durow == drow
        shortconv_silu_backward_row(durow, dprow, prow, r % T, p->conv_w, D, P, W);
    }
    // gate and decay parameters, tokens in order: dA_log = sum dg g, ddt_bias = sum da, db_bias, dalpha_bias
    for (size_t r = 0; r < (size_t)BT; r++) {
        for (int hh = 0; hh < H; hh++) {
            grads->A_log[hh] += dg[r * H + hh] * a->g[r * H + hh];
            grads->dt_bias[hh] += dproj[r * P + D + HV + hh];
            grads->b_bias[hh] += dproj[r * P + D + HV + H + hh];
            grads->alpha_bias[hh] += dproj[r * P + D + HV + 2 * H + hh];
        }
    }

    // conv backward
    shortconv_backward(dproj, grads->conv_w, du, a->proj, p->conv_w, BT, T, D, P, W);

    // proj = x W_in^T
    matmul_backward(dx, grads->in_proj_w, NULL, dproj, x, p->in_proj_w, BT, C, P);
}

// ----------------------------------------------------------------------------
// decode (spec 7): one token of one sequence with the recurrent state carried in GKAState

static size_t gka_state_floats(const GKAConfig* c) {
    return (size_t)(c->W - 1) * gka_D(c) + (size_t)c->H * c->dk * (c->dk + c->dv);
}

static void gka_state_point(GKAState* s, float* base, const GKAConfig* c) {
    s->conv = base;
    s->H = base + (size_t)(c->W - 1) * gka_D(c);
    s->U = s->H + (size_t)c->H * c->dk * c->dk;
}

static void gka_state_reset(GKAState* s, const GKAConfig* c) {
    memset(s->conv, 0, gka_state_floats(c) * sizeof(float));   // conv cache, H and U are contiguous
}

// scratch of gka_decode_step: proj [P], qkv [DE], qn, kn, beta, alpha, g, f, rstd [H each], x [H*dk], o, y [H*dv],
// u [D] (the un-expanded conv output, GQA)
static size_t gka_decode_scratch_floats(const GKAConfig* c) {
    return (size_t)gka_P(c) + gka_DE(c) + 7 * c->H + (size_t)c->H * c->dk + 2 * (size_t)c->H * c->dv + gka_D(c);
}

static void gka_decode_step(float* out, GKAState* s, const GKAParams* p, const float* x, float* scratch,
                            const GKAConfig* c) {
    const int H = c->H, dk = c->dk, dv = c->dv, W = c->W, D = gka_D(c), DE = gka_DE(c), P = gka_P(c);
    float* proj = scratch;
    float* qkv = proj + P;
    float* qn = qkv + DE;
    float* kn = qn + H;
    float* beta = kn + H;
    float* alpha = beta + H;
    float* g = alpha + H;
    float* f = g + H;
    float* rstd = f + H;
    float* xs = rstd + H;
    float* o = xs + H * dk;
    float* y = o + H * dv;
    float* u = y + H * dv;
    matmul_forward(proj, x, p->in_proj_w, NULL, 1, c->C, P);
    if (gka_G(c) == 1) {
        shortconv_decode_step(qkv, s->conv, proj, p->conv_w, D, W);
    } else {
        shortconv_decode_step(u, s->conv, proj, p->conv_w, D, W);
        gka_expand_row(qkv, u, c);
    }
    gka_token_features(qkv, qn, kn, beta, alpha, g, proj, p, c);
    gka_core_forward(o, xs, f, NULL, NULL, s->H, s->U, qkv, alpha, g, 1, 1, H, dk, dv, 1, c->iters, c->ridge);
    gated_norm_row(y, rstd, o, proj + D, p->onorm_w, H, dv, c->onorm_eps);
    matmul_forward(out, y, p->out_proj_w, NULL, 1, H * dv, c->C);
}

// ----------------------------------------------------------------------------------------------------------
// the kalman mixer (spec/kalman.md)

// ----------------------------------------------------------------------------
// Kalman Linear Attention (KLA), fp32, OpenMP. Math: spec/kalman.md ("spec") sections 1.3, 1.7, 2.3-2.5, 4.
// Parameter layout: FORMATS.md. A "lane" is (b, d, n); Dk = expand * C is the inner width (the spec's D).
// Per lane, with phi = Lv k^2, r = v Lv k: den = max(max(abar^2, 1e-12) + pbar lam, 1e-12), rho = 1/den,
// eta <- abar rho eta + r, lam <- lam rho + phi, y[d] = sum_n q[n] eta[n] / max(lam[n], 1e-12); lam_0 = 1, eta_0 = 0.
// Layouts (row-major, last index fastest), with Ws = 2*Dk + 2N (plain) or R + 2N (mamba):
//   h [B,T,2Dk]  in_proj output, blocks z0 | gate;  zc, u [B,T,Dk] conv pre-activation (with bias) and SiLU
//   s [B,T,Ws]   sensor output, plain v | ls | kr | qr, mamba ls_r | kr | qr (v = u in the mamba preset)
//   ls, Lv [B,T,Dk]; k, q [B,T,N] (unit vectors), kn, qn [B,T] max(||kr||, 1e-12), max(||qr||, 1e-12)
//   abar, pbar [Dk,N] static dynamics; ys, yg [B,T,Dk] filter output and out_proj input
// The filter is the sequential recurrence of spec 2.3, parallel over (b, d), with (lam, eta) checkpointed every
// `chunk` tokens; the backward (spec 2.4, exact reverse-time adjoint) replays each segment from its checkpoint.

typedef struct {
    int C, Dk, N, K;   // model width, inner width (expand * C), states per channel, conv taps (4)
    int preset;        // 0: plain, 1: mamba (spec 1.3)
    int R;             // low rank of the variance path (mamba: ceil(C/8); plain: 0)
    int chunk;         // checkpoint interval of the filter (the backward replays segments of this length)
} KalmanConfig;

// everything the backward needs, written by kalman_forward
typedef struct {
    float* h;      // [B,T,2Dk] in_proj output z0 | gate
    float* win;    // [B,K-1,Dk] the conv window before the first token (zeros unless a state was carried in)
    float* zc;     // [B,T,Dk] conv pre-activation (bias included)
    float* u;      // [B,T,Dk] SiLU(zc)
    float* s;      // [B,T,Ws] sensor projection
    float* lsr;    // [B,T,R] mamba: contiguous copy of s[:, 0:R] (else NULL)
    float* ls;     // [B,T,Dk] log observation variance
    float* Lv;     // [B,T,Dk] observation precision 1/(softplus(ls) + 1e-4)
    float* k;      // [B,T,N] kr / kn
    float* q;      // [B,T,N] qr / qn
    float* kn;     // [B,T] max(||kr||, 1e-12)
    float* qn;     // [B,T] max(||qr||, 1e-12)
    float* abar;   // [Dk,N]
    float* pbar;   // [Dk,N]
    float* ck;     // [B,Dk,NT,2N] (lam | eta) at the start of each checkpoint segment
    float* lam;    // [B,Dk,N] final precision lam_T
    float* eta;    // [B,Dk,N] final information mean eta_T
    float* ys;     // [B,T,Dk] filter output
    float* yg;     // [B,T,Dk] (ys + lambda_skip u) * SiLU(gate) = out_proj input
    int nthr;      // threads the scratch was sized for (max_threads() at kalman_acts_point)
} KalmanActs;

// decode state of one sequence (spec 4); the three arrays are contiguous
typedef struct {
    float* conv;   // [K-1, Dk] the last K-1 pre-conv inputs z0, oldest first (zeros at start)
    float* lam;    // [Dk, N] precision (1 at start)
    float* eta;    // [Dk, N] information mean (0 at start)
} KalmanState;

#define KALMAN_FLOOR 1e-12f   // the torch-path floors of spec 2.5 (abar^2, den, lam, pbar) and the L2-norm floor
#define KALMAN_DB 32          // channels per task of the filter backward (fixed: the reduction order is too)

static inline int kalman_Ws(const KalmanConfig* c) { return c->preset ? c->R + 2 * c->N : 2 * c->Dk + 2 * c->N; }
static inline int kalman_NT(int T, int CK) { return (T + CK - 1) / CK; }
static inline int kalman_NDB(int Dk) { return (Dk + KALMAN_DB - 1) / KALMAN_DB; }

// ----------------------------------------------------------------------------
// the filter (spec 2.3-2.5)

// one token of the N lanes of channel d (spec 2.3): lam, eta [N] updated in place; returns y = sum_n q mean.
// v, Lv: the channel's value and precision; k, q [N]; abar, pbar [N] the channel's dynamics.
static inline float kalman_step(float* lam, float* eta, float v, float Lv, const float* k, const float* q,
                                const float* abar, const float* pbar, int N) {
    const float ut = v * Lv;
    float y = 0.0f;
    for (int n = 0; n < N; n++) {
        const float a2 = fmaxf(abar[n] * abar[n], KALMAN_FLOOR);
        const float rho = 1.0f / fmaxf(a2 + pbar[n] * lam[n], KALMAN_FLOOR);
        eta[n] = abar[n] * rho * eta[n] + ut * k[n];
        lam[n] = lam[n] * rho + Lv * k[n] * k[n];
        y += q[n] * eta[n] / fmaxf(lam[n], KALMAN_FLOOR);
    }
    return y;
}

// spec 2.3. v [B,T,*] with row stride ldv, Lv [B,T,Dk], k, q [B,T,N], abar, pbar [Dk,N]. lam, eta [B,Dk,N]:
// initial states in, final states out. Writes ys [B,T,Dk] and (if ck) (lam | eta) at t0 = 0, CK, 2CK, ...
// into ck [B,Dk,NT,2N].
static void kalman_filter_forward(float* ys, float* ck, float* lam, float* eta, const float* v, int ldv,
                                  const float* Lv, const float* k, const float* q, const float* abar,
                                  const float* pbar, int B, int T, int Dk, int N, int CK) {
    const int NT = kalman_NT(T, CK);
    #pragma omp parallel for schedule(static)
    for (int bd = 0; bd < B * Dk; bd++) {
        const int b = bd / Dk, d = bd % Dk;
        float* lm = lam + (size_t)bd * N;
        float* et = eta + (size_t)bd * N;
        for (int t = 0; t < T; t++) {
            const size_t r = (size_t)b * T + t;
            if (ck && t % CK == 0) {
                float* cp = ck + ((size_t)bd * NT + t / CK) * 2 * N;
                memcpy(cp, lm, (size_t)N * sizeof(float));
                memcpy(cp + N, et, (size_t)N * sizeof(float));
            }
            ys[r * Dk + d] = kalman_step(lm, et, v[r * ldv + d], Lv[r * Dk + d], k + r * N, q + r * N,
                                         abar + (size_t)d * N, pbar + (size_t)d * N, N);
        }
    }
}

// per-thread scratch of kalman_filter_backward: the CK+1 (lam | eta) of a segment, the carries Gl, Ge [N]
static size_t kalman_filter_bwd_floats(int CK, int N) { return (size_t)(CK + 1) * 2 * N + 2 * (size_t)N; }
// shared scratch of kalman_filter_backward: dk, dq partials per (b, channel block) [B,NDB,T,2N], dabar, dpbar
// partials per (b, d) [B,Dk,2N]
static size_t kalman_filter_bwd_shared_floats(int B, int T, int Dk, int N) {
    return (size_t)B * kalman_NDB(Dk) * T * 2 * N + (size_t)B * Dk * 2 * N;
}

// spec 2.4: exact reverse-time adjoint per lane, for tasks of (b, block of KALMAN_DB channels); each channel
// runs from the last segment to the first, replaying the segment's states from its checkpoint; zero
// subgradient where a floor of spec 2.5 binds. dys [B,T,Dk] = dL/dys; dlamT, detaT [B,Dk,N] = dL/d(final
// state) (NULL: 0). Outputs (overwritten): dv, dLv [B,T,Dk], dk, dq [B,T,N], dabar, dpbar [Dk,N] (sums over b
// and t), dlam0, deta0 [B,Dk,N] (NULL: not returned). Every sum runs in an order fixed by the shapes alone.
// scratch: nthr * kalman_filter_bwd_floats(CK, N) + kalman_filter_bwd_shared_floats(B, T, Dk, N) floats.
static void kalman_filter_backward(float* dv, float* dLv, float* dk, float* dq, float* dabar, float* dpbar,
                                   float* dlam0, float* deta0, const float* dys, const float* dlamT,
                                   const float* detaT, const float* ck, const float* v, int ldv, const float* Lv,
                                   const float* k, const float* q, const float* abar, const float* pbar,
                                   int B, int T, int Dk, int N, int CK, float* scratch, int nthr) {
    const int NT = kalman_NT(T, CK), NDB = kalman_NDB(Dk);
    float* kq_part = scratch;                                          // [B,NDB,T,2N] dk | dq
    float* ap_part = kq_part + (size_t)B * NDB * T * 2 * N;            // [B,Dk,2N] dabar | dpbar
    float* thr_base = ap_part + (size_t)B * Dk * 2 * N;
    (void)nthr;   // read only by the OpenMP pragma
    #pragma omp parallel for num_threads(nthr) schedule(static)
    for (int task = 0; task < B * NDB; task++) {
        const int b = task / NDB, d0 = (task % NDB) * KALMAN_DB;
        const int d1 = d0 + KALMAN_DB < Dk ? d0 + KALMAN_DB : Dk;
        float* seg = thr_base + (size_t)thread_id() * kalman_filter_bwd_floats(CK, N);   // [CK+1, 2N]
        float* Gl = seg + (size_t)(CK + 1) * 2 * N;
        float* Ge = Gl + N;
        float* kq = kq_part + (size_t)task * T * 2 * N;
        memset(kq, 0, (size_t)T * 2 * N * sizeof(float));
        for (int d = d0; d < d1; d++) {
            const size_t bd = (size_t)b * Dk + d;
            const float* ab = abar + (size_t)d * N;
            const float* pb = pbar + (size_t)d * N;
            float* gab = ap_part + bd * 2 * N;
            float* gpb = gab + N;
            for (int n = 0; n < N; n++) {
                Gl[n] = dlamT ? dlamT[bd * N + n] : 0.0f;
                Ge[n] = detaT ? detaT[bd * N + n] : 0.0f;
                gab[n] = 0.0f;
                gpb[n] = 0.0f;
            }
            for (int sgi = NT - 1; sgi >= 0; sgi--) {
                const int t0 = sgi * CK;
                const int L = T - t0 < CK ? T - t0 : CK;
                memcpy(seg, ck + (bd * NT + sgi) * 2 * N, (size_t)2 * N * sizeof(float));
                for (int i = 0; i < L; i++) {
                    const size_t r = (size_t)b * T + t0 + i;
                    float* nx = seg + (size_t)(i + 1) * 2 * N;
                    memcpy(nx, seg + (size_t)i * 2 * N, (size_t)2 * N * sizeof(float));
                    kalman_step(nx, nx + N, v[r * ldv + d], Lv[r * Dk + d], k + r * N, q + r * N, ab, pb, N);
                }
                for (int i = L - 1; i >= 0; i--) {
                    const size_t r = (size_t)b * T + t0 + i;
                    const float* lp_ = seg + (size_t)i * 2 * N;          // lam_{t-1} | eta_{t-1}
                    const float* lt_ = seg + (size_t)(i + 1) * 2 * N;    // lam_t | eta_t
                    const float* kt = k + r * N;
                    const float* qt = q + r * N;
                    float* kqt = kq + (size_t)(t0 + i) * 2 * N;
                    const float dy = dys[r * Dk + d], vt = v[r * ldv + d], Lvt = Lv[r * Dk + d];
                    float sLv = 0.0f, sv = 0.0f;
                    for (int n = 0; n < N; n++) {
                        const float lp = lp_[n], ep = lp_[N + n], lt = lt_[n], et = lt_[N + n];
                        const float a = ab[n], a2raw = a * a;
                        const float a2 = fmaxf(a2raw, KALMAN_FLOOR);
                        const float denraw = a2 + pb[n] * lp;
                        const float rho = 1.0f / fmaxf(denraw, KALMAN_FLOOR);
                        const float var = 1.0f / fmaxf(lt, KALMAN_FLOOR);
                        const float gmean = dy * qt[n];
                        const float ge = Ge[n] + gmean * var;
                        const float gl = lt > KALMAN_FLOOR ? Gl[n] - gmean * et * var * var : Gl[n];
                        kqt[N + n] += dy * et * var;                    // dq
                        // through den = a2 + pbar lp: gden = dL/dden
                        const float gden = denraw > KALMAN_FLOOR ? -(gl * lp + ge * ep * a) * rho * rho : 0.0f;
                        gab[n] += ge * ep * rho + (a2raw > KALMAN_FLOOR ? 2.0f * a * gden : 0.0f);
                        gpb[n] += gden * lp;
                        Gl[n] = denraw > KALMAN_FLOOR ? (gl * a2 - ge * ep * a * pb[n]) * rho * rho : gl * rho;
                        Ge[n] = a * rho * ge;
                        // token inputs: phi = Lv k^2, r = v Lv k
                        const float kk = kt[n];
                        sLv += gl * kk * kk + ge * vt * kk;
                        sv += ge * kk;
                        kqt[n] += 2.0f * gl * Lvt * kk + ge * vt * Lvt;   // dk
                    }
                    dLv[r * Dk + d] = sLv;
                    dv[r * Dk + d] = sv * Lvt;
                }
            }
            if (dlam0) { memcpy(dlam0 + bd * N, Gl, (size_t)N * sizeof(float)); }
            if (deta0) { memcpy(deta0 + bd * N, Ge, (size_t)N * sizeof(float)); }
        }
    }
    // dk, dq: sum over channel blocks in block order; dabar, dpbar: sum over b in order
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < B * T; r++) {
        const int b = r / T, t = r % T;
        for (int n = 0; n < N; n++) { dk[(size_t)r * N + n] = 0.0f; dq[(size_t)r * N + n] = 0.0f; }
        for (int j = 0; j < NDB; j++) {
            const float* kqt = kq_part + (((size_t)b * NDB + j) * T + t) * 2 * N;
            for (int n = 0; n < N; n++) { dk[(size_t)r * N + n] += kqt[n]; dq[(size_t)r * N + n] += kqt[N + n]; }
        }
    }
    #pragma omp parallel for schedule(static)
    for (int d = 0; d < Dk; d++) {
        for (int n = 0; n < N; n++) {
            float sa = 0.0f, sp = 0.0f;
            for (int b = 0; b < B; b++) {
                const float* part = ap_part + ((size_t)b * Dk + d) * 2 * N;
                sa += part[n];
                sp += part[N + n];
            }
            dabar[(size_t)d * N + n] = sa;
            dpbar[(size_t)d * N + n] = sp;
        }
    }
}

// ----------------------------------------------------------------------------
// per-token pieces of the layer, shared by the forward, the backward and decode

// spec 1.3 (6): the static dynamics abar, pbar [Dk,N], computed once per forward
static void kalman_dynamics(float* abar, float* pbar, const KalmanParams* p, int Dk, int N) {
    for (int i = 0; i < Dk * N; i++) {
        const float Delta = softplusf(p->delta_raw[i]) + 1e-7f;
        const float kappa = expf(p->lambda_log[i]);
        const float pp = fmaxf(p->p_raw[i], 1e-7f);
        abar[i] = expf(-kappa * Delta);
        pbar[i] = fmaxf(pp / (2.0f * kappa) * -expm1f(-2.0f * kappa * Delta), KALMAN_FLOOR);
    }
}

// spec 1.3 (2): causal depthwise conv pre-activation with bias at time t of a sequence; h_row points at the
// token's in_proj row (z0 = its first Dk channels), earlier tokens are 2*Dk floats apart; taps before the
// sequence start read the window win [K-1, Dk] (row K-2 = the token just before; NULL: zeros).
static void kalman_conv_row(float* zc, const float* h_row, int t, const float* win, const float* conv_w,
                            const float* conv_b, int Dk, int K) {
    for (int d = 0; d < Dk; d++) { zc[d] = conv_b[d]; }
    for (int j = 0; j < K; j++) {
        const int back = K - 1 - j;
        const float* src;
        if (back <= t) { src = h_row - (ptrdiff_t)back * 2 * Dk; }
        else if (win) { src = win + (size_t)(K - 1 - back + t) * Dk; }
        else { continue; }
        for (int d = 0; d < Dk; d++) { zc[d] += conv_w[d * K + j] * src[d]; }
    }
}

// spec 1.3 (4)-(5) for one token: k = kr / max(||kr||, 1e-12), q likewise, Lv = 1/(softplus(ls) + 1e-4).
// s_row: the token's sensor row; ls_row [Dk]. Writes k, q [N], kn, qn, Lv [Dk].
static void kalman_sensor_row(float* k, float* q, float* kn, float* qn, float* Lv, const float* s_row,
                              const float* ls_row, const KalmanConfig* c) {
    const int N = c->N, off = c->preset ? c->R : 2 * c->Dk;
    const float* kr = s_row + off;
    const float* qr = kr + N;
    float sk = 0.0f, sq = 0.0f;
    for (int n = 0; n < N; n++) { sk += kr[n] * kr[n]; sq += qr[n] * qr[n]; }
    *kn = fmaxf(sqrtf(sk), KALMAN_FLOOR);
    *qn = fmaxf(sqrtf(sq), KALMAN_FLOOR);
    for (int n = 0; n < N; n++) { k[n] = kr[n] / *kn; q[n] = qr[n] / *qn; }
    for (int d = 0; d < c->Dk; d++) { Lv[d] = 1.0f / (softplusf(ls_row[d]) + 1e-4f); }
}

// spec 1.3 (8) for one token: yg = (ys + lambda_skip u) SiLU(gate)
static void kalman_gate_row(float* yg, const float* ys, const float* u, const float* gate, float lskip, int Dk) {
    for (int d = 0; d < Dk; d++) { yg[d] = (ys[d] + lskip * u[d]) * gate[d] * sigmoidf(gate[d]); }
}

// ----------------------------------------------------------------------------
// layer forward / backward

static size_t kalman_acts_floats(int B, int T, const KalmanConfig* c) {
    const size_t BT = (size_t)B * T, Dk = c->Dk, N = c->N;
    return BT * 2 * Dk + (size_t)B * (c->K - 1) * Dk + 2 * BT * Dk + BT * kalman_Ws(c)
         + (c->preset ? BT * c->R : 0) + 2 * BT * Dk + 2 * BT * N + 2 * BT + 2 * Dk * N
         + (size_t)B * Dk * kalman_NT(T, c->chunk) * 2 * N + 2 * (size_t)B * Dk * N + 2 * BT * Dk;
}

static void kalman_acts_point(KalmanActs* a, float* base, int B, int T, const KalmanConfig* c) {
    const size_t BT = (size_t)B * T, Dk = c->Dk, N = c->N;
    a->h = base;     base += BT * 2 * Dk;
    a->win = base;   base += (size_t)B * (c->K - 1) * Dk;
    a->zc = base;    base += BT * Dk;
    a->u = base;     base += BT * Dk;
    a->s = base;     base += BT * kalman_Ws(c);
    a->lsr = NULL;
    if (c->preset) { a->lsr = base; base += BT * c->R; }
    a->ls = base;    base += BT * Dk;
    a->Lv = base;    base += BT * Dk;
    a->k = base;     base += BT * N;
    a->q = base;     base += BT * N;
    a->kn = base;    base += BT;
    a->qn = base;    base += BT;
    a->abar = base;  base += Dk * N;
    a->pbar = base;  base += Dk * N;
    a->ck = base;    base += (size_t)B * Dk * kalman_NT(T, c->chunk) * 2 * N;
    a->lam = base;   base += (size_t)B * Dk * N;
    a->eta = base;   base += (size_t)B * Dk * N;
    a->ys = base;    base += BT * Dk;
    a->yg = base;
    a->nthr = max_threads();
}

// scratch of kalman_backward: dyg [BT,Dk], dh [BT,2Dk], du, dv, dLv [BT,Dk], dk, dq [BT,N], ds [BT,Ws],
// dlsr [BT,R] (mamba), dlskip rows [BT], dabar, dpbar [Dk,N], filter scratch.
// Sized for max_threads() at the time of the call (as KalmanActs): do not raise the thread count later.
static size_t kalman_scratch_floats(int B, int T, const KalmanConfig* c) {
    const size_t BT = (size_t)B * T, Dk = c->Dk, N = c->N;
    return BT * (6 * Dk + 2 * N + kalman_Ws(c) + (c->preset ? c->R : 0) + 1) + 2 * Dk * N
         + (size_t)max_threads() * kalman_filter_bwd_floats(c->chunk, c->N)
         + kalman_filter_bwd_shared_floats(B, T, c->Dk, c->N);
}

// spec 1.3 with the filter state carried: states = B consecutive KalmanState blocks (kalman_state_floats
// each): the initial conv window and (lam, eta) in, the final ones out (chunked prefill). NULL: every sequence
// starts from the prior (conv window 0, lam = 1, eta = 0). x [B,T,C] (the normed mixer input); out [B,T,C]
// overwritten; the final (lam, eta) are also left in a->lam, a->eta.
static size_t kalman_state_floats(const KalmanConfig* c);
static void kalman_forward_carry(float* out, KalmanActs* a, const KalmanParams* p, const float* x, int B, int T,
                                 const KalmanConfig* c, float* states) {
    const int BT = B * T, C = c->C, Dk = c->Dk, N = c->N, K = c->K, Ws = kalman_Ws(c);
    const size_t sf = kalman_state_floats(c), wf = (size_t)(K - 1) * Dk;
    // (1) h = x W_in^T
    matmul_forward(a->h, x, p->in_proj_w, NULL, BT, C, 2 * Dk);
    for (int b = 0; b < B; b++) {
        if (states) { memcpy(a->win + b * wf, states + b * sf, wf * sizeof(float)); }
        else { memset(a->win + b * wf, 0, wf * sizeof(float)); }
    }
    // (2) conv + bias, SiLU
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        float* zc = a->zc + (size_t)r * Dk;
        kalman_conv_row(zc, a->h + (size_t)r * 2 * Dk, r % T, a->win + (r / T) * wf, p->conv_w, p->conv_b, Dk, K);
        for (int d = 0; d < Dk; d++) { a->u[(size_t)r * Dk + d] = zc[d] * sigmoidf(zc[d]); }
    }
    // (3) sensor projection; mamba: ls = s[0:R] W_var^T
    matmul_forward(a->s, a->u, p->sensor_w, NULL, BT, Dk, Ws);
    if (c->preset) {
        for (int r = 0; r < BT; r++) { memcpy(a->lsr + (size_t)r * c->R, a->s + (size_t)r * Ws, (size_t)c->R * sizeof(float)); }
        matmul_forward(a->ls, a->lsr, p->var_w, NULL, BT, c->R, Dk);
    } else {
        for (int r = 0; r < BT; r++) { memcpy(a->ls + (size_t)r * Dk, a->s + (size_t)r * Ws + Dk, (size_t)Dk * sizeof(float)); }
    }
    // (4)-(5) k, q, Lv
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        kalman_sensor_row(a->k + (size_t)r * N, a->q + (size_t)r * N, a->kn + r, a->qn + r, a->Lv + (size_t)r * Dk,
                          a->s + (size_t)r * Ws, a->ls + (size_t)r * Dk, c);
    }
    // (6) dynamics, (7) the filter
    kalman_dynamics(a->abar, a->pbar, p, Dk, N);
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < Dk * N; i++) {
            a->lam[(size_t)b * Dk * N + i] = states ? states[b * sf + wf + i] : 1.0f;
            a->eta[(size_t)b * Dk * N + i] = states ? states[b * sf + wf + (size_t)Dk * N + i] : 0.0f;
        }
    }
    kalman_filter_forward(a->ys, a->ck, a->lam, a->eta, c->preset ? a->u : a->s, c->preset ? Dk : Ws, a->Lv,
                          a->k, a->q, a->abar, a->pbar, B, T, Dk, N, c->chunk);
    // (8) skip, gate, out_proj
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        kalman_gate_row(a->yg + (size_t)r * Dk, a->ys + (size_t)r * Dk, a->u + (size_t)r * Dk,
                        a->h + (size_t)r * 2 * Dk + Dk, p->lambda_skip[0], Dk);
    }
    matmul_forward(out, a->yg, p->out_proj_w, NULL, BT, Dk, C);
    // the final states: the last K-1 z0 rows (earlier window rows where T < K-1), lam_T, eta_T
    if (states) {
        for (int b = 0; b < B; b++) {
            float* st = states + b * sf;
            for (int i = 0; i < K - 1; i++) {
                const int tt = T - (K - 1) + i;   // time of window row i
                const float* src = tt >= 0 ? a->h + ((size_t)b * T + tt) * 2 * Dk : a->win + b * wf + (size_t)(tt + K - 1) * Dk;
                memmove(st + (size_t)i * Dk, src, (size_t)Dk * sizeof(float));
            }
            memcpy(st + wf, a->lam + (size_t)b * Dk * N, (size_t)Dk * N * sizeof(float));
            memcpy(st + wf + (size_t)Dk * N, a->eta + (size_t)b * Dk * N, (size_t)Dk * N * sizeof(float));
        }
    }
}

// spec 1.3. x [B,T,C] (the normed mixer input); out [B,T,C] overwritten. Every sequence starts from the prior.
static void kalman_forward(float* out, KalmanActs* a, const KalmanParams* p, const float* x, int B, int T,
                           const KalmanConfig* c) {
    kalman_forward_carry(out, a, p, x, B, T, c, NULL);
}

// spec 1.7 + 2.4. dout [B,T,C]; dx += dL/dx; grads += dL/dparams (dL/d(carried-in state) is not returned).
// Parameter-gradient sums run in a fixed order, so the result does not depend on the thread count.
static void kalman_backward(float* dx, KalmanParams* grads, const float* dout, const KalmanActs* a,
                            const KalmanParams* p, const float* x, float* scratch, int B, int T,
                            const KalmanConfig* c) {
    const int BT = B * T, C = c->C, Dk = c->Dk, N = c->N, K = c->K, Ws = kalman_Ws(c), R = c->R;
    const size_t wf = (size_t)(K - 1) * Dk;
    float* dyg = scratch;                          // dL/dyg, then dL/dys in place
    float* dh = dyg + (size_t)BT * Dk;             // [BT,2Dk] dL/dh
    float* du = dh + (size_t)BT * 2 * Dk;          // dL/du, then dL/dzc in place
    float* dv = du + (size_t)BT * Dk;
    float* dLv = dv + (size_t)BT * Dk;
    float* dk = dLv + (size_t)BT * Dk;             // [BT,N]
    float* dq = dk + (size_t)BT * N;
    float* ds = dq + (size_t)BT * N;               // [BT,Ws]
    float* dlsr = ds + (size_t)BT * Ws;            // [BT,R] mamba
    float* dskip = dlsr + (size_t)BT * (c->preset ? R : 0);   // [BT] per-row partials of dlambda_skip
    float* dabar = dskip + BT;                     // [Dk,N]
    float* dpbar = dabar + (size_t)Dk * N;
    float* fscratch = dpbar + (size_t)Dk * N;
    const float lskip = p->lambda_skip[0];

    // out = yg W_out^T
    memset(dyg, 0, (size_t)BT * Dk * sizeof(float));
    matmul_backward(dyg, grads->out_proj_w, NULL, dout, a->yg, p->out_proj_w, BT, Dk, C);

    // yg = y1 SiLU(g), y1 = ys + lambda_skip u: dg into dh[:, Dk:2Dk], dys = dy1 (in place), du = lambda_skip dy1
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const float* g = a->h + (size_t)r * 2 * Dk + Dk;
        float* dg = dh + (size_t)r * 2 * Dk + Dk;
        float* d1 = dyg + (size_t)r * Dk;
        const float* u = a->u + (size_t)r * Dk;
        const float* ys = a->ys + (size_t)r * Dk;
        float acc = 0.0f;
        for (int d = 0; d < Dk; d++) {
            const float sg = sigmoidf(g[d]);
            const float y1 = ys[d] + lskip * u[d];
            dg[d] = d1[d] * y1 * sg * (1.0f + g[d] * (1.0f - sg));
            const float dy1 = d1[d] * g[d] * sg;
            d1[d] = dy1;
            acc += dy1 * u[d];
            du[(size_t)r * Dk + d] = lskip * dy1;
        }
        dskip[r] = acc;
    }
    {
        float s = 0.0f;
        for (int r = 0; r < BT; r++) { s += dskip[r]; }
        grads->lambda_skip[0] += s;
    }

    // the filter (spec 2.4), no gradient of the final state
    kalman_filter_backward(dv, dLv, dk, dq, dabar, dpbar, NULL, NULL, dyg, NULL, NULL, a->ck,
                           c->preset ? a->u : a->s, c->preset ? Dk : Ws, a->Lv, a->k, a->q, a->abar, a->pbar,
                           B, T, Dk, N, c->chunk, fscratch, a->nthr);

    // per token: Lv (dls), L2 norms (dkr, dqr) into ds; mamba: v = u
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        float* dsr = ds + (size_t)r * Ws;
        const float* Lv = a->Lv + (size_t)r * Dk;
        const float* ls = a->ls + (size_t)r * Dk;
        float* dls = dLv + (size_t)r * Dk;   // dLv -> dls in place
        for (int d = 0; d < Dk; d++) { dls[d] *= -Lv[d] * Lv[d] * dsoftplusf(ls[d]); }
        const int off = c->preset ? R : 2 * Dk;
        const float* kt = a->k + (size_t)r * N;
        const float* qt = a->q + (size_t)r * N;
        const float* dkt = dk + (size_t)r * N;
        const float* dqt = dq + (size_t)r * N;
        float ck = 0.0f, cq = 0.0f;
        for (int n = 0; n < N; n++) { ck += kt[n] * dkt[n]; cq += qt[n] * dqt[n]; }
        // the norm floor binds: k = kr / 1e-12 is linear in kr
        if (a->kn[r] <= KALMAN_FLOOR) { ck = 0.0f; }
        if (a->qn[r] <= KALMAN_FLOOR) { cq = 0.0f; }
        for (int n = 0; n < N; n++) {
            dsr[off + n] = (dkt[n] - kt[n] * ck) / a->kn[r];
            dsr[off + N + n] = (dqt[n] - qt[n] * cq) / a->qn[r];
        }
        if (!c->preset) {
            memcpy(dsr, dv + (size_t)r * Dk, (size_t)Dk * sizeof(float));
            memcpy(dsr + Dk, dls, (size_t)Dk * sizeof(float));
        } else {
            for (int d = 0; d < Dk; d++) { du[(size_t)r * Dk + d] += dv[(size_t)r * Dk + d]; }
        }
    }
    // mamba: ls = ls_r W_var^T
    if (c->preset) {
        memset(dlsr, 0, (size_t)BT * R * sizeof(float));
        matmul_backward(dlsr, grads->var_w, NULL, dLv, a->lsr, p->var_w, BT, R, Dk);
        for (int r = 0; r < BT; r++) { memcpy(ds + (size_t)r * Ws, dlsr + (size_t)r * R, (size_t)R * sizeof(float)); }
    }
    // s = u W_s^T
    matmul_backward(du, grads->sensor_w, NULL, ds, a->u, p->sensor_w, BT, Dk, Ws);

    // u = SiLU(zc): dzc in place of du; conv bias
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const float* zc = a->zc + (size_t)r * Dk;
        float* dz = du + (size_t)r * Dk;
        for (int d = 0; d < Dk; d++) {
            const float sz = sigmoidf(zc[d]);
            dz[d] *= sz * (1.0f + zc[d] * (1.0f - sz));
        }
    }
    for (int r = 0; r < BT; r++) {
        for (int d = 0; d < Dk; d++) { grads->conv_b[d] += du[(size_t)r * Dk + d]; }
    }
    // conv weights and inputs (z0 = the first Dk channels of h): the in-sequence taps by the shared helper,
    // then the taps that read the carried-in window
    shortconv_backward(dh, grads->conv_w, du, a->h, p->conv_w, BT, T, Dk, 2 * Dk, K);
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < K - 1 && t < T; t++) {
            const float* dz = du + ((size_t)b * T + t) * Dk;
            for (int j = 0; j < K; j++) {
                const int back = K - 1 - j;
                if (back <= t) { continue; }
                const float* w = a->win + b * wf + (size_t)(K - 1 - back + t) * Dk;
                for (int d = 0; d < Dk; d++) { grads->conv_w[d * K + j] += dz[d] * w[d]; }
            }
        }
    }

    // h = x W_in^T
    matmul_backward(dx, grads->in_proj_w, NULL, dh, x, p->in_proj_w, BT, C, 2 * Dk);

    // static dynamics (spec 1.7), E = exp(-2 kappa Delta); zero gradient where a clamp binds
    for (int i = 0; i < Dk * N; i++) {
        const float Delta = softplusf(p->delta_raw[i]) + 1e-7f;
        const float kappa = expf(p->lambda_log[i]);
        const float pp = fmaxf(p->p_raw[i], 1e-7f);
        const float ab = a->abar[i];
        const float x2 = 2.0f * kappa * Delta;
        const float E = expf(-x2), omE = -expm1f(-x2);
        const float pbraw = pp / (2.0f * kappa) * omE;
        const float gp = pbraw > KALMAN_FLOOR ? dpbar[i] : 0.0f;
        const float dDelta = dabar[i] * (-kappa * ab) + gp * (pp * E);
        const float dkappa = dabar[i] * (-Delta * ab) + gp * (pp / kappa) * (Delta * E - omE / (2.0f * kappa));
        grads->delta_raw[i] += dDelta * dsoftplusf(p->delta_raw[i]);
        grads->lambda_log[i] += dkappa * kappa;
        grads->p_raw[i] += p->p_raw[i] > 1e-7f ? gp * omE / (2.0f * kappa) : 0.0f;
    }
}

// ----------------------------------------------------------------------------
// decode (spec 4): one token of one sequence with the recurrent state carried in KalmanState

static size_t kalman_state_floats(const KalmanConfig* c) {
    return (size_t)(c->K - 1) * c->Dk + 2 * (size_t)c->Dk * c->N;
}

static void kalman_state_point(KalmanState* s, float* base, const KalmanConfig* c) {
    s->conv = base;
    s->lam = base + (size_t)(c->K - 1) * c->Dk;
    s->eta = s->lam + (size_t)c->Dk * c->N;
}

static void kalman_state_reset(KalmanState* s, const KalmanConfig* c) {
    memset(s->conv, 0, (size_t)(c->K - 1) * c->Dk * sizeof(float));
    for (size_t i = 0; i < (size_t)c->Dk * c->N; i++) { s->lam[i] = 1.0f; s->eta[i] = 0.0f; }
}

// scratch of kalman_decode_step: h [2Dk], zc, u [Dk], s [Ws], ls, Lv [Dk], k, q [N], kn, qn, abar, pbar [Dk,N],
// ys, yg [Dk]
static size_t kalman_decode_scratch_floats(const KalmanConfig* c) {
    return (size_t)8 * c->Dk + kalman_Ws(c) + 2 * c->N + 2 + 2 * (size_t)c->Dk * c->N;
}

static void kalman_decode_step(float* out, KalmanState* s, const KalmanParams* p, const float* x, float* scratch,
                               const KalmanConfig* c) {
    const int Dk = c->Dk, N = c->N, K = c->K, Ws = kalman_Ws(c);
    float* h = scratch;
    float* zc = h + 2 * Dk;
    float* u = zc + Dk;
    float* sr = u + Dk;
    float* ls = sr + Ws;
    float* Lv = ls + Dk;
    float* k = Lv + Dk;
    float* q = k + N;
    float* kn = q + N;
    float* qn = kn + 1;
    float* abar = qn + 1;
    float* pbar = abar + (size_t)Dk * N;
    float* ys = pbar + (size_t)Dk * N;
    float* yg = ys + Dk;
    matmul_forward(h, x, p->in_proj_w, NULL, 1, c->C, 2 * Dk);
    kalman_conv_row(zc, h, 0, s->conv, p->conv_w, p->conv_b, Dk, K);
    if (K > 1) {
        memmove(s->conv, s->conv + Dk, (size_t)(K - 2) * Dk * sizeof(float));
        memcpy(s->conv + (size_t)(K - 2) * Dk, h, (size_t)Dk * sizeof(float));
    }
    for (int d = 0; d < Dk; d++) { u[d] = zc[d] * sigmoidf(zc[d]); }
    matmul_forward(sr, u, p->sensor_w, NULL, 1, Dk, Ws);
    if (c->preset) { matmul_forward(ls, sr, p->var_w, NULL, 1, c->R, Dk); }
    else { memcpy(ls, sr + Dk, (size_t)Dk * sizeof(float)); }
    kalman_sensor_row(k, q, kn, qn, Lv, sr, ls, c);
    kalman_dynamics(abar, pbar, p, Dk, N);
    const float* v = c->preset ? u : sr;
    for (int d = 0; d < Dk; d++) {
        ys[d] = kalman_step(s->lam + (size_t)d * N, s->eta + (size_t)d * N, v[d], Lv[d], k, q,
                            abar + (size_t)d * N, pbar + (size_t)d * N, N);
    }
    kalman_gate_row(yg, ys, u, h + Dk, p->lambda_skip[0], Dk);
    matmul_forward(out, yg, p->out_proj_w, NULL, 1, Dk, c->C);
}

// ----------------------------------------------------------------------------------------------------------
// each family's settings from the config, built once per layer by model_build (chunk: the --chunk flag)

static KalmanConfig kalman_config(const Config* c, int layer, int chunk) {
    (void)layer;
    KalmanConfig k;
    k.C = c->channels;
    k.Dk = c->kalman_expand * c->channels;
    k.N = c->kalman_n;
    k.K = c->conv_size;
    k.preset = c->kalman_preset;
    k.R = c->kalman_rank;
    k.chunk = chunk;
    return k;
}

static GKAConfig gka_config(const Config* c, int layer, int chunk) {
    (void)layer;
    GKAConfig g;
    g.C = c->channels;
    g.H = c->lin_heads;
    g.Hkv = c->gka_kv_heads;
    g.dk = c->lin_dk;
    g.dv = c->lin_dv;
    g.W = c->conv_size;
    g.iters = c->gka_iters;
    g.ridge = c->gka_ridge;
    g.onorm_eps = c->gka_onorm_eps;
    g.chunk = chunk;
    return g;
}

static PDNConfig pdn_config(const Config* c, int layer, int chunk) {
    PDNConfig p;
    p.C = c->channels;
    p.H = c->lin_heads;
    p.dk = c->lin_dk;
    p.dv = c->lin_dv;
    p.W = c->conv_size;
    p.variant = c->mixer[layer] == MIXER_PDN ? 0 : c->mixer[layer] == MIXER_PGDN ? 1 : 2;
    p.x = c->precond_x;
    p.precond_eps = c->precond_eps;
    p.onorm_eps = c->precond_onorm_eps;
    p.l2norm_eps = c->l2norm_eps;
    p.chunk = chunk;
    return p;
}

static GDNConfig gdn_config(const Config* c, int layer, int chunk) {
    GDNConfig g;
    g.C = c->channels;
    g.H = c->lin_heads;
    g.dk = c->lin_dk;
    g.dv = c->lin_dv;
    g.W = c->conv_size;
    g.kaczmarz = c->mixer[layer] == MIXER_KACZMARZ;
    g.l2norm_eps = c->l2norm_eps;
    g.onorm_eps = c->onorm_eps;
    g.kaczmarz_eps = c->kaczmarz_eps;
    g.chunk = chunk;
    return g;
}

// ----------------------------------------------------------------------------------------------------------
// attn, in the shape of the recurrent families: GPT-2's qkv projection, causal softmax attention, output
// projection. Its decode state is a KV cache of max_len rows.

typedef struct {
    int C, NH;
} AttnConfig;

typedef struct {
    float *qkv, *atty, *att;  // (B,T,3C), (B,T,C), (B,NH,T,T) the probabilities
} AttnActs;

typedef struct {
    int max_len;
    float *kcache, *vcache;   // (max_len, C)
} AttnState;

static AttnConfig attn_config(const Config* c, int layer, int chunk) {
    (void)layer;
    (void)chunk;
    AttnConfig a = {c->channels, c->num_heads};
    return a;
}

static size_t attn_acts_floats(int B, int T, const AttnConfig* c) {
    return (size_t)B * T * 4 * c->C + (size_t)B * c->NH * T * T;
}

static void attn_acts_point(AttnActs* a, float* base, int B, int T, const AttnConfig* c) {
    size_t BT = (size_t)B * T;
    a->qkv = base;
    a->atty = a->qkv + BT * 3 * c->C;
    a->att = a->atty + BT * c->C;
}

// d(atty) (B,T,C), dqkv (B,T,3C), and T floats per thread for attention_backward
static size_t attn_scratch_floats(int B, int T, const AttnConfig* c) {
    return (size_t)B * T * 4 * c->C + (size_t)max_threads() * T;
}

static void attn_forward(float* out, AttnActs* a, const LayerParams* p, const float* x, int B, int T, const AttnConfig* c) {
    int C = c->C, BT = B * T;
    matmul_forward(a->qkv, x, p->qkvw, p->qkvb, BT, C, 3 * C);
    attention_forward(a->atty, a->att, a->qkv, B, T, C, c->NH);
    matmul_forward(out, a->atty, p->attprojw, p->attprojb, BT, C, C);
}

// dx += the layer's input gradient (the caller zeroes it), grads += its parameter gradients
static void attn_backward(float* dx, LayerParams* grads, const float* dout, const AttnActs* a, const LayerParams* p,
                          const float* x, float* scratch, int B, int T, const AttnConfig* c) {
    int C = c->C, BT = B * T;
    float *datty = scratch, *dqkv = datty + (size_t)BT * C, *thread_rows = dqkv + (size_t)BT * 3 * C;
    memset(datty, 0, (size_t)BT * C * sizeof(float));
    matmul_backward(datty, grads->attprojw, grads->attprojb, dout, a->atty, p->attprojw, BT, C, C);
    memset(dqkv, 0, (size_t)BT * 3 * C * sizeof(float));
    attention_backward(dqkv, datty, a->qkv, a->att, thread_rows, B, T, C, c->NH);
    matmul_backward(dx, grads->qkvw, grads->qkvb, dqkv, x, p->qkvw, BT, C, 3 * C);
}

static size_t attn_state_floats(const AttnConfig* c, int max_len) { return 2 * (size_t)max_len * c->C; }

static void attn_state_point(AttnState* s, float* base, const AttnConfig* c, int max_len) {
    s->max_len = max_len;
    s->kcache = base;
    s->vcache = base + (size_t)max_len * c->C;
}

// the token's qkv (3C), the scores of one head (max_len), the attention output (C)
static size_t attn_decode_scratch_floats(const AttnConfig* c, int max_len) { return 4 * (size_t)c->C + max_len; }

// the token at position t: its k and v join the cache at row t, its query attends over rows 0..t
static void attn_decode_step(float* out, AttnState* s, const LayerParams* p, const float* x, float* scratch, int t,
                             const AttnConfig* c) {
    int C = c->C, NH = c->NH, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    float *qkv = scratch, *att = qkv + 3 * C, *y = att + s->max_len;
    matmul_forward(qkv, x, p->qkvw, p->qkvb, 1, C, 3 * C);
    memcpy(s->kcache + (size_t)t * C, qkv + C, C * sizeof(float));
    memcpy(s->vcache + (size_t)t * C, qkv + 2 * C, C * sizeof(float));
    for (int h = 0; h < NH; h++) {
        const float* q = qkv + h * hs;
        float maxv = -INFINITY, sum = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
            att[t2] = dot8(q, s->kcache + (size_t)t2 * C + h * hs, hs) * scale;
            if (att[t2] > maxv) { maxv = att[t2]; }
        }
        for (int t2 = 0; t2 <= t; t2++) { att[t2] = expf(att[t2] - maxv); sum += att[t2]; }
        float* o = y + h * hs;
        for (int i = 0; i < hs; i++) { o[i] = 0.0f; }
        for (int t2 = 0; t2 <= t; t2++) {
            const float* v = s->vcache + (size_t)t2 * C + h * hs;
            for (int i = 0; i < hs; i++) { o[i] += att[t2] / sum * v[i]; }
        }
    }
    matmul_forward(out, y, p->attprojw, p->attprojb, 1, C, C);
}

// ----------------------------------------------------------------------------------------------------------
// the mixer table (DESIGN.md "Mixers are modules"): the model knows a mixer only through its row. Each layer
// keeps three blocks that its row owns: its settings (built once, by model_build), its saved activations and its
// decode state, held in the unions below; the row's functions pick their family's member.

typedef union { AttnConfig attn; GDNConfig gdn; PDNConfig pdn; GKAConfig gka; KalmanConfig kalman; } MixerSettings;
typedef union { AttnActs attn; GDNActs gdn; PDNActs pdn; GKAActs gka; KalmanActs kalman; } MixerActs;
typedef union { AttnState attn; GDNState gdn; PDNState pdn; GKAState gka; KalmanState kalman; } MixerState;

typedef struct {
    const char* name;
    MixerSettings (*build)(const Config* c, int layer, int chunk);
    // saved activations of a B x T batch: their size, and pointing the layer's struct into a block of that size
    size_t (*acts_floats)(const MixerSettings* s, int B, int T);
    void (*acts_point)(MixerActs* a, float* base, const MixerSettings* s, int B, int T);
    // the backward's own scratch (one region reused by every layer)
    size_t (*scratch_floats)(const MixerSettings* s, int B, int T);
    // out (B,T,C) = mixer(x); the backward adds x's gradient into dx and the parameters' into grads
    void (*forward)(float* out, MixerActs* a, const LayerParams* p, const float* x, int B, int T, const MixerSettings* s);
    void (*backward)(float* dx, LayerParams* grads, const float* dout, const MixerActs* a, const LayerParams* p,
                     const float* x, float* scratch, int B, int T, const MixerSettings* s);
    // decode: the state for sequences of up to max_len tokens, its reset, the step's scratch, one token at t
    size_t (*state_floats)(const MixerSettings* s, int max_len);
    void (*state_point)(MixerState* st, float* base, const MixerSettings* s, int max_len);
    void (*state_reset)(MixerState* st, const MixerSettings* s);
    size_t (*decode_scratch_floats)(const MixerSettings* s, int max_len);
    void (*decode_step)(float* out, MixerState* st, const LayerParams* p, const float* x, float* scratch, int t,
                        const MixerSettings* s);
} MixerOps;

// attn's row: its functions take the layer's parameters whole and a max_len for the KV cache
static MixerSettings attn_row_build(const Config* c, int layer, int chunk) {
    MixerSettings s;
    s.attn = attn_config(c, layer, chunk);
    return s;
}
static size_t attn_row_acts_floats(const MixerSettings* s, int B, int T) { return attn_acts_floats(B, T, &s->attn); }
static void attn_row_acts_point(MixerActs* a, float* base, const MixerSettings* s, int B, int T) {
    attn_acts_point(&a->attn, base, B, T, &s->attn);
}
static size_t attn_row_scratch_floats(const MixerSettings* s, int B, int T) { return attn_scratch_floats(B, T, &s->attn); }
static void attn_row_forward(float* out, MixerActs* a, const LayerParams* p, const float* x, int B, int T,
                             const MixerSettings* s) {
    attn_forward(out, &a->attn, p, x, B, T, &s->attn);
}
static void attn_row_backward(float* dx, LayerParams* g, const float* dout, const MixerActs* a, const LayerParams* p,
                              const float* x, float* scratch, int B, int T, const MixerSettings* s) {
    attn_backward(dx, g, dout, &a->attn, p, x, scratch, B, T, &s->attn);
}
static size_t attn_row_state_floats(const MixerSettings* s, int max_len) { return attn_state_floats(&s->attn, max_len); }
static void attn_row_state_point(MixerState* st, float* base, const MixerSettings* s, int max_len) {
    attn_state_point(&st->attn, base, &s->attn, max_len);
}
static void attn_row_state_reset(MixerState* st, const MixerSettings* s) { (void)st; (void)s; }  // rows 0..t are written before they are read
static size_t attn_row_decode_scratch_floats(const MixerSettings* s, int max_len) {
    return attn_decode_scratch_floats(&s->attn, max_len);
}
static void attn_row_decode_step(float* out, MixerState* st, const LayerParams* p, const float* x, float* scratch, int t,
                                 const MixerSettings* s) {
    attn_decode_step(out, &st->attn, p, x, scratch, t, &s->attn);
}
static const MixerOps ATTN_ROW = {"attn", attn_row_build, attn_row_acts_floats, attn_row_acts_point,
                                  attn_row_scratch_floats, attn_row_forward, attn_row_backward, attn_row_state_floats,
                                  attn_row_state_point, attn_row_state_reset, attn_row_decode_scratch_floats,
                                  attn_row_decode_step};

// The row of a recurrent family `fam` whose functions have gdn's shape (fam_config, fam_acts_floats,
// fam_acts_point, fam_scratch_floats, fam_forward, fam_backward, fam_state_floats, fam_state_point,
// fam_state_reset, fam_decode_scratch_floats, fam_decode_step, taking the family's own structs), and whose
// member is `fam` in LayerParams and in the unions above. The adapters only pick that member.
#define RECURRENT_MIXER_ROW(fam, ROW)                                                                              \
    static MixerSettings fam##_row_build(const Config* c, int layer, int chunk) {                                   \
        MixerSettings s;                                                                                           \
        s.fam = fam##_config(c, layer, chunk);                                                                     \
        return s;                                                                                                  \
    }                                                                                                              \
    static size_t fam##_row_acts_floats(const MixerSettings* s, int B, int T) { return fam##_acts_floats(B, T, &s->fam); } \
    static void fam##_row_acts_point(MixerActs* a, float* base, const MixerSettings* s, int B, int T) {            \
        fam##_acts_point(&a->fam, base, B, T, &s->fam);                                                            \
    }                                                                                                              \
    static size_t fam##_row_scratch_floats(const MixerSettings* s, int B, int T) {                                 \
        return fam##_scratch_floats(B, T, &s->fam);                                                                \
    }                                                                                                              \
    static void fam##_row_forward(float* out, MixerActs* a, const LayerParams* p, const float* x, int B, int T,   \
                                  const MixerSettings* s) {                                                        \
        fam##_forward(out, &a->fam, &p->fam, x, B, T, &s->fam);                                                    \
    }                                                                                                              \
    static void fam##_row_backward(float* dx, LayerParams* g, const float* dout, const MixerActs* a,              \
                                   const LayerParams* p, const float* x, float* scratch, int B, int T,             \
                                   const MixerSettings* s) {                                                       \
        fam##_backward(dx, &g->fam, dout, &a->fam, &p->fam, x, scratch, B, T, &s->fam);                           \
    }                                                                                                              \
    static size_t fam##_row_state_floats(const MixerSettings* s, int max_len) {                                    \
        (void)max_len;                                                                                             \
        return fam##_state_floats(&s->fam);                                                                        \
    }                                                                                                              \
    static void fam##_row_state_point(MixerState* st, float* base, const MixerSettings* s, int max_len) {          \
        (void)max_len;                                                                                             \
        fam##_state_point(&st->fam, base, &s->fam);                                                                \
    }                                                                                                              \
    static void fam##_row_state_reset(MixerState* st, const MixerSettings* s) { fam##_state_reset(&st->fam, &s->fam); } \
    static size_t fam##_row_decode_scratch_floats(const MixerSettings* s, int max_len) {                           \
        (void)max_len;                                                                                             \
        return fam##_decode_scratch_floats(&s->fam);                                                               \
    }                                                                                                              \
    static void fam##_row_decode_step(float* out, MixerState* st, const LayerParams* p, const float* x,           \
                                      float* scratch, int t, const MixerSettings* s) {                             \
        (void)t;                                                                                                   \
        fam##_decode_step(out, &st->fam, &p->fam, x, scratch, &s->fam);                                            \
    }                                                                                                              \
    static const MixerOps ROW = {#fam, fam##_row_build, fam##_row_acts_floats, fam##_row_acts_point,                \
                                 fam##_row_scratch_floats, fam##_row_forward, fam##_row_backward,                  \
                                 fam##_row_state_floats, fam##_row_state_point, fam##_row_state_reset,             \
                                 fam##_row_decode_scratch_floats, fam##_row_decode_step};

RECURRENT_MIXER_ROW(gdn, GDN_ROW)
RECURRENT_MIXER_ROW(pdn, PDN_ROW)
RECURRENT_MIXER_ROW(gka, GKA_ROW)
RECURRENT_MIXER_ROW(kalman, KALMAN_ROW)
#undef RECURRENT_MIXER_ROW

// indexed by MIXER_* of model.h
static const MixerOps* const MIXER_TABLE[NUM_MIXERS] = {
    &ATTN_ROW,    // attn
    &GDN_ROW,     // gdn
    &GDN_ROW,     // kaczmarz
    &PDN_ROW,     // pdn
    &PDN_ROW,     // pgdn
    &PDN_ROW,     // pkda
    &GKA_ROW,     // gka
    &KALMAN_ROW,  // kalman
};

// ----------------------------------------------------------------------------------------------------------
// the model: parameters, gradients, AdamW state, activations

typedef struct {
    float *ln1, *ln1_mean, *ln1_rstd;  // (B,T,C), (B,T), (B,T): LN1 output = the mixer input
    MixerActs mixer;                    // what the layer's mixer saves for its backward (its row's member)
    float* residual2;                   // (B,T,C) residual after the mixer
    float *ln2, *ln2_mean, *ln2_rstd;   // NULL without an MLP
    float* fch;                         // (B,T,Hm) or (B,T,2Hm) for SwiGLU: the MLP's fc output
    float* fch_act;                     // (B,T,Hm) after GELU / SwiGLU
    float* residual3;                   // (B,T,C) block output (= residual2 without an MLP)
} LayerActivations;

typedef struct {
    float* encoded;  // (B,T,C)
    LayerActivations layer[MAX_LAYERS];
    float *lnf, *lnf_mean, *lnf_rstd;
    float* logits;   // (B,T,Vp); the backward overwrites it with dlogits
    float* probs;    // (B,T,Vp)
    float* losses;   // (B,T)
    float* block_out;  // (B,T,C) a sublayer's output before it is added to the residual (not needed by the backward)
} Activations;

// the backward's working memory, shared by all layers (llm.c keeps a full mirror of the activations instead)
typedef struct {
    float *dresidual, *dln;         // (B,T,C)
    float *dfch, *dfch_act;         // like fch and fch_act
    float* mixer;                   // the mixers' backward scratch, the largest over the layers
} BackwardScratch;

typedef struct {
    Config config;
    TensorTable table;
    ParameterTensors params, grads;
    float *params_memory, *grads_memory, *m_memory, *v_memory;
    size_t num_parameters;
    int chunk;                 // --chunk: gdn/kaczmarz chunk length, the other recurrent mixers' checkpoint interval
    const MixerOps* mixer[MAX_LAYERS];   // each layer's row of MIXER_TABLE
    MixerSettings settings[MAX_LAYERS];  // each layer's mixer settings, built once by model_build
    int B, T;                  // the activations are sized for this batch
    Activations acts;
    BackwardScratch scratch;
    float *acts_memory, *scratch_memory;
    const int* inputs;         // of the last forward
    const int* targets;
    float mean_loss;           // of the last forward with targets: the mean over its labelled positions
    int num_labelled;          // positions of the last forward whose target is >= 0 (negative = ignored)
    double step_loss;          // the sum model_accumulate_loss makes, read by model_take_step_loss
} Model;


// bump allocator over one block: with base == NULL it only counts
static float* carve(float* base, size_t* cursor, size_t n) {
    float* p = base ? base + *cursor : NULL;
    *cursor += n;
    return p;
}

static size_t layout_activations(Model* m, float* base, int B, int T) {
    const Config* c = &m->config;
    size_t C = c->channels, BT = (size_t)B * T, Vp = c->padded_vocab_size, cur = 0;
    Activations* a = &m->acts;
    a->encoded = carve(base, &cur, BT * C);
    for (int l = 0; l < c->num_layers; l++) {
        LayerActivations* la = &a->layer[l];
        memset(la, 0, sizeof(*la));
        la->ln1 = carve(base, &cur, BT * C);
        la->ln1_mean = carve(base, &cur, BT);
        la->ln1_rstd = carve(base, &cur, BT);
        float* mixer_acts = carve(base, &cur, m->mixer[l]->acts_floats(&m->settings[l], B, T));
        if (base) { m->mixer[l]->acts_point(&la->mixer, mixer_acts, &m->settings[l], B, T); }
        la->residual2 = carve(base, &cur, BT * C);
        if (c->mlp == MLP_NONE) {
            la->residual3 = la->residual2;
            continue;
        }
        size_t Hm = c->mlp_hidden;
        la->ln2 = carve(base, &cur, BT * C);
        la->ln2_mean = carve(base, &cur, BT);
        la->ln2_rstd = carve(base, &cur, BT);
        la->fch = carve(base, &cur, BT * Hm * (c->mlp == MLP_SWIGLU ? 2 : 1));
        la->fch_act = carve(base, &cur, BT * Hm);
        la->residual3 = carve(base, &cur, BT * C);
    }
    a->lnf = carve(base, &cur, BT * C);
    a->lnf_mean = carve(base, &cur, BT);
    a->lnf_rstd = carve(base, &cur, BT);
    a->logits = carve(base, &cur, BT * Vp);
    a->probs = carve(base, &cur, BT * Vp);
    a->losses = carve(base, &cur, BT);
    a->block_out = carve(base, &cur, BT * C);
    return cur;
}

static size_t layout_scratch(Model* m, float* base, int B, int T) {
    const Config* c = &m->config;
    size_t C = c->channels, BT = (size_t)B * T, cur = 0, mixer = 0;
    BackwardScratch* s = &m->scratch;
    s->dresidual = carve(base, &cur, BT * C);
    s->dln = carve(base, &cur, BT * C);
    size_t Hm = c->mlp_hidden;
    s->dfch = carve(base, &cur, BT * Hm * (c->mlp == MLP_SWIGLU ? 2 : 1));
    s->dfch_act = carve(base, &cur, BT * Hm);
    for (int l = 0; l < c->num_layers; l++) {
        size_t n = m->mixer[l]->scratch_floats(&m->settings[l], B, T);
        if (n > mixer) { mixer = n; }
    }
    s->mixer = carve(base, &cur, mixer);
    return cur;
}

// Allocate parameters and gradients for a config (the parameters are left for the caller to fill).
static void model_build(Model* m, const Config* c, int chunk) {
    memset(m, 0, sizeof(*m));
    m->config = *c;
    m->chunk = chunk;
    for (int l = 0; l < c->num_layers; l++) {
        m->mixer[l] = MIXER_TABLE[c->mixer[l]];
        m->settings[l] = m->mixer[l]->build(c, l, chunk);
    }
    build_parameter_layout(c, &m->table, NULL, NULL);
    m->num_parameters = m->table.num_parameters;
    m->params_memory = (float*)calloc_or_die(m->num_parameters, sizeof(float));
    m->grads_memory = (float*)calloc_or_die(m->num_parameters, sizeof(float));
    build_parameter_layout(c, &m->table, &m->params, m->params_memory);
    build_parameter_layout(c, &m->table, &m->grads, m->grads_memory);
}

// Load a model file (FORMATS.md) into m, allocated here.
static void model_load(Model* m, const char* path, int chunk) {
    Config c;
    TensorTable tt;
    FILE* f = open_model_file(path, &c, &tt);
    model_build(m, &c, chunk);
    read_model_payload(f, path, m->params_memory, m->num_parameters);
}

static void model_free(Model* m) {
    free(m->params_memory);
    free(m->grads_memory);
    free(m->m_memory);
    free(m->v_memory);
    free(m->acts_memory);
    free(m->scratch_memory);
}

// (Re)size the activations and the backward scratch for a batch of B sequences of T tokens.
static void model_size_activations(Model* m, int B, int T) {
    if (m->acts_memory && m->B == B && m->T == T) { return; }
    free(m->acts_memory);
    free(m->scratch_memory);
    m->B = B;
    m->T = T;
    size_t na = layout_activations(m, NULL, B, T), ns = layout_scratch(m, NULL, B, T);
    m->acts_memory = (float*)malloc_or_die(na * sizeof(float));
    m->scratch_memory = (float*)malloc_or_die(ns * sizeof(float));
    layout_activations(m, m->acts_memory, B, T);
    layout_scratch(m, m->scratch_memory, B, T);
}

// The block and final norms: LayerNorm with bias or RMSNorm without (mean unused then).
static void norm_forward(const Config* c, float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, int N) {
    if (c->norm == NORM_RMSNORM) {
        rmsnorm_forward(out, rstd, inp, w, N, c->channels, c->norm_eps);
    } else {
        layernorm_forward(out, mean, rstd, inp, w, b, N, c->channels, c->norm_eps);
    }
}

static void norm_backward(const Config* c, float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, int N) {
    if (c->norm == NORM_RMSNORM) {
        rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, c->channels);
    } else {
        layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, c->channels);
    }
}

// The block's MLP: out = proj(act(fc(inp))), act = GELU or SwiGLU; keeps fc's output (pre) and act's (hidden).
static void mlp_forward(const Config* c, float* out, float* pre, float* hidden, const LayerParams* lp, const float* inp, int N) {
    int C = c->channels, Hm = c->mlp_hidden;
    if (c->mlp == MLP_GELU) {
        matmul_forward(pre, inp, lp->fcw, lp->fcb, N, C, Hm);
        gelu_forward(hidden, pre, (size_t)N * Hm);
    } else {
        matmul_forward(pre, inp, lp->fcw, NULL, N, C, 2 * Hm);
        swiglu_forward(hidden, pre, N, Hm);
    }
    matmul_forward(out, hidden, lp->fcprojw, lp->fcprojb, N, Hm, C);
}

// dinp += the MLP's input gradient, lg += its parameter gradients. dpre, dhidden: scratch like pre, hidden.
static void mlp_backward(const Config* c, float* dinp, LayerParams* lg, const float* dout, const float* pre,
                         const float* hidden, const LayerParams* lp, const float* inp, float* dpre, float* dhidden, int N) {
    int C = c->channels, Hm = c->mlp_hidden, P = c->mlp == MLP_SWIGLU ? 2 * Hm : Hm;
    memset(dhidden, 0, (size_t)N * Hm * sizeof(float));
    matmul_backward(dhidden, lg->fcprojw, lg->fcprojb, dout, hidden, lp->fcprojw, N, Hm, C);
    memset(dpre, 0, (size_t)N * P * sizeof(float));
    if (c->mlp == MLP_GELU) {
        gelu_backward(dpre, pre, dhidden, (size_t)N * Hm);
    } else {
        swiglu_backward(dpre, pre, dhidden, N, Hm);
    }
    matmul_backward(dinp, lg->fcw, lg->fcb, dpre, inp, lp->fcw, N, C, P);
}

// Forward pass. With targets, m->mean_loss is the mean cross-entropy over the labelled positions: all B*T for
// token shards; a task's targets mark the positions that cost nothing with a negative id (TASK_IGNORE, tasks.h).
static void model_forward(Model* m, const int* inputs, const int* targets, int B, int T) {
    const Config* c = &m->config;
    int C = c->channels, V = c->vocab_size, Vp = c->padded_vocab_size, BT = B * T;
    for (int i = 0; i < BT; i++) {
        if (inputs[i] < 0 || inputs[i] >= V) { die("input token %d at position %d is outside [0, %d)", inputs[i], i, V); }
        if (targets && targets[i] >= V) { die("target token %d at position %d is outside [0, %d)", targets[i], i, V); }
    }
    if (config_has_wpe(c) && T > c->max_seq_len) {
        die("sequence length %d exceeds the model's max_seq_len %d", T, c->max_seq_len);
    }
    model_size_activations(m, B, T);
    m->inputs = inputs;
    m->targets = targets;
    ParameterTensors* p = &m->params;
    Activations* a = &m->acts;
    encoder_forward(a->encoded, inputs, p->wte, p->wpe, B, T, C);
    for (int l = 0; l < c->num_layers; l++) {
        LayerParams* lp = &p->layer[l];
        LayerActivations* la = &a->layer[l];
        const float* residual = l == 0 ? a->encoded : a->layer[l - 1].residual3;
        norm_forward(c, la->ln1, la->ln1_mean, la->ln1_rstd, residual, lp->ln1w, lp->ln1b, BT);
        m->mixer[l]->forward(a->block_out, &la->mixer, lp, la->ln1, B, T, &m->settings[l]);
        residual_forward(la->residual2, residual, a->block_out, (size_t)BT * C);
        if (c->mlp != MLP_NONE) {
            norm_forward(c, la->ln2, la->ln2_mean, la->ln2_rstd, la->residual2, lp->ln2w, lp->ln2b, BT);
            mlp_forward(c, a->block_out, la->fch, la->fch_act, lp, la->ln2, BT);
            residual_forward(la->residual3, la->residual2, a->block_out, (size_t)BT * C);
        }
    }
    const float* last = a->layer[c->num_layers - 1].residual3;
    norm_forward(c, a->lnf, a->lnf_mean, a->lnf_rstd, last, p->lnfw, p->lnfb, BT);
    matmul_forward(a->logits, a->lnf, p->wte, NULL, BT, C, Vp);
    softmax_crossentropy_forward(a->probs, a->losses, a->logits, targets, BT, V, Vp);
    if (targets) {
        double sum = 0.0;
        int n = 0;
        for (int i = 0; i < BT; i++) { sum += a->losses[i]; n += targets[i] >= 0; }
        m->num_labelled = n;
        m->mean_loss = n > 0 ? (float)(sum / n) : 0.0f;  // a batch without labels costs nothing
    }
}

static void model_zero_grad(Model* m) { memset(m->grads_memory, 0, m->num_parameters * sizeof(float)); }

// Backward of the last forward (which must have had targets). Gradients accumulate into m->grads, scaled so
// that `loss_scale` = 1/(number of micro-batches) gives the gradient of the mean of the micro-batches' mean
// losses (each a mean over its labelled positions).
static void model_backward(Model* m, float loss_scale) {
    const Config* c = &m->config;
    int B = m->B, T = m->T, C = c->channels, V = c->vocab_size, Vp = c->padded_vocab_size, BT = B * T;
    if (m->targets == NULL) { die("internal: model_backward needs a forward pass with targets"); }
    ParameterTensors *p = &m->params, *g = &m->grads;
    Activations* a = &m->acts;
    BackwardScratch* s = &m->scratch;
    size_t btc = (size_t)BT * C * sizeof(float);
    // classifier: dlogits overwrite the logits; dlnf -> dresidual
    softmax_crossentropy_backward(a->logits, a->probs, m->targets, m->num_labelled > 0 ? loss_scale / m->num_labelled : 0.0f, BT, V, Vp);
    memset(s->dln, 0, btc);
    matmul_backward(s->dln, g->wte, NULL, a->logits, a->lnf, p->wte, BT, C, Vp);
    memset(s->dresidual, 0, btc);
    const float* last = a->layer[c->num_layers - 1].residual3;
    norm_backward(c, s->dresidual, g->lnfw, g->lnfb, s->dln, last, p->lnfw, a->lnf_mean, a->lnf_rstd, BT);
    for (int l = c->num_layers - 1; l >= 0; l--) {
        LayerParams *lp = &p->layer[l], *lg = &g->layer[l];
        LayerActivations* la = &a->layer[l];
        const float* residual = l == 0 ? a->encoded : a->layer[l - 1].residual3;
        // MLP: residual3 = residual2 + mlp(ln2(residual2)); dresidual passes through the add
        if (c->mlp != MLP_NONE) {
            memset(s->dln, 0, btc);
            mlp_backward(c, s->dln, lg, s->dresidual, la->fch, la->fch_act, lp, la->ln2, s->dfch, s->dfch_act, BT);
            norm_backward(c, s->dresidual, lg->ln2w, lg->ln2b, s->dln, la->residual2, lp->ln2w, la->ln2_mean, la->ln2_rstd, BT);
        }
        // mixer: residual2 = residual + mixer(ln1(residual))
        memset(s->dln, 0, btc);
        m->mixer[l]->backward(s->dln, lg, s->dresidual, &la->mixer, lp, la->ln1, s->mixer, B, T, &m->settings[l]);
        norm_backward(c, s->dresidual, lg->ln1w, lg->ln1b, s->dln, residual, lp->ln1w, la->ln1_mean, la->ln1_rstd, BT);
    }
    encoder_backward(g->wte, g->wpe, s->dresidual, m->inputs, B, T, C);
}

// Global L2 norm of all gradients. Partial sums over fixed slices, added in order: the result does not
// depend on the thread schedule.
static float model_grad_norm(const Model* m) {
    enum { SLICES = 256 };
    double partial[SLICES];
    size_t n = m->num_parameters, per = (n + SLICES - 1) / SLICES;
#pragma omp parallel for
    for (int s = 0; s < SLICES; s++) {
        double acc = 0.0;
        size_t end = (size_t)(s + 1) * per < n ? (size_t)(s + 1) * per : n;
        for (size_t i = (size_t)s * per; i < end; i++) { acc += (double)m->grads_memory[i] * m->grads_memory[i]; }
        partial[s] = acc;
    }
    double sum = 0.0;
    for (int s = 0; s < SLICES; s++) { sum += partial[s]; }
    return (float)sqrt(sum);
}

// AdamW with bias correction and decoupled weight decay on the decayed tensors only, each tensor at its
// learning-rate group's rate (FORMATS.md);
// the gradient is multiplied by grad_scale first (global-norm clipping). t is the 1-based update count.
static void model_update(Model* m, float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale, int t) {
    if (m->m_memory == NULL) {
        m->m_memory = (float*)calloc_or_die(m->num_parameters, sizeof(float));
        m->v_memory = (float*)calloc_or_die(m->num_parameters, sizeof(float));
    }
    float bc1 = 1.0f - powf(beta1, (float)t), bc2 = 1.0f - powf(beta2, (float)t);
    for (int k = 0; k < m->table.num_tensors; k++) {
        const TensorInfo* ti = &m->table.t[k];
        float wd = ti->decay ? weight_decay : 0.0f, tensor_lr = lr * ti->lr_scale;
        float *p = m->params_memory + ti->offset, *gr = m->grads_memory + ti->offset;
        float *mm = m->m_memory + ti->offset, *vv = m->v_memory + ti->offset;
#pragma omp parallel for
        for (size_t i = 0; i < ti->numel; i++) {
            float g = gr[i] * grad_scale;
            mm[i] = beta1 * mm[i] + (1.0f - beta1) * g;
            vv[i] = beta2 * vv[i] + (1.0f - beta2) * g * g;
            float mhat = mm[i] / bc1, vhat = vv[i] / bc2;
            p[i] -= tensor_lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
        }
    }
}

// ----------------------------------------------------------------------------------------------------------
// decoding one token at a time: each layer's mixer keeps its state (a KV cache for attn, the recurrent state of
// the others, spec 4 of each), the trunk its per-step vectors

typedef struct {
    int max_len;  // tokens the KV caches hold
    int pos;      // tokens consumed so far
    MixerState layer[MAX_LAYERS];  // each layer's mixer state (its row's member)
    float *x, *ln, *stats, *y, *hidden, *pre, *logits, *mixer_scratch;
    float* memory;
} DecodeState;

static size_t layout_decode(const Model* m, DecodeState* d, float* base, int max_len) {
    const Config* c = &m->config;
    size_t C = c->channels, cur = 0, mixer_scratch = 0;
    for (int l = 0; l < c->num_layers; l++) {
        const MixerOps* ops = m->mixer[l];
        float* s = carve(base, &cur, ops->state_floats(&m->settings[l], max_len));
        if (base) { ops->state_point(&d->layer[l], s, &m->settings[l], max_len); }
        size_t n = ops->decode_scratch_floats(&m->settings[l], max_len);
        if (n > mixer_scratch) { mixer_scratch = n; }
    }
    d->x = carve(base, &cur, C);
    d->ln = carve(base, &cur, C);
    d->stats = carve(base, &cur, 2);
    d->y = carve(base, &cur, C);
    size_t Hm = c->mlp_hidden;
    d->hidden = carve(base, &cur, Hm);
    d->pre = carve(base, &cur, 2 * Hm);
    d->logits = carve(base, &cur, (size_t)c->padded_vocab_size);
    d->mixer_scratch = carve(base, &cur, mixer_scratch);
    return cur;
}

static void decode_init(DecodeState* d, const Model* m, int max_len) {
    memset(d, 0, sizeof(*d));
    d->max_len = max_len;
    size_t n = layout_decode(m, d, NULL, max_len);
    d->memory = (float*)calloc_or_die(n, sizeof(float));
    layout_decode(m, d, d->memory, max_len);
    for (int l = 0; l < m->config.num_layers; l++) { m->mixer[l]->state_reset(&d->layer[l], &m->settings[l]); }
}

static void decode_free(DecodeState* d) { free(d->memory); }

// Feed one token; d->logits holds the next-token logits (Vp entries) afterwards.
static void model_decode_step(const Model* m, DecodeState* d, int token) {
    const Config* c = &m->config;
    int C = c->channels, t = d->pos;
    const ParameterTensors* p = &m->params;
    if (t >= d->max_len) { die("internal: decode past its %d-token capacity", d->max_len); }
    encoder_forward(d->x, &token, p->wte, NULL, 1, 1, C);
    if (p->wpe) { for (int i = 0; i < C; i++) { d->x[i] += p->wpe[(size_t)t * C + i]; } }
    for (int l = 0; l < c->num_layers; l++) {
        const LayerParams* lp = &p->layer[l];
        norm_forward(c, d->ln, d->stats, d->stats + 1, d->x, lp->ln1w, lp->ln1b, 1);
        m->mixer[l]->decode_step(d->y, &d->layer[l], lp, d->ln, d->mixer_scratch, t, &m->settings[l]);
        for (int i = 0; i < C; i++) { d->x[i] += d->y[i]; }
        if (c->mlp != MLP_NONE) {
            norm_forward(c, d->ln, d->stats, d->stats + 1, d->x, lp->ln2w, lp->ln2b, 1);
            mlp_forward(c, d->y, d->pre, d->hidden, lp, d->ln, 1);
            for (int i = 0; i < C; i++) { d->x[i] += d->y[i]; }
        }
    }
    norm_forward(c, d->ln, d->stats, d->stats + 1, d->x, p->lnfw, p->lnfb, 1);
    matmul_forward(d->logits, d->ln, p->wte, NULL, 1, C, c->padded_vocab_size);
    d->pos++;
}

// the mean loss of the last forward with targets (model_forward computed it)
static float model_mean_loss(Model* m) { return m->mean_loss; }

// ----------------------------------------------------------------------------------------------------------
// main: flags, the training loop, evaluation, sampling, checkpoints

#ifndef TESTING

// ---- what the training program of train_common.h asks of a trainer (its comment there)

static void trainer_open_model(Model* m, const char* path, const Options* opt) {
    if (path) {
        model_load(m, path, opt->chunk);
    } else {
        model_build(m, &opt->config, opt->chunk);
        init_parameters(m->params_memory, &m->config, &m->table, (uint64_t)opt->seed);
    }
}

// AdamW's moments (allocated here when the model has none yet) and the run state of a checkpoint's state file
static void model_read_state(Model* m, TrainState* s, const char* path) {
    if (m->m_memory == NULL) {
        m->m_memory = (float*)calloc_or_die(m->num_parameters, sizeof(float));
        m->v_memory = (float*)calloc_or_die(m->num_parameters, sizeof(float));
    }
    read_state_file(s, m->num_parameters, m->m_memory, m->v_memory, path);
}

static void model_write_checkpoint(const Model* m, const TrainState* s, const char* dir) {
    write_checkpoint(&m->config, &m->table, m->params_memory, m->m_memory, m->v_memory, s, dir);
}

// the labelled positions of the last forward (targets >= 0) and how many of them the logits' argmax predicts
static void model_count_correct(const Model* m, const int* targets, int N, long* labelled, long* correct) {
    task_count_correct(m->acts.logits, targets, N, m->config.vocab_size, m->config.padded_vocab_size, labelled, correct);
}

// the loss at each of the B*T positions of the last forward with targets (0 where the target is ignored)
static const float* model_position_losses(const Model* m) { return m->acts.losses; }

// the step's loss += the last forward's mean loss / micro_steps (train_kla.cu sums it on the device)
static void model_accumulate_loss(Model* m, int micro_steps) { m->step_loss += m->mean_loss / micro_steps; }

// the sum model_accumulate_loss made since the last call, and 0 for the next step
static double model_take_step_loss(Model* m) {
    double loss = m->step_loss;
    m->step_loss = 0.0;
    return loss;
}

static void trainer_describe(char* buf, size_t n, const Config* c) {
    (void)c;
    snprintf(buf, n, "CPU, fp32, %d threads", max_threads());
}

static double trainer_peak_flops(void) { return 0.0; }   // no MFU on a CPU
static void trainer_step_begin(Model* m) { (void)m; }
static void trainer_step_end(Model* m, int timed) { (void)m; (void)timed; }
static void trainer_finish(Model* m, int timed_steps) { (void)m; (void)timed_steps; }
static void trainer_memory(char* buf, size_t n) { (void)n; buf[0] = '\0'; }
// one process: nothing to share
static void trainer_ranks(int* rank, int* num_ranks) { *rank = 0; *num_ranks = 1; }
static void trainer_sum_over_ranks(double* values, int n) { (void)values; (void)n; }
static void model_reduce_gradients(Model* m) { (void)m; }

#include "train_common.h"

int main(int argc, char** argv) {
    Options opt;
    parse_options(&opt, argc, argv);
    require(opt.recompute == 0, "-r", "activation recomputation is an option of train_kla.cu (the CPU trainer keeps every activation)");
    require(opt.zero == 0, "-z", "ZeRO-1 shards AdamW's state over the GPUs of a train_kla.cu run (the CPU trainer is one process)");
    return train_main(&opt, argc, argv);
}
#endif // TESTING
