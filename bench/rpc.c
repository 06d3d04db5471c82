/* bench_rpc: RPC round trips between 2 workers, beside plain zmq.
 *
 *   ctlaunch -np 2 bench_rpc [--iters N]
 *
 * Rank 0 calls rank 1: an empty call, then calls that send a float32
 * tensor of 4 KiB, 1 MiB and 64 MiB and get the same tensor back ("echo").
 * Each size runs --iters round trips (fewer for the large ones, at least 5)
 * after a few untimed ones; the figure is the median round trip, and GB/s
 * counts the bytes both ways (2 x size) over it.
 *
 * The peer, in the same run: the same round trips through a plain zmq
 * DEALER/ROUTER pair over TCP loopback, rank 0 sending a frame of the size
 * from its own memory (zmq_msg_init_data) and rank 1 sending it back (the
 * message it received, untouched): the loopback bandwidth that zmq reaches
 * without ct, the bar the issue sets ct's RPC against.
 *
 * stdout: one JSON line per result from rank 0: {"bench": "rpc", "impl":
 * "ct" | "zmq", "op": "empty" | "echo", "bytes", "iters", "us" (median
 * round trip), "gbps"}. stderr: errors. */
#include "bench_time.h"

#include <ct/dist_autograd.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

static const char usage[] = "usage: ctlaunch -np 2 bench_rpc [--iters N]\n"
                            "  --iters  round trips per small size (default 2000); large sizes\n"
                            "           run fewer (at least 5)\n";

static const int64_t sizes[] = {4 << 10, 1 << 20, 64 << 20};
#define NSIZES ((int)(sizeof sizes / sizeof *sizes))

static int echo(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
    (void)ctx;
    return ct_rpc_args_count(in) ? ct_rpc_args_add_tensor(out, ct_rpc_args_tensor(in, 0)) : 0;
}

/* Round trips for a payload of bytes: many for small ones, at least 5. */
static int iters_for(int64_t bytes, int iters) {
    int64_t n = ((int64_t)256 << 20) / (bytes ? bytes : 1);
    return (int)(n < iters ? (n < 5 ? 5 : n) : iters);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return v[n / 2];
}

static void report(const char *impl, const char *op, int64_t bytes, int n, double s) {
    printf("{\"bench\": \"rpc\", \"impl\": \"%s\", \"op\": \"%s\", \"bytes\": %lld, \"iters\": %d, "
           "\"us\": %.2f, \"gbps\": %.4f}\n",
           impl, op, (long long)bytes, n, s * 1e6, bytes ? 2.0 * (double)bytes / s * 1e-9 : 0.0);
    fflush(stdout);
}

/* Rank 0's side of ct's round trips. */
static int time_ct(int iters) {
    const char *peer = ct_rpc_worker_name(1);
    double *t = malloc(sizeof(double) * (size_t)iters);
    int rc = t ? 0 : 1;
    for (int s = -1; !rc && s < NSIZES; s++) {
        int64_t bytes = s < 0 ? 0 : sizes[s];
        int n = iters_for(bytes, iters);
        ct_rpc_args *in = ct_rpc_args_new();
        ct_tensor *x = bytes ? ct_ones(CT_SHAPE(bytes / 4), CT_FLOAT32) : NULL;
        if (x)
            ct_rpc_args_add_tensor(in, x);
        ct_tensor_free(x);
        for (int i = -3; !rc && i < n; i++) {
            double t0 = bench_now();
            ct_rpc_args *out = NULL;
            rc = ct_rpc_sync(peer, "echo", in, 0, &out);
            if (i >= 0)
                t[i] = bench_now() - t0;
            ct_rpc_args_free(out);
        }
        ct_rpc_args_free(in);
        if (!rc)
            report("ct", bytes ? "echo" : "empty", bytes, n, median(t, n));
    }
    if (rc)
        fprintf(stderr, "bench_rpc: %s\n", ct_errmsg());
    free(t);
    return rc;
}

static void free_buf(void *data, void *hint) {
    (void)data;
    (void)hint;
}

