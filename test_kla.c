/*
test_kla.c: checks train_kla.c against the PyTorch reference (scripts/train_kla.py), llm.c style.

For each reference configuration (attn, gdn, kaczmarz, hybrid) it loads the initial weights and the debug
state written by the reference, then compares the logits, the loss and the gradient of every parameter
tensor, then trains 10 AdamW steps on the same batch and compares the losses. A negative control perturbs
one weight tensor by a relative 1e-3 and requires the same comparisons to fail. It also checks the gdn and
kaczmarz mixer properties of spec/gdn_kaczmarz.md 9, decode == full forward, and the checkpoint
round trip.

Why the tolerances are what they are: the reference computes in float64 from the same fp32 weights, so the
difference is the round-off of our fp32 arithmetic alone. fp32 has a unit round-off of 6e-8; a value
produced by sums of a few hundred products, through a few layers, carries a relative error of order 1e-6.
  - logits: max |ours - ref| <= 1e-5 * max |ref| (norm-wise, since single small entries cancel)
  - loss: |ours - ref| <= 1e-5 * |ref|
  - gradients: per tensor, max |ours - ref| <= 1e-4 * max |ref| (spec 5 suggests 1e-4 for gradients: the
    backward chains more products and the gdn backward recomputes states in a different order)
  - the 10 training losses: |ours - ref| <= 1e-4 * |ref|. AdamW divides by sqrt(v), so tiny gradient
    differences move parameters by up to ~lr per step; over 10 steps this stays at the 1e-5 level.
The negative control perturbs a whole weight matrix by a relative 1e-3, 10x to 100x above these tolerances.

Output: one line per check, "PASS <name>" or "FAIL <name>: <details>"; exit status 1 if any check failed.
Usage: ./test_kla [reference dir, default dev/test/ref]
*/
#define TESTING
#include "train_kla.c"

// what the harness needs from the trainer: the last forward's logits, the gradients, a tensor scaled in place
static void test_logits(Model* m, float* out) {
    memcpy(out, m->acts.logits, (size_t)m->B * m->T * m->config.padded_vocab_size * sizeof(float));
}
static void test_grads(Model* m, float* out) { memcpy(out, m->grads_memory, m->num_parameters * sizeof(float)); }
static void test_scale_tensor(Model* m, const TensorInfo* t, float factor) {
    for (size_t i = 0; i < t->numel; i++) { m->params_memory[t->offset + i] *= factor; }
}

#include "dev/test/parity.h"

// fp32 against the float64 reference (see the top of the file); the negative control scales a matrix by 1.001
static const ParityTolerances CPU_TOLERANCES = {1e-5, 1e-5, 1e-4, 1e-4, 1.001f};

// ----------------------------------------------------------------------------------------------------------
// decode == full forward, checkpoint round trip

static void test_checkpoint_round_trip(const char* dir, const char* name) {
    char path[4096], out[4096], check[128];
    snprintf(path, sizeof(path), "%s/%s_model.bin", dir, name);
    snprintf(out, sizeof(out), "%s/%s_roundtrip.bin", dir, name);
    Model a, b;
    model_load(&a, path, 64);
    write_model_file(&a.config, &a.table, a.params_memory, out);
    model_load(&b, out, 64);
    int same = a.num_parameters == b.num_parameters &&
               memcmp(a.params_memory, b.params_memory, a.num_parameters * sizeof(float)) == 0 &&
               memcmp(&a.config, &b.config, sizeof(Config)) == 0;
    // the file we write must be byte-identical to the one the reference wrote
    FILE *fa = fopen_or_die(path, "rb"), *fb = fopen_or_die(out, "rb");
    int ca, cb;
    do { ca = fgetc(fa); cb = fgetc(fb); } while (ca == cb && ca != EOF);
    fclose(fa);
    fclose(fb);
    snprintf(check, sizeof(check), "checkpoint %s: write + read round trip, byte-identical to the reference's file", name);
    report(same && ca == cb, check, "%s", !same ? "parameters or config differ" : ca != cb ? "files differ" : "");
    remove(out);
    model_free(&a);
    model_free(&b);
}

// ----------------------------------------------------------------------------------------------------------
// checksums (FORMATS.md "Checksums")

// Flip bit `bit` of byte `at` of path in place (twice restores the file).
static void flip_bit(const char* path, long at, int bit) {
    FILE* f = fopen_or_die(path, "r+b");
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ (1 << bit), f);
    fclose(f);
}

