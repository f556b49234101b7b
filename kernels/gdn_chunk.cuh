/*
kernels/gdn_chunk.cuh: the Gated DeltaNet core (gdn, kaczmarz, and the pdn family with a write key of its own),
chunkwise-parallel, forward and backward
(spec/gdn_kaczmarz.md 3.1-3.4; the math is the spec's, the kernel order is the spec's 3.3 / 3.4).
The decay kind is a template parameter (GdnDecay): one log decay per token and head (gdn, kaczmarz, pdn, pgdn), or
one per token, head and key channel (pkda, spec/pdn.md 3.2), whose intra-chunk products are formed on 16-row
blocks (gdn_decay_product / _rows / _cols below), whose intra kernel also forms the decayed Q Kw^T for the output
kernel, and whose backward chunk kernel is gdn_bwd_chunk_channel_kernel with gdn_bwd_keys_channel_kernel after it
(bf16: gdn_bwd_chunk_channel_mma_kernel alone, on register tiles, the key kernel's step fused in).

Per (batch b, head h) the core runs the recurrence of spec 2.1 with S_0 = 0:
    Sbar = exp(g_t) S;  u = beta_t (v_t - Sbar^T k_t);  S = Sbar + kw_t u^T;  o_t = S^T (scale q_t)
kw is the write key: gdn and kaczmarz write along the read key (kw = k); the pdn family writes along the
preconditioned key k~ = m (.) k (spec/pdn.md 1.4, 3.1-3.2). Where kw differs, the chunk matrices keep the read key
on the rows and take the write key on the columns (A_ij = beta_i k_i.kw_j, Q Kw^T), the state is written and
read back along kw, W stays Tm diag(beta gam) K, and the backward returns the two keys' gradients apart
(spec/pdn.md 3.4: dK, dKt).
Chunks of GDN_CHUNK = BT = 64 tokens; the last chunk is padded with q = k = v = 0, beta = 0, g = 0 (spec 3.1:
padded tokens neither write nor decay), so every kernel sees full BT-row chunks.

Kernels (one CTA per chunk unless said otherwise):
  forward  1 gdn_fwd_intra_kernel   G = chunk cumsum of g; A = strictly_lower(diag(beta) K Kw^T (.) Gam);
                                    Tm = (I + A)^-1 (spec 3.2); W = Tm diag(beta gam) K; U = Tm diag(beta) V
                                    (bf16 per head: gdn_fwd_intra_mma_kernel, the products on register tiles;
                                    per channel: gdn_fwd_intra_channel_mma_kernel)
           2 gdn_fwd_state_kernel   sequential over chunks, one CTA of 256 threads per (b, h, 32 dv columns):
                                    h_n = S, Vn = U - W S, S <- gam_BT S + Kw^T diag(exp(G_BT - G)) Vn
                                    (bf16: gdn_fwd_state_mma_kernel, the state in registers, cp.async loads;
                                    with few (b, h) and long sequences split along the sequence in segments:
                                    phase 1, gdn_state_combine_kernel, phase 3, see GdnSegments)
           3 gdn_fwd_output_kernel  O = scale (diag(gam) Q h_n + (Q Kw^T (.) M) Vn), one CTA per (chunk, 2 SL
                                    columns of dv): Q Kw^T is formed once per chunk for dv <= 2 SL
                                    (bf16: gdn_fwd_output_mma_kernel, one CTA per chunk on register tiles;
                                    per head at dv <= 128 gdn_fwd_output_head_mma_kernel, three CTAs per SM)
  backward 2 gdn_bwd_dvlocal_kernel dVl = scale (Kw Q^T (.) M^T) dO                       (spec 3.4 Kernel 2)
                                    (bf16: gdn_bwd_dvlocal_mma_kernel, as the output kernel's)
           3 gdn_bwd_state_kernel   reverse over chunks: dE_n, dVn, dE <- ...             (spec 3.4 Kernel 3)
                                    (bf16: gdn_bwd_state_mma_kernel, as forward kernel 2's, split alike)
           4 gdn_bwd_chunk_kernel   Kernels 4, 5 and 6 fused: dq, dk, dv, dbeta, dg of one chunk
                                    (bf16 per head: gdn_bwd_chunk_mma_kernel, on register tiles, for dv <= 192;
                                    per channel: gdn_bwd_chunk_channel_mma_kernel, the same bound)
  The forward saves Tm, G, h, Vn and W (per channel also A0, Aqk, Qg and Kwe), so the backward needs neither
  Kernel 0 nor Kernel 1.

Numerics (spec 5): G, beta, every exp factor, the running state S and its gradient dE, and every accumulator
are fp32; Gam_ij = exp(G_i - G_j) is only evaluated for i >= j. The matrix products run on operands of type Tc:
  Tc = float          fp32 CUDA-core FMAs (no TF32): the accurate path, used when the inputs are fp32
  Tc = __nv_bfloat16  tensor cores (wmma m16n16k16, bf16 inputs, fp32 accumulate); like FLA, the products'
                      operands (Tm, W, U, Vn, h, the state, P, dE, ...) are rounded to bf16, ~4e-3 relative
Every reduction has a fixed order (no atomics): results are bitwise reproducible.

Matrices live in shared memory as tiles whose dimensions are padded to multiples of 16 with zeros; dk is
processed in slabs of GdnTile<Tc>::SL columns so that dk up to 256 fits in shared memory.
*/
#ifndef TRAIN_KLA_KERNELS_GDN_CHUNK_CUH
#define TRAIN_KLA_KERNELS_GDN_CHUNK_CUH

#include <type_traits>
#include <mma.h>
#include "common.cuh"
#include "chunk_tiles.cuh"

#define GDN_CHUNK 64            // BT, the chunk length of the CUDA kernels
#define GDN_THREADS 256         // threads of the per-chunk kernels
#define GDN_CH_THREADS 512      // threads of the intra kernel with a per-channel decay (two CTAs per SM)
#define GDN_BWD_THREADS 512     // threads of the fused backward chunk kernel (one CTA per SM: more warps in flight)
#define GDN_STATE_THREADS 256   // threads of the sequential state kernels
#define GDN_STATE_BV 32         // dv columns of the state per CTA of the state kernels
#define GDN_STATE_CTAS 3        // state kernel CTAs per SM (their register bound): 384 CTAs in one wave at the
                                // production shape (B*H*dv/BV on 132 SMs)
#define GDN_FIXED_DK 128        // the head size the register-tile state kernels (and, at dk = dv, the per-head intra
                                // and output kernels) are also compiled for (every gdn-family mixer's production
                                // heads; gdn_state_load_rows, gdn_tile_load)

// slab width (columns of dk or dv processed at once) and padded tile strides, per operand type
template <typename Tc> struct GdnTile {
    static constexpr int SL = sizeof(Tc) == 4 ? 32 : 64;   // fp32 tiles are twice as large: narrower slabs
    static constexpr int LDT = SL + 8;                     // stride of a BT x SL operand tile (Tc)
    static constexpr int LDF = SL + 4;                     // stride of a BT x SL fp32 tile
    static constexpr int LDT_BT = GDN_CHUNK + 8;           // stride of a BT x BT operand tile
    static constexpr int LDF_BT = GDN_CHUNK + 4;           // stride of a BT x BT fp32 tile
    static constexpr int SLS = sizeof(Tc) == 4 ? 32 : 128; // state kernels: slab width over dk
    static constexpr int LDTS = SLS + 8;                   // state kernels: stride of a BT x SLS operand tile
    static constexpr int LDT_BV = GDN_STATE_BV + 8;        // state kernels: stride of a ... x BV operand tile
    static constexpr int LDF_BV = GDN_STATE_BV + 4;        // state kernels: stride of a ... x BV fp32 tile
    static constexpr int VO = 2 * SL;                      // output kernel: dv columns per CTA
    static constexpr int LDT_VO = VO + 8;                  // output kernel: stride of a ... x VO operand tile
    static constexpr int LDF_VO = VO + 4;                  // output kernel: stride of a ... x VO fp32 tile
};


// ----------------------------------------------------------------------------------------------------------
// the decay kinds: one log decay per (token, head), the same on every channel (gdn, kaczmarz, pgdn; pdn's is 0),
// or one per (token, head, channel) (pkda, spec/pdn.md 3.2)
typedef enum { GDN_DECAY_HEAD, GDN_DECAY_CHANNEL } GdnDecay;

// saved tensors (per layer) and workspace. c = (b*H + h)*NT + n indexes a chunk.
//   saved:     Tm fp32 [c][BT][BT], G fp32 [c][BT] (per channel: [c][BT][dk]), h Tc [c][dk][dv] (chunk-start
//              states), Vn Tc [c][BT][dv], W Tc [c][BT][dk]; per channel also A0 fp32 [c][BT][BT] (the decayed
//              K Kw^T without beta, strictly lower), Aqk Tc [c][BT][BT] (scale times the decayed Q Kw^T, lower),
//              Qg Tc [c][BT][dk] (scale Q (.) exp(G)) and Kwe Tc [c][BT][dk] (Kw (.) exp(G_BT - G))
//   workspace: forward U Tc [c][BT][dv]; backward dVl/dVn fp32 [c][BT][dv] (dVn overwrites dVl in place),
//              dE Tc [c][dk][dv]; per channel also Z1 Tc [c][BT][BT] and the chunk-end terms of dG fp32 [c][dk],
//              from the backward chunk kernel to the key kernel (where the register-tile kernel, which keeps
//              them in shared memory, does not run)
// The byte counts are for Tc = float (an upper bound; bf16 uses less of the same buffers).

typedef struct { size_t Tm, G, h, Vn, W, A0, Aqk, Qg, Kwe, total; } GdnSavedLayout;

static size_t gdn_align256(size_t x) { return (x + 255) & ~(size_t)255; }

static GdnSavedLayout gdn_saved_layout(int B, int T, int H, int dk, int dv, size_t tc_bytes, GdnDecay decay) {
    const size_t BT = GDN_CHUNK, nchunks = (size_t)B * H * ceil_div(T, GDN_CHUNK);
    const int ch = decay == GDN_DECAY_CHANNEL;
    GdnSavedLayout l;
    l.Tm = 0;
    l.G = l.Tm + gdn_align256(nchunks * BT * BT * sizeof(float));
    l.h = l.G + gdn_align256(nchunks * BT * (ch ? dk : 1) * sizeof(float));
    l.Vn = l.h + gdn_align256(nchunks * dk * dv * tc_bytes);
    l.W = l.Vn + gdn_align256(nchunks * BT * dv * tc_bytes);
    l.A0 = l.W + gdn_align256(nchunks * BT * dk * tc_bytes);
    l.Aqk = l.A0 + ch * gdn_align256(nchunks * BT * BT * sizeof(float));
    l.Qg = l.Aqk + ch * gdn_align256(nchunks * BT * BT * tc_bytes);
    l.Kwe = l.Qg + ch * gdn_align256(nchunks * BT * dk * tc_bytes);
    l.total = l.Kwe + ch * gdn_align256(nchunks * BT * dk * tc_bytes);
    return l;
}

static size_t gdn_chunk_saved_bytes(int B, int T, int H, int dk, int dv, GdnDecay decay) {
    return gdn_saved_layout(B, T, H, dk, dv, sizeof(float), decay).total;
}

typedef struct { size_t dVn, dE, Z, ce, total; } GdnWorkLayout;   // the backward's use of the workspace

static GdnWorkLayout gdn_work_layout(int B, int T, int H, int dk, int dv, size_t tc_bytes, GdnDecay decay) {
    const size_t BT = GDN_CHUNK, nchunks = (size_t)B * H * ceil_div(T, GDN_CHUNK);
    const int ch = decay == GDN_DECAY_CHANNEL;
    GdnWorkLayout l;
    l.dVn = 0;
    l.dE = l.dVn + gdn_align256(nchunks * BT * dv * sizeof(float));
    l.Z = l.dE + gdn_align256(nchunks * dk * dv * tc_bytes);
    l.ce = l.Z + ch * gdn_align256(nchunks * BT * BT * tc_bytes);
    l.total = l.ce + ch * gdn_align256(nchunks * dk * sizeof(float));
    return l;
}

// the state passes' sequence split (gdn_fwd_state_mma_kernel below): chunks per segment at this shape (NT: the pass
// is not split), and the bytes of its buffers (GdnSegments.first and .last), which follow the forward's and the
// backward's use of the workspace
#define GDN_SPLIT_CTAS 384     // phase-3 CTAs a split aims at: a wave of the state kernels (3 per SM, 132 SMs)
#define GDN_SPLIT_MIN_LEN 8    // chunks per segment at least (shorter: the three passes cost more than they gain)

static int gdn_segment_len(int B, int H, int dv, int NT) {
    const int by_ctas = GDN_SPLIT_CTAS / (B * H * ceil_div(dv, GDN_STATE_BV)), by_len = NT / GDN_SPLIT_MIN_LEN;
    const int count = by_ctas < by_len ? by_ctas : by_len;
    return count > 1 ? ceil_div(NT, count) : NT;
}

static size_t gdn_split_bytes(int B, int T, int H, int dk, int dv) {
    const int NT = ceil_div(T, GDN_CHUNK), count = ceil_div(NT, gdn_segment_len(B, H, dv, NT));
    if (count == 1) { return 0; }
    const size_t per = (size_t)B * H * count * dk * sizeof(float);
    return gdn_align256(per * dv) + gdn_align256(per * (dv + dk));
}

static size_t gdn_split_offset(int B, int T, int H, int dk, int dv, GdnDecay decay) {
    const size_t nchunks = (size_t)B * H * ceil_div(T, GDN_CHUNK);
    const size_t fwd = gdn_align256(nchunks * GDN_CHUNK * dv * sizeof(float));
    const size_t bwd = gdn_work_layout(B, T, H, dk, dv, sizeof(float), decay).total;
    return fwd > bwd ? fwd : bwd;
}

static size_t gdn_chunk_workspace_bytes(int B, int T, int H, int dk, int dv, GdnDecay decay) {
    return gdn_split_offset(B, T, H, dk, dv, decay) + gdn_split_bytes(B, T, H, dk, dv);
}

// where a state pass's split works in the workspace: count segments of len chunks (count = 1: unsplit)
typedef struct { float *first, *last; int len, count; } GdnSplit;

static GdnSplit gdn_split(void* workspace, int B, int T, int H, int dk, int dv, GdnDecay decay) {
    const int NT = ceil_div(T, GDN_CHUNK);
    GdnSplit sp;
    sp.len = gdn_segment_len(B, H, dv, NT);
    sp.count = ceil_div(NT, sp.len);
    sp.first = (float*)((char*)workspace + gdn_split_offset(B, T, H, dk, dv, decay));
    sp.last = (float*)((char*)sp.first + gdn_align256((size_t)B * H * sp.count * dk * dv * sizeof(float)));
    return sp;
}

// ----------------------------------------------------------------------------------------------------------
// the chunk's position and inputs

// where a per-chunk CTA works: chunk c = (b*H + h)*NT + n covers tokens t0 .. t0+L-1 (rows row0.. of the inputs)
struct GdnChunkPos {
    size_t c, row0;
    int b, h, n, t0, L;
};

__device__ __forceinline__ GdnChunkPos gdn_chunk_pos(size_t c, int T, int H, int NT) {
    GdnChunkPos p;
    p.c = c;
    const int bh = (int)(c / NT);
    p.n = (int)(c % NT);
    p.b = bh / H;
    p.h = bh % H;
    p.t0 = p.n * GDN_CHUNK;
    p.L = min(GDN_CHUNK, T - p.t0);
    p.row0 = (size_t)p.b * T + p.t0;
    return p;
}

// G of chunk c from the saved buffer
__device__ __forceinline__ void gdn_load_G(float* Gs, const float* G_saved, size_t c) {
    for (int r = threadIdx.x; r < GDN_CHUNK; r += blockDim.x) { Gs[r] = G_saved[c * GDN_CHUNK + r]; }
    __syncthreads();
}

// beta of a chunk (0 on padded rows)
__device__ __forceinline__ void gdn_load_beta(float* bs, const float* beta, const GdnChunkPos& p, int H) {
    for (int r = threadIdx.x; r < GDN_CHUNK; r += blockDim.x) {
        bs[r] = r < p.L ? beta[(p.row0 + r) * H + p.h] : 0.0f;
    }
    __syncthreads();
}

// per head, by warp 0: G = the cumulative sum of the chunk's log decays g from its start (spec 3.1), saved, beta and
// bg = beta exp(G), all 0 on padded rows, into shared memory (visible to the CTA after the caller's next barrier).
// Lane l holds rows 2l and 2l + 1: an inclusive scan of the 32 pair sums by shuffles gives G_{2l+1}, and G_{2l} is
// the scan before the lane plus g_{2l} (a fixed order; each G_r is the rounded sum of the one before and g's, so G
// stays monotone where g <= 0). A loop of 64 dependent adds in one thread took 4% of the intra kernel's stall samples
// (ncu, H200). g_stride as in gdn_fwd_intra_kernel.
__device__ __forceinline__ void gdn_head_G_beta(float* Gs, float* bs, float* bgs, float* G_saved, const float* g,
                                                int g_stride, const float* beta, const GdnChunkPos& p, int H) {
    static_assert(GDN_CHUNK == 64, "one warp, two rows per lane");
    if (threadIdx.x >= 32) { return; }
    const int lane = threadIdx.x, r = 2 * lane;
    const size_t at0 = (p.row0 + r) * H + p.h, at1 = at0 + H;   // the (row, head) entries of rows r and r + 1
    float g0 = 0.0f, g1 = 0.0f, b0 = 0.0f, b1 = 0.0f;
    if (r < p.L) {
        g0 = g[at0 * g_stride];
        b0 = beta[at0];
    }
    if (r + 1 < p.L) {
        g1 = g[at1 * g_stride];
        b1 = beta[at1];
    }
    float s = g0 + g1;
    #pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float t = __shfl_up_sync(0xffffffffu, s, o);
        if (lane >= o) { s += t; }
    }
    const float before = __shfl_up_sync(0xffffffffu, s, 1);
    const float G0 = lane > 0 ? before + g0 : g0, G1 = s;
    *reinterpret_cast<float2*>(Gs + r) = make_float2(G0, G1);
    *reinterpret_cast<float2*>(G_saved + p.c * GDN_CHUNK + r) = make_float2(G0, G1);
    *reinterpret_cast<float2*>(bs + r) = make_float2(b0, b1);
    *reinterpret_cast<float2*>(bgs + r) = make_float2(b0 * expf(G0), b1 * expf(G1));
}

// the tile of a chunk's rows of q, k (width dk), v or dO (width dv) at the head's columns col0 .. col0 + cols - 1,
// zero outside the sequence or the head's columns
template <typename Ts, typename Tin>
__device__ __forceinline__ TileLoad<Ts, Tin> gdn_in_tile(Ts* s, int lds, int cols, const Tin* x, int ld,
                                                            const GdnChunkPos& p, int width, int col0,
                                                            const float* rowscale = nullptr, float mul = 1.0f) {
    return make_tile_load(s, lds, GDN_CHUNK, cols, x + p.row0 * ld + (size_t)p.h * width + col0, (size_t)ld, p.L,
                    width - col0, rowscale, mul);
}

// the tile rows r0.., columns col0.. of a per-chunk row-major [nrows][ncols] matrix (saved or workspace) at m
template <typename Ts, typename Tg>
__device__ __forceinline__ TileLoad<Ts, Tg> gdn_mat_tile(Ts* s, int lds, int rows, int cols, const Tg* m,
                                                            int nrows, int ncols, int r0, int col0,
                                                            const float* rowscale = nullptr, float mul = 1.0f) {
    return make_tile_load(s, lds, rows, cols, m + (size_t)r0 * ncols + col0, (size_t)ncols, nrows - r0, ncols - col0,
                    rowscale, mul);
}

// ----------------------------------------------------------------------------------------------------------
// spec 3.2: Tm = (I + A)^-1 for a strictly lower triangular BT x BT matrix A (fp32, stride LDF_BT), by 16 x 16
// blocks: the 4 diagonal blocks by forward substitution, then the 6 off-diagonal blocks
// Tm_IJ = -Tm_II X_IJ, X_IJ = sum_{M=J}^{I-1} A_IM Tm_MJ. Every element is one fmaf chain over m in ascending order
// (the diagonal blocks' terms m < j are exact zeros), so the result does not depend on how the work is spread:
//   diagonal  one thread per (block, column j) of warps 0 and 1, the column in registers: Tm_ij = -sum_{m<i} A_im
//             Tm_mj, row by row, each row of A read as four float4 (the same for the block's 16 threads: a
//             broadcast); the other warps zero the strictly upper blocks meanwhile.
//   off-diagonal  one warp per block (I, J), lane (r, c8) its row r, columns c8 .. c8 + 7 (eight chains side by
//             side): X_IJ over M = J, J + 1, ... into Tm_IJ's own place, then Tm_IJ = -Tm_II X_IJ in registers and
//             written over it once the warp has read X. Column J's blocks depend on each other down the column:
//             X_IJ's sum reaches block M's terms (A_IM Tm_MJ) only once the warp of (M, J) has written Tm_MJ, and
//             meets it at the named barrier of (M, J) (ids 1 + its warp; with the warps of the blocks below it), so
//             a chain runs ahead over the blocks already formed: the path is 6 steps of 16 terms, not 9 (H200, B=16
//             T=2048: the per-head intra kernel 0.182 -> 0.164 ms, with CTA-wide phases by distance before).
// Needs blockDim.x >= 6 * 32 (warps 0 .. 5 form the off-diagonal blocks; later warps pass through).

// the warp of off-diagonal block (I, J) in the order of their distance I - J: (1,0) (2,1) (3,2) (2,0) (3,1) (3,0)
__host__ __device__ constexpr int gdn_solve_warp(int I, int J) {
    return I - J == 1 ? J : I - J == 2 ? 3 + J : 5;
}

__device__ void gdn_solve_unit_lower(float* Tm, const float* A) {
    constexpr int BT = GDN_CHUNK, LD = GDN_CHUNK + 4, NB = GDN_CHUNK / 16;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x < BT) {
        const int f = (threadIdx.x / 16) * 16, j = threadIdx.x % 16;
        const float* Ab = A + f * LD + f;
        float t[16];
        #pragma unroll
        for (int i = 0; i < 16; i++) {
            float s = 0.0f;
            #pragma unroll
            for (int q = 0; 4 * q < i; q++) {
                const float4 a = *reinterpret_cast<const float4*>(Ab + i * LD + 4 * q);
                const float a4[4] = {a.x, a.y, a.z, a.w};
                #pragma unroll
                for (int e = 0; e < 4 && 4 * q + e < i; e++) { s = fmaf(a4[e], t[4 * q + e], s); }
            }
            t[i] = i < j ? 0.0f : i == j ? 1.0f : -s;
        }
        #pragma unroll
        for (int i = 0; i < 16; i++) { Tm[(f + i) * LD + f + j] = t[i]; }
    } else {
        // the strictly upper blocks (I, J > I), 16 rows of four float4 each
        for (int idx = threadIdx.x - BT; idx < 6 * 64; idx += blockDim.x - BT) {
            const int blk = idx >> 6, I = blk < 3 ? 0 : blk < 5 ? 1 : 2, J = blk < 3 ? 1 + blk : blk < 5 ? blk - 1 : 3;
            const int r = (idx >> 2) & 15, c4 = 4 * (idx & 3);
            *reinterpret_cast<float4*>(Tm + (16 * I + r) * LD + 16 * J + c4) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    __syncthreads();
    if (warp < 6) {
        const int d = warp < 3 ? 1 : warp < 5 ? 2 : 3, J = warp < 3 ? warp : warp < 5 ? warp - 3 : 0, I = J + d;
        const int r = lane >> 1, c8 = 8 * (lane & 1);
        float s[8] = {};
        for (int M = J; M < I; M++) {
            if (M > J) { named_barrier_sync(1 + gdn_solve_warp(M, J), 32 * (NB - M)); }   // Tm_MJ written
            #pragma unroll
            for (int m4 = 0; m4 < 16; m4 += 4) {
                const float4 a = *reinterpret_cast<const float4*>(A + (16 * I + r) * LD + 16 * M + m4);
                const float a4[4] = {a.x, a.y, a.z, a.w};
                #pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float* t = Tm + (16 * M + m4 + e) * LD + 16 * J + c8;
                    const float4 t0 = *reinterpret_cast<const float4*>(t), t1 = *reinterpret_cast<const float4*>(t + 4);
                    s[0] = fmaf(a4[e], t0.x, s[0]); s[1] = fmaf(a4[e], t0.y, s[1]);
                    s[2] = fmaf(a4[e], t0.z, s[2]); s[3] = fmaf(a4[e], t0.w, s[3]);
                    s[4] = fmaf(a4[e], t1.x, s[4]); s[5] = fmaf(a4[e], t1.y, s[5]);
                    s[6] = fmaf(a4[e], t1.z, s[6]); s[7] = fmaf(a4[e], t1.w, s[7]);
                }
            }
        }
        float* out = Tm + (16 * I + r) * LD + 16 * J + c8;   // X_IJ, then Tm_IJ
        *reinterpret_cast<float4*>(out) = make_float4(s[0], s[1], s[2], s[3]);
        *reinterpret_cast<float4*>(out + 4) = make_float4(s[4], s[5], s[6], s[7]);
        __syncwarp();
        const float* Tii = Tm + (16 * I + r) * LD + 16 * I;
        float x[8] = {};
        #pragma unroll
        for (int m = 0; m < 16; m++) {
            if (m <= r) {
                const float a = Tii[m];
                const float* xm = Tm + (16 * I + m) * LD + 16 * J + c8;
                const float4 x0 = *reinterpret_cast<const float4*>(xm), x1 = *reinterpret_cast<const float4*>(xm + 4);
                x[0] = fmaf(a, x0.x, x[0]); x[1] = fmaf(a, x0.y, x[1]); x[2] = fmaf(a, x0.z, x[2]);
                x[3] = fmaf(a, x0.w, x[3]); x[4] = fmaf(a, x1.x, x[4]); x[5] = fmaf(a, x1.y, x[5]);
                x[6] = fmaf(a, x1.z, x[6]); x[7] = fmaf(a, x1.w, x[7]);
            }
        }
        __syncwarp();   // every lane has read X_IJ
        *reinterpret_cast<float4*>(out) = make_float4(-x[0], -x[1], -x[2], -x[3]);
        *reinterpret_cast<float4*>(out + 4) = make_float4(-x[4], -x[5], -x[6], -x[7]);
        if (I < NB - 1) { named_barrier_sync(1 + warp, 32 * (NB - I)); }   // Tm_IJ to the blocks below it
    }
    __syncthreads();
}

// ----------------------------------------------------------------------------------------------------------
// per-channel decay (pkda, spec/pdn.md 3.2): inside a chunk the products carry exp(G[r][c] - G[s][c]) in the sum
// over the channels c, so they are no plain GEMMs. They are formed on blocks of GDN_SUB = 16 rows (spec/pdn.md 5;
// dev/cuda/pkda_chunk_check.py is this algorithm in numpy): an off-diagonal block is a GEMM whose two operands carry
// exponents against a reference row between them, so that every factor is exp(<= 0) and nothing overflows however
// strong the decay; a diagonal block is formed per element with the exponent of the difference. For one slab of ws
// channels, X and Y the raw operand tiles (Tc, stride ldt), G the slab's cumulative log decays (fp32, stride ldg):
//   gdn_decay_product  P[r][s] (+)= sum_c X[r][c] Y[s][c] exp(G[r][c] - G[s][c])    for s < r (s <= r with DIAG)
//   gdn_decay_rows     R[r][c]  = sum_{s <= r} D[r][s] Y[s][c] exp(G[r][c] - G[s][c])  (D lower triangular)
//   gdn_decay_cols     C[s][c]  = sum_{r >= s} D[r][s] X[r][c] exp(G[r][c] - G[s][c])
// Row block I's products with the blocks before it take its first row f = 16 I as the reference: the rows of
// block I as X_r exp(G_r - G_f) (gdn_decay_refer_rows) against the stacked rows s < f as Y_s exp(G_f - G_s)
// (gdn_decay_stack_before: blocks 1, 2, 3 stacked at rows 0, 16, 48). The column sums of gdn_decay_cols take each
// column block J's last row e = 16 J + 15 as the reference instead, against the rows after it, X_r exp(G_r - G_e)
// (gdn_decay_stack_after: blocks 0, 1, 2 stacked at rows 0, 48, 80), so that one GEMM per block J sums all of
// them and a factor exp(G_e - G_s) of J's own finishes the sum.

#define GDN_SUB 16
#define GDN_NSUB (GDN_CHUNK / GDN_SUB)
#define GDN_STACK_ROWS 96   // 16 + 32 + 48: the stacked rows of the three off-diagonal row (or column) blocks

// exp(x) for the exponents x <= 0 of the decays inside a chunk (per channel; per head in the register-tile kernels,
// whose products round to bf16): the hardware exponential, within 2 + 1.173 |x| ulp (CUDA's bound) against expf's
// 1 ulp: below the products' fp32 rounding where the factor is not negligible (a relative error of 1.5e-6 at
// x = -20, on a factor of 2e-9), and several times faster (expf per element had been 11-15% of the per-head
// intra and output kernels' instructions, ncu, H200)
__device__ __forceinline__ float gdn_decay_exp(float x) { return __expf(x); }

__host__ __device__ constexpr int gdn_before_off(int I) { return 8 * I * (I - 1); }   // block I's rows s < 16 I
__host__ __device__ constexpr int gdn_after_off(int J) { return 8 * J * (7 - J); }    // block J's rows r > 16 J + 15

// Xr[r][c] = X[r][c] exp(G[r][c] - G[f][c]), f the first row of r's block
template <typename Tc>
__device__ void gdn_decay_refer_rows(Tc* Xr, const Tc* X, int ldt, const float* G, int ldg, int ws) {
    cta_for_each_slab<GdnTile<Tc>::SL>(GDN_CHUNK, ws, [&](int r, int c) {
        const int f = r & ~(GDN_SUB - 1);
        Xr[r * ldt + c] = from_float<Tc>(to_float(X[r * ldt + c]) * gdn_decay_exp(G[r * ldg + c] - G[f * ldg + c]));
    });
}

// Sb[before_off(I) + s][c] = Y[s][c] exp(G[16 I][c] - G[s][c]) for s < 16 I, I = 1 .. 3
template <typename Tc>
__device__ void gdn_decay_stack_before(Tc* Sb, const Tc* Y, int ldt, const float* G, int ldg, int ws) {
    cta_for_each_slab<GdnTile<Tc>::SL>(GDN_STACK_ROWS, ws, [&](int i, int c) {
        const int I = i < gdn_before_off(2) ? 1 : i < gdn_before_off(3) ? 2 : 3, s = i - gdn_before_off(I);
        Sb[i * ldt + c] = from_float<Tc>(to_float(Y[s * ldt + c]) * gdn_decay_exp(G[GDN_SUB * I * ldg + c] - G[s * ldg + c]));
    });
}

// Sa[after_off(J) + r - 16 (J + 1)][c] = X[r][c] exp(G[r][c] - G[16 J + 15][c]) for r > 16 J + 15, J = 0 .. 2
template <typename Tc>
__device__ void gdn_decay_stack_after(Tc* Sa, const Tc* X, int ldt, const float* G, int ldg, int ws) {
    cta_for_each_slab<GdnTile<Tc>::SL>(GDN_STACK_ROWS, ws, [&](int i, int c) {
        const int J = i < gdn_after_off(1) ? 0 : i < gdn_after_off(2) ? 1 : 2;
        const int r = i - gdn_after_off(J) + GDN_SUB * (J + 1), e = GDN_SUB * J + GDN_SUB - 1;
        Sa[i * ldt + c] = from_float<Tc>(to_float(X[r * ldt + c]) * gdn_decay_exp(G[r * ldg + c] - G[e * ldg + c]));
    });
}

// P (+)= the decayed X Y^T at and below the diagonal blocks (acc: add to P). The strictly upper part of each
// diagonal block and the blocks above them are left alone: the callers mask them. Xr = gdn_decay_refer_rows(X),
// Sb = gdn_decay_stack_before(Y). The diagonal blocks: thread per (block, r, s), s <= r (s < r).
template <bool DIAG, typename Tc>
__device__ void gdn_decay_product(float* P, int ldp, const Tc* X, const Tc* Y, const Tc* Xr, const Tc* Sb, int ldt,
                                  const float* G, int ldg, int ws, bool acc) {
    for (int I = 1; I < GDN_NSUB; I++) {
        cta_mm<false, true>(P + GDN_SUB * I * ldp, ldp, Xr + GDN_SUB * I * ldt, ldt, Sb + gdn_before_off(I) * ldt,
                            ldt, GDN_SUB, GDN_SUB * I, ws, acc, false);
    }
    for (int idx = threadIdx.x; idx < GDN_NSUB * GDN_SUB * GDN_SUB; idx += blockDim.x) {
        const int f = (idx / (GDN_SUB * GDN_SUB)) * GDN_SUB, r = f + (idx / GDN_SUB) % GDN_SUB, s = f + idx % GDN_SUB;
        if (DIAG ? s > r : s >= r) { continue; }
        float sum = acc ? P[r * ldp + s] : 0.0f;
        for (int c = 0; c < ws; c++) {
            sum = fmaf(to_float(X[r * ldt + c]) * to_float(Y[s * ldt + c]), gdn_decay_exp(G[r * ldg + c] - G[s * ldg + c]), sum);
        }
        P[r * ldp + s] = sum;
    }
    __syncthreads();
}

// R[r][c] = sum_{s <= r} D[r][s] Y[s][c] exp(G[r][c] - G[s][c]) (D lower triangular, Tc, stride ldd; a strictly
// lower D has zeros on its diagonal). Sb = gdn_decay_stack_before(Y).
template <typename Tc>
__device__ void gdn_decay_rows(float* R, int ldr, const Tc* D, int ldd, const Tc* Y, const Tc* Sb, int ldt,
                               const float* G, int ldg, int ws) {
    for (int I = 1; I < GDN_NSUB; I++) {
        cta_mm<false, false>(R + GDN_SUB * I * ldr, ldr, D + GDN_SUB * I * ldd, ldd, Sb + gdn_before_off(I) * ldt,
                             ldt, GDN_SUB, ws, GDN_SUB * I, false, false);
    }
    __syncthreads();
    cta_for_each_slab<GdnTile<Tc>::SL>(GDN_CHUNK, ws, [&](int r, int c) {
        const int f = r & ~(GDN_SUB - 1);
        const float Gr = G[r * ldg + c];
        float sum = f > 0 ? R[r * ldr + c] * gdn_decay_exp(Gr - G[f * ldg + c]) : 0.0f;
        for (int s = f; s <= r; s++) {
            sum = fmaf(to_float(D[r * ldd + s]) * to_float(Y[s * ldt + c]), gdn_decay_exp(Gr - G[s * ldg + c]), sum);
        }
        R[r * ldr + c] = sum;
    });
}

