/*
encode_shards.c: encodes plain-text documents with tokenizer.h into llm.c uint16 token shards (FORMATS.md),
the training data of ./train_kla (README "Train on your own text").

    ./encode_shards [-t tokenizer.bin] [-o outdir] [-n name] [-s max_tokens] [-v N | -p F] [-f list] [FILE...]

      -t  the tokenizer file (default data/tokenizer.bin, made by make data)
      -o  the output directory, created if missing (default data/demo)
      -n  the dataset name in the shard names (default demo)
      -s  the most tokens per shard (default 1000000)
      -v  split by documents: the 1st, (N+1)-th, (2N+1)-th, ... document goes to val, the rest to train
          (default 20, about 5%); 0 = everything to train
      -p  split inside every document instead: its last fraction F (0 < F < 1) of bytes goes to val, cut at a
          space or line break so that both parts encode as the whole would; for one or a few long texts
      -f  a file naming documents, one path per line (empty lines ignored); - reads the list from stdin
      FILE  a document; - is the standard input (one document)
      -h  this help

Every file is one document. Each document (or each part of one, with -p) is encoded as EOT (the tokenizer's
eot_token, 50256) followed by its tokens. The documents are taken in sorted path order (strcmp of the paths as
given). Each split is written as consecutive shards <outdir>/<name>_train_%06d.bin and <outdir>/<name>_val_%06d.bin,
numbered from 0, all full except the last; a document may continue from one shard into the next. Each shard is
written under a temporary name, flushed to disk and then renamed, so a shard file that exists is complete.
Inputs above 8 MiB get a progress line on stderr. Errors (a missing, empty or unreadable document, a split that
leaves train or val empty, a bad flag) are one line naming the file or flag, before any shard is written.
*/
#define _POSIX_C_SOURCE 200809L
#include <glob.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "../tokenizer.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define PIECE_BYTES (1 << 20)          // a long document is encoded in pieces of about this many bytes
#define PROGRESS_BYTES (8u << 20)      // inputs above this size get a progress line

// the shards written so far, removed again if the program exits with an error (see remove_partial_output)
static char** written_paths = NULL;
static size_t num_written = 0;
static int finished = 0;

// the shards of one split, filled one at a time
typedef struct {
    const char* outdir;
    const char* name;      // dataset name
    const char* split;     // "train" or "val"
    uint16_t* buf;         // the shard being filled
    size_t fill, cap;      // tokens in buf, the most per shard
    int shard;             // index of the shard in buf
    size_t docs, tokens;   // totals of this split
} ShardWriter;

static void writer_init(ShardWriter* w, const char* outdir, const char* name, const char* split, size_t cap) {
    memset(w, 0, sizeof(*w));
    w->outdir = outdir;
    w->name = name;
    w->split = split;
    w->cap = cap;
    w->buf = (uint16_t*)malloc_or_die(cap * sizeof(uint16_t));
}

// write the filled part of buf as the next shard: to <path>.tmp, flush, fsync, rename to <path>
static void writer_flush(ShardWriter* w) {
    char path[4096], tmp[4100];
    snprintf(path, sizeof(path), "%s/%s_%s_%06d.bin", w->outdir, w->name, w->split, w->shard);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    int32_t header[256] = {0};
    header[0] = SHARD_MAGIC;
    header[1] = SHARD_VERSION;
    header[2] = (int32_t)w->fill;
    FILE* f = fopen_or_die(tmp, "wb");
    fwrite_or_die(header, sizeof(header), f, tmp);
    fwrite_or_die(w->buf, w->fill * sizeof(uint16_t), f, tmp);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) { die("%s: cannot flush to disk (%s)", tmp, strerror(errno)); }
    if (fclose(f) != 0) { die("%s: cannot close (%s)", tmp, strerror(errno)); }
    if (rename(tmp, path) != 0) { die("%s: cannot rename to %s (%s)", tmp, path, strerror(errno)); }
    written_paths = (char**)realloc(written_paths, (num_written + 1) * sizeof(char*));
    if (written_paths == NULL) { die("out of memory"); }
    written_paths[num_written] = (char*)malloc_or_die(strlen(path) + 1);
    memcpy(written_paths[num_written++], path, strlen(path) + 1);
    printf("%s: %zu tokens\n", path, w->fill);
    w->fill = 0;
    w->shard++;
}

// append tokens, writing out every shard that becomes full
static void writer_add(ShardWriter* w, const uint32_t* ids, size_t n) {
    for (size_t i = 0; i < n; i++) {
        w->buf[w->fill++] = (uint16_t)ids[i];
        if (w->fill == w->cap) { writer_flush(w); }
    }
    w->tokens += n;
}

