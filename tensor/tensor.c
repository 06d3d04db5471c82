/* Storage, tensor objects, scopes, accessors and the autograd hook. */
#include "cpu_impl.h"
#include "device_impl.h"
#include "tensor_impl.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

/* ---------------------------------------------------------------- storage */

static void free_cpu(void *data, void *ctx) { ct__cpu_free(data, (size_t)(uintptr_t)ctx); }

/* Bytes of live storages ct allocated on the CPU, and their high-water
 * mark. */
static atomic_llong cpu_allocated, cpu_peak;

static void count_alloc(long long nbytes) {
    long long now =
        atomic_fetch_add_explicit(&cpu_allocated, nbytes, memory_order_relaxed) + nbytes;
    long long peak = atomic_load_explicit(&cpu_peak, memory_order_relaxed);
    while (now > peak && !atomic_compare_exchange_weak(&cpu_peak, &peak, now))
        ;
}

/* CT_MEMORY_LIMIT: the most bytes of CPU storage ct holds at once (0: no
 * limit), read once; a value that is not a byte count makes every
 * allocation fail, saying so. */
static long long memory_limit;
static const char *memory_limit_bad;
static pthread_once_t memory_limit_once = PTHREAD_ONCE_INIT;

static void read_memory_limit(void) {
    const char *env = getenv("CT_MEMORY_LIMIT");
    if (!env || !*env)
        return;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(env, &end, 10);
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    end += shift != 0;
    if (errno || end == env || *end || *env == '-' || v > (unsigned long long)LLONG_MAX >> shift)
        memory_limit_bad = env;
    else
        memory_limit = (long long)(v << shift);
}

/* Counts nbytes about to be allocated for op, or fails with CT_ENOMEM when
 * they would take ct past CT_MEMORY_LIMIT (nothing is counted then). */
static int charge(long long nbytes, const char *op) {
    pthread_once(&memory_limit_once, read_memory_limit);
    if (memory_limit_bad)
        return ct__err_set(CT_EINVAL,
                           "%s: CT_MEMORY_LIMIT='%s' is not a byte count (N, or N with K, M or G "
                           "after it)",
                           op, memory_limit_bad);
    long long now =
        atomic_fetch_add_explicit(&cpu_allocated, nbytes, memory_order_relaxed) + nbytes;
    if (memory_limit > 0 && now > memory_limit) {
        atomic_fetch_sub_explicit(&cpu_allocated, nbytes, memory_order_relaxed);
        return ct__err_set(CT_ENOMEM,
                           "%s: %lld bytes more would take ct's CPU memory to %lld bytes, past "
                           "CT_MEMORY_LIMIT=%lld",
                           op, nbytes, now, memory_limit);
    }
    long long peak = atomic_load_explicit(&cpu_peak, memory_order_relaxed);
    while (now > peak && !atomic_compare_exchange_weak(&cpu_peak, &peak, now))
        ;
    return 0;
}

int64_t ct__cpu_memory_allocated(void) { return atomic_load(&cpu_allocated); }

int64_t ct__cpu_memory_peak(void) { return atomic_load(&cpu_peak); }

void ct__cpu_memory_reset_peak(void) { atomic_store(&cpu_peak, atomic_load(&cpu_allocated)); }

/* The device's own statistics: a CUDA device's come from its caching
 * allocator (they were 0 before, so gpt's peak_bytes was wrong there). 0
 * for a device type this build lacks. */
int64_t ct_memory_allocated(ct_device device) {
    const ct__device_ops *ops = ct__device_ops_of(device.type);
    return ops && ops->memory_allocated ? ops->memory_allocated(device.index) : 0;
}

int64_t ct_memory_peak(ct_device device) {
    const ct__device_ops *ops = ct__device_ops_of(device.type);
    return ops && ops->memory_peak ? ops->memory_peak(device.index) : 0;
}

void ct_memory_reset_peak(ct_device device) {
    const ct__device_ops *ops = ct__device_ops_of(device.type);
    if (ops && ops->memory_reset_peak)
        ops->memory_reset_peak(device.index);
}

/* Data up to this size lives in the same heap block as the storage header
 * (and the tensor object, for ct__tensor_new): one malloc per tensor instead of
 * three, and no posix_memalign, whose split-off fragments cost glibc more
 * than a tiny op itself. Above it the allocation is noise next to the op's
 * work on the data, which then comes from ct__cpu_alloc and its policy for
 * large blocks (huge pages, the reuse cache). */
#define INLINE_MAX 4096

