/* NumPy .npy files: ct_npy_load and ct_npy_save.
 *
 * A file is (NEP 1; the numpy.lib.format reference):
 *   - the magic "\x93NUMPY" and two version bytes, major and minor;
 *   - the header length: uint16 little-endian in 1.0, uint32 in 2.0 and
 *     3.0;
 *   - the header, a Python dict literal such as
 *         {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 *     padded with spaces and ended by '\n' so that the data starts at a
 *     multiple of 64 bytes (16 in old writers); latin-1 in 1.0 and 2.0,
 *     UTF-8 in 3.0;
 *   - the elements, in C or Fortran order, and nothing after them.
 *
 * Files come from anywhere. numpy reads the header with ast.literal_eval;
 * this reader accepts the part of that grammar a .npy header needs: the
 * three keys, each once, as quoted strings; descr a quoted string naming a
 * plain numeric type; fortran_order True or False; shape a tuple of
 * non-negative integers. Every field is checked, and the file must hold
 * exactly the bytes the header declares, before any memory is taken for
 * the data. */
#include <ct/cuda.h>
#include <ct/npy.h>

#include "base_impl.h"
#include "file_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Elements are mapped, read and written in place, without conversion,
 * where the file's byte order is little-endian. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "ct_npy_load maps little-endian data in place");

#define MAGIC     "\x93NUMPY"
#define MAGIC_LEN 6
/* The writer pads the header so that the data starts at a multiple of this
 * (numpy's ARRAY_ALIGN): aligned for every element type, and for SIMD. */
#define ALIGN 64
/* Messages quote at most this much of the header around a fault. */
#define NEAR 24

/* Every numeric type numpy writes as a kind letter and a size; ct lacks
 * those with ct < 0. */
static const struct {
    char kind;
    int size;
    int ct;
    const char *numpy; /* numpy's name, for messages */
} npy_types[] = {
    {'f', 8, CT_FLOAT64, "float64"}, {'f', 4, CT_FLOAT32, "float32"},
    {'f', 2, CT_FLOAT16, "float16"}, {'i', 8, CT_INT64, "int64"},
    {'i', 4, CT_INT32, "int32"},     {'u', 1, CT_UINT8, "uint8"},
    {'b', 1, CT_BOOL, "bool"},       {'i', 1, -1, "int8"},
    {'i', 2, -1, "int16"},           {'u', 2, -1, "uint16"},
    {'u', 4, -1, "uint32"},          {'u', 8, -1, "uint64"},
    {'f', 12, -1, "longdouble"},     {'f', 16, -1, "longdouble"},
    {'c', 8, -1, "complex64"},       {'c', 16, -1, "complex128"},
    {'c', 24, -1, "clongdouble"},    {'c', 32, -1, "clongdouble"},
};
#define N_NPY_TYPES ((int)(sizeof npy_types / sizeof *npy_types))
#define CT_READS    "ct reads '<f8', '<f4', '<f2', '<i8', '<i4', '|u1' and '|b1', in either byte order"

/* The descr ct_npy_save writes for dtype, or NULL where numpy has none. */
static const char *descr_of(ct_dtype dtype) {
    switch (dtype) {
    case CT_FLOAT64: return "<f8";
    case CT_FLOAT32: return "<f4";
    case CT_FLOAT16: return "<f2";
    case CT_INT64: return "<i8";
    case CT_INT32: return "<i4";
    case CT_UINT8: return "|u1";
    case CT_BOOL: return "|b1";
    default: return NULL;
    }
}

/* ------------------------------------------------------------- the header */

typedef struct npy_header {
    int major;
    int64_t data_off; /* prefix + header: where the data starts */
    char descr[40];   /* as the file has it, for messages */
    ct_dtype dtype;
    bool swap; /* big-endian elements wider than a byte */
    bool fortran;
    int ndim;
    int64_t sizes[CT_MAX_DIMS];
    int64_t nbytes;                /* of the data */
    char desc[CT__SHAPE_STR + 48]; /* "'<f4' (2, 3), C order": what messages show */
} npy_header;

typedef struct parser {
    const char *what; /* the path, for messages */
    const unsigned char *s;
    size_t n, i;
    const ct_npy_options *opts;
    npy_header *h;
} parser;

/* Up to NEAR bytes of the header from at, printable, into buf (at least
 * 4 * NEAR + 1 bytes). */
