/* Softmax and log-softmax along one dim: the front end. It checks the dim
 * and the dtype between the op-preparation steps (device_impl.h); the
 * device computes (tensor/cpu/softmax.c, tensor/cuda/reduce.cu). */
#include "prep.h"
#include "tensor_impl.h"

static ct_tensor *softmax_op(const char *name, ct_op op, bool log, ct_tensor *t, int dim) {
    ct__op_spec s = {.name = name,
                     .op = op,
                     .in = {t},
                     .nin = 1,
                     .entry = offsetof(ct__device_ops, softmax),
                     .entry_name = "softmax"};
    ct__op_run r;
    if (ct__op_begin(&s, &r))
        return NULL;
    char desc[CT__DESC_STR];
    int d = ct__tensor_wrap_dim(name, dim, t->ndim);
    if (d < 0) {
        ct__err_set(CT_EINVAL, "%s; input is %s", ct_errmsg(), ct__tensor_desc(desc, t));
        return NULL;
    }
    if (!ct_dtype_is_float(t->dtype)) {
        ct__err_set(CT_EDTYPE,
                    "%s: input %s is not floating point; %s needs float32, float64, bfloat16 or "
                    "float16 (convert with ct_to_dtype)",
                    name, ct__tensor_desc(desc, t), name);
        return NULL;
    }
    if (ct__op_alloc(&s, &r, t->dtype, t->dtype))
        return NULL;
    ct_op_args args = {.ints = {d}, .nints = 1};
    return ct__op_end(&s, &r, r.dev->softmax(r.dst, r.x[0], d, log), &args);
}

ct_tensor *ct_softmax(ct_tensor *t, int dim) {
    return softmax_op("softmax", CT_OP_SOFTMAX, false, t, dim);
}

ct_tensor *ct_log_softmax(ct_tensor *t, int dim) {
    return softmax_op("log_softmax", CT_OP_LOG_SOFTMAX, true, t, dim);
}
