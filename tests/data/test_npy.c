/* data/ .npy files: round trips of every dtype and layout, files built here
 * byte by byte from the format's description (NEP 1, numpy.lib.format):
 * Fortran order, big-endian, versions 2.0 and 3.0, and every way a header
 * or a file can break the format. Built with TT_NPY_NUMPY, the same
 * executable instead checks files against numpy itself, and exits 77
 * (skipped) where no python3 has numpy. */
#include "ct_test.h"

#include <ct/npy.h>

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* t's bytes in row-major order, gathered through its strides (malloc'd). */
static unsigned char *row_major_bytes(ct_tensor *t) {
    const size_t es = ct_dtype_size(ct_tensor_dtype(t));
    const int64_t n = ct_numel(t);
    unsigned char *out = malloc((size_t)n * es + 1);
    int64_t idx[CT_MAX_DIMS] = {0};
    for (int64_t i = 0; i < n; i++) {
        int64_t off = 0;
        for (int d = 0; d < ct_ndim(t); d++)
            off += idx[d] * ct_stride(t, d);
        memcpy(out + (size_t)i * es, (const char *)ct_data_ptr(t) + off * (int64_t)es, es);
        for (int d = ct_ndim(t) - 1; d >= 0 && ++idx[d] == ct_size(t, d); d--)
            idx[d] = 0;
    }
    return out;
}

/* Whether got has want's dtype, shape and (row-major) bytes. */
static bool same_tensor(int line, const char *name, ct_tensor *got, ct_tensor *want) {
    if (!got) {
        tt_fail(__FILE__, line, "%s: the load failed: %s", name, ct_errmsg());
        return false;
    }
    bool shape = ct_ndim(got) == ct_ndim(want);
    for (int d = 0; shape && d < ct_ndim(want); d++)
        shape = ct_size(got, d) == ct_size(want, d);
    if (ct_tensor_dtype(got) != ct_tensor_dtype(want) || !shape) {
        tt_fail(__FILE__, line, "%s: got %s with %d dims, want %s with %d", name,
                ct_dtype_name(ct_tensor_dtype(got)), ct_ndim(got),
                ct_dtype_name(ct_tensor_dtype(want)), ct_ndim(want));
        return false;
    }
    size_t n = (size_t)ct_numel(want) * ct_dtype_size(ct_tensor_dtype(want));
    unsigned char *g = row_major_bytes(got), *w = row_major_bytes(want);
    bool same = n == 0 || memcmp(g, w, n) == 0;
    free(g);
    free(w);
    if (!same)
        tt_fail(__FILE__, line, "%s: the bytes differ", name);
    return same;
}
#define ASSERT_SAME(name, got, want)                                                               \
    do {                                                                                           \
        if (!same_tensor(__LINE__, (name), (got), (want)))                                         \
            return;                                                                                \
    } while (0)

#ifndef TT_NPY_NUMPY

/* ------------------------------------------------------------ files */

/* An .npy file as the format describes it: the magic, version major.0, the
 * header length (2 bytes little-endian in 1.0, 4 in 2.0 and 3.0), dict
 * padded with spaces and '\n' so that the data starts at a multiple of
 * align, then ndata bytes of data (zeros when data is NULL). */
static const char *npy_file_aligned(char path[static 256], const char *name, int major,
                                    const char *dict, size_t align, const void *data,
                                    size_t ndata) {
    size_t prefix = major == 1 ? 10 : 12, dlen = strlen(dict);
    size_t total = (prefix + dlen + 1 + align - 1) / align * align, hlen = total - prefix;
    unsigned char *b = calloc(1, total + ndata + 1);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = 0;
    for (size_t i = 0; i < prefix - 8; i++)
        b[8 + i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + prefix, dict, dlen);
    memset(b + prefix + dlen, ' ', total - 1 - prefix - dlen);
    b[total - 1] = '\n';
    if (data)
        memcpy(b + total, data, ndata);
    tt_put_file(path, name, b, total + ndata);
    free(b);
    return path;
}

static const char *npy_file(char path[static 256], const char *name, const char *dict,
                            const void *data, size_t ndata) {
    return npy_file_aligned(path, name, 1, dict, 64, data, ndata);
}

/* A version 1.0 file whose header is exactly text (no padding added). */
static const char *raw_header_file(char path[static 256], const char *name, const char *text,
                                   size_t ndata) {
    size_t hlen = strlen(text);
    unsigned char *b = calloc(1, 10 + hlen + ndata + 1);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)hlen;
    b[9] = (unsigned char)(hlen >> 8);
    memcpy(b + 10, text, hlen);
    tt_put_file(path, name, b, 10 + hlen + ndata);
    free(b);
    return path;
}

static const ct_npy_options never = {.mmap = CT_NPY_MMAP_NEVER};
static const ct_npy_options always = {.mmap = CT_NPY_MMAP_ALWAYS};

/* ------------------------------------------------------------ test data */

/* Fills t's memory (t contiguous) with bytes from seed: every bit pattern,
 * NaN payloads included, so that a round trip must be bit-exact. Bools get
 * 0 and 1. */
static ct_tensor *filled(int ndim, const int64_t *sizes, ct_dtype dtype, uint64_t seed) {
    ct_tensor *t = ct_empty(ndim, sizes, dtype);
    unsigned char *p = ct_data_ptr(t);
    size_t n = (size_t)ct_numel(t) * ct_dtype_size(dtype);
    uint64_t x = seed * 0x9E3779B97F4A7C15u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = dtype == CT_BOOL ? (unsigned char)(x & 1) : (unsigned char)x;
    }
    return t;
}

