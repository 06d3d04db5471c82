/* Gradient clipping by global norm, after torch.nn.utils.clip_grad_norm_:
 * the norm of each gradient (ct_norm, whose chunked reduction does not
 * depend on the thread count), then the norm of those norms, then one
 * in-place scale of every gradient when the total exceeds max_norm. */
#include "optim_impl.h"

#include <ct/autograd.h>

#include <math.h>

/* Elements of a gradient whose sum of |g|^p is taken in float64 at once:
 * a bounded copy, whatever the parameter's size. */
#define NORM_CHUNK 65536

/* The sum of |g|^p over t (p finite), in float64 however t is stored: a
 * float32 norm rounded per tensor would make the total depend on how the
 * gradients are cut into pieces (ZeRO's shards), and with it the clipping
 * coefficient's last bits; summed in float64, pieces cut anywhere agree to
 * about 1e-16, far below what float32 gradients can see. */
static int power_sum(ct_tensor *t, double p, double *sum) {
    int64_t n = ct_numel(t);
    ct_tensor *flat = ct_reshape(t, 1, &n);
    if (!flat)
        return ct_errcode();
    for (int64_t at = 0; at < n; at += NORM_CHUNK) {
        int64_t len = n - at < NORM_CHUNK ? n - at : NORM_CHUNK;
        ct_scope_begin();
        ct_tensor *norm =
            ct_norm(ct_to_dtype(ct_narrow(flat, 0, at, len), CT_FLOAT64), p, NULL, 0, false);
        double v = norm ? ct_item(norm) : NAN;
        ct_scope_end();
        if (!norm)
            return ct_errcode();
        *sum += p == 2 ? v * v : pow(v, p);
    }
    return 0;
}

/* This rank's part of the p-norm of all the gradients of params together:
 * the sum of |g|^p, or for p = INFINITY the largest |g| (NaN wins). */
static int grad_norms(ct_tensor *const *params, int n, double p, double *partial) {
    double acc = 0;
    for (int i = 0; i < n; i++) {
        ct_tensor *g = ct_tensor_grad(params[i]);
        if (!g)
            continue;
        if (!isinf(p)) {
            CT_TRY(power_sum(g, p, &acc));
            continue;
        }
        ct_tensor *norm = ct_norm(g, p, NULL, 0, false);
        if (!norm)
            return ct_errcode();
        double v = ct_item(norm);
        acc = v > acc || isnan(v) ? v : acc;
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
