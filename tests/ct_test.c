/* ct test harness implementation and main(). */
#include "ct_test.h"

#include <dirent.h>
#include <pthread.h>
#include <regex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TT_MAX_TESTS 512

static struct {
    const char *name;
    tt_fn fn;
} tests[TT_MAX_TESTS];
static int ntests;
static atomic_int current_failures;

void tt_register(const char *name, tt_fn fn) {
    if (ntests == TT_MAX_TESTS) {
        fprintf(stderr, "too many tests\n");
        abort();
    }
    tests[ntests].name = name;
    tests[ntests].fn = fn;
    ntests++;
}

void tt_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "  FAIL %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    atomic_fetch_add(&current_failures, 1);
}

int tt_failed(void) { return current_failures; }

static void *run_fn(void *arg) {
    void (**fn)(void) = arg;
    (*fn)();
    return NULL;
}

double tt_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void tt_run_unscoped(void (*fn)(void)) {
    pthread_t th;
    if (pthread_create(&th, NULL, run_fn, &fn) != 0) {
        tt_fail(__FILE__, __LINE__, "pthread_create failed");
        return;
    }
    pthread_join(th, NULL);
}

/* Runs every test, or those named on the command line. Each runs inside a
 * scope so that leaks show up under ASan only if ct itself leaks. */
