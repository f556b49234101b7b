/*
dataloader.h: streams (inputs, targets) batches out of llm.c-format token shards.

Used by the CPU trainer and by the multi-GPU trainer (one loader per process), so it is plain C that also
compiles as C++ (no implicit void* conversions). See FORMATS.md for the shard format:
1024-byte header of 256 little-endian int32 slots, [0]=magic [1]=version [2]=ntok, then ntok tokens,
either uint16 (magic 20240520, version 1) or uint32 (magic 20240801, version 7).

How the data is cut up: two layouts of the B rows of a batch (--rows)
- The shards are the files matching a glob pattern, sorted by name (byte order, independent of the locale).
- With P processes, a "window" is a run of consecutive tokens of one shard, plus the one token that the last
  target needs; window w of a shard starts at token w*stride, so consecutive windows overlap by that one token, and
  a shard has (ntok - 1) / stride windows (the tokens after the last full window are not used).
- independent (DL_ROWS_INDEPENDENT, the trainers' default): a window is one row, T + 1 tokens, stride T. A batch
  is B*P windows taken from anywhere in the data set, one per row; rank r takes rows r*B .. r*B + B - 1 of it.
  An epoch is floor(W / (B*P)) batches, W = the windows of all shards.
- contiguous (DL_ROWS_CONTIGUOUS, llm.c's layout): a window is one whole batch, B*T*P + 1 tokens, stride B*T*P,
  so the B rows of a batch are consecutive text (usually of one document). Rank r takes the B*T + 1 tokens
  starting at w*B*T*P + r*B*T. An epoch visits every window of every shard once.
- In both, inputs are a row's first T tokens (contiguous: the first B*T of the rank's span) and targets the same
  tokens shifted by one, and the P ranks together consume exactly what a single process with batch B*P would.
  After the last batch of an epoch the loader starts the next one.

Order
- Without shuffle: shards in name order, windows in order.
- independent, with shuffle: epoch e visits the W windows of all shards in the order of a keyed bijection of
  [0, W) (dl_permute_: a Feistel network, cycle-walked), keyed by (seed, e). Nothing of size W is stored, and
  position i of the order maps to its window in O(log shards), so the position in the stream is (epoch, i).
- contiguous, with shuffle: epoch e visits the shards in a permutation derived from (seed, e), and the windows
  of shard s in a permutation derived from (seed, e, s). The windows of one shard stay together, so only one
  shard is ever open. The position is (epoch, position in the shard order, position in the window order).
- Every rank derives the same orders (they share the seed) and takes its own rows. Because the orders are
  recomputed from (seed, epoch, shard), DataLoaderState holds only the position.

Errors: every problem with the data (no match, unreadable or malformed shard, too few tokens, token id out
of range, a saved state that does not fit) is one line "error: <file>: <what>" on stderr and exit(1).

64-bit file offsets: fseeko/off_t are used throughout. On 64-bit Linux off_t is always 64 bits; on a
32-bit system compile with -D_FILE_OFFSET_BITS=64 (checked below).
*/
#ifndef TRAIN_KLA_DATALOADER_H
#define TRAIN_KLA_DATALOADER_H

#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include "utils.h"

#ifdef __cplusplus
static_assert(sizeof(off_t) >= 8, "dataloader.h needs a 64-bit off_t (compile with -D_FILE_OFFSET_BITS=64)");
#else
_Static_assert(sizeof(off_t) >= 8, "dataloader.h needs a 64-bit off_t (compile with -D_FILE_OFFSET_BITS=64)");
#endif

#define DL_HEADER_BYTES 1024
#define DL_MAGIC_U16 20240520
#define DL_VERSION_U16 1
#define DL_MAGIC_U32 20240801
#define DL_VERSION_U32 7

// the layouts of --rows, indexed by DL_ROWS_*
#define DL_ROWS_CONTIGUOUS 0
#define DL_ROWS_INDEPENDENT 1
static const char* DL_ROWS_NAMES[2] = {"contiguous", "independent"};
// independent rows come from any shard, so the loader keeps up to this many shards open (well under the usual
// limit of 1024 open files); when one more is needed, it closes them all and starts over
#define DL_MAX_OPEN_SHARDS 64

// ----------------------------------------------------------------------------------------------------------
// the loader

