/* ct base internal header: not installed, not part of the API.
 *
 * The base layer: what every module needs from below and that needs no
 * struct layout. It is on every module's include path (the top-level
 * CMakeLists.txt), while tensor_impl.h, which has the layouts of ct_tensor
 * and ct_storage, the element iterator and the dtype conversions, is granted
 * only to the modules that work on those (docs/decisions.md, "The base
 * layer"). Here:
 *
 *   - errors: ct__err_set, CT_REQUIRE, error contexts, CT_ASSERT
 *     (error_impl.h);
 *   - ct__now(), the monotonic clock every timeout and rate is read from;
 *   - CT__GROW, the growable array;
 *   - tensor/'s internal functions over handles: messages that describe a
 *     tensor, the handle and device checks, owning and releasing results,
 *     copies between devices. They take a ct_tensor * as the public API
 *     does, opaque, and are defined in tensor/ (tensor.c, error.c, copy.c,
 *     iter.c, device.c), which sees the layouts.
 *
 * file_impl.h, beside this header, has the file steps the file formats
 * share.
 *
 * Errors: functions that return int return 0 or a negative CT_E* code with
 * this thread's message set; those that return a tensor return NULL with
 * the message set. Threads: nothing here keeps state of its own except the
 * per-thread error and scope; an array or a tensor is the caller's to
 * guard. */
#ifndef CT_BASE_IMPL_H
#define CT_BASE_IMPL_H

#include <ct/tensor.h>

#include "error_impl.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

/* ------------------------------------------------------------------ time */

/* Seconds on the monotonic clock: every module's timeouts and rates. */
static inline double ct__now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------- growable arrays */

/* Makes room for need elements of elem bytes in an array of *cap: when need
 * is more than *cap, reallocates it to the largest of need, twice *cap and
 * 16 elements, but no more than limit. items is the address of the array's
 * pointer (NULL before the first growth), of any element type: it is read
 * and written with memcpy. limit is the most elements the array may hold,
 * the bound that ARCHITECTURE.md asks of every table an outsider can grow;
 * 0 is no bound but size_t's (ct__array_grow) or int's
 * (ct__array_grow_int), for arrays whose growth the library itself drives.
 *
 * Returns 0, or CT_ENOMEM with the array and *cap unchanged and a message
 * that starts with what (the op and the array: "module_add_child:
 * children"): need over limit, a size that overflows, or realloc failing.
 * Thread-safe as realloc is; the array is the caller's. */
int ct__array_grow(void *items, size_t *cap, size_t need, size_t elem, size_t limit,
                   const char *what);
/* The same for an array counted in int; need and *cap are not negative. */
int ct__array_grow_int(void *items, int *cap, int need, size_t elem, int limit, const char *what);

static inline int ct__array_reserve(void *items, size_t *cap, size_t need, size_t elem,
                                    size_t limit, const char *what) {
    return need <= *cap ? 0 : ct__array_grow(items, cap, need, elem, limit, what);
}

static inline int ct__array_reserve_int(void *items, int *cap, int need, size_t elem, int limit,
                                        const char *what) {
    return need <= *cap ? 0 : ct__array_grow_int(items, cap, need, elem, limit, what);
}

/* Makes room for need elements in items (an lvalue: T *), whose capacity
 * *cap is a size_t or an int; ct__array_grow has the rest. It costs one
 * comparison while there is room, so a push may call it every time:
 *
 *     CT_TRY(CT__GROW(s->waiters, &s->cap_waiters, s->nwaiters + 1, MAX_WAITERS,
 *                     "store: waiters"));
 *     s->waiters[s->nwaiters++] = w; */
#define CT__GROW(items, cap, need, limit, what)                                                    \
    _Generic((cap), size_t *: ct__array_reserve, int *: ct__array_reserve_int)(                   \
        &(items), (cap), (need), sizeof *(items), (limit), (what))

/* ---------------------------------------------------------------- dtypes */

/* ct_dtype_size without the bounds check or the call: public functions are
 * interposable, so calls to them from inside libct go through the PLT. */
