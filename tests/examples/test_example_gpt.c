/* examples/gpt run as users run it, on a tiny model for a few steps: it
 * trains and samples, two ranks under ctlaunch and under mpirun follow one
 * rank, a run stopped and resumed from its checkpoint ends where an
 * uninterrupted one does, activation checkpointing changes nothing but the
 * memory, and bad input fails with a message that says what to fix. Parity
 * with PyTorch is test_gpt_parity's (bench/gpt_parity.py). */
#include "ct_test.h"

#include <ct/checkpoint.h>

#include <stdlib.h>
#include <unistd.h>

#define DEADLINE 120
#define CORPUS   "/usr/share/games/fortunes"

static void require_corpus(void) {
    if (access(CORPUS "/fortunes", R_OK) != 0) {
        printf("skipped: Debian's fortunes is not installed (ci/setup.sh installs it)\n");
        exit(77);
    }
}

/* argv: a launcher's words (or none), then gpt and the tiny model's flags,
 * then extra (NULL-ended), into out (room for 64 words). */
static void command(const char **out, const char *const *launcher, const char *const *extra) {
    /* No metrics file unless a test asks for one (a later flag wins). */
    static const char *const tiny[] = {
        GPT_PATH, "--layers",    "2", "--heads",   "2",  "--width",      "32", "--context",
        "32",     "--batch",     "8", "--steps",   "12", "--eval-every", "0",  "--sample-tokens",
        "0",      "--log-every", "1", "--threads", "1",  "--metrics",    "",   NULL};
    int n = 0;
    for (int i = 0; launcher && launcher[i]; i++)
        out[n++] = launcher[i];
    for (int i = 0; tiny[i]; i++)
        out[n++] = tiny[i];
    for (int i = 0; extra && extra[i]; i++)
        out[n++] = extra[i];
    out[n] = NULL;
}

/* What the ranks mpirun starts run with: Open MPI leaves allocations
 * that LeakSanitizer cannot attribute, and ThreadSanitizer needs its
 * suppressions (as test_collectives_mpi). */