static long file_size(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

// Flip `flips` seeded random bits of path, one at a time, each undone before the next; returns how many of the
// damaged files checkpoint_file_intact accepted (each should be 0: CRC32C detects every single-bit error).
static int count_undetected_flips(const char* path, int flips, uint64_t seed) {
    long size = file_size(path);
    int accepted = 0;
    char why[4400];
    for (int i = 0; i < flips; i++) {
        long at = (long)(rng_next(&seed) % (uint64_t)size);
        int bit = (int)(rng_next(&seed) % 8);
        flip_bit(path, at, bit);
        accepted += checkpoint_file_intact(path, why, sizeof(why));
        flip_bit(path, at, bit);
    }
    return accepted;
}

static void test_checksums(const char* ref_dir) {
    // CRC32C against published vectors: the check value of "123456789" (Castagnoli's CRC catalogue) and the
    // four 32-byte patterns of RFC 3720 appendix B.4 (iSCSI)
    unsigned char zeros[32] = {0}, ones[32], up[32], down[32];
    for (int i = 0; i < 32; i++) { ones[i] = 0xff; up[i] = (unsigned char)i; down[i] = (unsigned char)(31 - i); }
    uint32_t got[5] = {crc32c(0, "123456789", 9), crc32c(0, zeros, 32), crc32c(0, ones, 32), crc32c(0, up, 32), crc32c(0, down, 32)};
    uint32_t want[5] = {0xE3069283u, 0x8A9136AAu, 0x62A8AB43u, 0x46DD794Eu, 0x113FDB5Cu};
    int vectors_ok = memcmp(got, want, sizeof(got)) == 0 && crc32c(crc32c(0, "12345", 5), "6789", 4) == 0xE3069283u;
    report(vectors_ok, "crc32c: published test vectors (check value, RFC 3720 B.4), chained == whole", "got %08x %08x %08x %08x %08x",
           got[0], got[1], got[2], got[3], got[4]);

    // a gdn checkpoint with AdamW moments; every random bit flip in either file must be caught
    char dir[] = "/tmp/test_kla_crc_XXXXXX", path[4096], model_path[4096], state_path[4096], why[4400];
    if (mkdtemp(dir) == NULL) { report(0, "checksums", "mkdtemp failed"); return; }
    Model m;
    snprintf(path, sizeof(path), "%s/gdn_model.bin", ref_dir);
    model_load(&m, path, 64);
    m.m_memory = (float*)calloc_or_die(m.num_parameters, sizeof(float));
    m.v_memory = (float*)calloc_or_die(m.num_parameters, sizeof(float));
    for (size_t i = 0; i < m.num_parameters; i++) { m.m_memory[i] = 1e-3f * (float)(i % 97); m.v_memory[i] = 1e-6f * (float)(i % 89); }
    static TrainState s;  // static: its run-flags block stays off the stack
    memset(&s, 0, sizeof(s));
    s.step = 7;
    memcpy(s.run_flags, "-b\0" "2", 5);  // the run's flags: "-b" "2", each NUL-terminated
    s.run_flags_bytes = 5;
    write_checkpoint(&m.config, &m.table, m.params_memory, m.m_memory, m.v_memory, &s, dir);
    checkpoint_path(model_path, sizeof(model_path), dir, "model", 7);
    checkpoint_path(state_path, sizeof(state_path), dir, "state", 7);
    // negative control: the undamaged files pass, so a rejection below is the damage's doing
    int clean = checkpoint_file_intact(model_path, why, sizeof(why)) && checkpoint_file_intact(state_path, why, sizeof(why));
    report(clean, "checksums: intact model and state files pass", "%s", clean ? "" : why);
    int model_missed = count_undetected_flips(model_path, 40, 15), state_missed = count_undetected_flips(state_path, 25, 16);
    report(model_missed == 0 && state_missed == 0, "checksums: 40 random bit flips in a model file and 25 in a state file, all rejected",
           "accepted %d model and %d state files", model_missed, state_missed);

    // the error names the part that differs: a tensor by name (one in the middle of the payload), m, v, the header
    const TensorInfo* t = &m.table.t[m.table.num_tensors / 2];
    long payload = 1024 + (long)TENSOR_ENTRY_BYTES * m.table.num_tensors;
    char want_tensor[200];
    snprintf(want_tensor, sizeof(want_tensor), "checksum mismatch in tensor %s ", t->name);
    struct { const char* path; long at; const char* want; } where[] = {
        {model_path, payload + (long)(t->offset * sizeof(float)) + 5, want_tensor},
        {model_path, 40, "checksum mismatch in the header or tensor table"},
        {model_path, 1024 + 3, "checksum mismatch in the header or tensor table"},
        {state_path, 1024 + sizeof(DataLoaderState) + 5 + 8, "checksum mismatch in the AdamW first moment m"},
        {state_path, file_size(state_path) - 1, "checksum mismatch in the AdamW second moment v"},
        {state_path, 9, "checksum mismatch in the header, dataloader state or run flags"},
        {state_path, 1024 + sizeof(DataLoaderState) + 3, "checksum mismatch in the header, dataloader state or run flags"},
    };
    int named = 0;
    for (int i = 0; i < 7; i++) {
        flip_bit(where[i].path, where[i].at, 2);
        int intact = checkpoint_file_intact(where[i].path, why, sizeof(why));
        flip_bit(where[i].path, where[i].at, 2);
        if (!intact && strstr(why, where[i].want) && strstr(why, where[i].path)) { named++; } else { printf("  %s\n", why); }
    }
    report(named == 7, "checksums: the error names the file and the damaged part (tensor, header, run flags, m, v)", "%d of 7", named);

    // version 1 files (no checksums) are refused with a message that says why
    FILE* f = fopen_or_die(model_path, "r+b");
    int32_t one = 1;
    fseek(f, 4, SEEK_SET);
    fwrite(&one, 4, 1, f);
    fclose(f);
    int refused = !checkpoint_file_intact(model_path, why, sizeof(why)) && strstr(why, "version 1") != NULL;
    report(refused, "checksums: a version 1 file (written before checksums) is refused, saying so", "%s", why);

    const char* kinds[3] = {"DONE", "model", "state"};
    for (int k = 0; k < 3; k++) { checkpoint_path(path, sizeof(path), dir, kinds[k], 7); remove(path); }
    rmdir(dir);
    model_free(&m);
}

// ----------------------------------------------------------------------------
// the mixers' property tests (each spec's section 9): the helpers every family uses (rng, checks, the layer
// harness), then gdn / kaczmarz, pdn, gka and kalman.
// Every check prints "PASS <name>: ..." or "FAIL <name>: ...". Errors are max-norm relative:
// max_i |a_i - b_i| / max_i |b_i| unless stated. fp32 tolerances follow spec 5 (1e-5 on outputs, 1e-4 on
// gradients): fp32 round-off in these small problems is ~1e-7..1e-6, so they leave a 10-100x margin.

static uint64_t test_rng_state = 0x9E3779B97F4A7C15ull;
static void test_seed(uint64_t s) { test_rng_state = s * 0x9E3779B97F4A7C15ull + 1; }
// splitmix64
static uint64_t test_next(void) {
    uint64_t z = (test_rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double test_unif(void) { return (double)(test_next() >> 11) * (1.0 / 9007199254740992.0); }  // [0,1)
static double test_normal(void) {
    double u1 = test_unif() + 1e-300, u2 = test_unif();
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static int test_check(const char* name, double err, double tol) {
    int ok = err <= tol;   // false for NaN
    printf("%s %s: err %.3e (tol %.1e)\n", ok ? "PASS" : "FAIL", name, err, tol);
    return ok ? 0 : 1;
}

// max_i |a_i - b_i| / max_i |b_i|, one pair at a time; NaN propagates into num
static void relerr_add(double* num, double* den, double a, double b) {
    const double d = fabs(a - b);
    if (!(d <= *num)) { *num = d; }
    if (fabs(b) > *den) { *den = fabs(b); }
}
static double relerr_of(double num, double den) { return num / (den > 0.0 ? den : 1.0); }

// of two fp32 arrays, of fp32 values against a float64 reference, of two float64 arrays
static double test_relerr(const float* a, const float* b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) { relerr_add(&num, &den, a[i], b[i]); }
    return relerr_of(num, den);
}
static double test_relerr_fd(const float* a, const double* b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) { relerr_add(&num, &den, a[i], b[i]); }
    return relerr_of(num, den);
}
static double test_relerr64(const double* a, const double* b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) { relerr_add(&num, &den, a[i], b[i]); }
    return relerr_of(num, den);
}

// dst [B, t1-t0, width] = src [B, T, width] restricted to times [t0, t1)
static void test_slice(float* dst, const float* src, int B, int T, int t0, int t1, int width) {
    for (int b = 0; b < B; b++) {
        memcpy(dst + (size_t)b * (t1 - t0) * width, src + ((size_t)b * T + t0) * width,
               (size_t)(t1 - t0) * width * sizeof(float));
    }
}
// inverse of test_slice
static void test_unslice(float* dst, const float* src, int B, int T, int t0, int t1, int width) {
    for (int b = 0; b < B; b++) {
        memcpy(dst + ((size_t)b * T + t0) * width, src + (size_t)b * (t1 - t0) * width,
               (size_t)(t1 - t0) * width * sizeof(float));
    }
}

// ----------------------------------------------------------------------------------------------------------
// the layer harness: one mixer layer of a one-layer model, driven by the mixer's row of MIXER_TABLE (settings,
// saved activations, forward, backward, decode) and its parameter layout in model.h (the tensors, their names and
// sizes, in FORMATS.md order). A family's layer tests are a MixerLayerTest (general-position weights, an
// independent float64 forward, how its gradient is checked) plus its own property checks. The loss of every layer
// test is sum(out * R) for a fixed random R, so the backward runs with dout = R.

typedef struct TestLayer TestLayer;

// the check of the layer backward against finite differences of the float64 forward (test_layer_fd)
typedef struct {
    int per_tensor;       // entries sampled from each parameter tensor (all of a smaller one); 0: every entry
    int x_samples;        // entries sampled from x
    int points;           // 2: [L(h) - L(-h)] / 2h; 4: [8(L(h) - L(-h)) - (L(2h) - L(-2h))] / 12h
    double h;
    double fwd_tol;       // the fp32 forward against the float64 forward, max-norm relative
    double (*grad_tol)(const char* tensor);  // per tensor (and "x"), max-norm relative over its samples
    double fd32_tol;      // > 0: also the 4-point differences of the fp32 forward itself, h = 2^-7
    const char* control;  // the negative control shifts one sampled gradient of this tensor
} LayerFD;

typedef struct {
    // general-position weights into the mixer's member of L->p (the harness then draws x and R)
    void (*draw)(TestLayer* L);
    // an independent float64 forward (the spec's token-by-token recurrence): prm the layer's tensors in layout
    // order, x [B,T,C]; out [B,T,C] may be NULL; returns sum(out * R)
    double (*ref_forward)(const TestLayer* L, const double* prm, const double* x, double* out);
    LayerFD fd;
    // the decode state of sequence b after a forward over L's T tokens, from that forward's saved activations:
    // the last W-1 pre-conv inputs and the final recurrent state (NULL: no layer state-carry test)
    void (*state_from_acts)(MixerState* st, const MixerActs* a, const TestLayer* L, int b);
} MixerLayerTest;

#define LAYER_MAX_TENSORS 16
struct TestLayer {
    const MixerLayerTest* test;
    char tag[48];          // starts the checks' names: the mixer, and its variant or shape where it has several
    Config cfg;            // a one-layer model whose mixer[0] is the mixer under test
    const MixerOps* ops;   // MIXER_TABLE[cfg.mixer[0]]
    MixerSettings s;       // ops->build(&cfg, 0, chunk)
    int chunk, B, T;
    uint64_t seed;         // of the weights, x and R
    int nt;                // the layer's tensors in layout order: names ("in_proj_w"), sizes, offsets in prm
    char name[LAYER_MAX_TENSORS][24];
    size_t n[LAYER_MAX_TENSORS], off[LAYER_MAX_TENSORS], nprm;
    float *prm, *grad, *x, *dx, *R, *out;
    LayerParams p, gp;     // the mixer's member points into prm, grad
};

// w[0..n) ~ U(-sqrt(3/fan_in), sqrt(3/fan_in)): variance 1/fan_in, so a matmul over fan_in inputs of O(1) stays O(1)
static void test_draw_uniform(float* w, size_t n, int fan_in) {
    for (size_t i = 0; i < n; i++) { w[i] = (float)((2.0 * test_unif() - 1.0) * sqrt(3.0 / fan_in)); }
}

// a dt_bias entry as FORMATS.md draws it: dt log-uniform in [0.001, 0.1], dt_bias = softplus^-1(dt)
static double test_draw_dt_bias(void) {
    const double dt = exp(test_unif() * (log(0.1) - log(0.001)) + log(0.001));
    return dt + log(-expm1(-dt));
}

// lays out the mixer's tensors into tt, pointing lp's mixer member into base (lp, base NULL: the table only)
static void test_layer_layout(TensorTable* tt, LayerParams* lp, float* base, const Config* c) {
    LayoutContext k = {tt, base, NULL, 0, 0.02f, 0.02f, ""};
    memset(tt, 0, sizeof(*tt));
    tt->align = 1;
    MIXER_PARAMETER_LAYOUT[c->mixer[0]](&k, lp, c);
}

static void test_layer_init(TestLayer* L, const MixerLayerTest* test, const char* tag, const Config* c, int chunk,
                            int B, int T, uint64_t seed) {
    memset(L, 0, sizeof(*L));
    L->test = test;
    snprintf(L->tag, sizeof(L->tag), "%s", tag);
    L->cfg = *c;
    L->ops = MIXER_TABLE[c->mixer[0]];
    L->s = L->ops->build(c, 0, chunk);
    L->chunk = chunk; L->B = B; L->T = T; L->seed = seed;
    TensorTable* tt = (TensorTable*)malloc(sizeof(TensorTable));
    test_layer_layout(tt, NULL, NULL, c);
    L->nt = tt->num_tensors;
    for (int i = 0; i < L->nt; i++) {   // "h0.<mixer>.in_proj.w" -> "in_proj_w"
        const char* nm = strchr(strchr(tt->t[i].name, '.') + 1, '.') + 1;
        snprintf(L->name[i], sizeof(L->name[i]), "%s", nm);
        for (char* ch = L->name[i]; *ch; ch++) { if (*ch == '.') { *ch = '_'; } }
        L->n[i] = tt->t[i].numel;
        L->off[i] = tt->t[i].offset;
    }
    L->nprm = tt->num_parameters;
    const size_t nx = (size_t)B * T * c->channels;
    L->prm = (float*)malloc(L->nprm * sizeof(float));
    L->grad = (float*)calloc(L->nprm, sizeof(float));
    L->x = (float*)malloc(nx * sizeof(float));
    L->dx = (float*)calloc(nx, sizeof(float));
    L->R = (float*)malloc(nx * sizeof(float));
    L->out = (float*)malloc(nx * sizeof(float));
    test_layer_layout(tt, &L->p, L->prm, c);
    test_layer_layout(tt, &L->gp, L->grad, c);
    free(tt);
    test_seed(seed);
    test->draw(L);
    for (size_t i = 0; i < nx; i++) { L->x[i] = (float)test_normal(); L->R[i] = (float)test_normal(); }
}

static void test_layer_free(TestLayer* L) {
    free(L->prm); free(L->grad); free(L->x); free(L->dx); free(L->R); free(L->out);
}

// index of the tensor named nm, -1 if the layer has none
static int test_layer_tensor(const TestLayer* L, const char* nm) {
    for (int i = 0; i < L->nt; i++) { if (strcmp(L->name[i], nm) == 0) { return i; } }
    return -1;
}

static size_t test_layer_numel(const TestLayer* L, const char* nm) {
    const int i = test_layer_tensor(L, nm);
    return i < 0 ? 0 : L->n[i];
}

// tensor nm of prm (a float64 copy of the parameters) in layout order; NULL if the layer has none
static const double* test_layer_param64(const TestLayer* L, const double* prm, const char* nm) {
    const int i = test_layer_tensor(L, nm);
    return i < 0 ? NULL : prm + L->off[i];
}

// dst's tensor nm = src's (same size)
static void test_layer_copy(TestLayer* dst, const TestLayer* src, const char* nm) {
    const int i = test_layer_tensor(dst, nm), j = test_layer_tensor(src, nm);
    memcpy(dst->prm + dst->off[i], src->prm + src->off[j], dst->n[i] * sizeof(float));
}

// the forward into L->out; returns sum(out * R) accumulated in double. With keep, the saved activations are
// handed back (*keep, freed by the caller; *akeep points into it), else freed
static double test_layer_loss(TestLayer* L, float** keep, MixerActs* akeep) {
    float* acts = (float*)malloc(L->ops->acts_floats(&L->s, L->B, L->T) * sizeof(float));
    MixerActs a;
    L->ops->acts_point(&a, acts, &L->s, L->B, L->T);
    L->ops->forward(L->out, &a, &L->p, L->x, L->B, L->T, &L->s);
    double loss = 0.0;
    for (size_t i = 0; i < (size_t)L->B * L->T * L->cfg.channels; i++) { loss += (double)L->out[i] * L->R[i]; }
    if (keep) { *keep = acts; *akeep = a; } else { free(acts); }
    return loss;
}

// forward, then backward with dout = R (the gradient of sum(out * R)); gradients into L->grad and L->dx
static void test_layer_grad(TestLayer* L) {
    float* acts = (float*)malloc(L->ops->acts_floats(&L->s, L->B, L->T) * sizeof(float));
    float* scratch = (float*)malloc(L->ops->scratch_floats(&L->s, L->B, L->T) * sizeof(float));
    MixerActs a;
    L->ops->acts_point(&a, acts, &L->s, L->B, L->T);
    L->ops->forward(L->out, &a, &L->p, L->x, L->B, L->T, &L->s);
    memset(L->grad, 0, L->nprm * sizeof(float));
    memset(L->dx, 0, (size_t)L->B * L->T * L->cfg.channels * sizeof(float));
    L->ops->backward(L->dx, &L->gp, L->R, &a, &L->p, L->x, scratch, L->B, L->T, &L->s);
    free(acts); free(scratch);
}

// decode token by token from a reset state (the row's decode step) == the forward over the same sequences,
// max-norm relative at tolerance tol (the caller says why)
static int test_layer_decode(TestLayer* L, double tol) {
    const int C = L->cfg.channels;
    test_layer_loss(L, NULL, NULL);
    float* st = (float*)malloc(L->ops->state_floats(&L->s, L->T) * sizeof(float));
    float* scratch = (float*)malloc(L->ops->decode_scratch_floats(&L->s, L->T) * sizeof(float));
    float* dec = (float*)malloc((size_t)L->B * L->T * C * sizeof(float));
    MixerState s;
    L->ops->state_point(&s, st, &L->s, L->T);
    for (int b = 0; b < L->B; b++) {
        L->ops->state_reset(&s, &L->s);
        for (int t = 0; t < L->T; t++) {
            const size_t r = (size_t)b * L->T + t;
            L->ops->decode_step(dec + r * C, &s, &L->p, L->x + r * C, scratch, t, &L->s);
        }
    }
    char name[96];
    snprintf(name, sizeof(name), "%s_decode_equals_forward_chunk%d", L->tag, L->chunk);
    const int fails = test_check(name, test_relerr(dec, L->out, (size_t)L->B * L->T * C), tol);
    free(st); free(scratch); free(dec);
    return fails;
}

// the conv window of a decode state: the last W-1 pre-conv inputs (the first D of the P channels of proj [B,T,P])
// of sequence b, zero before its start (as a reset state holds them)
static void test_conv_window(float* conv, const float* proj, int b, int T, int P, int D, int W) {
    for (int j = 0; j < W - 1; j++) {
        const int t = T - (W - 1) + j;
        if (t >= 0) { memcpy(conv + (size_t)j * D, proj + ((size_t)b * T + t) * P, (size_t)D * sizeof(float)); }
    }
}

// layer state carry: the forward over [0, T1), its final state as a decode state (state_from_acts), then decode
// over [T1, T) == the forward over [0, T), max-norm relative over those tokens at tolerance tol. The layer of the
// first T1 tokens is drawn from L's seed: the weights are drawn first, so they are L's.
static int test_layer_state_carry(TestLayer* L, int T1, double tol) {
    const int C = L->cfg.channels, T = L->T;
    test_layer_loss(L, NULL, NULL);
    TestLayer Lp;
    test_layer_init(&Lp, L->test, L->tag, &L->cfg, L->chunk, L->B, T1, L->seed);
    test_slice(Lp.x, L->x, L->B, T, 0, T1, C);
    float* acts;
    MixerActs a;
    test_layer_loss(&Lp, &acts, &a);
    float* st = (float*)malloc(L->ops->state_floats(&L->s, T) * sizeof(float));
    float* scratch = (float*)malloc(L->ops->decode_scratch_floats(&L->s, T) * sizeof(float));
    float* dec = (float*)malloc((size_t)C * sizeof(float));
    double num = 0.0, den = 0.0;
    for (int b = 0; b < L->B; b++) {
        MixerState s;
        L->ops->state_point(&s, st, &L->s, T);
        L->ops->state_reset(&s, &L->s);
        L->test->state_from_acts(&s, &a, &Lp, b);
        for (int t = T1; t < T; t++) {
            const size_t r = (size_t)b * T + t;
            L->ops->decode_step(dec, &s, &L->p, L->x + r * C, scratch, t, &L->s);
            for (int i = 0; i < C; i++) { relerr_add(&num, &den, dec[i], L->out[r * C + i]); }
        }
    }
    char name[96];
    snprintf(name, sizeof(name), "%s_layer_state_carry_T1_%d", L->tag, T1);
    free(st); free(scratch); free(dec); free(acts);
    test_layer_free(&Lp);
    return test_check(name, relerr_of(num, den), tol);
}

// determinism: the layer backward with 1 thread == with the default thread count, bit for bit
static int test_layer_thread_invariance(TestLayer* L) {
    const int nt = max_threads();
    test_layer_grad(L);
    float* g1 = (float*)malloc(L->nprm * sizeof(float));
    memcpy(g1, L->grad, L->nprm * sizeof(float));
#ifdef OMP
    omp_set_num_threads(1);
#endif
    test_layer_grad(L);
#ifdef OMP
    omp_set_num_threads(nt);
#endif
    size_t diff = 0;
    for (size_t i = 0; i < L->nprm; i++) { diff += memcmp(&g1[i], &L->grad[i], sizeof(float)) != 0; }
    char name[128];
    snprintf(name, sizeof(name), "%s_param_grads_thread_count_invariant (%d vs 1 threads; differing)", L->tag, nt);
    free(g1);
    return test_check(name, (double)diff, 0.0);
}

// the samples of test_layer_fd: sample i is entry off[i] of tensor tensor[i] (L->nt: of x), off counted from the
// start of prm (or of x); a tensor's samples are consecutive. a: the backward's gradient, f: the finite differences
typedef struct {
    int ns, *tensor;
    size_t* off;
    double *a, *f;
    double *pd, *xd;   // the parameters and x in float64, as the float64 forward takes them
} GradSamples;

static void grad_samples_free(GradSamples* g) {
    free(g->tensor); free(g->off); free(g->a); free(g->f); free(g->pd); free(g->xd);
}

// the max-norm relative error of the gradient a against finite differences f over the samples of tensor t
static double grad_samples_err(const GradSamples* g, const double* f, int t) {
    int i0 = 0, n = 0;
    while (i0 < g->ns && g->tensor[i0] != t) { i0++; }
    while (i0 + n < g->ns && g->tensor[i0 + n] == t) { n++; }
    return test_relerr64(g->a + i0, f + i0, (size_t)n);
}

// layer backward vs central finite differences of the loss sum(out * R), as L->test->fd says:
//  - the fp32 forward vs the float64 forward (fwd_tol);
//  - fd64: of the float64 forward, per tensor and x (grad_tol): at the steps used the truncation is ~h^2 (~1e-10)
//    or ~h^4 and the round-off ~1e-16 |L| / h, so the differences are exact to ~1e-8 relative or better;
//  - fd32 (gdn): of the fp32 forward itself, the 4-point stencil at h = 2^-7: truncation O(h^4 f^(5)) ~ 1e-8, but
//    the forward's round-off (~1e-7 relative per output, ~1e-6 absolute on L) over ~1.5h gives ~1e-4 absolute noise
//    on gradients of O(1), hence fd32_tol;
//  - negative control: the first sampled gradient of the tensor `control` shifted by 1% of that tensor's largest
//    |finite difference| must fail the fd64 check (and the fd32 one).
// The backward runs first (test_layer_grad). With keep, the samples are handed back (grad_samples_free).
static int test_layer_fd(TestLayer* L, GradSamples* keep) {
    const LayerFD* fd = &L->test->fd;
    const size_t nx = (size_t)L->B * L->T * L->cfg.channels;
    test_layer_grad(L);
    GradSamples g;
    const size_t cap = L->nprm + (size_t)fd->x_samples;
    g.tensor = (int*)malloc(cap * sizeof(int));
    g.off = (size_t*)malloc(cap * sizeof(size_t));
    g.a = (double*)malloc(cap * sizeof(double));
    g.f = (double*)malloc(cap * sizeof(double));
    double* f32 = (double*)malloc(cap * sizeof(double));
    g.ns = 0;
    for (int t = 0; t <= L->nt; t++) {
        const size_t n = t < L->nt ? L->n[t] : nx;
        const size_t take = t < L->nt ? (fd->per_tensor ? (size_t)fd->per_tensor : n) : (size_t)fd->x_samples;
        for (size_t i = 0; i < take && i < n; i++) {
            g.tensor[g.ns] = t;
            g.off[g.ns] = (t < L->nt ? L->off[t] : 0) + (n <= take ? i : (size_t)(test_unif() * n));
            g.ns++;
        }
    }
    g.pd = (double*)malloc(L->nprm * sizeof(double));
    g.xd = (double*)malloc(nx * sizeof(double));
    double* outd = (double*)malloc(nx * sizeof(double));
    for (size_t i = 0; i < L->nprm; i++) { g.pd[i] = L->prm[i]; }
    for (size_t i = 0; i < nx; i++) { g.xd[i] = L->x[i]; }
    int fails = 0;
    char name[128];
    L->test->ref_forward(L, g.pd, g.xd, outd);
    snprintf(name, sizeof(name), "%s_layer_forward_vs_ref64", L->tag);
    fails += test_check(name, test_relerr_fd(L->out, outd, nx), fd->fwd_tol);

    for (int i = 0; i < g.ns; i++) {
        const int isx = g.tensor[i] == L->nt;
        g.a[i] = isx ? L->dx[g.off[i]] : L->grad[g.off[i]];
        double* vd = isx ? g.xd + g.off[i] : g.pd + g.off[i];
        const double h = fd->h, v0 = *vd, steps[4] = {h, -h, 2 * h, -2 * h};
        double l[4];
        for (int k = 0; k < fd->points; k++) { *vd = v0 + steps[k]; l[k] = L->test->ref_forward(L, g.pd, g.xd, NULL); }
        *vd = v0;
        g.f[i] = fd->points == 2 ? (l[0] - l[1]) / (2.0 * h) : (8.0 * (l[0] - l[1]) - (l[2] - l[3])) / (12.0 * h);
        if (fd->fd32_tol > 0.0) {
            float* vf = isx ? L->x + g.off[i] : L->prm + g.off[i];
            const float h32 = 0.0078125f, f0 = *vf, steps32[4] = {h32, -h32, 2.0f * h32, -2.0f * h32};
            for (int k = 0; k < 4; k++) { *vf = f0 + steps32[k]; l[k] = test_layer_loss(L, NULL, NULL); }
            *vf = f0;
            f32[i] = (8.0 * (l[0] - l[1]) - (l[2] - l[3])) / (12.0 * h32);
        }
    }
    for (int t = 0; t <= L->nt; t++) {
        const char* tn = t < L->nt ? L->name[t] : "x";
        snprintf(name, sizeof(name), "%s_layer_grad_fd64_%s", L->tag, tn);
        fails += test_check(name, grad_samples_err(&g, g.f, t), fd->grad_tol(tn));
    }
    if (fd->fd32_tol > 0.0) {
        for (int t = 0; t <= L->nt; t++) {
            snprintf(name, sizeof(name), "%s_layer_grad_fd32_%s", L->tag, t < L->nt ? L->name[t] : "x");
            fails += test_check(name, grad_samples_err(&g, f32, t), fd->fd32_tol);
        }
    }

    // negative control
    const int ct = test_layer_tensor(L, fd->control);
    double amax = 0.0;
    int first = -1;
    for (int i = 0; i < g.ns; i++) {
        if (g.tensor[i] != ct) { continue; }
        if (first < 0) { first = i; }
        amax = fmax(amax, fabs(g.f[i]));
    }
    const double a0 = g.a[first], tol = fd->grad_tol(fd->control);
    g.a[first] += 0.01 * amax;
    const double e64 = grad_samples_err(&g, g.f, ct);
    int caught = e64 > tol;
    char e32s[64] = "";
    if (fd->fd32_tol > 0.0) {
        const double e32 = grad_samples_err(&g, f32, ct);
        caught = caught && e32 > fd->fd32_tol;
        snprintf(e32s, sizeof(e32s), ", fd32 err %.3e (tol %.0e)", e32, fd->fd32_tol);
    }
    g.a[first] = a0;
    printf("%s %s_negative_control: %s gradient shifted by 1%%: fd64 err %.3e (tol %.0e)%s %s\n",
           caught ? "PASS" : "FAIL", L->tag, fd->control, e64, tol, e32s, caught ? "caught" : "NOT caught");
    fails += caught ? 0 : 1;

    free(outd); free(f32);
    if (keep) { *keep = g; } else { grad_samples_free(&g); }
    return fails;
}

// spec 5's gradient tolerance, for every tensor: 1e-4 max-norm relative (fp32 round-off here is ~1e-7..1e-6)
static double spec5_grad_tol(const char* tensor) {
    (void)tensor;
    return 1e-4;
}

// random core inputs: unit q; gdn: unit k, beta = eta in (0,1); kaczmarz: raw k with norms spread over
// [0.05, 3], beta = eta / (||k||^2 + 1e-6); v ~ N(0,1); g = -exp(U(-6,1)) and 5% of tokens -50 (spec 9.13).
static void gdnt_core_inputs(float* qkv, float* beta, float* g, int B, int T, int H, int dk, int dv, int kaczmarz) {
    const int D = 2 * H * dk + H * dv;
    for (size_t r = 0; r < (size_t)B * T; r++) {
        float* row = qkv + r * D;
        for (int i = 0; i < D; i++) { row[i] = (float)test_normal(); }
        for (int hh = 0; hh < H; hh++) {
            float* q = row + hh * dk;
            float* k = row + H * dk + hh * dk;
            float nq = sqrtf(vec_dot(q, q, dk)), nk = sqrtf(vec_dot(k, k, dk));
            float knew = kaczmarz ? (float)(0.05 * exp(test_unif() * log(60.0))) : 1.0f;
            for (int d = 0; d < dk; d++) { q[d] /= nq; k[d] *= knew / nk; }
            float eta = (float)test_unif();
            beta[r * H + hh] = kaczmarz ? eta / (vec_dot(k, k, dk) + 1e-6f) : eta;
            g[r * H + hh] = test_unif() < 0.05 ? -50.0f : (float)-exp(-6.0 + 7.0 * test_unif());
        }
    }
}

// 1. chunkwise forward == recurrent forward (outputs and final state), BT in {16, 32, 64}, T = 100.
// The kaczmarz inputs also have 3 keys exactly 0 (beta = eta/1e-6, spec 9.13), and the core backward on them
// must stay finite.
static int gdnt_chunk_vs_recurrent(void) {
    const int B = 2, T = 100, H = 2, dk = 32, dv = 16, D = 2 * H * dk + H * dv;
    const size_t nS = (size_t)B * H * dk * dv, nO = (size_t)B * T * H * dv;
    int fails = 0;
    float* qkv = (float*)malloc((size_t)B * T * D * sizeof(float));
    float* beta = (float*)malloc((size_t)B * T * H * sizeof(float));
    float* g = (float*)malloc((size_t)B * T * H * sizeof(float));
    float* o1 = (float*)malloc(nO * sizeof(float));
    float* o2 = (float*)malloc(nO * sizeof(float));
    float* S1 = (float*)malloc(nS * sizeof(float));
    float* S2 = (float*)malloc(nS * sizeof(float));
    float* S0 = (float*)malloc(nS * sizeof(float));
    float* h = (float*)malloc(nS * gdn_NT(T, 16) * sizeof(float));
    float* work = (float*)malloc((size_t)max_threads() * gdn_core_work_floats(64, dk, dv) * sizeof(float));
    for (int kacz = 0; kacz <= 1; kacz++) {
        test_seed(100 + kacz);
        gdnt_core_inputs(qkv, beta, g, B, T, H, dk, dv, kacz);
        for (int z = 0; kacz && z < 3; z++) {
            const int r = 17 + 70 * z, hh = z % H;   // rows 17, 87 (sequence 0), 157 (sequence 1)
            memset(qkv + (size_t)r * D + H * dk + hh * dk, 0, dk * sizeof(float));
            beta[r * H + hh] = 0.5f / 1e-6f;
        }
        for (size_t i = 0; i < nS; i++) { S0[i] = (float)(0.5 * test_normal()); }
        for (int init = 0; init <= 1; init++) {
            for (int BT = 16; BT <= 64; BT *= 2) {
                char name[96];
                for (size_t i = 0; i < nS; i++) { S1[i] = init ? S0[i] : 0.0f; S2[i] = S1[i]; }
                gdn_core_recurrent(o1, S1, qkv, beta, g, B, T, H, dk, dv);
                gdn_core_chunk_forward(o2, h, S2, qkv, beta, g, B, T, H, dk, dv, BT, work, max_threads());
                snprintf(name, sizeof(name), "chunk_vs_recurrent_%s_BT%d_%s_out", kacz ? "kaczmarz" : "gdn", BT, init ? "S0" : "zeroS0");
                fails += test_check(name, test_relerr(o2, o1, nO), 1e-5);
                snprintf(name, sizeof(name), "chunk_vs_recurrent_%s_BT%d_%s_state", kacz ? "kaczmarz" : "gdn", BT, init ? "S0" : "zeroS0");
                fails += test_check(name, test_relerr(S2, S1, nS), 1e-5);
            }
        }
        if (kacz) {
            // backward with random dO and dS_T, from the BT = 16 chunk states (h holds them: T = 100 needs 7)
            float* dqkv = (float*)malloc((size_t)B * T * D * sizeof(float));
            float* dbeta = (float*)malloc((size_t)B * T * H * sizeof(float));
            float* dg = (float*)malloc((size_t)B * T * H * sizeof(float));
            float* scratch = (float*)malloc((size_t)max_threads() * gdn_core_bwd_floats(16, dk, dv) * sizeof(float));
            for (size_t i = 0; i < nO; i++) { o1[i] = (float)test_normal(); }
            for (size_t i = 0; i < nS; i++) { S1[i] = (float)test_normal(); }
            gdn_core_chunk_forward(o2, h, NULL, qkv, beta, g, B, T, H, dk, dv, 16, work, max_threads());
            gdn_core_backward(dqkv, dbeta, dg, S2, o1, S1, h, qkv, beta, g, B, T, H, dk, dv, 16, scratch, max_threads());
            int finite = 1;
            for (size_t i = 0; i < (size_t)B * T * D; i++) { finite &= isfinite(dqkv[i]) != 0; }
            for (size_t i = 0; i < (size_t)B * T * H; i++) { finite &= isfinite(dbeta[i]) && isfinite(dg[i]); }
            for (size_t i = 0; i < nS; i++) { finite &= isfinite(S2[i]) != 0; }
            printf("%s core_backward_finite_kaczmarz_zero_keys\n", finite ? "PASS" : "FAIL");
            fails += finite ? 0 : 1;
            free(dqkv); free(dbeta); free(dg); free(scratch);
        }
    }
    free(qkv); free(beta); free(g); free(o1); free(o2); free(S1); free(S2); free(S0); free(h); free(work);
    return fails;
}

// 2. state passing: chunkwise over [0,T1) then [T1,T) with the carried state == one pass (BT = 32, T = 90)
static int gdnt_state_split(void) {
    const int B = 2, T = 90, H = 2, dk = 16, dv = 24, D = 2 * H * dk + H * dv, BT = 32;
    const size_t nS = (size_t)B * H * dk * dv, nO = (size_t)B * T * H * dv;
    int fails = 0;
    float* qkv = (float*)malloc((size_t)B * T * D * sizeof(float));
    float* beta = (float*)malloc((size_t)B * T * H * sizeof(float));
    float* g = (float*)malloc((size_t)B * T * H * sizeof(float));
    float* sq = (float*)malloc((size_t)B * T * D * sizeof(float));
    float* sb = (float*)malloc((size_t)B * T * H * sizeof(float));
    float* sg = (float*)malloc((size_t)B * T * H * sizeof(float));
    float* so = (float*)malloc(nO * sizeof(float));
    float* o1 = (float*)malloc(nO * sizeof(float));
    float* o2 = (float*)malloc(nO * sizeof(float));
    float* S1 = (float*)malloc(nS * sizeof(float));
    float* S2 = (float*)malloc(nS * sizeof(float));
    float* h = (float*)malloc(nS * gdn_NT(T, BT) * sizeof(float));
    float* work = (float*)malloc((size_t)max_threads() * gdn_core_work_floats(BT, dk, dv) * sizeof(float));
    for (int kacz = 0; kacz <= 1; kacz++) {
        test_seed(200 + kacz);
        gdnt_core_inputs(qkv, beta, g, B, T, H, dk, dv, kacz);
        for (size_t i = 0; i < nS; i++) { S1[i] = (float)(0.5 * test_normal()); S2[i] = S1[i]; }
        gdn_core_chunk_forward(o1, h, S1, qkv, beta, g, B, T, H, dk, dv, BT, work, max_threads());
        const int splits[2] = {64, 45};
        float* S0 = (float*)malloc(nS * sizeof(float));
        memcpy(S0, S2, nS * sizeof(float));
        for (int s = 0; s < 2; s++) {
            const int T1 = splits[s];
            memcpy(S2, S0, nS * sizeof(float));
            const int seg[3] = {0, T1, T};
            for (int part = 0; part < 2; part++) {
                const int t0 = seg[part], t1 = seg[part + 1], Tp = t1 - t0;
                test_slice(sq, qkv, B, T, t0, t1, D);
                test_slice(sb, beta, B, T, t0, t1, H);
                test_slice(sg, g, B, T, t0, t1, H);
                gdn_core_chunk_forward(so, h, S2, sq, sb, sg, B, Tp, H, dk, dv, BT, work, max_threads());
                test_unslice(o2, so, B, T, t0, t1, H * dv);
            }
            char name[96];
            snprintf(name, sizeof(name), "state_split_%s_T1_%d_out", kacz ? "kaczmarz" : "gdn", T1);
            fails += test_check(name, test_relerr(o2, o1, nO), 1e-5);
            snprintf(name, sizeof(name), "state_split_%s_T1_%d_state", kacz ? "kaczmarz" : "gdn", T1);
            fails += test_check(name, test_relerr(S2, S1, nS), 1e-5);
        }
        free(S0);
    }
    free(qkv); free(beta); free(g); free(sq); free(sb); free(sg); free(so); free(o1); free(o2);
    free(S1); free(S2); free(h); free(work);
    return fails;
}

// 3. kaczmarz with eta = 1, eps = 0 (beta = 1/||k||^2): S_t^T k_t = v_t after every token, for any decay.
// err = max_t ||S_t^T k_t - v_t|| / (||v_t|| + ||Sbar_t^T k_t||) (the size of the terms that cancel),
// checked on the recurrent states (every t) and on the chunkwise final state of every prefix [0, t].
static int gdnt_kaczmarz_exact(void) {
    const int T = 40, H = 2, dk = 16, dv = 16, D = 2 * H * dk + H * dv, BT = 16;
    const size_t nS = (size_t)H * dk * dv;
    float* qkv = (float*)malloc((size_t)T * D * sizeof(float));
    float* beta = (float*)malloc((size_t)T * H * sizeof(float));
    float* g = (float*)malloc((size_t)T * H * sizeof(float));
    float* o = (float*)malloc((size_t)T * H * dv * sizeof(float));
    float* S = (float*)calloc(nS, sizeof(float));
    float* Sprev = (float*)malloc(nS * sizeof(float));
    float* Sc = (float*)malloc(nS * sizeof(float));
    float* h = (float*)malloc(nS * gdn_NT(T, BT) * sizeof(float));
    float* work = (float*)malloc((size_t)max_threads() * gdn_core_work_floats(BT, dk, dv) * sizeof(float));
    test_seed(300);
    gdnt_core_inputs(qkv, beta, g, 1, T, H, dk, dv, 1);
    for (int t = 0; t < T * H; t++) {
        const float* k = qkv + (size_t)(t / H) * D + H * dk + (t % H) * dk;
        beta[t] = 1.0f / vec_dot(k, k, dk);
    }
    double err_rec = 0.0, err_chunk = 0.0;
    for (int t = 0; t < T; t++) {
        memcpy(Sprev, S, nS * sizeof(float));
        gdn_core_recurrent(o + (size_t)t * H * dv, S, qkv + (size_t)t * D, beta + t * H, g + t * H, 1, 1, H, dk, dv);
        memset(Sc, 0, nS * sizeof(float));
        gdn_core_chunk_forward(o, h, Sc, qkv, beta, g, 1, t + 1, H, dk, dv, BT, work, max_threads());
        for (int hh = 0; hh < H; hh++) {
            const float* k = qkv + (size_t)t * D + H * dk + hh * dk;
            const float* v = qkv + (size_t)t * D + 2 * H * dk + hh * dv;
            const double alpha = exp((double)g[t * H + hh]);
            double res = 0.0, resc = 0.0, nv = 0.0, nsk = 0.0;
            for (int j = 0; j < dv; j++) {
                double sk = 0.0, skc = 0.0, skp = 0.0;
                for (int d = 0; d < dk; d++) {
                    sk += (double)S[(hh * dk + d) * dv + j] * k[d];
                    skc += (double)Sc[(hh * dk + d) * dv + j] * k[d];
                    skp += alpha * Sprev[(hh * dk + d) * dv + j] * k[d];
                }
                res += (sk - v[j]) * (sk - v[j]);
                resc += (skc - v[j]) * (skc - v[j]);
                nv += (double)v[j] * v[j];
                nsk += skp * skp;
            }
            const double ref = sqrt(nv) + sqrt(nsk);
            if (!(sqrt(res) / ref <= err_rec)) { err_rec = sqrt(res) / ref; }
            if (!(sqrt(resc) / ref <= err_chunk)) { err_chunk = sqrt(resc) / ref; }
        }
    }
    int fails = test_check("kaczmarz_exact_projection_recurrent", err_rec, 1e-5);
    fails += test_check("kaczmarz_exact_projection_chunk", err_chunk, 1e-5);
    free(qkv); free(beta); free(g); free(o); free(S); free(Sprev); free(Sc); free(h); free(work);
    return fails;
}

// 4. gdn with g = 0 (alpha = 1) == plain DeltaNet S_t = S_{t-1} + beta k (v - S^T k)^T, o = S^T (q/sqrt(dk)),
// written here independently in double; the chunkwise fp32 forward is compared (BT = 16, T = 50)
static int gdnt_deltanet(void) {
    const int T = 50, H = 2, dk = 16, dv = 8, D = 2 * H * dk + H * dv, BT = 16;
    float* qkv = (float*)malloc((size_t)T * D * sizeof(float));
    float* beta = (float*)malloc((size_t)T * H * sizeof(float));
    float* g = (float*)malloc((size_t)T * H * sizeof(float));
    float* o = (float*)malloc((size_t)T * H * dv * sizeof(float));
    float* oref = (float*)malloc((size_t)T * H * dv * sizeof(float));
    float* h = (float*)malloc((size_t)H * dk * dv * gdn_NT(T, BT) * sizeof(float));
    float* work = (float*)malloc((size_t)max_threads() * gdn_core_work_floats(BT, dk, dv) * sizeof(float));
    double* S = (double*)malloc((size_t)dk * dv * sizeof(double));
    double* e = (double*)malloc((size_t)dv * sizeof(double));
    test_seed(400);
    gdnt_core_inputs(qkv, beta, g, 1, T, H, dk, dv, 0);
    for (int i = 0; i < T * H; i++) { g[i] = 0.0f; }
    gdn_core_chunk_forward(o, h, NULL, qkv, beta, g, 1, T, H, dk, dv, BT, work, max_threads());
    for (int hh = 0; hh < H; hh++) {
        for (int i = 0; i < dk * dv; i++) { S[i] = 0.0; }
        for (int t = 0; t < T; t++) {
            const float* q = qkv + (size_t)t * D + hh * dk;
            const float* k = qkv + (size_t)t * D + H * dk + hh * dk;
            const float* v = qkv + (size_t)t * D + 2 * H * dk + hh * dv;
            for (int j = 0; j < dv; j++) {
                double sk = 0.0;
                for (int d = 0; d < dk; d++) { sk += S[d * dv + j] * k[d]; }
                e[j] = v[j] - sk;
            }
            for (int d = 0; d < dk; d++) {
                for (int j = 0; j < dv; j++) { S[d * dv + j] += (double)beta[t * H + hh] * k[d] * e[j]; }
            }
            for (int j = 0; j < dv; j++) {
                double acc = 0.0;
                for (int d = 0; d < dk; d++) { acc += S[d * dv + j] * q[d] / sqrt((double)dk); }
                oref[((size_t)t * H + hh) * dv + j] = (float)acc;
            }
        }
    }
    int fails = test_check("gdn_alpha1_equals_deltanet", test_relerr(o, oref, (size_t)T * H * dv), 1e-5);
    free(qkv); free(beta); free(g); free(o); free(oref); free(h); free(work); free(S); free(e);
    return fails;
}

// ----------------------------------------------------------------------------
// layer-level tests: a small random layer on the harness above

// random weights sized so that activations are O(1); A_log and dt_bias drawn as in FORMATS.md;
// b_bias and onorm_w away from their init so that their gradients are checked in general position
static void gdnt_draw(TestLayer* L) {
    GDNParams* p = &L->p.gdn;
    const GDNConfig* c = &L->s.gdn;
    const int H = c->H, HV = c->H * c->dv, C = c->C;
    test_draw_uniform(p->in_proj_w, test_layer_numel(L, "in_proj_w"), C);
    for (size_t i = 0; i < test_layer_numel(L, "conv_w"); i++) { p->conv_w[i] = (float)(test_unif() - 0.5); }
    for (int hh = 0; hh < H; hh++) {
        p->b_bias[hh] = (float)(0.5 * test_normal());
        p->A_log[hh] = (float)log(0.1 + 15.9 * test_unif());
        p->dt_bias[hh] = (float)test_draw_dt_bias();
    }
    for (int i = 0; i < c->dv; i++) { p->onorm_w[i] = (float)(1.0 + 0.2 * test_normal()); }
    test_draw_uniform(p->out_proj_w, test_layer_numel(L, "out_proj_w"), HV);
}

// independent double-precision layer forward (spec 1.2 with the token-by-token recurrence 2.1).
// prm: the 7 tensors in GDNParams order; out [B,T,C] (may be NULL); returns sum(out * R)
static double gdnt_ref_forward(const TestLayer* L, const double* prm, const double* x, double* out) {
    const GDNConfig* c = &L->s.gdn;
    const int B = L->B, T = L->T, C = c->C, H = c->H, dk = c->dk, dv = c->dv, W = c->W;
    const int HV = H * dv, D = gdn_D(c), P = gdn_P(c);
    const double* Win = test_layer_param64(L, prm, "in_proj_w");
    const double* Wc = test_layer_param64(L, prm, "conv_w");
    const double* bb = test_layer_param64(L, prm, "b_bias");
    const double* Al = test_layer_param64(L, prm, "A_log");
    const double* dtb = test_layer_param64(L, prm, "dt_bias");
    const double* wo = test_layer_param64(L, prm, "onorm_w");
    const double* Wout = test_layer_param64(L, prm, "out_proj_w");
    double* proj = (double*)malloc((size_t)T * P * sizeof(double));
    double* S = (double*)malloc((size_t)H * dk * dv * sizeof(double));
    double* f = (double*)malloc((size_t)D * sizeof(double));
    double* r = (double*)malloc((size_t)dv * sizeof(double));
    double* y = (double*)malloc((size_t)HV * sizeof(double));
    double loss = 0.0;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < P; i++) {
                double acc = 0.0;
                for (int j = 0; j < C; j++) { acc += Win[(size_t)i * C + j] * x[((size_t)b * T + t) * C + j]; }
                proj[(size_t)t * P + i] = acc;
            }
        }
        for (int i = 0; i < H * dk * dv; i++) { S[i] = 0.0; }
        for (int t = 0; t < T; t++) {
            const double* pr = proj + (size_t)t * P;
            for (int ch = 0; ch < D; ch++) {
                double acc = 0.0;
                for (int j = 0; j < W; j++) {
                    int s = t - (W - 1) + j;
                    if (s >= 0) { acc += Wc[ch * W + j] * proj[(size_t)s * P + ch]; }
                }
                f[ch] = acc / (1.0 + exp(-acc));
            }
            for (int hh = 0; hh < H; hh++) {
                double* q = f + hh * dk;
                double* k = f + H * dk + hh * dk;
                const double* v = f + 2 * H * dk + hh * dv;
                double nq = 0.0, kk = 0.0, beta;
                for (int d = 0; d < dk; d++) { nq += q[d] * q[d]; kk += k[d] * k[d]; }
                nq = sqrt(nq + (double)c->l2norm_eps);
                for (int d = 0; d < dk; d++) { q[d] /= nq; }
                const double eta = 1.0 / (1.0 + exp(-(pr[D + HV + H + hh] + bb[hh])));
                if (c->kaczmarz) {
                    beta = eta / (kk + (double)c->kaczmarz_eps);
                } else {
                    const double nk = sqrt(kk + (double)c->l2norm_eps);
                    for (int d = 0; d < dk; d++) { k[d] /= nk; }
                    beta = eta;
                }
                const double u = pr[D + HV + hh] + dtb[hh];
                const double alpha = exp(-exp(Al[hh]) * (u > 20.0 ? u : log1p(exp(u))));
                double* Sh = S + (size_t)hh * dk * dv;
                for (int j = 0; j < dv; j++) {
                    double sk = 0.0;
                    for (int d = 0; d < dk; d++) { sk += alpha * Sh[d * dv + j] * k[d]; }
                    r[j] = v[j] - sk;
                }
                for (int d = 0; d < dk; d++) {
                    for (int j = 0; j < dv; j++) { Sh[d * dv + j] = alpha * Sh[d * dv + j] + beta * k[d] * r[j]; }
                }
                double ms = 0.0;
                for (int j = 0; j < dv; j++) {
                    double acc = 0.0;
                    for (int d = 0; d < dk; d++) { acc += Sh[d * dv + j] * q[d]; }
                    y[hh * dv + j] = acc / sqrt((double)dk);
                    ms += y[hh * dv + j] * y[hh * dv + j];
                }
                const double rs = 1.0 / sqrt(ms / dv + (double)c->onorm_eps);
                for (int j = 0; j < dv; j++) {
                    const double z = pr[D + hh * dv + j];
                    y[hh * dv + j] *= rs * wo[j] * z / (1.0 + exp(-z));
                }
            }
            for (int i = 0; i < C; i++) {
                double acc = 0.0;
                for (int j = 0; j < HV; j++) { acc += Wout[(size_t)i * HV + j] * y[j]; }
                const size_t e = ((size_t)b * T + t) * C + i;
                if (out) { out[e] = acc; }
                loss += acc * L->R[e];
            }
        }
    }
    free(proj); free(S); free(f); free(r); free(y);
    return loss;
}

