/* bench_checkpoint: ct's checkpoint save and load throughput, the time an
 * async save blocks a training loop, and the memory rates that bound them.
 *
 *   [ctlaunch -np N] bench_checkpoint save  [--dir DIR] [--bytes N] [--tensors N]
 *   [ctlaunch -np N] bench_checkpoint load  [--dir DIR] [--bytes N] [--tensors N]
 *   [ctlaunch -np N] bench_checkpoint async [--dir DIR] [--bytes N] [--tensors N]
 *                                           [--every K] [--steps N] [--matmul N] [--threads N]
 *   bench_checkpoint memcpy [--bytes N]
 *   bench_checkpoint drop PATH...
 *
 * The state is --tensors float32 tensors (default 16) of --bytes in all
 * (default 1G), each of shape (rows, 1024) and sharded by rows over the
 * ranks with ct_state_add_shard, so that on N ranks each rank holds and
 * writes 1/N of every tensor. Each element holds a value computed from its
 * place, so that a load can be checked against it.
 *
 *   save:   ct_checkpoint_save of the state to DIR/ct (an old one there is
 *           removed first, untimed), timed on every rank from a barrier to
 *           the call's return; the slowest rank's time counts. The save
 *           includes ct's fsyncs and its commit.
 *   load:   ct_checkpoint_load of DIR/ct into the same layout, twice: first
 *           with the page cache of the checkpoint's files dropped
 *           (posix_fadvise DONTNEED on each file, which evicts clean pages
 *           without root), so that the load reads the disk ("cold"), then
 *           again with the pages the first load left cached ("warm"). The
 *           tensors are zeroed before each load, untimed, and checked
 *           after it. The lines report the share of the files' pages that
 *           was cached when each load started (mincore).
 *   async:  a training loop of one --matmul square float32 matmul per step
 *           on --threads threads (default 1, leaving a core to the writer),
 *           with the state registered (on several ranks a barrier ends
 *           each step, as data parallel's allreduce would). It first times
 *           a synchronous ct_checkpoint_save of the state (to DIR/sync,
 *           removed after), then one ct_checkpointer_save every --every
 *           steps (default: as many of the fastest probe step as take 2x
 *           the synchronous save, so that each save should find the one
 *           before it finished) to DIR/async/step-N with keep_last 1, for
 *           --steps steps (default 3 saves' worth). It times each
 *           ct_checkpointer_save call (the time the loop is
 *           blocked: plan and copy into staging) and, apart, a
 *           ct_checkpointer_wait just before it ("waited": 0 unless the
 *           save before was still writing, which the call would otherwise
 *           have waited for), and records ct_checkpointer_staging_bytes and
 *           the process's RSS (/proc/self/statm) after each save and once
 *           the last one has finished.
 *   memcpy: the machine's own rates on --bytes: a single-thread memcpy and
 *           XXH3-64 (the checksum ct computes over every chunk it saves or
 *           loads whole), the median of 5 passes.
 *   drop:   drops the page cache of each file, or of each file in each
 *           directory, and prints the share of their bytes still cached
 *           (one number).
 *
 * stdout: one JSON line per result from rank 0, {"bench": "checkpoint",
 * "impl", "op", ...}: "seconds" and "gbps" (10^9 bytes/s of the global
 * state) for save and load; see report_async() for async's fields. stderr:
 * notes and errors. */
/* nftw (XSI) and mincore (Linux) are outside plain C11. */
#define _GNU_SOURCE

#include "bench_time.h"

#include <ct/ct.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

