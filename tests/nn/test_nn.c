/* nn: the module tree, layers, losses (against reference loops and
 * gradcheck), initializers and flat parameter buffers. */
#include "ct_test.h"

#include <ct/cuda.h>
#include <ct/nn.h>

static ct_tensor *doubles(int ndim, const int64_t *sizes, const double *v) {
    return ct_from_data(v, ndim, sizes, CT_FLOAT64);
}

/* ---------------------------------------------------------- the tree */

TEST(module_tree_names_parameters_in_pytorch_order) {
    ct_module *net = ct_sequential_new();
    ct_module *block = ct_module_new("Block", NULL, NULL, NULL);
    ASSERT_EQ(ct_module_add_child(block, "fc", ct_linear_new(3, 2, true)), 0);
    ASSERT_EQ(ct_module_add_child(block, "norm", ct_layer_norm_new(2, 1e-5)), 0);
    ASSERT_EQ(
        ct_module_add_param(block, "scale", ct_tensor_retain(ct_ones(CT_SHAPE(2), CT_FLOAT32))), 0);
    ASSERT_EQ(ct_sequential_append(net, ct_linear_new(4, 3, false)), 0);
    ASSERT_EQ(ct_sequential_append(net, block), 0);
    ct_param_list pl;
    ct_param_list_init(&pl);
    ASSERT_EQ(ct_module_named_parameters(net, &pl), 0);
    const char *want[] = {"0.weight",  "1.scale",       "1.fc.weight",
                          "1.fc.bias", "1.norm.weight", "1.norm.bias"};
    ASSERT_EQ(pl.n, 6);
    for (int i = 0; i < 6; i++)
        ASSERT_STR_CONTAINS(pl.names[i], want[i]);
    ASSERT_EQ(ct_param_list_numel(&pl), 12 + 2 + 6 + 2 + 2 + 2);
    ASSERT_TRUE(ct_param_list_find(&pl, "1.fc.bias") ==
                ct_module_param(ct_module_child(block, "fc"), "bias"));
    ASSERT_TRUE(ct_requires_grad(pl.tensors[0]));
    ASSERT_STR_CONTAINS(ct_module_path(ct_module_child(block, "norm")), "1.norm");
    ASSERT_STR_CONTAINS(ct_module_type(block), "Block");
    ASSERT_RC(ct_module_add_child(block, "fc", ct_relu_new()), CT_EINVAL,
              "already has something named 'fc'", "Block '1'");
    ASSERT_RC(ct_module_add_param(block, "a.b", ct_tensor_retain(ct_ones(CT_SHAPE(1), CT_FLOAT32))),
              CT_EINVAL, "invalid name");
    ASSERT_RC(ct_module_add_param(block, "ints", ct_tensor_retain(ct_ones(CT_SHAPE(1), CT_INT64))),
              CT_EDTYPE, "must be float");
    ASSERT_RC(ct_sequential_append(net, ct_linear_new(0, 3, true)), CT_EINVAL,
              "features must be positive");
    ASSERT_TRUE(ct_module_training(block));
    ct_module_train(net, false);
    ASSERT_TRUE(!ct_module_training(ct_module_child(block, "fc")));
    ct_param_list_free(&pl);
    ct_module_free(net);
    ct_module_free(NULL);
}

TEST(forward_errors_name_the_module) {
    ct_module *net = ct_sequential_new();
    ct_sequential_append(net, ct_linear_new(4, 3, true));
    ct_tensor *x = ct_ones(CT_SHAPE(2, 5), CT_FLOAT32);
    ASSERT_FAILS(ct_module_forward(net, x), CT_ESHAPE, "linear", "float32[2, 5]", "[3, 4]");
    ct_module *bare = ct_module_new("Container", NULL, NULL, NULL);
    ASSERT_FAILS(ct_module_forward(bare, x), CT_EINVAL, "Container", "no forward");
    ct_module_free(bare);
    ct_module_free(net);
}

/* -------------------------------------------------------------- layers */

