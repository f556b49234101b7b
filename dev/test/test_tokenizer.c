/*
test_tokenizer.c: checks tokenizer.h against the oracle, the npm package gpt-3-encoder (GPT-2's encoder).

    ./test_tokenizer TOKENIZER.bin ORACLE.bin FILE...

ORACLE.bin is written by dev/test/tokenizer_oracle.js for the same FILEs in the same order (format in
that script): every token's bytes, and for each FILE the package's token ids and the file's text as
node decoded it. dev/test/test_tokenizer.sh runs both on the demo corpus and on tokenizer_cases.txt.

One line per check, "PASS <check>" or "FAIL <check>: <first mismatch>"; exit status 1 if any check fails.
Checks about FILEs are made per directory (consecutive FILEs in the same directory form one group):
  encode      tokenizer_encode(file bytes) == the oracle's ids, token for token
  pre-tokens  the pre-tokens of tokenizer.h == the matches of the package's pattern (JavaScript regex)
  utf-8       the WHATWG decoding of tokenizer.h (invalid sequences -> U+FFFD) == node's
  round trip  decode(encode(x)) == x for valid UTF-8 x; for invalid x it is x with U+FFFD replacements,
              and encoding that cleaned text gives the same ids as encoding x
Plus the class tables, decoding of every token id, and a negative control showing that the comparison
does report a wrong encoding.
*/
#define _POSIX_C_SOURCE 200809L   // clock_gettime
#include <time.h>
#include "../../tokenizer.h"

static int num_failed = 0;

// print the result line of one check; detail (may be empty) says what went wrong
static void report(int ok, const char* name, const char* detail) {
    if (ok) {
        printf("PASS %s\n", name);
    } else {
        printf("FAIL %s: %s\n", name, detail);
        num_failed++;
    }
    fflush(stdout);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static unsigned char* read_file(const char* path, size_t* len) {
    FILE* f = fopen_or_die(path, "rb");
    if (fseek(f, 0, SEEK_END) != 0) { die("%s: cannot seek (%s)", path, strerror(errno)); }
    long size = ftell(f);
    if (size < 0) { die("%s: cannot tell its size (%s)", path, strerror(errno)); }
    rewind(f);
    unsigned char* buf = (unsigned char*)malloc_or_die((size_t)size);
    fread_or_die(buf, (size_t)size, f, path);
    fclose(f);
    *len = (size_t)size;
    return buf;
}

static uint32_t read_u32(FILE* f, const char* path) {
    uint32_t x;
    fread_or_die(&x, sizeof(x), f, path);
    return x;
}

// The position of the first difference of two id sequences (the shorter length if one is a prefix of the
// other), or SIZE_MAX if they are equal.
static size_t first_mismatch(const uint32_t* want, size_t nwant, const uint32_t* got, size_t ngot) {
    size_t n = nwant < ngot ? nwant : ngot;
    for (size_t i = 0; i < n; i++) {
        if (want[i] != got[i]) { return i; }
    }
    return nwant == ngot ? SIZE_MAX : n;
}

// append the ids a[from .. from+7) (those that exist) to a message
static void append_ids(char* msg, size_t cap, const uint32_t* a, size_t n, size_t from) {
    for (size_t i = from; i < n && i < from + 7; i++) {
        size_t used = strlen(msg);
        snprintf(msg + used, cap - used, "%s%u", i > from ? " " : "", a[i]);
    }
}

// describe the first mismatch of two id sequences
static void describe_mismatch(char* msg, size_t cap, const char* file, size_t pos,
                              const uint32_t* want, size_t nwant, const uint32_t* got, size_t ngot) {
    size_t from = pos >= 3 ? pos - 3 : 0;
    snprintf(msg, cap, "%s: first mismatch at token %zu of %zu expected (%zu got); ids from %zu: expected [",
             file, pos, nwant, ngot, from);
    append_ids(msg, cap, want, nwant, from);
    size_t used = strlen(msg);
    snprintf(msg + used, cap - used, "] got [");
    append_ids(msg, cap, got, ngot, from);
    used = strlen(msg);
    snprintf(msg + used, cap - used, "]");
}

// the bytes that the WHATWG decoder + UTF-8 encoder turn s into: invalid sequences become EF BF BD
static unsigned char* clean_utf8(const unsigned char* s, size_t len, size_t* out_len) {
    unsigned char* out = (unsigned char*)malloc_or_die(3 * len);
    size_t n = 0;
    for (size_t p = 0; p < len;) { n += (size_t)tok_utf8_put(tok_utf8_next(s, len, &p), out + n); }
    *out_len = n;
    return out;
}

// the concatenated bytes of a sequence of token ids
static unsigned char* decode_all(const Tokenizer* t, const uint32_t* ids, size_t n, size_t* out_len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        int len;
        tokenizer_decode(t, ids[i], &len);
        total += (size_t)len;
    }
    unsigned char* out = (unsigned char*)malloc_or_die(total);
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        int len;
        const char* s = tokenizer_decode(t, ids[i], &len);
        memcpy(out + used, s, (size_t)len);
        used += (size_t)len;
    }
    *out_len = total;
    return out;
}

