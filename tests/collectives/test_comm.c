/* Communicators in one process, with no launcher: a communicator of one
 * (every operation is the identity or a copy), argument and configuration
 * errors, segment names, and the life of ct_work handles. Tests that need
 * a peer run both ranks of a two-rank shm communicator in this process,
 * rank 1 on a thread of its own. */
#include "ct_test.h"

#include <ct/collectives.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Long enough never to fire in a passing test, short enough that a broken
 * one ends well within ctest's timeout. */
#define TIMEOUT 10.0

static const ct_dtype all_dtypes[] = {CT_FLOAT32, CT_FLOAT64, CT_BFLOAT16, CT_FLOAT16,
                                      CT_INT64,   CT_INT32,   CT_UINT8,    CT_BOOL};
static const ct_reduce_op all_ops[] = {CT_REDUCE_SUM, CT_REDUCE_AVG, CT_REDUCE_MIN, CT_REDUCE_MAX,
                                       CT_REDUCE_PROD};

/* A segment name no other test or process uses. */
static void segment_name(char *name, size_t cap) {
    static int counter;
    snprintf(name, cap, "/ct-test-comm-%ld-%d", (long)getpid(), counter++);
}

/* Whether nothing of that name is left in /dev/shm. */
static bool segment_gone(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    return access(path, F_OK) != 0;
}

static void sleep_for(double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
}

static ct_comm *comm_of_one(void) {
    char name[64];
    segment_name(name, sizeof name);
    return ct_comm_new(&(ct_comm_config){
        .backend = CT_BACKEND_SHM, .rank = 0, .size = 1, .timeout_s = TIMEOUT, .shm_name = name});
}

/* ------------------------------------------------ two ranks, one process */

typedef struct member {
    ct_comm_config cfg;
    char name[64];
    ct_comm *comm;
} member;

static void *member_join(void *arg) {
    member *m = arg;
    m->comm = ct_comm_new(&m->cfg);
    return NULL;
}

/* Starts rank r of a two-rank communicator named name joining on a thread. */
static bool member_start(member *m, pthread_t *th, const char *name, int r) {
    *m = (member){.cfg = {.backend = CT_BACKEND_SHM, .rank = r, .size = 2, .timeout_s = TIMEOUT}};
    snprintf(m->name, sizeof m->name, "%s", name);
    m->cfg.shm_name = m->name;
    return pthread_create(th, NULL, member_join, m) == 0;
}

/* c[0] and c[1]: both ranks of a new two-rank communicator, or NULLs. */
static void pair_new(ct_comm *c[2]) {
    char name[64];
    segment_name(name, sizeof name);
    member m;
    pthread_t th;
    c[0] = c[1] = NULL;
    if (!member_start(&m, &th, name, 1))
        return;
    c[0] = ct_comm_new(&(ct_comm_config){
        .backend = CT_BACKEND_SHM, .rank = 0, .size = 2, .timeout_s = TIMEOUT, .shm_name = name});
    pthread_join(th, NULL);
    c[1] = m.comm;
    if (!c[0] || !c[1]) {
        tt_fail(__FILE__, __LINE__, "a two-rank communicator in one process: %s", ct_errmsg());
        ct_comm_free(c[0]);
        ct_comm_free(c[1]);
        c[0] = c[1] = NULL;
    } else if (!segment_gone(name)) {
        tt_fail(__FILE__, __LINE__, "%s is still in /dev/shm once both ranks joined", name);
    }
}

/* Rank 1's side of a test, run on its own thread, inside a scope of its
 * own. */
typedef struct peer {
    pthread_t th;
    void (*fn)(struct peer *);
    ct_comm *comm;
    double delay;    /* seconds to wait before the first call */
    int rc;          /* the first failure, or 0 */
    ct_tensor *t[3]; /* what fn hands back (kept out of its scope; the test frees them) */
} peer;

static void *peer_main(void *arg) {
    peer *p = arg;
    ct_scope_begin();
    sleep_for(p->delay);
    p->fn(p);
    ct_scope_end();
    return NULL;
}

static bool peer_start(peer *p, ct_comm *comm, double delay, void (*fn)(peer *)) {
    *p = (peer){.fn = fn, .comm = comm, .delay = delay};
    return pthread_create(&p->th, NULL, peer_main, p) == 0;
}

/* c[0] and c[1] as pair_new makes them, with rank 1's side, fn, started on
 * c[1] after delay seconds; false (c[0] NULL) if either failed. */