static const char *near(const parser *p, size_t at, char *buf) {
    size_t k = 0;
    for (size_t i = at; i < p->n && i < at + NEAR; i++) {
        unsigned char c = p->s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"')
            buf[k++] = (char)c;
        else
            k += (size_t)sprintf(buf + k, "\\x%02x", c);
    }
    buf[k] = '\0';
    return buf;
}

/* CT_ECORRUPT for a header that breaks the grammar at byte at. */
static int bad_header(const parser *p, size_t at, const char *fmt, ...) CT_PRINTF(3, 4);
static int bad_header(const parser *p, size_t at, const char *fmt, ...) {
    char why[192], show[4 * NEAR + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (at >= p->n)
        return ct__err_set(CT_ECORRUPT, "npy: %s: bad header: %s at its end (byte %zu)", p->what,
                           why, at);
    return ct__err_set(CT_ECORRUPT, "npy: %s: bad header: %s at header byte %zu (near \"%s\")",
                       p->what, why, at, near(p, at, show));
}

static void skip_space(parser *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t'))
        p->i++;
}

static bool ident_char(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* A quoted string without escapes: *start and *len get its contents. */
static int parse_string(parser *p, const char *what, size_t *start, size_t *len) {
    if (p->i >= p->n || (p->s[p->i] != '\'' && p->s[p->i] != '"'))
        return bad_header(p, p->i, "expected %s as a quoted string", what);
    unsigned char quote = p->s[p->i];
    size_t open = p->i++;
    *start = p->i;
    for (; p->i < p->n && p->s[p->i] != quote; p->i++) {
        unsigned char c = p->s[p->i];
        if (c == '\\')
            return bad_header(p, p->i, "%s holds an escape, which no .npy header needs", what);
        if (c < 0x20 || c >= 0x7f)
            return bad_header(p, p->i, "%s holds byte 0x%02x (not printable ASCII)", what, c);
    }
    if (p->i >= p->n)
        return bad_header(p, open, "%s is an unterminated string", what);
    *len = p->i - *start;
    p->i++;
    return 0;
}

/* Maps descr (the string at s, n bytes) to a ct dtype. */
static int parse_descr(parser *p, size_t at, size_t n) {
    npy_header *h = p->h;
    const char *d = (const char *)p->s + at;
    snprintf(h->descr, sizeof h->descr, "%.*s", (int)(n < 32 ? n : 32), d);
    ct__errctx cx;
    ct__err_ctx_init(&cx, "npy: %s: descr '%s' ", p->what, h->descr);
    size_t k = 0;
    char order = '=';
    if (k < n && strchr("<>|=", d[k]))
        order = d[k++];
    char kind = k < n ? d[k++] : '\0';
    int size = 0, digits = 0;
    for (; k < n && d[k] >= '0' && d[k] <= '9' && digits < 3; k++, digits++)
        size = size * 10 + (d[k] - '0');
    CT_REQUIRE_CTX(&cx, kind != 'O', CT_ENOTSUP,
                   "holds Python objects, which numpy pickles; ct never unpickles (%s)", CT_READS);
    if (kind && strchr("SUaMmV", kind) && k < n && d[k] == '[')
        k = n; /* datetime units, "M8[ns]": refused below by kind */
    static const char not_a_type[] =
        "is not a numpy type string (a byte order, a kind letter and a size, such as '<f4')";
    CT_REQUIRE_CTX(&cx, kind && k >= n && digits > 0 && (digits == 1 || d[k - digits] != '0'),
                   CT_ECORRUPT, "%s", not_a_type);
    if (kind == 'V' && size == 2 && p->opts->bfloat16_from_v2 && order != '>') {
        h->dtype = CT_BFLOAT16;
        return 0;
    }
    CT_REQUIRE_CTX(
        &cx, kind != 'V', CT_ENOTSUP, "is a raw %d-byte void type, which ct does not read%s (%s)",
        size, size == 2 ? "; if it holds ml_dtypes bfloat16, set bfloat16_from_v2" : "", CT_READS);
    CT_REQUIRE_CTX(&cx, !strchr("SUaMm", kind), CT_ENOTSUP,
                   "is a %s type, which ct does not read (%s)",
                   kind == 'M' || kind == 'm' ? "datetime" : "string", CT_READS);
    int t = 0;
    while (t < N_NPY_TYPES && (npy_types[t].kind != kind || npy_types[t].size != size))
        t++;
    CT_REQUIRE_CTX(&cx, t < N_NPY_TYPES, CT_ECORRUPT, "%s", not_a_type);
    CT_REQUIRE_CTX(&cx, npy_types[t].ct >= 0, CT_ENOTSUP, "(numpy %s) has no ct dtype (%s)",
                   npy_types[t].numpy, CT_READS);
    CT_REQUIRE_CTX(&cx, order != '|' || size <= 1, CT_ECORRUPT,
                   "says byte order '|' (not applicable), but a %d-byte type has one ('<' or "
                   "'>')",
                   size);
    h->dtype = (ct_dtype)npy_types[t].ct;
    h->swap = order == '>' && size > 1;
    return 0;
}

static int parse_bool(parser *p, bool *v) {
    static const char *const words[] = {"False", "True"};
    for (int w = 0; w < 2; w++) {
        size_t len = strlen(words[w]);
        if (p->n - p->i >= len && memcmp(p->s + p->i, words[w], len) == 0 &&
            (p->i + len == p->n || !ident_char(p->s[p->i + len]))) {
            *v = w == 1;
            p->i += len;
            return 0;
        }
    }
    return bad_header(p, p->i, "'fortran_order' must be True or False");
}

/* A non-negative decimal integer, as Python writes it (no leading zeros;
 * the 'L' of Python 2's longs is allowed, as numpy allows it). */
static int parse_size(parser *p, int dim, int64_t *v) {
    size_t start = p->i;
    if (p->i < p->n && p->s[p->i] == '-')
        return bad_header(p, start, "shape entry %d is negative", dim);
    uint64_t x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        if (__builtin_mul_overflow(x, 10, &x) ||
            __builtin_add_overflow(x, (uint64_t)(p->s[p->i] - '0'), &x) || x > (uint64_t)INT64_MAX)
            return bad_header(p, start, "shape entry %d is over 2^63 - 1", dim);
        p->i++;
    }
    if (p->i == start)
        return bad_header(p, start, "shape entry %d is not a non-negative integer", dim);
    if (p->i - start > 1 && p->s[start] == '0')
        return bad_header(p, start, "shape entry %d has a leading zero (not a Python integer)",
                          dim);
    if (p->i < p->n && (p->s[p->i] == 'L' || p->s[p->i] == 'l'))
        p->i++;
    if (p->i < p->n && ident_char(p->s[p->i]))
        return bad_header(p, start, "shape entry %d is not a non-negative integer", dim);
    *v = (int64_t)x;
    return 0;
}

/* A tuple of sizes: "()", "(3,)", "(2, 3)", "(2, 3,)". */
static int parse_shape(parser *p) {
    npy_header *h = p->h;
    if (p->i >= p->n || p->s[p->i] != '(')
        return bad_header(p, p->i,
                          "'shape' must be a tuple of non-negative integers, such as (2, 3)");
    size_t open = p->i++;
    h->ndim = 0;
    bool comma = false;
    skip_space(p);
    while (p->i < p->n && p->s[p->i] != ')') {
        if (h->ndim == CT_MAX_DIMS)
            return ct__err_set(CT_ENOTSUP,
                               "npy: %s: the shape has more than %d dims; ct tensors have at most "
                               "%d",
                               p->what, CT_MAX_DIMS, CT_MAX_DIMS);
        int rc = parse_size(p, h->ndim, &h->sizes[h->ndim]);
        if (rc)
            return rc;
        h->ndim++;
        skip_space(p);
        comma = p->i < p->n && p->s[p->i] == ',';
        if (comma) {
            p->i++;
            skip_space(p);
        } else if (p->i < p->n && p->s[p->i] != ')') {
            return bad_header(p, p->i, "expected ',' or ')' in 'shape'");
        }
    }
    if (p->i >= p->n)
        return bad_header(p, open, "the 'shape' tuple is not closed");
    if (h->ndim == 1 && !comma)
        return bad_header(p, open,
                          "'shape' is (%lld), the integer %lld; a 1-tuple is written (%lld,)",
                          (long long)h->sizes[0], (long long)h->sizes[0], (long long)h->sizes[0]);
    p->i++;
    return 0;
}

enum { KEY_DESCR, KEY_FORTRAN, KEY_SHAPE, NKEYS };
static const char *const key_names[NKEYS] = {"descr", "fortran_order", "shape"};

static int parse_value(parser *p, int key) {
    if (key == KEY_FORTRAN)
        return parse_bool(p, &p->h->fortran);
    if (key == KEY_SHAPE)
        return parse_shape(p);
    if (p->i < p->n && (p->s[p->i] == '[' || p->s[p->i] == '{'))
        return ct__err_set(CT_ENOTSUP,
                           "npy: %s: descr is a %s: a structured dtype (named fields), which ct "
                           "does not read (%s)",
                           p->what, p->s[p->i] == '[' ? "list" : "dict", CT_READS);
    size_t at, len;
    int rc = parse_string(p, "'descr'", &at, &len);
    return rc ? rc : parse_descr(p, at, len);
}

/* The dict, then only spaces up to the final '\n'. */
static int parse_dict(parser *p) {
    bool seen[NKEYS] = {false};
    if (p->n == 0 || p->s[p->n - 1] != '\n')
        return bad_header(p, p->n, "the header does not end with '\\n'");
    p->n--; /* the dict and its padding end before it */
    skip_space(p);
    if (p->i >= p->n || p->s[p->i] != '{')
        return bad_header(p, p->i, "expected the dict's '{'");
    size_t open = p->i++;
    for (;;) {
        skip_space(p);
        if (p->i >= p->n)
            return bad_header(p, open, "the dict is not closed (no '}')");
        if (p->s[p->i] == '}')
            break;
        size_t at = p->i, kstart, klen;
        int rc = parse_string(p, "a key", &kstart, &klen);
        if (rc)
            return rc;
        int key = 0;
        while (key < NKEYS &&
               (strlen(key_names[key]) != klen || memcmp(key_names[key], p->s + kstart, klen) != 0))
            key++;
        if (key == NKEYS)
            return bad_header(p, at,
                              "unknown key '%.*s' (the dict has exactly 'descr', "
                              "'fortran_order' and 'shape')",
                              (int)(klen < 40 ? klen : 40), (const char *)p->s + kstart);
        if (seen[key])
            return bad_header(p, at, "key '%s' appears twice", key_names[key]);
        seen[key] = true;
        skip_space(p);
        if (p->i >= p->n || p->s[p->i] != ':')
            return bad_header(p, p->i, "expected ':' after key '%s'", key_names[key]);
        p->i++;
        skip_space(p);
        if ((rc = parse_value(p, key)) != 0)
            return rc;
        skip_space(p);
        if (p->i < p->n && p->s[p->i] == ',')
            p->i++;
        else if (p->i >= p->n)
            return bad_header(p, open, "the dict is not closed (no '}')");
        else if (p->s[p->i] != '}')
            return bad_header(p, p->i, "expected ',' or '}' after the value of '%s'",
                              key_names[key]);
    }
    for (int k = 0; k < NKEYS; k++)
        if (!seen[k])
            return bad_header(p, p->i,
                              "key '%s' is missing (the dict has exactly 'descr', "
                              "'fortran_order' and 'shape')",
                              key_names[k]);
    p->i++;
    for (; p->i < p->n; p->i++)
        if (p->s[p->i] != ' ')
            return bad_header(p, p->i,
                              "byte 0x%02x after the dict (only spaces and the final '\\n' pad "
                              "it)",
                              p->s[p->i]);
    return 0;
}

/* Sizes the data and describes the array for messages. */
static int size_data(const char *what, npy_header *h) {
    char shape[CT__SHAPE_STR];
    snprintf(h->desc, sizeof h->desc, "'%s' %s, %s order", h->descr,
             ct__tensor_shape_str(shape, h->ndim, h->sizes), h->fortran ? "Fortran" : "C");
    int64_t numel = 1;
    bool overflow = false;
    for (int d = 0; d < h->ndim; d++)
        overflow |= __builtin_mul_overflow(numel, h->sizes[d], &numel);
    overflow |= __builtin_mul_overflow(numel, (int64_t)ct__esize(h->dtype), &h->nbytes);
    if (overflow)
        return ct__err_set(CT_ECORRUPT, "npy: %s: the header's %s holds more than 2^63 bytes", what,
                           h->desc);
    /* A product that fits can still make strides ct cannot index (a zero
     * beside huge sizes). */
    if (ct__tensor_check_shape("npy", h->ndim, h->sizes, h->dtype))
        return ct__err_set(CT_ECORRUPT, "npy: %s: the header's %s is a shape ct cannot hold (%s)",
                           what, h->desc, ct_errmsg());
    return 0;
}

/* --------------------------------------------------------------- the file */

static int pread_all(int fd, void *buf, size_t len, int64_t off, const char *what) {
    int rc = ct__file_pread_all(fd, buf, len, off, what);
    return rc ? ct__err_set(rc, "npy: %s", ct_errmsg()) : 0;
}

/* Opens name for reading, refusing what is not a regular file; *size gets
 * its size. */
static int open_file(int dirfd, const char *name, bool follow, int64_t *size) {
    const ct__file_rules rules = {
        .refuse = CT_EIO,
        .follow = follow,
        .link_why = ", which ct_npy_load does not follow (load its target, or set follow_symlinks)",
    };
    int fd = ct__file_open(dirfd, name, name, &rules, size, NULL);
    return fd < 0 ? ct__err_set(fd, "npy: %s", ct_errmsg()) : fd;
}

static uint32_t le16(const unsigned char *b) { return (uint32_t)b[0] | (uint32_t)b[1] << 8; }
static uint32_t le32(const unsigned char *b) { return le16(b) | le16(b + 2) << 16; }

/* Reads and checks the prefix and the header of the file of size bytes. */
static int read_header(int fd, const char *what, int64_t size, const ct_npy_options *opts,
                       npy_header *h) {
    unsigned char pre[12] = {0};
    size_t have = size < 12 ? (size_t)size : 12;
    CT_TRY(pread_all(fd, pre, have, 0, what));
    ct__errctx cx;
    ct__err_ctx_init(&cx, "npy: %s: ", what);
    if (have < MAGIC_LEN || memcmp(pre, MAGIC, MAGIC_LEN) != 0) {
        char hex[3 * MAGIC_LEN + 1] = "";
        for (size_t i = 0; i < have && i < MAGIC_LEN; i++)
            sprintf(hex + 3 * i, "%02x ", pre[i]);
        hex[have ? 3 * (have < MAGIC_LEN ? have : MAGIC_LEN) - 1 : 0] = '\0';
        return ct__err_ctx_set(
            &cx, CT_ECORRUPT,
            "not an .npy file: it begins with bytes [%s], not the magic \\x93NUMPY "
            "(93 4e 55 4d 50 59)",
            hex);
    }
    CT_REQUIRE_CTX(&cx, have >= 8, CT_ECORRUPT, "the file ends after %zu bytes, inside the version",
                   have);
    h->major = pre[6];
    CT_REQUIRE_CTX(&cx, pre[6] >= 1 && pre[6] <= 3 && pre[7] == 0, CT_EVERSION,
                   "format version %d.%d; this reader knows 1.0, 2.0 and 3.0%s", pre[6], pre[7],
                   pre[6] > 3 ? " (the file is newer than this reader)" : "");
    size_t prefix = h->major == 1 ? 10 : 12;
    CT_REQUIRE_CTX(&cx, have >= prefix, CT_ECORRUPT,
                   "the file ends after %zu bytes; a version %d.0 file begins with %zu (magic, "
                   "version, header length)",
                   have, h->major, prefix);
    uint32_t hlen = h->major == 1 ? le16(pre + 8) : le32(pre + 8);
    CT_REQUIRE_CTX(&cx, hlen <= CT_NPY_MAX_HEADER, CT_ECORRUPT,
                   "the header is %u bytes, over the limit of %d (numpy's own default; a .npy "
                   "header ct can read needs a few hundred)",
                   hlen, CT_NPY_MAX_HEADER);
    h->data_off = (int64_t)prefix + hlen;
    CT_REQUIRE_CTX(&cx, h->data_off <= size, CT_ECORRUPT,
                   "the header length %u runs past the end of the file (%lld bytes, %lld after "
                   "the %zu-byte prefix)",
                   hlen, (long long)size, (long long)size - (long long)prefix, prefix);
    unsigned char text[CT_NPY_MAX_HEADER];
    CT_TRY(pread_all(fd, text, hlen, (int64_t)prefix, what));
    parser p = {.what = what, .s = text, .n = hlen, .opts = opts, .h = h};
    CT_TRY(parse_dict(&p));
    CT_TRY(size_data(what, h));
    int64_t want = h->data_off + h->nbytes;
    CT_REQUIRE_CTX(&cx, size >= want, CT_ECORRUPT,
                   "the file is %lld bytes; the header's %s needs %lld (%lld header + %lld "
                   "data): truncated",
                   (long long)size, h->desc, (long long)want, (long long)h->data_off,
                   (long long)h->nbytes);
    CT_REQUIRE_CTX(&cx, size <= want, CT_ECORRUPT,
                   "%lld bytes follow the %lld that the header's %s describes (trailing bytes are "
                   "refused: the header or the file is wrong)",
                   (long long)(size - want), (long long)want, h->desc);
    return 0;
}

/* ------------------------------------------------------------ the data */

static void byteswap(void *data, int64_t n, size_t esize) {
    unsigned char *p = data;
    for (int64_t i = 0; i < n; i++, p += esize) {
        if (esize == 2) {
            uint16_t v;
            memcpy(&v, p, 2);
            v = __builtin_bswap16(v);
            memcpy(p, &v, 2);
        } else if (esize == 4) {
            uint32_t v;
            memcpy(&v, p, 4);
            v = __builtin_bswap32(v);
            memcpy(p, &v, 4);
        } else {
            uint64_t v;
            memcpy(&v, p, 8);
            v = __builtin_bswap64(v);
            memcpy(p, &v, 8);
        }
    }
}

/* ct's bools are bytes 0 and 1; anything else would break its kernels. */
static int check_bools(const char *what, const npy_header *h, const unsigned char *p) {
    for (int64_t i = 0; i < h->nbytes; i++)
        if (p[i] > 1)
            return ct__err_set(CT_ECORRUPT,
                               "npy: %s: bool element %lld is byte 0x%02x; numpy's bools are 0 or "
                               "1",
                               what, (long long)i, p[i]);
    return 0;
}

/* The mapping is released by page: data sits less than a page past its
 * start, so rounding data down finds it; ctx holds its length. */
static void unmap_data(void *data, void *ctx) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    munmap((void *)((uintptr_t)data & ~(page - 1)), (size_t)(uintptr_t)ctx);
}

