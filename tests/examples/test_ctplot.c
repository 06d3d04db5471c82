/* ctplot and fmnist_mlp --plot run as users run them, on metrics files
 * written here: a chart comes out as a PNG of the promised size, the
 * gnuplot script (--script) draws what docs/plot.md says (which fields,
 * which panels, points on sparse series), and every bad input fails with
 * exit code 1 and a message that names the problem. gnuplot's own failures
 * come from fake gnuplots, each alone on PATH. Without gnuplot the program
 * exits 77 (skipped) at the first test that needs it. */
#include "ct_test.h"

#include "metrics_plot.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEADLINE 60

static tt_job job_;

static const char *tmp(char path[static 256], const char *name) { return tt_tmp_path(path, name); }

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* Reads path into buf (NUL-terminated); the number of bytes, or -1. */
static long read_text(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return (long)n;
}

static void need_gnuplot(void) {
    const char *path = getenv("PATH");
    char dirs[4096], exe[4200];
    snprintf(dirs, sizeof dirs, "%s", path ? path : "/usr/bin:/bin");
    for (char *save, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(exe, sizeof exe, "%s/gnuplot", d);
        if (access(exe, X_OK) == 0)
            return;
    }
    printf("skipped: gnuplot is not installed (bash ci/setup.sh installs gnuplot-nox)\n");
    exit(77);
}

/* ctplot with args (NULL-ended), and PATH=path_var unless that is NULL. */
static int ctplot_env(const char *path_var, const char *const *args) {
    const char *argv[16] = {CTPLOT_PATH};
    for (int i = 0; args[i] && i < 14; i++)
        argv[i + 1] = args[i];
    char env_path[300];
    snprintf(env_path, sizeof env_path, "PATH=%s", path_var ? path_var : "");
    tt_run_job(&job_, argv, (const char *const[]){path_var ? env_path : NULL, NULL}, DEADLINE);
    return tt_job_exit_code(&job_);
}

#define CTPLOT(...)               ctplot_env(NULL, (const char *const[]){__VA_ARGS__, NULL})
#define CTPLOT_ON_PATH(path, ...) ctplot_env(path, (const char *const[]){__VA_ARGS__, NULL})

/* Whether path holds a PNG of width x height pixels, with more than a
 * blank image's bytes. */
static bool is_png(const char *path, unsigned width, unsigned height) {
    static unsigned char buf[1 << 20];
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f)
        fclose(f);
    unsigned w = n >= 24 ? (unsigned)buf[16] << 24 | buf[17] << 16 | buf[18] << 8 | buf[19] : 0;
    unsigned h = n >= 24 ? (unsigned)buf[20] << 24 | buf[21] << 16 | buf[22] << 8 | buf[23] : 0;
    bool ok = n > 5000 && !memcmp(buf, "\x89PNG\r\n\x1a\n", 8) && !memcmp(buf + 12, "IHDR", 4) &&
              w == width && h == height;
    if (!ok)
        printf("  %s: %zu bytes, %u x %u, not the expected PNG\n", path, n, w, h);
    return ok;
}

/* The line of script that draws the series named name ("title 'name'"),
 * copied into line. */
static const char *plot_line(const char *script, const char *name, char line[static 512]) {
    char key[128];
    snprintf(key, sizeof key, "title '%s'", name);
    const char *at = strstr(script, key);
    if (!at)
        return "";
    const char *start = at;
    while (start > script && start[-1] != '\n')
        start--;
    snprintf(line, 512, "%.*s", (int)(at - start + strlen(key)), start);
    return line;
}

/* How many points the script's data block for the series name holds (-1:
 * no block). */
static int points_of(const char *script, const char *name) {
    char key[128];
    snprintf(key, sizeof key, "# '%s'\n$", name);
    const char *at = strstr(script, key);
    if (!at || !(at = strstr(at, "<< EOD\n")))
        return -1;
    int n = 0;
    for (at += 7; strncmp(at, "EOD\n", 4); at = strchr(at, '\n') + 1)
        n++;
    return n;
}

/* ------------------------------------------------------------- usage */

