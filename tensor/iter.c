/* The element iterator shared by every elementwise and reduction kernel,
 * and the row-major walk over a view's contiguous runs. */
#include "tensor_impl.h"

/* Should dim a be iterated inside (faster than) dim b? Decided by the first
 * operand whose strides tell the two apart; broadcast (zero) strides say
 * nothing. */
static bool inner_than(const ct__iter *it, int a, int b) {
    for (int k = 0; k < it->ntensors; k++) {
        int64_t sa = it->strides[a][k], sb = it->strides[b][k];
        if (sa == 0 || sb == 0 || sa == sb)
            continue;
        return (sa < 0 ? -sa : sa) < (sb < 0 ? -sb : sb);
    }
    return false;
}

static void swap_dims(ct__iter *it, int a, int b) {
    int64_t s = it->shape[a];
    it->shape[a] = it->shape[b];
    it->shape[b] = s;
    for (int k = 0; k < it->ntensors; k++) {
        int64_t t = it->strides[a][k];
        it->strides[a][k] = it->strides[b][k];
        it->strides[b][k] = t;
    }
}

void ct__iter_init(ct__iter *it, ct_tensor *const *ts, int n, int ndim, const int64_t *sizes) {
    CT_ASSERT(n >= 1 && n <= CT__ITER_MAX);
    it->ntensors = n;
    it->numel = ct__tensor_numel(ndim, sizes);
    int64_t esize[CT__ITER_MAX];
    for (int k = 0; k < n; k++) {
        it->data[k] = ct__data(ts[k]);
        esize[k] = (int64_t)ct__esize(ts[k]->dtype);
    }
    /* Dim 0 of the iterator is the tensor's last dim. */
    for (int d = 0; d < ndim; d++) {
        int td = ndim - 1 - d;
        it->shape[d] = sizes[td];
        for (int k = 0; k < n; k++) {
            const ct_tensor *t = ts[k];
            int kd = td - (ndim - t->ndim);
            it->strides[d][k] = kd < 0 || t->sizes[kd] == 1 ? 0 : t->strides[kd] * esize[k];
        }
    }
    /* Stable insertion sort: the innermost dim gets the smallest stride. */
    for (int i = 1; i < ndim; i++)
        for (int j = i; j > 0 && inner_than(it, j, j - 1); j--)
            swap_dims(it, j, j - 1);
    /* Drop size-1 dims, then merge neighbours that are contiguous in every
     * operand. */
    int out = 0;
    for (int d = 0; d < ndim; d++) {
        if (it->shape[d] == 1)
            continue;
        if (out > 0) {
            bool merge = true;
            for (int k = 0; k < n && merge; k++)
                merge = it->strides[d][k] == it->shape[out - 1] * it->strides[out - 1][k];
            if (merge) {
                it->shape[out - 1] *= it->shape[d];
                continue;
            }
        }
        it->shape[out] = it->shape[d];
        for (int k = 0; k < n; k++)
            it->strides[out][k] = it->strides[d][k];
        out++;
    }
    if (out == 0) {
        it->shape[0] = 1;
        for (int k = 0; k < n; k++)
            it->strides[0][k] = 0;
        out = 1;
    }
    it->ndim = out;
}

void ct__iter_run_range(const ct__iter *it, ct__loop_fn loop, void *ctx, int64_t lo, int64_t hi) {
    int n = it->ntensors;
    char *ptr[CT__ITER_MAX];
    /* Coalescing leaves one dim for most operands: no odometer needed. */
    if (it->ndim == 1) {
        for (int k = 0; k < n; k++)
            ptr[k] = it->data[k] + lo * it->strides[0][k];
        loop(ctx, ptr, it->strides[0], hi - lo);
        return;
    }
    int64_t idx[CT_MAX_DIMS];
    int64_t rem = lo;
    for (int k = 0; k < n; k++)
        ptr[k] = it->data[k];
    for (int d = 0; d < it->ndim; d++) {
        idx[d] = rem % it->shape[d];
        rem /= it->shape[d];
        for (int k = 0; k < n; k++)
            ptr[k] += idx[d] * it->strides[d][k];
    }
    const int64_t *inner = it->strides[0];
    int64_t pos = lo;
    while (pos < hi) {
        int64_t len = it->shape[0] - idx[0];
        if (len > hi - pos)
            len = hi - pos;
        loop(ctx, ptr, inner, len);
        pos += len;
        /* Advance the odometer past the run just done. */
        for (int k = 0; k < n; k++)
            ptr[k] += len * inner[k];
        idx[0] += len;
        for (int d = 0; d + 1 < it->ndim && idx[d] == it->shape[d]; d++) {
            for (int k = 0; k < n; k++)
                ptr[k] += it->strides[d + 1][k] - it->shape[d] * it->strides[d][k];
            idx[d] = 0;
            idx[d + 1]++;
        }
    }
}

typedef struct iter_job {
    const ct__iter *it;
    ct__loop_fn loop;
    void *ctx;
} iter_job;

static void iter_chunk(void *arg, int64_t lo, int64_t hi) {
    const iter_job *j = arg;
    ct__iter_run_range(j->it, j->loop, j->ctx, lo, hi);
}

void ct__iter_run(const ct__iter *it, ct__loop_fn loop, void *ctx, int64_t grain) {
    if (it->numel == 0)
        return;
    /* What ct_parallel_for would do below the grain, without its call and
     * its bookkeeping: loops never start parallel work of their own. */
    if (it->numel <= grain) {
        ct__iter_run_range(it, loop, ctx, 0, it->numel);
        return;
    }
    iter_job j = {it, loop, ctx};
    ct_parallel_for(0, it->numel, grain, iter_chunk, &j);
}

int ct__tensor_for_each_run(const ct_tensor *t, ct__run_fn fn, void *ctx) {
    const char *base = ct_data_ptr(t);
    const size_t esize = ct__esize(t->dtype);
    int64_t numel = ct__tensor_numel(t->ndim, t->sizes);
    if (numel == 0)
        return 0;
    /* The innermost dims that are contiguous (or of size 1) make one run. */
    int outer = t->ndim;
    int64_t run = 1;
    while (outer > 0 && (t->sizes[outer - 1] == 1 || t->strides[outer - 1] == run))
        run *= t->sizes[--outer];
    int64_t idx[CT_MAX_DIMS] = {0};
    for (int64_t r = 0; r < numel / run; r++) {
        int64_t off = 0;
        for (int d = 0; d < outer; d++)
            off += idx[d] * t->strides[d];
        int rc = fn(ctx, base + off * (int64_t)esize, (size_t)run * esize);
        if (rc)
            return rc;
        for (int d = outer - 1; d >= 0 && ++idx[d] == t->sizes[d]; d--)
            idx[d] = 0;
    }
    return 0;
}
