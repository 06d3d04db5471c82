/* Loading: each rank reads only the byte runs that overlap what it holds. */
#include "checkpoint_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

int ct__ckpt_checksum_mismatch(const char *file, const ck_tensor *t, const ck_chunk *c,
                               uint64_t got) {
    char at[CT__SHAPE_STR];
    return ct__err_set(CT_ECORRUPT,
                       "%s: tensor '%s', chunk at %s (bytes %lld..%lld): checksum %016llx, but the "
                       "manifest says %016llx; the file is damaged",
                       file, t->name, ct__tensor_shape_str(at, t->ndim, c->offsets),
                       (long long)c->byte_offset, (long long)(c->byte_offset + c->nbytes),
                       (unsigned long long)got, (unsigned long long)c->xxh3);
}

/* ---------------------------------------------------------------- hasher */

/* Reading a chunk and hashing it, one after the other, cost more than the
 * disk alone: a chunk read whole is hashed on this thread while the reader
 * reads the next one. */
struct ck_hasher {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool pending, done, quit;
    /* The job: the chunk's bytes, and what to name when they are wrong. */
    const char *data;
    const ck_tensor *t;
    const ck_chunk *c;
    char file[4096];
    uint64_t got;
};

static void *hash_jobs(void *arg) {
    ck_hasher *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->quit && (!h->pending || h->done))
            pthread_cond_wait(&h->cv, &h->mu);
        if (h->quit)
            break;
        const char *data = h->data;
        size_t n = (size_t)h->c->nbytes;
        pthread_mutex_unlock(&h->mu);
        uint64_t got = XXH3_64bits(data, n);
        pthread_mutex_lock(&h->mu);
        h->got = got;
        h->done = true;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Waits for the chunk being hashed, if any; whether there was one. */
static bool hasher_idle(ck_hasher *h) {
    pthread_mutex_lock(&h->mu);
    while (h->pending && !h->done)
        pthread_cond_wait(&h->cv, &h->mu);
    bool had = h->pending;
    h->pending = false;
    pthread_mutex_unlock(&h->mu);
    return had;
}

/* Waits for the chunk being hashed, if any: its verdict. */
static int hasher_wait(ck_hasher *h) {
    if (!h || !hasher_idle(h) || h->got == h->c->xxh3)
        return 0;
    return ct__ckpt_checksum_mismatch(h->file, h->t, h->c, h->got);
}

/* Hands chunk c, read whole into data, to the hasher, once the previous one
 * has passed. 1 when there is no hasher thread (then the caller hashes). */
static int hasher_submit(ck_reader *r, const char *file, const ck_tensor *t, const ck_chunk *c,
                         const char *data) {
    if (!r->hasher && !r->no_hasher) {
        ck_hasher *h = calloc(1, sizeof *h);
        if (h && !pthread_mutex_init(&h->mu, NULL) && !pthread_cond_init(&h->cv, NULL) &&
            !pthread_create(&h->thread, NULL, hash_jobs, h))
            r->hasher = h;
        else
            free(h);
        r->no_hasher = !r->hasher;
    }
    ck_hasher *h = r->hasher;
    if (!h)
        return 1;
    int rc = hasher_wait(h);
    if (rc)
        return rc;
    pthread_mutex_lock(&h->mu);
    h->data = data;
    h->t = t;
    h->c = c;
    snprintf(h->file, sizeof h->file, "%s", file);
    h->pending = true;
    h->done = false;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return 0;
}

int ct__reader_finish(ck_reader *r) { return hasher_wait(r->hasher); }

/* ---------------------------------------------------------------- reader */

/* Whether the directory the reader holds is no longer the one at its path:
 * a save swapped a new checkpoint in (and may be removing this one). */
static bool replaced(const ck_reader *r) {
    struct stat held, now;
    return fstat(r->dirfd, &held) == 0 && (held.st_nlink == 0 || stat(r->path, &now) != 0 ||
                                           now.st_ino != held.st_ino || now.st_dev != held.st_dev);
}

static int replaced_error(const ck_reader *r) {
    return ct__err_set(CT_ESTATE,
                       "%s: replaced by a concurrent save while it was being read; load it again",
                       r->path);
}

