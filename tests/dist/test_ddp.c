/* Data-parallel training across real processes: ddp_rank trains a small
 * model with ct_ddp under ctlaunch (the shm backend) and checks it against
 * the same training in one process, and the errors a job meets (models
 * that differ, unused parameters, a parameter ready twice) on every rank,
 * and uneven inputs (ct_ddp_join). Each run has a deadline, and every rank
 * (each prints pid=N) is checked to be gone afterwards. */
#include "ct_test.h"

/* The deadline of one run, in seconds: far above what a passing run takes
 * (a second or two), and above the collective timeout ddp_rank sets (10 s),
 * so that ranks falling out of step end with their own report of it. */
#define DEADLINE 40

/* Under ctlaunch the ranks run its default backend, shm, whatever the
 * caller's CT_BACKEND says. ct_ddp's progress mode is its AUTO choice
 * (which depends on the machine's cores), or the one DDP_TEST_PROGRESS
 * names to ddp_rank. */
static const char *const auto_env[] = {"CT_BACKEND", "DDP_TEST_PROGRESS", NULL};
static const char *const thread_env[] = {"CT_BACKEND", "DDP_TEST_PROGRESS=thread", NULL};
static const char *const end_env[] = {"CT_BACKEND", "DDP_TEST_PROGRESS=end", NULL};

/* Runs scenario under ctlaunch on np ranks with env: the job must end with
 * 0 before its deadline, leave no rank behind, and every rank must pass. */
static void passes_with(int np, const char *scenario, const char *const *env) {
    static tt_job j;
    char npstr[16];
    snprintf(npstr, sizeof npstr, "%d", np);
    tt_run_job(&j,
               (const char *const[]){CTLAUNCH_PATH, "-np", npstr, DDP_RANK_PATH, scenario, NULL},
               env, DEADLINE);
    TT_ASSERT_JOB(&j, tt_job_no_rank_left(&j));
    TT_ASSERT_JOB(&j, tt_job_exit_code(&j) == 0);
    TT_ASSERT_JOB(&j, tt_job_ranks_passed(&j, scenario, np, -1, true));
    printf("  %s on %d ranks: %.1f s\n", scenario, np, j.seconds);
}

static void passes(int np, const char *scenario) { passes_with(np, scenario, auto_env); }

/* ----------------------------------------------------------- equivalence */

TEST(sgd_with_momentum_on_2_ranks_matches_one_process) { passes(2, "sgd"); }
TEST(sgd_with_momentum_on_3_ranks_matches_one_process) { passes(3, "sgd"); }
TEST(adamw_on_2_ranks_matches_one_process) { passes(2, "adamw"); }
TEST(adamw_on_3_ranks_matches_one_process) { passes(3, "adamw"); }
TEST(activation_checkpointing_with_static_graph_on_2_ranks_matches_one_process) {
    passes(2, "checkpointed");
}
TEST(activation_checkpointing_with_static_graph_on_3_ranks_matches_one_process) {
    passes(3, "checkpointed");
}

/* ---------------------------------------------------------------- errors */

/* Only rank 1 differs: rank 2 must still fail, and name it. */
TEST(models_that_differ_fail_on_every_rank_naming_both_shapes) { passes(3, "mismatched_models"); }
TEST(an_unused_parameter_fails_backward_on_every_rank_naming_it) { passes(2, "unused_fails"); }
TEST(a_parameter_used_on_one_rank_trains_on_every_rank_alike) { passes(3, "partly_unused"); }
TEST(find_unused_parameters_trains_with_a_zero_gradient_for_the_unused_one) {
    passes(2, "unused_found");
}
TEST(a_parameter_ready_twice_without_static_graph_fails_naming_it) {
    passes(2, "ready_twice_fails");
}
TEST(a_parameter_ready_twice_with_static_graph_trains_and_matches) {
    passes(2, "ready_twice_static");
}

/* -------------------------------------------------- no_sync, hook, buckets */

TEST(no_sync_micro_steps_on_2_ranks_equal_one_step_on_the_whole_batch) { passes(2, "no_sync"); }
TEST(no_sync_micro_steps_on_3_ranks_equal_one_step_on_the_whole_batch) { passes(3, "no_sync"); }
TEST(the_bf16_hook_on_2_ranks_averages_within_bf16_rounding) { passes(2, "bf16_hook"); }
TEST(the_bf16_hook_on_3_ranks_averages_within_bf16_rounding) { passes(3, "bf16_hook"); }
TEST(buckets_hold_the_parameters_in_reverse_registration_order) { passes(2, "bucket_order"); }

/* ---------------------------------------------------------- uneven inputs */

/* Rank r runs 3 + 2 r steps, then joins: no rank hangs, and the ranks still
 * training match a reference whose gradient, with k of n ranks training, is
 * the sum of their shares' gradients over n. */
TEST(uneven_inputs_on_2_ranks_join_and_match_the_reference) { passes(2, "uneven"); }
TEST(uneven_inputs_on_3_ranks_join_and_match_the_reference) { passes(3, "uneven"); }
TEST(join_without_uneven_inputs_fails_naming_the_option) { passes(2, "join_needs_uneven_inputs"); }

/* ---------------------------------------------- both progress modes */

/* AUTO picks one mode on a given machine; these run the scenarios that
 * move gradients under each mode explicitly. */
TEST(buckets_started_as_they_fill_match_one_process) {
    passes_with(2, "sgd", thread_env);
    passes_with(3, "checkpointed", thread_env);
    passes_with(2, "no_sync", thread_env);
    passes_with(2, "uneven", thread_env);
    passes_with(2, "bf16_hook", thread_env);
}

TEST(buckets_started_at_the_end_match_one_process) {
    passes_with(2, "sgd", end_env);
    passes_with(3, "checkpointed", end_env);
    passes_with(2, "no_sync", end_env);
    passes_with(2, "uneven", end_env);
    passes_with(2, "unused_fails", end_env);
}
