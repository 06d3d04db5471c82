/* gpt: trains a character-level GPT on Debian's fortunes with ct (or a
 * GPT on llm.c's token shards).
 *
 *   gpt [options]         (gpt --help lists every flag with its default)
 *
 * The model, the data and the recipe are those of bench/gpt_torch.py, its
 * PyTorch reference, and docs/gpt.md is the model card:
 *   - the corpus is the plain-text files of DIR (default
 *     /usr/share/games/fortunes) in name order, one byte a token; 90%
 *     trains and 10% validates;
 *   - row r of step s's batch is a window at a SplitMix64-drawn offset, so
 *     that any run, any rank count and the reference draw the same batches;
 *   - AdamW (betas 0.9, 0.99; no decay on biases and norms), linear warmup
 *     then cosine decay to --min-lr, gradient clipping at --clip.
 * By default it trains for --time 600 seconds: after 12 steps it fixes the
 * run's length from their rate, and again after 120, so that the cosine
 * ends on time. --steps N trains exactly N steps instead.
 *
 * Every --log-every steps rank 0 appends the loss, lr and tokens/s to
 * --metrics (JSON lines), and every --eval-every steps the validation loss
 * over --eval-batches batches; at the end, the validation loss over the
 * whole split, then a sample of --sample-tokens characters from --prompt.
 * Progress (loss, tokens/s, ETA) goes to stderr; the last line of stdout is
 * a JSON summary. --plot renders the metrics to a PNG.
 *
 * --threads defaults to CT_NUM_THREADS, else the machine's cores shared
 * among the ranks a launcher starts on it. --bench measures throughput
 * only: no validation and no sample at the end.
 *
 * Under a launcher (`ctlaunch -np 2 gpt`, `mpirun -np 2 gpt`) each rank
 * takes its share of every global batch and ct_ddp averages gradients in
 * backward. --checkpoint-dir DIR resumes from the newest checkpoint there
 * and saves one every --save-every steps and at the end.
 * --checkpoint-activations recomputes each block in backward instead of
 * keeping its activations. --init starts from weights in a safetensors
 * file (PyTorch's names: transformer.wte.weight, ...; lm_head.weight, the
 * tied head, may be present and must then equal transformer.wte.weight) or
 * in llm.c's checkpoint format, whose sizes the model takes.
 *
 * --data FILE.bin (or a pattern) trains on llm.c's token shards instead
 * of text, validating on --val-data's (docs/llmc.md); --export-llmc saves
 * the trained model for llm.c's train_gpt2. A resumed run trains on to
 * --steps and one already complete says so and exits 0 (docs/cli.md).
 */
#define _POSIX_C_SOURCE 200809L

#include "example_common.h"
#include "metrics_plot.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NAME         "gpt"
#define FORTUNES_DIR "/usr/share/games/fortunes"
/* --time: the run's length in steps is estimated after RATE_STEPS steps,
 * and again, from a longer sample, after REFINE_STEPS (still about the
 * warmup's end, before the cosine has gone far). */
#define RATE_STEPS    12
#define REFINE_STEPS  120
#define UNTIMED_STEPS 2 /* left out of tokens/s: the first steps fault memory in */

typedef struct options {
    ct_gpt_config model; /* vocab from the corpus */
    int64_t batch, steps, warmup, eval_every, eval_batches, log_every;
    int64_t sample_tokens;
    example_resume resume;
    int shard; /* ct_ddp_shard */
    example_plan plan;
    double time, lr, min_lr, weight_decay, clip, temperature;
    uint64_t seed;
    int threads; /* 0: the machine's cores, shared among the local ranks */
    bool bench;  /* throughput only: no validation or sample at the end */
    const char *metrics, *plot, *init, *prompt, *data;
    const char *val_data, *tokenizer, *export_llmc; /* llm.c's files (docs/llmc.md) */
    int64_t vocab;  /* token shards: the vocabulary (text: the corpus's bytes) */
    bool init_llmc; /* --init is llm.c's checkpoint, whose sizes the model takes */
    struct {
        bool layers, heads, width, context, vocab;
    } given;
    ct_device device;
} options;

static const char about[] =
    "Trains a character-level GPT on Debian's fortunes (or the text files of --data)\n"
    "with ct, then samples from it (docs/gpt.md). Under a launcher each rank takes\n"
    "its share of every global batch. --checkpoint-dir resumes from the newest\n"
    "checkpoint there and trains on to --steps (docs/cli.md).";

