/* The nccl collectives backend. It needs CUDA devices: where
 * cudaGetDeviceCount fails or finds none, the first test to run exits 77,
 * which ctest reports as skipped. The tests of several ranks need one
 * device per rank (NCCL refuses two ranks on one device); on a machine with
 * one device they print a note and check nothing, since the harness has no
 * per-test skip.
 *
 * The tests wrap cudaMalloc'd memory in tensors on CT_CUDA with
 * ct_storage_from_blob (memory the caller brings). Collectives on ct's own
 * device tensors, with the compute stream, the caching allocator and
 * ct_ddp, are test_coll_device's, which runs on the test device too. Ranks
 * are threads of this process, one per device, each with its own
 * communicator; several ranks cannot share one device under NCCL, so on a
 * machine with one GPU only the single-rank tests check anything. */
#include "ct_test.h"

#include <ct/autograd.h>
#include <ct/collectives.h>
#include <ct/cuda.h>
#include <ct/dist.h>
#include <ct/nn.h>

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
/* nccl.h declares ncclGroupStart() and others without (void). */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <nccl.h>
#pragma GCC diagnostic pop

#define MAX_RANKS 4

static int device_count(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/* Exits 77 (skipped) unless this process sees a CUDA device. */
static void require_device(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0)
        return;
    printf("skipped: no CUDA device (%s)\n",
           e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0");
    fflush(stdout);
    exit(77);
}

static void cuda_free_blob(void *data, void *ctx) {
    (void)ctx;
    cudaFree(data);
}

/* A contiguous 1-d tensor of n elements in memory of device dev, holding
 * host's values (or zeros when host is NULL). NULL if CUDA or ct failed. */
static ct_tensor *device_tensor(int dev, int64_t n, ct_dtype dtype, const void *host) {
    size_t bytes = (size_t)n * ct_dtype_size(dtype);
    void *p = NULL;
    if (cudaSetDevice(dev) != cudaSuccess || cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess)
        return NULL;
    cudaError_t e =
        host ? cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice) : cudaMemset(p, 0, bytes);
    ct_storage *s = e == cudaSuccess ? ct_storage_from_blob(p, bytes, (ct_device){CT_CUDA, dev},
                                                            cuda_free_blob, NULL)
                                     : NULL;
    if (!s) {
        cudaFree(p);
        return NULL;
    }
    ct_tensor *t = ct_tensor_from_storage(s, 0, 1, &n, NULL, dtype);
    ct_storage_free(s);
    return t;
}

/* Copies t's elements to host, on ct's compute stream. */
static bool download(ct_tensor *t, void *host) {
    ct_tensor *h = ct_to(t, CT_DEVICE_CPU);
    if (h)
        memcpy(host, ct_data_ptr(h), (size_t)ct_numel(t) * ct_dtype_size(ct_tensor_dtype(t)));
    ct_tensor_free(h);
    return h != NULL;
}

/* A communicator of rank of size on device dev, or NULL with ct's error
 * recorded. */
static ct_comm *comm_on(const ncclUniqueId *id, int rank, int size, int dev, double timeout_s) {
    ct_comm_config cfg = {.backend = CT_BACKEND_NCCL,
                          .rank = rank,
                          .size = size,
                          .timeout_s = timeout_s,
                          .nccl_id = id,
                          .device = dev};
    return ct_comm_new(&cfg);
}

static ct_comm *comm_single(void) {
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess)
        return NULL;
    return comm_on(&id, 0, 1, 0, 30);
}

/* ------------------------------------------------------------- one rank */

TEST(communicator_of_one_rank) {
    require_device();
    ASSERT_TRUE(ct_backend_available(CT_BACKEND_NCCL));
    ct_comm *comm = comm_single();
    ASSERT_TRUE(comm != NULL);
    ASSERT_EQ(ct_comm_backend(comm), CT_BACKEND_NCCL);
    ASSERT_EQ(ct_comm_rank(comm), 0);
    ASSERT_EQ(ct_comm_size(comm), 1);
    ASSERT_NEAR(ct_comm_timeout(comm), 30, 0);
    ct_comm_free(comm);
}

