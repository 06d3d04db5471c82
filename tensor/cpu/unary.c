/* Unary elementwise ops, on the CPU and on a CUDA device
 * (tensor/cuda/kernels.cu). */
#include "cuda_impl.h"
#include "cuda_kernels.h"
#include "tensor_impl.h"
#include "vmath.h"

#include <tgmath.h>

/* Scalar parameters (pow's exponent, clamp's bounds) in both the float and
 * the integer form, converted once by the caller. */
typedef struct unary_params {
    double d[2];
    int64_t i[2];
} unary_params;

#define PARAM(acc, k) _Generic((acc)0, int64_t : prm->i[k], default : (acc)prm->d[k])

/* Float ops; x is the compute type (float or double), tgmath picks the
 * single- or double-precision function. float's exp, tanh and erf are ct's own so that
 * the loops that use it vectorize. */
#define VEXP(x)         CT__VEXP(x)
#define VTANH(x)        CT__VTANH(x)
#define VERF(x)         CT__VERF(x)
#define F_NEG(x)        (-(x))
#define F_ABS(x)        fabs(x)
#define F_EXP(x)        VEXP(x)
#define F_LOG(x)        log(x)
#define F_LOG1P(x)      log1p(x)
#define F_SQRT(x)       sqrt(x)
#define F_RSQRT(x)      (1 / sqrt(x))
#define F_SIN(x)        sin(x)
#define F_COS(x)        cos(x)
#define F_TANH(x)       VTANH(x)
#define F_SIGMOID(x)    (1 / (1 + VEXP(-(x))))
#define F_RELU(x)       ((x) > 0 || (x) != (x) ? (x) : 0)
#define F_GELU(x)       ((x) * (acc)0.5 * (1 + VERF((x) * (acc)0.70710678118654752440)))
#define F_GELU_TANH(x)  CT__GELU_TANH(x)
#define F_SILU(x)       ((x) / (1 + VEXP(-(x))))
#define F_POW_SCALAR(x) ((p0) == 2 ? (x) * (x) : pow((x), (p0)))
/* min(max(x, lo), hi) as PyTorch defines it: hi wins when lo > hi, NaN
 * passes through. */
#define CLAMP(x)   (((x) < (p0) ? (p0) : (x)) > (p1) ? (p1) : ((x) < (p0) ? (p0) : (x)))
#define F_CLAMP(x) CLAMP(x)

/* Integer ops wrap like two's complement instead of overflowing. */
#define I_NEG(x)        ((int64_t)(0 - (uint64_t)(x)))
#define I_ABS(x)        ((x) < 0 ? I_NEG(x) : (x))
#define I_RELU(x)       ((x) > 0 ? (x) : 0)
#define I_POW_SCALAR(x) int_pow((x), (p0))
#define I_CLAMP(x)      CLAMP(x)

static inline int64_t int_pow(int64_t x, int64_t e) {
    uint64_t r = 1, b = (uint64_t)x;
    for (; e > 0; e >>= 1, b *= b)
        if (e & 1)
            r *= b;
    return (int64_t)r;
}

#define UNARY_KERNEL(OP, DT)                                                                       \
    static void OP##_##DT(void *ctx, char **data, const int64_t *s, int64_t n) {                   \
        typedef CT__ACC_##DT acc;                                                                  \
        typedef CT__T_##DT elem;                                                                   \
        const unary_params *prm = ctx;                                                             \
        acc p0 = PARAM(acc, 0), p1 = PARAM(acc, 1);                                                \
        (void)p0;                                                                                  \
        (void)p1;                                                                                  \
        if (s[0] == sizeof(elem) && s[1] == sizeof(elem)) {                                        \
            elem *o = (elem *)data[0];                                                             \
            const elem *a = (const elem *)data[1];                                                 \
            for (int64_t i = 0; i < n; i++) {                                                      \
                acc x = CT__IN_##DT(a[i]);                                                         \
                o[i] = CT__OUT_##DT(OP(x));                                                        \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                acc x = CT__IN_##DT(*(const elem *)(data[1] + i * s[1]));                          \
                *(elem *)(data[0] + i * s[0]) = CT__OUT_##DT(OP(x));                               \
            }                                                                                      \
        }                                                                                          \
    }

