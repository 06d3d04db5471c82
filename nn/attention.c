/* Scaled dot-product attention as one op with its own backward: the
 * front end. It checks and plans the pass and records it for autograd;
 * the device's attention entry (device_impl.h: tensor/cpu/attention.c)
 * runs it. A device without one runs the same computation as ops
 * (attention_ops below), as one that lacks a fused kernel does in PyTorch.
 *
 * The softmax P is saved for backward; the dropout mask is not, since
 * drawing it again costs less than keeping it (the kernel draws it from
 * the counters the forward reserved).
 *
 * Operands reach the kernel without copies when their last dim has unit
 * stride, so the heads of a fused qkv projection (a [B, T, 3, H, D] view)
 * are read in place. Other layouts are copied once. */
#include "device_impl.h"
#include "nn_impl.h"

#include <math.h>
#include <stdlib.h>

/* ----------------------------------------------------------- operands */

/* Can BLAS read t ([..., rows, cols]) in place: its last dim with unit
 * stride, and a leading dim >= cols that BLAS's ints hold? */
static bool blas_ready(const ct_tensor *t, int64_t *ld) {
    int nd = t->ndim;
    int64_t rows = t->sizes[nd - 2], cols = t->sizes[nd - 1], min_ld = cols > 1 ? cols : 1;
    *ld = rows > 1 && cols > 0 ? t->strides[nd - 2] : min_ld;
    return (cols <= 1 || t->strides[nd - 1] == 1) && *ld >= min_ld && *ld <= INT32_MAX;
}

/* Points m at t for the batch shape of s; BLAS must be able to read t in
 * place (the kernels write outputs through m, so there is no copying). */
static int point_at(ct__att_mat *m, ct_tensor *t, const ct__att_dims *s) {
    char desc[CT__DESC_STR];
    if (!blas_ready(t, &m->ld))
        return ct__err_set(CT_ENOTSUP,
                           "scaled_dot_product_attention: %s has rows too long for BLAS",
                           ct__tensor_desc(desc, t));
    m->data = ct__data(t);
    int tb = t->ndim - 2;
    for (int d = 0; d < s->nbatch; d++) {
        int td = d - (s->nbatch - tb);
        m->bstrides[d] = td < 0 || t->sizes[td] == 1 ? 0 : t->strides[td];
    }
    return 0;
}

/* An input: points m at t, through a contiguous copy (owned by the current
 * scope) when BLAS cannot read t in place. Returns the tensor read, or
 * NULL. */
static ct_tensor *describe(ct__att_mat *m, ct_tensor *t, const ct__att_dims *s) {
    int64_t ld;
    if (t && !blas_ready(t, &ld))
        t = ct_contiguous(t);
    return t && !point_at(m, t, s) ? t : NULL;
}

/* [batch..., rows, cols] of s. */
static ct_tensor *unit_tensor(const ct__att_dims *s, int64_t rows, int64_t cols, ct_dtype dtype,
                              ct_device device) {
    int64_t sizes[CT_MAX_DIMS];
    memcpy(sizes, s->batch, sizeof(int64_t) * (size_t)s->nbatch);
    sizes[s->nbatch] = rows;
    sizes[s->nbatch + 1] = cols;
    return ct__tensor_new_on("scaled_dot_product_attention", s->nbatch + 2, sizes, dtype, device);
}

/* x [B, T, H D] as heads [B, H, T, D], a view; x must be contiguous. */
static ct_tensor *heads_of(ct_tensor *x, int64_t heads) {
    int64_t b = ct_size(x, 0), t = ct_size(x, 1), c = ct_size(x, 2);
    return ct_transpose(ct_view(x, CT_SHAPE(b, t, heads, c / heads)), 1, 2);
}

/* q, k and v of a contiguous packed projection [B, T, 3 C] as [B, H, T, D]
 * views: the layout a fused qkv linear layer writes. */
static void qkv_heads(ct_tensor *qkv, int64_t heads, ct_tensor *out[3]) {
    int64_t b = ct_size(qkv, 0), t = ct_size(qkv, 1), c = ct_size(qkv, 2) / 3;
    ct_tensor *split = ct_view(qkv, CT_SHAPE(b, t, 3, heads, c / heads));
    for (int i = 0; i < 3; i++)
        out[i] = ct_transpose(ct_select(split, 2, i), 1, 2);
}

