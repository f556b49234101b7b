/*
encode_shards.c: encodes plain-text documents with tokenizer.h into llm.c uint16 token shards (FORMATS.md).

    ./encode_shards [-t tokenizer.bin] [-o outdir] [-n name] [-s max_tokens] [-f list] [FILE...]

      -t  the tokenizer file (default data/tokenizer.bin)
      -o  the output directory, created if missing (default data/demo)
      -n  the dataset name in the shard names (default demo)
      -s  the most tokens per shard (default 1000000)
      -f  a file naming documents, one path per line (empty lines ignored); FILE arguments are added to it

Every file is one document. Each document is encoded as EOT (the tokenizer's eot_token, 50256) followed by
its tokens. The documents are taken in sorted path order (strcmp of the paths as given); the 1st, 21st,
41st, ... (index % 20 == 0) go to val, about 5%, the rest to train. Each split is written as consecutive
shards <outdir>/<name>_train_%06d.bin and <outdir>/<name>_val_%06d.bin, numbered from 0, all full except
the last; a document may continue from one shard into the next. Each shard is written under a temporary
name, flushed to disk and then renamed, so a shard file that exists is complete.
*/
#define _POSIX_C_SOURCE 200809L
#include <sys/stat.h>
#include <unistd.h>
#include "../tokenizer.h"

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define VAL_EVERY 20

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

// add the paths listed in a file, one per line, ignoring empty lines
static void paths_add_list(PathList* l, const char* list_path) {
    FILE* f = fopen_or_die(list_path, "rb");
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
    fclose(f);
}

static unsigned char* read_document(const char* path, size_t* len) {
    FILE* f = fopen_or_die(path, "rb");
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
    fclose(f);
    *len = n;
    return buf;
}

#define USAGE "usage: ./encode_shards [-t tokenizer.bin] [-o outdir] [-n name] [-s max_tokens] [-f list] [FILE...]"

int main(int argc, char** argv) {
    const char* tok_path = "data/tokenizer.bin";
    const char* outdir = "data/demo";
    const char* name = "demo";
    long long max_tokens = 1000000;
    PathList docs = {0};

    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (arg[0] != '-' || arg[1] == '\0') { paths_add(&docs, arg); continue; }
        if (arg[2] != '\0' || strchr("tonsf", arg[1]) == NULL) { die("unknown flag %s (" USAGE ")", arg); }
        if (i + 1 >= argc) { die("flag %s needs a value (" USAGE ")", arg); }
        const char* val = argv[++i];
        switch (arg[1]) {
            case 't': tok_path = val; break;
            case 'o': outdir = val; break;
            case 'n': name = val; break;
            case 'f': paths_add_list(&docs, val); break;
            case 's': {
                char* end;
                errno = 0;
                max_tokens = strtoll(val, &end, 10);
                if (errno != 0 || end == val || *end != '\0' || max_tokens <= 0 || max_tokens > INT32_MAX) {
                    die("-s: expected a number of tokens from 1 to 2147483647, got '%s'", val);
                }
                break;
            }
        }
    }
    if (name[0] == '\0' || strchr(name, '/') != NULL) { die("-n: bad dataset name '%s'", name); }
    if (docs.n < 2) { die("need at least 2 documents, got %zu (" USAGE ")", docs.n); }
    qsort(docs.paths, docs.n, sizeof(char*), compare_paths);
    for (size_t k = 0; k < docs.n; k++) {
        if (k > 0 && strcmp(docs.paths[k], docs.paths[k - 1]) == 0) { die("%s: document listed twice", docs.paths[k]); }
        fclose(fopen_or_die(docs.paths[k], "rb"));   // fail on a missing document before writing any shard
    }

    Tokenizer t;
    tokenizer_init(&t, tok_path);
    if (t.vocab_size > 65536) { die("%s: vocab_size %u does not fit uint16 shards", tok_path, t.vocab_size); }
    if (mkdir(outdir, 0777) != 0 && errno != EEXIST) { die("%s: cannot create directory (%s)", outdir, strerror(errno)); }

    ShardWriter train, val;
    writer_init(&train, outdir, name, "train", (size_t)max_tokens);
    writer_init(&val, outdir, name, "val", (size_t)max_tokens);
    const uint32_t eot = t.eot_token;
    for (size_t k = 0; k < docs.n; k++) {
        ShardWriter* w = k % VAL_EVERY == 0 ? &val : &train;
        size_t len, n;
        unsigned char* text = read_document(docs.paths[k], &len);
        uint32_t* ids = tokenizer_encode(&t, (const char*)text, len, &n);
        writer_add(w, &eot, 1);
        writer_add(w, ids, n);
        w->docs++;
        free(ids);
        free(text);
        free(docs.paths[k]);
    }
    // the last, partly filled shards
    if (train.fill > 0) { writer_flush(&train); }
    if (val.fill > 0) { writer_flush(&val); }
    printf("train: %zu documents, %zu tokens in %d shards\n", train.docs, train.tokens, train.shard);
    printf("val: %zu documents, %zu tokens in %d shards\n", val.docs, val.tokens, val.shard);

    free(train.buf);
    free(val.buf);
    free(docs.paths);
    tokenizer_free(&t);
    return 0;
}
