/* Reductions, softmax, cross-entropy and layer norm on a CUDA device,
 * each against the CPU on the same inputs: every dtype, sets of dims,
 * keepdim, views, empty and 0-d tensors, rows long enough to be split
 * across blocks, NaN and infinities, gradients (float64, tight) and the
 * same errors. Without a device the whole program is skipped (exit 77). */
#include "ct_test.h"
#include "device_under_test.h"

#include <ct/autograd.h>
#include <ct/cuda.h>
#include <ct/nn.h>
#include <stdlib.h>

static ct_tensor *dev(ct_tensor *t) { return ct_to(t, dut); }
static ct_tensor *host(ct_tensor *t) { return t ? ct_to(t, CT_DEVICE_CPU) : NULL; }

/* Relative tolerance of a result of dtype d: the two sides accumulate in
 * different orders (and the device's sums in double), then round. */
static double rtol_of(ct_dtype d) {
    switch (d) {
    case CT_FLOAT32: return 2e-5;
    case CT_FLOAT64: return 1e-11;
    case CT_BFLOAT16: return 1.6e-2;
    case CT_FLOAT16: return 2e-3;
    default: return 0;
    }
}

static double atol_of(ct_dtype d) { return ct_dtype_is_float(d) ? 10 * rtol_of(d) : 0; }

/* Tolerances from the result's dtype. */
#define BY_DTYPE (-1.0)

/* got, made on the device from the CPU's inputs moved there, against want:
 * the same dtype and values, or the CPU's error code when want is NULL
 * (code). what names the case when they differ. rtol BY_DTYPE: rtol_of and
 * atol_of the result's dtype. */
static void expect_like(const char *what, ct_tensor *got, ct_tensor *want, int code, double rtol,
                        double atol) {
    if (want && rtol < 0) {
        rtol = rtol_of(ct_tensor_dtype(want));
        atol = atol_of(ct_tensor_dtype(want));
    }
    if (!want) {
        if (got || ct_errcode() != code)
            tt_fail(__FILE__, __LINE__, "%s: the CPU failed with %s, the device gave %s (%s)", what,
                    ct_errname(code), got ? "a result" : ct_errname(ct_errcode()), ct_errmsg());
        ct_errclear();
        return;
    }
    if (!got) {
        tt_fail(__FILE__, __LINE__, "%s: the device failed: %s", what, ct_errmsg());
        return;
    }
    if (ct_tensor_device(got).type != DUT_TYPE || ct_tensor_dtype(got) != ct_tensor_dtype(want)) {
        tt_fail(__FILE__, __LINE__, "%s: result on %d as %s, expected cuda as %s", what,
                (int)ct_tensor_device(got).type, ct_dtype_name(ct_tensor_dtype(got)),
                ct_dtype_name(ct_tensor_dtype(want)));
        return;
    }
    if (!tt_close(__FILE__, __LINE__, host(got), want, rtol, atol))
        fprintf(stderr, "  (in %s)\n", what);
}

/* Runs cpu, then dev_expr, and compares them. */
#define SAME(what, cpu, dev_expr, rtol, atol)                                                      \
    do {                                                                                           \
        ct_errclear();                                                                             \
        ct_tensor *w_ = (cpu);                                                                     \
        int c_ = w_ ? 0 : ct_errcode();                                                            \
        ct_errclear();                                                                             \
        expect_like(what, (dev_expr), w_, c_, rtol, atol);                                         \
        if (tt_failed())                                                                           \
            return;                                                                                \
    } while (0)

/* ------------------------------------------------------------- reductions */

typedef ct_tensor *(*reduce_fn)(ct_tensor *, const int *, int, bool);

static ct_tensor *var1(ct_tensor *t, const int *d, int n, bool k) { return ct_var(t, d, n, 1, k); }
static ct_tensor *var0(ct_tensor *t, const int *d, int n, bool k) { return ct_var(t, d, n, 0, k); }
static ct_tensor *std1(ct_tensor *t, const int *d, int n, bool k) { return ct_std(t, d, n, 1, k); }
static ct_tensor *norm0(ct_tensor *t, const int *d, int n, bool k) {
    return ct_norm(t, 0, d, n, k);
}
static ct_tensor *norm1(ct_tensor *t, const int *d, int n, bool k) {
    return ct_norm(t, 1, d, n, k);
}
static ct_tensor *norm2(ct_tensor *t, const int *d, int n, bool k) {
    return ct_norm(t, 2, d, n, k);
}
static ct_tensor *norm3(ct_tensor *t, const int *d, int n, bool k) {
    return ct_norm(t, 3, d, n, k);
}
static ct_tensor *norm_half(ct_tensor *t, const int *d, int n, bool k) {
    return ct_norm(t, 0.5, d, n, k);
}
static ct_tensor *norm_inf(ct_tensor *t, const int *d, int n, bool k) {
    return ct_norm(t, INFINITY, d, n, k);
}
static ct_tensor *norm_ninf(ct_tensor *t, const int *d, int n, bool k) {
    return ct_norm(t, -INFINITY, d, n, k);
}