TEST(linear_computes_x_wt_plus_b_and_is_initialised_like_pytorch) {
    ct_manual_seed(7);
    ct_module *fc = ct_linear_new(100, 30, true);
    ct_tensor *w = ct_module_param(fc, "weight"), *b = ct_module_param(fc, "bias");
    ASSERT_EQ(ct_size(w, 0), 30);
    ASSERT_TRUE(ct_item(ct_amax(ct_abs(w), NULL, 0, false)) <= 0.1);
    ASSERT_TRUE(ct_item(ct_amax(ct_abs(w), NULL, 0, false)) > 0.09);
    ASSERT_TRUE(ct_item(ct_amax(ct_abs(b), NULL, 0, false)) <= 0.1);
    ct_tensor *x = ct_randn(CT_SHAPE(2, 5, 100), CT_FLOAT32, NULL);
    ct_tensor *want = ct_add(ct_matmul(x, ct_transpose(w, 0, 1)), b);
    ASSERT_CLOSE(ct_module_forward(fc, x), want, 1e-6, 1e-6);
    /* A 1-D input with a frozen weight: only the bias gets a gradient. */
    ct_requires_grad_(w, false);
    ct_tensor *v = ct_select(ct_select(x, 0, 0), 0, 0);
    ct_tensor *y = ct_module_forward(fc, v);
    ASSERT_EQ(ct_ndim(y), 1);
    ASSERT_EQ(ct_tensor_backward(ct_sum(y, NULL, 0, false)), 0);
    ASSERT_NEAR(ct_item(ct_sum(ct_tensor_grad(b), NULL, 0, false)), 30, 0);
    ct_module_free(fc);
}

TEST(embedding_gathers_rows_and_accumulates_repeated_gradients) {
    ct_module *emb = ct_embedding_new(5, 3);
    ct_tensor *w = ct_module_param(emb, "weight");
    ct_tensor *idx = ct_from_data((int64_t[]){4, 0, 4, 2}, CT_SHAPE(2, 2), CT_INT64);
    ct_tensor *y = ct_module_forward(emb, idx);
    ASSERT_EQ(ct_ndim(y), 3);
    ASSERT_CLOSE(ct_select(ct_select(y, 0, 1), 0, 0), ct_select(w, 0, 4), 0, 0);
    ASSERT_EQ(ct_tensor_backward(ct_sum(y, NULL, 0, false)), 0);
    ct_tensor *g = ct_tensor_grad(w);
    ASSERT_NEAR(ct_get(g, (int64_t[]){4, 1}), 2, 0);
    ASSERT_NEAR(ct_get(g, (int64_t[]){1, 1}), 0, 0);
    ASSERT_FAILS(ct_module_forward(emb, ct_from_data((int64_t[]){5}, CT_SHAPE(1), CT_INT64)),
                 CT_ERANGE, "5");
    ASSERT_FAILS(ct_embedding(ct_ones(CT_SHAPE(2), CT_FLOAT32), w), CT_EINVAL, "integer indices");
    ct_module_free(emb);
}

static ct_tensor *f_layer_norm(void *ctx, ct_tensor *const *x, int n) {
    (void)ctx;
    (void)n;
    return ct_layer_norm(x[0], x[1], x[2], 1e-5);
}

TEST(layer_norm_normalizes_the_last_dim_and_passes_gradcheck) {
    ct_tensor *x = ct_add_scalar(ct_mul_scalar(tt_rand(CT_SHAPE(4, 6), CT_FLOAT64, 3), 3), 1);
    ct_tensor *y = ct_layer_norm(x, NULL, NULL, 0);
    ASSERT_NEAR(ct_item(ct_amax(ct_abs(ct_mean(y, CT_DIMS(-1), false)), NULL, 0, false)), 0, 1e-12);
    ASSERT_NEAR(ct_get(ct_var(y, CT_DIMS(-1), 0, false), (int64_t[]){2}), 1, 1e-9);
    ct_tensor *in[3] = {ct_requires_grad_(tt_layout_of(x, TT_TRANSPOSED), true),
                        ct_requires_grad_(tt_rand(CT_SHAPE(6), CT_FLOAT64, 4), true),
                        ct_requires_grad_(tt_rand(CT_SHAPE(6), CT_FLOAT64, 5), true)};
    ASSERT_EQ(ct_gradcheck(f_layer_norm, NULL, in, 3, NULL), 0);
    ASSERT_FAILS(ct_layer_norm(x, ct_ones(CT_SHAPE(5), CT_FLOAT64), NULL, 1e-5), CT_ESHAPE,
                 "layer_norm", "[6]");
}