/* -------------------------------------------------------------- backward */

typedef struct att_ctx {
    ct__att_dims s;
    bool causal;
    double scale, p;
    uint64_t seed, offset;
    int64_t heads; /* > 0: one packed input (saved: qkv, probs); 0: q, k, v, probs */
} att_ctx;

static int att_backward(const ct_backward_args *a) {
    const att_ctx *c = a->ctx;
    ct_tensor *g = a->grad_outputs[0];
    if (!g)
        return 0;
    if (ct_grad_enabled())
        return ct__err_set(CT_ENOTSUP, "scaled_dot_product_attention: differentiating the backward "
                                       "again (create_graph) is not supported");
    ct_dtype dt = a->saved[0]->dtype;
    ct_device dev = ct_tensor_device(a->saved[0]);
    const ct__device_ops *ops = CT__DEVICE_GET("scaled_dot_product_attention", dev, attention);
    if (!ops)
        return ct_errcode();
    ct_tensor *in[3], *grads[3], *packed = NULL, *go = ct_to_dtype(g, dt);
    ct_tensor *probs = a->saved[c->heads ? 1 : 3];
    if (c->heads) {
        qkv_heads(a->saved[0], c->heads, in);
        packed = ct_empty_on(a->saved[0]->ndim, a->saved[0]->sizes, dt, dev);
        if (packed)
            qkv_heads(packed, c->heads, grads);
        go = go ? heads_of(ct_contiguous(go), c->heads) : NULL;
    } else {
        for (int i = 0; i < 3; i++)
            in[i] = a->saved[i];
        grads[0] = unit_tensor(&c->s, c->s.tq, c->s.d, dt, dev);
        grads[1] = unit_tensor(&c->s, c->s.tk, c->s.d, dt, dev);
        grads[2] = unit_tensor(&c->s, c->s.tk, c->s.dv, dt, dev);
    }
    ct__attention j = {.s = c->s,
                       .backward = true,
                       .dbl = dt == CT_FLOAT64,
                       .causal = c->causal,
                       .scale = c->scale,
                       .p = c->p,
                       .seed = c->seed,
                       .offset = c->offset,
                       .probs = ct__data(probs)};
    if ((c->heads && !packed) || !describe(&j.m[CT__ATT_GO], go, &c->s))
        return ct_errcode();
    for (int i = 0; i < 3; i++)
        if (!grads[i] || !describe(&j.m[CT__ATT_Q + i], in[i], &c->s) ||
            point_at(&j.m[CT__ATT_GQ + i], grads[i], &c->s))
            return ct_errcode();
    int rc = ops->attention(&j);
    if (rc)
        return rc;
    if (c->heads)
        grads[0] = packed;
    for (int i = 0; i < a->ninputs; i++)
        a->grad_inputs[i] = a->needs_input_grad[i] ? grads[i] : NULL;
    return 0;
}

static const ct_function_def att_def = {"ScaledDotProductAttentionBackward", att_backward, free};

/* --------------------------------------------------------------- forward */

/* The fused forward over q, k and v (views of the packed ins[0] when heads
 * > 0, whose result is then [B, T, C]) by ops's kernel, recorded with
 * inputs ins. */
