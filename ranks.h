/*
ranks.h: which process of a multi-process run this is, and how the processes meet (README "Multi-GPU").

train_klacu trains on N GPUs of a host as N processes, one per GPU, llm.c style. This header holds the part that
needs no GPU, so that CI tests it on a CPU machine (dev/test/test_ranks.c):

- ranks_from_environment: the rank, the number of ranks and the rank on this host, read from the variables that
  the launcher sets. In this order of precedence:
    mpirun (Open MPI)       OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
    mpiexec (MPICH, Hydra)  PMI_RANK, PMI_SIZE, MPI_LOCALRANKID
    srun (Slurm)            SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID (set for the tasks of a job step,
                            not in the batch script itself, which is one process whatever its --ntasks)
    scripts/launch.sh       RANK, WORLD_SIZE, LOCAL_RANK (torchrun's names)
  and none of them: one process.
- ranks_exchange_id: rank 0's NCCL unique id (an opaque block of bytes) to every rank through a file, for a build
  without MPI or a launcher that is not MPI's (a build with MPI and mpirun uses MPI_Bcast instead). Rank 0 writes
  <dir>/train_kla_nccl_id.<launch> (a temporary name, then rename, so a reader never sees half a file); the other
  ranks wait for it. <launch> names this launch, so that a file left by an earlier one is never read: Open MPI's
  job id, Slurm's job and step ids, or TRAIN_KLA_LAUNCH_ID (scripts/launch.sh sets it; torchrun's
  TORCHELASTIC_RUN_ID also serves). <dir> is $TRAIN_KLA_NCCL_DIR, by default /tmp: on several hosts it must be a
  directory that all of them share.

Every problem (a variable out of range, no launch name, no file from rank 0 in time) is one line "error: ..." and
exit code 1, like the rest of the program.
*/
#ifndef TRAIN_KLA_RANKS_H
#define TRAIN_KLA_RANKS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>
#include "utils.h"

typedef struct {
    int rank;              // 0 .. num_ranks - 1; rank 0 writes the logs and the checkpoints
    int num_ranks;
    int local_rank;        // the rank among this host's processes: the GPU it uses
    const char* launcher;  // which variables said so
    int by_mpi;            // an MPI launcher (mpirun, mpiexec) started the run: MPI can bootstrap it
    char launch[128];      // a name unique to this launch (ranks_exchange_id's file), "" for one process
} Ranks;

// the value of an integer variable of the launcher, or -1 when it is not set; a value that is not a number
// in [0, 2^20) is an error naming it
static int ranks_env_int(const char* name) {
    const char* s = getenv(name);
    if (s == NULL || *s == '\0') { return -1; }
    char* end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0 || v >= (1L << 20)) { die("environment variable %s=%s: not a rank or a count", name, s); }
    return (int)v;
}

