/* ct/tensor.h: strided tensors, their ops, scopes, errors and the thread pool.
 *
 * A ct_tensor is a strided view (sizes, strides, offset, dtype) onto a
 * reference-counted ct_storage. Views (ct_view, ct_transpose, ct_slice, ...)
 * share storage; every other op returns a new tensor. Every op accepts any
 * strides and broadcasts its inputs with NumPy rules.
 *
 * Example:
 *
 *     #include <ct/tensor.h>
 *     #include <stdio.h>
 *
 *     int main(void) {
 *         ct_scope_begin();
 *         ct_tensor *x = ct_arange(0, 6, 1, CT_FLOAT32);
 *         ct_tensor *m = ct_view(x, CT_SHAPE(2, 3));
 *         ct_tensor *y = ct_add(ct_transpose(m, 0, 1), ct_ones(CT_SHAPE(3, 1), CT_FLOAT32));
 *         ct_tensor *s = ct_sum(y, NULL, 0, false);
 *         if (!s) {
 *             fprintf(stderr, "%s\n", ct_errmsg());
 *             ct_scope_end();
 *             return 1;
 *         }
 *         ct_print(y);
 *         printf("sum = %g\n", ct_item(s));
 *         ct_scope_end();
 *         return 0;
 *     }
 *
 * Ownership. Inside ct_scope_begin()/ct_scope_end() the scope owns every
 * tensor an op returns; ct_keep() hands one to the enclosing scope (or, at the
 * outermost scope, to the caller). Outside any scope the caller owns results
 * and releases them with ct_tensor_free(). In-place ops (names ending in `_`)
 * return their first argument without a new reference. Functions that take a
 * tensor never take ownership of it unless they say so.
 *
 * Errors. Ops that return a tensor return NULL on failure and record a
 * thread-local message (ct_errmsg()) and code (ct_errcode()). A NULL input
 * makes an op return NULL and keep the earlier message, so a whole expression
 * can be checked once at the end. Functions that return int return 0 or a
 * negative CT_E* code; CT_TRY(call) returns such a code to the caller.
 *
 * Threads. Tensors may be shared read-only across threads. Writing a tensor
 * (in-place ops, copy_) while another thread reads or writes the same memory
 * is a data race. Reference counts are atomic, so the last reference may be
 * dropped on any thread. Scopes and error messages are per thread. Ops run in
 * parallel on ct's own pool (ct_parallel_for); their results do not depend on
 * the number of threads.
 */
#ifndef CT_TENSOR_H
#define CT_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#ifdef __cplusplus
#include <initializer_list>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define CT_API              __attribute__((visibility("default")))
#define CT_PRINTF(f, a)     __attribute__((format(printf, f, a)))
#define CT_DEPRECATED(hint) __attribute__((deprecated(hint)))
#else
#define CT_API
#define CT_PRINTF(f, a)
#define CT_DEPRECATED(hint)
#endif

/* ---------------------------------------------------------------- errors */

/* One table makes the enum, ct_strerror() and ct_errname(). Codes are
 * negative; 0 (CT_OK) is success. */
#define CT_ERRNO_MAP(X)                                                                            \
    X(EINVAL, "invalid argument")                                                                  \
    X(ESHAPE, "shape mismatch")                                                                    \
    X(EDTYPE, "dtype mismatch")                                                                    \
    X(EDEVICE, "device mismatch")                                                                  \
    X(ENOMEM, "out of memory")                                                                     \
    X(ERANGE, "index out of range")                                                                \
    X(ENOTSUP, "not supported")                                                                    \
    X(ESTATE, "invalid state")                                                                     \
    X(EIO, "input/output error")                                                                   \
    X(ECORRUPT, "corrupt data")                                                                    \
    X(EVERSION, "unsupported version")                                                             \
    X(ETIMEDOUT, "timed out")                                                                      \
    X(EPEER, "peer failed")                                                                        \
    X(ECLOSED, "closed")                                                                           \
    X(EMISMATCH, "ranks disagree")                                                                 \
    X(EFOREIGN, "error in an external library")                                                    \
    X(EAUTH, "authentication failed")

enum ct__errno_index {
#define CT__ERR_INDEX(name, text) CT__ERR_INDEX_##name,
    CT_ERRNO_MAP(CT__ERR_INDEX)
#undef CT__ERR_INDEX
        CT__ERR_COUNT
};

typedef enum ct_err {
    CT_OK = 0,
#define CT__ERR_DEFINE(name, text) CT_##name = -(CT__ERR_INDEX_##name + 1),
    CT_ERRNO_MAP(CT__ERR_DEFINE)
#undef CT__ERR_DEFINE
} ct_err;

