/*
Kernel lab: the Gated DeltaNet core forward (spec/gdn_kaczmarz.md 2.1, 3.1-3.3), kernels/gdn_chunk.cuh.

Build and run (from dev/cuda):
  nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo -I../.. gdn_chunk_fwd.cu -o gdn_chunk_fwd_bin
  ./gdn_chunk_fwd_bin 6

Versions (first argument):
  1  token-by-token recurrence of spec 2.1 on the GPU: one CTA per (b, h, 32 dv columns), the state in registers
  2  the chunkwise kernels with fp32 CUDA-core products also for bf16 inputs (gdn_chunk_forward_impl<Tin, float>)
  3  the previous kernels/gdn_chunk.cuh (copied below, names prefixed gdn_prev_), bf16 inputs on tensor cores
  4  the chunkwise kernels of kernels/gdn_chunk.cuh as the trainer calls them (bf16 inputs: tensor cores):
     version 3 with the intra kernel's g loaded by all rows at once (it was read one row after the other by one
     thread), the state kernel on 256 threads instead of 128 (3 CTAs per SM, all 384 in one wave), and the
     output kernel on dv tiles of 2 SL columns (Q K^T once per chunk at dv <= 128, two CTAs per SM).
     Measured and dropped: prefetching the state kernel's next-chunk tiles into registers (0.548 -> 0.528 ms
     at 128 threads; at 256 threads it spills and is no faster than without), and 512 threads in the intra
     kernel (0.436 vs 0.420 ms). It is now the trainer's kernels with the shared-memory intra, state and output
     kernels (which the fp32 build keeps)
  5  the trainer's kernels (bf16 inputs): version 4 with the intra kernel's products, the state pass and the output
     kernel on register tiles: gdn_fwd_intra_mma_kernel (K Kw^T in fragments, W and U from A fragments cut from
     fp32 Tm with diag(beta gam) / diag(beta) on its columns; the solve unchanged),
     gdn_fwd_state_mma_kernel (the state in mma.sync fragments for the whole sequence, the next chunk's tiles
     copied by cp.async during the current one; H200: state 0.476 -> 0.180 ms, forward 1.167 -> 0.872 ms) and
     gdn_fwd_output_mma_kernel (one CTA of 8 warps per chunk, each warp's rows of the masked Q Kw^T kept as the A
     fragments of the product with Vn). Since 2026-11-28 the solve (gdn_solve_unit_lower, every intra kernel's)
     forms its diagonal blocks with the column in registers and its off-diagonal blocks four columns per thread,
     the same fmaf chains as before (bitwise the same Tm), and G's cumulative sum runs in registers: under ncu the
     intra kernel had spent about half its time in the solve, most of it at the barrier after the 64 threads of
     the diagonal forward substitution (H200: forward 0.486 ms, intra 0.191 ms). It is now version 6 with the
     state pass and the intra kernel's copies compiled for a runtime dk and the general output kernel
     (gdn_chunk_forward_impl's specialised = false)
  6  the trainer's kernels (bf16 inputs): version 5 with the state pass compiled for dk = GDN_FIXED_DK = 128 where
     dk is that, and per head at dv <= 128 gdn_fwd_output_head_mma_kernel. ncu (H200, B=16 T=2048): the state
     pass was bound by instruction issue (59% of issue slots busy, 8.4 cycles between a warp's instructions), two
     thirds of its instructions integer: index arithmetic of the per-chunk tile copies (a runtime division per
     tile) and of the saved h and Vn. With dk a constant and every address a per-thread base plus fixed strides
     (chunk_tiles.cuh tile_load_async_fixed) 94.1M -> 63.7M instructions, state 0.166 -> 0.144 ms. The output
     kernel (40% of issue slots busy, two CTAs per SM) copies Vn into Kw's tile once the masked product has read
     it: 70 KB of shared memory, three CTAs per SM, 0.126 -> 0.118 ms. Forward 0.467 -> 0.438 ms (one run,
     versions side by side); the same errors to every printed digit. Tried and dropped: the output kernel
     streaming its chunks through two buffers (one CTA of 8 warps per SM, the next chunk's tiles in flight during
     this one's products): 0.128 -> 0.170 ms, its products' latency with 8 warps per SM outweighs the copies it hides.
     Since 2026-12-02 (H200, B=16 T=2048, the lab built from the commit before and after each step, in one run):
     the solve's off-diagonal blocks one warp each, chains running ahead between named barriers (6 steps of 16
     terms where the CTA-wide phases took 9; bitwise the same Tm): intra 0.182 -> 0.164 ms; W and U staged in A's
     dead tile and written 16 bytes per thread (ncu: 4-byte fragment stores to 8 rows had 8% of the stall samples,
     L1 71% busy): 0.164 -> 0.149 ms; the per-head exponentials of the masked products and of A as the hardware
     exponential (gdn_decay_exp; expf had been 11-15% of the intra and output kernels' instructions), the masked
     chunk products' and Tm's all-zero 16-column blocks skipped, and the intra and output kernels compiled for
     dk = dv = 128 (fixed-stride copies): intra 0.150 -> 0.134, output 0.118 -> 0.101 ms; the state pass's W S in
     two accumulation chains (odd k blocks apart): 0.144 -> 0.142 ms. Forward 0.4386 -> 0.3700 ms. The errors
     printed are the same to every digit. Tried and dropped: the forward state pass with two buffers of W, U and G
     (the next chunk's copies in flight during the whole chunk): 0.144 -> 0.147 ms; its copies unrolled (the
     address registers of a cp.async are read late): 0.144 -> 0.171 ms, spilling at three CTAs per SM.
     Since 2026-12-03 (H200, the commit before and after, side by side in one run, twice): G's cumulative sum
     per head by a warp scan, with beta and beta gam in the same warp's registers and one barrier fewer
     (gdn_head_G_beta; one thread's 64 dependent adds had 4% of the intra kernel's stall samples): intra
     0.137 -> 0.127 ms, forward 0.3726 -> 0.3628 ms; fp32's o errors move by up to 2x (another summation order of
     G; at most 2.3e-7 -> 4.6e-7, against the 1e-4 tolerance), bf16's in the fourth digit. Tried: programmatic dependent launch of the state and output kernels
     (each may start while the kernel before it drains): 0.3628 -> 0.3599 ms, not kept (3 us for a launch path
     of its own and the emulator's support)

Validation against a float64 CPU reference (the recurrence of spec 2.1) at four shapes (B=2, H=2, dk=16, dv=24,
T=80 and T=37: partial last chunks; B=2, T=256, H=2, dk=dv=128: the production head size; B=1, T=2048, H=2,
dk=dv=128: the bf16 state pass split into 4 segments of 8 chunks), for GDN-like inputs
(l2-normalised q and k, beta = sigmoid) and KLA-like inputs (raw keys with norms spread over two decades,
beta = sigmoid/(||k||^2 + 1e-6) up to ~1e3), in fp32 and bf16. The reference runs on the inputs as the kernel
sees them (rounded to bf16 for bf16), so the errors are those of the kernel's arithmetic alone.
Tolerances on the relative L2 error of o:
  fp32 1e-4: the chunk algorithm sums in another order than the recurrence (errors ~1e-6), and exp(G_i - G_j)
       of a long fp32 cumsum G (|G| up to ~100 in strongly decaying heads) carries ~|G| 6e-8 relative error;
       a wrong formula gives O(1) errors, so 1e-4 separates the two with margin.
  bf16 2e-2: the products' operands (Tm, W, U, Vn, h, P) are rounded to bf16 (2^-9 = 2e-3 relative each), several
       roundings compound to ~4e-3 (spec 5) and the KLA inputs (large Tm entries) a little more.
The run is repeated and must be bitwise identical. Then timing at B=16, T=2048, H=6, dk=dv=128, bf16, with
TFLOP/s from spec 3.7: F_fwd = 6 dk dv + 6 BT dk + 4 BT dv + BT^2/3 per token and head, and the time of each
kernel (versions 2-6; cudaEvents between the launches).
*/
#include <math.h>
#include <string.h>
#include "gdn_chunk_lab.cuh"

