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
 *         ct_scope_begin();
 *         ct_tensor *x = ct_arange(0, 6, 1, CT_FLOAT32);
 *         ct_tensor *d = ct_to(x, (ct_device){CT_CUDA, 0});
 *         ct_tensor *back = d ? ct_to(d, CT_DEVICE_CPU) : NULL;
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

/* A copy of t on device (a new tensor, contiguous, owned like an op's
 * result), or a new reference to t when it is there already. Host to
 * device, device to host and device to device; the host waits for the copy.
 * CT_EDEVICE for a device that is not there. */
CT_API ct_tensor *ct_to(ct_tensor *t, ct_device device);

#ifdef __cplusplus
}
#endif

#endif