static const struct {
    const char *name;
    reduce_fn fn;
} reductions[] = {
    {"sum", ct_sum},          {"mean", ct_mean},      {"prod", ct_prod},
    {"amax", ct_amax},        {"amin", ct_amin},      {"logsumexp", ct_logsumexp},
    {"var1", var1},           {"var0", var0},         {"std1", std1},
    {"norm0", norm0},         {"norm1", norm1},       {"norm2", norm2},
    {"norm3", norm3},         {"norm0.5", norm_half}, {"norm_inf", norm_inf},
    {"norm_-inf", norm_ninf},
};
#define NREDUCTIONS ((int)(sizeof reductions / sizeof *reductions))

/* Every reduction of x (CPU) and dx (its device copy, or a view matching
 * it) over each set of dims, with and without keepdim. */
static void reductions_match(const char *label, ct_tensor *x, ct_tensor *dx) {
    static const int sets[][3] = {{0}, {-1}, {0, 2}, {1, 2}, {-3, -1}, {0, 1, 2}};
    static const int sizes[] = {1, 1, 2, 2, 2, 3};
    char what[160];
    for (int f = 0; f < NREDUCTIONS; f++)
        for (int s = -1; s < (int)(sizeof sizes / sizeof *sizes); s++)
            for (int keep = 0; keep < 2; keep++) {
                const int *dims = s < 0 ? NULL : sets[s];
                int nd = s < 0 ? 0 : sizes[s];
                ct_scope_begin();
                snprintf(what, sizeof what, "%s %s of %s over set %d, keepdim %d",
                         reductions[f].name, label, ct_dtype_name(ct_tensor_dtype(x)), s, keep);
                SAME(what, reductions[f].fn(x, dims, nd, keep),
                     reductions[f].fn(dx, dims, nd, keep), BY_DTYPE, 0);
                ct_scope_end();
            }
}

TEST(every_reduction_matches_the_cpu_over_dtypes_and_dims) {
    for (int d = 0; d < CT_NDTYPES; d++) {
        ct_scope_begin();
        ct_tensor *x = tt_rand(CT_SHAPE(4, 5, 6), (ct_dtype)d, 10 + (uint64_t)d);
        reductions_match("contiguous", x, dev(x));
        ct_scope_end();
        if (tt_failed())
            return;
    }
}

TEST(reductions_of_views_match_the_cpu) {
    ct_tensor *x = tt_rand(CT_SHAPE(6, 8, 10), CT_FLOAT32, 21);
    ct_tensor *dx = dev(x);
    ct_tensor *views[][2] = {
        {ct_transpose(x, 0, 2), ct_transpose(dx, 0, 2)},
        {ct_slice(x, 1, 1, 8, 3), ct_slice(dx, 1, 1, 8, 3)},
        {ct_expand(ct_narrow(x, 0, 2, 1), CT_SHAPE(4, 8, 10)),
         ct_expand(ct_narrow(dx, 0, 2, 1), CT_SHAPE(4, 8, 10))},
        {ct_permute(ct_slice(x, 2, 0, 10, 2), (int[]){2, 0, 1}),
         ct_permute(ct_slice(dx, 2, 0, 10, 2), (int[]){2, 0, 1})},
    };
    for (size_t v = 0; v < sizeof views / sizeof *views && !tt_failed(); v++)
        reductions_match("view", views[v][0], views[v][1]);
    /* An int32 view, for the integer path. */
    ct_tensor *xi = ct_transpose(tt_rand(CT_SHAPE(7, 9, 4), CT_INT32, 22), 0, 1);
    reductions_match("int view", xi, ct_transpose(dev(ct_transpose(xi, 0, 1)), 0, 1));
}

/* max_dim, min_dim, argmax and argmin: values and first indices, with ties
 * (integers in [-5, 5] repeat often). */