/* Parses argv into o, which holds the defaults; -1 after printing why. */
static int parse_args(int argc, char **argv, options *o) {
    bool steps_given = false, time_given = false;
    const ct_cli_flag mine[] = {
        CT_CLI_FLAG("--layers", CT_CLI_INT64, &o->model.layers, "N", "transformer blocks", .min = 1,
                    .max = 1024, .given = &o->given.layers),
        CT_CLI_FLAG("--heads", CT_CLI_INT64, &o->model.heads, "N",
                    "attention heads (they divide --width)", .min = 1, .max = 1024,
                    .given = &o->given.heads),
        CT_CLI_FLAG("--width", CT_CLI_INT64, &o->model.width, "N", "the embedding width", .min = 1,
                    .max = 1 << 16, .given = &o->given.width),
        CT_CLI_FLAG("--context", CT_CLI_INT64, &o->model.context, "N",
                    "tokens the model sees at once", .min = 1, .max = 1 << 20,
                    .given = &o->given.context),
        CT_CLI_FLAG("--dropout", CT_CLI_DOUBLE, &o->model.dropout, "X", "dropout probability",
                    .min = 0, .max = 1),
        CT_CLI_FLAG("--batch", CT_CLI_INT64, &o->batch, "N",
                    "the global batch in windows, shared among the ranks", .min = 1,
                    .max = 1 << 24),
        CT_CLI_FLAG("--steps", CT_CLI_INT64, &o->steps, "N", "train exactly N steps in all",
                    .min = 1, .max = 1e15, .default_text = "", .given = &steps_given),
        CT_CLI_FLAG("--time", CT_CLI_DOUBLE, &o->time, "S",
                    "train for about S seconds, the length fixed from the first steps' rate",
                    .min = 1e-3, .max = 1e9, .default_text = "600 unless --steps",
                    .given = &time_given),
        CT_CLI_FLAG("--lr", CT_CLI_DOUBLE, &o->lr, "X", "the peak learning rate", .min = 1e-12,
                    .max = 1e6),
        CT_CLI_FLAG("--min-lr", CT_CLI_DOUBLE, &o->min_lr, "X", "where the cosine decay ends",
                    .min = 0, .max = 1e6),
        CT_CLI_FLAG("--warmup", CT_CLI_INT64, &o->warmup, "N",
                    "linear warmup steps (at most a fifth of the run)", .min = 0, .max = 1e15),
        CT_CLI_FLAG("--weight-decay", CT_CLI_DOUBLE, &o->weight_decay, "X",
                    "AdamW's decay of matrices and embeddings", .min = 0, .max = 1e3),
        CT_CLI_FLAG("--clip", CT_CLI_DOUBLE, &o->clip, "X", "the gradients' global norm limit",
                    .min = 1e-12, .max = 1e12),
        CT_CLI_FLAG("--seed", CT_CLI_UINT64, &o->seed, "N",
                    "the seed of the weights, the batches and the sample"),
        CT_CLI_FLAG("--threads", CT_CLI_INT, &o->threads, "N", "ct's threads in each rank",
                    .min = 1, .max = EXAMPLE_MAX_THREADS,
                    .default_text = "CT_NUM_THREADS if set, else the CPUs shared among the "
                                    "local ranks"),
        CT_CLI_FLAG("--eval-every", CT_CLI_INT64, &o->eval_every, "N",
                    "validate every N steps (0: at the end only)", .min = 0, .max = 1e15),
        CT_CLI_FLAG("--eval-batches", CT_CLI_INT64, &o->eval_batches, "N",
                    "batches each periodic validation reads", .min = 0, .max = 1e15),
        CT_CLI_FLAG("--log-every", CT_CLI_INT64, &o->log_every, "N",
                    "write a metrics line every N steps", .min = 1, .max = 1e15),
        CT_CLI_FLAG("--metrics", CT_CLI_STRING, &o->metrics, "FILE",
                    "JSON lines of the loss, lr and tokens/s; a resumed run appends",
                    .default_text = "none"),
        CT_CLI_FLAG("--plot", CT_CLI_STRING, &o->plot, "FILE.png",
                    "draw the metrics as a chart at the end (needs gnuplot and --metrics)"),
        CT_CLI_FLAG("--init", CT_CLI_STRING, &o->init, "FILE",
                    "start from these weights: safetensors with PyTorch's names, or llm.c's "
                    "checkpoint (gpt2_124M.bin), whose sizes the model then takes"),
        CT_CLI_FLAG("--checkpoint-activations", CT_CLI_SWITCH, &o->model.checkpoint, NULL,
                    "recompute each block in backward instead of keeping its activations"),
        CT_CLI_FLAG("--prompt", CT_CLI_STRING, &o->prompt, "TEXT",
                    "the start of the sample (characters of the corpus)"),
        CT_CLI_FLAG("--sample-tokens", CT_CLI_INT64, &o->sample_tokens, "N",
                    "characters sampled at the end", .min = 0, .max = 1e7),
        CT_CLI_FLAG("--temperature", CT_CLI_DOUBLE, &o->temperature, "X",
                    "the sample's softmax temperature", .min = 1e-6, .max = 1e6),
        CT_CLI_FLAG("--data", CT_CLI_STRING, &o->data, "DIR|SHARDS",
                    "the corpus: DIR's text files in name order, or llm.c token shards (a "
                    ".bin file or a pattern such as 'data/fineweb_train_*.bin')"),
        CT_CLI_FLAG("--val-data", CT_CLI_STRING, &o->val_data, "SHARDS",
                    "token shards to validate on (without it: the last tenth of --data)"),
        CT_CLI_FLAG("--vocab", CT_CLI_INT64, &o->vocab, "N",
                    "token shards: the vocabulary (from --init's file when it is llm.c's)",
                    .min = 2, .max = 65536, .given = &o->given.vocab),
        CT_CLI_FLAG("--tokenizer", CT_CLI_STRING, &o->tokenizer, "FILE",
                    "token shards: llm.c's tokenizer file, to print the sample as text"),
        CT_CLI_FLAG("--export-llmc", CT_CLI_STRING, &o->export_llmc, "FILE.bin",
                    "save the trained model in llm.c's checkpoint format at the end"),
        example_shard_flag(&o->shard),
        CT_CLI_FLAG("--device", CT_CLI_CUSTOM, &o->device, "cpu|cuda|cuda:N",
                    "where the model trains (cuda: each rank's own GPU)",
                    .parse = example_parse_device, .default_text = "cpu"),
        CT_CLI_FLAG("--bench", CT_CLI_SWITCH, &o->bench, NULL,
                    "measure throughput only: no validation and no sample at the end"),
    };
    enum { NMINE = sizeof mine / sizeof *mine };
    ct_cli_flag flags[NMINE + EXAMPLE_NUM_RESUME_FLAGS + EXAMPLE_NUM_PLAN_FLAGS];
    memcpy(flags, mine, sizeof mine);
    example_resume_flags(&o->resume, "also save every N steps (0: at the end only)", flags + NMINE);
    example_plan_flags(&o->plan, flags + NMINE + EXAMPLE_NUM_RESUME_FLAGS);
    ct_cli cli = {.prog = NAME,
                  .about = about,
                  .flags = flags,
                  .nflags = sizeof flags / sizeof *flags,
                  .epilog = "Exit codes: 0 done, 1 an error, 2 bad usage."};
    int first, rc = ct_cli_parse(&cli, argc, argv, &first);
    if (rc > 0)
        exit(0);
    if (rc)
        return -1;
    if (steps_given && time_given) {
        fprintf(stderr, NAME ": give --steps or --time, not both\n");
        return -1;
    }
    if (!steps_given && !time_given)
        o->time = 600;
    if (o->plot && !*o->metrics) {
        fprintf(stderr, NAME ": --plot draws the metrics file: it needs --metrics FILE\n");
        return -1;
    }
    return 0;
}

static int parse(int argc, char **argv, options *o) {
    *o = (options){.model = {.context = 128, .layers = 4, .heads = 4, .width = 128},
                   .batch = 32,
                   .warmup = 100,
                   .eval_every = 250,
                   .eval_batches = 16,
                   .log_every = 10,
                   .sample_tokens = 400,
                   .lr = 2e-3,
                   .min_lr = 2e-4,
                   .weight_decay = 0.1,
                   .clip = 1.0,
                   .temperature = 0.8,
                   .seed = 1,
                   .metrics = "",
                   .prompt = "Q: ",
                   .data = FORTUNES_DIR,
                   .vocab = 50257};
    return parse_args(argc, argv, o);
}

/* Whether path starts with llm.c's model magic (rather than safetensors'
 * header length). */
static bool is_llmc_model(const char *path) {
    FILE *f = fopen(path, "rb");
    unsigned char b[4] = {0};
    bool yes =
        f && fread(b, 1, 4, f) == 4 &&
        (uint32_t)(b[0] | b[1] << 8 | b[2] << 16 | (uint32_t)b[3] << 24) == CT_LLMC_GPT_MAGIC;
    if (f)
        fclose(f);
    return yes;
}

