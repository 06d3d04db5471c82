/* ct/checkpoint.h: sharded, versioned checkpoints, and safetensors files.
 *
 * A checkpoint is a directory. Every rank writes its own shard file of raw
 * little-endian, row-major chunks; rank 0 writes manifest.json, which lists
 * every tensor (dtype, global shape, and each chunk's place in the global
 * tensor, its file, byte range and XXH3 checksum) and every typed value. The
 * manifest is plain JSON: nothing in a checkpoint is ever executed. The
 * format, byte by byte, its versions and the compatibility rules are in
 * docs/checkpoint-format.md.
 *
 * What gets saved is a ct_state: a list of named entries that point at the
 * caller's tensors and variables. The same state serves save and load, so a
 * training program registers its state once, loads it at start-up from the
 * newest checkpoint (ct_checkpoint_latest()), if there is one, and saves it
 * every so often.
 *
 * Example:
 *
 *     #define _POSIX_C_SOURCE 200809L // mkdtemp
 *     #include <ct/checkpoint.h>
 *     #include <stdio.h>
 *     #include <stdlib.h>
 *
 *     int main(void) {
 *         char dir[] = "/tmp/ct_example_XXXXXX", path[64];
 *         if (!mkdtemp(dir))
 *             return 1;
 *         ct_tensor *w = ct_arange(0, 6, 1, CT_FLOAT32);
 *         int64_t step = 100;
 *         ct_state *st = ct_state_new();
 *         ct_state_add_tensor(st, "model.w", w, CT_STATE_REPLICATED);
 *         ct_state_add_i64(st, "train.step", &step, CT_STATE_REPLICATED);
 *         ct_checkpoint_options o = ct_checkpoint_defaults();
 *         o.step = step;
 *         o.keep_last = 3;
 *         snprintf(path, sizeof path, "%s/step-%lld", dir, (long long)step);
 *         int rc = ct_checkpoint_save(path, st, NULL, &o); // NULL: no other ranks
 *
 *         // Later, maybe in a new process: find the newest, load in place.
 *         step = 0;
 *         ct_uniform_(w, 0, 1, NULL);
 *         if (rc == 0 && ct_checkpoint_latest(dir, path, sizeof path) == 1)
 *             rc = ct_checkpoint_load(path, st, NULL);
 *         if (rc != 0)
 *             fprintf(stderr, "%s\n", ct_errmsg());
 *         else
 *             printf("resumed at step %lld, w[5] = %g\n", (long long)step,
 *                    ct_get(w, (int64_t[]){5}));
 *         ct_state_free(st);
 *         ct_tensor_free(w);
 *         snprintf(path, sizeof path, "rm -rf %s", dir);
 *         return rc != 0 || system(path) != 0;
 *     }
 *
 * Kinds. Each entry says how its value relates across ranks:
 *   - CT_STATE_REPLICATED: every rank that registers it holds the same
 *     value. One rank writes it; every rank reads it whole.
 *   - CT_STATE_SHARDED (tensors, ct_state_add_shard): each rank holds one
 *     rectangular block of a global tensor. Loading reshards: each rank reads
 *     only the byte ranges that overlap its block, under any world size and
 *     any blocking.
 *   - CT_STATE_PER_RANK: each rank's own value (a rank's RNG stream, say).
 *     It is valid only at the world size it was saved at: loading it into a
 *     different world size is an error (CT_EINVAL), never a silent drop.
 *     Leave such entries out of the state to reshard without them.
 *
 * Atomic commit. A save writes into "PATH.tmp/", fsyncs every file, writes and
 * fsyncs the manifest last, renames the directory to PATH and fsyncs the
 * parent. A crash at any point leaves the previous checkpoint or the new
 * one, never a half-written one that loads. A save removes stale "*.tmp"
 * directories that earlier saves left beside PATH.
 *
 * Several machines: every rank must see PATH's parent as the same directory
 * (a shared file system), as with torch.distributed.checkpoint.
 *
 * Errors. Functions that return int return 0 or a negative CT_E* code and
 * record a message (ct_errmsg()) that names the checkpoint's file, the
 * entry and the problem. Save and load are collective over comm: when any
 * rank fails, every rank returns the error, with the failing rank's message.
 *   - CT_EIO: a file system error (the message has strerror's text);
 *   - CT_ECORRUPT: a file that does not hold what the manifest says (a
 *     checksum, a size, an offset past the end, broken JSON);
 *   - CT_EVERSION: a checkpoint of a newer major format version, or one that
 *     requires a feature this ct does not know; the message names both
 *     versions;
 *   - CT_EINVAL: a state that does not match the checkpoint (a missing entry,
 *     another dtype or shape, a per-rank entry at another world size) or an
 *     inconsistent state across ranks (shards that overlap or leave gaps);
 *   - collective errors (CT_ETIMEDOUT, CT_EPEER) pass through.
 *
 * Threads. A ct_state, a ct_checkpointer and a ct_tensor_dict are not
 * thread-safe; use each from one thread at a time. Save and load use comm as
 * a collective: no other thread may issue collectives on comm meanwhile (a
 * ct_checkpointer makes its own communicator for that reason). Different
 * states may be saved and loaded from different threads at once.
 */
