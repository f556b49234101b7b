/*
train_common.h: the parts of the training program that train_kla.c and train_kla.cu write against the same model
API (model_forward with m->mean_loss, decode_init / model_decode_step / decode_free leaving the next-token logits
in the host array d.logits): validation, sampling, the prompt, and the stop on divergence. Include it after the
trainer's model code.
*/
#ifndef TRAIN_KLA_TRAIN_COMMON_H
#define TRAIN_KLA_TRAIN_COMMON_H

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
    dataloader_init(&val, opt->val_glob, opt->B, opt->T, 0, 1, 1, 0, cfg->vocab_size);
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

#endif // TRAIN_KLA_TRAIN_COMMON_H
