/*
kernels/chunk_tiles.cuh: the CTA-level building blocks of the chunked kernels (kernels/gdn_chunk.cuh's, which serve
gdn, kaczmarz and the pdn family, and kernels/gka.cuh's): shared-memory carving, batched register-staged tile
loads from global memory, element and row loops, and the tile products on tensor cores (bf16 operands, fp32
accumulation, wmma 16 x 16 x 16) or, for fp32 operands, on CUDA cores with a fixed summation order. Each block
ends with __syncthreads() unless it says otherwise, so its results are visible to the whole CTA.
*/
#ifndef TRAIN_KLA_KERNELS_CHUNK_TILES_CUH
#define TRAIN_KLA_KERNELS_CHUNK_TILES_CUH

#include <type_traits>
#include <mma.h>
#include "common.cuh"
#include "mma.cuh"

// ----------------------------------------------------------------------------------------------------------
// rounding of tile extents to the 16 x 16 tensor-core blocks

static inline int round16(int x) { return (x + 15) / 16 * 16; }
__device__ __forceinline__ int round16_dev(int x) { return (x + 15) / 16 * 16; }

// ----------------------------------------------------------------------------------------------------------
// the row of a flat tile index: idx / d for a divisor d known only at run time. The division instruction sequence
// (about 20 integer instructions: the state kernels spent half their instructions on it, ncu, H200) becomes one
// multiply-high: with m = ceil(2^32 / d), floor(n / d) = umulhi(n, m) exactly whenever n d <= 2^32 (m d = 2^32 + e,
// 0 <= e < d, so n / d is raised by n e / (d 2^32) < 1 / d, less than what separates it from the next integer).
// Tile indices stay far below that (n < 2^20, d < 2^12).

struct TileDiv {
    uint32_t d, m;   // m = 0 for d = 1 (ceil(2^32) does not fit)
    __device__ __forceinline__ explicit TileDiv(int div) : d((uint32_t)div), m(div > 1 ? 0xffffffffu / (uint32_t)div + 1u : 0u) {}
    __device__ __forceinline__ int operator()(int n) const { return d > 1 ? (int)__umulhi((uint32_t)n, m) : n; }
};

// ----------------------------------------------------------------------------------------------------------
// shared-memory carving: one description per kernel, used by the kernel (base = the dynamic shared memory)
// and by the host (base = 0) to size the launch. On the device each pointer is made from its shared-window
// address (cvta), so the compiler knows it points into shared memory and emits ld.shared / st.shared (32-bit
// addresses) for it rather than generic loads: from an integer base it could not tell (fewer registers; the
// spills of gka's solve, the per-head intra and the backward chunk kernels gone or halved).

struct SmemCarver {
    size_t base, off;
    __host__ __device__ explicit SmemCarver(size_t b) : base(b), off(0) {}
    template <typename T> __host__ __device__ T* take(size_t count) {
#if defined(__CUDA_ARCH__)
        T* p = (T*)__cvta_shared_to_generic(__cvta_generic_to_shared((void*)base) + off);
#else
        T* p = (T*)(base + off);
#endif
        off += (count * sizeof(T) + 127) & ~(size_t)127;
        return p;
    }
};

// ----------------------------------------------------------------------------------------------------------
// batched element-by-element loads: use(idx, load(idx)) for idx = threadIdx.x, + blockDim.x, ... < n, with N of
// this thread's loads in flight before their uses, so that it waits one memory latency per batch, not per element.
// Each thread takes the same elements in the same order whatever N is, so sums over them are unchanged. No barrier.
template <int N, typename Ld, typename Use>
__device__ __forceinline__ void cta_batched(int n, Ld load, Use use) {
    for (int base = threadIdx.x; base < n; base += N * blockDim.x) {
        float v[N];
        #pragma unroll
        for (int u = 0; u < N; u++) {
            const int idx = base + u * blockDim.x;
            v[u] = idx < n ? load(idx) : 0.0f;
        }
        #pragma unroll
        for (int u = 0; u < N; u++) {
            const int idx = base + u * blockDim.x;
            if (idx < n) { use(idx, v[u]); }
        }
    }
}