static const char usage[] =
    "usage: [ctlaunch -np N] bench_checkpoint save|load|async [options]\n"
    "       bench_checkpoint memcpy [--bytes N]\n"
    "       bench_checkpoint drop PATH...\n"
    "modes:\n"
    "  save     time ct_checkpoint_save of the state to DIR/ct\n"
    "  load     time ct_checkpoint_load of DIR/ct, page cache dropped, then warm\n"
    "  async    time ct_checkpointer_save's blocking in a training loop, beside a\n"
    "           synchronous save of the same state\n"
    "  memcpy   single-thread memcpy and XXH3 rates over --bytes\n"
    "  drop     drop the page cache of files (or of the files in directories)\n"
    "options:\n"
    "  --dir DIR      where the checkpoints go (default ckpt-bench)\n"
    "  --bytes N      the global state's size, K/M/G suffixes (default 1G)\n"
    "  --tensors N    float32 tensors it is split into (default 16)\n"
    "  --every K      async: steps between saves (default 0: as many as take\n"
    "                 2x the synchronous save)\n"
    "  --steps N      async: training steps (default 0: 3 saves' worth, 3 x K)\n"
    "  --matmul N     async: each step multiplies two N x N matrices (default 512)\n"
    "  --threads N    async: ct's intra-op threads (default 1)\n";

#define COLS       1024 /* elements per row of every tensor */
#define MAX_SAVES  64
#define MEM_PASSES 5

typedef enum mode { M_SAVE, M_LOAD, M_ASYNC, M_MEMCPY, M_DROP } mode;

typedef struct options {
    mode mode;
    const char *dir;
    int64_t bytes, tensors, every, steps, matmul, threads;
} options;

typedef struct bench {
    const options *o;
    ct_comm *comm;
    int rank, size;
    int64_t rows;        /* of each global tensor */
    int64_t row0, nrows; /* this rank's block of rows */
    ct_tensor **local;   /* o->tensors of them: (nrows, COLS) float32 */
    ct_state *st;
    int64_t step; /* registered as "train.step" */
} bench;

static int fail(const bench *b, const char *what) {
    fprintf(stderr, "bench_checkpoint: rank %d: %s: %s\n", b->rank, what, ct_errmsg());
    return 1;
}

/* "64M" and the like, binary multiples. */
static bool parse_bytes(const char *s, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    int shift = 0;
    switch (*end) {
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case '\0': break;
    default: return false;
    }
    if (errno || end == s || (shift && end[1]) || v < 0 || v > (INT64_MAX >> shift))
        return false;
    *out = (int64_t)v << shift;
    return true;
}

