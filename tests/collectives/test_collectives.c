/* Collectives across real processes: coll_rank checks every operation
 * against a serial reference under ctlaunch (2, 3 and 4 ranks, the shm
 * backend; 2 and 3 ranks, the gloo backend) and under mpirun (the mpi backend, shm once, and the
 * default choice, shm on one machine), and the failures a job meets: a rank killed mid-operation,
 * ranks that disagree, a rank that arrives too late. Each run has a deadline, and every rank (each
 * prints pid=N) is checked to be gone afterwards.
 *
 * Three ctest entries run this program: test_collectives names the
 * ctlaunch tests, test_collectives_gloo the gloo ones (exit 77 in a build
 * without gloo), test_collectives_mpi the mpirun ones, which exit 77 where
 * Open MPI is missing. */
#include "ct_test.h"

#include <ct/collectives.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

/* Deadlines of one run, in seconds: far above what a passing run takes (a
 * few seconds), and above the collective timeouts coll_rank sets (20 s for
 * correctness, 10 s or less for the failure scenarios), so that a hang
 * ends with the ranks' own report of it. */
#define CORRECTNESS_DEADLINE 45
#define SCENARIO_DEADLINE    30

/* Under ctlaunch the ranks run backend (CT_BACKEND), or with NULL its
 * default, shm, whatever the caller's CT_BACKEND says. */
static void run_ctlaunch(tt_job *j, int np, const char *backend, const char *scenario,
                         double deadline) {
    char npstr[16], backend_var[64] = "CT_BACKEND";
    snprintf(npstr, sizeof npstr, "%d", np);
    if (backend)
        snprintf(backend_var, sizeof backend_var, "CT_BACKEND=%s", backend);
    /* A long --grace: the peer_killed survivors ignore SIGTERM to report
     * what they saw (coll_rank.c says why). */
    tt_run_job(j,
               (const char *const[]){CTLAUNCH_PATH, "-np", npstr, "--grace", "20", COLL_RANK_PATH,
                                     scenario, NULL},
               (const char *const[]){backend_var, NULL}, deadline);
}

/* Runs scenario under ctlaunch on np ranks with backend (NULL: ctlaunch's
 * default): no rank may be left behind, the job must end with code, and
 * every rank but skip (-1: none) must pass. */
static void passes_with(const char *backend, int np, const char *scenario, double deadline,
                        int code, int skip) {
    static tt_job j;
    run_ctlaunch(&j, np, backend, scenario, deadline);
    TT_ASSERT_JOB(&j, tt_job_no_rank_left(&j));
    TT_ASSERT_JOB(&j, tt_job_exit_code(&j) == code);
    TT_ASSERT_JOB(&j, tt_job_ranks_passed(&j, scenario, np, skip, true));
    printf("  %s on %d ranks under ctlaunch (%s): %.1f s\n", scenario, np,
           backend ? backend : "default backend", j.seconds);
}

static void passes_under_ctlaunch(int np, const char *scenario, double deadline, int code,
                                  int skip) {
    passes_with(NULL, np, scenario, deadline, code, skip);
}

TEST(every_operation_is_correct_on_2_ranks_under_ctlaunch) {
    passes_under_ctlaunch(2, "correctness", CORRECTNESS_DEADLINE, 0, -1);
}
TEST(every_operation_is_correct_on_3_ranks_under_ctlaunch) {
    passes_under_ctlaunch(3, "correctness", CORRECTNESS_DEADLINE, 0, -1);
}
TEST(every_operation_is_correct_on_4_ranks_under_ctlaunch) {
    passes_under_ctlaunch(4, "correctness", CORRECTNESS_DEADLINE, 0, -1);
}

/* ctlaunch reports the killed rank's signal as the job's; the survivors
 * report CT_EPEER naming rank 2 and exit on their own. */
TEST(a_rank_killed_mid_allreduce_fails_the_others_with_its_name) {
    passes_under_ctlaunch(3, "peer_killed", SCENARIO_DEADLINE, 128 + SIGKILL, 2);
}

TEST(ranks_disagreeing_on_the_count_all_fail_naming_both) {
    passes_under_ctlaunch(3, "count_mismatch", SCENARIO_DEADLINE, 0, -1);
}

