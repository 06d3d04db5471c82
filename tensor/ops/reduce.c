/* Reductions: sum, mean, prod, amax/amin, var/std, logsumexp, norm,
 * max/min along a dim and argmax/argmin. The front ends check the dims and
 * dtypes, pick the result dtype, allocate and record; the device computes
 * (device_impl.h: tensor/cpu/reduce.c, tensor/cuda/reduce.cu). */
#include "prep.h"
#include "ops_impl.h"
#include "tensor_impl.h"

#include <math.h>

typedef struct red_desc {
    const char *name;
    ct_op op;
    int kind;        /* CT__KIND_* */
    int post;        /* CT__POST_* */
    bool float_only; /* CT_EDTYPE for other inputs, as PyTorch's mean/var/norm */
    bool float_out;  /* integer inputs give float32 (logsumexp) */
} red_desc;

/* Validates dims and fills the reduced-dim mask, the output shape and the
 * dims recorded for autograd. */
static int parse_dims(const char *op, const ct_tensor *t, const int *dims, int ndims, bool keepdim,
                      bool *mask, ct_op_args *args, int *out_ndim, int64_t *out_sizes) {
    char desc[CT__DESC_STR];
    int maxd = t->ndim > 0 ? t->ndim : 1;
    if (ndims < 0 || ndims > maxd || (ndims > 0 && !dims))
        return ct__err_set(CT_EINVAL, "%s: %d dims%s given for %s; expected 0 (every dim) to %d",
                           op, ndims, ndims > 0 && !dims ? " (but a NULL list)" : "",
                           ct__tensor_desc(desc, t), maxd);
    for (int d = 0; d < CT_MAX_DIMS; d++)
        mask[d] = ndims == 0;
    for (int i = 0; i < ndims; i++) {
        int w = ct__tensor_wrap_dim(op, dims[i], t->ndim);
        if (w < 0)
            return ct__err_set(CT_EINVAL, "%s; input is %s", ct_errmsg(), ct__tensor_desc(desc, t));
        if (mask[w])
            return ct__err_set(CT_EINVAL,
                               "%s: dim %d appears more than once in the dims reduced over %s", op,
                               dims[i], ct__tensor_desc(desc, t));
        mask[w] = true;
        args->ints[i] = w;
    }
    args->nints = ndims;
    *out_ndim = 0;
    for (int d = 0; d < t->ndim; d++)
        if (!mask[d] || keepdim)
            out_sizes[(*out_ndim)++] = mask[d] ? 1 : t->sizes[d];
    return 0;
}

static ct_dtype out_dtype(const red_desc *d, ct_dtype in) {
    if (ct_dtype_is_float(in))
        return in;
    if (d->float_out)
        return CT_FLOAT32;
    if (d->kind == CT__KIND_SUM || d->kind == CT__KIND_PROD)
        return CT_INT64;
    return in;
}

/* Each kind's family (ops_impl.h), for the checks that depend on it. */
static const int family_of[CT__NUM_RED_KINDS] = {
#define FAMILY_ROW(KIND, FAMILY, MAP) [CT__KIND_##KIND] = CT__RED_##FAMILY,
    CT__RED_KINDS(FAMILY_ROW)
#undef FAMILY_ROW
};

static ct_tensor *reduce(const red_desc *d, ct_tensor *t, const int *dims, int ndims, bool keepdim,
                         double scalar, ct_tensor **indices) {
    if (indices)
        *indices = NULL;
    /* The preparation's checks and lookup; the outputs' shape and the
     * record, of one or two outputs, are the reduction's own. */
    ct__op_spec s = {.name = d->name,
                     .op = d->op,
                     .in = {t},
                     .nin = 1,
                     .entry = offsetof(ct__device_ops, reduce),
                     .entry_name = "reduce"};
    ct__op_run prep;
    if (ct__op_begin(&s, &prep))
        return NULL;
    int family = family_of[d->kind];
    ct_device device = prep.device;
    const ct__device_ops *dev = prep.dev;
    bool mask[CT_MAX_DIMS];
    ct_op_args args = {.scalars = {scalar}, .keepdim = keepdim};
    int out_ndim = 0;
    int64_t out_sizes[CT_MAX_DIMS];
    char desc[CT__DESC_STR];
    if (parse_dims(d->name, t, dims, ndims, keepdim, mask, &args, &out_ndim, out_sizes))
        return NULL;
    if (d->float_only && !ct_dtype_is_float(t->dtype)) {
        ct__err_set(CT_EDTYPE,
                    "%s: input %s is not floating point; %s needs float32, float64, bfloat16 or "
                    "float16 (convert with ct_to_dtype)",
                    d->name, ct__tensor_desc(desc, t), d->name);
        return NULL;
    }
    bool arg = family == CT__RED_ARGMAX || family == CT__RED_ARGMIN;
    if (arg || family == CT__RED_MAX || family == CT__RED_MIN)
        for (int i = 0; i < t->ndim; i++)
            if (mask[i] && t->sizes[i] == 0) {
                ct__err_set(CT_EINVAL,
                            "%s: cannot reduce over dim %d of %s: it has size 0 and %s has no "
                            "identity",
                            d->name, i, ct__tensor_desc(desc, t), d->name);
                return NULL;
            }

    bool index_only = d->op == CT_OP_ARGMAX || d->op == CT_OP_ARGMIN;
    ct_dtype result = index_only ? CT_INT64 : out_dtype(d, t->dtype);
    ct__reduction red = {.name = d->name,
                         .kind = d->kind,
                         .post = d->post,
                         .scalar = scalar,
                         .index_only = index_only,
                         .float_out = d->float_out};

    /* max_dim always makes its indices: autograd needs them even when the
     * caller does not. */
    bool with_indices = arg && !index_only;
    ct_tensor *out = ct__tensor_new_on(d->name, out_ndim, out_sizes, result, device);
    ct_tensor *idx =
        with_indices ? ct__tensor_new_on(d->name, out_ndim, out_sizes, CT_INT64, device) : NULL;
    bool ok = out && (idx || !with_indices) && dev->reduce(&red, t, out, idx, mask, keepdim) == 0;
    if (!ok) {
        ct__tensor_release(out);
        ct__tensor_release(idx);
        return NULL;
    }
    if (!idx)
        return ct__tensor_record1(d->op, out, (ct_tensor *[]){t}, 1, &args);
    ct_tensor *r =
        ct__tensor_record(d->op, (ct_tensor *[]){t}, 1, (ct_tensor *[]){out, idx}, 2, false, &args);
    if (r && indices)
        *indices = idx;
    else if (r)
        ct__tensor_release(idx);
    return r;
}

