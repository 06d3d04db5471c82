/* safetensors files (https://github.com/huggingface/safetensors).
 *
 * A file is an 8-byte little-endian header size N, N bytes of UTF-8 JSON,
 * then the data buffer:
 *
 *     {"__metadata__": {"k": "v"},
 *      "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...}
 *
 * Offsets count from the start of the data buffer; tensors are row-major
 * and little-endian. Files come from anywhere, so the header is checked
 * whole before any memory is taken for tensors: the reference
 * implementation's rules (a header of at most 100 MB, sizes that match
 * shapes without overflow, offsets that tile the buffer exactly) plus what
 * cJSON lets through that JSON does not (bad UTF-8, control characters,
 * duplicate keys, leading zeros).
 *
 * cJSON keeps numbers as doubles, which cannot hold every int64 and do not
 * say whether the text was "3", "3.0" or "3e0". The header is therefore
 * scanned once before cJSON parses it, recording where each number token
 * starts; cJSON's number items, taken in document order, correspond one to
 * one, and the shape and offset checks read the exact text. */
#include <ct/checkpoint.h>

#include "checkpoint_impl.h"
#include "safetensors_impl.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tensor bytes are read into and written from ct's memory as they are. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian; ct reads and writes it in place");

/* Every dtype safetensors defines; ct lacks those with ct < 0. */
static const struct {
    const char *name;
    int ct;
} st_dtypes[] = {
    {"F64", CT_FLOAT64}, {"F32", CT_FLOAT32}, {"F16", CT_FLOAT16}, {"BF16", CT_BFLOAT16},
    {"I64", CT_INT64},   {"I32", CT_INT32},   {"U8", CT_UINT8},    {"BOOL", CT_BOOL},
    {"I8", -1},          {"I16", -1},         {"U16", -1},         {"U32", -1},
    {"U64", -1},         {"F8_E5M2", -1},     {"F8_E4M3", -1},     {"F8_E8M0", -1},
    {"F4", -1},          {"F6_E2M3", -1},     {"F6_E3M2", -1},     {"C64", -1},
};
#define N_ST_DTYPES ((int)(sizeof st_dtypes / sizeof *st_dtypes))

static const char *st_dtype_name(ct_dtype dtype) {
    for (int i = 0; i < N_ST_DTYPES; i++)
        if (st_dtypes[i].ct == (int)dtype)
            return st_dtypes[i].name;
    return NULL;
}

bool ct__ckpt_utf8_valid(const void *s, size_t n, size_t *bad) {
    const unsigned char *p = s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if (c >= 0xC2 && c <= 0xDF)
            len = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0)
            len = 3, cp = c & 0x0F, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4)
            len = 4, cp = c & 0x07, min = 0x10000;
        else
            break;
        if (n - i < len)
            break;
        size_t k = 1;
        for (; k < len && (p[i + k] & 0xC0) == 0x80; k++)
            cp = cp << 6 | (p[i + k] & 0x3Fu);
        if (k < len || cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            break;
        i += len;
    }
    if (i < n && bad)
        *bad = i;
    return i == n;
}

/* ------------------------------------------------------------- the header */

/* Names and keys can be as long as the header: messages show the start. */
#define NAME "'%.200s'"

typedef struct scan {
    uint32_t *nums; /* header offsets of the number tokens, in document order */
    size_t n, cap;
} scan;

typedef struct st_tensor {
    const char *name; /* in the parsed header */
    ct_dtype dtype;
    int ndim;
    int64_t sizes[CT_MAX_DIMS];
    uint64_t begin, end; /* in the data buffer */
} st_tensor;

typedef struct st_header {
    const char *what;
    const char *text; /* the JSON, len bytes (not NUL-terminated) */
    size_t len;
    uint64_t data_len; /* bytes after the header */
    scan sc;
    cJSON *root;
    const cJSON *meta; /* "__metadata__", or NULL */
    st_tensor *tensors;
    size_t n;
} st_header;

static void header_free(st_header *h) {
    free(h->sc.nums);
    cJSON_Delete(h->root);
    free(h->tensors);
}

