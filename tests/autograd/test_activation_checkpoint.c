/* Activation checkpointing: identical gradients (dropout included), less
 * peak memory, nesting, and the errors for misuse. */
#include "ct_test.h"

#include <ct/nn.h>

enum { WIDTH = 256, DEPTH = 16, BATCH = 256 };

static ct_module *block(void) {
    ct_module *b = ct_sequential_new();
    ct_sequential_append(b, ct_linear_new(WIDTH, WIDTH, true));
    ct_sequential_append(b, ct_gelu_new(true));
    ct_sequential_append(b, ct_dropout_new(0.1));
    return b;
}

static int run_block(void *ctx, ct_tensor *const *in, int n, ct_tensor **out, int m) {
    (void)n;
    (void)m;
    out[0] = ct_module_forward(ctx, in[0]);
    return out[0] ? 0 : ct_errcode();
}

/* Two checkpointed blocks inside one checkpoint. */
static int run_pair(void *ctx, ct_tensor *const *in, int n, ct_tensor **out, int m) {
    ct_module **pair = ctx;
    ct_tensor *mid;
    int rc = ct_activation_checkpoint(run_block, pair[0], in, n, &mid, 1);
    return rc ? rc : ct_activation_checkpoint(run_block, pair[1], &mid, 1, out, m);
}

typedef enum mode { PLAIN, CHECKPOINTED, NESTED } mode;

typedef struct usage {
    int64_t held; /* bytes kept from the end of forward to backward */
    int64_t peak; /* the most held at once during the step */
} usage;

/* One training step's forward and backward, measured against what was held
 * before it. */
static usage step(ct_module **blocks, ct_tensor *x, mode how, int *rc) {
    ct_manual_seed(42);
    int64_t base = ct_memory_allocated(CT_DEVICE_CPU);
    ct_memory_reset_peak(CT_DEVICE_CPU);
    ct_scope_begin();
    /* The first block runs normally so that the checkpointed ones get an
     * input that requires grad. */
    ct_tensor *h = ct_module_forward(blocks[0], x);
    for (int i = 1; i < DEPTH && h;) {
        ct_tensor *next = NULL;
        if (how == NESTED && i + 1 < DEPTH) {
            *rc = ct_activation_checkpoint(run_pair, &blocks[i], &h, 1, &next, 1);
            i += 2;
        } else if (how != PLAIN) {
            *rc = ct_activation_checkpoint(run_block, blocks[i], &h, 1, &next, 1);
            i++;
        } else {
            next = ct_module_forward(blocks[i++], h);
        }
        h = next;
    }
    ct_tensor *loss = ct_mean(ct_mul(h, h), NULL, 0, false);
    usage u = {ct_memory_allocated(CT_DEVICE_CPU) - base, 0};
    if (!loss || (*rc = ct_tensor_backward(loss)))
        *rc = *rc ? *rc : ct_errcode();
    ct_scope_end();
    u.peak = ct_memory_peak(CT_DEVICE_CPU) - base;
    return u;
}

static ct_tensor *grads_of(ct_module **blocks) {
    ct_tensor *parts[DEPTH * 2];
    for (int i = 0; i < DEPTH; i++) {
        ct_module *fc = ct_module_child(blocks[i], "0");
        parts[2 * i] = ct_flatten(ct_tensor_grad(ct_module_param(fc, "weight")), 0, -1);
        parts[2 * i + 1] = ct_tensor_grad(ct_module_param(fc, "bias"));
    }
    return ct_cat(parts, DEPTH * 2, 0);
}

static void zero_grads(ct_module **blocks) {
    for (int i = 0; i < DEPTH; i++) {
        ct_module *fc = ct_module_child(blocks[i], "0");
        ct_tensor_set_grad(ct_module_param(fc, "weight"), NULL);
        ct_tensor_set_grad(ct_module_param(fc, "bias"), NULL);
    }
}