TEST(bad_configs_are_refused) {
    require_device();
    int ndev = device_count();
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    ct_comm_config cfg = {.backend = CT_BACKEND_NCCL, .rank = 0, .size = 1, .timeout_s = 5};
    ASSERT_FAILS(ct_comm_new(&cfg), CT_EINVAL, "nccl init", "nccl_id is NULL");
    cfg.nccl_id = &id;
    cfg.device = ndev;
    char sees[64];
    snprintf(sees, sizeof sees, "sees %d CUDA device", ndev);
    ASSERT_FAILS(ct_comm_new(&cfg), CT_EINVAL, "nccl init", "config.device", sees);
    cfg.device = -1;
    ASSERT_FAILS(ct_comm_new(&cfg), CT_EINVAL, "config.device is -1");
}

/* Every operation checks its tensors' device before anything is queued, so
 * *work stays NULL and the communicator stays usable. */
TEST(cpu_tensors_get_edevice) {
    require_device();
    ct_comm *comm = comm_single();
    ASSERT_TRUE(comm != NULL);
    ct_tensor *t = ct_zeros(1, (int64_t[]){4}, CT_FLOAT32);
    ct_tensor *out = ct_zeros(1, (int64_t[]){4}, CT_FLOAT32);
    ct_tensor *dev_t = device_tensor(0, 4, CT_FLOAT32, NULL);
    ASSERT_TRUE(t && out && dev_t);
    ct_work *work = NULL;
    ASSERT_RC(ct_comm_allreduce(comm, t, CT_REDUCE_SUM, &work), CT_EDEVICE, "allreduce",
              "CUDA tensors", "cuda:0", "got a tensor on cpu");
    ASSERT_TRUE(work == NULL);
    ASSERT_RC(ct_comm_broadcast(comm, t, 0, NULL), CT_EDEVICE, "broadcast", "cpu");
    ASSERT_RC(ct_comm_reduce(comm, t, CT_REDUCE_MAX, 0, NULL), CT_EDEVICE, "reduce", "cpu");
    ASSERT_RC(ct_comm_allgather(comm, out, dev_t, NULL), CT_EDEVICE, "allgather", "cpu");
    ASSERT_RC(ct_comm_reduce_scatter(comm, dev_t, t, CT_REDUCE_SUM, NULL), CT_EDEVICE,
              "reduce_scatter", "cpu");
    ASSERT_RC(ct_comm_alltoall(comm, out, t, NULL), CT_EDEVICE, "alltoall", "cpu");
    ASSERT_RC(ct_comm_send(comm, t, 0, 0, &work), CT_EDEVICE, "send", "cpu");
    ASSERT_TRUE(work == NULL);
    ASSERT_RC(ct_comm_recv(comm, t, 0, 0, NULL), CT_EDEVICE, "recv", "cpu");
    ASSERT_EQ(ct_comm_allreduce(comm, dev_t, CT_REDUCE_SUM, NULL), 0);
    ct_comm_free(comm);
}

/* A barrier is the agreement check's allreduce alone. */
TEST(barriers_complete) {
    require_device();
    ct_comm *comm = comm_single();
    ASSERT_TRUE(comm != NULL);
    ASSERT_EQ(ct_comm_barrier(comm, NULL), 0);
    enum { N = 8 };
    ct_work *works[N] = {0};
    for (int i = 0; i < N; i++)
        ASSERT_EQ(ct_comm_barrier(comm, &works[i]), 0);
    for (int i = N - 1; i >= 0; i--)
        ASSERT_EQ(ct_work_wait(works[i]), 0);
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(ct_work_test(works[i]), 1);
        ct_work_free(works[i]);
    }
    ct_comm_stats stats;
    ct_comm_stats_get(comm, &stats);
    ASSERT_EQ(stats.issued, N + 1);
    ASSERT_EQ(stats.completed, N + 1);
    ASSERT_TRUE(stats.pending_op == NULL);
    ct_comm_free(comm);
}

/* On one rank every collective is a copy (or the identity), in each
 * dtype's NCCL mapping. */
