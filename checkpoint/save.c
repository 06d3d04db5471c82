/* Saving: every rank's entries exchanged and planned alike on every rank,
 * each rank's file written, and the manifest committed by rank 0. */
#include "checkpoint_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* Chunks are hashed and written in pieces: a piece is written while it is
 * still in cache from the hashes' reads, and the disk starts on each piece
 * while the next is hashed and copied in. */
#define WRITE_PIECE (INT64_C(8) << 20)

ct_checkpoint_options ct_checkpoint_defaults(void) {
    return (ct_checkpoint_options){.step = -1, .keep_last = 0};
}

/* ------------------------------------------------------------- exchange */

void ct__ckpt_blobs_free(ck_blob *all, int n) {
    if (!all)
        return;
    for (int i = 0; i < n; i++)
        free(all[i].data);
    free(all);
}

/* One allgather of the lengths, one of the bytes padded to the longest. */
int ct__ckpt_exchange(ct_comm *comm, int status, const void *data, size_t len, ck_blob **all) {
    *all = NULL;
    int size = comm ? ct_comm_size(comm) : 1;
    ck_blob *out = calloc((size_t)size, sizeof *out);
    if (!out)
        return ct__err_set(CT_ENOMEM, "checkpoint: out of memory");
    if (!comm) {
        out[0] = (ck_blob){status, malloc(len + 1), len};
        if (!out[0].data) {
            free(out);
            return ct__err_set(CT_ENOMEM, "checkpoint: out of memory");
        }
        if (len)
            memcpy(out[0].data, data, len);
        out[0].data[len] = '\0';
        *all = out;
        return 0;
    }
    int rc = 0;
    ct_tensor *mine = ct__tensor_own(ct_empty(CT_SHAPE(2), CT_INT64));
    ct_tensor *heads = ct__tensor_own(ct_empty(CT_SHAPE(2 * (int64_t)size), CT_INT64));
    ct_tensor *buf = NULL, *bufs = NULL;
    if (!mine || !heads)
        rc = ct_errcode();
    if (!rc) {
        ((int64_t *)ct_data_ptr(mine))[0] = status;
        ((int64_t *)ct_data_ptr(mine))[1] = (int64_t)len;
        rc = ct_comm_allgather(comm, heads, mine, NULL);
    }
    int64_t longest = 1;
    for (int r = 0; !rc && r < size; r++)
        if (((int64_t *)ct_data_ptr(heads))[2 * r + 1] > longest)
            longest = ((int64_t *)ct_data_ptr(heads))[2 * r + 1];
    if (!rc) {
        buf = ct__tensor_own(ct_zeros(CT_SHAPE(longest), CT_UINT8));
        bufs = ct__tensor_own(ct_empty(CT_SHAPE((int64_t)size * longest), CT_UINT8));
        if (!buf || !bufs)
            rc = ct_errcode();
    }
    if (!rc) {
        if (len)
            memcpy(ct_data_ptr(buf), data, len);
        rc = ct_comm_allgather(comm, bufs, buf, NULL);
    }
    for (int r = 0; !rc && r < size; r++) {
        int64_t n = ((int64_t *)ct_data_ptr(heads))[2 * r + 1];
        out[r] = (ck_blob){(int)((int64_t *)ct_data_ptr(heads))[2 * r], malloc((size_t)n + 1),
                           (size_t)n};
        if (!out[r].data) {
            rc = ct__err_set(CT_ENOMEM, "checkpoint: out of memory");
            break;
        }
        memcpy(out[r].data, (char *)ct_data_ptr(bufs) + r * longest, (size_t)n);
        out[r].data[n] = '\0';
    }
    ct_tensor_free(mine);
    ct_tensor_free(heads);
    ct_tensor_free(buf);
    ct_tensor_free(bufs);
    if (rc)
        ct__ckpt_blobs_free(out, size);
    else
        *all = out;
    return rc;
}

int ct__ckpt_exchange_verdict(const ck_blob *all, int n) {
    for (int r = 0; r < n; r++)
        if (all[r].status)
            return n > 1 ? ct__err_set(all[r].status, "rank %d: %s", r, all[r].data)
                         : ct__err_set(all[r].status, "%s", all[r].data);
    return 0;
}

int ct__ckpt_agree(ct_comm *comm, int rc, const void *data, size_t len, ck_blob **all) {
    const char *msg = rc ? ct_errmsg() : NULL;
    char *copy = msg ? strdup(msg) : NULL;
    ck_blob *got = NULL;
    int xrc = ct__ckpt_exchange(comm, rc,
                                copy ? copy
                                : rc ? ""
                                     : data,
                                copy ? strlen(copy)
                                : rc ? 0
                                     : len,
                                &got);
    free(copy);
    if (xrc)
        return xrc;
    int size = comm ? ct_comm_size(comm) : 1;
    int verdict = ct__ckpt_exchange_verdict(got, size);
    if (all && !verdict)
        *all = got;
    else
        ct__ckpt_blobs_free(got, size);
    return verdict;
}

/* ----------------------------------------------------------------- plan */

void ct__ckpt_plan_free(ck_plan *plan) {
    ct__manifest_free(plan->m);
    for (int i = 0; i < plan->nsources; i++)
        ct_tensor_free(plan->sources[i].t);
    free(plan->sources);
    *plan = (ck_plan){.file = -1};
}

/* This rank's entries as a partial manifest: one chunk per tensor, its own
 * text per value. */
