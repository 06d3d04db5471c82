/* The dist/ key-value store: its operations, timeouts, failures of the
 * server, many threads and processes at once, hostile messages on the wire
 * from inside the job, outsiders without the job's secret, and the
 * server's limits. Every blocking call has a short timeout, so a bug fails
 * instead of hanging. */
#include "ct_test.h"

#include <ct/dist.h>

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

/* libzmq is not built with TSan: its own lock-free queues hand memory
 * between its threads (through libstdc++ strings) invisibly to TSan, which
 * then reports races inside zmq. TSan asks for this hook at startup; other
 * builds never call it. */
const char *__tsan_default_suppressions(void);
const char *__tsan_default_suppressions(void) { return "race:libzmq.so\nrace:libstdc++.so\n"; }

/* This process's job secret, which the raw sockets below prove by hand. */
#define SECRET "test-store-secret-0123456789"

__attribute__((constructor)) static void set_secret(void) {
    if (ct_secret_set(SECRET) != 0)
        abort();
}

/* Gives a raw socket the job's credentials, as ct's own clients have. */
static void *with_secret(void *sock, const char *secret) {
    zmq_setsockopt(sock, ZMQ_PLAIN_USERNAME, "test", 4);
    zmq_setsockopt(sock, ZMQ_PLAIN_PASSWORD, secret, strlen(secret));
    return sock;
}

/* This process's resident memory, in bytes. */
static double rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, resident = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return (double)resident * (double)sysconf(_SC_PAGESIZE);
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* A server on a free loopback port and one client of it. */
typedef struct fixture {
    ct_store_server *server;
    ct_store *store;
    int port;
} fixture;

static bool fixture_init(fixture *f) {
    f->server = ct_store_server_new("127.0.0.1", 0);
    f->port = f->server ? ct_store_server_port(f->server) : -1;
    f->store = f->server ? ct_store_connect("127.0.0.1", f->port, 5.0) : NULL;
    return f->store != NULL;
}

static void fixture_free(fixture *f) {
    ct_store_free(f->store);
    ct_store_server_free(f->server);
}

/* Gets key and compares it with the expected bytes. */
static bool value_is_within(ct_store *s, const char *key, const void *want, size_t wlen,
                            double timeout) {
    void *v = NULL;
    size_t len = 99;
    int rc = ct_store_get(s, key, &v, &len, timeout);
    bool ok = rc == 0 && len == wlen && memcmp(v, want, wlen) == 0 && ((char *)v)[len] == 0;
    free(v);
    return ok;
}

static bool value_is(ct_store *s, const char *key, const void *want, size_t wlen) {
    return value_is_within(s, key, want, wlen, 2.0);
}

TEST(set_get_round_trip) {
    fixture f;
    ASSERT_TRUE(fixture_init(&f));
    const uint8_t binary[] = {0, 1, 0xff, 0, 42};
    ASSERT_EQ(ct_store_set(f.store, "text", "hello", 5, -1), 0);
    ASSERT_EQ(ct_store_set(f.store, "empty", NULL, 0, -1), 0);
    ASSERT_EQ(ct_store_set(f.store, "binary", binary, sizeof binary, 1.0), 0);
    ASSERT_TRUE(value_is(f.store, "text", "hello", 5));
    ASSERT_TRUE(value_is(f.store, "empty", "", 0));
    ASSERT_TRUE(value_is(f.store, "binary", binary, sizeof binary));
    ASSERT_EQ(ct_store_set(f.store, "text", "bye", 3, -1), 0);
    ASSERT_TRUE(value_is(f.store, "text", "bye", 3));

    bool exist = true, existed = false;
    ASSERT_EQ(ct_store_check(f.store, (const char *[]){"text", "empty"}, 2, &exist, -1), 0);
    ASSERT_TRUE(exist);
    ASSERT_EQ(ct_store_check(f.store, (const char *[]){"text", "nope"}, 2, &exist, -1), 0);
    ASSERT_TRUE(!exist);
    ASSERT_EQ(ct_store_delete(f.store, "text", &existed, -1), 0);
    ASSERT_TRUE(existed);
    ASSERT_EQ(ct_store_delete(f.store, "text", &existed, -1), 0);
    ASSERT_TRUE(!existed);
    ASSERT_EQ(ct_store_check(f.store, (const char *[]){"text"}, 1, &exist, -1), 0);
    ASSERT_TRUE(!exist);

    /* A value of the largest size crosses the wire intact (generous
     * timeouts: sanitizers make copying 64 MiB slow). */
    size_t big = CT_STORE_MAX_VALUE;
    uint8_t *buf = malloc(big);
    ASSERT_TRUE(buf != NULL);
    for (size_t i = 0; i < big; i++)
        buf[i] = (uint8_t)(i * 131);
    int rc = ct_store_set(f.store, "big", buf, big, 60.0);
    bool same = rc == 0 && value_is_within(f.store, "big", buf, big, 60.0);
    free(buf);
    ASSERT_EQ(rc, 0);
    ASSERT_TRUE(same);
    fixture_free(&f);
}

