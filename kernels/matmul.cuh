/*
kernels/matmul.cuh: the trunk's linear layers through cuBLASLt. The CPU versions are matmul_forward and
matmul_backward in train_kla.c.

  matmul_forward    out[N, OC] = inp[N, C] weight[OC, C]^T (+ bias[OC]); with pre_gelu, out = GELU(that) and
                    pre_gelu = that (the fc layer of the MLP)
  matmul_backward   dinp[N, C] = dout[N, OC] weight[OC, C] (overwritten, or += with accumulate_dinp)
                    dweight[OC, C] += dout^T inp   (fp32)
                    dbias[OC] += column sums of dout (fp32, deterministic two-kernel reduction)
  matmul_backward_gelu  the same with dinp = (dout weight) * GELU'(pre_gelu): the fcproj layer of the MLP, whose
                    input is GELU(pre_gelu), so that dinp is the gradient of the pre-activation

Layouts. cuBLASLt works on column-major matrices; a row-major [R, K] matrix is, byte for byte, a column-major
[K, R] matrix with leading dimension K (its transpose). So, with X^T meaning "the same memory read as
column-major":
  forward   out^T [OC, N] = weight^T^T [OC, C] . inp^T [C, N]:  A = weight (stored [C, OC], ld C) transposed,
            B = inp (stored [C, N], ld C), D = out (stored [OC, N], ld OC); m = OC, n = N, k = C.
            The bias is a vector over the m = OC rows of D, broadcast over the N columns: one bias per output
            channel, as wanted.
  dinp      dinp^T [C, N] = weight^T [C, OC] . dout^T [OC, N]:  A = weight (stored [C, OC], ld C),
            B = dout (stored [OC, N], ld OC), D = dinp (ld C); m = C, n = N, k = OC.
  dweight   dweight^T [C, OC] = inp^T [C, N] . dout [N, OC]:  A = inp (stored [C, N], ld C),
            B = dout (stored [OC, N], ld OC) transposed, D = dweight (stored [C, OC], ld C), beta = 1;
            m = C, n = OC, k = N.

Precision. FP32 build: fp32 A/B/C/D with CUBLAS_COMPUTE_32F, which is true fp32 (TF32 would need
CUBLAS_COMPUTE_32F_FAST_TF32). BF16 build: bf16 A/B, fp32 accumulation (CUBLAS_COMPUTE_32F), bf16 output for
activations and their gradients, fp32 C/D for the weight gradient so that it accumulates in fp32 across
micro-steps. The GELU epilogue works on the fp32 accumulator (plus bias) and stores the pre-activation, rounded
to floatX, in pre_gelu; the backward's DGELU epilogue multiplies the fp32 accumulator of dout weight by GELU' of
pre_gelu before the one rounding to floatX (the separate kernel rounds dout weight first, then the product).

Determinism. cuBLASLt gives bitwise-identical results for the same problem, algorithm and GPU when it runs on
one stream at a time; the algorithm comes from cublasLtMatmulAlgoGetHeuristic, which is a function of the
problem, the pointer alignments and the workspace size, so it is the same on every run. The bias gradient is
our own kernel pair: partial column sums over fixed chunks of rows, then the chunks added in order.

All matmuls share one 32 MiB workspace: calls must be serialised (one stream, or streams that wait on each
other).
*/
#ifndef TRAIN_KLA_KERNELS_MATMUL_CUH
#define TRAIN_KLA_KERNELS_MATMUL_CUH

#include <stdint.h>
#include "common.cuh"
#include "activations.cuh"   // gelu_forward (unfused GELU) and gelu_backward_inplace (the MLP backward)

#define CUBLASLT_WORKSPACE_BYTES ((size_t)32 << 20)
#define DBIAS_MAX_CHUNKS 64      // row chunks of the bias-gradient reduction
#define DBIAS_MIN_CHUNK_ROWS 64  // fewer rows than this per chunk is not worth a chunk
#define DBIAS_ROW_LANES 8        // threads per column inside a block (block = 32 columns x 8 row lanes)

#if defined(ENABLE_FP32)
static const cudaDataType_t CUBLAS_FLOATX = CUDA_R_32F;
#else
static const cudaDataType_t CUBLAS_FLOATX = CUDA_R_16BF;
#endif