static void storage_init(ct_storage *s, void *block, void *data, size_t nbytes, ct_device device,
                         bool counted, ct_free_fn free_fn, void *ctx) {
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    s->data = data;
    s->nbytes = nbytes;
    s->device = device;
    s->counted = counted;
    s->free_fn = free_fn;
    s->free_ctx = ctx;
    s->released = false;
    s->unusable = NULL;
    s->block = block;
}

/* New CPU storage whose header sits prefix bytes into a fresh heap block (the
 * caller builds its tensor object in those bytes); small data follows the
 * header, 64-byte aligned. Message and NULL when out of memory. */
static ct_storage *storage_new_in_block(size_t nbytes, size_t prefix) {
    bool inline_data = nbytes <= INLINE_MAX;
    size_t header = prefix + sizeof(ct_storage);
    if (charge((long long)nbytes, "storage_new"))
        return NULL;
    char *block = malloc(header + (inline_data ? 63 + nbytes : 0));
    if (!block) {
        count_alloc(-(long long)nbytes);
        ct__err_set(CT_ENOMEM, "storage_new: out of memory allocating %zu bytes", nbytes);
        return NULL;
    }
    ct_storage *s = (ct_storage *)(block + prefix);
    if (inline_data) {
        uintptr_t data = ((uintptr_t)(block + header) + 63) & ~(uintptr_t)63;
        storage_init(s, block, (void *)data, nbytes, CT_DEVICE_CPU, true, NULL, NULL);
    } else {
        size_t capacity;
        void *data = ct__cpu_alloc(nbytes, &capacity);
        if (!data) {
            free(block);
            count_alloc(-(long long)nbytes);
            ct__err_set(CT_ENOMEM, "storage_new: out of memory allocating %zu bytes", nbytes);
            return NULL;
        }
        storage_init(s, block, data, nbytes, CT_DEVICE_CPU, true, free_cpu,
                     (void *)(uintptr_t)capacity);
    }
    return s;
}

ct_storage *ct__cpu_storage_new(size_t nbytes) { return storage_new_in_block(nbytes, 0); }

ct_storage *ct_storage_new(size_t nbytes, ct_device device) {
    const ct__device_ops *ops = CT__DEVICE_GET("storage_new", device, storage_new);
    return ops ? ops->storage_new("storage_new", nbytes, device.index) : NULL;
}

ct_storage *ct_storage_from_blob(void *data, size_t nbytes, ct_device device, ct_free_fn free_fn,
                                 void *ctx) {
    if (!data && nbytes > 0) {
        ct__err_set(CT_EINVAL, "storage_from_blob: data is NULL but nbytes is %zu", nbytes);
        return NULL;
    }
    ct_storage *s = malloc(sizeof *s);
    if (!s) {
        ct__err_set(CT_ENOMEM, "storage_from_blob: out of memory allocating the storage header");
        return NULL;
    }
    storage_init(s, s, data, nbytes, device, false, free_fn, ctx);
    return s;
}

int ct__tensor_storage_restore(ct_storage *s, size_t nbytes) {
    if (!s->released)
        return 0;
    if (ct__is_host(s->device)) {
        size_t capacity;
        CT_TRY(charge((long long)nbytes, "storage_restore"));
        void *data = nbytes ? ct__cpu_alloc(nbytes, &capacity) : NULL;
        if (nbytes && !data) {
            count_alloc(-(long long)nbytes);
            return ct__err_set(CT_ENOMEM, "storage_restore: out of memory allocating %zu bytes",
                               nbytes);
        }
        s->data = data;
        s->free_fn = data ? free_cpu : NULL;
        s->free_ctx = data ? (void *)(uintptr_t)capacity : NULL;
        s->counted = true;
    } else {
        /* The device's allocator makes a storage; this one takes its memory
         * and the other's header goes. */
        ct_storage *tmp = ct_storage_new(nbytes, s->device);
        if (!tmp)
            return ct_errcode();
        s->data = tmp->data;
        s->free_fn = tmp->free_fn;
        s->free_ctx = tmp->free_ctx;
        s->counted = tmp->counted;
        tmp->free_fn = NULL;
        tmp->counted = false;
        ct_storage_free(tmp);
    }
    s->nbytes = nbytes;
    s->released = false;
    s->unusable = NULL;
    return 0;
}

void ct__tensor_storage_mark(ct_storage *s, const char *why) { s->unusable = why; }

void ct__tensor_storage_release(ct_storage *s, const char *why) {
    if (s->released)
        return;
    if (s->counted && ct__is_host(s->device))
        count_alloc(-(long long)s->nbytes);
    if (s->free_fn)
        s->free_fn(s->data, s->free_ctx);
    s->data = NULL;
    s->nbytes = 0;
    s->free_fn = NULL;
    s->counted = false;
    s->released = true;
    s->unusable = why;
}