static const MixerLayerTest GDN_LAYER_TEST = {
    gdnt_draw, gdnt_ref_forward,
    // 6. layer backward (gdn_backward) vs finite differences, B = 2, T = 37, BT = 16: 6 samples of every tensor (all
    //    of those with <= 6 entries), 8 of x; fd64 with the 2-point step 1e-5, tolerance 1e-4 (spec 5), and fd32 at
    //    2e-3; the forward vs the float64 one at 1e-5 (spec 5). 7. negative control: an A_log gradient entry.
    {.per_tensor = 6, .x_samples = 8, .points = 2, .h = 1e-5, .fwd_tol = 1e-5, .grad_tol = spec5_grad_tol,
     .fd32_tol = 2e-3, .control = "A_log"},
    NULL,
};

// the small layer of the tests: C = 24, H = 2, dk = 8, dv = 12, W = 4; B = 2, T = 37 (not a multiple of any chunk)
static void gdnt_layer(TestLayer* L, int kaczmarz, int chunk, uint64_t seed) {
    Config c = {.num_layers = 1, .channels = 24, .lin_heads = 2, .lin_dk = 8, .lin_dv = 12, .conv_size = 4,
                .l2norm_eps = 1e-6f, .onorm_eps = 1e-5f, .kaczmarz_eps = 1e-6f,
                .mixer = {kaczmarz ? MIXER_KACZMARZ : MIXER_GDN}};
    test_layer_init(L, &GDN_LAYER_TEST, kaczmarz ? "kaczmarz" : "gdn", &c, chunk, 2, 37, seed);
}

// 5. decode token by token (gdn_decode_step) == gdn_forward over the same sequences: fp32 round-off of two
//    evaluation orders, 1e-5 (spec 5)
static int gdnt_decode(int kaczmarz, int chunk) {
    TestLayer L;
    gdnt_layer(&L, kaczmarz, chunk, 500 + kaczmarz);
    const int fails = test_layer_decode(&L, 1e-5);
    test_layer_free(&L);
    return fails;
}

// 6, 7. layer backward vs finite differences, and its negative control (GDN_LAYER_TEST.fd)
static int gdnt_layer_fd(int kaczmarz) {
    TestLayer L;
    gdnt_layer(&L, kaczmarz, 16, 600 + kaczmarz);
    const int fails = test_layer_fd(&L, NULL);
    test_layer_free(&L);
    return fails;
}

int test_gdn_properties(void) {
    int fails = 0;
    fails += gdnt_chunk_vs_recurrent();
    fails += gdnt_state_split();
    fails += gdnt_kaczmarz_exact();
    fails += gdnt_deltanet();
    for (int kacz = 0; kacz <= 1; kacz++) {
        fails += gdnt_decode(kacz, 16);
        fails += gdnt_decode(kacz, 64);
    }
    for (int kacz = 0; kacz <= 1; kacz++) { fails += gdnt_layer_fd(kacz); }
    printf("gdn tests: %d failures\n", fails);
    return fails;
}

// ----------------------------------------------------------------------------------------------------------
// schedules, initialisation, sampling, checkpoint directory

static void test_schedules(void) {
    // cosine: warmup from lr/W to lr, then down to lr*q at the last step
    float lr = 1e-3f;
    int ok = fabsf(learning_rate(SCHED_COSINE, 0, 100, 10, lr, 0.1f) - 1e-4f) < 1e-9f &&
             fabsf(learning_rate(SCHED_COSINE, 9, 100, 10, lr, 0.1f) - lr) < 1e-9f &&
             fabsf(learning_rate(SCHED_COSINE, 55, 100, 10, lr, 0.1f) - 0.55e-3f) < 1e-7f &&
             fabsf(learning_rate(SCHED_COSINE, 100, 100, 10, lr, 0.1f) - 1e-4f) < 1e-9f;
    report(ok, "schedule cosine: warmup, midpoint, final", "%s", ok ? "" : "wrong values");
    ok = fabsf(learning_rate(SCHED_LINEAR, 55, 100, 10, lr, 0.0f) - 0.5e-3f) < 1e-7f &&
         fabsf(learning_rate(SCHED_CONSTANT, 3, 100, 10, lr, 0.0f) - lr) < 1e-9f &&
         fabsf(learning_rate(SCHED_WSD, 79, 100, 10, lr, 0.0f) - lr) < 1e-9f &&
         fabsf(learning_rate(SCHED_WSD, 95, 100, 10, lr, 0.0f) - (1.0f - sqrtf(0.75f)) * lr) < 1e-7f;
    report(ok, "schedule linear, constant, wsd", "%s", ok ? "" : "wrong values");
    int known = 0;
    for (int i = 0; i < 4; i++) { known += strlen(SCHED_NAMES[i]) > 0; }
    report(known == 4, "schedule names", "%d of 4", known);
}

// spec 9.12: softplus(dt_bias) in [1e-4, 1e-1] (dt floored at 1e-4), exp(A_log) in (0, 16); weights N(0, 0.02)
static void test_initialisation(void) {
    Config c = {0};
    c.vocab_size = 1000; c.padded_vocab_size = 1024; c.max_seq_len = 64; c.num_layers = 2; c.channels = 64;
    c.num_heads = 4; c.lin_heads = 4; c.lin_dk = 16; c.lin_dv = 16; c.conv_size = 4;
    c.mixer[0] = MIXER_GDN; c.mixer[1] = MIXER_KACZMARZ;
    Model m;
    model_build(&m, &c, 64);
    init_parameters(m.params_memory, &m.config, &m.table, 42);
    int ok = 1;
    for (int l = 0; l < 2; l++) {
        for (int h = 0; h < 4; h++) {
            float dt_bias = m.params.layer[l].gdn.dt_bias[h], A = expf(m.params.layer[l].gdn.A_log[h]);
            float dt = log1pf(expf(dt_bias));
            ok &= dt >= 0.999e-4f && dt <= 0.1001f && A > 0.0f && A < 16.0f;
        }
    }
    report(ok, "init: softplus(dt_bias) in [1e-4, 0.1], exp(A_log) in (0, 16)", "%s", ok ? "" : "out of range");
    const TensorInfo* t = &m.table.t[0];
    double s2 = 0.0, pad = 0.0;
    for (size_t i = 0; i < (size_t)c.vocab_size * c.channels; i++) { s2 += (double)m.params_memory[i] * m.params_memory[i]; }
    for (size_t i = (size_t)c.vocab_size * c.channels; i < t->numel; i++) { pad += fabs(m.params_memory[i]); }
    double std = sqrt(s2 / ((double)c.vocab_size * c.channels));
    report(fabs(std - 0.02) < 0.001 && pad == 0.0, "init: wte ~ N(0, 0.02), padding rows zero", "std %.5f, padding sum %g", std, pad);
    model_free(&m);
}

// model_flops_per_token (model.h) against a count by hand of one small model per mixer: V = 128, C = 64, one layer,
// GELU MLP of 256, H = 2 heads of dk = 16, dv = 24 (gka: 2 key/value heads, r = 30; kalman: plain, expand 1,
// N = 16), T = 80 (1.25 chunks of 64). The matmul weights are read off FORMATS.md's layout; the cores are the spec
// formulas evaluated by hand. The count is exact arithmetic, so the tolerance is round-off (1e-12 relative); the
// negative control moves the hand count by one matmul weight (6 flops) and must be caught.
static void test_flop_count(void) {
    Config c = {0};
    c.vocab_size = 128; c.padded_vocab_size = 128; c.max_seq_len = 80; c.num_layers = 1; c.channels = 64;
    c.num_heads = 4; c.lin_heads = 2; c.lin_dk = 16; c.lin_dv = 24; c.conv_size = 4; c.mlp = MLP_GELU;
    c.mlp_hidden = 256; c.gka_iters = 30; c.gka_kv_heads = 2; c.kalman_expand = 1; c.kalman_n = 16;
    const double trunk = 128 * 64 + 256 * 64 + 64 * 256;  // wte as the LM head, mlp.fc.w, mlp.proj.w
    const double padded = 128.0 / 80.0;                   // gdn and gka compute whole chunks: 2 x 64 for T = 80
    // gdn/kaczmarz core per head (spec 3.7, BT = 64): fwd 6KV + 6BT.K + 4BT.V + BT^2/3, bwd 16KV + 18BT.K + 10BT.V + 4BT^2
    const double gdn_core = 2 * ((2304 + 6144 + 6144 + 4096.0 / 3) + (6144 + 18432 + 15360 + 16384)) * padded;
    // pdn core per head (spec/pdn.md 3.7): fwd 6KV + BT(8K + 4V) + BT^2/3 + 15K, bwd 16KV + BT(24K + 10V) + 4BT^2 + 30K
    const double pdn_core = 2 * ((2304 + 14336 + 4096.0 / 3 + 240) + (6144 + 39936 + 16384 + 480));
    // gka core per head (spec/gka.md 6, D = 16, r = 30): fwd 68D^2 + 126BT.D + 2BT^2, bwd 82D^2 + 148BT.D + 2BT^2
    const double gka_core = 2 * ((17408 + 129024 + 8192) + (20992 + 151552 + 8192)) * padded;
    struct { int mixer; double matmul, core; } cases[] = {
        {MIXER_ATTN, 192 * 64 + 64 * 64, 6.0 * 64 * 80},                     // qkv, proj; causal 6 C T
        {MIXER_GDN, 164 * 64 + 64 * 48, gdn_core},                           // in_proj rows 2*2*16 + 2*2*24 + 2*2
        {MIXER_KACZMARZ, 164 * 64 + 64 * 48, gdn_core},
        {MIXER_PDN, 118 * 64 + 64 * 48, pdn_core},                           // rows 112 + 3H
        {MIXER_PGDN, 120 * 64 + 64 * 48, pdn_core},                          // + a
        {MIXER_PKDA, 166 * 64 + 32 * 24 + 48 * 24 + 64 * 48, pdn_core},      // + f1, g1; f2.w, g2.w
        {MIXER_GKA, 166 * 64 + 64 * 48, gka_core},                           // rows 32 + 2*(16+24) + 48 + 3H
        {MIXER_KALMAN, 128 * 64 + 160 * 64 + 64 * 64, 72.0 * 64 * 16},       // in_proj, sensor (2Dk + 2N), out; 72 per lane
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        c.mixer[0] = cases[i].mixer;
        double cores, got = model_flops_per_token(&c, 80, &cores);
        double want = 6.0 * (trunk + cases[i].matmul) + cases[i].core;
        double err = fabs(got - want) / want, err_core = fabs(cores - cases[i].core) / cases[i].core;
        int caught = fabs(got - (want + 6.0)) / want > 1e-12;  // negative control
        report(err < 1e-12 && err_core < 1e-12 && caught, "FLOPs per token == count by hand", "%s: %.6g, by hand %.6g",
               MIXER_NAMES[cases[i].mixer], got, want);
    }
}

static void test_sampling(void) {
    float logits[5] = {0.0f, 0.0f, 50.0f, 0.0f, 0.0f};
    int ok = sample_token(logits, 5, 1.0f, 0, 0.5f) == 2 && sample_token(logits, 5, 1.0f, 0, 0.999f) == 2;
    float uniform[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    ok &= sample_token(uniform, 4, 1.0f, 0, 0.1f) == 0 && sample_token(uniform, 4, 1.0f, 0, 0.3f) == 1 &&
          sample_token(uniform, 4, 1.0f, 0, 0.99f) == 3;
    report(ok, "sampling: inverse CDF of the softmax", "%s", ok ? "" : "wrong token");
    // top-k: k = 3 keeps the three largest logits (indices 0, 2, 4, equal), each with probability 1/3 after
    // renormalising, so coins in the thirds of [0, 1) pick them in index order. Negative control: without top-k
    // (k = 0) the coin 0 lands on token 0 of an ascending row, not on its argmax.
    float mixed[6] = {5.0f, 1.0f, 5.0f, 2.0f, 5.0f, 3.0f};
    int topk_ok = sample_token(mixed, 6, 1.0f, 3, 0.0f) == 0 && sample_token(mixed, 6, 1.0f, 3, 0.34f) == 2 &&
                  sample_token(mixed, 6, 1.0f, 3, 0.67f) == 4 && sample_token(mixed, 6, 1.0f, 3, 0.999f) == 4;
    float ascending[6] = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
    int k1 = 1;  // k = 1 is greedy: the argmax for any coin
    for (int i = 0; i < 10; i++) { k1 &= sample_token(ascending, 6, 1.0f, 1, i / 10.0f) == 5; }
    int control = sample_token(ascending, 6, 1.0f, 0, 0.0f) != 5;
    report(topk_ok && k1 && control, "sampling: --top-k keeps the k largest logits (k = 1 is greedy)",
           "top-3 %d, greedy %d, control %d", topk_ok, k1, control);
    // kth_largest against sorting, on random arrays with ties
    uint64_t rng = 7;
    int kth_ok = 1;
    for (int trial = 0; trial < 200; trial++) {
        float a[37], sorted[37];
        int n = 1 + trial % 37;
        for (int i = 0; i < n; i++) { a[i] = sorted[i] = (float)(int)(8.0f * rng_uniform(&rng)); }
        for (int i = 1; i < n; i++) {  // insertion sort, descending
            for (int j = i; j > 0 && sorted[j] > sorted[j - 1]; j--) { float t = sorted[j]; sorted[j] = sorted[j - 1]; sorted[j - 1] = t; }
        }
        for (int k = 1; k <= n; k++) { kth_ok &= kth_largest(a, n, k) == sorted[k - 1]; }
    }
    report(kth_ok, "sampling: kth_largest == the k-th of a sorted copy (200 arrays with ties)", "%s", kth_ok ? "" : "mismatch");
}

// write_checkpoint + find_latest_checkpoint + read_state_file + delete_old_checkpoints in a temp dir
static void test_checkpoint_dir(const char* ref_dir) {
    char dir[] = "/tmp/test_kla_ckpt_XXXXXX", path[4096];
    if (mkdtemp(dir) == NULL) { report(0, "checkpoint dir", "mkdtemp failed"); return; }
    Model m;
    snprintf(path, sizeof(path), "%s/gdn_model.bin", ref_dir);
    model_load(&m, path, 64);
    m.m_memory = (float*)calloc_or_die(m.num_parameters, sizeof(float));
    m.v_memory = (float*)calloc_or_die(m.num_parameters, sizeof(float));
    for (size_t i = 0; i < m.num_parameters; i++) { m.m_memory[i] = (float)i; m.v_memory[i] = 1.0f / (1.0f + i); }
    static TrainState s;  // static: its run-flag block stays off the stack
    memset(&s, 0, sizeof(s));
    const char run_flags[] = "-b\0" "2\0" "--prompt\0" "two\nlines\0";  // a value may hold any byte but NUL
    memcpy(s.run_flags, run_flags, sizeof(run_flags));
    s.run_flags_bytes = (int32_t)sizeof(run_flags) - 1;  // the literal's own final NUL is not part of the block
    for (int step = 1; step <= 4; step++) {
        s.step = step;
        s.loader.epoch = (uint64_t)step * 10;
        write_checkpoint(&m.config, &m.table, m.params_memory, m.m_memory, m.v_memory, &s, dir);
        delete_old_checkpoints(dir, 2);
    }
    int64_t latest = find_latest_checkpoint(dir);
    checkpoint_path(path, sizeof(path), dir, "model", 2);
    int kept_ok = latest == 4 && access(path, F_OK) != 0;  // steps 1 and 2 deleted
    Model r;
    static TrainState rs;
    checkpoint_path(path, sizeof(path), dir, "model", 4);
    model_load(&r, path, 64);
    checkpoint_path(path, sizeof(path), dir, "state", 4);
    r.m_memory = (float*)calloc_or_die(r.num_parameters, sizeof(float));
    r.v_memory = (float*)calloc_or_die(r.num_parameters, sizeof(float));
    int has_adam = read_state_file(&rs, r.num_parameters, r.m_memory, r.v_memory, path);
    int same = has_adam && rs.step == 4 && rs.loader.epoch == 40 && rs.run_flags_bytes == s.run_flags_bytes &&
               memcmp(rs.run_flags, s.run_flags, (size_t)s.run_flags_bytes) == 0 &&
               memcmp(r.m_memory, m.m_memory, m.num_parameters * sizeof(float)) == 0 &&
               memcmp(r.v_memory, m.v_memory, m.num_parameters * sizeof(float)) == 0;
    report(kept_ok && same, "checkpoint dir: newest found, -nk 2 keeps two, state round trip (moments, dataloader, run flags)", "latest %lld, state ok %d", (long long)latest, same);
    for (int step = 3; step <= 4; step++) {
        const char* kinds[3] = {"DONE", "model", "state"};
        for (int k = 0; k < 3; k++) { checkpoint_path(path, sizeof(path), dir, kinds[k], step); remove(path); }
    }
    rmdir(dir);
    model_free(&m);
    model_free(&r);
}

// Gradient accumulation: two micro-batches of one sequence each, with loss_scale 1/2, give the gradient of the
// batch of two (fp32 round-off of a different summation order only: 1e-5 of the largest entry).
static void test_grad_accumulation(const char* dir) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/hybrid_model.bin", dir);
    Model m;
    model_load(&m, path, 64);
    int T = 24, V = m.config.vocab_size, tokens[2 * 24 + 1];
    uint64_t rng = 11;
    for (int i = 0; i < 2 * T + 1; i++) { tokens[i] = (int)(rng_next(&rng) % (uint64_t)V); }
    int x[48], y[48];
    for (int b = 0; b < 2; b++) {
        for (int t = 0; t < T; t++) { x[b * T + t] = tokens[b * T + t]; y[b * T + t] = tokens[b * T + t + 1]; }
    }
    float* full = (float*)malloc_or_die(m.num_parameters * sizeof(float));
    model_zero_grad(&m);
    model_forward(&m, x, y, 2, T);
    model_backward(&m, 1.0f);
    memcpy(full, m.grads_memory, m.num_parameters * sizeof(float));
    model_zero_grad(&m);
    for (int b = 0; b < 2; b++) {
        model_forward(&m, x + b * T, y + b * T, 1, T);
        model_backward(&m, 0.5f);
    }
    double err = relative_error(m.grads_memory, full, m.num_parameters);
    report(err <= 1e-5, "gradient accumulation: 2 micro-batches of 1 == one batch of 2", "rel err %.2e (tol 1e-5)", err);
    free(full);
    model_free(&m);
}

