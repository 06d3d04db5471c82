/* ct/autograd.h: reverse-mode automatic differentiation of ct tensors.
 *
 * A float tensor marked with ct_requires_grad_() is a leaf. Every op applied
 * to tensors that require grad, while grad mode is on, records a node in a
 * graph; ct_backward() walks that graph from the outputs and accumulates
 * gradients into the leaves' .grad (ct_tensor_grad()). ct_grad() returns the
 * gradients instead of accumulating them.
 *
 * Example:
 *
 *     #include <ct/autograd.h>
 *     #include <stdio.h>
 *
 *     int main(void) {
 *         ct_tensor *w = ct_requires_grad_(ct_randn(CT_SHAPE(3, 2), CT_FLOAT32, NULL), true);
 *         ct_scope_begin();
 *         ct_tensor *x = ct_ones(CT_SHAPE(4, 3), CT_FLOAT32);
 *         ct_tensor *loss = ct_sum(ct_tanh(ct_matmul(x, w)), NULL, 0, false);
 *         int rc = loss ? ct_tensor_backward(loss) : ct_errcode();
 *         if (rc)
 *             fprintf(stderr, "%s\n", ct_errmsg());
 *         else
 *             ct_print(ct_tensor_grad(w));
 *         ct_scope_end();
 *         ct_tensor_free(w);
 *         return rc ? 1 : 0;
 *     }
 *
 * Ownership. Graph nodes are owned by the tensors they produced: a graph
 * lives while one of its outputs does, and is freed (iteratively, so a chain
 * of millions of nodes cannot overflow the stack) with the last of them.
 * ct_backward() frees the buffers saved for backward unless retain_graph is
 * set. A leaf's .grad is owned by the leaf; ct_tensor_grad() borrows it.
 *
 * Errors. Functions return 0 or a negative CT_E* code, or NULL, with a
 * message in ct_errmsg() that names the node (for example "MulBackward0,
 * from op mul") and says what to do.
 *
 * Threads. Grad mode is per thread. Backward runs on the calling thread;
 * several threads may run backward at once on separate graphs, and graphs
 * that share leaves accumulate into .grad under a per-leaf lock. Building or
 * running one graph from two threads at once is not supported. Hooks run on
 * the thread that runs backward.
 */
#ifndef CT_AUTOGRAD_H
#define CT_AUTOGRAD_H

#include <ct/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------- tensor state */

/* Marks a float leaf as requiring grad (or not) and returns t. Errors:
 * CT_EDTYPE for a non-float tensor; CT_EINVAL to turn it off on a tensor
 * that has history (use ct_detach()). Not thread-safe for one tensor. */
CT_API ct_tensor *ct_requires_grad_(ct_tensor *t, bool requires_grad);
CT_API bool ct_requires_grad(const ct_tensor *t);
/* True for tensors without history: the user's tensors and the results of
 * ops that recorded nothing. */
CT_API bool ct_is_leaf(const ct_tensor *t);
/* The accumulated gradient of a leaf, borrowed; NULL if none. */
CT_API ct_tensor *ct_tensor_grad(const ct_tensor *t);
/* Replaces t's .grad (a new reference is taken; NULL clears it). Backward
 * then accumulates into grad in place, so grad may be a view into a flat
 * buffer. CT_ESHAPE / CT_EDTYPE if grad does not match t. */
CT_API int ct_tensor_set_grad(ct_tensor *t, ct_tensor *grad);
/* A new tensor sharing t's storage, without history and not requiring
 * grad. */
CT_API ct_tensor *ct_detach(ct_tensor *t);

/* ------------------------------------------------------------ grad mode */

/* Grad mode is per thread and on by default. Off, ops record nothing
 * (PyTorch's no_grad). Returns the previous mode. */
CT_API bool ct_set_grad_enabled(bool enabled);
CT_API bool ct_grad_enabled(void);

/* ---------------------------------------------------------------- nodes */

/* A node of the graph: the backward of one recorded op. Borrowed from the
 * tensor that produced it. */
typedef struct ct_node ct_node;

/* The node that produced t, NULL for leaves. */
CT_API ct_node *ct_tensor_grad_fn(const ct_tensor *t);
/* Which output of its node t is. */
CT_API int ct_tensor_output_nr(const ct_tensor *t);
/* "MulBackward0", "AccumulateGrad", or a custom function's name. */
CT_API const char *ct_node_name(const ct_node *n);
/* The op that recorded the node (CT_OP_EMPTY for custom functions). */
CT_API ct_op ct_node_op(const ct_node *n);
/* Creation order on the creating thread; later nodes run first. */
CT_API uint64_t ct_node_seq(const ct_node *n);
CT_API int ct_node_num_next(const ct_node *n);
/* The i-th next node (NULL where that input needs no grad); *input_nr, if
 * not NULL, receives which of its outputs the edge feeds. */
