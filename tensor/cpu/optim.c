/* The optimizers' fused update on the CPU (the table's optim_step,
 * device_impl.h): one pass per range reads the gradient, updates the
 * state buffers and writes the parameter, each element on its own.
 *
 * Each rule is written once as an always-inline body whose flags are
 * compile-time constants at every call, so every variant is a branch-free
 * loop that gcc vectorises (check with -fopt-info-vec-optimized on this
 * file). The rules themselves are optim_rules.h's, which the CUDA kernel
 * shares.
 * This file is built without FP contraction (CMakeLists.txt): a vector loop
 * and its scalar remainder could otherwise fuse different multiply-adds,
 * and where a range is cut would change the bits. */
#include "cpu_impl.h"

#include <math.h>

#define INLINE static inline __attribute__((always_inline))

/* mode: as CT__SGD_RULE's. */
#define DEFINE_SGD(T, sfx)                                                                         \
    INLINE void sgd_body_##sfx(const ct__optim_hyper *h, T *restrict p, const T *restrict g,       \
                               T *restrict buf, int64_t n, bool wd, int mode, bool nesterov) {     \
        const T lr = (T)h->lr, decay = (T)h->weight_decay, mom = (T)h->momentum;                   \
        const T damp = (T)(1 - h->dampening);                                                      \
        for (int64_t i = 0; i < n; i++) {                                                          \
            T x = p[i], d = g[i], b = mode == 2 ? buf[i] : 0;                                      \
            CT__SGD_RULE(T, x, d, b, lr, decay, mom, damp, wd, mode, nesterov);                    \
            if (mode != 0)                                                                         \
                buf[i] = b;                                                                        \
            p[i] = x;                                                                              \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    INLINE void sgd_mode_##sfx(const ct__optim_hyper *h, T *p, const T *g, T *buf, int64_t n,      \
                               bool wd) {                                                          \
        if (h->momentum == 0)                                                                      \
            sgd_body_##sfx(h, p, g, buf, n, wd, 0, false);                                         \
        else if (h->first && h->nesterov)                                                          \
            sgd_body_##sfx(h, p, g, buf, n, wd, 1, true);                                          \
        else if (h->first)                                                                         \
            sgd_body_##sfx(h, p, g, buf, n, wd, 1, false);                                         \
        else if (h->nesterov)                                                                      \
            sgd_body_##sfx(h, p, g, buf, n, wd, 2, true);                                          \
        else                                                                                       \
            sgd_body_##sfx(h, p, g, buf, n, wd, 2, false);                                         \
    }                                                                                              \
                                                                                                   \
    static void sgd_##sfx(const ct__optim_hyper *h, T *p, const T *g, T *buf, int64_t n) {         \
        if (h->weight_decay != 0)                                                                  \
            sgd_mode_##sfx(h, p, g, buf, n, true);                                                 \
        else                                                                                       \
            sgd_mode_##sfx(h, p, g, buf, n, false);                                                \
    }

/* decoupled: AdamW's p *= 1 - lr * wd; wd: Adam's L2 term in the gradient. */
#define DEFINE_ADAM(T, sfx, SQRT)                                                                  \
    INLINE void adam_body_##sfx(const ct__optim_hyper *h, T *restrict p, const T *restrict g,      \
                                T *restrict m, T *restrict v, T *restrict vmax, int64_t n,         \
                                bool decoupled, bool wd, bool amsgrad) {                           \
        const T b1 = (T)h->beta1, b2 = (T)h->beta2, c1 = (T)(1 - h->beta1);                        \
        const T c2 = (T)(1 - h->beta2), eps = (T)h->eps, decay = (T)h->decay;                      \
        const T l2 = (T)h->weight_decay, bc2 = (T)h->bc2_sqrt, step = (T)h->step_size;             \
        for (int64_t i = 0; i < n; i++) {                                                          \
            T x = p[i], d = g[i], mi = m[i], vi = v[i], vm = amsgrad ? vmax[i] : 0;                \
            CT__ADAM_RULE(T, SQRT, x, d, mi, vi, vm, b1, c1, b2, c2, eps, decay, l2, bc2, step,    \
                          decoupled, wd, amsgrad);                                                 \
            m[i] = mi;                                                                             \
            v[i] = vi;                                                                             \
            if (amsgrad)                                                                           \
                vmax[i] = vm;                                                                      \
            p[i] = x;                                                                              \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    INLINE void adam_ams_##sfx(const ct__optim_hyper *h, T *p, const T *g, T *const *b, int64_t n, \
                               bool decoupled, bool wd) {                                          \
        if (h->amsgrad)                                                                            \
            adam_body_##sfx(h, p, g, b[0], b[1], b[2], n, decoupled, wd, true);                    \
        else                                                                                       \
            adam_body_##sfx(h, p, g, b[0], b[1], NULL, n, decoupled, wd, false);                   \
    }                                                                                              \
                                                                                                   \
    static void adam_##sfx(const ct__optim_hyper *h, T *p, const T *g, T *const *b, int64_t n) {   \
        if (h->kind == CT__OPTIM_ADAMW)                                                            \
            adam_ams_##sfx(h, p, g, b, n, true, false);                                            \
        else if (h->weight_decay != 0)                                                             \
            adam_ams_##sfx(h, p, g, b, n, false, true);                                            \
        else                                                                                       \
            adam_ams_##sfx(h, p, g, b, n, false, false);                                           \
    }

