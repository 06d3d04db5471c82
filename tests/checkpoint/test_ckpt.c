/* Checkpoints in one process: round trips, the atomic commit under a real
 * SIGKILL, retention, and damaged or hostile checkpoints on disk. */
#include "ct_test.h"

#include <ct/checkpoint.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------- helpers */

/* A fresh directory for one test, removed at exit with the rest. */
static char *tmpdir(void) {
    static char dir[256];
    static int n;
    char name[32];
    snprintf(name, sizeof name, "test-%d", n++);
    return mkdir(tt_tmp_path(dir, name), 0755) == 0 ? dir : NULL;
}

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (buf)
        buf[n] = '\0';
    fclose(f);
    if (len)
        *len = (size_t)n;
    return buf;
}

static bool spit(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return false;
    bool ok = fwrite(text, 1, strlen(text), f) == strlen(text);
    return fclose(f) == 0 && ok;
}

/* Replaces the first `from` in the file with `to`; false if absent. */
static bool edit(const char *path, const char *from, const char *to) {
    char *text = slurp(path, NULL);
    char *at = text ? strstr(text, from) : NULL;
    if (!at) {
        free(text);
        return false;
    }
    size_t n = strlen(text) - strlen(from) + strlen(to) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    bool ok = spit(path, out);
    free(out);
    free(text);
    return ok;
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* A small training-like state: three tensors (one a transposed view), two
 * scalars, a generator and metadata. */
typedef struct fixture {
    ct_tensor *w, *b, *steps, *wt_base, *wt;
    int64_t step;
    double lr;
    ct_generator gen;
    ct_state *st;
} fixture;

static void fixture_init(fixture *f, uint64_t seed) {
    f->w = ct_keep(tt_rand(CT_SHAPE(4, 5), CT_FLOAT32, seed));
    f->b = ct_keep(tt_rand(CT_SHAPE(5), CT_BFLOAT16, seed + 1));
    f->steps = ct_keep(tt_rand(CT_SHAPE(3), CT_INT64, seed + 2));
    f->wt_base = ct_keep(tt_rand(CT_SHAPE(3, 2), CT_FLOAT64, seed + 3));
    f->wt = ct_keep(ct_transpose(f->wt_base, 0, 1));
    f->step = (int64_t)seed * 1000 - 7;
    f->lr = 0.1 / (double)(seed + 3);
    f->gen = (ct_generator){UINT64_MAX - seed, seed << 40};
    f->st = ct_state_new();
    ct_state_add_tensor(f->st, "model.w", f->w, CT_STATE_REPLICATED);
    ct_state_add_tensor(f->st, "model.b", f->b, CT_STATE_REPLICATED);
    ct_state_add_tensor(f->st, "optim.step", f->steps, CT_STATE_PER_RANK);
    ct_state_add_tensor(f->st, "model.wt", f->wt, CT_STATE_REPLICATED);
    ct_state_add_i64(f->st, "train.step", &f->step, CT_STATE_REPLICATED);
    ct_state_add_f64(f->st, "sched.lr", &f->lr, CT_STATE_REPLICATED);
    ct_state_add_generator(f->st, "rng", &f->gen, CT_STATE_PER_RANK);
    char v[32];
    snprintf(v, sizeof v, "run-%llu", (unsigned long long)seed);
    ct_state_set_meta(f->st, "run", v);
}

static void fixture_free(fixture *f) {
    ct_state_free(f->st);
    ct_tensor *ts[] = {f->w, f->b, f->steps, f->wt_base, f->wt};
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++)
        ct_tensor_free(ts[i]);
}

static bool same_bits(ct_tensor *a, ct_tensor *b) {
    ct_tensor *ca = ct_contiguous(a), *cb = ct_contiguous(b);
    return ca && cb && ct_numel(a) == ct_numel(b) &&
           memcmp(ct_data_ptr(ca), ct_data_ptr(cb),
                  (size_t)ct_numel(a) * ct_dtype_size(ct_tensor_dtype(a))) == 0;
}

static bool fixture_equal(const fixture *a, const fixture *b) {
    return same_bits(a->w, b->w) && same_bits(a->b, b->b) && same_bits(a->steps, b->steps) &&
           same_bits(a->wt, b->wt) && a->step == b->step && a->lr == b->lr &&
           a->gen.seed == b->gen.seed && a->gen.offset == b->gen.offset;
}

static int save_fixture(fixture *f, const char *path, int64_t step) {
    ct_checkpoint_options o = ct_checkpoint_defaults();
    o.step = step;
    return ct_checkpoint_save(path, f->st, NULL, &o);
}

/* ------------------------------------------------------------ round trip */

TEST(a_saved_state_loads_back_bit_for_bit_into_views_and_scalars) {
    char *dir = tmpdir();
    ASSERT_TRUE(dir);
    char path[400];
    snprintf(path, sizeof path, "%s/step-1", dir);
    fixture a, b;
    fixture_init(&a, 1);
    fixture_init(&b, 2);
    ASSERT_EQ(save_fixture(&a, path, 1), 0);
    ASSERT_TRUE(!fixture_equal(&a, &b));
    ASSERT_EQ(ct_checkpoint_load(path, b.st, NULL), 0);
    ASSERT_TRUE(fixture_equal(&a, &b));
    ASSERT_STR_CONTAINS(ct_state_meta(b.st, "run"), "run-1");
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    ASSERT_TRUE(!exists(tmp));
    fixture_free(&a);
    fixture_free(&b);
}

/* ZeRO's and FSDP's flat shards: row-major ranges of a tensor cut
 * anywhere. The ranges below tile each tensor on one rank, as several
 * ranks' would: the file holds every tensor in its own shape, and it loads
 * whole, or cut into other ranges. */
static void add_flat_cuts(ct_state *st, const char *name, ct_tensor *flat, int ndim,
                          const int64_t *sizes, const int64_t *cuts, int ncuts) {
    for (int k = 0; k + 1 < ncuts; k++) {
        ct_tensor *piece = ct_narrow(flat, 0, cuts[k], cuts[k + 1] - cuts[k]);
        int rc = ct_state_add_flat_shard(st, name, piece, ndim, sizes, cuts[k]);
        if (rc)
            tt_fail(__FILE__, __LINE__, "add_flat_shard [%lld, %lld): %s", (long long)cuts[k],
                    (long long)cuts[k + 1], ct_errmsg());
    }
}

