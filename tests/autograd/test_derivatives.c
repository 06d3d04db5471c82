/* gradcheck over every differentiable op: float64 central differences
 * against the analytic gradient, with inputs in every layout (contiguous,
 * transposed, strided) and shapes that broadcast. */
#include "ct_test.h"

#include <ct/autograd.h>

typedef ct_tensor *(*op_fn)(ct_tensor *const *x);

/* How an input's random values are shaped before use. */
typedef enum domain {
    ANY,      /* [-2, 2) */
    POSITIVE, /* [0.5, 2.5) */
    AWAY,     /* |x| in [0.5, 2.5), either sign: away from kinks at 0 */
} domain;

typedef struct input_spec {
    int ndim;
    int64_t sizes[4];
    domain dom;
    bool grad; /* requires grad */
} input_spec;

typedef struct op_case {
    const char *name;
    op_fn fn;
    int n;
    input_spec in[3];
} op_case;

static ct_tensor *apply(void *ctx, ct_tensor *const *inputs, int n) {
    (void)n;
    return ((const op_case *)ctx)->fn(inputs);
}

static ct_tensor *make_input(const input_spec *s, tt_layout layout, uint64_t seed) {
    ct_tensor *x = tt_rand(s->ndim, s->sizes, CT_FLOAT64, seed);
    if (s->dom == POSITIVE)
        x = ct_add_scalar(ct_mul_scalar(x, 0.5), 1.5);
    else if (s->dom == AWAY)
        x = ct_mul(ct_add_scalar(ct_abs(ct_mul_scalar(x, 0.5)), 0.5),
                   ct_sub(ct_to_dtype(ct_ge_scalar(x, 0), CT_FLOAT64), ct_scalar(0.5, CT_FLOAT64)));
    x = ct_mul_scalar(x, s->dom == AWAY ? 2 : 1);
    x = tt_layout_of(x, layout);
    return s->grad ? ct_requires_grad_(x, true) : x;
}

static void check_case(const op_case *c) {
    for (int l = 0; l < TT_NLAYOUTS; l++) {
        ct_scope_begin();
        ct_tensor *x[3] = {NULL};
        for (int i = 0; i < c->n; i++)
            x[i] = make_input(&c->in[i], (tt_layout)l, 17 + 31 * (uint64_t)i);
        ct_errclear();
        int rc = ct_gradcheck(apply, (void *)c, x, c->n, NULL);
        if (rc)
            tt_fail(__FILE__, __LINE__, "%s (%s layout): %s", c->name, tt_layout_name((tt_layout)l),
                    ct_errmsg());
        ct_scope_end();
    }
}

#define S(...)                                                                                     \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), { __VA_ARGS__ }
#define X(...)                                                                                     \
    { S(__VA_ARGS__), ANY, true }
#define P(...)                                                                                     \
    { S(__VA_ARGS__), POSITIVE, true }
#define A(...)                                                                                     \
    { S(__VA_ARGS__), AWAY, true }
#define C(...)                                                                                     \
    { S(__VA_ARGS__), ANY, false }

/* ------------------------------------------------------------ unary */

#define UNARY(name)                                                                                \
    static ct_tensor *f_##name(ct_tensor *const *x) { return ct_##name(x[0]); }
UNARY(neg)
UNARY(abs)
UNARY(exp)
UNARY(log)
UNARY(log1p)
UNARY(sqrt)
UNARY(rsqrt)
UNARY(sin)
UNARY(cos)
UNARY(tanh)
UNARY(sigmoid)
UNARY(relu)
UNARY(gelu)
UNARY(gelu_tanh)
UNARY(silu)
static ct_tensor *f_pow_frac(ct_tensor *const *x) { return ct_pow_scalar(x[0], 2.5); }
static ct_tensor *f_pow_int(ct_tensor *const *x) { return ct_pow_scalar(x[0], 3); }
static ct_tensor *f_clamp(ct_tensor *const *x) { return ct_clamp(x[0], -1, 1); }