static void ranks_from_environment(Ranks* r) {
    static const struct { const char *launcher, *rank, *size, *local; int mpi; } known[4] = {
        {"mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", 1},
        {"mpiexec (MPICH)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", 1},
        {"srun (Slurm)", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", 0},
        {"RANK/WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", 0},
    };
    memset(r, 0, sizeof(*r));
    r->num_ranks = 1;
    r->launcher = "one process";
    for (int k = 0; k < 4; k++) {
        int size = ranks_env_int(known[k].size);
        if (size < 0) { continue; }
        int rank = ranks_env_int(known[k].rank), local = ranks_env_int(known[k].local);
        if (size < 1) { die("environment variable %s=0: a run needs at least one rank", known[k].size); }
        if (rank < 0 || rank >= size) { die("%s=%d, but %s is %s: not a rank of the run", known[k].size, size, known[k].rank, getenv(known[k].rank) ? getenv(known[k].rank) : "not set"); }
        if (local < 0) { local = rank; }  // one host: the rank is the rank on the host
        r->rank = rank;
        r->num_ranks = size;
        r->local_rank = local;
        r->launcher = known[k].launcher;
        r->by_mpi = known[k].mpi;
        if (size == 1) { return; }
        // the launch's name: the launcher's job id, else the one scripts/launch.sh or torchrun sets
        const char* job = NULL;
        char slurm[96];
        if (k == 0) { job = getenv("OMPI_MCA_ess_base_jobid") ? getenv("OMPI_MCA_ess_base_jobid") : getenv("PMIX_NAMESPACE"); }
        if (k == 1) { job = getenv("PMI_KVSNAME"); }
        if (k == 2 && getenv("SLURM_JOB_ID") && getenv("SLURM_STEP_ID")) {
            snprintf(slurm, sizeof(slurm), "%s.%s", getenv("SLURM_JOB_ID"), getenv("SLURM_STEP_ID"));
            job = slurm;
        }
        if (job == NULL) { job = getenv("TRAIN_KLA_LAUNCH_ID") ? getenv("TRAIN_KLA_LAUNCH_ID") : getenv("TORCHELASTIC_RUN_ID"); }
        if (job == NULL || *job == '\0') {
            die("%s says %d ranks, but nothing names this launch: set TRAIN_KLA_LAUNCH_ID to a value unique to it (scripts/launch.sh does)",
                r->launcher, size);
        }
        // the name becomes part of a file name: letters, digits, '.', '-' and '_' only
        size_t n = 0;
        for (const char* c = job; *c && n + 1 < sizeof(r->launch); c++) {
            int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' || *c == '-' || *c == '_';
            r->launch[n++] = ok ? *c : '_';
        }
        r->launch[n] = '\0';
        return;
    }
}

// The file of ranks_exchange_id, in $TRAIN_KLA_NCCL_DIR (default /tmp).
static void ranks_id_path(char* path, size_t n, const Ranks* r) {
    const char* dir = getenv("TRAIN_KLA_NCCL_DIR") ? getenv("TRAIN_KLA_NCCL_DIR") : "/tmp";
    snprintf(path, n, "%s/train_kla_nccl_id.%s", dir, r->launch);
}

// Rank 0 publishes `bytes` bytes of id; every other rank waits up to timeout_s seconds for them and reads them
// into id. Rank 0 removes the file with ranks_remove_id once every rank has joined (after the first collective).
static void ranks_exchange_id(const Ranks* r, void* id, size_t bytes, int timeout_s) {
    char path[4096], tmp[4200];
    ranks_id_path(path, sizeof(path), r);
    if (r->rank == 0) {
        snprintf(tmp, sizeof(tmp), "%s.tmp%ld", path, (long)getpid());
        FILE* f = fopen(tmp, "wb");
        if (f == NULL) { die("%s: cannot write rank 0's NCCL id (%s); set TRAIN_KLA_NCCL_DIR to a writable directory", tmp, strerror(errno)); }
        fwrite_or_die(id, bytes, f, tmp);
        if (fclose(f) != 0 || rename(tmp, path) != 0) { die("%s: cannot publish rank 0's NCCL id (%s)", path, strerror(errno)); }
        return;
    }
    struct timespec pause = {0, 10 * 1000 * 1000};  // 10 ms between looks
    for (long waited_ms = 0;; waited_ms += 10) {
        struct stat st;
        if (stat(path, &st) == 0 && (size_t)st.st_size == bytes) {
            FILE* f = fopen_or_die(path, "rb");
            fread_or_die(id, bytes, f, path);
            fclose(f);
            return;
        }
        if (waited_ms >= 1000L * timeout_s) {
            die("rank %d: no NCCL id from rank 0 in %s after %d s: is rank 0 running, and do all ranks share that directory (TRAIN_KLA_NCCL_DIR)?",
                r->rank, path, timeout_s);
        }
        nanosleep(&pause, NULL);
    }
}

static void ranks_remove_id(const Ranks* r) {
    char path[4096];
    ranks_id_path(path, sizeof(path), r);
    if (r->rank == 0) { remove(path); }
}

#endif // TRAIN_KLA_RANKS_H
