/* The derivative of every differentiable tensor op, written with ct ops so
 * that, under create_graph, the backward is itself recorded and can be
 * differentiated again. A derivative may leave a gradient NULL: nothing
 * flows into that input (a zero gradient). Gradients may come back in a
 * broadcast shape or another dtype; the engine reduces and converts them to
 * the input's. Failures leave a message that the engine reports. */
#include "autograd_impl.h"

#include <ct/cuda.h>
#include <math.h>

#define G        (a->grad_outputs[0])
#define IN(i)    (a->saved[(i)])
#define OUT      (a->saved[n->nnext])
#define NEEDS(i) (a->needs_input_grad[(i)])
#define SET(i, expr)                                                                               \
    do {                                                                                           \
        if (NEEDS(i))                                                                              \
            a->grad_inputs[(i)] = (expr);                                                          \
    } while (0)

typedef const ct_backward_args args_t;

/* A 0-d operand for t: on t's device, as ops take operands from one. */
static ct_tensor *scalar_like(double v, const ct_tensor *t) {
    return ct_full_on(0, NULL, v, ct_tensor_dtype(t), ct_tensor_device(t));
}

static const ct__shape *in_shape(const ct_node *n, int i) { return &n->in_meta[i]; }

static ct_tensor *zeros_of(const ct__shape *s) {
    return ct_full_on(s->ndim, s->sizes, 0, s->dtype, s->device);
}

/* (x > 0) - (x < 0), in x's dtype. */
static ct_tensor *sign(ct_tensor *x) {
    ct_dtype dt = ct_tensor_dtype(x);
    return ct_sub(ct_to_dtype(ct_gt_scalar(x, 0), dt), ct_to_dtype(ct_lt_scalar(x, 0), dt));
}

static ct_tensor *mask_as(ct_tensor *mask, const ct_tensor *like) {
    return ct_to_dtype(mask, ct_tensor_dtype(like));
}

/* ------------------------------------------------------------ views */

static int d_view(ct_node *n, args_t *a) {
    SET(0, ct_reshape(G, in_shape(n, 0)->ndim, in_shape(n, 0)->sizes));
    return 0;
}

static int d_identity(ct_node *n, args_t *a) {
    (void)n;
    SET(0, G);
    return 0;
}

static int d_permute(ct_node *n, args_t *a) {
    int inv[CT_MAX_DIMS];
    for (int i = 0; i < n->args.nints; i++)
        inv[n->args.ints[i]] = i;
    SET(0, ct_permute(G, inv));
    return 0;
}

/* A zero tensor of shape s holding g at positions start, start + step, ...
 * along dim. With grad mode on (create_graph) it is built from
 * differentiable ops; otherwise g is copied into a strided view. */
static ct_tensor *embed(const ct__shape *s, ct_tensor *g, int dim, int64_t start, int64_t step) {
    ct_tensor *z = zeros_of(s);
    int64_t len = ct_size(g, dim);
    /* Nothing to place; the slice end below, start - step + 1, can then be
     * negative, which a slice reads as counted from the back. */
    if (len == 0)
        return z;
    if (!ct_grad_enabled()) {
        ct_tensor *v = ct_slice(z, dim, start, start + (len - 1) * step + 1, step);
        return ct_copy_(v, g) ? z : NULL;
    }
    int64_t shape[CT_MAX_DIMS];
    for (int i = 0; i < s->ndim; i++)
        shape[i] = i == dim ? len : 1;
    /* The positions are made on the host and moved to g's device. */
    ct_tensor *idx =
        ct_to(ct_arange((double)start, (double)(start + len * step), (double)step, CT_INT64),
              ct_tensor_device(g));
    idx = ct_expand(ct_view(idx, s->ndim, shape), ct_ndim(g), ct_sizes(g));
    return ct_scatter_add(z, dim, idx, g);
}

static int d_slice(ct_node *n, args_t *a) {
    const int64_t *v = n->args.ints;
    SET(0, embed(in_shape(n, 0), G, (int)v[0], v[1], v[3]));
    return 0;
}

static int d_select(ct_node *n, args_t *a) {
    int dim = (int)n->args.ints[0];
    SET(0, embed(in_shape(n, 0), ct_unsqueeze(G, dim), dim, n->args.ints[1], 1));
    return 0;
}

static int d_copy(ct_node *n, args_t *a) {
    (void)n;
    a->grad_inputs[1] = NEEDS(1) ? G : NULL;
    return 0;
}

