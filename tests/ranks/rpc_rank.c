/* The program each rank of test_rpc runs under ctlaunch. The scenario is
 * named on the command line:
 *
 *   rrefs      every worker leaves values on the next one through
 *              ct_rpc_remote, fetches them and runs a function on them there;
 *              failures name the function and the worker
 *   calls      every worker calls every worker, itself included: values of
 *              every type round-trip (a transposed view, an 8 MiB tensor),
 *              and 64 calls in flight at once each get their own answer
 *   errors     a remote function's error comes back with its code, the
 *              worker and the function; an unknown function names what the
 *              worker has; a call past its timeout fails promptly, calls
 *              that time out before they are sent end cleanly, and the
 *              agent works on; shutdown waits for the slow handler
 *   peer_dies  the last worker SIGKILLs itself inside a call: the caller's
 *              future fails with CT_EPEER naming it, promptly
 *   peer_hangs the last worker stops itself (SIGSTOP) inside a call: alive but
 *              silent, it answers no heartbeat, and the caller's future
 *              fails with CT_EPEER naming it after the heartbeat timeout
 *   garbage    rank 0 sends noise and a malformed request straight to
 *              rank 1's socket, with the job's secret: the malformed request
 *              gets an error reply, and rank 1 goes on serving calls
 *   outsiders  rank 0 calls rank 1's echo from sockets without the secret or
 *              with a wrong one, or with the secret but worker 0's routing
 *              id, which worker 0 holds (no answer ever comes); and with the
 *              secret and an unused worker id under another name (served as
 *              a caller that is no worker: ct.rref_new is refused); rank 1
 *              serves on
 *   limits     under small CT_RPC_MAX_FRAME_BYTES, CT_RPC_MAX_PENDING and
 *              CT_RPC_MAX_RREFS (set by test_rpc): a frame too large, calls
 *              past the pending limit and a remote reference past its limit
 *              fail naming the variable, the rest work; every listener of
 *              every worker binds 127.0.0.1
 *
 * Every rank prints "pid=<pid>" first (tt_rank.c). */
#include "ct_test.h"
#include "tt_rank.h"

#include <ct/dist_autograd.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define TIMEOUT 10.0

static int rank_, size_;
static double heartbeat_s; /* 0: the default */

static bool join(void) {
    if (!tt_rank_join(TIMEOUT, &rank_, &size_))
        return false;
    if (ct_rpc_init(&(ct_rpc_options){.timeout_s = TIMEOUT, .heartbeat_timeout_s = heartbeat_s})) {
        tt_fail(__FILE__, __LINE__, "ct_rpc_init: %s", ct_errmsg());
        return false;
    }
    return true;
}

static void leave(void) {
    if (ct_rpc_shutdown())
        tt_fail(__FILE__, __LINE__, "ct_rpc_shutdown: %s", ct_errmsg());
    ct_dist_finalize();
}

/* --------------------------------------------------------------- functions */

/* Returns its arguments, then this worker's id. */
static int echo(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)ctx;
    int rc = 0;
    for (int i = 0; !rc && i < ct_rpc_args_count(in); i++) {
        switch (ct_rpc_args_type(in, i)) {
        case CT_RPC_TENSOR: rc = ct_rpc_args_add_tensor(out, ct_rpc_args_tensor(in, i)); break;
        case CT_RPC_INT: rc = ct_rpc_args_add_int(out, ct_rpc_args_int(in, i)); break;
        case CT_RPC_FLOAT: rc = ct_rpc_args_add_float(out, ct_rpc_args_float(in, i)); break;
        default: rc = ct_rpc_args_add_string(out, ct_rpc_args_string(in, i)); break;
        }
    }
    return rc ? rc : ct_rpc_args_add_int(out, ct_rpc_self());
}

static int fail(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)ctx;
    (void)in;
    (void)out;
    return ct_seterr(CT_ESHAPE, "the shapes [2, 3] and [4] do not match");
}

static int slow(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)ctx;
    (void)out;
    nanosleep(&(struct timespec){(time_t)ct_rpc_args_float(in, 0), 0}, NULL);
    return 0;
}

static int die(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)ctx;
    (void)in;
    (void)out;
    raise(SIGKILL);
    return 0;
}

