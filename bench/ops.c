/* bench_ops: ct's core ops next to their peers in the same run.
 *
 *   bench_ops [matmul|elementwise|rowwise|norm]...    (default: all)
 *
 * CT_BENCH_THREADS lists the thread counts (default "1,2").
 *
 * Cases: float32 matmul (square n, b plain "nn" or a transposed view "nt")
 * against a direct cblas_sgemm; add, mul and a broadcast add against memcpy
 * moving as many bytes; sum and softmax along the last dim; layer norm
 * forward alone and with the gradients of x, weight and bias (norm).
 * ops_torch.py times the same cases in PyTorch.
 *
 * stdout: one JSON object per result, with "us" (median time per call) and
 * "gflops" or "gbps" (bytes read + written). stderr: notes and one line per
 * comparison. Every op makes a fresh output, freed each iteration, as a
 * training step would. Implementations alternate within each repetition, so
 * a noisy neighbour slows them alike. */
#include <ct/autograd.h>
#include <ct/nn.h>
#include <ct/tensor.h>

#include "bench_time.h"
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REPS         7
#define REP_SECONDS  0.02 /* each repetition runs at least this long */
#define WARM_SECONDS 0.01
#define MAX_IMPLS    3
#define MAX_THREADS  16

typedef bool (*run_fn)(void *ctx);

typedef struct impl {
    const char *name;
    run_fn run;
    void *ctx;
    int blas_threads; /* OpenBLAS's own threads while this runs */
    double us;        /* median per call; < 0 when the op failed */
} impl;

typedef struct bench_case {
    const char *op, *layout; /* layout may be NULL */
    int64_t size;            /* n for matmul, elements otherwise */
    int ndim;
    int64_t shape[2];
    const char *metric; /* "gflops" or "gbps" */
    double amount;      /* flops or bytes per call */
    impl impls[MAX_IMPLS];
    int nimpls;
} bench_case;

/* After a threaded call OpenBLAS's idle threads spin for 2^28 cycles
 * (OPENBLAS_THREAD_TIMEOUT), taking cores from whatever runs next: ct's
 * matmul ran at 60% speed for 0.2 s after one. */
#define OPENBLAS_SPIN_SECONDS 0.5

/* Calls right after another implementation ran, or after a pause, find cold
 * caches and idle (on a VM, descheduled) cores: they warm up untimed. */
static double time_calls(impl *im, int64_t iters) {
    openblas_set_num_threads(im->blas_threads);
    double t0 = bench_now();
    do
        im->run(im->ctx);
    while (bench_now() - t0 < WARM_SECONDS);
    t0 = bench_now();
    for (int64_t i = 0; i < iters; i++)
        im->run(im->ctx);
    double t = bench_now() - t0;
    /* ct needs OpenBLAS at one thread: it parallelises over its own pool. */
    openblas_set_num_threads(1);
    if (im->blas_threads > 1)
        nanosleep(&(struct timespec){0, (long)(OPENBLAS_SPIN_SECONDS * 1e9)}, NULL);
    return t;
}

static void measure(bench_case *c) {
    int64_t iters[MAX_IMPLS];
    double samples[MAX_IMPLS][REPS];
    for (int i = 0; i < c->nimpls; i++) {
        impl *im = &c->impls[i];
        im->us = -1;
        if (!im->run(im->ctx)) {
            fprintf(stderr, "%s %s: %s failed: %s\n", c->op, c->layout ? c->layout : "", im->name,
                    ct_errmsg());
            iters[i] = 0;
            continue;
        }
        double once = time_calls(im, 1);
        iters[i] = once >= REP_SECONDS ? 1 : (int64_t)(REP_SECONDS / once) + 1;
    }
    for (int r = 0; r < REPS; r++)
        for (int i = 0; i < c->nimpls; i++)
            if (iters[i])
                samples[i][r] = time_calls(&c->impls[i], iters[i]) / (double)iters[i];
    for (int i = 0; i < c->nimpls; i++) {
        if (!iters[i])
            continue;
        qsort(samples[i], REPS, sizeof(double), bench_cmp_double);
        c->impls[i].us = samples[i][REPS / 2] * 1e6;
    }
}

static double rate(const bench_case *c, const impl *im) { return c->amount / im->us * 1e-3; }

