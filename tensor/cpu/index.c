/* Joining and indexing on the CPU: the table's scan_index, gather,
 * scatter_add, one_hot and band entries (device_impl.h), each moving
 * elements through the element iterator; the front ends are
 * tensor/ops/index.c. */
#include "cpu_impl.h"

/* Every dtype's zero is all-zero bytes. */
static void zero_loop(void *ctx, char **data, const int64_t *strides, int64_t n) {
    size_t esize = *(const size_t *)ctx;
    if (strides[0] == (int64_t)esize) {
        memset(data[0], 0, (size_t)n * esize);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        memset(data[0] + i * strides[0], 0, esize);
}

static void zero_into(ct_tensor *dst) {
    size_t esize = ct_dtype_size(dst->dtype);
    ct__iter it;
    ct__iter_init(&it, &dst, 1, dst->ndim, dst->sizes);
    ct__iter_run(&it, zero_loop, &esize, CT__GRAIN_ELEMENTWISE);
}

/* --------------------------------------------------------- index values */

static inline int64_t load_index(ct_dtype dtype, const char *p) {
    switch (dtype) {
    case CT_INT32: return *(const int32_t *)p;
    case CT_UINT8: return *(const uint8_t *)p;
    default: return *(const int64_t *)p;
    }
}

/* The scan's state: the first value outside [0, bound) in iteration order
 * (bound < 0: only negatives count), and the largest value. */
typedef struct index_scan {
    ct_dtype dtype;
    int64_t bound;
    bool found;
    int64_t bad, max;
} index_scan;

static void scan_loop(void *ctx, char **data, const int64_t *strides, int64_t n) {
    index_scan *s = ctx;
    for (int64_t i = 0; i < n; i++) {
        int64_t v = load_index(s->dtype, data[0] + i * strides[0]);
        if (v > s->max)
            s->max = v;
        if (!s->found && (v < 0 || (s->bound >= 0 && v >= s->bound))) {
            s->found = true;
            s->bad = v;
        }
    }
}

/* Scans on one thread, or on the device in the same order: the report must
 * name the same value every run. */
int ct__cpu_scan_index(ct_tensor *index, int64_t bound, bool *found, int64_t *bad, int64_t *max) {
    index_scan s = {index->dtype, bound, false, 0, INT64_MIN};
    ct__iter it;
    ct__iter_init(&it, &index, 1, index->ndim, index->sizes);
    if (it.numel > 0)
        ct__iter_run_range(&it, scan_loop, &s, 0, it.numel);
    *found = s.found;
    *bad = s.bad;
    *max = s.max;
    return 0;
}

/* The iterator visits every position of the index with dim collapsed; the
 * loops walk dim themselves, outermost, so that each inner run stays
 * contiguous and each line along dim is handled by one thread in order. That
 * keeps scatter_add's sums over duplicates in a fixed order. Operand 0 is
 * the destination, 1 the index, 2 the source. */
typedef struct index_loop {
    int64_t k0, k1;  /* positions along dim to walk */
    int64_t step[3]; /* byte stride along dim per operand */
    int64_t jump;    /* byte stride of the indexed operand along dim */
    ct_dtype dtype, index_dtype;
} index_loop;

static inline void copy_elem(char *dst, const char *src, size_t esize) {
    switch (esize) {
    case 1: *dst = *src; break;
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    default: memcpy(dst, src, 8); break;
    }
}

static inline void add_elem(ct_dtype dtype, char *dst, const char *src) {
    switch (dtype) {
    case CT_FLOAT32: *(float *)dst += *(const float *)src; break;
    case CT_FLOAT64: *(double *)dst += *(const double *)src; break;
    /* Integers wrap around, as in PyTorch, rather than overflow. */
    case CT_INT64: {
        int64_t *d = (int64_t *)dst;
        *d = (int64_t)((uint64_t)*d + (uint64_t) * (const int64_t *)src);
        break;
    }
    case CT_INT32: {
        int32_t *d = (int32_t *)dst;
        *d = (int32_t)((uint32_t)*d + (uint32_t) * (const int32_t *)src);
        break;
    }
    case CT_UINT8: *(uint8_t *)dst = (uint8_t)(*(uint8_t *)dst + *(const uint8_t *)src); break;
    case CT_BOOL: *(uint8_t *)dst |= *(const uint8_t *)src; break;
    default:
        ct__tensor_store_double(
            dtype, dst, ct__tensor_load_double(dtype, dst) + ct__tensor_load_double(dtype, src));
        break;
    }
}

/* dst = src[index] */
static void gather_loop(void *ctx, char **data, const int64_t *strides, int64_t n) {
    const index_loop *c = ctx;
    size_t esize = ct_dtype_size(c->dtype);
    for (int64_t k = c->k0; k < c->k1; k++) {
        char *dst = data[0] + k * c->step[0];
        const char *idx = data[1] + k * c->step[1];
        for (int64_t i = 0; i < n; i++) {
            int64_t at = load_index(c->index_dtype, idx + i * strides[1]);
            copy_elem(dst + i * strides[0], data[2] + i * strides[2] + at * c->jump, esize);
        }
    }
}

/* dst[index] += src */
static void scatter_add_loop(void *ctx, char **data, const int64_t *strides, int64_t n) {
    const index_loop *c = ctx;
    for (int64_t k = c->k0; k < c->k1; k++) {
        const char *idx = data[1] + k * c->step[1];
        const char *src = data[2] + k * c->step[2];
        for (int64_t i = 0; i < n; i++) {
            int64_t at = load_index(c->index_dtype, idx + i * strides[1]);
            add_elem(c->dtype, data[0] + i * strides[0] + at * c->jump, src + i * strides[2]);
        }
    }
}

/* Sets up the iterator over index's shape with dim collapsed, each operand
 * at its own strides, and the per-operand steps along dim; operand `indexed`
 * moves along dim by the index values instead. */
static void index_iter(ct__iter *it, index_loop *c, ct_tensor *const ops[3], int dim, int indexed) {
    const ct_tensor *index = ops[1];
    int64_t outer[CT_MAX_DIMS];
    memcpy(outer, index->sizes, sizeof outer);
    outer[dim] = 1;
    ct_tensor views[3];
    for (int k = 0; k < 3; k++) {
        views[k] = ct__layout_view(ops[k], index->ndim, outer, ops[k]->strides, ops[k]->offset);
        c->step[k] = ops[k]->strides[dim] * (int64_t)ct_dtype_size(ops[k]->dtype);
    }
    ct__iter_init(it, (ct_tensor *const[]){&views[0], &views[1], &views[2]}, 3, index->ndim, outer);
    c->jump = c->step[indexed];
    c->step[indexed] = 0;
    c->k0 = 0;
    c->k1 = index->sizes[dim];
    c->dtype = ops[0]->dtype;
    c->index_dtype = index->dtype;
}

typedef struct dim_job {
    const ct__iter *it;
    const index_loop *c;
} dim_job;

static void gather_dim_chunk(void *arg, int64_t lo, int64_t hi) {
    const dim_job *j = arg;
    index_loop c = *j->c;
    c.k0 = lo;
    c.k1 = hi;
    ct__iter_run_range(j->it, gather_loop, &c, 0, j->it->numel);
}

/* out[..., k, ...] = t[..., index[..., k, ...], ...] along dim, over index's
 * shape (which out has). The index values must be in range. */
int ct__cpu_gather(ct_tensor *out, ct_tensor *t, int dim, ct_tensor *index) {
    ct__iter it;
    index_loop c;
    index_iter(&it, &c, (ct_tensor *const[]){out, index, t}, dim, 2);
    int64_t lines = it.numel, len = c.k1;
    if (lines == 0 || len == 0)
        return 0;
    /* Gather writes each element once, so it may split along dim too; it
     * does when the lines are long and few (an embedding lookup). */
    if (len > lines) {
        dim_job j = {&it, &c};
        int64_t grain = CT__GRAIN_ELEMENTWISE / lines;
        ct_parallel_for(0, len, grain, gather_dim_chunk, &j);
    } else {
        ct__iter_run(&it, gather_loop, &c, CT__GRAIN_ELEMENTWISE / len);
    }
    return 0;
}

/* On a device the adds are atomic, and a sum over duplicate indices may
 * come in any order: float sums can differ from the CPU's in the last
 * bits. */
int ct__cpu_scatter_add(ct_tensor *self, int dim, ct_tensor *index, ct_tensor *src) {
    ct__iter it;
    index_loop c;
    index_iter(&it, &c, (ct_tensor *const[]){self, index, src}, dim, 0);
    if (it.numel > 0 && c.k1 > 0)
        ct__iter_run(&it, scatter_add_loop, &c, CT__GRAIN_ELEMENTWISE / c.k1);
    return 0;
}

/* ------------------------------------------------------------- one_hot */

typedef struct one_hot_loop {
    int64_t classes;
    ct_dtype dtype;
} one_hot_loop;

/* Operand 0 is the start of each output row, operand 1 the label. */
static void one_hot_rows(void *ctx, char **data, const int64_t *strides, int64_t n) {
    const one_hot_loop *c = ctx;
    for (int64_t i = 0; i < n; i++) {
        int64_t *row = (int64_t *)(data[0] + i * strides[0]);
        memset(row, 0, sizeof(int64_t) * (size_t)c->classes);
        row[load_index(c->dtype, data[1] + i * strides[1])] = 1;
    }
}

/* Fills out ([..., classes], contiguous) from labels already checked. */
int ct__cpu_one_hot(ct_tensor *out, ct_tensor *labels, int64_t classes) {
    ct_tensor rows = ct__layout_view(out, labels->ndim, labels->sizes, out->strides, out->offset);
    one_hot_loop c = {classes, labels->dtype};
    ct__iter it;
    ct__iter_init(&it, (ct_tensor *const[]){&rows, labels}, 2, labels->ndim, labels->sizes);
    ct__iter_run(&it, one_hot_rows, &c, CT__GRAIN_ELEMENTWISE / (classes > 0 ? classes : 1));
    return 0;
}

/* -------------------------------------------------------- tril and triu */

typedef struct band_job {
    ct_tensor *out, *t;
    int64_t k;
    bool upper;
} band_job;

/* Row i of every matrix keeps columns [lo, hi) and zeroes the rest. */
static void band_rows(void *arg, int64_t r0, int64_t r1) {
    const band_job *j = arg;
    /* Once the row dim is selected away, the columns are at its place. */
    int row_dim = j->t->ndim - 2, col_dim = row_dim;
    int64_t cols = j->t->sizes[j->t->ndim - 1];
    for (int64_t i = r0; i < r1; i++) {
        int64_t edge = j->upper ? i + j->k : i + j->k + 1;
        edge = edge < 0 ? 0 : edge > cols ? cols : edge;
        int64_t lo = j->upper ? edge : 0, hi = j->upper ? cols : edge;
        ct_tensor o = ct__tensor_select_view(j->out, row_dim, i),
                  s = ct__tensor_select_view(j->t, row_dim, i);
        ct_tensor keep = ct__tensor_narrow_view(&o, col_dim, lo, hi - lo);
        ct_tensor from = ct__tensor_narrow_view(&s, col_dim, lo, hi - lo);
        ct_tensor before = ct__tensor_narrow_view(&o, col_dim, 0, lo);
        ct_tensor after = ct__tensor_narrow_view(&o, col_dim, hi, cols - hi);
        ct__cpu_copy_into(&keep, &from);
        zero_into(&before);
        zero_into(&after);
    }
}

int ct__cpu_band(ct_tensor *out, ct_tensor *t, int64_t k, bool upper) {
    band_job j = {out, t, k, upper};
    int64_t rows = t->sizes[t->ndim - 2];
    int64_t per_row = ct_numel(t) / (rows > 0 ? rows : 1);
    /* Rows go to threads when each is small; a large row is split inside
     * by the iterator instead. */
    if (per_row >= CT__GRAIN_ELEMENTWISE)
        band_rows(&j, 0, rows);
    else if (per_row > 0)
        ct_parallel_for(0, rows, CT__GRAIN_ELEMENTWISE / per_row, band_rows, &j);
    return 0;
}