// s[r][c] = f(r, c) for r < rows, c < cols (f returns fp32; stored rounded to Ts), N evaluations per thread in
// flight (cta_batched). No barrier: tile_fill below is this with its closing barrier.
template <int N, typename Ts, typename F>
__device__ __forceinline__ void tile_set(Ts* s, int lds, int rows, int cols, F f) {
    const TileDiv row_of(cols);
    cta_batched<N>(rows * cols, [&](int idx) {
        const int r = row_of(idx);
        return f(r, idx - r * cols);
    }, [&](int idx, float x) {
        const int r = row_of(idx);
        s[r * lds + idx - r * cols] = from_float<Ts>(x);
    });
}

// ----------------------------------------------------------------------------------------------------------
// CTA-level building blocks. Each ends with __syncthreads(), so its results are visible to the whole CTA.

// s[r][c] = f(r, c) for r < rows, c < cols, TILE_FILL_BATCH evaluations per thread in flight
#define TILE_FILL_BATCH 16
template <typename Ts, typename F>
__device__ __forceinline__ void tile_fill(Ts* s, int lds, int rows, int cols, F f) {
    tile_set<TILE_FILL_BATCH>(s, lds, rows, cols, f);
    __syncthreads();
}

// s[0..7] = scale * x[0..7] in shared memory (16-byte aligned)
__device__ __forceinline__ void store8_scaled(__nv_bfloat16* s, const float* x, float scale) {
    uint4 raw;
    __nv_bfloat162* h2 = reinterpret_cast<__nv_bfloat162*>(&raw);
    #pragma unroll
    for (int e = 0; e < 4; e++) { h2[e] = __floats2bfloat162_rn(scale * x[2 * e], scale * x[2 * e + 1]); }
    *reinterpret_cast<uint4*>(s) = raw;
}
__device__ __forceinline__ void store8_scaled(float* s, const float* x, float scale) {
    reinterpret_cast<float4*>(s)[0] = make_float4(scale * x[0], scale * x[1], scale * x[2], scale * x[3]);
    reinterpret_cast<float4*>(s)[1] = make_float4(scale * x[4], scale * x[5], scale * x[6], scale * x[7]);
}

// 8 elements of type Tg as raw 16-byte words (one group of a register-staged tile load)
template <typename Tg> struct Raw8 { uint4 u[sizeof(Tg) / 2]; };

__device__ __forceinline__ void unpack8(float* x, const Raw8<__nv_bfloat16>& raw) {
    const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&raw.u[0]);
    #pragma unroll
    for (int e = 0; e < 4; e++) { const float2 f = __bfloat1622float2(h2[e]); x[2 * e] = f.x; x[2 * e + 1] = f.y; }
}
__device__ __forceinline__ void unpack8(float* x, const Raw8<float>& raw) {
    const float* f = reinterpret_cast<const float*>(&raw.u[0]);
    #pragma unroll
    for (int e = 0; e < 8; e++) { x[e] = f[e]; }
}

