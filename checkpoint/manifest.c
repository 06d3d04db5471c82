/* manifest.json: parsing every field of untrusted text with its bounds
 * checked, and writing it back. */
#include "checkpoint_impl.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* A manifest larger than this is not one ct wrote (a million chunks take
 * about 200 MB); refusing it bounds what a hostile file can make us
 * allocate. */
#define MANIFEST_MAX_BYTES (INT64_C(1) << 30)

void ct__manifest_free(ck_manifest *m) {
    if (!m)
        return;
    free(m->writer);
    for (int i = 0; i < m->nfiles; i++) {
        free(m->files[i].name);
        free(m->files[i].blocks);
    }
    free(m->files);
    free(m->tensor_names.names);
    free(m->tensor_names.index);
    free(m->value_names.names);
    free(m->value_names.index);
    for (int i = 0; i < m->ntensors; i++) {
        free(m->tensors[i].name);
        free(m->tensors[i].chunks);
    }
    free(m->tensors);
    for (int i = 0; i < m->nvalues; i++) {
        free(m->values[i].name);
        for (int j = 0; j < m->values[i].ntexts; j++)
            free(m->values[i].texts[j]);
        free(m->values[i].texts);
    }
    free(m->values);
    for (int i = 0; i < 2 * m->nmeta; i++)
        free(m->meta[i]);
    free(m->meta);
    free(m);
}

static size_t name_slot(const ck_names *s, const char *name) {
    size_t i = (size_t)XXH3_64bits(name, strlen(name)) & (s->cap - 1);
    while (s->names[i] && strcmp(s->names[i], name))
        i = (i + 1) & (s->cap - 1);
    return i;
}

/* Adds name (borrowed: it must outlive s) as index; the index of an entry
 * already there under that name, -1 if none, or CT_ENOMEM's -2. */
static int names_add(ck_names *s, const char *name, int index) {
    if (2 * (s->n + 1) > s->cap) {
        ck_names g = {calloc(s->cap ? 2 * s->cap : 64, sizeof(char *)),
                      calloc(s->cap ? 2 * s->cap : 64, sizeof(int)), s->cap ? 2 * s->cap : 64, 0};
        if (!g.names || !g.index) {
            free(g.names);
            free(g.index);
            return -2;
        }
        for (size_t i = 0; i < s->cap; i++)
            if (s->names[i]) {
                size_t j = name_slot(&g, s->names[i]);
                g.names[j] = s->names[i];
                g.index[j] = s->index[i];
            }
        g.n = s->n;
        free(s->names);
        free(s->index);
        *s = g;
    }
    size_t i = name_slot(s, name);
    if (s->names[i])
        return s->index[i];
    s->names[i] = name;
    s->index[i] = index;
    s->n++;
    return -1;
}

static int names_find(const ck_names *s, const char *name) {
    if (!s->cap)
        return -2;
    size_t i = name_slot(s, name);
    return s->names[i] ? s->index[i] : -1;
}

int ct__manifest_find_tensor(const ck_manifest *m, const char *name) {
    int i = names_find(&m->tensor_names, name);
    if (i != -2)
        return i;
    for (i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, name))
            return i;
    return -1;
}

int ct__manifest_find_value(const ck_manifest *m, const char *name) {
    int i = names_find(&m->value_names, name);
    if (i != -2)
        return i;
    for (i = 0; i < m->nvalues; i++)
        if (!strcmp(m->values[i].name, name))
            return i;
    return -1;
}

/* ------------------------------------------------------------- checking */

/* The number of elements of a box, or -1 when it overflows int64. */
static int64_t box_numel(int ndim, const int64_t *sizes) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        if (__builtin_mul_overflow(n, sizes[d], &n))
            return -1;
    return n;
}

static bool boxes_overlap(int ndim, const ck_chunk *a, const ck_chunk *b) {
    for (int d = 0; d < ndim; d++)
        if (a->offsets[d] >= b->offsets[d] + b->sizes[d] ||
            b->offsets[d] >= a->offsets[d] + a->sizes[d])
            return false;
    return box_numel(ndim, a->sizes) > 0 && box_numel(ndim, b->sizes) > 0;
}

static int by_offsets(const void *pa, const void *pb, void *ctx) {
    const ck_tensor *t = ctx;
    const ck_chunk *a = &t->chunks[*(const int *)pa], *b = &t->chunks[*(const int *)pb];
    for (int d = 0; d < t->ndim; d++)
        if (a->offsets[d] != b->offsets[d])
            return a->offsets[d] < b->offsets[d] ? -1 : 1;
    return 0;
}

/* At most this many corners (chunks x 2^dims split) are checked: it bounds
 * the table below to 256 MiB; ct's own saves need one chunk per rank. */
#define CORNERS_MAX (INT64_C(1) << 23)

/* A box's indicator is the signed sum of the orthants at its 2^d corners
 * (+ at offsets, - at offsets + sizes, per dim), and orthants at distinct
 * points are independent: the chunks tile the tensor exactly (every
 * element once) if and only if their corners' signed weights, summed
 * point by point, equal the tensor's own. A hash table of corners makes
 * that linear in the chunks, for any hostile manifest. */
typedef struct corner {
    uint64_t hash; /* 0: an empty slot */
    uint32_t id;   /* chunk << 8 | which corner (a bit per dim: its far end) */
    int32_t weight;
} corner;