TEST(dropout_masks_and_scales_in_training_only) {
    ct_manual_seed(11);
    ct_module *drop = ct_dropout_new(0.25);
    ct_tensor *x = ct_requires_grad_(ct_ones(CT_SHAPE(200, 100), CT_FLOAT32), true);
    ct_tensor *y = ct_module_forward(drop, x);
    double kept = ct_item(ct_mean(ct_to_dtype(ct_gt_scalar(y, 0), CT_FLOAT32), NULL, 0, false));
    ASSERT_NEAR(kept, 0.75, 0.02);
    ASSERT_NEAR(ct_item(ct_amax(y, NULL, 0, false)), 1 / 0.75, 1e-6);
    ASSERT_EQ(ct_tensor_backward(ct_sum(y, NULL, 0, false)), 0);
    ASSERT_CLOSE(ct_tensor_grad(x), y, 0, 0); /* d(sum(x * m)) / dx = m */
    ct_module_train(drop, false);
    ASSERT_CLOSE(ct_module_forward(drop, x), x, 0, 0);
    ASSERT_NEAR(ct_item(ct_sum(ct_dropout(x, 1, true, NULL), NULL, 0, false)), 0, 0);
    ASSERT_FAILS(ct_dropout(x, 1.5, true, NULL), CT_EINVAL, "[0, 1]");
    ASSERT_TRUE(ct_dropout_new(-0.1) == NULL);
    ct_module_free(drop);
}

TEST(dropout_keyed_by_rows_gives_each_row_its_own_mask) {
    /* Rows 1 and 3 of a batch of 4, as a second rank of two holds them,
     * get the masks that one process holding all 4 draws for them; both
     * generators advance alike. */
    ct_tensor *x = ct_ones(CT_SHAPE(4, 50), CT_FLOAT32);
    ct_generator whole = {3, 0}, half = {3, 0};
    const int64_t every[] = {0, 1, 2, 3}; /* rows live while set */
    ASSERT_EQ(ct_dropout_key_rows(every, 4, 4), 0);
    ct_tensor *all = ct_dropout(x, 0.5, true, &whole);
    const int64_t mine[] = {1, 3};
    ASSERT_EQ(ct_dropout_key_rows(mine, 2, 4), 0);
    ct_tensor *two = ct_dropout(ct_ones(CT_SHAPE(2, 50), CT_FLOAT32), 0.5, true, &half);
    ASSERT_CLOSE(ct_select(two, 0, 0), ct_select(all, 0, 1), 0, 0);
    ASSERT_CLOSE(ct_select(two, 0, 1), ct_select(all, 0, 3), 0, 0);
    ASSERT_EQ(half.offset, whole.offset);
    /* Another row count draws as before; clearing turns the keys off. */
    ct_generator plain = {3, 0}, keyed = {3, 0};
    ASSERT_CLOSE(ct_dropout(x, 0.5, true, &keyed), ct_dropout(x, 0.5, true, &plain), 0, 0);
    ASSERT_RC(ct_dropout_key_rows((const int64_t[]){0, 4}, 2, 4), CT_EINVAL, "dropout_key_rows",
              "rows[1] is 4");
    ASSERT_EQ(ct_dropout_key_rows(NULL, 0, 0), 0);
    ct_generator g1 = {3, 0}, g2 = {3, 0};
    ASSERT_CLOSE(ct_dropout(ct_ones(CT_SHAPE(2, 50), CT_FLOAT32), 0.5, true, &g1),
                 ct_mul_scalar(ct_bernoulli_(ct_ones(CT_SHAPE(2, 50), CT_FLOAT32), 0.5, &g2), 2), 0,
                 0);
}

TEST(activation_modules) {
    ct_tensor *x = tt_rand(CT_SHAPE(3, 4), CT_FLOAT32, 9);
    ct_module *mods[] = {ct_relu_new(), ct_gelu_new(false), ct_gelu_new(true),
                         ct_tanh_new(), ct_sigmoid_new(),   ct_silu_new()};
    ct_tensor *want[] = {ct_relu(x), ct_gelu(x),    ct_gelu_tanh(x),
                         ct_tanh(x), ct_sigmoid(x), ct_silu(x)};
    for (int i = 0; i < 6; i++) {
        ASSERT_CLOSE(ct_module_forward(mods[i], x), want[i], 0, 0);
        ct_module_free(mods[i]);
    }
}

/* -------------------------------------------------------------- losses */

