/* CUDA devices, their caching allocators, device storage and copies
 * (ct/cuda.h). */
#include <ct/cuda.h>

#include "cuda_impl.h"

#include <pthread.h>
#include <stdatomic.h>

#define MAX_DEVICES 64

static struct {
    pthread_mutex_t lock;
    pthread_once_t once;
    int count;
    const char *why;
    ct__calloc *alloc[MAX_DEVICES]; /* made on first use, kept for the process */
} D = {.lock = PTHREAD_MUTEX_INITIALIZER, .once = PTHREAD_ONCE_INIT};

/* The thread's current device, or -1: the process's default. */
static _Thread_local int current = -1;
static atomic_int default_device;

void ct__cuda_set_default_device(int index) { atomic_store(&default_device, index); }

/* Asking the driver once: the answer does not change while a process runs. */
static void count_once(void) { D.count = ct__cuda_count(&D.why); }

int ct_cuda_device_count(void) {
    pthread_once(&D.once, count_once);
    return D.count;
}

const char *ct_cuda_unavailable_reason(void) {
    pthread_once(&D.once, count_once);
    return D.why;
}

static int check_device(const char *fn, int index) {
    int n = ct_cuda_device_count();
    if (index >= 0 && index < n)
        return 0;
    if (!n)
        return ct__seterr(CT_EDEVICE, "%s: cuda:%d: there is no CUDA device: %s", fn, index, D.why);
    return ct__seterr(CT_EDEVICE, "%s: cuda:%d: no such device (this process sees %d: cuda:0-%d)",
                      fn, index, n, n - 1);
}

int ct_cuda_set_device(int index) {
    int rc = check_device("ct_cuda_set_device", index);
    if (!rc)
        rc = ct__cuda_use(index);
    if (!rc)
        current = index;
    return rc;
}

int ct_cuda_current_device(void) { return current >= 0 ? current : atomic_load(&default_device); }

int ct_cuda_synchronize(int index) {
    int rc = check_device("ct_cuda_synchronize", index);
    return rc ? rc : ct__cuda_sync(index);
}

/* The device's allocator, made on first use. */
static ct__calloc *allocator(const char *fn, int index) {
    if (check_device(fn, index))
        return NULL;
    pthread_mutex_lock(&D.lock);
    ct__devmem mem;
    if (!D.alloc[index] && !ct__cuda_devmem(index, &mem))
        D.alloc[index] = ct__calloc_new(&mem, index);
    ct__calloc *a = D.alloc[index];
    pthread_mutex_unlock(&D.lock);
    return a;
}

int ct_cuda_memory_stats_get(int index, ct_cuda_memory_stats *out) {
    ct__calloc *a = allocator("ct_cuda_memory_stats_get", index);
    if (!a)
        return ct_errcode();
    ct__calloc_stats s;
    ct__calloc_get_stats(a, &s);
    *out = (ct_cuda_memory_stats){.allocated = s.allocated,
                                  .reserved = s.reserved,
                                  .peak_allocated = s.peak_allocated,
                                  .peak_reserved = s.peak_reserved,
                                  .requested = s.requested,
                                  .segments = s.segments,
                                  .device_mallocs = s.device_mallocs,
                                  .cache_hits = s.cache_hits,
                                  .ooms = s.ooms};
    return 0;
}

int ct_cuda_reset_peak_memory(int index) {
    ct__calloc *a = allocator("ct_cuda_reset_peak_memory", index);
    if (a)
        ct__calloc_reset_peak(a);
    return a ? 0 : ct_errcode();
}

int ct_cuda_empty_cache(int index) {
    ct__calloc *a = allocator("ct_cuda_empty_cache", index);
    return a ? ct__calloc_empty_cache(a) : ct_errcode();
}

/* ------------------------------------------------------------- storage */

static void release_block(void *data, void *ctx) {
    if (ct__calloc_release(ctx, data))
        fprintf(stderr, "ct: releasing device memory: %s\n", ct_errmsg());
}

ct_storage *ct__cuda_storage_new(size_t nbytes, int device) {
    ct__calloc *a = allocator("storage_new", device);
    void *stream = NULL, *ptr = NULL;
    if (!a || ct__cuda_stream(device, &stream) || ct__calloc_alloc(a, nbytes, stream, &ptr))
        return NULL;
    ct_storage *s = ct_storage_from_blob(ptr, nbytes, (ct_device){CT_CUDA, device},
                                         ptr ? release_block : NULL, a);
    if (!s)
        ct__calloc_release(a, ptr);
    return s;
}

/* ------------------------------------------------------------- copies */

ct_tensor *ct_to(ct_tensor *t, ct_device device) {
    const char *fn = "ct_to";
    if (ct__check_handles(fn, &t, 1))
        return NULL;
    ct_device from = ct_tensor_device(t);
    if (from.type == device.type && (device.type == CT_CPU || from.index == device.index))
        return ct__scope_own(ct_tensor_retain(t));
    if (device.type == CT_CUDA && check_device(fn, device.index))
        return NULL;
    /* A view is made contiguous where it is, on the host or the device. */
    ct_tensor *src = ct_contiguous(t);
    if (!src)
        return NULL;
    size_t bytes = (size_t)ct_numel(src) * ct__esize(src->dtype);
    ct_storage *s = device.type == CT_CPU ? ct_storage_new(bytes, device)
                                          : ct__cuda_storage_new(bytes, device.index);
    ct_tensor *out =
        s ? ct_tensor_from_storage(s, 0, src->ndim, src->sizes, NULL, src->dtype) : NULL;
    ct_storage_free(s);
    /* The copy runs on the stream of the device involved (the destination's
     * when both are devices). */
    int on = device.type == CT_CUDA ? device.index : from.index;
    if (out && ct__cuda_copy(on, ct__data(out), ct__data(src), bytes, device.type == CT_CUDA,
                             from.type == CT_CUDA)) {
        ct__release(out);
        return NULL;
    }
    return out;
}