static int describe(const ct_state *st, int rank, int size, int64_t step, ck_manifest **out) {
    ck_manifest *m = calloc(1, sizeof *m);
    if (!m)
        return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
    *out = m;
    *m = (ck_manifest){.major = CK_FORMAT_MAJOR,
                       .minor = CK_FORMAT_MINOR,
                       .writer = strdup("ct " CT_VERSION_STRING),
                       .world_size = size,
                       .step = step,
                       .partial = true,
                       .tensors = calloc((size_t)st->n + 1, sizeof(ck_tensor)),
                       .values = calloc((size_t)st->n + 1, sizeof(ck_value)),
                       .meta = calloc((size_t)(2 * st->nmeta + 1), sizeof(char *))};
    if (!m->writer || !m->tensors || !m->values || !m->meta)
        return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
    for (int i = 0; i < st->n; i++) {
        const ck_entry *e = &st->entries[i];
        if (e->type != CK_TENSOR) {
            ck_value *v = &m->values[m->nvalues++];
            *v = (ck_value){.name = strdup(e->name),
                            .kind = e->kind,
                            .type = e->type,
                            .texts = calloc(1, sizeof(char *)),
                            .ntexts = 1};
            char text[32];
            ct__ckpt_value_format(e->type, e->value, text);
            if (!v->name || !v->texts || !(v->texts[0] = strdup(text)))
                return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
            continue;
        }
        /* Another block of a sharded tensor this rank has: one more chunk. */
        ck_tensor *t = NULL;
        for (int k = 0; e->kind == CT_STATE_SHARDED && k < m->ntensors && !t; k++)
            if (!strcmp(m->tensors[k].name, e->name))
                t = &m->tensors[k];
        if (!t) {
            t = &m->tensors[m->ntensors++];
            *t = (ck_tensor){.name = strdup(e->name),
                             .kind = e->kind,
                             .dtype = ct_tensor_dtype(e->t),
                             .ndim = e->ndim};
            if (!t->name)
                return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
            memcpy(t->sizes, e->global, sizeof(int64_t) * (size_t)e->ndim);
        }
        ck_chunk *chunks = realloc(t->chunks, sizeof *chunks * (size_t)(t->nchunks + 1));
        if (!chunks)
            return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
        t->chunks = chunks;
        ck_chunk *k = &t->chunks[t->nchunks++];
        *k = (ck_chunk){.rank = rank, .file = -1};
        memcpy(k->offsets, e->offsets, sizeof(int64_t) * (size_t)e->ndim);
        memcpy(k->sizes, ct_sizes(e->t), sizeof(int64_t) * (size_t)e->ndim);
    }
    for (int i = 0; i < 2 * st->nmeta; i++)
        if (!(m->meta[i] = strdup(st->meta[i])))
            return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
    m->nmeta = st->nmeta;
    return 0;
}

/* The merged manifest grows by one tensor or value at a time; these keep
 * its arrays large enough. */
static void *grow(void *arr, int n, size_t elem) {
    if (n & (n - 1))
        return arr;
    return realloc(arr, elem * (size_t)(n ? 2 * n : 1));
}

static int merge_tensor(ck_manifest *m, const ck_tensor *t, int rank) {
    char a[CT__SHAPE_STR], b[CT__SHAPE_STR];
    int i = ct__manifest_find_tensor(m, t->name);
    if (i < 0) {
        ck_tensor *arr = grow(m->tensors, m->ntensors, sizeof *arr);
        if (!arr)
            return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
        m->tensors = arr;
        i = m->ntensors++;
        m->tensors[i] = *t;
        m->tensors[i].name = strdup(t->name);
        m->tensors[i].chunks = NULL;
        m->tensors[i].nchunks = 0;
        if (!m->tensors[i].name)
            return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
    }
    ck_tensor *g = &m->tensors[i];
    int first = g->nchunks ? g->chunks[0].rank : rank;
    if (g->kind != t->kind || g->dtype != t->dtype || g->ndim != t->ndim ||
        memcmp(g->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim))
        return ct__err_set(CT_EINVAL,
                           "checkpoint save: the ranks disagree on tensor '%s': %s %s%s on rank "
                           "%d, %s %s%s on rank %d",
                           t->name, ct_state_kind_name(g->kind), ct_dtype_name(g->dtype),
                           ct__tensor_shape_str(a, g->ndim, g->sizes), first,
                           ct_state_kind_name(t->kind), ct_dtype_name(t->dtype),
                           ct__tensor_shape_str(b, t->ndim, t->sizes), rank);
    ck_chunk *chunks = realloc(g->chunks, sizeof *chunks * (size_t)(g->nchunks + t->nchunks));
    if (!chunks)
        return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
    g->chunks = chunks;
    for (int c = 0; c < t->nchunks; c++)
        g->chunks[g->nchunks++] = t->chunks[c];
    return 0;
}