/* PyTorch's cross-entropy written out in double precision. */
static double reference_ce(ct_tensor *x, const int64_t *t, int64_t n, int64_t c,
                           const ct_loss_options *o, double *per) {
    double total = 0;
    int64_t valid = 0;
    for (int64_t i = 0; i < n; i++) {
        per[i] = 0;
        if (t[i] == o->ignore_index)
            continue;
        double m = -INFINITY, s = 0, sum = 0;
        for (int64_t k = 0; k < c; k++)
            m = fmax(m, ct_get(x, (int64_t[]){i, k}));
        for (int64_t k = 0; k < c; k++) {
            double v = ct_get(x, (int64_t[]){i, k});
            s += exp(v - m);
            sum += v;
        }
        double lse = m + log(s), e = o->label_smoothing;
        per[i] = lse - (1 - e) * ct_get(x, (int64_t[]){i, t[i]}) - e / (double)c * sum;
        total += per[i];
        valid++;
    }
    return o->reduction == CT_REDUCTION_MEAN ? total / (double)valid : total;
}

typedef struct ce_case {
    ct_loss_options o;
    const int64_t *t;
} ce_case;

static ct_tensor *f_ce(void *ctx, ct_tensor *const *x, int n) {
    (void)n;
    const ce_case *c = ctx;
    ct_tensor *t = ct_from_data(c->t, CT_SHAPE(5), CT_INT64);
    return ct_cross_entropy(x[0], t, &c->o);
}

TEST(cross_entropy_matches_the_reference_and_gradcheck) {
    /* The third case ignores class 3 instead of -100. */
    const int64_t targets[2][5] = {{3, 0, -100, 6, 3}, {3, 0, 1, 6, 3}};
    ct_loss_options opts[] = {CT_LOSS_DEFAULTS,
                              {CT_REDUCTION_SUM, -100, 0.1},
                              {CT_REDUCTION_NONE, 3, 0.25},
                              {CT_REDUCTION_MEAN, -100, 1.0}};
    for (int k = 0; k < 4; k++) {
        const int64_t *t = targets[k == 2];
        ct_tensor *x = ct_mul_scalar(tt_rand(CT_SHAPE(5, 7), CT_FLOAT64, 20 + k), 3);
        double per[5];
        double want = reference_ce(x, t, 5, 7, &opts[k], per);
        ct_tensor *tt = ct_from_data(t, CT_SHAPE(5), CT_INT64);
        ct_tensor *got = ct_cross_entropy(x, tt, &opts[k]);
        ASSERT_TRUE(got);
        if (opts[k].reduction == CT_REDUCTION_NONE)
            ASSERT_CLOSE(got, doubles(1, (int64_t[]){5}, per), 1e-12, 1e-12);
        else
            ASSERT_NEAR(ct_item(got), want, 1e-12);
        ct_tensor *f32 = ct_cross_entropy(ct_to_dtype(x, CT_FLOAT32), tt, &opts[k]);
        ASSERT_EQ(ct_tensor_dtype(f32), CT_FLOAT32);
        ce_case c = {opts[k], t};
        for (int l = 0; l < TT_NLAYOUTS; l++) {
            ct_tensor *in = ct_requires_grad_(tt_layout_of(x, (tt_layout)l), true);
            ASSERT_EQ(ct_gradcheck(f_ce, &c, &in, 1, NULL), 0);
        }
    }
}