static bool num_char(unsigned char c) {
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

static int hex_digit(unsigned char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* What JSON allows and cJSON does not check: control characters (cJSON
 * skips every byte below 0x21 as whitespace and copies them into strings)
 * and \u escapes (cJSON reads a bad hex digit as 0, and \u0000 would end a
 * C string early). Records where each number token starts. */
static int scan_header(st_header *h) {
    const unsigned char *t = (const unsigned char *)h->text;
    scan *sc = &h->sc;
    bool in_string = false;
    for (size_t i = 0; i < h->len;) {
        unsigned char c = t[i];
        if (in_string) {
            if (c == '"') {
                in_string = false;
                i++;
            } else if (c == '\\' && i + 1 < h->len && t[i + 1] == 'u') {
                uint32_t v = 0;
                for (size_t k = 2; k < 6; k++) {
                    int d = i + k < h->len ? hex_digit(t[i + k]) : -1;
                    if (d < 0)
                        return ct__err_set(CT_ECORRUPT,
                                           "safetensors: %s: the header is not valid JSON: the "
                                           "\\u escape at header byte %zu is not followed by 4 hex "
                                           "digits",
                                           h->what, i);
                    v = v << 4 | (uint32_t)d;
                }
                if (v == 0)
                    return ct__err_set(CT_ENOTSUP,
                                       "safetensors: %s: the header holds \\u0000 at header byte "
                                       "%zu; ct's names and metadata are C strings, which cannot "
                                       "hold NUL",
                                       h->what, i);
                i += 6;
            } else if (c == '\\') {
                i += 2; /* cJSON checks the other escapes */
            } else if (c < 0x20) {
                return ct__err_set(CT_ECORRUPT,
                                   "safetensors: %s: the header is not valid JSON: control "
                                   "character 0x%02x inside a string at header byte %zu (JSON "
                                   "needs it escaped)",
                                   h->what, c, i);
            } else {
                i++;
            }
        } else if (c == '"') {
            in_string = true;
            i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            if (CT__GROW(sc->nums, &sc->cap, sc->n + 1, 0, "scanning the header"))
                return ct__err_set(ct_errcode(), "safetensors: %s: %s", h->what, ct_errmsg());
            sc->nums[sc->n++] = (uint32_t)i; /* the header is at most 100 MB */
            while (i < h->len && num_char(t[i]))
                i++;
        } else if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') {
            return ct__err_set(CT_ECORRUPT,
                               "safetensors: %s: the header is not valid JSON: control character "
                               "0x%02x at header byte %zu",
                               h->what, c, i);
        } else {
            i++;
        }
    }
    return 0;
}

/* Numbers each number item in document order, the order scan_header saw
 * their tokens in; the ordinal goes in valueint, which nothing else here
 * reads. */
static void number_items(cJSON *j, size_t *next) {
    for (; j; j = j->next) {
        if (cJSON_IsNumber(j))
            j->valueint = (int)(*next)++;
        number_items(j->child, next);
    }
}

static const char *json_type(const cJSON *j) {
    if (cJSON_IsObject(j))
        return "an object";
    if (cJSON_IsArray(j))
        return "an array";
    if (cJSON_IsString(j))
        return "a string";
    if (cJSON_IsNumber(j))
        return "a number";
    if (cJSON_IsBool(j))
        return "a boolean";
    return "null";
}

/* Reads a header integer in [0, INT64_MAX] from the token's text. On
 * failure returns false and describes the value in why. */
static bool read_int(const st_header *h, const cJSON *j, uint64_t *v, char *why, size_t cap) {
    if (!cJSON_IsNumber(j)) {
        snprintf(why, cap, "%s", json_type(j));
        return false;
    }
    const char *t = h->text + h->sc.nums[j->valueint];
    size_t left = h->len - (size_t)(t - h->text), n = 0;
    while (n < left && num_char((unsigned char)t[n]))
        n++;
    const char *problem = NULL;
    size_t digits = 0;
    while (digits < n && t[digits] >= '0' && t[digits] <= '9')
        digits++;
    uint64_t x = 0;
    if (t[0] == '-')
        problem = "negative";
    else if (digits < n)
        problem = "not an integer";
    else if (n > 1 && t[0] == '0')
        problem = "not a JSON number (a leading zero)";
    for (size_t i = 0; !problem && i < n; i++)
        if (__builtin_mul_overflow(x, 10, &x) ||
            __builtin_add_overflow(x, (uint64_t)(t[i] - '0'), &x) || x > (uint64_t)INT64_MAX)
            problem = "over 2^63 - 1";
    if (problem) {
        snprintf(why, cap, "%.*s (%s)", (int)(n < 40 ? n : 40), t, problem);
        return false;
    }
    *v = x;
    return true;
}

static int tensor_entry(const st_header *h, const cJSON *e, st_tensor *t) {
    const char *name = e->string;
    t->name = name;
    CT_REQUIRE(name[0], CT_ENOTSUP,
               "safetensors: %s: a tensor has the empty name \"\"; ct_tensor_dict names cannot "
               "be empty",
               h->what);
    ct__errctx cx;
    ct__err_ctx_init(&cx, "safetensors: %s: tensor " NAME ": ", h->what, name);
    CT_REQUIRE_CTX(&cx, cJSON_IsObject(e), CT_ECORRUPT,
                   "the entry is %s; expected an object with dtype, shape and data_offsets",
                   json_type(e));
    static const char *const fields[] = {"dtype", "shape", "data_offsets"};
    const cJSON *f[3] = {NULL, NULL, NULL};
    for (const cJSON *c = e->child; c; c = c->next) {
        for (int k = 0; k < 3; k++) {
            if (strcmp(c->string, fields[k]) != 0)
                continue;
            CT_REQUIRE_CTX(&cx, !f[k], CT_ECORRUPT,
                           "field '%s' appears twice (duplicate keys are refused)", fields[k]);
            f[k] = c;
        }
        /* Other fields are ignored, as the reference implementation does. */
    }
    for (int k = 0; k < 3; k++)
        CT_REQUIRE_CTX(&cx, f[k], CT_ECORRUPT, "field '%s' is missing", fields[k]);
    const cJSON *dtype = f[0], *shape = f[1], *offsets = f[2];

    CT_REQUIRE_CTX(&cx, cJSON_IsString(dtype), CT_ECORRUPT, "dtype is %s; expected a string",
                   json_type(dtype));
    int d = 0;
    while (d < N_ST_DTYPES && strcmp(st_dtypes[d].name, dtype->valuestring) != 0)
        d++;
    CT_REQUIRE_CTX(&cx, d < N_ST_DTYPES, CT_ECORRUPT,
                   "unknown dtype \"%.40s\" (safetensors defines BOOL, U8, I8, I16, U16, F16, "
                   "BF16, I32, U32, F32, F64, I64, U64 and the F8/F6/F4 formats)",
                   dtype->valuestring);
    const char *st_name = st_dtypes[d].name;
    CT_REQUIRE_CTX(&cx, st_dtypes[d].ct >= 0, CT_ENOTSUP,
                   "dtype %s is not supported by ct (it reads F64, F32, F16, BF16, I64, I32, U8 "
                   "and BOOL)",
                   st_name);
    t->dtype = (ct_dtype)st_dtypes[d].ct;

    CT_REQUIRE_CTX(&cx, cJSON_IsArray(shape), CT_ECORRUPT,
                   "shape is %s; expected an array of non-negative integers", json_type(shape));
    int ndim = cJSON_GetArraySize(shape);
    CT_REQUIRE_CTX(&cx, ndim <= CT_MAX_DIMS, CT_ENOTSUP,
                   "shape has %d dims; ct tensors have at most %d", ndim, CT_MAX_DIMS);
    t->ndim = ndim;
    int64_t numel = 1;
    bool overflow = false;
    char why[64];
    int k = 0;
    for (const cJSON *s = shape->child; s; s = s->next, k++) {
        uint64_t v;
        CT_REQUIRE_CTX(&cx, read_int(h, s, &v, why, sizeof why), CT_ECORRUPT,
                       "shape entry %d is %s; expected a non-negative integer", k, why);
        t->sizes[k] = (int64_t)v;
        overflow |= __builtin_mul_overflow(numel, t->sizes[k], &numel);
    }
    char shp[CT__SHAPE_STR];
    ct__tensor_shape_str(shp, ndim, t->sizes);
    int64_t nbytes = 0;
    overflow |= __builtin_mul_overflow(numel, (int64_t)ct__esize(t->dtype), &nbytes);
    CT_REQUIRE_CTX(&cx, !overflow, CT_ECORRUPT,
                   "%s%s holds more than 2^63 bytes (the size overflows)", st_name, shp);
    if (ct__tensor_check_shape("safetensors", ndim, t->sizes, t->dtype))
        return ct__err_ctx_set(&cx, CT_ENOTSUP, "%s%s: %s", st_name, shp, ct_errmsg());

    uint64_t off[2];
    CT_REQUIRE_CTX(&cx, cJSON_IsArray(offsets) && cJSON_GetArraySize(offsets) == 2, CT_ECORRUPT,
                   "data_offsets is %s%s; expected an array of 2 integers [begin, end]",
                   json_type(offsets), cJSON_IsArray(offsets) ? " of another length" : "");
    k = 0;
    for (const cJSON *s = offsets->child; s; s = s->next, k++)
        CT_REQUIRE_CTX(&cx, read_int(h, s, &off[k], why, sizeof why), CT_ECORRUPT,
                       "data_offsets[%d] is %s; expected a non-negative integer", k, why);
    t->begin = off[0];
    t->end = off[1];
    unsigned long long begin = t->begin, end = t->end;
    CT_REQUIRE_CTX(&cx, begin <= end, CT_ECORRUPT, "data_offsets [%llu, %llu] begin after they end",
                   begin, end);
    CT_REQUIRE_CTX(&cx, end - begin == (uint64_t)nbytes, CT_ECORRUPT,
                   "data_offsets [%llu, %llu] hold %llu bytes but %s%s needs %lld", begin, end,
                   end - begin, st_name, shp, (long long)nbytes);
    CT_REQUIRE_CTX(&cx, end <= h->data_len, CT_ECORRUPT,
                   "data_offsets [%llu, %llu] end past the %llu bytes of data that follow the "
                   "header",
                   begin, end, (unsigned long long)h->data_len);
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first name that appears twice among the n names (which it sorts), or
 * NULL. */
static const char *find_duplicate(const char **names, size_t n) {
    qsort(names, n, sizeof *names, cmp_names);
    for (size_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            return names[i];
    return NULL;
}

static int check_metadata(const st_header *h, const cJSON *m) {
    if (!cJSON_IsObject(m))
        return ct__err_set(CT_ECORRUPT,
                           "safetensors: %s: __metadata__ is %s; expected an object of strings",
                           h->what, json_type(m));
    size_t n = 0;
    for (const cJSON *c = m->child; c; c = c->next, n++)
        if (!cJSON_IsString(c))
            return ct__err_set(CT_ECORRUPT,
                               "safetensors: %s: __metadata__ key " NAME " has %s; expected a "
                               "string",
                               h->what, c->string, json_type(c));
    const char **keys = malloc((n ? n : 1) * sizeof *keys);
    if (!keys)
        return ct__err_set(CT_ENOMEM, "safetensors: %s: out of memory checking __metadata__",
                           h->what);
    n = 0;
    for (const cJSON *c = m->child; c; c = c->next)
        keys[n++] = c->string;
    const char *dup = find_duplicate(keys, n);
    int rc = dup ? ct__err_set(CT_ECORRUPT,
                               "safetensors: %s: __metadata__ has the key " NAME " twice "
                               "(duplicate keys are refused)",
                               h->what, dup)
                 : 0;
    free(keys);
    return rc;
}

static int cmp_ranges(const void *a, const void *b) {
    const st_tensor *x = *(const st_tensor *const *)a, *y = *(const st_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Sorted by offset, the tensors must tile [0, data_len): the first starts
 * at 0, each where the one before ended, the last at the end. Empty
 * tensors take no room and may sit at any boundary. */
static int check_tiling(const st_header *h, const st_tensor **order) {
    qsort(order, h->n, sizeof *order, cmp_ranges);
    uint64_t at = 0;
    const st_tensor *prev = NULL;
    for (size_t i = 0; i < h->n; i++) {
        const st_tensor *t = order[i];
        if (t->begin > at && !prev)
            return ct__err_set(CT_ECORRUPT,
                               "safetensors: %s: tensor " NAME ": data_offsets [%llu, %llu]: the "
                               "first tensor must begin at byte 0 of the data (a hole of %llu "
                               "bytes)",
                               h->what, t->name, (unsigned long long)t->begin,
                               (unsigned long long)t->end, (unsigned long long)t->begin);
        if (t->begin > at)
            return ct__err_set(CT_ECORRUPT,
                               "safetensors: %s: tensor " NAME ": data_offsets [%llu, %llu] leave "
                               "a hole: bytes [%llu, %llu) after tensor " NAME " belong to no "
                               "tensor",
                               h->what, t->name, (unsigned long long)t->begin,
                               (unsigned long long)t->end, (unsigned long long)at,
                               (unsigned long long)t->begin, prev->name);
        if (t->begin < at)
            return ct__err_set(CT_ECORRUPT,
                               "safetensors: %s: tensor " NAME ": data_offsets [%llu, %llu] "
                               "overlap tensor " NAME " (data_offsets [%llu, %llu])",
                               h->what, t->name, (unsigned long long)t->begin,
                               (unsigned long long)t->end, prev->name,
                               (unsigned long long)prev->begin, (unsigned long long)prev->end);
        at = t->end;
        prev = t;
    }
    if (at == h->data_len)
        return 0;
    if (!prev)
        return ct__err_set(CT_ECORRUPT,
                           "safetensors: %s: %llu bytes of data follow a header that lists no "
                           "tensors (trailing bytes are refused)",
                           h->what, (unsigned long long)h->data_len);
    return ct__err_set(CT_ECORRUPT,
                       "safetensors: %s: %llu trailing bytes follow the last tensor " NAME
                       " (data_offsets [%llu, %llu]); the data is %llu bytes (trailing bytes "
                       "are refused)",
                       h->what, (unsigned long long)(h->data_len - at), prev->name,
                       (unsigned long long)prev->begin, (unsigned long long)prev->end,
                       (unsigned long long)h->data_len);
}

/* Checks the header h->text (h->len bytes) against the format's rules for
 * a data buffer of h->data_len bytes, and fills in h's tensors and
 * metadata. The one implementation of the rules: files and buffers both
 * come through here. */
static int parse_header(st_header *h) {
    const char *what = h->what;
    size_t bad;
    if (!ct__ckpt_utf8_valid(h->text, h->len, &bad))
        return ct__err_set(CT_ECORRUPT,
                           "safetensors: %s: the header is not valid UTF-8 (byte 0x%02x at header "
                           "byte %zu)",
                           what, (unsigned char)h->text[bad], bad);
    if (h->len == 0 || h->text[0] != '{')
        return ct__err_set(CT_ECORRUPT,
                           "safetensors: %s: the header must be a JSON object and begin with '{'; "
                           "it %s",
                           what, h->len ? "begins otherwise" : "is empty");
    int rc = scan_header(h);
    if (rc)
        return rc;
    const char *end = NULL;
    h->root = ct__ckpt_json_parse(h->text, h->len, &end);
    if (!h->root) {
        size_t at = end && end >= h->text ? (size_t)(end - h->text) : 0;
        at = at < h->len ? at : h->len;
        size_t show = h->len - at < 24 ? h->len - at : 24;
        return ct__err_set(CT_ECORRUPT,
                           "safetensors: %s: the header is not valid JSON (it goes wrong near "
                           "header byte %zu: \"%.*s\")",
                           what, at, (int)show, h->text + at);
    }
    for (size_t i = (size_t)(end - h->text); i < h->len; i++)
        if (h->text[i] != ' ' && h->text[i] != '\t' && h->text[i] != '\n' && h->text[i] != '\r')
            return ct__err_set(CT_ECORRUPT,
                               "safetensors: %s: the header is not valid JSON: header byte %zu "
                               "follows the object (only whitespace may pad it)",
                               what, i);
    size_t nnums = 0;
    number_items(h->root, &nnums);
    if (!cJSON_IsObject(h->root) || nnums != h->sc.n)
        return ct__err_set(CT_ECORRUPT, "safetensors: %s: the header is not valid JSON", what);

    size_t n = 0;
    for (const cJSON *c = h->root->child; c; c = c->next)
        n++;
    h->tensors = malloc((n ? n : 1) * sizeof *h->tensors);
    const st_tensor **order = malloc((n ? n : 1) * sizeof *order);
    if (!h->tensors || !order) {
        free(order);
        return ct__err_set(CT_ENOMEM, "safetensors: %s: out of memory for a header of %zu entries",
                           what, n);
    }
    for (const cJSON *c = h->root->child; c && rc == 0; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            if (h->meta)
                rc = ct__err_set(CT_ECORRUPT,
                                 "safetensors: %s: the header has the key '__metadata__' twice "
                                 "(duplicate keys are refused)",
                                 what);
            else if ((rc = check_metadata(h, c)) == 0)
                h->meta = c;
        } else {
            rc = tensor_entry(h, c, &h->tensors[h->n]);
            h->n++;
        }
    }
    if (rc == 0) {
        const char **names = (const char **)order;
        for (size_t i = 0; i < h->n; i++)
            names[i] = h->tensors[i].name;
        const char *dup = find_duplicate(names, h->n);
        if (dup)
            rc = ct__err_set(CT_ECORRUPT,
                             "safetensors: %s: tensor " NAME ": the header has the key twice "
                             "(duplicate keys are refused)",
                             what, dup);
    }
    if (rc == 0) {
        for (size_t i = 0; i < h->n; i++)
            order[i] = &h->tensors[i];
        rc = check_tiling(h, order);
    }
    free(order);
    return rc;
}

/* Reads n bytes at offset off of the data buffer into dst. */
typedef int (*read_fn)(void *ctx, uint64_t off, void *dst, size_t n);

/* Makes the set a checked header describes; read fetches the tensors'
 * bytes. Tensors keep the header's order. */
static int build_set(const st_header *h, read_fn read, void *ctx, ct_tensor_dict **out) {
    const char *what = h->what;
    ct_tensor_dict *set = ct_tensor_dict_new();
    if (!set)
        return ct__err_set(CT_ENOMEM, "safetensors: %s: out of memory", what);
    int rc = 0;
    for (const cJSON *c = h->meta ? h->meta->child : NULL; c && rc == 0; c = c->next)
        if ((rc = ct_tensor_dict_set_meta(set, c->string, c->valuestring)) != 0)
            rc = ct__err_set(rc, "safetensors: %s: __metadata__ key " NAME ": %s", what, c->string,
                             ct_errmsg());
    for (size_t i = 0; i < h->n && rc == 0; i++) {
        const st_tensor *e = &h->tensors[i];
        ct_tensor *t =
            ct__tensor_own(ct__tensor_new("safetensors_load", e->ndim, e->sizes, e->dtype));
        if (!t) {
            rc = ct__err_set(ct_errcode(), "safetensors: %s: tensor " NAME ": %s", what, e->name,
                             ct_errmsg());
            break;
        }
        if (e->end > e->begin)
            rc = read(ctx, e->begin, ct_data_ptr(t), (size_t)(e->end - e->begin));
        if (rc == 0 && (rc = ct_tensor_dict_add(set, e->name, t)) != 0)
            rc =
                ct__err_set(rc, "safetensors: %s: tensor " NAME ": %s", what, e->name, ct_errmsg());
        ct_tensor_free(t);
    }
    if (rc) {
        ct_tensor_dict_free(set);
        return rc;
    }
    *out = set;
    return 0;
}

static uint64_t le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Checks the 8-byte prefix (first; NULL when the file is shorter) of a
 * file of size bytes and returns the header size in *n. */
static int check_prefix(const char *what, const unsigned char *first, uint64_t size, uint64_t *n) {
    if (size < 8)
        return ct__err_set(CT_ECORRUPT,
                           "safetensors: %s: the file is %llu bytes; a safetensors file begins "
                           "with an 8-byte header size",
                           what, (unsigned long long)size);
    *n = le64(first);
    if (*n > CT__SAFETENSORS_MAX_HEADER)
        return ct__err_set(CT_ECORRUPT,
                           "safetensors: %s: the header size is %llu bytes, over the format's "
                           "limit of %llu (100 MB)",
                           what, (unsigned long long)*n,
                           (unsigned long long)CT__SAFETENSORS_MAX_HEADER);
    if (*n > size - 8)
        return ct__err_set(CT_ECORRUPT,
                           "safetensors: %s: the header size is %llu bytes but the file holds "
                           "only %llu after the size (truncated, or not a safetensors file)",
                           what, (unsigned long long)*n, (unsigned long long)(size - 8));
    return 0;
}

static int read_memory(void *ctx, uint64_t off, void *dst, size_t n) {
    memcpy(dst, (const char *)ctx + off, n);
    return 0;
}

int ct__safetensors_parse(const void *buf, size_t len, const char *what, ct_tensor_dict **out) {
    if (!out)
        return ct__err_set(CT_EINVAL, "safetensors: out is NULL");
    *out = NULL;
    if (!buf && len)
        return ct__err_set(CT_EINVAL, "safetensors: buffer is NULL but its length is %zu", len);
    what = what ? what : "(buffer)";
    const unsigned char *b = buf;
    uint64_t n = 0;
    int rc = check_prefix(what, b, len, &n);
    if (rc)
        return rc;
    st_header h = {.what = what, .text = (const char *)b + 8, .len = n, .data_len = len - 8 - n};
    rc = parse_header(&h);
    if (rc == 0)
        rc = build_set(&h, read_memory, (void *)(b + 8 + n), out);
    header_free(&h);
    return rc;
}

/* ------------------------------------------------------------ loading */

typedef struct file_reader {
    const char *path;
    int fd;
    uint64_t base; /* file offset of the data buffer */
} file_reader;

static int read_file(void *ctx, uint64_t off, void *dst, size_t n) {
    file_reader *r = ctx;
    return ct__file_pread_all(r->fd, dst, n, (int64_t)(r->base + off), r->path);
}

int ct_safetensors_load(const char *path, ct_tensor_dict **out) {
    if (!out)
        return ct__err_set(CT_EINVAL, "safetensors_load: out is NULL");
    *out = NULL;
    if (!path)
        return ct__err_set(CT_EINVAL, "safetensors_load: path is NULL");
    static const ct__file_rules rules = {.refuse = CT_EIO, .follow = true};
    int64_t len = 0;
    int fd = ct__file_open(AT_FDCWD, path, path, &rules, &len, NULL);
    if (fd < 0)
        return ct__err_set(fd, "safetensors: %s", ct_errmsg());
    int rc = 0;
    uint64_t size = (uint64_t)len, n = 0;
    unsigned char first[8] = {0};
    if (size >= 8)
        rc = ct__file_pread_all(fd, first, 8, 0, path);
    if (rc == 0)
        rc = check_prefix(path, first, size, &n);
    char *text = NULL;
    if (rc == 0 && !(text = malloc(n ? n : 1)))
        rc = ct__err_set(CT_ENOMEM, "safetensors: %s: out of memory for a header of %llu bytes",
                         path, (unsigned long long)n);
    if (rc == 0)
        rc = ct__file_pread_all(fd, text, n, 8, path);
    st_header h = {.what = path, .text = text, .len = n, .data_len = size - 8 - n};
    if (rc == 0)
        rc = parse_header(&h);
    file_reader r = {path, fd, 8 + n};
    if (rc == 0)
        rc = build_set(&h, read_file, &r, out);
    header_free(&h);
    free(text);
    close(fd);
    return rc;
}

/* ------------------------------------------------------------- saving */

/* Adds v to array as its exact decimal text: cJSON's numbers are doubles,
 * and print large ones with an exponent. */
static bool add_int(cJSON *array, int64_t v) {
    char buf[24];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    cJSON *item = cJSON_CreateRaw(buf);
    if (item && cJSON_AddItemToArray(array, item))
        return true;
    cJSON_Delete(item);
    return false;
}

static int64_t tensor_nbytes(const ct_tensor *t) {
    return ct__tensor_numel(ct_ndim(t), ct_sizes(t)) * (int64_t)ct__esize(ct_tensor_dtype(t));
}

/* The header JSON for set, padded with spaces to a multiple of 8 bytes
 * (the reference writer does, so that the data is aligned for every
 * dtype). *len receives its length; free() it. */
static char *make_header(const char *path, const ct_tensor_dict *set, size_t *len) {
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    int nmeta = ct_tensor_dict_num_meta(set);
    cJSON *meta = ok && nmeta > 0 ? cJSON_AddObjectToObject(root, "__metadata__") : NULL;
    ok &= nmeta == 0 || meta;
    for (int i = 0; ok && i < nmeta; i++) {
        const char *k, *v;
        ct_tensor_dict_meta_at(set, i, &k, &v);
        ok = cJSON_AddStringToObject(meta, k, v) != NULL;
    }
    int64_t offset = 0;
    for (int i = 0; ok && i < ct_tensor_dict_count(set); i++) {
        const ct_tensor *t = ct_tensor_dict_tensor(set, i);
        int64_t end = offset + tensor_nbytes(t);
        cJSON *e = cJSON_AddObjectToObject(root, ct_tensor_dict_name(set, i)), *shape = NULL;
        ok = e && cJSON_AddStringToObject(e, "dtype", st_dtype_name(ct_tensor_dtype(t))) &&
             (shape = cJSON_AddArrayToObject(e, "shape")) != NULL;
        for (int d = 0; ok && d < ct_ndim(t); d++)
            ok = add_int(shape, ct_sizes(t)[d]);
        cJSON *offs = ok ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        ok = offs && add_int(offs, offset) && add_int(offs, end);
        offset = end;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) {
        ct__err_set(CT_ENOMEM, "safetensors_save: %s: out of memory building the header", path);
        return NULL;
    }
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    if (padded > CT__SAFETENSORS_MAX_HEADER) {
        ct__err_set(CT_EINVAL,
                    "safetensors_save: %s: the header would be %zu bytes, over the format's limit "
                    "of %llu (100 MB): too many tensors or too much metadata",
                    path, padded, (unsigned long long)CT__SAFETENSORS_MAX_HEADER);
        free(json);
        return NULL;
    }
    char *p = realloc(json, padded);
    if (!p) {
        free(json);
        ct__err_set(CT_ENOMEM, "safetensors_save: %s: out of memory building the header", path);
        return NULL;
    }
    memset(p + n, ' ', padded - n);
    *len = padded;
    return p;
}

int ct_safetensors_save(const char *path, const ct_tensor_dict *set) {
    static const char fn[] = "safetensors_save";
    if (!path || !path[0])
        return ct__err_set(CT_EINVAL, "%s: path is %s", fn, path ? "empty" : "NULL");
    int count = ct_tensor_dict_count(set);
    if (count < 0)
        return ct__err_set(count, "%s: %s: %s", fn, path, ct_errmsg());
    for (int i = 0; i < count; i++) {
        const ct_tensor *t = ct_tensor_dict_tensor(set, i);
        if (!st_dtype_name(ct_tensor_dtype(t)))
            return ct__err_set(CT_EINVAL,
                               "%s: %s: tensor " NAME ": safetensors has no dtype for %s", fn, path,
                               ct_tensor_dict_name(set, i), ct_dtype_name(ct_tensor_dtype(t)));
    }
    size_t hlen;
    char *header = make_header(path, set, &hlen);
    if (!header)
        return ct_errcode();
    size_t plen = strlen(path);
    char *tmp = malloc(plen + sizeof ".tmp");
    if (!tmp) {
        free(header);
        return ct__err_set(CT_ENOMEM, "%s: %s: out of memory", fn, path);
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", sizeof ".tmp");
    ct__writer w = {.shown = tmp, .fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666)};
    int rc = 0;
    if (w.fd < 0) {
        rc = ct__err_set(CT_EIO, "%s: cannot create %s: %s", fn, tmp, strerror(errno));
    } else {
        unsigned char size[8];
        for (int i = 0; i < 8; i++)
            size[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
        rc = ct__file_writer_put(&w, size, 8);
        if (rc == 0)
            rc = ct__file_writer_put(&w, header, hlen);
        for (int i = 0; rc == 0 && i < count; i++) {
            /* A device tensor is copied to the host one at a time, so that
             * the host holds at most one of them. */
            ct_tensor *host = ct__ckpt_on_host(ct_tensor_dict_tensor(set, i));
            rc = host ? ct__tensor_for_each_run(host, ct__file_writer_put, &w)
                      : ct__err_set(ct_errcode(), "%s: %s: tensor " NAME ": %s", fn, path,
                                    ct_tensor_dict_name(set, i), ct_errmsg());
            ct_tensor_free(host);
        }
        if (rc == 0)
            rc = ct__file_writer_flush(&w);
        rc = ct__file_commit(AT_FDCWD, w.fd, tmp, path, rc, fn);
    }
    ct__file_writer_free(&w);
    free(tmp);
    free(header);
    return rc;
}