// atexit: a run that ends in an error leaves no shards behind (the ones it wrote are removed)
static void remove_partial_output(void) {
    if (finished) { return; }
    for (size_t i = 0; i < num_written; i++) { remove(written_paths[i]); }
}

static int compare_paths(const void* a, const void* b) {
    return strcmp(*(const char* const*)a, *(const char* const*)b);
}

// a list of paths that grows as needed
typedef struct {
    char** paths;
    size_t n, cap;
} PathList;

static void paths_add(PathList* l, const char* path) {
    if (l->n == l->cap) {
        l->cap = l->cap * 2 + 64;
        char** grown = (char**)realloc(l->paths, l->cap * sizeof(char*));
        if (grown == NULL) { die("out of memory for %zu paths", l->cap); }
        l->paths = grown;
    }
    size_t len = strlen(path);
    l->paths[l->n] = (char*)malloc_or_die(len + 1);
    memcpy(l->paths[l->n], path, len + 1);
    l->n++;
}

// add the paths listed in a file (- : stdin), one per line, ignoring empty lines
static void paths_add_list(PathList* l, const char* list_path) {
    int from_stdin = strcmp(list_path, "-") == 0;
    FILE* f = from_stdin ? stdin : fopen_or_die(list_path, "rb");
    char line[4096];
    int lineno = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        lineno++;
        size_t len = strlen(line);
        if (len == sizeof(line) - 1 && line[len - 1] != '\n') { die("%s: line %d is too long", list_path, lineno); }
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) { line[--len] = '\0'; }
        if (len > 0) { paths_add(l, line); }
    }
    if (ferror(f)) { die("%s: read error (%s)", list_path, strerror(errno)); }
    if (!from_stdin) { fclose(f); }
}

// the whole of a document (- : stdin); an empty one is an error
static unsigned char* read_document(const char* path, size_t* len) {
    int from_stdin = strcmp(path, "-") == 0;
    FILE* f = from_stdin ? stdin : fopen_or_die(path, "rb");
    size_t cap = 1 << 16, n = 0;
    unsigned char* buf = (unsigned char*)malloc_or_die(cap);
    for (;;) {
        n += fread(buf + n, 1, cap - n, f);
        if (ferror(f)) { die("%s: read error (%s)", path, strerror(errno)); }
        if (n < cap) { break; }   // fread came up short without an error: end of file
        cap *= 2;
        unsigned char* grown = (unsigned char*)realloc(buf, cap);
        if (grown == NULL) { die("%s: out of memory reading it", path); }
        buf = grown;
    }
    if (!from_stdin) { fclose(f); }
    if (n == 0) { die("%s: empty document", from_stdin ? "- (stdin)" : path); }
    *len = n;
    return buf;
}

// A text may be cut before byte p without changing its tokens when p is a single space between two printable
// ASCII characters ("a| b") or follows a single line break between two ("a\n|b"): no pre-token of GPT-2's
// pattern (tokenizer.h) crosses such a place, so the two parts encode to the tokens of the whole.
// dev/test/tokenizer_oracle.js cuts the JavaScript encoder's input at the same places; test_encode_shards.sh
// checks that a document encoded in pieces gives that encoder's tokens.
static int printable(unsigned char c) { return c > 0x20 && c < 0x7f; }
static int is_safe_cut(const unsigned char* s, size_t len, size_t p) {
    if (p < 2 || p + 1 >= len) { return 0; }
    return (s[p] == ' ' && printable(s[p - 1]) && printable(s[p + 1])) || (s[p - 1] == '\n' && printable(s[p - 2]) && printable(s[p]));
}

// the first safe cut at or after from, before end; end if there is none
static size_t next_safe_cut(const unsigned char* s, size_t end, size_t from) {
    for (size_t p = from; p < end; p++) { if (is_safe_cut(s, end, p)) { return p; } }
    return end;
}

// the progress line on stderr, refreshed at most twice a second
typedef struct {
    size_t total_bytes, bytes, tokens, docs, total_docs;
    double start, last;
} Progress;

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void progress_show(Progress* pr, int force) {
    if (pr->total_bytes <= PROGRESS_BYTES) { return; }
    double now = seconds_now();
    if (!force && now - pr->last < 0.5) { return; }
    pr->last = now;
    double mb = pr->bytes / 1e6, rate = mb / (now - pr->start > 1e-9 ? now - pr->start : 1e-9);
    fprintf(stderr, "\rencoded %.1f of %.1f MB (%.0f%%), %zu of %zu documents, %.2fM tokens, %.1f MB/s%s", mb,
            pr->total_bytes / 1e6, 100.0 * pr->bytes / pr->total_bytes, pr->docs, pr->total_docs, pr->tokens / 1e6,
            rate, force ? "\n" : "");
    fflush(stderr);
}