int ct__tensor_storage_count(ct_storage *s, const char *op) {
    if (s->counted || !ct__is_host(s->device))
        return 0;
    CT_TRY(charge((long long)s->nbytes, op));
    s->counted = true;
    return 0;
}

ct_storage *ct__tensor_storage_new_releasable(size_t nbytes, ct_device device) {
    ct_storage *s = ct_storage_from_blob(NULL, 0, device, NULL, NULL);
    if (!s)
        return NULL;
    s->released = true;
    if (ct__tensor_storage_restore(s, nbytes)) {
        ct_storage_free(s);
        return NULL;
    }
    return s;
}

uint64_t ct__tensor_storage_version(const ct_storage *s) {
    return atomic_load_explicit(&s->version, memory_order_acquire);
}

void ct__tensor_storage_set_version(ct_storage *s, uint64_t version) {
    atomic_store_explicit(&s->version, version, memory_order_release);
}

int ct__tensor_rebind(ct_tensor *t, ct_storage *s, int64_t offset) {
    size_t end = (size_t)(offset + ct__tensor_numel(t->ndim, t->sizes)) * ct__esize(t->dtype);
    if (!ct_is_contiguous(t) || offset < 0 || end > s->nbytes)
        return ct__err_set(CT_EINVAL,
                           "tensor_rebind: a contiguous tensor of %zu bytes does not fit at "
                           "element %lld of a storage of %zu bytes",
                           end, (long long)offset, s->nbytes);
    ct_storage *old = t->storage;
    /* A tensor ct__tensor_new made lives in its storage's heap block, and
     * that block goes when the tensor does (tensor_drop): the old storage
     * keeps only its header there, with its memory handed back. Views of it
     * would outlive the header. */
    bool inside = old->block == (void *)t;
    if (inside && atomic_load_explicit(&old->refcount, memory_order_acquire) > 1)
        return ct__err_set(CT_ESTATE,
                           "tensor_rebind: other tensors view this tensor's memory; free them "
                           "first");
    t->storage = ct_storage_retain(s);
    t->offset = offset;
    if (inside)
        ct__tensor_storage_release(old, "rebound to another storage");
    else
        ct_storage_free(old);
    return 0;
}

static void storage_drop(ct_storage *s) {
    if (atomic_fetch_sub_explicit(&s->refcount, 1, memory_order_acq_rel) != 1)
        return;
    if (s->counted)
        count_alloc(-(long long)s->nbytes);
    if (s->free_fn)
        s->free_fn(s->data, s->free_ctx);
    free(s->block);
}

ct_storage *ct_storage_retain(ct_storage *s) {
    if (s)
        atomic_fetch_add_explicit(&s->refcount, 1, memory_order_relaxed);
    return s;
}

void ct_storage_free(ct_storage *s) {
    if (s)
        storage_drop(s);
}

void *ct_storage_data(const ct_storage *s) { return s ? s->data : NULL; }
size_t ct_storage_nbytes(const ct_storage *s) { return s ? s->nbytes : 0; }
ct_device ct_storage_device(const ct_storage *s) { return s ? s->device : CT_DEVICE_CPU; }

/* ---------------------------------------------------------------- scopes */

/* Every scope on a thread shares one array; a scope is the range from its
 * start to the end. Keeping a tensor swaps it to the front of the range and
 * shrinks the range, which hands it to the enclosing scope in O(1). */
typedef struct scope_stack {
    ct_tensor **owned;
    size_t len, cap;
    size_t *starts;
    size_t depth, starts_cap;
} scope_stack;

static _Thread_local scope_stack scopes;

static void tensor_drop(ct_tensor *t);

/* A scope cannot report failure to its caller; running out of memory here
 * leaves no consistent ownership, so it is fatal. */
#define SCOPE_GROW(items, cap, need)                                                               \
    do {                                                                                           \
        int grown_ = CT__GROW(items, cap, need, 0, "scope");                                       \
        CT_ASSERT(grown_ == 0 && "out of memory in a scope");                                      \
    } while (0)

void ct_scope_begin(void) {
    SCOPE_GROW(scopes.starts, &scopes.starts_cap, scopes.depth + 1);
    scopes.starts[scopes.depth++] = scopes.len;
}