extern const size_t ct__tensor_dtype_sizes[CT_NDTYPES];
static inline size_t ct__esize(ct_dtype dtype) { return ct__tensor_dtype_sizes[dtype]; }

/* --------------------------------------------------------------- devices */

/* Whether device's memory is the host's, which the CPU reads directly: the
 * one question about a device that code outside the dispatch table
 * (device_impl.h) asks, for its fast paths and for copies to the host. */
static inline bool ct__is_host(ct_device device) { return device.type == CT_CPU; }
/* ct_device_equal, inline for the engine's check of every gradient. */
static inline bool ct__device_equal(ct_device a, ct_device b) {
    return a.type == b.type && (ct__is_host(a) || a.index == b.index);
}

/* Makes device local_rank % count, of each accelerator type this build has
 * with count > 0, the default of threads that chose none (dist_init: each
 * rank on a machine takes its own). */
void ct__device_take_local(int local_rank);

/* ------------------------------------------------- messages about tensors */

/* Formats "[2, 3]" into buf (at least CT__SHAPE_STR bytes). */
#define CT__SHAPE_STR 96
const char *ct__tensor_shape_str(char *buf, int ndim, const int64_t *sizes);
/* "float32[2, 3]" into buf (at least CT__DESC_STR bytes). */
#define CT__DESC_STR 112
const char *ct__tensor_desc(char *buf, const ct_tensor *t);

/* ---------------------------------------------------------- handle checks */

/* Validates op inputs: NULL (keeping any earlier message), a freed or foreign
 * handle, a non-CPU device. Returns 0 or a CT_E* code with the message
 * set. */
int ct__tensor_check_inputs(const char *op, ct_tensor *const *ts, int n);
#define CT__CHECK(op, ...)                                                                         \
    ct__tensor_check_inputs(                                                                       \
        op, (ct_tensor *const[]){__VA_ARGS__},                                                     \
        (int)(sizeof((ct_tensor *const[]){__VA_ARGS__}) / sizeof(ct_tensor *)))
/* The same, on any device: views and copies, which need no kernel of the
 * device's, or the CUDA ones that have one. */
int ct__tensor_check_handles(const char *op, ct_tensor *const *ts, int n);
#define CT__CHECK_ANY(op, ...)                                                                     \
    ct__tensor_check_handles(                                                                      \
        op, (ct_tensor *const[]){__VA_ARGS__},                                                     \
        (int)(sizeof((ct_tensor *const[]){__VA_ARGS__}) / sizeof(ct_tensor *)))
/* CT_EDEVICE unless every input is on one device. */
int ct__tensor_check_same_device(const char *op, ct_tensor *const *ts, int n);
/* 0 when (ndim, sizes, dtype) can make a tensor; otherwise CT_EINVAL with
 * a message naming op (a bad dtype or ndim, NULL sizes, a negative size, a
 * shape whose bytes overflow). */
int ct__tensor_check_shape(const char *op, int ndim, const int64_t *sizes, ct_dtype dtype);
int64_t ct__tensor_numel(int ndim, const int64_t *sizes);
void ct__tensor_contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides);

/* [*lo, *hi): the bytes t's elements span in its storage (lo == hi when
 * it has none). */
void ct__tensor_memory_extent(const ct_tensor *t, char **lo, char **hi);
/* Whether a's and b's spans in one storage intersect (views that interleave
 * without sharing an element count too: the conservative answer). */
bool ct__tensor_memory_overlaps(const ct_tensor *a, const ct_tensor *b);

/* ---------------------------------------------------- making and owning */

/* New contiguous tensor registered in the current scope. Errors (bad shape,
 * out of memory) are reported under op's name. The tensor object, its
 * storage header and (for small tensors) its data share one heap block,
 * released when the storage goes. */
ct_tensor *ct__tensor_new(const char *op, int ndim, const int64_t *sizes, ct_dtype dtype);
/* A new contiguous tensor on device, owned like ct__tensor_new's. */
ct_tensor *ct__tensor_new_on(const char *op, int ndim, const int64_t *sizes, ct_dtype dtype,
                             ct_device device);