static const op_case unary_cases[] = {
    {"neg", f_neg, 1, {X(3, 4)}},
    {"abs", f_abs, 1, {A(3, 4)}},
    {"exp", f_exp, 1, {X(3, 4)}},
    {"log", f_log, 1, {P(3, 4)}},
    {"log1p", f_log1p, 1, {P(3, 4)}},
    {"sqrt", f_sqrt, 1, {P(3, 4)}},
    {"rsqrt", f_rsqrt, 1, {P(3, 4)}},
    {"sin", f_sin, 1, {X(3, 4)}},
    {"cos", f_cos, 1, {X(3, 4)}},
    {"tanh", f_tanh, 1, {X(3, 4)}},
    {"sigmoid", f_sigmoid, 1, {X(3, 4)}},
    {"relu", f_relu, 1, {A(3, 4)}},
    {"gelu", f_gelu, 1, {X(3, 4)}},
    {"gelu_tanh", f_gelu_tanh, 1, {X(3, 4)}},
    {"silu", f_silu, 1, {X(3, 4)}},
    {"pow_scalar 2.5", f_pow_frac, 1, {P(3, 4)}},
    {"pow_scalar 3", f_pow_int, 1, {X(3, 4)}},
    {"clamp", f_clamp, 1, {X(3, 4)}},
};

TEST(unary) {
    for (size_t i = 0; i < sizeof unary_cases / sizeof *unary_cases; i++)
        check_case(&unary_cases[i]);
}

/* The fused float32 gradients of the activations (float's own tanh, erf
 * and exp) against float64's, over the whole useful range. */
TEST(activation_gradients_in_float32) {
    op_fn fns[] = {f_gelu, f_gelu_tanh, f_silu};
    ct_tensor *x32 = ct_linspace(-12, 12, 4001, CT_FLOAT32);
    ct_tensor *g32 = ct_linspace(-2, 2, 4001, CT_FLOAT32);
    for (size_t i = 0; i < sizeof fns / sizeof *fns; i++) {
        ct_tensor *grads[2];
        ct_dtype dtypes[2] = {CT_FLOAT64, CT_FLOAT32};
        for (int d = 0; d < 2; d++) {
            ct_tensor *x = ct_requires_grad_(ct_to_dtype(ct_clone(x32), dtypes[d]), true);
            ct_tensor *y = fns[i](&x);
            ct_tensor *g = ct_to_dtype(g32, dtypes[d]);
            ASSERT_EQ(ct_backward(&y, 1, &g, false), 0);
            grads[d] = ct_tensor_grad(x);
        }
        ASSERT_CLOSE(ct_to_dtype(grads[1], CT_FLOAT64), grads[0], 2e-6, 2e-6);
    }
}

/* ----------------------------------------------------------- binary */

#define BINARY(name)                                                                               \
    static ct_tensor *f_##name(ct_tensor *const *x) { return ct_##name(x[0], x[1]); }
BINARY(add)
BINARY(sub)
BINARY(mul)
BINARY(div)
BINARY(pow)
BINARY(maximum)
BINARY(minimum)
BINARY(matmul)
static ct_tensor *f_add_s(ct_tensor *const *x) { return ct_add_scalar(x[0], 1.5); }
static ct_tensor *f_sub_s(ct_tensor *const *x) { return ct_sub_scalar(x[0], 1.5); }
static ct_tensor *f_mul_s(ct_tensor *const *x) { return ct_mul_scalar(x[0], -1.5); }
static ct_tensor *f_div_s(ct_tensor *const *x) { return ct_div_scalar(x[0], 3); }
static ct_tensor *f_max_s(ct_tensor *const *x) { return ct_maximum_scalar(x[0], 0.25); }
static ct_tensor *f_min_s(ct_tensor *const *x) { return ct_minimum_scalar(x[0], 0.25); }
static ct_tensor *f_square(ct_tensor *const *x) { return ct_mul(x[0], x[0]); }
static ct_tensor *f_where(ct_tensor *const *x) {
    return ct_where(ct_gt_scalar(x[2], 0), x[0], x[1]);
}
static ct_tensor *f_masked_fill(ct_tensor *const *x) {
    return ct_masked_fill(x[0], ct_gt_scalar(x[1], 0), 2.5);
}

