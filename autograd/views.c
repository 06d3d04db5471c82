/* Views and in-place writes: PyTorch's CopySlices. A view op's output
 * remembers its root base. An in-place op on a view is recorded as a write
 * into the base: the base's history becomes a CopySlices node that runs the
 * op's backward on the view's part of the base's gradient, and the view's
 * history becomes its place in the base. A view whose base was written
 * since its history was made (through another view, or the base itself)
 * gets that same place-in-the-base history when it is next used. */
#include "autograd_impl.h"

#include <stdlib.h>

/* The view's geometry relative to its contiguous base. */
static void geometry_of(const ct_tensor *v, const ct_tensor *base, ct__geometry *g) {
    g->ndim = v->ndim;
    memcpy(g->sizes, v->sizes, sizeof(int64_t) * (size_t)v->ndim);
    memcpy(g->strides, v->strides, sizeof(int64_t) * (size_t)v->ndim);
    g->offset = v->offset - base->offset;
}

/* The view of t (shaped like the base) that geometry g describes. */
static ct_tensor *place(ct_tensor *t, const ct__geometry *g) {
    return ct_tensor_from_storage(ct_tensor_storage(t), ct_tensor_offset(t) + g->offset, g->ndim,
                                  g->sizes, g->strides, ct_tensor_dtype(t));
}

static int refuse_double_backward(const ct_node *n) {
    char desc[256];
    return ct__err_set(CT_ENOTSUP,
                       "backward: %s cannot be differentiated again (create_graph); avoid "
                       "in-place writes into views in code that needs second-order gradients",
                       ct__node_desc(desc, sizeof desc, n));
}

/* ------------------------------------------------------------ AsStrided */

/* The gradient of a view's place in its base: zeros with the view's
 * gradient at its place. */
static int as_strided_backward(ct_node *n, const ct_backward_args *a) {
    if (ct_grad_enabled())
        return refuse_double_backward(n);
    const ct__shape *s = &n->in_meta[0];
    ct_tensor *z = ct_full_on(s->ndim, s->sizes, 0, s->dtype, s->device);
    if (!z || !ct_copy_(place(z, n->geom), a->grad_outputs[0]))
        return ct_errcode();
    a->grad_inputs[0] = z;
    return 0;
}

static const ct__fn as_strided_fn = {"AsStridedBackward0", as_strided_backward};

/* A node for view's place in base, fed by the base's current history. */
static ct_node *as_strided_node(ct_tensor *view, ct_tensor *base) {
    ct_node *n = ct__node_new(CT__NODE_VIEW, 1, 1, 0);
    ct__geometry *g = n ? malloc(sizeof *g) : NULL;
    if (!g) {
        ct__node_release(n);
        ct__err_set(CT_ENOMEM, "autograd: out of memory for a view's history");
        return NULL;
    }
    n->fn = &as_strided_fn;
    n->op = CT_OP_VIEW;
    n->geom = g;
    geometry_of(view, base, g);
    ct__autograd_shape_of(&n->in_meta[0], base);
    ct__autograd_shape_of(&n->out_meta[0], view);
    if (ct__autograd_gradient_edge(base, &n->next[0])) {
        ct__node_release(n);
        return NULL;
    }
    return n;
}

/* ------------------------------------------------------------ CopySlices */

/* grad is the gradient of the base after the write. The view's part of it
 * goes through the op's backward: its first result is the gradient of the
 * view's values before the write, which replaces that part; the others go
 * to the op's other inputs. */
static int copy_slices_backward(ct_node *n, const ct_backward_args *a) {
    if (ct_grad_enabled())
        return refuse_double_backward(n);
    ct_node *op = n->inner;
    ct_tensor *result = ct_clone(a->grad_outputs[0]);
    ct_tensor *slice = result ? place(result, n->geom) : NULL;
    ct_tensor *gv = slice ? ct_clone(slice) : NULL;
    if (!gv)
        return ct_errcode();
    ct_tensor *res[op->nnext > 0 ? op->nnext : 1];
    memset(res, 0, sizeof res);
    int rc = ct__node_apply(op, &gv, res, a->needs_input_grad);
    for (int i = 0; i < op->nnext && !rc; i++) {
        if (!a->needs_input_grad[i] || !res[i])
            continue;
        res[i] = ct__autograd_validate_grad(op, i, res[i]);
        rc = res[i] ? 0 : ct_errcode();
    }
    if (rc)
        return rc;
    if (a->needs_input_grad[0]) {
        ct_tensor *old =
            res[0] ? res[0]
                   : ct_full_on(0, NULL, 0, ct_tensor_dtype(result), ct_tensor_device(result));
        if (!ct_copy_(slice, old))
            return ct_errcode();
        a->grad_inputs[0] = result;
    }
    for (int i = 1; i < op->nnext; i++)
        a->grad_inputs[i] = res[i];
    return 0;
}

