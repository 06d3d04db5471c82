/* ct checkpoint internal header: not installed, not part of the API. */
#ifndef CT_CHECKPOINT_IMPL_H
#define CT_CHECKPOINT_IMPL_H

#include <ct/checkpoint.h>

#include "base_impl.h"
#include "file_impl.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ct's checkpoint files are little-endian; this host is not"
#endif

/* The format version this ct writes, and the newest major it reads. */
#define CK_FORMAT_NAME  "ct-checkpoint"
#define CK_FORMAT_MAJOR 1
#define CK_FORMAT_MINOR 1
#define CK_MANIFEST     "manifest.json"
/* Present in a directory a save is still writing; it names the saver (a
 * random token, pid and host) so that only a provably stale one is
 * removed. */
#define CK_TMP_MARKER ".ct-checkpoint-incomplete"
/* Format 1.1: each data file's bytes are checksummed in blocks of this
 * size (the last one shorter), so that a partial read is checked too. */
#define CK_BLOCK_BYTES (INT64_C(1) << 20)
#define CK_ALIGN       64
#define CK_NAME_MAX    1024
/* Integers in JSON are exact in a double up to 2^53: sizes and offsets in a
 * manifest stay below it. */
#define CK_INT_MAX (INT64_C(1) << 53)

/* ----------------------------------------------------------------- state */

typedef enum ck_type { CK_TENSOR, CK_INT64, CK_UINT64, CK_FLOAT64, CK_NTYPES } ck_type;
extern const char *const ct__ckpt_type_names[CK_NTYPES]; /* CK_TENSOR: "tensor" */

typedef struct ck_entry {
    char *name;
    ct_state_kind kind;
    ck_type type;
    ct_tensor *t; /* tensors: retained */
    int ndim;     /* tensors: the global tensor (per-rank: the tensor) */
    int64_t global[CT_MAX_DIMS];
    int64_t offsets[CT_MAX_DIMS]; /* where t starts in the global tensor */
    void *value;                  /* values: the caller's variable */
} ck_entry;

struct ct_state {
    uint32_t magic;
    ck_entry *entries;
    int n, cap;
    char **meta; /* [2 * nmeta]: key, value, key, value, ... */
    int nmeta;
};

int ct__ckpt_state_check(const ct_state *st, const char *fn);
/* The text a value is saved as ("-12", "18446744073709551615", "0.1"),
 * exact for every value; buf holds at least 32 bytes. */
void ct__ckpt_value_format(ck_type type, const void *value, char *buf);
/* Parses text as type into *value (8 bytes); false when it is not one. */
bool ct__ckpt_value_parse(ck_type type, const char *text, void *value);
/* Replaces the metadata with the (key, value) pairs of kv[2 * n]. */
int ct__ckpt_state_replace_meta(ct_state *st, char *const *kv, int n);

/* ------------------------------------------------- tensors on a device */

/* t's values in host memory: a new reference to t when it is on the host
 * (any strides), else a contiguous host copy, made after the work queued on
 * t's device, so that it holds what every op issued before it left there.
 * The caller frees it. NULL with ct_to's errors. */
ct_tensor *ct__ckpt_on_host(ct_tensor *t);
/* dst = host, in place on dst's device: host is a contiguous host tensor of
 * dst's shape and dtype. On a device the write is queued on its stream;
 * host may be freed when this returns. 0, or ct_to's errors. */
int ct__ckpt_write_from_host(ct_tensor *dst, ct_tensor *host);

/* -------------------------------------------------------------- manifest */

struct cJSON;
/* cJSON_ParseWithLengthOpts, serialised: cJSON records every failure in one
 * global, so that parses on several threads at once would race. *end gets
 * where parsing stopped (at the error, on failure). */
struct cJSON *ct__ckpt_json_parse(const char *text, size_t len, const char **end);

typedef struct ck_chunk {
    int64_t offsets[CT_MAX_DIMS], sizes[CT_MAX_DIMS];
    int rank; /* per-rank: whose; otherwise: the rank that wrote it */
    int file; /* index into files; -1 in a partial manifest */
    int64_t byte_offset, nbytes;
    uint64_t xxh3;
} ck_chunk;

typedef struct ck_tensor {
    char *name;
    ct_state_kind kind;
    ct_dtype dtype;
    int ndim;
    int64_t sizes[CT_MAX_DIMS];
    ck_chunk *chunks;
    int nchunks;
} ck_tensor;