static int parse(int argc, char **argv, options *o, int *first_path) {
    *o = (options){
        .dir = "ckpt-bench", .bytes = INT64_C(1) << 30, .tensors = 16, .matmul = 512, .threads = 1};
    static const char *const modes[] = {"save", "load", "async", "memcpy", "drop"};
    if (argc < 2) {
        fputs(usage, stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(usage, stdout);
        return 1;
    }
    size_t m = 0;
    while (m < sizeof modes / sizeof *modes && strcmp(argv[1], modes[m]))
        m++;
    if (m == sizeof modes / sizeof *modes) {
        fprintf(stderr, "bench_checkpoint: unknown mode '%s'\n%s", argv[1], usage);
        return 2;
    }
    o->mode = (mode)m;
    if (o->mode == M_DROP) {
        if (argc < 3) {
            fprintf(stderr, "bench_checkpoint: drop: no path given\n%s", usage);
            return 2;
        }
        *first_path = 2;
        return 0;
    }
    struct {
        const char *name;
        int64_t *value, min, max;
        bool bytes;
    } flags[] = {
        {"--bytes", &o->bytes, 1, INT64_C(1) << 40, true},
        {"--tensors", &o->tensors, 1, 100000, false},
        {"--every", &o->every, 0, 100000000, false},
        {"--steps", &o->steps, 0, 100000000, false},
        {"--matmul", &o->matmul, 1, 16384, false},
        {"--threads", &o->threads, 1, 1024, false},
    };
    for (int i = 2; i < argc; i += 2) {
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return 1;
        }
        if (!strcmp(argv[i], "--dir")) {
            if (!val || !*val) {
                fprintf(stderr, "bench_checkpoint: --dir: expected a directory\n");
                return 2;
            }
            o->dir = val;
            continue;
        }
        size_t f = 0;
        while (f < sizeof flags / sizeof *flags && strcmp(argv[i], flags[f].name))
            f++;
        if (f == sizeof flags / sizeof *flags) {
            fprintf(stderr, "bench_checkpoint: unknown option %s\n%s", argv[i], usage);
            return 2;
        }
        int64_t v = 0;
        bool ok = val != NULL;
        if (ok && flags[f].bytes) {
            ok = parse_bytes(val, &v);
        } else if (ok) {
            char *end;
            errno = 0;
            v = strtoll(val, &end, 10);
            ok = !errno && end != val && !*end;
        }
        if (!ok || v < flags[f].min || v > flags[f].max) {
            fprintf(stderr, "bench_checkpoint: %s %s: expected a whole number in [%lld, %lld]\n",
                    argv[i], val ? val : "(missing)", (long long)flags[f].min,
                    (long long)flags[f].max);
            return 2;
        }
        *flags[f].value = v;
    }
    if (o->bytes % (o->tensors * COLS * (int64_t)sizeof(float))) {
        fprintf(stderr,
                "bench_checkpoint: --bytes %lld is not a multiple of --tensors %lld rows of %d "
                "float32\n",
                (long long)o->bytes, (long long)o->tensors, COLS);
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------ the files */

static int remove_one(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

/* rm -rf path; 0 when it is gone. */
static int remove_tree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? 0 : -1;
    return nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Drops path's cached pages when drop is set, then adds its size and the
 * bytes of it still cached to *bytes and *cached. */
static int file_cache(const char *path, bool drop, int64_t *bytes, int64_t *cached) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        fprintf(stderr, "bench_checkpoint: %s: %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return 1;
    }
    int rc = 0;
    /* DONTNEED evicts only clean pages: the file must have been written
     * back (fsync) first, as every file here has. */
    if (drop && (rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)) != 0)
        fprintf(stderr, "bench_checkpoint: %s: posix_fadvise: %s\n", path, strerror(rc));
    size_t len = (size_t)sb.st_size, page = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (len + page - 1) / page;
    void *map = len ? mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0) : NULL;
    unsigned char *vec = pages ? malloc(pages) : NULL;
    if (!rc && len && (map == MAP_FAILED || !vec || mincore(map, len, vec) != 0)) {
        fprintf(stderr, "bench_checkpoint: %s: mincore: %s\n", path, strerror(errno));
        rc = 1;
    }
    int64_t in = 0;
    for (size_t i = 0; !rc && i < pages; i++)
        in += vec[i] & 1;
    if (!rc) {
        *bytes += (int64_t)len;
        *cached += in * (int64_t)page < (int64_t)len ? in * (int64_t)page : (int64_t)len;
    }
    free(vec);
    if (map && map != MAP_FAILED)
        munmap(map, len);
    close(fd);
    return rc != 0;
}

/* file_cache for a file, or for each regular file in a directory. */
static int path_cache(const char *path, bool drop, int64_t *bytes, int64_t *cached) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        fprintf(stderr, "bench_checkpoint: %s: %s\n", path, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(sb.st_mode))
        return file_cache(path, drop, bytes, cached);
    DIR *d = opendir(path);
    if (!d) {
        fprintf(stderr, "bench_checkpoint: %s: %s\n", path, strerror(errno));
        return 1;
    }
    int rc = 0;
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        char file[4096];
        snprintf(file, sizeof file, "%s/%s", path, de->d_name);
        if (de->d_name[0] != '.' && stat(file, &sb) == 0 && S_ISREG(sb.st_mode))
            rc = file_cache(file, drop, bytes, cached);
    }
    closedir(d);
    return rc;
}

