/*
multi_gpu.cuh: data-parallel training on several GPUs of a host (or of several hosts), llm.c style (README
"Multi-GPU"). One process per GPU; ranks.h says which one this is. NCCL does the collectives; MPI, when the
build has it (USE_MPI) and mpirun started the run, hands rank 0's NCCL id to the others, else a file does
(ranks.h).

What the ranks share, and how:
- every rank builds the same model from the same seed or file, and stays equal to the others: each step's
  gradients are averaged over the ranks in fp32 (NCCL's ncclAvg) before the norm and AdamW, which then see the
  gradient of the global batch;
- with -z 1 (ZeRO-1) AdamW's m and v are sharded: rank r keeps the state of the r-th of num_ranks equal slices of
  the flat parameter buffer, gets the averaged gradient of its slice only (a reduce-scatter in place of the
  all-reduce), updates its slice of the parameters, and an all-gather gives every rank all of them again (the
  fp32 master and the bf16 copy: the passes read both, the norms, biases, gates, the embedding and the mixers'
  small parameters in fp32). A checkpoint gathers m and v to rank 0, which writes the same files as without ZeRO;
- the gradient reduction runs after the step's last backward, not overlapped with it. Overlapping it on a second
  stream, in buckets of 1 to 4 layers as the backward finishes them, was measured twice: on 2 H200s the attn 124M
  model scaled 93.0% against 95.2% without; on 4 H200s (2026-11-26) the best bucketing saved 0.37 of the 2.2 ms
  all-reduce (93.3% -> 94.1%), with or without a high-priority stream or fewer NCCL CTAs. The last bucket holds
  the tied embedding's gradient, a third of the model, which the encoder's backward finishes last, and NCCL's
  kernels slow the backward's matmuls while they share the SMs;
- the global gradient norm is the sum over ranks of each rank's slice's squared norm, with or without ZeRO, so
  that the two give the same clipping to the last bit;
- rank 0 alone writes main.log and the checkpoints; the other ranks print nothing to stdout (their errors still
  reach stderr).
Built without NCCL (MULTI_GPU undefined), the program is a single-GPU one and refuses a launch of several ranks.
*/
#ifndef TRAIN_KLA_MULTI_GPU_CUH
#define TRAIN_KLA_MULTI_GPU_CUH

#include "ranks.h"
#ifdef MULTI_GPU
#include <nccl.h>
#ifdef USE_MPI
#include <mpi.h>
#endif
#endif

typedef struct {
    int rank, num_ranks;  // 0 and 1 unless multi_gpu_init finds a launch of several processes
    int zero;             // -z 1: AdamW's state is sharded over the ranks
    double* sums;         // device, MULTI_GPU_MAX_SUMS doubles: multi_gpu_sum's buffer
#ifdef MULTI_GPU
    ncclComm_t comm;
    int mpi;              // MPI_Init was called (MPI_Finalize is due at the end)
#endif
} MultiGPU;
static MultiGPU multi = {0, 1, 0, NULL};
#define MULTI_GPU_MAX_SUMS 16

#ifdef MULTI_GPU
#define ncclCheck(call) do {                                                                              \
        ncclResult_t r_ = (call);                                                                         \
        if (r_ != ncclSuccess) { die("NCCL: %s (%s:%d, rank %d)", ncclGetErrorString(r_), __FILE__, __LINE__, multi.rank); } \
    } while (0)
#endif

// values[0..n) = their sums over the ranks, on every rank (in a fixed order: every rank gets the same bits)
static void multi_gpu_sum(double* values, int n) {
    if (multi.num_ranks == 1) { return; }
#ifdef MULTI_GPU
    if (n > MULTI_GPU_MAX_SUMS) { die("internal: multi_gpu_sum of %d values", n); }
    cudaCheck(cudaMemcpy(multi.sums, values, n * sizeof(double), cudaMemcpyHostToDevice));
    ncclCheck(ncclAllReduce(multi.sums, multi.sums, n, ncclFloat64, ncclSum, multi.comm, 0));
    cudaCheck(cudaMemcpy(values, multi.sums, n * sizeof(double), cudaMemcpyDeviceToHost));
#endif
}

// Which rank this process is, its GPU (the local rank's), and the NCCL communicator of the ranks. Call first in
// main, before any other CUDA call. zero: -z.
static void multi_gpu_init(int zero) {
    Ranks r;
    ranks_from_environment(&r);
    multi.rank = r.rank;
    multi.num_ranks = r.num_ranks;
    multi.zero = zero;
    int num_devices = 0;
    if (cudaGetDeviceCount(&num_devices) != cudaSuccess || num_devices == 0) {
        die("no CUDA device found (train_kla.cu needs an NVIDIA GPU; the CPU trainer is train_kla)");
    }
    // the GPU of the rank on its host; a rank that sees a single GPU takes it (a launcher that binds one GPU to each
    // rank, such as srun --gpus-per-task=1, leaves each rank its own in CUDA_VISIBLE_DEVICES)
    int device = num_devices == 1 ? 0 : r.local_rank;
    if (device >= num_devices) {
        die("rank %d is rank %d of its host (%s), but the host has %d GPUs: one rank per GPU", r.rank, r.local_rank, r.launcher, num_devices);
    }
    cudaCheck(cudaSetDevice(device));
    if (r.num_ranks == 1) { return; }
#ifndef MULTI_GPU
    die("%s started %d ranks, but this train_klacu was built without NCCL (make finds nccl.h in the CUDA toolkit, "
        "/usr/include or $NCCL_HOME/include): it runs on one GPU", r.launcher, r.num_ranks);
#else
    ncclUniqueId id;
    if (r.rank == 0) { ncclCheck(ncclGetUniqueId(&id)); }
#ifdef USE_MPI
    if (r.by_mpi) {
        MPI_Init(NULL, NULL);
        multi.mpi = 1;
        MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    } else {
        ranks_exchange_id(&r, &id, sizeof(id), 120);
    }
#else
    ranks_exchange_id(&r, &id, sizeof(id), 120);
#endif
    // NVLink multicast (NVLS) stays off unless the environment turns it on: on shared machines a program that uses
    // it can take the host's GPUs out of service, and the all-reduce of fp32 gradients gains little from it
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    ncclCheck(ncclCommInitRank(&multi.comm, r.num_ranks, id, r.rank));
    multi.sums = (double*)cuda_malloc_or_die(MULTI_GPU_MAX_SUMS * sizeof(double), "multi_gpu_sum's buffer");
    double joined = 1.0;
    multi_gpu_sum(&joined, 1);  // every rank has joined: the id's file can go
    ranks_remove_id(&r);
    if (r.rank != 0 && freopen("/dev/null", "w", stdout) == NULL) { die("rank %d: cannot silence stdout", r.rank); }
    printf("multi-GPU: %d ranks (%s), NCCL %d.%d.%d, ZeRO-1 %s\n", r.num_ranks, r.launcher, NCCL_MAJOR, NCCL_MINOR,
           NCCL_PATCH, zero ? "on: AdamW's state is sharded" : "off");
#endif
}

static void multi_gpu_finish(void) {
    if (multi.num_ranks == 1) { return; }
#ifdef MULTI_GPU
    cudaCheck(cudaDeviceSynchronize());
    ncclCheck(ncclCommDestroy(multi.comm));
    cudaFree(multi.sums);
#ifdef USE_MPI
    if (multi.mpi) { MPI_Finalize(); }
#endif
#endif
}

#endif // TRAIN_KLA_MULTI_GPU_CUH