// ----------------------------------------------------------------------------
// pdn / pgdn / pkda mixer properties (spec/pdn.md 9). Uses the test_ rng and check helpers and the layer harness above.
// Every check prints "PASS <name>: ..." or "FAIL <name>: ...". Errors are max-norm relative unless stated.

static const char* pdnt_vname[3] = {"pdn", "pgdn", "pkda"};

// plain double recurrence of spec 2.1 for one head (the test's own reference). g [T*dk]; x = 1 drops the
// preconditioner (m = 1). Writes o [T*dv], S [dk*dv], A [dk], m [T*dk] (may be NULL).
static void pdnt_core_ref(double* o, double* S, double* A, double* mo, const float* q, const float* k, const float* v,
                          int stride_k, int stride_v, const float* beta, const float* g, const float* gP,
                          const float* bP, double cs, double x, double eps, double qscale, int T, int dk, int dv) {
    double* m = (double*)malloc((size_t)dk * sizeof(double));
    double* p = (double*)malloc((size_t)dv * sizeof(double));
    for (int t = 0; t < T; t++) {
        const float* qt = q + (size_t)t * stride_k;
        const float* kt = k + (size_t)t * stride_k;
        const float* vt = v + (size_t)t * stride_v;
        for (int d = 0; d < dk; d++) {
            A[d] = exp((double)gP[t]) * A[d] + (double)bP[t] * kt[d] * kt[d];
            const double r = log(A[d] + eps) - cs;
            m[d] = exp(-log(x) * r / (1.0 + fabs(r)));
            if (mo) { mo[(size_t)t * dk + d] = m[d]; }
        }
        for (int j = 0; j < dv; j++) {
            double acc = 0.0;
            for (int d = 0; d < dk; d++) { acc += exp((double)g[(size_t)t * dk + d]) * S[d * dv + j] * kt[d]; }
            p[j] = vt[j] - acc;
        }
        for (int d = 0; d < dk; d++) {
            for (int j = 0; j < dv; j++) {
                S[d * dv + j] = exp((double)g[(size_t)t * dk + d]) * S[d * dv + j] + m[d] * kt[d] * beta[t] * p[j];
            }
        }
        for (int j = 0; j < dv; j++) {
            double acc = 0.0;
            for (int d = 0; d < dk; d++) { acc += S[d * dv + j] * qt[d]; }
            o[(size_t)t * dv + j] = qscale * acc;
        }
    }
    free(m); free(p);
}

// 1. golden vector of spec 11 (PGDN, T = 2, dk = dv = 2, q = k passed pre-scaled: qscale = 1)
static int pdnt_golden(void) {
    const float qkv[2][6] = {{1, 0, 1, 0, 1, 2}, {0.6f, 0.8f, 0.6f, 0.8f, 3, -1}};
    const float beta[2] = {0.5f, 0.8f}, g[4] = {-0.1f, -0.1f, -0.2f, -0.2f}, gP[2] = {0.0f, -0.5f}, bP[2] = {1.0f, 0.5f};
    const float cs = -0.2f;
    float o[4], A[4], m[4], Sck[4], S[4] = {0}, Af[2] = {0};
    pdn_core_forward(o, A, m, Sck, S, Af, &qkv[0][0], beta, g, gP, bP, &cs, 1, 2, 1, 2, 2, 4, 1.0f, logf(1.5f), 1e-6f);
    const double o_ref[4] = {0.4673275010, 0.9346550020, 2.7663186569, -0.8769240352};
    const double S_ref[4] = {1.7333847181, 0.0538037058, 2.1578597825, -1.1365078233};
    const double A_ref[4] = {1.0, 0.0, 0.7865306597, 0.32};
    const double m_ref[4] = {0.9346550020, 1.4589587519, 1.0157636102, 1.2170150421};
    double err = 0.0;
    for (int i = 0; i < 4; i++) {
        err = fmax(err, fabs(o[i] - o_ref[i]));
        err = fmax(err, fabs(S[i] - S_ref[i]));
        err = fmax(err, fabs(A[i] - A_ref[i]));
        err = fmax(err, fabs(m[i] - m_ref[i]));
    }
    for (int i = 0; i < 2; i++) { err = fmax(err, fabs(Af[i] - A_ref[2 + i])); }
    return test_check("pdn_golden_vector_spec11 (max abs)", err, 1e-6);
}

// random core inputs for B, T, H: unit q, k; v ~ N(0,1); beta in (0,1); g per variant (pkda: per channel);
// gP = -exp(U(-4,1)), bP in (0,1); cs ~ -0.2 + N(0, 0.5)
static void pdnt_core_inputs(float* qkv, float* beta, float* g, float* gP, float* bP, float* cs,
                             int B, int T, int H, int dk, int dv, int variant) {
    const int D = 2 * H * dk + H * dv;
    for (size_t r = 0; r < (size_t)B * T; r++) {
        float* row = qkv + r * D;
        for (int i = 0; i < D; i++) { row[i] = (float)test_normal(); }
        for (int hh = 0; hh < H; hh++) {
            float* q = row + hh * dk;
            float* k = row + H * dk + hh * dk;
            const float nq = sqrtf(vec_dot(q, q, dk)), nk = sqrtf(vec_dot(k, k, dk));
            for (int d = 0; d < dk; d++) { q[d] /= nq; k[d] /= nk; }
            const size_t e = r * H + hh;
            beta[e] = (float)test_unif();
            gP[e] = (float)-exp(-4.0 + 5.0 * test_unif());
            bP[e] = (float)test_unif();
            const float gs = (float)-exp(-5.0 + 5.0 * test_unif());
            for (int d = 0; d < dk; d++) {
                g[e * dk + d] = variant == 0 ? 0.0f : variant == 1 ? gs : (float)-exp(-5.0 + 5.0 * test_unif());
            }
        }
    }
    for (int hh = 0; hh < H; hh++) { cs[hh] = (float)(-0.2 + 0.5 * test_normal()); }
}

// 2. x = 1: m = 1, so pdn == DeltaNet and pgdn == GDN (against the plain double recurrence without the
//    preconditioner, and pgdn also against train_kla's gdn_core_recurrent); dgP, dbP, dc exactly 0.
static int pdnt_x1(void) {
    const int B = 2, T = 29, H = 2, dk = 8, dv = 6, D = 2 * H * dk + H * dv, CK = 8;
    const size_t BT = (size_t)B * T, nO = BT * H * dv;
    int fails = 0;
    float* qkv = (float*)malloc(BT * D * sizeof(float));
    float* beta = (float*)malloc(BT * H * sizeof(float));
    float* gP = (float*)malloc(BT * H * sizeof(float));
    float* bP = (float*)malloc(BT * H * sizeof(float));
    float* g = (float*)malloc(BT * H * dk * sizeof(float));
    float* A = (float*)malloc(BT * H * dk * sizeof(float));
    float* m = (float*)malloc(BT * H * dk * sizeof(float));
    float* o = (float*)malloc(nO * sizeof(float));
    float* o2 = (float*)malloc(nO * sizeof(float));
    float* Sck = (float*)malloc((size_t)B * H * pdn_NT(T, CK) * dk * dv * sizeof(float));
    float* S = (float*)malloc((size_t)B * H * dk * dv * sizeof(float));
    float* Af = (float*)malloc((size_t)B * H * dk * sizeof(float));
    float* dqkv = (float*)malloc(BT * D * sizeof(float));
    float* dO = (float*)malloc(nO * sizeof(float));
    float* dbeta = (float*)malloc(BT * H * sizeof(float));
    float* dgP = (float*)malloc(BT * H * sizeof(float));
    float* dbP = (float*)malloc(BT * H * sizeof(float));
    float* dg = (float*)malloc(BT * H * dk * sizeof(float));
    float* dcs = (float*)malloc((size_t)B * H * sizeof(float));
    float* scr = (float*)malloc((size_t)max_threads() * pdn_core_bwd_floats(CK, dk, dv) * sizeof(float));
    double* od = (double*)malloc((size_t)T * dv * sizeof(double));
    double* Sd = (double*)malloc((size_t)dk * dv * sizeof(double));
    double Ad[8];
    float cs[2];
    for (int variant = 0; variant < 2; variant++) {
        test_seed(700 + variant);
        pdnt_core_inputs(qkv, beta, g, gP, bP, cs, B, T, H, dk, dv, variant);
        memset(S, 0, (size_t)B * H * dk * dv * sizeof(float));
        memset(Af, 0, (size_t)B * H * dk * sizeof(float));
        pdn_core_forward(o, A, m, Sck, S, Af, qkv, beta, g, gP, bP, cs, B, T, H, dk, dv, CK,
                         1.0f / sqrtf((float)dk), logf(1.0f), 1e-6f);
        double err = 0.0;
        int m_not_one = 0;
        for (size_t i = 0; i < BT * H * dk; i++) { m_not_one += m[i] != 1.0f; }
        for (int b = 0; b < B; b++) {
            for (int hh = 0; hh < H; hh++) {
                float* bb = (float*)malloc(T * sizeof(float));
                float* gg = (float*)malloc((size_t)T * dk * sizeof(float));
                float* ones = (float*)malloc(T * sizeof(float));
                for (int t = 0; t < T; t++) {
                    const size_t e = ((size_t)b * T + t) * H + hh;
                    bb[t] = beta[e]; ones[t] = 0.0f;
                    for (int d = 0; d < dk; d++) { gg[(size_t)t * dk + d] = g[e * dk + d]; }
                }
                memset(Sd, 0, (size_t)dk * dv * sizeof(double));
                for (int d = 0; d < dk; d++) { Ad[d] = 0.0; }
                const float* base = qkv + (size_t)b * T * D;
                pdnt_core_ref(od, Sd, Ad, NULL, base + hh * dk, base + H * dk + hh * dk, base + 2 * H * dk + hh * dv,
                              D, D, bb, gg, ones, ones, 0.0, 1.0, 1e-6, 1.0 / sqrt((double)dk), T, dk, dv);
                double num = 0.0, den = 0.0;
                for (int t = 0; t < T; t++) {
                    for (int j = 0; j < dv; j++) {
                        const double ref = od[(size_t)t * dv + j];
                        num = fmax(num, fabs(o[(((size_t)b * T + t) * H + hh) * dv + j] - ref));
                        den = fmax(den, fabs(ref));
                    }
                }
                err = fmax(err, num / den);
                free(bb); free(gg); free(ones);
            }
        }
        char name[96];
        snprintf(name, sizeof(name), "pdn_x1_%s_equals_%s (m != 1: %d)", pdnt_vname[variant],
                 variant ? "gdn" : "deltanet", m_not_one);
        fails += test_check(name, m_not_one ? 1.0 : err, 1e-6);
        if (variant == 1) {
            // gdn_core_recurrent takes the per-head scalar g and the same normalised q (it scales by dk^-1/2)
            float* gs = (float*)malloc(BT * H * sizeof(float));
            float* Sg = (float*)calloc((size_t)B * H * dk * dv, sizeof(float));
            for (size_t e = 0; e < BT * H; e++) { gs[e] = g[e * dk]; }
            gdn_core_recurrent(o2, Sg, qkv, beta, gs, B, T, H, dk, dv);
            fails += test_check("pdn_x1_pgdn_equals_gdn_core_recurrent", test_relerr(o, o2, nO), 1e-6);
            fails += test_check("pdn_x1_pgdn_final_S_equals_gdn", test_relerr(S, Sg, (size_t)B * H * dk * dv), 1e-6);
            free(gs); free(Sg);
        }
        for (size_t i = 0; i < nO; i++) { dO[i] = (float)test_normal(); }
        pdn_core_backward(dqkv, dbeta, dg, dgP, dbP, dcs, NULL, NULL, dO, NULL, NULL, Sck, qkv, beta, g, gP, bP, A, m,
                          cs, B, T, H, dk, dv, CK, 1.0f / sqrtf((float)dk), logf(1.0f), 1e-6f, scr, max_threads());
        double z = 0.0;
        for (size_t e = 0; e < BT * H; e++) { z = fmax(z, fmax(fabs(dgP[e]), fabs(dbP[e]))); }
        for (int i = 0; i < B * H; i++) { z = fmax(z, fabs(dcs[i])); }
        snprintf(name, sizeof(name), "pdn_x1_%s_precond_grads_exactly_zero (max |dgP|,|dbP|,|dc|)", pdnt_vname[variant]);
        fails += test_check(name, z, 0.0);
    }
    free(qkv); free(beta); free(gP); free(bP); free(g); free(A); free(m); free(o); free(o2); free(Sck); free(S);
    free(Af); free(dqkv); free(dO); free(dbeta); free(dgP); free(dbP); free(dg); free(dcs); free(scr); free(od); free(Sd);
    return fails;
}

// ----------------------------------------------------------------------------
// layer-level tests: a small random layer on the harness above

// random weights with O(1) activations; decays as in FORMATS.md; the centre, gate bias and onorm_w away
// from their init so that their gradients are checked in general position
static void pdnt_draw(TestLayer* L) {
    PDNParams* p = &L->p.pdn;
    const PDNConfig* c = &L->s.pdn;
    const int H = c->H, HV = c->H * c->dv, C = c->C, dv = c->dv;
    test_draw_uniform(p->in_proj_w, test_layer_numel(L, "in_proj_w"), C);
    for (size_t i = 0; i < test_layer_numel(L, "conv_w"); i++) { p->conv_w[i] = (float)(test_unif() - 0.5); }
    for (size_t i = 0; i < test_layer_numel(L, "A_log"); i++) { p->A_log[i] = (float)log(1.0 + 15.0 * test_unif()); }
    for (size_t i = 0; i < test_layer_numel(L, "dt_bias"); i++) { p->dt_bias[i] = (float)test_draw_dt_bias(); }
    test_draw_uniform(p->f2_w, test_layer_numel(L, "f2_w"), dv);
    test_draw_uniform(p->g2_w, test_layer_numel(L, "g2_w"), dv);
    for (size_t i = 0; i < test_layer_numel(L, "g2_b"); i++) { p->g2_b[i] = (float)(0.5 * test_normal()); }
    for (int hh = 0; hh < H; hh++) {
        p->A_log_P[hh] = (float)log(1.0 + 15.0 * test_unif());
        p->dt_bias_P[hh] = (float)test_draw_dt_bias();
        p->log_scale[hh] = (float)(-0.2 + 0.5 * test_normal());
    }
    for (int i = 0; i < dv; i++) { p->onorm_w[i] = (float)(1.0 + 0.2 * test_normal()); }
    test_draw_uniform(p->out_proj_w, test_layer_numel(L, "out_proj_w"), HV);
}

static double pdnt_sigmoid(double u) { return 1.0 / (1.0 + exp(-u)); }
static double pdnt_softplus(double u) { return u > 20.0 ? u : log1p(exp(u)); }

// independent double-precision layer forward (spec 1.1-1.5 with the token recurrence 2.1).
// prm: the 12 tensors in PDNParams order (absent ones empty); out [B,T,C] (may be NULL); returns sum(out * R)
static double pdnt_ref_forward(const TestLayer* L, const double* prm, const double* x, double* out) {
    const PDNConfig* c = &L->s.pdn;
    const int B = L->B, T = L->T, C = c->C, H = c->H, dk = c->dk, dv = c->dv, W = c->W, v = c->variant;
    const int HV = H * dv, D = pdn_D(c), P = pdn_P(c);
    const double *Win = test_layer_param64(L, prm, "in_proj_w"), *Wc = test_layer_param64(L, prm, "conv_w");
    const double *Al = test_layer_param64(L, prm, "A_log"), *dtb = test_layer_param64(L, prm, "dt_bias");
    const double *f2 = test_layer_param64(L, prm, "f2_w"), *g2 = test_layer_param64(L, prm, "g2_w");
    const double *g2b = test_layer_param64(L, prm, "g2_b"), *AlP = test_layer_param64(L, prm, "A_log_P");
    const double *dtbP = test_layer_param64(L, prm, "dt_bias_P"), *cs = test_layer_param64(L, prm, "log_scale");
    const double *wo = test_layer_param64(L, prm, "onorm_w"), *Wout = test_layer_param64(L, prm, "out_proj_w");
    double* proj = (double*)malloc((size_t)T * P * sizeof(double));
    double* S = (double*)malloc((size_t)H * dk * dv * sizeof(double));
    double* A = (double*)malloc((size_t)H * dk * sizeof(double));
    double* f = (double*)malloc((size_t)D * sizeof(double));
    double* pe = (double*)malloc((size_t)dv * sizeof(double));
    double* y = (double*)malloc((size_t)HV * sizeof(double));
    double* gd = (double*)malloc((size_t)dk * sizeof(double));
    double* md = (double*)malloc((size_t)dk * sizeof(double));
    double loss = 0.0;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < P; i++) {
                double acc = 0.0;
                for (int j = 0; j < C; j++) { acc += Win[(size_t)i * C + j] * x[((size_t)b * T + t) * C + j]; }
                proj[(size_t)t * P + i] = acc;
            }
        }
        for (int i = 0; i < H * dk * dv; i++) { S[i] = 0.0; }
        for (int i = 0; i < H * dk; i++) { A[i] = 0.0; }
        for (int t = 0; t < T; t++) {
            const double* pr = proj + (size_t)t * P;
            for (int ch = 0; ch < D; ch++) {
                double acc = 0.0;
                for (int j = 0; j < W; j++) {
                    const int s = t - (W - 1) + j;
                    if (s >= 0) { acc += Wc[ch * W + j] * proj[(size_t)s * P + ch]; }
                }
                f[ch] = acc / (1.0 + exp(-acc));
            }
            for (int hh = 0; hh < H; hh++) {
                double* q = f + hh * dk;
                double* k = f + H * dk + hh * dk;
                const double* vv = f + 2 * H * dk + hh * dv;
                double nq = 0.0, nk = 0.0;
                for (int d = 0; d < dk; d++) { nq += q[d] * q[d]; nk += k[d] * k[d]; }
                nq = sqrt(nq + (double)c->l2norm_eps);
                nk = sqrt(nk + (double)c->l2norm_eps);
                for (int d = 0; d < dk; d++) { q[d] /= nq * sqrt((double)dk); k[d] /= nk; }
                const double beta = pdnt_sigmoid(pr[D + hh]);
                const double gP = -exp(AlP[hh]) * pdnt_softplus(pr[D + H + hh] + dtbP[hh]);
                const double bP = pdnt_sigmoid(pr[D + 2 * H + hh]);
                for (int d = 0; d < dk; d++) {
                    if (v == 0) {
                        gd[d] = 0.0;
                    } else if (v == 1) {
                        gd[d] = -exp(Al[hh]) * pdnt_softplus(pr[D + 3 * H + hh] + dtb[hh]);
                    } else {
                        double fr = 0.0;   // f = f1 @ f2^T, f1 = proj[D+3H : D+3H+dv]
                        for (int j = 0; j < dv; j++) { fr += f2[(size_t)(hh * dk + d) * dv + j] * pr[D + 3 * H + j]; }
                        gd[d] = -exp(Al[hh]) * pdnt_softplus(fr + dtb[hh * dk + d]);
                    }
                    double* Ah = A + hh * dk;
                    Ah[d] = exp(gP) * Ah[d] + bP * k[d] * k[d];
                    const double r = log(Ah[d] + (double)c->precond_eps) - cs[hh];
                    md[d] = exp(-log((double)c->x) * r / (1.0 + fabs(r)));
                }
                double* Sh = S + (size_t)hh * dk * dv;
                for (int j = 0; j < dv; j++) {
                    double sk = 0.0;
                    for (int d = 0; d < dk; d++) { sk += exp(gd[d]) * Sh[d * dv + j] * k[d]; }
                    pe[j] = vv[j] - sk;
                }
                for (int d = 0; d < dk; d++) {
                    for (int j = 0; j < dv; j++) {
                        Sh[d * dv + j] = exp(gd[d]) * Sh[d * dv + j] + md[d] * k[d] * beta * pe[j];
                    }
                }
                double ms = 0.0;
                for (int j = 0; j < dv; j++) {
                    double acc = 0.0;
                    for (int d = 0; d < dk; d++) { acc += Sh[d * dv + j] * q[d]; }
                    y[hh * dv + j] = acc;
                    ms += acc * acc;
                }
                const double rs = 1.0 / sqrt(ms / dv + (double)c->onorm_eps);
                for (int j = 0; j < dv; j++) {
                    double sg = 1.0;
                    if (v == 2) {
                        double gt = g2b[hh * dv + j];   // gate = g1 @ g2^T + b, g1 = proj[D+3H+dv : D+3H+2dv]
                        for (int i = 0; i < dv; i++) { gt += g2[(size_t)(hh * dv + j) * dv + i] * pr[D + 3 * H + dv + i]; }
                        sg = pdnt_sigmoid(gt);
                    }
                    y[hh * dv + j] *= rs * wo[j] * sg;
                }
            }
            for (int i = 0; i < C; i++) {
                double acc = 0.0;
                for (int j = 0; j < HV; j++) { acc += Wout[(size_t)i * HV + j] * y[j]; }
                const size_t e = ((size_t)b * T + t) * C + i;
                if (out) { out[e] = acc; }
                loss += acc * L->R[e];
            }
        }
    }
    free(proj); free(S); free(A); free(f); free(pe); free(y); free(gd); free(md);
    return loss;
}

// the decode state after a forward over [0, T): the conv window, the final S and A of sequence b
static void pdnt_state_from_acts(MixerState* st, const MixerActs* a, const TestLayer* L, int b) {
    const PDNConfig* c = &L->s.pdn;
    const int H = c->H, dk = c->dk, dv = c->dv;
    test_conv_window(st->pdn.conv, a->pdn.proj, b, L->T, pdn_P(c), pdn_D(c), c->W);
    memcpy(st->pdn.S, a->pdn.S + (size_t)b * H * dk * dv, (size_t)H * dk * dv * sizeof(float));
    memcpy(st->pdn.A, a->pdn.Af + (size_t)b * H * dk, (size_t)H * dk * sizeof(float));
}

// 7. the gradient tolerances: 1e-4 (spec 5), A_log_P, dt_bias_P, log_scale 1e-3 (spec 5: the 1/(A + eps) factor
//    amplifies fp32 round-off)
static double pdnt_grad_tol(const char* tensor) {
    const int loose = !strcmp(tensor, "A_log_P") || !strcmp(tensor, "dt_bias_P") || !strcmp(tensor, "log_scale");
    return loose ? 1e-3 : 1e-4;
}