// EOT, then the tokens of text[begin, end) in pieces of about PIECE_BYTES cut at safe places, into w
static void encode_span(const Tokenizer* t, const unsigned char* text, size_t begin, size_t end, ShardWriter* w, Progress* pr) {
    const uint32_t eot = t->eot_token;
    writer_add(w, &eot, 1);
    while (begin < end) {
        size_t cut = end - begin > PIECE_BYTES ? next_safe_cut(text, end, begin + PIECE_BYTES) : end;
        size_t n;
        uint32_t* ids = tokenizer_encode(t, (const char*)text + begin, cut - begin, &n);
        writer_add(w, ids, n);
        free(ids);
        pr->bytes += cut - begin;
        pr->tokens += n;
        progress_show(pr, 0);
        begin = cut;
    }
}

// a flag's value as a whole number in [lo, hi], or die naming the flag
static long long parse_integer(const char* flag, const char* val, long long lo, long long hi, const char* what) {
    char* end;
    errno = 0;
    long long x = strtoll(val, &end, 10);
    if (errno != 0 || end == val || *end != '\0' || x < lo || x > hi) { die("%s: expected %s, got '%s'", flag, what, val); }
    return x;
}

// a flag's value as a fraction strictly between 0 and 1, or die naming the flag
static double parse_fraction(const char* flag, const char* val) {
    char* end;
    errno = 0;
    double x = strtod(val, &end);
    if (errno != 0 || end == val || *end != '\0' || !(x > 0.0 && x < 1.0)) { die("%s: expected a fraction between 0 and 1, got '%s'", flag, val); }
    return x;
}

#define USAGE "usage: ./encode_shards [-t tokenizer.bin] [-o outdir] [-n name] [-s max_tokens] [-v N | -p F] [-f list] [FILE...]"

static void print_help(void) {
    printf("%s\n"
           "Encodes plain-text documents (every FILE is one) into llm.c uint16 token shards for ./train_kla:\n"
           "<outdir>/<name>_train_%%06d.bin and <outdir>/<name>_val_%%06d.bin, EOT before each document.\n"
           "  -t FILE  the tokenizer file (default data/tokenizer.bin, made by make data)\n"
           "  -o DIR   the output directory, created if missing (default data/demo)\n"
           "  -n NAME  the dataset name in the shard names (default demo)\n"
           "  -s N     the most tokens per shard (default 1000000)\n"
           "  -v N     split by documents: the 1st, (N+1)-th, ... in sorted order go to val (default 20); 0 = all to train\n"
           "  -p F     split inside every document instead: its last fraction F (0 < F < 1) goes to val\n"
           "  -f LIST  a file naming documents, one path per line; - reads the list from stdin\n"
           "  FILE     a document; - reads one from stdin\n"
           "  -h       this help\n"
           "Example: ./encode_shards -o data/book -n book -p 0.1 book.txt\n", USAGE);
}