/* How many entries of the directory at path begin with prefix. */
static int count_entries(const char *path, const char *prefix) {
    DIR *d = opendir(path);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d)
        closedir(d);
    return n;
}

/* ---------------------------------------------------------- round trips */

TEST(every_dtype_and_layout_round_trips_bit_exact) {
    for (int dt = 0; dt < CT_NDTYPES; dt++) {
        if (dt == CT_BFLOAT16)
            continue;
        const uint64_t seed = 8 * (uint64_t)dt;
        ct_tensor *views[] = {
            filled(CT_SHAPE(3, 5), (ct_dtype)dt, seed + 1),
            filled(0, NULL, (ct_dtype)dt, seed + 2),
            filled(CT_SHAPE(7), (ct_dtype)dt, seed + 3),
            ct_empty(CT_SHAPE(2, 0, 3), (ct_dtype)dt),
            ct_transpose(filled(CT_SHAPE(4, 6), (ct_dtype)dt, seed + 4), 0, 1),
            ct_slice(filled(CT_SHAPE(5, 8), (ct_dtype)dt, seed + 5), 1, 1, 7, 2),
            ct_select(
                ct_permute(filled(CT_SHAPE(2, 3, 4), (ct_dtype)dt, seed + 6), (int[]){2, 0, 1}), 1,
                1),
            ct_expand(filled(CT_SHAPE(1, 5), (ct_dtype)dt, seed + 7), CT_SHAPE(3, 5)),
        };
        static const char *const kinds[] = {"contiguous", "0d",     "1d",     "empty",
                                            "transposed", "sliced", "select", "expanded"};
        for (size_t k = 0; k < sizeof views / sizeof *views; k++) {
            char name[64], path[256];
            snprintf(name, sizeof name, "%s.%s.npy", kinds[k], ct_dtype_name((ct_dtype)dt));
            tt_tmp_path(path, name);
            ASSERT_EQ(ct_npy_save(path, views[k]), 0);
            ASSERT_SAME(name, ct_npy_load(path, &never), views[k]);
            ASSERT_SAME(name, ct_npy_load(path, &always), views[k]);
            ASSERT_SAME(name, ct_npy_load(path, NULL), views[k]);
        }
    }
}