#define TENSOR_CORNER 0xffffffu /* in place of a chunk: the tensor's corners */

static void corner_point(const ck_tensor *t, const int *dims, int nd, uint32_t id, int64_t *p) {
    uint32_t c = id >> 8, mask = id & 0xff;
    for (int i = 0; i < nd; i++) {
        int d = dims[i];
        int64_t lo = c == TENSOR_CORNER ? 0 : t->chunks[c].offsets[d];
        int64_t size = c == TENSOR_CORNER ? t->sizes[d] : t->chunks[c].sizes[d];
        p[i] = mask >> i & 1 ? lo + size : lo;
    }
}

/* 0 and *tiles, 1 past CORNERS_MAX, -1 out of memory. */
static int corners_tile(const ck_tensor *t, bool *tiles) {
    /* Dims every chunk spans whole add nothing: leave them out. */
    int dims[CT_MAX_DIMS], nd = 0;
    for (int d = 0; d < t->ndim; d++) {
        bool whole = true;
        for (int c = 0; c < t->nchunks && whole; c++)
            whole = t->chunks[c].offsets[d] == 0 && t->chunks[c].sizes[d] == t->sizes[d];
        if (!whole)
            dims[nd++] = d;
    }
    int64_t n = ((int64_t)t->nchunks + 1) << nd;
    if (n > CORNERS_MAX)
        return 1;
    size_t cap = 64;
    while ((int64_t)cap < 2 * n)
        cap *= 2;
    corner *tab = calloc(cap, sizeof *tab);
    if (!tab)
        return -1;
    int64_t p[CT_MAX_DIMS], q[CT_MAX_DIMS];
    size_t pbytes = sizeof(int64_t) * (size_t)nd;
    for (int64_t c = 0; c <= t->nchunks; c++)
        for (uint32_t mask = 0; mask < (1u << nd); mask++) {
            uint32_t id = (c == t->nchunks ? TENSOR_CORNER : (uint32_t)c) << 8 | mask;
            corner_point(t, dims, nd, id, p);
            int32_t sign = (__builtin_popcount(mask) & 1 ? -1 : 1) * (c == t->nchunks ? -1 : 1);
            uint64_t h = XXH3_64bits(p, pbytes) | 1;
            for (size_t i = (size_t)h & (cap - 1);; i = (i + 1) & (cap - 1)) {
                if (!tab[i].hash) {
                    tab[i] = (corner){h, id, sign};
                    break;
                }
                if (tab[i].hash != h)
                    continue;
                corner_point(t, dims, nd, tab[i].id, q);
                if (!memcmp(p, q, pbytes)) {
                    tab[i].weight += sign;
                    break;
                }
            }
        }
    bool ok = true;
    for (size_t i = 0; i < cap && ok; i++)
        ok = tab[i].weight == 0;
    free(tab);
    *tiles = ok;
    return 0;
}

int ct__manifest_check_tiling(const ck_tensor *t, const char *where) {
    char shape[CT__SHAPE_STR], a[CT__SHAPE_STR], b[CT__SHAPE_STR];
    int64_t total = box_numel(t->ndim, t->sizes), covered = 0;
    if (total < 0 || total > CK_INT_MAX)
        return ct__err_set(CT_ECORRUPT,
                           "%s: tensor '%s' %s: its number of elements overflows (more than 2^53)",
                           where, t->name, ct__tensor_shape_str(shape, t->ndim, t->sizes));
    for (int c = 0; c < t->nchunks; c++) {
        const ck_chunk *k = &t->chunks[c];
        for (int d = 0; d < t->ndim; d++)
            if (k->offsets[d] < 0 || k->sizes[d] < 0 || k->offsets[d] > t->sizes[d] - k->sizes[d])
                return ct__err_set(CT_ECORRUPT,
                                   "%s: tensor '%s' %s: chunk %d of shape %s at %s lies outside it",
                                   where, t->name, ct__tensor_shape_str(shape, t->ndim, t->sizes),
                                   c, ct__tensor_shape_str(a, t->ndim, k->sizes),
                                   ct__tensor_shape_str(b, t->ndim, k->offsets));
        /* Inside the tensor, a chunk has at most total elements. */
        if (__builtin_add_overflow(covered, box_numel(t->ndim, k->sizes), &covered))
            covered = INT64_MAX;
    }
    if (covered != total)
        return ct__err_set(
            CT_ECORRUPT, "%s: tensor '%s' %s has %lld elements, but its %d chunks cover %lld%s",
            where, t->name, ct__tensor_shape_str(shape, t->ndim, t->sizes), (long long)total,
            t->nchunks, (long long)covered, covered > total ? " (chunks overlap)" : "");
    /* With no elements, every chunk is empty and covers nothing twice. */
    if (total == 0)
        return 0;
    bool tiles = true;
    int rc = corners_tile(t, &tiles);
    if (rc < 0)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", where);
    if (rc > 0)
        return ct__err_set(CT_ECORRUPT,
                           "%s: tensor '%s' %s: %d chunks split in %d dims are more than ct checks "
                           "(%lld corners)",
                           where, t->name, ct__tensor_shape_str(shape, t->ndim, t->sizes),
                           t->nchunks, t->ndim, (long long)CORNERS_MAX);
    if (tiles)
        return 0;
    /* They cover as many elements as the tensor has, yet not each once: some
     * overlap. Name two, if a bounded search of the sweep finds them. */
    int *order = malloc(sizeof(int) * ((size_t)(unsigned)t->nchunks + 1));
    if (!order)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", where);
    for (int c = 0; c < t->nchunks; c++)
        order[c] = c;
    qsort_r(order, (size_t)t->nchunks, sizeof(int), by_offsets, (void *)t);
    int64_t budget = INT64_C(1) << 22;
    rc = 0;
    for (int i = 0; i < t->nchunks && !rc && budget > 0; i++) {
        const ck_chunk *ci = &t->chunks[order[i]];
        for (int j = i + 1; j < t->nchunks && !rc && budget-- > 0; j++) {
            const ck_chunk *cj = &t->chunks[order[j]];
            if (t->ndim > 0 && cj->offsets[0] >= ci->offsets[0] + ci->sizes[0])
                break;
            if (boxes_overlap(t->ndim, ci, cj))
                rc = ct__err_set(CT_ECORRUPT,
                                 "%s: tensor '%s': chunks %d (at %s) and %d (at %s) overlap", where,
                                 t->name, order[i], ct__tensor_shape_str(a, t->ndim, ci->offsets),
                                 order[j], ct__tensor_shape_str(b, t->ndim, cj->offsets));
        }
    }
    free(order);
    if (!rc)
        rc =
            ct__err_set(CT_ECORRUPT,
                        "%s: tensor '%s' %s: its %d chunks overlap (they cover as many elements as "
                        "it has, but not each one once)",
                        where, t->name, ct__tensor_shape_str(shape, t->ndim, t->sizes), t->nchunks);
    return rc;
}