typedef struct later {
    int port;
    double delay_s;
    const char *const *keys;
    int nkeys;
    int rc;
} later;

/* Sets each key (to its own name) after a delay, from another client. */
static void *set_later(void *arg) {
    later *l = arg;
    ct_store *s = ct_store_connect("127.0.0.1", l->port, 5.0);
    l->rc = s ? 0 : ct_errcode();
    for (int i = 0; l->rc == 0 && i < l->nkeys; i++) {
        sleep_s(l->delay_s);
        l->rc = ct_store_set(s, l->keys[i], l->keys[i], strlen(l->keys[i]), -1);
    }
    ct_store_free(s);
    return NULL;
}

TEST(get_waits_for_a_later_set) {
    fixture f;
    ASSERT_TRUE(fixture_init(&f));
    later l = {f.port, 0.2, (const char *[]){"rank3/addr"}, 1, -1};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, set_later, &l), 0);
    double t0 = tt_now();
    bool got = value_is(f.store, "rank3/addr", "rank3/addr", 10);
    double waited = tt_now() - t0;
    pthread_join(th, NULL);
    ASSERT_EQ(l.rc, 0);
    ASSERT_TRUE(got);
    ASSERT_TRUE(waited > 0.1);
    fixture_free(&f);
}

TEST(wait_for_several_keys) {
    fixture f;
    ASSERT_TRUE(fixture_init(&f));
    const char *keys[] = {"a", "b", "c"};
    later l = {f.port, 0.05, keys, 3, -1};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, set_later, &l), 0);
    int rc = ct_store_wait(f.store, keys, 3, 3.0);
    pthread_join(th, NULL);
    ASSERT_EQ(l.rc, 0);
    ASSERT_EQ(rc, 0);
    bool exist = false;
    ASSERT_EQ(ct_store_check(f.store, keys, 3, &exist, -1), 0);
    ASSERT_TRUE(exist);
    /* Keys already there: answered at once. */
    ASSERT_EQ(ct_store_wait(f.store, keys, 3, 0.5), 0);
    fixture_free(&f);
}

typedef struct adder {
    int port, rc;
} adder;

static void *add_many(void *arg) {
    adder *a = arg;
    ct_store *s = ct_store_connect("127.0.0.1", a->port, 10.0);
    a->rc = s ? 0 : ct_errcode();
    for (int i = 0; a->rc == 0 && i < 1000; i++)
        a->rc = ct_store_add(s, "counter", 1, NULL, -1);
    ct_store_free(s);
    return NULL;
}

TEST(add_is_atomic_across_threads) {
    fixture f;
    ASSERT_TRUE(fixture_init(&f));
    pthread_t th[8];
    adder a[8];
    for (int i = 0; i < 8; i++) {
        a[i] = (adder){f.port, -1};
        ASSERT_EQ(pthread_create(&th[i], NULL, add_many, &a[i]), 0);
    }
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 8; i++)
        ASSERT_EQ(a[i].rc, 0);
    int64_t total = 0;
    ASSERT_EQ(ct_store_add(f.store, "counter", 0, &total, -1), 0);
    ASSERT_EQ(total, 8000);
    ASSERT_TRUE(value_is(f.store, "counter", "8000", 4));
    ASSERT_EQ(ct_store_add(f.store, "counter", -8001, &total, -1), 0);
    ASSERT_EQ(total, -1);

    ASSERT_EQ(ct_store_set(f.store, "words", "abc", 3, -1), 0);
    ASSERT_RC(ct_store_add(f.store, "words", 1, &total, -1), CT_EINVAL, "add 'words'",
              "not a decimal integer");
    ASSERT_EQ(ct_store_add(f.store, "big", INT64_MAX, &total, -1), 0);
    ASSERT_RC(ct_store_add(f.store, "big", 1, &total, -1), CT_ERANGE, "add 'big'", "overflows");
    fixture_free(&f);
}

