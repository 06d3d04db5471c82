/* The test device (testdev.h) runs every op that the dispatch table
 * carries, and each result equals the CPU's bit for bit; host code that
 * touches its memory faults; a kernel registered for the wrong op, or an
 * entry left out, is caught; its memory statistics follow its tensors. Its
 * streams are CUDA's: a missing synchronize, and a storage freed under a
 * side stream's work without record_stream, each make a check fail. */
#include "ct_test.h"
#include "testdev.h"

#include <ct/cuda.h>

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((constructor)) static void register_device(void) {
    if (testdev_register())
        abort();
}

/* Whether dev, brought to the host, has cpu's dtype, shape and bytes. */
static bool same(const char *what, ct_tensor *cpu, ct_tensor *dev) {
    if (!cpu || !dev) {
        tt_fail(__FILE__, __LINE__, "%s: an op failed: %s", what, ct_errmsg());
        return false;
    }
    ct_device d = ct_tensor_device(dev);
    if (d.type != CT_TEST) {
        tt_fail(__FILE__, __LINE__, "%s: the result is not on the test device", what);
        return false;
    }
    ct_tensor *a = ct_contiguous(cpu), *b = ct_contiguous(ct_to(dev, CT_DEVICE_CPU));
    bool ok = a && b && ct_tensor_dtype(a) == ct_tensor_dtype(b) && ct_ndim(a) == ct_ndim(b);
    for (int i = 0; ok && i < ct_ndim(a); i++)
        ok = ct_size(a, i) == ct_size(b, i);
    ok = ok && !memcmp(ct_data_ptr(a), ct_data_ptr(b),
                       (size_t)ct_numel(a) * ct_dtype_size(ct_tensor_dtype(a)));
    if (!ok)
        tt_fail(__FILE__, __LINE__, "%s: the test device's result differs from the CPU's", what);
    return ok;
}

#define SAME(what, cpu, dev)                                                                       \
    do {                                                                                           \
        if (!same(what, cpu, dev))                                                                 \
            return;                                                                                \
    } while (0)

static ct_tensor *on_dev(ct_tensor *t) { return ct_to(t, CT_DEVICE_TEST); }

/* x [4, 6] float32 of varied values, its transpose (a view), y [6]. */
static void inputs(ct_tensor **x, ct_tensor **xt, ct_tensor **y) {
    ct_generator g = {.seed = 7, .offset = 0};
    *x = ct_sub_scalar(ct_mul_scalar(ct_rand(CT_SHAPE(4, 6), CT_FLOAT32, &g), 4), 2);
    *xt = ct_transpose(*x, 0, 1);
    *y = ct_rand(CT_SHAPE(6), CT_FLOAT32, &g);
}

TEST(elementwise_ops_match_the_cpu) {
    ct_tensor *x, *xt, *y;
    inputs(&x, &xt, &y);
    ct_tensor *dx = on_dev(x), *dxt = ct_transpose(dx, 0, 1), *dy = on_dev(y);
    SAME("add (broadcast)", ct_add(x, y), ct_add(dx, dy));
    SAME("sub of a view", ct_sub(xt, ct_ones(CT_SHAPE(6, 1), CT_FLOAT32)),
         ct_sub(dxt, on_dev(ct_ones(CT_SHAPE(6, 1), CT_FLOAT32))));
    SAME("mul_scalar", ct_mul_scalar(x, 3), ct_mul_scalar(dx, 3));
    SAME("div", ct_div(x, y), ct_div(dx, dy));
    SAME("pow", ct_pow(ct_abs(x), y), ct_pow(ct_abs(dx), dy));
    SAME("maximum", ct_maximum(x, y), ct_maximum(dx, dy));
    SAME("eq", ct_gt(x, y), ct_gt(dx, dy));
    SAME("exp", ct_exp(xt), ct_exp(dxt));
    SAME("gelu", ct_gelu(x), ct_gelu(dx));
    SAME("clamp", ct_clamp(x, -1, 1), ct_clamp(dx, -1, 1));
    SAME("where", ct_where(ct_gt(x, y), x, y), ct_where(ct_gt(dx, dy), dx, dy));
    SAME("masked_fill", ct_masked_fill(x, ct_lt(x, y), 5), ct_masked_fill(dx, ct_lt(dx, dy), 5));
    ct_tensor *dz = ct_full_on(CT_SHAPE(3, 2), 1.5, CT_FLOAT64, CT_DEVICE_TEST);
    SAME("full_on", ct_full(CT_SHAPE(3, 2), 1.5, CT_FLOAT64), dz);
    SAME("in place", ct_add_(ct_clone(x), y), ct_add_(ct_clone(dx), dy));
    ASSERT_NEAR(ct_item(ct_sum(dx, NULL, 0, false)), ct_item(ct_sum(x, NULL, 0, false)), 0);
}

