/* bench_ddp: how much of data parallel's gradient allreduce backward hides.
 *
 *   ctlaunch -np 2 bench_ddp [--steps N] [--warmup-steps N] [--rows N]
 *                            [--first-bucket-bytes N] [--bucket-bytes N] [--progress N]
 *
 * Builds fmnist_mlp's model (784-256-256-10 with ReLU, one flat parameter
 * buffer) on every rank, wraps it in ct_ddp, with ct_ddp's bucket caps
 * unless given (a cap above the model's 1 MiB of gradients makes a single
 * bucket, reduced at the end of backward: no overlap), and times three
 * things in every step, on a fixed synthetic batch of --rows rows per rank
 * (default 32, a global batch of 64 on 2 ranks):
 *
 *   sync:      ct_tensor_backward() as data-parallel training runs it: the
 *              hooks start each bucket's allreduce as the bucket fills, and
 *              backward returns once every bucket is averaged;
 *   nosync:    the same backward under ct_ddp_set_sync(ddp, false), which
 *              communicates nothing;
 *   allreduce: blocking ct_comm_allreduce (average) of one float32 tensor per
 *              bucket, each the size of that bucket's gradients and, like
 *              ct_ddp's buckets, in ct_comm_zeros memory, in bucket order,
 *              with nothing else running.
 *
 * Each is timed from a barrier, after the forward pass, so that neither a
 * rank's late forward nor the other rank's counts; gradients are zeroed in
 * place (ct_optim_zero_grad, keeping the bucket views) after every backward,
 * so both backwards start from the same state. No optimizer step runs: the
 * weights do not matter to the time. After --warmup-steps untimed steps
 * (the first backward also rebuilds the buckets in arrival order), --steps
 * steps are timed; a step's time is the slowest rank's, and each figure is
 * the median over the steps. Communication not hidden behind backward costs
 * sync - nosync, so the fraction hidden is 1 - (sync - nosync) / allreduce,
 * clamped to [0, 1].
 *
 * stdout: one JSON line from rank 0: {"bench": "ddp_overlap", "impl": "ct",
 * "backend", "ranks", "threads_per_rank", "rank_batch", "params", "buckets",
 * "bucket_bytes": [...], "grad_bytes", "steps", "backward_sync_us",
 * "backward_nosync_us", "allreduce_us", "exposed_us" (sync - nosync),
 * "hidden"}. stderr: errors. */
#include "bench_time.h"

#include <ct/ct.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: ctlaunch -np N bench_ddp [--steps N] [--warmup-steps N] [--rows N]\n"
    "                                [--first-bucket-bytes N] [--bucket-bytes N]\n"
    "                                [--progress N]\n"
    "  --steps               timed steps (default 200)\n"
    "  --warmup-steps        untimed steps first (default 10)\n"
    "  --rows                rows of each rank's batch (default 32)\n"
    "  --first-bucket-bytes  ct_ddp_options' bucket caps (default 0: ct_ddp's,\n"
    "  --bucket-bytes        CT_DDP_FIRST_BUCKET_BYTES and CT_DDP_BUCKET_BYTES)\n"
    "  --progress            ct_ddp_options' progress: 0 auto, 1 thread, 2 end (default 0)\n";

#define IN_FEATURES 784
#define HIDDEN      256
#define CLASSES     10
#define MAX_BUCKETS 64

enum { T_SYNC, T_NOSYNC, T_ALLREDUCE, T_KINDS };

typedef struct options {
    int64_t steps, warmup_steps, rows, progress;
    ct_ddp_options ddp; /* the bucket sizes; 0 takes ct_ddp's default */
} options;

typedef struct bench {
    ct_comm *comm;
    int rank;
    ct_module *net;
    ct_param_list params;
    ct_ddp *ddp;
    ct_optim *opt;    /* only zeroes the gradients in place */
    ct_tensor *x, *y; /* this rank's batch: (rows, 784) float32, (rows) int64 */
    int nbuckets;
    ct_tensor *bucket[MAX_BUCKETS]; /* (numel of bucket i's gradients) float32 */
} bench;