/* Publishes this process's pid, then stops it: alive, but silent. */
static int stop(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)ctx;
    (void)in;
    (void)out;
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    ct_store_set(ct_dist_store(), "stopped", pid, strlen(pid), TIMEOUT);
    raise(SIGSTOP);
    return 0;
}

__attribute__((constructor)) static void register_all(void) {
    ct_rpc_register("stop", stop, NULL);
    ct_rpc_register("echo", echo, NULL);
    ct_rpc_register("fail", fail, NULL);
    ct_rpc_register("slow", slow, NULL);
    ct_rpc_register("die", die, NULL);
}

/* ---------------------------------------------------------------- scenarios */

static bool same(ct_tensor *a, ct_tensor *b) {
    ct_tensor *ca = ct_contiguous(a), *cb = ct_contiguous(b);
    return ca && cb && ct_numel(a) == ct_numel(b) && ct_tensor_dtype(a) == ct_tensor_dtype(b) &&
           !memcmp(ct_data_ptr(ca), ct_data_ptr(cb),
                   (size_t)ct_numel(a) * ct_dtype_size(ct_tensor_dtype(a)));
}

TEST(calls) {
    if (!join())
        return;
    ct_tensor *small = ct_transpose(tt_rand(CT_SHAPE(3, 4), CT_FLOAT64, 7), 0, 1);
    ct_tensor *big = tt_rand(CT_SHAPE(2 << 20), CT_FLOAT32, 8);
    ct_rpc_args *in = ct_rpc_args_new();
    ct_rpc_args_add_tensor(in, small);
    ct_rpc_args_add_int(in, -5);
    ct_rpc_args_add_float(in, 0.25);
    ct_rpc_args_add_string(in, "hello");
    ct_rpc_args_add_tensor(in, big);
    for (int w = 0; w < size_ && !tt_failed(); w++) {
        ct_rpc_args *out = NULL;
        TT_CHECK_RC("echo", ct_rpc_sync(ct_rpc_worker_name(w), "echo", in, 0, &out));
        if (tt_failed())
            break;
        if (ct_rpc_args_count(out) != 6 || !same(ct_rpc_args_tensor(out, 0), small) ||
            ct_rpc_args_int(out, 1) != -5 || ct_rpc_args_float(out, 2) != 0.25 ||
            strcmp(ct_rpc_args_string(out, 3), "hello") || !same(ct_rpc_args_tensor(out, 4), big) ||
            ct_rpc_args_int(out, 5) != w)
            tt_fail(__FILE__, __LINE__, "echo on worker %d did not give back what it got", w);
        ct_rpc_args_free(out);
    }
    ct_rpc_args_free(in);
    /* Many calls in flight at once, each answered on its own. */
    enum { N = 64 };
    ct_future *f[N];
    const char *next = ct_rpc_worker_name((rank_ + 1) % size_);
    for (int i = 0; i < N; i++) {
        ct_rpc_args *a = ct_rpc_args_new();
        ct_rpc_args_add_tensor(a, ct_full(CT_SHAPE(i + 1), i, CT_INT32));
        f[i] = ct_rpc_async(next, "echo", a, 0);
        ct_rpc_args_free(a);
    }
    for (int i = 0; i < N; i++) {
        ct_rpc_args *out = NULL;
        TT_CHECK_RC("echo in flight", ct_future_wait(f[i], &out));
        ct_tensor *t = out ? ct_rpc_args_tensor(out, 0) : NULL;
        if (!tt_failed() && (!t || ct_numel(t) != i + 1 || ct_get(t, (int64_t[]){i}) != i))
            tt_fail(__FILE__, __LINE__, "call %d got another call's answer", i);
        ct_rpc_args_free(out);
        ct_future_free(f[i]);
    }
    leave();
}

