/* The store client: a DEALER socket with a fixed routing id, so the server
 * knows it again after zmq reconnects it. Every request carries a new id and
 * is resent with the same id until its reply arrives or the deadline passes;
 * the server answers a resend from its cache, so nothing is applied twice,
 * and replies to older ids are dropped here. A monitor socket tells whether
 * the connection is up, which turns a silent deadline into CT_EPEER when the
 * server is gone, and whether the server refused the job's secret. */
#include "dist_impl.h"

#include "base_impl.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define STORE_MAGIC 0x63745343u /* "ctSC" */
#define STORE_DEAD  0xdeadc7c3u
/* How often an unanswered request is resent; covers a request lost with a
 * dropped connection. */
#define RESEND_S  1.0
#define ROUTE_LEN 16

struct ct_store {
    uint32_t magic;
    int port;
    double timeout_s;
    void *ctx, *sock, *monitor;
    uint64_t next_id;
    bool connected, ever_connected, refused;
    char host[256];
};

/* An argument frame of a request. */
typedef struct frame {
    const void *data;
    size_t len;
} frame;

/* What a request is about, for messages: "get 'rank3/addr'". */
typedef struct call {
    uint8_t op;
    const char *const *keys;
    int nkeys;
    double timeout_s;
} call;

static void describe_keys(char *buf, size_t size, const char *const *keys, int nkeys) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < nkeys && n + 1 < size; i++) {
        int k = snprintf(buf + n, size - n, "%s'%s'", i ? ", " : "", keys[i]);
        n += k > 0 ? (size_t)k : 0;
    }
    if (n >= size && size > 4)
        memcpy(buf + size - 4, "...", 4);
}

#define DESC_LEN 256
#define STORE_ERR(code, c, fmt, ...)                                                               \
    ({                                                                                             \
        char desc_[DESC_LEN];                                                                      \
        describe_keys(desc_, sizeof desc_, (c)->keys, (c)->nkeys);                                 \
        ct__err_set(code, "store %s%s%s: " fmt, ct__store_op_name((c)->op), desc_[0] ? " " : "",   \
                    desc_, ##__VA_ARGS__);                                                         \
    })

static int check_handle(const ct_store *s, const char *op) {
    if (!s || s->magic != STORE_MAGIC)
        return ct__err_set(CT_EINVAL, "store %s: %s client handle", op,
                           s ? "freed or foreign" : "NULL");
    return 0;
}

static int check_key(const char *key, const char *op, int i) {
    size_t len = key ? strnlen(key, CT_STORE_MAX_KEY + 1) : 0;
    if (!key || len == 0 || len > CT_STORE_MAX_KEY)
        return ct__err_set(CT_EINVAL, "store %s: key %d is %s; expected 1 to %d bytes", op, i,
                           !key  ? "NULL"
                           : len ? "too long"
                                 : "empty",
                           CT_STORE_MAX_KEY);
    return 0;
}

static int check_value(const void *v, size_t len, const char *what, const char *op) {
    if (!v && len)
        return ct__err_set(CT_EINVAL, "store %s: %s is NULL but its length is %zu", op, what, len);
    if (len > CT_STORE_MAX_VALUE)
        return ct__err_set(CT_EINVAL, "store %s: %s of %zu bytes is over the limit of %d bytes", op,
                           what, len, CT_STORE_MAX_VALUE);
    return 0;
}

/* Replaces a negative timeout by the default; rejects 0, NaN and infinity,
 * which would either never wait or wait forever. */
static int resolve_timeout(const ct_store *s, double *t, const char *op) {
    if (*t < 0)
        *t = s->timeout_s;
    if (!(*t > 0) || !isfinite(*t))
        return ct__err_set(CT_EINVAL,
                           "store %s: timeout %g s; expected a finite number of seconds > 0 "
                           "(or < 0 for the client's default)",
                           op, *t);
    return 0;
}

static void drain_monitor(ct_store *s) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    while (zmq_msg_recv(&m, s->monitor, ZMQ_DONTWAIT) >= 0) {
        bool first = zmq_msg_size(&m) >= 2;
        uint16_t event = 0;
        if (first)
            memcpy(&event, zmq_msg_data(&m), sizeof event);
        while (zmq_msg_more(&m) && ct__dist_zmq_recv(&m, s->monitor, 0) >= 0)
            ;
        /* Connected means through the handshake, which proves the secret. */
        if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
            s->connected = s->ever_connected = true;
        else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            s->refused = true;
        else if (event == ZMQ_EVENT_DISCONNECTED || event == ZMQ_EVENT_CLOSED)
            s->connected = false;
    }
    zmq_msg_close(&m);
}

