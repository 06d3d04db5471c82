/* Losses. Cross-entropy is one fused kernel with its own backward on every
 * device (the table's cross_entropy entries: tensor/cpu/loss.c,
 * tensor/cuda/reduce.cu); the others are compositions of ops. */
#include "device_impl.h"
#include "nn_impl.h"

#include <math.h>
#include <stdlib.h>

static int check_options(const char *op, const ct_loss_options *o) {
    if ((unsigned)o->reduction > CT_REDUCTION_NONE)
        return ct__err_set(CT_EINVAL, "%s: unknown reduction %d", op, (int)o->reduction);
    if (!(o->label_smoothing >= 0 && o->label_smoothing <= 1))
        return ct__err_set(CT_EINVAL, "%s: label_smoothing must be in [0, 1], got %g", op,
                           o->label_smoothing);
    return 0;
}

/* Checks logits [N, C] (or [C]) against integer targets [N] (or []). */
static int check_targets(const char *op, const ct_tensor *x, const ct_tensor *t) {
    char dx[CT__DESC_STR], dt[CT__DESC_STR];
    if (!ct_dtype_is_float(x->dtype) || x->ndim < 1 || x->ndim > 2 || x->sizes[x->ndim - 1] < 1)
        return ct__err_set(CT_EINVAL, "%s: expected float scores [N, C] or [C] with C >= 1, got %s",
                           op, ct__tensor_desc(dx, x));
    if (ct_dtype_is_float(t->dtype) || t->dtype == CT_BOOL)
        return ct__err_set(CT_EDTYPE,
                           "%s: targets must be integer class indices, got %s (class "
                           "probabilities are not supported)",
                           op, ct__tensor_desc(dt, t));
    bool fits = x->ndim == 2 ? t->ndim == 1 && t->sizes[0] == x->sizes[0] : t->ndim == 0;
    if (!fits)
        return ct__err_set(CT_ESHAPE, "%s: targets %s do not match scores %s: expected %s", op,
                           ct__tensor_desc(dt, t), ct__tensor_desc(dx, x),
                           x->ndim == 2 ? "[N]" : "a 0-d index");
    return 0;
}

/* A 0-d tensor of value on like's device. */
static ct_tensor *scalar_on(double value, ct_dtype dtype, const ct_tensor *like) {
    return ct_full_on(0, NULL, value, dtype, ct_tensor_device(like));
}

/* ------------------------------------------------------- cross-entropy */

/* What backward needs besides the saved tensors (scores, lse, targets). */
typedef struct ce_ctx {
    ct_loss_options o;
    int64_t nvalid;
    int logits_ndim;
} ce_ctx;

/* The backward as ops, recorded so that it can be differentiated again
 * (create_graph): (softmax - smoothed one-hot) * scale, zero on ignored
 * rows. */
static ct_tensor *ce_backward_ops(const ce_ctx *c, ct_tensor *x, ct_tensor *t, ct_tensor *scale) {
    int64_t nc = ct_size(x, 1);
    double e = c->o.label_smoothing;
    ct_tensor *valid = ct_unsqueeze(ct_ne_scalar(t, (double)c->o.ignore_index), 1);
    ct_tensor *safe = ct_where(ct_squeeze(valid, 1), t, scalar_on(0, CT_INT64, t));
    ct_tensor *target = ct_to_dtype(ct_one_hot(safe, nc), x->dtype);
    target = ct_add_scalar(ct_mul_scalar(target, 1 - e), e / (double)nc);
    ct_tensor *rows = ct_mul(ct_to_dtype(valid, x->dtype), scale);
    return ct_mul(ct_sub(ct_softmax(x, 1), target), rows);
}

