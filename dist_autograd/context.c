/* Distributed autograd: contexts, the send and recv nodes that link the
 * graphs of two workers, and backward across them (FAST mode; see
 * docs/rpc.md). */
#include "rpc_impl.h"

#include <ct/cuda.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* Where gradients come back in: the tensors that needed grad in one message
 * this worker sent, as the edges their gradients flow into. */
typedef struct send_node {
    uint64_t msg;
    int peer, n;
    ct__edge *edges; /* strong */
    ct__shape *shapes;
    struct send_node *next;
} send_node;

typedef struct dctx {
    uint64_t id;
    int refs;           /* the table's while live, and each user's; under T.mu */
    pthread_mutex_t mu; /* everything below */
    /* One engine pass at a time over the context's graph: gradients from
     * several workers may reach the same nodes. */
    pthread_mutex_t run;
    bool released;
    int rc;
    char why[400];
    _Atomic(bool) *touched; /* [workers]: read without mu */
    int nworkers;
    send_node *sends;
    ct_tensor **leaves, **grads; /* strong, [ngrads] */
    int ngrads, cap;
    double last_used;
    struct dctx *next;
} dctx;

/* A context id is its first worker's id above a 48-bit counter; messages
 * show it as "worker:counter". */
#define LOW48 ((uint64_t)0xffffffffffff)

/* Contexts released recently, so that a late message or call about one
 * gets the reason, not "unknown". */
#define RING     256
#define RING_WHY 400

static struct {
    pthread_mutex_t mu;
    dctx *live;
    struct {
        uint64_t id;
        int rc;
        char why[RING_WHY];
    } ring[RING];
    int ring_at;
    atomic_uint_fast64_t counter;
    double last_tick;
} T = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local uint64_t current;

/* A distributed backward on this worker: the local engine pass, then the
 * gradients it sent on, until all have answered. */
typedef struct pass {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int outstanding;
    int rc;
    char *message;
    dctx *c;
    rpc_reply *reply; /* NULL: the initiator, which waits */
} pass;

static _Thread_local pass *cur_pass;

static void ctx_free(dctx *c) {
    free(c->touched);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->run);
    free(c);
}

static void ctx_unref(dctx *c) {
    pthread_mutex_lock(&T.mu);
    bool last = --c->refs == 0;
    pthread_mutex_unlock(&T.mu);
    if (last)
        ctx_free(c);
}

static const char *why_released(uint64_t id, int *rc) {
    for (int i = 0; i < RING; i++)
        if (T.ring[i].id == id) {
            *rc = T.ring[i].rc;
            return T.ring[i].why;
        }
    return NULL;
}

/* The live context id (a new reference), made if create and unknown;
 * NULL otherwise, with the reason it was released in why ("" if it was not
 * released, or long ago). Sets no error. */
static dctx *ctx_lookup(uint64_t id, bool create, int *rc, char why[RING_WHY]) {
    pthread_mutex_lock(&T.mu);
    dctx *c = T.live;
    while (c && c->id != id)
        c = c->next;
    *rc = 0;
    const char *reason = c ? NULL : why_released(id, rc);
    snprintf(why, RING_WHY, "%s", reason ? reason : "");
    if (!c && !reason && create && (c = calloc(1, sizeof *c))) {
        c->id = id;
        c->refs = 1;
        c->nworkers = ct_rpc_num_workers();
        c->touched = calloc((size_t)(c->nworkers > 0 ? c->nworkers : 1), sizeof *c->touched);
        pthread_mutex_init(&c->mu, NULL);
        pthread_mutex_init(&c->run, NULL);
        c->next = T.live;
        T.live = c;
    }
    if (c) {
        c->refs++;
        c->last_used = ct__now();
    }
    pthread_mutex_unlock(&T.mu);
    return c;
}

