/* ct_dist_init in one process: a world of one without a launcher, the
 * choice of backend and timeout from options and the environment and their
 * errors, the life cycle (init twice, finalize twice), process-group
 * arguments, and a one-rank ctlaunch world against a store of the test's
 * own, whose heartbeats are read back. Multi-rank jobs run in
 * test_launcher (ctlaunch) and the collectives tests (mpirun). */
#include "ct_test.h"

#include <ct/cuda.h>

#include <arpa/inet.h>
#include <ct/dist.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

/* A TCP port on 127.0.0.1 that nothing listens on (it was free a moment
 * ago). */
static int unused_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
        !getsockname(fd, (struct sockaddr *)&a, &len))
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

TEST(a_world_of_one_needs_no_launcher) {
    tt_launch_env(NULL);
    ASSERT_TRUE(!ct_dist_is_initialized());
    ASSERT_TRUE(ct_dist_world() == NULL && ct_dist_comm() == NULL && ct_dist_store() == NULL);
    ASSERT_EQ(ct_dist_init(NULL), 0);
    ASSERT_TRUE(ct_dist_is_initialized());
    const ct_world *w = ct_dist_world();
    ASSERT_TRUE(w != NULL);
    ASSERT_EQ(w->source, CT_WORLD_SINGLE);
    ASSERT_EQ(w->size, 1);
    ct_comm *comm = ct_dist_comm();
    ASSERT_TRUE(comm != NULL);
    ASSERT_EQ(ct_comm_size(comm), 1);
    ASSERT_EQ(ct_comm_backend(comm), CT_BACKEND_SHM);
    ASSERT_NEAR(ct_comm_timeout(comm), CT_COMM_DEFAULT_TIMEOUT, 0);
    ASSERT_TRUE(ct_dist_store() == NULL);
    ct_tensor *t = ct_arange(0, 4, 1, CT_FLOAT32);
    ASSERT_EQ(ct_comm_allreduce(comm, t, CT_REDUCE_SUM, NULL), 0);
    ASSERT_NEAR(ct_item(ct_sum(t, NULL, 0, false)), 6, 0);
    ct_comm *group = NULL;
    ASSERT_EQ(ct_dist_new_group((int[]){0}, 1, &group), 0);
    ASSERT_TRUE(group != NULL);
    ASSERT_EQ(ct_comm_size(group), 1);
    ct_comm_free(group);
    ct_dist_heartbeat();
    ct_dist_finalize();
    ASSERT_TRUE(!ct_dist_is_initialized());
    ASSERT_TRUE(ct_dist_comm() == NULL);
    ct_dist_finalize();
    /* And again: a second init makes a segment of its own. */
    ASSERT_EQ(ct_dist_init(&(ct_dist_options){.backend = "shm", .timeout_s = 7}), 0);
    ASSERT_NEAR(ct_comm_timeout(ct_dist_comm()), 7, 0);
    ct_dist_finalize();
}

TEST(init_twice_is_a_state_error) {
    tt_launch_env(NULL);
    ASSERT_EQ(ct_dist_init(NULL), 0);
    ASSERT_RC(ct_dist_init(NULL), CT_ESTATE, "already initialized", "ct_dist_finalize first");
    ASSERT_TRUE(ct_dist_is_initialized());
    ct_dist_finalize();
    ct_dist_finalize();
    ASSERT_TRUE(!ct_dist_is_initialized());
}

TEST(bad_backends_and_timeouts_are_named) {
    tt_launch_env(NULL);
    ASSERT_RC(ct_dist_init(&(ct_dist_options){.backend = "ucc"}), CT_EINVAL, "backend \"ucc\"",
              "auto, shm, mpi, nccl, gloo and hier");
    tt_launch_env((const char *[]){"CT_BACKEND", "tcp", NULL});
    ASSERT_RC(ct_dist_init(NULL), CT_EINVAL, "CT_BACKEND=\"tcp\"",
              "auto, shm, mpi, nccl, gloo and hier");
    /* An explicit option wins over the variable, and "auto" defers to it. */
    ASSERT_EQ(ct_dist_init(&(ct_dist_options){.backend = "shm"}), 0);
    ct_dist_finalize();
    ASSERT_RC(ct_dist_init(&(ct_dist_options){.backend = "auto"}), CT_EINVAL, "CT_BACKEND");
    const char *bad_timeouts[] = {"soon", "0", "-1", "inf", "nan", "5s", ""};
    for (size_t i = 0; i < sizeof bad_timeouts / sizeof *bad_timeouts; i++) {
        tt_launch_env((const char *[]){"CT_TIMEOUT", bad_timeouts[i], NULL});
        ASSERT_RC(ct_dist_init(NULL), CT_EINVAL, "CT_TIMEOUT=\"", "seconds > 0");
    }
    tt_launch_env((const char *[]){"CT_TIMEOUT", "2.5", NULL});
    ASSERT_EQ(ct_dist_init(NULL), 0);
    ASSERT_NEAR(ct_comm_timeout(ct_dist_comm()), 2.5, 0);
    ct_dist_finalize();
    tt_launch_env(NULL);
    ASSERT_RC(ct_dist_init(&(ct_dist_options){.timeout_s = -3}), CT_EINVAL, "timeout_s is -3");
    tt_launch_env((const char *[]){"CT_RANK", "4", "CT_WORLD_SIZE", "2", NULL});
    ASSERT_RC(ct_dist_init(NULL), CT_EINVAL, "dist_init: world: CT_RANK=\"4\"");
    ASSERT_TRUE(!ct_dist_is_initialized());
    tt_launch_env(NULL);
}

