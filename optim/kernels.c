/* The fused update loops: one pass per range reads the gradient, updates the
 * state buffers and writes the parameter, each element on its own.
 *
 * Each rule is written once as an always-inline body whose flags are
 * compile-time constants at every call, so every variant is a branch-free
 * loop that gcc vectorises (check with -fopt-info-vec-optimized on this
 * file). The rules themselves are rules.h's, which the CUDA kernel shares.
 * This file is built without FP contraction (CMakeLists.txt): a vector loop
 * and its scalar remainder could otherwise fuse different multiply-adds,
 * and where a range is cut would change the bits. */
#include "optim_impl.h"
#include "rules.h"

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
        if (h->kind == CT_OPTIM_ADAMW)                                                             \
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

void ct__optim_update(const ct__optim_hyper *h, ct_dtype dtype, char *p, const char *g,
                      char *const *bufs, int64_t n) {
    CT_ASSERT(dtype == CT_FLOAT32 || dtype == CT_FLOAT64);
    if (dtype == CT_FLOAT32) {
        float *b[CT__OPTIM_MAX_BUFS] = {(float *)bufs[0], (float *)bufs[1], (float *)bufs[2]};
        if (h->kind == CT_OPTIM_SGD)
            sgd_f32(h, (float *)p, (const float *)g, b[0], n);
        else
            adam_f32(h, (float *)p, (const float *)g, b, n);
    } else {
        double *b[CT__OPTIM_MAX_BUFS] = {(double *)bufs[0], (double *)bufs[1], (double *)bufs[2]};
        if (h->kind == CT_OPTIM_SGD)
            sgd_f64(h, (double *)p, (const double *)g, b[0], n);
        else
            adam_f64(h, (double *)p, (const double *)g, b, n);
    }
}
