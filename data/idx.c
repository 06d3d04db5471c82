/* IDX files (the MNIST format) and the Fashion-MNIST loader.
 *
 * An IDX file is a 4-byte magic (two zero bytes, a type byte, a dim count),
 * one big-endian uint32 size per dim, then the elements in big-endian
 * row-major order. Files come from anywhere, so every header field is
 * checked before it sizes an allocation: the data the header declares must
 * fit in the file (exactly, for a plain file; within deflate's maximum
 * expansion, for a gzip file), and the tensor it loads into, whose elements
 * may be wider than the file's, must fit in the memory limit, before any
 * memory is taken for it. */
#include <ct/data.h>

#include "base_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

/* Deflate codes at most 258 bytes per 2 bits of input, so no gzip file
 * decompresses to more than 1032 times its size (zlib's FAQ, "technical
 * details"). */
#define GZIP_MAX_RATIO 1032
/* The variable that sets the most bytes one loaded tensor may take. Unset,
 * the limit is GZIP_MAX_RATIO times the file's size: no file makes the
 * reader hold more than the most its own data could inflate to, whatever
 * the element type widens to. */
#define MAX_BYTES_VAR "CT_IDX_MAX_BYTES"
/* Bytes per read; a multiple of every element size. */
#define CHUNK ((size_t)256 * 1024)

typedef struct idx_type {
    uint8_t code;
    const char *name;
    int file_size; /* bytes per element in the file */
    ct_dtype dtype;
} idx_type;

static const idx_type idx_types[] = {
    {0x08, "ubyte", 1, CT_UINT8}, {0x09, "sbyte", 1, CT_INT32},   {0x0B, "short", 2, CT_INT32},
    {0x0C, "int", 4, CT_INT32},   {0x0D, "float", 4, CT_FLOAT32}, {0x0E, "double", 8, CT_FLOAT64},
};

typedef struct reader {
    const char *path;
    gzFile f;
    int64_t pos;    /* (decompressed) bytes read so far */
    char note[160]; /* early_end_note's */
} reader;

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t be64(const uint8_t *p) { return (uint64_t)be32(p) << 32 | be32(p + 4); }

/* Converts n big-endian elements of type ty at src into dtype elements at
 * dst. */
static void convert(const idx_type *ty, const uint8_t *src, size_t n, void *dst) {
    switch (ty->code) {
    case 0x08: memcpy(dst, src, n); break;
    case 0x09:
        for (size_t i = 0; i < n; i++)
            ((int32_t *)dst)[i] = (int8_t)src[i];
        break;
    case 0x0B:
        for (size_t i = 0; i < n; i++)
            ((int32_t *)dst)[i] = (int16_t)(uint16_t)(src[2 * i] << 8 | src[2 * i + 1]);
        break;
    case 0x0C:
    case 0x0D:
        for (size_t i = 0; i < n; i++) {
            uint32_t u = be32(src + 4 * i);
            memcpy((char *)dst + 4 * i, &u, 4);
        }
        break;
    case 0x0E:
        for (size_t i = 0; i < n; i++) {
            uint64_t u = be64(src + 8 * i);
            memcpy((char *)dst + 8 * i, &u, 8);
        }
        break;
    default: CT_ASSERT(!"unknown IDX type");
    }
}

/* zlib's last message, without the "<fd:3>: " it puts before it. */
static const char *zlib_message(reader *r, int *zerr) {
    const char *msg = gzerror(r->f, zerr);
    const char *colon = msg && msg[0] == '<' ? strstr(msg, ": ") : NULL;
    return colon ? colon + 2 : msg ? msg : "";
}

/* Error for a failed gzread: the system's reason (zlib keeps strerror's
 * text) or zlib's. */
static int read_error(reader *r) {
    int zerr;
    const char *msg = zlib_message(r, &zerr);
    if (zerr == Z_ERRNO)
        return ct__err_set(CT_EIO, "idx: %s: read failed after %lld bytes: %s", r->path,
                           (long long)r->pos, msg);
    return ct__err_set(CT_ECORRUPT, "idx: %s: the gzip data is damaged after %lld bytes: %s",
                       r->path, (long long)r->pos, msg);
}