/* compare_set and checks that *actual holds want. */
static bool cas_is(ct_store *s, const char *key, const char *expected, const char *desired,
                   const char *want) {
    void *actual = NULL;
    size_t len = 0;
    int rc = ct_store_compare_set(s, key, expected, strlen(expected), desired, strlen(desired),
                                  &actual, &len, -1);
    bool ok = rc == 0 && len == strlen(want) && memcmp(actual, want, len) == 0;
    free(actual);
    return ok;
}

TEST(compare_set_follows_torch) {
    fixture f;
    ASSERT_TRUE(fixture_init(&f));
    /* Absent key, non-empty expected: nothing stored, expected comes back. */
    ASSERT_TRUE(cas_is(f.store, "k", "x", "first", "x"));
    bool exist = true;
    ASSERT_EQ(ct_store_check(f.store, (const char *[]){"k"}, 1, &exist, -1), 0);
    ASSERT_TRUE(!exist);
    /* Absent key, empty expected: desired is stored. */
    ASSERT_TRUE(cas_is(f.store, "k", "", "first", "first"));
    /* Match: replaced. */
    ASSERT_TRUE(cas_is(f.store, "k", "first", "second", "second"));
    /* Mismatch: left alone, the current value comes back. */
    ASSERT_TRUE(cas_is(f.store, "k", "first", "third", "second"));
    ASSERT_TRUE(cas_is(f.store, "k", "", "third", "second"));
    ASSERT_TRUE(value_is(f.store, "k", "second", 6));
    fixture_free(&f);
}

TEST(timeouts_fire_in_time_and_name_the_key) {
    fixture f;
    ASSERT_TRUE(fixture_init(&f));
    void *v = (void *)1;
    size_t len = 1;
    double t0 = tt_now();
    ASSERT_RC(ct_store_get(f.store, "rank3/addr", &v, &len, 0.3), CT_ETIMEDOUT,
              "store get 'rank3/addr'", "timed out after 0.3 s", "127.0.0.1");
    double took = tt_now() - t0;
    ASSERT_TRUE(took > 0.25 && took < 1.5);
    ASSERT_TRUE(v == NULL && len == 0);

    ASSERT_EQ(ct_store_set(f.store, "a", "1", 1, -1), 0);
    t0 = tt_now();
    ASSERT_RC(ct_store_wait(f.store, (const char *[]){"a", "b"}, 2, 0.3), CT_ETIMEDOUT,
              "store wait 'a', 'b'", "waiting for 'b'");
    took = tt_now() - t0;
    ASSERT_TRUE(took > 0.25 && took < 1.5);
    /* The client is still usable after a timeout; the late answer to the
     * timed-out request is not taken for the next one's. */
    ASSERT_EQ(ct_store_set(f.store, "rank3/addr", "x", 1, -1), 0);
    ASSERT_TRUE(value_is(f.store, "rank3/addr", "x", 1));
    fixture_free(&f);
}