/* -------------------------------------------------------------- parsing */

typedef struct parser {
    const char *where;
    bool partial;
} parser;

static int corrupt(const parser *p, const char *ctx, const char *what) {
    return ct__err_set(CT_ECORRUPT, "%s: %s%s%s", p->where, ctx, *ctx ? ": " : "", what);
}

/* JSON numbers are doubles: an integer field must hold an integral value
 * inside [lo, hi]. */
static int json_int(const parser *p, const char *ctx, const char *key, double d, int64_t lo,
                    int64_t hi, int64_t *out) {
    if (!(d >= (double)lo && d <= (double)hi) || d != (double)(int64_t)d) {
        char msg[200];
        snprintf(msg, sizeof msg, "'%s' is %.17g, not an integer in [%lld, %lld]", key, d,
                 (long long)lo, (long long)hi);
        return corrupt(p, ctx, msg);
    }
    *out = (int64_t)d;
    return 0;
}

static int get_int(const parser *p, const cJSON *obj, const char *key, int64_t lo, int64_t hi,
                   int64_t *out, const char *ctx) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    char msg[160];
    if (!cJSON_IsNumber(v)) {
        snprintf(msg, sizeof msg, "'%s' is missing or not a number", key);
        return corrupt(p, ctx, msg);
    }
    return json_int(p, ctx, key, v->valuedouble, lo, hi, out);
}

static const char *get_str(const parser *p, const cJSON *obj, const char *key, const char *ctx,
                           int *rc) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsString(v) || !v->valuestring) {
        char msg[160];
        snprintf(msg, sizeof msg, "'%s' is missing or not a string", key);
        *rc = corrupt(p, ctx, msg);
        return NULL;
    }
    *rc = 0;
    return v->valuestring;
}

static bool printable(const char *s, size_t max) {
    size_t n = 0;
    for (; s[n]; n++)
        if (n >= max || (unsigned char)s[n] < 0x20 || (unsigned char)s[n] > 0x7e)
            return false;
    return n > 0;
}

static int get_name(const parser *p, const cJSON *obj, const char *ctx, char **out) {
    int rc;
    const char *s = get_str(p, obj, "name", ctx, &rc);
    if (rc)
        return rc;
    if (!printable(s, CK_NAME_MAX))
        return corrupt(p, ctx, "'name' is empty, too long or not printable ASCII");
    *out = strdup(s);
    return *out ? 0 : ct__err_set(CT_ENOMEM, "%s: out of memory", p->where);
}

static int get_kind(const parser *p, const cJSON *obj, const char *ctx, ct_state_kind *out) {
    int rc;
    const char *s = get_str(p, obj, "kind", ctx, &rc);
    if (rc)
        return rc;
    for (int k = CT_STATE_REPLICATED; k <= CT_STATE_PER_RANK; k++)
        if (!strcmp(s, ct_state_kind_name((ct_state_kind)k))) {
            *out = (ct_state_kind)k;
            return 0;
        }
    char msg[200];
    snprintf(msg, sizeof msg, "unknown kind '%.64s'", s);
    return corrupt(p, ctx, msg);
}

static int get_dims(const parser *p, const cJSON *obj, const char *key, int ndim, int64_t *out,
                    const char *ctx) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(obj, key);
    char msg[200];
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != ndim) {
        snprintf(msg, sizeof msg, "'%s' is missing or not an array of %d integers", key, ndim);
        return corrupt(p, ctx, msg);
    }
    int d = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr) {
        if (!cJSON_IsNumber(v)) {
            snprintf(msg, sizeof msg, "'%s'[%d] is not a number", key, d);
            return corrupt(p, ctx, msg);
        }
        char k[64];
        snprintf(k, sizeof k, "%s[%d]", key, d);
        int rc = json_int(p, ctx, k, v->valuedouble, 0, CK_INT_MAX, &out[d]);
        if (rc)
            return rc;
        d++;
    }
    return 0;
}

