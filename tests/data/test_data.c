/* data/: IDX files written here byte by byte (every type, plain and gzipped,
 * and every way a file can be wrong), Fashion-MNIST from Debian's package,
 * the sampler's order and sharding, and the background loader's batches
 * against the rows the sampler selects. */
#include "ct_test.h"

#include <ct/data.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

/* ------------------------------------------------------------ temp files */

/* Writes n bytes to the temp file name, gzip-compressed when gz. */
static const char *put_file(char path[static 256], const char *name, const void *bytes, size_t n,
                            bool gz) {
    tt_tmp_path(path, name);
    if (gz) {
        gzFile f = gzopen(path, "wb");
        if (!f || (n && gzwrite(f, bytes, (unsigned)n) != (int)n) || gzclose(f) != Z_OK)
            abort();
    } else {
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(bytes, 1, n, f) != n || fclose(f) != 0)
            abort();
    }
    return path;
}

/* ---------------------------------------------------------- IDX builders */

typedef struct bytes {
    uint8_t b[8192];
    size_t n;
} bytes;

static void put_be(bytes *o, uint64_t v, int width) {
    for (int i = width - 1; i >= 0; i--)
        o->b[o->n++] = (uint8_t)(v >> (8 * i));
}

static void put_header(bytes *o, uint8_t type, int ndim, const uint32_t *sizes) {
    put_be(o, (uint32_t)type << 8 | (uint32_t)ndim, 4);
    for (int i = 0; i < ndim; i++)
        put_be(o, sizes[i], 4);
}

static int type_width(uint8_t type) {
    switch (type) {
    case 0x0B: return 2;
    case 0x0C:
    case 0x0D: return 4;
    case 0x0E: return 8;
    default: return 1;
    }
}

/* Element i of the test data for each type: both signs, the type's extremes
 * and (for floats) values that need every bit. */
static double value(uint8_t type, int64_t i) {
    switch (type) {
    case 0x08: return i == 1 ? 255 : (double)((i * 37) % 256);
    case 0x09: return i == 1 ? -128 : i == 2 ? 127 : (double)((i * 37) % 256 - 128);
    case 0x0B: return i == 1 ? -32768 : i == 2 ? 32767 : (double)(i * 1031 - 20000);
    case 0x0C: return i == 1 ? INT32_MIN : i == 2 ? INT32_MAX : (double)(i * 100003 - 1000000);
    case 0x0D: return (double)(float)((double)i * 0.1 - 2.5);
    default: return i == 1 ? -1e300 : (double)i * 0.1 - 2.5;
    }
}

static void put_value(bytes *o, uint8_t type, double v) {
    switch (type) {
    case 0x0D: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        put_be(o, u, 4);
        break;
    }
    case 0x0E: {
        uint64_t u;
        memcpy(&u, &v, 8);
        put_be(o, u, 8);
        break;
    }
    default: put_be(o, (uint64_t)(int64_t)v, type_width(type));
    }
}

/* A whole IDX file of the test data. */
static bytes idx_file(uint8_t type, int ndim, const uint32_t *sizes) {
    bytes o = {.n = 0};
    put_header(&o, type, ndim, sizes);
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++)
        numel *= sizes[i];
    for (int64_t i = 0; i < numel; i++)
        put_value(&o, type, value(type, i));
    return o;
}

/* ------------------------------------------------------------------ IDX */

TEST(idx_round_trips_every_type_plain_and_gzipped) {
    static const uint8_t types[] = {0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E};
    static const ct_dtype dtypes[] = {CT_UINT8, CT_INT32,   CT_INT32,
                                      CT_INT32, CT_FLOAT32, CT_FLOAT64};
    static const struct {
        int ndim;
        uint32_t sizes[CT_MAX_DIMS];
    } shapes[] = {{1, {7}},
                  {2, {3, 5}},
                  {3, {2, 3, 4}},
                  {4, {2, 1, 3, 2}},
                  {2, {0, 9}},
                  {1, {0}},
                  {8, {1, 2, 1, 2, 1, 2, 1, 3}}};
    for (size_t t = 0; t < sizeof types; t++) {
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            for (int gz = 0; gz < 2; gz++) {
                bytes f = idx_file(types[t], shapes[s].ndim, shapes[s].sizes);
                char path[256], name[64];
                snprintf(name, sizeof name, "rt_%02x_%zu_%d", types[t], s, gz);
                ct_tensor *got = ct_idx_load(put_file(path, name, f.b, f.n, gz));
                ASSERT_TRUE(got);
                ASSERT_EQ(ct_tensor_dtype(got), dtypes[t]);
                ASSERT_EQ(ct_ndim(got), shapes[s].ndim);
                ASSERT_TRUE(ct_is_contiguous(got));
                for (int d = 0; d < shapes[s].ndim; d++)
                    ASSERT_EQ(ct_size(got, d), shapes[s].sizes[d]);
                /* Compared as doubles: -1e300 has no long long. */
                for (int64_t i = 0; i < ct_numel(got); i++)
                    ASSERT_NEAR(tt_at(got, i), value(types[t], i), 0);
            }
        }
    }
}

TEST(idx_keeps_float_bits) {
    static const float specials[] = {-0.0f, INFINITY, -INFINITY, 1e-45f, 3.4028235e38f};
    bytes o = {.n = 0};
    put_header(&o, 0x0D, 1, (uint32_t[]){5});
    for (int i = 0; i < 5; i++)
        put_value(&o, 0x0D, specials[i]);
    char path[256];
    ct_tensor *t = ct_idx_load(put_file(path, "specials", o.b, o.n, true));
    ASSERT_TRUE(t);
    ASSERT_TRUE(memcmp(ct_data_ptr(t), specials, sizeof specials) == 0);
}

/* Loads bytes as a file and expects the error code with every substring. */
#define ASSERT_LOAD_FAILS(name, o, gz, code, ...)                                                  \
    do {                                                                                           \
        char tt_path[256];                                                                         \
        put_file(tt_path, name, (o).b, (o).n, gz);                                                 \
        ASSERT_FAILS(ct_idx_load(tt_path), code, tt_path, __VA_ARGS__);                            \
    } while (0)

