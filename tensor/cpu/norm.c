/* Layer norm on the CPU (the table's layer_norm and layer_norm_backward,
 * device_impl.h): one pass per row finds its mean and rstd and writes y;
 * the backward makes dx a row at a time and dweight and dbias as sums over
 * rows, in an order fixed by the shape alone. float32 and float64; the
 * front end (nn/layers.c) brings 16-bit rows here as float32. */
#include "cpu_impl.h"

#include <math.h>
#include <stdlib.h>

/* The CPU loops' operands, contiguous [rows, d] (w, b: [d]); NULL when not
 * given or not wanted. */
typedef struct ln_job {
    const void *x, *w, *b, *dy;
    void *y, *mean, *rstd, *dx, *dw, *db;
    double *part;           /* [chunks][LN_PART * d]: dweight and dbias summed over a chunk */
    int64_t rows, d, chunk; /* chunk: rows per chunk of the backward */
    double eps;
} ln_job;

/* The backward's chunks have at least CT__GRAIN_REDUCE elements, and there
 * are at most this many, which bounds the partial sums to LN_PART * d * 64
 * doubles. Both depend on the shape alone, never on the thread count, so
 * dweight and dbias come out the same on any number of threads. */
#define LN_MAX_CHUNKS 64

/* A chunk sums dweight and dbias over blocks of LN_BLOCK_ROWS rows in the
 * compute type, then adds each block's sums into its partial sums in
 * double: float sums of a few terms lose little, and cost half the memory
 * traffic of double ones. A chunk's partial is LN_PART * d doubles: the
 * double sums (2 * d), then the block sums. */
#define LN_BLOCK_ROWS 16
#define LN_PART       4

/* Row sums run in LN_LANES accumulators, lane l taking the terms l,
 * l + LN_LANES, ...: a fixed order that the compiler vectorises (it may not
 * reorder one running sum). */
#define LN_LANES 16

/* Sets acc[0..LN_LANES-1] to the lane sums of term over i in [0, n). One
 * sum per pass: gcc leaves a loop that feeds two sums scalar. */
#define LN_LANE_SUM(acc, n, i, term)                                                               \
    do {                                                                                           \
        for (int l_ = 0; l_ < LN_LANES; l_++)                                                      \
            (acc)[l_] = 0;                                                                         \
        int64_t base_ = 0;                                                                         \
        for (; base_ + LN_LANES <= (n); base_ += LN_LANES)                                         \
            for (int l_ = 0; l_ < LN_LANES; l_++) {                                                \
                int64_t i = base_ + l_;                                                            \
                (acc)[l_] += (term);                                                               \
            }                                                                                      \
        for (int l_ = 0; base_ + l_ < (n); l_++) {                                                 \
            int64_t i = base_ + l_;                                                                \
            (acc)[l_] += (term);                                                                   \
        }                                                                                          \
    } while (0)

/* The mean of n terms from their lane sums, added pairwise. Written out
 * for 16 lanes: gcc keeps a loop over the halving width rolled, through
 * memory. */
#define DEFINE_LANE_MEAN(S, T)                                                                     \
    static double ln_lane_mean_##S(T *acc, int64_t n) {                                            \
        _Static_assert(LN_LANES == 16, "the folds below add 16 lanes");                            \
        for (int l = 0; l < 8; l++)                                                                \
            acc[l] += acc[l + 8];                                                                  \
        for (int l = 0; l < 4; l++)                                                                \
            acc[l] += acc[l + 4];                                                                  \
        return ((double)(acc[0] + acc[2]) + (double)(acc[1] + acc[3])) / (double)n;                \
    }

DEFINE_LANE_MEAN(f32, float)
DEFINE_LANE_MEAN(f64, double)

/* T is float or double. The forward takes two passes over a row, as the
 * CUDA kernel does: the mean, then the squared deviations from it, which
 * cannot cancel as E[x^2] - E[x]^2 can. The mean is summed in double, which
 * keeps a float32 row's mean exact to float rounding even when it is large
 * next to the row's spread; the deviations, and the backward's sums, are
 * summed in T, as their terms carry no such offset. In the backward, g is
 * dy * weight and dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). */
