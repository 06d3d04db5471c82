/* ct's caching allocator for device memory: internal, not installed.
 *
 * Modelled on PyTorch's CUDA caching allocator (docs/cuda-design.md has the
 * design and the sizes it borrows). Memory comes from the device in
 * segments; requests are carved from them as blocks, and a freed block goes
 * back to the cache, never to the device, so that a training step that
 * allocates the same sizes every iteration never calls cudaMalloc after the
 * first. Segments go back to the device only on empty_cache, or when an
 * allocation would otherwise run out of memory.
 *
 * The allocator itself does not know CUDA: it calls a memory backend
 * (ct__devmem) for segments and events. tensor/cuda/device.c gives it the
 * CUDA runtime's; tests give it one on host memory whose events they
 * complete by hand, so that every path here runs without a GPU.
 *
 * Streams. Each block belongs to the stream it was allocated on, and a free
 * block is reused only for that stream: work queued on the stream before the
 * free is ordered before work queued after the reuse. A block that other
 * streams used (ct__cuda_calloc_record_stream) is held back when freed until an
 * event recorded on each of those streams has completed.
 *
 * Errors. Functions return 0 or a negative CT_E* code with a message. Out of
 * memory is CT_ENOMEM with what was asked for, what is allocated and
 * reserved, and what the device has free.
 *
 * Threads. One allocator serves one device; its calls are serialized by its
 * own lock and may come from any thread. The backend's calls are made under
 * that lock. */
#ifndef CT_CACHING_ALLOCATOR_H
#define CT_CACHING_ALLOCATOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What the allocator needs of a device. Streams and events are opaque. */
typedef struct ct__devmem {
    void *ctx;
    /* A segment of bytes: 0, CT_ENOMEM when the device is out of memory, or
     * another code with a message. */
    int (*malloc)(void *ctx, size_t bytes, void **ptr);
    void (*free)(void *ctx, void *ptr);
    /* A new event recorded on stream: 0 or a code with a message. */
    int (*event_record)(void *ctx, void *stream, void **event);
    /* 1 when the event has completed, 0 while pending, < 0 on error. */
    int (*event_query)(void *ctx, void *event);
    void (*event_free)(void *ctx, void *event);
    /* The device's free and total memory, for out-of-memory messages. */
    int (*mem_info)(void *ctx, size_t *free, size_t *total);
} ct__devmem;

typedef struct ct__calloc_stats {
    int64_t allocated;      /* bytes in blocks handed out, rounded */
    int64_t reserved;       /* bytes in segments taken from the device */
    int64_t peak_allocated; /* since creation or ct__cuda_calloc_reset_peak */
    int64_t peak_reserved;
    int64_t requested;      /* bytes asked for by live blocks, unrounded */
    int64_t segments;       /* taken from the device, live */
    int64_t device_mallocs; /* calls to the backend's malloc, ever */
    int64_t device_frees;
    int64_t cache_hits; /* allocations served without a device malloc */
    int64_t allocations;
    int64_t ooms; /* allocations that failed for lack of memory */
} ct__calloc_stats;

typedef struct ct__calloc ct__calloc;

/* A new allocator for device (its index, for messages) over mem, which is
 * copied. NULL with CT_ENOMEM. */
ct__calloc *ct__cuda_calloc_new(const ct__devmem *mem, int device);
/* Returns every segment to the device and frees the allocator. Blocks still
 * handed out are returned too: their memory must no longer be used. */
void ct__cuda_calloc_free(ct__calloc *a);

/* At least bytes of device memory for work on stream (bytes 0 gives NULL
 * and 0). */
int ct__cuda_calloc_alloc(ct__calloc *a, size_t bytes, void *stream, void **ptr);
/* Gives a block back to the cache. CT_EINVAL for a pointer the allocator
 * did not hand out (or handed out and took back). */
int ct__cuda_calloc_release(ct__calloc *a, void *ptr);
/* Marks that work on stream uses the block at ptr, so that freeing it
 * waits for that work. A no-op for the block's own stream. */
int ct__cuda_calloc_record_stream(ct__calloc *a, void *ptr, void *stream);
/* Returns every segment with nothing handed out (and no pending event) to
 * the device. */
int ct__cuda_calloc_empty_cache(ct__calloc *a);

void ct__cuda_calloc_get_stats(ct__calloc *a, ct__calloc_stats *s);
void ct__cuda_calloc_reset_peak(ct__calloc *a);

#endif
