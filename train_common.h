/*
train_common.h: the training program of train_kla.c and train_kla.cu, written once against the model API both
trainers provide (model_forward, then model_mean_loss(m) and m->num_labelled, model_backward, model_update, ...;
in training model_accumulate_loss(m, micro_steps) after each micro-step's backward and model_take_step_loss(m)
once per step, after model_grad_norm, so that a micro-step does not wait for the GPU; decode_init /
model_decode_step / decode_free leaving the next-token logits in the host array d.logits): the
run directory and resume, validation, the synthetic tasks' evaluation, the multiple-choice evaluation
(HellaSwag), sampling, checkpoints, the stop on divergence, the step line and its ETA, and the loop itself
(train_main, at the end). Include it after the trainer's model code.
*/
#ifndef TRAIN_KLA_TRAIN_COMMON_H
#define TRAIN_KLA_TRAIN_COMMON_H

// The validation split (-j), the same for every run whatever its --rows, --shuffle and --seed: llm.c's contiguous
// rows (a batch is one span of B*T + 1 tokens), the spans visited in one fixed shuffled order (seed 0), so that
// the first -m batches are a representative sample of the whole split (documents are stored grouped by source).
static void validation_loader_init(DataLoader* val, const Options* opt, const Config* cfg) {
    dataloader_init(val, opt->val_glob, opt->B, opt->T, 0, 1, DL_ROWS_CONTIGUOUS, 1, 0, cfg->vocab_size);
}

// How many batches validation_loss averages: max_batches (-1: all), at most the whole split.
static int validation_batches(const DataLoader* val, int max_batches) {
    return max_batches < 0 || (size_t)max_batches > val->batches_per_epoch ? (int)val->batches_per_epoch : max_batches;
}

// This process's rank among the num_ranks processes of a multi-GPU run (train_kla.cu's multi_gpu.cuh; the CPU
// trainer is one process): set by train_main from trainer_ranks.
static int this_rank = 0, num_ranks = 1;

// Mean loss over the first max_batches batches of the validation split (-1: all), in its fixed order. With several
// ranks, rank r evaluates the batches i with i mod num_ranks = r, and the sum is taken over the ranks.
static float validation_loss(Model* m, DataLoader* val, int max_batches) {
    dataloader_reset(val);
    int n = validation_batches(val, max_batches);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        dataloader_next_batch(val);
        if (i % num_ranks != this_rank) { continue; }
        model_forward(m, val->inputs, val->targets, (int)val->B, (int)val->T);
        sum += model_mean_loss(m);
    }
    trainer_sum_over_ranks(&sum, 1);
    return (float)(sum / n);
}

// Print --samples continuations of the prompt, num_tokens each, sampled with --temperature and --top-k. The coins
// come from one stream seeded by --sample-seed, so a seed gives the same samples at every step of a run, and the
// first samples of a longer list are the samples of a shorter one.
static void generate(Model* m, const Tokenizer* tok, const uint32_t* prompt, size_t prompt_len, int num_tokens, const Options* opt) {
    uint64_t rng = (uint64_t)opt->sample_seed;
    printf("generating:\n---\n");
    for (int s = 0; s < opt->samples; s++) {
        DecodeState d;
        decode_init(&d, m, (int)prompt_len + num_tokens);
        for (size_t i = 0; i < prompt_len; i++) {
            tokenizer_print(tok, prompt[i]);
            model_decode_step(m, &d, (int)prompt[i]);
        }
        for (int i = 0; i < num_tokens; i++) {
            int next = sample_token(d.logits, m->config.vocab_size, opt->temperature, opt->top_k, rng_uniform(&rng));
            tokenizer_print(tok, (uint32_t)next);
            fflush(stdout);
            if (i + 1 < num_tokens) { model_decode_step(m, &d, next); }
        }
        printf("\n---\n");
        decode_free(&d);
    }
}

// The tokens the samples continue (--prompt encoded, else EOT), with the tokenizer loaded into tok; NULL (and
// tok untouched) without sampling (-g 0). The caller frees the array and the tokenizer.
static uint32_t* prepare_prompt(const Options* opt, const Config* cfg, Tokenizer* tok, size_t* prompt_len) {
    *prompt_len = 0;
    if (opt->gen_tokens == 0) { return NULL; }
    uint32_t* ids;
    tokenizer_init(tok, opt->tokenizer_path);
    if (opt->prompt) {
        ids = tokenizer_encode(tok, opt->prompt, strlen(opt->prompt), prompt_len);
    } else {
        ids = (uint32_t*)malloc_or_die(sizeof(uint32_t));
        ids[0] = (uint32_t)tok->eot_token;
        *prompt_len = 1;
    }
    if (*prompt_len == 0) { die("--prompt: encodes to zero tokens"); }
    if (config_has_wpe(cfg) && (int)*prompt_len + opt->gen_tokens > cfg->max_seq_len) {
        die("%s: %zu prompt tokens + %d generated exceed the model's max_seq_len %d", opt->generate > 0 ? "--generate" : "-g",
            *prompt_len, opt->gen_tokens, cfg->max_seq_len);
    }
    return ids;
}

