/* Launches of the reduction family's kernels (reduce.cu) from tensors: the
 * plans of tensor/cpu/reduce_impl.h turned into the kernels' plain
 * arguments. CUDA builds only. */
#include "cpu/reduce_impl.h"
#include "cuda_impl.h"

/* A space of a plan, with operand in's strides as the input's and operand
 * out's (or none, out < 0) as the output's. */
static void space_of(ct__cuda_red_space *k, const ct__red_space *s, int in, int out) {
    *k = (ct__cuda_red_space){.ndim = s->ndim, .numel = s->numel};
    for (int d = 0; d < s->ndim; d++) {
        k->shape[d] = s->shape[d];
        k->in[d] = s->strides[d][in];
        k->out[d] = out >= 0 ? s->strides[d][out] : 0;
    }
}

static int launched(int e, const ct_tensor *t, const char *what) {
    return ct__cuda_launched(e, t->storage->device.index, what);
}

/* Each kind's family and map, as the kernels take them (ops_impl.h). */
static const struct {
    int family, map;
} kinds[CT__NUM_RED_KINDS] = {
#define KIND_ROW(KIND, FAMILY, MAP) [CT__KIND_##KIND] = {CT__RED_##FAMILY, CT__MAP_##MAP},
    CT__RED_KINDS(KIND_ROW)
#undef KIND_ROW
};

int ct__cuda_reduce(const ct__reduction *r, ct_tensor *in, ct_tensor *out, ct_tensor *indices,
                    const bool *mask, bool keepdim) {
    ct__cuda_reduce_args args = {.family = kinds[r->kind].family,
                                 .map = kinds[r->kind].map,
                                 .post = r->post,
                                 .scalar = r->scalar,
                                 .index_only = r->index_only};
    ct__cuda_reduce_args *a = &args;
    a->in_dtype = (int)in->dtype;
    a->out_dtype = (int)out->dtype;
    a->in = ct__data(in);
    a->out = ct__data(out);
    a->indices = indices ? ct__data(indices) : NULL;
    a->nred = 1;
    for (int d = 0; d < in->ndim; d++)
        a->nred *= mask[d] ? in->sizes[d] : 1;
    int64_t nout = ct_numel(out);
    if (nout == 0)
        return 0;
    if (a->nred == 0) {
        /* Every output is the identity, written in order. */
        a->kept = (ct__cuda_red_space){.ndim = 1, .numel = nout, .shape = {nout}};
        a->kept.out[0] = (int64_t)ct__esize(out->dtype);
        a->red = (ct__cuda_red_space){.ndim = 1, .numel = 0};
    } else {
        ct_tensor marker;
        ct__red_marker(&marker, out, in, mask, keepdim);
        ct__red_plan plan;
        ct__red_plan_init(&plan, (ct_tensor *[]){in, &marker}, 2);
        space_of(&a->kept, &plan.kept, 0, 1);
        space_of(&a->red, &plan.red, 0, -1);
    }
    int device = in->storage->device.index;
    int64_t bytes = ct__cuda_reduce_workspace(a);
    ct_storage *ws = bytes > 0 ? ct__cuda_storage_new("reduce", (size_t)bytes, device) : NULL;
    if (bytes > 0 && !ws)
        return ct_errcode();
    a->workspace = ws ? ws->data : NULL;
    void *stream;
    int rc = ct__cuda_launch_on(device, &stream);
    if (!rc)
        rc = launched(ct__cuda_launch_reduce(a, stream), in, "a reduction kernel");
    /* The scratch goes back to the stream's cache: work queued after this
     * on the stream runs after the kernels that use it. */
    ct_storage_free(ws);
    return rc;
}