static const op_case binary_cases[] = {
    {"add", f_add, 2, {X(3, 4), X(4)}},
    {"add 3-d broadcast", f_add, 2, {X(2, 1, 3), X(4, 1)}},
    {"sub", f_sub, 2, {X(3, 1), X(3, 4)}},
    {"mul", f_mul, 2, {X(3, 4), X(3, 1)}},
    {"mul one side", f_mul, 2, {X(3, 4), C(4)}},
    {"div", f_div, 2, {X(3, 4), A(4)}},
    {"pow", f_pow, 2, {P(3, 4), X(3, 1)}},
    {"maximum", f_maximum, 2, {X(3, 4), X(4)}},
    {"minimum", f_minimum, 2, {X(2, 3), X(2, 1)}},
    {"add_scalar", f_add_s, 1, {X(3, 4)}},
    {"sub_scalar", f_sub_s, 1, {X(3, 4)}},
    {"mul_scalar", f_mul_s, 1, {X(3, 4)}},
    {"div_scalar", f_div_s, 1, {X(3, 4)}},
    {"maximum_scalar", f_max_s, 1, {X(3, 4)}},
    {"minimum_scalar", f_min_s, 1, {X(3, 4)}},
    {"x * x (one input twice)", f_square, 1, {X(3, 4)}},
    {"where", f_where, 3, {X(3, 4), X(4), C(3, 1)}},
    {"masked_fill", f_masked_fill, 2, {X(3, 4), C(4)}},
};

TEST(binary) {
    for (size_t i = 0; i < sizeof binary_cases / sizeof *binary_cases; i++)
        check_case(&binary_cases[i]);
}

/* ------------------------------------------------------- reductions */

static ct_tensor *f_sum_all(ct_tensor *const *x) { return ct_sum(x[0], NULL, 0, false); }
static ct_tensor *f_sum_1(ct_tensor *const *x) { return ct_sum(x[0], CT_DIMS(1), false); }
static ct_tensor *f_sum_02k(ct_tensor *const *x) { return ct_sum(x[0], CT_DIMS(0, 2), true); }
static ct_tensor *f_mean(ct_tensor *const *x) { return ct_mean(x[0], CT_DIMS(-1), false); }
static ct_tensor *f_prod(ct_tensor *const *x) { return ct_prod(x[0], CT_DIMS(1), false); }
static ct_tensor *f_prod_zeros(ct_tensor *const *x) {
    /* Rows with no, one and two zeros. */
    double m[12] = {1, 1, 1, 1, 0, 1, 1, 1, 0, 1, 0, 1};
    ct_tensor *mask = ct_from_data(m, CT_SHAPE(3, 4), CT_FLOAT64);
    return ct_prod(ct_mul(x[0], mask), CT_DIMS(1), true);
}
static ct_tensor *f_amax(ct_tensor *const *x) { return ct_amax(x[0], CT_DIMS(0), false); }
static ct_tensor *f_amin(ct_tensor *const *x) { return ct_amin(x[0], NULL, 0, true); }
static ct_tensor *f_amax_ties(ct_tensor *const *x) {
    return ct_amax(ct_clamp(x[0], -INFINITY, 0.5), CT_DIMS(1), false);
}
static ct_tensor *f_var(ct_tensor *const *x) { return ct_var(x[0], CT_DIMS(1), 1, false); }
static ct_tensor *f_var_all(ct_tensor *const *x) { return ct_var(x[0], NULL, 0, 0, true); }
static ct_tensor *f_std(ct_tensor *const *x) { return ct_std(x[0], CT_DIMS(0), 1, true); }
static ct_tensor *f_lse(ct_tensor *const *x) { return ct_logsumexp(x[0], CT_DIMS(1), false); }
static ct_tensor *f_norm2(ct_tensor *const *x) { return ct_norm(x[0], 2, CT_DIMS(1), false); }
static ct_tensor *f_norm1(ct_tensor *const *x) { return ct_norm(x[0], 1, NULL, 0, false); }
static ct_tensor *f_norm3(ct_tensor *const *x) { return ct_norm(x[0], 3, CT_DIMS(0), true); }
static ct_tensor *f_norminf(ct_tensor *const *x) {
    return ct_norm(x[0], INFINITY, CT_DIMS(1), false);
}
static ct_tensor *f_max_dim(ct_tensor *const *x) { return ct_max_dim(x[0], 1, false, NULL); }
static ct_tensor *f_min_dim(ct_tensor *const *x) { return ct_min_dim(x[0], 0, true, NULL); }