TEST(reductions_and_softmax_match_the_cpu) {
    ct_tensor *x, *xt, *y;
    inputs(&x, &xt, &y);
    ct_tensor *dx = on_dev(x), *dxt = ct_transpose(dx, 0, 1);
    int d1 = 1, d0 = 0;
    SAME("sum", ct_sum(x, &d1, 1, false), ct_sum(dx, &d1, 1, false));
    SAME("mean of a view", ct_mean(xt, &d0, 1, true), ct_mean(dxt, &d0, 1, true));
    SAME("var", ct_var(x, &d0, 1, 1, false), ct_var(dx, &d0, 1, 1, false));
    SAME("amax", ct_amax(x, NULL, 0, false), ct_amax(dx, NULL, 0, false));
    SAME("argmax", ct_argmax(x, 1, false), ct_argmax(dx, 1, false));
    SAME("norm", ct_norm(x, 3, &d1, 1, false), ct_norm(dx, 3, &d1, 1, false));
    SAME("logsumexp", ct_logsumexp(x, &d1, 1, false), ct_logsumexp(dx, &d1, 1, false));
    ct_tensor *ci, *di;
    SAME("max_dim", ct_max_dim(x, 0, false, &ci), ct_max_dim(dx, 0, false, &di));
    SAME("max_dim's indices", ci, di);
    SAME("softmax", ct_softmax(x, 1), ct_softmax(dx, 1));
    SAME("log_softmax of a view", ct_log_softmax(xt, 0), ct_log_softmax(dxt, 0));
}

TEST(index_ops_and_random_draws_match_the_cpu) {
    ct_tensor *x, *xt, *y;
    inputs(&x, &xt, &y);
    ct_tensor *dx = on_dev(x);
    ct_tensor *idx = ct_from_data((int64_t[]){3, 0, 2}, CT_SHAPE(3), CT_INT64), *didx = on_dev(idx);
    SAME("index_select", ct_index_select(x, 0, idx), ct_index_select(dx, 0, didx));
    ct_tensor *g = ct_from_data((int64_t[]){1, 0, 5, 2, 4, 3, 0, 1}, CT_SHAPE(4, 2), CT_INT64);
    SAME("gather", ct_gather(x, 1, g), ct_gather(dx, 1, on_dev(g)));
    ct_tensor *src = ct_ones(CT_SHAPE(4, 2), CT_FLOAT32);
    SAME("scatter_add", ct_scatter_add(x, 1, g, src),
         ct_scatter_add(dx, 1, on_dev(g), on_dev(src)));
    SAME("one_hot", ct_one_hot(idx, 5), ct_one_hot(didx, 5));
    SAME("tril", ct_tril(x, 1), ct_tril(dx, 1));
    ct_tensor *p = ct_mul_scalar(ct_ones(CT_SHAPE(64), CT_FLOAT32), 0.5);
    ct_generator a = {.seed = 3, .offset = 0}, b = {.seed = 3, .offset = 0};
    SAME("bernoulli", ct_bernoulli(p, &a), ct_bernoulli(on_dev(p), &b));
    SAME("matmul", ct_matmul(x, ct_transpose(x, 0, 1)), ct_matmul(dx, ct_transpose(dx, 0, 1)));
    SAME("matmul, int64 and batched",
         ct_matmul(ct_to_dtype(g, CT_INT64), ct_to_dtype(ct_transpose(g, 0, 1), CT_INT64)),
         ct_matmul(on_dev(g), ct_transpose(on_dev(g), 0, 1)));
    /* A bad index is found on the device and named as on the CPU. */
    ct_tensor *bad = on_dev(ct_from_data((int64_t[]){9}, CT_SHAPE(1), CT_INT64));
    ASSERT_TRUE(ct_index_select(dx, 0, bad) == NULL);
    ASSERT_EQ(ct_errcode(), CT_ERANGE);
    ASSERT_STR_CONTAINS(ct_errmsg(), "index 9 is out of range");
}

