/* ct's programs as a new user meets them (docs/cli.md): strict flags, help
 * with defaults and --version everywhere; resumes that go on to the new
 * --steps or --epochs and say so; a finished run that exits 0 and leaves
 * its outputs alone; metrics files that stay valid JSON lines and keep
 * their history across resumes; inputs checked before the first step;
 * one precedence for threads. fmnist_mlp runs on a small Fashion-MNIST of
 * the test's own, gpt on a corpus of its own, so that every case takes a
 * second or two. */
#include "ct_test.h"

#include <ct/ct.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEADLINE 120

static tt_job job;

/* argv: words up to NULL; env: as tt_run_job's. Fails the test unless the
 * exit code is code. */
static bool run_env(const char *const *argv, const char *const *env, int code) {
    tt_run_job(&job, argv, env, DEADLINE);
    if (tt_job_exit_code(&job) == code)
        return true;
    tt_fail(__FILE__, __LINE__, "%s exited %d, expected %d\n--- stdout ---\n%s--- stderr ---\n%s",
            argv[0], tt_job_exit_code(&job), code, tt_tail(job.out), tt_tail(job.err));
    return false;
}

static bool run(const char *const *argv, int code) {
    return run_env(argv, (const char *const[]){"CT_BACKEND", "CT_NUM_THREADS", NULL}, code);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Whether a value starts at v that JSON does not have: printf's nan, inf
 * and -nan. */
static bool non_json_value(const char *v) {
    v += *v == '-';
    return !strncmp(v, "nan", 3) || !strncmp(v, "inf", 3) || !strncmp(v, "NaN", 3) ||
           !strncmp(v, "Inf", 3);
}

/* Every line of path is a JSON object whose values JSON has; *lines
 * counts them. */
static bool json_lines(const char *path, int *lines) {
    const char *s = slurp(path);
    *lines = 0;
    if (!s)
        return false;
    for (const char *line = s; *line; line = strchr(line, '\n') + 1) {
        const char *end = strchr(line, '\n');
        if (!end || line[0] != '{' || end[-1] != '}')
            return false;
        for (const char *p = line; p < end; p++)
            if (*p == ':' && non_json_value(p + 1))
                return false;
        (*lines)++;
    }
    return true;
}

/* --------------------------------------------------------------- gpt */

#define TINY_GPT                                                                                   \
    GPT_PATH, "--layers", "2", "--heads", "2", "--width", "32", "--context", "32", "--batch", "8", \
        "--eval-every", "0", "--sample-tokens", "0", "--log-every", "1", "--threads", "1"

/* dir = a corpus directory of n characters cycling through "abcdefgh\n". */
static const char *corpus(char dir[static 256], const char *name, int n) {
    tt_tmp_path(dir, name);
    mkdir(dir, 0755);
    char path[300];
    snprintf(path, sizeof path, "%s/text", dir);
    FILE *f = fopen(path, "w");
    for (int i = 0; f && i < n; i++)
        fputc("abcdefgh\n"[i % 9], f);
    if (f)
        fclose(f);
    return dir;
}

TEST(a_resumed_gpt_trains_on_to_the_new_steps_and_a_finished_one_says_so) {
    char dir[256], metrics[256];
    tt_tmp_path(dir, "gpt-resume");
    tt_tmp_path(metrics, "gpt-resume.jsonl");
    char data_dir[256];
    const char *data = corpus(data_dir, "gpt-resume-text", 4000);
    ASSERT_TRUE(run((const char *const[]){TINY_GPT, "--data", data, "--prompt", "a", "--steps", "6",
                                          "--checkpoint-dir", dir, "--metrics", metrics, NULL},
                    0));
    ASSERT_TRUE(run((const char *const[]){TINY_GPT, "--data", data, "--prompt", "a", "--steps", "9",
                                          "--checkpoint-dir", dir, "--metrics", metrics, NULL},
                    0));
    TT_ASSERT_JOB(&job, strstr(job.out, "at step 6; training on to step 9"));
    TT_ASSERT_JOB(&job, strstr(job.out, "\"steps\": 9,"));
    TT_ASSERT_JOB(&job, !strstr(job.out, "\"final_loss\": null"));
    /* The first run's lines, the marker, then the new steps'. */
    const char *m = slurp(metrics);
    ASSERT_TRUE(m != NULL);
    const char *first = strstr(m, "{\"step\":0,"), *mark = strstr(m, "{\"resumed_at_step\":6,");
    const char *later = strstr(m, "{\"step\":8,");
    ASSERT_TRUE(first && mark && later && first < mark && mark < later);
    int lines;
    ASSERT_TRUE(json_lines(metrics, &lines));
    char before[1 << 16];
    snprintf(before, sizeof before, "%s", m);
    /* Done already: it says so, exits 0 and leaves the metrics alone. */
    ASSERT_TRUE(run((const char *const[]){TINY_GPT, "--data", data, "--prompt", "a", "--steps", "9",
                                          "--checkpoint-dir", dir, "--metrics", metrics, NULL},
                    0));
    TT_ASSERT_JOB(&job, strstr(job.out, "is complete: step 9 of 9; nothing to train"));
    TT_ASSERT_JOB(&job, !strstr(job.out, "{\"bench\""));
    ASSERT_TRUE(!strcmp(slurp(metrics), before));
}

TEST(gpt_checks_its_inputs_before_the_first_step) {
    char data_dir[256];
    const char *data = corpus(data_dir, "gpt-check-text", 4000);
    /* The default prompt "Q: " has bytes this corpus lacks. */
    ASSERT_TRUE(run((const char *const[]){TINY_GPT, "--data", data, "--steps", "50",
                                          "--sample-tokens", "10", NULL},
                    1));
    TT_ASSERT_JOB(&job, strstr(job.err, "--prompt: its byte 0x51 ('Q') is not in the corpus"));
    TT_ASSERT_JOB(&job, !strstr(job.err, "step ") && !strstr(job.out, "parameters"));
    char tiny_dir[256];
    const char *tiny = corpus(tiny_dir, "gpt-3-bytes", 3);
    ASSERT_TRUE(run((const char *const[]){TINY_GPT, "--data", tiny, "--steps", "5", NULL}, 1));
    TT_ASSERT_JOB(&job, strstr(job.err, "3 characters are too few to train on: --context 32 and "
                                        "--batch 8 need at least"));
    ASSERT_TRUE(run((const char *const[]){TINY_GPT, "--data", data, "--prompt", "a", "--steps", "5",
                                          "--checkpoint-dir", "/proc/ct-ckpt", NULL},
                    1));
    TT_ASSERT_JOB(&job, strstr(job.err, "--checkpoint-dir /proc/ct-ckpt: cannot create"));
    TT_ASSERT_JOB(&job, !strstr(job.out, "parameters"));
    char metrics[256], png[256];
    tt_tmp_path(metrics, "gpt-plot.jsonl");
    tt_tmp_path(png, "gpt-plot.png");
    ASSERT_TRUE(run_env((const char *const[]){TINY_GPT, "--data", data, "--prompt", "a", "--steps",
                                              "5", "--metrics", metrics, "--plot", png, NULL},
                        (const char *const[]){"CT_BACKEND", "PATH=/nonexistent", NULL}, 1));
    TT_ASSERT_JOB(&job, strstr(job.err, "needs gnuplot, which is not on PATH"));
    TT_ASSERT_JOB(&job, !strstr(job.out, "parameters"));
}

TEST(gpt_writes_no_metrics_file_unless_asked) {
    char data_dir[256];
    const char *data = corpus(data_dir, "gpt-quiet-text", 4000);
    char cwd[4096], here[256];
    ASSERT_TRUE(getcwd(cwd, sizeof cwd) != NULL);
    tt_tmp_path(here, "gpt-quiet-cwd");
    mkdir(here, 0755);
    ASSERT_EQ(chdir(here), 0);
    bool ok = run(
        (const char *const[]){TINY_GPT, "--data", data, "--prompt", "a", "--steps", "2", NULL}, 0);
    bool wrote = access("gpt.metrics.jsonl", F_OK) == 0;
    ASSERT_EQ(chdir(cwd), 0);
    ASSERT_TRUE(ok);
    ASSERT_TRUE(!wrote);
}

TEST(threads_come_from_the_flag_then_ct_num_threads) {
    char data_dir[256];
    const char *data = corpus(data_dir, "gpt-threads-text", 4000);
    const char *argv[] = {GPT_PATH, "--layers",  "1",  "--heads",  "1", "--width",
                          "8",      "--context", "8",  "--batch",  "2", "--steps",
                          "1",      "--data",    data, "--prompt", "a", "--eval-every",
                          "0",      NULL,        NULL, NULL};
    ASSERT_TRUE(run_env(argv, (const char *const[]){"CT_BACKEND", "CT_NUM_THREADS=1", NULL}, 0));
    TT_ASSERT_JOB(&job, strstr(job.out, "1 rank, 1 thread each"));
    argv[17] = "--threads";
    argv[18] = "2";
    ASSERT_TRUE(run_env(argv, (const char *const[]){"CT_BACKEND", "CT_NUM_THREADS=1", NULL}, 0));
    TT_ASSERT_JOB(&job, strstr(job.out, "1 rank, 2 threads each"));
    /* More threads than CPUs: one warning, and the run goes on. */
    argv[18] = "4000";
    ASSERT_TRUE(run(argv, 0));
    TT_ASSERT_JOB(&job, strstr(job.err, "4000 threads in each of 1 rank is more than the"));
    const char *w = strstr(job.err, "warning:");
    TT_ASSERT_JOB(&job, w && !strstr(w + 1, "warning:"));
}

/* An llm.c token shard (dev/data/data_common.py's layout: 256 int32, the
 * magic 20240520, version 1 and the count, then uint16 tokens) of n
 * tokens i * 7 % vocab, the first one bad when bad. */
static void write_shard(const char *path, int n, int vocab, bool bad) {
    FILE *f = fopen(path, "wb");
    int32_t header[256] = {20240520, 1, n};
    fwrite(header, sizeof header, 1, f);
    for (int i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(bad && i == 0 ? vocab : i * 7 % vocab);
        fwrite(&t, sizeof t, 1, f);
    }
    fclose(f);
}

TEST(gpt_trains_on_llmc_token_shards_and_hands_its_model_to_llmc_and_back) {
    char dir[256], pattern[300], val[300], model[300];
    tt_tmp_path(dir, "shards");
    mkdir(dir, 0755);
    for (int i = 0; i < 2; i++) {
        char path[300];
        snprintf(path, sizeof path, "%s/tiny_train_%06d.bin", dir, i);
        write_shard(path, 3000, 64, false);
    }
    snprintf(pattern, sizeof pattern, "%s/tiny_train_*.bin", dir);
    snprintf(val, sizeof val, "%s/tiny_val.bin", dir);
    snprintf(model, sizeof model, "%s/model.bin", dir);
    write_shard(val, 1000, 64, false);
    ASSERT_TRUE(run((const char *const[]){TINY_GPT, "--data", pattern, "--val-data", val, "--vocab",
                                          "64", "--steps", "3", "--sample-tokens", "5",
                                          "--export-llmc", model, NULL},
                    0));
    TT_ASSERT_JOB(&job, strstr(job.out, "vocab 64,") && strstr(job.out, "6000 training and 1000"));
    TT_ASSERT_JOB(&job,
                  strstr(job.out, "--- sample (5 tokens") && strstr(job.out, "wrote the model"));
    ct_gpt_config cfg;
    ASSERT_EQ(ct_llmc_gpt_read_config(model, &cfg, NULL), 0);
    ASSERT_TRUE(cfg.layers == 2 && cfg.width == 32 && cfg.heads == 2 && cfg.context == 32 &&
                cfg.vocab == 64);
    /* Back: the file's sizes are the model's; a flag that disagrees fails. */
    ASSERT_TRUE(
        run((const char *const[]){GPT_PATH, "--data", pattern, "--init", model, "--batch", "8",
                                  "--steps", "1", "--sample-tokens", "0", "--threads", "1", NULL},
            0));
    TT_ASSERT_JOB(&job, strstr(job.out, "2 layers, 2 heads, width 32, context 32, vocab 64") &&
                            strstr(job.out, "weights from --init"));
    ASSERT_TRUE(run((const char *const[]){TINY_GPT, "--data", pattern, "--init", model, "--layers",
                                          "3", "--steps", "1", NULL},
                    1));
    TT_ASSERT_JOB(&job, strstr(job.err, "--layers 3, but --init ") &&
                            strstr(job.err, "holds a model with 2"));
    /* A token outside the vocabulary is an error that names it. */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/bad.bin", dir);
    write_shard(bad, 3000, 64, true);
    ASSERT_TRUE(run((const char *const[]){TINY_GPT, "--data", bad, "--vocab", "64", "--steps", "3",
                                          "--sample-tokens", "0", NULL},
                    1));
    TT_ASSERT_JOB(&job, strstr(job.err, "bad.bin") && strstr(job.err, "64") &&
                            !strstr(job.out, "parameters"));
}

/* ---------------------------------------------------------- fmnist_mlp */

static void put_be32(FILE *f, uint32_t v) {
    unsigned char b[4] = {(unsigned char)(v >> 24), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 8), (unsigned char)v};
    fwrite(b, 1, 4, f);
}