TEST(flat_shards_cut_anywhere_save_in_their_shape_and_load_in_any_cut) {
    char *dir = tmpdir();
    ASSERT_TRUE(dir);
    char path[400];
    snprintf(path, sizeof path, "%s/step-1", dir);
    /* [5, 7]: cut inside rows; [2, 3, 4]: inside rows of both inner dims;
     * a vector; a 0-d tensor. */
    const int64_t m_sizes[] = {5, 7}, c_sizes[] = {2, 3, 4}, v_sizes[] = {9};
    ct_tensor *m = ct_arange(0, 35, 1, CT_FLOAT32), *c = ct_arange(100, 124, 1, CT_FLOAT64);
    ct_tensor *v = ct_arange(0, 9, 1, CT_INT64), *z = ct_full(1, (int64_t[]){1}, 3.5, CT_FLOAT32);
    ct_state *st = ct_state_new();
    add_flat_cuts(st, "m", m, 2, m_sizes, (int64_t[]){0, 3, 4, 19, 35}, 5);
    add_flat_cuts(st, "c", c, 3, c_sizes, (int64_t[]){0, 5, 6, 23, 24}, 5);
    add_flat_cuts(st, "v", v, 1, v_sizes, (int64_t[]){0, 4, 9}, 3);
    add_flat_cuts(st, "z", z, 0, NULL, (int64_t[]){0, 1}, 2);
    ASSERT_EQ(tt_failed(), 0);
    /* m: [0, 3) 1 block, [3, 4) 1, [4, 19) 3 (the rest of row 0, row 1,
     * the start of row 2), [19, 35) 2; c: [0, 5) 2, [5, 6) 1, [6, 23) 4,
     * [23, 24) 1; v 2; z 1. */
    ASSERT_EQ(ct_state_num_entries(st), 7 + 8 + 2 + 1);
    ct_checkpoint_options o = ct_checkpoint_defaults();
    ASSERT_EQ(ct_checkpoint_save(path, st, NULL, &o), 0);
    /* Whole, in its own shape. */
    ct_state *whole = ct_state_new();
    ct_tensor *wm = ct_zeros(2, m_sizes, CT_FLOAT32), *wc = ct_zeros(3, c_sizes, CT_FLOAT64);
    ct_tensor *wz = ct_zeros(0, NULL, CT_FLOAT32);
    ASSERT_EQ(ct_state_add_tensor(whole, "m", wm, CT_STATE_REPLICATED), 0);
    ASSERT_EQ(ct_state_add_tensor(whole, "c", wc, CT_STATE_REPLICATED), 0);
    ASSERT_EQ(ct_state_add_tensor(whole, "z", wz, CT_STATE_REPLICATED), 0);
    ASSERT_EQ(ct_checkpoint_load(path, whole, NULL), 0);
    ASSERT_CLOSE(wm, ct_reshape(m, 2, m_sizes), 0, 0);
    ASSERT_CLOSE(wc, ct_reshape(c, 3, c_sizes), 0, 0);
    ASSERT_NEAR(ct_item(wz), 3.5, 0);
    /* Cut elsewhere: each range reads back into its own flat piece. */
    ct_state *other = ct_state_new();
    ct_tensor *om = ct_zeros(1, (int64_t[]){35}, CT_FLOAT32);
    ct_tensor *oc = ct_zeros(1, (int64_t[]){24}, CT_FLOAT64);
    add_flat_cuts(other, "m", om, 2, m_sizes, (int64_t[]){0, 13, 14, 35}, 4);
    add_flat_cuts(other, "c", oc, 3, c_sizes, (int64_t[]){0, 11, 24}, 3);
    ASSERT_EQ(tt_failed(), 0);
    ASSERT_EQ(ct_checkpoint_load(path, other, NULL), 0);
    ASSERT_CLOSE(om, m, 0, 0);
    ASSERT_CLOSE(oc, c, 0, 0);
    /* Ranges that overlap, or leave a hole, do not tile: the save says so. */
    ct_state *bad = ct_state_new();
    add_flat_cuts(bad, "m", m, 2, m_sizes, (int64_t[]){0, 20}, 2);
    add_flat_cuts(bad, "m", m, 2, m_sizes, (int64_t[]){19, 35}, 2);
    snprintf(path, sizeof path, "%s/step-2", dir);
    ASSERT_RC(ct_checkpoint_save(path, bad, NULL, &o), CT_EINVAL, "'m'", "tile");
    ct_state_free(bad);
    /* Bad input, by name. */
    ASSERT_RC(ct_state_add_flat_shard(other, "m", om, 2, m_sizes, 1), CT_ESHAPE,
              "elements [1, 36) are outside the 35");
    ASSERT_RC(ct_state_add_flat_shard(other, "m", ct_reshape(om, CT_SHAPE(5, 7)), 2, m_sizes, 0),
              CT_ESHAPE, "not a contiguous 1-d tensor");
    ASSERT_RC(ct_state_add_flat_shard(other, "m", om, 2, (int64_t[]){7, 5}, 0), CT_EINVAL,
              "another block of it is float32[5, 7]");
    ASSERT_RC(ct_state_add_flat_shard(other, "v", NULL, 1, v_sizes, 0), CT_EINVAL, "NULL");
    ASSERT_RC(ct_state_add_tensor(other, "m", om, CT_STATE_REPLICATED), CT_EINVAL,
              "already has an entry named 'm'");
    ct_state_free(other);
    ct_state_free(whole);
    ct_state_free(st);
}