static ct_tensor *attention_fused(const ct__device_ops *ops, ct_tensor *const qkv[3],
                                  ct_tensor *const *ins, int nins, const ct__att_dims *s,
                                  const ct_attention_options *o, double scale, int64_t heads) {
    att_ctx *c = malloc(sizeof *c);
    if (!c) {
        ct__err_set(CT_ENOMEM, "scaled_dot_product_attention: out of memory");
        return NULL;
    }
    *c = (att_ctx){.s = *s, .causal = o->causal, .scale = scale, .p = o->dropout_p, .heads = heads};
    if (c->p > 0) {
        uint64_t n = (uint64_t)(s->units * s->tq * s->tk);
        ct__tensor_generator_claim(o->gen, (n + 3) / 4, &c->seed, &c->offset);
    }
    ct_scope_begin();
    bool prev = ct_set_grad_enabled(false);
    ct_dtype dt = qkv[0]->dtype;
    ct__attention j = {.s = *s,
                       .dbl = dt == CT_FLOAT64,
                       .causal = c->causal,
                       .scale = scale,
                       .p = c->p,
                       .seed = c->seed,
                       .offset = c->offset};
    ct_tensor *read[3];
    int rc = 0;
    for (int i = 0; i < 3 && !rc; i++)
        rc = (read[i] = describe(&j.m[CT__ATT_Q + i], qkv[i], s)) ? 0 : ct_errcode();
    ct_device dev = ct_tensor_device(qkv[0]);
    ct_tensor *probs = unit_tensor(s, s->tq, s->tk, dt, dev);
    ct_tensor *out = heads ? ct_empty_on(CT_SHAPE(s->batch[0], s->tq, heads * s->dv), dt, dev)
                           : unit_tensor(s, s->tq, s->dv, dt, dev);
    if (!rc &&
        (!probs || !out || point_at(&j.m[CT__ATT_OUT], heads ? heads_of(out, heads) : out, s)))
        rc = ct_errcode();
    if (!rc) {
        j.probs = ct__data(probs);
        rc = ops->attention(&j);
    }
    ct_set_grad_enabled(prev);
    if (rc)
        free(c);
    else if (heads)
        rc = ct_function_record(&att_def, c, ins, nins, &out, 1, (ct_tensor *[]){ins[0], probs}, 2);
    else
        rc = ct_function_record(&att_def, c, ins, nins, &out, 1,
                                (ct_tensor *[]){read[0], read[1], read[2], probs}, 4);
    if (!rc)
        ct_keep(out);
    ct_scope_end();
    return rc ? NULL : out;
}

/* The same computation as a chain of ops, for a device without the fused
 * kernel. */
static ct_tensor *attention_ops(ct_tensor *q, ct_tensor *k, ct_tensor *v, const ct__att_dims *s,
                                const ct_attention_options *o, double scale) {
    ct_tensor *scores = ct_mul_scalar(ct_matmul(q, ct_transpose(k, -2, -1)), scale);
    if (o->causal) {
        ct_device dev = ct_tensor_device(q);
        ct_tensor *ones = ct_full_on(2, (int64_t[]){s->tq, s->tk}, 1, CT_BOOL, dev);
        scores = ct_masked_fill(scores, ct_triu(ones, 1), -INFINITY);
    }
    ct_tensor *w = ct_softmax(scores, -1);
    if (o->dropout_p > 0 && w) {
        ct_tensor *u = ct_rand(w->ndim, w->sizes, CT_FLOAT32, o->gen);
        ct_tensor *keep = ct_to(ct_lt_scalar(u, 1 - o->dropout_p), ct_tensor_device(w));
        double f = o->dropout_p < 1 ? 1 / (1 - o->dropout_p) : 0;
        w = ct_mul(w, ct_mul_scalar(ct_to_dtype(keep, w->dtype), f));
    }
    return ct_matmul(w, v);
}