TEST(saved_header_is_what_numpy_writes) {
    static const struct {
        ct_dtype dtype;
        int ndim;
        int64_t sizes[3];
        const char *dict;
    } cases[] = {
        {CT_FLOAT32, 2, {2, 3}, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"},
        {CT_FLOAT64, 1, {3}, "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }"},
        {CT_FLOAT16, 0, {0}, "{'descr': '<f2', 'fortran_order': False, 'shape': (), }"},
        {CT_INT64, 3, {1, 0, 2}, "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 0, 2), }"},
        {CT_INT32, 1, {4}, "{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }"},
        {CT_UINT8, 1, {4}, "{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }"},
        {CT_BOOL, 1, {4}, "{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char path[256];
        tt_tmp_path(path, "header.npy");
        ct_tensor *t = ct_zeros(cases[c].ndim, cases[c].sizes, cases[c].dtype);
        ASSERT_EQ(ct_npy_save(path, t), 0);
        size_t n;
        unsigned char *b = tt_read_file(path, &n);
        ASSERT_TRUE(b);
        size_t hlen = (size_t)(b[8] | b[9] << 8), dlen = strlen(cases[c].dict);
        size_t data = (size_t)ct_numel(t) * ct_dtype_size(cases[c].dtype);
        bool ok = memcmp(b, "\x93NUMPY\x01\x00", 8) == 0 && (10 + hlen) % 64 == 0 &&
                  n == 10 + hlen + data && memcmp(b + 10, cases[c].dict, dlen) == 0 &&
                  b[10 + hlen - 1] == '\n';
        for (size_t i = 10 + dlen; ok && i < 10 + hlen - 1; i++)
            ok = b[i] == ' ';
        if (!ok)
            tt_fail(__FILE__, __LINE__, "header %zu: got \"%.*s\", want \"%s\" padded to 64", c,
                    (int)hlen, (const char *)b + 10, cases[c].dict);
        free(b);
        if (!ok)
            return;
    }
}

TEST(save_replaces_the_file_whole_and_leaves_no_temporary) {
    char path[256], dir[256];
    tt_tmp_path(dir, "atomic");
    mkdir(dir, 0755);
    tt_tmp_path(path, "atomic/x.npy");
    ASSERT_EQ(ct_npy_save(path, ct_ones(CT_SHAPE(1000), CT_FLOAT32)), 0);
    ct_tensor *two = ct_full(CT_SHAPE(3), 2.0, CT_FLOAT64);
    ASSERT_EQ(ct_npy_save(path, two), 0);
    ASSERT_SAME("replaced", ct_npy_load(path, NULL), two);
    ASSERT_EQ(count_entries(dir, "."), 2); /* "." and ".." */

    /* A directory in the way: the rename fails, the temporary goes. */
    char sub[256];
    tt_tmp_path(sub, "atomic/d.npy");
    mkdir(sub, 0755);
    ASSERT_RC(ct_npy_save(sub, two), CT_EIO, "cannot rename", "d.npy");
    ASSERT_EQ(count_entries(dir, "."), 2);
    ASSERT_SAME("untouched", ct_npy_load(path, NULL), two);
}

TEST(save_replaces_a_symlink_not_its_target) {
    char target[256], link[256];
    ct_tensor *a = ct_arange(0, 4, 1, CT_INT32), *b = ct_arange(10, 12, 1, CT_INT64);
    tt_tmp_path(target, "target.npy");
    ASSERT_EQ(ct_npy_save(target, a), 0);
    tt_tmp_path(link, "link.npy");
    unlink(link);
    ASSERT_EQ(symlink(target, link), 0);
    ASSERT_EQ(ct_npy_save(link, b), 0);
    struct stat st;
    ASSERT_EQ(lstat(link, &st), 0);
    ASSERT_TRUE(S_ISREG(st.st_mode));
    ASSERT_SAME("target", ct_npy_load(target, NULL), a);
    ASSERT_SAME("link", ct_npy_load(link, NULL), b);
}

TEST(save_and_load_at_a_directory_fd) {
    char dir[256];
    tt_tmp_path(dir, "at");
    mkdir(dir, 0755);
    mkdir(tt_tmp_path(dir, "at/sub"), 0755);
    int fd = open(tt_tmp_path(dir, "at"), O_RDONLY | O_DIRECTORY);
    ASSERT_TRUE(fd >= 0);
    ct_tensor *t = tt_rand(CT_SHAPE(3, 4), CT_FLOAT32, 5);
    ASSERT_EQ(ct_npy_save_at(fd, "sub/t.npy", t), 0);
    ASSERT_SAME("at", ct_npy_load_at(fd, "sub/t.npy", NULL), t);
    char path[256];
    ASSERT_SAME("path", ct_npy_load(tt_tmp_path(path, "at/sub/t.npy"), NULL), t);
    close(fd);
}

TEST(save_refuses_bad_arguments_and_bfloat16) {
    char path[256];
    tt_tmp_path(path, "bad.npy");
    ct_tensor *t = ct_ones(CT_SHAPE(2), CT_FLOAT32);
    ASSERT_RC(ct_npy_save(NULL, t), CT_EINVAL, "path is NULL");
    ASSERT_RC(ct_npy_save("", t), CT_EINVAL, "path is empty");
    ASSERT_RC(ct_npy_save(path, NULL), CT_EINVAL, "npy_save", "bad.npy");
    ASSERT_RC(ct_npy_save(tt_tmp_path(path, "dir/"), t), CT_EINVAL, "names a directory");
    ASSERT_RC(ct_npy_save(tt_tmp_path(path, "nowhere/x.npy"), t), CT_EIO,
              "cannot open the directory", "nowhere");
    ASSERT_RC(ct_npy_save(tt_tmp_path(path, "bf.npy"), ct_ones(CT_SHAPE(2), CT_BFLOAT16)),
              CT_ENOTSUP, "numpy has no bfloat16", "CT_FLOAT32");
    ASSERT_TRUE(access(path, F_OK) != 0);
}

/* ---------------------------------------------- files built from the spec */

TEST(fortran_order_loads_with_the_right_values) {
    /* [[1, 2, 3], [4, 5, 6]] in column-major order. */
    const double col[] = {1, 4, 2, 5, 3, 6};
    char path[256];
    npy_file(path, "f.npy", "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }", col,
             sizeof col);
    ct_tensor *want = ct_view(ct_arange(1, 7, 1, CT_FLOAT64), CT_SHAPE(2, 3));
    for (int m = 0; m < 3; m++) {
        ct_npy_options o = {.mmap = (ct_npy_mmap)m};
        ct_tensor *t = ct_npy_load(path, &o);
        ASSERT_SAME("fortran", t, want);
        ASSERT_TRUE(!ct_is_contiguous(t));
        ASSERT_EQ(ct_stride(t, 0), 1);
        ASSERT_EQ(ct_stride(t, 1), 2);
        o.contiguous = true;
        t = ct_npy_load(path, &o);
        ASSERT_SAME("fortran, contiguous", t, want);
        ASSERT_TRUE(ct_is_contiguous(t));
    }

    /* int32 (2, 3, 4): element [i][j][k] = 100 i + 10 j + k at i + 2 j + 6 k. */
    int32_t data[24];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++)
                data[i + 2 * j + 6 * k] = 100 * i + 10 * j + k;
    npy_file(path, "f3.npy", "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3, 4), }", data,
             sizeof data);
    ct_tensor *t = ct_npy_load(path, &always);
    ASSERT_TRUE(t);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            for (int k = 0; k < 4; k++)
                ASSERT_EQ(ct_get(t, (int64_t[]){i, j, k}), 100 * i + 10 * j + k);
    /* A Fortran-order view loaded back saves in C order. */
    ASSERT_EQ(ct_npy_save(tt_tmp_path(path, "f3c.npy"), t), 0);
    ASSERT_SAME("resaved", ct_npy_load(path, NULL), t);
}

/* n elements of esize bytes from src, each with its bytes reversed. */
static void reversed(unsigned char *dst, const void *src, size_t n, size_t esize) {
    for (size_t i = 0; i < n; i++)
        for (size_t b = 0; b < esize; b++)
            dst[i * esize + b] = ((const unsigned char *)src)[i * esize + esize - 1 - b];
}

TEST(big_endian_files_are_byte_swapped) {
    static const struct {
        ct_dtype dtype;
        const char *descr;
    } cases[] = {
        {CT_FLOAT64, ">f8"}, {CT_FLOAT32, ">f4"}, {CT_FLOAT16, ">f2"}, {CT_INT64, ">i8"},
        {CT_INT32, ">i4"},   {CT_UINT8, ">u1"},   {CT_BOOL, ">b1"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        ct_tensor *want = filled(CT_SHAPE(3, 4), cases[c].dtype, 40 + c);
        size_t es = ct_dtype_size(cases[c].dtype);
        unsigned char be[12 * 8];
        reversed(be, ct_data_ptr(want), 12, es);
        char dict[128], path[256];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (3, 4), }",
                 cases[c].descr);
        npy_file(path, "be.npy", dict, be, 12 * es);
        ASSERT_SAME(cases[c].descr, ct_npy_load(path, NULL), want);
        if (es > 1)
            ASSERT_FAILS(ct_npy_load(path, &always), CT_ENOTSUP, "CT_NPY_MMAP_ALWAYS",
                         "big-endian");
    }
    /* Big-endian and Fortran order together. */
    const float col[] = {1, 4, 2, 5, 3, 6};
    unsigned char be[sizeof col];
    reversed(be, col, 6, 4);
    char path[256];
    npy_file(path, "bef.npy", "{'descr': '>f4', 'fortran_order': True, 'shape': (2, 3), }", be,
             sizeof be);
    ASSERT_SAME("big-endian Fortran", ct_npy_load(path, NULL),
                ct_view(ct_arange(1, 7, 1, CT_FLOAT32), CT_SHAPE(2, 3)));
}