TEST(collectives_of_one_rank) {
    require_device();
    ct_comm *comm = comm_single();
    ASSERT_TRUE(comm != NULL);
    float f[5] = {1.5f, -2, 0, 3.25f, 1e6f}, got[5];
    ct_tensor *t = device_tensor(0, 5, CT_FLOAT32, f);
    ct_tensor *o = device_tensor(0, 5, CT_FLOAT32, NULL);
    ASSERT_TRUE(t && o);
    const ct_reduce_op ops[] = {CT_REDUCE_SUM, CT_REDUCE_AVG, CT_REDUCE_MIN, CT_REDUCE_MAX,
                                CT_REDUCE_PROD};
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        ASSERT_EQ(ct_comm_allreduce(comm, t, ops[i], NULL), 0);
        ASSERT_EQ(ct_comm_reduce(comm, t, ops[i], 0, NULL), 0);
    }
    ASSERT_EQ(ct_comm_broadcast(comm, t, 0, NULL), 0);
    ASSERT_TRUE(download(t, got));
    ASSERT_EQ(memcmp(got, f, sizeof f), 0);
    ASSERT_EQ(ct_comm_allgather(comm, o, t, NULL), 0);
    ASSERT_TRUE(download(o, got));
    ASSERT_EQ(memcmp(got, f, sizeof f), 0);
    ct_tensor *o2 = device_tensor(0, 5, CT_FLOAT32, NULL);
    ASSERT_TRUE(o2 != NULL);
    ASSERT_EQ(ct_comm_reduce_scatter(comm, o2, t, CT_REDUCE_SUM, NULL), 0);
    ASSERT_TRUE(download(o2, got));
    ASSERT_EQ(memcmp(got, f, sizeof f), 0);
    ct_tensor *o3 = device_tensor(0, 5, CT_FLOAT32, NULL);
    ASSERT_TRUE(o3 != NULL);
    ASSERT_EQ(ct_comm_alltoall(comm, o3, t, NULL), 0);
    ASSERT_TRUE(download(o3, got));
    ASSERT_EQ(memcmp(got, f, sizeof f), 0);

    uint8_t b[4] = {0, 1, 1, 0}, bgot[4];
    ct_tensor *tb = device_tensor(0, 4, CT_BOOL, b);
    ASSERT_TRUE(tb != NULL);
    ASSERT_EQ(ct_comm_allreduce(comm, tb, CT_REDUCE_SUM, NULL), 0);
    ASSERT_EQ(ct_comm_allreduce(comm, tb, CT_REDUCE_PROD, NULL), 0);
    ASSERT_TRUE(download(tb, bgot));
    ASSERT_EQ(memcmp(bgot, b, sizeof b), 0);
    ASSERT_RC(ct_comm_allreduce(comm, tb, CT_REDUCE_AVG, NULL), CT_EDTYPE, "avg", "bool");

    ct_tensor *empty = device_tensor(0, 0, CT_INT64, NULL);
    ASSERT_TRUE(empty != NULL);
    ASSERT_EQ(ct_comm_allreduce(comm, empty, CT_REDUCE_MAX, NULL), 0);
    ct_comm_free(comm);
}

/* Freeing a communicator with work in flight waits for it. */
TEST(free_with_work_in_flight) {
    require_device();
    ct_comm *comm = comm_single();
    ASSERT_TRUE(comm != NULL);
    ct_tensor *t = device_tensor(0, 1 << 20, CT_FLOAT32, NULL);
    ASSERT_TRUE(t != NULL);
    ct_work *a = NULL, *b = NULL;
    ASSERT_EQ(ct_comm_allreduce(comm, t, CT_REDUCE_SUM, &a), 0);
    ASSERT_EQ(ct_comm_barrier(comm, &b), 0);
    ct_comm_free(comm);
    ASSERT_EQ(ct_work_wait(a), 0);
    ASSERT_EQ(ct_work_wait(b), 0);
    ct_work_free(a);
    ct_work_free(b);
}