// the position of the first difference of two byte strings, SIZE_MAX if equal
static size_t first_byte_mismatch(const unsigned char* a, size_t na, const unsigned char* b, size_t nb) {
    size_t n = na < nb ? na : nb;
    for (size_t i = 0; i < n; i++) {
        if (a[i] != b[i]) { return i; }
    }
    return na == nb ? SIZE_MAX : n;
}

// Compare the pre-tokens of text with the oracle's byte lengths of the pattern's matches (lengths in the
// text with invalid UTF-8 replaced, as node sees it); describe the first difference in msg.
static void check_pretokens(const char* path, const unsigned char* text, size_t len,
                            const uint32_t* want, size_t nwant, char* msg, size_t cap) {
    size_t k = 0, offset = 0;   // pre-token index, its offset in the cleaned text
    for (size_t start = 0; start < len; k++) {
        size_t end = tok_pretoken_end(text, len, start);
        size_t n = 0;
        unsigned char buf[4];
        for (size_t p = start; p < end;) { n += (size_t)tok_utf8_put(tok_utf8_next(text, len, &p), buf); }
        if (k >= nwant || want[k] != n) {
            snprintf(msg, cap, "%s: pre-token %zu at byte %zu (of the U+FFFD-cleaned text): %zu bytes, expected %s%u",
                     path, k, offset, n, k >= nwant ? "none, the pattern has " : "", k >= nwant ? (uint32_t)nwant : want[k]);
            return;
        }
        offset += n;
        start = end;
    }
    if (k != nwant) { snprintf(msg, cap, "%s: %zu pre-tokens, the pattern has %zu", path, k, nwant); }
}

// the range tables are sorted and disjoint, and tok_class's ASCII fast path agrees with them
static void check_class_tables(void) {
    const struct { const char* name; const uint32_t (*r)[2]; size_t n; } tables[] = {
        { "tok_letter_ranges", tok_letter_ranges, TOK_NRANGES(tok_letter_ranges) },
        { "tok_number_ranges", tok_number_ranges, TOK_NRANGES(tok_number_ranges) },
        { "tok_space_ranges", tok_space_ranges, TOK_NRANGES(tok_space_ranges) },
    };
    char msg[256] = "";
    for (size_t k = 0; k < 3 && msg[0] == '\0'; k++) {
        for (size_t i = 0; i < tables[k].n; i++) {
            if (tables[k].r[i][0] > tables[k].r[i][1] || (i > 0 && tables[k].r[i][0] <= tables[k].r[i - 1][1])) {
                snprintf(msg, sizeof(msg), "%s: range %zu is empty or not after range %zu", tables[k].name, i, i - 1);
                break;
            }
        }
    }
    for (uint32_t cp = 0; cp < 128 && msg[0] == '\0'; cp++) {
        if (tok_class(cp) != tok_class_from_tables(cp)) {
            snprintf(msg, sizeof(msg), "ASCII fast path gives class %d for U+%04X, the tables %d",
                     tok_class(cp), cp, tok_class_from_tables(cp));
        }
    }
    report(msg[0] == '\0', "class tables sorted and disjoint, ASCII fast path agrees with them", msg);
}

// Results of the per-file checks of one directory, reported when the directory's last file is done.
typedef struct {
    char dir[512];
    size_t files, tokens;
    double encode_seconds;
    // the first failure of each check, "" if none
    char encode_msg[1024], pretoken_msg[512], utf8_msg[512], roundtrip_msg[512];
} Group;

