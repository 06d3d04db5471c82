/* ct's CUDA device layer, internal: what tensor/ needs of a GPU.
 *
 * runtime.c implements it over the CUDA runtime when ct is built with CUDA;
 * none.c, when it is not, reports no device. device.c builds the public API
 * (ct/cuda.h) and device storage on top of either.
 *
 * Errors: 0 or a negative CT_E* code with a message naming the device and
 * the CUDA error. Threads: every function may be called from any thread. */
#ifndef CT_CUDA_IMPL_H
#define CT_CUDA_IMPL_H

#include "caching_allocator.h"
#include "cuda_kernels.h"
#include "device_impl.h"
#include "tensor_impl.h"

/* Devices present (0 when there is no driver or no device; *why, if not
 * NULL, then says which, in static storage). */
int ct__cuda_count(const char **why);
/* The current CUDA device of threads that set none (ct_dist_init: the
 * local rank's, through the table's set_default). */
void ct__cuda_set_default_device(int index);
/* Makes device the calling thread's CUDA device. */
int ct__cuda_use(int device);
/* The device's compute stream, made on first use (device current). */
int ct__cuda_stream(int device, void **stream);
/* The memory backend of device, for its caching allocator. */
int ct__cuda_devmem(int device, ct__devmem *mem);
/* Copies n bytes on device's compute stream, from and to device memory or
 * host memory (to_device/from_device say which), and waits for it. */
int ct__cuda_copy(int device, void *dst, const void *src, size_t n, bool to_device,
                  bool from_device);
/* Waits until device's compute stream is idle. */
int ct__cuda_sync(int device);

/* dst = src on their CUDA device (both on one), broadcast and converted as
 * ct__cpu_copy_into does on the CPU; queued on the device's compute stream. */
int ct__cuda_copy_tensor(ct_tensor *dst, ct_tensor *src);

/* dst = x (op) y on their device, op an index of the binary ops
 * (cuda_kernels.h), every operand of dtype (dst bool for comparisons), all
 * viewed with the broadcast shape (nd, shape). y NULL: the scalar. */
int ct__cuda_binary(int op, ct_tensor *dst, ct_tensor *x, ct_tensor *y, double scalar,
                    ct_dtype dtype, int nd, const int64_t *shape);

/* out = op(src) on their device, op an index of the unary ops
 * (cuda_kernels.h), both of one dtype; p and ip the op's scalars. */
int ct__cuda_unary(int op, ct_tensor *out, ct_tensor *src, const double p[2], const int64_t ip[2]);

/* t = value, converted to t's dtype, on t's device. */
int ct__cuda_fill(ct_tensor *t, double value);

/* --------------------------------------- the device ops, family by family
 *
 * Each family's kernels are in tensor/cuda/<family>.cu, declared in
 * cuda_kernels.h; the C that prepares their launches from tensors is in
 * tensor/cuda/<family>.c, built with CUDA only, and none.c answers for
 * builds without it. */

/* reductions, softmax, cross-entropy, layer norm (reduce.cu, reduce.c) */

/* The table's reduce (device_impl.h): r of in over the dims in mask. */
int ct__cuda_reduce(const ct__reduction *r, ct_tensor *in, ct_tensor *out, ct_tensor *indices,
                    const bool *mask, bool keepdim);
/* out = softmax (or log_softmax) of in along dim (wrapped); out is new and
 * contiguous, of in's shape and float dtype. */
int ct__cuda_softmax(ct_tensor *out, ct_tensor *in, int dim, bool log);
/* Cross-entropy of contiguous scores x [n, c] (float32 or float64) against
 * contiguous int64 targets t [n], already checked: loss [n] (float64) and
 * lse [2, n] (x's dtype): each row's maximum, then log sum exp(x - max). */
int ct__cuda_cross_entropy(ct_tensor *loss, ct_tensor *lse, ct_tensor *x, ct_tensor *t,
                           int64_t ignore, double smoothing);
/* Its gradient into grad [n, c] (x's dtype, contiguous), scale a 0-d or an
 * [n] tensor of x's dtype, contiguous. */
int ct__cuda_cross_entropy_backward(ct_tensor *grad, ct_tensor *x, ct_tensor *t, ct_tensor *lse,
                                    ct_tensor *scale, int64_t ignore, double smoothing);
/* Layer norm over x's last dim (all contiguous, w and b of x's dtype or
 * NULL): y, and mean and rstd per row in the compute type. */
int ct__cuda_layer_norm(ct_tensor *y, ct_tensor *mean, ct_tensor *rstd, ct_tensor *x, ct_tensor *w,
                        ct_tensor *b, double eps);
/* Its backward from contiguous dy: dx, dw, db (each NULL when not
 * wanted). */
