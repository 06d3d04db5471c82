/* The backward engine: one task per backward call, modelled on PyTorch's
 * GraphTask. A task discovers the graph reachable from its roots, counts
 * each node's dependencies, and runs nodes from a ready queue ordered by
 * sequence number (later nodes first; AccumulateGrad before anything). Every
 * node gets an input buffer that sums the gradients flowing into it. */
#include "autograd_impl.h"
#include "device_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* Nested backwards past this depth continue on a worker thread, so that a
 * chain of reentrant backwards cannot overflow one thread's stack. */
#define MAX_REENTRANT_DEPTH 16
#define WORKER_STACK_BYTES  (8u << 20)

typedef struct slot {
    ct_node *node;   /* strong for the task's life */
    uint64_t seq;    /* the node's, kept here for the ready queue */
    int nnext, nout; /* the node's, kept here for the passes over slots */
    int deps;        /* gradients still to come from nodes that will run */
    int buf;         /* index of the node's first input buffer */
    int edge0;       /* index in task.edges of the slots its edges lead to */
    int capture;     /* first capture on this node, -1 if none */
    bool discovered;
    bool exec;   /* its backward runs */
    bool needed; /* exec, or captured */
} slot;

typedef struct callback {
    ct_backward_callback_fn fn;
    void *ctx;
} callback;

typedef struct task {
    const ct__run *run;
    bool accumulate; /* ct_backward: leaves accumulate; ct_grad: capture */
    slot *slots;
    int nslots, slots_cap;
    int *table; /* open addressing: slot index + 1, 0 = empty */
    size_t table_mask;
    /* The slot each edge of a discovered node leads to (-1: none), so that
     * only discovery hashes node addresses. */
    int *edges;
    int nedges, edges_cap;
    ct_tensor **bufs;
    int *heap;
    int nheap;
    int *capture_next; /* captures on the same slot, chained */
    callback *callbacks;
    int ncallbacks, callbacks_cap;
    /* The backward this one runs inside: on this thread, or, for a nested
     * backward continued on a worker, the caller's (which waits). */
    struct task *parent;
} task;

static _Thread_local task *current;
static _Thread_local int depth;

bool ct__engine_capturing(void) { return current && !current->accumulate; }

/* ------------------------------------------------------ graph discovery */

static size_t hash_ptr(const void *p) {
    return (size_t)(((uintptr_t)p >> 4) * UINT64_C(0x9E3779B97F4A7C15) >> 17);
}

static int grow_table(task *t) {
    size_t cap = t->table ? (t->table_mask + 1) * 2 : 256;
    int *table = calloc(cap, sizeof *table);
    if (!table)
        return ct__err_set(CT_ENOMEM, "backward: out of memory for the graph table");
    for (int i = 0; i < t->nslots; i++) {
        size_t h = hash_ptr(t->slots[i].node) & (cap - 1);
        while (table[h])
            h = (h + 1) & (cap - 1);
        table[h] = i + 1;
    }
    free(t->table);
    t->table = table;
    t->table_mask = cap - 1;
    return 0;
}

static int lookup(const task *t, const ct_node *n) {
    for (size_t h = hash_ptr(n) & t->table_mask; t->table[h]; h = (h + 1) & t->table_mask)
        if (t->slots[t->table[h] - 1].node == n)
            return t->table[h] - 1;
    return -1;
}

/* The slot of n, added if new. Returns its index or a negative CT_E*. */
static int slot_of(task *t, ct_node *n) {
    int i = lookup(t, n);
    if (i >= 0)
        return i;
    if ((size_t)(t->nslots + 1) * 2 > t->table_mask + 1 && grow_table(t))
        return CT_ENOMEM;
    if (CT__GROW(t->slots, &t->slots_cap, t->nslots + 1, 0, "backward: the graph's nodes"))
        return CT_ENOMEM;
    i = t->nslots++;
    t->slots[i] = (slot){.node = ct__node_retain(n),
                         .seq = n->seq,
                         .nnext = n->nnext,
                         .nout = n->nout,
                         .capture = -1};
    size_t h = hash_ptr(n) & t->table_mask;
    while (t->table[h])
        h = (h + 1) & t->table_mask;
    t->table[h] = i + 1;
    return i;
}

typedef struct frame {
    int slot;
    int child;
} frame;

typedef struct walk {
    frame *stack;
    int n, cap;
} walk;

/* Marks slot si discovered, makes room for the slots its edges lead to, and
 * pushes it on the walk. */