static double cached_share(const char *path, bool drop) {
    int64_t bytes = 0, cached = 0;
    if (path_cache(path, drop, &bytes, &cached))
        return NAN;
    return bytes ? (double)cached / (double)bytes : 0;
}

static int run_drop(int argc, char **argv, int first) {
    int64_t bytes = 0, cached = 0;
    for (int i = first; i < argc; i++)
        if (path_cache(argv[i], true, &bytes, &cached))
            return 1;
    printf("%.4f\n", bytes ? (double)cached / (double)bytes : 0.0);
    return 0;
}

/* ----------------------------------------------------------- the state */

/* Element g of tensor i: an integer below 2^24, so exact in float32. */
static float pattern(int64_t i, int64_t g) {
    return (float)(((uint64_t)g * 2654435761u + (uint64_t)i * 40503u) & 0xffffff);
}

static void fill(bench *b, int64_t i) {
    float *p = ct_data_ptr(b->local[i]);
    int64_t n = b->nrows * COLS, g0 = b->row0 * COLS;
    for (int64_t k = 0; k < n; k++)
        p[k] = pattern(i, g0 + k);
}

/* Checks a spread of elements of every tensor, the ends included. */
static int check(const bench *b) {
    for (int64_t i = 0; i < b->o->tensors; i++) {
        const float *p = ct_data_ptr(b->local[i]);
        int64_t n = b->nrows * COLS, g0 = b->row0 * COLS;
        for (int64_t s = 0; s <= 64; s++) {
            int64_t k = s == 64 ? n - 1 : s * (n / 64) + s;
            if (k < n && p[k] != pattern(i, g0 + k)) {
                fprintf(stderr,
                        "bench_checkpoint: rank %d: after the load, tensor %lld element %lld is "
                        "%g, not %g\n",
                        b->rank, (long long)i, (long long)(g0 + k), p[k], pattern(i, g0 + k));
                return 1;
            }
        }
    }
    return 0;
}

static void zero(bench *b) {
    for (int64_t i = 0; i < b->o->tensors; i++)
        memset(ct_data_ptr(b->local[i]), 0, (size_t)(b->nrows * COLS) * sizeof(float));
}

static int build(bench *b) {
    const options *o = b->o;
    b->rows = o->bytes / (o->tensors * COLS * (int64_t)sizeof(float));
    if (b->rows < b->size) {
        fprintf(stderr, "bench_checkpoint: %lld rows per tensor are fewer than the %d ranks\n",
                (long long)b->rows, b->size);
        return 1;
    }
    b->row0 = b->rows * b->rank / b->size;
    b->nrows = b->rows * (b->rank + 1) / b->size - b->row0;
    b->local = calloc((size_t)o->tensors, sizeof *b->local);
    b->st = ct_state_new();
    if (!b->local || !b->st)
        return fail(b, "making the state");
    int64_t global[2] = {b->rows, COLS}, offsets[2] = {b->row0, 0};
    for (int64_t i = 0; i < o->tensors; i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layer%03lld.weight", (long long)i);
        if (!(b->local[i] = ct_empty(CT_SHAPE(b->nrows, COLS), CT_FLOAT32)))
            return fail(b, "allocating a tensor");
        fill(b, i);
        if (ct_state_add_shard(b->st, name, b->local[i], 2, global, offsets))
            return fail(b, "ct_state_add_shard");
    }
    if (ct_state_add_i64(b->st, "train.step", &b->step, CT_STATE_REPLICATED))
        return fail(b, "ct_state_add_i64");
    return 0;
}

static void destroy(bench *b) {
    ct_state_free(b->st);
    for (int64_t i = 0; b->local && i < b->o->tensors; i++)
        ct_tensor_free(b->local[i]);
    free(b->local);
}

/* ------------------------------------------------------------- timing */

static int barrier(const bench *b) {
    return ct_comm_barrier(b->comm, NULL) ? fail(b, "barrier") : 0;
}