// C[s][c] = sum_{r >= s} D[r][s] X[r][c] exp(G[r][c] - G[s][c]) (D as in gdn_decay_rows). Sa = gdn_decay_stack_after(X).
template <typename Tc>
__device__ void gdn_decay_cols(float* C, int ldc, const Tc* D, int ldd, const Tc* X, const Tc* Sa, int ldt,
                               const float* G, int ldg, int ws) {
    for (int J = 0; J < GDN_NSUB - 1; J++) {
        cta_mm<true, false>(C + GDN_SUB * J * ldc, ldc, D + GDN_SUB * (J + 1) * ldd + GDN_SUB * J, ldd,
                            Sa + gdn_after_off(J) * ldt, ldt, GDN_SUB, ws, GDN_SUB * (GDN_NSUB - 1 - J), false, false);
    }
    __syncthreads();
    cta_for_each_slab<GdnTile<Tc>::SL>(GDN_CHUNK, ws, [&](int s, int c) {
        const int e = s | (GDN_SUB - 1);
        const float Gs = G[s * ldg + c];
        float sum = e < GDN_CHUNK - 1 ? C[s * ldc + c] * gdn_decay_exp(G[e * ldg + c] - Gs) : 0.0f;
        for (int r = s; r <= e; r++) {
            sum = fmaf(to_float(D[r * ldd + s]) * to_float(X[r * ldt + c]), gdn_decay_exp(G[r * ldg + c] - Gs), sum);
        }
        C[s * ldc + c] = sum;
    });
}

// ----------------------------------------------------------------------------------------------------------
// forward kernel 1 (spec 3.3 step 2): per chunk G, A, Tm, W, U

// G = the cumulative sum over the chunk of the per-channel log decays g, for a slab of ws channels (stride ldg),
// in place and in a fixed order: each 16-row block's running sums, then the totals of the blocks before it added
// (X: 3 ws floats of scratch for those totals)
__device__ void gdn_chunk_cumsum_channels(float* G, int ldg, int ws, float* X) {
    for (int i = threadIdx.x; i < GDN_NSUB * ws; i += blockDim.x) {
        const int d = i % ws, f = (i / ws) * GDN_SUB;
        float acc = 0.0f;
        for (int r = f; r < f + GDN_SUB; r++) {
            acc += G[r * ldg + d];
            G[r * ldg + d] = acc;
        }
        if (i < (GDN_NSUB - 1) * ws) { X[i] = acc; }   // block i / ws's total of channel d
    }
    __syncthreads();
    for (int i = threadIdx.x; i < (GDN_NSUB - 1) * ws; i += blockDim.x) {
        const int d = i % ws, I = i / ws + 1;
        float base = 0.0f;
        for (int J = 0; J < I; J++) { base += X[J * ws + d]; }
        for (int r = GDN_SUB * I; r < GDN_SUB * (I + 1); r++) { G[r * ldg + d] += base; }
    }
    __syncthreads();
}

template <typename Tc> struct GdnIntraSmem {
    float *A, *Tm, *X, *C, *G, *beta, *bg;
    Tc *Tm_op, *slab, *slab_w;   // slab_w: the write key's slab where it differs from the read key's
    Tc *slab_x, *Sb;             // per-channel decay: a third raw slab, and the stacked rows (gdn_decay_stack_before)
    size_t bytes;
    // G: [BT] per head; per channel the slab's [BT][LDF]
    __host__ __device__ GdnIntraSmem(size_t base, GdnDecay decay) {
        typedef GdnTile<Tc> TL;
        const bool ch = decay == GDN_DECAY_CHANNEL;
        SmemCarver cv(base);
        A = cv.take<float>(GDN_CHUNK * TL::LDF_BT);
        C = A;   // the products of W and U replace A, which the solve leaves dead
        Tm = cv.take<float>(GDN_CHUNK * TL::LDF_BT);
        X = cv.take<float>(ch ? 3 * 256 : 0);   // per channel G's block totals (3 x SL)
        G = cv.take<float>(ch ? GDN_CHUNK * TL::LDF : GDN_CHUNK);
        beta = cv.take<float>(GDN_CHUNK);
        bg = cv.take<float>(GDN_CHUNK);
        Tm_op = cv.take<Tc>(GDN_CHUNK * TL::LDT_BT);
        slab = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        slab_w = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        slab_x = cv.take<Tc>(ch ? GDN_CHUNK * TL::LDT : 0);
        Sb = cv.take<Tc>(ch ? GDN_STACK_ROWS * TL::LDT : 0);
        bytes = cv.off;
    }
};

// per head, g_stride is the distance between the log decays of consecutive (token, head) pairs (1 for a [BT, H] g;
// dk for the pdn family's per-channel [BT, H*dk] g, whose scalar decay is every channel's); per channel, g is
// [BT, H*dk]. Per channel the kernel also saves A0, Aqk, Qg and Kwe (see the saved layout), and needs q and scale.
// Aqk's decayed product uses the stack of Kw that A's builds, its operand rows of Q go where Tm_op will be and its
// fp32 sums where Tm will be: both are free until the solve, and Aqk is saved before it.
// threads of the intra kernel
__host__ __device__ constexpr int gdn_intra_threads(GdnDecay decay) {
    return decay == GDN_DECAY_CHANNEL ? GDN_CH_THREADS : GDN_THREADS;
}

// per channel two CTAs of 512 threads per SM (at most 64 registers)
template <typename Tin, typename Tc, GdnDecay DECAY>
__global__ void __launch_bounds__(gdn_intra_threads(DECAY), DECAY == GDN_DECAY_CHANNEL ? 2 : 1)
gdn_fwd_intra_kernel(float* Tm_saved, float* G_saved, Tc* W_saved, Tc* U_work, float* A0_saved, Tc* Aqk_saved,
                     Tc* Qg_saved, Tc* Kwe_saved, const Tin* q, const Tin* k, const Tin* v, int ld_qkv, const Tin* kw, int ld_kw,
                     const float* beta, const float* g, int g_stride, int T, int H, int NT, int dk, int dv,
                     float scale) {
    typedef GdnTile<Tc> TL;
    constexpr int BT = GDN_CHUNK, SL = TL::SL;
    constexpr bool CH = DECAY == GDN_DECAY_CHANNEL;
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    const GdnChunkPos p = gdn_chunk_pos(blockIdx.x, T, H, NT);
    const int dkp = round16_dev(dk), dvp = round16_dev(dv), LDF = TL::LDF;
    GdnIntraSmem<Tc> sm((size_t)gdn_smem, DECAY);

    // beta and g (0 on padded rows), then G = the cumulative sum of g from the chunk start (spec 3.1), in a fixed
    // order: per head here by a warp scan (gdn_head_G_beta, with beta gam); per channel slab by slab in the loop below
    // (and saved there)
    if constexpr (CH) {
        gdn_load_beta(sm.beta, beta, p, H);
        for (int r = threadIdx.x; r < BT; r += blockDim.x) { sm.bg[r] = sm.beta[r]; }   // the exp(G) per element
    } else {
        gdn_head_G_beta(sm.G, sm.beta, sm.bg, G_saved, g, g_stride, beta, p, H);
        __syncthreads();
    }

    // K Kw^T over dk slabs: per head one GEMM, the decay applied below; per channel (always with a write key of
    // its own) the slab's G first, then the blocked decayed products K Kw^T into A and Q Kw^T into Tm's memory
    const bool split = kw != k;
    for (int s0 = 0; s0 < dkp; s0 += SL) {
        const int ws = min(SL, dkp - s0);
        const auto k_tile = gdn_in_tile(sm.slab, TL::LDT, ws, k, ld_qkv, p, dk, s0);
        const auto kw_tile = gdn_in_tile(sm.slab_w, TL::LDT, ws, kw, ld_kw, p, dk, s0);
        const Tc* Kw = split ? sm.slab_w : sm.slab;
        if constexpr (CH) {
            Tc* const Xr = sm.Tm_op;   // the referred rows of K, then of Q (stride LDT)
            tile_load<2>(k_tile, kw_tile, gdn_in_tile(sm.slab_x, TL::LDT, ws, q, ld_qkv, p, dk, s0),
                         gdn_in_tile(sm.G, LDF, ws, g, H * dk, p, dk, s0));
            gdn_chunk_cumsum_channels(sm.G, LDF, ws, sm.X);
            cta_for_each_slab<SL>(BT, min(ws, dk - s0), [&](int r, int d) {
                G_saved[(p.c * BT + r) * dk + s0 + d] = sm.G[r * LDF + d];
            });
            gdn_decay_refer_rows(Xr, sm.slab, TL::LDT, sm.G, LDF, ws);
            gdn_decay_stack_before(sm.Sb, Kw, TL::LDT, sm.G, LDF, ws);
            gdn_decay_product<false>(sm.A, TL::LDF_BT, sm.slab, Kw, Xr, sm.Sb, TL::LDT, sm.G, LDF, ws, s0 > 0);
            gdn_decay_refer_rows(Xr, sm.slab_x, TL::LDT, sm.G, LDF, ws);
            gdn_decay_product<true>(sm.Tm, TL::LDF_BT, sm.slab_x, Kw, Xr, sm.Sb, TL::LDT, sm.G, LDF, ws, s0 > 0);
        } else {
            if (split) {
                tile_load<2>(k_tile, kw_tile);
            } else {
                tile_load<2>(k_tile);
            }
            cta_mm<false, true>(sm.A, TL::LDF_BT, sm.slab, TL::LDT, Kw, TL::LDT, BT, BT, ws, s0 > 0);
        }
    }
    // A_ij = beta_i (k_i.kw_j) exp(G_i - G_j) for i > j, else 0 (per head the exp only for i > j, spec 5); per
    // channel A0 = A without beta is saved for dbeta, and Aqk = scale tril(the decayed Q Kw^T) for the output
    cta_for_each(BT, BT, [&](int i, int j) {
        float* a = sm.A + i * TL::LDF_BT + j;
        if constexpr (CH) {
            const float a0 = i > j ? *a : 0.0f;
            A0_saved[(p.c * BT + i) * BT + j] = a0;
            *a = sm.beta[i] * a0;
            Aqk_saved[(p.c * BT + i) * BT + j] = from_float<Tc>(i >= j ? scale * sm.Tm[i * TL::LDF_BT + j] : 0.0f);
        } else {
            *a = i > j ? sm.beta[i] * (*a) * expf(sm.G[i] - sm.G[j]) : 0.0f;
        }
    });
    gdn_solve_unit_lower(sm.Tm, sm.A);
    cta_for_each(BT, BT, [&](int i, int j) {
        const float t = sm.Tm[i * TL::LDF_BT + j];
        Tm_saved[(p.c * BT + i) * BT + j] = t;
        sm.Tm_op[i * TL::LDT_BT + j] = from_float<Tc>(t);
    });
    // W = Tm diag(beta gam) K, slab by slab of dk (per channel Tm diag(beta) (K (.) exp(G)), and the operands
    // Qg = scale Q (.) exp(G) and Kwe = Kw (.) exp(G_BT - G) of the state and output kernels are saved; the slab's G
    // comes back from G_saved, this CTA's own writes)
    for (int s0 = 0; s0 < dkp; s0 += SL) {
        const int ws = min(SL, dkp - s0);
        Tc* kbg = sm.slab;
        if constexpr (CH) {
            tile_load<2>(gdn_in_tile(sm.slab, TL::LDT, ws, k, ld_qkv, p, dk, s0),
                         gdn_in_tile(sm.slab_w, TL::LDT, ws, kw, ld_kw, p, dk, s0),
                         gdn_in_tile(sm.slab_x, TL::LDT, ws, q, ld_qkv, p, dk, s0),
                         gdn_mat_tile(sm.G, LDF, BT, ws, G_saved + p.c * BT * dk, BT, dk, 0, s0));
            kbg = sm.Sb;
            cta_for_each_slab<SL>(BT, ws, [&](int r, int c) {
                const float G = sm.G[r * LDF + c], e = gdn_decay_exp(G);
                kbg[r * TL::LDT + c] = from_float<Tc>(sm.beta[r] * to_float(sm.slab[r * TL::LDT + c]) * e);
                if (s0 + c < dk) {
                    const size_t off = (p.c * BT + r) * dk + s0 + c;
                    Qg_saved[off] = from_float<Tc>(scale * to_float(sm.slab_x[r * TL::LDT + c]) * e);
                    Kwe_saved[off] = from_float<Tc>(to_float(sm.slab_w[r * TL::LDT + c]) *
                                                    gdn_decay_exp(sm.G[(BT - 1) * LDF + c] - G));
                }
            });
        } else {
            tile_load<2>(gdn_in_tile(sm.slab, TL::LDT, ws, k, ld_qkv, p, dk, s0, sm.bg));
        }
        cta_mm<false, false>(sm.C, TL::LDF, sm.Tm_op, TL::LDT_BT, kbg, TL::LDT, BT, ws, BT, false);
        cta_for_each_slab<SL>(BT, ws, [&](int r, int c) {
            if (s0 + c < dk) { W_saved[(p.c * BT + r) * dk + s0 + c] = from_float<Tc>(sm.C[r * TL::LDF + c]); }
        });
    }
    // U = Tm diag(beta) V, slab by slab of dv
    for (int s0 = 0; s0 < dvp; s0 += SL) {
        const int ws = min(SL, dvp - s0);
        tile_load<2>(gdn_in_tile(sm.slab, TL::LDT, ws, v, ld_qkv, p, dv, s0, sm.beta));
        cta_mm<false, false>(sm.C, TL::LDF, sm.Tm_op, TL::LDT_BT, sm.slab, TL::LDT, BT, ws, BT, false);
        cta_for_each_slab<SL>(BT, ws, [&](int r, int c) {
            if (s0 + c < dv) { U_work[(p.c * BT + r) * dv + s0 + c] = from_float<Tc>(sm.C[r * TL::LDF + c]); }
        });
    }
}

// ----------------------------------------------------------------------------------------------------------
// forward kernel 2 (spec 3.3 step 3): the state pass, sequential over the chunks of one (b, h), one CTA per
// GDN_STATE_BV columns of dv. The state S (dk x BV) stays in shared memory in fp32. Each step waits for two
// batched loads: the chunk's U with the (first) W slab, then the Kw slab. Per channel (spec/pdn.md 3.2) the
// decay goes with the key instead of Vn: S <- diag(gam_BT) S + Kwe^T Vn with the saved Kwe = Kw (.) exp(G_BT - G).

// groups of 8 per thread that one round trip of a state kernel's slab load needs (a BT x SLS slab)
template <typename Tc> struct GdnStateLoad {
    static constexpr int N = GDN_CHUNK * GdnTile<Tc>::SLS / 8 / GDN_STATE_THREADS;
    static_assert(N >= 1 && GDN_STATE_THREADS >= GDN_CHUNK, "state kernels: one thread per row of G");
};

template <typename Tc> struct GdnStateSmem {
    float *S, *C, *G;
    Tc *S_op, *slab, *V_op, *U;
    size_t bytes;
    __host__ __device__ GdnStateSmem(size_t base, int dkp) {
        typedef GdnTile<Tc> TL;
        SmemCarver cv(base);
        S = cv.take<float>((size_t)dkp * TL::LDF_BV);
        C = cv.take<float>(GDN_CHUNK * TL::LDF_BV);
        G = cv.take<float>(GDN_STATE_THREADS);   // per head G [BT]; per channel exp(G_BT) [dk]
        S_op = cv.take<Tc>((size_t)dkp * TL::LDT_BV);
        slab = cv.take<Tc>(GDN_CHUNK * TL::LDTS);
        V_op = cv.take<Tc>(GDN_CHUNK * TL::LDT_BV);
        U = cv.take<Tc>(GDN_CHUNK * TL::LDT_BV);
        bytes = cv.off;
    }
};

template <typename Tin, typename Tc, GdnDecay DECAY>
__global__ void __launch_bounds__(GDN_STATE_THREADS, GDN_STATE_CTAS)
gdn_fwd_state_kernel(Tc* h_saved, Tc* Vn_saved, const float* G_saved, const Tc* W_saved, const Tc* U_work,
                     const Tin* kw, int ld_kw, const Tc* Kwe_saved, int T, int H, int NT, int dk, int dv) {
    typedef GdnTile<Tc> TL;
    constexpr int BT = GDN_CHUNK, SL = TL::SLS, BV = GDN_STATE_BV;
    constexpr bool CH = DECAY == GDN_DECAY_CHANNEL;
    static_assert(GDN_STATE_THREADS >= 256, "per channel: one thread per channel of dk <= 256");
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    const int dkp = round16_dev(dk);
    GdnStateSmem<Tc> sm((size_t)gdn_smem, dkp);
    const int bh = blockIdx.y, v0 = blockIdx.x * BV;

    constexpr int N = GdnStateLoad<Tc>::N;
    cta_for_each(dkp, BV, [&](int d, int j) { sm.S[d * TL::LDF_BV + j] = 0.0f; });   // S_0 = 0
    for (int n = 0; n < NT; n++) {
        const size_t c = (size_t)bh * NT + n;
        const GdnChunkPos p = gdn_chunk_pos(c, T, H, NT);
        // G (per channel G_BT; stored once the tile loads below are in flight); h_n = S (saved for the output
        // kernel and the backward), and S as a matrix operand
        float g_r = 0.0f;
        if (CH && threadIdx.x < dk) { g_r = G_saved[(c * BT + BT - 1) * dk + threadIdx.x]; }
        if (!CH && threadIdx.x < BT) { g_r = G_saved[c * BT + threadIdx.x]; }
        cta_for_each(dkp, BV, [&](int d, int j) {
            const Tc x = from_float<Tc>(sm.S[d * TL::LDF_BV + j]);
            sm.S_op[d * TL::LDT_BV + j] = x;
            if (d < dk && v0 + j < dv) { h_saved[(c * dk + d) * dv + v0 + j] = x; }
        });
        if (threadIdx.x < (CH ? dkp : BT)) { sm.G[threadIdx.x] = CH ? expf(g_r) : g_r; }
        // W S, contracting over dk slab by slab; U comes with the first slab
        for (int s0 = 0; s0 < dkp; s0 += SL) {
            const int ws = min(SL, dkp - s0);
            const auto w_tile = gdn_mat_tile(sm.slab, TL::LDTS, BT, ws, W_saved + c * BT * dk, BT, dk, 0, s0);
            if (s0 == 0) {
                tile_load<(N + 1) / 2>(w_tile, gdn_mat_tile(sm.U, TL::LDT_BV, BT, BV, U_work + c * BT * dv, BT, dv, 0, v0));
            } else {
                tile_load<N>(w_tile);
            }
            cta_mm<false, false>(sm.C, TL::LDF_BV, sm.slab, TL::LDTS, sm.S_op + s0 * TL::LDT_BV, TL::LDT_BV,
                                 BT, BV, ws, s0 > 0);
        }
        // Vn = U - W S (the true write vectors u_i, spec 3.1); V_op = diag(exp(G_BT - G)) Vn (per channel Vn);
        // S <- gam_BT S
        const float G_last = sm.G[BT - 1];
        cta_for_each(BT, BV, [&](int r, int j) {
            float vn = 0.0f;
            if (v0 + j < dv) {
                vn = to_float(sm.U[r * TL::LDT_BV + j]) - sm.C[r * TL::LDF_BV + j];
                Vn_saved[(c * BT + r) * dv + v0 + j] = from_float<Tc>(vn);
            }
            sm.V_op[r * TL::LDT_BV + j] = from_float<Tc>(CH ? vn : vn * expf(G_last - sm.G[r]));
        });
        const float gam_last = expf(G_last);
        cta_for_each(dkp, BV, [&](int d, int j) { sm.S[d * TL::LDF_BV + j] *= CH ? sm.G[d] : gam_last; });
        // S += Kw^T V_op (per channel Kwe^T Vn), slab of dk rows by slab
        for (int s0 = 0; s0 < dkp; s0 += SL) {
            const int ws = min(SL, dkp - s0);
            if constexpr (CH) {
                tile_load<N>(gdn_mat_tile(sm.slab, TL::LDTS, BT, ws, Kwe_saved + c * BT * dk, BT, dk, 0, s0));
            } else {
                tile_load<N>(gdn_in_tile(sm.slab, TL::LDTS, ws, kw, ld_kw, p, dk, s0));
            }
            cta_mm<true, false>(sm.S + s0 * TL::LDF_BV, TL::LDF_BV, sm.slab, TL::LDTS, sm.V_op, TL::LDT_BV,
                                ws, BV, BT, true);
        }
    }
}

// ----------------------------------------------------------------------------------------------------------
// forward kernel 3 (spec 3.3 step 4): O = scale (diag(gam) Q h_n + (Q Kw^T (.) M) Vn), one CTA per
// (chunk, VO = 2 SL columns of dv); M_ij = exp(G_i - G_j) for i >= j, else 0. The dv tile is twice the slab
// width so that Q Kw^T, and the loads of Q and Kw, are not repeated per dv tile at dv <= VO.
// Per channel (spec/pdn.md 3.2): O = Qg h_n + Aqk Vn with the intra kernel's Qg = scale Q (.) exp(G) and Aqk.

template <typename Tc> struct GdnOutputSmem {
    float *P, *O, *G;            // P, G: per head
    Tc *Q, *K, *Hs, *P_op, *Vn;  // Q: per head Q, per channel Qg; K: per head
    size_t bytes;
    __host__ __device__ GdnOutputSmem(size_t base, GdnDecay decay) {
        typedef GdnTile<Tc> TL;
        const bool head = decay == GDN_DECAY_HEAD;
        SmemCarver cv(base);
        P = cv.take<float>(head ? GDN_CHUNK * TL::LDF_BT : 0);
        O = cv.take<float>(GDN_CHUNK * TL::LDF_VO);
        G = cv.take<float>(head ? GDN_CHUNK : 0);
        Q = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        K = cv.take<Tc>(GDN_CHUNK * (TL::LDT > TL::LDT_BT ? TL::LDT : TL::LDT_BT));
        P_op = K;   // the masked P (per channel the loaded Aqk) replaces the K slab once the dk loop is done
        Hs = cv.take<Tc>(TL::SL * TL::LDT_VO);
        Vn = cv.take<Tc>(GDN_CHUNK * TL::LDT_VO);
        bytes = cv.off;
    }
};

template <typename Tin, typename Tc, GdnDecay DECAY>
__global__ void __launch_bounds__(GDN_THREADS, 2)   // two CTAs per SM (registers and shared memory)
gdn_fwd_output_kernel(Tin* o, int ld_o, const Tc* Aqk_saved, const Tin* q, int ld_qkv, const Tin* kw, int ld_kw,
                      const float* G_saved, const Tc* h_saved, const Tc* Vn_saved, const Tc* Qg_saved, int T, int H,
                      int NT, int dk, int dv, float scale) {
    typedef GdnTile<Tc> TL;
    constexpr int BT = GDN_CHUNK, SL = TL::SL, VO = TL::VO;
    constexpr int N = GDN_CHUNK * VO / 8 / GDN_THREADS;   // groups of 8 per thread of a BT x VO tile
    constexpr bool CH = DECAY == GDN_DECAY_CHANNEL;
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    GdnOutputSmem<Tc> sm((size_t)gdn_smem, DECAY);
    const GdnChunkPos p = gdn_chunk_pos(blockIdx.x, T, H, NT);
    const int dkp = round16_dev(dk), dvp = round16_dev(dv);
    const int v0 = blockIdx.y * VO, wv = min(VO, dvp - v0);

    // per head Q Kw^T and Q h_n, per channel Qg h_n, contracting over dk slab by slab; G and the Vn tile come
    // with the first slab
    for (int s0 = 0; s0 < dkp; s0 += SL) {
        const int ws = min(SL, dkp - s0);
        const auto h_tile = gdn_mat_tile(sm.Hs, TL::LDT_VO, ws, wv, h_saved + p.c * dk * dv, dk, dv, s0, v0);
        const auto vn_tile = gdn_mat_tile(sm.Vn, TL::LDT_VO, BT, wv, Vn_saved + p.c * BT * dv, BT, dv, 0, v0);
        if constexpr (CH) {
            const auto qg_tile = gdn_mat_tile(sm.Q, TL::LDT, BT, ws, Qg_saved + p.c * BT * dk, BT, dk, 0, s0);
            if (s0 == 0) {
                tile_load<N>(qg_tile, h_tile, vn_tile);
            } else {
                tile_load<N>(qg_tile, h_tile);
            }
        } else {
            const auto q_tile = gdn_in_tile(sm.Q, TL::LDT, ws, q, ld_qkv, p, dk, s0);
            const auto k_tile = gdn_in_tile(sm.K, TL::LDT, ws, kw, ld_kw, p, dk, s0);
            if (s0 == 0) {
                tile_load<N>(q_tile, k_tile, h_tile, vn_tile, gdn_mat_tile(sm.G, BT, 1, BT, G_saved + p.c * BT, 1, BT, 0, 0));
            } else {
                tile_load<N>(q_tile, k_tile, h_tile);
            }
            cta_mm<false, true>(sm.P, TL::LDF_BT, sm.Q, TL::LDT, sm.K, TL::LDT, BT, BT, ws, s0 > 0, false);
        }
        cta_mm<false, false>(sm.O, TL::LDF_VO, sm.Q, TL::LDT, sm.Hs, TL::LDT_VO, BT, wv, ws, s0 > 0);
    }
    if constexpr (CH) {
        tile_load<N>(gdn_mat_tile(sm.P_op, TL::LDT_BT, BT, BT, Aqk_saved + p.c * BT * BT, BT, BT, 0, 0));
    } else {
        cta_for_each(BT, BT, [&](int i, int j) {
            sm.P_op[i * TL::LDT_BT + j] = from_float<Tc>(i >= j ? sm.P[i * TL::LDF_BT + j] * expf(sm.G[i] - sm.G[j]) : 0.0f);
        });
        cta_for_each_slab<VO>(BT, wv, [&](int i, int j) { sm.O[i * TL::LDF_VO + j] *= expf(sm.G[i]); });
    }
    cta_mm<false, false>(sm.O, TL::LDF_VO, sm.P_op, TL::LDT_BT, sm.Vn, TL::LDT_VO, BT, wv, BT, true);
    const float out_scale = CH ? 1.0f : scale;   // per channel the scale is in Qg and Aqk
    cta_for_each_slab<VO>(p.L, wv, [&](int r, int j) {
        if (v0 + j < dv) {
            o[(p.row0 + r) * ld_o + (size_t)p.h * dv + v0 + j] = from_float<Tin>(out_scale * sm.O[r * TL::LDF_VO + j]);
        }
    });
}

// ----------------------------------------------------------------------------------------------------------
// backward kernel 2 (spec 3.4 Kernel 2): dVl = scale (Kw Q^T (.) M^T) dO, i.e.
// dVl_i = scale sum_{j>=i} exp(G_j - G_i) (kw_i.q_j) dO_j, written fp32 to the dVn workspace; per channel
// dVl = Aqk^T dO with the forward's saved Aqk

template <typename Tc> struct GdnDvlocalSmem {
    float *P, *C, *G;
    Tc *Q, *K, *P_op;
    size_t bytes;
    __host__ __device__ explicit GdnDvlocalSmem(size_t base) {
        typedef GdnTile<Tc> TL;
        SmemCarver cv(base);
        P = cv.take<float>(GDN_CHUNK * TL::LDF_BT);
        C = cv.take<float>(GDN_CHUNK * TL::LDF);
        G = cv.take<float>(GDN_CHUNK);
        Q = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        K = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        P_op = cv.take<Tc>(GDN_CHUNK * TL::LDT_BT);
        bytes = cv.off;
    }
};

template <typename Tin, typename Tc, GdnDecay DECAY>
__global__ void __launch_bounds__(GDN_THREADS)
gdn_bwd_dvlocal_kernel(float* dVn_work, const Tin* dO, int ld_o, const Tin* q, int ld_qkv, const Tin* kw, int ld_kw,
                       const float* G_saved, const Tc* Aqk_saved, int T, int H, int NT, int dk, int dv, float scale) {
    typedef GdnTile<Tc> TL;
    constexpr int BT = GDN_CHUNK, SL = TL::SL;
    constexpr bool CH = DECAY == GDN_DECAY_CHANNEL;
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    GdnDvlocalSmem<Tc> sm((size_t)gdn_smem);
    const GdnChunkPos p = gdn_chunk_pos(blockIdx.x, T, H, NT);
    const int dkp = round16_dev(dk), dvp = round16_dev(dv);
    if constexpr (CH) {
        tile_load<2>(gdn_mat_tile(sm.P_op, TL::LDT_BT, BT, BT, Aqk_saved + p.c * BT * BT, BT, BT, 0, 0));
    } else {
        gdn_load_G(sm.G, G_saved, p.c);
        for (int s0 = 0; s0 < dkp; s0 += SL) {
            const int ws = min(SL, dkp - s0);
            tile_load<2>(gdn_in_tile(sm.K, TL::LDT, ws, kw, ld_kw, p, dk, s0),
                         gdn_in_tile(sm.Q, TL::LDT, ws, q, ld_qkv, p, dk, s0));
            cta_mm<false, true>(sm.P, TL::LDF_BT, sm.K, TL::LDT, sm.Q, TL::LDT, BT, BT, ws, s0 > 0);
        }
        cta_for_each(BT, BT, [&](int i, int j) {
            sm.P_op[i * TL::LDT_BT + j] = from_float<Tc>(j >= i ? scale * sm.P[i * TL::LDF_BT + j] * expf(sm.G[j] - sm.G[i]) : 0.0f);
        });
    }
    for (int s0 = 0; s0 < dvp; s0 += SL) {
        const int ws = min(SL, dvp - s0);
        tile_load<2>(gdn_in_tile(sm.Q, TL::LDT, ws, dO, ld_o, p, dv, s0));
        cta_mm<CH, false>(sm.C, TL::LDF, sm.P_op, TL::LDT_BT, sm.Q, TL::LDT, BT, ws, BT, false);
        cta_for_each_slab<SL>(BT, ws, [&](int r, int c) {
            if (s0 + c < dv) { dVn_work[(p.c * BT + r) * dv + s0 + c] = sm.C[r * TL::LDF + c]; }
        });
    }
}

// ----------------------------------------------------------------------------------------------------------
// backward kernel 3 (spec 3.4 Kernel 3): reverse pass over the chunks of one (b, h), one CTA per GDN_STATE_BV
// columns of dv. dE (dk x BV, fp32 in shared memory) is dL/dS_end of the chunk through later chunks:
//     store dE_n = dE
//     dVn_n = dVl_n + diag(exp(G_BT - G)) Kw dE
//     dE    = gam_BT dE + scale (diag(gam) Q)^T dO - W^T dVn_n
// Per channel (spec/pdn.md 3.2) with the saved Kwe and Qg: dVn_n = dVl_n + Kwe dE, dE = diag(gam_BT) dE + Qg^T dO - W^T dVn_n

template <typename Tc> struct GdnBwdStateSmem {
    float *E, *C, *G, *sg, *dVl;
    Tc *E_op, *slab, *dO_op, *dVn_op;
    size_t bytes;
    __host__ __device__ GdnBwdStateSmem(size_t base, int dkp) {
        typedef GdnTile<Tc> TL;
        SmemCarver cv(base);
        E = cv.take<float>((size_t)dkp * TL::LDF_BV);
        C = cv.take<float>(GDN_CHUNK * TL::LDF_BV);
        G = cv.take<float>(GDN_STATE_THREADS);   // per head G [BT]; per channel exp(G_BT) [dk]
        sg = cv.take<float>(GDN_CHUNK);
        dVl = cv.take<float>(GDN_CHUNK * TL::LDF_BV);
        E_op = cv.take<Tc>((size_t)dkp * TL::LDT_BV);
        slab = cv.take<Tc>(GDN_CHUNK * TL::LDTS);
        dO_op = cv.take<Tc>(GDN_CHUNK * TL::LDT_BV);
        dVn_op = cv.take<Tc>(GDN_CHUNK * TL::LDT_BV);
        bytes = cv.off;
    }
};

template <typename Tin, typename Tc, GdnDecay DECAY>
__global__ void __launch_bounds__(GDN_STATE_THREADS, GDN_STATE_CTAS)
gdn_bwd_state_kernel(float* dVn_work, Tc* dE_work, const Tin* dO, int ld_o, const Tin* q, int ld_qkv, const Tin* kw,
                     int ld_kw, const float* G_saved, const Tc* W_saved, const Tc* Qg_saved, const Tc* Kwe_saved,
                     int T, int H, int NT, int dk, int dv, float scale) {
    typedef GdnTile<Tc> TL;
    constexpr int BT = GDN_CHUNK, SL = TL::SLS, BV = GDN_STATE_BV;
    constexpr bool CH = DECAY == GDN_DECAY_CHANNEL;
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    const int dkp = round16_dev(dk);
    GdnBwdStateSmem<Tc> sm((size_t)gdn_smem, dkp);
    const int bh = blockIdx.y, v0 = blockIdx.x * BV;

    constexpr int N = GdnStateLoad<Tc>::N;
    cta_for_each(dkp, BV, [&](int d, int j) { sm.E[d * TL::LDF_BV + j] = 0.0f; });   // dS_T = 0
    for (int n = NT - 1; n >= 0; n--) {
        const size_t c = (size_t)bh * NT + n;
        const GdnChunkPos p = gdn_chunk_pos(c, T, H, NT);
        float g_r = 0.0f;
        if (CH && threadIdx.x < dk) { g_r = G_saved[(c * BT + BT - 1) * dk + threadIdx.x]; }
        if (!CH && threadIdx.x < BT) { g_r = G_saved[c * BT + threadIdx.x]; }
        cta_for_each(dkp, BV, [&](int d, int j) {
            const Tc x = from_float<Tc>(sm.E[d * TL::LDF_BV + j]);
            sm.E_op[d * TL::LDT_BV + j] = x;
            if (d < dk && v0 + j < dv) { dE_work[(c * dk + d) * dv + v0 + j] = x; }
        });
        if (CH && threadIdx.x < dkp) { sm.G[threadIdx.x] = expf(g_r); }
        if (!CH && threadIdx.x < BT) {
            sm.G[threadIdx.x] = g_r;
            sm.sg[threadIdx.x] = scale * expf(g_r);
        }
        // Kw dE (per channel Kwe dE), contracting over dk slab by slab; dO and dVl come with the first slab
        for (int s0 = 0; s0 < dkp; s0 += SL) {
            const int ws = min(SL, dkp - s0);
            const auto load = [&](const auto& k_tile) {
                if (s0 == 0) {
                    tile_load<(N + 1) / 2>(k_tile, gdn_in_tile(sm.dO_op, TL::LDT_BV, BV, dO, ld_o, p, dv, v0),
                                          gdn_mat_tile(sm.dVl, TL::LDF_BV, BT, BV, dVn_work + c * BT * dv, BT, dv, 0, v0));
                } else {
                    tile_load<N>(k_tile);
                }
            };
            if constexpr (CH) {
                load(gdn_mat_tile(sm.slab, TL::LDTS, BT, ws, Kwe_saved + c * BT * dk, BT, dk, 0, s0));
            } else {
                load(gdn_in_tile(sm.slab, TL::LDTS, ws, kw, ld_kw, p, dk, s0));
            }
            cta_mm<false, false>(sm.C, TL::LDF_BV, sm.slab, TL::LDTS, sm.E_op + s0 * TL::LDT_BV, TL::LDT_BV,
                                 BT, BV, ws, s0 > 0);
        }
        const float G_last = sm.G[BT - 1];
        cta_for_each(BT, BV, [&](int r, int j) {
            float dvn = 0.0f;
            if (v0 + j < dv) {
                dvn = sm.dVl[r * TL::LDF_BV + j] + (CH ? 1.0f : expf(G_last - sm.G[r])) * sm.C[r * TL::LDF_BV + j];
                dVn_work[(c * BT + r) * dv + v0 + j] = dvn;
            }
            sm.dVn_op[r * TL::LDT_BV + j] = from_float<Tc>(-dvn);
        });
        const float gam_last = expf(G_last);
        cta_for_each(dkp, BV, [&](int d, int j) { sm.E[d * TL::LDF_BV + j] *= CH ? sm.G[d] : gam_last; });
        // dE += (scale diag(gam) Q)^T dO - W^T dVn (per channel Qg^T dO - W^T dVn), slab of dk rows by slab
        for (int s0 = 0; s0 < dkp; s0 += SL) {
            const int ws = min(SL, dkp - s0);
            if constexpr (CH) {
                tile_load<N>(gdn_mat_tile(sm.slab, TL::LDTS, BT, ws, Qg_saved + c * BT * dk, BT, dk, 0, s0));
            } else {
                tile_load<N>(gdn_in_tile(sm.slab, TL::LDTS, ws, q, ld_qkv, p, dk, s0, sm.sg));
            }
            cta_mm<true, false>(sm.E + s0 * TL::LDF_BV, TL::LDF_BV, sm.slab, TL::LDTS, sm.dO_op, TL::LDT_BV,
                                ws, BV, BT, true);
            tile_load<N>(gdn_mat_tile(sm.slab, TL::LDTS, BT, ws, W_saved + c * BT * dk, BT, dk, 0, s0));
            cta_mm<true, false>(sm.E + s0 * TL::LDF_BV, TL::LDF_BV, sm.slab, TL::LDTS, sm.dVn_op, TL::LDT_BV,
                                ws, BV, BT, true);
        }
    }
}

