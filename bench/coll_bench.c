/* The sweep, timing and reporting of the collectives benchmarks; the method
 * is described in coll_bench.h and docs/bench-collectives.md. */
#include "coll_bench.h"

#include "bench_time.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REPS 5
/* Calibration stops doubling here even if the calls still look free. */
#define MAX_CALIBRATION_ITERS (INT64_C(1) << 24)

static const char *const op_names[COLL_NOPS] = {"allreduce", "broadcast", "allgather",
                                                "reduce_scatter"};

const char *coll_op_name(coll_op op) { return op < COLL_NOPS ? op_names[op] : "?"; }

double coll_busbw_factor(coll_op op, int nranks) {
    double n = nranks;
    switch (op) {
    case COLL_ALLREDUCE: return 2.0 * (n - 1) / n;
    case COLL_ALLGATHER:
    case COLL_REDUCE_SCATTER: return (n - 1) / n;
    case COLL_BROADCAST:
    case COLL_NOPS: break;
    }
    return 1.0;
}

/* --------------------------------------------------------------- options */

/* "64M" -> 67108864; false for anything but a positive whole number with
 * an optional K, M or G. */
static bool parse_bytes(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v <= 0)
        return false;
    int shift = 0;
    switch (*end) {
    case 'K': shift = 10, end++; break;
    case 'M': shift = 20, end++; break;
    case 'G': shift = 30, end++; break;
    default: break;
    }
    if (*end || v > (INT64_MAX >> shift))
        return false;
    *out = (int64_t)v << shift;
    return true;
}

/* "allreduce,broadcast" -> ops; false for an unknown name or no name. */
static bool parse_ops(const char *list, bool *ops) {
    memset(ops, 0, COLL_NOPS * sizeof *ops);
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        int op = 0;
        while (op < COLL_NOPS && (strlen(op_names[op]) != len || strncmp(p, op_names[op], len)))
            op++;
        if (op == COLL_NOPS)
            return false;
        ops[op] = true;
        p += len + (p[len] == ',');
    }
    for (int op = 0; op < COLL_NOPS; op++)
        if (ops[op])
            return true;
    return false;
}

int coll_options_parse(coll_options *o, int argc, char **argv, const char *usage, bool with_ops) {
    *o = (coll_options){.min_bytes = 8, .max_bytes = 64 << 20, .factor = 2, .seconds = 0.2};
    o->ops[COLL_ALLREDUCE] = true;
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a], *val = a + 1 < argc ? argv[a + 1] : NULL;
        bool ok = true;
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            fputs(usage, stdout);
            return 1;
        } else if (with_ops && !strcmp(arg, "--memcpy")) {
            o->memcpy_only = true;
            continue;
        } else if (with_ops && !strcmp(arg, "--shared")) {
            o->shared = true;
            continue;
        } else if (!val) {
            ok = false;
        } else if (!strcmp(arg, "-b")) {
            ok = parse_bytes(val, &o->min_bytes);
        } else if (!strcmp(arg, "-e")) {
            ok = parse_bytes(val, &o->max_bytes);
        } else if (!strcmp(arg, "-f")) {
            ok = parse_bytes(val, &o->factor) && o->factor >= 2;
        } else if (!strcmp(arg, "--seconds")) {
            char *end;
            o->seconds = strtod(val, &end);
            ok = *end == 0 && o->seconds > 0 && o->seconds < 3600;
        } else if (with_ops && !strcmp(arg, "--ops")) {
            ok = parse_ops(val, o->ops);
        } else {
            fprintf(stderr, "%s: unknown option '%s'\n%s", argv[0], arg, usage);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "%s: %s %s: invalid value\n%s", argv[0], arg, val ? val : "(missing)",
                    usage);
            return 2;
        }
        a++;
    }
    if (o->min_bytes > o->max_bytes) {
        fprintf(stderr, "%s: -b %lld is above -e %lld\n", argv[0], (long long)o->min_bytes,
                (long long)o->max_bytes);
        return 2;
    }
    return 0;
}