static bool pair_with_peer(ct_comm *c[2], peer *p, double delay, void (*fn)(peer *)) {
    pair_new(c);
    if (c[0] && !peer_start(p, c[1], delay, fn)) {
        tt_fail(__FILE__, __LINE__, "starting rank 1's thread failed");
        ct_comm_free(c[0]);
        ct_comm_free(c[1]);
        c[0] = c[1] = NULL;
    }
    return c[0] != NULL;
}

static void peer_record(peer *p, int rc) {
    if (rc && !p->rc)
        p->rc = rc;
}

/* An allreduce sum of [2, 2, 2, 2]. */
static void peer_allreduce(peer *p) {
    ct_tensor *t = ct_full(1, (int64_t[]){4}, 2, CT_FLOAT32);
    peer_record(p, ct_comm_allreduce(p->comm, t, CT_REDUCE_SUM, NULL));
}

/* ----------------------------------------------------------------- tests */

TEST(backends_have_names_and_shm_is_always_built) {
    ASSERT_TRUE(!strcmp(ct_backend_name(CT_BACKEND_SHM), "shm"));
    ASSERT_TRUE(!strcmp(ct_backend_name(CT_BACKEND_MPI), "mpi"));
    ASSERT_TRUE(!strcmp(ct_backend_name(CT_BACKEND_NCCL), "nccl"));
    ASSERT_TRUE(!strcmp(ct_backend_name((ct_backend)42), "?"));
    ASSERT_TRUE(ct_backend_available(CT_BACKEND_SHM));
}

TEST(a_communicator_of_one_leaves_data_as_it_is) {
    ct_comm *c = comm_of_one();
    ASSERT_TRUE(c);
    ASSERT_EQ(ct_comm_rank(c), 0);
    ASSERT_EQ(ct_comm_size(c), 1);
    ASSERT_EQ(ct_comm_backend(c), CT_BACKEND_SHM);
    ASSERT_NEAR(ct_comm_timeout(c), TIMEOUT, 0);
    for (size_t d = 0; d < sizeof all_dtypes / sizeof *all_dtypes; d++) {
        ct_dtype dt = all_dtypes[d];
        ct_tensor *x = tt_rand(1, (int64_t[]){7}, dt, 11 + d);
        for (size_t o = 0; o < sizeof all_ops / sizeof *all_ops; o++) {
            ct_reduce_op op = all_ops[o];
            ct_tensor *t = ct_clone(x), *out = ct_zeros(1, (int64_t[]){7}, dt);
            if (dt == CT_BOOL && op == CT_REDUCE_AVG) {
                ASSERT_RC(ct_comm_allreduce(c, t, op, NULL), CT_EDTYPE, "avg", "bool");
                continue;
            }
            ASSERT_EQ(ct_comm_allreduce(c, t, op, NULL), 0);
            ASSERT_CLOSE(t, x, 0, 0);
            ASSERT_EQ(ct_comm_reduce(c, t, op, 0, NULL), 0);
            ASSERT_CLOSE(t, x, 0, 0);
            ASSERT_EQ(ct_comm_reduce_scatter(c, out, x, op, NULL), 0);
            ASSERT_CLOSE(out, x, 0, 0);
        }
        ct_tensor *t = ct_clone(x), *out = ct_zeros(1, (int64_t[]){7}, dt);
        ASSERT_EQ(ct_comm_broadcast(c, t, 0, NULL), 0);
        ASSERT_CLOSE(t, x, 0, 0);
        ASSERT_EQ(ct_comm_allgather(c, out, x, NULL), 0);
        ASSERT_CLOSE(out, x, 0, 0);
        out = ct_zeros(1, (int64_t[]){7}, dt);
        ASSERT_EQ(ct_comm_alltoall(c, out, x, NULL), 0);
        ASSERT_CLOSE(out, x, 0, 0);
        /* Empty tensors, and a transposed one staged through a copy. */
        ct_tensor *none = ct_zeros(1, (int64_t[]){0}, dt);
        ASSERT_EQ(ct_comm_allreduce(c, none, CT_REDUCE_SUM, NULL), 0);
        ct_tensor *m = tt_rand(2, (int64_t[]){3, 5}, dt, 23 + d);
        ct_tensor *mt = tt_layout_of(m, TT_TRANSPOSED);
        ASSERT_TRUE(!ct_is_contiguous(mt));
        ASSERT_EQ(ct_comm_allreduce(c, mt, CT_REDUCE_MAX, NULL), 0);
        ASSERT_CLOSE(mt, m, 0, 0);
    }
    ASSERT_EQ(ct_comm_barrier(c, NULL), 0);
    ct_comm_stats stats;
    ct_comm_stats_get(c, &stats);
    ASSERT_TRUE(stats.issued > 0);
    ASSERT_EQ(stats.completed, stats.issued);
    ASSERT_TRUE(stats.pending_op == NULL);
    ASSERT_EQ(stats.pending_seq, 0);
    ct_comm_free(c);
    ct_comm_free(NULL);
}