// ----------------------------------------------------------------------------------------------------------
// the state passes on register tiles (Tc = bf16, what the bf16 trainer runs): forward kernel 2 and backward kernel 3
// above, the same math and the same operands rounded to bf16, with the running state (S forward, dE backward) held
// in mma.sync C fragments (kernels/mma.cuh) for the whole sequence instead of fp32 shared memory, and each tile of
// the next chunk copied by cp.async while the current chunk computes. One CTA of 8 warps per (b, h, BV = 32 columns
// of dv), GDN_STATE_CTAS per SM. Warp w holds the state rows 16 w .. 16 w + 15 and 16 (w + 8) .. (dk <= 256) in
// four 16 x 8 fragments each; of the chunk product (64 x BV: W S forward, Kw dE backward) warp w holds rows
// 16 (w / 2) .. + 15, columns 16 (w % 2) .. + 15. Each tile has one buffer: a chunk step waits for the first
// product's tiles (W, U, G forward; Kw, G backward), and for the second's (Kw forward; Q, W, dO backward) before
// the barrier after the first product, and each tile's next copy starts at the barrier after the last read of it.

#define GDN_SMMA_MT 2   // state row blocks of 16 per warp: 8 warps x 2 x 16 = 256 >= dk

// The sequence split (context parallel) of the state passes, for few (b, h) pairs and long sequences (B = 1, T =
// 16K: 24 CTAs for 132 SMs, each walking 256 chunks). A chunk step is affine in the state:
//   forward   S_{n+1}  = A_n S_n + B_n,          A_n = gam_BT I - Kw^T diag(exp(G_BT - G)) W,  B_n = Kw^T diag(..) U
//   backward  dE_{n-1} = A_n^T dE_n + B'_n,      B'_n = (scale diag(gam) Q)^T dO - W^T dVl
// (per channel diag(gam_BT) and Kwe, Qg in their places). The chunks are cut into segments of len chunks, and
//   phase 1  every segment but the one the pass ends in runs the step from a zero state on dv + dk columns: on the
//            first dv the chunk's inputs (its affine part), on the last dk the identity with zero inputs, so its
//            end state is [B_seg | A_seg], the segment's map composed (GdnSegments.last); nothing is saved;
//   combine  gdn_state_combine_kernel walks the segments in pass order: S_start(next) = A_seg S_start + B_seg, from
//            zero (GdnSegments.first, fp32 on CUDA cores);
//   phase 3  every segment runs the step again from its start state on the dv columns, saving as the unsplit pass.
// Three passes' work instead of one, but B*H*dv/BV*segments CTAs in flight; the same rounding to bf16 of the
// operands per chunk, so the same error budget (phase 1's transition rounds its operand as the state does).
// Unsplit: one segment of NT chunks, no phase 1. H200, B=1 T=16384, 6 heads of dk = dv = 128 (16 segments of 16
// chunks; dev/cuda/gdn_chunk_bwd.cu): state passes 0.297 ms forward, 0.413 ms backward, against 0.090 / 0.134 ms at
// B=16 T=1024 (the same tokens, unsplit); gdn:12 at B=1 T=16384 63.9 -> 50.7 ms/step.
struct GdnSegments {
    const float* first;   // [B*H][count][dk][dv] the state at each segment's start (backward: its end); NULL: 0
    float* last;          // phase 1: [B*H][count][dk][dv + dk] its end state (backward: start); NULL: phase 3
    int len, count, base; // chunks per segment (the last may have fewer), segments, blockIdx.z's first segment
};

// f(r, j, x) on every element x (a reference) of the state fragments (the layout of gdn_state_to_op): r its row,
// j = v0 + its column
template <typename F>
__device__ __forceinline__ void gdn_state_elements(float st[GDN_SMMA_MT][4][4], int v0, int warp, int lane, F f) {
    #pragma unroll
    for (int i = 0; i < GDN_SMMA_MT; i++) {
        #pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                f(16 * (warp + 8 * i) + (lane >> 2) + 8 * (e >> 1), v0 + 8 * nt + 2 * (lane & 3) + (e & 1), st[i][nt][e]);
            }
        }
    }
}

// the state at a segment's start: column j of first (NULL: 0), or in phase 1 on the transition columns (j >= dv:
// row j - dv) the identity
__device__ __forceinline__ void gdn_state_begin(float st[GDN_SMMA_MT][4][4], const GdnSegments& sg, size_t bs, int v0,
                                                int dk, int dv, int warp, int lane) {
    const float* first = sg.first;
    const bool phase1 = sg.last != nullptr;
    gdn_state_elements(st, v0, warp, lane, [=](int r, int j, float& x) {
        x = r >= dk ? 0.0f : j >= dv ? (phase1 && j - dv == r ? 1.0f : 0.0f)
                                     : (first != nullptr ? first[(bs * dk + r) * dv + j] : 0.0f);
    });
}

// phase 1: the state at a segment's end into last (columns v0 .. of dv + dk)
__device__ __forceinline__ void gdn_state_end(float* last, float st[GDN_SMMA_MT][4][4], size_t bs, int v0, int dk,
                                              int dv, int warp, int lane) {
    const int wd = dv + dk;
    gdn_state_elements(st, v0, warp, lane, [=](int r, int j, float& x) {
        if (r < dk && j < wd) { last[(bs * dk + r) * wd + j] = x; }
    });
}

// shared memory of both passes: X and Y [BT][dkp + 8] (forward W and Kw; backward Kw and Q), Z (backward W),
// V [BT][BV + 8] (forward U; backward dO, scaled in place), G (forward and backward the chunk's G, per channel its
// last row over dk), op [dkp][BV + 8] (the state as the first product's operand), P [BT][BV + 8] (the second
// product's operand: forward diag(exp(G_BT - G)) Vn, backward -dVn)
struct GdnStateMmaSmem {
    __nv_bfloat16 *X, *Y, *Z, *V, *op, *P;
    float* G;
    size_t bytes;
    __host__ __device__ GdnStateMmaSmem(size_t base, int dkp, bool backward) {
        constexpr int LDV = GdnTile<__nv_bfloat16>::LDT_BV;
        SmemCarver cv(base);
        X = cv.take<__nv_bfloat16>((size_t)GDN_CHUNK * (dkp + 8));
        Y = cv.take<__nv_bfloat16>((size_t)GDN_CHUNK * (dkp + 8));
        Z = cv.take<__nv_bfloat16>(backward ? (size_t)GDN_CHUNK * (dkp + 8) : 0);
        V = cv.take<__nv_bfloat16>(GDN_CHUNK * LDV);
        op = cv.take<__nv_bfloat16>((size_t)dkp * LDV);
        P = cv.take<__nv_bfloat16>(GDN_CHUNK * LDV);
        G = cv.take<float>(256);   // BT per head, dkp <= 256 per channel
        bytes = cv.off;
    }
};

#define GDN_COMBINE_BV 8       // state columns per CTA of the combine kernel
#define GDN_COMBINE_KS 32      // columns of A_s per slab
#define GDN_COMBINE_STAGES 4   // slabs in flight

// shared memory of the combine kernel: the running state S [rows][BVc] and GDN_COMBINE_STAGES slabs of A_s
// [rows][KS + 4] (fp32), rows = dk rounded up to 32 MR (zeros beyond dk)
struct GdnCombineSmem {
    float *S, *slab;
    size_t bytes;
    __host__ __device__ GdnCombineSmem(size_t base, int rows) {
        SmemCarver cv(base);
        S = cv.take<float>((size_t)rows * GDN_COMBINE_BV);
        slab = cv.take<float>((size_t)GDN_COMBINE_STAGES * rows * (GDN_COMBINE_KS + 4));
        bytes = cv.off;
    }
};

// the split's combine step: the state at each segment's start (forward; backward its end) from phase 1's end states
// last[s] = [B_s | A_s], in pass order (backward from the last segment down): S = 0, then per segment first[s] = S,
// S = A_s S + B_s (fp32). One CTA of 256 threads per (b, h, 8 columns of dv), the running state in shared memory;
// thread t keeps column t % 8 of the rows t / 8 + 32 m, m < MR (32 MR >= dk; the rows beyond dk are zeros). The
// chain is sequential and short of work, so each step must be latency-lean: A_s streams through shared memory in
// slabs of KS columns, GDN_COMBINE_STAGES - 1 slabs ahead across the segments (cp.async), B_s of the next segment is
// loaded during the current one, and a slab's products are straight-line code (MR rows, KS columns unrolled).
// (H200, 16 segments, dk = dv = 128: 56 us; with the rows as predicated branches, 8 per thread for any dk, 181 us.)
template <int MR>
__global__ void __launch_bounds__(256)
gdn_state_combine_kernel(float* first, const float* last, int count, int dk, int dv, int backward) {
    constexpr int BVc = GDN_COMBINE_BV, KS = GDN_COMBINE_KS, LDS = KS + 4, NS = GDN_COMBINE_STAGES, ROWS = 32 * MR;
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    GdnCombineSmem sm((size_t)gdn_smem, ROWS);
    const int bh = blockIdx.y, c = threadIdx.x % BVc, j = blockIdx.x * BVc + c, r0 = threadIdx.x / BVc;
    const int wd = dv + dk, nslab = (dk + KS - 1) / KS, total = (count - 1) * nslab;
    const auto seg_of = [&](int i) { return backward ? count - 1 - i : i; };
    const auto end_state = [&](int i) { return last + ((size_t)bh * count + seg_of(i)) * dk * wd; };
    const auto issue = [&](int q) {   // slab q: columns (q % nslab) KS .. of A of the i = q / nslab-th segment
        if (q < total) {
            const int k0 = (q % nslab) * KS;
            tile_load_async(sm.slab + (q % NS) * ROWS * LDS, LDS, ROWS, KS, end_state(q / nslab) + dv + k0, wd, dk,
                            dk - k0);
        }
        cp_async_commit();   // (empty groups keep the count)
    };
    const auto load_B = [&](float* b, int i) {
        #pragma unroll
        for (int m = 0; m < MR; m++) {
            b[m] = i < count - 1 && r0 + 32 * m < dk ? end_state(i)[(size_t)(r0 + 32 * m) * wd + j] : 0.0f;
        }
    };
    #pragma unroll
    for (int m = 0; m < MR; m++) { sm.S[(r0 + 32 * m) * BVc + c] = 0.0f; }
    for (int q = 0; q < NS - 1; q++) { issue(q); }
    float bn[MR];
    load_B(bn, 0);
    for (int i = 0; i < count; i++) {
        const size_t bs = (size_t)bh * count + seg_of(i);
        __syncthreads();   // S written
        #pragma unroll
        for (int m = 0; m < MR; m++) {
            if (r0 + 32 * m < dk) { first[(bs * dk + r0 + 32 * m) * dv + j] = sm.S[(r0 + 32 * m) * BVc + c]; }
        }
        if (i == count - 1) { break; }
        float acc[MR];
        #pragma unroll
        for (int m = 0; m < MR; m++) { acc[m] = bn[m]; }   // B_s
        load_B(bn, i + 1);
        for (int kb = 0; kb < nslab; kb++) {
            const int q = i * nslab + kb;
            cp_async_wait<NS - 2>();   // slab q landed (this thread's copies)
            __syncthreads();           // everyone's copies; slab q - 1's buffer read by every thread
            issue(q + NS - 1);
            const float* A = sm.slab + (q % NS) * ROWS * LDS + r0 * LDS;
            const float* Sk = sm.S + kb * KS * BVc + c;   // (rows of S beyond dk: columns of A zero-filled)
            #pragma unroll
            for (int k = 0; k < KS; k += 4) {
                const float s0 = Sk[k * BVc], s1 = Sk[(k + 1) * BVc], s2 = Sk[(k + 2) * BVc], s3 = Sk[(k + 3) * BVc];
                #pragma unroll
                for (int m = 0; m < MR; m++) {
                    const float4 a = *reinterpret_cast<const float4*>(A + 32 * m * LDS + k);
                    acc[m] = fmaf(a.x, s0, fmaf(a.y, s1, fmaf(a.z, s2, fmaf(a.w, s3, acc[m]))));
                }
            }
        }
        __syncthreads();   // S read by every thread
        #pragma unroll
        for (int m = 0; m < MR; m++) { sm.S[(r0 + 32 * m) * BVc + c] = acc[m]; }
    }
}

// op = the warp's state rows, rounded to bf16
__device__ __forceinline__ void gdn_state_to_op(__nv_bfloat16* op, const float st[GDN_SMMA_MT][4][4], int dkp,
                                                int warp, int lane) {
    constexpr int LDV = GdnTile<__nv_bfloat16>::LDT_BV;
    #pragma unroll
    for (int i = 0; i < GDN_SMMA_MT; i++) {
        const int r = 16 * (warp + 8 * i) + (lane >> 2);
        if (r >= dkp) { break; }
        #pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const int j = 8 * nt + 2 * (lane & 3);
            *reinterpret_cast<uint32_t*>(op + r * LDV + j) = pack_bf16(st[i][nt][0], st[i][nt][1]);
            *reinterpret_cast<uint32_t*>(op + (r + 8) * LDV + j) = pack_bf16(st[i][nt][2], st[i][nt][3]);
        }
    }
}

// the state (op, after a barrier) to its global [dk][dv] copy at g (the chunk's h or dE, columns from v0), 16 bytes
// per copy
__device__ __forceinline__ void gdn_state_save(__nv_bfloat16* g, const __nv_bfloat16* op, int dk, int dv, int v0) {
    constexpr int LDV = GdnTile<__nv_bfloat16>::LDT_BV, GPR = GDN_STATE_BV / 8, STEP = GDN_STATE_THREADS / GPR;
    const int d0 = threadIdx.x / GPR, j = (threadIdx.x % GPR) * 8;   // rows d0, d0 + STEP, ... of one column group
    if (v0 + j >= dv) { return; }
    __nv_bfloat16* dst = g + (size_t)d0 * dv + v0 + j;
    const __nv_bfloat16* src = op + d0 * LDV + j;
    for (int d = d0; d < dk; d += STEP, dst += (size_t)STEP * dv, src += STEP * LDV) {
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    }
}

// acc = the warp's 16 x 16 block of A op (A [BT][dkp + 8] row-major, op [dkp][BV + 8]): forward W S, backward Kw dE
__device__ __forceinline__ void gdn_state_chunk_product(float acc[2][4], const __nv_bfloat16* A,
                                                        const __nv_bfloat16* op, int dkp, int warp, int lane) {
    constexpr int LDV = GdnTile<__nv_bfloat16>::LDT_BV;
    const int ld = dkp + 8, m0 = 16 * (warp >> 1), n0 = 16 * (warp & 1);
    float odd[2][4] = {};   // the odd k blocks' sums: two accumulation chains of half the length
    #pragma unroll
    for (int nt = 0; nt < 2; nt++) { acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f; }
    #pragma unroll 2
    for (int k0 = 0; k0 < dkp; k0 += 32) {
        uint32_t a[4], b[4];
        ldsm_x4(a, A + ldsm_a_off(ld, m0, k0, lane));
        ldsm_x4_trans(b, op + ldsm_b_kn_off(LDV, k0, n0, lane));
        mma_bf16(acc[0], a, b[0], b[1]);
        mma_bf16(acc[1], a, b[2], b[3]);
        if (k0 + 16 < dkp) {
            ldsm_x4(a, A + ldsm_a_off(ld, m0, k0 + 16, lane));
            ldsm_x4_trans(b, op + ldsm_b_kn_off(LDV, k0 + 16, n0, lane));
            mma_bf16(odd[0], a, b[0], b[1]);
            mma_bf16(odd[1], a, b[2], b[3]);
        }
    }
    #pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        #pragma unroll
        for (int e = 0; e < 4; e++) { acc[nt][e] += odd[nt][e]; }
    }
}

// st += Y^T R over the chunk's BT rows (Y [BT][dkp + 8], R [BT][BV + 8]): the state's update from a chunk
__device__ __forceinline__ void gdn_state_update(float st[GDN_SMMA_MT][4][4], const __nv_bfloat16* Y,
                                                 const __nv_bfloat16* R, int dkp, int warp, int lane) {
    constexpr int LDV = GdnTile<__nv_bfloat16>::LDT_BV;
    const int ld = dkp + 8;
    #pragma unroll
    for (int i = 0; i < GDN_SMMA_MT; i++) {
        const int m0 = 16 * (warp + 8 * i);
        if (m0 >= dkp) { break; }
        #pragma unroll
        for (int k0 = 0; k0 < GDN_CHUNK; k0 += 16) {
            uint32_t a[4];
            ldsm_x4_trans(a, Y + ldsm_a_km_off(ld, m0, k0, lane));
            #pragma unroll
            for (int p = 0; p < 2; p++) {
                uint32_t b[4];
                ldsm_x4_trans(b, R + ldsm_b_kn_off(LDV, k0, 16 * p, lane));
                mma_bf16(st[i][2 * p], a, b[0], b[1]);
                mma_bf16(st[i][2 * p + 1], a, b[2], b[3]);
            }
        }
    }
}

// st *= gam (per head, the same on every row) or diag(gam) st with gam[d] = exp(G[d]) (per channel, G the chunk's
// last row of G over dk in shared memory)
template <bool CH>
__device__ __forceinline__ void gdn_state_decay(float st[GDN_SMMA_MT][4][4], const float* G, float gam, int dkp,
                                                int warp, int lane) {
    #pragma unroll
    for (int i = 0; i < GDN_SMMA_MT; i++) {
        const int r = 16 * (warp + 8 * i) + (lane >> 2);
        if (r >= dkp) { break; }
        const float g0 = CH ? expf(G[r]) : gam, g1 = CH ? expf(G[r + 8]) : gam;
        #pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            st[i][nt][0] *= g0;
            st[i][nt][1] *= g0;
            st[i][nt][2] *= g1;
            st[i][nt][3] *= g1;
        }
    }
}

// The state kernels' per-chunk copies. DKP: the head size dk where the kernel is compiled for one (dk = DKP, a
// multiple of 16), else 0 (dk a runtime argument). The sequential state passes are bound by their instruction issue
// (ncu, H200: 59% of issue slots busy, two thirds of the instructions integer), so every copy's address is a fixed
// stride from one base (tile_load_async_fixed), and with DKP the products' loops have constant bounds.

// s [BT][dkp + 8] = the BT x dk operand tile g (row stride ldg, rv valid rows), zeros to dkp and below rv
template <int DKP, typename T>
__device__ __forceinline__ void gdn_state_load_rows(T* s, const T* g, size_t ldg, int rv, int dk) {
    if constexpr (DKP > 0) {
        tile_load_async_fixed<GDN_CHUNK, DKP, GDN_STATE_THREADS>(s, DKP + 8, g, ldg, rv, DKP);
    } else {
        tile_load_async(s, round16_dev(dk) + 8, GDN_CHUNK, round16_dev(dk), g, ldg, rv, dk);
    }
}

// s [BT][BV + 8] = the BT x BV tile g of the chunk's dv columns here (cv of them valid, rv rows)
__device__ __forceinline__ void gdn_state_load_cols(__nv_bfloat16* s, const __nv_bfloat16* g, size_t ldg, int rv,
                                                    int cv) {
    tile_load_async_fixed<GDN_CHUNK, GDN_STATE_BV, GDN_STATE_THREADS>(s, GdnTile<__nv_bfloat16>::LDT_BV, g, ldg, rv,
                                                                      cv);
}

// the per-head register-tile kernels' tile copies (GDN_THREADS threads): s [rows][lds] = the rows x cols tile g (row
// stride ldg; rv valid rows and cv valid columns, zeros beyond); D > 0: those kernels compiled for dk = dv = D, where
// the tile is R x D (cv = D) and the copies take fixed strides as the state kernels' do
template <int R, int D, typename T>
__device__ __forceinline__ void gdn_tile_load(T* s, int lds, int rows, int cols, const T* g, size_t ldg, int rv,
                                              int cv) {
    if constexpr (D > 0) {
        tile_load_async_fixed<R, D, GDN_THREADS>(s, lds, g, ldg, rv, D);
    } else {
        tile_load_async(s, lds, rows, cols, g, ldg, rv, cv);
    }
}

// the chunk's G into sm.G: per head G[0 .. BT) of the chunk, per channel its last row G[BT - 1][0 .. dk) (zeros to dkp)
template <bool CH, int DKP>
__device__ __forceinline__ void gdn_state_load_G(float* Gs, const float* G_saved, size_t c, int dk) {
    if constexpr (!CH) {
        tile_load_async_fixed<1, GDN_CHUNK, GDN_STATE_THREADS>(Gs, 0, G_saved + c * GDN_CHUNK, 0, 1, GDN_CHUNK);
    } else if constexpr (DKP > 0) {
        tile_load_async_fixed<1, DKP, GDN_STATE_THREADS>(Gs, 0, G_saved + (c * GDN_CHUNK + GDN_CHUNK - 1) * DKP, 0, 1,
                                                         DKP);
    } else {
        tile_load_async(Gs, 0, 1, round16_dev(dk), G_saved + (c * GDN_CHUNK + GDN_CHUNK - 1) * dk, 0, 1, dk);
    }
}

// the chunk's write keys into s [BT][dkp + 8]: Kw from the input, zero on padded rows (per channel the saved Kwe)
template <bool CH, int DKP>
__device__ __forceinline__ void gdn_state_load_kw(__nv_bfloat16* s, const __nv_bfloat16* kw, int ld_kw,
                                                  const __nv_bfloat16* Kwe_saved, const GdnChunkPos& p, int dk) {
    if (CH) {
        gdn_state_load_rows<DKP>(s, Kwe_saved + p.c * GDN_CHUNK * dk, dk, GDN_CHUNK, dk);
    } else {
        gdn_state_load_rows<DKP>(s, kw + p.row0 * ld_kw + (size_t)p.h * dk, ld_kw, p.L, dk);
    }
}

// grid (columns / BV, B*H, segments): columns dv (unsplit, phase 3) or dv + dk (phase 1), blockIdx.z + sg.base the
// segment; DKP > 0: compiled for dk = DKP (see gdn_state_load_rows)
template <GdnDecay DECAY, int DKP>
__global__ void __launch_bounds__(GDN_STATE_THREADS, GDN_STATE_CTAS)
gdn_fwd_state_mma_kernel(__nv_bfloat16* h_saved, __nv_bfloat16* Vn_saved, const float* G_saved,
                         const __nv_bfloat16* W_saved, const __nv_bfloat16* U_work, const __nv_bfloat16* kw, int ld_kw,
                         const __nv_bfloat16* Kwe_saved, GdnSegments sg, int T, int H, int NT, int dk, int dv) {
    constexpr int BT = GDN_CHUNK, BV = GDN_STATE_BV, LDV = GdnTile<__nv_bfloat16>::LDT_BV;
    constexpr bool CH = DECAY == GDN_DECAY_CHANNEL;
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    if (DKP > 0) { dk = DKP; }
    const int dkp = round16_dev(dk);
    GdnStateMmaSmem sm((size_t)gdn_smem, dkp, false);
    const int bh = blockIdx.y, v0 = blockIdx.x * BV, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int cr = 16 * (warp >> 1) + (lane >> 2), cc = 16 * (warp & 1) + 2 * (lane & 3);   // chunk product rows, cols
    const int seg = blockIdx.z + sg.base, n0 = seg * sg.len, n1 = min(n0 + sg.len, NT);
    const bool save = sg.last == nullptr;   // phase 1 saves nothing
    const int uv = v0 < dv ? v0 : 0, ucols = dv - v0;   // U's columns here (none on phase 1's transition columns)

    const auto load_first = [&](int n) {   // W, U and G of chunk n
        const size_t c = (size_t)bh * NT + n;
        gdn_state_load_rows<DKP>(sm.X, W_saved + c * BT * dk, dk, BT, dk);
        gdn_state_load_cols(sm.V, U_work + c * BT * dv + uv, dv, BT, ucols);
        gdn_state_load_G<CH, DKP>(sm.G, G_saved, c, dk);
        cp_async_commit();
    };
    const auto load_second = [&](int n) {   // Kw (per channel Kwe) of chunk n
        gdn_state_load_kw<CH, DKP>(sm.Y, kw, ld_kw, Kwe_saved, gdn_chunk_pos((size_t)bh * NT + n, T, H, NT), dk);
        cp_async_commit();
    };

    float st[GDN_SMMA_MT][4][4];
    gdn_state_begin(st, sg, (size_t)bh * sg.count + seg, v0, dk, dv, warp, lane);
    load_first(n0);
    load_second(n0);
    for (int n = n0; n < n1; n++) {
        const size_t c = (size_t)bh * NT + n;
        cp_async_wait<1>();   // this chunk's W, U and G (its Kw may still be in flight)
        gdn_state_to_op(sm.op, st, dkp, warp, lane);
        __syncthreads();
        if (save) { gdn_state_save(h_saved + c * dk * dv, sm.op, dk, dv, v0); }   // h_n = S
        float ws[2][4];
        gdn_state_chunk_product(ws, sm.X, sm.op, dkp, warp, lane);   // W S
        // Vn = U - W S (saved); P = diag(exp(G_BT - G)) Vn (per channel Vn)
        const float G_last = CH ? 0.0f : sm.G[BT - 1];
        __nv_bfloat16* vn = Vn_saved + (c * BT + cr) * dv + v0 + cc;   // this thread's first element of Vn
        #pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = cr + 8 * hr;
            const float e = CH ? 1.0f : expf(G_last - sm.G[r]);
            #pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const int j = cc + 8 * nt;
                const __nv_bfloat162 u = *reinterpret_cast<const __nv_bfloat162*>(sm.V + r * LDV + j);
                const float vn0 = __low2float(u) - ws[nt][2 * hr], vn1 = __high2float(u) - ws[nt][2 * hr + 1];
                if (save && v0 + j < dv) {
                    *reinterpret_cast<uint32_t*>(vn + (size_t)(8 * hr) * dv + 8 * nt) = pack_bf16(vn0, vn1);
                }
                *reinterpret_cast<uint32_t*>(sm.P + r * LDV + j) = pack_bf16(e * vn0, e * vn1);
            }
        }
        gdn_state_decay<CH>(st, sm.G, expf(G_last), dkp, warp, lane);   // S <- gam_BT S (per channel diag)
        cp_async_wait<0>();   // this chunk's Kw
        __syncthreads();      // P and Kw visible; W, U, G and op read by every warp
        if (n + 1 < n1) { load_first(n + 1); }
        gdn_state_update(st, sm.Y, sm.P, dkp, warp, lane);   // S += Kw^T P
        __syncthreads();   // Kw and P read by every warp
        if (n + 1 < n1) { load_second(n + 1); }
    }
    if (!save) { gdn_state_end(sg.last, st, (size_t)bh * sg.count + seg, v0, dk, dv, warp, lane); }
}

// grid and DKP as gdn_fwd_state_mma_kernel's; each segment walks its chunks backwards
template <GdnDecay DECAY, int DKP>
__global__ void __launch_bounds__(GDN_STATE_THREADS, GDN_STATE_CTAS)
gdn_bwd_state_mma_kernel(float* dVn_work, __nv_bfloat16* dE_work, const __nv_bfloat16* dO, int ld_o,
                         const __nv_bfloat16* q, int ld_qkv, const __nv_bfloat16* kw, int ld_kw, const float* G_saved,
                         const __nv_bfloat16* W_saved, const __nv_bfloat16* Qg_saved, const __nv_bfloat16* Kwe_saved,
                         GdnSegments sg, int T, int H, int NT, int dk, int dv, float scale) {
    constexpr int BT = GDN_CHUNK, BV = GDN_STATE_BV, LDV = GdnTile<__nv_bfloat16>::LDT_BV;
    constexpr bool CH = DECAY == GDN_DECAY_CHANNEL;
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    if (DKP > 0) { dk = DKP; }
    const int dkp = round16_dev(dk);
    GdnStateMmaSmem sm((size_t)gdn_smem, dkp, true);
    const int bh = blockIdx.y, v0 = blockIdx.x * BV, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int cr = 16 * (warp >> 1) + (lane >> 2), cc = 16 * (warp & 1) + 2 * (lane & 3);   // chunk product rows, cols
    const int seg = blockIdx.z + sg.base, n0 = seg * sg.len, n1 = min(n0 + sg.len, NT);
    const bool save = sg.last == nullptr;   // phase 1 saves nothing
    const int ov = v0 < dv ? v0 : 0, ocols = dv - v0;   // dO's columns here (none on phase 1's transition columns)

    const auto load_first = [&](int n) {   // Kw (per channel Kwe) and G of chunk n
        const GdnChunkPos p = gdn_chunk_pos((size_t)bh * NT + n, T, H, NT);
        gdn_state_load_kw<CH, DKP>(sm.X, kw, ld_kw, Kwe_saved, p, dk);
        gdn_state_load_G<CH, DKP>(sm.G, G_saved, p.c, dk);
        cp_async_commit();
    };
    const auto load_second = [&](int n) {   // Q (per channel Qg), W and dO of chunk n
        const GdnChunkPos p = gdn_chunk_pos((size_t)bh * NT + n, T, H, NT);
        if (CH) {
            gdn_state_load_rows<DKP>(sm.Y, Qg_saved + p.c * BT * dk, dk, BT, dk);
        } else {
            gdn_state_load_rows<DKP>(sm.Y, q + p.row0 * ld_qkv + (size_t)p.h * dk, ld_qkv, p.L, dk);
        }
        gdn_state_load_rows<DKP>(sm.Z, W_saved + p.c * BT * dk, dk, BT, dk);
        gdn_state_load_cols(sm.V, dO + p.row0 * ld_o + (size_t)p.h * dv + ov, ld_o, p.L, ocols);
        cp_async_commit();
    };

    float st[GDN_SMMA_MT][4][4];   // dS_T = 0 (unsplit)
    gdn_state_begin(st, sg, (size_t)bh * sg.count + seg, v0, dk, dv, warp, lane);
    load_first(n1 - 1);
    load_second(n1 - 1);
    for (int n = n1 - 1; n >= n0; n--) {
        const size_t c = (size_t)bh * NT + n;
        float2 dvl[2][2];   // this thread's elements of dVl (the dvlocal kernel's), in flight during the product
        float* dvn = dVn_work + (c * BT + cr) * dv + v0 + cc;   // this thread's first element of dVl / dVn
        #pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            #pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                dvl[hr][nt] = v0 + cc + 8 * nt < dv
                                  ? *reinterpret_cast<const float2*>(dvn + (size_t)(8 * hr) * dv + 8 * nt)
                                  : make_float2(0.0f, 0.0f);
            }
        }
        cp_async_wait<1>();   // this chunk's Kw and G (its Q, W and dO may still be in flight)
        gdn_state_to_op(sm.op, st, dkp, warp, lane);
        __syncthreads();
        if (save) { gdn_state_save(dE_work + c * dk * dv, sm.op, dk, dv, v0); }   // dE_n = dE
        float kde[2][4];
        gdn_state_chunk_product(kde, sm.X, sm.op, dkp, warp, lane);   // Kw dE
        const float G_last = CH ? 0.0f : sm.G[BT - 1];
        float e[2], sg[2];   // exp(G_BT - G_r) and scale gam_r of the thread's rows (per channel 1: in Kwe and Qg)
        #pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            e[hr] = CH ? 1.0f : expf(G_last - sm.G[cr + 8 * hr]);
            sg[hr] = CH ? 1.0f : scale * expf(sm.G[cr + 8 * hr]);
        }
        gdn_state_decay<CH>(st, sm.G, expf(G_last), dkp, warp, lane);   // dE <- gam_BT dE (per channel diag)
        cp_async_wait<0>();   // this chunk's Q, W and dO
        __syncthreads();      // Kw, G and op read by every warp; Q, W and dO visible
        if (n > n0) { load_first(n - 1); }
        // dVn = dVl + diag(exp(G_BT - G)) Kw dE (saved over dVl); P = -dVn; V = diag(scale gam) dO in place
        #pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = cr + 8 * hr;
            #pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const int j = cc + 8 * nt;
                const float d0 = dvl[hr][nt].x + e[hr] * kde[nt][2 * hr], d1 = dvl[hr][nt].y + e[hr] * kde[nt][2 * hr + 1];
                if (save && v0 + j < dv) {
                    *reinterpret_cast<float2*>(dVn_work + (c * BT + r) * dv + v0 + j) = make_float2(d0, d1);
                }
                *reinterpret_cast<uint32_t*>(sm.P + r * LDV + j) = pack_bf16(-d0, -d1);
                if (!CH) {
                    uint32_t* x = reinterpret_cast<uint32_t*>(sm.V + r * LDV + j);
                    const __nv_bfloat162 o = *reinterpret_cast<const __nv_bfloat162*>(x);
                    *x = pack_bf16(sg[hr] * __low2float(o), sg[hr] * __high2float(o));
                }
            }
        }
        __syncthreads();   // P and the scaled dO visible
        gdn_state_update(st, sm.Y, sm.V, dkp, warp, lane);   // dE += (scale diag(gam) Q)^T dO (per channel Qg^T dO)
        gdn_state_update(st, sm.Z, sm.P, dkp, warp, lane);   // dE -= W^T dVn
        __syncthreads();   // Q, W, dO and P read by every warp
        if (n > n0) { load_second(n - 1); }
    }
    if (!save) { gdn_state_end(sg.last, st, (size_t)bh * sg.count + seg, v0, dk, dv, warp, lane); }
}