static int parse_chunk(const parser *p, const ck_manifest *m, const ck_tensor *t, const cJSON *j,
                       int index, ck_chunk *c) {
    char ctx[CK_NAME_MAX + 64];
    snprintf(ctx, sizeof ctx, "tensor '%s' chunk %d", t->name, index);
    if (!cJSON_IsObject(j))
        return corrupt(p, ctx, "not an object");
    int64_t v;
    int rc = get_dims(p, j, "offsets", t->ndim, c->offsets, ctx);
    if (!rc)
        rc = get_dims(p, j, "sizes", t->ndim, c->sizes, ctx);
    if (!rc)
        rc = get_int(p, j, "rank", 0, m->world_size - 1, &v, ctx);
    if (rc)
        return rc;
    c->rank = (int)v;
    c->file = -1;
    int64_t numel = 1, nbytes;
    for (int d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow(numel, c->sizes[d], &numel))
            return corrupt(p, ctx, "its sizes overflow");
    if (__builtin_mul_overflow(numel, (int64_t)ct__esize(t->dtype), &nbytes) || nbytes > CK_INT_MAX)
        return corrupt(p, ctx, "its byte size overflows");
    if (p->partial)
        return 0;
    rc = get_int(p, j, "file", 0, m->nfiles - 1, &v, ctx);
    if (!rc)
        rc = get_int(p, j, "byte_offset", 0, CK_INT_MAX, &c->byte_offset, ctx);
    if (!rc)
        rc = get_int(p, j, "bytes", 0, CK_INT_MAX, &c->nbytes, ctx);
    if (rc)
        return rc;
    c->file = (int)v;
    char msg[300];
    if (c->nbytes != nbytes) {
        snprintf(msg, sizeof msg, "'bytes' is %lld, but %lld elements of %s take %lld",
                 (long long)c->nbytes, (long long)numel, ct_dtype_name(t->dtype),
                 (long long)nbytes);
        return corrupt(p, ctx, msg);
    }
    const ck_file *f = &m->files[c->file];
    if (c->byte_offset > f->nbytes - c->nbytes) {
        snprintf(msg, sizeof msg, "bytes [%lld, %lld) run past the end of '%s' (%lld bytes)",
                 (long long)c->byte_offset, (long long)(c->byte_offset + c->nbytes), f->name,
                 (long long)f->nbytes);
        return corrupt(p, ctx, msg);
    }
    const char *hex = get_str(p, j, "xxh3", ctx, &rc);
    if (rc)
        return rc;
    char *end = NULL;
    errno = 0;
    c->xxh3 = strtoull(hex, &end, 16);
    if (strlen(hex) != 16 || *end || errno || hex[0] == '-' || hex[0] == '+')
        return corrupt(p, ctx, "'xxh3' is not 16 hex digits");
    return 0;
}

static int parse_tensor(const parser *p, const ck_manifest *m, const cJSON *j, int index,
                        ck_tensor *t) {
    char ctx[CK_NAME_MAX + 64];
    snprintf(ctx, sizeof ctx, "tensor %d", index);
    if (!cJSON_IsObject(j))
        return corrupt(p, ctx, "not an object");
    int rc = get_name(p, j, ctx, &t->name);
    if (rc)
        return rc;
    snprintf(ctx, sizeof ctx, "tensor '%s'", t->name);
    const char *dt = get_str(p, j, "dtype", ctx, &rc);
    if (rc)
        return rc;
    t->dtype = CT_NDTYPES;
    for (int d = 0; d < CT_NDTYPES; d++)
        if (!strcmp(dt, ct_dtype_name((ct_dtype)d)))
            t->dtype = (ct_dtype)d;
    if (t->dtype == CT_NDTYPES) {
        char msg[200];
        snprintf(msg, sizeof msg, "unknown dtype '%.64s'", dt);
        return corrupt(p, ctx, msg);
    }
    rc = get_kind(p, j, ctx, &t->kind);
    if (rc)
        return rc;
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > CT_MAX_DIMS)
        return corrupt(p, ctx, "'shape' is missing, not an array, or has more than 8 dims");
    t->ndim = cJSON_GetArraySize(shape);
    rc = get_dims(p, j, "shape", t->ndim, t->sizes, ctx);
    if (rc)
        return rc;
    const cJSON *chunks = cJSON_GetObjectItemCaseSensitive(j, "chunks");
    if (!cJSON_IsArray(chunks))
        return corrupt(p, ctx, "'chunks' is missing or not an array");
    int n = cJSON_GetArraySize(chunks);
    t->chunks = calloc((size_t)(n ? n : 1), sizeof *t->chunks);
    if (!t->chunks)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", p->where);
    const cJSON *c;
    cJSON_ArrayForEach(c, chunks) {
        rc = parse_chunk(p, m, t, c, t->nchunks, &t->chunks[t->nchunks]);
        if (rc)
            return rc;
        t->nchunks++;
    }
    if (t->kind != CT_STATE_PER_RANK)
        return p->partial ? 0 : ct__manifest_check_tiling(t, p->where);
    /* Per-rank: every rank's whole tensor, once each. */
    if (!p->partial && t->nchunks != m->world_size) {
        char msg[160];
        snprintf(msg, sizeof msg, "a per-rank tensor needs one chunk per rank (%d), not %d",
                 m->world_size, t->nchunks);
        return corrupt(p, ctx, msg);
    }
    bool *seen = calloc((size_t)m->world_size, sizeof *seen);
    if (!seen)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", p->where);
    for (int i = 0; i < t->nchunks && !rc; i++) {
        const ck_chunk *k = &t->chunks[i];
        for (int d = 0; d < t->ndim && !rc; d++)
            if (k->offsets[d] != 0 || k->sizes[d] != t->sizes[d])
                rc = corrupt(p, ctx, "a per-rank chunk is not the whole tensor");
        if (!rc && seen[k->rank]) {
            char msg[96];
            snprintf(msg, sizeof msg, "rank %d has two chunks", k->rank);
            rc = corrupt(p, ctx, msg);
        }
        seen[k->rank] = true;
    }
    free(seen);
    return rc;
}