#define DEFINE_LAYER_NORM(S, T)                                                                    \
    static void ln_forward_##S(void *ctx, int64_t lo, int64_t hi) {                                \
        const ln_job *j = ctx;                                                                     \
        const T *w = j->w, *b = j->b;                                                              \
        int64_t d = j->d;                                                                          \
        double s[LN_LANES];                                                                        \
        T q[LN_LANES];                                                                             \
        for (int64_t r = lo; r < hi; r++) {                                                        \
            const T *x = (const T *)j->x + r * d;                                                  \
            T *y = (T *)j->y + r * d;                                                              \
            LN_LANE_SUM(s, d, k, x[k]);                                                            \
            T m = (T)ln_lane_mean_f64(s, d);                                                       \
            LN_LANE_SUM(q, d, k, (x[k] - m) * (x[k] - m));                                         \
            T rs = (T)(1 / sqrt(ln_lane_mean_##S(q, d) + j->eps));                                 \
            ((T *)j->mean)[r] = m;                                                                 \
            ((T *)j->rstd)[r] = rs;                                                                \
            for (int64_t k = 0; k < d; k++) {                                                      \
                T v = (x[k] - m) * rs;                                                             \
                if (w)                                                                             \
                    v *= w[k];                                                                     \
                if (b)                                                                             \
                    v += b[k];                                                                     \
                y[k] = v;                                                                          \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* Chunks [lo, hi): dx for their rows, and each chunk's partial sums. w                        \
     * is never NULL here. Each loop computes one thing: merged, with their                        \
     * pointers that might alias, gcc leaves them scalar (3x slower). */                           \
    static void ln_backward_##S(void *ctx, int64_t lo, int64_t hi) {                               \
        const ln_job *j = ctx;                                                                     \
        const T *w = j->w;                                                                         \
        int64_t d = j->d;                                                                          \
        T acc[LN_LANES];                                                                           \
        for (int64_t c = lo; c < hi; c++) {                                                        \
            double *pw = j->part ? j->part + LN_PART * c * d : NULL, *pb = pw ? pw + d : NULL;     \
            T *bw = pw ? (T *)(pb + d) : NULL, *bb = bw ? bw + d : NULL;                           \
            for (int64_t k = 0; pw && k < 2 * d; k++)                                              \
                pw[k] = 0;                                                                         \
            int64_t start = c * j->chunk;                                                          \
            int64_t end = start + j->chunk < j->rows ? start + j->chunk : j->rows;                 \
            for (int64_t r = start; r < end; r++) {                                                \
                const T *x = (const T *)j->x + r * d, *dy = (const T *)j->dy + r * d;              \
                T m = ((const T *)j->mean)[r], rs = ((const T *)j->rstd)[r];                       \
                if (j->dx) {                                                                       \
                    T *dx = (T *)j->dx + r * d;                                                    \
                    LN_LANE_SUM(acc, d, k, dy[k] * w[k]);                                          \
                    T mg = (T)ln_lane_mean_##S(acc, d);                                            \
                    LN_LANE_SUM(acc, d, k, dy[k] * w[k] * ((x[k] - m) * rs));                      \
                    T mgx = (T)ln_lane_mean_##S(acc, d);                                           \
                    for (int64_t k = 0; k < d; k++)                                                \
                        dx[k] = rs * (dy[k] * w[k] - mg - (x[k] - m) * rs * mgx);                  \
                }                                                                                  \
                if (!pw)                                                                           \
                    continue;                                                                      \
                if ((r - start) % LN_BLOCK_ROWS == 0)                                              \
                    for (int64_t k = 0; k < 2 * d; k++)                                            \
                        bw[k] = 0;                                                                 \
                if (j->dw)                                                                         \
                    for (int64_t k = 0; k < d; k++)                                                \
                        bw[k] += dy[k] * ((x[k] - m) * rs);                                        \
                if (j->db)                                                                         \
                    for (int64_t k = 0; k < d; k++)                                                \
                        bb[k] += dy[k];                                                            \
                if ((r - start) % LN_BLOCK_ROWS == LN_BLOCK_ROWS - 1 || r == end - 1)              \
                    for (int64_t k = 0; k < 2 * d; k++)                                            \
                        pw[k] += bw[k];                                                            \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* dweight and dbias: the chunks' partial sums added in chunk order. */                        \
    static void ln_combine_##S(const ln_job *j, int64_t nchunks) {                                 \
        int64_t d = j->d;                                                                          \
        for (int64_t c = 1; c < nchunks; c++)                                                      \
            for (int64_t k = 0; k < 2 * d; k++)                                                    \
                j->part[k] += j->part[LN_PART * c * d + k];                                        \
        for (int64_t k = 0; j->dw && k < d; k++)                                                   \
            ((T *)j->dw)[k] = (T)j->part[k];                                                       \
        for (int64_t k = 0; j->db && k < d; k++)                                                   \
            ((T *)j->db)[k] = (T)j->part[d + k];                                                   \
    }

DEFINE_LAYER_NORM(f32, float)
DEFINE_LAYER_NORM(f64, double)

static void *data_or_null(const ct_tensor *t) { return t ? ct__data(t) : NULL; }

/* x viewed as [rows, d], d its last dim. */
static void rows_of(const ct_tensor *x, int64_t *rows, int64_t *d) {
    *d = x->sizes[x->ndim - 1];
    *rows = *d ? ct_numel(x) / *d : 0;
}

/* The operands that the forward and the backward share. */
static ln_job ln_job_of(ct_tensor *x, ct_tensor *w, ct_tensor *mean, ct_tensor *rstd) {
    ln_job j = {
        .x = ct__data(x), .w = data_or_null(w), .mean = ct__data(mean), .rstd = ct__data(rstd)};
    rows_of(x, &j.rows, &j.d);
    return j;
}

int ct__cpu_layer_norm(ct_tensor *y, ct_tensor *mean, ct_tensor *rstd, ct_tensor *x, ct_tensor *w,
                       ct_tensor *b, double eps) {
    ln_job j = ln_job_of(x, w, mean, rstd);
    j.b = data_or_null(b);
    j.y = ct__data(y);
    j.eps = eps;
    if (j.rows > 0)
        ct_parallel_for(0, j.rows, CT__GRAIN_ELEMENTWISE / j.d,
                        x->dtype == CT_FLOAT64 ? ln_forward_f64 : ln_forward_f32, &j);
    return 0;
}

/* No weight is a weight of ones, which keeps the loops free of branches. */
static void *ones_of(ct_dtype dtype, int64_t d) {
    size_t es = ct_dtype_size(dtype);
    char *w = malloc(es * (size_t)(d ? d : 1));
    for (int64_t k = 0; w && k < d; k++)
        ct__tensor_store_double(dtype, w + k * (int64_t)es, 1);
    return w;
}

int ct__cpu_layer_norm_backward(ct_tensor *dx, ct_tensor *dw, ct_tensor *db, ct_tensor *dy,
                                ct_tensor *x, ct_tensor *w, ct_tensor *mean, ct_tensor *rstd) {
    ln_job j = ln_job_of(x, w, mean, rstd);
    j.dy = ct__data(dy);
    j.dx = data_or_null(dx);
    j.dw = data_or_null(dw);
    j.db = data_or_null(db);
    if (j.d == 0)
        return 0;
    void *ones = w ? NULL : ones_of(x->dtype, j.d);
    if (!w && !(j.w = ones))
        return ct__err_set(CT_ENOMEM, "layer_norm: out of memory for a weight of %lld ones",
                           (long long)j.d);
    int64_t by_size = (CT__GRAIN_REDUCE + j.d - 1) / j.d;
    int64_t by_count = (j.rows + LN_MAX_CHUNKS - 1) / LN_MAX_CHUNKS;
    j.chunk = by_size > by_count ? by_size : by_count;
    /* With no rows, one empty chunk still zeroes dweight and dbias. */
    int64_t nchunks = j.rows ? (j.rows + j.chunk - 1) / j.chunk : 1;
    if (dw || db) {
        j.part = malloc(sizeof(double) * LN_PART * (size_t)(j.d * nchunks));
        if (!j.part) {
            free(ones);
            return ct__err_set(CT_ENOMEM, "layer_norm: out of memory for %lld partial sums",
                               (long long)(LN_PART * j.d * nchunks));
        }
    }
    bool f64 = x->dtype == CT_FLOAT64;
    ct_parallel_for(0, nchunks, 1, f64 ? ln_backward_f64 : ln_backward_f32, &j);
    if (j.part) {
        (f64 ? ln_combine_f64 : ln_combine_f32)(&j, nchunks);
        free(j.part);
    }
    free(ones);
    return 0;
}
