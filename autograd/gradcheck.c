/* gradcheck: analytic gradients against float64 central differences. */
#include "autograd_impl.h"

#include <math.h>
#include <stdio.h>

/* sum(fn(inputs) * r) as a double. */
static int probe(ct_gradcheck_fn fn, void *ctx, ct_tensor *const *inputs, int n, ct_tensor *r,
                 double *value) {
    ct_scope_begin();
    ct_tensor *s = ct_sum(ct_mul(fn(ctx, inputs, n), r), NULL, 0, false);
    *value = s ? ct_item(s) : NAN;
    int rc = s ? 0 : ct_errcode();
    ct_scope_end();
    return rc;
}

typedef struct worst {
    double excess; /* |analytic - numeric| - tolerance */
    int input;
    int64_t index[CT_MAX_DIMS];
    double analytic, numeric;
    int64_t failures;
} worst;

/* Differentiates one input element by element, in place through its own
 * memory (each element is restored before the next). */
static int check_input(ct_gradcheck_fn fn, void *ctx, ct_tensor *const *inputs, int ninputs, int k,
                       ct_tensor *analytic, ct_tensor *r, const ct_gradcheck_options *o, worst *w) {
    ct_tensor *x = inputs[k];
    int64_t numel = ct_numel(x), idx[CT_MAX_DIMS] = {0};
    for (int64_t e = 0; e < numel; e++) {
        int64_t off = 0;
        for (int d = 0; d < x->ndim; d++)
            off += idx[d] * x->strides[d];
        double *p = (double *)ct__data(x) + off, orig = *p, plus, minus;
        *p = orig + o->eps;
        int rc = probe(fn, ctx, inputs, ninputs, r, &plus);
        *p = orig - o->eps;
        if (!rc)
            rc = probe(fn, ctx, inputs, ninputs, r, &minus);
        *p = orig;
        if (rc)
            return rc;
        double numeric = (plus - minus) / (2 * o->eps);
        double exact = analytic ? ct_get(analytic, idx) : 0;
        double excess = fabs(exact - numeric) - (o->atol + o->rtol * fabs(numeric));
        if (excess > 0 || isnan(excess)) {
            w->failures++;
            if (isnan(excess) || w->failures == 1 || excess > w->excess) {
                *w =
                    (worst){isnan(excess) ? INFINITY : excess, k, {0}, exact, numeric, w->failures};
                memcpy(w->index, idx, sizeof idx);
            }
        }
        for (int d = x->ndim - 1; d >= 0 && ++idx[d] == x->sizes[d]; d--)
            idx[d] = 0;
    }
    return 0;
}

static int validate(ct_tensor *const *inputs, int n, bool *any) {
    char desc[CT__DESC_STR];
    for (int i = 0; i < n; i++) {
        int rc = CT__CHECK("gradcheck", inputs[i]);
        if (rc)
            return rc;
        ct_tensor *x = inputs[i];
        if (!ct_requires_grad(x))
            continue;
        *any = true;
        if (x->dtype != CT_FLOAT64)
            return ct__err_set(CT_EDTYPE,
                               "gradcheck: input %d is %s; finite differences need float64 "
                               "inputs",
                               i, ct__tensor_desc(desc, x));
        for (int d = 0; d < x->ndim; d++)
            if (x->strides[d] == 0 && x->sizes[d] > 1)
                return ct__err_set(CT_EINVAL,
                                   "gradcheck: input %d (%s) is an expanded view whose elements "
                                   "share memory; perturbing one would move several",
                                   i, ct__tensor_desc(desc, x));
    }
    return 0;
}

int ct_gradcheck(ct_gradcheck_fn fn, void *ctx, ct_tensor *const *inputs, int ninputs,
                 const ct_gradcheck_options *opts) {
    ct_gradcheck_options o = opts ? *opts : (ct_gradcheck_options){0};
    o.eps = o.eps > 0 ? o.eps : 1e-6;
    o.atol = o.atol > 0 ? o.atol : 1e-5;
    o.rtol = o.rtol > 0 ? o.rtol : 1e-3;
    bool any = false;
    int rc = fn ? 0 : ct__err_set(CT_EINVAL, "gradcheck: NULL function");
    if (!rc && (ninputs < 1 || !inputs))
        rc = ct__err_set(CT_EINVAL, "gradcheck: no inputs");
    if (!rc)
        rc = validate(inputs, ninputs, &any);
    if (!rc && !any)
        rc = ct__err_set(CT_EINVAL, "gradcheck: no input requires grad");
    if (rc)
        return rc;

    ct_scope_begin();
    bool prev = ct_set_grad_enabled(true);
    ct_tensor *out = fn(ctx, inputs, ninputs);
    ct_tensor *r = NULL, *grads[ninputs], *wrt[ninputs];
    int which[ninputs], k = 0;
    char desc[CT__DESC_STR];
    if (!out)
        rc = ct_errcode();
    else if (out->dtype != CT_FLOAT64)
        rc = ct__err_set(CT_EDTYPE, "gradcheck: the function returned %s; expected float64",
                         ct__tensor_desc(desc, out));
    if (!rc) {
        /* A fixed random weighting checks every output element at once. */
        ct_generator gen = {.seed = 0x6772616463686b};
        r = ct_randn(out->ndim, out->sizes, CT_FLOAT64, &gen);
        for (int i = 0; i < ninputs; i++)
            if (ct_requires_grad(inputs[i])) {
                which[k] = i;
                wrt[k++] = inputs[i];
            }
        ct_tensor *y = ct_sum(ct_mul(out, r), NULL, 0, false);
        ct_grad_options go = {.allow_unused = true};
        rc = y && ct_requires_grad(y) ? ct_grad(&y, 1, NULL, wrt, k, grads, &go) : 0;
        if (y && !ct_requires_grad(y))
            memset(grads, 0, sizeof grads);
        if (!y)
            rc = ct_errcode();
    }
    /* The probes run with grad mode on: the function may itself need it
     * (a gradient checked as a function of its inputs). */
    worst w = {0};
    for (int j = 0; j < k && !rc; j++)
        rc = check_input(fn, ctx, inputs, ninputs, which[j], grads[j], r, &o, &w);
    ct_set_grad_enabled(prev);
    if (!rc && w.failures > 0) {
        char at[CT__SHAPE_STR];
        rc = ct__err_set(CT_ESTATE,
                         "gradcheck: input %d (%s) element %s: analytic %.10g vs numeric %.10g "
                         "(tolerance atol %g + rtol %g * |numeric|); %lld element(s) failed",
                         w.input, ct__tensor_desc(desc, inputs[w.input]),
                         ct__tensor_shape_str(at, inputs[w.input]->ndim, w.index), w.analytic,
                         w.numeric, o.atol, o.rtol, (long long)w.failures);
    }
    ct_scope_end();
    return rc;
}
