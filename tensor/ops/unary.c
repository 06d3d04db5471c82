/* Unary elementwise ops: the front end. It picks the result dtype and
 * calls the kernel between the op-preparation steps (device_impl.h); the
 * kernels are the device's: tensor/cpu/unary.c, tensor/cuda/kernels.cu. */
#include "ops_impl.h"
#include "prep.h"
#include "tensor_impl.h"

#include <math.h>

typedef struct unary_op {
    const char *names[2]; /* [in place] */
    ct_op op;
    bool ints; /* integer inputs stay integral (else: computed in float32) */
} unary_op;

/* The registry's integer expression is 0 for the float-valued ops. */
static const unary_op unary_ops[] = {
#define UNARY_ROW(name, NAME, FEXPR, IEXPR) {{#name, #name "_"}, CT_OP_##NAME, sizeof #IEXPR > 2},
    CT__UNARY_OPS(UNARY_ROW)
#undef UNARY_ROW
};
_Static_assert(sizeof unary_ops / sizeof *unary_ops == CT__NUM_UNARY,
               "a row for every unary op of the registry");
/* The public list (ct/tensor.h) is the registry but pow_scalar and clamp,
 * which take scalars; a name it lacks would not compile below. */
#define COUNT_PUBLIC(name) +1
_Static_assert(0 CT_UNARY_OP_MAP(COUNT_PUBLIC) + 2 == CT__NUM_UNARY,
               "CT_UNARY_OP_MAP (ct/tensor.h) and the registry (ops_impl.h) list the same ops");

static ct_tensor *unary(int which, ct_tensor *t, bool inplace, double p0, double p1) {
    const unary_op *u = &unary_ops[which];
    ct__op_spec s = {.name = u->names[inplace],
                     .op = u->op,
                     .in = {t},
                     .nin = 1,
                     .inplace = inplace,
                     .entry = offsetof(ct__device_ops, unary),
                     .entry_name = "unary"};
    ct__op_run r;
    if (ct__op_begin(&s, &r))
        return NULL;
    /* Integer powers stay integral only for whole, non-negative exponents. */
    bool int_ok = u->ints && t->dtype != CT_BOOL &&
                  !(which == CT__UNARY_POW_SCALAR && (p0 < 0 || p0 != floor(p0)));
    ct_dtype out_dtype = ct_dtype_is_float(t->dtype) || int_ok ? t->dtype : CT_FLOAT32;
    if (t->dtype == CT_BOOL && u->ints && which != CT__UNARY_POW_SCALAR) {
        char desc[CT__DESC_STR];
        ct__err_set(CT_EDTYPE, "%s: not supported for bool tensors (%s)", s.name,
                    ct__tensor_desc(desc, t));
        return NULL;
    }
    struct {
        double d[2];
        int64_t i[2];
    } prm = {{p0, p1}, {0, 0}};
    /* Only the scalar ops have parameters: the others skip the rounding,
     * a tenth of a one-element op's time. */
    bool scalars = which == CT__UNARY_POW_SCALAR || which == CT__UNARY_CLAMP;
    for (int k = 0; scalars && k < 2; k++)
        prm.i[k] =
            isnan(prm.d[k])       ? 0
            : prm.d[k] <= -9.2e18 ? INT64_MIN
            : prm.d[k] >= 9.2e18
                ? INT64_MAX
                : (int64_t)(which == CT__UNARY_CLAMP && k == 0 ? ceil(prm.d[k]) : floor(prm.d[k]));
    /* An integer input of a float-valued op is computed in float32, which
     * an integer tensor cannot hold in place. */
    if (ct__op_alloc(&s, &r, out_dtype, out_dtype))
        return NULL;
    int rc = r.dev->unary(which, r.dst, r.x[0], prm.d, prm.i);
    ct_op_args args = {.scalars = {p0, p1}};
    return ct__op_end(&s, &r, rc, &args);
}

#define DEFINE_SIMPLE(name)                                                                        \
    ct_tensor *ct_##name(ct_tensor *t) { return unary(ct__unary_##name, t, false, 0, 0); }         \
    ct_tensor *ct_##name##_(ct_tensor *t) { return unary(ct__unary_##name, t, true, 0, 0); }

CT_UNARY_OP_MAP(DEFINE_SIMPLE)

ct_tensor *ct_pow_scalar(ct_tensor *t, double e) {
    return unary(CT__UNARY_POW_SCALAR, t, false, e, 0);
}
ct_tensor *ct_pow_scalar_(ct_tensor *t, double e) {
    return unary(CT__UNARY_POW_SCALAR, t, true, e, 0);
}
ct_tensor *ct_clamp(ct_tensor *t, double lo, double hi) {
    return unary(CT__UNARY_CLAMP, t, false, lo, hi);
}
ct_tensor *ct_clamp_(ct_tensor *t, double lo, double hi) {
    return unary(CT__UNARY_CLAMP, t, true, lo, hi);
}