TEST(versions_2_and_3_and_header_variants_load) {
    const int32_t v[] = {7, -8, 9, 10};
    ct_tensor *want = ct_from_data(v, CT_SHAPE(4), CT_INT32);
    char path[256];
    const char *dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }";
    npy_file_aligned(path, "v2.npy", 2, dict, 64, v, sizeof v);
    ASSERT_SAME("2.0", ct_npy_load(path, NULL), want);
    npy_file_aligned(path, "v3.npy", 3, dict, 64, v, sizeof v);
    ASSERT_SAME("3.0", ct_npy_load(path, NULL), want);
    /* Old writers aligned to 16; keys in any order, double quotes, no
     * trailing comma, Python 2's long suffix, a native '=' byte order. */
    static const char *const variants[] = {
        "{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }",
        "{'shape': (4,), 'fortran_order': False, 'descr': '<i4'}",
        "{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (4, )}",
        "{'descr':'<i4','fortran_order':False,'shape':(4L,)}",
        "{ 'descr' : '=i4' , 'fortran_order' : False , 'shape' : ( 4 , ) , }",
    };
    for (size_t i = 0; i < sizeof variants / sizeof *variants; i++) {
        npy_file_aligned(path, "variant.npy", 1, variants[i], 16, v, sizeof v);
        ASSERT_SAME(variants[i], ct_npy_load(path, NULL), want);
    }
    /* A 0-d array and an empty one. */
    const double pi = 3.25;
    npy_file(path, "0d.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (), }", &pi, 8);
    ASSERT_SAME("0-d", ct_npy_load(path, NULL), ct_scalar(3.25, CT_FLOAT64));
    npy_file(path, "empty.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 5), }", NULL,
             0);
    ASSERT_SAME("empty", ct_npy_load(path, &always), ct_zeros(CT_SHAPE(0, 5), CT_FLOAT64));
}

TEST(bfloat16_reads_from_ml_dtypes_void_only_when_asked) {
    ct_tensor *want = filled(CT_SHAPE(5), CT_BFLOAT16, 3);
    char path[256];
    npy_file(path, "bf.npy", "{'descr': '<V2', 'fortran_order': False, 'shape': (5,), }",
             ct_data_ptr(want), 10);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ENOTSUP, "'<V2'", "bfloat16_from_v2");
    ct_npy_options o = {.bfloat16_from_v2 = true};
    ASSERT_SAME("bf16", ct_npy_load(path, &o), want);
    npy_file(path, "v4.npy", "{'descr': '|V4', 'fortran_order': False, 'shape': (5,), }", NULL, 20);
    ASSERT_FAILS(ct_npy_load(path, &o), CT_ENOTSUP, "'|V4'", "void");
}

/* -------------------------------------------------------------- mmap */

TEST(large_aligned_files_are_mapped_privately) {
    const int64_t n = CT_NPY_MMAP_MIN_BYTES / 4 + 1000;
    ct_tensor *want = tt_rand(CT_SHAPE(n), CT_FLOAT32, 11);
    char path[256];
    tt_tmp_path(path, "big.npy");
    ASSERT_EQ(ct_npy_save(path, want), 0);
    int64_t before = ct_memory_allocated(CT_DEVICE_CPU);
    ct_tensor *mapped = ct_npy_load(path, NULL);
    /* Mapped memory is not ct's: the counter does not see it. */
    ASSERT_TRUE(ct_memory_allocated(CT_DEVICE_CPU) - before < n * 4);
    ASSERT_SAME("mapped", mapped, want);
    ct_tensor *read = ct_npy_load(path, &never);
    ASSERT_TRUE(ct_memory_allocated(CT_DEVICE_CPU) - before >= n * 4);
    ASSERT_SAME("read", read, want);
    /* Writes go to memory, not to the file. */
    double last = ct_get(want, (int64_t[]){n - 1});
    ASSERT_TRUE(ct_add_scalar_(mapped, 1.0));
    ASSERT_NEAR(ct_get(mapped, (int64_t[]){n - 1}), last + 1, 1e-6);
    ASSERT_SAME("file unchanged", ct_npy_load(path, &never), want);
}

