/* Binary elementwise ops, comparisons, where and masked_fill: the front
 * ends. They check, promote, broadcast, allocate and record; the kernels
 * are the device's (device_impl.h): tensor/cpu/binary.c,
 * tensor/cuda/kernels.cu and index.cu. */
#include "device_impl.h"
#include "ops_impl.h"
#include "tensor_impl.h"

#include <math.h>

/* The integer dtypes an op takes (ops_impl.h's last column). */
enum { INTS_NONE, INTS_INTS, INTS_ALL };

typedef struct binary_op {
    const char *names[2][2]; /* [scalar form][in place]: add, add_, add_scalar, add_scalar_ */
    ct_op op;
    bool compare;
    int ints;
} binary_op;

#define NAMES(name)                                                                                \
    {                                                                                              \
        {#name, #name "_"}, { #name "_scalar", #name "_scalar_" }                                  \
    }
static const binary_op binary_ops[] = {
#define ARITH_ROW(name, NAME, FEXPR, IEXPR, INTS)   {NAMES(name), CT_OP_##NAME, false, INTS_##INTS},
#define COMPARE_ROW(name, NAME, FEXPR, IEXPR, INTS) {NAMES(name), CT_OP_##NAME, true, INTS_##INTS},
    CT__ARITH_OPS(ARITH_ROW) CT__COMPARE_OPS(COMPARE_ROW)
#undef ARITH_ROW
#undef COMPARE_ROW
};
_Static_assert(sizeof binary_ops / sizeof *binary_ops == CT__NUM_BINARY,
               "a row for every binary op of the registry");

/* Every binary op the public header declares is in the registry (the
 * functions below would not compile otherwise), and the registry has no
 * other than pow, whose scalar form is unary. */
#define COUNT_PUBLIC(name) +1
_Static_assert(0 CT_BINARY_OP_MAP(COUNT_PUBLIC) + 1 == CT__NUM_BINARY,
               "CT_BINARY_OP_MAP (ct/tensor.h) and the registry (ops_impl.h) list the same ops");

static bool supports(const binary_op *bo, ct_dtype d) {
    return ct_dtype_is_float(d) ||
           (bo->ints != INTS_NONE && (d != CT_BOOL || bo->ints == INTS_ALL));
}

static int dtype_category(ct_dtype d) { return d == CT_BOOL ? 0 : ct_dtype_is_float(d) ? 2 : 1; }

/* The dtype a scalar operand takes next to tensor dtype t (PyTorch's rule
 * for Python numbers: it never widens a tensor of the same category). */
static ct_dtype scalar_dtype(ct_dtype t, double v) {
    bool whole = v == floor(v) && fabs(v) < 9.2e18;
    if (ct_dtype_is_float(t))
        return t;
    if (!whole)
        return CT_FLOAT32;
    return t == CT_BOOL ? CT_INT64 : t;
}

/* t itself when it has dtype, else a conversion owned by the current
 * scope. */
static ct_tensor *as_dtype(ct_tensor *t, ct_dtype dtype) {
    return t->dtype == dtype ? t : ct_to_dtype(t, dtype);
}

/* a (op) b, or a (op) scalar when b is NULL. inplace writes into a. */
static ct_tensor *binary(int which, ct_tensor *a, ct_tensor *b, double scalar, bool inplace) {
    const binary_op *bo = &binary_ops[which];
    bool has_b = b != NULL;
    const char *name = bo->names[!has_b][inplace];
    char da[CT__DESC_STR], db[CT__DESC_STR];
    if (has_b ? CT__CHECK_ANY(name, a, b) : CT__CHECK_ANY(name, a))
        return NULL;
    if (has_b && ct__check_same_device(name, (ct_tensor *[]){a, b}, 2))
        return NULL;
    ct_device device = a->storage->device;
    const ct__device_ops *dev = CT__DEVICE_GET(name, device, binary);
    if (!dev)
        return NULL;
    ct_dtype compute =
        has_b ? ct_promote_types(a->dtype, b->dtype) : scalar_dtype(a->dtype, scalar);
    if (which == CT__BINARY_DIV && !ct_dtype_is_float(compute))
        compute = CT_FLOAT32;
    if (!supports(bo, compute)) {
        ct__seterr(CT_EDTYPE, "%s: not supported for %s operands (%s%s%s)", name,
                   ct_dtype_name(compute), ct__desc(da, a), has_b ? " and " : "",
                   has_b ? ct__desc(db, b) : "");
        return NULL;
    }
    ct_dtype result = bo->compare ? CT_BOOL : compute;
    int nd = a->ndim;
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, a->sizes, sizeof shape);
    if (has_b && ct__broadcast_shapes(name, a->ndim, a->sizes, b->ndim, b->sizes, &nd, shape))
        return NULL;
    if (inplace) {
        bool fits = nd == a->ndim && memcmp(shape, a->sizes, sizeof(int64_t) * (size_t)nd) == 0;
        char ds[CT__SHAPE_STR];
        if (!fits) {
            ct__seterr(CT_ESHAPE, "%s: the broadcast shape %s does not match %s, written in place",
                       name, ct__shape_str(ds, nd, shape), ct__desc(da, a));
            return NULL;
        }
        if (dtype_category(result) > dtype_category(a->dtype)) {
            ct__seterr(CT_EDTYPE, "%s: result type %s cannot be stored in %s in place", name,
                       ct_dtype_name(result), ct__desc(da, a));
            return NULL;
        }
        if (ct__check_inplace(bo->op, name, a, (ct_tensor *[]){b}, has_b))
            return NULL;
    }

    /* The result is made in the caller's scope. Operands in another dtype
     * are converted, and an in-place result of another dtype is computed
     * into a temporary, in a private scope that releases them; the common
     * case needs none and skips it. */
    bool direct = inplace && result == a->dtype;
    bool temps = a->dtype != compute || (has_b && b->dtype != compute) || (inplace && !direct);
    ct_tensor *out = inplace ? a : ct__new_on(name, nd, shape, result, device);
    if (!out)
        return NULL;
    if (temps)
        ct_scope_begin();
    ct_tensor *x = as_dtype(a, compute);
    ct_tensor *y = has_b ? as_dtype(b, compute) : NULL;
    ct_tensor *dst = inplace && !direct ? ct__new_on(name, nd, shape, result, device) : out;
    bool ok =
        x && (y || !has_b) && dst && dev->binary(which, dst, x, y, scalar, compute, nd, shape) == 0;
    if (ok && dst != out)
        ok = ct__copy_any(out, dst) == 0;
    if (temps)
        ct_scope_end();
    if (!ok) {
        if (!inplace)
            ct__release(out);
        return NULL;
    }

    ct_tensor *res = inplace ? a : out;
    ct_op_args args = {.scalars = {scalar, 0}, .scalar_operand = !has_b};
    return ct__record(bo->op, (ct_tensor *[]){a, b}, has_b ? 2 : 1, (ct_tensor *[]){res}, 1,
                      inplace, &args);
}

