/* Built-in layers: their computations as functions, and as modules. */
#include "device_impl.h"
#include "nn_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

/* ------------------------------------------------------------- functions */

ct_tensor *ct_linear(ct_tensor *x, ct_tensor *weight, ct_tensor *bias) {
    /* Ops only: on any device. */
    ct_tensor *ins[] = {x, weight, bias};
    int nins = bias ? 3 : 2;
    if (ct__tensor_check_handles("linear", ins, nins) ||
        ct__tensor_check_same_device("linear", ins, nins))
        return NULL;
    char dx[CT__DESC_STR], dw[CT__DESC_STR];
    if (weight->ndim != 2 || x->ndim < 1 || x->sizes[x->ndim - 1] != weight->sizes[1]) {
        ct__err_set(CT_ESHAPE,
                    "linear: input %s does not match weight %s: expected [..., %lld] for a "
                    "[out, in] weight",
                    ct__tensor_desc(dx, x), ct__tensor_desc(dw, weight),
                    weight->ndim == 2 ? (long long)weight->sizes[1] : -1LL);
        return NULL;
    }
    /* [..., in] goes in as one [rows, in] matrix (a view when the leading
     * dims are evenly spaced, as they are for any contiguous input): one
     * GEMM for the product and one for the weight's gradient, instead of
     * a GEMM per batch entry and a sum. */
    int64_t rows = x->ndim > 1 ? ct_numel(x) / x->sizes[x->ndim - 1] : 1;
    ct_tensor *x2 = x->ndim > 2 ? ct_reshape(x, CT_SHAPE(rows, x->sizes[x->ndim - 1])) : x;
    ct_tensor *y = ct_matmul(x2, ct_transpose(weight, 0, 1));
    /* The bias goes into the fresh product in place (its backward needs
     * neither operand), saving a buffer, unless dtypes promote or only the
     * bias requires grad (autograd refuses an in-place write that carries a
     * gradient into a tensor that needs none). The product is not a view
     * yet: an in-place write into a view costs a copy of its base in
     * backward. */
    if (bias && y) {
        bool in_place =
            ct_tensor_dtype(bias) == y->dtype && (ct_requires_grad(y) || !ct_requires_grad(bias));
        y = in_place ? ct_add_(y, bias) : ct_add(y, bias);
    }
    if (!y || x->ndim <= 2)
        return y;
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, x->sizes, sizeof(int64_t) * (size_t)x->ndim);
    shape[x->ndim - 1] = weight->sizes[0];
    return ct_view(y, x->ndim, shape);
}

ct_tensor *ct_embedding(ct_tensor *indices, ct_tensor *weight) {
    if (CT__CHECK_ANY("embedding", indices, weight) ||
        ct__tensor_check_same_device("embedding", (ct_tensor *[]){indices, weight}, 2))
        return NULL;
    char di[CT__DESC_STR], dw[CT__DESC_STR];
    if (weight->ndim != 2 || ct_dtype_is_float(indices->dtype) || indices->dtype == CT_BOOL ||
        indices->ndim + 1 > CT_MAX_DIMS) {
        ct__err_set(CT_EINVAL,
                    "embedding: expected integer indices with fewer than %d dims and a [num, dim] "
                    "weight, got indices %s and weight %s",
                    CT_MAX_DIMS, ct__tensor_desc(di, indices), ct__tensor_desc(dw, weight));
        return NULL;
    }
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, indices->sizes, sizeof(int64_t) * (size_t)indices->ndim);
    shape[indices->ndim] = weight->sizes[1];
    ct_tensor *rows = ct_index_select(weight, 0, ct_reshape(indices, 1, (int64_t[]){-1}));
    return ct_view(rows, indices->ndim + 1, shape);
}

/* ----------------------------------------------------------- layer norm
 *
 * Fused on every device, through the table's layer_norm entries
 * (device_impl.h): one kernel finds each row's mean and rstd (saved for
 * backward) and writes y, and one makes dx a row at a time and dweight and
 * dbias as sums over rows. A device whose kernels take 16-bit floats
 * (ln_half: CUDA's, tensor/cuda/reduce.cu) gets them as they are; the
 * CPU's (tensor/cpu/norm.c) get float32 copies. mean and rstd are float64
 * for float64 and float32 otherwise, so one backward serves every device. */
typedef struct ln_ctx {
    double eps;
    bool weight, bias;
} ln_ctx;