void ct_scope_end(void) {
    CT_ASSERT(scopes.depth > 0 && "ct_scope_end without ct_scope_begin on this thread");
    size_t start = scopes.starts[--scopes.depth];
    /* Release newest first: a tensor made late may hold the only other
     * reference to an earlier one's autograd state. */
    while (scopes.len > start)
        tensor_drop(scopes.owned[--scopes.len]);
    if (scopes.depth == 0) {
        free(scopes.owned);
        free(scopes.starts);
        scopes = (scope_stack){0};
    }
}

ct_tensor *ct__tensor_scope_own(ct_tensor *t) {
    if (t && scopes.depth > 0) {
        SCOPE_GROW(scopes.owned, &scopes.cap, scopes.len + 1);
        scopes.owned[scopes.len++] = t;
    }
    return t;
}

void ct__tensor_release(ct_tensor *t) {
    if (!t)
        return;
    if (scopes.depth > 0) {
        size_t start = scopes.starts[scopes.depth - 1];
        for (size_t i = scopes.len; i-- > start;) {
            if (scopes.owned[i] == t) {
                memmove(&scopes.owned[i], &scopes.owned[i + 1],
                        (scopes.len - i - 1) * sizeof(ct_tensor *));
                scopes.len--;
                break;
            }
        }
    }
    tensor_drop(t);
}

ct_tensor *ct__tensor_own(ct_tensor *t) {
    if (!t)
        return NULL;
    ct_tensor *ref = ct_tensor_retain(t);
    ct__tensor_release(t);
    return ref;
}

ct_tensor *ct_keep(ct_tensor *t) {
    if (!t || scopes.depth == 0)
        return t;
    size_t start = scopes.starts[scopes.depth - 1];
    for (size_t i = scopes.len; i-- > start;) {
        if (scopes.owned[i] != t)
            continue;
        if (scopes.depth > 1) {
            scopes.owned[i] = scopes.owned[start];
            scopes.owned[start] = t;
            scopes.starts[scopes.depth - 1]++;
        } else {
            scopes.owned[i] = scopes.owned[--scopes.len];
        }
        return t;
    }
    return t;
}

/* ---------------------------------------------------------------- tensors */

static const ct_tensor_hooks *hooks;

int64_t ct__tensor_numel(int ndim, const int64_t *sizes) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= sizes[i];
    return n;
}

void ct__tensor_contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        s *= sizes[i] > 1 ? sizes[i] : 1;
    }
}

/* Fills in t; t takes over the caller's reference to storage. */
static void tensor_init(ct_tensor *t, ct_storage *storage, int64_t offset, int ndim,
                        const int64_t *sizes, const int64_t *strides, ct_dtype dtype) {
    t->magic = CT__TENSOR_MAGIC;
    atomic_init(&t->refcount, 1);
    t->storage = storage;
    t->offset = offset;
    t->ndim = ndim;
    t->dtype = dtype;
    for (int i = 0; i < ndim; i++) {
        t->sizes[i] = sizes[i];
        t->strides[i] = strides[i];
    }
    t->meta = NULL;
}

static ct_tensor *tensor_alloc(ct_storage *storage, int64_t offset, int ndim, const int64_t *sizes,
                               const int64_t *strides, ct_dtype dtype) {
    ct_tensor *t = malloc(sizeof *t);
    if (!t) {
        ct__err_set(CT_ENOMEM, "tensor: out of memory allocating a tensor header");
        return NULL;
    }
    atomic_fetch_add_explicit(&storage->refcount, 1, memory_order_relaxed);
    tensor_init(t, storage, offset, ndim, sizes, strides, dtype);
    return t;
}

int ct__tensor_check_shape(const char *op, int ndim, const int64_t *sizes, ct_dtype dtype) {
    if ((unsigned)dtype >= CT_NDTYPES)
        return ct__err_set(CT_EINVAL, "%s: invalid dtype %d", op, (int)dtype);
    if (ndim < 0 || ndim > CT_MAX_DIMS)
        return ct__err_set(CT_EINVAL, "%s: ndim %d is outside [0, %d]", op, ndim, CT_MAX_DIMS);
    if (ndim > 0 && !sizes)
        return ct__err_set(CT_EINVAL, "%s: sizes is NULL for ndim %d", op, ndim);
    /* numel bounds the bytes; extent, the product of the non-zero sizes,
     * bounds the strides, which must not overflow in an empty tensor
     * either. */
    int64_t numel = 1, extent = 1;
    for (int i = 0; i < ndim; i++) {
        if (sizes[i] < 0) {
            char buf[CT__SHAPE_STR];
            return ct__err_set(CT_EINVAL, "%s: negative size in %s", op,
                               ct__tensor_shape_str(buf, ndim, sizes));
        }
        if (sizes[i] > 0 && (numel > INT64_MAX / 16 / sizes[i] || extent > INT64_MAX / sizes[i]))
            return ct__err_set(CT_EINVAL, "%s: shape is too large", op);
        numel *= sizes[i];
        extent *= sizes[i] > 0 ? sizes[i] : 1;
    }
    return 0;
}