int main(int argc, char **argv) {
    int passed = 0, failed = 0;
    for (int i = 0; i < ntests; i++) {
        bool selected = argc < 2;
        for (int a = 1; a < argc; a++)
            selected |= strcmp(argv[a], tests[i].name) == 0;
        if (!selected)
            continue;
        current_failures = 0;
        ct_errclear();
        ct_scope_begin();
        tests[i].fn();
        ct_scope_end();
        if (current_failures) {
            failed++;
            printf("FAIL %s\n", tests[i].name);
        } else {
            passed++;
            printf("ok   %s\n", tests[i].name);
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

ct_tensor *tt_rand(int ndim, const int64_t *sizes, ct_dtype dtype, uint64_t seed) {
    ct_tensor *t = ct_empty(ndim, sizes, dtype);
    if (!t)
        return NULL;
    int64_t n = ct_numel(t);
    uint64_t s = seed * 7919 + 1;
    double *vals = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = splitmix(&s);
        if (ct_dtype_is_float(dtype))
            vals[i] = ((double)(r >> 11) / 9007199254740992.0) * 4.0 - 2.0;
        else if (dtype == CT_BOOL)
            vals[i] = (double)(r & 1);
        else if (dtype == CT_UINT8)
            vals[i] = (double)(r % 11);
        else
            vals[i] = (double)(int64_t)(r % 11) - 5.0;
    }
    /* Write through a float64 tensor so that each dtype rounds its own way. */
    ct_tensor *src = ct_from_data(vals, ndim, sizes, CT_FLOAT64);
    free(vals);
    return ct_copy_(t, src) ? t : NULL;
}

ct_tensor *tt_layout_of(ct_tensor *t, tt_layout layout) {
    if (!t)
        return NULL;
    int nd = ct_ndim(t);
    const int64_t *sz = ct_sizes(t);
    switch (layout) {
    case TT_CONTIGUOUS: return ct_clone(t);
    case TT_TRANSPOSED: {
        int64_t rsz[CT_MAX_DIMS];
        int perm[CT_MAX_DIMS];
        for (int i = 0; i < nd; i++) {
            rsz[i] = sz[nd - 1 - i];
            perm[i] = nd - 1 - i;
        }
        ct_tensor *buf = ct_empty(nd, rsz, ct_tensor_dtype(t));
        ct_tensor *v = ct_permute(buf, perm);
        return ct_copy_(v, t) ? v : NULL;
    }
    case TT_STRIDED: {
        if (nd == 0)
            return ct_clone(t);
        int64_t big[CT_MAX_DIMS];
        for (int i = 0; i < nd; i++)
            big[i] = sz[i];
        big[nd - 1] = sz[nd - 1] * 2 + 1;
        ct_tensor *buf = ct_zeros(nd, big, ct_tensor_dtype(t));
        ct_tensor *v = ct_slice(buf, nd - 1, 1, big[nd - 1], 2);
        return ct_copy_(v, t) ? v : NULL;
    }
    case TT_NLAYOUTS: break;
    }
    return NULL;
}

const char *tt_layout_name(tt_layout layout) {
    static const char *names[] = {"contiguous", "transposed", "strided"};
    return layout < TT_NLAYOUTS ? names[layout] : "?";
}

void tt_unravel(int64_t linear, int ndim, const int64_t *sizes, int64_t *idx) {
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = sizes[d] ? linear % sizes[d] : 0;
        linear = sizes[d] ? linear / sizes[d] : 0;
    }
}

double tt_at(ct_tensor *t, int64_t linear) {
    int64_t idx[CT_MAX_DIMS];
    tt_unravel(linear, ct_ndim(t), ct_sizes(t), idx);
    return ct_get(t, idx);
}

double tt_at_bcast(ct_tensor *t, int ndim, const int64_t *idx) {
    int tn = ct_ndim(t);
    int64_t tidx[CT_MAX_DIMS];
    for (int i = 0; i < tn; i++) {
        int64_t s = ct_size(t, i);
        tidx[i] = s == 1 ? 0 : idx[i + ndim - tn];
    }
    return ct_get(t, tidx);
}

bool tt_close(const char *file, int line, ct_tensor *got, ct_tensor *want, double rtol,
              double atol) {
    if (!got || !want) {
        tt_fail(file, line, "tensor is NULL (got %p, want %p): %s", (void *)got, (void *)want,
                ct_errmsg());
        return false;
    }
    if (ct_ndim(got) != ct_ndim(want)) {
        tt_fail(file, line, "ndim %d vs %d", ct_ndim(got), ct_ndim(want));
        return false;
    }
    for (int i = 0; i < ct_ndim(got); i++)
        if (ct_size(got, i) != ct_size(want, i)) {
            tt_fail(file, line, "size of dim %d: %lld vs %lld", i, (long long)ct_size(got, i),
                    (long long)ct_size(want, i));
            return false;
        }
    int64_t n = ct_numel(got);
    for (int64_t i = 0; i < n; i++) {
        double g = tt_at(got, i), w = tt_at(want, i);
        if (isnan(g) && isnan(w))
            continue;
        if (g == w)
            continue;
        if (!(fabs(g - w) <= atol + rtol * fabs(w))) {
            tt_fail(file, line, "element %lld: got %.9g, want %.9g (rtol %g, atol %g)",
                    (long long)i, g, w, rtol, atol);
            return false;
        }
    }
    return true;
}

bool tt_names_rank(const char *msg, int r) {
    char pattern[96];
    snprintf(pattern, sizeof pattern, "ranks?[^0-9;.()]*([0-9]+, )*%d([^0-9]|$)", r);
    regex_t re;
    if (regcomp(&re, pattern, REG_EXTENDED | REG_ICASE | REG_NOSUB) != 0)
        return false;
    bool found = regexec(&re, msg, 0, NULL, 0) == 0;
    regfree(&re);
    return found;
}

void tt_launch_env(const char *const *pairs) {
    static const char *const vars[] = {
        "CT_RANK",
        "CT_WORLD_SIZE",
        "CT_LOCAL_RANK",
        "CT_LOCAL_WORLD_SIZE",
        "CT_MASTER_ADDR",
        "CT_MASTER_PORT",
        "CT_RESTART_COUNT",
        "CT_BACKEND",
        "CT_TIMEOUT",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
        "MPI_LOCALRANKID",
        "MPI_LOCALNRANKS",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "SLURM_LOCALID",
        "SLURM_STEP_ID",
        "SLURM_STEPID",
        "SLURM_JOB_ID",
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_STEP_NUM_NODES",
        "PMIX_RANK",
        "PMI_FD",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_USE_AGENT_STORE",
    };
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        unsetenv(vars[i]);
    for (; pairs && *pairs; pairs += 2)
        setenv(pairs[0], pairs[1], 1);
}

/* ------------------------------------------------ multi-process jobs */

static void slurp(int fd, char *buf, size_t cap) {
    ssize_t n = pread(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = 0;
}

/* SIGKILLs every process that printed pid=N in out. */
static void kill_ranks(const char *out) {
    for (const char *p = out; (p = strstr(p, "pid=")); p += 4)
        kill((pid_t)atol(p + 4), SIGKILL);
}

void tt_run_job(tt_job *j, const char *const *argv, const char *const *env, double deadline) {
    char out_path[] = "/tmp/ct_job_out_XXXXXX", err_path[] = "/tmp/ct_job_err_XXXXXX";
    int out = mkstemp(out_path), err = mkstemp(err_path);
    unlink(out_path);
    unlink(err_path);
    double t0 = tt_now();
    pid_t pid = fork();
    if (pid == 0) {
        for (; *env; env++) {
            const char *eq = strchr(*env, '=');
            if (eq) {
                char name[128];
                snprintf(name, sizeof name, "%.*s", (int)(eq - *env), *env);
                setenv(name, eq + 1, 1);
            } else {
                unsetenv(*env);
            }
        }
        dup2(out, STDOUT_FILENO);
        dup2(err, STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        _exit(126);
    }
    j->status = -1;
    while (tt_now() - t0 < deadline) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            j->status = st;
            break;
        }
        usleep(10000);
    }
    if (j->status == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        slurp(out, j->out, sizeof j->out);
        kill_ranks(j->out);
    }
    j->seconds = tt_now() - t0;
    slurp(out, j->out, sizeof j->out);
    slurp(err, j->err, sizeof j->err);
    close(out);
    close(err);
}

int tt_job_exit_code(const tt_job *j) {
    if (j->status == -1)
        return -1;
    return WIFEXITED(j->status) ? WEXITSTATUS(j->status) : 128 + WTERMSIG(j->status);
}

/* Whether pid is a process that has not exited: a zombie has, and waits
 * only for its parent to reap it. Ranks orphaned by a launcher that exited
 * first are reaped by init, which may take a while. */
static bool running(pid_t pid) {
    if (kill(pid, 0) != 0)
        return false;
    char path[64], stat[256] = "";
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(stat, 1, sizeof stat - 1, f) : 0;
    if (f)
        fclose(f);
    stat[n] = '\0';
    /* "PID (COMM) STATE ...": COMM may hold spaces and parentheses. */
    const char *close = strrchr(stat, ')');
    return !(close && close[1] == ' ' && close[2] == 'Z');
}

bool tt_job_no_rank_left(const tt_job *j) {
    for (const char *p = j->out; (p = strstr(p, "pid=")); p += 4) {
        pid_t pid = (pid_t)atol(p + 4);
        for (int tries = 0; running(pid) && tries < 100; tries++)
            usleep(10000);
        if (running(pid))
            return false;
    }
    return true;
}

static int count(const char *s, const char *sub) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, sub)); p += strlen(sub))
        n++;
    return n;
}

