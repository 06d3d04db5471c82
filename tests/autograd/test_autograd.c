/* The autograd engine: accumulation, ct_grad, grad mode, hooks, callbacks,
 * the errors users hit, anomaly mode, deep graphs, threads and reentrant
 * backward. (Derivatives are checked op by op in test_derivatives.) */
#include "ct_test.h"

#include <ct/autograd.h>
#include <pthread.h>

static ct_tensor *vec(int n, const double *v) {
    return ct_from_data(v, 1, (int64_t[]){n}, CT_FLOAT64);
}

static ct_tensor *leaf(int n, const double *v) { return ct_requires_grad_(vec(n, v), true); }

static double at(ct_tensor *t, int64_t i) { return ct_get(t, &i); }

TEST(leaves_accumulate_across_backwards_and_uses) {
    ct_tensor *x = leaf(3, (double[]){1, 2, 3});
    ct_tensor *y = ct_sum(ct_mul(x, x), NULL, 0, false); /* x used twice */
    ASSERT_TRUE(ct_is_leaf(x) && !ct_is_leaf(y) && ct_requires_grad(y));
    ASSERT_STR_CONTAINS(ct_node_name(ct_tensor_grad_fn(y)), "SumBackward");
    ASSERT_EQ(ct_tensor_backward(y), 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 2), 6, 0);
    ct_tensor *z = ct_sum(ct_mul_scalar(x, 10), NULL, 0, false);
    ASSERT_EQ(ct_tensor_backward(z), 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 0), 2 + 10, 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 2), 6 + 10, 0);
}

TEST(graph_structure_is_inspectable) {
    ct_tensor *x = leaf(2, (double[]){1, 2}), *w = leaf(2, (double[]){3, 4});
    ct_tensor *y = ct_mul(x, w);
    ct_node *n = ct_tensor_grad_fn(y);
    ASSERT_STR_CONTAINS(ct_node_name(n), "MulBackward0");
    ASSERT_EQ(ct_node_op(n), CT_OP_MUL);
    ASSERT_EQ(ct_node_num_next(n), 2);
    int nr = -1;
    ASSERT_STR_CONTAINS(ct_node_name(ct_node_next(n, 1, &nr)), "AccumulateGrad");
    ASSERT_EQ(nr, 0);
    ASSERT_TRUE(ct_node_next(n, 2, NULL) == NULL);
    ct_tensor *later = ct_exp(y);
    ASSERT_TRUE(ct_node_seq(ct_tensor_grad_fn(later)) > ct_node_seq(n));
    /* Ops on tensors that need no grad record nothing. */
    ct_tensor *c = ct_exp(vec(2, (double[]){1, 2}));
    ASSERT_TRUE(ct_is_leaf(c) && !ct_requires_grad(c) && !ct_tensor_grad_fn(c));
    /* Non-float results never require grad. */
    ASSERT_TRUE(!ct_requires_grad(ct_gt(x, w)));
    ASSERT_TRUE(!ct_requires_grad(ct_argmax(x, 0, false)));
}

TEST(grad_returns_gradients_without_touching_dot_grad) {
    ct_tensor *x = leaf(2, (double[]){1, 2}), *u = leaf(1, (double[]){5});
    ct_tensor *h = ct_exp(x);
    ct_tensor *y = ct_sum(ct_mul(h, h), NULL, 0, false);
    ct_tensor *g[2];
    ct_grad_options keep = {.retain_graph = true};
    ASSERT_EQ(ct_grad(&y, 1, NULL, (ct_tensor *[]){x, h}, 2, g, &keep), 0);
    ASSERT_NEAR(at(g[0], 1), 2 * exp(4), 1e-9);
    ASSERT_NEAR(at(g[1], 0), 2 * exp(1), 1e-12); /* a non-leaf input */
    ASSERT_TRUE(ct_tensor_grad(x) == NULL);
    ASSERT_RC(ct_grad(&y, 1, NULL, &u, 1, g, &keep), CT_EINVAL, "not used", "allow_unused");
    ct_grad_options unused = {.retain_graph = true, .allow_unused = true};
    ASSERT_EQ(ct_grad(&y, 1, NULL, (ct_tensor *[]){u, x}, 2, g, &unused), 0);
    ASSERT_TRUE(g[0] == NULL && g[1] != NULL);
    ct_tensor *plain = vec(1, (double[]){1});
    ASSERT_RC(ct_grad(&y, 1, NULL, &plain, 1, g, NULL), CT_EINVAL, "does not require grad");
}