/* ---------------------------------------------------------------- timing */

/* Times iters calls after a barrier: the maximum over ranks of their
 * elapsed seconds, the same on every rank. */
static int time_batch(const coll_runner *r, int64_t iters, double *seconds) {
    int rc = r->barrier(r->ctx);
    if (rc)
        return rc;
    double t0 = bench_now();
    rc = r->run(r->ctx, iters);
    if (rc)
        return rc;
    *seconds = bench_now() - t0;
    return r->max(r->ctx, seconds);
}

/* One size of a sweep: its calls per repetition and the seconds per call
 * of each pass. */
typedef struct size_stat {
    int64_t count, iters;
    double per_call[REPS];
} size_stat;

/* One repetition of a prepared size. The first pass calibrates: untimed
 * batches double until one takes half a repetition, which also warms up,
 * and the repetition gets the calls that fill it at the fastest rate a
 * batch showed (a neighbour's stall only ever slows a batch down, and must
 * not shrink every later one). Later passes warm up with a quarter of a
 * repetition, since the other sizes ran in between. */
static int time_pass(const coll_runner *r, double rep_s, int pass, size_stat *s) {
    double t;
    /* The first call pages in fresh buffers and sets up the size's path;
     * it would distort the calibration. */
    int rc = r->run(r->ctx, 1);
    if (rc)
        return rc;
    if (pass == 0) {
        double fastest = INFINITY;
        for (int64_t n = 1;; n *= 2) {
            if ((rc = time_batch(r, n, &t)))
                return rc;
            fastest = fmin(fastest, t / (double)n);
            if (t >= rep_s / 2 || n >= MAX_CALIBRATION_ITERS)
                break;
        }
        s->iters = (int64_t)llround(rep_s / fmax(fastest, 1e-9));
        if (s->iters < 1)
            s->iters = 1;
    } else if (s->iters >= 4 && (rc = r->run(r->ctx, s->iters / 4))) {
        return rc;
    }
    if ((rc = time_batch(r, s->iters, &t)))
        return rc;
    s->per_call[pass] = t / (double)s->iters;
    return 0;
}

static double median(double *v) {
    qsort(v, REPS, sizeof *v, bench_cmp_double);
    return v[REPS / 2];
}

/* ------------------------------------------------------------- the sweep */

/* Sizes a sweep visits at most: factor >= 2 from >= 1 byte within int64. */
#define MAX_SIZES 64

/* Measures op at every size in stats[0..n). Passes go over all the sizes
 * in turn, so a neighbour's burst of load, which on the shared machine
 * lasts seconds, lands in one pass of a size rather than in all of them. */
static int measure(const coll_runner *r, coll_op op, double seconds, size_stat *stats, int n) {
    double rep_s = seconds / (REPS + 1);
    for (int pass = 0; pass < REPS; pass++) {
        for (int i = 0; i < n; i++) {
            int rc = r->prepare ? r->prepare(r->ctx, op, stats[i].count) : 0;
            if (!rc)
                rc = time_pass(r, rep_s, pass, &stats[i]);
            if (rc)
                return rc;
        }
    }
    return 0;
}