/* --init in llm.c's format: the model's sizes are the file's, and a flag
 * that says otherwise is an error rather than silently overridden. */
static int take_llmc_sizes(options *o) {
    ct_gpt_config cfg;
    if (ct_llmc_gpt_read_config(o->init, &cfg, NULL))
        return -1;
    struct {
        const char *flag;
        bool given;
        int64_t *mine, file;
    } sizes[] = {{"--layers", o->given.layers, &o->model.layers, cfg.layers},
                 {"--heads", o->given.heads, &o->model.heads, cfg.heads},
                 {"--width", o->given.width, &o->model.width, cfg.width},
                 {"--context", o->given.context, &o->model.context, cfg.context},
                 {"--vocab", o->given.vocab, &o->vocab, cfg.vocab}};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        if (sizes[i].given && *sizes[i].mine != sizes[i].file)
            return ct_seterr(CT_EINVAL, "%s %lld, but --init %s holds a model with %lld",
                             sizes[i].flag, (long long)*sizes[i].mine, o->init,
                             (long long)sizes[i].file);
        *sizes[i].mine = sizes[i].file;
    }
    o->init_llmc = true;
    return 0;
}

/* ----------------------------------------------------------------- corpus */

/* The text: a directory's bytes, each a token (its index in vocab), or
 * llm.c's token shards. Positions [0, ntrain) train and [ntrain, n)
 * validate: the last tenth of the text or of --data's tokens, or
 * --val-data's tokens. */
typedef struct corpus {
    uint8_t *ids;                        /* text: every byte as its index in vocab */
    ct_llmc_tokens *tokens, *val_tokens; /* shards; val_tokens NULL: the last tenth of tokens */
    ct_llmc_tokenizer *tokenizer;        /* --tokenizer, or NULL */
    int64_t n, ntrain;
    uint8_t vocab[256];
    int nvocab; /* the model's vocabulary */
} corpus;

static void corpus_free(corpus *c) {
    free(c->ids);
    ct_llmc_tokens_free(c->tokens);
    ct_llmc_tokens_free(c->val_tokens);
    ct_llmc_tokenizer_free(c->tokenizer);
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends the regular file path to c->ids. */
static int append_file(corpus *c, const char *path) {
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st)) {
        int rc = ct_seterr(CT_EIO, "%s: %s", path, strerror(errno));
        if (f)
            fclose(f);
        return rc;
    }
    uint8_t *grown = realloc(c->ids, (size_t)(c->n + st.st_size) + 1);
    size_t got = grown ? fread(grown + c->n, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    if (!grown)
        return ct_seterr(CT_ENOMEM, "%s: out of memory", path);
    c->ids = grown;
    if (got != (size_t)st.st_size)
        return ct_seterr(CT_EIO, "%s: read %zu of %lld bytes", path, got, (long long)st.st_size);
    c->n += st.st_size;
    return 0;
}

/* The corpus rule of docs/gpt.md: DIR's regular files (not links) whose
 * names do not end in ".dat", in byte order of their names. */
static int corpus_load(corpus *c, const char *dir) {
    *c = (corpus){0};
    DIR *d = opendir(dir);
    if (!d)
        return ct_seterr(CT_EIO, "%s: %s (install Debian's fortunes package: bash ci/setup.sh)",
                         dir, strerror(errno));
    char **names = NULL;
    size_t n = 0;
    int rc = 0;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if ((len >= 4 && !strcmp(e->d_name + len - 4, ".dat")) || lstat(path, &st) ||
            !S_ISREG(st.st_mode))
            continue;
        char **grown = realloc(names, sizeof *names * (n + 1));
        if (!grown || !(grown[n] = strdup(e->d_name)))
            rc = ct_seterr(CT_ENOMEM, "%s: out of memory", dir);
        names = grown ? grown : names;
        n += !rc;
    }
    closedir(d);
    if (n > 1)
        qsort(names, n, sizeof *names, by_name);
    for (size_t i = 0; i < n && !rc; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        rc = append_file(c, path);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
    if (!rc && c->n < 2)
        rc = ct_seterr(CT_EINVAL, "%s: no text to train on (install Debian's fortunes package)",
                       dir);
    if (rc)
        return rc;
    bool seen[256] = {false};
    for (int64_t i = 0; i < c->n; i++)
        seen[c->ids[i]] = true;
    uint8_t index[256];
    for (int b = 0; b < 256; b++)
        if (seen[b]) {
            index[b] = (uint8_t)c->nvocab;
            c->vocab[c->nvocab++] = (uint8_t)b;
        }
    for (int64_t i = 0; i < c->n; i++)
        c->ids[i] = index[c->ids[i]];
    c->ntrain = c->n * 9 / 10;
    return 0;
}

/* Whether --data names llm.c's token shards: a .bin file or a pattern
 * (docs/llmc.md); anything else is a directory of text. */
static bool is_token_shards(const char *data) {
    size_t len = strlen(data);
    return strpbrk(data, "*?[") || (len > 4 && !strcmp(data + len - 4, ".bin"));
}

/* --data (and --val-data, --tokenizer) as the corpus: a directory of text,
 * or llm.c's token shards over o->vocab tokens. */
static int corpus_open(corpus *c, const options *o) {
    if (!is_token_shards(o->data)) {
        if (o->val_data || o->tokenizer)
            return ct_seterr(CT_EINVAL,
                             "--val-data and --tokenizer are for token shards; --data "
                             "%s is a directory of text",
                             o->data);
        return corpus_load(c, o->data);
    }
    *c = (corpus){.nvocab = (int)o->vocab};
    if (!(c->tokens = ct_llmc_tokens_open(o->data)) ||
        (o->val_data && !(c->val_tokens = ct_llmc_tokens_open(o->val_data))) ||
        (o->tokenizer && !(c->tokenizer = ct_llmc_tokenizer_load(o->tokenizer))))
        return ct_errcode();
    /* Every token, before the first step: a bad one found by a batch
     * later would end the run there. */
    int rc = ct_llmc_tokens_check_vocab(c->tokens, o->vocab);
    if (!rc && c->val_tokens)
        rc = ct_llmc_tokens_check_vocab(c->val_tokens, o->vocab);
    if (!rc && c->tokenizer && ct_llmc_tokenizer_vocab(c->tokenizer) < o->vocab)
        rc = ct_seterr(CT_EINVAL, "--tokenizer %s knows %lld tokens, fewer than the model's %lld",
                       o->tokenizer, (long long)ct_llmc_tokenizer_vocab(c->tokenizer),
                       (long long)o->vocab);
    int64_t count = ct_llmc_tokens_count(c->tokens);
    c->ntrain = c->val_tokens ? count : count * 9 / 10;
    c->n = count + (c->val_tokens ? ct_llmc_tokens_count(c->val_tokens) : 0);
    return rc;
}