static void report(const bench_case *c, int threads) {
    char shape[64];
    int len = snprintf(shape, sizeof shape, "[");
    for (int d = 0; d < c->ndim; d++)
        len += snprintf(shape + len, sizeof shape - (size_t)len, "%s%lld", d ? ", " : "",
                        (long long)c->shape[d]);
    snprintf(shape + len, sizeof shape - (size_t)len, "]");
    for (int i = 0; i < c->nimpls; i++) {
        const impl *im = &c->impls[i];
        if (im->us < 0)
            continue;
        printf("{\"bench\": \"ops\", \"op\": \"%s\", ", c->op);
        if (c->layout)
            printf("\"layout\": \"%s\", ", c->layout);
        printf("\"impl\": \"%s\", \"size\": %lld, \"shape\": %s, \"threads\": %d, "
               "\"us\": %.2f, \"%s\": %.3f}\n",
               im->name, (long long)c->size, shape, threads, im->us, c->metric, rate(c, im));
    }
    fflush(stdout);
    const impl *ct = &c->impls[0];
    for (int i = 1; i < c->nimpls; i++) {
        const impl *peer = &c->impls[i];
        if (ct->us >= 0 && peer->us >= 0)
            fprintf(stderr, "ops %s %s %s threads=%d: ct %.2f %s, %s %.2f: ct/%s %.2f\n", c->op,
                    c->layout ? c->layout : "", shape, threads, rate(c, ct), c->metric, peer->name,
                    rate(c, peer), peer->name, rate(c, ct) / rate(c, peer));
    }
}

static void run_case(bench_case *c, int threads) {
    measure(c);
    report(c, threads);
}

/* ------------------------------------------------------------- ct ops */

typedef struct ct_call {
    ct_tensor *(*fn)(ct_tensor *, ct_tensor *);
    ct_tensor *a, *b;
} ct_call;

static bool run_ct(void *ctx) {
    ct_call *c = ctx;
    ct_scope_begin();
    bool ok = c->fn(c->a, c->b) != NULL;
    ct_scope_end();
    return ok;
}

static ct_tensor *sum_last(ct_tensor *t, ct_tensor *unused) {
    (void)unused;
    return ct_sum(t, CT_DIMS(-1), false);
}

static ct_tensor *softmax_last(ct_tensor *t, ct_tensor *unused) {
    (void)unused;
    return ct_softmax(t, -1);
}

/* Layer norm as a training step runs it: the forward, then (backward) the
 * gradients of x, weight and bias for the output gradient g. */
typedef struct ln_call {
    ct_tensor *x, *w, *b, *g;
    bool backward;
} ln_call;

static bool run_layer_norm(void *ctx) {
    ln_call *c = ctx;
    ct_scope_begin();
    ct_tensor *y = ct_layer_norm(c->x, c->w, c->b, 1e-5), *grads[3];
    bool ok = y && (!c->backward ||
                    ct_grad(&y, 1, &c->g, (ct_tensor *[]){c->x, c->w, c->b}, 3, grads, NULL) == 0);
    ct_scope_end();
    return ok;
}

/* ------------------------------------------------------------- peers */

typedef struct sgemm_call {
    const float *a, *b;
    float *c;
    int n;
    bool trans_b;
} sgemm_call;

static bool run_sgemm(void *ctx) {
    sgemm_call *g = ctx;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, g->trans_b ? CblasTrans : CblasNoTrans, g->n, g->n,
                g->n, 1.0f, g->a, g->n, g->b, g->n, 0.0f, g->c, g->n);
    return true;
}

typedef struct copy_call {
    char *dst;
    const char *src;
    int64_t bytes;
} copy_call;

static void copy_range(void *ctx, int64_t lo, int64_t hi) {
    copy_call *c = ctx;
    memcpy(c->dst + lo, c->src + lo, (size_t)(hi - lo));
}

/* memcpy on as many threads as ct uses: the bandwidth the machine offers. */
static bool run_memcpy(void *ctx) {
    copy_call *c = ctx;
    ct_parallel_for(0, c->bytes, 1 << 20, copy_range, c);
    return true;
}

/* ------------------------------------------------------------- cases */