// ----------------------------------------------------------------------------------------------------------
// the output kernel and the dvlocal kernel on register tiles (Tc = bf16, what the bf16 trainer runs): forward
// kernel 3 and backward kernel 2 above, the same math and the same operands rounded to bf16, as one CTA of 8 warps
// per chunk with every product in mma.sync fragments (kernels/mma.cuh) and the tiles copied by cp.async in two
// groups (the first product's, then the rest, in flight during the first product). Warp w holds the rows
// 16 (w % 4) .. + 15 of the result and its column blocks of 64: w / 4, w / 4 + 2, ... < ceil(dv / 64); it forms
// its 16 rows of the masked chunk product itself (the two warps of a row block both do), and keeps them as the A
// fragments of the next product, never in shared memory.

#define GDN_ATT_VB 64   // result columns per warp and block

__host__ __device__ constexpr int gdn_round64(int x) { return (x + 63) / 64 * 64; }

// whether the causal mask (LOWER: j <= i; else j >= i) zeroes the 16 columns 16 p .. of the 16 rows m0 .. whole
template <bool LOWER>
__host__ __device__ constexpr bool gdn_block_masked(int p, int m0) { return LOWER ? 16 * p > m0 : 16 * p < m0; }

// the warp's 16 rows m0 .. of S = (A B^T) (.) D over the chunk's BT columns as bf16 A fragments pa[kc] (columns
// 16 kc ..) of the next product; A, B [BT][ld] row-major over kd columns (a multiple of 16). D_ij = f exp(G_i - G_j)
// for i >= j (LOWER: the output's Q Kw^T), or f exp(G_j - G_i) for j >= i (dvlocal's Kw Q^T), else 0. The column
// blocks that D masks out whole (gdn_block_masked) are not formed: they stay zero.
template <bool LOWER>
__device__ __forceinline__ void gdn_masked_product(uint32_t pa[GDN_CHUNK / 16][4], const __nv_bfloat16* A,
                                                   const __nv_bfloat16* Bm, int ld, int kd, int m0, const float* G,
                                                   float f, int lane) {
    float s[GDN_CHUNK / 8][4] = {};
    for (int k0 = 0; k0 < kd; k0 += 16) {
        uint32_t a[4];
        ldsm_x4(a, A + ldsm_a_off(ld, m0, k0, lane));
        #pragma unroll
        for (int p = 0; p < GDN_CHUNK / 16; p++) {
            if (gdn_block_masked<LOWER>(p, m0)) { continue; }
            uint32_t b[4];
            ldsm_x4(b, Bm + ldsm_b_nk_off(ld, k0, 16 * p, lane));
            mma_bf16(s[2 * p], a, b[0], b[1]);
            mma_bf16(s[2 * p + 1], a, b[2], b[3]);
        }
    }
    const int i0 = m0 + (lane >> 2), j0 = 2 * (lane & 3);
    #pragma unroll
    for (int nt = 0; nt < GDN_CHUNK / 8; nt++) {
        if (gdn_block_masked<LOWER>(nt / 2, m0)) { continue; }
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = i0 + 8 * (e >> 1), j = 8 * nt + j0 + (e & 1);
            const bool keep = LOWER ? i >= j : j >= i;
            s[nt][e] = keep ? f * s[nt][e] * gdn_decay_exp(LOWER ? G[i] - G[j] : G[j] - G[i]) : 0.0f;
        }
    }
    #pragma unroll
    for (int kc = 0; kc < GDN_CHUNK / 16; kc++) { c_frags_to_a(pa[kc], s[2 * kc], s[2 * kc + 1]); }
}

// acc (the warp's 16 rows x GDN_ATT_VB columns) += A X over k < kd: A's 16 rows m0 .. from shared memory, [m][k]
// (A_KM: stored [k][m]) with row stride lda, or (pa != nullptr) the A fragments pa[kd / 16] in registers; X [k][ldx]
// in shared memory from column n0. Only the k blocks from k_lo to before k_hi are summed: the caller's A is zero
// outside them (a triangular A: its blocks' products would add exact zeros).
template <bool A_KM>
__device__ __forceinline__ void gdn_rows_times(float acc[GDN_ATT_VB / 8][4], const __nv_bfloat16* A, int lda,
                                               const uint32_t (*pa)[4], int m0, int kd, const __nv_bfloat16* X,
                                               int ldx, int n0, int lane, int k_lo = 0, int k_hi = 1 << 30) {
    for (int k0 = 0; k0 < kd; k0 += 16) {
        if (k0 < k_lo || k0 >= k_hi) { continue; }
        uint32_t a[4];
        if (pa) {
            #pragma unroll
            for (int e = 0; e < 4; e++) { a[e] = pa[k0 / 16][e]; }
        } else if (A_KM) {
            ldsm_x4_trans(a, A + ldsm_a_km_off(lda, m0, k0, lane));
        } else {
            ldsm_x4(a, A + ldsm_a_off(lda, m0, k0, lane));
        }
        #pragma unroll
        for (int p = 0; p < GDN_ATT_VB / 16; p++) {
            uint32_t b[4];
            ldsm_x4_trans(b, X + ldsm_b_kn_off(ldx, k0, n0 + 16 * p, lane));
            mma_bf16(acc[2 * p], a, b[0], b[1]);
            mma_bf16(acc[2 * p + 1], a, b[2], b[3]);
        }
    }
}

// writes the warp's block acc (rows m0 + g, m0 + g + 8; columns n0 + 8 nt + 2 t4, + 1) as f * acc through
// store(row, col, x0, x1) for rows < rows and columns < cols
template <typename Store>
__device__ __forceinline__ void gdn_rows_store(const float acc[GDN_ATT_VB / 8][4], int m0, int n0, int rows, int cols,
                                               float f, int lane, Store store) {
    #pragma unroll
    for (int nt = 0; nt < GDN_ATT_VB / 8; nt++) {
        const int col = n0 + 8 * nt + 2 * (lane & 3);
        #pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = m0 + (lane >> 2) + 8 * hr;
            if (r < rows && col < cols) { store(r, col, f * acc[nt][2 * hr], f * acc[nt][2 * hr + 1]); }
        }
    }
}

// shared memory of the output kernel: A0 [BT][dkp + 8] (Q; per channel Qg), A1 [BT][max(dkp, BT) + 8] (Kw; per
// channel Aqk), Hs [dkp][dvq + 8] (h_n), X [BT][dvq + 8] (Vn; x_in_a1: in A1's memory), G [BT] (per head); dvq = dv
// rounded up to GDN_ATT_VB.
// The dvlocal kernel's: A0 (Kw; per channel Aqk, [BT][BT + 8]), A1 (Q; per channel none), X (dO), G.
struct GdnAttendMmaSmem {
    __nv_bfloat16 *A0, *A1, *Hs, *X;
    float* G;
    size_t bytes;
    __host__ __device__ GdnAttendMmaSmem(size_t base, int dkp, int dvq, bool output, bool x_in_a1 = false) {
        const int w = dkp > GDN_CHUNK ? dkp : GDN_CHUNK;
        SmemCarver cv(base);
        A0 = cv.take<__nv_bfloat16>((size_t)GDN_CHUNK * (w + 8));
        A1 = cv.take<__nv_bfloat16>((size_t)GDN_CHUNK * (w + 8));
        Hs = cv.take<__nv_bfloat16>(output ? (size_t)dkp * (dvq + 8) : 0);
        X = x_in_a1 ? A1 : cv.take<__nv_bfloat16>((size_t)GDN_CHUNK * (dvq + 8));
        G = cv.take<float>(GDN_CHUNK);
        bytes = cv.off;
    }
};

template <GdnDecay DECAY>
__global__ void __launch_bounds__(GDN_THREADS, 2)
gdn_fwd_output_mma_kernel(__nv_bfloat16* o, int ld_o, const __nv_bfloat16* Aqk_saved, const __nv_bfloat16* q,
                          int ld_qkv, const __nv_bfloat16* kw, int ld_kw, const float* G_saved,
                          const __nv_bfloat16* h_saved, const __nv_bfloat16* Vn_saved, const __nv_bfloat16* Qg_saved,
                          int T, int H, int NT, int dk, int dv, float scale) {
    constexpr int BT = GDN_CHUNK;
    constexpr bool CH = DECAY == GDN_DECAY_CHANNEL;
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    const GdnChunkPos p = gdn_chunk_pos(blockIdx.x, T, H, NT);
    const int dkp = round16_dev(dk), dvq = gdn_round64(dv), lda = (dkp > BT ? dkp : BT) + 8, ldx = dvq + 8;
    GdnAttendMmaSmem sm((size_t)gdn_smem, dkp, dvq, true);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, m0 = 16 * (warp & 3);
    // the first product's tiles (per head Q, Kw and G), then h_n and Vn (per channel also Qg and Aqk)
    if (!CH) {
        tile_load_async(sm.A0, lda, BT, dkp, q + p.row0 * ld_qkv + (size_t)p.h * dk, ld_qkv, p.L, dk);
        tile_load_async(sm.A1, lda, BT, dkp, kw + p.row0 * ld_kw + (size_t)p.h * dk, ld_kw, p.L, dk);
        tile_load_async(sm.G, 0, 1, BT, G_saved + p.c * BT, 0, 1, BT);
    }
    cp_async_commit();
    if (CH) {
        tile_load_async(sm.A0, lda, BT, dkp, Qg_saved + p.c * BT * dk, dk, BT, dk);
        tile_load_async(sm.A1, lda, BT, BT, Aqk_saved + p.c * BT * BT, BT, BT, BT);
    }
    tile_load_async(sm.Hs, ldx, dkp, dvq, h_saved + p.c * dk * dv, dv, dk, dv);
    tile_load_async(sm.X, ldx, BT, dvq, Vn_saved + p.c * BT * dv, dv, BT, dv);
    cp_async_commit();
    uint32_t pa[BT / 16][4];   // per head the warp's rows of (Q Kw^T) (.) M
    if (!CH) {
        cp_async_wait<1>();
        __syncthreads();
        gdn_masked_product<true>(pa, sm.A0, sm.A1, lda, dkp, m0, sm.G, 1.0f, lane);
    }
    cp_async_wait<0>();
    __syncthreads();
    for (int n0 = GDN_ATT_VB * (warp >> 2); n0 < dv; n0 += 2 * GDN_ATT_VB) {
        float acc[GDN_ATT_VB / 8][4] = {};
        gdn_rows_times<false>(acc, sm.A0, lda, nullptr, m0, dkp, sm.Hs, ldx, n0, lane);   // Q h_n (per channel Qg h_n)
        if (CH) {
            gdn_rows_times<false>(acc, sm.A1, lda, nullptr, m0, BT, sm.X, ldx, n0, lane);   // + Aqk Vn
        } else {
            const float e0 = expf(sm.G[m0 + (lane >> 2)]), e1 = expf(sm.G[m0 + (lane >> 2) + 8]);   // diag(gam)
            #pragma unroll
            for (int nt = 0; nt < GDN_ATT_VB / 8; nt++) {
                acc[nt][0] *= e0; acc[nt][1] *= e0; acc[nt][2] *= e1; acc[nt][3] *= e1;
            }
            gdn_rows_times<false>(acc, nullptr, 0, pa, m0, BT, sm.X, ldx, n0, lane, 0, m0 + 16);   // + (Q Kw^T (.) M) Vn
        }
        __nv_bfloat16* out = o + p.row0 * ld_o + (size_t)p.h * dv;
        gdn_rows_store(acc, m0, n0, p.L, dv, CH ? 1.0f : scale, lane, [&](int r, int col, float x0, float x1) {
            *reinterpret_cast<uint32_t*>(out + (size_t)r * ld_o + col) = pack_bf16(x0, x1);
        });
    }
}

// gdn_fwd_output_mma_kernel per head for dv <= 2 GDN_ATT_VB (each warp one block of columns, so every warp meets the
// same barriers) in less shared memory: Vn is copied into Kw's tile once the masked product has read it, in flight
// during Q h_n, so three CTAs fit an SM instead of two (70 KB at dk = dv = 128; the kernel is bound by latency at
// its occupancy: ncu, H200, 40% of issue slots busy). H200, B=16 T=2048, 6 heads of 128: 0.126 -> 0.118 ms.
template <int D>
__global__ void __launch_bounds__(GDN_THREADS, 3)
gdn_fwd_output_head_mma_kernel(__nv_bfloat16* o, int ld_o, const __nv_bfloat16* q, int ld_qkv, const __nv_bfloat16* kw,
                               int ld_kw, const float* G_saved, const __nv_bfloat16* h_saved,
                               const __nv_bfloat16* Vn_saved, int T, int H, int NT, int dk, int dv, float scale) {
    constexpr int BT = GDN_CHUNK;
    if (D > 0) { dk = dv = D; }
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    const GdnChunkPos p = gdn_chunk_pos(blockIdx.x, T, H, NT);
    const int dkp = round16_dev(dk), dvq = gdn_round64(dv), lda = (dkp > BT ? dkp : BT) + 8, ldx = dvq + 8;
    GdnAttendMmaSmem sm((size_t)gdn_smem, dkp, dvq, true, true);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, m0 = 16 * (warp & 3);
    gdn_tile_load<BT, D>(sm.A0, lda, BT, dkp, q + p.row0 * ld_qkv + (size_t)p.h * dk, ld_qkv, p.L, dk);
    gdn_tile_load<BT, D>(sm.A1, lda, BT, dkp, kw + p.row0 * ld_kw + (size_t)p.h * dk, ld_kw, p.L, dk);
    tile_load_async_fixed<1, BT, GDN_THREADS>(sm.G, 0, G_saved + p.c * BT, 0, 1, BT);
    cp_async_commit();
    gdn_tile_load<D, D>(sm.Hs, ldx, dkp, dvq, h_saved + p.c * dk * dv, dv, dk, dv);
    cp_async_commit();
    uint32_t pa[BT / 16][4];   // the warp's rows of (Q Kw^T) (.) M
    cp_async_wait<1>();
    __syncthreads();
    gdn_masked_product<true>(pa, sm.A0, sm.A1, lda, dkp, m0, sm.G, 1.0f, lane);
    __syncthreads();   // Kw read by every warp
    gdn_tile_load<BT, D>(sm.X, ldx, BT, dvq, Vn_saved + p.c * BT * dv, dv, BT, dv);
    cp_async_commit();
    const int n0 = GDN_ATT_VB * (warp >> 2);
    float acc[GDN_ATT_VB / 8][4] = {};
    cp_async_wait<1>();   // h_n
    __syncthreads();
    if (n0 < dv) { gdn_rows_times<false>(acc, sm.A0, lda, nullptr, m0, dkp, sm.Hs, ldx, n0, lane); }   // Q h_n
    const float e0 = expf(sm.G[m0 + (lane >> 2)]), e1 = expf(sm.G[m0 + (lane >> 2) + 8]);   // diag(gam)
    #pragma unroll
    for (int nt = 0; nt < GDN_ATT_VB / 8; nt++) {
        acc[nt][0] *= e0; acc[nt][1] *= e0; acc[nt][2] *= e1; acc[nt][3] *= e1;
    }
    cp_async_wait<0>();   // Vn
    __syncthreads();
    if (n0 < dv) {
        gdn_rows_times<false>(acc, nullptr, 0, pa, m0, BT, sm.X, ldx, n0, lane, 0, m0 + 16);   // + (Q Kw^T (.) M) Vn
        __nv_bfloat16* out = o + p.row0 * ld_o + (size_t)p.h * dv;
        gdn_rows_store(acc, m0, n0, p.L, dv, scale, lane, [&](int r, int col, float x0, float x1) {
            *reinterpret_cast<uint32_t*>(out + (size_t)r * ld_o + col) = pack_bf16(x0, x1);
        });
    }
}

template <GdnDecay DECAY>
__global__ void __launch_bounds__(GDN_THREADS, 2)
gdn_bwd_dvlocal_mma_kernel(float* dVn_work, const __nv_bfloat16* dO, int ld_o, const __nv_bfloat16* q, int ld_qkv,
                           const __nv_bfloat16* kw, int ld_kw, const float* G_saved, const __nv_bfloat16* Aqk_saved,
                           int T, int H, int NT, int dk, int dv, float scale) {
    constexpr int BT = GDN_CHUNK;
    constexpr bool CH = DECAY == GDN_DECAY_CHANNEL;
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    const GdnChunkPos p = gdn_chunk_pos(blockIdx.x, T, H, NT);
    const int dkp = round16_dev(dk), dvq = gdn_round64(dv), lda = (dkp > BT ? dkp : BT) + 8, ldx = dvq + 8;
    GdnAttendMmaSmem sm((size_t)gdn_smem, dkp, dvq, false);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, m0 = 16 * (warp & 3);
    if (CH) {
        tile_load_async(sm.A0, lda, BT, BT, Aqk_saved + p.c * BT * BT, BT, BT, BT);
    } else {
        tile_load_async(sm.A0, lda, BT, dkp, kw + p.row0 * ld_kw + (size_t)p.h * dk, ld_kw, p.L, dk);
        tile_load_async(sm.A1, lda, BT, dkp, q + p.row0 * ld_qkv + (size_t)p.h * dk, ld_qkv, p.L, dk);
        tile_load_async(sm.G, 0, 1, BT, G_saved + p.c * BT, 0, 1, BT);
    }
    cp_async_commit();
    tile_load_async(sm.X, ldx, BT, dvq, dO + p.row0 * ld_o + (size_t)p.h * dv, ld_o, p.L, dv);
    cp_async_commit();
    uint32_t pa[BT / 16][4];   // per head the warp's rows of scale (Kw Q^T) (.) M^T
    if (!CH) {
        cp_async_wait<1>();
        __syncthreads();
        gdn_masked_product<false>(pa, sm.A0, sm.A1, lda, dkp, m0, sm.G, scale, lane);
    }
    cp_async_wait<0>();
    __syncthreads();
    for (int n0 = GDN_ATT_VB * (warp >> 2); n0 < dv; n0 += 2 * GDN_ATT_VB) {
        float acc[GDN_ATT_VB / 8][4] = {};
        if (CH) {
            gdn_rows_times<true>(acc, sm.A0, lda, nullptr, m0, BT, sm.X, ldx, n0, lane);   // Aqk^T dO
        } else {
            gdn_rows_times<false>(acc, nullptr, 0, pa, m0, BT, sm.X, ldx, n0, lane, m0, BT);   // (Kw Q^T (.) M^T) dO
        }
        float* out = dVn_work + p.c * BT * dv;
        gdn_rows_store(acc, m0, n0, BT, dv, 1.0f, lane, [&](int r, int col, float x0, float x1) {
            *reinterpret_cast<float2*>(out + (size_t)r * dv + col) = make_float2(x0, x1);
        });
    }
}

// ----------------------------------------------------------------------------------------------------------
// forward kernel 1 on register tiles, per head (Tc = bf16: gdn, kaczmarz, pdn, pgdn in the bf16 trainer): the same
// math as gdn_fwd_intra_kernel. K, Kw and V are copied whole by cp.async (a write key of its own goes where V will
// be, and V follows it there once K Kw^T is formed, in flight during the solve: three CTAs per SM at dk = dv = 128
// either way); warp w forms A's rows 16 (w % 4) .., columns 32 (w / 4) .. of K Kw^T in mma.sync fragments and
// applies beta and the decay there; the solve is
// gdn_solve_unit_lower's (fp32); then W = (Tm diag(beta gam)) K and U = (Tm diag(beta)) V with the A fragments cut
// from fp32 Tm, its columns scaled before the rounding to bf16 (the shared-memory kernel rounds diag(beta gam) K and
// diag(beta) V instead), each warp's 16 x 64 blocks written to global memory from its fragments.

struct GdnIntraMmaSmem {
    float *A, *Tm, *G, *beta, *bg;
    __nv_bfloat16 *K, *Kw, *V;   // Kw: in V's memory (a write key of its own) or K
    size_t bytes;
    __host__ __device__ GdnIntraMmaSmem(size_t base, int dkq, int dvq, bool split) {   // dk, dv rounded up to 64
        constexpr int LDF = GdnTile<__nv_bfloat16>::LDF_BT;
        SmemCarver cv(base);
        A = cv.take<float>(GDN_CHUNK * LDF);
        Tm = cv.take<float>(GDN_CHUNK * LDF);
        G = cv.take<float>(GDN_CHUNK);
        beta = cv.take<float>(GDN_CHUNK);
        bg = cv.take<float>(GDN_CHUNK);
        K = cv.take<__nv_bfloat16>((size_t)GDN_CHUNK * (dkq + 8));
        V = cv.take<__nv_bfloat16>((size_t)GDN_CHUNK * ((split && dkq > dvq ? dkq : dvq) + 8));
        Kw = split ? V : K;
        bytes = cv.off;
    }
};

// the A fragments pa[kc] (rows m0 .., columns 16 kc ..) of Tm diag(f), Tm fp32 [BT][LDF_BT], rounded to bf16
__device__ __forceinline__ void gdn_scaled_tm_frags(uint32_t pa[GDN_CHUNK / 16][4], const float* Tm, const float* f,
                                                    int m0, int lane) {
    constexpr int LDF = GdnTile<__nv_bfloat16>::LDF_BT;
    const int r = m0 + (lane >> 2);
    #pragma unroll
    for (int kc = 0; kc < GDN_CHUNK / 16; kc++) {
        #pragma unroll
        for (int e = 0; e < 4; e++) {   // e: row r (+ 8 for odd e), columns c, c + 1 (+ 8 for e >= 2)
            const int rr = r + 8 * (e & 1), c = 16 * kc + 2 * (lane & 3) + 8 * (e >> 1);
            const float2 t = *reinterpret_cast<const float2*>(Tm + rr * LDF + c);
            const float2 fc = *reinterpret_cast<const float2*>(f + c);
            pa[kc][e] = pack_bf16(t.x * fc.x, t.y * fc.y);
        }
    }
}

template <int D>
__global__ void __launch_bounds__(GDN_THREADS, 3)
gdn_fwd_intra_mma_kernel(float* Tm_saved, float* G_saved, __nv_bfloat16* W_saved, __nv_bfloat16* U_work,
                         const __nv_bfloat16* k, const __nv_bfloat16* v, int ld_qkv, const __nv_bfloat16* kw, int ld_kw,
                         const float* beta, const float* g, int g_stride, int T, int H, int NT, int dk, int dv) {
    constexpr int BT = GDN_CHUNK, LDF = GdnTile<__nv_bfloat16>::LDF_BT;
    if (D > 0) { dk = dv = D; }
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    const GdnChunkPos p = gdn_chunk_pos(blockIdx.x, T, H, NT);
    const bool split = kw != k;
    const int dkp = round16_dev(dk), dkq = gdn_round64(dk), dvq = gdn_round64(dv), ldk = dkq + 8, ldv = dvq + 8;
    GdnIntraMmaSmem sm((size_t)gdn_smem, dkq, dvq, split);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, m0 = 16 * (warp & 3);
    const auto load_v = [&] {
        gdn_tile_load<BT, D>(sm.V, ldv, BT, dvq, v + p.row0 * ld_qkv + (size_t)p.h * dv, ld_qkv, p.L, dv);
        cp_async_commit();
    };
    gdn_tile_load<BT, D>(sm.K, ldk, BT, dkq, k + p.row0 * ld_qkv + (size_t)p.h * dk, ld_qkv, p.L, dk);
    if (split) { gdn_tile_load<BT, D>(sm.Kw, ldk, BT, dkq, kw + p.row0 * ld_kw + (size_t)p.h * dk, ld_kw, p.L, dk); }
    cp_async_commit();
    if (!split) { load_v(); }
    // G (spec 3.1), beta and beta gam, 0 on padded rows
    gdn_head_G_beta(sm.G, sm.beta, sm.bg, G_saved, g, g_stride, beta, p, H);
    if (split) {
        cp_async_wait<0>();
    } else {
        cp_async_wait<1>();
    }
    __syncthreads();
    {   // A_ij = beta_i (k_i.kw_j) exp(G_i - G_j) for i > j, else 0: the warp's rows m0 .., columns n0 .. n0 + 31
        const int n0 = 32 * (warp >> 2);
        float s[4][4] = {};
        for (int k0 = 0; k0 < dkp; k0 += 16) {
            uint32_t a[4];
            ldsm_x4(a, sm.K + ldsm_a_off(ldk, m0, k0, lane));
            #pragma unroll
            for (int pr = 0; pr < 2; pr++) {
                uint32_t b[4];
                ldsm_x4(b, sm.Kw + ldsm_b_nk_off(ldk, k0, n0 + 16 * pr, lane));
                mma_bf16(s[2 * pr], a, b[0], b[1]);
                mma_bf16(s[2 * pr + 1], a, b[2], b[3]);
            }
        }
        #pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = m0 + (lane >> 2) + 8 * (e >> 1), j = n0 + 8 * nt + 2 * (lane & 3) + (e & 1);
                sm.A[i * LDF + j] = i > j ? sm.beta[i] * s[nt][e] * gdn_decay_exp(sm.G[i] - sm.G[j]) : 0.0f;
            }
        }
    }
    __syncthreads();
    if (split) { load_v(); }   // Kw read
    gdn_solve_unit_lower(sm.Tm, sm.A);
    cta_for_each(BT, BT / 4, [&](int i, int j4) {
        *reinterpret_cast<float4*>(Tm_saved + (p.c * BT + i) * BT + 4 * j4) =
            *reinterpret_cast<const float4*>(sm.Tm + i * LDF + 4 * j4);
    });
    cp_async_wait<0>();
    __syncthreads();   // V visible
    // W = (Tm diag(beta gam)) K, then U = (Tm diag(beta)) V, 2 GDN_ATT_VB columns at a time: the warp's 16 x 64
    // block is staged in A's tile (dead since the solve; bf16 [BT][2 GDN_ATT_VB + 8] fills it exactly) and the
    // CTA writes the rows out 16 bytes per thread (from the fragments directly, 4-byte stores to 8 rows at once
    // held 8% of the kernel's stall samples, ncu, H200)
    constexpr int LDS = 2 * GDN_ATT_VB + 8;
    static_assert(GDN_CHUNK * LDS * sizeof(__nv_bfloat16) <= GDN_CHUNK * LDF * sizeof(float), "staging fits A");
    __nv_bfloat16* stage = reinterpret_cast<__nv_bfloat16*>(sm.A);
    for (int pass = 0; pass < 2; pass++) {
        const __nv_bfloat16* X = pass == 0 ? sm.K : sm.V;
        const int cols = pass == 0 ? dk : dv, ldx = pass == 0 ? ldk : ldv;
        __nv_bfloat16* out = pass == 0 ? W_saved + p.c * BT * dk : U_work + p.c * BT * dv;
        uint32_t pa[BT / 16][4];
        gdn_scaled_tm_frags(pa, sm.Tm, pass == 0 ? sm.bg : sm.beta, m0, lane);
        for (int c0 = 0; c0 < cols; c0 += 2 * GDN_ATT_VB) {
            const int n0 = c0 + GDN_ATT_VB * (warp >> 2);
            if (n0 < cols) {
                float acc[GDN_ATT_VB / 8][4] = {};
                gdn_rows_times<false>(acc, nullptr, 0, pa, m0, BT, X, ldx, n0, lane, 0, m0 + 16);   // Tm: lower
                gdn_rows_store(acc, m0, n0 - c0, BT, LDS, 1.0f, lane, [&](int r, int col, float x0, float x1) {
                    *reinterpret_cast<uint32_t*>(stage + r * LDS + col) = pack_bf16(x0, x1);
                });
            }
            __syncthreads();
            // (cta_for_each_slab's closing barrier comes before the next block's stores)
            const int groups = min(2 * GDN_ATT_VB, cols - c0) / 8;
            cta_for_each_slab<2 * GDN_ATT_VB / 8>(BT, groups, [&](int r, int c8) {
                *reinterpret_cast<uint4*>(out + (size_t)r * cols + c0 + 8 * c8) =
                    *reinterpret_cast<const uint4*>(stage + r * LDS + 8 * c8);
            });
        }
    }
}

// ----------------------------------------------------------------------------------------------------------
// A diagonal 16-row block's decayed products may take the off-diagonal blocks' form, one tensor-core product of
// operands scaled against a reference row of the block (its first or last), where the block's span, the largest
// decay over its 16 rows of any channel, max_c (G_f[c] - G_{f+15}[c]), is at most GDN_SPAN_MAX: the factors stay
// within e^-64 .. e^64, in bf16's and fp32's range with room for the operands themselves. Otherwise (a decay above
// 4 per token on average) the block is summed per element with the exponent of each difference.
#define GDN_SPAN_MAX 64.0f

// ok[I] = 1 where block I's span is at most GDN_SPAN_MAX (warp I of the first GDN_NSUB; no barrier)
__device__ __forceinline__ void gdn_span_ok(int* ok, const float* G, int ldg, int dk) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp >= GDN_NSUB) { return; }
    const float* Gf = G + GDN_SUB * warp * ldg;
    float m = 0.0f;
    for (int c = lane; c < dk; c += 32) { m = fmaxf(m, Gf[c] - Gf[(GDN_SUB - 1) * ldg + c]); }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) { m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o)); }
    if (lane == 0) { ok[warp] = m <= GDN_SPAN_MAX; }
}

// ----------------------------------------------------------------------------------------------------------
// forward kernel 1 on register tiles, per channel (Tc = bf16: pkda in the bf16 trainer): gdn_fwd_intra_kernel's
// per-channel math (the 16-row blocks of spec/pdn.md 3.2 above), one CTA of 8 warps per chunk and two per SM, K,
// Kw, Q and the chunk's log decays g copied whole by cp.async:
//   1. G = the cumulative sums of g per channel (gdn_chunk_cumsum_channels: the same sums in the same order)
//   2. the blocks (I, J), J <= I, of the decayed K Kw^T and Q Kw^T, one per warp task, in mma.sync fragments: the
//      raw tiles' fragments are scaled in registers, row r of block I by exp(G_r - G_f) and row s of Kw by
//      exp(G_f - G_s), f = 16 I (gdn_decay_refer_rows' and gdn_decay_stack_before's operands without their tiles);
//      a diagonal block so where its span allows (gdn_span_ok), else per element, four lanes per (block, r, s)
//      taking every fourth group of 8 channels (conflict-free shared reads), k_r.kw_s and q_r.kw_s sharing one
//      exp(G_r - G_s). A0's blocks go to shared memory, Aqk's (times scale) straight to its saved copy
//   3. A0 saved, A = diag(beta) A0; K <- K (.) exp(G) in place, Qg, Kwe and G saved; V copied into Q's memory,
//      in flight during the solve
//   4. Tm = (I + A)^-1 (gdn_solve_unit_lower, fp32) in G's memory
//   5. W = (Tm diag(beta)) (K (.) exp(G)) and U = (Tm diag(beta)) V, each warp its 16 rows' A fragments cut once
//      from fp32 Tm with beta on its columns (the shared-memory kernel rounds beta K (.) exp(G) and beta V instead)

struct GdnIntraChannelMmaSmem {
    float *G, *A, *Tm, *X, *beta;   // Tm: in G's memory, once the exponentials are done
    int* ok;                        // [GDN_NSUB] gdn_span_ok
    __nv_bfloat16 *K, *Kw, *QV;   // QV: Q, then V
    size_t bytes;
    __host__ __device__ GdnIntraChannelMmaSmem(size_t base, int dkq, int dvq) {   // dk, dv rounded up to 64
        constexpr int LDF = GdnTile<__nv_bfloat16>::LDF_BT;
        SmemCarver cv(base);
        G = cv.take<float>((size_t)GDN_CHUNK * (dkq + 8));
        Tm = G;
        A = cv.take<float>(GDN_CHUNK * LDF);
        X = cv.take<float>(3 * 256);   // the cumulative sums' block totals
        beta = cv.take<float>(GDN_CHUNK);
        ok = cv.take<int>(GDN_NSUB);
        K = cv.take<__nv_bfloat16>((size_t)GDN_CHUNK * (dkq + 8));
        Kw = cv.take<__nv_bfloat16>((size_t)GDN_CHUNK * (dkq + 8));
        QV = cv.take<__nv_bfloat16>((size_t)GDN_CHUNK * ((dkq > dvq ? dkq : dvq) + 8));
        bytes = cv.off;
    }
};

// the bf16 pair x times (f0, f1), rounded to bf16
__device__ __forceinline__ uint32_t gdn_scale_pair(uint32_t x, float f0, float f1) {
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(&x);
    return pack_bf16(__low2float(v) * f0, __high2float(v) * f1);
}