TEST(idx_refuses_bad_headers) {
    bytes o = {.n = 0};
    ASSERT_LOAD_FAILS("empty", o, false, CT_ECORRUPT, "ends after 0 bytes", "needs at least 4");
    put_be(&o, 0x0008, 2);
    ASSERT_LOAD_FAILS("short_magic", o, true, CT_ECORRUPT, "ends after 2 bytes");
    o = idx_file(0x08, 1, (uint32_t[]){4});
    o.b[0] = 0x1f;
    ASSERT_LOAD_FAILS("magic", o, false, CT_ECORRUPT, "magic 0x1f000801", "two zero bytes");
    o = idx_file(0x08, 1, (uint32_t[]){4});
    o.b[2] = 0x0A;
    ASSERT_LOAD_FAILS("type", o, false, CT_ECORRUPT, "type byte 0x0a", "0x08 (ubyte)");
    o = (bytes){.n = 0};
    put_header(&o, 0x08, 0, NULL);
    put_be(&o, 7, 1);
    ASSERT_LOAD_FAILS("zero_dims", o, false, CT_ECORRUPT, "says 0 dims", "expected 1 to 8");
    o = (bytes){.n = 0};
    put_header(&o, 0x08, 9, (uint32_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1});
    put_be(&o, 7, 1);
    ASSERT_LOAD_FAILS("nine_dims", o, true, CT_ECORRUPT, "says 9 dims");
    o = (bytes){.n = 0};
    put_header(&o, 0x08, 3, (uint32_t[]){2, 2, 2});
    o.n = 10;
    ASSERT_LOAD_FAILS("in_sizes", o, false, CT_ECORRUPT, "ends after 10 bytes, inside the header",
                      "3 dims need 16 header bytes");
    ASSERT_LOAD_FAILS("in_sizes_gz", o, true, CT_ECORRUPT, "inside the header");
}

TEST(idx_refuses_sizes_the_file_cannot_hold) {
    /* 2^32-1 to the 8th overflows 64 bits. */
    bytes o = {.n = 0};
    uint32_t huge[8];
    for (int i = 0; i < 8; i++)
        huge[i] = UINT32_MAX;
    put_header(&o, 0x0E, 8, huge);
    ASSERT_LOAD_FAILS("overflow", o, false, CT_ECORRUPT, "more than 2^63 bytes");
    /* Sizes that fit in 64 bits but not in the file: refused before any
     * allocation, plain and gzipped. */
    o = (bytes){.n = 0};
    put_header(&o, 0x0C, 3, (uint32_t[]){60000, 60000, 60000});
    ASSERT_LOAD_FAILS("huge_plain", o, false, CT_ECORRUPT, "int [60000, 60000, 60000]",
                      "ends after 16 bytes");
    ASSERT_LOAD_FAILS("huge_gz", o, true, CT_ECORRUPT, "864000000000000 bytes of data",
                      "deflate expands at most 1032:1");
}

TEST(idx_refuses_sizes_whose_totals_overflow) {
    /* 2^62 sbytes fit in 63 bits, but not once they widen to int32. */
    bytes o = {.n = 0};
    put_header(&o, 0x09, 2, (uint32_t[]){1u << 31, 1u << 31});
    ASSERT_LOAD_FAILS("widened_overflow", o, false, CT_ECORRUPT,
                      "sbyte [2147483648, 2147483648] describes more than 2^63 bytes");
    /* 2^63 - 1 ubytes, 7^2 * 73 * 127 * 337 * 92737 * 649657: the data fits,
     * data and header together do not. */
    o = (bytes){.n = 0};
    put_header(&o, 0x08, 7, (uint32_t[]){7, 7, 73, 127, 337, 92737, 649657});
    ASSERT_LOAD_FAILS("total_overflow", o, true, CT_ECORRUPT, "more than 2^63 bytes");
    /* No elements, but strides past 2^63: a corrupt header, not a caller's
     * bad argument. */
    o = (bytes){.n = 0};
    put_header(&o, 0x08, 4, (uint32_t[]){0, UINT32_MAX, UINT32_MAX, UINT32_MAX});
    ASSERT_LOAD_FAILS("empty_huge", o, false, CT_ECORRUPT, "ubyte [0, 4294967295,",
                      "a shape ct cannot hold");
}

/* An sbyte [n] IDX file of zeros, gzipped as far as zlib goes (about 1000:1,
 * near deflate's limit). Returns the file's size. */
static int64_t put_zeros_gz(char path[static 256], const char *name, uint32_t n) {
    static const uint8_t zeros[8192];
    bytes h = {.n = 0};
    put_header(&h, 0x09, 1, &n);
    gzFile f = gzopen(tt_tmp_path(path, name), "wb9");
    if (!f || gzwrite(f, h.b, (unsigned)h.n) != (int)h.n)
        abort();
    for (uint32_t left = n; left > 0;) {
        uint32_t k = left < sizeof zeros ? left : (uint32_t)sizeof zeros;
        if (gzwrite(f, zeros, k) != (int)k)
            abort();
        left -= k;
    }
    struct stat st;
    if (gzclose(f) != Z_OK || stat(path, &st) != 0)
        abort();
    return (int64_t)st.st_size;
}

/* This process's peak resident memory (VmHWM) in KiB, or -1. */
static long peak_rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmHWM:", 6) == 0)
            kib = atol(line + 6);
    if (f)
        fclose(f);
    return kib;
}

/* How far ct_idx_load(path) raises the peak resident memory of a child
 * process, in bytes (-1: not measurable). The child resets its peak to its
 * current size first (proc(5), clear_refs "5"), so that what the parent
 * held before does not count. */
static int64_t load_peak_bytes(const char *path) {
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        int64_t grew = -1;
        FILE *f = fopen("/proc/self/clear_refs", "w");
        bool reset = f && fputs("5", f) >= 0;
        if (f && fclose(f) != 0)
            reset = false;
        long before = reset ? peak_rss_kib() : -1;
        if (before >= 0 && ct_idx_load(path)) {
            long after = peak_rss_kib();
            grew = after >= 0 ? (int64_t)(after - before) * 1024 : -1;
        } else if (before >= 0) {
            grew = (int64_t)(peak_rss_kib() - before) * 1024;
        }
        _exit(write(fds[1], &grew, sizeof grew) == sizeof grew ? 0 : 1);
    }
    close(fds[1]);
    int64_t grew = -1;
    if (pid < 0 || read(fds[0], &grew, sizeof grew) != sizeof grew)
        grew = -1;
    close(fds[0]);
    if (pid > 0)
        waitpid(pid, NULL, 0);
    return grew;
}

/* The file holds what its header claims; its int32 tensor would take 4000
 * times the file. */
static void check_widened_bound(const char *path, int64_t file_bytes, uint32_t n) {
    char want[160], limit[96];
    ASSERT_TRUE((int64_t)n <= 1032 * file_bytes && 4 * (int64_t)n > 1032 * file_bytes);
    snprintf(want, sizeof want, "sbyte [%u] loads as int32, %lld bytes", n, 4 * (long long)n);
    snprintf(limit, sizeof limit, "1032 times the file's %lld bytes", (long long)file_bytes);
    ASSERT_FAILS(ct_idx_load(path), CT_ENOMEM, path, want, limit,
                 "set CT_IDX_MAX_BYTES to allow more");
    int64_t grew = load_peak_bytes(path);
    ASSERT_TRUE(grew >= 0 && grew <= 1032 * file_bytes);

    /* The variable lifts the bound to the byte; the same load, allowed, is
     * what the bound kept out of memory. */
    char v[32];
    snprintf(v, sizeof v, "%lld", 4 * (long long)n - 1);
    setenv("CT_IDX_MAX_BYTES", v, 1);
    snprintf(limit, sizeof limit, "more than CT_IDX_MAX_BYTES=%s allows", v);
    ASSERT_FAILS(ct_idx_load(path), CT_ENOMEM, path, want, limit);
    snprintf(v, sizeof v, "%lld", 4 * (long long)n);
    setenv("CT_IDX_MAX_BYTES", v, 1);
    ct_tensor *t = ct_idx_load(path);
    ASSERT_TRUE(t);
    ASSERT_EQ(ct_tensor_dtype(t), CT_INT32);
    ASSERT_EQ(ct_numel(t), n);
    ASSERT_EQ(tt_at(t, 0), 0);
    ASSERT_EQ(tt_at(t, n - 1), 0);
    ASSERT_TRUE(load_peak_bytes(path) >= 4 * (int64_t)n);
}