#ifndef CT_CHECKPOINT_H
#define CT_CHECKPOINT_H

#include <ct/collectives.h>
#include <ct/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ state */

typedef enum ct_state_kind {
    CT_STATE_REPLICATED,
    CT_STATE_SHARDED,
    CT_STATE_PER_RANK,
} ct_state_kind;

/* "replicated", "sharded", "per_rank". */
CT_API const char *ct_state_kind_name(ct_state_kind kind);

/* A named list of what to save and where to load it. It retains the tensors
 * added to it, and borrows the variables its scalars and generators point
 * at: those must outlive it (or its last use). */
typedef struct ct_state ct_state;

/* NULL with CT_ENOMEM. */
CT_API ct_state *ct_state_new(void);
/* Accepts NULL. */
CT_API void ct_state_free(ct_state *st);

/* Entry names are 1-1024 bytes of printable ASCII (no control characters)
 * and unique within the state. Every add returns 0, or CT_EINVAL for a bad
 * handle, a bad or duplicate name, or a bad kind, and CT_ENOMEM. */

/* A whole tensor, replicated or per-rank (any dtype, any strides: a save
 * copies a non-contiguous view, a load copies into it). The tensor is
 * retained until the state is freed; load writes into its memory in place.
 * Tensors on a CUDA device (here and in ct_state_add_shard) pass through
 * host memory: a save copies each to the host when it writes it (a
 * ct_checkpointer: when it stages it), after the work queued on its device,
 * so the file holds the values of every op issued before the save; a load
 * reads into host memory and queues the copy into the tensor on its
 * device's stream. The file is the same as for a host tensor. */
CT_API int ct_state_add_tensor(ct_state *st, const char *name, ct_tensor *t, ct_state_kind kind);
/* This rank's block of a sharded tensor of global shape (ndim,
 * global_sizes): local holds the elements at offsets[d] .. offsets[d] +
 * local's size in d. CT_ESHAPE when local's ndim is not ndim or the block
 * does not fit. At save the blocks of all ranks must tile the global tensor
 * without overlap; a rank may hold no block. */
CT_API int ct_state_add_shard(ct_state *st, const char *name, ct_tensor *local, int ndim,
                              const int64_t *global_sizes, const int64_t *offsets);
/* A sharded tensor may have several blocks on one rank: each added under
 * the tensor's name, with the same dtype and global shape (CT_EINVAL
 * otherwise, naming both). */
/* This rank's elements [offset, offset + numel(flat)) of a sharded tensor
 * of global shape (ndim, global_sizes), in row-major order, held by the
 * contiguous 1-d tensor flat: the flat shards of ZeRO and FSDP, whose
 * ranges cut rows anywhere. Added as the blocks that range covers (a
 * partial first row, whole rows, a partial last row, in each dim: at most
 * 2 ndim - 1), each a view of flat, so that the file holds the tensor in
 * its own shape and loads into any sharding. CT_ESHAPE when flat is not a
 * contiguous 1-d tensor or the range does not fit. */
CT_API int ct_state_add_flat_shard(ct_state *st, const char *name, ct_tensor *flat, int ndim,
                                   const int64_t *global_sizes, int64_t offset);