typedef struct {
    // ---- public (read-only for the caller) ----
    int* inputs;              // B*T token ids of the current batch
    int* targets;             // B*T, targets[i] is the token that follows inputs[i]
    size_t B, T;
    size_t num_tokens;        // total tokens over all shards (from their headers)
    size_t batches_per_epoch; // batches per epoch, the same for every rank
    uint64_t epoch;           // epoch of the batch now in inputs/targets (0 before the first batch)

    // ---- private ----
    char* pattern;            // the glob pattern, for error messages about the loader as a whole
    int process_rank;
    int num_processes;
    int rows;                 // DL_ROWS_INDEPENDENT or DL_ROWS_CONTIGUOUS
    int shuffle;
    uint64_t seed;
    int vocab_size;
    size_t window_tokens;     // the stride between windows: T (independent) or B*T*P (contiguous)
    // the shards, in sorted name order
    size_t num_shards;
    char** shard_paths;
    size_t* shard_ntok;       // tokens in each shard
    int* shard_token_bytes;   // 2 (uint16) or 4 (uint32)
    size_t* shard_windows;    // windows in each shard, >= 1
    size_t* shard_first_window; // independent: number of the shard's first window among all W; [num_shards] = W
    size_t num_windows;       // W, the windows of all shards
    // where the next batch comes from.
    // independent: the windows at positions window_pos .. window_pos + B*P - 1 of this epoch's window order
    //   (window_pos is a multiple of B*P; shard_pos stays 0); when fewer than B*P are left, the next epoch starts.
    // contiguous: window window_order[window_pos] of shard shard_order[shard_pos]. window_pos may equal the shard's
    //   window count; next_batch then moves on to the next shard (and epoch).
    size_t shard_pos;
    size_t window_pos;
    uint64_t epoch_key;       // independent: the key of this epoch's window order
    size_t* shard_order;      // contiguous: this epoch's shard order (identity without shuffle)
    size_t* window_order;     // contiguous, shuffle: window permutation of shard window_order_shard in this epoch
    size_t window_order_shard;// which shard window_order belongs to; SIZE_MAX when not computed yet
    // the open shards: files[s] is NULL or shard s, opened once and kept (at most max_open of them)
    FILE** files;
    size_t open_files;
    size_t max_open;          // contiguous: 1, independent: DL_MAX_OPEN_SHARDS
    unsigned char* buffer;    // raw bytes of one read: B*T + 1 (contiguous) or T + 1 (a row) tokens of up to 4 bytes
} DataLoader;

// The resumable position, written raw into the trainer's state file. Fixed-width fields only, laid out
// without padding, little-endian on every machine we run on. It holds no rank: all ranks are always at the
// same position, so the state saved by rank 0 restores every rank. The configuration fields are only there
// so that dataloader_set_state can refuse a state that was saved with a different setup (B and the process
// count may change: a run resumed on another number of GPUs; dataloader_set_state says where the data go on).
// Version 2 added `rows` in what were the high 16 bits of version 1's uint32 `shuffle`: a version 1 state (of a
// run before --rows existed) is read as rows = contiguous, the only layout there was.
#define DL_STATE_MAGIC 0x4C44414BU  // "KADL"
#define DL_STATE_VERSION 2U
typedef struct {
    uint32_t magic;           // DL_STATE_MAGIC: catches a state read from the wrong place
    uint32_t version;         // DL_STATE_VERSION
    uint64_t B;
    uint64_t T;
    uint32_t num_processes;
    uint16_t shuffle;         // 0 or 1
    uint16_t rows;            // DL_ROWS_CONTIGUOUS or DL_ROWS_INDEPENDENT
    uint64_t num_shards;
    uint64_t num_tokens;      // total over all shards: a cheap fingerprint of the data set
    uint64_t seed;
    uint64_t epoch;           // epoch of the last batch returned
    uint64_t shard_pos;       // contiguous: position in that epoch's shard order; independent: 0
    uint64_t window_pos;      // position in the window order: contiguous, in that shard's (= batches already taken
                              // from it); independent, in the epoch's order of all windows (= batches taken x B*P)
} DataLoaderState;

#ifdef __cplusplus
static_assert(sizeof(DataLoaderState) == 80, "DataLoaderState must be 80 bytes with no padding");
#else
_Static_assert(sizeof(DataLoaderState) == 80, "DataLoaderState must be 80 bytes with no padding");
#endif

// ----------------------------------------------------------------------------------------------------------
// a small deterministic RNG for the shuffles: splitmix64 (Steele, Lea, Flood 2014). Its whole state is one
// uint64, it is fast, and every output is a bijective scramble of the state, which is all a shuffle needs.

// splitmix64's output function alone: a bijective scramble of 64 bits
static inline uint64_t dl_mix64_(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline uint64_t dl_splitmix64_(uint64_t* state) {
    return dl_mix64_(*state += 0x9E3779B97F4A7C15ULL);
}

// the RNG seed of one permutation: the shard order of an epoch (stream = UINT64_MAX) or the window order
// of shard `stream` in that epoch (contiguous rows); the key of an epoch's window order (independent rows,
// stream = UINT64_MAX). Each input is folded in through a full splitmix64 round, so nearby
// (seed, epoch, stream) triples give unrelated streams.
static inline uint64_t dl_stream_seed_(uint64_t seed, uint64_t epoch, uint64_t stream) {
    uint64_t s = seed;
    s = dl_splitmix64_(&s) ^ epoch;
    s = dl_splitmix64_(&s) ^ stream;
    return dl_splitmix64_(&s);
}

// uniform integer in [0, n), n >= 1. Plain r % n would favour small values slightly; rejecting the
// 2^64 mod n lowest outputs leaves a range that is an exact multiple of n.
static inline uint64_t dl_below_(uint64_t* state, uint64_t n) {
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t r = dl_splitmix64_(state);
        if (r >= threshold) { return r % n; }
    }
}

