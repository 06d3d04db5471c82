/* The thread pool: coverage of ranges, nesting, concurrency, resizing and
 * fork. Run under TSan in CI. */
#include "ct_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct cover {
    atomic_int *hits;
    atomic_int calls;
    atomic_int nested_inline;
} cover;

static void mark(void *ctx, int64_t lo, int64_t hi) {
    cover *c = ctx;
    atomic_fetch_add(&c->calls, 1);
    for (int64_t i = lo; i < hi; i++)
        atomic_fetch_add(&c->hits[i], 1);
}

static bool covered_once(atomic_int *hits, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (atomic_load(&hits[i]) != 1)
            return false;
    return true;
}

TEST(every_index_is_visited_once_at_any_thread_count) {
    enum { N = 10007 };
    static atomic_int hits[N];
    for (int threads = 1; threads <= 4; threads++) {
        ASSERT_EQ(ct_set_num_threads(threads), 0);
        ASSERT_EQ(ct_get_num_threads(), threads);
        for (int64_t grain = 1; grain <= 20000; grain *= 7) {
            for (int i = 0; i < N; i++)
                atomic_store(&hits[i], 0);
            cover c = {.hits = hits};
            ct_parallel_for(0, N, grain, mark, &c);
            ASSERT_TRUE(covered_once(hits, N));
            /* Below the grain the range is not split. */
            if (grain >= N)
                ASSERT_EQ(atomic_load(&c.calls), 1);
            else
                ASSERT_TRUE(atomic_load(&c.calls) <= threads);
        }
    }
    ASSERT_EQ(ct_set_num_threads(0), CT_EINVAL);
    ct_parallel_for(5, 5, 1, mark, NULL); /* empty range: fn not called */
}

static void nested(void *ctx, int64_t lo, int64_t hi) {
    cover *c = ctx;
    ASSERT_TRUE(ct_in_parallel_region());
    /* A nested region runs inline as one call. */
    cover inner = {.hits = c->hits + lo};
    ct_parallel_for(0, hi - lo, 1, mark, &inner);
    if (atomic_load(&inner.calls) == 1)
        atomic_fetch_add(&c->nested_inline, 1);
    ASSERT_EQ(ct_set_num_threads(3), CT_ESTATE);
}

TEST(nested_regions_run_inline) {
    enum { N = 64 };
    static atomic_int hits[N];
    ct_set_num_threads(2);
    cover c = {.hits = hits};
    ASSERT_TRUE(!ct_in_parallel_region());
    ct_parallel_for(0, N, 1, nested, &c);
    ASSERT_TRUE(covered_once(hits, N));
    ASSERT_EQ(atomic_load(&c.nested_inline), 2);
    ASSERT_TRUE(!ct_in_parallel_region());
}

static void *concurrent_user(void *arg) {
    atomic_int *hits = arg;
    for (int rep = 0; rep < 50; rep++) {
        cover c = {.hits = hits};
        ct_parallel_for(0, 1000, 10, mark, &c);
    }
    return NULL;
}

TEST(concurrent_callers_share_the_pool) {
    static atomic_int hits[4][1000];
    ct_set_num_threads(2);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, concurrent_user, hits[i]);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 1000; j++)
            ASSERT_EQ(atomic_load(&hits[i][j]), 50);
}

TEST(ops_give_identical_results_at_one_and_two_threads) {
    ct_tensor *a = tt_rand(CT_SHAPE(512, 300), CT_FLOAT32, 3);
    ct_set_num_threads(1);
    ct_tensor *r1 =
        ct_tanh(ct_mul(a, ct_transpose(ct_view(ct_clone(a), CT_SHAPE(300, 512)), 0, 1)));
    ct_set_num_threads(2);
    ct_tensor *r2 =
        ct_tanh(ct_mul(a, ct_transpose(ct_view(ct_clone(a), CT_SHAPE(300, 512)), 0, 1)));
    ASSERT_CLOSE(r1, r2, 0, 0);
}

TEST(a_forked_child_gets_a_working_pool) {
    enum { N = 100000 };
    static atomic_int hits[N];
    ct_set_num_threads(2);
    cover c = {.hits = hits};
    ct_parallel_for(0, N, 1000, mark, &c); /* the parent's pool is running */
    pid_t pid = fork();
    ASSERT_TRUE(pid >= 0);
    if (pid == 0) {
        for (int i = 0; i < N; i++)
            atomic_store(&hits[i], 0);
        cover cc = {.hits = hits};
        ct_parallel_for(0, N, 1000, mark, &cc);
        ct_tensor *x = ct_add_scalar(ct_arange(0, 100000, 1, CT_FLOAT32), 1);
        bool ok = covered_once(hits, N) && atomic_load(&cc.calls) == 2 && x &&
                  ct_get(x, (int64_t[]){99999}) == 100000;
        ct_tensor_free(x);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
    /* The parent's pool still works after the fork. */
    for (int i = 0; i < N; i++)
        atomic_store(&hits[i], 0);
    cover c2 = {.hits = hits};
    ct_parallel_for(0, N, 1000, mark, &c2);
    ASSERT_TRUE(covered_once(hits, N));
}