int ct__reader_open(const char *path, ck_reader *r) {
    *r = (ck_reader){.dirfd = -1, .block_file = -1};
    r->path = strdup(path);
    if (!r->path)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", path);
    /* The path itself may go through symlinks (a user's choice); what is
     * inside it is opened relative to this one descriptor, so that a save
     * renaming a new version into place does not change what is read. */
    r->dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;
    if (r->dirfd < 0)
        rc = ct__err_set(CT_EIO, "%s: %s%s", path, strerror(errno),
                         errno == ENOENT || errno == ENOTDIR ? " (not a committed ct checkpoint)"
                                                             : "");
    if (!rc) {
        rc = ct__manifest_read_at(r->dirfd, path, &r->m);
        if (rc && replaced(r))
            rc = replaced_error(r);
    }
    if (!rc && !(r->fds = malloc(sizeof(int) * (size_t)(r->m->nfiles + 1))))
        rc = ct__err_set(CT_ENOMEM, "%s: out of memory", path);
    if (rc) {
        ct__reader_close(r);
        return rc;
    }
    for (int i = 0; i < r->m->nfiles; i++)
        r->fds[i] = -1;
    return 0;
}

void ct__reader_close(ck_reader *r) {
    ck_hasher *h = r->hasher;
    if (h) {
        /* A verdict nobody asked for: an error is already being reported. */
        hasher_idle(h);
        pthread_mutex_lock(&h->mu);
        h->quit = true;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->thread, NULL);
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
        free(h);
    }
    for (int i = 0; r->fds && i < r->m->nfiles; i++)
        if (r->fds[i] >= 0)
            close(r->fds[i]);
    if (r->dirfd >= 0)
        close(r->dirfd);
    free(r->fds);
    free(r->block);
    free(r->chunk_checked);
    free(r->chunk_base);
    ct__manifest_free(r->m);
    free(r->path);
    *r = (ck_reader){.dirfd = -1, .block_file = -1};
}

int ct__reader_file(ck_reader *r, int i, int *fd, char *name, size_t cap) {
    const ck_file *f = &r->m->files[i];
    snprintf(name, cap, "%s/%s", r->path, f->name);
    if (r->fds[i] >= 0) {
        *fd = r->fds[i];
        return 0;
    }
    bool missing;
    int got = ct__ckpt_open_regular(r->dirfd, f->name, name, &missing);
    if (got < 0 && missing)
        return replaced(r)
                   ? replaced_error(r)
                   : ct__err_set(CT_ECORRUPT,
                                 "%s: %s (the manifest lists it; the checkpoint is damaged)", name,
                                 strerror(ENOENT));
    if (got < 0)
        return got;
    struct stat sb;
    if (fstat(got, &sb) != 0 || sb.st_size != f->nbytes) {
        int rc = ct__err_set(CT_ECORRUPT, "%s: %lld bytes, but the manifest says %lld%s", name,
                             (long long)sb.st_size, (long long)f->nbytes,
                             sb.st_size < f->nbytes ? " (truncated)" : "");
        close(got);
        return rc;
    }
    *fd = r->fds[i] = got;
    return 0;
}

int ct__ckpt_block_mismatch(const char *file, const ck_file *f, int64_t b, const char *tensor,
                            uint64_t got) {
    int64_t lo = b * f->block_bytes,
            hi = lo + f->block_bytes < f->nbytes ? lo + f->block_bytes : f->nbytes;
    return ct__err_set(CT_ECORRUPT,
                       "%s: block %lld (bytes %lld..%lld) in tensor '%s': checksum %016llx, but "
                       "the manifest says %016llx; the file is damaged",
                       file, (long long)b, (long long)lo, (long long)hi, tensor,
                       (unsigned long long)got, (unsigned long long)f->blocks[b]);
}

/* Reads bytes [off, off + len) of file fi into dst, each block they touch
 * checked against its checksum first (format 1.1). A block read only in
 * part is kept, so that the next run in it costs no read. */