static cublasLtHandle_t cublaslt_handle = NULL;
static void* cublaslt_workspace = NULL;
// 1: fc layers apply GELU in the cuBLASLt epilogue (GELU_AUX / GELU_AUX_BIAS), and their backward GELU' (DGELU,
// in the input-gradient matmul of the fcproj layer); 0: a plain matmul writes the pre-activation and gelu_forward
// runs after it, and gelu_backward_inplace after the input-gradient matmul. Also set to 0 (with a notice) the
// first time cuBLASLt has no algorithm for a fused form. The FP32 build is the parity build and defaults to 0:
// gelu_forward and gelu_backward_inplace evaluate tanhf exactly as the CPU versions do, while the epilogues' GELU
// and GELU' are cuBLASLt's own (their accuracy is not documented).
#if defined(ENABLE_FP32)
static int matmul_fuse_gelu = 0;
#else
static int matmul_fuse_gelu = 1;
#endif

static void matmul_setup(void) {
    cublasCheck(cublasLtCreate(&cublaslt_handle));
    cublaslt_workspace = cuda_malloc_or_die(CUBLASLT_WORKSPACE_BYTES, "the cuBLASLt workspace");
}

static void matmul_teardown(void) {
    cudaCheck(cudaFree(cublaslt_workspace));
    cublasCheck(cublasLtDestroy(cublaslt_handle));
    cublaslt_workspace = NULL;
    cublaslt_handle = NULL;
}

// the largest power of two (up to 256) that divides the address: what cuBLASLt may assume about a buffer
static uint32_t pointer_alignment(const void* p) {
    uint32_t align = 256;
    while (align > 1 && (uintptr_t)p % align != 0) { align >>= 1; }
    return align;
}

// D [m, n] (column-major, ld ldd, type d_type) = op(A) op(B) + beta * D, then the epilogue.
// A, B are floatX; A is stored [k, m] (ld lda) when trans_a, else [m, k]; B is stored [n, k] (ld ldb) when
// trans_b, else [k, n]. bias: floatX [m] for the BIAS epilogues; aux: floatX [m, n] (ld m) for the GELU_AUX
// epilogues (written) and the DGELU epilogue (read). Returns 0 (and does nothing) when cuBLASLt has no algorithm for
// this problem.
static int matmul_cublaslt(void* d, cudaDataType_t d_type, int ldd, const floatX* a, int lda, int trans_a,
                           const floatX* b, int ldb, int trans_b, int m, int n, int k, float beta,
                           cublasLtEpilogue_t epilogue, const floatX* bias, const floatX* aux, cudaStream_t stream) {
    if (cublaslt_handle == NULL) { die("matmul: matmul_setup() was not called"); }
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a_layout, b_layout, d_layout;
    cublasLtMatmulPreference_t pref;
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias != NULL) {
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    if (aux != NULL) {
        const int64_t ld_aux = m;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                   sizeof(aux)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux,
                                                   sizeof(ld_aux)));
    }
    cublasCheck(cublasLtMatrixLayoutCreate(&a_layout, CUBLAS_FLOATX, trans_a ? k : m, trans_a ? m : k, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&b_layout, CUBLAS_FLOATX, trans_b ? n : k, trans_b ? k : n, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&d_layout, d_type, m, n, ldd));

    // the heuristic must only offer algorithms that work with the actual alignment of our buffers
    const uint64_t workspace_bytes = CUBLASLT_WORKSPACE_BYTES;
    const uint32_t align_a = pointer_alignment(a), align_b = pointer_alignment(b), align_d = pointer_alignment(d);
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                     sizeof(workspace_bytes)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                     sizeof(align_a)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                     sizeof(align_b)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                     sizeof(align_d)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                     sizeof(align_d)));

    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, desc, a_layout, b_layout, d_layout,
                                                                 d_layout, pref, 1, &heuristic, &found);
    if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED) { cublasCheck(status); }
    if (status == CUBLAS_STATUS_SUCCESS && found > 0) {
        const float alpha = 1.0f;
        // C is D: beta = 1 accumulates into the output, beta = 0 overwrites it
        cublasCheck(cublasLtMatmul(cublaslt_handle, desc, &alpha, a, a_layout, b, b_layout, &beta, d, d_layout, d,
                                   d_layout, &heuristic.algo, cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, stream));
    } else {
        found = 0;
    }
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    cublasCheck(cublasLtMatrixLayoutDestroy(d_layout));
    cublasCheck(cublasLtMatrixLayoutDestroy(b_layout));
    cublasCheck(cublasLtMatrixLayoutDestroy(a_layout));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
    return found > 0;
}