/* Scalars, read at save and written at load through the pointer. */
CT_API int ct_state_add_i64(ct_state *st, const char *name, int64_t *value, ct_state_kind kind);
CT_API int ct_state_add_u64(ct_state *st, const char *name, uint64_t *value, ct_state_kind kind);
CT_API int ct_state_add_f64(ct_state *st, const char *name, double *value, ct_state_kind kind);
/* A random generator's seed and offset, as the uint64 values "NAME.seed" and
 * "NAME.offset". */
CT_API int ct_state_add_generator(ct_state *st, const char *name, ct_generator *gen,
                                  ct_state_kind kind);
/* Free-form metadata: string keys and values, copied into the state and
 * saved by rank 0. A load replaces the state's metadata with the
 * checkpoint's. value NULL removes key. */
CT_API int ct_state_set_meta(ct_state *st, const char *key, const char *value);
/* The value of key (owned by the state, valid until it changes), or NULL. */
CT_API const char *ct_state_meta(const ct_state *st, const char *key);
/* Number of entries, or a negative CT_E* code for a bad handle. */
CT_API int ct_state_num_entries(const ct_state *st);

/* ------------------------------------------------------------ save, load */

typedef struct ct_checkpoint_options {
    /* The training step the checkpoint holds, recorded in the manifest:
     * ct_checkpoint_latest() and keep_last order checkpoints by it. -1 (the
     * default) records none. */
    int64_t step;
    /* Keep only the keep_last checkpoints with the highest steps among
     * PATH's siblings (the one just saved always stays); 0 keeps all. */
    int keep_last;
} ct_checkpoint_options;

CT_API ct_checkpoint_options ct_checkpoint_defaults(void);

/* Saves st to the directory path, replacing a checkpoint already there.
 * Collective over comm (NULL: this process alone); every rank passes the
 * same path and options. opts NULL: the defaults. */
CT_API int ct_checkpoint_save(const char *path, ct_state *st, ct_comm *comm,
                              const ct_checkpoint_options *opts);
/* Loads every entry of st from the checkpoint at path, in place. Entries the
 * checkpoint has but st lacks are not read. Collective over comm (NULL: this
 * process alone). Every byte read is checked: a chunk read whole against
 * its checksum, a chunk read in part against those of the 1 MiB blocks it
 * touches (format 1.0: the whole chunk's, read first). Files are opened
 * through one directory descriptor, so the load reads one version even if
 * a save replaces path meanwhile (then it retries: CT_ESTATE after 5
 * tries). Errors: CT_ECORRUPT (damage, a symlink or non-regular file),
 * CT_EIO, CT_EVERSION, CT_EINVAL (the state does not match), CT_ESTATE.
 * After an error the state may be partly loaded: load again, or start
 * afresh. */
CT_API int ct_checkpoint_load(const char *path, ct_state *st, ct_comm *comm);
/* Finds the committed checkpoint with the highest step among the
 * directories in dir and writes its path to out (cap bytes). Returns 1 when
 * one was found, 0 when dir holds none (or does not exist), or a negative
 * CT_E* code (CT_ERANGE when out is too small). Directories that are not ct
 * checkpoints, or are not committed, are ignored. */
CT_API int ct_checkpoint_latest(const char *dir, char *out, size_t cap);

/* ----------------------------------------------------- async save */

/* Saves in the background: ct_checkpointer_save() copies the state into
 * staging memory, which is reused from one save to the next, and returns
 * while background threads write and commit. Training may change the
 * state's tensors as soon as it returns (on a device too: their values were
 * copied to the staging, after the work queued there, before it returned). A save waits for the one
 * before it to finish. The checkpointer talks to the other ranks over its own communicator, split
 * from comm when it is created. */
typedef struct ct_checkpointer ct_checkpointer;

/* Collective over comm (NULL: this process alone). NULL with the collective's
 * errors, or CT_ENOMEM. */
CT_API ct_checkpointer *ct_checkpointer_new(ct_comm *comm);
/* Waits for a save in flight, then frees; accepts NULL. */
CT_API void ct_checkpointer_free(ct_checkpointer *ck);
/* Starts saving st to path: ct_checkpoint_save() in the background. Returns
 * the error of the previous save if it failed (that save's error, once; the
 * new one does not start), or an error staging this one. */
CT_API int ct_checkpointer_save(ct_checkpointer *ck, const char *path, ct_state *st,
                                const ct_checkpoint_options *opts);
