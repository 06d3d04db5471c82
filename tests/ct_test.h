/* ct test harness: one executable per topic, TEST() cases, assertions that
 * print both sides, and helpers that build tensors in every layout. */
#ifndef CT_TEST_H
#define CT_TEST_H

#include <ct/tensor.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef void (*tt_fn)(void);
void tt_register(const char *name, tt_fn fn);
void tt_fail(const char *file, int line, const char *fmt, ...) CT_PRINTF(3, 4);
int tt_failed(void); /* failures in the current test so far */
/* Seconds on the monotonic clock, for tests that bound how long things
 * take. */
double tt_now(void);

/* Whether an error message names rank r in a rank list ("rank 2", "ranks
 * that did not arrive: 0, 2"). */
bool tt_names_rank(const char *msg, int r);

/* Clears every variable that a launcher (ctlaunch, Open MPI, PMI, SLURM) or
 * ct_dist_init reads, then sets the NAME, VALUE pairs given (NULL-ended;
 * pairs may be NULL). Not thread-safe, as setenv is not. */
void tt_launch_env(const char *const *pairs);

/* path (256 bytes) = this process's temporary directory joined with name.
 * The directory is made on first use and removed, with everything in it,
 * at exit (children that end with _exit leave it alone). */
const char *tt_tmp_path(char path[static 256], const char *name);

/* path (256 bytes) = tt_tmp_path(name), holding exactly bytes[0..n) (a file
 * there before is replaced); aborts when it cannot be written. */
const char *tt_put_file(char path[static 256], const char *name, const void *bytes, size_t n);
/* The whole file at path (malloc'd, *n its size), or NULL. */
unsigned char *tt_read_file(const char *path, size_t *n);

/* Runs fn on a new thread, which has no scope: for tests of what happens at
 * the outermost scope (every TEST body runs inside one). */
void tt_run_unscoped(void (*fn)(void));

#define TEST(name)                                                                                 \
    static void test_##name(void);                                                                 \
    __attribute__((constructor)) static void tt_reg_##name(void) {                                 \
        tt_register(#name, test_##name);                                                           \
    }                                                                                              \
    static void test_##name(void)

