/* The RPC examples run as users run them, briefly: param_server (a
 * parameter server and two trainers, ctlaunch -np 3) and two_stage (the MLP
 * split over two workers, ctlaunch -np 2) each train 40 steps on
 * Fashion-MNIST and must end with a test accuracy well above chance and
 * every rank gone. Their full runs, against fmnist_mlp, are in
 * docs/examples-rpc.md. */
#include "ct_test.h"

#include <stdlib.h>
#include <unistd.h>

#define DEADLINE 120

static void require_data(void) {
    if (access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) != 0) {
        printf("skipped: Fashion-MNIST is not installed (ci/setup.sh installs it)\n");
        exit(77);
    }
}

/* Runs an example on np ranks and returns the test accuracy of its JSON
 * summary, or -1. */
static double accuracy_of(const char *np, const char *example) {
    static tt_job j;
    tt_run_job(&j,
               (const char *const[]){CTLAUNCH_PATH, "-np", np, example, "--max-steps", "40",
                                     "--epochs", "1", "--timeout", "30", NULL},
               (const char *const[]){"CT_BACKEND", NULL}, DEADLINE);
    const char *at = strstr(j.out, "\"test_acc\": ");
    if (tt_job_exit_code(&j) != 0 || !at) {
        tt_fail(__FILE__, __LINE__,
                "%s: exit code %d, no summary\n--- stdout ---\n%s--- stderr ---\n%s", example,
                tt_job_exit_code(&j), tt_tail(j.out), tt_tail(j.err));
        return -1;
    }
    double acc = strtod(at + strlen("\"test_acc\": "), NULL);
    printf("  %s on %s ranks: test accuracy %.4f after 40 steps, %.1f s\n", example, np, acc,
           j.seconds);
    return acc;
}

/* Chance is 0.1; 40 steps of SGD reach about 0.5. */
TEST(param_server_trains_through_rpc_and_distributed_autograd) {
    require_data();
    ASSERT_TRUE(accuracy_of("3", PARAM_SERVER_PATH) > 0.3);
}

TEST(two_stage_trains_a_model_split_over_two_workers) {
    require_data();
    ASSERT_TRUE(accuracy_of("2", TWO_STAGE_PATH) > 0.3);
}