static const op_case reduce_cases[] = {
    {"sum all", f_sum_all, 1, {X(3, 4)}},
    {"sum dim 1", f_sum_1, 1, {X(3, 4)}},
    {"sum dims 0,2 keepdim", f_sum_02k, 1, {X(2, 3, 4)}},
    {"mean", f_mean, 1, {X(3, 4)}},
    {"prod", f_prod, 1, {A(3, 4)}},
    {"prod with zeros", f_prod_zeros, 1, {A(3, 4)}},
    {"amax", f_amax, 1, {X(3, 4)}},
    {"amin all keepdim", f_amin, 1, {X(3, 4)}},
    {"amax with ties", f_amax_ties, 1, {X(3, 4)}},
    {"var", f_var, 1, {X(3, 4)}},
    {"var all, correction 0", f_var_all, 1, {X(3, 4)}},
    {"std", f_std, 1, {X(3, 4)}},
    {"logsumexp", f_lse, 1, {X(3, 4)}},
    {"norm 2", f_norm2, 1, {X(3, 4)}},
    {"norm 1", f_norm1, 1, {A(3, 4)}},
    {"norm 3", f_norm3, 1, {A(3, 4)}},
    {"norm inf", f_norminf, 1, {X(3, 4)}},
    {"max_dim", f_max_dim, 1, {X(3, 4)}},
    {"min_dim keepdim", f_min_dim, 1, {X(3, 4)}},
};

TEST(reductions) {
    for (size_t i = 0; i < sizeof reduce_cases / sizeof *reduce_cases; i++)
        check_case(&reduce_cases[i]);
}

/* ------------------------------------------------ matmul and softmax */

static ct_tensor *f_softmax(ct_tensor *const *x) { return ct_softmax(x[0], 1); }
static ct_tensor *f_softmax0(ct_tensor *const *x) { return ct_softmax(x[0], 0); }
static ct_tensor *f_log_softmax(ct_tensor *const *x) { return ct_log_softmax(x[0], -1); }

static const op_case matmul_cases[] = {
    {"matmul 2-d", f_matmul, 2, {X(3, 4), X(4, 2)}},
    {"matmul vector @ matrix", f_matmul, 2, {X(4), X(4, 2)}},
    {"matmul matrix @ vector", f_matmul, 2, {X(3, 4), X(4)}},
    {"matmul vector @ vector", f_matmul, 2, {X(4), X(4)}},
    {"matmul batched", f_matmul, 2, {X(2, 3, 4), X(4, 2)}},
    {"matmul batch broadcast", f_matmul, 2, {X(2, 1, 3, 4), X(3, 4, 2)}},
    {"matmul batched @ vector", f_matmul, 2, {X(2, 3, 4), X(4)}},
    {"softmax", f_softmax, 1, {X(3, 4)}},
    {"softmax dim 0", f_softmax0, 1, {X(3, 4)}},
    {"log_softmax", f_log_softmax, 1, {X(2, 3, 4)}},
};

TEST(matmul_and_softmax) {
    for (size_t i = 0; i < sizeof matmul_cases / sizeof *matmul_cases; i++)
        check_case(&matmul_cases[i]);
}

/* ------------------------------------------------------------ views */

