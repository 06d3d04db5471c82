/* ct_state: the named entries a checkpoint saves and loads. */
#include "checkpoint_impl.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE_MAGIC 0x63745374u /* "ctSt" */

const char *const ct__ckpt_type_names[CK_NTYPES] = {"tensor", "int64", "uint64", "float64"};

const char *ct_state_kind_name(ct_state_kind kind) {
    switch (kind) {
    case CT_STATE_REPLICATED: return "replicated";
    case CT_STATE_SHARDED: return "sharded";
    case CT_STATE_PER_RANK: return "per_rank";
    }
    return "unknown";
}

int ct__ckpt_state_check(const ct_state *st, const char *fn) {
    if (!st)
        return ct__err_set(CT_EINVAL, "%s: the state is NULL", fn);
    if (st->magic != STATE_MAGIC)
        return ct__err_set(CT_EINVAL, "%s: %p is not a live ct_state (freed or foreign)", fn,
                           (const void *)st);
    return 0;
}

ct_state *ct_state_new(void) {
    ct_state *st = calloc(1, sizeof *st);
    if (!st) {
        ct__err_set(CT_ENOMEM, "ct_state_new: out of memory");
        return NULL;
    }
    st->magic = STATE_MAGIC;
    return st;
}

static void free_meta(ct_state *st) {
    for (int i = 0; i < 2 * st->nmeta; i++)
        free(st->meta[i]);
    free(st->meta);
    st->meta = NULL;
    st->nmeta = 0;
}

void ct_state_free(ct_state *st) {
    if (!st)
        return;
    CT_ASSERT(st->magic == STATE_MAGIC && "ct_state_free: not a live state");
    for (int i = 0; i < st->n; i++) {
        free(st->entries[i].name);
        ct_tensor_free(st->entries[i].t);
    }
    free(st->entries);
    free_meta(st);
    st->magic = 0;
    free(st);
}

int ct_state_num_entries(const ct_state *st) {
    int rc = ct__ckpt_state_check(st, "ct_state_num_entries");
    return rc ? rc : st->n;
}

/* Names are what a user reads back in ctckpt info and in every message, so
 * they stay printable. */
static int check_name(const char *fn, const char *what, const char *name) {
    if (!name || !*name)
        return ct__err_set(CT_EINVAL, "%s: the %s is NULL or empty", fn, what);
    size_t len = strnlen(name, CK_NAME_MAX + 1);
    if (len > CK_NAME_MAX)
        return ct__err_set(CT_EINVAL, "%s: the %s '%.40s...' is longer than %d bytes", fn, what,
                           name, CK_NAME_MAX);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)name[i] < 0x20 || (unsigned char)name[i] > 0x7e)
            return ct__err_set(CT_EINVAL,
                               "%s: the %s '%s' holds byte 0x%02x at %zu; names are printable "
                               "ASCII",
                               fn, what, name, (unsigned char)name[i], i);
    return 0;
}

/* Checks the handle and the name, and appends a zeroed entry named name. */
static ck_entry *add_entry(ct_state *st, const char *fn, const char *name, ct_state_kind kind,
                           ck_type type) {
    if (ct__ckpt_state_check(st, fn) || check_name(fn, "entry name", name))
        return NULL;
    bool tensor = type == CK_TENSOR;
    if (kind != CT_STATE_REPLICATED && kind != CT_STATE_PER_RANK &&
        !(tensor && kind == CT_STATE_SHARDED)) {
        ct__err_set(
            CT_EINVAL, "%s: '%s': kind %d is not CT_STATE_REPLICATED or CT_STATE_PER_RANK%s", fn,
            name, (int)kind, tensor ? " (sharded tensors are added with ct_state_add_shard)" : "");
        return NULL;
    }
    /* A sharded tensor may take several blocks of this rank's under its
     * name (ct_state_add_shard checks that they agree). */
    for (int i = 0; i < st->n; i++)
        if (!strcmp(st->entries[i].name, name) &&
            !(kind == CT_STATE_SHARDED && st->entries[i].kind == CT_STATE_SHARDED)) {
            ct__err_set(CT_EINVAL, "%s: the state already has an entry named '%s'", fn, name);
            return NULL;
        }
    if (CT__GROW(st->entries, &st->cap, st->n + 1, 0, fn))
        return NULL;
    char *copy = strdup(name);
    if (!copy) {
        ct__err_set(CT_ENOMEM, "%s: out of memory", fn);
        return NULL;
    }
    ck_entry *e = &st->entries[st->n++];
    *e = (ck_entry){.name = copy, .kind = kind, .type = type};
    return e;
}

