/*
test_dataloader.c: checks dataloader.h on small synthetic shards written to a temporary directory.

build and run from the repository root:
    gcc -O2 -Wall -Wextra -o test_dataloader dev/test/test_dataloader.c && ./test_dataloader

Every token in the synthetic shards encodes where it lives: token = base + shard*stride + position, so a
batch can be checked against the exact window it must come from just by looking at its values.
Errors are tested in child processes (fork), because the loader reports them by exiting.

Output: one line per check, "PASS <name>" or "FAIL <name>: <details>"; exit code 1 if anything failed.
*/
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>
#include "../../dataloader.h"

#define VOCAB 50257
#define STRIDE 2000          // token = shard*STRIDE + position in the uint16 data sets (all below VOCAB)
#define U32_BASE 70000       // token = U32_BASE + shard*U32_STRIDE + position in the uint32 data set
#define U32_STRIDE 1000
#define U32_VOCAB 100000

// ----------------------------------------------------------------------------------------------------------
// reporting

static int g_failures = 0;

static void report(int ok, const char* name, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void report(int ok, const char* name, const char* fmt, ...) {
    if (ok) {
        printf("PASS %s\n", name);
    } else {
        char details[1024];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(details, sizeof(details), fmt, ap);
        va_end(ap);
        printf("FAIL %s: %s\n", name, details);
        g_failures++;
    }
    fflush(stdout);
}

// keep the first problem found in a loop; a check passes when `why` stays empty
#define NOTE(why, ...) do { if ((why)[0] == '\0') { snprintf((why), sizeof(why), __VA_ARGS__); } } while (0)

// ----------------------------------------------------------------------------------------------------------
// writing synthetic shards

static void put_le32(unsigned char* p, uint32_t v) {
    p[0] = (unsigned char)v; p[1] = (unsigned char)(v >> 8); p[2] = (unsigned char)(v >> 16); p[3] = (unsigned char)(v >> 24);
}

// a shard with an arbitrary header (so that broken ones can be made too): n tokens of token_bytes each,
// then extra_bytes zero bytes
static void write_raw_shard(const char* path, uint32_t magic, uint32_t version, uint32_t header_ntok,
                            const uint32_t* tokens, size_t n, int token_bytes, size_t extra_bytes) {
    unsigned char header[DL_HEADER_BYTES];
    memset(header, 0, sizeof(header));
    put_le32(header + 0, magic);
    put_le32(header + 4, version);
    put_le32(header + 8, header_ntok);
    unsigned char* payload = (unsigned char*)calloc_or_die(n * (size_t)token_bytes + extra_bytes, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char* p = payload + i * (size_t)token_bytes;
        if (token_bytes == 2) { p[0] = (unsigned char)tokens[i]; p[1] = (unsigned char)(tokens[i] >> 8); }
        else { put_le32(p, tokens[i]); }
    }
    FILE* f = fopen_or_die(path, "wb");
    fwrite_or_die(header, sizeof(header), f, path);
    fwrite_or_die(payload, n * (size_t)token_bytes + extra_bytes, f, path);
    fclose(f);
    free(payload);
}

static void write_shard(const char* path, const uint32_t* tokens, size_t n, int token_bytes) {
    if (token_bytes == 2) { write_raw_shard(path, DL_MAGIC_U16, DL_VERSION_U16, (uint32_t)n, tokens, n, 2, 0); }
    else { write_raw_shard(path, DL_MAGIC_U32, DL_VERSION_U32, (uint32_t)n, tokens, n, 4, 0); }
}

// tokens[i] = base + i
static uint32_t* ramp(size_t n, uint32_t base) {
    uint32_t* t = (uint32_t*)malloc_or_die(n * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) { t[i] = base + (uint32_t)i; }
    return t;
}

// shard s of a data set: dir/d_%06d.bin holding base + s*stride + position
static void write_dataset_shard(const char* dir, int s, size_t ntok, int token_bytes, uint32_t base, uint32_t stride) {
    char path[1100];
    snprintf(path, sizeof(path), "%s/d_%06d.bin", dir, s);
    uint32_t* t = ramp(ntok, base + (uint32_t)s * stride);
    write_shard(path, t, ntok, token_bytes);
    free(t);
}

static void make_dir(const char* path) {
    if (mkdir(path, 0755) != 0) { die("%s: cannot create directory (%s)", path, strerror(errno)); }
}

// remove a directory tree that this test made (files, symlinks, directories)
static void remove_tree(const char* path) {
    struct stat st;
    if (lstat(path, &st) != 0) { return; }
    if (S_ISDIR(st.st_mode)) {
        DIR* d = opendir(path);
        if (d != NULL) {
            struct dirent* e;
            while ((e = readdir(d)) != NULL) {
                if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) { continue; }
                char child[1024];
                snprintf(child, sizeof(child), "%s/%s", path, e->d_name);
                remove_tree(child);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

// ----------------------------------------------------------------------------------------------------------
// loader helpers

typedef struct {
    const char* pattern;
    size_t B, T;
    int rank, P;
    int shuffle;
    uint64_t seed;
    int vocab;
    size_t batches;                // batches to read after init (used by the error tests)
    const DataLoaderState* state;  // restored right after init when not NULL (used by the error tests)
    int rows;                      // DL_ROWS_CONTIGUOUS (0, what the tests before --rows left out) or DL_ROWS_INDEPENDENT
} Job;

static void open_loader(DataLoader* l, const Job* j) {
    dataloader_init(l, j->pattern, j->B, j->T, j->rank, j->P, j->rows, j->shuffle, j->seed, j->vocab);
}

// read n batches, appending inputs/targets (B*T each) to in/tg and the epoch of each batch to epochs
static void take(DataLoader* l, size_t n, int* in, int* tg, uint64_t* epochs) {
    size_t BT = l->B * l->T;
    for (size_t k = 0; k < n; k++) {
        dataloader_next_batch(l);
        if (in != NULL) { memcpy(in + k * BT, l->inputs, BT * sizeof(int)); }
        if (tg != NULL) { memcpy(tg + k * BT, l->targets, BT * sizeof(int)); }
        if (epochs != NULL) { epochs[k] = l->epoch; }
    }
}

// is (in, tg) the span of B*T+1 consecutive tokens starting at token value `first`?
static int is_span(const int* in, const int* tg, size_t BT, int first) {
    for (size_t i = 0; i < BT; i++) {
        if (in[i] != first + (int)i || tg[i] != first + (int)i + 1) { return 0; }
    }
    return 1;
}

// the window a batch of a P = 1 loader (or rank 0) came from, as shard * 10000 + window; -1 if the batch
// does not start at a window boundary
static int window_id(const int* in, size_t window_tokens) {
    int shard = in[0] / STRIDE, pos = in[0] % STRIDE;
    if (pos % (int)window_tokens != 0) { return -1; }
    return shard * 10000 + pos / (int)window_tokens;
}

// the state of a loader of job j after n batches
static void state_after(const Job* j, size_t n, DataLoaderState* s) {
    DataLoader l;
    open_loader(&l, j);
    take(&l, n, NULL, NULL, NULL);
    dataloader_get_state(&l, s);
    dataloader_free(&l);
}

static int compare_ints(const void* a, const void* b) {
    int x = *(const int*)a, y = *(const int*)b;
    return (x > y) - (x < y);
}

// ----------------------------------------------------------------------------------------------------------
// the main data set: three uint16 shards whose sizes leave different remainders (61 = 10*6 + 1 fits
// exactly; 50 and 37 leave tokens unused). With B=2, T=3: 10 + 8 + 6 = 24 windows.

static const size_t MAIN_NTOK[3] = {61, 50, 37};
static char g_root[256];
static char g_main_pattern[600];

static void test_sequential(void) {
    Job j = {g_main_pattern, 2, 3, 0, 1, 0, 0, VOCAB, 0, NULL, DL_ROWS_CONTIGUOUS};
    DataLoader l;
    open_loader(&l, &j);
    report(l.num_tokens == 148 && l.batches_per_epoch == 24 && l.B == 2 && l.T == 3 && l.epoch == 0,
           "sequential: num_tokens, batches_per_epoch, B, T, epoch after init",
           "num_tokens %zu (want 148), batches_per_epoch %zu (want 24), B %zu, T %zu, epoch %llu",
           l.num_tokens, l.batches_per_epoch, l.B, l.T, (unsigned long long)l.epoch);

    const int want_in0[6] = {0, 1, 2, 3, 4, 5}, want_tg0[6] = {1, 2, 3, 4, 5, 6};
    const int want_in1[6] = {6, 7, 8, 9, 10, 11}, want_tg1[6] = {7, 8, 9, 10, 11, 12};
    dataloader_next_batch(&l);
    report(memcmp(l.inputs, want_in0, sizeof(want_in0)) == 0 && memcmp(l.targets, want_tg0, sizeof(want_tg0)) == 0,
           "sequential: first batch is inputs 0..5, targets 1..6",
           "inputs %d %d %d %d %d %d, targets %d %d %d %d %d %d", l.inputs[0], l.inputs[1], l.inputs[2], l.inputs[3],
           l.inputs[4], l.inputs[5], l.targets[0], l.targets[1], l.targets[2], l.targets[3], l.targets[4], l.targets[5]);
    dataloader_next_batch(&l);
    report(memcmp(l.inputs, want_in1, sizeof(want_in1)) == 0 && memcmp(l.targets, want_tg1, sizeof(want_tg1)) == 0,
           "sequential: second batch is inputs 6..11, targets 7..12",
           "inputs start %d, targets start %d", l.inputs[0], l.targets[0]);

    // the rest of epoch 0: shard s window w holds tokens s*STRIDE + 6w ..
    char why[256] = "";
    size_t k = 2;
    for (int s = 0; s < 3; s++) {
        size_t windows = (MAIN_NTOK[s] - 1) / 6;
        for (size_t w = (s == 0 ? 2 : 0); w < windows; w++, k++) {
            dataloader_next_batch(&l);
            if (!is_span(l.inputs, l.targets, 6, s * STRIDE + (int)w * 6)) {
                NOTE(why, "batch %zu: want shard %d window %zu (first token %d), got inputs[0]=%d targets[5]=%d",
                     k, s, w, s * STRIDE + (int)w * 6, l.inputs[0], l.targets[5]);
            }
            if (l.epoch != 0) { NOTE(why, "batch %zu: epoch %llu, want 0", k, (unsigned long long)l.epoch); }
            if (s == 0 && w == windows - 1 && l.targets[5] != 60) {
                NOTE(why, "last window of shard 0 should end at its last token 60, ends at %d", l.targets[5]);
            }
        }
    }
    report(why[0] == '\0' && k == 24, "sequential: exact tokens of all 24 batches, shards in order, tails dropped", "%s", why);

    // (d) wrap-around: the 25th batch is the first one again, now in epoch 1, and so is the whole epoch
    dataloader_next_batch(&l);
    report(l.epoch == 1 && is_span(l.inputs, l.targets, 6, 0), "wrap-around: batch 25 is batch 1 again, epoch 1",
           "epoch %llu, inputs[0] %d", (unsigned long long)l.epoch, l.inputs[0]);
    why[0] = '\0';
    for (k = 1; k < 24; k++) {
        dataloader_next_batch(&l);
        if (l.epoch != 1) { NOTE(why, "batch %zu of epoch 1 reports epoch %llu", k, (unsigned long long)l.epoch); }
    }
    dataloader_next_batch(&l);
    if (l.epoch != 2 || !is_span(l.inputs, l.targets, 6, 0)) {
        NOTE(why, "after 48 batches: epoch %llu, inputs[0] %d (want epoch 2, token 0)", (unsigned long long)l.epoch, l.inputs[0]);
    }
    report(why[0] == '\0', "wrap-around: epoch 1 has 24 batches, then epoch 2 starts over", "%s", why);

    dataloader_reset(&l);
    report(l.epoch == 0, "reset: epoch back to 0", "epoch %llu", (unsigned long long)l.epoch);
    dataloader_next_batch(&l);
    report(l.epoch == 0 && is_span(l.inputs, l.targets, 6, 0), "reset: next batch is the first batch of epoch 0",
           "epoch %llu, inputs[0] %d", (unsigned long long)l.epoch, l.inputs[0]);
    dataloader_free(&l);
}

// (b) P ranks with batch B together read what one process with batch B*P reads: with contiguous rows the
// ranks split the batch's span, with independent rows its rows (rank r: rows r*B .. r*B + B - 1)
static void test_sharding(void) {
    const size_t B = 2, T = 3, BT = B * T;
    for (int rows = 0; rows < 2; rows++)
    for (int P = 2; P <= 3; P++) {
        for (int shuffle = 0; shuffle <= 1; shuffle++) {
            Job jref = {g_main_pattern, B * (size_t)P, T, 0, 1, shuffle, 7, VOCAB, 0, NULL, rows};
            DataLoader ref;
            open_loader(&ref, &jref);
            DataLoader ranks[3];
            char why[512] = "";
            for (int r = 0; r < P; r++) {
                Job jr = {g_main_pattern, B, T, r, P, shuffle, 7, VOCAB, 0, NULL, rows};
                open_loader(&ranks[r], &jr);
                if (ranks[r].batches_per_epoch != ref.batches_per_epoch) {
                    NOTE(why, "rank %d has %zu batches per epoch, the P=1 loader %zu", r, ranks[r].batches_per_epoch,
                         ref.batches_per_epoch);
                }
            }
            size_t bpe = ref.batches_per_epoch;
            size_t want_bpe = 0;
            if (rows == DL_ROWS_INDEPENDENT) {  // all windows of T + 1 tokens, B*P of them a batch
                for (int s = 0; s < 3; s++) { want_bpe += (MAIN_NTOK[s] - 1) / T; }
                want_bpe /= B * (size_t)P;
            } else {
                for (int s = 0; s < 3; s++) { want_bpe += (MAIN_NTOK[s] - 1) / (BT * (size_t)P); }
            }
            if (bpe != want_bpe) { NOTE(why, "batches_per_epoch %zu, want %zu", bpe, want_bpe); }
            int* seen = (int*)malloc_or_die(bpe * BT * (size_t)P * sizeof(int));
            for (int e = 0; e < 2; e++) {
                size_t nseen = 0;
                for (size_t k = 0; k < bpe; k++) {
                    dataloader_next_batch(&ref);
                    if (rows == DL_ROWS_CONTIGUOUS && (window_id(ref.inputs, BT * (size_t)P) < 0 ||
                                                       !is_span(ref.inputs, ref.targets, BT * (size_t)P, ref.inputs[0]))) {
                        NOTE(why, "epoch %d batch %zu: the P=1 batch is not one window", e, k);
                    }
                    for (size_t row = 0; row < B * (size_t)P && rows == DL_ROWS_INDEPENDENT; row++) {
                        const int* in = ref.inputs + row * T;
                        if (window_id(in, T) < 0 || !is_span(in, ref.targets + row * T, T, in[0])) {
                            NOTE(why, "epoch %d batch %zu: row %zu of the P=1 batch is not one window of T + 1 tokens", e, k, row);
                        }
                    }
                    for (int r = 0; r < P; r++) {
                        dataloader_next_batch(&ranks[r]);
                        if (memcmp(ranks[r].inputs, ref.inputs + (size_t)r * BT, BT * sizeof(int)) != 0 ||
                            memcmp(ranks[r].targets, ref.targets + (size_t)r * BT, BT * sizeof(int)) != 0) {
                            NOTE(why, "epoch %d batch %zu: rank %d starts at token %d, want slice %d of the P=1 batch (token %d)",
                                 e, k, r, ranks[r].inputs[0], r, ref.inputs[(size_t)r * BT]);
                        }
                        if (ranks[r].epoch != (uint64_t)e) { NOTE(why, "rank %d reports epoch %llu in epoch %d", r, (unsigned long long)ranks[r].epoch, e); }
                        memcpy(seen + nseen, ranks[r].inputs, BT * sizeof(int));
                        nseen += BT;
                    }
                }
                // over one epoch no input position may be read by two ranks (or twice by one)
                qsort(seen, nseen, sizeof(int), compare_ints);
                for (size_t i = 1; i < nseen; i++) {
                    if (seen[i] == seen[i - 1]) { NOTE(why, "epoch %d: token %d read twice", e, seen[i]); break; }
                }
            }
            char name[128];
            snprintf(name, sizeof(name), "sharding (%s rows): P=%d%s, ranks' %s concatenate to the P=1 batch, disjoint",
                     DL_ROWS_NAMES[rows], P, shuffle ? " shuffled" : "", rows == DL_ROWS_INDEPENDENT ? "rows" : "slices");
            report(why[0] == '\0', name, "%s", why);
            free(seen);
            dataloader_free(&ref);
            for (int r = 0; r < P; r++) { dataloader_free(&ranks[r]); }
        }
    }
}

// the window ids of n batches of a P=1 loader with B=2, T=3
static void shuffled_order(uint64_t seed, size_t n, int* ids) {
    Job j = {g_main_pattern, 2, 3, 0, 1, 1, seed, VOCAB, 0, NULL, DL_ROWS_CONTIGUOUS};
    DataLoader l;
    open_loader(&l, &j);
    for (size_t k = 0; k < n; k++) {
        dataloader_next_batch(&l);
        ids[k] = is_span(l.inputs, l.targets, 6, l.inputs[0]) ? window_id(l.inputs, 6) : -1;
    }
    dataloader_free(&l);
}

// (c) shuffle
static void test_shuffle(void) {
    const size_t bpe = 24;
    int a[72], b[72], c[72];
    shuffled_order(42, 3 * bpe, a);
    shuffled_order(42, 3 * bpe, b);
    shuffled_order(43, 3 * bpe, c);

    for (int e = 0; e < 3; e++) {
        char why[256] = "";
        int* ids = a + (size_t)e * bpe;
        int sorted[24];
        memcpy(sorted, ids, sizeof(sorted));
        qsort(sorted, bpe, sizeof(int), compare_ints);
        size_t k = 0;
        for (int s = 0; s < 3; s++) {
            for (int w = 0; w < (int)((MAIN_NTOK[s] - 1) / 6); w++, k++) {
                if (sorted[k] != s * 10000 + w) { NOTE(why, "window (shard %d, window %d) missing or repeated (got id %d)", s, w, sorted[k]); }
            }
        }
        // the windows of a shard come together (so only one shard is ever open): 2 shard changes per epoch
        int changes = 0;
        for (k = 1; k < bpe; k++) { changes += ids[k] / 10000 != ids[k - 1] / 10000; }
        if (changes != 2) { NOTE(why, "%d shard changes within the epoch, want 2", changes); }
        char name[128];
        snprintf(name, sizeof(name), "shuffle: epoch %d visits each of the 24 windows once, shard by shard", e);
        report(why[0] == '\0', name, "%s", why);
    }
    int sequential = 1;
    for (size_t k = 0; k < bpe; k++) {
        size_t s = k < 10 ? 0 : k < 18 ? 1 : 2;
        size_t w = k < 10 ? k : k < 18 ? k - 10 : k - 18;
        if (a[k] != (int)(s * 10000 + w)) { sequential = 0; }
    }
    report(!sequential, "shuffle: epoch 0 is not the sequential order", "the shuffled epoch is in file order");
    report(memcmp(a, a + bpe, bpe * sizeof(int)) != 0 && memcmp(a + bpe, a + 2 * bpe, bpe * sizeof(int)) != 0,
           "shuffle: consecutive epochs have different orders", "epochs 0/1 or 1/2 have the same order");
    // the window order inside a shard is reshuffled every epoch too, not only the shard order
    int shard_windows[3][10];
    int differs = 0;
    for (int e = 0; e < 3; e++) {
        int n = 0;
        for (size_t k = 0; k < bpe; k++) {
            if (a[(size_t)e * bpe + k] / 10000 == 0) { shard_windows[e][n++] = a[(size_t)e * bpe + k]; }
        }
        if (e > 0 && memcmp(shard_windows[e], shard_windows[e - 1], sizeof(shard_windows[e])) != 0) { differs++; }
    }
    report(differs == 2, "shuffle: a shard's windows come in a different order in each epoch",
           "shard 0's window order repeats between consecutive epochs");
    report(memcmp(a, b, sizeof(a)) == 0, "shuffle: same seed gives the same order over 3 epochs", "two loaders with seed 42 differ");
    report(memcmp(a, c, bpe * sizeof(int)) != 0, "shuffle: different seed gives a different order", "seeds 42 and 43 give the same epoch 0");
}

// (e) resume: get_state after k batches, write it raw to a file and read it back, restore it into a fresh
// loader that has already moved elsewhere, and compare the following batches with an uninterrupted run
static int resume_matches(const Job* j, const DataLoaderState* s, const int* ref_in, const int* ref_tg,
                          const uint64_t* ref_epochs, size_t k, size_t n, char* why, size_t why_len) {
    DataLoader l;
    open_loader(&l, j);
    take(&l, 3, NULL, NULL, NULL);
    dataloader_set_state(&l, s);
    size_t BT = l.B * l.T;
    int ok = 1;
    uint64_t want_epoch = k == 0 ? 0 : ref_epochs[k - 1];
    if (l.epoch != want_epoch) {
        snprintf(why, why_len, "after restoring the state of batch %zu: epoch %llu, want %llu", k,
                 (unsigned long long)l.epoch, (unsigned long long)want_epoch);
        ok = 0;
    }
    for (size_t i = 0; i < n && ok; i++) {
        dataloader_next_batch(&l);
        if (memcmp(l.inputs, ref_in + (k + i) * BT, BT * sizeof(int)) != 0 ||
            memcmp(l.targets, ref_tg + (k + i) * BT, BT * sizeof(int)) != 0 || l.epoch != ref_epochs[k + i]) {
            snprintf(why, why_len, "resumed after %zu batches: batch %zu starts at token %d epoch %llu, uninterrupted run has %d epoch %llu",
                     k, k + i, l.inputs[0], (unsigned long long)l.epoch, ref_in[(k + i) * BT], (unsigned long long)ref_epochs[k + i]);
            ok = 0;
        }
    }
    dataloader_free(&l);
    return ok;
}

static void test_resume(void) {
    char state_path[512];
    snprintf(state_path, sizeof(state_path), "%s/state.bin", g_root);
    const Job configs[6] = {
        {g_main_pattern, 2, 3, 0, 1, 0, 5, VOCAB, 0, NULL, DL_ROWS_CONTIGUOUS},
        {g_main_pattern, 2, 3, 0, 1, 1, 5, VOCAB, 0, NULL, DL_ROWS_CONTIGUOUS},
        {g_main_pattern, 2, 3, 1, 2, 1, 5, VOCAB, 0, NULL, DL_ROWS_CONTIGUOUS},
        {g_main_pattern, 2, 3, 0, 1, 0, 5, VOCAB, 0, NULL, DL_ROWS_INDEPENDENT},
        {g_main_pattern, 2, 3, 0, 1, 1, 5, VOCAB, 0, NULL, DL_ROWS_INDEPENDENT},
        {g_main_pattern, 2, 3, 1, 2, 1, 5, VOCAB, 0, NULL, DL_ROWS_INDEPENDENT},
    };
    const char* names[6] = {"contiguous, sequential", "contiguous, shuffled", "contiguous, shuffled, rank 1 of 2",
                            "independent, sequential", "independent, shuffled", "independent, shuffled, rank 1 of 2"};
    for (int c = 0; c < 6; c++) {
        const Job* j = &configs[c];
        DataLoader ref;
        open_loader(&ref, j);
        size_t bpe = ref.batches_per_epoch, BT = ref.B * ref.T, total = 4 * bpe;
        int* ref_in = (int*)malloc_or_die(total * BT * sizeof(int));
        int* ref_tg = (int*)malloc_or_die(total * BT * sizeof(int));
        uint64_t* ref_epochs = (uint64_t*)malloc_or_die(total * sizeof(uint64_t));
        take(&ref, total, ref_in, ref_tg, ref_epochs);
        dataloader_free(&ref);

        // resume points: start, inside the first shard, at and around the epoch boundary, inside epoch 1
        const size_t ks[8] = {0, 1, 7, 10, bpe - 1, bpe, bpe + 1, 2 * bpe - 1};
        char why[512] = "";
        for (int t = 0; t < 8 && why[0] == '\0'; t++) {
            size_t k = ks[t];
            DataLoaderState s;
            state_after(j, k, &s);
            // through a file, raw, as the trainer stores it
            FILE* f = fopen_or_die(state_path, "wb");
            fwrite_or_die(&s, sizeof(s), f, state_path);
            fclose(f);
            DataLoaderState s2;
            f = fopen_or_die(state_path, "rb");
            fread_or_die(&s2, sizeof(s2), f, state_path);
            fclose(f);
            resume_matches(j, &s2, ref_in, ref_tg, ref_epochs, k, bpe + 2, why, sizeof(why));
        }
        char name[160];
        snprintf(name, sizeof(name), "resume (%s): restored loaders continue identically, across the epoch boundary", names[c]);
        report(why[0] == '\0', name, "%s", why);

        // negative control: the same comparison against a deliberately wrong state must find a difference
        // (one batch back in the sequential case; one epoch ahead, i.e. another permutation, when shuffled)
        DataLoaderState wrong;
        state_after(j, 7, &wrong);
        if (j->shuffle) { wrong.epoch += 1; } else { wrong.window_pos -= j->rows == DL_ROWS_INDEPENDENT ? j->B * (size_t)j->P : 1; }
        char why_wrong[512] = "";
        int matched = resume_matches(j, &wrong, ref_in, ref_tg, ref_epochs, 7, bpe + 2, why_wrong, sizeof(why_wrong));
        snprintf(name, sizeof(name), "negative control (%s): resuming from a wrong state is reported as different", names[c]);
        report(!matched, name, "the comparison found no difference");
        free(ref_in);
        free(ref_tg);
        free(ref_epochs);
    }
    remove(state_path);
}

// A run resumed on another number of processes (GPUs), or with another B: the state of a P = 1, B = 2 loader
// after k batches restores loaders of P ranks with B rows each. Independent rows go on exactly: the ranks' rows of
// each batch are the next B*P rows of the uninterrupted single-process stream. Contiguous rows with the same B*P
// go on exactly too; with another B*P the current shard restarts at its first window.
static int regrouped_rows_match(const Job* one, size_t k, size_t B, int P, const DataLoaderState* s, char* why, size_t why_len) {
    DataLoader ref;
    open_loader(&ref, one);
    take(&ref, k, NULL, NULL, NULL);
    size_t T = one->T, rows = 0, batches = 6;
    int* want = (int*)malloc_or_die(batches * B * P * T * sizeof(int));  // the next rows of the single stream
    while (rows < batches * B * P) {
        dataloader_next_batch(&ref);
        memcpy(want + rows * T, ref.inputs, one->B * T * sizeof(int));
        rows += one->B;
    }
    dataloader_free(&ref);
    int ok = 1;
    for (int r = 0; r < P && ok; r++) {
        Job j = *one;
        j.B = B; j.P = P; j.rank = r;
        DataLoader l;
        open_loader(&l, &j);
        dataloader_set_state(&l, s);
        for (size_t b = 0; b < batches && ok; b++) {
            dataloader_next_batch(&l);
            const int* w = want + (b * P + (size_t)r) * B * T;
            if (memcmp(l.inputs, w, B * T * sizeof(int)) != 0) {
                snprintf(why, why_len, "B=%zu P=%d rank %d, batch %zu after resuming at %zu: first token %d, the single stream has %d",
                         B, P, r, b, k, l.inputs[0], w[0]);
                ok = 0;
            }
        }
        dataloader_free(&l);
    }
    free(want);
    return ok;
}

static void test_resume_other_ranks(void) {
    const Job single[2] = {
        {g_main_pattern, 2, 3, 0, 1, 1, 5, VOCAB, 0, NULL, DL_ROWS_INDEPENDENT},
        {g_main_pattern, 2, 3, 0, 1, 0, 5, VOCAB, 0, NULL, DL_ROWS_CONTIGUOUS},
    };
    struct { int job; size_t B; int P; const char* name; } cases[4] = {
        {0, 1, 2, "independent rows, B=2 on 1 rank -> B=1 on 2 ranks: the stream goes on exactly"},
        {0, 2, 2, "independent rows, B=2 on 1 rank -> B=2 on 2 ranks: the stream goes on exactly"},
        {0, 3, 1, "independent rows, B=2 -> B=3 on 1 rank: the stream goes on exactly"},
        {1, 1, 2, "contiguous rows, B=2 on 1 rank -> B=1 on 2 ranks (the same B*P): the stream goes on exactly"},
    };
    for (int c = 0; c < 4; c++) {
        const Job* one = &single[cases[c].job];
        char why[512] = "";
        const size_t ks[3] = {0, 3, 11};
        for (int t = 0; t < 3 && why[0] == '\0'; t++) {
            DataLoaderState s;
            state_after(one, ks[t], &s);
            regrouped_rows_match(one, ks[t], cases[c].B, cases[c].P, &s, why, sizeof(why));
        }
        report(why[0] == '\0', cases[c].name, "%s", why);
        if (c == 0) {  // negative control: a state one row off is found out
            DataLoaderState wrong;
            state_after(one, 3, &wrong);
            wrong.window_pos += one->B;
            char why_wrong[512] = "";
            int matched = regrouped_rows_match(one, 3, cases[c].B, cases[c].P, &wrong, why_wrong, sizeof(why_wrong));
            report(!matched, "negative control: a regrouped resume from a state one batch off is reported as different",
                   "the comparison found no difference");
        }
    }
    // contiguous rows, another B*P: the current shard restarts at its first window (no shuffle: token 0 of it)
    DataLoaderState s;
    state_after(&single[1], 3, &s);
    Job j = single[1];
    j.B = 2; j.P = 2;
    DataLoader l;
    open_loader(&l, &j);
    dataloader_set_state(&l, &s);
    dataloader_next_batch(&l);
    size_t shard = (size_t)s.shard_pos;
    report(l.inputs[0] == (int)(shard * STRIDE) && l.shard_pos == shard,
           "contiguous rows, B*P 2 -> 4: the current shard restarts at its first window",
           "first token %d of shard position %zu, want token %d of shard %zu", l.inputs[0], l.shard_pos, (int)(shard * STRIDE), shard);
    dataloader_free(&l);
}

// window count at the edge: a shard of exactly k*B*T tokens has only k-1 windows, because the last
// window's final target would be token k*B*T, one past the end
static void test_exact_multiple(void) {
    char dir[512], pattern[600];
    snprintf(dir, sizeof(dir), "%s/multiple", g_root);
    make_dir(dir);
    write_dataset_shard(dir, 0, 18, 2, 0, STRIDE);
    write_dataset_shard(dir, 1, 19, 2, 0, STRIDE);
    snprintf(pattern, sizeof(pattern), "%s/d_*.bin", dir);
    Job j = {pattern, 2, 3, 0, 1, 0, 0, VOCAB, 0, NULL, DL_ROWS_CONTIGUOUS};
    DataLoader l;
    open_loader(&l, &j);
    char why[256] = "";
    if (l.batches_per_epoch != 5) { NOTE(why, "batches_per_epoch %zu, want 2 + 3", l.batches_per_epoch); }
    const int firsts[6] = {0, 6, STRIDE, STRIDE + 6, STRIDE + 12, 0};
    for (int k = 0; k < 6; k++) {
        dataloader_next_batch(&l);
        if (!is_span(l.inputs, l.targets, 6, firsts[k])) { NOTE(why, "batch %d: inputs[0] %d, want %d", k, l.inputs[0], firsts[k]); }
    }
    report(why[0] == '\0', "sequential: shards of 18 and 19 tokens give 2 and 3 windows of 6+1 tokens", "%s", why);
    dataloader_free(&l);
}

// (f) uint32 shards, and a mix of both kinds
static void test_uint32(void) {
    char dir[512], pattern[600];
    snprintf(dir, sizeof(dir), "%s/u32", g_root);
    make_dir(dir);
    write_dataset_shard(dir, 0, 41, 4, U32_BASE, U32_STRIDE);
    write_dataset_shard(dir, 1, 30, 4, U32_BASE, U32_STRIDE);
    snprintf(pattern, sizeof(pattern), "%s/d_*.bin", dir);
    Job j = {pattern, 2, 4, 0, 1, 0, 0, U32_VOCAB, 0, NULL, DL_ROWS_CONTIGUOUS};
    DataLoader l;
    open_loader(&l, &j);
    char why[256] = "";
    if (l.num_tokens != 71 || l.batches_per_epoch != 8) {
        NOTE(why, "num_tokens %zu (want 71), batches_per_epoch %zu (want 8)", l.num_tokens, l.batches_per_epoch);
    }
    for (int s = 0; s < 2; s++) {
        int windows = s == 0 ? 5 : 3;
        for (int w = 0; w < windows; w++) {
            dataloader_next_batch(&l);
            int first = U32_BASE + s * U32_STRIDE + w * 8;
            if (!is_span(l.inputs, l.targets, 8, first)) {
                NOTE(why, "shard %d window %d: inputs[0] %d, want %d", s, w, l.inputs[0], first);
            }
        }
    }
    report(why[0] == '\0', "uint32: exact tokens (ids above 65535) of a whole epoch", "%s", why);
    dataloader_free(&l);

    snprintf(dir, sizeof(dir), "%s/mixed", g_root);
    make_dir(dir);
    write_dataset_shard(dir, 0, 25, 2, 0, STRIDE);
    write_dataset_shard(dir, 1, 25, 4, 0, STRIDE);
    snprintf(pattern, sizeof(pattern), "%s/d_*.bin", dir);
    Job jm = {pattern, 2, 3, 0, 1, 0, 0, VOCAB, 0, NULL, DL_ROWS_CONTIGUOUS};
    open_loader(&l, &jm);
    why[0] = '\0';
    for (int k = 0; k < 8; k++) {
        dataloader_next_batch(&l);
        int first = (k / 4) * STRIDE + (k % 4) * 6;
        if (!is_span(l.inputs, l.targets, 6, first)) { NOTE(why, "batch %d: inputs[0] %d, want %d", k, l.inputs[0], first); }
    }
    report(why[0] == '\0', "uint32: a uint16 and a uint32 shard in one data set", "%s", why);
    dataloader_free(&l);
}

// 64-bit offsets: a sparse uint32 shard of 2^30 + 1 tokens (4 GiB + 1028 bytes on paper, a few KiB on disk).
// Jump straight to its last window with set_state and check the tokens written there, past byte 2^32.
static void test_large_offsets(void) {
    char dir[512], path[600], pattern[600];
    snprintf(dir, sizeof(dir), "%s/large", g_root);
    make_dir(dir);
    snprintf(path, sizeof(path), "%s/d_000000.bin", dir);
    snprintf(pattern, sizeof(pattern), "%s/d_*.bin", dir);
    const uint32_t ntok = (1u << 30) + 1;
    const size_t B = 64, T = 1024, BT = B * T;                // 16384 windows of 65536 tokens
    const size_t last_window = (ntok - 1) / BT - 1;
    const size_t first = last_window * BT;                    // first token of the last window
    write_raw_shard(path, DL_MAGIC_U32, DL_VERSION_U32, ntok, NULL, 0, 4, 0);
    FILE* f = fopen_or_die(path, "r+b");
    if (ftruncate(fileno(f), (off_t)DL_HEADER_BYTES + (off_t)ntok * 4) != 0) {
        die("%s: cannot extend to 4 GiB (%s)", path, strerror(errno));
    }
    // the last window's BT + 1 tokens: 1000 + i
    uint32_t* t = ramp(BT + 1, 1000);
    unsigned char* bytes = (unsigned char*)malloc_or_die((BT + 1) * 4);
    for (size_t i = 0; i <= BT; i++) { put_le32(bytes + 4 * i, t[i]); }
    if (fseeko(f, (off_t)DL_HEADER_BYTES + (off_t)first * 4, SEEK_SET) != 0) { die("%s: seek failed", path); }
    fwrite_or_die(bytes, (BT + 1) * 4, f, path);
    fclose(f);
    free(bytes);
    free(t);

    Job j = {pattern, B, T, 0, 1, 0, 0, U32_VOCAB, 0, NULL, DL_ROWS_CONTIGUOUS};
    DataLoader l;
    open_loader(&l, &j);
    DataLoaderState s;
    dataloader_get_state(&l, &s);
    s.window_pos = last_window;
    dataloader_set_state(&l, &s);
    dataloader_next_batch(&l);
    report(l.batches_per_epoch == 16384 && is_span(l.inputs, l.targets, BT, 1000),
           "64-bit offsets: last window of a 4 GiB uint32 shard (byte offset > 2^32)",
           "batches_per_epoch %zu (want 16384), inputs[0] %d targets[last] %d (want 1000, %d)",
           l.batches_per_epoch, l.inputs[0], l.targets[BT - 1], 1000 + (int)BT);
    // and the next batch wraps to the (all-zero) first window
    dataloader_next_batch(&l);
    report(l.epoch == 1 && l.inputs[0] == 0 && l.targets[BT - 1] == 0, "64-bit offsets: wrap-around after the last window",
           "epoch %llu, inputs[0] %d", (unsigned long long)l.epoch, l.inputs[0]);
    dataloader_free(&l);
    // independent rows of T + 1 tokens: 2^20 windows; the last one starts at token 2^30 - T = first + BT - T
    j.B = 1;
    j.rows = DL_ROWS_INDEPENDENT;
    open_loader(&l, &j);
    dataloader_get_state(&l, &s);
    s.window_pos = l.num_windows - 1;
    dataloader_set_state(&l, &s);
    dataloader_next_batch(&l);
    report(l.batches_per_epoch == (1u << 20) && is_span(l.inputs, l.targets, T, 1000 + (int)(BT - T)),
           "64-bit offsets: independent rows, the last row of the 4 GiB shard",
           "batches_per_epoch %zu (want 2^20), inputs[0] %d (want %d)", l.batches_per_epoch, l.inputs[0], 1000 + (int)(BT - T));
    dataloader_free(&l);
    remove(path);
}

// ----------------------------------------------------------------------------------------------------------
// independent rows (--rows independent): a row is a window of T + 1 tokens; the windows of all shards are
// permuted per epoch by dl_permute_. On the main data set with T = 3: 20 + 16 + 12 = 48 windows.

// is perm(., n, key) a bijection of [0, n)? Returns 1, or 0 with the first value hit twice or out of range in why.
typedef uint64_t (*PermuteFn)(uint64_t i, uint64_t n, uint64_t key);
static int is_bijection(PermuteFn perm, uint64_t n, uint64_t key, char* why, size_t why_len) {
    unsigned char* hit = (unsigned char*)calloc_or_die((size_t)n, 1);
    int ok = 1;
    for (uint64_t i = 0; i < n && ok; i++) {
        uint64_t x = perm(i, n, key);
        if (x >= n) { snprintf(why, why_len, "n=%llu: position %llu -> %llu, out of range", (unsigned long long)n, (unsigned long long)i, (unsigned long long)x); ok = 0; }
        else if (hit[x]) { snprintf(why, why_len, "n=%llu: window %llu visited twice (again at position %llu)", (unsigned long long)n, (unsigned long long)x, (unsigned long long)i); ok = 0; }
        else { hit[x] = 1; }
    }
    free(hit);
    return ok;
}

// the negative control: the Feistel network once over its 2^2h domain, folded into [0, n) by a modulo instead of
// cycle walking. It stays in range, but it is not a bijection whenever n is not a power of 4.
static uint64_t folded_permute(uint64_t i, uint64_t n, uint64_t key) {
    uint64_t domain = 4;
    while (domain < n) { domain *= 4; }
    return dl_permute_(i, domain, key) % n;
}

// the window ids (see window_id) of every row of n batches of an independent-rows loader on the main data set
static void independent_order(size_t B, int shuffle, uint64_t seed, size_t n, int* ids, char* why, size_t why_len) {
    Job j = {g_main_pattern, B, 3, 0, 1, shuffle, seed, VOCAB, 0, NULL, DL_ROWS_INDEPENDENT};
    DataLoader l;
    open_loader(&l, &j);
    for (size_t k = 0; k < n; k++) {
        dataloader_next_batch(&l);
        for (size_t r = 0; r < B; r++) {
            const int* in = l.inputs + r * 3;
            int ok = is_span(in, l.targets + r * 3, 3, in[0]);
            ids[k * B + r] = ok ? window_id(in, 3) : -1;
            if ((!ok || ids[k * B + r] < 0) && why[0] == '\0') {
                snprintf(why, why_len, "batch %zu row %zu is not a window of T + 1 tokens (inputs[0] %d)", k, r, in[0]);
            }
        }
    }
    dataloader_free(&l);
}

// the window id of window g of all 48 (shard by shard)
static int main_window_id(int g) {
    return g < 20 ? g : g < 36 ? 10000 + (g - 20) : 20000 + (g - 36);
}

static void test_independent(void) {
    // the permutation alone: a bijection of [0, n) for sizes around the Feistel widths (n = 4^h exactly, one
    // above, one below) and a prime, for several keys; and not the identity
    const uint64_t sizes[] = {1, 2, 3, 4, 5, 15, 16, 17, 48, 1000, 4095, 4096, 4097, 65537, 100003};
    char why[512] = "";
    int identity = 1;
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]) && why[0] == '\0'; s++) {
        for (uint64_t key = 0; key < 4 && why[0] == '\0'; key++) {
            is_bijection(dl_permute_, sizes[s], dl_stream_seed_(key, 0, UINT64_MAX), why, sizeof(why));
        }
    }
    for (uint64_t i = 0; i < 1000; i++) { identity &= dl_permute_(i, 1000, 99) == i; }
    report(why[0] == '\0' && !identity, "independent: dl_permute_ is a bijection of [0, n) for 15 sizes x 4 keys, not the identity",
           "%s%s", why, identity ? "the identity" : "");
    // negative control: the same check finds that folding instead of cycle walking breaks the bijection
    char why_broken[512] = "";
    int broken_passes = is_bijection(folded_permute, 1000, 99, why_broken, sizeof(why_broken));
    report(!broken_passes, "negative control: the bijection check rejects a folded (modulo) Feistel permutation",
           "the broken permutation passed");

    // sequential (no shuffle): batch k holds windows 2k and 2k+1 of all 48, across shard boundaries
    int ids[4 * 48];
    why[0] = '\0';
    independent_order(2, 0, 0, 24, ids, why, sizeof(why));
    for (int g = 0; g < 48; g++) {
        if (ids[g] != main_window_id(g)) { NOTE(why, "row %d is window %d, want %d", g, ids[g], main_window_id(g)); }
    }
    report(why[0] == '\0', "independent: without shuffle, rows are the 48 windows of T + 1 tokens in order", "%s", why);

    // shuffled, B = 2 (48 = 24 batches x 2): every window once per epoch, a new order every epoch
    why[0] = '\0';
    independent_order(2, 1, 42, 4 * 24, ids, why, sizeof(why));
    int in_order = 0, consecutive = 0;
    for (int e = 0; e < 4; e++) {
        int sorted[48];
        memcpy(sorted, ids + e * 48, sizeof(sorted));
        qsort(sorted, 48, sizeof(int), compare_ints);
        for (int g = 0; g < 48; g++) {
            if (sorted[g] != main_window_id(g)) { NOTE(why, "epoch %d: window %d missing or repeated", e, main_window_id(g)); }
        }
        for (int g = 0; g < 48; g++) { in_order += ids[e * 48 + g] == main_window_id(g); }
        for (int k = 0; k < 24; k++) { consecutive += ids[e * 48 + 2 * k + 1] == ids[e * 48 + 2 * k] + 1; }
        if (e > 0 && memcmp(ids + e * 48, ids + (e - 1) * 48, 48 * sizeof(int)) == 0) { NOTE(why, "epochs %d and %d have the same order", e - 1, e); }
    }
    report(why[0] == '\0', "independent: shuffled, each epoch visits each of the 48 windows once, in a new order", "%s", why);
    // a uniformly random order puts about 1 of 48 windows in place and about 1 of 24 batches on two consecutive
    // windows per epoch; llm.c's layout would have every batch consecutive
    report(in_order <= 12 && consecutive <= 12, "independent: shuffled rows are not in file order and a batch's two rows are not neighbours",
           "over 4 epochs %d of 192 windows in place, %d of 96 batches with consecutive rows", in_order, consecutive);
    int again[4 * 48], other[4 * 48];
    char ignore[512] = "";
    independent_order(2, 1, 42, 4 * 24, again, ignore, sizeof(ignore));
    independent_order(2, 1, 43, 24, other, ignore, sizeof(ignore));
    report(memcmp(ids, again, sizeof(again)) == 0, "independent: same seed gives the same order over 4 epochs", "two loaders with seed 42 differ");
    report(memcmp(ids, other, 48 * sizeof(int)) != 0, "independent: different seed gives a different order", "seeds 42 and 43 give the same epoch 0");

    // B = 5: 48 = 9 batches x 5 + 3 windows left over; an epoch has 45 distinct windows, and the ones left over
    // change with the epoch, so over 8 epochs every window is used
    {
        Job j = {g_main_pattern, 5, 3, 0, 1, 1, 42, VOCAB, 0, NULL, DL_ROWS_INDEPENDENT};
        DataLoader l;
        open_loader(&l, &j);
        why[0] = '\0';
        if (l.batches_per_epoch != 9) { NOTE(why, "batches_per_epoch %zu, want 9", l.batches_per_epoch); }
        dataloader_free(&l);
        int* many = (int*)malloc_or_die(8 * 45 * sizeof(int));
        independent_order(5, 1, 42, 8 * 9, many, why, sizeof(why));
        int used[3][20] = {{0}};
        for (int e = 0; e < 8; e++) {
            int sorted[45];
            memcpy(sorted, many + e * 45, sizeof(sorted));
            qsort(sorted, 45, sizeof(int), compare_ints);
            for (int i = 1; i < 45; i++) { if (sorted[i] == sorted[i - 1]) { NOTE(why, "epoch %d: window %d twice", e, sorted[i]); } }
            for (int i = 0; i < 45; i++) { used[sorted[i] / 10000][sorted[i] % 10000] = 1; }
        }
        int unused = 0;
        for (int g = 0; g < 48; g++) { unused += !used[main_window_id(g) / 10000][main_window_id(g) % 10000]; }
        if (unused > 0) { NOTE(why, "%d windows never used in 8 epochs", unused); }
        report(why[0] == '\0', "independent: B=5 over 48 windows, 9 batches of distinct windows per epoch, the 3 left over vary", "%s", why);
        free(many);
    }

    // more shards than the loader keeps open (70 > DL_MAX_OPEN_SHARDS): two epochs read every window of every shard
    {
        char dir[512], pattern[600];
        snprintf(dir, sizeof(dir), "%s/many", g_root);
        make_dir(dir);
        // uint32 tokens: shard 69 holds ids from 69 * STRIDE = 138000
        for (int s = 0; s < 70; s++) { write_dataset_shard(dir, s, 7, 4, 0, STRIDE); }  // 2 windows of T + 1 = 4 each
        snprintf(pattern, sizeof(pattern), "%s/d_*.bin", dir);
        Job j = {pattern, 4, 3, 0, 1, 1, 1, 70 * STRIDE, 0, NULL, DL_ROWS_INDEPENDENT};
        DataLoader l;
        open_loader(&l, &j);
        why[0] = '\0';
        for (int e = 0; e < 2; e++) {
            int seen[140];
            for (size_t k = 0; k < l.batches_per_epoch; k++) {
                dataloader_next_batch(&l);
                for (int r = 0; r < 4; r++) { seen[k * 4 + (size_t)r] = window_id(l.inputs + r * 3, 3); }
                if (l.open_files > DL_MAX_OPEN_SHARDS) { NOTE(why, "%zu shards open", l.open_files); }
            }
            qsort(seen, 140, sizeof(int), compare_ints);
            for (int i = 0; i < 140; i++) {
                if (seen[i] != (i / 2) * 10000 + i % 2) { NOTE(why, "epoch %d: window %d missing or repeated", e, (i / 2) * 10000 + i % 2); }
            }
        }
        report(why[0] == '\0' && l.batches_per_epoch == 35, "independent: 70 shards (more than are kept open), every window once per epoch",
               "%s (batches_per_epoch %zu, want 35)", why, l.batches_per_epoch);
        dataloader_free(&l);
    }
}

// ----------------------------------------------------------------------------------------------------------
// (g) errors, each in a child process

static void run_job(const Job* j) {
    DataLoader l;
    open_loader(&l, j);
    if (j->state != NULL) { dataloader_set_state(&l, j->state); }
    for (size_t k = 0; k < j->batches; k++) { dataloader_next_batch(&l); }
    dataloader_free(&l);
}

// run the job in a child with stderr captured; returns 1 if it exited with code 1 after printing exactly one
// line that starts with `prefix` and contains `must` (when not NULL); otherwise 0 with the reason in why
static int dies_with(const Job* j, const char* prefix, const char* must, char* why, size_t why_len) {
    int fds[2];
    if (pipe(fds) != 0) { die("pipe failed (%s)", strerror(errno)); }
    fflush(stdout);  // or the child's exit would print our buffered output a second time
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) { die("fork failed (%s)", strerror(errno)); }
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        close(fds[1]);
        run_job(j);
        exit(0);
    }
    close(fds[1]);
    char msg[4096];
    size_t len = 0;
    for (;;) {
        ssize_t got = read(fds[0], msg + len, sizeof(msg) - 1 - len);
        if (got < 0 && errno == EINTR) { continue; }
        if (got <= 0) { break; }
        len += (size_t)got;
        if (len == sizeof(msg) - 1) { break; }
    }
    msg[len] = '\0';
    close(fds[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) { die("waitpid failed (%s)", strerror(errno)); }
    }
    // strip the one newline for the report
    char* nl = strchr(msg, '\n');
    int one_line = nl != NULL && nl[1] == '\0';
    if (nl != NULL) { *nl = '\0'; }
    if (!WIFEXITED(status)) { snprintf(why, why_len, "child killed by signal %d; stderr: %s", WTERMSIG(status), msg); return 0; }
    if (WEXITSTATUS(status) != 1) { snprintf(why, why_len, "exit code %d, want 1; stderr: %s", WEXITSTATUS(status), msg); return 0; }
    if (!one_line) { snprintf(why, why_len, "stderr is not exactly one line: %s", msg); return 0; }
    if (strncmp(msg, prefix, strlen(prefix)) != 0) { snprintf(why, why_len, "message does not start with '%s': %s", prefix, msg); return 0; }
    if (must != NULL && strstr(msg, must) == NULL) { snprintf(why, why_len, "message lacks '%s': %s", must, msg); return 0; }
    return 1;
}