static int visit(task *t, walk *w, int si) {
    int nnext = t->slots[si].nnext;
    if (CT__GROW(t->edges, &t->edges_cap, t->nedges + nnext, 0, "backward: the graph's edges") ||
        CT__GROW(w->stack, &w->cap, w->n + 1, 0, "backward: the graph walk"))
        return CT_ENOMEM;
    slot *s = &t->slots[si];
    s->discovered = true;
    s->edge0 = t->nedges;
    for (int i = 0; i < nnext; i++)
        t->edges[t->nedges++] = -1;
    w->stack[w->n++] = (frame){si, 0};
    return 0;
}

/* Depth-first from the roots with an explicit stack; in post order a node's
 * children are complete, so whether it must run is known when it is
 * popped. */
static int discover(task *t) {
    walk w = {0};
    int rc = 0;
    for (int r = 0; r < t->run->nroots && !rc; r++) {
        int root = slot_of(t, t->run->roots[r].node);
        rc = root < 0 ? root : t->slots[root].discovered ? 0 : visit(t, &w, root);
        while (w.n > 0 && !rc) {
            frame *f = &w.stack[w.n - 1];
            slot *s = &t->slots[f->slot];
            ct_node *node = s->node;
            if (f->child < node->nnext) {
                int e = f->child++;
                ct_node *c = node->next[e].node;
                if (!c)
                    continue;
                int ci = slot_of(t, c);
                if (ci < 0) {
                    rc = ci;
                    break;
                }
                t->edges[t->slots[f->slot].edge0 + e] = ci;
                if (!t->slots[ci].discovered)
                    rc = visit(t, &w, ci);
                continue;
            }
            if (t->accumulate) {
                s->exec = true;
            } else {
                for (int i = 0; i < node->nnext && !s->exec; i++) {
                    int ci = t->edges[s->edge0 + i];
                    s->exec = ci >= 0 && t->slots[ci].needed;
                }
            }
            s->needed = s->exec || s->capture >= 0;
            w.n--;
        }
    }
    free(w.stack);
    return rc;
}

/* --------------------------------------------------------- ready queue */

static bool before(const task *t, int a, int b) { return t->slots[a].seq > t->slots[b].seq; }

static void heap_push(task *t, int s) {
    int i = t->nheap++;
    t->heap[i] = s;
    while (i > 0 && before(t, t->heap[i], t->heap[(i - 1) / 2])) {
        int p = (i - 1) / 2, tmp = t->heap[p];
        t->heap[p] = t->heap[i];
        t->heap[i] = tmp;
        i = p;
    }
}

static int heap_pop(task *t) {
    int top = t->heap[0];
    t->heap[0] = t->heap[--t->nheap];
    for (int i = 0;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < t->nheap && before(t, t->heap[l], t->heap[m]))
            m = l;
        if (r < t->nheap && before(t, t->heap[r], t->heap[m]))
            m = r;
        if (m == i)
            break;
        int tmp = t->heap[m];
        t->heap[m] = t->heap[i];
        t->heap[i] = tmp;
        i = m;
    }
    return top;
}

/* -------------------------------------------------------- gradients */

/* Only the engine holds a reference to t or to its memory: it may be
 * modified in place. */
static bool exclusive(const ct_tensor *t) {
    return atomic_load(&t->refcount) == 1 && atomic_load(&t->storage->refcount) == 1 && !t->meta &&
           ct_is_contiguous(t);
}

/* Adds g into *buf; both engine-owned references. Runs inside a scope. */
static int accumulate_into(ct_tensor **buf, ct_tensor *g, bool create_graph) {
    if (!*buf) {
        *buf = ct_tensor_retain(g);
        return 0;
    }
    if (!create_graph && exclusive(*buf) && ct__same_shape(g, *buf))
        return ct_add_(*buf, g) ? 0 : ct_errcode();
    ct_tensor *sum = ct_add(*buf, g);
    if (!sum)
        return ct_errcode();
    ct_tensor_free(*buf);
    *buf = ct_tensor_retain(sum);
    return 0;
}

ct_tensor *ct__autograd_sum_to(ct_tensor *grad, const ct__shape *s) {
    int gd = grad->ndim, lead = gd - s->ndim;
    int dims[CT_MAX_DIMS], nd = 0;
    if (lead < 0)
        return NULL;
    for (int i = 0; i < gd; i++) {
        int64_t want = i < lead ? 1 : s->sizes[i - lead];
        if (i < lead || (want == 1 && grad->sizes[i] != 1))
            dims[nd++] = i;
        else if (want != grad->sizes[i])
            return NULL;
    }
    ct_tensor *r = nd ? ct_reshape(ct_sum(grad, dims, nd, true), s->ndim, s->sizes) : grad;
    return r ? ct_to_dtype(r, s->dtype) : NULL;
}