/* The most of n values over the ranks, in place. */
static int max_over_ranks(const bench *b, double *v, int64_t n) {
    ct_tensor *t = ct_from_data(v, 1, &n, CT_FLOAT64);
    int rc = !t || ct_comm_allreduce(b->comm, t, CT_REDUCE_MAX, NULL);
    if (!rc)
        memcpy(v, ct_data_ptr(t), (size_t)n * sizeof *v);
    ct_tensor_free(t);
    return rc ? fail(b, "allreduce (max) of the times") : 0;
}

static int timed_save(bench *b, const char *path, double *seconds) {
    if (barrier(b))
        return 1;
    double t0 = bench_now();
    int rc = ct_checkpoint_save(path, b->st, b->comm, NULL);
    *seconds = bench_now() - t0;
    if (rc)
        return fail(b, "ct_checkpoint_save");
    return max_over_ranks(b, seconds, 1);
}

static int timed_load(bench *b, const char *path, double *seconds) {
    zero(b);
    if (barrier(b))
        return 1;
    double t0 = bench_now();
    int rc = ct_checkpoint_load(path, b->st, b->comm);
    *seconds = bench_now() - t0;
    if (rc)
        return fail(b, "ct_checkpoint_load");
    if (check(b))
        return 1;
    return max_over_ranks(b, seconds, 1);
}

static void print_io(const bench *b, const char *op, const char *cache, double cached,
                     double seconds) {
    if (b->rank)
        return;
    printf("{\"bench\": \"checkpoint\", \"impl\": \"ct\", \"op\": \"%s\", ", op);
    if (cache)
        printf("\"cache\": \"%s\", \"cached_share\": %.4f, ", cache, cached);
    printf(
        "\"ranks\": %d, \"bytes\": %lld, \"tensors\": %lld, \"seconds\": %.4f, \"gbps\": %.4f}\n",
        b->size, (long long)b->o->bytes, (long long)b->o->tensors, seconds,
        (double)b->o->bytes / seconds * 1e-9);
    fflush(stdout);
}

/* Rank 0 removes path; the others wait for it. */
static int remove_shared(const bench *b, const char *path) {
    int rc = 0;
    if (b->rank == 0 && remove_tree(path) != 0) {
        fprintf(stderr, "bench_checkpoint: removing %s: %s\n", path, strerror(errno));
        rc = 1;
    }
    return barrier(b) || rc;
}

static int run_save(bench *b, const char *path) {
    double s;
    if (remove_shared(b, path) || timed_save(b, path, &s))
        return 1;
    print_io(b, "save", NULL, 0, s);
    return 0;
}

static int run_load(bench *b, const char *path) {
    double cold, warm, cached_cold = 0, cached_warm = 0;
    /* Every rank's files are on the one file system: dropping them once
     * drops them for all. */
    if (b->rank == 0)
        cached_cold = cached_share(path, true);
    if (isnan(cached_cold) || timed_load(b, path, &cold))
        return 1;
    if (b->rank == 0)
        cached_warm = cached_share(path, false);
    if (isnan(cached_warm) || timed_load(b, path, &warm))
        return 1;
    print_io(b, "load", "cold", cached_cold, cold);
    print_io(b, "load", "warm", cached_warm, warm);
    return 0;
}

/* --------------------------------------------------------------- async */

static int64_t rss_bytes(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &pages, &resident) != 2)
        resident = -1;
    if (f)
        fclose(f);
    return resident < 0 ? -1 : (int64_t)resident * sysconf(_SC_PAGESIZE);
}

static int step(ct_tensor *a, ct_tensor *x) {
    ct_scope_begin();
    int rc = ct_matmul(a, x) ? 0 : 1;
    ct_scope_end();
    return rc;
}