static const MixerLayerTest PDN_LAYER_TEST = {
    pdnt_draw, pdnt_ref_forward,
    // 7. layer backward (pdn_backward) vs the 4-point differences of the float64 forward, h = 1e-4 (truncation
    //    ~h^4, round-off ~1e-16 |L| / h ~ 1e-11: exact to ~1e-9), 5 samples of every tensor (all if fewer), 8 of x;
    //    the fp32 forward vs the float64 one at 1e-5 (spec 5). 8. negative control: an in_proj_w gradient entry.
    {.per_tensor = 5, .x_samples = 8, .points = 4, .h = 1e-4, .fwd_tol = 1e-5, .grad_tol = pdnt_grad_tol,
     .control = "in_proj_w"},
    pdnt_state_from_acts,
};

// the small layer of the tests: C = 24, H = 2, dk = 8, dv = 6, W = 4, x = 1.5 (T = 37 is not a multiple of the
// checkpoint interval)
static void pdnt_layer(TestLayer* L, int variant, int chunk, int B, uint64_t seed) {
    Config c = {.num_layers = 1, .channels = 24, .lin_heads = 2, .lin_dk = 8, .lin_dv = 6, .conv_size = 4,
                .l2norm_eps = 1e-6f, .precond_x = 1.5f, .precond_eps = 1e-6f, .precond_onorm_eps = 1e-6f,
                .mixer = {MIXER_PDN + variant}};
    test_layer_init(L, &PDN_LAYER_TEST, pdnt_vname[variant], &c, chunk, B, 37, seed);
}

// 3. pgdn with g = 0 (A_log = -200) == pdn; pkda with equal channels (f2 = 0, dt_bias[h,:] = pgdn's dt_bias[h],
//    pgdn's a rows = 0, gate saturated: g2 = 0, g2_b = 30) == pgdn; pkda's dt_bias gradient summed over the
//    channels of a head == pgdn's (that is dg summed over channels, through the same softplus chain), dA_log equal.
static int pdnt_variants(void) {
    int fails = 0;
    TestLayer L0, L1, L2;
    pdnt_layer(&L0, 0, 8, 2, 800);
    pdnt_layer(&L1, 1, 8, 2, 801);
    pdnt_layer(&L2, 2, 8, 2, 802);
    const PDNConfig* c0 = &L0.s.pdn;
    const int C = c0->C, H = c0->H, dk = c0->dk, P0 = pdn_P(c0), D = pdn_D(c0);
    const size_t nx = (size_t)2 * 37 * C;
    // the tensors after the decays, the same in every variant
    const char* shared[5] = {"A_log_P", "dt_bias_P", "log_scale", "onorm_w", "out_proj_w"};
    // pgdn: copy pdn's weights, A_log = -200 (g = -0 exactly)
    memcpy(L1.p.pdn.in_proj_w, L0.p.pdn.in_proj_w, (size_t)P0 * C * sizeof(float));
    test_layer_copy(&L1, &L0, "conv_w");
    for (int i = 0; i < 5; i++) { test_layer_copy(&L1, &L0, shared[i]); }
    memcpy(L1.x, L0.x, nx * sizeof(float));
    memcpy(L1.R, L0.R, nx * sizeof(float));
    for (int hh = 0; hh < H; hh++) { L1.p.pdn.A_log[hh] = -200.0f; }
    test_layer_loss(&L0, NULL, NULL);
    test_layer_loss(&L1, NULL, NULL);
    fails += test_check("pdn_pgdn_g0_equals_pdn", test_relerr(L1.out, L0.out, nx), 1e-6);
    // pkda from pgdn (with pgdn's own A_log restored to a random value)
    test_seed(803);
    for (int hh = 0; hh < H; hh++) { L1.p.pdn.A_log[hh] = (float)log(1.0 + 15.0 * test_unif()); }
    for (int i = 0; i < C; i++) {
        for (int hh = 0; hh < H; hh++) { L1.p.pdn.in_proj_w[(size_t)(D + 3 * H + hh) * C + i] = 0.0f; }
    }
    memcpy(L2.p.pdn.in_proj_w, L1.p.pdn.in_proj_w, (size_t)P0 * C * sizeof(float));   // f1, g1 rows stay random
    test_layer_copy(&L2, &L1, "conv_w");
    test_layer_copy(&L2, &L1, "A_log");
    for (int hh = 0; hh < H; hh++) {
        for (int d = 0; d < dk; d++) { L2.p.pdn.dt_bias[hh * dk + d] = L1.p.pdn.dt_bias[hh]; }
    }
    memset(L2.p.pdn.f2_w, 0, test_layer_numel(&L2, "f2_w") * sizeof(float));
    memset(L2.p.pdn.g2_w, 0, test_layer_numel(&L2, "g2_w") * sizeof(float));
    for (size_t i = 0; i < test_layer_numel(&L2, "g2_b"); i++) { L2.p.pdn.g2_b[i] = 30.0f; }
    for (int i = 0; i < 5; i++) { test_layer_copy(&L2, &L1, shared[i]); }
    memcpy(L2.x, L1.x, nx * sizeof(float));
    memcpy(L2.R, L1.R, nx * sizeof(float));
    test_layer_grad(&L1);
    test_layer_grad(&L2);
    fails += test_check("pdn_pkda_equal_channels_equals_pgdn", test_relerr(L2.out, L1.out, nx), 1e-6);
    float dts[8];
    for (int hh = 0; hh < H; hh++) {
        double s = 0.0;
        for (int d = 0; d < dk; d++) { s += L2.gp.pdn.dt_bias[hh * dk + d]; }
        dts[hh] = (float)s;
    }
    fails += test_check("pdn_pkda_dg_channel_sum_equals_pgdn_dg (ddt_bias)", test_relerr(dts, L1.gp.pdn.dt_bias, H), 1e-5);
    fails += test_check("pdn_pkda_dA_log_equals_pgdn", test_relerr(L2.gp.pdn.A_log, L1.gp.pdn.A_log, H), 1e-5);
    fails += test_check("pdn_pkda_dx_equals_pgdn", test_relerr(L2.dx, L1.dx, nx), 1e-5);
    test_layer_free(&L0); test_layer_free(&L1); test_layer_free(&L2);
    return fails;
}

// 4. state carry. (a) core: [0,T1) then [T1,T) with S and A carried (random S0, A0) == one pass, T1 on and off
//    a checkpoint boundary; (b) layer: pdn_forward over [0,T1), its final S, A and the last W-1 pre-conv inputs
//    as a PDNState, then decode [T1,T) == pdn_forward over [0,T) (test_layer_state_carry).
static int pdnt_state_carry(int variant) {
    int fails = 0;
    char name[96];
    const int B = 2, T = 37, H = 2, dk = 8, dv = 6, D = 2 * H * dk + H * dv, CK = 8;
    const size_t BT = (size_t)B * T, nS = (size_t)B * H * dk * dv, nA = (size_t)B * H * dk;
    float* qkv = (float*)malloc(BT * D * sizeof(float));
    float* beta = (float*)malloc(BT * H * sizeof(float));
    float* gP = (float*)malloc(BT * H * sizeof(float));
    float* bP = (float*)malloc(BT * H * sizeof(float));
    float* g = (float*)malloc(BT * H * dk * sizeof(float));
    float* A = (float*)malloc(BT * H * dk * sizeof(float));
    float* m = (float*)malloc(BT * H * dk * sizeof(float));
    float* o1 = (float*)malloc(BT * H * dv * sizeof(float));
    float* o2 = (float*)malloc(BT * H * dv * sizeof(float));
    float* S1 = (float*)malloc(nS * sizeof(float));
    float* S2 = (float*)malloc(nS * sizeof(float));
    float* A1 = (float*)malloc(nA * sizeof(float));
    float* A2 = (float*)malloc(nA * sizeof(float));
    float* sl[6];
    for (int i = 0; i < 6; i++) { sl[i] = (float*)malloc(BT * D * sizeof(float)); }
    float cs[2];
    test_seed(900 + variant);
    pdnt_core_inputs(qkv, beta, g, gP, bP, cs, B, T, H, dk, dv, variant);
    float* S0 = (float*)malloc(nS * sizeof(float));
    float* A0 = (float*)malloc(nA * sizeof(float));
    for (size_t i = 0; i < nS; i++) { S0[i] = (float)(0.5 * test_normal()); }
    for (size_t i = 0; i < nA; i++) { A0[i] = (float)test_unif(); }
    const float qs = 1.0f / sqrtf((float)dk), lnx = logf(1.5f);
    memcpy(S1, S0, nS * sizeof(float)); memcpy(A1, A0, nA * sizeof(float));
    pdn_core_forward(o1, A, m, NULL, S1, A1, qkv, beta, g, gP, bP, cs, B, T, H, dk, dv, CK, qs, lnx, 1e-6f);
    const int splits[2] = {16, 21};
    for (int si = 0; si < 2; si++) {
        memcpy(S2, S0, nS * sizeof(float)); memcpy(A2, A0, nA * sizeof(float));
        int t0 = 0;
        for (int part = 0; part < 2; part++) {
            const int t1 = part == 0 ? splits[si] : T, Tn = t1 - t0;
            test_slice(sl[0], qkv, B, T, t0, t1, D);
            test_slice(sl[1], beta, B, T, t0, t1, H);
            test_slice(sl[2], g, B, T, t0, t1, H * dk);
            test_slice(sl[3], gP, B, T, t0, t1, H);
            test_slice(sl[4], bP, B, T, t0, t1, H);
            pdn_core_forward(sl[5], A, m, NULL, S2, A2, sl[0], sl[1], sl[2], sl[3], sl[4], cs, B, Tn, H, dk, dv, CK,
                             qs, lnx, 1e-6f);
            test_unslice(o2, sl[5], B, T, t0, t1, H * dv);
            t0 = t1;
        }
        double err = fmax(test_relerr(o2, o1, BT * H * dv), fmax(test_relerr(S2, S1, nS), test_relerr(A2, A1, nA)));
        snprintf(name, sizeof(name), "pdn_core_state_carry_%s_T1_%d", pdnt_vname[variant], splits[si]);
        fails += test_check(name, err, 1e-6);
    }
    // (b) layer, tolerance 1e-5: fp32 round-off of two evaluation orders (spec 5)
    TestLayer L;
    pdnt_layer(&L, variant, 8, 2, 950 + variant);
    for (int si = 0; si < 2; si++) { fails += test_layer_state_carry(&L, splits[si], 1e-5); }
    test_layer_free(&L);
    free(qkv); free(beta); free(gP); free(bP); free(g); free(A); free(m); free(o1); free(o2);
    free(S1); free(S2); free(A1); free(A2); free(S0); free(A0);
    for (int i = 0; i < 6; i++) { free(sl[i]); }
    return fails;
}

// 5. decode token by token == layer forward (1e-5, spec 5); 6. bounds 1/x <= m <= x and |k|^2/x <= k.k~ <= x|k|^2
//    in that forward
static int pdnt_decode_bounds(int variant, int chunk) {
    int fails = 0;
    char name[96];
    TestLayer L;
    pdnt_layer(&L, variant, chunk, 2, 1000 + variant);
    fails += test_layer_decode(&L, 1e-5);
    float* acts;
    MixerActs a;
    test_layer_loss(&L, &acts, &a);
    const PDNConfig* c = &L.s.pdn;
    const int H = c->H, dk = c->dk, D = pdn_D(c);
    double viol = 0.0, mmin = 1e30, mmax = 0.0;
    const double xx = c->x;
    for (size_t e = 0; e < (size_t)L.B * L.T * H; e++) {
        const float* m = a.pdn.m + e * dk;
        const float* k = a.pdn.qkv + (e / H) * D + H * dk + (e % H) * dk;
        double kk = 0.0, kkt = 0.0;
        for (int d = 0; d < dk; d++) {
            mmin = fmin(mmin, m[d]); mmax = fmax(mmax, m[d]);
            viol = fmax(viol, fmax(1.0 / xx - m[d], m[d] - xx));
            kk += (double)k[d] * k[d];
            kkt += (double)k[d] * k[d] * m[d];
        }
        viol = fmax(viol, fmax(kk / xx - kkt, kkt - xx * kk) - 1e-6);
    }
    snprintf(name, sizeof(name), "pdn_bounds_%s (m in [%.4f, %.4f]; violation)", pdnt_vname[variant], mmin, mmax);
    fails += test_check(name, fmax(viol, 0.0), 0.0);
    free(acts);
    test_layer_free(&L);
    return fails;
}

// 7, 8. layer backward vs finite differences, and its negative control (PDN_LAYER_TEST.fd)
static int pdnt_layer_fd(int variant) {
    TestLayer L;
    pdnt_layer(&L, variant, 8, 2, 1100 + variant);
    const int fails = test_layer_fd(&L, NULL);
    test_layer_free(&L);
    return fails;
}

// determinism: the layer backward with 1 thread == with the default thread count, bit for bit
static int pdnt_thread_invariance(int variant) {
    TestLayer L;
    pdnt_layer(&L, variant, 8, 3, 1200 + variant);
    const int fails = test_layer_thread_invariance(&L);
    test_layer_free(&L);
    return fails;
}

static int test_pdn_properties(void) {
    int fails = 0;
    fails += pdnt_golden();
    fails += pdnt_x1();
    fails += pdnt_variants();
    for (int v = 0; v < 3; v++) {
        fails += pdnt_state_carry(v);
        fails += pdnt_decode_bounds(v, 8);
        fails += pdnt_decode_bounds(v, 64);
        fails += pdnt_layer_fd(v);
        fails += pdnt_thread_invariance(v);
    }
    return fails;
}

// ----------------------------------------------------------------------------------------------------------
// gka property tests (spec/gka.md 9). Uses the test_ rng and check helpers and the layer harness above.
// Every check prints "PASS <name>: ..." or "FAIL <name>: ...". Errors are max-norm relative:
// max_i |a_i - b_i| / max_i |b_i|. fp32 tolerances as for gdn/pdn: 1e-5 on outputs, 1e-4 on gradients (fp32
// round-off here is ~1e-7..1e-6; the solve has condition number <= (1+a)/a = 51, which costs up to ~50x more).

// double CHEB of spec 3.1 (the same iteration as gka_cheb, in double, omega in double)
static void gkat_cheb_d(double* x, const double* Hm, const double* b, double f, int r, double a, int dk) {
    double om[r + 1], xp[dk], Ax[dk];
    gka_omegas(om, r, a);
    const double tau = 2.0 / (f * (1.0 + 2.0 * a)), lam = a * f;
    for (int i = 0; i < dk; i++) { xp[i] = 0.0; x[i] = tau * b[i]; }
    for (int it = 0; it < r; it++) {
        for (int i = 0; i < dk; i++) {
            double acc = 0.0;
            for (int j = 0; j < dk; j++) { acc += Hm[i * dk + j] * x[j]; }
            Ax[i] = acc;
        }
        for (int i = 0; i < dk; i++) {
            const double y = tau * om[it] * (Ax[i] + lam * x[i] - b[i]) + (om[it] - 1.0) * xp[i];
            xp[i] = x[i];
            x[i] = om[it] * x[i] - y;
        }
    }
}

// exact solve (Hm + lam I) x = b by Cholesky, in double
static void gkat_solve_d(double* x, const double* Hm, const double* b, double lam, int dk) {
    double Lc[dk * dk];
    for (int i = 0; i < dk; i++) {
        for (int j = 0; j <= i; j++) {
            double s = Hm[i * dk + j] + (i == j ? lam : 0.0);
            for (int m = 0; m < j; m++) { s -= Lc[i * dk + m] * Lc[j * dk + m]; }
            Lc[i * dk + j] = i == j ? sqrt(s) : s / Lc[j * dk + j];
        }
    }
    for (int i = 0; i < dk; i++) {
        double s = b[i];
        for (int m = 0; m < i; m++) { s -= Lc[i * dk + m] * x[m]; }
        x[i] = s / Lc[i * dk + i];
    }
    for (int i = dk - 1; i >= 0; i--) {
        double s = x[i];
        for (int m = i + 1; m < dk; m++) { s -= Lc[m * dk + i] * x[m]; }
        x[i] = s / Lc[i * dk + i];
    }
}

// double core of spec 3 on qkv-layout inputs (q_hat, scaled k, scaled v); exact = 1 replaces CHEB by the exact
// ridge solve. Hs, Us [B,H,...]: initial states (NULL: 0). o [B,T,H*dv] may be NULL; returns sum(o * R) (R may
// be NULL: then 0). xo [B,T,H*dk] (may be NULL) receives x_t.
static double gkat_core_ref(double* o, double* xo, const double* qkv, const double* alpha, const double* g,
                            const double* H0, const double* U0, const float* R, int B, int T, int H, int dk, int dv,
                            int iters, double a, int exact) {
    const int D = 2 * H * dk + H * dv;
    double* Hm = (double*)malloc((size_t)dk * dk * sizeof(double));
    double* Um = (double*)malloc((size_t)dk * dv * sizeof(double));
    double x[dk], qt[dk];
    const double s = 1.0 / sqrt((double)dk);
    double loss = 0.0;
    for (int b = 0; b < B; b++) {
        for (int hh = 0; hh < H; hh++) {
            const size_t bh = (size_t)b * H + hh;
            for (int i = 0; i < dk * dk; i++) { Hm[i] = H0 ? H0[bh * dk * dk + i] : 0.0; }
            for (int i = 0; i < dk * dv; i++) { Um[i] = U0 ? U0[bh * dk * dv + i] : 0.0; }
            for (int t = 0; t < T; t++) {
                const size_t r = (size_t)b * T + t, e = r * H + hh;
                const double* q = qkv + r * D + hh * dk;
                const double* k = qkv + r * D + H * dk + hh * dk;
                const double* v = qkv + r * D + 2 * H * dk + hh * dv;
                const double gam = exp(g[e]);
                double ff = 0.0;
                for (int i = 0; i < dk; i++) {
                    for (int j = 0; j < dk; j++) { Hm[i * dk + j] = gam * Hm[i * dk + j] + k[i] * k[j]; ff += Hm[i * dk + j] * Hm[i * dk + j]; }
                    for (int j = 0; j < dv; j++) { Um[i * dv + j] = gam * Um[i * dv + j] + k[i] * v[j]; }
                }
                const double f = sqrt(ff);
                if (exact) { gkat_solve_d(x, Hm, q, a * f, dk); } else { gkat_cheb_d(x, Hm, q, f, iters, a, dk); }
                if (xo) { for (int i = 0; i < dk; i++) { xo[e * dk + i] = x[i]; } }
                for (int i = 0; i < dk; i++) { qt[i] = q[i] + alpha[e] * (x[i] - q[i]); }
                for (int j = 0; j < dv; j++) {
                    double acc = 0.0;
                    for (int i = 0; i < dk; i++) { acc += Um[i * dv + j] * qt[i]; }
                    acc *= s;
                    if (o) { o[e * dv + j] = acc; }
                    if (R) { loss += acc * R[e * dv + j]; }
                }
            }
        }
    }
    free(Hm); free(Um);
    return loss;
}

// random core inputs: unit q_hat; k = (beta + 1e-6) unit, v = (beta + 1e-6) N(0,1), beta in (0,1) with a few
// tokens near 0 and 1; alpha in (0,1); g = -exp(U(-5,1)) (gamma from ~1 down to 0.07)
static void gkat_core_inputs(float* qkv, float* alpha, float* g, int B, int T, int H, int dk, int dv) {
    const int D = 2 * H * dk + H * dv;
    for (size_t r = 0; r < (size_t)B * T; r++) {
        float* row = qkv + r * D;
        for (int i = 0; i < D; i++) { row[i] = (float)test_normal(); }
        for (int hh = 0; hh < H; hh++) {
            float* q = row + hh * dk;
            float* k = row + H * dk + hh * dk;
            float* v = row + 2 * H * dk + hh * dv;
            const double beta = test_unif() < 0.1 ? 0.01 : test_unif();
            double nq = 0.0, nk = 0.0;
            for (int d = 0; d < dk; d++) { nq += (double)q[d] * q[d]; nk += (double)k[d] * k[d]; }
            for (int d = 0; d < dk; d++) { q[d] = (float)(q[d] / sqrt(nq)); k[d] = (float)((beta + 1e-6) * k[d] / sqrt(nk)); }
            for (int d = 0; d < dv; d++) { v[d] = (float)((beta + 1e-6) * v[d]); }
            alpha[r * H + hh] = (float)test_unif();
            g[r * H + hh] = (float)(-exp(-5.0 + 6.0 * test_unif()));
        }
    }
}

// 1. CHEB vs the exact ridge solve (spec 9.1) on the states H_t of a random sequence (T = 40, dk = 16, a = 0.02):
//    (a) double CHEB, r = 200: < 1e-10 (measured ~1e-14); (b) gka_cheb (fp32), r = 200: < 2e-5 (fp32 round-off
//    times kappa <= 51); (c) double CHEB, r = 30: < 1e-3 (spec 3.1: 2.5e-4); max over tokens of ||x - x*|| / ||x*||.
static int gkat_cheb_exact(void) {
    const int T = 40, dk = 16;
    const double a = 0.02;
    double Hd[dk * dk], q[dk], xe[dk], xc[dk], x30[dk];
    float Hf[dk * dk], qf[dk], xf[dk], xp[dk], Ax[dk];
    double om[201];
    gka_omegas(om, 200, a);
    for (int i = 0; i < dk * dk; i++) { Hd[i] = 0.0; }
    test_seed(3100);
    double e200 = 0.0, e32 = 0.0, e30 = 0.0;
    for (int t = 0; t < T; t++) {
        double k[dk], nk = 0.0, nq = 0.0;
        for (int i = 0; i < dk; i++) { k[i] = test_normal(); q[i] = test_normal(); nk += k[i] * k[i]; nq += q[i] * q[i]; }
        const double bs = 0.05 + test_unif(), gam = exp(-exp(-4.0 + 4.0 * test_unif()));
        for (int i = 0; i < dk; i++) { k[i] *= bs / sqrt(nk); q[i] /= sqrt(nq); }
        double ff = 0.0;
        for (int i = 0; i < dk; i++) {
            for (int j = 0; j < dk; j++) { Hd[i * dk + j] = gam * Hd[i * dk + j] + k[i] * k[j]; }
        }
        // the fp32 solver sees the fp32-rounded H (symmetric) and q; compare it with the exact solve of those
        for (int i = 0; i < dk * dk; i++) { Hf[i] = (float)Hd[i]; }
        for (int i = 0; i < dk; i++) { qf[i] = (float)q[i]; }
        double Hr[dk * dk], qr[dk];
        for (int i = 0; i < dk * dk; i++) { Hr[i] = Hf[i]; ff += Hr[i] * Hr[i]; }
        for (int i = 0; i < dk; i++) { qr[i] = qf[i]; }
        const double f = sqrt(ff);
        gkat_solve_d(xe, Hr, qr, a * f, dk);
        gkat_cheb_d(xc, Hr, qr, f, 200, a, dk);
        gkat_cheb_d(x30, Hr, qr, f, 30, a, dk);
        gka_cheb(xf, xp, Ax, Hf, qf, (float)f, om, 200, (float)a, dk);
        double n = 0.0, d1 = 0.0, d2 = 0.0, d3 = 0.0;
        for (int i = 0; i < dk; i++) {
            n += xe[i] * xe[i];
            d1 += (xc[i] - xe[i]) * (xc[i] - xe[i]);
            d2 += ((double)xf[i] - xe[i]) * ((double)xf[i] - xe[i]);
            d3 += (x30[i] - xe[i]) * (x30[i] - xe[i]);
        }
        e200 = fmax(e200, sqrt(d1 / n)); e32 = fmax(e32, sqrt(d2 / n)); e30 = fmax(e30, sqrt(d3 / n));
    }
    int fails = 0;
    fails += test_check("gka_cheb_r200_double_vs_exact_solve", e200, 1e-10);
    fails += test_check("gka_cheb_r200_fp32_vs_exact_solve", e32, 2e-5);
    fails += test_check("gka_cheb_r30_double_vs_exact_solve", e30, 1e-3);
    // spec 9.2: omega_1 = 1/(1 - rho^2/2), strictly decreasing, > omega*, 4 - rho^2 omega in [2, 4]
    const double rho = 1.0 / (1.0 + 2.0 * a), ws = 2.0 * (1.0 - sqrt(1.0 - rho * rho)) / (rho * rho);
    double viol = fabs(om[0] - 1.0 / (1.0 - rho * rho / 2.0));
    for (int i = 0; i < 200; i++) {
        if (i > 0 && !(om[i] < om[i - 1]) && om[i - 1] - ws > 1e-15) { viol = fmax(viol, om[i] - om[i - 1]); }
        viol = fmax(viol, ws - om[i] - 1e-15);
        const double c = 4.0 - rho * rho * om[i];
        viol = fmax(viol, fmax(2.0 - c, c - 4.0));
    }
    fails += test_check("gka_omega_schedule (violation)", fmax(viol, 0.0), 1e-15);
    return fails;
}