static bool has_nan(ct_tensor *g) {
    ct_tensor *n = ct_sum(ct_ne(g, g), NULL, 0, false);
    return n && ct_item_int64(n) > 0;
}

ct_tensor *ct__autograd_validate_grad(ct_node *n, int i, ct_tensor *g) {
    const ct__shape *s = &n->in_meta[i];
    char desc[256], gs[CT__SHAPE_STR], ws[CT__SHAPE_STR];
    if (!ct__autograd_shape_equal(s, g) || g->dtype != s->dtype) {
        ct_tensor *r = ct__autograd_sum_to(g, s);
        if (!r) {
            ct__err_set(CT_ESHAPE,
                        "backward: %s returned a gradient of shape %s for its input %d, which "
                        "has shape %s",
                        ct__node_desc(desc, sizeof desc, n),
                        ct__tensor_shape_str(gs, g->ndim, g->sizes), i,
                        ct__autograd_shape_rec_str(ws, s));
            return NULL;
        }
        g = r;
    }
    ct_device gd = g->storage->device;
    if (!ct__device_equal(gd, s->device)) {
        char on[CT_DEVICE_STR], wants[CT_DEVICE_STR];
        ct__err_set(CT_EDEVICE,
                    "backward: %s returned a gradient on %s for its input %d, which is on %s",
                    ct__node_desc(desc, sizeof desc, n), ct_device_str(gd, on), i,
                    ct_device_str(s->device, wants));
        return NULL;
    }
    if (ct_anomaly_enabled() && has_nan(g)) {
        char trace[512];
        ct__node_trace(trace, sizeof trace, n);
        ct__err_set(CT_ESTATE,
                    "backward (anomaly mode): %s returned NaN values in the gradient of its "
                    "input %d (shape %s)%s%s",
                    ct__node_desc(desc, sizeof desc, n), i, ct__autograd_shape_rec_str(ws, s),
                    *trace ? "; its op was recorded at " : "", trace);
        return NULL;
    }
    return g;
}

/* Runs the gradient hooks in list watching output output_nr on *g. */
static int run_grad_hooks(ct_node *n, const ct__hook *h, int output_nr, ct_tensor **g,
                          const ct__shape *shape) {
    char desc[256], gs[CT__SHAPE_STR], ws[CT__SHAPE_STR];
    for (; h; h = h->next) {
        if (h->kind != CT__HOOK_GRAD || h->output_nr != output_nr || !*g)
            continue;
        ct_tensor *r = h->fn.grad(*g, h->ctx);
        if (!r)
            return ct_errcode() ? ct_errcode()
                                : ct__err_set(CT_EINVAL,
                                              "backward: a hook on output %d of %s "
                                              "returned NULL without an error",
                                              output_nr, ct__node_desc(desc, sizeof desc, n));
        if (!ct__autograd_shape_equal(shape, r))
            return ct__err_set(CT_ESHAPE,
                               "backward: a hook on output %d of %s returned a gradient of shape "
                               "%s, but the tensor has shape %s; a hook must keep the shape",
                               output_nr, ct__node_desc(desc, sizeof desc, n),
                               ct__tensor_shape_str(gs, r->ndim, r->sizes),
                               ct__autograd_shape_rec_str(ws, shape));
        *g = r;
    }
    return 0;
}

/* AccumulateGrad: the leaf's hooks, then .grad += g, then post hooks. */
static int accumulate_leaf(ct_node *n, ct_tensor *in, const ct__run *run) {
    ct_tensor *leaf = n->leaf, *g = in;
    ct__meta *m = ct__meta_of(leaf);
    bool create_graph = run->create_graph;
    int rc = run_grad_hooks(n, m->hooks, 0, &g, &n->out_meta[0]);
    if (rc || run->sink)
        return rc ? rc : run->sink(run->sink_ctx, leaf, g);
    pthread_mutex_lock(&m->lock);
    if (!m->grad) {
        /* Steal the incoming gradient when nothing else can see it, as
         * PyTorch does; otherwise keep a copy. */
        bool own = !create_graph && g == in && exclusive(g);
        ct_tensor *v = own ? g : ct_clone(g);
        m->grad = v ? ct_tensor_retain(v) : NULL;
        rc = v ? 0 : ct_errcode();
    } else if (create_graph) {
        ct_tensor *sum = ct_add(m->grad, g);
        if (sum) {
            ct_tensor_free(m->grad);
            m->grad = ct_tensor_retain(sum);
        }
        rc = sum ? 0 : ct_errcode();
    } else {
        rc = ct_add_(m->grad, g) ? 0 : ct_errcode();
    }
    pthread_mutex_unlock(&m->lock);
    for (const ct__hook *h = m->hooks; h && !rc; h = h->next)
        if (h->kind == CT__HOOK_POST_ACCUMULATE)
            rc = h->fn.post(leaf, h->ctx);
    return rc;
}

