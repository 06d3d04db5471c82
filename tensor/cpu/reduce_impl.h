/* ct CPU internal header: the reduction layer under reduce.c and softmax.c.
 *
 * A reduction iterates the input together with a marker: a header with the
 * input's rank whose reduced dims have size 1, so the element iterator gives
 * them stride 0. The iterator orders and coalesces dims by the input's
 * strides; the plan then splits its dims into the kept space (one point per
 * output element) and the reduced space. Kernels see either contiguous runs
 * along the reduced space ("inner": the input's fastest dim is reduced) or
 * rows along the fastest kept dim ("outer": vectorised across outputs). */
#ifndef CT_CPU_REDUCE_IMPL_H
#define CT_CPU_REDUCE_IMPL_H

#include "tensor_impl.h"

/* Iterator dims, innermost first, with each operand's byte strides. An empty
 * space has one dim of size 1 and stride 0. */
typedef struct ct__red_space {
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    int64_t strides[CT_MAX_DIMS][CT__ITER_MAX]; /* [dim][operand] */
    int64_t numel;
} ct__red_space;

/* A point in a space: its multi-index and every operand's byte offset. */
typedef struct ct__red_pos {
    int64_t idx[CT_MAX_DIMS];
    int64_t off[CT__ITER_MAX];
} ct__red_pos;

typedef struct ct__red_plan {
    ct__iter it;        /* operand 0 is the input, operand 1 the marker */
    ct__red_space kept; /* one point per output element */
    ct__red_space red;  /* the reduced elements of one output */
    bool inner;         /* runs along red's dim 0; otherwise rows across kept's dim 0 */
} ct__red_plan;

/* Runs of at least this many reduced elements are reduced one output at a
 * time; shorter ones are reduced across outputs, a row at a time. */
#define CT__RED_MIN_RUN 16

/* Fills m with a header for iterating out against in: in's rank, size 1 and
 * stride 0 on reduced dims, out's strides elsewhere. out has in's rank when
 * keepdim, otherwise the rank without the reduced dims. m only serves
 * ct__iter_init and lives on the caller's stack. */
void ct__red_marker(ct_tensor *m, const ct_tensor *out, const ct_tensor *in, const bool *reduced,
                    bool keepdim);
/* Builds the plan over ts[0] (input), ts[1] (marker) and any further operands
 * with the input's shape. */
void ct__red_plan_init(ct__red_plan *p, ct_tensor *const *ts, int n);
/* Positions pos at a linear index of s, dim 0 varying fastest. */
void ct__red_seek(const ct__red_space *s, int nops, int64_t linear, ct__red_pos *pos);
/* Moves pos len steps along dim 0 (len <= shape[0] - idx[0]) and carries. */
void ct__red_advance(const ct__red_space *s, int nops, ct__red_pos *pos, int64_t len);

/* Row helpers for kernels outside reduce.c. max: the largest element, NaN if
 * any is NaN, -inf for n == 0. sum: the sum in float lanes folded into
 * double. sumexp: the sum of exp(x[i] - c). */
float ct__red_max_f32(const float *x, int64_t n);
double ct__red_max_f64(const double *x, int64_t n);
double ct__red_sum_f32(const float *x, int64_t n);
double ct__red_sum_f64(const double *x, int64_t n);
double ct__red_sumexp_f32(const float *x, int64_t n, float c);
double ct__red_sumexp_f64(const double *x, int64_t n, double c);

#endif