TEST(split_of_one_rank) {
    require_device();
    ct_comm *comm = comm_single();
    ASSERT_TRUE(comm != NULL);
    ct_comm *sub = NULL;
    ASSERT_EQ(ct_comm_split(comm, 3, 0, &sub), 0);
    ASSERT_TRUE(sub != NULL);
    ASSERT_EQ(ct_comm_backend(sub), CT_BACKEND_NCCL);
    ASSERT_EQ(ct_comm_rank(sub), 0);
    ASSERT_EQ(ct_comm_size(sub), 1);
    ASSERT_EQ(ct_comm_barrier(sub, NULL), 0);
    ct_comm *none = (ct_comm *)&none;
    ASSERT_EQ(ct_comm_split(comm, CT_COMM_SPLIT_NONE, 0, &none), 0);
    ASSERT_TRUE(none == NULL);
    ASSERT_EQ(ct_comm_barrier(comm, NULL), 0);
    ct_comm_free(sub);
    ct_comm_free(comm);
}

/* -------------------------------------------------------- several ranks */

/* One thread per rank, rank r on device r, each running a body with its
 * own communicator inside a scope. */
typedef struct rank_ctx {
    const ncclUniqueId *id;
    int rank, size;
    double timeout_s;
    void (*body)(struct rank_ctx *);
    ct_comm *comm;
    int rc;        /* for bodies that leave the verdict to the test */
    char msg[512]; /* and the message that came with rc */
} rank_ctx;

static void *rank_main(void *arg) {
    rank_ctx *r = arg;
    ct_scope_begin();
    r->comm = comm_on(r->id, r->rank, r->size, r->rank, r->timeout_s);
    if (r->comm)
        r->body(r);
    else
        tt_fail(__FILE__, __LINE__, "rank %d: ct_comm_new: %s", r->rank, ct_errmsg());
    ct_comm_free(r->comm);
    ct_scope_end();
    return NULL;
}

/* How many ranks the tests of several ranks use: one per device, at most
 * MAX_RANKS; 0 (after saying so) with fewer than 2 devices. The harness has
 * no per-test skip, so such a test passes with a note. */
static int ranks_available(const char *test) {
    require_device();
    int n = device_count();
    if (n >= 2)
        return n < MAX_RANKS ? n : MAX_RANKS;
    printf("  note: %s needs 2 CUDA devices, this machine has %d: not run\n", test, n);
    return 0;
}

/* Runs body on size ranks; ctx (size of them) receives each rank's state. */
static void run_ranks(int size, double timeout_s, void (*body)(rank_ctx *), rank_ctx *ctx) {
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
        tt_fail(__FILE__, __LINE__, "ncclGetUniqueId: %s", ncclGetErrorString(r));
        return;
    }
    pthread_t th[MAX_RANKS];
    int started = 0;
    for (; started < size; started++) {
        ctx[started] = (rank_ctx){&id, started, size, timeout_s, body, NULL, 0, ""};
        if (pthread_create(&th[started], NULL, rank_main, &ctx[started]) != 0) {
            tt_fail(__FILE__, __LINE__, "pthread_create failed");
            break;
        }
    }
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
}

enum { N = 7 };

