/* The op-preparation step of the elementwise front ends (device_impl.h,
 * "op preparation"). */
#include "device_impl.h"

/* The category a dtype's values belong to: bool, integer, float. An
 * in-place result may be stored in a tensor of its own category or a
 * higher one (an integer sum in a float tensor, not a float one in an
 * integer tensor). */
static int dtype_category(ct_dtype d) { return d == CT_BOOL ? 0 : ct_dtype_is_float(d) ? 2 : 1; }

/* Every op pays this step, a few tens of nanoseconds on a one-element
 * tensor, so it does no work an op does not need: no lookup on the host,
 * whose table has every entry the front ends take, and no device check of
 * one operand. */
int ct__op_begin(const ct__op_spec *s, ct__op_run *r) {
    if (ct__tensor_check_handles(s->name, s->in, s->nin) ||
        (s->nin > 1 && ct__tensor_check_same_device(s->name, s->in, s->nin)))
        return ct_errcode();
    r->device = s->in[0]->storage->device;
    r->dev = ct__is_host(r->device) ? &ct__cpu_device_ops
                                    : ct__device_get(s->name, r->device, s->entry, s->entry_name);
    if (!r->dev)
        return ct_errcode();
    r->out = r->dst = NULL;
    r->x[0] = r->x[1] = r->x[2] = NULL; /* the kernel's absent operands */
    r->scope = false;
    r->nd = s->in[0]->ndim;
    memcpy(r->shape, s->in[0]->sizes, sizeof(int64_t) * (size_t)r->nd);
    for (int k = 1; k < s->nin; k++)
        if (ct__tensor_broadcast_shapes(s->name, r->nd, r->shape, s->in[k]->ndim, s->in[k]->sizes,
                                        &r->nd, r->shape))
            return ct_errcode();
    return 0;
}

/* The in-place rules for writing the result (of dtype result) into a. */
static int check_inplace(const ct__op_spec *s, const ct__op_run *r, ct_dtype result) {
    ct_tensor *a = s->in[0];
    char da[CT__DESC_STR], ds[CT__SHAPE_STR];
    if (r->nd != a->ndim || memcmp(r->shape, a->sizes, sizeof(int64_t) * (size_t)r->nd) != 0)
        return ct__err_set(
            CT_ESHAPE, "%s: the broadcast shape %s does not match %s, written in place", s->name,
            ct__tensor_shape_str(ds, r->nd, r->shape), ct__tensor_desc(da, a));
    if (dtype_category(result) > dtype_category(a->dtype))
        return ct__err_set(CT_EDTYPE, "%s: result type %s cannot be stored in %s in place", s->name,
                           ct_dtype_name(result), ct__tensor_desc(da, a));
    return ct__tensor_check_inplace(s->op, s->name, a, s->in + 1, s->nin - 1);
}

int ct__op_alloc(const ct__op_spec *s, ct__op_run *r, ct_dtype compute, ct_dtype result) {
    if (s->inplace && check_inplace(s, r, result))
        return ct_errcode();
    /* The result is made in the caller's scope. Operands in another dtype
     * are converted, and an in-place result of another dtype is computed
     * into a temporary, in a private scope that releases them; the common
     * case needs none and skips it. */
    bool direct = s->inplace && result == s->in[0]->dtype;
    r->scope = s->inplace && !direct;
    for (int k = 0; k < s->nin; k++)
        r->scope |= !(s->fixed >> k & 1) && s->in[k]->dtype != compute;
    r->out = s->inplace ? s->in[0] : ct__tensor_new_on(s->name, r->nd, r->shape, result, r->device);
    if (!r->out)
        return ct_errcode();
    if (r->scope)
        ct_scope_begin();
    bool ok = true;
    for (int k = 0; k < s->nin; k++) {
        ct_tensor *t = s->in[k];
        r->x[k] = s->fixed >> k & 1 || t->dtype == compute ? t : ct_to_dtype(t, compute);
        ok &= r->x[k] != NULL;
    }
    r->dst = s->inplace && !direct ? ct__tensor_new_on(s->name, r->nd, r->shape, result, r->device)
                                   : r->out;
    if (ok && r->dst)
        return 0;
    int rc = ct_errcode();
    if (r->scope)
        ct_scope_end();
    if (!s->inplace)
        ct__tensor_release(r->out);
    return rc;
}

ct_tensor *ct__op_end(const ct__op_spec *s, ct__op_run *r, int rc, const ct_op_args *args) {
    if (rc == 0 && r->dst != r->out)
        rc = ct__tensor_copy_any(r->out, r->dst);
    if (r->scope)
        ct_scope_end();
    if (rc != 0) {
        if (!s->inplace)
            ct__tensor_release(r->out);
        return NULL;
    }
    return ct__tensor_record(s->op, s->in, s->nin, &r->out, 1, s->inplace, args);
}