int ct__node_apply(ct_node *n, ct_tensor **in, ct_tensor **out, const bool *needs) {
    ct_tensor *saved[n->nsaved > 0 ? n->nsaved : 1];
    int rc = 0;
    for (int i = 0; i < n->nsaved && !rc; i++)
        saved[i] = ct__autograd_saved_unpack(n, i, &rc);
    if (rc)
        return rc;
    ct_backward_args a = {
        .ctx = n->ctx,
        .saved = saved,
        .nsaved = n->nsaved,
        .grad_outputs = in,
        .noutputs = n->nout,
        .grad_inputs = out,
        .needs_input_grad = needs,
        .ninputs = n->nnext,
    };
    /* Derivatives are written as chains of ops whose failures leave a
     * message; a clean slate makes any failure visible. */
    ct_errclear();
    rc = n->def ? n->def->backward(&a) : n->fn->backward(n, &a);
    if (!rc)
        rc = ct_errcode();
    if (rc && ct_errcode() == CT_OK) {
        char desc[256];
        ct__err_set(rc, "backward: %s failed without a message",
                    ct__node_desc(desc, sizeof desc, n));
    }
    return rc;
}

/* Runs one ready node inside its own scope, passing its gradients on. */
static int execute(task *t, int si) {
    slot *s = &t->slots[si];
    ct_node *n = s->node;
    ct_tensor **in = &t->bufs[s->buf];
    const ct__run *run = t->run;
    int rc = 0;
    ct_scope_begin();
    for (int o = 0; o < n->nout && n->hooks && !rc; o++) {
        ct_tensor *g = in[o];
        rc = run_grad_hooks(n, n->hooks, o, &g, &n->out_meta[o]);
        if (g != in[o]) {
            ct_tensor_free(in[o]);
            in[o] = ct_tensor_retain(g);
        }
    }
    for (int c = s->capture; c >= 0 && !rc; c = t->capture_next[c])
        run->captured[c] = ct_tensor_retain(in[run->captures[c].input_nr]);

    bool any = false;
    for (int o = 0; o < n->nout; o++)
        any = any || in[o];
    if (!rc && s->exec && any) {
        if (n->kind == CT__NODE_ACCUMULATE) {
            rc = accumulate_leaf(n, in[0], run);
        } else {
            ct_tensor *out[n->nnext > 0 ? n->nnext : 1];
            bool needs[n->nnext > 0 ? n->nnext : 1];
            memset(out, 0, sizeof out);
            for (int i = 0; i < n->nnext; i++)
                needs[i] = n->next[i].node != NULL;
            rc = ct__node_apply(n, in, out, needs);
            for (int i = 0; i < n->nnext && !rc; i++) {
                const ct__edge *e = &n->next[i];
                if (!e->node || !out[i])
                    continue;
                ct_tensor *g = ct__autograd_validate_grad(n, i, out[i]);
                if (!g) {
                    rc = ct_errcode();
                    break;
                }
                slot *cs = &t->slots[t->edges[s->edge0 + i]];
                if (cs->needed)
                    rc = accumulate_into(&t->bufs[cs->buf + e->input_nr], g, run->create_graph);
            }
        }
    }
    ct_scope_end();
    for (int o = 0; o < n->nout; o++) {
        ct_tensor_free(in[o]);
        in[o] = NULL;
    }
    if (rc)
        return rc;
    if (!run->retain_graph && s->exec)
        ct__node_release_saved(n);
    for (int i = 0; i < n->nnext && s->exec; i++) {
        if (!n->next[i].node)
            continue;
        int ci = t->edges[s->edge0 + i];
        if (t->slots[ci].needed && --t->slots[ci].deps == 0)
            heap_push(t, ci);
    }
    return 0;
}