CT_API ct_node *ct_node_next(const ct_node *n, int i, int *input_nr);
/* A label shown in error messages (copied). Anomaly mode labels nodes with
 * the thread's current label (ct_autograd_set_label()). */
CT_API int ct_node_set_label(ct_node *n, const char *label);
CT_API const char *ct_node_label(const ct_node *n);

/* -------------------------------------------------------------- backward */

/* Computes the gradients of outputs[0..n-1] and accumulates them into the
 * leaves' .grad. grad_outputs may be NULL, or hold NULL entries, only for
 * one-element outputs (their gradient is 1). Without retain_graph, buffers
 * saved for backward are freed and a second backward through the same nodes
 * fails with CT_ESTATE. A backward started inside a node's backward function
 * (reentrant backward) runs nested. Errors: CT_EINVAL (no output requires
 * grad, non-scalar output without a gradient), CT_ESHAPE (gradient or hook
 * result of the wrong shape), CT_ESTATE (freed graph, saved tensor modified
 * in place, NaN in anomaly mode), or whatever a derivative or hook
 * returned. */
CT_API int ct_backward(ct_tensor *const *outputs, int n, ct_tensor *const *grad_outputs,
                       bool retain_graph);
/* ct_backward(&loss, 1, NULL, false). */
CT_API int ct_tensor_backward(ct_tensor *loss);

typedef struct ct_grad_options {
    bool retain_graph;
    /* Records the backward computation itself, so that the gradients can be
     * differentiated again. */
    bool create_graph;
    /* An input that the outputs do not depend on gets a NULL gradient
     * instead of a CT_EINVAL error. */
    bool allow_unused;
} ct_grad_options;

/* Writes to grads[0..ninputs-1] the gradients of outputs with respect to
 * inputs, without touching any .grad. opts may be NULL. The gradients are
 * owned like op results (by the current scope). Errors as ct_backward, plus
 * CT_EINVAL for an input that does not require grad or is unused. */
CT_API int ct_grad(ct_tensor *const *outputs, int noutputs, ct_tensor *const *grad_outputs,
                   ct_tensor *const *inputs, int ninputs, ct_tensor **grads,
                   const ct_grad_options *opts);

/* ----------------------------------------------------------------- hooks */

/* Called with the gradient flowing into a tensor during backward. Returns
 * grad to keep it, another tensor of the same shape to replace it, or NULL
 * with an error set (ct_autograd_fail()) to abort the backward. Runs inside
 * a scope: a replacement made with ops is freed when no longer needed. */
typedef ct_tensor *(*ct_grad_hook_fn)(ct_tensor *grad, void *ctx);
/* Called after a leaf's .grad has been accumulated. Returns 0, or a CT_E*
 * code to abort the backward. */
typedef int (*ct_post_accumulate_hook_fn)(ct_tensor *leaf, void *ctx);
/* Called once when the backward that queued it has finished its graph. */
typedef int (*ct_backward_callback_fn)(void *ctx);

/* Registers a gradient hook on t (leaf or not); hooks run in registration
 * order. Returns a handle > 0, or CT_EINVAL if t does not require grad. ctx
 * must outlive the hook. */
CT_API int ct_tensor_register_hook(ct_tensor *t, ct_grad_hook_fn fn, void *ctx);
/* Registers a hook run after .grad of the leaf t was accumulated. Returns a
 * handle > 0; CT_EINVAL if t is not a leaf that requires grad. */
CT_API int ct_tensor_register_post_accumulate_grad_hook(ct_tensor *t, ct_post_accumulate_hook_fn fn,
                                                        void *ctx);
/* Removes a hook of either kind. CT_EINVAL for an unknown handle. */
CT_API int ct_tensor_remove_hook(ct_tensor *t, int handle);
/* Queues fn to run once when the current backward ends (after every node).
 * Only valid inside a backward (from a hook or a backward function);
 * CT_ESTATE otherwise. */
CT_API int ct_autograd_queue_callback(ct_backward_callback_fn fn, void *ctx);
/* The same, but fn runs when the outermost backward ends: from inside a
 * backward that a backward function started (reentrant backward, as
 * activation checkpointing does), the callback waits for the whole
 * backward, not just the nested one. Data parallel training uses it. */
CT_API int ct_autograd_queue_final_callback(ct_backward_callback_fn fn, void *ctx);
/* Records an error message for a hook or backward function to return;
 * returns code. */
CT_API int ct_autograd_fail(int code, const char *fmt, ...) CT_PRINTF(2, 3);

