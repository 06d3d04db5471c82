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
    tt_ctlaunch_scenario(CTLAUNCH_PATH, DAUTOGRAD_RANK_PATH, np, scenario, code, skip, DEADLINE);
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