TEST(misaligned_data_is_read_not_mapped) {
    /* A 71-byte header: the data starts at byte 81, not a multiple of 4. */
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
    char text[128], path[256];
    snprintf(text, sizeof text, "%-70s\n", dict);
    const float v[] = {1.5f, -2, 3};
    size_t hlen = strlen(text);
    unsigned char b[256];
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)hlen;
    b[9] = 0;
    memcpy(b + 10, text, hlen);
    memcpy(b + 10 + hlen, v, sizeof v);
    tt_put_file(path, "odd.npy", b, 10 + hlen + sizeof v);
    ASSERT_SAME("read", ct_npy_load(path, NULL), ct_from_data(v, CT_SHAPE(3), CT_FLOAT32));
    ASSERT_FAILS(ct_npy_load(path, &always), CT_ENOTSUP, "not a multiple of the element size");
}

/* --------------------------------------------------------- bad files */

#define F4_1D(shape) "{'descr': '<f4', 'fortran_order': False, 'shape': " shape ", }"

TEST(bad_magic_and_versions_are_refused) {
    char path[256];
    tt_put_file(path, "magic.npy", "\x93NUMPZ\x01\x00\x10\x00", 10);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "magic.npy", "not an .npy file",
                 "\\x93NUMPY", "93 4e 55 4d 50 5a");
    tt_put_file(path, "empty.npy", "", 0);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "begins with bytes []");
    tt_put_file(path, "short.npy", "\x93NUMPY\x01", 7);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "inside the version");
    tt_put_file(path, "prefix.npy", "\x93NUMPY\x02\x00\x10\x00", 10);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "a version 2.0 file begins with 12");

    static const struct {
        unsigned char major, minor;
        const char *says;
    } bad[] = {{4, 0, "4.0"}, {1, 1, "1.1"}, {0, 0, "0.0"}, {2, 5, "2.5"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        npy_file(path, "ver.npy", F4_1D("(1,)"), NULL, 4);
        unsigned char ver[2] = {bad[i].major, bad[i].minor};
        FILE *f = fopen(path, "r+b");
        fseek(f, 6, SEEK_SET);
        fwrite(ver, 1, 2, f);
        fclose(f);
        ASSERT_FAILS(ct_npy_load(path, NULL), CT_EVERSION, bad[i].says, "1.0, 2.0 and 3.0");
    }
    npy_file(path, "ver4.npy", F4_1D("(1,)"), NULL, 4);
    FILE *f = fopen(path, "r+b");
    fseek(f, 6, SEEK_SET);
    fputc(4, f);
    fclose(f);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_EVERSION, "newer than this reader");
}

TEST(header_length_is_bounded_by_the_file_and_the_limit) {
    char path[256];
    unsigned char b[100] = "\x93NUMPY\x01\x00";
    b[8] = 0xf4; /* 500 */
    b[9] = 0x01;
    tt_put_file(path, "past.npy", b, sizeof b);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "header length 500 runs past the end",
                 "100 bytes");

    /* 20000 bytes of header in a version 2.0 file that holds them. */
    size_t n = 12 + 20000;
    unsigned char *big = malloc(n);
    memcpy(big, "\x93NUMPY\x02\x00", 8);
    const uint32_t hlen = 20000;
    for (int i = 0; i < 4; i++)
        big[8 + i] = (unsigned char)(hlen >> (8 * i));
    const char *dict = F4_1D("(0,)");
    memcpy(big + 12, dict, strlen(dict));
    memset(big + 12 + strlen(dict), ' ', 20000 - strlen(dict) - 1);
    big[n - 1] = '\n';
    tt_put_file(path, "long.npy", big, n);
    free(big);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "20000 bytes", "limit of 10000");
}