static int get_type(const parser *p, const cJSON *j, const char *ctx, ck_type *out) {
    int rc;
    const char *s = get_str(p, j, "type", ctx, &rc);
    if (rc)
        return rc;
    for (int k = CK_INT64; k < CK_NTYPES; k++)
        if (!strcmp(s, ct__ckpt_type_names[k])) {
            *out = (ck_type)k;
            return 0;
        }
    char msg[200];
    snprintf(msg, sizeof msg, "unknown type '%.64s'", s);
    return corrupt(p, ctx, msg);
}

static int take_text(const parser *p, const cJSON *v, ck_type type, const char *ctx, char **out) {
    char scratch[8];
    if (cJSON_IsNull(v))
        return 0;
    if (!cJSON_IsString(v) || !ct__ckpt_value_parse(type, v->valuestring, scratch)) {
        char msg[96];
        snprintf(msg, sizeof msg, "a value that is not a %s in text", ct__ckpt_type_names[type]);
        return corrupt(p, ctx, msg);
    }
    *out = strdup(v->valuestring);
    return *out ? 0 : ct__err_set(CT_ENOMEM, "%s: out of memory", p->where);
}

static int parse_value(const parser *p, const ck_manifest *m, const cJSON *j, int index,
                       ck_value *v) {
    char ctx[CK_NAME_MAX + 64];
    snprintf(ctx, sizeof ctx, "value %d", index);
    if (!cJSON_IsObject(j))
        return corrupt(p, ctx, "not an object");
    int rc = get_name(p, j, ctx, &v->name);
    if (rc)
        return rc;
    snprintf(ctx, sizeof ctx, "value '%s'", v->name);
    rc = get_type(p, j, ctx, &v->type);
    if (!rc)
        rc = get_kind(p, j, ctx, &v->kind);
    if (rc)
        return rc;
    if (v->kind == CT_STATE_SHARDED)
        return corrupt(p, ctx, "values are replicated or per_rank, not sharded");
    bool many = v->kind == CT_STATE_PER_RANK && !p->partial;
    const cJSON *texts = cJSON_GetObjectItemCaseSensitive(j, many ? "values" : "value");
    if (many && (!cJSON_IsArray(texts) || cJSON_GetArraySize(texts) != m->world_size)) {
        char msg[96];
        snprintf(msg, sizeof msg, "'values' is missing or not an array of %d", m->world_size);
        return corrupt(p, ctx, msg);
    }
    v->ntexts = many ? m->world_size : 1;
    v->texts = calloc((size_t)v->ntexts, sizeof(char *));
    if (!v->texts)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", p->where);
    if (!many) {
        if (!cJSON_IsString(texts))
            return corrupt(p, ctx, "'value' is missing or not a string");
        return take_text(p, texts, v->type, ctx, &v->texts[0]);
    }
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, texts) {
        rc = take_text(p, t, v->type, ctx, &v->texts[i++]);
        if (rc)
            return rc;
    }
    return 0;
}

/* Format 1.1's block checksums of a file: "block_bytes" and "xxh3_blocks",
 * 16 hex digits per block, as many blocks as the file's size needs. */
static int parse_blocks(const parser *p, const cJSON *f, const char *ctx, ck_file *file) {
    int rc = get_int(p, f, "block_bytes", CK_ALIGN, INT64_C(1) << 30, &file->block_bytes, ctx);
    if (rc)
        return rc;
    const char *hex = get_str(p, f, "xxh3_blocks", ctx, &rc);
    if (rc)
        return rc;
    int64_t n = (file->nbytes + file->block_bytes - 1) / file->block_bytes;
    if ((int64_t)strlen(hex) != 16 * n) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "'xxh3_blocks' holds %zu hex digits, not 16 for each of its %lld "
                 "blocks of %lld bytes",
                 strlen(hex), (long long)n, (long long)file->block_bytes);
        return corrupt(p, ctx, msg);
    }
    file->blocks = malloc(sizeof(uint64_t) * (size_t)(n + 1));
    if (!file->blocks)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", p->where);
    for (int64_t b = 0; b < n; b++) {
        uint64_t v = 0;
        for (int k = 0; k < 16; k++) {
            char ch = hex[16 * b + k];
            int x = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
            if (x < 0)
                return corrupt(p, ctx,
                               "'xxh3_blocks' holds a character that is not a lower-case "
                               "hex digit");
            v = v << 4 | (uint64_t)x;
        }
        file->blocks[b] = v;
    }
    file->nblocks = n;
    return 0;
}

