/* ct tensor internal header: not installed, not part of the API.
 *
 * The layouts of ct_tensor and ct_storage and what works on them: views
 * made on the stack, raw data pointers, the element iterator, the dtypes'
 * element types and conversions, op recording. Only the modules that work
 * on the layouts are granted it (ci/layers.py's LAYOUT: autograd, nn,
 * optim, collectives, dist_autograd); everything else a module needs from
 * tensor/ is in the base layer (base/base_impl.h, included below), on every
 * module's path (docs/decisions.md, "The base layer"). */
#ifndef CT_TENSOR_IMPL_H
#define CT_TENSOR_IMPL_H

#include <ct/tensor.h>

#include "base/base_impl.h"

#include <stdatomic.h>
#include <string.h>

/* --------------------------------------------------------------- objects */

#define CT__TENSOR_MAGIC 0x63745431u /* "ctT1" */
#define CT__TENSOR_DEAD  0xdeadc7c7u

struct ct_storage {
    atomic_long refcount;
    atomic_uint_fast64_t version;
    void *data;
    size_t nbytes;
    ct_device device;
    bool counted;       /* ct allocated data: counts toward ct_memory_allocated */
    ct_free_fn free_fn; /* releases data; NULL when data lives in block or is foreign */
    void *free_ctx;
    /* Its memory was handed back (ct__tensor_storage_release): data is NULL until
     * ct__tensor_storage_restore. */
    bool released;
    /* Why kernels must not read it now (released, or a transfer fills it:
     * ct__tensor_storage_mark); NULL when they may. */
    const char *unusable;
    /* The heap block this header lives in, freed last: the storage itself,
     * or the tensor object ct__tensor_new made alongside it (NULL: not on the
     * heap). */
    void *block;
};

struct ct_tensor {
    uint32_t magic;
    atomic_long refcount;
    ct_storage *storage;
    int64_t offset; /* in elements */
    int ndim;
    ct_dtype dtype;
    int64_t sizes[CT_MAX_DIMS];
    int64_t strides[CT_MAX_DIMS]; /* in elements */
    void *meta;                   /* autograd's slot */
};

/* A header over t's storage with another shape, strides and offset (in
 * elements), on the stack: the views kernels take, made without a new
 * tensor object. */
static inline ct_tensor ct__layout_view(const ct_tensor *t, int ndim, const int64_t *sizes,
                                        const int64_t *strides, int64_t offset) {
    ct_tensor v = {.magic = CT__TENSOR_MAGIC,
                   .storage = t->storage,
                   .offset = offset,
                   .ndim = ndim,
                   .dtype = t->dtype};
    memcpy(v.sizes, sizes, sizeof(int64_t) * (size_t)ndim);
    memcpy(v.strides, strides, sizeof(int64_t) * (size_t)ndim);
    return v;
}

/* t narrowed to [start, start + length) along dim, and t at index along
 * dim (one dim fewer): ct__layout_view's, for the index ops' pieces. */
static inline ct_tensor ct__tensor_narrow_view(const ct_tensor *t, int dim, int64_t start,
                                               int64_t length) {
    int64_t sizes[CT_MAX_DIMS];
    memcpy(sizes, t->sizes, sizeof sizes);
    sizes[dim] = length;
    return ct__layout_view(t, t->ndim, sizes, t->strides, t->offset + start * t->strides[dim]);
}

static inline ct_tensor ct__tensor_select_view(const ct_tensor *t, int dim, int64_t index) {
    int64_t sizes[CT_MAX_DIMS], strides[CT_MAX_DIMS];
    for (int i = 0, j = 0; i < t->ndim; i++) {
        if (i == dim)
            continue;
        sizes[j] = t->sizes[i];
        strides[j++] = t->strides[i];
    }
    return ct__layout_view(t, t->ndim - 1, sizes, strides, t->offset + index * t->strides[dim]);
}

static inline char *ct__data(const ct_tensor *t) {
    return (char *)t->storage->data + t->offset * (int64_t)ct__esize(t->dtype);
}

static inline bool ct__same_shape(const ct_tensor *a, const ct_tensor *b) {
    return a->ndim == b->ndim && memcmp(a->sizes, b->sizes, sizeof(int64_t) * (size_t)a->ndim) == 0;
}
/* Wraps a negative dim; -1 and an error message on a bad one. */
int ct__tensor_wrap_dim(const char *op, int dim, int ndim);
/* A new tensor object viewing storage (retained); registered in the current
 * scope. */