TEST(bad_arguments_are_refused) {
    fixture f;
    ASSERT_TRUE(fixture_init(&f));
    char long_key[CT_STORE_MAX_KEY + 2];
    memset(long_key, 'k', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = 0;
    void *v;
    size_t len;
    bool b;
    ASSERT_RC(ct_store_set(NULL, "k", "v", 1, -1), CT_EINVAL, "NULL client");
    ASSERT_RC(ct_store_set(f.store, NULL, "v", 1, -1), CT_EINVAL, "key 0 is NULL");
    ASSERT_RC(ct_store_set(f.store, "", "v", 1, -1), CT_EINVAL, "key 0 is empty");
    ASSERT_RC(ct_store_set(f.store, long_key, "v", 1, -1), CT_EINVAL, "too long");
    ASSERT_RC(ct_store_set(f.store, "k", NULL, 3, -1), CT_EINVAL, "NULL but its length is 3");
    ASSERT_RC(ct_store_set(f.store, "k", "v", (size_t)CT_STORE_MAX_VALUE + 1, -1), CT_EINVAL,
              "over the limit");
    ASSERT_RC(ct_store_get(f.store, "k", &v, &len, 0), CT_EINVAL, "timeout 0 s");
    ASSERT_RC(ct_store_get(f.store, "k", &v, &len, NAN), CT_EINVAL, "timeout nan s");
    ASSERT_RC(ct_store_get(f.store, "k", &v, &len, INFINITY), CT_EINVAL, "timeout inf s");
    ASSERT_RC(ct_store_get(f.store, "k", NULL, &len, -1), CT_EINVAL, "must not be NULL");
    ASSERT_RC(ct_store_wait(f.store, (const char *[]){"a"}, 0, -1), CT_EINVAL, "0 keys");
    ASSERT_RC(ct_store_wait(f.store, NULL, 1, -1), CT_EINVAL, "NULL list");
    ASSERT_RC(ct_store_check(f.store, (const char *[]){"a", NULL}, 2, &b, -1), CT_EINVAL,
              "key 1 is NULL");
    ASSERT_RC(ct_store_server_port(NULL), CT_EINVAL, "NULL handle");
    ASSERT_FAILS(ct_store_connect(NULL, 1, 1.0), CT_EINVAL, "host is NULL");
    ASSERT_FAILS(ct_store_connect("127.0.0.1", 0, 1.0), CT_EINVAL, "port in [1, 65535]");
    ASSERT_FAILS(ct_store_connect("127.0.0.1", f.port, -1.0), CT_EINVAL, "timeout > 0");
    ASSERT_FAILS(ct_store_server_new("127.0.0.1", 70000), CT_EINVAL, "port 70000");
    char port[16];
    snprintf(port, sizeof port, "%d", f.port);
    ASSERT_FAILS(ct_store_server_new("127.0.0.1", f.port), CT_EIO, "cannot listen", port);
    ct_store_free(NULL);
    ct_store_server_free(NULL);
    fixture_free(&f);
}

TEST(a_vanished_server_is_an_error_not_a_hang) {
    fixture f;
    ASSERT_TRUE(fixture_init(&f));
    ASSERT_EQ(ct_store_set(f.store, "k", "v", 1, -1), 0);
    ct_store_server_free(f.server);
    f.server = NULL;
    double t0 = tt_now();
    void *v;
    size_t len;
    ct_errclear();
    int rc = ct_store_get(f.store, "k", &v, &len, 0.5);
    double took = tt_now() - t0;
    ASSERT_TRUE(rc == CT_EPEER || rc == CT_ETIMEDOUT);
    ASSERT_STR_CONTAINS(ct_errmsg(), "store get 'k'");
    ASSERT_TRUE(took < 1.5);
    fixture_free(&f);

    /* Nobody at all on the port: connect gives up within its timeout. */
    ct_store_server *gone = ct_store_server_new("127.0.0.1", 0);
    ASSERT_TRUE(gone != NULL);
    int port = ct_store_server_port(gone);
    ct_store_server_free(gone);
    t0 = tt_now();
    ASSERT_FAILS(ct_store_connect("127.0.0.1", port, 0.3), CT_EPEER, "unreachable", "127.0.0.1");
    ASSERT_TRUE(tt_now() - t0 < 1.5);
}

/* Runs in a forked child: joins the parent's store by port. */
static int child_main(int port, int i) {
    ct_store *s = ct_store_connect("127.0.0.1", port, 5.0);
    char key[32], val[32];
    snprintf(key, sizeof key, "child/%d", i);
    int n = snprintf(val, sizeof val, "pid %d", (int)getpid());
    int rc = s ? ct_store_add(s, "arrived", 1, NULL, -1) : -1;
    if (rc == 0)
        rc = ct_store_set(s, key, val, (size_t)n, -1);
    /* Everyone waits for everyone, as a rendezvous does. */
    if (rc == 0)
        rc = ct_store_wait(s, (const char *[]){"child/0", "child/1", "child/2"}, 3, 5.0);
    ct_store_free(s);
    return rc == 0 ? 0 : 1;
}

/* Reaps pid within timeout_s, killing it if it is still running; its exit
 * status, or -1. */
static int reap(pid_t pid, double timeout_s) {
    double deadline = tt_now() + timeout_s;
    int status;
    while (tt_now() < deadline) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        sleep_s(0.01);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

TEST(processes_meet_through_the_store) {
    /* Children fork before the server starts its thread, so each begins
     * single-threaded; they read the port from a pipe. */
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pids[3];
    for (int i = 0; i < 3; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            int port = 0;
            close(fds[1]);
            bool ok = read(fds[0], &port, sizeof port) == sizeof port;
            _exit(ok ? child_main(port, i) : 2);
        }
    }
    close(fds[0]);
    fixture f;
    bool ok = fixture_init(&f);
    for (int i = 0; i < 3; i++) {
        int port = ok ? f.port : 0;
        if (write(fds[1], &port, sizeof port) != sizeof port)
            ok = false;
    }
    close(fds[1]);
    int status[3];
    for (int i = 0; i < 3; i++)
        status[i] = reap(pids[i], 10.0);
    ASSERT_TRUE(ok);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(status[i], 0);
    int64_t arrived = 0;
    ASSERT_EQ(ct_store_add(f.store, "arrived", 0, &arrived, -1), 0);
    ASSERT_EQ(arrived, 3);
    void *v = NULL;
    size_t len;
    ASSERT_EQ(ct_store_get(f.store, "child/1", &v, &len, 1.0), 0);
    ASSERT_TRUE(strncmp(v, "pid ", 4) == 0);
    free(v);
    fixture_free(&f);
}

/* --------------------------------------------------- raw wire messages */

/* A request header as docs/store.md lays it out. */
static void header(uint8_t out[20], uint8_t op, uint64_t id, uint32_t timeout_ms) {
    memset(out, 0, 20);
    memcpy(out, "CTS1", 4);
    out[4] = op;
    for (int i = 0; i < 8; i++)
        out[8 + i] = (uint8_t)(id >> (8 * i));
    for (int i = 0; i < 4; i++)
        out[16 + i] = (uint8_t)(timeout_ms >> (8 * i));
}

/* Sends frames as one message. */
static void send_frames(void *sock, const void *const *data, const size_t *len, int n) {
    for (int i = 0; i < n; i++)
        zmq_send(sock, data[i], len[i], i + 1 < n ? ZMQ_SNDMORE : 0);
}

/* Receives one reply within 1 s: its status and up to size - 1 bytes of its
 * payload (NUL-terminated); -1 if nothing came. */
static int recv_status(void *sock, uint64_t id, char *payload, size_t size) {
    zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, 1000) != 1)
        return -1;
    uint8_t hdr[32];
    int n = zmq_recv(sock, hdr, sizeof hdr, 0);
    int more = 0;
    size_t optlen = sizeof more;
    zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &optlen);
    memset(payload, 0, size);
    if (more)
        zmq_recv(sock, payload, size - 1, 0);
    uint64_t got = 0;
    for (int i = 7; i >= 0; i--)
        got = (got << 8) | hdr[8 + i];
    return n == 20 && memcmp(hdr, "CTS1", 4) == 0 && got == id ? hdr[5] : -2;
}

