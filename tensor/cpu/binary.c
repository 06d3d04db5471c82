/* The CPU kernels of the binary elementwise ops, comparisons, where and
 * masked_fill (their front ends: tensor/ops/binary.c), and the fused
 * activation gradients. */
#include "cpu_impl.h"
#include "ops_impl.h"
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

/* One loop per op and dtype the registry (ops_impl.h) gives it. */
#define STAMP_ARITH(name, NAME, FEXPR, IEXPR, INTS)                                                \
    FOR_FLOATS(ARITH_FLOAT, name, FEXPR) STAMP_INTS_##INTS(name, IEXPR)
#define STAMP_INTS_NONE(name, IEXPR)
#define STAMP_INTS_INTS(name, IEXPR) FOR_INTS(ARITH_INT, name, IEXPR)
#define STAMP_INTS_ALL(name, IEXPR)  FOR_INTS(ARITH_INT, name, IEXPR) ARITH_INT(name, IEXPR, BOOL)
CT__ARITH_OPS(STAMP_ARITH)
#define STAMP_COMPARE(name, NAME, FEXPR, IEXPR, INTS) FOR_ALL(COMPARE, name, FEXPR)
CT__COMPARE_OPS(STAMP_COMPARE)

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

#define ROW_FLOATS(name)                                                                           \
    [CT_FLOAT32] = name##_FLOAT32, [CT_FLOAT64] = name##_FLOAT64, [CT_BFLOAT16] = name##_BFLOAT16, \
    [CT_FLOAT16] = name##_FLOAT16
#define ROW_INTS(name)                                                                             \
    [CT_INT64] = name##_INT64, [CT_INT32] = name##_INT32, [CT_UINT8] = name##_UINT8

/* The loops by op index and compute dtype; NULL where the registry gives
 * the op no such dtype (the front end refused it). */
static const ct__loop_fn binary_kernels[CT__NUM_BINARY][CT_NDTYPES] = {
#define KERNEL_ROW(name, NAME, FEXPR, IEXPR, INTS) [CT__BINARY_##NAME] = {KERNELS_##INTS(name)},
#define KERNELS_NONE(name)                         ROW_FLOATS(name)
#define KERNELS_INTS(name)                         ROW_FLOATS(name), ROW_INTS(name)
#define KERNELS_ALL(name)                          ROW_FLOATS(name), ROW_INTS(name), [CT_BOOL] = name##_BOOL
    CT__BINARY_OPS(KERNEL_ROW)
#undef KERNEL_ROW
};

int ct__cpu_binary(int op, ct_tensor *dst, ct_tensor *x, ct_tensor *y, double scalar,
                   ct_dtype dtype, int nd, const int64_t *shape) {
    ct__loop_fn fn = op >= 0 && op < CT__NUM_BINARY ? binary_kernels[op][dtype] : NULL;
    if (!fn)
        return ct__err_set(CT_EINVAL, "binary: no CPU loop for op %d on %s", op,
                           ct_dtype_name(dtype));
    /* A scalar operand is a 0-d tensor of the compute dtype, broadcast. */
    ct__scalar_operand operand;
    if (!y)
        y = ct__cpu_scalar_operand_init(&operand, scalar, dtype);
    ct__iter it;
    ct__iter_init(&it, (ct_tensor *[]){dst, x, y}, 3, nd, shape);
    ct__iter_run(&it, fn, NULL, CT__GRAIN_ELEMENTWISE);
    return 0;
}

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

int ct__cpu_where(ct_tensor *out, ct_tensor *cond, ct_tensor *a, ct_tensor *b,
                  const uint64_t *a_bits, int nd, const int64_t *shape) {
    int k = size_index(ct_dtype_size(out->dtype));
    ct__iter it;
    if (a) {
        ct__iter_init(&it, (ct_tensor *[]){out, cond, a, b}, 4, nd, shape);
        ct__iter_run(&it, where_kernels[k], NULL, CT__GRAIN_ELEMENTWISE);
    } else {
        /* masked_fill: b is out itself, so only the masked elements move. */
        ct__iter_init(&it, (ct_tensor *[]){out, cond}, 2, nd, shape);
        ct__iter_run(&it, fill_kernels[k], (void *)a_bits, CT__GRAIN_ELEMENTWISE);
    }
    return 0;
}

ct_tensor *ct__cpu_activation_grad(ct_op op, ct_tensor *x, ct_tensor *g) {
    static const struct {
        ct_op op;
        ct__loop_fn kernels[CT_NDTYPES];
    } table[] = {{CT_OP_GELU_TANH, {ROW_FLOATS(gelu_tanh_grad)}},
                 {CT_OP_GELU, {ROW_FLOATS(gelu_grad)}},
                 {CT_OP_SILU, {ROW_FLOATS(silu_grad)}}};
    const char *name = "activation_grad";
    /* On the meta device the result is made, as its memory is planned,
     * and there is nothing to compute. */
    bool meta = x && ct_tensor_device(x).type == CT_META;
    if (meta ? CT__CHECK_ANY(name, x, g) ||
                   ct__tensor_check_same_device(name, (ct_tensor *[]){x, g}, 2)
             : CT__CHECK(name, x, g))
        return NULL;
    size_t k = 0;
    while (k < sizeof table / sizeof *table && table[k].op != op)
        k++;
    ct_dtype compute = ct_promote_types(x->dtype, g->dtype);
    if (k == sizeof table / sizeof *table || !ct_dtype_is_float(compute)) {
        ct__err_set(CT_ENOTSUP, "%s: no fused gradient of %s for %s", name, ct_op_name(op),
                    ct_dtype_name(compute));
        return NULL;
    }
    int nd;
    int64_t shape[CT_MAX_DIMS];
    if (ct__tensor_broadcast_shapes(name, x->ndim, x->sizes, g->ndim, g->sizes, &nd, shape))
        return NULL;
    ct_tensor *out =
        ct__tensor_new_on(name, nd, shape, compute, meta ? CT_DEVICE_META : CT_DEVICE_CPU);
    if (!out || meta)
        return out;
    ct_scope_begin();
    ct_tensor *xc = x->dtype == compute ? x : ct_to_dtype(x, compute);
    ct_tensor *gc = g->dtype == compute ? g : ct_to_dtype(g, compute);
    if (xc && gc) {
        ct__iter it;
        ct__iter_init(&it, (ct_tensor *[]){out, xc, gc}, 3, nd, shape);
        ct__iter_run(&it, table[k].kernels[compute], NULL, CT__GRAIN_ELEMENTWISE);
    }
    ct_scope_end();
    if (!xc || !gc) {
        ct__tensor_release(out);
        return NULL;
    }
    return out;
}