__global__ void __launch_bounds__(GDN_THREADS, 2)
gdn_fwd_intra_channel_mma_kernel(float* Tm_saved, float* G_saved, __nv_bfloat16* W_saved, __nv_bfloat16* U_work,
                                 float* A0_saved, __nv_bfloat16* Aqk_saved, __nv_bfloat16* Qg_saved,
                                 __nv_bfloat16* Kwe_saved, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                 const __nv_bfloat16* v, int ld_qkv, const __nv_bfloat16* kw, int ld_kw,
                                 const float* beta, const float* g, int T, int H, int NT, int dk, int dv, float scale) {
    constexpr int BT = GDN_CHUNK, LDF = GdnTile<__nv_bfloat16>::LDF_BT;
    constexpr int PAIRS = GDN_SUB * (GDN_SUB + 1) / 2;   // (r, s) with s <= r in a diagonal block
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    const GdnChunkPos p = gdn_chunk_pos(blockIdx.x, T, H, NT);
    const int dkp = round16_dev(dk), dkq = gdn_round64(dk), dvq = gdn_round64(dv);
    const int ldk = dkq + 8, ldg = dkq + 8, ldv = dvq + 8;
    GdnIntraChannelMmaSmem sm((size_t)gdn_smem, dkq, dvq);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g4 = lane >> 2, t4 = lane & 3;
    const size_t HK = (size_t)H * dk;
    tile_load_async(sm.K, ldk, BT, dkq, k + p.row0 * ld_qkv + (size_t)p.h * dk, ld_qkv, p.L, dk);
    tile_load_async(sm.Kw, ldk, BT, dkq, kw + p.row0 * ld_kw + (size_t)p.h * dk, ld_kw, p.L, dk);
    tile_load_async(sm.QV, ldk, BT, dkq, q + p.row0 * ld_qkv + (size_t)p.h * dk, ld_qkv, p.L, dk);
    tile_load_async(sm.G, ldg, BT, dkq, g + p.row0 * HK + (size_t)p.h * dk, HK, p.L, dk);
    cp_async_commit();
    gdn_load_beta(sm.beta, beta, p, H);
    cp_async_wait<0>();
    __syncthreads();
    gdn_chunk_cumsum_channels(sm.G, ldg, dkq, sm.X);
    gdn_span_ok(sm.ok, sm.G, ldg, dk);
    __syncthreads();

    // 2. the blocks on tensor cores: task w < 20 forms block b = w % 10 = (I, J) of K Kw^T (w < 10) or of Q Kw^T;
    // b = 0: (0, 0); 1, 2: (1, 0), (1, 1); 3, 4, 5: (2, 0) .. (2, 2); 6 .. 9: (3, 0) .. (3, 3); a diagonal block
    // only where its span allows
    __nv_bfloat16* Aqk_c = Aqk_saved + p.c * BT * BT;
    for (int task = warp; task < 20; task += GDN_THREADS / 32) {
        const int b = task % 10, I = b < 1 ? 0 : b < 3 ? 1 : b < 6 ? 2 : 3, J = b - I * (I + 1) / 2, f = GDN_SUB * I;
        if (J == I && !sm.ok[I]) { continue; }
        const bool qk = task >= 10;
        const __nv_bfloat16* X = qk ? sm.QV : sm.K;
        const float* Gf = sm.G + f * ldg;
        float acc[2][4] = {};
        for (int k0 = 0; k0 < dkp; k0 += 16) {
            uint32_t a[4], bk[4];
            ldsm_x4(a, X + ldsm_a_off(ldk, f, k0, lane));
            ldsm_x4(bk, sm.Kw + ldsm_b_nk_off(ldk, k0, GDN_SUB * J, lane));
            #pragma unroll
            for (int e = 0; e < 4; e++) {   // a[e]: row f + g4 (+ 8 for odd e), columns c, c + 1 (+ 8 for e >= 2)
                const int c = k0 + 2 * t4 + 8 * (e >> 1);
                const float2 gr = *reinterpret_cast<const float2*>(sm.G + (f + g4 + 8 * (e & 1)) * ldg + c);
                a[e] = gdn_scale_pair(a[e], gdn_decay_exp(gr.x - Gf[c]), gdn_decay_exp(gr.y - Gf[c + 1]));
            }
            #pragma unroll
            for (int e = 0; e < 4; e++) {   // bk[e]: Kw's row 16 J + g4 (+ 8 for e >= 2), columns c, c + 1 (+ 8 for odd e)
                const int c = k0 + 2 * t4 + 8 * (e & 1);
                const float2 gs = *reinterpret_cast<const float2*>(sm.G + (GDN_SUB * J + g4 + 8 * (e >> 1)) * ldg + c);
                bk[e] = gdn_scale_pair(bk[e], gdn_decay_exp(Gf[c] - gs.x), gdn_decay_exp(Gf[c + 1] - gs.y));
            }
            mma_bf16(acc[0], a, bk[0], bk[1]);
            mma_bf16(acc[1], a, bk[2], bk[3]);
        }
        #pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            #pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                const int i = f + g4 + 8 * hr, j = GDN_SUB * J + 8 * nt + 2 * t4;
                if (qk) {   // lower, with the diagonal (a diagonal block's upper part is 0)
                    *reinterpret_cast<uint32_t*>(Aqk_c + i * BT + j) =
                        pack_bf16(j <= i ? scale * acc[nt][2 * hr] : 0.0f, j + 1 <= i ? scale * acc[nt][2 * hr + 1] : 0.0f);
                } else {   // phase 3 keeps the strictly lower part
                    sm.A[i * LDF + j] = acc[nt][2 * hr];
                    sm.A[i * LDF + j + 1] = acc[nt][2 * hr + 1];
                }
            }
        }
    }
    // the other diagonal blocks per element: job = ((I * PAIRS + pair) * 4 + quarter), the four lanes of a pair
    // adjacent (whole warps per block: every lane of a warp takes part in the shuffles, or none), quarter q taking
    // channels 8 q + 32 i ..
    static_assert(PAIRS * 4 % 32 == 0, "whole warps of diagonal jobs per block");
    for (int job = threadIdx.x; job < GDN_NSUB * PAIRS * 4; job += blockDim.x) {
        if (sm.ok[(job >> 2) / PAIRS]) { continue; }
        const int quarter = job & 3, pair = (job >> 2) % PAIRS, f = GDN_SUB * ((job >> 2) / PAIRS);
        int r = (int)((sqrtf(8.0f * pair + 1.0f) - 1.0f) * 0.5f);
        while (r * (r + 1) / 2 > pair) { r--; }
        while ((r + 1) * (r + 2) / 2 <= pair) { r++; }
        const int s = f + pair - r * (r + 1) / 2;
        r += f;
        float a0 = 0.0f, aq = 0.0f;
        for (int c = 8 * quarter; c < dkq; c += 32) {
            const uint4 kr = *reinterpret_cast<const uint4*>(sm.K + r * ldk + c);
            const uint4 qr = *reinterpret_cast<const uint4*>(sm.QV + r * ldk + c);
            const uint4 ks = *reinterpret_cast<const uint4*>(sm.Kw + s * ldk + c);
            const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&kr);
            const __nv_bfloat162* q2 = reinterpret_cast<const __nv_bfloat162*>(&qr);
            const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&ks);
            #pragma unroll
            for (int u = 0; u < 4; u++) {
                const float2 gr = *reinterpret_cast<const float2*>(sm.G + r * ldg + c + 2 * u);
                const float2 gs = *reinterpret_cast<const float2*>(sm.G + s * ldg + c + 2 * u);
                const float t0 = __low2float(w2[u]) * gdn_decay_exp(gr.x - gs.x);
                const float t1 = __high2float(w2[u]) * gdn_decay_exp(gr.y - gs.y);
                a0 = fmaf(__low2float(k2[u]), t0, a0);
                a0 = fmaf(__high2float(k2[u]), t1, a0);
                aq = fmaf(__low2float(q2[u]), t0, aq);
                aq = fmaf(__high2float(q2[u]), t1, aq);
            }
        }
        #pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
            a0 += __shfl_xor_sync(0xffffffffu, a0, o);
            aq += __shfl_xor_sync(0xffffffffu, aq, o);
        }
        if (quarter == 0) {
            sm.A[r * LDF + s] = a0;
            Aqk_c[r * BT + s] = __float2bfloat16(scale * aq);
        }
    }
    __syncthreads();

    // 3. A_ij = beta_i A0_ij for i > j, else 0, A0 saved for dbeta; Aqk's upper part 0
    cta_for_each(BT, BT, [&](int i, int j) {
        float* a = sm.A + i * LDF + j;
        const float a0 = i > j ? *a : 0.0f;
        A0_saved[(p.c * BT + i) * BT + j] = a0;
        *a = sm.beta[i] * a0;
        if (j > i) { Aqk_c[i * BT + j] = __float2bfloat16(0.0f); }
    });
    // K <- K (.) exp(G); Qg = scale Q (.) exp(G), Kwe = Kw (.) exp(G_BT - G) and G saved; eight channels per step
    const TileDiv row8_of(dk / 8);
    for (int idx = threadIdx.x; idx < BT * (dk / 8); idx += blockDim.x) {
        const int r = row8_of(idx), c = (idx - r * (dk / 8)) * 8;
        const size_t off = (p.c * BT + r) * dk + c;
        uint4 kr = *reinterpret_cast<const uint4*>(sm.K + r * ldk + c);
        const uint4 qr = *reinterpret_cast<const uint4*>(sm.QV + r * ldk + c);
        const uint4 wr = *reinterpret_cast<const uint4*>(sm.Kw + r * ldk + c);
        uint4 qg, kwe;
        uint32_t* kp = reinterpret_cast<uint32_t*>(&kr);
        const uint32_t* qp = reinterpret_cast<const uint32_t*>(&qr);
        const uint32_t* wp = reinterpret_cast<const uint32_t*>(&wr);
        uint32_t* qgp = reinterpret_cast<uint32_t*>(&qg);
        uint32_t* kwep = reinterpret_cast<uint32_t*>(&kwe);
        #pragma unroll
        for (int u = 0; u < 4; u++) {
            const float2 G2 = *reinterpret_cast<const float2*>(sm.G + r * ldg + c + 2 * u);
            const float2 L2 = *reinterpret_cast<const float2*>(sm.G + (BT - 1) * ldg + c + 2 * u);
            const float e0 = gdn_decay_exp(G2.x), e1 = gdn_decay_exp(G2.y);
            kp[u] = gdn_scale_pair(kp[u], e0, e1);
            qgp[u] = gdn_scale_pair(qp[u], scale * e0, scale * e1);
            kwep[u] = gdn_scale_pair(wp[u], gdn_decay_exp(L2.x - G2.x), gdn_decay_exp(L2.y - G2.y));
        }
        *reinterpret_cast<uint4*>(sm.K + r * ldk + c) = kr;
        *reinterpret_cast<uint4*>(Qg_saved + off) = qg;
        *reinterpret_cast<uint4*>(Kwe_saved + off) = kwe;
        *reinterpret_cast<float4*>(G_saved + off) = *reinterpret_cast<const float4*>(sm.G + r * ldg + c);
        *reinterpret_cast<float4*>(G_saved + off + 4) = *reinterpret_cast<const float4*>(sm.G + r * ldg + c + 4);
    }
    __syncthreads();   // Q and G read by every thread
    tile_load_async(sm.QV, ldv, BT, dvq, v + p.row0 * ld_qkv + (size_t)p.h * dv, ld_qkv, p.L, dv);
    cp_async_commit();

    // 4. the solve; 5. W and U
    gdn_solve_unit_lower(sm.Tm, sm.A);
    cta_for_each(BT, BT, [&](int i, int j) { Tm_saved[(p.c * BT + i) * BT + j] = sm.Tm[i * LDF + j]; });
    cp_async_wait<0>();
    __syncthreads();   // V visible
    const int m0 = 16 * (warp & 3);
    uint32_t pa[BT / 16][4];
    gdn_scaled_tm_frags(pa, sm.Tm, sm.beta, m0, lane);
    for (int pass = 0; pass < 2; pass++) {
        const __nv_bfloat16* X = pass == 0 ? sm.K : sm.QV;
        const int cols = pass == 0 ? dk : dv, ldx = pass == 0 ? ldk : ldv;
        __nv_bfloat16* out = pass == 0 ? W_saved + p.c * BT * dk : U_work + p.c * BT * dv;
        for (int n0 = GDN_ATT_VB * (warp >> 2); n0 < cols; n0 += 2 * GDN_ATT_VB) {
            float acc[GDN_ATT_VB / 8][4] = {};
            gdn_rows_times<false>(acc, nullptr, 0, pa, m0, BT, X, ldx, n0, lane, 0, m0 + 16);   // Tm: lower
            gdn_rows_store(acc, m0, n0, BT, cols, 1.0f, lane, [&](int r, int col, float x0, float x1) {
                *reinterpret_cast<uint32_t*>(out + (size_t)r * cols + col) = pack_bf16(x0, x1);
            });
        }
    }
}

// ----------------------------------------------------------------------------------------------------------
// backward kernels 4, 5, 6 of spec 3.4, fused: one CTA per chunk. With P = scale (dO Vn^T) (.) M,
// dU = dVn, kbg = diag(beta gam) K, vb = diag(beta) V, e_i = exp(G_BT - G_i):
//   phase 1 (dv slabs)  P; dT = dU vb^T; dvb = Tm^T dU -> dv = diag(beta) dvb, dbeta_b += v.dvb
//   phase 2 (dk slabs)  dQ = scale diag(gam) dO h^T + P Kw                    -> dq
//                       dKw_int = diag(e) Vn dE^T;  dKw_a = dKw_int + P^T Q   (the write key's paths)
//                       dW = -dVn h^T;  dT += dW kbg^T;  dkbg = Tm^T dW;  dK_b = diag(beta gam) dkbg
//                       dG_a += q.dQ - kw.dKw_a;  dG_b += kbg.dkbg;  dbeta_b += gam k.dkbg;  K Kw^T
//                       kw = k: dk = dKw_a + dK_b; else dk = dK_b, dkw = dKw_a (completed in phase 4)
//                       dG_a[BT-1] += gam_BT <h, dE>_F + sum_i kw_i.dKw_int_i
//   phase 3             dA = -strictly_lower(Tm^T strictly_lower(dT) Tm^T); dAG = dA (.) Gam
//                       (fp32 products here instead leave the bf16 KLA dg error at 1.4e-2: not the error source)
//                       dbeta_c_i = sum_j dAG_ij (k_i.kw_j);  dG_c_i = sum_j (dA (.) A)_ij - (dA (.) A)_ji
//   phase 4 (dk slabs)  with Z1 = diag(beta) dAG (A's rows take k, its columns kw):
//                       kw = k: dk += (Z1 + Z1^T) K; else dk += Z1 Kw, dkw += Z1^T K     (= dK_c)
//   phase 5             dbeta = dbeta_b + dbeta_c;  dg_i = sum_{j>=i} (dG_a + dG_b + dG_c)_j (Kernel 6)
// Every step's tiles are loaded in one batch (one memory latency): beta and G together, Tm with the first dv
// slab of phase 1, a dk slab's q, k and kbg with its first dv slab of phase 2, and phase 4 reads dk back while
// it loads the K slab. The per-row dot products and the gradient rows are done warp per row (cta_rows), so
// the global writes are coalesced.

// the per-row factors of both per-head backward chunk kernels: beta (0 on padded rows), G, gam = exp(G), beta gam,
// scale gam, exp(G_BT - G); returns G_BT. No barrier.
template <typename Smem>
__device__ __forceinline__ float gdn_bwd_row_factors(Smem& sm, const float* beta, const float* G_saved,
                                                     const GdnChunkPos& p, int H, float scale) {
    const float G_last = G_saved[p.c * GDN_CHUNK + GDN_CHUNK - 1];
    for (int r = threadIdx.x; r < GDN_CHUNK; r += blockDim.x) {
        const float b = r < p.L ? beta[(p.row0 + r) * H + p.h] : 0.0f;
        const float G = G_saved[p.c * GDN_CHUNK + r], gam = expf(G);
        sm.beta[r] = b;
        sm.G[r] = G;
        sm.gam[r] = gam;
        sm.bg[r] = b * gam;
        sm.sg[r] = scale * gam;
        sm.eg[r] = expf(G_last - G);
    }
    return G_last;
}

// phase 5's end in both per-head backward chunk kernels: dg_i = sum_{j >= i} (dG_a + dG_b)_j (Kernel 6, a reverse
// cumulative sum in a fixed order) and dbeta, for the chunk's valid rows
__device__ __forceinline__ void gdn_bwd_write_dg(float* grad_g, float* grad_beta, const float* dGa, const float* dGb,
                                                 const float* dbeta, const GdnChunkPos& p, int H) {
    for (int r = threadIdx.x; r < p.L; r += blockDim.x) {
        float s = 0.0f;
        for (int j = GDN_CHUNK - 1; j >= r; j--) { s += dGa[j] + dGb[j]; }
        const size_t off = (p.row0 + r) * H + p.h;
        grad_g[off] = s;
        grad_beta[off] = dbeta[r];
    }
}

// phase 1 of both backward chunk kernels, over dv slabs: P = dO Vn^T, dT = dU vb^T, dvb = Tm^T dU ->
// dv = diag(beta) dvb, dbeta += v.dvb. Tm comes with the first slab into sm.Tm_op; sm.beta and sm.dbeta are set.
template <typename Tin, typename Tc, typename Smem>
__device__ void gdn_bwd_phase1(Smem& sm, float* grad_v, int ld_d, const Tin* dO, int ld_o, const Tin* v, int ld_qkv,
                               const float* Tm_c, const Tc* Vn_c, const float* dVn_c, const GdnChunkPos& p, int dv) {
    typedef GdnTile<Tc> TL;
    constexpr int BT = GDN_CHUNK, SL = TL::SL, LDT = TL::LDT, LDF = TL::LDF, LDTB = TL::LDT_BT, LDFB = TL::LDF_BT;
    const int dvp = round16_dev(dv);
    for (int s0 = 0; s0 < dvp; s0 += SL) {
        const int ws = min(SL, dvp - s0);
        const auto do_tile = gdn_in_tile(sm.S0, LDT, ws, dO, ld_o, p, dv, s0);
        const auto vn_tile = gdn_mat_tile(sm.S1, LDT, BT, ws, Vn_c, BT, dv, 0, s0);
        const auto dvn_tile = gdn_mat_tile(sm.S2, LDT, BT, ws, dVn_c, BT, dv, 0, s0);
        const auto v_tile = gdn_in_tile(sm.F1, LDF, ws, v, ld_qkv, p, dv, s0);
        const auto vb_tile = gdn_in_tile(sm.S3, LDT, ws, v, ld_qkv, p, dv, s0, sm.beta);
        if (s0 == 0) {
            tile_load<1>(gdn_mat_tile(sm.Tm_op, LDTB, BT, BT, Tm_c, BT, BT, 0, 0), do_tile, vn_tile, dvn_tile, v_tile,
                        vb_tile);
        } else {
            tile_load<1>(do_tile, vn_tile, dvn_tile, v_tile, vb_tile);
        }
        cta_mm<false, true>(sm.P, LDFB, sm.S0, LDT, sm.S1, LDT, BT, BT, ws, s0 > 0, false);
        cta_mm<false, true>(sm.dT, LDFB, sm.S2, LDT, sm.S3, LDT, BT, BT, ws, s0 > 0, false);
        cta_mm<true, false>(sm.F0, LDF, sm.Tm_op, LDTB, sm.S2, LDT, BT, ws, BT, false);   // dvb = Tm^T dU
        cta_rows<1>(p.L, min(ws, dv - s0), [&](int r, int cc, float* acc) {
            const float dvb = sm.F0[r * LDF + cc];
            acc[0] = fmaf(sm.F1[r * LDF + cc], dvb, acc[0]);
            grad_v[(p.row0 + r) * ld_d + (size_t)p.h * dv + s0 + cc] = sm.beta[r] * dvb;
        }, [&](int r, const float* acc) { sm.dbeta[r] += acc[0]; });
    }
}

// phase 3 of both backward chunk kernels: dT <- Tm^T strictly_lower(dT) Tm^T, whose strictly lower part is -dA
// (spec 3.4 Kernel 4: dA = -strictly_lower(Tm^T dT Tm^T); only dT's strictly lower part reaches it); P and Z_op
// are scratch
template <typename Tc, typename Smem>
__device__ void gdn_bwd_phase3_dA(Smem& sm) {
    typedef GdnTile<Tc> TL;
    constexpr int BT = GDN_CHUNK, LDTB = TL::LDT_BT, LDFB = TL::LDF_BT;
    tile_fill(sm.Z_op, LDTB, BT, BT, [&](int i, int j) { return i > j ? sm.dT[i * LDFB + j] : 0.0f; });
    cta_mm<true, false>(sm.P, LDFB, sm.Tm_op, LDTB, sm.Z_op, LDTB, BT, BT, BT, false);
    tile_fill(sm.Z_op, LDTB, BT, BT, [&](int i, int j) { return sm.P[i * LDFB + j]; });
    cta_mm<false, true>(sm.dT, LDFB, sm.Z_op, LDTB, sm.Tm_op, LDTB, BT, BT, BT, false);
}

template <typename Tc> struct GdnBwdChunkSmem {
    float *P, *dT, *KK;                 // BT x BT fp32
    float *F0, *F1, *F2;                // BT x SL fp32 (F2: dVn h^T, then dkbg)
    float *G, *beta, *gam, *bg, *sg, *eg, *dGa, *dGb, *dbeta, *kdKint, *hdE;
    Tc *P_op, *Tm_op, *Z_op;            // BT x BT operands
    Tc *S0, *S1, *S2, *S3, *S4;         // BT x SL operands
    Tc *Sq, *Sk, *Skb, *Skw;            // BT x SL operands: the dk slab of q, k, kbg, kw in phase 2
    size_t bytes;
    __host__ __device__ explicit GdnBwdChunkSmem(size_t base) {
        typedef GdnTile<Tc> TL;
        SmemCarver cv(base);
        P = cv.take<float>(GDN_CHUNK * TL::LDF_BT);
        dT = cv.take<float>(GDN_CHUNK * TL::LDF_BT);
        KK = cv.take<float>(GDN_CHUNK * TL::LDF_BT);
        F0 = cv.take<float>(GDN_CHUNK * TL::LDF);
        F1 = cv.take<float>(GDN_CHUNK * TL::LDF);
        F2 = cv.take<float>(GDN_CHUNK * TL::LDF);
        G = cv.take<float>(GDN_CHUNK);
        beta = cv.take<float>(GDN_CHUNK);
        gam = cv.take<float>(GDN_CHUNK);
        bg = cv.take<float>(GDN_CHUNK);
        sg = cv.take<float>(GDN_CHUNK);
        eg = cv.take<float>(GDN_CHUNK);
        dGa = cv.take<float>(GDN_CHUNK);
        dGb = cv.take<float>(GDN_CHUNK);
        dbeta = cv.take<float>(GDN_CHUNK);
        kdKint = cv.take<float>(GDN_CHUNK);
        hdE = cv.take<float>(GDN_CHUNK);
        P_op = cv.take<Tc>(GDN_CHUNK * TL::LDT_BT);
        Tm_op = cv.take<Tc>(GDN_CHUNK * TL::LDT_BT);
        Z_op = cv.take<Tc>(GDN_CHUNK * TL::LDT_BT);
        S0 = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        S1 = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        S2 = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        S3 = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        S4 = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        Sq = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        Sk = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        Skb = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        Skw = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        bytes = cv.off;
    }
};

template <typename Tin, typename Tc>
__global__ void __launch_bounds__(GDN_BWD_THREADS)
gdn_bwd_chunk_kernel(float* grad_q, float* grad_k, float* grad_v, int ld_d, float* grad_kw, int ld_dkw,
                     float* grad_beta, float* grad_g, const Tin* dO, int ld_o, const Tin* q, const Tin* k,
                     const Tin* v, int ld_qkv, const Tin* kw, int ld_kw, const float* beta, const float* Tm_saved,
                     const float* G_saved, const Tc* h_saved,
                     const Tc* Vn_saved, const float* dVn_work, const Tc* dE_work,
                     int T, int H, int NT, int dk, int dv, float scale) {
    typedef GdnTile<Tc> TL;
    constexpr int BT = GDN_CHUNK, SL = TL::SL, LDT = TL::LDT, LDF = TL::LDF, LDTB = TL::LDT_BT, LDFB = TL::LDF_BT;
    static_assert(GDN_BWD_THREADS * 8 >= BT * BT, "one round trip per tile load (tile_load<1>)");
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    GdnBwdChunkSmem<Tc> sm((size_t)gdn_smem);
    const GdnChunkPos p = gdn_chunk_pos(blockIdx.x, T, H, NT);
    const int dkp = round16_dev(dk), dvp = round16_dev(dv);
    const size_t c = p.c;
    const int tid = threadIdx.x;
    const float* Tm_c = Tm_saved + c * BT * BT;
    const Tc* h_c = h_saved + c * dk * dv;
    const Tc* dE_c = dE_work + c * dk * dv;
    const Tc* Vn_c = Vn_saved + c * BT * dv;
    const float* dVn_c = dVn_work + c * BT * dv;
    const bool split = kw != k;              // a write key of its own: its gradient goes to grad_kw
    Tc* const Skw = split ? sm.Skw : sm.Sk;

    // beta (0 on padded rows) and G in one round trip
    const float G_last = gdn_bwd_row_factors(sm, beta, G_saved, p, H, scale);
    for (int r = tid; r < BT; r += blockDim.x) {
        sm.dGa[r] = 0.0f; sm.dGb[r] = 0.0f; sm.dbeta[r] = 0.0f; sm.kdKint[r] = 0.0f; sm.hdE[r] = 0.0f;
    }
    __syncthreads();

    // phase 1, over dv slabs: P, dT = dU vb^T, dv, dbeta_b; Tm comes with the first slab
    gdn_bwd_phase1<Tin, Tc>(sm, grad_v, ld_d, dO, ld_o, v, ld_qkv, Tm_c, Vn_c, dVn_c, p, dv);
    cta_for_each(BT, BT, [&](int i, int j) {
        sm.P_op[i * LDTB + j] = from_float<Tc>(i >= j ? scale * sm.P[i * LDFB + j] * expf(sm.G[i] - sm.G[j]) : 0.0f);
    });

    // phase 2, over dk slabs
    for (int k0 = 0; k0 < dkp; k0 += SL) {
        const int wk = min(SL, dkp - k0);
        // F0 = dO h^T, F1 = Vn dE^T, F2 = dVn h^T for these dk columns, contracting over dv slab by slab; this
        // dk slab of q, k and kbg = diag(beta gam) K comes with the first dv slab
        for (int s0 = 0; s0 < dvp; s0 += SL) {
            const int ws = min(SL, dvp - s0);
            const auto do_tile = gdn_in_tile(sm.S0, LDT, ws, dO, ld_o, p, dv, s0);
            const auto vn_tile = gdn_mat_tile(sm.S1, LDT, BT, ws, Vn_c, BT, dv, 0, s0);
            const auto dvn_tile = gdn_mat_tile(sm.S2, LDT, BT, ws, dVn_c, BT, dv, 0, s0);
            const auto h_tile = gdn_mat_tile(sm.S3, LDT, wk, ws, h_c, dk, dv, k0, s0);     // h rows k0.., columns s0..
            const auto de_tile = gdn_mat_tile(sm.S4, LDT, wk, ws, dE_c, dk, dv, k0, s0);   // dE rows k0.., columns s0..
            if (s0 == 0 && split) {
                tile_load<1>(do_tile, vn_tile, dvn_tile, h_tile, de_tile,
                            gdn_in_tile(sm.Sq, LDT, wk, q, ld_qkv, p, dk, k0),
                            gdn_in_tile(sm.Sk, LDT, wk, k, ld_qkv, p, dk, k0),
                            gdn_in_tile(sm.Skb, LDT, wk, k, ld_qkv, p, dk, k0, sm.bg),
                            gdn_in_tile(sm.Skw, LDT, wk, kw, ld_kw, p, dk, k0));
            } else if (s0 == 0) {
                tile_load<1>(do_tile, vn_tile, dvn_tile, h_tile, de_tile,
                            gdn_in_tile(sm.Sq, LDT, wk, q, ld_qkv, p, dk, k0),
                            gdn_in_tile(sm.Sk, LDT, wk, k, ld_qkv, p, dk, k0),
                            gdn_in_tile(sm.Skb, LDT, wk, k, ld_qkv, p, dk, k0, sm.bg));
            } else {
                tile_load<1>(do_tile, vn_tile, dvn_tile, h_tile, de_tile);
            }
            cta_mm<false, true>(sm.F0, LDF, sm.S0, LDT, sm.S3, LDT, BT, wk, ws, s0 > 0, false);
            cta_mm<false, true>(sm.F1, LDF, sm.S1, LDT, sm.S4, LDT, BT, wk, ws, s0 > 0, false);
            cta_mm<false, true>(sm.F2, LDF, sm.S2, LDT, sm.S3, LDT, BT, wk, ws, s0 > 0, false);
            cta_rows<1>(wk, ws, [&](int d, int cc, float* acc) {   // <h, dE>_F, accumulated per slab row
                acc[0] = fmaf(to_float(sm.S3[d * LDT + cc]), to_float(sm.S4[d * LDT + cc]), acc[0]);
            }, [&](int d, const float* acc) { sm.hdE[d] += acc[0]; });
        }
        // dQ = scale diag(gam) (dO h^T) + P Kw;  dKw_int = diag(e) (Vn dE^T);  dW = -(dVn h^T) as an operand;
        // sum_i kw_i.dKw_int_i
        cta_rows<1>(BT, wk, [&](int r, int cc, float* acc) {
            sm.F0[r * LDF + cc] *= sm.sg[r];
            const float dkint = sm.F1[r * LDF + cc] * sm.eg[r];
            sm.F1[r * LDF + cc] = dkint;
            sm.S3[r * LDT + cc] = from_float<Tc>(-sm.F2[r * LDF + cc]);
            acc[0] = fmaf(to_float(Skw[r * LDT + cc]), dkint, acc[0]);
        }, [&](int r, const float* acc) { sm.kdKint[r] += acc[0]; });
        cta_mm<false, false>(sm.F0, LDF, sm.P_op, LDTB, Skw, LDT, BT, wk, BT, true, false);         // dQ
        cta_mm<true, false>(sm.F1, LDF, sm.P_op, LDTB, sm.Sq, LDT, BT, wk, BT, true, false);        // dKw_a
        cta_mm<false, true>(sm.dT, LDFB, sm.S3, LDT, sm.Skb, LDT, BT, BT, wk, true, false);         // dT += dW kbg^T
        cta_mm<true, false>(sm.F2, LDF, sm.Tm_op, LDTB, sm.S3, LDT, BT, wk, BT, false, false);      // dkbg = Tm^T dW
        cta_mm<false, true>(sm.KK, LDFB, sm.Sk, LDT, Skw, LDT, BT, BT, wk, k0 > 0);                 // K Kw^T
        cta_rows<3>(p.L, min(wk, dk - k0), [&](int r, int cc, float* acc) {
            const float qv = to_float(sm.Sq[r * LDT + cc]), kv = to_float(sm.Sk[r * LDT + cc]);
            const float kwv = to_float(Skw[r * LDT + cc]);
            const float dq = sm.F0[r * LDF + cc], dka = sm.F1[r * LDF + cc], dkbg = sm.F2[r * LDF + cc];
            acc[0] = fmaf(qv, dq, acc[0]);
            acc[1] = fmaf(kwv, dka, acc[1]);
            acc[2] = fmaf(kv, dkbg, acc[2]);
            const size_t off = (p.row0 + r) * ld_d + (size_t)p.h * dk + k0 + cc;
            grad_q[off] = dq;
            if (split) {   // dK_b and dKw_a; dK_c's two sides are added in phase 4
                grad_k[off] = sm.bg[r] * dkbg;
                grad_kw[(p.row0 + r) * ld_dkw + (size_t)p.h * dk + k0 + cc] = dka;
            } else {
                grad_k[off] = dka + sm.bg[r] * dkbg;
            }
        }, [&](int r, const float* acc) {
            sm.dGa[r] += acc[0] - acc[1];
            sm.dGb[r] += sm.bg[r] * acc[2];        // kbg_i . dkbg_i
            sm.dbeta[r] += sm.gam[r] * acc[2];     // gam_i (k_i . dkbg_i)
        });
    }

    // phase 3: dA = -strictly_lower(Tm^T dT' Tm^T) with dT' = strictly_lower(dT)
    gdn_bwd_phase3_dA<Tc>(sm);
    // dAG = dA (.) Gam, kept in P (strictly lower)
    cta_for_each(BT, BT, [&](int i, int j) {
        sm.P[i * LDFB + j] = i > j ? -sm.dT[i * LDFB + j] * expf(sm.G[i] - sm.G[j]) : 0.0f;
    });
    // dbeta_c_i = sum_j dAG_ij (k_i.kw_j); dG_c_i = sum_j dA_ij A_ij - sum_j dA_ji A_ji with
    // dA_ij A_ij = dAG_ij beta_i (k_i.kw_j): only the products with the decay already applied are formed
    cta_rows<2>(BT, BT, [&](int i, int j, float* acc) {
        if (j < i) { acc[0] = fmaf(sm.P[i * LDFB + j], sm.KK[i * LDFB + j], acc[0]); }
        if (j > i) { acc[1] = fmaf(sm.P[j * LDFB + i] * sm.beta[j], sm.KK[j * LDFB + i], acc[1]); }
    }, [&](int i, const float* acc) {
        sm.dbeta[i] += acc[0];
        sm.dGb[i] += sm.beta[i] * acc[0] - acc[1];
    });
    // Z = Z1 + Z1^T with Z1 = diag(beta) dAG where kw = k, else Z1
    tile_fill(sm.Z_op, LDTB, BT, BT, [&](int i, int j) {
        return sm.beta[i] * sm.P[i * LDFB + j] + (split ? 0.0f : sm.beta[j] * sm.P[j * LDFB + i]);
    });

    // phase 4: dk += Z K (dK_c; with a write key of its own dk += Z1 Kw, dkw += Z1^T K). The rows written in
    // phase 2 are read back into registers before the slab loads and the products, so their round trip overlaps
    // those (instead of one read per element after them)
    constexpr int NK = BT * SL / GDN_BWD_THREADS;
    static_assert(NK * GDN_BWD_THREADS == BT * SL, "phase 4: a dk slab of the chunk in NK elements per thread");
    for (int k0 = 0; k0 < dkp; k0 += SL) {
        const int wk = min(SL, dkp - k0), cols = min(wk, dk - k0), n = p.L * cols;
        const TileDiv row_of(cols);
        float dk_ab[NK], dkw_a[NK];
        #pragma unroll
        for (int u = 0; u < NK; u++) {
            const int idx = tid + u * GDN_BWD_THREADS, r = row_of(idx), cc = idx - r * cols;
            dk_ab[u] = idx < n ? grad_k[(p.row0 + r) * ld_d + (size_t)p.h * dk + k0 + cc] : 0.0f;
            dkw_a[u] = split && idx < n ? grad_kw[(p.row0 + r) * ld_dkw + (size_t)p.h * dk + k0 + cc] : 0.0f;
        }
        const auto k_tile = gdn_in_tile(sm.S1, LDT, wk, k, ld_qkv, p, dk, k0);
        if (split) {
            tile_load<1>(k_tile, gdn_in_tile(sm.S2, LDT, wk, kw, ld_kw, p, dk, k0));
            cta_mm<false, false>(sm.F0, LDF, sm.Z_op, LDTB, sm.S2, LDT, BT, wk, BT, false);
            cta_mm<true, false>(sm.F1, LDF, sm.Z_op, LDTB, sm.S1, LDT, BT, wk, BT, false);
        } else {
            tile_load<1>(k_tile);
            cta_mm<false, false>(sm.F0, LDF, sm.Z_op, LDTB, sm.S1, LDT, BT, wk, BT, false);
        }
        #pragma unroll
        for (int u = 0; u < NK; u++) {
            const int idx = tid + u * GDN_BWD_THREADS, r = row_of(idx), cc = idx - r * cols;
            if (idx < n) {
                grad_k[(p.row0 + r) * ld_d + (size_t)p.h * dk + k0 + cc] = dk_ab[u] + sm.F0[r * LDF + cc];
                if (split) {
                    grad_kw[(p.row0 + r) * ld_dkw + (size_t)p.h * dk + k0 + cc] = dkw_a[u] + sm.F1[r * LDF + cc];
                }
            }
        }
    }

    // phase 5: dG_a[BT-1] += gam_BT <h, dE>_F + sum_i kw_i.dKw_int_i; then dbeta and the reverse cumsum dg
    if (tid < 32) {
        float s = 0.0f, kd = 0.0f;
        for (int d = tid; d < SL; d += 32) { s += sm.hdE[d]; }
        for (int r = tid; r < BT; r += 32) { kd += sm.kdKint[r]; }
        #pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, o);
            kd += __shfl_xor_sync(0xffffffffu, kd, o);
        }
        if (tid == 0) { sm.dGa[BT - 1] += expf(G_last) * s + kd; }
    }
    __syncthreads();
    gdn_bwd_write_dg(grad_g, grad_beta, sm.dGa, sm.dGb, sm.dbeta, p, H);
}

// ----------------------------------------------------------------------------------------------------------
// backward kernels 4, 5, 6 on register tiles, per head (Tc = bf16: gdn, kaczmarz, pdn, pgdn in the bf16 trainer):
// gdn_bwd_chunk_kernel's phases and math, one CTA of 16 warps per chunk, every product in mma.sync fragments. Warp w
// holds the rows 16 (w % 4) .. + 15 and, of every 64 columns, the 16 from 16 (w / 4): of P, dT and K Kw^T (64 x 64),
// of dq, dk, dkw (a 64-column block of dk at a time) and of dv. dT and K Kw^T stay in registers from phase 1 to
// phase 3; P, dW, Tm and the phase-3 operands pass through shared memory as bf16 (they are read transposed or by
// other warps). dO, Vn and v are copied by cp.async, dVn and Tm converted from fp32 while phase 2's first dk block
// (h, dE, q, k, kw) is in flight; vb = diag(beta) V and kbg = diag(beta gam) K enter as column factors of the fp32
// products (the shared-memory kernel rounds them to bf16 first). Shared memory grows with dv: the launcher runs
// gdn_bwd_chunk_kernel where it does not fit.