ct_tensor *ct__tensor_make_view(ct_tensor *base, int ndim, const int64_t *sizes,
                                const int64_t *strides, int64_t offset);

/* A 0-d tensor in caller storage holding one value: how scalar operands
 * reach the element iterator without a heap allocation. It is for the
 * iterator only: never record, own, retain, free or return it. */
typedef struct ct__scalar_operand {
    ct_tensor tensor;
    ct_storage storage;
    union {
        double f64;
        int64_t i64;
        unsigned char bytes[8];
    } value;
} ct__scalar_operand;
/* Initialises op with value converted to dtype; returns &op->tensor. */
ct_tensor *ct__cpu_scalar_operand_init(ct__scalar_operand *op, double value, ct_dtype dtype);

/* Reports an op to the autograd recorder. On failure the outputs are
 * released (not in-place ones) and NULL is returned; otherwise outputs[0]. */
ct_tensor *ct__tensor_record(ct_op op, ct_tensor *const *inputs, int ninputs,
                             ct_tensor *const *outputs, int noutputs, bool inplace,
                             const ct_op_args *args);
static inline ct_tensor *ct__tensor_record1(ct_op op, ct_tensor *out, ct_tensor *const *inputs,
                                            int ninputs, const ct_op_args *args) {
    return ct__tensor_record(op, inputs, ninputs, &out, 1, false, args);
}

/* Checks that out may be written in place by op (named name for messages):
 * not an expanded view, not partially overlapping any of ins (its other
 * operands), and allowed by the autograd hook. Bumps the version on
 * success. */
int ct__tensor_check_inplace(ct_op op, const char *name, ct_tensor *out, ct_tensor *const *ins,
                             int nins);

/* Broadcasts shapes a and b into out; CT_ESHAPE message names op. */
int ct__tensor_broadcast_shapes(const char *op, int na, const int64_t *a, int nb, const int64_t *b,
                                int *nout, int64_t *out);

/* ------------------------------------------------------- 16-bit floats */

static inline float ct__bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t ct__f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);         /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float ct__tensor_f16_to_f32(uint16_t h);
uint16_t ct__tensor_f32_to_f16(float f);

/* Per-dtype element type (T), compute type (ACC), and conversions between
 * them (IN: T -> ACC, OUT: ACC -> T). Kernels are stamped out per dtype with
 * these, following the accumulate-type rule: 16-bit floats compute in float,
 * integers in int64. */
#define CT__T_FLOAT32       float
#define CT__ACC_FLOAT32     float
#define CT__IN_FLOAT32(v)   (v)
#define CT__OUT_FLOAT32(v)  ((float)(v))
#define CT__T_FLOAT64       double
#define CT__ACC_FLOAT64     double
#define CT__IN_FLOAT64(v)   (v)
#define CT__OUT_FLOAT64(v)  ((double)(v))
#define CT__T_BFLOAT16      uint16_t
#define CT__ACC_BFLOAT16    float
#define CT__IN_BFLOAT16(v)  ct__bf16_to_f32(v)
#define CT__OUT_BFLOAT16(v) ct__f32_to_bf16((float)(v))
#define CT__T_FLOAT16       uint16_t
#define CT__ACC_FLOAT16     float
#define CT__IN_FLOAT16(v)   ct__tensor_f16_to_f32(v)
#define CT__OUT_FLOAT16(v)  ct__tensor_f32_to_f16((float)(v))
#define CT__T_INT64         int64_t
#define CT__ACC_INT64       int64_t
#define CT__IN_INT64(v)     (v)
#define CT__OUT_INT64(v)    ((int64_t)(v))
#define CT__T_INT32         int32_t
#define CT__ACC_INT32       int64_t
#define CT__IN_INT32(v)     ((int64_t)(v))
#define CT__OUT_INT32(v)    ((int32_t)(int64_t)(v))
#define CT__T_UINT8         uint8_t
#define CT__ACC_UINT8       int64_t
#define CT__IN_UINT8(v)     ((int64_t)(v))
#define CT__OUT_UINT8(v)    ((uint8_t)(int64_t)(v))
#define CT__T_BOOL          uint8_t
#define CT__ACC_BOOL        int64_t
#define CT__IN_BOOL(v)      ((int64_t)((v) != 0))
#define CT__OUT_BOOL(v)     ((uint8_t)((v) != 0))

#define CT__FLOAT_DTYPES(X) X(FLOAT32) X(FLOAT64) X(BFLOAT16) X(FLOAT16)
#define CT__INT_DTYPES(X)   X(INT64) X(INT32) X(UINT8)
#define CT__ALL_DTYPES(X)   CT__FLOAT_DTYPES(X) CT__INT_DTYPES(X) X(BOOL)