static void allreduce_body(rank_ctx *r) {
    int p = r->rank, n = r->size;
    float f[N], got[N];
    for (int i = 0; i < N; i++)
        f[i] = (float)(i * (p + 1));
    ct_tensor *t = device_tensor(p, N, CT_FLOAT32, f);
    ct_tensor *a = device_tensor(p, N, CT_FLOAT32, f);
    int64_t v[N], vgot[N];
    for (int i = 0; i < N; i++)
        v[i] = p * 10 + i;
    ct_tensor *ti = device_tensor(p, N, CT_INT64, v);
    uint8_t b[4] = {p == 1, 0, 1, p != 0}, bor[4], band[4];
    ct_tensor *tor = device_tensor(p, 4, CT_BOOL, b), *tand = device_tensor(p, 4, CT_BOOL, b);
    ASSERT_TRUE(t && a && ti && tor && tand);
    ct_work *w[5] = {0};
    ASSERT_EQ(ct_comm_allreduce(r->comm, t, CT_REDUCE_SUM, &w[0]), 0);
    ASSERT_EQ(ct_comm_allreduce(r->comm, a, CT_REDUCE_AVG, &w[1]), 0);
    ASSERT_EQ(ct_comm_allreduce(r->comm, ti, CT_REDUCE_MAX, &w[2]), 0);
    ASSERT_EQ(ct_comm_allreduce(r->comm, tor, CT_REDUCE_SUM, &w[3]), 0);
    ASSERT_EQ(ct_comm_allreduce(r->comm, tand, CT_REDUCE_PROD, &w[4]), 0);
    for (int k = 4; k >= 0; k--) {
        ASSERT_EQ(ct_work_wait(w[k]), 0);
        ct_work_free(w[k]);
    }
    float s = (float)(n * (n + 1) / 2);
    ASSERT_TRUE(download(t, got));
    for (int i = 0; i < N; i++)
        ASSERT_NEAR(got[i], i * s, 0);
    ASSERT_TRUE(download(a, got));
    for (int i = 0; i < N; i++)
        ASSERT_NEAR(got[i], i * s / (float)n, 1e-5 * i * s);
    ASSERT_TRUE(download(ti, vgot));
    for (int i = 0; i < N; i++)
        ASSERT_EQ(vgot[i], (n - 1) * 10 + i);
    ASSERT_TRUE(download(tor, bor) && download(tand, band));
    const uint8_t want_or[4] = {1, 0, 1, 1}, want_and[4] = {0, 0, 1, 0};
    ASSERT_EQ(memcmp(bor, want_or, 4), 0);
    ASSERT_EQ(memcmp(band, want_and, 4), 0);
}

TEST(allreduce_across_ranks) {
    int n = ranks_available("allreduce_across_ranks");
    if (n)
        run_ranks(n, 30, allreduce_body, (rank_ctx[MAX_RANKS]){0});
}

static void rooted_and_gather_body(rank_ctx *r) {
    int p = r->rank, n = r->size;
    int32_t x[2] = {p, p + 100}, y[2];
    ct_tensor *bc = device_tensor(p, 2, CT_INT32, x);
    ct_tensor *rd = device_tensor(p, 2, CT_INT32, x);
    ct_tensor *in = device_tensor(p, 2, CT_INT32, x);
    ct_tensor *all = device_tensor(p, 2 * n, CT_INT32, NULL);
    int32_t rs_in[2 * MAX_RANKS], a2a_in[MAX_RANKS], buf[2 * MAX_RANKS];
    for (int j = 0; j < 2 * n; j++)
        rs_in[j] = (p + 1) * (j + 1);
    for (int j = 0; j < n; j++)
        a2a_in[j] = p * 100 + j;
    ct_tensor *rs = device_tensor(p, 2 * n, CT_INT32, rs_in);
    ct_tensor *rs_out = device_tensor(p, 2, CT_INT32, NULL);
    ct_tensor *a2a = device_tensor(p, n, CT_INT32, a2a_in);
    ct_tensor *a2a_out = device_tensor(p, n, CT_INT32, NULL);
    ASSERT_TRUE(bc && rd && in && all && rs && rs_out && a2a && a2a_out);
    ASSERT_EQ(ct_comm_broadcast(r->comm, bc, n - 1, NULL), 0);
    ASSERT_EQ(ct_comm_reduce(r->comm, rd, CT_REDUCE_SUM, 0, NULL), 0);
    ASSERT_EQ(ct_comm_allgather(r->comm, all, in, NULL), 0);
    ASSERT_EQ(ct_comm_reduce_scatter(r->comm, rs_out, rs, CT_REDUCE_SUM, NULL), 0);
    ASSERT_EQ(ct_comm_alltoall(r->comm, a2a_out, a2a, NULL), 0);

    ASSERT_TRUE(download(bc, y));
    ASSERT_EQ(y[0], n - 1);
    ASSERT_EQ(y[1], n - 1 + 100);
    ASSERT_TRUE(download(rd, y));
    int sum = n * (n - 1) / 2;
    ASSERT_EQ(y[0], p == 0 ? sum : p); /* other ranks' t is unchanged */
    ASSERT_EQ(y[1], p == 0 ? sum + 100 * n : p + 100);
    ASSERT_TRUE(download(all, buf));
    for (int q = 0; q < n; q++) {
        ASSERT_EQ(buf[2 * q], q);
        ASSERT_EQ(buf[2 * q + 1], q + 100);
    }
    ASSERT_TRUE(download(rs_out, y));
    int ranks_sum = n * (n + 1) / 2;
    ASSERT_EQ(y[0], ranks_sum * (2 * p + 1));
    ASSERT_EQ(y[1], ranks_sum * (2 * p + 2));
    ASSERT_TRUE(download(a2a_out, buf));
    for (int q = 0; q < n; q++)
        ASSERT_EQ(buf[q], q * 100 + p);
}