TEST(checkpointed_gradients_equal_plain_ones_with_less_memory) {
    ct_manual_seed(1);
    ct_module *blocks[DEPTH];
    for (int i = 0; i < DEPTH; i++)
        blocks[i] = block();
    ct_tensor *x = ct_randn(CT_SHAPE(BATCH, WIDTH), CT_FLOAT32, NULL);
    int rc = 0;
    usage use[3] = {step(blocks, x, PLAIN, &rc)};
    ASSERT_EQ(rc, 0);
    ct_tensor *want = ct_clone(grads_of(blocks));
    const char *names[] = {"plain", "checkpointed", "nested"};
    for (int how = CHECKPOINTED; how <= NESTED; how++) {
        zero_grads(blocks);
        use[how] = step(blocks, x, (mode)how, &rc);
        ASSERT_EQ(rc, 0);
        /* Bit for bit: the recomputation redraws the same dropout masks. */
        ASSERT_CLOSE(grads_of(blocks), want, 0, 0);
    }
    for (int how = PLAIN; how <= NESTED; how++)
        printf("  %-12s kept after forward %6.1f MiB, peak %6.1f MiB\n", names[how],
               use[how].held / 1048576.0, use[how].peak / 1048576.0);
    /* A checkpointed block keeps its [256, 256] input, not the outputs of
     * matmul, bias, gelu and dropout and the dropout mask. The peak also
     * holds the weight gradients and one block's backward. */
    ASSERT_TRUE(use[CHECKPOINTED].held * 3 < use[PLAIN].held);
    ASSERT_TRUE(use[NESTED].held < use[CHECKPOINTED].held);
    ASSERT_TRUE(use[CHECKPOINTED].peak * 10 < use[PLAIN].peak * 6);
    for (int i = 0; i < DEPTH; i++)
        ct_module_free(blocks[i]);
}

TEST(checkpoint_misuse_is_a_clear_error) {
    ct_module *b = block();
    ct_tensor *x = ct_randn(CT_SHAPE(2, WIDTH), CT_FLOAT32, NULL), *out = NULL;
    ASSERT_RC(ct_activation_checkpoint(run_block, b, &x, 1, &out, 1), CT_EINVAL,
              "none of the 1 inputs requires grad");
    ASSERT_RC(ct_activation_checkpoint(NULL, b, &x, 1, &out, 1), CT_EINVAL, "bad arguments");
    ct_tensor *xg = ct_requires_grad_(ct_clone(x), true);
    ASSERT_EQ(ct_activation_checkpoint(run_block, b, &xg, 1, &out, 1), 0);
    ASSERT_STR_CONTAINS(ct_node_name(ct_tensor_grad_fn(out)), "Checkpoint");
    ct_tensor *loss = ct_sum(out, NULL, 0, false), *g = NULL;
    ASSERT_RC(ct_grad(&loss, 1, NULL, &xg, 1, &g, NULL), CT_ENOTSUP, "ct_grad", "use ct_backward");
    /* With grad mode off it simply runs fn. */
    bool prev = ct_set_grad_enabled(false);
    ASSERT_EQ(ct_activation_checkpoint(run_block, b, &x, 1, &out, 1), 0);
    ct_set_grad_enabled(prev);
    ASSERT_TRUE(out && !ct_requires_grad(out));
    ct_module_free(b);
}

/* The name before 1.0 still works, and says it is deprecated. */
TEST(the_deprecated_name_runs_the_same_checkpoint) {
    ct_module *b = block();
    ct_tensor *x = ct_requires_grad_(ct_randn(CT_SHAPE(2, WIDTH), CT_FLOAT32, NULL), true);
    ct_tensor *out = NULL;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    ASSERT_EQ(ct_checkpoint(run_block, b, &x, 1, &out, 1), 0);
    ct_checkpoint_fn fn = run_block;
#pragma GCC diagnostic pop
    ASSERT_TRUE(fn == run_block);
    ASSERT_STR_CONTAINS(ct_node_name(ct_tensor_grad_fn(out)), "Checkpoint");
    ct_module_free(b);
}