/* The storage header follows the tensor object in its block. */
_Static_assert(sizeof(ct_tensor) % _Alignof(ct_storage) == 0, "storage header misaligned");

static ct_tensor *tensor_new_unowned(const char *op, int ndim, const int64_t *sizes,
                                     ct_dtype dtype) {
    if (ct__tensor_check_shape(op, ndim, sizes, dtype))
        return NULL;
    int64_t strides[CT_MAX_DIMS];
    ct__tensor_contiguous_strides(ndim, sizes, strides);
    size_t nbytes = (size_t)ct__tensor_numel(ndim, sizes) * ct__esize(dtype);
    ct_storage *s = storage_new_in_block(nbytes, sizeof(ct_tensor));
    if (!s) {
        /* storage_new said why: the heap, or CT_MEMORY_LIMIT. */
        char buf[CT__SHAPE_STR], why[256];
        snprintf(why, sizeof why, "%s", ct_errmsg());
        ct__err_set(ct_errcode(), "%s: allocating %s%s (%zu bytes): %s", op, ct_dtype_name(dtype),
                    ct__tensor_shape_str(buf, ndim, sizes), nbytes, why);
        return NULL;
    }
    ct_tensor *t = s->block;
    tensor_init(t, s, 0, ndim, sizes, strides, dtype);
    return t;
}

ct_tensor *ct__cpu_scalar_operand_init(ct__scalar_operand *op, double value, ct_dtype dtype) {
    ct__tensor_store_double(dtype, op->value.bytes, value);
    storage_init(&op->storage, NULL, op->value.bytes, ct__esize(dtype), CT_DEVICE_CPU, false, NULL,
                 NULL);
    tensor_init(&op->tensor, &op->storage, 0, 0, NULL, NULL, dtype);
    return &op->tensor;
}

ct_tensor *ct__tensor_new(const char *op, int ndim, const int64_t *sizes, ct_dtype dtype) {
    return ct__tensor_scope_own(tensor_new_unowned(op, ndim, sizes, dtype));
}

ct_tensor *ct__tensor_make_view(ct_tensor *base, int ndim, const int64_t *sizes,
                                const int64_t *strides, int64_t offset) {
    return ct__tensor_scope_own(
        tensor_alloc(base->storage, offset, ndim, sizes, strides, base->dtype));
}

ct_tensor *ct_tensor_retain(ct_tensor *t) {
    if (t)
        atomic_fetch_add_explicit(&t->refcount, 1, memory_order_relaxed);
    return t;
}

static void tensor_drop(ct_tensor *t) {
    CT_ASSERT(t->magic == CT__TENSOR_MAGIC && "ct_tensor_free on a freed or foreign pointer");
    if (atomic_fetch_sub_explicit(&t->refcount, 1, memory_order_acq_rel) != 1)
        return;
    if (t->meta && hooks && hooks->free_meta)
        hooks->free_meta(t->meta);
    ct_storage *s = t->storage;
    bool own_block = s->block != t;
    t->magic = CT__TENSOR_DEAD;
    /* A tensor made by ct__tensor_new lives in its storage's block: it goes with
     * the storage's last reference, which may be a view's. */
    storage_drop(s);
    if (own_block)
        free(t);
}

void ct_tensor_free(ct_tensor *t) {
    if (t)
        tensor_drop(t);
}

int ct__tensor_check_handles(const char *op, ct_tensor *const *ts, int n) {
    for (int i = 0; i < n; i++) {
        if (!ts[i]) {
            /* Keep the first failure's message: it says what went wrong. */
            if (ct_errcode() != CT_OK)
                return ct_errcode();
            return ct__err_set(CT_EINVAL, "%s: input %d is NULL", op, i);
        }
        if (ts[i]->magic != CT__TENSOR_MAGIC)
            return ct__err_set(CT_EINVAL, "%s: input %d is not a live tensor (freed or foreign)",
                               op, i);
        if (ts[i]->storage->unusable)
            return ct__err_set(CT_ESTATE, "%s: input %d cannot be used now: %s", op, i,
                               ts[i]->storage->unusable);
    }
    return 0;
}