/* Static text for a code ("shape mismatch"); "unknown error" for others. */
CT_API const char *ct_strerror(int err);
/* The code's name ("CT_ESHAPE"). */
CT_API const char *ct_errname(int err);
/* This thread's last error message, "" if none. Valid until the next ct call
 * on this thread that fails or clears. */
CT_API const char *ct_errmsg(void);
/* This thread's last error code, CT_OK if none. */
CT_API int ct_errcode(void);
/* Forgets this thread's last error. */
CT_API void ct_errclear(void);
/* Records code and a formatted message as this thread's last error, as
 * ct's own functions do, and returns code: how a callback that ct runs (a
 * remote function, a loader transform) reports what went wrong. */
CT_API int ct_seterr(int code, const char *fmt, ...) CT_PRINTF(2, 3);
/* In a function returning int: evaluates expr, a call that returns 0 or a
 * negative CT_E* code (positive results count as success), and on a
 * negative one returns that code from the enclosing function, its message
 * kept for the caller. It returns at once, so use it where nothing made so
 * far must be released; C and C++ alike:
 *
 *     static int dump(FILE *f, const ct_tensor *a, const ct_tensor *b) {
 *         CT_TRY(ct_tensor_fprint(f, a));
 *         CT_TRY(ct_tensor_fprint(f, b));
 *         return 0;
 *     }
 */
#define CT_TRY(expr)                                                                               \
    do {                                                                                           \
        int ct__try_rc = (expr);                                                                   \
        if (ct__try_rc < 0)                                                                        \
            return ct__try_rc;                                                                     \
    } while (0)

/* ---------------------------------------------------------------- dtypes */

#define CT_DTYPE_MAP(X)                                                                            \
    X(FLOAT32, float32, 4)                                                                         \
    X(FLOAT64, float64, 8)                                                                         \
    X(BFLOAT16, bfloat16, 2)                                                                       \
    X(FLOAT16, float16, 2)                                                                         \
    X(INT64, int64, 8)                                                                             \
    X(INT32, int32, 4)                                                                             \
    X(UINT8, uint8, 1)                                                                             \
    X(BOOL, bool, 1)

typedef enum ct_dtype {
#define CT__DTYPE_DEFINE(NAME, name, size) CT_##NAME,
    CT_DTYPE_MAP(CT__DTYPE_DEFINE)
#undef CT__DTYPE_DEFINE
        CT_NDTYPES
} ct_dtype;

CT_API size_t ct_dtype_size(ct_dtype dtype);
CT_API const char *ct_dtype_name(ct_dtype dtype);
CT_API bool ct_dtype_is_float(ct_dtype dtype);
/* PyTorch's promotion lattice: bool < uint8 < int32 < int64 < 16-bit floats <
 * float32 < float64; float16 with bfloat16 gives float32. */
CT_API ct_dtype ct_promote_types(ct_dtype a, ct_dtype b);

/* --------------------------------------------------------------- devices */

/* CT_TEST: the test device that ct's tests register (tests/tensor/test_device.c):
 * the CPU's kernels over a heap of its own that host code cannot touch.
 * Without it registered, a CT_TEST tensor is CT_EDEVICE.
 *
 * CT_META: PyTorch's meta device. Its tensors have shapes, dtypes and
 * strides but no memory: every op checks, broadcasts and records for
 * autograd as anywhere, and its kernel does nothing; reading one (ct_item,
 * ct_to the CPU) gives zeros, and where a value decides a shape it is taken
 * as 0 (a one_hot whose classes come from its labels has one class). Its
 * allocator counts the bytes each storage would hold, so
 * ct_memory_allocated and ct_memory_peak of CT_DEVICE_META tell what a
 * computation would need without running it (ct_memory_plan, ct/dist.h).
 * Every build has it; one device, meta:0. */
typedef enum ct_device_type { CT_CPU = 0, CT_CUDA = 1, CT_TEST = 2, CT_META = 3 } ct_device_type;

typedef struct ct_device {
    ct_device_type type;
    int index;
} ct_device;

#define CT_DEVICE_CPU  ((ct_device){CT_CPU, 0})
#define CT_DEVICE_TEST ((ct_device){CT_TEST, 0})
#define CT_DEVICE_META ((ct_device){CT_META, 0})

/* Whether a and b are one device: the same type and, but for the host
 * (one device whatever its index), the same index. */
CT_API bool ct_device_equal(ct_device a, ct_device b);
/* The device of type type that the calling thread works on: for CUDA the
 * current device (ct_cuda_set_device, or the one ct_dist_init chose for
 * the rank); index 0 for a type with one device, or none in this build. A
 * program that takes "--device cuda" without an index resolves it so. */