/* ------------------------------------------------------------ unary */

static int d_neg(ct_node *n, args_t *a) {
    (void)n;
    SET(0, ct_neg(G));
    return 0;
}

static int d_abs(ct_node *n, args_t *a) {
    (void)n;
    SET(0, ct_mul(G, sign(IN(0))));
    return 0;
}

static int d_exp(ct_node *n, args_t *a) {
    SET(0, ct_mul(G, OUT));
    return 0;
}

static int d_log(ct_node *n, args_t *a) {
    (void)n;
    SET(0, ct_div(G, IN(0)));
    return 0;
}

static int d_log1p(ct_node *n, args_t *a) {
    (void)n;
    SET(0, ct_div(G, ct_add_scalar(IN(0), 1)));
    return 0;
}

static int d_sqrt(ct_node *n, args_t *a) {
    SET(0, ct_div(G, ct_mul_scalar(OUT, 2)));
    return 0;
}

static int d_rsqrt(ct_node *n, args_t *a) {
    SET(0, ct_mul(G, ct_mul_scalar(ct_pow_scalar(OUT, 3), -0.5)));
    return 0;
}

static int d_sin(ct_node *n, args_t *a) {
    (void)n;
    SET(0, ct_mul(G, ct_cos(IN(0))));
    return 0;
}

static int d_cos(ct_node *n, args_t *a) {
    (void)n;
    SET(0, ct_mul(G, ct_neg(ct_sin(IN(0)))));
    return 0;
}

static int d_tanh(ct_node *n, args_t *a) {
    SET(0, ct_mul(G, ct_sub(scalar_like(1, OUT), ct_mul(OUT, OUT))));
    return 0;
}

static int d_sigmoid(ct_node *n, args_t *a) {
    SET(0, ct_mul(G, ct_mul(OUT, ct_sub(scalar_like(1, OUT), OUT))));
    return 0;
}

static int d_relu(ct_node *n, args_t *a) {
    SET(0, ct_where(ct_gt_scalar(OUT, 0), G, scalar_like(0, G)));
    return 0;
}

/* gelu(x) = x * Phi(x); Phi is recovered as gelu(x) / x (exact to a few
 * ulp), which avoids an erf op. */
/* The activations below have a fused gradient on the CPU, used unless the
 * backward is itself recorded (create_graph), which needs the chain of ops.
 * The meta device plans the CPU's memory, so it takes the same path. */
static bool fused_grad(ct_tensor *x) {
    ct_device d = ct_tensor_device(x);
    return !ct_grad_enabled() && (ct__is_host(d) || d.type == CT_META);
}

static int d_gelu(ct_node *n, args_t *a) {
    ct_tensor *x = IN(0);
    if (fused_grad(x)) {
        SET(0, ct__cpu_activation_grad(CT_OP_GELU, x, G));
        return 0;
    }
    ct_tensor *cdf = ct_where(ct_eq_scalar(x, 0), scalar_like(0.5, x), ct_div(OUT, x));
    ct_tensor *pdf = ct_mul_scalar(ct_exp(ct_mul_scalar(ct_mul(x, x), -0.5)), 0.3989422804014327);
    SET(0, ct_mul(G, ct_add(cdf, ct_mul(x, pdf))));
    return 0;
}

static int d_gelu_tanh(ct_node *n, args_t *a) {
    (void)n;
    const double k = 0.7978845608028654, c = 0.044715;
    ct_tensor *x = IN(0);
    if (fused_grad(x)) {
        SET(0, ct__cpu_activation_grad(CT_OP_GELU_TANH, x, G));
        return 0;
    }
    ct_tensor *x2 = ct_mul(x, x);
    ct_tensor *t = ct_tanh(ct_mul_scalar(ct_add(x, ct_mul_scalar(ct_mul(x2, x), c)), k));
    ct_tensor *dt = ct_sub(scalar_like(1, t), ct_mul(t, t));
    ct_tensor *du = ct_mul_scalar(ct_add_scalar(ct_mul_scalar(x2, 3 * c), 1), k);
    ct_tensor *d = ct_add(ct_mul_scalar(ct_add_scalar(t, 1), 0.5),
                          ct_mul(ct_mul_scalar(x, 0.5), ct_mul(dt, du)));
    SET(0, ct_mul(G, d));
    return 0;
}