/* The same round trips through plain zmq: rank 1 binds a ROUTER and sends
 * every message back as it came; rank 0's DEALER times them. */
static int time_zmq(int rank, int iters) {
    void *ctx = zmq_ctx_new();
    void *s = zmq_socket(ctx, rank ? ZMQ_ROUTER : ZMQ_DEALER);
    char endpoint[128] = "";
    size_t len = sizeof endpoint;
    int rc = 0;
    ct_store *store = ct_dist_store();
    if (rank) {
        rc = zmq_bind(s, "tcp://127.0.0.1:*") ||
             zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, endpoint, &len);
        if (!rc)
            rc = ct_store_set(store, "bench_rpc/zmq", endpoint, strlen(endpoint), 30);
        zmq_msg_t id, m;
        zmq_msg_init(&id);
        zmq_msg_init(&m);
        for (;;) {
            if (zmq_msg_recv(&id, s, 0) < 0 || zmq_msg_recv(&m, s, 0) < 0)
                break;
            bool done = zmq_msg_size(&m) == 1;
            if (zmq_msg_send(&id, s, ZMQ_SNDMORE) < 0 || zmq_msg_send(&m, s, 0) < 0 || done)
                break;
        }
        zmq_msg_close(&id);
        zmq_msg_close(&m);
    } else {
        void *got = NULL;
        size_t glen = 0;
        rc = ct_store_get(store, "bench_rpc/zmq", &got, &glen, 30);
        if (!rc) {
            snprintf(endpoint, sizeof endpoint, "%.*s", (int)glen, (const char *)got);
            rc = zmq_connect(s, endpoint);
        }
        free(got);
        char *buf = malloc((size_t)sizes[NSIZES - 1]);
        double *t = malloc(sizeof(double) * (size_t)iters);
        if (!buf || !t)
            rc = 1;
        if (!rc)
            memset(buf, 1, (size_t)sizes[NSIZES - 1]);
        for (int k = -1; !rc && k < NSIZES; k++) {
            int64_t bytes = k < 0 ? 0 : sizes[k];
            int n = iters_for(bytes, iters);
            for (int i = -3; !rc && i < n; i++) {
                double t0 = bench_now();
                zmq_msg_t m;
                zmq_msg_init_data(&m, buf, (size_t)bytes, free_buf, NULL);
                if (zmq_msg_send(&m, s, 0) < 0 || zmq_msg_recv(&m, s, 0) < 0)
                    rc = 1;
                zmq_msg_close(&m);
                if (i >= 0)
                    t[i] = bench_now() - t0;
            }
            if (!rc)
                report("zmq", bytes ? "echo" : "empty", bytes, n, median(t, n));
        }
        zmq_send(s, "x", 1, 0);
        free(buf);
        free(t);
    }
    zmq_close(s);
    zmq_ctx_term(ctx);
    if (rc)
        fprintf(stderr, "bench_rpc: the zmq peer failed: %s\n", zmq_strerror(zmq_errno()));
    return rc;
}

int main(int argc, char **argv) {
    int iters = 2000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else {
            fputs(usage, strcmp(argv[i], "--help") ? stderr : stdout);
            return strcmp(argv[i], "--help") ? 2 : 0;
        }
    }
    if (iters < 5) {
        fputs(usage, stderr);
        return 2;
    }
    if (ct_dist_init(NULL) || ct_rpc_register("echo", echo, NULL) || ct_rpc_init(NULL)) {
        fprintf(stderr, "bench_rpc: %s\n", ct_errmsg());
        return 1;
    }
    int rank = ct_rpc_self();
    if (ct_rpc_num_workers() != 2) {
        fprintf(stderr, "bench_rpc: run it on 2 ranks (ctlaunch -np 2)\n");
        return 2;
    }
    int rc = rank == 0 ? time_ct(iters) : 0;
    rc = ct_rpc_shutdown() || rc;
    rc = time_zmq(rank, iters) || rc;
    ct_dist_finalize();
    return rc;
}