/* Reports the failed call with ct's message; returns 1. */
static int fail(const bench *b, const char *what) {
    fprintf(stderr, "bench_ddp: rank %d: %s: %s\n", b->rank, what, ct_errmsg());
    return 1;
}

static int parse(int argc, char **argv, options *o) {
    *o = (options){.steps = 200, .warmup_steps = 10, .rows = 32, .ddp = ct_ddp_defaults()};
    struct {
        const char *name;
        int64_t *value, min, max;
    } flags[] = {
        {"--steps", &o->steps, 1, 1000000},
        {"--warmup-steps", &o->warmup_steps, 0, 1000000},
        {"--rows", &o->rows, 1, 1000000},
        {"--first-bucket-bytes", &o->ddp.first_bucket_bytes, 0, INT64_MAX},
        {"--bucket-bytes", &o->ddp.bucket_bytes, 0, INT64_MAX},
        {"--progress", &o->progress, CT_DDP_PROGRESS_AUTO, CT_DDP_PROGRESS_END},
    };
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return 1;
        }
        size_t f = 0;
        while (f < sizeof flags / sizeof *flags && strcmp(argv[i], flags[f].name))
            f++;
        if (f == sizeof flags / sizeof *flags) {
            fprintf(stderr, "bench_ddp: unknown option %s\n%s", argv[i], usage);
            return 2;
        }
        char *end = NULL;
        errno = 0;
        long long v = i + 1 < argc ? strtoll(argv[i + 1], &end, 10) : 0;
        if (!end || *end || end == argv[i + 1] || errno || v < flags[f].min || v > flags[f].max) {
            fprintf(stderr, "bench_ddp: %s %s: expected a whole number in [%lld, %lld]\n", argv[i],
                    i + 1 < argc ? argv[i + 1] : "(missing)", (long long)flags[f].min,
                    (long long)flags[f].max);
            return 2;
        }
        *flags[f].value = v;
    }
    o->ddp.progress = (int)o->progress;
    return 0;
}

/* fmnist_mlp's model, with the same seed on every rank (ct_ddp_new then
 * broadcasts rank 0's weights anyway). */
static int build(bench *b, const options *o) {
    ct_manual_seed(1);
    b->net = ct_sequential_new();
    ct_sequential_append(b->net, ct_linear_new(IN_FEATURES, HIDDEN, true));
    ct_sequential_append(b->net, ct_relu_new());
    ct_sequential_append(b->net, ct_linear_new(HIDDEN, HIDDEN, true));
    ct_sequential_append(b->net, ct_relu_new());
    ct_sequential_append(b->net, ct_linear_new(HIDDEN, CLASSES, true));
    if (!b->net || ct_module_flatten(b->net, false) ||
        ct_module_named_parameters(b->net, &b->params))
        return fail(b, "building the model");
    if (!(b->ddp = ct_ddp_new(b->comm, b->net, &o->ddp)))
        return fail(b, "ct_ddp_new");
    ct_optim_options so = ct_optim_defaults(CT_OPTIM_SGD, 0.05);
    if (!(b->opt = ct_optim_new(&so, b->params.tensors, b->params.n)))
        return fail(b, "making the optimizer");
    /* Each rank its own rows, as each trains on its share of a batch. */
    ct_manual_seed(2 + (uint64_t)b->rank);
    int64_t *labels = malloc((size_t)o->rows * sizeof *labels);
    if (!labels) {
        fprintf(stderr, "bench_ddp: rank %d: out of memory for %lld labels\n", b->rank,
                (long long)o->rows);
        return 1;
    }
    for (int64_t i = 0; i < o->rows; i++)
        labels[i] = (i * 7 + b->rank) % CLASSES;
    b->x = ct_rand(2, (int64_t[]){o->rows, IN_FEATURES}, CT_FLOAT32, NULL);
    b->y = ct_from_data(labels, 1, &o->rows, CT_INT64);
    free(labels);
    if (!b->x || !b->y)
        return fail(b, "making the batch");
    return 0;
}

