/* ct_scaled_dot_product_attention against the same computation as a chain
 * of ops, its gradients, its dropout mask, and its errors. */
#include "ct_test.h"

#include <ct/nn.h>

/* The reference: matmul, mask, softmax, dropout, matmul, with the op's
 * mask semantics (ct_rand(float32) < 1 - p at the generator's state). */
static ct_tensor *reference(ct_tensor *q, ct_tensor *k, ct_tensor *v,
                            const ct_attention_options *o) {
    int64_t d = ct_size(q, -1), tq = ct_size(q, -2), tk = ct_size(k, -2);
    double scale = o->scale > 0 ? o->scale : 1 / sqrt((double)d);
    ct_tensor *s = ct_mul_scalar(ct_matmul(q, ct_transpose(k, -2, -1)), scale);
    if (o->causal)
        s = ct_masked_fill(s, ct_triu(ct_full(CT_SHAPE(tq, tk), 1, CT_BOOL), 1), -INFINITY);
    ct_tensor *w = ct_softmax(s, -1);
    if (o->dropout_p > 0) {
        ct_tensor *u = ct_rand(ct_ndim(w), ct_sizes(w), CT_FLOAT32, o->gen);
        ct_tensor *keep = ct_to_dtype(ct_lt_scalar(u, 1 - o->dropout_p), ct_tensor_dtype(w));
        w = ct_mul(w, ct_mul_scalar(keep, 1 / (1 - o->dropout_p)));
    }
    return ct_matmul(w, v);
}

typedef ct_tensor *(*attn_fn)(ct_tensor *q, ct_tensor *k, ct_tensor *v,
                              const ct_attention_options *o);

/* out and the gradients of sum(out * r) with respect to q, k and v. */
static void run(attn_fn f, ct_tensor *q, ct_tensor *k, ct_tensor *v, const ct_attention_options *o,
                ct_tensor *r, ct_tensor **out, ct_tensor *grads[3]) {
    ct_tensor *in[3] = {ct_requires_grad_(ct_clone(q), true), ct_requires_grad_(ct_clone(k), true),
                        ct_requires_grad_(ct_clone(v), true)};
    *out = f(in[0], in[1], in[2], o);
    ct_tensor *loss = ct_sum(ct_mul(*out, r), NULL, 0, false);
    if (!loss || ct_tensor_backward(loss))
        return;
    for (int i = 0; i < 3; i++)
        grads[i] = ct_tensor_grad(in[i]);
}

/* The op and the reference agree, forward and backward. */
static void check_against_reference(ct_tensor *q, ct_tensor *k, ct_tensor *v,
                                    const ct_attention_options *o, double tol) {
    ct_generator g0 = o->gen ? *o->gen : (ct_generator){0};
    ct_tensor *out, *ref, *g[3] = {NULL}, *gr[3] = {NULL};
    ct_tensor *probe = ct_scaled_dot_product_attention(q, k, v, o);
    ASSERT_TRUE(probe);
    ct_tensor *r = tt_rand(ct_ndim(probe), ct_sizes(probe), ct_tensor_dtype(q), 99);
    if (o->gen)
        *o->gen = g0;
    run(ct_scaled_dot_product_attention, q, k, v, o, r, &out, g);
    if (o->gen)
        *o->gen = g0;
    run(reference, q, k, v, o, r, &ref, gr);
    ASSERT_CLOSE(out, ref, tol, tol);
    for (int i = 0; i < 3; i++) {
        ASSERT_TRUE(g[i] && gr[i]);
        ASSERT_CLOSE(g[i], gr[i], tol, tol);
    }
}