/* --------------------------------------------------- the element iterator */

/* One iterator serves every elementwise and reduction kernel. It broadcasts
 * operands to a common shape, orders dims so that the first operand's
 * smallest stride comes first, and coalesces dims that are contiguous in
 * every operand. Kernels then see a 1-D inner loop with a byte stride per
 * operand, which the compiler can vectorize when strides equal the element
 * size. */
#define CT__ITER_MAX 4

typedef struct ct__iter {
    int ntensors;                               /* outputs first */
    int ndim;                                   /* after coalescing */
    int64_t shape[CT_MAX_DIMS];                 /* dim 0 is innermost */
    int64_t strides[CT_MAX_DIMS][CT__ITER_MAX]; /* bytes, [dim][operand] */
    char *data[CT__ITER_MAX];
    int64_t numel;
} ct__iter;

/* Inner loop: n elements, operand k at data[k] advancing strides[k] bytes. */
typedef void (*ct__loop_fn)(void *ctx, char **data, const int64_t *strides, int64_t n);

/* Builds an iterator over ts[0..n-1]; every operand is viewed with the
 * broadcast shape (ndim, sizes); zero strides broadcast. */
void ct__iter_init(ct__iter *it, ct_tensor *const *ts, int n, int ndim, const int64_t *sizes);
/* Runs loop over every element, splitting the range across the pool in
 * pieces of at least grain elements. Elementwise loops only: the pieces must
 * be independent. */
void ct__iter_run(const ct__iter *it, ct__loop_fn loop, void *ctx, int64_t grain);
/* Runs loop sequentially over the linear range [lo, hi) of the iterator. */
void ct__iter_run_range(const ct__iter *it, ct__loop_fn loop, void *ctx, int64_t lo, int64_t hi);

/* Grain sizes: below these, work runs on one thread. */
#define CT__GRAIN_ELEMENTWISE 32768
#define CT__GRAIN_REDUCE      32768

/* --------------------------------------------------------- scalar loads */

/* g * f'(x) for the activation f of op (CT_OP_GELU, CT_OP_GELU_TANH,
 * CT_OP_SILU) in one pass over CPU tensors (or meta ones: the result
 * without the pass, so that a plan holds what the CPU's backward holds),
 * broadcast, in their promoted
 * float dtype; not recorded for autograd (backward calls it with grad mode
 * off). A new tensor owned like an op result; CT_ENOTSUP for another op or
 * a non-float dtype. */
ct_tensor *ct__cpu_activation_grad(ct_op op, ct_tensor *x, ct_tensor *g);

/* Reserves nblocks Philox blocks of gen (NULL: the default generator) for a
 * draw made outside random.c, and returns where they start: the draw then
 * follows philox.h's layouts from (*seed, *offset). Thread-safe for the
 * default generator only, as ct_generator is. */
void ct__tensor_generator_claim(ct_generator *gen, uint64_t nblocks, uint64_t *seed,
                                uint64_t *offset);

/* Reads element i of dtype at p as double / writes v converted. */
double ct__tensor_load_double(ct_dtype dtype, const void *p);
void ct__tensor_store_double(ct_dtype dtype, void *p, double v);

/* The loop that converts an (out, in) operand pair from one dtype to
 * another; ctx is unused. */
ct__loop_fn ct__cpu_cast_kernel(ct_dtype to, ct_dtype from);

/* ------------------------------------------------------------- GEMM */

/* C = alpha op(A) op(B) + beta C in float32, row-major, with cblas_sgemm's
 * arguments: op(A) is m x k, op(B) k x n, C m x n with row stride ldc.
 * beta = 0 never reads C. Thin products go to ct's kernel, the rest to
 * OpenBLAS, chosen by n and k (and m >= 2); each element's sum over k has
 * one fixed order, so a product split into row blocks of 2 rows or more has
 * the same bits as the whole. Single-threaded (callers split); thread-safe;
 * never fails (tensor/cpu/gemm.c). */
void ct__cpu_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                   int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* ------------------------------------------------------------ memory */

/* 64-byte aligned CPU memory of at least nbytes (a unique pointer even for
 * 0). *capacity receives the value to hand back to ct__cpu_free. NULL when
 * out of memory. Thread-safe. */
void *ct__cpu_alloc(size_t nbytes, size_t *capacity);
void ct__cpu_free(void *p, size_t capacity);

#endif