TEST(cross_entropy_edge_cases_and_errors) {
    ct_tensor *x = tt_rand(CT_SHAPE(3, 4), CT_FLOAT32, 1);
    ASSERT_FAILS(
        ct_cross_entropy(x, ct_from_data((int64_t[]){0, 4, 1}, CT_SHAPE(3), CT_INT64), NULL),
        CT_ERANGE, "target 4 at position 1", "[0, 4)");
    ASSERT_FAILS(ct_cross_entropy(x, ct_zeros(CT_SHAPE(2), CT_INT64), NULL), CT_ESHAPE, "[N]");
    ASSERT_FAILS(ct_cross_entropy(x, ct_zeros(CT_SHAPE(3), CT_FLOAT32), NULL), CT_EDTYPE,
                 "class indices");
    ct_loss_options bad = {CT_REDUCTION_MEAN, -100, 2};
    ASSERT_FAILS(ct_cross_entropy(x, ct_zeros(CT_SHAPE(3), CT_INT64), &bad), CT_EINVAL,
                 "label_smoothing");
    /* Every target ignored: the mean is NaN, as in PyTorch. */
    ct_tensor *all = ct_full(CT_SHAPE(3), -100, CT_INT64);
    ASSERT_TRUE(isnan(ct_item(ct_cross_entropy(x, all, NULL))));
    /* One unbatched sample. */
    ct_tensor *row = ct_select(x, 0, 2);
    ct_tensor *one = ct_cross_entropy(row, ct_scalar(1, CT_INT64), NULL);
    ct_tensor *batched =
        ct_cross_entropy(ct_unsqueeze(row, 0), ct_full(CT_SHAPE(1), 1, CT_INT64), NULL);
    ASSERT_NEAR(ct_item(one), ct_item(batched), 1e-6);
    /* Large logits stay finite. */
    ct_tensor *big = ct_from_data((float[]){1000, -1000, 0}, CT_SHAPE(1, 3), CT_FLOAT32);
    ASSERT_NEAR(ct_item(ct_cross_entropy(big, ct_zeros(CT_SHAPE(1), CT_INT64), NULL)), 0, 1e-6);
    /* Double backward needs the logits themselves: a converted copy has no
     * history. */
    ct_tensor *g;
    ct_grad_options cg = {.create_graph = true};
    ct_tensor *half = ct_requires_grad_(ct_to_dtype(x, CT_FLOAT16), true);
    ct_tensor *loss = ct_cross_entropy(half, ct_zeros(CT_SHAPE(3), CT_INT64), NULL);
    ASSERT_RC(ct_grad(&loss, 1, NULL, &half, 1, &g, &cg), CT_ENOTSUP, "create_graph",
              "float32 or float64");
}

/* The loss is (max - x[t]) + log(sum exp(x - max)), and the gradient
 * exp((x - max) - log sum): max + log sum, in the logits' dtype, rounds the
 * log to the spacing of the logits, about log 2 itself at 1e4 in float32
 * (1e16 in float64). */
TEST(cross_entropy_keeps_accuracy_at_large_logits) {
    static const double big[] = {1e4, 1e16};
    for (int dt = 0; dt < 2; dt++) {
        ct_dtype dtype = dt ? CT_FLOAT64 : CT_FLOAT32;
        double tol = dt ? 1e-15 : 1e-7, b = big[dt];
        ct_tensor *x = ct_requires_grad_(
            ct_to_dtype(doubles(2, (int64_t[]){1, 3}, (double[]){b, b, 0}), dtype), true);
        ct_tensor *loss = ct_cross_entropy(x, ct_zeros(CT_SHAPE(1), CT_INT64), NULL);
        ASSERT_NEAR(ct_item(loss), log(2.0), tol);
        ASSERT_EQ(ct_backward(&loss, 1, NULL, false), 0);
        ASSERT_CLOSE(ct_to_dtype(ct_tensor_grad(x), CT_FLOAT64),
                     doubles(2, (int64_t[]){1, 3}, (double[]){-0.5, 0.5, 0}), 0, tol);
        /* Label smoothing spreads the target over classes equal to the max:
         * the loss stays log 2. */
        ct_loss_options o = {CT_REDUCTION_NONE, -100, 0.5};
        ct_tensor *x2 = ct_to_dtype(doubles(2, (int64_t[]){1, 2}, (double[]){b, b}), dtype);
        ct_tensor *per = ct_cross_entropy(x2, ct_ones(CT_SHAPE(1), CT_INT64), &o);
        ASSERT_NEAR(ct_get(per, (int64_t[]){0}), log(2.0), tol);
    }
}

static ct_tensor *f_nll(void *ctx, ct_tensor *const *x, int n) {
    (void)n;
    const ce_case *c = ctx;
    ct_tensor *t = ct_from_data(c->t, CT_SHAPE(5), CT_INT64);
    return ct_nll_loss(ct_log_softmax(x[0], 1), t, &c->o);
}

TEST(nll_of_log_softmax_equals_cross_entropy) {
    const int64_t t[5] = {1, -100, 2, 0, 2};
    ct_tensor *x = tt_rand(CT_SHAPE(5, 3), CT_FLOAT64, 2);
    for (int r = 0; r < 3; r++) {
        ct_loss_options o = {(ct_reduction)r, -100, 0};
        ct_tensor *tt = ct_from_data(t, CT_SHAPE(5), CT_INT64);
        ASSERT_CLOSE(ct_nll_loss(ct_log_softmax(x, 1), tt, &o), ct_cross_entropy(x, tt, &o), 1e-12,
                     1e-12);
        ce_case c = {o, t};
        ct_tensor *in = ct_requires_grad_(ct_clone(x), true);
        ASSERT_EQ(ct_gradcheck(f_nll, &c, &in, 1, NULL), 0);
    }
    ASSERT_FAILS(
        ct_nll_loss(x, ct_from_data((int64_t[]){0, 1, 2, 3, 0}, CT_SHAPE(5), CT_INT64), NULL),
        CT_ERANGE, "outside the 3 classes");
}