/* Reads up to n bytes into buf. Returns how many (fewer only where the data
 * ends), or a negative code with the message set. */
static int64_t read_some(reader *r, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        unsigned want = (unsigned)(n - got < CHUNK ? n - got : CHUNK);
        int k = gzread(r->f, (char *)buf + got, want);
        if (k < 0)
            return read_error(r);
        if (k == 0)
            break;
        got += (size_t)k;
    }
    r->pos += (int64_t)got;
    return (int64_t)got;
}

/* What the reads so far have seen: the file itself, or what its gzip
 * stream decompresses to. */
static const char *stream_name(reader *r) { return gzdirect(r->f) ? "file" : "decompressed data"; }

/* What zlib says about a stream that ended early ("; gzip says: ..."), or
 * "" when the stream itself was complete. */
static const char *early_end_note(reader *r) {
    int zerr;
    const char *msg = zlib_message(r, &zerr);
    bool said = zerr != Z_OK && zerr != Z_STREAM_END && *msg;
    snprintf(r->note, sizeof r->note, "%s%s", said ? "; gzip says: " : "", said ? msg : "");
    return r->note;
}

typedef struct header {
    const idx_type *type;
    int ndim;
    int64_t sizes[CT_MAX_DIMS];
    int64_t numel;
    int64_t data_bytes; /* in the file */
    int64_t header_bytes;
    int64_t total_bytes;           /* header + data: the whole (decompressed) stream */
    int64_t out_bytes;             /* the loaded tensor's, elements widened to its dtype */
    char desc[CT__SHAPE_STR + 16]; /* "ubyte [60000, 28, 28]" */
} header;

static int read_header(reader *r, header *h) {
    uint8_t buf[4 * CT_MAX_DIMS];
    int64_t got = read_some(r, buf, 4);
    if (got < 0)
        return (int)got;
    if (got < 4)
        return ct__err_set(
            CT_ECORRUPT, "idx: %s: the %s ends after %lld bytes; an IDX header needs at least 4%s",
            r->path, stream_name(r), (long long)got, early_end_note(r));
    uint32_t magic = be32(buf);
    if (buf[0] != 0 || buf[1] != 0)
        return ct__err_set(CT_ECORRUPT,
                           "idx: %s: magic 0x%08x is not an IDX magic number (expected 0x0000TTNN: "
                           "two zero bytes, a type byte TT, a dim count NN)",
                           r->path, magic);
    h->type = NULL;
    for (size_t i = 0; i < sizeof idx_types / sizeof *idx_types; i++)
        if (idx_types[i].code == buf[2])
            h->type = &idx_types[i];
    if (!h->type)
        return ct__err_set(CT_ECORRUPT,
                           "idx: %s: magic 0x%08x has type byte 0x%02x; expected 0x08 (ubyte), "
                           "0x09 (sbyte), 0x0B (short), 0x0C (int), 0x0D (float) or 0x0E (double)",
                           r->path, magic, buf[2]);
    h->ndim = buf[3];
    if (h->ndim < 1 || h->ndim > CT_MAX_DIMS)
        return ct__err_set(CT_ECORRUPT, "idx: %s: magic 0x%08x says %d dims; expected 1 to %d",
                           r->path, magic, h->ndim, CT_MAX_DIMS);
    h->header_bytes = 4 + 4 * h->ndim;
    got = read_some(r, buf, (size_t)(4 * h->ndim));
    if (got < 0)
        return (int)got;
    if (got < 4 * h->ndim)
        return ct__err_set(CT_ECORRUPT,
                           "idx: %s: the %s ends after %lld bytes, inside the header (%d dims "
                           "need %lld header bytes)%s",
                           r->path, stream_name(r), (long long)r->pos, h->ndim,
                           (long long)h->header_bytes, early_end_note(r));
    bool overflow = false;
    h->numel = 1;
    for (int i = 0; i < h->ndim; i++) {
        h->sizes[i] = be32(buf + 4 * i);
        overflow |= __builtin_mul_overflow(h->numel, h->sizes[i], &h->numel);
    }
    overflow |= __builtin_mul_overflow(h->numel, (int64_t)h->type->file_size, &h->data_bytes);
    overflow |= __builtin_add_overflow(h->header_bytes, h->data_bytes, &h->total_bytes);
    overflow |=
        __builtin_mul_overflow(h->numel, (int64_t)ct_dtype_size(h->type->dtype), &h->out_bytes);
    char shape[CT__SHAPE_STR];
    snprintf(h->desc, sizeof h->desc, "%s %s", h->type->name,
             ct__tensor_shape_str(shape, h->ndim, h->sizes));
    if (overflow)
        return ct__err_set(CT_ECORRUPT, "idx: %s: the header's %s describes more than 2^63 bytes",
                           r->path, h->desc);
    /* Sizes whose product fits may still make strides ct cannot index (a
     * zero beside huge sizes): corrupt too, not the caller's bad argument. */
    if (ct__tensor_check_shape("idx", h->ndim, h->sizes, h->type->dtype))
        return ct__err_set(CT_ECORRUPT, "idx: %s: the header's %s is a shape ct cannot hold (%s)",
                           r->path, h->desc, ct_errmsg());
    return 0;
}

