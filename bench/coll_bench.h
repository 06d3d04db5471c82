/* coll_bench: the sweep, timing and reporting shared by the collectives
 * benchmarks (bench_collectives for ct, bench_mpi_allreduce for Open MPI),
 * so that ct and its peer are measured by the same code. bench/
 * collectives_gloo.py repeats the method in Python for gloo.
 *
 * Method (nccl-tests' timed loop, made adaptive and repeated): a sweep
 * makes REPS passes over all its sizes. In the first pass, untimed batches
 * of a size double until one takes half a repetition's time, which warms
 * up and calibrates at once (a repetition gets the calls that fill it at
 * the fastest rate a batch showed); every pass then warms up briefly and
 * times one
 * repetition: a barrier, then as many blocking calls as fill it. A
 * repetition's time is the maximum over ranks of the average time per call;
 * the result is the median of the passes. Passes, rather than repetitions
 * back to back, spread each size's samples over the whole sweep, so that a
 * neighbour's burst of load on a shared machine spoils one sample of a size,
 * not all. Every decision that changes the number of calls uses times
 * maxed over ranks, so all ranks make the same calls.
 *
 * stdout: one JSON object per result (rank 0 only); errors go to stderr.
 * Not thread-safe: one sweep per process at a time. */
#ifndef CT_BENCH_COLL_BENCH_H
#define CT_BENCH_COLL_BENCH_H

#include <stdbool.h>
#include <stdint.h>

typedef enum coll_op {
    COLL_ALLREDUCE,
    COLL_BROADCAST,
    COLL_ALLGATHER,
    COLL_REDUCE_SCATTER,
    COLL_NOPS
} coll_op;

/* "allreduce", "broadcast", "allgather", "reduce_scatter". */
const char *coll_op_name(coll_op op);

/* nccl-tests' bus bandwidth factor (its doc/PERFORMANCE.md): busbw = algbw
 * * factor, which makes the figure comparable with the hardware's
 * bandwidth whatever the rank count. */
double coll_busbw_factor(coll_op op, int nranks);

/* One implementation under test. Every callback returns 0, or non-zero
 * after printing what failed to stderr; the sweep then stops. */
typedef struct coll_runner {
    void *ctx;
    int rank, nranks;
    /* Makes the buffers for op at count float32 elements: the whole
     * message, which is the output of allgather and the input of
     * reduce_scatter (nccl-tests' "size"). count is a multiple of nranks. */
    int (*prepare)(void *ctx, coll_op op, int64_t count);
    /* Runs the prepared operation iters times, each call blocking. */
    int (*run)(void *ctx, int64_t iters);
    int (*barrier)(void *ctx);
    /* *value := the maximum of *value over ranks, on every rank. */
    int (*max)(void *ctx, double *value);
} coll_runner;

typedef struct coll_options {
    int64_t min_bytes, max_bytes; /* the sweep, nccl-tests' -b and -e */
    int64_t factor;               /* nccl-tests' -f: each size is the previous times factor */
    double seconds;               /* aimed time per size, calibration included */
    bool ops[COLL_NOPS];          /* the operations to sweep */
    bool memcpy_only;             /* bench_collectives --memcpy */
    bool shared;                  /* bench_collectives --shared: ct_comm_zeros buffers */
} coll_options;

/* Parses the command line shared by the C collectives benchmarks:
 *   [-b BYTES] [-e BYTES] [-f FACTOR] [--seconds S] [--ops LIST] [--memcpy] [--shared]
 * BYTES take a K, M or G suffix (powers of 1024). --ops, --memcpy and
 * --shared are accepted only when with_ops is set. Returns 0, 1 after printing the usage
 * for -h, or 2 after printing a usage error. */
int coll_options_parse(coll_options *o, int argc, char **argv, const char *usage, bool with_ops);

/* Sweeps every selected operation over the sizes, printing one JSON line
 * per size on rank 0:
 *   {"bench": "collectives", "impl", ["backend",] "op", "dtype": "float32",
 *    "ranks", "bytes", "count", "iters", "us", "algbw_gbps", "busbw_gbps"}
 * backend may be NULL (peers). Returns 0 or the first callback's failure. */
int coll_sweep(const coll_runner *r, const coll_options *o, const char *impl, const char *backend);

/* Single-thread memcpy of o->max_bytes: the reference line, impl "memcpy"
 * (algbw_gbps: bytes copied per second; gbps: bytes read plus written).
 * Returns 0, or 1 when the buffers cannot be allocated. */
int coll_memcpy_reference(const coll_options *o);

#endif
