/*
test_ranks.c: ranks.h, the part of multi-GPU training that needs no GPU (CI runs it): which rank a process is
under each launcher's variables, the one-line errors for variables that make no sense, and the exchange of
rank 0's NCCL id through a file between real processes (fork), with its timeout. Prints one PASS/FAIL line per
check; exit code 1 if any failed.
*/
#include <sys/wait.h>
#include "ranks.h"

static int failures = 0;

// all that a pipe gives until its writers close it (stderr is unbuffered: die() writes in several pieces)
static void read_all(int fd, char* buf, size_t len) {
    size_t n = 0;
    ssize_t got;
    while (n + 1 < len && (got = read(fd, buf + n, len - 1 - n)) > 0) { n += (size_t)got; }
    buf[n] = '\0';
}

static void check(int ok, const char* name, const char* why) {
    printf("%s ranks: %s%s%s\n", ok ? "PASS" : "FAIL", name, ok ? "" : ": ", ok ? "" : why);
    if (!ok) { failures++; }
}

static const char* LAUNCH_VARS[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI_KVSNAME", "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_STEP_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK",
    "TRAIN_KLA_LAUNCH_ID", "TORCHELASTIC_RUN_ID"};

// the environment of one launcher: name=value pairs, NULL-terminated; every other launch variable unset
static void set_environment(const char* const* pairs) {
    for (size_t i = 0; i < sizeof(LAUNCH_VARS) / sizeof(LAUNCH_VARS[0]); i++) { unsetenv(LAUNCH_VARS[i]); }
    for (int i = 0; pairs[i] != NULL; i += 2) { setenv(pairs[i], pairs[i + 1], 1); }
}

// Runs ranks_from_environment in a child process with stderr into a pipe: returns its exit code, and its
// stderr in err. The parent's environment is the child's.
static int child_ranks(Ranks* out, char* err, size_t err_len) {
    int pipe_err[2], pipe_out[2];
    if (pipe(pipe_err) != 0 || pipe(pipe_out) != 0) { die("pipe: %s", strerror(errno)); }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pipe_err[1], 2);
        close(pipe_err[0]);
        close(pipe_out[0]);
        Ranks r;
        ranks_from_environment(&r);
        if (write(pipe_out[1], &r, sizeof(r)) != (ssize_t)sizeof(r)) { _exit(3); }
        _exit(0);
    }
    close(pipe_err[1]);
    close(pipe_out[1]);
    read_all(pipe_err[0], err, err_len);
    memset(out, 0, sizeof(*out));
    if (read(pipe_out[0], out, sizeof(*out)) != (ssize_t)sizeof(*out)) { memset(out, 0, sizeof(*out)); }
    close(pipe_err[0]);
    close(pipe_out[0]);
    int status;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void expect_ranks(const char* name, const char* const* env, int rank, int num_ranks, int local, const char* launch) {
    set_environment(env);
    Ranks r;
    char err[512], why[1024];
    int code = child_ranks(&r, err, sizeof(err));
    snprintf(why, sizeof(why), "exit %d, rank %d of %d, local %d, launch '%s' (want %d of %d, local %d, '%s'); stderr: %s", code, r.rank,
             r.num_ranks, r.local_rank, r.launch, rank, num_ranks, local, launch, err);
    check(code == 0 && r.rank == rank && r.num_ranks == num_ranks && r.local_rank == local && strcmp(r.launch, launch) == 0, name, why);
}

static void expect_error(const char* name, const char* const* env, const char* message) {
    set_environment(env);
    Ranks r;
    char err[512], why[1024];
    int code = child_ranks(&r, err, sizeof(err));
    int lines = 0;
    for (const char* c = err; *c; c++) { lines += *c == '\n'; }
    snprintf(why, sizeof(why), "exit %d, stderr '%s', want exit 1 and one line with '%s'", code, err, message);
    check(code == 1 && lines == 1 && strncmp(err, "error: ", 7) == 0 && strstr(err, message) != NULL, name, why);
}

