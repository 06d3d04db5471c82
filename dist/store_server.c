/* The store server: one ROUTER socket served by one thread, so the table
 * needs no lock and every operation is atomic by construction.
 *
 * Each client is known by its routing id, which the client fixes itself so
 * that it stays the same across reconnections. Per client the server keeps
 * the id of the last request and, once answered, its reply: a resent request
 * gets the cached reply instead of being applied again, which is what makes
 * a resent add safe. A get or wait whose keys are missing becomes a waiter,
 * answered when a later set/add/compare_set supplies them or with a timeout
 * status when its deadline passes.
 *
 * Values are reference-counted blobs: a reply, queued by zmq or cached for a
 * resend, shares the stored value instead of copying it, so what a client
 * that never reads can make the server hold is bounded by the table's own
 * limits. Only clients that prove the job's secret get in (auth.c). */
#include "dist_impl.h"

#include "base_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <zmq.h>

#define SERVER_MAGIC 0x63745353u /* "ctSS" */
#define SERVER_DEAD  0xdeadc7c5u
/* Route, header and the most keys a request may carry. */
#define MAX_FRAMES (CT_STORE_MAX_KEYS + 2)
/* Messages handled before looking at the control socket and deadlines. */
#define BATCH 256
/* A client silent this long is forgotten, with its cached reply. Live
 * clients are never that silent while a request is outstanding: they resend
 * it every second. */
#define CLIENT_IDLE_S 600.0
#define SWEEP_S       60.0
/* Replies zmq may queue for one client that does not read them. */
#define CLIENT_SNDHWM 16

const char *ct__store_op_name(int op) {
    static const char *names[CT__STORE_NOPS] = {
        [CT__STORE_PING] = "connect", [CT__STORE_SET] = "set",      [CT__STORE_GET] = "get",
        [CT__STORE_ADD] = "add",      [CT__STORE_WAIT] = "wait",    [CT__STORE_CAS] = "compare_set",
        [CT__STORE_CHECK] = "check",  [CT__STORE_DELETE] = "delete"};
    return op > 0 && op < CT__STORE_NOPS ? names[op] : "?";
}

/* ------------------------------------------------------------ hash map */

typedef struct entry {
    struct entry *next;
    char *key;
    size_t klen;
    void *val;
} entry;

typedef struct map {
    entry **buckets;
    size_t nbuckets, count;
} map;

static entry **map_slot(map *m, const void *key, size_t klen) {
    if (!m->nbuckets)
        return NULL;
    entry **e = &m->buckets[ct__fnv1a(key, klen) & (m->nbuckets - 1)];
    while (*e && ((*e)->klen != klen || memcmp((*e)->key, key, klen) != 0))
        e = &(*e)->next;
    return e;
}

static entry *map_find(map *m, const void *key, size_t klen) {
    entry **e = map_slot(m, key, klen);
    return e ? *e : NULL;
}