/* ------------------------------------------------------------------- ops */

/* Reductions without a parameter; name doubles as the op's name in errors. */
#define DEFINE_REDUCTION(name, OP, kind, post, float_only, float_out)                              \
    ct_tensor *ct_##name(ct_tensor *t, const int *dims, int ndims, bool keepdim) {                 \
        return reduce(&(const red_desc){#name, CT_OP_##OP, kind, post, float_only, float_out}, t,  \
                      dims, ndims, keepdim, 0, NULL);                                              \
    }

DEFINE_REDUCTION(sum, SUM, CT__KIND_SUM, CT__POST_NONE, false, false)
DEFINE_REDUCTION(mean, MEAN, CT__KIND_SUM, CT__POST_MEAN, true, false)
DEFINE_REDUCTION(prod, PROD, CT__KIND_PROD, CT__POST_NONE, false, false)
DEFINE_REDUCTION(amax, AMAX, CT__KIND_MAX, CT__POST_NONE, false, false)
DEFINE_REDUCTION(amin, AMIN, CT__KIND_MIN, CT__POST_NONE, false, false)
DEFINE_REDUCTION(logsumexp, LOGSUMEXP, CT__KIND_LSE, CT__POST_NONE, false, true)

ct_tensor *ct_var(ct_tensor *t, const int *dims, int ndims, double correction, bool keepdim) {
    return reduce(&(const red_desc){"var", CT_OP_VAR, CT__KIND_VAR, CT__POST_NONE, true, false}, t,
                  dims, ndims, keepdim, correction, NULL);
}

ct_tensor *ct_std(ct_tensor *t, const int *dims, int ndims, double correction, bool keepdim) {
    return reduce(&(const red_desc){"std", CT_OP_STD, CT__KIND_VAR, CT__POST_SQRT, true, false}, t,
                  dims, ndims, keepdim, correction, NULL);
}

ct_tensor *ct_norm(ct_tensor *t, double p, const int *dims, int ndims, bool keepdim) {
    if (isnan(p)) {
        char desc[CT__DESC_STR];
        if (!CT__CHECK_ANY("norm", t))
            ct__err_set(CT_EINVAL, "norm: p is NaN for %s; expected a number or +-INFINITY",
                        ct__tensor_desc(desc, t));
        return NULL;
    }
    int kind = CT__KIND_SUM_POW, post = CT__POST_ROOT;
    if (isinf(p)) {
        kind = p > 0 ? CT__KIND_MAX_ABS : CT__KIND_MIN_ABS;
        post = CT__POST_NONE;
    } else if (p == 0 || p == 1) {
        kind = p == 0 ? CT__KIND_SUM_NZ : CT__KIND_SUM_ABS;
        post = CT__POST_NONE;
    } else if (p == 2) {
        kind = CT__KIND_SUM_SQR;
        post = CT__POST_SQRT;
    }
    return reduce(&(const red_desc){"norm", CT_OP_NORM, kind, post, true, false}, t, dims, ndims,
                  keepdim, p, NULL);
}

static ct_tensor *extreme_dim(const char *name, ct_op op, int kind, ct_tensor *t, int dim,
                              bool keepdim, ct_tensor **indices) {
    return reduce(&(const red_desc){name, op, kind, CT__POST_NONE, false, false}, t, &dim, 1,
                  keepdim, 0, indices);
}

ct_tensor *ct_max_dim(ct_tensor *t, int dim, bool keepdim, ct_tensor **indices) {
    return extreme_dim("max_dim", CT_OP_MAX_DIM, CT__KIND_ARGMAX, t, dim, keepdim, indices);
}

ct_tensor *ct_min_dim(ct_tensor *t, int dim, bool keepdim, ct_tensor **indices) {
    return extreme_dim("min_dim", CT_OP_MIN_DIM, CT__KIND_ARGMIN, t, dim, keepdim, indices);
}

ct_tensor *ct_argmax(ct_tensor *t, int dim, bool keepdim) {
    return extreme_dim("argmax", CT_OP_ARGMAX, CT__KIND_ARGMAX, t, dim, keepdim, NULL);
}

ct_tensor *ct_argmin(ct_tensor *t, int dim, bool keepdim) {
    return extreme_dim("argmin", CT_OP_ARGMIN, CT__KIND_ARGMIN, t, dim, keepdim, NULL);
}