/* Why the data cannot be mapped, or NULL when it can. */
static const char *unmappable(const npy_header *h) {
    if (h->swap)
        return "its elements are big-endian and must be byte-swapped into memory";
    if (h->data_off % (int64_t)ct__esize(h->dtype) != 0)
        return "it starts at an offset that is not a multiple of the element size";
    return NULL;
}

static ct_storage *map_data(int fd, const char *what, const npy_header *h) {
    int64_t page = (int64_t)sysconf(_SC_PAGESIZE);
    int64_t start = h->data_off / page * page;
    size_t lead = (size_t)(h->data_off - start), len = lead + (size_t)h->nbytes;
    /* Private and writable: ct's in-place ops may write to the tensor, and
     * must not write to the file. NORESERVE: no swap is set aside for pages
     * that are only read. */
    void *base =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd, (off_t)start);
    if (base == MAP_FAILED) {
        ct__err_set(errno == ENOMEM ? CT_ENOMEM : CT_EIO, "npy: %s: cannot map %lld bytes: %s",
                    what, (long long)h->nbytes, strerror(errno));
        return NULL;
    }
    ct_storage *s = ct_storage_from_blob((char *)base + lead, (size_t)h->nbytes, CT_DEVICE_CPU,
                                         unmap_data, (void *)(uintptr_t)len);
    if (!s)
        munmap(base, len);
    return s;
}