static int parse_files(const parser *p, const cJSON *root, ck_manifest *m) {
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    if (!cJSON_IsArray(files))
        return corrupt(p, "", "'files' is missing or not an array");
    int n = cJSON_GetArraySize(files);
    m->files = calloc((size_t)(n ? n : 1), sizeof *m->files);
    if (!m->files)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", p->where);
    ck_names names = {0};
    int rc = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, files) {
        char ctx[64];
        snprintf(ctx, sizeof ctx, "file %d", m->nfiles);
        if (!cJSON_IsObject(f)) {
            rc = corrupt(p, ctx, "not an object");
            break;
        }
        ck_file *file = &m->files[m->nfiles];
        rc = get_name(p, f, ctx, &file->name);
        if (rc)
            break;
        m->nfiles++;
        /* A file name is a name in the checkpoint's directory, never a
         * path. */
        if (strchr(file->name, '/') || !strcmp(file->name, ".") || !strcmp(file->name, "..")) {
            rc = corrupt(p, ctx, "its name is a path, not a file name");
            break;
        }
        int seen = names_add(&names, file->name, m->nfiles - 1);
        if (seen != -1) {
            free(names.names);
            free(names.index);
            return seen == -2 ? ct__err_set(CT_ENOMEM, "%s: out of memory", p->where)
                              : corrupt(p, ctx, "its name appears twice");
        }
        rc = get_int(p, f, "bytes", 0, CK_INT_MAX, &file->nbytes, ctx);
        if (!rc && m->minor >= 1)
            rc = parse_blocks(p, f, ctx, file);
        if (rc)
            break;
    }
    free(names.names);
    free(names.index);
    return rc;
}

static int parse_meta(const parser *p, const cJSON *root, ck_manifest *m) {
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    if (!meta)
        return 0;
    if (!cJSON_IsObject(meta))
        return corrupt(p, "", "'metadata' is not an object");
    int n = cJSON_GetArraySize(meta);
    m->meta = calloc((size_t)(2 * n + 1), sizeof(char *));
    if (!m->meta)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", p->where);
    ck_names keys = {0};
    const cJSON *kv;
    int rc = 0;
    cJSON_ArrayForEach(kv, meta) {
        if (!cJSON_IsString(kv) || !kv->string || !printable(kv->string, CK_NAME_MAX)) {
            rc = corrupt(p, "metadata",
                         "a key that is not printable ASCII, or a value that is not a string");
            break;
        }
        int seen = names_add(&keys, kv->string, m->nmeta);
        if (seen != -1) {
            rc = seen == -2 ? ct__err_set(CT_ENOMEM, "%s: out of memory", p->where)
                            : corrupt(p, "metadata", "a key appears twice");
            break;
        }
        m->meta[2 * m->nmeta] = strdup(kv->string);
        m->meta[2 * m->nmeta + 1] = strdup(kv->valuestring);
        m->nmeta++;
        if (!m->meta[2 * m->nmeta - 2] || !m->meta[2 * m->nmeta - 1]) {
            rc = ct__err_set(CT_ENOMEM, "%s: out of memory", p->where);
            break;
        }
    }
    free(keys.names);
    free(keys.index);
    return rc;
}

/* The version first: a newer format may have changed everything else, and
 * its reader deserves "too new", not "corrupt". */
static int parse_version(const parser *p, const cJSON *root, ck_manifest *m) {
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(format) || strcmp(format->valuestring, CK_FORMAT_NAME))
        return corrupt(p, "",
                       "not a ct checkpoint manifest ('format' is not \"" CK_FORMAT_NAME "\")");
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "version");
    if (!cJSON_IsObject(version))
        return corrupt(p, "", "'version' is missing or not an object");
    int64_t major, minor;
    int rc = get_int(p, version, "major", 1, INT32_MAX, &major, "version");
    if (!rc)
        rc = get_int(p, version, "minor", 0, INT32_MAX, &minor, "version");
    if (rc)
        return rc;
    m->major = (int)major;
    m->minor = (int)minor;
    const cJSON *writer = cJSON_GetObjectItemCaseSensitive(root, "writer");
    const char *by = cJSON_IsString(writer) ? writer->valuestring : "an unknown writer";
    if (major > CK_FORMAT_MAJOR)
        return ct__err_set(CT_EVERSION,
                           "%s: format version %d.%d (written by %.64s) is newer than this ct "
                           "reads: ct %s reads format versions 1.0 to %d.x; upgrade ct to load it",
                           p->where, m->major, m->minor, by, CT_VERSION_STRING, CK_FORMAT_MAJOR);
    const cJSON *features = cJSON_GetObjectItemCaseSensitive(root, "required_features");
    if (!cJSON_IsArray(features))
        return corrupt(p, "", "'required_features' is missing or not an array");
    const cJSON *f;
    cJSON_ArrayForEach(f, features) {
        if (!cJSON_IsString(f))
            return corrupt(p, "required_features", "an entry that is not a string");
        /* Format 1.0 defines no features: any required one is unknown. */
        return ct__err_set(CT_EVERSION,
                           "%s: the checkpoint (format %d.%d, written by %.64s) requires feature "
                           "'%.64s', which ct %s (format %d.%d) does not know; upgrade ct to load "
                           "it",
                           p->where, m->major, m->minor, by, f->valuestring, CT_VERSION_STRING,
                           CK_FORMAT_MAJOR, CK_FORMAT_MINOR);
    }
    m->writer = strdup(by);
    return m->writer ? 0 : ct__err_set(CT_ENOMEM, "%s: out of memory", p->where);
}