TEST(extremes_along_a_dim_and_their_first_indices_match_the_cpu) {
    char what[96];
    for (int d = 0; d < CT_NDTYPES; d++) {
        ct_scope_begin();
        ct_tensor *x = tt_rand(CT_SHAPE(5, 40, 3), (ct_dtype)d, 30 + (uint64_t)d);
        ct_tensor *dx = dev(x);
        for (int dim = -3; dim < 3 && !tt_failed(); dim++)
            for (int keep = 0; keep < 2; keep++) {
                snprintf(what, sizeof what, "%s dim %d keepdim %d", ct_dtype_name((ct_dtype)d), dim,
                         keep);
                SAME(what, ct_argmax(x, dim, keep), ct_argmax(dx, dim, keep), 0, 0);
                SAME(what, ct_argmin(x, dim, keep), ct_argmin(dx, dim, keep), 0, 0);
                ct_tensor *hi = NULL, *dhi = NULL, *lo = NULL, *dlo = NULL;
                SAME(what, ct_max_dim(x, dim, keep, &hi), ct_max_dim(dx, dim, keep, &dhi), 0, 0);
                SAME(what, hi, dhi, 0, 0);
                SAME(what, ct_min_dim(x, dim, keep, &lo), ct_min_dim(dx, dim, keep, &dlo), 0, 0);
                SAME(what, lo, dlo, 0, 0);
            }
        ct_scope_end();
    }
    /* Every element equal: index 0 everywhere. */
    ct_tensor *same = ct_full_on(CT_SHAPE(3, 1000), 2.5, CT_FLOAT32, dut);
    ASSERT_CLOSE(host(ct_argmax(same, 1, false)), ct_zeros(CT_SHAPE(3), CT_INT64), 0, 0);
}

TEST(empty_and_zero_d_tensors_reduce_as_on_the_cpu) {
    ct_tensor *e = ct_zeros(CT_SHAPE(0, 3), CT_FLOAT32), *de = dev(e);
    char what[64];
    for (int f = 0; f < NREDUCTIONS; f++)
        for (int dim = 0; dim < 2; dim++)
            for (int keep = 0; keep < 2; keep++) {
                snprintf(what, sizeof what, "%s of [0, 3] over %d", reductions[f].name, dim);
                SAME(what, reductions[f].fn(e, &dim, 1, keep), reductions[f].fn(de, &dim, 1, keep),
                     0, 0);
                SAME(what, reductions[f].fn(e, NULL, 0, keep), reductions[f].fn(de, NULL, 0, keep),
                     0, 0);
            }
    SAME("argmax over an empty dim", ct_argmax(e, 0, false), ct_argmax(de, 0, false), 0, 0);
    SAME("argmax of empty rows", ct_argmax(e, 1, false), ct_argmax(de, 1, false), 0, 0);
    SAME("sum of empty int64", ct_sum(ct_zeros(CT_SHAPE(0), CT_INT64), NULL, 0, false),
         ct_sum(dev(ct_zeros(CT_SHAPE(0), CT_INT64)), NULL, 0, false), 0, 0);
    for (int d = 0; d < CT_NDTYPES; d++) {
        ct_tensor *s = ct_reshape(tt_rand(CT_SHAPE(1), (ct_dtype)d, 40), 0, NULL), *ds = dev(s);
        for (int f = 0; f < NREDUCTIONS; f++)
            SAME(reductions[f].name, reductions[f].fn(s, NULL, 0, false),
                 reductions[f].fn(ds, NULL, 0, false), BY_DTYPE, 0);
        SAME("argmax of 0-d", ct_argmax(s, 0, false), ct_argmax(ds, -1, false), 0, 0);
        SAME("softmax of 0-d", ct_softmax(s, 0), ct_softmax(ds, 0), 0, 0);
    }
}

/* Rows long enough for several blocks per output (the split path), many
 * short rows, and a reduction over the outer dim of a tall matrix. */