/* A dry communicator of 4 in which this process is rank 2: every
 * collective answers as 4 ranks holding what rank 2 holds would get. */
TEST(a_dry_communicator_answers_as_identical_ranks_would) {
    ct_comm *c = ct_comm_new(&(ct_comm_config){.backend = CT_BACKEND_DRY, .rank = 2, .size = 4});
    ASSERT_TRUE(c);
    ASSERT_TRUE(!strcmp(ct_backend_name(CT_BACKEND_DRY), "dry"));
    ASSERT_EQ(ct_comm_backend(c), CT_BACKEND_DRY);
    ASSERT_EQ(ct_comm_rank(c), 2);
    ASSERT_EQ(ct_comm_size(c), 4);
    ct_tensor *x = ct_arange(1, 9, 1, CT_FLOAT32); /* 1 .. 8 */
    ct_tensor *t = ct_clone(x);
    ASSERT_EQ(ct_comm_allreduce(c, t, CT_REDUCE_SUM, NULL), 0);
    ASSERT_CLOSE(t, ct_mul_scalar(x, 4), 0, 0);
    t = ct_clone(x);
    ASSERT_EQ(ct_comm_allreduce(c, t, CT_REDUCE_AVG, NULL), 0);
    ASSERT_CLOSE(t, x, 0, 0);
    t = ct_clone(x);
    ASSERT_EQ(ct_comm_allreduce(c, t, CT_REDUCE_PROD, NULL), 0);
    ASSERT_CLOSE(t, ct_mul(ct_mul(x, x), ct_mul(x, x)), 0, 0);
    /* Four copies; rank 2's block of the sum; rank 2's block from each. */
    ct_tensor *all = ct_zeros(1, (int64_t[]){32}, CT_FLOAT32);
    ASSERT_EQ(ct_comm_allgather(c, all, x, NULL), 0);
    ASSERT_CLOSE(ct_narrow(all, 0, 24, 8), x, 0, 0);
    ct_tensor *mine = ct_zeros(1, (int64_t[]){2}, CT_FLOAT32);
    ASSERT_EQ(ct_comm_reduce_scatter(c, mine, x, CT_REDUCE_SUM, NULL), 0);
    ASSERT_CLOSE(mine, ct_mul_scalar(ct_narrow(x, 0, 4, 2), 4), 0, 0);
    ct_tensor *swapped = ct_zeros(1, (int64_t[]){8}, CT_FLOAT32);
    ASSERT_EQ(ct_comm_alltoall(c, swapped, x, NULL), 0);
    for (int r = 0; r < 4; r++)
        ASSERT_CLOSE(ct_narrow(swapped, 0, 2 * r, 2), ct_narrow(x, 0, 4, 2), 0, 0);
    /* A transposed view goes through a copy and comes back. */
    ct_tensor *m = ct_transpose(ct_reshape(ct_clone(x), CT_SHAPE(2, 4)), 0, 1);
    ASSERT_EQ(ct_comm_allreduce(c, m, CT_REDUCE_SUM, NULL), 0);
    ASSERT_NEAR(ct_get(m, (int64_t[]){3, 1}), 32.0, 0);
    ASSERT_EQ(ct_comm_barrier(c, NULL), 0);
    /* No peer to meet: point to point fails, naming why. */
    ASSERT_RC(ct_comm_send(c, x, 1, 0, NULL), CT_ENOTSUP, "a dry communicator has no peers",
              "rank 2 cannot send to rank 1");
    /* The communicator still works after it. */
    ASSERT_EQ(ct_comm_barrier(c, NULL), 0);
    ct_comm *half = NULL;
    ASSERT_EQ(ct_comm_split(c, 0, 0, &half), 0);
    ASSERT_TRUE(half);
    ASSERT_EQ(ct_comm_backend(half), CT_BACKEND_DRY);
    ct_comm_free(half);
    ct_comm_free(c);
}