/* IDX files (LeCun's MNIST layout, uncompressed: ct_idx_load reads either)
 * of n images and labels, under the names ct_fmnist_load looks for. */
static void write_split(const char *dir, const char *split, int n) {
    char path[400];
    snprintf(path, sizeof path, "%s/%s-images-idx3-ubyte.gz", dir, split);
    FILE *f = fopen(path, "wb");
    put_be32(f, 0x803);
    put_be32(f, (uint32_t)n);
    put_be32(f, 28);
    put_be32(f, 28);
    for (int i = 0; i < n * 784; i++)
        fputc((i * 7 + i / 784 * 13) % 256, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/%s-labels-idx1-ubyte.gz", dir, split);
    f = fopen(path, "wb");
    put_be32(f, 0x801);
    put_be32(f, (uint32_t)n);
    for (int i = 0; i < n; i++)
        fputc(i % 10, f);
    fclose(f);
}

/* 256 training images (4 steps of 64) and 100 test ones. */
static const char *small_fmnist(void) {
    static char dir[256];
    if (!dir[0]) {
        tt_tmp_path(dir, "fmnist");
        mkdir(dir, 0755);
        write_split(dir, "train", 256);
        write_split(dir, "t10k", 100);
    }
    return dir;
}

#define FMNIST FMNIST_PATH, "--threads", "1", "--warmup-steps", "0", "--data", small_fmnist()

TEST(a_resumed_fmnist_mlp_trains_the_new_epochs_and_a_finished_one_says_so) {
    char dir[256], metrics[256];
    tt_tmp_path(dir, "fmnist-resume");
    tt_tmp_path(metrics, "fmnist-resume.jsonl");
    ASSERT_TRUE(run((const char *const[]){FMNIST, "--epochs", "2", "--checkpoint-dir", dir,
                                          "--metrics", metrics, NULL},
                    0));
    ASSERT_TRUE(run((const char *const[]){FMNIST, "--epochs", "3", "--checkpoint-dir", dir,
                                          "--metrics", metrics, NULL},
                    0));
    TT_ASSERT_JOB(&job,
                  strstr(job.out, "at step 8 (epoch 3, step 0 of it); training on to step 12"));
    TT_ASSERT_JOB(&job, strstr(job.out, "epoch  3  train loss ") && !strstr(job.out, "nan"));
    TT_ASSERT_JOB(&job, !strstr(job.out, "epoch  2 "));
    const char *m = slurp(metrics);
    ASSERT_TRUE(m != NULL);
    const char *e1 = strstr(m, "{\"epoch\":1,"), *mark = strstr(m, "{\"resumed_at_step\":8,");
    const char *e3 = strstr(m, "{\"epoch\":3,");
    ASSERT_TRUE(e1 && mark && e3 && e1 < mark && mark < e3);
    char before[1 << 16];
    snprintf(before, sizeof before, "%s", m);
    ASSERT_TRUE(run((const char *const[]){FMNIST, "--epochs", "3", "--checkpoint-dir", dir,
                                          "--metrics", metrics, NULL},
                    0));
    TT_ASSERT_JOB(&job, strstr(job.out, "is complete: step 12 of 12 (3 epochs); nothing to train"));
    TT_ASSERT_JOB(&job, !strstr(job.out, "{\"bench\""));
    ASSERT_TRUE(!strcmp(slurp(metrics), before));
}

TEST(metrics_stay_json_when_the_loss_is_not_finite) {
    char metrics[256];
    tt_tmp_path(metrics, "fmnist-diverged.jsonl");
    ASSERT_TRUE(run((const char *const[]){FMNIST, "--epochs", "2", "--lr", "1000000", "--metrics",
                                          metrics, NULL},
                    0));
    int lines;
    TT_ASSERT_JOB(&job, json_lines(metrics, &lines) && lines >= 2);
    TT_ASSERT_JOB(&job, strstr(slurp(metrics), "\"train_loss\":null"));
}

TEST(fmnist_mlp_checks_its_checkpoint_dir_before_the_first_step) {
    ASSERT_TRUE(run((const char *const[]){FMNIST, "--checkpoint-dir", "/proc/ct-ckpt", NULL}, 1));
    TT_ASSERT_JOB(&job, strstr(job.err, "--checkpoint-dir /proc/ct-ckpt: cannot create"));
    TT_ASSERT_JOB(&job, !strstr(job.out, "recipe"));
}

TEST(the_recipe_fills_in_only_the_flags_not_given) {
    ASSERT_TRUE(run((const char *const[]){FMNIST, "--epochs", "1", "--recipe", "adamw", "--hidden",
                                          "16", "--metrics", "", NULL},
                    0));
    TT_ASSERT_JOB(&job, strstr(job.out, "recipe adamw, 784-16-16-10") &&
                            strstr(job.out, "batch 128 (128 per rank), 1 epochs"));
}

/* ------------------------------------------------------ every program */

TEST(every_program_is_strict_about_numbers_and_names_the_flag) {
    ASSERT_TRUE(run((const char *const[]){FMNIST_PATH, "--epochs", "1.5", NULL}, 2));
    TT_ASSERT_JOB(&job,
                  strstr(job.err, "--epochs needs a whole number in [1, 1000000], got '1.5'"));
    ASSERT_TRUE(run((const char *const[]){FMNIST_PATH, "--seed", "abc", NULL}, 2));
    TT_ASSERT_JOB(&job, strstr(job.err, "--seed needs a whole number >= 0, got 'abc'"));
    ASSERT_TRUE(run((const char *const[]){FMNIST_PATH, "--seed", "-1", NULL}, 2));
    TT_ASSERT_JOB(&job, strstr(job.err, "got '-1'"));
    ASSERT_TRUE(run((const char *const[]){FMNIST_PATH, "--lr", "abc", NULL}, 2));
    TT_ASSERT_JOB(&job, strstr(job.err, "--lr needs a number in"));
    ASSERT_TRUE(run((const char *const[]){FMNIST_PATH, "--epochs", "--batch", "32", NULL}, 2));
    TT_ASSERT_JOB(&job, strstr(job.err, "--epochs needs a value (N), got the option '--batch'"));
    ASSERT_TRUE(run((const char *const[]){GPT_PATH, "--steps", "1.5", NULL}, 2));
    TT_ASSERT_JOB(&job, strstr(job.err, "--steps needs a whole number"));
    ASSERT_TRUE(run((const char *const[]){GPT_PATH, "--batch=0", NULL}, 2));
    TT_ASSERT_JOB(&job, strstr(job.err, "--batch needs a whole number in [1, 16777216], got '0'"));
    ASSERT_TRUE(
        run((const char *const[]){CTLAUNCH_PATH, "-np", "2", "--grace", "-1", "x", NULL}, 2));
    TT_ASSERT_JOB(&job, strstr(job.err, "--grace needs seconds >= 0, got '-1'"));
    ASSERT_TRUE(
        run((const char *const[]){CTCKPT_PATH, "convert", "a", "b", "--shards", "1.5", NULL}, 2));
    TT_ASSERT_JOB(&job, strstr(job.err, "--shards needs a whole number in [1, 4096], got '1.5'"));
}

TEST(every_program_suggests_the_flag_meant) {
    ASSERT_TRUE(run((const char *const[]){FMNIST_PATH, "--epoch", "3", NULL}, 2));
    TT_ASSERT_JOB(&job, strstr(job.err, "unknown option '--epoch'; did you mean '--epochs'?"));
    ASSERT_TRUE(run((const char *const[]){GPT_PATH, "--stpes", "3", NULL}, 2));
    TT_ASSERT_JOB(&job, strstr(job.err, "did you mean '--steps'?"));
    ASSERT_TRUE(run((const char *const[]){CTLAUNCH_PATH, "--max-restart", "3", "x", NULL}, 2));
    TT_ASSERT_JOB(&job, strstr(job.err, "did you mean '--max-restarts'?"));
    ASSERT_TRUE(run((const char *const[]){CTPLOT_PATH, "m.jsonl", "--titel", "x", NULL}, 2));
    TT_ASSERT_JOB(&job, strstr(job.err, "did you mean '--title'?"));
}

TEST(every_program_has_help_with_defaults_and_a_version) {
    const char *progs[] = {FMNIST_PATH, GPT_PATH,    CTLAUNCH_PATH,
                           CTCKPT_PATH, CTPLOT_PATH, TENSOR_DEMO_PATH};
    const char *names[] = {"fmnist_mlp", "gpt", "ctlaunch", "ctckpt", "ctplot", "tensor_demo"};
    for (int i = 0; i < 6; i++) {
        ASSERT_TRUE(run((const char *const[]){progs[i], "--version", NULL}, 0));
        char want[64];
        snprintf(want, sizeof want, "%s (ct) %s\n", names[i], ct_version());
        TT_ASSERT_JOB(&job, !strcmp(job.out, want));
        ASSERT_TRUE(run((const char *const[]){progs[i], "--help", NULL}, 0));
        TT_ASSERT_JOB(&job, strstr(job.out, "usage: "));
    }
    ASSERT_TRUE(run((const char *const[]){FMNIST_PATH, "--help", NULL}, 0));
    TT_ASSERT_JOB(&job, strstr(job.out, "--epochs N") && strstr(job.out, "(default: 10)") &&
                            strstr(job.out, "the global batch"));
    ASSERT_TRUE(run((const char *const[]){GPT_PATH, "--help", NULL}, 0));
    TT_ASSERT_JOB(&job, strstr(job.out, "--temperature X") && strstr(job.out, "(default: 0.8)"));
    ASSERT_TRUE(run((const char *const[]){CTCKPT_PATH, "convert", "--help", NULL}, 0));
    TT_ASSERT_JOB(&job, strstr(job.out, "usage: ctckpt convert [options] SRC DST"));
}