CT_API ct_device ct_device_current(ct_device_type type);
/* Waits until the work queued on device is done (ct_cuda_synchronize for
 * CUDA; nothing to wait for on the host). 0, or the device's error. */
CT_API int ct_synchronize(ct_device device);
/* device as messages write it, "cpu", "cuda:1" or "test:0", into buf
 * (CT_DEVICE_STR bytes); returns buf. */
#define CT_DEVICE_STR 32
CT_API const char *ct_device_str(ct_device device, char buf[CT_DEVICE_STR]);

/* -------------------------------------------------------------- storage */

/* A reference-counted block of memory on one device. Thread-safe counts. */
typedef struct ct_storage ct_storage;

/* Releases external memory handed to ct_storage_from_blob(). Called exactly
 * once, on whichever thread drops the last reference: it must be
 * thread-safe. */
typedef void (*ct_free_fn)(void *data, void *ctx);

/* New uninitialised storage of nbytes, 64-byte aligned on the CPU. The
 * caller owns the returned reference. NULL with CT_ENOMEM, or CT_EDEVICE for
 * a device that is not there. CUDA memory comes from the device's caching
 * allocator (ct/cuda.h). */
CT_API ct_storage *ct_storage_new(size_t nbytes, ct_device device);
/* Wraps memory ct did not allocate. The storage takes ownership of data and
 * calls free_fn(data, ctx) when the last reference goes (free_fn may be NULL
 * for memory that outlives the storage). The caller owns the returned
 * reference. NULL with CT_EINVAL if data is NULL and nbytes > 0. */
CT_API ct_storage *ct_storage_from_blob(void *data, size_t nbytes, ct_device device,
                                        ct_free_fn free_fn, void *ctx);
/* Bytes held by live storages that ct allocated on device (memory wrapped
 * with ct_storage_from_blob is not counted; the shared memory a
 * communicator maps for ct_comm_zeros is), and the most held at once since
 * the start or the last reset: PyTorch's memory_allocated and
 * max_memory_allocated. Thread-safe. */
CT_API int64_t ct_memory_allocated(ct_device device);
CT_API int64_t ct_memory_peak(ct_device device);
CT_API void ct_memory_reset_peak(ct_device device);
/* Adds a reference and returns s. */
CT_API ct_storage *ct_storage_retain(ct_storage *s);
/* Drops a reference; accepts NULL. */
CT_API void ct_storage_free(ct_storage *s);
CT_API void *ct_storage_data(const ct_storage *s);
CT_API size_t ct_storage_nbytes(const ct_storage *s);
CT_API ct_device ct_storage_device(const ct_storage *s);

/* -------------------------------------------------------------- tensors */

#define CT_MAX_DIMS 8

typedef struct ct_tensor ct_tensor;

/* CT_SHAPE(2, 3) expands to the (ndim, sizes) argument pair, and CT_DIMS(0,
 * 2) to the (dims, ndims) argument pair of reductions. C++ has no compound
 * literals: there the values live in an initializer_list's array, which
 * lasts until the end of the call's full expression (and a value that does
 * not fit int64_t, or int, exactly, such as a size_t variable, needs a
 * cast). */
#ifdef __cplusplus
#define CT_SHAPE(...)                                                                              \
    (int)std::initializer_list<int64_t>{__VA_ARGS__}.size(),                                       \
        std::initializer_list<int64_t>{__VA_ARGS__}.begin()
#define CT_DIMS(...)                                                                               \
    std::initializer_list<int>{__VA_ARGS__}.begin(),                                               \
        (int)std::initializer_list<int>{__VA_ARGS__}.size()
#else
#define CT_SHAPE(...)                                                                              \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]) { __VA_ARGS__ }
#define CT_DIMS(...) (int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))
#endif

/* Factories. Each returns a new contiguous CPU tensor (scope-owned inside a
 * scope). Errors: CT_EINVAL for ndim outside [0, CT_MAX_DIMS], a negative
 * size or a bad dtype; CT_ENOMEM. Thread-safe. */
CT_API ct_tensor *ct_empty(int ndim, const int64_t *sizes, ct_dtype dtype);
CT_API ct_tensor *ct_zeros(int ndim, const int64_t *sizes, ct_dtype dtype);
CT_API ct_tensor *ct_ones(int ndim, const int64_t *sizes, ct_dtype dtype);
CT_API ct_tensor *ct_full(int ndim, const int64_t *sizes, double value, ct_dtype dtype);
/* The same on a device: CUDA storage comes from the device's caching
 * allocator (ct/cuda.h), and the fill runs there. Errors as above, and
 * CT_EDEVICE for a device this process does not have. */