TEST(rrefs) {
    if (!join())
        return;
    /* Every worker leaves values on the next one and works on them there. */
    const char *next = ct_rpc_worker_name((rank_ + 1) % size_);
    ct_tensor *t = tt_rand(CT_SHAPE(5), CT_FLOAT32, 11 + (uint64_t)rank_);
    ct_rpc_args *in = ct_rpc_args_new(), *more = ct_rpc_args_new(), *out = NULL;
    ct_rpc_args_add_tensor(in, t);
    ct_rpc_args_add_int(in, rank_);
    ct_rpc_args_add_string(more, "more");
    ct_rref *r = ct_rpc_remote(next, "echo", in, 0);
    TT_CHECK_RC("ct_rpc_remote", r ? 0 : ct_errcode());
    if (r) {
        if (ct_rref_owner(r) != (rank_ + 1) % size_)
            tt_fail(__FILE__, __LINE__, "the reference names owner %d", ct_rref_owner(r));
        /* echo left (t, rank, owner) there. */
        TT_CHECK_RC("ct_rref_fetch", ct_rref_fetch(r, 0, &out));
        if (out &&
            (ct_rpc_args_count(out) != 3 || !same(ct_rpc_args_tensor(out, 0), t) ||
             ct_rpc_args_int(out, 1) != rank_ || ct_rpc_args_int(out, 2) != ct_rref_owner(r)))
            tt_fail(__FILE__, __LINE__, "the fetched values are not what echo left");
        ct_rpc_args_free(out);
        out = NULL;
        TT_CHECK_RC("ct_rref_call", ct_rref_call(r, "echo", more, 0, &out));
        if (out && (ct_rpc_args_count(out) != 5 || strcmp(ct_rpc_args_string(out, 3), "more")))
            tt_fail(__FILE__, __LINE__, "echo on the reference did not get its values first");
        ct_rpc_args_free(out);
        out = NULL;
        ASSERT_RC(ct_rref_call(r, "nope", more, 0, &out), CT_EINVAL, "'nope'", next);
    }
    ct_rref_free(r);
    ASSERT_FAILS(ct_rpc_remote(next, "fail", in, 0), CT_ESHAPE, "'fail'", "do not match", next);
    ASSERT_FAILS(ct_rpc_remote("nobody", "echo", in, 0), CT_EINVAL, "nobody");
    ct_rpc_args_free(in);
    ct_rpc_args_free(more);
    leave();
}

TEST(errors) {
    if (!join())
        return;
    if (rank_ == 0) {
        ct_rpc_args *none = ct_rpc_args_new(), *secs = ct_rpc_args_new();
        int rc = ct_rpc_sync("worker1", "fail", none, 0, NULL);
        if (rc != CT_ESHAPE)
            tt_fail(__FILE__, __LINE__, "fail gave %s, not CT_ESHAPE", ct_errname(rc));
        else
            tt_message_holds(
                rank_, "a remote error",
                (const char *const[]){"worker 'worker1'", "'fail'", "[2, 3] and [4]", NULL});
        rc = ct_rpc_sync("worker1", "nope", none, 0, NULL);
        if (rc != CT_EINVAL)
            tt_fail(__FILE__, __LINE__, "nope gave %s, not CT_EINVAL", ct_errname(rc));
        else
            tt_message_holds(rank_, "an unknown function",
                             (const char *const[]){"'nope'", "echo", NULL});
        if (ct_rpc_async("nobody", "echo", none, 0) || ct_errcode() != CT_EINVAL)
            tt_fail(__FILE__, __LINE__, "a call to no such worker did not fail at once");
        ct_rpc_args_add_float(secs, 2);
        double t0 = tt_now();
        rc = ct_rpc_sync("worker1", "slow", secs, 0.3, NULL);
        double took = tt_now() - t0;
        if (rc != CT_ETIMEDOUT || took > 1.5)
            tt_fail(__FILE__, __LINE__, "slow gave %s after %.2f s, not CT_ETIMEDOUT at 0.3 s",
                    ct_errname(rc), took);
        else
            tt_message_holds(rank_, "a timeout",
                             (const char *const[]){"'slow'", "worker1", "0.3", NULL});
        /* Calls that time out before they are even sent, their futures
         * freed at once: each ends, as a timeout or a success. */
        for (int i = 0; i < 50; i++) {
            ct_future *f = ct_rpc_async("worker1", "echo", none, 1e-9);
            rc = ct_future_wait(f, NULL);
            if (rc && rc != CT_ETIMEDOUT)
                tt_fail(__FILE__, __LINE__, "a hurried call gave %s", ct_errname(rc));
            ct_future_free(f);
        }
        /* More tensors than a message may hold: refused, and the worker
         * goes on. */
        ct_rpc_args *many = ct_rpc_args_new();
        for (int i = 0; i < 300; i++)
            ct_rpc_args_add_tensor(many, ct_full(CT_SHAPE(2), i, CT_FLOAT32));
        ASSERT_RC(ct_rpc_sync("worker1", "echo", many, 0, NULL), CT_ECORRUPT, "too many");
        ct_rpc_args_free(many);
        ct_rpc_args *out = NULL;
        TT_CHECK_RC("echo after the timeout", ct_rpc_sync("worker1", "echo", none, 0, &out));
        ct_rpc_args_free(out);
        ct_rpc_args_free(none);
        ct_rpc_args_free(secs);
    }
    leave();
}