TEST(a_work_can_be_waited_on_twice_and_tested) {
    ct_comm *c = comm_of_one();
    ASSERT_TRUE(c);
    ct_tensor *t = ct_arange(0, 5, 1, CT_FLOAT32);
    ct_work *w = NULL;
    ASSERT_EQ(ct_comm_allreduce(c, t, CT_REDUCE_SUM, &w), 0);
    ASSERT_TRUE(w);
    ASSERT_EQ(ct_work_wait(w), 0);
    ASSERT_EQ(ct_work_wait(w), 0);
    ASSERT_EQ(ct_work_test(w), 1);
    ct_work_free(w);
    ct_work_free(NULL);
    ASSERT_NEAR(ct_item(ct_sum(t, NULL, 0, false)), 10, 0);
    ct_comm_free(c);
}

/* Waits up to a second for the progress thread to finish w; 1 if it did. */
static int finished_within_a_second(ct_work *w) {
    double end = tt_now() + 1;
    int rc;
    while ((rc = ct_work_test(w)) == 0 && tt_now() < end)
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    return rc;
}

/* With the progress thread off, async work waits for the caller: it is
 * still pending after a while, and one ct_comm_progress finishes it; turned
 * back on, the thread finishes the next one unasked. */
TEST(the_progress_thread_can_be_turned_off_and_the_caller_drives) {
    ct_comm *c = comm_of_one();
    ASSERT_TRUE(c);
    ct_tensor *t = ct_arange(0, 5, 1, CT_FLOAT32);
    ct_work *w = NULL;
    ASSERT_EQ(ct_comm_set_progress_thread(c, false), 0);
    ASSERT_EQ(ct_comm_allreduce(c, t, CT_REDUCE_SUM, &w), 0);
    nanosleep(&(struct timespec){0, 50000000}, NULL); /* ten idle polls of the thread */
    ASSERT_EQ(ct_work_test(w), 0);
    ASSERT_EQ(ct_comm_progress(c), 0);
    ASSERT_EQ(ct_work_test(w), 1);
    ct_work_free(w);
    ASSERT_EQ(ct_comm_set_progress_thread(c, true), 0);
    ASSERT_EQ(ct_comm_allreduce(c, t, CT_REDUCE_SUM, &w), 0);
    ASSERT_EQ(finished_within_a_second(w), 1);
    ct_work_free(w);
    ASSERT_EQ(ct_comm_progress(c), 0); /* nothing pending: a no-op */
    ASSERT_RC(ct_comm_progress(NULL), CT_EINVAL, "comm_progress");
    ASSERT_RC(ct_comm_set_progress_thread(NULL, true), CT_EINVAL, "progress_thread");
    ct_comm_free(c);
}

/* Every argument error is refused when issued, on this rank alone, with a
 * message naming the operation: it consumes no sequence number, so the
 * ranks stay in step and the communicator goes on working. */