/* x viewed as [rows, d], d its last dim. */
static void rows_of(const ct_tensor *x, int64_t *rows, int64_t *d) {
    *d = x->sizes[x->ndim - 1];
    *rows = *d ? ct_numel(x) / *d : 0;
}

/* The dtype the kernels compute in on x's device. */
static ct_dtype ln_kernel_dtype(const ct__device_ops *dev, const ct_tensor *x) {
    return dev->ln_half || x->dtype == CT_FLOAT64 ? x->dtype : CT_FLOAT32;
}

/* t summed over every dim but its last, for dweight and dbias; t itself
 * when it has one dim (ct_sum would read no dims as every dim). */
static ct_tensor *sum_rows(ct_tensor *t) {
    int nd = ct_ndim(t) - 1, dims[CT_MAX_DIMS];
    for (int i = 0; i < nd; i++)
        dims[i] = i;
    return nd > 0 ? ct_sum(t, dims, nd, false) : t;
}

/* The backward as ops, so that it can be differentiated again
 * (create_graph): mean and rstd are recomputed from x to carry its
 * history. grads: x, weight (if any), bias (if any). */
static void ln_backward_ops(const ln_ctx *c, ct_tensor *x, ct_tensor *w, ct_tensor *g,
                            ct_tensor **grads) {
    int last = -1;
    ct_tensor *rstd = ct_rsqrt(ct_add_scalar(ct_var(x, &last, 1, 0, true), c->eps));
    ct_tensor *xhat = ct_mul(ct_sub(x, ct_mean(x, &last, 1, true)), rstd);
    ct_tensor *gw = w ? ct_mul(g, w) : g;
    ct_tensor *mg = ct_mean(gw, &last, 1, true);
    ct_tensor *mgx = ct_mean(ct_mul(gw, xhat), &last, 1, true);
    grads[0] = ct_mul(rstd, ct_sub(ct_sub(gw, mg), ct_mul(xhat, mgx)));
    if (c->weight)
        grads[1] = sum_rows(ct_mul(g, xhat));
    if (c->bias)
        grads[c->weight ? 2 : 1] = sum_rows(g);
}

static int ln_backward(const ct_backward_args *a) {
    const ln_ctx *c = a->ctx;
    ct_tensor *x = a->saved[0], *mean = a->saved[1], *rstd = a->saved[2];
    ct_tensor *w = c->weight ? a->saved[3] : NULL, *g = a->grad_outputs[0];
    if (!g)
        return 0;
    ct_tensor *grads[3] = {NULL, NULL, NULL};
    if (ct_grad_enabled()) {
        ln_backward_ops(c, x, w, g, grads);
    } else {
        ct_device dev = ct_tensor_device(x);
        const ct__device_ops *ops = CT__DEVICE_GET("layer_norm", dev, layer_norm_backward);
        if (!ops)
            return ct_errcode();
        ct_dtype kt = ln_kernel_dtype(ops, x);
        int64_t d = x->sizes[x->ndim - 1];
        int ib = c->weight ? 2 : 1;
        ct_tensor *xc = ct_contiguous(ct_to_dtype(x, kt));
        ct_tensor *wc = w ? ct_contiguous(ct_to_dtype(w, kt)) : NULL;
        ct_tensor *gc = ct_contiguous(ct_to_dtype(g, kt));
        grads[0] = a->needs_input_grad[0] ? ct_empty_on(x->ndim, x->sizes, kt, dev) : NULL;
        if (c->weight && a->needs_input_grad[1])
            grads[1] = ct_empty_on(1, &d, kt, dev);
        if (c->bias && a->needs_input_grad[ib])
            grads[ib] = ct_empty_on(1, &d, kt, dev);
        bool made = (grads[0] || !a->needs_input_grad[0]) &&
                    (grads[1] || !c->weight || !a->needs_input_grad[1]) &&
                    (grads[ib] || !c->bias || !a->needs_input_grad[ib]);
        if (!xc || (w && !wc) || !gc || !made)
            return ct_errcode();
        ct_tensor *dw = c->weight ? grads[1] : NULL, *db = c->bias ? grads[ib] : NULL;
        int rc = ops->layer_norm_backward(grads[0], dw, db, gc, xc, wc, mean, rstd);
        if (rc)
            return rc;
        for (int i = 0; i < 3; i++)
            if (grads[i])
                grads[i] = ct_to_dtype(grads[i], x->dtype);
    }
    for (int i = 0; i < a->ninputs; i++) {
        if (a->needs_input_grad[i] && !grads[i])
            return ct_errcode();
        a->grad_inputs[i] = a->needs_input_grad[i] ? grads[i] : NULL;
    }
    return 0;
}