#define GDN_BWD_KB 64   // columns of a dk block in phases 2 and 4

// acc[2] += A B for the warp's 16 x 16 block at rows m0, columns n0, over k < kd: A from shared memory [m][k]
// (A_KM: stored [k][m]), B stored [n][k] (B_NK) or [k][n]
template <bool A_KM, bool B_NK>
__device__ __forceinline__ void gdn_mma16(float acc[2][4], const __nv_bfloat16* A, int lda, int m0,
                                          const __nv_bfloat16* Bm, int ldb, int n0, int kd, int lane) {
    for (int k0 = 0; k0 < kd; k0 += 16) {
        uint32_t a[4], b[4];
        if (A_KM) { ldsm_x4_trans(a, A + ldsm_a_km_off(lda, m0, k0, lane)); }
        else { ldsm_x4(a, A + ldsm_a_off(lda, m0, k0, lane)); }
        if (B_NK) { ldsm_x4(b, Bm + ldsm_b_nk_off(ldb, k0, n0, lane)); }
        else { ldsm_x4_trans(b, Bm + ldsm_b_kn_off(ldb, k0, n0, lane)); }
        mma_bf16(acc[0], a, b[0], b[1]);
        mma_bf16(acc[1], a, b[2], b[3]);
    }
}

// f(nt, e, row, col) for the elements of the warp's 16 x 16 block at m0, n0 (fragment acc[nt][e])
template <typename F>
__device__ __forceinline__ void gdn_frag16_each(int m0, int n0, int lane, F f) {
    #pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        #pragma unroll
        for (int e = 0; e < 4; e++) { f(nt, e, m0 + (lane >> 2) + 8 * (e >> 1), n0 + 8 * nt + 2 * (lane & 3) + (e & 1)); }
    }
}

// s[row][col..col+1] = bf16 of x0, x1 for the warp's block acc (the pairs e = 0, 1 and 2, 3)
template <typename F>
__device__ __forceinline__ void gdn_frag16_store(__nv_bfloat16* s, int lds, int m0, int n0, int lane, F value) {
    #pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        #pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const int r = m0 + (lane >> 2) + 8 * hr, c = n0 + 8 * nt + 2 * (lane & 3);
            *reinterpret_cast<uint32_t*>(s + r * lds + c) = pack_bf16(value(nt, 2 * hr, r, c), value(nt, 2 * hr + 1, r, c + 1));
        }
    }
}

// the sum over the 4 lanes of a row (t4 = lane % 4) of x, on every lane
__device__ __forceinline__ float gdn_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

#define GDN_BWD_PARTS 5   // per-row partial sums per column quarter: v.dvb, q.dQ, kw.dKw_a, k.dkbg, kw.dKw_int

// The two register-tile backward chunk kernels' common start (gdn_bwd_chunk_mma_kernel, per head, and
// gdn_bwd_chunk_channel_mma_kernel, per channel; Smem is either layout): the chunk's dO, Vn and V rows by cp.async
// as one group, then dVn and Tm from fp32 to the bf16 operands (dVn's padded columns dv .. dvq zero).
template <typename Smem>
__device__ __forceinline__ void gdn_bwd_mma_load_values(Smem& sm, int dvq, const __nv_bfloat16* dO, int ld_o,
                                                        const __nv_bfloat16* v, int ld_qkv,
                                                        const __nv_bfloat16* Vn_saved, const GdnChunkPos& p, int dv) {
    constexpr int BT = GDN_CHUNK;
    const int ldv = dvq + 8;
    tile_load_async(sm.dO, ldv, BT, dvq, dO + p.row0 * ld_o + (size_t)p.h * dv, ld_o, p.L, dv);
    tile_load_async(sm.Vn, ldv, BT, dvq, Vn_saved + p.c * BT * dv, dv, BT, dv);
    tile_load_async(sm.V, ldv, BT, dvq, v + p.row0 * ld_qkv + (size_t)p.h * dv, ld_qkv, p.L, dv);
    cp_async_commit();
}

template <typename Smem>
__device__ __forceinline__ void gdn_bwd_mma_stage(Smem& sm, int dvq, const float* dVn_work, const float* Tm_saved,
                                                  const GdnChunkPos& p, int dv) {
    constexpr int BT = GDN_CHUNK, LB = BT + 8;
    const int ldv = dvq + 8;
    const float* dVn_c = dVn_work + p.c * BT * dv;
    const TileDiv row4_of(dvq / 4);
    for (int idx = threadIdx.x; idx < BT * dvq / 4; idx += blockDim.x) {
        const int r = row4_of(idx), c4 = (idx - r * (dvq / 4)) * 4;
        const float4 x = c4 < dv ? *reinterpret_cast<const float4*>(dVn_c + (size_t)r * dv + c4) : make_float4(0, 0, 0, 0);
        uint32_t* s = reinterpret_cast<uint32_t*>(sm.dVn + r * ldv + c4);
        s[0] = pack_bf16(x.x, x.y);
        s[1] = pack_bf16(x.z, x.w);
    }
    for (int idx = threadIdx.x; idx < BT * BT / 4; idx += blockDim.x) {
        const int r = idx / (BT / 4), c4 = (idx - r * (BT / 4)) * 4;
        const float4 x = *reinterpret_cast<const float4*>(Tm_saved + (p.c * BT + r) * BT + c4);
        uint32_t* s = reinterpret_cast<uint32_t*>(sm.Tm + r * LB + c4);
        s[0] = pack_bf16(x.x, x.y);
        s[1] = pack_bf16(x.z, x.w);
    }
}

// phase 1's dvb = Tm^T dU in both register-tile backward chunk kernels, warp (m0, n16) of 4 x 4, over dv slabs of
// 64: dv = diag(beta) dvb into grad_v, rv[e >> 1] += v.dvb over the thread's two rows
template <typename Smem>
__device__ __forceinline__ void gdn_bwd_mma_dv(Smem& sm, float rv[2], float* grad_v, int ld_d, int dvq,
                                               const GdnChunkPos& p, int dv, int m0, int n16, int lane) {
    constexpr int BT = GDN_CHUNK, LB = BT + 8;
    const int ldv = dvq + 8;
    for (int nb = 0; nb < dvq; nb += 64) {
        float acc[2][4] = {};
        gdn_mma16<true, false>(acc, sm.Tm, LB, m0, sm.dVn, ldv, nb + n16, BT, lane);
        gdn_frag16_each(m0, nb + n16, lane, [&](int nt, int e, int i, int col) {
            if (col < dv) {
                rv[e >> 1] = fmaf(__bfloat162float(sm.V[i * ldv + col]), acc[nt][e], rv[e >> 1]);
                if (i < p.L) { grad_v[(p.row0 + i) * ld_d + (size_t)p.h * dv + col] = sm.beta[i] * acc[nt][e]; }
            }
        });
    }
}

struct GdnBwdChunkMmaSmem {
    __nv_bfloat16 *dO, *Vn, *dVn, *V;   // [BT][dvq + 8]
    __nv_bfloat16 *Hs, *dE;             // [KB][dvq + 8]: a dk block's rows of h and dE
    __nv_bfloat16 *Q, *K, *Kw;          // [BT][KB + 8]: a dk block's columns
    __nv_bfloat16 *Tm, *P, *dW, *Z;     // [BT][BT + 8]
    float *KK, *dAG;                    // [BT][LDF_BT], in Hs's and dE's memory (dead after phase 2)
    float *G, *beta, *gam, *bg, *sg, *eg, *dbc, *dgc, *dGa, *dGb, *kd, *hde;
    float* part;                        // [GDN_BWD_PARTS][4][BT]
    size_t bytes;
    __host__ __device__ GdnBwdChunkMmaSmem(size_t base, int dvq, bool split) {
        constexpr int BT = GDN_CHUNK, LDF = GdnTile<__nv_bfloat16>::LDF_BT;
        SmemCarver cv(base);
        dO = cv.take<__nv_bfloat16>((size_t)BT * (dvq + 8));
        Vn = cv.take<__nv_bfloat16>((size_t)BT * (dvq + 8));
        dVn = cv.take<__nv_bfloat16>((size_t)BT * (dvq + 8));
        V = cv.take<__nv_bfloat16>((size_t)BT * (dvq + 8));
        const size_t hde_elems = (size_t)GDN_BWD_KB * (dvq + 8), f_elems = (size_t)BT * LDF * 2;   // f: fp32 in bf16 units
        Hs = cv.take<__nv_bfloat16>(hde_elems > f_elems ? hde_elems : f_elems);
        dE = cv.take<__nv_bfloat16>(hde_elems > f_elems ? hde_elems : f_elems);
        KK = reinterpret_cast<float*>(Hs);
        dAG = reinterpret_cast<float*>(dE);
        Q = cv.take<__nv_bfloat16>(BT * (GDN_BWD_KB + 8));
        K = cv.take<__nv_bfloat16>(BT * (GDN_BWD_KB + 8));
        Kw = split ? cv.take<__nv_bfloat16>(BT * (GDN_BWD_KB + 8)) : K;
        Tm = cv.take<__nv_bfloat16>(BT * (BT + 8));
        P = cv.take<__nv_bfloat16>(BT * (BT + 8));
        dW = cv.take<__nv_bfloat16>(BT * (BT + 8));
        Z = cv.take<__nv_bfloat16>(BT * (BT + 8));
        float** vec[12] = {&G, &beta, &gam, &bg, &sg, &eg, &dbc, &dgc, &dGa, &dGb, &kd, &hde};
        for (float** v : vec) { *v = cv.take<float>(BT); }
        part = cv.take<float>((size_t)GDN_BWD_PARTS * 4 * BT);
        bytes = cv.off;
    }
};

__global__ void __launch_bounds__(GDN_BWD_THREADS, 1)
gdn_bwd_chunk_mma_kernel(float* grad_q, float* grad_k, float* grad_v, int ld_d, float* grad_kw, int ld_dkw,
                         float* grad_beta, float* grad_g, const __nv_bfloat16* dO, int ld_o, const __nv_bfloat16* q,
                         const __nv_bfloat16* k, const __nv_bfloat16* v, int ld_qkv, const __nv_bfloat16* kw, int ld_kw,
                         const float* beta, const float* Tm_saved, const float* G_saved, const __nv_bfloat16* h_saved,
                         const __nv_bfloat16* Vn_saved, const float* dVn_work, const __nv_bfloat16* dE_work, int T,
                         int H, int NT, int dk, int dv, float scale) {
    constexpr int BT = GDN_CHUNK, KB = GDN_BWD_KB, LB = BT + 8, LK = KB + 8, LDF = GdnTile<__nv_bfloat16>::LDF_BT;
    static_assert(GDN_BWD_THREADS == 512 && KB == BT, "16 warps: 4 row blocks x 4 column quarters of 64");
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    const GdnChunkPos p = gdn_chunk_pos(blockIdx.x, T, H, NT);
    const size_t c = p.c;
    const bool split = kw != k;
    const int dvq = gdn_round64(dv), ldv = dvq + 8, tid = threadIdx.x;
    GdnBwdChunkMmaSmem sm((size_t)gdn_smem, dvq, split);
    const int warp = tid >> 5, lane = tid & 31, m0 = 16 * (warp & 3), cq = warp >> 2, n16 = 16 * cq;

    // dk block kb's h and dE rows, q, k and kw columns
    const auto load_block = [&](int d0) {
        tile_load_async(sm.Hs, ldv, KB, dvq, h_saved + c * dk * dv + (size_t)d0 * dv, dv, dk - d0, dv);
        tile_load_async(sm.dE, ldv, KB, dvq, dE_work + c * dk * dv + (size_t)d0 * dv, dv, dk - d0, dv);
        tile_load_async(sm.Q, LK, BT, KB, q + p.row0 * ld_qkv + (size_t)p.h * dk + d0, ld_qkv, p.L, dk - d0);
        tile_load_async(sm.K, LK, BT, KB, k + p.row0 * ld_qkv + (size_t)p.h * dk + d0, ld_qkv, p.L, dk - d0);
        if (split) { tile_load_async(sm.Kw, LK, BT, KB, kw + p.row0 * ld_kw + (size_t)p.h * dk + d0, ld_kw, p.L, dk - d0); }
        cp_async_commit();
    };
    gdn_bwd_mma_load_values(sm, dvq, dO, ld_o, v, ld_qkv, Vn_saved, p, dv);
    load_block(0);
    // dVn and Tm to bf16 operands; beta (0 on padded rows), G and the row factors
    gdn_bwd_mma_stage(sm, dvq, dVn_work, Tm_saved, p, dv);
    const float G_last = gdn_bwd_row_factors(sm, beta, G_saved, p, H, scale);
    cp_async_wait<1>();
    __syncthreads();

    // phase 1: P = scale (dO Vn^T) (.) M (bf16, shared); dT1 = dU V^T diag(beta) (registers); dvb = Tm^T dU ->
    // dv = diag(beta) dvb, v.dvb
    float dT1[2][4] = {}, KKacc[2][4] = {}, dT2[2][4] = {};
    {
        float pacc[2][4] = {};
        gdn_mma16<false, true>(pacc, sm.dO, ldv, m0, sm.Vn, ldv, n16, dvq, lane);
        gdn_mma16<false, true>(dT1, sm.dVn, ldv, m0, sm.V, ldv, n16, dvq, lane);
        gdn_frag16_store(sm.P, LB, m0, n16, lane, [&](int nt, int e, int i, int j) {
            return i >= j ? scale * pacc[nt][e] * gdn_decay_exp(sm.G[i] - sm.G[j]) : 0.0f;
        });
        gdn_frag16_each(m0, n16, lane, [&](int nt, int e, int, int j) { dT1[nt][e] *= sm.beta[j]; });
    }
    float rv[2] = {0.0f, 0.0f};   // v.dvb of the thread's rows
    gdn_bwd_mma_dv(sm, rv, grad_v, ld_d, dvq, p, dv, m0, n16, lane);
    __syncthreads();   // P complete

    // phase 2, per dk block of KB columns d0 ..: F0 = dO h^T, F1 = Vn dE^T, F2 = dVn h^T; dQ = diag(scale gam) F0 + P Kw;
    // dKw_int = diag(e) F1, dKw_a = dKw_int + P^T Q; dW = -F2; dT2 += dW K^T; dkbg = Tm^T dW; K Kw^T
    float rq[2] = {}, rkw[2] = {}, rk[2] = {}, rki[2] = {}, hde = 0.0f;
    const int nkb = (dk + KB - 1) / KB;
    for (int kb = 0; kb < nkb; kb++) {
        const int d0 = kb * KB;
        cp_async_wait<0>();
        __syncthreads();   // the block's h, dE, q, k, kw
        const TileDiv row_of(dvq);
        for (int idx = tid; idx < KB * dvq; idx += blockDim.x) {   // <h, dE>_F, this thread's share
            const int r = row_of(idx), cc = idx - r * dvq;
            hde = fmaf(__bfloat162float(sm.Hs[r * ldv + cc]), __bfloat162float(sm.dE[r * ldv + cc]), hde);
        }
        float f0[2][4] = {}, f1[2][4] = {}, f2[2][4] = {};
        gdn_mma16<false, true>(f0, sm.dO, ldv, m0, sm.Hs, ldv, n16, dvq, lane);
        gdn_mma16<false, true>(f1, sm.Vn, ldv, m0, sm.dE, ldv, n16, dvq, lane);
        gdn_mma16<false, true>(f2, sm.dVn, ldv, m0, sm.Hs, ldv, n16, dvq, lane);
        gdn_frag16_each(m0, n16, lane, [&](int nt, int e, int i, int dl) {
            f0[nt][e] *= sm.sg[i];
            f1[nt][e] *= sm.eg[i];   // dKw_int
            rki[e >> 1] = fmaf(__bfloat162float(sm.Kw[i * LK + dl]), f1[nt][e], rki[e >> 1]);
        });
        gdn_frag16_store(sm.dW, LB, m0, n16, lane, [&](int nt, int e, int, int) { return -f2[nt][e]; });
        gdn_mma16<false, false>(f0, sm.P, LB, m0, sm.Kw, LK, n16, BT, lane);   // dQ
        gdn_mma16<true, false>(f1, sm.P, LB, m0, sm.Q, LK, n16, BT, lane);     // dKw_a
        __syncthreads();   // dW complete
        gdn_mma16<false, true>(dT2, sm.dW, LB, m0, sm.K, LK, n16, KB, lane);   // dT2 += dW K^T
        gdn_mma16<false, true>(KKacc, sm.K, LK, m0, sm.Kw, LK, n16, KB, lane);  // K Kw^T
        float dkbg[2][4] = {};
        gdn_mma16<true, false>(dkbg, sm.Tm, LB, m0, sm.dW, LB, n16, BT, lane);
        gdn_frag16_each(m0, n16, lane, [&](int nt, int e, int i, int dl) {
            rq[e >> 1] = fmaf(__bfloat162float(sm.Q[i * LK + dl]), f0[nt][e], rq[e >> 1]);
            rkw[e >> 1] = fmaf(__bfloat162float(sm.Kw[i * LK + dl]), f1[nt][e], rkw[e >> 1]);
            rk[e >> 1] = fmaf(__bfloat162float(sm.K[i * LK + dl]), dkbg[nt][e], rk[e >> 1]);
        });
        gdn_frag16_each(m0, n16, lane, [&](int nt, int e, int i, int dl) {
            if ((e & 1) || i >= p.L || d0 + dl >= dk) { return; }   // pairs (e, e + 1): dk is a multiple of 8
            const size_t off = (p.row0 + i) * ld_d + (size_t)p.h * dk + d0 + dl;
            *reinterpret_cast<float2*>(grad_q + off) = make_float2(f0[nt][e], f0[nt][e + 1]);
            const float b0 = sm.bg[i] * dkbg[nt][e], b1 = sm.bg[i] * dkbg[nt][e + 1];
            if (split) {   // dK_b and dKw_a; dK_c's two sides are added in phase 4
                *reinterpret_cast<float2*>(grad_k + off) = make_float2(b0, b1);
                *reinterpret_cast<float2*>(grad_kw + (p.row0 + i) * ld_dkw + (size_t)p.h * dk + d0 + dl) =
                    make_float2(f1[nt][e], f1[nt][e + 1]);
            } else {
                *reinterpret_cast<float2*>(grad_k + off) = make_float2(f1[nt][e] + b0, f1[nt][e + 1] + b1);
            }
        });
        __syncthreads();   // h, dE, q, k, kw and dW read by every warp
        if (kb + 1 < nkb) { load_block(d0 + KB); }
    }

    // phase 3: dT = dT1 + dT2 diag(beta gam); dA = -strictly_lower(Tm^T strictly_lower(dT) Tm^T); dAG = dA (.) Gam
    gdn_frag16_store(sm.Z, LB, m0, n16, lane, [&](int nt, int e, int i, int j) {
        return i > j ? dT1[nt][e] + sm.bg[j] * dT2[nt][e] : 0.0f;
    });
    gdn_frag16_each(m0, n16, lane, [&](int nt, int e, int i, int j) { sm.KK[i * LDF + j] = KKacc[nt][e]; });
    __syncthreads();
    {
        float y[2][4] = {};
        gdn_mma16<true, false>(y, sm.Tm, LB, m0, sm.Z, LB, n16, BT, lane);   // Tm^T strictly_lower(dT)
        gdn_frag16_store(sm.dW, LB, m0, n16, lane, [&](int nt, int e, int, int) { return y[nt][e]; });
    }
    __syncthreads();
    {
        float r[2][4] = {};
        gdn_mma16<false, true>(r, sm.dW, LB, m0, sm.Tm, LB, n16, BT, lane);   // (...) Tm^T
        gdn_frag16_each(m0, n16, lane, [&](int nt, int e, int i, int j) {
            sm.dAG[i * LDF + j] = i > j ? -r[nt][e] * gdn_decay_exp(sm.G[i] - sm.G[j]) : 0.0f;
        });
    }
    __syncthreads();
    // dbeta_c_i = sum_j dAG_ij (k_i.kw_j);  dG_c_i = sum_j (dA (.) A)_ij - (dA (.) A)_ji (as gdn_bwd_chunk_kernel)
    cta_rows<2>(BT, BT, [&](int i, int j, float* acc) {
        if (j < i) { acc[0] = fmaf(sm.dAG[i * LDF + j], sm.KK[i * LDF + j], acc[0]); }
        if (j > i) { acc[1] = fmaf(sm.dAG[j * LDF + i] * sm.beta[j], sm.KK[j * LDF + i], acc[1]); }
    }, [&](int i, const float* acc) {
        sm.dbc[i] = acc[0];
        sm.dgc[i] = sm.beta[i] * acc[0] - acc[1];
    });
    // Z = Z1 + Z1^T with Z1 = diag(beta) dAG where kw = k, else Z1
    tile_fill(sm.Z, LB, BT, BT, [&](int i, int j) {
        return sm.beta[i] * sm.dAG[i * LDF + j] + (split ? 0.0f : sm.beta[j] * sm.dAG[j * LDF + i]);
    });

    // phase 4: dk += Z K (with a write key of its own dk += Z1 Kw, dkw += Z1^T K), per dk block; phase 2's values
    // are read back during the block's load
    for (int d0 = 0; d0 < dk; d0 += KB) {
        tile_load_async(sm.K, LK, BT, KB, k + p.row0 * ld_qkv + (size_t)p.h * dk + d0, ld_qkv, p.L, dk - d0);
        if (split) { tile_load_async(sm.Kw, LK, BT, KB, kw + p.row0 * ld_kw + (size_t)p.h * dk + d0, ld_kw, p.L, dk - d0); }
        cp_async_commit();
        float pk[2][4] = {}, pkw[2][4] = {};
        gdn_frag16_each(m0, n16, lane, [&](int nt, int e, int i, int dl) {
            if (i < p.L && d0 + dl < dk) {
                pk[nt][e] = grad_k[(p.row0 + i) * ld_d + (size_t)p.h * dk + d0 + dl];
                if (split) { pkw[nt][e] = grad_kw[(p.row0 + i) * ld_dkw + (size_t)p.h * dk + d0 + dl]; }
            }
        });
        cp_async_wait<0>();
        __syncthreads();
        gdn_mma16<false, false>(pk, sm.Z, LB, m0, split ? sm.Kw : sm.K, LK, n16, BT, lane);
        if (split) { gdn_mma16<true, false>(pkw, sm.Z, LB, m0, sm.K, LK, n16, BT, lane); }
        gdn_frag16_each(m0, n16, lane, [&](int nt, int e, int i, int dl) {
            if ((e & 1) || i >= p.L || d0 + dl >= dk) { return; }
            *reinterpret_cast<float2*>(grad_k + (p.row0 + i) * ld_d + (size_t)p.h * dk + d0 + dl) =
                make_float2(pk[nt][e], pk[nt][e + 1]);
            if (split) {
                *reinterpret_cast<float2*>(grad_kw + (p.row0 + i) * ld_dkw + (size_t)p.h * dk + d0 + dl) =
                    make_float2(pkw[nt][e], pkw[nt][e + 1]);
            }
        });
        __syncthreads();   // K, Kw read by every warp
    }

    // phase 5: the row sums, in a fixed order: each thread's over its columns, its quad's, then the column quarters
    const float mine[GDN_BWD_PARTS][2] = {{rv[0], rv[1]}, {rq[0], rq[1]}, {rkw[0], rkw[1]}, {rk[0], rk[1]}, {rki[0], rki[1]}};
    #pragma unroll
    for (int s = 0; s < GDN_BWD_PARTS; s++) {
        #pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const float x = gdn_quad_sum(mine[s][hr]);
            if ((lane & 3) == 0) { sm.part[(s * 4 + cq) * BT + m0 + (lane >> 2) + 8 * hr] = x; }
        }
    }
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) { hde += __shfl_xor_sync(0xffffffffu, hde, o); }
    if (lane == 0) { sm.hde[warp] = hde; }
    __syncthreads();
    if (tid < BT) {
        const int r = tid;
        float pv = 0.0f, pq = 0.0f, pkw = 0.0f, pk = 0.0f, pki = 0.0f;
        for (int j = 0; j < 4; j++) {
            pv += sm.part[(0 * 4 + j) * BT + r];
            pq += sm.part[(1 * 4 + j) * BT + r];
            pkw += sm.part[(2 * 4 + j) * BT + r];
            pk += sm.part[(3 * 4 + j) * BT + r];
            pki += sm.part[(4 * 4 + j) * BT + r];
        }
        sm.dGa[r] = pq - pkw;
        sm.dGb[r] = sm.bg[r] * pk + sm.dgc[r];
        sm.dbc[r] += pv + sm.gam[r] * pk;   // dbeta
        sm.kd[r] = pki;
    }
    __syncthreads();
    if (tid == 0) {   // dG_a[BT-1] += gam_BT <h, dE>_F + sum_i kw_i.dKw_int_i
        float s = 0.0f, kd = 0.0f;
        for (int w = 0; w < GDN_BWD_THREADS / 32; w++) { s += sm.hde[w]; }
        for (int r = 0; r < BT; r++) { kd += sm.kd[r]; }
        sm.dGa[BT - 1] += expf(G_last) * s + kd;
    }
    __syncthreads();
    gdn_bwd_write_dg(grad_g, grad_beta, sm.dGa, sm.dGb, sm.dbc, p, H);
}

// ----------------------------------------------------------------------------------------------------------
// backward kernels 4, 5, 6 with a per-channel decay (spec/pdn.md 3.4; the steps of dev/cuda/pkda_chunk_check.py),
// fused, one CTA per chunk, for a write key of its own (pkda). With dAqk = scale tril(dO Vn^T), Z1 = diag(beta) dA,
// e = exp(G), el = exp(G_BT - G), the gdn_decay_rows / gdn_decay_cols products written rows(D, Y), cols(D, X):
//   phase 1 (dv slabs)  as the per-head kernel: dO Vn^T, dT = dU vb^T, dv, dbeta_b
//   phase 2 (dk slabs)  dQ = scale (dO h^T) (.) e + rows(dAqk, Kw)                               -> dq
//                       dKw_st = (Vn dE^T) (.) el;  dKw_a = dKw_st + cols(dAqk, Q)
//                       dW = -dVn h^T;  dT += dW kbg^T (kbg = diag(beta) K (.) e);  dkbg = Tm^T dW
//                       dK_b = diag(beta) e (.) dkbg;  dbeta_b += (k (.) e).dkbg
//                       dG (partial, into grad_g) = q dQ + k dK_b - kw dKw_a
//                       ce = gam_BT (.) rowsum(h (.) dE) + colsum(kw (.) dKw_st)   (the chunk-end terms, per channel)
//   phase 3             dA = -strictly_lower(Tm^T strictly_lower(dT) Tm^T);  dbeta_c_i = sum_j dA_ij A0_ij;
//                       dbeta; Z1 and ce to the workspace
//   then gdn_bwd_keys_channel_kernel, per chunk with less shared memory (two CTAs per SM):
//                       dk = dK_b + rows(Z1, Kw);  dkw = dKw_a + cols(Z1, K);  dG += k rows(..) - kw cols(..),
//                       dG[BT-1] += ce;  dg = the reverse cumulative sum of dG over the chunk, per channel
// The decay gradient is spec 3.4 step 7's identity: the gradient of a channel's cumulative log decay G[r] is
// q dq + k dk - kw dkw at row r (every product's exponent G_r - G_s pairs a row with a column), plus the chunk-end
// state's terms at the last row.

template <typename Tc> struct GdnBwdChannelSmem {
    float *P, *dT;                      // BT x BT fp32
    float *F0, *F1, *F2, *Gs;           // BT x SL fp32; Gs: the dk slab's G
    float *beta, *dbeta, *ce;           // [BT], [BT], ce: [256] the chunk-end terms of dG per channel
    Tc *P_op, *Tm_op, *Z_op;            // BT x BT operands
    Tc *S0, *S1, *S2, *S3, *S4;         // BT x SL operands of the dv loops; after phase 2's dv loop S0.. and S2..
    Tc *Sb, *Sa;                        // hold the stacks of gdn_decay_rows (Sb) and gdn_decay_cols (Sa)
    Tc *Sq, *Sk, *Skw, *Skb;            // BT x SL operands: the dk slab of q, k, kw (raw) and kbg
    size_t bytes;
    __host__ __device__ explicit GdnBwdChannelSmem(size_t base) {
        typedef GdnTile<Tc> TL;
        static_assert(2 * GDN_CHUNK >= GDN_STACK_ROWS, "a stack fits two dv-loop tiles");
        SmemCarver cv(base);
        P = cv.take<float>(GDN_CHUNK * TL::LDF_BT);
        dT = cv.take<float>(GDN_CHUNK * TL::LDF_BT);
        F0 = cv.take<float>(GDN_CHUNK * TL::LDF);
        F1 = cv.take<float>(GDN_CHUNK * TL::LDF);
        F2 = cv.take<float>(GDN_CHUNK * TL::LDF);
        Gs = cv.take<float>(GDN_CHUNK * TL::LDF);
        beta = cv.take<float>(GDN_CHUNK);
        dbeta = cv.take<float>(GDN_CHUNK);
        ce = cv.take<float>(256);
        P_op = cv.take<Tc>(GDN_CHUNK * TL::LDT_BT);
        Tm_op = cv.take<Tc>(GDN_CHUNK * TL::LDT_BT);
        Z_op = cv.take<Tc>(GDN_CHUNK * TL::LDT_BT);
        S0 = cv.take<Tc>(5 * GDN_CHUNK * TL::LDT);
        S1 = S0 + GDN_CHUNK * TL::LDT;
        S2 = S1 + GDN_CHUNK * TL::LDT;
        S3 = S2 + GDN_CHUNK * TL::LDT;
        S4 = S3 + GDN_CHUNK * TL::LDT;
        Sb = S0;
        Sa = S2;
        Sq = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        Sk = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        Skw = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        Skb = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        bytes = cv.off;
    }
};

template <typename Tin, typename Tc>
__global__ void __launch_bounds__(GDN_BWD_THREADS)
gdn_bwd_chunk_channel_kernel(float* grad_q, float* grad_k, float* grad_v, int ld_d, float* grad_kw, int ld_dkw,
                             float* grad_beta, float* grad_g, const Tin* dO, int ld_o, const Tin* q, const Tin* k,
                             const Tin* v, int ld_qkv, const Tin* kw, int ld_kw, const float* beta,
                             const float* Tm_saved, const float* G_saved, const Tc* h_saved, const Tc* Vn_saved,
                             const float* A0_saved, const float* dVn_work, const Tc* dE_work, Tc* Z_work,
                             float* ce_work, int T, int H, int NT, int dk, int dv, float scale) {
    typedef GdnTile<Tc> TL;
    constexpr int BT = GDN_CHUNK, SL = TL::SL, LDT = TL::LDT, LDF = TL::LDF, LDTB = TL::LDT_BT, LDFB = TL::LDF_BT;
    static_assert(GDN_BWD_THREADS * 8 >= BT * BT, "one round trip per tile load (tile_load<1>)");
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    GdnBwdChannelSmem<Tc> sm((size_t)gdn_smem);
    const GdnChunkPos p = gdn_chunk_pos(blockIdx.x, T, H, NT);
    const int dkp = round16_dev(dk), dvp = round16_dev(dv);
    const size_t c = p.c, HK = (size_t)H * dk;
    const int tid = threadIdx.x;
    const float* G_c = G_saved + c * BT * dk;
    const Tc* h_c = h_saved + c * dk * dv;
    const Tc* dE_c = dE_work + c * dk * dv;
    const Tc* Vn_c = Vn_saved + c * BT * dv;
    const float* dVn_c = dVn_work + c * BT * dv;

    for (int r = tid; r < BT; r += blockDim.x) {
        sm.beta[r] = r < p.L ? beta[(p.row0 + r) * H + p.h] : 0.0f;
        sm.dbeta[r] = 0.0f;
    }
    for (int d = tid; d < 256; d += blockDim.x) { sm.ce[d] = 0.0f; }
    __syncthreads();

    // phase 1: dO Vn^T, dT, dv, dbeta_b; then the operand dAqk = scale tril(dO Vn^T)
    gdn_bwd_phase1<Tin, Tc>(sm, grad_v, ld_d, dO, ld_o, v, ld_qkv, Tm_saved + c * BT * BT, Vn_c, dVn_c, p, dv);
    cta_for_each(BT, BT, [&](int i, int j) {
        sm.P_op[i * LDTB + j] = from_float<Tc>(i >= j ? scale * sm.P[i * LDFB + j] : 0.0f);
    });

    // phase 2, over dk slabs
    for (int k0 = 0; k0 < dkp; k0 += SL) {
        const int wk = min(SL, dkp - k0), cols = min(wk, dk - k0);
        // F0 = dO h^T, F1 = Vn dE^T, F2 = dVn h^T for these dk columns, contracting over dv slab by slab, and
        // ce += rowsum(h (.) dE); this dk slab of q, k, kw and G comes with the first dv slab
        for (int s0 = 0; s0 < dvp; s0 += SL) {
            const int ws = min(SL, dvp - s0);
            const auto do_tile = gdn_in_tile(sm.S0, LDT, ws, dO, ld_o, p, dv, s0);
            const auto vn_tile = gdn_mat_tile(sm.S1, LDT, BT, ws, Vn_c, BT, dv, 0, s0);
            const auto dvn_tile = gdn_mat_tile(sm.S2, LDT, BT, ws, dVn_c, BT, dv, 0, s0);
            const auto h_tile = gdn_mat_tile(sm.S3, LDT, wk, ws, h_c, dk, dv, k0, s0);
            const auto de_tile = gdn_mat_tile(sm.S4, LDT, wk, ws, dE_c, dk, dv, k0, s0);
            if (s0 == 0) {
                tile_load<1>(do_tile, vn_tile, dvn_tile, h_tile, de_tile,
                            gdn_in_tile(sm.Sq, LDT, wk, q, ld_qkv, p, dk, k0),
                            gdn_in_tile(sm.Sk, LDT, wk, k, ld_qkv, p, dk, k0),
                            gdn_in_tile(sm.Skw, LDT, wk, kw, ld_kw, p, dk, k0),
                            gdn_mat_tile(sm.Gs, LDF, BT, wk, G_c, BT, dk, 0, k0));
            } else {
                tile_load<1>(do_tile, vn_tile, dvn_tile, h_tile, de_tile);
            }
            cta_mm<false, true>(sm.F0, LDF, sm.S0, LDT, sm.S3, LDT, BT, wk, ws, s0 > 0, false);
            cta_mm<false, true>(sm.F1, LDF, sm.S1, LDT, sm.S4, LDT, BT, wk, ws, s0 > 0, false);
            cta_mm<false, true>(sm.F2, LDF, sm.S2, LDT, sm.S3, LDT, BT, wk, ws, s0 > 0, false);
            cta_rows<1>(wk, ws, [&](int d, int cc, float* acc) {
                acc[0] = fmaf(to_float(sm.S3[d * LDT + cc]), to_float(sm.S4[d * LDT + cc]), acc[0]);
            }, [&](int d, const float* acc) { sm.ce[k0 + d] += acc[0]; });
        }
        // the state's parts of dQ and dKw, dW = -(dVn h^T) and kbg as operands
        const float* Gl = sm.Gs + (BT - 1) * LDF;
        cta_for_each_slab<SL>(BT, wk, [&](int r, int cc) {
            const float G = sm.Gs[r * LDF + cc], e = gdn_decay_exp(G);
            sm.F0[r * LDF + cc] *= scale * e;
            sm.F1[r * LDF + cc] *= gdn_decay_exp(Gl[cc] - G);
            sm.S4[r * LDT + cc] = from_float<Tc>(-sm.F2[r * LDF + cc]);
            sm.Skb[r * LDT + cc] = from_float<Tc>(sm.beta[r] * to_float(sm.Sk[r * LDT + cc]) * e);
        });
        // the chunk-end terms of the slab's channels; the stacks of the row and column products
        for (int cc = tid; cc < wk; cc += blockDim.x) {
            float s = 0.0f;
            for (int r = 0; r < BT; r++) { s = fmaf(to_float(sm.Skw[r * LDT + cc]), sm.F1[r * LDF + cc], s); }
            sm.ce[k0 + cc] = gdn_decay_exp(Gl[cc]) * sm.ce[k0 + cc] + s;
        }
        gdn_decay_stack_before(sm.Sb, sm.Skw, LDT, sm.Gs, LDF, wk);
        gdn_decay_stack_after(sm.Sa, sm.Sq, LDT, sm.Gs, LDF, wk);
        // dQ += rows(dAqk, Kw); dKw_a = dKw_st + cols(dAqk, Q) (F2 holds each product in turn)
        gdn_decay_rows(sm.F2, LDF, sm.P_op, LDTB, sm.Skw, sm.Sb, LDT, sm.Gs, LDF, wk);
        cta_for_each_slab<SL>(BT, wk, [&](int r, int cc) { sm.F0[r * LDF + cc] += sm.F2[r * LDF + cc]; });
        gdn_decay_cols(sm.F2, LDF, sm.P_op, LDTB, sm.Sq, sm.Sa, LDT, sm.Gs, LDF, wk);
        cta_for_each_slab<SL>(BT, wk, [&](int r, int cc) { sm.F1[r * LDF + cc] += sm.F2[r * LDF + cc]; });
        cta_mm<false, true>(sm.dT, LDFB, sm.S4, LDT, sm.Skb, LDT, BT, BT, wk, true, false);         // dT += dW kbg^T
        cta_mm<true, false>(sm.F2, LDF, sm.Tm_op, LDTB, sm.S4, LDT, BT, wk, BT, false);             // dkbg = Tm^T dW
        cta_rows<1>(p.L, cols, [&](int r, int cc, float* acc) {
            const float qv = to_float(sm.Sq[r * LDT + cc]), kv = to_float(sm.Sk[r * LDT + cc]);
            const float kwv = to_float(sm.Skw[r * LDT + cc]), e = gdn_decay_exp(sm.Gs[r * LDF + cc]);
            const float dq = sm.F0[r * LDF + cc], dkwa = sm.F1[r * LDF + cc], dkbg = sm.F2[r * LDF + cc];
            const float dkb = sm.beta[r] * e * dkbg;
            acc[0] = fmaf(kv * e, dkbg, acc[0]);
            const size_t row = p.row0 + r, col = (size_t)p.h * dk + k0 + cc;
            grad_q[row * ld_d + col] = dq;
            grad_k[row * ld_d + col] = dkb;
            grad_kw[row * ld_dkw + col] = dkwa;
            grad_g[row * HK + col] = qv * dq + kv * dkb - kwv * dkwa;
        }, [&](int r, const float* acc) { sm.dbeta[r] += acc[0]; });
    }

    // phase 3: dA = -strictly_lower(Tm^T dT' Tm^T) with dT' = strictly_lower(dT) (dT holds -dA); A0 into P;
    // dbeta_c; dbeta; Z1 = diag(beta) dA and the chunk-end terms to the workspace
    gdn_bwd_phase3_dA<Tc>(sm);
    tile_load<1>(gdn_mat_tile(sm.P, LDFB, BT, BT, A0_saved + c * BT * BT, BT, BT, 0, 0));
    cta_rows<1>(BT, BT, [&](int i, int j, float* acc) {
        if (j < i) { acc[0] = fmaf(-sm.dT[i * LDFB + j], sm.P[i * LDFB + j], acc[0]); }
    }, [&](int i, const float* acc) { sm.dbeta[i] += acc[0]; });
    cta_for_each(BT, BT, [&](int i, int j) {
        Z_work[(c * BT + i) * BT + j] = from_float<Tc>(i > j ? -sm.beta[i] * sm.dT[i * LDFB + j] : 0.0f);
    });
    for (int d = tid; d < dk; d += blockDim.x) { ce_work[c * dk + d] = sm.ce[d]; }
    for (int r = tid; r < p.L; r += blockDim.x) { grad_beta[(p.row0 + r) * H + p.h] = sm.dbeta[r]; }
}