TEST(matches_the_chain_of_ops_causal_or_not) {
    for (int causal = 0; causal < 2; causal++) {
        ct_attention_options o = {.causal = causal};
        ct_tensor *q = tt_rand(CT_SHAPE(2, 3, 5, 4), CT_FLOAT64, 1);
        ct_tensor *k = tt_rand(CT_SHAPE(2, 3, 5, 4), CT_FLOAT64, 2);
        ct_tensor *v = tt_rand(CT_SHAPE(2, 3, 5, 6), CT_FLOAT64, 3);
        check_against_reference(q, k, v, &o, 1e-12);
        /* More query rows than keys and the other way round. */
        check_against_reference(tt_rand(CT_SHAPE(3, 7, 4), CT_FLOAT64, 4),
                                tt_rand(CT_SHAPE(3, 2, 4), CT_FLOAT64, 5),
                                tt_rand(CT_SHAPE(3, 2, 3), CT_FLOAT64, 6), &o, 1e-12);
        check_against_reference(tt_rand(CT_SHAPE(3, 2, 4), CT_FLOAT64, 7),
                                tt_rand(CT_SHAPE(3, 9, 4), CT_FLOAT64, 8),
                                tt_rand(CT_SHAPE(3, 9, 3), CT_FLOAT64, 9), &o, 1e-12);
        /* Rows in several blocks: a causal block skips keys it cannot see. */
        check_against_reference(tt_rand(CT_SHAPE(2, 150, 8), CT_FLOAT64, 10),
                                tt_rand(CT_SHAPE(2, 150, 8), CT_FLOAT64, 11),
                                tt_rand(CT_SHAPE(2, 150, 5), CT_FLOAT64, 12), &o, 1e-12);
    }
}

TEST(reads_views_and_broadcasts_batch_dims) {
    /* q, k and v as the heads of one [B, T, 3, H, D] projection, as a GPT
     * block makes them: last dim contiguous, rows 3 H D apart. */
    ct_tensor *qkv = tt_rand(CT_SHAPE(2, 6, 3, 2, 4), CT_FLOAT64, 20);
    ct_tensor *q = ct_transpose(ct_select(qkv, 2, 0), 1, 2);
    ct_tensor *k = ct_transpose(ct_select(qkv, 2, 1), 1, 2);
    ct_tensor *v = ct_transpose(ct_select(qkv, 2, 2), 1, 2);
    ct_attention_options o = {.causal = true};
    check_against_reference(q, k, v, &o, 1e-12);
    /* Layouts BLAS cannot read, copied first. */
    for (int l = 0; l < TT_NLAYOUTS; l++)
        check_against_reference(tt_layout_of(tt_rand(CT_SHAPE(2, 5, 3), CT_FLOAT64, 21), l),
                                tt_layout_of(tt_rand(CT_SHAPE(2, 4, 3), CT_FLOAT64, 22), l),
                                tt_layout_of(tt_rand(CT_SHAPE(2, 4, 2), CT_FLOAT64, 23), l),
                                &(ct_attention_options){0}, 1e-12);
    /* Keys and values shared by every head (multi-query attention), and an
     * expanded query; their gradients sum over the broadcast dims. */
    ct_tensor *qb = tt_rand(CT_SHAPE(2, 3, 5, 4), CT_FLOAT64, 24);
    ct_tensor *kb = tt_rand(CT_SHAPE(2, 1, 5, 4), CT_FLOAT64, 25);
    ct_tensor *vb = tt_rand(CT_SHAPE(5, 2), CT_FLOAT64, 26);
    check_against_reference(qb, kb, vb, &o, 1e-12);
    ct_tensor *qe = ct_expand(tt_rand(CT_SHAPE(1, 5, 4), CT_FLOAT64, 27), CT_SHAPE(3, 5, 4));
    check_against_reference(qe, tt_rand(CT_SHAPE(3, 5, 4), CT_FLOAT64, 28),
                            tt_rand(CT_SHAPE(3, 5, 4), CT_FLOAT64, 29), &o, 1e-12);
}

TEST(dropout_uses_the_documented_mask) {
    ct_generator gen = {.seed = 5, .offset = 17};
    for (int causal = 0; causal < 2; causal++) {
        ct_attention_options o = {.causal = causal, .dropout_p = 0.25, .gen = &gen};
        check_against_reference(tt_rand(CT_SHAPE(2, 2, 70, 4), CT_FLOAT64, 30),
                                tt_rand(CT_SHAPE(2, 2, 70, 4), CT_FLOAT64, 31),
                                tt_rand(CT_SHAPE(2, 2, 70, 3), CT_FLOAT64, 32), &o, 1e-12);
    }
    /* The default generator advances: two calls draw different masks. */
    ct_manual_seed(3);
    ct_attention_options o = {.dropout_p = 0.5};
    ct_tensor *q = tt_rand(CT_SHAPE(8, 8), CT_FLOAT32, 33);
    ct_tensor *a = ct_scaled_dot_product_attention(q, q, q, &o);
    ct_tensor *b = ct_scaled_dot_product_attention(q, q, q, &o);
    ASSERT_TRUE(ct_item(ct_amax(ct_abs(ct_sub(a, b)), NULL, 0, false)) > 0);
    /* p = 1 drops everything. */
    o.dropout_p = 1;
    ASSERT_NEAR(
        ct_item(ct_amax(ct_abs(ct_scaled_dot_product_attention(q, q, q, &o)), NULL, 0, false)), 0,
        0);
}