TEST(bad_usage_exits_2_and_help_exits_0) {
    tt_run_job(&job_, (const char *const[]){CTPLOT_PATH, NULL}, (const char *const[]){NULL},
               DEADLINE);
    ASSERT_EQ(tt_job_exit_code(&job_), 2);
    TT_ASSERT_JOB(&job_,
                  strstr(job_.err, "which metrics file") && strstr(job_.err, "ctplot --help"));
    ASSERT_EQ(CTPLOT("m.jsonl", "--colour", "red"), 2);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "unknown option '--colour'"));
    ASSERT_EQ(CTPLOT("m.jsonl", "-o"), 2);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "-o needs a value"));
    ASSERT_EQ(CTPLOT("a.jsonl", "b.jsonl"), 2);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "one metrics file at a time"));
    ASSERT_EQ(CTPLOT("--help"), 0);
    TT_ASSERT_JOB(&job_, strstr(job_.out, "usage: ctplot") && strstr(job_.out, "_per_s"));
}

/* ------------------------------------------------------------ charts */

/* 60 per-step lines: loss falling, tokens/s rising. */
static void write_steps(const char *path) {
    FILE *f = fopen(path, "w");
    for (int i = 0; f && i < 60; i++)
        fprintf(f, "{\"step\": %d, \"loss\": %.4f, \"lr\": 0.001, \"tokens_per_s\": %.1f}\n",
                10 * i, 4.0 / (1 + 0.1 * i), 9000.0 + 10 * i);
    if (f)
        fclose(f);
}

TEST(a_good_file_gives_a_png_next_to_it_with_both_panels) {
    need_gnuplot();
    char metrics[256], png[256], script[256];
    write_steps(tmp(metrics, "run.jsonl"));
    ASSERT_EQ(CTPLOT(metrics, "--script", tmp(script, "run.gp")), 0);
    TT_ASSERT_JOB(&job_, strstr(job_.out, "wrote") && strstr(job_.out, "/run.png"));
    ASSERT_TRUE(is_png(tmp(png, "run.png"), 1000, 800));
    static char text[1 << 16];
    ASSERT_TRUE(read_text(script, text, sizeof text) > 0);
    char line[512];
    ASSERT_STR_CONTAINS(text, "layout 2,1 title 'run.jsonl'");
    ASSERT_STR_CONTAINS(text, "set xlabel 'step'");
    ASSERT_STR_CONTAINS(text, "set xrange [0:590]");
    ASSERT_STR_CONTAINS(plot_line(text, "loss", line), "with lines");
    ASSERT_STR_CONTAINS(plot_line(text, "tokens_per_s", line), "with lines");
    ASSERT_EQ(points_of(text, "loss"), 60);
    ASSERT_EQ(points_of(text, "tokens_per_s"), 60);
    ASSERT_EQ(points_of(text, "lr"), -1);
    ASSERT_TRUE(!strstr(text, "'lr'"));
}

TEST(a_sparse_val_series_is_drawn_with_points_and_an_empty_panel_is_left_out) {
    need_gnuplot();
    char metrics[256], png[256], script[256];
    FILE *f = fopen(tmp(metrics, "val.jsonl"), "w");
    ASSERT_TRUE(f);
    for (int i = 0; i < 100; i++) {
        fprintf(f, "{\"step\": %d, \"loss\": %.4f}\n", i, 3.0 - 0.02 * i);
        if (i % 20 == 19)
            fprintf(f, "\n{\"step\": %d, \"val_loss\": %.4f, \"val_acc\": 0.5}\n", i + 1,
                    3.1 - 0.02 * i);
    }
    fclose(f);
    ASSERT_EQ(CTPLOT(metrics, "-o", tmp(png, "val chart.png"), "--script", tmp(script, "val.gp")),
              0);
    ASSERT_TRUE(is_png(png, 1000, 800));
    static char text[1 << 16];
    ASSERT_TRUE(read_text(script, text, sizeof text) > 0);
    char line[512];
    ASSERT_STR_CONTAINS(plot_line(text, "loss", line), "with lines");
    ASSERT_STR_CONTAINS(plot_line(text, "val_loss", line), "with linespoints");
    ASSERT_EQ(points_of(text, "val_loss"), 5);
    ASSERT_STR_CONTAINS(text, "layout 1,1");
    ASSERT_TRUE(!strstr(text, "throughput"));
}

