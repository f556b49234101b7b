/*
kernels/shortconv.cuh: the short causal depthwise convolution + SiLU in front of q, k and v
(spec/gdn_kaczmarz.md 1.2 step 2, backward 1.6, decode 4). The CPU versions are shortconv_row,
shortconv_silu_backward_row, shortconv_backward and shortconv_decode_step in train_kla.c.

Layouts (row-major), r = b*T + t:
  proj   [B*T, ld_proj] floatX: the conv reads its first D columns (the pre-conv q | k | v)
  out    [B*T, D] floatX: SiLU(conv), the qkv buffer
  conv_w [D, W] fp32 master weights; tap j of channel ch multiplies the input W-1-j tokens back, so tap W-1
         multiplies the current token. Taps that reach before the sequence start read 0.
  cache  [B, W-1, D] fp32 (decode): the previous W-1 pre-conv inputs of each sequence, oldest first.

The training kernels give each thread V adjacent channels (one 16-byte pack of a row where the sizes and
addresses allow: 8 bf16 forward, 4 backward, whose windows take four registers per tap and channel) and a tile of
SHORTCONV_FWD_T_TILE (forward) or SHORTCONV_T_TILE (backward) consecutive tokens of one sequence: the thread walks
its tile keeping the conv windows in registers, so each input is loaded once (plus a halo of W-1 tokens per tile),
and a warp's channels are adjacent in memory (coalesced). dev/cuda/shortconv.cu keeps the one-channel version (3)
beside these (4).
The pointers of these kernels are __restrict__ (outputs never alias inputs) and the token loop is unrolled,
so the loads of the next tokens can be issued before the current token's store.
The window length W is a template parameter (registers need compile-time indices); conv_size is stored in
the checkpoint header, so every W in 1..SHORTCONV_MAX_W is compiled.

Determinism: dconv_w is reduced without atomics. Each (sequence, token tile) writes its per-channel partial
sums into scratch; a second kernel adds the partials of every tile in a fixed order.
*/
#ifndef TRAIN_KLA_KERNELS_SHORTCONV_CUH
#define TRAIN_KLA_KERNELS_SHORTCONV_CUH

#include <type_traits>
#include "common.cuh"

#define SHORTCONV_T_TILE 64     // tokens walked by one thread of the backward
#define SHORTCONV_FWD_T_TILE 16 // and of the forward (its threads move twice the backward's channels: more of them)
#define SHORTCONV_BLOCK 128     // channels per block
#define SHORTCONV_MAX_W 8       // largest conv_size compiled
#define SHORTCONV_RED_ROWS 16   // row groups of the dconv_w reduction block (32 columns x 16 row groups)

// SiLU(u) = u sigmoid(u) and its derivative SiLU'(u) = sigmoid(u) (1 + u (1 - sigmoid(u)))
__device__ __forceinline__ float shortconv_silu(float u) { return u * sigmoidf_dev(u); }
__device__ __forceinline__ float shortconv_dsilu(float u) {
    const float s = sigmoidf_dev(u);
    return s * (1.0f + u * (1.0f - s));
}

// Calls launch(std::integral_constant<int, W>{}) for the runtime conv size W.
template <typename Launch>
static void shortconv_dispatch_w(int W, Launch launch) {
    switch (W) {
        case 1: launch(std::integral_constant<int, 1>{}); break;
        case 2: launch(std::integral_constant<int, 2>{}); break;
        case 3: launch(std::integral_constant<int, 3>{}); break;
        case 4: launch(std::integral_constant<int, 4>{}); break;
        case 5: launch(std::integral_constant<int, 5>{}); break;
        case 6: launch(std::integral_constant<int, 6>{}); break;
        case 7: launch(std::integral_constant<int, 7>{}); break;
        case 8: launch(std::integral_constant<int, 8>{}); break;
        default: die("short conv: conv size W = %d is not supported (1..%d)", W, SHORTCONV_MAX_W);
    }
}

// ----------------------------------------------------------------------------------------------------------
// forward: out[r, ch] = SiLU(sum_j w[ch, j] * in[t - (W-1) + j, ch])