TEST(grad_outputs_weight_non_scalar_outputs) {
    ct_tensor *x = leaf(3, (double[]){1, 2, 3});
    ct_tensor *y = ct_mul_scalar(x, 2);
    ASSERT_RC(ct_tensor_backward(y), CT_EINVAL, "implicitly", "one element", "[3]", "grad_outputs");
    ASSERT_RC(ct_backward(&y, 1, (ct_tensor *[]){vec(2, (double[]){1, 1})}, true), CT_ESHAPE,
              "grad_outputs[0]", "[2]", "[3]");
    ct_tensor *w = ct_from_data((float[]){1, 0, -1}, CT_SHAPE(3), CT_FLOAT32);
    ASSERT_EQ(ct_backward(&y, 1, &w, false), 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 2), -2, 0);
    ASSERT_EQ(ct_tensor_dtype(ct_tensor_grad(x)), CT_FLOAT64);
    ct_tensor *plain = vec(1, (double[]){1});
    ASSERT_RC(ct_tensor_backward(plain), CT_EINVAL, "does not require grad");
}

TEST(second_backward_through_a_freed_graph_says_retain_graph) {
    ct_tensor *x = leaf(2, (double[]){1, 2});
    ct_tensor *y = ct_sum(ct_exp(x), NULL, 0, false);
    ASSERT_EQ(ct_backward(&y, 1, NULL, true), 0);
    ASSERT_EQ(ct_tensor_backward(y), 0); /* the graph was retained */
    ASSERT_NEAR(at(ct_tensor_grad(x), 0), 2 * exp(1), 1e-12);
    ASSERT_RC(ct_tensor_backward(y), CT_ESTATE, "ExpBackward0", "second time", "retain_graph");
}

TEST(saved_tensor_modified_in_place_is_caught_at_unpack) {
    ct_tensor *x = leaf(2, (double[]){1, 2});
    ct_tensor *h = ct_mul_scalar(x, 1);
    ct_tensor *y = ct_exp(h); /* saves its output */
    ct_tensor *z = ct_sum(ct_mul(y, h), NULL, 0, false);
    ct_add_scalar_(h, 1); /* h is saved by MulBackward0 as input 1 */
    ASSERT_RC(ct_tensor_backward(z), CT_ESTATE, "modified by an in-place", "float64[2]",
              "input 1 of MulBackward0", "version 1", "expected version 0");
    ct_tensor *x2 = leaf(2, (double[]){1, 2});
    ct_tensor *e = ct_exp(ct_mul_scalar(x2, 1));
    ct_tensor *s = ct_sum(e, NULL, 0, false);
    ct_mul_scalar_(e, 2);
    ASSERT_RC(ct_tensor_backward(s), CT_ESTATE, "output 0 of ExpBackward0", "version 1");
}

TEST(in_place_rules) {
    ct_tensor *x = leaf(2, (double[]){1, 2});
    ASSERT_FAILS(ct_exp_(x), CT_EINVAL, "leaf tensor that requires grad", "in-place");
    ASSERT_FAILS(ct_mul_scalar_(ct_slice(x, 0, 0, 1, 1), 2), CT_EINVAL, "view of a leaf");
    ct_tensor *h = ct_mul_scalar(x, 1);
    ASSERT_FAILS(ct_sin_(h), CT_ENOTSUP, "needs the value", "before the in-place op");
    ASSERT_FAILS(ct_bernoulli_(h, 0.5, NULL), CT_ENOTSUP, "no derivative");
    /* Memory shared with a tensor that is not a view of it (both made from
     * one storage) cannot learn about the write: refused, untouched. */
    ct_tensor *buf = ct_zeros(CT_SHAPE(2), CT_FLOAT64);
    ct_tensor *alias =
        ct_tensor_from_storage(ct_tensor_storage(buf), 0, CT_SHAPE(2), NULL, CT_FLOAT64);
    ASSERT_FAILS(ct_copy_(buf, h), CT_ENOTSUP, "shares its memory", "ct_cat");
    ASSERT_NEAR(ct_item(ct_sum(alias, NULL, 0, false)), 0, 0);
    ASSERT_TRUE(ct_copy_(ct_zeros(CT_SHAPE(2), CT_FLOAT64), h)); /* a fresh tensor is fine */
    /* Views of a non-contiguous base cannot be placed in its gradient. */
    ct_tensor *strided =
        ct_tensor_from_storage(ct_tensor_storage(ct_zeros(CT_SHAPE(4), CT_FLOAT64)), 0,
                               CT_SHAPE(2, 2), (int64_t[]){1, 2}, CT_FLOAT64);
    ASSERT_FAILS(ct_copy_(ct_select(strided, 0, 0), h), CT_ENOTSUP, "non-contiguous");
    /* A transposed view of a contiguous buffer is fine: its base is. */
    ct_tensor *t = ct_transpose(ct_zeros(CT_SHAPE(2, 2), CT_FLOAT64), 0, 1);
    ASSERT_TRUE(ct_copy_(ct_select(t, 0, 1), h) && ct_requires_grad(t));
    /* With grad mode off, in-place updates of leaves are how optimizers
     * work. */
    bool prev = ct_set_grad_enabled(false);
    ASSERT_TRUE(ct_mul_scalar_(x, 2));
    ct_set_grad_enabled(prev);
    ASSERT_NEAR(at(x, 1), 4, 0);
    /* An in-place op rebases the history of a non-leaf. */
    ct_tensor *y = ct_mul_scalar(x, 3);
    ct_exp_(y);
    ASSERT_STR_CONTAINS(ct_node_name(ct_tensor_grad_fn(y)), "ExpBackward0");
    ASSERT_EQ(ct_tensor_backward(ct_sum(y, NULL, 0, false)), 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 0), 3 * exp(6), 1e-6);
}