static ct_generator gc_gen;

static ct_tensor *f_attn(void *ctx, ct_tensor *const *x, int n) {
    (void)n;
    ct_attention_options o = *(const ct_attention_options *)ctx;
    if (o.gen) {
        gc_gen = (ct_generator){.seed = 9, .offset = 0};
        o.gen = &gc_gen;
    }
    return ct_scaled_dot_product_attention(x[0], x[1], x[2], &o);
}

TEST(passes_gradcheck) {
    ct_attention_options opts[] = {
        {0}, {.causal = true, .scale = 0.7}, {.causal = true, .dropout_p = 0.3, .gen = &gc_gen}};
    for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
        ct_tensor *in[3] = {ct_requires_grad_(tt_rand(CT_SHAPE(2, 4, 3), CT_FLOAT64, 40), true),
                            ct_requires_grad_(tt_rand(CT_SHAPE(2, 5, 3), CT_FLOAT64, 41), true),
                            ct_requires_grad_(tt_rand(CT_SHAPE(1, 5, 2), CT_FLOAT64, 42), true)};
        ASSERT_EQ(ct_gradcheck(f_attn, &opts[i], in, 3, NULL), 0);
    }
}

/* Output and gradients at the given thread count. */
static void at_threads(int threads, ct_tensor *q, ct_tensor *k, ct_tensor *v, ct_tensor *r,
                       ct_tensor **out, ct_tensor *g[3]) {
    ct_set_num_threads(threads);
    ct_generator gen = {.seed = 1, .offset = 0};
    ct_attention_options o = {.causal = true, .dropout_p = 0.1, .gen = &gen};
    run(ct_scaled_dot_product_attention, q, k, v, &o, r, out, g);
}

TEST(results_do_not_depend_on_the_thread_count) {
    int before = ct_get_num_threads();
    ct_tensor *q = tt_rand(CT_SHAPE(3, 2, 100, 16), CT_FLOAT32, 50);
    ct_tensor *k = tt_rand(CT_SHAPE(3, 2, 100, 16), CT_FLOAT32, 51);
    ct_tensor *v = tt_rand(CT_SHAPE(3, 2, 100, 16), CT_FLOAT32, 52);
    ct_tensor *r = tt_rand(CT_SHAPE(3, 2, 100, 16), CT_FLOAT32, 53);
    ct_tensor *o1, *o2, *g1[3] = {NULL}, *g2[3] = {NULL};
    at_threads(1, q, k, v, r, &o1, g1);
    at_threads(2, q, k, v, r, &o2, g2);
    ct_set_num_threads(before);
    ASSERT_CLOSE(o2, o1, 0, 0);
    for (int i = 0; i < 3; i++)
        ASSERT_CLOSE(g2[i], g1[i], 0, 0);
}

TEST(float32_and_16_bit_floats_follow_float64) {
    ct_tensor *q = tt_rand(CT_SHAPE(2, 33, 8), CT_FLOAT64, 60);
    ct_tensor *k = tt_rand(CT_SHAPE(2, 33, 8), CT_FLOAT64, 61);
    ct_tensor *v = tt_rand(CT_SHAPE(2, 33, 8), CT_FLOAT64, 62);
    ct_attention_options o = {.causal = true};
    ct_tensor *want = ct_scaled_dot_product_attention(q, k, v, &o);
    ct_dtype dtypes[] = {CT_FLOAT32, CT_BFLOAT16, CT_FLOAT16};
    double tol[] = {1e-5, 3e-2, 4e-3};
    for (int i = 0; i < 3; i++) {
        ct_tensor *got = ct_scaled_dot_product_attention(
            ct_to_dtype(q, dtypes[i]), ct_to_dtype(k, dtypes[i]), ct_to_dtype(v, dtypes[i]), &o);
        ASSERT_TRUE(got);
        ASSERT_EQ(ct_tensor_dtype(got), dtypes[i]);
        ASSERT_CLOSE(ct_to_dtype(got, CT_FLOAT64), want, tol[i], tol[i]);
    }
}