// A non-finite loss or gradient norm stops the run, naming the last complete checkpoint.
static void stop_if_diverged(int step, double loss, float norm, const char* out_dir) {
    if (isfinite(loss) && isfinite(norm)) { return; }
    int64_t good = out_dir ? find_latest_checkpoint(out_dir) : -1;
    char where[4200] = "no checkpoint was written";
    if (good >= 0) { checkpoint_path(where, sizeof(where), out_dir, "model", good); }
    die("step %d: loss %f, grad norm %f: training diverged; stopping (last good checkpoint: %s)", step, loss, norm, where);
}

// The step of a checkpoint named as checkpoint_path names them (model_<8 or more digits>.bin), else -1.
static int64_t checkpoint_step(const char* path) {
    const char* name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t len = strlen(name), digits = len >= 18 ? len - 10 : 0;
    if (digits > 0 && strncmp(name, "model_", 6) == 0 && strspn(name + 6, "0123456789") == digits && strcmp(name + len - 4, ".bin") == 0) {
        return atoll(name + 6);
    }
    return -1;
}

// ----------------------------------------------------------------------------------------------------------
// multiple-choice evaluation (--hellaswag; README "HellaSwag"): llm.c's eval files, scored as llm.c scores them

// The eval file of --hellaswag, the examples scored (the first --hellaswag-max, 0 = all) and the batch length T:
// the positions of their longest row.
typedef struct {
    EvalFile file;
    int n, T;
} HellaSwag;

// A row is the context followed by one completion: its tokens but the last are the inputs, and the positions
// whose next token belongs to the completion are labelled with it (the context's next tokens are ignored).
static int hellaswag_row_positions(const EvalExample* x, int c) { return x->context_len + x->completion_len[c] - 1; }

// Loads --hellaswag (nothing without it: h->n = 0). A row longer than an all-attn model's position embedding is
// an error, before anything is trained.
static void hellaswag_open(HellaSwag* h, const Options* opt, const Config* cfg) {
    memset(h, 0, sizeof(*h));
    if (opt->hellaswag == NULL) { return; }
    evalfile_load(&h->file, opt->hellaswag, cfg->vocab_size);
    h->n = opt->hellaswag_max > 0 && opt->hellaswag_max < h->file.num_examples ? opt->hellaswag_max : h->file.num_examples;
    for (int i = 0; i < h->n; i++) {
        const EvalExample* x = &h->file.examples[i];
        for (int c = 0; c < EVAL_COMPLETIONS; c++) {
            int len = hellaswag_row_positions(x, c);
            if (config_has_wpe(cfg) && len > cfg->max_seq_len) {
                die("--hellaswag %s: example %d, completion %d: %d context + %d completion tokens need %d positions, more than the model's max_seq_len %d",
                    opt->hellaswag, i, c, x->context_len, x->completion_len[c], len, cfg->max_seq_len);
            }
            if (len > h->T) { h->T = len; }
        }
    }
}

// How many of the first h->n examples the model gets right. Each example gives EVAL_COMPLETIONS rows; a row's
// score is the mean loss over its completion's tokens, and the prediction is the row of the lowest score (the
// first of equals), llm.c's "acc_norm". The rows of all examples are one stream cut into batches of B rows of T
// positions, one row per sequence (a recurrent mixer's state must not carry one row into the next); the positions
// after a row's end, and the rows after the last, are padding: token 0, no label.
static int hellaswag_correct(Model* m, const HellaSwag* h, int B) {
    int T = h->T, rows = h->n * EVAL_COMPLETIONS;
    int* inputs = (int*)malloc_or_die((size_t)B * T * sizeof(int));
    int* targets = (int*)malloc_or_die((size_t)B * T * sizeof(int));
    float* score = (float*)malloc_or_die((size_t)rows * sizeof(float));
    for (int first = 0; first < rows; first += B) {
        for (int b = 0; b < B; b++) {
            int* in = inputs + (size_t)b * T;
            int* tg = targets + (size_t)b * T;
            for (int p = 0; p < T; p++) { in[p] = 0; tg[p] = TASK_IGNORE; }
            if (first + b >= rows) { continue; }
            const EvalExample* x = &h->file.examples[(first + b) / EVAL_COMPLETIONS];
            int c = (first + b) % EVAL_COMPLETIONS, ctx = x->context_len;
            for (int p = 0; p < hellaswag_row_positions(x, c); p++) {
                in[p] = p < ctx ? x->context[p] : x->completion[c][p - ctx];
                if (p + 1 >= ctx) { tg[p] = x->completion[c][p + 1 - ctx]; }
            }
        }
        model_forward(m, inputs, targets, B, T);
        const float* losses = model_position_losses(m);
        for (int b = 0; b < B && first + b < rows; b++) {
            double sum = 0.0;
            for (int p = 0; p < T; p++) { if (targets[(size_t)b * T + p] >= 0) { sum += losses[(size_t)b * T + p]; } }
            const EvalExample* x = &h->file.examples[(first + b) / EVAL_COMPLETIONS];
            score[first + b] = (float)(sum / x->completion_len[(first + b) % EVAL_COMPLETIONS]);
        }
    }
    int correct = 0;
    for (int i = 0; i < h->n; i++) {
        const float* s = score + (size_t)i * EVAL_COMPLETIONS;
        int best = 0;
        for (int c = 1; c < EVAL_COMPLETIONS; c++) { if (s[c] < s[best]) { best = c; } }
        correct += best == h->file.examples[i].label;
    }
    free(inputs);
    free(targets);
    free(score);
    return correct;
}