TEST(another_x_a_title_and_values_that_are_not_finite) {
    need_gnuplot();
    char metrics[256], png[256], script[256];
    write_text(tmp(metrics, "odd.jsonl"),
               "{\"time_s\": 0.5, \"loss\": 2.5, \"samples_per_s\": 100}\n"
               "{\"step\": 3, \"loss\": 2.0}\n"
               "{\"time_s\": 1.5, \"loss\": nan, \"samples_per_s\": 120, \"note\": \"inf nan\"}\n"
               "{\"time_s\": 2.5, \"loss\": NaN, \"val_loss\": -Infinity}\n"
               "{\"time_s\": 3.5, \"loss\": 1.25, \"val_loss\": null, \"samples_per_s\": -inf}\n"
               "{\"time_s\": 4.5, \"loss\": 1.");
    ASSERT_EQ(
        CTPLOT(metrics, "--x", "time_s", "--title", "run 'A'", "--script", tmp(script, "odd.gp")),
        0);
    ASSERT_TRUE(is_png(tmp(png, "odd.png"), 1000, 800));
    static char text[1 << 16];
    ASSERT_TRUE(read_text(script, text, sizeof text) > 0);
    ASSERT_STR_CONTAINS(text, "title 'run ''A'''");
    ASSERT_STR_CONTAINS(text, "set xlabel 'time_s'");
    ASSERT_STR_CONTAINS(text, "set xrange [0.5:3.5]");
    /* loss at 0.5 and 3.5 only: the step line has no time_s, nan and NaN
     * are no points, and the unfinished last line is left out. */
    ASSERT_EQ(points_of(text, "loss"), 2);
    ASSERT_EQ(points_of(text, "samples_per_s"), 2);
    ASSERT_EQ(points_of(text, "val_loss"), -1);
}

/* ------------------------------------------------------------ errors */

TEST(bad_metrics_files_fail_with_exit_1_naming_the_problem) {
    need_gnuplot();
    char metrics[256], png[256];
    tmp(png, "bad.png");
    ASSERT_EQ(CTPLOT(tmp(metrics, "absent.jsonl"), "-o", png), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "cannot read") && strstr(job_.err, "absent.jsonl") &&
                             strstr(job_.err, "No such file"));
    write_text(tmp(metrics, "notjson.jsonl"),
               "{\"step\": 0, \"loss\": 1}\n\n{\"step\": 1, \"loss\": 0.9} trailing\n");
    ASSERT_EQ(CTPLOT(metrics, "-o", png), 1);
    TT_ASSERT_JOB(&job_,
                  strstr(job_.err, "line 3 is not a JSON object") && strstr(job_.err, "trailing"));
    write_text(metrics, "{\"step\": 0, \"loss\": 1}\n[1, 2]\n");
    ASSERT_EQ(CTPLOT(metrics, "-o", png), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "line 2 is not a JSON object"));
    write_text(tmp(metrics, "nox.jsonl"), "{\"epoch\": 1, \"loss\": 1}\n{\"step\": \"two\"}\n");
    ASSERT_EQ(CTPLOT(metrics, "-o", png), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "no line of") && strstr(job_.err, "x field 'step'") &&
                             strstr(job_.err, "its fields: epoch, loss"));
    write_text(tmp(metrics, "empty.jsonl"), "");
    ASSERT_EQ(CTPLOT(metrics, "-o", png), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "empty.jsonl' has no metrics: it is empty"));
    write_text(tmp(metrics, "nothing.jsonl"),
               "{\"step\": 1, \"acc\": 0.5, \"loss\": \"high\"}\n{\"val_loss\": 2}\n");
    ASSERT_EQ(CTPLOT(metrics, "-o", png), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "nothing to plot") &&
                             strstr(job_.err, "its fields: acc, val_loss"));
    ASSERT_EQ(access(png, F_OK), -1);
    write_steps(tmp(metrics, "good.jsonl"));
    ASSERT_EQ(CTPLOT(metrics, "-o", tmp(png, "no/such/dir/x.png")), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "cannot write") && strstr(job_.err, "no/such/dir"));
}