// one tile of a batched load from global memory: s[r][c] = mul * rowscale[r] * g[r * ldg + c] for r < rows,
// c < cols (cols a multiple of 8), with zeros where r >= rv or c >= cv (cv a multiple of 8, so a group of 8 is
// all in or all out; g 16-byte aligned, ldg a multiple of 8). rowscale == nullptr: the factor is mul alone.
template <typename Ts, typename Tg> struct TileLoad {
    typedef Raw8<Tg> Raw;
    Ts* s;
    int lds, rows, cols;
    const Tg* g;
    size_t ldg;
    int rv, cv;
    const float* rowscale;
    float mul;
    TileDiv row_of;   // of the groups per row, cols / 8
    __device__ __forceinline__ int groups() const { return rows * (cols / 8); }
    // the row and first column of group idx
    __device__ __forceinline__ void at(int idx, int& r, int& c) const {
        r = row_of(idx);
        c = (idx - r * (cols / 8)) * 8;
    }
    __device__ __forceinline__ void fetch(int idx, Raw8<Tg>& x) const {
        int r, c;
        at(idx, r, c);
        if (idx < groups() && r < rv && c < cv) {
            const uint4* src = reinterpret_cast<const uint4*>(g + (size_t)r * ldg + c);
            #pragma unroll
            for (int e = 0; e < (int)(sizeof(Tg) / 2); e++) { x.u[e] = src[e]; }
        } else {
            #pragma unroll
            for (int e = 0; e < (int)(sizeof(Tg) / 2); e++) { x.u[e] = make_uint4(0u, 0u, 0u, 0u); }
        }
    }
    __device__ __forceinline__ void store(int idx, const Raw8<Tg>& x) const {
        if (idx >= groups()) { return; }
        int r, c;
        at(idx, r, c);
        float f[8];
        unpack8(f, x);
        store8_scaled(s + r * lds + c, f, rowscale ? mul * rowscale[r] : mul);
    }
};

template <typename Ts, typename Tg>
__device__ __forceinline__ TileLoad<Ts, Tg> make_tile_load(Ts* s, int lds, int rows, int cols, const Tg* g, size_t ldg,
                                                        int rv, int cv, const float* rowscale = nullptr,
                                                        float mul = 1.0f) {
    return TileLoad<Ts, Tg>{ s, lds, rows, cols, g, ldg, rv, cv, rowscale, mul, TileDiv(cols / 8) };
}

// one pass of tile_load: every tile's N groups of this thread are fetched into registers before any is stored
template <int N>
__device__ __forceinline__ void tile_load_pass(int) {}
template <int N, typename L, typename... Rest>
__device__ __forceinline__ void tile_load_pass(int base, const L& t, const Rest&... rest) {
    typename L::Raw x[N];
    #pragma unroll
    for (int u = 0; u < N; u++) { t.fetch(base + u * blockDim.x, x[u]); }
    tile_load_pass<N>(base, rest...);
    #pragma unroll
    for (int u = 0; u < N; u++) { t.store(base + u * blockDim.x, x[u]); }
}

// loads several tiles with all their global loads in flight together (up to N groups of 8 per thread and tile
// per round trip), so that a kernel step waits for one memory latency instead of one per tile
template <int N, typename... L>
__device__ void tile_load(const L&... t) {
    int n = 0;
    ((n = max(n, t.groups())), ...);
    for (int base = threadIdx.x; base < n; base += N * blockDim.x) { tile_load_pass<N>(base, t...); }
    __syncthreads();
}

// tile_load's batched fetches of one tile with the caller's store instead of the tile's (t.s, lds, rowscale and mul
// unused): use(r, c, x[8]) for each group of eight elements, N groups of this thread in flight; no barrier
template <int N, typename Ts, typename Tg, typename Use>
__device__ __forceinline__ void tile_load_each(const TileLoad<Ts, Tg>& t, Use use) {
    for (int base = threadIdx.x; base < t.groups(); base += N * blockDim.x) {
        Raw8<Tg> x[N];
        #pragma unroll
        for (int u = 0; u < N; u++) { t.fetch(base + u * blockDim.x, x[u]); }
        #pragma unroll
        for (int u = 0; u < N; u++) {
            const int idx = base + u * blockDim.x;
            if (idx >= t.groups()) { continue; }
            int r, c;
            t.at(idx, r, c);
            float f[8];
            unpack8(f, x[u]);
            use(r, c, f);
        }
    }
}

