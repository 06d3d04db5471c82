/* libFuzzer target: the RPC worker's request reader (header, description
 * and tensor frames off a socket, then decoded) on arbitrary multipart
 * messages, as an RPC worker receives them from any process of the job.
 * The message goes through a real zmq socket pair (inproc), so frame
 * boundaries, the more flag and zmq's own small-message layout are the
 * ones the worker sees.
 *
 * The input is cut into frames, each a u16 length and that many bytes (the
 * last one cut short by the input's end). Besides not crashing, leaking or
 * invoking undefined behaviour, the reader must keep its promises: a
 * failure is CT_ECORRUPT or CT_ENOMEM with no values; a success names a
 * printable function; either way the whole message is consumed, so the
 * next one starts clean. A broken promise aborts, which libFuzzer reports
 * as a crash. libFuzzer's timer interrupts zmq calls now and then (EINTR):
 * the harness's own calls retry, as the reader's do. */
#include "rpc_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <zmq.h>

#define MAX_FUZZ_FRAMES 300

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void broken(const char *promise) {
    fprintf(stderr, "fuzz_rpc_frames: %s (last error %s: %s)\n", promise, ct_errname(ct_errcode()),
            ct_errmsg());
    abort();
}

static void *ctx, *tx, *rx;

static void setup(void) {
    int zero = 0;
    if (!(ctx = zmq_ctx_new()) || !(tx = zmq_socket(ctx, ZMQ_PAIR)) ||
        !(rx = zmq_socket(ctx, ZMQ_PAIR)) || zmq_setsockopt(tx, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_bind(rx, "inproc://fuzz-rpc-frames") || zmq_connect(tx, "inproc://fuzz-rpc-frames"))
        broken("the socket pair could not be made");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx)
        setup();
    size_t at = 0;
    int n = 0;
    do {
        size_t len = at + 2 <= size ? ((size_t)data[at] | (size_t)data[at + 1] << 8) : 0;
        at = at + 2 <= size ? at + 2 : size;
        if (len > size - at)
            len = size - at;
        bool last = at + len >= size || n + 1 == MAX_FUZZ_FRAMES;
        int sent;
        while ((sent = zmq_send(tx, data + at, len, last ? 0 : ZMQ_SNDMORE)) < 0 &&
               zmq_errno() == EINTR)
            ;
        if (sent < 0)
            broken("the fuzzer's message could not be sent");
        at += len;
        n++;
        if (last)
            break;
    } while (at < size);
    rpc_header h;
    char fn[RPC_NAME_MAX + 1], user[RPC_USER_MAX];
    ct_rpc_args *in = (ct_rpc_args *)1;
    ct_errclear();
    int rc = ct__rpc_read_request(rx, &h, fn, &in, user);
    if (rc) {
        if (in)
            broken("a failed read returned values");
        if (rc != CT_ECORRUPT && rc != CT_ENOMEM)
            broken("a failed read returned a code other than ECORRUPT or ENOMEM");
    } else {
        if (!in)
            broken("a successful read returned no values");
        for (const char *c = fn; *c; c++)
            if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
                broken("a successful read named a function that is not printable");
    }
    ct_rpc_args_free(in);
    zmq_pollitem_t item = {rx, 0, ZMQ_POLLIN, 0};
    int waiting;
    while ((waiting = zmq_poll(&item, 1, 0)) < 0 && zmq_errno() == EINTR)
        ;
    if (waiting != 0)
        broken("the reader left part of the message on the socket");
    return 0;
}