/* Refuses sizes the file cannot hold, before anything is allocated for
 * them. A file that is not a regular file (a pipe) has no length to check
 * against; its reads catch a short one. */
static int check_fits(reader *r, const header *h, const struct stat *st) {
    if (!S_ISREG(st->st_mode))
        return 0;
    int64_t file_bytes = (int64_t)st->st_size;
    if (gzdirect(r->f)) {
        int64_t want = h->total_bytes;
        if (file_bytes < want)
            return ct__err_set(
                CT_ECORRUPT,
                "idx: %s: the file ends after %lld bytes; the header's %s needs %lld "
                "(%lld header + %lld data)",
                r->path, (long long)file_bytes, h->desc, (long long)want,
                (long long)h->header_bytes, (long long)h->data_bytes);
        if (file_bytes > want)
            return ct__err_set(CT_ECORRUPT,
                               "idx: %s: %lld bytes follow the %lld that the header's %s describes "
                               "(trailing bytes are refused: the header or the file is wrong)",
                               r->path, (long long)(file_bytes - want), (long long)want, h->desc);
        return 0;
    }
    int64_t most;
    if (__builtin_mul_overflow(file_bytes, (int64_t)GZIP_MAX_RATIO, &most))
        return 0;
    if (h->data_bytes > most)
        return ct__err_set(CT_ECORRUPT,
                           "idx: %s: the header's %s needs %lld bytes of data, more than a gzip "
                           "file of %lld bytes can hold (deflate expands at most %d:1)",
                           r->path, h->desc, (long long)h->data_bytes, (long long)file_bytes,
                           GZIP_MAX_RATIO);
    return 0;
}

/* The limit on a loaded tensor's bytes: *limit from MAX_BYTES_VAR when it
 * is set (*from_var), else GZIP_MAX_RATIO times the file's size, or none
 * (INT64_MAX) for a stream without a size, which can fill only as much
 * memory as it sends. */
static int max_bytes(const struct stat *st, int64_t *limit, bool *from_var) {
    const char *v = getenv(MAX_BYTES_VAR);
    *from_var = v != NULL;
    *limit = INT64_MAX;
    if (v) {
        char *end;
        errno = 0;
        long long n = strtoll(v, &end, 10);
        if (*v < '0' || *v > '9' || *end || errno || n <= 0)
            return ct__err_set(CT_EINVAL,
                               "idx: %s=\"%s\" is not a whole number of bytes from 1 to 2^63-1",
                               MAX_BYTES_VAR, v);
        *limit = n;
    } else if (S_ISREG(st->st_mode) &&
               __builtin_mul_overflow((int64_t)st->st_size, (int64_t)GZIP_MAX_RATIO, limit)) {
        *limit = INT64_MAX;
    }
    return 0;
}

