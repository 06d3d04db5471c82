/* ct device dispatch internal header: not installed, not part of the API.
 *
 * One table of kernels per device type, in the way collectives have one
 * per backend (coll_impl.h) and ggml has ggml_backend_i. An op's front end
 * (tensor/ops/) checks its inputs, promotes, broadcasts, allocates the
 * result and records it for autograd; then it calls its device's entry.
 * A device folder (tensor/cpu/, tensor/cuda/) holds only kernels and the
 * table that lists them. An entry a device lacks is NULL: calling it
 * through ct__device_get() fails with CT_EDEVICE, naming the op and the
 * device, and the front end has nothing to branch on (docs/cuda-design.md,
 * "The dispatch table").
 *
 * Code outside the table asks a device one question, ct__is_host()
 * (base_impl.h); everything else is an entry here.
 *
 * Errors: entries return 0 or a negative CT_E* code with the message set,
 * as ct's functions do. Threads: the tables are immutable; every entry may
 * be called from any thread, as its kernels allow (a device's queue orders
 * the work of all threads). */
#ifndef CT_DEVICE_IMPL_H
#define CT_DEVICE_IMPL_H

#include "ops_impl.h"
#include "optim_rules.h"
#include "tensor_impl.h"

#include <stddef.h>

/* A reduction as its front end describes it (tensor/ops/reduce.c). */
typedef struct ct__reduction {
    const char *name; /* the op, for messages */
    int kind;         /* CT__KIND_* (ops_impl.h) */
    int post;         /* CT__POST_* */
    double scalar;    /* var/std's correction, norm's p */
    bool index_only;  /* argmax/argmin: out holds the index */
    bool float_out;   /* integer inputs reduce in float32 (logsumexp) */
} ct__reduction;

/* A run of elements that one optimizer step updates with one set of
 * hyperparameters, back to back in the parameters, the gradients and the
 * flat state buffers (optim/optimizer.c plans them). */
typedef struct ct__optim_segment {
    int64_t start; /* first index in the step's iteration space */
    int64_t n;
    char *p;
    const char *g;
    int64_t offset; /* into the flat state buffers, in elements */
    ct__optim_hyper h;
} ct__optim_segment;

/* One optimizer step: its segments in order, end to end [0, total), on
 * elements of dtype (float32 or float64), and the kind's flat state
 * buffers at element 0 (unused ones NULL). */
typedef struct ct__optim_step {
    const ct__optim_segment *segs;
    int nsegs;
    int64_t total;
    ct_dtype dtype;
    char *bufs[CT__OPTIM_MAX_BUFS];
} ct__optim_step;

/* Scaled dot-product attention (nn/attention.c plans it). The matrices
 * of a unit (a batch and head): q, k, v and the output's gradient in, the
 * output and the gradients of q, k and v out. */
enum {
    CT__ATT_Q,
    CT__ATT_K,
    CT__ATT_V,
    CT__ATT_GO,
    CT__ATT_OUT,
    CT__ATT_GQ,
    CT__ATT_GK,
    CT__ATT_GV,
    CT__ATT_NMATS
};

/* One matrix: its data, row stride (BLAS's leading dim) and batch strides
 * over the broadcast batch shape (0 where it broadcasts), in elements. */
typedef struct ct__att_mat {
    char *data;
    int64_t ld;
    int64_t bstrides[CT_MAX_DIMS];
} ct__att_mat;

/* The batch shape (broadcast over q, k and v) and the matrix dims. */
typedef struct ct__att_dims {
    int nbatch;
    int64_t batch[CT_MAX_DIMS];
    int64_t units, tq, tk, d, dv;
} ct__att_dims;

/* One pass of scaled dot-product attention, forward (out and probs from
 * q, k, v) or backward (gq, gk, gv from go, probs, q, k, v), of float32 or
 * float64 (dbl) matrices that BLAS can read in place (unit-stride rows,
 * leading dims within int32), on the device; the dropout mask is Philox's
 * from seed and offset (nn/attention.c). */
typedef struct ct__attention {
    ct__att_dims s;
    ct__att_mat m[CT__ATT_NMATS];
    bool dbl, causal, backward;
    double scale, p;
    uint64_t seed, offset;
    char *probs; /* [units, tq, tk]: written by forward */
} ct__attention;