/* One float32 tensor per bucket, as large as the gradients ct_ddp put in
 * it (the bucket names its parameters). Call after the first backward,
 * which may rebuild the buckets. */
static int make_buckets(bench *b) {
    int n = ct_ddp_num_buckets(b->ddp);
    if (n < 0)
        return fail(b, "ct_ddp_num_buckets");
    if (n > MAX_BUCKETS) {
        fprintf(stderr, "bench_ddp: rank %d: %d buckets, more than the %d this bench holds\n",
                b->rank, n, MAX_BUCKETS);
        return 1;
    }
    for (int i = 0; i < n; i++) {
        const char *const *names = ct_ddp_bucket_names(b->ddp, i);
        if (!names)
            return fail(b, "ct_ddp_bucket_names");
        int64_t numel = 0;
        for (; *names; names++)
            numel += ct_numel(ct_param_list_find(&b->params, *names));
        if (!(b->bucket[i] = ct_comm_zeros(b->comm, 1, &numel, CT_FLOAT32)))
            return fail(b, "making the bucket-sized tensors");
        b->nbuckets = i + 1;
    }
    return 0;
}

/* A forward, a barrier, then the timed backward; the gradients are zeroed
 * after it, in place. */
static int time_backward(bench *b, bool sync, double *seconds) {
    int rc = sync ? 0 : ct_ddp_set_sync(b->ddp, false);
    if (rc)
        return fail(b, "ct_ddp_set_sync(false)");
    ct_scope_begin();
    ct_tensor *loss = ct_cross_entropy(ct_module_forward(b->net, b->x), b->y, NULL);
    const char *what = "forward";
    if (loss) {
        what = "barrier";
        rc = ct_comm_barrier(b->comm, NULL);
    } else {
        rc = ct_errcode();
    }
    if (!rc) {
        what = sync ? "backward" : "backward without sync";
        double t0 = bench_now();
        rc = ct_tensor_backward(loss);
        *seconds = bench_now() - t0;
    }
    ct_scope_end();
    if (!rc) {
        what = "ct_optim_zero_grad";
        rc = ct_optim_zero_grad(b->opt, false);
    }
    if (!rc && !sync) {
        what = "ct_ddp_set_sync(true)";
        rc = ct_ddp_set_sync(b->ddp, true);
    }
    return rc ? fail(b, what) : 0;
}

/* A barrier, then every bucket's blocking allreduce in bucket order. */
static int time_allreduce(bench *b, double *seconds) {
    if (ct_comm_barrier(b->comm, NULL))
        return fail(b, "barrier");
    double t0 = bench_now();
    for (int i = 0; i < b->nbuckets; i++)
        if (ct_comm_allreduce(b->comm, b->bucket[i], CT_REDUCE_AVG, NULL))
            return fail(b, "allreduce of a bucket");
    *seconds = bench_now() - t0;
    return 0;
}

static int time_step(bench *b, double *t) {
    if (time_backward(b, true, &t[T_SYNC]) || time_backward(b, false, &t[T_NOSYNC]))
        return 1;
    return time_allreduce(b, &t[T_ALLREDUCE]);
}

/* Median of column kind of steps rows of T_KINDS; sorts a copy. */
static double median(const double *times, int64_t steps, int kind, double *scratch) {
    for (int64_t s = 0; s < steps; s++)
        scratch[s] = times[s * T_KINDS + kind];
    qsort(scratch, (size_t)steps, sizeof *scratch, bench_cmp_double);
    return steps % 2 ? scratch[steps / 2] : (scratch[steps / 2 - 1] + scratch[steps / 2]) / 2;
}

static int64_t bucket_bytes(const bench *b, int i) {
    return ct_numel(b->bucket[i]) * (int64_t)sizeof(float);
}

