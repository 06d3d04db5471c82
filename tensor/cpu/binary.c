/* Binary elementwise ops, comparisons, where and masked_fill. They run on
 * a CUDA device too (tensor/cuda/kernels.cu; where and masked_fill:
 * tensor/cuda/index.cu). */
#include "cuda_impl.h"
#include "cuda_kernels.h"
#include "tensor_impl.h"
#include "vmath.h"

#include <tgmath.h>

/* Expressions over the compute type. Integer arithmetic wraps like two's
 * complement instead of overflowing; float max/min propagate NaN. */
#define F_ADD(x, y)     ((x) + (y))
#define F_SUB(x, y)     ((x) - (y))
#define F_MUL(x, y)     ((x) * (y))
#define F_DIV(x, y)     ((x) / (y))
#define F_POW(x, y)     pow((x), (y))
#define F_MAXIMUM(x, y) ((x) > (y) || (x) != (x) ? (x) : (y))
#define F_MINIMUM(x, y) ((x) < (y) || (x) != (x) ? (x) : (y))
#define I_ADD(x, y)     ((int64_t)((uint64_t)(x) + (uint64_t)(y)))
#define I_SUB(x, y)     ((int64_t)((uint64_t)(x) - (uint64_t)(y)))
#define I_MUL(x, y)     ((int64_t)((uint64_t)(x) * (uint64_t)(y)))
#define I_POW(x, y)     int_pow((x), (y))
#define I_MAXIMUM(x, y) ((x) > (y) ? (x) : (y))
#define I_MINIMUM(x, y) ((x) < (y) ? (x) : (y))
#define C_EQ(x, y)      ((x) == (y))
#define C_NE(x, y)      ((x) != (y))
#define C_LT(x, y)      ((x) < (y))
#define C_LE(x, y)      ((x) <= (y))
#define C_GT(x, y)      ((x) > (y))
#define C_GE(x, y)      ((x) >= (y))

/* Integer powers; a negative exponent truncates 1/x^|y| toward zero. */
static inline int64_t int_pow(int64_t x, int64_t e) {
    if (e < 0)
        return x == 1 ? 1 : x == -1 ? (e & 1 ? -1 : 1) : 0;
    uint64_t r = 1, b = (uint64_t)x;
    for (; e > 0; e >>= 1, b *= b)
        if (e & 1)
            r *= b;
    return (int64_t)r;
}

#define AS_BOOL(v) ((uint8_t)((v) != 0))

/* One loop per (op, dtype) with the common layouts specialised so that the
 * compiler vectorizes them: all contiguous, and either side a broadcast
 * scalar. OUTT/OUTC_ are the output element type and conversion (the
 * dtype's own for arithmetic, bool for comparisons); BINARY_LOOP_ is the
 * loop body each layout shares. */
#define BINARY_KERNEL(NAME, EXPR_, DT, OUTT, OUTC_)                                                \
    static void NAME##_##DT(void *ctx, char **data, const int64_t *s, int64_t n) {                 \
        (void)ctx;                                                                                 \
        typedef CT__ACC_##DT acc;                                                                  \
        typedef CT__T_##DT elem;                                                                   \
        typedef OUTT outt;                                                                         \
        char *o = data[0];                                                                         \
        const char *a = data[1], *b = data[2];                                                     \
        const int64_t es = (int64_t)sizeof(elem);                                                  \
        outt *po = (outt *)o;                                                                      \
        if (s[0] == (int64_t)sizeof(outt) && s[1] == es && s[2] == es) {                           \
            const elem *pa = (const elem *)a, *pb = (const elem *)b;                               \
            BINARY_LOOP_(DT, EXPR_, OUTC_, po[i], pa[i], pb[i])                                    \
        } else if (s[0] == (int64_t)sizeof(outt) && s[1] == es && s[2] == 0) {                     \
            const elem *pa = (const elem *)a, vb = *(const elem *)b;                               \
            BINARY_LOOP_(DT, EXPR_, OUTC_, po[i], pa[i], vb)                                       \
        } else if (s[0] == (int64_t)sizeof(outt) && s[1] == 0 && s[2] == es) {                     \
            const elem va = *(const elem *)a, *pb = (const elem *)b;                               \
            BINARY_LOOP_(DT, EXPR_, OUTC_, po[i], va, pb[i])                                       \
        } else {                                                                                   \
            BINARY_LOOP_(DT, EXPR_, OUTC_, *(outt *)(o + i * s[0]), *(const elem *)(a + i * s[1]), \
                         *(const elem *)(b + i * s[2]))                                            \
        }                                                                                          \
    }