TEST(an_opened_checkpoint_lists_its_tensors_chunks_and_values_and_verifies) {
    char *dir = tmpdir();
    char path[400];
    snprintf(path, sizeof path, "%s/c", dir);
    fixture a;
    fixture_init(&a, 3);
    ASSERT_EQ(save_fixture(&a, path, 42), 0);
    ct_checkpoint_reader *ck = NULL;
    ASSERT_EQ(ct_checkpoint_reader_open(path, &ck), 0);
    int major, minor;
    ct_checkpoint_reader_version(ck, &major, &minor);
    ASSERT_EQ(major, 1);
    ASSERT_EQ(minor, 1);
    ASSERT_EQ(ct_checkpoint_reader_step(ck), 42);
    ASSERT_EQ(ct_checkpoint_reader_world_size(ck), 1);
    ASSERT_EQ(ct_checkpoint_reader_num_tensors(ck), 4);
    int i = ct_checkpoint_reader_find(ck, "model.wt");
    ASSERT_TRUE(i >= 0);
    ct_checkpoint_tensor_info info;
    ASSERT_EQ(ct_checkpoint_reader_tensor(ck, i, &info), 0);
    ASSERT_EQ(info.dtype, CT_FLOAT64);
    ASSERT_EQ(info.ndim, 2);
    ASSERT_EQ(info.sizes[0], 2);
    ASSERT_EQ(info.sizes[1], 3);
    ct_checkpoint_chunk_info chunk;
    ASSERT_EQ(ct_checkpoint_reader_chunk(ck, i, 0, &chunk), 0);
    ASSERT_EQ(chunk.byte_offset % 64, 0);
    ASSERT_EQ(chunk.nbytes, 6 * 8);
    ct_tensor *wt = ct_checkpoint_reader_read(ck, i, 0);
    ASSERT_TRUE(wt && same_bits(wt, a.wt));
    ASSERT_EQ(ct_checkpoint_reader_num_values(ck), 4);
    const char *name, *type, *text;
    ct_state_kind kind;
    ASSERT_EQ(ct_checkpoint_reader_value(ck, 0, 0, &name, &kind, &type, &text), 0);
    ASSERT_STR_CONTAINS(name, "train.step");
    ASSERT_STR_CONTAINS(text, "2993");
    ASSERT_EQ(ct_checkpoint_reader_verify(ck, NULL, NULL), 0);
    ASSERT_RC(ct_checkpoint_reader_tensor(ck, 9, &info), CT_ERANGE, "tensor 9");
    ct_checkpoint_reader_close(ck);
    fixture_free(&a);
}

TEST(saving_over_a_checkpoint_replaces_it_whole) {
    char *dir = tmpdir();
    char path[400];
    snprintf(path, sizeof path, "%s/ck", dir);
    fixture a, b, c;
    fixture_init(&a, 4);
    fixture_init(&b, 5);
    fixture_init(&c, 6);
    ASSERT_EQ(save_fixture(&a, path, 1), 0);
    ASSERT_EQ(save_fixture(&b, path, 2), 0);
    ASSERT_EQ(ct_checkpoint_load(path, c.st, NULL), 0);
    ASSERT_TRUE(fixture_equal(&b, &c));
    DIR *d = opendir(dir);
    int entries = 0;
    for (struct dirent *de; (de = readdir(d));)
        entries += de->d_name[0] != '.';
    closedir(d);
    ASSERT_EQ(entries, 1);
    fixture_free(&a);
    fixture_free(&b);
    fixture_free(&c);
}

TEST(bad_states_and_mismatched_loads_name_the_entry) {
    char *dir = tmpdir();
    char path[400];
    snprintf(path, sizeof path, "%s/ck", dir);
    fixture a;
    fixture_init(&a, 7);
    ASSERT_EQ(save_fixture(&a, path, 1), 0);
    ct_tensor *x = ct_zeros(CT_SHAPE(2), CT_FLOAT32);
    int64_t v = 0;
    ASSERT_RC(ct_state_add_tensor(a.st, "model.w", x, CT_STATE_REPLICATED), CT_EINVAL,
              "already has an entry named 'model.w'");
    ASSERT_RC(ct_state_add_tensor(a.st, "bad\nname", x, CT_STATE_REPLICATED), CT_EINVAL,
              "printable");
    ASSERT_RC(ct_state_add_i64(a.st, "v", &v, CT_STATE_SHARDED), CT_EINVAL, "'v'");
    ASSERT_RC(ct_state_add_shard(a.st, "s", x, 1, (int64_t[]){3}, (int64_t[]){2}), CT_ESHAPE,
              "does not fit");
    ct_state *other = ct_state_new();
    ct_state_add_tensor(other, "model.w", x, CT_STATE_REPLICATED);
    ASSERT_RC(ct_checkpoint_load(path, other, NULL), CT_EINVAL, "model.w", "float32[4, 5]",
              "float32[2]");
    ct_state_free(other);
    other = ct_state_new();
    ct_state_add_tensor(other, "no.such", x, CT_STATE_REPLICATED);
    ASSERT_RC(ct_checkpoint_load(path, other, NULL), CT_EINVAL, "no tensor 'no.such'");
    ct_state_free(other);
    other = ct_state_new();
    ct_state_add_i64(other, "sched.lr", &v, CT_STATE_REPLICATED);
    ASSERT_RC(ct_checkpoint_load(path, other, NULL), CT_EINVAL, "sched.lr", "float64", "int64");
    ct_state_free(other);
    ASSERT_RC(ct_checkpoint_load(dir, a.st, NULL), CT_EIO, "manifest.json",
              "not a committed ct checkpoint");
    ASSERT_RC(ct_checkpoint_save("", a.st, NULL, NULL), CT_EINVAL, "path");
    fixture_free(&a);
}

/* Bits, not values: NaN payloads and negative zeros of 16-bit floats come
 * back as they were, through non-contiguous views both ways. */
TEST(sixteen_bit_floats_keep_their_exact_bits_through_views) {
    char *dir = tmpdir(), path[400];
    snprintf(path, sizeof path, "%s/bits", dir);
    const uint16_t bits[6] = {0x7fc1, 0xffc3, 0x8000, 0x7c01, 0x0001, 0x3c00};
    ct_tensor *src_base = ct_from_data(bits, CT_SHAPE(2, 3), CT_BFLOAT16);
    ct_tensor *src = ct_transpose(src_base, 0, 1);
    ct_tensor *dst_base = ct_zeros(CT_SHAPE(2, 3), CT_BFLOAT16);
    ct_tensor *dst = ct_transpose(dst_base, 0, 1);
    ct_state *a = ct_state_new(), *b = ct_state_new();
    ct_state_add_tensor(a, "x", src, CT_STATE_REPLICATED);
    ct_state_add_tensor(b, "x", dst, CT_STATE_REPLICATED);
    ASSERT_EQ(ct_checkpoint_save(path, a, NULL, NULL), 0);
    ASSERT_EQ(ct_checkpoint_load(path, b, NULL), 0);
    ct_state_free(a);
    ct_state_free(b);
    ASSERT_EQ(memcmp(ct_data_ptr(dst_base), bits, sizeof bits), 0);
}

/* ---------------------------------------------------- commit and retention */

