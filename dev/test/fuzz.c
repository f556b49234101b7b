/*
fuzz.c: libFuzzer harness for every reader of untrusted bytes (issue 15): the token shard reader (dataloader.h),
the model and state file readers (model.h), the tokenizer file reader and the encoder (tokenizer.h), and the
multiple-choice eval file reader (dataloader.h's evalfile_load).

Built by `make fuzz-build` with clang -fsanitize=fuzzer,address,undefined, one binary per target:
build/fuzz/fuzz_<target>, target = shard | model | state | tokenizer | encode | evalfile. dev/test/test_fuzz.sh runs a bounded,
seeded number of inputs of each (make test); `make fuzz` runs longer. A crash, a sanitizer report, a hang
(-timeout) or an allocation above -malloc_limit_mb fails, and libFuzzer keeps the input as the reproducer.

What an input means:
  - shard, model, state, tokenizer, evalfile: edits to a valid template file (a small shard, a small model of five mixers,
    a state file, data/tokenizer.bin), so that the mutations start from the structure the reader expects:
    byte 0 = flags (bit 0: recompute the checksums after editing, so the checks behind them are reached too;
    bit 1: cut the file at the first edit's offset), then 5-byte records (uint32 offset mod the file size,
    uint8 value XORed into that byte). The edited file is written to a temporary directory and read.
  - encode: the input is text; it must encode, and decoding the tokens must give back exactly the bytes the
    encoder works on (the input with each invalid UTF-8 piece replaced by U+FFFD, tokenizer.h step 1).

The readers end bad input with die(); built with -DFUZZING, die() longjmps back here instead of exiting. The
files and heap blocks that a reader leaves open when it dies are closed and freed here (the fopen/malloc
family is routed through small trackers below), so that a long run neither runs out of descriptors nor grows.
*/
#include <glob.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <unistd.h>

// ---- trackers for what a dying reader leaves behind
#define MAX_TRACKED 4096
static FILE* open_files[MAX_TRACKED];
static void* live_blocks[MAX_TRACKED];
static int track(void** table, void* p) {
    if (p == NULL) { return 0; }
    for (int i = 0; i < MAX_TRACKED; i++) { if (table[i] == NULL) { table[i] = p; return 1; } }
    abort();  // a reader holding more than MAX_TRACKED blocks at once: fail loudly
}
static void untrack(void** table, void* p) {
    for (int i = 0; p != NULL && i < MAX_TRACKED; i++) { if (table[i] == p) { table[i] = NULL; return; } }
}
static FILE* fuzz_fopen(const char* path, const char* mode) { FILE* f = fopen(path, mode); track((void**)open_files, f); return f; }
static int fuzz_fclose(FILE* f) { untrack((void**)open_files, f); return fclose(f); }
static void* fuzz_malloc(size_t n) { void* p = malloc(n); track(live_blocks, p); return p; }
static void* fuzz_calloc(size_t n, size_t s) { void* p = calloc(n, s); track(live_blocks, p); return p; }
static void* fuzz_realloc(void* old, size_t n) {
    void* p = realloc(old, n);
    if (p != NULL) { untrack(live_blocks, old); track(live_blocks, p); }
    return p;
}
static void fuzz_free(void* p) { untrack(live_blocks, p); free(p); }
static void release_leftovers(void) {
    for (int i = 0; i < MAX_TRACKED; i++) {
        if (open_files[i]) { fclose(open_files[i]); open_files[i] = NULL; }
        if (live_blocks[i]) { free(live_blocks[i]); live_blocks[i] = NULL; }
    }
}
#define fopen fuzz_fopen
#define fclose fuzz_fclose
#define malloc fuzz_malloc
#define calloc fuzz_calloc
#define realloc fuzz_realloc
#define free fuzz_free

#include "../../model.h"
#include "../../tokenizer.h"

static const char* target;
static char dir[4096];  // $TMPDIR/fuzz_train_kla_XXXXXX, made by mkdtemp, removed at exit
static char path[4200];
static unsigned char* template_bytes;
static size_t template_size;
static Tokenizer tokenizer;  // the encode target's, loaded once

static void read_whole_file(const char* p, unsigned char** bytes, size_t* size) {
    FILE* f = fopen_or_die(p, "rb");
    fseek(f, 0, SEEK_END);
    *size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    *bytes = (unsigned char*)malloc_or_die(*size);
    fread_or_die(*bytes, *size, f, p);
    fclose(f);
}

