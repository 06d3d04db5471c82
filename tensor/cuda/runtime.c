/* The CUDA device layer over the CUDA runtime API (cuda_impl.h). */
#include "cuda_impl.h"
#include "cuda_kernels.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>

#define MAX_DEVICES 64

/* Streams are made once per device and live as long as the process: work
 * queued on them may outlive any object of ct's. */
static struct {
    pthread_mutex_t lock;
    cudaStream_t streams[MAX_DEVICES];
} rt = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int fail(cudaError_t e, int device, const char *what) {
    /* A failed call leaves its error as the thread's last: clear it, so
     * that it is not reported again by the next call. */
    cudaGetLastError();
    return ct__err_set(e == cudaErrorMemoryAllocation ? CT_ENOMEM : CT_EFOREIGN,
                       "cuda:%d: %s: %s (%s)", device, what, cudaGetErrorString(e),
                       cudaGetErrorName(e));
}

int ct__cuda_count(const char **why) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cudaGetLastError();
        if (why)
            *why = cudaGetErrorString(e);
        return 0;
    }
    if (why)
        *why = n ? "" : "no CUDA device is present";
    return n < MAX_DEVICES ? n : MAX_DEVICES;
}

int ct__cuda_use(int device) {
    cudaError_t e = cudaSetDevice(device);
    return e == cudaSuccess ? 0 : fail(e, device, "cudaSetDevice");
}

int ct__cuda_stream(int device, void **stream) {
    *stream = NULL;
    if (device < 0 || device >= MAX_DEVICES)
        return ct__err_set(CT_EDEVICE, "cuda:%d: no such device", device);
    pthread_mutex_lock(&rt.lock);
    int rc = rt.streams[device] ? 0 : ct__cuda_use(device);
    if (!rc && !rt.streams[device]) {
        cudaError_t e = cudaStreamCreateWithFlags(&rt.streams[device], cudaStreamNonBlocking);
        if (e != cudaSuccess)
            rc = fail(e, device, "creating the compute stream");
    }
    *stream = rt.streams[device];
    pthread_mutex_unlock(&rt.lock);
    return rc;
}

/* ------------------------------------------------ the allocator's backend */

static int dev_malloc(void *ctx, size_t bytes, void **ptr) {
    int device = (int)(intptr_t)ctx;
    int rc = ct__cuda_use(device);
    cudaError_t e = rc ? cudaSuccess : cudaMalloc(ptr, bytes);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return CT_ENOMEM; /* the allocator says what is held */
    }
    return rc ? rc : e == cudaSuccess ? 0 : fail(e, device, "cudaMalloc");
}

/* A segment that cannot be freed means the device is in error; nothing
 * waits for the answer, so it is said on stderr. */
static void dev_free(void *ctx, void *ptr) {
    int device = (int)(intptr_t)ctx;
    cudaError_t e = ct__cuda_use(device) ? cudaSuccess : cudaFree(ptr);
    if (e != cudaSuccess)
        fprintf(stderr, "ct: cuda:%d: cudaFree: %s\n", device, cudaGetErrorString(e));
}

static int event_record(void *ctx, void *stream, void **event) {
    int device = (int)(intptr_t)ctx;
    cudaEvent_t ev = NULL;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess && (e = cudaEventRecord(ev, stream)) != cudaSuccess)
        cudaEventDestroy(ev);
    *event = e == cudaSuccess ? ev : NULL;
    return e == cudaSuccess ? 0 : fail(e, device, "recording an event");
}

static int event_query(void *ctx, void *event) {
    cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess)
        return 1;
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        return 0;
    }
    return fail(e, (int)(intptr_t)ctx, "querying an event");
}

static void event_free(void *ctx, void *event) {
    (void)ctx;
    cudaEventDestroy(event);
}

static int mem_info(void *ctx, size_t *fr, size_t *total) {
    int device = (int)(intptr_t)ctx;
    int rc = ct__cuda_use(device);
    cudaError_t e = rc ? cudaSuccess : cudaMemGetInfo(fr, total);
    return rc ? rc : e == cudaSuccess ? 0 : fail(e, device, "cudaMemGetInfo");
}

int ct__cuda_devmem(int device, ct__devmem *mem) {
    *mem = (ct__devmem){(void *)(intptr_t)device,
                        dev_malloc,
                        dev_free,
                        event_record,
                        event_query,
                        event_free,
                        mem_info};
    return 0;
}

/* ------------------------------------------------------------- copies */

int ct__cuda_launch_on(int device, void **stream) {
    int rc = ct__cuda_stream(device, stream);
    return rc ? rc : ct__cuda_use(device);
}

