/* A signal that interrupts a zmq read (EINTR) in the middle of a multipart
 * message must not leave the message's tail on the socket, where it would be
 * read as the start of the next message. zmq_msg_recv is wrapped at link
 * time (-Wl,--wrap), so that while `interrupting` is set every other call
 * fails with EINTR before reading anything, as a signal landing in zmq's
 * wait does; the RPC worker's reader and the store, client and server, must
 * read every message whole regardless. The fuzzer found the first: libFuzzer's
 * timer interrupted its check that the reader had consumed the message. */
#include "ct_test.h"
#include "rpc_impl.h"

#include <ct/dist.h>

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <zmq.h>

int __real_zmq_msg_recv(zmq_msg_t *m, void *sock, int flags);
int __wrap_zmq_msg_recv(zmq_msg_t *m, void *sock, int flags);

static atomic_bool interrupting;
static atomic_uint calls, interrupted;

int __wrap_zmq_msg_recv(zmq_msg_t *m, void *sock, int flags) {
    if (atomic_load(&interrupting) && atomic_fetch_add(&calls, 1) % 2 == 0) {
        atomic_fetch_add(&interrupted, 1);
        errno = EINTR;
        return -1;
    }
    return __real_zmq_msg_recv(m, sock, flags);
}

/* A request for fn with a float tensor of n elements and an integer, in its
 * frames, sent on tx. */
static int send_request(void *tx, const char *fn, int n) {
    ct_rpc_args *a = ct_rpc_args_new();
    rpc_out m = {0};
    int rc = !a || ct_rpc_args_add_tensor(a, ct_arange(0, n, 1, CT_FLOAT32)) ||
             ct_rpc_args_add_int(a, 42) || ct__rpc_encode_call(&m, fn, a, false);
    ct_rpc_args_free(a);
    if (rc)
        return -1;
    m.h.magic = RPC_MAGIC;
    m.h.version = RPC_VERSION;
    m.h.kind = RPC_REQUEST;
    m.h.id = 7;
    rc = zmq_send(tx, &m.h, sizeof m.h, ZMQ_SNDMORE) < 0 ||
         zmq_send(tx, m.desc, m.desc_len, m.ntensors ? ZMQ_SNDMORE : 0) < 0;
    for (uint32_t i = 0; !rc && i < m.ntensors; i++)
        rc = zmq_send(tx, ct_data_ptr(m.tensors[i]), (size_t)ct_numel(m.tensors[i]) * 4,
                      i + 1 < m.ntensors ? ZMQ_SNDMORE : 0) < 0;
    ct__rpc_out_free(&m);
    return rc ? -1 : 0;
}

TEST(the_rpc_reader_reads_a_request_whole_through_signals) {
    void *ctx = zmq_ctx_new(), *tx = zmq_socket(ctx, ZMQ_PAIR), *rx = zmq_socket(ctx, ZMQ_PAIR);
    int zero = 0;
    ASSERT_TRUE(tx && rx);
    zmq_setsockopt(tx, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(rx, ZMQ_LINGER, &zero, sizeof zero);
    ASSERT_EQ(zmq_bind(rx, "inproc://signals"), 0);
    ASSERT_EQ(zmq_connect(tx, "inproc://signals"), 0);
    ASSERT_EQ(send_request(tx, "first", 5), 0);
    ASSERT_EQ(send_request(tx, "second", 3), 0);
    atomic_store(&interrupting, true);
    static const char *const names[] = {"first", "second"};
    static const int lengths[] = {5, 3};
    for (int k = 0; k < 2; k++) {
        rpc_header h;
        char fn[RPC_NAME_MAX + 1], user[RPC_USER_MAX];
        ct_rpc_args *in = NULL;
        int rc = ct__rpc_read_request(rx, &h, fn, &in, user);
        if (rc) {
            atomic_store(&interrupting, false);
            ASSERT_EQ(rc, 0);
        }
        ASSERT_TRUE(!strcmp(fn, names[k]));
        ASSERT_EQ(h.id, 7);
        ASSERT_EQ(ct_rpc_args_count(in), 2);
        ASSERT_EQ(ct_numel(ct_rpc_args_tensor(in, 0)), lengths[k]);
        ASSERT_EQ(ct_rpc_args_int(in, 1), 42);
        ct_rpc_args_free(in);
    }
    atomic_store(&interrupting, false);
    ASSERT_TRUE(atomic_load(&interrupted) >= 4);
    zmq_pollitem_t item = {rx, 0, ZMQ_POLLIN, 0};
    ASSERT_EQ(zmq_poll(&item, 1, 0), 0);
    zmq_close(tx);
    zmq_close(rx);
    zmq_ctx_term(ctx);
}

TEST(the_store_serves_every_operation_through_signals) {
    ct_store_server *srv = ct_store_server_new(NULL, 0);
    ASSERT_TRUE(srv);
    ct_store *c = ct_store_connect("127.0.0.1", ct_store_server_port(srv), 10.0);
    ASSERT_TRUE(c);
    atomic_store(&interrupted, 0);
    atomic_store(&interrupting, true);
    int rc = 0;
    char key[32], want[64];
    for (int i = 0; i < 50 && !rc; i++) {
        snprintf(key, sizeof key, "k%d", i);
        snprintf(want, sizeof want, "value %d", i);
        void *got = NULL;
        size_t len = 0;
        int64_t total = 0;
        rc = ct_store_set(c, key, want, strlen(want), -1) || ct_store_get(c, key, &got, &len, -1) ||
             ct_store_add(c, "count", 1, &total, -1);
        if (!rc && (len != strlen(want) || memcmp(got, want, len) || total != i + 1))
            rc = -1;
        free(got);
    }
    atomic_store(&interrupting, false);
    ASSERT_EQ(rc, 0);
    ASSERT_TRUE(atomic_load(&interrupted) >= 100);
    ct_store_free(c);
    ct_store_server_free(srv);
}