/* The contiguous layouts index the output as an array (OUT is po[i]), which
 * is what lets the compiler vectorize them. */
#define BINARY_LOOP_(DT, EXPR, OUTC, OUT, A, B)                                                    \
    for (int64_t i = 0; i < n; i++) {                                                              \
        acc x = CT__IN_##DT(A), y = CT__IN_##DT(B);                                                \
        OUT = OUTC(EXPR(x, y));                                                                    \
    }

#define ARITH_FLOAT(NAME, FEXPR, DT) BINARY_KERNEL(NAME, FEXPR, DT, CT__T_##DT, CT__OUT_##DT)
#define ARITH_INT(NAME, IEXPR, DT)   BINARY_KERNEL(NAME, IEXPR, DT, CT__T_##DT, CT__OUT_##DT)
#define COMPARE(NAME, CEXPR, DT)     BINARY_KERNEL(NAME, CEXPR, DT, uint8_t, AS_BOOL)

#define FOR_FLOATS(M, NAME, EXPR)                                                                  \
    M(NAME, EXPR, FLOAT32) M(NAME, EXPR, FLOAT64) M(NAME, EXPR, BFLOAT16) M(NAME, EXPR, FLOAT16)
#define FOR_INTS(M, NAME, EXPR) M(NAME, EXPR, INT64) M(NAME, EXPR, INT32) M(NAME, EXPR, UINT8)
#define FOR_ALL(M, NAME, EXPR)  FOR_FLOATS(M, NAME, EXPR) FOR_INTS(M, NAME, EXPR) M(NAME, EXPR, BOOL)

/* name, OP, float expr, integer expr (NONE: promoted to float). */
#define ARITH_OPS(X)                                                                               \
    X(add, ADD, F_ADD, I_ADD)                                                                      \
    X(sub, SUB, F_SUB, I_SUB)                                                                      \
    X(mul, MUL, F_MUL, I_MUL)                                                                      \
    X(div, DIV, F_DIV, NONE)                                                                       \
    X(pow, POW, F_POW, I_POW)                                                                      \
    X(maximum, MAXIMUM, F_MAXIMUM, I_MAXIMUM)                                                      \
    X(minimum, MINIMUM, F_MINIMUM, I_MINIMUM)
#define COMPARE_OPS(X)                                                                             \
    X(eq, EQ, C_EQ, C_EQ)                                                                          \
    X(ne, NE, C_NE, C_NE)                                                                          \
    X(lt, LT, C_LT, C_LT)                                                                          \
    X(le, LE, C_LE, C_LE)                                                                          \
    X(gt, GT, C_GT, C_GT)                                                                          \
    X(ge, GE, C_GE, C_GE)

#define STAMP_ARITH(name, NAME, FEXPR, IEXPR)                                                      \
    FOR_FLOATS(ARITH_FLOAT, name, FEXPR) STAMP_ARITH_INT_##IEXPR(name, IEXPR)
#define STAMP_ARITH_INT_NONE(name, IEXPR)
#define STAMP_ARITH_INT_I_ADD(name, IEXPR)                                                         \
    FOR_INTS(ARITH_INT, name, IEXPR) ARITH_INT(name, IEXPR, BOOL)
#define STAMP_ARITH_INT_I_SUB(name, IEXPR) FOR_INTS(ARITH_INT, name, IEXPR)
#define STAMP_ARITH_INT_I_MUL              STAMP_ARITH_INT_I_ADD
#define STAMP_ARITH_INT_I_POW              STAMP_ARITH_INT_I_SUB
#define STAMP_ARITH_INT_I_MAXIMUM          STAMP_ARITH_INT_I_ADD
#define STAMP_ARITH_INT_I_MINIMUM          STAMP_ARITH_INT_I_ADD
ARITH_OPS(STAMP_ARITH)
#define STAMP_COMPARE(name, NAME, FEXPR, IEXPR) FOR_ALL(COMPARE, name, FEXPR)
COMPARE_OPS(STAMP_COMPARE)