static ct_tensor *f_view(ct_tensor *const *x) {
    return ct_view(ct_contiguous(x[0]), CT_SHAPE(4, 3));
}
static ct_tensor *f_reshape(ct_tensor *const *x) { return ct_reshape(x[0], CT_SHAPE(2, -1)); }
static ct_tensor *f_flatten(ct_tensor *const *x) { return ct_flatten(x[0], 0, -1); }
static ct_tensor *f_transpose(ct_tensor *const *x) { return ct_transpose(x[0], 0, 2); }
static ct_tensor *f_permute(ct_tensor *const *x) { return ct_permute(x[0], (int[]){1, 2, 0}); }
static ct_tensor *f_slice(ct_tensor *const *x) { return ct_slice(x[0], 1, -4, 5, 2); }
static ct_tensor *f_narrow(ct_tensor *const *x) { return ct_narrow(x[0], 0, 1, 2); }
static ct_tensor *f_select(ct_tensor *const *x) { return ct_select(x[0], 1, -1); }
static ct_tensor *f_expand(ct_tensor *const *x) { return ct_expand(x[0], CT_SHAPE(2, 3, 4)); }
static ct_tensor *f_squeeze(ct_tensor *const *x) { return ct_squeeze(x[0], 1); }
static ct_tensor *f_squeeze_all(ct_tensor *const *x) { return ct_squeeze_all(x[0]); }
static ct_tensor *f_unsqueeze(ct_tensor *const *x) { return ct_unsqueeze(x[0], -1); }
static ct_tensor *f_contiguous(ct_tensor *const *x) {
    return ct_contiguous(ct_transpose(x[0], 0, 1));
}
static ct_tensor *f_clone(ct_tensor *const *x) { return ct_clone(x[0]); }
static ct_tensor *f_split(ct_tensor *const *x) {
    ct_tensor *parts[3];
    if (ct_split(x[0], 2, 1, parts, 3) != 2)
        return NULL;
    return ct_mul(parts[0], parts[1]);
}

static const op_case view_cases[] = {
    {"view", f_view, 1, {X(3, 4)}},
    {"reshape", f_reshape, 1, {X(3, 4)}},
    {"flatten", f_flatten, 1, {X(2, 3, 2)}},
    {"transpose", f_transpose, 1, {X(2, 3, 4)}},
    {"permute", f_permute, 1, {X(2, 3, 4)}},
    {"slice with step", f_slice, 1, {X(3, 6)}},
    {"narrow", f_narrow, 1, {X(4, 3)}},
    {"select", f_select, 1, {X(3, 4)}},
    {"expand", f_expand, 1, {X(3, 1)}},
    {"squeeze", f_squeeze, 1, {X(3, 1, 2)}},
    {"squeeze_all", f_squeeze_all, 1, {X(1, 3, 1)}},
    {"unsqueeze", f_unsqueeze, 1, {X(3, 4)}},
    {"contiguous", f_contiguous, 1, {X(3, 4)}},
    {"clone", f_clone, 1, {X(3, 4)}},
    {"split", f_split, 1, {X(3, 4)}},
};

TEST(views) {
    for (size_t i = 0; i < sizeof view_cases / sizeof *view_cases; i++)
        check_case(&view_cases[i]);
}

/* ------------------------------------------------- joining and indexing */

static ct_tensor *f_cat(ct_tensor *const *x) { return ct_cat(x, 3, 1); }
static ct_tensor *f_stack(ct_tensor *const *x) { return ct_stack(x, 2, 0); }
static ct_tensor *index3(void) { return ct_from_data((int64_t[]){2, 0, 2}, CT_SHAPE(3), CT_INT64); }
static ct_tensor *f_index_select(ct_tensor *const *x) { return ct_index_select(x[0], 1, index3()); }
static ct_tensor *f_index_select32(ct_tensor *const *x) {
    return ct_index_select(x[0], 0, ct_to_dtype(index3(), CT_INT32));
}
static ct_tensor *gather_index(void) {
    return ct_from_data((int64_t[]){0, 2, 2, 1, 0, 0}, CT_SHAPE(3, 2), CT_INT64);
}
static ct_tensor *f_gather(ct_tensor *const *x) { return ct_gather(x[0], 1, gather_index()); }
static ct_tensor *f_scatter_add(ct_tensor *const *x) {
    return ct_scatter_add(x[0], 1, gather_index(), x[1]);
}
static ct_tensor *f_tril(ct_tensor *const *x) { return ct_tril(x[0], -1); }
static ct_tensor *f_triu(ct_tensor *const *x) { return ct_triu(x[0], 1); }