/* The same two failures on the direct path, which reads the peers' memory
 * instead of channels. */
TEST(a_rank_killed_mid_allreduce_in_shared_memory_fails_the_others_with_its_name) {
    passes_under_ctlaunch(3, "peer_killed_shared", SCENARIO_DEADLINE, 128 + SIGKILL, 2);
}

TEST(ranks_disagreeing_on_the_count_in_shared_memory_all_fail_naming_both) {
    passes_under_ctlaunch(3, "count_mismatch_shared", SCENARIO_DEADLINE, 0, -1);
}

TEST(ranks_disagreeing_on_the_dtype_all_fail_naming_both) {
    passes_under_ctlaunch(2, "dtype_mismatch", SCENARIO_DEADLINE, 0, -1);
}

TEST(a_late_rank_times_the_others_out_and_fails_itself) {
    passes_under_ctlaunch(3, "late_rank", SCENARIO_DEADLINE, 0, -1);
}

TEST(finalize_after_a_timeout_does_not_wait_for_a_stuck_rank) {
    passes_under_ctlaunch(3, "stuck_peer", SCENARIO_DEADLINE, 0, -1);
}

/* ------------------------------------------------------------------ gloo */

static void passes_with_gloo(int np, const char *scenario, double deadline, int code, int skip) {
    if (!ct_backend_available(CT_BACKEND_GLOO)) {
        printf("skipped: this build has no gloo backend (libgloo-dev was not found)\n");
        exit(77);
    }
    passes_with("gloo", np, scenario, deadline, code, skip);
}

/* 3 ranks: the reference's 256 among small terms tells a float32
 * accumulation of float16 and bfloat16 from one in 16 bits. */
TEST(every_operation_is_correct_on_2_ranks_with_gloo) {
    passes_with_gloo(2, "correctness", CORRECTNESS_DEADLINE, 0, -1);
}
TEST(every_operation_is_correct_on_3_ranks_with_gloo) {
    passes_with_gloo(3, "correctness", CORRECTNESS_DEADLINE, 0, -1);
}
/* No thread of the backend's takes SIGPIPE (a peer's close kills the
 * process otherwise; seen in test_hier under ASan). */
TEST(the_threads_of_gloo_block_sigpipe) {
    passes_with_gloo(2, "signal_masks", SCENARIO_DEADLINE, 0, -1);
}
/* The survivors, one of them with no connection of its operation to the
 * victim, report CT_EPEER naming rank 2, within half the timeout. */
TEST(a_rank_killed_mid_allreduce_with_gloo_fails_the_others_with_its_name) {
    passes_with_gloo(3, "peer_killed", SCENARIO_DEADLINE, 128 + SIGKILL, 2);
}
TEST(ranks_disagreeing_on_the_count_with_gloo_all_fail_naming_both) {
    passes_with_gloo(3, "count_mismatch", SCENARIO_DEADLINE, 0, -1);
}
TEST(ranks_disagreeing_on_the_dtype_with_gloo_all_fail_naming_both) {
    passes_with_gloo(2, "dtype_mismatch", SCENARIO_DEADLINE, 0, -1);
}
TEST(ranks_calling_different_operations_with_gloo_all_fail_naming_both) {
    passes_with_gloo(3, "op_mismatch", SCENARIO_DEADLINE, 0, -1);
}
TEST(a_late_rank_with_gloo_times_the_others_out_and_fails_itself) {
    passes_with_gloo(3, "late_rank", SCENARIO_DEADLINE, 0, -1);
}
TEST(finalize_after_a_timeout_with_gloo_does_not_wait_for_a_stuck_rank) {
    passes_with_gloo(3, "stuck_peer", SCENARIO_DEADLINE, 0, -1);
}

/* ---------------------------------------------------------------- mpirun */

static void require_mpi(void) {
    if (!MPIEXEC_PATH[0] || access(MPIEXEC_PATH, X_OK) != 0 ||
        !ct_backend_available(CT_BACKEND_MPI)) {
        printf("skipped: this build has no Open MPI (mpiexec '%s', mpi backend %s)\n", MPIEXEC_PATH,
               ct_backend_available(CT_BACKEND_MPI) ? "built" : "not built");
        exit(77);
    }
}

