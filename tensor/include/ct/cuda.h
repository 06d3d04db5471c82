/* ct/cuda.h: CUDA devices: which there are, the current one, their memory,
 * and moving tensors to and from them (docs/cuda-design.md).
 *
 * A CUDA tensor is an ordinary ct tensor whose storage is on a device,
 * (ct_device){CT_CUDA, index}. Device memory comes from a caching allocator
 * per device, so that a training step does not call cudaMalloc; work on a
 * device is queued on its compute stream, in order, and the host waits only
 * where a value comes back to it.
 *
 * Every function works in a build without CUDA, and on a machine without a
 * device: there are then no devices, and asking for one is CT_EDEVICE with
 * the reason.
 *
 * Example:
 *
 *     #include <ct/cuda.h>
 *     #include <stdio.h>
 *
 *     int main(void) {
 *         if (ct_cuda_device_count() == 0) {
 *             printf("no CUDA device: %s\n", ct_cuda_unavailable_reason());
 *             return 0;
 *         }
 *         // A batch staged in page-locked memory goes to the device without
 *         // the host waiting, a matmul runs there, and the result comes back.
 *         ct_device gpu = {CT_CUDA, 0};
 *         ct_scope_begin();
 *         ct_tensor *x = ct_pin_memory(ct_reshape(ct_arange(0, 6, 1, CT_FLOAT32),
 *                                                 CT_SHAPE(2, 3)));
 *         ct_tensor *d = x ? ct_to_async(x, gpu) : NULL;
 *         ct_tensor *xxt = d ? ct_matmul(d, ct_transpose(d, 0, 1)) : NULL;
 *         ct_tensor *back = xxt ? ct_to(xxt, CT_DEVICE_CPU) : NULL;
 *         if (!back)
 *             fprintf(stderr, "%s\n", ct_errmsg());
 *         else
 *             ct_print(back);
 *         ct_scope_end();
 *         return back ? 0 : 1;
 *     }
 *
 * Errors: functions returning int return 0 or a negative CT_E* code with a
 * message; CT_EDEVICE names a device that is not there, CT_ENOMEM says what
 * the device's allocator holds.
 *
 * Threads: the current device is per thread. Everything else may be called
 * from any thread.
 *
 * Pinned memory and asynchronous copies: ct_to waits for its copy.
 * ct_to_async does not, where the host side is page-locked ("pinned"):
 * the copy is queued on the device's compute stream, behind the work
 * already there, and ops queued after it see its result. A host tensor
 * filled by ct_to_async may be read only after ct_cuda_synchronize (or
 * ct_item, or a ct_to to the host) on that device. Pinned memory comes from
 * a cache, as PyTorch's does: sizes round up to a power of two, freed
 * blocks are kept for reuse (ct_cuda_empty_pinned_cache gives them back),
 * and a block is not reused until the copies that used it are done, so a
 * pinned tensor may be freed while its copy is in flight. Writing to it
 * before then changes what is copied.
 */
#ifndef CT_CUDA_H
#define CT_CUDA_H

#include <ct/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Devices this process can use; 0 without a driver, a device, or a build
 * with CUDA. Never an error. */
CT_API int ct_cuda_device_count(void);
/* Why there is no device ("" when there is one); static storage. */
CT_API const char *ct_cuda_unavailable_reason(void);

/* The calling thread's current device: where ops put new CUDA tensors when
 * no device index is given. Until a thread sets one, it is the process's
 * default: 0, or under ctlaunch and mpirun (ct_dist_init) the local rank's
 * device, modulo the devices there are. CT_EDEVICE for no such device. */
CT_API int ct_cuda_set_device(int index);
CT_API int ct_cuda_current_device(void);
/* Waits until the work queued on the device's compute stream is done. */
CT_API int ct_cuda_synchronize(int index);

/* What the device's caching allocator holds, in bytes. */
typedef struct ct_cuda_memory_stats {
    int64_t allocated, reserved;           /* in tensors; taken from the device */
    int64_t peak_allocated, peak_reserved; /* since the start or the last reset */
    int64_t requested;                     /* asked for, before rounding */
    int64_t segments;                      /* device allocations held */
    int64_t device_mallocs, cache_hits, ooms;
} ct_cuda_memory_stats;

CT_API int ct_cuda_memory_stats_get(int index, ct_cuda_memory_stats *out);
CT_API int ct_cuda_reset_peak_memory(int index);
/* Returns the cached memory that no tensor uses to the device, for other
 * processes. Tensors keep theirs. */
CT_API int ct_cuda_empty_cache(int index);

/* A new uninitialised host tensor in page-locked memory (a CPU tensor to
 * every op), owned like an op's result. CT_EDEVICE where there is no CUDA
 * device (pinning needs the driver), CT_ENOMEM when the memory cannot be
 * locked, CT_EINVAL for a bad shape or dtype. */
CT_API ct_tensor *ct_empty_pinned(int ndim, const int64_t *sizes, ct_dtype dtype);
/* A pinned copy of host tensor t (contiguous), or a new reference to t if
 * it is pinned already; owned like an op's result. Errors as
 * ct_empty_pinned's, and CT_EDEVICE for a CUDA tensor. No autograd record:
 * the copy is data, as a DataLoader's pinned batch is. */
CT_API ct_tensor *ct_pin_memory(ct_tensor *t);
/* Whether t's storage is pinned host memory (views of it included); false
 * for NULL. */
CT_API bool ct_is_pinned(const ct_tensor *t);
/* Unlocks and frees the cached pinned blocks that no tensor holds and no
 * copy is using. Returns 0. */
CT_API int ct_cuda_empty_pinned_cache(void);

/* Whether float32 matmul on a device may use TF32 tensor cores (inputs
 * rounded to 10 bits of mantissa, about 1e-3 relative error, up to 8x
 * faster on Ampere and Hopper). Off by default, as PyTorch's
 * torch.backends.cuda.matmul.allow_tf32 is: a float32 result must not lose
 * precision unasked. Process-wide; read at each matmul, so a change affects
 * matmuls queued after it. Never an error. */
CT_API void ct_cuda_set_tf32(bool enabled);
CT_API bool ct_cuda_tf32_enabled(void);

#ifdef __cplusplus
}
#endif

#endif