TEST(empty_operands) {
    ct_attention_options o = {.causal = true};
    /* No keys: every row sums nothing. */
    ct_tensor *y = ct_scaled_dot_product_attention(
        ct_ones(CT_SHAPE(2, 3, 4), CT_FLOAT32), ct_ones(CT_SHAPE(2, 0, 4), CT_FLOAT32),
        ct_ones(CT_SHAPE(2, 0, 5), CT_FLOAT32), &(ct_attention_options){0});
    ASSERT_TRUE(y);
    ASSERT_EQ(ct_size(y, 2), 5);
    ASSERT_NEAR(ct_item(ct_amax(ct_abs(y), NULL, 0, false)), 0, 0);
    /* No queries, no batch, a zero head dim (uniform weights). */
    ct_tensor *e = ct_scaled_dot_product_attention(ct_ones(CT_SHAPE(2, 0, 4), CT_FLOAT32),
                                                   ct_ones(CT_SHAPE(2, 3, 4), CT_FLOAT32),
                                                   ct_ones(CT_SHAPE(2, 3, 5), CT_FLOAT32), &o);
    ASSERT_TRUE(e);
    ASSERT_EQ(ct_numel(e), 0);
    ASSERT_TRUE(ct_scaled_dot_product_attention(ct_ones(CT_SHAPE(0, 3, 4), CT_FLOAT32),
                                                ct_ones(CT_SHAPE(0, 3, 4), CT_FLOAT32),
                                                ct_ones(CT_SHAPE(0, 3, 5), CT_FLOAT32), &o));
    ct_tensor *v = ct_view(ct_arange(0, 6, 1, CT_FLOAT32), CT_SHAPE(3, 2));
    ct_tensor *u = ct_scaled_dot_product_attention(ct_ones(CT_SHAPE(3, 0), CT_FLOAT32),
                                                   ct_ones(CT_SHAPE(3, 0), CT_FLOAT32), v,
                                                   &(ct_attention_options){0});
    ASSERT_NEAR(ct_get(u, (int64_t[]){0, 0}), 2, 1e-6);
    ASSERT_NEAR(ct_get(u, (int64_t[]){2, 1}), 3, 1e-6);
}

TEST(bad_input_is_refused) {
    ct_tensor *x = ct_ones(CT_SHAPE(2, 3, 4), CT_FLOAT32);
    ASSERT_FAILS(ct_scaled_dot_product_attention(ct_ones(CT_SHAPE(2, 3, 4), CT_INT64), x, x, NULL),
                 CT_EDTYPE, "scaled_dot_product_attention", "floating-point");
    ASSERT_FAILS(
        ct_scaled_dot_product_attention(x, ct_ones(CT_SHAPE(2, 3, 4), CT_FLOAT64), x, NULL),
        CT_EDTYPE, "one floating-point dtype");
    ASSERT_FAILS(ct_scaled_dot_product_attention(ct_ones(CT_SHAPE(4), CT_FLOAT32), x, x, NULL),
                 CT_ESHAPE, "[..., Tq, D]");
    ASSERT_FAILS(
        ct_scaled_dot_product_attention(x, ct_ones(CT_SHAPE(2, 3, 5), CT_FLOAT32), x, NULL),
        CT_ESHAPE, "k float32[2, 3, 5]");
    ASSERT_FAILS(
        ct_scaled_dot_product_attention(x, x, ct_ones(CT_SHAPE(2, 2, 4), CT_FLOAT32), NULL),
        CT_ESHAPE, "v float32[2, 2, 4]");
    ASSERT_FAILS(ct_scaled_dot_product_attention(x, ct_ones(CT_SHAPE(3, 3, 4), CT_FLOAT32),
                                                 ct_ones(CT_SHAPE(3, 3, 4), CT_FLOAT32), NULL),
                 CT_ESHAPE, "scaled_dot_product_attention");
    ASSERT_FAILS(
        ct_scaled_dot_product_attention(x, x, x, &(ct_attention_options){.dropout_p = 1.5}),
        CT_EINVAL, "dropout_p", "1.5");
    ASSERT_FAILS(ct_scaled_dot_product_attention(x, x, x, &(ct_attention_options){.scale = -1}),
                 CT_EINVAL, "scale");
    /* The backward cannot be differentiated again. */
    ct_tensor *q = ct_requires_grad_(ct_ones(CT_SHAPE(3, 4), CT_FLOAT32), true);
    ct_tensor *y = ct_sum(ct_scaled_dot_product_attention(q, q, q, NULL), NULL, 0, false);
    ct_tensor *g = NULL;
    ASSERT_RC(ct_grad(&y, 1, NULL, &q, 1, &g, &(ct_grad_options){.create_graph = true}), CT_ENOTSUP,
              "create_graph");
}