static int d_silu(ct_node *n, args_t *a) {
    (void)n;
    ct_tensor *x = IN(0);
    if (fused_grad(x)) {
        SET(0, ct__cpu_activation_grad(CT_OP_SILU, x, G));
        return 0;
    }
    ct_tensor *s = ct_sigmoid(x);
    ct_tensor *d = ct_mul(s, ct_add_scalar(ct_mul(x, ct_sub(scalar_like(1, s), s)), 1));
    SET(0, ct_mul(G, d));
    return 0;
}

static int d_pow_scalar(ct_node *n, args_t *a) {
    double e = n->args.scalars[0];
    /* x ** 0 is constant: zeros, as PyTorch gives (NULL would make ct_grad
     * report x as unused). */
    if (e == 0)
        SET(0, zeros_of(in_shape(n, 0)));
    else
        SET(0, ct_mul(G, ct_mul_scalar(ct_pow_scalar(IN(0), e - 1), e)));
    return 0;
}

/* PyTorch's rule: the gradient passes where lo <= x <= hi. */
static int d_clamp(ct_node *n, args_t *a) {
    ct_tensor *x = IN(0), *zero = scalar_like(0, G);
    ct_tensor *low = ct_lt_scalar(x, n->args.scalars[0]);
    ct_tensor *high = ct_gt_scalar(x, n->args.scalars[1]);
    SET(0, ct_where(low, zero, ct_where(high, zero, G)));
    return 0;
}

/* ----------------------------------------------------------- binary */

static int d_add(ct_node *n, args_t *a) {
    SET(0, G);
    if (n->nnext > 1)
        SET(1, G);
    return 0;
}

static int d_sub(ct_node *n, args_t *a) {
    SET(0, G);
    if (n->nnext > 1)
        SET(1, ct_neg(G));
    return 0;
}

static int d_mul(ct_node *n, args_t *a) {
    if (n->nnext == 1) {
        SET(0, ct_mul_scalar(G, n->args.scalars[0]));
        return 0;
    }
    SET(0, ct_mul(G, IN(1)));
    SET(1, ct_mul(G, IN(0)));
    return 0;
}

static int d_div(ct_node *n, args_t *a) {
    if (n->nnext == 1) {
        SET(0, ct_div_scalar(G, n->args.scalars[0]));
        return 0;
    }
    SET(0, ct_div(G, IN(1)));
    SET(1, ct_neg(ct_div(ct_mul(G, OUT), IN(1))));
    return 0;
}

static int d_pow(ct_node *n, args_t *a) {
    ct_tensor *x = IN(0), *e = IN(1);
    /* e * x ** (e - 1) is 0 * inf at x = 0, e = 0; x ** 0 is constant, so
     * PyTorch masks it to zero. */
    if (NEEDS(0)) {
        ct_tensor *d = ct_mul(G, ct_mul(e, ct_pow(x, ct_sub_scalar(e, 1))));
        a->grad_inputs[0] = ct_where(ct_eq_scalar(e, 0), scalar_like(0, G), d);
    }
    if (NEEDS(1)) {
        /* 0 ** e for e >= 0 has no dependence on e worth reporting (log 0);
         * PyTorch masks it to zero. */
        ct_tensor *dead = ct_mul(mask_as(ct_eq_scalar(x, 0), G), mask_as(ct_ge_scalar(e, 0), G));
        ct_tensor *d = ct_mul(G, ct_mul(OUT, ct_log(x)));
        a->grad_inputs[1] = ct_where(ct_to_dtype(dead, CT_BOOL), scalar_like(0, G), d);
    }
    return 0;
}

/* maximum / minimum: the gradient goes to the larger (smaller) operand and
 * is split evenly on ties. */
static int d_extremum(ct_node *n, args_t *a, bool max) {
    ct_tensor *x = IN(0);
    bool scalar = n->nnext == 1;
    double s = n->args.scalars[0];
    ct_tensor *win = scalar ? (max ? ct_gt_scalar(x, s) : ct_lt_scalar(x, s))
                            : (max ? ct_gt(x, IN(1)) : ct_lt(x, IN(1)));
    ct_tensor *tie = scalar ? ct_eq_scalar(x, s) : ct_eq(x, IN(1));
    ct_tensor *share = ct_add(mask_as(win, G), ct_mul_scalar(mask_as(tie, G), 0.5));
    SET(0, ct_mul(G, share));
    if (!scalar)
        SET(1, ct_mul(G, ct_sub(scalar_like(1, share), share)));
    return 0;
}