TEST(bad_arguments_are_refused_and_leave_the_communicator_working) {
    ct_comm *c[2];
    pair_new(c);
    ASSERT_TRUE(c[0]);
    ct_comm *c0 = c[0];
    ct_tensor *t = ct_ones(1, (int64_t[]){6}, CT_FLOAT32);
    ct_tensor *t3 = ct_ones(1, (int64_t[]){3}, CT_FLOAT32);
    ct_tensor *t5 = ct_ones(1, (int64_t[]){5}, CT_FLOAT32);
    ct_tensor *t7 = ct_ones(1, (int64_t[]){7}, CT_FLOAT32);
    ct_tensor *i3 = ct_ones(1, (int64_t[]){3}, CT_INT32);
    ct_tensor *b = ct_ones(1, (int64_t[]){6}, CT_BOOL);
    ASSERT_RC(ct_comm_broadcast(c0, t, 2, NULL), CT_EINVAL, "broadcast", "root");
    ASSERT_RC(ct_comm_broadcast(c0, t, -1, NULL), CT_EINVAL, "broadcast", "root");
    ASSERT_RC(ct_comm_reduce(c0, t, CT_REDUCE_SUM, 5, NULL), CT_EINVAL, "reduce", "root");
    ASSERT_RC(ct_comm_send(c0, t, 2, 0, NULL), CT_EINVAL, "send", "2");
    ASSERT_RC(ct_comm_recv(c0, t, -1, 0, NULL), CT_EINVAL, "recv", "-1");
    ASSERT_RC(ct_comm_send(c0, t, 1, -3, NULL), CT_EINVAL, "send", "tag");
    ASSERT_RC(ct_comm_recv(c0, t, 1, -3, NULL), CT_EINVAL, "recv", "tag");
    /* Sizes that do not fit the group are shape errors, as in tensor ops. */
    ASSERT_RC(ct_comm_allgather(c0, t5, t3, NULL), CT_ESHAPE, "allgather", "[5]", "[3]");
    ASSERT_RC(ct_comm_reduce_scatter(c0, t3, t7, CT_REDUCE_SUM, NULL), CT_ESHAPE, "reduce_scatter",
              "[7]");
    ASSERT_RC(ct_comm_alltoall(c0, t7, t7, NULL), CT_ESHAPE, "alltoall", "[7]");
    ASSERT_RC(ct_comm_alltoall(c0, t, t3, NULL), CT_ESHAPE, "alltoall", "[6]", "[3]");
    ASSERT_RC(ct_comm_allgather(c0, t, i3, NULL), CT_EDTYPE, "allgather", "float32", "int32");
    ASSERT_RC(ct_comm_allreduce(c0, b, CT_REDUCE_AVG, NULL), CT_EDTYPE, "avg", "bool");
    ASSERT_RC(ct_comm_reduce_scatter(c0, t3, b, CT_REDUCE_AVG, NULL), CT_EDTYPE, "bool");
    ASSERT_RC(ct_comm_allreduce(c0, t, (ct_reduce_op)99, NULL), CT_EINVAL, "allreduce");
    ASSERT_RC(ct_comm_allreduce(c0, NULL, CT_REDUCE_SUM, NULL), CT_EINVAL, "allreduce");
    ASSERT_RC(ct_comm_allgather(c0, t, NULL, NULL), CT_EINVAL, "allgather");
    ASSERT_RC(ct_comm_allreduce(NULL, t, CT_REDUCE_SUM, NULL), CT_EINVAL, "allreduce");
    ASSERT_RC(ct_comm_set_timeout(c0, 0), CT_EINVAL, "timeout");
    ASSERT_RC(ct_comm_set_timeout(c0, -1), CT_EINVAL, "timeout");
    ASSERT_RC(ct_comm_set_timeout(c0, NAN), CT_EINVAL, "timeout");
    ASSERT_NEAR(ct_comm_timeout(c0), TIMEOUT, 0);
    /* A refused call with a work pointer leaves it NULL. */
    int sentinel;
    ct_work *w = (ct_work *)&sentinel;
    ASSERT_RC(ct_comm_broadcast(c0, t, 9, &w), CT_EINVAL, "root");
    ASSERT_TRUE(w == NULL);
    /* The first real collective is #1 on both ranks and succeeds. */
    peer p;
    ASSERT_TRUE(peer_start(&p, c[1], 0, peer_allreduce));
    ct_tensor *x = ct_ones(1, (int64_t[]){4}, CT_FLOAT32);
    int rc = ct_comm_allreduce(c0, x, CT_REDUCE_SUM, NULL);
    pthread_join(p.th, NULL);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(p.rc, 0);
    ASSERT_CLOSE(x, ct_full(1, (int64_t[]){4}, 3, CT_FLOAT32), 0, 0);
    ct_comm_free(c[0]);
    ct_comm_free(c[1]);
}

TEST(bad_configs_are_refused) {
    char name[64], long_name[256];
    segment_name(name, sizeof name);
    ct_comm_config ok = {.backend = CT_BACKEND_SHM, .rank = 0, .size = 1, .shm_name = name};
    ct_comm_config cfg;
    ct_errclear();
    ASSERT_TRUE(ct_comm_new(NULL) == NULL);
    ASSERT_EQ(ct_errcode(), CT_EINVAL);
    cfg = ok, cfg.size = 0;
    ASSERT_FAILS(ct_comm_new(&cfg), CT_EINVAL, "size");
    cfg = ok, cfg.rank = 1;
    ASSERT_FAILS(ct_comm_new(&cfg), CT_EINVAL, "rank");
    cfg = ok, cfg.rank = -1;
    ASSERT_FAILS(ct_comm_new(&cfg), CT_EINVAL, "rank");
    cfg = ok, cfg.timeout_s = -1;
    ASSERT_FAILS(ct_comm_new(&cfg), CT_EINVAL, "timeout");
    cfg = ok, cfg.timeout_s = NAN;
    ASSERT_FAILS(ct_comm_new(&cfg), CT_EINVAL, "timeout");
    cfg = ok, cfg.shm_name = NULL;
    ASSERT_FAILS(ct_comm_new(&cfg), CT_EINVAL, "name");
    cfg = ok, cfg.shm_name = "no-slash";
    ASSERT_FAILS(ct_comm_new(&cfg), CT_EINVAL, "no-slash");
    /* At most 200 bytes, the slash included. */
    memset(long_name, 'x', 201);
    long_name[0] = '/';
    long_name[201] = 0;
    cfg = ok, cfg.shm_name = long_name;
    ASSERT_FAILS(ct_comm_new(&cfg), CT_EINVAL, "200");
    snprintf(long_name + 150, sizeof long_name - 150, "-%ld-%s", (long)getpid(),
             "yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy");
    long_name[200] = 0;
    ct_comm *c = ct_comm_new(&cfg);
    ASSERT_TRUE(c);
    ct_comm_free(c);
    ASSERT_TRUE(segment_gone(long_name));
    cfg = ok, cfg.backend = (ct_backend)9;
    ct_errclear();
    ASSERT_TRUE(ct_comm_new(&cfg) == NULL);
    ASSERT_TRUE(ct_errcode() == CT_EINVAL || ct_errcode() == CT_ENOTSUP);
    ASSERT_TRUE(segment_gone(name));
}

