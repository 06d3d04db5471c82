/* ct's CUDA kernels, as C sees them: internal, not installed. The kernels
 * are C++ (kernels.cu); this header is plain C on both sides, so it holds
 * only plain data.
 *
 * Errors: each launch returns 0 or a cudaError_t value (non-zero), which
 * the caller turns into a ct error. Threads: any; a launch is queued on the
 * stream given. */
#ifndef CT_CUDA_KERNELS_H
#define CT_CUDA_KERNELS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CT__CUDA_MAX_DIMS 8

/* ct's element iterator (tensor_impl.h) for up to three operands (out
 * first): the coalesced shape, dim 0 innermost, and each operand's byte
 * strides. */
#define CT__CUDA_MAX_OPERANDS 3
typedef struct ct__cuda_iter {
    int ndim;
    int64_t numel;
    int64_t shape[CT__CUDA_MAX_DIMS];
    int64_t strides[CT__CUDA_MAX_DIMS][CT__CUDA_MAX_OPERANDS];
    char *data[CT__CUDA_MAX_OPERANDS];
} ct__cuda_iter;

/* dst = src, converted from src_dtype to dst_dtype (ct_dtype values). */
int ct__cuda_launch_copy(const ct__cuda_iter *it, int dst_dtype, int src_dtype, void *stream);

/* Every element of it's only operand = value, converted to dtype. */
int ct__cuda_launch_fill(const ct__cuda_iter *it, int dtype, double value, void *stream);

/* Binary ops, in the order of tensor/cpu/binary.c's table. */
enum {
    CT__CUDA_ADD,
    CT__CUDA_SUB,
    CT__CUDA_MUL,
    CT__CUDA_DIV,
    CT__CUDA_POW,
    CT__CUDA_MAXIMUM,
    CT__CUDA_MINIMUM,
    CT__CUDA_EQ,
    CT__CUDA_NE,
    CT__CUDA_LT,
    CT__CUDA_LE,
    CT__CUDA_GT,
    CT__CUDA_GE,
    CT__CUDA_NBINARY
};

/* out = a (op) b, all of dtype (ct_dtype), except comparisons, whose out is
 * bool. With scalar_b, b is the value scalar (converted to dtype first, as
 * on the CPU) and it->data[2] is unused. */
int ct__cuda_launch_binary(const ct__cuda_iter *it, int op, int dtype, int scalar_b, double scalar,
                           void *stream);

/* Unary ops, in the order of tensor/cpu/unary.c's table. */
enum {
    CT__CUDA_NEG,
    CT__CUDA_ABS,
    CT__CUDA_EXP,
    CT__CUDA_LOG,
    CT__CUDA_LOG1P,
    CT__CUDA_SQRT,
    CT__CUDA_RSQRT,
    CT__CUDA_SIN,
    CT__CUDA_COS,
    CT__CUDA_TANH,
    CT__CUDA_SIGMOID,
    CT__CUDA_RELU,
    CT__CUDA_GELU,
    CT__CUDA_GELU_TANH,
    CT__CUDA_SILU,
    CT__CUDA_POW_SCALAR,
    CT__CUDA_CLAMP,
    CT__CUDA_NUNARY
};

/* out = op(in), both of dtype; p are the op's scalars (pow's exponent,
 * clamp's bounds) as doubles, ip the same as integers, converted as the CPU
 * does. */
int ct__cuda_launch_unary(const ct__cuda_iter *it, int op, int dtype, const double p[2],
                          const int64_t ip[2], void *stream);

/* ------------------------ reductions, softmax, cross-entropy, layer norm */

/* ------------------------------------------------ indexing and random */

#ifdef __cplusplus
}
#endif

#endif
