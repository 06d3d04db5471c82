/* ct_checkpoint_reader: a checkpoint opened for inspection (ctckpt). */
#include "checkpoint_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <xxhash.h>

#define READER_MAGIC 0x6374436bu /* "ctCk" */
/* verify() reads in pieces of this size, so that memory stays bounded. */
#define VERIFY_PIECE (INT64_C(16) << 20)

struct ct_checkpoint_reader {
    uint32_t magic;
    ck_reader r;
};

static int check(const ct_checkpoint_reader *ck, const char *fn) {
    if (!ck)
        return ct__err_set(CT_EINVAL, "%s: the checkpoint is NULL", fn);
    if (ck->magic != READER_MAGIC)
        return ct__err_set(CT_EINVAL,
                           "%s: %p is not an open ct_checkpoint_reader (closed or foreign)", fn,
                           (const void *)ck);
    return 0;
}

int ct_checkpoint_reader_open(const char *path, ct_checkpoint_reader **out) {
    if (!out)
        return ct__err_set(CT_EINVAL, "ct_checkpoint_reader_open: out is NULL");
    *out = NULL;
    if (!path || !*path)
        return ct__err_set(CT_EINVAL, "ct_checkpoint_reader_open: the path is NULL or empty");
    ct_checkpoint_reader *ck = calloc(1, sizeof *ck);
    if (!ck)
        return ct__err_set(CT_ENOMEM, "ct_checkpoint_reader_open: out of memory");
    int rc = ct__reader_open(path, &ck->r);
    /* Every file now, so that a missing or truncated one shows at once. */
    for (int i = 0; !rc && i < ck->r.m->nfiles; i++) {
        int fd;
        char name[4096];
        rc = ct__reader_file(&ck->r, i, &fd, name, sizeof name);
    }
    if (rc) {
        if (ck->r.m)
            ct__reader_close(&ck->r);
        free(ck);
        return rc;
    }
    ck->magic = READER_MAGIC;
    *out = ck;
    return 0;
}

void ct_checkpoint_reader_close(ct_checkpoint_reader *ck) {
    if (!ck)
        return;
    CT_ASSERT(ck->magic == READER_MAGIC && "ct_checkpoint_reader_close: not an open checkpoint");
    ct__reader_close(&ck->r);
    ck->magic = 0;
    free(ck);
}

void ct_checkpoint_reader_version(const ct_checkpoint_reader *ck, int *major, int *minor) {
    bool ok = !check(ck, "ct_checkpoint_reader_version");
    if (major)
        *major = ok ? ck->r.m->major : 0;
    if (minor)
        *minor = ok ? ck->r.m->minor : 0;
}

const char *ct_checkpoint_reader_writer(const ct_checkpoint_reader *ck) {
    return check(ck, "ct_checkpoint_reader_writer") ? NULL : ck->r.m->writer;
}

int ct_checkpoint_reader_world_size(const ct_checkpoint_reader *ck) {
    CT_TRY(check(ck, "ct_checkpoint_reader_world_size"));
    return ck->r.m->world_size;
}

int64_t ct_checkpoint_reader_step(const ct_checkpoint_reader *ck) {
    return check(ck, "ct_checkpoint_reader_step") ? -1 : ck->r.m->step;
}

int ct_checkpoint_reader_num_tensors(const ct_checkpoint_reader *ck) {
    CT_TRY(check(ck, "ct_checkpoint_reader_num_tensors"));
    return ck->r.m->ntensors;
}

static int check_index(const ct_checkpoint_reader *ck, const char *fn, int i, int n,
                       const char *what) {
    CT_TRY(check(ck, fn));
    CT_REQUIRE(i >= 0 && i < n, CT_ERANGE, "%s: %s %d is outside [0, %d)", fn, what, i, n);
    return 0;
}

int ct_checkpoint_reader_tensor(const ct_checkpoint_reader *ck, int i,
                                ct_checkpoint_tensor_info *info) {
    CT_TRY(check_index(ck, "ct_checkpoint_reader_tensor", i, ck ? ck->r.m->ntensors : 0, "tensor"));
    const ck_tensor *t = &ck->r.m->tensors[i];
    *info = (ct_checkpoint_tensor_info){t->name, t->kind, t->dtype, t->ndim, t->sizes, t->nchunks};
    return 0;
}