static const char *const mpi_env[] = {"CT_BACKEND",
                                      "ASAN_OPTIONS=detect_leaks=0",
                                      "TSAN_OPTIONS=suppressions=" TSAN_OPENMPI_SUPP,
                                      "OMPI_ALLOW_RUN_AS_ROOT=1",
                                      "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                      NULL};

/* Runs gpt; fails the test unless it exits with code. */
static bool run(tt_job *j, const char *const *launcher, const char *const *extra, int code) {
    const char *argv[64];
    command(argv, launcher, extra);
    bool mpi = launcher && !strcmp(launcher[0], MPIEXEC_PATH);
    tt_run_job(j, argv, mpi ? mpi_env : (const char *const[]){"CT_BACKEND", NULL}, DEADLINE);
    if (tt_job_exit_code(j) == code)
        return true;
    tt_fail(__FILE__, __LINE__, "gpt exited %d, expected %d\n--- stdout ---\n%s--- stderr ---\n%s",
            tt_job_exit_code(j), code, tt_tail(j->out), tt_tail(j->err));
    return false;
}

/* A number of the JSON summary on the last line of stdout; NAN if absent. */
static double summary(const tt_job *j, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *line = strstr(j->out, "{\"bench\": \"gpt\"");
    const char *at = line ? strstr(line, pat) : NULL;
    return at ? strtod(at + strlen(pat), NULL) : NAN;
}

static tt_job one_rank; /* the reference run, made once */

static const tt_job *reference(void) {
    if (one_rank.seconds == 0 && !run(&one_rank, NULL, NULL, 0))
        return NULL;
    return &one_rank;
}

TEST(trains_validates_and_samples) {
    require_corpus();
    char metrics[256];
    tt_tmp_path(metrics, "gpt.jsonl");
    static tt_job j;
    ASSERT_TRUE(run(&j, NULL,
                    (const char *const[]){"--metrics", metrics, "--sample-tokens", "40",
                                          "--eval-every", "5", "--eval-batches", "3", NULL},
                    0));
    /* Chance is ln 114 = 4.74 nats a character; 12 steps learn letter
     * frequencies. */
    double loss = summary(&j, "final_loss"), val = summary(&j, "val_loss");
    printf("  12 steps: loss %.4f, validation loss %.4f, %.0f tokens/s\n", loss, val,
           summary(&j, "tokens_per_s"));
    ASSERT_TRUE(loss < 4.4 && val < 4.4);
    ASSERT_STR_CONTAINS(j.out, "--- sample (40 characters");
    FILE *f = fopen(metrics, "r");
    ASSERT_TRUE(f != NULL);
    char line[512];
    int steps = 0, evals = 0;
    while (fgets(line, sizeof line, f)) {
        steps += strstr(line, "\"loss\":") != NULL;
        evals += strstr(line, "\"val_loss\":") != NULL;
    }
    fclose(f);
    /* Every step's loss; the validation loss at steps 5 and 10 and at the end. */
    ASSERT_EQ(steps, 12);
    ASSERT_EQ(evals, 3);
}

/* Two ranks take half of every batch each and average their gradients:
 * the same steps as one rank, up to the order of float sums. */
static void check_two_ranks(const char *const *launcher, const char *const *extra) {
    const tt_job *ref = reference();
    ASSERT_TRUE(ref != NULL);
    static tt_job j;
    ASSERT_TRUE(run(&j, launcher, extra, 0));
    double want = summary(ref, "final_loss"), got = summary(&j, "final_loss");
    printf("  2 ranks: final loss %.6f, 1 rank %.6f\n", got, want);
    ASSERT_EQ(summary(&j, "ranks"), 2);
    ASSERT_NEAR(got, want, 1e-4 * want);
    ASSERT_NEAR(summary(&j, "val_loss"), summary(ref, "val_loss"), 1e-4 * want);
}

TEST(two_ranks_under_ctlaunch_follow_one) {
    require_corpus();
    check_two_ranks((const char *const[]){CTLAUNCH_PATH, "-np", "2", NULL}, NULL);
}

TEST(two_ranks_with_activation_checkpointing_follow_one) {
    require_corpus();
    check_two_ranks((const char *const[]){CTLAUNCH_PATH, "-np", "2", NULL},
                    (const char *const[]){"--checkpoint-activations", NULL});
}

TEST(two_ranks_under_mpirun_follow_one) {
    require_corpus();
    if (!*MPIEXEC_PATH) {
        printf("  no mpirun in this build: nothing to check\n");
        return;
    }
    check_two_ranks((const char *const[]){MPIEXEC_PATH, "-np", "2", "--oversubscribe", NULL}, NULL);
}

TEST(activation_checkpointing_saves_memory_and_changes_nothing) {
    require_corpus();
    const tt_job *ref = reference();
    ASSERT_TRUE(ref != NULL);
    static tt_job j;
    ASSERT_TRUE(run(&j, NULL, (const char *const[]){"--checkpoint-activations", NULL}, 0));
    ASSERT_NEAR(summary(&j, "final_loss"), summary(ref, "final_loss"), 1e-6);
    double with = summary(&j, "peak_bytes"), without = summary(ref, "peak_bytes");
    printf("  peak memory %.1f MB with activation checkpointing, %.1f MB without\n", with / 1e6,
           without / 1e6);
    ASSERT_TRUE(with < without);
}

TEST(a_stopped_run_resumes_where_it_stopped) {
    require_corpus();
    const tt_job *ref = reference();
    ASSERT_TRUE(ref != NULL);
    char dir[256];
    tt_tmp_path(dir, "gpt-ckpt");
    static tt_job first, second;
    ASSERT_TRUE(run(&first, NULL,
                    (const char *const[]){"--checkpoint-dir", dir, "--stop-at-step", "5", NULL},
                    0));
    ASSERT_STR_CONTAINS(first.out, "stopped at step 5");
    ASSERT_TRUE(run(&second, NULL, (const char *const[]){"--checkpoint-dir", dir, NULL}, 0));
    ASSERT_STR_CONTAINS(second.out, "resumed from");
    ASSERT_STR_CONTAINS(second.out, "at step 5");
    /* The same steps on the same batches from the same state: the same
     * bits. */
    ASSERT_NEAR(summary(&second, "final_loss"), summary(ref, "final_loss"), 0);
    ASSERT_NEAR(summary(&second, "val_loss"), summary(ref, "val_loss"), 0);
}

/* --plan's figures (every rank's lines, rank 0's summary): the plan of
 * the step's peak within 10% of the measured one (the bar; it is
 * exact to the byte in practice, docs/sharding.md). */
static void check_plan(const tt_job *j, const char *ranks, int stage) {
    double planned = summary(j, "plan_peak_bytes"), measured = summary(j, "step_peak_bytes");
    printf("  %s ranks, --shard %d: step peak planned %.0f bytes, measured %.0f (%.4f)\n", ranks,
           stage, planned, measured, planned / measured);
    ASSERT_TRUE(planned > 0 && measured > 0);
    ASSERT_NEAR(planned / measured, 1.0, 0.1);
    ASSERT_STR_CONTAINS(j->out, "rank 1: step peak measured");
}

/* ct_ddp's ZeRO stages (docs/sharding.md) against plain data parallel on
 * ranks ranks with the global batch batch, 200 steps with clipping (--clip
 * 1 by default): every stage the same losses to 1e-6, and bit for bit in
 * practice (measured on 2, 3 and 4 ranks): the collectives sum the ranks'
 * gradients in rank order on every path that reads shared memory, and the
 * clipping norm is summed in float64, so that shards cut anywhere give
 * its coefficient's bits. */
static void stages_follow_plain(const char *ranks, const char *batch, bool plan) {
    const char *const launcher[] = {CTLAUNCH_PATH, "-np", ranks, NULL};
    static tt_job plain, sharded;
    ASSERT_TRUE(
        run(&plain, launcher, (const char *const[]){"--steps", "200", "--batch", batch, NULL}, 0));
    double want = summary(&plain, "final_loss"), want_val = summary(&plain, "val_loss");
    /* With plan, every stage's run (plain's too, once more) plans its
     * memory first: the plan changes none of its numbers. */
    for (int stage = plan ? 0 : 1; stage <= 3; stage++) {
        char s[2] = {(char)('0' + stage), 0};
        ASSERT_TRUE(run(&sharded, launcher,
                        (const char *const[]){"--steps", "200", "--batch", batch, "--shard", s,
                                              plan ? "--plan" : NULL, NULL},
                        0));
        if (plan)
            check_plan(&sharded, ranks, stage);
        double got = summary(&sharded, "final_loss"), got_val = summary(&sharded, "val_loss");
        printf("  %s ranks, --shard %d: final loss %.8f, validation %.8f; plain %.8f, %.8f\n",
               ranks, stage, got, got_val, want, want_val);
        double rtol = stage == 0 ? 0 : 1e-6;
        ASSERT_NEAR(got, want, rtol * want);
        ASSERT_NEAR(got_val, want_val, rtol * want_val);
        ASSERT_STR_CONTAINS(sharded.out, "model state");
    }
}

TEST(every_shard_stage_on_2_ranks_follows_plain_data_parallel_and_its_plan) {
    require_corpus();
    stages_follow_plain("2", "8", true);
}

/* 4 ranks oversubscribe a 2-core machine, which only slows them. */
TEST(every_shard_stage_on_3_and_4_ranks_follows_plain_data_parallel) {
    require_corpus();
    stages_follow_plain("3", "12", false);
    stages_follow_plain("4", "8", false);
}

/* A run of a ZeRO stage on 2 ranks stopped and resumed: the same bits as
 * one that ran through. Its checkpoint (parameters and optimizer state
 * saved as the blocks each rank holds) also loads into plain data parallel
 * on 3 ranks, into one process, and fully sharded on 3 ranks (other
 * blocks of other units' shards), each training on to the same end within
 * float reassociation. */
static void resumes_exactly_and_loads_anywhere(const char *stage) {
    const char *const two[] = {CTLAUNCH_PATH, "-np", "2", NULL};
    const char *const three[] = {CTLAUNCH_PATH, "-np", "3", NULL};
    char dir[256], other[256], one[256], full[256], name[64];
    snprintf(name, sizeof name, "gpt-zero%s", stage);
    tt_tmp_path(dir, name);
    snprintf(name, sizeof name, "gpt-zero%s-3ranks", stage);
    tt_tmp_path(other, name);
    snprintf(name, sizeof name, "gpt-zero%s-1rank", stage);
    tt_tmp_path(one, name);
    snprintf(name, sizeof name, "gpt-zero%s-zero3", stage);
    tt_tmp_path(full, name);
    static tt_job whole, first, second, on3, on1, full3;
    ASSERT_TRUE(run(&whole, two, (const char *const[]){"--shard", stage, NULL}, 0));
    ASSERT_TRUE(run(&first, two,
                    (const char *const[]){"--shard", stage, "--checkpoint-dir", dir,
                                          "--stop-at-step", "5", NULL},
                    0));
    ASSERT_TRUE(run(&second, two,
                    (const char *const[]){"--shard", stage, "--checkpoint-dir", dir, NULL}, 0));
    ASSERT_STR_CONTAINS(second.out, "resumed from");
    ASSERT_NEAR(summary(&second, "final_loss"), summary(&whole, "final_loss"), 0);
    ASSERT_NEAR(summary(&second, "val_loss"), summary(&whole, "val_loss"), 0);
    /* Step 5's checkpoint, copied, resumed elsewhere (--batch 8 divides by
     * 2 and 1; 3 ranks take a batch of 9). */
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s %s %s && cp -r %s/step-00000005 %s/ && cp -r %s/step-00000005 %s/ && "
             "cp -r %s/step-00000005 %s/",
             other, one, full, dir, other, dir, one, dir, full);
    ASSERT_EQ(system(cmd), 0);
    ASSERT_TRUE(run(&on3, three,
                    (const char *const[]){"--checkpoint-dir", other, "--batch", "9", NULL}, 0));
    ASSERT_STR_CONTAINS(on3.out, "resumed from");
    ASSERT_TRUE(run(
        &full3, three,
        (const char *const[]){"--checkpoint-dir", full, "--batch", "9", "--shard", "3", NULL}, 0));
    ASSERT_STR_CONTAINS(full3.out, "resumed from");
    ASSERT_NEAR(summary(&full3, "final_loss"), summary(&on3, "final_loss"),
                1e-4 * summary(&on3, "final_loss"));
    ASSERT_TRUE(run(&on1, NULL, (const char *const[]){"--checkpoint-dir", one, NULL}, 0));
    ASSERT_STR_CONTAINS(on1.out, "resumed from");
    ASSERT_NEAR(summary(&on1, "final_loss"), summary(&whole, "final_loss"),
                1e-4 * summary(&whole, "final_loss"));
    printf("  --shard %s: resumed %.8f = %.8f; on 3 ranks %.6f, fully sharded %.6f; alone %.6f\n",
           stage, summary(&second, "final_loss"), summary(&whole, "final_loss"),
           summary(&on3, "final_loss"), summary(&full3, "final_loss"), summary(&on1, "final_loss"));
}

