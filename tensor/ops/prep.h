/* ct's op-preparation step: internal to tensor/ops/, not installed.
 *
 * The steps are inline so that each front end's call, whose spec is known
 * where it is built (the number of operands, in place or not, the fixed
 * dtypes), compiles to only the branches that op takes: every op pays this
 * step, a few tens of nanoseconds on a one-element tensor, and an
 * out-of-line step cost an autograd chain of scalar ops 4% more
 * instructions. The error paths stay out of line (prep.c).
 *
 * Threads: a spec and a run live on the calling thread's stack. */
#ifndef CT_OPS_PREP_H
#define CT_OPS_PREP_H

#include "device_impl.h"
#include "tensor_impl.h"

/* The steps every elementwise front end (tensor/ops/) takes around its
 * kernel, in one place, as ATen's TensorIterator does: checks of the
 * handles and that they share a device, the device's entry, the broadcast
 * shape, the in-place rules (the shape fits, the result's dtype can be
 * stored, no partial overlap, the autograd hook), the result's
 * allocation, the operands' conversion to the compute dtype, and, after
 * the kernel, the copy of a temporary into an in-place target, the
 * release on failure and the autograd record. The front end keeps only
 * what is its own: its dtype rules and its kernel call. */

#define CT__OP_MAX_INPUTS 3

typedef struct ct__op_spec {
    const char *name; /* for messages: "add_", "where" */
    ct_op op;         /* for the autograd record */
    /* The tensor operands, in the kernel's order; an in-place op writes
     * into in[0]. fixed: bit k set keeps in[k] in its own dtype (where's
     * condition) instead of converting it to the compute dtype. */
    ct_tensor *in[CT__OP_MAX_INPUTS];
    int nin;
    unsigned fixed;
    bool inplace;
    size_t entry; /* offsetof(ct__device_ops, the kernel) */
    const char *entry_name;
} ct__op_spec;

/* The prepared op, filled by ct__op_begin and ct__op_alloc. */
typedef struct ct__op_run {
    const ct__device_ops *dev; /* the operands' device's table */
    ct_device device;
    int nd; /* the broadcast shape */
    int64_t shape[CT_MAX_DIMS];
    ct_tensor *x[CT__OP_MAX_INPUTS]; /* the operands in the compute dtype */
    ct_tensor *out;                  /* the result: new, or in[0] in place */
    ct_tensor *dst;                  /* what the kernel writes: out, or a temporary */
    bool scope;                      /* a private scope holds conversions and the temporary */
} ct__op_run;

/* The in-place rules for writing a result of dtype result into s->in[0]
 * (prep.c). 0, or a CT_E* code with the message set. */
int ct__op_check_inplace(const ct__op_spec *s, const ct__op_run *r, ct_dtype result);

/* Checks s's operands and finds their device's entry and broadcast shape.
 * 0, or a CT_E* code with the message set (nothing to undo). It does no
 * work an op does not need: no lookup on the host, whose table has every
 * entry the front ends take, and no device check of one operand. */
static inline int ct__op_begin(const ct__op_spec *s, ct__op_run *r) {
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
    /* All CT_MAX_DIMS: a copy of fixed size is inline, the used part's a call. */
    memcpy(r->shape, s->in[0]->sizes, sizeof r->shape);
    for (int k = 1; k < s->nin; k++)
        if (ct__tensor_broadcast_shapes(s->name, r->nd, r->shape, s->in[k]->ndim, s->in[k]->sizes,
                                        &r->nd, r->shape))
            return ct_errcode();
    return 0;
}

/* With the dtypes the front end chose, checks the in-place rules,
 * allocates the result, and converts the operands. 0, or a CT_E* code
 * (nothing to undo). */
static inline int ct__op_alloc(const ct__op_spec *s, ct__op_run *r, ct_dtype compute,
                               ct_dtype result) {
    if (s->inplace && ct__op_check_inplace(s, r, result))
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

/* After the kernel (rc its result): the result recorded with args (its
 * scalar operands), or NULL with the error set and a new result released.
 * Always called after a successful ct__op_alloc. */
static inline ct_tensor *ct__op_end(const ct__op_spec *s, ct__op_run *r, int rc,
                                    const ct_op_args *args) {
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

#endif