// 2. implicit gradient (spec 3.2) == gradient of the exact ridge layer when the solver has converged (r = 200):
//    gka_core_backward (fp32: adjoint CHEB for dq_hat, dH = -z x^T - (w/2) H with the bp_lambda term) vs central
//    finite differences (h = 1e-6) of gkat_core_ref with exact = 1 (Cholesky), loss sum(o * R), with random
//    carried initial states H0, U0 (their gradients dH0, dU0 are checked too). B = 1, T = 13, H = 2, dk = 6,
//    dv = 5, checkpoint 4. FD truncation+round-off ~1e-9; tolerance 1e-4 (fp32 backward through kappa <= 51).
static int gkat_implicit_grad(void) {
    const int B = 1, T = 13, H = 2, dk = 6, dv = 5, CK = 4, D = 2 * H * dk + H * dv, NT = gka_NT(T, CK), r = 200;
    const float a = 0.02f;
    const size_t BTn = (size_t)B * T, nH = (size_t)B * H * dk * dk, nU = (size_t)B * H * dk * dv;
    float* qkv = (float*)malloc(BTn * D * sizeof(float));
    float* al = (float*)malloc(BTn * H * sizeof(float));
    float* g = (float*)malloc(BTn * H * sizeof(float));
    float* o = (float*)malloc(BTn * H * dv * sizeof(float));
    float* x = (float*)malloc(BTn * H * dk * sizeof(float));
    float* f = (float*)malloc(BTn * H * sizeof(float));
    float* R = (float*)malloc(BTn * H * dv * sizeof(float));
    float* Hck = (float*)malloc(NT * nH * sizeof(float));
    float* Uck = (float*)malloc(NT * nU * sizeof(float));
    float* Hs = (float*)malloc(nH * sizeof(float));
    float* Us = (float*)malloc(nU * sizeof(float));
    float* dqkv = (float*)malloc(BTn * D * sizeof(float));
    float* dal = (float*)malloc(BTn * H * sizeof(float));
    float* dg = (float*)malloc(BTn * H * sizeof(float));
    float* dH0 = (float*)malloc(nH * sizeof(float));
    float* dU0 = (float*)malloc(nU * sizeof(float));
    float* scr = (float*)malloc((size_t)max_threads() * gka_core_bwd_floats(CK, dk, dv) * sizeof(float));
    test_seed(3200);
    gkat_core_inputs(qkv, al, g, B, T, H, dk, dv);
    for (size_t i = 0; i < BTn * H * dv; i++) { R[i] = (float)test_normal(); }
    // random carried states: H0 = sum of a few k k^T (symmetric PSD), U0 ~ N(0, 0.3)
    for (size_t i = 0; i < nH; i++) { Hs[i] = 0.0f; }
    for (int bh = 0; bh < B * H; bh++) {
        for (int m = 0; m < 3; m++) {
            float kk[dk];
            for (int d = 0; d < dk; d++) { kk[d] = (float)(0.4 * test_normal()); }
            for (int i = 0; i < dk; i++) { for (int j = 0; j < dk; j++) { Hs[(size_t)bh * dk * dk + i * dk + j] += kk[i] * kk[j]; } }
        }
    }
    for (size_t i = 0; i < nU; i++) { Us[i] = (float)(0.3 * test_normal()); }
    double* H0d = (double*)malloc(nH * sizeof(double));
    double* U0d = (double*)malloc(nU * sizeof(double));
    for (size_t i = 0; i < nH; i++) { H0d[i] = Hs[i]; }
    for (size_t i = 0; i < nU; i++) { U0d[i] = Us[i]; }
    gka_core_forward(o, x, f, Hck, Uck, Hs, Us, qkv, al, g, B, T, H, dk, dv, CK, r, a);
    gka_core_backward(dqkv, dal, dg, dH0, dU0, R, NULL, NULL, Hck, Uck, qkv, al, g, x, f, B, T, H, dk, dv, CK, r, a,
                      scr, max_threads());
    double* qd = (double*)malloc(BTn * D * sizeof(double));
    double* ad = (double*)malloc(BTn * H * sizeof(double));
    double* gd = (double*)malloc(BTn * H * sizeof(double));
    for (size_t i = 0; i < BTn * D; i++) { qd[i] = qkv[i]; }
    for (size_t i = 0; i < BTn * H; i++) { ad[i] = al[i]; gd[i] = g[i]; }
    // FD of every input: q_hat, k, v (qkv), alpha, g, H0 (symmetric perturbation of (i,j) and (j,i) counts the
    // symmetric part: compare with dH0_ij + dH0_ji off the diagonal), U0
    const double h = 1e-6;
    double eq = 0, nq = 0, ek = 0, nk = 0, ev = 0, nv = 0, ea = 0, na = 0, eg = 0, ng = 0, eH = 0, nHm = 0, eU = 0, nUm = 0;
    for (size_t i = 0; i < BTn * D; i++) {
        const double v0 = qd[i];
        qd[i] = v0 + h; const double lp = gkat_core_ref(NULL, NULL, qd, ad, gd, H0d, U0d, R, B, T, H, dk, dv, 0, a, 1);
        qd[i] = v0 - h; const double lm = gkat_core_ref(NULL, NULL, qd, ad, gd, H0d, U0d, R, B, T, H, dk, dv, 0, a, 1);
        qd[i] = v0;
        const double fd = (lp - lm) / (2 * h), err = fabs(fd - dqkv[i]);
        const int ch = (int)(i % D);
        if (ch < H * dk) { eq = fmax(eq, err); nq = fmax(nq, fabs(fd)); }
        else if (ch < 2 * H * dk) { ek = fmax(ek, err); nk = fmax(nk, fabs(fd)); }
        else { ev = fmax(ev, err); nv = fmax(nv, fabs(fd)); }
    }
    for (size_t i = 0; i < BTn * H; i++) {
        for (int which = 0; which < 2; which++) {
            double* p = which ? gd : ad;
            const double v0 = p[i];
            p[i] = v0 + h; const double lp = gkat_core_ref(NULL, NULL, qd, ad, gd, H0d, U0d, R, B, T, H, dk, dv, 0, a, 1);
            p[i] = v0 - h; const double lm = gkat_core_ref(NULL, NULL, qd, ad, gd, H0d, U0d, R, B, T, H, dk, dv, 0, a, 1);
            p[i] = v0;
            const double fd = (lp - lm) / (2 * h);
            if (which) { eg = fmax(eg, fabs(fd - dg[i])); ng = fmax(ng, fabs(fd)); }
            else { ea = fmax(ea, fabs(fd - dal[i])); na = fmax(na, fabs(fd)); }
        }
    }
    for (int bh = 0; bh < B * H; bh++) {
        for (int i = 0; i < dk; i++) {
            for (int j = i; j < dk; j++) {
                const size_t e1 = (size_t)bh * dk * dk + i * dk + j, e2 = (size_t)bh * dk * dk + j * dk + i;
                const double v0 = H0d[e1];
                H0d[e1] = v0 + h; H0d[e2] = v0 + h;
                const double lp = gkat_core_ref(NULL, NULL, qd, ad, gd, H0d, U0d, R, B, T, H, dk, dv, 0, a, 1);
                H0d[e1] = v0 - h; H0d[e2] = v0 - h;
                const double lm = gkat_core_ref(NULL, NULL, qd, ad, gd, H0d, U0d, R, B, T, H, dk, dv, 0, a, 1);
                H0d[e1] = v0; H0d[e2] = v0;
                const double fd = (lp - lm) / (2 * h), an = i == j ? dH0[e1] : (double)dH0[e1] + dH0[e2];
                eH = fmax(eH, fabs(fd - an)); nHm = fmax(nHm, fabs(fd));
            }
        }
    }
    for (size_t i = 0; i < nU; i++) {
        const double v0 = U0d[i];
        U0d[i] = v0 + h; const double lp = gkat_core_ref(NULL, NULL, qd, ad, gd, H0d, U0d, R, B, T, H, dk, dv, 0, a, 1);
        U0d[i] = v0 - h; const double lm = gkat_core_ref(NULL, NULL, qd, ad, gd, H0d, U0d, R, B, T, H, dk, dv, 0, a, 1);
        U0d[i] = v0;
        const double fd = (lp - lm) / (2 * h);
        eU = fmax(eU, fabs(fd - dU0[i])); nUm = fmax(nUm, fabs(fd));
    }
    int fails = 0;
    fails += test_check("gka_implicit_grad_vs_exact_solve_fd_dq_hat", eq / nq, 1e-4);
    fails += test_check("gka_implicit_grad_vs_exact_solve_fd_dk", ek / nk, 1e-4);
    fails += test_check("gka_implicit_grad_vs_exact_solve_fd_dv", ev / nv, 1e-4);
    fails += test_check("gka_implicit_grad_vs_exact_solve_fd_dalpha", ea / na, 1e-4);
    fails += test_check("gka_implicit_grad_vs_exact_solve_fd_dg", eg / ng, 1e-4);
    fails += test_check("gka_implicit_grad_vs_exact_solve_fd_dH0_sym", eH / nHm, 1e-4);
    fails += test_check("gka_implicit_grad_vs_exact_solve_fd_dU0", eU / nUm, 1e-4);
    free(qkv); free(al); free(g); free(o); free(x); free(f); free(R); free(Hck); free(Uck); free(Hs); free(Us);
    free(dqkv); free(dal); free(dg); free(dH0); free(dU0); free(scr); free(H0d); free(U0d); free(qd); free(ad); free(gd);
    return fails;
}

// 3. alpha = 0: o_t = s U_t^T q_hat_t exactly (simple gated linear attention, spec 9.9), vs a double GLA;
//    tolerance 1e-5 (fp32 round-off). Checks also that the solver output does not leak into o.
static int gkat_alpha0(void) {
    const int B = 2, T = 29, H = 2, dk = 8, dv = 12, D = 2 * H * dk + H * dv;
    const size_t BTn = (size_t)B * T;
    float* qkv = (float*)malloc(BTn * D * sizeof(float));
    float* al = (float*)malloc(BTn * H * sizeof(float));
    float* g = (float*)malloc(BTn * H * sizeof(float));
    float* o = (float*)malloc(BTn * H * dv * sizeof(float));
    float* x = (float*)malloc(BTn * H * dk * sizeof(float));
    float* f = (float*)malloc(BTn * H * sizeof(float));
    float* Hs = (float*)calloc((size_t)B * H * dk * dk, sizeof(float));
    float* Us = (float*)calloc((size_t)B * H * dk * dv, sizeof(float));
    double* od = (double*)malloc(BTn * H * dv * sizeof(double));
    test_seed(3300);
    gkat_core_inputs(qkv, al, g, B, T, H, dk, dv);
    for (size_t i = 0; i < BTn * H; i++) { al[i] = 0.0f; }
    gka_core_forward(o, x, f, NULL, NULL, Hs, Us, qkv, al, g, B, T, H, dk, dv, 8, 30, 0.02f);
    // GLA: U_t = gamma U + k v^T, o = s U^T q
    const double s = 1.0 / sqrt((double)dk);
    for (int b = 0; b < B; b++) {
        for (int hh = 0; hh < H; hh++) {
            double U[dk * dv];
            for (int i = 0; i < dk * dv; i++) { U[i] = 0.0; }
            for (int t = 0; t < T; t++) {
                const size_t r = (size_t)b * T + t, e = r * H + hh;
                const float* q = qkv + r * D + hh * dk;
                const float* k = qkv + r * D + H * dk + hh * dk;
                const float* v = qkv + r * D + 2 * H * dk + hh * dv;
                const double gam = exp((double)g[e]);
                for (int i = 0; i < dk; i++) { for (int j = 0; j < dv; j++) { U[i * dv + j] = gam * U[i * dv + j] + (double)k[i] * v[j]; } }
                for (int j = 0; j < dv; j++) {
                    double acc = 0.0;
                    for (int i = 0; i < dk; i++) { acc += U[i * dv + j] * q[i]; }
                    od[e * dv + j] = s * acc;
                }
            }
        }
    }
    const int fails = test_check("gka_alpha0_equals_gated_linear_attention", test_relerr_fd(o, od, BTn * H * dv), 1e-5);
    free(qkv); free(al); free(g); free(o); free(x); free(f); free(Hs); free(Us); free(od);
    return fails;
}

// ----------------------------------------------------------------------------
// layer-level tests: a small random layer on the harness above (C = 24, H = 2, dk = 8, dv = 12: dk != dv; T = 37 is
// not a multiple of the checkpoint interval)

// random weights with O(1) activations; A_log, dt_bias as in FORMATS.md; biases and onorm_w away from their init
static void gkat_draw(TestLayer* L) {
    GKAParams* p = &L->p.gka;
    const GKAConfig* c = &L->s.gka;
    const int H = c->H, HV = c->H * c->dv, C = c->C;
    test_draw_uniform(p->in_proj_w, test_layer_numel(L, "in_proj_w"), C);
    for (size_t i = 0; i < test_layer_numel(L, "conv_w"); i++) { p->conv_w[i] = (float)(test_unif() - 0.5); }
    for (int hh = 0; hh < H; hh++) {
        p->b_bias[hh] = (float)(0.5 * test_normal());
        p->alpha_bias[hh] = (float)(0.5 * test_normal());
        p->A_log[hh] = (float)log(0.1 + 15.9 * test_unif());
        p->dt_bias[hh] = (float)test_draw_dt_bias();
    }
    for (int i = 0; i < c->dv; i++) { p->onorm_w[i] = (float)(1.0 + 0.2 * test_normal()); }
    test_draw_uniform(p->out_proj_w, test_layer_numel(L, "out_proj_w"), HV);
}

static double gkat_sigmoid(double u) { return 1.0 / (1.0 + exp(-u)); }

// independent double-precision layer forward (spec 2.3, core via gkat_core_ref with CHEB at the layer's iters).
// prm: the 8 tensors in GKAParams order; out [B,T,C] may be NULL; returns sum(out * R)
static double gkat_ref_forward(const TestLayer* L, const double* prm, const double* x, double* out) {
    const GKAConfig* c = &L->s.gka;
    const int B = L->B, T = L->T, C = c->C, H = c->H, dk = c->dk, dv = c->dv, W = c->W;
    const int Hkv = c->Hkv, G = H / Hkv, HV = H * dv, D = gka_D(c), DE = 2 * H * dk + H * dv, P = gka_P(c);
    const double* Win = test_layer_param64(L, prm, "in_proj_w");
    const double* Wc = test_layer_param64(L, prm, "conv_w");
    const double* bb = test_layer_param64(L, prm, "b_bias");
    const double* ab = test_layer_param64(L, prm, "alpha_bias");
    const double* Al = test_layer_param64(L, prm, "A_log");
    const double* dtb = test_layer_param64(L, prm, "dt_bias");
    const double* wo = test_layer_param64(L, prm, "onorm_w");
    const double* Wout = test_layer_param64(L, prm, "out_proj_w");
    const size_t BTn = (size_t)B * T;
    double* proj = (double*)malloc(BTn * P * sizeof(double));
    double* qkv = (double*)calloc(BTn * DE, sizeof(double));   // expanded to H heads (gkat_core_ref layout)
    double* f = (double*)malloc((size_t)D * sizeof(double));     // conv + SiLU output of a token, un-expanded
    double* al = (double*)calloc(BTn * H, sizeof(double));
    double* g = (double*)calloc(BTn * H, sizeof(double));
    double* o = (double*)malloc(BTn * HV * sizeof(double));
    double y[HV];
    for (size_t r = 0; r < BTn; r++) {
        for (int i = 0; i < P; i++) {
            double acc = 0.0;
            for (int j = 0; j < C; j++) { acc += Win[(size_t)i * C + j] * x[r * C + j]; }
            proj[r * P + i] = acc;
        }
    }
    for (size_t r = 0; r < BTn; r++) {
        const int t = (int)(r % T);
        const double* pr = proj + r * P;
        double* row = qkv + r * DE;
        for (int ch = 0; ch < D; ch++) {
            double acc = 0.0;
            for (int j = 0; j < W; j++) {
                const int s = t - (W - 1) + j;
                if (s >= 0) { acc += Wc[ch * W + j] * proj[(r - (t - s)) * P + ch]; }
            }
            f[ch] = acc * gkat_sigmoid(acc);
        }
        for (int hh = 0; hh < H; hh++) {   // GQA: expanded head hh reads key/value head hh / G
            double* q = row + hh * dk;
            double* k = row + H * dk + hh * dk;
            double* v = row + 2 * H * dk + hh * dv;
            for (int d = 0; d < dk; d++) { q[d] = f[hh * dk + d]; k[d] = f[H * dk + (hh / G) * dk + d]; }
            for (int d = 0; d < dv; d++) { v[d] = f[H * dk + Hkv * dk + (hh / G) * dv + d]; }
            double nq = 0.0, nk = 0.0;
            for (int d = 0; d < dk; d++) { nq += q[d] * q[d]; nk += k[d] * k[d]; }
            nq = sqrt(nq) + 1e-6; nk = sqrt(nk) + 1e-6;
            const double beta = gkat_sigmoid(pr[D + HV + H + hh] + bb[hh]) + 1e-6;
            for (int d = 0; d < dk; d++) { q[d] /= nq; k[d] = beta * k[d] / nk; }
            for (int d = 0; d < dv; d++) { v[d] *= beta; }
            al[r * H + hh] = gkat_sigmoid(pr[D + HV + 2 * H + hh] + ab[hh]);
            const double u = pr[D + HV + hh] + dtb[hh];
            g[r * H + hh] = -exp(Al[hh]) * (u > 20.0 ? u : log1p(exp(u)));
        }
    }
    gkat_core_ref(o, NULL, qkv, al, g, NULL, NULL, NULL, B, T, H, dk, dv, c->iters, c->ridge, 0);
    double loss = 0.0;
    for (size_t r = 0; r < BTn; r++) {
        for (int hh = 0; hh < H; hh++) {
            const double* oh = o + r * HV + hh * dv;
            double ms = 0.0;
            for (int j = 0; j < dv; j++) { ms += oh[j] * oh[j]; }
            const double rs = 1.0 / sqrt(ms / dv + (double)c->onorm_eps);
            for (int j = 0; j < dv; j++) {
                const double z = proj[r * P + D + hh * dv + j];
                y[hh * dv + j] = oh[j] * rs * wo[j] * z * gkat_sigmoid(z);
            }
        }
        for (int i = 0; i < C; i++) {
            double acc = 0.0;
            for (int j = 0; j < HV; j++) { acc += Wout[(size_t)i * HV + j] * y[j]; }
            if (out) { out[r * C + i] = acc; }
            loss += acc * L->R[r * C + i];
        }
    }
    free(proj); free(qkv); free(f); free(al); free(g); free(o);
    return loss;
}

// the decode state after a forward over [0, T): the conv window, the final H and U of sequence b
static void gkat_state_from_acts(MixerState* st, const MixerActs* a, const TestLayer* L, int b) {
    const GKAConfig* c = &L->s.gka;
    const int H = c->H, dk = c->dk, dv = c->dv;
    test_conv_window(st->gka.conv, a->gka.proj, b, L->T, gka_P(c), gka_D(c), c->W);
    memcpy(st->gka.H, a->gka.Hf + (size_t)b * H * dk * dk, (size_t)H * dk * dk * sizeof(float));
    memcpy(st->gka.U, a->gka.Uf + (size_t)b * H * dk * dv, (size_t)H * dk * dv * sizeof(float));
}

static const MixerLayerTest GKA_LAYER_TEST = {
    gkat_draw, gkat_ref_forward,
    // 6. (gkat_layer_fd says why at r = 200) the 4-point differences of the float64 forward, h = 1e-4 (truncation
    //    ~h^4, round-off ~1e-16 |L|/h: exact to ~1e-9), 5 samples of every tensor (all if fewer), 8 of x, tolerance
    //    1e-4 (spec 5); the fp32 forward vs the float64 one at 5e-5 (measured up to 9e-6; gkat_layer_fd's r = 30
    //    reason). 7. negative control: an in_proj_w gradient entry.
    {.per_tensor = 5, .x_samples = 8, .points = 4, .h = 1e-4, .fwd_tol = 5e-5, .grad_tol = spec5_grad_tol,
     .control = "in_proj_w"},
    gkat_state_from_acts,
};

// the small layer of the tests: C = 24, H heads, Hkv key/value heads (GQA when Hkv < H), dk = 8, dv = 12, W = 4,
// a = 0.02; T = 37. The checks' names carry "_gqa_H<H>_Hkv<Hkv>" with GQA, after `prefix`.
static void gkat_layer(TestLayer* L, const char* prefix, int iters, int chunk, int H, int Hkv, int B, uint64_t seed) {
    Config c = {.num_layers = 1, .channels = 24, .lin_heads = H, .lin_dk = 8, .lin_dv = 12, .conv_size = 4,
                .gka_iters = iters, .gka_ridge = 0.02f, .gka_onorm_eps = 1e-6f, .gka_kv_heads = Hkv,
                .mixer = {MIXER_GKA}};
    char tag[48];
    if (Hkv == H) { snprintf(tag, sizeof(tag), "%s", prefix); }
    else { snprintf(tag, sizeof(tag), "%s_gqa_H%d_Hkv%d", prefix, H, Hkv); }
    test_layer_init(L, &GKA_LAYER_TEST, tag, &c, chunk, B, 37, seed);
}

// 4. state carry. (a) core: [0,T1) then [T1,T) with H, U carried from random H0, U0 == one pass (o, final H, U),
//    T1 on and off a checkpoint boundary: the same operations in the same order, so exact (tol 0 is met; 1e-6 is
//    stated). (b) layer: gka_forward over [0,T1), its final H, U and the last W-1 pre-conv inputs as a GKAState,
//    then decode [T1,T) == gka_forward over [0,T) (test_layer_state_carry, tol 1e-5: fp32 round-off of two
//    evaluation orders).
static int gkat_state_carry(void) {
    int fails = 0;
    char name[96];
    const int B = 2, T = 37, H = 2, dk = 8, dv = 12, D = 2 * H * dk + H * dv, CK = 8, r = 30;
    const size_t BTn = (size_t)B * T, nH = (size_t)B * H * dk * dk, nU = (size_t)B * H * dk * dv;
    float* qkv = (float*)malloc(BTn * D * sizeof(float));
    float* al = (float*)malloc(BTn * H * sizeof(float));
    float* g = (float*)malloc(BTn * H * sizeof(float));
    float* x = (float*)malloc(BTn * H * dk * sizeof(float));
    float* f = (float*)malloc(BTn * H * sizeof(float));
    float* o1 = (float*)malloc(BTn * H * dv * sizeof(float));
    float* o2 = (float*)malloc(BTn * H * dv * sizeof(float));
    float *H0 = (float*)malloc(nH * sizeof(float)), *U0 = (float*)malloc(nU * sizeof(float));
    float *H1 = (float*)malloc(nH * sizeof(float)), *U1 = (float*)malloc(nU * sizeof(float));
    float *H2 = (float*)malloc(nH * sizeof(float)), *U2 = (float*)malloc(nU * sizeof(float));
    float* sl[4];
    for (int i = 0; i < 4; i++) { sl[i] = (float*)malloc(BTn * D * sizeof(float)); }
    test_seed(3400);
    gkat_core_inputs(qkv, al, g, B, T, H, dk, dv);
    for (size_t i = 0; i < nH; i++) { H0[i] = 0.0f; }
    for (int bh = 0; bh < B * H; bh++) {
        float kk[dk];
        for (int d = 0; d < dk; d++) { kk[d] = (float)(0.5 * test_normal()); }
        for (int i = 0; i < dk; i++) { for (int j = 0; j < dk; j++) { H0[(size_t)bh * dk * dk + i * dk + j] = kk[i] * kk[j]; } }
    }
    for (size_t i = 0; i < nU; i++) { U0[i] = (float)(0.5 * test_normal()); }
    memcpy(H1, H0, nH * sizeof(float)); memcpy(U1, U0, nU * sizeof(float));
    gka_core_forward(o1, x, f, NULL, NULL, H1, U1, qkv, al, g, B, T, H, dk, dv, CK, r, 0.02f);
    const int splits[2] = {16, 21};
    for (int si = 0; si < 2; si++) {
        memcpy(H2, H0, nH * sizeof(float)); memcpy(U2, U0, nU * sizeof(float));
        int t0 = 0;
        for (int part = 0; part < 2; part++) {
            const int t1 = part == 0 ? splits[si] : T, Tn = t1 - t0;
            test_slice(sl[0], qkv, B, T, t0, t1, D);
            test_slice(sl[1], al, B, T, t0, t1, H);
            test_slice(sl[2], g, B, T, t0, t1, H);
            gka_core_forward(sl[3], x, f, NULL, NULL, H2, U2, sl[0], sl[1], sl[2], B, Tn, H, dk, dv, CK, r, 0.02f);
            test_unslice(o2, sl[3], B, T, t0, t1, H * dv);
            t0 = t1;
        }
        const double err = fmax(test_relerr(o2, o1, BTn * H * dv), fmax(test_relerr(H2, H1, nH), test_relerr(U2, U1, nU)));
        snprintf(name, sizeof(name), "gka_core_state_carry_T1_%d", splits[si]);
        fails += test_check(name, err, 1e-6);
    }
    // (b) layer
    TestLayer L;
    gkat_layer(&L, "gka", 30, 8, 2, 2, 2, 3450);
    for (int si = 0; si < 2; si++) { fails += test_layer_state_carry(&L, splits[si], 1e-5); }
    test_layer_free(&L);
    free(qkv); free(al); free(g); free(x); free(f); free(o1); free(o2);
    free(H0); free(U0); free(H1); free(U1); free(H2); free(U2);
    for (int i = 0; i < 4; i++) { free(sl[i]); }
    return fails;
}

