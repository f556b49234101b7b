/*
kernels/encoder.cuh: token (+ position) embedding. The CPU versions are encoder_forward and encoder_backward
in train_kla.c.

  forward   out[b, t, :] = wte[inp[b, t], :] (+ wpe[t, :])   (fp32 master weights in, floatX out)
  backward  dwte[v, :] += sum of dout[b, t, :] over the positions (b, t) holding token v
            dwpe[t, :] += sum over b of dout[b, t, :]          (fp32)

The backward is deterministic without atomics. The host groups the B*T positions by token id (a counting
sort of inp_host, positions in increasing order within a token) and cuts every group into work items of at
most ENCODER_CHUNK positions. The item list goes to the device scratch with one copy. Then:
  1. one block per (item, channel slice): each thread sums its channel over the item's positions in order.
     A token with a single item adds the sum straight into its dwte row; the items of a larger token write
     partial sums into the scratch instead.
  2. one block per (split token, channel slice): adds that token's partial sums, first item first, into dwte.
Every dwte row has exactly one writer, and every sum has a fixed order. Capping items at ENCODER_CHUNK
positions bounds the longest block (frequent tokens like "," or EOT hold thousands of positions in a batch).
dwpe: one thread per (t, channel), summing over b in order.
*/
#ifndef TRAIN_KLA_KERNELS_ENCODER_CUH
#define TRAIN_KLA_KERNELS_ENCODER_CUH

#include "common.cuh"

#define ENCODER_BLOCK 256
#define ENCODER_CHUNK 64            // positions of one work item of the backward
#define ENCODER_BWD_BLOCK 128       // channels per block of the backward kernels

// ----------------------------------------------------------------------------------------------------------
// forward

// one thread per output element (bt, c)
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const float* wte, const float* wpe, int T, int C,
                                       size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) { return; }
    const size_t bt = i / C, c = i % C;
    float v = wte[(size_t)inp[bt] * C + c];
    if (wpe != NULL) { v += wpe[(bt % T) * C + c]; }
    out[i] = from_float<floatX>(v);
}

// out [B, T, C] floatX; inp [B, T] token ids on the device; wte [V(p), C], wpe [maxT, C] fp32 (wpe may be NULL)
static void encoder_forward(floatX* out, const int* inp, const float* wte, const float* wpe, int B, int T, int C,
                            cudaStream_t stream) {
    const size_t n = (size_t)B * T * C;
    if (n == 0) { return; }
    encoder_forward_kernel<<<(unsigned int)ceil_div_z(n, ENCODER_BLOCK), ENCODER_BLOCK, 0, stream>>>(out, inp, wte, wpe,
                                                                                                    T, C, n);
    cudaCheckLaunch();
}

// ----------------------------------------------------------------------------------------------------------
// backward: the work list (host) and its layout in the scratch

// Bounds for B*T = BT positions. Items: each holds at least one position, so at most BT. Split tokens (more
// than ENCODER_CHUNK positions): at most BT / (ENCODER_CHUNK + 1). Partial sums: a split token with c positions
// has ceil(c / ENCODER_CHUNK) <= 2c / ENCODER_CHUNK items, so at most 2 BT / ENCODER_CHUNK in all.
static size_t encoder_max_items(size_t BT) { return BT; }
static size_t encoder_max_splits(size_t BT) { return BT / (ENCODER_CHUNK + 1); }
static size_t encoder_max_partials(size_t BT) { return 2 * BT / ENCODER_CHUNK; }

// The scratch: [items int4 | splits int4 | sorted positions int] (copied from the host, packed by the actual
// counts), then, at a fixed offset, the partial sums fp32 [max_partials, C].
static size_t encoder_partials_offset(size_t BT) {
    const size_t int_bytes = (encoder_max_items(BT) + encoder_max_splits(BT)) * sizeof(int4) + BT * sizeof(int);
    return ceil_div_z(int_bytes, 256) * 256;
}

// scratch needed by encoder_backward
static size_t encoder_backward_scratch_bytes(int B, int T, int C) {
    const size_t BT = (size_t)B * T;
    return encoder_partials_offset(BT) + encoder_max_partials(BT) * C * sizeof(float);
}

