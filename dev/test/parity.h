/*
dev/test/parity.h: the parity harness shared by test_kla.c (train_kla.c) and test_kla.cu (train_kla.cu).

Include it after the trainer and after defining, for the trainer's Model:
    static void test_logits(Model* m, float* out);   // the last forward's logits, B*T*Vp floats
    static void test_grads(Model* m, float* out);    // the parameter gradients, num_parameters floats
    static void test_scale_tensor(Model* m, const TensorInfo* t, float factor);  // parameters of t *= factor
The trainer provides model_load(m, path, arg), model_forward, model_zero_grad, model_backward, model_grad_norm,
model_update, model_free, decode_init, model_decode_step (leaving the next-token logits in the host array
d.logits), decode_free, and model_mean_loss(m), m->config, m->table, m->num_parameters.
*/
#ifndef TRAIN_KLA_PARITY_H
#define TRAIN_KLA_PARITY_H

static int tests_passed = 0, tests_failed = 0;

static void report(int ok, const char* name, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void report(int ok, const char* name, const char* fmt, ...) {
    char details[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(details, sizeof(details), fmt, ap);
    va_end(ap);
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", name, ok ? "  " : ": ", details);
    if (ok) { tests_passed++; } else { tests_failed++; }
}

// max |a - b| / max |b|: the norm-wise relative error used by every comparison below
static double relative_error(const float* a, const float* b, size_t n) {
    double maxdiff = 0.0, maxref = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d)) { return INFINITY; }
        if (d > maxdiff) { maxdiff = d; }
        if (fabs(b[i]) > maxref) { maxref = fabs(b[i]); }
    }
    return maxref > 0.0 ? maxdiff / maxref : maxdiff;
}

// relative-error bounds of one build, and the negative control's scale factor (see the test files for why)
typedef struct {
    double logits, loss, grads, steps;
    float control;
} ParityTolerances;

// ----------------------------------------------------------------------------------------------------------
// the reference debug state (FORMATS.md)

#define DEBUG_MAGIC 20251122

typedef struct {
    int B, T, V, Vp, num_steps;
    float lr, beta1, beta2, eps, weight_decay, grad_clip;
    int *x, *y;
    float *logits, loss, *grads, *losses;
} DebugState;

static void load_debug_state(DebugState* d, const char* path, const Model* m) {
    FILE* f = fopen_or_die(path, "rb");
    int32_t h[256];
    fread_or_die(h, sizeof(h), f, path);
    if (h[0] != DEBUG_MAGIC || h[1] != 1) { die("%s: not a version-1 debug state", path); }
    d->B = h[2]; d->T = h[3]; d->V = h[4]; d->Vp = h[5]; d->num_steps = h[6];
    if (d->V != m->config.vocab_size || d->Vp != m->config.padded_vocab_size || h[7] != m->table.num_tensors) {
        die("%s: does not belong to the model it is tested with", path);
    }
    d->lr = slot_to_f32(h[8]); d->beta1 = slot_to_f32(h[9]); d->beta2 = slot_to_f32(h[10]);
    d->eps = slot_to_f32(h[11]); d->weight_decay = slot_to_f32(h[12]); d->grad_clip = slot_to_f32(h[13]);
    size_t BT = (size_t)d->B * d->T;
    d->x = (int*)malloc_or_die(BT * sizeof(int));
    d->y = (int*)malloc_or_die(BT * sizeof(int));
    d->logits = (float*)malloc_or_die(BT * d->V * sizeof(float));
    d->grads = (float*)malloc_or_die(m->num_parameters * sizeof(float));
    d->losses = (float*)malloc_or_die(d->num_steps * sizeof(float));
    fread_or_die(d->x, BT * sizeof(int), f, path);
    fread_or_die(d->y, BT * sizeof(int), f, path);
    fread_or_die(d->logits, BT * d->V * sizeof(float), f, path);
    fread_or_die(&d->loss, sizeof(float), f, path);
    fread_or_die(d->grads, m->num_parameters * sizeof(float), f, path);
    fread_or_die(d->losses, d->num_steps * sizeof(float), f, path);
    if (fgetc(f) != EOF) { die("%s: longer than expected", path); }
    fclose(f);
}

