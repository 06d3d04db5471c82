/* RPC across real processes: rpc_rank under ctlaunch. Calls of every kind,
 * remote errors, unknown functions, timeouts, a worker that dies inside a
 * call, noise sent straight to a worker's socket, and outsiders without
 * the job's secret. Each run has a
 * deadline, and every rank (each prints pid=N) is checked to be gone
 * afterwards. */
#include "ct_test.h"

#include <signal.h>
#include <stdlib.h>

/* Far above what a run takes, and above rpc_rank's timeout (10 s). */
#define DEADLINE 60

static void runs(int np, const char *scenario, int code, int skip) {
    tt_ctlaunch_scenario(CTLAUNCH_PATH, RPC_RANK_PATH, np, scenario, code, skip, DEADLINE);
}

TEST(values_of_every_type_round_trip_between_3_workers) { runs(3, "calls", 0, -1); }
TEST(remote_references_hold_values_on_their_owner) { runs(3, "rrefs", 0, -1); }
TEST(remote_errors_unknown_functions_and_timeouts_are_reported) { runs(2, "errors", 0, -1); }
TEST(a_worker_dying_inside_a_call_fails_the_caller_naming_it) {
    runs(2, "peer_dies", 128 + SIGKILL, 1);
}
TEST(a_worker_that_hangs_is_declared_dead_by_its_silence) {
    runs(2, "peer_hangs", 128 + SIGKILL, 1);
}
TEST(noise_sent_to_a_worker_does_not_stop_it) { runs(2, "garbage", 0, -1); }
TEST(outsiders_without_the_secret_get_no_answer) { runs(2, "outsiders", 0, -1); }
TEST(frames_pending_calls_and_remote_references_are_bounded) {
    setenv("CT_RPC_MAX_FRAME_BYTES", "65536", 1);
    setenv("CT_RPC_MAX_PENDING", "2", 1);
    setenv("CT_RPC_MAX_RREFS", "3", 1);
    runs(2, "limits", 0, -1);
    unsetenv("CT_RPC_MAX_FRAME_BYTES");
    unsetenv("CT_RPC_MAX_PENDING");
    unsetenv("CT_RPC_MAX_RREFS");
}
