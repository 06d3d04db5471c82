/* Reduction kernels of the collectives (declared in coll_impl.h).
 *
 * Every backend that reduces on the CPU goes through these, so that all of
 * them give the same answer:
 * - 16-bit floats accumulate in float32 and round to their dtype once, in
 *   finish/store, as ARCHITECTURE.md asks ("arithmetic accumulates in
 *   float32"); every other dtype accumulates in itself, which is what torch
 *   and NCCL do (an int32 sum wraps as int32).
 * - Integer arithmetic wraps (it goes through the unsigned twin of the
 *   type, so overflow is defined), avg truncates toward zero, and float
 *   min/max propagate NaN, all as torch does.
 * - Each element is one expression in a fixed order with no reassociation,
 *   so the same inputs combined in the same order give bitwise identical
 *   results on every rank, every run and every vector width. avg divides
 *   (x / n rounds differently from x * (1.0 / n)).
 *
 * The loops are the hot path of the shm ring (64 KiB chunks). They take no
 * restrict, since buffers of the same type may alias; the compiler then
 * vectorizes them behind a run-time overlap check.
 *
 * Thread-safety: pure functions of their arguments.
 */
#include "coll_impl.h"
#include "tensor_impl.h"

#include <math.h>

/* Per dtype: element type (T), accumulator type (A), the accumulator's
 * unsigned twin for wrapping arithmetic (U; the type itself for floats),
 * T -> A and A -> T conversions of v, and whether v is NaN.
 *
 * bool is 0/1 bytes: loads and stores normalize any nonzero byte to 1, and
 * its or/and are max/min (see kernel_op), which stay right even on an
 * unnormalized byte because they only pick one of their operands. */
#define RED_DTYPES(X)                                                                              \
    X(FLOAT32, float, float, float, (v), (v), isnan(v))                                            \
    X(FLOAT64, double, double, double, (v), (v), isnan(v))                                         \
    X(BFLOAT16, uint16_t, float, float, ct__bf16_to_f32(v), ct__f32_to_bf16(v), isnan(v))          \
    X(FLOAT16, uint16_t, float, float, ct__tensor_f16_to_f32(v), ct__tensor_f32_to_f16(v),         \
      isnan(v))                                                                                    \
    X(INT64, int64_t, int64_t, uint64_t, (v), (v), false)                                          \
    X(INT32, int32_t, int32_t, uint32_t, (v), (v), false)                                          \
    X(UINT8, uint8_t, uint8_t, uint8_t, (v), (v), false)                                           \
    X(BOOL, uint8_t, uint8_t, uint8_t, (uint8_t)((v) != 0), (uint8_t)((v) != 0), false)

/* The element operations of one dtype. sum also serves avg, whose division
 * by the group size happens in finish/store (div; keep for the others). */
#define RED_DEFINE_OPS(NAME, T, A, U, LOAD, STORE, ISNAN)                                          \
    static inline A ld_##NAME(T v) { return LOAD; }                                                \
    static inline T st_##NAME(A v) { return STORE; }                                               \
    static inline A sum_##NAME(A a, A b) { return (A)((U)a + (U)b); }                              \
    static inline A prod_##NAME(A a, A b) { return (A)((U)a * (U)b); }                             \
    static inline bool nan_##NAME(A v) { return ISNAN; }                                           \
    static inline A min_##NAME(A a, A b) { return a < b || nan_##NAME(a) ? a : b; }                \
    static inline A max_##NAME(A a, A b) { return a > b || nan_##NAME(a) ? a : b; }                \
    static inline A div_##NAME(A a, int nranks) { return (A)(a / nranks); }                        \
    static inline A keep_##NAME(A a, int nranks) { return a; }

/* Loop bodies over the locals of the functions below, for element
 * operation OP and finishing step FIN. */
#define RED_LOOP_COMBINE(NAME, OP, FIN)                                                            \
    for (int64_t i = 0; i < n; i++)                                                                \
        acc_out[i] = OP##_##NAME(acc_in[i], ld_##NAME(src[i]));
#define RED_LOOP_FINISH(NAME, OP, FIN)                                                             \
    for (int64_t i = 0; i < n; i++)                                                                \
        out[i] = st_##NAME(FIN##_##NAME(OP##_##NAME(acc_in[i], ld_##NAME(src[i])), nranks));
#define RED_LOOP_STORE(NAME, OP, FIN)                                                              \
    for (int64_t i = 0; i < n; i++)                                                                \
        out[i] = st_##NAME(FIN##_##NAME(acc[i], nranks));

/* One loop per op, chosen once per call rather than per element. */
#define RED_SWITCH(LOOP, NAME)                                                                     \
    switch (op) {                                                                                  \
    case CT_REDUCE_SUM: LOOP(NAME, sum, keep) return;                                              \
    case CT_REDUCE_AVG: LOOP(NAME, sum, div) return;                                               \
    case CT_REDUCE_MIN: LOOP(NAME, min, keep) return;                                              \
    case CT_REDUCE_MAX: LOOP(NAME, max, keep) return;                                              \
    case CT_REDUCE_PROD: LOOP(NAME, prod, keep) return;                                            \
    }                                                                                              \
    CT_ASSERT(!"reduce op out of range");