TEST(requires_grad_checks) {
    ct_tensor *i = ct_arange(0, 3, 1, CT_INT64);
    ASSERT_FAILS(ct_requires_grad_(i, true), CT_EDTYPE, "floating-point", "int64[3]");
    ct_tensor *x = leaf(2, (double[]){1, 2});
    ct_tensor *y = ct_exp(x);
    ASSERT_FAILS(ct_requires_grad_(y, false), CT_EINVAL, "not a leaf", "ct_detach");
    ct_tensor *d = ct_detach(y);
    ASSERT_TRUE(!ct_requires_grad(d) && ct_is_leaf(d));
    ASSERT_TRUE(ct_data_ptr(d) == ct_data_ptr(y));
    ASSERT_TRUE(ct_requires_grad_(x, false) && !ct_requires_grad(x));
    ASSERT_RC(ct_tensor_set_grad(y, vec(3, (double[]){1, 2, 3})), CT_ESHAPE, "set_grad", "[3]",
              "[2]");
}

TEST(grad_mode_is_per_thread) {
    ct_tensor *x = leaf(2, (double[]){1, 2});
    ASSERT_TRUE(ct_grad_enabled());
    ASSERT_TRUE(ct_set_grad_enabled(false));
    ct_tensor *y = ct_exp(x);
    ASSERT_TRUE(!ct_requires_grad(y));
    ASSERT_TRUE(!ct_set_grad_enabled(true));
    ASSERT_TRUE(ct_requires_grad(ct_exp(x)));
}

static void *grad_mode_on_other_thread(void *arg) {
    *(bool *)arg = ct_grad_enabled();
    return NULL;
}

TEST(grad_mode_does_not_leak_to_other_threads) {
    bool prev = ct_set_grad_enabled(false), other = false;
    pthread_t t;
    pthread_create(&t, NULL, grad_mode_on_other_thread, &other);
    pthread_join(t, NULL);
    ct_set_grad_enabled(prev);
    ASSERT_TRUE(other);
}

/* ------------------------------------------------------------- hooks */

static ct_tensor *double_it(ct_tensor *g, void *ctx) {
    (*(int *)ctx)++;
    return ct_mul_scalar(g, 2);
}

static ct_tensor *wrong_shape(ct_tensor *g, void *ctx) {
    (void)ctx;
    return ct_sum(g, NULL, 0, false);
}

static ct_tensor *failing_hook(ct_tensor *g, void *ctx) {
    (void)g;
    (void)ctx;
    ct_autograd_fail(CT_EINVAL, "my hook refused");
    return NULL;
}

