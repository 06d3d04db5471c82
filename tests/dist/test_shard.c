/* ct_ddp's ZeRO stages (1, 2 and 3) across real processes: shard_rank trains a model
 * sharded and replicated side by side under ctlaunch (the shm backend) on
 * 2, 3 and 4 ranks (4 oversubscribe a small machine, which is fine here),
 * and checks the ZeRO memory accounting and the errors sharding gives.
 * Each run has a deadline, and every rank is checked to be gone after. */
#include "ct_test.h"

#include <signal.h>

/* Far above a passing run (a few seconds), above the ranks' collective
 * timeout (20 s). */
#define DEADLINE 90

static const char *const env[] = {"CT_BACKEND", "SHARD_TEST_PROGRESS", NULL};
static const char *const thread_env[] = {"CT_BACKEND", "SHARD_TEST_PROGRESS=thread", NULL};

/* The scenario on np ranks: the job exits code (ctlaunch's: the first
 * rank's failure), and every rank but skip (-1: none) passes. */
static void ends_with(int np, const char *scenario, const char *const *job_env, int code,
                      int skip) {
    static tt_job j;
    char npstr[16];
    snprintf(npstr, sizeof npstr, "%d", np);
    /* A --grace long enough for the survivors of a killed rank, who ignore
     * ctlaunch's SIGTERM, to report (shard_rank.c). */
    tt_run_job(&j,
               (const char *const[]){CTLAUNCH_PATH, "-np", npstr, "--grace", "30", SHARD_RANK_PATH,
                                     scenario, NULL},
               job_env, DEADLINE);
    TT_ASSERT_JOB(&j, tt_job_no_rank_left(&j));
    TT_ASSERT_JOB(&j, tt_job_exit_code(&j) == code);
    TT_ASSERT_JOB(&j, tt_job_ranks_passed(&j, scenario, np, skip, true));
    printf("  %s on %d ranks: %.1f s\n", scenario, np, j.seconds);
}

static void passes_with(int np, const char *scenario, const char *const *job_env) {
    ends_with(np, scenario, job_env, 0, -1);
}

static void passes(int np, const char *scenario) { passes_with(np, scenario, env); }

/* Each scenario on 2, 3 and 4 ranks. */
static void on_2_3_4(const char *scenario) {
    for (int np = 2; np <= 4; np++)
        passes(np, scenario);
}

TEST(zero1_with_sgd_equals_ddp) { on_2_3_4("zero1_sgd"); }
TEST(zero1_with_adamw_equals_ddp) { on_2_3_4("zero1_adamw"); }
TEST(zero1_with_adamw_and_clipping_equals_ddp) { on_2_3_4("zero1_adamw_clip"); }
TEST(zero1_in_float64_equals_ddp_to_1e_12) {
    on_2_3_4("zero1_sgd_f64");
    on_2_3_4("zero1_adamw_f64");
}
TEST(zero1_with_a_parameter_used_on_one_rank_equals_ddp) { on_2_3_4("zero1_unused"); }
TEST(zero1_with_activation_checkpointing_equals_ddp) { on_2_3_4("zero1_checkpointed"); }
TEST(zero1_with_no_sync_accumulation_equals_ddp) { on_2_3_4("zero1_no_sync"); }

TEST(zero2_with_sgd_equals_ddp) { on_2_3_4("zero2_sgd"); }
TEST(zero2_with_adamw_equals_ddp) { on_2_3_4("zero2_adamw"); }
TEST(zero2_with_adamw_and_clipping_equals_ddp) { on_2_3_4("zero2_adamw_clip"); }
TEST(zero2_in_float64_equals_ddp_to_1e_12) {
    on_2_3_4("zero2_sgd_f64");
    on_2_3_4("zero2_adamw_f64");
}
TEST(zero2_with_a_parameter_used_on_one_rank_equals_ddp) { on_2_3_4("zero2_unused"); }
TEST(zero2_with_activation_checkpointing_equals_ddp) { on_2_3_4("zero2_checkpointed"); }
TEST(zero2_with_no_sync_accumulation_equals_ddp) { on_2_3_4("zero2_no_sync"); }

TEST(zero3_with_sgd_equals_ddp) { on_2_3_4("zero3_sgd"); }
TEST(zero3_with_adamw_equals_ddp) { on_2_3_4("zero3_adamw"); }
TEST(zero3_with_adamw_and_clipping_equals_ddp) { on_2_3_4("zero3_adamw_clip"); }
TEST(zero3_in_float64_equals_ddp_to_1e_12) {
    on_2_3_4("zero3_sgd_f64");
    on_2_3_4("zero3_adamw_f64");
}
TEST(zero3_with_a_unit_used_on_one_rank_equals_ddp) { on_2_3_4("zero3_unused"); }
TEST(zero3_with_activation_checkpointing_equals_ddp) { on_2_3_4("zero3_checkpointed"); }
TEST(zero3_with_no_sync_accumulation_equals_ddp) { on_2_3_4("zero3_no_sync"); }

TEST(model_state_follows_the_zero_accounting) {
    on_2_3_4("zero1_memory");
    on_2_3_4("zero2_memory");
    on_2_3_4("zero3_memory");
}

TEST(sharding_refuses_what_it_cannot_do_by_name) { passes(2, "errors"); }

/* A rank killed mid-run: ctlaunch reports its signal, and the others fail
 * their step naming it. */
TEST(a_rank_killed_mid_run_fails_the_others_with_its_name) {
    ends_with(3, "zero2_peer_dies", env, 128 + SIGKILL, 2);
    ends_with(3, "zero3_peer_dies", env, 128 + SIGKILL, 2);
}

/* With the progress thread moving ZeRO-2's reduces and ZeRO-3's prefetched
 * allgathers while the ranks compute (AUTO's choice on a bigger machine). */
TEST(every_stage_with_the_progress_thread_equals_ddp) {
    passes_with(2, "zero1_adamw_clip", thread_env);
    passes_with(2, "zero2_adamw_clip", thread_env);
    passes_with(3, "zero2_checkpointed", thread_env);
    passes_with(2, "zero3_adamw_clip", thread_env);
    passes_with(3, "zero3_checkpointed", thread_env);
    passes_with(2, "zero3_no_sync", thread_env);
}