TEST(a_zero2_run_resumes_exactly_and_its_checkpoint_loads_anywhere) {
    require_corpus();
    resumes_exactly_and_loads_anywhere("2");
}

TEST(a_fully_sharded_run_resumes_exactly_and_its_checkpoint_loads_anywhere) {
    require_corpus();
    resumes_exactly_and_loads_anywhere("3");
}

/* CT_MEMORY_LIMIT: an allocation past it fails with CT_ENOMEM naming the
 * limit, and gpt says so and exits 1; a value that is not a byte count
 * fails the same way, naming the value. */
TEST(ct_memory_limit_fails_the_allocation_that_passes_it) {
    require_corpus();
    const char *argv[64];
    command(argv, NULL, NULL);
    static tt_job low, bad;
    tt_run_job(&low, argv, (const char *const[]){"CT_BACKEND", "CT_MEMORY_LIMIT=1M", NULL},
               DEADLINE);
    ASSERT_EQ(tt_job_exit_code(&low), 1);
    ASSERT_STR_CONTAINS(low.err, "past CT_MEMORY_LIMIT=1048576");
    tt_run_job(&bad, argv, (const char *const[]){"CT_BACKEND", "CT_MEMORY_LIMIT=lots", NULL},
               DEADLINE);
    ASSERT_EQ(tt_job_exit_code(&bad), 1);
    ASSERT_STR_CONTAINS(bad.err, "CT_MEMORY_LIMIT='lots' is not a byte count");
    printf("  %s", tt_tail(low.err));
}

