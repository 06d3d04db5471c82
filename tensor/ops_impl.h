/* ct op registry internal header: not installed, not part of the API.
 *
 * Each elementwise family is listed once, here, as an X-macro row per op:
 * its name, its autograd op (CT_OP_<NAME>), its CPU expressions and which
 * dtypes it takes. The front ends (tensor/ops/) read the names, the op ids
 * and the dtypes; tensor/cpu/ stamps its loops from the expressions, whose
 * macros it defines; the CUDA kernels switch on the same indices
 * (CT__UNARY_<NAME>, CT__BINARY_<NAME>). Plain macros, so that C and CUDA
 * C++ both include it. */
#ifndef CT_OPS_IMPL_H
#define CT_OPS_IMPL_H

#include <stdbool.h>
#include <stdint.h>

/* Unary ops: X(name, NAME, float expression, integer expression; 0 where
 * the op is float-valued, so integer inputs are computed in float32). */
#define CT__UNARY_OPS(X)                                                                           \
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

/* Binary ops: X(name, NAME, float expression, integer expression, the
 * integer dtypes it takes: NONE (computed in float32), INTS (int64, int32,
 * uint8), ALL (and bool)). Arithmetic first, then the comparisons, whose
 * result is bool: the CUDA kernels tell them apart by index. */
#define CT__ARITH_OPS(X)                                                                           \
    X(add, ADD, F_ADD, I_ADD, ALL)                                                                 \
    X(sub, SUB, F_SUB, I_SUB, INTS)                                                                \
    X(mul, MUL, F_MUL, I_MUL, ALL)                                                                 \
    X(div, DIV, F_DIV, 0, NONE)                                                                    \
    X(pow, POW, F_POW, I_POW, INTS)                                                                \
    X(maximum, MAXIMUM, F_MAXIMUM, I_MAXIMUM, ALL)                                                 \
    X(minimum, MINIMUM, F_MINIMUM, I_MINIMUM, ALL)
#define CT__COMPARE_OPS(X)                                                                         \
    X(eq, EQ, C_EQ, C_EQ, ALL)                                                                     \
    X(ne, NE, C_NE, C_NE, ALL)                                                                     \
    X(lt, LT, C_LT, C_LT, ALL)                                                                     \
    X(le, LE, C_LE, C_LE, ALL)                                                                     \
    X(gt, GT, C_GT, C_GT, ALL)                                                                     \
    X(ge, GE, C_GE, C_GE, ALL)
#define CT__BINARY_OPS(X) CT__ARITH_OPS(X) CT__COMPARE_OPS(X)

enum {
#define CT__UNARY_INDEX(name, NAME, FEXPR, IEXPR) CT__UNARY_##NAME,
    CT__UNARY_OPS(CT__UNARY_INDEX)
#undef CT__UNARY_INDEX
        CT__NUM_UNARY
};

enum {
#define CT__BINARY_INDEX(name, NAME, FEXPR, IEXPR, INTS) CT__BINARY_##NAME,
    CT__BINARY_OPS(CT__BINARY_INDEX)
#undef CT__BINARY_INDEX
        CT__NUM_BINARY
};

/* The same indices by the ops' names (ct__unary_exp, ct__binary_add), for
 * the front ends that stamp the public functions from ct/tensor.h's lists:
 * a name the registry lacks does not compile. */
enum {
#define CT__UNARY_BY_NAME(name, NAME, FEXPR, IEXPR) ct__unary_##name = CT__UNARY_##NAME,
    CT__UNARY_OPS(CT__UNARY_BY_NAME)
#undef CT__UNARY_BY_NAME
};
enum {
#define CT__BINARY_BY_NAME(name, NAME, FEXPR, IEXPR, INTS) ct__binary_##name = CT__BINARY_##NAME,
    CT__BINARY_OPS(CT__BINARY_BY_NAME)
#undef CT__BINARY_BY_NAME
};

/* The first comparison: indices from it on give bool results. */
#define CT__FIRST_COMPARE CT__BINARY_EQ