/* Activation gradients g f'(x), each one pass instead of the dozen ops its
 * formula takes as a chain. */
#define DEFINE_ACTIVATION_GRADS(S, T)                                                              \
    static inline T gelu_grad_##S(T x, T g) {                                                      \
        T cdf = (T)0.5 * (1 + CT__VERF(x * (T)0.70710678118654752440));                            \
        T pdf = CT__VEXP((T)-0.5 * x * x) * (T)0.39894228040143267794; /* 1 / sqrt(2 pi) */        \
        return g * (cdf + x * pdf);                                                                \
    }                                                                                              \
    static inline T silu_grad_##S(T x, T g) {                                                      \
        T s = 1 / (1 + CT__VEXP(-x));                                                              \
        return g * s * (1 + x * (1 - s));                                                          \
    }
DEFINE_ACTIVATION_GRADS(f, float)
DEFINE_ACTIVATION_GRADS(d, double)
#define A_GELU_TANH(x, g) CT__GELU_TANH_GRAD(x, g)
#define A_GELU(x, g)      _Generic((x), float : gelu_grad_f, default : gelu_grad_d)(x, g)
#define A_SILU(x, g)      _Generic((x), float : silu_grad_f, default : silu_grad_d)(x, g)
FOR_FLOATS(ARITH_FLOAT, gelu_tanh_grad, A_GELU_TANH)
FOR_FLOATS(ARITH_FLOAT, gelu_grad, A_GELU)
FOR_FLOATS(ARITH_FLOAT, silu_grad, A_SILU)

typedef struct binary_op {
    const char *names[2][2]; /* [scalar form][in place]: add, add_, add_scalar, add_scalar_ */
    ct_op op;
    bool compare;
    ct__loop_fn kernels[CT_NDTYPES]; /* by compute dtype; NULL: unsupported */
} binary_op;

#define ROW_FLOATS(name)                                                                           \
    [CT_FLOAT32] = name##_FLOAT32, [CT_FLOAT64] = name##_FLOAT64, [CT_BFLOAT16] = name##_BFLOAT16, \
    [CT_FLOAT16] = name##_FLOAT16
#define ROW_INTS(name)                                                                             \
    [CT_INT64] = name##_INT64, [CT_INT32] = name##_INT32, [CT_UINT8] = name##_UINT8
#define ROW_ARITH_NONE(name)  ROW_FLOATS(name)
#define ROW_ARITH_I_ADD(name) ROW_FLOATS(name), ROW_INTS(name), [CT_BOOL] = name##_BOOL
#define ROW_ARITH_I_SUB(name) ROW_FLOATS(name), ROW_INTS(name)
#define ROW_ARITH_I_MUL       ROW_ARITH_I_ADD
#define ROW_ARITH_I_POW       ROW_ARITH_I_SUB
#define ROW_ARITH_I_MAXIMUM   ROW_ARITH_I_ADD
#define ROW_ARITH_I_MINIMUM   ROW_ARITH_I_ADD

enum {
#define BINARY_ENUM(name, NAME, FEXPR, IEXPR) B_##name,
    ARITH_OPS(BINARY_ENUM) COMPARE_OPS(BINARY_ENUM)
#undef BINARY_ENUM
};
/* The device kernels take the op by this index. */
_Static_assert((int)B_add == (int)CT__CUDA_ADD && (int)B_pow == (int)CT__CUDA_POW &&
                   (int)B_eq == (int)CT__CUDA_EQ && (int)B_ge == (int)CT__CUDA_GE,
               "binary ops and their CUDA kernels disagree on the order");