static void report(const bench *b, const options *o, const double *times, double *scratch) {
    double sync = median(times, o->steps, T_SYNC, scratch);
    double nosync = median(times, o->steps, T_NOSYNC, scratch);
    double comm = median(times, o->steps, T_ALLREDUCE, scratch);
    double hidden = comm > 0 ? 1 - (sync - nosync) / comm : 0;
    hidden = hidden < 0 ? 0 : hidden > 1 ? 1 : hidden;
    int64_t bytes = 0;
    for (int i = 0; i < b->nbuckets; i++)
        bytes += bucket_bytes(b, i);
    printf("{\"bench\": \"ddp_overlap\", \"impl\": \"ct\", \"backend\": \"%s\", \"ranks\": %d, "
           "\"threads_per_rank\": %d, \"rank_batch\": %lld, \"params\": %lld, "
           "\"buckets\": %d, \"bucket_bytes\": [",
           ct_backend_name(ct_comm_backend(b->comm)), ct_comm_size(b->comm), ct_get_num_threads(),
           (long long)o->rows, (long long)ct_param_list_numel(&b->params), b->nbuckets);
    for (int i = 0; i < b->nbuckets; i++)
        printf("%s%lld", i ? ", " : "", (long long)bucket_bytes(b, i));
    printf("], \"grad_bytes\": %lld, \"steps\": %lld, \"backward_sync_us\": %.1f, "
           "\"backward_nosync_us\": %.1f, \"allreduce_us\": %.1f, \"exposed_us\": %.1f, "
           "\"hidden\": %.3f}\n",
           (long long)bytes, (long long)o->steps, sync * 1e6, nosync * 1e6, comm * 1e6,
           (sync - nosync) * 1e6, hidden);
    fflush(stdout);
}

static int run(bench *b, const options *o) {
    if (build(b, o))
        return 1;
    double t[T_KINDS];
    /* The first backward runs alone: it may rebuild the buckets that the
     * bare allreduce mirrors. */
    if (time_backward(b, true, &t[T_SYNC]) || make_buckets(b))
        return 1;
    for (int64_t s = 0; s < o->warmup_steps; s++)
        if (time_step(b, t))
            return 1;
    int64_t n = o->steps * T_KINDS;
    ct_tensor *times = ct_zeros(1, &n, CT_FLOAT64);
    double *scratch = malloc((size_t)o->steps * sizeof *scratch);
    int rc = times && scratch ? 0 : fail(b, "making the time table");
    for (int64_t s = 0; !rc && s < o->steps; s++)
        rc = time_step(b, (double *)ct_data_ptr(times) + s * T_KINDS);
    /* Each step's time is its slowest rank's. */
    if (!rc && ct_comm_allreduce(b->comm, times, CT_REDUCE_MAX, NULL))
        rc = fail(b, "allreduce (max) of the times");
    if (!rc && b->rank == 0)
        report(b, o, ct_data_ptr(times), scratch);
    free(scratch);
    ct_tensor_free(times);
    return rc;
}

int main(int argc, char **argv) {
    options o;
    int rc = parse(argc, argv, &o);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (ct_dist_init(NULL)) {
        fprintf(stderr, "bench_ddp: ct_dist_init: %s\n", ct_errmsg());
        return 1;
    }
    bench b = {.comm = ct_dist_comm(), .rank = ct_comm_rank(ct_dist_comm())};
    ct_param_list_init(&b.params);
    if (ct_comm_size(b.comm) == 1)
        fprintf(stderr, "bench_ddp: one rank, nothing to hide: start it with ctlaunch -np 2\n");
    rc = run(&b, &o);
    for (int i = 0; i < b.nbuckets; i++)
        ct_tensor_free(b.bucket[i]);
    ct_tensor_free(b.x);
    ct_tensor_free(b.y);
    ct_optim_free(b.opt);
    ct_ddp_free(b.ddp);
    ct_param_list_free(&b.params);
    ct_module_free(b.net);
    ct_dist_finalize();
    return rc;
}
