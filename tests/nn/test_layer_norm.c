/* layer_norm's fused path on the CPU: forward and gradients against the
 * composed formula in float64, gradcheck (first and second derivatives),
 * views, 16-bit dtypes, empty tensors, thread-count independence, the
 * composed fallback for mixed dtypes, and errors. */
#include "ct_test.h"

#include <ct/nn.h>

#define EPS 1e-5

/* The formula as separate ops, in x's dtype: the reference. */
static ct_tensor *composed(ct_tensor *x, ct_tensor *w, ct_tensor *b, double eps) {
    ct_tensor *mean = ct_mean(x, CT_DIMS(-1), true);
    ct_tensor *var = ct_var(x, CT_DIMS(-1), 0, true);
    ct_tensor *y = ct_mul(ct_sub(x, mean), ct_rsqrt(ct_add_scalar(var, eps)));
    if (w)
        y = ct_mul(y, w);
    return b ? ct_add(y, b) : y;
}

typedef ct_tensor *(*ln_fn)(ct_tensor *, ct_tensor *, ct_tensor *, double);

/* fn's output and its gradients for the output gradient g, from leaves
 * holding x, w and b (w, b may be NULL): out = {y, dx, dw, db}, NULL where
 * there is no input. */
static bool run_ln(ln_fn fn, ct_tensor *x, ct_tensor *w, ct_tensor *b, ct_tensor *g,
                   ct_tensor *out[4]) {
    ct_tensor *in[3] = {ct_requires_grad_(ct_clone(x), true), NULL, NULL}, *grads[3] = {0};
    int n = 1;
    int iw = w ? n++ : -1, ib = b ? n++ : -1;
    if (w)
        in[iw] = ct_requires_grad_(ct_clone(w), true);
    if (b)
        in[ib] = ct_requires_grad_(ct_clone(b), true);
    out[0] = fn(in[0], w ? in[iw] : NULL, b ? in[ib] : NULL, EPS);
    if (!out[0] || ct_grad(&out[0], 1, &g, in, n, grads, NULL) != 0) {
        tt_fail(__FILE__, __LINE__, "layer norm or its backward failed: %s", ct_errmsg());
        return false;
    }
    out[1] = grads[0];
    out[2] = w ? grads[iw] : NULL;
    out[3] = b ? grads[ib] : NULL;
    return true;
}

static const char *const part_names[4] = {"y", "dx", "dweight", "dbias"};

/* got and want agree within the tolerances, part by part (want in float64
 * when got is not). */
static bool parts_close(ct_tensor *got[4], ct_tensor *want[4], double tol, const char *what) {
    for (int i = 0; i < 4; i++) {
        if (!got[i] && !want[i])
            continue;
        ct_tensor *g = got[i] ? ct_to_dtype(got[i], ct_tensor_dtype(want[i])) : NULL;
        if (!g || !tt_close(__FILE__, __LINE__, g, want[i], tol, tol)) {
            tt_fail(__FILE__, __LINE__, "  in %s of %s", part_names[i], what);
            return false;
        }
    }
    return true;
}

/* ----------------------------------------------------------- values */

