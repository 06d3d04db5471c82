/* ct/data.h: datasets, samplers and batch loaders.
 *
 * Three pieces, the same ones PyTorch's torchvision datasets,
 * DistributedSampler and DataLoader provide:
 *   - ct_idx_load() reads an IDX file (the MNIST format), plain or gzipped,
 *     and ct_fmnist_load() reads Fashion-MNIST (or MNIST) as training-ready
 *     tensors;
 *   - a ct_sampler (in caller storage) decides which rows each rank sees in
 *     each epoch: shuffled by a pure function of (seed, epoch, size), sharded
 *     over replicas;
 *   - a ct_loader cuts in-memory tensors into batches in the sampler's order,
 *     preparing the next batches on a background thread.
 *
 * Example:
 *
 *     #include <ct/data.h>
 *     #include <stdio.h>
 *
 *     int main(void) {
 *         ct_tensor *images, *labels;
 *         if (ct_fmnist_load(NULL, false, &images, &labels) != 0) {
 *             fprintf(stderr, "%s; using random data\n", ct_errmsg());
 *             images = ct_rand(CT_SHAPE(1000, 784), CT_FLOAT32, NULL);
 *             labels = ct_zeros(CT_SHAPE(1000), CT_INT64);
 *         }
 *         ct_sampler sampler;
 *         ct_sampler_options so = {.size = ct_size(images, 0), .shuffle = true, .seed = 42};
 *         ct_loader_options lo = {.batch_size = 256, .sampler = &sampler};
 *         ct_loader *loader = NULL;
 *         if (ct_sampler_init(&sampler, &so) == 0)
 *             loader = ct_loader_new(images, labels, &lo);
 *         if (!loader) {
 *             fprintf(stderr, "%s\n", ct_errmsg());
 *             return 1;
 *         }
 *         for (int64_t epoch = 0; epoch < 2; epoch++) {
 *             double pixels = 0;
 *             int rc;
 *             ct_tensor *x, *y;
 *             ct_scope_begin();
 *             while ((rc = ct_loader_next(loader, &x, &y)) == 1)
 *                 pixels += ct_item(ct_sum(x, NULL, 0, false));
 *             ct_scope_end();
 *             if (rc < 0) {
 *                 fprintf(stderr, "%s\n", ct_errmsg());
 *                 break;
 *             }
 *             printf("epoch %lld: %lld batches, pixel sum %.1f\n", (long long)epoch,
 *                    (long long)ct_loader_num_batches(loader), pixels);
 *         }
 *         ct_loader_free(loader);
 *         ct_tensor_free(images);
 *         ct_tensor_free(labels);
 *         return 0;
 *     }
 *
 * Ownership. Tensors returned here follow ct's rule: inside a scope the scope
 * owns them, outside one the caller does. A loader holds its own reference to
 * the tensors it is given.
 *
 * Threads. ct_idx_load() and ct_fmnist_load() are thread-safe. A sampler may
 * be read (ct_sampler_len, ct_sampler_indices, ct_sampler_position) from
 * several threads at once, but not while one thread changes its position. A
 * loader is used by one thread at a time; its background thread touches only
 * the loader's own memory and the rows of its inputs.
 */
#ifndef CT_DATA_H
#define CT_DATA_H

#include <ct/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ IDX */

/* Reads the IDX file at path, plain or gzip-compressed (detected from its
 * content). The element type maps to a ct dtype: ubyte -> uint8; sbyte,
 * short, int -> int32; float -> float32; double -> float64. Returns a new
 * contiguous tensor with the header's sizes (scope-owned inside a scope).
 * The tensor may take at most CT_IDX_MAX_BYTES bytes (an environment
 * variable, read at each call); unset, at most 1032 times the file's size,
 * deflate's greatest expansion, so that no gzip file makes the reader hold
 * more than its data could inflate to once sbyte and short widen to int32.
 * Errors: CT_EINVAL for a NULL path or a CT_IDX_MAX_BYTES that is not a
 * whole number of bytes > 0; CT_EIO when the file cannot be opened or read
 * (the system's reason is kept); CT_ECORRUPT for a bad magic number, an
 * unknown type, a dim count outside [1, 8], sizes that overflow or that a
 * file this long cannot hold, a file that ends early, bytes after the data
 * (a plain file, or the decompressed stream of a gzip file), or a damaged
 * gzip stream; CT_ENOMEM for a tensor above the limit (the message names
 * the limit and the sizes) or out of memory. Every message names the path.
 * Thread-safe, while no thread changes the environment. */
