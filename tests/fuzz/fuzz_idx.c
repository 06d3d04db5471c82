/* libFuzzer target: the IDX reader, ct_idx_load, on arbitrary bytes, as a
 * downloaded dataset file may hold them.
 *
 * The first byte says how the rest becomes the file: even, the rest is the
 * file (a plain IDX file, or a gzip stream for the mutator to damage); odd,
 * the rest is gzip-compressed here first (at level byte / 2 % 10), so that
 * mutations land in the IDX bytes and still pass through zlib. The file is
 * a memfd, opened by its /proc path: a regular file that touches no disk.
 *
 * Besides not crashing, leaking or invoking undefined behaviour, the reader
 * must keep its promises: a failure is CT_ECORRUPT or CT_ENOMEM with no
 * tensor and a message that names the path; a success is a contiguous
 * tensor with the dtype and sizes its header gives, each element the
 * stream's, from a stream exactly header + data long, and no larger than
 * the memory limit, 1032 times the file. A broken promise aborts, which
 * libFuzzer reports as a crash. */
#include <ct/data.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>

/* The reader's default limit: deflate's greatest expansion. */
#define MAX_RATIO 1032

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void broken(const char *promise) {
    fprintf(stderr, "fuzz_idx: %s (last error %s: %s)\n", promise, ct_errname(ct_errcode()),
            ct_errmsg());
    abort();
}

static uint64_t be(const uint8_t *p, int width) {
    uint64_t v = 0;
    for (int i = 0; i < width; i++)
        v = v << 8 | p[i];
    return v;
}

/* The rest of the input gzip-compressed, in a malloc'd buffer. */
static uint8_t *gzip(const uint8_t *src, size_t n, int level, size_t *out_len) {
    z_stream z = {0};
    if (deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        broken("deflateInit2 failed");
    size_t cap = deflateBound(&z, (uLong)n);
    uint8_t *out = malloc(cap);
    if (!out)
        broken("out of memory compressing the input");
    z.next_in = (Bytef *)src;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    if (deflate(&z, Z_FINISH) != Z_STREAM_END)
        broken("deflate did not finish within deflateBound");
    *out_len = z.total_out;
    deflateEnd(&z);
    return out;
}

/* What zlib's gzread makes of the file, as the reader sees it: at most cap
 * bytes (*len), or NULL where the stream is damaged. */
static uint8_t *stream_of(const char *path, size_t cap, size_t *len) {
    gzFile f = gzopen(path, "rb");
    uint8_t *buf = malloc(cap ? cap : 1);
    if (!f || !buf)
        broken("cannot reread the file");
    int k = 0;
    *len = 0;
    while (*len < cap && (k = gzread(f, buf + *len, (unsigned)(cap - *len))) > 0)
        *len += (size_t)k;
    gzclose(f);
    if (k < 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Checks a loaded tensor against the stream it came from. */
static void check_loaded(ct_tensor *t, const uint8_t *s, size_t len, size_t file_len) {
    static const struct {
        uint8_t code;
        int width;
        ct_dtype dtype;
    } types[] = {{0x08, 1, CT_UINT8}, {0x09, 1, CT_INT32},   {0x0B, 2, CT_INT32},
                 {0x0C, 4, CT_INT32}, {0x0D, 4, CT_FLOAT32}, {0x0E, 8, CT_FLOAT64}};
    if (len < 4 || s[0] || s[1])
        broken("a stream without an IDX magic loaded");
    int ti = -1;
    for (int i = 0; i < 6; i++)
        if (types[i].code == s[2])
            ti = i;
    int ndim = s[3], w = ti < 0 ? 0 : types[ti].width;
    if (ti < 0 || ct_tensor_dtype(t) != types[ti].dtype)
        broken("the dtype is not the one the type byte maps to");
    if (ndim != ct_ndim(t) || len < 4 + 4 * (size_t)ndim)
        broken("the dims are not the header's");
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        if (ct_size(t, d) != (int64_t)be(s + 4 + 4 * d, 4))
            broken("a size is not the header's");
        numel *= ct_size(t, d);
    }
    size_t header = 4 + 4 * (size_t)ndim, osize = ct_dtype_size(ct_tensor_dtype(t));
    if (ct_numel(t) != numel || len != header + (size_t)numel * (size_t)w)
        broken("the stream is not exactly header + data long");
    if (!ct_is_contiguous(t))
        broken("a loaded tensor is not contiguous");
    if ((size_t)numel * osize > MAX_RATIO * file_len)
        broken("the tensor takes more than 1032 times the file");
    const uint8_t *src = s + header, *out = ct_data_ptr(t);
    for (int64_t i = 0; i < numel; i++, src += w, out += osize) {
        uint64_t bits = be(src, w);
        union {
            uint8_t u8;
            int32_t i32;
            uint32_t u32;
            uint64_t u64;
        } want;
        switch (s[2]) {
        case 0x08: want.u8 = (uint8_t)bits; break;
        case 0x09: want.i32 = (int8_t)bits; break;
        case 0x0B: want.i32 = (int16_t)bits; break;
        case 0x0C:
        case 0x0D: want.u32 = (uint32_t)bits; break;
        default: want.u64 = bits;
        }
        if (memcmp(out, &want, osize) != 0)
            broken("an element is not the stream's");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz_idx", MFD_CLOEXEC);
        if (fd < 0)
            broken("memfd_create failed");
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        unsetenv("CT_IDX_MAX_BYTES");
    }
    if (size < 1)
        return 0;
    size_t len = size - 1;
    uint8_t *packed = data[0] & 1 ? gzip(data + 1, len, data[0] / 2 % 10, &len) : NULL;
    const uint8_t *file = packed ? packed : data + 1;
    if (ftruncate(fd, 0) != 0 || pwrite(fd, file, len, 0) != (ssize_t)len)
        broken("cannot write the memfd");
    free(packed);

    ct_errclear();
    ct_tensor *t = ct_idx_load(path);
    if (!t) {
        int rc = ct_errcode();
        if (rc != CT_ECORRUPT && rc != CT_ENOMEM)
            broken("a failed load returned a code other than ECORRUPT or ENOMEM");
        char prefix[96];
        snprintf(prefix, sizeof prefix, "idx: %s: ", path);
        if (strncmp(ct_errmsg(), prefix, strlen(prefix)) != 0)
            broken("the error message does not name the path");
        return 0;
    }
    /* One byte more than a loaded stream may hold, so that a longer one
     * shows. */
    size_t slen;
    uint8_t *s = stream_of(path, MAX_RATIO * len + 64, &slen);
    if (!s)
        broken("a damaged gzip stream loaded");
    check_loaded(t, s, slen, len);
    free(s);
    ct_tensor_free(t);
    return 0;
}