DEFINE_SGD(float, f32)
DEFINE_SGD(double, f64)
DEFINE_ADAM(float, f32, sqrtf)
DEFINE_ADAM(double, f64, sqrt)

/* Below this many elements a step runs on the calling thread. An Adam
 * update moves 20-28 bytes per element, so this is a few hundred KB. */
#define STEP_GRAIN 16384

/* Applies one update to n elements of dtype: p, g and bufs point at
 * element 0 of contiguous runs. */
static void update(const ct__optim_hyper *h, ct_dtype dtype, char *p, const char *g,
                   char *const *bufs, int64_t n) {
    if (dtype == CT_FLOAT32) {
        float *b[CT__OPTIM_MAX_BUFS] = {(float *)bufs[0], (float *)bufs[1], (float *)bufs[2]};
        if (h->kind == CT__OPTIM_SGD)
            sgd_f32(h, (float *)p, (const float *)g, b[0], n);
        else
            adam_f32(h, (float *)p, (const float *)g, b, n);
    } else {
        double *b[CT__OPTIM_MAX_BUFS] = {(double *)bufs[0], (double *)bufs[1], (double *)bufs[2]};
        if (h->kind == CT__OPTIM_SGD)
            sgd_f64(h, (double *)p, (const double *)g, b[0], n);
        else
            adam_f64(h, (double *)p, (const double *)g, b, n);
    }
}

/* The segments' elements in [lo, hi) of the step's iteration space. */
static void step_range(void *ctx, int64_t lo, int64_t hi) {
    const ct__optim_step *st = ctx;
    size_t es = ct_dtype_size(st->dtype);
    int a = 0, b = st->nsegs;
    while (b - a > 1) {
        int mid = a + (b - a) / 2;
        if (st->segs[mid].start <= lo)
            a = mid;
        else
            b = mid;
    }
    for (int k = a; lo < hi; k++) {
        const ct__optim_segment *s = &st->segs[k];
        int64_t from = lo - s->start, to = hi - s->start < s->n ? hi - s->start : s->n;
        char *bufs[CT__OPTIM_MAX_BUFS];
        for (int j = 0; j < CT__OPTIM_MAX_BUFS; j++)
            bufs[j] = st->bufs[j] ? st->bufs[j] + (size_t)(s->offset + from) * es : NULL;
        update(&s->h, st->dtype, s->p + (size_t)from * es, s->g + (size_t)from * es, bufs,
               to - from);
        lo = s->start + to;
    }
}

/* The segments laid end to end are one iteration space, which one
 * parallel_for covers, so that small parameters do not each pay for a trip
 * to the pool. */
int ct__cpu_optim_step(const ct__optim_step *s, int index) {
    (void)index;
    CT_ASSERT(s->dtype == CT_FLOAT32 || s->dtype == CT_FLOAT64);
    if (s->total > 0)
        ct_parallel_for(0, s->total, STEP_GRAIN, step_range, (void *)s);
    return 0;
}