/* ctx_lookup, with an error naming why there is no context. */
static dctx *ctx_get(uint64_t id, bool create) {
    int rc;
    char why[RING_WHY];
    dctx *c = ctx_lookup(id, create, &rc, why);
    int worker = (int)(id >> 48);
    if (!c && *why)
        ct__err_set(rc ? rc : CT_EINVAL, "context %d:%" PRIu64 " was released: %s", worker,
                    id & LOW48, why);
    else if (!c && create)
        ct__err_set(CT_ENOMEM, "dist autograd: out of memory");
    else if (!c)
        ct__err_set(CT_EINVAL, "context %d:%" PRIu64 " is not known on worker '%s'", worker,
                    id & LOW48, ct_rpc_worker_name(ct_rpc_self()));
    return c;
}

static void send_node_free(send_node *s) {
    for (int i = 0; i < s->n; i++)
        ct__node_release(s->edges[i].node);
    free(s->edges);
    free(s->shapes);
    free(s);
}

static void release(dctx *c, int rc, int except, bool forward, const char *fmt, ...)
    CT_PRINTF(5, 6);

/* Ends c on this worker: its graph pieces and gradients go, and, with
 * forward, every worker it touched but `except` is told. */
static void release(dctx *c, int rc, int except, bool forward, const char *fmt, ...) {
    char why[sizeof c->why];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&T.mu);
    pthread_mutex_lock(&c->mu);
    bool was = c->released;
    if (!was) {
        c->released = true;
        c->rc = rc;
        memcpy(c->why, why, sizeof why);
    }
    pthread_mutex_unlock(&c->mu);
    for (dctx **p = &T.live; *p && !was; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            c->refs--; /* the table's */
            break;
        }
    if (!was) {
        T.ring[T.ring_at].id = c->id;
        T.ring[T.ring_at].rc = rc;
        snprintf(T.ring[T.ring_at].why, sizeof T.ring[T.ring_at].why, "%.399s", why);
        T.ring_at = (T.ring_at + 1) % RING;
    }
    pthread_mutex_unlock(&T.mu);
    if (was)
        return;
    pthread_mutex_lock(&c->mu);
    send_node *sends = c->sends;
    ct_tensor **leaves = c->leaves, **grads = c->grads;
    int ngrads = c->ngrads;
    c->sends = NULL;
    c->leaves = c->grads = NULL;
    c->ngrads = c->cap = 0;
    pthread_mutex_unlock(&c->mu);
    while (sends) {
        send_node *next = sends->next;
        send_node_free(sends);
        sends = next;
    }
    for (int i = 0; i < ngrads; i++) {
        ct_tensor_free(leaves[i]);
        ct_tensor_free(grads[i]);
    }
    free(leaves);
    free(grads);
    ct_rpc_args *a = forward ? ct_rpc_args_new() : NULL;
    if (a && !ct_rpc_args_add_int(a, rc) && !ct_rpc_args_add_string(a, why))
        for (int w = 0; w < c->nworkers; w++)
            if (c->touched[w] && w != except && w != ct_rpc_self() && !ct__rpc_peer_dead(w))
                ct_future_free(ct__rpc_call(w, "ct.release", "releasing a context", a, 0, c->id));
    ct_rpc_args_free(a);
}

/* ------------------------------------------------------------ recording */

/* Records the tensors of args that need grad as message id to worker to. */
static int record(dctx *c, int to, uint64_t id, const ct_rpc_args *args) {
    int n = 0;
    for (int i = 0; i < args->n; i++)
        n += args->v[i].type == CT_RPC_TENSOR && ct_requires_grad(args->v[i].t);
    if (to >= 0 && to < c->nworkers)
        c->touched[to] = true;
    if (!n || !ct_grad_enabled())
        return 0;
    send_node *s = calloc(1, sizeof *s);
    if (!s || !(s->edges = calloc((size_t)n, sizeof *s->edges)) ||
        !(s->shapes = calloc((size_t)n, sizeof *s->shapes))) {
        if (s)
            send_node_free(s);
        return ct__err_set(CT_ENOMEM, "dist autograd: out of memory");
    }
    s->msg = id;
    s->peer = to;
    int rc = 0;
    for (int i = 0; i < args->n && !rc; i++) {
        ct_tensor *t = args->v[i].t;
        if (args->v[i].type != CT_RPC_TENSOR || !ct_requires_grad(t))
            continue;
        ct__autograd_shape_of(&s->shapes[s->n], t);
        rc = ct__autograd_gradient_edge(t, &s->edges[s->n]);
        s->n += !rc;
    }
    if (rc) {
        send_node_free(s);
        return rc;
    }
    pthread_mutex_lock(&c->mu);
    if (c->released) {
        rc = ct__err_set(c->rc ? c->rc : CT_ESTATE, "the context was released: %s", c->why);
    } else {
        s->next = c->sends;
        c->sends = s;
    }
    pthread_mutex_unlock(&c->mu);
    if (rc)
        send_node_free(s);
    return rc;
}

