/*
tasks.h: the built-in synthetic tasks the seed papers argue with (--task), generated on the fly in C.

Every example is a fixed-length int sequence inputs[0..T-1] with targets[0..T-1]; TASK_IGNORE (-100) marks a
position that costs nothing and is not scored. Targets are NOT shifted (spec/gdn_kaczmarz.md 8): the logits at
position p are scored against targets[p]. Each example is a pure function of (seed, split, length, index), so the
training stream needs no state to resume, the train / validation / test splits use disjoint seeds, and a seed makes
the same data on every run and machine. The RNG is splitmix64, not numpy's PCG64: the distributions are the
specs', the bits are not the reference code's.

    mqar           spec/gdn_kaczmarz.md 8.1 (the KLA paper's mqar_data.py)
    mqar-zoology   spec/pdn.md 8.1 = spec/gka.md 12.1 (Zoology's multiquery_ar)
    sniah          spec/gdn_kaczmarz.md 8.2 (mqar with one pair)
    palindrome     spec/gdn_kaczmarz.md 8.3
    stack          spec/gdn_kaczmarz.md 8.4
    a5             spec/kalman.md 8.1 (the A5 word problem, without the optional BOS token)
*/
#ifndef TRAIN_KLA_TASKS_H
#define TRAIN_KLA_TASKS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "utils.h"

#define TASK_IGNORE (-100)

enum { TASK_NONE, TASK_MQAR, TASK_MQAR_ZOOLOGY, TASK_SNIAH, TASK_PALINDROME, TASK_STACK, TASK_A5, NUM_TASKS };
// index = the id stored in checkpoint header slot 34 (FORMATS.md); TASK_NONE = token shards
static const char* TASK_NAMES[NUM_TASKS] = {"none", "mqar", "mqar-zoology", "sniah", "palindrome", "stack", "a5"};

enum { SPLIT_TRAIN = 0, SPLIT_VAL = 1, SPLIT_TEST = 2 };

typedef struct {
    int kind;   // TASK_*
    int vocab;  // the task's vocabulary (the model's vocab_size)
    int len;    // the training length parameter: the sequence length, except palindrome's source length
    int pairs;  // key-value pairs of mqar, mqar-zoology (sniah: 1); 0 for the others
} Task;

// stack (spec 8.4): token ids
enum { STACK_COUNT = 64, STACK_VALUE0 = 64, STACK_VALUES = 26, STACK_PUSH = 90, STACK_POP = 91, STACK_QUERY = 92,
       STACK_NOISE0 = 93, STACK_VOCAB = 128 };
#define A5_ORDER 60

// The task's defaults (the specs' paper settings): vocabulary, training length, pairs.
static inline void task_defaults(int kind, int* vocab, int* len, int* pairs) {
    *pairs = 0;
    switch (kind) {
        case TASK_MQAR: *vocab = 8192; *len = 256; *pairs = 32; break;          // spec 8.1
        case TASK_MQAR_ZOOLOGY: *vocab = 8192; *len = 256; *pairs = 32; break;  // spec/pdn.md 8.1 grid (256, 32)
        case TASK_SNIAH: *vocab = 8192; *len = 1024; *pairs = 1; break;         // spec 8.2
        case TASK_PALINDROME: *vocab = 128; *len = 1024; break;                 // spec 8.3
        case TASK_STACK: *vocab = STACK_VOCAB; *len = 1024; break;              // spec 8.4
        default: *vocab = A5_ORDER; *len = 20; break;                           // spec/kalman.md 8.1: T in 2..20
    }
}

// The number of tokens the model sees for length parameter len (palindrome: source, SEP, reversed source).
static inline int task_seq_len(const Task* t, int len) { return t->kind == TASK_PALINDROME ? 2 * len + 1 : len; }