// The accuracy on stdout, `step <step> | hellaswag <correct>/<n> = <accuracy>`, and in main.log as llm.c writes
// it (llmc/logger.h's logger_log_eval, which its dev/vislog.ipynb plots as HellaSwag), `s:<step> eval:<accuracy>`.
static void hellaswag_report(Model* m, const HellaSwag* h, int B, long long step, FILE* log) {
    int correct = hellaswag_correct(m, h, B);
    double accuracy = (double)correct / h->n;
    printf("step %lld | hellaswag %d/%d = %.4f\n", step, correct, h->n, accuracy);
    if (log) { fprintf(log, "s:%lld eval:%.4f\n", step, accuracy); fflush(log); }
}

// --eval: the loss of the model on -j (-m batches, default all of them), printed, and appended to -o's main.log
// as `s:<step> evl:<loss> ppl:<perplexity> tok:<tokens>` (step: of the checkpoint's name, -1 if it has none); with
// --hellaswag, its accuracy too.
static void evaluate_model(Model* m, const Options* opt) {
    const Config* cfg = &m->config;
    if (config_has_wpe(cfg) && opt->T > cfg->max_seq_len) { die("flag -t: %d exceeds the model's max_seq_len %d", opt->T, cfg->max_seq_len); }
    HellaSwag hella;
    hellaswag_open(&hella, opt, cfg);
    DataLoader val;
    validation_loader_init(&val, opt, cfg);
    FILE* log = NULL;
    if (opt->out_dir) {  // opened after the data are checked and before the evaluation runs
        char path[4096];
        snprintf(path, sizeof(path), "%s/main.log", opt->out_dir);
        log = fopen(path, "a");
        if (log == NULL) { die("-o %s: cannot append to its main.log (%s)", opt->out_dir, strerror(errno)); }
    }
    int batches = validation_batches(&val, opt->val_batches);
    double loss = validation_loss(m, &val, opt->val_batches);
    size_t tokens = (size_t)batches * opt->B * opt->T;
    printf("eval | %s on %s | %d batches of %d x %d = %zu tokens | loss %.6f | perplexity %.4f\n", opt->init_file,
           opt->val_glob, batches, opt->B, opt->T, tokens, loss, exp(loss));
    long long step = (long long)checkpoint_step(opt->init_file);
    if (log) { fprintf(log, "s:%lld evl:%.4f ppl:%.4f tok:%zu\n", step, loss, exp(loss), tokens); }
    if (hella.n > 0) { hellaswag_report(m, &hella, opt->B, step, log); }
    if (log) { fclose(log); }
    dataloader_free(&val);
    evalfile_free(&hella.file);
}

// --eval and --generate: use the model loaded from -e, without training (no optimizer state, nothing written but
// the line --eval appends to main.log).
static void use_model_without_training(Model* m, const Options* opt) {
    if (opt->eval) { evaluate_model(m, opt); }
    if (opt->gen_tokens > 0) {
        Tokenizer tok;
        size_t prompt_len;
        uint32_t* prompt = prepare_prompt(opt, &m->config, &tok, &prompt_len);
        generate(m, &tok, prompt, prompt_len, opt->gen_tokens, opt);
        tokenizer_free(&tok);
        free(prompt);
    }
}

// ----------------------------------------------------------------------------------------------------------
// the output directory and resuming (README "Run directories")

// main.log and the checkpoint files (model_, state_, DONE_ and their temporary .tmp names) are a run's files
static int is_run_file(const char* name) {
    if (strcmp(name, "main.log") == 0 || strcmp(name, "main.log.tmp") == 0) { return 1; }
    const char* kinds[3] = {"model_", "state_", "DONE_"};
    for (int k = 0; k < 3; k++) {
        size_t len = strlen(kinds[k]);
        if (strncmp(name, kinds[k], len) == 0 && isdigit((unsigned char)name[len])) { return 1; }
    }
    return 0;
}

// How many run files dir holds; with delete_them, each is deleted.
static int run_files(const char* dir, int delete_them) {
    DIR* d = opendir(dir);
    if (d == NULL) { return 0; }
    int count = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        if (!is_run_file(e->d_name)) { continue; }
        count++;
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (delete_them && remove(path) != 0) { die("--overwrite: cannot delete %s (%s)", path, strerror(errno)); }
    }
    closedir(d);
    return count;
}

// The value of flag `name` in a block of run flags (name, value, name, value, ... each NUL-terminated), or NULL.
static const char* run_flag_value(const char* text, int bytes, const char* name) {
    for (int i = 0; i < bytes;) {
        const char* key = text + i;
        i += (int)strlen(key) + 1;
        if (i >= bytes) { return NULL; }
        const char* value = text + i;
        i += (int)strlen(value) + 1;
        if (strcmp(key, name) == 0) { return value; }
    }
    return NULL;
}

