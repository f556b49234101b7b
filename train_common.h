/*
train_common.h: the parts of the training program that train_kla.c and train_kla.cu write against the same model
API (model_forward with m->mean_loss, decode_init / model_decode_step / decode_free leaving the next-token logits
in the host array d.logits): validation, sampling, the prompt, and the stop on divergence. Include it after the
trainer's model code.
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

// Mean loss over the first max_batches batches of the validation split (-1: all), in its fixed order.
static float validation_loss(Model* m, DataLoader* val, int max_batches) {
    dataloader_reset(val);
    int n = validation_batches(val, max_batches);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        dataloader_next_batch(val);
        model_forward(m, val->inputs, val->targets, (int)val->B, (int)val->T);
        sum += m->mean_loss;
    }
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

// --eval: the loss of the model on -j (-m batches, default all of them), printed, and appended to -o's main.log
// as `s:<step> evl:<loss> ppl:<perplexity> tok:<tokens>` (step: of the checkpoint's name, -1 if it has none).
static void evaluate_model(Model* m, const Options* opt) {
    const Config* cfg = &m->config;
    if (config_has_wpe(cfg) && opt->T > cfg->max_seq_len) { die("flag -t: %d exceeds the model's max_seq_len %d", opt->T, cfg->max_seq_len); }
    DataLoader val;
    validation_loader_init(&val, opt, cfg);
    FILE* log = NULL;
    if (opt->out_dir) {  // opened after the data is checked and before the evaluation runs
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
    if (log) {
        fprintf(log, "s:%lld evl:%.4f ppl:%.4f tok:%zu\n", (long long)checkpoint_step(opt->init_file), loss, exp(loss), tokens);
        fclose(log);
    }
    dataloader_free(&val);
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
static int64_t prepare_run_dir(Options* o, int argc, char** argv) {
    if (o->out_dir == NULL) {
        printf("note: no -o: nothing of this run is saved (no main.log, no checkpoints)\n");
        return -1;
    }
    prepare_output_dir(o->out_dir);
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
// steps again), so no step is logged twice. Returns whether the log keeps the validation loss of step `start`,
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
            int val = strcmp(kind, "tel") == 0;
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
// validations and samples left at their measured mean cost (one not yet measured counts nothing)

typedef struct {
    double val_s, sample_s;  // seconds spent so far
    int vals, samples;       // how many
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
    return eta;
}

#endif // TRAIN_KLA_TRAIN_COMMON_H