/* True when nothing arrives for a while (answers come within milliseconds). */
static bool silent(void *sock) {
    zmq_pollitem_t item = {sock, 0, ZMQ_POLLIN, 0};
    return zmq_poll(&item, 1, 200) == 0;
}

TEST(hostile_messages_do_not_crash_the_server) {
    fixture f;
    ASSERT_TRUE(fixture_init(&f));
    void *ctx = zmq_ctx_new();
    void *raw = with_secret(zmq_socket(ctx, ZMQ_DEALER), SECRET);
    int zero = 0;
    zmq_setsockopt(raw, ZMQ_LINGER, &zero, sizeof zero);
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", f.port);
    ASSERT_EQ(zmq_connect(raw, endpoint), 0);

    /* Not the protocol: ignored. */
    zmq_send(raw, "garbage", 7, 0);
    zmq_send(raw, "", 0, 0);
    uint8_t h[20];
    header(h, 99, 1, 0);
    zmq_send(raw, h, sizeof h, 0);
    ASSERT_TRUE(silent(raw));

    char why[256];
    char long_key[CT_STORE_MAX_KEY + 1];
    memset(long_key, 'k', sizeof long_key);
    /* Refused, with a reason. */
    header(h, 2 /* set */, 2, 0);
    send_frames(raw, (const void *[]){h, "k"}, (size_t[]){20, 1}, 2);
    ASSERT_EQ(recv_status(raw, 2, why, sizeof why), 2);
    ASSERT_STR_CONTAINS(why, "set takes 2 argument frames, got 1");
    header(h, 3 /* get */, 3, 0);
    send_frames(raw, (const void *[]){h, long_key}, (size_t[]){20, sizeof long_key}, 2);
    ASSERT_EQ(recv_status(raw, 3, why, sizeof why), 2);
    ASSERT_STR_CONTAINS(why, "1025 bytes");
    header(h, 3, 4, 0);
    send_frames(raw, (const void *[]){h, "a\0b"}, (size_t[]){20, 3}, 2);
    ASSERT_EQ(recv_status(raw, 4, why, sizeof why), 2);
    ASSERT_STR_CONTAINS(why, "with a NUL");
    header(h, 4 /* add */, 5, 0);
    send_frames(raw, (const void *[]){h, "n", "1234"}, (size_t[]){20, 1, 4}, 3);
    ASSERT_EQ(recv_status(raw, 5, why, sizeof why), 2);
    ASSERT_STR_CONTAINS(why, "delta is 4 bytes");
    /* More key frames than any request may carry. */
    header(h, 5 /* wait */, 6, 0);
    zmq_send(raw, h, sizeof h, ZMQ_SNDMORE);
    for (int i = 0; i < CT_STORE_MAX_KEYS + 10; i++)
        zmq_send(raw, "x", 1, i + 1 < CT_STORE_MAX_KEYS + 10 ? ZMQ_SNDMORE : 0);
    ASSERT_EQ(recv_status(raw, 6, why, sizeof why), 2);
    ASSERT_STR_CONTAINS(why, "wait takes 1 to 1024");
    /* A get with no time to wait times out on the server at once. */
    header(h, 3, 7, 0);
    send_frames(raw, (const void *[]){h, "missing"}, (size_t[]){20, 7}, 2);
    ASSERT_EQ(recv_status(raw, 7, why, sizeof why), 1);
    ASSERT_STR_CONTAINS(why, "'missing'");

    /* A resent add is answered from the cache, not applied twice; an older
     * id gets no answer. */
    uint8_t one[8] = {1};
    header(h, 4, 8, 1000);
    for (int i = 0; i < 2; i++) {
        send_frames(raw, (const void *[]){h, "n", one}, (size_t[]){20, 1, 8}, 3);
        ASSERT_EQ(recv_status(raw, 8, why, sizeof why), 0);
        ASSERT_EQ(why[0], 1);
    }
    header(h, 4, 7, 1000);
    send_frames(raw, (const void *[]){h, "n", one}, (size_t[]){20, 1, 8}, 3);
    ASSERT_TRUE(silent(raw));
    zmq_close(raw);
    zmq_ctx_term(ctx);

    /* The server still serves everyone, and the add above counted once. */
    ASSERT_TRUE(value_is(f.store, "n", "1", 1));
    ASSERT_EQ(ct_store_set(f.store, "still", "up", 2, -1), 0);
    fixture_free(&f);
}

