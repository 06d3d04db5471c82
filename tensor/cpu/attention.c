/* Scaled dot-product attention on the CPU (the table's attention entry,
 * device_impl.h), for the front end in nn/attention.c.
 *
 * Each (batch, head) pair is a unit: one task of the pool, computed by
 * one thread from start to end, so results do not depend on the thread
 * count. A unit goes through its query rows a block of ATT_ROWS at a time:
 *   forward   S = scale Q K^T (one GEMM, the scale as alpha), each row
 *             softmaxed in place, dropped out, then O = P V (one GEMM);
 *   backward  dP = dO V^T, dV += P^T dO, dS = P (dP - rowsum(dP P)) scale,
 *             dQ = dS K, dK += dS^T Q (four GEMMs and one pass per row).
 * A causal block of rows [r0, r1) reads keys [0, r1) only, so about half of
 * the key blocks are never computed; within the block, the scores a row
 * cannot see are computed by the GEMM but overwritten with 0 before use.
 *
 * The dropout mask is drawn again in backward from the counters the
 * forward reserved: element e of the [units, Tq, Tk] weights is kept where
 * word e % 4 of Philox block e / 4 gives a 24-bit uniform below 1 - p,
 * which is what ct_rand(float32) draws (tensor/philox.h). */
#include "cpu_impl.h"
#include "philox.h"
#include "reduce_impl.h"
#include "vexp.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Query rows per block: large enough for GEMM to run near its peak, small
 * enough that a causal unit skips most of its masked keys. */
#define ATT_ROWS 64

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Keys row i can see. */
static int64_t visible(const ct__attention *j, int64_t i) {
    return j->causal ? min64(i + 1, j->s.tk) : j->s.tk;
}

static char *unit_of(const ct__attention *j, int which, int64_t u) {
    int64_t off = 0, rem = u;
    for (int d = j->s.nbatch - 1; d >= 0; d--) {
        off += rem % j->s.batch[d] * j->m[which].bstrides[d];
        rem /= j->s.batch[d];
    }
    return j->m[which].data + off * (j->dbl ? 8 : 4);
}

/* C = alpha op(A) op(B) + beta C, row-major; beta is 0 or 1. A sum over
 * nothing (k == 0) leaves C, or zeroes it when beta is 0. */