// a[0..n) = a permutation of 0..n-1: the identity without shuffle, else a Fisher-Yates shuffle driven by rng_seed
static inline void dl_permutation_(size_t* a, size_t n, int shuffle, uint64_t rng_seed) {
    for (size_t i = 0; i < n; i++) { a[i] = i; }
    if (!shuffle) { return; }
    uint64_t state = rng_seed;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)dl_below_(&state, (uint64_t)i);
        size_t tmp = a[i - 1]; a[i - 1] = a[j]; a[j] = tmp;
    }
}

// Position i of an epoch's order -> window, a keyed bijection of [0, n) that stores nothing (n can be billions of
// windows). A balanced Feistel network on 2h bits (left and right halves of h bits; each round: left, right =
// right, left ^ F(right)) is a bijection of [0, 2^2h) whatever its round function F, because each round can be
// undone; 4 rounds with a pseudorandom F give a pseudorandom permutation (Luby and Rackoff 1988). With 2h the
// smallest even width with 2^2h >= n, "cycle walking" (apply it again while the result is >= n; Black and
// Rogaway 2002) restricts it to a bijection of [0, n): the walk from i < n ends at the next element of i's cycle
// that is < n. 2^2h < 4n, so a walk takes fewer than 4 passes on average.
static inline uint64_t dl_permute_(uint64_t i, uint64_t n, uint64_t key) {
    int h = 1;
    while (h < 32 && (1ULL << (2 * h)) < n) { h++; }
    uint64_t mask = (1ULL << h) - 1;
    uint64_t x = i;
    do {
        uint64_t left = x >> h, right = x & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t f = dl_mix64_(right ^ (key + round * 0x9E3779B97F4A7C15ULL)) & mask;
            uint64_t next_right = left ^ f;
            left = right;
            right = next_right;
        }
        x = (left << h) | right;
    } while (x >= n);
    return x;
}

// ----------------------------------------------------------------------------------------------------------
// shard files

static inline uint32_t dl_le32_(const unsigned char* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// The tail of the error for a file that is not a shard: a file of text (a .txt given to -i, whose first bytes hold
// no control characters but tab, newline, carriage return and form feed) gets a pointer to the tool that makes
// shards from text; anything else gets nothing. A shard header never passes: its magic holds the byte 0x01.
static inline const char* dl_text_hint_(const unsigned char* bytes, size_t n) {
    if (n == 0) { return ""; }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = bytes[i];
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f') { return ""; }
    }
    return "; it looks like text: token shards are made from text files by ./encode_shards (README \"Data\")";
}

// open a shard and check its header against its size; returns the open file (positioned anywhere)
static inline FILE* dl_open_shard_(const char* path, size_t* ntok_out, int* token_bytes_out) {
    FILE* f = fopen_or_die(path, "rb");
    // fopen succeeds on a directory on Linux; say so instead of failing later with a puzzling read error
    struct stat st;
    if (fstat(fileno(f), &st) != 0) { die("%s: cannot stat (%s)", path, strerror(errno)); }
    if (!S_ISREG(st.st_mode)) { die("%s: not a regular file", path); }
    long long file_size = (long long)st.st_size;
    unsigned char header[DL_HEADER_BYTES];
    if (file_size < DL_HEADER_BYTES) {
        fread_or_die(header, (size_t)file_size, f, path);
        die("%s: file is %lld bytes, too small for the %d-byte shard header%s", path, file_size, DL_HEADER_BYTES,
            dl_text_hint_(header, (size_t)file_size));
    }
    fread_or_die(header, DL_HEADER_BYTES, f, path);
    uint32_t magic = dl_le32_(header + 0);
    uint32_t version = dl_le32_(header + 4);
    // the count lives in an int32 slot; read it unsigned so that a uint32 shard of up to 2^32-1 tokens works
    // (a corrupt count is caught by the size check below either way)
    uint32_t ntok = dl_le32_(header + 8);
    int token_bytes;
    if (magic == DL_MAGIC_U16) {
        if (version != DL_VERSION_U16) {
            die("%s: version %u, expected %d for a uint16 shard (magic %d)", path, version, DL_VERSION_U16, DL_MAGIC_U16);
        }
        token_bytes = 2;
    } else if (magic == DL_MAGIC_U32) {
        if (version != DL_VERSION_U32) {
            die("%s: version %u, expected %d for a uint32 shard (magic %d)", path, version, DL_VERSION_U32, DL_MAGIC_U32);
        }
        token_bytes = 4;
    } else {
        die("%s: bad magic %u, expected %d (uint16 shard) or %d (uint32 shard)%s", path, magic, DL_MAGIC_U16, DL_MAGIC_U32,
            dl_text_hint_(header, DL_HEADER_BYTES));
    }
    long long expected = (long long)DL_HEADER_BYTES + (long long)ntok * token_bytes;
    if (file_size < expected) {
        die("%s: truncated payload: the header declares %u tokens, so the file should be %lld bytes, but it is %lld",
            path, ntok, expected, file_size);
    }
    if (file_size > expected) {
        die("%s: %lld extra bytes after the %u tokens the header declares (file is %lld bytes, expected %lld)",
            path, file_size - expected, ntok, file_size, expected);
    }
    *ntok_out = (size_t)ntok;
    *token_bytes_out = token_bytes;
    return f;
}