// grid (ceil(D / (V SHORTCONV_BLOCK)), ceil(T / SHORTCONV_FWD_T_TILE), B), block SHORTCONV_BLOCK
template <int W, int V>
__global__ void shortconv_silu_forward_kernel(floatX* __restrict__ out, const floatX* __restrict__ proj, int ld_proj,
                                              const float* __restrict__ conv_w, int T, int D) {
    const int ch0 = (blockIdx.x * blockDim.x + threadIdx.x) * V;   // the thread's V adjacent channels
    if (ch0 >= D) { return; }
    const int b = blockIdx.z;
    const int t0 = blockIdx.y * SHORTCONV_FWD_T_TILE;
    const int t1 = min(t0 + SHORTCONV_FWD_T_TILE, T);
    const floatX* in = proj + (size_t)b * T * ld_proj + ch0;   // inputs of token s of this sequence: in[s * ld_proj]
    floatX* dst = out + (size_t)b * T * D + ch0;
    float w[V][W];
    #pragma unroll
    for (int c = 0; c < V; c++) {
        #pragma unroll
        for (int j = 0; j < W; j++) { w[c][j] = conv_w[(ch0 + c) * W + j]; }
    }
    // win[c][j] = channel c's input at token t - (W-1) + j; the first W-1 entries are the halo before the tile
    float win[V][W];
    #pragma unroll
    for (int j = 0; j < W - 1; j++) {
        const int s = t0 - (W - 1) + j;
        float x[V] = {};
        if (s >= 0) { xpack_to_floats<V>(x, in + (size_t)s * ld_proj); }
        #pragma unroll
        for (int c = 0; c < V; c++) { win[c][j] = x[c]; }
    }
    #pragma unroll 4
    for (int t = t0; t < t1; t++) {
        float x[V], y[V];
        xpack_to_floats<V>(x, in + (size_t)t * ld_proj);
        #pragma unroll
        for (int c = 0; c < V; c++) {
            win[c][W - 1] = x[c];
            float pre = 0.0f;
            #pragma unroll
            for (int j = 0; j < W; j++) { pre += w[c][j] * win[c][j]; }
            y[c] = shortconv_silu(pre);
            #pragma unroll
            for (int j = 0; j < W - 1; j++) { win[c][j] = win[c][j + 1]; }
        }
        floats_to_xpack<V>(dst + (size_t)t * D, y);
    }
}

// the pack of channels per thread: xpack_width's for D, the row strides and the addresses, at most max_v
static int shortconv_pack(int D, int ld_proj, std::initializer_list<const void*> ptrs, int max_v) {
    int v = xpack_width(D, ptrs);
    while (v > max_v || ld_proj % v != 0) { v /= 2; }
    return v;
}

static void shortconv_silu_forward(floatX* out, const floatX* proj, int ld_proj, const float* conv_w,
                                   int B, int T, int D, int W, cudaStream_t stream) {
    const int V = shortconv_pack(D, ld_proj, {out, proj}, XPACK);
    const dim3 grid(ceil_div(ceil_div(D, V), SHORTCONV_BLOCK), ceil_div(T, SHORTCONV_FWD_T_TILE), B);
    shortconv_dispatch_w(W, [&](auto w) {
        PACK_DISPATCH(V, shortconv_silu_forward_kernel<decltype(w)::value, VW><<<grid, SHORTCONV_BLOCK, 0, stream>>>(
                             out, proj, ld_proj, conv_w, T, D));
    });
}

// ----------------------------------------------------------------------------------------------------------
// backward (spec 1.6). dy [B*T, D] fp32 = dL/d(SiLU output);
//   dpre[t, ch]    = dy[t, ch] * SiLU'(pre[t, ch])                  (pre recomputed from proj)
//   dproj[s, ch]   = sum_j w[ch, j] * dpre[s + (W-1-j), ch]          (terms past the sequence end dropped)
//   dconv_w[ch, j] += sum_{b, t} dpre[t, ch] * in[t - (W-1-j), ch]   (terms before the sequence start dropped)

// dconv_w partials: one row of D*W floats (ch*W + j) per (sequence, token tile)
static size_t shortconv_backward_scratch_bytes(int B, int T, int D, int W) {
    return (size_t)B * ceil_div(T, SHORTCONV_T_TILE) * D * W * sizeof(float);
}

