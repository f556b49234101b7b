/*
kernels/kalman_scan.cuh: the filter of the kalman mixer (spec/kalman.md 2.3-2.5) and its static dynamics (spec 1.3
step 6, backward 1.7). The CPU versions are kalman_filter_forward, kalman_filter_backward, kalman_dynamics and the
end of kalman_backward in train_kla.c.

A lane is (b, d, n). Per lane, with phi = Lv k^2 and r = v Lv k (spec 2.3, floors of spec 2.5):
    rho = 1 / max(max(abar^2, 1e-12) + pbar lam, 1e-12)
    eta <- abar rho eta + r,  lam <- lam rho + phi,  y[b,t,d] = sum_n q[n] eta[n] / max(lam[n], 1e-12)
    lam_0 = 1, eta_0 = 0 at the start of every sequence

This is spec 3.5's fused design: each lane runs its recurrence serially over T (or over its time segment, below),
its state (lam, eta) in fp32 registers in both builds. Training shapes give B * Dk * N >= 2.5e5 lanes, which fill
the GPU without time parallelism; small B and long T cut the sequence into segments (see "time segments"). A lane
group is G = N rounded up to a power of two threads of one warp (lanes n >= N idle with the identity step), so a
warp holds 32 / G channels and a block KALMAN_WARPS * 32 / G channels of one sequence.
- Tokens go in tiles of KALMAN_TILE = 32. The block stages a tile's inputs in shared memory, (Lv, u = v Lv, v, dy)
  per channel and (k, q) per state, and every lane then runs its 32 steps from there, unrolled; the next tile's
  loads are issued before the walk and land in shared memory after it.
- The read-out sum over a group is one butterfly over the tile (kalman_transpose_sum): each level exchanges half
  of the values still held, so 32 sums over 32 lanes cost 31 shuffles instead of 32 x 5.
- Reciprocals are the hardware's approximate ones (rel. error < 2^-22, below fp32 round-off of the sums here).
- The forward checkpoints (lam, eta) at the start of every tile. The backward (spec 2.4, the exact reverse-time
  adjoint) walks the tiles from the last to the first; it replays a tile from its checkpoint with the forward's
  own step function (so the replay reproduces the forward's states bit for bit) and steps the adjoint back
  through it in two halves of KALMAN_HALF tokens, each half's states held in registers.

Layouts (row-major): v [B*T, ldv] floatX (its first Dk columns), Lv, dys, dv, dLv [B*T, Dk] fp32, k, q, dk, dq
[B*T, N] fp32, abar, pbar, dabar, dpbar [Dk, N] fp32, checkpoints [B, NT, Dk, 2N] fp32 (lam | eta), NT tiles.

Determinism, no atomics: dk and dq (sums over the channels) are summed over a block's channels in channel order
through shared memory, written as one partial row per block, then summed over the blocks in order; dabar and dpbar
(sums over b and t) are summed over t in each thread and over b in order by a second kernel.
*/
#ifndef TRAIN_KLA_KERNELS_KALMAN_SCAN_CUH
#define TRAIN_KLA_KERNELS_KALMAN_SCAN_CUH

#include <type_traits>
#include "common.cuh"

#define KALMAN_FLOOR 1e-12f   // the floors of spec 2.5 (abar^2, den, lam, pbar) and the L2-norm floor
#define KALMAN_TILE 32        // tokens per tile: staged together, unrolled, and the checkpoint interval
#define KALMAN_HALF 16        // backward: tokens per register block (two per tile)
#define KALMAN_WARPS 8        // warps per block of the filter kernels
#define KALMAN_MAX_N 32       // the largest N the filter kernels run (a group of N lanes lives in one warp)

static inline int kalman_group(int N) {
    if (N < 1 || N > KALMAN_MAX_N) {
        die("--kalman-n: %d states per channel is not supported by train_kla.cu (1..%d; train_kla runs any N)", N,
            KALMAN_MAX_N);
    }
    int G = 1;
    while (G < 8) { G *= 2; }   // at least 8: a block then holds at most 32 channels (its shared tiles' size)
    while (G < N) { G *= 2; }
    return G;
}
// channels per block (a warp holds 32 / G), and tiles per sequence
__host__ __device__ constexpr int kalman_block_channels(int G) { return KALMAN_WARPS * 32 / G; }
__host__ __device__ inline int kalman_num_tiles(int T) { return (T + KALMAN_TILE - 1) / KALMAN_TILE; }
static inline int kalman_num_blocks(int Dk, int N) { return ceil_div(Dk, kalman_block_channels(kalman_group(N))); }

// the checkpoints the forward saves for the backward
static size_t kalman_checkpoint_floats(int B, int T, int Dk, int N) {
    return (size_t)B * kalman_num_tiles(T) * Dk * 2 * N;
}

__device__ __forceinline__ float kalman_rcp(float x) { return __fdividef(1.0f, x); }

// one step of a lane (spec 2.3); returns rho. The forward and the backward's replay both call it: the same states
// bit for bit.
__device__ __forceinline__ float kalman_lane_step(float& lam, float& eta, float a, float a2, float pb, float Lvt,
                                                  float ut, float kt) {
    const float rho = kalman_rcp(fmaxf(a2 + pb * lam, KALMAN_FLOOR));
    eta = a * rho * eta + ut * kt;
    lam = lam * rho + Lvt * kt * kt;
    return rho;
}

