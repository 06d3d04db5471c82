/* Binary elementwise ops, comparisons, where and masked_fill: the front
 * ends. They promote and call the kernel between the op-preparation steps
 * (device_impl.h), which check, broadcast, allocate and record; the
 * kernels are the device's: tensor/cpu/binary.c, tensor/cuda/kernels.cu
 * and index.cu. */
#include "prep.h"
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

/* a (op) b, or a (op) scalar when b is NULL. inplace writes into a. */
static ct_tensor *binary(int which, ct_tensor *a, ct_tensor *b, double scalar, bool inplace) {
    const binary_op *bo = &binary_ops[which];
    bool has_b = b != NULL;
    ct__op_spec s = {.name = bo->names[!has_b][inplace],
                     .op = bo->op,
                     .in = {a, b},
                     .nin = has_b ? 2 : 1,
                     .inplace = inplace,
                     .entry = offsetof(ct__device_ops, binary),
                     .entry_name = "binary"};
    ct__op_run r;
    if (ct__op_begin(&s, &r))
        return NULL;
    ct_dtype compute =
        has_b ? ct_promote_types(a->dtype, b->dtype) : scalar_dtype(a->dtype, scalar);
    if (which == CT__BINARY_DIV && !ct_dtype_is_float(compute))
        compute = CT_FLOAT32;
    if (!supports(bo, compute)) {
        char da[CT__DESC_STR], db[CT__DESC_STR];
        ct__err_set(CT_EDTYPE, "%s: not supported for %s operands (%s%s%s)", s.name,
                    ct_dtype_name(compute), ct__tensor_desc(da, a), has_b ? " and " : "",
                    has_b ? ct__tensor_desc(db, b) : "");
        return NULL;
    }
    if (ct__op_alloc(&s, &r, compute, bo->compare ? CT_BOOL : compute))
        return NULL;
    int rc = r.dev->binary(which, r.dst, r.x[0], r.x[1], scalar, compute, r.nd, r.shape);
    ct_op_args args = {.scalars = {scalar, 0}, .scalar_operand = !has_b};
    return ct__op_end(&s, &r, rc, &args);
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
        return ct__err_set(CT_EDTYPE, "%s: the condition must be bool, got %s", op,
                           ct__tensor_desc(desc, mask));
    return 0;
}

ct_tensor *ct_where(ct_tensor *cond, ct_tensor *a, ct_tensor *b) {
    ct__op_spec s = {.name = "where",
                     .op = CT_OP_WHERE,
                     .in = {cond, a, b},
                     .nin = 3,
                     .fixed = 1, /* the condition stays bool */
                     .entry = offsetof(ct__device_ops, where),
                     .entry_name = "where"};
    ct__op_run r;
    if (ct__op_begin(&s, &r) || check_mask("where", cond))
        return NULL;
    ct_dtype dt = ct_promote_types(a->dtype, b->dtype);
    if (ct__op_alloc(&s, &r, dt, dt))
        return NULL;
    int rc = r.dev->where(r.dst, r.x[0], r.x[1], r.x[2], NULL, r.nd, r.shape);
    return ct__op_end(&s, &r, rc, NULL);
}

static ct_tensor *masked_fill(ct_tensor *t, ct_tensor *mask, double value, bool inplace) {
    ct__op_spec s = {.name = inplace ? "masked_fill_" : "masked_fill",
                     .op = CT_OP_MASKED_FILL,
                     .in = {t, mask},
                     .nin = 2,
                     .fixed = 2, /* the mask stays bool */
                     .inplace = inplace,
                     .entry = offsetof(ct__device_ops, where),
                     .entry_name = "where"};
    ct__op_run r;
    if (ct__op_begin(&s, &r) || check_mask(s.name, mask))
        return NULL;
    if (r.nd != t->ndim || memcmp(r.shape, t->sizes, sizeof(int64_t) * (size_t)r.nd) != 0) {
        char dt[CT__DESC_STR], dm[CT__DESC_STR];
        ct__err_set(CT_ESHAPE, "%s: mask %s does not broadcast to %s", s.name,
                    ct__tensor_desc(dm, mask), ct__tensor_desc(dt, t));
        return NULL;
    }
    if (ct__op_alloc(&s, &r, t->dtype, t->dtype))
        return NULL;
    /* The kernel writes the masked elements only: a new result starts as
     * a copy of t. */
    uint64_t bits = 0;
    ct__tensor_store_double(t->dtype, &bits, value);
    int rc = inplace ? 0 : ct__tensor_copy_any(r.dst, t);
    if (rc == 0)
        rc = r.dev->where(r.dst, r.x[1], NULL, r.dst, &bits, r.nd, r.shape);
    ct_op_args args = {.scalars = {value, 0}};
    return ct__op_end(&s, &r, rc, &args);
}

ct_tensor *ct_masked_fill(ct_tensor *t, ct_tensor *mask, double value) {
    return masked_fill(t, mask, value, false);
}

ct_tensor *ct_masked_fill_(ct_tensor *t, ct_tensor *mask, double value) {
    return masked_fill(t, mask, value, true);
}