// The templates: files the real writers write, small enough to mutate quickly.
static void make_template(void) {
    if (strcmp(target, "shard") == 0) {
        int32_t header[256] = {20240520, 1, 200};
        uint16_t tokens[200];
        for (int i = 0; i < 200; i++) { tokens[i] = (uint16_t)(i * 251 % 50257); }
        snprintf(path, sizeof(path), "%s/template", dir);
        FILE* f = fopen_or_die(path, "wb");
        fwrite_or_die(header, sizeof(header), f, path);
        fwrite_or_die(tokens, sizeof(tokens), f, path);
        fclose(f);
    } else if (strcmp(target, "model") == 0 || strcmp(target, "state") == 0) {
        // five mixers with tiny widths and a 16-token vocabulary (the readers accept any vocab size)
        char* argv[] = {"fuzz", "--mixer", "attn:1,gdn:1,pkda:1,gka:1,kalman:1", "--width", "8", "--heads", "2", "--lin-heads", "2",
                        "--dk", "4", "--dv", "4", "--kalman-n", "2"};
        Options o;
        parse_options(&o, (int)(sizeof(argv) / sizeof(argv[0])), argv);
        Config c = o.config;
        c.vocab_size = 16;
        c.padded_vocab_size = 128;
        c.max_seq_len = 16;
        TensorTable tt;
        build_parameter_layout(&c, &tt, NULL, NULL);
        float* params = (float*)calloc_or_die(tt.num_parameters, sizeof(float));
        init_parameters(params, &c, &tt, 1);
        snprintf(path, sizeof(path), "%s/template", dir);
        if (strcmp(target, "model") == 0) {
            write_model_file(&c, &tt, params, path);
        } else {
            TrainState s = {0};
            s.step = 3;
            write_state_file(&s, 100, params, params + 100, path);
        }
        free(params);
    } else if (strcmp(target, "evalfile") == 0) {
        // two examples of llm.c's format (FORMATS.md "Multiple-choice eval file"): START_EXAMPLE, record bytes,
        // index, label, 4 completions, a context of 2 tokens, completions of 1, 1, 2 and 1 tokens
        int32_t header[256] = {20240522, 1, 2, 34};
        uint16_t examples[2][17] = {{65535, 34, 0, 2, 4, 2, 10, 11, 1, 12, 1, 13, 2, 14, 15, 1, 16},
                                    {65535, 34, 1, 0, 4, 2, 20, 21, 1, 22, 1, 23, 2, 24, 25, 1, 26}};
        snprintf(path, sizeof(path), "%s/template", dir);
        FILE* f = fopen_or_die(path, "wb");
        fwrite_or_die(header, sizeof(header), f, path);
        fwrite_or_die(examples, sizeof(examples), f, path);
        fclose(f);
    } else if (strcmp(target, "tokenizer") == 0) {
        snprintf(path, sizeof(path), "data/tokenizer.bin");
    } else {
        tokenizer_init(&tokenizer, "data/tokenizer.bin");
        return;
    }
    read_whole_file(path, &template_bytes, &template_size);
}

// at exit: the temporary directory and the two files that are ever written in it (a run that libFuzzer ends on a
// crash or a limit skips this; test_fuzz.sh's own temporary directory holds it then)
static void remove_work_dir(void) {
    const char* names[] = {"template", "fuzz_000000.bin"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        remove(path);
    }
    rmdir(dir);
}

int LLVMFuzzerInitialize(int* argc, char*** argv) {
    (void)argc;
    target = FUZZ_TARGET;
    const char* tmp = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/fuzz_train_kla_XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(dir) == NULL) { fprintf(stderr, "fuzz: mkdtemp failed in %s\n", dir); exit(2); }
    atexit(remove_work_dir);
    (void)argv;
    if (setjmp(fuzz_die_jump)) { fprintf(stderr, "fuzz: the %s template could not be made\n", target); exit(2); }
    make_template();
    // what was allocated so far (the template, the encode target's tokenizer) lives for the whole run
    for (int i = 0; i < MAX_TRACKED; i++) { live_blocks[i] = NULL; open_files[i] = NULL; }
    return 0;
}

// Recompute the checksums of an edited model or state file (FORMATS.md "Checksums") where its header still says
// how; for the model, tensor sizes come from the (possibly edited) table entries, as checkpoint_file_intact reads them.
static void resign(unsigned char* b, size_t size) {
    if (size < 1024) { return; }
    int32_t header[256];
    memcpy(header, b, 1024);
    if (header[0] == MODEL_MAGIC && header[12] >= 1 && header[12] <= MAX_TENSORS &&
        1024 + (size_t)header[12] * TENSOR_ENTRY_BYTES <= size) {
        int n = header[12];
        size_t at = 1024 + (size_t)n * TENSOR_ENTRY_BYTES;
        for (int i = 0; i < n; i++) {
            unsigned char* e = b + 1024 + (size_t)i * TENSOR_ENTRY_BYTES;
            int32_t ints[6];
            memcpy(ints, e + 96, sizeof(ints));
            uint64_t bytes = 4;
            for (int d = 0; d < ints[1] && d < 4; d++) { bytes *= ints[d + 2] > 0 ? (uint64_t)ints[d + 2] : 0; }
            if (ints[1] < 1 || ints[1] > 4 || bytes > size - at) { break; }
            uint32_t crc = crc32c(0, b + at, bytes);
            memcpy(e + TENSOR_NAME_BYTES, &crc, 4);
            at += bytes;
        }
        memset(b + 4 * MODEL_CHECKSUM_SLOT, 0, 4);
        uint32_t crc = crc32c(0, b, 1024 + (size_t)n * TENSOR_ENTRY_BYTES);
        memcpy(b + 4 * MODEL_CHECKSUM_SLOT, &crc, 4);
    } else if (header[0] == STATE_MAGIC && header[6] >= 0 && (size_t)header[6] <= size - 1024) {
        uint64_t np = (uint64_t)(uint32_t)header[4] | ((uint64_t)(uint32_t)header[5] << 32);
        size_t loader_end = 1024 + (size_t)header[6];
        uint32_t crc[3] = {0, 0, 0};
        if (np < size && loader_end + np * 4 <= size) { crc[1] = crc32c(0, b + loader_end, np * 4); }
        if (np < size && loader_end + 2 * np * 4 <= size) { crc[2] = crc32c(0, b + loader_end + np * 4, np * 4); }
        memset(b + 4 * STATE_CHECKSUM_SLOT, 0, 12);
        crc[0] = crc32c(0, b, loader_end);
        memcpy(b + 4 * STATE_CHECKSUM_SLOT, crc, 12);
    }
}