TEST(fused_forward_and_gradients_match_the_formula_in_float64) {
    /* d = 40 and 33 leave a tail after the 16-wide lanes; d = 1 normalises
     * every row to 0; a 1-D input is one row; 3000 rows make two chunks of
     * many blocks for dweight and dbias. */
    static const struct {
        int ndim;
        int64_t sizes[3];
    } shapes[] = {{2, {6, 40}}, {3, {2, 3, 33}}, {2, {5, 1}},
                  {1, {40}},    {2, {4, 16}},    {2, {3000, 20}}};
    static const double tol[] = {[CT_FLOAT32] = 2e-5, [CT_FLOAT64] = 1e-12};
    uint64_t seed = 10;
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int nd = shapes[s].ndim;
        const int64_t *sz = shapes[s].sizes;
        int64_t d = sz[nd - 1];
        ct_tensor *x = ct_add_scalar(ct_mul_scalar(tt_rand(nd, sz, CT_FLOAT64, seed++), 3), 1);
        ct_tensor *w = tt_rand(1, &d, CT_FLOAT64, seed++), *b = tt_rand(1, &d, CT_FLOAT64, seed++);
        ct_tensor *g = tt_rand(nd, sz, CT_FLOAT64, seed++);
        for (int wb = 0; wb < 4; wb++) {
            ct_tensor *wi = wb & 1 ? w : NULL, *bi = wb & 2 ? b : NULL;
            ct_tensor *want[4], *got[4];
            if (!run_ln(composed, x, wi, bi, g, want))
                return;
            ct_dtype dts[] = {CT_FLOAT64, CT_FLOAT32};
            for (int k = 0; k < 2; k++) {
                ct_dtype dt = dts[k];
                if (!run_ln(ct_layer_norm, ct_to_dtype(x, dt), wi ? ct_to_dtype(wi, dt) : NULL,
                            bi ? ct_to_dtype(bi, dt) : NULL, ct_to_dtype(g, dt), got))
                    return;
                ASSERT_EQ(ct_tensor_dtype(got[0]), dt);
                char what[96];
                snprintf(what, sizeof what, "%s shape %zu, weight %d, bias %d", ct_dtype_name(dt),
                         s, wb & 1, wb >> 1);
                if (!parts_close(got, want, tol[dt], what))
                    return;
            }
        }
    }
}

/* Rows far from zero next to their spread: the variance taken about the
 * mean keeps float32 accurate, where E[x^2] - E[x]^2 in float would be off
 * by about 1%. */
TEST(rows_with_a_large_mean_stay_accurate_in_float32) {
    ct_tensor *x = ct_add_scalar(tt_rand(CT_SHAPE(8, 256), CT_FLOAT64, 30), 300);
    ct_tensor *x32 = ct_to_dtype(x, CT_FLOAT32);
    ct_tensor *want = composed(ct_to_dtype(x32, CT_FLOAT64), NULL, NULL, EPS);
    ASSERT_CLOSE(ct_to_dtype(ct_layer_norm(x32, NULL, NULL, EPS), CT_FLOAT64), want, 0, 1e-4);
}

static ct_tensor *f_layer_norm(void *ctx, ct_tensor *const *x, int n) {
    const int *wb = ctx;
    int i = 1;
    ct_tensor *w = *wb & 1 ? x[i++] : NULL, *b = *wb & 2 ? x[i] : NULL;
    return ct_layer_norm(x[0], w, b, EPS);
}

TEST(gradcheck_passes_on_views_with_any_weight_and_bias) {
    ct_tensor *x = ct_mul_scalar(tt_rand(CT_SHAPE(2, 3, 7), CT_FLOAT64, 40), 2);
    for (int wb = 0; wb < 4; wb++) {
        tt_layout layout = wb % 2 ? TT_STRIDED : TT_TRANSPOSED;
        ct_tensor *in[3] = {ct_requires_grad_(tt_layout_of(x, layout), true)};
        int n = 1;
        if (wb & 1)
            in[n++] = ct_requires_grad_(tt_rand(CT_SHAPE(7), CT_FLOAT64, 41), true);
        if (wb & 2)
            in[n++] = ct_requires_grad_(tt_rand(CT_SHAPE(7), CT_FLOAT64, 42), true);
        if (ct_gradcheck(f_layer_norm, &wb, in, n, NULL) != 0) {
            tt_fail(__FILE__, __LINE__, "weight %d, bias %d, %s x: %s", wb & 1, wb >> 1,
                    tt_layout_name(layout), ct_errmsg());
            return;
        }
    }
}

/* dx of sum(layer_norm(x, w, b) * c) with create_graph: gradcheck of it
 * checks the second derivatives, which run through the backward's ops
 * form. */
static ct_tensor *f_layer_norm_dx(void *ctx, ct_tensor *const *x, int n) {
    ct_tensor *y = f_layer_norm(ctx, x, n), *dx = NULL;
    ct_tensor *c = tt_rand(CT_SHAPE(4, 6), CT_FLOAT64, 51);
    ct_tensor *loss = ct_sum(ct_mul(y, c), NULL, 0, false);
    ct_grad_options go = {.create_graph = true};
    return loss && !ct_grad(&loss, 1, NULL, x, 1, &dx, &go) ? dx : NULL;
}