/* A DEALER with the given routing id, connected to the server on port. */
static void *raw_client(void *ctx, int port, const char *route) {
    void *sock = with_secret(zmq_socket(ctx, ZMQ_DEALER), SECRET);
    int zero = 0;
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(sock, ZMQ_ROUTING_ID, route, strlen(route));
    zmq_connect(sock, endpoint);
    return sock;
}

TEST(a_reconnected_client_is_known_again) {
    fixture f;
    ASSERT_TRUE(fixture_init(&f));
    void *ctx = zmq_ctx_new();
    uint8_t h[20], one[8] = {1};
    char why[64];
    header(h, 4 /* add */, 1, 1000);
    /* The first connection's add is answered, then the connection drops
     * before the client knows, so it resends on a new connection. */
    void *first = raw_client(ctx, f.port, "rank0");
    send_frames(first, (const void *[]){h, "n", one}, (size_t[]){20, 1, 8}, 3);
    ASSERT_EQ(recv_status(first, 1, why, sizeof why), 0);
    zmq_close(first);
    void *second = raw_client(ctx, f.port, "rank0");
    send_frames(second, (const void *[]){h, "n", one}, (size_t[]){20, 1, 8}, 3);
    ASSERT_EQ(recv_status(second, 1, why, sizeof why), 0);
    ASSERT_EQ(why[0], 1);
    /* A new connection may take over while the old one still looks alive. */
    void *third = raw_client(ctx, f.port, "rank0");
    header(h, 4, 2, 1000);
    send_frames(third, (const void *[]){h, "n", one}, (size_t[]){20, 1, 8}, 3);
    ASSERT_EQ(recv_status(third, 2, why, sizeof why), 0);
    ASSERT_EQ(why[0], 2);
    zmq_close(second);
    zmq_close(third);
    zmq_ctx_term(ctx);
    ASSERT_TRUE(value_is(f.store, "n", "2", 1));
    fixture_free(&f);
}