static int merge_value(ck_manifest *m, const ck_value *v, int rank, int size) {
    int i = ct__manifest_find_value(m, v->name);
    if (i < 0) {
        ck_value *arr = grow(m->values, m->nvalues, sizeof *arr);
        if (!arr)
            return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
        m->values = arr;
        i = m->nvalues++;
        int n = v->kind == CT_STATE_PER_RANK ? size : 1;
        m->values[i] = (ck_value){.name = strdup(v->name),
                                  .kind = v->kind,
                                  .type = v->type,
                                  .texts = calloc((size_t)n, sizeof(char *)),
                                  .ntexts = n};
        if (!m->values[i].name || !m->values[i].texts)
            return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
    }
    ck_value *g = &m->values[i];
    if (g->kind != v->kind || g->type != v->type)
        return ct__err_set(CT_EINVAL,
                           "checkpoint save: the ranks disagree on value '%s': %s %s on one rank, "
                           "%s %s on rank %d",
                           v->name, ct_state_kind_name(g->kind), ct__ckpt_type_names[g->type],
                           ct_state_kind_name(v->kind), ct__ckpt_type_names[v->type], rank);
    int slot = g->kind == CT_STATE_PER_RANK ? rank : 0;
    if (g->texts[slot]) {
        if (strcmp(g->texts[slot], v->texts[0]))
            return ct__err_set(CT_EINVAL,
                               "checkpoint save: replicated value '%s' is %s on one rank and %s on "
                               "rank %d; a replicated value must be the same on every rank",
                               v->name, g->texts[slot], v->texts[0], rank);
        return 0;
    }
    g->texts[slot] = strdup(v->texts[0]);
    return g->texts[slot] ? 0 : ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
}

/* Complete per-rank entries, tiling shards; one writer per replicated
 * tensor, the rank with the fewest bytes so far, so that every rank writes
 * a share. */
static int finish_entries(ck_manifest *m, int size) {
    int64_t *load = calloc((size_t)size, sizeof *load);
    if (!load)
        return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
    int rc = 0;
    for (int i = 0; i < m->ntensors && !rc; i++) {
        ck_tensor *t = &m->tensors[i];
        int64_t bytes = (int64_t)ct__esize(t->dtype);
        for (int d = 0; d < t->ndim; d++)
            bytes *= t->sizes[d];
        if (t->kind == CT_STATE_REPLICATED) {
            int best = 0;
            for (int c = 1; c < t->nchunks; c++)
                if (load[t->chunks[c].rank] < load[t->chunks[best].rank])
                    best = c;
            t->chunks[0] = t->chunks[best];
            t->nchunks = 1;
            load[t->chunks[0].rank] += bytes;
        } else if (t->kind == CT_STATE_PER_RANK && t->nchunks != size) {
            rc = ct__err_set(CT_EINVAL,
                             "checkpoint save: per-rank tensor '%s' is in the state of %d of %d "
                             "ranks; every rank must add it",
                             t->name, t->nchunks, size);
        } else if (t->kind == CT_STATE_SHARDED) {
            char msg[1024];
            if (ct__manifest_check_tiling(t, "checkpoint save")) {
                snprintf(msg, sizeof msg, "%s (the ranks' blocks must tile the tensor)",
                         ct_errmsg());
                rc = ct__err_set(CT_EINVAL, "%s", msg);
            }
        }
    }
    for (int i = 0; i < m->nvalues && !rc; i++)
        for (int r = 0; r < m->values[i].ntexts && !rc; r++)
            if (!m->values[i].texts[r])
                rc = ct__err_set(CT_EINVAL,
                                 "checkpoint save: per-rank value '%s' is missing from rank %d's "
                                 "state; every rank must add it",
                                 m->values[i].name, r);
    free(load);
    return rc;
}

/* Files and byte ranges: each rank's chunks in manifest order, each at a
 * 64-byte boundary, in one file per rank that writes anything. */
static int lay_out(ck_manifest *m, int size) {
    m->files = calloc((size_t)size, sizeof *m->files);
    if (!m->files)
        return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
    for (int r = 0; r < size; r++) {
        int64_t end = 0;
        bool any = false;
        for (int i = 0; i < m->ntensors; i++)
            for (int c = 0; c < m->tensors[i].nchunks; c++) {
                ck_chunk *k = &m->tensors[i].chunks[c];
                if (k->rank != r)
                    continue;
                int64_t numel = 1;
                for (int d = 0; d < m->tensors[i].ndim; d++)
                    numel *= k->sizes[d];
                k->nbytes = numel * (int64_t)ct__esize(m->tensors[i].dtype);
                k->byte_offset = (end + CK_ALIGN - 1) / CK_ALIGN * CK_ALIGN;
                k->file = m->nfiles;
                end = k->byte_offset + k->nbytes;
                any = true;
            }
        if (!any)
            continue;
        char name[32];
        snprintf(name, sizeof name, "data-%05d.bin", r);
        m->files[m->nfiles] = (ck_file){.name = strdup(name),
                                        .nbytes = end,
                                        .block_bytes = CK_BLOCK_BYTES,
                                        .nblocks = (end + CK_BLOCK_BYTES - 1) / CK_BLOCK_BYTES};
        if (!m->files[m->nfiles++].name)
            return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
    }
    return 0;
}

/* The entry whose data chunk k is: by name, and for one of a sharded
 * tensor's several blocks on this rank by where it starts. */
static int find_entry(const ct_state *st, const char *name, const ck_chunk *k, int ndim) {
    for (int i = 0; i < st->n; i++) {
        const ck_entry *e = &st->entries[i];
        if (!strcmp(e->name, name) &&
            (e->kind != CT_STATE_SHARDED ||
             !memcmp(e->offsets, k->offsets, sizeof(int64_t) * (size_t)ndim)))
            return i;
    }
    return -1;
}

/* What this rank writes: its chunks in manifest order, each with the tensor
 * that holds its data. */