// NULL when the task can run at length parameter len, else why not (for a one-line error naming the flag).
static inline const char* task_length_problem(const Task* t, int len, char* buf, size_t size) {
    switch (t->kind) {
        case TASK_MQAR:
        case TASK_SNIAH:  // the prefix of 2D tokens, then queries at positions [2D, len-2): needs len >= 2D + 3
            if (len < 2 * t->pairs + 3) {
                snprintf(buf, size, "length %d is too short for %d pairs (needs >= 2*pairs + 3 = %d)", len, t->pairs, 2 * t->pairs + 3);
                return buf;
            }
            return NULL;
        case TASK_MQAR_ZOOLOGY:  // Zoology asserts 4P <= L, L even
            if (len % 2 != 0 || len < 4 * t->pairs) {
                snprintf(buf, size, "length %d does not hold %d pairs (needs an even length >= 4*pairs = %d)", len, t->pairs, 4 * t->pairs);
                return buf;
            }
            return NULL;
        case TASK_STACK:  // one operation (3 tokens) at least
            if (len < 3) { snprintf(buf, size, "length %d is too short (needs >= 3, one stack operation)", len); return buf; }
            return NULL;
        default:  // palindrome: a source of >= 1 token; a5: >= 1 element
            if (len < 1) { snprintf(buf, size, "length %d is too short (needs >= 1)", len); return buf; }
            return NULL;
    }
}

// NULL when the task's vocabulary is usable, else why not.
static inline const char* task_vocab_problem(const Task* t, char* buf, size_t size) {
    int fixed = t->kind == TASK_STACK ? STACK_VOCAB : t->kind == TASK_A5 ? A5_ORDER : 0;
    if (fixed && t->vocab != fixed) { snprintf(buf, size, "%s has a fixed vocabulary of %d, not %d", TASK_NAMES[t->kind], fixed, t->vocab); return buf; }
    if (t->vocab < 4) { snprintf(buf, size, "vocabulary %d is too small (needs >= 4)", t->vocab); return buf; }
    return NULL;
}

// NULL when the number of pairs suits the task and its vocabulary, else why not.
static inline const char* task_pairs_problem(const Task* t, char* buf, size_t size) {
    int has_pairs = t->kind == TASK_MQAR || t->kind == TASK_MQAR_ZOOLOGY || t->kind == TASK_SNIAH;
    if (!has_pairs && t->pairs != 0) { snprintf(buf, size, "%s has no key-value pairs", TASK_NAMES[t->kind]); return buf; }
    if (t->kind == TASK_SNIAH && t->pairs != 1) { snprintf(buf, size, "sniah has exactly one pair (spec 8.2), not %d", t->pairs); return buf; }
    if (has_pairs && t->pairs < 1) { snprintf(buf, size, "%d pairs: needs >= 1", t->pairs); return buf; }
    if (t->kind == TASK_MQAR_ZOOLOGY && t->pairs > t->vocab / 2 - 1) {  // distinct keys from [1, V/2)
        snprintf(buf, size, "%d distinct keys do not fit in the %d key ids [1, %d)", t->pairs, t->vocab / 2 - 1, t->vocab / 2);
        return buf;
    }
    return NULL;
}

static inline int task_is_valid(const Task* t) {
    char buf[160];
    return t->kind > TASK_NONE && t->kind < NUM_TASKS && task_vocab_problem(t, buf, sizeof(buf)) == NULL &&
           task_pairs_problem(t, buf, sizeof(buf)) == NULL && task_length_problem(t, t->len, buf, sizeof(buf)) == NULL;
}

// ----------------------------------------------------------------------------------------------------------
// random draws from splitmix64

// uniform integer in [0, n) (multiply-shift; the bias is below 2^-32 for the small n here)
static inline int rng_below(uint64_t* s, int n) { return (int)(((rng_next(s) >> 32) * (uint64_t)n) >> 32); }
// uniform double in [0, 1) with 53 random bits
static inline double rng_double(uint64_t* s) { return (double)(rng_next(s) >> 11) / 9007199254740992.0; }