static void test_environment(void) {
    const char* none[] = {NULL};
    expect_ranks("no launcher: one process", none, 0, 1, 0, "");
    const char* ompi[] = {"OMPI_COMM_WORLD_RANK", "1", "OMPI_COMM_WORLD_SIZE", "2", "OMPI_COMM_WORLD_LOCAL_RANK", "1",
                          "OMPI_MCA_ess_base_jobid", "3735879681", NULL};
    expect_ranks("mpirun (Open MPI): rank, size, local rank, job id", ompi, 1, 2, 1, "3735879681");
    const char* mpich[] = {"PMI_RANK", "3", "PMI_SIZE", "4", "MPI_LOCALRANKID", "1", "PMI_KVSNAME", "kvs_77_0", NULL};
    expect_ranks("mpiexec (MPICH): rank, size, local rank, kvs name", mpich, 3, 4, 1, "kvs_77_0");
    const char* slurm[] = {"SLURM_PROCID", "5", "SLURM_STEP_NUM_TASKS", "8", "SLURM_LOCALID", "1", "SLURM_JOB_ID", "4242",
                           "SLURM_STEP_ID", "0", NULL};
    expect_ranks("srun (Slurm): rank, tasks of the step, local id, job.step", slurm, 5, 8, 1, "4242.0");
    const char* batch[] = {"SLURM_JOB_ID", "4242", "SLURM_PROCID", "0", NULL};  // an sbatch script: no step tasks
    expect_ranks("Slurm batch script without srun: one process", batch, 0, 1, 0, "");
    const char* script[] = {"RANK", "1", "WORLD_SIZE", "2", "LOCAL_RANK", "1", "TRAIN_KLA_LAUNCH_ID", "launch12/x y", NULL};
    expect_ranks("scripts/launch.sh's variables; the launch name made safe for a file name", script, 1, 2, 1, "launch12_x_y");
    const char* torchrun[] = {"RANK", "0", "WORLD_SIZE", "2", "TORCHELASTIC_RUN_ID", "none", NULL};
    expect_ranks("torchrun's variables, no LOCAL_RANK: the rank", torchrun, 0, 2, 0, "none");
    const char* both[] = {"OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "2", "PMIX_NAMESPACE", "prterun-1@1",
                          "SLURM_PROCID", "0", "SLURM_STEP_NUM_TASKS", "1", NULL};
    expect_ranks("mpirun inside a Slurm step: Open MPI's variables win", both, 0, 2, 0, "prterun-1_1");

    const char* rank_out[] = {"RANK", "2", "WORLD_SIZE", "2", "TRAIN_KLA_LAUNCH_ID", "x", NULL};
    expect_error("a rank beyond the size is one line", rank_out, "WORLD_SIZE=2, but RANK is 2: not a rank of the run");
    const char* no_rank[] = {"WORLD_SIZE", "2", "TRAIN_KLA_LAUNCH_ID", "x", NULL};
    expect_error("a size without a rank is one line", no_rank, "RANK is not set");
    const char* garbage[] = {"RANK", "one", "WORLD_SIZE", "2", NULL};
    expect_error("a rank that is not a number is one line", garbage, "RANK=one: not a rank or a count");
    const char* zero[] = {"RANK", "0", "WORLD_SIZE", "0", NULL};
    expect_error("zero ranks is one line", zero, "WORLD_SIZE=0");
    const char* unnamed[] = {"RANK", "0", "WORLD_SIZE", "2", NULL};
    expect_error("several ranks with no launch name is one line", unnamed, "set TRAIN_KLA_LAUNCH_ID");
    // negative control: the same error check on a valid environment must fail
    set_environment(script);
    Ranks r;
    char err[512];
    int code = child_ranks(&r, err, sizeof(err));
    check(code == 0, "negative control: a valid environment is not reported as an error", err);
}

// rank 0 and rank 1 as two processes: rank 1 starts first and waits; rank 0 publishes after 0.3 s
static void test_exchange(void) {
    char dir[] = "/tmp/test_ranks_XXXXXX";
    if (mkdtemp(dir) == NULL) { die("mkdtemp: %s", strerror(errno)); }
    setenv("TRAIN_KLA_NCCL_DIR", dir, 1);
    unsigned char id[128], got[128];
    for (int i = 0; i < 128; i++) { id[i] = (unsigned char)(i * 37 + 11); }
    Ranks r0, r1;
    memset(&r0, 0, sizeof(r0));
    r0.num_ranks = 2;
    snprintf(r0.launch, sizeof(r0.launch), "test%ld", (long)getpid());
    r1 = r0;
    r1.rank = 1;
    // a file left by another launch must not be read
    Ranks old = r0;
    snprintf(old.launch, sizeof(old.launch), "older");
    unsigned char stale[128];
    memset(stale, 0xEE, sizeof(stale));
    ranks_exchange_id(&old, stale, sizeof(stale), 1);

    int fd[2];
    if (pipe(fd) != 0) { die("pipe: %s", strerror(errno)); }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {  // rank 1
        close(fd[0]);
        unsigned char buf[128];
        ranks_exchange_id(&r1, buf, sizeof(buf), 10);
        if (write(fd[1], buf, sizeof(buf)) != (ssize_t)sizeof(buf)) { _exit(3); }
        _exit(0);
    }
    close(fd[1]);
    struct timespec wait = {0, 300 * 1000 * 1000};
    nanosleep(&wait, NULL);
    ranks_exchange_id(&r0, id, sizeof(id), 10);
    ssize_t n = read(fd[0], got, sizeof(got));
    close(fd[0]);
    int status;
    waitpid(pid, &status, 0);
    check(n == (ssize_t)sizeof(got) && memcmp(got, id, sizeof(id)) == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "the id rank 0 publishes reaches rank 1 (another process, started first), not an older launch's", "rank 1 read other bytes");
    char path[4096];
    ranks_id_path(path, sizeof(path), &r0);
    ranks_remove_id(&r0);
    check(access(path, F_OK) != 0, "rank 0 removes the id's file", path);

    // rank 1 with no rank 0: one line after the timeout
    int pipe_err[2];
    if (pipe(pipe_err) != 0) { die("pipe: %s", strerror(errno)); }
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        dup2(pipe_err[1], 2);
        unsigned char buf[128];
        ranks_exchange_id(&r1, buf, sizeof(buf), 1);
        _exit(0);
    }
    close(pipe_err[1]);
    char err[1024];
    read_all(pipe_err[0], err, sizeof(err));
    close(pipe_err[0]);
    waitpid(pid, &status, 0);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(err, "rank 1: no NCCL id from rank 0") != NULL &&
          strstr(err, "after 1 s") != NULL, "rank 1 without rank 0 stops after the timeout with one line", err);
    ranks_remove_id(&old);
    rmdir(dir);
}

int main(void) {
    test_environment();
    test_exchange();
    if (failures > 0) { printf("%d check(s) failed\n", failures); }
    return failures > 0 ? 1 : 0;
}
