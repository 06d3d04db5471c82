/* bench_mpi_allreduce: Open MPI's own MPI_Allreduce, the peer of
 * bench_collectives' allreduce, measured by the same sweep (coll_bench.c).
 *
 *   mpirun -np 2 bench_mpi_allreduce [-b BYTES] [-e BYTES] [-f FACTOR] [--seconds S]
 *
 * Blocking, in place, MPI_FLOAT, MPI_SUM on MPI_COMM_WORLD's duplicate, the
 * call a user of MPI makes. stdout: one JSON line per size from rank 0,
 * "impl": "openmpi"; stderr: a table and errors. */
#include "coll_bench.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static const char usage[] =
    "usage: mpirun -np N bench_mpi_allreduce [-b BYTES] [-e BYTES] [-f FACTOR] [--seconds S]\n"
    "  -b, -e     smallest and largest message (default 8 and 64M; K, M, G suffixes)\n"
    "  -f         size factor between steps (default 2)\n"
    "  --seconds  time aimed at per size (default 0.2)\n";

typedef struct mpi_ctx {
    MPI_Comm comm;
    int rank;
    float *buf; /* (count) */
    int count;
} mpi_ctx;

static int check(const mpi_ctx *m, const char *what, int err) {
    if (err == MPI_SUCCESS)
        return 0;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, text, &len);
    fprintf(stderr, "bench_mpi_allreduce: rank %d: %s (%d float32 elements): %.*s\n", m->rank, what,
            m->count, len, text);
    return 1;
}

static int prepare(void *ctx, coll_op op, int64_t count) {
    mpi_ctx *m = ctx;
    if (op != COLL_ALLREDUCE || count > INT_MAX) {
        fprintf(stderr, "bench_mpi_allreduce: %s of %lld elements is not measured here\n",
                coll_op_name(op), (long long)count);
        return 1;
    }
    free(m->buf);
    m->count = 0;
    m->buf = malloc((size_t)count * sizeof *m->buf);
    if (!m->buf) {
        fprintf(stderr, "bench_mpi_allreduce: rank %d: cannot allocate %lld float32 elements\n",
                m->rank, (long long)count);
        return 1;
    }
    m->count = (int)count;
    for (int i = 0; i < m->count; i++)
        m->buf[i] = 1.0f;
    return 0;
}

static int run(void *ctx, int64_t iters) {
    mpi_ctx *m = ctx;
    for (int64_t i = 0; i < iters; i++) {
        int err = MPI_Allreduce(MPI_IN_PLACE, m->buf, m->count, MPI_FLOAT, MPI_SUM, m->comm);
        if (err != MPI_SUCCESS)
            return check(m, "MPI_Allreduce", err);
    }
    return 0;
}

static int barrier(void *ctx) {
    mpi_ctx *m = ctx;
    return check(m, "MPI_Barrier", MPI_Barrier(m->comm));
}

static int max(void *ctx, double *value) {
    mpi_ctx *m = ctx;
    return check(m, "MPI_Allreduce of the times",
                 MPI_Allreduce(MPI_IN_PLACE, value, 1, MPI_DOUBLE, MPI_MAX, m->comm));
}

int main(int argc, char **argv) {
    coll_options o;
    int rc = coll_options_parse(&o, argc, argv, usage, false);
    if (rc)
        return rc == 1 ? 0 : rc;
    MPI_Init(&argc, &argv);
    mpi_ctx m = {0};
    MPI_Comm_dup(MPI_COMM_WORLD, &m.comm);
    /* Errors come back as codes, so that a failure prints its text. */
    MPI_Comm_set_errhandler(m.comm, MPI_ERRORS_RETURN);
    int nranks;
    MPI_Comm_rank(m.comm, &m.rank);
    MPI_Comm_size(m.comm, &nranks);
    if (nranks == 1 && m.rank == 0)
        fprintf(stderr, "bench_mpi_allreduce: one rank: start it with mpirun -np 2\n");
    coll_runner r = {.ctx = &m,
                     .rank = m.rank,
                     .nranks = nranks,
                     .prepare = prepare,
                     .run = run,
                     .barrier = barrier,
                     .max = max};
    rc = coll_sweep(&r, &o, "openmpi", NULL);
    free(m.buf);
    MPI_Comm_free(&m.comm);
    if (rc)
        MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
    return 0;
}