TEST(latest_picks_the_highest_step_and_ignores_the_rest) {
    char *dir = tmpdir();
    fixture a;
    fixture_init(&a, 8);
    char path[400], out[256];
    ASSERT_EQ(ct_checkpoint_latest(dir, out, sizeof out), 0);
    int64_t steps[] = {30, 100, 7};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/s%lld", dir, (long long)steps[i]);
        ASSERT_EQ(save_fixture(&a, path, steps[i]), 0);
    }
    snprintf(path, sizeof path, "%s/notes", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/junk", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/junk/manifest.json", dir);
    ASSERT_TRUE(spit(path, "{not json"));
    ASSERT_EQ(ct_checkpoint_latest(dir, out, sizeof out), 1);
    ASSERT_STR_CONTAINS(out, "/s100");
    ASSERT_RC(ct_checkpoint_latest(dir, out, 8), CT_ERANGE, "does not fit");
    snprintf(path, sizeof path, "%s/missing", dir);
    ASSERT_EQ(ct_checkpoint_latest(path, out, sizeof out), 0);
    fixture_free(&a);
}

TEST(keep_last_retires_the_oldest_and_stale_tmp_directories_go) {
    char *dir = tmpdir();
    fixture a;
    fixture_init(&a, 9);
    char path[400];
    /* Debris a crash leaves (a replaced checkpoint not yet removed: a
     * manifest, no marker), and a user's directory that merely ends in .tmp,
     * which must stay. */
    snprintf(path, sizeof path, "%s/old.tmp", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/old.tmp/manifest.json", dir);
    ASSERT_TRUE(spit(path, "{}"));
    snprintf(path, sizeof path, "%s/mine.tmp", dir);
    mkdir(path, 0755);
    ct_checkpoint_options o = ct_checkpoint_defaults();
    o.keep_last = 2;
    for (int s = 1; s <= 4; s++) {
        o.step = s;
        snprintf(path, sizeof path, "%s/step-%d", dir, s);
        ASSERT_EQ(ct_checkpoint_save(path, a.st, NULL, &o), 0);
    }
    const char *gone[] = {"step-1", "step-2", "old.tmp"},
               *kept[] = {"step-3", "step-4", "mine.tmp"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, gone[i]);
        ASSERT_TRUE(!exists(path));
        snprintf(path, sizeof path, "%s/%s", dir, kept[i]);
        ASSERT_TRUE(exists(path));
    }
    fixture_free(&a);
}

/* A child saves a large state over and over; once its first save has
 * committed, the parent kills it with SIGKILL, at a different moment of a
 * later save each round. Whatever the moment, the checkpoint must load and
 * match one of the states saved. */
TEST(a_save_killed_at_any_moment_leaves_a_checkpoint_that_loads) {
    char *dir = tmpdir();
    int64_t n = 1 << 20;
    for (int round = 0; round < 8; round++) {
        char path[400];
        snprintf(path, sizeof path, "%s/ck-%d", dir, round);
        pid_t pid = fork();
        ASSERT_TRUE(pid >= 0);
        if (pid == 0) {
            ct_tensor *big = ct_full(CT_SHAPE(n), 0, CT_FLOAT32);
            int64_t step = 0;
            ct_state *st = ct_state_new();
            ct_state_add_tensor(st, "big", big, CT_STATE_REPLICATED);
            ct_state_add_i64(st, "step", &step, CT_STATE_REPLICATED);
            float *p = ct_data_ptr(big);
            for (step = 1;; step++) {
                for (int64_t i = 0; i < n; i++)
                    p[i] = (float)step;
                ct_checkpoint_options o = ct_checkpoint_defaults();
                o.step = step;
                if (ct_checkpoint_save(path, st, NULL, &o) != 0)
                    _exit(3);
            }
        }
        double t0 = tt_now();
        while (!exists(path) && tt_now() - t0 < 20)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
        nanosleep(&(struct timespec){0, 1000000L + round * 3000000L}, NULL);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        ASSERT_TRUE(WIFSIGNALED(status));
        ct_tensor *big = ct_zeros(CT_SHAPE(n), CT_FLOAT32);
        int64_t step = -1;
        ct_state *st = ct_state_new();
        ct_state_add_tensor(st, "big", big, CT_STATE_REPLICATED);
        ct_state_add_i64(st, "step", &step, CT_STATE_REPLICATED);
        int rc = ct_checkpoint_load(path, st, NULL);
        ct_state_free(st);
        ASSERT_EQ(rc, 0);
        ASSERT_TRUE(step >= 1);
        const float *p = ct_data_ptr(big);
        ASSERT_EQ(p[0], (float)step);
        ASSERT_EQ(p[n - 1], (float)step);
    }
}

/* ------------------------------------------------ damaged checkpoints */

static void saved(char *dir, char *path, size_t cap, fixture *f) {
    snprintf(path, cap, "%s/ck", dir);
    fixture_init(f, 11);
    save_fixture(f, path, 5);
}

TEST(a_flipped_byte_is_caught_naming_the_file_and_tensor) {
    char *dir = tmpdir(), path[400], file[600];
    fixture a;
    saved(dir, path, sizeof path, &a);
    snprintf(file, sizeof file, "%s/data-00000.bin", path);
    int fd = open(file, O_RDWR);
    unsigned char byte;
    ASSERT_EQ(pread(fd, &byte, 1, 3), 1);
    byte ^= 0x10;
    ASSERT_EQ(pwrite(fd, &byte, 1, 3), 1);
    close(fd);
    ASSERT_RC(ct_checkpoint_load(path, a.st, NULL), CT_ECORRUPT, "data-00000.bin", "model.w",
              "checksum");
    ct_checkpoint_reader *ck = NULL;
    ASSERT_EQ(ct_checkpoint_reader_open(path, &ck), 0);
    ASSERT_RC(ct_checkpoint_reader_verify(ck, NULL, NULL), CT_ECORRUPT, "data-00000.bin",
              "model.w");
    ct_checkpoint_reader_close(ck);
    fixture_free(&a);
}

TEST(a_truncated_or_missing_file_is_caught_before_reading) {
    char *dir = tmpdir(), path[400], file[600];
    fixture a;
    saved(dir, path, sizeof path, &a);
    snprintf(file, sizeof file, "%s/data-00000.bin", path);
    ASSERT_EQ(truncate(file, 100), 0);
    ct_checkpoint_reader *ck = NULL;
    ASSERT_RC(ct_checkpoint_reader_open(path, &ck), CT_ECORRUPT, "data-00000.bin", "truncated");
    ASSERT_RC(ct_checkpoint_load(path, a.st, NULL), CT_ECORRUPT, "data-00000.bin", "truncated");
    ASSERT_EQ(unlink(file), 0);
    ASSERT_RC(ct_checkpoint_reader_open(path, &ck), CT_ECORRUPT, "data-00000.bin", "damaged");
    fixture_free(&a);
}

