/* libFuzzer target: the store server's request handling on arbitrary
 * messages, as a client inside the job may send them (outsiders never get
 * a message through: docs/security.md).
 *
 * The input is a sequence of messages. Each starts with a byte whose low
 * two bits pick one of four senders (routing ids) and whose high bits are
 * the number of argument frames; then the frames, each a u16 length and
 * that many bytes, the first of them the header. The server runs detached,
 * with small limits, so that the fuzzer reaches them. Besides not crashing,
 * leaking or invoking undefined behaviour, the server must keep its books:
 * after every message its key and byte counts match the table and stay
 * within the limits. A broken promise aborts, which libFuzzer reports as a
 * crash. */
#include "dist_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <zmq.h>

#define MAX_FUZZ_FRAMES 40

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    setenv("CT_STORE_MAX_KEYS_TOTAL", "64", 1);
    setenv("CT_STORE_MAX_BYTES", "65536", 1);
    setenv("CT_STORE_MAX_CLIENTS", "3", 1);
    return 0;
}

static void broken(const char *promise) {
    fprintf(stderr, "fuzz_store: %s (last error %s: %s)\n", promise, ct_errname(ct_errcode()),
            ct_errmsg());
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ct_store_server *s = ct__store_server_new_detached();
    if (!s)
        broken("a detached server could not be made");
    static const char *routes[] = {"client-a", "client-b", "client-c", "client-d"};
    size_t at = 0;
    while (at < size) {
        uint8_t head = data[at++];
        int nframes = 2 + (head >> 2) % (MAX_FUZZ_FRAMES - 2);
        zmq_msg_t frames[MAX_FUZZ_FRAMES];
        const char *route = routes[head & 3];
        zmq_msg_init_size(&frames[0], strlen(route));
        memcpy(zmq_msg_data(&frames[0]), route, strlen(route));
        int n = 1;
        while (n < nframes && at + 2 <= size) {
            size_t len = (size_t)data[at] | (size_t)data[at + 1] << 8;
            at += 2;
            if (len > size - at)
                len = size - at;
            zmq_msg_init_size(&frames[n], len);
            if (len)
                memcpy(zmq_msg_data(&frames[n]), data + at, len);
            at += len;
            n++;
        }
        ct__store_server_feed(s, frames, n, false);
        for (int i = 0; i < n; i++)
            zmq_msg_close(&frames[i]);
        if (!ct__store_server_consistent(s))
            broken("the server's books do not match its table, or pass its limits");
    }
    ct_store_server_free(s);
    return 0;
}