CT_API ct_tensor *ct_empty_on(int ndim, const int64_t *sizes, ct_dtype dtype, ct_device device);
CT_API ct_tensor *ct_full_on(int ndim, const int64_t *sizes, double value, ct_dtype dtype,
                             ct_device device);
/* Shaped, typed and placed like t (t itself is only read). CT_EINVAL for a
 * NULL or freed t. */
CT_API ct_tensor *ct_empty_like(const ct_tensor *t);
CT_API ct_tensor *ct_zeros_like(const ct_tensor *t);
CT_API ct_tensor *ct_full_like(const ct_tensor *t, double value);
/* A 0-d tensor holding value. */
CT_API ct_tensor *ct_scalar(double value, ct_dtype dtype);
/* Copies numel elements of dtype from data (row-major). */
CT_API ct_tensor *ct_from_data(const void *data, int ndim, const int64_t *sizes, ct_dtype dtype);
/* An n x m identity (m < 0 means m = n). */
CT_API ct_tensor *ct_eye(int64_t n, int64_t m, ct_dtype dtype);
/* Values start, start+step, ... below end. CT_EINVAL if step is 0 or has the
 * wrong sign. */
CT_API ct_tensor *ct_arange(double start, double end, double step, ct_dtype dtype);
/* steps values evenly from start to end inclusive. */
CT_API ct_tensor *ct_linspace(double start, double end, int64_t steps, ct_dtype dtype);
/* A view of storage (a new reference to it is taken). strides may be NULL
 * for row-major. CT_ERANGE if any element falls outside the storage. */
CT_API ct_tensor *ct_tensor_from_storage(ct_storage *storage, int64_t offset, int ndim,
                                         const int64_t *sizes, const int64_t *strides,
                                         ct_dtype dtype);

/* Adds a reference and returns t (the caller owns the new reference, even
 * inside a scope). */
CT_API ct_tensor *ct_tensor_retain(ct_tensor *t);
/* Drops a reference; accepts NULL. Inside a scope, do not free tensors the
 * scope owns. */
CT_API void ct_tensor_free(ct_tensor *t);

/* Accessors. Negative dims count from the end. None of them fail on a valid
 * tensor; an invalid dim returns -1 (ct_size, ct_stride). */
CT_API int ct_ndim(const ct_tensor *t);
CT_API int64_t ct_size(const ct_tensor *t, int dim);
CT_API int64_t ct_stride(const ct_tensor *t, int dim);
CT_API const int64_t *ct_sizes(const ct_tensor *t);
CT_API const int64_t *ct_strides(const ct_tensor *t);
CT_API int64_t ct_numel(const ct_tensor *t);
CT_API ct_dtype ct_tensor_dtype(const ct_tensor *t);
CT_API ct_device ct_tensor_device(const ct_tensor *t);
/* Borrowed: the storage lives as long as t does. */
CT_API ct_storage *ct_tensor_storage(const ct_tensor *t);
CT_API int64_t ct_tensor_offset(const ct_tensor *t);
/* Address of element [0, ..., 0]. */
CT_API void *ct_data_ptr(const ct_tensor *t);
CT_API bool ct_is_contiguous(const ct_tensor *t);
/* The version counter shared by every view of t's storage; in-place ops bump
 * it. */
CT_API uint64_t ct_tensor_version(const ct_tensor *t);
/* The single element of a one-element tensor as double / int64. NAN or 0 on
 * error (ct_errcode() tells). */
CT_API double ct_item(const ct_tensor *t);
CT_API int64_t ct_item_int64(const ct_tensor *t);
/* Element at index idx[0..ndim-1], converted to double. */
CT_API double ct_get(const ct_tensor *t, const int64_t *idx);

/* --------------------------------------------------------------- scopes */

/* Opens a scope on this thread. Scopes nest. */
CT_API void ct_scope_begin(void);
/* Releases every tensor the innermost scope owns. A scope must end on the
 * thread that began it; ending a scope that does not exist is a bug
 * (assertion). */
CT_API void ct_scope_end(void);
/* Moves t from the innermost scope to the enclosing one, or to the caller
 * when this is the outermost scope. A tensor the scope does not own is
 * returned unchanged. Accepts NULL. */
CT_API ct_tensor *ct_keep(ct_tensor *t);

/* -------------------------------------------------------------- views */

/* Views share storage with their input. Errors: CT_EINVAL for bad dims,
 * CT_ESHAPE for sizes that do not fit. */
/* sizes may hold one -1, inferred. CT_ESHAPE if the strides do not allow a
 * view (use ct_reshape). */