int ct_checkpoint_reader_chunk(const ct_checkpoint_reader *ck, int i, int chunk,
                               ct_checkpoint_chunk_info *info) {
    CT_TRY(check_index(ck, "ct_checkpoint_reader_chunk", i, ck ? ck->r.m->ntensors : 0, "tensor"));
    const ck_tensor *t = &ck->r.m->tensors[i];
    CT_TRY(check_index(ck, "ct_checkpoint_reader_chunk", chunk, t->nchunks, "chunk"));
    const ck_chunk *c = &t->chunks[chunk];
    *info =
        (ct_checkpoint_chunk_info){c->offsets,     c->sizes,  c->rank, ck->r.m->files[c->file].name,
                                   c->byte_offset, c->nbytes, c->xxh3};
    return 0;
}

int ct_checkpoint_reader_find(const ct_checkpoint_reader *ck, const char *name) {
    if (check(ck, "ct_checkpoint_reader_find") || !name)
        return -1;
    return ct__manifest_find_tensor(ck->r.m, name);
}

ct_tensor *ct_checkpoint_reader_read(ct_checkpoint_reader *ck, int i, int rank) {
    const char *fn = "ct_checkpoint_reader_read";
    if (check_index(ck, fn, i, ck ? ck->r.m->ntensors : 0, "tensor"))
        return NULL;
    const ck_tensor *t = &ck->r.m->tensors[i];
    bool per_rank = t->kind == CT_STATE_PER_RANK;
    if (per_rank && (rank < 0 || rank >= ck->r.m->world_size)) {
        ct__err_set(CT_ERANGE, "%s: rank %d is outside the checkpoint's world of %d", fn, rank,
                    ck->r.m->world_size);
        return NULL;
    }
    ct_tensor *out = ct_empty(t->ndim, t->sizes, t->dtype);
    if (!out)
        return NULL;
    int64_t zeros[CT_MAX_DIMS] = {0};
    int rc = per_rank ? ct__reader_read_rank(&ck->r, i, rank, ct_data_ptr(out))
                      : ct__reader_read_box(&ck->r, i, zeros, t->sizes, ct_data_ptr(out));
    int checked = ct__reader_finish(&ck->r);
    rc = rc ? rc : checked;
    if (rc) {
        ct__tensor_release(out);
        return NULL;
    }
    return out;
}

int ct_checkpoint_reader_num_values(const ct_checkpoint_reader *ck) {
    CT_TRY(check(ck, "ct_checkpoint_reader_num_values"));
    return ck->r.m->nvalues;
}

int ct_checkpoint_reader_value(const ct_checkpoint_reader *ck, int i, int rank, const char **name,
                               ct_state_kind *kind, const char **type, const char **text) {
    CT_TRY(check_index(ck, "ct_checkpoint_reader_value", i, ck ? ck->r.m->nvalues : 0, "value"));
    const ck_value *v = &ck->r.m->values[i];
    int slot = v->kind == CT_STATE_PER_RANK ? rank : 0;
    if (slot < 0 || slot >= v->ntexts)
        return ct__err_set(CT_ERANGE, "ct_checkpoint_reader_value: rank %d is outside [0, %d)",
                           rank, v->ntexts);
    if (name)
        *name = v->name;
    if (kind)
        *kind = v->kind;
    if (type)
        *type = ct__ckpt_type_names[v->type];
    if (text)
        *text = v->texts[slot];
    return 0;
}

int ct_checkpoint_reader_num_meta(const ct_checkpoint_reader *ck) {
    CT_TRY(check(ck, "ct_checkpoint_reader_num_meta"));
    return ck->r.m->nmeta;
}

int ct_checkpoint_reader_meta(const ct_checkpoint_reader *ck, int i, const char **key,
                              const char **value) {
    CT_TRY(
        check_index(ck, "ct_checkpoint_reader_meta", i, ck ? ck->r.m->nmeta : 0, "metadata entry"));
    if (key)
        *key = ck->r.m->meta[2 * i];
    if (value)
        *value = ck->r.m->meta[2 * i + 1];
    return 0;
}

/* Streams one chunk through the hash in bounded pieces. */
static int verify_chunk(ck_reader *r, const ck_tensor *t, const ck_chunk *c, char *buf,
                        XXH3_state_t *hs, int64_t *done, int64_t total,
                        void (*progress)(int64_t, int64_t, void *), void *ctx) {
    int fd;
    char name[4096];
    int rc = ct__reader_file(r, c->file, &fd, name, sizeof name);
    if (rc)
        return rc;
    XXH3_64bits_reset(hs);
    for (int64_t off = 0; off < c->nbytes; off += VERIFY_PIECE) {
        int64_t n = c->nbytes - off < VERIFY_PIECE ? c->nbytes - off : VERIFY_PIECE;
        rc = ct__file_pread_all(fd, buf, (size_t)n, c->byte_offset + off, name);
        if (rc)
            return rc;
        XXH3_64bits_update(hs, buf, (size_t)n);
        *done += n;
        if (progress)
            progress(*done, total, ctx);
    }
    uint64_t got = XXH3_64bits_digest(hs);
    return got == c->xxh3 ? 0 : ct__ckpt_checksum_mismatch(name, t, c, got);
}