// the asynchronous twin of one tile of tile_load (bf16 or fp32 elements, no scaling): s[r][c] = g[r * ldg + c] for
// r < rows, c < cols (cols a multiple of 16 bytes' worth), zeros where r >= rv or c >= cv (cv such a multiple
// too); the copies are this thread's, in flight until its cp_async_wait (kernels/mma.cuh). No barrier.
template <typename T>
__device__ __forceinline__ void tile_load_async(T* s, int lds, int rows, int cols, const T* g, size_t ldg, int rv, int cv) {
    constexpr int E = 16 / sizeof(T);   // elements per copy
    const int gpr = cols / E;
    const TileDiv row_of(gpr);
    for (int idx = threadIdx.x; idx < rows * gpr; idx += blockDim.x) {
        const int r = row_of(idx), c = (idx - r * gpr) * E;
        const bool in = r < rv && c < cv;
        cp_async16(s + r * lds + c, in ? g + (size_t)r * ldg + c : g, in ? 16 : 0);
    }
}

// tile_load_async for a ROWS x COLS tile copied by a CTA of THREADS threads, all three known at compile time (the
// copies per row, COLS / (16 bytes' elements), dividing THREADS): each thread copies the same columns of every
// THREADS / (copies per row)-th row, so its addresses are one base stepped by fixed strides, with no index
// arithmetic per copy (the sequential state kernels issue these every chunk). The same copies as tile_load_async's.
template <int ROWS, int COLS, int THREADS, typename T>
__device__ __forceinline__ void tile_load_async_fixed(T* s, int lds, const T* g, size_t ldg, int rv, int cv) {
    constexpr int E = 16 / sizeof(T), GPR = COLS / E, STEP = THREADS / GPR;
    static_assert(COLS % E == 0 && THREADS % GPR == 0, "tile_load_async_fixed: a row's copies must divide the CTA");
    const int r0 = threadIdx.x / GPR, c = (threadIdx.x % GPR) * E;
    const T* src = g + (size_t)r0 * ldg + c;
    T* dst = s + r0 * lds + c;
    const size_t src_step = (size_t)STEP * ldg;
    #pragma unroll 1
    for (int r = r0; r < ROWS; r += STEP, src += src_step, dst += STEP * lds) {
        const bool in = r < rv && c < cv;
        cp_async16(dst, in ? src : g, in ? 16 : 0);
    }
}

// warp per row: for each row r < rows, f(r, c, acc) for c = lane, lane + 32, ... < cols adds its contributions
// into acc[NS]; the row sums (a fixed shuffle tree: bitwise reproducible) are passed to done(r, acc) on lane 0.
// Consecutive lanes touch consecutive columns: coalesced global writes, conflict-free shared reads.
template <int NS, typename F, typename D>
__device__ __forceinline__ void cta_rows(int rows, int cols, F f, D done) {
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int r = threadIdx.x >> 5; r < rows; r += nw) {
        float acc[NS];
        #pragma unroll
        for (int i = 0; i < NS; i++) { acc[i] = 0.0f; }
        for (int c = lane; c < cols; c += 32) { f(r, c, acc); }
        #pragma unroll
        for (int i = 0; i < NS; i++) {
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) { acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], o); }
        }
        if (lane == 0) { done(r, acc); }
    }
    __syncthreads();
}

// f(r, c) for every element of a rows x cols index range
template <typename F>
__device__ __forceinline__ void cta_for_each(int rows, int cols, F f) {
    const TileDiv row_of(cols);
    for (int idx = threadIdx.x; idx < rows * cols; idx += blockDim.x) {
        const int r = row_of(idx), c = idx - r * cols;
        f(r, c);
    }
    __syncthreads();
}

// f(r, c) for every element of a rows x cols range with cols <= COLS, COLS a power of two dividing blockDim.x:
// thread t takes column t % COLS and the rows t / COLS, t / COLS + blockDim.x / COLS, ... (cta_for_each divides
// each index by a column count unknown at compile time, some 20 instructions per element)
template <int COLS, typename F>
__device__ __forceinline__ void cta_for_each_slab(int rows, int cols, F f) {
    const int c = threadIdx.x % COLS;
    if (c < cols) {
        for (int r = threadIdx.x / COLS; r < rows; r += blockDim.x / COLS) { f(r, c); }
    }
    __syncthreads();
}