/* Checks the operands and fills s. */
static int check(ct_tensor *q, ct_tensor *k, ct_tensor *v, const ct_attention_options *o,
                 ct__att_dims *s) {
    const char *op = "scaled_dot_product_attention";
    char dq[CT__DESC_STR], dk[CT__DESC_STR], dv[CT__DESC_STR];
    if (!ct_dtype_is_float(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype)
        return ct__err_set(CT_EDTYPE, "%s: q %s, k %s and v %s need one floating-point dtype", op,
                           ct__tensor_desc(dq, q), ct__tensor_desc(dk, k), ct__tensor_desc(dv, v));
    if (q->ndim < 2 || k->ndim < 2 || v->ndim < 2 ||
        q->sizes[q->ndim - 1] != k->sizes[k->ndim - 1] ||
        k->sizes[k->ndim - 2] != v->sizes[v->ndim - 2])
        return ct__err_set(CT_ESHAPE,
                           "%s: expected q [..., Tq, D], k [..., Tk, D] and v [..., Tk, Dv], got "
                           "q %s, k %s and v %s",
                           op, ct__tensor_desc(dq, q), ct__tensor_desc(dk, k),
                           ct__tensor_desc(dv, v));
    if (!(o->dropout_p >= 0 && o->dropout_p <= 1))
        return ct__err_set(CT_EINVAL, "%s: dropout_p must be in [0, 1], got %g", op, o->dropout_p);
    if (!(o->scale >= 0 && isfinite(o->scale)))
        return ct__err_set(CT_EINVAL, "%s: scale must be finite and >= 0 (0: 1/sqrt(D)), got %g",
                           op, o->scale);
    int nb = 0;
    int64_t b[CT_MAX_DIMS];
    if (ct__tensor_broadcast_shapes(op, q->ndim - 2, q->sizes, k->ndim - 2, k->sizes, &nb, b) ||
        ct__tensor_broadcast_shapes(op, nb, b, v->ndim - 2, v->sizes, &s->nbatch, s->batch))
        return ct_errcode();
    s->units = ct__tensor_numel(s->nbatch, s->batch);
    s->tq = q->sizes[q->ndim - 2];
    s->tk = k->sizes[k->ndim - 2];
    s->d = q->sizes[q->ndim - 1];
    s->dv = v->sizes[v->ndim - 1];
    if (s->tq > INT32_MAX || s->tk > INT32_MAX || s->d > INT32_MAX || s->dv > INT32_MAX)
        return ct__err_set(CT_ENOTSUP,
                           "%s: a matrix dim of q %s, k %s or v %s exceeds BLAS's limit", op,
                           ct__tensor_desc(dq, q), ct__tensor_desc(dk, k), ct__tensor_desc(dv, v));
    return 0;
}

ct_tensor *ct_scaled_dot_product_attention(ct_tensor *q, ct_tensor *k, ct_tensor *v,
                                           const ct_attention_options *opts) {
    const char *op = "scaled_dot_product_attention";
    ct_attention_options o = opts ? *opts : (ct_attention_options){0};
    ct__att_dims s;
    if (CT__CHECK_ANY(op, q, k, v) ||
        ct__tensor_check_same_device(op, (ct_tensor *[]){q, k, v}, 3) || check(q, k, v, &o, &s))
        return NULL;
    double scale = o.scale > 0 ? o.scale : 1 / sqrt((double)(s.d > 0 ? s.d : 1));
    const ct__device_ops *ops = ct__device_ops_of(ct_tensor_device(q).type);
    if (!ops || !ops->attention)
        return attention_ops(q, k, v, &s, &o, scale);
    if (q->dtype == CT_FLOAT32 || q->dtype == CT_FLOAT64)
        return attention_fused(ops, (ct_tensor *[]){q, k, v}, (ct_tensor *[]){q, k, v}, 3, &s, &o,
                               scale, 0);
    o.scale = scale;
    ct_tensor *out = ct_scaled_dot_product_attention(
        ct_to_dtype(q, CT_FLOAT32), ct_to_dtype(k, CT_FLOAT32), ct_to_dtype(v, CT_FLOAT32), &o);
    return ct_to_dtype(out, q->dtype);
}

ct_tensor *ct__nn_attention_packed(ct_tensor *qkv, int64_t heads,
                                   const ct_attention_options *opts) {
    const char *op = "scaled_dot_product_attention";
    char dq[CT__DESC_STR];
    if (CT__CHECK_ANY(op, qkv))
        return NULL;
    if (qkv->ndim != 3 || heads <= 0 || qkv->sizes[2] % (3 * heads)) {
        ct__err_set(CT_ESHAPE,
                    "%s: expected a packed qkv [B, T, 3 C] with C divisible by %lld heads, "
                    "got %s",
                    op, (long long)heads, ct__tensor_desc(dq, qkv));
        return NULL;
    }
    const ct__device_ops *ops = ct__device_ops_of(ct_tensor_device(qkv).type);
    bool fused = ops && ops->attention && ct_is_contiguous(qkv) &&
                 (qkv->dtype == CT_FLOAT32 || qkv->dtype == CT_FLOAT64);
    ct_tensor *qkv3[3];
    qkv_heads(fused ? qkv : ct_contiguous(qkv), heads, qkv3);
    if (!fused) {
        ct_tensor *y = ct_scaled_dot_product_attention(qkv3[0], qkv3[1], qkv3[2], opts);
        return ct_reshape(ct_transpose(y, 1, 2),
                          CT_SHAPE(qkv->sizes[0], qkv->sizes[1], qkv->sizes[2] / 3));
    }
    ct_attention_options o = opts ? *opts : (ct_attention_options){0};
    ct__att_dims s;
    if (check(qkv3[0], qkv3[1], qkv3[2], &o, &s))
        return NULL;
    double scale = o.scale > 0 ? o.scale : 1 / sqrt((double)(s.d > 0 ? s.d : 1));
    return attention_fused(ops, qkv3, &qkv, 1, &s, &o, scale, heads);
}