static void matmul_no_algorithm(const char* what, int m, int n, int k) {
    die("matmul: cuBLASLt has no algorithm for %s (m=%d n=%d k=%d, %s)", what, m, n, k, PRECISION_NAME);
}

// ----------------------------------------------------------------------------------------------------------
// forward

// out[N, OC] = inp[N, C] weight[OC, C]^T (+ bias[OC] when bias is not NULL) (OC a multiple of 8 keeps cuBLASLt
// on its fast kernels). pre_gelu not NULL: pre_gelu = that, out = GELU(pre_gelu) (tanh approximation).
static void matmul_forward(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias, int N, int C,
                           int OC, floatX* pre_gelu, cudaStream_t stream) {
    if (N == 0) { return; }
    // the GELU aux matrix needs a leading dimension divisible by 8
    if (pre_gelu != NULL && matmul_fuse_gelu && OC % 8 == 0) {
        const cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
        if (matmul_cublaslt(out, CUBLAS_FLOATX, OC, weight, C, 1, inp, C, 0, OC, N, C, 0.0f, epilogue, bias,
                            pre_gelu, stream)) {
            return;
        }
        fprintf(stderr, "matmul: cuBLASLt has no fused GELU epilogue for this problem (m=%d n=%d k=%d, %s): "
                        "using a separate GELU kernel from now on\n", OC, N, C, PRECISION_NAME);
        matmul_fuse_gelu = 0;
    }
    floatX* dst = pre_gelu ? pre_gelu : out;
    const cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (!matmul_cublaslt(dst, CUBLAS_FLOATX, OC, weight, C, 1, inp, C, 0, OC, N, C, 0.0f, epilogue, bias, NULL,
                         stream)) {
        matmul_no_algorithm("the forward matmul", OC, N, C);
    }
    if (pre_gelu != NULL) { gelu_forward(out, pre_gelu, (size_t)N * OC, stream); }
}

// ----------------------------------------------------------------------------------------------------------
// bias gradient: dbias[o] += sum_r dout[r, o], in two deterministic kernels

// Rows are cut into a number of chunks that depends only on N; the scratch holds one partial row per chunk.
static int dbias_num_chunks(int N) {
    const int chunks = ceil_div(N, DBIAS_MIN_CHUNK_ROWS);
    return chunks < 1 ? 1 : chunks > DBIAS_MAX_CHUNKS ? DBIAS_MAX_CHUNKS : chunks;
}

// scratch needed by matmul_backward when dbias is not NULL
static size_t matmul_backward_scratch_bytes(int N, int OC) {
    return (size_t)dbias_num_chunks(N) * OC * sizeof(float);
}

// grid (ceil(OC / 32), num_chunks), block (32, DBIAS_ROW_LANES). Thread (x, y) sums column blockIdx.x*32 + x
// over the rows y, y + DBIAS_ROW_LANES, ... of chunk blockIdx.y; the row lanes are then added in order.
// A warp reads 32 adjacent columns of one row (coalesced).
__global__ void dbias_partial_kernel(float* partial, const floatX* dout, int N, int OC, int rows_per_chunk) {
    __shared__ float lane_sums[DBIAS_ROW_LANES][32];
    const int col = blockIdx.x * 32 + threadIdx.x;
    const int row_begin = blockIdx.y * rows_per_chunk;
    const int row_end = min(N, row_begin + rows_per_chunk);
    float acc = 0.0f;
    if (col < OC) {
        for (int r = row_begin + threadIdx.y; r < row_end; r += DBIAS_ROW_LANES) {
            acc += to_float(dout[(size_t)r * OC + col]);
        }
    }
    lane_sums[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < OC) {
        float sum = 0.0f;
        for (int y = 0; y < DBIAS_ROW_LANES; y++) { sum += lane_sums[y][threadIdx.x]; }
        partial[(size_t)blockIdx.y * OC + col] = sum;
    }
}

// one thread per column: dbias[o] += the chunks' partial sums, chunk 0 first
__global__ void dbias_finish_kernel(float* dbias, const float* partial, int OC, int num_chunks) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= OC) { return; }
    float sum = 0.0f;
    for (int c = 0; c < num_chunks; c++) { sum += partial[(size_t)c * OC + col]; }
    dbias[col] += sum;
}

