/* ct's CUDA kernels, as C sees them: internal, not installed. The kernels
 * are C++ (kernels.cu); this header is plain C on both sides, so it holds
 * only plain data.
 *
 * Errors: each launch returns 0 or a cudaError_t value (non-zero), which
 * the caller turns into a ct error. Threads: any; a launch is queued on the
 * stream given. */
#ifndef CT_CUDA_KERNELS_H
#define CT_CUDA_KERNELS_H

#include "ops_impl.h"
#include "optim_rules.h"

#include <stdbool.h>
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

/* Binary ops by their registry index (ops_impl.h): CT__BINARY_ADD, ... */

/* out = a (op) b, all of dtype (ct_dtype), except comparisons, whose out is
 * bool. With scalar_b, b is the value scalar (converted to dtype first, as
 * on the CPU) and it->data[2] is unused. */
int ct__cuda_launch_binary(const ct__cuda_iter *it, int op, int dtype, int scalar_b, double scalar,
                           void *stream);

/* Unary ops by their registry index (ops_impl.h): CT__UNARY_NEG, ... */

/* out = op(in), both of dtype; p are the op's scalars (pow's exponent,
 * clamp's bounds) as doubles, ip the same as integers, converted as the CPU
 * does. */
int ct__cuda_launch_unary(const ct__cuda_iter *it, int op, int dtype, const double p[2],
                          const int64_t ip[2], void *stream);

/* ------------------------ reductions, softmax, cross-entropy, layer norm */

/* A reduction's index space (tensor/cpu/reduce_impl.h's ct__red_space):
 * dims innermost first, with the input's byte strides and, for the kept
 * space, the output's. A point's linear index has dim 0 varying fastest. */
typedef struct ct__cuda_red_space {
    int ndim;
    int64_t numel;
    int64_t shape[CT__CUDA_MAX_DIMS];
    int64_t in[CT__CUDA_MAX_DIMS];
    int64_t out[CT__CUDA_MAX_DIMS];
} ct__cuda_red_space;

/* The reduction families, maps and post steps are the registry's
 * (ops_impl.h): CT__RED_*, CT__MAP_*, CT__POST_*. */

/* One reduction: every point of kept is an output, reducing the nred
 * points of red from its input offset. Integer inputs compute in int64
 * (wrapping), except for logsumexp, which computes in float as the other
 * floats but float64 do; sums, products and moments accumulate in double
 * (uint64 for integers). */
typedef struct ct__cuda_reduce_args {
    int family, map, post;
    int in_dtype, out_dtype;
    double scalar; /* var/std's correction; norm's p (map POW, post ROOT) */
    int64_t nred;  /* reduced elements per output (0: each output is the identity) */
    ct__cuda_red_space kept, red;
    const char *in;  /* the input's element 0 */
    char *out;       /* the output's element 0 */
    char *indices;   /* max_dim's int64 indices, laid out as out, or NULL */
    int index_only;  /* argmax/argmin: out holds the index */
    void *workspace; /* ct__cuda_reduce_workspace bytes of device memory */
} ct__cuda_reduce_args;

/* Device scratch the launch needs, in bytes (0: none): partial results
 * when long reductions are split across blocks. */
int64_t ct__cuda_reduce_workspace(const ct__cuda_reduce_args *a);
int ct__cuda_launch_reduce(const ct__cuda_reduce_args *a, void *stream);

/* Rows along one dim (softmax): rows.numel rows, each at its in/out byte
 * offset, of n elements in_step and out_step bytes apart. */
typedef struct ct__cuda_rows {
    ct__cuda_red_space rows;
    int64_t n, in_step, out_step;
    const char *in;
    char *out;
} ct__cuda_rows;

/* softmax (log 0) or log_softmax (log 1) of each row; in and out of dtype,
 * a float dtype. */
int ct__cuda_launch_softmax(const ct__cuda_rows *r, int dtype, int log, void *stream);

/* Cross-entropy over contiguous scores x [n, c] of dtype (float32 or
 * float64) and int64 targets t [n] (each ignore or in [0, c)): lse [2, n]
 * (dtype) gets each row's maximum, then log sum exp(x - max) (kept apart, so
 * that x - max - log sum keeps its digits at large logits), loss [n]
 * (float64) its loss, 0 for ignored rows. */
int ct__cuda_launch_cross_entropy(const void *x, const int64_t *t, void *lse, double *loss,
                                  int64_t n, int64_t c, int64_t ignore, double smoothing, int dtype,
                                  void *stream);
/* grad [n, c] = (softmax(x) - smoothed one-hot of t) * scale, 0 on ignored
 * rows; scale has one value (scale_stride 0) or one per row (1). */
int ct__cuda_launch_cross_entropy_backward(const void *x, const int64_t *t, const void *lse,
                                           const void *scale, int64_t scale_stride, void *grad,
                                           int64_t n, int64_t c, int64_t ignore, double smoothing,
                                           int dtype, void *stream);