TEST(long_and_many_short_rows_reduce_as_on_the_cpu) {
    ct_tensor *lng = tt_rand(CT_SHAPE(3, 200001), CT_FLOAT32, 50), *dl = dev(lng);
    int last = -1, first = 0;
    SAME("sum of long rows", ct_sum(lng, &last, 1, false), ct_sum(dl, &last, 1, false), 1e-5, 1e-3);
    SAME("var of long rows", ct_var(lng, &last, 1, 1, false), ct_var(dl, &last, 1, 1, false), 1e-5,
         0);
    SAME("logsumexp of long rows", ct_logsumexp(lng, &last, 1, false),
         ct_logsumexp(dl, &last, 1, false), 1e-5, 0);
    SAME("amax of long rows", ct_amax(lng, &last, 1, false), ct_amax(dl, &last, 1, false), 0, 0);
    SAME("argmin of long rows", ct_argmin(lng, -1, false), ct_argmin(dl, -1, false), 0, 0);
    SAME("norm of everything", ct_norm(lng, 2, NULL, 0, false), ct_norm(dl, 2, NULL, 0, false),
         1e-5, 0);
    SAME("mean of everything", ct_mean(lng, NULL, 0, false), ct_mean(dl, NULL, 0, false), 1e-4,
         1e-6);
    ct_tensor *big = tt_rand(CT_SHAPE(1 << 21), CT_INT32, 51);
    SAME("int32 sum of 2M", ct_sum(big, NULL, 0, false), ct_sum(dev(big), NULL, 0, false), 0, 0);
    ct_tensor *h = tt_rand(CT_SHAPE(1 << 20), CT_BFLOAT16, 52);
    SAME("bfloat16 sum of 1M", ct_sum(h, NULL, 0, false), ct_sum(dev(h), NULL, 0, false), 1.6e-2,
         0.5);
    ct_tensor *tall = tt_rand(CT_SHAPE(100000, 3), CT_FLOAT64, 53), *dt = dev(tall);
    SAME("sum down a tall matrix", ct_sum(tall, &first, 1, false), ct_sum(dt, &first, 1, false),
         1e-10, 1e-9);
    SAME("argmax down a tall matrix", ct_argmax(tall, 0, true), ct_argmax(dt, 0, true), 0, 0);
    SAME("std down a tall matrix", ct_std(tall, &first, 1, 1, false),
         ct_std(dt, &first, 1, 1, false), 1e-10, 0);
    SAME("sum across a tall matrix", ct_sum(tall, &last, 1, false), ct_sum(dt, &last, 1, false),
         1e-12, 1e-12);
    ct_tensor *wide = tt_rand(CT_SHAPE(50000, 7), CT_FLOAT32, 54), *dw = dev(wide);
    SAME("var of short rows", ct_var(wide, &last, 1, 1, true), ct_var(dw, &last, 1, 1, true), 1e-5,
         1e-6);
    SAME("argmax of short rows", ct_argmax(wide, 1, false), ct_argmax(dw, 1, false), 0, 0);
    SAME("prod of short rows", ct_prod(wide, &last, 1, false), ct_prod(dw, &last, 1, false), 1e-5,
         1e-7);
}