static bool send_request(ct_store *s, const ct__store_hdr *h, const frame *args, int nargs) {
    uint8_t hdr[CT__STORE_HDR_LEN];
    ct__store_hdr_encode(hdr, h);
    /* Once the first frame is queued zmq queues the rest of the message. */
    if (zmq_send(s->sock, hdr, sizeof hdr, ZMQ_DONTWAIT | (nargs ? ZMQ_SNDMORE : 0)) < 0)
        return false;
    for (int i = 0; i < nargs; i++)
        zmq_send(s->sock, args[i].data, args[i].len, i + 1 < nargs ? ZMQ_SNDMORE : 0);
    return true;
}

/* Receives one message: -1 when none is waiting, 1 when it is the reply to
 * request id (with *h and the payload, if any), 0 for anything else (a late
 * reply to an earlier request, or garbage). A payload frame is received into
 * *payload, which zmq_msg_recv() empties first. */
static int recv_reply(ct_store *s, uint64_t id, ct__store_hdr *h, zmq_msg_t *payload,
                      bool *has_payload) {
    zmq_msg_t hdr;
    zmq_msg_init(&hdr);
    if (zmq_msg_recv(&hdr, s->sock, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&hdr);
        return -1;
    }
    bool ok = ct__store_hdr_decode(zmq_msg_data(&hdr), zmq_msg_size(&hdr), h) && h->id == id;
    bool more = zmq_msg_more(&hdr);
    zmq_msg_close(&hdr);
    *has_payload = false;
    if (more && ct__dist_zmq_recv(payload, s->sock, 0) >= 0) {
        *has_payload = true;
        more = zmq_msg_more(payload);
    }
    while (more) {
        zmq_msg_t extra;
        zmq_msg_init(&extra);
        more = ct__dist_zmq_recv(&extra, s->sock, 0) >= 0 && zmq_msg_more(&extra);
        zmq_msg_close(&extra);
    }
    return ok;
}

static int status_error(ct_store *s, const call *c, uint8_t status, zmq_msg_t *payload,
                        bool has_payload) {
    int len = has_payload ? (int)(zmq_msg_size(payload) < 400 ? zmq_msg_size(payload) : 400) : 0;
    const char *text = has_payload ? zmq_msg_data(payload) : "";
    switch (status) {
    case CT__STORE_TIMEOUT:
        return STORE_ERR(CT_ETIMEDOUT, c,
                         "timed out after %.1f s waiting for %.*s (server %s:%d); is the process "
                         "that sets it running?",
                         c->timeout_s, len, text, s->host, s->port);
    case CT__STORE_REFUSED:
        return STORE_ERR(CT_EINVAL, c, "the server at %s:%d refused the request: %.*s", s->host,
                         s->port, len, text);
    case CT__STORE_RANGE: return STORE_ERR(CT_ERANGE, c, "%.*s", len, text);
    case CT__STORE_NOMEM:
        return STORE_ERR(CT_ENOMEM, c, "the server at %s:%d is out of memory", s->host, s->port);
    case CT__STORE_FULL:
        return STORE_ERR(CT_ENOMEM, c, "the server at %s:%d is full: %.*s", s->host, s->port, len,
                         text);
    default:
        return STORE_ERR(CT_ECORRUPT, c, "the server at %s:%d answered with unknown status %d",
                         s->host, s->port, status);
    }
}

/* Sends the request described by c with args and waits for its reply until
 * the deadline; on success *payload holds the reply's payload (initialised
 * by the caller) and *has_payload tells whether there was one. */