static int d_maximum(ct_node *n, args_t *a) { return d_extremum(n, a, true); }
static int d_minimum(ct_node *n, args_t *a) { return d_extremum(n, a, false); }

static int d_where(ct_node *n, args_t *a) {
    (void)n;
    ct_tensor *zero = scalar_like(0, G);
    SET(1, ct_where(IN(0), G, zero));
    SET(2, ct_where(IN(0), zero, G));
    return 0;
}

static int d_masked_fill(ct_node *n, args_t *a) {
    (void)n;
    SET(0, ct_masked_fill(G, IN(1), 0));
    return 0;
}

/* ------------------------------------------------------- reductions */

/* t (a reduction's output or its gradient) with the reduced dims put back
 * as size 1, so that it broadcasts against the input. */
static ct_tensor *keepdim(const ct_node *n, ct_tensor *t) {
    if (n->args.keepdim)
        return t;
    const ct__shape *s = in_shape(n, 0);
    bool reduced[CT_MAX_DIMS] = {false};
    for (int i = 0; i < n->args.nints; i++)
        reduced[n->args.ints[i]] = true;
    int64_t sizes[CT_MAX_DIMS];
    for (int d = 0; d < s->ndim; d++)
        sizes[d] = n->args.nints == 0 || reduced[d] ? 1 : s->sizes[d];
    return ct_reshape(t, s->ndim, sizes);
}

static double reduced_count(const ct_node *n) {
    const ct__shape *s = in_shape(n, 0);
    double count = 1;
    for (int d = 0; d < s->ndim; d++) {
        bool r = n->args.nints == 0;
        for (int i = 0; i < n->args.nints; i++)
            r = r || n->args.ints[i] == d;
        count *= r ? (double)s->sizes[d] : 1;
    }
    return count;
}

static int dims_of(const ct_node *n, int *dims) {
    for (int i = 0; i < n->args.nints; i++)
        dims[i] = (int)n->args.ints[i];
    return n->args.nints;
}

static int d_sum(ct_node *n, args_t *a) {
    const ct__shape *s = in_shape(n, 0);
    SET(0, ct_expand(keepdim(n, G), s->ndim, s->sizes));
    return 0;
}

static int d_mean(ct_node *n, args_t *a) {
    const ct__shape *s = in_shape(n, 0);
    SET(0, ct_expand(ct_div_scalar(keepdim(n, G), reduced_count(n)), s->ndim, s->sizes));
    return 0;
}

/* Zeros need care: a slice with one zero passes the product of the others to
 * it; with two or more every gradient is zero. */
static int d_prod(ct_node *n, args_t *a) {
    ct_tensor *x = IN(0), *g = keepdim(n, G);
    int dims[CT_MAX_DIMS], nd = dims_of(n, dims);
    ct_tensor *is_zero = ct_eq_scalar(x, 0);
    ct_tensor *zeros = ct_sum(is_zero, dims, nd, true);
    ct_tensor *others = ct_prod(ct_where(is_zero, scalar_like(1, x), x), dims, nd, true);
    ct_tensor *at_zero = ct_mul(others, mask_as(ct_eq_scalar(zeros, 1), x));
    ct_tensor *elsewhere = ct_div(keepdim(n, OUT), ct_where(is_zero, scalar_like(1, x), x));
    SET(0, ct_mul(g, ct_where(is_zero, at_zero, elsewhere)));
    return 0;
}

/* Gradient g (keepdim shape) split evenly over the elements of x equal to
 * the extreme value. */
static ct_tensor *split_over(const ct_node *n, ct_tensor *x, ct_tensor *extreme, ct_tensor *g) {
    int dims[CT_MAX_DIMS], nd = dims_of(n, dims);
    ct_tensor *hit = mask_as(ct_eq(x, extreme), g);
    return ct_mul(hit, ct_div(g, ct_sum(hit, dims, nd, true)));
}

static int d_amax(ct_node *n, args_t *a) {
    SET(0, split_over(n, IN(0), keepdim(n, OUT), keepdim(n, G)));
    return 0;
}

static ct_tensor *centered(const ct_node *n, ct_tensor *x) {
    int dims[CT_MAX_DIMS], nd = dims_of(n, dims);
    return ct_sub(x, ct_mean(x, dims, nd, true));
}