/* Layer norm over the last dim of contiguous x [rows, d] of a float dtype:
 * y = (x - mean) * rstd * w + b (w, b of dtype, either NULL), saving mean
 * and rstd [rows] in the compute type (float64 for float64, else
 * float32). */
int ct__cuda_launch_layer_norm(const void *x, const void *w, const void *b, void *y, void *mean,
                               void *rstd, int64_t rows, int64_t d, double eps, int dtype,
                               void *stream);
/* Its backward from dy [rows, d]: dx [rows, d], dw and db [d] (each NULL
 * when not wanted; w NULL: no weight). */
int ct__cuda_launch_layer_norm_backward(const void *dy, const void *x, const void *w,
                                        const void *mean, const void *rstd, void *dx, void *dw,
                                        void *db, int64_t rows, int64_t d, int dtype, void *stream);

/* ------------------------------------------------ indexing and random */

/* Gather and scatter_add along a dim, over it's shape (the index's): operand
 * 0 walks with the index, operand 1 is the index (index_dtype: int64 or
 * int32), operand 2 is the indexed tensor, which stays put along the dim
 * (stride 0) and moves jump bytes per index value there. Gather copies
 * operand 2's element into operand 0's, of esize bytes; scatter_add adds
 * operand 0's element into operand 2's (dtype), atomically. The index
 * values must be in range (ct__cuda_launch_scan checks them). */
int ct__cuda_launch_gather(const ct__cuda_iter *it, int esize, int index_dtype, int64_t jump,
                           void *stream);
int ct__cuda_launch_scatter_add(const ct__cuda_iter *it, int dtype, int index_dtype, int64_t jump,
                                void *stream);

/* What a scan of a tensor's values found, in the element iterator's
 * order. */
typedef struct ct__cuda_scan {
    int64_t first; /* position of the first value out of range; INT64_MAX: none */
    int64_t max;   /* integers: the largest value (INT64_MIN when empty) */
    int64_t bad_int;
    double bad_float; /* the first value out of range, as it is */
} ct__cuda_scan;

/* Scans it's only operand of dtype into *result (device memory): integers
 * (int64, int32, uint8) are out of range outside [0, bound) (bound < 0: when
 * negative), floats outside [0, 1] (NaN too). */
int ct__cuda_launch_scan(const ct__cuda_iter *it, int dtype, int64_t bound, ct__cuda_scan *result,
                         void *stream);

/* one_hot: operand 0 is the contiguous int64 output [..., classes], operand
 * 1 the labels (labels_dtype) broadcast along the class dim. */
int ct__cuda_launch_one_hot(const ct__cuda_iter *it, int labels_dtype, int64_t classes,
                            void *stream);

/* tril (upper 0) or triu (upper 1): operand 0 the contiguous output of
 * esize-byte elements with rows x cols matrices innermost, operand 1 the
 * input; elements with col - row <= k (tril) or >= k (triu) are kept,
 * others are zero. */
int ct__cuda_launch_band(const ct__cuda_iter *it, int esize, int64_t rows, int64_t cols, int64_t k,
                         int upper, void *stream);

/* A fourth operand beside an iterator's three, at the iterator's dims. */
typedef struct ct__cuda_operand {
    char *data;
    int64_t strides[CT__CUDA_MAX_DIMS]; /* bytes */
} ct__cuda_operand;

/* where: operand 0 = operand 1 (a bool condition) ? operand 2 : b, every
 * element of esize bytes. With a_bits, operand 2 is unused and the value is
 * the element whose bytes are *a_bits (masked_fill, b being the output). */
int ct__cuda_launch_where(const ct__cuda_iter *it, const ct__cuda_operand *b, int esize,
                          const uint64_t *a_bits, void *stream);

/* The draw d (ops_impl.h's ct__draw) on stream. */
int ct__cuda_launch_draw(const ct__draw *d, void *stream);

/* ------------------------------------------------------------- matmul */

/* Matmul plans are ops_impl.h's (ct__mm_plan). */

/* p->c = p->a @ p->b in int64, wrapping, over any strides; every size of
 * p > 0. */
int ct__cuda_launch_matmul_int(const ct__mm_plan *p, void *stream);

/* ---------------------------------------------------------- optimizers */

/* optim.cu: h's update (optim_rules.h) on n elements of device memory,
 * queued on stream; adam: 0 SGD, 1 Adam, 2 AdamW; f64: float64, else
 * float32; bufs the kind's state buffers at element 0 (CT__OPTIM_MAX_BUFS,
 * unused ones NULL). */
int ct__cuda_launch_optim(const ct__optim_hyper *h, int adam, int f64, char *p, const char *g,
                          char *const *bufs, int64_t n, void *stream);

#ifdef __cplusplus
}
#endif

#endif