TEST(peer_dies) {
    signal(SIGTERM, SIG_IGN);
    if (!join())
        return;
    if (rank_ == 0) {
        ct_rpc_args *none = ct_rpc_args_new();
        double t0 = tt_now();
        int rc = ct_rpc_sync(ct_rpc_worker_name(size_ - 1), "die", none, 0, NULL);
        double took = tt_now() - t0;
        char name[32];
        snprintf(name, sizeof name, "worker%d", size_ - 1);
        if (rc != CT_EPEER || took > TIMEOUT / 2)
            tt_fail(__FILE__, __LINE__, "die gave %s after %.2f s, not CT_EPEER at once",
                    ct_errname(rc), took);
        else
            tt_message_holds(rank_, "a worker that died in a call",
                             (const char *const[]){name, "'die'", NULL});
        ct_rpc_args_free(none);
    } else if (rank_ != size_ - 1) {
        nanosleep(&(struct timespec){1, 0}, NULL);
    } else {
        nanosleep(&(struct timespec){TIMEOUT, 0}, NULL);
    }
    ct_dist_finalize();
}

TEST(peer_hangs) {
    signal(SIGTERM, SIG_IGN);
    heartbeat_s = 1;
    if (!join())
        return;
    if (rank_ == 0) {
        ct_rpc_args *none = ct_rpc_args_new();
        double t0 = tt_now();
        int rc = ct_rpc_sync("worker1", "stop", none, 0, NULL);
        double took = tt_now() - t0;
        if (rc != CT_EPEER || took > TIMEOUT / 2)
            tt_fail(__FILE__, __LINE__, "stop gave %s after %.2f s, not CT_EPEER in about 1 s",
                    ct_errname(rc), took);
        else
            tt_message_holds(rank_, "a worker that stopped answering",
                             (const char *const[]){"worker1", "'stop'", "heartbeat", NULL});
        void *pid = NULL;
        size_t len = 0;
        TT_CHECK_RC("reading the stopped pid",
                    ct_store_get(ct_dist_store(), "stopped", &pid, &len, TIMEOUT));
        if (pid)
            kill((pid_t)strtol(pid, NULL, 10), SIGKILL);
        free(pid);
        ct_rpc_args_free(none);
    } else {
        nanosleep(&(struct timespec){TIMEOUT, 0}, NULL);
    }
    ct_dist_finalize();
}

/* The header of a request as docs/rpc-design.md lays it out: magic "ctR1",
 * version 1, kind 1 (request), id, reply-to, context, status, tensors. */
static void request_header(unsigned char h[40]) {
    memset(h, 0, 40);
    memcpy(h, "ctR1", 4);
    h[4] = 1;
    h[6] = 1;
    h[8] = 42;
}

/* A raw DEALER connected to rank 1's RPC socket, proving secret (NULL: no
 * credentials), with routing id route (NULL: zmq's own) and a receive
 * timeout of wait_ms. */
static void *raw_to_rank1(void *ctx, const char *secret, const uint16_t *route, int wait_ms) {
    void *store_value = NULL;
    size_t len = 0;
    TT_CHECK_RC("reading rank 1's address",
                ct_store_get(ct_dist_store(), "rpc/0/1", &store_value, &len, TIMEOUT));
    char text[400] = "";
    snprintf(text, sizeof text, "%.*s", (int)len, (const char *)store_value);
    free(store_value);
    const char *endpoint = strchr(text, ' ');
    void *s = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &wait_ms, sizeof wait_ms);
    if (secret) {
        zmq_setsockopt(s, ZMQ_PLAIN_USERNAME, "impostor", 8);
        zmq_setsockopt(s, ZMQ_PLAIN_PASSWORD, secret, strlen(secret));
    }
    if (route)
        zmq_setsockopt(s, ZMQ_ROUTING_ID, route, sizeof *route);
    if (!endpoint || zmq_connect(s, endpoint + 1))
        tt_fail(__FILE__, __LINE__, "connecting to '%s'", text);
    return s;
}