static int list_sources(const ct_state *st, ck_plan *plan) {
    const ck_manifest *m = plan->m;
    for (int i = 0; i < m->ntensors; i++)
        for (int c = 0; c < m->tensors[i].nchunks; c++)
            if (m->tensors[i].chunks[c].rank == plan->rank)
                plan->nsources++;
    plan->sources = calloc((size_t)plan->nsources + 1, sizeof *plan->sources);
    if (!plan->sources)
        return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
    int n = 0;
    for (int i = 0; i < m->ntensors; i++)
        for (int c = 0; c < m->tensors[i].nchunks; c++) {
            if (m->tensors[i].chunks[c].rank != plan->rank)
                continue;
            int e =
                find_entry(st, m->tensors[i].name, &m->tensors[i].chunks[c], m->tensors[i].ndim);
            CT_ASSERT(e >= 0);
            plan->file = m->tensors[i].chunks[c].file;
            plan->sources[n++] = (ck_source){i, c, ct_tensor_retain(st->entries[e].t)};
        }
    return 0;
}

int ct__ckpt_save_plan(ct_state *st, ct_comm *comm, const ct_checkpoint_options *o, ck_plan *plan) {
    *plan = (ck_plan){
        .rank = comm ? ct_comm_rank(comm) : 0, .size = comm ? ct_comm_size(comm) : 1, .file = -1};
    ck_manifest *mine = NULL;
    int rc = describe(st, plan->rank, plan->size, o->step, &mine);
    char *text = rc ? NULL : ct__manifest_emit(mine);
    if (!rc && !text)
        rc = ct_errcode();
    ct__manifest_free(mine);
    ck_blob *all = NULL;
    rc = ct__ckpt_agree(comm, rc, text, text ? strlen(text) : 0, &all);
    free(text);
    if (rc)
        return rc;
    /* Every rank merges the same texts in the same order, so every rank
     * reaches the same manifest or the same error. */
    ck_manifest *m = calloc(1, sizeof *m);
    plan->m = m;
    if (!m)
        rc = ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
    for (int r = 0; r < plan->size && !rc; r++) {
        char where[64];
        snprintf(where, sizeof where, "checkpoint save: rank %d's entries", r);
        ck_manifest *p = NULL;
        rc = ct__manifest_parse(all[r].data, all[r].len, where, true, &p);
        if (!rc && r == 0) {
            *m = *p;
            m->partial = false;
            m->writer = strdup(p->writer);
            m->meta = p->meta;
            m->nmeta = p->nmeta;
            p->meta = NULL;
            p->nmeta = 0;
            m->tensors = NULL;
            m->ntensors = 0;
            m->values = NULL;
            m->nvalues = 0;
            m->tensor_names = m->value_names = (ck_names){0};
            if (!m->writer)
                rc = ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
        }
        for (int i = 0; !rc && i < p->ntensors; i++)
            rc = merge_tensor(m, &p->tensors[i], r);
        for (int i = 0; !rc && i < p->nvalues; i++)
            rc = merge_value(m, &p->values[i], r, plan->size);
        ct__manifest_free(p);
    }
    ct__ckpt_blobs_free(all, plan->size);
    if (!rc)
        rc = finish_entries(m, plan->size);
    if (!rc)
        rc = lay_out(m, plan->size);
    if (!rc)
        rc = list_sources(st, plan);
    /* The merge fails alike on every rank, but running out of memory need
     * not: agree, so that no rank goes on alone. */
    rc = ct__ckpt_agree(comm, rc, NULL, 0, NULL);
    if (rc)
        ct__ckpt_plan_free(plan);
    return rc;
}

/* ---------------------------------------------------------------- write */

/* a, sep and b in one new string; NULL with CT_ENOMEM. */
static char *concat(const char *a, const char *sep, const char *b) {
    size_t n = strlen(a) + strlen(sep) + strlen(b) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s%s%s", a, sep, b);
    else
        ct__err_set(CT_ENOMEM, "checkpoint: out of memory");
    return s;
}

static char *join(const char *dir, const char *name) { return concat(dir, "/", name); }
static char *with_suffix(const char *path, const char *suffix) { return concat(path, "", suffix); }

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

static bool is_file(const char *dir, const char *name) {
    char *p = join(dir, name);
    struct stat sb;
    bool yes = p && lstat(p, &sb) == 0 && S_ISREG(sb.st_mode);
    free(p);
    return yes;
}

/* The marker names the save that wrote it: a random token, and the pid,
 * host and boot of its process. */
typedef struct owner {
    char token[33];
    long pid;
    char host[256];
    char boot[40];
} owner;

static void read_boot_id(char *out, size_t cap) {
    out[0] = '\0';
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (!fgets(out, (int)cap, f))
            out[0] = '\0';
        out[strcspn(out, "\n")] = '\0';
        fclose(f);
    }
}

static int make_owner(owner *o) {
    unsigned char raw[16];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        return ct__err_set(CT_EIO, "checkpoint save: getrandom: %s", strerror(errno));
    for (int i = 0; i < 16; i++)
        snprintf(o->token + 2 * i, 3, "%02x", raw[i]);
    o->pid = (long)getpid();
    if (gethostname(o->host, sizeof o->host - 1) != 0)
        o->host[0] = '\0';
    o->host[sizeof o->host - 1] = '\0';
    read_boot_id(o->boot, sizeof o->boot);
    return 0;
}