static int ce_backward(const ct_backward_args *a) {
    const ce_ctx *c = a->ctx;
    ct_tensor *x = a->saved[0], *lse = a->saved[1], *t = a->saved[2];
    ct_tensor *g = a->grad_outputs[0];
    if (!g || !a->needs_input_grad[0])
        return 0;
    /* The incoming gradient per row: a scalar for mean and sum (divided by
     * the count for mean), a vector for none. */
    ct_tensor *scale =
        c->o.reduction == CT_REDUCTION_MEAN ? ct_div_scalar(g, (double)c->nvalid) : g;
    if (ct_grad_enabled()) {
        /* A converted copy of the logits has no history to differentiate. */
        if (!ct_requires_grad(x))
            return ct__err_set(CT_ENOTSUP,
                               "cross_entropy: differentiating the backward again (create_graph) "
                               "needs float32 or float64 contiguous logits; convert them first");
        if (c->o.reduction == CT_REDUCTION_NONE)
            scale = ct_unsqueeze(scale, -1);
        ct_tensor *grad = ce_backward_ops(c, x, t, scale);
        a->grad_inputs[0] = c->logits_ndim == 1 && grad ? ct_view(grad, 1, &x->sizes[1]) : grad;
        return 0;
    }
    const ct__device_ops *ops =
        CT__DEVICE_GET("cross_entropy", ct_tensor_device(x), cross_entropy_backward);
    scale = ct_contiguous(ct_to_dtype(scale, x->dtype));
    ct_tensor *grad = ct_empty_on(2, x->sizes, x->dtype, ct_tensor_device(x));
    if (!ops || !scale || !grad)
        return ct_errcode();
    int rc = ops->cross_entropy_backward(grad, x, t, lse, scale, c->o.ignore_index,
                                         c->o.label_smoothing);
    if (!rc)
        a->grad_inputs[0] = c->logits_ndim == 1 ? ct_view(grad, 1, &x->sizes[1]) : grad;
    return rc;
}

static const ct_function_def ce_def = {"CrossEntropyLossBackward", ce_backward, free};

/* The rows' losses, loss [n] float64 on x's device, reduced: a new tensor
 * of dtype dt, without history. The host sums them in row order, the
 * same on any thread count; a device sums them where they lie. */
static ct_tensor *ce_reduce(ct_tensor *loss, int logits_ndim, const ct_loss_options *o,
                            int64_t nvalid, ct_dtype dt) {
    int64_t n = loss->sizes[0];
    if (o->reduction == CT_REDUCTION_NONE) {
        int nd = logits_ndim == 1 ? 0 : 1;
        ct_tensor *out = ct_empty_on(nd, &n, dt, ct_tensor_device(loss));
        return ct_copy_(out, ct_reshape(loss, nd, &n));
    }
    ct_tensor *total;
    if (ct__is_host(ct_tensor_device(loss))) {
        const double *rows = (const double *)ct__data(loss);
        double sum = 0;
        for (int64_t i = 0; i < n; i++)
            sum += rows[i];
        total = ct_scalar(sum, CT_FLOAT64);
    } else {
        total = ct_sum(loss, NULL, 0, false);
    }
    if (o->reduction == CT_REDUCTION_MEAN)
        total = ct_div_scalar(total, (double)nvalid);
    return ct_to_dtype(total, dt);
}

ct_tensor *ct_cross_entropy(ct_tensor *logits, ct_tensor *target, const ct_loss_options *opts) {
    ct_loss_options o = opts ? *opts : CT_LOSS_DEFAULTS;
    if (CT__CHECK_ANY("cross_entropy", logits, target) ||
        ct__tensor_check_same_device("cross_entropy", (ct_tensor *[]){logits, target}, 2) ||
        check_options("cross_entropy", &o) || check_targets("cross_entropy", logits, target))
        return NULL;
    ct_device dev = ct_tensor_device(logits);
    const ct__device_ops *ops = CT__DEVICE_GET("cross_entropy", dev, cross_entropy);
    if (!ops)
        return NULL;
    ct_scope_begin();
    bool prev = ct_set_grad_enabled(false);
    ct_dtype dt = logits->dtype == CT_FLOAT64 ? CT_FLOAT64 : CT_FLOAT32;
    ct_tensor *x = logits->ndim == 1 ? ct_unsqueeze(logits, 0) : logits;
    x = ct_contiguous(ct_to_dtype(x, dt));
    ct_tensor *t = ct_contiguous(ct_to_dtype(ct_reshape(target, 1, (int64_t[]){-1}), CT_INT64));
    ct_tensor *lse = x ? ct_empty_on(2, (int64_t[]){2, x->sizes[0]}, dt, dev) : NULL;
    ct_tensor *loss = x ? ct_empty_on(1, x->sizes, CT_FLOAT64, dev) : NULL;
    /* Targets are checked on the host, as errors are returned, not
     * asserted: a device's come over, and the host waits for them. */
    ct_tensor *th = t && !ct__is_host(dev) ? ct_to(t, CT_DEVICE_CPU) : t;
    ct_tensor *out = NULL;
    ce_ctx *c = malloc(sizeof *c);
    int rc = !x || !th || !lse || !loss ? ct_errcode()
             : !c                       ? ct__err_set(CT_ENOMEM, "cross_entropy: out of memory")
                                        : 0;
    int64_t n = x ? x->sizes[0] : 0, nc = x ? x->sizes[1] : 0, nvalid = 0;
    const int64_t *tp = th ? (const int64_t *)ct__data(th) : NULL;
    for (int64_t i = 0; i < n && !rc; i++) {
        if (tp[i] == o.ignore_index)
            continue;
        nvalid++;
        if (tp[i] < 0 || tp[i] >= nc)
            rc = ct__err_set(CT_ERANGE,
                             "cross_entropy: target %lld at position %lld is outside the %lld "
                             "classes [0, %lld) (ignore_index is %lld)",
                             (long long)tp[i], (long long)i, (long long)nc, (long long)nc,
                             (long long)o.ignore_index);
    }
    if (!rc)
        rc = ops->cross_entropy(loss, lse, x, t, o.ignore_index, o.label_smoothing);
    if (!rc && !(out = ce_reduce(loss, logits->ndim, &o, nvalid, dt)))
        rc = ct_errcode();
    ct_set_grad_enabled(prev);
    if (!rc) {
        *c = (ce_ctx){o, nvalid, logits->ndim};
        rc = ct_function_record(&ce_def, c, &logits, 1, &out, 1, (ct_tensor *[]){x, lse, t}, 3);
        c = NULL;
    }
    free(c);
    if (!rc && logits->dtype != dt)
        out = ct_to_dtype(out, logits->dtype);
    ct_keep(out);
    ct_scope_end();
    return rc ? NULL : out;
}