static inline int dl_compare_paths_(const void* a, const void* b) {
    return strcmp(*(const char* const*)a, *(const char* const*)b);
}

// ----------------------------------------------------------------------------------------------------------
// position bookkeeping

// the order of epoch l->epoch: independent, its key; contiguous, the shard order (the cached window order
// belongs to another epoch now)
static inline void dl_start_epoch_(DataLoader* l) {
    uint64_t stream_seed = dl_stream_seed_(l->seed, l->epoch, UINT64_MAX);
    if (l->rows == DL_ROWS_INDEPENDENT) {
        l->epoch_key = stream_seed;
    } else {
        dl_permutation_(l->shard_order, l->num_shards, l->shuffle, stream_seed);
        l->window_order_shard = SIZE_MAX;
    }
}

// contiguous: index (within its shard) of the window at l->window_pos of the current shard
static inline size_t dl_current_window_(DataLoader* l) {
    if (!l->shuffle) { return l->window_pos; }
    size_t shard = l->shard_order[l->shard_pos];
    if (l->window_order_shard != shard) {
        dl_permutation_(l->window_order, l->shard_windows[shard], 1, dl_stream_seed_(l->seed, l->epoch, shard));
        l->window_order_shard = shard;
    }
    return l->window_order[l->window_pos];
}

// independent: the shard holding window g of all W (binary search in shard_first_window)
static inline size_t dl_shard_of_window_(const DataLoader* l, size_t g) {
    size_t lo = 0, hi = l->num_shards;  // shard_first_window[lo] <= g < shard_first_window[hi]
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->shard_first_window[mid] <= g) { lo = mid; } else { hi = mid; }
    }
    return lo;
}

// ----------------------------------------------------------------------------------------------------------
// reading

// the open file of a shard. A shard is opened once and kept; when max_open are open, all are closed first
// (contiguous rows: exactly one shard is open). Opening re-checks the header in case the file changed since init.
static inline FILE* dl_shard_file_(DataLoader* l, size_t shard) {
    if (l->files[shard] != NULL) { return l->files[shard]; }
    if (l->open_files == l->max_open) {
        for (size_t i = 0; i < l->num_shards; i++) {
            if (l->files[i] != NULL) { fclose(l->files[i]); l->files[i] = NULL; }
        }
        l->open_files = 0;
    }
    const char* path = l->shard_paths[shard];
    size_t ntok;
    int token_bytes;
    FILE* f = dl_open_shard_(path, &ntok, &token_bytes);
    if (ntok != l->shard_ntok[shard] || token_bytes != l->shard_token_bytes[shard]) {
        die("%s: shard changed since the loader started (now %zu tokens of %d bytes, was %zu of %d)",
            path, ntok, token_bytes, l->shard_ntok[shard], l->shard_token_bytes[shard]);
    }
    l->files[shard] = f;
    l->open_files++;
    return f;
}

// tokens first .. first + n of a shard (n + 1 of them, one seek and one read) into inputs[0..n) = the first n and
// targets[0..n) = the last n
static inline void dl_read_span_(DataLoader* l, size_t shard, size_t first, size_t n, int* inputs, int* targets) {
    FILE* f = dl_shard_file_(l, shard);
    const char* path = l->shard_paths[shard];
    int token_bytes = l->shard_token_bytes[shard];
    long long offset = (long long)DL_HEADER_BYTES + (long long)first * token_bytes;
    if (fseeko(f, (off_t)offset, SEEK_SET) != 0) {
        die("%s: cannot seek to byte offset %lld (%s)", path, offset, strerror(errno));
    }
    fread_or_die(l->buffer, (n + 1) * (size_t)token_bytes, f, path);

    // decode little-endian tokens, checking each id: an id past the vocab would index outside the embedding
    uint32_t vocab = (uint32_t)l->vocab_size;
    for (size_t i = 0; i <= n; i++) {
        const unsigned char* p = l->buffer + i * (size_t)token_bytes;
        uint32_t id = token_bytes == 2 ? ((uint32_t)p[0] | ((uint32_t)p[1] << 8)) : dl_le32_(p);
        if (id >= vocab) {
            die("%s: token id %u at byte offset %lld is >= vocab size %d",
                path, id, offset + (long long)(i * (size_t)token_bytes), l->vocab_size);
        }
        if (i < n) { inputs[i] = (int)id; }
        if (i > 0) { targets[i - 1] = (int)id; }
    }
}

// ----------------------------------------------------------------------------------------------------------
// public API

static inline void dataloader_reset(DataLoader* l) {
    l->epoch = 0;
    l->shard_pos = 0;
    l->window_pos = 0;
    dl_start_epoch_(l);
}