TEST(tensor_hooks_replace_gradients) {
    int calls = 0;
    ct_tensor *x = leaf(2, (double[]){1, 2});
    ct_tensor *h = ct_mul_scalar(x, 3);
    int handle = ct_tensor_register_hook(h, double_it, &calls);
    ASSERT_TRUE(handle > 0);
    ASSERT_TRUE(ct_tensor_register_hook(x, double_it, &calls) > 0);
    ct_tensor *y = ct_sum(h, NULL, 0, false);
    ASSERT_EQ(ct_backward(&y, 1, NULL, true), 0);
    ASSERT_EQ(calls, 2);
    ASSERT_NEAR(at(ct_tensor_grad(x), 0), 12, 0); /* 1 * 2 (h) * 3 * 2 (x) */
    ASSERT_EQ(ct_tensor_remove_hook(h, handle), 0);
    ASSERT_RC(ct_tensor_remove_hook(h, handle), CT_EINVAL, "no hook");
    ASSERT_EQ(ct_tensor_backward(y), 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 0), 12 + 6, 0);
    ct_tensor *plain = vec(1, (double[]){1});
    ASSERT_RC(ct_tensor_register_hook(plain, double_it, &calls), CT_EINVAL,
              "does not require grad");
}

TEST(a_hook_returning_the_wrong_shape_is_an_error) {
    ct_tensor *x = leaf(3, (double[]){1, 2, 3});
    ct_tensor *h = ct_exp(x);
    ct_tensor_register_hook(h, wrong_shape, NULL);
    ct_tensor *y = ct_sum(h, NULL, 0, false);
    ASSERT_RC(ct_tensor_backward(y), CT_ESHAPE, "hook on output 0 of ExpBackward0", "shape []",
              "has shape [3]");
    ct_tensor *x2 = leaf(3, (double[]){1, 2, 3});
    ct_tensor_register_hook(x2, failing_hook, NULL);
    ct_tensor *y2 = ct_sum(x2, NULL, 0, false);
    ASSERT_RC(ct_tensor_backward(y2), CT_EINVAL, "my hook refused");
    ASSERT_TRUE(ct_tensor_grad(x2) == NULL);
}

typedef struct hook_log {
    char order[16];
    int n;
    ct_tensor *seen_grad;
} hook_log;

static int log_callback(void *ctx) {
    hook_log *l = ctx;
    l->order[l->n++] = 'C';
    return 0;
}

static int post_accumulate(ct_tensor *t, void *ctx) {
    hook_log *l = ctx;
    l->order[l->n++] = 'P';
    l->seen_grad = ct_tensor_grad(t);
    if (l->n == 1)
        return ct_autograd_queue_callback(log_callback, l);
    return 0;
}

TEST(post_accumulate_hooks_and_final_callbacks) {
    hook_log log = {0};
    ct_tensor *a = leaf(2, (double[]){1, 2}), *b = leaf(2, (double[]){3, 4});
    ASSERT_TRUE(ct_tensor_register_post_accumulate_grad_hook(a, post_accumulate, &log) > 0);
    ASSERT_TRUE(ct_tensor_register_post_accumulate_grad_hook(b, post_accumulate, &log) > 0);
    ct_tensor *y = ct_sum(ct_mul(a, b), NULL, 0, false);
    ASSERT_EQ(ct_tensor_backward(y), 0);
    ASSERT_EQ(log.n, 3);
    ASSERT_STR_CONTAINS(log.order, "PPC"); /* the callback runs once, last */
    ASSERT_TRUE(log.seen_grad != NULL);
    ASSERT_RC(ct_autograd_queue_callback(log_callback, &log), CT_ESTATE, "no backward is running");
    ASSERT_RC(ct_tensor_register_post_accumulate_grad_hook(ct_exp(a), post_accumulate, &log),
              CT_EINVAL, "not a leaf");
}

TEST(gradients_accumulate_into_a_preset_grad_view) {
    /* A flat gradient buffer with each parameter's .grad a view into it, as
     * data-parallel bucketing does. */
    ct_tensor *flat = ct_zeros(CT_SHAPE(5), CT_FLOAT64);
    ct_tensor *a = leaf(2, (double[]){1, 2}), *b = leaf(3, (double[]){3, 4, 5});
    ASSERT_EQ(ct_tensor_set_grad(a, ct_narrow(flat, 0, 0, 2)), 0);
    ASSERT_EQ(ct_tensor_set_grad(b, ct_narrow(flat, 0, 2, 3)), 0);
    ct_tensor *y = ct_add(ct_sum(ct_mul(a, a), NULL, 0, false), ct_sum(b, NULL, 0, false));
    ASSERT_EQ(ct_tensor_backward(y), 0);
    double want[5] = {2, 4, 1, 1, 1};
    for (int i = 0; i < 5; i++)
        ASSERT_NEAR(at(flat, i), want[i], 0);
}

/* ------------------------------------------------------- anomaly mode */