// ----------------------------------------------------------------------------------------------------------
// version 1: the recurrence of spec 2.1, one CTA of 32 x 8 threads per (b, h, 32 dv columns). Thread (lane, w)
// holds state rows w, w+8, w+16, ... of column v0 + lane in registers; dot products over dk are reduced through
// shared memory in a fixed order.

template <typename Tin>
__global__ void __launch_bounds__(256)
gdn_recurrent_kernel(Tin* o, int ld_o, const Tin* q, const Tin* k, const Tin* v, int ld_qkv,
                     const float* beta, const float* g, int T, int H, int dk, int dv, float scale) {
    __shared__ float ks[256], qs[256], part_k[8][32], part_q[8][32];
    const int lane = threadIdx.x, w = threadIdx.y, tid = w * 32 + lane;
    const int bh = blockIdx.y, b = bh / H, h = bh % H, col = blockIdx.x * 32 + lane;
    float S[32];
    #pragma unroll
    for (int i = 0; i < 32; i++) { S[i] = 0.0f; }
    for (int t = 0; t < T; t++) {
        const size_t row = (size_t)b * T + t;
        for (int d = tid; d < dk; d += 256) {
            ks[d] = to_float(k[row * ld_qkv + (size_t)h * dk + d]);
            qs[d] = to_float(q[row * ld_qkv + (size_t)h * dk + d]);
        }
        __syncthreads();
        const float alpha = expf(g[row * H + h]), bt = beta[row * H + h];
        float pk = 0.0f;
        #pragma unroll
        for (int i = 0; i < 32; i++) {
            if (w + 8 * i < dk) { pk = fmaf(S[i], ks[w + 8 * i], pk); }
        }
        part_k[w][lane] = pk;
        __syncthreads();
        float sk = 0.0f;
        for (int j = 0; j < 8; j++) { sk += part_k[j][lane]; }
        const float vv = col < dv ? to_float(v[row * ld_qkv + (size_t)h * dv + col]) : 0.0f;
        const float u = bt * (vv - alpha * sk);   // u = beta (v - Sbar^T k), Sbar = alpha S
        float po = 0.0f;
        #pragma unroll
        for (int i = 0; i < 32; i++) {
            if (w + 8 * i < dk) {
                S[i] = fmaf(alpha, S[i], ks[w + 8 * i] * u);
                po = fmaf(S[i], qs[w + 8 * i], po);
            }
        }
        part_q[w][lane] = po;
        __syncthreads();
        if (w == 0 && col < dv) {
            float so = 0.0f;
            for (int j = 0; j < 8; j++) { so += part_q[j][lane]; }
            o[row * ld_o + (size_t)h * dv + col] = from_float<Tin>(scale * so);
        }
    }
}