// rows: DL_ROWS_INDEPENDENT or DL_ROWS_CONTIGUOUS (the layouts at the top of this file)
static inline void dataloader_init(DataLoader* l, const char* glob_pattern, size_t B, size_t T, int process_rank,
                                   int num_processes, int rows, int shuffle, uint64_t seed, int vocab_size) {
    memset(l, 0, sizeof(*l));
    // configuration errors come from the caller's flags, so they die like everything else
    if (B == 0 || T == 0) { die("%s: dataloader needs B >= 1 and T >= 1 (got B=%zu, T=%zu)", glob_pattern, B, T); }
    if (num_processes < 1 || process_rank < 0 || process_rank >= num_processes) {
        die("%s: dataloader process rank %d is out of range for %d processes", glob_pattern, process_rank, num_processes);
    }
    if (rows != DL_ROWS_INDEPENDENT && rows != DL_ROWS_CONTIGUOUS) { die("%s: dataloader rows layout %d is unknown", glob_pattern, rows); }
    if (vocab_size < 1) { die("%s: dataloader needs a positive vocab size (got %d)", glob_pattern, vocab_size); }
    // B*T*P + 1 tokens of 4 bytes must be addressable; anything near this limit would not fit in memory anyway
    size_t P = (size_t)num_processes;
    if (B > (SIZE_MAX / 8) / T || B * T > (SIZE_MAX / 8) / P) {
        die("%s: dataloader B*T*processes = %zu*%zu*%zu is too large", glob_pattern, B, T, P);
    }
    l->B = B;
    l->T = T;
    l->process_rank = process_rank;
    l->num_processes = num_processes;
    l->rows = rows;
    l->shuffle = shuffle ? 1 : 0;
    l->seed = seed;
    l->vocab_size = vocab_size;
    l->window_tokens = rows == DL_ROWS_INDEPENDENT ? T : B * T * P;
    size_t pattern_len = strlen(glob_pattern);
    l->pattern = (char*)malloc_or_die(pattern_len + 1);
    memcpy(l->pattern, glob_pattern, pattern_len + 1);

    // find the shards
    glob_t g;
    int rc = glob(glob_pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) { globfree(&g); die("%s: no files match", glob_pattern); }
    if (rc == GLOB_NOSPACE) { die("%s: out of memory while matching the pattern", glob_pattern); }
    if (rc != 0) { die("%s: cannot match the pattern (a directory could not be read)", glob_pattern); }
    l->num_shards = g.gl_pathc;
    l->shard_paths = (char**)calloc_or_die(l->num_shards, sizeof(char*));
    for (size_t i = 0; i < l->num_shards; i++) {
        size_t len = strlen(g.gl_pathv[i]);
        l->shard_paths[i] = (char*)malloc_or_die(len + 1);
        memcpy(l->shard_paths[i], g.gl_pathv[i], len + 1);
    }
    globfree(&g);
    // glob sorts with strcoll(), i.e. by the locale; re-sort bytewise so that every process on every machine
    // agrees on the shard indices (the shuffle and the saved state depend on them)
    qsort(l->shard_paths, l->num_shards, sizeof(char*), dl_compare_paths_);

    // check every shard now, so that a bad one fails at startup and not hours into training
    l->shard_ntok = (size_t*)calloc_or_die(l->num_shards, sizeof(size_t));
    l->shard_token_bytes = (int*)calloc_or_die(l->num_shards, sizeof(int));
    l->shard_windows = (size_t*)calloc_or_die(l->num_shards, sizeof(size_t));
    l->shard_first_window = (size_t*)calloc_or_die(l->num_shards + 1, sizeof(size_t));
    size_t max_windows = 0;
    for (size_t i = 0; i < l->num_shards; i++) {
        const char* path = l->shard_paths[i];
        FILE* f = dl_open_shard_(path, &l->shard_ntok[i], &l->shard_token_bytes[i]);
        fclose(f);
        size_t ntok = l->shard_ntok[i];
        if (ntok < l->window_tokens + 1 && rows == DL_ROWS_INDEPENDENT) {
            die("%s: %zu tokens, but one row needs T + 1 = %zu", path, ntok, T + 1);
        } else if (ntok < l->window_tokens + 1) {
            die("%s: %zu tokens, but one batch needs B*T*processes + 1 = %zu*%zu*%d + 1 = %zu",
                path, ntok, B, T, num_processes, l->window_tokens + 1);
        }
        l->shard_windows[i] = (ntok - 1) / l->window_tokens;
        if (l->shard_windows[i] > max_windows) { max_windows = l->shard_windows[i]; }
        l->num_tokens += ntok;
        l->shard_first_window[i + 1] = l->shard_first_window[i] + l->shard_windows[i];
    }
    l->num_windows = l->shard_first_window[l->num_shards];
    if (rows == DL_ROWS_INDEPENDENT) {
        l->batches_per_epoch = l->num_windows / (B * P);
        if (l->batches_per_epoch == 0) {
            die("%s: %zu rows of T + 1 = %zu tokens in all shards, but one batch needs B*processes = %zu*%d rows",
                glob_pattern, l->num_windows, T + 1, B, num_processes);
        }
    } else {
        l->batches_per_epoch = l->num_windows;
    }

    l->inputs = (int*)malloc_or_die(B * T * sizeof(int));
    l->targets = (int*)malloc_or_die(B * T * sizeof(int));
    l->buffer = (unsigned char*)malloc_or_die((rows == DL_ROWS_INDEPENDENT ? T + 1 : B * T + 1) * 4);
    if (rows == DL_ROWS_CONTIGUOUS) {
        l->shard_order = (size_t*)malloc_or_die(l->num_shards * sizeof(size_t));
        l->window_order = l->shuffle ? (size_t*)malloc_or_die(max_windows * sizeof(size_t)) : NULL;
    }
    l->files = (FILE**)calloc_or_die(l->num_shards, sizeof(FILE*));
    l->max_open = rows == DL_ROWS_INDEPENDENT ? DL_MAX_OPEN_SHARDS : 1;
    dataloader_reset(l);
}