typedef struct ck_value {
    char *name;
    ct_state_kind kind;
    ck_type type;
    char **texts; /* replicated: [1]; per-rank: [world_size], NULL where missing */
    int ntexts;
} ck_value;

typedef struct ck_file {
    char *name;
    int64_t nbytes;
    /* Format 1.1: XXH3-64 of each block_bytes-long block of the file;
     * nblocks 0 (1.0) when the manifest has none. */
    int64_t block_bytes, nblocks;
    uint64_t *blocks;
} ck_file;

/* Names to indices, for lookups and duplicate checks in constant time. */
typedef struct ck_names {
    const char **names; /* [cap], NULL where empty */
    int *index;         /* [cap] */
    size_t cap, n;
} ck_names;

typedef struct ck_manifest {
    int major, minor;
    char *writer;
    int world_size;
    int64_t step;
    bool partial; /* one rank's contribution to a save: no files yet */
    ck_file *files;
    int nfiles;
    ck_tensor *tensors;
    int ntensors;
    ck_value *values;
    int nvalues;
    char **meta; /* [2 * nmeta] */
    int nmeta;
    ck_names tensor_names, value_names; /* filled by the parser; empty: search */
    uint64_t text_xxh3;                 /* read from a file: XXH3-64 of its text (the version) */
} ck_manifest;

/* Parses and checks a manifest: structure, types, versions, required
 * features, names, bounds (every chunk inside its tensor and its file), and
 * that each tensor's chunks tile it. where names the source in messages.
 * A partial manifest (partial true) has no files or checksums. Returns 0
 * and *out (free with ct__manifest_free), or CT_ECORRUPT, CT_EVERSION,
 * CT_ENOMEM with a message. Never reads outside text[0..len). */
int ct__manifest_parse(const char *text, size_t len, const char *where, bool partial,
                       ck_manifest **out);
/* The manifest as JSON text (malloc'd), or NULL with CT_ENOMEM. */
char *ct__manifest_emit(const ck_manifest *m);
void ct__manifest_free(ck_manifest *m);
/* Checks that tensor t's chunks lie inside it and tile it exactly; where
 * names the source. */
int ct__manifest_check_tiling(const ck_tensor *t, const char *where);
int ct__manifest_find_tensor(const ck_manifest *m, const char *name);
int ct__manifest_find_value(const ck_manifest *m, const char *name);
/* Reads path/manifest.json and parses it (not partial). */
int ct__manifest_read(const char *path, ck_manifest **out);
/* Reads manifest.json in the directory dirfd (path names it in messages). */
int ct__manifest_read_at(int dirfd, const char *path, ck_manifest **out);

/* ----------------------------------------------------------- file system */

/* ct__file_open with a checkpoint's rules: a file in a checkpoint is never
 * reached through a symlink, and a symlink or a file that is not regular is
 * CT_ECORRUPT; CT_EIO (ENOENT: *missing true) otherwise. */
int ct__ckpt_open_regular(int dirfd, const char *name, const char *shown, bool *missing);

/* Removes a directory tree; missing is fine. */
int ct__ckpt_remove_tree(const char *path);
/* mkdir -p. */
int ct__ckpt_make_dirs(const char *path);
/* ct__file_fsync_dir, ct__file_parent_dir, ct__file_pread_all and ct__file_pwrite_all are in
 * tensor/base/file_impl.h, shared with data/. */

/* ----------------------------------------------------- save, collectively */

/* One rank's bytes in an exchange. */
typedef struct ck_blob {
    int status; /* 0, or the rank's CT_E* code, with data its message */
    char *data;
    size_t len;
} ck_blob;

/* Every rank contributes (status, data[0..len)) and gets all ranks' in
 * all[0..size) (free with ct__ckpt_blobs_free). With comm NULL, just this one.
 * Returns 0 or a collective's error. */
int ct__ckpt_exchange(ct_comm *comm, int status, const void *data, size_t len, ck_blob **all);
void ct__ckpt_blobs_free(ck_blob *all, int n);
/* When any rank's status in all is not 0: records the first such rank's
 * message (prefixed with its rank when there are several ranks) and
 * returns its code; 0 otherwise. */
int ct__ckpt_exchange_verdict(const ck_blob *all, int n);
/* Shares this rank's outcome (rc, with ct_errmsg() when it failed, or else
 * data) and returns every rank's verdict, the same on every rank; *all
 * (nullable) gets every rank's data when all succeeded. */