/* gloo in a world of one meets nobody and needs no store; without the
 * library it says what to install. */
TEST(gloo_runs_a_world_of_one) {
    tt_launch_env(NULL);
    if (!ct_backend_available(CT_BACKEND_GLOO)) {
        ASSERT_RC(ct_dist_init(&(ct_dist_options){.backend = "gloo"}), CT_ENOTSUP, "libgloo-dev");
        return;
    }
    ASSERT_EQ(ct_dist_init(&(ct_dist_options){.backend = "gloo"}), 0);
    ASSERT_EQ(ct_comm_backend(ct_dist_comm()), CT_BACKEND_GLOO);
    ct_tensor *t = ct_full(CT_SHAPE(3), 1.5, CT_BFLOAT16);
    ASSERT_EQ(ct_comm_allreduce(ct_dist_comm(), t, CT_REDUCE_AVG, NULL), 0);
    ASSERT_NEAR(ct_item(ct_sum(t, NULL, 0, false)), 4.5, 0);
    ct_dist_finalize();
}

TEST(backends_this_job_cannot_use_say_why) {
    tt_launch_env(NULL);
    /* nccl needs the build's NCCL and a device for this rank (with one,
     * it would start: not this test's business). */
    if (!ct_backend_available(CT_BACKEND_NCCL))
        ASSERT_RC(ct_dist_init(&(ct_dist_options){.backend = "nccl"}), CT_ENOTSUP, "backend nccl",
                  "no");
    else if (ct_cuda_device_count() == 0)
        ASSERT_RC(ct_dist_init(&(ct_dist_options){.backend = "nccl"}), CT_EDEVICE,
                  "backend nccl needs a CUDA device");
    if (!ct_backend_available(CT_BACKEND_MPI))
        ASSERT_RC(ct_dist_init(&(ct_dist_options){.backend = "mpi"}), CT_ENOTSUP,
                  "this build of ct has no MPI");
    /* ctlaunch on two machines: mpi (auto's choice in a build without
     * gloo), which ctlaunch cannot start; shm cannot span machines.
     * Neither touches the store. */
    tt_launch_env((const char *[]){"CT_RANK", "0", "CT_WORLD_SIZE", "4", "CT_LOCAL_WORLD_SIZE", "2",
                                   "CT_MASTER_ADDR", "127.0.0.1", "CT_MASTER_PORT", "9", NULL});
    if (!ct_backend_available(CT_BACKEND_GLOO))
        ASSERT_RC(ct_dist_init(NULL), CT_ENOTSUP, "backend mpi");
    setenv("CT_BACKEND", "mpi", 1);
    ASSERT_RC(ct_dist_init(NULL), CT_ENOTSUP, "backend mpi");
    if (ct_backend_available(CT_BACKEND_MPI))
        ASSERT_RC(ct_dist_init(NULL), CT_ENOTSUP, "backend mpi under ctlaunch (4 ranks)",
                  "needs an MPI launcher: mpirun -np 4");
    setenv("CT_BACKEND", "shm", 1);
    ASSERT_RC(ct_dist_init(NULL), CT_EINVAL, "backend shm needs every rank on one machine",
              "4 ranks with 2 on this machine (ctlaunch)");
    /* torchrun's env:// is ct's own rendezvous too. */
    tt_launch_env((const char *[]){"RANK", "0", "WORLD_SIZE", "2", "LOCAL_WORLD_SIZE", "1",
                                   "MASTER_ADDR", "127.0.0.1", "MASTER_PORT", "9", "CT_BACKEND",
                                   "mpi", NULL});
    if (ct_backend_available(CT_BACKEND_MPI))
        ASSERT_RC(ct_dist_init(NULL), CT_ENOTSUP, "backend mpi under env:// (2 ranks)");
    /* Several ranks without a store to meet at. */
    tt_launch_env((const char *[]){"CT_RANK", "0", "CT_WORLD_SIZE", "2", NULL});
    ASSERT_RC(ct_dist_init(NULL), CT_EINVAL, "CT_MASTER_ADDR and CT_MASTER_PORT are unset");
    ASSERT_TRUE(!ct_dist_is_initialized());
    tt_launch_env(NULL);
}