int ct__tensor_check_same_device(const char *op, ct_tensor *const *ts, int n) {
    for (int i = 1; i < n; i++) {
        ct_device a = ts[0]->storage->device, b = ts[i]->storage->device;
        char na[CT_DEVICE_STR], nb[CT_DEVICE_STR];
        if (!ct_device_equal(a, b))
            return ct__err_set(CT_EDEVICE, "%s: input 0 is on %s and input %d on %s", op,
                               ct_device_str(a, na), i, ct_device_str(b, nb));
    }
    return 0;
}

ct_tensor *ct__tensor_new_on(const char *op, int ndim, const int64_t *sizes, ct_dtype dtype,
                             ct_device device) {
    /* The host's tensor and small storage share one heap block. */
    if (ct__is_host(device))
        return ct__tensor_new(op, ndim, sizes, dtype);
    const ct__device_ops *ops = CT__DEVICE_GET(op, device, storage_new);
    if (!ops || ct__tensor_check_shape(op, ndim, sizes, dtype))
        return NULL;
    ct_storage *s = ops->storage_new(op, (size_t)ct__tensor_numel(ndim, sizes) * ct__esize(dtype),
                                     device.index);
    ct_tensor *t = s ? ct_tensor_from_storage(s, 0, ndim, sizes, NULL, dtype) : NULL;
    ct_storage_free(s);
    return t;
}

int ct__tensor_check_inputs(const char *op, ct_tensor *const *ts, int n) {
    int rc = ct__tensor_check_handles(op, ts, n);
    for (int i = 0; i < n && !rc; i++) {
        ct_device d = ts[i]->storage->device;

        char name[32];
        if (!ct__is_host(d))
            rc = ct__err_set(CT_EDEVICE,
                             "%s: input %d is on %s:%d, and ct has no %s kernel for %s yet "
                             "(ct_to(t, CT_DEVICE_CPU) brings it to the host)",
                             op, i, ct__device_name(d.type, name), d.index,
                             ct__device_name(d.type, name), op);
    }
    return rc;
}

int ct__tensor_wrap_dim(const char *op, int dim, int ndim) {
    int n = ndim > 0 ? ndim : 1;
    if (dim < -n || dim >= n) {
        ct__err_set(CT_EINVAL, "%s: dim %d is out of range for a %d-d tensor (expected [%d, %d])",
                    op, dim, ndim, -n, n - 1);
        return -1;
    }
    return dim < 0 ? dim + n : dim;
}

int ct__tensor_broadcast_shapes(const char *op, int na, const int64_t *a, int nb, const int64_t *b,
                                int *nout, int64_t *out) {
    int n = na > nb ? na : nb;
    for (int i = 0; i < n; i++) {
        int64_t sa = i < n - na ? 1 : a[i - (n - na)];
        int64_t sb = i < n - nb ? 1 : b[i - (n - nb)];
        if (sa != sb && sa != 1 && sb != 1) {
            char ba[CT__SHAPE_STR], bb[CT__SHAPE_STR];
            return ct__err_set(CT_ESHAPE,
                               "%s: shapes %s and %s do not broadcast (dim %d: %lld vs %lld)", op,
                               ct__tensor_shape_str(ba, na, a), ct__tensor_shape_str(bb, nb, b), i,
                               (long long)sa, (long long)sb);
        }
        out[i] = sa == 1 ? sb : sa;
    }
    *nout = n;
    return 0;
}

/* Byte range [lo, hi) spanned by t's elements; empty for numel 0. */
void ct__tensor_memory_extent(const ct_tensor *t, char **lo, char **hi) {
    int64_t esize = (int64_t)ct_dtype_size(t->dtype), min = 0, max = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->sizes[i] == 0) {
            *lo = *hi = ct__data(t);
            return;
        }
        int64_t span = (t->sizes[i] - 1) * t->strides[i];
        if (span < 0)
            min += span;
        else
            max += span;
    }
    *lo = ct__data(t) + min * esize;
    *hi = ct__data(t) + (max + 1) * esize;
}

bool ct__tensor_memory_overlaps(const ct_tensor *a, const ct_tensor *b) {
    if (a->storage != b->storage)
        return false;
    char *alo, *ahi, *blo, *bhi;
    ct__tensor_memory_extent(a, &alo, &ahi);
    ct__tensor_memory_extent(b, &blo, &bhi);
    return alo < bhi && blo < ahi;
}

static bool same_layout(const ct_tensor *a, const ct_tensor *b) {
    if (ct__data(a) != ct__data(b) || a->ndim != b->ndim ||
        ct_dtype_size(a->dtype) != ct_dtype_size(b->dtype))
        return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->sizes[i] != b->sizes[i] || (a->sizes[i] > 1 && a->strides[i] != b->strides[i]))
            return false;
    return true;
}