static int add_tensor(ct_state *st, const char *fn, const char *name, ct_tensor *t,
                      ct_state_kind kind, int ndim, const int64_t *global, const int64_t *offsets) {
    int rc = CT__CHECK_ANY(fn, t);
    if (rc)
        return rc;
    ck_entry *e = add_entry(st, fn, name, kind, CK_TENSOR);
    if (!e)
        return ct_errcode();
    e->t = ct_tensor_retain(t);
    e->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        e->global[d] = global[d];
        e->offsets[d] = offsets ? offsets[d] : 0;
    }
    return 0;
}

int ct_state_add_tensor(ct_state *st, const char *name, ct_tensor *t, ct_state_kind kind) {
    if (!t)
        return ct__err_set(CT_EINVAL, "ct_state_add_tensor: '%s': the tensor is NULL",
                           name ? name : "(null)");
    return add_tensor(st, "ct_state_add_tensor", name, t, kind, ct_ndim(t), ct_sizes(t), NULL);
}

int ct_state_add_shard(ct_state *st, const char *name, ct_tensor *local, int ndim,
                       const int64_t *global_sizes, const int64_t *offsets) {
    const char *fn = "ct_state_add_shard";
    const char *nm = name ? name : "(null)";
    if (!local || !global_sizes || !offsets)
        return ct__err_set(CT_EINVAL, "%s: '%s': the tensor, global_sizes or offsets is NULL", fn,
                           nm);
    if (ndim < 0 || ndim > CT_MAX_DIMS || ndim != ct_ndim(local))
        return ct__err_set(CT_ESHAPE, "%s: '%s': ndim %d, but the local tensor has %d dims", fn, nm,
                           ndim, ct_ndim(local));
    int rc = ct__tensor_check_shape(fn, ndim, global_sizes, ct_tensor_dtype(local));
    if (rc)
        return rc;
    for (int d = 0; d < ndim; d++)
        if (offsets[d] < 0 || offsets[d] > global_sizes[d] - ct_sizes(local)[d]) {
            char g[CT__SHAPE_STR], o[CT__SHAPE_STR], l[CT__SHAPE_STR];
            return ct__err_set(CT_ESHAPE,
                               "%s: '%s': a block of shape %s at offsets %s does not fit in the "
                               "global shape %s (dim %d)",
                               fn, nm, ct__tensor_shape_str(l, ndim, ct_sizes(local)),
                               ct__tensor_shape_str(o, ndim, offsets),
                               ct__tensor_shape_str(g, ndim, global_sizes), d);
        }
    for (int i = 0; st && st->magic == STATE_MAGIC && i < st->n; i++) {
        const ck_entry *e = &st->entries[i];
        if (strcmp(e->name, nm) || e->kind != CT_STATE_SHARDED)
            continue;
        if (e->ndim != ndim || memcmp(e->global, global_sizes, sizeof(int64_t) * (size_t)ndim) ||
            ct_tensor_dtype(e->t) != ct_tensor_dtype(local)) {
            char a[CT__SHAPE_STR], b[CT__SHAPE_STR];
            return ct__err_set(CT_EINVAL,
                               "%s: '%s': another block of it is %s%s; this one says %s%s (the "
                               "blocks of one tensor share its dtype and global shape)",
                               fn, nm, ct_dtype_name(ct_tensor_dtype(e->t)),
                               ct__tensor_shape_str(a, e->ndim, e->global),
                               ct_dtype_name(ct_tensor_dtype(local)),
                               ct__tensor_shape_str(b, ndim, global_sizes));
        }
    }
    return add_tensor(st, fn, name, local, CT_STATE_SHARDED, ndim, global_sizes, offsets);
}

/* A flat shard's cover: the row-major elements [lo, hi) of a tensor of
 * shape (ndim, sizes) and strides strides, as boxes, each a block viewing
 * flat (element k: the tensor's element flat_lo + k). Within the rows of
 * dim depth (those of dims below it fixed at off[0 .. depth - 1], which
 * start at element base): a partial first row, the whole rows as one box,
 * a partial last row, so at most 2 ndim - 1 boxes in all. */
typedef struct flat_cover {
    ct_state *st;
    const char *name;
    ct_tensor *flat;
    int64_t flat_lo;
    int ndim;
    const int64_t *sizes, *strides;
    int64_t off[CT_MAX_DIMS];
} flat_cover;