/* A model whose replicated state (12 blocks of width 256: 9.5 M
 * parameters, 36 MB, AdamW's 73 MB on top) does not fit CT_MEMORY_LIMIT
 * on 2 ranks, while fully sharded it trains in it: --shard 0 fails naming
 * the limit, --shard 3 runs (its training peak about 90 MiB of the 105;
 * docs/sharding.md); --plan-only says so before either runs. */
TEST(a_fully_sharded_gpt_fits_a_memory_limit_that_the_replicated_one_does_not) {
    require_corpus();
    const char *const model[] = {"--layers", "12",      "--heads", "4",       "--width",
                                 "256",      "--batch", "2",       "--steps", "3",
                                 "--bench",  "--shard", NULL,      NULL};
    const char *const env[] = {"CT_BACKEND", "CT_MEMORY_LIMIT=105M", NULL};
    const char *const launcher[] = {CTLAUNCH_PATH, "-np", "2", NULL};
    static tt_job replicated, sharded, plans[2];
    double planned[2];
    for (int stage = 0; stage <= 3; stage += 3) {
        const char *extra[sizeof model / sizeof *model + 1];
        memcpy(extra, model, sizeof model);
        extra[12] = stage ? "3" : "0";
        /* Asked first, the plan tells which fits, allocating nothing. */
        extra[13] = "--plan-only";
        extra[14] = NULL;
        const char *argv[64];
        command(argv, launcher, extra);
        tt_job *p = &plans[stage / 3];
        tt_run_job(p, argv, env, DEADLINE);
        ASSERT_EQ(tt_job_exit_code(p), 0);
        const char *at = strstr(p->out, "a step peaks at ");
        planned[stage / 3] = at ? strtod(at + strlen("a step peaks at "), NULL) : NAN;
        printf("  --shard %d --plan-only: a step peaks at %.1f MiB\n", stage, planned[stage / 3]);
        ASSERT_TRUE(!strstr(p->out, "{\"bench\""));
        extra[13] = stage ? "--plan" : NULL;
        command(argv, launcher, extra);
        tt_run_job(stage ? &sharded : &replicated, argv, env, DEADLINE);
    }
    ASSERT_TRUE(planned[0] * (1 << 20) > 110100480.0);
    ASSERT_TRUE(planned[1] * (1 << 20) < 110100480.0);
    printf("  --shard 0: %s", tt_tail(replicated.err));
    ASSERT_TRUE(tt_job_exit_code(&replicated) != 0);
    ASSERT_STR_CONTAINS(replicated.err, "past CT_MEMORY_LIMIT=110100480");
    if (tt_job_exit_code(&sharded) != 0)
        printf("--- stderr ---\n%s", tt_tail(sharded.err));
    ASSERT_EQ(tt_job_exit_code(&sharded), 0);
    ASSERT_STR_CONTAINS(sharded.out, "model state");
    printf("  --shard 3 trained: peak %.1f MiB\n", summary(&sharded, "peak_bytes") / (1 << 20));
    check_plan(&sharded, "2", 3);
}