/* Refuses a tensor larger than the limit, before it is allocated. */
static int check_limit(reader *r, const header *h, const struct stat *st, int64_t limit,
                       bool from_var) {
    if (h->out_bytes <= limit)
        return 0;
    const char *dtype = ct_dtype_name(h->type->dtype);
    if (from_var)
        return ct__err_set(CT_ENOMEM,
                           "idx: %s: the header's %s loads as %s, %lld bytes, more than %s=%lld "
                           "allows",
                           r->path, h->desc, dtype, (long long)h->out_bytes, MAX_BYTES_VAR,
                           (long long)limit);
    return ct__err_set(CT_ENOMEM,
                       "idx: %s: the header's %s loads as %s, %lld bytes, more than the limit of "
                       "%lld, %d times the file's %lld bytes (set %s to allow more)",
                       r->path, h->desc, dtype, (long long)h->out_bytes, (long long)limit,
                       GZIP_MAX_RATIO, (long long)st->st_size, MAX_BYTES_VAR);
}

/* Reads the data into t and checks that nothing follows it. */
static int read_data(reader *r, const header *h, ct_tensor *t) {
    uint8_t *buf = malloc(CHUNK);
    if (!buf)
        return ct__err_set(CT_ENOMEM, "idx: %s: out of memory for a %zu-byte read buffer", r->path,
                           CHUNK);
    const size_t fsize = (size_t)h->type->file_size;
    const size_t osize = ct_dtype_size(h->type->dtype);
    char *dst = ct_data_ptr(t);
    int rc = 0;
    for (int64_t left = h->numel; left > 0 && rc == 0;) {
        size_t n = (size_t)left < CHUNK / fsize ? (size_t)left : CHUNK / fsize;
        int64_t got = read_some(r, buf, n * fsize);
        if (got < 0) {
            rc = (int)got;
        } else if ((size_t)got < n * fsize) {
            rc = ct__err_set(CT_ECORRUPT,
                             "idx: %s: the %s ends after %lld bytes; the header's %s needs "
                             "%lld (%lld header + %lld data)%s",
                             r->path, stream_name(r), (long long)r->pos, h->desc,
                             (long long)h->total_bytes, (long long)h->header_bytes,
                             (long long)h->data_bytes, early_end_note(r));
        } else {
            convert(h->type, buf, n, dst);
            dst += n * osize;
            left -= (int64_t)n;
        }
    }
    if (rc == 0) {
        int64_t extra = read_some(r, buf, 1);
        if (extra < 0)
            rc = (int)extra;
        else if (extra > 0)
            rc = ct__err_set(CT_ECORRUPT,
                             "idx: %s: the %s continues past the %lld bytes that the header's "
                             "%s describes (trailing bytes are refused: the header or the file is "
                             "wrong)",
                             r->path, stream_name(r), (long long)h->total_bytes, h->desc);
    }
    free(buf);
    return rc;
}