int coll_sweep(const coll_runner *r, const coll_options *o, const char *impl, const char *backend) {
    const char *label = backend ? backend : impl;
    size_stat stats[MAX_SIZES];
    int n = 0;
    for (int64_t bytes = o->min_bytes; bytes <= o->max_bytes && n < MAX_SIZES; bytes *= o->factor) {
        int64_t count = bytes / (int64_t)sizeof(float);
        count -= count % r->nranks;
        if (count > 0)
            stats[n++] = (size_stat){.count = count};
        if (bytes > o->max_bytes / o->factor)
            break;
    }
    for (int op = 0; op < COLL_NOPS; op++) {
        if (!o->ops[op])
            continue;
        int rc = measure(r, (coll_op)op, o->seconds, stats, n);
        if (rc)
            return rc;
        if (r->rank != 0)
            continue;
        fprintf(stderr, "%-8s %-14s %12s %10s %12s %12s %12s\n", label, "op", "bytes", "iters",
                "time (us)", "algbw (GB/s)", "busbw (GB/s)");
        for (int i = 0; i < n; i++) {
            double sec = median(stats[i].per_call);
            int64_t nbytes = stats[i].count * (int64_t)sizeof(float);
            double algbw = (double)nbytes / sec * 1e-9;
            double busbw = algbw * coll_busbw_factor((coll_op)op, r->nranks);
            printf("{\"bench\": \"collectives\", \"impl\": \"%s\", ", impl);
            if (backend)
                printf("\"backend\": \"%s\", ", backend);
            printf("\"op\": \"%s\", \"dtype\": \"float32\", \"ranks\": %d, \"bytes\": %lld, "
                   "\"count\": %lld, \"iters\": %lld, \"us\": %.2f, \"algbw_gbps\": %.4f, "
                   "\"busbw_gbps\": %.4f}\n",
                   op_names[op], r->nranks, (long long)nbytes, (long long)stats[i].count,
                   (long long)stats[i].iters, sec * 1e6, algbw, busbw);
            fprintf(stderr, "%-8s %-14s %12lld %10lld %12.2f %12.4f %12.4f\n", label, op_names[op],
                    (long long)nbytes, (long long)stats[i].iters, sec * 1e6, algbw, busbw);
        }
        fflush(stdout);
    }
    return 0;
}

/* -------------------------------------------------------------- memcpy */

typedef struct memcpy_ctx {
    void *dst, *src;
    size_t bytes;
} memcpy_ctx;

static int memcpy_run(void *ctx, int64_t iters) {
    memcpy_ctx *m = ctx;
    for (int64_t i = 0; i < iters; i++) {
        memcpy(m->dst, m->src, m->bytes);
        /* Keeps the compiler from merging the copies: the timed loop must
         * move the bytes iters times. */
        __asm__ volatile("" ::"r"(m->dst) : "memory");
    }
    return 0;
}

static int nothing(void *ctx) { return 0; }
static int max_of_one(void *ctx, double *value) { return 0; }

int coll_memcpy_reference(const coll_options *o) {
    size_t bytes = (size_t)o->max_bytes;
    memcpy_ctx m = {.bytes = bytes, .dst = malloc(bytes), .src = malloc(bytes)};
    int rc = 1;
    if (!m.dst || !m.src) {
        fprintf(stderr, "memcpy reference: cannot allocate 2 x %zu bytes\n", bytes);
        goto done;
    }
    /* Touched before timing, so no page fault lands in a timed copy. */
    memset(m.src, 1, bytes);
    memset(m.dst, 0, bytes);
    coll_runner r = {
        .ctx = &m, .nranks = 1, .run = memcpy_run, .barrier = nothing, .max = max_of_one};
    size_stat stat = {.count = o->max_bytes};
    rc = measure(&r, COLL_NOPS, o->seconds, &stat, 1);
    if (rc)
        goto done;
    double sec = median(stat.per_call);
    int64_t iters = stat.iters;
    double gbps = (double)bytes / sec * 1e-9;
    printf("{\"bench\": \"collectives\", \"impl\": \"memcpy\", \"op\": \"memcpy\", \"threads\": 1, "
           "\"bytes\": %zu, \"iters\": %lld, \"us\": %.2f, \"algbw_gbps\": %.4f, \"gbps\": %.4f}\n",
           bytes, (long long)iters, sec * 1e6, gbps, 2 * gbps);
    fflush(stdout);
    fprintf(stderr,
            "memcpy %zu bytes, 1 thread: %.2f us, %.2f GB/s copied (%.2f GB/s read + "
            "written)\n",
            bytes, sec * 1e6, gbps, 2 * gbps);
done:
    free(m.dst);
    free(m.src);
    return rc;
}
