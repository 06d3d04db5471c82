/* Descriptor agreement on the shm backend: ranks that disagree on any field
 * of a collective (the operation, dtype, count, root, reduction) all fail
 * with CT_EMISMATCH, on the small-message path (bulletins) and on the
 * large ones (ring, chain, pairs), with a message that names the field and
 * each side's value. A recv that does not match its send fails the
 * receiver, and through the group every other rank. The ranks are threads
 * of this process, each with a communicator of its own, as gloo's tests run
 * them. */
#include "ct_test.h"

#include <ct/collectives.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

/* Far above what a mismatch takes to notice (milliseconds), and short
 * enough that a rank left waiting before the fix ends the test quickly. */
#define TIMEOUT   5.0
#define MAX_RANKS 4
/* Elements: SMALL fits a bulletin, LARGE (float32) takes the ring or the
 * chain. */
#define SMALL 100
#define LARGE 40000

enum kind { ALLREDUCE, BROADCAST, REDUCE, ALLGATHER, REDUCE_SCATTER, ALLTOALL, SEND, RECV };

/* What one rank calls. */
typedef struct call {
    enum kind kind;
    ct_dtype dtype;
    int64_t count; /* of t (in for allgather, out for reduce_scatter) */
    int root;      /* broadcast, reduce; the peer for send and recv */
    ct_reduce_op rop;
    int tag;
} call;

typedef struct rank_run {
    pthread_t th;
    const char *name;
    int rank, n;
    call c;
    int rc, later_rc; /* the call's, and a barrier's after it */
    char msg[1024], later_msg[1024];
} rank_run;

static int issue(ct_comm *comm, const call *c) {
    int n = ct_comm_size(comm);
    int64_t cnt = c->count, big = cnt * n;
    ct_tensor *t = ct_full(1, &cnt, 1, c->dtype);
    ct_tensor *b = ct_full(1, &big, 1, c->dtype);
    int rc = !t || !b ? ct_errcode() : 0;
    if (rc == 0)
        switch (c->kind) {
        case ALLREDUCE: rc = ct_comm_allreduce(comm, t, c->rop, NULL); break;
        case BROADCAST: rc = ct_comm_broadcast(comm, t, c->root, NULL); break;
        case REDUCE: rc = ct_comm_reduce(comm, t, c->rop, c->root, NULL); break;
        case ALLGATHER: rc = ct_comm_allgather(comm, b, t, NULL); break;
        case REDUCE_SCATTER: rc = ct_comm_reduce_scatter(comm, t, b, c->rop, NULL); break;
        case ALLTOALL: rc = ct_comm_alltoall(comm, ct_full(1, &cnt, 0, c->dtype), t, NULL); break;
        case SEND: rc = ct_comm_send(comm, t, c->root, c->tag, NULL); break;
        case RECV: rc = ct_comm_recv(comm, t, c->root, c->tag, NULL); break;
        }
    return rc; /* the tensors are the caller's scope's */
}

static void *rank_main(void *arg) {
    rank_run *r = arg;
    ct_scope_begin();
    ct_comm *comm = ct_comm_new(&(ct_comm_config){.backend = CT_BACKEND_SHM,
                                                  .rank = r->rank,
                                                  .size = r->n,
                                                  .timeout_s = TIMEOUT,
                                                  .shm_name = r->name});
    if (!comm) {
        r->rc = ct_errcode();
        snprintf(r->msg, sizeof r->msg, "comm_new: %s", ct_errmsg());
    } else {
        r->rc = issue(comm, &r->c);
        snprintf(r->msg, sizeof r->msg, "%s", r->rc ? ct_errmsg() : "");
        r->later_rc = ct_comm_barrier(comm, NULL);
        snprintf(r->later_msg, sizeof r->later_msg, "%s", r->later_rc ? ct_errmsg() : "");
    }
    ct_comm_free(comm);
    ct_scope_end();
    return NULL;
}

/* Runs rank r's calls[r] on n threads; runs[] gets each one's results. */
static bool run_ranks(int n, const call *calls, rank_run *runs) {
    static int counter;
    char name[64];
    snprintf(name, sizeof name, "/ct-test-agree-%ld-%d", (long)getpid(), counter++);
    for (int r = 0; r < n; r++) {
        runs[r] = (rank_run){.name = name, .rank = r, .n = n, .c = calls[r]};
        if (pthread_create(&runs[r].th, NULL, rank_main, &runs[r]) != 0) {
            tt_fail(__FILE__, __LINE__, "starting rank %d's thread failed", r);
            for (int q = 0; q < r; q++)
                pthread_join(runs[q].th, NULL);
            return false;
        }
    }
    for (int r = 0; r < n; r++)
        pthread_join(runs[r].th, NULL);
    return true;
}

/* Every rank fails the call with CT_EMISMATCH (and the barrier after it),
 * its message naming the field (what) and each value given (NULL-ended). */
