/* The RPC agent: one I/O thread owns every socket (a ROUTER that serves
 * this worker, a DEALER per peer it calls); handler threads run registered
 * functions; futures carry results back to callers. docs/rpc-design.md has
 * the design. */
#include "rpc_impl.h"

#include "dist_impl.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define FUTURE_MAGIC 0x63744675u /* "ctFu" */
#define NAME_MAX_LEN 64
#define MAX_FNS      256
/* Tensors in one message. */
#define MAX_TENSOR_FRAMES 256

/* -------------------------------------------------------------- futures */

typedef struct then_cb {
    ct_future_fn fn;
    void *ctx;
    struct then_cb *next;
} then_cb;

struct ct_future {
    uint32_t magic;
    atomic_int refs; /* the caller's, the pending list's, and its request's until sent */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int rc;
    char *message;
    ct_rpc_args *result;
    then_cb *then; /* run once, when done */
    /* The call, for messages and for the pending list. */
    uint64_t id, context;
    int to;
    char fn[RPC_NAME_MAX + 1];
    double deadline, timeout_s;
    struct ct_future *next_pending;
};

static void future_unref(ct_future *f) {
    if (atomic_fetch_sub(&f->refs, 1) != 1)
        return;
    ct_rpc_args_free(f->result);
    free(f->message);
    pthread_cond_destroy(&f->cv);
    pthread_mutex_destroy(&f->mu);
    f->magic = 0;
    free(f);
}

/* Completes f once: with result (taken), or with rc and message. Its
 * callbacks run here, so the caller must hold no agent lock. */
static void future_complete(ct_future *f, int rc, const char *message, ct_rpc_args *result) {
    pthread_mutex_lock(&f->mu);
    if (f->done) {
        pthread_mutex_unlock(&f->mu);
        ct_rpc_args_free(result);
        return;
    }
    f->done = true;
    f->rc = rc;
    f->message = message ? strdup(message) : NULL;
    f->result = result;
    then_cb *cbs = f->then;
    f->then = NULL;
    atomic_fetch_add(&f->refs, 1);
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    while (cbs) {
        then_cb *next = cbs->next;
        cbs->fn(f, cbs->ctx);
        free(cbs);
        cbs = next;
    }
    future_unref(f);
}

/* ----------------------------------------------------------- the agent */

typedef struct peer {
    char name[NAME_MAX_LEN + 1];
    char user[24]; /* "worker<id>": the name it authenticates with */
    char endpoint[320];
    void *dealer, *monitor; /* made on the first call to the peer */
    bool connected, dead;
} peer;

/* Work for the I/O thread, queued by any thread. */
typedef struct outgoing {
    rpc_out msg;
    ct_future *f;     /* a request: its future (the agent's reference) */
    zmq_msg_t *route; /* a reply: the routing id of the caller */
    struct outgoing *next;
} outgoing;

/* Work for a handler: a request that arrived. */
typedef struct job {
    zmq_msg_t route;
    int from; /* the caller's worker id, -1 if it is no worker */
    rpc_header h;
    char fn[RPC_NAME_MAX + 1];
    ct_rpc_args *in;
    struct job *next;
    bool holds_slot; /* counted in g.inflight (under g.mu) */
} job;

/* A request being served: where its answer goes. */
struct rpc_reply {
    zmq_msg_t route;
    uint64_t id, context; /* the request's */
};

typedef struct fn_entry {
    char name[RPC_NAME_MAX + 1];
    ct_rpc_fn fn;
    void *ctx;
} fn_entry;

static struct {
    pthread_mutex_t mu; /* everything below that threads share */
    /* Read by handlers too: set before the threads start. */
    atomic_bool up;
    ct_rpc_options o;
    int self, n;
    peer *peers;
    void *zctx, *router;
    ct__auth auth; /* the router's; served by the I/O thread */
    /* Calls queued or running per caller: [0] for callers that are no
     * worker, [1 + id] for worker id; at most max_pending each. */
    size_t *inflight, max_pending;
    size_t max_frame; /* bytes in one frame of a message, either way */
    int wake_fd;
    pthread_t io;
    bool stop_io;
    outgoing *out_head, *out_tail;
    ct_future *pending; /* calls sent, or queued to send, not done */
    int npending;
    /* Handlers. */
    pthread_t *handlers;
    int nhandlers;
    pthread_cond_t jobs_cv, idle_cv;
    job *jobs_head, *jobs_tail;
    int busy;
    bool stop_handlers;
    atomic_uint_fast64_t counter;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER,
       .jobs_cv = PTHREAD_COND_INITIALIZER,
       .idle_cv = PTHREAD_COND_INITIALIZER,
       .wake_fd = -1};

static pthread_mutex_t fns_mu = PTHREAD_MUTEX_INITIALIZER;
static fn_entry fns[MAX_FNS];
static int nfns;

int ct_rpc_register(const char *name, ct_rpc_fn fn, void *ctx) {
    const char *f = "ct_rpc_register";
    if (!name || !*name || strlen(name) > RPC_NAME_MAX || !fn)
        return ct__err_set(CT_EINVAL, "%s: the name is NULL, empty or over %d bytes, or fn is NULL",
                           f, RPC_NAME_MAX);
    if (!strncmp(name, "ct.", 3))
        return ct__err_set(CT_EINVAL, "%s: '%s': names beginning 'ct.' are ct's own", f, name);
    for (const char *c = name; *c; c++)
        if (*c < 0x20 || *c > 0x7e)
            return ct__err_set(CT_EINVAL, "%s: the name must be printable ASCII", f);
    pthread_mutex_lock(&fns_mu);
    int rc = 0;
    for (int i = 0; i < nfns && !rc; i++)
        if (!strcmp(fns[i].name, name))
            rc = ct__err_set(CT_EINVAL, "%s: '%s' is registered already", f, name);
    if (!rc && nfns == MAX_FNS)
        rc = ct__err_set(CT_EINVAL, "%s: more than %d functions", f, MAX_FNS);
    if (!rc) {
        snprintf(fns[nfns].name, sizeof fns[nfns].name, "%s", name);
        fns[nfns].fn = fn;
        fns[nfns].ctx = ctx;
        nfns++;
    }
    pthread_mutex_unlock(&fns_mu);
    return rc;
}

static bool find_fn(const char *name, fn_entry *out) {
    pthread_mutex_lock(&fns_mu);
    bool found = false;
    for (int i = 0; i < nfns && !found; i++)
        if (!strcmp(fns[i].name, name)) {
            *out = fns[i];
            found = true;
        }
    pthread_mutex_unlock(&fns_mu);
    return found;
}