static const ct_function_def ln_def = {"NativeLayerNormBackward", ln_backward, free};

static ct_tensor *layer_norm_fused(ct_tensor *x, ct_tensor *w, ct_tensor *b, double eps) {
    ct_tensor *ins[3] = {x, w ? w : b, b};
    int nin = 1 + (w != NULL) + (b != NULL);
    ct_scope_begin();
    bool prev = ct_set_grad_enabled(false);
    ct_device dev = ct_tensor_device(x);
    const ct__device_ops *ops = CT__DEVICE_GET("layer_norm", dev, layer_norm);
    if (!ops) {
        ct_set_grad_enabled(prev);
        ct_scope_end();
        return NULL;
    }
    ct_dtype kt = ln_kernel_dtype(ops, x), st = kt == CT_FLOAT64 ? CT_FLOAT64 : CT_FLOAT32;
    int64_t rows, d;
    rows_of(x, &rows, &d);
    ct_tensor *xc = ct_contiguous(ct_to_dtype(x, kt));
    ct_tensor *wc = w ? ct_contiguous(ct_to_dtype(w, kt)) : NULL;
    ct_tensor *bc = b ? ct_contiguous(ct_to_dtype(b, kt)) : NULL;
    ct_tensor *y = ct_empty_on(x->ndim, x->sizes, kt, dev);
    ct_tensor *mean = ct_empty_on(1, &rows, st, dev), *rstd = ct_empty_on(1, &rows, st, dev);
    int rc = !xc || (w && !wc) || (b && !bc) || !y || !mean || !rstd
                 ? ct_errcode()
                 : ops->layer_norm(y, mean, rstd, xc, wc, bc, eps);
    if (!rc && !(y = ct_to_dtype(y, x->dtype)))
        rc = ct_errcode();
    ct_set_grad_enabled(prev);
    ln_ctx *c = rc ? NULL : malloc(sizeof *c);
    if (!rc && !c)
        rc = ct__err_set(CT_ENOMEM, "layer_norm: out of memory");
    if (!rc) {
        *c = (ln_ctx){eps, w != NULL, b != NULL};
        rc = ct_function_record(&ln_def, c, ins, nin, &y, 1, (ct_tensor *[]){x, mean, rstd, w},
                                w ? 4 : 3);
    }
    if (!rc)
        ct_keep(y);
    ct_scope_end();
    return rc ? NULL : y;
}

ct_tensor *ct_layer_norm(ct_tensor *x, ct_tensor *weight, ct_tensor *bias, double eps) {
    if (CT__CHECK_ANY("layer_norm", x))
        return NULL;
    ct_tensor *given[3] = {x, weight ? weight : bias, bias};
    int ngiven = 1 + (weight != NULL) + (bias != NULL);
    if (ct__tensor_check_handles("layer_norm", given, ngiven) ||
        ct__tensor_check_same_device("layer_norm", given, ngiven))
        return NULL;
    char dx[CT__DESC_STR];
    int64_t d = x->ndim ? x->sizes[x->ndim - 1] : 0;
    bool ok = x->ndim > 0 && eps >= 0 &&
              (!weight || (weight->ndim == 1 && weight->sizes[0] == d)) &&
              (!bias || (bias->ndim == 1 && bias->sizes[0] == d));
    if (!ok) {
        ct__err_set(
            CT_ESHAPE,
            "layer_norm: input %s needs a last dim matching weight and bias of shape [%lld] "
            "and eps >= 0 (got %g)",
            ct__tensor_desc(dx, x), (long long)d, eps);
        return NULL;
    }
    /* Mixed dtypes promote, which the composed ops do. */
    bool fused = ct_dtype_is_float(x->dtype) && (!weight || weight->dtype == x->dtype) &&
                 (!bias || bias->dtype == x->dtype);
    if (fused)
        return layer_norm_fused(x, weight, bias, eps);
    ct_tensor *mean = ct_mean(x, (int[]){-1}, 1, true);
    ct_tensor *var = ct_var(x, (int[]){-1}, 1, 0, true);
    ct_tensor *y = ct_mul(ct_sub(x, mean), ct_rsqrt(ct_add_scalar(var, eps)));
    if (weight)
        y = ct_mul(y, weight);
    return bias ? ct_add(y, bias) : y;
}