void ct__tensor_bump_version(ct_tensor *t) {
    atomic_fetch_add_explicit(&t->storage->version, 1, memory_order_relaxed);
}

int ct__tensor_check_inplace(ct_op opcode, const char *op, ct_tensor *out, ct_tensor *const *ins,
                             int nins) {
    char desc[CT__DESC_STR];
    for (int i = 0; i < out->ndim; i++)
        if (out->strides[i] == 0 && out->sizes[i] > 1)
            return ct__err_set(CT_EINVAL,
                               "%s: cannot write in place into %s: dim %d is an expanded view "
                               "(stride 0), so several elements share one memory location; "
                               "call ct_contiguous or ct_clone first",
                               op, ct__tensor_desc(desc, out), i);
    char *olo, *ohi;
    ct__tensor_memory_extent(out, &olo, &ohi);
    for (int k = 0; k < nins; k++) {
        const ct_tensor *in = ins[k];
        if (!in || in->storage != out->storage || same_layout(in, out))
            continue;
        char *ilo, *ihi;
        ct__tensor_memory_extent(in, &ilo, &ihi);
        if (ilo < ohi && olo < ihi)
            return ct__err_set(CT_EINVAL,
                               "%s: input %d partially overlaps the output %s in memory; "
                               "results would depend on evaluation order. Clone the input "
                               "first",
                               op, k, ct__tensor_desc(desc, out));
    }
    if (hooks && hooks->check_inplace) {
        int rc = hooks->check_inplace(opcode, out, ins, nins);
        if (rc)
            return rc;
    }
    ct__tensor_bump_version(out);
    return 0;
}

ct_tensor *ct__tensor_record(ct_op op, ct_tensor *const *inputs, int ninputs,
                             ct_tensor *const *outputs, int noutputs, bool inplace,
                             const ct_op_args *args) {
    if (hooks && hooks->record) {
        static const ct_op_args no_args;
        ct_op_record rec = {
            op, inputs, ninputs, outputs, noutputs, inplace, args ? args : &no_args};
        int rc = hooks->record(&rec);
        if (rc != 0) {
            if (ct_errcode() == CT_OK)
                ct__err_set(rc, "%s: the autograd recorder failed", ct_op_name(op));
            for (int i = 0; i < noutputs && !inplace; i++)
                ct__tensor_release(outputs[i]);
            return NULL;
        }
    }
    return outputs[0];
}

void ct_tensor_set_hooks(const ct_tensor_hooks *h) { hooks = h; }
void *ct_tensor_meta(const ct_tensor *t) { return t ? t->meta : NULL; }
void ct_tensor_set_meta(ct_tensor *t, void *meta) {
    if (t)
        t->meta = meta;
}

static const char *const op_names[] = {
#define CT__OP_NAME(NAME) #NAME,
    CT_OP_MAP(CT__OP_NAME)
#undef CT__OP_NAME
};

const char *ct_op_name(ct_op op) { return (unsigned)op < CT_NOPS ? op_names[op] : "INVALID"; }

/* --------------------------------------------------------------- accessors */

int ct_ndim(const ct_tensor *t) { return t ? t->ndim : -1; }

int64_t ct_size(const ct_tensor *t, int dim) {
    if (!t || dim < -t->ndim || dim >= t->ndim)
        return -1;
    return t->sizes[dim < 0 ? dim + t->ndim : dim];
}

int64_t ct_stride(const ct_tensor *t, int dim) {
    if (!t || dim < -t->ndim || dim >= t->ndim)
        return -1;
    return t->strides[dim < 0 ? dim + t->ndim : dim];
}

const int64_t *ct_sizes(const ct_tensor *t) { return t ? t->sizes : NULL; }
const int64_t *ct_strides(const ct_tensor *t) { return t ? t->strides : NULL; }
int64_t ct_numel(const ct_tensor *t) { return t ? ct__tensor_numel(t->ndim, t->sizes) : 0; }
ct_dtype ct_tensor_dtype(const ct_tensor *t) { return t ? t->dtype : CT_NDTYPES; }
ct_device ct_tensor_device(const ct_tensor *t) { return t ? t->storage->device : CT_DEVICE_CPU; }
ct_storage *ct_tensor_storage(const ct_tensor *t) { return t ? t->storage : NULL; }
int64_t ct_tensor_offset(const ct_tensor *t) { return t ? t->offset : 0; }
void *ct_data_ptr(const ct_tensor *t) { return t ? ct__data(t) : NULL; }