ct_tensor *ct_idx_load(const char *path) {
    if (!path) {
        ct__err_set(CT_EINVAL, "idx: path is NULL");
        return NULL;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        ct__err_set(CT_EIO, "idx: %s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        ct__err_set(CT_EIO, "idx: %s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    int64_t limit;
    bool from_var;
    if (max_bytes(&st, &limit, &from_var) != 0) {
        close(fd);
        return NULL;
    }
    reader r = {.path = path, .f = gzdopen(fd, "rb")};
    if (!r.f) {
        ct__err_set(CT_ENOMEM, "idx: %s: out of memory opening the file with zlib", path);
        close(fd);
        return NULL;
    }
    gzbuffer(r.f, (unsigned)CHUNK);
    header h;
    ct_tensor *out = NULL;
    ct_scope_begin();
    int rc = read_header(&r, &h);
    if (rc == 0)
        rc = check_fits(&r, &h, &st);
    if (rc == 0)
        rc = check_limit(&r, &h, &st, limit, from_var);
    if (rc == 0) {
        ct_tensor *t = ct_empty(h.ndim, h.sizes, h.type->dtype);
        if (!t)
            rc = ct__err_set(ct_errcode(), "idx: %s: %s", path, ct_errmsg());
        else if ((rc = read_data(&r, &h, t)) == 0)
            out = ct_keep(t);
    }
    ct_scope_end();
    gzclose(r.f);
    return out;
}

/* ------------------------------------------------------------ Fashion-MNIST */

/* Checks that images are ubyte [N, rows, cols] and labels ubyte [N] in
 * 0..9. */
static int check_fmnist(const char *ipath, ct_tensor *img, const char *lpath, ct_tensor *lab) {
    char desc[CT__DESC_STR];
    if (ct_tensor_dtype(img) != CT_UINT8 || ct_ndim(img) != 3)
        return ct__err_set(CT_ECORRUPT, "fmnist: %s holds %s; expected uint8 [N, rows, cols]",
                           ipath, ct__tensor_desc(desc, img));
    if (ct_tensor_dtype(lab) != CT_UINT8 || ct_ndim(lab) != 1)
        return ct__err_set(CT_ECORRUPT, "fmnist: %s holds %s; expected uint8 [N]", lpath,
                           ct__tensor_desc(desc, lab));
    if (ct_size(img, 0) != ct_size(lab, 0))
        return ct__err_set(CT_ECORRUPT, "fmnist: %s holds %lld images but %s holds %lld labels",
                           ipath, (long long)ct_size(img, 0), lpath, (long long)ct_size(lab, 0));
    const uint8_t *l = ct_data_ptr(lab);
    for (int64_t i = 0; i < ct_size(lab, 0); i++)
        if (l[i] > 9)
            return ct__err_set(CT_ECORRUPT,
                               "fmnist: %s: label %lld is %d; Fashion-MNIST's classes are 0 to 9",
                               lpath, (long long)i, l[i]);
    return 0;
}

int ct_fmnist_load(const char *dir, bool train, ct_tensor **images, ct_tensor **labels) {
    if (!images || !labels)
        return ct__err_set(CT_EINVAL, "fmnist: images (%p) and labels (%p) must not be NULL",
                           (void *)images, (void *)labels);
    *images = *labels = NULL;
    if (!dir)
        dir = CT_FMNIST_DIR;
    const char *split = train ? "train" : "t10k";
    char ipath[PATH_MAX], lpath[PATH_MAX];
    if ((size_t)snprintf(ipath, sizeof ipath, "%s/%s-images-idx3-ubyte.gz", dir, split) >=
            sizeof ipath ||
        (size_t)snprintf(lpath, sizeof lpath, "%s/%s-labels-idx1-ubyte.gz", dir, split) >=
            sizeof lpath)
        return ct__err_set(CT_EINVAL, "fmnist: directory %.64s... is longer than PATH_MAX (%d)",
                           dir, PATH_MAX);
    ct_scope_begin();
    ct_tensor *img = ct_idx_load(ipath);
    ct_tensor *lab = img ? ct_idx_load(lpath) : NULL;
    int rc = img && lab ? check_fmnist(ipath, img, lpath, lab) : ct_errcode();
    if (rc == 0) {
        int64_t n = ct_size(img, 0), pixels = ct_size(img, 1) * ct_size(img, 2);
        ct_tensor *x =
            ct_div_scalar(ct_to_dtype(ct_view(img, CT_SHAPE(n, pixels)), CT_FLOAT32), 255.0);
        ct_tensor *y = ct_to_dtype(lab, CT_INT64);
        if (x && y) {
            *images = ct_keep(x);
            *labels = ct_keep(y);
        } else {
            rc = ct__err_set(ct_errcode(), "fmnist: %s", ct_errmsg());
        }
    }
    ct_scope_end();
    return rc;
}