TEST(rooted_and_gathering_collectives) {
    int n = ranks_available("rooted_and_gathering_collectives");
    if (n)
        run_ranks(n, 30, rooted_and_gather_body, (rank_ctx[MAX_RANKS]){0});
}

/* NCCL's send completes only once the peer receives, on streams that run
 * in order: two ranks that both send first would wait for each other
 * forever. So in each pair (0, 1), (2, 3) the even rank sends first. */
static void send_recv_body(rank_ctx *r) {
    int p = r->rank, peer = p ^ 1;
    if (peer >= r->size)
        return;
    double mine[3] = {p, p + 0.5, -p}, theirs[3];
    ct_tensor *s = device_tensor(p, 3, CT_FLOAT64, mine);
    ct_tensor *d = device_tensor(p, 3, CT_FLOAT64, NULL);
    ASSERT_TRUE(s && d);
    ct_work *ws = NULL, *wr = NULL;
    if (p % 2 == 0) {
        ASSERT_EQ(ct_comm_send(r->comm, s, peer, 7, &ws), 0);
        ASSERT_EQ(ct_comm_recv(r->comm, d, peer, 7, &wr), 0);
    } else {
        ASSERT_EQ(ct_comm_recv(r->comm, d, peer, 7, &wr), 0);
        ASSERT_EQ(ct_comm_send(r->comm, s, peer, 7, &ws), 0);
    }
    ASSERT_EQ(ct_work_wait(wr), 0);
    ASSERT_EQ(ct_work_wait(ws), 0);
    ct_work_free(wr);
    ct_work_free(ws);
    ASSERT_TRUE(download(d, theirs));
    ASSERT_NEAR(theirs[0], peer, 0);
    ASSERT_NEAR(theirs[1], peer + 0.5, 0);
    ASSERT_NEAR(theirs[2], -peer, 0);
}

TEST(send_recv_pairs) {
    int n = ranks_available("send_recv_pairs");
    if (n)
        run_ranks(n, 30, send_recv_body, (rank_ctx[MAX_RANKS]){0});
}

/* Rank 0 leaves; the others split by parity, ordered by descending rank,
 * with an allreduce still in flight on the parent when split is called. */
static void split_body(rank_ctx *r) {
    int p = r->rank, n = r->size;
    ct_tensor *t = device_tensor(p, 3, CT_INT32, (int32_t[]){p, p, p});
    ASSERT_TRUE(t != NULL);
    ct_work *w = NULL;
    ASSERT_EQ(ct_comm_allreduce(r->comm, t, CT_REDUCE_SUM, &w), 0);
    ct_comm *sub = (ct_comm *)&sub;
    ASSERT_EQ(ct_comm_split(r->comm, p == 0 ? CT_COMM_SPLIT_NONE : p % 2, -p, &sub), 0);
    ASSERT_EQ(ct_work_wait(w), 0);
    ct_work_free(w);
    if (p == 0) {
        ASSERT_TRUE(sub == NULL);
        return;
    }
    ASSERT_TRUE(sub != NULL);
    int members = 0, above = 0, sum = 0;
    for (int q = 1; q < n; q++)
        if (q % 2 == p % 2) {
            members++;
            above += q > p;
            sum += q;
        }
    ASSERT_EQ(ct_comm_size(sub), members);
    ASSERT_EQ(ct_comm_rank(sub), above);
    int32_t v[3] = {p, 1, -p}, got[3];
    ct_tensor *u = device_tensor(p, 3, CT_INT32, v);
    ASSERT_TRUE(u != NULL);
    ASSERT_EQ(ct_comm_allreduce(sub, u, CT_REDUCE_SUM, NULL), 0);
    ASSERT_TRUE(download(u, got));
    ASSERT_EQ(got[0], sum);
    ASSERT_EQ(got[1], members);
    ASSERT_EQ(got[2], -sum);
    ct_comm_free(sub);
}