// the per-channel backward's key gradients from Z1 (the last step of gdn_bwd_chunk_channel_kernel's list), one CTA
// per chunk, two per SM; they add to the partial dk, dkw and dG that the chunk kernel wrote.
#define GDN_KEYS_THREADS 256

template <typename Tc> struct GdnBwdKeysSmem {
    float *F0, *F1, *Gs, *ce;           // BT x SL fp32 (Gs: the slab's G); ce: [256]
    float* F2;                          // BT x SL fp32: dG, in the stacks' memory once the products are done
    Tc *Z_op, *Sk, *Skw, *Sb, *Sa;      // Z1, the slab's k and kw, the stacks of gdn_decay_rows and _cols
    size_t bytes;
    __host__ __device__ explicit GdnBwdKeysSmem(size_t base) {
        typedef GdnTile<Tc> TL;
        SmemCarver cv(base);
        F0 = cv.take<float>(GDN_CHUNK * TL::LDF);
        F1 = cv.take<float>(GDN_CHUNK * TL::LDF);
        Gs = cv.take<float>(GDN_CHUNK * TL::LDF);
        ce = cv.take<float>(256);
        Z_op = cv.take<Tc>(GDN_CHUNK * TL::LDT_BT);
        Sk = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        Skw = cv.take<Tc>(GDN_CHUNK * TL::LDT);
        const size_t stacks = 2 * GDN_STACK_ROWS * TL::LDT * sizeof(Tc), dG = GDN_CHUNK * TL::LDF * sizeof(float);
        unsigned char* region = cv.take<unsigned char>(stacks > dG ? stacks : dG);
        Sb = (Tc*)region;
        Sa = Sb + GDN_STACK_ROWS * TL::LDT;
        F2 = (float*)region;
        bytes = cv.off;
    }
};

template <typename Tin, typename Tc>
__global__ void __launch_bounds__(GDN_KEYS_THREADS, 2)
gdn_bwd_keys_channel_kernel(float* grad_k, int ld_d, float* grad_kw, int ld_dkw, float* grad_g, const Tin* k,
                            int ld_qkv, const Tin* kw, int ld_kw, const float* G_saved, const Tc* Z_work,
                            const float* ce_work, int T, int H, int NT, int dk) {
    typedef GdnTile<Tc> TL;
    constexpr int BT = GDN_CHUNK, SL = TL::SL, LDT = TL::LDT, LDF = TL::LDF, LDTB = TL::LDT_BT;
    constexpr int NK = BT * SL / GDN_KEYS_THREADS;
    static_assert(NK * GDN_KEYS_THREADS == BT * SL, "a dk slab of the chunk in NK elements per thread");
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    GdnBwdKeysSmem<Tc> sm((size_t)gdn_smem);
    const GdnChunkPos p = gdn_chunk_pos(blockIdx.x, T, H, NT);
    const int dkp = round16_dev(dk);
    const size_t c = p.c, HK = (size_t)H * dk;
    const int tid = threadIdx.x;
    const float* G_c = G_saved + c * BT * dk;
    for (int d = tid; d < dk; d += blockDim.x) { sm.ce[d] = ce_work[c * dk + d]; }

    for (int k0 = 0; k0 < dkp; k0 += SL) {
        const int wk = min(SL, dkp - k0), cols = min(wk, dk - k0), n = p.L * cols;
        const auto k_tile = gdn_in_tile(sm.Sk, LDT, wk, k, ld_qkv, p, dk, k0);
        const auto kw_tile = gdn_in_tile(sm.Skw, LDT, wk, kw, ld_kw, p, dk, k0);
        const auto g_tile = gdn_mat_tile(sm.Gs, LDF, BT, wk, G_c, BT, dk, 0, k0);
        if (k0 == 0) {
            tile_load<2>(k_tile, kw_tile, g_tile, gdn_mat_tile(sm.Z_op, LDTB, BT, BT, Z_work + c * BT * BT, BT, BT, 0, 0));
        } else {
            tile_load<2>(k_tile, kw_tile, g_tile);
        }
        gdn_decay_stack_before(sm.Sb, sm.Skw, LDT, sm.Gs, LDF, wk);
        gdn_decay_stack_after(sm.Sa, sm.Sk, LDT, sm.Gs, LDF, wk);
        gdn_decay_rows(sm.F0, LDF, sm.Z_op, LDTB, sm.Skw, sm.Sb, LDT, sm.Gs, LDF, wk);
        gdn_decay_cols(sm.F1, LDF, sm.Z_op, LDTB, sm.Sk, sm.Sa, LDT, sm.Gs, LDF, wk);
        const TileDiv row_of(cols);
        #pragma unroll
        for (int u = 0; u < NK; u++) {
            const int idx = tid + u * GDN_KEYS_THREADS, r = row_of(idx), cc = idx - r * cols;
            if (idx < BT * cols) {
                float dG = 0.0f;
                if (idx < n) {
                    const size_t row = p.row0 + r, col = (size_t)p.h * dk + k0 + cc;
                    const float dkc = sm.F0[r * LDF + cc], dkwc = sm.F1[r * LDF + cc];
                    grad_k[row * ld_d + col] += dkc;
                    grad_kw[row * ld_dkw + col] += dkwc;
                    dG = grad_g[row * HK + col] + to_float(sm.Sk[r * LDT + cc]) * dkc
                         - to_float(sm.Skw[r * LDT + cc]) * dkwc;
                }
                sm.F2[r * LDF + cc] = dG;
            }
        }
        __syncthreads();
        // dg = the reverse cumulative sum of dG per channel, the chunk-end terms at the last row
        for (int cc = tid; cc < cols; cc += blockDim.x) {
            float s = sm.ce[k0 + cc];
            for (int r = BT - 1; r >= 0; r--) {
                s += sm.F2[r * LDF + cc];
                if (r < p.L) { grad_g[(p.row0 + r) * HK + (size_t)p.h * dk + k0 + cc] = s; }
            }
        }
        __syncthreads();
    }
}

// The decayed key products on register tiles (Tc = bf16: pkda's backward chunk kernel below, its phase 4), for a
// warp's rows f = 16 I .. f + 15 and columns n0 .., D a lower triangular BT x BT matrix in shared memory (dAqk, Z1):
//   rows(D, Y) = exp(G_r - G_f) (.) (D[rows, s < f] (Y[s] (.) exp(G_f - G_s)))        (the blocks before I)
//                + sum over s in block I of D_rs Y_s exp(G_r - G_s)                    (the diagonal block)
//   cols(D, X) = exp(G_e - G_s) (.) (D[r > e, rows]^T (X[r] (.) exp(G_r - G_e)))     (the blocks after I, e = f + 15)
//                + sum over r in block I of D_rs X_r exp(G_r - G_s)
// where the diagonal block is one more block of the tensor-core sum when its span allows (gdn_span_ok), else summed
// per element (D's zeros above the diagonal mask the block); the B fragments are scaled in registers.

// acc[2][4] (the warp's 16 rows m0 .., its 16 columns n0 .. n0 + 15: two n-tiles) += A (Y (.) exp(s (G_ref - G_k)))
// over the row blocks kb0 .. kb1 - 1 of Y (16 rows each), where A's 16 x 16 blocks come from Z [BT][BT + 8]: Z's
// rows m0 .. at columns 16 kb (ROWS) or Z^T's (Z's rows 16 kb .., columns m0 ..; !ROWS); s = +1 (ROWS:
// exp(G_ref - G_k)) or -1 (exp(G_k - G_ref)) on Y's rows k, each column c its own G[k][c] and G_ref[c]
template <bool ROWS>
__device__ __forceinline__ void gdn_keys_block_product(float acc[2][4], const __nv_bfloat16* Z, const __nv_bfloat16* Y,
                                                       int ldy, const float* G, int ldg, const float* Gref, int m0,
                                                       int n0, int kb0, int kb1, int lane) {
    constexpr int LDZ = GDN_CHUNK + 8;
    const int g4 = lane >> 2, t4 = lane & 3;
    for (int kb = kb0; kb < kb1; kb++) {
        uint32_t a[4];
        if (ROWS) {
            ldsm_x4(a, Z + ldsm_a_off(LDZ, m0, 16 * kb, lane));
        } else {
            ldsm_x4_trans(a, Z + ldsm_a_km_off(LDZ, m0, 16 * kb, lane));
        }
        uint32_t b[4];
        ldsm_x4_trans(b, Y + ldsm_b_kn_off(ldy, 16 * kb, n0, lane));
        #pragma unroll
        for (int e = 0; e < 4; e++) {   // b[e]: Y's rows k, k + 1 (k = 16 kb + 2 t4, + 8 for odd e), column c
            const int k = 16 * kb + 2 * t4 + 8 * (e & 1), c = n0 + 8 * (e >> 1) + g4;
            const float d0 = G[k * ldg + c] - Gref[c], d1 = G[(k + 1) * ldg + c] - Gref[c];
            b[e] = gdn_scale_pair(b[e], gdn_decay_exp(ROWS ? -d0 : d0), gdn_decay_exp(ROWS ? -d1 : d1));
        }
        mma_bf16(acc[0], a, b[0], b[1]);
        mma_bf16(acc[1], a, b[2], b[3]);
    }
}

// the end of rows(D, Y) on the warp's fragments acc (rows r = f + g4, + 8 of a row block f; columns c = n0 + 8 nt +
// 2 t4, + 1): acc <- exp(G_r - G_f) acc, acc holding gdn_keys_block_product<true>'s sum over the blocks before f, or
// (where the block's span allows, gdn_span_ok) before and in it; else (elementwise) the diagonal block's terms are
// added per element: + sum_{s in the block} D_rs Y_s exp(G_r - G_s). D [BT][BT + 8] is lower triangular (DIAG: with
// its diagonal) with zeros above; the zero terms' exponents G_r - G_s > 0 are clamped to 0 so that no exp
// overflows into 0 * inf. The s loop is outermost: its 16 products per s are independent (latency overlaps).
template <bool DIAG>
__device__ __forceinline__ void gdn_rows_finish(float acc[2][4], const __nv_bfloat16* D, const __nv_bfloat16* Y, int ldy,
                                                const float* G, int ldg, int f, int n0, bool elementwise, int lane) {
    constexpr int LDZ = GDN_CHUNK + 8;
    const int r0 = f + (lane >> 2), r1 = r0 + 8, c0 = n0 + 2 * (lane & 3);
    float2 ga[2], gb[2];
    #pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        const int col = c0 + 8 * nt;
        const float2 gf = *reinterpret_cast<const float2*>(G + f * ldg + col);
        ga[nt] = *reinterpret_cast<const float2*>(G + r0 * ldg + col);
        gb[nt] = *reinterpret_cast<const float2*>(G + r1 * ldg + col);
        acc[nt][0] *= gdn_decay_exp(ga[nt].x - gf.x);
        acc[nt][1] *= gdn_decay_exp(ga[nt].y - gf.y);
        acc[nt][2] *= gdn_decay_exp(gb[nt].x - gf.x);
        acc[nt][3] *= gdn_decay_exp(gb[nt].y - gf.y);
    }
    for (int s = f; elementwise && s < f + GDN_SUB - (DIAG ? 0 : 1); s++) {
        const float z0 = __bfloat162float(D[r0 * LDZ + s]), z1 = __bfloat162float(D[r1 * LDZ + s]);
        #pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const int col = c0 + 8 * nt;
            const __nv_bfloat162 y = *reinterpret_cast<const __nv_bfloat162*>(Y + s * ldy + col);
            const float2 gs = *reinterpret_cast<const float2*>(G + s * ldg + col);
            const float y0 = __low2float(y), y1 = __high2float(y);
            acc[nt][0] = fmaf(z0 * y0, gdn_decay_exp(fminf(ga[nt].x - gs.x, 0.0f)), acc[nt][0]);
            acc[nt][1] = fmaf(z0 * y1, gdn_decay_exp(fminf(ga[nt].y - gs.y, 0.0f)), acc[nt][1]);
            acc[nt][2] = fmaf(z1 * y0, gdn_decay_exp(fminf(gb[nt].x - gs.x, 0.0f)), acc[nt][2]);
            acc[nt][3] = fmaf(z1 * y1, gdn_decay_exp(fminf(gb[nt].y - gs.y, 0.0f)), acc[nt][3]);
        }
    }
}

// the same for cols(D, X) on the fragments of the column block's rows s = f + g4, + 8: acc <- exp(G_e - G_s) acc
// (+ sum_{r in the block} D_rs X_r exp(G_r - G_s) elementwise), e = f + 15, acc holding gdn_keys_block_product<false>'s
// sum over the blocks after it (and the block itself where its span allows)
template <bool DIAG>
__device__ __forceinline__ void gdn_cols_finish(float acc[2][4], const __nv_bfloat16* D, const __nv_bfloat16* X, int ldx,
                                                const float* G, int ldg, int f, int n0, bool elementwise, int lane) {
    constexpr int LDZ = GDN_CHUNK + 8;
    const int s0 = f + (lane >> 2), s1 = s0 + 8, c0 = n0 + 2 * (lane & 3), e = f + GDN_SUB - 1;
    float2 ga[2], gb[2];
    #pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        const int col = c0 + 8 * nt;
        const float2 ge = *reinterpret_cast<const float2*>(G + e * ldg + col);
        ga[nt] = *reinterpret_cast<const float2*>(G + s0 * ldg + col);
        gb[nt] = *reinterpret_cast<const float2*>(G + s1 * ldg + col);
        acc[nt][0] *= gdn_decay_exp(ge.x - ga[nt].x);
        acc[nt][1] *= gdn_decay_exp(ge.y - ga[nt].y);
        acc[nt][2] *= gdn_decay_exp(ge.x - gb[nt].x);
        acc[nt][3] *= gdn_decay_exp(ge.y - gb[nt].y);
    }
    for (int r = f + (DIAG ? 0 : 1); elementwise && r <= e; r++) {
        const float z0 = __bfloat162float(D[r * LDZ + s0]), z1 = __bfloat162float(D[r * LDZ + s1]);
        #pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            const int col = c0 + 8 * nt;
            const __nv_bfloat162 x = *reinterpret_cast<const __nv_bfloat162*>(X + r * ldx + col);
            const float2 gr = *reinterpret_cast<const float2*>(G + r * ldg + col);
            const float x0 = __low2float(x), x1 = __high2float(x);
            acc[nt][0] = fmaf(z0 * x0, gdn_decay_exp(fminf(gr.x - ga[nt].x, 0.0f)), acc[nt][0]);
            acc[nt][1] = fmaf(z0 * x1, gdn_decay_exp(fminf(gr.y - ga[nt].y, 0.0f)), acc[nt][1]);
            acc[nt][2] = fmaf(z1 * x0, gdn_decay_exp(fminf(gr.x - gb[nt].x, 0.0f)), acc[nt][2]);
            acc[nt][3] = fmaf(z1 * x1, gdn_decay_exp(fminf(gr.y - gb[nt].y, 0.0f)), acc[nt][3]);
        }
    }
}

// ----------------------------------------------------------------------------------------------------------
// backward kernels 4, 5, 6 of spec/pdn.md 3.4 on register tiles, per channel (Tc = bf16: pkda in the bf16 trainer):
// gdn_bwd_chunk_channel_kernel's math and gdn_bwd_keys_channel_kernel's after it, fused, with
// gdn_bwd_chunk_mma_kernel's layout: one CTA of 16 warps per chunk, warp w holding the rows f = 16 (w % 4) .. + 15
// (row block I = w % 4) and the 16 columns from 16 (w / 4) of every 64 (P, dT, Z1; a dk block's dq, dk, dkw, dG;
// dv). The phases run in another order than the shared-memory kernel's, so that Z1 is known before any dk block's
// key gradients are formed and every gradient goes to global memory once:
//   phase 1             dAqk = scale tril(dO Vn^T) (bf16, shared, P); dT1 = dU V^T diag(beta); dv; v.dvb
//   phase 2 (dk blocks) dT2 = sum over the blocks of dW Ke^T, dW = -(dVn h^T), Ke = K (.) exp(G)
//   phase 3             dA = -strictly_lower(Tm^T strictly_lower(dT1 + dT2 diag(beta)) Tm^T); dbeta_c;
//                       Z1 = diag(beta) dA (bf16, shared)
//   phase 4 (dk blocks, the last one first: phase 2 left its h, k and G loaded)
//                       dW again; dQ, dK_b, dKw_a, dbeta_b and ce as gdn_bwd_chunk_channel_kernel's phase 2 forms them;
//                       dk = dK_b + rows(Z1, Kw); dkw = dKw_a + cols(Z1, K);
//                       dG = k rows(Z1, Kw) - kw cols(Z1, K) + q dQ + k dK_b - kw dKw_a (fp32, shared), and dg its
//                       reverse cumulative sum over the chunk per channel: each 16-row block's own sums, then the
//                       chunk-end term ce and the totals of the blocks after it (gdn_bwd_keys_channel_kernel's order)
// The decayed products rows(D, Y) and cols(D, X), D = dAqk or Z1, are gdn_keys_block_product and gdn_rows_finish /
// gdn_cols_finish on the warp's 16 x 16 block (their diagonal blocks on tensor cores where the dk block's span
// allows, else per element). kbg = diag(beta) (K (.) exp(G)) enters as the bf16 tile Ke with beta a column factor of
// dT. Shared memory grows with dv: the launcher runs the two shared-memory kernels where it does not fit.

#define GDN_BWD_CH_PARTS 3   // per-row partial sums per column quarter: v.dvb, (k e).dkbg, dA.A0

// rows(D, Y) into racc and cols(D, X) into cacc for the warp's 16 x 16 block at rows m0 (row block I = m0 / 16),
// columns n0 of a dk block (G its cumulative log decays, ldg apart; Y, X its [BT][ld] tiles): the blocks off the
// diagonal on tensor cores, the diagonal block too where full (its span allows), else per element. D [BT][BT + 8]
// is lower triangular with its diagonal (DIAG: dAqk) or strictly (Z1).
template <bool DIAG>
__device__ __forceinline__ void gdn_rows_cols16(float racc[2][4], float cacc[2][4], const __nv_bfloat16* D,
                                                const __nv_bfloat16* Y, const __nv_bfloat16* X, int ld, const float* G,
                                                int ldg, int m0, int n0, int full, int lane) {
    const int I = m0 / GDN_SUB;
    gdn_keys_block_product<true>(racc, D, Y, ld, G, ldg, G + m0 * ldg, m0, n0, 0, I + full, lane);
    gdn_rows_finish<DIAG>(racc, D, Y, ld, G, ldg, m0, n0, !full, lane);
    gdn_keys_block_product<false>(cacc, D, X, ld, G, ldg, G + (m0 + GDN_SUB - 1) * ldg, m0, n0, I + 1 - full,
                                     GDN_NSUB, lane);
    gdn_cols_finish<DIAG>(cacc, D, X, ld, G, ldg, m0, n0, !full, lane);
}

struct GdnBwdChannelMmaSmem {
    __nv_bfloat16 *dO, *Vn, *dVn;       // [BT][dvq + 8]
    __nv_bfloat16* V;                   // [BT][dvq + 8] (phase 1)
    float* dG;                          // [BT][KB + 8]: a dk block's dG (phase 4), in V's memory
    __nv_bfloat16 *Hs, *dE;             // [KB][dvq + 8]: a dk block's rows of h and dE
    __nv_bfloat16 *Q, *K, *Kw, *Ke;     // [BT][KB + 8]: a dk block's columns (Ke = K (.) exp(G))
    __nv_bfloat16 *Tm, *P, *dW, *Z;     // [BT][BT + 8]
    float* Gb;                          // [BT][KB + 8]: the dk block's G
    float *beta, *ce, *hde, *cpart, *part;   // ce [256]; hde [KB]; cpart [GDN_NSUB][KB]; part [PARTS][4][BT]
    int* ok;                            // [GDN_NSUB] gdn_span_ok of the dk block
    size_t bytes;
    __host__ __device__ GdnBwdChannelMmaSmem(size_t base, int dvq) {
        constexpr int BT = GDN_CHUNK, KB = GDN_BWD_KB;
        SmemCarver cv(base);
        dO = cv.take<__nv_bfloat16>((size_t)BT * (dvq + 8));
        Vn = cv.take<__nv_bfloat16>((size_t)BT * (dvq + 8));
        dVn = cv.take<__nv_bfloat16>((size_t)BT * (dvq + 8));
        const size_t v_bytes = (size_t)BT * (dvq + 8) * sizeof(__nv_bfloat16), g_bytes = BT * (KB + 8) * sizeof(float);
        unsigned char* region = cv.take<unsigned char>(v_bytes > g_bytes ? v_bytes : g_bytes);
        V = (__nv_bfloat16*)region;
        dG = (float*)region;
        Hs = cv.take<__nv_bfloat16>((size_t)KB * (dvq + 8));
        dE = cv.take<__nv_bfloat16>((size_t)KB * (dvq + 8));
        Q = cv.take<__nv_bfloat16>(BT * (KB + 8));
        K = cv.take<__nv_bfloat16>(BT * (KB + 8));
        Kw = cv.take<__nv_bfloat16>(BT * (KB + 8));
        Ke = cv.take<__nv_bfloat16>(BT * (KB + 8));
        Tm = cv.take<__nv_bfloat16>(BT * (BT + 8));
        P = cv.take<__nv_bfloat16>(BT * (BT + 8));
        dW = cv.take<__nv_bfloat16>(BT * (BT + 8));
        Z = cv.take<__nv_bfloat16>(BT * (BT + 8));
        Gb = cv.take<float>(BT * (KB + 8));
        beta = cv.take<float>(BT);
        ce = cv.take<float>(256);
        hde = cv.take<float>(KB);
        cpart = cv.take<float>(GDN_NSUB * KB);
        part = cv.take<float>((size_t)GDN_BWD_CH_PARTS * 4 * BT);
        ok = cv.take<int>(GDN_NSUB);
        bytes = cv.off;
    }
};

__global__ void __launch_bounds__(GDN_BWD_THREADS, 1)
gdn_bwd_chunk_channel_mma_kernel(float* grad_q, float* grad_k, float* grad_v, int ld_d, float* grad_kw, int ld_dkw,
                                 float* grad_beta, float* grad_g, const __nv_bfloat16* dO, int ld_o,
                                 const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int ld_qkv,
                                 const __nv_bfloat16* kw, int ld_kw, const float* beta, const float* Tm_saved,
                                 const float* G_saved, const __nv_bfloat16* h_saved, const __nv_bfloat16* Vn_saved,
                                 const float* A0_saved, const float* dVn_work, const __nv_bfloat16* dE_work, int T,
                                 int H, int NT, int dk, int dv, float scale) {
    constexpr int BT = GDN_CHUNK, KB = GDN_BWD_KB, LB = BT + 8, LK = KB + 8;
    static_assert(GDN_BWD_THREADS == 512 && KB == BT, "16 warps: 4 row blocks x 4 column quarters of 64");
    extern __shared__ __align__(128) unsigned char gdn_smem[];
    const GdnChunkPos p = gdn_chunk_pos(blockIdx.x, T, H, NT);
    const size_t c = p.c, HK = (size_t)H * dk;
    const int dvq = gdn_round64(dv), ldv = dvq + 8, tid = threadIdx.x, nkb = (dk + KB - 1) / KB;
    GdnBwdChannelMmaSmem sm((size_t)gdn_smem, dvq);
    const int warp = tid >> 5, lane = tid & 31, m0 = 16 * (warp & 3), I = warp & 3, cq = warp >> 2, n16 = 16 * cq;

    // dk block d0's h rows, k and G columns (phase 2); with all, also its dE rows, q and kw columns (phase 4)
    const auto load_block = [&](int d0, bool all) {
        tile_load_async(sm.Hs, ldv, KB, dvq, h_saved + c * dk * dv + (size_t)d0 * dv, dv, dk - d0, dv);
        tile_load_async(sm.K, LK, BT, KB, k + p.row0 * ld_qkv + (size_t)p.h * dk + d0, ld_qkv, p.L, dk - d0);
        tile_load_async(sm.Gb, LK, BT, KB, G_saved + c * BT * dk + d0, dk, BT, dk - d0);
        if (all) {
            tile_load_async(sm.dE, ldv, KB, dvq, dE_work + c * dk * dv + (size_t)d0 * dv, dv, dk - d0, dv);
            tile_load_async(sm.Q, LK, BT, KB, q + p.row0 * ld_qkv + (size_t)p.h * dk + d0, ld_qkv, p.L, dk - d0);
            tile_load_async(sm.Kw, LK, BT, KB, kw + p.row0 * ld_kw + (size_t)p.h * dk + d0, ld_kw, p.L, dk - d0);
        }
        cp_async_commit();
    };
    gdn_bwd_mma_load_values(sm, dvq, dO, ld_o, v, ld_qkv, Vn_saved, p, dv);
    load_block(0, nkb == 1);
    // dVn and Tm to bf16 operands; beta (0 on padded rows)
    gdn_bwd_mma_stage(sm, dvq, dVn_work, Tm_saved, p, dv);
    for (int r = tid; r < BT; r += blockDim.x) { sm.beta[r] = r < p.L ? beta[(p.row0 + r) * H + p.h] : 0.0f; }
    cp_async_wait<1>();
    __syncthreads();

    // phase 1: dAqk = scale tril(dO Vn^T) (bf16, shared, P); dT1 = dU V^T diag(beta) (registers); dvb = Tm^T dU ->
    // dv = diag(beta) dvb, v.dvb
    float dT1[2][4] = {}, dT2[2][4] = {};
    {
        float pacc[2][4] = {};
        gdn_mma16<false, true>(pacc, sm.dO, ldv, m0, sm.Vn, ldv, n16, dvq, lane);
        gdn_mma16<false, true>(dT1, sm.dVn, ldv, m0, sm.V, ldv, n16, dvq, lane);
        gdn_frag16_store(sm.P, LB, m0, n16, lane, [&](int nt, int e, int i, int j) {
            return i >= j ? scale * pacc[nt][e] : 0.0f;
        });
        gdn_frag16_each(m0, n16, lane, [&](int nt, int e, int, int j) { dT1[nt][e] *= sm.beta[j]; });
    }
    float rv[2] = {0.0f, 0.0f}, rk[2] = {0.0f, 0.0f};   // v.dvb and (k e).dkbg of the thread's rows
    gdn_bwd_mma_dv(sm, rv, grad_v, ld_d, dvq, p, dv, m0, n16, lane);

    // phase 2, per dk block of KB columns: dT2 += dW Ke^T, dW = -(dVn h^T), Ke = K (.) exp(G)
    for (int kb = 0; kb < nkb; kb++) {
        cp_async_wait<0>();
        __syncthreads();   // the block's h, k, G; the last block's dW and Ke read; (first block) V read
        for (int idx = tid; idx < BT * KB / 2; idx += blockDim.x) {   // Ke = K (.) exp(G), pairs
            const int r = idx / (KB / 2), cc = 2 * (idx - r * (KB / 2));
            const __nv_bfloat162 kv = *reinterpret_cast<const __nv_bfloat162*>(sm.K + r * LK + cc);
            *reinterpret_cast<uint32_t*>(sm.Ke + r * LK + cc) =
                gdn_scale_pair(*reinterpret_cast<const uint32_t*>(&kv), gdn_decay_exp(sm.Gb[r * LK + cc]),
                               gdn_decay_exp(sm.Gb[r * LK + cc + 1]));
        }
        float f2[2][4] = {};
        gdn_mma16<false, true>(f2, sm.dVn, ldv, m0, sm.Hs, ldv, n16, dvq, lane);
        gdn_frag16_store(sm.dW, LB, m0, n16, lane, [&](int nt, int e, int, int) { return -f2[nt][e]; });
        __syncthreads();   // dW, Ke complete
        gdn_mma16<false, true>(dT2, sm.dW, LB, m0, sm.Ke, LK, n16, KB, lane);
        if (kb + 1 < nkb) {
            __syncthreads();   // h, k, G read by every warp
            load_block((kb + 1) * KB, kb + 2 == nkb);
        }
    }
    __syncthreads();   // dW read by every warp

    // phase 3: dT = dT1 + dT2 diag(beta); dA = -strictly_lower(Tm^T strictly_lower(dT) Tm^T); dbeta_c_i =
    // sum_j dA_ij A0_ij; Z1 = diag(beta) dA into Z
    gdn_frag16_store(sm.Z, LB, m0, n16, lane, [&](int nt, int e, int i, int j) {
        return i > j ? dT1[nt][e] + sm.beta[j] * dT2[nt][e] : 0.0f;
    });
    __syncthreads();
    {
        float y[2][4] = {};
        gdn_mma16<true, false>(y, sm.Tm, LB, m0, sm.Z, LB, n16, BT, lane);   // Tm^T strictly_lower(dT)
        gdn_frag16_store(sm.dW, LB, m0, n16, lane, [&](int nt, int e, int, int) { return y[nt][e]; });
    }
    __syncthreads();   // dW complete, Z read
    float rc[2] = {0.0f, 0.0f};   // dA.A0 of the thread's rows
    {
        float r[2][4] = {};
        gdn_mma16<false, true>(r, sm.dW, LB, m0, sm.Tm, LB, n16, BT, lane);   // (...) Tm^T = -dA below the diagonal
        gdn_frag16_store(sm.Z, LB, m0, n16, lane, [&](int nt, int e, int i, int j) {
            if (i <= j) { return 0.0f; }
            rc[e >> 1] = fmaf(-r[nt][e], A0_saved[(c * BT + i) * BT + j], rc[e >> 1]);
            return -sm.beta[i] * r[nt][e];
        });
    }

    // phase 4, per dk block of KB columns d0 .., the last first: F0 = dO h^T, F1 = Vn dE^T, F2 = dVn h^T;
    // dQ = scale (F0 (.) e) + rows(dAqk, Kw); dKw_st = F1 (.) el, dKw_a = dKw_st + cols(dAqk, Q); dW = -F2;
    // dkbg = Tm^T dW; the chunk-end terms ce = exp(G_BT) rowsum(h (.) dE) + colsum(kw (.) dKw_st); the Z1 terms
    const float* Gl = sm.Gb + (BT - 1) * LK;
    for (int kb = nkb - 1; kb >= 0; kb--) {
        const int d0 = kb * KB;
        if (kb < nkb - 1) { load_block(d0, true); }
        cp_async_wait<0>();
        __syncthreads();   // the block's h, dE, q, k, kw, G; (first block) Z1 complete, dW read
        gdn_span_ok(sm.ok, sm.Gb, LK, min(KB, dk - d0));
        {   // rowsum(h (.) dE) per channel: 8 lanes per channel
            const int d = tid >> 3, part = tid & 7;
            float s = 0.0f;
            for (int cc = part; cc < dvq; cc += 8) {
                s = fmaf(__bfloat162float(sm.Hs[d * ldv + cc]), __bfloat162float(sm.dE[d * ldv + cc]), s);
            }
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            s += __shfl_xor_sync(0xffffffffu, s, 4);
            if (part == 0) { sm.hde[d] = s; }
        }
        float f0[2][4] = {}, f1[2][4] = {}, f2[2][4] = {};
        gdn_mma16<false, true>(f0, sm.dO, ldv, m0, sm.Hs, ldv, n16, dvq, lane);
        gdn_mma16<false, true>(f1, sm.Vn, ldv, m0, sm.dE, ldv, n16, dvq, lane);
        gdn_mma16<false, true>(f2, sm.dVn, ldv, m0, sm.Hs, ldv, n16, dvq, lane);
        float colk[2][2] = {};   // kw . dKw_st over the warp's rows, per column (nt, e & 1)
        gdn_frag16_each(m0, n16, lane, [&](int nt, int e, int i, int dl) {
            const float G = sm.Gb[i * LK + dl];
            f0[nt][e] *= scale * gdn_decay_exp(G);
            f1[nt][e] *= gdn_decay_exp(Gl[dl] - G);   // dKw_st
            colk[nt][e & 1] = fmaf(__bfloat162float(sm.Kw[i * LK + dl]), f1[nt][e], colk[nt][e & 1]);
        });
        gdn_frag16_store(sm.dW, LB, m0, n16, lane, [&](int nt, int e, int, int) { return -f2[nt][e]; });
        #pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            #pragma unroll
            for (int x = 0; x < 2; x++) {   // over the 8 row lanes g4 (xor 4, 8, 16): a fixed tree
                float s = colk[nt][x];
                s += __shfl_xor_sync(0xffffffffu, s, 4);
                s += __shfl_xor_sync(0xffffffffu, s, 8);
                s += __shfl_xor_sync(0xffffffffu, s, 16);
                if (lane < 4) { sm.cpart[I * KB + n16 + 8 * nt + 2 * lane + x] = s; }
            }
        }
        __syncthreads();   // dW, ok, hde, cpart complete
        const int full = sm.ok[I];
        {   // dQ += rows(dAqk, Kw); dKw_a = dKw_st + cols(dAqk, Q)
            float r16[2][4] = {}, c16[2][4] = {};
            gdn_rows_cols16<true>(r16, c16, sm.P, sm.Kw, sm.Q, LK, sm.Gb, LK, m0, n16, full, lane);
            #pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                #pragma unroll
                for (int e = 0; e < 4; e++) { f0[nt][e] += r16[nt][e]; f1[nt][e] += c16[nt][e]; }
            }
        }
        if (tid < KB && d0 + tid < dk) {   // the chunk-end terms of the block's channels
            sm.ce[d0 + tid] = gdn_decay_exp(Gl[tid]) * sm.hde[tid] + sm.cpart[tid] + sm.cpart[KB + tid] +
                              sm.cpart[2 * KB + tid] + sm.cpart[3 * KB + tid];
        }
        float dkbg[2][4] = {};
        gdn_mma16<true, false>(dkbg, sm.Tm, LB, m0, sm.dW, LB, n16, BT, lane);
        // the Z1 terms: rz = rows(Z1, Kw), cz = cols(Z1, K) (Z1 strictly lower)
        float rz[2][4] = {}, cz[2][4] = {};
        gdn_rows_cols16<false>(rz, cz, sm.Z, sm.Kw, sm.K, LK, sm.Gb, LK, m0, n16, full, lane);
        gdn_frag16_each(m0, n16, lane, [&](int nt, int e, int i, int dl) {
            if (e & 1) { return; }   // pairs (e, e + 1): dk is a multiple of 8
            float dkb[2], dg[2];
            #pragma unroll
            for (int x = 0; x < 2; x++) {
                const float ex = gdn_decay_exp(sm.Gb[i * LK + dl + x]), kv = __bfloat162float(sm.K[i * LK + dl + x]);
                const float kwv = __bfloat162float(sm.Kw[i * LK + dl + x]);
                rk[e >> 1] = fmaf(kv * ex, dkbg[nt][e + x], rk[e >> 1]);
                dkb[x] = sm.beta[i] * ex * dkbg[nt][e + x];
                const float part = __bfloat162float(sm.Q[i * LK + dl + x]) * f0[nt][e + x] + kv * dkb[x] -
                                   kwv * f1[nt][e + x];
                dg[x] = kv * rz[nt][e + x] - kwv * cz[nt][e + x] + part;
            }
            *reinterpret_cast<float2*>(sm.dG + i * LK + dl) = make_float2(dg[0], dg[1]);
            if (i >= p.L || d0 + dl >= dk) { return; }
            const size_t row = p.row0 + i, col = (size_t)p.h * dk + d0 + dl;
            *reinterpret_cast<float2*>(grad_q + row * ld_d + col) = make_float2(f0[nt][e], f0[nt][e + 1]);
            *reinterpret_cast<float2*>(grad_k + row * ld_d + col) =
                make_float2(dkb[0] + rz[nt][e], dkb[1] + rz[nt][e + 1]);
            *reinterpret_cast<float2*>(grad_kw + row * ld_dkw + col) =
                make_float2(f1[nt][e] + cz[nt][e], f1[nt][e + 1] + cz[nt][e + 1]);
        });
        __syncthreads();   // dG, ce complete; cpart read
        for (int i = tid; i < GDN_NSUB * KB; i += blockDim.x) {   // each 16-row block's reverse sums, its total
            const int d = i % KB, f = GDN_SUB * (i / KB);
            float s = 0.0f;
            for (int r = f + GDN_SUB - 1; r >= f; r--) {
                s += sm.dG[r * LK + d];
                sm.dG[r * LK + d] = s;
            }
            sm.cpart[i] = s;
        }
        __syncthreads();
        for (int i = tid; i < BT * KB; i += blockDim.x) {   // dg: the chunk end and the later blocks' totals added
            const int r = i / KB, d = i - r * KB, J0 = r / GDN_SUB;
            if (r >= p.L || d0 + d >= dk) { continue; }
            float base = sm.ce[d0 + d];
            for (int J = GDN_NSUB - 1; J > J0; J--) { base += sm.cpart[J * KB + d]; }
            grad_g[(p.row0 + r) * HK + (size_t)p.h * dk + d0 + d] = base + sm.dG[r * LK + d];
        }
        __syncthreads();   // the block's tiles, dW, dG and the totals read by every warp
    }

    // dbeta: the row sums in a fixed order: each thread's over its columns, its quad's, then the column quarters
    const float mine[GDN_BWD_CH_PARTS][2] = {{rv[0], rv[1]}, {rk[0], rk[1]}, {rc[0], rc[1]}};
    #pragma unroll
    for (int s = 0; s < GDN_BWD_CH_PARTS; s++) {
        #pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            const float x = gdn_quad_sum(mine[s][hr]);
            if ((lane & 3) == 0) { sm.part[(s * 4 + cq) * BT + m0 + (lane >> 2) + 8 * hr] = x; }
        }
    }
    __syncthreads();
    if (tid < p.L) {
        float b = 0.0f;
        for (int s = 0; s < GDN_BWD_CH_PARTS; s++) {
            for (int j = 0; j < 4; j++) { b += sm.part[(s * 4 + j) * BT + tid]; }
        }
        grad_beta[(p.row0 + tid) * H + p.h] = b;
    }
}