/* --time: the length in steps is fixed from the first steps' rate, so
 * that the run ends about on time, its cosine complete. */
TEST(a_time_budget_ends_on_time) {
    require_corpus();
    char metrics[256];
    tt_tmp_path(metrics, "timed.jsonl");
    static tt_job j;
    const char *argv[64];
    command(argv, NULL, (const char *const[]){"--metrics", metrics, NULL});
    /* --steps and --time exclude each other: this run's --steps goes. */
    for (int i = 0; argv[i]; i++)
        if (!strcmp(argv[i], "--steps")) {
            argv[i] = "--time";
            argv[i + 1] = "4";
        }
    tt_run_job(&j, argv, (const char *const[]){"CT_BACKEND", NULL}, DEADLINE);
    ASSERT_EQ(tt_job_exit_code(&j), 0);
    double seconds = summary(&j, "train_s"), steps = summary(&j, "steps");
    printf("  --time 4: %.0f steps in %.2f s\n", steps, seconds);
    ASSERT_TRUE(steps > 12 && seconds > 2 && seconds < 8);
    /* The last step's rate is about the schedule's floor, --min-lr. */
    FILE *f = fopen(metrics, "r");
    ASSERT_TRUE(f != NULL);
    char line[512], last[512] = "";
    while (fgets(line, sizeof line, f))
        if (strstr(line, "\"lr\":"))
            snprintf(last, sizeof last, "%s", line);
    fclose(f);
    const char *lr = strstr(last, "\"lr\":");
    ASSERT_TRUE(lr != NULL);
    ASSERT_NEAR(strtod(lr + 5, NULL), 2e-4, 2e-6);
}