/* The tensor that the first chunk holding bytes [lo, hi) of file fi
 * belongs to, or "padding". */
static const char *tensor_at(const ck_manifest *m, int fi, int64_t lo, int64_t hi) {
    for (int i = 0; i < m->ntensors; i++)
        for (int c = 0; c < m->tensors[i].nchunks; c++) {
            const ck_chunk *k = &m->tensors[i].chunks[c];
            if (k->file == fi && k->byte_offset < hi && lo < k->byte_offset + k->nbytes)
                return m->tensors[i].name;
        }
    return "(padding)";
}

/* Format 1.1: every block of every file, each damaged one listed (the
 * first few in full) in one CT_ECORRUPT. */
#define DAMAGE_LISTED 8

static int verify_blocks(ck_reader *r, int64_t *done, int64_t total,
                         void (*progress)(int64_t, int64_t, void *), void *ctx) {
    const ck_manifest *m = r->m;
    char list[DAMAGE_LISTED * 1200] = "", *at = list;
    int64_t damaged = 0;
    char *buf = NULL;
    int64_t cap = 0;
    int rc = 0;
    for (int fi = 0; !rc && fi < m->nfiles; fi++) {
        const ck_file *f = &m->files[fi];
        int fd;
        char name[4096];
        if (!f->nblocks || (rc = ct__reader_file(r, fi, &fd, name, sizeof name)))
            continue;
        if (cap < f->block_bytes) {
            char *p = realloc(buf, (size_t)f->block_bytes);
            if (!p) {
                rc = ct__err_set(CT_ENOMEM, "%s: out of memory", name);
                break;
            }
            buf = p;
            cap = f->block_bytes;
        }
        for (int64_t b = 0; !rc && b < f->nblocks; b++) {
            int64_t lo = b * f->block_bytes;
            int64_t n = f->nbytes - lo < f->block_bytes ? f->nbytes - lo : f->block_bytes;
            rc = ct__file_pread_all(fd, buf, (size_t)n, lo, name);
            if (!rc && XXH3_64bits(buf, (size_t)n) != f->blocks[b] && damaged++ < DAMAGE_LISTED)
                at += snprintf(at, (size_t)(list + sizeof list - at),
                               "%s%s: block %lld (bytes %lld..%lld) in tensor '%.200s'",
                               damaged > 1 ? "; " : "", name, (long long)b, (long long)lo,
                               (long long)(lo + n), tensor_at(m, fi, lo, lo + n));
            *done += n;
            if (progress)
                progress(*done, total, ctx);
        }
    }
    free(buf);
    if (!rc && damaged)
        rc = ct__err_set(CT_ECORRUPT,
                         "%lld damaged block%s (checksums differ from the manifest's): "
                         "%s%s; the checkpoint is damaged",
                         (long long)damaged, damaged > 1 ? "s" : "", list,
                         damaged > DAMAGE_LISTED ? "; ..." : "");
    return rc;
}

int ct_checkpoint_reader_verify(ct_checkpoint_reader *ck,
                                void (*progress)(int64_t, int64_t, void *), void *ctx) {
    int rc = check(ck, "ct_checkpoint_reader_verify");
    if (rc)
        return rc;
    const ck_manifest *m = ck->r.m;
    int64_t total = 0, done = 0;
    for (int i = 0; i < m->ntensors; i++)
        for (int c = 0; c < m->tensors[i].nchunks; c++)
            total += m->tensors[i].chunks[c].nbytes;
    for (int i = 0; i < m->nfiles; i++)
        total += m->files[i].nblocks ? m->files[i].nbytes : 0;
    rc = verify_blocks(&ck->r, &done, total, progress, ctx);
    char *buf = rc ? NULL : malloc((size_t)VERIFY_PIECE);
    XXH3_state_t *hs = rc ? NULL : XXH3_createState();
    if (!rc && (!buf || !hs))
        rc = ct__err_set(CT_ENOMEM, "ct_checkpoint_reader_verify: out of memory");
    for (int i = 0; !rc && i < m->ntensors; i++)
        for (int c = 0; !rc && c < m->tensors[i].nchunks; c++)
            rc = verify_chunk(&ck->r, &m->tensors[i], &m->tensors[i].chunks[c], buf, hs, &done,
                              total, progress, ctx);
    XXH3_freeState(hs);
    free(buf);
    return rc;
}
