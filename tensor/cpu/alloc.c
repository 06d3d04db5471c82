/* CPU memory for storages.
 *
 * Storages of a few KiB or less never come here: their data shares a heap
 * block with the storage header (tensor.c). Small blocks come from
 * posix_memalign. Large blocks (>= 64 KiB) are mapped directly, advised to
 * use transparent huge pages, and kept in a bounded cache when freed: a
 * training step allocates the same large sizes every iteration, and
 * returning them to the kernel would make every step page-fault its
 * activations and gradients in again. glibc maps blocks from 128 KiB up
 * itself and unmaps them on free, which is exactly that; measured on the
 * Fashion-MNIST MLP, the page clearing took 14% of a training step. Sizes
 * are rounded to classes four per power of two, so a cached block is at
 * most 25% larger than asked for.
 *
 * Sanitizer builds bypass the cache so that ASan sees every allocation. */
#include "tensor_impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CT__ALLOC_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CT__ALLOC_SANITIZED 1
#endif
#endif
#ifndef CT__ALLOC_SANITIZED
#define CT__ALLOC_SANITIZED 0
#endif

#define LARGE    ((size_t)1 << 16)
#define NCLASSES (64 * 4)

typedef struct free_block {
    struct free_block *next;
} free_block;

static struct {
    pthread_mutex_t lock;
    free_block *heads[NCLASSES];
    size_t cached, limit;
    bool limit_read;
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Class index and rounded size for n >= LARGE. */
static int size_class(size_t n, size_t *rounded) {
    int k = 63 - __builtin_clzll((unsigned long long)n); /* 2^k <= n */
    size_t step = (size_t)1 << (k - 2);
    size_t r = (n + step - 1) / step * step; /* 4 steps per doubling */
    int j = (int)(r >> (k - 2)) - 4;         /* 0..4; 4 means 2^(k+1) */
    *rounded = r;
    return k * 4 + j;
}

static size_t cache_limit(void) {
    if (!cache.limit_read) {
        const char *env = getenv("CT_CPU_CACHE_MB");
        long mb = env && *env ? strtol(env, NULL, 10) : 2048;
        cache.limit = mb > 0 ? (size_t)mb << 20 : 0;
        cache.limit_read = true;
    }
    return cache.limit;
}

void *ct__cpu_alloc(size_t nbytes, size_t *capacity) {
    if (CT__ALLOC_SANITIZED || nbytes < LARGE) {
        void *p = NULL;
        size_t n = (nbytes + 63) & ~(size_t)63;
        if (n < nbytes || posix_memalign(&p, 64, n ? n : 64) != 0)
            return NULL;
        *capacity = 0; /* 0 marks a heap block */
        return p;
    }
    size_t rounded;
    int c = size_class(nbytes, &rounded);
    pthread_mutex_lock(&cache.lock);
    free_block *b = cache.heads[c];
    if (b) {
        cache.heads[c] = b->next;
        cache.cached -= rounded;
    }
    pthread_mutex_unlock(&cache.lock);
    if (!b) {
        void *p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
        madvise(p, rounded, MADV_HUGEPAGE);
        b = p;
    }
    *capacity = rounded;
    return b;
}

void ct__cpu_free(void *p, size_t capacity) {
    if (capacity == 0) {
        free(p);
        return;
    }
    size_t rounded;
    int c = size_class(capacity, &rounded);
    pthread_mutex_lock(&cache.lock);
    if (cache.cached + capacity <= cache_limit()) {
        free_block *b = p;
        b->next = cache.heads[c];
        cache.heads[c] = b;
        cache.cached += capacity;
        p = NULL;
    }
    pthread_mutex_unlock(&cache.lock);
    if (p)
        munmap(p, capacity);
}

/* The child of a fork inherits the cache's memory but not the thread that
 * may have held its lock. */
static void alloc_atfork_prepare(void) { pthread_mutex_lock(&cache.lock); }
static void alloc_atfork_parent(void) { pthread_mutex_unlock(&cache.lock); }
static void alloc_atfork_child(void) { pthread_mutex_init(&cache.lock, NULL); }

__attribute__((constructor)) static void alloc_register_atfork(void) {
    pthread_atfork(alloc_atfork_prepare, alloc_atfork_parent, alloc_atfork_child);
}