/* Output i (from 0) of SplitMix64 started at seed (Steele, Lea and Flood,
 * "Fast splittable pseudorandom number generators", OOPSLA 2014). */
static uint64_t splitmix64_n(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Inputs x and targets y [rows, T] of the windows starting at starts[]
 * (corpus positions, all in one split). */
static int windows(const corpus *c, const int64_t *starts, int64_t rows, int64_t t, ct_device dev,
                   ct_tensor **x, ct_tensor **y) {
    if (c->tokens) {
        /* --val-data's positions follow --data's. */
        bool val = c->val_tokens && rows > 0 && starts[0] >= c->ntrain;
        int64_t shifted[rows > 0 ? rows : 1];
        for (int64_t r = 0; r < rows; r++)
            shifted[r] = starts[r] - (val ? c->ntrain : 0);
        int rc = ct_llmc_tokens_windows(val ? c->val_tokens : c->tokens, shifted, rows, t, x, y);
        if (rc)
            return rc;
    } else {
        *x = ct_empty(CT_SHAPE(rows, t), CT_INT64);
        *y = ct_empty(CT_SHAPE(rows, t), CT_INT64);
        if (!*x || !*y)
            return ct_errcode();
        int64_t *px = ct_data_ptr(*x), *py = ct_data_ptr(*y);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < t; i++) {
                px[r * t + i] = c->ids[starts[r] + i];
                py[r * t + i] = c->ids[starts[r] + i + 1];
            }
    }
    *x = ct_to(*x, dev);
    *y = ct_to(*y, dev);
    return *x && *y ? 0 : ct_errcode();
}

/* This rank's rows of step's global batch (the batch rule of docs/gpt.md). */
static int train_batch(const corpus *c, const options *o, int64_t step, int rank, int ranks,
                       ct_tensor **x, ct_tensor **y) {
    int64_t t = o->model.context, lo = o->batch * rank / ranks, hi = o->batch * (rank + 1) / ranks;
    int64_t starts[hi - lo > 0 ? hi - lo : 1];
    uint64_t span = (uint64_t)(c->ntrain - t);
    for (int64_t r = lo; r < hi; r++)
        starts[r - lo] = (int64_t)(splitmix64_n(o->seed, (uint64_t)(step * o->batch + r)) % span);
    return windows(c, starts, hi - lo, t, o->device, x, y);
}

/* The validation split's whole batches of non-overlapping windows. */
static int64_t val_batches(const corpus *c, const options *o) {
    return (c->n - c->ntrain - 1) / o->model.context / o->batch;
}

/* ------------------------------------------------------------------ model */

static ct_tensor *loss_of(ct_module *gpt, ct_tensor *x, ct_tensor *y) {
    ct_tensor *logits = ct_module_forward(gpt, x);
    int64_t v = logits ? ct_size(logits, 2) : 0;
    return ct_cross_entropy(ct_reshape(logits, CT_SHAPE(-1, v)), ct_reshape(y, CT_SHAPE(-1)), NULL);
}

/* The mean loss over the first `limit` validation batches (all of them for
 * limit < 0), the batches shared out among the ranks. */
static int evaluate(ct_module *gpt, ct_ddp *ddp, const corpus *c, const options *o, int64_t limit,
                    ct_comm *world, double *loss) {
    int64_t nb = val_batches(c, o), t = o->model.context;
    if (limit >= 0 && limit < nb)
        nb = limit;
    int rank = ct_comm_rank(world), ranks = ct_comm_size(world);
    /* Ranks evaluate different numbers of batches: fully sharded, the
     * whole model is gathered first, so that forwards do not communicate. */
    int rc = ddp ? ct_ddp_summon_params(ddp, true) : 0;
    double sums[2] = {0, 0};
    ct_module_train(gpt, false);
    bool prev = ct_set_grad_enabled(false);
    for (int64_t b = rank; b < nb && !rc; b += ranks) {
        ct_scope_begin();
        int64_t starts[o->batch];
        for (int64_t r = 0; r < o->batch; r++)
            starts[r] = c->ntrain + (b * o->batch + r) * t;
        ct_tensor *x, *y;
        rc = windows(c, starts, o->batch, t, o->device, &x, &y);
        ct_tensor *l = rc ? NULL : loss_of(gpt, x, y);
        rc = l ? 0 : ct_errcode();
        sums[0] += rc ? 0 : ct_item(l);
        sums[1] += 1;
        ct_scope_end();
    }
    ct_set_grad_enabled(prev);
    ct_module_train(gpt, true);
    int src = ddp ? ct_ddp_summon_params(ddp, false) : 0;
    rc = rc ? rc : src;
    if (!rc && ranks > 1)
        rc = example_allreduce_sum(world, sums, 2);
    *loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
    return rc;
}

/* CT_ESHAPE unless src has dst's shape: ct_copy_ alone would broadcast a
 * [1, n] tensor of a smaller model into every row. */
static int same_shape(const char *path, const char *name, ct_tensor *src, ct_tensor *dst) {
    bool same = ct_ndim(src) == ct_ndim(dst);
    for (int d = 0; same && d < ct_ndim(dst); d++)
        same = ct_size(src, d) == ct_size(dst, d);
    if (same)
        return 0;
    char want[96] = "", got[96] = "";
    for (int d = 0; d < ct_ndim(dst); d++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? ", " : "",
                 (long long)ct_size(dst, d));
    for (int d = 0; d < ct_ndim(src); d++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                 (long long)ct_size(src, d));
    return ct_seterr(CT_ESHAPE,
                     "%s: '%s' is [%s], but this model's is [%s]: check --layers, "
                     "--width, --context and the corpus",
                     path, name, got, want);
}