/* Each case edits the manifest of a good checkpoint and expects load and
 * open to fail with the code and message parts given. */
typedef struct hostile {
    const char *from, *to;
    int code;
    const char *says;
} hostile;

TEST(hostile_manifests_fail_cleanly_with_a_precise_error) {
    const hostile cases[] = {
        {"\"format\":\"ct-checkpoint\"", "\"format\":\"other\"", CT_ECORRUPT,
         "not a ct checkpoint"},
        {"\"major\":1", "\"major\":2", CT_EVERSION, "format version 2.1"},
        {"\"required_features\":[]", "\"required_features\":[\"zstd\"]", CT_EVERSION, "'zstd'"},
        {"\"bytes\":80", "\"bytes\":1e300", CT_ECORRUPT, "not an integer"},
        {"\"byte_offset\":0", "\"byte_offset\":-64", CT_ECORRUPT, "byte_offset"},
        {"\"byte_offset\":0", "\"byte_offset\":1000000", CT_ECORRUPT, "past the end"},
        {"\"shape\":[4,5]", "\"shape\":[4,500000000000000]", CT_ECORRUPT, "model.w"},
        {"\"dtype\":\"float32\"", "\"dtype\":\"float128\"", CT_ECORRUPT, "float128"},
        {"\"name\":\"data-00000.bin\"", "\"name\":\"../../etc/passwd\"", CT_ECORRUPT, "a path"},
        {"\"file\":0", "\"file\":7", CT_ECORRUPT, "'file'"},
        {"\"xxh3\":\"", "\"xxh3\":\"zz", CT_ECORRUPT, "xxh3"},
        {"\"tensors\":[", "\"tensors\":[{}, ", CT_ECORRUPT, "tensor 0"},
        {"\"world_size\":1", "\"world_size\":0", CT_ECORRUPT, "world_size"},
        {"{", "[", CT_ECORRUPT, "JSON"},
        {"\"metadata\":{", "\"metadata\":{\"k\":1, ", CT_ECORRUPT, "metadata"},
    };
    char *dir = tmpdir(), path[400], manifest[600];
    fixture a;
    saved(dir, path, sizeof path, &a);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", path);
    char *good = slurp(manifest, NULL);
    ASSERT_TRUE(good);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ASSERT_TRUE(spit(manifest, good));
        if (!edit(manifest, cases[i].from, cases[i].to)) {
            tt_fail(__FILE__, __LINE__, "case %zu: '%s' is not in the manifest", i, cases[i].from);
            break;
        }
        ASSERT_RC(ct_checkpoint_load(path, a.st, NULL), cases[i].code, "manifest.json",
                  cases[i].says);
        ct_checkpoint_reader *ck = NULL;
        ASSERT_RC(ct_checkpoint_reader_open(path, &ck), cases[i].code, cases[i].says);
    }
    /* Every prefix of the manifest: truncated JSON is an error, never a
     * crash or a read past the end. */
    size_t len = strlen(good);
    for (size_t cut = 0; cut < len; cut += 7) {
        char *part = strndup(good, cut);
        ASSERT_TRUE(spit(manifest, part));
        free(part);
        ASSERT_RC(ct_checkpoint_load(path, a.st, NULL), CT_ECORRUPT, "manifest.json");
    }
    free(good);
    fixture_free(&a);
}

TEST(a_newer_minor_version_with_unknown_fields_still_loads) {
    char *dir = tmpdir(), path[400], manifest[600];
    fixture a, b;
    saved(dir, path, sizeof path, &a);
    fixture_init(&b, 12);
    snprintf(manifest, sizeof manifest, "%s/manifest.json", path);
    ASSERT_TRUE(edit(manifest, "\"minor\":1", "\"minor\":7"));
    ASSERT_TRUE(
        edit(manifest, "\"world_size\"", "\"compression\":{\"kind\":\"none\"},\"world_size\""));
    ASSERT_TRUE(edit(manifest, "\"xxh3\"", "\"future_field\":[1,2],\"xxh3\""));
    ASSERT_EQ(ct_checkpoint_load(path, b.st, NULL), 0);
    ASSERT_TRUE(fixture_equal(&a, &b));
    fixture_free(&a);
    fixture_free(&b);
}

/* -------------------------------------------------------------- golden */

/* Every format version ct has written, as it wrote it (tests/checkpoint/data/
 * README.md says what each holds). */
static const char *const golden[] = {"v1.0", "v1.1"};

TEST(every_golden_checkpoint_still_loads) {
    for (size_t g = 0; g < sizeof golden / sizeof *golden; g++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", CT_TEST_DATA_DIR, golden[g]);
        ct_checkpoint_reader *ck = NULL;
        ASSERT_EQ(ct_checkpoint_reader_open(path, &ck), 0);
        ASSERT_EQ(ct_checkpoint_reader_verify(ck, NULL, NULL), 0);
        ASSERT_EQ(ct_checkpoint_reader_world_size(ck), 2);
        int own = ct_checkpoint_reader_find(ck, "own");
        for (int r = 0; r < 2; r++) {
            ct_tensor *t = ct_checkpoint_reader_read(ck, own, r);
            ASSERT_TRUE(t);
            ASSERT_EQ(ct_get(t, (int64_t[]){0}), 10 * r + 2);
        }
        const char *name, *text;
        ASSERT_EQ(ct_checkpoint_reader_value(ck, 1, 1, &name, NULL, NULL, &text), 0);
        ASSERT_STR_CONTAINS(name, "rng.seed");
        ASSERT_STR_CONTAINS(text, "1001");
        ct_checkpoint_reader_close(ck);
        /* One rank loads what two saved, in another blocking: w by columns. */
        ct_tensor *w = ct_zeros(CT_SHAPE(7, 4), CT_FLOAT32), *v = ct_zeros(CT_SHAPE(13), CT_INT64);
        ct_tensor *r = ct_zeros(CT_SHAPE(3, 3), CT_BFLOAT16);
        int64_t step = 0;
        ct_state *st = ct_state_new();
        ct_state_add_shard(st, "w", w, 2, (int64_t[]){7, 10}, (int64_t[]){0, 6});
        ct_state_add_tensor(st, "v", v, CT_STATE_REPLICATED);
        ct_state_add_tensor(st, "r", r, CT_STATE_REPLICATED);
        ct_state_add_i64(st, "step", &step, CT_STATE_REPLICATED);
        ASSERT_EQ(ct_checkpoint_load(path, st, NULL), 0);
        ASSERT_STR_CONTAINS(ct_state_meta(st, "saved_by"), "ckpt_rank");
        ct_state_free(st);
        ASSERT_EQ(step, 77);
        for (int64_t i = 0; i < 7; i++)
            for (int64_t j = 0; j < 4; j++)
                ASSERT_EQ(ct_get(w, (int64_t[]){i, j}), 100 * i + 6 + j);
        for (int64_t i = 0; i < 13; i++)
            ASSERT_EQ(ct_get(v, &i), 3 * i - 5);
        ASSERT_EQ(ct_get(r, (int64_t[]){2, 2}), 8);
    }
}