uint64_t ct_tensor_version(const ct_tensor *t) {
    return t ? atomic_load_explicit(&t->storage->version, memory_order_relaxed) : 0;
}

bool ct_is_contiguous(const ct_tensor *t) {
    if (!t)
        return false;
    int64_t expected = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->sizes[i] == 0)
            return true;
        if (t->sizes[i] != 1 && t->strides[i] != expected)
            return false;
        expected *= t->sizes[i];
    }
    return true;
}

/* Element p of t's storage as double, read from whichever device holds it
 * (the host waits for a device's queued work); NaN with the error on a
 * failed copy. */
static double load_any(const ct_tensor *t, const char *p) {
    ct_device device = t->storage->device;
    if (ct__is_host(device))
        return ct__tensor_load_double(t->dtype, p);
    unsigned char buf[8];
    const ct__device_ops *ops = CT__DEVICE_GET("item", device, read);
    if (!ops || ops->read(device.index, buf, p, ct__esize(t->dtype)))
        return NAN;
    return ct__tensor_load_double(t->dtype, buf);
}

double ct_item(const ct_tensor *t) {
    if (CT__CHECK_ANY("item", (ct_tensor *)t))
        return NAN;
    if (ct_numel(t) != 1) {
        char desc[CT__DESC_STR];
        ct__err_set(CT_ESHAPE, "item: %s has %lld elements; expected exactly one",
                    ct__tensor_desc(desc, t), (long long)ct_numel(t));
        return NAN;
    }
    return load_any(t, ct__data(t));
}

int64_t ct_item_int64(const ct_tensor *t) {
    if (t && t->magic == CT__TENSOR_MAGIC && ct_numel(t) == 1 && ct__is_host(t->storage->device)) {
        if (t->dtype == CT_INT64)
            return *(const int64_t *)ct__data(t);
        if (t->dtype == CT_INT32)
            return *(const int32_t *)ct__data(t);
    }
    double v = ct_item(t);
    return v != v ? 0 : (int64_t)v;
}

double ct_get(const ct_tensor *t, const int64_t *idx) {
    if (CT__CHECK_ANY("get", (ct_tensor *)t))
        return NAN;
    int64_t off = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (idx[i] < 0 || idx[i] >= t->sizes[i]) {
            ct__err_set(CT_ERANGE, "get: index %lld is out of range for dim %d of size %lld",
                        (long long)idx[i], i, (long long)t->sizes[i]);
            return NAN;
        }
        off += idx[i] * t->strides[i];
    }
    return load_any(t, ct__data(t) + off * (int64_t)ct_dtype_size(t->dtype));
}

/* --------------------------------------------------------------- factories */

ct_tensor *ct_empty(int ndim, const int64_t *sizes, ct_dtype dtype) {
    ct_tensor *t = ct__tensor_new("empty", ndim, sizes, dtype);
    return t ? ct__tensor_record1(CT_OP_EMPTY, t, NULL, 0, NULL) : NULL;
}

ct_tensor *ct_tensor_from_storage(ct_storage *storage, int64_t offset, int ndim,
                                  const int64_t *sizes, const int64_t *strides, ct_dtype dtype) {
    if (!storage) {
        ct__err_set(CT_EINVAL, "tensor_from_storage: storage is NULL");
        return NULL;
    }
    if (ct__tensor_check_shape("tensor_from_storage", ndim, sizes, dtype))
        return NULL;
    int64_t cstrides[CT_MAX_DIMS];
    if (!strides) {
        ct__tensor_contiguous_strides(ndim, sizes, cstrides);
        strides = cstrides;
    }
    int64_t lo = offset, hi = offset;
    bool empty = false;
    for (int i = 0; i < ndim; i++) {
        if (sizes[i] == 0)
            empty = true;
        else if (strides[i] < 0)
            lo += (sizes[i] - 1) * strides[i];
        else
            hi += (sizes[i] - 1) * strides[i];
    }
    int64_t esize = (int64_t)ct_dtype_size(dtype);
    if (offset < 0 || (!empty && (lo < 0 || (hi + 1) * esize > (int64_t)storage->nbytes))) {
        char buf[CT__SHAPE_STR];
        ct__err_set(CT_ERANGE,
                    "tensor_from_storage: %s%s at offset %lld reaches past the storage's %zu "
                    "bytes",
                    ct_dtype_name(dtype), ct__tensor_shape_str(buf, ndim, sizes), (long long)offset,
                    storage->nbytes);
        return NULL;
    }
    return ct__tensor_scope_own(tensor_alloc(storage, offset, ndim, sizes, strides, dtype));
}