// grid (ceil(D / (V SHORTCONV_BLOCK)), ceil(T / SHORTCONV_T_TILE), B): the thread of V adjacent channels walks the
// tokens t of its tile and the W-1 after it in order, with a window of inputs and one of dpre per channel in
// registers: at token t it recomputes the pre-activation and dpre[t] (0 past the sequence end), adds
// dpre[t] * in[t - (W-1-j)] into its partial of dconv_w[ch, j] (t in its tile only), and writes
// dproj[s] = sum_j w[j] dpre[s + W-1-j] for s = t - (W-1) (s in its tile only). The W-1 tokens after the tile are
// the next tile's too, recomputed there, so dpre never goes through global memory: one pass reads dy and proj and
// writes dproj, each row's V channels as one pack (V <= 4: four windows of W per channel in registers).
template <int W, int V>
__global__ void shortconv_backward_kernel(floatX* __restrict__ dproj, int ld_proj, float* __restrict__ dw_partial,
                                          const float* __restrict__ dy, const floatX* __restrict__ proj,
                                          const float* __restrict__ conv_w, int T, int D) {
    const int ch0 = (blockIdx.x * blockDim.x + threadIdx.x) * V;
    if (ch0 >= D) { return; }
    const int b = blockIdx.z, tile = blockIdx.y;
    const int t0 = tile * SHORTCONV_T_TILE, t1 = min(t0 + SHORTCONV_T_TILE, T);
    const floatX* in = proj + (size_t)b * T * ld_proj + ch0;
    const float* d = dy + (size_t)b * T * D + ch0;
    floatX* out = dproj + (size_t)b * T * ld_proj + ch0;
    float w[V][W], win[V][W], dwin[V][W], acc[V][W];   // dwin[c][W-1-j] = channel c's dpre[t - j]
    #pragma unroll
    for (int j = 0; j < W; j++) {
        const int s = t0 - (W - 1) + j;   // win[c][j] = the input at t - (W-1) + j, for t = t0
        float x[V] = {};
        if (s >= 0) { xpack_to_floats<V>(x, in + (size_t)s * ld_proj); }
        #pragma unroll
        for (int c = 0; c < V; c++) {
            w[c][j] = conv_w[(ch0 + c) * W + j];
            win[c][j] = x[c];
            dwin[c][j] = 0.0f;
            acc[c][j] = 0.0f;
        }
    }
    for (int t = t0; t < t1 + W - 1; t++) {
        float dyv[V] = {}, next[V] = {}, dx[V];
        if (t < T) {
            const Pack<float, V> p = pack_load<V>(d + (size_t)t * D);
            #pragma unroll
            for (int c = 0; c < V; c++) { dyv[c] = p.v[c]; }
        }
        if (t + 1 < T) { xpack_to_floats<V>(next, in + (size_t)(t + 1) * ld_proj); }
        #pragma unroll
        for (int c = 0; c < V; c++) {
            float dpre = 0.0f;
            if (t < T) {
                float pre = 0.0f;
                #pragma unroll
                for (int j = 0; j < W; j++) { pre += w[c][j] * win[c][j]; }
                dpre = dyv[c] * shortconv_dsilu(pre);
            }
            if (t < t1) {
                #pragma unroll
                for (int j = 0; j < W; j++) { acc[c][j] += dpre * win[c][j]; }
            }
            #pragma unroll
            for (int j = 0; j < W - 1; j++) {
                win[c][j] = win[c][j + 1];
                dwin[c][j] = dwin[c][j + 1];
            }
            win[c][W - 1] = next[c];
            dwin[c][W - 1] = dpre;
            float x = 0.0f;
            #pragma unroll
            for (int j = 0; j < W; j++) { x += w[c][j] * dwin[c][W - 1 - j]; }
            dx[c] = x;
        }
        if (t - (W - 1) >= t0) { floats_to_xpack<V>(out + (size_t)(t - (W - 1)) * ld_proj, dx); }
    }
    float* part = dw_partial + ((size_t)b * gridDim.y + tile) * D * W + (size_t)ch0 * W;
    #pragma unroll
    for (int c = 0; c < V; c++) {
        #pragma unroll
        for (int j = 0; j < W; j++) { part[c * W + j] = acc[c][j]; }
    }
}

// one thread per (row, channel): dproj[s, ch] = sum_j w[ch, j] dpre[s + W-1-j, ch] within the sequence, from dpre
// in global memory (kernels/mixers/kalman.cuh, whose conv has a bias and its SiLU apart)
template <int W>
__global__ void shortconv_dproj_kernel(floatX* __restrict__ dproj, int ld_proj, const float* __restrict__ dpre,
                                       const float* __restrict__ conv_w, int BT, int T, int D) {
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * D) { return; }
    const int r = (int)(idx / D), ch = (int)(idx % D), t = r % T;
    float d = 0.0f;
    #pragma unroll
    for (int j = 0; j < W; j++) {
        const int fwd = W - 1 - j;
        if (t + fwd < T) { d += conv_w[ch * W + j] * dpre[(size_t)(r + fwd) * D + ch]; }
    }
    dproj[(size_t)r * ld_proj + ch] = from_float<floatX>(d);
}