/* ------------------------------------------------ hardening (issue 20) */

/* Flips the bit 0x10 of the byte at off in file. */
static bool flip(const char *file, off_t off) {
    int fd = open(file, O_RDWR);
    unsigned char byte;
    bool ok = fd >= 0 && pread(fd, &byte, 1, off) == 1;
    byte ^= 0x10;
    ok = ok && pwrite(fd, &byte, 1, off) == 1;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* w: float32 [16, 65536] (4 MiB, four 1 MiB blocks), w[i, j] = i, saved
 * whole by one rank at dir/name; path gets its path. */
#define BIG_ROWS 16
#define BIG_COLS 65536
static int save_big(const char *dir, const char *name, char *path, size_t cap) {
    snprintf(path, cap, "%s/%s", dir, name);
    ct_tensor *w = ct_empty(CT_SHAPE(BIG_ROWS, BIG_COLS), CT_FLOAT32);
    float *p = ct_data_ptr(w);
    for (int64_t i = 0; i < BIG_ROWS * BIG_COLS; i++)
        p[i] = (float)(i / BIG_COLS);
    ct_state *st = ct_state_new();
    ct_state_add_tensor(st, "w", w, CT_STATE_REPLICATED);
    int rc = ct_checkpoint_save(path, st, NULL, NULL);
    ct_state_free(st);
    return rc;
}

/* Loads rows [lo, lo + n) of the big w as one rank's shard. */
static int load_rows(const char *path, int64_t lo, int64_t n, float *first) {
    ct_tensor *w = ct_zeros(CT_SHAPE(n, BIG_COLS), CT_FLOAT32);
    ct_state *st = ct_state_new();
    ct_state_add_shard(st, "w", w, 2, (int64_t[]){BIG_ROWS, BIG_COLS}, (int64_t[]){lo, 0});
    int rc = ct_checkpoint_load(path, st, NULL);
    *first = ((float *)ct_data_ptr(w))[0];
    ct_state_free(st);
    return rc;
}

/* A resharding load reads a chunk partly; every byte it reads is checked
 * against the checksum of its 1 MiB block, and only the damaged block
 * fails. */
TEST(a_partial_read_of_a_damaged_chunk_fails_naming_the_block) {
    char *dir = tmpdir(), path[400], file[600];
    ASSERT_EQ(save_big(dir, "big", path, sizeof path), 0);
    snprintf(file, sizeof file, "%s/data-00000.bin", path);
    ASSERT_TRUE(flip(file, (3 << 20) + (1 << 19)));
    float first = -1;
    ASSERT_RC(load_rows(path, 8, 8, &first), CT_ECORRUPT, "data-00000.bin", "block 3",
              "bytes 3145728..4194304", "tensor 'w'");
    ASSERT_EQ(load_rows(path, 0, 8, &first), 0);
    ASSERT_EQ(first, 0);
    ASSERT_EQ(load_rows(path, 4, 4, &first), 0);
    ASSERT_EQ(first, 4);
    ct_checkpoint_reader *ck = NULL;
    ASSERT_EQ(ct_checkpoint_reader_open(path, &ck), 0);
    ASSERT_RC(ct_checkpoint_reader_verify(ck, NULL, NULL), CT_ECORRUPT, "data-00000.bin",
              "block 3 (bytes 3145728..4194304)", "1 damaged block");
    ct_checkpoint_reader_close(ck);
}

/* A format-1.0 checkpoint has no block checksums: a chunk read partly is
 * checked whole first. */
TEST(a_partial_read_of_a_damaged_version_1_0_chunk_fails) {
    char *dir = tmpdir(), path[400], cmd[1200], file[600];
    snprintf(path, sizeof path, "%s/v1.0", dir);
    snprintf(cmd, sizeof cmd, "cp -r '%s/v1.0' '%s'", CT_TEST_DATA_DIR, path);
    ASSERT_EQ(system(cmd), 0);
    snprintf(file, sizeof file, "%s/data-00001.bin", path);
    ASSERT_TRUE(flip(file, 4)); /* w[3, 1], in rank 1's chunk */
    ct_tensor *w = ct_zeros(CT_SHAPE(7, 4), CT_FLOAT32);
    ct_state *st = ct_state_new();
    ct_state_add_shard(st, "w", w, 2, (int64_t[]){7, 10}, (int64_t[]){0, 0});
    ASSERT_RC(ct_checkpoint_load(path, st, NULL), CT_ECORRUPT, "data-00001.bin", "tensor 'w'",
              "checksum");
    ct_state_free(st);
}

/* Runs fn(arg) in a child that must exit 0 within 10 s: an open that would
 * block on a FIFO fails the test instead of hanging it. */
static bool within_10s(int (*fn)(const char *), const char *arg) {
    pid_t pid = fork();
    if (pid == 0)
        _exit(fn(arg));
    double t0 = tt_now();
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (tt_now() - t0 > 10) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            tt_fail(__FILE__, __LINE__, "opening %s hung", arg);
            return false;
        }
        nanosleep(&(struct timespec){0, 2000000}, NULL);
    }
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static int refused_as_not_regular(const char *path) {
    ct_checkpoint_reader *ck = NULL;
    int rc = ct_checkpoint_reader_open(path, &ck);
    fprintf(stderr, "  %s: %s\n", ct_errname(rc), ct_errmsg());
    return rc == CT_ECORRUPT && strstr(ct_errmsg(), "not a regular file") ? 0 : 1;
}

static int refused_as_symlink(const char *path) {
    ct_checkpoint_reader *ck = NULL;
    int rc = ct_checkpoint_reader_open(path, &ck);
    fprintf(stderr, "  %s: %s\n", ct_errname(rc), ct_errmsg());
    return rc == CT_ECORRUPT && strstr(ct_errmsg(), "symbolic link") ? 0 : 1;
}