/* ----------------------------------------------------- composite losses */

static ct_tensor *reduce(ct_tensor *per, ct_reduction r) {
    if (r == CT_REDUCTION_NONE)
        return per;
    return r == CT_REDUCTION_SUM ? ct_sum(per, NULL, 0, false) : ct_mean(per, NULL, 0, false);
}

ct_tensor *ct_nll_loss(ct_tensor *log_probs, ct_tensor *target, const ct_loss_options *opts) {
    ct_loss_options o = opts ? *opts : CT_LOSS_DEFAULTS;
    if (CT__CHECK_ANY("nll_loss", log_probs, target) ||
        ct__tensor_check_same_device("nll_loss", (ct_tensor *[]){log_probs, target}, 2) ||
        check_options("nll_loss", &o) || check_targets("nll_loss", log_probs, target))
        return NULL;
    ct_tensor *x = log_probs->ndim == 1 ? ct_unsqueeze(log_probs, 0) : log_probs;
    ct_tensor *t = ct_to_dtype(ct_reshape(target, 1, (int64_t[]){-1}), CT_INT64);
    ct_tensor *keep = ct_ne_scalar(t, (double)o.ignore_index);
    ct_tensor *safe = ct_where(keep, t, scalar_on(0, CT_INT64, t));
    int64_t nc = ct_size(x, 1);
    ct_tensor *lo = ct_numel(safe) ? ct_amin(safe, NULL, 0, false) : NULL;
    ct_tensor *hi = ct_numel(safe) ? ct_amax(safe, NULL, 0, false) : NULL;
    if (lo && hi && (ct_item_int64(lo) < 0 || ct_item_int64(hi) >= nc)) {
        ct__err_set(CT_ERANGE, "nll_loss: a target is outside the %lld classes [0, %lld)",
                    (long long)nc, (long long)nc);
        return NULL;
    }
    ct_tensor *picked = ct_squeeze(ct_gather(x, 1, ct_unsqueeze(safe, 1)), 1);
    ct_tensor *per = ct_neg(ct_where(keep, picked, scalar_on(0, ct_tensor_dtype(x), x)));
    if (log_probs->ndim == 1)
        per = ct_squeeze(per, 0);
    if (o.reduction != CT_REDUCTION_MEAN)
        return reduce(per, o.reduction);
    return ct_div(ct_sum(per, NULL, 0, false), ct_sum(keep, NULL, 0, false));
}

ct_tensor *ct_mse_loss(ct_tensor *input, ct_tensor *target, ct_reduction reduction) {
    if (CT__CHECK_ANY("mse_loss", input, target) ||
        ct__tensor_check_same_device("mse_loss", (ct_tensor *[]){input, target}, 2))
        return NULL;
    if ((unsigned)reduction > CT_REDUCTION_NONE) {
        ct__err_set(CT_EINVAL, "mse_loss: unknown reduction %d", (int)reduction);
        return NULL;
    }
    ct_tensor *d = ct_sub(input, target);
    return reduce(ct_mul(d, d), reduction);
}