// C[M x N] = (acc ? C : 0) + op(A) op(B); C fp32 with row stride ldc; op(A) is M x K: A[m*lda + k], or with
// A_T the stored A is K x M and op(A) = A^T: A[k*lda + m]; op(B) is K x N: B[k*ldb + n], or with B_T the
// stored B is N x K: B[n*ldb + k]. M, N, K are multiples of 16. With sync = false the closing __syncthreads()
// is left out, so that independent products (no output read by another) run back to back.
// fp32 operands: CUDA-core FMAs, each thread owns 4 x 4 blocks of C (fixed summation order over k).
template <bool A_T, bool B_T>
__device__ void cta_mm(float* C, int ldc, const float* A, int lda, const float* Bm, int ldb,
                       int M, int N, int K, bool acc, bool sync = true) {
    const int nb = N / 4;
    for (int t = threadIdx.x; t < (M / 4) * nb; t += blockDim.x) {
        const int m0 = (t / nb) * 4, n0 = (t % nb) * 4;
        float c[4][4];
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            #pragma unroll
            for (int j = 0; j < 4; j++) { c[i][j] = acc ? C[(m0 + i) * ldc + n0 + j] : 0.0f; }
        }
        for (int k = 0; k < K; k++) {
            float a[4], b[4];
            #pragma unroll
            for (int i = 0; i < 4; i++) { a[i] = A_T ? A[k * lda + m0 + i] : A[(m0 + i) * lda + k]; }
            #pragma unroll
            for (int j = 0; j < 4; j++) { b[j] = B_T ? Bm[(n0 + j) * ldb + k] : Bm[k * ldb + n0 + j]; }
            #pragma unroll
            for (int i = 0; i < 4; i++) {
                #pragma unroll
                for (int j = 0; j < 4; j++) { c[i][j] = fmaf(a[i], b[j], c[i][j]); }
            }
        }
        #pragma unroll
        for (int i = 0; i < 4; i++) {
            #pragma unroll
            for (int j = 0; j < 4; j++) { C[(m0 + i) * ldc + n0 + j] = c[i][j]; }
        }
    }
    if (sync) { __syncthreads(); }
}

// bf16 operands: tensor cores, one warp per 16 x 16 tile of C, fp32 accumulation.
// Tile pointers are multiples of 16 elements from 128-byte aligned bases (wmma wants 32-byte alignment).
template <bool A_T, bool B_T>
__device__ void cta_mm(float* C, int ldc, const __nv_bfloat16* A, int lda, const __nv_bfloat16* Bm, int ldb,
                       int M, int N, int K, bool acc, bool sync = true) {
    using namespace nvcuda;
    typedef typename std::conditional<A_T, wmma::col_major, wmma::row_major>::type LayoutA;
    typedef typename std::conditional<B_T, wmma::col_major, wmma::row_major>::type LayoutB;
    const int warp = threadIdx.x / 32, nwarps = blockDim.x / 32, nt = N / 16;
    for (int t = warp; t < (M / 16) * nt; t += nwarps) {
        const int m0 = (t / nt) * 16, n0 = (t % nt) * 16;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
        if (acc) { wmma::load_matrix_sync(c, C + m0 * ldc + n0, ldc, wmma::mem_row_major); }
        else { wmma::fill_fragment(c, 0.0f); }
        for (int k = 0; k < K; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA> a;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB> b;
            wmma::load_matrix_sync(a, A_T ? A + k * lda + m0 : A + m0 * lda + k, lda);
            wmma::load_matrix_sync(b, B_T ? Bm + n0 * ldb + k : Bm + k * ldb + n0, ldb);
            wmma::mma_sync(c, a, b, c);
        }
        wmma::store_matrix_sync(C + m0 * ldc + n0, c, ldc, wmma::mem_row_major);
    }
    if (sync) { __syncthreads(); }
}