/* Queues the copy; *stream gets the stream it is on. */
static int copy_on(int device, void *dst, const void *src, size_t n, bool to_device,
                   bool from_device, void **stream) {
    int rc = ct__cuda_launch_on(device, stream);
    if (rc || !n)
        return rc;
    enum cudaMemcpyKind kind =
        to_device ? (from_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                  : (from_device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, *stream);
    return e == cudaSuccess ? 0 : fail(e, device, "copying");
}

int ct__cuda_copy_async(int device, void *dst, const void *src, size_t n, bool to_device,
                        bool from_device) {
    void *stream;
    return copy_on(device, dst, src, n, to_device, from_device, &stream);
}

int ct__cuda_copy(int device, void *dst, const void *src, size_t n, bool to_device,
                  bool from_device) {
    void *stream;
    int rc = copy_on(device, dst, src, n, to_device, from_device, &stream);
    cudaError_t e = rc || !n ? cudaSuccess : cudaStreamSynchronize(stream);
    return rc ? rc : e == cudaSuccess ? 0 : fail(e, device, "copying");
}

int ct__cuda_host_alloc(size_t nbytes, void **ptr) {
    cudaError_t e = cudaHostAlloc(ptr, nbytes, cudaHostAllocDefault);
    if (e == cudaSuccess)
        return 0;
    cudaGetLastError();
    *ptr = NULL;
    return ct__err_set(e == cudaErrorMemoryAllocation ? CT_ENOMEM : CT_EFOREIGN,
                       "cudaHostAlloc of %zu bytes of page-locked memory: %s (%s)", nbytes,
                       cudaGetErrorString(e), cudaGetErrorName(e));
}

/* Freeing fails only when the device is in error; nothing waits for the
 * answer, so it is said on stderr. */
void ct__cuda_host_free(void *ptr) {
    cudaError_t e = cudaFreeHost(ptr);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fprintf(stderr, "ct: cudaFreeHost: %s\n", cudaGetErrorString(e));
    }
}

int ct__cuda_sync(int device) {
    void *stream;
    int rc = ct__cuda_stream(device, &stream);
    cudaError_t e = rc ? cudaSuccess : cudaStreamSynchronize(stream);
    return rc ? rc : e == cudaSuccess ? 0 : fail(e, device, "synchronizing");
}

/* ------------------------------------------------------------- kernels */

int ct__cuda_launched(int e, int device, const char *what) {
    return e ? fail((cudaError_t)e, device, what) : 0;
}

void ct__cuda_iter_of(ct__cuda_iter *k, ct_tensor *const *ts, int n, int nd, const int64_t *sizes) {
    ct__iter it;
    ct__iter_init(&it, ts, n, nd, sizes);
    *k = (ct__cuda_iter){.ndim = it.ndim, .numel = it.numel};
    for (int j = 0; j < n; j++)
        k->data[j] = it.data[j];
    for (int d = 0; d < it.ndim; d++) {
        k->shape[d] = it.shape[d];
        for (int j = 0; j < n; j++)
            k->strides[d][j] = it.strides[d][j];
    }
}

int ct__cuda_copy_tensor(ct_tensor *dst, ct_tensor *src) {
    int device = dst->storage->device.index;
    if (dst->storage->device.type != CT_CUDA || src->storage->device.type != CT_CUDA ||
        src->storage->device.index != device)
        return ct__err_set(CT_EDEVICE, "copy: both tensors must be on one CUDA device");
    ct__cuda_iter k;
    ct__cuda_iter_of(&k, (ct_tensor *[]){dst, src}, 2, dst->ndim, dst->sizes);
    void *stream;
    int rc = ct__cuda_launch_on(device, &stream);
    return rc ? rc
              : ct__cuda_launched(
                    ct__cuda_launch_copy(&k, (int)dst->dtype, (int)src->dtype, stream), device,
                    "the copy kernel");
}

int ct__cuda_binary(int op, ct_tensor *dst, ct_tensor *x, ct_tensor *y, double scalar,
                    ct_dtype dtype, int nd, const int64_t *shape) {
    /* A scalar's place in the iterator is held by x; the kernel ignores
     * it. */
    ct__cuda_iter k;
    ct__cuda_iter_of(&k, (ct_tensor *[]){dst, x, y ? y : x}, 3, nd, shape);
    int device = dst->storage->device.index;
    void *stream;
    int rc = ct__cuda_launch_on(device, &stream);
    return rc ? rc
              : ct__cuda_launched(
                    ct__cuda_launch_binary(&k, op, (int)dtype, y == NULL, scalar, stream), device,
                    "a binary kernel");
}

int ct__cuda_unary(int op, ct_tensor *out, ct_tensor *src, const double p[2], const int64_t ip[2]) {
    ct__cuda_iter k;
    ct__cuda_iter_of(&k, (ct_tensor *[]){out, src}, 2, out->ndim, out->sizes);
    int device = out->storage->device.index;
    void *stream;
    int rc = ct__cuda_launch_on(device, &stream);
    return rc ? rc
              : ct__cuda_launched(ct__cuda_launch_unary(&k, op, (int)out->dtype, p, ip, stream),
                                  device, "a unary kernel");
}

int ct__cuda_fill(ct_tensor *t, double value) {
    ct__cuda_iter k;
    ct__cuda_iter_of(&k, &t, 1, t->ndim, t->sizes);
    int device = t->storage->device.index;
    void *stream;
    int rc = ct__cuda_launch_on(device, &stream);
    return rc ? rc
              : ct__cuda_launched(ct__cuda_launch_fill(&k, (int)t->dtype, value, stream), device,
                                  "the fill kernel");
}