/* name, float expression, integer expression (0: float-valued only). */
#define UNARY_OPS(X)                                                                               \
    X(neg, NEG, F_NEG, I_NEG)                                                                      \
    X(abs, ABS, F_ABS, I_ABS)                                                                      \
    X(exp, EXP, F_EXP, 0)                                                                          \
    X(log, LOG, F_LOG, 0)                                                                          \
    X(log1p, LOG1P, F_LOG1P, 0)                                                                    \
    X(sqrt, SQRT, F_SQRT, 0)                                                                       \
    X(rsqrt, RSQRT, F_RSQRT, 0)                                                                    \
    X(sin, SIN, F_SIN, 0)                                                                          \
    X(cos, COS, F_COS, 0)                                                                          \
    X(tanh, TANH, F_TANH, 0)                                                                       \
    X(sigmoid, SIGMOID, F_SIGMOID, 0)                                                              \
    X(relu, RELU, F_RELU, I_RELU)                                                                  \
    X(gelu, GELU, F_GELU, 0)                                                                       \
    X(gelu_tanh, GELU_TANH, F_GELU_TANH, 0)                                                        \
    X(silu, SILU, F_SILU, 0)                                                                       \
    X(pow_scalar, POW_SCALAR, F_POW_SCALAR, I_POW_SCALAR)                                          \
    X(clamp, CLAMP, F_CLAMP, I_CLAMP)

#define STAMP_FLOAT_OP(name, NAME, FEXPR, IEXPR)                                                   \
    UNARY_KERNEL(FEXPR, FLOAT32)                                                                   \
    UNARY_KERNEL(FEXPR, FLOAT64)                                                                   \
    UNARY_KERNEL(FEXPR, BFLOAT16)                                                                  \
    UNARY_KERNEL(FEXPR, FLOAT16)
UNARY_OPS(STAMP_FLOAT_OP)

#define STAMP_INT(OP)                                                                              \
    UNARY_KERNEL(OP, INT64)                                                                        \
    UNARY_KERNEL(OP, INT32)                                                                        \
    UNARY_KERNEL(OP, UINT8)
STAMP_INT(I_NEG)
STAMP_INT(I_ABS)
STAMP_INT(I_RELU)
STAMP_INT(I_POW_SCALAR)
STAMP_INT(I_CLAMP)

typedef struct unary_op {
    const char *names[2]; /* [in place] */
    ct_op op;
    ct__loop_fn floats[4]; /* FLOAT32, FLOAT64, BFLOAT16, FLOAT16 */
    ct__loop_fn ints[3];   /* INT64, INT32, UINT8; NULL: float-valued */
} unary_op;

#define INT_ROW_0                                                                                  \
    { NULL, NULL, NULL }