/* The marker's owner; false when it names none (empty, or not ct's). */
static bool read_owner(int dirfd, const char *tmp, owner *o) {
    char *path = join(tmp, CK_TMP_MARKER);
    bool missing;
    int fd = path ? ct__ckpt_open_regular(dirfd, path, path, &missing) : -1;
    free(path);
    ct_errclear();
    if (fd < 0)
        return false;
    char text[1024];
    ssize_t n = pread(fd, text, sizeof text - 1, 0);
    close(fd);
    if (n <= 0)
        return false;
    text[n] = '\0';
    *o = (owner){.pid = -1};
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strncmp(line, "owner ", 6))
            snprintf(o->token, sizeof o->token, "%s", line + 6);
        else if (!strncmp(line, "pid ", 4))
            o->pid = strtol(line + 4, NULL, 10);
        else if (!strncmp(line, "host ", 5))
            snprintf(o->host, sizeof o->host, "%s", line + 5);
        else if (!strncmp(line, "boot ", 5))
            snprintf(o->boot, sizeof o->boot, "%s", line + 5);
    }
    return o->token[0] && o->pid > 0 && o->host[0];
}

/* Whether the save that wrote marker owner o is provably over: it was made
 * on this host, and that host has rebooted since or has no process o->pid.
 * A tmp from another host, or one a live process may still be writing, is
 * never removed. */
static bool owner_gone(const owner *o, const owner *me) {
    if (strcmp(o->host, me->host))
        return false;
    if (o->boot[0] && me->boot[0] && strcmp(o->boot, me->boot))
        return true;
    return kill((pid_t)o->pid, 0) != 0 && errno == ESRCH;
}

/* A "*.tmp" directory in parent is removed when it holds a manifest and no
 * marker (a replaced or retired checkpoint whose removal a crash cut short,
 * left by a ct older than mark_as_mine: a save removes its marker only after
 * the rename), or when its marker names a save that is provably over
 * (owner_gone). Another save's tmp in
 * progress, and any directory ct did not make, stay. */
static int remove_stale(const char *parent, const owner *me) {
    int dirfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dirfd >= 0 ? fdopendir(dup(dirfd)) : NULL;
    if (!d) {
        int rc = ct__err_set(CT_EIO, "%s: %s", parent, strerror(errno));
        if (dirfd >= 0)
            close(dirfd);
        return rc;
    }
    int rc = 0;
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        if (!ends_with(de->d_name, ".tmp") || de->d_name[0] == '.')
            continue;
        char *p = join(parent, de->d_name);
        owner o;
        bool marked = p && is_file(p, CK_TMP_MARKER);
        if (!p)
            rc = ct_errcode();
        else if (marked ? read_owner(dirfd, de->d_name, &o) && owner_gone(&o, me)
                        : is_file(p, CK_MANIFEST))
            rc = ct__ckpt_remove_tree(p);
        free(p);
    }
    closedir(d);
    close(dirfd);
    return rc;
}

/* Writes dir's marker naming owner o (replacing any), never through a
 * symbolic link. */