/* mpi needs an MPI_Comm and nccl a unique id and a GPU; a build without
 * them says so. */
TEST(mpi_and_nccl_refuse_what_they_cannot_run) {
    ct_comm_config cfg = {.backend = CT_BACKEND_MPI, .rank = 0, .size = 1, .timeout_s = TIMEOUT};
    ct_errclear();
    ASSERT_TRUE(ct_comm_new(&cfg) == NULL);
    if (!ct_backend_available(CT_BACKEND_MPI))
        ASSERT_EQ(ct_errcode(), CT_ENOTSUP);
    else
        ASSERT_TRUE(ct_errcode() == CT_EINVAL || ct_errcode() == CT_ESTATE);
    ASSERT_TRUE(strcasestr(ct_errmsg(), "mpi"));
    cfg.backend = CT_BACKEND_NCCL;
    ct_errclear();
    ASSERT_TRUE(ct_comm_new(&cfg) == NULL);
    if (!ct_backend_available(CT_BACKEND_NCCL))
        ASSERT_EQ(ct_errcode(), CT_ENOTSUP);
    else
        ASSERT_TRUE(ct_errcode() == CT_EINVAL || ct_errcode() == CT_EDEVICE ||
                    ct_errcode() == CT_ENOTSUP);
    ASSERT_TRUE(strcasestr(ct_errmsg(), "nccl"));
}

/* A second communicator given the name of one still gathering its ranks
 * is refused at once; the first one is not disturbed. */
TEST(a_segment_name_in_use_is_refused) {
    char name[64];
    segment_name(name, sizeof name);
    member first;
    pthread_t th;
    ASSERT_TRUE(member_start(&first, &th, name, 0));
    for (int tries = 0; segment_gone(name) && tries < 500; tries++)
        sleep_for(0.01);
    ct_comm_config cfg = {
        .backend = CT_BACKEND_SHM, .rank = 0, .size = 2, .timeout_s = 2, .shm_name = name};
    double t0 = tt_now();
    ct_errclear();
    ct_comm *second = ct_comm_new(&cfg);
    double took = tt_now() - t0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ct_errmsg());
    int code = ct_errcode();
    cfg.rank = 1;
    cfg.timeout_s = TIMEOUT;
    ct_comm *c1 = ct_comm_new(&cfg);
    pthread_join(th, NULL);
    ct_comm *c0 = first.comm;
    ct_comm_free(second);
    ASSERT_TRUE(second == NULL);
    ASSERT_TRUE(code != CT_OK && code != CT_ETIMEDOUT);
    ASSERT_STR_CONTAINS(msg, name);
    ASSERT_TRUE(took < 1);
    ASSERT_TRUE(c0 && c1);
    peer p;
    ASSERT_TRUE(peer_start(&p, c1, 0, peer_allreduce));
    ct_tensor *x = ct_ones(1, (int64_t[]){4}, CT_FLOAT32);
    int rc = ct_comm_allreduce(c0, x, CT_REDUCE_SUM, NULL);
    pthread_join(p.th, NULL);
    ct_comm_free(c0);
    ct_comm_free(c1);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(p.rc, 0);
    ASSERT_TRUE(segment_gone(name));
}

TEST(a_peer_that_never_joins_times_out_naming_it) {
    for (int r = 0; r < 2; r++) {
        char name[64];
        segment_name(name, sizeof name);
        ct_comm_config cfg = {
            .backend = CT_BACKEND_SHM, .rank = r, .size = 2, .timeout_s = 1, .shm_name = name};
        double t0 = tt_now();
        ct_errclear();
        ct_comm *c = ct_comm_new(&cfg);
        double took = tt_now() - t0;
        ASSERT_TRUE(c == NULL);
        ASSERT_EQ(ct_errcode(), CT_ETIMEDOUT);
        if (!tt_names_rank(ct_errmsg(), 1 - r))
            tt_fail(__FILE__, __LINE__, "\"%s\" does not name rank %d", ct_errmsg(), 1 - r);
        ASSERT_TRUE(took > 0.9 && took < 3);
        ASSERT_TRUE(segment_gone(name));
    }
}