TEST(mse_loss_reductions) {
    ct_tensor *a = doubles(2, (int64_t[]){2, 2}, (double[]){1, 2, 3, 4});
    ct_tensor *b = doubles(1, (int64_t[]){2}, (double[]){0, 2});
    ASSERT_NEAR(ct_item(ct_mse_loss(a, b, CT_REDUCTION_MEAN)), (1 + 0 + 9 + 4) / 4.0, 0);
    ASSERT_NEAR(ct_item(ct_mse_loss(a, b, CT_REDUCTION_SUM)), 14, 0);
    ASSERT_EQ(ct_numel(ct_mse_loss(a, b, CT_REDUCTION_NONE)), 4);
    ASSERT_FAILS(ct_mse_loss(a, b, (ct_reduction)7), CT_EINVAL, "reduction");
}

/* -------------------------------------------------------- initializers */

TEST(initializers_follow_pytorch_fans) {
    ct_generator g = {.seed = 5};
    ct_tensor *w = ct_empty(CT_SHAPE(64, 32, 3), CT_FLOAT32); /* fan_in 96, fan_out 192 */
    ct_init_kaiming_uniform_(w, 0, CT_FAN_IN, &g);
    double bound = sqrt(3.0) * sqrt(2.0) / sqrt(96.0);
    ASSERT_TRUE(ct_item(ct_amax(ct_abs(w), NULL, 0, false)) <= bound);
    ASSERT_NEAR(ct_item(ct_std(w, NULL, 0, 1, false)), sqrt(2.0 / 96), 0.01);
    ct_init_kaiming_normal_(w, 0, CT_FAN_OUT, &g);
    ASSERT_NEAR(ct_item(ct_std(w, NULL, 0, 1, false)), sqrt(2.0 / 192), 0.01);
    ct_init_xavier_uniform_(w, 1, &g);
    ASSERT_NEAR(ct_item(ct_std(w, NULL, 0, 1, false)), sqrt(2.0 / 288), 0.005);
    ct_init_xavier_normal_(w, 2, &g);
    ASSERT_NEAR(ct_item(ct_std(w, NULL, 0, 1, false)), 2 * sqrt(2.0 / 288), 0.01);
    ct_init_normal_(w, 3, 0.5, &g);
    ASSERT_NEAR(ct_item(ct_mean(w, NULL, 0, false)), 3, 0.01);
    ct_init_constant_(w, 2.5);
    ASSERT_NEAR(ct_item(ct_amin(w, NULL, 0, false)), 2.5, 0);
    ct_init_zeros_(w);
    ASSERT_NEAR(ct_item(ct_amax(ct_abs(w), NULL, 0, false)), 0, 0);
    ASSERT_FAILS(ct_init_kaiming_uniform_(ct_empty(CT_SHAPE(5), CT_FLOAT32), 0, CT_FAN_IN, &g),
                 CT_EINVAL, "at least 2 dims");
    /* Initialising a parameter is not recorded and not refused. */
    ct_tensor *p = ct_requires_grad_(ct_empty(CT_SHAPE(4, 4), CT_FLOAT32), true);
    ASSERT_TRUE(ct_init_xavier_uniform_(p, 1, &g) && ct_is_leaf(p));
}

/* ------------------------------------------------------------ flattening */