TEST(anomaly_mode_names_the_op_that_made_a_nan) {
    ct_tensor *x = leaf(2, (double[]){0, 1});
    ct_tensor *y = ct_sum(ct_mul_scalar(ct_sqrt(x), 0), NULL, 0, false);
    ASSERT_EQ(ct_backward(&y, 1, NULL, true), 0); /* off: the NaN goes through */
    ASSERT_TRUE(isnan(at(ct_tensor_grad(x), 0)));
    ASSERT_TRUE(!ct_set_anomaly_enabled(true));
    const char *prev = ct_autograd_set_label("encoder.layer1");
    ct_tensor *x2 = leaf(2, (double[]){0, 1});
    ct_tensor *y2 = ct_sum(ct_mul_scalar(ct_sqrt(x2), 0), NULL, 0, false);
    ct_autograd_set_label(prev);
    ASSERT_RC(ct_tensor_backward(y2), CT_ESTATE, "anomaly", "SqrtBackward0", "op SQRT",
              "encoder.layer1", "NaN", "recorded at", "(test_autograd)");
    ct_set_anomaly_enabled(false);
    ASSERT_EQ(ct_node_set_label(ct_tensor_grad_fn(y), "loss"), 0);
    ASSERT_STR_CONTAINS(ct_node_label(ct_tensor_grad_fn(y)), "loss");
}

/* --------------------------------------------------------- deep graphs */

/* Runs without a scope (on a thread of its own), so that each step's
 * result can be handed out of the step's scope and freed by hand. */
static void million_node_chain(void) {
    ct_tensor *x = ct_requires_grad_(ct_zeros(CT_SHAPE(1), CT_FLOAT64), true);
    ct_tensor *y = ct_tensor_retain(x);
    const int n = 1000000;
    for (int i = 0; i < n; i++) {
        ct_scope_begin();
        ct_tensor *next = ct_keep(ct_add_scalar(y, 1));
        ct_scope_end();
        ct_tensor_free(y);
        y = next;
    }
    ASSERT_NEAR(at(y, 0), n, 0);
    ASSERT_EQ(ct_backward(&y, 1, NULL, false), 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 0), 1, 0);
    ct_tensor_free(y);
    /* A chain whose nodes hold the previous tensors (mul saves its inputs)
     * is freed through the tensors too. */
    y = ct_tensor_retain(x);
    for (int i = 0; i < n / 4; i++) {
        ct_scope_begin();
        ct_tensor *next = ct_keep(ct_mul(y, y));
        ct_scope_end();
        ct_tensor_free(y);
        y = next;
    }
    ct_tensor_free(y);
    ct_tensor_free(x);
}

TEST(a_million_node_chain_runs_backward_and_frees_without_recursion) {
    tt_run_unscoped(million_node_chain);
}

/* ------------------------------------------------------------ threads */

typedef struct worker {
    ct_tensor *shared; /* a leaf every thread uses */
    int id, iters, failures;
} worker;

static void *train_thread(void *arg) {
    worker *w = arg;
    ct_tensor *own = ct_requires_grad_(ct_full(CT_SHAPE(4), w->id + 1.0, CT_FLOAT64), true);
    for (int it = 0; it < w->iters; it++) {
        ct_scope_begin();
        ct_tensor *y = ct_sum(ct_mul(ct_tanh(own), w->shared), NULL, 0, false);
        if (ct_tensor_backward(y))
            w->failures++;
        ct_scope_end();
    }
    double want = w->iters * 0.5 * (1 - tanh(w->id + 1.0) * tanh(w->id + 1.0));
    int64_t i = 3;
    if (fabs(ct_get(ct_tensor_grad(own), &i) - want) > 1e-9)
        w->failures++;
    ct_tensor_free(own);
    return NULL;
}

TEST(threads_run_backward_concurrently_and_share_a_leaf) {
    ct_tensor *shared = ct_requires_grad_(ct_full(CT_SHAPE(4), 0.5, CT_FLOAT64), true);
    enum { NT = 4, ITERS = 200 };
    worker w[NT];
    pthread_t th[NT];
    for (int i = 0; i < NT; i++) {
        w[i] = (worker){shared, i, ITERS, 0};
        pthread_create(&th[i], NULL, train_thread, &w[i]);
    }
    for (int i = 0; i < NT; i++)
        pthread_join(th[i], NULL);
    double want = 0;
    for (int i = 0; i < NT; i++) {
        ASSERT_EQ(w[i].failures, 0);
        want += ITERS * tanh(i + 1.0);
    }
    ASSERT_NEAR(at(ct_tensor_grad(shared), 0), want, 1e-9);
}