/* A timed-out operation fails with the same error every time it is asked,
 * and fails the communicator: later calls on it fail at once, and so does
 * the peer's next call. */
TEST(a_timed_out_operation_fails_the_communicator) {
    ct_comm *c[2];
    pair_new(c);
    ASSERT_TRUE(c[0]);
    ASSERT_EQ(ct_comm_set_timeout(c[0], 0.5), 0);
    ASSERT_NEAR(ct_comm_timeout(c[0]), 0.5, 0);
    ct_tensor *t = ct_ones(1, (int64_t[]){4}, CT_FLOAT32);
    ct_work *w = NULL;
    ASSERT_EQ(ct_comm_allreduce(c[0], t, CT_REDUCE_SUM, &w), 0);
    double t0 = tt_now();
    int rc = ct_work_wait(w);
    double took = tt_now() - t0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ct_errmsg());
    ASSERT_EQ(rc, CT_ETIMEDOUT);
    ASSERT_TRUE(took > 0.4 && took < 3);
    ASSERT_STR_CONTAINS(msg, "allreduce");
    ASSERT_STR_CONTAINS(msg, "#1");
    if (!tt_names_rank(msg, 1))
        tt_fail(__FILE__, __LINE__, "\"%s\" does not name rank 1", msg);
    ASSERT_EQ(ct_work_wait(w), CT_ETIMEDOUT);
    ASSERT_TRUE(!strcmp(ct_errmsg(), msg));
    ASSERT_EQ(ct_work_test(w), CT_ETIMEDOUT);
    ct_work_free(w);

    t0 = tt_now();
    rc = ct_comm_broadcast(c[0], t, 0, NULL);
    ASSERT_TRUE(rc == CT_ESTATE || rc == CT_ETIMEDOUT);
    ASSERT_STR_CONTAINS(ct_errmsg(), "#1");
    ASSERT_TRUE(tt_now() - t0 < 0.2);
    ct_comm_stats stats;
    ct_comm_stats_get(c[0], &stats);
    ASSERT_EQ(stats.completed, stats.issued);

    /* Rank 1 comes to the allreduce after rank 0 gave up: it fails well
     * within its own timeout. */
    t0 = tt_now();
    ct_errclear();
    rc = ct_comm_allreduce(c[1], t, CT_REDUCE_SUM, NULL);
    took = tt_now() - t0;
    if (rc != CT_EPEER && rc != CT_ESTATE && rc != CT_ETIMEDOUT)
        tt_fail(__FILE__, __LINE__, "rank 1's allreduce after rank 0 gave up returned %s: %s",
                ct_errname(rc), ct_errmsg());
    ASSERT_TRUE(took < TIMEOUT / 4);
    ct_comm_free(c[0]);
    ct_comm_free(c[1]);
}

/* ct_work_free of a pending operation waits for it, and the stats show
 * what it waits on meanwhile. */
TEST(freeing_a_pending_work_waits_for_it) {
    /* Everything is observed before rank 1's thread is joined and checked
     * after, so that a failed check never leaves the thread running. */
    ct_comm *c[2];
    peer p;
    ASSERT_TRUE(pair_with_peer(c, &p, 0.3, peer_allreduce));
    ct_tensor *t = ct_ones(1, (int64_t[]){4}, CT_FLOAT32);
    ct_work *w = NULL;
    double t0 = tt_now();
    int rc = ct_comm_allreduce(c[0], t, CT_REDUCE_SUM, &w);
    int state = ct_work_test(w);
    ct_comm_stats pending;
    ct_comm_stats_get(c[0], &pending);
    ct_work_free(w);
    double took = tt_now() - t0;
    pthread_join(p.th, NULL);
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(state, 0);
    ASSERT_EQ(pending.issued, 1);
    ASSERT_EQ(pending.completed, 0);
    ASSERT_TRUE(pending.pending_op && !strcmp(pending.pending_op, "allreduce"));
    ASSERT_EQ(pending.pending_seq, 1);
    ASSERT_TRUE(took > 0.2);
    ASSERT_EQ(p.rc, 0);
    ASSERT_CLOSE(t, ct_full(1, (int64_t[]){4}, 3, CT_FLOAT32), 0, 0);
    ct_comm_stats done;
    ct_comm_stats_get(c[0], &done);
    ASSERT_EQ(done.completed, 1);
    ASSERT_TRUE(done.pending_op == NULL);
    ct_comm_free(c[0]);
    ct_comm_free(c[1]);
}