TEST(idx_bounds_the_widened_size_of_a_gzip_file) {
    char path[256];
    const uint32_t n = 8u << 20;
    int64_t file_bytes = put_zeros_gz(path, "zeros_sbyte.gz", n);
    unsetenv("CT_IDX_MAX_BYTES");
    check_widened_bound(path, file_bytes, n);
    unsetenv("CT_IDX_MAX_BYTES");
}

static void check_max_bytes_var(void) {
    bytes o = idx_file(0x0B, 1, (uint32_t[]){3}); /* 6 bytes of data, 12 loaded */
    char path[256];
    put_file(path, "max_bytes", o.b, o.n, false);
    setenv("CT_IDX_MAX_BYTES", "11", 1);
    ASSERT_FAILS(ct_idx_load(path), CT_ENOMEM, path, "short [3] loads as int32, 12 bytes",
                 "more than CT_IDX_MAX_BYTES=11 allows");
    setenv("CT_IDX_MAX_BYTES", "12", 1);
    ASSERT_TRUE(ct_idx_load(path));
    static const char *const bad[] = {"",    "abc", "0",   "-1",
                                      " 12", "12k", "1e9", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char want[64];
        snprintf(want, sizeof want, "CT_IDX_MAX_BYTES=\"%s\" is not a whole number", bad[i]);
        setenv("CT_IDX_MAX_BYTES", bad[i], 1);
        ASSERT_FAILS(ct_idx_load(path), CT_EINVAL, want, "from 1 to 2^63-1");
    }
}

TEST(idx_max_bytes_bounds_plain_files_and_is_checked) {
    check_max_bytes_var();
    unsetenv("CT_IDX_MAX_BYTES");
}

TEST(idx_refuses_truncated_data_and_trailing_bytes) {
    bytes whole = idx_file(0x0B, 2, (uint32_t[]){3, 4}); /* 12 header + 24 data */
    bytes o = whole;
    o.n -= 3;
    ASSERT_LOAD_FAILS("trunc", o, false, CT_ECORRUPT, "ends after 33 bytes",
                      "short [3, 4] needs 36 (12 header + 24 data)");
    ASSERT_LOAD_FAILS("trunc_gz", o, true, CT_ECORRUPT, "decompressed data ends after 33 bytes",
                      "needs 36");
    o = whole;
    o.b[o.n++] = 0;
    o.b[o.n++] = 0;
    ASSERT_LOAD_FAILS("trailing", o, false, CT_ECORRUPT, "2 bytes follow the 36",
                      "trailing bytes are refused");
    ASSERT_LOAD_FAILS("trailing_gz", o, true, CT_ECORRUPT,
                      "decompressed data continues past the 36", "trailing bytes are refused");
}

/* Reads a whole file into o. */
static bool slurp(const char *path, bytes *o) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return false;
    o->n = fread(o->b, 1, sizeof o->b, f);
    fclose(f);
    return true;
}

TEST(idx_refuses_damaged_gzip_streams) {
    bytes whole = idx_file(0x0C, 2, (uint32_t[]){20, 30});
    char path[256];
    put_file(path, "gz_src", whole.b, whole.n, true);
    bytes gz;
    ASSERT_TRUE(slurp(path, &gz));
    /* The compressed stream cut in half: zlib's reason is kept. */
    bytes cut = gz;
    cut.n /= 2;
    ASSERT_LOAD_FAILS("gz_cut", cut, false, CT_ECORRUPT, "decompressed data ends after",
                      "needs 2412", "unexpected end of file");
    /* A wrong CRC in the gzip trailer. */
    bytes crc = gz;
    crc.b[crc.n - 8] ^= 0xff;
    ASSERT_LOAD_FAILS("gz_crc", crc, false, CT_ECORRUPT, "gzip data is damaged",
                      "incorrect data check");
}

TEST(idx_reports_unreadable_paths) {
    char path[256];
    tt_tmp_path(path, "does_not_exist.idx");
    ASSERT_FAILS(ct_idx_load(path), CT_EIO, path, "cannot open", "No such file or directory");
    ASSERT_FAILS(ct_idx_load(tt_tmp_path(path, ".")), CT_EIO, path, "Is a directory");
    ASSERT_FAILS(ct_idx_load(NULL), CT_EINVAL, "path is NULL");
}

TEST(idx_load_follows_the_ownership_rule) {
    bytes o = idx_file(0x08, 1, (uint32_t[]){3});
    char path[256];
    put_file(path, "owned", o.b, o.n, false);
    /* In the test's scope: the scope frees it. Handed out with ct_keep it
     * belongs to the caller of the outermost scope. */
    ASSERT_TRUE(ct_idx_load(path));
    ct_scope_begin();
    ct_tensor *kept = ct_keep(ct_idx_load(path));
    ct_scope_end();
    ASSERT_EQ(tt_at(kept, 1), 255);
}

/* -------------------------------------------------------- Fashion-MNIST */

static const char *class_counts_ok(ct_tensor *labels, int64_t per_class) {
    int64_t counts[10] = {0};
    const int64_t *l = ct_data_ptr(labels);
    for (int64_t i = 0; i < ct_size(labels, 0); i++) {
        if (l[i] < 0 || l[i] > 9)
            return "label outside 0..9";
        counts[l[i]]++;
    }
    for (int c = 0; c < 10; c++)
        if (counts[c] != per_class)
            return "unbalanced classes";
    return NULL;
}

