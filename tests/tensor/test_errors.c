/* The error-reporting macros (tensor/base/error_impl.h, CT_TRY in ct/tensor.h):
 * what each records, what it returns, and that nothing runs after it
 * returns. */
#include "ct_test.h"
#include "tensor_impl.h"

#include <pthread.h>

static int reached; /* how far the last helper ran */

static int require_positive(int x) {
    reached = 0;
    CT_REQUIRE(x > 0, CT_EINVAL, "positive: %d is not", x);
    reached = 1;
    return 0;
}

static int fail_with(int code) {
    return code ? ct__err_set(code, "inner: failed with %d", code) : 0;
}

static int try_twice(int first, int second) {
    reached = 0;
    CT_TRY(fail_with(first));
    reached = 1;
    CT_TRY(fail_with(second));
    reached = 2;
    return 0;
}

static int count_of_three(void) { return 3; }

static int try_count(void) {
    reached = 0;
    CT_TRY(count_of_three());
    reached = 1;
    return 0;
}

static int check_entry(const char *file, const char *name, int ndim, int dtype_ok) {
    ct__errctx cx;
    ct__err_ctx_init(&cx, "reader: %s: tensor '%s': ", file, name);
    CT_REQUIRE_CTX(&cx, dtype_ok, CT_ENOTSUP, "dtype %s is not supported", "F8");
    CT_REQUIRE_CTX(&cx, ndim <= 8, CT_ECORRUPT, "shape has %d dims", ndim);
    return 0;
}

TEST(require_records_the_code_and_message_and_returns_the_code) {
    ct_errclear();
    ASSERT_EQ(require_positive(2), 0);
    ASSERT_EQ(reached, 1);
    ASSERT_EQ(ct_errcode(), CT_OK);
    ASSERT_RC(require_positive(-3), CT_EINVAL, "positive: -3 is not");
    ASSERT_EQ(reached, 0);
}

TEST(try_passes_on_the_first_failure_and_its_message) {
    ASSERT_EQ(try_twice(0, 0), 0);
    ASSERT_EQ(reached, 2);
    ASSERT_RC(try_twice(CT_EIO, CT_ESHAPE), CT_EIO, "inner: failed with -9");
    ASSERT_EQ(reached, 0);
    ASSERT_RC(try_twice(0, CT_ESHAPE), CT_ESHAPE, "inner: failed with -2");
    ASSERT_EQ(reached, 1);
}

TEST(try_takes_a_positive_result_for_success) {
    ASSERT_EQ(try_count(), 0);
    ASSERT_EQ(reached, 1);
}

TEST(a_context_prefixes_each_message_exactly_once) {
    ASSERT_EQ(check_entry("a.st", "w", 2, 1), 0);
    ct_errclear();
    ASSERT_EQ(check_entry("a.st", "w", 9, 1), CT_ECORRUPT);
    ASSERT_EQ(strcmp(ct_errmsg(), "reader: a.st: tensor 'w': shape has 9 dims"), 0);
    ASSERT_EQ(check_entry("b.st", "v", 9, 0), CT_ENOTSUP);
    ASSERT_EQ(strcmp(ct_errmsg(), "reader: b.st: tensor 'v': dtype F8 is not supported"), 0);
}

TEST(a_context_message_may_wrap_the_previous_one) {
    ct__err_set(CT_EIO, "read: short");
    ct__errctx cx;
    ct__err_ctx_init(&cx, "loader: %s: ", "x.npy");
    ASSERT_EQ(ct__err_ctx_set(&cx, ct_errcode(), "%s", ct_errmsg()), CT_EIO);
    ASSERT_EQ(strcmp(ct_errmsg(), "loader: x.npy: read: short"), 0);
}

/* A prefix or a message longer than the buffer is cut, NUL-terminated,
 * and nothing past CT__ERRMSG_MAX is written. */
TEST(a_long_prefix_and_message_are_cut_not_overflowed) {
    char name[3 * CT__ERRMSG_MAX];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    struct {
        ct__errctx cx;
        char guard[16];
    } s;
    memset(s.guard, 'G', sizeof s.guard);
    ct__err_ctx_init(&s.cx, "reader: %s", name);
    ASSERT_EQ(strlen(s.cx.prefix), CT__ERRMSG_MAX - 1);
    ASSERT_EQ(memcmp(s.guard, "GGGGGGGGGGGGGGGG", sizeof s.guard), 0);

    ASSERT_EQ(ct__err_ctx_set(&s.cx, CT_ECORRUPT, "tail %d", 1), CT_ECORRUPT);
    ASSERT_EQ(strlen(ct_errmsg()), CT__ERRMSG_MAX - 1);
    ASSERT_EQ(strncmp(ct_errmsg(), "reader: nnn", 11), 0);

    /* A prefix that fits leaves the message's start, then cuts it. */
    ct__err_ctx_init(&s.cx, "reader: %s: ", "short");
    ct__err_ctx_set(&s.cx, CT_ECORRUPT, "%s", name);
    ASSERT_EQ(strlen(ct_errmsg()), CT__ERRMSG_MAX - 1);
    ASSERT_EQ(strncmp(ct_errmsg(), "reader: short: nnn", 18), 0);
    ct_errclear();
}

/* The error state is per thread: a message recorded on one thread through
 * a context is not seen on another. */
static void *fail_on_thread(void *arg) {
    (void)arg;
    ct__errctx cx;
    ct__err_ctx_init(&cx, "thread: ");
    ct__err_ctx_set(&cx, CT_EPEER, "failed");
    return strcmp(ct_errmsg(), "thread: failed") == 0 ? arg : NULL;
}

TEST(contexts_leave_other_threads_errors_alone) {
    ct_errclear();
    ct__err_set(CT_EIO, "main: kept");
    pthread_t th;
    void *ok = NULL;
    int marker;
    ASSERT_EQ(pthread_create(&th, NULL, fail_on_thread, &marker), 0);
    ASSERT_EQ(pthread_join(th, &ok), 0);
    ASSERT_TRUE(ok == &marker);
    ASSERT_EQ(ct_errcode(), CT_EIO);
    ASSERT_EQ(strcmp(ct_errmsg(), "main: kept"), 0);
    ct_errclear();
}