static double median(double *v, int64_t n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef struct async_result {
    double sync_s, idle_step_s, loop_step_s, drain_s;
    int64_t every, steps;
    int saves;
    double blocked_s[MAX_SAVES], waited_s[MAX_SAVES];
    int64_t staging[MAX_SAVES], rss[MAX_SAVES], rss_end;
} async_result;

static void print_list_ms(const char *name, const double *v, int n) {
    printf(", \"%s\": [", name);
    for (int i = 0; i < n; i++)
        printf("%s%.2f", i ? ", " : "", v[i] * 1e3);
    printf("]");
}

static void print_list_i64(const char *name, const int64_t *v, int n) {
    printf(", \"%s\": [", name);
    for (int i = 0; i < n; i++)
        printf("%s%lld", i ? ", " : "", (long long)v[i]);
    printf("]");
}

/* blocked_ms is the longest call, the first included: the staging memory
 * was reserved (ct_checkpointer_reserve) before the loop, as a training
 * program does at set-up. waited_ms is the longest wait for a save still writing. The staging
 * must not grow after the first save, nor the RSS after the second
 * (allowing 16 MiB of allocator slack). */
static void report_async(const bench *b, const async_result *r) {
    double blocked = 0, waited = 0;
    for (int i = 0; i < r->saves; i++)
        blocked = r->blocked_s[i] > blocked ? r->blocked_s[i] : blocked;
    for (int i = 0; i < r->saves; i++)
        waited = r->waited_s[i] > waited ? r->waited_s[i] : waited;
    bool staging_grew = false;
    for (int i = 1; i < r->saves; i++)
        staging_grew = staging_grew || r->staging[i] > r->staging[0];
    int64_t rss_growth = r->rss_end - r->rss[1];
    for (int i = 2; i < r->saves; i++)
        rss_growth = r->rss[i] - r->rss[1] > rss_growth ? r->rss[i] - r->rss[1] : rss_growth;
    printf("{\"bench\": \"checkpoint\", \"impl\": \"ct\", \"op\": \"async\", \"ranks\": %d, "
           "\"bytes\": %lld, \"tensors\": %lld, \"matmul\": %lld, \"threads\": %d, "
           "\"every\": %lld, \"steps\": %lld, \"saves\": %d, \"sync_save_ms\": %.2f, "
           "\"blocked_ms\": %.2f, \"blocked_first_ms\": %.2f, \"ratio\": %.4f, "
           "\"waited_ms\": %.2f",
           b->size, (long long)b->o->bytes, (long long)b->o->tensors, (long long)b->o->matmul,
           ct_get_num_threads(), (long long)r->every, (long long)r->steps, r->saves,
           r->sync_s * 1e3, blocked * 1e3, r->blocked_s[0] * 1e3, blocked / r->sync_s,
           waited * 1e3);
    print_list_ms("blocked_ms_each", r->blocked_s, r->saves);
    print_list_ms("waited_ms_each", r->waited_s, r->saves);
    printf(", \"drain_ms\": %.2f, \"step_ms_idle\": %.3f, \"step_ms_loop\": %.3f", r->drain_s * 1e3,
           r->idle_step_s * 1e3, r->loop_step_s * 1e3);
    print_list_i64("staging_bytes", r->staging, r->saves);
    print_list_i64("rss_bytes", r->rss, r->saves);
    printf(", \"rss_bytes_end\": %lld, \"staging_grew\": %s, \"rss_growth_after_save2\": %lld, "
           "\"rss_grew\": %s}\n",
           (long long)r->rss_end, staging_grew ? "true" : "false", (long long)rss_growth,
           rss_growth > (INT64_C(16) << 20) ? "true" : "false");
    fflush(stdout);
}

/* The steps between saves and in all, the same on every rank. */
static int plan_loop(bench *b, ct_tensor *a, ct_tensor *x, async_result *r) {
    enum { WARMUP = 5, PROBE = 21 };
    double t[PROBE];
    for (int s = 0; s < WARMUP; s++)
        if (step(a, x))
            return fail(b, "matmul");
    for (int s = 0; s < PROBE; s++) {
        double t0 = bench_now();
        if (step(a, x))
            return fail(b, "matmul");
        t[s] = bench_now() - t0;
    }
    /* median() sorts: t[0] is then the fastest step. The interval is set
     * from it and from twice the synchronous save, since a neighbour who
     * slows the probe, or the training that slows the background writer,
     * would otherwise make it too short for the save before to end. */
    double step_s[2] = {median(t, PROBE), t[0]};
    if (max_over_ranks(b, step_s, 2))
        return 1;
    r->idle_step_s = step_s[0];
    r->every = b->o->every ? b->o->every : (int64_t)ceil(2 * r->sync_s / step_s[1]);
    r->steps = b->o->steps ? b->o->steps : 3 * r->every;
    if (r->steps / r->every < 3 || r->steps / r->every > MAX_SAVES) {
        fprintf(stderr,
                "bench_checkpoint: --steps %lld at --every %lld makes %lld saves; the growth "
                "checks need 3 to %d\n",
                (long long)r->steps, (long long)r->every, (long long)(r->steps / r->every),
                MAX_SAVES);
        return 1;
    }
    return 0;
}

static int train(bench *b, ct_checkpointer *ck, ct_tensor *a, ct_tensor *x, async_result *r) {
    char path[4096];
    double stepping = 0;
    ct_checkpoint_options opts = ct_checkpoint_defaults();
    opts.keep_last = 1; /* the disk holds at most the new checkpoint and the one before */
    for (b->step = 1; b->step <= r->steps; b->step++) {
        double t0 = bench_now();
        if (step(a, x))
            return fail(b, "matmul");
        /* Data parallel's gradient allreduce keeps the ranks in step; without
         * it they drift apart, and a save, which is collective, would time one
         * rank waiting for the other. */
        if (b->size > 1 && barrier(b))
            return 1;
        stepping += bench_now() - t0;
        if (b->step % r->every)
            continue;
        snprintf(path, sizeof path, "%s/async/step-%08lld", b->o->dir, (long long)b->step);
        opts.step = b->step;
        t0 = bench_now();
        if (ct_checkpointer_wait(ck))
            return fail(b, "ct_checkpointer_wait");
        r->waited_s[r->saves] = bench_now() - t0;
        t0 = bench_now();
        int rc = ct_checkpointer_save(ck, path, b->st, &opts);
        r->blocked_s[r->saves] = bench_now() - t0;
        if (rc)
            return fail(b, "ct_checkpointer_save");
        r->staging[r->saves] = ct_checkpointer_staging_bytes(ck);
        r->rss[r->saves++] = rss_bytes();
    }
    r->loop_step_s = stepping / (double)r->steps;
    double t0 = bench_now();
    if (ct_checkpointer_wait(ck))
        return fail(b, "ct_checkpointer_wait");
    r->drain_s = bench_now() - t0;
    r->rss_end = rss_bytes();
    return max_over_ranks(b, r->blocked_s, r->saves) || max_over_ranks(b, r->waited_s, r->saves);
}

static int run_async(bench *b) {
    char sync_path[4096], async_dir[4096];
    snprintf(sync_path, sizeof sync_path, "%s/sync", b->o->dir);
    snprintf(async_dir, sizeof async_dir, "%s/async", b->o->dir);
    async_result r = {0};
    if (remove_shared(b, async_dir) || remove_shared(b, sync_path) ||
        timed_save(b, sync_path, &r.sync_s) || remove_shared(b, sync_path))
        return 1;
    int64_t n = b->o->matmul;
    ct_generator gen = {.seed = 1 + (uint64_t)b->rank};
    ct_tensor *a = ct_rand(CT_SHAPE(n, n), CT_FLOAT32, &gen);
    ct_tensor *x = ct_rand(CT_SHAPE(n, n), CT_FLOAT32, &gen);
    ct_checkpointer *ck = a && x ? ct_checkpointer_new(b->comm) : NULL;
    int rc = ck ? 0 : fail(b, "making the matrices and the checkpointer");
    if (!rc && ct_checkpointer_reserve(ck, b->st))
        rc = fail(b, "ct_checkpointer_reserve");
    if (!rc)
        rc = plan_loop(b, a, x, &r);
    if (!rc)
        rc = train(b, ck, a, x, &r);
    ct_checkpointer_free(ck);
    ct_tensor_free(a);
    ct_tensor_free(x);
    if (!rc && b->rank == 0)
        report_async(b, &r);
    return rc || remove_shared(b, async_dir);
}

/* -------------------------------------------------------------- memcpy */

static int run_memcpy(const options *o) {
    size_t bytes = (size_t)o->bytes;
    char *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst) {
        fprintf(stderr, "bench_checkpoint: memcpy: cannot allocate 2 x %zu bytes\n", bytes);
        free(src);
        free(dst);
        return 1;
    }
    /* Touched first, so that no page fault lands in a timed pass. */
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    double copy[MEM_PASSES], hash[MEM_PASSES];
    for (int p = 0; p < MEM_PASSES; p++) {
        double t0 = bench_now();
        memcpy(dst, src, bytes);
        /* The copy must happen although nothing reads dst. */
        __asm__ volatile("" ::"r"(dst) : "memory");
        copy[p] = bench_now() - t0;
        t0 = bench_now();
        uint64_t sum = XXH3_64bits(src, bytes);
        /* The hash must be computed although nothing reads it. */
        __asm__ volatile("" ::"r"(sum));
        hash[p] = bench_now() - t0;
    }
    double c = median(copy, MEM_PASSES), h = median(hash, MEM_PASSES);
    printf("{\"bench\": \"checkpoint\", \"impl\": \"memcpy\", \"op\": \"memcpy\", \"threads\": 1, "
           "\"bytes\": %zu, \"seconds\": %.4f, \"gbps\": %.4f, \"rw_gbps\": %.4f}\n",
           bytes, c, (double)bytes / c * 1e-9, 2 * (double)bytes / c * 1e-9);
    printf("{\"bench\": \"checkpoint\", \"impl\": \"xxh3\", \"op\": \"hash\", \"threads\": 1, "
           "\"bytes\": %zu, \"seconds\": %.4f, \"gbps\": %.4f}\n",
           bytes, h, (double)bytes / h * 1e-9);
    fflush(stdout);
    fprintf(stderr, "bench_checkpoint: memcpy %.2f GB/s copied, XXH3 %.2f GB/s\n",
            (double)bytes / c * 1e-9, (double)bytes / h * 1e-9);
    free(src);
    free(dst);
    return 0;
}

int main(int argc, char **argv) {
    options o;
    int first_path = 0;
    int rc = parse(argc, argv, &o, &first_path);
    if (rc)
        return rc == 1 ? 0 : rc;
    if (o.mode == M_DROP)
        return run_drop(argc, argv, first_path);
    if (o.mode == M_MEMCPY)
        return run_memcpy(&o);
    if (ct_dist_init(NULL)) {
        fprintf(stderr, "bench_checkpoint: ct_dist_init: %s\n", ct_errmsg());
        return 1;
    }
    bench b = {.o = &o, .comm = ct_dist_comm()};
    b.rank = ct_comm_rank(b.comm);
    b.size = ct_comm_size(b.comm);
    if (o.mode == M_ASYNC && ct_set_num_threads((int)o.threads))
        rc = fail(&b, "ct_set_num_threads");
    if (!rc)
        rc = build(&b);
    char path[4096];
    snprintf(path, sizeof path, "%s/ct", o.dir);
    if (!rc)
        rc = o.mode == M_SAVE   ? run_save(&b, path)
             : o.mode == M_LOAD ? run_load(&b, path)
                                : run_async(&b);
    destroy(&b);
    ct_dist_finalize();
    return rc;
}