static int roundtrip(ct_store *s, const call *c, const frame *args, int nargs, zmq_msg_t *payload,
                     bool *has_payload) {
    double start = ct__now(), deadline = start + c->timeout_s, next_send = start;
    bool waits = c->op == CT__STORE_GET || c->op == CT__STORE_WAIT;
    ct__store_hdr h = {.op = c->op, .id = ++s->next_id};
    for (;;) {
        double now = ct__now();
        if (now >= deadline)
            break;
        if (now >= next_send) {
            /* A waiting request ends on the server a little before the
             * client's deadline, so the server's answer (naming the missing
             * keys) arrives in time. */
            double left = deadline - now, margin = waits ? fmin(0.1, 0.1 * left) : 0;
            h.timeout_ms = (uint32_t)fmin((left - margin) * 1e3, 4e9);
            next_send = now + (send_request(s, &h, args, nargs) ? RESEND_S : 0.05);
        }
        double until = fmin(deadline, next_send);
        zmq_pollitem_t items[] = {{s->sock, 0, ZMQ_POLLIN, 0}, {s->monitor, 0, ZMQ_POLLIN, 0}};
        long ms = (long)ceil((until - now) * 1e3);
        if (zmq_poll(items, 2, ms > 0 ? ms : 0) < 0 && zmq_errno() != EINTR)
            return STORE_ERR(CT_EFOREIGN, c, "zmq_poll failed: %s", zmq_strerror(zmq_errno()));
        if (items[1].revents)
            drain_monitor(s);
        if (s->refused)
            return STORE_ERR(CT_EAUTH, c,
                             "the store server at %s:%d refused this process's job secret; every "
                             "process of a job needs the same one (ctlaunch's, or CT_JOB_SECRET / "
                             "CT_SECRET_FILE, docs/security.md)",
                             s->host, s->port);
        if (!items[0].revents)
            continue;
        ct__store_hdr r = {0};
        int got;
        while ((got = recv_reply(s, h.id, &r, payload, has_payload)) >= 0) {
            if (got == 1)
                return r.status == CT__STORE_OK
                           ? 0
                           : status_error(s, c, r.status, payload, *has_payload);
        }
    }
    drain_monitor(s);
    if (!s->connected)
        return STORE_ERR(CT_EPEER, c,
                         "the store server at %s:%d is unreachable (%s) after %.1f s; is it "
                         "(ctlaunch or rank 0) running?",
                         s->host, s->port,
                         s->ever_connected ? "the connection was lost" : "never connected",
                         c->timeout_s);
    if (waits)
        return STORE_ERR(CT_ETIMEDOUT, c,
                         "timed out after %.1f s waiting for the key%s (server %s:%d); is the "
                         "process that sets it running?",
                         c->timeout_s, c->nkeys > 1 ? "s" : "", s->host, s->port);
    return STORE_ERR(CT_ETIMEDOUT, c, "the server at %s:%d did not answer within %.1f s", s->host,
                     s->port, c->timeout_s);
}

/* Checks the handle and timeout shared by every operation. */
static int begin(ct_store *s, call *c) {
    const char *op = ct__store_op_name(c->op);
    int rc = check_handle(s, op);
    if (rc == 0)
        rc = resolve_timeout(s, &c->timeout_s, op);
    for (int i = 0; rc == 0 && i < c->nkeys; i++)
        rc = check_key(c->keys[i], op, i);
    return rc;
}

/* Copies a reply payload into a malloc'd, NUL-terminated block. */
static int take_value(const call *c, zmq_msg_t *payload, bool has_payload, void **value,
                      size_t *len) {
    size_t n = has_payload ? zmq_msg_size(payload) : 0;
    char *copy = malloc(n + 1);
    if (!copy)
        return STORE_ERR(CT_ENOMEM, c, "cannot allocate %zu bytes for the value", n + 1);
    if (n)
        memcpy(copy, zmq_msg_data(payload), n);
    copy[n] = 0;
    *value = copy;
    *len = n;
    return 0;
}

/* Runs the request c (checked by begin()) and, when value is not NULL,
 * returns the reply's payload as by take_value(). */
static int request(ct_store *s, const call *c, const frame *args, int nargs, void **value,
                   size_t *len) {
    zmq_msg_t payload;
    zmq_msg_init(&payload);
    bool has_payload = false;
    int rc = roundtrip(s, c, args, nargs, &payload, &has_payload);
    if (rc == 0 && value)
        rc = take_value(c, &payload, has_payload, value, len);
    zmq_msg_close(&payload);
    return rc;
}

/* An empty routing id would let zmq pick one per connection, and the server
 * would see a reconnected client as a new one; a random fixed one keeps it
 * the same. zmq refuses ids that start with a zero byte. */
static void make_route(uint8_t route[ROUTE_LEN]) {
    if (getrandom(route, ROUTE_LEN, 0) != ROUTE_LEN) {
        uint64_t x = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(ct__now() * 1e9) ^
                     (uint64_t)(uintptr_t)route;
        for (int i = 0; i < ROUTE_LEN; i++, x = x * 6364136223846793005ull + 1)
            route[i] = (uint8_t)(x >> 56);
    }
    route[0] = 'c';
}