// dconv_w[col] += sum over rows of partial[row, col], rows in a fixed order: thread (x, y) sums rows y,
// y + SHORTCONV_RED_ROWS, ... of column col; the row groups are then added in order y = 0, 1, ...
// grid ceil(cols / 32), block (32, SHORTCONV_RED_ROWS)
__global__ void shortconv_dw_reduce_kernel(float* dconv_w, const float* partial, int rows, int cols) {
    __shared__ float group_sum[SHORTCONV_RED_ROWS][32];
    const int col = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.0f;
    if (col < cols) {
        for (int r = threadIdx.y; r < rows; r += SHORTCONV_RED_ROWS) { acc += partial[(size_t)r * cols + col]; }
    }
    group_sum[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float sum = 0.0f;
        for (int y = 0; y < SHORTCONV_RED_ROWS; y++) { sum += group_sum[y][threadIdx.x]; }
        dconv_w[col] += sum;
    }
}

// dproj[:, 0:D] is overwritten (the other columns are left alone); dconv_w is accumulated into.
// scratch: shortconv_backward_scratch_bytes(B, T, D, W).
static void shortconv_silu_backward(floatX* dproj, int ld_proj, float* dconv_w, float* scratch, const float* dy,
                                    const floatX* proj, const float* conv_w, int B, int T, int D, int W,
                                    cudaStream_t stream) {
    // fp32 dy: 4V-byte aligned rows and start
    const int V = shortconv_pack(D, ld_proj, {dproj, proj}, (uintptr_t)dy % 16 == 0 ? 4 : 1);
    const dim3 grid(ceil_div(ceil_div(D, V), SHORTCONV_BLOCK), ceil_div(T, SHORTCONV_T_TILE), B);
    shortconv_dispatch_w(W, [&](auto w) {   // V <= 4 (registers)
        PACK_DISPATCH_UPTO(V, 4, shortconv_backward_kernel<decltype(w)::value, VW><<<grid, SHORTCONV_BLOCK, 0, stream>>>(
            dproj, ld_proj, scratch, dy, proj, conv_w, T, D));
    });
    const int rows = B * ceil_div(T, SHORTCONV_T_TILE);
    const int cols = D * W;
    shortconv_dw_reduce_kernel<<<ceil_div(cols, 32), dim3(32, SHORTCONV_RED_ROWS), 0, stream>>>(
        dconv_w, scratch, rows, cols);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// decode (spec 4): one new token per sequence, proj [B, ld_proj], out [B, D]

// one thread per (sequence, channel); it alone reads and shifts its column of the cache
__global__ void shortconv_silu_decode_kernel(floatX* out, float* cache, const floatX* proj, int ld_proj,
                                             const float* conv_w, int B, int D, int W) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * D) { return; }
    const int b = idx / D, ch = idx % D;
    const float x = to_float(proj[(size_t)b * ld_proj + ch]);
    float* c = cache + (size_t)b * (W - 1) * D + ch;   // c[j * D] = tap j's input
    const float* w = conv_w + ch * W;
    float pre = w[W - 1] * x;
    for (int j = 0; j < W - 1; j++) { pre += w[j] * c[(size_t)j * D]; }
    out[(size_t)b * D + ch] = from_float<floatX>(shortconv_silu(pre));
    if (W > 1) {
        for (int j = 0; j < W - 2; j++) { c[(size_t)j * D] = c[(size_t)(j + 1) * D]; }
        c[(size_t)(W - 2) * D] = x;
    }
}

static void shortconv_silu_decode(floatX* out, float* cache, const floatX* proj, int ld_proj, const float* conv_w,
                                  int B, int D, int W, cudaStream_t stream) {
    const int block = 256;
    shortconv_silu_decode_kernel<<<ceil_div(B * D, block), block, 0, stream>>>(out, cache, proj, ld_proj, conv_w, B, D, W);
    cudaCheckLaunch();
}

// After a prefill of T tokens (proj [B*T, ld_proj]), load the decode cache with the last W-1 pre-conv inputs of
// each sequence (zeros where T < W-1), so that decoding continues the prefill (spec 4).
__global__ void shortconv_fill_cache_kernel(float* cache, const floatX* proj, int ld_proj, int B, int T, int D, int W) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= B * (W - 1) * D) { return; }
    const int ch = idx % D;
    const int j = (idx / D) % (W - 1);
    const int b = idx / (D * (W - 1));
    const int t = T - (W - 1) + j;
    cache[idx] = t >= 0 ? to_float(proj[((size_t)b * T + t) * ld_proj + ch]) : 0.0f;
}

static void shortconv_fill_cache(float* cache, const floatX* proj, int ld_proj, int B, int T, int D, int W,
                                 cudaStream_t stream) {
    if (W < 2) { return; }
    const int block = 256;
    shortconv_fill_cache_kernel<<<ceil_div(B * (W - 1) * D, block), block, 0, stream>>>(cache, proj, ld_proj, B, T, D, W);
    cudaCheckLaunch();
}

#endif // TRAIN_KLA_KERNELS_SHORTCONV_CUH