static int cover_box(flat_cover *c, int depth, int64_t first, int64_t rows) {
    int64_t offs[CT_MAX_DIMS], box[CT_MAX_DIMS], at = -c->flat_lo;
    for (int d = 0; d < c->ndim; d++) {
        offs[d] = d < depth ? c->off[d] : d == depth ? first : 0;
        box[d] = d < depth ? 1 : d == depth ? rows : c->sizes[d];
        at += offs[d] * c->strides[d];
    }
    ct_tensor *v = ct__tensor_own(
        ct_tensor_from_storage(ct_tensor_storage(c->flat), ct_tensor_offset(c->flat) + at, c->ndim,
                               box, c->strides, ct_tensor_dtype(c->flat)));
    int rc = v ? ct_state_add_shard(c->st, c->name, v, c->ndim, c->sizes, offs) : ct_errcode();
    ct_tensor_free(v);
    return rc;
}

static int cover(flat_cover *c, int depth, int64_t base, int64_t lo, int64_t hi) {
    if (lo >= hi)
        return 0;
    if (c->ndim == 0)
        return cover_box(c, 0, 0, 1);
    int64_t row = c->strides[depth], i0 = (lo - base) / row, i1 = (hi - base) / row;
    if (depth == c->ndim - 1)
        return cover_box(c, depth, lo - base, hi - lo);
    if ((lo - base) % row || i0 == i1) {
        int64_t end = base + (i0 + 1) * row < hi ? base + (i0 + 1) * row : hi;
        c->off[depth] = i0;
        CT_TRY(cover(c, depth + 1, base + i0 * row, lo, end));
        lo = end;
        i0++;
    }
    if (i1 > i0 && lo < hi)
        CT_TRY(cover_box(c, depth, i0, i1 - i0));
    if (base + i1 * row < hi && base + i1 * row >= lo) {
        c->off[depth] = i1;
        CT_TRY(cover(c, depth + 1, base + i1 * row, base + i1 * row, hi));
    }
    return 0;
}

int ct_state_add_flat_shard(ct_state *st, const char *name, ct_tensor *flat, int ndim,
                            const int64_t *global_sizes, int64_t offset) {
    const char *fn = "ct_state_add_flat_shard";
    const char *nm = name ? name : "(null)";
    if (!flat || (!global_sizes && ndim > 0))
        return ct__err_set(CT_EINVAL, "%s: '%s': the tensor or global_sizes is NULL", fn, nm);
    CT_TRY(CT__CHECK_ANY(fn, flat));
    if (ndim < 0 || ndim > CT_MAX_DIMS)
        return ct__err_set(CT_ESHAPE, "%s: '%s': ndim %d is outside [0, %d]", fn, nm, ndim,
                           CT_MAX_DIMS);
    CT_TRY(ct__tensor_check_shape(fn, ndim, global_sizes, ct_tensor_dtype(flat)));
    int64_t total = ct__tensor_numel(ndim, global_sizes), n = ct_numel(flat);
    if (ct_ndim(flat) != 1 || (n > 1 && ct_strides(flat)[0] != 1))
        return ct__err_set(CT_ESHAPE, "%s: '%s': the shard is not a contiguous 1-d tensor", fn, nm);
    if (offset < 0 || offset > total - n)
        return ct__err_set(CT_ESHAPE,
                           "%s: '%s': elements [%lld, %lld) are outside the %lld of the tensor", fn,
                           nm, (long long)offset, (long long)(offset + n), (long long)total);
    flat_cover c = {st, name, flat, offset, ndim, global_sizes, NULL, {0}};
    int64_t strides[CT_MAX_DIMS], acc = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = acc;
        acc *= global_sizes[d];
    }
    c.strides = strides;
    c.sizes = ndim ? global_sizes : strides; /* a 0-d tensor's: never read, but not NULL */
    return cover(&c, 0, 0, offset, offset + n);
}

static int add_value(ct_state *st, const char *fn, const char *name, void *value,
                     ct_state_kind kind, ck_type type) {
    if (!value)
        return ct__err_set(CT_EINVAL, "%s: '%s': the value pointer is NULL", fn,
                           name ? name : "(null)");
    ck_entry *e = add_entry(st, fn, name, kind, type);
    if (!e)
        return ct_errcode();
    e->value = value;
    return 0;
}

int ct_state_add_i64(ct_state *st, const char *name, int64_t *value, ct_state_kind kind) {
    return add_value(st, "ct_state_add_i64", name, value, kind, CK_INT64);
}

int ct_state_add_u64(ct_state *st, const char *name, uint64_t *value, ct_state_kind kind) {
    return add_value(st, "ct_state_add_u64", name, value, kind, CK_UINT64);
}