static const op_case index_cases[] = {
    {"cat", f_cat, 3, {X(3, 2), X(3, 1), X(3, 3)}},
    {"stack", f_stack, 2, {X(3, 2), X(3, 2)}},
    {"index_select", f_index_select, 1, {X(2, 4)}},
    {"index_select int32", f_index_select32, 1, {X(3, 2)}},
    {"gather", f_gather, 1, {X(3, 4)}},
    {"scatter_add", f_scatter_add, 2, {X(3, 4), X(3, 2)}},
    {"tril", f_tril, 1, {X(4, 4)}},
    {"triu", f_triu, 1, {X(3, 5)}},
};

TEST(joining_and_indexing) {
    for (size_t i = 0; i < sizeof index_cases / sizeof *index_cases; i++)
        check_case(&index_cases[i]);
}

/* --------------------------------------------------------- in place */

static ct_tensor *f_exp_(ct_tensor *const *x) { return ct_exp_(ct_mul_scalar(x[0], 0.5)); }
static ct_tensor *f_mul_(ct_tensor *const *x) { return ct_mul_(ct_add_scalar(x[0], 1), x[1]); }
static ct_tensor *f_div_(ct_tensor *const *x) { return ct_div_(ct_clone(x[0]), x[1]); }
static ct_tensor *f_relu_(ct_tensor *const *x) { return ct_relu_(ct_clone(x[0])); }
static ct_tensor *f_add_(ct_tensor *const *x) {
    /* Accumulating into a buffer that did not require grad. */
    ct_tensor *buf = ct_zeros(CT_SHAPE(3, 4), CT_FLOAT64);
    return ct_add_(ct_add_(buf, x[0]), x[1]);
}
static ct_tensor *f_copy_(ct_tensor *const *x) {
    ct_tensor *buf = ct_ones(CT_SHAPE(3, 4), CT_FLOAT64);
    return ct_mul(ct_copy_(buf, x[0]), x[1]);
}
static ct_tensor *f_masked_fill_(ct_tensor *const *x) {
    return ct_masked_fill_(ct_clone(x[0]), ct_gt_scalar(x[1], 0), 0);
}
static ct_tensor *f_scatter_add_(ct_tensor *const *x) {
    return ct_scatter_add_(ct_mul_scalar(x[0], 2), 1, gather_index(), x[1]);
}

static const op_case inplace_cases[] = {
    {"exp_ on a result", f_exp_, 1, {X(3, 4)}},
    {"mul_ by a tensor", f_mul_, 2, {X(3, 4), C(4)}},
    {"div_", f_div_, 2, {X(3, 4), A(3, 1)}},
    {"relu_", f_relu_, 1, {A(3, 4)}},
    {"add_ into a plain buffer", f_add_, 2, {X(3, 4), X(4)}},
    {"copy_ broadcasting", f_copy_, 2, {X(4), X(3, 4)}},
    {"masked_fill_", f_masked_fill_, 2, {X(3, 4), C(3, 1)}},
    {"scatter_add_", f_scatter_add_, 2, {X(3, 4), X(3, 2)}},
};

TEST(inplace) {
    for (size_t i = 0; i < sizeof inplace_cases / sizeof *inplace_cases; i++)
        check_case(&inplace_cases[i]);
}

/* ---------------------------------------------------- double backward */

/* The gradient itself, as a function: checks that create_graph records a
 * differentiable backward. */