/* Copies the weights in path (safetensors, PyTorch's names) into params. */
static int load_init(const char *path, const ct_param_list *params) {
    ct_tensor_dict *d = NULL;
    if (ct_safetensors_load(path, &d))
        return -1;
    int rc = 0, used = 0;
    bool prev = ct_set_grad_enabled(false);
    for (int i = 0; i < params->n && !rc; i++) {
        ct_tensor *src = ct_tensor_dict_find(d, params->names[i]);
        if (!src)
            rc = ct_seterr(CT_EINVAL, "%s: no tensor '%s'", path, params->names[i]);
        else if ((rc = same_shape(path, params->names[i], src, params->tensors[i])))
            break;
        else if (!ct_copy_(params->tensors[i], src))
            rc = ct_seterr(ct_errcode(), "%s: '%s': %s", path, params->names[i], ct_errmsg());
        used++;
    }
    /* The tied head, when a state dict keeps it, must be the embedding. */
    ct_tensor *head = rc ? NULL : ct_tensor_dict_find(d, "lm_head.weight");
    ct_tensor *wte = ct_param_list_find(params, "transformer.wte.weight");
    if (head && (rc = same_shape(path, "lm_head.weight", head, wte)))
        head = NULL;
    if (head) {
        ct_scope_begin();
        ct_tensor *same = ct_sum(ct_ne(head, ct_to(wte, CT_DEVICE_CPU)), NULL, 0, false);
        if (!same || ct_item_int64(same) != 0)
            rc = ct_seterr(CT_EINVAL,
                           "%s: lm_head.weight differs from transformer.wte.weight, "
                           "but ct's GPT ties them",
                           path);
        ct_scope_end();
        used++;
    }
    ct_set_grad_enabled(prev);
    if (!rc && used != ct_tensor_dict_count(d))
        rc = ct_seterr(CT_EINVAL,
                       "%s holds %d tensors, of which ct's GPT uses %d: is it this "
                       "model's size?",
                       path, ct_tensor_dict_count(d), used);
    ct_tensor_dict_free(d);
    return rc ? -1 : 0;
}

/* AdamW as the reference's: betas (0.9, 0.99). */
static ct_optim *build_optimizer(const options *o, ct_ddp *ddp, const ct_param_list *pl) {
    ct_optim_options opts = ct_optim_defaults(CT_OPTIM_ADAMW, o->lr);
    opts.beta2 = 0.99;
    return example_optimizer(ddp, pl, &opts, o->weight_decay);
}

/* Warmup takes at most a fifth of a short run. */
static ct_lr_schedule schedule(const options *o, int64_t total) {
    int64_t warmup = o->warmup < total / 5 ? o->warmup : total / 5;
    return (ct_lr_schedule){.kind = CT_LR_COSINE,
                            .base_lr = o->lr,
                            .warmup_steps = warmup,
                            .warmup_start_factor = 0.01,
                            .total_steps = total - warmup > 0 ? total - warmup : 1,
                            .eta_min = o->min_lr};
}

/* ---------------------------------------------------------------- sampling */

/* The sample's first tokens: the prompt's bytes in a text corpus; with
 * token shards, which have no encoder here, the tokenizer's end of text
 * (the start of a document), else token 0. */
static int64_t sample_start(const corpus *c, const options *o, int64_t *ids) {
    if (c->tokens) {
        ids[0] = c->tokenizer && ct_llmc_tokenizer_eot(c->tokenizer) < c->nvocab
                     ? ct_llmc_tokenizer_eot(c->tokenizer)
                     : 0;
        return 1;
    }
    int64_t len = (int64_t)strlen(o->prompt);
    for (int64_t i = 0; i < len; i++)
        ids[i] = (const uint8_t *)memchr(c->vocab, (uint8_t)o->prompt[i], (size_t)c->nvocab) -
                 c->vocab; /* check_inputs() found every byte */
    return len;
}

/* Token id as text: its byte, the tokenizer's bytes, or "<id>". */
static void print_token(const corpus *c, int64_t id) {
    size_t len = 0;
    const char *text = c->tokenizer ? ct_llmc_tokenizer_decode(c->tokenizer, id, &len) : NULL;
    if (!c->tokens)
        putchar(c->vocab[id]);
    else if (text)
        fwrite(text, 1, len, stdout);
    else
        printf("<%lld>", (long long)id);
}

/* Appends n tokens to the sample's start, each drawn from softmax(logits /
 * T) of the last context tokens, and prints the text. */
static int sample(ct_module *gpt, const corpus *c, const options *o) {
    int64_t cap = (int64_t)strlen(o->prompt) + 1 + o->sample_tokens;
    int64_t *ids = malloc(sizeof *ids * (size_t)cap);
    if (!ids)
        return ct_seterr(CT_ENOMEM, "sample: out of memory");
    int64_t len = sample_start(c, o, ids), end = len + o->sample_tokens;
    int rc = 0;
    ct_generator gen = {.seed = o->seed, .offset = 0};
    ct_module_train(gpt, false);
    bool prev = ct_set_grad_enabled(false);
    for (int64_t n = len; n < end && !rc; n++) {
        ct_scope_begin();
        int64_t from = n > o->model.context ? n - o->model.context : 0;
        ct_tensor *x = ct_to(ct_from_data(ids + from, CT_SHAPE(1, n - from), CT_INT64), o->device);
        ct_tensor *logits = n > 0 ? ct_select(ct_select(ct_module_forward(gpt, x), 0, 0), 0, -1)
                                  : ct_zeros(CT_SHAPE(c->nvocab), CT_FLOAT32);
        ct_tensor *p = ct_to(ct_softmax(ct_div_scalar(logits, o->temperature), 0), CT_DEVICE_CPU);
        ct_tensor *u = ct_rand(0, NULL, CT_FLOAT64, &gen);
        rc = p && u ? 0 : ct_errcode();
        double target = rc ? 0 : ct_item(u), acc = 0;
        int64_t pick = c->nvocab - 1;
        for (int64_t k = 0; k < c->nvocab && !rc; k++) {
            acc += ct_get(p, &k);
            if (acc > target) {
                pick = k;
                break;
            }
        }
        ids[n] = pick;
        ct_scope_end();
    }
    ct_set_grad_enabled(prev);
    ct_module_train(gpt, true);
    if (!rc) {
        printf("--- sample (%lld %s, temperature %.2f) ---\n", (long long)o->sample_tokens,
               c->tokens ? "tokens" : "characters", o->temperature);
        for (int64_t i = c->tokens ? 1 : 0; i < end; i++)
            print_token(c, ids[i]);
        printf("\n---\n");
    }
    free(ids);
    return rc;
}

/* --------------------------------------------------------------- training */

typedef struct run {
    const options *o;
    const corpus *c;
    ct_comm *world;
    int rank, ranks;
    ct_module *gpt;
    ct_param_list params;
    ct_ddp *ddp;
    ct_optim *opt;
    example_ckpt ckpt;
    example_plan plan;
    FILE *metrics;
    int64_t total; /* steps in the run; saved, so that a resumed --time run keeps its schedule */
} run;

/* The run's length once `done` steps took `elapsed` seconds (the slowest
 * rank's), so that the whole run takes about o->time. */
static int fix_length(run *r, int64_t done, double elapsed) {
    double e = elapsed;
    if (r->ranks > 1 && example_allreduce_max(r->world, &e, 1))
        return -1;
    int64_t fit = (int64_t)(r->o->time / (e / (double)done));
    r->total = fit > done ? fit : done;
    return 0;
}