int ct__dautograd_on_send(int to, uint64_t id, const ct_rpc_args *args, uint64_t *context) {
    *context = current;
    if (!current)
        return 0;
    dctx *c = ctx_get(current, false);
    int rc = c ? record(c, to, id, args) : ct_errcode();
    if (c)
        ctx_unref(c);
    return rc;
}

int ct__dautograd_record_send(uint64_t context, int to, uint64_t id, const ct_rpc_args *args) {
    dctx *c = ctx_get(context, false);
    if (!c)
        return ct_errcode();
    int rc = record(c, to, id, args);
    ctx_unref(c);
    return rc;
}

uint64_t ct__dautograd_enter(uint64_t context) {
    uint64_t saved = current;
    current = context;
    return saved;
}

void ct__dautograd_leave(uint64_t saved) { current = saved; }

/* The recv node: gradients reaching tensors that arrived in a message go
 * back to their sender, where its send node takes them on. */
typedef struct recv_info {
    uint64_t context, msg;
    int peer, n;
    ct__shape shapes[];
} recv_info;

static void pass_add(pass *p, ct_future *f);

static int recv_backward(const ct_backward_args *a) {
    const recv_info *r = a->ctx;
    pass *p = cur_pass;
    if (!p)
        return ct_autograd_fail(CT_ESTATE,
                                "RecvRpcBackward: this graph spans workers (context %d:%" PRIu64
                                "); run it with ct_dist_backward(), not ct_backward()",
                                (int)(r->context >> 48), r->context & LOW48);
    if (p->c->id != r->context)
        return ct_autograd_fail(CT_EINVAL,
                                "RecvRpcBackward: a backward in context %d:%" PRIu64
                                " reached a tensor received in context %d:%" PRIu64,
                                (int)(p->c->id >> 48), p->c->id & LOW48, (int)(r->context >> 48),
                                r->context & LOW48);
    ct_rpc_args *args = ct_rpc_args_new();
    int rc = args ? ct_rpc_args_add_int(args, (int64_t)r->msg) : ct_errcode();
    for (int i = 0; i < r->n && !rc; i++) {
        ct_tensor *g = a->grad_outputs[i];
        if (!g)
            g = ct_zeros(r->shapes[i].ndim, r->shapes[i].sizes, r->shapes[i].dtype);
        rc = g ? ct_rpc_args_add_tensor(args, g) : ct_errcode();
    }
    ct_future *f =
        rc ? NULL
           : ct__rpc_call(r->peer, "ct.backward", "distributed backward", args, 0, r->context);
    ct_rpc_args_free(args);
    if (!f)
        return ct_errcode();
    pass_add(p, f);
    return 0;
}

static const ct_function_def recv_def = {"RecvRpcBackward", recv_backward, free};