CT_API ct_tensor *ct_view(ct_tensor *t, int ndim, const int64_t *sizes);
/* A view when the strides allow, a contiguous copy otherwise. */
CT_API ct_tensor *ct_reshape(ct_tensor *t, int ndim, const int64_t *sizes);
CT_API ct_tensor *ct_flatten(ct_tensor *t, int start_dim, int end_dim);
CT_API ct_tensor *ct_transpose(ct_tensor *t, int dim0, int dim1);
CT_API ct_tensor *ct_permute(ct_tensor *t, const int *dims);
CT_API ct_tensor *ct_narrow(ct_tensor *t, int dim, int64_t start, int64_t length);
/* Python's t[start:end:step] along dim; start/end are clamped like Python's
 * and may be negative. step > 0. */
CT_API ct_tensor *ct_slice(ct_tensor *t, int dim, int64_t start, int64_t end, int64_t step);
/* Removes dim, keeping index. */
CT_API ct_tensor *ct_select(ct_tensor *t, int dim, int64_t index);
/* Broadcasts size-1 dims with stride 0; -1 keeps a size. */
CT_API ct_tensor *ct_expand(ct_tensor *t, int ndim, const int64_t *sizes);
/* Removes dim if its size is 1 (otherwise a plain view). */
CT_API ct_tensor *ct_squeeze(ct_tensor *t, int dim);
/* Removes every size-1 dim. */
CT_API ct_tensor *ct_squeeze_all(ct_tensor *t);
CT_API ct_tensor *ct_unsqueeze(ct_tensor *t, int dim);
/* Splits t into pieces of split_size along dim (the last may be smaller).
 * Writes up to cap views to out and returns how many pieces there are, or a
 * negative CT_E* code. */
CT_API int ct_split(ct_tensor *t, int64_t split_size, int dim, ct_tensor **out, int cap);

/* ------------------------------------------------------- copies and dtypes */

/* A contiguous tensor with t's values (a new reference to t if already
 * contiguous). */
CT_API ct_tensor *ct_contiguous(ct_tensor *t);
/* A contiguous copy. */
CT_API ct_tensor *ct_clone(ct_tensor *t);
/* Copies src into dst, broadcasting src and converting its dtype. Returns
 * dst. CT_ESHAPE if src does not broadcast to dst; CT_EINVAL if dst is an
 * expanded view or overlaps src partially. */
CT_API ct_tensor *ct_copy_(ct_tensor *dst, ct_tensor *src);
/* t converted to dtype (a new reference to t if it already has it). */
CT_API ct_tensor *ct_to_dtype(ct_tensor *t, ct_dtype dtype);

/* A copy of t on device (a new tensor, contiguous, owned like an op's
 * result), or a new reference to t when it is there already. Host to
 * device, device to host and device to device; the host waits for the copy.
 * CT_EDEVICE for a device that is not there. */
CT_API ct_tensor *ct_to(ct_tensor *t, ct_device device);
/* ct_to without the wait, where the host side is pinned (ct/cuda.h): host
 * to device from a pinned, contiguous tensor; device to host into a new
 * pinned tensor, to be read after ct_synchronize(t's device). Anything
 * else (pageable memory, a strided host view, device to device) is ct_to,
 * and waits. Owned like an op's result; errors as ct_to's. */
CT_API ct_tensor *ct_to_async(ct_tensor *t, ct_device device);

/* --------------------------------------------------------- elementwise */

/* Unary ops. Integer inputs of float-valued ops (exp, log, ...) give float32;
 * neg, abs, relu and clamp keep the dtype. The `_` forms work in place and
 * return t; CT_EDTYPE if the result dtype cannot be stored in t, CT_EINVAL if
 * t is an expanded view. */
#define CT_UNARY_OP_MAP(X)                                                                         \
    X(neg)                                                                                         \
    X(abs)                                                                                         \
    X(exp)                                                                                         \
    X(log)                                                                                         \
    X(log1p)                                                                                       \
    X(sqrt)                                                                                        \
    X(rsqrt)                                                                                       \
    X(sin)                                                                                         \
    X(cos)                                                                                         \
    X(tanh)                                                                                        \
    X(sigmoid)                                                                                     \
    X(relu)                                                                                        \
    X(gelu)                                                                                        \
    X(gelu_tanh)                                                                                   \
    X(silu)

#define CT__UNARY_DECLARE(name)                                                                    \
    CT_API ct_tensor *ct_##name(ct_tensor *t);                                                     \
    CT_API ct_tensor *ct_##name##_(ct_tensor *t);
CT_UNARY_OP_MAP(CT__UNARY_DECLARE)
#undef CT__UNARY_DECLARE

/* t ** exponent. */
CT_API ct_tensor *ct_pow_scalar(ct_tensor *t, double exponent);
CT_API ct_tensor *ct_pow_scalar_(ct_tensor *t, double exponent);
/* min(max(t, lo), hi); pass -INFINITY / INFINITY for no bound. */
CT_API ct_tensor *ct_clamp(ct_tensor *t, double lo, double hi);
CT_API ct_tensor *ct_clamp_(ct_tensor *t, double lo, double hi);