static void free_debug_state(DebugState* d) {
    free(d->x); free(d->y); free(d->logits); free(d->grads); free(d->losses);
}

// ----------------------------------------------------------------------------------------------------------
// parity with the reference: forward, backward, 10 steps

typedef struct {
    double logits, loss, worst_grad;
    char worst_grad_name[96];
    double steps;  // worst relative loss error over the training steps
} ParityErrors;

// Forward + backward on the debug batch; the errors against the reference.
static void forward_backward_errors(Model* m, const DebugState* d, ParityErrors* e) {
    int B = d->B, T = d->T, V = d->V, Vp = d->Vp;
    model_forward(m, d->x, d->y, B, T);
    model_zero_grad(m);
    model_backward(m, 1.0f);
    float* grads = (float*)malloc_or_die(m->num_parameters * sizeof(float));
    test_grads(m, grads);
    float* padded = (float*)malloc_or_die((size_t)B * T * Vp * sizeof(float));
    float* logits = (float*)malloc_or_die((size_t)B * T * V * sizeof(float));
    // model_backward overwrote the logits with dlogits: recompute them with a forward without targets
    model_forward(m, d->x, NULL, B, T);
    test_logits(m, padded);
    for (size_t bt = 0; bt < (size_t)B * T; bt++) { memcpy(logits + bt * V, padded + bt * Vp, V * sizeof(float)); }
    e->logits = relative_error(logits, d->logits, (size_t)B * T * V);
    free(logits);
    free(padded);
    model_forward(m, d->x, d->y, B, T);
    e->loss = fabs(model_mean_loss(m) - d->loss) / fabs(d->loss);
    e->worst_grad = 0.0;
    for (int i = 0; i < m->table.num_tensors; i++) {
        const TensorInfo* t = &m->table.t[i];
        double err = relative_error(grads + t->offset, d->grads + t->offset, t->numel);
        if (!(err <= e->worst_grad)) { e->worst_grad = err; snprintf(e->worst_grad_name, 96, "%s", t->name); }
    }
    free(grads);
}

// Train num_steps steps on the debug batch as the reference did; the worst relative loss error.
static double training_errors(Model* m, const DebugState* d) {
    double worst = 0.0;
    for (int step = 0; step < d->num_steps; step++) {
        model_forward(m, d->x, d->y, d->B, d->T);
        double err = fabs(model_mean_loss(m) - d->losses[step]) / fabs(d->losses[step]);
        if (!(err <= worst)) { worst = err; }
        model_zero_grad(m);
        model_backward(m, 1.0f);
        float norm = model_grad_norm(m);
        float scale = d->grad_clip > 0.0f && norm > d->grad_clip ? d->grad_clip / norm : 1.0f;
        model_update(m, d->lr, d->beta1, d->beta2, d->eps, d->weight_decay, scale, step + 1);
    }
    return worst;
}

static int parity_ok(const ParityErrors* e, const ParityTolerances* tol) {
    return e->logits <= tol->logits && e->loss <= tol->loss && e->worst_grad <= tol->grads;
}