/* ------------------------------------------------------------- anomaly */

/* Anomaly mode (process-wide, off by default): nodes remember the label set
 * on their thread when they were created and the call stack that recorded
 * them, and a NaN in any gradient made by backward fails it with CT_ESTATE,
 * naming the node, its op, its label and where its op was recorded.
 * Returns the previous setting. */
CT_API bool ct_set_anomaly_enabled(bool enabled);
CT_API bool ct_anomaly_enabled(void);
/* Sets this thread's current label (not copied: it must outlive its use)
 * and returns the previous one. nn modules set their names here. */
CT_API const char *ct_autograd_set_label(const char *label);

/* ------------------------------------------------------ custom functions */

/* What a custom backward receives and fills in. */
typedef struct ct_backward_args {
    void *ctx;
    ct_tensor *const *saved; /* the tensors saved at record time, checked */
    int nsaved;
    ct_tensor *const *grad_outputs; /* one per output; NULL: zero gradient */
    int noutputs;
    ct_tensor **grad_inputs; /* one per input, NULL on entry; leave NULL for none */
    const bool *needs_input_grad;
    int ninputs;
} ct_backward_args;

typedef struct ct_function_def {
    const char *name; /* "MyOpBackward", static storage */
    /* Computes grad_inputs with ct ops (their results may stay scope-owned).
     * Returns 0 or a CT_E* code with ct_autograd_fail(). */
    int (*backward)(const ct_backward_args *a);
    /* Frees ctx when the node is freed; may be NULL. */
    void (*free_ctx)(void *ctx);
} ct_function_def;

/* Records a node computing the backward of outputs from inputs, if grad mode
 * is on and an input requires grad; the outputs (made by the caller, without
 * history) then require grad. The node takes ownership of ctx, and keeps
 * saved[0..nsaved-1] with their versions (an output among them is kept
 * without creating a cycle). When nothing is recorded, ctx is freed at once.
 * Returns 0, CT_EINVAL (an output already has history), or CT_ENOMEM. */
CT_API int ct_function_record(const ct_function_def *def, void *ctx, ct_tensor *const *inputs,
                              int ninputs, ct_tensor *const *outputs, int noutputs,
                              ct_tensor *const *saved, int nsaved);

/* ------------------------------------------------- activation checkpointing */

/* Computes outputs from inputs; the outputs are ordinary op results. */
typedef int (*ct_activation_fn)(void *ctx, ct_tensor *const *inputs, int ninputs,
                                ct_tensor **outputs, int noutputs);

/* Runs fn without recording a graph, keeping only the inputs and the default
 * generator's state. Backward restores that state, re-runs fn with grad on
 * and backpropagates through the recomputed outputs (a reentrant backward),
 * so gradients equal those of running fn directly, dropout included. ctx
 * must outlive the graph. Errors: CT_EINVAL when no input requires grad;
 * ct_grad() through a checkpoint fails with CT_ENOTSUP. Saving training
 * state to disk is the checkpoint module's (ct/checkpoint.h). */
CT_API int ct_activation_checkpoint(ct_activation_fn fn, void *ctx, ct_tensor *const *inputs,
                                    int ninputs, ct_tensor **outputs, int noutputs);

/* Deprecated names of the above (before 1.0), easy to mistake for the
 * checkpoint module's ct_checkpoint_save: they will go. */
typedef ct_activation_fn ct_checkpoint_fn CT_DEPRECATED("use ct_activation_fn");
CT_API int ct_checkpoint(ct_activation_fn fn, void *ctx, ct_tensor *const *inputs, int ninputs,
                         ct_tensor **outputs, int noutputs)
    CT_DEPRECATED("use ct_activation_checkpoint");

/* ------------------------------------------------------------- gradcheck */

typedef struct ct_gradcheck_options {
    double eps;  /* 1e-6 when 0 */
    double atol; /* 1e-5 when 0 */
    double rtol; /* 1e-3 when 0 */
} ct_gradcheck_options;

/* The function checked: writes one output from the inputs. */
typedef ct_tensor *(*ct_gradcheck_fn)(void *ctx, ct_tensor *const *inputs, int ninputs);

/* Compares the analytic gradient of sum(fn(inputs) * r), for a fixed random
 * r, with float64 central differences, for every float64 input that requires
 * grad. Returns 0, or CT_ESTATE with the worst element (input, index,
 * analytic, numeric) in the message. opts may be NULL. */
CT_API int ct_gradcheck(ct_gradcheck_fn fn, void *ctx, ct_tensor *const *inputs, int ninputs,
                        const ct_gradcheck_options *opts);

#ifdef __cplusplus
}
#endif

#endif /* CT_AUTOGRAD_H */