/* Rank 1's side: the same three operations, blocking, then the free. */
static void peer_three_ops(peer *p) {
    p->t[0] = ct_full(1, (int64_t[]){4}, 2, CT_FLOAT32);
    p->t[1] = ct_full(1, (int64_t[]){4}, 7, CT_FLOAT32);
    p->t[2] = ct_zeros(1, (int64_t[]){6}, CT_INT32);
    peer_record(p, ct_comm_allreduce(p->comm, p->t[0], CT_REDUCE_SUM, NULL));
    peer_record(p, ct_comm_broadcast(p->comm, p->t[1], 1, NULL));
    peer_record(p,
                ct_comm_allgather(p->comm, p->t[2], ct_full(1, (int64_t[]){3}, 5, CT_INT32), NULL));
    ct_comm_free(p->comm);
    for (int k = 0; k < 3; k++)
        ct_keep(p->t[k]);
}

/* ct_comm_free waits for the work already issued; the handles outlive the
 * communicator. */
TEST(freeing_a_communicator_waits_for_its_queued_work) {
    ct_comm *c[2];
    peer p;
    ASSERT_TRUE(pair_with_peer(c, &p, 0.2, peer_three_ops));
    ct_tensor *a = ct_ones(1, (int64_t[]){4}, CT_FLOAT32);
    ct_tensor *b = ct_zeros(1, (int64_t[]){4}, CT_FLOAT32);
    ct_tensor *out = ct_zeros(1, (int64_t[]){6}, CT_INT32);
    ct_work *w[3] = {0};
    double t0 = tt_now();
    int rc[3];
    rc[0] = ct_comm_allreduce(c[0], a, CT_REDUCE_SUM, &w[0]);
    rc[1] = ct_comm_broadcast(c[0], b, 1, &w[1]);
    rc[2] = ct_comm_allgather(c[0], out, ct_full(1, (int64_t[]){3}, 4, CT_INT32), &w[2]);
    ct_comm_free(c[0]);
    double took = tt_now() - t0;
    pthread_join(p.th, NULL);
    ASSERT_TRUE(took > 0.15);
    ASSERT_EQ(p.rc, 0);
    for (int k = 0; k < 3; k++) {
        ASSERT_EQ(rc[k], 0);
        ASSERT_EQ(ct_work_test(w[k]), 1);
        ASSERT_EQ(ct_work_wait(w[k]), 0);
        ct_work_free(w[k]);
    }
    ASSERT_CLOSE(a, ct_full(1, (int64_t[]){4}, 3, CT_FLOAT32), 0, 0);
    ASSERT_CLOSE(b, ct_full(1, (int64_t[]){4}, 7, CT_FLOAT32), 0, 0);
    int32_t want[6] = {4, 4, 4, 5, 5, 5};
    ASSERT_CLOSE(out, ct_from_data(want, 1, (int64_t[]){6}, CT_INT32), 0, 0);
    ASSERT_CLOSE(p.t[2], out, 0, 0);
    for (int k = 0; k < 3; k++)
        ct_tensor_free(p.t[k]);
}

TEST(a_communicator_of_one_splits_into_one_or_none) {
    ct_comm *c = comm_of_one();
    ASSERT_TRUE(c);
    ct_comm *sub = NULL;
    ASSERT_EQ(ct_comm_split(c, 3, 0, &sub), 0);
    ASSERT_TRUE(sub);
    ASSERT_EQ(ct_comm_size(sub), 1);
    ASSERT_EQ(ct_comm_rank(sub), 0);
    ASSERT_EQ(ct_comm_backend(sub), CT_BACKEND_SHM);
    ASSERT_NEAR(ct_comm_timeout(sub), TIMEOUT, 0);
    ct_tensor *t = ct_arange(0, 3, 1, CT_INT64);
    ASSERT_EQ(ct_comm_allreduce(sub, t, CT_REDUCE_SUM, NULL), 0);
    ASSERT_EQ(ct_item_int64(ct_sum(t, NULL, 0, false)), 3);
    ct_comm_free(sub);
    sub = (ct_comm *)c;
    ASSERT_EQ(ct_comm_split(c, CT_COMM_SPLIT_NONE, 0, &sub), 0);
    ASSERT_TRUE(sub == NULL);
    ct_comm_free(c);
}
