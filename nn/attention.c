/* Scaled dot-product attention as one op with its own backward.
 *
 * CPU. Each (batch, head) pair is a unit: one task of the pool, computed by
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
 * The softmax P is saved for backward; the dropout mask is not, since
 * drawing it again costs less than keeping it: element e of the [units, Tq,
 * Tk] weights is kept where word e % 4 of Philox block e / 4, from the
 * counters the forward reserved, gives a 24-bit uniform below 1 - p, which
 * is what ct_rand(float32) draws (tensor/philox.h).
 *
 * Operands reach BLAS without copies when their last dim has unit stride, so
 * the heads of a fused qkv projection (a [B, T, 3, H, D] view) are read in
 * place. Other layouts are copied once. */
#include "cpu/reduce_impl.h"
#include "cpu/vexp.h"
#include "nn_impl.h"
#include "philox.h"

#include <ct/cuda.h>

#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Query rows per block: large enough for GEMM to run near its peak, small
 * enough that a causal unit skips most of its masked keys. */
#define ATT_ROWS 64

/* The matrices a unit reads and writes: q, k, v and the output's gradient
 * in, the output and the gradients of q, k and v out. */
enum { ATT_Q, ATT_K, ATT_V, ATT_GO, ATT_OUT, ATT_GQ, ATT_GK, ATT_GV, ATT_NMATS };

/* One matrix: its data, row stride (BLAS's leading dim) and batch strides
 * over the broadcast batch shape (0 where it broadcasts), in elements. */
typedef struct att_mat {
    char *data;
    int64_t ld;
    int64_t bstrides[CT_MAX_DIMS];
} att_mat;

typedef struct att_dims {
    int nbatch;
    int64_t batch[CT_MAX_DIMS];
    int64_t units, tq, tk, d, dv;
} att_dims;

typedef struct att_job {
    att_dims s;
    att_mat m[ATT_NMATS];
    bool dbl, causal, backward;
    double scale, p;
    uint64_t seed, offset;
    char *probs;           /* [units, tq, tk]: written by forward */
    atomic_bool no_memory; /* a unit's scratch could not be allocated */
} att_job;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Keys row i can see. */
static int64_t visible(const att_job *j, int64_t i) {
    return j->causal ? min64(i + 1, j->s.tk) : j->s.tk;
}

static char *unit_of(const att_job *j, int which, int64_t u) {
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
        ct__sgemm(ta, tb, m, n, k, (float)alpha, a, lda, b, ldb, (float)beta, c, ldc);
}

/* keep[c] for the n weights of row `row` (counted over all units' rows)
 * from column 0: 1 where the draw keeps the weight. */