#define NAMES(name)                                                                                \
    {                                                                                              \
        {#name, #name "_"}, { #name "_scalar", #name "_scalar_" }                                  \
    }
static const binary_op binary_ops[] = {
#define ARITH_ROW(name, NAME, FEXPR, IEXPR)                                                        \
    {NAMES(name), CT_OP_##NAME, false, {ROW_ARITH_##IEXPR(name)}},
#define COMPARE_ROW(name, NAME, FEXPR, IEXPR)                                                      \
    {NAMES(name), CT_OP_##NAME, true, {ROW_FLOATS(name), ROW_INTS(name), [CT_BOOL] = name##_BOOL}},
    ARITH_OPS(ARITH_ROW) COMPARE_OPS(COMPARE_ROW)
#undef ARITH_ROW
#undef COMPARE_ROW
};

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
    bool cuda = device.type == CT_CUDA;
    ct_dtype compute =
        has_b ? ct_promote_types(a->dtype, b->dtype) : scalar_dtype(a->dtype, scalar);
    if (which == B_div && !ct_dtype_is_float(compute))
        compute = CT_FLOAT32;
    if (!bo->kernels[compute]) {
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
    ct__scalar_operand operand;
    ct_tensor *x = as_dtype(a, compute);
    /* The device kernel takes a scalar operand by value. */
    ct_tensor *y = has_b  ? as_dtype(b, compute)
                   : cuda ? NULL
                          : ct__scalar_operand_init(&operand, scalar, compute);
    ct_tensor *dst = inplace && !direct ? ct__new_on(name, nd, shape, result, device) : out;
    bool ok = x && (y || (cuda && !has_b)) && dst;
    if (ok && cuda) {
        ok = ct__cuda_binary(which, dst, x, y, scalar, compute, nd, shape) == 0;
    } else if (ok) {
        ct__iter it;
        ct__iter_init(&it, (ct_tensor *[]){dst, x, y}, 3, nd, shape);
        ct__iter_run(&it, bo->kernels[compute], NULL, CT__GRAIN_ELEMENTWISE);
    }
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
        return binary(B_##name, a, b, 0, false);                                                   \
    }                                                                                              \
    ct_tensor *ct_##name##_(ct_tensor *a, ct_tensor *b) {                                          \
        if (!b && CT__CHECK(#name "_", a, b))                                                      \
            return NULL;                                                                           \
        return binary(B_##name, a, b, 0, true);                                                    \
    }
#define DEFINE_BINARY_SCALAR(name)                                                                 \
    ct_tensor *ct_##name##_scalar(ct_tensor *a, double b) {                                        \
        return binary(B_##name, a, NULL, b, false);                                                \
    }                                                                                              \
    ct_tensor *ct_##name##_scalar_(ct_tensor *a, double b) {                                       \
        return binary(B_##name, a, NULL, b, true);                                                 \
    }
CT_BINARY_OP_MAP(DEFINE_BINARY)
CT_BINARY_OP_MAP(DEFINE_BINARY_SCALAR)
/* pow's scalar form is the unary ct_pow_scalar (unary.c). */
DEFINE_BINARY(pow)

/* ------------------------------------------------------ where, masked_fill */

/* Selection only moves bytes, so one loop per element size serves every
 * dtype. */
/* The contiguous case (and its scalar-b form, as in relu's backward) gets
 * loops the compiler turns into vector blends. */
#define SELECT_KERNELS(BITS)                                                                       \
    static void where_##BITS(void *ctx, char **d, const int64_t *s, int64_t n) {                   \
        (void)ctx;                                                                                 \
        const int64_t e = BITS / 8;                                                                \
        if (s[0] == e && s[1] == 1 && s[2] == e && (s[3] == e || s[3] == 0)) {                     \
            uint##BITS##_t *restrict o = (uint##BITS##_t *)d[0];                                   \
            const uint8_t *restrict c = (const uint8_t *)d[1];                                     \
            const uint##BITS##_t *restrict x = (const uint##BITS##_t *)d[2];                       \
            const uint##BITS##_t *restrict y = (const uint##BITS##_t *)d[3];                       \
            if (s[3] == 0) {                                                                       \
                uint##BITS##_t yv = *y;                                                            \
                for (int64_t i = 0; i < n; i++)                                                    \
                    o[i] = c[i] ? x[i] : yv;                                                       \
            } else {                                                                               \
                for (int64_t i = 0; i < n; i++)                                                    \
                    o[i] = c[i] ? x[i] : y[i];                                                     \
            }                                                                                      \
            return;                                                                                \
        }                                                                                          \
        for (int64_t i = 0; i < n; i++)                                                            \
            *(uint##BITS##_t *)(d[0] + i * s[0]) =                                                 \
                *(const uint8_t *)(d[1] + i * s[1]) ? *(const uint##BITS##_t *)(d[2] + i * s[2])   \
                                                    : *(const uint##BITS##_t *)(d[3] + i * s[3]);  \
    }                                                                                              \
    static void fill_##BITS(void *ctx, char **d, const int64_t *s, int64_t n) {                    \
        uint##BITS##_t v = *(const uint##BITS##_t *)ctx;                                           \
        for (int64_t i = 0; i < n; i++)                                                            \
            if (*(const uint8_t *)(d[1] + i * s[1]))                                               \
                *(uint##BITS##_t *)(d[0] + i * s[0]) = v;                                          \
    }
SELECT_KERNELS(8)
SELECT_KERNELS(16)
SELECT_KERNELS(32)
SELECT_KERNELS(64)

static int size_index(size_t size) { return size == 1 ? 0 : size == 2 ? 1 : size == 4 ? 2 : 3; }
static const ct__loop_fn where_kernels[] = {where_8, where_16, where_32, where_64};
static const ct__loop_fn fill_kernels[] = {fill_8, fill_16, fill_32, fill_64};

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
    ct_tensor *out = ct__new_on("where", nd, shape, dt, cond->storage->device);
    bool ok = x && y && out;
    if (ok && cond->storage->device.type == CT_CUDA) {
        ok = ct__cuda_where(out, cond, x, y, NULL, nd, shape) == 0;
    } else if (ok) {
        ct__iter it;
        ct__iter_init(&it, (ct_tensor *[]){out, cond, x, y}, 4, nd, shape);
        ct__iter_run(&it, where_kernels[size_index(ct_dtype_size(dt))], NULL,
                     CT__GRAIN_ELEMENTWISE);
    }
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
    ct_tensor *out = inplace ? t : ct_clone(t);
    if (!out ||
        (inplace && ct__check_inplace(CT_OP_MASKED_FILL, name, t, (ct_tensor *[]){mask}, 1)))
        return NULL;
    uint64_t bits = 0;
    ct__store_double(t->dtype, &bits, value);
    if (t->storage->device.type == CT_CUDA) {
        if (ct__cuda_where(out, mask, NULL, out, &bits, nd, shape)) {
            if (!inplace)
                ct__release(out);
            return NULL;
        }
    } else {
        ct__iter it;
        ct__iter_init(&it, (ct_tensor *[]){out, mask}, 2, nd, shape);
        ct__iter_run(&it, fill_kernels[size_index(ct_dtype_size(t->dtype))], &bits,
                     CT__GRAIN_ELEMENTWISE);
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

ct_tensor *ct__activation_grad(ct_op op, ct_tensor *x, ct_tensor *g) {
    static const struct {
        ct_op op;
        ct__loop_fn kernels[CT_NDTYPES];
    } table[] = {{CT_OP_GELU_TANH, {ROW_FLOATS(gelu_tanh_grad)}},
                 {CT_OP_GELU, {ROW_FLOATS(gelu_grad)}},
                 {CT_OP_SILU, {ROW_FLOATS(silu_grad)}}};
    const char *name = "activation_grad";
    if (CT__CHECK(name, x, g))
        return NULL;
    size_t k = 0;
    while (k < sizeof table / sizeof *table && table[k].op != op)
        k++;
    ct_dtype compute = ct_promote_types(x->dtype, g->dtype);
    if (k == sizeof table / sizeof *table || !ct_dtype_is_float(compute)) {
        ct__seterr(CT_ENOTSUP, "%s: no fused gradient of %s for %s", name, ct_op_name(op),
                   ct_dtype_name(compute));
        return NULL;
    }
    int nd;
    int64_t shape[CT_MAX_DIMS];
    if (ct__broadcast_shapes(name, x->ndim, x->sizes, g->ndim, g->sizes, &nd, shape))
        return NULL;
    ct_tensor *out = ct__new_on(name, nd, shape, compute, CT_DEVICE_CPU);
    if (!out)
        return NULL;
    ct_scope_begin();
    ct_tensor *xc = as_dtype(x, compute), *gc = as_dtype(g, compute);
    if (xc && gc) {
        ct__iter it;
        ct__iter_init(&it, (ct_tensor *[]){out, xc, gc}, 3, nd, shape);
        ct__iter_run(&it, table[k].kernels[compute], NULL, CT__GRAIN_ELEMENTWISE);
    }
    ct_scope_end();
    if (!xc || !gc) {
        ct__release(out);
        return NULL;
    }
    return out;
}