int ct_state_add_f64(ct_state *st, const char *name, double *value, ct_state_kind kind) {
    return add_value(st, "ct_state_add_f64", name, value, kind, CK_FLOAT64);
}

int ct_state_add_generator(ct_state *st, const char *name, ct_generator *gen, ct_state_kind kind) {
    const char *fn = "ct_state_add_generator";
    if (!gen)
        return ct__err_set(CT_EINVAL, "%s: '%s': the generator is NULL", fn,
                           name ? name : "(null)");
    int rc = check_name(fn, "entry name", name);
    if (rc)
        return rc;
    char key[CK_NAME_MAX + 16];
    snprintf(key, sizeof key, "%s.seed", name);
    rc = add_value(st, fn, key, &gen->seed, kind, CK_UINT64);
    if (rc)
        return rc;
    snprintf(key, sizeof key, "%s.offset", name);
    rc = add_value(st, fn, key, &gen->offset, kind, CK_UINT64);
    if (rc) {
        st->n--;
        free(st->entries[st->n].name);
    }
    return rc;
}

static int find_meta(const ct_state *st, const char *key) {
    for (int i = 0; i < st->nmeta; i++)
        if (!strcmp(st->meta[2 * i], key))
            return i;
    return -1;
}

int ct_state_set_meta(ct_state *st, const char *key, const char *value) {
    const char *fn = "ct_state_set_meta";
    int rc = ct__ckpt_state_check(st, fn);
    if (!rc)
        rc = check_name(fn, "metadata key", key);
    if (rc)
        return rc;
    int i = find_meta(st, key);
    if (!value) {
        if (i >= 0) {
            free(st->meta[2 * i]);
            free(st->meta[2 * i + 1]);
            st->nmeta--;
            memmove(&st->meta[2 * i], &st->meta[2 * i + 2],
                    sizeof(char *) * 2 * (size_t)(st->nmeta - i));
        }
        return 0;
    }
    char *v = strdup(value);
    if (!v)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", fn);
    if (i >= 0) {
        free(st->meta[2 * i + 1]);
        st->meta[2 * i + 1] = v;
        return 0;
    }
    char *k = strdup(key);
    char **grown = k ? realloc(st->meta, sizeof(char *) * 2 * (size_t)(st->nmeta + 1)) : NULL;
    if (!grown) {
        free(k);
        free(v);
        return ct__err_set(CT_ENOMEM, "%s: out of memory", fn);
    }
    st->meta = grown;
    st->meta[2 * st->nmeta] = k;
    st->meta[2 * st->nmeta + 1] = v;
    st->nmeta++;
    return 0;
}

const char *ct_state_meta(const ct_state *st, const char *key) {
    if (ct__ckpt_state_check(st, "ct_state_meta") || !key)
        return NULL;
    int i = find_meta(st, key);
    return i < 0 ? NULL : st->meta[2 * i + 1];
}

int ct__ckpt_state_replace_meta(ct_state *st, char *const *kv, int n) {
    free_meta(st);
    for (int i = 0; i < n; i++) {
        int rc = ct_state_set_meta(st, kv[2 * i], kv[2 * i + 1]);
        if (rc)
            return rc;
    }
    return 0;
}

void ct__ckpt_value_format(ck_type type, const void *value, char *buf) {
    switch (type) {
    case CK_INT64: snprintf(buf, 32, "%" PRId64, *(const int64_t *)value); break;
    case CK_UINT64: snprintf(buf, 32, "%" PRIu64, *(const uint64_t *)value); break;
    /* 17 significant digits bring every double back exactly; strtod reads
     * "inf" and "nan" back too. */
    case CK_FLOAT64: snprintf(buf, 32, "%.17g", *(const double *)value); break;
    default: CT_ASSERT(!"ct__ckpt_value_format: not a value type");
    }
}

bool ct__ckpt_value_parse(ck_type type, const char *text, void *value) {
    if (!text || !*text)
        return false;
    char *end = NULL;
    errno = 0;
    switch (type) {
    case CK_INT64: {
        long long v = strtoll(text, &end, 10);
        if (errno || *end)
            return false;
        *(int64_t *)value = v;
        return true;
    }
    case CK_UINT64: {
        if (text[0] == '-')
            return false;
        unsigned long long v = strtoull(text, &end, 10);
        if (errno || *end)
            return false;
        *(uint64_t *)value = v;
        return true;
    }
    case CK_FLOAT64: {
        /* A subnormal sets ERANGE and still reads back exactly. */
        double v = strtod(text, &end);
        if (*end)
            return false;
        *(double *)value = v;
        return true;
    }
    default: return false;
    }
}