// -y 1: the run's flags come back from the state file of the checkpoint at `step`. A flag given on the command
// line wins, with one line saying so where its value differs. The options are parsed again from the kept flags
// followed by the command line (of two values of one flag, the later wins).
static void take_run_flags(Options* o, int argc, char** argv, int64_t step) {
    char path[4096];
    checkpoint_path(path, sizeof(path), o->out_dir, "state", step);
    TrainState kept;
    int32_t header[256];
    fclose(open_state_file(&kept, header, path));
    for (int i = 0; i < o->num_flags; i++) {
        const Flag* f = &o->flags[i];
        if (!f->run_flag || !f->given) { continue; }
        const char* now = run_flag_value(o->run_flags, o->run_flags_bytes, f->name);
        const char* before = run_flag_value(kept.run_flags, kept.run_flags_bytes, f->name);
        if (before == NULL || strcmp(now, before) != 0) { printf("%s %s overrides the run's %s\n", f->name, now, before ? before : "(none)"); }
    }
    // the merged command line and its strings live as long as the program (the options point into them): held by
    // statics, so they stay reachable to the end
    static char* text;
    static char** merged;
    text = (char*)malloc_or_die((size_t)kept.run_flags_bytes);
    memcpy(text, kept.run_flags, (size_t)kept.run_flags_bytes);
    merged = (char**)malloc_or_die((size_t)(argc + kept.run_flags_bytes) * sizeof(char*));
    int n = 0;
    merged[n++] = argv[0];
    for (int i = 0; i < kept.run_flags_bytes; i += (int)strlen(text + i) + 1) { merged[n++] = text + i; }
    if (o->task_name != NULL) {  // --task given again: the kept defaults of the flags a task refuses are left out
        int kept_n = 1;
        for (int i = 1; i + 1 < n; i += 2) {
            if (!task_ignores_flag(merged[i])) { merged[kept_n++] = merged[i]; merged[kept_n++] = merged[i + 1]; }
        }
        n = kept_n;
    }
    for (int i = 1; i < n; i += 2) {
        const Flag* f = find_flag(o->flags, o->num_flags, merged[i]);
        if (f == NULL || !f->run_flag || i + 1 >= n) { die("%s: the run's flags hold '%s', which is not a run flag with a value", path, merged[i]); }
    }
    for (int a = 1; a < argc; a++) { merged[n++] = argv[a]; }
    parse_options(o, n, merged);
    // `given` then says what this command line typed, not what the run kept: the checks that refuse a flag in a
    // context (a task run refuses -i, -t, -g, ...) must not see the kept defaults as given
    for (int i = 0; i < o->num_flags; i++) {
        Flag* f = &o->flags[i];
        f->given = 0;
        for (int a = 1; a < argc; a += 2) { f->given |= strcmp(argv[a], f->name) == 0; }
    }
}

// What a run does with -o, before anything is loaded: without -o it says that nothing will be saved; a fresh run
// refuses a directory that holds another run's files (a mixed log, stale checkpoints that a later -y 1 would
// take), unless --overwrite 1 deletes them first; -y 1 takes the run's flags back from its newest complete
// checkpoint. Returns that checkpoint's step, or -1 for a run from step 0.
// With several ranks, only rank 0 checks and deletes; the others only take the resumed run's flags back.
static int64_t prepare_run_dir(Options* o, int argc, char** argv) {
    if (o->out_dir == NULL) {
        printf("note: no -o: nothing of this run is saved (no main.log, no checkpoints)\n");
        return -1;
    }
    if (this_rank == 0) { prepare_output_dir(o->out_dir); }
    if (o->resume == 0 && this_rank != 0) { return -1; }
    if (o->resume == 0) {
        int n = run_files(o->out_dir, 0);
        if (n > 0 && o->overwrite == 0) {
            int64_t newest = find_latest_checkpoint(o->out_dir);
            die("-o %s already holds a run (%d files, newest complete checkpoint: %s%lld): resume it with -y 1, choose another -o, "
                "or pass --overwrite 1 to delete its log and checkpoints first", o->out_dir, n, newest >= 0 ? "step " : "none", newest >= 0 ? (long long)newest : 0LL);
        }
        if (n > 0) { run_files(o->out_dir, 1); printf("--overwrite 1: deleted the %d files of the run in %s\n", n, o->out_dir); }
        return -1;
    }
    int64_t step = find_resumable_checkpoint(o->out_dir);
    if (step < 0) {
        printf("no complete checkpoint in %s: starting from scratch\n", o->out_dir);
        return -1;
    }
    take_run_flags(o, argc, argv, step);
    return step;
}

// -y 1 with nothing left to train says so and ends the program with exit code 0.
static void exit_if_nothing_to_do(int64_t resume_step, int max_steps, const char* out_dir) {
    if (resume_step < 0 || resume_step < max_steps) { return; }
    printf("nothing to do: the newest checkpoint in %s is at step %lld and the run ends at step %d; pass -x above %lld to train on\n",
           out_dir, (long long)resume_step, max_steps, (long long)resume_step);
    exit(0);
}

// A warmup as long as the run leaves the schedule no steps at the peak and none of decay: say so (-u defaults to
// 20 steps, what `make run`'s 400 steps are tuned for).
static void note_if_all_warmup(const Options* o, int max_steps) {
    if (o->sched != SCHED_CONSTANT && o->warmup >= max_steps) {
        printf("note: the lr warmup (-u %d) spans all %d steps of the run; a smaller -u leaves steps for the schedule\n", o->warmup, max_steps);
    }
}

