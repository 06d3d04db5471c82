/* The CPU's dispatch table (device_impl.h): its kernels, its memory. */
#include "cpu_impl.h"
#include "device_impl.h"

typedef struct fill_job {
    char *data;
    size_t esize;
    unsigned char value[8]; /* one element, already in the dtype's bytes */
} fill_job;

/* Writes the element once, then doubles the filled prefix with memcpy: any
 * element size, at memcpy speed. */
static void fill_chunk(void *arg, int64_t lo, int64_t hi) {
    const fill_job *j = arg;
    char *p = j->data + lo * (int64_t)j->esize;
    size_t total = (size_t)(hi - lo) * j->esize, done = j->esize;
    memcpy(p, j->value, j->esize);
    while (done < total) {
        size_t n = done < total - done ? done : total - done;
        memcpy(p + done, p, n);
        done += n;
    }
}

int ct__cpu_fill(ct_tensor *t, double value) {
    fill_job j = {ct__data(t), ct_dtype_size(t->dtype), {0}};
    ct__tensor_store_double(t->dtype, j.value, value);
    if (ct_is_contiguous(t)) {
        ct_parallel_for(0, ct_numel(t), CT__GRAIN_ELEMENTWISE, fill_chunk, &j);
        return 0;
    }
    /* A view: masked_fill's loop with every element selected. */
    ct__scalar_operand mask;
    uint64_t bits;
    memcpy(&bits, j.value, sizeof bits);
    return ct__cpu_where(t, ct__cpu_scalar_operand_init(&mask, 1, CT_BOOL), NULL, t, &bits, t->ndim,
                         t->sizes);
}

/* Its message names storage_new, as the host's allocations all do. */
static ct_storage *cpu_storage_new(const char *op, size_t nbytes, int index) {
    (void)op;
    (void)index;
    return ct__cpu_storage_new(nbytes);
}

static int64_t cpu_allocated(int index) {
    (void)index;
    return ct__cpu_memory_allocated();
}

static int64_t cpu_peak(int index) {
    (void)index;
    return ct__cpu_memory_peak();
}

static void cpu_reset_peak(int index) {
    (void)index;
    ct__cpu_memory_reset_peak();
}

/* The CPU's work is done when its kernels return. */
static int cpu_synchronize(int index) {
    (void)index;
    return 0;
}

static int cpu_read(int index, void *dst, const void *src, size_t n) {
    (void)index;
    memcpy(dst, src, n);
    return 0;
}

static int cpu_copy(ct_tensor *dst, ct_tensor *src) {
    ct__cpu_copy_into(dst, src);
    return 0;
}

const ct__device_ops ct__cpu_device_ops = {
    .name = "cpu",
    .storage_new = cpu_storage_new,
    .memory_allocated = cpu_allocated,
    .memory_peak = cpu_peak,
    .memory_reset_peak = cpu_reset_peak,
    .synchronize = cpu_synchronize,
    .read = cpu_read,
    .copy = cpu_copy,
    .fill = ct__cpu_fill,
    .unary = ct__cpu_unary,
    .binary = ct__cpu_binary,
    .where = ct__cpu_where,
    .reduce = ct__cpu_reduce,
    .softmax = ct__cpu_softmax,
    .layer_norm = ct__cpu_layer_norm,
    .layer_norm_backward = ct__cpu_layer_norm_backward,
    .cross_entropy = ct__cpu_cross_entropy,
    .cross_entropy_backward = ct__cpu_cross_entropy_backward,
    .attention = ct__cpu_attention,
    .optim_step = ct__cpu_optim_step,
    .scan_index = ct__cpu_scan_index,
    .gather = ct__cpu_gather,
    .scatter_add = ct__cpu_scatter_add,
    .one_hot = ct__cpu_one_hot,
    .band = ct__cpu_band,
    .matmul = ct__cpu_matmul,
    .mm_limit = CT__CPU_MM_LIMIT,
    .draw = ct__cpu_draw,
    .scan_probabilities = ct__cpu_scan_probabilities,
};