static const ct__fn copy_slices_fn = {"CopySlices", copy_slices_backward};

/* ---------------------------------------------------------------- public */

int ct__autograd_track_view(ct_tensor *in, ct_tensor *out) {
    ct__meta *im = ct__meta_of(in);
    ct__meta *om = ct__autograd_meta_get(out);
    if (!om)
        return CT_ENOMEM;
    ct_tensor *base = im && im->base ? im->base : in;
    om->base = ct_tensor_retain(base);
    om->base_version = ct_tensor_version(base);
    return 0;
}

int ct__autograd_refresh_view(ct_tensor *view) {
    ct__meta *m = ct__meta_of(view);
    ct_tensor *base = m ? m->base : NULL;
    ct__meta *bm = ct__meta_of(base);
    if (!bm || !bm->grad_fn || (m->grad_fn && m->base_version == ct_tensor_version(base)))
        return 0;
    ct_node *n = as_strided_node(view, base);
    int rc = n ? ct__autograd_set_history(view, n, 0) : ct_errcode();
    ct__node_release(n);
    if (!rc)
        m->base_version = ct_tensor_version(base);
    return rc;
}

int ct__autograd_check_view_write(const char *op, ct_tensor *self) {
    ct__meta *m = ct__meta_of(self);
    ct_tensor *base = m->base;
    ct__meta *bm = ct__meta_of(base);
    char desc[CT__DESC_STR], bdesc[CT__DESC_STR];
    if (bm && bm->requires_grad && !bm->grad_fn)
        return ct__err_set(CT_EINVAL,
                           "%s: %s is a view of a leaf tensor that requires grad and is being "
                           "used in an in-place op; do it with grad mode off or on a clone",
                           op, ct__tensor_desc(desc, self));
    if (!ct_is_contiguous(base))
        return ct__err_set(CT_ENOTSUP,
                           "%s: in-place op on %s, a view of the non-contiguous %s, while "
                           "recording gradients; make the base contiguous first",
                           op, ct__tensor_desc(desc, self), ct__tensor_desc(bdesc, base));
    return 0;
}

int ct__autograd_record_view_write(ct_node *op, ct_tensor *self) {
    ct__meta *m = ct__meta_of(self);
    ct_tensor *base = m->base;
    ct_node *c = ct__node_new(CT__NODE_VIEW, op->nnext, 1, 0);
    ct__geometry *g = c ? malloc(sizeof *g) : NULL;
    if (!g) {
        ct__node_release(c);
        return ct__err_set(CT_ENOMEM, "autograd: out of memory recording a write into a view");
    }
    c->fn = &copy_slices_fn;
    c->op = op->op;
    c->geom = g;
    geometry_of(self, base, g);
    c->inner = ct__node_retain(op);
    ct__autograd_shape_of(&c->in_meta[0], base);
    ct__autograd_shape_of(&c->out_meta[0], base);
    int rc = ct__autograd_gradient_edge(base, &c->next[0]);
    /* The op's other inputs feed CopySlices; its own edges are not used. */
    for (int i = 1; i < op->nnext; i++) {
        c->in_meta[i] = op->in_meta[i];
        c->next[i] = op->next[i];
        op->next[i] = (ct__edge){NULL, 0};
    }
    ct__node_release(op->next[0].node);
    op->next[0] = (ct__edge){NULL, 0};
    if (!rc)
        rc = ct__autograd_set_history(base, c, 0);
    ct__node_release(c);
    /* The view's own history is its place in the base's new one. */
    ct_node *v = rc ? NULL : as_strided_node(self, base);
    if (!rc)
        rc = v ? ct__autograd_set_history(self, v, 0) : ct_errcode();
    ct__node_release(v);
    if (!rc)
        m->base_version = ct_tensor_version(base);
    return rc;
}