typedef struct ct__device_ops {
    const char *name; /* "cpu", "cuda": in messages and device strings */

    /* ---- memory (index: the device's number) */
    /* New storage of nbytes on the device, counted in its statistics; NULL
     * with the message set. op names the caller in that message. */
    ct_storage *(*storage_new)(const char *op, size_t nbytes, int index);
    /* Bytes held by live tensors, and their high-water mark since the start
     * or the last reset_peak. */
    int64_t (*memory_allocated)(int index);
    int64_t (*memory_peak)(int index);
    void (*memory_reset_peak)(int index);
    /* Waits until the work queued on the device is done. */
    int (*synchronize)(int index);
    /* n bytes from device memory at src to host memory at dst, waiting for
     * the work queued before (reading one element: ct_get). */
    int (*read)(int index, void *dst, const void *src, size_t n);
    /* ct_to and ct_to_async (fn names which) of t to device, one side of
     * them this device: a device with its own transfers (pinned host
     * memory, streams) says so here; NULL: a contiguous copy through copy. */
    ct_tensor *(*to)(const char *fn, ct_tensor *t, ct_device device, bool async);

    /* ---- devices and streams (NULL on the host, which has one device and
     * whose work is done when its kernels return) */
    /* How many devices of this type the machine has (0: none usable). */
    int (*count)(void);
    /* The calling thread's device of this type. */
    int (*current)(void);
    /* Makes index the calling thread's device of this type. */
    int (*use)(int index);
    /* Makes index the device of this type for threads that chose none
     * (dist_init: each rank on a machine takes its own). */
    void (*set_default)(int index);
    /* The compute stream of device index: every entry of this table queues
     * its work there, in order, and the device's allocator reuses memory
     * in that order. */
    int (*stream)(int index, void **stream);
    /* Marks t's memory as used by the work queued on stream (a side
     * stream, a collective's) by now: its storage goes back to the pool
     * only once that work is done, however soon t is freed. Without it, a
     * tensor freed while a side stream still reads it is reused under
     * that work. */
    int (*record_stream)(ct_tensor *t, void *stream);

    /* ---- elementwise (operands already checked, on this device, viewed
     * with the broadcast shape (nd, shape) where one is given) */
    /* dst = src, broadcast and converted; src may be on the host when dst
     * is on this device, and the other way round (the device's table is
     * the one of the side that is not the CPU). */
    int (*copy)(ct_tensor *dst, ct_tensor *src);
    /* t = value, converted to t's dtype. */
    int (*fill)(ct_tensor *t, double value);
    /* out = op(src), op a CT__UNARY_OPS index (ops_impl.h), both of out's
     * dtype; p and ip the op's scalars as doubles and as integers. */
    int (*unary)(int op, ct_tensor *out, ct_tensor *src, const double p[2], const int64_t ip[2]);
    /* dst = x (op) y, op a CT__BINARY_OPS index, x and y of dtype (dst of
     * dtype, or bool for a comparison); y NULL: the scalar. */
    int (*binary)(int op, ct_tensor *dst, ct_tensor *x, ct_tensor *y, double scalar, ct_dtype dtype,
                  int nd, const int64_t *shape);
    /* out = cond ? a : b, all of out's dtype but the bool cond; a NULL: the
     * element whose bytes are *a_bits (masked_fill, b then being out). */
    int (*where)(ct_tensor *out, ct_tensor *cond, ct_tensor *a, ct_tensor *b,
                 const uint64_t *a_bits, int nd, const int64_t *shape);

    /* ---- reductions */
    /* out (and indices, max_dim's, or NULL) = r of in over the dims in
     * mask; out is new and contiguous, of in's rank when keepdim, else
     * without the reduced dims, and of the dtype the front end chose. */
    int (*reduce)(const ct__reduction *r, ct_tensor *in, ct_tensor *out, ct_tensor *indices,
                  const bool *mask, bool keepdim);
    /* out = softmax (log: log_softmax) of in along dim (wrapped); out new
     * and contiguous, of in's shape and float dtype. */
    int (*softmax)(ct_tensor *out, ct_tensor *in, int dim, bool log);

    /* ---- fused kernels of nn/ and optim/ (all operands contiguous and on
     * this device; w and b of x's dtype, or NULL) */
    /* Layer norm over x's last dim: y, and mean and rstd per row in the
     * compute type (float64 for float64, else float32). */
    int (*layer_norm)(ct_tensor *y, ct_tensor *mean, ct_tensor *rstd, ct_tensor *x, ct_tensor *w,
                      ct_tensor *b, double eps);
    /* Its backward from dy: dx, dw, db, each NULL when not wanted. */
    int (*layer_norm_backward)(ct_tensor *dx, ct_tensor *dw, ct_tensor *db, ct_tensor *dy,
                               ct_tensor *x, ct_tensor *w, ct_tensor *mean, ct_tensor *rstd);
    bool ln_half; /* layer norm takes 16-bit floats itself (else in float32) */
    /* Cross-entropy of the rows of x [n, c] (float32 or float64) against
     * the int64 targets t [n], in range or ignore: loss [n] float64 (0 on
     * ignored rows) and lse [2, n] of x's dtype (row maxima, then log sum
     * exp(x - max)), which the backward takes. */
    int (*cross_entropy)(ct_tensor *loss, ct_tensor *lse, ct_tensor *x, ct_tensor *t,
                         int64_t ignore, double smoothing);
    /* Its gradient into grad [n, c] of x's dtype; scale (x's dtype) is 0-d
     * or [n], one per row. */
    int (*cross_entropy_backward)(ct_tensor *grad, ct_tensor *x, ct_tensor *t, ct_tensor *lse,
                                  ct_tensor *scale, int64_t ignore, double smoothing);

    /* The attention pass a. Optional: a device without it runs attention
     * as ops (matmul, softmax, masked_fill), which every device has. */
    int (*attention)(const ct__attention *a);
    /* The optimizer step s on device index: every element updated on its
     * own, so any split gives the same bits, and the device's the CPU's. */
    int (*optim_step)(const ct__optim_step *s, int index);

    /* ---- indexing (tensor/ops/index.c's front ends; operands checked) */
    /* Scans index (int64, int32 or uint8) in the element iterator's order:
     * *found says whether a value lies outside [0, bound) (bound < 0:
     * whether one is negative), *bad is the first such, *max the largest
     * (INT64_MIN when empty). The host waits for the answer. */
    int (*scan_index)(ct_tensor *index, int64_t bound, bool *found, int64_t *bad, int64_t *max);
    /* out[..., k, ...] = t[..., index[..., k, ...], ...] along dim, over
     * index's shape (out's); the values are in range. */
    int (*gather)(ct_tensor *out, ct_tensor *t, int dim, ct_tensor *index);
    /* self[..., index[..., k, ...], ...] += src[..., k, ...] along dim. */
    int (*scatter_add)(ct_tensor *self, int dim, ct_tensor *index, ct_tensor *src);
    /* out ([..., classes] int64, contiguous) = one_hot of labels (in
     * range). */
    int (*one_hot)(ct_tensor *out, ct_tensor *labels, int64_t classes);
    /* out (contiguous, t's shape and dtype) = tril(t, k), or triu with
     * upper. */
    int (*band)(ct_tensor *out, ct_tensor *t, int64_t k, bool upper);

    /* ---- matmul (tensor/ops/matmul.c plans it) */
    /* p->c = p->a @ p->b on device index. */
    int (*matmul)(const ct__mm_plan *p, int index);
    bool mm_half;     /* multiplies the 16-bit floats itself (else in float32) */
    int64_t mm_limit; /* the largest matrix dim and leading dim it takes */

    /* ---- random draws (tensor/ops/random.c) */
    /* The draw d into out (contiguous, d->n elements of d->dtype at
     * d->out); the stream's blocks are claimed already. */
    int (*draw)(ct_tensor *out, const ct__draw *d);
    /* The first value of the float tensor p outside [0, 1] (NaN too), in
     * the element iterator's order. */
    int (*scan_probabilities)(ct_tensor *p, bool *found, double *bad);
} ct__device_ops;