/* ct_dropout_key_rows's setting, read by every dropout (backward's
 * recomputations may run on other threads). */
static struct {
    pthread_mutex_t mu;
    const int64_t *rows;
    int64_t n, global_rows;
} keyed = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

int ct_dropout_key_rows(const int64_t *rows, int64_t n, int64_t global_rows) {
    for (int64_t i = 0; rows && i < n; i++)
        if (rows[i] < 0 || rows[i] >= global_rows)
            return ct__err_set(CT_EINVAL,
                               "dropout_key_rows: rows[%lld] is %lld; expected a row in [0, %lld)",
                               (long long)i, (long long)rows[i], (long long)global_rows);
    pthread_mutex_lock(&keyed.mu);
    keyed.rows = n > 0 ? rows : NULL;
    keyed.n = keyed.rows ? n : 0;
    keyed.global_rows = global_rows;
    pthread_mutex_unlock(&keyed.mu);
    return 0;
}

/* The mask that keeps with probability 1 - p, like x: keyed by sample
 * when ct_dropout_key_rows set rows for x's row count. */
static ct_tensor *keep_mask(ct_tensor *x, double p, ct_generator *gen) {
    pthread_mutex_lock(&keyed.mu);
    const int64_t *rows = keyed.rows;
    int64_t global_rows = keyed.global_rows;
    bool by_row = rows && ct_ndim(x) >= 1 && ct_size(x, 0) == keyed.n;
    pthread_mutex_unlock(&keyed.mu);
    ct_tensor *keep = ct_empty_like(x);
    return by_row ? ct_bernoulli_rows_(keep, 1 - p, rows, global_rows, gen)
                  : ct_bernoulli_(keep, 1 - p, gen);
}

ct_tensor *ct_dropout(ct_tensor *x, double p, bool training, ct_generator *gen) {
    if (CT__CHECK_ANY("dropout", x))
        return NULL;
    if (!(p >= 0 && p <= 1)) {
        ct__err_set(CT_EINVAL, "dropout: p must be in [0, 1], got %g", p);
        return NULL;
    }
    if (!training || p == 0)
        return ct__tensor_scope_own(ct_tensor_retain(x));
    if (p == 1)
        return ct_mul_scalar(x, 0);
    ct_tensor *keep = keep_mask(x, p, gen);
    return ct_mul(x, ct_mul_scalar_(keep, 1 / (1 - p)));
}

/* --------------------------------------------------------------- modules */

/* Per thread, as the grad mode: one thread building a model on the meta
 * device leaves another's construction on the CPU. */
static _Thread_local ct_device param_device = {CT_CPU, 0};

ct_device ct_nn_set_device(ct_device device) {
    ct_device was = param_device;
    param_device = device;
    return was;
}

ct_device ct_nn_device(void) { return param_device; }

/* A parameter tensor owned by the caller, made in a scope of its own so that
 * the caller's scope (if any) does not own it. */
static ct_tensor *new_param(int ndim, const int64_t *sizes, double lo, double hi) {
    ct_scope_begin();
    bool prev = ct_set_grad_enabled(false);
    ct_tensor *t = ct_empty_on(ndim, sizes, CT_FLOAT32, param_device);
    t = lo < hi ? ct_uniform_(t, lo, hi, NULL) : ct_init_constant_(t, lo);
    ct_set_grad_enabled(prev);
    ct_tensor_retain(t);
    ct_scope_end();
    return t;
}

static ct_tensor *linear_forward(ct_module *m, ct_tensor *x) {
    return ct_linear(x, ct_module_param(m, "weight"), ct_module_param(m, "bias"));
}

ct_module *ct_linear_new(int64_t in_features, int64_t out_features, bool bias) {
    if (in_features <= 0 || out_features <= 0) {
        ct__err_set(CT_EINVAL, "linear_new: features must be positive, got in %lld, out %lld",
                    (long long)in_features, (long long)out_features);
        return NULL;
    }
    double bound = 1 / sqrt((double)in_features);
    ct_module *m = ct_module_new("Linear", linear_forward, NULL, NULL);
    int rc =
        m ? ct_module_add_param(m, "weight",
                                new_param(2, (int64_t[]){out_features, in_features}, -bound, bound))
          : ct_errcode();
    if (!rc && bias)
        rc = ct_module_add_param(m, "bias", new_param(1, &out_features, -bound, bound));
    if (rc) {
        ct_module_free(m);
        return NULL;
    }
    return m;
}