static ct_tensor *filled(int ndim, const int64_t *sizes) {
    ct_tensor *t = ct_empty(ndim, sizes, CT_FLOAT32);
    if (!t) {
        fprintf(stderr, "bench_ops: %s\n", ct_errmsg());
        exit(1);
    }
    float *p = ct_data_ptr(t);
    for (int64_t i = 0; i < ct_numel(t); i++)
        p[i] = (float)(i % 1000) * 1e-3f - 0.5f;
    return t;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "bench_ops: out of memory allocating %zu bytes\n", n);
        exit(1);
    }
    return p;
}

static void bench_matmul(int threads) {
    static const int sizes[] = {64, 128, 256, 512, 1024, 2048};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int n = sizes[s];
        ct_tensor *a = filled(CT_SHAPE(n, n)), *w = filled(CT_SHAPE(n, n));
        float *c = xmalloc(sizeof(float) * (size_t)n * (size_t)n);
        for (int trans = 0; trans < 2; trans++) {
            ct_tensor *b = trans ? ct_transpose(w, 0, 1) : ct_tensor_retain(w);
            ct_call ct = {ct_matmul, a, b};
            sgemm_call blas = {ct_data_ptr(a), ct_data_ptr(w), c, n, trans};
            bench_case bc = {
                .op = "matmul",
                .layout = trans ? "nt" : "nn",
                .size = n,
                .ndim = 2,
                .shape = {n, n},
                .metric = "gflops",
                .amount = 2.0 * n * n * n,
                .impls = {{"ct", run_ct, &ct, 1, 0}, {"openblas", run_sgemm, &blas, threads, 0}},
                .nimpls = 2,
            };
            run_case(&bc, threads);
            ct_tensor_free(b);
        }
        free(c);
        ct_tensor_free(a);
        ct_tensor_free(w);
    }
}

static void bench_elementwise(int threads) {
    static const int64_t sizes[] = {1 << 20, 1 << 22, 1 << 24, 1 << 26};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int64_t n = sizes[s];
        ct_tensor *a = filled(CT_SHAPE(n)), *b = filled(CT_SHAPE(n));
        ct_tensor *rows = ct_view(a, CT_SHAPE(n / 1024, 1024)), *v = filled(CT_SHAPE(1024));
        /* A binary op reads 8 and writes 4 bytes per element; the broadcast
         * one reads 4 (v stays in cache). */
        int64_t copy_bytes = 6 * n;
        char *src = xmalloc((size_t)copy_bytes), *dst = xmalloc((size_t)copy_bytes);
        memset(src, 1, (size_t)copy_bytes);
        memset(dst, 0, (size_t)copy_bytes);
        struct {
            const char *op;
            ct_call call;
            int64_t bytes;
            int ndim;
        } ops[] = {
            {"add", {ct_add, a, b}, 12 * n, 1},
            {"mul", {ct_mul, a, b}, 12 * n, 1},
            {"add_bcast", {ct_add, rows, v}, 8 * n, 2},
        };
        for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
            copy_call copy = {dst, src, ops[i].bytes / 2};
            bench_case bc = {
                .op = ops[i].op,
                .size = n,
                .ndim = ops[i].ndim,
                .shape = {ops[i].ndim == 2 ? n / 1024 : n, 1024},
                .metric = "gbps",
                .amount = (double)ops[i].bytes,
                .impls = {{"ct", run_ct, &ops[i].call, 1, 0}, {"memcpy", run_memcpy, &copy, 1, 0}},
                .nimpls = 2,
            };
            run_case(&bc, threads);
        }
        free(src);
        free(dst);
        ct_tensor_free(v);
        ct_tensor_free(rows);
        ct_tensor_free(a);
        ct_tensor_free(b);
    }
}

static void bench_rowwise(int threads) {
    static const int64_t shapes[][2] = {{1024, 1024}, {4096, 1024}, {64, 65536}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        ct_tensor *t = filled(2, shapes[s]);
        double bytes = 4.0 * (double)ct_numel(t);
        struct {
            const char *op;
            ct_call call;
            double bytes;
        } ops[] = {
            {"sum", {sum_last, t, NULL}, bytes + 4.0 * (double)shapes[s][0]},
            {"softmax", {softmax_last, t, NULL}, 2 * bytes},
        };
        for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
            bench_case bc = {
                .op = ops[i].op,
                .size = shapes[s][0] * shapes[s][1],
                .ndim = 2,
                .shape = {shapes[s][0], shapes[s][1]},
                .metric = "gbps",
                .amount = ops[i].bytes,
                .impls = {{"ct", run_ct, &ops[i].call, 1, 0}},
                .nimpls = 1,
            };
            run_case(&bc, threads);
        }
        ct_tensor_free(t);
    }
}

