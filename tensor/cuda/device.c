/* CUDA devices, their caching allocators, device storage and copies
 * (ct/cuda.h). */
#include <ct/cuda.h>

#include "cuda_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

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
        return ct__err_set(CT_EDEVICE, "%s: cuda:%d: there is no CUDA device: %s", fn, index,
                           D.why);
    return ct__err_set(CT_EDEVICE, "%s: cuda:%d: no such device (this process sees %d: cuda:0-%d)",
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

static atomic_bool tf32;

void ct_cuda_set_tf32(bool enabled) { atomic_store(&tf32, enabled); }

bool ct_cuda_tf32_enabled(void) { return atomic_load(&tf32); }

/* The device's allocator, made on first use. */
static ct__calloc *allocator(const char *fn, int index) {
    if (check_device(fn, index))
        return NULL;
    pthread_mutex_lock(&D.lock);
    ct__devmem mem;
    if (!D.alloc[index] && !ct__cuda_devmem(index, &mem))
        D.alloc[index] = ct__cuda_calloc_new(&mem, index);
    ct__calloc *a = D.alloc[index];
    pthread_mutex_unlock(&D.lock);
    return a;
}

int ct_cuda_memory_stats_get(int index, ct_cuda_memory_stats *out) {
    ct__calloc *a = allocator("ct_cuda_memory_stats_get", index);
    if (!a)
        return ct_errcode();
    ct__calloc_stats s;
    ct__cuda_calloc_get_stats(a, &s);
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
        ct__cuda_calloc_reset_peak(a);
    return a ? 0 : ct_errcode();
}

int ct_cuda_empty_cache(int index) {
    ct__calloc *a = allocator("ct_cuda_empty_cache", index);
    return a ? ct__cuda_calloc_empty_cache(a) : ct_errcode();
}

/* ------------------------------------------------------------- storage */

static void release_block(void *data, void *ctx) {
    if (ct__cuda_calloc_release(ctx, data))
        fprintf(stderr, "ct: releasing device memory: %s\n", ct_errmsg());
}

ct_storage *ct__cuda_storage_new(const char *op, size_t nbytes, int device) {
    ct__calloc *a = allocator(op, device);
    void *stream = NULL, *ptr = NULL;
    if (!a || ct__cuda_stream(device, &stream) || ct__cuda_calloc_alloc(a, nbytes, stream, &ptr))
        return NULL;
    ct_storage *s = ct_storage_from_blob(ptr, nbytes, (ct_device){CT_CUDA, device},
                                         ptr ? release_block : NULL, a);
    if (!s)
        ct__cuda_calloc_release(a, ptr);
    return s;
}

/* ------------------------------------------------------- pinned memory
 *
 * Page-locked host memory comes from a cache, as in PyTorch's caching host
 * allocator: cudaHostAlloc takes milliseconds, and cudaFreeHost waits for
 * the device. Sizes round up to a power of two (4 KiB at least). A block
 * that an asynchronous copy used keeps that copy's event; freed, it waits
 * in its size's list until the events have completed, and is then reused.
 * So a pinned source may be freed as soon as ct_to_async returns. */

#define PIN_MIN_SHIFT 12
#define PIN_BINS      64

typedef struct pin_event {
    int device;
    void *event;
} pin_event;

typedef struct pin_block {
    void *ptr;
    int bin;           /* holds 2^bin bytes */
    pin_event *events; /* the last copy in flight on each device's stream */
    int nevents, cap;
    struct pin_block *next; /* in a free list */
} pin_block;

static struct {
    pthread_mutex_t lock;
    pin_block *free[PIN_BINS];
} P = {.lock = PTHREAD_MUTEX_INITIALIZER};

static ct__devmem devmem_of(int device) {
    ct__devmem mem;
    ct__cuda_devmem(device, &mem);
    return mem;
}

/* Drops b's completed events; whether none is left. Under P.lock. An event
 * that cannot be queried means the device failed: its copy is over. */
static bool pin_idle(pin_block *b) {
    int kept = 0;
    for (int i = 0; i < b->nevents; i++) {
        ct__devmem mem = devmem_of(b->events[i].device);
        if (mem.event_query(mem.ctx, b->events[i].event) == 0)
            b->events[kept++] = b->events[i];
        else
            mem.event_free(mem.ctx, b->events[i].event);
    }
    b->nevents = kept;
    return kept == 0;
}

static void pin_release(void *data, void *ctx) {
    (void)data;
    pin_block *b = ctx;
    pthread_mutex_lock(&P.lock);
    b->next = P.free[b->bin];
    P.free[b->bin] = b;
    pthread_mutex_unlock(&P.lock);
}

static pin_block *pin_alloc(size_t nbytes) {
    int bin = PIN_MIN_SHIFT;
    while (bin < PIN_BINS - 1 && ((size_t)1 << bin) < nbytes)
        bin++;
    if (((size_t)1 << bin) < nbytes) {
        ct__err_set(CT_ENOMEM, "ct_empty_pinned: %zu bytes is more than can be pinned", nbytes);
        return NULL;
    }
    pin_block *b = NULL;
    pthread_mutex_lock(&P.lock);
    for (pin_block **pp = &P.free[bin]; *pp; pp = &(*pp)->next)
        if (pin_idle(*pp)) {
            b = *pp;
            *pp = b->next;
            break;
        }
    pthread_mutex_unlock(&P.lock);
    if (b)
        return b;
    b = calloc(1, sizeof *b);
    if (!b) {
        ct__err_set(CT_ENOMEM, "ct_empty_pinned: out of memory");
        return NULL;
    }
    b->bin = bin;
    if (ct__cuda_host_alloc((size_t)1 << bin, &b->ptr)) {
        free(b);
        return NULL;
    }
    return b;
}

/* Records, on device's compute stream, that b's copies queued so far must
 * complete before b is reused. A stream runs in order, so the new event
 * replaces the device's older one. */
static int pin_record(pin_block *b, int device) {
    ct__devmem mem = devmem_of(device);
    void *stream, *event;
    int rc = ct__cuda_stream(device, &stream);
    if (rc || (rc = mem.event_record(mem.ctx, stream, &event)))
        return rc;
    pthread_mutex_lock(&P.lock);
    int i = 0;
    while (i < b->nevents && b->events[i].device != device)
        i++;
    if (i < b->nevents) {
        mem.event_free(mem.ctx, b->events[i].event);
    } else if (CT__GROW(b->events, &b->cap, b->nevents + 1, 0, "ct_to_async: events")) {
        pthread_mutex_unlock(&P.lock);
        mem.event_free(mem.ctx, event);
        return ct_errcode();
    }
    b->events[i] = (pin_event){device, event};
    if (i == b->nevents)
        b->nevents++;
    pthread_mutex_unlock(&P.lock);
    return 0;
}

/* The block under t's storage, or NULL if t is not pinned. */
static pin_block *pinned_block(const ct_tensor *t) {
    return t->storage->free_fn == pin_release ? t->storage->free_ctx : NULL;
}

bool ct_is_pinned(const ct_tensor *t) {
    return t && t->magic == CT__TENSOR_MAGIC && pinned_block(t) != NULL;
}

/* A new pinned host tensor; errors are reported as fn's. */
static ct_tensor *pinned_new(const char *fn, int ndim, const int64_t *sizes, ct_dtype dtype) {
    if (ct__tensor_check_shape(fn, ndim, sizes, dtype))
        return NULL;
    if (!ct_cuda_device_count()) {
        ct__err_set(CT_EDEVICE, "%s: page-locked memory needs a CUDA device: %s", fn, D.why);
        return NULL;
    }
    size_t bytes = (size_t)ct__tensor_numel(ndim, sizes) * ct__esize(dtype);
    pin_block *b = pin_alloc(bytes);
    if (!b)
        return NULL;
    ct_storage *s = ct_storage_from_blob(b->ptr, bytes, CT_DEVICE_CPU, pin_release, b);
    if (!s) {
        pin_release(b->ptr, b);
        return NULL;
    }
    ct_tensor *t = ct_tensor_from_storage(s, 0, ndim, sizes, NULL, dtype);
    ct_storage_free(s);
    return t;
}

ct_tensor *ct_empty_pinned(int ndim, const int64_t *sizes, ct_dtype dtype) {
    return pinned_new("ct_empty_pinned", ndim, sizes, dtype);
}

ct_tensor *ct_pin_memory(ct_tensor *t) {
    const char *fn = "ct_pin_memory";
    if (ct__tensor_check_handles(fn, &t, 1))
        return NULL;
    if (t->storage->device.type != CT_CPU) {
        ct__err_set(CT_EDEVICE, "%s: the tensor is on cuda:%d; only host memory is pinned", fn,
                    t->storage->device.index);
        return NULL;
    }
    if (ct_is_pinned(t))
        return ct__tensor_scope_own(ct_tensor_retain(t));
    ct_tensor *out = pinned_new(fn, t->ndim, t->sizes, t->dtype);
    if (out)
        ct__cpu_copy_into(out, t);
    return out;
}

int ct_cuda_empty_pinned_cache(void) {
    pthread_mutex_lock(&P.lock);
    for (int bin = 0; bin < PIN_BINS; bin++)
        for (pin_block **pp = &P.free[bin]; *pp;) {
            pin_block *b = *pp;
            if (!pin_idle(b)) {
                pp = &b->next;
                continue;
            }
            *pp = b->next;
            ct__cuda_host_free(b->ptr);
            free(b->events);
            free(b);
        }
    pthread_mutex_unlock(&P.lock);
    return 0;
}

/* ------------------------------------------------------------- copies */

/* ct_to, and ct_to_async when async: a copy to device, in which the host
 * does not wait if the host side is pinned. */
ct_tensor *ct__cuda_to(const char *fn, ct_tensor *t, ct_device device, bool async) {
    if (ct__tensor_check_handles(fn, &t, 1))
        return NULL;
    ct_device from = ct_tensor_device(t);
    if (from.type == device.type && (device.type == CT_CPU || from.index == device.index))
        return ct__tensor_scope_own(ct_tensor_retain(t));
    if (device.type == CT_CUDA && check_device(fn, device.index))
        return NULL;
    bool to_device = device.type == CT_CUDA, from_device = from.type == CT_CUDA;
    /* From pageable memory, or between devices, the copy waits. */
    async =
        async && (to_device ? !from_device && pinned_block(t) && ct_is_contiguous(t) : from_device);
    /* A view is made contiguous where it is, on the host or the device. */
    ct_tensor *src = ct_contiguous(t);
    if (!src)
        return NULL;
    size_t bytes = (size_t)ct_numel(src) * ct__esize(src->dtype);
    ct_tensor *out = NULL;
    if (async && !to_device) {
        out = pinned_new(fn, src->ndim, src->sizes, src->dtype);
    } else {
        ct_storage *s = to_device ? ct__cuda_storage_new(fn, bytes, device.index)
                                  : ct_storage_new(bytes, device);
        out = s ? ct_tensor_from_storage(s, 0, src->ndim, src->sizes, NULL, src->dtype) : NULL;
        ct_storage_free(s);
    }
    /* The copy runs on the stream of the device involved (the destination's
     * when both are devices: the source's work is waited for first). */
    int on = to_device ? device.index : from.index;
    int rc = !out ? ct_errcode() : to_device && from_device ? ct__cuda_sync(from.index) : 0;
    if (!rc && !async)
        rc = ct__cuda_copy(on, ct__data(out), ct__data(src), bytes, to_device, from_device);
    if (!rc && async) {
        rc = ct__cuda_copy_async(on, ct__data(out), ct__data(src), bytes, to_device, from_device);
        /* Without its event the pinned block could be reused while the copy
         * reads or writes it. */
        if (!rc && pin_record(pinned_block(to_device ? src : out), on))
            rc = ct__cuda_sync(on) ? ct_errcode() : 0;
    }
    ct__tensor_release(src);
    if (rc && out) {
        ct__tensor_release(out);
        out = NULL;
    }
    return out;
}

/* ------------------------------------------------ streams, for collectives */

int ct__cuda_record_stream(ct_tensor *t, void *stream) {
    ct_storage *s = t->storage;
    /* Memory the caller brought (ct_storage_from_blob) is the caller's to
     * keep alive; only the allocator's blocks are reused behind its back. */
    if (s->device.type != CT_CUDA || s->free_fn != release_block || !s->data)
        return 0;
    return ct__cuda_calloc_record_stream(s->free_ctx, s->data, stream);
}
