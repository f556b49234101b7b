/*
test_tasks.c: the synthetic-task generators of tasks.h against their specs, and the masked loss of train_kla.c.

Each generator is checked by re-deriving what its spec says from the generated tokens alone (the statistics of
the label positions, the query distributions, the A5 group table, the stacks replayed), never against stored
outputs. Distribution checks are Kolmogorov-Smirnov tests at the 0.1% level (critical value 1.95/sqrt(n)); each
has a negative control: the same statistic computed for a wrong distribution must fail. The masked loss is
checked by a finite-difference directional derivative, with the control that the unmasked gradient does not
match it.

Output: one line per check, "PASS <name>" or "FAIL <name>: <details>"; exit status 1 if any check failed.
*/
#define TESTING
// the masked-loss check needs the trainer's model; the many trainer functions it does not call are fine unused
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wunused-variable"
#include "train_kla.c"

static int failures = 0;

static void check(int ok, const char* name, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(int ok, const char* name, const char* fmt, ...) {
    va_list ap;
    printf("%s %s", ok ? "PASS" : "FAIL", name);
    if (fmt[0]) { printf(": "); va_start(ap, fmt); vprintf(fmt, ap); va_end(ap); }
    printf("\n");
    failures += !ok;
}

// KS distance between the empirical distribution of integer samples on [lo, hi) and a CDF given on the
// integers: cdf[k - lo] = P(X <= k).
static double ks_distance(const long* counts, const double* cdf, int lo, int hi, long n) {
    double d = 0.0, acc = 0.0;
    for (int k = lo; k < hi; k++) {
        acc += counts[k - lo];
        double diff = fabs(acc / n - cdf[k - lo]);
        if (diff > d) { d = diff; }
    }
    return d;
}

// ----------------------------------------------------------------------------------------------------------
// mqar (spec 8.1) and sniah (8.2)

static void test_mqar(void) {
    Task t = {TASK_MQAR, 256, 96, 8};
    int L = t.len, D = t.pairs, inputs[96], targets[96];
    int bad_prefix = 0, bad_label = 0, bad_count = 0, bad_pos = 0;
    for (int i = 0; i < 2000; i++) {
        task_example(&t, L, SPLIT_TRAIN, 7, (uint64_t)i, inputs, targets);
        int n = 0;
        for (int j = 0; j < D; j++) {
            bad_prefix += !(inputs[2 * j] < t.vocab / 2 && inputs[2 * j + 1] >= t.vocab / 2 && inputs[2 * j + 1] < t.vocab);
        }
        for (int p = 0; p < L; p++) {
            if (targets[p] == TASK_IGNORE) { continue; }
            n++;
            bad_pos += p < 2 * D || p >= L - 2;  // queries in [prefix_len, L - (key_len + 1))
            int found = 0;                        // the query is a key of the prefix and the label its value
            for (int j = 0; j < D; j++) { found |= inputs[2 * j] == inputs[p] && inputs[2 * j + 1] == targets[p]; }
            bad_label += !found;
        }
        bad_count += n < 1 || n > D;
    }
    check(bad_prefix == 0, "mqar: prefix k1 v1 .. kD vD, keys in [0, V/2), values in [V/2, V)", "%d bad", bad_prefix);
    check(bad_pos == 0, "mqar: labels only at query positions in [2D, L-2)", "%d outside", bad_pos);
    check(bad_label == 0, "mqar: each label is the value of the queried key in the prefix", "%d wrong", bad_label);
    check(bad_count == 0, "mqar: 1..D labels per sequence (a later query may overwrite an earlier one)", "%d sequences off", bad_count);

    // the power-law spacing: sniah has one query per sequence, so its position is exactly one draw of
    // step 4's inverse CDF, F(x) = (x^0.9 - lo^0.9) / (hi^0.9 - lo^0.9) on [lo, hi) = [2, L-2)
    Task s = {TASK_SNIAH, 64, 64, 1};
    enum { N = 20000 };
    int lo = 2, hi = 62;
    long counts[64] = {0};
    double cdf[64], uniform[64];
    for (int i = 0; i < N; i++) {
        task_example(&s, 64, SPLIT_TRAIN, 11, (uint64_t)i, inputs, targets);
        int n = 0;
        for (int p = 0; p < 64; p++) { if (targets[p] != TASK_IGNORE) { counts[p - lo]++; n++; } }
        if (n != 1) { bad_count++; }
    }
    for (int k = lo; k < hi; k++) {
        cdf[k - lo] = (pow(k + 1.0, 0.9) - pow(lo, 0.9)) / (pow(hi, 0.9) - pow(lo, 0.9));
        uniform[k - lo] = (k + 1.0 - lo) / (hi - lo);
    }
    double crit = 1.95 / sqrt((double)N), d = ks_distance(counts, cdf, lo, hi, N), du = ks_distance(counts, uniform, lo, hi, N);
    check(bad_count == 0, "sniah: exactly one label per sequence", "%d sequences off", bad_count);
    check(d < crit, "mqar/sniah: query positions follow the alpha = 0.1 power law (KS)", "D = %.4f, critical %.4f", d, crit);
    check(du > crit, "mqar/sniah negative control: the same positions reject a uniform law (KS)", "D = %.4f, critical %.4f", du, crit);
}

// ----------------------------------------------------------------------------------------------------------
// mqar-zoology (spec/pdn.md 8.1)

static void test_mqar_zoology(void) {
    Task t = {TASK_MQAR_ZOOLOGY, 64, 64, 8};
    int L = t.len, P = t.pairs, inputs[64], targets[64], bad = 0, bad_label = 0, bad_count = 0;
    for (int i = 0; i < 2000; i++) {
        task_example(&t, L, SPLIT_TRAIN, 3, (uint64_t)i, inputs, targets);
        for (int j = 0; j < P; j++) {
            bad += !(inputs[2 * j] >= 1 && inputs[2 * j] < t.vocab / 2 && inputs[2 * j + 1] >= t.vocab / 2);
            for (int k = 0; k < j; k++) { bad += inputs[2 * k] == inputs[2 * j] || inputs[2 * k + 1] == inputs[2 * j + 1]; }
        }
        int n = 0;
        for (int p = 0; p < L; p++) {
            if (targets[p] == TASK_IGNORE) { continue; }
            n++;
            int found = 0;
            for (int j = 0; j < P; j++) { found |= inputs[2 * j] == inputs[p] && inputs[2 * j + 1] == targets[p]; }
            bad_label += !found || p < 2 * P || (p - 2 * P) % 2 != 0;
        }
        bad_count += n != P;
    }
    check(bad == 0, "mqar-zoology: distinct keys in [1, V/2), distinct values in [V/2, V)", "%d bad", bad);
    check(bad_label == 0, "mqar-zoology: labels at even query offsets, each the queried key's value", "%d wrong", bad_label);
    check(bad_count == 0, "mqar-zoology: exactly P labels per sequence (gaps drawn without replacement)", "%d sequences off", bad_count);

    // one pair: the gap is one draw with P(gap = g) proportional to (g + 1)^(power_a - 1), power_a = 0.01
    Task s = {TASK_MQAR_ZOOLOGY, 64, 64, 1};
    enum { N = 20000 };
    int space = (64 - 2) / 2;
    long counts[32] = {0};
    double cdf[32], uniform[32], total = 0.0, acc = 0.0;
    for (int i = 0; i < N; i++) {
        task_example(&s, 64, SPLIT_TRAIN, 5, (uint64_t)i, inputs, targets);
        for (int p = 0; p < 64; p++) { if (targets[p] != TASK_IGNORE) { counts[(p - 2) / 2]++; } }
    }
    for (int g = 0; g < space; g++) { total += pow(g + 1.0, -0.99); }
    for (int g = 0; g < space; g++) { acc += pow(g + 1.0, -0.99); cdf[g] = acc / total; uniform[g] = (g + 1.0) / space; }
    double crit = 1.95 / sqrt((double)N), d = ks_distance(counts, cdf, 0, space, N), du = ks_distance(counts, uniform, 0, space, N);
    check(d < crit, "mqar-zoology: query gaps follow p(g) ~ (g+1)^-0.99 (KS)", "D = %.4f, critical %.4f", d, crit);
    check(du > crit, "mqar-zoology negative control: the same gaps reject a uniform law (KS)", "D = %.4f, critical %.4f", du, crit);
}

// ----------------------------------------------------------------------------------------------------------
// palindrome (spec 8.3)

static void test_palindrome(void) {
    Task t = {TASK_PALINDROME, 16, 10, 0};
    int L = t.len, inputs[21], targets[21], bad = 0;
    for (int i = 0; i < 500; i++) {
        task_example(&t, L, SPLIT_TRAIN, 1, (uint64_t)i, inputs, targets);
        int n = 0;
        for (int p = 0; p < L; p++) { bad += inputs[p] < 0 || inputs[p] >= 15 || inputs[2 * L - p] != inputs[p]; }
        bad += inputs[L] != 15;
        for (int p = 0; p <= 2 * L; p++) {
            if (targets[p] == TASK_IGNORE) { continue; }
            n++;
            bad += p < L || p >= 2 * L || targets[p] != inputs[p + 1];  // SEP -> reverse(src)[0], then the next token
        }
        bad += n != L;
    }
    check(bad == 0, "palindrome: src, SEP = V-1, reverse(src); L labels at SEP..2L-1, each the next token", "%d bad", bad);
}

// ----------------------------------------------------------------------------------------------------------
// stack (spec 8.4): replay the operations with an independent set of stacks

// Returns the number of inconsistencies of one sequence; counts pushes and the operations with a choice.
static int stack_replay(const int* inputs, const int* targets, int L, long* pushes, long* choices) {
    int stack[STACK_COUNT][400], depth[STACK_COUNT] = {0}, bad = 0, p = 0;
    for (; p + 3 <= L; p += 3) {
        int any = 0;
        for (int s = 0; s < STACK_COUNT; s++) { any |= depth[s] > 0; }
        int sid = inputs[p + 1];
        if (sid < 0 || sid >= STACK_COUNT) { return bad + 1; }
        *choices += any;
        if (inputs[p] == STACK_PUSH) {
            *pushes += any;
            int v = inputs[p + 2];
            bad += v < STACK_VALUE0 || v >= STACK_VALUE0 + STACK_VALUES || targets[p] != TASK_IGNORE ||
                   targets[p + 1] != TASK_IGNORE || targets[p + 2] != TASK_IGNORE;
            stack[sid][depth[sid]++] = v;
        } else if (inputs[p] == STACK_POP) {  // a pop from a non-empty stack, its value the label at sid
            if (depth[sid] == 0) { return bad + 1; }
            bad += inputs[p + 2] != STACK_QUERY || targets[p] != TASK_IGNORE || targets[p + 2] != TASK_IGNORE ||
                   targets[p + 1] != stack[sid][--depth[sid]];
        } else {
            return bad + 1;
        }
    }
    for (; p < L; p++) { bad += inputs[p] < STACK_NOISE0 || inputs[p] >= STACK_VOCAB || targets[p] != TASK_IGNORE; }
    return bad;
}

static void test_stack(void) {
    Task t = {TASK_STACK, STACK_VOCAB, 100, 0};
    int L = t.len, inputs[100], targets[100], bad = 0;
    long pushes = 0, choices = 0, dummy = 0;
    for (int i = 0; i < 3000; i++) {
        task_example(&t, L, SPLIT_TRAIN, 9, (uint64_t)i, inputs, targets);
        bad += stack_replay(inputs, targets, L, &pushes, &choices);
    }
    check(bad == 0, "stack: PUSH sid val / POP sid QUERY replay consistently; pop labels are the popped tops", "%d bad", bad);
    // push_prob 0.6 whenever some stack is non-empty: binomial, 4 standard deviations
    double frac = (double)pushes / choices, sd = sqrt(0.6 * 0.4 / choices);
    check(fabs(frac - 0.6) < 4 * sd, "stack: pushes are 60% of the operations with a non-empty stack",
          "%.4f of %ld, 4 sd = %.4f", frac, choices, 4 * sd);
    // negative control: a label changed to another value must be caught by the replay
    task_example(&t, L, SPLIT_TRAIN, 9, 0, inputs, targets);
    for (int p = 0; p < L; p++) {
        if (targets[p] != TASK_IGNORE) { targets[p] = STACK_VALUE0 + (targets[p] - STACK_VALUE0 + 1) % STACK_VALUES; break; }
    }
    int found = stack_replay(inputs, targets, L, &dummy, &dummy);
    check(found > 0, "stack negative control: a wrong pop label fails the replay", "%d inconsistencies found", found);
}

// ----------------------------------------------------------------------------------------------------------
// a5 (spec/kalman.md 8.1)

static int perm_parity(const unsigned char* p) {
    int inv = 0;
    for (int i = 0; i < 5; i++) { for (int j = i + 1; j < 5; j++) { inv += p[i] > p[j]; } }
    return inv % 2;
}

static void test_a5(void) {
    A5Group g;
    a5_build(&g);
    int bad_order = 0, bad_perm = 0;
    for (int a = 0; a < A5_ORDER; a++) {
        int seen = 0;
        for (int i = 0; i < 5; i++) { seen |= 1 << g.perm[a][i]; }
        bad_perm += seen != 31 || perm_parity(g.perm[a]);
        if (a > 0) { bad_order += memcmp(g.perm[a - 1], g.perm[a], 5) >= 0; }  // strictly increasing = distinct
    }
    check(bad_perm == 0 && bad_order == 0, "a5: 60 distinct even permutations of {0..4} in lexicographic order",
          "%d not even permutations, %d out of order", bad_perm, bad_order);
    int identity = 1, bad_id = 0, bad_closure = 0, bad_latin = 0, noncommuting = 0, bad_assoc = 0;
    for (int i = 0; i < 5; i++) { identity &= g.perm[0][i] == i; }
    for (int a = 0; a < A5_ORDER; a++) {
        bad_id += g.mul[0][a] != a || g.mul[a][0] != a;
        long row = 0, col = 0;
        for (int b = 0; b < A5_ORDER; b++) {
            unsigned char ab[5];  // the composition computed here, (a after b)[i] = a[b[i]]
            for (int i = 0; i < 5; i++) { ab[i] = g.perm[a][g.perm[b][i]]; }
            bad_closure += g.mul[a][b] >= A5_ORDER || memcmp(ab, g.perm[g.mul[a][b]], 5) != 0 || perm_parity(ab);
            row |= 1L << g.mul[a][b];
            col |= 1L << g.mul[b][a];
            noncommuting += g.mul[a][b] != g.mul[b][a];
            for (int c = 0; c < A5_ORDER; c++) { bad_assoc += g.mul[g.mul[a][b]][c] != g.mul[a][g.mul[b][c]]; }
        }
        bad_latin += row != (1L << A5_ORDER) - 1 || col != (1L << A5_ORDER) - 1;  // inverses exist, cancellation
    }
    check(identity && bad_id == 0, "a5: index 0 is the identity and the table's neutral element", "%d bad", bad_id);
    check(bad_closure == 0, "a5: closure, the table is the composition a[b[i]] and stays even", "%d bad", bad_closure);
    check(bad_assoc == 0 && bad_latin == 0, "a5: associative, every row and column a permutation (a group)",
          "%d non-associative triples, %d bad rows", bad_assoc, bad_latin);
    check(noncommuting > 0, "a5: not commutative", "%d of 3600 ordered pairs do not commute", noncommuting);

    // sequences: recompute the running product by composing permutation arrays, s_t = x_t after s_{t-1};
    // the mirrored product (s_{t-1} after x_t) must disagree (the generator's order is the spec's)
    Task t = {TASK_A5, A5_ORDER, 12, 0};
    int inputs[12], targets[12], bad = 0, mirrored_same = 0;
    for (int i = 0; i < 500; i++) {
        task_example(&t, 12, SPLIT_TRAIN, 2, (uint64_t)i, inputs, targets);
        unsigned char s[5] = {0, 1, 2, 3, 4}, m[5] = {0, 1, 2, 3, 4}, next[5];
        int same = 1;
        for (int p = 0; p < 12; p++) {
            const unsigned char* x = g.perm[inputs[p]];
            for (int k = 0; k < 5; k++) { next[k] = x[s[k]]; }
            memcpy(s, next, 5);
            for (int k = 0; k < 5; k++) { next[k] = m[x[k]]; }
            memcpy(m, next, 5);
            bad += targets[p] != a5_index(&g, s);
            same &= targets[p] == a5_index(&g, m);
        }
        mirrored_same += same;
    }
    check(bad == 0, "a5: every target is the running product s_t = x_t after s_{t-1}", "%d wrong", bad);
    check(mirrored_same < 500, "a5 negative control: the mirrored product disagrees", "%d of 500 agree", mirrored_same);
}

// ----------------------------------------------------------------------------------------------------------
// seeds: the same (seed, split, index) gives the same example; splits and seeds differ

static void test_seeds(void) {
    Task tasks[] = {{TASK_MQAR, 8192, 64, 8}, {TASK_MQAR_ZOOLOGY, 8192, 64, 8}, {TASK_SNIAH, 8192, 64, 1},
                    {TASK_PALINDROME, 128, 20, 0}, {TASK_STACK, 128, 64, 0}, {TASK_A5, 60, 40, 0}};
    for (size_t k = 0; k < sizeof(tasks) / sizeof(tasks[0]); k++) {
        const Task* t = &tasks[k];
        int T = task_seq_len(t, t->len);
        int *a = malloc_or_die(4 * T * sizeof(int)), *b = a + T, *c = a + 2 * T, *d = a + 3 * T;
        int same = 1, collisions = 0;
        for (int i = 0; i < 50; i++) {
            task_example(t, t->len, SPLIT_VAL, 42, (uint64_t)i, a, b);
            task_example(t, t->len, SPLIT_VAL, 42, (uint64_t)i, c, d);
            same &= memcmp(a, c, T * sizeof(int)) == 0 && memcmp(b, d, T * sizeof(int)) == 0;
            for (int split = SPLIT_TRAIN; split <= SPLIT_TEST; split += 2) {  // another split, or another seed
                for (int j = 0; j < 50; j++) {
                    task_example(t, t->len, split, 42, (uint64_t)j, c, d);
                    collisions += memcmp(a, c, T * sizeof(int)) == 0;
                }
            }
            task_example(t, t->len, SPLIT_VAL, 43, (uint64_t)i, c, d);
            collisions += memcmp(a, c, T * sizeof(int)) == 0;
        }
        char name[128];
        snprintf(name, sizeof(name), "%s: a seed gives the same examples; train/val/test and another seed give others", TASK_NAMES[t->kind]);
        check(same && collisions == 0, name, "same %d, %d identical sequences across splits or seeds", same, collisions);
        free(a);
    }
}

// ----------------------------------------------------------------------------------------------------------
// the masked loss of train_kla.c: the mean over labelled positions, and its gradient

static void test_masked_loss(void) {
    Config c = {0};
    c.vocab_size = 12; c.padded_vocab_size = 128; c.max_seq_len = 16; c.num_layers = 1; c.channels = 16; c.num_heads = 2;
    c.lin_heads = 1; c.lin_dk = 8; c.lin_dv = 8; c.conv_size = 4; c.norm = NORM_LAYERNORM; c.mlp = MLP_GELU;
    c.mlp_hidden = 32; c.norm_eps = 1e-5f; c.l2norm_eps = 1e-6f; c.onorm_eps = 1e-5f; c.kaczmarz_eps = 1e-6f;
    c.mixer[0] = MIXER_GDN;
    Model m;
    model_build(&m, &c, 64);
    init_parameters(m.params_memory, &m.config, &m.table, 5);
    enum { B = 2, T = 10 };
    int inputs[B * T], full[B * T], masked[B * T], n = 0;
    uint64_t rng = 3;
    for (int i = 0; i < B * T; i++) {
        inputs[i] = rng_below(&rng, 12);
        full[i] = rng_below(&rng, 12);
        masked[i] = i % 3 == 0 ? full[i] : TASK_IGNORE;
        n += masked[i] >= 0;
    }
    // the masked loss is the mean of the full run's per-position losses over the labelled positions
    model_forward(&m, inputs, full, B, T);
    double sum = 0.0;
    for (int i = 0; i < B * T; i++) { if (masked[i] >= 0) { sum += m.acts.losses[i]; } }
    model_forward(&m, inputs, masked, B, T);
    check(m.num_labelled == n && fabs(model_mean_loss(&m) - sum / n) < 1e-6 * fabs(sum / n), "masked loss: the mean over the labelled positions only",
          "%d labelled (expected %d), loss %.7f, expected %.7f", m.num_labelled, n, model_mean_loss(&m), sum / n);

    // directional derivative along the gradient g: (L(w + eps g) - L(w - eps g)) / (2 eps) = |g|^2. Central
    // differences in fp32 with eps chosen so that eps |g|^2 ~ 1e-2: relative error ~1e-3 (round-off of the
    // loss, 1e-7 / 1e-2 = 1e-5, plus the O(eps^2) term); tolerance 1e-2.
    size_t np = m.num_parameters;
    float* grad_masked = malloc_or_die(np * sizeof(float));
    float* grad_full = malloc_or_die(np * sizeof(float));
    float* w0 = malloc_or_die(np * sizeof(float));
    memcpy(w0, m.params_memory, np * sizeof(float));
    model_zero_grad(&m);
    model_forward(&m, inputs, full, B, T);
    model_backward(&m, 1.0f);
    memcpy(grad_full, m.grads_memory, np * sizeof(float));
    model_zero_grad(&m);
    model_forward(&m, inputs, masked, B, T);
    model_backward(&m, 1.0f);
    memcpy(grad_masked, m.grads_memory, np * sizeof(float));
    double gg = 0.0, gf = 0.0, loss[2];
    for (size_t i = 0; i < np; i++) { gg += (double)grad_masked[i] * grad_masked[i]; gf += (double)grad_masked[i] * grad_full[i]; }
    double eps = 1e-2 / gg;
    for (int s = 0; s < 2; s++) {
        for (size_t i = 0; i < np; i++) { m.params_memory[i] = w0[i] + (float)((s ? -eps : eps) * grad_masked[i]); }
        model_forward(&m, inputs, masked, B, T);
        loss[s] = model_mean_loss(&m);
    }
    memcpy(m.params_memory, w0, np * sizeof(float));
    double fd = (loss[0] - loss[1]) / (2 * eps), rel[2] = {fabs(fd - gg) / fabs(fd), fabs(fd - gf) / fabs(fd)};
    check(rel[0] < 1e-2, "masked loss: its gradient matches a finite-difference directional derivative", "relative error %.2e", rel[0]);
    check(rel[1] > 1e-2, "masked loss negative control: the gradient of the unmasked loss does not match it", "relative error %.2e", rel[1]);
    free(grad_masked);
    free(grad_full);
    free(w0);
    model_free(&m);
}

int main(void) {
    test_mqar();
    test_mqar_zoology();
    test_palindrome();
    test_stack();
    test_a5();
    test_seeds();
    test_masked_loss();
    printf("test_tasks: %d failed\n", failures);
    return failures > 0;
}