TEST(flatten_puts_parameters_and_gradients_in_one_buffer) {
    ct_manual_seed(3);
    ct_module *net = ct_sequential_new();
    ct_sequential_append(net, ct_linear_new(5, 4, true));
    ct_sequential_append(net, ct_relu_new());
    ct_sequential_append(net, ct_linear_new(4, 2, true));
    ct_tensor *x = ct_randn(CT_SHAPE(3, 5), CT_FLOAT32, NULL);
    ct_tensor *before = ct_clone(ct_module_forward(net, x));
    ASSERT_EQ(ct_module_flatten(net, true), 0);
    ct_tensor *flat = ct_module_flat_params(net), *flat_grad = ct_module_flat_grads(net);
    ASSERT_EQ(ct_numel(flat), 20 + 4 + 8 + 2);
    ct_param_list pl;
    ct_param_list_init(&pl);
    ct_module_named_parameters(net, &pl);
    int64_t at = 0;
    for (int i = 0; i < pl.n; i++) {
        ct_tensor *p = pl.tensors[i];
        ASSERT_TRUE(ct_tensor_storage(p) == ct_tensor_storage(flat));
        ASSERT_EQ(ct_tensor_offset(p), at);
        ASSERT_TRUE(ct_tensor_storage(ct_tensor_grad(p)) == ct_tensor_storage(flat_grad));
        ASSERT_TRUE(ct_is_leaf(p) && ct_requires_grad(p));
        at += ct_numel(p);
    }
    ASSERT_CLOSE(ct_module_forward(net, x), before, 0, 0);
    ct_tensor *loss = ct_sum(ct_module_forward(net, x), NULL, 0, false);
    ASSERT_EQ(ct_tensor_backward(loss), 0);
    ASSERT_NEAR(ct_item(ct_sum(ct_narrow(flat_grad, 0, 32, 2), NULL, 0, false)), 6, 1e-6);
    ct_module *child = ct_module_child(net, "0");
    ASSERT_RC(ct_module_flatten(child, true), CT_EINVAL, "not the root");
    ct_param_list_free(&pl);
    ct_module_free(net);
}

/* The gradient of the loss as a function of the logits: gradcheck then
 * checks the second derivative. */
static ct_tensor *f_ce_grad(void *ctx, ct_tensor *const *x, int n) {
    (void)n;
    const ce_case *c = ctx;
    ct_tensor *t = ct_from_data(c->t, CT_SHAPE(5), CT_INT64);
    ct_tensor *loss = ct_cross_entropy(x[0], t, &c->o), *g = NULL;
    if (c->o.reduction == CT_REDUCTION_NONE)
        loss = ct_sum(ct_mul(loss, ct_arange(1, 6, 1, CT_FLOAT64)), NULL, 0, false);
    ct_grad_options cg = {.create_graph = true};
    return loss && !ct_grad(&loss, 1, NULL, x, 1, &g, &cg) ? ct_mul(g, g) : NULL;
}

/* ct_module_to: to where the tensors are already it changes nothing; to a
 * device that is not there it fails and leaves every parameter; after
 * flattening it refuses. (test_cuda moves modules to a real device.) */
TEST(module_to_moves_all_or_nothing) {
    ct_module *net = ct_sequential_new();
    ct_sequential_append(net, ct_linear_new(4, 3, true));
    ct_sequential_append(net, ct_layer_norm_new(3, 1e-5));
    ct_tensor *w = ct_module_param(ct_module_child_at(net, 0), "weight");
    ASSERT_EQ(ct_module_to(net, CT_DEVICE_CPU), 0);
    ASSERT_TRUE(ct_module_param(ct_module_child_at(net, 0), "weight") == w);
    ASSERT_RC(ct_module_to(net, (ct_device){CT_CUDA, ct_cuda_device_count()}), CT_EDEVICE, "cuda:");
    ASSERT_TRUE(ct_module_param(ct_module_child_at(net, 0), "weight") == w);
    ASSERT_TRUE(ct_requires_grad(w));
    ASSERT_EQ(ct_module_flatten(net, false), 0);
    ASSERT_RC(ct_module_to(net, CT_DEVICE_CPU), CT_ESTATE, "flattened", "before ct_module_flatten");
    ASSERT_RC(ct_module_to(NULL, CT_DEVICE_CPU), CT_EINVAL, "module_to");
    ct_module_free(net);
}

TEST(cross_entropy_can_be_differentiated_twice) {
    const int64_t t[5] = {3, 0, -100, 6, 3};
    ct_loss_options opts[] = {
        CT_LOSS_DEFAULTS, {CT_REDUCTION_SUM, -100, 0.1}, {CT_REDUCTION_NONE, -100, 0.25}};
    for (int k = 0; k < 3; k++) {
        ce_case c = {opts[k], t};
        ct_tensor *in = ct_requires_grad_(tt_rand(CT_SHAPE(5, 7), CT_FLOAT64, 40 + k), true);
        ASSERT_EQ(ct_gradcheck(f_ce_grad, &c, &in, 1, NULL), 0);
    }
}