static int d_var(ct_node *n, args_t *a) {
    double dof = reduced_count(n) - n->args.scalars[0];
    SET(0, ct_mul(keepdim(n, G), ct_mul_scalar(centered(n, IN(0)), 2 / dof)));
    return 0;
}

static int d_std(ct_node *n, args_t *a) {
    double dof = reduced_count(n) - n->args.scalars[0];
    ct_tensor *scale = ct_div(keepdim(n, G), ct_mul_scalar(keepdim(n, OUT), dof));
    SET(0, ct_mul(scale, centered(n, IN(0))));
    return 0;
}

static int d_logsumexp(ct_node *n, args_t *a) {
    SET(0, ct_mul(keepdim(n, G), ct_exp(ct_sub(IN(0), keepdim(n, OUT)))));
    return 0;
}

static int d_norm(ct_node *n, args_t *a) {
    double p = n->args.scalars[0];
    ct_tensor *x = IN(0), *g = keepdim(n, G), *norm = keepdim(n, OUT);
    if (p == 0)
        return 0;
    if (p == 1) {
        SET(0, ct_mul(g, sign(x)));
        return 0;
    }
    if (isinf(p)) {
        SET(0, ct_mul(sign(x), split_over(n, ct_abs(x), norm, g)));
        return 0;
    }
    /* d|x|_p / dx = sign(x) |x|^(p-1) / |x|_p^(p-1); zero where the norm
     * is. */
    ct_tensor *num = p == 2 ? x : ct_mul(sign(x), ct_pow_scalar(ct_abs(x), p - 1));
    ct_tensor *den = p == 2 ? norm : ct_pow_scalar(norm, p - 1);
    ct_tensor *safe = ct_where(ct_eq_scalar(norm, 0), scalar_like(1, norm), den);
    ct_tensor *scale = ct_where(ct_eq_scalar(norm, 0), scalar_like(0, norm), ct_div(g, safe));
    SET(0, ct_mul(num, scale));
    return 0;
}

static int d_max_dim(ct_node *n, args_t *a) {
    int dim = (int)n->args.ints[0];
    ct_tensor *idx = keepdim(n, OUT), *g = keepdim(n, G);
    SET(0, ct_scatter_add(zeros_of(in_shape(n, 0)), dim, idx, g));
    return 0;
}

/* ----------------------------------------------------- linear algebra */

/* t as a matrix operand: 1-D vectors become a row (first operand) or a
 * column (second), as matmul treats them. */
static ct_tensor *as_matrix(ct_tensor *t, bool first) {
    if (ct_ndim(t) != 1)
        return t;
    return first ? ct_unsqueeze(t, 0) : ct_unsqueeze(t, 1);
}

static ct_tensor *mT(ct_tensor *t) { return ct_transpose(t, -1, -2); }

/* A matrix stored column-major: the transpose of a contiguous one, as the
 * weight of a linear layer is when used as W^T. */
static bool column_major(const ct_tensor *t) {
    return ct_ndim(t) == 2 && ct_stride(t, 0) == 1 && ct_stride(t, 1) == ct_size(t, 0) &&
           ct_size(t, 0) > 1;
}

/* grad of a (or b) in its matrix form, summed over broadcast batch dims and
 * reshaped to the operand's shape. */
static ct_tensor *to_operand(ct_tensor *g, const ct__shape *s, bool vector, bool first) {
    ct__shape m = *s;
    if (vector) {
        m.ndim = 2;
        m.sizes[0] = first ? 1 : s->sizes[0];
        m.sizes[1] = first ? s->sizes[0] : 1;
    }
    ct_tensor *r = ct__autograd_sum_to(g, &m);
    return !r || ct__autograd_shape_equal(s, r) ? r : ct_reshape(r, s->ndim, s->sizes);
}

static int d_matmul(ct_node *n, args_t *a) {
    ct_tensor *x = IN(0), *y = IN(1);
    bool xv = ct_ndim(x) == 1, yv = ct_ndim(y) == 1;
    ct_tensor *g = G;
    /* Put back the dims that matmul removed for vector operands. */
    if (xv && yv)
        g = ct_view(g, 2, (int64_t[]){1, 1});
    else if (xv)
        g = ct_unsqueeze(g, -2);
    else if (yv)
        g = ct_unsqueeze(g, -1);
    ct_tensor *xm = as_matrix(x, true), *ym = as_matrix(y, false);
    /* A gradient gets its operand's layout: for a column-major operand the
     * transposed product is computed, so that the gradient of a weight used
     * as W^T comes out contiguous like W, with no copy. */
    if (NEEDS(0)) {
        ct_tensor *gx = column_major(x) ? mT(ct_matmul(ym, mT(g))) : ct_matmul(g, mT(ym));
        a->grad_inputs[0] = to_operand(gx, in_shape(n, 0), xv, true);
    }
    if (NEEDS(1)) {
        ct_tensor *gy = column_major(y) ? mT(ct_matmul(mT(g), xm)) : ct_matmul(mT(xm), g);
        a->grad_inputs[1] = to_operand(gy, in_shape(n, 1), yv, false);
    }
    return 0;
}