static void all_fail_naming(int n, const call *calls, const char *what, const char *const *values) {
    rank_run runs[MAX_RANKS];
    double t0 = tt_now();
    if (!run_ranks(n, calls, runs))
        return;
    double took = tt_now() - t0;
    for (int r = 0; r < n; r++) {
        if (runs[r].rc != CT_EMISMATCH) {
            tt_fail(__FILE__, __LINE__, "rank %d of %d: the call returned %s, not CT_EMISMATCH: %s",
                    r, n, ct_errname(runs[r].rc), runs[r].msg);
            continue;
        }
        if (!strstr(runs[r].msg, what))
            tt_fail(__FILE__, __LINE__, "rank %d: \"%s\" does not name the field (\"%s\")", r,
                    runs[r].msg, what);
        for (const char *const *v = values; *v; v++)
            if (!strstr(runs[r].msg, *v))
                tt_fail(__FILE__, __LINE__, "rank %d: \"%s\" does not contain \"%s\"", r,
                        runs[r].msg, *v);
        if (runs[r].later_rc != CT_EMISMATCH)
            tt_fail(__FILE__, __LINE__, "rank %d: the barrier after it returned %s: %s", r,
                    ct_errname(runs[r].later_rc), runs[r].later_msg);
    }
    /* Noticed at once, not waited out. */
    if (took > TIMEOUT / 2)
        tt_fail(__FILE__, __LINE__, "the mismatch took %.2f s to notice", took);
}

#define CALLS(...)  ((const call[]){__VA_ARGS__})
#define VALUES(...) ((const char *const[]){__VA_ARGS__, NULL})

static call bcast(int64_t count, int root) {
    return (call){.kind = BROADCAST, .dtype = CT_FLOAT32, .count = count, .root = root};
}
static call allreduce(int64_t count, ct_dtype dt, ct_reduce_op rop) {
    return (call){.kind = ALLREDUCE, .dtype = dt, .count = count, .rop = rop};
}

/* ----------------------------------------------------------------- root */

/* The issue's reproduction: before, the ranks that thought they were root
 * returned 0 with divergent data. */
TEST(broadcast_roots_0_1_on_2_ranks_fail_every_rank_small) {
    all_fail_naming(2, CALLS(bcast(SMALL, 0), bcast(SMALL, 1)), "root", VALUES("root 0", "root 1"));
}
TEST(broadcast_roots_0_1_on_2_ranks_fail_every_rank_large) {
    all_fail_naming(2, CALLS(bcast(LARGE, 0), bcast(LARGE, 1)), "root", VALUES("root 0", "root 1"));
}
TEST(broadcast_roots_0_1_1_on_3_ranks_fail_every_rank_small) {
    all_fail_naming(3, CALLS(bcast(SMALL, 0), bcast(SMALL, 1), bcast(SMALL, 1)), "root",
                    VALUES("root 0", "root 1"));
}
TEST(broadcast_roots_0_1_1_on_3_ranks_fail_every_rank_large) {
    all_fail_naming(3, CALLS(bcast(LARGE, 0), bcast(LARGE, 1), bcast(LARGE, 1)), "root",
                    VALUES("root 0", "root 1"));
}
TEST(reduce_roots_0_1_1_on_3_ranks_fail_every_rank_large) {
    call a = {.kind = REDUCE, .dtype = CT_FLOAT32, .count = LARGE, .root = 0};
    call b = a;
    b.root = 1;
    all_fail_naming(3, CALLS(a, b, b), "root", VALUES("root 0", "root 1"));
}

/* -------------------------------------------------------------- the op */

TEST(allreduce_against_broadcast_fails_every_rank_small) {
    all_fail_naming(2, CALLS(allreduce(SMALL, CT_FLOAT32, CT_REDUCE_SUM), bcast(SMALL, 0)),
                    "operation", VALUES("allreduce", "broadcast"));
}
TEST(allreduce_against_broadcast_fails_every_rank_large) {
    all_fail_naming(
        3, CALLS(allreduce(LARGE, CT_FLOAT32, CT_REDUCE_SUM), bcast(LARGE, 0), bcast(LARGE, 0)),
        "operation", VALUES("allreduce", "broadcast"));
}
TEST(allgather_against_alltoall_fails_every_rank_large) {
    call a = {.kind = ALLGATHER, .dtype = CT_FLOAT32, .count = LARGE};
    call b = {.kind = ALLTOALL, .dtype = CT_FLOAT32, .count = LARGE};
    /* alltoall's count is numel(in): the same elements as allgather's
     * out, so the two differ in the op and the count. */
    all_fail_naming(2, CALLS(a, b), "operation", VALUES("allgather", "alltoall"));
}

/* ------------------------------------------------------------ the dtype */

TEST(allreduce_float32_against_int32_fails_every_rank_small) {
    all_fail_naming(3,
                    CALLS(allreduce(SMALL, CT_FLOAT32, CT_REDUCE_SUM),
                          allreduce(SMALL, CT_FLOAT32, CT_REDUCE_SUM),
                          allreduce(SMALL, CT_INT32, CT_REDUCE_SUM)),
                    "dtype", VALUES("float32", "int32"));
}
TEST(broadcast_float32_against_int32_fails_every_rank_large) {
    call b = bcast(LARGE, 0);
    b.dtype = CT_INT32;
    all_fail_naming(3, CALLS(bcast(LARGE, 0), bcast(LARGE, 0), b), "dtype",
                    VALUES("float32", "int32"));
}