// The lines an interrupted run wrote to main.log after its checkpoint at `start` go (the resumed run writes those
// steps again), so no step is logged twice; the HellaSwag accuracy of step `start` goes too, and is evaluated
// again (the `eva` of `eval` is not `tel`). Returns whether the log keeps the validation loss of step `start`,
// which the resumed run then does not compute again (the same weights give the same loss).
static int trim_log_for_resume(const char* dir, int start) {
    char path[4096], line[1024];
    snprintf(path, sizeof(path), "%s/main.log", dir);
    FILE* in = fopen(path, "rb");
    if (in == NULL) { return 0; }
    AtomicFile af;
    atomic_open(&af, path);
    int kept_val = 0;
    while (fgets(line, sizeof(line), in) != NULL) {
        int s;
        char kind[4];
        if (sscanf(line, "s:%d %3[a-z]:", &s, kind) == 2) {  // s:<step> trl:... (update step+1) or s:<step> tel:...
            // the validation of the model after s updates: tel, and a task's val_len lines written with it
            int val = strcmp(kind, "tel") == 0 || strcmp(kind, "val") == 0;
            if (val ? s > start : s >= start) { continue; }
            kept_val |= val && s == start;
        }
        fwrite_or_die(line, strlen(line), af.f, af.tmp);
    }
    fclose(in);
    atomic_commit(&af);
    return kept_val;
}

// Missing default data or tokenizer: `make data` makes them (README "Quick start").
static void check_default_data(const Options* o) {
    struct { const char *flag, *value, *fallback; } globs[2] = {{"-i", o->train_glob, DEFAULT_TRAIN_GLOB}, {"-j", o->val_glob, DEFAULT_VAL_GLOB}};
    for (int i = 0; i < 2; i++) {
        if (strcmp(globs[i].value, globs[i].fallback) != 0) { continue; }
        glob_t g;
        int found = glob(globs[i].value, 0, NULL, &g) == 0 && g.gl_pathc > 0;
        globfree(&g);
        if (!found) { die("%s %s: no files match: the demo data is made by `make data` (or give your shards with -i and -j)", globs[i].flag, globs[i].value); }
    }
    if (o->gen_tokens > 0 && strcmp(o->tokenizer_path, DEFAULT_TOKENIZER) == 0 && access(o->tokenizer_path, R_OK) != 0) {
        die("--tokenizer %s: missing: it is made by `make data`", o->tokenizer_path);
    }
}

// ----------------------------------------------------------------------------------------------------------
// the ETA of the step line (README "Training output"): the steps left at the smoothed step time, plus the
// validations, HellaSwag evaluations and samples left at their measured mean cost (one not yet measured counts
// nothing)

typedef struct {
    double val_s, sample_s, hella_s;  // seconds spent so far
    int vals, samples, hellas;        // how many
} EvalTimes;

// How many of the loop iterations step+1 .. max_steps run an event of every `every` steps (0: the last only):
// the multiples of `every`, and the last iteration, which always runs it.
static int events_left(int step, int max_steps, int every) {
    int n = every > 0 ? max_steps / every - step / every : 0;
    return n + (every == 0 || max_steps % every != 0);
}

static double eta_seconds(const Options* o, const EvalTimes* t, int step, int max_steps, double step_ms) {
    double eta = step_ms * (max_steps - step - 1) / 1000.0;
    if (t->vals > 0) { eta += t->val_s / t->vals * events_left(step, max_steps, o->val_every); }
    if (t->samples > 0 && o->gen_tokens > 0) { eta += t->sample_s / t->samples * events_left(step, max_steps, o->sample_every); }
    if (t->hellas > 0) { eta += t->hella_s / t->hellas * events_left(step, max_steps, o->hellaswag_every); }
    return eta;
}

// ----------------------------------------------------------------------------------------------------------
// synthetic tasks (README "Synthetic tasks", tasks.h): accuracy over the labelled positions

// Loss and token accuracy over the labelled positions of n_batches batches of B generated examples of `split`
// at length parameter len. The examples are the same at every call, so numbers compare across steps.
static void task_evaluate(Model* m, const Task* t, int len, int split, uint64_t seed, int B, int n_batches,
                          float* loss, float* accuracy) {
    int T = task_seq_len(t, len);
    int* inputs = (int*)malloc_or_die((size_t)B * T * sizeof(int));
    int* targets = (int*)malloc_or_die((size_t)B * T * sizeof(int));
    double loss_sum = 0.0;
    long labelled = 0, correct = 0;
    for (int i = 0; i < n_batches; i++) {
        task_batch(t, len, split, seed, (uint64_t)i * B, B, inputs, targets);
        model_forward(m, inputs, targets, B, T);
        loss_sum += (double)model_mean_loss(m) * m->num_labelled;
        model_count_correct(m, targets, B * T, &labelled, &correct);
    }
    *loss = labelled > 0 ? (float)(loss_sum / labelled) : 0.0f;
    *accuracy = labelled > 0 ? (float)correct / labelled : 0.0f;
    free(inputs);
    free(targets);
}