/* Binary ops broadcast a against b and promote dtypes. Scalar forms take a
 * double: with a float tensor the result keeps the tensor's dtype; with an
 * integer tensor it stays integer when the scalar is a whole number and
 * becomes float32 otherwise. The `_` forms write into a, which must already
 * have the broadcast shape. Comparisons return bool. */
#define CT_BINARY_OP_MAP(X)                                                                        \
    X(add)                                                                                         \
    X(sub)                                                                                         \
    X(mul)                                                                                         \
    X(div)                                                                                         \
    X(maximum)                                                                                     \
    X(minimum)                                                                                     \
    X(eq)                                                                                          \
    X(ne)                                                                                          \
    X(lt)                                                                                          \
    X(le)                                                                                          \
    X(gt)                                                                                          \
    X(ge)

#define CT__BINARY_DECLARE(name)                                                                   \
    CT_API ct_tensor *ct_##name(ct_tensor *a, ct_tensor *b);                                       \
    CT_API ct_tensor *ct_##name##_(ct_tensor *a, ct_tensor *b);                                    \
    CT_API ct_tensor *ct_##name##_scalar(ct_tensor *a, double b);                                  \
    CT_API ct_tensor *ct_##name##_scalar_(ct_tensor *a, double b);
CT_BINARY_OP_MAP(CT__BINARY_DECLARE)
#undef CT__BINARY_DECLARE

/* a ** b elementwise (the scalar-exponent form is ct_pow_scalar). */
CT_API ct_tensor *ct_pow(ct_tensor *a, ct_tensor *b);
CT_API ct_tensor *ct_pow_(ct_tensor *a, ct_tensor *b);

/* cond ? a : b, broadcasting all three; cond must be bool. */
CT_API ct_tensor *ct_where(ct_tensor *cond, ct_tensor *a, ct_tensor *b);
/* t with value wherever mask (bool, broadcast to t) is true. */
CT_API ct_tensor *ct_masked_fill(ct_tensor *t, ct_tensor *mask, double value);
CT_API ct_tensor *ct_masked_fill_(ct_tensor *t, ct_tensor *mask, double value);

/* ------------------------------------------------------------ reductions */

/* Reductions over the dims listed in dims[0..ndims-1] (ndims == 0: every
 * dim). keepdim keeps reduced dims with size 1. Sums of integers and bools
 * give int64; 16-bit floats accumulate in float32. CT_EINVAL for a bad or
 * repeated dim. */
CT_API ct_tensor *ct_sum(ct_tensor *t, const int *dims, int ndims, bool keepdim);
CT_API ct_tensor *ct_mean(ct_tensor *t, const int *dims, int ndims, bool keepdim);
CT_API ct_tensor *ct_prod(ct_tensor *t, const int *dims, int ndims, bool keepdim);
CT_API ct_tensor *ct_amax(ct_tensor *t, const int *dims, int ndims, bool keepdim);
CT_API ct_tensor *ct_amin(ct_tensor *t, const int *dims, int ndims, bool keepdim);
/* Variance with Bessel-style correction (1 gives the unbiased estimate). */
CT_API ct_tensor *ct_var(ct_tensor *t, const int *dims, int ndims, double correction, bool keepdim);
CT_API ct_tensor *ct_std(ct_tensor *t, const int *dims, int ndims, double correction, bool keepdim);
CT_API ct_tensor *ct_logsumexp(ct_tensor *t, const int *dims, int ndims, bool keepdim);
/* The p-norm (p = INFINITY for the max norm). */
CT_API ct_tensor *ct_norm(ct_tensor *t, double p, const int *dims, int ndims, bool keepdim);
/* Max / min along one dim: returns the values and, when indices is not NULL,
 * stores the int64 indices of the first extreme element (owned like any op
 * result). NaN counts as the extreme. */
CT_API ct_tensor *ct_max_dim(ct_tensor *t, int dim, bool keepdim, ct_tensor **indices);
CT_API ct_tensor *ct_min_dim(ct_tensor *t, int dim, bool keepdim, ct_tensor **indices);
CT_API ct_tensor *ct_argmax(ct_tensor *t, int dim, bool keepdim);
CT_API ct_tensor *ct_argmin(ct_tensor *t, int dim, bool keepdim);

/* ---------------------------------------------------------- linear algebra */

/* numpy.matmul: 1-D operands are promoted and the added dim removed; batch
 * dims broadcast. float32/float64 go to BLAS (transposed views as transpose
 * flags), 16-bit floats compute in float32. CT_ESHAPE names both shapes. */
