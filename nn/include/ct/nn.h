/* ct/nn.h: modules, layers, losses and initializers.
 *
 * A ct_module is a node of a module tree, as in PyTorch: it owns its
 * parameters (leaf tensors that require grad), its buffers and its children,
 * each under a name, so that a tree gives every parameter a dotted name such
 * as "layers.1.weight". Built-in layers (Linear, Embedding, LayerNorm,
 * Dropout, activations), the transformer blocks of a GPT (attention, MLP,
 * Block, GPT) and Sequential are modules; ct_module_new() makes custom
 * ones with their own forward.
 *
 * Example:
 *
 *     #include <ct/nn.h>
 *     #include <stdio.h>
 *
 *     int main(void) {
 *         ct_manual_seed(0);
 *         ct_module *net = ct_sequential_new();
 *         ct_sequential_append(net, ct_linear_new(4, 8, true));
 *         ct_sequential_append(net, ct_relu_new());
 *         ct_sequential_append(net, ct_linear_new(8, 3, true));
 *         ct_param_list params;
 *         ct_param_list_init(&params);
 *         int rc = net ? ct_module_named_parameters(net, &params) : ct_errcode();
 *         for (int i = 0; rc == 0 && i < params.n; i++)
 *             printf("%s %lld\n", params.names[i], (long long)ct_numel(params.tensors[i]));
 *         ct_scope_begin();
 *         ct_tensor *x = ct_randn(CT_SHAPE(5, 4), CT_FLOAT32, NULL);
 *         ct_tensor *y = ct_from_data((int64_t[]){0, 2, 1, 1, 0}, CT_SHAPE(5), CT_INT64);
 *         ct_tensor *loss = ct_cross_entropy(ct_module_forward(net, x), y, NULL);
 *         if (rc == 0)
 *             rc = loss ? ct_tensor_backward(loss) : ct_errcode();
 *         if (rc == 0)
 *             printf("loss %.4f\n", ct_item(loss));
 *         else
 *             fprintf(stderr, "%s\n", ct_errmsg());
 *         ct_scope_end();
 *         ct_param_list_free(&params);
 *         ct_module_free(net);
 *         return rc ? 1 : 0;
 *     }
 *
 * Ownership. A module owns its parameters, buffers and children; adding a
 * child transfers ownership to the parent, and ct_module_free() frees the
 * whole tree. Constructors return NULL on error (a NULL child makes
 * ct_sequential_append() fail with the first message, so a tree can be built
 * and checked once). Forward functions and losses return op results, owned
 * like any op result (by the current scope).
 *
 * Errors. As everywhere in ct: NULL or a negative CT_E* code, with a message
 * naming the module (by its dotted path), the shapes and what was expected.
 *
 * Threads. A module may run forward on several threads at once (its
 * parameters are only read), but changing it (adding parameters or children,
 * flattening, train/eval) is not thread-safe.
 */
#ifndef CT_NN_H
#define CT_NN_H

#include <ct/autograd.h>