// Parity of one reference configuration (forward, backward, the training steps) and its negative control.
// load_arg: what the trainer's model_load takes as its last argument, described by `variant` in the check names.
static void test_parity(const char* dir, const char* name, int load_arg, const char* variant, const ParityTolerances* tol) {
    char model_path[4096], debug_path[4096], check[256];
    snprintf(model_path, sizeof(model_path), "%s/%s_model.bin", dir, name);
    snprintf(debug_path, sizeof(debug_path), "%s/%s_debug.bin", dir, name);
    Model m;
    DebugState d;
    model_load(&m, model_path, load_arg);
    load_debug_state(&d, debug_path, &m);
    ParityErrors e;
    forward_backward_errors(&m, &d, &e);
    snprintf(check, sizeof(check), "parity %s %s: logits", name, variant);
    report(e.logits <= tol->logits, check, "rel err %.2e (tol %.0e); trunk %s, mlp %s%s%s", e.logits, tol->logits,
           NORM_NAMES[m.config.norm], MLP_NAMES[m.config.mlp], config_has_mixer(&m.config, MIXER_KALMAN) ? ", kalman " : "",
           config_has_mixer(&m.config, MIXER_KALMAN) ? KALMAN_PRESET_NAMES[m.config.kalman_preset] : "");
    snprintf(check, sizeof(check), "parity %s %s: loss", name, variant);
    report(e.loss <= tol->loss, check, "ours %.7f ref %.7f rel err %.2e (tol %.0e)", model_mean_loss(&m), d.loss, e.loss, tol->loss);
    snprintf(check, sizeof(check), "parity %s %s: gradients of all %d tensors", name, variant, m.table.num_tensors);
    report(e.worst_grad <= tol->grads, check, "worst %s rel err %.2e (tol %.0e)", e.worst_grad_name, e.worst_grad, tol->grads);
    double steps = training_errors(&m, &d);
    snprintf(check, sizeof(check), "parity %s %s: %d AdamW steps", name, variant, d.num_steps);
    report(steps <= tol->steps, check, "worst loss rel err %.2e (tol %.0e), final loss ref %.6f", steps, tol->steps, d.losses[d.num_steps - 1]);
    model_free(&m);

    // negative control: the first layer's mixer input matrix scaled by tol->control must break the comparison
    model_load(&m, model_path, load_arg);
    const TensorInfo* t = &m.table.t[0];
    while (!t->decay) { t++; }  // the first decayed tensor: the first layer's mixer input matrix
    test_scale_tensor(&m, t, tol->control);
    forward_backward_errors(&m, &d, &e);
    snprintf(check, sizeof(check), "parity %s %s: negative control (%s x %g is detected)", name, variant, t->name, tol->control);
    report(!parity_ok(&e, tol), check, "logits err %.2e, worst grad err %.2e", e.logits, e.worst_grad);
    model_free(&m);
    free_debug_state(&d);
}

// Token-by-token decode must give the logits of one full forward at every position (40 random tokens).
// load_arg: as in test_parity; tol: the relative bound of the build (two evaluation orders of the same math).
static void test_decode(const char* dir, const char* name, int load_arg, const char* variant, double tol) {
    char path[4096], check[160];
    snprintf(path, sizeof(path), "%s/%s_model.bin", dir, name);
    Model m;
    model_load(&m, path, load_arg);
    int T = 40, V = m.config.vocab_size, Vp = m.config.padded_vocab_size;
    int tokens[40];
    uint64_t rng = 7;
    for (int t = 0; t < T; t++) { tokens[t] = (int)(rng_next(&rng) % (uint64_t)V); }
    model_forward(&m, tokens, NULL, 1, T);
    float* logits = (float*)malloc_or_die((size_t)T * Vp * sizeof(float));
    test_logits(&m, logits);
    DecodeState d;
    decode_init(&d, &m, T);
    double worst = 0.0;
    for (int t = 0; t < T; t++) {
        model_decode_step(&m, &d, tokens[t]);
        double err = relative_error(d.logits, logits + (size_t)t * Vp, V);
        if (!(err <= worst)) { worst = err; }
    }
    snprintf(check, sizeof(check), "decode %s (%s): token-by-token logits == full forward", name, variant);
    report(worst <= tol, check, "rel err %.2e (tol %.0e)", worst, tol);
    decode_free(&d);
    free(logits);
    model_free(&m);
}

// The names of the parity configurations, in order, from dev/test/parity_configs.txt (the one list that
// scripts/make_reference.sh, test_kla and test_klacu share): the first word of each line that is not a comment.
#define MAX_PARITY_CONFIGS 64
typedef struct {
    char name[MAX_PARITY_CONFIGS][64];
    int count;
} ParityConfigs;

static void read_parity_configs(ParityConfigs* pc, const char* path) {
    FILE* f = fopen_or_die(path, "r");
    char line[1024];
    pc->count = 0;
    while (fgets(line, sizeof(line), f)) {
        char name[64];
        if (line[0] == '#' || sscanf(line, "%63s", name) != 1) { continue; }
        if (pc->count == MAX_PARITY_CONFIGS) { die("%s: more than %d configurations", path, MAX_PARITY_CONFIGS); }
        snprintf(pc->name[pc->count++], sizeof(pc->name[0]), "%s", name);
    }
    fclose(f);
    if (pc->count == 0) { die("%s: no configurations", path); }
}

#endif // TRAIN_KLA_PARITY_H