static int prepare(task *t) {
    const ct__run *run = t->run;
    int rc = grow_table(t);
    if (!rc && run->ncaptures > 0) {
        t->capture_next = malloc((size_t)run->ncaptures * sizeof(int));
        if (!t->capture_next)
            rc = ct__err_set(CT_ENOMEM, "grad: out of memory");
    }
    for (int c = run->ncaptures - 1; c >= 0 && !rc; c--) {
        int si = slot_of(t, run->captures[c].node);
        if (si < 0)
            return si;
        t->capture_next[c] = t->slots[si].capture;
        t->slots[si].capture = c;
    }
    if (!rc)
        rc = discover(t);
    if (rc)
        return rc;
    int nbufs = 0;
    for (int i = 0; i < t->nslots; i++) {
        slot *s = &t->slots[i];
        s->buf = nbufs;
        nbufs += s->nout;
        if (!s->exec)
            continue;
        for (int e = 0; e < s->nnext; e++) {
            int ci = t->edges[s->edge0 + e];
            if (ci >= 0)
                t->slots[ci].deps += t->slots[ci].needed;
        }
    }
    t->bufs = calloc((size_t)nbufs + 1, sizeof *t->bufs);
    t->heap = malloc(((size_t)t->nslots + 1) * sizeof *t->heap);
    if (!t->bufs || !t->heap)
        return ct__err_set(CT_ENOMEM, "backward: out of memory for %d gradient buffers", nbufs);
    return 0;
}

static int run_task(task *t) {
    const ct__run *run = t->run;
    bool prev_mode = ct_set_grad_enabled(run->create_graph);
    t->parent = current;
    current = t;
    ct_scope_begin();
    int rc = prepare(t);
    for (int r = 0; r < run->nroots && !rc; r++) {
        slot *s = &t->slots[lookup(t, run->roots[r].node)];
        if (s->needed)
            rc = accumulate_into(&t->bufs[s->buf + run->roots[r].input_nr], run->root_grads[r],
                                 run->create_graph);
    }
    for (int r = 0; r < run->nroots && !rc; r++) {
        int si = lookup(t, run->roots[r].node);
        slot *s = &t->slots[si];
        if (s->needed && s->deps == 0) {
            s->deps = -1; /* queued once even if several roots share it */
            heap_push(t, si);
        }
    }
    while (t->nheap > 0 && !rc)
        rc = execute(t, heap_pop(t));
    for (int i = 0; i < t->ncallbacks && !rc; i++)
        rc = t->callbacks[i].fn(t->callbacks[i].ctx);
    ct_scope_end();
    current = t->parent;
    ct_set_grad_enabled(prev_mode);
    return rc;
}

static void task_free(task *t) {
    int nbufs = 0;
    for (int i = 0; i < t->nslots; i++)
        nbufs += t->slots[i].nout;
    for (int i = 0; t->bufs && i < nbufs; i++)
        ct_tensor_free(t->bufs[i]);
    for (int i = 0; i < t->nslots; i++)
        ct__node_release(t->slots[i].node);
    free(t->slots);
    free(t->table);
    free(t->bufs);
    free(t->heap);
    free(t->capture_next);
    free(t->edges);
    free(t->callbacks);
}

/* Backwards that run on a thread other than the caller's, which waits:
 *
 * - A backward nested too deep continues on an overflow worker with a fresh
 *   stack. Overflow workers are kept for the next overflow: each serves one
 *   job at a time, and nesting that overflows again takes another, so the
 *   pool grows to the deepest chain seen.
 * - A backward whose gradients are on a device (not the host) runs on that
 *   device's worker, one per device, made on first use and kept for the
 *   process, with the device current (the table's use, device_impl.h). Its nodes' kernels then
 * queue from one thread in one order, as PyTorch's device threads do, and backwards on different
 *   devices (from different callers) run at once. Callers of one device
 *   take turns; a backward started from the device's own worker (a
 *   checkpoint's, a hook's) runs there inline. */
typedef struct worker {
    struct worker *next; /* idle list (overflow workers) */
    pthread_cond_t wake, done;
    const ct__run *run; /* the job; NULL while idle */
    void *parent;       /* the caller's running backward (a task) */
    int device;         /* a device worker's slot (slot_device); -1 for overflow */
    int caller_device;  /* overflow: the device worker its caller is, or -1 */
    bool busy;          /* a caller holds it (device workers are shared) */
    bool finished;
    int rc;
    char msg[1024];
} worker;

/* Device workers' slots: MAX_DEVICE_WORKERS per device type, by index. */
#define MAX_DEVICE_WORKERS 64
#define DEVICE_TYPES       3 /* CT_CPU's slots stay empty: the host has no worker */
_Static_assert(CT_CUDA < DEVICE_TYPES && CT_TEST < DEVICE_TYPES, "a slot for every device type");