static ct_storage *read_data(int fd, const char *what, const npy_header *h) {
    ct_storage *s = ct_storage_new((size_t)h->nbytes, CT_DEVICE_CPU);
    if (!s) {
        ct__err_set(ct_errcode(), "npy: %s: the header's %s: %s", what, h->desc, ct_errmsg());
        return NULL;
    }
    if (pread_all(fd, ct_storage_data(s), (size_t)h->nbytes, h->data_off, what) != 0) {
        ct_storage_free(s);
        return NULL;
    }
    if (h->swap)
        byteswap(ct_storage_data(s), h->nbytes / (int64_t)ct__esize(h->dtype), ct__esize(h->dtype));
    return s;
}

static int append(void *ctx, const void *p, size_t n) {
    char **dst = ctx;
    memcpy(*dst, p, n);
    *dst += n;
    return 0;
}

/* A row-major copy of the Fortran-order view v, bit for bit (ct_contiguous
 * would quiet 16-bit NaN payloads). */
static ct_tensor *row_major(const char *what, ct_tensor *v) {
    ct_tensor *t = ct_empty(ct_ndim(v), ct_sizes(v), ct_tensor_dtype(v));
    if (!t) {
        ct__err_set(ct_errcode(), "npy: %s: %s", what, ct_errmsg());
        return NULL;
    }
    char *dst = ct_data_ptr(t);
    ct__tensor_for_each_run(v, append, &dst);
    return t;
}