// ----------------------------------------------------------------------------------------------------------
// dispatch

template <typename Tin>
static void run_forward(int version, Tin* o, int ld_o, void* saved, void* work, const Tin* qkv, int ld,
                        const float* beta, const float* g, Shape s, float scale, cudaEvent_t* marks = nullptr) {
    const Tin* q = qkv;
    const Tin* k = qkv + s.H * s.dk;
    const Tin* v = qkv + 2 * s.H * s.dk;
    if (version == 1) {
        gdn_recurrent_kernel<Tin><<<dim3(ceil_div(s.dv, 32), s.B * s.H), dim3(32, 8)>>>(
            o, ld_o, q, k, v, ld, beta, g, s.T, s.H, s.dk, s.dv, scale);
        cudaCheckLaunch();
    } else if (version == 2) {
        gdn_chunk_forward_impl<Tin, float>(o, ld_o, saved, work, q, k, v, ld, k, ld, beta, g, 1, GDN_DECAY_HEAD, s.B, s.T, s.H, s.dk, s.dv, scale, 0,
                                           marks);
    } else if (version == 3) {
        gdn_prev_chunk_forward_impl<Tin, Tin>(o, ld_o, saved, work, q, k, v, ld, beta, g, s.B, s.T, s.H, s.dk, s.dv,
                                              scale, 0, marks);
    } else if (version == 4) {
        gdn_chunk_forward_impl<Tin, Tin>(o, ld_o, saved, work, q, k, v, ld, k, ld, beta, g, 1, GDN_DECAY_HEAD, s.B, s.T, s.H, s.dk, s.dv, scale, 0,
                                         marks, false);
    } else if (version == 5) {   // the state pass for a runtime dk
        gdn_chunk_forward_impl<Tin, Tin>(o, ld_o, saved, work, q, k, v, ld, k, ld, beta, g, 1, GDN_DECAY_HEAD, s.B, s.T, s.H, s.dk, s.dv, scale, 0,
                                         marks, true, false);
    } else if (marks) {   // the same launches as gdn_chunk_forward, with the per-kernel marks
        gdn_chunk_forward_impl<Tin, Tin>(o, ld_o, saved, work, q, k, v, ld, k, ld, beta, g, 1, GDN_DECAY_HEAD, s.B, s.T, s.H, s.dk, s.dv, scale, 0,
                                         marks);
    } else {
        gdn_chunk_forward<Tin>(o, ld_o, saved, work, q, k, v, ld, k, ld, beta, g, 1, GDN_DECAY_HEAD, s.B, s.T, s.H, s.dk, s.dv, scale, 0);
    }
}