/* Reductions (tensor/ops/reduce.c): the families of accumulation, what
 * each kind sums or compares (its map), and what happens to a finished
 * value (its post step). X(KIND, FAMILY, MAP). */
#define CT__RED_KINDS(X)                                                                           \
    X(SUM, SUM, ID)                                                                                \
    X(SUM_ABS, SUM, ABS)                                                                           \
    X(SUM_NZ, SUM, NZ)                                                                             \
    X(SUM_POW, SUM, POW)                                                                           \
    X(SUM_SQR, SUM, SQR)                                                                           \
    X(PROD, PROD, ID)                                                                              \
    X(MAX, MAX, ID)                                                                                \
    X(MIN, MIN, ID)                                                                                \
    X(MAX_ABS, MAX, ABS)                                                                           \
    X(MIN_ABS, MIN, ABS)                                                                           \
    X(VAR, VAR, ID)                                                                                \
    X(LSE, LSE, ID)                                                                                \
    X(ARGMAX, ARGMAX, ID)                                                                          \
    X(ARGMIN, ARGMIN, ID)

enum {
    CT__RED_SUM,
    CT__RED_PROD,
    CT__RED_MAX,
    CT__RED_MIN,
    CT__RED_VAR,
    CT__RED_LSE,
    CT__RED_ARGMAX,
    CT__RED_ARGMIN
};
enum { CT__MAP_ID, CT__MAP_ABS, CT__MAP_NZ, CT__MAP_POW, CT__MAP_SQR };
/* mean divides by the count, norms take a root, std the square root of the
 * variance. */
enum { CT__POST_NONE, CT__POST_MEAN, CT__POST_SQRT, CT__POST_ROOT };
enum {
#define CT__RED_KIND_INDEX(KIND, FAMILY, MAP) CT__KIND_##KIND,
    CT__RED_KINDS(CT__RED_KIND_INDEX)
#undef CT__RED_KIND_INDEX
        CT__NUM_RED_KINDS
};

/* A Philox draw into n contiguous elements (tensor/philox.h defines the
 * stream); the CPU's draws (tensor/cpu/random.c) and the devices' use the same
 * description. Uniform and
 * normal: out = a + b * value, where value is a uniform of `bits` bits or a
 * standard normal; bernoulli: 1 where the uniform < p, p = a or, with
 * p_in_out, the value already in the element. */
enum { CT__DRAW_UNIFORM, CT__DRAW_NORMAL, CT__DRAW_BERNOULLI };
typedef struct ct__draw {
    int kind;
    int dtype;     /* of out */
    int per_block; /* 4: the 32-bit layout, 2: the 64-bit one */
    int bits;
    double a, b;
    int p_in_out;
    uint64_t seed, offset;
    char *out;
    int64_t n;
} ct__draw;

/* ct/tensor.h's CT_MAX_DIMS, for this header's C and CUDA readers. */
#define CT__OPS_MAX_DIMS 8

/* One operand of a matmul: a batch of matrices, strides in elements. */
typedef struct ct__mm_mat {
    const char *data;
    int64_t bstrides[CT__OPS_MAX_DIMS]; /* per batch dim of the plan; 0 broadcasts */
    int64_t rs, cs;                     /* between rows / columns */
    bool blas;                          /* BLAS reads it in place as: */
    bool trans;                         /*   the transpose of a row-major matrix */
    int64_t ld;                         /*   with this leading dim */
} ct__mm_mat;

/* A matmul as its front end (tensor/ops/matmul.c) plans it for any device:
 * c (nb, m, n) = a (nb, m, k) @ b (nb, k, n). */
typedef struct ct__mm_plan {
    int dtype; /* compute dtype (ct_dtype): the operands' and c's */
    int nbatch;
    int64_t batch[CT__OPS_MAX_DIMS]; /* (nbatch) broadcast batch shape; nb its numel */
    int64_t nb, m, n, k;
    ct__mm_mat a, b; /* BLAS-readable (blas set), except for int64 */
    char *c;         /* contiguous */
    int64_t limit;   /* the largest matrix dim and leading dim BLAS takes */
} ct__mm_plan;

#endif