/* Sizes the staging memory for st and faults it in now, at set-up, so that
 * the first save does not pay for it inside the training loop (about 1 s
 * per GiB here). Collective over the checkpointer's ranks. Optional: a save
 * grows the staging as needed. Errors as for a save's planning; CT_ENOMEM. */
CT_API int ct_checkpointer_reserve(ct_checkpointer *ck, ct_state *st);
/* Waits for the save in flight, if any, and returns its result. */
CT_API int ct_checkpointer_wait(ct_checkpointer *ck);
/* Bytes of staging memory held (it grows to the largest state saved). */
CT_API int64_t ct_checkpointer_staging_bytes(const ct_checkpointer *ck);

/* ------------------------------------------------- reading a checkpoint */

/* A checkpoint opened for inspection: what ctckpt info, verify and diff
 * use. Opening reads and checks the manifest and each file's size, not the
 * data. */
typedef struct ct_checkpoint_reader ct_checkpoint_reader;

typedef struct ct_checkpoint_tensor_info {
    const char *name;
    ct_state_kind kind;
    ct_dtype dtype;
    int ndim; /* of the global tensor; per-rank tensors: of each chunk */
    const int64_t *sizes;
    int nchunks;
} ct_checkpoint_tensor_info;

typedef struct ct_checkpoint_chunk_info {
    const int64_t *offsets; /* in the global tensor; zeros for per-rank chunks */
    const int64_t *sizes;
    int rank; /* the rank it belongs to (per-rank) or that wrote it */
    const char *file;
    int64_t byte_offset, nbytes;
    uint64_t xxh3;
} ct_checkpoint_chunk_info;

CT_API int ct_checkpoint_reader_open(const char *path, ct_checkpoint_reader **out);
CT_API void ct_checkpoint_reader_close(ct_checkpoint_reader *ck);
/* The format version that wrote it, the writer's name, the world size and
 * step (-1: none). */
CT_API void ct_checkpoint_reader_version(const ct_checkpoint_reader *ck, int *major, int *minor);
CT_API const char *ct_checkpoint_reader_writer(const ct_checkpoint_reader *ck);
CT_API int ct_checkpoint_reader_world_size(const ct_checkpoint_reader *ck);
CT_API int64_t ct_checkpoint_reader_step(const ct_checkpoint_reader *ck);
CT_API int ct_checkpoint_reader_num_tensors(const ct_checkpoint_reader *ck);
/* Info of tensor i, borrowed from ck. CT_ERANGE for a bad index. */
CT_API int ct_checkpoint_reader_tensor(const ct_checkpoint_reader *ck, int i,
                                       ct_checkpoint_tensor_info *info);
CT_API int ct_checkpoint_reader_chunk(const ct_checkpoint_reader *ck, int i, int chunk,
                                      ct_checkpoint_chunk_info *info);
/* Index of the tensor named name, or -1. */
CT_API int ct_checkpoint_reader_find(const ct_checkpoint_reader *ck, const char *name);
/* Reads the global tensor i (for a per-rank tensor: rank's chunk) into a new
 * contiguous tensor, checking checksums. The caller owns it (scope rules as
 * for factories). NULL with the errors above. */
CT_API ct_tensor *ct_checkpoint_reader_read(ct_checkpoint_reader *ck, int i, int rank);
/* Values: count, and value i's name, kind, type ("int64", "float64",
 * "uint64") and its text for rank (replicated values ignore rank). */
CT_API int ct_checkpoint_reader_num_values(const ct_checkpoint_reader *ck);
CT_API int ct_checkpoint_reader_value(const ct_checkpoint_reader *ck, int i, int rank,
                                      const char **name, ct_state_kind *kind, const char **type,
                                      const char **text);
/* Metadata: count, and entry i. */
CT_API int ct_checkpoint_reader_num_meta(const ct_checkpoint_reader *ck);
CT_API int ct_checkpoint_reader_meta(const ct_checkpoint_reader *ck, int i, const char **key,
                                     const char **value);
/* Reads every block of every file (format 1.1) and every chunk, and checks
 * their checksums. Damaged blocks give one CT_ECORRUPT naming each (file,
 * block index, byte range, tensor; the first 8 in full); otherwise the
 * first problem is the error. progress (nullable) is called as it goes with
 * the bytes checked so far and in all. */