// host state of the backward: the pinned staging buffer of the work list (reused once its last copy is done)
// and the counting-sort arrays
static int* encoder_pinned = NULL;
static size_t encoder_pinned_bytes = 0;
static cudaEvent_t encoder_copy_done = NULL;
static int* encoder_token_start = NULL;   // [max token + 1] first index of each token in the sorted positions
static int* encoder_token_next = NULL;    // [max token + 1] fill cursor of the counting sort
static int encoder_token_capacity = 0;

static void encoder_teardown(void) {
    if (encoder_copy_done != NULL) {
        cudaCheck(cudaEventSynchronize(encoder_copy_done));
        cudaCheck(cudaEventDestroy(encoder_copy_done));
    }
    if (encoder_pinned != NULL) { cudaCheck(cudaFreeHost(encoder_pinned)); }
    free(encoder_token_start);
    free(encoder_token_next);
    encoder_copy_done = NULL;
    encoder_pinned = NULL;
    encoder_pinned_bytes = 0;
    encoder_token_start = encoder_token_next = NULL;
    encoder_token_capacity = 0;
}

// item (x = token, y = first index into the sorted positions, z = number of positions, w = partial slot or -1)
// split token (x = token, y = first partial slot, z = number of partial slots)

// grid (num_items, ceil(C / ENCODER_BWD_BLOCK)), block ENCODER_BWD_BLOCK
__global__ void encoder_backward_items_kernel(float* dwte, float* partials, const int4* items, const int* sorted_pos,
                                              const floatX* dout, int C) {
    const int4 item = items[blockIdx.x];
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    float sum = 0.0f;
    for (int j = 0; j < item.z; j++) { sum += to_float(dout[(size_t)sorted_pos[item.y + j] * C + c]); }
    if (item.w < 0) {
        dwte[(size_t)item.x * C + c] += sum;
    } else {
        partials[(size_t)item.w * C + c] = sum;
    }
}

// grid (num_splits, ceil(C / ENCODER_BWD_BLOCK)), block ENCODER_BWD_BLOCK
__global__ void encoder_backward_splits_kernel(float* dwte, const float* partials, const int4* splits, int C) {
    const int4 split = splits[blockIdx.x];
    const int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) { return; }
    float sum = 0.0f;
    for (int j = 0; j < split.z; j++) { sum += partials[(size_t)(split.y + j) * C + c]; }
    dwte[(size_t)split.x * C + c] += sum;
}

// one thread per (t, c): dwpe[t, c] += sum over b of dout[b, t, c], b = 0 first
__global__ void encoder_backward_wpe_kernel(float* dwpe, const floatX* dout, int B, int T, int C) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) { return; }
    float sum = 0.0f;
    for (int b = 0; b < B; b++) { sum += to_float(dout[(size_t)b * T * C + i]); }
    dwpe[i] += sum;
}