CT_API ct_tensor *ct_matmul(ct_tensor *a, ct_tensor *b);

/* Numerically stable softmax / log_softmax along dim (float dtypes). */
CT_API ct_tensor *ct_softmax(ct_tensor *t, int dim);
CT_API ct_tensor *ct_log_softmax(ct_tensor *t, int dim);

/* --------------------------------------------------- joining and indexing */

/* Concatenates n tensors along dim (all other sizes equal; dtypes
 * promoted). */
CT_API ct_tensor *ct_cat(ct_tensor *const *ts, int n, int dim);
/* Stacks n same-shaped tensors along a new dim. */
CT_API ct_tensor *ct_stack(ct_tensor *const *ts, int n, int dim);
/* Rows of t along dim at the int64/int32 positions in the 1-D index. */
CT_API ct_tensor *ct_index_select(ct_tensor *t, int dim, ct_tensor *index);
/* out[i][j] = t[index[i][j]][j] for dim 0, and so on. */
CT_API ct_tensor *ct_gather(ct_tensor *t, int dim, ct_tensor *index);
/* A copy of t with src added at index along dim (duplicates accumulate). */
CT_API ct_tensor *ct_scatter_add(ct_tensor *t, int dim, ct_tensor *index, ct_tensor *src);
CT_API ct_tensor *ct_scatter_add_(ct_tensor *t, int dim, ct_tensor *index, ct_tensor *src);
/* int64 one-hot rows for integer labels; num_classes < 0 infers max + 1. */
CT_API ct_tensor *ct_one_hot(ct_tensor *labels, int64_t num_classes);
/* Lower / upper triangle of the last two dims, from diagonal k. */
CT_API ct_tensor *ct_tril(ct_tensor *t, int64_t k);
CT_API ct_tensor *ct_triu(ct_tensor *t, int64_t k);

/* --------------------------------------------------------------- random */

/* Philox 4x32-10 keyed by seed; each draw consumes counters from offset. The
 * same seed and offset give the same numbers on any thread count. A generator
 * is not thread-safe; the default one (generator NULL) is. */
typedef struct ct_generator {
    uint64_t seed;
    uint64_t offset;
} ct_generator;

/* Reseeds the default generator and resets its offset. */
CT_API void ct_manual_seed(uint64_t seed);
CT_API ct_generator *ct_default_generator(void);

CT_API ct_tensor *ct_rand(int ndim, const int64_t *sizes, ct_dtype dtype, ct_generator *gen);
CT_API ct_tensor *ct_randn(int ndim, const int64_t *sizes, ct_dtype dtype, ct_generator *gen);
/* Fills t with U[lo, hi) / N(mean, std). Return t. */
CT_API ct_tensor *ct_uniform_(ct_tensor *t, double lo, double hi, ct_generator *gen);
CT_API ct_tensor *ct_normal_(ct_tensor *t, double mean, double std, ct_generator *gen);
/* 1 with probability p (each element of the float tensor p), else 0; same
 * dtype as p. */
CT_API ct_tensor *ct_bernoulli(ct_tensor *p, ct_generator *gen);
CT_API ct_tensor *ct_bernoulli_(ct_tensor *t, double p, ct_generator *gen);
/* Fills the n rows of t (its dim 0) as rows rows[0..n-1] of a draw of
 * global_rows rows like them, 1 with probability p, else 0: row g's values
 * depend on the generator's state and g alone, so the rows of one draw
 * split over processes in any way come out as one process drawing them
 * all would make them. The generator advances by the whole draw's blocks,
 * whatever n. Returns t. Errors (NULL): CT_EINVAL for a t without dims, a
 * p outside [0, 1] or rows NULL with n > 0; CT_ERANGE for a row outside
 * [0, global_rows). */
CT_API ct_tensor *ct_bernoulli_rows_(ct_tensor *t, double p, const int64_t *rows,
                                     int64_t global_rows, ct_generator *gen);
/* A random permutation of 0..n-1 (int64). */
CT_API ct_tensor *ct_randperm(int64_t n, ct_generator *gen);

/* ------------------------------------------------------------- printing */

/* Writes t's values, abbreviated when large, followed by its shape, dtype
 * and strides. Returns 0 or CT_EIO. */
CT_API int ct_tensor_fprint(FILE *f, const ct_tensor *t);
CT_API void ct_print(const ct_tensor *t);

/* ---------------------------------------------------------- thread pool */

/* fn(ctx, lo, hi) is called on disjoint ranges covering [begin, end). Ranges
 * of fewer than grain items are not split; work below grain, or inside
 * another parallel region, runs inline on the caller. Blocks until all
 * ranges are done. Thread-safe: concurrent callers share the pool. */