TEST(a_fifo_or_a_symlink_in_a_checkpoint_is_refused_without_hanging) {
    char *dir = tmpdir(), path[400], file[600], outside[600], link[600];
    fixture a;
    saved(dir, path, sizeof path, &a);
    snprintf(file, sizeof file, "%s/data-00000.bin", path);
    snprintf(outside, sizeof outside, "%s/outside.bin", dir);
    ASSERT_EQ(rename(file, outside), 0);
    ASSERT_EQ(mkfifo(file, 0644), 0);
    double t0 = tt_now();
    ASSERT_TRUE(within_10s(refused_as_not_regular, path));
    printf("  data file a FIFO: refused in %.1f ms\n", 1e3 * (tt_now() - t0));
    /* A symlink to a good copy outside the directory. */
    ASSERT_EQ(unlink(file), 0);
    ASSERT_EQ(symlink(outside, file), 0);
    ASSERT_TRUE(within_10s(refused_as_symlink, path));
    ASSERT_RC(ct_checkpoint_load(path, a.st, NULL), CT_ECORRUPT, "data-00000.bin", "symbolic link");
    ASSERT_EQ(unlink(file), 0);
    ASSERT_EQ(rename(outside, file), 0);
    snprintf(file, sizeof file, "%s/manifest.json", path);
    snprintf(outside, sizeof outside, "%s/manifest.json", dir);
    ASSERT_EQ(rename(file, outside), 0);
    ASSERT_EQ(mkfifo(file, 0644), 0);
    t0 = tt_now();
    ASSERT_TRUE(within_10s(refused_as_not_regular, path));
    printf("  manifest.json a FIFO: refused in %.1f ms\n", 1e3 * (tt_now() - t0));
    ASSERT_EQ(unlink(file), 0);
    ASSERT_EQ(rename(outside, file), 0);
    /* The checkpoint's own path may go through a symlink. */
    snprintf(link, sizeof link, "%s/via-link", dir);
    ASSERT_EQ(symlink(path, link), 0);
    ASSERT_EQ(ct_checkpoint_load(link, a.st, NULL), 0);
    fixture_free(&a);
}

/* A manifest of one tensor with n chunks, written to dir/name: shape [1, n]
 * float32, chunk j at [0, j] of size [1, 1], except that the last chunk
 * repeats the first (an overlap and a gap) when overlap is true. */
static void hostile_chunks(const char *path, int n, bool overlap) {
    char file[600];
    mkdir(path, 0755);
    snprintf(file, sizeof file, "%s/data-00000.bin", path);
    int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        ftruncate(fd, (off_t)n * 4);
        close(fd);
    }
    snprintf(file, sizeof file, "%s/manifest.json", path);
    FILE *f = fopen(file, "w");
    fprintf(f,
            "{\"format\":\"ct-checkpoint\",\"version\":{\"major\":1,\"minor\":0},\"writer\":\"x\","
            "\"required_features\":[],\"world_size\":1,\"files\":[{\"name\":\"data-00000.bin\","
            "\"bytes\":%d}],\"tensors\":[{\"name\":\"w\",\"dtype\":\"float32\",\"kind\":"
            "\"sharded\",\"shape\":[1,%d],\"chunks\":[",
            4 * n, n);
    for (int j = 0; j < n; j++) {
        int at = overlap && j == n - 1 ? 0 : j;
        fprintf(f,
                "%s{\"offsets\":[0,%d],\"sizes\":[1,1],\"rank\":0,\"file\":0,\"byte_offset\":%d,"
                "\"bytes\":4,\"xxh3\":\"0000000000000000\"}",
                j ? "," : "", at, 4 * j);
    }
    fprintf(f, "]}],\"values\":[]}");
    fclose(f);
}

/* Same, with n tensors of one element each, the last named as the first. */
static void hostile_names(const char *path, int n) {
    char file[600];
    mkdir(path, 0755);
    snprintf(file, sizeof file, "%s/manifest.json", path);
    FILE *f = fopen(file, "w");
    fprintf(f, "{\"format\":\"ct-checkpoint\",\"version\":{\"major\":1,\"minor\":0},\"writer\":"
               "\"x\",\"required_features\":[],\"world_size\":1,\"files\":[],\"tensors\":[");
    for (int j = 0; j < n; j++)
        fprintf(f,
                "%s{\"name\":\"t%d\",\"dtype\":\"float32\",\"kind\":\"sharded\",\"shape\":[0],"
                "\"chunks\":[]}",
                j ? "," : "", j == n - 1 ? 0 : j);
    fprintf(f, "],\"values\":[]}");
    fclose(f);
}

/* The fastest of `reps` more opens of the checkpoint at path, or `best` if
 * none is faster: a timing taken while another process holds the core says
 * nothing about the checks, and the fastest of several is the one that does
 * not include such a wait. */
static double fastest_open(const char *path, int reps, double best) {
    for (int i = 0; i < reps; i++) {
        ct_checkpoint_reader *ck = NULL;
        double t0 = tt_now();
        if (ct_checkpoint_reader_open(path, &ck) == 0)
            ct_checkpoint_reader_close(ck);
        best = fmin(best, tt_now() - t0);
    }
    return best;
}

/* Seconds to open each of the three hostile manifests of n entries in dir
 * (the fastest of three opens): chunks with one overlap, chunks that tile,
 * tensors with one name twice. */
static void time_hostile(const char *dir, int n, double t[3]) {
    char path[400];
    ct_checkpoint_reader *ck = NULL;
    snprintf(path, sizeof path, "%s/chunks%d", dir, n);
    hostile_chunks(path, n, true);
    double t0 = tt_now();
    ASSERT_RC(ct_checkpoint_reader_open(path, &ck), CT_ECORRUPT, "tensor 'w'", "overlap");
    t[0] = fastest_open(path, 2, tt_now() - t0);
    snprintf(path, sizeof path, "%s/tiles%d", dir, n);
    hostile_chunks(path, n, false);
    t0 = tt_now();
    ASSERT_EQ(ct_checkpoint_reader_open(path, &ck), 0);
    ct_checkpoint_reader_close(ck);
    t[1] = fastest_open(path, 2, tt_now() - t0);
    snprintf(path, sizeof path, "%s/names%d", dir, n);
    hostile_names(path, n);
    t0 = tt_now();
    ASSERT_RC(ct_checkpoint_reader_open(path, &ck), CT_ECORRUPT, "two tensors have this name");
    t[2] = fastest_open(path, 2, tt_now() - t0);
}

