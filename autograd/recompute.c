/* Activation checkpointing (ct_activation_checkpoint): forward without a
 * graph, recompute in backward and backpropagate through the
 * recomputation with a reentrant backward. Not the checkpoint module's
 * saving of state to disk. */
#include "autograd_impl.h"

#include <stdlib.h>

typedef struct checkpoint {
    ct_activation_fn fn;
    void *ctx;
    ct_generator rng; /* the default generator before the forward ran */
    int noutputs;
} checkpoint;

static int recompute(const ct_backward_args *a) {
    checkpoint *c = a->ctx;
    if (ct__engine_capturing())
        return ct__err_set(
            CT_ENOTSUP,
            "activation_checkpoint: ct_grad() cannot go through a checkpointed region (its "
            "backward runs a reentrant ct_backward, which accumulates into .grad); "
            "use ct_backward()");
    int n = a->nsaved, m = c->noutputs, rc = 0;
    ct_tensor *inputs[n > 0 ? n : 1], *outputs[m], *roots[m], *grads[m];
    for (int i = 0; i < n && !rc; i++) {
        inputs[i] = ct_detach(a->saved[i]);
        if (inputs[i] && ct_requires_grad(a->saved[i]))
            ct_requires_grad_(inputs[i], true);
        rc = inputs[i] ? 0 : ct_errcode();
    }
    if (rc)
        return rc;
    /* Dropout inside fn must draw the numbers it drew in the forward. */
    ct_generator *gen = ct_default_generator(), now = *gen;
    *gen = c->rng;
    bool prev = ct_set_grad_enabled(true);
    memset(outputs, 0, sizeof outputs);
    rc = c->fn(c->ctx, inputs, n, outputs, m);
    ct_set_grad_enabled(prev);
    *gen = now;
    if (rc)
        return rc;
    int k = 0;
    for (int o = 0; o < m; o++) {
        if (a->grad_outputs[o] && outputs[o] && ct_requires_grad(outputs[o])) {
            roots[k] = outputs[o];
            grads[k++] = a->grad_outputs[o];
        }
    }
    if (k > 0 && (rc = ct_backward(roots, k, grads, false)))
        return rc;
    for (int i = 0; i < n; i++)
        if (a->needs_input_grad[i])
            a->grad_inputs[i] = ct_tensor_grad(inputs[i]);
    return 0;
}

static const ct_function_def checkpoint_def = {"CheckpointFunctionBackward", recompute, free};

int ct_activation_checkpoint(ct_activation_fn fn, void *ctx, ct_tensor *const *inputs, int ninputs,
                             ct_tensor **outputs, int noutputs) {
    if (!fn || noutputs < 1 || !outputs || ninputs < 0 || (ninputs && !inputs))
        return ct__err_set(CT_EINVAL,
                           "activation_checkpoint: bad arguments (fn %s, %d inputs, %d outputs)",
                           fn ? "set" : "NULL", ninputs, noutputs);
    int rc = 0;
    bool any = false;
    for (int i = 0; i < ninputs && !rc; i++) {
        rc = CT__CHECK_ANY("activation_checkpoint", inputs[i]);
        any = any || (!rc && ct_requires_grad(inputs[i]));
    }
    if (rc)
        return rc;
    for (int o = 0; o < noutputs; o++)
        outputs[o] = NULL;
    if (!ct_grad_enabled())
        return fn(ctx, inputs, ninputs, outputs, noutputs);
    if (!any)
        return ct__err_set(
            CT_EINVAL,
            "activation_checkpoint: none of the %d inputs requires grad, so the checkpointed "
            "region would get no gradient; pass at least one input that requires "
            "grad (parameters used inside fn are not inputs)",
            ninputs);
    checkpoint *c = malloc(sizeof *c);
    if (!c)
        return ct__err_set(CT_ENOMEM, "activation_checkpoint: out of memory");
    *c = (checkpoint){fn, ctx, *ct_default_generator(), noutputs};
    /* fn's intermediate results are freed here, not by the caller's scope:
     * that is the memory checkpointing saves. */
    ct_set_grad_enabled(false);
    ct_scope_begin();
    rc = fn(ctx, inputs, ninputs, outputs, noutputs);
    for (int o = 0; o < noutputs && !rc; o++)
        if (!outputs[o])
            rc = ct__err_set(CT_EINVAL,
                             "activation_checkpoint: fn returned 0 but left output %d NULL", o);
    for (int o = 0; o < noutputs && !rc; o++)
        ct_keep(outputs[o]);
    ct_scope_end();
    ct_set_grad_enabled(true);
    if (!rc)
        return ct_function_record(&checkpoint_def, c, inputs, ninputs, outputs, noutputs, inputs,
                                  ninputs);
    free(c);
    return rc;
}

/* The name before 1.0, which the checkpoint module's ct_checkpoint_save
 * made easy to mistake; kept for programs that use it. */
int ct_checkpoint(ct_activation_fn fn, void *ctx, ct_tensor *const *inputs, int ninputs,
                  ct_tensor **outputs, int noutputs) {
    return ct_activation_checkpoint(fn, ctx, inputs, ninputs, outputs, noutputs);
}