int ct__cuda_softmax(ct_tensor *out, ct_tensor *in, int dim, bool log) {
    if (ct_numel(in) == 0)
        return 0;
    bool mask[CT_MAX_DIMS] = {false};
    mask[dim] = in->ndim > 0;
    ct_tensor marker;
    ct__red_marker(&marker, out, in, mask, true);
    ct__red_plan plan;
    ct__red_plan_init(&plan, (ct_tensor *[]){in, &marker, out}, 3);
    /* One dim is reduced, and the marker's zero stride keeps it apart from
     * every other. */
    CT_ASSERT(plan.red.ndim == 1);
    ct__cuda_rows r = {.n = plan.red.shape[0],
                       .in_step = plan.red.strides[0][0],
                       .out_step = plan.red.strides[0][2],
                       .in = ct__data(in),
                       .out = ct__data(out)};
    space_of(&r.rows, &plan.kept, 0, 2);
    void *stream;
    int rc = ct__cuda_launch_on(in->storage->device.index, &stream);
    return rc ? rc
              : launched(ct__cuda_launch_softmax(&r, (int)in->dtype, log, stream), in,
                         log ? "the log_softmax kernel" : "the softmax kernel");
}

int ct__cuda_cross_entropy(ct_tensor *loss, ct_tensor *lse, ct_tensor *x, ct_tensor *t,
                           int64_t ignore, double smoothing) {
    void *stream;
    int rc = ct__cuda_launch_on(x->storage->device.index, &stream);
    return rc ? rc
              : launched(ct__cuda_launch_cross_entropy(ct__data(x), (const int64_t *)ct__data(t),
                                                       ct__data(lse), (double *)ct__data(loss),
                                                       x->sizes[0], x->sizes[1], ignore, smoothing,
                                                       (int)x->dtype, stream),
                         x, "the cross_entropy kernel");
}

int ct__cuda_cross_entropy_backward(ct_tensor *grad, ct_tensor *x, ct_tensor *t, ct_tensor *lse,
                                    ct_tensor *scale, int64_t ignore, double smoothing) {
    void *stream;
    int rc = ct__cuda_launch_on(x->storage->device.index, &stream);
    return rc ? rc
              : launched(ct__cuda_launch_cross_entropy_backward(
                             ct__data(x), (const int64_t *)ct__data(t), ct__data(lse),
                             ct__data(scale), scale->ndim > 0 ? 1 : 0, ct__data(grad), x->sizes[0],
                             x->sizes[1], ignore, smoothing, (int)x->dtype, stream),
                         x, "the cross_entropy backward kernel");
}

/* x viewed as [rows, d], d its last dim. */
static void rows_of(const ct_tensor *x, int64_t *rows, int64_t *d) {
    *d = x->sizes[x->ndim - 1];
    *rows = *d ? ct_numel(x) / *d : 0;
}

static void *data_or_null(const ct_tensor *t) { return t ? ct__data(t) : NULL; }

int ct__cuda_layer_norm(ct_tensor *y, ct_tensor *mean, ct_tensor *rstd, ct_tensor *x, ct_tensor *w,
                        ct_tensor *b, double eps) {
    int64_t rows, d;
    rows_of(x, &rows, &d);
    void *stream;
    int rc = ct__cuda_launch_on(x->storage->device.index, &stream);
    return rc ? rc
              : launched(ct__cuda_launch_layer_norm(ct__data(x), data_or_null(w), data_or_null(b),
                                                    ct__data(y), ct__data(mean), ct__data(rstd),
                                                    rows, d, eps, (int)x->dtype, stream),
                         x, "the layer_norm kernel");
}

int ct__cuda_layer_norm_backward(ct_tensor *dx, ct_tensor *dw, ct_tensor *db, ct_tensor *dy,
                                 ct_tensor *x, ct_tensor *w, ct_tensor *mean, ct_tensor *rstd) {
    int64_t rows, d;
    rows_of(x, &rows, &d);
    void *stream;
    int rc = ct__cuda_launch_on(x->storage->device.index, &stream);
    return rc ? rc
              : launched(ct__cuda_launch_layer_norm_backward(
                             ct__data(dy), ct__data(x), data_or_null(w), ct__data(mean),
                             ct__data(rstd), data_or_null(dx), data_or_null(dw), data_or_null(db),
                             rows, d, (int)x->dtype, stream),
                         x, "the layer_norm backward kernel");
}