static void expect_death(const char* name, const Job* j, const char* prefix, const char* must) {
    char why[4600] = "";
    int ok = dies_with(j, prefix, must, why, sizeof(why));
    report(ok, name, "%s", why);
}

// a directory dir/bad_<tag> holding a good shard d_000000.bin (61 tokens); the caller adds the bad
// d_000001.bin at *bad_path. The bad shard is the second one, so the tests also show that init checks them all.
static void bad_case(const char* tag, char* dir, char* pattern, char* bad_path, char* prefix) {
    snprintf(dir, 512, "%s/bad_%s", g_root, tag);
    make_dir(dir);
    write_dataset_shard(dir, 0, 61, 2, 0, STRIDE);
    snprintf(pattern, 600, "%s/d_*.bin", dir);
    snprintf(bad_path, 600, "%s/d_000001.bin", dir);
    snprintf(prefix, 700, "error: %s: ", bad_path);
}

static void test_errors(void) {
    char dir[512], pattern[600], bad[600], prefix[700], must[256];
    uint32_t* good = ramp(61, STRIDE);
    Job j = {NULL, 2, 3, 0, 1, 0, 0, VOCAB, 0, NULL, DL_ROWS_CONTIGUOUS};

    // no match
    char nomatch[600], nomatch_prefix[700];
    snprintf(nomatch, sizeof(nomatch), "%s/main/nothing_*.bin", g_root);
    snprintf(nomatch_prefix, sizeof(nomatch_prefix), "error: %s: ", nomatch);
    j.pattern = nomatch;
    expect_death("error: empty glob", &j, nomatch_prefix, "no files match");

    // a missing file: a dangling symlink matches the glob but cannot be opened
    bad_case("missing", dir, pattern, bad, prefix);
    char target[600];
    snprintf(target, sizeof(target), "%s/does_not_exist.bin", dir);
    if (symlink(target, bad) != 0) { die("%s: symlink failed (%s)", bad, strerror(errno)); }
    j.pattern = pattern;
    expect_death("error: missing file (dangling symlink)", &j, prefix, "cannot open");

    // unreadable: a directory named like a shard (works as root too), and a mode-000 file when not root
    bad_case("directory", dir, pattern, bad, prefix);
    make_dir(bad);
    expect_death("error: unreadable shard (a directory)", &j, prefix, "not a regular file");
    if (geteuid() != 0) {
        bad_case("noperm", dir, pattern, bad, prefix);
        write_shard(bad, good, 61, 2);
        chmod(bad, 0);
        expect_death("error: unreadable shard (mode 000)", &j, prefix, "cannot open");
    }

    bad_case("magic", dir, pattern, bad, prefix);
    write_raw_shard(bad, 12345678, 1, 61, good, 61, 2, 0);
    expect_death("error: wrong magic", &j, prefix, "bad magic 12345678");

    bad_case("version16", dir, pattern, bad, prefix);
    write_raw_shard(bad, DL_MAGIC_U16, 7, 61, good, 61, 2, 0);
    expect_death("error: wrong version (uint16 magic, version 7)", &j, prefix, "version 7");

    bad_case("version32", dir, pattern, bad, prefix);
    write_raw_shard(bad, DL_MAGIC_U32, 1, 61, good, 61, 4, 0);
    expect_death("error: wrong version (uint32 magic, version 1)", &j, prefix, "version 1");

    bad_case("header", dir, pattern, bad, prefix);
    {
        FILE* f = fopen_or_die(bad, "wb");
        unsigned char junk[100];
        memset(junk, 0, sizeof(junk));
        fwrite_or_die(junk, sizeof(junk), f, bad);
        fclose(f);
    }
    expect_death("error: file shorter than the header", &j, prefix, "100 bytes");

    // header says 61 tokens = 1146 bytes, only 60 are there
    bad_case("truncated", dir, pattern, bad, prefix);
    write_raw_shard(bad, DL_MAGIC_U16, 1, 61, good, 60, 2, 0);
    expect_death("error: truncated payload", &j, prefix, "should be 1146 bytes, but it is 1144");

    bad_case("extra", dir, pattern, bad, prefix);
    write_raw_shard(bad, DL_MAGIC_U16, 1, 61, good, 61, 2, 3);
    expect_death("error: extra bytes after the payload", &j, prefix, "3 extra bytes");

    // P = 2: one batch needs 2*3*2 + 1 = 13 tokens, the bad shard has 12
    bad_case("short", dir, pattern, bad, prefix);
    write_shard(bad, good, 12, 2);
    Job jp = j;
    jp.P = 2;
    jp.rank = 1;
    expect_death("error: shard too short for B*T*P+1 tokens", &jp, prefix, "12 tokens, but one batch needs B*T*processes + 1 = 2*3*2 + 1 = 13");

    // token ids: found when read, with the byte offset of the bad token
    Job jr = j;
    jr.batches = 100;
    bad_case("token16", dir, pattern, bad, prefix);
    {
        uint32_t* t = ramp(61, STRIDE);
        t[17] = VOCAB;  // byte offset 1024 + 17*2
        write_shard(bad, t, 61, 2);
        free(t);
    }
    expect_death("error: token id >= vocab (uint16)", &jr, prefix, "token id 50257 at byte offset 1058 is >= vocab size 50257");

    bad_case("token_target", dir, pattern, bad, prefix);
    {
        uint32_t* t = ramp(61, STRIDE);
        t[60] = 60000;  // the very last token, only ever a target; byte offset 1024 + 60*2
        write_shard(bad, t, 61, 2);
        free(t);
    }
    expect_death("error: token id >= vocab in a target-only position", &jr, prefix, "token id 60000 at byte offset 1144");

    bad_case("token32", dir, pattern, bad, prefix);
    {
        uint32_t* t = ramp(41, STRIDE);
        t[9] = 4000000000u;  // byte offset 1024 + 9*4
        write_shard(bad, t, 41, 4);
        free(t);
    }
    expect_death("error: token id >= vocab (uint32)", &jr, prefix, "token id 4000000000 at byte offset 1060 is >= vocab size 50257");

    // negative control: the same death check on a healthy data set must fail
    {
        Job jok = {g_main_pattern, 2, 3, 0, 1, 0, 0, VOCAB, 30, NULL, DL_ROWS_CONTIGUOUS};
        char why[4600] = "";
        int died = dies_with(&jok, "error: ", NULL, why, sizeof(why));
        report(!died, "negative control: the error check fails on a healthy data set", "it reported a healthy run as an error");
    }

    // set_state with a state that does not fit: saved by a shuffled B=2 T=3 P=1 loader after 5 batches
    DataLoaderState s;
    Job js = {g_main_pattern, 2, 3, 0, 1, 1, 42, VOCAB, 0, NULL, DL_ROWS_CONTIGUOUS};
    state_after(&js, 5, &s);
    char main_prefix[700];
    snprintf(main_prefix, sizeof(main_prefix), "error: %s: ", g_main_pattern);
    js.state = &s;
    {
        char why[4600] = "";
        Job jfit = js;
        jfit.batches = 3;
        int died = dies_with(&jfit, "error: ", NULL, why, sizeof(why));
        report(!died, "set_state: a fitting state is accepted", "%s", why);
    }
    Job jx = js; jx.T = 4;
    expect_death("error: set_state with a different T", &jx, main_prefix, "T = 3 in the state, 4 now");
    jx = js; jx.shuffle = 0;
    expect_death("error: set_state with a different shuffle flag", &jx, main_prefix, "shuffle = 1 in the state, 0 now");
    jx = js; jx.seed = 43;
    expect_death("error: set_state with a different seed", &jx, main_prefix, "seed = 42 in the state, 43 now");
    // two of the three shards
    char two[600], two_prefix[700];
    snprintf(two, sizeof(two), "%s/main/d_00000[01].bin", g_root);
    snprintf(two_prefix, sizeof(two_prefix), "error: %s: ", two);
    jx = js; jx.pattern = two;
    expect_death("error: set_state with a different number of shards", &jx, two_prefix, "3 shards in the state, 2 match now");
    // same number of shards, other sizes
    snprintf(dir, sizeof(dir), "%s/other", g_root);
    make_dir(dir);
    for (int i = 0; i < 3; i++) { write_dataset_shard(dir, i, 40, 2, 0, STRIDE); }
    snprintf(pattern, sizeof(pattern), "%s/d_*.bin", dir);
    snprintf(prefix, sizeof(prefix), "error: %s: ", pattern);
    jx = js; jx.pattern = pattern;
    expect_death("error: set_state with other shards of the same count", &jx, prefix, "148 tokens in the state, 120 in the shards now");
    DataLoaderState bad_state = s;
    bad_state.shard_pos = 3;
    jx = js; jx.state = &bad_state;
    expect_death("error: set_state with a shard position out of range", &jx, main_prefix, "shard position 3");
    bad_state = s;
    bad_state.window_pos = 11;
    snprintf(must, sizeof(must), "window position 11");
    expect_death("error: set_state with a window position out of range", &jx, main_prefix, must);
    bad_state = s;
    bad_state.magic = 0;
    expect_death("error: set_state with a state that is not one", &jx, main_prefix, "not valid");

    // --rows: a contiguous state does not fit an independent loader, and the error says how to resume it
    jx = js; jx.rows = DL_ROWS_INDEPENDENT;
    expect_death("error: set_state with the other rows layout", &jx, main_prefix,
                 "rows = contiguous in the state, independent now (resume it with --rows contiguous)");
    // a version 1 state (before --rows; shuffle was a uint32, whose high half is now rows) is a contiguous one
    DataLoaderState v1 = s;
    v1.version = 1;
    {
        char why[4600] = "";
        Job jfit = js;
        jfit.state = &v1;
        jfit.batches = 3;
        int died = dies_with(&jfit, "error: ", NULL, why, sizeof(why));
        report(!died, "set_state: a version 1 state resumes a contiguous loader", "%s", why);
    }
    jx = js; jx.rows = DL_ROWS_INDEPENDENT; jx.state = &v1;
    expect_death("error: set_state of a version 1 state into an independent loader", &jx, main_prefix, "resume it with --rows contiguous");
    // an independent state: its position is a multiple of B*P windows, its shard position 0
    DataLoaderState si;
    Job jis = {g_main_pattern, 2, 3, 0, 1, 1, 42, VOCAB, 3, NULL, DL_ROWS_INDEPENDENT};
    state_after(&jis, 5, &si);
    jis.state = &bad_state;
    bad_state = si;
    bad_state.window_pos = 11;
    expect_death("error: set_state (independent) with a window position inside a batch", &jis, main_prefix,
                 "window position 11, but an epoch is 48 windows taken B*processes = 2 at a time");
    bad_state = si;
    bad_state.window_pos = 50;
    expect_death("error: set_state (independent) with a window position past the epoch", &jis, main_prefix, "window position 50");
    bad_state = si;
    bad_state.shard_pos = 1;
    expect_death("error: set_state (independent) with a shard position", &jis, main_prefix, "shard position 1");

    // independent rows need T + 1 tokens per shard and B*P windows in all
    bad_case("short_row", dir, pattern, bad, prefix);
    write_shard(bad, good, 3, 2);
    Job jrow = j;
    jrow.pattern = pattern;
    jrow.rows = DL_ROWS_INDEPENDENT;
    expect_death("error: independent rows, a shard shorter than T + 1 tokens", &jrow, prefix, "3 tokens, but one row needs T + 1 = 4");
    Job jfew = {g_main_pattern, 50, 3, 0, 1, 1, 42, VOCAB, 0, NULL, DL_ROWS_INDEPENDENT};
    expect_death("error: independent rows, fewer windows than one batch has rows", &jfew, main_prefix,
                 "48 rows of T + 1 = 4 tokens in all shards, but one batch needs B*processes = 50*1 rows");
    free(good);
}