static struct {
    pthread_mutex_t lock;
    worker *idle;
    worker *device[DEVICE_TYPES * MAX_DEVICE_WORKERS];
} workers = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The slot of the device worker this thread is, or -1. */
static _Thread_local int worker_device = -1;

static ct_device slot_device(int at) {
    return (ct_device){(ct_device_type)(at / MAX_DEVICE_WORKERS), at % MAX_DEVICE_WORKERS};
}

/* Makes the device of slot at the calling thread's: 0, or its error. */
static int select_slot(int at) {
    ct_device d = slot_device(at);
    const ct__device_ops *ops = ct__device_ops_of(d.type);
    return ops && ops->use ? ops->use(d.index) : 0;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    if (w->device >= 0 && select_slot(w->device) == 0)
        worker_device = w->device;
    pthread_mutex_lock(&workers.lock);
    for (;;) {
        while (!w->run)
            pthread_cond_wait(&w->wake, &workers.lock);
        const ct__run *run = w->run;
        current = w->parent;
        pthread_mutex_unlock(&workers.lock);
        /* Overflow from a device worker continues as that device's: going
         * back to it would wait for itself. */
        if (w->device < 0)
            worker_device =
                w->caller_device >= 0 && select_slot(w->caller_device) == 0 ? w->caller_device : -1;
        char dev[CT_DEVICE_STR];
        int rc = w->device >= 0 && worker_device < 0
                     ? ct__err_set(CT_EDEVICE, "backward: cannot make %s current: %s",
                                   ct_device_str(slot_device(w->device), dev),
                                   "its backward thread failed to select it")
                     : ct__engine_run(run);
        pthread_mutex_lock(&workers.lock);
        current = NULL;
        w->rc = rc;
        if (rc)
            snprintf(w->msg, sizeof w->msg, "%s", ct_errmsg());
        w->run = NULL;
        w->finished = true;
        pthread_cond_broadcast(&w->done);
    }
    return NULL;
}

/* A new worker for device (-1: overflow), started. Called with the lock
 * held. */
static worker *start_worker(int device) {
    worker *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->device = device;
    pthread_cond_init(&w->wake, NULL);
    pthread_cond_init(&w->done, NULL);
    pthread_attr_t attr;
    pthread_t th;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, WORKER_STACK_BYTES);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&th, &attr, worker_main, w);
    pthread_attr_destroy(&attr);
    if (err) {
        pthread_cond_destroy(&w->wake);
        pthread_cond_destroy(&w->done);
        free(w);
        return NULL;
    }
    return w;
}

/* The worker to run on: an idle overflow worker, or device's own. Called
 * with the lock held; NULL when no thread could be started. */
static worker *take_worker(int device) {
    if (device >= 0) {
        if (!workers.device[device])
            workers.device[device] = start_worker(device);
        return workers.device[device];
    }
    worker *w = workers.idle;
    if (w)
        workers.idle = w->next;
    return w ? w : start_worker(-1);
}

static int run_on_worker(const ct__run *run, int device) {
    pthread_mutex_lock(&workers.lock);
    worker *w = take_worker(device);
    if (!w) {
        pthread_mutex_unlock(&workers.lock);
        char dev[CT_DEVICE_STR];
        return device >= 0
                   ? ct__err_set(CT_ENOMEM, "backward: could not start the backward thread of %s",
                                 ct_device_str(slot_device(device), dev))
                   : ct__err_set(CT_ENOMEM,
                                 "backward: nested %d deep, could not start a thread to "
                                 "continue",
                                 depth);
    }
    while (w->busy)
        pthread_cond_wait(&w->done, &workers.lock);
    w->busy = true;
    w->run = run;
    w->parent = current;
    w->caller_device = worker_device;
    w->finished = false;
    pthread_cond_signal(&w->wake);
    while (!w->finished)
        pthread_cond_wait(&w->done, &workers.lock);
    int rc = w->rc;
    if (rc)
        ct__err_set(rc, "%s", w->msg);
    w->busy = false;
    pthread_cond_broadcast(&w->done);
    if (device < 0) {
        w->next = workers.idle;
        workers.idle = w;
    }
    pthread_mutex_unlock(&workers.lock);
    return rc;
}