/* Sends a request for fn with one string argument arg (none when NULL), as
 * id 42 (the description's layout: docs/rpc-design.md), and returns the
 * reply header's kind (2 response, 3 error), or -1 when none came in
 * time. */
static int call_raw(void *s, const char *fn, const char *arg) {
    unsigned char h[40], desc[300];
    request_header(h);
    size_t n = strlen(fn), at = 0;
    uint32_t count = arg ? 1 : 0;
    desc[at++] = (unsigned char)n;
    memcpy(desc + at, fn, n);
    at += n;
    memcpy(desc + at, &count, 4);
    at += 4;
    if (arg) {
        uint32_t len = (uint32_t)strlen(arg);
        desc[at++] = CT_RPC_STRING;
        memcpy(desc + at, &len, 4);
        memcpy(desc + at + 4, arg, len);
        at += 4 + len;
    }
    zmq_send(s, h, sizeof h, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(s, desc, at, ZMQ_DONTWAIT);
    unsigned char reply[64];
    int got = zmq_recv(s, reply, sizeof reply, 0);
    int more = 0;
    size_t optlen = sizeof more;
    while (got >= 0 && !zmq_getsockopt(s, ZMQ_RCVMORE, &more, &optlen) && more)
        zmq_recv(s, desc, sizeof desc, 0);
    return got == 40 && reply[16] == 42 ? reply[6] : -1;
}

TEST(garbage) {
    if (!join())
        return;
    if (rank_ == 0) {
        void *ctx = zmq_ctx_new(), *s = raw_to_rank1(ctx, getenv("CT_JOB_SECRET"), NULL, 5000);
        zmq_send(s, "hello", 5, 0);
        zmq_send(s, "\x01\x02", 2, ZMQ_SNDMORE);
        zmq_send(s, "noise", 5, ZMQ_SNDMORE);
        zmq_send(s, "", 0, 0);
        unsigned char h[40], desc[3] = {200, 'x', 'y'};
        request_header(h);
        zmq_send(s, h, sizeof h, ZMQ_SNDMORE);
        zmq_send(s, desc, sizeof desc, 0);
        unsigned char reply[64];
        int got = zmq_recv(s, reply, sizeof reply, 0);
        /* The reply's header: kind 3 (error), answering id 42. */
        if (got != 40 || reply[6] != 3 || reply[16] != 42)
            tt_fail(__FILE__, __LINE__, "the malformed request got no error reply (%d bytes)", got);
        zmq_close(s);
        zmq_ctx_term(ctx);
        ct_rpc_args *none = ct_rpc_args_new(), *out = NULL;
        TT_CHECK_RC("echo after the noise", ct_rpc_sync("worker1", "echo", none, 0, &out));
        ct_rpc_args_free(out);
        ct_rpc_args_free(none);
    }
    leave();
}

TEST(outsiders) {
    if (!join())
        return;
    if (rank_ == 0) {
        void *ctx = zmq_ctx_new();
        const char *secrets[] = {NULL, "a-wrong-secret-0123456789"};
        for (int i = 0; i < 2; i++) {
            void *s = raw_to_rank1(ctx, secrets[i], NULL, 1000);
            int kind = call_raw(s, "echo", NULL);
            if (kind != -1)
                tt_fail(__FILE__, __LINE__, "a caller %s was answered (kind %d)",
                        i ? "with a wrong secret" : "without credentials", kind);
            zmq_close(s);
        }
        /* The secret and worker 0's routing id, which worker 0 holds: zmq
         * keeps the first connection's route, so the second gets nothing. */
        uint16_t route = 0;
        void *s = raw_to_rank1(ctx, getenv("CT_JOB_SECRET"), &route, 1000);
        int kind = call_raw(s, "echo", NULL);
        if (kind != -1)
            tt_fail(__FILE__, __LINE__, "a second connection as worker 0 was answered (%d)", kind);
        zmq_close(s);
        /* The secret and an unused worker id, but not the worker's name: a
         * caller that is no worker, whose calls are served but who may hold
         * no value. */
        route = 1;
        s = raw_to_rank1(ctx, getenv("CT_JOB_SECRET"), &route, 5000);
        int echo_kind = call_raw(s, "echo", NULL), rref_kind = call_raw(s, "ct.rref_new", "echo");
        if (echo_kind != 2 || rref_kind != 3)
            tt_fail(__FILE__, __LINE__,
                    "an impostor's echo got kind %d (want 2) and its ct.rref_new kind %d (want 3)",
                    echo_kind, rref_kind);
        zmq_close(s);
        zmq_ctx_term(ctx);
        ct_rpc_args *none = ct_rpc_args_new(), *out = NULL;
        TT_CHECK_RC("echo after the outsiders", ct_rpc_sync("worker1", "echo", none, 0, &out));
        ct_rpc_args_free(out);
        ct_rpc_args_free(none);
    }
    leave();
}

TEST(limits) {
    if (!join())
        return;
    if (tt_listeners_on_loopback(rank_) < 1)
        tt_fail(__FILE__, __LINE__, "rank %d: no listener of its RPC agent found", rank_);
    if (rank_ == 0) {
        /* One frame over CT_RPC_MAX_FRAME_BYTES (64 KiB), one under. */
        ct_rpc_args *big = ct_rpc_args_new(), *small = ct_rpc_args_new(), *out = NULL;
        ct_rpc_args_add_tensor(big, ct_zeros(CT_SHAPE(32768), CT_FLOAT32));
        ct_rpc_args_add_tensor(small, ct_zeros(CT_SHAPE(1024), CT_FLOAT32));
        if (ct_rpc_sync("worker1", "echo", big, 0, &out) != CT_EINVAL)
            tt_fail(__FILE__, __LINE__, "a 128 KiB frame was not refused");
        else
            tt_message_holds(rank_, "a frame over the limit",
                             (const char *const[]){"'echo'", "131072 bytes",
                                                   "CT_RPC_MAX_FRAME_BYTES=65536", NULL});
        TT_CHECK_RC("a frame under the limit", ct_rpc_sync("worker1", "echo", small, 0, &out));
        ct_rpc_args_free(out);
        /* Six calls at once to a slow function, two allowed in flight. */
        ct_rpc_args *one_s = ct_rpc_args_new();
        ct_rpc_args_add_float(one_s, 1.0);
        ct_future *f[6];
        for (int i = 0; i < 6; i++)
            f[i] = ct_rpc_async("worker1", "slow", one_s, 0);
        int ok = 0, refused = 0;
        for (int i = 0; i < 6; i++) {
            int rc = ct_future_wait(f[i], NULL);
            ok += rc == 0;
            if (rc == CT_ENOMEM && strstr(ct_errmsg(), "CT_RPC_MAX_PENDING=2"))
                refused++;
            ct_future_free(f[i]);
        }
        if (ok != 2 || refused != 4)
            tt_fail(__FILE__, __LINE__,
                    "6 slow calls, 2 allowed: %d ran, %d refused naming the "
                    "limit",
                    ok, refused);
        /* Three remote references allowed; a fourth after freeing one. */
        ct_rref *r[4] = {NULL};
        for (int i = 0; i < 3; i++)
            if (!(r[i] = ct_rpc_remote("worker1", "echo", small, 0)))
                tt_fail(__FILE__, __LINE__, "remote reference %d: %s", i, ct_errmsg());
        if ((r[3] = ct_rpc_remote("worker1", "echo", small, 0)) || ct_errcode() != CT_ENOMEM)
            tt_fail(__FILE__, __LINE__, "a fourth remote reference was not refused");
        else
            tt_message_holds(rank_, "a remote reference over the limit",
                             (const char *const[]){"CT_RPC_MAX_RREFS=3", NULL});
        ct_rref_free(r[0]);
        /* The owner frees it when the message arrives: allow it a moment. */
        for (int tries = 0; tries < 50 && !(r[3] = ct_rpc_remote("worker1", "echo", small, 0));
             tries++)
            nanosleep(&(struct timespec){0, 20000000}, NULL);
        if (!r[3])
            tt_fail(__FILE__, __LINE__, "no remote reference after one was freed: %s", ct_errmsg());
        for (int i = 1; i < 4; i++)
            ct_rref_free(r[i]);
        ct_rpc_args_free(one_s);
        ct_rpc_args_free(small);
        ct_rpc_args_free(big);
    }
    leave();
}