CT_API ct_tensor *ct_idx_load(const char *path);

/* The directory Debian's dataset-fashion-mnist package installs. */
#define CT_FMNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Reads the training (train-*) or test (t10k-*) split of Fashion-MNIST from
 * dir (NULL: CT_FMNIST_DIR), from the four files train-images-idx3-ubyte.gz,
 * train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and
 * t10k-labels-idx1-ubyte.gz. MNIST uses the same names and format.
 * On success *images is float32 [N, rows * cols] scaled to [0, 1] and
 * *labels int64 [N], both owned like op results; on failure both are NULL.
 * Errors: those of ct_idx_load(), with the file's path; CT_EINVAL for NULL
 * outputs; CT_ECORRUPT when the images are not ubyte [N, rows, cols], the
 * labels not ubyte [N], the two counts differ, or a label is above 9.
 * Thread-safe. */
CT_API int ct_fmnist_load(const char *dir, bool train, ct_tensor **images, ct_tensor **labels);

/* --------------------------------------------------------------- sampler */

typedef struct ct_sampler_options {
    int64_t size;     /* rows in the dataset, >= 0 */
    bool shuffle;     /* false: rows in order */
    uint64_t seed;    /* the shuffle's seed; every rank must use the same */
    bool drop_last;   /* drop the tail that does not divide among replicas
                         instead of padding it */
    int num_replicas; /* ranks sharing the dataset; 0 means 1 */
    int rank;         /* this rank, in [0, num_replicas) */
} ct_sampler_options;

/* Which rows a rank sees in each epoch, with DistributedSampler's rules. The
 * epoch's order is a permutation of 0..size-1 (the identity without
 * shuffle). Without drop_last it is extended by wrapping around to its start
 * until its length divides by num_replicas; with drop_last it is cut to the
 * largest length that does. Rank r takes elements r, r + num_replicas,
 * r + 2 num_replicas, ... of it, so every rank gets ct_sampler_len() rows.
 *
 * The shuffle rule: the permutation for epoch e is
 *     ct_randperm(size, &(ct_generator){seed, (uint64_t)e << 32})
 * a pure function of (seed, e, size). It is the same on every rank and
 * thread count, so a resumed run sees the same order. Epochs use disjoint
 * Philox counters for sizes below 2^33.
 *
 * The position (epoch, offset) records where a consumer of the indices has
 * got to, for checkpoints; a loader created from the sampler starts there.
 * The fields are public so that the struct can live in caller storage; set
 * them only through the functions below. */
typedef struct ct_sampler {
    uint32_t magic;
    ct_sampler_options opts;
    int64_t num_samples; /* indices per rank per epoch */
    int64_t epoch;
    int64_t offset; /* in [0, num_samples] */
} ct_sampler;

/* Initialises *s from opts at position (0, 0). Allocates nothing; there is
 * no free. Errors: CT_EINVAL for NULL arguments, a negative size, a negative
 * num_replicas or a rank outside [0, num_replicas), with *s left unusable.
 * Not thread-safe on the same s. */
CT_API int ct_sampler_init(ct_sampler *s, const ct_sampler_options *opts);
/* Indices this rank gets per epoch, or -1 with CT_EINVAL for a sampler that
 * is not initialised. Thread-safe. */
CT_API int64_t ct_sampler_len(const ct_sampler *s);
/* Writes this rank's ct_sampler_len(s) indices for epoch into out (caller
 * storage). Errors: CT_EINVAL for NULL arguments, an uninitialised sampler or
 * a negative epoch; CT_ENOMEM (the permutation needs 24 bytes per row for a
 * moment). Thread-safe: it does not touch the position. */
CT_API int ct_sampler_indices(const ct_sampler *s, int64_t epoch, int64_t *out);
/* Moves to the start of epoch: PyTorch's set_epoch. Errors: CT_EINVAL for an
 * uninitialised sampler or a negative epoch. Not thread-safe. */
CT_API int ct_sampler_set_epoch(ct_sampler *s, int64_t epoch);
/* Moves to offset indices into epoch. Errors: CT_EINVAL as for set_epoch;
 * CT_ERANGE for an offset outside [0, ct_sampler_len(s)]. Not thread-safe. */
CT_API int ct_sampler_set_position(ct_sampler *s, int64_t epoch, int64_t offset);
/* Reads the position; either pointer may be NULL. Returns 0 or CT_EINVAL for
 * an uninitialised sampler. Thread-safe. */
CT_API int ct_sampler_position(const ct_sampler *s, int64_t *epoch, int64_t *offset);