TEST(host_code_that_reads_device_memory_faults) {
    ct_tensor *d = on_dev(ct_ones(CT_SHAPE(16), CT_FLOAT32));
    ASSERT_TRUE(d != NULL);
    const volatile float *p = ct_data_ptr(d);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        float v = p[0]; /* without a copy through the table */
        (void)v;
        _exit(42);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    /* SIGSEGV, or ASan's report of it and its exit. */
    ASSERT_TRUE(!(WIFEXITED(status) && (WEXITSTATUS(status) == 42 || WEXITSTATUS(status) == 0)));
    ASSERT_TRUE(WIFSIGNALED(status) ? WTERMSIG(status) == SIGSEGV : true);
    /* Through the table the same element reads fine. */
    ASSERT_NEAR(ct_item(ct_select(d, 0, 0)), 1, 0);
}

/* dst = x + y by a kernel that computes x - y: the wrong op's kernel. */
static int (*real_binary)(int, ct_tensor *, ct_tensor *, ct_tensor *, double, ct_dtype, int,
                          const int64_t *);
static int wrong_binary(int op, ct_tensor *dst, ct_tensor *x, ct_tensor *y, double s, ct_dtype dt,
                        int nd, const int64_t *shape) {
    return real_binary(op == CT__BINARY_ADD ? CT__BINARY_SUB : op, dst, x, y, s, dt, nd, shape);
}

TEST(a_kernel_registered_for_the_wrong_op_is_caught) {
    ct_tensor *x, *xt, *y;
    inputs(&x, &xt, &y);
    ct_tensor *dx = on_dev(x), *dy = on_dev(y);
    real_binary = testdev_ops.binary;
    testdev_ops.binary = wrong_binary;
    ct_tensor *got = ct_to(ct_add(dx, dy), CT_DEVICE_CPU);
    testdev_ops.binary = real_binary;
    ct_tensor *want = ct_add(x, y);
    ASSERT_TRUE(got && want);
    ASSERT_TRUE(memcmp(ct_data_ptr(got), ct_data_ptr(want), 24 * sizeof(float)) != 0);
}

TEST(an_entry_the_device_lacks_is_an_error_naming_it) {
    ct_tensor *d = on_dev(ct_ones(CT_SHAPE(4), CT_FLOAT32));
    int (*real)(ct_tensor *, ct_tensor *, int, bool) = testdev_ops.softmax;
    testdev_ops.softmax = NULL;
    ct_tensor *r = ct_softmax(d, 0);
    testdev_ops.softmax = real;
    ASSERT_TRUE(r == NULL);
    ASSERT_EQ(ct_errcode(), CT_EDEVICE);
    ASSERT_STR_CONTAINS(ct_errmsg(), "softmax: no softmax kernel for test yet");
}

TEST(memory_statistics_follow_the_device_tensors) {
    int64_t before = ct_memory_allocated(CT_DEVICE_TEST);
    int64_t host = ct_memory_allocated(CT_DEVICE_CPU);
    ct_memory_reset_peak(CT_DEVICE_TEST);
    ct_scope_begin();
    ct_tensor *d = ct_full_on(CT_SHAPE(1000), 0, CT_FLOAT64, CT_DEVICE_TEST);
    int64_t during = ct_memory_allocated(CT_DEVICE_TEST);
    int64_t host_during = ct_memory_allocated(CT_DEVICE_CPU);
    ct_scope_end();
    ASSERT_TRUE(d != NULL);
    ASSERT_EQ(during, before + 8000);
    ASSERT_EQ(ct_memory_peak(CT_DEVICE_TEST), before + 8000);
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_TEST), before);
    /* The host's figures do not count the device's memory. */
    ASSERT_TRUE(host_during - host < 8000);
}