// ----------------------------------------------------------------------------------------------------------
// backward

// dinp[N, C] = dout[N, OC] weight[OC, C] (+= when accumulate_dinp; skipped when dinp is NULL), times GELU'(pre_gelu)
// elementwise when pre_gelu [N, C] is not NULL (then not accumulated); dweight[OC, C] += dout^T inp (fp32; skipped
// when NULL); dbias[OC] += column sums of dout (fp32; skipped when NULL, else scratch must hold
// matmul_backward_scratch_bytes(N, OC)). No output may alias an input.
static void matmul_backward_epilogue(floatX* dinp, float* dweight, float* dbias, float* scratch, const floatX* dout,
                                     const floatX* inp, const floatX* weight, int N, int C, int OC,
                                     int accumulate_dinp, const floatX* pre_gelu, cudaStream_t stream) {
    if (N == 0) { return; }
    if (pre_gelu != NULL && (accumulate_dinp || dinp == NULL)) {
        die("matmul_backward_gelu: the GELU gradient needs dinp, overwritten");
    }
    if (dbias != NULL) {
        const int num_chunks = dbias_num_chunks(N);
        const int rows_per_chunk = ceil_div(N, num_chunks);
        dbias_partial_kernel<<<dim3(ceil_div(OC, 32), num_chunks), dim3(32, DBIAS_ROW_LANES), 0, stream>>>(
            scratch, dout, N, OC, rows_per_chunk);
        cudaCheckLaunch();
        dbias_finish_kernel<<<ceil_div(OC, 256), 256, 0, stream>>>(dbias, scratch, OC, num_chunks);
        cudaCheckLaunch();
    }
    if (dweight != NULL) {
        if (!matmul_cublaslt(dweight, CUDA_R_32F, C, inp, C, 0, dout, OC, 1, C, OC, N, 1.0f,
                             CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, stream)) {
            matmul_no_algorithm("the weight gradient", C, OC, N);
        }
    }
    if (dinp == NULL) { return; }
    // the DGELU epilogue's aux matrix (pre_gelu, [C, N] column-major) needs a leading dimension divisible by 8
    if (pre_gelu != NULL && matmul_fuse_gelu && C % 8 == 0) {
        if (matmul_cublaslt(dinp, CUBLAS_FLOATX, C, weight, C, 0, dout, OC, 0, C, N, OC, 0.0f, CUBLASLT_EPILOGUE_DGELU,
                            NULL, pre_gelu, stream)) {
            return;
        }
        fprintf(stderr, "matmul: cuBLASLt has no fused GELU-gradient epilogue for this problem (m=%d n=%d k=%d, %s): "
                        "using separate GELU kernels from now on\n", C, N, OC, PRECISION_NAME);
        matmul_fuse_gelu = 0;
    }
    if (!matmul_cublaslt(dinp, CUBLAS_FLOATX, C, weight, C, 0, dout, OC, 0, C, N, OC, accumulate_dinp ? 1.0f : 0.0f,
                         CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, stream)) {
        matmul_no_algorithm("the input gradient", C, N, OC);
    }
    if (pre_gelu != NULL) { gelu_backward_inplace(dinp, pre_gelu, (size_t)N * C, stream); }
}

static void matmul_backward(floatX* dinp, float* dweight, float* dbias, float* scratch, const floatX* dout,
                            const floatX* inp, const floatX* weight, int N, int C, int OC, int accumulate_dinp,
                            cudaStream_t stream) {
    matmul_backward_epilogue(dinp, dweight, dbias, scratch, dout, inp, weight, N, C, OC, accumulate_dinp, NULL, stream);
}

// the fcproj layer's backward: dinp = (dout weight) * GELU'(pre_gelu), the gradient of the MLP's pre-activation
static void matmul_backward_gelu(floatX* dinp, float* dweight, float* dbias, float* scratch, const floatX* dout,
                                 const floatX* inp, const floatX* weight, const floatX* pre_gelu, int N, int C, int OC,
                                 cudaStream_t stream) {
    matmul_backward_epilogue(dinp, dweight, dbias, scratch, dout, inp, weight, N, C, OC, 0, pre_gelu, stream);
}

#endif // TRAIN_KLA_KERNELS_MATMUL_CUH