/* A forked child has none of the parent's workers. */
static void workers_atfork_prepare(void) { pthread_mutex_lock(&workers.lock); }
static void workers_atfork_parent(void) { pthread_mutex_unlock(&workers.lock); }
static void workers_atfork_child(void) {
    pthread_mutex_init(&workers.lock, NULL);
    workers.idle = NULL;
    memset(workers.device, 0, sizeof workers.device);
    worker_device = -1;
}

__attribute__((constructor)) static void workers_register_atfork(void) {
    pthread_atfork(workers_atfork_prepare, workers_atfork_parent, workers_atfork_child);
}

/* The worker slot of the device of a backward's gradients (its first
 * root's on a device), or -1 for the host. */
static int run_device(const ct__run *run) {
    for (int r = 0; r < run->nroots; r++) {
        ct_device d = run->root_grads[r] ? ct_tensor_device(run->root_grads[r]) : CT_DEVICE_CPU;
        if (!ct__is_host(d))
            return (unsigned)d.type < DEVICE_TYPES && (unsigned)d.index < MAX_DEVICE_WORKERS
                       ? (int)d.type * MAX_DEVICE_WORKERS + d.index
                       : -1;
    }
    return -1;
}

int ct__engine_run(const ct__run *run) {
    int device = run_device(run);
    if (device >= 0 && device != worker_device)
        return run_on_worker(run, device);
    if (depth >= MAX_REENTRANT_DEPTH)
        return run_on_worker(run, -1);
    task t = {.run = run, .accumulate = run->ncaptures == 0};
    depth++;
    int rc = run_task(&t);
    depth--;
    task_free(&t);
    return rc;
}

static int queue_on(task *t, ct_backward_callback_fn fn, void *ctx, const char *op) {
    if (!fn)
        return ct__err_set(CT_EINVAL, "%s: NULL callback", op);
    if (!t)
        return ct__err_set(CT_ESTATE,
                           "%s: no backward is running on this thread; queue callbacks from a "
                           "hook or a backward function",
                           op);
    if (CT__GROW(t->callbacks, &t->callbacks_cap, t->ncallbacks + 1, 0, "backward: callbacks"))
        return CT_ENOMEM;
    t->callbacks[t->ncallbacks++] = (callback){fn, ctx};
    return 0;
}

int ct_autograd_queue_callback(ct_backward_callback_fn fn, void *ctx) {
    return queue_on(current, fn, ctx, "queue_callback");
}

int ct_autograd_queue_final_callback(ct_backward_callback_fn fn, void *ctx) {
    task *t = current;
    while (t && t->parent)
        t = t->parent;
    return queue_on(t, fn, ctx, "queue_final_callback");
}

/* ------------------------------------------------------------ front end */

/* The root edges and gradients of outputs; root_grads are new references. */
static int make_roots(const char *op, ct_tensor *const *outputs, int n,
                      ct_tensor *const *grad_outputs, ct__edge *roots, ct_tensor **grads) {
    char a[CT__DESC_STR], b[CT__DESC_STR];
    for (int i = 0; i < n; i++) {
        ct_tensor *o = outputs[i];
        int rc = CT__CHECK_ANY(op, o);
        if (rc)
            return rc;
        if (!ct__needs_grad(o))
            return ct__err_set(CT_EINVAL,
                               "%s: output %d (%s) does not require grad and has no grad_fn; "
                               "nothing to differentiate",
                               op, i, ct__tensor_desc(a, o));
        ct_tensor *g = grad_outputs ? grad_outputs[i] : NULL;
        if (g) {
            if ((rc = CT__CHECK_ANY(op, g)) ||
                (rc = ct__tensor_check_same_device(op, (ct_tensor *const[]){o, g}, 2)))
                return rc;
            if (!ct__same_shape(g, o))
                return ct__err_set(CT_ESHAPE, "%s: grad_outputs[%d] is %s but output %d is %s", op,
                                   i, ct__tensor_desc(a, g), i, ct__tensor_desc(b, o));
            g = ct_to_dtype(g, o->dtype);
        } else {
            if (ct_numel(o) != 1)
                return ct__err_set(CT_EINVAL,
                                   "%s: a gradient can be created implicitly only for outputs "
                                   "with one element; output %d is %s: pass grad_outputs",
                                   op, i, ct__tensor_desc(a, o));
            g = ct_full_like(o, 1);
        }
        if (!g || (rc = ct__autograd_gradient_edge(o, &roots[i])))
            return g ? rc : ct_errcode();
        grads[i] = ct_tensor_retain(g);
    }
    return 0;
}

static void free_roots(ct__edge *roots, ct_tensor **grads, int n) {
    for (int i = 0; i < n; i++) {
        ct__node_release(roots[i].node);
        ct_tensor_free(grads[i]);
    }
}

