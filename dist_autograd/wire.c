/* The RPC wire format: encoding what to send, and decoding what arrives
 * from anywhere, every length checked before it is used. */
#include "rpc_impl.h"

#include <ct/cuda.h>
#include <stdlib.h>

void ct__rpc_out_free(rpc_out *m) {
    free(m->desc);
    for (uint32_t i = 0; i < m->ntensors; i++)
        ct_tensor_free(m->tensors[i]);
    free(m->tensors);
    m->desc = NULL;
    m->tensors = NULL;
    m->ntensors = 0;
}

/* ------------------------------------------------------------- encoding */

typedef struct buf {
    char *p;
    size_t len, cap;
    bool failed;
} buf;

static void put(buf *b, const void *data, size_t n) {
    if (b->failed || n == 0)
        return;
    if (b->len > SIZE_MAX - n || CT__GROW(b->p, &b->cap, b->len + n, 0, "rpc: encoding")) {
        b->failed = true;
        return;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void put_u8(buf *b, uint8_t v) { put(b, &v, 1); }
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }

int ct__rpc_encode_call(rpc_out *m, const char *fn, const ct_rpc_args *args, bool grads) {
    int rc = ct__rpc_args_check(args, "rpc");
    if (rc)
        return rc;
    size_t name_len = fn ? strlen(fn) : 0;
    if (name_len > RPC_NAME_MAX)
        return ct__err_set(CT_EINVAL, "rpc: the function name '%.40s...' is longer than %d bytes",
                           fn, RPC_NAME_MAX);
    buf b = {0};
    put_u8(&b, (uint8_t)name_len);
    put(&b, fn, name_len);
    put_u32(&b, (uint32_t)args->n);
    m->tensors = calloc((size_t)args->n + 1, sizeof *m->tensors);
    if (!m->tensors)
        b.failed = true;
    for (int i = 0; i < args->n && !b.failed; i++) {
        const rpc_value *v = &args->v[i];
        put_u8(&b, (uint8_t)v->type);
        switch (v->type) {
        case CT_RPC_INT: put(&b, &v->i, 8); break;
        case CT_RPC_FLOAT: put(&b, &v->f, 8); break;
        case CT_RPC_STRING: {
            size_t n = strlen(v->s);
            put_u32(&b, (uint32_t)n);
            put(&b, v->s, n);
            break;
        }
        case CT_RPC_TENSOR: {
            const ct_tensor *t = v->t;
            put_u8(&b, (uint8_t)t->dtype);
            put_u8(&b, grads && ct_grad_enabled() && ct_requires_grad(t) ? RPC_TENSOR_GRAD : 0);
            put_u8(&b, (uint8_t)t->ndim);
            put(&b, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
            /* A contiguous tensor is sent from its own memory; another is
             * packed once. A device's tensor is copied to the host, after
             * the work queued there: it arrives as a CPU tensor. */
            ct_tensor *sent = !ct__is_host(ct_tensor_device(v->t))
                                  ? ct__tensor_own(ct_to(v->t, CT_DEVICE_CPU))
                              : ct_is_contiguous(v->t) ? ct_tensor_retain(v->t)
                                                       : ct__tensor_own(ct_contiguous(v->t));
            if (!sent)
                rc = ct_errcode();
            else
                m->tensors[m->ntensors++] = sent;
            break;
        }
        }
        if (rc)
            break;
    }
    if (!rc && b.failed)
        rc = ct__err_set(CT_ENOMEM, "rpc: out of memory encoding a message");
    if (rc) {
        free(b.p);
        ct__rpc_out_free(m);
        return rc;
    }
    m->desc = b.p;
    m->desc_len = b.len;
    m->h.ntensors = m->ntensors;
    return 0;
}

int ct__rpc_encode_error(rpc_out *m, const char *message) {
    buf b = {0};
    size_t n = strlen(message);
    put_u32(&b, (uint32_t)n);
    put(&b, message, n);
    if (b.failed) {
        free(b.p);
        return ct__err_set(CT_ENOMEM, "rpc: out of memory encoding an error");
    }
    m->desc = b.p;
    m->desc_len = b.len;
    return 0;
}

/* ------------------------------------------------------------- decoding */

int ct__rpc_header_parse(const void *frame, size_t len, rpc_header *h) {
    if (len != sizeof *h)
        return ct__err_set(CT_ECORRUPT, "rpc: a header frame of %zu bytes, not %zu", len,
                           sizeof *h);
    memcpy(h, frame, sizeof *h);
    if (h->magic != RPC_MAGIC)
        return ct__err_set(CT_ECORRUPT, "rpc: a message that is not ct RPC (magic 0x%08x)",
                           h->magic);
    if (h->version != RPC_VERSION)
        return ct__err_set(CT_ECORRUPT, "rpc: wire version %u; this ct speaks %d", h->version,
                           RPC_VERSION);
    if (h->kind < RPC_REQUEST || h->kind >= RPC_KINDS)
        return ct__err_set(CT_ECORRUPT, "rpc: unknown message kind %u", h->kind);
    return 0;
}

typedef struct reader {
    const unsigned char *p;
    size_t len, at;
} reader;

static bool take(reader *r, void *out, size_t n) {
    if (n > r->len - r->at)
        return false;
    memcpy(out, r->p + r->at, n);
    r->at += n;
    return true;
}

static int bad(const char *what, size_t at) {
    return ct__err_set(CT_ECORRUPT, "rpc: a malformed message: %s (description byte %zu)", what,
                       at);
}

static int decode_tensor(reader *r, rpc_frame *frames, uint32_t nframes, uint32_t *next,
                         ct_tensor **out, bool *grad) {
    uint8_t dtype, flags, ndim;
    if (!take(r, &dtype, 1) || !take(r, &flags, 1) || !take(r, &ndim, 1))
        return bad("a tensor's description is cut short", r->at);
    if (dtype >= CT_NDTYPES)
        return bad("an unknown dtype", r->at);
    if (flags & ~RPC_TENSOR_GRAD || (flags && !ct_dtype_is_float((ct_dtype)dtype)))
        return bad("unknown tensor flags, or grad on a tensor that is not float", r->at);
    *grad = flags != 0;
    if (ndim > CT_MAX_DIMS)
        return bad("a tensor of more than 8 dims", r->at);
    int64_t sizes[CT_MAX_DIMS];
    if (!take(r, sizes, sizeof(int64_t) * ndim))
        return bad("a tensor's sizes are cut short", r->at);
    int64_t bytes = (int64_t)ct__esize((ct_dtype)dtype);
    for (int d = 0; d < ndim; d++)
        if (sizes[d] < 0 || __builtin_mul_overflow(bytes, sizes[d], &bytes))
            return bad("a tensor size that is negative or overflows", r->at);
    /* Sizes that multiply out within the frame may still make a shape ct
     * refuses (a zero beside a huge one). */
    if (ct__tensor_check_shape("rpc", ndim, sizes, (ct_dtype)dtype))
        return bad("a tensor shape ct cannot hold", r->at);
    if (*next >= nframes)
        return bad("more tensors than frames", r->at);
    rpc_frame *f = &frames[(*next)++];
    if ((uint64_t)bytes != f->len)
        return bad("a tensor frame whose size is not its shape's", r->at);
    ct_storage *s = ct_storage_from_blob(f->data, f->len, CT_DEVICE_CPU, f->free_fn, f->ctx);
    if (!s)
        return ct_errcode();
    f->taken = true;
    *out = ct__tensor_own(ct_tensor_from_storage(s, 0, ndim, sizes, NULL, (ct_dtype)dtype));
    ct_storage_free(s);
    return *out ? 0 : ct_errcode();
}

int ct__rpc_decode_call(const void *desc, size_t desc_len, rpc_frame *frames, uint32_t nframes,
                        char fn[RPC_NAME_MAX + 1], ct_rpc_args **out) {
    *out = NULL;
    reader r = {desc, desc_len, 0};
    uint8_t name_len;
    uint32_t n;
    if (!take(&r, &name_len, 1) || !take(&r, fn, name_len))
        return bad("the function name is cut short", r.at);
    fn[name_len] = '\0';
    for (int i = 0; i < name_len; i++)
        if ((unsigned char)fn[i] < 0x20 || (unsigned char)fn[i] > 0x7e)
            return bad("the function name is not printable ASCII", (size_t)i + 1);
    if (!take(&r, &n, 4))
        return bad("the value count is cut short", r.at);
    if (n > desc_len)
        return bad("more values than the description has bytes", r.at);
    ct_rpc_args *a = ct_rpc_args_new();
    if (!a)
        return ct_errcode();
    uint32_t next = 0;
    int rc = 0;
    for (uint32_t i = 0; i < n && !rc; i++) {
        uint8_t type;
        if (!take(&r, &type, 1)) {
            rc = bad("a value's type is cut short", r.at);
            break;
        }
        switch (type) {
        case CT_RPC_INT: {
            int64_t v;
            rc = take(&r, &v, 8) ? ct_rpc_args_add_int(a, v) : bad("an int is cut short", r.at);
            break;
        }
        case CT_RPC_FLOAT: {
            double v;
            rc = take(&r, &v, 8) ? ct_rpc_args_add_float(a, v) : bad("a float is cut short", r.at);
            break;
        }
        case CT_RPC_STRING: {
            uint32_t len;
            if (!take(&r, &len, 4) || len > r.len - r.at) {
                rc = bad("a string is cut short", r.at);
                break;
            }
            /* The bytes need not end in a NUL: copied, then terminated. */
            const char *src = (const char *)r.p + r.at;
            char *s = malloc((size_t)len + 1);
            if (!s || memchr(src, '\0', len)) {
                rc = s ? bad("a string holds a NUL byte", r.at)
                       : ct__err_set(CT_ENOMEM, "rpc: out of memory");
                free(s);
                break;
            }
            memcpy(s, src, len);
            s[len] = '\0';
            r.at += len;
            rc = ct_rpc_args_add_string(a, s);
            free(s);
            break;
        }
        case CT_RPC_TENSOR: {
            ct_tensor *t = NULL;
            bool grad = false;
            rc = decode_tensor(&r, frames, nframes, &next, &t, &grad);
            if (!rc && !(rc = ct_rpc_args_add_tensor(a, t)))
                a->v[a->n - 1].grad = grad;
            ct_tensor_free(t);
            break;
        }
        default: rc = bad("an unknown value type", r.at);
        }
    }
    if (!rc && r.at != r.len)
        rc = bad("bytes after the last value", r.at);
    if (!rc && next != nframes)
        rc = bad("tensor frames that no value describes", r.at);
    if (rc) {
        ct_rpc_args_free(a);
        return rc;
    }
    *out = a;
    return 0;
}

int ct__rpc_decode_error(const void *desc, size_t desc_len, char **text) {
    reader r = {desc, desc_len, 0};
    uint32_t len;
    if (!take(&r, &len, 4) || len != desc_len - 4)
        return bad("an error reply's text is cut short", r.at);
    *text = malloc((size_t)len + 1);
    if (*text) {
        memcpy(*text, r.p + 4, len);
        (*text)[len] = '\0';
    }
    return *text ? 0 : ct__err_set(CT_ENOMEM, "rpc: out of memory");
}