int ct__cuda_layer_norm_backward(ct_tensor *dx, ct_tensor *dw, ct_tensor *db, ct_tensor *dy,
                                 ct_tensor *x, ct_tensor *w, ct_tensor *mean, ct_tensor *rstd);
/* The optimizer step st (device_impl.h), one launch per segment (optim.c). */
int ct__cuda_optim_step(const ct__optim_step *st, int device);

/* indexing, where, concatenation, factories, random (index.cu, index.c)
 *
 * Concatenation and the factories need no kernel of their own: they are
 * copies and fills. Everything here is queued on the device's compute
 * stream, except the scans, whose answer the host waits for. */

/* Scans index (int64, int32 or uint8) on its device in the element
 * iterator's order, as the CPU does: *found says whether a value lies
 * outside [0, bound) (bound < 0: whether one is negative), *bad is the
 * first such, *max the largest value (INT64_MIN when empty). */
int ct__cuda_scan_index(ct_tensor *index, int64_t bound, bool *found, int64_t *bad, int64_t *max);
/* The same for the float tensor p: the first value outside [0, 1] (NaN
 * too). */
int ct__cuda_scan_probabilities(ct_tensor *p, bool *found, double *bad);

/* The table's gather, scatter_add and one_hot (device_impl.h): the index
 * (int64 or int32) and the labels in range. */
int ct__cuda_gather(ct_tensor *out, ct_tensor *t, int dim, ct_tensor *index);
int ct__cuda_scatter_add(ct_tensor *self, int dim, ct_tensor *index, ct_tensor *src);
int ct__cuda_one_hot(ct_tensor *out, ct_tensor *labels, int64_t classes);

/* out (contiguous, t's shape and dtype) = tril(t, k), or triu with upper. */
int ct__cuda_band(ct_tensor *out, ct_tensor *t, int64_t k, bool upper);

/* out = cond ? a : b, all of out's dtype but the bool cond, viewed with the
 * broadcast shape (nd, shape). a NULL: the element whose bytes are *a_bits
 * (masked_fill, b being out itself). */
int ct__cuda_where(ct_tensor *out, ct_tensor *cond, ct_tensor *a, ct_tensor *b,
                   const uint64_t *a_bits, int nd, const int64_t *shape);

/* The draw d (its out, n elements, contiguous on out's device). */
int ct__cuda_draw(ct_tensor *out, const ct__draw *d);

/* matmul through cuBLAS (matmul.c), pinned host memory (runtime.c,
 * device.c) */

/* Queues p (cuda_kernels.h) on device's compute stream: cuBLAS for the float dtypes (float32
 * in TF32 when ct_cuda_set_tf32 asked for it; float16 and bfloat16
 * accumulate in float32), a kernel for int64. */
int ct__cuda_matmul(const ct__mm_plan *p, int device);

/* Page-locked host memory of nbytes (cudaHostAlloc), freed with
 * ct__cuda_host_free. */
int ct__cuda_host_alloc(size_t nbytes, void **ptr);
void ct__cuda_host_free(void *ptr);
/* ct__cuda_copy without the wait: queued on device's compute stream. */
int ct__cuda_copy_async(int device, void *dst, const void *src, size_t n, bool to_device,
                        bool from_device);

/* ------------------------------------------- for the families' launchers
 *
 * CUDA builds only (runtime.c). */

/* Makes device current and gives its compute stream, for a copy or a
 * launch. */
int ct__cuda_launch_on(int device, void **stream);
/* A launch's cudaError_t (0: none) as a ct error naming what failed. */
int ct__cuda_launched(int e, int device, const char *what);
/* ct's element iterator over ts[0..n-1], viewed with shape (nd, sizes), in
 * the kernels' form. */
void ct__cuda_iter_of(ct__cuda_iter *k, ct_tensor *const *ts, int n, int nd, const int64_t *sizes);

/* The table's to (device_impl.h): ct_to and ct_to_async between the host
 * and a CUDA device, or two devices, through pinned memory and the compute
 * streams (device.c). */
ct_tensor *ct__cuda_to(const char *fn, ct_tensor *t, ct_device device, bool async);

/* device.c: device storage through the device's caching allocator, freed
 * back to it. NULL with the error. */
ct_storage *ct__cuda_storage_new(const char *op, size_t nbytes, int device);

/* ---------------------------------------------- streams, for collectives
 *
 * device.c, in every build. */

/* Marks that work queued on stream (another than the device's compute
 * stream, such as a communication stream) uses t's memory: when the block
 * is freed, the allocator holds it back until that work is done. A no-op
 * for CPU tensors and for memory the caller brought
 * (ct_storage_from_blob). */
int ct__cuda_record_stream(ct_tensor *t, void *stream);

#endif