#define ASSERT_TRUE(x)                                                                             \
    do {                                                                                           \
        if (!(x)) {                                                                                \
            tt_fail(__FILE__, __LINE__, "expected true: %s (ct_errmsg: %s)", #x, ct_errmsg());     \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define ASSERT_EQ(a, b)                                                                            \
    do {                                                                                           \
        long long tt_a = (long long)(a), tt_b = (long long)(b);                                    \
        if (tt_a != tt_b) {                                                                        \
            tt_fail(__FILE__, __LINE__, "%s == %s: %lld vs %lld (ct_errmsg: %s)", #a, #b, tt_a,    \
                    tt_b, ct_errmsg());                                                            \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define ASSERT_NEAR(a, b, tol)                                                                     \
    do {                                                                                           \
        double tt_a = (double)(a), tt_b = (double)(b);                                             \
        if (!(fabs(tt_a - tt_b) <= (tol)) && !(tt_a == tt_b)) {                                    \
            tt_fail(__FILE__, __LINE__, "%s ~= %s: %.9g vs %.9g (tol %g)", #a, #b, tt_a, tt_b,     \
                    (double)(tol));                                                                \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define ASSERT_STR_CONTAINS(s, sub)                                                                \
    do {                                                                                           \
        const char *tt_s = (s), *tt_sub = (sub);                                                   \
        if (!tt_s || !strstr(tt_s, tt_sub)) {                                                      \
            tt_fail(__FILE__, __LINE__, "\"%s\" does not contain \"%s\"", tt_s ? tt_s : "(null)",  \
                    tt_sub);                                                                       \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* Checks that the current error message holds each of the substrings;
 * clears the error afterwards. */
#define TT_MESSAGE_HOLDS_(...)                                                                     \
    do {                                                                                           \
        const char *tt_subs[] = {__VA_ARGS__};                                                     \
        for (size_t tt_i = 0; tt_i < sizeof tt_subs / sizeof *tt_subs; tt_i++)                     \
            ASSERT_STR_CONTAINS(ct_errmsg(), tt_subs[tt_i]);                                       \
        ct_errclear();                                                                             \
    } while (0)

/* Asserts that expr returned NULL with error code and a message holding each
 * of the given substrings. Clears the error afterwards. */
#define ASSERT_FAILS(expr, code, ...)                                                              \
    do {                                                                                           \
        ct_errclear();                                                                             \
        const void *tt_r = (const void *)(expr);                                                   \
        if (tt_r != NULL) {                                                                        \
            tt_fail(__FILE__, __LINE__, "expected %s to fail with %s", #expr, ct_errname(code));   \
            return;                                                                                \
        }                                                                                          \
        if (ct_errcode() != (code)) {                                                              \
            tt_fail(__FILE__, __LINE__, "%s failed with %s, expected %s: %s", #expr,               \
                    ct_errname(ct_errcode()), ct_errname(code), ct_errmsg());                      \
            return;                                                                                \
        }                                                                                          \
        TT_MESSAGE_HOLDS_(__VA_ARGS__);                                                            \
    } while (0)

/* Asserts that the int-returning expr returned code (a negative CT_E*) with
 * a message holding each of the given substrings. Clears the error. */
#define ASSERT_RC(expr, code, ...)                                                                 \
    do {                                                                                           \
        ct_errclear();                                                                             \
        int tt_rc = (expr);                                                                        \
        if (tt_rc != (code)) {                                                                     \
            tt_fail(__FILE__, __LINE__, "%s returned %s, expected %s: %s", #expr,                  \
                    ct_errname(tt_rc), ct_errname(code), ct_errmsg());                             \
            return;                                                                                \
        }                                                                                          \
        TT_MESSAGE_HOLDS_(__VA_ARGS__);                                                            \
    } while (0)

/* Asserts that two tensors have the same shape and values within
 * atol + rtol * |want| (NaNs must match). */
#define ASSERT_CLOSE(got, want, rtol, atol)                                                        \
    do {                                                                                           \
        if (!tt_close(__FILE__, __LINE__, (got), (want), (rtol), (atol)))                          \
            return;                                                                                \
    } while (0)

bool tt_close(const char *file, int line, ct_tensor *got, ct_tensor *want, double rtol,
              double atol);

/* Deterministic test data, independent of ct's own generator: uniform in
 * [-2, 2) for floats (rounded to the dtype), [-5, 5] for integers, 0/1 for
 * bool. */
ct_tensor *tt_rand(int ndim, const int64_t *sizes, ct_dtype dtype, uint64_t seed);

/* Layouts every op is tested on. */
typedef enum tt_layout {
    TT_CONTIGUOUS,
    TT_TRANSPOSED, /* same values, memory in reversed dim order */
    TT_STRIDED,    /* same values, every other element of a larger buffer */
    TT_NLAYOUTS
} tt_layout;

/* A tensor with t's values in the given layout (scope-owned). */
ct_tensor *tt_layout_of(ct_tensor *t, tt_layout layout);
const char *tt_layout_name(tt_layout layout);

/* Row-major linear element access for reference loops. */
double tt_at(ct_tensor *t, int64_t linear);
/* Broadcast-aware access: element of t at the multi-index idx of a tensor
 * with ndim dims that t broadcasts to. */
double tt_at_bcast(ct_tensor *t, int ndim, const int64_t *idx);
/* Multi-index of the linear row-major position in sizes. */
void tt_unravel(int64_t linear, int ndim, const int64_t *sizes, int64_t *idx);

/* ------------------------------------------------ multi-process jobs */

/* A launcher run (ctlaunch, mpirun) of a rank program, for tests that
 * drive real processes. Rank programs print "pid=<pid>" first, so that the
 * driver can kill them after a deadline and check that none is left. */
typedef struct tt_job {
    int status; /* waitpid's; -1 if it passed its deadline */
    char out[1 << 16], err[1 << 16];
    double seconds;
} tt_job;

/* Runs argv (argv[0] a path) with the variables in env ("NAME=VALUE" sets,
 * a bare "NAME" unsets; NULL-ended) and captures its output. Past deadline
 * seconds it kills the launcher and every rank that printed its pid (ranks
 * run in process groups of their own), and status is -1. Not thread-safe
 * (it forks). */
void tt_run_job(tt_job *j, const char *const *argv, const char *const *env, double deadline);
/* The job's exit code, 128 + the signal that ended it, or -1 past its
 * deadline. */
int tt_job_exit_code(const tt_job *j);
/* Whether every pid=N the ranks printed is gone, allowing a moment for the
 * launcher to reap them. */
bool tt_job_no_rank_left(const tt_job *j);
/* Whether each rank in [0, nranks) but skip (-1: none) printed the
 * harness's verdict "ok   <scenario>", and no rank printed FAIL: with
 * ctlaunch's "[rank R] " in front when tagged, else (mpirun) just that many
 * of them. */
bool tt_job_ranks_passed(const tt_job *j, const char *scenario, int nranks, int skip, bool tagged);
/* Runs rank_path's scenario on np ranks under the ctlaunch at launcher
 * (with a 20 s grace, so that survivors report before they are stopped,
 * and CT_BACKEND unset), within deadline seconds, and fails the test unless
 * it exits with code, every rank is gone, and every rank but skip (-1:
 * none) passed. */
void tt_ctlaunch_scenario(const char *launcher, const char *rank_path, int np, const char *scenario,
                          int code, int skip, double deadline);
/* The last few thousand characters of s, which hold the first failure when
 * a run goes wrong. */
const char *tt_tail(const char *s);

/* Fails the test (and returns) unless cond holds, showing the job's exit
 * code, time and the end of its output. */
#define TT_ASSERT_JOB(j, cond)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            tt_fail(__FILE__, __LINE__,                                                            \
                    "expected %s; exit code %d after %.1f s\n"                                     \
                    "--- stdout (end) ---\n%s--- stderr (end) ---\n%s",                            \
                    #cond, tt_job_exit_code(j), (j)->seconds, tt_tail((j)->out),                   \
                    tt_tail((j)->err));                                                            \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#endif