static int read_checked(ck_reader *r, int fi, int fd, const char *file, const ck_tensor *t,
                        int64_t off, int64_t len, char *dst) {
    const ck_file *f = &r->m->files[fi];
    int64_t bb = f->block_bytes;
    for (int64_t b = off / bb; b * bb < off + len; b++) {
        int64_t bs = b * bb, be = bs + bb < f->nbytes ? bs + bb : f->nbytes;
        int64_t s = off > bs ? off : bs, e = off + len < be ? off + len : be;
        if (s == bs && e == be) {
            int rc = ct__file_pread_all(fd, dst + (s - off), (size_t)(be - bs), bs, file);
            uint64_t got = rc ? 0 : XXH3_64bits(dst + (s - off), (size_t)(be - bs));
            if (rc || got != f->blocks[b])
                return rc ? rc : ct__ckpt_block_mismatch(file, f, b, t->name, got);
            continue;
        }
        if (r->block_file != fi || r->block_index != b) {
            if (r->block_cap < bb) {
                char *buf = realloc(r->block, (size_t)bb);
                if (!buf)
                    return ct__err_set(CT_ENOMEM, "%s: out of memory", file);
                r->block = buf;
                r->block_cap = bb;
            }
            r->block_file = -1;
            int rc = ct__file_pread_all(fd, r->block, (size_t)(be - bs), bs, file);
            uint64_t got = rc ? 0 : XXH3_64bits(r->block, (size_t)(be - bs));
            if (rc || got != f->blocks[b])
                return rc ? rc : ct__ckpt_block_mismatch(file, f, b, t->name, got);
            r->block_file = fi;
            r->block_index = b;
        }
        memcpy(dst + (s - off), r->block + (s - bs), (size_t)(e - s));
    }
    return 0;
}

/* Format 1.0 has no block checksums: a chunk read in part is hashed whole,
 * once per reader, before its bytes are used. */
static int check_chunk_whole(ck_reader *r, int fd, const char *file, const ck_tensor *t,
                             const ck_chunk *c) {
    const ck_manifest *m = r->m;
    if (!r->chunk_checked) {
        int64_t n = 0;
        r->chunk_base = malloc(sizeof(int64_t) * (size_t)(m->ntensors + 1));
        for (int i = 0; r->chunk_base && i < m->ntensors; i++) {
            r->chunk_base[i] = n;
            n += m->tensors[i].nchunks;
        }
        r->chunk_checked = r->chunk_base ? calloc((size_t)n + 1, sizeof(bool)) : NULL;
        if (!r->chunk_checked)
            return ct__err_set(CT_ENOMEM, "%s: out of memory", file);
    }
    bool *done = &r->chunk_checked[r->chunk_base[t - m->tensors] + (c - t->chunks)];
    if (*done)
        return 0;
    int64_t piece = INT64_C(1) << 20;
    if (r->block_cap < piece) {
        char *buf = realloc(r->block, (size_t)piece);
        if (!buf)
            return ct__err_set(CT_ENOMEM, "%s: out of memory", file);
        r->block = buf;
        r->block_cap = piece;
    }
    r->block_file = -1;
    XXH3_state_t *hs = XXH3_createState();
    int rc = hs && XXH3_64bits_reset(hs) == XXH_OK
                 ? 0
                 : ct__err_set(CT_ENOMEM, "%s: out of memory", file);
    for (int64_t off = 0; !rc && off < c->nbytes; off += piece) {
        int64_t n = c->nbytes - off < piece ? c->nbytes - off : piece;
        rc = ct__file_pread_all(fd, r->block, (size_t)n, c->byte_offset + off, file);
        if (!rc)
            XXH3_64bits_update(hs, r->block, (size_t)n);
    }
    uint64_t got = rc ? 0 : XXH3_64bits_digest(hs);
    XXH3_freeState(hs);
    if (!rc && got != c->xxh3)
        rc = ct__ckpt_checksum_mismatch(file, t, c, got);
    *done = !rc;
    return rc;
}