// independent rows: the B*P windows at window_pos of the epoch's order, this rank's B of them into its rows
static inline void dl_next_rows_(DataLoader* l) {
    size_t rows_per_batch = l->B * (size_t)l->num_processes;
    if (l->window_pos + rows_per_batch > l->num_windows) {  // the W mod (B*P) windows left over wait for another epoch
        l->window_pos = 0;
        l->epoch++;
        dl_start_epoch_(l);
    }
    for (size_t b = 0; b < l->B; b++) {
        uint64_t pos = l->window_pos + (size_t)l->process_rank * l->B + b;
        size_t g = l->shuffle ? (size_t)dl_permute_(pos, l->num_windows, l->epoch_key) : (size_t)pos;
        size_t shard = dl_shard_of_window_(l, g);
        size_t first = (g - l->shard_first_window[shard]) * l->T;
        dl_read_span_(l, shard, first, l->T, l->inputs + b * l->T, l->targets + b * l->T);
    }
    l->window_pos += rows_per_batch;
}

// contiguous rows: window window_pos of the current shard's order, this rank's B*T + 1 tokens of it
static inline void dl_next_span_(DataLoader* l) {
    // move past a finished shard, and past the last shard into the next epoch. Every shard has at least
    // one window (init checks it), so one step always lands on a window.
    if (l->window_pos >= l->shard_windows[l->shard_order[l->shard_pos]]) {
        l->window_pos = 0;
        l->shard_pos++;
        if (l->shard_pos == l->num_shards) {
            l->shard_pos = 0;
            l->epoch++;
            dl_start_epoch_(l);
        }
    }
    size_t shard = l->shard_order[l->shard_pos];
    size_t BT = l->B * l->T;
    size_t first = dl_current_window_(l) * l->window_tokens + (size_t)l->process_rank * BT;
    dl_read_span_(l, shard, first, BT, l->inputs, l->targets);
    l->window_pos++;
}

static inline void dataloader_next_batch(DataLoader* l) {
    if (l->rows == DL_ROWS_INDEPENDENT) { dl_next_rows_(l); } else { dl_next_span_(l); }
}

static inline void dataloader_get_state(const DataLoader* l, DataLoaderState* s) {
    memset(s, 0, sizeof(*s));
    s->magic = DL_STATE_MAGIC;
    s->version = DL_STATE_VERSION;
    s->B = l->B;
    s->T = l->T;
    s->num_processes = (uint32_t)l->num_processes;
    s->shuffle = (uint16_t)l->shuffle;
    s->rows = (uint16_t)l->rows;
    s->num_shards = l->num_shards;
    s->num_tokens = l->num_tokens;
    s->seed = l->seed;
    s->epoch = l->epoch;
    s->shard_pos = l->shard_pos;
    s->window_pos = l->window_pos;
}

