/* Autograd state on tensors, graph nodes, and the recorder that tensor/ calls
 * after every op. */
#include "autograd_impl.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* -------------------------------------------------------- thread state */

static _Thread_local bool grad_disabled;
static _Thread_local uint64_t next_seq;
static _Thread_local const char *current_label;
static atomic_bool anomaly;

bool ct__autograd_grad_mode(void) { return !grad_disabled; }
bool ct_grad_enabled(void) { return !grad_disabled; }

bool ct_set_grad_enabled(bool enabled) {
    bool prev = !grad_disabled;
    grad_disabled = !enabled;
    return prev;
}

bool ct_set_anomaly_enabled(bool enabled) { return atomic_exchange(&anomaly, enabled); }
bool ct_anomaly_enabled(void) { return atomic_load_explicit(&anomaly, memory_order_relaxed); }

const char *ct_autograd_set_label(const char *label) {
    const char *prev = current_label;
    current_label = label;
    return prev;
}

int ct_autograd_fail(int code, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ct__err_set(code, "%s", msg);
}

/* ------------------------------------------------------------- shapes */

void ct__autograd_shape_of(ct__shape *s, const ct_tensor *t) {
    s->dtype = t->dtype;
    s->device = t->storage->device;
    s->ndim = t->ndim;
    memcpy(s->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
}

bool ct__autograd_shape_equal(const ct__shape *s, const ct_tensor *t) {
    return s->ndim == t->ndim && memcmp(s->sizes, t->sizes, sizeof(int64_t) * (size_t)s->ndim) == 0;
}

const char *ct__autograd_shape_rec_str(char *buf, const ct__shape *s) {
    return ct__tensor_shape_str(buf, s->ndim, s->sizes);
}

/* -------------------------------------------------------------- nodes */

ct_node *ct__node_new(ct__node_kind kind, int nnext, int nout, int nsaved) {
    size_t size = sizeof(ct_node) + (size_t)nnext * (sizeof(ct__edge) + sizeof(ct__shape)) +
                  (size_t)nout * sizeof(ct__shape) + (size_t)nsaved * sizeof(ct__saved);
    ct_node *n = calloc(1, size);
    if (!n) {
        ct__err_set(CT_ENOMEM, "autograd: out of memory allocating a graph node");
        return NULL;
    }
    atomic_init(&n->refcount, 1);
    n->kind = kind;
    n->nnext = nnext;
    n->nout = nout;
    n->nsaved = nsaved;
    n->next = (ct__edge *)(n + 1);
    n->in_meta = (ct__shape *)(n->next + nnext);
    n->out_meta = n->in_meta + nnext;
    n->saved = (ct__saved *)(n->out_meta + nout);
    /* AccumulateGrad runs as soon as it is ready, so that hooks on leaves
     * (data-parallel bucketing) see gradients as early as possible. */
    n->seq = kind == CT__NODE_ACCUMULATE ? UINT64_MAX : next_seq++;
    if (ct_anomaly_enabled()) {
        if (current_label)
            n->label = strdup(current_label);
        void *frames[32];
        int nf = backtrace(frames, 32);
        n->trace = malloc(sizeof(void *) * (size_t)nf);
        if (n->trace) {
            memcpy(n->trace, frames, sizeof(void *) * (size_t)nf);
            n->ntrace = nf;
        }
    }
    return n;
}

const char *ct__node_trace(char *buf, size_t cap, const ct_node *n) {
    Dl_info self, at;
    size_t len = 0;
    int shown = 0;
    buf[0] = 0;
    if (!dladdr((void *)ct__node_trace, &self))
        return buf;
    for (int i = 0; i < n->ntrace && shown < 6 && len < cap; i++) {
        /* Frames inside ct itself say nothing about the user's code. */
        if (!dladdr(n->trace[i], &at) || at.dli_fbase == self.dli_fbase)
            continue;
        const char *file = at.dli_fname ? strrchr(at.dli_fname, '/') : NULL;
        file = file ? file + 1 : at.dli_fname ? at.dli_fname : "?";
        char *base = at.dli_sname ? (char *)at.dli_saddr : (char *)at.dli_fbase;
        int w = snprintf(buf + len, cap - len, "%s%s+0x%lx (%s)", shown ? " < " : "",
                         at.dli_sname ? at.dli_sname : "",
                         (unsigned long)((char *)n->trace[i] - base), file);
        len += w > 0 ? (size_t)w : 0;
        shown++;
        if (at.dli_sname && strcmp(at.dli_sname, "main") == 0)
            break; /* what follows is the C runtime's */
    }
    return buf;
}

ct_node *ct__node_retain(ct_node *n) {
    if (n)
        atomic_fetch_add_explicit(&n->refcount, 1, memory_order_relaxed);
    return n;
}

/* Nodes whose last reference went while another node was being destroyed on
 * this thread; destroying them in a loop instead of recursively bounds the
 * stack for graphs of any depth. */
static _Thread_local ct_node **doomed;
static _Thread_local size_t ndoomed, doomed_cap;
static _Thread_local bool destroying;

static void free_hooks(ct__hook *h) {
    while (h) {
        ct__hook *next = h->next;
        free(h);
        h = next;
    }
}

void ct__node_release_saved(ct_node *n) {
    if (n->inner)
        ct__node_release_saved(n->inner);
    for (int i = 0; i < n->nsaved; i++) {
        ct_tensor_free(n->saved[i].t);
        n->saved[i].t = NULL;
    }
}

static void node_destroy(ct_node *n) {
    if (n->kind == CT__NODE_ACCUMULATE && n->leaf) {
        ct__meta *m = ct__meta_of(n->leaf);
        pthread_mutex_lock(&m->lock);
        if (m->acc == n)
            m->acc = NULL;
        pthread_mutex_unlock(&m->lock);
        ct_tensor_free(n->leaf);
    }
    for (int i = 0; i < n->nsaved; i++)
        ct_tensor_free(n->saved[i].t);
    for (int i = 0; i < n->nnext; i++)
        ct__node_release(n->next[i].node);
    ct__node_release(n->inner);
    free(n->geom);
    if (n->def && n->def->free_ctx)
        n->def->free_ctx(n->ctx);
    free_hooks(n->hooks);
    free(n->label);
    free(n->trace);
    free(n);
}

void ct__node_release(ct_node *n) {
    if (!n || atomic_fetch_sub_explicit(&n->refcount, 1, memory_order_acq_rel) != 1)
        return;
    int rc = CT__GROW(doomed, &doomed_cap, ndoomed + 1, 0, "freeing an autograd graph");
    CT_ASSERT(rc == 0 && "out of memory freeing an autograd graph");
    doomed[ndoomed++] = n;
    if (destroying)
        return;
    destroying = true;
    while (ndoomed > 0)
        node_destroy(doomed[--ndoomed]);
    destroying = false;
    free(doomed);
    doomed = NULL;
    doomed_cap = 0;
}

const char *ct__node_desc(char *buf, size_t cap, const ct_node *n) {
    int len = snprintf(buf, cap, "%s", ct_node_name(n));
    if (n->kind == CT__NODE_OP && len >= 0 && (size_t)len < cap)
        len += snprintf(buf + len, cap - (size_t)len, " (from op %s)", ct_op_name(n->op));
    if (n->label && len >= 0 && (size_t)len < cap)
        snprintf(buf + len, cap - (size_t)len, " [%s]", n->label);
    return buf;
}

/* A new tensor object on t's storage, without history and not in any
 * scope. */
static ct_tensor *alias(ct_tensor *t) {
    ct_tensor *a = ct__tensor_make_view(t, t->ndim, t->sizes, t->strides, t->offset);
    if (!a)
        return NULL;
    ct_tensor_retain(a);
    ct__tensor_release(a);
    return a;
}

int ct__node_save(ct_node *n, int slot, ct_tensor *t, int output_nr) {
    ct__saved *s = &n->saved[slot];
    /* An output would hold its own node through its history: a cycle. */
    s->t = output_nr >= 0 ? alias(t) : ct_tensor_retain(t);
    if (!s->t)
        return CT_ENOMEM;
    s->version = ct_tensor_version(t);
    s->output_nr = output_nr;
    s->present = true;
    return 0;
}

ct_tensor *ct__autograd_saved_unpack(ct_node *n, int i, int *err) {
    char desc[256], td[CT__DESC_STR];
    ct__saved *s = &n->saved[i];
    if (!s->t) {
        if (s->present) {
            *err = ct__err_set(
                CT_ESTATE,
                "autograd: trying to backward through %s a second time, but its saved tensors "
                "were freed by the first backward. Pass retain_graph=true to the first "
                "ct_backward (or ct_grad) if you need to backward through the graph again",
                ct__node_desc(desc, sizeof desc, n));
        }
        return NULL;
    }
    uint64_t v = ct_tensor_version(s->t);
    if (v != s->version) {
        *err = ct__err_set(
            CT_ESTATE,
            "autograd: one of the tensors needed for gradient computation has been modified by "
            "an in-place operation: %s, which is %s %d of %s, is at version %llu; expected "
            "version %llu instead. Hint: clone it before the in-place op, or do the in-place "
            "op out of place",
            ct__tensor_desc(td, s->t), s->output_nr >= 0 ? "output" : "input",
            s->output_nr >= 0 ? s->output_nr : i, ct__node_desc(desc, sizeof desc, n),
            (unsigned long long)v, (unsigned long long)s->version);
        return NULL;
    }
    if (s->output_nr < 0 || !ct__autograd_grad_mode())
        return s->t;
    /* Double backward: the saved output must carry this node's history, as
     * the original output did. */
    ct_tensor *a = ct__tensor_scope_own(alias(s->t));
    if (!a || ct__autograd_set_history(a, n, s->output_nr)) {
        *err = ct_errcode();
        return NULL;
    }
    return a;
}

/* ------------------------------------------------------ tensor meta */

static void meta_free(void *p) {
    ct__meta *m = p;
    ct__node_release(m->grad_fn);
    ct_tensor_free(m->grad);
    ct_tensor_free(m->base);
    free_hooks(m->hooks);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

ct__meta *ct__autograd_meta_get(ct_tensor *t) {
    ct__meta *m = ct__meta_of(t);
    if (m)
        return m;
    m = calloc(1, sizeof *m);
    if (!m) {
        ct__err_set(CT_ENOMEM, "autograd: out of memory for a tensor's autograd state");
        return NULL;
    }
    pthread_mutex_init(&m->lock, NULL);
    ct_tensor_set_meta(t, m);
    return m;
}

int ct__autograd_set_history(ct_tensor *out, ct_node *n, int output_nr) {
    ct__meta *m = ct__autograd_meta_get(out);
    if (!m)
        return CT_ENOMEM;
    ct_node *old = m->grad_fn;
    m->grad_fn = ct__node_retain(n);
    m->output_nr = output_nr;
    ct__node_release(old);
    return 0;
}

static const ct__fn accumulate_fn;

int ct__autograd_gradient_edge(ct_tensor *t, ct__edge *edge) {
    *edge = (ct__edge){NULL, 0};
    ct__meta *m = ct__meta_of(t);
    if (!m)
        return 0;
    int rc = m->base ? ct__autograd_refresh_view(t) : 0;
    if (rc)
        return rc;
    if (m->grad_fn) {
        *edge = (ct__edge){ct__node_retain(m->grad_fn), m->output_nr};
        return 0;
    }
    if (!m->requires_grad)
        return 0;
    pthread_mutex_lock(&m->lock);
    ct_node *acc = m->acc;
    /* The weak pointer may name a node whose last reference is being
     * dropped on another thread: take a reference only while it is live. */
    long refs = acc ? atomic_load(&acc->refcount) : 0;
    while (refs > 0 && !atomic_compare_exchange_weak(&acc->refcount, &refs, refs + 1))
        ;
    if (refs <= 0) {
        acc = ct__node_new(CT__NODE_ACCUMULATE, 0, 1, 0);
        if (acc) {
            acc->fn = &accumulate_fn;
            acc->leaf = ct_tensor_retain(t);
            ct__autograd_shape_of(&acc->out_meta[0], t);
            m->acc = acc;
        }
    }
    pthread_mutex_unlock(&m->lock);
    if (!acc)
        return CT_ENOMEM;
    *edge = (ct__edge){acc, 0};
    return 0;
}

/* ------------------------------------------------------ public state */

ct_tensor *ct_requires_grad_(ct_tensor *t, bool requires_grad) {
    if (CT__CHECK_ANY("requires_grad_", t))
        return NULL;
    char desc[CT__DESC_STR];
    ct__meta *m = ct__meta_of(t);
    if (m && m->grad_fn) {
        if (requires_grad)
            return t;
        ct__err_set(CT_EINVAL,
                    "requires_grad_: %s has history (it is not a leaf); use ct_detach() to get a "
                    "tensor that does not require grad",
                    ct__tensor_desc(desc, t));
        return NULL;
    }
    if (requires_grad && !ct_dtype_is_float(t->dtype)) {
        ct__err_set(CT_EDTYPE,
                    "requires_grad_: only floating-point tensors can require grad, not %s",
                    ct__tensor_desc(desc, t));
        return NULL;
    }
    if (!m && !requires_grad)
        return t;
    m = ct__autograd_meta_get(t);
    if (!m)
        return NULL;
    m->requires_grad = requires_grad;
    return t;
}

bool ct_requires_grad(const ct_tensor *t) { return ct__needs_grad(t); }

bool ct_is_leaf(const ct_tensor *t) {
    const ct__meta *m = ct__meta_of(t);
    return !m || !m->grad_fn;
}

ct_tensor *ct_tensor_grad(const ct_tensor *t) {
    ct__meta *m = ct__meta_of(t);
    if (!m)
        return NULL;
    pthread_mutex_lock(&m->lock);
    ct_tensor *g = m->grad;
    pthread_mutex_unlock(&m->lock);
    return g;
}

int ct_tensor_set_grad(ct_tensor *t, ct_tensor *grad) {
    int rc = CT__CHECK_ANY("set_grad", t);
    if (rc)
        return rc;
    if (grad) {
        rc = CT__CHECK_ANY("set_grad", grad);
        if (!rc)
            rc = ct__tensor_check_same_device("set_grad", (ct_tensor *const[]){t, grad}, 2);
        if (rc)
            return rc;
        char a[CT__DESC_STR], b[CT__DESC_STR];
        if (!ct__same_shape(grad, t))
            return ct__err_set(CT_ESHAPE, "set_grad: gradient %s does not match the tensor %s",
                               ct__tensor_desc(a, grad), ct__tensor_desc(b, t));
        if (grad->dtype != t->dtype)
            return ct__err_set(CT_EDTYPE, "set_grad: gradient %s has another dtype than %s",
                               ct__tensor_desc(a, grad), ct__tensor_desc(b, t));
    }
    ct__meta *m = grad ? ct__autograd_meta_get(t) : ct__meta_of(t);
    if (!m)
        return grad ? CT_ENOMEM : 0;
    ct_tensor_retain(grad);
    pthread_mutex_lock(&m->lock);
    ct_tensor *old = m->grad;
    m->grad = grad;
    pthread_mutex_unlock(&m->lock);
    ct_tensor_free(old);
    return 0;
}

ct_tensor *ct_detach(ct_tensor *t) {
    if (CT__CHECK_ANY("detach", t))
        return NULL;
    return ct__tensor_make_view(t, t->ndim, t->sizes, t->strides, t->offset);
}

ct_node *ct_tensor_grad_fn(const ct_tensor *t) {
    ct__meta *m = ct__meta_of(t);
    if (m && m->base && ct__autograd_refresh_view((ct_tensor *)t))
        return NULL;
    return m ? m->grad_fn : NULL;
}

int ct_tensor_output_nr(const ct_tensor *t) {
    const ct__meta *m = ct__meta_of(t);
    return m && m->grad_fn ? m->output_nr : 0;
}

const char *ct_node_name(const ct_node *n) {
    return !n ? NULL : n->def ? n->def->name : n->fn->name;
}
ct_op ct_node_op(const ct_node *n) { return n ? n->op : CT_OP_EMPTY; }
uint64_t ct_node_seq(const ct_node *n) { return n ? n->seq : 0; }
int ct_node_num_next(const ct_node *n) { return n ? n->nnext : 0; }

ct_node *ct_node_next(const ct_node *n, int i, int *input_nr) {
    if (!n || i < 0 || i >= n->nnext)
        return NULL;
    if (input_nr)
        *input_nr = n->next[i].input_nr;
    return n->next[i].node;
}

int ct_node_set_label(ct_node *n, const char *label) {
    if (!n)
        return ct__err_set(CT_EINVAL, "node_set_label: NULL node");
    char *copy = label ? strdup(label) : NULL;
    if (label && !copy)
        return ct__err_set(CT_ENOMEM, "node_set_label: out of memory");
    free(n->label);
    n->label = copy;
    return 0;
}

const char *ct_node_label(const ct_node *n) { return n ? n->label : NULL; }

/* --------------------------------------------------------------- hooks */

static atomic_int next_handle = 1;

static int add_hook(ct__hook **list, ct__hook_kind kind, int output_nr, void *fn, void *ctx) {
    ct__hook *h = calloc(1, sizeof *h);
    if (!h)
        return ct__err_set(CT_ENOMEM, "register_hook: out of memory");
    h->handle = atomic_fetch_add(&next_handle, 1);
    h->kind = kind;
    h->output_nr = output_nr;
    if (kind == CT__HOOK_GRAD)
        h->fn.grad = (ct_grad_hook_fn)fn;
    else
        h->fn.post = (ct_post_accumulate_hook_fn)fn;
    h->ctx = ctx;
    while (*list)
        list = &(*list)->next;
    *list = h;
    return h->handle;
}

int ct_tensor_register_hook(ct_tensor *t, ct_grad_hook_fn fn, void *ctx) {
    int rc = CT__CHECK_ANY("register_hook", t);
    if (rc)
        return rc;
    char desc[CT__DESC_STR];
    if (!fn)
        return ct__err_set(CT_EINVAL, "register_hook: NULL hook function");
    if (!ct__needs_grad(t))
        return ct__err_set(CT_EINVAL,
                           "register_hook: %s does not require grad, so no gradient will flow "
                           "into it; call ct_requires_grad_() first",
                           ct__tensor_desc(desc, t));
    ct__meta *m = ct__meta_of(t);
    if (m->grad_fn)
        return add_hook(&m->grad_fn->hooks, CT__HOOK_GRAD, m->output_nr, (void *)fn, ctx);
    pthread_mutex_lock(&m->lock);
    rc = add_hook(&m->hooks, CT__HOOK_GRAD, 0, (void *)fn, ctx);
    pthread_mutex_unlock(&m->lock);
    return rc;
}

int ct_tensor_register_post_accumulate_grad_hook(ct_tensor *t, ct_post_accumulate_hook_fn fn,
                                                 void *ctx) {
    int rc = CT__CHECK_ANY("register_post_accumulate_grad_hook", t);
    if (rc)
        return rc;
    char desc[CT__DESC_STR];
    ct__meta *m = ct__meta_of(t);
    if (!fn || !m || m->grad_fn || !m->requires_grad)
        return ct__err_set(CT_EINVAL,
                           "register_post_accumulate_grad_hook: %s; the hook needs a leaf that "
                           "requires grad",
                           !fn               ? "NULL hook function"
                           : m && m->grad_fn ? "the tensor is not a leaf"
                                             : ct__tensor_desc(desc, t));
    pthread_mutex_lock(&m->lock);
    rc = add_hook(&m->hooks, CT__HOOK_POST_ACCUMULATE, 0, (void *)fn, ctx);
    pthread_mutex_unlock(&m->lock);
    return rc;
}

static bool remove_from(ct__hook **list, int handle) {
    for (; *list; list = &(*list)->next) {
        if ((*list)->handle == handle) {
            ct__hook *h = *list;
            *list = h->next;
            free(h);
            return true;
        }
    }
    return false;
}

int ct_tensor_remove_hook(ct_tensor *t, int handle) {
    int rc = CT__CHECK_ANY("remove_hook", t);
    if (rc)
        return rc;
    ct__meta *m = ct__meta_of(t);
    bool found = false;
    if (m && m->grad_fn)
        found = remove_from(&m->grad_fn->hooks, handle);
    if (m && !found) {
        pthread_mutex_lock(&m->lock);
        found = remove_from(&m->hooks, handle);
        pthread_mutex_unlock(&m->lock);
    }
    return found ? 0
                 : ct__err_set(CT_EINVAL, "remove_hook: no hook with handle %d on this tensor",
                               handle);
}

/* ------------------------------------------------------------ recorder */

static bool is_view_op(ct_op op) {
    switch (op) {
    case CT_OP_VIEW:
    case CT_OP_EXPAND:
    case CT_OP_PERMUTE:
    case CT_OP_SLICE:
    case CT_OP_SELECT:
    case CT_OP_SQUEEZE:
    case CT_OP_UNSQUEEZE: return true;
    default: return false;
    }
}

/* In-place ops on tensors that require grad: the checks PyTorch makes,
 * before the op writes. others are the op's operands after self. */
static int check_inplace(ct_op opcode, ct_tensor *self, ct_tensor *const *others, int nothers) {
    if (grad_disabled)
        return 0;
    bool any = ct__needs_grad(self);
    for (int i = 0; i < nothers && !any; i++)
        any = ct__needs_grad(others[i]);
    if (!any)
        return 0;
    const ct__deriv *d = ct__autograd_deriv_of(opcode);
    ct__meta *m = ct__meta_of(self);
    char desc[CT__DESC_STR];
    const char *op = ct_op_name(opcode);
    if (m && m->requires_grad && !m->grad_fn)
        return ct__err_set(
            CT_EINVAL,
            "%s: a leaf tensor that requires grad (%s) is being used in an in-place "
            "op; do it with grad mode off (ct_set_grad_enabled(false)) or on a clone",
            op, ct__tensor_desc(desc, self));
    if (m && m->base) {
        int rc = ct__autograd_check_view_write(op, self);
        if (rc)
            return rc;
    } else if (!ct__needs_grad(self) && atomic_load(&self->storage->refcount) > 1) {
        /* Memory shared with tensors that are not its views (its own views
         * are tracked, and regenerate their history from it): they would
         * not learn that their values now depend on something that
         * requires grad. */
        return ct__err_set(CT_ENOTSUP,
                           "%s: writing a result that requires grad in place into %s, which shares "
                           "its memory with tensors that are not views of it, would leave them "
                           "without a gradient; write into a fresh tensor, or assemble the pieces "
                           "with ct_cat/ct_stack",
                           op, ct__tensor_desc(desc, self));
    }
    if (!d)
        return ct__err_set(CT_ENOTSUP,
                           "%s: op has no derivative and cannot be applied in place to %s, which "
                           "requires grad; apply it to a detached tensor (ct_detach)",
                           op, ct__tensor_desc(desc, self));
    for (int i = 0; i <= nothers; i++)
        if ((d->needs_old_self >> i & 1u) && ct__needs_grad(i == 0 ? self : others[i - 1]))
            return ct__err_set(CT_ENOTSUP,
                               "%s: the gradient of input %d needs the value of %s from before "
                               "the in-place op overwrote it; use the out-of-place form",
                               op, i, ct__tensor_desc(desc, self));
    return 0;
}

static int record(const ct_op_record *r) {
    if (grad_disabled)
        return 0;
    int rc = 0;
    for (int i = 0; i < r->ninputs && !rc; i++) {
        ct__meta *im = ct__meta_of(r->inputs[i]);
        if (im && im->base)
            rc = ct__autograd_refresh_view(r->inputs[i]);
    }
    if (!rc && is_view_op(r->op) && !r->inplace && ct_dtype_is_float(r->outputs[0]->dtype))
        rc = ct__autograd_track_view(r->inputs[0], r->outputs[0]);
    if (rc)
        return rc;
    bool any = false;
    for (int i = 0; i < r->ninputs && !any; i++)
        any = ct__needs_grad(r->inputs[i]);
    if (!any)
        return 0;
    const ct__deriv *d = ct__autograd_deriv_of(r->op);
    if (!d)
        return 0;

    ct_node *n = ct__node_new(CT__NODE_OP, r->ninputs, r->noutputs, r->ninputs + 1);
    if (!n)
        return CT_ENOMEM;
    n->fn = &d->fn;
    n->op = r->op;
    n->inplace = r->inplace;
    n->args = *r->args;
    /* x * s and x / s need only s, which the node's arguments hold. */
    bool scalar_form = r->args->scalar_operand && (r->op == CT_OP_MUL || r->op == CT_OP_DIV);
    for (int i = 0; i < r->ninputs && !rc; i++) {
        ct_tensor *in = r->inputs[i];
        rc = ct__autograd_gradient_edge(in, &n->next[i]);
        ct__autograd_shape_of(&n->in_meta[i], in);
        bool save = (d->save_inputs >> i & 1u) && !scalar_form;
        if (!rc && save && !(r->inplace && i == 0))
            rc = ct__node_save(n, i, in, -1);
    }
    for (int i = 0; i < r->noutputs; i++)
        ct__autograd_shape_of(&n->out_meta[i], r->outputs[i]);
    if (!rc && d->save_output && !scalar_form)
        rc = ct__node_save(n, r->ninputs, r->outputs[d->saved_output], d->saved_output);
    ct__meta *self = r->inplace ? ct__meta_of(r->inputs[0]) : NULL;
    if (!rc && self && self->base)
        rc = ct__autograd_record_view_write(n, r->inputs[0]);
    else
        for (int i = 0; i < r->noutputs && !rc; i++)
            if (ct_dtype_is_float(r->outputs[i]->dtype))
                rc = ct__autograd_set_history(r->outputs[i], n, i);
    ct__node_release(n);
    if (rc)
        return ct__err_set(rc, "%s: autograd could not record the op: %s", ct_op_name(r->op),
                           ct_errmsg());
    return 0;
}

static const ct_tensor_hooks hooks = {
    .record = record, .free_meta = meta_free, .check_inplace = check_inplace};

__attribute__((constructor)) static void install_hooks(void) { ct_tensor_set_hooks(&hooks); }

/* AccumulateGrad's backward lives in the engine, which owns the leaf
 * accumulation rules; this entry only names the node. */
static const ct__fn accumulate_fn = {"AccumulateGrad", NULL};