TEST(split_by_color) {
    int n = ranks_available("split_by_color");
    if (n)
        run_ranks(n, 30, split_body, (rank_ctx[MAX_RANKS]){0});
}

/* Rank 0 allreduces 4 elements, the others 5: every rank fails with the
 * same CT_EMISMATCH naming both sides, and the real allreduce never runs. */
static void mismatch_body(rank_ctx *r) {
    ct_tensor *t = device_tensor(r->rank, r->rank == 0 ? 4 : 5, CT_FLOAT32, NULL);
    ASSERT_TRUE(t != NULL);
    ASSERT_RC(ct_comm_allreduce(r->comm, t, CT_REDUCE_SUM, NULL), CT_EMISMATCH,
              "allreduce #1: ranks disagree", "rank 0 has allreduce #1 (float32, 4 elements, sum)",
              "(float32, 5 elements, sum)");
    ASSERT_RC(ct_comm_barrier(r->comm, NULL), CT_ESTATE, "failed earlier", "ranks disagree");
}

TEST(mismatched_counts_fail_on_every_rank) {
    int n = ranks_available("mismatched_counts_fail_on_every_rank");
    if (n)
        run_ranks(n, 30, mismatch_body, (rank_ctx[MAX_RANKS]){0});
}

/* The last rank arrives after the others' timeout. The first of them to
 * time out fails with CT_ETIMEDOUT naming the operation and aborts its
 * NCCL communicator; the others time out too, or see that abort as a peer's
 * failure (CT_EPEER), whichever NCCL notices first. The late rank fails
 * within its own timeout instead of hanging. */
static void late_rank_body(rank_ctx *r) {
    ct_tensor *t = device_tensor(r->rank, 16, CT_FLOAT32, NULL);
    ASSERT_TRUE(t != NULL);
    double t0 = tt_now();
    if (r->rank == r->size - 1) {
        struct timespec ts = {2, 0};
        nanosleep(&ts, NULL);
    }
    r->rc = ct_comm_allreduce(r->comm, t, CT_REDUCE_SUM, NULL);
    snprintf(r->msg, sizeof r->msg, "%s", ct_errmsg());
    ASSERT_TRUE(tt_now() - t0 < (r->rank == r->size - 1 ? 2 : 0) + 3 * r->timeout_s);
}

TEST(late_rank_times_out) {
    int n = ranks_available("late_rank_times_out");
    if (!n)
        return;
    rank_ctx ctx[MAX_RANKS];
    run_ranks(n, 1, late_rank_body, ctx);
    int timed_out = 0;
    for (int r = 0; r < n; r++) {
        ASSERT_TRUE(ctx[r].rc < 0);
        if (r == n - 1)
            continue;
        ASSERT_TRUE(ctx[r].rc == CT_ETIMEDOUT || ctx[r].rc == CT_EPEER);
        ASSERT_STR_CONTAINS(ctx[r].msg, "allreduce #1");
        if (ctx[r].rc == CT_ETIMEDOUT) {
            ASSERT_STR_CONTAINS(ctx[r].msg, "timed out");
            ASSERT_STR_CONTAINS(ctx[r].msg, "NCCL cannot tell which ranks did not arrive");
            timed_out++;
        }
    }
    ASSERT_TRUE(timed_out > 0);
}

/* CPU parameters with the nccl communicator are refused, naming both
 * devices. */
TEST(ddp_refuses_parameters_off_the_communicators_device) {
    require_device();
    ct_comm *comm = comm_single();
    ASSERT_TRUE(comm != NULL);
    ct_module *model = ct_linear_new(4, 2, true);
    ASSERT_FAILS(ct_ddp_new(comm, model, NULL), CT_EDEVICE, "ddp", "is on cpu", "nccl", "cuda:0");
    ct_module_free(model);
    ct_comm_free(comm);
}