// The seed of one example: a hash of (seed, split, length, index), each step a splitmix64 output, so that the
// streams of different examples do not overlap (consecutive raw splitmix states would be shifted copies).
static inline uint64_t task_example_seed(uint64_t seed, int split, int len, uint64_t index) {
    uint64_t s = index, h = rng_next(&s);
    s = h ^ (uint64_t)(uint32_t)len;
    h = rng_next(&s);
    s = h ^ (uint64_t)split;
    h = rng_next(&s);
    s = h ^ seed;
    return rng_next(&s);
}

// ----------------------------------------------------------------------------------------------------------
// the generators: each fills inputs[0..T-1] and targets[0..T-1] of one example, T = task_seq_len(t, len)

// spec 8.1 step 4: a query position drawn by inverse-CDF from the power law p(x) ~ x^-alpha on [lo, hi)
static inline int mqar_query_position(double u, int lo, int hi, double alpha) {
    double e = 1.0 - alpha, a = pow((double)lo, e), b = pow((double)hi, e);
    int pos = (int)floor(pow(u * (b - a) + a, 1.0 / e));
    return pos < lo ? lo : pos >= hi ? hi - 1 : pos;  // guard the float rounding at the ends
}

// KLA MQAR (spec 8.1; sniah is this with one pair, spec 8.2). key_len 1, alpha 0.1.
static inline void mqar_generate(int* inputs, int* targets, int V, int L, int D, uint64_t* rng) {
    int prefix = 2 * D, half = V / 2;
    int* order = (int*)malloc_or_die((size_t)D * sizeof(int));
    for (int j = 0; j < D; j++) {
        inputs[2 * j] = rng_below(rng, half);                 // key in [0, V/2), with replacement
        inputs[2 * j + 1] = half + rng_below(rng, V - half);  // value in [V/2, V)
    }
    for (int p = 0; p < L; p++) { targets[p] = TASK_IGNORE; }
    for (int p = prefix; p < L; p++) { inputs[p] = rng_below(rng, V); }  // noise from the full vocabulary
    for (int j = 0; j < D; j++) { order[j] = j; }
    for (int j = D - 1; j > 0; j--) {  // the pairs in a random order (Fisher-Yates)
        int k = rng_below(rng, j + 1), tmp = order[j];
        order[j] = order[k];
        order[k] = tmp;
    }
    for (int i = 0; i < D; i++) {  // a later query at the same position overwrites an earlier one
        int j = order[i], pos = mqar_query_position(rng_double(rng), prefix, L - 2, 0.1);
        inputs[pos] = inputs[2 * j];
        targets[pos] = inputs[2 * j + 1];  // the value is not inserted after the query: the next input stays noise
    }
    free(order);
}

// Zoology MQAR (spec/pdn.md 8.1): distinct keys in [1, V/2), distinct values in [V/2, V), power_a 0.01, queries at
// recency-biased even gaps drawn without replacement; the target sits at the query key's input position (the
// generator's one-token shift of step 6 already applied).
static inline void mqar_zoology_generate(int* inputs, int* targets, int V, int L, int P, uint64_t* rng) {
    const double power_a = 0.01;
    int half = V / 2, space = (L - 2 * P) / 2;
    double* weight = (double*)malloc_or_die((size_t)space * sizeof(double));
    for (int p = 0; p < L; p++) { inputs[p] = 0; targets[p] = TASK_IGNORE; }
    for (int j = 0; j < P; j++) {  // distinct keys and values by rejection (the flags check P <= V/2 - 1)
        int key, value, dup;
        do {
            key = 1 + rng_below(rng, half - 1);
            dup = 0;
            for (int i = 0; i < j; i++) { dup |= inputs[2 * i] == key; }
        } while (dup);
        do {
            value = half + rng_below(rng, V - half);
            dup = 0;
            for (int i = 0; i < j; i++) { dup |= inputs[2 * i + 1] == value; }
        } while (dup);
        inputs[2 * j] = key;
        inputs[2 * j + 1] = value;
    }
    // weights p_i = power_a * i^(power_a - 1), i = gap + 1; a sequential draw renormalised after each pick
    // has the distribution of numpy's choice(replace=False, p=...)
    double total = 0.0;
    for (int g = 0; g < space; g++) { weight[g] = power_a * pow(g + 1.0, power_a - 1.0); total += weight[g]; }
    for (int j = 0; j < P; j++) {
        double r = rng_double(rng) * total, cdf = 0.0;
        int gap = -1;
        for (int g = 0; g < space; g++) {
            if (weight[g] == 0.0) { continue; }
            gap = g;  // the last still-available gap also catches rounding at the top
            cdf += weight[g];
            if (r < cdf) { break; }
        }
        total -= weight[gap];
        weight[gap] = 0.0;
        int pos = 2 * P + 2 * gap;
        inputs[pos] = inputs[2 * j];
        targets[pos] = inputs[2 * j + 1];
    }
    for (int p = 2 * P; p < L; p++) {  // step 7: the remaining zeros become uniform noise over the whole vocabulary
        if (inputs[p] == 0) { inputs[p] = rng_below(rng, V); }
    }
    free(weight);
}