/* A directory holding a gnuplot that runs body (sh). */
static const char *fake_gnuplot(char dir[static 256], const char *name, const char *body) {
    char exe[300];
    tmp(dir, name);
    mkdir(dir, 0755);
    snprintf(exe, sizeof exe, "%s/gnuplot", dir);
    char text[512];
    snprintf(text, sizeof text, "#!/bin/sh\n%s\n", body);
    write_text(exe, text);
    chmod(exe, 0755);
    return dir;
}

TEST(a_missing_or_failing_gnuplot_is_reported_and_leaves_no_png) {
    need_gnuplot();
    char metrics[256], png[256], dir[256];
    write_steps(tmp(metrics, "g.jsonl"));
    tmp(png, "g.png");
    ASSERT_EQ(CTPLOT_ON_PATH(tmp(dir, "empty-path"), metrics, "-o", png), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "gnuplot not found: install gnuplot-nox"));
    write_text(png, "an older chart");
    fake_gnuplot(dir, "failing", "echo 'line 7: unknown terminal' >&2; exit 3");
    ASSERT_EQ(CTPLOT_ON_PATH(dir, metrics, "-o", png), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "gnuplot failed (exit status 3): line 7: unknown "
                                          "terminal"));
    ASSERT_EQ(access(png, F_OK), -1);
    fake_gnuplot(dir, "silent", "exit 0");
    ASSERT_EQ(CTPLOT_ON_PATH(dir, metrics, "-o", png), 1);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "wrote nothing to") && strstr(job_.err, "g.png"));
    ASSERT_EQ(access(png, F_OK), -1);
}

TEST(the_library_returns_ct_error_codes) {
    char metrics[256], png[256];
    tmp(png, "lib.png");
    ASSERT_RC(metrics_plot(tmp(metrics, "absent.jsonl"), png, NULL), CT_EIO, "cannot read");
    write_text(tmp(metrics, "lib.jsonl"), "{\"step\": 1, \"loss\": 1}\nnot json\n");
    ASSERT_RC(metrics_plot(metrics, png, NULL), CT_ECORRUPT, "line 2");
    write_text(metrics, "{\"step\": 1, \"loss\": 1}\n");
    ASSERT_RC(metrics_plot(metrics, png, &(metrics_plot_options){.x = "epoch"}), CT_EINVAL,
              "x field 'epoch'");
    write_text(metrics, "{\"step\": 1, \"accuracy\": 1}\n");
    ASSERT_RC(metrics_plot(metrics, png, NULL), CT_EINVAL, "nothing to plot");
    ASSERT_RC(metrics_plot(NULL, png, NULL), CT_EINVAL, "must not be NULL");
}

/* ------------------------------------------------------- fmnist_mlp */

TEST(fmnist_mlp_plot_draws_its_metrics_after_training) {
    need_gnuplot();
    char metrics[256], png[256];
    tt_run_job(&job_, (const char *const[]){FMNIST_PATH, "--plot", "x.png", "--metrics", "", NULL},
               (const char *const[]){"CT_BACKEND", NULL}, DEADLINE);
    ASSERT_EQ(tt_job_exit_code(&job_), 2);
    TT_ASSERT_JOB(&job_, strstr(job_.err, "--plot draws the metrics file"));
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("  Fashion-MNIST is not installed (dataset-fashion-mnist): the run is skipped\n");
        return;
    }
    tt_run_job(&job_,
               (const char *const[]){FMNIST_PATH, "--max-steps", "201", "--threads", "1",
                                     "--warmup-steps", "5", "--metrics",
                                     tmp(metrics, "fmnist.jsonl"), "--plot", tmp(png, "fmnist.png"),
                                     NULL},
               (const char *const[]){"CT_BACKEND", NULL}, DEADLINE);
    TT_ASSERT_JOB(&job_, tt_job_exit_code(&job_) == 0 && strstr(job_.err, "wrote the chart of") &&
                             strstr(job_.err, "fmnist.png"));
    ASSERT_TRUE(is_png(png, 1000, 800));
    static char text[1 << 16];
    ASSERT_TRUE(read_text(metrics, text, sizeof text) > 0);
    ASSERT_STR_CONTAINS(text, "\"step\":200,\"epoch\":1,\"loss\":");
    ASSERT_STR_CONTAINS(text, "\"samples_per_s\":");
}