TEST(fmnist_reads_debians_files) {
    char probe[512];
    snprintf(probe, sizeof probe, "%s/train-images-idx3-ubyte.gz", CT_FMNIST_DIR);
    if (access(probe, R_OK) != 0) {
        printf("  skipped: %s is not readable (install dataset-fashion-mnist)\n", probe);
        return;
    }
    static const struct {
        bool train;
        int64_t n;
        int first[10];
        double first_image_sum; /* of the raw bytes */
    } splits[] = {{true, 60000, {9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, 76247},
                  {false, 10000, {9, 2, 1, 1, 6, 1, 4, 6, 5, 7}, 33456}};
    for (int s = 0; s < 2; s++) {
        ct_tensor *x, *y;
        ASSERT_EQ(ct_fmnist_load(NULL, splits[s].train, &x, &y), 0);
        ASSERT_EQ(ct_tensor_dtype(x), CT_FLOAT32);
        ASSERT_EQ(ct_ndim(x), 2);
        ASSERT_EQ(ct_size(x, 0), splits[s].n);
        ASSERT_EQ(ct_size(x, 1), 784);
        ASSERT_EQ(ct_tensor_dtype(y), CT_INT64);
        ASSERT_EQ(ct_ndim(y), 1);
        ASSERT_EQ(ct_size(y, 0), splits[s].n);
        ASSERT_EQ(ct_item(ct_amin(x, NULL, 0, false)), 0.0);
        ASSERT_EQ(ct_item(ct_amax(x, NULL, 0, false)), 1.0);
        for (int i = 0; i < 10; i++)
            ASSERT_EQ(tt_at(y, i), splits[s].first[i]);
        ASSERT_NEAR(ct_item(ct_sum(ct_select(x, 0, 0), NULL, 0, false)),
                    splits[s].first_image_sum / 255.0, 1e-3);
        const char *why = class_counts_ok(y, splits[s].n / 10);
        if (why)
            tt_fail(__FILE__, __LINE__, "%s", why);
    }
}

/* Writes <dir>/train-{images,labels}-*.gz with n images of 2x3 and the given
 * labels. */
static void put_fmnist(const char *dir, int n_images, const uint8_t *labels, int n_labels) {
    char path[256], name[128];
    mkdir(tt_tmp_path(path, dir), 0700);
    bytes img = {.n = 0};
    put_header(&img, 0x08, 3, (uint32_t[]){(uint32_t)n_images, 2, 3});
    for (int i = 0; i < n_images * 6; i++)
        put_be(&img, (uint64_t)(i * 51 % 256), 1);
    snprintf(name, sizeof name, "%s/train-images-idx3-ubyte.gz", dir);
    put_file(path, name, img.b, img.n, true);
    bytes lab = {.n = 0};
    put_header(&lab, 0x08, 1, (uint32_t[]){(uint32_t)n_labels});
    for (int i = 0; i < n_labels; i++)
        put_be(&lab, labels[i], 1);
    snprintf(name, sizeof name, "%s/train-labels-idx1-ubyte.gz", dir);
    put_file(path, name, lab.b, lab.n, true);
}

TEST(fmnist_scales_images_and_widens_labels) {
    put_fmnist("fm_ok", 3, (const uint8_t[]){4, 0, 9}, 3);
    char dir[256];
    ct_tensor *x, *y;
    ASSERT_EQ(ct_fmnist_load(tt_tmp_path(dir, "fm_ok"), true, &x, &y), 0);
    ASSERT_EQ(ct_size(x, 0), 3);
    ASSERT_EQ(ct_size(x, 1), 6);
    for (int i = 0; i < 18; i++)
        ASSERT_NEAR(tt_at(x, i), (double)(float)((i * 51 % 256) / 255.0), 1e-7);
    ASSERT_EQ(ct_tensor_dtype(y), CT_INT64);
    ASSERT_EQ(tt_at(y, 0), 4);
    ASSERT_EQ(tt_at(y, 2), 9);
}

TEST(fmnist_refuses_inconsistent_files) {
    char dir[256], path[256];
    ct_tensor *x = (ct_tensor *)1, *y = (ct_tensor *)1;
    put_fmnist("fm_count", 3, (const uint8_t[]){1, 2}, 2);
    ASSERT_EQ(ct_fmnist_load(tt_tmp_path(dir, "fm_count"), true, &x, &y), CT_ECORRUPT);
    ASSERT_STR_CONTAINS(ct_errmsg(), "holds 3 images but");
    ASSERT_STR_CONTAINS(ct_errmsg(), "holds 2 labels");
    ASSERT_TRUE(x == NULL && y == NULL);
    put_fmnist("fm_label", 2, (const uint8_t[]){1, 10}, 2);
    ASSERT_EQ(ct_fmnist_load(tt_tmp_path(dir, "fm_label"), true, &x, &y), CT_ECORRUPT);
    ASSERT_STR_CONTAINS(ct_errmsg(), "label 1 is 10");
    /* Images of the wrong type. */
    put_fmnist("fm_type", 2, (const uint8_t[]){1, 2}, 2);
    bytes f = idx_file(0x0D, 3, (uint32_t[]){2, 2, 3});
    put_file(path, "fm_type/train-images-idx3-ubyte.gz", f.b, f.n, true);
    ASSERT_EQ(ct_fmnist_load(tt_tmp_path(dir, "fm_type"), true, &x, &y), CT_ECORRUPT);
    ASSERT_STR_CONTAINS(ct_errmsg(), "float32[2, 2, 3]");
    ASSERT_STR_CONTAINS(ct_errmsg(), "expected uint8 [N, rows, cols]");
    /* A missing split names the file it looked for. */
    ASSERT_EQ(ct_fmnist_load(tt_tmp_path(dir, "fm_ok_missing"), false, &x, &y), CT_EIO);
    ASSERT_STR_CONTAINS(ct_errmsg(), "fm_ok_missing/t10k-images-idx3-ubyte.gz");
    ASSERT_EQ(ct_fmnist_load(NULL, true, NULL, &y), CT_EINVAL);
}

/* --------------------------------------------------------------- sampler */

static ct_sampler make_sampler(int64_t n, bool shuffle, uint64_t seed, bool drop_last, int R,
                               int rank) {
    ct_sampler s;
    ct_sampler_options o = {n, shuffle, seed, drop_last, R, rank};
    if (ct_sampler_init(&s, &o) != 0)
        memset(&s, 0, sizeof s);
    return s;
}

/* The sampler's indices for epoch into a malloc'd array (NULL on error). */
static int64_t *indices_of(const ct_sampler *s, int64_t epoch) {
    int64_t n = ct_sampler_len(s);
    int64_t *out = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    if (ct_sampler_indices(s, epoch, out) != 0) {
        free(out);
        return NULL;
    }
    return out;
}

TEST(sampler_refuses_bad_options) {
    ct_sampler s;
    ASSERT_EQ(ct_sampler_init(&s, NULL), CT_EINVAL);
    ASSERT_EQ(ct_sampler_init(&s, &(ct_sampler_options){.size = -1}), CT_EINVAL);
    ASSERT_STR_CONTAINS(ct_errmsg(), "size is -1");
    ASSERT_EQ(ct_sampler_init(&s, &(ct_sampler_options){.size = 5, .num_replicas = -2}), CT_EINVAL);
    ASSERT_EQ(ct_sampler_init(&s, &(ct_sampler_options){.size = 5, .num_replicas = 4, .rank = 4}),
              CT_EINVAL);
    ASSERT_STR_CONTAINS(ct_errmsg(), "rank is 4; expected 0 <= rank < num_replicas (4)");
    ASSERT_EQ(ct_sampler_init(&s, &(ct_sampler_options){.size = 5, .rank = 1}), CT_EINVAL);
    /* A failed init leaves the sampler unusable, not half-set. */
    int64_t buf[8];
    ASSERT_EQ(ct_sampler_len(&s), -1);
    ASSERT_EQ(ct_sampler_indices(&s, 0, buf), CT_EINVAL);
    ASSERT_STR_CONTAINS(ct_errmsg(), "not initialised");
    ct_sampler zero = {0};
    ASSERT_EQ(ct_sampler_set_epoch(&zero, 1), CT_EINVAL);
    ASSERT_EQ(ct_sampler_position(NULL, NULL, NULL), CT_EINVAL);
    s = make_sampler(5, true, 1, false, 1, 0);
    ASSERT_EQ(ct_sampler_indices(&s, -1, buf), CT_EINVAL);
    ASSERT_EQ(ct_sampler_indices(&s, 0, NULL), CT_EINVAL);
}

TEST(sampler_without_shuffle_is_in_order) {
    ct_sampler s = make_sampler(9, false, 0, false, 1, 0);
    ASSERT_EQ(ct_sampler_len(&s), 9);
    int64_t *idx = indices_of(&s, 3);
    ASSERT_TRUE(idx);
    for (int i = 0; i < 9; i++)
        ASSERT_EQ(idx[i], i);
    free(idx);
}

TEST(sampler_shuffle_is_a_pure_function_of_seed_epoch_and_size) {
    const int64_t n = 10007;
    ct_sampler a = make_sampler(n, true, 1234, false, 1, 0);
    ct_sampler b = make_sampler(n, true, 1234, false, 1, 0);
    int64_t *e0 = indices_of(&a, 0), *e0b = indices_of(&b, 0), *e1 = indices_of(&a, 1);
    ASSERT_TRUE(e0 && e0b && e1);
    /* The documented rule. */
    ct_tensor *want = ct_randperm(n, &(ct_generator){1234, 0});
    ct_tensor *want1 = ct_randperm(n, &(ct_generator){1234, 1ull << 32});
    bool same = memcmp(e0, e0b, sizeof(int64_t) * n) == 0;
    bool rule0 = memcmp(e0, ct_data_ptr(want), sizeof(int64_t) * n) == 0;
    bool rule1 = memcmp(e1, ct_data_ptr(want1), sizeof(int64_t) * n) == 0;
    bool differ = memcmp(e0, e1, sizeof(int64_t) * n) != 0;
    /* Each index once per epoch. */
    char *seen = calloc((size_t)n, 1);
    bool once = true;
    for (int64_t i = 0; i < n; i++) {
        once &= e0[i] >= 0 && e0[i] < n && !seen[e0[i]];
        if (once)
            seen[e0[i]] = 1;
    }
    /* Another seed, another order; changing the position changes nothing. */
    ct_sampler c = make_sampler(n, true, 1235, false, 1, 0);
    int64_t *other = indices_of(&c, 0);
    ASSERT_EQ(ct_sampler_set_position(&a, 7, 11), 0);
    int64_t *after = indices_of(&a, 0);
    bool seed_matters = memcmp(e0, other, sizeof(int64_t) * n) != 0;
    bool position_free = memcmp(e0, after, sizeof(int64_t) * n) == 0;
    free(seen);
    free(e0);
    free(e0b);
    free(e1);
    free(other);
    free(after);
    ASSERT_TRUE(same);
    ASSERT_TRUE(rule0);
    ASSERT_TRUE(rule1);
    ASSERT_TRUE(differ);
    ASSERT_TRUE(once);
    ASSERT_TRUE(seed_matters);
    ASSERT_TRUE(position_free);
}

TEST(sampler_order_does_not_depend_on_the_thread_count) {
    int saved = ct_get_num_threads();
    ct_sampler s = make_sampler(50000, true, 9, false, 1, 0);
    ct_set_num_threads(1);
    int64_t *one = indices_of(&s, 5);
    ct_set_num_threads(3);
    int64_t *three = indices_of(&s, 5);
    ct_set_num_threads(saved);
    ASSERT_TRUE(one && three);
    bool same = memcmp(one, three, sizeof(int64_t) * 50000) == 0;
    free(one);
    free(three);
    ASSERT_TRUE(same);
}

/* Checks the R ranks' shards of an n-row epoch against the permutation of
 * the unsharded sampler: rank r holds padded[r], padded[r + R], ... where
 * padded[k] = perm[k % n]. */
static void check_shards(int64_t n, int R, bool drop_last, int64_t want_len) {
    ct_sampler whole = make_sampler(n, true, 77, false, 1, 0);
    int64_t *perm = indices_of(&whole, 2);
    for (int r = 0; r < R; r++) {
        ct_sampler s = make_sampler(n, true, 77, drop_last, R, r);
        if (ct_sampler_len(&s) != want_len) {
            tt_fail(__FILE__, __LINE__, "n %lld, %d replicas, drop_last %d: len %lld, want %lld",
                    (long long)n, R, drop_last, (long long)ct_sampler_len(&s), (long long)want_len);
            break;
        }
        int64_t *mine = indices_of(&s, 2);
        for (int64_t j = 0; j < want_len; j++)
            if (mine[j] != perm[(r + R * j) % n]) {
                tt_fail(__FILE__, __LINE__, "n %lld, rank %d of %d: index %lld is %lld, want %lld",
                        (long long)n, r, R, (long long)j, (long long)mine[j],
                        (long long)perm[(r + R * j) % n]);
                break;
            }
        free(mine);
    }
    free(perm);
}

TEST(sampler_shards_pad_by_wrapping_or_drop_the_tail) {
    check_shards(10, 4, false, 3); /* 12 slots: perm[0], perm[1] repeat */
    check_shards(10, 4, true, 2);  /* 8 slots: perm[8], perm[9] dropped */
    check_shards(12, 4, false, 3);
    check_shards(12, 4, true, 3);
    check_shards(2, 5, false, 1); /* padding longer than the data wraps again */
    check_shards(3, 4, true, 0);
    check_shards(0, 3, false, 0);
    /* Shards of one epoch partition it: every row exactly once when R
     * divides n. */
    int64_t seen[24] = {0};
    for (int r = 0; r < 3; r++) {
        ct_sampler s = make_sampler(24, true, 5, false, 3, r);
        int64_t *mine = indices_of(&s, 0);
        for (int j = 0; j < 8; j++)
            seen[mine[j]]++;
        free(mine);
    }
    for (int i = 0; i < 24; i++)
        ASSERT_EQ(seen[i], 1);
}

TEST(sampler_position_is_set_and_checked) {
    ct_sampler s = make_sampler(10, true, 1, false, 3, 2);
    int64_t e = -1, o = -1;
    ASSERT_EQ(ct_sampler_position(&s, &e, &o), 0);
    ASSERT_EQ(e, 0);
    ASSERT_EQ(o, 0);
    ASSERT_EQ(ct_sampler_set_position(&s, 4, 4), 0);
    ASSERT_EQ(ct_sampler_position(&s, &e, NULL), 0);
    ASSERT_EQ(e, 4);
    ASSERT_EQ(ct_sampler_set_position(&s, 4, 5), CT_ERANGE);
    ASSERT_STR_CONTAINS(ct_errmsg(), "offset 5 is outside [0, 4]");
    ASSERT_STR_CONTAINS(ct_errmsg(), "rank 2 of 3");
    ASSERT_EQ(ct_sampler_set_position(&s, -1, 0), CT_EINVAL);
    ASSERT_EQ(ct_sampler_set_epoch(&s, 9), 0);
    ASSERT_EQ(ct_sampler_position(&s, &e, &o), 0);
    ASSERT_EQ(e, 9);
    ASSERT_EQ(o, 0);
}

/* ---------------------------------------------------------------- loader */

/* n rows of [3, 2] float32 whose values name the row (row i holds
 * 10 i .. 10 i + 5), and targets int64 [n] = 1000 + i. */
static ct_tensor *rows_x(int64_t n) {
    return ct_view(ct_arange(0, (double)(n * 6), 1, CT_FLOAT32), CT_SHAPE(n, 3, 2));
}

static ct_tensor *rows_y(int64_t n) { return ct_arange(1000, (double)(1000 + n), 1, CT_INT64); }

/* Checks that batch rows x[i], y[i] equal inputs[idx[i]], targets[idx[i]]. */
static bool batch_matches(ct_tensor *x, ct_tensor *y, ct_tensor *inputs, ct_tensor *targets,
                          const int64_t *idx, int64_t rows) {
    if (!x || ct_size(x, 0) != rows || (targets && (!y || ct_size(y, 0) != rows))) {
        tt_fail(__FILE__, __LINE__, "batch of %lld rows expected: %s", (long long)rows,
                ct_errmsg());
        return false;
    }
    if (ct_tensor_dtype(x) != ct_tensor_dtype(inputs) || ct_ndim(x) != ct_ndim(inputs)) {
        tt_fail(__FILE__, __LINE__, "batch dtype or rank differs from the inputs'");
        return false;
    }
    for (int64_t i = 0; i < rows; i++) {
        if (!tt_close(__FILE__, __LINE__, ct_select(x, 0, i), ct_select(inputs, 0, idx[i]), 0, 0))
            return false;
        if (targets &&
            !tt_close(__FILE__, __LINE__, ct_select(y, 0, i), ct_select(targets, 0, idx[i]), 0, 0))
            return false;
    }
    return true;
}

/* Runs one epoch of l and checks each batch against the sampler's indices
 * for that epoch, starting from offset. */
static bool check_epoch(ct_loader *l, const ct_sampler *s, int64_t epoch, int64_t offset,
                        int64_t batch, bool drop_last, ct_tensor *inputs, ct_tensor *targets) {
    int64_t *idx = indices_of(s, epoch);
    int64_t len = ct_sampler_len(s);
    bool ok = idx != NULL;
    for (int64_t at = offset; ok; at += batch < len - at ? batch : len - at) {
        int64_t rows = len - at < batch ? len - at : batch;
        bool last = rows == 0 || (drop_last && rows < batch);
        ct_tensor *x = (ct_tensor *)1, *y = (ct_tensor *)1;
        ct_scope_begin();
        int rc = ct_loader_next(l, &x, targets ? &y : NULL);
        if (rc != (last ? 0 : 1)) {
            tt_fail(__FILE__, __LINE__, "epoch %lld at %lld: next gave %d, want %d: %s",
                    (long long)epoch, (long long)at, rc, last ? 0 : 1, ct_errmsg());
            ok = false;
        } else if (last) {
            ok = x == NULL && (!targets || y == NULL);
        } else {
            ok = batch_matches(x, y, inputs, targets, idx + at, rows);
        }
        ct_scope_end();
        if (last)
            break;
    }
    free(idx);
    return ok;
}

TEST(loader_batches_are_the_sampled_rows_in_order) {
    ct_tensor *x = rows_x(23), *y = rows_y(23);
    ct_sampler s = make_sampler(23, true, 3, false, 1, 0);
    ct_loader *l = ct_loader_new(x, y, &(ct_loader_options){.batch_size = 5, .sampler = &s});
    ASSERT_TRUE(l);
    ASSERT_EQ(ct_loader_num_batches(l), 5);
    bool ok = true;
    for (int64_t e = 0; e < 3 && ok; e++) {
        ok = check_epoch(l, &s, e, 0, 5, false, x, y);
        int64_t pe, po;
        ct_loader_position(l, &pe, &po);
        ok = ok && pe == e + 1 && po == 0;
    }
    ct_loader_free(l);
    ASSERT_TRUE(ok);
}

TEST(loader_drop_last_and_big_batches) {
    ct_tensor *x = rows_x(23), *y = rows_y(23);
    ct_sampler s = make_sampler(23, true, 3, false, 1, 0);
    ct_loader *l = ct_loader_new(
        x, y, &(ct_loader_options){.batch_size = 5, .drop_last = true, .sampler = &s});
    ASSERT_TRUE(l);
    ASSERT_EQ(ct_loader_num_batches(l), 4);
    bool ok = check_epoch(l, &s, 0, 0, 5, true, x, y) && check_epoch(l, &s, 1, 0, 5, true, x, y);
    ct_loader_free(l);
    ASSERT_TRUE(ok);
    /* A batch larger than the dataset: one short batch, or none. */
    l = ct_loader_new(x, y, &(ct_loader_options){.batch_size = 100, .prefetch = 1});
    ASSERT_EQ(ct_loader_num_batches(l), 1);
    ct_sampler seq = make_sampler(23, false, 0, false, 1, 0);
    ok = check_epoch(l, &seq, 0, 0, 100, false, x, y);
    ct_loader_free(l);
    ASSERT_TRUE(ok);
    l = ct_loader_new(x, y, &(ct_loader_options){.batch_size = 100, .drop_last = true});
    ASSERT_EQ(ct_loader_num_batches(l), 0);
    ok = check_epoch(l, &seq, 0, 0, 100, true, x, y);
    ct_loader_free(l);
    ASSERT_TRUE(ok);
}

TEST(loader_takes_any_dtype_layout_and_no_targets) {
    ct_sampler s = make_sampler(11, true, 8, false, 1, 0);
    ct_loader_options o = {.batch_size = 4, .sampler = &s};
    /* uint8 inputs, float64 [N, 2] targets. */
    ct_tensor *u8 = tt_rand(CT_SHAPE(11, 7), CT_UINT8, 1);
    ct_tensor *f64 = tt_rand(CT_SHAPE(11, 2), CT_FLOAT64, 2);
    ct_loader *l = ct_loader_new(u8, f64, &o);
    bool ok = l && check_epoch(l, &s, 0, 0, 4, false, u8, f64);
    ct_loader_free(l);
    ASSERT_TRUE(ok);
    /* Transposed inputs are copied once; rows of a stride-0 dim 0 are read
     * in place. No targets: y stays NULL. */
    ct_tensor *tr = ct_transpose(tt_rand(CT_SHAPE(5, 11), CT_INT32, 3), 0, 1);
    l = ct_loader_new(tr, NULL, &o);
    ok = l && check_epoch(l, &s, 0, 0, 4, false, tr, NULL);
    ct_loader_free(l);
    ASSERT_TRUE(ok);
    ct_tensor *ex = ct_expand(tt_rand(CT_SHAPE(1, 3), CT_BFLOAT16, 4), CT_SHAPE(11, 3));
    l = ct_loader_new(ex, NULL, &o);
    ok = l && check_epoch(l, &s, 0, 0, 4, false, ex, NULL);
    ct_loader_free(l);
    ASSERT_TRUE(ok);
}

TEST(loader_shards_follow_the_sampler) {
    ct_tensor *x = rows_x(7), *y = rows_y(7);
    int64_t seen[7] = {0};
    for (int r = 0; r < 2; r++) {
        ct_sampler s = make_sampler(7, true, 21, false, 2, r);
        ct_loader *l = ct_loader_new(x, y, &(ct_loader_options){.batch_size = 3, .sampler = &s});
        ASSERT_TRUE(l);
        ASSERT_EQ(ct_loader_num_batches(l), 2);
        bool ok = check_epoch(l, &s, 0, 0, 3, false, x, y);
        ct_loader_free(l);
        ASSERT_TRUE(ok);
        int64_t *mine = indices_of(&s, 0);
        for (int j = 0; j < 4; j++)
            seen[mine[j]]++;
        free(mine);
    }
    /* 8 slots over 7 rows: one row twice, every row at least once. */
    int64_t total = 0;
    for (int i = 0; i < 7; i++) {
        ASSERT_TRUE(seen[i] >= 1);
        total += seen[i];
    }
    ASSERT_EQ(total, 8);
}

TEST(loader_resumes_from_a_position) {
    ct_tensor *x = rows_x(40), *y = rows_y(40);
    ct_sampler s = make_sampler(40, true, 11, false, 1, 0);
    ct_loader *l = ct_loader_new(x, y, &(ct_loader_options){.batch_size = 6, .sampler = &s});
    ASSERT_TRUE(l);
    ct_tensor *bx, *by;
    for (int i = 0; i < 2; i++)
        ASSERT_EQ(ct_loader_next(l, &bx, &by), 1);
    int64_t e, o;
    ASSERT_EQ(ct_loader_position(l, &e, &o), 0);
    ASSERT_EQ(e, 0);
    ASSERT_EQ(o, 12);
    /* A new loader from a sampler set to that position goes on where this
     * one would. */
    ct_sampler resumed = s;
    ASSERT_EQ(ct_sampler_set_position(&resumed, e, o), 0);
    ct_loader *l2 = ct_loader_new(x, y, &(ct_loader_options){.batch_size = 6, .sampler = &resumed});
    bool ok =
        check_epoch(l2, &s, 0, 12, 6, false, x, y) && check_epoch(l, &s, 0, 12, 6, false, x, y);
    ct_loader_free(l2);
    /* set_epoch mid-epoch drops what was prepared ahead; set_position may
     * land anywhere, even off the batch grid. */
    ok = ok && ct_loader_next(l, &bx, &by) == 1 && ct_loader_set_epoch(l, 5) == 0 &&
         check_epoch(l, &s, 5, 0, 6, false, x, y);
    ok = ok && ct_loader_set_position(l, 2, 37) == 0 && check_epoch(l, &s, 2, 37, 6, false, x, y);
    ok = ok && ct_loader_set_position(l, 3, 40) == 0 && check_epoch(l, &s, 3, 40, 6, false, x, y);
    ASSERT_TRUE(ok);
    ASSERT_EQ(ct_loader_set_position(l, 0, 41), CT_ERANGE);
    ASSERT_STR_CONTAINS(ct_errmsg(), "offset 41 is outside [0, 40]");
    ASSERT_EQ(ct_loader_set_epoch(l, -2), CT_EINVAL);
    ct_loader_free(l);
}

/* Loads two shuffled epochs with the given pool size and returns them as one
 * int64 tensor of targets in batch order. */
static ct_tensor *two_epochs_of_targets(int threads) {
    ct_set_num_threads(threads);
    const int64_t n = 12000;
    ct_tensor *x = ct_view(ct_arange(0, (double)n * 2, 1, CT_FLOAT32), CT_SHAPE(n, 2));
    ct_tensor *y = ct_arange(0, (double)n, 1, CT_INT64);
    ct_sampler s = make_sampler(n, true, 99, false, 1, 0);
    ct_loader *l = ct_loader_new(x, y, &(ct_loader_options){.batch_size = 512, .sampler = &s});
    ct_tensor *all = ct_empty(CT_SHAPE(2 * n), CT_INT64);
    int64_t *out = ct_data_ptr(all), k = 0;
    for (int e = 0; l && e < 2; e++) {
        ct_tensor *bx, *by;
        while (ct_loader_next(l, &bx, &by) == 1) {
            memcpy(out + k, ct_data_ptr(by), sizeof(int64_t) * (size_t)ct_size(by, 0));
            k += ct_size(by, 0);
        }
    }
    ct_loader_free(l);
    return k == 2 * n ? all : NULL;
}

TEST(loader_order_does_not_depend_on_the_thread_count) {
    int saved = ct_get_num_threads();
    ct_tensor *one = two_epochs_of_targets(1);
    ct_tensor *two = two_epochs_of_targets(2);
    ct_set_num_threads(saved);
    ASSERT_CLOSE(one, two, 0, 0);
}

TEST(loader_free_mid_epoch_keeps_handed_out_batches) {
    ct_tensor *x = tt_rand(CT_SHAPE(4096, 64), CT_FLOAT32, 5);
    ct_sampler s = make_sampler(4096, true, 2, false, 1, 0);
    /* Freed at once, and freed with the queue full mid-epoch. */
    ct_loader_free(ct_loader_new(x, NULL, &(ct_loader_options){.batch_size = 8, .sampler = &s}));
    ct_loader *l =
        ct_loader_new(x, NULL, &(ct_loader_options){.batch_size = 8, .prefetch = 8, .sampler = &s});
    ASSERT_TRUE(l);
    ct_tensor *b;
    ASSERT_EQ(ct_loader_next(l, &b, NULL), 1);
    usleep(20000);
    ct_loader_free(l);
    int64_t *idx = indices_of(&s, 0);
    bool ok = batch_matches(b, NULL, x, NULL, idx, 8);
    free(idx);
    ASSERT_TRUE(ok);
}

static ct_tensor *unscoped_batch;
static int unscoped_rc;

static void next_outside_scopes(void) {
    ct_scope_begin();
    ct_tensor *x = ct_keep(rows_x(4));
    ct_scope_end();
    ct_loader *l = ct_loader_new(x, NULL, &(ct_loader_options){.batch_size = 3});
    unscoped_rc = ct_loader_next(l, &unscoped_batch, NULL);
    ct_loader_free(l);
    ct_tensor_free(x);
}

TEST(loader_batches_follow_the_ownership_rule) {
    /* Outside any scope the caller owns the batch, and it outlives the
     * loader and the inputs (freed at the end of this test). */
    tt_run_unscoped(next_outside_scopes);
    ASSERT_EQ(unscoped_rc, 1);
    ASSERT_EQ(tt_at(unscoped_batch, 17), 17);
    ct_tensor_free(unscoped_batch);
}

TEST(loader_over_no_rows_ends_every_epoch_at_once) {
    ct_tensor *x = ct_zeros(CT_SHAPE(0, 4), CT_FLOAT32);
    ct_loader *l = ct_loader_new(x, NULL, &(ct_loader_options){.batch_size = 2});
    ASSERT_TRUE(l);
    ASSERT_EQ(ct_loader_num_batches(l), 0);
    ct_tensor *b;
    ASSERT_EQ(ct_loader_next(l, &b, NULL), 0);
    ASSERT_EQ(ct_loader_next(l, &b, NULL), 0);
    int64_t e;
    ct_loader_position(l, &e, NULL);
    ASSERT_EQ(e, 2);
    ct_loader_free(l);
}

typedef struct transform_ctx {
    pthread_t caller;
    atomic_bool ran_on_caller;
    atomic_int fail_batch; /* in epoch 0; -1: none */
    atomic_int calls;
} transform_ctx;

static int double_inputs(void *arg, ct_tensor *x, ct_tensor *y, int64_t epoch, int64_t batch) {
    transform_ctx *c = arg;
    atomic_fetch_add(&c->calls, 1);
    if (pthread_equal(pthread_self(), c->caller))
        atomic_store(&c->ran_on_caller, true);
    if (epoch == 0 && batch == atomic_load(&c->fail_batch))
        return ct_view(x, CT_SHAPE(5, 5)) ? 0 : ct_errcode(); /* a real ct error */
    /* Temporaries land in the loader's scope on this thread. */
    ct_tensor *twice = ct_mul_scalar(x, 2.0);
    return ct_copy_(x, twice) && ct_add_scalar_(y, 0.0) ? 0 : ct_errcode();
}

TEST(loader_runs_the_transform_in_the_background_and_reports_its_failure) {
    ct_tensor *x = rows_x(10), *y = rows_y(10);
    transform_ctx c = {.caller = pthread_self(), .fail_batch = 2};
    ct_loader_options o = {.batch_size = 3, .transform = double_inputs, .transform_ctx = &c};
    ct_loader *l = ct_loader_new(x, y, &o);
    ASSERT_TRUE(l);
    ct_tensor *bx, *by;
    for (int b = 0; b < 2; b++) {
        ASSERT_EQ(ct_loader_next(l, &bx, &by), 1);
        ASSERT_EQ(tt_at(bx, 0), 2.0 * (b * 3 * 6));
        ASSERT_EQ(tt_at(by, 2), 1000 + b * 3 + 2);
    }
    /* Batch 2 fails: the code and message reach the caller, again and again
     * until a restart. */
    for (int again = 0; again < 2; again++) {
        ASSERT_EQ(ct_loader_next(l, &bx, &by), CT_ESHAPE);
        ASSERT_TRUE(bx == NULL && by == NULL);
        ASSERT_STR_CONTAINS(ct_errmsg(), "loader: epoch 0, batch 2 (rows from 6)");
        ASSERT_STR_CONTAINS(ct_errmsg(), "the transform returned CT_ESHAPE: view");
    }
    int64_t e, off;
    ASSERT_EQ(ct_loader_position(l, &e, &off), 0);
    ASSERT_EQ(off, 6);
    atomic_store(&c.fail_batch, -1);
    ASSERT_EQ(ct_loader_set_position(l, e, off), 0);
    ASSERT_EQ(ct_loader_next(l, &bx, &by), 1);
    ASSERT_EQ(tt_at(bx, 0), 2.0 * 36);
    ASSERT_EQ(ct_loader_next(l, &bx, &by), 1);
    ASSERT_EQ(ct_size(bx, 0), 1);
    ASSERT_EQ(ct_loader_next(l, &bx, &by), 0);
    ct_loader_free(l);
    ASSERT_TRUE(!atomic_load(&c.ran_on_caller));
    ASSERT_TRUE(atomic_load(&c.calls) >= 4);
}

TEST(loader_refuses_bad_arguments) {
    ct_tensor *x = rows_x(6), *y = rows_y(6);
    ct_loader_options o = {.batch_size = 2};
    ASSERT_FAILS(ct_loader_new(NULL, y, &o), CT_EINVAL, "input 0 is NULL");
    ASSERT_FAILS(ct_loader_new(x, y, NULL), CT_EINVAL, "options are NULL");
    ASSERT_FAILS(ct_loader_new(x, y, &(ct_loader_options){.batch_size = 0}), CT_EINVAL,
                 "batch_size is 0");
    ASSERT_FAILS(ct_loader_new(x, y, &(ct_loader_options){.batch_size = 1, .prefetch = 65}),
                 CT_EINVAL, "prefetch is 65; expected 1 to 64");
    ASSERT_FAILS(ct_loader_new(x, rows_y(5), &o), CT_ESHAPE, "float32[6, 3, 2]", "int64[5]",
                 "(6 vs 5)");
    ASSERT_FAILS(ct_loader_new(ct_scalar(1, CT_FLOAT32), NULL, &o), CT_ESHAPE, "first dim of rows");
    ct_sampler s = make_sampler(7, true, 0, false, 1, 0);
    ASSERT_FAILS(ct_loader_new(x, y, &(ct_loader_options){.batch_size = 2, .sampler = &s}),
                 CT_ESHAPE, "the sampler covers 7 rows", "have 6");
    ct_sampler zero = {0};
    ASSERT_FAILS(ct_loader_new(x, y, &(ct_loader_options){.batch_size = 2, .sampler = &zero}),
                 CT_EINVAL, "not initialised");
    ct_tensor *b, *c;
    ASSERT_EQ(ct_loader_next(NULL, &b, &c), CT_EINVAL);
    ASSERT_EQ(ct_loader_num_batches(NULL), -1);
    ASSERT_EQ(ct_loader_position(NULL, NULL, NULL), CT_EINVAL);
    ct_loader *l = ct_loader_new(x, y, &o);
    ASSERT_TRUE(l);
    ASSERT_EQ(ct_loader_next(l, &b, NULL), CT_EINVAL);
    ASSERT_STR_CONTAINS(ct_errmsg(), "y is NULL but the loader has targets");
    ASSERT_EQ(ct_loader_next(l, NULL, &c), CT_EINVAL);
    ct_loader_free(l);
    ct_loader_free(NULL);
}