static void gemm(bool dbl, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                 const void *a, int64_t lda, const void *b, int64_t ldb, double beta, void *c,
                 int64_t ldc) {
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0) {
        for (int64_t i = 0; i < m && beta == 0; i++)
            memset((char *)c + i * ldc * (dbl ? 8 : 4), 0, (size_t)n * (dbl ? 8 : 4));
        return;
    }
    CBLAS_TRANSPOSE oa = ta ? CblasTrans : CblasNoTrans, ob = tb ? CblasTrans : CblasNoTrans;
    if (dbl)
        cblas_dgemm(CblasRowMajor, oa, ob, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                    (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
    else
        ct__cpu_sgemm(ta, tb, m, n, k, (float)alpha, a, lda, b, ldb, (float)beta, c, ldc);
}

/* keep[c] for the n weights of row `row` (counted over all units' rows)
 * from column 0: 1 where the draw keeps the weight. */
static void draw_keep(const ct__attention *j, int64_t row, int64_t n, uint8_t *keep) {
    uint64_t e = (uint64_t)row * (uint64_t)j->s.tk, end = e + (uint64_t)n;
    double keep_p = 1 - j->p;
    while (e < end) {
        uint32_t w[4];
        ct__philox_block(j->seed, j->offset, e / 4, w);
        for (uint64_t i = e % 4; i < 4 && e < end; i++, e++)
            *keep++ = (double)(w[i] >> 8) * 0x1p-24 < keep_p;
    }
}

/* The kernels, for T = float (S f32) and double (S f64). */
#define CT__ATT_KERNELS(S, T, EXP)                                                                 \
    /* Softmax of x[0..n) in place. */                                                             \
    static void softmax_row_##S(T *x, int64_t n) {                                                 \
        if (n == 0)                                                                                \
            return;                                                                                \
        T m = ct__red_max_##S(x, n);                                                               \
        for (int64_t c = 0; c < n; c++)                                                            \
            x[c] = EXP(x[c] - m);                                                                  \
        T inv = (T)(1 / ct__red_sum_##S(x, n));                                                    \
        for (int64_t c = 0; c < n; c++)                                                            \
            x[c] *= inv;                                                                           \
    }                                                                                              \
                                                                                                   \
    /* dst[c] = src[c] / (1 - p) where kept, else 0. */                                            \
    static void drop_row_##S(T *dst, const T *src, const uint8_t *keep, int64_t n, T scale) {      \
        for (int64_t c = 0; c < n; c++)                                                            \
            dst[c] = keep[c] ? src[c] * scale : 0;                                                 \
    }                                                                                              \
                                                                                                   \
    static void forward_unit_##S(const ct__attention *j, int64_t u, T *drop, uint8_t *keep) {      \
        const ct__att_dims *s = &j->s;                                                             \
        const T *q = (const T *)unit_of(j, CT__ATT_Q, u),                                          \
                *k = (const T *)unit_of(j, CT__ATT_K, u);                                          \
        const T *v = (const T *)unit_of(j, CT__ATT_V, u);                                          \
        T *probs = (T *)j->probs + u * s->tq * s->tk, *out = (T *)unit_of(j, CT__ATT_OUT, u);      \
        int64_t lout = j->m[CT__ATT_OUT].ld;                                                       \
        T drop_scale = j->p < 1 ? (T)(1 / (1 - j->p)) : 0;                                         \
        for (int64_t r0 = 0; r0 < s->tq; r0 += ATT_ROWS) {                                         \
            int64_t rows = min64(ATT_ROWS, s->tq - r0), nk = visible(j, r0 + rows - 1);            \
            T *pb = probs + r0 * s->tk;                                                            \
            gemm(j->dbl, false, true, rows, nk, s->d, j->scale, q + r0 * j->m[CT__ATT_Q].ld,       \
                 j->m[CT__ATT_Q].ld, k, j->m[CT__ATT_K].ld, 0, pb, s->tk);                         \
            const T *weights = pb;                                                                 \
            for (int64_t i = 0; i < rows; i++) {                                                   \
                T *row = pb + i * s->tk;                                                           \
                int64_t n = visible(j, r0 + i);                                                    \
                softmax_row_##S(row, n);                                                           \
                memset(row + n, 0, sizeof(T) * (size_t)(s->tk - n));                               \
                if (j->p > 0) {                                                                    \
                    draw_keep(j, u * s->tq + r0 + i, n, keep);                                     \
                    drop_row_##S(drop + i * s->tk, row, keep, n, drop_scale);                      \
                    memset(drop + i * s->tk + n, 0, sizeof(T) * (size_t)(nk - n));                 \
                    weights = drop;                                                                \
                }                                                                                  \
            }                                                                                      \
            gemm(j->dbl, false, false, rows, s->dv, nk, 1, weights, s->tk, v, j->m[CT__ATT_V].ld,  \
                 0, out + r0 * lout, lout);                                                        \
        }                                                                                          \
    }                                                                                              \
                                                                                                   \
    /* sum of a[c] b[c] in 8 lanes (vectorised; a fixed order) folded into                         \
     * double. */                                                                                  \
    static double dot_##S(const T *a, const T *b, int64_t n) {                                     \
        T lane[8] = {0};                                                                           \
        int64_t c = 0;                                                                             \
        for (; c + 8 <= n; c += 8)                                                                 \
            for (int l = 0; l < 8; l++)                                                            \
                lane[l] += a[c + l] * b[c + l];                                                    \
        double dot = 0;                                                                            \
        for (int l = 0; l < 8; l++)                                                                \
            dot += lane[l];                                                                        \
        for (; c < n; c++)                                                                         \
            dot += (double)a[c] * (double)b[c];                                                    \
        return dot;                                                                                \
    }                                                                                              \
                                                                                                   \
    /* dS = P (dP' - rowsum(dP' P)) scale in place over dp's first n, with                         \
     * dP' the gradient of the dropped weights taken back through the mask;                        \
     * zeros up to nk. */                                                                          \
    static void softmax_grad_row_##S(const ct__attention *j, T *dp, const T *p,                    \
                                     const uint8_t *keep, int64_t n, int64_t nk) {                 \
        if (j->p > 0)                                                                              \
            drop_row_##S(dp, dp, keep, n, j->p < 1 ? (T)(1 / (1 - j->p)) : 0);                     \
        T sc = (T)j->scale, tdot = (T)dot_##S(dp, p, n);                                           \
        for (int64_t c = 0; c < n; c++)                                                            \
            dp[c] = p[c] * (dp[c] - tdot) * sc;                                                    \
        memset(dp + n, 0, sizeof(T) * (size_t)(nk - n));                                           \
    }                                                                                              \
                                                                                                   \
    static void backward_unit_##S(const ct__attention *j, int64_t u, T *dp, T *drop,               \
                                  uint8_t *keep) {                                                 \
        const ct__att_dims *s = &j->s;                                                             \
        const T *q = (const T *)unit_of(j, CT__ATT_Q, u),                                          \
                *k = (const T *)unit_of(j, CT__ATT_K, u);                                          \
        const T *v = (const T *)unit_of(j, CT__ATT_V, u),                                          \
                *go = (const T *)unit_of(j, CT__ATT_GO, u);                                        \
        const T *probs = (const T *)j->probs + u * s->tq * s->tk;                                  \
        T *gq = (T *)unit_of(j, CT__ATT_GQ, u), *gk = (T *)unit_of(j, CT__ATT_GK, u);              \
        T *gv = (T *)unit_of(j, CT__ATT_GV, u);                                                    \
        int64_t lq = j->m[CT__ATT_Q].ld, lk = j->m[CT__ATT_K].ld, lv = j->m[CT__ATT_V].ld;         \
        int64_t lo = j->m[CT__ATT_GO].ld, lgq = j->m[CT__ATT_GQ].ld, lgk = j->m[CT__ATT_GK].ld;    \
        int64_t lgv = j->m[CT__ATT_GV].ld;                                                         \
        T drop_scale = j->p < 1 ? (T)(1 / (1 - j->p)) : 0;                                         \
        for (int64_t r = 0; r < s->tk; r++) {                                                      \
            memset(gk + r * lgk, 0, sizeof(T) * (size_t)s->d);                                     \
            memset(gv + r * lgv, 0, sizeof(T) * (size_t)s->dv);                                    \
        }                                                                                          \
        for (int64_t r0 = 0; r0 < s->tq; r0 += ATT_ROWS) {                                         \
            int64_t rows = min64(ATT_ROWS, s->tq - r0), nk = visible(j, r0 + rows - 1);            \
            const T *pb = probs + r0 * s->tk, *weights = pb;                                       \
            gemm(j->dbl, false, true, rows, nk, s->dv, 1, go + r0 * lo, lo, v, lv, 0, dp, s->tk);  \
            if (j->p > 0) {                                                                        \
                for (int64_t i = 0; i < rows; i++) {                                               \
                    draw_keep(j, u * s->tq + r0 + i, nk, keep + i * s->tk);                        \
                    drop_row_##S(drop + i * s->tk, pb + i * s->tk, keep + i * s->tk, nk,           \
                                 drop_scale);                                                      \
                }                                                                                  \
                weights = drop;                                                                    \
            }                                                                                      \
            gemm(j->dbl, true, false, nk, s->dv, rows, 1, weights, s->tk, go + r0 * lo, lo, 1, gv, \
                 lgv);                                                                             \
            for (int64_t i = 0; i < rows; i++)                                                     \
                softmax_grad_row_##S(j, dp + i * s->tk, pb + i * s->tk, keep + i * s->tk,          \
                                     visible(j, r0 + i), nk);                                      \
            gemm(j->dbl, false, false, rows, s->d, nk, 1, dp, s->tk, k, lk, 0, gq + r0 * lgq,      \
                 lgq);                                                                             \
            gemm(j->dbl, true, false, nk, s->d, rows, 1, dp, s->tk, q + r0 * lq, lq, 1, gk, lgk);  \
        }                                                                                          \
    }