#ifdef __cplusplus
extern "C" {
#endif

/* --------------------------------------------------------------- modules */

typedef struct ct_module ct_module;

/* A module's forward: one input, one output (an op result). */
typedef ct_tensor *(*ct_forward_fn)(ct_module *m, ct_tensor *x);

/* A custom module of the given type name (static string). state is owned:
 * free_state(state) runs when the module is freed (free_state may be
 * NULL). forward may be NULL for containers that are not called directly.
 * NULL on out of memory. */
CT_API ct_module *ct_module_new(const char *type, ct_forward_fn forward, void *state,
                                void (*free_state)(void *state));
/* Frees m, its parameters, buffers and children; accepts NULL. */
CT_API void ct_module_free(ct_module *m);
/* Runs m's forward. While anomaly mode is on, nodes recorded inside are
 * labelled with the module's dotted path. */
CT_API ct_tensor *ct_module_forward(ct_module *m, ct_tensor *x);

/* Hooks around m's forward (PyTorch's forward pre-hook and forward hook),
 * one pair per module: pre (may be NULL) runs before the forward, and a
 * CT_E* code from it fails the forward; post (may be NULL) runs after a
 * forward that succeeded, with its output, and may fail it too. ctx is
 * the hooks'. ct_ddp's fully sharded units gather and free parameters
 * with them. NULL for both removes them. Errors: CT_EINVAL for a bad
 * module, CT_ESTATE when m has hooks already (remove them first). Not
 * thread-safe against forwards of m. */
typedef int (*ct_module_pre_hook)(ct_module *m, void *ctx);
typedef int (*ct_module_post_hook)(ct_module *m, ct_tensor *y, void *ctx);
CT_API int ct_module_set_forward_hooks(ct_module *m, ct_module_pre_hook pre,
                                       ct_module_post_hook post, void *ctx);

CT_API const char *ct_module_type(const ct_module *m);
CT_API void *ct_module_state(const ct_module *m);
/* The module's dotted path from the root ("" for the root). Valid until the
 * tree changes. */
CT_API const char *ct_module_path(ct_module *m);

/* Registers a parameter (made to require grad) or a buffer (state that is
 * saved but not trained) under name; takes over the caller's reference to
 * t. CT_EINVAL for a duplicate or dotted name or a non-float parameter. */
CT_API int ct_module_add_param(ct_module *m, const char *name, ct_tensor *t);
CT_API int ct_module_add_buffer(ct_module *m, const char *name, ct_tensor *t);
/* Adds child under name and takes ownership of it (also when this fails). A
 * NULL child fails with the message that made it NULL. */
CT_API int ct_module_add_child(ct_module *m, const char *name, ct_module *child);
/* Borrowed lookups by (undotted) name; NULL if absent. */
CT_API ct_tensor *ct_module_param(const ct_module *m, const char *name);
CT_API ct_tensor *ct_module_buffer(const ct_module *m, const char *name);
CT_API ct_module *ct_module_child(const ct_module *m, const char *name);
CT_API int ct_module_num_children(const ct_module *m);
CT_API ct_module *ct_module_child_at(const ct_module *m, int i);

/* Training mode (the default) or evaluation mode, for the whole subtree:
 * dropout is active only in training mode. */
CT_API void ct_module_train(ct_module *m, bool training);
CT_API bool ct_module_training(const ct_module *m);

/* Parameters or buffers with their dotted names, in PyTorch's order (a
 * module's own first, then each child's, depth first). */
typedef struct ct_param_list {
    int n;
    char **names;        /* owned copies */
    ct_tensor **tensors; /* a reference each */
    int cap;
} ct_param_list;

CT_API void ct_param_list_init(ct_param_list *pl);
CT_API void ct_param_list_free(ct_param_list *pl);
/* Appends name (copied) and t (retained). */
CT_API int ct_param_list_add(ct_param_list *pl, const char *name, ct_tensor *t);
CT_API ct_tensor *ct_param_list_find(const ct_param_list *pl, const char *name);
CT_API int64_t ct_param_list_numel(const ct_param_list *pl);
/* Appends m's parameters / buffers to pl. */
CT_API int ct_module_named_parameters(ct_module *m, ct_param_list *pl);
CT_API int ct_module_named_buffers(ct_module *m, ct_param_list *pl);

/* Moves every parameter and buffer of the tree to device, as
 * torch.nn.Module.to does: each becomes a new tensor there (requires_grad
 * kept), and the module releases the old one. Parameter lists and
 * optimizers made before hold the old tensors: move first. On an error
 * (CT_EDEVICE: no such device; CT_ENOMEM) nothing has moved; CT_ESTATE on
 * a flattened module (move, then flatten). Not thread-safe against other
 * users of the module. */
CT_API int ct_module_to(ct_module *m, ct_device device);

/* Moves every parameter of the tree into one flat buffer, in named order,
 * each parameter becoming a view into it (llm.c's layout: optimizers then
 * update everything in one pass, and bucketing and checkpoints see plain
 * offsets). With grads, each .grad becomes a view into one flat zeroed
 * gradient buffer, which backward accumulates into in place. Parameter
 * lists taken before are stale. The buffers are on the parameters' device.
 * CT_EDTYPE unless all parameters share one dtype, CT_EDEVICE unless one
 * device. */
CT_API int ct_module_flatten(ct_module *m, bool grads);
/* The flat buffers of a flattened root (borrowed); NULL if none. */
CT_API ct_tensor *ct_module_flat_params(const ct_module *m);
CT_API ct_tensor *ct_module_flat_grads(const ct_module *m);

/* ---------------------------------------------------------------- layers */

/* The device the calling thread's layer constructors (ct_linear_new,
 * ct_gpt_new and the rest) make their parameters on: the CPU until set.
 * Set it around a model's construction to build the model there without a
 * copy, as PyTorch's `with torch.device(...)`: on CT_DEVICE_META a model of
 * any size holds no memory (ct_memory_plan, ct/dist.h, builds its models
 * so). The initialisers draw from the generator as they do on the CPU, so
 * the generator advances alike. Returns the previous device; a device this
 * process lacks fails in the constructors (CT_EDEVICE). Per thread; the
 * tensor factories (ct_empty, ...) keep making CPU tensors. */
CT_API ct_device ct_nn_set_device(ct_device device);
CT_API ct_device ct_nn_device(void);

/* y = x W^T + b; weight [out, in], bias [out]. PyTorch's initialisation:
 * U(-1/sqrt(in), 1/sqrt(in)) for both, from the default generator. */
CT_API ct_module *ct_linear_new(int64_t in_features, int64_t out_features, bool bias);
/* Rows of weight [num, dim] at the integer indices x; out [..., dim].
 * Initialised N(0, 1). CT_ERANGE for an index outside [0, num). */
CT_API ct_module *ct_embedding_new(int64_t num, int64_t dim);
/* Normalizes over the last dim (size dim), then scales by weight and adds
 * bias (ones and zeros at first). */
CT_API ct_module *ct_layer_norm_new(int64_t dim, double eps);
/* Zeroes each element with probability p in training mode and scales the
 * rest by 1 / (1 - p); the identity in evaluation mode. Draws from the
 * default generator. */
CT_API ct_module *ct_dropout_new(double p);
CT_API ct_module *ct_relu_new(void);
CT_API ct_module *ct_gelu_new(bool tanh_approximation);
CT_API ct_module *ct_tanh_new(void);
CT_API ct_module *ct_sigmoid_new(void);
CT_API ct_module *ct_silu_new(void);
/* Children named "0", "1", ... run in order. */
CT_API ct_module *ct_sequential_new(void);
/* Appends child (taking ownership; NULL fails with its message). */
CT_API int ct_sequential_append(ct_module *seq, ct_module *child);

/* The layers' computations as functions, for modules written by hand. */
CT_API ct_tensor *ct_linear(ct_tensor *x, ct_tensor *weight, ct_tensor *bias);
CT_API ct_tensor *ct_embedding(ct_tensor *indices, ct_tensor *weight);
CT_API ct_tensor *ct_layer_norm(ct_tensor *x, ct_tensor *weight, ct_tensor *bias, double eps);
CT_API ct_tensor *ct_dropout(ct_tensor *x, double p, bool training, ct_generator *gen);
/* Keys dropout by sample, for data parallelism whose result must not
 * depend on the number of ranks: while set, ct_dropout of an input whose
 * dim 0 has n rows draws row i's mask as row rows[i] of a global batch of
 * global_rows rows (ct_bernoulli_rows_), so each sample gets the mask it
 * would get on one rank holding the whole batch, and every rank's
 * generator advances alike. Inputs of another row count draw as before.
 * rows stays the caller's and must live while set; NULL (or n 0) clears
 * it. Process-wide: set it from the thread that runs the steps, between
 * them. Returns 0, or CT_EINVAL for rows outside [0, global_rows). */
CT_API int ct_dropout_key_rows(const int64_t *rows, int64_t n, int64_t global_rows);

/* ------------------------------------------------------------- attention */

typedef struct ct_attention_options {
    /* Query i sees keys 0..i only (the lower triangle, aligned at the top
     * left as torch.tril of a [Tq, Tk] matrix is). */
    bool causal;
    /* Zeroes each attention weight with this probability and scales the
     * rest by 1 / (1 - p); 0 in evaluation. */
    double dropout_p;
    double scale;      /* multiplies q.k; 0: 1 / sqrt(D) */
    ct_generator *gen; /* dropout's draws; NULL: the default generator */
} ct_attention_options;

/* softmax(q k^T * scale, masked if causal) v, with dropout on the weights:
 * q [..., Tq, D], k [..., Tk, D] and v [..., Tk, Dv] give [..., Tq, Dv];
 * the batch dims (heads included) broadcast. opts NULL: not causal, no
 * dropout, scale 1 / sqrt(D).
 *
 * One op with its own backward, not a chain of ops: on the CPU each
 * (batch, head) pair is one task of the pool, which computes its scores a
 * block of rows at a time with one GEMM (keys a causal row cannot see are
 * skipped a block at a time, and never reach the softmax), softmaxes each
 * row in place, and multiplies by v with a second GEMM. It saves the
 * softmax ([..., Tq, Tk], about 4 Tq Tk bytes per head in float32) for
 * backward but not the dropout mask, which backward draws again. The mask
 * is that of ct_rand(float32, [..., Tq, Tk], gen) < 1 - p drawn at the
 * same generator state, so a chain of ops can reproduce it. Results do not
 * depend on the thread count.
 *
 * float32 and float64 compute natively; float16 and bfloat16 through
 * float32. On a CUDA device the op is built from device ops (matmul,
 * masked_fill, softmax), with the same mask semantics. Differentiating its
 * backward again (create_graph) fails with CT_ENOTSUP. Errors: CT_EDTYPE
 * (non-float or mixed dtypes), CT_ESHAPE (fewer than 2 dims, D or Tk
 * disagreeing, batch dims that do not broadcast), CT_EINVAL (dropout_p
 * outside [0, 1], a non-finite or negative scale), CT_EDEVICE. */
CT_API ct_tensor *ct_scaled_dot_product_attention(ct_tensor *q, ct_tensor *k, ct_tensor *v,
                                                  const ct_attention_options *opts);

/* ----------------------------------------------------------- transformer */

/* The blocks of a GPT (docs/gpt.md), as modules with nanoGPT's child names,
 * so that a PyTorch state dict of that model loads by name. Each takes
 * x [B, T, width] and returns [B, T, width]; a wrong shape fails with
 * CT_ESHAPE naming the module. Dropout is active in training mode only.
 * Constructors fail with CT_EINVAL unless width > 0 is divisible by
 * heads > 0 and dropout is in [0, 1]. */

/* Multi-head causal self-attention: one projection to q, k and v
 * ("c_attn", width -> 3 width), ct_scaled_dot_product_attention over
 * heads of width / heads (causal, dropout on the weights), the heads
 * merged and projected back ("c_proj"), then dropout. The heads are read
 * from the projection in place, without copies. */
CT_API ct_module *ct_causal_self_attention_new(int64_t width, int64_t heads, double dropout);
/* "c_fc" (width -> hidden), GELU in its tanh form, "c_proj" (hidden ->
 * width), dropout. */
CT_API ct_module *ct_mlp_new(int64_t width, int64_t hidden, double dropout);
/* A pre-LayerNorm residual block: x + attn(ln_1(x)), then
 * x + mlp(ln_2(x)) with an MLP 4 width wide. */
CT_API ct_module *ct_transformer_block_new(int64_t width, int64_t heads, double dropout);

typedef struct ct_gpt_config {
    int64_t vocab, context, layers, heads, width;
    double dropout; /* after the embeddings, on attention weights, after each block's branches */
    /* Recompute each block in backward instead of keeping its activations
     * (ct_activation_checkpoint), in training mode: less memory, about a third more
     * compute. */
    bool checkpoint;
} ct_gpt_config;

/* A decoder-only transformer (GPT-2's layout): token embedding
 * "transformer.wte" [vocab, width] plus position embedding
 * "transformer.wpe" [context, width], dropout, the blocks
 * "transformer.h.<i>", a final layer norm "transformer.ln_f", and an
 * output head that is the token embedding itself (weight tying: there is
 * no separate lm_head parameter). Its forward takes integer token ids
 * [B, T], T <= context, and returns logits [B, T, vocab]. Initialised as
 * GPT-2 is, from the default generator: N(0, 0.02) matrices and
 * embeddings, the residual projections ("c_proj") N(0, 0.02 /
 * sqrt(2 layers)), zero biases. Errors: CT_EINVAL for a bad config,
 * CT_ENOMEM; forward: CT_ESHAPE for ids that are not [B, T <= context]
 * integers, CT_ERANGE for an id outside the vocabulary. */
CT_API ct_module *ct_gpt_new(const ct_gpt_config *cfg);

/* ---------------------------------------------------------------- losses */

typedef enum ct_reduction {
    CT_REDUCTION_MEAN = 0,
    CT_REDUCTION_SUM,
    CT_REDUCTION_NONE,
} ct_reduction;

typedef struct ct_loss_options {
    ct_reduction reduction;
    int64_t ignore_index; /* targets equal to it are skipped (PyTorch: -100) */
    double label_smoothing;
} ct_loss_options;

/* PyTorch's defaults: mean, ignore_index -100, no smoothing. */
#define CT_LOSS_DEFAULTS ((ct_loss_options){CT_REDUCTION_MEAN, -100, 0.0})

/* Cross-entropy of logits [N, C] (or [C]) against class indices [N] (or a
 * 0-d index), fused: one stable pass computes log-softmax and the loss, and
 * its backward is softmax minus the (smoothed) target. The mean is over
 * targets that are not ignored (NaN if all are). opts NULL means
 * CT_LOSS_DEFAULTS. CT_ERANGE names the first target outside [0, C). */
CT_API ct_tensor *ct_cross_entropy(ct_tensor *logits, ct_tensor *target,
                                   const ct_loss_options *opts);
/* Negative log-likelihood of log-probabilities [N, C] against indices [N]
 * (label_smoothing is not used). */
CT_API ct_tensor *ct_nll_loss(ct_tensor *log_probs, ct_tensor *target, const ct_loss_options *opts);
/* Mean (or sum, or elementwise) squared error; shapes broadcast. */
CT_API ct_tensor *ct_mse_loss(ct_tensor *input, ct_tensor *target, ct_reduction reduction);

/* ----------------------------------------------------------- initializers */

/* In-place initializers; each returns t, runs with grad mode off and draws
 * from gen (NULL: the default generator). Fans follow PyTorch: fan_in =
 * size(1) * receptive field, fan_out = size(0) * receptive field; CT_EINVAL
 * for tensors with fewer than 2 dims where a fan is needed. */
typedef enum ct_fan_mode { CT_FAN_IN, CT_FAN_OUT } ct_fan_mode;

/* Kaiming (He): std = gain / sqrt(fan), gain = sqrt(2 / (1 + a^2)) (leaky
 * ReLU slope a; 0 for ReLU). The uniform form has bound sqrt(3) * std. */
CT_API ct_tensor *ct_init_kaiming_uniform_(ct_tensor *t, double a, ct_fan_mode mode,
                                           ct_generator *gen);
CT_API ct_tensor *ct_init_kaiming_normal_(ct_tensor *t, double a, ct_fan_mode mode,
                                          ct_generator *gen);
/* Xavier (Glorot): std = gain * sqrt(2 / (fan_in + fan_out)). */
CT_API ct_tensor *ct_init_xavier_uniform_(ct_tensor *t, double gain, ct_generator *gen);
CT_API ct_tensor *ct_init_xavier_normal_(ct_tensor *t, double gain, ct_generator *gen);
CT_API ct_tensor *ct_init_uniform_(ct_tensor *t, double lo, double hi, ct_generator *gen);
CT_API ct_tensor *ct_init_normal_(ct_tensor *t, double mean, double std, ct_generator *gen);
CT_API ct_tensor *ct_init_constant_(ct_tensor *t, double value);
CT_API ct_tensor *ct_init_zeros_(ct_tensor *t);

#ifdef __cplusplus
}
#endif

#endif /* CT_NN_H */
