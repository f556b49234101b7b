/*
train_common.h: the parts of the training program that train_kla.c and train_kla.cu write against the same model
API (model_forward with m->mean_loss, decode_init / model_decode_step / decode_free leaving the next-token logits
in the host array d.logits): validation, sampling, the prompt, and the stop on divergence. Include it after the
trainer's model code.
*/
#ifndef TRAIN_KLA_TRAIN_COMMON_H
#define TRAIN_KLA_TRAIN_COMMON_H

// Mean loss over the first max_batches batches of the validation split (-1: all), in its fixed order.
static float validation_loss(Model* m, DataLoader* val, int max_batches) {
    dataloader_reset(val);
    int n = max_batches < 0 || (size_t)max_batches > val->batches_per_epoch ? (int)val->batches_per_epoch : max_batches;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        dataloader_next_batch(val);
        model_forward(m, val->inputs, val->targets, (int)val->B, (int)val->T);
        sum += m->mean_loss;
    }
    return (float)(sum / n);
}

static void generate(Model* m, const Tokenizer* tok, const uint32_t* prompt, size_t prompt_len, int num_tokens, float temperature) {
    DecodeState d;
    decode_init(&d, m, (int)prompt_len + num_tokens);
    uint64_t rng = 1337;  // fixed, so samples at different steps are comparable
    printf("generating:\n---\n");
    for (size_t i = 0; i < prompt_len; i++) {
        tokenizer_print(tok, prompt[i]);
        model_decode_step(m, &d, (int)prompt[i]);
    }
    for (int i = 0; i < num_tokens; i++) {
        int next = sample_token(d.logits, m->config.vocab_size, temperature, rng_uniform(&rng));
        tokenizer_print(tok, (uint32_t)next);
        fflush(stdout);
        if (i + 1 < num_tokens) { model_decode_step(m, &d, next); }
    }
    printf("\n---\n");
    decode_free(&d);
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
        die("-g: %zu prompt tokens + %d generated exceed the model's max_seq_len %d", *prompt_len, opt->gen_tokens, cfg->max_seq_len);
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

#endif // TRAIN_KLA_TRAIN_COMMON_H