#define INT_ROW(IEXPR)                                                                             \
    { IEXPR##_INT64, IEXPR##_INT32, IEXPR##_UINT8 }
#define INT_ROW_SELECT(IEXPR)       INT_ROW_SELECT_##IEXPR
#define INT_ROW_SELECT_0            INT_ROW_0
#define INT_ROW_SELECT_I_NEG        INT_ROW(I_NEG)
#define INT_ROW_SELECT_I_ABS        INT_ROW(I_ABS)
#define INT_ROW_SELECT_I_RELU       INT_ROW(I_RELU)
#define INT_ROW_SELECT_I_POW_SCALAR INT_ROW(I_POW_SCALAR)
#define INT_ROW_SELECT_I_CLAMP      INT_ROW(I_CLAMP)

enum {
#define UNARY_ENUM(name, NAME, FEXPR, IEXPR) U_##name,
    UNARY_OPS(UNARY_ENUM)
#undef UNARY_ENUM
};
_Static_assert((int)U_neg == (int)CT__CUDA_NEG && (int)U_silu == (int)CT__CUDA_SILU &&
                   (int)U_clamp == (int)CT__CUDA_CLAMP,
               "unary ops and their CUDA kernels disagree on the order");

static const unary_op unary_ops[] = {
#define UNARY_ROW(name, NAME, FEXPR, IEXPR)                                                        \
    {{#name, #name "_"},                                                                           \
     CT_OP_##NAME,                                                                                 \
     {FEXPR##_FLOAT32, FEXPR##_FLOAT64, FEXPR##_BFLOAT16, FEXPR##_FLOAT16},                        \
     INT_ROW_SELECT(IEXPR)},
    UNARY_OPS(UNARY_ROW)
#undef UNARY_ROW
};

static ct_tensor *unary(int which, ct_tensor *t, bool inplace, double p0, double p1) {
    const unary_op *u = &unary_ops[which];
    const char *name = u->names[inplace];
    if (CT__CHECK_ANY(name, t))
        return NULL;
    ct_device device = t->storage->device;
    char desc[CT__DESC_STR];
    bool is_float = ct_dtype_is_float(t->dtype);
    /* Integer powers stay integral only for whole, non-negative exponents. */
    bool int_ok = u->ints[0] != NULL && t->dtype != CT_BOOL &&
                  !(which == U_pow_scalar && (p0 < 0 || p0 != floor(p0)));
    ct_dtype out_dtype = is_float || int_ok ? t->dtype : CT_FLOAT32;
    if (t->dtype == CT_BOOL && u->ints[0] != NULL && which != U_pow_scalar) {
        ct__seterr(CT_EDTYPE, "%s: not supported for bool tensors (%s)", name, ct__desc(desc, t));
        return NULL;
    }
    if (inplace && out_dtype != t->dtype) {
        ct__seterr(CT_EDTYPE, "%s: result type %s cannot be stored in the input %s in place", name,
                   ct_dtype_name(out_dtype), ct__desc(desc, t));
        return NULL;
    }
    unary_params prm = {{p0, p1}, {0, 0}};
    for (int k = 0; k < 2; k++)
        prm.i[k] = isnan(prm.d[k])       ? 0
                   : prm.d[k] <= -9.2e18 ? INT64_MIN
                   : prm.d[k] >= 9.2e18
                       ? INT64_MAX
                       : (int64_t)(which == U_clamp && k == 0 ? ceil(prm.d[k]) : floor(prm.d[k]));

    ct_tensor *out = inplace ? t : ct__new_on(name, t->ndim, t->sizes, out_dtype, device);
    if (!out || (inplace && ct__check_inplace(u->op, name, out, NULL, 0)))
        return NULL;
    /* An integer input of a float-valued op (never in place: refused above)
     * is converted in a private scope that releases the copy. */
    bool convert = out_dtype != t->dtype;
    if (convert)
        ct_scope_begin();
    ct_tensor *src = convert ? ct_to_dtype(t, out_dtype) : t;
    bool ok = src != NULL;
    if (ok && device.type == CT_CUDA) {
        ok = ct__cuda_unary(which, out, src, prm.d, prm.i) == 0;
    } else if (ok) {
        ct__loop_fn fn =
            ct_dtype_is_float(out_dtype) ? u->floats[out_dtype] : u->ints[out_dtype - CT_INT64];
        ct__iter it;
        ct__iter_init(&it, (ct_tensor *[]){out, src}, 2, out->ndim, out->sizes);
        ct__iter_run(&it, fn, &prm, CT__GRAIN_ELEMENTWISE);
    }
    if (convert)
        ct_scope_end();
    if (!ok) {
        if (!inplace)
            ct__release(out);
        return NULL;
    }

    ct_op_args args = {.scalars = {p0, p1}};
    return ct__record(u->op, (ct_tensor *[]){t}, 1, (ct_tensor *[]){out}, 1, inplace, &args);
}

#define DEFINE_SIMPLE(name)                                                                        \
    ct_tensor *ct_##name(ct_tensor *t) { return unary(U_##name, t, false, 0, 0); }                 \
    ct_tensor *ct_##name##_(ct_tensor *t) { return unary(U_##name, t, true, 0, 0); }

CT_UNARY_OP_MAP(DEFINE_SIMPLE)

ct_tensor *ct_pow_scalar(ct_tensor *t, double e) { return unary(U_pow_scalar, t, false, e, 0); }
ct_tensor *ct_pow_scalar_(ct_tensor *t, double e) { return unary(U_pow_scalar, t, true, e, 0); }
ct_tensor *ct_clamp(ct_tensor *t, double lo, double hi) { return unary(U_clamp, t, false, lo, hi); }
ct_tensor *ct_clamp_(ct_tensor *t, double lo, double hi) { return unary(U_clamp, t, true, lo, hi); }
