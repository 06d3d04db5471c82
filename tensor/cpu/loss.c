/* Cross-entropy on the CPU (the table's cross_entropy and
 * cross_entropy_backward, device_impl.h): one pass per row of logits, in
 * float32 or float64, for the front end in nn/loss.c. */
#include "cpu_impl.h"

#include <math.h>
#include <string.h>

typedef struct ce_job {
    const void *x;        /* [n, c] contiguous */
    const int64_t *t;     /* [n] */
    void *lse;            /* [2, n], x's dtype: row maxima, then log sum exp(x - max) */
    double *loss;         /* [n]: forward */
    void *grad;           /* [n, c]: backward */
    const void *scale;    /* backward: one value (stride 0) or one per row, x's dtype */
    int64_t scale_stride; /* 0 or 1 */
    int64_t n, c, ignore;
    double smoothing;
    bool dbl;
} ce_job;

/* One body for float and double rows. */
#define CE_ROWS(T, EXP, LOG)                                                                       \
    static void ce_forward_##T(const ce_job *j, int64_t lo, int64_t hi) {                          \
        const T *x = j->x;                                                                         \
        T *lse = j->lse;                                                                           \
        double on = 1 - j->smoothing, off = j->smoothing / (double)j->c;                           \
        for (int64_t i = lo; i < hi; i++) {                                                        \
            const T *r = x + i * j->c;                                                             \
            T m = r[0];                                                                            \
            for (int64_t k = 1; k < j->c; k++)                                                     \
                m = r[k] > m ? r[k] : m;                                                           \
            T s = 0, dev = 0;                                                                      \
            for (int64_t k = 0; k < j->c; k++) {                                                   \
                T d = r[k] - m;                                                                    \
                s += EXP(d);                                                                       \
                dev += d;                                                                          \
            }                                                                                      \
            T ls = LOG(s);                                                                         \
            lse[i] = m;                                                                            \
            lse[j->n + i] = ls;                                                                    \
            int64_t t = j->t[i];                                                                   \
            /* (1 - e) * -log_softmax(x)[t] + e * mean(-log_softmax(x)), with                      \
             * -log_softmax(x) = (m - x) + ls, is ls + on * (m - x[t]) - off * dev:                \
             * ls never meets a value of x's size, whose spacing it would be                       \
             * rounded to. No smoothing needs no dev (a -inf logit's). */                          \
            double smooth = off > 0 ? off * (double)dev : 0;                                       \
            j->loss[i] =                                                                           \
                t == j->ignore ? 0 : (double)ls + on * ((double)m - (double)r[t]) - smooth;        \
        }                                                                                          \
    }                                                                                              \
    static void ce_backward_##T(const ce_job *j, int64_t lo, int64_t hi) {                         \
        const T *x = j->x, *lse = j->lse, *scale = j->scale;                                       \
        T *g = j->grad;                                                                            \
        T on = (T)(1 - j->smoothing), off = (T)(j->smoothing / (double)j->c);                      \
        for (int64_t i = lo; i < hi; i++) {                                                        \
            const T *r = x + i * j->c;                                                             \
            T *out = g + i * j->c;                                                                 \
            int64_t t = j->t[i];                                                                   \
            T s = scale[i * j->scale_stride];                                                      \
            if (t == j->ignore) {                                                                  \
                memset(out, 0, sizeof(T) * (size_t)j->c);                                          \
                continue;                                                                          \
            }                                                                                      \
            for (int64_t k = 0; k < j->c; k++)                                                     \
                out[k] = (EXP((r[k] - lse[i]) - lse[j->n + i]) - off) * s;                         \
            out[t] -= on * s;                                                                      \
        }                                                                                          \
    }
CE_ROWS(float, expf, logf)
CE_ROWS(double, exp, log)
#undef CE_ROWS

static void ce_forward_range(void *ctx, int64_t lo, int64_t hi) {
    const ce_job *j = ctx;
    if (j->dbl)
        ce_forward_double(j, lo, hi);
    else
        ce_forward_float(j, lo, hi);
}

static void ce_backward_range(void *ctx, int64_t lo, int64_t hi) {
    const ce_job *j = ctx;
    if (j->dbl)
        ce_backward_double(j, lo, hi);
    else
        ce_backward_float(j, lo, hi);
}

static int64_t ce_grain(int64_t c) { return c >= 4096 ? 1 : 4096 / c; }

/* The operands the forward and the backward share. */
static ce_job ce_job_of(ct_tensor *x, ct_tensor *t, ct_tensor *lse, int64_t ignore,
                        double smoothing) {
    return (ce_job){.x = ct__data(x),
                    .t = (const int64_t *)ct__data(t),
                    .lse = ct__data(lse),
                    .n = x->sizes[0],
                    .c = x->sizes[1],
                    .ignore = ignore,
                    .smoothing = smoothing,
                    .dbl = x->dtype == CT_FLOAT64};
}

int ct__cpu_cross_entropy(ct_tensor *loss, ct_tensor *lse, ct_tensor *x, ct_tensor *t,
                          int64_t ignore, double smoothing) {
    ce_job j = ce_job_of(x, t, lse, ignore, smoothing);
    j.loss = (double *)ct__data(loss);
    ct_parallel_for(0, j.n, ce_grain(j.c), ce_forward_range, &j);
    return 0;
}

int ct__cpu_cross_entropy_backward(ct_tensor *grad, ct_tensor *x, ct_tensor *t, ct_tensor *lse,
                                   ct_tensor *scale, int64_t ignore, double smoothing) {
    ce_job j = ce_job_of(x, t, lse, ignore, smoothing);
    j.grad = ct__data(grad);
    j.scale = ct__data(scale);
    j.scale_stride = scale->ndim > 0 ? 1 : 0;
    ct_parallel_for(0, j.n, ce_grain(j.c), ce_backward_range, &j);
    return 0;
}