int ct__ckpt_agree(ct_comm *comm, int rc, const void *data, size_t len, ck_blob **all);

/* A save that has been planned: every rank knows the whole manifest (bar
 * checksums) and which chunks it writes, from where. */
typedef struct ck_source {
    int tensor, chunk; /* in the manifest */
    ct_tensor *t;      /* retained: the data of that chunk */
} ck_source;

typedef struct ck_plan {
    ck_manifest *m;
    int rank, size;
    int file; /* this rank's file in m->files, -1 if it writes nothing */
    ck_source *sources;
    int nsources;
} ck_plan;

/* path without trailing slashes (malloc'd), or NULL with CT_EINVAL naming
 * fn for an empty path, CT_ENOMEM. */
char *ct__ckpt_clean_path(const char *fn, const char *path);
/* CT_EINVAL naming fn for options out of range. */
int ct__ckpt_check_options(const char *fn, const ct_checkpoint_options *o);
/* Phase 1, collective: exchange every rank's entries and plan the save. */
int ct__ckpt_save_plan(ct_state *st, ct_comm *comm, const ct_checkpoint_options *o, ck_plan *plan);
/* Phases 2-4, collective: prepare PATH.tmp, write this rank's file, commit. */
int ct__ckpt_save_write(const char *path, ck_plan *plan, ct_comm *comm,
                        const ct_checkpoint_options *o);
void ct__ckpt_plan_free(ck_plan *plan);

/* -------------------------------------------------------------- reading */

typedef struct ck_hasher ck_hasher;

/* A checkpoint's manifest and its files, opened on first use. */
typedef struct ck_reader {
    char *path;
    int dirfd; /* the directory, opened once: a rename over path does not
                * change what this reader reads */
    ck_manifest *m;
    int *fds;          /* [m->nfiles], -1 until opened */
    ck_hasher *hasher; /* checks chunks read whole while the next is read */
    bool no_hasher;    /* its thread could not start: check them in line */
    char *block;       /* [block_cap]: the last block read whole and checked */
    int64_t block_cap;
    int block_file; /* its file, -1 for none */
    int64_t block_index;
    bool *chunk_checked; /* 1.0, by tensor's first chunk + c: checked whole */
    int64_t *chunk_base; /* [ntensors]: the tensor's first chunk in chunk_checked */
} ck_reader;

/* Reads and checks path's manifest. */
int ct__reader_open(const char *path, ck_reader *r);
void ct__reader_close(ck_reader *r);
/* File i's descriptor, opened now if need be; CT_ECORRUPT when it is
 * missing or its size is not the manifest's. *name gets its path. */
int ct__reader_file(ck_reader *r, int i, int *fd, char *name, size_t cap);
/* Waits until every chunk read so far has been checked: the first bad
 * checksum's CT_ECORRUPT, or 0. Call it before the memory read into is
 * freed or handed out, and before reporting success. */
int ct__reader_finish(ck_reader *r);
/* CT_ECORRUPT for block b of f (named file), read for tensor, whose bytes
 * hash to got. */
int ct__ckpt_block_mismatch(const char *file, const ck_file *f, int64_t b, const char *tensor,
                            uint64_t got);
/* CT_ECORRUPT for chunk c of t in file, whose bytes hash to got. */
int ct__ckpt_checksum_mismatch(const char *file, const ck_tensor *t, const ck_chunk *c,
                               uint64_t got);
/* Reads the box (box_off, box_sizes) of tensor i into dst (contiguous,
 * row-major, the box's shape) from every chunk that overlaps it. */
int ct__reader_read_box(ck_reader *r, int i, const int64_t *box_off, const int64_t *box_sizes,
                        char *dst);
/* Reads rank's chunk of per-rank tensor i into dst. */
int ct__reader_read_rank(ck_reader *r, int i, int rank, char *dst);

/* A chunk's bytes that overlap a box of the global tensor, read into dst: a
 * contiguous row-major buffer of the box's shape. fd is the chunk's file.
 * Reads only the overlapping byte runs. When the whole chunk is read, its
 * checksum is checked (CT_ECORRUPT naming file and tensor on a mismatch),
 * maybe later, by r's hasher: see ct__reader_finish(). */
int ct__ckpt_read_overlap(ck_reader *r, int fd, const char *file, const ck_tensor *t,
                          const ck_chunk *c, const int64_t *box_off, const int64_t *box_sizes,
                          char *dst);

#endif
