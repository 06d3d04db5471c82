/* ct CPU device internal header: the kernels tensor/cpu/ lists in its
 * dispatch table (device.c there), with device_impl.h's signatures. */
#ifndef CT_CPU_IMPL_H
#define CT_CPU_IMPL_H

#include "device_impl.h"

#include <cblas.h>

int ct__cpu_unary(int op, ct_tensor *out, ct_tensor *src, const double p[2], const int64_t ip[2]);
int ct__cpu_binary(int op, ct_tensor *dst, ct_tensor *x, ct_tensor *y, double scalar,
                   ct_dtype dtype, int nd, const int64_t *shape);
int ct__cpu_where(ct_tensor *out, ct_tensor *cond, ct_tensor *a, ct_tensor *b,
                  const uint64_t *a_bits, int nd, const int64_t *shape);
int ct__cpu_reduce(const ct__reduction *r, ct_tensor *in, ct_tensor *out, ct_tensor *indices,
                   const bool *mask, bool keepdim);
int ct__cpu_softmax(ct_tensor *out, ct_tensor *in, int dim, bool log);
int ct__cpu_layer_norm(ct_tensor *y, ct_tensor *mean, ct_tensor *rstd, ct_tensor *x, ct_tensor *w,
                       ct_tensor *b, double eps);
int ct__cpu_layer_norm_backward(ct_tensor *dx, ct_tensor *dw, ct_tensor *db, ct_tensor *dy,
                                ct_tensor *x, ct_tensor *w, ct_tensor *mean, ct_tensor *rstd);
int ct__cpu_cross_entropy(ct_tensor *loss, ct_tensor *lse, ct_tensor *x, ct_tensor *t,
                          int64_t ignore, double smoothing);
int ct__cpu_cross_entropy_backward(ct_tensor *grad, ct_tensor *x, ct_tensor *t, ct_tensor *lse,
                                   ct_tensor *scale, int64_t ignore, double smoothing);
int ct__cpu_attention(const ct__attention *a);
int ct__cpu_optim_step(const ct__optim_step *s, int index);
int ct__cpu_scan_index(ct_tensor *index, int64_t bound, bool *found, int64_t *bad, int64_t *max);
int ct__cpu_gather(ct_tensor *out, ct_tensor *t, int dim, ct_tensor *index);
int ct__cpu_scatter_add(ct_tensor *self, int dim, ct_tensor *index, ct_tensor *src);
int ct__cpu_one_hot(ct_tensor *out, ct_tensor *labels, int64_t classes);
int ct__cpu_band(ct_tensor *out, ct_tensor *t, int64_t k, bool upper);
int ct__cpu_draw(ct_tensor *out, const ct__draw *d);
int ct__cpu_scan_probabilities(ct_tensor *p, bool *found, double *bad);
/* The CPU's matmul through BLAS, whose dims and leading dims are
 * blasints. */
#define CT__CPU_MM_LIMIT ((int64_t)((1ull << (sizeof(blasint) * 8 - 1)) - 1))
int ct__cpu_matmul(const ct__mm_plan *p, int index);
/* t = value (any layout). */
int ct__cpu_fill(ct_tensor *t, double value);

/* CPU storage and its statistics (tensor.c, where tensor objects share a
 * heap block with small storages). */
ct_storage *ct__cpu_storage_new(size_t nbytes);
int64_t ct__cpu_memory_allocated(void);
int64_t ct__cpu_memory_peak(void);
void ct__cpu_memory_reset_peak(void);

#endif
