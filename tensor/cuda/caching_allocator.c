/* The caching allocator for device memory (caching_allocator.h). */
#include "caching_allocator.h"

#include "tensor_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* Sizes as in PyTorch's CUDA caching allocator (docs/cuda-design.md):
 * requests round up to 512 bytes; those of 1 MiB or less are small and
 * come from 2 MiB segments; larger ones under 10 MiB come from 20 MiB
 * segments, and the rest from segments of their size rounded to 2 MiB. A
 * block splits when what is left is a block's worth: 512 bytes in the small
 * pool, over 1 MiB in the large one, so that large segments do not crumble
 * into pieces no large request fits. */
#define MIN_BLOCK     ((size_t)512)
#define SMALL_SIZE    ((size_t)1 << 20)
#define SMALL_SEGMENT ((size_t)2 << 20)
#define MIN_LARGE     ((size_t)10 << 20)
#define LARGE_SEGMENT ((size_t)20 << 20)
#define ROUND_LARGE   ((size_t)2 << 20)

typedef struct block {
    char *ptr;
    size_t size, requested;
    void *stream;
    bool small, allocated;
    int pending;               /* events still to complete before it is free */
    struct block *prev, *next; /* neighbours in its segment, by address */
    struct block *hnext;       /* the live table's chain */
    void **uses;               /* other streams that used it */
    int nuses, cap_uses;
} block;

/* Free blocks of one pool, ordered by (stream, size, address): the best fit
 * for a stream is the first at or after (stream, size). */
typedef struct pool {
    block **v;
    int n, cap;
} pool;

typedef struct pending_event {
    void *event;
    block *b;
} pending_event;

struct ct__calloc {
    pthread_mutex_t lock;
    ct__devmem mem;
    int device;
    pool small, large;
    block **table; /* live blocks by address */
    size_t nbuckets, nlive;
    pending_event *events;
    int nevents, cap_events;
    /* Blocks other streams used whose event could not be recorded: never
     * reused, since that could race the other stream's work. */
    block *lost;
    ct__calloc_stats st;
};

/* ------------------------------------------------------------ the pools */

static int key_cmp(const block *b, void *stream, size_t size, const char *ptr) {
    if (b->stream != stream)
        return (uintptr_t)b->stream < (uintptr_t)stream ? -1 : 1;
    if (b->size != size)
        return b->size < size ? -1 : 1;
    return b->ptr < ptr ? -1 : b->ptr > ptr;
}