int ct__dautograd_on_receive(uint64_t context, int from, uint64_t id, ct_rpc_args *args) {
    if (from < 0)
        return ct__err_set(CT_EINVAL, "a message in a context from a sender that is no worker");
    dctx *c = ctx_get(context, true);
    if (!c)
        return ct_errcode();
    if (from < c->nworkers)
        c->touched[from] = true;
    ctx_unref(c);
    int n = 0;
    for (int i = 0; i < args->n; i++)
        n += args->v[i].type == CT_RPC_TENSOR && args->v[i].grad;
    if (!n)
        return 0;
    recv_info *r = malloc(sizeof *r + (size_t)n * sizeof r->shapes[0]);
    ct_tensor **outs = malloc((size_t)n * sizeof *outs);
    if (!r || !outs) {
        free(r);
        free(outs);
        return ct__err_set(CT_ENOMEM, "dist autograd: out of memory");
    }
    *r = (recv_info){.context = context, .msg = id, .peer = from, .n = n};
    for (int i = 0, k = 0; i < args->n; i++)
        if (args->v[i].type == CT_RPC_TENSOR && args->v[i].grad) {
            outs[k] = args->v[i].t;
            ct__autograd_shape_of(&r->shapes[k++], args->v[i].t);
        }
    int rc = ct__autograd_function_record_source(&recv_def, r, outs, n);
    free(outs);
    return rc;
}

/* ------------------------------------------------------------- backward */