static int write_marker(const char *dir, const owner *o) {
    char *marker = join(dir, CK_TMP_MARKER);
    if (!marker)
        return ct_errcode();
    int rc, fd = open(marker, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    char text[512];
    int n = snprintf(text, sizeof text,
                     "ct-checkpoint save in progress\nowner %s\npid %ld\nhost %s\nboot %s\n",
                     o->token, o->pid, o->host, o->boot);
    if (fd < 0)
        rc = ct__err_set(CT_EIO, "%s: %s", marker, strerror(errno));
    else
        rc = ct__file_pwrite_all(fd, text, (size_t)n, 0, marker);
    if (fd >= 0)
        close(fd);
    free(marker);
    return rc;
}

/* Marks the committed checkpoint dir, which is about to become a "*.tmp"
 * (replaced by a new save, or retired), as this process's: until this
 * process removes it, another saver's remove_stale then spares it, rather
 * than removing it beside this process (the two removals collide) or while
 * this process's next save already fills a new tmp of that name. A crash
 * leaves a marker whose owner is gone, which any later save removes. */
static int mark_as_mine(const char *dir) {
    owner me;
    int rc = make_owner(&me);
    return rc ? rc : write_marker(dir, &me);
}

static int prepare(const char *path, const char *tmp) {
    owner me;
    char *parent = ct__file_parent_dir(path);
    int rc = parent ? ct__ckpt_make_dirs(parent) : ct_errcode();
    if (!rc)
        rc = make_owner(&me);
    if (!rc)
        rc = remove_stale(parent, &me);
    /* PATH.tmp itself, whatever it holds: a save of PATH owns that name. */
    if (!rc)
        rc = ct__ckpt_remove_tree(tmp);
    if (!rc && mkdir(tmp, 0755) != 0)
        rc = ct__err_set(CT_EIO, "%s: creating the directory: %s", tmp, strerror(errno));
    if (!rc)
        rc = write_marker(tmp, &me);
    free(parent);
    return rc;
}

/* The checksums of a file's blocks, computed as its bytes are written, in
 * order: chunks, and the zeros between them. */
typedef struct block_sums {
    XXH3_state_t *hs;
    int64_t pos;   /* bytes of the file hashed so far */
    uint64_t *out; /* [nblocks] */
} block_sums;

static void blocks_feed(block_sums *b, const char *p, int64_t n) {
    while (n > 0) {
        int64_t room = CK_BLOCK_BYTES - b->pos % CK_BLOCK_BYTES, take = n < room ? n : room;
        XXH3_64bits_update(b->hs, p, (size_t)take);
        b->pos += take;
        p += take;
        n -= take;
        if (b->pos % CK_BLOCK_BYTES == 0) {
            b->out[b->pos / CK_BLOCK_BYTES - 1] = XXH3_64bits_digest(b->hs);
            XXH3_64bits_reset(b->hs);
        }
    }
}

static void blocks_pad_to(block_sums *b, int64_t pos) {
    static const char zeros[CK_ALIGN];
    blocks_feed(b, zeros, pos - b->pos);
}

/* A piece of a chunk, for its two checksums: the chunk's (task 0) and its
 * blocks' (task 1). Format 1.1 keeps both, as readers of 1.0 check the
 * chunk's; hashing every byte twice on one thread made a save 5-10% slower
 * than 1.0's, so the two run on two of ct's threads where there are two. */
typedef struct piece_hashes {
    XXH3_state_t *chunk;
    block_sums *blocks;
    const char *p;
    int64_t n;
} piece_hashes;

static void hash_piece(void *ctx, int64_t lo, int64_t hi) {
    piece_hashes *ph = ctx;
    for (int64_t task = lo; task < hi; task++) {
        if (task == 0)
            XXH3_64bits_update(ph->chunk, ph->p, (size_t)ph->n);
        else
            blocks_feed(ph->blocks, ph->p, ph->n);
    }
}

static int write_source(int fd, const char *file, const ck_manifest *m, const ck_source *s,
                        block_sums *blocks, uint64_t *hash) {
    const ck_chunk *c = &m->tensors[s->tensor].chunks[s->chunk];
    ct_tensor *src = ct__ckpt_on_host(s->t);
    if (src && !ct_is_contiguous(src)) {
        ct_tensor *packed =
            ct__tensor_own(ct_empty(ct_ndim(src), ct_sizes(src), ct_tensor_dtype(src)));
        if (packed)
            ct__cpu_copy_into(packed, src);
        ct_tensor_free(src);
        src = packed;
    }
    if (!src)
        return ct_errcode();
    const char *data = ct_data_ptr(src);
    XXH3_state_t *hs = XXH3_createState();
    int rc = hs && XXH3_64bits_reset(hs) == XXH_OK
                 ? 0
                 : ct__err_set(CT_ENOMEM, "%s: out of memory", file);
    /* Chunks are laid out in the order they are written, after padding
     * that is zeros. */
    CT_ASSERT(blocks->pos <= c->byte_offset && c->byte_offset - blocks->pos < CK_ALIGN);
    blocks_pad_to(blocks, c->byte_offset);
    for (int64_t done = 0; done < c->nbytes && !rc; done += WRITE_PIECE) {
        int64_t n = c->nbytes - done < WRITE_PIECE ? c->nbytes - done : WRITE_PIECE;
        ct_parallel_for(0, 2, 1, hash_piece, &(piece_hashes){hs, blocks, data + done, n});
        rc = ct__file_pwrite_all(fd, data + done, (size_t)n, c->byte_offset + done, file);
        /* Only a start: the fsync at the end is what makes it durable. */
        if (!rc)
            sync_file_range(fd, c->byte_offset + done, n, SYNC_FILE_RANGE_WRITE);
    }
    if (!rc)
        *hash = XXH3_64bits_digest(hs);
    XXH3_freeState(hs);
    ct_tensor_free(src);
    return rc;
}

/* This rank's file, fsynced; the chunks' checksums into hashes, then its
 * blocks' (hashes has room for both). */
static int write_file(const char *tmp, const ck_plan *plan, uint64_t *hashes) {
    if (plan->file < 0)
        return 0;
    const ck_file *f = &plan->m->files[plan->file];
    char *file = join(tmp, f->name);
    if (!file)
        return ct_errcode();
    block_sums blocks = {XXH3_createState(), 0, hashes + plan->nsources};
    int rc = blocks.hs && XXH3_64bits_reset(blocks.hs) == XXH_OK
                 ? 0
                 : ct__err_set(CT_ENOMEM, "%s: out of memory", file);
    int fd = rc ? -1 : open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (!rc && fd < 0)
        rc = ct__err_set(CT_EIO, "%s: %s", file, strerror(errno));
    /* The padding between chunks reads as zeros. */
    else if (!rc && ftruncate(fd, (off_t)f->nbytes) != 0)
        rc = ct__err_set(CT_EIO, "%s: %s", file, strerror(errno));
    for (int i = 0; i < plan->nsources && !rc; i++)
        rc = write_source(fd, file, plan->m, &plan->sources[i], &blocks, &hashes[i]);
    if (!rc && blocks.pos % CK_BLOCK_BYTES)
        blocks.out[blocks.pos / CK_BLOCK_BYTES] = XXH3_64bits_digest(blocks.hs);
    XXH3_freeState(blocks.hs);
    if (!rc && fsync(fd) != 0)
        rc = ct__err_set(CT_EIO, "%s: fsync: %s", file, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && !rc)
        rc = ct__err_set(CT_EIO, "%s: close: %s", file, strerror(errno));
    free(file);
    return rc;
}

/* Rank 0 learns every rank's checksums from the exchange: rank r's are in
 * the order of its chunks in the manifest. */
static int fill_hashes(ck_manifest *m, const ck_blob *all, int size) {
    for (int r = 0; r < size; r++) {
        size_t k = 0;
        int fi = -1; /* rank r's file */
        for (int i = 0; i < m->ntensors; i++)
            for (int c = 0; c < m->tensors[i].nchunks; c++) {
                ck_chunk *ch = &m->tensors[i].chunks[c];
                if (ch->rank != r)
                    continue;
                if ((k + 1) * sizeof(uint64_t) > all[r].len)
                    return ct__err_set(CT_EMISMATCH,
                                       "checkpoint save: rank %d sent %zu checksums, fewer than "
                                       "its chunks",
                                       r, all[r].len / sizeof(uint64_t));
                memcpy(&ch->xxh3, all[r].data + k * sizeof(uint64_t), sizeof(uint64_t));
                k++;
                fi = ch->file;
            }
        if (fi < 0)
            continue;
        ck_file *f = &m->files[fi];
        if ((k + (size_t)f->nblocks) * sizeof(uint64_t) != all[r].len)
            return ct__err_set(CT_EMISMATCH,
                               "checkpoint save: rank %d sent %zu checksums, not its %zu chunks' "
                               "and its file's %lld blocks'",
                               r, all[r].len / sizeof(uint64_t), k, (long long)f->nblocks);
        f->blocks = malloc(sizeof(uint64_t) * (size_t)(f->nblocks + 1));
        if (!f->blocks)
            return ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
        memcpy(f->blocks, all[r].data + k * sizeof(uint64_t),
               sizeof(uint64_t) * (size_t)f->nblocks);
    }
    return 0;
}

static int write_manifest(const char *tmp, const ck_manifest *m) {
    char *text = ct__manifest_emit(m);
    char *file = text ? join(tmp, CK_MANIFEST) : NULL;
    int rc = file ? 0 : ct_errcode();
    int fd = rc ? -1 : open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (!rc && fd < 0)
        rc = ct__err_set(CT_EIO, "%s: %s", file, strerror(errno));
    if (!rc)
        rc = ct__file_pwrite_all(fd, text, strlen(text), 0, file);
    if (!rc && fsync(fd) != 0)
        rc = ct__err_set(CT_EIO, "%s: fsync: %s", file, strerror(errno));
    if (fd >= 0)
        close(fd);
    free(file);
    free(text);
    return rc;
}

/* Puts tmp at path. An existing checkpoint at path is swapped out in one
 * step (RENAME_EXCHANGE), so that path always holds a whole checkpoint; the
 * old one, now at tmp, is removed after. */
static int move_into_place(const char *tmp, const char *path) {
    if (rename(tmp, path) == 0)
        return 0;
    if (errno != EEXIST && errno != ENOTEMPTY)
        return ct__err_set(CT_EIO, "renaming %s to %s: %s", tmp, path, strerror(errno));
    int rc = mark_as_mine(path);
    if (rc)
        return rc;
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_EXCHANGE) != 0)
        return ct__err_set(CT_EIO, "replacing %s with %s: %s", path, tmp, strerror(errno));
    return ct__ckpt_remove_tree(tmp);
}