#define RED_DEFINE_KERNELS(NAME, T, A, U, LOAD, STORE, ISNAN)                                      \
    RED_DEFINE_OPS(NAME, T, A, U, LOAD, STORE, ISNAN)                                              \
    static void load_##NAME(void *acc_, const void *src_, int64_t n) {                             \
        A *acc = acc_;                                                                             \
        const T *src = src_;                                                                       \
        for (int64_t i = 0; i < n; i++)                                                            \
            acc[i] = ld_##NAME(src[i]);                                                            \
    }                                                                                              \
    static void combine_##NAME(void *acc_out_, const void *acc_in_, const void *src_, int64_t n,   \
                               ct_reduce_op op) {                                                  \
        A *acc_out = acc_out_;                                                                     \
        const A *acc_in = acc_in_;                                                                 \
        const T *src = src_;                                                                       \
        RED_SWITCH(RED_LOOP_COMBINE, NAME)                                                         \
    }                                                                                              \
    static void finish_##NAME(void *out_, const void *acc_in_, const void *src_, int64_t n,        \
                              ct_reduce_op op, int nranks) {                                       \
        T *out = out_;                                                                             \
        const A *acc_in = acc_in_;                                                                 \
        const T *src = src_;                                                                       \
        RED_SWITCH(RED_LOOP_FINISH, NAME)                                                          \
    }                                                                                              \
    static void store_##NAME(void *out_, const void *acc_, int64_t n, ct_reduce_op op,             \
                             int nranks) {                                                         \
        T *out = out_;                                                                             \
        const A *acc = acc_;                                                                       \
        RED_SWITCH(RED_LOOP_STORE, NAME)                                                           \
    }

RED_DTYPES(RED_DEFINE_KERNELS)

typedef struct red_kernels {
    size_t acc_size;
    void (*load)(void *acc, const void *src, int64_t n);
    void (*combine)(void *acc_out, const void *acc_in, const void *src, int64_t n, ct_reduce_op op);
    void (*finish)(void *out, const void *acc_in, const void *src, int64_t n, ct_reduce_op op,
                   int nranks);
    void (*store)(void *out, const void *acc, int64_t n, ct_reduce_op op, int nranks);
} red_kernels;

#define RED_ROW(NAME, T, A, ...)                                                                   \
    [CT_##NAME] = {sizeof(A), load_##NAME, combine_##NAME, finish_##NAME, store_##NAME},
static const red_kernels red_table[CT_NDTYPES] = {RED_DTYPES(RED_ROW)};

#define RED_COUNT(...) +1
_Static_assert(0 RED_DTYPES(RED_COUNT) == CT_NDTYPES,
               "every dtype of CT_DTYPE_MAP needs a row in RED_DTYPES");

static const red_kernels *kernels_of(ct_dtype dtype) {
    CT_ASSERT((unsigned)dtype < CT_NDTYPES);
    return &red_table[dtype];
}

/* The op the kernels run: bool's sum is or and its prod is and, which on
 * 0/1 values are max and min. comm.c rejects avg of bool before here. */
static ct_reduce_op kernel_op(ct_dtype dtype, ct_reduce_op op) {
    if (dtype != CT_BOOL)
        return op;
    CT_ASSERT(op != CT_REDUCE_AVG);
    return op == CT_REDUCE_SUM ? CT_REDUCE_MAX : op == CT_REDUCE_PROD ? CT_REDUCE_MIN : op;
}

size_t ct__coll_acc_size(ct_dtype dtype) { return kernels_of(dtype)->acc_size; }

void ct__coll_acc_load(void *acc, const void *src, int64_t n, ct_dtype dtype) {
    kernels_of(dtype)->load(acc, src, n);
}

void ct__coll_acc_combine(void *acc_out, const void *acc_in, const void *src, int64_t n,
                          ct_dtype dtype, ct_reduce_op op) {
    kernels_of(dtype)->combine(acc_out, acc_in, src, n, kernel_op(dtype, op));
}

void ct__coll_acc_finish(void *out, const void *acc_in, const void *src, int64_t n, ct_dtype dtype,
                         ct_reduce_op op, int nranks) {
    CT_ASSERT(nranks > 0);
    kernels_of(dtype)->finish(out, acc_in, src, n, kernel_op(dtype, op), nranks);
}

void ct__coll_acc_store(void *out, const void *acc, int64_t n, ct_dtype dtype, ct_reduce_op op,
                        int nranks) {
    CT_ASSERT(nranks > 0);
    kernels_of(dtype)->store(out, acc, n, kernel_op(dtype, op), nranks);
}