// Sums each of x[0..V) over the G lanes of a group (p: the lane's position in it) by a butterfly: at the level of
// offset O, a lane keeps the half of its CNT values picked by bit O of p and adds its partner's copy of that half.
// After it, for V >= G, x[j] (j < V / G) is the sum of value p * (V / G) + j; for V < G, x[0] is the sum of value
// p / (G / V). Float addition commutes, so each value is summed in the same tree wherever it sits in x.
template <int CNT, int O, int V>
__device__ __forceinline__ void kalman_butterfly(float (&x)[V], int p) {
    if constexpr (O >= 1) {
        if constexpr (CNT >= 2) {
            const bool upper = (p & O) != 0;
#pragma unroll
            for (int i = 0; i < CNT / 2; i++) {
                const float keep = upper ? x[CNT / 2 + i] : x[i], send = upper ? x[i] : x[CNT / 2 + i];
                x[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
            }
            kalman_butterfly<CNT / 2, O / 2>(x, p);
        } else {
            x[0] += __shfl_xor_sync(0xffffffffu, x[0], O);
            kalman_butterfly<1, O / 2>(x, p);
        }
    }
}
template <int G, int V>
__device__ __forceinline__ void kalman_transpose_sum(float (&x)[V], int p) { kalman_butterfly<V, G / 2>(x, p); }

// A tile's inputs as one thread holds them between kalman_load_tile and kalman_store_tile: (Lv, u = v Lv, v, dy) of
// 32 / G (token, channel) slots and (k, q) of G / 8 (token, state) slots of the block's tile.
template <int G> struct KalmanTileRegs {
    float4 chan[KALMAN_TILE * kalman_block_channels(G) / (KALMAN_WARPS * 32)];
    float2 kq[KALMAN_TILE * G / (KALMAN_WARPS * 32)];
};

// Loads tokens [t0, t0 + L) of sequence b into the thread's slots: slot e = threadIdx.x + j * blockDim of
// chan[i * CB + c] = (Lv, u, v, dy) of token i and channel d0 + c, kq[i * G + n] = (k, q) of state n; zeros past L,
// Dk and N (dys NULL: dy = 0). The kernels load the next tile before they walk the current one, so the loads'
// latency passes under the walk.
template <int G>
__device__ __forceinline__ void kalman_load_tile(KalmanTileRegs<G>& x, const floatX* v, int ldv, const float* Lv,
                                                 const float* k, const float* q, const float* dys, int b, int t0,
                                                 int L, int T, int d0, int Dk, int N) {
    constexpr int CB = kalman_block_channels(G), NC = sizeof(x.chan) / sizeof(float4), NK = sizeof(x.kq) / sizeof(float2);
#pragma unroll
    for (int j = 0; j < NC; j++) {
        const int e = threadIdx.x + j * KALMAN_WARPS * 32, i = e / CB, d = d0 + e % CB;
        x.chan[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (i < L && d < Dk) {
            const size_t r = (size_t)b * T + t0 + i;
            x.chan[j].x = Lv[r * Dk + d];
            x.chan[j].z = to_float(v[r * ldv + d]);
            x.chan[j].w = dys ? dys[r * Dk + d] : 0.0f;
        }
    }
#pragma unroll
    for (int j = 0; j < NK; j++) {
        const int e = threadIdx.x + j * KALMAN_WARPS * 32, i = e / G, n = e % G;
        x.kq[j] = make_float2(0.0f, 0.0f);
        if (i < L && n < N) {
            const size_t r = (size_t)b * T + t0 + i;
            x.kq[j] = make_float2(k[r * N + n], q[r * N + n]);
        }
    }
}
// ... and stores them into the shared tile, u = v Lv formed here
template <int G>
__device__ __forceinline__ void kalman_store_tile(float4* chan, float2* kq, const KalmanTileRegs<G>& x) {
    constexpr int NC = sizeof(x.chan) / sizeof(float4), NK = sizeof(x.kq) / sizeof(float2);
#pragma unroll
    for (int j = 0; j < NC; j++) {
        float4 c = x.chan[j];
        c.y = c.z * c.x;
        chan[threadIdx.x + j * KALMAN_WARPS * 32] = c;
    }
#pragma unroll
    for (int j = 0; j < NK; j++) { kq[threadIdx.x + j * KALMAN_WARPS * 32] = x.kq[j]; }
}

// the tokens a lane writes after kalman_transpose_sum of V values over a group of G: PER of them from position
// (p / SHARE) * PER, written by the lanes with p % SHARE == 0
template <int V, int G> struct KalmanSums {
    static constexpr int PER = V >= G ? V / G : 1, SHARE = V >= G ? 1 : G / V;
};

// ----------------------------------------------------------------------------------------------------------
// time segments (spec 3.5's two-level scan, for when B * Dk * N lanes do not fill the GPU: small B, long T)
//
// S segments of TPS tiles each, walked in parallel. The state entering segment s comes from summaries of the
// segments before it, made by passes over every segment but the last:
// - the precision map (spec 3.1): lam_out = (A lam_in + B) / (C lam_in + D), the product of the segment's Mobius
//   leaves A = (1 + pbar phi) / abar^2, B = phi, C = pbar / abar^2, D = 1 (the code's scaling; abar^2 floored as in
//   rho, whose other floor never binds: abar^2 + pbar lam >= 1e-12), trace-normalised after every token;
// - the information map (spec 3.2): eta_out = P eta_in + Q, from lam_in: P the product of the gates abar rho, Q the
//   segment's eta from eta_in = 0;
// - the backward's carry map (spec 3.5 BK1), affine and upper triangular in (Gl, Ge) entering the segment's end:
//   Ge_start = ae Ge + ce, Gl_start = al Gl + x Ge + cl.
// A segment folds the prior through the maps before it (the zero adjoint through those after it): O(S) per lane.
// The results equal one segment's up to fp32 round-off (the maps group the same products differently).

typedef struct { float ae, ce, al, x, cl; } KalmanCarry;   // a carry map (identity: 1, 0, 1, 0, 0)

// tiles per segment, and the segment count that leaves none empty
static inline int kalman_tiles_per_segment(int T, int S) { return ceil_div(kalman_num_tiles(T), S); }
static inline int kalman_effective_segments(int T, int S) {
    return ceil_div(kalman_num_tiles(T), kalman_tiles_per_segment(T, S));
}
// the forward's summaries: precision maps [B, S, Dk, N] float4 (A, B, C, D) | information maps [B, S, Dk, N] float2
static size_t kalman_filter_forward_scratch_bytes(int B, int Dk, int N, int S) {
    return S > 1 ? (size_t)B * S * Dk * N * (sizeof(float4) + sizeof(float2)) : 0;
}

// lam entering segment s: lam_0 = 1 through the precision maps of segments 0..s-1 (the lane's maps stride apart)
__device__ __forceinline__ float kalman_segment_lam(const float4* mob, size_t stride, int s) {
    float lam = 1.0f;
    for (int j = 0; j < s; j++) {
        const float4 m = mob[j * stride];
        lam = (m.x * lam + m.y) * kalman_rcp(m.z * lam + m.w);
    }
    return lam;
}
// eta entering segment s: eta_0 = 0 through the information maps of segments 0..s-1
__device__ __forceinline__ float kalman_segment_eta(const float2* aff, size_t stride, int s) {
    float eta = 0.0f;
    for (int j = 0; j < s; j++) {
        const float2 m = aff[j * stride];
        eta = m.x * eta + m.y;
    }
    return eta;
}

// ----------------------------------------------------------------------------------------------------------
// forward (spec 2.3) and the segment summaries, one kernel for the three passes over the tiles

enum { KALMAN_PASS_OUTPUT, KALMAN_PASS_PRECISION, KALMAN_PASS_INFORMATION };

// The steps of one tile of a lane. OUTPUT: the filter, y[i] = the read-out term q eta / lam of token i.
// PRECISION: the Mobius leaves composed into M. INFORMATION: the filter with the gates' product in P. FULL: all
// KALMAN_TILE tokens are in the sequence; else only the first L, and the rest leave the state as it is.
template <int G, int PASS, bool FULL>
__device__ __forceinline__ void kalman_forward_tile(float (&y)[KALMAN_TILE], float& lam, float& eta, float4& M,
                                                    float& P, const float4* chan, const float2* kq, int c, int p,
                                                    float a, float a2, float pb, int L) {
    constexpr int CB = kalman_block_channels(G);
    const float ia2 = kalman_rcp(a2);
#pragma unroll
    for (int i = 0; i < KALMAN_TILE; i++) {
        y[i] = 0.0f;
        if (FULL || i < L) {
            const float4 ch = chan[i * CB + c];
            const float2 kqt = kq[i * G + p];
            if constexpr (PASS == KALMAN_PASS_PRECISION) {
                const float phi = ch.x * kqt.x * kqt.x, A = (1.0f + pb * phi) * ia2, C = pb * ia2;   // B = phi, D = 1
                const float nA = A * M.x + phi * M.z, nB = A * M.y + phi * M.w, nC = C * M.x + M.z, nD = C * M.y + M.w;
                const float sc = kalman_rcp(fmaxf(nA + nD, KALMAN_FLOOR));
                M = make_float4(nA * sc, nB * sc, nC * sc, nD * sc);
            } else {
                const float rho = kalman_lane_step(lam, eta, a, a2, pb, ch.x, ch.y, kqt.x);
                if constexpr (PASS == KALMAN_PASS_INFORMATION) { P *= a * rho; }
                if constexpr (PASS == KALMAN_PASS_OUTPUT) { y[i] = kqt.y * eta * kalman_rcp(fmaxf(lam, KALMAN_FLOOR)); }
            }
        }
    }
}

// grid (NDB, B, segments: S for OUTPUT, S - 1 for the summaries), block KALMAN_WARPS * 32; segment s walks tiles
// [s TPS, (s + 1) TPS). OUTPUT: ys [B*T, Dk] written; ck: checkpoints (NULL: none); lam_io, eta_io [B, Dk, N] (S = 1
// only): NULL, every sequence starts from the prior; else the state carried in (the prior when from_prior) and the
// final state written back (decode, spec 4). The summaries: mob, aff [B, S, Dk, N] (read by OUTPUT and INFORMATION,
// written by PRECISION and INFORMATION).
template <int G, int PASS>
__global__ void __launch_bounds__(KALMAN_WARPS * 32, 3)
    kalman_filter_forward_kernel(float* ys, float* ck, float* lam_io, float* eta_io, int from_prior, float4* mob,
                                 float2* aff, int S, int TPS, const floatX* v, int ldv, const float* Lv, const float* k,
                                 const float* q, const float* abar, const float* pbar, int T, int Dk, int N) {
    constexpr int CB = kalman_block_channels(G);
    using Sums = KalmanSums<KALMAN_TILE, G>;
    __shared__ float4 chan[KALMAN_TILE * CB];
    __shared__ float2 kq[KALMAN_TILE * G];
    const int p = threadIdx.x % G, c = threadIdx.x / G, d0 = blockIdx.x * CB, d = d0 + c, b = blockIdx.y;
    const int s = blockIdx.z, active = p < N && d < Dk;
    const size_t lane = ((size_t)b * Dk + d) * N + p;
    const size_t seg0 = ((size_t)b * S * Dk + d) * N + p, seg_stride = (size_t)Dk * N;   // the lane's segment 0
    const int NT = kalman_num_tiles(T), tile_end = min(NT, (s + 1) * TPS);
    float a = 1.0f, pb = 0.0f, lam = 1.0f, eta = 0.0f, P = 1.0f;   // idle lanes step by the identity (rho = 1)
    float4 M = make_float4(1.0f, 0.0f, 0.0f, 1.0f);
    if (active) {
        a = abar[(size_t)d * N + p];
        pb = pbar[(size_t)d * N + p];
        if (lam_io && !from_prior) { lam = lam_io[lane]; eta = eta_io[lane]; }
        if (PASS != KALMAN_PASS_PRECISION && s > 0) { lam = kalman_segment_lam(mob + seg0, seg_stride, s); }
        if (PASS == KALMAN_PASS_OUTPUT && s > 0) { eta = kalman_segment_eta(aff + seg0, seg_stride, s); }
    }
    const float a2 = fmaxf(a * a, KALMAN_FLOOR);
    KalmanTileRegs<G> next;
    if (s * TPS < tile_end) {
        kalman_load_tile<G>(next, v, ldv, Lv, k, q, NULL, b, s * TPS * KALMAN_TILE,
                            min(KALMAN_TILE, T - s * TPS * KALMAN_TILE), T, d0, Dk, N);
    }
    for (int tile = s * TPS; tile < tile_end; tile++) {
        const int t0 = tile * KALMAN_TILE, L = min(KALMAN_TILE, T - t0);
        __syncthreads();   // the previous tile is read
        kalman_store_tile<G>(chan, kq, next);
        __syncthreads();
        if (tile + 1 < tile_end) {
            kalman_load_tile<G>(next, v, ldv, Lv, k, q, NULL, b, t0 + KALMAN_TILE,
                                min(KALMAN_TILE, T - t0 - KALMAN_TILE), T, d0, Dk, N);
        }
        if (PASS == KALMAN_PASS_OUTPUT && ck && active) {
            float* cp = ck + (((size_t)b * NT + tile) * Dk + d) * 2 * N;
            cp[p] = lam;
            cp[N + p] = eta;
        }
        float y[KALMAN_TILE];
        if (L == KALMAN_TILE) {
            kalman_forward_tile<G, PASS, true>(y, lam, eta, M, P, chan, kq, c, p, a, a2, pb, L);
        } else {
            kalman_forward_tile<G, PASS, false>(y, lam, eta, M, P, chan, kq, c, p, a, a2, pb, L);
        }
        if constexpr (PASS == KALMAN_PASS_OUTPUT) {
            kalman_transpose_sum<G>(y, p);
            if (p % Sums::SHARE == 0 && d < Dk) {
#pragma unroll
                for (int j = 0; j < Sums::PER; j++) {
                    const int i = p / Sums::SHARE * Sums::PER + j;
                    if (i < L) { ys[((size_t)b * T + t0 + i) * Dk + d] = y[j]; }
                }
            }
        }
    }
    if (active) {
        if (PASS == KALMAN_PASS_OUTPUT && lam_io) { lam_io[lane] = lam; eta_io[lane] = eta; }
        if (PASS == KALMAN_PASS_PRECISION) { mob[seg0 + s * seg_stride] = M; }
        if (PASS == KALMAN_PASS_INFORMATION) { aff[seg0 + s * seg_stride] = make_float2(P, eta); }
    }
}

// G as a compile-time constant: the butterfly and the tiles are unrolled for it
template <typename F> static void kalman_dispatch_group(int G, F&& launch) {
    switch (G) {
        case 8: launch(std::integral_constant<int, 8>{}); break;
        case 16: launch(std::integral_constant<int, 16>{}); break;
        default: launch(std::integral_constant<int, 32>{}); break;
    }
}

// S segments (kalman_segments picks them; 1 for decode, which passes lam_io). scratch:
// kalman_filter_forward_scratch_bytes(B, Dk, N, S) (NULL for S = 1).
static void kalman_filter_forward(float* ys, float* ck, float* lam_io, float* eta_io, int from_prior,
                                  const floatX* v, int ldv, const float* Lv, const float* k, const float* q,
                                  const float* abar, const float* pbar, int B, int T, int Dk, int N, int S,
                                  void* scratch, cudaStream_t stream) {
    const int TPS = kalman_tiles_per_segment(T, S), NDB = kalman_num_blocks(Dk, N);
    S = kalman_effective_segments(T, S);
    if (S > 1 && lam_io) { die("kalman_filter_forward: a carried state needs one segment"); }
    float4* mob = (float4*)scratch;
    float2* aff = (float2*)(mob + (S > 1 ? (size_t)B * S * Dk * N : 0));
    kalman_dispatch_group(kalman_group(N), [&](auto g) {
        constexpr int GV = decltype(g)::value;
        if (S > 1) {
            kalman_filter_forward_kernel<GV, KALMAN_PASS_PRECISION><<<dim3(NDB, B, S - 1), KALMAN_WARPS * 32, 0,
                                                                      stream>>>(
                NULL, NULL, NULL, NULL, 1, mob, aff, S, TPS, v, ldv, Lv, k, q, abar, pbar, T, Dk, N);
            cudaCheckLaunch();
            kalman_filter_forward_kernel<GV, KALMAN_PASS_INFORMATION><<<dim3(NDB, B, S - 1), KALMAN_WARPS * 32, 0,
                                                                        stream>>>(
                NULL, NULL, NULL, NULL, 1, mob, aff, S, TPS, v, ldv, Lv, k, q, abar, pbar, T, Dk, N);
            cudaCheckLaunch();
        }
        kalman_filter_forward_kernel<GV, KALMAN_PASS_OUTPUT><<<dim3(NDB, B, S), KALMAN_WARPS * 32, 0, stream>>>(
            ys, ck, lam_io, eta_io, from_prior, mob, aff, S, TPS, v, ldv, Lv, k, q, abar, pbar, T, Dk, N);
    });
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// backward (spec 2.4): exact reverse-time adjoint, no gradient of the final state; zero subgradient where a
// floor binds (spec 2.5)

// One token of the adjoint of a lane (spec 2.4), given lam_{t-1}, eta_{t-1} (lp, ep), lam_t, eta_t (lt, et),
// den = a2 + pbar lp, rho = 1 / max(den, floor) and var = 1 / max(lt, floor): carries (Gl, Ge) = dL/d(lam, eta)
// back over the token, adds its terms of dabar, dpbar to gab, gpb, and returns the lane's terms of dLv and dv
// (before the sum over the group), of dk and dq (before the sum over the channels).
struct KalmanAdjointTerms { float sLv, sv, cdk, cdq; };
__device__ __forceinline__ KalmanAdjointTerms kalman_adjoint_token(float& Gl, float& Ge, float& gab, float& gpb,
                                                                   float lp, float ep, float lt, float et, float denraw,
                                                                   float rho, float var, float a, float a2raw,
                                                                   float pb, float Lvt, float vt, float dy, float kk,
                                                                   float qt) {
    const float a2 = fmaxf(a2raw, KALMAN_FLOOR);
    const float gmean = dy * qt;
    const float ge = Ge + gmean * var;
    const float gl = lt > KALMAN_FLOOR ? Gl - gmean * et * var * var : Gl;
    // through den = a2 + pbar lam_{t-1}: gden = dL/dden
    const float gden = denraw > KALMAN_FLOOR ? -(gl * lp + ge * ep * a) * rho * rho : 0.0f;
    gab += ge * ep * rho + (a2raw > KALMAN_FLOOR ? 2.0f * a * gden : 0.0f);
    gpb += gden * lp;
    Gl = denraw > KALMAN_FLOOR ? (gl * a2 - ge * ep * a * pb) * rho * rho : gl * rho;
    Ge = a * rho * ge;
    // the token's inputs: phi = Lv k^2, r = v Lv k
    return {gl * kk * kk + ge * vt * kk, ge * kk, 2.0f * gl * Lvt * kk + ge * vt * Lvt, dy * et * var};
}

// The same token on the carry map m (spec 3.5 BK1): kalman_adjoint_token's (Gl, Ge) update with (Gl, Ge) the
// affine functions m of the carries entering the segment's end.
__device__ __forceinline__ void kalman_carry_token(KalmanCarry& m, float ep, float lt, float et, float denraw,
                                                   float rho, float var, float a, float a2raw, float pb, float dy,
                                                   float qt) {
    const float a2 = fmaxf(a2raw, KALMAN_FLOOR);
    const float gmean = dy * qt;
    m.ce += gmean * var;                                   // ge = ae Ge + ce
    if (lt > KALMAN_FLOOR) { m.cl -= gmean * et * var * var; }   // gl = al Gl + x Ge + cl
    if (denraw > KALMAN_FLOOR) {
        const float g = a2 * rho * rho, h = -ep * a * pb * rho * rho;   // Gl' = g gl + h ge
        m.al = g * m.al;
        m.x = g * m.x + h * m.ae;
        m.cl = g * m.cl + h * m.ce;
    } else {
        m.al *= rho;
        m.x *= rho;
        m.cl *= rho;
    }
    m.ae *= a * rho;                                       // Ge' = a rho ge
    m.ce *= a * rho;
}

// One half-tile of a lane, tokens [h0, h0 + L) of the staged tile (FULL: L = KALMAN_HALF): replay it from the state
// (lam, eta) at h0, then walk back through it. CARRY: the carry map m, else the adjoint (Gl, Ge) and per token the
// lane's terms of dLv and dv (sums over the group, left in sLv, sv), of dk and dq (sums over the block's channels,
// written to part[i * 2G + p], [i * 2G + G + p]), and of dabar, dpbar (summed over t in gab, gpb).
template <int G, bool CARRY, bool FULL>
__device__ __forceinline__ void kalman_backward_half(float (&sLv)[KALMAN_HALF], float (&sv)[KALMAN_HALF], float* part,
                                                     float lam, float eta, float& Gl, float& Ge, float& gab,
                                                     float& gpb, KalmanCarry& m, const float4* chan, const float2* kq,
                                                     int c, int p, float a, float a2raw, float pb, int h0, int L) {
    constexpr int CB = kalman_block_channels(G), H = KALMAN_HALF;
    const float a2 = fmaxf(a2raw, KALMAN_FLOOR);
    float sl[H + 1], se[H + 1];   // lam, eta before token h0 + i, and after the last
#pragma unroll
    for (int i = 0; i < H; i++) {
        sl[i] = lam;
        se[i] = eta;
        if (FULL || i < L) {
            const float4 ch = chan[(h0 + i) * CB + c];
            kalman_lane_step(lam, eta, a, a2, pb, ch.x, ch.y, kq[(h0 + i) * G + p].x);
        }
    }
    sl[H] = lam;
    se[H] = eta;
#pragma unroll
    for (int i = H - 1; i >= 0; i--) {
        sLv[i] = 0.0f;
        sv[i] = 0.0f;
        float cdk = 0.0f, cdq = 0.0f;
        if (FULL || i < L) {
            const float4 ch = chan[(h0 + i) * CB + c];
            const float2 kqt = kq[(h0 + i) * G + p];
            // the states around token i: lam_{t-1}, eta_{t-1} and lam_t, eta_t
            const float lp = sl[i], ep = se[i], lt = sl[i + 1], et = se[i + 1];
            const float denraw = a2 + pb * lp;
            const float rho = kalman_rcp(fmaxf(denraw, KALMAN_FLOOR)), var = kalman_rcp(fmaxf(lt, KALMAN_FLOOR));
            if constexpr (CARRY) {
                kalman_carry_token(m, ep, lt, et, denraw, rho, var, a, a2raw, pb, ch.w, kqt.y);
            } else {
                const KalmanAdjointTerms g = kalman_adjoint_token(Gl, Ge, gab, gpb, lp, ep, lt, et, denraw, rho, var,
                                                                  a, a2raw, pb, ch.x, ch.z, ch.w, kqt.x, kqt.y);
                sLv[i] = g.sLv;
                sv[i] = g.sv;
                cdk = g.cdk;
                cdq = g.cdq;
            }
        }
        if constexpr (!CARRY) {
            part[i * 2 * G + p] = cdk;
            part[i * 2 * G + G + p] = cdq;
        }
    }
}

// a channel's row of the backward's dk | dq terms, [KALMAN_HALF][2G] plus G floats, so that the 32 / G channels
// of a warp store to distinct banks
__host__ __device__ constexpr int kalman_part_ld(int G) { return KALMAN_HALF * 2 * G + G; }
static size_t kalman_backward_smem_bytes(int G) {
    const int CB = kalman_block_channels(G);
    return KALMAN_TILE * CB * sizeof(float4) + KALMAN_TILE * G * sizeof(float2) +
           (size_t)CB * kalman_part_ld(G) * sizeof(float);
}

// the backward's partial sums: dk | dq per (b, channel block, t) [B, NDB, T, 2N], dabar | dpbar per (b, segment, d)
// [B, S, Dk, 2N]; for S > 1 the carry maps [B, S, Dk, N] (ae, ce, al, x) float4 | cl float
static size_t kalman_filter_backward_scratch_bytes(int B, int T, int Dk, int N, int S) {
    return ((size_t)B * kalman_num_blocks(Dk, N) * T * 2 * N + (size_t)B * S * Dk * 2 * N) * sizeof(float) +
           (S > 1 ? (size_t)B * S * Dk * N * (sizeof(float4) + sizeof(float)) : 0);
}

// grid (NDB, B, segments), block KALMAN_WARPS * 32; segment s walks tiles [s TPS, (s + 1) TPS) back. CARRY: the
// carry maps of segments 1..S-1 (blockIdx.z + 1) into cmap, cmap_cl. Else the gradients, from the carries the maps
// of the later segments give: dv, dLv [B*T, Dk], the block's partial row of dk | dq per token in kq_part
// [B, NDB, T, 2N] and the lane's dabar | dpbar (summed over the segment's tokens) in ap_part [B, S, Dk, 2N].
template <int G, bool CARRY>
__global__ void __launch_bounds__(KALMAN_WARPS * 32, 2)
    kalman_filter_backward_kernel(float* dv, float* dLv, float* kq_part, float* ap_part, float4* cmap, float* cmap_cl,
                                  int S, int TPS, const float* dys, const float* ck, const floatX* v, int ldv,
                                  const float* Lv, const float* k, const float* q, const float* abar,
                                  const float* pbar, int T, int Dk, int N) {
    constexpr int CB = kalman_block_channels(G), H = KALMAN_HALF;
    constexpr int PART_LD = kalman_part_ld(G);
    using Sums = KalmanSums<H, G>;
    extern __shared__ float4 kalman_smem[];   // kalman_backward_smem_bytes(G): chan | kq | parts
    float4* chan = kalman_smem;
    float2* kq = (float2*)(chan + KALMAN_TILE * CB);
    float* parts = (float*)(kq + KALMAN_TILE * G);   // per channel and token of the half: the lanes' dk | dq terms
    const int p = threadIdx.x % G, c = threadIdx.x / G, d0 = blockIdx.x * CB, d = d0 + c, b = blockIdx.y;
    const int s = CARRY ? blockIdx.z + 1 : blockIdx.z, active = p < N && d < Dk;
    const int NT = kalman_num_tiles(T), NDB = gridDim.x;
    const size_t seg0 = ((size_t)b * S * Dk + d) * N + p, seg_stride = (size_t)Dk * N;   // the lane's segment 0
    float a = 1.0f, pb = 0.0f;
    if (active) { a = abar[(size_t)d * N + p]; pb = pbar[(size_t)d * N + p]; }
    const float a2raw = a * a, a2 = fmaxf(a2raw, KALMAN_FLOOR);
    float Gl = 0.0f, Ge = 0.0f, gab = 0.0f, gpb = 0.0f;   // dL/dlam_t, dL/deta_t carried back; dabar, dpbar
    KalmanCarry m = {1.0f, 0.0f, 1.0f, 0.0f, 0.0f};
    if (!CARRY && active) {   // the zero adjoint at T through the carry maps of the later segments
        for (int j = S - 1; j > s; j--) {
            const float4 cm = cmap[seg0 + j * seg_stride];
            const float cl = cmap_cl[seg0 + j * seg_stride];
            Gl = cm.z * Gl + cm.w * Ge + cl;
            Ge = cm.x * Ge + cm.y;
        }
    }
    const int tile_last = min(NT, (s + 1) * TPS) - 1;
    KalmanTileRegs<G> next;
    kalman_load_tile<G>(next, v, ldv, Lv, k, q, dys, b, tile_last * KALMAN_TILE,
                        min(KALMAN_TILE, T - tile_last * KALMAN_TILE), T, d0, Dk, N);
    for (int tile = tile_last; tile >= s * TPS; tile--) {
        const int t0 = tile * KALMAN_TILE, L = min(KALMAN_TILE, T - t0);
        __syncthreads();   // the previous tile is read
        kalman_store_tile<G>(chan, kq, next);
        __syncthreads();
        if (tile > s * TPS) {   // the next tile back, L = KALMAN_TILE
            kalman_load_tile<G>(next, v, ldv, Lv, k, q, dys, b, t0 - KALMAN_TILE, KALMAN_TILE, T, d0, Dk, N);
        }
        float lam0 = 1.0f, eta0 = 0.0f;
        if (active) {
            const float* cp = ck + (((size_t)b * NT + tile) * Dk + d) * 2 * N;
            lam0 = cp[p];
            eta0 = cp[N + p];
        }
        for (int h0 = L > H ? H : 0; h0 >= 0; h0 -= H) {
            const int Lh = min(H, L - h0);
            float lam = lam0, eta = eta0;
            if (h0 > 0) {   // the state at the second half: the first half's steps (always whole here)
#pragma unroll
                for (int i = 0; i < H; i++) {
                    const float4 ch = chan[i * CB + c];
                    kalman_lane_step(lam, eta, a, a2, pb, ch.x, ch.y, kq[i * G + p].x);
                }
            }
            float sLv[H], sv[H];
            float* part = parts + c * PART_LD;
            if (Lh == H) {
                kalman_backward_half<G, CARRY, true>(sLv, sv, part, lam, eta, Gl, Ge, gab, gpb, m, chan, kq, c, p, a,
                                                     a2raw, pb, h0, Lh);
            } else {
                kalman_backward_half<G, CARRY, false>(sLv, sv, part, lam, eta, Gl, Ge, gab, gpb, m, chan, kq, c, p, a,
                                                      a2raw, pb, h0, Lh);
            }
            if constexpr (!CARRY) {
                kalman_transpose_sum<G>(sLv, p);
                kalman_transpose_sum<G>(sv, p);
                if (p % Sums::SHARE == 0 && d < Dk) {
#pragma unroll
                    for (int j = 0; j < Sums::PER; j++) {
                        const int i = p / Sums::SHARE * Sums::PER + j;
                        if (i < Lh) {
                            const size_t r = (size_t)b * T + t0 + h0 + i;
                            dLv[r * Dk + d] = sLv[j];
                            dv[r * Dk + d] = sv[j] * chan[(h0 + i) * CB + c].x;
                        }
                    }
                }
                __syncthreads();   // parts written
                // dk | dq of the half's tokens: the block's channels summed in channel order
                for (int e = threadIdx.x; e < H * 2 * G; e += KALMAN_WARPS * 32) {
                    const int i = e / (2 * G), mm = e % (2 * G), n = mm % G;
                    if (i < Lh && n < N) {
                        float sum = 0.0f;
                        for (int cc = 0; cc < CB; cc++) { sum += parts[cc * PART_LD + e]; }
                        kq_part[(((size_t)b * NDB + blockIdx.x) * T + t0 + h0 + i) * 2 * N + (mm / G) * N + n] = sum;
                    }
                }
                __syncthreads();   // parts read
            }
        }
    }
    if (active) {
        if (CARRY) {
            cmap[seg0 + s * seg_stride] = make_float4(m.ae, m.ce, m.al, m.x);
            cmap_cl[seg0 + s * seg_stride] = m.cl;
        } else {
            float* part = ap_part + (((size_t)b * S + s) * Dk + d) * 2 * N;
            part[p] = gab;
            part[N + p] = gpb;
        }
    }
}

// dk, dq [B*T, N]: one thread per (row, n): the blocks' partials in block order
__global__ void kalman_kq_reduce_kernel(float* dk, float* dq, const float* kq_part, int B, int T, int N, int NDB) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * T * 2 * N) { return; }
    const int m = idx % (2 * N), r = idx / (2 * N), b = r / T, t = r % T;
    float s = 0.0f;
    for (int j = 0; j < NDB; j++) { s += kq_part[(((size_t)b * NDB + j) * T + t) * 2 * N + m]; }
    if (m < N) { dk[(size_t)r * N + m] = s; } else { dq[(size_t)r * N + m - N] = s; }
}

// dabar, dpbar [Dk, N]: one thread per (d, n): the partials of the BS = B x segments (sequence, segment) pairs in order
__global__ void kalman_ap_reduce_kernel(float* dabar, float* dpbar, const float* ap_part, int BS, int Dk, int N) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= Dk * N) { return; }
    const int d = idx / N, n = idx % N;
    float sa = 0.0f, sp = 0.0f;
    for (int j = 0; j < BS; j++) {
        const float* part = ap_part + ((size_t)j * Dk + d) * 2 * N;
        sa += part[n];
        sp += part[N + n];
    }
    dabar[idx] = sa;
    dpbar[idx] = sp;
}