static inline void dataloader_set_state(DataLoader* l, const DataLoaderState* s) {
    const char* p = l->pattern;
    if (s->magic != DL_STATE_MAGIC || s->version < 1 || s->version > DL_STATE_VERSION) {
        die("%s: saved dataloader state is not valid (magic %u version %u, expected %u version 1 to %u)",
            p, s->magic, s->version, DL_STATE_MAGIC, DL_STATE_VERSION);
    }
    // the position only means the same thing under the same configuration
    const char* what = "saved dataloader state does not fit this loader";
    int rows = s->version == 1 ? DL_ROWS_CONTIGUOUS : (int)s->rows;  // version 1 had only llm.c's layout
    if (rows != DL_ROWS_CONTIGUOUS && rows != DL_ROWS_INDEPENDENT) { die("%s: %s: rows layout %d is unknown", p, what, rows); }
    if (rows != l->rows) {
        die("%s: %s: rows = %s in the state, %s now (resume it with --rows %s)", p, what, DL_ROWS_NAMES[rows],
            DL_ROWS_NAMES[l->rows], DL_ROWS_NAMES[rows]);
    }
    if (s->T != l->T) { die("%s: %s: T = %llu in the state, %zu now", p, what, (unsigned long long)s->T, l->T); }
    if (s->num_processes == 0 || s->B == 0) { die("%s: %s: B = %llu and %u processes", p, what, (unsigned long long)s->B, s->num_processes); }
    // Another B or process count (a run resumed on another number of GPUs): independent rows are counted in
    // windows of T + 1 tokens whatever B*P, so the stream goes on exactly where it stopped; contiguous rows come
    // in windows of B*T*P + 1 tokens, so a new B*P restarts the current shard at its first window.
    uint64_t saved_rows = s->B * s->num_processes, rows_now = (uint64_t)l->B * (uint64_t)l->num_processes;
    int regroup = s->B != l->B || s->num_processes != (uint32_t)l->num_processes;
    if (s->shuffle != (uint16_t)l->shuffle) {
        die("%s: %s: shuffle = %u in the state, %d now", p, what, (unsigned)s->shuffle, l->shuffle);
    }
    if (s->seed != l->seed) {
        die("%s: %s: seed = %llu in the state, %llu now", p, what,
            (unsigned long long)s->seed, (unsigned long long)l->seed);
    }
    if (s->num_shards != l->num_shards) {
        die("%s: %s: %llu shards in the state, %zu match now", p, what, (unsigned long long)s->num_shards, l->num_shards);
    }
    if (s->num_tokens != l->num_tokens) {
        die("%s: %s: %llu tokens in the state, %zu in the shards now", p, what,
            (unsigned long long)s->num_tokens, l->num_tokens);
    }
    if (s->shard_pos >= l->num_shards || (rows == DL_ROWS_INDEPENDENT && s->shard_pos != 0)) {
        die("%s: %s: shard position %llu, but there are %zu shards%s", p, what,
            (unsigned long long)s->shard_pos, l->num_shards, rows == DL_ROWS_INDEPENDENT ? " (independent rows: 0)" : "");
    }
    if (rows == DL_ROWS_INDEPENDENT) {
        if (s->window_pos % saved_rows != 0 || s->window_pos > l->num_windows) {
            die("%s: %s: window position %llu, but an epoch is %zu windows taken B*processes = %llu at a time", p, what,
                (unsigned long long)s->window_pos, l->num_windows, (unsigned long long)saved_rows);
        }
    }
    l->epoch = s->epoch;
    l->shard_pos = (size_t)s->shard_pos;
    dl_start_epoch_(l);
    l->window_pos = (size_t)s->window_pos;
    if (rows == DL_ROWS_CONTIGUOUS) {
        size_t shard = l->shard_order[l->shard_pos];
        if (regroup && saved_rows != rows_now) {
            printf("data: the checkpoint's batches were B*processes = %llu*%u rows, now %zu*%d: contiguous rows come in windows of "
                   "that many rows, so epoch %llu restarts its shard %zu (%s) at its first window\n", (unsigned long long)s->B,
                   s->num_processes, l->B, l->num_processes, (unsigned long long)l->epoch, l->shard_pos, l->shard_paths[shard]);
            l->window_pos = 0;
        } else if (s->window_pos > l->shard_windows[shard]) {
            die("%s: %s: window position %llu, but %s has %zu windows", p, what,
                (unsigned long long)s->window_pos, l->shard_paths[shard], l->shard_windows[shard]);
        }
    } else if (regroup) {
        printf("data: the checkpoint's batches were B*processes = %llu*%u rows, now %zu*%d: the stream goes on at window %zu of "
               "epoch %llu, where it stopped\n", (unsigned long long)s->B, s->num_processes, l->B, l->num_processes, l->window_pos,
               (unsigned long long)l->epoch);
    }
}

static inline void dataloader_free(DataLoader* l) {
    for (size_t i = 0; i < l->num_shards; i++) {
        if (l->files[i] != NULL) { fclose(l->files[i]); }
    }
    free(l->files);
    for (size_t i = 0; i < l->num_shards; i++) { free(l->shard_paths[i]); }
    free(l->shard_paths);
    free(l->shard_ntok);
    free(l->shard_token_bytes);
    free(l->shard_windows);
    free(l->shard_first_window);
    free(l->shard_order);
    free(l->window_order);
    free(l->inputs);
    free(l->targets);
    free(l->buffer);
    free(l->pattern);
    memset(l, 0, sizeof(*l));
}

// ----------------------------------------------------------------------------------------------------------
// multiple-choice evaluation files (HellaSwag): llm.c's eval file format (FORMATS.md "Multiple-choice eval file")
//
// A header of 256 int32 ([0] = magic 20240522, [1] = version 1, [2] = examples, [3] = the longest example record in
// bytes), then per example a record of uint16 words: 65535 (<START_EXAMPLE>), the record's length in bytes, the
// example's index (not checked: a subset of a data set may keep its original indices), the label (the correct
// completion), the number of completions (4), the context's length and tokens, then per completion its length and
// tokens. The whole file is read and checked up front: a file that passes every check below is safe to score (no
// length runs past its record, no token past the vocabulary).

#define EVAL_MAGIC 20240522
#define EVAL_VERSION 1
#define EVAL_START_EXAMPLE 65535
#define EVAL_COMPLETIONS 4  // llm.c's files (HellaSwag, MMLU) have 4; the format's field is checked against it

typedef struct {
    int label;                                       // the correct completion, in [0, EVAL_COMPLETIONS)
    const uint16_t* context;                         // points into EvalFile.words
    int context_len;                                 // >= 1
    const uint16_t* completion[EVAL_COMPLETIONS];
    int completion_len[EVAL_COMPLETIONS];            // each >= 1
} EvalExample;

typedef struct {
    int num_examples;
    uint16_t* words;        // the file after its header
    EvalExample* examples;  // (num_examples)
} EvalFile;