// 5. decode token by token (gka_decode_step) == gka_forward over the same sequences; also with GQA. Tolerance 5e-5,
//    not gdn's 1e-5: both sides are fp32, and the readout U^T x amplifies round-off (x reaches ~1/(a f) on early,
//    small-beta tokens and U^T x cancels); measured 4e-6 to 2e-5 across seeds and head counts.
static int gkat_decode(int chunk, int H, int Hkv) {
    TestLayer L;
    gkat_layer(&L, "gka", 30, chunk, H, Hkv, 2, 3500);
    const int fails = test_layer_decode(&L, 5e-5);
    test_layer_free(&L);
    return fails;
}

// 6. layer backward (gka_backward) vs central finite differences of the independent double forward
//    gkat_ref_forward (GKA_LAYER_TEST.fd). The C layer implements the implicit gradient, which equals the gradient
//    of the layer it computes only when CHEB has converged (spec 3.2: at r = 30 the dH parts differ by ~1e-3), so
//    this check runs at r = 200 (solver converged to ~1e-14, implicit == exact gradient); the r = 30 implicit rule
//    itself is checked against a PyTorch float64 implementation of it (gka_torch_check.py). Tolerance 1e-4
//    max-norm relative per tensor (as gdn/pdn). Also the fp32 forward vs the double forward at r = 200 and r = 30,
//    both 5e-5 (measured up to 9e-6 and 1.2e-5: the unconverged r = 30 readout U^T x amplifies fp32 round-off
//    more -- x is up to ~1/(a f) on early, small-beta tokens and U^T x cancels -- while the solver itself agrees
//    with a double CHEB to ~6e-7, test 1). 7. negative control: one sampled in_proj_w gradient shifted by 1% of the
//    tensor's max must fail; and the r = 30 implicit gradient vs the r = 200 FD differs (reported, not a pass/fail).
//    With GQA (H = 4, Hkv = 2: the reference expands k, v itself) the same checks run with the names suffixed.
static int gkat_layer_fd(int H, int Hkv) {
    TestLayer L;
    gkat_layer(&L, "gka_r200", 200, 8, H, Hkv, 2, 3600);
    GradSamples g;
    int fails = test_layer_fd(&L, &g);
    // r = 30: forward vs the double forward with the same CHEB; the implicit gradient vs the r = 200 FD (info)
    const size_t nx = (size_t)L.B * L.T * L.cfg.channels;
    double* outd = (double*)malloc(nx * sizeof(double));
    char gqa[32] = "", name[96];
    if (Hkv != H) { snprintf(gqa, sizeof(gqa), "_gqa_H%d_Hkv%d", H, Hkv); }
    L.s.gka.iters = 30;
    test_layer_grad(&L);
    gkat_ref_forward(&L, g.pd, g.xd, outd);
    snprintf(name, sizeof(name), "gka_r30%s_layer_forward_vs_ref64", gqa);
    fails += test_check(name, test_relerr_fd(L.out, outd, nx), 5e-5);
    double num = 0.0, den = 0.0;
    for (int i = 0; i < g.ns; i++) {
        const double ai = g.tensor[i] == L.nt ? L.dx[g.off[i]] : L.grad[g.off[i]];
        num = fmax(num, fabs(ai - g.f[i])); den = fmax(den, fabs(g.f[i]));
    }
    printf("INFO gka_layer_grad_r30_implicit_vs_fd64_r200%s: max rel diff %.3e (solver truncation, expected ~1e-4..1e-3)\n",
           gqa, num / den);
    free(outd);
    grad_samples_free(&g);
    test_layer_free(&L);
    return fails;
}

// determinism: the layer backward with 1 thread == with the default thread count, bit for bit
static int gkat_thread_invariance(int H, int Hkv) {
    TestLayer L;
    gkat_layer(&L, "gka", 30, 8, H, Hkv, 3, 3700);
    const int fails = test_layer_thread_invariance(&L);
    test_layer_free(&L);
    return fails;
}

// 8. GQA (spec 2.3 step 3, 2.4, 3.3): the layer with H = 4, Hkv = 2 == the plain layer (Hkv = 4) whose in_proj
//    k/v rows and conv k/v taps are the GQA ones repeated per expanded head (head e gets source head e / 2), all
//    other tensors equal: forward output (tol 1e-5), dx and every parameter gradient after summing the plain
//    layer's repeated k/v rows (in_proj_w, conv_w) back into their source head (tol 1e-4), max-norm relative.
static int gkat_gqa_equiv(void) {
    const int H = 4, Hkv = 2, G = H / Hkv, B = 2, T = 37;
    TestLayer Lg, Lf;
    gkat_layer(&Lg, "gka", 30, 8, H, Hkv, B, 3800);
    gkat_layer(&Lf, "gka", 30, 8, H, H, B, 3801);   // shapes only: every tensor is overwritten below
    const GKAConfig *cg = &Lg.s.gka, *cf = &Lf.s.gka;
    const int C = cg->C, dk = cg->dk, dv = cg->dv, W = cg->W;
    const int Dg = gka_D(cg), Df = gka_D(cf), Pg = gka_P(cg);
    // map of the plain layer's in_proj rows / conv channels [0, Df) to the GQA layer's [0, Dg)
    int* src = (int*)malloc((size_t)Df * sizeof(int));
    for (int i = 0; i < H * dk; i++) { src[i] = i; }   // q
    for (int e = 0; e < H; e++) {
        for (int d = 0; d < dk; d++) { src[H * dk + e * dk + d] = H * dk + (e / G) * dk + d; }
        for (int d = 0; d < dv; d++) { src[2 * H * dk + e * dv + d] = H * dk + Hkv * dk + (e / G) * dv + d; }
    }
    for (int i = 0; i < Df; i++) {
        memcpy(Lf.p.gka.in_proj_w + (size_t)i * C, Lg.p.gka.in_proj_w + (size_t)src[i] * C, (size_t)C * sizeof(float));
        memcpy(Lf.p.gka.conv_w + (size_t)i * W, Lg.p.gka.conv_w + (size_t)src[i] * W, (size_t)W * sizeof(float));
    }
    // gate | a | b | alpha rows: the same
    memcpy(Lf.p.gka.in_proj_w + (size_t)Df * C, Lg.p.gka.in_proj_w + (size_t)Dg * C, (size_t)(Pg - Dg) * C * sizeof(float));
    // tensors 2..7 are contiguous after conv_w in both layers and have the same sizes
    memcpy(Lf.prm + Lf.off[2], Lg.prm + Lg.off[2], (Lg.nprm - Lg.off[2]) * sizeof(float));
    const size_t nx = (size_t)B * T * C;
    memcpy(Lf.x, Lg.x, nx * sizeof(float));
    memcpy(Lf.R, Lg.R, nx * sizeof(float));
    test_layer_grad(&Lg);
    test_layer_grad(&Lf);
    int fails = 0;
    char name[96];
    fails += test_check("gka_gqa_H4_Hkv2_equals_repeated_kv_plain_layer_out", test_relerr(Lg.out, Lf.out, nx), 1e-5);
    fails += test_check("gka_gqa_H4_Hkv2_equals_repeated_kv_plain_layer_dx", test_relerr(Lg.dx, Lf.dx, nx), 1e-4);
    // the plain layer's in_proj_w / conv_w gradients with the repeated rows summed back (in head order)
    float* rin = (float*)calloc(Lg.n[0], sizeof(float));
    float* rcv = (float*)calloc(Lg.n[1], sizeof(float));
    for (int i = 0; i < Df; i++) {
        for (int j = 0; j < C; j++) { rin[(size_t)src[i] * C + j] += Lf.gp.gka.in_proj_w[(size_t)i * C + j]; }
        for (int j = 0; j < W; j++) { rcv[(size_t)src[i] * W + j] += Lf.gp.gka.conv_w[(size_t)i * W + j]; }
    }
    memcpy(rin + (size_t)Dg * C, Lf.gp.gka.in_proj_w + (size_t)Df * C, (size_t)(Pg - Dg) * C * sizeof(float));
    for (int t = 0; t < Lg.nt; t++) {   // in_proj_w, conv_w summed back; the others as they are
        const float* ref = t == 0 ? rin : t == 1 ? rcv : Lf.grad + Lf.off[t];
        snprintf(name, sizeof(name), "gka_gqa_H4_Hkv2_equals_repeated_kv_plain_layer_grad_%s", Lg.name[t]);
        fails += test_check(name, test_relerr(Lg.grad + Lg.off[t], ref, Lg.n[t]), 1e-4);
    }
    free(rin); free(rcv); free(src);
    test_layer_free(&Lg); test_layer_free(&Lf);
    return fails;
}

int test_gka_properties(void) {
    int fails = 0;
    fails += gkat_cheb_exact();
    fails += gkat_implicit_grad();
    fails += gkat_alpha0();
    fails += gkat_state_carry();
    fails += gkat_decode(8, 2, 2);
    fails += gkat_decode(64, 2, 2);
    fails += gkat_layer_fd(2, 2);
    fails += gkat_thread_invariance(2, 2);
    fails += gkat_gqa_equiv();
    fails += gkat_decode(8, 4, 2);
    fails += gkat_decode(64, 4, 1);
    fails += gkat_layer_fd(4, 2);
    fails += gkat_thread_invariance(4, 2);
    printf("gka tests: %d failures\n", fails);
    return fails;
}

// ----------------------------------------------------------------------------
// kalman mixer properties (spec/kalman.md 9). Uses the test_ rng and check helpers and the layer harness above.
// Every check prints "PASS <name>: ..." or "FAIL <name>: ...". Errors are max-norm relative,
// max_i |a_i - b_i| / max_i |b_i|, unless stated.

// random filter inputs for B sequences of T tokens, Dk channels, N states: v ~ N(0,1), Lv = 1/(softplus(N(0,1))
// + 1e-4), unit k and q, abar in (amin, 0.99), pbar in (1e-3, 0.1) (pbar = 0 if zero_noise)
static void kalt_filter_inputs(float* v, float* Lv, float* k, float* q, float* abar, float* pbar, int B, int T,
                               int Dk, int N, double amin, int zero_noise) {
    for (int r = 0; r < B * T; r++) {
        for (int d = 0; d < Dk; d++) {
            v[(size_t)r * Dk + d] = (float)test_normal();
            Lv[(size_t)r * Dk + d] = (float)(1.0 / (log1p(exp(test_normal())) + 1e-4));
        }
        double sk = 0.0, sq = 0.0;
        for (int n = 0; n < N; n++) {
            k[(size_t)r * N + n] = (float)test_normal(); sk += (double)k[(size_t)r * N + n] * k[(size_t)r * N + n];
            q[(size_t)r * N + n] = (float)test_normal(); sq += (double)q[(size_t)r * N + n] * q[(size_t)r * N + n];
        }
        for (int n = 0; n < N; n++) { k[(size_t)r * N + n] /= (float)sqrt(sk); q[(size_t)r * N + n] /= (float)sqrt(sq); }
    }
    for (int i = 0; i < Dk * N; i++) {
        abar[i] = (float)(amin + (0.99 - amin) * test_unif());
        pbar[i] = zero_noise ? 0.0f : (float)exp(log(1e-3) + test_unif() * (log(0.1) - log(1e-3)));
    }
}

// the test's own double information-form filter (spec 2.3, with the floors of 2.5). Inputs as
// kalman_filter_forward (v row stride Dk); lam, eta [B,Dk,N] initial in, final out; lam_all, eta_all
// [B,T,Dk,N] (may be NULL) the posterior after every token; ys [B,T,Dk] (may be NULL). Returns
// sum(dys * ys) + sum(dlamT * lam_T) + sum(detaT * eta_T) for the weights given (NULL: 0).
static double kalt_filter64(double* ys, double* lam_all, double* eta_all, double* lam, double* eta, const double* v,
                            const double* Lv, const double* k, const double* q, const double* abar,
                            const double* pbar, const double* dys, const double* dlamT, const double* detaT,
                            int B, int T, int Dk, int N) {
    double loss = 0.0;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const size_t r = (size_t)b * T + t;
            for (int d = 0; d < Dk; d++) {
                double y = 0.0;
                for (int n = 0; n < N; n++) {
                    const size_t l = ((size_t)b * Dk + d) * N + n, dn = (size_t)d * N + n;
                    const double a2 = fmax(abar[dn] * abar[dn], 1e-12);
                    const double rho = 1.0 / fmax(a2 + pbar[dn] * lam[l], 1e-12);
                    const double kk = k[r * N + n];
                    eta[l] = abar[dn] * rho * eta[l] + v[r * Dk + d] * Lv[r * Dk + d] * kk;
                    lam[l] = lam[l] * rho + Lv[r * Dk + d] * kk * kk;
                    y += q[r * N + n] * eta[l] / fmax(lam[l], 1e-12);
                    if (lam_all) { lam_all[(r * Dk + d) * N + n] = lam[l]; eta_all[(r * Dk + d) * N + n] = eta[l]; }
                }
                if (ys) { ys[r * Dk + d] = y; }
                if (dys) { loss += dys[r * Dk + d] * y; }
            }
        }
    }
    for (size_t l = 0; l < (size_t)B * Dk * N; l++) {
        if (dlamT) { loss += dlamT[l] * lam[l]; }
        if (detaT) { loss += detaT[l] * eta[l]; }
    }
    return loss;
}

// Not inlined: with it inlined into kalt_zero_noise, gcc 12.2 -O3 -march=native (AVX-512) gave ~1e-6 errors in
// that test's fp64 check (2e-15 at -O2 -march=native, -O3 generic, -O1, or with this noinline); cause not found.
__attribute__((noinline)) static void kalt_to_double(double* dst, const float* src, size_t n) { for (size_t i = 0; i < n; i++) { dst[i] = src[i]; } }

// fp32 posteriors of kalman_filter_forward after every token, from checkpoints at interval 1 plus the final
// state: lamf, etaf [B,T,Dk,N]
static void kalt_filter32_all(double* lamf, double* etaf, const float* v, const float* Lv, const float* k,
                              const float* q, const float* abar, const float* pbar, const float* lam0,
                              const float* eta0, int B, int T, int Dk, int N) {
    float* ys = (float*)malloc((size_t)B * T * Dk * sizeof(float));
    float* ck = (float*)malloc((size_t)B * Dk * T * 2 * N * sizeof(float));
    float* lam = (float*)malloc((size_t)B * Dk * N * sizeof(float));
    float* eta = (float*)malloc((size_t)B * Dk * N * sizeof(float));
    memcpy(lam, lam0, (size_t)B * Dk * N * sizeof(float));
    memcpy(eta, eta0, (size_t)B * Dk * N * sizeof(float));
    kalman_filter_forward(ys, ck, lam, eta, v, Dk, Lv, k, q, abar, pbar, B, T, Dk, N, 1);
    for (int b = 0; b < B; b++) {
        for (int d = 0; d < Dk; d++) {
            for (int t = 0; t < T; t++) {   // the state after token t is the checkpoint of token t+1
                for (int n = 0; n < N; n++) {
                    const size_t o = (((size_t)b * T + t) * Dk + d) * N + n, bd = (size_t)b * Dk + d;
                    lamf[o] = t + 1 < T ? ck[(bd * T + t + 1) * 2 * N + n] : lam[bd * N + n];
                    etaf[o] = t + 1 < T ? ck[(bd * T + t + 1) * 2 * N + N + n] : eta[bd * N + n];
                }
            }
        }
    }
    free(ys); free(ck); free(lam); free(eta);
}

// 1. the posterior == a textbook moment-form scalar Kalman filter per lane (spec 2.2), P_0 = 1, m_0 = 0:
// P^- = abar^2 P + pbar; m^- = abar m; S = k^2 P^- + 1/Lv; Kg = P^- k / S; m = m^- + Kg (v - k m^-);
// P = (1 - Kg k) P^-; compared as mean = eta/lam and var = 1/lam after every token, B = 2, T = 200, Dk = 3,
// N = 5. The test's double info form: 1e-12 (spec 9.5); the fp32 kalman_filter_forward: 1e-5 (fp32 round-off
// of a contracting recursion, ~1e-7 per step, no growth).
static int kalt_textbook_kf(void) {
    const int B = 2, T = 200, Dk = 3, N = 5;
    const size_t BT = (size_t)B * T, nl = BT * Dk * N;
    test_seed(901);
    float *v = malloc(BT * Dk * sizeof(float)), *Lv = malloc(BT * Dk * sizeof(float));
    float *k = malloc(BT * N * sizeof(float)), *q = malloc(BT * N * sizeof(float));
    float *ab = malloc((size_t)Dk * N * sizeof(float)), *pb = malloc((size_t)Dk * N * sizeof(float));
    kalt_filter_inputs(v, Lv, k, q, ab, pb, B, T, Dk, N, 0.5, 0);
    double *vd = malloc(BT * Dk * sizeof(double)), *Lvd = malloc(BT * Dk * sizeof(double));
    double *kd = malloc(BT * N * sizeof(double)), *qd = malloc(BT * N * sizeof(double));
    double *abd = malloc((size_t)Dk * N * sizeof(double)), *pbd = malloc((size_t)Dk * N * sizeof(double));
    kalt_to_double(vd, v, BT * Dk); kalt_to_double(Lvd, Lv, BT * Dk); kalt_to_double(kd, k, BT * N);
    kalt_to_double(qd, q, BT * N); kalt_to_double(abd, ab, (size_t)Dk * N); kalt_to_double(pbd, pb, (size_t)Dk * N);
    double *mkf = malloc(nl * sizeof(double)), *pkf = malloc(nl * sizeof(double));
    for (int b = 0; b < B; b++) {
        for (int d = 0; d < Dk; d++) {
            for (int n = 0; n < N; n++) {
                const size_t dn = (size_t)d * N + n;
                double P = 1.0, m = 0.0;
                for (int t = 0; t < T; t++) {
                    const size_t r = (size_t)b * T + t;
                    const double kk = kd[r * N + n];
                    const double Pm = abd[dn] * abd[dn] * P + pbd[dn], mm = abd[dn] * m;
                    const double S = kk * kk * Pm + 1.0 / Lvd[r * Dk + d];
                    const double Kg = Pm * kk / S;
                    m = mm + Kg * (vd[r * Dk + d] - kk * mm);
                    P = (1.0 - Kg * kk) * Pm;
                    mkf[(r * Dk + d) * N + n] = m;
                    pkf[(r * Dk + d) * N + n] = P;
                }
            }
        }
    }
    double *la = malloc(nl * sizeof(double)), *ea = malloc(nl * sizeof(double));
    double *lam = malloc((size_t)B * Dk * N * sizeof(double)), *eta = malloc((size_t)B * Dk * N * sizeof(double));
    for (int i = 0; i < B * Dk * N; i++) { lam[i] = 1.0; eta[i] = 0.0; }
    kalt_filter64(NULL, la, ea, lam, eta, vd, Lvd, kd, qd, abd, pbd, NULL, NULL, NULL, B, T, Dk, N);
    double *mi = malloc(nl * sizeof(double)), *vi = malloc(nl * sizeof(double));
    for (size_t i = 0; i < nl; i++) { mi[i] = ea[i] / la[i]; vi[i] = 1.0 / la[i]; }
    int fails = 0;
    fails += test_check("kalman_textbook_kf_mean_fp64", test_relerr64(mi, mkf, nl), 1e-12);
    fails += test_check("kalman_textbook_kf_var_fp64", test_relerr64(vi, pkf, nl), 1e-12);
    float *l0 = malloc((size_t)B * Dk * N * sizeof(float)), *e0 = malloc((size_t)B * Dk * N * sizeof(float));
    for (int i = 0; i < B * Dk * N; i++) { l0[i] = 1.0f; e0[i] = 0.0f; }
    kalt_filter32_all(la, ea, v, Lv, k, q, ab, pb, l0, e0, B, T, Dk, N);
    for (size_t i = 0; i < nl; i++) { mi[i] = ea[i] / la[i]; vi[i] = 1.0 / la[i]; }
    fails += test_check("kalman_textbook_kf_mean_fp32", test_relerr64(mi, mkf, nl), 1e-5);
    fails += test_check("kalman_textbook_kf_var_fp32", test_relerr64(vi, pkf, nl), 1e-5);
    free(v); free(Lv); free(k); free(q); free(ab); free(pb); free(vd); free(Lvd); free(kd); free(qd); free(abd);
    free(pbd); free(mkf); free(pkf); free(la); free(ea); free(lam); free(eta); free(mi); free(vi); free(l0); free(e0);
    return fails;
}

// Theorem 3 closed form for lane (d, n) of one sequence, all t: lc, ec [T,Dk,N]
static void kalt_closed_form_lane(double* lc, double* ec, const float* v, const float* Lv,
                                                            const float* k, const float* ab, int lam0, int T,
                                                            int Dk, int N, int d, int n) {
    const double a = ab[d * N + n];
    for (int t = 1; t <= T; t++) {
        double l = pow(a, -2.0 * t) * lam0, e = 0.0;
        for (int s = 1; s <= t; s++) {
            const size_t r = (size_t)s - 1;
            const double kk = k[r * N + n], L = Lv[r * Dk + d];
            l += pow(a, -2.0 * (t - s)) * L * kk * kk;
            e += pow(a, -(double)(t - s)) * (double)v[r * Dk + d] * L * kk;
        }
        lc[(((size_t)t - 1) * Dk + d) * N + n] = l;
        ec[(((size_t)t - 1) * Dk + d) * N + n] = e;
    }
}