// Palindrome (spec 8.3, --predict_first_token): src (L tokens in [0, V-1)), SEP = V-1, reverse(src); the SEP
// position predicts reverse(src)[0], positions L+1..2L-1 the next input token, all else ignored (L labels).
static inline void palindrome_generate(int* inputs, int* targets, int V, int L, uint64_t* rng) {
    int sep = V - 1;
    for (int i = 0; i < L; i++) { inputs[i] = rng_below(rng, sep); }
    inputs[L] = sep;
    for (int i = 0; i < L; i++) { inputs[L + 1 + i] = inputs[L - 1 - i]; }
    for (int p = 0; p < 2 * L + 1; p++) { targets[p] = p >= L && p < 2 * L ? inputs[p + 1] : TASK_IGNORE; }
}

// Stack (spec 8.4): 3-token operations `PUSH sid val` (all stacks empty, or with probability 0.6) or
// `POP sid QUERY` with the popped value as the target at the sid position; the L mod 3 tail is noise.
static inline void stack_generate(int* inputs, int* targets, int L, uint64_t* rng) {
    // the stacks as linked lists over the pushed values: top[s] = the newest entry of stack s, or -1
    int max_push = L / 3;
    int* value = (int*)malloc_or_die((size_t)max_push * sizeof(int));
    int* below = (int*)malloc_or_die((size_t)max_push * sizeof(int));
    int top[STACK_COUNT], nonempty[STACK_COUNT], pushed = 0;
    for (int s = 0; s < STACK_COUNT; s++) { top[s] = -1; }
    int p = 0;
    for (; p + 3 <= L; p += 3) {
        int n = 0;
        for (int s = 0; s < STACK_COUNT; s++) { if (top[s] >= 0) { nonempty[n++] = s; } }
        if (n == 0 || rng_double(rng) < 0.6) {
            int sid = rng_below(rng, STACK_COUNT), val = STACK_VALUE0 + rng_below(rng, STACK_VALUES);
            value[pushed] = val;
            below[pushed] = top[sid];
            top[sid] = pushed++;
            inputs[p] = STACK_PUSH; inputs[p + 1] = sid; inputs[p + 2] = val;
            targets[p] = targets[p + 1] = targets[p + 2] = TASK_IGNORE;
        } else {
            int sid = nonempty[rng_below(rng, n)];
            inputs[p] = STACK_POP; inputs[p + 1] = sid; inputs[p + 2] = STACK_QUERY;
            targets[p] = TASK_IGNORE; targets[p + 1] = value[top[sid]]; targets[p + 2] = TASK_IGNORE;
            top[sid] = below[top[sid]];
        }
    }
    for (; p < L; p++) { inputs[p] = STACK_NOISE0 + rng_below(rng, STACK_VOCAB - STACK_NOISE0); targets[p] = TASK_IGNORE; }
    free(value);
    free(below);
}

// A5 (spec/kalman.md 8.1): the 60 even permutations of {0..4}, indexed in lexicographic order (0 = identity);
// mul[a][b] = index(a after b), (a after b)[i] = a[b[i]].
typedef struct {
    unsigned char perm[A5_ORDER][5];
    unsigned char mul[A5_ORDER][A5_ORDER];
} A5Group;