static ct_tensor *load_data(int fd, const char *what, const npy_header *h,
                            const ct_npy_options *o) {
    const char *why = unmappable(h);
    if (o->mmap == CT_NPY_MMAP_ALWAYS && why && h->nbytes > 0) {
        ct__err_set(CT_ENOTSUP,
                    "npy: %s: mmap = CT_NPY_MMAP_ALWAYS, but the header's %s cannot be mapped: %s "
                    "(CT_NPY_MMAP_AUTO reads it instead)",
                    what, h->desc, why);
        return NULL;
    }
    bool map = h->nbytes > 0 && !why &&
               (o->mmap == CT_NPY_MMAP_ALWAYS ||
                (o->mmap == CT_NPY_MMAP_AUTO && h->nbytes >= CT_NPY_MMAP_MIN_BYTES));
    ct_storage *s = map ? map_data(fd, what, h) : read_data(fd, what, h);
    if (!s)
        return NULL;
    if (h->dtype == CT_BOOL && check_bools(what, h, ct_storage_data(s)) != 0) {
        ct_storage_free(s);
        return NULL;
    }
    int64_t strides[CT_MAX_DIMS], step = 1;
    for (int d = 0; d < h->ndim; d++) {
        strides[d] = step;
        step *= h->sizes[d] ? h->sizes[d] : 1;
    }
    ct_tensor *t =
        ct_tensor_from_storage(s, 0, h->ndim, h->sizes, h->fortran ? strides : NULL, h->dtype);
    ct_storage_free(s);
    if (!t)
        ct__err_set(ct_errcode(), "npy: %s: %s", what, ct_errmsg());
    else if (h->fortran && o->contiguous && !ct_is_contiguous(t))
        t = row_major(what, t);
    return t;
}