typedef struct found {
    char *name;
    int64_t step;
} found;

/* The committed checkpoints in dir that record a step. */
static int scan(const char *dir, found **out, int *n) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? 0 : ct__err_set(CT_EIO, "%s: %s", dir, strerror(errno));
    int rc = 0, cap = 0;
    struct dirent *de;
    while (!rc && (de = readdir(d))) {
        if (de->d_name[0] == '.' || ends_with(de->d_name, ".tmp"))
            continue;
        char *p = join(dir, de->d_name);
        if (!p) {
            rc = ct_errcode();
            break;
        }
        ck_manifest *m = NULL;
        int ignored = is_file(p, CK_MANIFEST) ? ct__manifest_read(p, &m) : CT_EINVAL;
        free(p);
        if (ignored || m->step < 0) {
            ct__manifest_free(m);
            continue;
        }
        if ((rc = CT__GROW(*out, &cap, *n + 1, 0, dir))) {
            ct__manifest_free(m);
            break;
        }
        (*out)[*n] = (found){strdup(de->d_name), m->step};
        ct__manifest_free(m);
        if (!(*out)[(*n)++].name)
            rc = ct__err_set(CT_ENOMEM, "%s: out of memory", dir);
    }
    closedir(d);
    /* Directories that are not checkpoints were skipped, not errors. */
    if (!rc)
        ct_errclear();
    return rc;
}

static void free_found(found *f, int n) {
    for (int i = 0; i < n; i++)
        free(f[i].name);
    free(f);
}

static int newest_first(const void *pa, const void *pb) {
    const found *a = pa, *b = pb;
    if (a->step != b->step)
        return a->step > b->step ? -1 : 1;
    return strcmp(b->name, a->name);
}

/* Retires all but the keep newest checkpoints beside path, path always
 * among those kept. A retired one is renamed to "*.tmp" first, so that a
 * crash mid-removal leaves nothing that loads. */
static int retire(const char *path, int keep) {
    char *parent = ct__file_parent_dir(path);
    if (!parent)
        return ct_errcode();
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    found *f = NULL;
    int n = 0, rc = scan(parent, &f, &n);
    if (!rc)
        qsort(f, (size_t)n, sizeof *f, newest_first);
    int kept = 1;
    for (int i = 0; i < n && !rc; i++) {
        if (!strcmp(f[i].name, base))
            continue;
        if (kept < keep) {
            kept++;
            continue;
        }
        char *victim = join(parent, f[i].name);
        char *tmp = victim ? with_suffix(victim, ".tmp") : NULL;
        if (!tmp)
            rc = ct_errcode();
        else if (!(rc = ct__ckpt_remove_tree(tmp)) && !(rc = mark_as_mine(victim)) &&
                 rename(victim, tmp) != 0)
            rc = ct__err_set(CT_EIO, "retiring %s: %s", victim, strerror(errno));
        if (!rc)
            rc = ct__ckpt_remove_tree(tmp);
        free(victim);
        free(tmp);
    }
    if (!rc)
        rc = ct__file_fsync_dir(parent);
    free_found(f, n);
    free(parent);
    return rc;
}