// dwte [V(p), C], dwpe [maxT, C] fp32 += (dwpe may be NULL); dout [B, T, C] floatX; inp_host [B, T]: the same
// token ids as the forward's, on the host; scratch: encoder_backward_scratch_bytes(B, T, C) on the device.
// The host part (sorting B*T ids) runs while the GPU works on earlier kernels of the stream.
static void encoder_backward(float* dwte, float* dwpe, void* scratch, const floatX* dout, const int* inp_host,
                             int B, int T, int C, cudaStream_t stream) {
    const size_t BT = (size_t)B * T;
    if (BT == 0) { return; }
    if (dwpe != NULL) {
        const unsigned int blocks = (unsigned int)ceil_div_z((size_t)T * C, ENCODER_BLOCK);
        encoder_backward_wpe_kernel<<<blocks, ENCODER_BLOCK, 0, stream>>>(dwpe, dout, B, T, C);
        cudaCheckLaunch();
    }

    // counting sort of the positions by token id (stable: positions stay in increasing order)
    int max_token = 0;
    for (size_t i = 0; i < BT; i++) {
        if (inp_host[i] < 0) { die("encoder_backward: negative token id %d at position %zu", inp_host[i], i); }
        if (inp_host[i] > max_token) { max_token = inp_host[i]; }
    }
    if (max_token + 1 > encoder_token_capacity) {
        free(encoder_token_start);
        free(encoder_token_next);
        encoder_token_capacity = max_token + 1;
        encoder_token_start = (int*)malloc_or_die((size_t)encoder_token_capacity * sizeof(int));
        encoder_token_next = (int*)malloc_or_die((size_t)encoder_token_capacity * sizeof(int));
    }
    int* count = encoder_token_next;   // counts first, then turned into fill cursors
    memset(count, 0, (size_t)(max_token + 1) * sizeof(int));
    for (size_t i = 0; i < BT; i++) { count[inp_host[i]]++; }
    int start = 0;
    for (int v = 0; v <= max_token; v++) {
        encoder_token_start[v] = start;
        start += count[v];
        count[v] = encoder_token_start[v];
    }

    // the pinned staging buffer: wait for its previous copy to the device, then reuse it
    const size_t max_host_bytes = (encoder_max_items(BT) + encoder_max_splits(BT)) * sizeof(int4) + BT * sizeof(int);
    if (encoder_copy_done == NULL) { cudaCheck(cudaEventCreateWithFlags(&encoder_copy_done, cudaEventDisableTiming)); }
    cudaCheck(cudaEventSynchronize(encoder_copy_done));
    if (max_host_bytes > encoder_pinned_bytes) {
        if (encoder_pinned != NULL) { cudaCheck(cudaFreeHost(encoder_pinned)); }
        cudaCheck(cudaMallocHost((void**)&encoder_pinned, max_host_bytes));
        encoder_pinned_bytes = max_host_bytes;
    }
    // sorted positions go after the items and splits, whose counts are known only at the end: sort into the
    // tail of the buffer first, then build items and splits in separate regions, and pack once they are known
    int4* items = (int4*)encoder_pinned;
    int4* splits = items + encoder_max_items(BT);
    int* sorted_pos = (int*)(splits + encoder_max_splits(BT));
    for (size_t i = 0; i < BT; i++) { sorted_pos[count[inp_host[i]]++] = (int)i; }

    int num_items = 0, num_splits = 0, num_partials = 0;
    for (int v = 0; v <= max_token; v++) {
        const int first = encoder_token_start[v], n = (v < max_token ? encoder_token_start[v + 1] : (int)BT) - first;
        if (n == 0) { continue; }
        if (n <= ENCODER_CHUNK) {
            items[num_items++] = make_int4(v, first, n, -1);
            continue;
        }
        const int pieces = ceil_div(n, ENCODER_CHUNK);
        splits[num_splits++] = make_int4(v, num_partials, pieces, 0);
        for (int p = 0; p < pieces; p++) {
            const int len = p < pieces - 1 ? ENCODER_CHUNK : n - p * ENCODER_CHUNK;
            items[num_items++] = make_int4(v, first + p * ENCODER_CHUNK, len, num_partials++);
        }
    }
    // pack: items | splits | sorted positions, one copy
    int4* packed_splits = items + num_items;
    memmove(packed_splits, splits, (size_t)num_splits * sizeof(int4));
    int* packed_pos = (int*)(packed_splits + num_splits);
    memmove(packed_pos, sorted_pos, BT * sizeof(int));
    const size_t copy_bytes = (size_t)(num_items + num_splits) * sizeof(int4) + BT * sizeof(int);
    cudaCheck(cudaMemcpyAsync(scratch, encoder_pinned, copy_bytes, cudaMemcpyHostToDevice, stream));
    cudaCheck(cudaEventRecord(encoder_copy_done, stream));

    const int4* d_items = (const int4*)scratch;
    const int4* d_splits = d_items + num_items;
    const int* d_sorted_pos = (const int*)(d_splits + num_splits);
    float* d_partials = (float*)((char*)scratch + encoder_partials_offset(BT));
    const int channel_blocks = ceil_div(C, ENCODER_BWD_BLOCK);
    encoder_backward_items_kernel<<<dim3(num_items, channel_blocks), ENCODER_BWD_BLOCK, 0, stream>>>(
        dwte, d_partials, d_items, d_sorted_pos, dout, C);
    cudaCheckLaunch();
    if (num_splits > 0) {
        encoder_backward_splits_kernel<<<dim3(num_splits, channel_blocks), ENCODER_BWD_BLOCK, 0, stream>>>(
            dwte, d_partials, d_splits, C);
        cudaCheckLaunch();
    }
}

#endif // TRAIN_KLA_KERNELS_ENCODER_CUH
