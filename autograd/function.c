/* Custom autograd functions: a node whose backward the caller supplies. */
#include "autograd_impl.h"

int ct_function_record(const ct_function_def *def, void *ctx, ct_tensor *const *inputs, int ninputs,
                       ct_tensor *const *outputs, int noutputs, ct_tensor *const *saved,
                       int nsaved) {
    int rc = 0;
    if (!def || !def->backward || !def->name)
        rc = ct__err_set(CT_EINVAL, "function_record: the definition needs a name and a backward");
    else if (ninputs < 0 || noutputs < 1 || nsaved < 0 || (ninputs && !inputs) || !outputs ||
             (nsaved && !saved))
        rc = ct__err_set(CT_EINVAL,
                         "function_record %s: bad counts or arrays (%d inputs, %d outputs, %d "
                         "saved)",
                         def->name, ninputs, noutputs, nsaved);
    for (int i = 0; i < ninputs && !rc; i++)
        rc = CT__CHECK_ANY(def->name, inputs[i]);
    for (int i = 0; i < noutputs && !rc; i++) {
        char desc[CT__DESC_STR];
        if (!(rc = CT__CHECK_ANY(def->name, outputs[i])) && ct_tensor_grad_fn(outputs[i]))
            rc = ct__err_set(CT_EINVAL,
                             "function_record %s: output %d (%s) already has history; outputs "
                             "must be computed with grad mode off",
                             def->name, i, ct__tensor_desc(desc, outputs[i]));
    }
    for (int i = 0; i < nsaved && !rc; i++)
        rc = CT__CHECK_ANY(def->name, saved[i]);
    bool any = false;
    for (int i = 0; i < ninputs && !rc && !any; i++)
        any = ct__needs_grad(inputs[i]);
    if (rc || !any || !ct__autograd_grad_mode()) {
        if (def && def->free_ctx)
            def->free_ctx(ctx);
        return rc;
    }

    ct_node *n = ct__node_new(CT__NODE_CUSTOM, ninputs, noutputs, nsaved);
    if (!n) {
        if (def->free_ctx)
            def->free_ctx(ctx);
        return CT_ENOMEM;
    }
    n->def = def;
    n->ctx = ctx;
    for (int i = 0; i < ninputs && !rc; i++) {
        rc = ct__autograd_gradient_edge(inputs[i], &n->next[i]);
        ct__autograd_shape_of(&n->in_meta[i], inputs[i]);
    }
    for (int i = 0; i < nsaved && !rc; i++) {
        int output_nr = -1;
        for (int o = 0; o < noutputs; o++)
            if (saved[i] == outputs[o])
                output_nr = o;
        rc = ct__node_save(n, i, saved[i], output_nr);
    }
    for (int i = 0; i < noutputs && !rc; i++) {
        ct__autograd_shape_of(&n->out_meta[i], outputs[i]);
        if (ct_dtype_is_float(outputs[i]->dtype))
            rc = ct__autograd_set_history(outputs[i], n, i);
    }
    ct__node_release(n);
    return rc;
}

int ct__autograd_function_record_source(const ct_function_def *def, void *ctx,
                                        ct_tensor *const *outputs, int noutputs) {
    ct_node *n = ct__node_new(CT__NODE_CUSTOM, 0, noutputs, 0);
    if (!n) {
        def->free_ctx(ctx);
        return CT_ENOMEM;
    }
    n->def = def;
    n->ctx = ctx;
    int rc = 0;
    for (int i = 0; i < noutputs && !rc; i++) {
        ct__autograd_shape_of(&n->out_meta[i], outputs[i]);
        rc = ct__autograd_set_history(outputs[i], n, i);
    }
    ct__node_release(n);
    return rc;
}