static inline int a5_index(const A5Group* g, const unsigned char* p) {
    for (int k = 0; k < A5_ORDER; k++) { if (memcmp(g->perm[k], p, 5) == 0) { return k; } }
    return -1;
}

static inline void a5_build(A5Group* g) {
    int n = 0;
    for (int code = 0; code < 3125; code++) {  // every 5-digit base-5 word in increasing order = lexicographic
        unsigned char p[5];
        int c = code, seen = 0, inversions = 0;
        for (int i = 4; i >= 0; i--) { p[i] = (unsigned char)(c % 5); c /= 5; }
        for (int i = 0; i < 5; i++) { seen |= 1 << p[i]; }
        if (seen != 31) { continue; }  // not a permutation
        for (int i = 0; i < 5; i++) { for (int j = i + 1; j < 5; j++) { inversions += p[i] > p[j]; } }
        if (inversions % 2 == 0) { memcpy(g->perm[n++], p, 5); }
    }
    for (int a = 0; a < A5_ORDER; a++) {
        for (int b = 0; b < A5_ORDER; b++) {
            unsigned char ab[5];
            for (int i = 0; i < 5; i++) { ab[i] = g->perm[a][g->perm[b][i]]; }
            g->mul[a][b] = (unsigned char)a5_index(g, ab);
        }
    }
}

// x_t uniform over the group, s_t = mul[x_t][s_{t-1}] from the identity; the target at every position is s_t.
static inline void a5_generate(int* inputs, int* targets, int L, uint64_t* rng) {
    static A5Group g;  // a constant table, built on first use
    static int built = 0;
    if (!built) { a5_build(&g); built = 1; }
    int s = 0;
    for (int t = 0; t < L; t++) {
        inputs[t] = rng_below(rng, A5_ORDER);
        s = g.mul[inputs[t]][s];
        targets[t] = s;
    }
}

// One example of split `split` at length parameter len: inputs and targets of task_seq_len(t, len) ints.
static inline void task_example(const Task* t, int len, int split, uint64_t seed, uint64_t index, int* inputs, int* targets) {
    uint64_t rng = task_example_seed(seed, split, len, index);
    switch (t->kind) {
        case TASK_MQAR:
        case TASK_SNIAH: mqar_generate(inputs, targets, t->vocab, len, t->pairs, &rng); break;
        case TASK_MQAR_ZOOLOGY: mqar_zoology_generate(inputs, targets, t->vocab, len, t->pairs, &rng); break;
        case TASK_PALINDROME: palindrome_generate(inputs, targets, t->vocab, len, &rng); break;
        case TASK_STACK: stack_generate(inputs, targets, len, &rng); break;
        case TASK_A5: a5_generate(inputs, targets, len, &rng); break;
        default: die("internal: task_example of task %d", t->kind);
    }
}

// B consecutive examples, first..first+B-1, as rows of [B, T] arrays.
static inline void task_batch(const Task* t, int len, int split, uint64_t seed, uint64_t first, int B, int* inputs, int* targets) {
    int T = task_seq_len(t, len);
    for (int b = 0; b < B; b++) {
        task_example(t, len, split, seed, first + (uint64_t)b, inputs + (size_t)b * T, targets + (size_t)b * T);
    }
}

// Counts the labelled positions of [N, Vp] logits (first V columns scored) and those whose argmax is the target.
static inline void task_count_correct(const float* logits, const int* targets, int N, int V, int Vp, long* labelled, long* correct) {
    for (int i = 0; i < N; i++) {
        if (targets[i] < 0) { continue; }
        const float* z = logits + (size_t)i * Vp;
        int best = 0;
        for (int v = 1; v < V; v++) { if (z[v] > z[best]) { best = v; } }
        *labelled += 1;
        *correct += best == targets[i];
    }
}

#endif // TRAIN_KLA_TASKS_H
