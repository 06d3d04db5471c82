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
#include "tensor_impl.h"

/* Devices present (0 when there is no driver or no device; *why, if not
 * NULL, then says which, in static storage). */
int ct__cuda_count(const char **why);
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
 * ct__copy_into does on the CPU; queued on the device's compute stream. */
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

/* indexing, where, concatenation, factories, random (index.cu, index.c) */

/* matmul through cuBLAS (matmul.c) */

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

/* device.c: device storage through the device's caching allocator, freed
 * back to it. NULL with the error. */
ct_storage *ct__cuda_storage_new(size_t nbytes, int device);

#endif