/* Hands a new reference to the current scope (if any); returns t. */
ct_tensor *ct__tensor_scope_own(ct_tensor *t);
/* Drops a result the current op made but will not return: takes it out of
 * the current scope if the scope owns it, then frees it. */
void ct__tensor_release(ct_tensor *t);
/* A reference the caller owns whether or not a scope is open: takes an op's
 * result t out of the current scope, for modules whose tensors outlive the
 * caller's scope (a collective's staging, data parallel's buckets). NULL
 * stays NULL. */
ct_tensor *ct__tensor_own(ct_tensor *t);
void ct__tensor_bump_version(ct_tensor *t);

/* -------------------------------------------- memory that comes and goes */

/* Storage whose memory can be handed back and taken again, for buffers
 * that exist only while they are used (ct_ddp's fully sharded units): a
 * new one holds nbytes (uninitialised) on device; NULL with a message on
 * error. ct__tensor_storage_release frees its memory (data becomes NULL, nbytes
 * 0) and makes every op that checks its inputs (CT__CHECK, CT__CHECK_ANY:
 * views and hooks too) fail with CT_ESTATE quoting why (a static string, or one that outlives the
 * release); ct__tensor_storage_restore gives it nbytes of new, uninitialised memory (0 if it was
 * not released, else a CT_E* code). Not thread-safe against users of the storage. */
ct_storage *ct__tensor_storage_new_releasable(size_t nbytes, ct_device device);
void ct__tensor_storage_release(ct_storage *s, const char *why);
int ct__tensor_storage_restore(ct_storage *s, size_t nbytes);
/* Counts the host storage s, made by ct_storage_from_blob over memory that
 * ct maps itself (a communicator's shared segment, ct_comm_zeros), toward
 * ct_memory_allocated, its peak and CT_MEMORY_LIMIT, as ct's own
 * allocations count, until it is freed. 0, or CT_ENOMEM past the limit
 * (s then stays uncounted), naming op. */
int ct__tensor_storage_count(ct_storage *s, const char *op);
/* While why is not NULL, kernels refuse s as they refuse released
 * memory, quoting why: a transfer is filling it. NULL lifts that. */
void ct__tensor_storage_mark(ct_storage *s, const char *why);
/* The version counter every view of s shares (bumped by in-place writes),
 * and setting it back: a buffer refilled with the values it held keeps the
 * version a saved graph checks. */
uint64_t ct__tensor_storage_version(const ct_storage *s);
void ct__tensor_storage_set_version(ct_storage *s, uint64_t version);
/* Makes the contiguous tensor t a view of s at offset (in elements), in
 * place: whoever holds t sees the new memory (a module, a graph that saved
 * it, an optimizer). CT_EINVAL when t is not contiguous or does not fit. */
int ct__tensor_rebind(ct_tensor *t, ct_storage *s, int64_t offset);

/* ---------------------------------------------------------- moving data */

/* dst = src (broadcast, converted) on whichever device they share, or
 * between the host and a device. Returns 0 or a CT_E* code. */
int ct__tensor_copy_any(ct_tensor *dst, ct_tensor *src);
/* t = value (converted) on t's device, any layout. Returns 0 or a CT_E*
 * code. */
int ct__tensor_fill_any(ct_tensor *t, double value);
/* Copies src (already broadcastable to dst's shape) into dst, converting
 * dtype; no checks, no autograd record. */
void ct__cpu_copy_into(ct_tensor *dst, ct_tensor *src);

/* Calls fn on each stretch of t's elements that is contiguous in memory, in
 * row-major order: how a view is written out as a row-major file. ct__iter
 * does not serve here, as it reorders dims for speed. Returns fn's first
 * nonzero result, or 0. */
typedef int (*ct__run_fn)(void *ctx, const void *p, size_t n);
int ct__tensor_for_each_run(const ct_tensor *t, ct__run_fn fn, void *ctx);

#endif