/* --------------------------------------------------- reentrant backward */

/* A custom function whose backward runs a whole backward of its own, which
 * reaches the same function one level deeper, down to `levels`. */
typedef struct nest {
    int level, levels;
    pthread_t threads[64];
    int nthreads;
} nest;

static ct_tensor *nested_square(ct_tensor *x, nest *ctx);

static int nested_backward(const ct_backward_args *a) {
    nest *ctx = a->ctx;
    pthread_t self = pthread_self();
    bool seen = false;
    for (int i = 0; i < ctx->nthreads; i++)
        seen = seen || pthread_equal(ctx->threads[i], self);
    if (!seen && ctx->nthreads < 64)
        ctx->threads[ctx->nthreads++] = self;
    ct_tensor *x = ct_detach(a->saved[0]);
    ct_requires_grad_(x, true);
    /* Backward functions run with grad mode off unless create_graph. */
    bool prev = ct_set_grad_enabled(true);
    ct_tensor *y = ctx->level + 1 < ctx->levels ? nested_square(x, ctx) : ct_mul(x, x);
    ct_set_grad_enabled(prev);
    ctx->level++;
    int rc = ct_backward(&y, 1, a->grad_outputs, false);
    ctx->level--;
    if (rc)
        return rc;
    a->grad_inputs[0] = ct_tensor_grad(x);
    return 0;
}

static const ct_function_def nested_def = {"NestedSquareBackward", nested_backward, NULL};

static ct_tensor *nested_square(ct_tensor *x, nest *ctx) {
    bool prev = ct_set_grad_enabled(false);
    ct_tensor *y = ct_mul(x, x);
    ct_set_grad_enabled(prev);
    return ct_function_record(&nested_def, ctx, &x, 1, &y, 1, &x, 1) ? NULL : y;
}

TEST(reentrant_backward_nests_past_the_depth_limit_on_other_threads) {
    nest ctx = {.levels = 50};
    ct_tensor *x = leaf(2, (double[]){1.5, -2});
    ct_tensor *y = ct_sum(nested_square(x, &ctx), NULL, 0, false);
    ASSERT_TRUE(y);
    ASSERT_EQ(ct_tensor_backward(y), 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 0), 3, 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 1), -4, 0);
    ASSERT_TRUE(ctx.nthreads >= 3); /* 50 levels at 16 per thread */
    /* A second backward runs on the same worker threads. */
    int first = ctx.nthreads;
    ct_tensor *y2 = ct_sum(nested_square(x, &ctx), NULL, 0, false);
    ASSERT_EQ(ct_tensor_backward(y2), 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 0), 6, 0);
    ASSERT_EQ(ctx.nthreads, first);
}

static int failing_backward(const ct_backward_args *a) {
    (void)a;
    return ct_autograd_fail(CT_EIO, "custom backward lost its disk");
}

static const ct_function_def failing_def = {"FailingBackward", failing_backward, NULL};

TEST(custom_functions_record_save_and_report_errors) {
    ct_tensor *x = leaf(2, (double[]){1, 2});
    ct_tensor *y = ct_mul_scalar(ct_detach(x), 2);
    ASSERT_EQ(ct_function_record(&failing_def, NULL, &x, 1, &y, 1, &y, 1), 0);
    ASSERT_STR_CONTAINS(ct_node_name(ct_tensor_grad_fn(y)), "FailingBackward");
    ct_tensor *z = ct_sum(y, NULL, 0, false);
    ASSERT_RC(ct_tensor_backward(z), CT_EIO, "lost its disk");
    ASSERT_RC(ct_function_record(&failing_def, NULL, &x, 1, &y, 1, NULL, 0), CT_EINVAL,
              "already has history");
    ct_tensor *plain = vec(1, (double[]){1});
    ct_tensor *out = ct_exp(plain);
    ASSERT_EQ(ct_function_record(&failing_def, NULL, &plain, 1, &out, 1, NULL, 0), 0);
    ASSERT_TRUE(!ct_requires_grad(out)); /* nothing to record */
}

/* A custom function with a wrong derivative: gradcheck must catch it. */
static int wrong_backward(const ct_backward_args *a) {
    a->grad_inputs[0] = ct_mul_scalar(ct_mul(a->grad_outputs[0], a->saved[0]), 2.01);
    return 0;
}

