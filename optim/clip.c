/* Gradient clipping by global norm, after torch.nn.utils.clip_grad_norm_:
 * the norm of each gradient (ct_norm, whose chunked reduction does not
 * depend on the thread count), then the norm of those norms, then one
 * in-place scale of every gradient when the total exceeds max_norm. */
#include "optim_impl.h"

#include <ct/autograd.h>

#include <math.h>

/* This rank's part of the p-norm of all the gradients of params together:
 * the sum of |g|^p, or for p = INFINITY the largest |g| (NaN wins). */
static int grad_norms(ct_tensor *const *params, int n, double p, double *partial) {
    double acc = 0;
    for (int i = 0; i < n; i++) {
        ct_tensor *g = ct_tensor_grad(params[i]);
        if (!g)
            continue;
        ct_tensor *norm = ct_norm(g, p, NULL, 0, false);
        if (!norm)
            return ct_errcode();
        double v = ct_item(norm);
        if (isinf(p))
            acc = v > acc || isnan(v) ? v : acc;
        else
            acc += p == 2 ? v * v : pow(v, p);
    }
    *partial = acc;
    return 0;
}

int ct_clip_grad_norm_split(ct_tensor *const *params, int n, double max_norm, double norm_type,
                            ct_norm_combine combine, void *ctx, double *total_norm_out) {
    if (n < 0 || (n > 0 && !params))
        return ct__err_set(CT_EINVAL, "clip_grad_norm: %d parameters at %p", n,
                           (const void *)params);
    if (!(max_norm >= 0))
        return ct__err_set(CT_EINVAL, "clip_grad_norm: max_norm %g is invalid; expected >= 0",
                           max_norm);
    if (!(norm_type > 0) || norm_type == -INFINITY)
        return ct__err_set(CT_EINVAL,
                           "clip_grad_norm: norm_type %g is invalid; expected p > 0 or INFINITY",
                           norm_type);
    for (int i = 0; i < n; i++) {
        char role[32];
        snprintf(role, sizeof role, "param %d", i);
        int rc = ct__optim_check_tensor(params[i], "clip_grad_norm", role);
        if (rc)
            return rc;
    }
    bool grad_mode = ct_set_grad_enabled(false);
    ct_scope_begin();
    double acc = 0;
    int rc = grad_norms(params, n, norm_type, &acc);
    if (rc == 0 && combine)
        rc = combine(ctx, &acc, isinf(norm_type));
    double total = isinf(norm_type) ? acc : norm_type == 2 ? sqrt(acc) : pow(acc, 1 / norm_type);
    double coef = max_norm / (total + 1e-6);
    if (rc == 0 && isfinite(total) && coef < 1) {
        for (int i = 0; i < n && rc == 0; i++) {
            ct_tensor *g = ct_tensor_grad(params[i]);
            if (g && !ct_mul_scalar_(g, coef))
                rc = ct_errcode();
        }
    }
    ct_scope_end();
    ct_set_grad_enabled(grad_mode);
    if (rc == 0 && total_norm_out)
        *total_norm_out = total;
    return rc;
}

int ct_clip_grad_norm_p(ct_tensor *const *params, int n, double max_norm, double norm_type,
                        double *total_norm_out) {
    return ct_clip_grad_norm_split(params, n, max_norm, norm_type, NULL, NULL, total_norm_out);
}

int ct_clip_grad_norm(ct_tensor *const *params, int n, double max_norm, double *total_norm_out) {
    return ct_clip_grad_norm_p(params, n, max_norm, 2, total_norm_out);
}