static void run_mpirun(tt_job *j, int np, const char *backend, const char *scenario,
                       double deadline) {
    require_mpi();
    char npstr[16], backend_var[64];
    snprintf(npstr, sizeof npstr, "%d", np);
    snprintf(backend_var, sizeof backend_var, "CT_BACKEND=%s", backend);
    /* Open MPI refuses root without its two variables; oversubscribing lets
     * more ranks run than this machine has cores. Its shared-memory
     * transport copies large messages with process_vm_readv, which
     * containers (Docker's default seccomp profile, as in CI) forbid; the
     * copy through its own shared memory works everywhere. */
    tt_run_job(j,
               (const char *const[]){MPIEXEC_PATH, "--oversubscribe", "-np", npstr, COLL_RANK_PATH,
                                     scenario, NULL},
               (const char *const[]){backend_var, "OMPI_ALLOW_RUN_AS_ROOT=1",
                                     "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                     "OMPI_MCA_btl_vader_single_copy_mechanism=none", NULL},
               deadline);
}

/* mpirun does not tag the ranks' output; each rank's verdict is counted. */
static void passes_under_mpirun(int np, const char *backend, const char *scenario,
                                double deadline) {
    static tt_job j;
    run_mpirun(&j, np, backend, scenario, deadline);
    TT_ASSERT_JOB(&j, tt_job_no_rank_left(&j));
    TT_ASSERT_JOB(&j, tt_job_exit_code(&j) == 0);
    TT_ASSERT_JOB(&j, tt_job_ranks_passed(&j, scenario, np, -1, false));
    printf("  %s on %d ranks under mpirun, %s backend: %.1f s\n", scenario, np, backend, j.seconds);
}

TEST(every_operation_is_correct_on_2_ranks_under_mpirun) {
    passes_under_mpirun(2, "mpi", "correctness", CORRECTNESS_DEADLINE);
}
TEST(every_operation_is_correct_on_3_ranks_under_mpirun) {
    passes_under_mpirun(3, "mpi", "correctness", CORRECTNESS_DEADLINE);
}
TEST(the_shm_backend_is_correct_under_mpirun) {
    passes_under_mpirun(2, "shm", "correctness", CORRECTNESS_DEADLINE);
}
TEST(mpirun_on_one_machine_picks_shm_by_default) {
    passes_under_mpirun(2, "auto", "auto_backend", SCENARIO_DEADLINE);
}
/* Open MPI's TCP transport listens on every interface of every rank, which
 * is Open MPI's to decide; on one machine its shared-memory transport does
 * without it, so that what listens is ct's alone. */
TEST(rank_0s_store_under_mpirun_on_one_machine_binds_loopback) {
    setenv("OMPI_MCA_btl", "self,vader", 1);
    passes_under_mpirun(2, "auto", "loopback", SCENARIO_DEADLINE);
    unsetenv("OMPI_MCA_btl");
}
TEST(ranks_disagreeing_under_mpirun_all_fail_naming_both) {
    passes_under_mpirun(3, "mpi", "count_mismatch", SCENARIO_DEADLINE);
}
TEST(a_late_rank_under_mpirun_times_the_others_out_and_fails_itself) {
    passes_under_mpirun(3, "mpi", "late_rank", SCENARIO_DEADLINE);
}

/* Under MPI the ranks whose allreduce timed out end without MPI_Finalize,
 * which would wait for the stuck rank (init_mpi.h); mpirun then reports
 * their abnormal end and kills the stuck rank, long before its 10 s sleep
 * is over: the job fails, and nobody waited. */
TEST(finalize_after_a_timeout_under_mpirun_does_not_wait_for_a_stuck_rank) {
    static tt_job j;
    run_mpirun(&j, 3, "mpi", "stuck_peer", SCENARIO_DEADLINE);
    TT_ASSERT_JOB(&j, tt_job_no_rank_left(&j));
    TT_ASSERT_JOB(&j, tt_job_exit_code(&j) != 0);
    TT_ASSERT_JOB(&j, tt_job_ranks_passed(&j, "stuck_peer", 3, 2, false));
    TT_ASSERT_JOB(&j, j.seconds < 8);
    printf("  stuck_peer on 3 ranks under mpirun: the job ended after %.1f s\n", j.seconds);
}
