/* Checkpoints across real processes: ckpt_rank saves and loads under
 * ctlaunch. Resharding (2 -> 1, 1 -> 3, 4 -> 2), the errors every rank must
 * agree on, a peer that dies mid-save, and exact resume after a crash,
 * restarted by ctlaunch --max-restarts, on 1 and 2 ranks. Each run has a
 * deadline, and every rank (each prints pid=N) is checked to be gone
 * afterwards. */
#include "ct_test.h"

#include <signal.h>
#include <stdlib.h>

/* Far above what a run takes (a second or two), and above ckpt_rank's
 * collective timeout (10 s). */
#define DEADLINE 60

static const char *ckpt_dir(void) {
    static char dir[256];
    return tt_tmp_path(dir, "");
}

/* Runs scenario on np ranks with extra ctlaunch flags (NULL-ended, may be
 * empty) and CKPT_SAVED_RANKS = saved; the job must end with code, leave no
 * rank behind, and every rank but skip must pass. */
static void runs(int np, const char *scenario, const char *const *flags, int saved, int code,
                 int skip) {
    static tt_job j;
    char npstr[16], dir[96], saved_env[48];
    snprintf(npstr, sizeof npstr, "%d", np);
    snprintf(dir, sizeof dir, "CKPT_DIR=%s", ckpt_dir());
    snprintf(saved_env, sizeof saved_env, "CKPT_SAVED_RANKS=%d", saved);
    const char *argv[16] = {CTLAUNCH_PATH, "-np", npstr, "--grace", "20"};
    int n = 5;
    for (int i = 0; flags[i]; i++)
        argv[n++] = flags[i];
    argv[n++] = CKPT_RANK_PATH;
    argv[n++] = scenario;
    argv[n] = NULL;
    tt_run_job(&j, argv, (const char *const[]){"CT_BACKEND", dir, saved_env, NULL}, DEADLINE);
    TT_ASSERT_JOB(&j, tt_job_no_rank_left(&j));
    TT_ASSERT_JOB(&j, tt_job_exit_code(&j) == code);
    TT_ASSERT_JOB(&j, tt_job_ranks_passed(&j, scenario, np, skip, true));
    printf("  %s on %d ranks: %.1f s\n", scenario, np, j.seconds);
}

static const char *const none[] = {NULL};

static void reshards(int from, int to) {
    runs(from, "reshard_save", none, from, 0, -1);
    if (!tt_failed())
        runs(to, "reshard_load", none, from, 0, -1);
}

TEST(two_ranks_save_and_one_loads_everything) { reshards(2, 1); }
TEST(one_rank_saves_and_three_load_their_blocks) { reshards(1, 3); }
TEST(four_ranks_in_a_grid_save_and_two_load_by_columns) { reshards(4, 2); }
TEST(ranks_disagreeing_on_a_tensor_all_fail_naming_both) { runs(2, "disagree", none, 2, 0, -1); }
TEST(overlapping_blocks_fail_on_every_rank) { runs(2, "overlap", none, 2, 0, -1); }
TEST(a_rank_dying_mid_save_fails_the_others_with_its_name) {
    runs(2, "peer_dies", none, 2, 128 + SIGKILL, 1);
}

static const char *const restart[] = {"--max-restarts", "1", NULL};
TEST(training_resumed_after_a_crash_on_1_rank_equals_training_without_one) {
    runs(1, "resume", restart, 1, 0, -1);
}
TEST(training_resumed_after_a_crash_on_2_ranks_equals_training_without_one) {
    runs(2, "resume", restart, 2, 0, -1);
}