ct_tensor *ct_npy_load_at(int dirfd, const char *name, const ct_npy_options *opts) {
    if (!name) {
        ct__err_set(CT_EINVAL, "npy_load: path is NULL");
        return NULL;
    }
    ct_npy_options o = opts ? *opts : (ct_npy_options){0};
    if ((unsigned)o.mmap > CT_NPY_MMAP_ALWAYS) {
        ct__err_set(CT_EINVAL, "npy: %s: opts->mmap is %d, not a ct_npy_mmap", name, (int)o.mmap);
        return NULL;
    }
    int64_t size = 0;
    int fd = open_file(dirfd, name, o.follow_symlinks, &size);
    if (fd < 0)
        return NULL;
    npy_header h = {0};
    ct_tensor *out = NULL;
    ct_scope_begin();
    if (read_header(fd, name, size, &o, &h) == 0) {
        ct_tensor *t = load_data(fd, name, &h, &o);
        if (t)
            out = ct_keep(t);
    }
    ct_scope_end();
    close(fd);
    return out;
}

ct_tensor *ct_npy_load(const char *path, const ct_npy_options *opts) {
    return ct_npy_load_at(AT_FDCWD, path, opts);
}

/* ------------------------------------------------------------- saving */

/* The header numpy would write for (descr, shape): the dict, spaces, '\n',
 * so that the 10-byte prefix and the header end at a multiple of ALIGN.
 * ct's at most CT_MAX_DIMS sizes keep it far below the 65535 bytes of
 * version 1.0, which is therefore the only version written. */