static bool map_grow(map *m) {
    size_t n = m->nbuckets ? 2 * m->nbuckets : 64;
    entry **b = calloc(n, sizeof *b);
    if (!b)
        return false;
    for (size_t i = 0; i < m->nbuckets; i++) {
        for (entry *e = m->buckets[i], *next; e; e = next) {
            next = e->next;
            entry **dst = &b[ct__fnv1a(e->key, e->klen) & (n - 1)];
            e->next = *dst;
            *dst = e;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = n;
    return true;
}

/* The entry for key, created empty (val NULL) if absent; NULL when out of
 * memory. */
static entry *map_upsert(map *m, const void *key, size_t klen) {
    entry *found = map_find(m, key, klen);
    if (found)
        return found;
    if (m->count >= m->nbuckets && !map_grow(m))
        return NULL;
    entry *e = calloc(1, sizeof *e);
    char *k = malloc(klen + 1);
    if (!e || !k) {
        free(e);
        free(k);
        return NULL;
    }
    memcpy(k, key, klen);
    k[klen] = 0;
    e->key = k;
    e->klen = klen;
    entry **slot = &m->buckets[ct__fnv1a(key, klen) & (m->nbuckets - 1)];
    e->next = *slot;
    *slot = e;
    m->count++;
    return e;
}

/* Removes the entry *slot points at, freeing its value with free_val. */
static void map_unlink(map *m, entry **slot, void (*free_val)(void *)) {
    entry *e = *slot;
    *slot = e->next;
    free_val(e->val);
    free(e->key);
    free(e);
    m->count--;
}

static bool map_remove(map *m, const void *key, size_t klen, void (*free_val)(void *)) {
    entry **slot = map_slot(m, key, klen);
    if (!slot || !*slot)
        return false;
    map_unlink(m, slot, free_val);
    return true;
}

static void map_clear(map *m, void (*free_val)(void *)) {
    for (size_t i = 0; i < m->nbuckets; i++)
        while (m->buckets[i])
            map_unlink(m, &m->buckets[i], free_val);
    free(m->buckets);
    memset(m, 0, sizeof *m);
}

int ct__store_limits_from_env(ct__store_limits *l) {
    int rc = ct__dist_env_limit("CT_STORE_MAX_KEYS_TOTAL", (size_t)1 << 20, &l->max_keys);
    if (!rc)
        rc = ct__dist_env_limit("CT_STORE_MAX_BYTES", (size_t)1 << 30, &l->max_bytes);
    if (!rc)
        rc = ct__dist_env_limit("CT_STORE_MAX_CLIENTS", (size_t)1 << 16, &l->max_clients);
    return rc;
}

/* ---------------------------------------------------------------- blobs */

/* An immutable byte string shared by the table, cached replies and zmq's
 * queues; zmq drops its references from its own threads. */
typedef struct blob {
    atomic_size_t refs;
    size_t len;
    unsigned char data[];
} blob;

static blob *blob_new(const void *data, size_t len) {
    blob *b = malloc(sizeof *b + (len ? len : 1));
    if (!b)
        return NULL;
    atomic_init(&b->refs, 1);
    b->len = len;
    if (len)
        memcpy(b->data, data, len);
    return b;
}

static blob *blob_ref(blob *b) {
    if (b)
        atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
    return b;
}

static void blob_unref(void *p) {
    blob *b = p;
    if (b && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
        free(b);
}

static void blob_zmq_free(void *data, void *hint) {
    (void)data;
    CT__ZMQ_HANDBACK(hint);
    blob_unref(hint);
}

/* --------------------------------------------------------------- server */

typedef struct client {
    uint64_t last_id;
    double last_seen;
    bool seen, answered;
    uint8_t hdr[CT__STORE_HDR_LEN];
    blob *payload; /* the last reply's, resent for a repeated request; NULL if none */
} client;

static void client_free(void *p) {
    client *c = p;
    if (c)
        blob_unref(c->payload);
    free(c);
}

typedef struct waiter {
    char *route;
    size_t route_len;
    uint64_t id;
    uint8_t op;
    int nkeys;
    char **keys;
    double deadline;
} waiter;

struct ct_store_server {
    uint32_t magic;
    int port;
    void *ctx, *router, *ctl_in, *ctl_out;
    pthread_t thread;
    bool served; /* thread runs serve(); false for a detached server */
    ct__auth auth;
    ct__store_limits limits;
    map kv;          /* key -> blob */
    size_t kv_bytes; /* keys' and values' bytes in kv */
    map clients;     /* routing id -> client */
    waiter *waiters;
    size_t nwaiters, capwaiters;
    double next_sweep;
};

static void waiter_clear(waiter *w) {
    for (int i = 0; i < w->nkeys; i++)
        free(w->keys[i]);
    free(w->keys);
    free(w->route);
}

static void waiter_remove(ct_store_server *s, size_t i) {
    waiter_clear(&s->waiters[i]);
    s->waiters[i] = s->waiters[--s->nwaiters];
}

/* A ROUTER drops messages for peers that are gone or full, so this never
 * blocks; the payload is sent without a copy. */
static void send_reply(ct_store_server *s, const void *route, size_t rlen, const uint8_t *hdr,
                       blob *payload) {
    zmq_send(s->router, route, rlen, ZMQ_SNDMORE);
    zmq_send(s->router, hdr, CT__STORE_HDR_LEN, payload ? ZMQ_SNDMORE : 0);
    if (!payload)
        return;
    zmq_msg_t m;
    if (zmq_msg_init_data(&m, payload->data, payload->len, blob_zmq_free, blob_ref(payload))) {
        blob_unref(payload);
        return;
    }
    CT__ZMQ_HANDOFF(payload);
    if (zmq_msg_send(&m, s->router, 0) < 0)
        zmq_msg_close(&m);
}

/* Sends (and caches for resends) the reply to request id of the client at
 * route; payload (NULL for none) is borrowed. */
static void reply(ct_store_server *s, const void *route, size_t rlen, uint64_t id, uint8_t op,
                  uint8_t status, blob *payload) {
    client *c = NULL;
    entry *e = map_find(&s->clients, route, rlen);
    uint8_t hdr[CT__STORE_HDR_LEN];
    ct__store_hdr_encode(hdr, &(ct__store_hdr){.op = op, .status = status, .id = id});
    if (e && (c = e->val) && c->last_id == id && !c->answered) {
        c->payload = blob_ref(payload);
        c->answered = true;
        memcpy(c->hdr, hdr, sizeof hdr);
    }
    send_reply(s, route, rlen, hdr, payload);
}

/* Replies with the bytes at data, or with a NOMEM status when they cannot
 * be held. */
static void reply_bytes(ct_store_server *s, const void *route, size_t rlen, uint64_t id, uint8_t op,
                        uint8_t status, const void *data, size_t len) {
    blob *b = blob_new(data, len);
    reply(s, route, rlen, id, op, b ? status : CT__STORE_NOMEM, b);
    blob_unref(b);
}

static void reply_text(ct_store_server *s, const void *route, size_t rlen, uint64_t id, uint8_t op,
                       uint8_t status, const char *fmt, ...) CT_PRINTF(7, 8);
static void reply_text(ct_store_server *s, const void *route, size_t rlen, uint64_t id, uint8_t op,
                       uint8_t status, const char *fmt, ...) {
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    reply_bytes(s, route, rlen, id, op, status, text, strlen(text));
}

/* The keys of w not yet in the table, quoted and comma-separated. */
static void missing_keys(ct_store_server *s, const waiter *w, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < w->nkeys && n < size; i++) {
        if (map_find(&s->kv, w->keys[i], strlen(w->keys[i])))
            continue;
        int k = snprintf(buf + n, size - n, "%s'%s'", n ? ", " : "", w->keys[i]);
        n += k > 0 ? (size_t)k : 0;
    }
}

/* Answers w if its keys are all present; true if it did. */
static bool waiter_try(ct_store_server *s, const waiter *w) {
    for (int i = 0; i < w->nkeys; i++)
        if (!map_find(&s->kv, w->keys[i], strlen(w->keys[i])))
            return false;
    if (w->op == CT__STORE_GET) {
        entry *e = map_find(&s->kv, w->keys[0], strlen(w->keys[0]));
        reply(s, w->route, w->route_len, w->id, w->op, CT__STORE_OK, e->val);
    } else {
        reply(s, w->route, w->route_len, w->id, w->op, CT__STORE_OK, NULL);
    }
    return true;
}

static void wake_waiters(ct_store_server *s) {
    for (size_t i = 0; i < s->nwaiters;) {
        if (waiter_try(s, &s->waiters[i]))
            waiter_remove(s, i);
        else
            i++;
    }
}

static void expire_waiters(ct_store_server *s) {
    double now = ct__now();
    for (size_t i = 0; i < s->nwaiters;) {
        waiter *w = &s->waiters[i];
        if (w->deadline > now) {
            i++;
            continue;
        }
        char missing[400];
        missing_keys(s, w, missing, sizeof missing);
        reply_text(s, w->route, w->route_len, w->id, w->op, CT__STORE_TIMEOUT, "%s", missing);
        waiter_remove(s, i);
    }
}

static void drop_waiters_of(ct_store_server *s, const void *route, size_t rlen) {
    for (size_t i = 0; i < s->nwaiters;) {
        waiter *w = &s->waiters[i];
        if (w->route_len == rlen && memcmp(w->route, route, rlen) == 0)
            waiter_remove(s, i);
        else
            i++;
    }
}

/* Parks a get/wait until its keys exist; false when out of memory. */
static bool add_waiter(ct_store_server *s, const void *route, size_t rlen, const ct__store_hdr *h,
                       zmq_msg_t *keys, int nkeys) {
    if (CT__GROW(s->waiters, &s->capwaiters, s->nwaiters + 1, 0, "store server: waiters"))
        return false;
    waiter w = {.route = malloc(rlen),
                .route_len = rlen,
                .id = h->id,
                .op = h->op,
                .keys = calloc((size_t)nkeys, sizeof(char *)),
                .deadline = ct__now() + 1e-3 * h->timeout_ms};
    bool ok = w.route && w.keys;
    for (int i = 0; ok && i < nkeys; i++, w.nkeys++) {
        size_t len = zmq_msg_size(&keys[i]);
        ok = (w.keys[i] = malloc(len + 1)) != NULL;
        if (ok) {
            memcpy(w.keys[i], zmq_msg_data(&keys[i]), len);
            w.keys[i][len] = 0;
        }
    }
    if (!ok) {
        waiter_clear(&w);
        return false;
    }
    memcpy(w.route, route, rlen);
    s->waiters[s->nwaiters++] = w;
    return true;
}

/* Parses a decimal int64 counter value. */
static bool parse_counter(const void *val, size_t len, int64_t *out) {
    char buf[32];
    if (len == 0 || len >= sizeof buf)
        return false;
    memcpy(buf, val, len);
    buf[len] = 0;
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end || !(buf[0] == '-' || (buf[0] >= '0' && buf[0] <= '9')))
        return false;
    *out = v;
    return true;
}

/* The number of argument frames each operation takes: exactly, or at least
 * 1 (-1) for the ones that take a list of keys. */
static int op_nargs(int op) {
    switch (op) {
    case CT__STORE_PING: return 0;
    case CT__STORE_GET:
    case CT__STORE_DELETE: return 1;
    case CT__STORE_SET:
    case CT__STORE_ADD: return 2;
    case CT__STORE_CAS: return 3;
    default: return -1;
    }
}

/* Why the arguments of a request are unacceptable, or NULL. Frame sizes come
 * off the wire, so every one is bounded here. */
static const char *check_args(const ct__store_hdr *h, zmq_msg_t *args, int nargs, bool truncated,
                              char *why, size_t size) {
    int want = op_nargs(h->op);
    if (truncated || (want >= 0 && nargs != want) ||
        (want < 0 && (nargs < 1 || nargs > CT_STORE_MAX_KEYS))) {
        snprintf(why, size, "%s takes %s%d argument frames, got %s%d", ct__store_op_name(h->op),
                 want < 0 ? "1 to " : "", want < 0 ? CT_STORE_MAX_KEYS : want,
                 truncated ? "more than " : "", nargs);
        return why;
    }
    int nkeys = want < 0 ? nargs : (nargs > 0 ? 1 : 0);
    for (int i = 0; i < nkeys; i++) {
        size_t len = zmq_msg_size(&args[i]);
        if (len == 0 || len > CT_STORE_MAX_KEY || memchr(zmq_msg_data(&args[i]), 0, len)) {
            snprintf(why, size, "key %d is %zu bytes%s; expected 1 to %d bytes without NUL", i, len,
                     len && len <= CT_STORE_MAX_KEY ? " with a NUL" : "", CT_STORE_MAX_KEY);
            return why;
        }
    }
    for (int i = nkeys; i < nargs; i++) {
        if (zmq_msg_size(&args[i]) > CT_STORE_MAX_VALUE) {
            snprintf(why, size, "value of %zu bytes is over the limit of %d",
                     zmq_msg_size(&args[i]), CT_STORE_MAX_VALUE);
            return why;
        }
    }
    if (h->op == CT__STORE_ADD && zmq_msg_size(&args[1]) != 8) {
        snprintf(why, size, "add's delta is %zu bytes; expected 8", zmq_msg_size(&args[1]));
        return why;
    }
    return NULL;
}

/* Why storing len bytes under key would pass one of the table's limits
 * (written into why), or NULL. */
static const char *over_limit(ct_store_server *s, const void *key, size_t klen, size_t len,
                              char *why, size_t size) {
    entry *e = map_find(&s->kv, key, klen);
    size_t keys = s->kv.count + (e ? 0 : 1);
    size_t bytes = s->kv_bytes - (e ? klen + ((blob *)e->val)->len : 0) + klen + len;
    if (keys > s->limits.max_keys)
        snprintf(why, size,
                 "the store holds %zu keys, its limit (CT_STORE_MAX_KEYS_TOTAL=%zu); delete keys "
                 "or raise the limit",
                 s->kv.count, s->limits.max_keys);
    else if (bytes > s->limits.max_bytes)
        snprintf(why, size,
                 "storing %zu bytes would make the store hold %zu bytes, over its limit "
                 "(CT_STORE_MAX_BYTES=%zu)",
                 klen + len, bytes, s->limits.max_bytes);
    else
        return NULL;
    return why;
}

/* Stores val under key; the entry, or NULL when out of memory (leaving the
 * table as it was). The caller checked over_limit(). */
static entry *kv_put_blob(ct_store_server *s, const void *key, size_t klen, blob *val) {
    entry *e = map_upsert(&s->kv, key, klen);
    if (!e)
        return NULL;
    if (e->val)
        s->kv_bytes -= klen + ((blob *)e->val)->len;
    blob_unref(e->val);
    e->val = blob_ref(val);
    s->kv_bytes += klen + val->len;
    return e;
}

static entry *kv_put(ct_store_server *s, const void *key, size_t klen, const void *val,
                     size_t len) {
    blob *b = blob_new(val, len);
    entry *e = b ? kv_put_blob(s, key, klen, b) : NULL;
    blob_unref(b);
    return e;
}

static void kv_remove(ct_store_server *s, entry **slot) {
    s->kv_bytes -= (*slot)->klen + ((blob *)(*slot)->val)->len;
    map_unlink(&s->kv, slot, blob_unref);
}

/* Applies one valid request and answers it (or parks it as a waiter). */
static void execute(ct_store_server *s, const void *route, size_t rlen, const ct__store_hdr *h,
                    zmq_msg_t *args, int nargs) {
#define ANSWER(status, b)  reply(s, route, rlen, h->id, h->op, status, b)
#define ANSWER_BYTES(p, n) reply_bytes(s, route, rlen, h->id, h->op, CT__STORE_OK, p, n)
#define OOM()              reply_text(s, route, rlen, h->id, h->op, CT__STORE_NOMEM, "server out of memory")
#define REFUSE_IF_FULL(vlen)                                                                       \
    do {                                                                                           \
        char why_[256];                                                                            \
        if (over_limit(s, key, klen, vlen, why_, sizeof why_)) {                                   \
            reply_text(s, route, rlen, h->id, h->op, CT__STORE_FULL, "%s", why_);                  \
            return;                                                                                \
        }                                                                                          \
    } while (0)
    const char *key = nargs ? zmq_msg_data(&args[0]) : NULL;
    size_t klen = nargs ? zmq_msg_size(&args[0]) : 0;
    switch (h->op) {
    case CT__STORE_PING: ANSWER(CT__STORE_OK, NULL); return;
    case CT__STORE_SET: {
        REFUSE_IF_FULL(zmq_msg_size(&args[1]));
        if (!kv_put(s, key, klen, zmq_msg_data(&args[1]), zmq_msg_size(&args[1]))) {
            OOM();
            return;
        }
        ANSWER(CT__STORE_OK, NULL);
        wake_waiters(s);
        return;
    }
    case CT__STORE_GET:
    case CT__STORE_WAIT: {
        int nkeys = h->op == CT__STORE_GET ? 1 : nargs;
        if (!add_waiter(s, route, rlen, h, args, nkeys)) {
            OOM();
            return;
        }
        if (waiter_try(s, &s->waiters[s->nwaiters - 1]))
            waiter_remove(s, s->nwaiters - 1);
        else if (h->timeout_ms == 0)
            expire_waiters(s);
        return;
    }
    case CT__STORE_ADD: {
        int64_t delta = (int64_t)ct__store_get_u64(zmq_msg_data(&args[1])), old = 0, sum;
        entry *e = map_find(&s->kv, key, klen);
        blob *cur = e ? e->val : NULL;
        if (cur && !parse_counter(cur->data, cur->len, &old)) {
            reply_text(s, route, rlen, h->id, h->op, CT__STORE_REFUSED,
                       "the value (%zu bytes) is not a decimal integer", cur->len);
            return;
        }
        if (__builtin_add_overflow(old, delta, &sum)) {
            reply_text(s, route, rlen, h->id, h->op, CT__STORE_RANGE,
                       "%" PRId64 " + %" PRId64 " overflows int64", old, delta);
            return;
        }
        char text[32];
        int n = snprintf(text, sizeof text, "%" PRId64, sum);
        REFUSE_IF_FULL((size_t)n);
        if (!kv_put(s, key, klen, text, (size_t)n)) {
            OOM();
            return;
        }
        uint8_t out[8];
        ct__store_put_u64(out, (uint64_t)sum);
        ANSWER_BYTES(out, sizeof out);
        wake_waiters(s);
        return;
    }
    case CT__STORE_CAS: {
        zmq_msg_t *expected = &args[1], *desired = &args[2];
        entry *e = map_find(&s->kv, key, klen);
        blob *cur = e ? e->val : NULL;
        bool match = cur ? cur->len == zmq_msg_size(expected) &&
                               memcmp(cur->data, zmq_msg_data(expected), cur->len) == 0
                         : zmq_msg_size(expected) == 0;
        if (!match) {
            if (cur)
                ANSWER(CT__STORE_OK, cur);
            else
                ANSWER_BYTES(zmq_msg_data(expected), zmq_msg_size(expected));
            return;
        }
        REFUSE_IF_FULL(zmq_msg_size(desired));
        if (!(e = kv_put(s, key, klen, zmq_msg_data(desired), zmq_msg_size(desired)))) {
            OOM();
            return;
        }
        ANSWER(CT__STORE_OK, e->val);
        wake_waiters(s);
        return;
    }
    case CT__STORE_CHECK: {
        uint8_t all = 1;
        for (int i = 0; i < nargs; i++)
            all &= map_find(&s->kv, zmq_msg_data(&args[i]), zmq_msg_size(&args[i])) != NULL;
        ANSWER_BYTES(&all, 1);
        return;
    }
    case CT__STORE_DELETE: {
        entry **slot = map_slot(&s->kv, key, klen);
        uint8_t existed = slot && *slot;
        if (existed)
            kv_remove(s, slot);
        ANSWER_BYTES(&existed, 1);
        return;
    }
    }
#undef ANSWER
#undef ANSWER_BYTES
#undef OOM
#undef REFUSE_IF_FULL
}

/* frames[0] is the routing id, frames[1] the header. */
static void handle(ct_store_server *s, zmq_msg_t *frames, int n, bool truncated) {
    ct__store_hdr h;
    if (n < 2 || !ct__store_hdr_decode(zmq_msg_data(&frames[1]), zmq_msg_size(&frames[1]), &h))
        return; /* not this protocol: nothing to answer to */
    const void *route = zmq_msg_data(&frames[0]);
    size_t rlen = zmq_msg_size(&frames[0]);
    if (!map_find(&s->clients, route, rlen) && s->clients.count >= s->limits.max_clients) {
        reply_text(s, route, rlen, h.id, h.op, CT__STORE_FULL,
                   "the store serves %zu clients, its limit (CT_STORE_MAX_CLIENTS=%zu)",
                   s->clients.count, s->limits.max_clients);
        return;
    }
    entry *e = map_upsert(&s->clients, route, rlen);
    if (!e || (!e->val && !(e->val = calloc(1, sizeof(client))))) {
        if (e)
            map_remove(&s->clients, route, rlen, client_free);
        return;
    }
    client *c = e->val;
    c->last_seen = ct__now();
    if (c->seen && h.id <= c->last_id) {
        /* A resend: answer it again if answered; a pending one is still
         * parked, and anything older is stale. */
        if (h.id == c->last_id && c->answered)
            send_reply(s, route, rlen, c->hdr, c->payload);
        return;
    }
    drop_waiters_of(s, route, rlen);
    blob_unref(c->payload);
    *c = (client){.last_id = h.id, .last_seen = c->last_seen, .seen = true};
    char why[256];
    if (check_args(&h, frames + 2, n - 2, truncated, why, sizeof why)) {
        reply_text(s, route, rlen, h.id, h.op, CT__STORE_REFUSED, "%s", why);
        return;
    }
    execute(s, route, rlen, &h, frames + 2, n - 2);
}

/* Receives one whole message (at most MAX_FRAMES frames kept, the rest
 * drained) and handles it; false when none is waiting. */
static bool serve_one(ct_store_server *s) {
    zmq_msg_t frames[MAX_FRAMES];
    int n = 0;
    bool truncated = false, more = true;
    while (more) {
        zmq_msg_t scratch, *m = n < MAX_FRAMES ? &frames[n] : &scratch;
        zmq_msg_init(m);
        if (ct__dist_zmq_recv(m, s->router, n ? 0 : ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            break;
        }
        more = zmq_msg_more(m);
        if (m == &scratch) {
            truncated = true;
            zmq_msg_close(m);
        } else {
            n++;
        }
    }
    if (n)
        handle(s, frames, n, truncated);
    for (int i = 0; i < n; i++)
        zmq_msg_close(&frames[i]);
    return n > 0;
}

/* Forgets clients that have gone quiet, so that a long job whose processes
 * come and go does not accumulate their states. */
static void sweep_clients(ct_store_server *s, double now) {
    for (size_t i = 0; i < s->clients.nbuckets; i++) {
        for (entry **e = &s->clients.buckets[i]; *e;) {
            entry *dead = *e;
            if (now - ((client *)dead->val)->last_seen < CLIENT_IDLE_S) {
                e = &dead->next;
                continue;
            }
            drop_waiters_of(s, dead->key, dead->klen);
            map_unlink(&s->clients, e, client_free);
        }
    }
    s->next_sweep = now + SWEEP_S;
}

static void *serve(void *arg) {
    ct_store_server *s = arg;
    for (;;) {
        double now = ct__now();
        if (now >= s->next_sweep)
            sweep_clients(s, now);
        long timeout_ms = (long)((s->next_sweep - now) * 1e3) + 1;
        for (size_t i = 0; i < s->nwaiters; i++) {
            double left = s->waiters[i].deadline - now;
            long ms = left > 0 ? (long)(left * 1e3) + 1 : 0;
            if (ms < timeout_ms)
                timeout_ms = ms;
        }
        zmq_pollitem_t items[] = {{s->ctl_in, 0, ZMQ_POLLIN, 0},
                                  {s->router, 0, ZMQ_POLLIN, 0},
                                  {NULL, s->auth.fd, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, 3, timeout_ms) < 0 && zmq_errno() != EINTR)
            break;
        if (items[0].revents)
            break;
        if (items[2].revents)
            ct__auth_serve(&s->auth);
        for (int i = 0; i < BATCH && serve_one(s); i++)
            ;
        expire_waiters(s);
    }
    return NULL;
}

static void server_close(ct_store_server *s) {
    if (s->router)
        zmq_close(s->router);
    ct__auth_close(&s->auth);
    if (s->ctl_in)
        zmq_close(s->ctl_in);
    if (s->ctl_out)
        zmq_close(s->ctl_out);
    if (s->ctx)
        zmq_ctx_term(s->ctx);
    for (size_t i = 0; i < s->nwaiters; i++)
        waiter_clear(&s->waiters[i]);
    free(s->waiters);
    map_clear(&s->kv, blob_unref);
    map_clear(&s->clients, client_free);
    s->magic = SERVER_DEAD;
    free(s);
}

static void *zsocket(ct_store_server *s, int type) {
    void *sock = zmq_socket(s->ctx, type);
    int zero = 0;
    if (sock)
        zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    return sock;
}

ct_store_server *ct_store_server_new(const char *host, int port) {
    if (port < 0 || port > 65535) {
        ct__err_set(CT_EINVAL, "store server: port %d is outside [0, 65535] (0 picks a free one)",
                    port);
        return NULL;
    }
    if (!host)
        host = "127.0.0.1";
    ct_store_server *s = calloc(1, sizeof *s);
    if (!s) {
        ct__err_set(CT_ENOMEM, "store server: out of memory");
        return NULL;
    }
    s->magic = SERVER_MAGIC;
    if (ct__store_limits_from_env(&s->limits)) {
        server_close(s);
        return NULL;
    }
    if (!(s->ctx = zmq_ctx_new()) || !(s->router = zsocket(s, ZMQ_ROUTER)) ||
        !(s->ctl_in = zsocket(s, ZMQ_PAIR)) || !(s->ctl_out = zsocket(s, ZMQ_PAIR)) ||
        zmq_bind(s->ctl_in, "inproc://ct-store-ctl") != 0 ||
        zmq_connect(s->ctl_out, "inproc://ct-store-ctl") != 0) {
        ct__err_set(CT_EFOREIGN, "store server: cannot set up zmq: %s", zmq_strerror(zmq_errno()));
        server_close(s);
        return NULL;
    }
    if (ct__auth_listen(s->ctx, s->router, &s->auth, "the store server")) {
        server_close(s);
        return NULL;
    }
    int one = 1, hwm = CLIENT_SNDHWM;
    int64_t maxmsg = (int64_t)CT_STORE_MAX_VALUE + 64;
    zmq_setsockopt(s->router, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    zmq_setsockopt(s->router, ZMQ_SNDHWM, &hwm, sizeof hwm);
    char endpoint[300];
    if (port)
        snprintf(endpoint, sizeof endpoint, "tcp://%s:%d", host, port);
    else
        snprintf(endpoint, sizeof endpoint, "tcp://%s:*", host);
    if (zmq_bind(s->router, endpoint) != 0) {
        ct__err_set(CT_EIO, "store server: cannot listen on %s: %s", endpoint,
                    zmq_strerror(zmq_errno()));
        server_close(s);
        return NULL;
    }
    char last[300];
    size_t len = sizeof last;
    const char *colon;
    if (zmq_getsockopt(s->router, ZMQ_LAST_ENDPOINT, last, &len) != 0 ||
        !(colon = strrchr(last, ':'))) {
        ct__err_set(CT_EFOREIGN, "store server: cannot tell the port bound for %s", endpoint);
        server_close(s);
        return NULL;
    }
    s->port = atoi(colon + 1);
    int rc = pthread_create(&s->thread, NULL, serve, s);
    s->served = rc == 0;
    if (rc != 0) {
        ct__err_set(CT_EFOREIGN, "store server: cannot start its thread: %s", strerror(rc));
        server_close(s);
        return NULL;
    }
    return s;
}

int ct_store_server_port(const ct_store_server *s) {
    if (!s || s->magic != SERVER_MAGIC)
        return ct__err_set(CT_EINVAL, "store server: %s handle", s ? "freed or foreign" : "NULL");
    return s->port;
}

void ct_store_server_free(ct_store_server *s) {
    if (!s)
        return;
    CT_ASSERT(s->magic == SERVER_MAGIC);
    if (s->served) {
        zmq_send(s->ctl_out, "", 0, 0);
        pthread_join(s->thread, NULL);
    }
    server_close(s);
}

ct_store_server *ct__store_server_new_detached(void) {
    ct_store_server *s = calloc(1, sizeof *s);
    if (!s) {
        ct__err_set(CT_ENOMEM, "store server: out of memory");
        return NULL;
    }
    s->magic = SERVER_MAGIC;
    if (ct__store_limits_from_env(&s->limits) || !(s->ctx = zmq_ctx_new()) ||
        !(s->router = zsocket(s, ZMQ_ROUTER))) {
        if (!ct_errcode())
            ct__err_set(CT_EFOREIGN, "store server: cannot set up zmq: %s",
                        zmq_strerror(zmq_errno()));
        server_close(s);
        return NULL;
    }
    s->next_sweep = ct__now() + SWEEP_S;
    return s;
}

void ct__store_server_feed(ct_store_server *s, zmq_msg_t *frames, int n, bool truncated) {
    handle(s, frames, n, truncated);
    expire_waiters(s);
}

bool ct__store_server_consistent(const ct_store_server *s) {
    size_t bytes = 0, keys = 0;
    for (size_t i = 0; i < s->kv.nbuckets; i++)
        for (const entry *e = s->kv.buckets[i]; e; e = e->next, keys++)
            bytes += e->klen + ((const blob *)e->val)->len;
    return keys == s->kv.count && bytes == s->kv_bytes && keys <= s->limits.max_keys &&
           bytes <= s->limits.max_bytes && s->clients.count <= s->limits.max_clients &&
           s->nwaiters <= s->clients.count;
}