typedef void (*ct_parallel_fn)(void *ctx, int64_t lo, int64_t hi);
CT_API void ct_parallel_for(int64_t begin, int64_t end, int64_t grain, ct_parallel_fn fn,
                            void *ctx);
/* Threads ct uses for intra-op work (CT_NUM_THREADS, default: online CPUs).
 * Setting it resizes the pool; do not call it from inside a parallel region.
 * Returns 0 or CT_EINVAL for n < 1. */
CT_API int ct_set_num_threads(int n);
CT_API int ct_get_num_threads(void);
/* True on a pool worker, or on the caller while it runs part of a region. */
CT_API bool ct_in_parallel_region(void);

/* ------------------------------------------------------ autograd hook */

/* tensor/ does not know autograd. It gives each tensor an opaque slot and
 * reports every op through a recorder that a higher layer registers. */
#define CT_OP_MAP(X)                                                                               \
    X(EMPTY)                                                                                       \
    X(VIEW)                                                                                        \
    X(EXPAND)                                                                                      \
    X(PERMUTE)                                                                                     \
    X(SLICE)                                                                                       \
    X(SELECT)                                                                                      \
    X(SQUEEZE)                                                                                     \
    X(UNSQUEEZE)                                                                                   \
    X(CONTIGUOUS)                                                                                  \
    X(CLONE) X(COPY) X(TO_DTYPE) X(NEG) X(ABS) X(EXP) X(LOG) X(LOG1P) X(SQRT) X(RSQRT) X(SIN)      \
        X(COS) X(TANH) X(SIGMOID) X(RELU) X(GELU) X(GELU_TANH) X(SILU) X(POW_SCALAR) X(CLAMP)      \
            X(ADD) X(SUB) X(MUL) X(DIV) X(POW) X(MAXIMUM) X(MINIMUM) X(EQ) X(NE) X(LT) X(LE) X(GT) \
                X(GE) X(WHERE) X(MASKED_FILL) X(SUM) X(MEAN) X(PROD) X(AMAX) X(AMIN) X(VAR) X(STD) \
                    X(LOGSUMEXP) X(NORM) X(MAX_DIM) X(MIN_DIM) X(ARGMAX) X(ARGMIN) X(MATMUL)       \
                        X(SOFTMAX) X(LOG_SOFTMAX) X(CAT) X(STACK) X(INDEX_SELECT) X(GATHER)        \
                            X(SCATTER_ADD) X(ONE_HOT) X(TRIL) X(TRIU) X(RANDOM)

typedef enum ct_op {
#define CT__OP_DEFINE(NAME) CT_OP_##NAME,
    CT_OP_MAP(CT__OP_DEFINE)
#undef CT__OP_DEFINE
        CT_NOPS
} ct_op;

CT_API const char *ct_op_name(ct_op op);

/* What an op was called with: enough for a derivative. Scalars (alpha,
 * exponent, clamp bounds, correction, p) go in scalars; dims, sizes and
 * indices in ints; a scalar operand stands in for a missing input. */
typedef struct ct_op_args {
    double scalars[2];
    int64_t ints[CT_MAX_DIMS];
    int nints;
    bool keepdim;
    bool scalar_operand;
} ct_op_args;

typedef struct ct_op_record {
    ct_op op;
    ct_tensor *const *inputs; /* borrowed for the call */
    int ninputs;
    ct_tensor *const *outputs; /* borrowed; an in-place op's output is inputs[0] */
    int noutputs;
    bool inplace;
    const ct_op_args *args;
} ct_op_record;

typedef struct ct_tensor_hooks {
    /* Called after every op, on the thread that ran it. Returns 0, or a
     * CT_E* code that makes the op fail with the recorder's message. */
    int (*record)(const ct_op_record *rec);
    /* Called when a tensor holding a non-NULL slot is destroyed. */
    void (*free_meta)(void *meta);
    /* Called before an in-place op writes into t; others are its other
     * operands (NULL entries for scalar operands). Returns 0, or a CT_E*
     * code, with a message, that makes the op fail before it writes. */
    int (*check_inplace)(ct_op op, ct_tensor *t, ct_tensor *const *others, int nothers);
} ct_tensor_hooks;

/* Registers the recorder (NULL removes it). Not thread-safe: call it before
 * ops run on other threads. */
CT_API void ct_tensor_set_hooks(const ct_tensor_hooks *hooks);
CT_API void *ct_tensor_meta(const ct_tensor *t);
/* Sets t's slot; the previous value is not freed. */
CT_API void ct_tensor_set_meta(ct_tensor *t, void *meta);

#ifdef __cplusplus
}
#endif

#endif /* CT_TENSOR_H */