// The task's evaluation at the training length and at each --task-eval length: one line per length on stdout
// and in main.log. An all-attn model has a learned position embedding of max_seq_len rows and cannot run longer
// sequences: those lengths are skipped with a note (the recurrent mixers have no position embedding).
static void task_report(Model* m, const Options* opt, int split, int step, FILE* log) {
    int lens[MAX_EVAL_LENS + 1], n = 0;
    lens[n++] = opt->task.len;
    for (int i = 0; i < opt->num_eval_lens; i++) { if (opt->eval_lens[i] != opt->task.len) { lens[n++] = opt->eval_lens[i]; } }
    int batches = opt->val_batches > 0 ? opt->val_batches : (2000 + opt->B - 1) / opt->B;  // -1: the spec's 2000 sequences
    const char* name = split == SPLIT_TEST ? "test" : "val";
    for (int i = 0; i < n; i++) {
        int T = task_seq_len(&opt->task, lens[i]);
        if (config_has_wpe(&m->config) && T > m->config.max_seq_len) {
            printf("step %4d/%d | %s len %d | skipped: %d tokens exceed attn's learned position embedding (max_seq_len %d)\n",
                   step, opt->max_steps, name, lens[i], T, m->config.max_seq_len);
            continue;
        }
        float loss, accuracy;
        task_evaluate(m, &opt->task, lens[i], split, (uint64_t)opt->seed, opt->B, batches, &loss, &accuracy);
        printf("step %4d/%d | %s len %d | loss %.6f | accuracy %.4f\n", step, opt->max_steps, name, lens[i], loss, accuracy);
        if (log) {
            if (split == SPLIT_VAL && i == 0) { fprintf(log, "s:%d tel:%.4f\n", step, loss); }
            fprintf(log, "s:%d %s_len:%d loss:%.4f acc:%.4f\n", step, name, lens[i], loss, accuracy);
            fflush(log);
        }
    }
}

// ----------------------------------------------------------------------------------------------------------
// the training program, written once for both trainers. Besides the model API above (model_forward,
// model_backward, model_accumulate_loss, model_take_step_loss, model_zero_grad, model_grad_norm, model_update,
// model_read_state, model_write_checkpoint, model_count_correct, model_position_losses, model_free, decode), each
// trainer supplies:
//   trainer_open_model(m, path, opt)   the model of a file (path), or with path NULL one built from opt->config and
//                                      initialised from --seed
//   trainer_describe(buf, n)           the run table's "compute" row
//   trainer_peak_flops()               the peak FLOP/s the step line's MFU counts against (0: no MFU)
//   trainer_step_begin(m), trainer_step_end(m, timed)   around each optimizer step (the GPU: its profile marks,
//                                      and waiting for the step to finish before it is timed)
//   trainer_finish(m, timed_steps)     after the loop (the GPU: its profile)
//   trainer_memory(buf, n)             the summary line's memory field ("" for none)
//   trainer_ranks(&rank, &num_ranks)   which of the run's processes this is (the CPU: 0 of 1)
//   trainer_sum_over_ranks(v, n)       v[0..n) = their sums over the ranks, on every rank (the CPU: nothing)
//   model_reduce_gradients(m)          the gradients -> their mean over the ranks (the CPU: nothing)
// With several ranks (train_kla.cu's multi_gpu.cuh) every rank runs this program on its part of each batch: rank 0
// alone writes main.log and the checkpoints (the others print nothing), every rank evaluates the validation
// batches that are its share, and every rank computes the task and HellaSwag evaluations whole (only rank 0's
// are printed).