/* The first index whose block is not before (stream, size, ptr). */
static int lower_bound(const pool *p, void *stream, size_t size, const char *ptr) {
    int lo = 0, hi = p->n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (key_cmp(p->v[mid], stream, size, ptr) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int pool_insert(pool *p, block *b) {
    CT_TRY(CT__GROW(p->v, &p->cap, p->n + 1, 0, "caching allocator: free blocks"));
    int at = lower_bound(p, b->stream, b->size, b->ptr);
    memmove(&p->v[at + 1], &p->v[at], (size_t)(p->n - at) * sizeof *p->v);
    p->v[at] = b;
    p->n++;
    return 0;
}

static void pool_remove(pool *p, block *b) {
    int at = lower_bound(p, b->stream, b->size, b->ptr);
    CT_ASSERT(at < p->n && p->v[at] == b);
    memmove(&p->v[at], &p->v[at + 1], (size_t)(p->n - at - 1) * sizeof *p->v);
    p->n--;
}

static pool *pool_of(ct__calloc *a, const block *b) { return b->small ? &a->small : &a->large; }

/* ------------------------------------------------------- the live table */

static size_t bucket(const ct__calloc *a, const void *ptr) {
    uint64_t h = (uint64_t)(uintptr_t)ptr * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & (a->nbuckets - 1);
}

static int table_grow(ct__calloc *a) {
    size_t n = a->nbuckets ? 2 * a->nbuckets : 256;
    block **t = calloc(n, sizeof *t);
    if (!t)
        return ct__err_set(CT_ENOMEM, "caching allocator: out of host memory");
    block **old = a->table;
    size_t nold = a->nbuckets;
    a->table = t;
    a->nbuckets = n;
    for (size_t i = 0; i < nold; i++)
        for (block *b = old[i], *next; b; b = next) {
            next = b->hnext;
            size_t k = bucket(a, b->ptr);
            b->hnext = t[k];
            t[k] = b;
        }
    free(old);
    return 0;
}

static int table_add(ct__calloc *a, block *b) {
    if (a->nlive >= a->nbuckets) {
        int rc = table_grow(a);
        if (rc)
            return rc;
    }
    size_t k = bucket(a, b->ptr);
    b->hnext = a->table[k];
    a->table[k] = b;
    a->nlive++;
    return 0;
}

/* The link that holds the live block at ptr, or NULL. */
static block **table_find(ct__calloc *a, const void *ptr) {
    if (!a->nbuckets)
        return NULL;
    block **p = &a->table[bucket(a, ptr)];
    while (*p && (*p)->ptr != ptr)
        p = &(*p)->hnext;
    return *p ? p : NULL;
}

static block *table_take(ct__calloc *a, const void *ptr) {
    block **p = table_find(a, ptr), *b = p ? *p : NULL;
    if (b) {
        *p = b->hnext;
        a->nlive--;
    }
    return b;
}

/* ----------------------------------------------------------- the blocks */

static size_t round_size(size_t bytes) {
    return bytes < MIN_BLOCK ? MIN_BLOCK : (bytes + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

static size_t segment_size(size_t size) {
    if (size <= SMALL_SIZE)
        return SMALL_SEGMENT;
    if (size < MIN_LARGE)
        return LARGE_SEGMENT;
    return (size + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

static bool is_free(const block *b) { return b && !b->allocated && !b->pending; }

/* A free block goes back to its pool, merged with free neighbours. */
static int put_back(ct__calloc *a, block *b) {
    pool *p = pool_of(a, b);
    block *prev = b->prev, *next = b->next;
    if (is_free(prev)) {
        pool_remove(p, prev);
        prev->size += b->size;
        prev->next = next;
        if (next)
            next->prev = prev;
        free(b->uses);
        free(b);
        b = prev;
    }
    if (is_free(next)) {
        pool_remove(p, next);
        b->size += next->size;
        b->next = next->next;
        if (next->next)
            next->next->prev = b;
        free(next->uses);
        free(next);
    }
    return pool_insert(p, b);
}

/* Blocks held back for other streams whose events have all completed go
 * back to their pools. */
static int process_events(ct__calloc *a) {
    int rc = 0, kept = 0;
    for (int i = 0; i < a->nevents; i++) {
        pending_event e = a->events[i];
        int done = rc ? 0 : a->mem.event_query(a->mem.ctx, e.event);
        if (done < 0)
            rc = done;
        if (done <= 0) {
            a->events[kept++] = e;
            continue;
        }
        a->mem.event_free(a->mem.ctx, e.event);
        if (--e.b->pending == 0 && !rc)
            rc = put_back(a, e.b);
    }
    a->nevents = kept;
    return rc;
}

/* Returns every whole free segment to the device. */
static void release_segments(ct__calloc *a) {
    pool *pools[2] = {&a->small, &a->large};
    for (int k = 0; k < 2; k++) {
        pool *p = pools[k];
        int kept = 0;
        for (int i = 0; i < p->n; i++) {
            block *b = p->v[i];
            if (b->prev || b->next) {
                p->v[kept++] = b;
                continue;
            }
            a->mem.free(a->mem.ctx, b->ptr);
            a->st.reserved -= (int64_t)b->size;
            a->st.segments--;
            a->st.device_frees++;
            free(b->uses);
            free(b);
        }
        p->n = kept;
    }
}

static const char *fmt_bytes(char *buf, size_t cap, double bytes) {
    static const char *units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        u++;
    }
    snprintf(buf, cap, u ? "%.2f %s" : "%.0f %s", bytes, units[u]);
    return buf;
}

static int out_of_memory(ct__calloc *a, size_t bytes) {
    size_t dev_free = 0, dev_total = 0;
    bool info = a->mem.mem_info && !a->mem.mem_info(a->mem.ctx, &dev_free, &dev_total);
    char asked[32], alloc[32], reserved[32], cached[32], fr[32], tot[32];
    a->st.ooms++;
    return ct__err_set(
        CT_ENOMEM,
        "CUDA out of memory on device %d: tried to allocate %s; ct has %s allocated and %s "
        "reserved (%s of it cached, and returned to the device before this failed)%s%s%s%s%s",
        a->device, fmt_bytes(asked, sizeof asked, (double)bytes),
        fmt_bytes(alloc, sizeof alloc, (double)a->st.allocated),
        fmt_bytes(reserved, sizeof reserved, (double)a->st.reserved),
        fmt_bytes(cached, sizeof cached, (double)(a->st.reserved - a->st.allocated)),
        info ? "; the device has " : "", info ? fmt_bytes(fr, sizeof fr, (double)dev_free) : "",
        info ? " free of " : "", info ? fmt_bytes(tot, sizeof tot, (double)dev_total) : "",
        info ? " (other processes may hold the rest)" : "");
}

/* A new segment for a block of size on stream. */
static int new_segment(ct__calloc *a, size_t size, size_t bytes, void *stream, block **out) {
    size_t seg = segment_size(size);
    block *b = calloc(1, sizeof *b);
    if (!b)
        return ct__err_set(CT_ENOMEM, "caching allocator: out of host memory");
    void *ptr = NULL;
    a->st.device_mallocs++;
    int rc = a->mem.malloc(a->mem.ctx, seg, &ptr);
    if (rc == CT_ENOMEM) {
        /* What the cache holds may be what the request needs. */
        release_segments(a);
        a->st.device_mallocs++;
        rc = a->mem.malloc(a->mem.ctx, seg, &ptr);
        if (rc == CT_ENOMEM)
            rc = out_of_memory(a, bytes);
    }
    if (rc) {
        free(b);
        return rc;
    }
    *b = (block){.ptr = ptr, .size = seg, .stream = stream, .small = size <= SMALL_SIZE};
    a->st.reserved += (int64_t)seg;
    a->st.segments++;
    if (a->st.reserved > a->st.peak_reserved)
        a->st.peak_reserved = a->st.reserved;
    *out = b;
    return 0;
}

/* ------------------------------------------------------------------ API */

ct__calloc *ct__cuda_calloc_new(const ct__devmem *mem, int device) {
    ct__calloc *a = calloc(1, sizeof *a);
    if (!a) {
        ct__err_set(CT_ENOMEM, "caching allocator: out of host memory");
        return NULL;
    }
    pthread_mutex_init(&a->lock, NULL);
    a->mem = *mem;
    a->device = device;
    return a;
}

void ct__cuda_calloc_free(ct__calloc *a) {
    if (!a)
        return;
    for (int i = 0; i < a->nevents; i++)
        a->mem.event_free(a->mem.ctx, a->events[i].event);
    /* Every block is in a pool, the live table or the pending events;
     * segments are freed through their first block. */
    block *all = NULL;
    for (size_t i = 0; i < a->nbuckets; i++)
        for (block *b = a->table[i], *next; b; b = next) {
            next = b->hnext;
            b->hnext = all;
            all = b;
        }
    for (block *b = a->lost, *next; b; b = next) {
        next = b->hnext;
        b->hnext = all;
        all = b;
    }
    for (int i = 0; i < a->nevents; i++)
        if (a->events[i].b->pending-- == 1) {
            a->events[i].b->hnext = all;
            all = a->events[i].b;
        }
    pool *pools[2] = {&a->small, &a->large};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < pools[k]->n; i++) {
            pools[k]->v[i]->hnext = all;
            all = pools[k]->v[i];
        }
    while (all) {
        block *next = all->hnext;
        if (!all->prev)
            a->mem.free(a->mem.ctx, all->ptr);
        free(all->uses);
        free(all);
        all = next;
    }
    free(a->small.v);
    free(a->large.v);
    free(a->table);
    free(a->events);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

int ct__cuda_calloc_alloc(ct__calloc *a, size_t bytes, void *stream, void **ptr) {
    *ptr = NULL;
    if (!bytes)
        return 0;
    if (bytes > SIZE_MAX / 2)
        return ct__err_set(CT_ENOMEM, "CUDA out of memory on device %d: %zu bytes asked for",
                           a->device, bytes);
    size_t size = round_size(bytes);
    pthread_mutex_lock(&a->lock);
    int rc = process_events(a);
    pool *p = size <= SMALL_SIZE ? &a->small : &a->large;
    int at = rc ? p->n : lower_bound(p, stream, size, NULL);
    block *b = at < p->n && p->v[at]->stream == stream ? p->v[at] : NULL;
    if (b) {
        pool_remove(p, b);
        a->st.cache_hits++;
    } else if (!rc) {
        rc = new_segment(a, size, bytes, stream, &b);
    }
    size_t rest = b ? b->size - size : 0;
    if (!rc && (b->small ? rest >= MIN_BLOCK : rest > SMALL_SIZE)) {
        block *r = calloc(1, sizeof *r);
        if (r) {
            *r = (block){.ptr = b->ptr + size,
                         .size = rest,
                         .stream = stream,
                         .small = b->small,
                         .prev = b,
                         .next = b->next};
            if (b->next)
                b->next->prev = r;
            b->next = r;
            b->size = size;
            rc = pool_insert(p, r);
        }
    }
    if (!rc)
        rc = table_add(a, b);
    if (rc && b) {
        put_back(a, b);
    } else if (!rc) {
        b->allocated = true;
        b->requested = bytes;
        a->st.allocated += (int64_t)b->size;
        a->st.requested += (int64_t)bytes;
        a->st.allocations++;
        if (a->st.allocated > a->st.peak_allocated)
            a->st.peak_allocated = a->st.allocated;
        *ptr = b->ptr;
    }
    pthread_mutex_unlock(&a->lock);
    return rc;
}

int ct__cuda_calloc_release(ct__calloc *a, void *ptr) {
    if (!ptr)
        return 0;
    pthread_mutex_lock(&a->lock);
    block *b = table_take(a, ptr);
    int rc = b ? 0
               : ct__err_set(CT_EINVAL,
                             "caching allocator: %p on device %d was not allocated here, or was "
                             "freed already",
                             ptr, a->device);
    if (b) {
        b->allocated = false;
        a->st.allocated -= (int64_t)b->size;
        a->st.requested -= (int64_t)b->requested;
    }
    /* Other streams that used it: it waits for their work. */
    for (int i = 0; b && i < b->nuses && !rc; i++) {
        if ((rc = CT__GROW(a->events, &a->cap_events, a->nevents + 1, 0,
                           "caching allocator: pending events")))
            break;
        void *event = NULL;
        rc = a->mem.event_record(a->mem.ctx, b->uses[i], &event);
        if (!rc) {
            a->events[a->nevents++] = (pending_event){event, b};
            b->pending++;
        }
    }
    if (b && rc) {
        b->pending = -1; /* never 0 again: not free, ever */
        b->hnext = a->lost;
        a->lost = b;
    } else if (b) {
        b->nuses = 0;
        if (!b->pending)
            rc = put_back(a, b);
    }
    pthread_mutex_unlock(&a->lock);
    return rc;
}

int ct__cuda_calloc_record_stream(ct__calloc *a, void *ptr, void *stream) {
    pthread_mutex_lock(&a->lock);
    block **slot = table_find(a, ptr), *b = slot ? *slot : NULL;
    int rc = b ? 0
               : ct__err_set(CT_EINVAL,
                             "caching allocator: record_stream: %p on device %d is not a live "
                             "block's start",
                             ptr, a->device);
    bool known = !b || b->stream == stream;
    for (int i = 0; b && i < b->nuses && !known; i++)
        known = b->uses[i] == stream;
    if (!rc && !known)
        rc = CT__GROW(b->uses, &b->cap_uses, b->nuses + 1, 0,
                      "caching allocator: a block's streams");
    if (!rc && !known)
        b->uses[b->nuses++] = stream;
    pthread_mutex_unlock(&a->lock);
    return rc;
}

int ct__cuda_calloc_empty_cache(ct__calloc *a) {
    pthread_mutex_lock(&a->lock);
    int rc = process_events(a);
    release_segments(a);
    pthread_mutex_unlock(&a->lock);
    return rc;
}

void ct__cuda_calloc_get_stats(ct__calloc *a, ct__calloc_stats *s) {
    pthread_mutex_lock(&a->lock);
    *s = a->st;
    pthread_mutex_unlock(&a->lock);
}

void ct__cuda_calloc_reset_peak(ct__calloc *a) {
    pthread_mutex_lock(&a->lock);
    a->st.peak_allocated = a->st.allocated;
    a->st.peak_reserved = a->st.reserved;
    pthread_mutex_unlock(&a->lock);
}