// if the loader kills this process (a bug that die()s in a check that should pass), still remove the
// temporary directory; the forked children exit through here as well, and must leave it alone
static pid_t g_main_pid;
static void cleanup_at_exit(void) {
    if (getpid() == g_main_pid) { remove_tree(g_root); }
}

int main(void) {
    snprintf(g_root, sizeof(g_root), "/tmp/test_dataloader_XXXXXX");
    if (mkdtemp(g_root) == NULL) { die("/tmp: cannot create a temporary directory (%s)", strerror(errno)); }
    g_main_pid = getpid();
    atexit(cleanup_at_exit);
    char main_dir[512];
    snprintf(main_dir, sizeof(main_dir), "%s/main", g_root);
    make_dir(main_dir);
    for (int s = 0; s < 3; s++) { write_dataset_shard(main_dir, s, MAIN_NTOK[s], 2, 0, STRIDE); }
    snprintf(g_main_pattern, sizeof(g_main_pattern), "%s/d_*.bin", main_dir);

    test_sequential();
    test_exact_multiple();
    test_sharding();
    test_shuffle();
    test_resume();
    test_resume_other_ranks();
    test_independent();
    test_uint32();
    test_large_offsets();
    test_errors();

    remove_tree(g_root);
    struct stat st;
    report(lstat(g_root, &st) != 0, "cleanup: temporary directory removed", "%s is still there", g_root);
    if (g_failures > 0) { printf("%d check(s) failed\n", g_failures); }
    return g_failures > 0 ? 1 : 0;
}