static int parse_root(const parser *p, const cJSON *root, ck_manifest *m) {
    if (!cJSON_IsObject(root))
        return corrupt(p, "", "the manifest is not a JSON object");
    int rc = parse_version(p, root, m);
    int64_t v;
    if (!rc)
        rc = get_int(p, root, "world_size", 1, INT32_MAX, &v, "");
    if (rc)
        return rc;
    m->world_size = (int)v;
    m->step = -1;
    if (cJSON_GetObjectItemCaseSensitive(root, "step")) {
        rc = get_int(p, root, "step", -1, CK_INT_MAX, &m->step, "");
        if (rc)
            return rc;
    }
    if (!p->partial) {
        rc = parse_files(p, root, m);
        if (rc)
            return rc;
    }
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    const cJSON *values = cJSON_GetObjectItemCaseSensitive(root, "values");
    if (!cJSON_IsArray(tensors) || !cJSON_IsArray(values))
        return corrupt(p, "", "'tensors' or 'values' is missing or not an array");
    int nt = cJSON_GetArraySize(tensors), nv = cJSON_GetArraySize(values);
    m->tensors = calloc((size_t)(nt ? nt : 1), sizeof *m->tensors);
    m->values = calloc((size_t)(nv ? nv : 1), sizeof *m->values);
    if (!m->tensors || !m->values)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", p->where);
    const cJSON *j;
    cJSON_ArrayForEach(j, tensors) {
        ck_tensor *t = &m->tensors[m->ntensors++];
        rc = parse_tensor(p, m, j, m->ntensors - 1, t);
        if (rc)
            return rc;
        int seen = names_add(&m->tensor_names, t->name, m->ntensors - 1);
        if (seen == -2)
            return ct__err_set(CT_ENOMEM, "%s: out of memory", p->where);
        if (seen != -1)
            return corrupt(p, t->name, "two tensors have this name");
    }
    cJSON_ArrayForEach(j, values) {
        ck_value *val = &m->values[m->nvalues++];
        rc = parse_value(p, m, j, m->nvalues - 1, val);
        if (rc)
            return rc;
        int seen = names_add(&m->value_names, val->name, m->nvalues - 1);
        if (seen == -2)
            return ct__err_set(CT_ENOMEM, "%s: out of memory", p->where);
        if (seen != -1)
            return corrupt(p, val->name, "two values have this name");
    }
    return parse_meta(p, root, m);
}

cJSON *ct__ckpt_json_parse(const char *text, size_t len, const char **end) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, end, false);
    pthread_mutex_unlock(&lock);
    return root;
}

int ct__manifest_parse(const char *text, size_t len, const char *where, bool partial,
                       ck_manifest **out) {
    *out = NULL;
    parser p = {where, partial};
    ck_manifest *m = calloc(1, sizeof *m);
    if (!m)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", where);
    m->partial = partial;
    const char *at = NULL;
    cJSON *root = ct__ckpt_json_parse(text, len, &at);
    int rc;
    if (!root) {
        size_t off = at && at >= text && at <= text + len ? (size_t)(at - text) : len;
        rc = ct__err_set(CT_ECORRUPT, "%s: not valid JSON (near byte %zu)", where, off);
    } else {
        rc = parse_root(&p, root, m);
    }
    cJSON_Delete(root);
    if (rc) {
        ct__manifest_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

int ct__manifest_read_at(int dirfd, const char *path, ck_manifest **out) {
    *out = NULL;
    size_t plen = strlen(path) + sizeof("/" CK_MANIFEST);
    char *file = malloc(plen);
    if (!file)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", path);
    snprintf(file, plen, "%s/" CK_MANIFEST, path);
    char *text = NULL;
    bool missing = false;
    int fd = ct__ckpt_open_regular(dirfd, CK_MANIFEST, file, &missing);
    int rc = fd < 0 ? fd : 0;
    struct stat sb = {0};
    if (missing)
        rc = ct__err_set(CT_EIO, "%s: %s (not a committed ct checkpoint)", file, strerror(ENOENT));
    else if (!rc && fstat(fd, &sb) != 0)
        rc = ct__err_set(CT_EIO, "%s: %s", file, strerror(errno));
    else if (!rc && sb.st_size > MANIFEST_MAX_BYTES)
        rc = ct__err_set(CT_ECORRUPT, "%s: %lld bytes, more than a manifest may hold (%lld)", file,
                         (long long)sb.st_size, (long long)MANIFEST_MAX_BYTES);
    else if (!rc && !(text = malloc((size_t)sb.st_size + 1)))
        rc = ct__err_set(CT_ENOMEM, "%s: out of memory", file);
    else if (!rc)
        rc = ct__file_pread_all(fd, text, (size_t)sb.st_size, 0, file);
    if (fd >= 0)
        close(fd);
    if (!rc)
        rc = ct__manifest_parse(text, (size_t)sb.st_size, file, false, out);
    if (!rc)
        (*out)->text_xxh3 = XXH3_64bits(text, (size_t)sb.st_size);
    free(text);
    free(file);
    return rc;
}

int ct__manifest_read(const char *path, ck_manifest **out) {
    *out = NULL;
    int dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return ct__err_set(CT_EIO, "%s: %s%s", path, strerror(errno),
                           errno == ENOENT || errno == ENOTDIR ? " (not a committed ct checkpoint)"
                                                               : "");
    int rc = ct__manifest_read_at(dirfd, path, out);
    close(dirfd);
    return rc;
}

/* -------------------------------------------------------------- writing */

static cJSON *dims(int ndim, const int64_t *v) {
    cJSON *a = cJSON_CreateArray();
    for (int d = 0; a && d < ndim; d++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[d]));
    return a;
}

static void emit_chunk(cJSON *arr, const ck_manifest *m, const ck_tensor *t, const ck_chunk *c) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, j);
    cJSON_AddItemToObject(j, "offsets", dims(t->ndim, c->offsets));
    cJSON_AddItemToObject(j, "sizes", dims(t->ndim, c->sizes));
    cJSON_AddNumberToObject(j, "rank", c->rank);
    if (m->partial)
        return;
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)c->xxh3);
    cJSON_AddNumberToObject(j, "file", c->file);
    cJSON_AddNumberToObject(j, "byte_offset", (double)c->byte_offset);
    cJSON_AddNumberToObject(j, "bytes", (double)c->nbytes);
    cJSON_AddStringToObject(j, "xxh3", hex);
}