/* One step on the batch x, y: forward, backward, clipping, the update. */
static int step_on(const options *o, ct_module *gpt, ct_ddp *ddp, ct_optim *opt,
                   const ct_param_list *params, ct_tensor *x, ct_tensor *y, double *loss) {
    ct_tensor *l = loss_of(gpt, x, y);
    CT_TRY(l ? ct_tensor_backward(l) : ct_errcode());
    CT_TRY(ddp ? ct_ddp_clip_grad_norm(ddp, opt, o->clip, 2, NULL)
               : ct_clip_grad_norm(params->tensors, params->n, o->clip, NULL));
    CT_TRY(ct_optim_step(opt));
    CT_TRY(ct_optim_zero_grad(opt, ddp == NULL));
    *loss = ct_item(l);
    return 0;
}

static int train_step(run *r, int64_t step, const ct_lr_schedule *sched, double *loss) {
    *loss = NAN;
    ct_tensor *x, *y;
    CT_TRY(train_batch(r->c, r->o, step, r->rank, r->ranks, &x, &y));
    CT_TRY(ct_optim_set_lr(r->opt, ct_lr_schedule_at(sched, step)));
    return step_on(r->o, r->gpt, r->ddp, r->opt, &r->params, x, y, loss);
}

/* *complete: the checkpoint in --checkpoint-dir had finished the run. */
static int train(run *r, bool *complete) {
    const options *o = r->o;
    int64_t step = 0, tokens = o->batch * o->model.context, timed_steps = 0;
    if (o->resume.dir &&
        (step = example_ckpt_resume(&r->ckpt, o->resume.dir, r->world, r->opt)) < 0)
        return -1;
    /* --steps is the run's length, also for a run resumed from a shorter
     * one; a resumed --time run keeps the length its first steps fixed. */
    if (o->steps > 0)
        r->total = o->steps;
    else if (!r->total)
        r->total = INT64_MAX / 4;
    if ((*complete = step >= r->total)) {
        if (r->rank == 0)
            printf(NAME ": the run in %s is complete: step %lld of %lld; nothing to train "
                        "(give more --steps to go on)\n",
                   o->resume.dir, (long long)step, (long long)r->total);
        return 0;
    }
    if (r->rank == 0 && *o->metrics &&
        !(r->metrics = example_metrics_open(o->metrics, step, r->ckpt.path)))
        return -1;
    if (r->rank == 0 && step > 0) {
        char to[48] = "the time's end";
        if (r->total < INT64_MAX / 4)
            snprintf(to, sizeof to, "step %lld", (long long)r->total);
        printf(NAME ": resumed from %s at step %lld; training on to %s\n", r->ckpt.path,
               (long long)step, to);
        fflush(stdout);
    }
    ct_lr_schedule sched = schedule(o, r->total);
    example_progress prog;
    /* A --time run's length is not known before its first estimate. */
    example_progress_init(&prog, 0, o->time > 0 && step < RATE_STEPS ? 0 : r->total);
    prog.unit = "tokens";
    double start = example_now(), timed = 0, loss = NAN, rate = 0; /* tokens/s, timed steps */
    int rc = 0;
    bool stopped = false;
    ct_memory_reset_peak(o->device);
    for (; step < r->total && !rc && !stopped; step++) {
        double t0 = example_now();
        ct_scope_begin();
        rc = train_step(r, step, &sched, &loss);
        ct_scope_end();
        if (rc)
            break;
        double now = example_now();
        if (step >= UNTIMED_STEPS) {
            timed += now - t0;
            timed_steps++;
        }
        if (o->time > 0 && (step + 1 == RATE_STEPS || step + 1 == REFINE_STEPS)) {
            if ((rc = fix_length(r, step + 1, now - start)))
                break;
            sched = schedule(o, r->total);
            prog.steps = r->total;
        }
        rate = timed > 0 ? (double)(tokens * timed_steps) / timed : 0;
        if (step % o->log_every == 0 || step + 1 == r->total) {
            double mean = loss;
            if (r->ranks > 1 && (rc = example_allreduce_sum(r->world, &mean, 1)))
                break;
            mean /= r->ranks;
            char nb[32];
            if (r->metrics)
                fprintf(r->metrics,
                        "{\"step\":%lld,\"loss\":%s,\"lr\":%.6g,\"tokens_per_s\":%.1f,"
                        "\"time_s\":%.3f}\n",
                        (long long)step, example_json_number(nb, mean), ct_optim_lr(r->opt), rate,
                        now - start);
        }
        if (r->rank == 0)
            example_progress_show(&prog, 0, step + 1, loss, rate,
                                  rate > 0 && prog.steps > 0
                                      ? (double)(r->total - step - 1) * (double)tokens / rate
                                      : 0);
        if (o->eval_every && (step + 1) % o->eval_every == 0 && step + 1 < r->total) {
            double v;
            if ((rc = evaluate(r->gpt, r->ddp, r->c, o, o->eval_batches, r->world, &v)))
                break;
            if (r->metrics) {
                fprintf(r->metrics, "{\"step\":%lld,\"val_loss\":%.7g,\"time_s\":%.3f}\n",
                        (long long)step + 1, v, example_now() - start);
                fflush(r->metrics);
            }
        }
        stopped = step + 1 == o->resume.stop_at_step;
        if (o->resume.dir &&
            ((o->resume.save_every && (step + 1) % o->resume.save_every == 0) || stopped))
            rc = example_ckpt_save(&r->ckpt, o->resume.dir, step + 1, o->resume.keep_last);
    }
    double train_s = example_now() - start, val = NAN;
    /* The last step's loss over the whole global batch. */
    if (!rc && r->ranks > 1 && !(rc = example_allreduce_sum(r->world, &loss, 1)))
        loss /= r->ranks;
    int64_t peak = ct_memory_peak(o->device); /* training's, before evaluation's */
    if (!rc && o->resume.dir)
        rc = example_ckpt_save(&r->ckpt, o->resume.dir, step, o->resume.keep_last);
    if (r->rank == 0)
        example_progress_end_epoch(&prog, 0, step, loss, rate);
    if (!rc && !stopped && !o->bench)
        rc = evaluate(r->gpt, r->ddp, r->c, o, -1, r->world, &val);
    if (rc)
        return rc;
    char nb[2][32];
    if (r->metrics && isfinite(val))
        fprintf(r->metrics, "{\"step\":%lld,\"val_loss\":%.7g,\"time_s\":%.3f}\n", (long long)step,
                val, example_now() - start);
    if (stopped && r->rank == 0)
        printf(NAME ": stopped at step %lld, as --stop-at-step asks; run again to resume\n",
               (long long)step);
    /* Rank 0 samples and exports the whole model, which every rank
     * gathers first when it is fully sharded (after training's figures:
     * the whole model is more than a sharded run may have room for). */
    if (r->ddp)
        example_print_memory(NAME, r->ddp, r->opt, r->rank, peak);
    example_plan_check(&r->plan, NAME, r->rank, o->device, peak);
    bool whole = (!stopped && !o->bench && o->sample_tokens > 0) || o->export_llmc;
    if (r->ddp && whole && (rc = ct_ddp_summon_params(r->ddp, true)))
        return rc;
    if (!stopped && !o->bench && r->rank == 0 && o->sample_tokens > 0 &&
        (rc = sample(r->gpt, r->c, o)))
        return rc;
    if (r->rank == 0 && o->export_llmc) {
        if ((rc = ct_llmc_gpt_save(r->gpt, o->export_llmc)))
            return rc;
        printf(NAME ": wrote the model to %s in llm.c's format\n", o->export_llmc);
    }
    ct_ddp_memory m;
    example_model_state(r->ddp, r->opt, &r->params, &m);
    if (r->rank == 0)
        printf("{\"bench\": \"gpt\", \"impl\": \"ct\", \"threads\": %d, \"ranks\": %d, "
               "\"batch\": %lld, \"context\": %lld, \"layers\": %lld, \"width\": %lld, "
               "\"steps\": %lld, \"tokens_per_s\": %.1f, \"train_s\": %.2f, \"final_loss\": %s, "
               "\"val_loss\": %s, \"checkpoint\": %s, \"peak_bytes\": %lld, \"shard\": %d, "
               "\"model_state_bytes\": %lld, \"staging_bytes\": %lld, \"step_peak_bytes\": %lld, "
               "\"plan_peak_bytes\": %lld}\n",
               o->threads, r->ranks, (long long)o->batch, (long long)o->model.context,
               (long long)o->model.layers, (long long)o->model.width, (long long)step, rate,
               train_s, example_json_number(nb[0], loss), example_json_number(nb[1], val),
               o->model.checkpoint ? "true" : "false", (long long)peak, r->ddp ? o->shard : 0,
               (long long)(m.params + m.grads + m.optimizer), (long long)m.staging,
               (long long)(peak - r->plan.base),
               (long long)example_plan_bytes(&r->plan, o->device));
    return 0;
}