TEST(gradients_can_be_differentiated_again) {
    int wb = 3;
    ct_tensor *in[3] = {ct_requires_grad_(tt_rand(CT_SHAPE(4, 6), CT_FLOAT64, 50), true),
                        ct_requires_grad_(tt_rand(CT_SHAPE(6), CT_FLOAT64, 52), true),
                        ct_requires_grad_(tt_rand(CT_SHAPE(6), CT_FLOAT64, 53), true)};
    ASSERT_EQ(ct_gradcheck(f_layer_norm_dx, &wb, in, 3, NULL), 0);
}

/* ----------------------------------------------------------- layouts */

TEST(views_give_the_bits_of_their_contiguous_copy) {
    ct_tensor *x = tt_rand(CT_SHAPE(5, 3, 24), CT_FLOAT32, 60);
    ct_tensor *w = tt_rand(CT_SHAPE(24), CT_FLOAT32, 61),
              *b = tt_rand(CT_SHAPE(24), CT_FLOAT32, 62);
    ct_tensor *g = tt_rand(CT_SHAPE(5, 3, 24), CT_FLOAT32, 63);
    ct_tensor *want[4], *got[4];
    if (!run_ln(ct_layer_norm, x, w, b, g, want))
        return;
    for (int l = TT_TRANSPOSED; l < TT_NLAYOUTS; l++) {
        ct_tensor *xv = tt_layout_of(x, (tt_layout)l), *gv = tt_layout_of(g, (tt_layout)l);
        if (!run_ln(ct_layer_norm, xv, tt_layout_of(w, (tt_layout)l), b, gv, got) ||
            !parts_close(got, want, 0, tt_layout_name((tt_layout)l)))
            return;
    }
    /* A slice along the normalised dim. */
    ct_tensor *xs = ct_slice(x, 2, 0, 24, 2), *gs = ct_slice(g, 2, 0, 24, 2);
    ct_tensor *ws = ct_slice(w, 0, 0, 24, 2), *bs = ct_slice(b, 0, 0, 24, 2);
    if (!run_ln(ct_layer_norm, ct_contiguous(xs), ct_contiguous(ws), ct_contiguous(bs),
                ct_contiguous(gs), want) ||
        !run_ln(ct_layer_norm, xs, ws, bs, gs, got))
        return;
    parts_close(got, want, 0, "every other element of the last dim");
}

/* ------------------------------------------------------------ dtypes */

/* bfloat16 and float16 compute through float32: the result is the float32
 * one rounded, bit for bit. */
TEST(sixteen_bit_inputs_round_the_float32_result) {
    ct_dtype halves[] = {CT_BFLOAT16, CT_FLOAT16};
    for (int h = 0; h < 2; h++) {
        ct_dtype dt = halves[h];
        ct_tensor *x = tt_rand(CT_SHAPE(3, 4, 20), dt, 70),
                  *g = tt_rand(CT_SHAPE(3, 4, 20), dt, 71);
        ct_tensor *w = tt_rand(CT_SHAPE(20), dt, 72), *b = tt_rand(CT_SHAPE(20), dt, 73);
        ct_tensor *got[4], *want[4];
        if (!run_ln(ct_layer_norm, x, w, b, g, got) ||
            !run_ln(ct_layer_norm, ct_to_dtype(x, CT_FLOAT32), ct_to_dtype(w, CT_FLOAT32),
                    ct_to_dtype(b, CT_FLOAT32), ct_to_dtype(g, CT_FLOAT32), want))
            return;
        for (int i = 0; i < 4; i++) {
            ASSERT_EQ(ct_tensor_dtype(got[i]), dt);
            want[i] = ct_to_dtype(want[i], dt);
        }
        if (!parts_close(got, want, 0, ct_dtype_name(dt)))
            return;
    }
}

/* A weight of another dtype promotes: the composed ops handle it. */
TEST(mixed_dtypes_promote_through_the_composed_ops) {
    ct_tensor *x = tt_rand(CT_SHAPE(4, 9), CT_FLOAT32, 80),
              *w = tt_rand(CT_SHAPE(9), CT_FLOAT64, 81);
    ct_tensor *g = tt_rand(CT_SHAPE(4, 9), CT_FLOAT64, 82);
    ct_tensor *got[4], *want[4];
    if (!run_ln(ct_layer_norm, x, w, NULL, g, got) ||
        !run_ln(composed, ct_to_dtype(x, CT_FLOAT64), w, NULL, g, want))
        return;
    ASSERT_EQ(ct_tensor_dtype(got[0]), CT_FLOAT64);
    ASSERT_EQ(ct_tensor_dtype(got[1]), CT_FLOAT32);
    parts_close(got, want, 1e-5, "float32 x with a float64 weight");
}