// a fragment of fp32 operands cut into hi = tf32(x) (in place) and lo = tf32(x - hi)
template <typename Frag>
__device__ __forceinline__ void tf32_split(Frag& hi, Frag& lo) {
    #pragma unroll
    for (int i = 0; i < hi.num_elements; i++) {
        const float x = hi.x[i], h = nvcuda::wmma::__float_to_tf32(x);
        hi.x[i] = h;
        lo.x[i] = nvcuda::wmma::__float_to_tf32(x - h);
    }
}

// fp32 operands on tensor cores as 3xTF32 (m16n16k8), fp32 accumulation; the same operands and layouts as the fp32
// cta_mm. TF32 keeps 10 of fp32's 23 mantissa bits (relative rounding 2^-11 per operand), so each operand x is cut
// into hi = tf32(x) and lo = tf32(x - hi), and C += lo_a hi_b + hi_a lo_b + hi_a hi_b: about fp32's accuracy, the
// lo_a lo_b term being below fp32's rounding (plain TF32 was measured too coarse for gka's solve: kernels/gka.cuh).
// A warp computes two 16 x 16 tiles of C, one above the other, where that still gives every warp a pair: each
// k-step's B fragment is then loaded and cut once for both (else one tile per warp). Each tile's sums run in the
// same order either way. Tile pointers are multiples of 8 elements from 32-byte aligned bases and the row strides
// multiples of 4 (wmma's alignment).
template <bool A_T, bool B_T>
__device__ void cta_mm_tf32(float* C, int ldc, const float* A, int lda, const float* Bm, int ldb,
                            int M, int N, int K, bool acc, bool sync = true) {
    using namespace nvcuda;
    typedef typename std::conditional<A_T, wmma::col_major, wmma::row_major>::type LayoutA;
    typedef typename std::conditional<B_T, wmma::col_major, wmma::row_major>::type LayoutB;
    const int warp = threadIdx.x / 32, nwarps = blockDim.x / 32, mt = M / 16, nt = N / 16;
    const int rows = mt % 2 == 0 && (mt / 2) * nt >= nwarps ? 2 : 1;   // row tiles per warp
    for (int t = warp; t < (mt / rows) * nt; t += nwarps) {
        const int m0 = (t / nt) * 16 * rows, n0 = (t % nt) * 16;
        wmma::fragment<wmma::accumulator, 16, 16, 8, float> c[2];
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            if (r >= rows) { break; }
            if (acc) { wmma::load_matrix_sync(c[r], C + (m0 + 16 * r) * ldc + n0, ldc, wmma::mem_row_major); }
            else { wmma::fill_fragment(c[r], 0.0f); }
        }
        for (int k = 0; k < K; k += 8) {
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LayoutB> b_hi, b_lo;
            wmma::load_matrix_sync(b_hi, B_T ? Bm + n0 * ldb + k : Bm + k * ldb + n0, ldb);
            tf32_split(b_hi, b_lo);
            #pragma unroll
            for (int r = 0; r < 2; r++) {
                if (r >= rows) { break; }
                const int m = m0 + 16 * r;
                wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LayoutA> a_hi, a_lo;
                wmma::load_matrix_sync(a_hi, A_T ? A + k * lda + m : A + m * lda + k, lda);
                tf32_split(a_hi, a_lo);
                wmma::mma_sync(c[r], a_lo, b_hi, c[r]);
                wmma::mma_sync(c[r], a_hi, b_lo, c[r]);
                wmma::mma_sync(c[r], a_hi, b_hi, c[r]);
            }
        }
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            if (r >= rows) { break; }
            wmma::store_matrix_sync(C + (m0 + 16 * r) * ldc + n0, c[r], ldc, wmma::mem_row_major);
        }
    }
    if (sync) { __syncthreads(); }
}

#endif // TRAIN_KLA_KERNELS_CHUNK_TILES_CUH
