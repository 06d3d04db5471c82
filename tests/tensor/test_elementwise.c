/* Unary and binary elementwise ops, where and masked_fill, checked against
 * plain reference loops in double on every layout. */
#include "ct_test.h"

static const ct_dtype float_dtypes[] = {CT_FLOAT32, CT_FLOAT64, CT_BFLOAT16, CT_FLOAT16};

static double tol_for(ct_dtype d) {
    switch (d) {
    case CT_FLOAT64: return 1e-12;
    case CT_FLOAT32: return 2e-6;
    case CT_FLOAT16: return 2e-3;
    case CT_BFLOAT16: return 1.6e-2;
    default: return 0;
    }
}

/* Rounds a double to what dtype d stores, so that references see the same
 * input the kernel did. */
static double round_to(ct_dtype d, double v) {
    ct_tensor *s = ct_to_dtype(ct_scalar(v, CT_FLOAT64), d);
    return ct_item(s);
}

static double r_neg(double x) { return -x; }
static double r_relu(double x) { return isnan(x) ? x : x > 0 ? x : 0; }
static double r_rsqrt(double x) { return 1 / sqrt(x); }
static double r_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double r_gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2.0))); }
static double r_gelu_tanh(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double r_silu(double x) { return x / (1 + exp(-x)); }

typedef struct unary_case {
    const char *name;
    ct_tensor *(*fn)(ct_tensor *);
    ct_tensor *(*fn_)(ct_tensor *);
    double (*ref)(double);
    bool keeps_int;
} unary_case;

static const unary_case unary_cases[] = {
    {"neg", ct_neg, ct_neg_, r_neg, true},
    {"abs", ct_abs, ct_abs_, fabs, true},
    {"exp", ct_exp, ct_exp_, exp, false},
    {"log", ct_log, ct_log_, log, false},
    {"log1p", ct_log1p, ct_log1p_, log1p, false},
    {"sqrt", ct_sqrt, ct_sqrt_, sqrt, false},
    {"rsqrt", ct_rsqrt, ct_rsqrt_, r_rsqrt, false},
    {"sin", ct_sin, ct_sin_, sin, false},
    {"cos", ct_cos, ct_cos_, cos, false},
    {"tanh", ct_tanh, ct_tanh_, tanh, false},
    {"sigmoid", ct_sigmoid, ct_sigmoid_, r_sigmoid, false},
    {"relu", ct_relu, ct_relu_, r_relu, true},
    {"gelu", ct_gelu, ct_gelu_, r_gelu, false},
    {"gelu_tanh", ct_gelu_tanh, ct_gelu_tanh_, r_gelu_tanh, false},
    {"silu", ct_silu, ct_silu_, r_silu, false},
};

static const struct {
    int ndim;
    int64_t sizes[3];
} shapes[] = {{1, {17}}, {2, {4, 17}}, {3, {2, 3, 5}}, {2, {0, 3}},
              {1, {1}},  {0, {0}},     {1, {1023}},    {2, {1, 1}}};
#define NSHAPES (int)(sizeof shapes / sizeof *shapes)

/* out[i] == ref(in[i]) for every element, within tol relative to the
 * magnitude of the reference (and absolutely near zero). */
static bool check_unary(const char *what, ct_tensor *in, ct_tensor *out, double (*ref)(double),
                        ct_dtype out_dtype, double tol) {
    if (!out) {
        tt_fail(__FILE__, __LINE__, "%s returned NULL: %s", what, ct_errmsg());
        return false;
    }
    if (ct_tensor_dtype(out) != out_dtype) {
        tt_fail(__FILE__, __LINE__, "%s: dtype %s, want %s", what,
                ct_dtype_name(ct_tensor_dtype(out)), ct_dtype_name(out_dtype));
        return false;
    }
    for (int64_t i = 0; i < ct_numel(in); i++) {
        double want = round_to(out_dtype, ref(tt_at(in, i))), got = tt_at(out, i);
        if ((isnan(want) && isnan(got)) || want == got)
            continue;
        if (!(fabs(got - want) <= tol * (1 + fabs(want)))) {
            tt_fail(__FILE__, __LINE__, "%s: element %lld of f(%.9g): got %.9g, want %.9g", what,
                    (long long)i, tt_at(in, i), got, want);
            return false;
        }
    }
    return true;
}

TEST(unary_ops_match_reference_on_every_layout_and_dtype) {
    for (size_t c = 0; c < sizeof unary_cases / sizeof *unary_cases; c++) {
        const unary_case *u = &unary_cases[c];
        for (size_t d = 0; d < 4; d++) {
            ct_dtype dt = float_dtypes[d];
            for (int s = 0; s < NSHAPES; s++) {
                for (int l = 0; l < TT_NLAYOUTS; l++) {
                    ct_scope_begin();
                    ct_tensor *base = tt_rand(shapes[s].ndim, shapes[s].sizes, dt, c * 100 + s);
                    ct_tensor *in = tt_layout_of(base, (tt_layout)l);
                    char what[96];
                    snprintf(what, sizeof what, "%s %s %s shape#%d", u->name, ct_dtype_name(dt),
                             tt_layout_name((tt_layout)l), s);
                    bool ok = check_unary(what, in, u->fn(in), u->ref, dt, tol_for(dt));
                    ct_scope_end();
                    if (!ok)
                        return;
                }
            }
        }
    }
}

TEST(unary_in_place_writes_its_input) {
    for (size_t c = 0; c < sizeof unary_cases / sizeof *unary_cases; c++) {
        ct_tensor *x = tt_layout_of(tt_rand(CT_SHAPE(5, 7), CT_FLOAT32, c), TT_TRANSPOSED);
        ct_tensor *want = unary_cases[c].fn(x);
        uint64_t v = ct_tensor_version(x);
        ASSERT_TRUE(unary_cases[c].fn_(x) == x);
        ASSERT_EQ(ct_tensor_version(x), v + 1);
        ASSERT_CLOSE(x, want, 0, 0);
    }
}

TEST(unary_ops_on_integers) {
    ct_tensor *i32 = tt_rand(CT_SHAPE(3, 17), CT_INT32, 5);
    for (size_t c = 0; c < sizeof unary_cases / sizeof *unary_cases; c++) {
        const unary_case *u = &unary_cases[c];
        ct_dtype want = u->keeps_int ? CT_INT32 : CT_FLOAT32;
        char what[64];
        snprintf(what, sizeof what, "%s int32", u->name);
        if (!check_unary(what, i32, u->fn(i32), u->ref, want, u->keeps_int ? 0 : 2e-6))
            return;
        if (!u->keeps_int)
            ASSERT_FAILS(u->fn_(ct_clone(i32)), CT_EDTYPE, u->name, "int32[3, 17]");
    }
    ASSERT_FAILS(ct_neg(ct_ones(CT_SHAPE(2), CT_BOOL)), CT_EDTYPE, "neg", "bool");
    /* INT64_MIN wraps instead of overflowing. */
    ct_tensor *m = ct_full(CT_SHAPE(1), -9223372036854775807.0 - 1.0, CT_INT64);
    ASSERT_TRUE(ct_item_int64(ct_neg(m)) == INT64_MIN);
}

TEST(pow_scalar_and_clamp) {
    ct_tensor *x = tt_layout_of(tt_rand(CT_SHAPE(4, 17), CT_FLOAT32, 9), TT_STRIDED);
    for (double e = -2; e <= 3; e += 0.5) {
        ct_tensor *p = ct_pow_scalar(x, e);
        for (int64_t i = 0; i < ct_numel(x); i++) {
            double want = pow(tt_at(x, i), e), got = tt_at(p, i);
            if (!(isnan(want) && isnan(got)))
                ASSERT_NEAR(got, want, 2e-6 * (1 + fabs(want)) + (isinf(want) ? INFINITY : 0));
        }
    }
    ct_tensor *xi = tt_rand(CT_SHAPE(17), CT_INT64, 3);
    ct_tensor *sq = ct_pow_scalar(xi, 2);
    ASSERT_EQ(ct_tensor_dtype(sq), CT_INT64);
    ASSERT_EQ(ct_tensor_dtype(ct_pow_scalar(xi, 0.5)), CT_FLOAT32);
    ASSERT_EQ(ct_tensor_dtype(ct_pow_scalar(xi, -1)), CT_FLOAT32);
    for (int64_t i = 0; i < 17; i++)
        ASSERT_EQ(tt_at(sq, i), tt_at(xi, i) * tt_at(xi, i));

    ct_tensor *c = ct_clamp(x, -0.5, 1.25);
    for (int64_t i = 0; i < ct_numel(x); i++)
        ASSERT_NEAR(tt_at(c, i), fmin(fmax(tt_at(x, i), -0.5), 1.25), 1e-7);
    ct_tensor *lo_only = ct_clamp(x, 0, INFINITY);
    ASSERT_CLOSE(lo_only, ct_relu(x), 0, 0);
    /* lo > hi: every element becomes hi, as in PyTorch. */
    ct_tensor *inverted = ct_clamp(x, 1, -1);
    for (int64_t i = 0; i < ct_numel(x); i++)
        ASSERT_NEAR(tt_at(inverted, i), -1, 0);
    ct_tensor *ci = ct_clamp(xi, -2.5, 2.5);
    for (int64_t i = 0; i < 17; i++)
        ASSERT_EQ(tt_at(ci, i), fmin(fmax(tt_at(xi, i), -2), 2));
    ct_tensor *n = ct_clamp(ct_scalar(NAN, CT_FLOAT32), 0, 1);
    ASSERT_TRUE(isnan(ct_item(n)));
}

typedef struct binary_case {
    const char *name;
    ct_tensor *(*fn)(ct_tensor *, ct_tensor *);
    ct_tensor *(*fn_)(ct_tensor *, ct_tensor *);
    ct_tensor *(*fn_scalar)(ct_tensor *, double);
    bool compare;
    int op; /* index into ref_binary */
} binary_case;

static int64_t ref_int_pow(int64_t x, int64_t e) {
    if (e < 0)
        return x == 1 ? 1 : x == -1 ? (e & 1 ? -1 : 1) : 0;
    int64_t r = 1;
    while (e-- > 0)
        r *= x;
    return r;
}

static double ref_binary(int op, double x, double y, bool integral) {
    switch (op) {
    case 0: return x + y;
    case 1: return x - y;
    case 2: return x * y;
    case 3: return x / y;
    case 4: return integral ? (double)ref_int_pow((int64_t)x, (int64_t)y) : pow(x, y);
    case 5: return isnan(x) || isnan(y) ? NAN : fmax(x, y);
    case 6: return isnan(x) || isnan(y) ? NAN : fmin(x, y);
    case 7: return x == y;
    case 8: return x != y;
    case 9: return x < y;
    case 10: return x <= y;
    case 11: return x > y;
    default: return x >= y;
    }
}

static const binary_case binary_cases[] = {
    {"add", ct_add, ct_add_, ct_add_scalar, false, 0},
    {"sub", ct_sub, ct_sub_, ct_sub_scalar, false, 1},
    {"mul", ct_mul, ct_mul_, ct_mul_scalar, false, 2},
    {"div", ct_div, ct_div_, ct_div_scalar, false, 3},
    {"pow", ct_pow, ct_pow_, ct_pow_scalar, false, 4},
    {"maximum", ct_maximum, ct_maximum_, ct_maximum_scalar, false, 5},
    {"minimum", ct_minimum, ct_minimum_, ct_minimum_scalar, false, 6},
    {"eq", ct_eq, ct_eq_, ct_eq_scalar, true, 7},
    {"ne", ct_ne, ct_ne_, ct_ne_scalar, true, 8},
    {"lt", ct_lt, ct_lt_, ct_lt_scalar, true, 9},
    {"le", ct_le, ct_le_, ct_le_scalar, true, 10},
    {"gt", ct_gt, ct_gt_, ct_gt_scalar, true, 11},
    {"ge", ct_ge, ct_ge_, ct_ge_scalar, true, 12},
};
#define NBINARY (int)(sizeof binary_cases / sizeof *binary_cases)

static const struct {
    int na, nb;
    int64_t a[3], b[3];
} bshapes[] = {
    {2, 2, {4, 5}, {4, 5}},    {2, 1, {4, 5}, {5}},       {2, 2, {4, 1}, {1, 5}},
    {3, 2, {3, 1, 5}, {4, 1}}, {0, 1, {0}, {3}},          {2, 2, {0, 3}, {1, 3}},
    {1, 1, {17}, {17}},        {2, 1, {2, 1023}, {1023}}, {1, 1, {1}, {1}},
};
#define NBSHAPES (int)(sizeof bshapes / sizeof *bshapes)

/* Checks got == op(a, b) elementwise with broadcasting, computed in double
 * from the operands converted to the compute dtype. */
static bool check_binary(const char *what, const binary_case *bc, ct_tensor *a, ct_tensor *b,
                         ct_tensor *got, ct_dtype compute) {
    if (!got) {
        tt_fail(__FILE__, __LINE__, "%s returned NULL: %s", what, ct_errmsg());
        return false;
    }
    ct_dtype want_dt = bc->compare ? CT_BOOL : compute;
    if (ct_tensor_dtype(got) != want_dt) {
        tt_fail(__FILE__, __LINE__, "%s: dtype %s, want %s", what,
                ct_dtype_name(ct_tensor_dtype(got)), ct_dtype_name(want_dt));
        return false;
    }
    int nd = ct_ndim(got);
    double tol = bc->compare ? 0 : tol_for(compute);
    for (int64_t i = 0; i < ct_numel(got); i++) {
        int64_t idx[CT_MAX_DIMS];
        tt_unravel(i, nd, ct_sizes(got), idx);
        double x = round_to(compute, tt_at_bcast(a, nd, idx));
        double y = round_to(compute, tt_at_bcast(b, nd, idx));
        double want = ref_binary(bc->op, x, y, !ct_dtype_is_float(compute));
        if (!bc->compare)
            want = round_to(compute, want);
        double g = tt_at(got, i);
        if ((isnan(want) && isnan(g)) || want == g)
            continue;
        if (!(fabs(g - want) <= tol * (1 + fabs(want)))) {
            tt_fail(__FILE__, __LINE__, "%s: element %lld of f(%.9g, %.9g): got %.9g, want %.9g",
                    what, (long long)i, x, y, g, want);
            return false;
        }
    }
    return true;
}

TEST(binary_ops_broadcast_on_every_layout) {
    static const ct_dtype dts[] = {CT_FLOAT32, CT_FLOAT64, CT_BFLOAT16, CT_FLOAT16,
                                   CT_INT32,   CT_INT64,   CT_UINT8};
    for (int c = 0; c < NBINARY; c++) {
        const binary_case *bc = &binary_cases[c];
        for (size_t d = 0; d < sizeof dts / sizeof *dts; d++) {
            ct_dtype dt = dts[d];
            for (int s = 0; s < NBSHAPES; s++) {
                for (int l = 0; l < TT_NLAYOUTS; l++) {
                    ct_scope_begin();
                    ct_tensor *a =
                        tt_layout_of(tt_rand(bshapes[s].na, bshapes[s].a, dt, s + 1), (tt_layout)l);
                    ct_tensor *b = tt_layout_of(tt_rand(bshapes[s].nb, bshapes[s].b, dt, s + 50),
                                                (tt_layout)((l + 1) % TT_NLAYOUTS));
                    char what[96];
                    snprintf(what, sizeof what, "%s %s %s shape#%d", bc->name, ct_dtype_name(dt),
                             tt_layout_name((tt_layout)l), s);
                    ct_dtype compute = bc->op == 3 && !ct_dtype_is_float(dt) ? CT_FLOAT32 : dt;
                    bool ok = check_binary(what, bc, a, b, bc->fn(a, b), compute);
                    ct_scope_end();
                    if (!ok)
                        return;
                }
            }
        }
    }
}

TEST(binary_ops_promote_mixed_dtypes) {
    ct_tensor *i = tt_rand(CT_SHAPE(3, 4), CT_INT32, 1);
    ct_tensor *f = tt_layout_of(tt_rand(CT_SHAPE(4), CT_FLOAT32, 2), TT_STRIDED);
    ct_tensor *h = tt_rand(CT_SHAPE(3, 1), CT_FLOAT16, 3);
    ct_tensor *bf = tt_rand(CT_SHAPE(4), CT_BFLOAT16, 4);
    ct_tensor *b = tt_rand(CT_SHAPE(3, 4), CT_BOOL, 5);
    for (int c = 0; c < NBINARY; c++) {
        const binary_case *bc = &binary_cases[c];
        if (!check_binary(bc->name, bc, i, f, bc->fn(i, f), CT_FLOAT32) ||
            !check_binary(bc->name, bc, h, bf, bc->fn(h, bf), CT_FLOAT32) ||
            !check_binary(bc->name, bc, b, i, bc->fn(b, i), bc->op == 3 ? CT_FLOAT32 : CT_INT32))
            return;
    }
    ASSERT_EQ(ct_tensor_dtype(ct_add(b, b)), CT_BOOL);
    ASSERT_FAILS(ct_sub(b, b), CT_EDTYPE, "sub", "bool");
}

TEST(scalar_forms_keep_the_tensor_dtype) {
    ct_tensor *f16 = tt_rand(CT_SHAPE(2, 17), CT_FLOAT16, 1);
    ct_tensor *i64 = tt_rand(CT_SHAPE(2, 17), CT_INT64, 2);
    ct_tensor *bl = tt_rand(CT_SHAPE(5), CT_BOOL, 3);
    for (int c = 0; c < NBINARY; c++) {
        const binary_case *bc = &binary_cases[c];
        if (bc->op == 4)
            continue; /* pow's scalar form is covered by pow_scalar_and_clamp */
        ct_tensor *s = ct_scalar(1.5, CT_FLOAT64), *w = ct_scalar(3, CT_FLOAT64);
        ct_dtype int_compute = bc->op == 3 ? CT_FLOAT32 : CT_INT64;
        if (!check_binary(bc->name, bc, f16, s, bc->fn_scalar(f16, 1.5), CT_FLOAT16) ||
            !check_binary(bc->name, bc, i64, w, bc->fn_scalar(i64, 3), int_compute) ||
            !check_binary(bc->name, bc, i64, s, bc->fn_scalar(i64, 1.5), CT_FLOAT32) ||
            !check_binary(bc->name, bc, bl, w, bc->fn_scalar(bl, 3), int_compute))
            return;
    }
}

TEST(binary_in_place) {
    ct_tensor *a = tt_layout_of(tt_rand(CT_SHAPE(4, 5), CT_FLOAT32, 1), TT_TRANSPOSED);
    ct_tensor *b = tt_rand(CT_SHAPE(5), CT_FLOAT32, 2);
    ct_tensor *want = ct_mul(a, b);
    ASSERT_TRUE(ct_mul_(a, b) == a);
    ASSERT_CLOSE(a, want, 0, 0);
    /* float32 += float64 computes and stores in float32's category. */
    ct_tensor *d = tt_rand(CT_SHAPE(4, 5), CT_FLOAT64, 3);
    ct_tensor *want2 = ct_to_dtype(ct_add(a, d), CT_FLOAT32);
    ASSERT_TRUE(ct_add_(a, d) == a);
    ASSERT_CLOSE(a, want2, 1e-6, 1e-6);
    /* Comparisons in place store 0/1 in the input's dtype. */
    ct_tensor *g = ct_clone(a);
    ct_gt_scalar_(g, 0);
    for (int64_t i = 0; i < 20; i++)
        ASSERT_EQ(tt_at(g, i), tt_at(a, i) > 0);
    /* Exact aliasing is fine. */
    ct_tensor *x = ct_arange(0, 6, 1, CT_FLOAT32);
    ct_add_(x, x);
    ASSERT_NEAR(ct_get(x, (int64_t[]){5}), 10, 0);
}

TEST(binary_errors_name_the_op_and_shapes) {
    ct_tensor *a = ct_zeros(CT_SHAPE(2, 3), CT_FLOAT32);
    ct_tensor *b = ct_zeros(CT_SHAPE(4), CT_FLOAT32);
    ASSERT_FAILS(ct_add(a, b), CT_ESHAPE, "add", "[2, 3]", "[4]");
    ASSERT_FAILS(ct_mul(a, NULL), CT_EINVAL, "mul", "NULL");
    ASSERT_FAILS(ct_add_(ct_zeros(CT_SHAPE(1, 3), CT_FLOAT32), a), CT_ESHAPE, "add_", "[2, 3]",
                 "[1, 3]");
    ct_tensor *e = ct_expand(ct_zeros(CT_SHAPE(1, 3), CT_FLOAT32), CT_SHAPE(2, 3));
    ASSERT_FAILS(ct_add_(e, a), CT_EINVAL, "add_", "expanded", "[2, 3]");
    ASSERT_FAILS(ct_add_(ct_zeros(CT_SHAPE(2, 3), CT_INT32), a), CT_EDTYPE, "add_", "float32",
                 "int32[2, 3]");
    ASSERT_FAILS(ct_add_scalar_(ct_zeros(CT_SHAPE(2), CT_INT64), 0.5), CT_EDTYPE, "add_scalar_");
    ct_tensor *r = ct_arange(0, 10, 1, CT_FLOAT32);
    ASSERT_FAILS(ct_add_(ct_slice(r, 0, 0, 9, 1), ct_slice(r, 0, 1, 10, 1)), CT_EINVAL, "add_",
                 "overlaps");
    ASSERT_FAILS(ct_eq(a, b), CT_ESHAPE, "eq", "[2, 3]", "[4]");
}

TEST(where_and_masked_fill) {
    for (int l = 0; l < TT_NLAYOUTS; l++) {
        ct_tensor *cond = tt_layout_of(tt_rand(CT_SHAPE(3, 1, 17), CT_BOOL, 1), (tt_layout)l);
        ct_tensor *a = tt_layout_of(tt_rand(CT_SHAPE(4, 17), CT_FLOAT16, 2), (tt_layout)l);
        ct_tensor *b = tt_rand(CT_SHAPE(1), CT_INT64, 3);
        ct_tensor *w = ct_where(cond, a, b);
        ASSERT_TRUE(w != NULL);
        ASSERT_EQ(ct_tensor_dtype(w), CT_FLOAT16);
        ASSERT_EQ(ct_numel(w), 3 * 4 * 17);
        for (int64_t i = 0; i < ct_numel(w); i++) {
            int64_t idx[3];
            tt_unravel(i, 3, ct_sizes(w), idx);
            double want = tt_at_bcast(cond, 3, idx) ? tt_at_bcast(a, 3, idx) : tt_at(b, 0);
            ASSERT_EQ(tt_at(w, i), want);
        }
        ct_tensor *mask = tt_layout_of(tt_rand(CT_SHAPE(17), CT_BOOL, 4), (tt_layout)l);
        ct_tensor *m = ct_masked_fill(a, mask, -7.5);
        for (int64_t i = 0; i < ct_numel(m); i++)
            ASSERT_EQ(tt_at(m, i), tt_at(mask, i % 17) ? -7.5 : tt_at(a, i));
        ct_tensor *a2 = ct_clone(a);
        ASSERT_TRUE(ct_masked_fill_(a2, mask, -7.5) == a2);
        ASSERT_CLOSE(a2, m, 0, 0);
    }
    ct_tensor *f = ct_zeros(CT_SHAPE(2, 3), CT_FLOAT32);
    ASSERT_FAILS(ct_where(f, f, f), CT_EDTYPE, "where", "bool");
    ASSERT_FAILS(ct_masked_fill(f, ct_ones(CT_SHAPE(4), CT_BOOL), 1), CT_ESHAPE, "masked_fill",
                 "[4]", "[2, 3]");
    ASSERT_FAILS(ct_masked_fill(f, ct_ones(CT_SHAPE(3, 2, 3), CT_BOOL), 1), CT_ESHAPE,
                 "masked_fill", "[3, 2, 3]");
}

TEST(results_do_not_depend_on_the_thread_count) {
    ct_tensor *a = tt_rand(CT_SHAPE(300, 1000), CT_FLOAT32, 1);
    ct_tensor *b = tt_layout_of(tt_rand(CT_SHAPE(1000), CT_FLOAT32, 2), TT_STRIDED);
    ct_set_num_threads(1);
    ct_tensor *r1 = ct_gelu(ct_add(ct_transpose(a, 0, 1), ct_unsqueeze(b, 1)));
    ct_set_num_threads(2);
    ct_tensor *r2 = ct_gelu(ct_add(ct_transpose(a, 0, 1), ct_unsqueeze(b, 1)));
    ASSERT_CLOSE(r1, r2, 0, 0);
}

TEST(special_values_of_the_vectorised_float_functions) {
    static const float xs[] = {0.0f,   -0.0f,   1e-30f,  -1e-8f,   0.624f,    0.626f, -3.0f, 9.5f,
                               -20.0f, 1.414f,  1.415f,  -2.5f,    5.6f,      -5.7f,  88.7f, 89.0f,
                               -87.3f, -103.0f, -110.0f, INFINITY, -INFINITY, NAN};
    enum { N = sizeof xs / sizeof *xs };
    ct_tensor *x = ct_from_data(xs, CT_SHAPE(N), CT_FLOAT32);
    ct_tensor *e = ct_exp(x), *t = ct_tanh(x), *s = ct_sigmoid(x), *g = ct_gelu(x);
    ct_tensor *gtanh = ct_gelu_tanh(x);
    for (int i = 0; i < N; i++) {
        double v = xs[i];
        /* GELU's tanh form goes to its limits at both infinities. */
        double want_gt = isinf(v) ? (v > 0 ? v : 0) : (float)r_gelu_tanh(v);
        ASSERT_TRUE(isnan(v) ? isnan(tt_at(gtanh, i))
                             : tt_at(gtanh, i) == want_gt ||
                                   fabs(tt_at(gtanh, i) - want_gt) <= 4e-7 * fabs(want_gt) + 1e-37);
        double want_e = (float)exp(v), want_t = (float)tanh(v), want_s = (float)(1 / (1 + exp(-v)));
        double want_g = (float)(0.5 * v * erfc(-v / sqrt(2.0)));
        double ge = tt_at(e, i), gt = tt_at(t, i), gs = tt_at(s, i), gg = tt_at(g, i);
        if (isnan(v)) {
            ASSERT_TRUE(isnan(ge) && isnan(gt) && isnan(gs) && isnan(gg));
            continue;
        }
        if (isfinite(v))
            ASSERT_NEAR(gg, want_g, 4e-7 * fabs(want_g) + 1e-7);
        /* Within a few ulp, and exact at the saturated ends. */
        ASSERT_NEAR(ge, want_e, 4e-7 * fabs(want_e) + 1e-44);
        ASSERT_NEAR(gt, want_t, 2.5e-7 * fabs(want_t));
        ASSERT_NEAR(gs, want_s, 4e-7 * fabs(want_s) + 1e-44);
        ASSERT_TRUE(signbit(gt) == signbit(want_t));
    }
}