/* GPT-sized rows: [batch * context, width]. Bytes are those a fused
 * implementation must move: x in and y out; then g and x in, dx out. */
static void bench_norm(int threads) {
    static const int64_t shape[2] = {4096, 128};
    ct_tensor *x = filled(2, shape), *g = filled(2, shape);
    ct_tensor *w = filled(1, shape + 1), *b = filled(1, shape + 1);
    ct_tensor *xg = ct_requires_grad_(ct_clone(x), true);
    ct_tensor *wg = ct_requires_grad_(ct_clone(w), true);
    ct_tensor *bg = ct_requires_grad_(ct_clone(b), true);
    double n = (double)(shape[0] * shape[1]);
    struct {
        const char *op;
        ln_call call;
        double bytes;
    } ops[] = {
        {"layer_norm", {x, w, b, NULL, false}, 8 * n},
        {"layer_norm_fwd_bwd", {xg, wg, bg, g, true}, 20 * n},
    };
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        bench_case bc = {
            .op = ops[i].op,
            .size = shape[0] * shape[1],
            .ndim = 2,
            .shape = {shape[0], shape[1]},
            .metric = "gbps",
            .amount = ops[i].bytes,
            .impls = {{"ct", run_layer_norm, &ops[i].call, 1, 0}},
            .nimpls = 1,
        };
        run_case(&bc, threads);
    }
    ct_tensor *all[] = {x, g, w, b, xg, wg, bg};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        ct_tensor_free(all[i]);
}

/* "1,2" -> {1, 2}; returns the count, 0 on a malformed list. */
static int parse_threads(const char *s, int *out) {
    int n = 0;
    while (*s && n < MAX_THREADS) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 4096 || (*end && *end != ','))
            return 0;
        out[n++] = (int)v;
        s = *end ? end + 1 : end;
    }
    return n;
}

static const struct {
    const char *name;
    void (*run)(int threads);
} groups[] = {
    {"matmul", bench_matmul},
    {"elementwise", bench_elementwise},
    {"rowwise", bench_rowwise},
    {"norm", bench_norm},
};
#define NGROUPS (sizeof groups / sizeof *groups)

int main(int argc, char **argv) {
    bool selected[NGROUPS];
    for (size_t g = 0; g < NGROUPS; g++) {
        selected[g] = argc < 2;
        for (int a = 1; a < argc; a++)
            selected[g] |= strcmp(argv[a], groups[g].name) == 0;
    }
    for (int a = 1; a < argc; a++) {
        size_t g = 0;
        while (g < NGROUPS && strcmp(argv[a], groups[g].name) != 0)
            g++;
        if (g == NGROUPS) {
            fprintf(stderr, "usage: bench_ops [matmul|elementwise|rowwise|norm]...\n");
            return 2;
        }
    }
    const char *env = getenv("CT_BENCH_THREADS");
    int threads[MAX_THREADS];
    int nthreads = parse_threads(env && *env ? env : "1,2", threads);
    if (!nthreads) {
        fprintf(stderr, "bench_ops: CT_BENCH_THREADS=%s: expected a list like 1,2,4\n", env);
        return 2;
    }
    const char *coretype = getenv("OPENBLAS_CORETYPE");
    fprintf(stderr,
            "bench_ops: OpenBLAS core %s (OPENBLAS_CORETYPE=%s; it picks the kernels for "
            "both ct and the direct cblas_sgemm)\n",
            openblas_get_corename(), coretype ? coretype : "unset");
    for (int i = 0; i < nthreads; i++) {
        if (ct_set_num_threads(threads[i]) != 0) {
            fprintf(stderr, "bench_ops: %s\n", ct_errmsg());
            return 1;
        }
        for (size_t g = 0; g < NGROUPS; g++)
            if (selected[g])
                groups[g].run(threads[i]);
    }
    return 0;
}