#define DEFINE_BINARY(name)                                                                        \
    ct_tensor *ct_##name(ct_tensor *a, ct_tensor *b) {                                             \
        if (!b && CT__CHECK(#name, a, b))                                                          \
            return NULL;                                                                           \
        return binary(ct__binary_##name, a, b, 0, false);                                          \
    }                                                                                              \
    ct_tensor *ct_##name##_(ct_tensor *a, ct_tensor *b) {                                          \
        if (!b && CT__CHECK(#name "_", a, b))                                                      \
            return NULL;                                                                           \
        return binary(ct__binary_##name, a, b, 0, true);                                           \
    }
#define DEFINE_BINARY_SCALAR(name)                                                                 \
    ct_tensor *ct_##name##_scalar(ct_tensor *a, double b) {                                        \
        return binary(ct__binary_##name, a, NULL, b, false);                                       \
    }                                                                                              \
    ct_tensor *ct_##name##_scalar_(ct_tensor *a, double b) {                                       \
        return binary(ct__binary_##name, a, NULL, b, true);                                        \
    }
CT_BINARY_OP_MAP(DEFINE_BINARY)
CT_BINARY_OP_MAP(DEFINE_BINARY_SCALAR)
/* pow's scalar form is the unary ct_pow_scalar (unary.c). */
DEFINE_BINARY(pow)

/* ------------------------------------------------------ where, masked_fill */

static int check_mask(const char *op, const ct_tensor *mask) {
    char desc[CT__DESC_STR];
    if (mask->dtype != CT_BOOL)
        return ct__seterr(CT_EDTYPE, "%s: the condition must be bool, got %s", op,
                          ct__desc(desc, mask));
    return 0;
}

ct_tensor *ct_where(ct_tensor *cond, ct_tensor *a, ct_tensor *b) {
    if (CT__CHECK_ANY("where", cond, a, b) ||
        ct__check_same_device("where", (ct_tensor *[]){cond, a, b}, 3) || check_mask("where", cond))
        return NULL;
    int nab, nd;
    int64_t ab[CT_MAX_DIMS], shape[CT_MAX_DIMS];
    if (ct__broadcast_shapes("where", a->ndim, a->sizes, b->ndim, b->sizes, &nab, ab) ||
        ct__broadcast_shapes("where", cond->ndim, cond->sizes, nab, ab, &nd, shape))
        return NULL;
    ct_dtype dt = ct_promote_types(a->dtype, b->dtype);
    ct_scope_begin();
    ct_tensor *x = ct_to_dtype(a, dt), *y = ct_to_dtype(b, dt);
    const ct__device_ops *dev = CT__DEVICE_GET("where", cond->storage->device, where);
    ct_tensor *out = dev ? ct__new_on("where", nd, shape, dt, cond->storage->device) : NULL;
    bool ok = x && y && out && dev->where(out, cond, x, y, NULL, nd, shape) == 0;
    if (!ok) {
        ct_scope_end();
        return NULL;
    }
    ct_keep(out);
    ct_scope_end();
    return ct__record1(CT_OP_WHERE, out, (ct_tensor *[]){cond, a, b}, 3, NULL);
}

static ct_tensor *masked_fill(ct_tensor *t, ct_tensor *mask, double value, bool inplace) {
    const char *name = inplace ? "masked_fill_" : "masked_fill";
    if (CT__CHECK_ANY(name, t, mask) || ct__check_same_device(name, (ct_tensor *[]){t, mask}, 2) ||
        check_mask(name, mask))
        return NULL;
    int nd;
    int64_t shape[CT_MAX_DIMS];
    if (ct__broadcast_shapes(name, t->ndim, t->sizes, mask->ndim, mask->sizes, &nd, shape))
        return NULL;
    if (nd != t->ndim || memcmp(shape, t->sizes, sizeof(int64_t) * (size_t)nd) != 0) {
        char dt[CT__DESC_STR], dm[CT__DESC_STR];
        ct__seterr(CT_ESHAPE, "%s: mask %s does not broadcast to %s", name, ct__desc(dm, mask),
                   ct__desc(dt, t));
        return NULL;
    }
    const ct__device_ops *dev = CT__DEVICE_GET(name, t->storage->device, where);
    ct_tensor *out = !dev ? NULL : inplace ? t : ct_clone(t);
    if (!out ||
        (inplace && ct__check_inplace(CT_OP_MASKED_FILL, name, t, (ct_tensor *[]){mask}, 1)))
        return NULL;
    uint64_t bits = 0;
    ct__store_double(t->dtype, &bits, value);
    if (dev->where(out, mask, NULL, out, &bits, nd, shape)) {
        if (!inplace)
            ct__release(out);
        return NULL;
    }
    ct_op_args args = {.scalars = {value, 0}};
    return ct__record(CT_OP_MASKED_FILL, (ct_tensor *[]){t, mask}, 2, (ct_tensor *[]){out}, 1,
                      inplace, &args);
}

ct_tensor *ct_masked_fill(ct_tensor *t, ct_tensor *mask, double value) {
    return masked_fill(t, mask, value, false);
}

ct_tensor *ct_masked_fill_(ct_tensor *t, ct_tensor *mask, double value) {
    return masked_fill(t, mask, value, true);
}