static void emit_value(cJSON *arr, const ck_manifest *m, const ck_value *v) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToArray(arr, j);
    cJSON_AddStringToObject(j, "name", v->name);
    cJSON_AddStringToObject(j, "type", ct__ckpt_type_names[v->type]);
    cJSON_AddStringToObject(j, "kind", ct_state_kind_name(v->kind));
    if (v->kind != CT_STATE_PER_RANK || m->partial) {
        cJSON_AddStringToObject(j, "value", v->texts[0]);
        return;
    }
    cJSON *texts = cJSON_AddArrayToObject(j, "values");
    for (int i = 0; i < v->ntexts; i++)
        cJSON_AddItemToArray(texts,
                             v->texts[i] ? cJSON_CreateString(v->texts[i]) : cJSON_CreateNull());
}

char *ct__manifest_emit(const ck_manifest *m) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "format", CK_FORMAT_NAME);
    cJSON *version = cJSON_AddObjectToObject(root, "version");
    cJSON_AddNumberToObject(version, "major", m->major);
    cJSON_AddNumberToObject(version, "minor", m->minor);
    cJSON_AddStringToObject(root, "writer", m->writer);
    cJSON_AddArrayToObject(root, "required_features");
    cJSON_AddNumberToObject(root, "world_size", m->world_size);
    if (m->step >= 0)
        cJSON_AddNumberToObject(root, "step", (double)m->step);
    if (!m->partial) {
        cJSON *files = cJSON_AddArrayToObject(root, "files");
        for (int i = 0; i < m->nfiles; i++) {
            cJSON *f = cJSON_CreateObject();
            cJSON_AddItemToArray(files, f);
            const ck_file *file = &m->files[i];
            cJSON_AddStringToObject(f, "name", file->name);
            cJSON_AddNumberToObject(f, "bytes", (double)file->nbytes);
            if (!file->nblocks && file->nbytes)
                continue;
            char *hex = malloc(16 * (size_t)file->nblocks + 1);
            if (!hex) {
                cJSON_Delete(root);
                ct__err_set(CT_ENOMEM, "writing a checkpoint manifest: out of memory");
                return NULL;
            }
            hex[0] = '\0';
            for (int64_t b = 0; b < file->nblocks; b++)
                snprintf(hex + 16 * b, 17, "%016llx", (unsigned long long)file->blocks[b]);
            cJSON_AddNumberToObject(f, "block_bytes", (double)file->block_bytes);
            cJSON_AddStringToObject(f, "xxh3_blocks", hex);
            free(hex);
        }
    }
    cJSON *tensors = cJSON_AddArrayToObject(root, "tensors");
    for (int i = 0; i < m->ntensors; i++) {
        const ck_tensor *t = &m->tensors[i];
        cJSON *j = cJSON_CreateObject();
        cJSON_AddItemToArray(tensors, j);
        cJSON_AddStringToObject(j, "name", t->name);
        cJSON_AddStringToObject(j, "dtype", ct_dtype_name(t->dtype));
        cJSON_AddStringToObject(j, "kind", ct_state_kind_name(t->kind));
        cJSON_AddItemToObject(j, "shape", dims(t->ndim, t->sizes));
        cJSON *chunks = cJSON_AddArrayToObject(j, "chunks");
        for (int c = 0; c < t->nchunks; c++)
            emit_chunk(chunks, m, t, &t->chunks[c]);
    }
    cJSON *values = cJSON_AddArrayToObject(root, "values");
    for (int i = 0; i < m->nvalues; i++)
        emit_value(values, m, &m->values[i]);
    cJSON *meta = cJSON_AddObjectToObject(root, "metadata");
    for (int i = 0; i < m->nmeta; i++)
        cJSON_AddStringToObject(meta, m->meta[2 * i], m->meta[2 * i + 1]);
    /* cJSON reports allocation failures only through the result. */
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text)
        ct__err_set(CT_ENOMEM, "writing a checkpoint manifest: out of memory");
    return text;
}