TEST(bad_input_fails_with_a_message) {
    require_corpus();
    static tt_job j;
    ASSERT_TRUE(run(&j, NULL, (const char *const[]){"--bogus", "1", NULL}, 2));
    ASSERT_STR_CONTAINS(j.err, "unknown option '--bogus'");
    ASSERT_TRUE(run(&j, NULL, (const char *const[]){"--lr", "fast", NULL}, 2));
    ASSERT_STR_CONTAINS(j.err, "--lr needs a number in [1e-12, 1000000], got 'fast'");
    ASSERT_TRUE(run(&j, NULL, (const char *const[]){"--time", "10", NULL}, 2));
    ASSERT_STR_CONTAINS(j.err, "not both");
    char empty[256];
    tt_tmp_path(empty, "no-corpus");
    ASSERT_TRUE(run(&j, NULL, (const char *const[]){"--data", empty, NULL}, 1));
    ASSERT_STR_CONTAINS(j.err, "fortunes");
    /* Weights of another model's size. */
    char init[256];
    tt_tmp_path(init, "other.safetensors");
    ct_tensor_dict *d = ct_tensor_dict_new();
    ASSERT_EQ(ct_tensor_dict_add(d, "transformer.wte.weight", ct_zeros(CT_SHAPE(5, 8), CT_FLOAT32)),
              0);
    ASSERT_EQ(ct_safetensors_save(init, d), 0);
    ct_tensor_dict_free(d);
    ASSERT_TRUE(run(&j, NULL, (const char *const[]){"--init", init, NULL}, 1));
    ASSERT_STR_CONTAINS(j.err, "'transformer.wte.weight' is [5, 8], but this model's is [114, 32]");
    /* One that would broadcast into every row. */
    d = ct_tensor_dict_new();
    ASSERT_EQ(
        ct_tensor_dict_add(d, "transformer.wte.weight", ct_zeros(CT_SHAPE(1, 32), CT_FLOAT32)), 0);
    ASSERT_EQ(ct_safetensors_save(init, d), 0);
    ct_tensor_dict_free(d);
    ASSERT_TRUE(run(&j, NULL, (const char *const[]){"--init", init, NULL}, 1));
    ASSERT_STR_CONTAINS(j.err, "is [1, 32], but this model's is [114, 32]");
    ASSERT_TRUE(
        run(&j, NULL, (const char *const[]){"--init", "/nonexistent.safetensors", NULL}, 1));
    ASSERT_STR_CONTAINS(j.err, "/nonexistent.safetensors");
}