/* Linear means eight times the entries take about eight times as long
 * (n log n a little more: x4 to x10 measured); the old quadratic checks
 * would take 64 times as long, and took 148 s and 249 s at 200k, which the
 * 20 s bound refuses on its own. The ratio, timed against itself at an
 * eighth of the size, is held to 48: a CPU shared with other tests slowed
 * the larger run alone to x28 once. */
TEST(a_hostile_manifest_of_200k_chunks_or_names_is_checked_in_linear_time) {
    char *dir = tmpdir();
    int n = 200000;
    double small[3], big[3];
    time_hostile(dir, n / 8, small);
    time_hostile(dir, n, big);
    const char *what[3] = {"chunks, one overlapping", "tiling chunks", "tensors, one name twice"};
    for (int i = 0; i < 3; i++) {
        printf("  %s: %d: %.0f ms, %d: %.0f ms (x%.1f)\n", what[i], n / 8, 1e3 * small[i], n,
               1e3 * big[i], big[i] / small[i]);
        /* Below 50 ms the ratio is only noise. */
        ASSERT_TRUE(big[i] < 0.05 || big[i] < 48 * small[i]);
        ASSERT_TRUE(big[i] < 20);
    }
}

/* Sizes are overflow-checked: a [2^32, 2^32] tensor does not wrap to zero
 * elements (which its zero chunks would "cover"). */
TEST(a_shape_whose_size_overflows_is_refused) {
    char *dir = tmpdir(), path[400], file[600];
    snprintf(path, sizeof path, "%s/huge", dir);
    mkdir(path, 0755);
    snprintf(file, sizeof file, "%s/manifest.json", path);
    ASSERT_TRUE(spit(file, "{\"format\":\"ct-checkpoint\",\"version\":{\"major\":1,\"minor\":0},"
                           "\"writer\":\"x\",\"required_features\":[],\"world_size\":1,\"files\":"
                           "[],\"tensors\":[{\"name\":\"w\",\"dtype\":\"float32\",\"kind\":"
                           "\"sharded\",\"shape\":[4294967296,4294967296],\"chunks\":[]}],"
                           "\"values\":[]}"));
    ct_checkpoint_reader *ck = NULL;
    ASSERT_RC(ct_checkpoint_reader_open(path, &ck), CT_ECORRUPT, "tensor 'w'", "overflow");
}

/* A child saves states of different content over one path as fast as it
 * can; every load meanwhile must see one of them whole: the tensors and
 * the step of the same save (or fail saying why), never a mix. */
TEST(a_load_during_saves_reads_one_version_whole) {
    char *dir = tmpdir(), path[400];
    snprintf(path, sizeof path, "%s/busy", dir);
    int64_t n = 1 << 16;
    ct_tensor *x = ct_zeros(CT_SHAPE(n), CT_INT64), *y = ct_zeros(CT_SHAPE(n), CT_INT64);
    int64_t step = 0;
    ct_state *st = ct_state_new();
    ct_state_add_tensor(st, "x", x, CT_STATE_REPLICATED);
    ct_state_add_tensor(st, "y", y, CT_STATE_REPLICATED);
    ct_state_add_i64(st, "step", &step, CT_STATE_REPLICATED);
    ASSERT_EQ(ct_checkpoint_save(path, st, NULL, NULL), 0);
    pid_t pid = fork();
    if (pid == 0) {
        for (step = 1;; step++) {
            int64_t *px = ct_data_ptr(x), *py = ct_data_ptr(y);
            for (int64_t i = 0; i < n; i++) {
                px[i] = step;
                py[i] = -step;
            }
            if (ct_checkpoint_save(path, st, NULL, NULL) != 0)
                _exit(3);
        }
    }
    int loads = 0, ok = 0, retried = 0, mixed = 0;
    double t0 = tt_now();
    while (tt_now() - t0 < 1.5) {
        step = -1;
        int rc = ct_checkpoint_load(path, st, NULL);
        loads++;
        const int64_t *px = ct_data_ptr(x), *py = ct_data_ptr(y);
        if (rc == 0 && px[0] == step && px[n - 1] == step && py[0] == -step && py[n - 1] == -step)
            ok++;
        else if (rc != 0 && strstr(ct_errmsg(), "concurrent save"))
            retried++;
        else {
            if (!mixed++)
                fprintf(stderr, "  load %d: %s %s; step %lld, x %lld, y %lld\n", loads,
                        ct_errname(rc), ct_errmsg(), (long long)step, (long long)px[0],
                        (long long)py[0]);
        }
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    printf("  %d loads during saves: %d whole, %d refused as replaced, %d mixed or damaged\n",
           loads, ok, retried, mixed);
    ct_state_free(st);
    ASSERT_EQ(mixed, 0);
    ASSERT_TRUE(ok > 0);
}

/* Two savers in one directory: the removal of stale "*.tmp" directories by
 * one must spare the other's save in progress, while a tmp whose saver is
 * provably gone (same host, no such process) is removed. */
TEST(stale_tmp_removal_spares_another_savers_save_in_progress) {
    char *dir = tmpdir(), a[400], b[400];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    pid_t pid = fork();
    if (pid == 0) {
        int fails = 0;
        char big_path[400];
        for (int i = 0; i < 20; i++) {
            if (save_big(dir, "b", big_path, sizeof big_path) != 0) {
                if (!fails)
                    fprintf(stderr, "  saver b: %s\n", ct_errmsg());
                fails++;
            }
        }
        _exit(fails > 100 ? 100 : fails);
    }
    fixture f;
    fixture_init(&f, 13);
    int fails = 0;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0)
        fails += save_fixture(&f, a, 1) != 0;
    ASSERT_EQ(fails, 0);
    ASSERT_TRUE(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
    /* The debris of a saver that died: its marker names a pid that is gone. */
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    waitpid(dead, NULL, 0);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char path[600], text[800];
    snprintf(path, sizeof path, "%s/dead.tmp", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/dead.tmp/.ct-checkpoint-incomplete", dir);
    snprintf(text, sizeof text, "ct-checkpoint save in progress\nowner %032x\npid %d\nhost %s\n", 7,
             (int)dead, host);
    ASSERT_TRUE(spit(path, text));
    ASSERT_EQ(save_fixture(&f, a, 2), 0);
    snprintf(path, sizeof path, "%s/dead.tmp", dir);
    ASSERT_TRUE(!exists(path));
    fixture_free(&f);
}