// Outputs overwritten: dv, dLv [B*T, Dk], dk, dq [B*T, N], dabar, dpbar [Dk, N]. S segments (kalman_segments picks
// them). scratch: kalman_filter_backward_scratch_bytes(B, T, Dk, N, S).
static void kalman_filter_backward(float* dv, float* dLv, float* dk, float* dq, float* dabar, float* dpbar,
                                   const float* dys, const float* ck, const floatX* v, int ldv, const float* Lv,
                                   const float* k, const float* q, const float* abar, const float* pbar, int B,
                                   int T, int Dk, int N, int S, void* scratch, cudaStream_t stream) {
    const int NDB = kalman_num_blocks(Dk, N), G = kalman_group(N), TPS = kalman_tiles_per_segment(T, S);
    S = kalman_effective_segments(T, S);
    float* kq_part = (float*)scratch;
    float* ap_part = kq_part + (size_t)B * NDB * T * 2 * N;
    float4* cmap = (float4*)(ap_part + (size_t)B * S * Dk * 2 * N);
    float* cmap_cl = (float*)(cmap + (S > 1 ? (size_t)B * S * Dk * N : 0));
    const size_t smem = kalman_backward_smem_bytes(G);
    kalman_dispatch_group(G, [&](auto g) {
        constexpr int GV = decltype(g)::value;
        if (S > 1) {
            cudaCheck(cudaFuncSetAttribute(kalman_filter_backward_kernel<GV, true>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            kalman_filter_backward_kernel<GV, true><<<dim3(NDB, B, S - 1), KALMAN_WARPS * 32, smem, stream>>>(
                NULL, NULL, NULL, NULL, cmap, cmap_cl, S, TPS, dys, ck, v, ldv, Lv, k, q, abar, pbar, T, Dk, N);
            cudaCheckLaunch();
        }
        cudaCheck(cudaFuncSetAttribute(kalman_filter_backward_kernel<GV, false>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        kalman_filter_backward_kernel<GV, false><<<dim3(NDB, B, S), KALMAN_WARPS * 32, smem, stream>>>(
            dv, dLv, kq_part, ap_part, cmap, cmap_cl, S, TPS, dys, ck, v, ldv, Lv, k, q, abar, pbar, T, Dk, N);
    });
    cudaCheckLaunch();
    kalman_kq_reduce_kernel<<<ceil_div(B * T * 2 * N, 256), 256, 0, stream>>>(dk, dq, kq_part, B, T, N, NDB);
    cudaCheckLaunch();
    kalman_ap_reduce_kernel<<<ceil_div(Dk * N, 256), 256, 0, stream>>>(dabar, dpbar, ap_part, B * S, Dk, N);
    cudaCheckLaunch();
}

// The segment count for B sequences (forward or backward): the S that minimises a model of the time, in units of
// one block-tile on a busy SM. Each pass of the filter (the segments' own walk; for S > 1 the summary passes over
// S - 1 of them, KALMAN_SUMMARY_WORK of a walk) takes TPS x work x max(k, KALMAN_LONE_TILE) units, with k the
// blocks on the busiest SM: k blocks share an SM's issue slots, and a block alone on one still needs
// KALMAN_LONE_TILE units per tile (its steps wait on each other). Measured on an H200 with dev/cuda/kalman_scan.cu
// (2026-11-27): a lone block's 512 tiles take 1.336 ms forward and 3.596 ms backward, against 633 and 191
// block-tiles per ms on a busy SM; the summary passes cost 1.5 (precision + information) and 0.7 (carry) of a
// walk. The model matched the measured 1, 2 and 37 (forward) and 1, 2 and 11 (backward) segments at B = 1,
// T = 16384 within 7%. Fixed for a machine and a shape.
static const double KALMAN_LONE_TILE[2] = {1.65, 1.34};
static const double KALMAN_SUMMARY_WORK[2] = {1.5, 0.7};
static int kalman_segments(int B, int T, int Dk, int N, int backward) {
    const int NT = kalman_num_tiles(T), blocks = B * kalman_num_blocks(Dk, N);
    static int sms = 0;   // the process's GPU (one per process): asked once, not at every layer's call
    if (sms == 0) {
        int device;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    }
    auto pass = [&](int n, int TPS, double work) {   // n blocks walking TPS tiles each
        const double k = ceil_div(n, sms);
        return TPS * work * (k > KALMAN_LONE_TILE[backward] ? k : KALMAN_LONE_TILE[backward]);
    };
    int best = 1;
    double best_time = pass(blocks, NT, 1.0);
    for (int S = 2; S <= NT && S <= 64; S++) {
        const int TPS = ceil_div(NT, S);
        if (ceil_div(NT, TPS) != S) { continue; }   // the same split as a smaller S
        const double time = pass(blocks * S, TPS, 1.0) + pass(blocks * (S - 1), TPS, KALMAN_SUMMARY_WORK[backward]);
        if (time < best_time) { best = S; best_time = time; }
    }
    return best;
}

// ----------------------------------------------------------------------------------------------------------
// static dynamics (spec 1.3 step 6, backward 1.7), one thread per (d, n), from the fp32 master parameters

__global__ void kalman_dynamics_kernel(float* abar, float* pbar, const float* delta_raw, const float* lambda_log,
                                       const float* p_raw, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    const float Delta = softplusf_dev(delta_raw[i]) + 1e-7f;
    const float kappa = expf(lambda_log[i]);
    const float pp = fmaxf(p_raw[i], 1e-7f);
    abar[i] = expf(-kappa * Delta);
    pbar[i] = fmaxf(pp / (2.0f * kappa) * -expm1f(-2.0f * kappa * Delta), KALMAN_FLOOR);
}

// gradients += from dabar, dpbar; E = exp(-2 kappa Delta); zero gradient where a clamp binds
__global__ void kalman_dynamics_backward_kernel(float* g_delta_raw, float* g_lambda_log, float* g_p_raw,
                                                const float* dabar, const float* dpbar, const float* abar,
                                                const float* delta_raw, const float* lambda_log,
                                                const float* p_raw, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    const float Delta = softplusf_dev(delta_raw[i]) + 1e-7f;
    const float kappa = expf(lambda_log[i]);
    const float pp = fmaxf(p_raw[i], 1e-7f);
    const float ab = abar[i];
    const float x2 = 2.0f * kappa * Delta;
    const float E = expf(-x2), omE = -expm1f(-x2);
    const float pbraw = pp / (2.0f * kappa) * omE;
    const float gp = pbraw > KALMAN_FLOOR ? dpbar[i] : 0.0f;
    const float dDelta = dabar[i] * (-kappa * ab) + gp * (pp * E);
    const float dkappa = dabar[i] * (-Delta * ab) + gp * (pp / kappa) * (Delta * E - omE / (2.0f * kappa));
    g_delta_raw[i] += dDelta * dsoftplusf_dev(delta_raw[i]);
    g_lambda_log[i] += dkappa * kappa;
    g_p_raw[i] += p_raw[i] > 1e-7f ? gp * omE / (2.0f * kappa) : 0.0f;
}

static void kalman_dynamics(float* abar, float* pbar, const float* delta_raw, const float* lambda_log,
                            const float* p_raw, int n, cudaStream_t stream) {
    kalman_dynamics_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(abar, pbar, delta_raw, lambda_log, p_raw, n);
    cudaCheckLaunch();
}

static void kalman_dynamics_backward(float* g_delta_raw, float* g_lambda_log, float* g_p_raw, const float* dabar,
                                     const float* dpbar, const float* abar, const float* delta_raw,
                                     const float* lambda_log, const float* p_raw, int n, cudaStream_t stream) {
    kalman_dynamics_backward_kernel<<<ceil_div(n, 256), 256, 0, stream>>>(g_delta_raw, g_lambda_log, g_p_raw, dabar,
                                                                          dpbar, abar, delta_raw, lambda_log, p_raw, n);
    cudaCheckLaunch();
}

#endif // TRAIN_KLA_KERNELS_KALMAN_SCAN_CUH