TEST(malformed_headers_are_refused_with_where_and_why) {
    static const struct {
        const char *dict;
        const char *says[2];
    } cases[] = {
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)", {"the dict is not closed"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,", {"'shape' tuple is not closed"}},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (1,), }",
         {"'<f4, ' is not a numpy type string"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x",
         {"a key is an unterminated"}},
        {"{'descr': '<f4', 'fortran_order': False 'shape': (1,), }",
         {"expected ',' or '}' after the value of 'fortran_order'"}},
        {"'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", {"expected the dict's '{'"}},
        {"{'descr': '<f4', 'shape': (1,), }", {"key 'fortran_order' is missing"}},
        {"{'fortran_order': False, 'shape': (1,), }", {"key 'descr' is missing"}},
        {"{'descr': '<f4', 'fortran_order': False, }", {"key 'shape' is missing"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}",
         {"unknown key 'extra'", "exactly 'descr'"}},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,)}",
         {"key 'descr' appears twice"}},
        {"{descr: '<f4', 'fortran_order': False, 'shape': (1,)}", {"expected a key as a quoted"}},
        {"{'descr' '<f4', 'fortran_order': False, 'shape': (1,)}", {"expected ':' after key"}},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}", {"True or False"}},
        {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': (1,)}", {"True or False"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", {"must be a tuple"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1)}",
         {"the integer 1", "a 1-tuple is written (1,)"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 3)}",
         {"shape entry 0 is negative"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, -1)}",
         {"shape entry 1 is negative"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (03,)}", {"leading zero"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1.5,)}", {"expected ',' or ')'"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2x,)}", {"not a non-negative"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", {"not a non-negative"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
         {"over 2^63 - 1"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", {"byte 0x78 after the dict"}},
        {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,)}", {"escape"}},
        {"{'descr': 'f4\x01', 'fortran_order': False, 'shape': (1,)}", {"byte 0x01"}},
        {"{'descr': 'hello', 'fortran_order': False, 'shape': (1,)}",
         {"'hello' is not a numpy type string"}},
        {"{'descr': '<f3', 'fortran_order': False, 'shape': (1,)}", {"'<f3' is not a numpy type"}},
        {"{'descr': '<f04', 'fortran_order': False, 'shape': (1,)}", {"not a numpy type"}},
        {"{'descr': '|f4', 'fortran_order': False, 'shape': (1,)}", {"byte order '|'"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char path[256];
        npy_file(path, "bad.npy", cases[c].dict, NULL, 4);
        ct_errclear();
        if (ct_npy_load(path, NULL) || ct_errcode() != CT_ECORRUPT) {
            tt_fail(__FILE__, __LINE__, "case %zu (%s): %s: %s", c, cases[c].dict,
                    ct_errname(ct_errcode()), ct_errmsg());
            return;
        }
        for (int s = 0; s < 2 && cases[c].says[s]; s++)
            if (!strstr(ct_errmsg(), cases[c].says[s])) {
                tt_fail(__FILE__, __LINE__, "case %zu (%s): \"%s\" does not say \"%s\"", c,
                        cases[c].dict, ct_errmsg(), cases[c].says[s]);
                return;
            }
        ASSERT_STR_CONTAINS(ct_errmsg(), "bad.npy");
    }
    /* The padding: spaces, then the final newline. */
    char path[256];
    raw_header_file(path, "nonl.npy", F4_1D("(1,)") "     ", 4);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "does not end with '\\n'");
    raw_header_file(path, "tab.npy", F4_1D("(1,)") "  \t  \n", 4);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "byte 0x09 after the dict");
    raw_header_file(path, "nul.npy", F4_1D("(1,)") "\n\n", 4);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "byte 0x0a after the dict");
    raw_header_file(path, "none.npy", "", 4);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "does not end with '\\n'");
    raw_header_file(path, "blank.npy", "   \n", 4);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "expected the dict's '{'");
}

TEST(shapes_that_overflow_or_exceed_ct_are_refused) {
    char path[256];
    npy_file(path, "ovf.npy", F4_1D("(1099511627776, 1099511627776)"), NULL, 0);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "more than 2^63 bytes",
                 "[1099511627776, 1099511627776]");
    npy_file(path, "ovf8.npy", F4_1D("(4611686018427387904,)"), NULL, 0);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "more than 2^63 bytes");
    /* No elements, but strides ct could not index. */
    npy_file(path, "zero.npy", F4_1D("(0, 4611686018427387904, 4611686018427387904)"), NULL, 0);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "a shape ct cannot hold");
    npy_file(path, "nine.npy", F4_1D("(1, 1, 1, 1, 1, 1, 1, 1, 1)"), NULL, 4);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ENOTSUP, "more than 8 dims");
    npy_file(path, "eight.npy", F4_1D("(1, 1, 1, 1, 1, 1, 1, 2)"), NULL, 8);
    ct_tensor *t = ct_npy_load(path, NULL);
    ASSERT_TRUE(t);
    ASSERT_EQ(ct_ndim(t), 8);
}

TEST(data_must_be_exactly_what_the_header_declares) {
    char path[256];
    npy_file(path, "trunc.npy", F4_1D("(2, 3)"), NULL, 23);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "trunc.npy", "truncated", "needs 152",
                 "128 header + 24 data");
    npy_file(path, "trail.npy", F4_1D("(2, 3)"), NULL, 25);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "1 bytes follow the 152", "trailing");
    npy_file(path, "none.npy", F4_1D("(2, 3)"), NULL, 0);
    ASSERT_FAILS(ct_npy_load(path, &always), CT_ECORRUPT, "truncated");
    const unsigned char bools[] = {0, 1, 2, 1};
    npy_file(path, "bool.npy", "{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }", bools,
             4);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_ECORRUPT, "bool element 2 is byte 0x02");
    ASSERT_FAILS(ct_npy_load(path, &always), CT_ECORRUPT, "bool element 2 is byte 0x02");
}