static int commit(const char *path, const char *tmp, ck_manifest *m, const ck_blob *all, int size,
                  const ct_checkpoint_options *o) {
    char *marker = join(tmp, CK_TMP_MARKER);
    char *parent = ct__file_parent_dir(path);
    char *placed = join(path, CK_TMP_MARKER);
    int rc = marker && parent && placed ? fill_hashes(m, all, size) : ct_errcode();
    if (!rc)
        rc = write_manifest(tmp, m);
    if (!rc)
        rc = ct__file_fsync_dir(tmp);
    /* The marker goes only after the rename: until then the tmp is another
     * saver's to spare, manifest or not (see remove_stale). A checkpoint
     * that a crash left holding it loads all the same. */
    if (!rc)
        rc = move_into_place(tmp, path);
    if (!rc && unlink(placed) != 0)
        rc = ct__err_set(CT_EIO, "%s: %s", placed, strerror(errno));
    if (!rc)
        rc = ct__file_fsync_dir(path);
    if (!rc)
        rc = ct__file_fsync_dir(parent);
    if (!rc && o->keep_last > 0)
        rc = retire(path, o->keep_last);
    free(marker);
    free(placed);
    free(parent);
    return rc;
}

int ct__ckpt_save_write(const char *path, ck_plan *plan, ct_comm *comm,
                        const ct_checkpoint_options *o) {
    char *tmp = with_suffix(path, ".tmp");
    if (!tmp)
        return ct_errcode();
    /* Each step ends in an exchange whose verdict every rank shares, so all
     * ranks stop after the same step. */
    int rc = ct__ckpt_agree(comm, plan->rank == 0 ? prepare(path, tmp) : 0, NULL, 0, NULL);
    uint64_t *hashes = NULL;
    ck_blob *all = NULL;
    if (!rc) {
        int64_t nblocks = plan->file >= 0 ? plan->m->files[plan->file].nblocks : 0;
        size_t n = (size_t)plan->nsources + (size_t)nblocks;
        hashes = calloc(n + 1, sizeof *hashes);
        rc = hashes ? write_file(tmp, plan, hashes)
                    : ct__err_set(CT_ENOMEM, "checkpoint save: out of memory");
        rc = ct__ckpt_agree(comm, rc, hashes, sizeof *hashes * n, &all);
    }
    if (!rc) {
        rc = plan->rank == 0 ? commit(path, tmp, plan->m, all, plan->size, o) : 0;
        rc = ct__ckpt_agree(comm, rc, NULL, 0, NULL);
    }
    /* A save that failed leaves nothing that a later one would have to
     * clean. */
    if (rc && plan->rank == 0) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ct_errmsg());
        int code = ct_errcode();
        ct__ckpt_remove_tree(tmp);
        ct__err_set(code, "%s", msg);
    }
    free(hashes);
    ct__ckpt_blobs_free(all, plan->size);
    free(tmp);
    return rc;
}

int ct__ckpt_check_options(const char *fn, const ct_checkpoint_options *o) {
    if (o->keep_last < 0 || o->step < -1 || o->step > CK_INT_MAX)
        return ct__err_set(CT_EINVAL,
                           "%s: keep_last (%d) must be >= 0 and step (%lld) in [-1, 2^53]", fn,
                           o->keep_last, (long long)o->step);
    return 0;
}

char *ct__ckpt_clean_path(const char *fn, const char *path) {
    if (!path || !*path) {
        ct__err_set(CT_EINVAL, "%s: the path is NULL or empty", fn);
        return NULL;
    }
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    char *p = strndup(path, n);
    if (!p)
        ct__err_set(CT_ENOMEM, "%s: out of memory", fn);
    return p;
}

int ct_checkpoint_save(const char *path, ct_state *st, ct_comm *comm,
                       const ct_checkpoint_options *opts) {
    const char *fn = "ct_checkpoint_save";
    ct_checkpoint_options o = opts ? *opts : ct_checkpoint_defaults();
    int rc = ct__ckpt_state_check(st, fn);
    if (!rc)
        rc = ct__ckpt_check_options(fn, &o);
    if (rc)
        return rc;
    char *p = ct__ckpt_clean_path(fn, path);
    if (!p)
        return ct_errcode();
    ck_plan plan;
    rc = ct__ckpt_save_plan(st, comm, &o, &plan);
    if (!rc) {
        rc = ct__ckpt_save_write(p, &plan, comm, &o);
        ct__ckpt_plan_free(&plan);
    }
    free(p);
    return rc;
}

int ct_checkpoint_latest(const char *dir, char *out, size_t cap) {
    const char *fn = "ct_checkpoint_latest";
    if (!out || !cap)
        return ct__err_set(CT_EINVAL, "%s: the output buffer is NULL or empty", fn);
    out[0] = '\0';
    char *d = ct__ckpt_clean_path(fn, dir);
    if (!d)
        return ct_errcode();
    found *f = NULL;
    int n = 0, rc = scan(d, &f, &n);
    if (!rc && n > 0) {
        qsort(f, (size_t)n, sizeof *f, newest_first);
        int len = snprintf(out, cap, "%s/%s", d, f[0].name);
        rc = len >= 0 && (size_t)len < cap
                 ? 1
                 : ct__err_set(CT_ERANGE, "%s: '%s/%s' does not fit in %zu bytes", fn, d, f[0].name,
                               cap);
        if (rc < 0)
            out[0] = '\0';
    }
    free_found(f, n);
    free(d);
    return rc;
}