static void draw_keep(const att_job *j, int64_t row, int64_t n, uint8_t *keep) {
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
#define ATT_KERNELS(S, T, EXP)                                                                     \
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
    static void forward_unit_##S(const att_job *j, int64_t u, T *drop, uint8_t *keep) {            \
        const att_dims *s = &j->s;                                                                 \
        const T *q = (const T *)unit_of(j, ATT_Q, u), *k = (const T *)unit_of(j, ATT_K, u);        \
        const T *v = (const T *)unit_of(j, ATT_V, u);                                              \
        T *probs = (T *)j->probs + u * s->tq * s->tk, *out = (T *)unit_of(j, ATT_OUT, u);          \
        int64_t lout = j->m[ATT_OUT].ld;                                                           \
        T drop_scale = j->p < 1 ? (T)(1 / (1 - j->p)) : 0;                                         \
        for (int64_t r0 = 0; r0 < s->tq; r0 += ATT_ROWS) {                                         \
            int64_t rows = min64(ATT_ROWS, s->tq - r0), nk = visible(j, r0 + rows - 1);            \
            T *pb = probs + r0 * s->tk;                                                            \
            gemm(j->dbl, false, true, rows, nk, s->d, j->scale, q + r0 * j->m[ATT_Q].ld,           \
                 j->m[ATT_Q].ld, k, j->m[ATT_K].ld, 0, pb, s->tk);                                 \
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
            gemm(j->dbl, false, false, rows, s->dv, nk, 1, weights, s->tk, v, j->m[ATT_V].ld, 0,   \
                 out + r0 * lout, lout);                                                           \
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
    static void softmax_grad_row_##S(const att_job *j, T *dp, const T *p, const uint8_t *keep,     \
                                     int64_t n, int64_t nk) {                                      \
        if (j->p > 0)                                                                              \
            drop_row_##S(dp, dp, keep, n, j->p < 1 ? (T)(1 / (1 - j->p)) : 0);                     \
        T sc = (T)j->scale, tdot = (T)dot_##S(dp, p, n);                                           \
        for (int64_t c = 0; c < n; c++)                                                            \
            dp[c] = p[c] * (dp[c] - tdot) * sc;                                                    \
        memset(dp + n, 0, sizeof(T) * (size_t)(nk - n));                                           \
    }                                                                                              \
                                                                                                   \
    static void backward_unit_##S(const att_job *j, int64_t u, T *dp, T *drop, uint8_t *keep) {    \
        const att_dims *s = &j->s;                                                                 \
        const T *q = (const T *)unit_of(j, ATT_Q, u), *k = (const T *)unit_of(j, ATT_K, u);        \
        const T *v = (const T *)unit_of(j, ATT_V, u), *go = (const T *)unit_of(j, ATT_GO, u);      \
        const T *probs = (const T *)j->probs + u * s->tq * s->tk;                                  \
        T *gq = (T *)unit_of(j, ATT_GQ, u), *gk = (T *)unit_of(j, ATT_GK, u);                      \
        T *gv = (T *)unit_of(j, ATT_GV, u);                                                        \
        int64_t lq = j->m[ATT_Q].ld, lk = j->m[ATT_K].ld, lv = j->m[ATT_V].ld;                     \
        int64_t lo = j->m[ATT_GO].ld, lgq = j->m[ATT_GQ].ld, lgk = j->m[ATT_GK].ld;                \
        int64_t lgv = j->m[ATT_GV].ld;                                                             \
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

ATT_KERNELS(f32, float, ct__vexpf)
ATT_KERNELS(f64, double, exp)

/* Scratch for a run of units: backward's dP block, the dropped weights
 * when there is dropout, and the mask (which backward always passes on). */
static void *scratch_new(const att_job *j, void **drop, uint8_t **keep) {
    size_t block = (size_t)ATT_ROWS * (size_t)j->s.tk, es = j->dbl ? 8 : 4;
    size_t ndp = j->backward ? block * es : 0, ndrop = j->p > 0 ? block * es : 0;
    size_t nkeep = j->backward || j->p > 0 ? block : 0;
    char *base = malloc(ndp + ndrop + nkeep + 1);
    if (!base) {
        atomic_store(&((att_job *)j)->no_memory, true);
        return NULL;
    }
    *drop = ndrop ? base + ndp : NULL;
    *keep = nkeep ? (uint8_t *)base + ndp + ndrop : NULL;
    return base;
}

/* Units [lo, hi) of the pass j describes. */
static void units_range(void *ctx, int64_t lo, int64_t hi) {
    const att_job *j = ctx;
    void *drop;
    uint8_t *keep;
    void *base = scratch_new(j, &drop, &keep);
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

/* ----------------------------------------------------------- operands */

/* Can BLAS read t ([..., rows, cols]) in place: its last dim with unit
 * stride, and a leading dim >= cols that BLAS's ints hold? */
static bool blas_ready(const ct_tensor *t, int64_t *ld) {
    int nd = t->ndim;
    int64_t rows = t->sizes[nd - 2], cols = t->sizes[nd - 1], min_ld = cols > 1 ? cols : 1;
    *ld = rows > 1 && cols > 0 ? t->strides[nd - 2] : min_ld;
    return (cols <= 1 || t->strides[nd - 1] == 1) && *ld >= min_ld && *ld <= INT32_MAX;
}

/* Points m at t for the batch shape of s; BLAS must be able to read t in
 * place (the kernels write outputs through m, so there is no copying). */
static int point_at(att_mat *m, ct_tensor *t, const att_dims *s) {
    char desc[CT__DESC_STR];
    if (!blas_ready(t, &m->ld))
        return ct__seterr(CT_ENOTSUP, "scaled_dot_product_attention: %s has rows too long for BLAS",
                          ct__desc(desc, t));
    m->data = ct__data(t);
    int tb = t->ndim - 2;
    for (int d = 0; d < s->nbatch; d++) {
        int td = d - (s->nbatch - tb);
        m->bstrides[d] = td < 0 || t->sizes[td] == 1 ? 0 : t->strides[td];
    }
    return 0;
}

/* An input: points m at t, through a contiguous copy (owned by the current
 * scope) when BLAS cannot read t in place. Returns the tensor read, or
 * NULL. */
static ct_tensor *describe(att_mat *m, ct_tensor *t, const att_dims *s) {
    int64_t ld;
    if (t && !blas_ready(t, &ld))
        t = ct_contiguous(t);
    return t && !point_at(m, t, s) ? t : NULL;
}

/* [batch..., rows, cols] of s. */
static ct_tensor *unit_tensor(const att_dims *s, int64_t rows, int64_t cols, ct_dtype dtype) {
    int64_t sizes[CT_MAX_DIMS];
    memcpy(sizes, s->batch, sizeof(int64_t) * (size_t)s->nbatch);
    sizes[s->nbatch] = rows;
    sizes[s->nbatch + 1] = cols;
    return ct__new_on("scaled_dot_product_attention", s->nbatch + 2, sizes, dtype, CT_DEVICE_CPU);
}

/* x [B, T, H D] as heads [B, H, T, D], a view; x must be contiguous. */
static ct_tensor *heads_of(ct_tensor *x, int64_t heads) {
    int64_t b = ct_size(x, 0), t = ct_size(x, 1), c = ct_size(x, 2);
    return ct_transpose(ct_view(x, CT_SHAPE(b, t, heads, c / heads)), 1, 2);
}

/* q, k and v of a contiguous packed projection [B, T, 3 C] as [B, H, T, D]
 * views: the layout a fused qkv linear layer writes. */
static void qkv_heads(ct_tensor *qkv, int64_t heads, ct_tensor *out[3]) {
    int64_t b = ct_size(qkv, 0), t = ct_size(qkv, 1), c = ct_size(qkv, 2) / 3;
    ct_tensor *split = ct_view(qkv, CT_SHAPE(b, t, 3, heads, c / heads));
    for (int i = 0; i < 3; i++)
        out[i] = ct_transpose(ct_select(split, 2, i), 1, 2);
}

/* -------------------------------------------------------------- backward */

typedef struct att_ctx {
    att_dims s;
    bool causal;
    double scale, p;
    uint64_t seed, offset;
    int64_t heads; /* > 0: one packed input (saved: qkv, probs); 0: q, k, v, probs */
} att_ctx;

static int att_backward(const ct_backward_args *a) {
    const att_ctx *c = a->ctx;
    ct_tensor *g = a->grad_outputs[0];
    if (!g)
        return 0;
    if (ct_grad_enabled())
        return ct__seterr(CT_ENOTSUP, "scaled_dot_product_attention: differentiating the backward "
                                      "again (create_graph) is not supported");
    ct_dtype dt = a->saved[0]->dtype;
    ct_tensor *in[3], *grads[3], *packed = NULL, *go = ct_to_dtype(g, dt);
    ct_tensor *probs = a->saved[c->heads ? 1 : 3];
    if (c->heads) {
        qkv_heads(a->saved[0], c->heads, in);
        packed = ct_empty(a->saved[0]->ndim, a->saved[0]->sizes, dt);
        if (packed)
            qkv_heads(packed, c->heads, grads);
        go = go ? heads_of(ct_contiguous(go), c->heads) : NULL;
    } else {
        for (int i = 0; i < 3; i++)
            in[i] = a->saved[i];
        grads[0] = unit_tensor(&c->s, c->s.tq, c->s.d, dt);
        grads[1] = unit_tensor(&c->s, c->s.tk, c->s.d, dt);
        grads[2] = unit_tensor(&c->s, c->s.tk, c->s.dv, dt);
    }
    att_job j = {.s = c->s,
                 .backward = true,
                 .dbl = dt == CT_FLOAT64,
                 .causal = c->causal,
                 .scale = c->scale,
                 .p = c->p,
                 .seed = c->seed,
                 .offset = c->offset,
                 .probs = ct__data(probs)};
    if ((c->heads && !packed) || !describe(&j.m[ATT_GO], go, &c->s))
        return ct_errcode();
    for (int i = 0; i < 3; i++)
        if (!grads[i] || !describe(&j.m[ATT_Q + i], in[i], &c->s) ||
            point_at(&j.m[ATT_GQ + i], grads[i], &c->s))
            return ct_errcode();
    ct_parallel_for(0, c->s.units, 1, units_range, &j);
    if (atomic_load(&j.no_memory))
        return ct__seterr(CT_ENOMEM, "scaled_dot_product_attention: backward: out of memory");
    if (c->heads)
        grads[0] = packed;
    for (int i = 0; i < a->ninputs; i++)
        a->grad_inputs[i] = a->needs_input_grad[i] ? grads[i] : NULL;
    return 0;
}

static const ct_function_def att_def = {"ScaledDotProductAttentionBackward", att_backward, free};

/* --------------------------------------------------------------- forward */

/* The fused forward over q, k and v (views of the packed ins[0] when heads
 * > 0, whose result is then [B, T, C]), recorded with inputs ins. */
static ct_tensor *attention_cpu(ct_tensor *const qkv[3], ct_tensor *const *ins, int nins,
                                const att_dims *s, const ct_attention_options *o, double scale,
                                int64_t heads) {
    att_ctx *c = malloc(sizeof *c);
    if (!c) {
        ct__seterr(CT_ENOMEM, "scaled_dot_product_attention: out of memory");
        return NULL;
    }
    *c = (att_ctx){.s = *s, .causal = o->causal, .scale = scale, .p = o->dropout_p, .heads = heads};
    if (c->p > 0) {
        uint64_t n = (uint64_t)(s->units * s->tq * s->tk);
        ct__generator_claim(o->gen, (n + 3) / 4, &c->seed, &c->offset);
    }
    ct_scope_begin();
    bool prev = ct_set_grad_enabled(false);
    ct_dtype dt = qkv[0]->dtype;
    att_job j = {.s = *s,
                 .dbl = dt == CT_FLOAT64,
                 .causal = c->causal,
                 .scale = scale,
                 .p = c->p,
                 .seed = c->seed,
                 .offset = c->offset};
    ct_tensor *read[3];
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++)
        rc = (read[i] = describe(&j.m[ATT_Q + i], qkv[i], s)) ? 0 : ct_errcode();
    ct_tensor *probs = unit_tensor(s, s->tq, s->tk, dt);
    ct_tensor *out = heads ? ct_empty(CT_SHAPE(s->batch[0], s->tq, heads * s->dv), dt)
                           : unit_tensor(s, s->tq, s->dv, dt);
    if (!rc && (!probs || !out || point_at(&j.m[ATT_OUT], heads ? heads_of(out, heads) : out, s)))
        rc = ct_errcode();
    if (!rc) {
        j.probs = ct__data(probs);
        ct_parallel_for(0, s->units, 1, units_range, &j);
        if (atomic_load(&j.no_memory))
            rc = ct__seterr(CT_ENOMEM, "scaled_dot_product_attention: out of memory");
    }
    ct_set_grad_enabled(prev);
    if (rc)
        free(c);
    else if (heads)
        rc = ct_function_record(&att_def, c, ins, nins, &out, 1, (ct_tensor *[]){ins[0], probs}, 2);
    else
        rc = ct_function_record(&att_def, c, ins, nins, &out, 1,
                                (ct_tensor *[]){read[0], read[1], read[2], probs}, 4);
    if (!rc)
        ct_keep(out);
    ct_scope_end();
    return rc ? NULL : out;
}

/* The same computation as a chain of ops, for CUDA tensors. */
static ct_tensor *attention_ops(ct_tensor *q, ct_tensor *k, ct_tensor *v, const att_dims *s,
                                const ct_attention_options *o, double scale) {
    ct_tensor *scores = ct_mul_scalar(ct_matmul(q, ct_transpose(k, -2, -1)), scale);
    if (o->causal) {
        ct_device dev = ct_tensor_device(q);
        ct_tensor *ones = ct_full_on(2, (int64_t[]){s->tq, s->tk}, 1, CT_BOOL, dev);
        scores = ct_masked_fill(scores, ct_triu(ones, 1), -INFINITY);
    }
    ct_tensor *w = ct_softmax(scores, -1);
    if (o->dropout_p > 0 && w) {
        ct_tensor *u = ct_rand(w->ndim, w->sizes, CT_FLOAT32, o->gen);
        ct_tensor *keep = ct_to(ct_lt_scalar(u, 1 - o->dropout_p), ct_tensor_device(w));
        double f = o->dropout_p < 1 ? 1 / (1 - o->dropout_p) : 0;
        w = ct_mul(w, ct_mul_scalar(ct_to_dtype(keep, w->dtype), f));
    }
    return ct_matmul(w, v);
}

/* Checks the operands and fills s. */
static int check(ct_tensor *q, ct_tensor *k, ct_tensor *v, const ct_attention_options *o,
                 att_dims *s) {
    const char *op = "scaled_dot_product_attention";
    char dq[CT__DESC_STR], dk[CT__DESC_STR], dv[CT__DESC_STR];
    if (!ct_dtype_is_float(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype)
        return ct__seterr(CT_EDTYPE, "%s: q %s, k %s and v %s need one floating-point dtype", op,
                          ct__desc(dq, q), ct__desc(dk, k), ct__desc(dv, v));
    if (q->ndim < 2 || k->ndim < 2 || v->ndim < 2 ||
        q->sizes[q->ndim - 1] != k->sizes[k->ndim - 1] ||
        k->sizes[k->ndim - 2] != v->sizes[v->ndim - 2])
        return ct__seterr(CT_ESHAPE,
                          "%s: expected q [..., Tq, D], k [..., Tk, D] and v [..., Tk, Dv], got "
                          "q %s, k %s and v %s",
                          op, ct__desc(dq, q), ct__desc(dk, k), ct__desc(dv, v));
    if (!(o->dropout_p >= 0 && o->dropout_p <= 1))
        return ct__seterr(CT_EINVAL, "%s: dropout_p must be in [0, 1], got %g", op, o->dropout_p);
    if (!(o->scale >= 0 && isfinite(o->scale)))
        return ct__seterr(CT_EINVAL, "%s: scale must be finite and >= 0 (0: 1/sqrt(D)), got %g", op,
                          o->scale);
    int nb = 0;
    int64_t b[CT_MAX_DIMS];
    if (ct__broadcast_shapes(op, q->ndim - 2, q->sizes, k->ndim - 2, k->sizes, &nb, b) ||
        ct__broadcast_shapes(op, nb, b, v->ndim - 2, v->sizes, &s->nbatch, s->batch))
        return ct_errcode();
    s->units = ct__numel(s->nbatch, s->batch);
    s->tq = q->sizes[q->ndim - 2];
    s->tk = k->sizes[k->ndim - 2];
    s->d = q->sizes[q->ndim - 1];
    s->dv = v->sizes[v->ndim - 1];
    if (s->tq > INT32_MAX || s->tk > INT32_MAX || s->d > INT32_MAX || s->dv > INT32_MAX)
        return ct__seterr(CT_ENOTSUP, "%s: a matrix dim of q %s, k %s or v %s exceeds BLAS's limit",
                          op, ct__desc(dq, q), ct__desc(dk, k), ct__desc(dv, v));
    return 0;
}

ct_tensor *ct_scaled_dot_product_attention(ct_tensor *q, ct_tensor *k, ct_tensor *v,
                                           const ct_attention_options *opts) {
    const char *op = "scaled_dot_product_attention";
    ct_attention_options o = opts ? *opts : (ct_attention_options){0};
    att_dims s;
    if (CT__CHECK_ANY(op, q, k, v) || ct__check_same_device(op, (ct_tensor *[]){q, k, v}, 3) ||
        check(q, k, v, &o, &s))
        return NULL;
    double scale = o.scale > 0 ? o.scale : 1 / sqrt((double)(s.d > 0 ? s.d : 1));
    if (!ct_device_equal(ct_tensor_device(q), CT_DEVICE_CPU))
        return attention_ops(q, k, v, &s, &o, scale);
    if (q->dtype == CT_FLOAT32 || q->dtype == CT_FLOAT64)
        return attention_cpu((ct_tensor *[]){q, k, v}, (ct_tensor *[]){q, k, v}, 3, &s, &o, scale,
                             0);
    o.scale = scale;
    ct_tensor *out = ct_scaled_dot_product_attention(
        ct_to_dtype(q, CT_FLOAT32), ct_to_dtype(k, CT_FLOAT32), ct_to_dtype(v, CT_FLOAT32), &o);
    return ct_to_dtype(out, q->dtype);
}

ct_tensor *ct__attention_packed(ct_tensor *qkv, int64_t heads, const ct_attention_options *opts) {
    const char *op = "scaled_dot_product_attention";
    char dq[CT__DESC_STR];
    if (CT__CHECK_ANY(op, qkv))
        return NULL;
    if (qkv->ndim != 3 || heads <= 0 || qkv->sizes[2] % (3 * heads)) {
        ct__seterr(CT_ESHAPE,
                   "%s: expected a packed qkv [B, T, 3 C] with C divisible by %lld heads, "
                   "got %s",
                   op, (long long)heads, ct__desc(dq, qkv));
        return NULL;
    }
    bool fused = ct_tensor_device(qkv).type == CT_CPU && ct_is_contiguous(qkv) &&
                 (qkv->dtype == CT_FLOAT32 || qkv->dtype == CT_FLOAT64);
    ct_tensor *qkv3[3];
    qkv_heads(fused ? qkv : ct_contiguous(qkv), heads, qkv3);
    if (!fused) {
        ct_tensor *y = ct_scaled_dot_product_attention(qkv3[0], qkv3[1], qkv3[2], opts);
        return ct_reshape(ct_transpose(y, 1, 2),
                          CT_SHAPE(qkv->sizes[0], qkv->sizes[1], qkv->sizes[2] / 3));
    }
    ct_attention_options o = opts ? *opts : (ct_attention_options){0};
    att_dims s;
    if (check(qkv3[0], qkv3[1], qkv3[2], &o, &s))
        return NULL;
    double scale = o.scale > 0 ? o.scale : 1 / sqrt((double)(s.d > 0 ? s.d : 1));
    return attention_cpu(qkv3, &qkv, 1, &s, &o, scale, heads);
}