ct_store *ct_store_connect(const char *host, int port, double timeout_s) {
    if (!host || !*host || strlen(host) >= 256) {
        ct__err_set(CT_EINVAL, "store connect: host is %s; expected an address or host name",
                    !host   ? "NULL"
                    : *host ? "longer than 255 bytes"
                            : "empty");
        return NULL;
    }
    if (port < 1 || port > 65535 || !(timeout_s > 0) || !isfinite(timeout_s)) {
        ct__err_set(CT_EINVAL,
                    "store connect %s:%d: expected a port in [1, 65535] and a finite timeout > 0 "
                    "(got %g s)",
                    host, port, timeout_s);
        return NULL;
    }
    ct_store *s = calloc(1, sizeof *s);
    if (!s) {
        ct__err_set(CT_ENOMEM, "store connect %s:%d: out of memory", host, port);
        return NULL;
    }
    s->magic = STORE_MAGIC;
    s->port = port;
    s->timeout_s = timeout_s;
    snprintf(s->host, sizeof s->host, "%s", host);
    uint8_t route[ROUTE_LEN];
    make_route(route);
    int zero = 0, ivl = 100, ivl_max = 1000;
    char endpoint[300];
    snprintf(endpoint, sizeof endpoint, "tcp://%s:%d", host, port);
    if (!(s->ctx = zmq_ctx_new()) || !(s->sock = zmq_socket(s->ctx, ZMQ_DEALER)) ||
        zmq_setsockopt(s->sock, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_setsockopt(s->sock, ZMQ_ROUTING_ID, route, sizeof route) != 0 ||
        zmq_setsockopt(s->sock, ZMQ_RECONNECT_IVL, &ivl, sizeof ivl) != 0 ||
        zmq_setsockopt(s->sock, ZMQ_RECONNECT_IVL_MAX, &ivl_max, sizeof ivl_max) != 0 ||
        zmq_socket_monitor(s->sock, "inproc://ct-store-monitor",
                           ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED) != 0 ||
        !(s->monitor = zmq_socket(s->ctx, ZMQ_PAIR)) ||
        zmq_setsockopt(s->monitor, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_connect(s->monitor, "inproc://ct-store-monitor") != 0) {
        ct__err_set(CT_EFOREIGN, "store connect %s:%d: cannot set up zmq: %s", host, port,
                    zmq_strerror(zmq_errno()));
        ct_store_free(s);
        return NULL;
    }
    if (ct__auth_client(s->sock, "store-client")) {
        ct_store_free(s);
        return NULL;
    }
    if (zmq_connect(s->sock, endpoint) != 0) {
        ct__err_set(CT_EINVAL, "store connect: cannot connect to %s: %s", endpoint,
                    zmq_strerror(zmq_errno()));
        ct_store_free(s);
        return NULL;
    }
    call c = {.op = CT__STORE_PING, .timeout_s = timeout_s};
    int rc = request(s, &c, NULL, 0, NULL, NULL);
    if (rc != 0) {
        ct_store_free(s);
        return NULL;
    }
    return s;
}

void ct_store_free(ct_store *s) {
    if (!s)
        return;
    CT_ASSERT(s->magic == STORE_MAGIC);
    if (s->sock) {
        zmq_socket_monitor(s->sock, NULL, 0);
        zmq_close(s->sock);
    }
    if (s->monitor)
        zmq_close(s->monitor);
    if (s->ctx)
        zmq_ctx_term(s->ctx);
    s->magic = STORE_DEAD;
    free(s);
}

int ct_store_set(ct_store *s, const char *key, const void *value, size_t len, double timeout_s) {
    call c = {.op = CT__STORE_SET, .keys = &key, .nkeys = 1, .timeout_s = timeout_s};
    int rc = begin(s, &c);
    if (rc == 0)
        rc = check_value(value, len, "value", "set");
    if (rc == 0)
        rc = request(s, &c, (frame[]){{key, strlen(key)}, {value, len}}, 2, NULL, NULL);
    return rc;
}

int ct_store_get(ct_store *s, const char *key, void **value, size_t *len, double timeout_s) {
    call c = {.op = CT__STORE_GET, .keys = &key, .nkeys = 1, .timeout_s = timeout_s};
    if (!value || !len)
        return ct__err_set(CT_EINVAL, "store get: value and len must not be NULL");
    *value = NULL;
    *len = 0;
    int rc = begin(s, &c);
    if (rc == 0)
        rc = request(s, &c, (frame[]){{key, strlen(key)}}, 1, value, len);
    return rc;
}

int ct_store_add(ct_store *s, const char *key, int64_t delta, int64_t *result, double timeout_s) {
    call c = {.op = CT__STORE_ADD, .keys = &key, .nkeys = 1, .timeout_s = timeout_s};
    uint8_t d[8];
    ct__store_put_u64(d, (uint64_t)delta);
    void *reply = NULL;
    size_t len = 0;
    int rc = begin(s, &c);
    if (rc == 0)
        rc = request(s, &c, (frame[]){{key, strlen(key)}, {d, sizeof d}}, 2, &reply, &len);
    if (rc == 0 && len != 8)
        rc = STORE_ERR(CT_ECORRUPT, &c, "the server's reply holds %zu bytes; expected 8", len);
    if (rc == 0 && result)
        *result = (int64_t)ct__store_get_u64(reply);
    free(reply);
    return rc;
}

/* Checks a list of keys, whose count the call's key checks cannot see. */
static int check_nkeys(const char *const *keys, int nkeys, const char *op) {
    if (!keys || nkeys < 1 || nkeys > CT_STORE_MAX_KEYS)
        return ct__err_set(CT_EINVAL, "store %s: %d keys%s; expected 1 to %d", op, nkeys,
                           keys ? "" : " (NULL list)", CT_STORE_MAX_KEYS);
    return 0;
}

/* The frames of a list of keys (caller frees). */
static frame *key_frames(const call *c) {
    frame *f = malloc((size_t)c->nkeys * sizeof *f);
    if (!f) {
        STORE_ERR(CT_ENOMEM, c, "out of memory");
        return NULL;
    }
    for (int i = 0; i < c->nkeys; i++)
        f[i] = (frame){c->keys[i], strlen(c->keys[i])};
    return f;
}

/* wait and check: a list of keys in, an optional one-byte answer out. */
static int keys_call(ct_store *s, call *c, bool *answer) {
    int rc = check_nkeys(c->keys, c->nkeys, ct__store_op_name(c->op));
    if (rc == 0)
        rc = begin(s, c);
    frame *f = rc == 0 ? key_frames(c) : NULL;
    if (rc == 0 && !f)
        rc = CT_ENOMEM;
    void *reply = NULL;
    size_t len = 0;
    if (rc == 0)
        rc = request(s, c, f, c->nkeys, answer ? &reply : NULL, &len);
    if (rc == 0 && answer && len != 1)
        rc = STORE_ERR(CT_ECORRUPT, c, "the server's reply holds %zu bytes; expected 1", len);
    if (rc == 0 && answer)
        *answer = *(uint8_t *)reply != 0;
    free(reply);
    free(f);
    return rc;
}

int ct_store_wait(ct_store *s, const char *const *keys, int nkeys, double timeout_s) {
    call c = {.op = CT__STORE_WAIT, .keys = keys, .nkeys = nkeys, .timeout_s = timeout_s};
    return keys_call(s, &c, NULL);
}

int ct_store_check(ct_store *s, const char *const *keys, int nkeys, bool *all_exist,
                   double timeout_s) {
    call c = {.op = CT__STORE_CHECK, .keys = keys, .nkeys = nkeys, .timeout_s = timeout_s};
    if (!all_exist)
        return ct__err_set(CT_EINVAL, "store check: all_exist must not be NULL");
    return keys_call(s, &c, all_exist);
}

int ct_store_compare_set(ct_store *s, const char *key, const void *expected, size_t elen,
                         const void *desired, size_t dlen, void **actual, size_t *alen,
                         double timeout_s) {
    call c = {.op = CT__STORE_CAS, .keys = &key, .nkeys = 1, .timeout_s = timeout_s};
    if (!actual || !alen)
        return ct__err_set(CT_EINVAL, "store compare_set: actual and alen must not be NULL");
    *actual = NULL;
    *alen = 0;
    int rc = begin(s, &c);
    if (rc == 0)
        rc = check_value(expected, elen, "expected", "compare_set");
    if (rc == 0)
        rc = check_value(desired, dlen, "desired", "compare_set");
    if (rc == 0)
        rc = request(s, &c, (frame[]){{key, strlen(key)}, {expected, elen}, {desired, dlen}}, 3,
                     actual, alen);
    return rc;
}

int ct_store_delete(ct_store *s, const char *key, bool *existed, double timeout_s) {
    call c = {.op = CT__STORE_DELETE, .keys = &key, .nkeys = 1, .timeout_s = timeout_s};
    void *reply = NULL;
    size_t len = 0;
    int rc = begin(s, &c);
    if (rc == 0)
        rc = request(s, &c, (frame[]){{key, strlen(key)}}, 1, &reply, &len);
    if (rc == 0 && len != 1)
        rc = STORE_ERR(CT_ECORRUPT, &c, "the server's reply holds %zu bytes; expected 1", len);
    if (rc == 0 && existed)
        *existed = *(uint8_t *)reply != 0;
    free(reply);
    return rc;
}