/* The attention block reads its heads from the packed projection and
 * writes the packed gradient: the same numbers as the op on the heads'
 * views, dropout included (both draw from the default generator in the
 * same order). */
static ct_tensor *by_views(ct_module *m, ct_tensor *x) {
    ct_module *in = ct_module_child(m, "c_attn"), *out = ct_module_child(m, "c_proj");
    ct_tensor *qkv =
        ct_view(ct_linear(x, ct_module_param(in, "weight"), ct_module_param(in, "bias")),
                CT_SHAPE(2, 5, 3, 2, 3));
    ct_tensor *h[3];
    for (int i = 0; i < 3; i++)
        h[i] = ct_transpose(ct_select(qkv, 2, i), 1, 2);
    ct_attention_options o = {.causal = true, .dropout_p = 0.3};
    ct_tensor *y = ct_scaled_dot_product_attention(h[0], h[1], h[2], &o);
    y = ct_reshape(ct_transpose(y, 1, 2), CT_SHAPE(2, 5, 6));
    y = ct_linear(y, ct_module_param(out, "weight"), ct_module_param(out, "bias"));
    return ct_dropout(y, 0.3, true, NULL);
}

/* out, and the gradients of sum(out * r) for x and c_attn's weight. */
static void block_run(ct_module *m, ct_tensor *x, bool packed, ct_tensor **out,
                      ct_tensor *grads[2]) {
    ct_manual_seed(8);
    *out = packed ? ct_module_forward(m, x) : by_views(m, x);
    ct_tensor *r = tt_rand(CT_SHAPE(2, 5, 6), CT_FLOAT32, 77);
    ct_tensor *loss = ct_sum(ct_mul(*out, r), NULL, 0, false);
    ct_tensor *in[2] = {x, ct_module_param(ct_module_child(m, "c_attn"), "weight")};
    grads[0] = grads[1] = NULL;
    if (loss)
        ct_grad(&loss, 1, NULL, in, 2, grads, NULL);
}

TEST(the_attention_block_reads_and_writes_packed_heads) {
    ct_manual_seed(4);
    ct_module *m = ct_causal_self_attention_new(6, 2, 0.3);
    ASSERT_TRUE(m != NULL);
    ct_tensor *x = ct_requires_grad_(tt_rand(CT_SHAPE(2, 5, 6), CT_FLOAT32, 78), true);
    ct_tensor *got, *want, *g[2], *gw[2];
    block_run(m, x, true, &got, g);
    block_run(m, x, false, &want, gw);
    ASSERT_CLOSE(got, want, 1e-6, 1e-6);
    for (int i = 0; i < 2; i++) {
        ASSERT_TRUE(g[i] && gw[i]);
        ASSERT_CLOSE(g[i], gw[i], 1e-5, 1e-6);
    }
    ASSERT_FAILS(ct_module_forward(m, ct_ones(CT_SHAPE(2, 5, 4), CT_FLOAT32)), CT_ESHAPE,
                 "CausalSelfAttention", "[B, T, 6]");
    ct_module_free(m);
}