template <typename Tin>
static int validate(int version, Shape s, int kla) {
    const int bf16 = sizeof(Tin) == 2;
    const Inputs in = make_inputs(s, kla, bf16);
    const size_t rows = (size_t)s.B * s.T, no = rows * s.H * s.dv;
    const float scale = 1.0f / sqrtf((float)s.dk);
    double* o_ref = (double*)malloc_or_die(no * sizeof(double));
    gdn_forward_reference(o_ref, in, s);

    Tin* d_qkv = to_device<Tin>(in.qkv, rows * in.ld);
    float* d_beta = to_device_f(in.beta, rows * s.H);
    float* d_g = to_device_f(in.g, rows * s.H);
    Tin* d_o = (Tin*)cuda_malloc_or_die(no * sizeof(Tin), "o");
    void* saved = cuda_malloc_or_die(gdn_chunk_saved_bytes(s.B, s.T, s.H, s.dk, s.dv, GDN_DECAY_HEAD), "saved");
    void* work = cuda_malloc_or_die(gdn_chunk_workspace_bytes(s.B, s.T, s.H, s.dk, s.dv, GDN_DECAY_HEAD), "workspace");
    cudaCheck(cudaMemset(d_o, 0xff, no * sizeof(Tin)));   // NaN: every element must be written
    run_forward<Tin>(version, d_o, s.H * s.dv, saved, work, d_qkv, in.ld, d_beta, d_g, s, scale);
    cudaCheck(cudaDeviceSynchronize());
    float* o1 = (float*)malloc_or_die(no * sizeof(float));
    float* o2 = (float*)malloc_or_die(no * sizeof(float));
    to_host_f(o1, d_o, no);
    run_forward<Tin>(version, d_o, s.H * s.dv, saved, work, d_qkv, in.ld, d_beta, d_g, s, scale);
    cudaCheck(cudaDeviceSynchronize());
    to_host_f(o2, d_o, no);

    printf("  %s B=%d T=%d H=%d dk=%d dv=%d %s inputs:\n", bf16 ? "bf16" : "fp32", s.B, s.T, s.H, s.dk, s.dv,
           kla ? "KLA-like" : "GDN-like");
    int ok = compare("o", o1, o_ref, no, bf16 ? 2e-2 : 1e-4);
    const int same = memcmp(o1, o2, no * sizeof(float)) == 0;
    printf("    repeat run bitwise identical: %s\n", same ? "yes" : "NO (FAIL)");
    ok = ok && same;

    free(o1); free(o2); free(o_ref);
    cudaCheck(cudaFree(d_qkv)); cudaCheck(cudaFree(d_beta)); cudaCheck(cudaFree(d_g)); cudaCheck(cudaFree(d_o));
    cudaCheck(cudaFree(saved)); cudaCheck(cudaFree(work));
    free_inputs(in);
    return ok;
}