CT__ATT_KERNELS(f32, float, ct__vexpf)
CT__ATT_KERNELS(f64, double, exp)

/* Scratch for a run of units: backward's dP block, the dropped weights
 * when there is dropout, and the mask (which backward always passes on).
 * A unit without it sets *no_memory. */
static void *scratch_new(const ct__attention *j, atomic_bool *no_memory, void **drop,
                         uint8_t **keep) {
    size_t block = (size_t)ATT_ROWS * (size_t)j->s.tk, es = j->dbl ? 8 : 4;
    size_t ndp = j->backward ? block * es : 0, ndrop = j->p > 0 ? block * es : 0;
    size_t nkeep = j->backward || j->p > 0 ? block : 0;
    char *base = malloc(ndp + ndrop + nkeep + 1);
    if (!base) {
        atomic_store(no_memory, true);
        return NULL;
    }
    *drop = ndrop ? base + ndp : NULL;
    *keep = nkeep ? (uint8_t *)base + ndp + ndrop : NULL;
    return base;
}

typedef struct units_job {
    const ct__attention *a;
    atomic_bool no_memory; /* a unit's scratch could not be allocated */
} units_job;

/* Units [lo, hi) of the pass the job describes. */
static void units_range(void *ctx, int64_t lo, int64_t hi) {
    units_job *uj = ctx;
    const ct__attention *j = uj->a;
    void *drop;
    uint8_t *keep;
    void *base = scratch_new(j, &uj->no_memory, &drop, &keep);
    for (int64_t u = lo; u < hi && base; u++) {
        if (j->backward && j->dbl)
            backward_unit_f64(j, u, base, drop, keep);
        else if (j->backward)
            backward_unit_f32(j, u, base, drop, keep);
        else if (j->dbl)
            forward_unit_f64(j, u, drop, keep);
        else
            forward_unit_f32(j, u, drop, keep);
    }
    free(base);
}

int ct__cpu_attention(const ct__attention *a) {
    units_job uj = {a, false};
    ct_parallel_for(0, a->s.units, 1, units_range, &uj);
    if (atomic_load(&uj.no_memory))
        return ct__err_set(CT_ENOMEM, "scaled_dot_product_attention: %sout of memory",
                           a->backward ? "backward: " : "");
    return 0;
}