static void run_encode(const uint8_t* data, size_t size) {
    size_t n;
    uint32_t* ids = tokenizer_encode(&tokenizer, (const char*)data, size, &n);
    // the bytes the encoder works on: the code points of the input, invalid pieces as U+FFFD, in UTF-8
    unsigned char* want = (unsigned char*)malloc_or_die(3 * size + 1);
    size_t want_len = 0;
    for (size_t pos = 0; pos < size;) { want_len += (size_t)tok_utf8_put(tok_utf8_next(data, size, &pos), want + want_len); }
    size_t got_len = 0;
    for (size_t i = 0; i < n; i++) {
        int len;
        const char* bytes = tokenizer_decode(&tokenizer, ids[i], &len);
        if (got_len + (size_t)len > want_len || memcmp(want + got_len, bytes, (size_t)len) != 0) {
            fprintf(stderr, "fuzz encode: decode(encode(text)) differs from the text at byte %zu\n", got_len);
            abort();
        }
        got_len += (size_t)len;
    }
    if (got_len != want_len) { fprintf(stderr, "fuzz encode: decode(encode(text)) has %zu bytes, the text %zu\n", got_len, want_len); abort(); }
    free(want);
    free(ids);
}

static void run_file_reader(void) {
    if (strcmp(target, "shard") == 0) {
        DataLoader l;
        snprintf(path, sizeof(path), "%s/fuzz_*.bin", dir);
        for (int rows = 0; rows < 2; rows++) {  // both layouts: DL_ROWS_CONTIGUOUS, DL_ROWS_INDEPENDENT
            dataloader_init(&l, path, 2, 8, 0, 1, rows, 1, 7, 50257);
            for (int i = 0; i < 30; i++) { dataloader_next_batch(&l); }
            DataLoaderState s;
            dataloader_get_state(&l, &s);
            dataloader_set_state(&l, &s);
            dataloader_free(&l);
        }
    } else if (strcmp(target, "model") == 0) {
        Config c;
        TensorTable tt;
        FILE* f = open_model_file(path, &c, &tt);
        float* params = (float*)malloc_or_die(tt.num_parameters * sizeof(float));
        read_model_payload(f, path, params, tt.num_parameters);
        free(params);
    } else if (strcmp(target, "state") == 0) {
        TrainState s;
        float* mv = (float*)malloc_or_die(200 * sizeof(float));
        read_state_file(&s, 100, mv, mv + 100, path);
        free(mv);
    } else if (strcmp(target, "evalfile") == 0) {
        EvalFile e;
        evalfile_load(&e, path, 50257);
        evalfile_free(&e);
    } else {
        Tokenizer t;
        tokenizer_init(&t, path);
        size_t n;
        uint32_t* ids = tokenizer_encode(&t, "Hello world, it's 2025!", 23, &n);
        for (size_t i = 0; i < n; i++) { int len; tokenizer_decode(&t, ids[i], &len); }
        free(ids);
        tokenizer_free(&t);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (setjmp(fuzz_die_jump) == 0) {
        if (strcmp(target, "encode") == 0) {
            run_encode(data, size);
        } else {
            // apply the edits to a copy of the template and write it where the reader looks
            unsigned char* b = (unsigned char*)malloc_or_die(template_size);
            memcpy(b, template_bytes, template_size);
            size_t len = template_size;
            int flags = size > 0 ? data[0] : 0;
            for (size_t r = 1; r + 5 <= size; r += 5) {
                uint32_t at;
                memcpy(&at, data + r, 4);
                at %= (uint32_t)template_size;
                if ((flags & 2) && r == 1) { len = at; continue; }
                b[at] ^= data[r + 4];
            }
            if (flags & 1) { resign(b, len); }
            snprintf(path, sizeof(path), "%s/fuzz_000000.bin", dir);
            FILE* f = fopen_or_die(path, "wb");
            fwrite_or_die(b, len, f, path);
            fclose(f);
            free(b);
            run_file_reader();
        }
    }
    release_leftovers();
    return 0;
}