/* Leaves' gradients land in the context, summed. */
static int sink(void *ctx, ct_tensor *leaf, ct_tensor *g) {
    dctx *c = ctx;
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    int i = 0;
    while (i < c->ngrads && c->leaves[i] != leaf)
        i++;
    if (c->released) {
        rc = ct__err_set(c->rc ? c->rc : CT_ESTATE, "the context was released during backward: %s",
                         c->why);
    } else if (i < c->ngrads) {
        rc = ct_add_(c->grads[i], g) ? 0 : ct_errcode();
    } else {
        /* Both arrays hold c->cap; each grows to the same new capacity. */
        int leaves_cap = c->cap, grads_cap = c->cap;
        rc = CT__GROW(c->leaves, &leaves_cap, c->ngrads + 1, 0, "dist autograd: leaves");
        if (!rc)
            rc = CT__GROW(c->grads, &grads_cap, c->ngrads + 1, 0, "dist autograd: gradients");
        if (!rc)
            c->cap = grads_cap;
    }
    if (!rc && i == c->ngrads && !c->released) {
        ct_tensor *copy = ct__tensor_own(ct_clone(g));
        if (copy) {
            c->leaves[c->ngrads] = ct_tensor_retain(leaf);
            c->grads[c->ngrads++] = copy;
        }
        rc = copy ? 0 : ct_errcode();
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static pass *pass_new(dctx *c, rpc_reply *reply) {
    pass *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->outstanding = 1; /* the local engine pass */
    p->c = c;
    p->reply = reply;
    return p;
}

static void pass_free(pass *p) {
    free(p->message);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* One part of p is done; the last one answers or wakes the initiator. */
static void pass_part_done(pass *p, int rc, const char *message) {
    pthread_mutex_lock(&p->mu);
    if (rc && !p->rc) {
        p->rc = rc;
        p->message = strdup(message ? message : "failed");
    }
    bool last = --p->outstanding == 0;
    /* The initiator frees p as soon as it sees the count reach zero. */
    bool answer = last && p->reply;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (!answer)
        return;
    if (p->rc)
        ct__err_set(p->rc, "%s", p->message ? p->message : "failed");
    ct__rpc_reply(p->reply, p->rc, NULL);
    ctx_unref(p->c);
    pass_free(p);
}

static void pass_future_done(ct_future *f, void *ctx) {
    int rc = ct_future_wait(f, NULL);
    pass_part_done(ctx, rc, rc ? ct_errmsg() : NULL);
    ct_future_free(f);
}

static void pass_add(pass *p, ct_future *f) {
    pthread_mutex_lock(&p->mu);
    p->outstanding++;
    pthread_mutex_unlock(&p->mu);
    if (ct_future_then(f, pass_future_done, p)) {
        pass_part_done(p, ct_errcode(), ct_errmsg());
        ct_future_free(f);
    }
}

/* Runs the local engine for p, from roots (a send node's edges) or from
 * outputs (the initiator's losses). */
static int run_local(pass *p, const ct__edge *roots, ct_tensor *const *grads, int n,
                     ct_tensor *const *outputs) {
    dctx *c = p->c;
    if (cur_pass)
        return ct__err_set(CT_ESTATE, "ct_dist_backward: called inside a distributed backward");
    pthread_mutex_lock(&c->run);
    cur_pass = p;
    int rc;
    if (outputs) {
        rc = ct__autograd_backward_sink(outputs, n, sink, c);
    } else {
        ct__run run = {.roots = roots,
                       .root_grads = grads,
                       .nroots = n,
                       .retain_graph = true,
                       .sink = sink,
                       .sink_ctx = c};
        rc = ct__engine_run(&run);
    }
    cur_pass = NULL;
    pthread_mutex_unlock(&c->run);
    return rc;
}

int ct_dist_backward(int64_t id, ct_tensor *const *roots, int n) {
    const char *fn = "ct_dist_backward";
    if (ct_rpc_self() < 0)
        return ct__err_set(CT_ESTATE, "%s: the RPC agent is not running", fn);
    if (!roots || n < 1)
        return ct__err_set(CT_EINVAL, "%s: no roots given", fn);
    for (int i = 0; i < n; i++) {
        int rc = CT__CHECK_ANY(fn, roots[i]);
        if (rc)
            return rc;
        if (ct_numel(roots[i]) != 1)
            return ct__err_set(CT_EINVAL, "%s: root %d has %lld elements; roots are losses, of one",
                               fn, i, (long long)ct_numel(roots[i]));
    }
    dctx *c = ctx_get((uint64_t)id, false);
    if (!c)
        return ct__err_set(ct_errcode(), "%s: %s", fn, ct_errmsg());
    pass *p = pass_new(c, NULL);
    if (!p) {
        ctx_unref(c);
        return ct__err_set(CT_ENOMEM, "%s: out of memory", fn);
    }
    int rc = run_local(p, NULL, NULL, n, roots);
    pass_part_done(p, rc, rc ? ct_errmsg() : NULL);
    /* Every future has a deadline, so this ends. */
    pthread_mutex_lock(&p->mu);
    while (p->outstanding)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    rc = p->rc;
    if (rc) {
        ct__err_set(rc, "%s: %s", fn, p->message);
        char message[512];
        snprintf(message, sizeof message, "%s", ct_errmsg());
        release(c, rc, -1, true, "its backward failed: %s", message);
        ct__err_set(rc, "%s", message);
    }
    pass_free(p);
    ctx_unref(c);
    return rc;
}

void ct__dautograd_on_backward(const rpc_call *call, ct_rpc_args *in, rpc_reply *reply) {
    dctx *c = ctx_get(call->context, false);
    send_node *s = NULL;
    int rc = c ? 0 : ct_errcode();
    if (!rc && ct_rpc_args_type(in, 0) != CT_RPC_INT)
        rc = ct__err_set(CT_ECORRUPT, "a backward message without its message id");
    if (!rc) {
        int64_t msg = ct_rpc_args_int(in, 0);
        pthread_mutex_lock(&c->mu);
        for (s = c->sends; s && s->msg != (uint64_t)msg;)
            s = s->next;
        int n = s ? s->n : 0;
        ct__edge edges[n > 0 ? n : 1];
        for (int i = 0; i < n; i++) {
            edges[i] = s->edges[i];
            ct__node_retain(edges[i].node);
        }
        pthread_mutex_unlock(&c->mu);
        if (!s)
            rc = ct__err_set(CT_EINVAL, "no message %" PRIu64 " sent in this context",
                             (uint64_t)msg & LOW48);
        else if (ct_rpc_args_count(in) != n + 1)
            rc = ct__err_set(CT_ECORRUPT, "%d gradients for %d tensors sent",
                             ct_rpc_args_count(in) - 1, n);
        ct_tensor *grads[n > 0 ? n : 1];
        /* Gradients arrive on the host; one for a tensor sent from a device
         * goes back there before it meets the graph. */
        ct_tensor *moved[n > 0 ? n : 1];
        memset(moved, 0, sizeof moved);
        for (int i = 0; i < n && !rc; i++) {
            char want[CT__DESC_STR];
            grads[i] = ct_rpc_args_tensor(in, i + 1);
            ct_device to = s->shapes[i].device, at = grads[i] ? ct_tensor_device(grads[i]) : to;
            if (grads[i] && !ct_device_equal(at, to))
                grads[i] = moved[i] = ct__tensor_own(ct_to(grads[i], to));
            if (!grads[i])
                rc = ct_errcode();
            else if (!ct__autograd_shape_equal(&s->shapes[i], grads[i]))
                rc = ct__err_set(CT_ESHAPE, "the gradient of sent tensor %d is not %s", i,
                                 ct__autograd_shape_rec_str(want, &s->shapes[i]));
        }
        pass *p = rc ? NULL : pass_new(c, reply);
        if (p) {
            rc = run_local(p, edges, grads, n, NULL);
            if (rc) {
                char message[512];
                snprintf(message, sizeof message, "%s", ct_errmsg());
                ct__err_set(rc, "its part of the distributed backward failed: %s", message);
            }
            for (int i = 0; i < n; i++) {
                ct__node_release(edges[i].node);
                ct_tensor_free(moved[i]);
            }
            ct_rpc_args_free(in);
            pass_part_done(p, rc, rc ? ct_errmsg() : NULL);
            return;
        }
        for (int i = 0; i < n; i++) {
            ct__node_release(edges[i].node);
            ct_tensor_free(moved[i]);
        }
        if (!rc)
            rc = ct__err_set(CT_ENOMEM, "dist autograd: out of memory");
    }
    ct_rpc_args_free(in);
    if (c)
        ctx_unref(c);
    ct__rpc_reply(reply, rc, NULL);
}

/* ------------------------------------------------------------- contexts */

int64_t ct_dist_autograd_begin(void) {
    int self = ct_rpc_self();
    if (self < 0) {
        ct__err_set(CT_ESTATE, "ct_dist_autograd_begin: the RPC agent is not running");
        return 0;
    }
    if (current) {
        ct__err_set(CT_ESTATE,
                    "ct_dist_autograd_begin: context %d:%" PRIu64
                    " is current on this thread; end it first",
                    (int)(current >> 48), current & LOW48);
        return 0;
    }
    uint64_t id = ((uint64_t)self << 48) | ((atomic_fetch_add(&T.counter, 1) + 1) & LOW48);
    dctx *c = ctx_get(id, true);
    if (!c)
        return 0;
    ctx_unref(c);
    current = id;
    return (int64_t)id;
}

int64_t ct_dist_autograd_current(void) { return (int64_t)current; }

int ct_dist_autograd_end(int64_t id) {
    if ((uint64_t)id == current)
        current = 0;
    if ((int)((uint64_t)id >> 48) != ct_rpc_self())
        return ct__err_set(
            CT_EINVAL,
            "ct_dist_autograd_end: context %d:%" PRIu64 " began on worker %d; it ends there",
            (int)((uint64_t)id >> 48), (uint64_t)id & LOW48, (int)((uint64_t)id >> 48));
    int rc;
    char why[RING_WHY];
    dctx *c = ctx_lookup((uint64_t)id, false, &rc, why);
    /* One that failed or expired ends quietly: the caller is likely about
     * to report the error that released it. */
    if (!c && *why)
        return 0;
    if (!c)
        return ct__err_set(CT_EINVAL, "ct_dist_autograd_end: context %d:%" PRIu64 " is not known",
                           (int)((uint64_t)id >> 48), (uint64_t)id & LOW48);
    release(c, 0, -1, true, "ended by its owner");
    ctx_unref(c);
    return 0;
}

ct_tensor *ct_dist_autograd_grad(int64_t id, const ct_tensor *leaf) {
    dctx *c = ctx_get((uint64_t)id, false);
    if (!c)
        return NULL;
    ct_tensor *g = NULL;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->ngrads && !g; i++)
        if (c->leaves[i] == leaf)
            g = ct__tensor_scope_own(ct_tensor_retain(c->grads[i]));
    pthread_mutex_unlock(&c->mu);
    ctx_unref(c);
    return g;
}

int ct_dist_autograd_get_gradients(int64_t id, ct_tensor ***leaves, ct_tensor ***grads) {
    if (!leaves || !grads)
        return ct__err_set(CT_EINVAL, "ct_dist_autograd_get_gradients: NULL output arrays");
    *leaves = *grads = NULL;
    dctx *c = ctx_get((uint64_t)id, false);
    if (!c)
        return ct_errcode();
    pthread_mutex_lock(&c->mu);
    int n = c->ngrads;
    *leaves = malloc((size_t)(n ? n : 1) * sizeof **leaves);
    *grads = malloc((size_t)(n ? n : 1) * sizeof **grads);
    for (int i = 0; i < n && *leaves && *grads; i++) {
        (*leaves)[i] = ct__tensor_scope_own(ct_tensor_retain(c->leaves[i]));
        (*grads)[i] = ct__tensor_scope_own(ct_tensor_retain(c->grads[i]));
    }
    pthread_mutex_unlock(&c->mu);
    ctx_unref(c);
    if (!*leaves || !*grads) {
        free(*leaves);
        free(*grads);
        *leaves = *grads = NULL;
        return ct__err_set(CT_ENOMEM, "ct_dist_autograd_get_gradients: out of memory");
    }
    return n;
}

int ct_dist_autograd_num_contexts(void) {
    pthread_mutex_lock(&T.mu);
    int n = 0;
    for (dctx *c = T.live; c; c = c->next)
        n++;
    pthread_mutex_unlock(&T.mu);
    return n;
}

void ct__dautograd_on_release(const rpc_call *call, ct_rpc_args *in, rpc_reply *reply) {
    bool ok = ct_rpc_args_type(in, 0) == CT_RPC_INT && ct_rpc_args_type(in, 1) == CT_RPC_STRING;
    int rc = ok ? (int)ct_rpc_args_int(in, 0) : 0;
    const char *why = ok ? ct_rpc_args_string(in, 1) : NULL;
    dctx *c = ok ? ctx_get(call->context, false) : NULL;
    ct_errclear();
    if (c) {
        release(c, rc, call->from, true, "%s (worker '%s')", why,
                ct_rpc_worker_name(call->from) ? ct_rpc_worker_name(call->from) : "?");
        ctx_unref(c);
    }
    ct_rpc_args_free(in);
    ct__rpc_reply(reply, 0, NULL);
}

/* Each live context matching (id < 0: idle past the timeout at now; else:
 * touched worker id), released with a reason. */
static void release_where(int id, double now) {
    for (;;) {
        pthread_mutex_lock(&T.mu);
        dctx *c = T.live;
        while (c && !(id >= 0 ? id < c->nworkers && c->touched[id]
                              : now - c->last_used > ct__rpc_context_timeout()))
            c = c->next;
        if (c)
            c->refs++;
        pthread_mutex_unlock(&T.mu);
        if (!c)
            return;
        if (id >= 0)
            release(c, CT_EPEER, id, true, "worker '%s' (id %d) died", ct_rpc_worker_name(id), id);
        else
            release(c, CT_ETIMEDOUT, -1, false, "unused for %g s (context_timeout_s)",
                    ct__rpc_context_timeout());
        ctx_unref(c);
    }
}

void ct__dautograd_peer_died(int id) { release_where(id, 0); }

void ct__dautograd_tick(double now) {
    if (now - T.last_tick < 1)
        return;
    T.last_tick = now;
    release_where(-1, now);
}

void ct__dautograd_shutdown(void) {
    for (;;) {
        pthread_mutex_lock(&T.mu);
        dctx *c = T.live;
        if (c)
            c->refs++;
        pthread_mutex_unlock(&T.mu);
        if (!c)
            break;
        release(c, CT_ESTATE, -1, false, "the RPC agent shut down");
        ctx_unref(c);
    }
    pthread_mutex_lock(&T.mu);
    memset(T.ring, 0, sizeof T.ring);
    T.ring_at = 0;
    pthread_mutex_unlock(&T.mu);
}