static int check_count(const char *op, const char *what, int n) {
    return n > 0 ? 0
                 : ct__err_set(CT_EINVAL, "%s: %d %s given; expected at least one", op, n, what);
}

static int backward(ct_tensor *const *outputs, int n, ct_tensor *const *grad_outputs,
                    bool retain_graph, int (*sink)(void *, ct_tensor *, ct_tensor *),
                    void *sink_ctx) {
    int rc = check_count("backward", "outputs", n);
    if (rc || (rc = outputs ? 0 : ct__err_set(CT_EINVAL, "backward: NULL outputs")))
        return rc;
    ct__edge roots[n];
    ct_tensor *grads[n];
    memset(roots, 0, sizeof roots);
    memset(grads, 0, sizeof grads);
    ct_scope_begin();
    rc = make_roots("backward", outputs, n, grad_outputs, roots, grads);
    ct_scope_end();
    if (!rc) {
        ct__run run = {.roots = roots,
                       .root_grads = grads,
                       .nroots = n,
                       .retain_graph = retain_graph,
                       .sink = sink,
                       .sink_ctx = sink_ctx};
        rc = ct__engine_run(&run);
    }
    free_roots(roots, grads, n);
    return rc;
}

int ct_backward(ct_tensor *const *outputs, int n, ct_tensor *const *grad_outputs,
                bool retain_graph) {
    return backward(outputs, n, grad_outputs, retain_graph, NULL, NULL);
}

int ct__autograd_backward_sink(ct_tensor *const *outputs, int n,
                               int (*sink)(void *, ct_tensor *, ct_tensor *), void *sink_ctx) {
    return backward(outputs, n, NULL, true, sink, sink_ctx);
}

int ct_tensor_backward(ct_tensor *loss) { return ct_backward(&loss, 1, NULL, false); }

int ct_grad(ct_tensor *const *outputs, int noutputs, ct_tensor *const *grad_outputs,
            ct_tensor *const *inputs, int ninputs, ct_tensor **grads, const ct_grad_options *opts) {
    static const ct_grad_options defaults;
    opts = opts ? opts : &defaults;
    int rc = check_count("grad", "outputs", noutputs);
    if (!rc)
        rc = check_count("grad", "inputs", ninputs);
    if (!rc && (!outputs || !inputs || !grads))
        rc = ct__err_set(CT_EINVAL, "grad: NULL outputs, inputs or grads array");
    if (rc)
        return rc;
    char desc[CT__DESC_STR];
    for (int i = 0; i < ninputs; i++) {
        grads[i] = NULL;
        if ((rc = CT__CHECK_ANY("grad", inputs[i])))
            return rc;
        if (!ct__needs_grad(inputs[i]))
            return ct__err_set(CT_EINVAL, "grad: input %d (%s) does not require grad", i,
                               ct__tensor_desc(desc, inputs[i]));
    }
    ct__edge roots[noutputs], caps[ninputs];
    ct_tensor *root_grads[noutputs];
    memset(roots, 0, sizeof roots);
    memset(caps, 0, sizeof caps);
    memset(root_grads, 0, sizeof root_grads);
    ct_scope_begin();
    rc = make_roots("grad", outputs, noutputs, grad_outputs, roots, root_grads);
    ct_scope_end();
    for (int i = 0; i < ninputs && !rc; i++)
        rc = ct__autograd_gradient_edge(inputs[i], &caps[i]);
    if (!rc) {
        ct__run run = {.roots = roots,
                       .root_grads = root_grads,
                       .nroots = noutputs,
                       .captures = caps,
                       .captured = grads,
                       .ncaptures = ninputs,
                       .retain_graph = opts->retain_graph || opts->create_graph,
                       .create_graph = opts->create_graph};
        rc = ct__engine_run(&run);
    }
    for (int i = 0; i < ninputs && !rc; i++)
        if (!grads[i] && !opts->allow_unused)
            rc = ct__err_set(CT_EINVAL,
                             "grad: input %d (%s) was not used to compute the outputs, so it has "
                             "no gradient; set allow_unused to get NULL for it",
                             i, ct__tensor_desc(desc, inputs[i]));
    for (int i = 0; i < ninputs; i++) {
        if (rc) {
            ct_tensor_free(grads[i]);
            grads[i] = NULL;
        } else {
            ct__tensor_scope_own(grads[i]);
        }
        ct__node_release(caps[i].node);
    }
    free_roots(roots, root_grads, noutputs);
    return rc;
}