/* ------------------------------------------------------- edge cases */

TEST(empty_inputs_give_empty_outputs_and_zero_parameter_gradients) {
    ct_tensor *w = tt_rand(CT_SHAPE(8), CT_FLOAT32, 90), *b = tt_rand(CT_SHAPE(8), CT_FLOAT32, 91);
    ct_tensor *got[4];
    if (!run_ln(ct_layer_norm, ct_empty(CT_SHAPE(0, 8), CT_FLOAT32), w, b,
                ct_empty(CT_SHAPE(0, 8), CT_FLOAT32), got))
        return;
    ASSERT_EQ(ct_numel(got[0]), 0);
    ASSERT_EQ(ct_size(got[0], 1), 8);
    ASSERT_EQ(ct_numel(got[1]), 0);
    ASSERT_CLOSE(got[2], ct_zeros(CT_SHAPE(8), CT_FLOAT32), 0, 0);
    ASSERT_CLOSE(got[3], ct_zeros(CT_SHAPE(8), CT_FLOAT32), 0, 0);
    /* Rows of no elements. */
    if (!run_ln(ct_layer_norm, ct_empty(CT_SHAPE(3, 0), CT_FLOAT64),
                ct_empty(CT_SHAPE(0), CT_FLOAT64), NULL, ct_empty(CT_SHAPE(3, 0), CT_FLOAT64), got))
        return;
    ASSERT_EQ(ct_size(got[0], 0), 3);
    ASSERT_EQ(ct_numel(got[1]) + ct_numel(got[2]), 0);
}

/* Rows are split across threads and dweight and dbias summed in fixed
 * chunks, so 1 and 2 threads agree bit for bit. The shape splits both. */
TEST(results_do_not_depend_on_the_thread_count) {
    ct_dtype dts[] = {CT_FLOAT32, CT_FLOAT64};
    int before = ct_get_num_threads();
    for (int k = 0; k < 2; k++) {
        ct_tensor *x = tt_rand(CT_SHAPE(700, 200), dts[k], 100);
        ct_tensor *g = tt_rand(CT_SHAPE(700, 200), dts[k], 101);
        ct_tensor *w = tt_rand(CT_SHAPE(200), dts[k], 102),
                  *b = tt_rand(CT_SHAPE(200), dts[k], 103);
        ct_tensor *one[4], *two[4];
        ct_set_num_threads(1);
        bool ok = run_ln(ct_layer_norm, x, w, b, g, one);
        ct_set_num_threads(2);
        ok = ok && run_ln(ct_layer_norm, x, w, b, g, two);
        ct_set_num_threads(before);
        if (!ok || !parts_close(two, one, 0, ct_dtype_name(dts[k])))
            return;
    }
}

/* ------------------------------------------------------------ errors */

TEST(bad_shapes_and_eps_fail_with_the_shapes) {
    ct_tensor *x = tt_rand(CT_SHAPE(2, 6), CT_FLOAT32, 110), *w = ct_ones(CT_SHAPE(6), CT_FLOAT32);
    ASSERT_FAILS(ct_layer_norm(x, ct_ones(CT_SHAPE(5), CT_FLOAT32), NULL, EPS), CT_ESHAPE,
                 "layer_norm", "float32[2, 6]", "[6]");
    ASSERT_FAILS(ct_layer_norm(x, w, ct_ones(CT_SHAPE(2, 6), CT_FLOAT32), EPS), CT_ESHAPE,
                 "layer_norm", "[6]");
    ASSERT_FAILS(ct_layer_norm(x, w, NULL, -1), CT_ESHAPE, "eps >= 0", "-1");
    ASSERT_FAILS(ct_layer_norm(ct_scalar(1, CT_FLOAT32), NULL, NULL, EPS), CT_ESHAPE, "layer_norm",
                 "float32[]");
    ASSERT_TRUE(ct_layer_norm(NULL, w, NULL, EPS) == NULL);
}