int ct__ckpt_read_overlap(ck_reader *r, int fd, const char *file, const ck_tensor *t,
                          const ck_chunk *c, const int64_t *box_off, const int64_t *box_sizes,
                          char *dst) {
    int nd = t->ndim;
    int64_t lo[CT_MAX_DIMS] = {0}, ext[CT_MAX_DIMS] = {0};
    bool whole = true;
    for (int d = 0; d < nd; d++) {
        int64_t a = c->offsets[d] > box_off[d] ? c->offsets[d] : box_off[d];
        int64_t b = c->offsets[d] + c->sizes[d] < box_off[d] + box_sizes[d]
                        ? c->offsets[d] + c->sizes[d]
                        : box_off[d] + box_sizes[d];
        if (b <= a)
            return 0;
        lo[d] = a;
        ext[d] = b - a;
        whole = whole && ext[d] == c->sizes[d];
    }
    /* A run is contiguous in the file and in dst: the last dim, widened
     * over the dims before it while the overlap spans both the chunk and
     * the box in full. */
    size_t es = ct__esize(t->dtype);
    int k = nd - 1;
    int64_t run = nd ? ext[k] : 1;
    while (k > 0 && ext[k] == c->sizes[k] && ext[k] == box_sizes[k]) {
        k--;
        run *= ext[k];
    }
    int64_t cstride[CT_MAX_DIMS], bstride[CT_MAX_DIMS];
    int64_t cs = 1, bs = 1;
    for (int d = nd - 1; d >= 0; d--) {
        cstride[d] = cs;
        bstride[d] = bs;
        cs *= c->sizes[d];
        bs *= box_sizes[d];
    }
    /* One run is the whole chunk, in one piece of dst: hashed on the side. */
    if (whole && run * (int64_t)es == c->nbytes) {
        int64_t bo = 0;
        for (int d = 0; d < nd; d++)
            bo += (lo[d] - box_off[d]) * bstride[d];
        char *p = dst + bo * (int64_t)es;
        int rc = ct__file_pread_all(fd, p, (size_t)c->nbytes, c->byte_offset, file);
        int side = rc ? rc : hasher_submit(r, file, t, c, p);
        if (side <= 0)
            return side;
        uint64_t got = XXH3_64bits(p, (size_t)c->nbytes);
        return got == c->xxh3 ? 0 : ct__ckpt_checksum_mismatch(file, t, c, got);
    }
    /* A chunk read in part: its blocks' checksums (1.1), or the whole
     * chunk's first (1.0), check every byte that is used. */
    const ck_file *f = &r->m->files[c->file];
    bool blocks = f->nblocks > 0;
    if (!whole && !blocks) {
        int rc = check_chunk_whole(r, fd, file, t, c);
        if (rc)
            return rc;
    }
    XXH3_state_t *hs = whole ? XXH3_createState() : NULL;
    if (whole && (!hs || XXH3_64bits_reset(hs) != XXH_OK)) {
        XXH3_freeState(hs);
        return ct__err_set(CT_ENOMEM, "%s: out of memory", file);
    }
    int64_t idx[CT_MAX_DIMS] = {0}; /* over dims [0, k) of the overlap */
    int rc = 0;
    for (;;) {
        int64_t fo = 0, bo = 0;
        for (int d = 0; d < nd; d++) {
            int64_t i = lo[d] + (d < k ? idx[d] : 0);
            fo += (i - c->offsets[d]) * cstride[d];
            bo += (i - box_off[d]) * bstride[d];
        }
        char *p = dst + bo * (int64_t)es;
        int64_t at = c->byte_offset + fo * (int64_t)es;
        rc = !whole && blocks ? read_checked(r, c->file, fd, file, t, at, run * (int64_t)es, p)
                              : ct__file_pread_all(fd, p, (size_t)run * es, at, file);
        if (rc)
            break;
        if (hs)
            XXH3_64bits_update(hs, p, (size_t)run * es);
        int d = k - 1;
        while (d >= 0 && ++idx[d] == ext[d])
            idx[d--] = 0;
        if (d < 0)
            break;
    }
    if (!rc && hs) {
        uint64_t got = XXH3_64bits_digest(hs);
        if (got != c->xxh3)
            rc = ct__ckpt_checksum_mismatch(file, t, c, got);
    }
    XXH3_freeState(hs);
    return rc;
}