static ct_tensor *grad_of(ct_tensor *x, ct_tensor *y) {
    ct_tensor *g = NULL;
    ct_grad_options o = {.create_graph = true};
    return ct_grad(&y, 1, NULL, &x, 1, &g, &o) ? NULL : g;
}
static ct_tensor *f_grad_tanh(ct_tensor *const *x) {
    return grad_of(x[0], ct_sum(ct_mul(ct_tanh(x[0]), x[0]), NULL, 0, false));
}
static ct_tensor *f_grad_mlp(ct_tensor *const *x) {
    ct_tensor *h = ct_sigmoid(ct_matmul(x[0], x[1]));
    return grad_of(x[0], ct_logsumexp(h, NULL, 0, false));
}
static ct_tensor *f_grad_slice(ct_tensor *const *x) {
    ct_tensor *s = ct_slice(x[0], 1, 0, 4, 2);
    return grad_of(x[0], ct_sum(ct_mul(s, ct_exp(s)), NULL, 0, false));
}

static const op_case double_cases[] = {
    {"grad of tanh(x) * x", f_grad_tanh, 1, {X(3, 4)}},
    {"grad of logsumexp(sigmoid(x @ w))", f_grad_mlp, 2, {X(2, 3), X(3, 4)}},
    {"grad through a strided slice", f_grad_slice, 1, {X(3, 4)}},
};

TEST(double_backward) {
    for (size_t i = 0; i < sizeof double_cases / sizeof *double_cases; i++)
        check_case(&double_cases[i]);
}

/* ------------------------------------------------ values at edge points */

/* An empty slice passes nothing back: x's gradient is zero, whatever the
 * step, with and without create_graph (as in PyTorch). */
TEST(empty_slice_gives_zero_gradients) {
    for (int64_t step = 1; step <= 3; step++)
        for (int cg = 0; cg < 2; cg++) {
            ct_tensor *x = ct_requires_grad_(ct_arange(0, 5, 1, CT_FLOAT64), true);
            ct_tensor *y = ct_sum(ct_slice(x, 0, 0, 0, step), NULL, 0, false);
            ct_tensor *g = NULL;
            ct_grad_options o = {.create_graph = cg};
            ASSERT_EQ(ct_grad(&y, 1, NULL, &x, 1, &g, &o), 0);
            ASSERT_CLOSE(g, ct_zeros(CT_SHAPE(5), CT_FLOAT64), 0, 0);
        }
}

/* d/da a^b is b * a^(b-1), which is 0 * inf at a = 0, b = 0; PyTorch masks
 * it to 0 where b == 0, and d/db a^b = log(a) * a^b to 0 where a == 0 and
 * b >= 0. */
TEST(pow_gradients_at_zero_follow_pytorch) {
    double av[] = {0, 0, 0, 0, 2}, bv[] = {0, 1, 2, -1, 0};
    ct_tensor *a = ct_requires_grad_(ct_from_data(av, CT_SHAPE(5), CT_FLOAT64), true);
    ct_tensor *b = ct_requires_grad_(ct_from_data(bv, CT_SHAPE(5), CT_FLOAT64), true);
    ct_tensor *y = ct_sum(ct_pow(a, b), NULL, 0, false);
    ASSERT_EQ(ct_backward(&y, 1, NULL, false), 0);
    ASSERT_CLOSE(ct_tensor_grad(a),
                 ct_from_data((double[]){0, 1, 0, -INFINITY, 0}, CT_SHAPE(5), CT_FLOAT64), 0, 0);
    /* At a = 0, b = -1 PyTorch has log(0) * inf = -inf * inf. */
    ASSERT_CLOSE(ct_tensor_grad(b),
                 ct_from_data((double[]){0, 0, 0, -INFINITY, log(2.0)}, CT_SHAPE(5), CT_FLOAT64),
                 1e-15, 0);
    /* The scalar exponent 0: a constant, so no gradient at all. */
    ct_tensor *z = ct_requires_grad_(ct_zeros(CT_SHAPE(2), CT_FLOAT32), true);
    ct_tensor *yz = ct_sum(ct_pow_scalar(z, 0), NULL, 0, false);
    ct_tensor *gz = NULL;
    ASSERT_EQ(ct_grad(&yz, 1, NULL, &z, 1, &gz, NULL), 0);
    ASSERT_CLOSE(ct_to_dtype(gz, CT_FLOAT64), ct_zeros(CT_SHAPE(2), CT_FLOAT64), 0, 0);
}