/* Registers ops as the table of CT_TEST, the test device (tests/), or
 * takes it away (NULL). Not thread-safe against ops in flight: a test
 * registers before it makes tensors there. CT_EINVAL for another type. */
int ct__device_register(ct_device_type type, const ct__device_ops *ops);

/* The table of device type type, NULL when this build has none (CUDA in a
 * build without it). */
const ct__device_ops *ct__device_ops_of(ct_device_type type);

/* The table of device, if it has the entry at offset (offsetof into
 * ct__device_ops); else NULL with CT_EDEVICE: "op: no ENTRY kernel for
 * DEVICE yet", or that this build has no such device. Use it through
 * CT__DEVICE_GET. */
const ct__device_ops *ct__device_get(const char *op, ct_device device, size_t offset,
                                     const char *entry);
#define CT__DEVICE_GET(op, device, entry)                                                          \
    ct__device_get(op, device, offsetof(ct__device_ops, entry), #entry)

/* "cpu", "cuda": device's type as its table names it ("device 7" for one
 * this build lacks). In static storage, or in buf (32 bytes). */
const char *ct__device_name(ct_device_type type, char buf[32]);

/* The tables the device folders define, each its device's. */
extern const ct__device_ops ct__cpu_device_ops;
extern const ct__device_ops ct__cuda_device_ops;
extern const ct__device_ops ct__meta_device_ops;

#endif