CT_API int ct_checkpoint_reader_verify(ct_checkpoint_reader *ck,
                                       void (*progress)(int64_t done, int64_t total, void *ctx),
                                       void *ctx);

/* ------------------------------------------------------------ safetensors */

/* An ordered set of named tensors with string metadata: what a safetensors
 * file holds. It retains the tensors added to it. Names, keys and values are
 * UTF-8, as safetensors' JSON header is. */
typedef struct ct_tensor_dict ct_tensor_dict;

/* NULL with CT_ENOMEM. */
CT_API ct_tensor_dict *ct_tensor_dict_new(void);
/* Accepts NULL. */
CT_API void ct_tensor_dict_free(ct_tensor_dict *set);
/* Adds (a reference to) t under name. CT_EINVAL for a bad handle, a name
 * that is NULL, empty, not UTF-8, a duplicate or "__metadata__" (the
 * format's key for the metadata), or a NULL tensor (t NULL after a failed
 * op returns that op's error); CT_ENOMEM. */
CT_API int ct_tensor_dict_add(ct_tensor_dict *set, const char *name, ct_tensor *t);
/* Number of tensors, or CT_EINVAL for a bad handle. */
CT_API int ct_tensor_dict_count(const ct_tensor_dict *set);
/* Name and tensor i (borrowed); NULL with CT_ERANGE for a bad index. */
CT_API const char *ct_tensor_dict_name(const ct_tensor_dict *set, int i);
CT_API ct_tensor *ct_tensor_dict_tensor(const ct_tensor_dict *set, int i);
/* The tensor named name (borrowed), or NULL (no error recorded). */
CT_API ct_tensor *ct_tensor_dict_find(const ct_tensor_dict *set, const char *name);
/* Metadata (safetensors' "__metadata__"), copied, in the order keys were
 * first set; value NULL removes key. CT_EINVAL for a bad handle, a NULL key,
 * or a key or value that is not UTF-8; CT_ENOMEM. */
CT_API int ct_tensor_dict_set_meta(ct_tensor_dict *set, const char *key, const char *value);
/* The value of key (owned by the dict, valid until it changes), or NULL. */
CT_API const char *ct_tensor_dict_meta(const ct_tensor_dict *set, const char *key);
CT_API int ct_tensor_dict_num_meta(const ct_tensor_dict *set);
/* Entry i (borrowed; key and value may be NULL); CT_ERANGE for a bad
 * index. */
CT_API int ct_tensor_dict_meta_at(const ct_tensor_dict *set, int i, const char **key,
                                  const char **value);

/* Writes set to path as a safetensors file (written to "path.tmp", fsynced
 * and renamed into place, then the directory fsynced). Tensors are stored
 * in the set's order, any strides (non-contiguous views are written in
 * row-major order, byte for byte); the header is padded with spaces to a
 * multiple of 8 bytes, as the reference writer does. A tensor on a CUDA
 * device is copied to the host, one at a time, after the work queued on its
 * device. Errors: CT_EINVAL (a bad handle or path, a header over the
 * format's 100 MB), CT_EIO, CT_ENOMEM, and ct_to's errors for a device
 * tensor. */
CT_API int ct_safetensors_save(const char *path, const ct_tensor_dict *set);
/* Reads a safetensors file into a new set (*out, owned by the caller; NULL
 * on failure), in the header's order, each tensor contiguous and on the host
 * (ct_to moves one to a device). The file must
 * follow the format's rules: a header of at most 100 MB of UTF-8 JSON that
 * begins with '{' (trailing whitespace allowed), no duplicate keys, sizes
 * that match shapes without overflow, data offsets that are contiguous, do
 * not overlap and cover the data exactly, no trailing bytes. Errors:
 * CT_ECORRUPT naming the file, the tensor and the rule broken; CT_ENOTSUP
 * for what is valid but ct cannot hold (a dtype ct lacks: F8, I8, U16, ...;
 * more than CT_MAX_DIMS dims; an empty tensor name; a \u0000 in a string);
 * CT_EIO; CT_ENOMEM. */
CT_API int ct_safetensors_load(const char *path, ct_tensor_dict **out);

#ifdef __cplusplus
}
#endif

#endif
