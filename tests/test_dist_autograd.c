/* Distributed autograd across real processes: dautograd_rank under
 * ctlaunch. Exact gradients through a model split over 2 and 3 workers,
 * concurrent contexts, a remote backward that fails, contexts that end or
 * expire, and workers killed during forward and during backward. Each run
 * has a deadline, and every rank is checked to be gone afterwards. */
#include "ct_test.h"

#include <signal.h>

/* Far above what a run takes, and above dautograd_rank's timeout (10 s). */
#define DEADLINE 60

static void runs(int np, const char *scenario, int code, int skip) {
    static tt_job j;
    char npstr[16];
    snprintf(npstr, sizeof npstr, "%d", np);
    tt_run_job(&j,
               (const char *const[]){CTLAUNCH_PATH, "-np", npstr, "--grace", "20",
                                     DAUTOGRAD_RANK_PATH, scenario, NULL},
               (const char *const[]){"CT_BACKEND", NULL}, DEADLINE);
    TT_ASSERT_JOB(&j, tt_job_no_rank_left(&j));
    TT_ASSERT_JOB(&j, tt_job_exit_code(&j) == code);
    TT_ASSERT_JOB(&j, tt_job_ranks_passed(&j, scenario, np, skip, true));
    printf("  %s on %d ranks: %.1f s\n", scenario, np, j.seconds);
}

TEST(gradients_across_2_workers_equal_the_local_model_s) { runs(2, "exact", 0, -1); }
TEST(gradients_across_3_workers_equal_the_local_model_s) { runs(3, "exact", 0, -1); }
TEST(concurrent_contexts_of_two_trainers_do_not_mix) { runs(3, "concurrent", 0, -1); }
TEST(a_failing_remote_backward_and_released_contexts_fail_clearly) { runs(2, "fails", 0, -1); }
TEST(a_worker_killed_during_forward_fails_the_caller_and_its_context) {
    runs(2, "dies_forward", 128 + SIGKILL, 1);
}
TEST(a_worker_killed_during_backward_fails_the_backward_and_its_context) {
    runs(2, "dies_backward", 128 + SIGKILL, 1);
}