static const ct_function_def wrong_def = {"WrongSquareBackward", wrong_backward, NULL};

static ct_tensor *wrong_square(void *ctx, ct_tensor *const *x, int n) {
    (void)ctx;
    (void)n;
    bool prev = ct_set_grad_enabled(false);
    ct_tensor *y = ct_mul(x[0], x[0]);
    ct_set_grad_enabled(prev);
    return ct_function_record(&wrong_def, NULL, x, 1, &y, 1, x, 1) ? NULL : y;
}

TEST(gradcheck_reports_the_worst_element) {
    ct_tensor *x = leaf(3, (double[]){1, -2, 3});
    ASSERT_RC(ct_gradcheck(wrong_square, NULL, &x, 1, NULL), CT_ESTATE, "gradcheck", "element [2]",
              "analytic", "numeric", "3 element(s) failed");
    ct_tensor *f = ct_requires_grad_(ct_ones(CT_SHAPE(2), CT_FLOAT32), true);
    ASSERT_RC(ct_gradcheck(wrong_square, NULL, &f, 1, NULL), CT_EDTYPE, "float64");
    ct_tensor *e = ct_requires_grad_(ct_expand(vec(1, (double[]){1}), CT_SHAPE(3)), true);
    ASSERT_RC(ct_gradcheck(wrong_square, NULL, &e, 1, NULL), CT_EINVAL, "expanded");
}

TEST(roots_that_depend_on_each_other_and_leaf_roots) {
    ct_tensor *x = leaf(2, (double[]){1, 2});
    ct_tensor *y = ct_mul_scalar(x, 3);
    ct_tensor *z = ct_sum(ct_mul(y, y), NULL, 0, false);
    ct_tensor *ones = ct_ones(CT_SHAPE(2), CT_FLOAT64);
    /* d(z + sum(y))/dx = 3 (2y + 1), with y also reached through z. */
    ASSERT_EQ(ct_backward((ct_tensor *[]){z, y}, 2, (ct_tensor *[]){NULL, ones}, false), 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 1), 3 * (2 * 6 + 1), 1e-12);
    /* A leaf as the output: its gradient is the one given. */
    ct_tensor *w = leaf(2, (double[]){5, 6});
    ct_tensor *g = vec(2, (double[]){0.5, -1});
    ASSERT_EQ(ct_backward(&w, 1, &g, false), 0);
    ASSERT_CLOSE(ct_tensor_grad(w), g, 0, 0);
}

TEST(half_precision_leaves_get_half_precision_gradients) {
    ct_tensor *x = ct_requires_grad_(ct_full(CT_SHAPE(3), 2, CT_FLOAT16), true);
    ct_tensor *y = ct_sum(ct_mul(ct_to_dtype(x, CT_FLOAT32), ct_full(CT_SHAPE(3), 1.5, CT_FLOAT32)),
                          NULL, 0, false);
    ASSERT_EQ(ct_tensor_backward(y), 0);
    ASSERT_EQ(ct_tensor_dtype(ct_tensor_grad(x)), CT_FLOAT16);
    ASSERT_NEAR(at(ct_tensor_grad(x), 2), 1.5, 0);
}

TEST(second_order_gradients_through_backward) {
    ct_tensor *x = leaf(2, (double[]){1, 2});
    ct_tensor *y = ct_sum(ct_pow_scalar(x, 3), NULL, 0, false);
    ct_tensor *g = NULL;
    ct_grad_options cg = {.create_graph = true};
    ASSERT_EQ(ct_grad(&y, 1, NULL, &x, 1, &g, &cg), 0); /* 3 x^2, with history */
    ASSERT_TRUE(ct_requires_grad(g));
    ASSERT_EQ(ct_tensor_backward(ct_sum(g, NULL, 0, false)), 0); /* d/dx sum(3 x^2) = 6 x */
    ASSERT_NEAR(at(ct_tensor_grad(x), 1), 12, 1e-12);
    /* ct_grad of an intermediate that is also an output. */
    ct_tensor *h = ct_exp(x), *dh = NULL;
    ASSERT_EQ(ct_grad(&h, 1, (ct_tensor *[]){ct_ones(CT_SHAPE(2), CT_FLOAT64)}, &h, 1, &dh, NULL),
              0);
    ASSERT_NEAR(at(dh, 0), 1, 0);
}

/* ------------------------------------------------- writes into views */