int main(int argc, char** argv) {
    const int version = argc > 1 ? atoi(argv[1]) : 6;
    if (version < 1 || version > 6) { die("version must be 1 .. 6 (got %s)", argv[1]); }
    printf("gdn_chunk_fwd version %d\n", version);

    int ok = 1;
    const Shape shapes[4] = { {2, 80, 2, 16, 24}, {2, 37, 2, 16, 24}, {2, 256, 2, 128, 128}, {1, 2048, 2, 128, 128} };
    for (int si = 0; si < 4; si++) {
        for (int kla = 0; kla < 2; kla++) {
            ok &= validate<float>(version, shapes[si], kla);
            ok &= validate<__nv_bfloat16>(version, shapes[si], kla);
        }
    }

    // timing at the production shape, bf16
    const Shape s = {16, 2048, 6, 128, 128};
    const Inputs in = make_inputs(s, 0, 1);
    const size_t rows = (size_t)s.B * s.T, no = rows * s.H * s.dv;
    const float scale = 1.0f / sqrtf((float)s.dk);
    __nv_bfloat16* d_qkv = to_device<__nv_bfloat16>(in.qkv, rows * in.ld);
    float* d_beta = to_device_f(in.beta, rows * s.H);
    float* d_g = to_device_f(in.g, rows * s.H);
    __nv_bfloat16* d_o = (__nv_bfloat16*)cuda_malloc_or_die(no * sizeof(__nv_bfloat16), "o");
    void* saved = cuda_malloc_or_die(gdn_chunk_saved_bytes(s.B, s.T, s.H, s.dk, s.dv, GDN_DECAY_HEAD), "saved");
    void* work = cuda_malloc_or_die(gdn_chunk_workspace_bytes(s.B, s.T, s.H, s.dk, s.dv, GDN_DECAY_HEAD), "workspace");
    const int warmup = 3, iters = version == 1 ? 5 : 20;
    for (int i = 0; i < warmup; i++) {
        run_forward<__nv_bfloat16>(version, d_o, s.H * s.dv, saved, work, d_qkv, in.ld, d_beta, d_g, s, scale);
    }
    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0));
    cudaCheck(cudaEventCreate(&e1));
    cudaCheck(cudaEventRecord(e0));
    for (int i = 0; i < iters; i++) {
        run_forward<__nv_bfloat16>(version, d_o, s.H * s.dv, saved, work, d_qkv, in.ld, d_beta, d_g, s, scale);
    }
    cudaCheck(cudaEventRecord(e1));
    cudaCheck(cudaEventSynchronize(e1));
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, e0, e1));
    ms /= iters;
    const double BT = GDN_CHUNK, dk = s.dk, dv = s.dv;
    const double tokens = (double)s.B * ceil_div(s.T, GDN_CHUNK) * GDN_CHUNK * s.H;
    const double flops = tokens * (6 * dk * dv + 6 * BT * dk + 4 * BT * dv + BT * BT / 3);
    printf("timing B=%d T=%d H=%d dk=%d dv=%d bf16: forward %.4f ms, %.1f TFLOP/s (spec 3.7 count, %.2f GFLOP)\n",
           s.B, s.T, s.H, s.dk, s.dv, ms, flops / (ms * 1e-3) / 1e12, flops / 1e9);
    if (version > 1) {
        const char* const names[3] = { "intra", "state", "output" };
        print_kernel_times("forward", names, iters, [&](cudaEvent_t* marks) {
            run_forward<__nv_bfloat16>(version, d_o, s.H * s.dv, saved, work, d_qkv, in.ld, d_beta, d_g, s, scale, marks);
        });
    }
    cudaCheck(cudaFree(d_qkv)); cudaCheck(cudaFree(d_beta)); cudaCheck(cudaFree(d_g)); cudaCheck(cudaFree(d_o));
    cudaCheck(cudaFree(saved)); cudaCheck(cudaFree(work));
    free_inputs(in);

    printf("%s\n", ok ? "ALL PASS" : "SOME FAILED");
    return ok ? 0 : 1;
}