// 2. zero process noise (spec 2.2, Theorem 3), pbar = 0, T = 30, abar in (0.8, 0.99), lam_0 in {0, 1}, eta_0 = 0:
// lam_t = abar^(-2t) lam_0 + sum_s abar^(-2(t-s)) phi_s, eta_t = sum_s abar^(-(t-s)) r_s. Error: the max over t
// of the max-norm relative error of (lam_t) and of (eta_t) over all lanes. Double info form 1e-12 (spec 9.6);
// fp32 kalman_filter_forward 1e-5 (lam grows ~abar^-2t, but each step is a positive sum: relative
// round-off ~T * 6e-8 ~ 2e-6).
static int kalt_zero_noise(void) {
    const int B = 1, T = 30, Dk = 3, N = 4;
    const size_t BT = (size_t)B * T, nl = BT * Dk * N;
    int fails = 0;
    for (int lam0 = 0; lam0 <= 1; lam0++) {
        test_seed(910 + lam0);
        float *v = malloc(BT * Dk * sizeof(float)), *Lv = malloc(BT * Dk * sizeof(float));
        float *k = malloc(BT * N * sizeof(float)), *q = malloc(BT * N * sizeof(float));
        float *ab = malloc((size_t)Dk * N * sizeof(float)), *pb = malloc((size_t)Dk * N * sizeof(float));
        kalt_filter_inputs(v, Lv, k, q, ab, pb, B, T, Dk, N, 0.8, 1);
        double *lc = malloc(nl * sizeof(double)), *ec = malloc(nl * sizeof(double));
        for (int d = 0; d < Dk; d++) {
            for (int n = 0; n < N; n++) { kalt_closed_form_lane(lc, ec, v, Lv, k, ab, lam0, T, Dk, N, d, n); }
        }
        double *la = malloc(nl * sizeof(double)), *ea = malloc(nl * sizeof(double));
        double *vd = malloc(BT * Dk * sizeof(double)), *Lvd = malloc(BT * Dk * sizeof(double));
        double *kd = malloc(BT * N * sizeof(double)), *qd = malloc(BT * N * sizeof(double));
        double *abd = malloc((size_t)Dk * N * sizeof(double)), *pbd = malloc((size_t)Dk * N * sizeof(double));
        double *lam = malloc((size_t)Dk * N * sizeof(double)), *eta = malloc((size_t)Dk * N * sizeof(double));
        kalt_to_double(vd, v, BT * Dk); kalt_to_double(Lvd, Lv, BT * Dk); kalt_to_double(kd, k, BT * N);
        kalt_to_double(qd, q, BT * N); kalt_to_double(abd, ab, (size_t)Dk * N); kalt_to_double(pbd, pb, (size_t)Dk * N);
        for (int i = 0; i < Dk * N; i++) { lam[i] = lam0; eta[i] = 0.0; }
        double e64 = 0.0, e32 = 0.0;
        kalt_filter64(NULL, la, ea, lam, eta, vd, Lvd, kd, qd, abd, pbd, NULL, NULL, NULL, B, T, Dk, N);
        for (int t = 0; t < T; t++) {
            const size_t o = (size_t)t * Dk * N;
            e64 = fmax(e64, fmax(test_relerr64(la + o, lc + o, (size_t)Dk * N), test_relerr64(ea + o, ec + o, (size_t)Dk * N)));
        }
        float *l0 = malloc((size_t)Dk * N * sizeof(float)), *z0 = calloc((size_t)Dk * N, sizeof(float));
        for (int i = 0; i < Dk * N; i++) { l0[i] = (float)lam0; }
        kalt_filter32_all(la, ea, v, Lv, k, q, ab, pb, l0, z0, B, T, Dk, N);
        for (int t = 0; t < T; t++) {
            const size_t o = (size_t)t * Dk * N;
            e32 = fmax(e32, fmax(test_relerr64(la + o, lc + o, (size_t)Dk * N), test_relerr64(ea + o, ec + o, (size_t)Dk * N)));
        }
        char name[96];
        snprintf(name, sizeof(name), "kalman_zero_noise_closed_form_lam0_%d_fp64", lam0);
        fails += test_check(name, e64, 1e-12);
        snprintf(name, sizeof(name), "kalman_zero_noise_closed_form_lam0_%d_fp32", lam0);
        fails += test_check(name, e32, 1e-5);
        free(v); free(Lv); free(k); free(q); free(ab); free(pb); free(lc); free(ec); free(la); free(ea); free(vd);
        free(Lvd); free(kd); free(qd); free(abd); free(pbd); free(lam); free(eta); free(l0); free(z0);
    }
    return fails;
}

// 5. the filter adjoint (spec 2.4, kalman_filter_backward, fp32) == central finite differences of the double
// filter kalt_filter64, for every entry of every input: v, Lv, k, q, abar, pbar and the initial state lam_0,
// eta_0, with random weights on ys and on the final state. B = 2, T = 23, Dk = 3, N = 4, checkpoint interval
// 5 (segments replayed). FD step 1e-6 relative (truncation ~1e-12, round-off ~1e-10): the reference is exact
// to ~1e-8; the fp32 adjoint is expected at ~1e-6: tolerance 1e-4 per input tensor.
static int kalt_filter_adjoint(void) {
    const int B = 2, T = 23, Dk = 3, N = 4, CK = 5;
    const size_t BT = (size_t)B * T, nl = (size_t)B * Dk * N;
    test_seed(920);
    // float inputs packed: v | Lv | k | q | abar | pbar | lam0 | eta0
    const size_t nn[8] = {BT * Dk, BT * Dk, BT * N, BT * N, (size_t)Dk * N, (size_t)Dk * N, nl, nl};
    const char* names[8] = {"v", "Lv", "k", "q", "abar", "pbar", "lam0", "eta0"};
    size_t off[9] = {0};
    for (int i = 0; i < 8; i++) { off[i + 1] = off[i] + nn[i]; }
    float* in = malloc(off[8] * sizeof(float));
    kalt_filter_inputs(in + off[0], in + off[1], in + off[2], in + off[3], in + off[4], in + off[5], B, T, Dk, N, 0.5, 0);
    for (size_t i = 0; i < nl; i++) { in[off[6] + i] = (float)(0.5 + 2.0 * test_unif()); in[off[7] + i] = (float)test_normal(); }
    float *dys = malloc(BT * Dk * sizeof(float)), *dlT = malloc(nl * sizeof(float)), *deT = malloc(nl * sizeof(float));
    for (size_t i = 0; i < BT * Dk; i++) { dys[i] = (float)test_normal(); }
    for (size_t i = 0; i < nl; i++) { dlT[i] = (float)(0.1 * test_normal()); deT[i] = (float)test_normal(); }
    // fp32 forward + adjoint
    float *ys = malloc(BT * Dk * sizeof(float)), *ck = malloc(nl * kalman_NT(T, CK) * 2 * sizeof(float));
    float *lam = malloc(nl * sizeof(float)), *eta = malloc(nl * sizeof(float));
    memcpy(lam, in + off[6], nl * sizeof(float));
    memcpy(eta, in + off[7], nl * sizeof(float));
    kalman_filter_forward(ys, ck, lam, eta, in + off[0], Dk, in + off[1], in + off[2], in + off[3], in + off[4],
                          in + off[5], B, T, Dk, N, CK);
    float* g = malloc(off[8] * sizeof(float));
    const int nthr = max_threads();
    float* scr = malloc(((size_t)nthr * kalman_filter_bwd_floats(CK, N) + kalman_filter_bwd_shared_floats(B, T, Dk, N)) * sizeof(float));
    kalman_filter_backward(g + off[0], g + off[1], g + off[2], g + off[3], g + off[4], g + off[5], g + off[6],
                           g + off[7], dys, dlT, deT, ck, in + off[0], Dk, in + off[1], in + off[2], in + off[3],
                           in + off[4], in + off[5], B, T, Dk, N, CK, scr, nthr);
    // double FD
    double* x = malloc(off[8] * sizeof(double));
    double *dysd = malloc(BT * Dk * sizeof(double)), *dlTd = malloc(nl * sizeof(double)), *deTd = malloc(nl * sizeof(double));
    double *l64 = malloc(nl * sizeof(double)), *e64 = malloc(nl * sizeof(double));
    kalt_to_double(x, in, off[8]); kalt_to_double(dysd, dys, BT * Dk); kalt_to_double(dlTd, dlT, nl); kalt_to_double(deTd, deT, nl);
    double *fd = malloc(off[8] * sizeof(double)), *gd = malloc(off[8] * sizeof(double));
    for (size_t i = 0; i < off[8]; i++) {
        const double x0 = x[i], h = 1e-6 * fmax(fabs(x0), 0.1);
        double Lp, Lm;
        x[i] = x0 + h;
        memcpy(l64, x + off[6], nl * sizeof(double)); memcpy(e64, x + off[7], nl * sizeof(double));
        Lp = kalt_filter64(NULL, NULL, NULL, l64, e64, x + off[0], x + off[1], x + off[2], x + off[3], x + off[4], x + off[5], dysd, dlTd, deTd, B, T, Dk, N);
        x[i] = x0 - h;
        memcpy(l64, x + off[6], nl * sizeof(double)); memcpy(e64, x + off[7], nl * sizeof(double));
        Lm = kalt_filter64(NULL, NULL, NULL, l64, e64, x + off[0], x + off[1], x + off[2], x + off[3], x + off[4], x + off[5], dysd, dlTd, deTd, B, T, Dk, N);
        x[i] = x0;
        fd[i] = (Lp - Lm) / (2.0 * h);
        gd[i] = g[i];
    }
    int fails = 0;
    char name[96];
    for (int t = 0; t < 8; t++) {
        snprintf(name, sizeof(name), "kalman_filter_adjoint_vs_fd64_%s", names[t]);
        fails += test_check(name, test_relerr64(gd + off[t], fd + off[t], nn[t]), 1e-4);
    }
    free(in); free(dys); free(dlT); free(deT); free(ys); free(ck); free(lam); free(eta); free(g); free(scr); free(x);
    free(dysd); free(dlTd); free(deTd); free(l64); free(e64); free(fd); free(gd);
    return fails;
}

// ----------------------------------------------------------------------------
// layer-level tests: a small random layer on the harness above

// random weights sized so that activations are O(1). The dynamics are drawn wider than the init so that every
// parameter matters: Delta0 log-uniform in [0.01, 0.3], lambda_log ~ N(0, 0.5^2), p_raw in [0.005, 0.2] with
// one entry negative (below the 1e-7 clamp: its gradient must be 0), lambda_skip ~ -1 + 0.3 N(0,1)
static void kalt_draw(TestLayer* L) {
    KalmanParams* p = &L->p.kalman;
    const KalmanConfig* c = &L->s.kalman;
    const int C = c->C, Dk = c->Dk, N = c->N;
    test_draw_uniform(p->in_proj_w, test_layer_numel(L, "in_proj_w"), C);
    for (size_t i = 0; i < test_layer_numel(L, "conv_w"); i++) { p->conv_w[i] = (float)(test_unif() - 0.5); }
    for (size_t i = 0; i < test_layer_numel(L, "conv_b"); i++) { p->conv_b[i] = (float)(0.3 * test_normal()); }
    test_draw_uniform(p->sensor_w, test_layer_numel(L, "sensor_w"), Dk);
    test_draw_uniform(p->var_w, test_layer_numel(L, "var_w"), c->R);
    test_draw_uniform(p->out_proj_w, test_layer_numel(L, "out_proj_w"), Dk);
    for (int i = 0; i < Dk * N; i++) {
        const double D0 = exp(log(0.01) + test_unif() * (log(0.3) - log(0.01)));
        p->delta_raw[i] = (float)(D0 + log(-expm1(-D0)));
        p->lambda_log[i] = (float)(0.5 * test_normal());
        p->p_raw[i] = (float)(0.005 + 0.195 * test_unif());
    }
    p->p_raw[1] = -0.01f;
    p->lambda_skip[0] = (float)(-1.0 + 0.3 * test_normal());
}

static double kalt_softplus(double u) { return u > 20.0 ? u : log1p(exp(u)); }

// independent double-precision layer forward (spec 1.3 (1)-(8), the filter of 2.3 with the floors of 2.5).
// prm: the tensors in KalmanParams order; out [B,T,C] (may be NULL); returns sum(out * R)
static double kalt_ref_forward(const TestLayer* L, const double* prm, const double* x, double* out) {
    const KalmanConfig* c = &L->s.kalman;
    const int B = L->B, T = L->T, C = c->C, Dk = c->Dk, N = c->N, K = c->K, R = c->R, Ws = kalman_Ws(c);
    const double* Win = test_layer_param64(L, prm, "in_proj_w");
    const double* Wc = test_layer_param64(L, prm, "conv_w");
    const double* bc = test_layer_param64(L, prm, "conv_b");
    const double* Wsn = test_layer_param64(L, prm, "sensor_w");
    const double* Wv = test_layer_param64(L, prm, "var_w");   // NULL in the plain preset
    const double* Wout = test_layer_param64(L, prm, "out_proj_w");
    const double* draw = test_layer_param64(L, prm, "delta_raw");
    const double* llog = test_layer_param64(L, prm, "lambda_log");
    const double* praw = test_layer_param64(L, prm, "p_raw");
    const double lsk = *test_layer_param64(L, prm, "lambda_skip");
    double* h = malloc((size_t)T * 2 * Dk * sizeof(double));
    double* u = malloc((size_t)Dk * sizeof(double));
    double* s = malloc((size_t)Ws * sizeof(double));
    double* yg = malloc((size_t)Dk * sizeof(double));
    double* ab = malloc((size_t)Dk * N * sizeof(double));
    double* pb = malloc((size_t)Dk * N * sizeof(double));
    double* lam = malloc((size_t)Dk * N * sizeof(double));
    double* eta = malloc((size_t)Dk * N * sizeof(double));
    for (int i = 0; i < Dk * N; i++) {
        const double Delta = kalt_softplus(draw[i]) + 1e-7, kappa = exp(llog[i]), p = fmax(praw[i], 1e-7);
        ab[i] = exp(-kappa * Delta);
        pb[i] = fmax(p / (2.0 * kappa) * -expm1(-2.0 * kappa * Delta), 1e-12);
    }
    double loss = 0.0;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int i = 0; i < 2 * Dk; i++) {
                double acc = 0.0;
                for (int j = 0; j < C; j++) { acc += Win[(size_t)i * C + j] * x[((size_t)b * T + t) * C + j]; }
                h[(size_t)t * 2 * Dk + i] = acc;
            }
        }
        for (int i = 0; i < Dk * N; i++) { lam[i] = 1.0; eta[i] = 0.0; }
        for (int t = 0; t < T; t++) {
            for (int d = 0; d < Dk; d++) {
                double acc = bc[d];
                for (int j = 0; j < K; j++) {
                    const int ts = t - (K - 1) + j;
                    if (ts >= 0) { acc += Wc[d * K + j] * h[(size_t)ts * 2 * Dk + d]; }
                }
                u[d] = acc / (1.0 + exp(-acc));
            }
            for (int i = 0; i < Ws; i++) {
                double acc = 0.0;
                for (int d = 0; d < Dk; d++) { acc += Wsn[(size_t)i * Dk + d] * u[d]; }
                s[i] = acc;
            }
            const int off = c->preset ? R : 2 * Dk;
            double nk = 0.0, nq = 0.0;
            for (int n = 0; n < N; n++) { nk += s[off + n] * s[off + n]; nq += s[off + N + n] * s[off + N + n]; }
            nk = fmax(sqrt(nk), 1e-12); nq = fmax(sqrt(nq), 1e-12);
            for (int d = 0; d < Dk; d++) {
                double ls;
                if (c->preset) { ls = 0.0; for (int i = 0; i < R; i++) { ls += Wv[(size_t)d * R + i] * s[i]; } }
                else { ls = s[Dk + d]; }
                const double Lv = 1.0 / (kalt_softplus(ls) + 1e-4);
                const double v = c->preset ? u[d] : s[d];
                double y = 0.0;
                for (int n = 0; n < N; n++) {
                    const int i = d * N + n;
                    const double kk = s[off + n] / nk, qq = s[off + N + n] / nq;
                    const double rho = 1.0 / fmax(fmax(ab[i] * ab[i], 1e-12) + pb[i] * lam[i], 1e-12);
                    eta[i] = ab[i] * rho * eta[i] + v * Lv * kk;
                    lam[i] = lam[i] * rho + Lv * kk * kk;
                    y += qq * eta[i] / fmax(lam[i], 1e-12);
                }
                const double g = h[(size_t)t * 2 * Dk + Dk + d];
                yg[d] = (y + lsk * u[d]) * g / (1.0 + exp(-g));
            }
            for (int i = 0; i < C; i++) {
                double acc = 0.0;
                for (int d = 0; d < Dk; d++) { acc += Wout[(size_t)i * Dk + d] * yg[d]; }
                const size_t e = ((size_t)b * T + t) * C + i;
                if (out) { out[e] = acc; }
                loss += acc * L->R[e];
            }
        }
    }
    free(h); free(u); free(s); free(yg); free(ab); free(pb); free(lam); free(eta);
    return loss;
}

static const MixerLayerTest KALMAN_LAYER_TEST = {
    kalt_draw, kalt_ref_forward,
    // 6. layer backward (kalman_backward) vs the 2-point differences of the float64 forward kalt_ref_forward,
    //    EVERY entry of every parameter tensor and 16 entries of x, step 1e-5 (truncation ~1e-10, round-off ~1e-11:
    //    the reference is exact to ~1e-8 relative). Tolerance 1e-4 per tensor (spec 9.15 gradients); the fp32
    //    forward vs the float64 one at 1e-5. 7. negative control: a lambda_log gradient entry.
    {.per_tensor = 0, .x_samples = 16, .points = 2, .h = 1e-5, .fwd_tol = 1e-5, .grad_tol = spec5_grad_tol,
     .control = "lambda_log"},
    NULL,
};

// the small layers of the tests: plain expand 2 (C = 12, Dk = 24), mamba expand 1 (C = 16, R = 2); N = 4, K = 4
static void kalt_layer(TestLayer* L, int preset, int chunk, int T, uint64_t seed) {
    Config c = {.num_layers = 1, .channels = preset ? 16 : 12, .conv_size = 4, .kalman_expand = preset ? 1 : 2,
                .kalman_n = 4, .kalman_preset = preset, .kalman_rank = preset ? 2 : 0, .mixer = {MIXER_KALMAN}};
    test_layer_init(L, &KALMAN_LAYER_TEST, preset ? "kalman_mamba" : "kalman_plain", &c, chunk, 2, T, seed);
}

// 4. decode token by token (kalman_decode_step) == kalman_forward over the same sequences, B = 2, T = 37, 1e-5
//    (fp32 round-off of two evaluation orders)
static int kalt_decode(int preset) {
    TestLayer L;
    kalt_layer(&L, preset, 16, 37, 930 + preset);
    const int fails = test_layer_decode(&L, 1e-5);
    test_layer_free(&L);
    return fails;
}

// 3a. state carry: kalman_forward_carry over [0, T1) then [T1, T) with the carried (conv window, lam, eta) ==
// one pass, B = 2, T = 37, T1 in {2 (inside the conv window), 10, 23}. Same arithmetic per token; only the
// matmul blocking over rows differs: 1e-6.
static int kalt_state_split(int preset) {
    TestLayer L;
    kalt_layer(&L, preset, 7, 37, 940 + preset);
    test_layer_loss(&L, NULL, NULL);
    const KalmanConfig* c = &L.s.kalman;
    const int B = L.B, T = L.T, C = c->C;
    const size_t sf = kalman_state_floats(c);
    float* states = (float*)malloc((size_t)B * sf * sizeof(float));
    float* outs = (float*)malloc((size_t)B * T * C * sizeof(float));
    int fails = 0;
    const int splits[3] = {2, 10, 23};
    for (int si = 0; si < 3; si++) {
        const int T1 = splits[si];
        for (int b = 0; b < B; b++) {
            KalmanState s;
            kalman_state_point(&s, states + b * sf, c);
            kalman_state_reset(&s, c);
        }
        for (int part = 0; part < 2; part++) {
            const int t0 = part ? T1 : 0, t1 = part ? T : T1, Tp = t1 - t0;
            float* xs = (float*)malloc((size_t)B * Tp * C * sizeof(float));
            float* os = (float*)malloc((size_t)B * Tp * C * sizeof(float));
            float* acts = (float*)malloc(kalman_acts_floats(B, Tp, c) * sizeof(float));
            KalmanActs a;
            kalman_acts_point(&a, acts, B, Tp, c);
            test_slice(xs, L.x, B, T, t0, t1, C);
            kalman_forward_carry(os, &a, &L.p.kalman, xs, B, Tp, c, states);
            test_unslice(outs, os, B, T, t0, t1, C);
            free(xs); free(os); free(acts);
        }
        char name[96];
        snprintf(name, sizeof(name), "kalman_state_split_%s_T1_%d", preset ? "mamba" : "plain", T1);
        fails += test_check(name, test_relerr(outs, L.out, (size_t)B * T * C), 1e-6);
    }
    free(states); free(outs);
    test_layer_free(&L);
    return fails;
}

// 3b. the checkpoint interval does not change results: out, dx and every gradient with chunk in {1, 5, 64} vs
// chunk 16 (B = 2, T = 37, not a multiple of any). The replayed states are the same arithmetic: expected
// bitwise; tolerance 0. With OpenMP also 1 thread vs all: the fixed reduction order makes it bitwise too.
static int kalt_chunk_invariance(int preset) {
    TestLayer R0;
    kalt_layer(&R0, preset, 16, 37, 950 + preset);
    test_layer_grad(&R0);
    const size_t nx = (size_t)R0.B * R0.T * R0.cfg.channels;
    int fails = 0;
    const int chunks[4] = {1, 5, 64, 16};
    for (int i = 0; i < 4; i++) {
        TestLayer L;
        kalt_layer(&L, preset, chunks[i], 37, 950 + preset);
#ifdef OMP
        const int saved = omp_get_max_threads();
        if (i == 3) { omp_set_num_threads(1); }
#endif
        test_layer_grad(&L);
#ifdef OMP
        omp_set_num_threads(saved);
#endif
        double e = fmax(test_relerr(L.out, R0.out, nx), test_relerr(L.dx, R0.dx, nx));
        e = fmax(e, test_relerr(L.grad, R0.grad, L.nprm));
        char name[96];
        if (i < 3) { snprintf(name, sizeof(name), "kalman_chunk_%d_equals_chunk_16_%s", chunks[i], preset ? "mamba" : "plain"); }
        else { snprintf(name, sizeof(name), "kalman_one_thread_equals_all_threads_%s", preset ? "mamba" : "plain"); }
        fails += test_check(name, e, 0.0);
        test_layer_free(&L);
    }
    test_layer_free(&R0);
    return fails;
}

// 6, 7. layer backward vs finite differences and its negative control (KALMAN_LAYER_TEST.fd), B = 2, T = 13,
// chunk 5. p_raw[1] < 1e-7: its gradient must be exactly 0 (the FD is 0 too).
static int kalt_layer_fd(int preset) {
    TestLayer L;
    kalt_layer(&L, preset, 5, 13, 960 + preset);
    GradSamples g;
    int fails = test_layer_fd(&L, &g);
    // every parameter entry is sampled, in order: sample i is parameter i
    const size_t praw1 = L.off[test_layer_tensor(&L, "p_raw")] + 1;
    const int zok = L.grad[praw1] == 0.0f && g.f[praw1] == 0.0;
    printf("%s kalman_p_raw_clamp_zero_grad_%s: grad %.3e, fd %.3e (both must be 0)\n", zok ? "PASS" : "FAIL",
           preset ? "mamba" : "plain", (double)L.grad[praw1], g.f[praw1]);
    fails += zok ? 0 : 1;
    grad_samples_free(&g);
    test_layer_free(&L);
    return fails;
}

int test_kalman_properties(void) {
    int fails = 0;
    fails += kalt_textbook_kf();
    fails += kalt_zero_noise();
    fails += kalt_filter_adjoint();
    for (int preset = 0; preset <= 1; preset++) {
        fails += kalt_state_split(preset);
        fails += kalt_chunk_invariance(preset);
        fails += kalt_decode(preset);
        fails += kalt_layer_fd(preset);
    }
    printf("kalman tests: %d failures\n", fails);
    return fails;
}

int main(int argc, char** argv) {
    const char* dir = argc > 1 ? argv[1] : "dev/test/ref";
    // every configuration of the shared list, each at two chunk lengths (T = 80 is 2.5 chunks of 32; attn has none)
    ParityConfigs configs;
    read_parity_configs(&configs, "dev/test/parity_configs.txt");
    for (int i = 0; i < configs.count; i++) {
        const char* name = configs.name[i];
        test_parity(dir, name, 64, "chunk 64", &CPU_TOLERANCES);
        if (strcmp(name, "attn") != 0) { test_parity(dir, name, 32, "chunk 32", &CPU_TOLERANCES); }
        // fp32 round-off of two evaluation orders (chunkwise vs recurrent, batched vs single row)
        test_decode(dir, name, 16, "fp32", 1e-5);
        test_checkpoint_round_trip(dir, name);
    }
    test_schedules();
    test_initialisation();
    test_flop_count();
    test_sampling();
    test_checkpoint_dir(dir);
    test_checksums(dir);
    test_grad_accumulation(dir);
    int gdn_failures = test_gdn_properties() + test_pdn_properties() + test_gka_properties() + test_kalman_properties();  // print their own PASS/FAIL lines
    printf("test_kla: parity/decode/checkpoint checks %d passed, %d failed; mixer property failures %d\n",
           tests_passed, tests_failed, gdn_failures);
    return tests_failed + gdn_failures > 0;
}