// Reads and checks an eval file whose tokens must lie in [0, vocab_size); any problem is a one-line error naming
// the file (and the example, with the byte offset of its record).
static inline void evalfile_load(EvalFile* e, const char* path, int vocab_size) {
    FILE* f = fopen_or_die(path, "rb");
    struct stat st;
    if (fstat(fileno(f), &st) != 0) { die("%s: cannot stat (%s)", path, strerror(errno)); }
    if (!S_ISREG(st.st_mode)) { die("%s: not a regular file", path); }
    long long file_size = (long long)st.st_size;
    if (file_size < DL_HEADER_BYTES) { die("%s: file is %lld bytes, too small for the %d-byte eval file header", path, file_size, DL_HEADER_BYTES); }
    unsigned char header[DL_HEADER_BYTES];
    fread_or_die(header, DL_HEADER_BYTES, f, path);
    uint32_t magic = dl_le32_(header), version = dl_le32_(header + 4), n = dl_le32_(header + 8), longest = dl_le32_(header + 12);
    if (magic != EVAL_MAGIC) { die("%s: bad magic %u, expected %d (a multiple-choice eval file, scripts/hellaswag.py)", path, magic, EVAL_MAGIC); }
    if (version != EVAL_VERSION) { die("%s: version %u, expected %d", path, version, EVAL_VERSION); }
    if (n == 0 || n > 65535) { die("%s: the header declares %u examples, expected 1 to 65535", path, n); }
    size_t payload = (size_t)(file_size - DL_HEADER_BYTES);
    if (payload % 2 != 0) { die("%s: truncated: the examples take an odd number of bytes (%zu)", path, payload); }
    size_t num_words = payload / 2;
    e->num_examples = (int)n;
    e->words = (uint16_t*)malloc_or_die(payload > 0 ? payload : 1);
    e->examples = (EvalExample*)malloc_or_die(n * sizeof(EvalExample));
    fread_or_die(e->words, payload, f, path);
    fclose(f);
    size_t pos = 0, longest_seen = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint16_t* w = e->words + pos;
        long long offset = DL_HEADER_BYTES + 2 * (long long)pos;
        size_t left = num_words - pos;
        if (left < 6) { die("%s: truncated: example %u (byte %lld) is cut off after %zu bytes", path, i, offset, 2 * left); }
        if (w[0] != EVAL_START_EXAMPLE) { die("%s: example %u (byte %lld): delimiter %u, expected %d", path, i, offset, w[0], EVAL_START_EXAMPLE); }
        size_t len = w[1] / 2;  // the record in words
        if (w[1] % 2 != 0 || len < 6) { die("%s: example %u (byte %lld): a record of %u bytes is impossible", path, i, offset, w[1]); }
        if (len > left) { die("%s: truncated: example %u (byte %lld) declares %u bytes, %zu are left", path, i, offset, w[1], 2 * left); }
        if (w[4] != EVAL_COMPLETIONS) { die("%s: example %u (byte %lld): %u completions, expected %d", path, i, offset, w[4], EVAL_COMPLETIONS); }
        if (w[3] >= EVAL_COMPLETIONS) { die("%s: example %u (byte %lld): label %u is not in [0, %d)", path, i, offset, w[3], EVAL_COMPLETIONS); }
        EvalExample* x = &e->examples[i];
        x->label = w[3];
        // the context, then each completion: a length >= 1 and that many tokens, all inside the record
        size_t at = 5;
        for (int part = -1; part < EVAL_COMPLETIONS; part++) {
            const char* what = part < 0 ? "the context" : "a completion";
            if (at >= len) { die("%s: example %u (byte %lld): its record of %u bytes ends before %s", path, i, offset, w[1], what); }
            int count = w[at];
            if (count == 0) { die("%s: example %u (byte %lld): %s is empty", path, i, offset, what); }
            if (at + 1 + count > len) { die("%s: example %u (byte %lld): %s of %d tokens runs past its record of %u bytes", path, i, offset, what, count, w[1]); }
            for (int t = 0; t < count; t++) {
                if (w[at + 1 + t] >= vocab_size) {
                    die("%s: example %u (byte %lld): token %u is outside the model's vocabulary [0, %d)", path, i, offset, w[at + 1 + t], vocab_size);
                }
            }
            if (part < 0) {
                x->context = w + at + 1;
                x->context_len = count;
            } else {
                x->completion[part] = w + at + 1;
                x->completion_len[part] = count;
            }
            at += 1 + (size_t)count;
        }
        if (at != len) { die("%s: example %u (byte %lld): %zu bytes after its last completion inside the record", path, i, offset, 2 * (len - at)); }
        if (2 * len > longest_seen) { longest_seen = 2 * len; }
        pos += len;
    }
    if (pos != num_words) { die("%s: %zu extra bytes after the %u examples the header declares", path, 2 * (num_words - pos), n); }
    if (longest != longest_seen) { die("%s: the header says the longest example is %u bytes, it is %zu", path, longest, longest_seen); }
}

static inline void evalfile_free(EvalFile* e) {
    free(e->words);
    free(e->examples);
    memset(e, 0, sizeof(*e));
}

#endif // TRAIN_KLA_DATALOADER_H