static ct_tensor *embedding_forward(ct_module *m, ct_tensor *x) {
    return ct_embedding(x, ct_module_param(m, "weight"));
}

ct_module *ct_embedding_new(int64_t num, int64_t dim) {
    if (num <= 0 || dim <= 0) {
        ct__err_set(CT_EINVAL, "embedding_new: sizes must be positive, got %lld x %lld",
                    (long long)num, (long long)dim);
        return NULL;
    }
    ct_module *m = ct_module_new("Embedding", embedding_forward, NULL, NULL);
    ct_tensor *w = m ? new_param(2, (int64_t[]){num, dim}, 0, 0) : NULL;
    if (w) {
        bool prev = ct_set_grad_enabled(false);
        ct_init_normal_(w, 0, 1, NULL);
        ct_set_grad_enabled(prev);
    }
    if (!m || ct_module_add_param(m, "weight", w)) {
        ct_module_free(m);
        return NULL;
    }
    return m;
}

/* A module whose state is one number: LayerNorm's eps, Dropout's p. */
static ct_module *with_number(const char *op, const char *type, ct_forward_fn forward, double v) {
    double *s = malloc(sizeof *s);
    ct_module *m = s ? ct_module_new(type, forward, s, free) : NULL;
    if (!m) {
        ct__err_set(CT_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    *s = v;
    return m;
}

static double number_of(const ct_module *m) { return *(const double *)ct_module_state(m); }

static ct_tensor *layer_norm_forward(ct_module *m, ct_tensor *x) {
    return ct_layer_norm(x, ct_module_param(m, "weight"), ct_module_param(m, "bias"), number_of(m));
}

ct_module *ct_layer_norm_new(int64_t dim, double eps) {
    if (dim <= 0 || !(eps >= 0)) {
        ct__err_set(CT_EINVAL, "layer_norm_new: expected dim > 0 and eps >= 0, got %lld and %g",
                    (long long)dim, eps);
        return NULL;
    }
    ct_module *m = with_number("layer_norm_new", "LayerNorm", layer_norm_forward, eps);
    if (!m || ct_module_add_param(m, "weight", new_param(1, &dim, 1, 1)) ||
        ct_module_add_param(m, "bias", new_param(1, &dim, 0, 0))) {
        ct_module_free(m);
        return NULL;
    }
    return m;
}

static ct_tensor *dropout_forward(ct_module *m, ct_tensor *x) {
    return ct_dropout(x, number_of(m), ct_module_training(m), NULL);
}

ct_module *ct_dropout_new(double p) {
    if (!(p >= 0 && p <= 1)) {
        ct__err_set(CT_EINVAL, "dropout_new: p must be in [0, 1], got %g", p);
        return NULL;
    }
    return with_number("dropout_new", "Dropout", dropout_forward, p);
}

#define ACTIVATION(fn, Type, expr)                                                                 \
    static ct_tensor *fn##_forward(ct_module *m, ct_tensor *x) {                                   \
        (void)m;                                                                                   \
        return expr;                                                                               \
    }                                                                                              \
    ct_module *ct_##fn##_new(void) { return ct_module_new(Type, fn##_forward, NULL, NULL); }
ACTIVATION(relu, "ReLU", ct_relu(x))
ACTIVATION(tanh, "Tanh", ct_tanh(x))
ACTIVATION(sigmoid, "Sigmoid", ct_sigmoid(x))
ACTIVATION(silu, "SiLU", ct_silu(x))
#undef ACTIVATION

static ct_tensor *gelu_forward(ct_module *m, ct_tensor *x) {
    return ct_module_state(m) ? ct_gelu_tanh(x) : ct_gelu(x);
}

ct_module *ct_gelu_new(bool tanh_approximation) {
    /* The state pointer itself says which form: no allocation. */
    static char tanh_form;
    return ct_module_new("GELU", gelu_forward, tanh_approximation ? &tanh_form : NULL, NULL);
}

static ct_tensor *sequential_forward(ct_module *m, ct_tensor *x) {
    for (int i = 0; x && i < ct_module_num_children(m); i++)
        x = ct_module_forward(ct_module_child_at(m, i), x);
    return x;
}

ct_module *ct_sequential_new(void) {
    return ct_module_new("Sequential", sequential_forward, NULL, NULL);
}

int ct_sequential_append(ct_module *seq, ct_module *child) {
    char name[16];
    snprintf(name, sizeof name, "%d", ct_module_num_children(seq));
    return ct_module_add_child(seq, name, child);
}