/* ---------------------------------------------------------------- loader */

/* Called on the loader's background thread for each batch before it is
 * handed out, inside a scope of that thread: x and y (y NULL without targets)
 * are the batch's fresh tensors, which it may change in place, and epoch and
 * batch (0-based within the epoch) let it seed a ct_generator for
 * deterministic augmentation. Returns 0 or a negative CT_E* code;
 * ct_loader_next() then reports that code with ct_errmsg() of the background
 * thread (the message of the ct call that failed there, if any). It must not
 * touch the loader, and runs concurrently with the caller's thread. */
typedef int (*ct_loader_transform_fn)(void *ctx, ct_tensor *x, ct_tensor *y, int64_t epoch,
                                      int64_t batch);

typedef struct ct_loader_options {
    int64_t batch_size;               /* rows per batch, > 0 */
    bool drop_last;                   /* drop a last batch of fewer than batch_size rows */
    int prefetch;                     /* batches prepared ahead, in [1, 64]; 0 means 2 */
    const ct_sampler *sampler;        /* copied, position included; NULL: every row in order */
    ct_loader_transform_fn transform; /* may be NULL */
    void *transform_ctx;
} ct_loader_options;

/* A heap object that yields batches of rows of inputs (and targets). */
typedef struct ct_loader ct_loader;

/* A loader over inputs [N, ...] and targets [N, ...] (any dtypes; targets may
 * be NULL). It keeps a reference to each; rows are copied out of them on the
 * background thread, so do not write to them while the loader lives (a data
 * race). Inputs whose rows are not contiguous are copied once here. The
 * background thread starts at once on the sampler's position. The caller owns
 * the loader (ct_loader_free). Errors (NULL): CT_EINVAL for NULL inputs or
 * opts, a bad batch size or prefetch, or an uninitialised sampler; CT_ESHAPE
 * for a 0-d tensor, row counts that differ, or a sampler whose size is not N;
 * CT_EDEVICE for non-CPU tensors; CT_ENOMEM (memory, or the thread cannot
 * start). Not thread-safe: create and use a loader on one thread at a time. */
CT_API ct_loader *ct_loader_new(ct_tensor *inputs, ct_tensor *targets,
                                const ct_loader_options *opts);
/* Stops the background thread (within one batch's work, even mid-epoch),
 * joins it and frees the loader. Batches already handed out stay valid, owned
 * as before. Accepts NULL. Not thread-safe. */
CT_API void ct_loader_free(ct_loader *l);
/* The next batch in the sampler's order. Returns 1 with *x = [b, ...] rows of
 * the inputs and *y = the same rows of the targets (NULL without targets),
 * owned like op results (scope-owned inside a scope, caller-owned outside);
 * 0 at the end of an epoch, with *x and *y NULL, after which the next call
 * starts the next epoch; or a negative CT_E* code: CT_EINVAL for NULL
 * arguments or a freed loader, CT_ENOMEM, or the code and message of a
 * failure on the background thread (out of memory, a failed transform). A
 * failure repeats on every call until ct_loader_set_position() or
 * ct_loader_set_epoch() retries. The order never depends on thread timing.
 * Not thread-safe. */
CT_API int ct_loader_next(ct_loader *l, ct_tensor **x, ct_tensor **y);
/* Batches per epoch for this rank. -1 with CT_EINVAL for NULL. Thread-safe. */
CT_API int64_t ct_loader_num_batches(const ct_loader *l);
/* Restarts at the start of epoch, dropping batches prepared ahead. Errors:
 * CT_EINVAL for NULL or a negative epoch. Not thread-safe. */
CT_API int ct_loader_set_epoch(ct_loader *l, int64_t epoch);
/* Restarts offset rows into epoch (a position ct_loader_position() gave, for
 * resuming from a checkpoint). Errors: CT_EINVAL as for set_epoch; CT_ERANGE
 * for an offset outside [0, rows per epoch]. Not thread-safe. */
CT_API int ct_loader_set_position(ct_loader *l, int64_t epoch, int64_t offset);
/* The position after the last batch ct_loader_next() returned (rows of this
 * rank's epoch consumed); (epoch + 1, 0) once it has returned 0. Either
 * pointer may be NULL. Returns 0 or CT_EINVAL for NULL. Not thread-safe. */
CT_API int ct_loader_position(const ct_loader *l, int64_t *epoch, int64_t *offset);

#ifdef __cplusplus
}
#endif

#endif /* CT_DATA_H */
