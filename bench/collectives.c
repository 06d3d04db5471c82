/* bench_collectives: ct's collectives, nccl-tests style.
 *
 *   ctlaunch -np 2 bench_collectives [-b BYTES] [-e BYTES] [-f FACTOR] [--seconds S]
 *                                    [--ops LIST]
 *   mpirun -np 2 -x CT_BACKEND=mpi bench_collectives ...
 *   bench_collectives --memcpy [-e BYTES]
 *
 * Joins the job with ct_dist_init (the backend is the one it picks: shm
 * under ctlaunch, or CT_BACKEND's) and sweeps float32 messages from -b to -e
 * bytes through the blocking form (work == NULL) of each operation in LIST
 * (allreduce, broadcast, allgather, reduce_scatter; default allreduce):
 * allreduce (sum) and broadcast (root 0) in place, allgather and
 * reduce_scatter (sum) out of place. With --shared the messages live in
 * ct_comm_zeros memory, as data parallel's buffers do: allreduce in place,
 * allgather in place (this rank's block of the output is its input: ZeRO's
 * gather of the parameters), reduce_scatter from it (FSDP's), which shm
 * runs straight from the peers' memory (impl "ct-shared"). The sweep and
 * timing are coll_bench.c's, shared with the Open MPI peer. --memcpy instead times a single-thread
 * memcpy of -e bytes, the machine's reference, without joining a job.
 *
 * stdout: one JSON line per operation and size from rank 0, "impl": "ct",
 * "backend": "shm" or "mpi". stderr: a table, and errors. */
#include "coll_bench.h"

#include <ct/dist.h>

#include <stdio.h>

static const char usage[] =
    "usage: ctlaunch -np N bench_collectives [-b BYTES] [-e BYTES] [-f FACTOR] [--seconds S]\n"
    "                                        [--ops LIST]\n"
    "       bench_collectives --memcpy [-e BYTES] [--seconds S]\n"
    "  -b, -e     smallest and largest message (default 8 and 64M; K, M, G suffixes)\n"
    "  -f         size factor between steps (default 2)\n"
    "  --seconds  time aimed at per size (default 0.2)\n"
    "  --ops      comma-separated: allreduce, broadcast, allgather, reduce_scatter\n"
    "             (default allreduce)\n"
    "  --memcpy   time a single-thread memcpy of -e bytes instead (no job)\n"
    "  --shared   messages in ct_comm_zeros memory (allgather in place)\n";

typedef struct ct_ctx {
    ct_comm *comm;
    bool shared; /* --shared */
    coll_op op;
    /* allreduce, broadcast: the message (count). allgather: out (count) and
     * in (count / nranks). reduce_scatter: in (count) and out (count /
     * nranks). */
    ct_tensor *msg, *block;
    ct_tensor *time; /* (1) float64, for the maximum over ranks */
} ct_ctx;

/* Reports the failed call with ct's message; returns 1. */
static int fail(const ct_ctx *c, const char *what) {
    fprintf(stderr, "bench_collectives: rank %d: %s: %s\n", ct_comm_rank(c->comm), what,
            ct_errmsg());
    return 1;
}

static int prepare(void *ctx, coll_op op, int64_t count) {
    ct_ctx *c = ctx;
    ct_tensor_free(c->msg);
    ct_tensor_free(c->block);
    c->op = op;
    bool blocked = op == COLL_ALLGATHER || op == COLL_REDUCE_SCATTER;
    int64_t block = count / ct_comm_size(c->comm);
    c->msg = c->shared ? ct_comm_zeros(c->comm, 1, &count, CT_FLOAT32)
                       : ct_full(1, &count, 1.0, CT_FLOAT32);
    if (c->shared && op == COLL_ALLGATHER)
        c->block = c->msg ? ct_narrow(c->msg, 0, ct_comm_rank(c->comm) * block, block) : NULL;
    else
        c->block = blocked ? ct_full(1, &block, 1.0, CT_FLOAT32) : NULL;
    if (!c->msg || (blocked && !c->block))
        return fail(c, "making the buffers");
    return 0;
}

static int run(void *ctx, int64_t iters) {
    ct_ctx *c = ctx;
    for (int64_t i = 0; i < iters; i++) {
        int rc = 0;
        switch (c->op) {
        case COLL_ALLREDUCE: rc = ct_comm_allreduce(c->comm, c->msg, CT_REDUCE_SUM, NULL); break;
        case COLL_BROADCAST: rc = ct_comm_broadcast(c->comm, c->msg, 0, NULL); break;
        case COLL_ALLGATHER: rc = ct_comm_allgather(c->comm, c->msg, c->block, NULL); break;
        case COLL_REDUCE_SCATTER:
            rc = ct_comm_reduce_scatter(c->comm, c->block, c->msg, CT_REDUCE_SUM, NULL);
            break;
        case COLL_NOPS: break;
        }
        if (rc)
            return fail(c, coll_op_name(c->op));
    }
    return 0;
}

static int barrier(void *ctx) {
    ct_ctx *c = ctx;
    return ct_comm_barrier(c->comm, NULL) ? fail(c, "barrier") : 0;
}

static int max(void *ctx, double *value) {
    ct_ctx *c = ctx;
    double *t = ct_data_ptr(c->time);
    *t = *value;
    if (ct_comm_allreduce(c->comm, c->time, CT_REDUCE_MAX, NULL))
        return fail(c, "allreduce (max) of the times");
    *value = *t;
    return 0;
}

int main(int argc, char **argv) {
    coll_options o;
    int rc = coll_options_parse(&o, argc, argv, usage, true);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (o.memcpy_only)
        return coll_memcpy_reference(&o);
    if (ct_dist_init(NULL)) {
        fprintf(stderr, "bench_collectives: ct_dist_init: %s\n", ct_errmsg());
        return 1;
    }
    ct_ctx c = {.comm = ct_dist_comm(),
                .shared = o.shared,
                .time = ct_zeros(1, (int64_t[]){1}, CT_FLOAT64)};
    int rank = ct_comm_rank(c.comm), nranks = ct_comm_size(c.comm);
    if (!c.time) {
        rc = fail(&c, "making the time tensor");
    } else {
        if (nranks == 1)
            fprintf(stderr, "bench_collectives: one rank: start it with ctlaunch -np 2\n");
        coll_runner r = {.ctx = &c,
                         .rank = rank,
                         .nranks = nranks,
                         .prepare = prepare,
                         .run = run,
                         .barrier = barrier,
                         .max = max};
        rc = coll_sweep(&r, &o, o.shared ? "ct-shared" : "ct",
                        ct_backend_name(ct_comm_backend(c.comm)));
    }
    ct_tensor_free(c.msg);
    ct_tensor_free(c.block);
    ct_tensor_free(c.time);
    ct_dist_finalize();
    return rc;
}