TEST(unsupported_descrs_are_named) {
    static const struct {
        const char *descr;
        const char *says[2];
    } cases[] = {
        {"'|O'", {"'|O'", "never unpickles"}},
        {"'<i2'", {"'<i2' (numpy int16) has no ct dtype", "ct reads"}},
        {"'|i1'", {"'|i1' (numpy int8)"}},
        {"'<u8'", {"'<u8' (numpy uint64)"}},
        {"'<c16'", {"'<c16' (numpy complex128)"}},
        {"'<f16'", {"'<f16' (numpy longdouble)"}},
        {"'<U5'", {"'<U5' is a string type"}},
        {"'|S3'", {"'|S3' is a string type"}},
        {"'<M8[ns]'", {"'<M8[ns]' is a datetime type"}},
        {"[('x', '<f4'), ('y', '<i4')]", {"structured dtype", "list"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char dict[160], path[256];
        snprintf(dict, sizeof dict, "{'descr': %s, 'fortran_order': False, 'shape': (1,), }",
                 cases[c].descr);
        npy_file(path, "descr.npy", dict, NULL, 16);
        ct_errclear();
        if (ct_npy_load(path, NULL) || ct_errcode() != CT_ENOTSUP) {
            tt_fail(__FILE__, __LINE__, "%s: %s: %s", cases[c].descr, ct_errname(ct_errcode()),
                    ct_errmsg());
            return;
        }
        for (int s = 0; s < 2 && cases[c].says[s]; s++)
            ASSERT_STR_CONTAINS(ct_errmsg(), cases[c].says[s]);
    }
}

TEST(only_regular_files_are_opened) {
    char path[256], target[256];
    ASSERT_FAILS(ct_npy_load(NULL, NULL), CT_EINVAL, "path is NULL");
    ASSERT_FAILS(ct_npy_load(tt_tmp_path(path, "missing.npy"), NULL), CT_EIO, "missing.npy",
                 "No such file");
    ct_tensor *t = ct_arange(0, 3, 1, CT_INT64);
    ASSERT_EQ(ct_npy_save(tt_tmp_path(target, "real.npy"), t), 0);
    tt_tmp_path(path, "sym.npy");
    unlink(path);
    ASSERT_EQ(symlink(target, path), 0);
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_EIO, "sym.npy", "symbolic link", "follow_symlinks");
    ct_npy_options follow = {.follow_symlinks = true};
    ASSERT_SAME("followed", ct_npy_load(path, &follow), t);

    tt_tmp_path(path, "fifo.npy");
    unlink(path);
    ASSERT_EQ(mkfifo(path, 0600), 0);
    double t0 = tt_now();
    ASSERT_FAILS(ct_npy_load(path, NULL), CT_EIO, "fifo.npy", "not a regular file (a FIFO)");
    ASSERT_TRUE(tt_now() - t0 < 5);
    ASSERT_FAILS(ct_npy_load(tt_tmp_path(path, ""), NULL), CT_EIO, "a directory");
    ct_npy_options bad = {.mmap = (ct_npy_mmap)7};
    ASSERT_FAILS(ct_npy_load(target, &bad), CT_EINVAL, "opts->mmap is 7");
}

#else /* TT_NPY_NUMPY */

/* ------------------------------------------------------------ numpy */

static const char *python(void) {
    static char found[512];
    if (found[0])
        return found;
    const char *candidates[] = {getenv("CT_TEST_PYTHON"), TT_VENV_PYTHON, "python3"};
    for (size_t i = 0; i < sizeof candidates / sizeof *candidates; i++) {
        if (!candidates[i] || !candidates[i][0])
            continue;
        char cmd[600];
        snprintf(cmd, sizeof cmd, "'%s' -c 'import numpy' >/dev/null 2>&1", candidates[i]);
        if (system(cmd) == 0) {
            snprintf(found, sizeof found, "%s", candidates[i]);
            return found;
        }
    }
    printf("no python3 with numpy (set CT_TEST_PYTHON): skipped\n");
    exit(77);
}

/* Runs the Python program src with the temporary directory as argv[1];
 * returns its exit status. */
static int run_python(const char *src) {
    char script[256], dir[256], cmd[1400];
    FILE *f = fopen(tt_tmp_path(script, "check.py"), "w");
    fputs(src, f);
    fclose(f);
    tt_tmp_path(dir, "");
    snprintf(cmd, sizeof cmd, "'%s' '%s' '%s'", python(), script, dir);
    return system(cmd);
}

/* Each array's values are arange(n) % 128 cast to its dtype (exact in every
 * one), in row-major order of its shape. */
static const struct {
    const char *name;
    ct_dtype dtype;
} np_cases[] = {
    {"f8", CT_FLOAT64}, {"f4", CT_FLOAT32}, {"f2", CT_FLOAT16}, {"i8", CT_INT64},
    {"i4", CT_INT32},   {"u1", CT_UINT8},   {"b1", CT_BOOL},
};

static ct_tensor *arange_as(ct_dtype dtype, int ndim, const int64_t *sizes) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= sizes[d];
    double *v = malloc(sizeof *v * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++)
        v[i] = (double)(i % 128);
    ct_tensor *t = ct_to_dtype(ct_from_data(v, ndim, sizes, CT_FLOAT64), dtype);
    free(v);
    return t;
}