/* "a, b, c" (the registered functions), into buf. */
static void list_fns(char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = '\0';
    pthread_mutex_lock(&fns_mu);
    for (int i = 0; i < nfns && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%s", i ? ", " : "", fns[i].name);
    pthread_mutex_unlock(&fns_mu);
    if (!nfns)
        snprintf(buf, cap, "none");
}

static void wake_io(void) {
    uint64_t one = 1;
    if (g.wake_fd < 0)
        return;
    if (write(g.wake_fd, &one, sizeof one) < 0 && errno != EAGAIN)
        fprintf(stderr, "ct rpc: waking the I/O thread: %s\n", strerror(errno));
}

/* Appends item to the singly linked queue (head, tail), under its lock. */
#define QUEUE_PUSH(head, tail, item)                                                               \
    do {                                                                                           \
        if (tail)                                                                                  \
            (tail)->next = (item);                                                                 \
        else                                                                                       \
            (head) = (item);                                                                       \
        (tail) = (item);                                                                           \
    } while (0)

static void enqueue(outgoing *o) {
    pthread_mutex_lock(&g.mu);
    QUEUE_PUSH(g.out_head, g.out_tail, o);
    pthread_mutex_unlock(&g.mu);
    wake_io();
}

/* ------------------------------------------------------------ sending */

static void drop_tensor_ref(void *data, void *hint) {
    (void)data;
    CT__ZMQ_HANDBACK(hint);
    ct_tensor_free(hint);
}

/* Sends m's frames on sock, the tensors from their own memory. */
static int send_msg(void *sock, rpc_out *m, zmq_msg_t *route) {
    int more = ZMQ_SNDMORE;
    if (route && zmq_msg_send(route, sock, more) < 0)
        return -1;
    if (zmq_send(sock, &m->h, sizeof m->h, more) < 0)
        return -1;
    if (zmq_send(sock, m->desc, m->desc_len, m->ntensors ? more : 0) < 0)
        return -1;
    for (uint32_t i = 0; i < m->ntensors; i++) {
        ct_tensor *t = m->tensors[i];
        zmq_msg_t frame;
        size_t bytes = (size_t)ct_numel(t) * ct__esize(t->dtype);
        /* zmq drops the reference on its own thread once the bytes are
         * on the wire; reference counts are atomic. */
        if (zmq_msg_init_data(&frame, bytes ? ct__data(t) : NULL, bytes, drop_tensor_ref, t) != 0)
            return -1;
        m->tensors[i] = NULL;
        CT__ZMQ_HANDOFF(t);
        if (zmq_msg_send(&frame, sock, i + 1 < m->ntensors ? more : 0) < 0) {
            zmq_msg_close(&frame);
            return -1;
        }
    }
    return 0;
}

static void fail_future(ct_future *f, int rc, const char *fmt, ...) CT_PRINTF(3, 4);
static void fail_future(ct_future *f, int rc, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    future_complete(f, rc, msg, NULL);
}

/* Takes f off the pending list (under g.mu); whether it was on it. */
static bool unpend(ct_future *f) {
    bool found = false;
    for (ct_future **p = &g.pending; *p; p = &(*p)->next_pending)
        if (*p == f) {
            *p = f->next_pending;
            g.npending--;
            found = true;
            break;
        }
    pthread_cond_broadcast(&g.idle_cv);
    return found;
}

/* Takes f off the pending list, if a timeout has not already, and drops
 * the list's reference. */
static void finish(ct_future *f) {
    pthread_mutex_lock(&g.mu);
    bool was = unpend(f);
    pthread_mutex_unlock(&g.mu);
    if (was)
        future_unref(f);
}

static int connect_peer(peer *p, int id) {
    p->dealer = zmq_socket(g.zctx, ZMQ_DEALER);
    uint16_t me = (uint16_t)g.self;
    int linger = 1000;
    /* zmq's own heartbeats: a peer whose process is alive answers them
     * from zmq's thread whatever its own threads do, so one that stays
     * silent for the timeout is hung or gone, and the connection drops. */
    int timeout_ms = (int)(g.o.heartbeat_timeout_s * 1000), ivl_ms = timeout_ms / 5;
    char mon[64];
    snprintf(mon, sizeof mon, "inproc://ct-rpc-monitor-%d", id);
    if (p->dealer && ct__auth_client(p->dealer, g.peers[g.self].user))
        return ct_errcode();
    if (!p->dealer || zmq_setsockopt(p->dealer, ZMQ_ROUTING_ID, &me, sizeof me) ||
        zmq_setsockopt(p->dealer, ZMQ_LINGER, &linger, sizeof linger) ||
        zmq_setsockopt(p->dealer, ZMQ_HEARTBEAT_IVL, &ivl_ms, sizeof ivl_ms) ||
        zmq_setsockopt(p->dealer, ZMQ_HEARTBEAT_TIMEOUT, &timeout_ms, sizeof timeout_ms) ||
        zmq_socket_monitor(p->dealer, mon, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) ||
        !(p->monitor = zmq_socket(g.zctx, ZMQ_PAIR)) || zmq_connect(p->monitor, mon) ||
        zmq_connect(p->dealer, p->endpoint))
        return ct__err_set(CT_EFOREIGN, "rpc: connecting to worker '%s' at %s: %s", p->name,
                           p->endpoint, zmq_strerror(zmq_errno()));
    return 0;
}

static void send_outgoing(outgoing *o) {
    if (o->route) {
        if (send_msg(g.router, &o->msg, o->route) < 0)
            fprintf(stderr, "ct rpc: worker '%s': a reply was not sent: %s\n", g.peers[g.self].name,
                    zmq_strerror(zmq_errno()));
        zmq_msg_close(o->route);
        free(o->route);
        return;
    }
    ct_future *f = o->f;
    peer *p = &g.peers[f->to];
    if (ct_future_done(f)) {
        /* Timed out before it could be sent: it is not sent at all. */
    } else if (p->dead) {
        fail_future(f, CT_EPEER, "rpc: worker '%s' (id %d) is gone; '%s' was not called", p->name,
                    f->to, f->fn);
        finish(f);
    } else if (!p->dealer && connect_peer(p, f->to)) {
        future_complete(f, ct_errcode(), ct_errmsg(), NULL);
        finish(f);
    } else if (send_msg(p->dealer, &o->msg, NULL) < 0) {
        fail_future(f, CT_EPEER, "rpc: sending '%s' to worker '%s' (id %d): %s", f->fn, p->name,
                    f->to, zmq_strerror(zmq_errno()));
        finish(f);
    }
    /* The request's own reference. */
    future_unref(f);
}

/* ----------------------------------------------------------- receiving */

static void free_zmq_frame(void *data, void *ctx) {
    (void)data;
    zmq_msg_close(ctx);
    free(ctx);
}

/* Receives the rest of a multipart message after its header frame:
 * the description and the tensor frames (each moved to the heap, so that a
 * tensor can own it). Returns the number of frames, or -1. */
static void free_frames(rpc_frame *frames, int n);

static int recv_rest(void *sock, zmq_msg_t *desc, rpc_frame *frames, int cap) {
    zmq_msg_init(desc);
    if (ct__dist_zmq_recv(desc, sock, 0) < 0)
        return -1;
    int n = 0;
    bool more = zmq_msg_more(desc);
    while (more) {
        zmq_msg_t *m = malloc(sizeof *m);
        if (!m || zmq_msg_init(m) || ct__dist_zmq_recv(m, sock, 0) < 0) {
            free(m);
            free_frames(frames, n < cap ? n : cap);
            return -1;
        }
        more = zmq_msg_more(m);
        if (n >= cap) {
            zmq_msg_close(m);
            free(m);
            n = cap + 1; /* too many: drained and refused */
            continue;
        }
        frames[n++] = (rpc_frame){zmq_msg_data(m), zmq_msg_size(m), free_zmq_frame, m, false};
    }
    return n;
}

static void free_frames(rpc_frame *frames, int n) {
    for (int i = 0; i < n; i++)
        if (!frames[i].taken)
            frames[i].free_fn(frames[i].data, frames[i].ctx);
}

static void free_copy(void *data, void *ctx) {
    (void)ctx;
    free(data);
}

/* A received tensor must sit at an address its dtype allows (8 bytes
 * serves every dtype): zmq puts a small message inside its own header, at
 * any address, and such a frame is copied. A large one, which zmq places 8
 * bytes past a malloc'd header, is received in place: copying it would cost
 * a third of a large call's time. */
#define FRAME_ALIGN 8

static void align_frames(rpc_frame *frames, int n) {
    for (int i = 0; i < n; i++) {
        void *copy = NULL;
        if ((uintptr_t)frames[i].data % FRAME_ALIGN == 0 || !frames[i].len ||
            posix_memalign(&copy, 64, frames[i].len))
            continue;
        memcpy(copy, frames[i].data, frames[i].len);
        frames[i].free_fn(frames[i].data, frames[i].ctx);
        frames[i] = (rpc_frame){copy, frames[i].len, free_copy, NULL, false};
    }
}

static void send_reply(rpc_reply *r, int rc, const ct_rpc_args *out, bool grads, uint64_t id);

/* Answers a request that could not be taken with the error set. */
static void reply_error(zmq_msg_t *route, const rpc_header *req, int code) {
    rpc_reply *r = malloc(sizeof *r);
    if (!r)
        return;
    zmq_msg_init(&r->route);
    zmq_msg_copy(&r->route, route);
    r->id = req->id;
    r->context = 0;
    send_reply(r, code, NULL, false, ct__rpc_next_id());
}

static void drain(void *sock, bool more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    while (more && ct__dist_zmq_recv(&m, sock, 0) >= 0)
        more = zmq_msg_more(&m);
    zmq_msg_close(&m);
}

/* The worker id of a caller: its routing id is the 2-byte id a peer's
 * DEALER sets, and the name it authenticated with (user, zmq's "User-Id")
 * says the same; anything else is a caller that is no worker (-1). */
static int caller_id(zmq_msg_t *route, const char *user) {
    uint16_t from;
    if (zmq_msg_size(route) != sizeof from)
        return -1;
    memcpy(&from, zmq_msg_data(route), sizeof from);
    return from < g.n && user && !strcmp(user, g.peers[from].user) ? from : -1;
}

int ct__rpc_read_request(void *sock, rpc_header *h, char fn[RPC_NAME_MAX + 1], ct_rpc_args **in,
                         char user[RPC_USER_MAX]) {
    *in = NULL;
    *h = (rpc_header){0};
    user[0] = '\0';
    zmq_msg_t head;
    zmq_msg_init(&head);
    int got = ct__dist_zmq_recv(&head, sock, 0);
    bool more = got >= 0 && zmq_msg_more(&head);
    const char *u = got >= 0 ? zmq_msg_gets(&head, "User-Id") : NULL;
    if (u)
        ct__str_copy(user, RPC_USER_MAX, u);
    int rc = got < 0 ? ct__err_set(CT_ECORRUPT, "rpc: a malformed message: its header is missing")
                     : ct__rpc_header_parse(zmq_msg_data(&head), zmq_msg_size(&head), h);
    zmq_msg_close(&head);
    if (!rc && h->kind != RPC_REQUEST)
        rc = ct__err_set(CT_ECORRUPT, "rpc: a %s message where a request belongs",
                         h->kind == RPC_RESPONSE ? "response" : "error");
    if (!rc && !more)
        rc = ct__err_set(CT_ECORRUPT, "rpc: a malformed message: its description is missing");
    if (rc) {
        drain(sock, more);
        return rc;
    }
    rpc_frame frames[MAX_TENSOR_FRAMES];
    zmq_msg_t desc;
    int n = recv_rest(sock, &desc, frames, MAX_TENSOR_FRAMES);
    if (n < 0 || n > MAX_TENSOR_FRAMES)
        rc = ct__err_set(CT_ECORRUPT, "rpc: a malformed message: %s",
                         n < 0 ? "frames missing" : "too many tensor frames");
    if (!rc) {
        align_frames(frames, n);
        rc = ct__rpc_decode_call(zmq_msg_data(&desc), zmq_msg_size(&desc), frames, (uint32_t)n, fn,
                                 in);
    }
    if (n >= 0)
        free_frames(frames, n > MAX_TENSOR_FRAMES ? MAX_TENSOR_FRAMES : n);
    zmq_msg_close(&desc);
    return rc;
}

/* A message on the ROUTER: a request from a peer's DEALER, or anything at
 * all from another process of the job. Whatever it is, it never takes the
 * agent down. */
static void on_request(void) {
    zmq_msg_t route;
    zmq_msg_init(&route);
    if (zmq_msg_recv(&route, g.router, 0) < 0)
        return;
    job *j = calloc(1, sizeof *j);
    rpc_header h = {0};
    char user[RPC_USER_MAX];
    int rc = 0;
    if (!zmq_msg_more(&route)) {
        rc = ct__err_set(CT_ECORRUPT, "rpc: a message of one frame");
    } else if (!j) {
        drain(g.router, true);
        rc = ct__err_set(CT_ENOMEM, "rpc: out of memory");
    } else {
        rc = ct__rpc_read_request(g.router, &h, j->fn, &j->in, user);
    }
    if (rc) {
        fprintf(stderr, "ct rpc: worker '%s' dropped a message: %s\n", g.peers[g.self].name,
                ct_errmsg());
        /* A sender that speaks the protocol gets told; noise does not. */
        if (h.magic == RPC_MAGIC && h.kind == RPC_REQUEST)
            reply_error(&route, &h, rc);
        zmq_msg_close(&route);
        free(j);
        return;
    }
    j->h = h;
    j->from = caller_id(&route, user);
    pthread_mutex_lock(&g.mu);
    size_t *count = &g.inflight[1 + j->from];
    bool full = *count >= g.max_pending;
    if (!full) {
        ++*count;
        j->holds_slot = true;
        zmq_msg_init(&j->route);
        zmq_msg_move(&j->route, &route);
        QUEUE_PUSH(g.jobs_head, g.jobs_tail, j);
        pthread_cond_signal(&g.jobs_cv);
    }
    pthread_mutex_unlock(&g.mu);
    if (full) {
        char who[32] = "callers that are no worker";
        if (j->from >= 0)
            snprintf(who, sizeof who, "worker %d", j->from);
        reply_error(&route, &h,
                    ct__err_set(CT_ENOMEM,
                                "rpc: worker '%s' has %zu calls from %s queued or running, its "
                                "limit (CT_RPC_MAX_PENDING=%zu); '%s' is refused",
                                g.peers[g.self].name, g.max_pending, who, g.max_pending, j->fn));
        zmq_msg_close(&route);
        ct_rpc_args_free(j->in);
        free(j);
    }
}

static ct_future *find_pending(uint64_t id) {
    for (ct_future *f = g.pending; f; f = f->next_pending)
        if (f->id == id)
            return f;
    return NULL;
}

static void on_reply(peer *p, int id) {
    zmq_msg_t head, desc;
    zmq_msg_init(&head);
    if (zmq_msg_recv(&head, p->dealer, 0) < 0)
        return;
    rpc_header h = {0};
    int rc = ct__rpc_header_parse(zmq_msg_data(&head), zmq_msg_size(&head), &h);
    bool more = zmq_msg_more(&head);
    zmq_msg_close(&head);
    rpc_frame frames[MAX_TENSOR_FRAMES];
    int n = more ? recv_rest(p->dealer, &desc, frames, MAX_TENSOR_FRAMES) : -1;
    if (n < 0 || n > MAX_TENSOR_FRAMES || rc || h.kind == RPC_REQUEST) {
        fprintf(stderr, "ct rpc: a malformed reply from worker '%s' was dropped\n", p->name);
        if (n >= 0) {
            free_frames(frames, n > MAX_TENSOR_FRAMES ? MAX_TENSOR_FRAMES : n);
            zmq_msg_close(&desc);
        }
        return;
    }
    align_frames(frames, n);
    pthread_mutex_lock(&g.mu);
    ct_future *f = find_pending(h.reply_to);
    pthread_mutex_unlock(&g.mu);
    if (!f) {
        /* A reply after its call timed out: dropped, never delivered. */
        free_frames(frames, n);
        zmq_msg_close(&desc);
        return;
    }
    if (h.kind == RPC_ERROR) {
        char *text = NULL;
        if (ct__rpc_decode_error(zmq_msg_data(&desc), zmq_msg_size(&desc), &text))
            fail_future(f, CT_ECORRUPT, "rpc: worker '%s' (id %d), function '%s': %s", p->name, id,
                        f->fn, ct_errmsg());
        else
            fail_future(f, h.status < 0 ? h.status : CT_EFOREIGN,
                        "rpc: worker '%s' (id %d), function '%s': %s", p->name, id, f->fn, text);
        free(text);
    } else {
        char fn[RPC_NAME_MAX + 1];
        ct_rpc_args *out = NULL;
        rc = ct__rpc_decode_call(zmq_msg_data(&desc), zmq_msg_size(&desc), frames, (uint32_t)n, fn,
                                 &out);
        if (!rc && f->context)
            rc = ct__dautograd_on_receive(f->context, id, h.id, out);
        if (rc) {
            fail_future(f, rc, "rpc: the reply of worker '%s' to '%s': %s", p->name, f->fn,
                        ct_errmsg());
            ct_rpc_args_free(out);
        } else {
            future_complete(f, 0, NULL, out);
        }
    }
    free_frames(frames, n);
    zmq_msg_close(&desc);
    finish(f);
}

/* Takes off the pending list the calls to worker `to` (to >= 0) or those
 * past their deadline at now (to < 0), chained through next_pending, so
 * that they are failed outside g.mu: completing runs callbacks. */
static ct_future *take_pending(int to, double now) {
    ct_future *taken = NULL;
    pthread_mutex_lock(&g.mu);
    for (ct_future **p = &g.pending; *p;) {
        ct_future *f = *p;
        if (to >= 0 ? f->to == to : now >= f->deadline) {
            *p = f->next_pending;
            g.npending--;
            f->next_pending = taken;
            taken = f;
        } else {
            p = &f->next_pending;
        }
    }
    pthread_cond_broadcast(&g.idle_cv);
    pthread_mutex_unlock(&g.mu);
    return taken;
}

/* A connection to p dropped after it was up: p is gone, and so is every
 * call pending on it. */
static void on_monitor(peer *p, int id) {
    zmq_msg_t ev;
    zmq_msg_init(&ev);
    if (zmq_msg_recv(&ev, p->monitor, 0) < 0)
        return;
    uint16_t event = 0;
    if (zmq_msg_size(&ev) >= 2)
        memcpy(&event, zmq_msg_data(&ev), 2);
    while (zmq_msg_more(&ev) && ct__dist_zmq_recv(&ev, p->monitor, 0) >= 0)
        ;
    zmq_msg_close(&ev);
    if (event == ZMQ_EVENT_CONNECTED) {
        p->connected = true;
        return;
    }
    if (event != ZMQ_EVENT_DISCONNECTED || !p->connected || p->dead)
        return;
    /* Under the lock: other threads ask (ct__rpc_peer_dead). */
    pthread_mutex_lock(&g.mu);
    p->dead = true;
    pthread_mutex_unlock(&g.mu);
    ct_future *gone = take_pending(id, 0);
    while (gone) {
        ct_future *f = gone;
        gone = f->next_pending;
        fail_future(f, CT_EPEER,
                    "rpc: worker '%s' (id %d) went away during '%s' (its connection "
                    "dropped, or it answered no heartbeat for %g s): the call may or may "
                    "not have run",
                    p->name, id, f->fn, g.o.heartbeat_timeout_s);
        future_unref(f);
    }
    ct__dautograd_peer_died(id);
    ct__rref_peer_died(id);
}

static void expire(double now) {
    ct_future *late = take_pending(-1, now);
    while (late) {
        ct_future *f = late;
        late = f->next_pending;
        fail_future(f, CT_ETIMEDOUT, "rpc: '%s' on worker '%s' (id %d) gave no answer in %g s",
                    f->fn, g.peers[f->to].name, f->to, f->timeout_s);
        future_unref(f);
    }
}

static void *io_main(void *arg) {
    (void)arg;
    zmq_pollitem_t *items = calloc((size_t)(3 + 2 * g.n), sizeof *items);
    int *who = calloc((size_t)(3 + 2 * g.n), sizeof *who);
    /* Every peer is connected from the start, so that the death of any of
     * them is seen (its connection drops) even by a worker that only ever
     * answered it: that fails the contexts they share. */
    for (int i = 0; i < g.n; i++)
        if (i != g.self && connect_peer(&g.peers[i], i))
            fprintf(stderr, "ct rpc: %s\n", ct_errmsg());
    for (;;) {
        pthread_mutex_lock(&g.mu);
        bool stop = g.stop_io;
        outgoing *todo = g.out_head;
        g.out_head = g.out_tail = NULL;
        pthread_mutex_unlock(&g.mu);
        while (todo) {
            outgoing *next = todo->next;
            send_outgoing(todo);
            ct__rpc_out_free(&todo->msg);
            free(todo);
            todo = next;
        }
        if (stop)
            break;
        int n = 0;
        items[n++] = (zmq_pollitem_t){.socket = g.router, .events = ZMQ_POLLIN};
        items[n++] = (zmq_pollitem_t){.fd = g.wake_fd, .events = ZMQ_POLLIN};
        items[n++] = (zmq_pollitem_t){.fd = g.auth.fd, .events = ZMQ_POLLIN};
        for (int i = 0; i < g.n; i++) {
            if (!g.peers[i].dealer)
                continue;
            who[n] = i;
            items[n++] = (zmq_pollitem_t){.socket = g.peers[i].dealer, .events = ZMQ_POLLIN};
            who[n] = -1 - i;
            items[n++] = (zmq_pollitem_t){.socket = g.peers[i].monitor, .events = ZMQ_POLLIN};
        }
        if (zmq_poll(items, n, 50) < 0 && zmq_errno() != EINTR)
            break;
        if (items[1].revents) {
            uint64_t v;
            if (read(g.wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
                break;
        }
        if (items[2].revents)
            ct__auth_serve(&g.auth);
        if (items[0].revents)
            on_request();
        for (int k = 3; k < n; k++)
            if (items[k].revents && who[k] >= 0)
                on_reply(&g.peers[who[k]], who[k]);
            else if (items[k].revents)
                on_monitor(&g.peers[-1 - who[k]], -1 - who[k]);
        double now = ct__now();
        expire(now);
        ct__dautograd_tick(now);
    }
    free(items);
    free(who);
    return NULL;
}

/* ------------------------------------------------------------- handlers */

/* A frame larger than the peers take would only drop the connection there
 * (zmq's ZMQ_MAXMSGSIZE); the sender fails the message instead, naming the
 * limit and the call (its label; NULL for a reply). Every rank reads the
 * same variable, so the limits agree. */
static int frames_fit(const rpc_out *m, const char *call) {
    size_t largest = m->desc_len;
    for (uint32_t i = 0; i < m->ntensors; i++) {
        size_t bytes =
            (size_t)ct_numel(m->tensors[i]) * ct_dtype_size(ct_tensor_dtype(m->tensors[i]));
        largest = bytes > largest ? bytes : largest;
    }
    if (largest <= g.max_frame)
        return 0;
    return ct__err_set(CT_EINVAL,
                       "rpc: %s%s%s holds a frame of %zu bytes, over the limit of the workers "
                       "(CT_RPC_MAX_FRAME_BYTES=%zu)",
                       call ? "the call of '" : "the reply", call ? call : "", call ? "'" : "",
                       largest, g.max_frame);
}

/* Sends the answer to r as message id; with grads, tensors that need grad
 * are marked, for the caller's recv node. */
static void send_reply(rpc_reply *r, int rc, const ct_rpc_args *out, bool grads, uint64_t id) {
    outgoing *o = calloc(1, sizeof *o);
    zmq_msg_t *route = malloc(sizeof *route);
    ct_rpc_args *empty = out ? NULL : ct_rpc_args_new();
    if (!o || !route || (!out && !empty)) {
        fprintf(stderr, "ct rpc: worker '%s': out of memory answering a call\n",
                g.peers[g.self].name);
        free(o);
        free(route);
        zmq_msg_close(&r->route);
        free(r);
        return;
    }
    if (!rc && !(rc = ct__rpc_encode_call(&o->msg, NULL, out ? out : empty, grads)) &&
        (rc = frames_fit(&o->msg, NULL)))
        ct__rpc_out_free(&o->msg);
    if (rc && ct__rpc_encode_error(&o->msg, ct_errmsg()))
        ct__rpc_encode_error(&o->msg, "out of memory");
    ct_rpc_args_free(empty);
    o->msg.h = (rpc_header){.magic = RPC_MAGIC,
                            .version = RPC_VERSION,
                            .kind = rc ? RPC_ERROR : RPC_RESPONSE,
                            .id = id,
                            .reply_to = r->id,
                            .context = r->context,
                            .status = rc,
                            .ntensors = o->msg.ntensors};
    zmq_msg_init(route);
    zmq_msg_move(route, &r->route);
    o->route = route;
    free(r);
    enqueue(o);
}

void ct__rpc_reply(rpc_reply *r, int rc, const ct_rpc_args *out) {
    send_reply(r, rc, out, false, ct__rpc_next_id());
}

static const struct {
    const char *name;
    rpc_internal_fn fn;
} internal_fns[] = {
    {"ct.backward", ct__dautograd_on_backward},
    {"ct.release", ct__dautograd_on_release},
    {"ct.rref_new", ct__rref_on_new},
    {"ct.rref_fetch", ct__rref_on_fetch},
    {"ct.rref_call", ct__rref_on_call},
    {"ct.rref_del", ct__rref_on_del},
    {"ct.optim_step", ct__dautograd_optim_on_step},
};

int ct__rpc_run_fn(const char *name, const ct_rpc_args *in, ct_rpc_args *out) {
    fn_entry e;
    if (!find_fn(name, &e)) {
        char list[512];
        list_fns(list, sizeof list);
        return ct__err_set(CT_EINVAL, "no function '%s' is registered there (it has: %s)", name,
                           list);
    }
    return e.fn(e.ctx, in, out);
}

/* Gives back j's place among its caller's calls in flight. */
static void release_slot(job *j) {
    pthread_mutex_lock(&g.mu);
    if (j->holds_slot)
        g.inflight[1 + j->from]--;
    j->holds_slot = false;
    pthread_mutex_unlock(&g.mu);
}

/* Runs a user function in the caller's context: received tensors that
 * needed grad get a recv node, and results that need grad a send node.
 * The call stops counting against CT_RPC_MAX_PENDING before its answer
 * goes, so that a caller holding the answer may call again at once. */
static void run_user(job *j, rpc_reply *r) {
    ct_rpc_args *out = ct_rpc_args_new();
    uint64_t reply_id = ct__rpc_next_id();
    int rc = out ? 0 : ct_errcode();
    ct_scope_begin();
    if (!rc && j->h.context)
        rc = ct__dautograd_on_receive(j->h.context, j->from, j->h.id, j->in);
    if (!rc) {
        uint64_t saved = ct__dautograd_enter(j->h.context);
        rc = ct__rpc_run_fn(j->fn, j->in, out);
        if (!rc && j->h.context)
            rc = ct__dautograd_record_send(j->h.context, j->from, reply_id, out);
        ct__dautograd_leave(saved);
    }
    release_slot(j);
    send_reply(r, rc, out, j->h.context != 0, reply_id);
    ct_scope_end();
    ct_rpc_args_free(out);
}

static void run_job(job *j) {
    rpc_reply *r = malloc(sizeof *r);
    if (!r)
        return;
    zmq_msg_init(&r->route);
    zmq_msg_move(&r->route, &j->route);
    r->id = j->h.id;
    r->context = j->h.context;
    if (strncmp(j->fn, "ct.", 3) != 0) {
        run_user(j, r);
        return;
    }
    for (size_t i = 0; i < sizeof internal_fns / sizeof *internal_fns; i++)
        if (!strcmp(internal_fns[i].name, j->fn)) {
            rpc_call c = {.from = j->from, .id = j->h.id, .context = j->h.context};
            ct_rpc_args *in = j->in;
            j->in = NULL;
            ct_errclear();
            ct_scope_begin();
            internal_fns[i].fn(&c, in, r);
            ct_scope_end();
            return;
        }
    ct__rpc_reply(r, ct__err_set(CT_EINVAL, "no internal function '%s' (a newer ct's?)", j->fn),
                  NULL);
}

static void *handler_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&g.mu);
    for (;;) {
        while (!g.jobs_head && !g.stop_handlers)
            pthread_cond_wait(&g.jobs_cv, &g.mu);
        if (!g.jobs_head)
            break;
        job *j = g.jobs_head;
        g.jobs_head = j->next;
        if (!g.jobs_head)
            g.jobs_tail = NULL;
        g.busy++;
        pthread_mutex_unlock(&g.mu);
        run_job(j);
        ct_rpc_args_free(j->in);
        zmq_msg_close(&j->route);
        pthread_mutex_lock(&g.mu);
        if (j->holds_slot)
            g.inflight[1 + j->from]--;
        free(j);
        g.busy--;
        pthread_cond_broadcast(&g.idle_cv);
    }
    pthread_mutex_unlock(&g.mu);
    return NULL;
}

/* ------------------------------------------------------ init, shutdown */

static int agent_check(const char *fn) {
    return g.up ? 0 : ct__err_set(CT_ESTATE, "%s: the RPC agent is not running (ct_rpc_init)", fn);
}

/* Every rank publishes "name host:port" under rpc/<restart>/<rank> and
 * reads everyone's. */
static int meet(const char *endpoint, double timeout_s) {
    ct_store *store = ct_dist_store();
    const ct_world *w = ct_dist_world();
    /* A world of one has no store, and needs none. */
    if (!store) {
        snprintf(g.peers[0].endpoint, sizeof g.peers[0].endpoint, "%s", endpoint);
        return 0;
    }
    char key[64], value[400];
    snprintf(key, sizeof key, "rpc/%d/%d", w->restart_count, g.self);
    snprintf(value, sizeof value, "%s %s", g.peers[g.self].name, endpoint);
    int rc = ct_store_set(store, key, value, strlen(value), timeout_s);
    for (int r = 0; !rc && r < g.n; r++) {
        void *got = NULL;
        size_t len = 0;
        snprintf(key, sizeof key, "rpc/%d/%d", w->restart_count, r);
        rc = ct_store_get(store, key, &got, &len, timeout_s);
        if (!rc) {
            char *text = malloc(len + 1), *space = NULL;
            if (text) {
                memcpy(text, got, len);
                text[len] = '\0';
                space = strchr(text, ' ');
            }
            if (!space || space - text > NAME_MAX_LEN)
                rc = ct__err_set(CT_ECORRUPT, "ct_rpc_init: rank %d published '%.*s'", r, (int)len,
                                 (const char *)got);
            else {
                snprintf(g.peers[r].name, sizeof g.peers[r].name, "%.*s", (int)(space - text),
                         text);
                snprintf(g.peers[r].endpoint, sizeof g.peers[r].endpoint, "%s", space + 1);
            }
            free(text);
        }
        free(got);
    }
    for (int a = 0; !rc && a < g.n; a++)
        for (int b = a + 1; !rc && b < g.n; b++)
            if (!strcmp(g.peers[a].name, g.peers[b].name))
                rc = ct__err_set(CT_EINVAL, "ct_rpc_init: ranks %d and %d are both named '%s'", a,
                                 b, g.peers[a].name);
    return rc;
}

static void stop_threads(void) {
    pthread_mutex_lock(&g.mu);
    g.stop_io = true;
    g.stop_handlers = true;
    pthread_cond_broadcast(&g.jobs_cv);
    pthread_mutex_unlock(&g.mu);
    if (g.wake_fd >= 0) {
        wake_io();
        pthread_join(g.io, NULL);
    }
    for (int i = 0; i < g.nhandlers; i++)
        pthread_join(g.handlers[i], NULL);
}

static void teardown(void) {
    /* What no one will answer now fails, so that no waiter hangs; the
     * callbacks that runs may queue messages, which are dropped below. */
    while (g.pending) {
        ct_future *f = g.pending;
        g.pending = f->next_pending;
        fail_future(f, CT_ESTATE, "rpc: the agent shut down before '%s' was answered", f->fn);
        future_unref(f);
    }
    ct__dautograd_shutdown();
    ct__rref_shutdown();
    while (g.out_head) {
        outgoing *o = g.out_head;
        g.out_head = o->next;
        if (o->f)
            future_unref(o->f);
        if (o->route) {
            zmq_msg_close(o->route);
            free(o->route);
        }
        ct__rpc_out_free(&o->msg);
        free(o);
    }
    g.out_tail = NULL;
    for (int i = 0; g.peers && i < g.n; i++) {
        if (g.peers[i].dealer)
            zmq_close(g.peers[i].dealer);
        if (g.peers[i].monitor)
            zmq_close(g.peers[i].monitor);
    }
    if (g.router)
        zmq_close(g.router);
    ct__auth_close(&g.auth);
    if (g.zctx)
        zmq_ctx_term(g.zctx);
    if (g.wake_fd >= 0)
        close(g.wake_fd);
    free(g.peers);
    free(g.handlers);
    free(g.inflight);
    g.peers = NULL;
    g.handlers = NULL;
    g.inflight = NULL;
    g.router = g.zctx = NULL;
    g.wake_fd = -1;
    g.nhandlers = g.npending = 0;
    g.stop_io = g.stop_handlers = false;
    g.up = false;
}

int ct_rpc_init(const ct_rpc_options *opts) {
    const char *fn = "ct_rpc_init";
    if (g.up)
        return ct__err_set(CT_ESTATE, "%s: the agent is running already", fn);
    const ct_world *w = ct_dist_world();
    if (!w || (!ct_dist_store() && w->size > 1))
        return ct__err_set(CT_ESTATE, "%s: call ct_dist_init() first", fn);
    g.o = opts ? *opts : (ct_rpc_options){0};
    if (!(g.o.timeout_s > 0))
        g.o.timeout_s = 60;
    if (g.o.handler_threads <= 0)
        g.o.handler_threads = 4;
    if (!(g.o.context_timeout_s > 0))
        g.o.context_timeout_s = 600;
    if (!(g.o.heartbeat_timeout_s > 0))
        g.o.heartbeat_timeout_s = 5;
    if (w->size > 65536)
        return ct__err_set(CT_EINVAL, "%s: %d ranks; worker ids have 16 bits", fn, w->size);
    if (g.o.name && (!*g.o.name || strlen(g.o.name) > NAME_MAX_LEN || strchr(g.o.name, ' ')))
        return ct__err_set(CT_EINVAL, "%s: the name must be 1-%d bytes without spaces", fn,
                           NAME_MAX_LEN);
    g.self = w->rank;
    g.n = w->size;
    int rc = ct__dist_env_limit("CT_RPC_MAX_PENDING", 1024, &g.max_pending);
    if (!rc)
        rc = ct__dist_env_limit("CT_RPC_MAX_FRAME_BYTES", (size_t)4 << 30, &g.max_frame);
    if (rc)
        return rc;
    g.peers = calloc((size_t)g.n, sizeof *g.peers);
    g.handlers = calloc((size_t)g.o.handler_threads, sizeof *g.handlers);
    g.inflight = calloc((size_t)g.n + 1, sizeof *g.inflight);
    if (!g.peers || !g.handlers || !g.inflight) {
        teardown();
        return ct__err_set(CT_ENOMEM, "%s: out of memory", fn);
    }
    for (int i = 0; i < g.n; i++)
        snprintf(g.peers[i].user, sizeof g.peers[i].user, "worker%d", i);
    snprintf(g.peers[g.self].name, sizeof g.peers[g.self].name, "%s",
             g.o.name ? g.o.name : g.peers[g.self].user);
    /* On one machine loopback; across machines this host's address. */
    char host[256], bind[CT__BIND_LEN], listen[CT__BIND_LEN + 16];
    char bound[300] = "", endpoint[320];
    size_t blen = sizeof bound;
    int linger = 1000;
    int64_t max_frame = (int64_t)(g.max_frame < INT64_MAX ? g.max_frame : INT64_MAX);
    if ((rc = ct__dist_listen_address(w, NULL, bind, host))) {
        teardown();
        return rc;
    }
    snprintf(listen, sizeof listen, "tcp://%s:*", bind);
    g.zctx = zmq_ctx_new();
    g.router = g.zctx ? zmq_socket(g.zctx, ZMQ_ROUTER) : NULL;
    if (g.router && (rc = ct__auth_listen(g.zctx, g.router, &g.auth, "the RPC agent"))) {
        teardown();
        return rc;
    }
    if (!g.router || zmq_setsockopt(g.router, ZMQ_LINGER, &linger, sizeof linger) ||
        zmq_setsockopt(g.router, ZMQ_MAXMSGSIZE, &max_frame, sizeof max_frame) ||
        zmq_bind(g.router, listen) || zmq_getsockopt(g.router, ZMQ_LAST_ENDPOINT, bound, &blen))
        rc = ct__err_set(CT_EFOREIGN, "%s: binding the worker's socket to %s: %s", fn, listen,
                         zmq_strerror(zmq_errno()));
    const char *port = strrchr(bound, ':');
    snprintf(endpoint, sizeof endpoint, "tcp://%s%s", host, port ? port : ":0");
    if (!rc && (g.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
        rc = ct__err_set(CT_EFOREIGN, "%s: eventfd: %s", fn, strerror(errno));
    if (!rc)
        rc = meet(endpoint, g.o.timeout_s);
    g.up = !rc;
    if (!rc && pthread_create(&g.io, NULL, io_main, NULL)) {
        close(g.wake_fd);
        g.wake_fd = -1;
        rc = ct__err_set(CT_EFOREIGN, "%s: the I/O thread could not start", fn);
    }
    for (int i = 0; !rc && i < g.o.handler_threads; i++) {
        if (pthread_create(&g.handlers[i], NULL, handler_main, NULL))
            rc = ct__err_set(CT_EFOREIGN, "%s: a handler thread could not start", fn);
        else
            g.nhandlers++;
    }
    if (rc) {
        stop_threads();
        teardown();
        return rc;
    }
    return 0;
}

int ct_rpc_shutdown(void) {
    const char *fn = "ct_rpc_shutdown";
    int rc = agent_check(fn);
    if (rc)
        return rc;
    /* This worker's own calls and handlers first. */
    double deadline = ct__now() + g.o.timeout_s;
    pthread_mutex_lock(&g.mu);
    while ((g.npending || g.busy || g.jobs_head) && ct__now() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&g.idle_cv, &g.mu, &ts);
    }
    bool idle = !g.npending && !g.busy && !g.jobs_head;
    pthread_mutex_unlock(&g.mu);
    if (!idle)
        rc = ct__err_set(CT_ETIMEDOUT, "%s: calls or handlers still running after %g s", fn,
                         g.o.timeout_s);
    /* Then everyone's: the agent keeps serving until all have arrived. */
    char key[64];
    snprintf(key, sizeof key, "rpc/%d/down", ct_dist_world()->restart_count);
    int64_t arrived = g.n == 1 ? 1 : 0;
    if (!rc && g.n > 1)
        rc = ct_store_add(ct_dist_store(), key, 1, &arrived, g.o.timeout_s);
    while (!rc && arrived < g.n) {
        if (ct__now() > deadline) {
            rc = ct__err_set(CT_ETIMEDOUT, "%s: %lld of %d workers arrived in %g s", fn,
                             (long long)arrived, g.n, g.o.timeout_s);
            break;
        }
        nanosleep(&(struct timespec){0, 2000000}, NULL);
        rc = ct_store_add(ct_dist_store(), key, 0, &arrived, g.o.timeout_s);
    }
    stop_threads();
    teardown();
    return rc;
}

int ct_rpc_self(void) { return g.up ? g.self : -1; }
int ct_rpc_num_workers(void) { return g.up ? g.n : -1; }

const char *ct_rpc_worker_name(int id) {
    return g.up && id >= 0 && id < g.n ? g.peers[id].name : NULL;
}

int ct_rpc_worker_id(const char *name) {
    if (agent_check("ct_rpc_worker_id"))
        return -1;
    for (int i = 0; name && i < g.n; i++)
        if (!strcmp(g.peers[i].name, name))
            return i;
    ct__err_set(CT_EINVAL, "rpc: there is no worker named '%s'", name ? name : "(null)");
    return -1;
}

/* ---------------------------------------------------------------- calls */

uint64_t ct__rpc_next_id(void) {
    return ((uint64_t)g.self << 48) | (atomic_fetch_add(&g.counter, 1) & 0xffffffffffffull);
}

double ct__rpc_timeout(void) { return g.o.timeout_s; }
double ct__rpc_context_timeout(void) { return g.o.context_timeout_s; }

bool ct__rpc_peer_dead(int id) {
    pthread_mutex_lock(&g.mu);
    bool dead = g.peers[id].dead;
    pthread_mutex_unlock(&g.mu);
    return dead;
}

/* A call to worker `to`: user calls record autograd (user), internal ones
 * name their context. */
static ct_future *call(int to, const char *fn, const char *label, const ct_rpc_args *args,
                       double timeout_s, bool user, uint64_t context) {
    if (!fn || !*fn || strlen(fn) > RPC_NAME_MAX) {
        ct__err_set(CT_EINVAL, "ct_rpc_async: the function name is NULL, empty or too long");
        return NULL;
    }
    ct_future *f = calloc(1, sizeof *f);
    outgoing *o = calloc(1, sizeof *o);
    if (!f || !o) {
        free(f);
        free(o);
        ct__err_set(CT_ENOMEM, "ct_rpc_async: out of memory");
        return NULL;
    }
    f->id = ct__rpc_next_id();
    if ((user && ct__dautograd_on_send(to, f->id, args, &context)) ||
        ct__rpc_encode_call(&o->msg, fn, args, user && context) || frames_fit(&o->msg, label)) {
        ct__rpc_out_free(&o->msg);
        free(f);
        free(o);
        return NULL;
    }
    f->magic = FUTURE_MAGIC;
    atomic_init(&f->refs, 3);
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    f->to = to;
    f->context = context;
    ct__str_copy(f->fn, sizeof f->fn, label);
    f->timeout_s = timeout_s > 0 ? timeout_s : g.o.timeout_s;
    f->deadline = ct__now() + f->timeout_s;
    o->msg.h = (rpc_header){.magic = RPC_MAGIC,
                            .version = RPC_VERSION,
                            .kind = RPC_REQUEST,
                            .id = f->id,
                            .context = context,
                            .ntensors = o->msg.ntensors};
    o->f = f;
    pthread_mutex_lock(&g.mu);
    f->next_pending = g.pending;
    g.pending = f;
    g.npending++;
    pthread_mutex_unlock(&g.mu);
    enqueue(o);
    return f;
}

ct_future *ct__rpc_call(int to, const char *fn, const char *label, const ct_rpc_args *args,
                        double timeout_s, uint64_t context) {
    return call(to, fn, label, args, timeout_s, false, context);
}

ct_future *ct_rpc_async(const char *to, const char *fn, const ct_rpc_args *args, double timeout_s) {
    if (agent_check("ct_rpc_async"))
        return NULL;
    int id = ct_rpc_worker_id(to);
    if (id < 0)
        return NULL;
    if (fn && !strncmp(fn, "ct.", 3)) {
        ct__err_set(CT_EINVAL, "ct_rpc_async: '%s': names beginning 'ct.' are ct's own", fn);
        return NULL;
    }
    return call(id, fn, fn, args, timeout_s, true, 0);
}

static int check_future(const ct_future *f, const char *fn) {
    if (!f)
        return ct__err_set(CT_EINVAL, "%s: the future is NULL", fn);
    if (f->magic != FUTURE_MAGIC)
        return ct__err_set(CT_EINVAL, "%s: %p is not a live ct_future", fn, (const void *)f);
    return 0;
}

int ct_future_wait(ct_future *f, ct_rpc_args **out) {
    int rc = check_future(f, "ct_future_wait");
    if (rc)
        return rc;
    if (out)
        *out = NULL;
    pthread_mutex_lock(&f->mu);
    while (!f->done)
        pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
    if (f->rc)
        return ct__err_set(f->rc, "%s", f->message ? f->message : "rpc: the call failed");
    if (!out)
        return 0;
    /* Each wait hands out its own list with the same values. */
    ct_rpc_args *copy = ct_rpc_args_new();
    if (!copy || (rc = ct__rpc_args_extend(copy, f->result, 0))) {
        ct_rpc_args_free(copy);
        return copy ? rc : ct_errcode();
    }
    *out = copy;
    return 0;
}

int ct_future_then(ct_future *f, ct_future_fn fn, void *ctx) {
    int rc = check_future(f, "ct_future_then");
    if (rc)
        return rc;
    then_cb *cb = fn ? malloc(sizeof *cb) : NULL;
    if (!cb)
        return ct__err_set(fn ? CT_ENOMEM : CT_EINVAL, "ct_future_then: %s",
                           fn ? "out of memory" : "fn is NULL");
    *cb = (then_cb){fn, ctx, NULL};
    pthread_mutex_lock(&f->mu);
    bool done = f->done;
    if (!done) {
        cb->next = f->then;
        f->then = cb;
    }
    pthread_mutex_unlock(&f->mu);
    if (done) {
        fn(f, ctx);
        free(cb);
    }
    return 0;
}

bool ct_future_done(ct_future *f) {
    if (check_future(f, "ct_future_done"))
        return false;
    pthread_mutex_lock(&f->mu);
    bool done = f->done;
    pthread_mutex_unlock(&f->mu);
    return done;
}

void ct_future_free(ct_future *f) {
    if (!f)
        return;
    CT_ASSERT(f->magic == FUTURE_MAGIC && "ct_future_free: not a live future");
    future_unref(f);
}

int ct_rpc_sync(const char *to, const char *fn, const ct_rpc_args *args, double timeout_s,
                ct_rpc_args **out) {
    ct_future *f = ct_rpc_async(to, fn, args, timeout_s);
    if (!f)
        return ct_errcode();
    int rc = ct_future_wait(f, out);
    ct_future_free(f);
    return rc;
}