/* The model as a run of `ranks` trains it, on device: fully sharded
 * units keep buffers of their own, so no flat buffer then. */
static ct_module *build_model(const options *o, int nvocab, int ranks, ct_device device) {
    ct_gpt_config cfg = o->model;
    cfg.vocab = nvocab;
    ct_module *gpt = ct_gpt_new(&cfg);
    bool fsdp = ranks > 1 && o->shard == CT_DDP_SHARD_FULL;
    if (gpt && (ct_module_to(gpt, device) || (!fsdp && ct_module_flatten(gpt, ranks == 1)))) {
        ct_module_free(gpt);
        return NULL;
    }
    return gpt;
}

static ct_ddp *wrap_model(const options *o, ct_comm *comm, ct_module *gpt) {
    /* Checkpointed blocks run backward reentrantly, so a parameter's hook
     * fires once per recomputation: the graph is static. */
    ct_ddp_options d = ct_ddp_defaults();
    d.static_graph = o->model.checkpoint;
    d.shard = (ct_ddp_shard)o->shard;
    /* Fully sharded, each block is a unit; the embeddings and the final
     * norm are the model's own. */
    ct_module *h = ct_module_child(ct_module_child(gpt, "transformer"), "h");
    ct_module *units[h ? ct_module_num_children(h) + 1 : 1];
    for (int k = 0; h && k < ct_module_num_children(h); k++)
        units[k] = ct_module_child_at(h, k);
    d.units = units;
    d.nunits = h ? ct_module_num_children(h) : 0;
    return ct_ddp_new(comm, gpt, &d);
}

/* --plan: the run replayed on the meta device through the run's own
 * pieces (ct_memory_plan). */
typedef struct plan_ctx {
    const options *o;
    int nvocab, rank, ranks;
} plan_ctx;

static ct_module *plan_build(void *ctx) {
    const plan_ctx *p = ctx;
    return build_model(p->o, p->nvocab, p->ranks, CT_DEVICE_META);
}

static ct_ddp *plan_wrap(void *ctx, ct_comm *comm, ct_module *gpt) {
    return wrap_model(((const plan_ctx *)ctx)->o, comm, gpt);
}

static ct_optim *plan_optimizer(void *ctx, ct_module *gpt, ct_ddp *ddp) {
    ct_param_list pl;
    ct_param_list_init(&pl);
    ct_optim *opt = ct_module_named_parameters(gpt, &pl)
                        ? NULL
                        : build_optimizer(((const plan_ctx *)ctx)->o, ddp, &pl);
    ct_param_list_free(&pl);
    return opt;
}

static int plan_step(void *ctx, ct_module *gpt, ct_ddp *ddp, ct_optim *opt, ct_device device) {
    const plan_ctx *p = ctx;
    const options *o = p->o;
    int64_t rows = o->batch * (p->rank + 1) / p->ranks - o->batch * p->rank / p->ranks;
    ct_tensor *x = ct_empty_on(CT_SHAPE(rows, o->model.context), CT_INT64, device);
    ct_tensor *y = ct_empty_on(CT_SHAPE(rows, o->model.context), CT_INT64, device);
    ct_param_list pl;
    ct_param_list_init(&pl);
    double loss;
    int rc = !x || !y                               ? ct_errcode()
             : ct_module_named_parameters(gpt, &pl) ? ct_errcode()
                                                    : step_on(o, gpt, ddp, opt, &pl, x, y, &loss);
    ct_param_list_free(&pl);
    return rc;
}

/* Builds the model, its optimizer and what a checkpoint holds; with
 * --plan, plans them first. */