/* Forks a child that runs body(port) and exits with its result, before
 * this process starts the server's threads (TSan cannot follow a fork of a
 * threaded process): the child waits for the port on a pipe, whose write
 * end is *to_child. */
static pid_t fork_child(int (*body)(int port), int *to_child) {
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        int port = 0;
        close(fds[1]);
        bool ok = read(fds[0], &port, sizeof port) == sizeof port && port > 0;
        _exit(ok ? body(port) : 2);
    }
    close(fds[0]);
    *to_child = fds[1];
    return pid;
}

/* Tells the child forked by fork_child the port (0: give up). */
static void start_child(int to_child, int port) {
    if (write(to_child, &port, sizeof port) != sizeof port)
        perror("start_child");
    close(to_child);
}

/* Sends 150 sets of 1 MiB from a socket without the secret, then from one
 * with a wrong secret; 0 when no answer ever came. */
static int outsider_main(int port) {
    void *ctx = zmq_ctx_new();
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", port);
    static char value[1 << 20];
    memset(value, 'x', sizeof value);
    uint8_t h[20];
    for (int k = 0; k < 2; k++) {
        void *raw = zmq_socket(ctx, ZMQ_DEALER);
        int zero = 0;
        zmq_setsockopt(raw, ZMQ_LINGER, &zero, sizeof zero);
        if (k == 1)
            with_secret(raw, "a-wrong-secret-0123456789");
        zmq_connect(raw, endpoint);
        for (int i = 0; i < 150; i++) {
            char key[32];
            snprintf(key, sizeof key, "outsider/%d", i);
            header(h, 2 /* set */, (uint64_t)i + 1, 0);
            /* Without a peer that took it, a DEALER's send would block. */
            zmq_send(raw, h, sizeof h, ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(raw, key, strlen(key), ZMQ_SNDMORE | ZMQ_DONTWAIT);
            zmq_send(raw, value, sizeof value, ZMQ_DONTWAIT);
            sleep_s(0.002);
        }
        int got = recv_status(raw, 1, (char[8]){0}, 8);
        zmq_close(raw);
        if (got != -1)
            return 1;
    }
    zmq_ctx_term(ctx);
    return 0;
}

/* An outsider without the secret (none at all, or a wrong one) gets no
 * request served: nothing it sends is stored, and it costs the server no
 * memory. */
TEST(outsiders_without_the_secret_are_refused) {
    int to_child;
    pid_t pid = fork_child(outsider_main, &to_child);
    ASSERT_TRUE(pid > 0);
    fixture f;
    bool up = fixture_init(&f);
    double before = rss_bytes();
    start_child(to_child, up ? f.port : 0);
    ASSERT_EQ(reap(pid, 20.0), 0);
    ASSERT_TRUE(up);
    bool any = true;
    ASSERT_EQ(ct_store_check(f.store, (const char *[]){"outsider/0", "outsider/149"}, 2, &any, -1),
              0);
    ASSERT_TRUE(!any);
    /* 300 MiB were sent; the server kept none of it. */
    ASSERT_TRUE(rss_bytes() - before < 32e6);
    ASSERT_EQ(ct_store_set(f.store, "still", "up", 2, -1), 0);
    fixture_free(&f);
}

/* Connects with another job's secret: 0 when refused at once, saying why. */
static int wrong_secret_main(int port) {
    ct_secret_set("another-jobs-secret-0123456789");
    double t0 = tt_now();
    ct_store *s = ct_store_connect("127.0.0.1", port, 5.0);
    bool named = strstr(ct_errmsg(), "refused this process's job secret") != NULL;
    return !s && ct_errcode() == CT_EAUTH && named && tt_now() - t0 < 2.0 ? 0 : 1;
}

/* ct's own client with another job's secret fails at once, saying why. */
TEST(a_wrong_secret_is_an_error_naming_it) {
    int to_child;
    pid_t pid = fork_child(wrong_secret_main, &to_child);
    ASSERT_TRUE(pid > 0);
    fixture f;
    bool up = fixture_init(&f);
    start_child(to_child, up ? f.port : 0);
    ASSERT_EQ(reap(pid, 10.0), 0);
    ASSERT_TRUE(up);
    fixture_free(&f);
}

/* The server's limits: keys, bytes and clients, each named when reached,
 * and room made again by deleting. */
TEST(limits_are_enforced_and_named) {
    setenv("CT_STORE_MAX_KEYS_TOTAL", "4", 1);
    setenv("CT_STORE_MAX_BYTES", "3000", 1);
    fixture f;
    bool up = fixture_init(&f);
    unsetenv("CT_STORE_MAX_KEYS_TOTAL");
    unsetenv("CT_STORE_MAX_BYTES");
    ASSERT_TRUE(up);
    for (int i = 0; i < 4; i++) {
        char key[8];
        snprintf(key, sizeof key, "k%d", i);
        ASSERT_EQ(ct_store_set(f.store, key, "v", 1, -1), 0);
    }
    ASSERT_EQ(ct_store_set(f.store, "k4", "v", 1, -1), CT_ENOMEM);
    ASSERT_STR_CONTAINS(ct_errmsg(), "CT_STORE_MAX_KEYS_TOTAL=4");
    ASSERT_EQ(ct_store_add(f.store, "counter", 1, NULL, -1), CT_ENOMEM);
    /* Replacing a value needs no new key. */
    ASSERT_EQ(ct_store_set(f.store, "k0", "w", 1, -1), 0);
    static char big[4000];
    ASSERT_EQ(ct_store_set(f.store, "k1", big, sizeof big, -1), CT_ENOMEM);
    ASSERT_STR_CONTAINS(ct_errmsg(), "CT_STORE_MAX_BYTES=3000");
    ASSERT_EQ(ct_store_set(f.store, "k1", big, 2000, -1), 0);
    ASSERT_EQ(ct_store_set(f.store, "k2", big, 2000, -1), CT_ENOMEM);
    ASSERT_EQ(ct_store_delete(f.store, "k1", NULL, -1), 0);
    ASSERT_EQ(ct_store_set(f.store, "k2", big, 2000, -1), 0);
    ASSERT_EQ(ct_store_delete(f.store, "k3", NULL, -1), 0);
    ASSERT_EQ(ct_store_add(f.store, "counter", 1, NULL, -1), 0);
    fixture_free(&f);

    setenv("CT_STORE_MAX_CLIENTS", "2", 1);
    up = fixture_init(&f);
    unsetenv("CT_STORE_MAX_CLIENTS");
    ASSERT_TRUE(up);
    ct_store *second = ct_store_connect("127.0.0.1", f.port, 2.0);
    ASSERT_TRUE(second != NULL);
    ASSERT_FAILS(ct_store_connect("127.0.0.1", f.port, 2.0), CT_ENOMEM, "CT_STORE_MAX_CLIENTS=2");
    ct_store_free(second);
    fixture_free(&f);

    setenv("CT_STORE_MAX_BYTES", "lots", 1);
    ASSERT_FAILS(ct_store_server_new("127.0.0.1", 0), CT_EINVAL, "CT_STORE_MAX_BYTES=\"lots\"");
    unsetenv("CT_STORE_MAX_BYTES");
}

/* Asks 100 times for the 8 MiB value "big" and never reads a reply. */
static int greedy_main(int port) {
    void *ctx = zmq_ctx_new();
    void *raw = raw_client(ctx, port, "greedy");
    uint8_t h[20];
    for (int i = 0; i < 100; i++) {
        header(h, 3 /* get */, (uint64_t)i + 1, 1000);
        send_frames(raw, (const void *[]){h, "big"}, (size_t[]){20, 3}, 2);
        sleep_s(0.005);
    }
    sleep_s(1.0);
    return 0;
}

/* A client that asks for a large value again and again and never reads the
 * replies makes the server hold no copies of it: queued replies share the
 * stored value. */
TEST(unread_replies_share_the_stored_value) {
    int to_child;
    pid_t pid = fork_child(greedy_main, &to_child);
    ASSERT_TRUE(pid > 0);
    fixture f;
    bool up = fixture_init(&f);
    static char value[8 << 20];
    memset(value, 'v', sizeof value);
    up = up && ct_store_set(f.store, "big", value, sizeof value, -1) == 0;
    double before = rss_bytes();
    start_child(to_child, up ? f.port : 0);
    sleep_s(1.0);
    double grown = rss_bytes() - before;
    ASSERT_EQ(reap(pid, 10.0), 0);
    ASSERT_TRUE(up);
    /* 100 replies of 8 MiB were asked for: copies would be 800 MiB. */
    ASSERT_TRUE(grown < 64e6);
    fixture_free(&f);
}