static int d_softmax(ct_node *n, args_t *a) {
    int dim = (int)n->args.ints[0];
    ct_tensor *y = OUT;
    ct_tensor *dot = ct_sum(ct_mul(G, y), (int[]){dim}, 1, true);
    SET(0, ct_mul(y, ct_sub(G, dot)));
    return 0;
}

static int d_log_softmax(ct_node *n, args_t *a) {
    int dim = (int)n->args.ints[0];
    ct_tensor *total = ct_sum(G, (int[]){dim}, 1, true);
    SET(0, ct_sub(G, ct_mul(ct_exp(OUT), total)));
    return 0;
}

/* ------------------------------------------------- joining and indexing */

static int d_cat(ct_node *n, args_t *a) {
    int dim = (int)n->args.ints[0];
    int64_t at = 0;
    for (int i = 0; i < n->nnext; i++) {
        const ct__shape *s = in_shape(n, i);
        /* PyTorch's legacy rule: 1-D empty inputs are skipped by cat. */
        int64_t len = s->ndim == 1 && s->sizes[0] == 0 ? 0 : s->sizes[dim];
        SET(i, ct_narrow(G, dim, at, len));
        at += len;
    }
    return 0;
}

static int d_stack(ct_node *n, args_t *a) {
    int dim = (int)n->args.ints[0];
    for (int i = 0; i < n->nnext; i++)
        SET(i, ct_select(G, dim, i));
    return 0;
}

static int d_index_select(ct_node *n, args_t *a) {
    int dim = (int)n->args.ints[0];
    const ct__shape *s = in_shape(n, 0);
    int64_t shape[CT_MAX_DIMS];
    for (int i = 0; i < s->ndim; i++)
        shape[i] = i == dim ? ct_numel(IN(1)) : 1;
    ct_tensor *idx = ct_to_dtype(IN(1), CT_INT64);
    idx = ct_expand(ct_reshape(idx, s->ndim, shape), ct_ndim(G), ct_sizes(G));
    SET(0, ct_scatter_add(zeros_of(s), dim, idx, G));
    return 0;
}

static int d_gather(ct_node *n, args_t *a) {
    SET(0, ct_scatter_add(zeros_of(in_shape(n, 0)), (int)n->args.ints[0], IN(1), G));
    return 0;
}

static int d_scatter_add(ct_node *n, args_t *a) {
    SET(0, G);
    SET(2, ct_gather(G, (int)n->args.ints[0], IN(1)));
    return 0;
}

static int d_tril(ct_node *n, args_t *a) {
    SET(0, ct_tril(G, n->args.ints[0]));
    return 0;
}

static int d_triu(ct_node *n, args_t *a) {
    SET(0, ct_triu(G, n->args.ints[0]));
    return 0;
}

/* ------------------------------------------------------------- table */

#define IN0                            1u
#define IN1                            2u
#define IN01                           3u
#define D(OP, name, fn, ins, out, old) [CT_OP_##OP] = {{name, fn}, ins, out, 0, old}