#define HEADER_CAP 512
_Static_assert(60 + CT_MAX_DIMS * 22 + ALIGN + 10 <= HEADER_CAP, "HEADER_CAP too small");
_Static_assert(HEADER_CAP < 65535, "the header must fit version 1.0's 16-bit length");

static size_t make_header(char *buf, const char *descr, int ndim, const int64_t *sizes) {
    char *p = buf + 10;
    p += sprintf(p, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int d = 0; d < ndim; d++)
        p += sprintf(p, "%s%lld", d ? ", " : "", (long long)sizes[d]);
    p += sprintf(p, "%s), }", ndim == 1 ? "," : "");
    size_t total = ((size_t)(p - buf) + 1 + ALIGN - 1) / ALIGN * ALIGN;
    memset(p, ' ', total - 1 - (size_t)(p - buf));
    buf[total - 1] = '\n';
    size_t hlen = total - 10;
    memcpy(buf, MAGIC, MAGIC_LEN);
    buf[6] = 1;
    buf[7] = 0;
    buf[8] = (char)(hlen & 0xff);
    buf[9] = (char)(hlen >> 8);
    return total;
}

/* Creates a new file beside base in dir, for the data to go to before it
 * is renamed over base: a fresh name each time, so that saves of one path
 * from several threads or processes never share one. */