TEST(an_unreachable_store_fails_within_the_timeout) {
    char port[16];
    snprintf(port, sizeof port, "%d", unused_port());
    tt_launch_env((const char *[]){"CT_RANK", "0", "CT_WORLD_SIZE", "1", "CT_MASTER_ADDR",
                                   "127.0.0.1", "CT_MASTER_PORT", port, "CT_TIMEOUT", "0.5", NULL});
    double t0 = tt_now();
    ASSERT_RC(ct_dist_init(NULL), CT_EPEER, "dist_init: rank 0 cannot reach the store",
              "127.0.0.1");
    ASSERT_TRUE(tt_now() - t0 < 3);
    ASSERT_TRUE(!ct_dist_is_initialized());
    tt_launch_env(NULL);
}

/* The value of key, waiting up to timeout_s for it to hold `want`. */
static bool value_becomes(ct_store *store, const char *key, const char *want, double timeout_s) {
    double end = tt_now() + timeout_s;
    do {
        void *v = NULL;
        size_t len = 0;
        bool ok = !ct_store_get(store, key, &v, &len, 0.5) && !strcmp(v, want);
        free(v);
        if (ok)
            return true;
        usleep(20000);
    } while (tt_now() < end);
    return false;
}

TEST(under_ctlaunch_a_rank_sends_heartbeats) {
    ct_store_server *server = ct_store_server_new("127.0.0.1", 0);
    ASSERT_TRUE(server);
    char port[16];
    snprintf(port, sizeof port, "%d", ct_store_server_port(server));
    tt_launch_env((const char *[]){"CT_RANK", "0", "CT_WORLD_SIZE", "1", "CT_MASTER_ADDR",
                                   "127.0.0.1", "CT_MASTER_PORT", port, "CT_RESTART_COUNT", "3",
                                   "CT_TIMEOUT", "5", NULL});
    ct_store *reader = ct_store_connect("127.0.0.1", ct_store_server_port(server), 2);
    ASSERT_TRUE(reader);
    ASSERT_EQ(ct_dist_init(NULL), 0);
    ASSERT_TRUE(ct_dist_store() != NULL);
    ASSERT_EQ(ct_dist_world()->restart_count, 3);
    ASSERT_TRUE(value_becomes(reader, "ct/hb/3/0", "0 -", 2));
    /* A completed collective and two explicit heartbeats are progress. */
    ct_tensor *t = ct_ones(CT_SHAPE(3), CT_FLOAT32);
    ASSERT_EQ(ct_comm_allreduce(ct_dist_comm(), t, CT_REDUCE_SUM, NULL), 0);
    ct_dist_heartbeat();
    ct_dist_heartbeat();
    ASSERT_TRUE(value_becomes(reader, "ct/hb/3/0", "3 -", 3));
    /* Finalize stops the thread promptly, and its last word is "done". */
    double t0 = tt_now();
    ct_dist_finalize();
    ASSERT_TRUE(tt_now() - t0 < 0.5);
    ASSERT_TRUE(value_becomes(reader, "ct/hb/3/0", "3 done", 0.1));
    ct_store_free(reader);
    ct_store_server_free(server);
    tt_launch_env(NULL);
}

TEST(new_group_checks_its_list) {
    tt_launch_env(NULL);
    ct_comm *group = (ct_comm *)1;
    ASSERT_RC(ct_dist_new_group((int[]){0}, 1, &group), CT_ESTATE, "ct_dist_init first");
    ASSERT_TRUE(group == NULL);
    ASSERT_EQ(ct_dist_init(NULL), 0);
    ASSERT_RC(ct_dist_new_group((int[]){0}, 0, &group), CT_EINVAL, "0 ranks",
              "expected at least 1");
    ASSERT_RC(ct_dist_new_group(NULL, 1, &group), CT_EINVAL, "NULL list");
    ASSERT_RC(ct_dist_new_group((int[]){0}, 1, NULL), CT_EINVAL, "out is NULL");
    ASSERT_RC(ct_dist_new_group((int[]){1}, 1, &group), CT_EINVAL,
              "ranks[0] = 1 is outside the world [0, 1)");
    ASSERT_RC(ct_dist_new_group((int[]){-1}, 1, &group), CT_EINVAL, "ranks[0] = -1");
    ASSERT_RC(ct_dist_new_group((int[]){0, 0}, 2, &group), CT_EINVAL,
              "rank 0 is listed twice (ranks[0] and ranks[1])");
    ct_dist_finalize();
}