int ct__reader_read_box(ck_reader *r, int i, const int64_t *box_off, const int64_t *box_sizes,
                        char *dst) {
    const ck_tensor *t = &r->m->tensors[i];
    for (int c = 0; c < t->nchunks; c++) {
        const ck_chunk *k = &t->chunks[c];
        bool meets = true;
        for (int d = 0; d < t->ndim && meets; d++)
            meets = k->offsets[d] < box_off[d] + box_sizes[d] &&
                    box_off[d] < k->offsets[d] + k->sizes[d];
        if (!meets)
            continue;
        int fd;
        char name[4096];
        int rc = ct__reader_file(r, k->file, &fd, name, sizeof name);
        if (!rc)
            rc = ct__ckpt_read_overlap(r, fd, name, t, k, box_off, box_sizes, dst);
        if (rc)
            return rc;
    }
    return 0;
}

int ct__reader_read_rank(ck_reader *r, int i, int rank, char *dst) {
    const ck_tensor *t = &r->m->tensors[i];
    for (int c = 0; c < t->nchunks; c++)
        if (t->chunks[c].rank == rank) {
            int fd;
            char name[4096];
            int rc = ct__reader_file(r, t->chunks[c].file, &fd, name, sizeof name);
            return rc ? rc
                      : ct__ckpt_read_overlap(r, fd, name, t, &t->chunks[c], t->chunks[c].offsets,
                                              t->chunks[c].sizes, dst);
        }
    return ct__err_set(CT_ECORRUPT, "%s: per-rank tensor '%s' has no chunk for rank %d", r->path,
                       t->name, rank);
}

/* ----------------------------------------------------------------- load */

static int load_tensor(ck_reader *r, const ck_entry *e, int rank, int size) {
    const ck_manifest *m = r->m;
    char a[CT__SHAPE_STR], b[CT__SHAPE_STR];
    int i = ct__manifest_find_tensor(m, e->name);
    if (i < 0)
        return ct__err_set(CT_EINVAL, "%s: the checkpoint has no tensor '%s' (it has %d tensors)",
                           r->path, e->name, m->ntensors);
    const ck_tensor *t = &m->tensors[i];
    bool per_rank = e->kind == CT_STATE_PER_RANK;
    if (per_rank != (t->kind == CT_STATE_PER_RANK))
        return ct__err_set(CT_EINVAL, "%s: tensor '%s' was saved %s; the state asks for it %s",
                           r->path, e->name, ct_state_kind_name(t->kind),
                           ct_state_kind_name(e->kind));
    if (t->dtype != ct_tensor_dtype(e->t) || t->ndim != e->ndim ||
        memcmp(t->sizes, e->global, sizeof(int64_t) * (size_t)e->ndim))
        return ct__err_set(
            CT_EINVAL, "%s: tensor '%s' is %s%s in the checkpoint; the state has %s%s", r->path,
            e->name, ct_dtype_name(t->dtype), ct__tensor_shape_str(a, t->ndim, t->sizes),
            ct_dtype_name(ct_tensor_dtype(e->t)), ct__tensor_shape_str(b, e->ndim, e->global));
    if (per_rank && m->world_size != size)
        return ct__err_set(CT_EINVAL,
                           "%s: per-rank tensor '%s' was saved by %d ranks and is valid only in a "
                           "world of that size, not %d; leave it out of the state to load the rest",
                           r->path, e->name, m->world_size, size);
    ct_tensor *dst = e->t, *tmp = NULL;
    /* The file is read into host memory: a view's, or a device tensor's,
     * elements land in a contiguous buffer first. */
    if (!ct_is_contiguous(dst) || !ct__is_host(ct_tensor_device(dst))) {
        tmp = ct__tensor_own(ct_empty(ct_ndim(dst), ct_sizes(dst), ct_tensor_dtype(dst)));
        if (!tmp)
            return ct_errcode();
    }
    char *p = ct_data_ptr(tmp ? tmp : dst);
    int rc = per_rank ? ct__reader_read_rank(r, i, rank, p)
                      : ct__reader_read_box(r, i, e->offsets, ct_sizes(e->t), p);
    /* tmp must not go while its bytes are being hashed. */
    if (tmp && !rc)
        rc = ct__reader_finish(r);
    else if (tmp)
        ct__reader_finish(r);
    if (!rc && tmp)
        rc = ct__ckpt_write_from_host(dst, tmp);
    if (!rc)
        ct__tensor_bump_version(dst);
    ct_tensor_free(tmp);
    return rc;
}