static int create_temp(int dir, const char *what, const char *base, char *tmp, size_t cap) {
    static atomic_uint seq;
    for (int tries = 0;; tries++) {
        snprintf(tmp, cap, ".%.200s.%ld.%u.tmp", base, (long)getpid(), atomic_fetch_add(&seq, 1));
        int fd = openat(dir, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST || tries == 100) {
            if (fd < 0)
                ct__err_set(CT_EIO, "npy_save: %s: cannot create the file %s beside it: %s", what,
                            tmp, strerror(errno));
            return fd;
        }
    }
}

static int write_file(int dir, const char *what, const char *base, const ct_tensor *t,
                      const char *header, size_t hlen) {
    char tmp[NAME_MAX + 1], shown[512];
    snprintf(shown, sizeof shown, "npy_save: %s", what);
    int fd = create_temp(dir, what, base, tmp, sizeof tmp);
    if (fd < 0)
        return ct_errcode();
    ct__writer w = {.shown = shown, .fd = fd};
    int rc = ct__file_writer_put(&w, header, hlen);
    if (rc == 0)
        rc = ct__tensor_for_each_run(t, ct__file_writer_put, &w);
    if (rc == 0)
        rc = ct__file_writer_flush(&w);
    ct__file_writer_free(&w);
    return ct__file_commit(dir, fd, tmp, base, rc, shown);
}

int ct_npy_save_at(int dirfd, const char *name, const ct_tensor *t) {
    if (!name || !name[0])
        return ct__err_set(CT_EINVAL, "npy_save: path is %s", name ? "empty" : "NULL");
    ct_tensor *src = (ct_tensor *)t;
    if (CT__CHECK_ANY("npy_save", src))
        return ct__err_set(ct_errcode(), "npy_save: %s: %s", name, ct_errmsg());
    const char *dtype = ct_dtype_name(ct_tensor_dtype(t)), *descr = descr_of(ct_tensor_dtype(t));
    if (!descr)
        return ct__err_set(CT_ENOTSUP,
                           "npy_save: %s: numpy has no %s dtype; save ct_to_dtype(t, CT_FLOAT32), "
                           "which holds every %s value exactly",
                           name, dtype, dtype);
    const char *slash = strrchr(name, '/');
    const char *base = slash ? slash + 1 : name;
    if (!base[0])
        return ct__err_set(CT_EINVAL, "npy_save: %s: the path names a directory, not a file", name);
    char *dirname = slash ? strndup(name, slash == name ? 1 : (size_t)(slash - name)) : NULL;
    if (slash && !dirname)
        return ct__err_set(CT_ENOMEM, "npy_save: %s: out of memory", name);
    int dir = openat(dirfd, dirname ? dirname : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;
    if (dir < 0)
        rc = ct__err_set(CT_EIO, "npy_save: %s: cannot open the directory %s: %s", name,
                         dirname ? dirname : ".", strerror(errno));
    free(dirname);
    if (rc)
        return rc;
    ct_tensor *host = NULL;
    if (!ct__is_host(ct_tensor_device(t)) && !(host = ct__tensor_own(ct_to(src, CT_DEVICE_CPU))))
        rc = ct__err_set(ct_errcode(), "npy_save: %s: copying the tensor to the host: %s", name,
                         ct_errmsg());
    if (rc == 0) {
        char header[HEADER_CAP];
        size_t hlen = make_header(header, descr, ct_ndim(t), ct_sizes(t));
        rc = write_file(dir, name, base, host ? host : t, header, hlen);
    }
    ct_tensor_free(host);
    close(dir);
    return rc;
}

int ct_npy_save(const char *path, const ct_tensor *t) { return ct_npy_save_at(AT_FDCWD, path, t); }