static void group_report(const Group* g) {
    char name[1024];
    snprintf(name, sizeof(name), "encode == gpt-3-encoder: %s (%zu files, %zu tokens, %.2f s)",
             g->dir, g->files, g->tokens, g->encode_seconds);
    report(g->encode_msg[0] == '\0', name, g->encode_msg);
    snprintf(name, sizeof(name), "pre-tokens == the package's pattern: %s", g->dir);
    report(g->pretoken_msg[0] == '\0', name, g->pretoken_msg);
    snprintf(name, sizeof(name), "utf-8 decoding == node: %s", g->dir);
    report(g->utf8_msg[0] == '\0', name, g->utf8_msg);
    snprintf(name, sizeof(name), "round trip decode(encode(x)): %s", g->dir);
    report(g->roundtrip_msg[0] == '\0', name, g->roundtrip_msg);
}

// the directory part of a path ("." if none)
static void dir_of(const char* path, char* out, size_t cap) {
    const char* slash = strrchr(path, '/');
    if (slash == NULL) { snprintf(out, cap, "."); }
    else { snprintf(out, cap, "%.*s", (int)(slash - path), path); }
}

int main(int argc, char** argv) {
    if (argc < 4) { die("usage: %s TOKENIZER.bin ORACLE.bin FILE...", argv[0]); }
    const char* tok_path = argv[1];
    const char* oracle_path = argv[2];
    int num_files = argc - 3;

    Tokenizer t;
    tokenizer_init(&t, tok_path);
    check_class_tables();

    // decoding: every token id gives the bytes the oracle derived from encoder.json
    FILE* f = fopen_or_die(oracle_path, "rb");
    uint32_t oracle_vocab = read_u32(f, oracle_path);
    char msg[1024] = "";
    if (oracle_vocab != t.vocab_size) {
        snprintf(msg, sizeof(msg), "the oracle has %u tokens, %s %u", oracle_vocab, tok_path, t.vocab_size);
    }
    unsigned char want_bytes[256];
    for (uint32_t id = 0; id < oracle_vocab; id++) {
        uint32_t n = read_u32(f, oracle_path);
        if (n > sizeof(want_bytes)) { die("%s: token %u has %u bytes", oracle_path, id, n); }
        fread_or_die(want_bytes, n, f, oracle_path);
        if (msg[0] != '\0') { continue; }
        int len;
        const char* got = tokenizer_decode(&t, id, &len);
        if ((uint32_t)len != n || memcmp(got, want_bytes, n) != 0) {
            snprintf(msg, sizeof(msg), "token %u: %d bytes, expected %u bytes", id, len, n);
        }
    }
    char name[256];
    snprintf(name, sizeof(name), "decode of all %u token ids == the bytes of encoder.json", t.vocab_size);
    report(msg[0] == '\0', name, msg);
    int eot_ok = t.eot_token == 50256 && t.vocab_size == 50257;
    report(eot_ok, "vocab_size 50257, eot_token 50256", "other values in the tokenizer file");

    uint32_t oracle_files = read_u32(f, oracle_path);
    if (oracle_files != (uint32_t)num_files) {
        die("%s: has %u files, %d given on the command line", oracle_path, oracle_files, num_files);
    }
    Group g;
    memset(&g, 0, sizeof(g));
    // ids of the first non-empty file, kept for the negative control
    uint32_t* control_want = NULL;
    size_t control_n = 0;
    const char* control_file = NULL;
    for (int k = 0; k < num_files; k++) {
        const char* path = argv[3 + k];
        char dir[512];
        dir_of(path, dir, sizeof(dir));
        if (g.files > 0 && strcmp(dir, g.dir) != 0) {
            group_report(&g);
            memset(&g, 0, sizeof(g));
        }
        snprintf(g.dir, sizeof(g.dir), "%s", dir);
        g.files++;

        size_t len;
        unsigned char* text = read_file(path, &len);
        // the oracle's record of this file
        uint32_t nwant = read_u32(f, oracle_path);
        uint32_t* want = (uint32_t*)malloc_or_die((size_t)nwant * sizeof(uint32_t));
        fread_or_die(want, (size_t)nwant * sizeof(uint32_t), f, oracle_path);
        uint32_t npre = read_u32(f, oracle_path);
        uint32_t* pre = (uint32_t*)malloc_or_die((size_t)npre * sizeof(uint32_t));
        fread_or_die(pre, (size_t)npre * sizeof(uint32_t), f, oracle_path);
        uint32_t valid = read_u32(f, oracle_path);
        size_t node_len = len;
        unsigned char* node_text = text;   // node's decoding of the file, re-encoded
        if (!valid) {
            node_len = read_u32(f, oracle_path);
            node_text = (unsigned char*)malloc_or_die(node_len);
            fread_or_die(node_text, node_len, f, oracle_path);
        }

        // encode
        double t0 = now_seconds();
        size_t ngot;
        uint32_t* got = tokenizer_encode(&t, (const char*)text, len, &ngot);
        g.encode_seconds += now_seconds() - t0;
        g.tokens += ngot;
        size_t pos = first_mismatch(want, nwant, got, ngot);
        if (pos != SIZE_MAX && g.encode_msg[0] == '\0') {
            describe_mismatch(g.encode_msg, sizeof(g.encode_msg), path, pos, want, nwant, got, ngot);
        }
        if (control_want == NULL && nwant > 0) {
            control_want = want;
            control_n = nwant;
            control_file = path;
            want = NULL;
        }

        // pre-tokens
        if (g.pretoken_msg[0] == '\0') {
            check_pretokens(path, text, len, pre, npre, g.pretoken_msg, sizeof(g.pretoken_msg));
        }

        // utf-8: our cleaning == node's decoding
        size_t clean_len;
        unsigned char* clean = clean_utf8(text, len, &clean_len);
        pos = first_byte_mismatch(node_text, node_len, clean, clean_len);
        if (pos != SIZE_MAX && g.utf8_msg[0] == '\0') {
            snprintf(g.utf8_msg, sizeof(g.utf8_msg), "%s: first difference at byte %zu of node's decoding", path, pos);
        }

        // round trip: decode(encode(text)) == cleaned text (== text when valid); encode(cleaned) == encode(text)
        size_t back_len;
        unsigned char* back = decode_all(&t, got, ngot, &back_len);
        pos = first_byte_mismatch(clean, clean_len, back, back_len);
        if (pos != SIZE_MAX && g.roundtrip_msg[0] == '\0') {
            snprintf(g.roundtrip_msg, sizeof(g.roundtrip_msg), "%s: decode(encode(x)) differs at byte %zu", path, pos);
        }
        if (clean_len != len || memcmp(clean, text, len) != 0) {
            size_t nagain;
            uint32_t* again = tokenizer_encode(&t, (const char*)clean, clean_len, &nagain);
            pos = first_mismatch(got, ngot, again, nagain);
            if (pos != SIZE_MAX && g.roundtrip_msg[0] == '\0') {
                snprintf(g.roundtrip_msg, sizeof(g.roundtrip_msg),
                         "%s: encoding the U+FFFD-cleaned text differs at token %zu", path, pos);
            }
            free(again);
        }

        free(back);
        free(clean);
        if (node_text != text) { free(node_text); }
        free(got);
        free(pre);
        free(want);
        free(text);
    }
    if (g.files > 0) { group_report(&g); }
    if (fgetc(f) != EOF) { die("%s: unexpected bytes after the last file's record", oracle_path); }
    fclose(f);

    // negative control: the comparison above must report a wrong encoding. Compare the oracle's ids of the
    // first non-empty file with a copy that has one id changed, and with a copy that lacks the last id.
    snprintf(msg, sizeof(msg), "no file with tokens to alter");
    if (control_want != NULL) {
        uint32_t* wrong = (uint32_t*)malloc_or_die(control_n * sizeof(uint32_t));
        memcpy(wrong, control_want, control_n * sizeof(uint32_t));
        size_t at = control_n / 2;
        wrong[at] = (wrong[at] + 1) % t.vocab_size;
        size_t pos_changed = first_mismatch(control_want, control_n, wrong, control_n);
        size_t pos_short = first_mismatch(control_want, control_n, control_want, control_n - 1);
        if (pos_changed == at && pos_short == control_n - 1) {
            msg[0] = '\0';
        } else {
            snprintf(msg, sizeof(msg), "%s: altered id %zu reported at %zu, dropped last id at %zu",
                     control_file, at, pos_changed, pos_short);
        }
        free(wrong);
    }
    report(msg[0] == '\0', "negative control: an altered id and a missing id are reported as mismatches", msg);
    free(control_want);

    tokenizer_free(&t);
    return num_failed > 0 ? 1 : 0;
}