// Runs what the flags ask: --eval / --generate on the model of -e, or a training run (fresh, from -e, or -y 1
// resuming the newest checkpoint of -o). Returns the exit code.
static int train_main(Options* opt, int argc, char** argv) {
    trainer_ranks(&this_rank, &num_ranks);
    if (num_ranks > 1 && (opt->generate > 0 || opt->eval)) {
        die("%s runs in one process: start it without mpirun or srun", opt->generate > 0 ? "--generate" : "--eval");
    }
    if (opt->generate > 0 || opt->eval) {  // --generate, --eval: use the model of -e and exit, no training
        Model model;
        trainer_open_model(&model, opt->init_file, opt);
        check_model_flags(&model.config, opt->flags, opt->num_flags, opt->init_file);
        use_model_without_training(&model, opt);
        model_free(&model);
        return 0;
    }
    int64_t resume_step = prepare_run_dir(opt, argc, argv);
    if (opt->task.kind == TASK_NONE) { check_default_data(opt); }

    // ---- the model: from the newest checkpoint (-y 1), from a file (-e), or a fresh random init
    Model model;
    static TrainState state;  // static: zeroed, and its flag block stays off the stack
    char path[4096];
    if (resume_step >= 0) {
        checkpoint_path(path, sizeof(path), opt->out_dir, "model", resume_step);
        trainer_open_model(&model, path, opt);
        check_model_flags(&model.config, opt->flags, opt->num_flags, path);
        use_checkpoint_task(opt, &model.config, path);
        printf("resuming from %s (step %lld)\n", path, (long long)resume_step);
    } else if (opt->init_file) {
        trainer_open_model(&model, opt->init_file, opt);
        check_model_flags(&model.config, opt->flags, opt->num_flags, opt->init_file);
        use_checkpoint_task(opt, &model.config, opt->init_file);
    } else {
        trainer_open_model(&model, NULL, opt);
    }
    const Config* cfg = &model.config;
    int task = opt->task.kind != TASK_NONE;  // the data come from tasks.h's generator (spec-defined synthetic tasks)
    if (config_has_wpe(cfg) && opt->T > cfg->max_seq_len) {
        die("flag %s: sequence length %d exceeds the model's max_seq_len %d", task ? "--task-len" : "-t", opt->T, cfg->max_seq_len);
    }
    HellaSwag hella;
    hellaswag_open(&hella, opt, cfg);

    // ---- data (token shards, or a task's generator: one micro-batch of inputs and targets) and tokenizer
    DataLoader train_loader = {0}, val_loader = {0};
    int *task_inputs = NULL, *task_targets = NULL;
    if (task) {
        task_inputs = (int*)malloc_or_die((size_t)opt->B * opt->T * sizeof(int));
        task_targets = (int*)malloc_or_die((size_t)opt->B * opt->T * sizeof(int));
    } else {
        dataloader_init(&train_loader, opt->train_glob, opt->B, opt->T, this_rank, num_ranks, opt->rows, opt->shuffle,
                        (uint64_t)opt->seed, cfg->vocab_size);
        validation_loader_init(&val_loader, opt, cfg);
    }
    // a step is grad_accum micro-batches of B x T on each rank; -d 0 (the default): one micro-batch per rank
    int rank_batch = opt->B * opt->T * num_ranks;
    if (opt->total_batch == 0) { opt->total_batch = rank_batch; }
    if (opt->total_batch % rank_batch != 0) {
        die("flag -d: %d is not a multiple of B*T*ranks = %d*%d*%d", opt->total_batch, opt->B, opt->T, num_ranks);
    }
    int grad_accum = opt->total_batch / rank_batch;
    if (opt->max_steps == -1) {
        opt->max_steps = (int)(train_loader.batches_per_epoch / grad_accum);
        if (opt->max_steps < 1) { die("-i %s: one epoch holds fewer than one step of %d tokens; lower -d", opt->train_glob, opt->total_batch); }
    }
    exit_if_nothing_to_do(resume_step, opt->max_steps, opt->out_dir);
    note_if_all_warmup(opt, opt->max_steps);
    Tokenizer tokenizer;
    size_t prompt_len;
    uint32_t* prompt_ids = prepare_prompt(opt, cfg, &tokenizer, &prompt_len);
    if (resume_step >= 0) {
        checkpoint_path(path, sizeof(path), opt->out_dir, "state", resume_step);
        model_read_state(&model, &state, path);
        if (state.step != resume_step) { die("%s: holds step %lld, expected %lld", path, (long long)state.step, (long long)resume_step); }
        if (!task) { dataloader_set_state(&train_loader, &state.loader); }  // a task's stream is a function of the step
    }
    // the checkpoints keep the flags of this run (the command line over those of a resumed run)
    memcpy(state.run_flags, opt->run_flags, (size_t)opt->run_flags_bytes);
    state.run_flags_bytes = opt->run_flags_bytes;

    // ---- the parameter table
    char compute[320];
    trainer_describe(compute, sizeof(compute), cfg);
    print_run_table(cfg, model.num_parameters, opt, train_loader.num_tokens, val_loader.num_tokens, resume_step >= 0,
                    grad_accum, num_ranks, opt->max_steps, compute);

    // rank 0 alone writes main.log (and the checkpoints), and tells the others whether it kept the validation
    FILE* log = NULL;
    int start = (int)state.step;
    double val_kept = this_rank == 0 && resume_step >= 0 && trim_log_for_resume(opt->out_dir, start);
    trainer_sum_over_ranks(&val_kept, 1);
    int val_logged_at_start = val_kept > 0.0;
    if (opt->out_dir && this_rank == 0) {
        snprintf(path, sizeof(path), "%s/main.log", opt->out_dir);
        log = fopen_or_die(path, resume_step >= 0 ? "a" : "w");
    }

    // ---- the loop. Iteration `step` evaluates the model after `step` updates, then makes update step+1.
    double ema_ms = 0.0, timed_ms = 0.0, peak = trainer_peak_flops();
    double flops_per_token = model_flops_per_token(cfg, opt->T, NULL);
    int timed_steps = 0;
    EvalTimes eval = {0, 0, 0, 0, 0, 0};
    for (int step = start; step <= opt->max_steps; step++) {
        int last = step == opt->max_steps;
        int evaluate = ((opt->val_every > 0 && step % opt->val_every == 0) || last) && !(step == start && val_logged_at_start);
        double t_eval = now_seconds();
        if (evaluate && task) {
            task_report(&model, opt, SPLIT_VAL, step, log);
            if (last) { task_report(&model, opt, SPLIT_TEST, step, log); }  // the held-out numbers to report
        } else if (evaluate) {
            float vl = validation_loss(&model, &val_loader, opt->val_batches);
            printf("step %4d/%d | val loss %.6f\n", step, opt->max_steps, vl);
            if (log) { fprintf(log, "s:%d tel:%.4f\n", step, vl); fflush(log); }
        }
        if (evaluate) {
            eval.val_s += now_seconds() - t_eval;
            eval.vals++;
        }
        if (hella.n > 0 && ((opt->hellaswag_every > 0 && step % opt->hellaswag_every == 0) || last)) {
            double t0 = now_seconds();
            hellaswag_report(&model, &hella, opt->B, step, log);
            eval.hella_s += now_seconds() - t0;
            eval.hellas++;
        }
        if (opt->gen_tokens > 0 && this_rank == 0 && ((opt->sample_every > 0 && step % opt->sample_every == 0 && step > start) || last)) {
            double t0 = now_seconds();
            generate(&model, &tokenizer, prompt_ids, prompt_len, opt->gen_tokens, opt);
            eval.sample_s += now_seconds() - t0;
            eval.samples++;
        }
        if (opt->out_dir && step > start && ((opt->ckpt_every > 0 && step % opt->ckpt_every == 0) || last)) {
            state.step = step;
            if (!task) { dataloader_get_state(&train_loader, &state.loader); }
            model_write_checkpoint(&model, &state, opt->out_dir);  // every rank: ZeRO's state is gathered
            if (this_rank == 0) { delete_old_checkpoints(opt->out_dir, opt->ckpt_keep); }
            printf("wrote checkpoint %s/model_%08d.bin\n", opt->out_dir, step);
        }
        if (last) { break; }

        double t0 = now_seconds();
        int timed = step - start >= 10;  // the summary skips 10 warm-up steps
        trainer_step_begin(&model);
        model_zero_grad(&model);
        for (int micro = 0; micro < grad_accum; micro++) {
            if (task) {  // micro-batch (step*grad_accum+micro)*num_ranks+rank of the training stream: resumes with no state
                uint64_t first = (((uint64_t)step * grad_accum + micro) * num_ranks + this_rank) * opt->B;
                task_batch(&opt->task, opt->task.len, SPLIT_TRAIN, (uint64_t)opt->seed, first, opt->B, task_inputs, task_targets);
                model_forward(&model, task_inputs, task_targets, opt->B, opt->T);
            } else {
                dataloader_next_batch(&train_loader);
                model_forward(&model, train_loader.inputs, train_loader.targets, opt->B, opt->T);
            }
            model_backward(&model, 1.0f / grad_accum);
            model_accumulate_loss(&model, grad_accum);   // the mean of the micro-batches' means, kept on the GPU
        }
        // the gradients and the loss of the global batch: means over the ranks. The loss is read after the norm,
        // which waits for the gradients: the micro-steps above never wait for the GPU.
        model_reduce_gradients(&model);
        float norm = model_grad_norm(&model);
        double loss = model_take_step_loss(&model);
        trainer_sum_over_ranks(&loss, 1);
        loss /= num_ranks;
        stop_if_diverged(step + 1, loss, norm, opt->out_dir);
        float grad_scale = opt->grad_clip > 0.0f && norm > opt->grad_clip ? opt->grad_clip / norm : 1.0f;
        float step_lr = learning_rate(opt->sched, step, opt->max_steps, opt->warmup, opt->lr, opt->final_frac);
        model_update(&model, step_lr, opt->beta1, opt->beta2, opt->adam_eps, opt->weight_decay, grad_scale, step + 1);
        trainer_step_end(&model, timed);
        double ms = (now_seconds() - t0) * 1000.0, tok_s = opt->total_batch / (ms / 1000.0);
        ema_ms = step == start ? ms : 0.9 * ema_ms + 0.1 * ms;
        if (timed) {
            timed_ms += ms;
            timed_steps++;
        }
        double eta = eta_seconds(opt, &eval, step, opt->max_steps, ema_ms);
        char mfu[32] = "";
        if (peak > 0.0) { snprintf(mfu, sizeof(mfu), " | mfu %.1f%%", 100.0 * tok_s * flops_per_token / peak); }
        printf("step %4d/%d | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s%s | eta %dm%02ds\n", step + 1,
               opt->max_steps, loss, step_lr, norm, ms, tok_s, mfu, (int)(eta / 60), (int)eta % 60);
        fflush(stdout);
        if (log) { fprintf(log, "s:%d trl:%.4f lr:%.6f norm:%.2f\n", step, loss, step_lr, norm); fflush(log); }
    }
    if (timed_steps > 0) {  // the step time after the warm-up (scripts/bench_gpu.sh reads this line)
        double ms = timed_ms / timed_steps, tok_s = opt->total_batch / (ms / 1000.0);
        char mfu[32] = "", memory[64] = "";
        if (peak > 0.0) { snprintf(mfu, sizeof(mfu), " | mfu %.1f%%", 100.0 * tok_s * flops_per_token / peak); }
        trainer_memory(memory, sizeof(memory));
        printf("summary | ms/step %.2f | tok/s %.0f%s%s\n", ms, tok_s, mfu, memory);
    }
    trainer_finish(&model, timed_steps);

    if (log) { fclose(log); }
    if (opt->gen_tokens > 0) { tokenizer_free(&tokenizer); }
    free(prompt_ids);
    evalfile_free(&hella.file);
    if (!task) {
        dataloader_free(&train_loader);
        dataloader_free(&val_loader);
    }
    free(task_inputs);
    free(task_targets);
    model_free(&model);
    return 0;
}

#endif // TRAIN_KLA_TRAIN_COMMON_H