int main(int argc, char** argv) {
    const char* tok_path = "data/tokenizer.bin";
    const char* outdir = "data/demo";
    const char* name = "demo";
    long long max_tokens = 1000000;
    int val_every = 20, val_every_given = 0;
    double val_fraction = 0.0;   // -p; 0 = split by documents (-v)
    int list_from_stdin = 0;
    PathList docs = {0};

    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (arg[0] != '-' || arg[1] == '\0') { paths_add(&docs, arg); continue; }
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) { print_help(); return 0; }
        if (arg[2] != '\0' || strchr("tonsfvp", arg[1]) == NULL) { die("unknown flag %s (./encode_shards -h lists them)", arg); }
        if (i + 1 >= argc) { die("flag %s needs a value (" USAGE ")", arg); }
        const char* val = argv[++i];
        switch (arg[1]) {
            case 't': tok_path = val; break;
            case 'o': outdir = val; break;
            case 'n': name = val; break;
            case 'f': list_from_stdin |= strcmp(val, "-") == 0; paths_add_list(&docs, val); break;
            case 's': max_tokens = parse_integer("-s", val, 1, INT32_MAX, "a number of tokens from 1 to 2147483647"); break;
            case 'v': val_every = (int)parse_integer("-v", val, 0, INT32_MAX, "0 or a number of documents >= 2"); val_every_given = 1; break;
            case 'p': val_fraction = parse_fraction("-p", val); break;
        }
    }
    if (name[0] == '\0' || strchr(name, '/') != NULL) { die("-n: bad dataset name '%s'", name); }
    if (val_every == 1) { die("-v: 1 would send every document to val and leave train empty; use 0 (no val) or >= 2"); }
    if (val_fraction > 0.0 && val_every_given) { die("-p: give either -v (split by documents) or -p (split inside them), not both"); }
    if (docs.n == 0) { die("no documents: give FILEs, -f list, or - for stdin (./encode_shards -h)"); }
    if (val_fraction == 0.0 && val_every >= 2 && docs.n == 1) {
        die("%s: one document, and -v %d sends the first document to val, leaving train empty; split it with -p 0.05",
            docs.paths[0], val_every);
    }
    // before anything is written: every document is there, not a directory and not empty (stdin is read now)
    qsort(docs.paths, docs.n, sizeof(char*), compare_paths);
    Progress progress = {0};
    progress.total_docs = docs.n;
    unsigned char* stdin_text = NULL;
    size_t stdin_len = 0;
    for (size_t k = 0; k < docs.n; k++) {
        const char* path = docs.paths[k];
        if (k > 0 && strcmp(path, docs.paths[k - 1]) == 0) { die("%s: document listed twice", path); }
        if (strcmp(path, "-") == 0) {
            if (list_from_stdin) { die("-: the standard input cannot hold both the list (-f -) and a document"); }
            stdin_text = read_document(path, &stdin_len);
            progress.total_bytes += stdin_len;
            continue;
        }
        struct stat st;
        fclose(fopen_or_die(path, "rb"));
        if (stat(path, &st) != 0) { die("%s: cannot stat (%s)", path, strerror(errno)); }
        if (S_ISDIR(st.st_mode)) { die("%s: is a directory, not a document", path); }
        if (S_ISREG(st.st_mode) && st.st_size == 0) { die("%s: empty document", path); }
        progress.total_bytes += (size_t)st.st_size;
    }

    Tokenizer t;
    tokenizer_init(&t, tok_path);
    if (t.vocab_size > 65536) { die("%s: vocab_size %u does not fit uint16 shards", tok_path, t.vocab_size); }
    if (mkdir(outdir, 0777) != 0 && errno != EEXIST) { die("%s: cannot create directory (%s)", outdir, strerror(errno)); }
    // old shards of the same name would be read together with the new ones by a glob
    const char* splits[2] = {"train", "val"};
    for (int i = 0; i < 2; i++) {
        char pattern[4200];
        snprintf(pattern, sizeof(pattern), "%s/%s_%s_*.bin", outdir, name, splits[i]);
        glob_t g;
        if (glob(pattern, 0, NULL, &g) == 0) {
            die("%s: already holds shards of '%s' (%s); remove them or choose another -o or -n", outdir, name, g.gl_pathv[0]);
        }
        globfree(&g);
    }
    atexit(remove_partial_output);

    ShardWriter train, val;
    writer_init(&train, outdir, name, "train", (size_t)max_tokens);
    writer_init(&val, outdir, name, "val", (size_t)max_tokens);
    progress.start = seconds_now();
    for (size_t k = 0; k < docs.n; k++) {
        size_t len;
        unsigned char* text = strcmp(docs.paths[k], "-") == 0 ? stdin_text : read_document(docs.paths[k], &len);
        if (text == stdin_text) { len = stdin_len; }
        if (val_fraction > 0.0) {
            // the cut nearest after (1 - F) of the bytes, else the nearest before
            size_t target = (size_t)((1.0 - val_fraction) * (double)len), cut = next_safe_cut(text, len, target);
            while (cut == len && target > 0) { cut = is_safe_cut(text, len, --target) ? target : len; }
            if (cut == len) { die("%s: no place to split it for -p (a space or line break between two printable characters)", docs.paths[k]); }
            encode_span(&t, text, 0, cut, &train, &progress);
            encode_span(&t, text, cut, len, &val, &progress);
            train.docs++;
            val.docs++;
        } else {
            ShardWriter* w = val_every > 0 && k % val_every == 0 ? &val : &train;
            encode_span(&t, text, 0, len, w, &progress);
            w->docs++;
        }
        progress.docs++;
        free(text);
        free(docs.paths[k]);
    }
    progress_show(&progress, 1);
    // the last, partly filled shards
    if (train.fill > 0) { writer_flush(&train); }
    if (val.fill > 0) { writer_flush(&val); }
    const char* unit = val_fraction > 0.0 ? "document parts" : "documents";
    printf("train: %zu %s, %zu tokens in %d shards\n", train.docs, unit, train.tokens, train.shard);
    printf("val: %zu %s, %zu tokens in %d shards\n", val.docs, unit, val.tokens, val.shard);
    finished = 1;

    free(train.buf);
    free(val.buf);
    free(docs.paths);
    tokenizer_free(&t);
    return 0;
}