bool tt_job_ranks_passed(const tt_job *j, const char *scenario, int nranks, int skip, bool tagged) {
    char line[128];
    snprintf(line, sizeof line, "ok   %s\n", scenario);
    if (count(j->out, line) != nranks - (skip >= 0) || strstr(j->out, "FAIL"))
        return false;
    for (int r = 0; tagged && r < nranks; r++) {
        snprintf(line, sizeof line, "[rank %d] ok   %s\n", r, scenario);
        if (r != skip && !strstr(j->out, line))
            return false;
    }
    return true;
}

const char *tt_tail(const char *s) {
    size_t n = strlen(s);
    return n > 6000 ? s + n - 6000 : s;
}

static char tmpdir_[64];

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            remove_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void remove_tmpdir(void) { remove_tree(tmpdir_); }

const char *tt_tmp_path(char path[static 256], const char *name) {
    if (!tmpdir_[0]) {
        snprintf(tmpdir_, sizeof tmpdir_, "/tmp/ct_test.XXXXXX");
        if (!mkdtemp(tmpdir_)) {
            perror("mkdtemp");
            abort();
        }
        atexit(remove_tmpdir);
    }
    snprintf(path, 256, "%s/%s", tmpdir_, name);
    return path;
}

void tt_ctlaunch_scenario(const char *launcher, const char *rank_path, int np, const char *scenario,
                          int code, int skip, double deadline) {
    static tt_job j;
    char npstr[16];
    snprintf(npstr, sizeof npstr, "%d", np);
    tt_run_job(
        &j,
        (const char *const[]){launcher, "-np", npstr, "--grace", "20", rank_path, scenario, NULL},
        (const char *const[]){"CT_BACKEND", NULL}, deadline);
    TT_ASSERT_JOB(&j, tt_job_no_rank_left(&j));
    TT_ASSERT_JOB(&j, tt_job_exit_code(&j) == code);
    TT_ASSERT_JOB(&j, tt_job_ranks_passed(&j, scenario, np, skip, true));
    printf("  %s on %d ranks: %.1f s\n", scenario, np, j.seconds);
}

const char *tt_put_file(char path[static 256], const char *name, const void *bytes, size_t n) {
    tt_tmp_path(path, name);
    /* A new inode, so that a test that left a symlink or a read-only file
     * there does not write through it. */
    unlink(path);
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(bytes, 1, n, f) != n) || fclose(f) != 0)
        abort();
    return path;
}

unsigned char *tt_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, len = 0, k;
    unsigned char *buf = malloc(cap);
    while (buf && (k = fread(buf + len, 1, cap - len, f)) > 0)
        if ((len += k) == cap)
            buf = realloc(buf, cap *= 2);
    fclose(f);
    *n = len;
    return buf;
}