/* ------------------------------------------------------------ the count */

TEST(broadcast_counts_differing_fail_every_rank_small) {
    all_fail_naming(3, CALLS(bcast(SMALL, 0), bcast(SMALL, 0), bcast(SMALL - 1, 0)), "count",
                    VALUES("100 elements", "99 elements"));
}
TEST(broadcast_counts_differing_fail_every_rank_large) {
    all_fail_naming(3, CALLS(bcast(LARGE, 0), bcast(LARGE, 0), bcast(LARGE - 1, 0)), "count",
                    VALUES("40000 elements", "39999 elements"));
}
/* One rank on the bulletins, the others on the ring. */
TEST(allreduce_counts_on_different_paths_fail_every_rank) {
    all_fail_naming(2,
                    CALLS(allreduce(SMALL, CT_FLOAT32, CT_REDUCE_SUM),
                          allreduce(LARGE, CT_FLOAT32, CT_REDUCE_SUM)),
                    "count", VALUES("100 elements", "40000 elements"));
}
TEST(alltoall_counts_differing_fail_every_rank_large) {
    call a = {.kind = ALLTOALL, .dtype = CT_FLOAT32, .count = LARGE};
    call b = a;
    b.count = LARGE / 2;
    all_fail_naming(2, CALLS(a, b), "count", VALUES("40000 elements", "20000 elements"));
}

/* -------------------------------------------------------- the reduction */

TEST(allreduce_sum_against_max_fails_every_rank_small) {
    all_fail_naming(2,
                    CALLS(allreduce(SMALL, CT_FLOAT32, CT_REDUCE_SUM),
                          allreduce(SMALL, CT_FLOAT32, CT_REDUCE_MAX)),
                    "reduction", VALUES("sum", "max"));
}
TEST(allreduce_sum_against_max_fails_every_rank_large) {
    all_fail_naming(3,
                    CALLS(allreduce(LARGE, CT_FLOAT32, CT_REDUCE_SUM),
                          allreduce(LARGE, CT_FLOAT32, CT_REDUCE_SUM),
                          allreduce(LARGE, CT_FLOAT32, CT_REDUCE_MAX)),
                    "reduction", VALUES("sum", "max"));
}
TEST(reduce_scatter_sum_against_min_fails_every_rank_large) {
    call a = {.kind = REDUCE_SCATTER, .dtype = CT_FLOAT32, .count = LARGE, .rop = CT_REDUCE_SUM};
    call b = a;
    b.rop = CT_REDUCE_MIN;
    all_fail_naming(2, CALLS(a, b), "reduction", VALUES("sum", "min"));
}

/* --------------------------------------------------------- send and recv */

/* The receiver checks the message against its recv; the send may have
 * completed by then, so the sender learns it from the group. */
static void recv_fails_naming(call send, call recv, const char *what, const char *const *values) {
    rank_run runs[2];
    if (!run_ranks(2, CALLS(send, recv), runs))
        return;
    if (runs[1].rc != CT_EMISMATCH) {
        tt_fail(__FILE__, __LINE__, "the recv returned %s, not CT_EMISMATCH: %s",
                ct_errname(runs[1].rc), runs[1].msg);
        return;
    }
    ASSERT_STR_CONTAINS(runs[1].msg, what);
    for (const char *const *v = values; *v; v++)
        ASSERT_STR_CONTAINS(runs[1].msg, *v);
    int sender = runs[0].rc ? runs[0].rc : runs[0].later_rc;
    ASSERT_EQ(sender, CT_EMISMATCH);
    ASSERT_EQ(runs[1].later_rc, CT_EMISMATCH);
}

static call p2p(enum kind kind, int peer, int64_t count, ct_dtype dt, int tag) {
    return (call){.kind = kind, .dtype = dt, .count = count, .root = peer, .tag = tag};
}

TEST(a_recv_with_another_tag_fails_both_ranks) {
    recv_fails_naming(p2p(SEND, 1, SMALL, CT_FLOAT32, 5), p2p(RECV, 0, SMALL, CT_FLOAT32, 6), "tag",
                      VALUES("tag 5", "tag 6"));
}
TEST(a_recv_with_another_count_fails_both_ranks) {
    recv_fails_naming(p2p(SEND, 1, LARGE, CT_FLOAT32, 0), p2p(RECV, 0, LARGE - 1, CT_FLOAT32, 0),
                      "count", VALUES("40000 elements", "39999 elements"));
}
TEST(a_recv_with_another_dtype_fails_both_ranks) {
    recv_fails_naming(p2p(SEND, 1, SMALL, CT_FLOAT32, 0), p2p(RECV, 0, SMALL, CT_INT32, 0), "dtype",
                      VALUES("float32", "int32"));
}