static int setup(run *r) {
    const options *o = r->o;
    plan_ctx pc = {o, r->c->nvocab, r->rank, r->ranks};
    ct_memory_plan_config pcfg = {.world_size = r->ranks,
                                  .rank = r->rank,
                                  .build = plan_build,
                                  .wrap = plan_wrap,
                                  .optimizer = plan_optimizer,
                                  .step = plan_step,
                                  .ctx = &pc};
    r->plan = o->plan;
    CT_TRY(example_plan_make(&r->plan, NAME, &pcfg, o->device));
    if (o->plan.only)
        return 0; /* the plan is all it asks for */
    ct_manual_seed(o->seed);
    if (!(r->gpt = build_model(o, r->c->nvocab, r->ranks, o->device)) ||
        ct_module_named_parameters(r->gpt, &r->params) ||
        (o->init && !o->init_llmc && load_init(o->init, &r->params)) ||
        (o->init_llmc && ct_llmc_gpt_load_into(r->gpt, o->init)))
        return -1;
    if (r->ranks > 1 && !(r->ddp = wrap_model(o, r->world, r->gpt)))
        return -1;
    if (!(r->opt = build_optimizer(o, r->ddp, &r->params)))
        return -1;
    if (o->resume.dir &&
        (example_ckpt_init(&r->ckpt, &r->params, r->opt, r->ddp, r->world) ||
         ct_state_add_i64(r->ckpt.st, "train.total_steps", &r->total, CT_STATE_REPLICATED)))
        return -1;
    if (r->rank == 0)
        printf(NAME ": %lld layers, %lld heads, width %lld, context %lld, vocab %d, %lld "
                    "parameters; %lld training and %lld validation %s; batch %lld (%lld "
                    "per rank), %d rank%s, %d thread%s each%s%s\n",
               (long long)o->model.layers, (long long)o->model.heads, (long long)o->model.width,
               (long long)o->model.context, r->c->nvocab,
               (long long)ct_param_list_numel(&r->params), (long long)r->c->ntrain,
               (long long)(r->c->n - r->c->ntrain), r->c->tokens ? "tokens" : "characters",
               (long long)o->batch, (long long)(o->batch / r->ranks), r->ranks,
               r->ranks > 1 ? "s" : "", o->threads, o->threads > 1 ? "s" : "",
               o->model.checkpoint ? ", activation checkpointing" : "",
               o->init ? ", weights from --init" : "");
    fflush(stdout);
    return 0;
}

static void teardown(run *r) {
    ct_ddp_free(r->ddp);
    ct_optim_free(r->opt);
    ct_param_list_free(&r->params);
    ct_module_free(r->gpt);
}

/* The machine's cores shared among the ranks a launcher starts on it. */
static int default_threads(void) {
    ct_world w;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int local = !ct_world_from_env(&w) && w.local_size > 0 ? w.local_size : 1;
    return cores / local > 1 ? (int)(cores / local) : 1;
}

/* The smallest corpus that holds a training window and a validation
 * batch (corpus_load's 90/10 split, val_batches()). */
static int64_t min_corpus(const options *o) {
    int64_t n = 10 * (o->model.context * o->batch + 1);
    corpus c = {0};
    for (;; n++) {
        c.n = n;
        c.ntrain = n * 9 / 10;
        if (c.ntrain > o->model.context && val_batches(&c, o) >= 1)
            return n;
    }
}

/* Every input and output the run will need, before its first step. */
static int check_inputs(const options *o, const corpus *c, int rank, int ranks) {
    if (o->batch % ranks)
        return ct_seterr(CT_EINVAL, "--batch %lld must divide among the %d ranks",
                         (long long)o->batch, ranks);
    int64_t need = min_corpus(o);
    const char *unit = c->tokens ? "tokens" : "characters";
    if (!c->val_tokens && c->n < need)
        return ct_seterr(CT_EINVAL,
                         "--data %s: %lld %s are too few to train on: --context %lld and --batch "
                         "%lld need at least %lld (a window to train on and a validation batch "
                         "in the last tenth)",
                         o->data, (long long)c->n, unit, (long long)o->model.context,
                         (long long)o->batch, (long long)need);
    if (c->val_tokens && (c->ntrain <= o->model.context || val_batches(c, o) < 1))
        return ct_seterr(CT_EINVAL,
                         "--data %s (%lld tokens) needs more than --context %lld, and --val-data "
                         "%s (%lld tokens) a batch of --batch %lld windows of %lld",
                         o->data, (long long)c->ntrain, (long long)o->model.context, o->val_data,
                         (long long)(c->n - c->ntrain), (long long)o->batch,
                         (long long)o->model.context + 1);
    if (o->init_llmc && c->nvocab != o->vocab)
        return ct_seterr(CT_EINVAL,
                         "--init %s holds a model of %lld tokens, but the text of --data %s has "
                         "%d distinct bytes: llm.c's models read token shards (--data "
                         "FILE.bin)",
                         o->init, (long long)o->vocab, o->data, c->nvocab);
    for (const char *p = o->prompt; !c->tokens && !o->bench && o->sample_tokens > 0 && *p; p++)
        if (!memchr(c->vocab, (uint8_t)*p, (size_t)c->nvocab))
            return ct_seterr(CT_EINVAL,
                             "--prompt: its byte 0x%02x ('%c') is not in the corpus of --data "
                             "%s, so the model cannot read it; give a prompt of the corpus's "
                             "characters",
                             (uint8_t)*p, *p >= 0x20 && *p < 0x7f ? *p : '?', o->data);
    if (o->resume.dir && example_check_dir("--checkpoint-dir", o->resume.dir))
        return -1;
    if (rank == 0 && o->plot && metrics_plot_check(o->plot))
        return -1;
    return 0;
}

/* Everything between init and teardown; what it made, main frees. */
static int run_job(options *o, corpus *c, run *r, bool *complete) {
    if (o->init && is_llmc_model(o->init))
        CT_TRY(take_llmc_sizes(o));
    CT_TRY(corpus_open(c, o));
    CT_TRY(check_inputs(o, c, r->rank, r->ranks));
    CT_TRY(setup(r));
    return o->plan.only ? 0 : train(r, complete);
}

int main(int argc, char **argv) {
    options o;
    if (parse(argc, argv, &o))
        return 2;
    example_options eo = example_options_defaults();
    eo.threads = o.threads ? o.threads : example_default_threads(default_threads());
    if (example_init(NAME, &eo))
        return 1;
    o.threads = eo.threads;
    if (o.device.index < 0)
        o.device = ct_device_current(o.device.type);
    corpus c = {0};
    run r = {.o = &o, .c = &c, .world = ct_dist_comm()};
    r.rank = ct_comm_rank(r.world);
    r.ranks = ct_comm_size(r.world);
    ct_param_list_init(&r.params);
    bool complete = false;
    int rc = run_job(&o, &c, &r, &complete);
    if (example_ckpt_finish(&r.ckpt) && !rc)
        rc = -1;
    if (r.metrics && fclose(r.metrics) && !rc)
        rc = ct_seterr(CT_EIO, "%s: %s", o.metrics, strerror(errno));
    /* On stderr, as the summary ends stdout. */
    if (!rc && !complete && r.rank == 0 && o.plot && !(rc = metrics_plot(o.metrics, o.plot, NULL)))
        fprintf(stderr, NAME ": wrote the chart of %s to %s\n", o.metrics, o.plot);
    if (rc)
        fprintf(stderr, NAME ": %s\n", ct_errmsg());
    teardown(&r);
    corpus_free(&c);
    ct_dist_finalize();
    return rc ? 1 : 0;
}
