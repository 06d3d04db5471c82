/* The CPU kernels of the unary elementwise ops (their front end:
 * tensor/ops/unary.c). */
#include "cpu_impl.h"
#include "ops_impl.h"
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

#define STAMP_FLOAT_OP(name, NAME, FEXPR, IEXPR)                                                   \
    UNARY_KERNEL(FEXPR, FLOAT32)                                                                   \
    UNARY_KERNEL(FEXPR, FLOAT64)                                                                   \
    UNARY_KERNEL(FEXPR, BFLOAT16)                                                                  \
    UNARY_KERNEL(FEXPR, FLOAT16)
CT__UNARY_OPS(STAMP_FLOAT_OP)

#define STAMP_INT(OP)                                                                              \
    UNARY_KERNEL(OP, INT64)                                                                        \
    UNARY_KERNEL(OP, INT32)                                                                        \
    UNARY_KERNEL(OP, UINT8)
STAMP_INT(I_NEG)
STAMP_INT(I_ABS)
STAMP_INT(I_RELU)
STAMP_INT(I_POW_SCALAR)
STAMP_INT(I_CLAMP)

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

/* The loops by op index: float32, float64, bfloat16, float16; int64,
 * int32, uint8 (NULL for the float-valued ops). */
static const struct {
    ct__loop_fn floats[4];
    ct__loop_fn ints[3];
} unary_kernels[CT__NUM_UNARY] = {
#define KERNEL_ROW(name, NAME, FEXPR, IEXPR)                                                       \
    [CT__UNARY_##NAME] = {{FEXPR##_FLOAT32, FEXPR##_FLOAT64, FEXPR##_BFLOAT16, FEXPR##_FLOAT16},   \
                          INT_ROW_SELECT(IEXPR)},
    CT__UNARY_OPS(KERNEL_ROW)
#undef KERNEL_ROW
};

int ct__cpu_unary(int op, ct_tensor *out, ct_tensor *src, const double p[2], const int64_t ip[2]) {
    ct_dtype d = out->dtype;
    ct__loop_fn fn = op < 0 || op >= CT__NUM_UNARY || d == CT_BOOL ? NULL
                     : ct_dtype_is_float(d)                        ? unary_kernels[op].floats[d]
                                            : unary_kernels[op].ints[d - CT_INT64];
    if (!fn)
        return ct__err_set(CT_EINVAL, "unary: no CPU loop for op %d on %s", op, ct_dtype_name(d));
    unary_params prm = {{p[0], p[1]}, {ip[0], ip[1]}};
    ct__iter it;
    ct__iter_init(&it, (ct_tensor *[]){out, src}, 2, out->ndim, out->sizes);
    ct__iter_run(&it, fn, &prm, CT__GRAIN_ELEMENTWISE);
    return 0;
}
