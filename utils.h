/*
utils.h: error reporting and checked I/O shared by every program of train_kla.

Every failure the user can cause (a bad flag, a missing or corrupt file) ends the same way: one line
"error: <what, naming the file or flag>" on stderr and exit code 1. Nothing here ever aborts or dumps core.
*/
#ifndef TRAIN_KLA_UTILS_H
#define TRAIN_KLA_UTILS_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#ifdef FUZZING
// the fuzz harness (dev/test/fuzz.c) runs many inputs in one process: die() returns there instead of exiting
#include <setjmp.h>
static jmp_buf fuzz_die_jump;
#endif

// print "error: ..." and exit(1). The message must not end with a newline.
static inline void die(const char* fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static inline void die(const char* fmt, ...) {
#ifdef FUZZING
    (void)fmt;
    longjmp(fuzz_die_jump, 1);
#else
    // the line is formatted first and written in one piece, so that the ranks of a multi-GPU run, which may all
    // stop at once, never interleave their lines
    char line[4096];
    va_list ap;
    fflush(stdout);
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "error: %s\n", line);
    exit(1);
#endif
}

static inline void* malloc_or_die(size_t size) {
    void* p = malloc(size > 0 ? size : 1);
    if (p == NULL) { die("out of memory allocating %zu bytes", size); }
    return p;
}

static inline void* calloc_or_die(size_t n, size_t size) {
    void* p = calloc(n > 0 ? n : 1, size > 0 ? size : 1);
    if (p == NULL) { die("out of memory allocating %zu x %zu bytes", n, size); }
    return p;
}

static inline FILE* fopen_or_die(const char* path, const char* mode) {
    FILE* f = fopen(path, mode);
    if (f == NULL) { die("%s: cannot open (%s)", path, strerror(errno)); }
    return f;
}

// read exactly n bytes or die saying the file is truncated
static inline void fread_or_die(void* buf, size_t n, FILE* f, const char* path) {
    size_t got = fread(buf, 1, n, f);
    if (got != n) {
        if (ferror(f)) { die("%s: read error (%s)", path, strerror(errno)); }
        die("%s: truncated (a read of %zu bytes found only %zu before the end of the file)", path, n, got);
    }
}

static inline void fwrite_or_die(const void* buf, size_t n, FILE* f, const char* path) {
    if (n > 0 && fwrite(buf, 1, n, f) != n) { die("%s: write failed (%s)", path, strerror(errno)); }
}

// CRC32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78), the checksum of the model and state files
// (FORMATS.md "Checksums"). Chainable like zlib's crc32: crc32c(crc32c(0, a), b) == crc32c(0, a ++ b). Software
// slice-by-8 (eight bytes per step through eight 256-entry tables, ~2 GB/s) so every compiler builds it.
static inline uint32_t crc32c(uint32_t crc, const void* buf, size_t n) {
    static uint32_t table[8][256];
    static int ready = 0;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) { c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u))); }
            table[0][i] = c;
        }
        for (int t = 1; t < 8; t++) {
            for (int i = 0; i < 256; i++) { table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff]; }
        }
        ready = 1;
    }
    const unsigned char* p = (const unsigned char*)buf;
    crc = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = table[7][lo & 0xff] ^ table[6][(lo >> 8) & 0xff] ^ table[5][(lo >> 16) & 0xff] ^ table[4][lo >> 24] ^
              table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^ table[0][p[7]];
    }
    for (; n > 0; n--, p++) { crc = (crc >> 8) ^ table[0][(crc ^ *p) & 0xff]; }
    return ~crc;
}

// bit-cast helpers for float fields stored in int32 header slots
static inline int32_t f32_to_slot(float x) { int32_t i; memcpy(&i, &x, 4); return i; }
static inline float slot_to_f32(int32_t i) { float x; memcpy(&x, &i, 4); return x; }

// splitmix64: the random numbers of initialisation, sampling and the synthetic tasks; the state is one uint64
static inline uint64_t rng_next(uint64_t* state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

#endif // TRAIN_KLA_UTILS_H