TEST(nan_and_infinities_propagate_as_on_the_cpu) {
    double rows[4][6] = {{1, 2, NAN, 5, NAN, 0},
                         {1, INFINITY, 3, -2, 0, 1},
                         {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
                         {INFINITY, -INFINITY, 1, 2, 3, 4}};
    for (int d = 0; d < 4; d++) {
        ct_tensor *x = ct_to_dtype(ct_from_data(rows, CT_SHAPE(4, 6), CT_FLOAT64), (ct_dtype)d);
        ct_tensor *dx = dev(x);
        int last = 1;
        for (int f = 0; f < NREDUCTIONS; f++)
            SAME(reductions[f].name, reductions[f].fn(x, &last, 1, false),
                 reductions[f].fn(dx, &last, 1, false), BY_DTYPE, 0);
        SAME("argmax", ct_argmax(x, 1, false), ct_argmax(dx, 1, false), 0, 0);
        SAME("argmin", ct_argmin(x, 1, false), ct_argmin(dx, 1, false), 0, 0);
        SAME("softmax", ct_softmax(x, 1), ct_softmax(dx, 1), rtol_of((ct_dtype)d), 0);
        SAME("log_softmax", ct_log_softmax(x, 1), ct_log_softmax(dx, 1), rtol_of((ct_dtype)d), 0);
    }
}

/* ---------------------------------------------------------------- softmax */

TEST(softmax_and_log_softmax_match_the_cpu_on_short_and_long_rows) {
    static const int64_t lens[] = {1, 33, 1000, 5000};
    ct_dtype dts[] = {CT_FLOAT32, CT_FLOAT64, CT_BFLOAT16, CT_FLOAT16};
    char what[96];
    for (size_t l = 0; l < sizeof lens / sizeof *lens; l++)
        for (int k = 0; k < 4; k++) {
            ct_scope_begin();
            ct_dtype dt = dts[k];
            double rtol = rtol_of(dt), atol = ct_dtype_is_float(dt) ? rtol * 1e-2 : 0;
            int64_t n = lens[l];
            /* Rows along the last dim, along the first, and along a middle one. */
            ct_tensor *xs[] = {tt_rand(CT_SHAPE(7, n), dt, 60 + l), tt_rand(CT_SHAPE(n, 7), dt, 61),
                               tt_rand(CT_SHAPE(3, n, 5), dt, 62)};
            int dims[] = {-1, 0, 1};
            for (int v = 0; v < 3; v++) {
                ct_tensor *dx = dev(xs[v]);
                snprintf(what, sizeof what, "softmax of %lld along dim %d in %s", (long long)n,
                         dims[v], ct_dtype_name(dt));
                SAME(what, ct_softmax(xs[v], dims[v]), ct_softmax(dx, dims[v]), rtol, atol);
                SAME(what, ct_log_softmax(xs[v], dims[v]), ct_log_softmax(dx, dims[v]), rtol,
                     atol * 100);
            }
            ct_scope_end();
        }
    /* Many short rows down the first dim (one lane per row), and a view. */
    ct_tensor *x = tt_rand(CT_SHAPE(8, 4096), CT_FLOAT32, 63), *dx = dev(x);
    SAME("softmax down 4096 columns", ct_softmax(x, 0), ct_softmax(dx, 0), 1e-5, 1e-7);
    SAME("log_softmax of a view", ct_log_softmax(ct_transpose(x, 0, 1), 0),
         ct_log_softmax(ct_transpose(dx, 0, 1), 0), 1e-5, 1e-5);
    SAME("softmax of an empty tensor", ct_softmax(ct_zeros(CT_SHAPE(0, 4), CT_FLOAT32), 1),
         ct_softmax(dev(ct_zeros(CT_SHAPE(0, 4), CT_FLOAT32)), 1), 0, 0);
    SAME("softmax of integers", ct_softmax(ct_ones(CT_SHAPE(3), CT_INT64), 0),
         ct_softmax(dev(ct_ones(CT_SHAPE(3), CT_INT64)), 0), 0, 0);
}

/* ------------------------------------------------------------- gradients */

typedef ct_tensor *(*unary_fn)(ct_tensor *);

static ct_tensor *g_sum(ct_tensor *t) { return ct_sum(t, (int[]){1}, 1, false); }
static ct_tensor *g_mean(ct_tensor *t) { return ct_mean(t, NULL, 0, false); }
static ct_tensor *g_var(ct_tensor *t) { return ct_var(t, (int[]){0, 2}, 2, 1, true); }
static ct_tensor *g_std(ct_tensor *t) { return ct_std(t, (int[]){-1}, 1, 1, false); }
static ct_tensor *g_lse(ct_tensor *t) { return ct_logsumexp(t, (int[]){1}, 1, false); }
static ct_tensor *g_amax(ct_tensor *t) { return ct_amax(t, (int[]){2}, 1, false); }
static ct_tensor *g_norm2(ct_tensor *t) { return ct_norm(t, 2, NULL, 0, false); }
static ct_tensor *g_norm3(ct_tensor *t) { return ct_norm(t, 3, (int[]){1}, 1, true); }
static ct_tensor *g_prod(ct_tensor *t) { return ct_prod(t, (int[]){2}, 1, false); }
static ct_tensor *g_max_dim(ct_tensor *t) { return ct_max_dim(t, 1, false, NULL); }
static ct_tensor *g_softmax(ct_tensor *t) { return ct_softmax(t, 0); }
static ct_tensor *g_log_softmax(ct_tensor *t) { return ct_log_softmax(t, -1); }

/* The gradient of f at x (float64) on the device against the CPU's, for a
 * random output gradient. */
static void grad_matches(const char *what, unary_fn f, ct_tensor *x, double rtol) {
    ct_tensor *hx = ct_requires_grad_(ct_clone(x), true);
    ct_tensor *dx = ct_requires_grad_(dev(x), true);
    ct_tensor *hy = f(hx), *dy = f(dx);
    if (!hy || !dy) {
        tt_fail(__FILE__, __LINE__, "%s: %s", what, ct_errmsg());
        return;
    }
    ct_tensor *go = tt_rand(ct_ndim(hy), ct_sizes(hy), CT_FLOAT64, 70), *dgo = dev(go);
    ct_tensor *hg = NULL, *dg = NULL;
    if (ct_grad(&hy, 1, &go, &hx, 1, &hg, NULL) || ct_grad(&dy, 1, &dgo, &dx, 1, &dg, NULL)) {
        tt_fail(__FILE__, __LINE__, "%s: backward failed: %s", what, ct_errmsg());
        return;
    }
    expect_like(what, dg, hg, 0, rtol, 1e-12);
}

TEST(gradients_of_reductions_and_softmax_match_the_cpu) {
    static const struct {
        const char *name;
        unary_fn f;
    } fns[] = {{"sum", g_sum},         {"mean", g_mean},       {"var", g_var},
               {"std", g_std},         {"logsumexp", g_lse},   {"amax", g_amax},
               {"norm2", g_norm2},     {"norm3", g_norm3},     {"prod", g_prod},
               {"max_dim", g_max_dim}, {"softmax", g_softmax}, {"log_softmax", g_log_softmax}};
    ct_tensor *x = tt_rand(CT_SHAPE(4, 9, 5), CT_FLOAT64, 71);
    for (size_t i = 0; i < sizeof fns / sizeof *fns && !tt_failed(); i++) {
        ct_scope_begin();
        grad_matches(fns[i].name, fns[i].f, x, 1e-10);
        ct_scope_end();
    }
}

/* ----------------------------------------------------------- losses */

/* Cross-entropy (or another loss) and its gradient on both sides. */
typedef ct_tensor *(*loss_fn)(ct_tensor *, ct_tensor *, const ct_loss_options *);

static void loss_matches(const char *what, loss_fn f, ct_tensor *x, ct_tensor *t,
                         const ct_loss_options *o, double rtol) {
    ct_tensor *hx = ct_requires_grad_(ct_clone(x), true);
    ct_tensor *dx = ct_requires_grad_(dev(x), true);
    ct_tensor *hl = f(hx, t, o), *dl = f(dx, dev(t), o);
    expect_like(what, dl, hl, 0, rtol, rtol);
    if (tt_failed())
        return;
    ct_tensor *go = tt_rand(ct_ndim(hl), ct_sizes(hl), ct_tensor_dtype(hl), 80);
    ct_tensor *dgo = dev(go), *hg = NULL, *dg = NULL;
    if (ct_grad(&hl, 1, &go, &hx, 1, &hg, NULL) || ct_grad(&dl, 1, &dgo, &dx, 1, &dg, NULL)) {
        tt_fail(__FILE__, __LINE__, "%s: backward failed: %s", what, ct_errmsg());
        return;
    }
    expect_like(what, dg, hg, 0, rtol, rtol * 1e-2);
}

TEST(cross_entropy_and_its_gradient_match_the_cpu) {
    int64_t tv[] = {3, -100, 0, 9, 3, 5, -100, 1};
    ct_tensor *t = ct_from_data(tv, CT_SHAPE(8), CT_INT64);
    ct_reduction reds[] = {CT_REDUCTION_MEAN, CT_REDUCTION_SUM, CT_REDUCTION_NONE};
    ct_dtype dts[] = {CT_FLOAT64, CT_FLOAT32, CT_FLOAT16};
    char what[96];
    for (int k = 0; k < 3; k++)
        for (int r = 0; r < 3; r++)
            for (int s = 0; s < 2; s++) {
                ct_scope_begin();
                ct_tensor *x = tt_rand(CT_SHAPE(8, 10), dts[k], 90 + (uint64_t)k);
                ct_loss_options o = {reds[r], -100, s ? 0.1 : 0};
                snprintf(what, sizeof what, "cross_entropy %s reduction %d smoothing %d",
                         ct_dtype_name(dts[k]), r, s);
                loss_matches(what, ct_cross_entropy, x, t, &o, k == 0 ? 1e-11 : rtol_of(dts[k]));
                /* ignore_index 3, with -100 no longer special. */
                ct_loss_options o3 = {reds[r], 3, s ? 0.25 : 0};
                ct_tensor *t3 =
                    ct_from_data((int64_t[]){3, 2, 0, 9, 3, 5, 7, 1}, CT_SHAPE(8), CT_INT64);
                loss_matches(what, ct_cross_entropy, x, t3, &o3, k == 0 ? 1e-11 : rtol_of(dts[k]));
                ct_scope_end();
                if (tt_failed())
                    return;
            }
    /* One row of 5000 classes (a block per row), a [C] input with a 0-d
     * target, and every target ignored (the mean is NaN). */
    ct_tensor *wide = tt_rand(CT_SHAPE(2, 5000), CT_FLOAT64, 93);
    loss_matches("5000 classes", ct_cross_entropy, wide,
                 ct_from_data((int64_t[]){4999, 17}, CT_SHAPE(2), CT_INT64), NULL, 1e-11);
    loss_matches("one row", ct_cross_entropy, tt_rand(CT_SHAPE(6), CT_FLOAT64, 94),
                 ct_reshape(ct_from_data((int64_t[]){2}, CT_SHAPE(1), CT_INT64), 0, NULL), NULL,
                 1e-11);
    ct_tensor *none = ct_full(CT_SHAPE(8), -100, CT_INT64);
    SAME("all ignored", ct_cross_entropy(tt_rand(CT_SHAPE(8, 10), CT_FLOAT32, 95), none, NULL),
         ct_cross_entropy(dev(tt_rand(CT_SHAPE(8, 10), CT_FLOAT32, 95)), dev(none), NULL), 0, 0);
    /* A transposed int32 target and transposed logits. */
    ct_tensor *xt = ct_transpose(tt_rand(CT_SHAPE(10, 8), CT_FLOAT64, 96), 0, 1);
    ct_tensor *ti = ct_to_dtype(
        ct_from_data((int64_t[]){1, 2, 3, 4, 5, 6, 7, 8}, CT_SHAPE(8), CT_INT64), CT_INT32);
    ct_loss_options ls = {CT_REDUCTION_MEAN, -100, 0.3};
    loss_matches("views", ct_cross_entropy, xt, ti, &ls, 1e-11);
}

TEST(nll_and_mse_losses_run_on_the_device) {
    int64_t tv[] = {3, -100, 0, 9, 3, 5};
    ct_tensor *t = ct_from_data(tv, CT_SHAPE(6), CT_INT64);
    ct_tensor *lp = ct_log_softmax(tt_rand(CT_SHAPE(6, 10), CT_FLOAT64, 100), 1);
    ct_reduction reds[] = {CT_REDUCTION_MEAN, CT_REDUCTION_SUM, CT_REDUCTION_NONE};
    for (int r = 0; r < 3 && !tt_failed(); r++) {
        ct_loss_options o = {reds[r], -100, 0};
        loss_matches("nll_loss", ct_nll_loss, lp, t, &o, 1e-11);
    }
    ct_tensor *a = tt_rand(CT_SHAPE(5, 7), CT_FLOAT64, 101),
              *b = tt_rand(CT_SHAPE(7), CT_FLOAT64, 102);
    for (int r = 0; r < 3; r++)
        SAME("mse_loss", ct_mse_loss(a, b, reds[r]), ct_mse_loss(dev(a), dev(b), reds[r]), 1e-12,
             1e-12);
}

/* ------------------------------------------------------------ layer norm */

/* Layer norm of x on the device (fused) against the CPU's composed form,
 * its output and the gradients of x, weight and bias; without weight or
 * bias when those are NULL. */
static void layer_norm_matches(const char *what, ct_tensor *x, ct_tensor *w, ct_tensor *b,
                               double rtol) {
    ct_tensor *in[3] = {ct_requires_grad_(ct_clone(x), true), NULL, NULL}, *din[3] = {NULL};
    din[0] = ct_requires_grad_(dev(x), true);
    int n = 1;
    ct_tensor *hw = NULL, *hb = NULL, *dw = NULL, *db = NULL;
    if (w) {
        in[n] = hw = ct_requires_grad_(ct_clone(w), true);
        din[n++] = dw = ct_requires_grad_(dev(w), true);
    }
    if (b) {
        in[n] = hb = ct_requires_grad_(ct_clone(b), true);
        din[n++] = db = ct_requires_grad_(dev(b), true);
    }
    ct_tensor *hy = ct_layer_norm(in[0], hw, hb, 1e-5), *dy = ct_layer_norm(din[0], dw, db, 1e-5);
    expect_like(what, dy, hy, 0, rtol, rtol);
    if (tt_failed())
        return;
    ct_tensor *go = tt_rand(ct_ndim(hy), ct_sizes(hy), ct_tensor_dtype(hy), 110), *dgo = dev(go);
    ct_tensor *hg[3] = {NULL}, *dg[3] = {NULL};
    if (ct_grad(&hy, 1, &go, in, n, hg, NULL) || ct_grad(&dy, 1, &dgo, din, n, dg, NULL)) {
        tt_fail(__FILE__, __LINE__, "%s: backward failed: %s", what, ct_errmsg());
        return;
    }
    for (int i = 0; i < n && !tt_failed(); i++)
        expect_like(what, dg[i], hg[i], 0, rtol, rtol);
}

TEST(layer_norm_and_its_gradients_match_the_cpu) {
    static const int64_t dims[] = {1, 33, 300, 3000};
    for (size_t k = 0; k < sizeof dims / sizeof *dims && !tt_failed(); k++) {
        ct_scope_begin();
        int64_t d = dims[k];
        ct_tensor *x = tt_rand(CT_SHAPE(4, 3, d), CT_FLOAT64, 120 + k);
        ct_tensor *w = tt_rand(CT_SHAPE(d), CT_FLOAT64, 121),
                  *b = tt_rand(CT_SHAPE(d), CT_FLOAT64, 122);
        layer_norm_matches("weight and bias", x, w, b, 1e-9);
        layer_norm_matches("weight only", x, w, NULL, 1e-9);
        layer_norm_matches("bias only", x, NULL, b, 1e-9);
        layer_norm_matches("neither", x, NULL, NULL, 1e-9);
        ct_scope_end();
    }
    /* A transposed input; float32. */
    ct_tensor *xt = ct_transpose(tt_rand(CT_SHAPE(64, 5), CT_FLOAT64, 123), 0, 1);
    layer_norm_matches("a view", xt, tt_rand(CT_SHAPE(64), CT_FLOAT64, 124), NULL, 1e-9);
    ct_tensor *x32 = tt_rand(CT_SHAPE(16, 700), CT_FLOAT32, 125);
    ct_tensor *w32 = tt_rand(CT_SHAPE(700), CT_FLOAT32, 126),
              *b32 = tt_rand(CT_SHAPE(700), CT_FLOAT32, 127);
    layer_norm_matches("float32", x32, w32, b32, 1e-4);
    /* 16-bit floats: fused in float32 on the device; the reference is the
     * CPU's float32 result from the same 16-bit inputs, rounded. */
    ct_dtype halfs[] = {CT_BFLOAT16, CT_FLOAT16};
    for (int h = 0; h < 2; h++) {
        ct_tensor *in[3] = {ct_to_dtype(x32, halfs[h]), ct_to_dtype(w32, halfs[h]),
                            ct_to_dtype(b32, halfs[h])};
        ct_tensor *want = ct_to_dtype(ct_layer_norm(ct_to_dtype(in[0], CT_FLOAT32),
                                                    ct_to_dtype(in[1], CT_FLOAT32),
                                                    ct_to_dtype(in[2], CT_FLOAT32), 1e-5),
                                      halfs[h]);
        ct_tensor *got = ct_layer_norm(dev(in[0]), dev(in[1]), dev(in[2]), 1e-5);
        expect_like("16-bit layer norm", got, want, 0, rtol_of(halfs[h]), 1e-2);
    }
}

/* The backward differentiated again (create_graph), through the ops form. */
TEST(layer_norm_gradients_can_be_differentiated_again_on_the_device) {
    ct_tensor *x = tt_rand(CT_SHAPE(3, 17), CT_FLOAT64, 130),
              *w = tt_rand(CT_SHAPE(17), CT_FLOAT64, 131);
    ct_tensor *res[2];
    for (int side = 0; side < 2; side++) {
        ct_tensor *xi = ct_requires_grad_(side ? dev(x) : ct_clone(x), true);
        ct_tensor *wi = side ? dev(w) : w;
        ct_tensor *y =
            ct_sum(ct_mul(ct_layer_norm(xi, wi, NULL, 1e-5), ct_layer_norm(xi, wi, NULL, 1e-5)),
                   NULL, 0, false);
        ct_tensor *g = NULL;
        ct_grad_options go = {.create_graph = true};
        ASSERT_EQ(ct_grad(&y, 1, NULL, &xi, 1, &g, &go), 0);
        ct_tensor *gg = NULL, *s = ct_sum(ct_mul(g, g), NULL, 0, false);
        ASSERT_EQ(ct_grad(&s, 1, NULL, &xi, 1, &gg, NULL), 0);
        res[side] = gg;
    }
    expect_like("double backward", res[1], res[0], 0, 1e-8, 1e-8);
}

/* ---------------------------------------------------------------- errors */

TEST(bad_input_gives_the_cpus_errors) {
    ct_tensor *x = tt_rand(CT_SHAPE(3, 4), CT_FLOAT32, 140), *dx = dev(x);
    ASSERT_FAILS(ct_sum(dx, (int[]){2}, 1, false), CT_EINVAL, "sum", "dim 2 is out of range");
    ASSERT_FAILS(ct_sum(dx, (int[]){1, -1}, 2, false), CT_EINVAL, "more than once");
    ASSERT_FAILS(ct_softmax(dx, -3), CT_EINVAL, "softmax", "out of range");
    ASSERT_FAILS(ct_argmax(dx, 5, false), CT_EINVAL, "argmax");
    ASSERT_FAILS(ct_mean(dev(ct_ones(CT_SHAPE(3), CT_INT32)), NULL, 0, false), CT_EDTYPE,
                 "not floating point");
    ASSERT_FAILS(ct_norm(dx, NAN, NULL, 0, false), CT_EINVAL, "p is NaN");
    ASSERT_FAILS(ct_amax(dev(ct_zeros(CT_SHAPE(0, 2), CT_FLOAT32)), (int[]){0}, 1, false),
                 CT_EINVAL, "has size 0");
    /* Mixed devices. */
    ct_tensor *t = ct_from_data((int64_t[]){0, 1, 2}, CT_SHAPE(3), CT_INT64);
    ASSERT_FAILS(ct_cross_entropy(dx, t, NULL), CT_EDEVICE, DUT_NAME, "cpu");
    ASSERT_FAILS(ct_layer_norm(dx, ct_ones(CT_SHAPE(4), CT_FLOAT32), NULL, 1e-5), CT_EDEVICE,
                 "layer_norm");
    ASSERT_FAILS(ct_mse_loss(dx, x, CT_REDUCTION_MEAN), CT_EDEVICE, "mse_loss");
    /* A target out of range: the CPU's message, position included. */
    ct_tensor *bad = ct_from_data((int64_t[]){0, 7, 2}, CT_SHAPE(3), CT_INT64);
    ASSERT_FAILS(ct_cross_entropy(dx, dev(bad), NULL), CT_ERANGE, "target 7 at position 1",
                 "outside the 4 classes");
}
