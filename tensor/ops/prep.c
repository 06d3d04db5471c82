/* The op-preparation step's out-of-line part: the in-place rules, whose
 * failures format messages (prep.h). */
#include "prep.h"

/* The category a dtype's values belong to: bool, integer, float. An
 * in-place result may be stored in a tensor of its own category or a
 * higher one (an integer sum in a float tensor, not a float one in an
 * integer tensor). */
static int dtype_category(ct_dtype d) { return d == CT_BOOL ? 0 : ct_dtype_is_float(d) ? 2 : 1; }

/* The in-place rules for writing the result (of dtype result) into a. */
int ct__op_check_inplace(const ct__op_spec *s, const ct__op_run *r, ct_dtype result) {
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