TEST(in_place_ops_on_views_rewrite_the_base_history) {
    ct_tensor *x = leaf(3, (double[]){0.5, 1, 2});
    /* exp_ on a slice of a result. */
    ct_tensor *h = ct_mul_scalar(x, 1);
    ct_exp_(ct_narrow(h, 0, 0, 1));
    ASSERT_STR_CONTAINS(ct_node_name(ct_tensor_grad_fn(h)), "CopySlices");
    ASSERT_EQ(ct_tensor_backward(ct_sum(h, NULL, 0, false)), 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 0), exp(0.5), 1e-12);
    ASSERT_NEAR(at(ct_tensor_grad(x), 2), 1, 0);
    /* Pieces written into a plain buffer: the buffer gets their history. */
    ct_tensor *x2 = leaf(3, (double[]){0.5, 1, 2});
    ct_tensor *buf = ct_zeros(CT_SHAPE(2, 3), CT_FLOAT64);
    ct_copy_(ct_select(buf, 0, 1), ct_mul_scalar(x2, 2));
    ct_copy_(ct_narrow(ct_select(buf, 0, 0), 0, 1, 2), ct_narrow(x2, 0, 0, 2));
    ASSERT_TRUE(ct_requires_grad(buf));
    ct_tensor *w = ct_from_data((double[]){1, 2, 3, 4, 5, 6}, CT_SHAPE(2, 3), CT_FLOAT64);
    ASSERT_EQ(ct_tensor_backward(ct_sum(ct_mul(buf, w), NULL, 0, false)), 0);
    /* x2[0] lands at buf[0][1] (w 2) and buf[1][0] (w 4, times 2). */
    ASSERT_NEAR(at(ct_tensor_grad(x2), 0), 2 + 8, 0);
    ASSERT_NEAR(at(ct_tensor_grad(x2), 1), 3 + 10, 0);
    ASSERT_NEAR(at(ct_tensor_grad(x2), 2), 12, 0);
}

TEST(views_see_writes_made_through_their_base_or_other_views) {
    ct_tensor *x = leaf(3, (double[]){1, 2, 3});
    ct_tensor *y = ct_mul_scalar(x, 1);
    ct_tensor *v1 = ct_narrow(y, 0, 0, 2), *v2 = ct_narrow(y, 0, 1, 2);
    ct_mul_scalar_(v1, 3);                                        /* y = [3 x0, 3 x1, x2] */
    ASSERT_EQ(ct_tensor_backward(ct_sum(v2, NULL, 0, false)), 0); /* 3 x1 + x2 */
    ASSERT_NEAR(at(ct_tensor_grad(x), 0), 0, 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 1), 3, 0);
    ASSERT_NEAR(at(ct_tensor_grad(x), 2), 1, 0);
    ct_tensor *x2 = leaf(2, (double[]){1, 2});
    ct_tensor *b = ct_mul_scalar(x2, 1);
    ct_tensor *v = ct_narrow(b, 0, 1, 1);
    ct_mul_scalar_(b, 5); /* the base itself */
    ASSERT_EQ(ct_tensor_backward(ct_sum(v, NULL, 0, false)), 0);
    ASSERT_NEAR(at(ct_tensor_grad(x2), 0), 0, 0);
    ASSERT_NEAR(at(ct_tensor_grad(x2), 1), 5, 0);
}

/* Assembles a [3, 4] matrix from pieces written into views of a buffer. */
static ct_tensor *assemble(void *ctx, ct_tensor *const *x, int n) {
    (void)ctx;
    (void)n;
    ct_tensor *buf = ct_zeros(CT_SHAPE(3, 4), CT_FLOAT64);
    ct_copy_(ct_slice(buf, 1, 0, 4, 2), ct_exp(x[0]));       /* [3, 2] into columns 0, 2 */
    ct_mul_(ct_select(buf, 0, 1), ct_narrow(x[1], 0, 0, 4)); /* row 1 times x1 */
    ct_add_(ct_narrow(ct_select(buf, 1, 3), 0, 1, 2), ct_narrow(x[1], 0, 0, 2));
    return ct_tanh(buf);
}

TEST(gradcheck_through_writes_into_views) {
    ct_tensor *x[2] = {ct_requires_grad_(tt_rand(CT_SHAPE(3, 2), CT_FLOAT64, 1), true),
                       ct_requires_grad_(tt_rand(CT_SHAPE(4), CT_FLOAT64, 2), true)};
    ASSERT_EQ(ct_gradcheck(assemble, NULL, x, 2, NULL), 0);
}