static int load_value(const ck_reader *r, const ck_entry *e, int rank, int size) {
    const ck_manifest *m = r->m;
    int i = ct__manifest_find_value(m, e->name);
    if (i < 0)
        return ct__err_set(CT_EINVAL, "%s: the checkpoint has no value '%s'", r->path, e->name);
    const ck_value *v = &m->values[i];
    if (v->type != e->type || v->kind != e->kind)
        return ct__err_set(CT_EINVAL, "%s: value '%s' was saved as %s %s; the state has %s %s",
                           r->path, e->name, ct_state_kind_name(v->kind),
                           ct__ckpt_type_names[v->type], ct_state_kind_name(e->kind),
                           ct__ckpt_type_names[e->type]);
    if (v->kind == CT_STATE_PER_RANK && m->world_size != size)
        return ct__err_set(CT_EINVAL,
                           "%s: per-rank value '%s' was saved by %d ranks and is valid only in a "
                           "world of that size, not %d; leave it out of the state to load the rest",
                           r->path, e->name, m->world_size, size);
    const char *text = v->texts[v->kind == CT_STATE_PER_RANK ? rank : 0];
    if (!text)
        return ct__err_set(CT_ECORRUPT, "%s: value '%s' has no entry for rank %d", r->path, e->name,
                           rank);
    /* The manifest's parser checked the text. */
    CT_ASSERT(ct__ckpt_value_parse(e->type, text, e->value));
    return 0;
}

/* One attempt: this rank's reader, the version every rank pinned compared,
 * then its entries. */
static int load_once(const char *path, ct_state *st, ct_comm *comm, int rank, int size) {
    ck_reader r;
    int rc = ct__reader_open(path, &r);
    uint64_t version = rc ? 0 : r.m->text_xxh3;
    ck_blob *all = NULL;
    rc = ct__ckpt_agree(comm, rc, &version, sizeof version, &all);
    for (int k = 1; !rc && k < size; k++)
        if (memcmp(all[k].data, all[0].data, sizeof version))
            rc = ct__err_set(CT_ESTATE,
                             "%s: rank %d and rank 0 read different versions of it: replaced by a "
                             "concurrent save while it was being read; load it again",
                             path, k);
    ct__ckpt_blobs_free(all, size);
    for (int i = 0; !rc && i < st->n; i++) {
        const ck_entry *e = &st->entries[i];
        rc = e->type == CK_TENSOR ? load_tensor(&r, e, rank, size) : load_value(&r, e, rank, size);
    }
    if (!rc)
        rc = ct__reader_finish(&r);
    if (!rc)
        rc = ct__ckpt_state_replace_meta(st, r.m->meta, r.m->nmeta);
    if (r.m)
        ct__reader_close(&r);
    /* Every rank returns the same result: no rank trains on alone. */
    return ct__ckpt_agree(comm, rc, NULL, 0, NULL);
}

/* A save that replaces the checkpoint while it is read makes the reader's
 * pinned version vanish, or the ranks pin different ones: then every rank
 * (the verdict is shared) loads again, from the newer one. */
#define LOAD_ATTEMPTS 5

int ct_checkpoint_load(const char *path, ct_state *st, ct_comm *comm) {
    const char *fn = "ct_checkpoint_load";
    int rc = ct__ckpt_state_check(st, fn);
    if (rc)
        return rc;
    if (!path || !*path)
        return ct__err_set(CT_EINVAL, "%s: the path is NULL or empty", fn);
    int rank = comm ? ct_comm_rank(comm) : 0, size = comm ? ct_comm_size(comm) : 1;
    for (int attempt = 1;; attempt++) {
        rc = load_once(path, st, comm, rank, size);
        if (rc != CT_ESTATE || !strstr(ct_errmsg(), "concurrent save") || attempt == LOAD_ATTEMPTS)
            return rc;
    }
}