TEST(numpy_files_load) {
    int rc = run_python(
        "import numpy as np, sys, os\n"
        "d = sys.argv[1]\n"
        "for t in ['f8', 'f4', 'f2', 'i8', 'i4', 'u1', 'b1']:\n"
        "    a = np.arange(24).astype(t).reshape(2, 3, 4)\n"
        "    np.save(os.path.join(d, 'np_c_' + t + '.npy'), a)\n"
        "    np.save(os.path.join(d, 'np_f_' + t + '.npy'), np.asfortranarray(a))\n"
        "    np.save(os.path.join(d, 'np_be_' + t + '.npy'), a.astype(a.dtype.newbyteorder('>')))\n"
        "    np.save(os.path.join(d, 'np_0d_' + t + '.npy'), np.array(5).astype(t))\n"
        "    np.save(os.path.join(d, 'np_1d_' + t + '.npy'), np.arange(3).astype(t))\n"
        "    np.save(os.path.join(d, 'np_big_' + t + '.npy'), (np.arange(1 << 20) % "
        "128).astype(t))\n"
        "np.save(os.path.join(d, 'np_empty.npy'), np.zeros((0, 3), 'f4'))\n"
        "np.lib.format.write_array(open(os.path.join(d, 'np_v2.npy'), 'wb'),\n"
        "                          np.arange(24).reshape(2, 3, 4), version=(2, 0))\n"
        "np.lib.format.write_array(open(os.path.join(d, 'np_v3.npy'), 'wb'),\n"
        "                          np.arange(24).reshape(2, 3, 4), version=(3, 0))\n"
        "np.save(os.path.join(d, 'np_i2.npy'), np.arange(3, dtype='i2'))\n"
        "np.save(os.path.join(d, 'np_obj.npy'), np.array([{}, 1], dtype=object))\n");
    ASSERT_EQ(rc, 0);
    char path[256], name[64];
    for (size_t c = 0; c < sizeof np_cases / sizeof *np_cases; c++) {
        ct_dtype dt = np_cases[c].dtype;
        ct_tensor *want = arange_as(dt, CT_SHAPE(2, 3, 4));
        static const char *const kinds[] = {"c", "f", "be"};
        for (int k = 0; k < 3; k++) {
            snprintf(name, sizeof name, "np_%s_%s.npy", kinds[k], np_cases[c].name);
            ASSERT_SAME(name, ct_npy_load(tt_tmp_path(path, name), NULL), want);
        }
        snprintf(name, sizeof name, "np_0d_%s.npy", np_cases[c].name);
        ASSERT_SAME(name, ct_npy_load(tt_tmp_path(path, name), NULL),
                    ct_to_dtype(ct_scalar(5, CT_FLOAT64), dt));
        snprintf(name, sizeof name, "np_1d_%s.npy", np_cases[c].name);
        ASSERT_SAME(name, ct_npy_load(tt_tmp_path(path, name), NULL), arange_as(dt, CT_SHAPE(3)));
        snprintf(name, sizeof name, "np_big_%s.npy", np_cases[c].name);
        ASSERT_SAME(name, ct_npy_load(tt_tmp_path(path, name), NULL),
                    arange_as(dt, CT_SHAPE(1 << 20)));
    }
    ASSERT_SAME("empty", ct_npy_load(tt_tmp_path(path, "np_empty.npy"), NULL),
                ct_zeros(CT_SHAPE(0, 3), CT_FLOAT32));
    ASSERT_SAME("v2", ct_npy_load(tt_tmp_path(path, "np_v2.npy"), NULL),
                arange_as(CT_INT64, CT_SHAPE(2, 3, 4)));
    ASSERT_SAME("v3", ct_npy_load(tt_tmp_path(path, "np_v3.npy"), NULL),
                arange_as(CT_INT64, CT_SHAPE(2, 3, 4)));
    ASSERT_FAILS(ct_npy_load(tt_tmp_path(path, "np_i2.npy"), NULL), CT_ENOTSUP, "'<i2'");
    ASSERT_FAILS(ct_npy_load(tt_tmp_path(path, "np_obj.npy"), NULL), CT_ENOTSUP, "'|O'");
}

TEST(ct_files_load_in_numpy) {
    char path[256], name[64];
    for (size_t c = 0; c < sizeof np_cases / sizeof *np_cases; c++) {
        ct_dtype dt = np_cases[c].dtype;
        ct_tensor *a = arange_as(dt, CT_SHAPE(2, 3, 4));
        snprintf(name, sizeof name, "ct_c_%s.npy", np_cases[c].name);
        ASSERT_EQ(ct_npy_save(tt_tmp_path(path, name), a), 0);
        snprintf(name, sizeof name, "ct_t_%s.npy", np_cases[c].name);
        ASSERT_EQ(ct_npy_save(tt_tmp_path(path, name), ct_permute(a, (int[]){2, 0, 1})), 0);
        snprintf(name, sizeof name, "ct_0d_%s.npy", np_cases[c].name);
        ASSERT_EQ(ct_npy_save(tt_tmp_path(path, name), ct_to_dtype(ct_scalar(5, CT_FLOAT64), dt)),
                  0);
        snprintf(name, sizeof name, "ct_1d_%s.npy", np_cases[c].name);
        ASSERT_EQ(ct_npy_save(tt_tmp_path(path, name), arange_as(dt, CT_SHAPE(3))), 0);
    }
    int rc = run_python(
        "import numpy as np, sys, os\n"
        "d = sys.argv[1]\n"
        "def check(name, want):\n"
        "    got = np.load(os.path.join(d, name), allow_pickle=False)\n"
        "    with open(os.path.join(d, name), 'rb') as f:\n"
        "        assert np.lib.format.read_magic(f) == (1, 0), name\n"
        "        np.lib.format.read_array_header_1_0(f)\n"
        "        assert f.tell() % 64 == 0, name\n"
        "    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, "
        "want):\n"
        "        print('mismatch', name, got.dtype, got.shape, want.dtype, want.shape)\n"
        "        sys.exit(1)\n"
        "for t in ['f8', 'f4', 'f2', 'i8', 'i4', 'u1', 'b1']:\n"
        "    a = np.arange(24).astype(t).reshape(2, 3, 4)\n"
        "    check('ct_c_' + t + '.npy', a)\n"
        "    check('ct_t_' + t + '.npy', a.transpose(2, 0, 1))\n"
        "    check('ct_0d_' + t + '.npy', np.array(5).astype(t))\n"
        "    check('ct_1d_' + t + '.npy', np.arange(3).astype(t))\n");
    ASSERT_EQ(rc, 0);
}

#endif