/* Whether ct_to_async(x * 2) to the host holds x * 2 when read, after a
 * synchronize (sync) or without one. */
static bool async_copy_agrees(bool sync) {
    ct_tensor *x = ct_arange(0, 64, 1, CT_FLOAT32);
    ct_tensor *got = ct_to_async(ct_mul_scalar(on_dev(x), 2), CT_DEVICE_CPU);
    if (!got || (sync && testdev_synchronize()))
        return false;
    return !memcmp(ct_data_ptr(got), ct_data_ptr(ct_mul_scalar(x, 2)), 64 * sizeof(float));
}

TEST(a_copy_to_the_host_without_a_wait_is_read_only_after_a_synchronize) {
    ASSERT_TRUE(async_copy_agrees(true));
    /* Without it the host reads what the device has not written yet. */
    ASSERT_TRUE(!async_copy_agrees(false));
    ct_tensor *early = ct_to_async(on_dev(ct_ones(CT_SHAPE(4), CT_FLOAT64)), CT_DEVICE_CPU);
    ASSERT_TRUE(early != NULL);
    ASSERT_TRUE(isnan(((const double *)ct_data_ptr(early))[0]));
    /* A copy that waits, and a value read back, wait for the queue. */
    ct_tensor *d = ct_add_scalar(on_dev(ct_zeros(CT_SHAPE(4), CT_FLOAT64)), 3);
    ASSERT_NEAR(ct_item(ct_sum(d, NULL, 0, false)), 12, 0);
    ASSERT_NEAR(((const double *)ct_data_ptr(ct_to(d, CT_DEVICE_CPU)))[3], 3, 0);
}

TEST(a_storage_is_freed_after_the_work_queued_before_it) {
    int64_t held = testdev_memory_held(), allocated = ct_memory_allocated(CT_DEVICE_TEST);
    ct_scope_begin();
    ct_tensor *a = ct_full_on(CT_SHAPE(1000), 3, CT_FLOAT64, CT_DEVICE_TEST);
    ct_tensor *b = ct_keep(ct_mul_scalar(a, 2));
    ct_scope_end();
    ASSERT_TRUE(b != NULL);
    /* a is gone from the statistics, as from a caching allocator's, but its
     * memory stays until the multiply that reads it has run. */
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_TEST), allocated + 8000);
    ASSERT_EQ(testdev_memory_held(), held + 16000);
    ASSERT_NEAR(ct_get(b, (int64_t[]){999}), 6, 0);
    ASSERT_EQ(testdev_memory_held(), held + 8000);
}

/* A collective standing in: dst = src + 1 on a side stream. */
typedef struct side_job {
    const float *src;
    float *dst;
    int n;
} side_job;

static void add_one(void *ctx) {
    side_job *j = ctx;
    for (int i = 0; i < j->n; i++)
        j->dst[i] = j->src[i] + 1;
}

TEST(record_stream_holds_a_storage_until_the_side_stream_has_run) {
    testdev_stream *s = testdev_stream_new();
    ASSERT_TRUE(s != NULL);
    int64_t held = testdev_memory_held();
    ct_tensor *dst = on_dev(ct_zeros(CT_SHAPE(256), CT_FLOAT32));
    ct_scope_begin();
    ct_tensor *src = ct_full_on(CT_SHAPE(256), 1.5, CT_FLOAT32, CT_DEVICE_TEST);
    side_job job = {ct_data_ptr(src), ct_data_ptr(dst), 256};
    int launched = testdev_stream_launch(s, (ct_tensor *[]){src, dst}, 2, add_one, &job);
    int recorded = testdev_ops.record_stream(src, s);
    ct_scope_end();
    ASSERT_EQ(launched, 0);
    ASSERT_EQ(recorded, 0);
    ASSERT_EQ(testdev_memory_held(), held + 2048);
    /* The side stream runs after the fill queued before it, from memory
     * that is still src's. */
    ASSERT_EQ(testdev_stream_synchronize(s), 0);
    ASSERT_CLOSE(ct_to(dst, CT_DEVICE_CPU), ct_full(CT_SHAPE(256), 2.5, CT_FLOAT32), 0, 0);
    /* Both streams have run past src's free now. */
    ASSERT_EQ(testdev_memory_held(), held + 1024);
    testdev_stream_free(s);
}