static const ct__deriv derivs[CT_NOPS] = {
    D(VIEW, "ViewBackward0", d_view, 0, false, 0),
    D(EXPAND, "ExpandBackward0", d_identity, 0, false, 0),
    D(PERMUTE, "PermuteBackward0", d_permute, 0, false, 0),
    D(SLICE, "SliceBackward0", d_slice, 0, false, 0),
    D(SELECT, "SelectBackward0", d_select, 0, false, 0),
    D(SQUEEZE, "SqueezeBackward0", d_view, 0, false, 0),
    D(UNSQUEEZE, "UnsqueezeBackward0", d_view, 0, false, 0),
    D(CONTIGUOUS, "ContiguousBackward0", d_identity, 0, false, 0),
    D(CLONE, "CloneBackward0", d_identity, 0, false, 0),
    D(COPY, "CopyBackwards", d_copy, 0, false, 0),
    D(TO_DTYPE, "ToCopyBackward0", d_identity, 0, false, 0),
    D(NEG, "NegBackward0", d_neg, 0, false, 0),
    D(ABS, "AbsBackward0", d_abs, IN0, false, IN0),
    D(EXP, "ExpBackward0", d_exp, 0, true, 0),
    D(LOG, "LogBackward0", d_log, IN0, false, IN0),
    D(LOG1P, "Log1PBackward0", d_log1p, IN0, false, IN0),
    D(SQRT, "SqrtBackward0", d_sqrt, 0, true, 0),
    D(RSQRT, "RsqrtBackward0", d_rsqrt, 0, true, 0),
    D(SIN, "SinBackward0", d_sin, IN0, false, IN0),
    D(COS, "CosBackward0", d_cos, IN0, false, IN0),
    D(TANH, "TanhBackward0", d_tanh, 0, true, 0),
    D(SIGMOID, "SigmoidBackward0", d_sigmoid, 0, true, 0),
    D(RELU, "ReluBackward0", d_relu, 0, true, 0),
    D(GELU, "GeluBackward0", d_gelu, IN0, true, IN0),
    D(GELU_TANH, "GeluBackward1", d_gelu_tanh, IN0, false, IN0),
    D(SILU, "SiluBackward0", d_silu, IN0, false, IN0),
    D(POW_SCALAR, "PowBackward0", d_pow_scalar, IN0, false, IN0),
    D(CLAMP, "ClampBackward1", d_clamp, IN0, false, IN0),
    D(ADD, "AddBackward0", d_add, 0, false, 0),
    D(SUB, "SubBackward0", d_sub, 0, false, 0),
    D(MUL, "MulBackward0", d_mul, IN01, false, IN1),
    D(DIV, "DivBackward0", d_div, IN1, true, 0),
    D(POW, "PowBackward1", d_pow, IN01, true, IN01),
    D(MAXIMUM, "MaximumBackward0", d_maximum, IN01, false, IN01),
    D(MINIMUM, "MinimumBackward0", d_minimum, IN01, false, IN01),
    D(WHERE, "WhereBackward0", d_where, IN0, false, 0),
    D(MASKED_FILL, "MaskedFillBackward0", d_masked_fill, IN1, false, 0),
    D(SUM, "SumBackward1", d_sum, 0, false, 0),
    D(MEAN, "MeanBackward1", d_mean, 0, false, 0),
    D(PROD, "ProdBackward1", d_prod, IN0, true, 0),
    D(AMAX, "AmaxBackward0", d_amax, IN0, true, 0),
    D(AMIN, "AminBackward0", d_amax, IN0, true, 0),
    D(VAR, "VarBackward0", d_var, IN0, false, 0),
    D(STD, "StdBackward0", d_std, IN0, true, 0),
    D(LOGSUMEXP, "LogsumexpBackward0", d_logsumexp, IN0, true, 0),
    D(NORM, "NormBackward1", d_norm, IN0, true, 0),
    [CT_OP_MAX_DIM] = {{"MaxBackward0", d_max_dim}, 0, true, 1, 0},
    [CT_OP_MIN_DIM] = {{"MinBackward0", d_max_dim}, 0, true, 1, 0},
    D(MATMUL, "MmBackward0", d_matmul, IN01, false, 0),
    D(SOFTMAX, "SoftmaxBackward0", d_softmax, 0, true, 0),
    D(LOG_SOFTMAX, "LogSoftmaxBackward0", d_log_softmax, 0, true, 0),
    D(CAT, "CatBackward0", d_cat, 0, false, 0),
    D(STACK, "StackBackward0", d_stack, 0, false, 0),
    D(INDEX_SELECT, "IndexSelectBackward0", d_index_select, IN1, false, 0),
    D(GATHER, "GatherBackward0", d_gather, IN1, false, 0),
    D(SCATTER_ADD, "ScatterAddBackward0", d_scatter_add, IN1, false, 0),
    D(TRIL, "TrilBackward0", d_tril, 0, false, 0),
    D(TRIU, "TriuBackward0", d_triu, 0, false, 0),
};

const ct__deriv *ct__autograd_deriv_of(ct_op op) {
    if ((unsigned)op >= CT_NOPS || !derivs[op].fn.backward)
        return NULL;
    return &derivs[op];
}