// ----------------------------------------------------------------------------------------------------------
// host launchers. gdn_chunk_forward_impl / gdn_chunk_backward_impl take the operand type Tc explicitly
// (the dev/cuda labs run Tin = bf16 with Tc = float as the CUDA-core version, and time each kernel through
// marks); the public functions use Tc = Tin.

static void gdn_check_shape(int B, int T, int H, int dk, int dv) {
    if (B < 1 || T < 1 || H < 1 || dk < 8 || dv < 8 || dk % 8 != 0 || dv % 8 != 0 || dk > 256 || dv > 256) {
        die("gdn_chunk: unsupported shape B=%d T=%d H=%d dk=%d dv=%d (need dk, dv multiples of 8, <= 256)", B, T, H, dk, dv);
    }
}

// the tile loads read 8 contiguous elements at once: row strides multiples of 8, pointers 16-byte aligned
static void gdn_check_vec8(const void* ptr, int ld, const char* what) {
    if (ld % 8 != 0 || ((uintptr_t)ptr & 15) != 0) {
        die("gdn_chunk: %s must be 16-byte aligned with a row stride that is a multiple of 8 (got ld %d)", what, ld);
    }
}

// the labs time each kernel: marks (optional) are events recorded after kernel i of a launcher
static void gdn_mark(cudaEvent_t* marks, int i, cudaStream_t stream) {
    if (marks) { cudaCheck(cudaEventRecord(marks[i], stream)); }
}

// the shared memory a block may opt in to on this process's device (queried once: the kernels whose shared memory
// grows with dk or dv run where it fits)
static size_t gdn_smem_optin() {
    static int optin = -1;
    if (optin < 0) {
        int dev = 0;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    }
    return (size_t)optin;
}

template <typename K>
static void gdn_set_smem(K kernel, size_t bytes) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

template <int MR>
static void gdn_state_combine_mr(const GdnSplit& sp, int B, int H, int dk, int dv, int backward, cudaStream_t stream) {
    const size_t smem = GdnCombineSmem(0, 32 * MR).bytes;
    gdn_set_smem(gdn_state_combine_kernel<MR>, smem);
    gdn_state_combine_kernel<MR><<<dim3(dv / GDN_COMBINE_BV, B * H), 256, smem, stream>>>(sp.first, sp.last, sp.count,
                                                                                         dk, dv, backward);
}

// the split's combine step on rows of 32 MR >= dk (MR a power of two: four kernels for dk <= 256)
static void gdn_state_combine(const GdnSplit& sp, int B, int H, int dk, int dv, int backward, cudaStream_t stream) {
    if (dk <= 32) {
        gdn_state_combine_mr<1>(sp, B, H, dk, dv, backward, stream);
    } else if (dk <= 64) {
        gdn_state_combine_mr<2>(sp, B, H, dk, dv, backward, stream);
    } else if (dk <= 128) {
        gdn_state_combine_mr<4>(sp, B, H, dk, dv, backward, stream);
    } else {
        gdn_state_combine_mr<8>(sp, B, H, dk, dv, backward, stream);
    }
    cudaCheckLaunch();
}

// one register-tile state pass (backward: 0 forward, 1 backward), split along the sequence where gdn_split says so:
// launch(grid, segments) launches the pass's kernel. Phase 1 covers every segment but the one the pass ends in (the
// last forward, the first backward), then the combine step, then phase 3 every segment (unsplit: only this)
template <typename L>
static void gdn_state_pass(void* workspace, int B, int T, int H, int dk, int dv, GdnDecay decay, int backward,
                           cudaStream_t stream, L launch) {
    const GdnSplit sp = gdn_split(workspace, B, T, H, dk, dv, decay);
    if (sp.count > 1) {
        launch(dim3(ceil_div(dv + dk, GDN_STATE_BV), B * H, sp.count - 1),
               GdnSegments{nullptr, sp.last, sp.len, sp.count, backward});
        cudaCheckLaunch();
        gdn_state_combine(sp, B, H, dk, dv, backward, stream);
    }
    launch(dim3(ceil_div(dv, GDN_STATE_BV), B * H, sp.count),
           GdnSegments{sp.count > 1 ? sp.first : nullptr, nullptr, sp.len, sp.count, 0});
}

template <typename Tin, typename Tc, GdnDecay DECAY>
static void gdn_chunk_forward_launch(Tin* o, int ld_o, void* saved, void* workspace,
                                     const Tin* q, const Tin* k, const Tin* v, int ld_qkv, const Tin* kw, int ld_kw,
                                     const float* beta, const float* g, int g_stride,
                                     int B, int T, int H, int dk, int dv, float scale, cudaStream_t stream,
                                     cudaEvent_t* marks, bool register_tiles, bool specialised) {
    const int NT = ceil_div(T, GDN_CHUNK), dkp = round16(dk), dvp = round16(dv);
    const unsigned nchunks = (unsigned)((size_t)B * H * NT);
    const GdnSavedLayout L = gdn_saved_layout(B, T, H, dk, dv, sizeof(Tc), DECAY);
    char* sv = (char*)saved;
    float* Tm = (float*)(sv + L.Tm);
    float* G = (float*)(sv + L.G);
    Tc* h = (Tc*)(sv + L.h);
    Tc* Vn = (Tc*)(sv + L.Vn);
    Tc* W = (Tc*)(sv + L.W);
    float* A0 = (float*)(sv + L.A0);
    Tc* Aqk = (Tc*)(sv + L.Aqk);
    Tc* Qg = (Tc*)(sv + L.Qg);
    Tc* Kwe = (Tc*)(sv + L.Kwe);
    Tc* U = (Tc*)workspace;

    bool intra_done = false;
    if constexpr (std::is_same<Tc, __nv_bfloat16>::value && DECAY == GDN_DECAY_HEAD) {
        if (register_tiles) {
            const size_t s1 = GdnIntraMmaSmem(0, gdn_round64(dk), gdn_round64(dv), kw != k).bytes;
            const auto intra = [&](auto kernel) {
                gdn_set_smem(kernel, s1);
                kernel<<<nchunks, GDN_THREADS, s1, stream>>>(Tm, G, W, U, k, v, ld_qkv, kw, ld_kw, beta, g, g_stride, T,
                                                             H, NT, dk, dv);
            };
            if (specialised && dk == GDN_FIXED_DK && dv == GDN_FIXED_DK) {
                intra(gdn_fwd_intra_mma_kernel<GDN_FIXED_DK>);
            } else {
                intra(gdn_fwd_intra_mma_kernel<0>);
            }
            intra_done = true;
        }
    }
    if constexpr (std::is_same<Tc, __nv_bfloat16>::value && DECAY == GDN_DECAY_CHANNEL) {
        const size_t s1 = GdnIntraChannelMmaSmem(0, gdn_round64(dk), gdn_round64(dv)).bytes;
        if (register_tiles && s1 <= gdn_smem_optin()) {   // every dk, dv <= 256 on an H100 / H200 (105 KB at 128)
            gdn_set_smem(gdn_fwd_intra_channel_mma_kernel, s1);
            gdn_fwd_intra_channel_mma_kernel<<<nchunks, GDN_THREADS, s1, stream>>>(
                Tm, G, W, U, A0, Aqk, Qg, Kwe, q, k, v, ld_qkv, kw, ld_kw, beta, g, T, H, NT, dk, dv, scale);
            intra_done = true;
        }
    }
    if (!intra_done) {
        const size_t s1 = GdnIntraSmem<Tc>(0, DECAY).bytes;
        gdn_set_smem(gdn_fwd_intra_kernel<Tin, Tc, DECAY>, s1);
        gdn_fwd_intra_kernel<Tin, Tc, DECAY><<<nchunks, gdn_intra_threads(DECAY), s1, stream>>>(
            Tm, G, W, U, A0, Aqk, Qg, Kwe, q, k, v, ld_qkv, kw, ld_kw, beta, g, g_stride, T, H, NT, dk, dv, scale);
    }
    cudaCheckLaunch();
    gdn_mark(marks, 0, stream);
    const dim3 state_grid(ceil_div(dv, GDN_STATE_BV), B * H);
    if constexpr (std::is_same<Tc, __nv_bfloat16>::value) {
        if (register_tiles) {
            const size_t s2 = GdnStateMmaSmem(0, dkp, false).bytes;
            const auto pass = [&](auto kernel) {
                gdn_set_smem(kernel, s2);
                gdn_state_pass(workspace, B, T, H, dk, dv, DECAY, 0, stream, [&](dim3 grid, GdnSegments sg) {
                    kernel<<<grid, GDN_STATE_THREADS, s2, stream>>>(h, Vn, G, W, U, kw, ld_kw, Kwe, sg, T, H, NT, dk, dv);
                });
            };
            if (specialised && dk == GDN_FIXED_DK) {
                pass(gdn_fwd_state_mma_kernel<DECAY, GDN_FIXED_DK>);
            } else {
                pass(gdn_fwd_state_mma_kernel<DECAY, 0>);
            }
        }
    }
    if (!std::is_same<Tc, __nv_bfloat16>::value || !register_tiles) {
        const size_t s2 = GdnStateSmem<Tc>(0, dkp).bytes;
        gdn_set_smem(gdn_fwd_state_kernel<Tin, Tc, DECAY>, s2);
        gdn_fwd_state_kernel<Tin, Tc, DECAY><<<state_grid, GDN_STATE_THREADS, s2, stream>>>(
            h, Vn, G, W, U, kw, ld_kw, Kwe, T, H, NT, dk, dv);
    }
    cudaCheckLaunch();
    gdn_mark(marks, 1, stream);
    if constexpr (std::is_same<Tc, __nv_bfloat16>::value) {
        if (register_tiles) {
            const int dvq = gdn_round64(dv);
            const bool vn_fits_kw = dvq <= (dkp > GDN_CHUNK ? dkp : GDN_CHUNK);   // Kw's tile: [BT][max(dkp, BT) + 8]
            if (specialised && DECAY == GDN_DECAY_HEAD && dvq <= 2 * GDN_ATT_VB && vn_fits_kw) {
                const size_t s3 = GdnAttendMmaSmem(0, dkp, dvq, true, true).bytes;
                const auto output = [&](auto kernel) {
                    gdn_set_smem(kernel, s3);
                    kernel<<<nchunks, GDN_THREADS, s3, stream>>>(o, ld_o, q, ld_qkv, kw, ld_kw, G, h, Vn, T, H, NT, dk,
                                                                 dv, scale);
                };
                if (dk == GDN_FIXED_DK && dv == GDN_FIXED_DK) {
                    output(gdn_fwd_output_head_mma_kernel<GDN_FIXED_DK>);
                } else {
                    output(gdn_fwd_output_head_mma_kernel<0>);
                }
            } else {
                const size_t s3 = GdnAttendMmaSmem(0, dkp, dvq, true).bytes;
                gdn_set_smem(gdn_fwd_output_mma_kernel<DECAY>, s3);
                gdn_fwd_output_mma_kernel<DECAY><<<nchunks, GDN_THREADS, s3, stream>>>(
                    o, ld_o, Aqk, q, ld_qkv, kw, ld_kw, G, h, Vn, Qg, T, H, NT, dk, dv, scale);
            }
        }
    }
    if (!std::is_same<Tc, __nv_bfloat16>::value || !register_tiles) {
        const size_t s3 = GdnOutputSmem<Tc>(0, DECAY).bytes;
        gdn_set_smem(gdn_fwd_output_kernel<Tin, Tc, DECAY>, s3);
        gdn_fwd_output_kernel<Tin, Tc, DECAY><<<dim3(nchunks, ceil_div(dvp, GdnTile<Tc>::VO)), GDN_THREADS, s3, stream>>>(
            o, ld_o, Aqk, q, ld_qkv, kw, ld_kw, G, h, Vn, Qg, T, H, NT, dk, dv, scale);
    }
    cudaCheckLaunch();
    gdn_mark(marks, 2, stream);
}

// register_tiles: with Tc = bf16 the state passes, the output and the dvlocal kernel, and per head the intra and the
// backward chunk kernel run on register tiles (gdn_fwd_state_mma_kernel, gdn_bwd_state_mma_kernel,
// gdn_fwd_output_mma_kernel, gdn_bwd_dvlocal_mma_kernel, gdn_fwd_intra_mma_kernel, gdn_bwd_chunk_mma_kernel: the last
// where its shared memory fits, dv <= 192 on an H100 / H200); false runs the shared-memory kernels that Tc = float
// always runs (the labs' previous version). specialised: the register-tile state passes compiled for dk = GDN_FIXED_DK
// where dk is that, and per head for dv <= 128 the output kernel gdn_fwd_output_head_mma_kernel (false: the state
// passes for a runtime dk and gdn_fwd_output_mma_kernel everywhere, the labs' previous version)
template <typename Tin, typename Tc>
static void gdn_chunk_forward_impl(Tin* o, int ld_o, void* saved, void* workspace,
                                   const Tin* q, const Tin* k, const Tin* v, int ld_qkv, const Tin* kw, int ld_kw,
                                   const float* beta, const float* g, int g_stride, GdnDecay decay,
                                   int B, int T, int H, int dk, int dv, float scale, cudaStream_t stream,
                                   cudaEvent_t* marks = nullptr, bool register_tiles = true,
                                   bool specialised = true) {
    gdn_check_shape(B, T, H, dk, dv);
    gdn_check_vec8(q, ld_qkv, "q");
    gdn_check_vec8(k, ld_qkv, "k");
    gdn_check_vec8(v, ld_qkv, "v");
    gdn_check_vec8(kw, ld_kw, "kw");
    gdn_check_vec8(saved, 8, "saved");
    gdn_check_vec8(workspace, 8, "workspace");
    if (decay == GDN_DECAY_CHANNEL) {
        if (kw == k) { die("gdn_chunk: a per-channel decay needs a write key of its own"); }
        gdn_chunk_forward_launch<Tin, Tc, GDN_DECAY_CHANNEL>(o, ld_o, saved, workspace, q, k, v, ld_qkv, kw, ld_kw,
                                                             beta, g, g_stride, B, T, H, dk, dv, scale, stream, marks,
                                                             register_tiles, specialised);
    } else {
        gdn_chunk_forward_launch<Tin, Tc, GDN_DECAY_HEAD>(o, ld_o, saved, workspace, q, k, v, ld_qkv, kw, ld_kw,
                                                          beta, g, g_stride, B, T, H, dk, dv, scale, stream, marks,
                                                          register_tiles, specialised);
    }
}

template <typename Tin, typename Tc, GdnDecay DECAY>
static void gdn_chunk_backward_launch(float* grad_q, float* grad_k, float* grad_v, int ld_d, float* grad_kw, int ld_dkw,
                                      float* grad_beta, float* grad_g, const Tin* dO, int ld_o, const void* saved,
                                      void* workspace, const Tin* q, const Tin* k, const Tin* v, int ld_qkv,
                                      const Tin* kw, int ld_kw, const float* beta,
                                      int B, int T, int H, int dk, int dv, float scale, cudaStream_t stream,
                                      cudaEvent_t* marks, bool register_tiles, bool specialised) {
    const int NT = ceil_div(T, GDN_CHUNK), dkp = round16(dk);
    const unsigned nchunks = (unsigned)((size_t)B * H * NT);
    const GdnSavedLayout L = gdn_saved_layout(B, T, H, dk, dv, sizeof(Tc), DECAY);
    const char* sv = (const char*)saved;
    const float* Tm = (const float*)(sv + L.Tm);
    const float* G = (const float*)(sv + L.G);
    const Tc* h = (const Tc*)(sv + L.h);
    const Tc* Vn = (const Tc*)(sv + L.Vn);
    const Tc* W = (const Tc*)(sv + L.W);
    const float* A0 = (const float*)(sv + L.A0);
    const Tc* Aqk = (const Tc*)(sv + L.Aqk);
    const Tc* Qg = (const Tc*)(sv + L.Qg);
    const Tc* Kwe = (const Tc*)(sv + L.Kwe);
    const GdnWorkLayout WL = gdn_work_layout(B, T, H, dk, dv, sizeof(Tc), DECAY);
    char* wk = (char*)workspace;
    float* dVn = (float*)(wk + WL.dVn);
    Tc* dE = (Tc*)(wk + WL.dE);
    Tc* Z = (Tc*)(wk + WL.Z);
    float* ce = (float*)(wk + WL.ce);

    if constexpr (std::is_same<Tc, __nv_bfloat16>::value) {
        if (register_tiles) {
            const size_t s2 = GdnAttendMmaSmem(0, dkp, gdn_round64(dv), false).bytes;
            gdn_set_smem(gdn_bwd_dvlocal_mma_kernel<DECAY>, s2);
            gdn_bwd_dvlocal_mma_kernel<DECAY><<<nchunks, GDN_THREADS, s2, stream>>>(dVn, dO, ld_o, q, ld_qkv, kw, ld_kw,
                                                                                   G, Aqk, T, H, NT, dk, dv, scale);
        }
    }
    if (!std::is_same<Tc, __nv_bfloat16>::value || !register_tiles) {
        const size_t s2 = GdnDvlocalSmem<Tc>(0).bytes;
        gdn_set_smem(gdn_bwd_dvlocal_kernel<Tin, Tc, DECAY>, s2);
        gdn_bwd_dvlocal_kernel<Tin, Tc, DECAY><<<nchunks, GDN_THREADS, s2, stream>>>(dVn, dO, ld_o, q, ld_qkv, kw, ld_kw,
                                                                                    G, Aqk, T, H, NT, dk, dv, scale);
    }
    cudaCheckLaunch();
    gdn_mark(marks, 0, stream);
    const dim3 state_grid(ceil_div(dv, GDN_STATE_BV), B * H);
    if constexpr (std::is_same<Tc, __nv_bfloat16>::value) {
        if (register_tiles) {
            const size_t s3 = GdnStateMmaSmem(0, dkp, true).bytes;
            const auto pass = [&](auto kernel) {
                gdn_set_smem(kernel, s3);
                gdn_state_pass(workspace, B, T, H, dk, dv, DECAY, 1, stream, [&](dim3 grid, GdnSegments sg) {
                    kernel<<<grid, GDN_STATE_THREADS, s3, stream>>>(dVn, dE, dO, ld_o, q, ld_qkv, kw, ld_kw, G, W, Qg,
                                                                    Kwe, sg, T, H, NT, dk, dv, scale);
                });
            };
            if (specialised && dk == GDN_FIXED_DK) {
                pass(gdn_bwd_state_mma_kernel<DECAY, GDN_FIXED_DK>);
            } else {
                pass(gdn_bwd_state_mma_kernel<DECAY, 0>);
            }
        }
    }
    if (!std::is_same<Tc, __nv_bfloat16>::value || !register_tiles) {
        const size_t s3 = GdnBwdStateSmem<Tc>(0, dkp).bytes;
        gdn_set_smem(gdn_bwd_state_kernel<Tin, Tc, DECAY>, s3);
        gdn_bwd_state_kernel<Tin, Tc, DECAY><<<state_grid, GDN_STATE_THREADS, s3, stream>>>(
            dVn, dE, dO, ld_o, q, ld_qkv, kw, ld_kw, G, W, Qg, Kwe, T, H, NT, dk, dv, scale);
    }
    cudaCheckLaunch();
    gdn_mark(marks, 1, stream);
    if constexpr (DECAY == GDN_DECAY_CHANNEL) {
        bool chunk_done = false;
        if constexpr (std::is_same<Tc, __nv_bfloat16>::value) {
            const size_t s4 = GdnBwdChannelMmaSmem(0, gdn_round64(dv)).bytes;
            if (register_tiles && s4 <= gdn_smem_optin()) {   // up to dv = 128 on an H100 / H200 (199 KiB; 246 at dv = 192)
                gdn_set_smem(gdn_bwd_chunk_channel_mma_kernel, s4);
                gdn_bwd_chunk_channel_mma_kernel<<<nchunks, GDN_BWD_THREADS, s4, stream>>>(
                    grad_q, grad_k, grad_v, ld_d, grad_kw, ld_dkw, grad_beta, grad_g, dO, ld_o, q, k, v, ld_qkv, kw,
                    ld_kw, beta, Tm, G, h, Vn, A0, dVn, dE, T, H, NT, dk, dv, scale);
                chunk_done = true;
            }
        }
        if (!chunk_done) {
            const size_t s4 = GdnBwdChannelSmem<Tc>(0).bytes;
            gdn_set_smem(gdn_bwd_chunk_channel_kernel<Tin, Tc>, s4);
            gdn_bwd_chunk_channel_kernel<Tin, Tc><<<nchunks, GDN_BWD_THREADS, s4, stream>>>(
                grad_q, grad_k, grad_v, ld_d, grad_kw, ld_dkw, grad_beta, grad_g, dO, ld_o, q, k, v, ld_qkv, kw, ld_kw,
                beta, Tm, G, h, Vn, A0, dVn, dE, Z, ce, T, H, NT, dk, dv, scale);
            cudaCheckLaunch();
            // the key gradients' Z1 terms (the register-tile kernel adds them itself)
            const size_t s5 = GdnBwdKeysSmem<Tc>(0).bytes;
            gdn_set_smem(gdn_bwd_keys_channel_kernel<Tin, Tc>, s5);
            gdn_bwd_keys_channel_kernel<Tin, Tc><<<nchunks, GDN_KEYS_THREADS, s5, stream>>>(
                grad_k, ld_d, grad_kw, ld_dkw, grad_g, k, ld_qkv, kw, ld_kw, G, Z, ce, T, H, NT, dk);
        }
    } else {
        bool chunk_done = false;
        if constexpr (std::is_same<Tc, __nv_bfloat16>::value) {
            const size_t s4 = GdnBwdChunkMmaSmem(0, gdn_round64(dv), kw != k).bytes;
            if (register_tiles && s4 <= gdn_smem_optin()) {   // up to dv = 192 on an H100 / H200 (177 KB at dv = 128)
                gdn_set_smem(gdn_bwd_chunk_mma_kernel, s4);
                gdn_bwd_chunk_mma_kernel<<<nchunks, GDN_BWD_THREADS, s4, stream>>>(
                    grad_q, grad_k, grad_v, ld_d, grad_kw, ld_dkw, grad_beta, grad_g, dO, ld_o, q, k, v, ld_qkv, kw,
                    ld_kw, beta, Tm, G, h, Vn, dVn, dE, T, H, NT, dk, dv, scale);
                chunk_done = true;
            }
        }
        if (!chunk_done) {
            const size_t s4 = GdnBwdChunkSmem<Tc>(0).bytes;
            gdn_set_smem(gdn_bwd_chunk_kernel<Tin, Tc>, s4);
            gdn_bwd_chunk_kernel<Tin, Tc><<<nchunks, GDN_BWD_THREADS, s4, stream>>>(
                grad_q, grad_k, grad_v, ld_d, grad_kw, ld_dkw, grad_beta, grad_g, dO, ld_o, q, k, v, ld_qkv, kw, ld_kw,
                beta, Tm, G, h, Vn, dVn, dE, T, H, NT, dk, dv, scale);
        }
    }
    cudaCheckLaunch();
    gdn_mark(marks, 2, stream);
}

template <typename Tin, typename Tc>
static void gdn_chunk_backward_impl(float* grad_q, float* grad_k, float* grad_v, int ld_d, float* grad_kw, int ld_dkw,
                                    float* grad_beta, float* grad_g, const Tin* dO, int ld_o, const void* saved,
                                    void* workspace, const Tin* q, const Tin* k, const Tin* v, int ld_qkv,
                                    const Tin* kw, int ld_kw, const float* beta, GdnDecay decay,
                                    int B, int T, int H, int dk, int dv, float scale, cudaStream_t stream,
                                    cudaEvent_t* marks = nullptr, bool register_tiles = true,
                                    bool specialised = true) {
    gdn_check_shape(B, T, H, dk, dv);
    gdn_check_vec8(q, ld_qkv, "q");
    gdn_check_vec8(k, ld_qkv, "k");
    gdn_check_vec8(v, ld_qkv, "v");
    gdn_check_vec8(kw, ld_kw, "kw");
    if ((kw != k) != (grad_kw != nullptr)) { die("gdn_chunk: a write key of its own needs its gradient, and only it"); }
    gdn_check_vec8(dO, ld_o, "dO");
    gdn_check_vec8(saved, 8, "saved");
    gdn_check_vec8(workspace, 8, "workspace");
    if (decay == GDN_DECAY_CHANNEL) {
        if (kw == k) { die("gdn_chunk: a per-channel decay needs a write key of its own"); }
        gdn_chunk_backward_launch<Tin, Tc, GDN_DECAY_CHANNEL>(grad_q, grad_k, grad_v, ld_d, grad_kw, ld_dkw, grad_beta,
                                                              grad_g, dO, ld_o, saved, workspace, q, k, v, ld_qkv, kw,
                                                              ld_kw, beta, B, T, H, dk, dv, scale, stream, marks,
                                                              register_tiles, specialised);
    } else {
        gdn_chunk_backward_launch<Tin, Tc, GDN_DECAY_HEAD>(grad_q, grad_k, grad_v, ld_d, grad_kw, ld_dkw, grad_beta,
                                                           grad_g, dO, ld_o, saved, workspace, q, k, v, ld_qkv, kw,
                                                           ld_kw, beta, B, T, H, dk, dv, scale, stream, marks,
                                                           register_tiles, specialised);
    }
}

// o = the delta rule's core (spec 2.1 / 3.3) with S_0 = 0, written along kw (row stride ld_kw; kw = k for gdn and
// kaczmarz). g: the log decay; GDN_DECAY_HEAD: one per (token, head), g_stride apart (see gdn_fwd_intra_kernel);
// GDN_DECAY_CHANNEL: [B*T, H*dk], one per channel (pkda; needs kw != k). Tin = float (fp32 CUDA-core products) or
// __nv_bfloat16 (tensor cores)
template <typename Tin>
static void gdn_chunk_forward(Tin* o, int ld_o, void* saved, void* workspace,
                              const Tin* q, const Tin* k, const Tin* v, int ld_qkv, const Tin* kw, int ld_kw,
                              const float* beta, const float* g, int g_stride, GdnDecay decay,
                              int B, int T, int H, int dk, int dv, float scale, cudaStream_t stream) {
    gdn_chunk_forward_impl<Tin, Tin>(o, ld_o, saved, workspace, q, k, v, ld_qkv, kw, ld_kw, beta, g, g_stride, decay,
                                     B, T, H, dk, dv, scale, stream);
}

// gradients of sum(o * dO) with dS_T = 0 (spec 3.4): dq, dk, dv fp32 with row stride ld_d at the offsets of q, k, v;
// with a write key of its own (kw != k) dk is the read key's and dkw (row stride ld_dkw) the write key's, else dkw
// is NULL and dk the sum of both; dbeta fp32 [B*T*H], dg fp32 [B*T*H] (per channel [B*T*H*dk]); all overwritten.
// dg is the gradient of the log decay g.
template <typename Tin>
static void gdn_chunk_backward(float* dq, float* dk, float* dv, int ld_d, float* dkw, int ld_dkw, float* dbeta,
                               float* dg, const Tin* dO, int ld_o, const void* saved, void* workspace,
                               const Tin* q, const Tin* k, const Tin* v, int ld_qkv, const Tin* kw, int ld_kw,
                               const float* beta, GdnDecay decay, int B, int T, int H, int dk_, int dv_, float scale,
                               cudaStream_t stream) {
    gdn_chunk_backward_impl<Tin, Tin>(dq, dk, dv, ld_d, dkw, ld_dkw, dbeta, dg, dO, ld_o, saved, workspace, q, k, v,
                                      ld_qkv, kw, ld_kw, beta, decay, B, T, H, dk_, dv_, scale, stream);
}

#endif // TRAIN_KLA_KERNELS_GDN_CHUNK_CUH