TEST(a_storage_freed_under_a_side_streams_work_without_record_stream_aborts) {
    testdev_stream *s = testdev_stream_new();
    ASSERT_TRUE(s != NULL);
    ct_tensor *dst = on_dev(ct_zeros(CT_SHAPE(256), CT_FLOAT32));
    ct_scope_begin();
    ct_tensor *src = ct_full_on(CT_SHAPE(256), 1.5, CT_FLOAT32, CT_DEVICE_TEST);
    side_job job = {ct_data_ptr(src), ct_data_ptr(dst), 256};
    int err[2];
    if (testdev_stream_launch(s, (ct_tensor *[]){src, dst}, 2, add_one, &job) || pipe(err))
        abort();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(err[1], 2);
        ct_scope_end(); /* frees src, which the side stream still reads */
        _exit(0);
    }
    close(err[1]);
    char msg[1024] = "";
    size_t got = 0;
    for (ssize_t n;
         got < sizeof msg - 1 && (n = read(err[0], msg + got, sizeof msg - 1 - got)) > 0;)
        got += (size_t)n;
    close(err[0]);
    int status = 0;
    pid_t waited = waitpid(pid, &status, 0);
    /* Here src lives until the side stream has run. */
    int synced = testdev_stream_synchronize(s);
    ct_scope_end();
    ASSERT_EQ(waited, pid);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    ASSERT_STR_CONTAINS(msg, "freed while side stream");
    ASSERT_STR_CONTAINS(msg, "no record_stream marked it");
    ASSERT_EQ(synced, 0);
    ASSERT_CLOSE(ct_to(dst, CT_DEVICE_CPU), ct_full(CT_SHAPE(256), 2.5, CT_FLOAT32), 0, 0);
    testdev_stream_free(s);
}

TEST(the_peak_counts_tensors_freed_before_the_queue_has_run) {
    ASSERT_EQ(testdev_synchronize(), 0);
    int64_t before = ct_memory_allocated(CT_DEVICE_TEST);
    ct_memory_reset_peak(CT_DEVICE_TEST);
    int made = 0;
    for (int i = 0; i < 4; i++) {
        ct_scope_begin();
        made += ct_full_on(CT_SHAPE(500), i, CT_FLOAT64, CT_DEVICE_TEST) != NULL;
        ct_scope_end();
    }
    ASSERT_EQ(made, 4);
    /* One at a time, whatever the queue still holds. */
    ASSERT_EQ(ct_memory_peak(CT_DEVICE_TEST), before + 4000);
    ASSERT_EQ(ct_memory_allocated(CT_DEVICE_TEST), before);
    ASSERT_EQ(testdev_synchronize(), 0);
}

/* One thread's ops on the device, queued among the others' and waited for
 * by whichever thread reads first: sum(k * ones(1000)). */
static void *sum_on_the_device(void *arg) {
    double *k = arg;
    ct_scope_begin();
    for (int i = 0; i < 20; i++) {
        ct_tensor *x = ct_mul_scalar(ct_full_on(CT_SHAPE(1000), 1, CT_FLOAT64, CT_DEVICE_TEST), *k);
        double got = ct_item(ct_sum(x, NULL, 0, false));
        *k = got == 1000 * *k ? *k : -1;
    }
    ct_scope_end();
    return NULL;
}

TEST(threads_share_the_compute_stream) {
    pthread_t th[4];
    double k[4] = {1, 2, 3, 4};
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, sum_on_the_device, &k[i]), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        ASSERT_NEAR(k[i], i + 1, 0);
}
