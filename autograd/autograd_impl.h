/* ct autograd internal header: not installed, not part of the API. */
#ifndef CT_AUTOGRAD_IMPL_H
#define CT_AUTOGRAD_IMPL_H

#include <ct/autograd.h>

#include "tensor_impl.h"

#include <pthread.h>

/* The shape and dtype of a tensor a node consumed or produced: enough to
 * check, reduce and convert the gradients that flow through the node. */
typedef struct ct__shape {
    ct_dtype dtype;
    ct_device device;
    int ndim;
    int64_t sizes[CT_MAX_DIMS];
} ct__shape;

typedef struct ct__edge {
    ct_node *node; /* strong; NULL when the input needs no grad */
    int input_nr;
} ct__edge;

typedef struct ct__saved {
    ct_tensor *t; /* strong; an output is kept as an alias without history */
    uint64_t version;
    int output_nr; /* >= 0 when t is that output of the node itself */
    bool present;  /* something was saved here (t is NULL once released) */
} ct__saved;

typedef enum ct__hook_kind { CT__HOOK_GRAD, CT__HOOK_POST_ACCUMULATE } ct__hook_kind;

typedef struct ct__hook {
    struct ct__hook *next;
    int handle;
    ct__hook_kind kind;
    int output_nr; /* which output of a node the hook watches */
    union {
        ct_grad_hook_fn grad;
        ct_post_accumulate_hook_fn post;
    } fn;
    void *ctx;
} ct__hook;

/* What every node's backward receives: the public argument block plus the
 * node itself (for op arguments and input shapes). */
typedef struct ct__fn {
    const char *name;
    int (*backward)(ct_node *node, const ct_backward_args *a);
} ct__fn;

typedef enum ct__node_kind {
    CT__NODE_OP,         /* a recorded tensor op */
    CT__NODE_ACCUMULATE, /* AccumulateGrad of a leaf */
    CT__NODE_CUSTOM,     /* ct_function_record */
    CT__NODE_VIEW,       /* CopySlices or AsStrided: views and their base (views.c) */
} ct__node_kind;

/* Where a view lies in its base, in elements: the base is contiguous, so the
 * same geometry places the view in a contiguous gradient of the base. */
typedef struct ct__geometry {
    int ndim;
    int64_t sizes[CT_MAX_DIMS];
    int64_t strides[CT_MAX_DIMS];
    int64_t offset;
} ct__geometry;

struct ct_node {
    atomic_long refcount;
    ct__node_kind kind;
    ct_op op;
    bool inplace;
    uint64_t seq;
    const ct__fn *fn;
    const ct_function_def *def; /* custom nodes */
    void *ctx;                  /* custom nodes: owned, freed with def->free_ctx */
    ct_op_args args;
    int nnext; /* forward inputs */
    int nout;  /* forward outputs */
    int nsaved;
    ct__edge *next;      /* [nnext] */
    ct__shape *in_meta;  /* [nnext] */
    ct__shape *out_meta; /* [nout] */
    ct__saved *saved;    /* [nsaved] */
    ct__hook *hooks;     /* gradient hooks on outputs of non-leaf tensors */
    ct_tensor *leaf;     /* AccumulateGrad: the leaf, strong */
    ct_node *inner;      /* CopySlices: the in-place op's own node, strong */
    ct__geometry *geom;  /* view nodes: owned */
    char *label;
    void **trace; /* anomaly mode: the call stack that recorded it, owned */
    int ntrace;
};

/* Per-tensor autograd state, in the tensor's opaque slot. Allocated only for
 * tensors that require grad or have history. */
typedef struct ct__meta {
    ct_node *grad_fn; /* strong; NULL for leaves */
    int output_nr;
    bool requires_grad; /* leaves; non-leaves require grad by having grad_fn */
    /* Leaves only, under lock: */
    pthread_mutex_t lock;
    ct_tensor *grad; /* strong */
    ct_node *acc;    /* weak: cleared by the AccumulateGrad node when it dies */
    ct__hook *hooks; /* grad and post-accumulate hooks */
    /* Views made in grad mode: the root tensor whose memory they view,
     * strong, and the base's version when the view's history last matched
     * the base's (an in-place write to the base or another view makes it
     * stale, and it is regenerated from the base). */
    ct_tensor *base;
    uint64_t base_version;
} ct__meta;

static inline ct__meta *ct__meta_of(const ct_tensor *t) { return t ? (ct__meta *)t->meta : NULL; }

/* A view of a base that has history needs grad even before its own history
 * is regenerated (ct__autograd_refresh_view). */
static inline bool ct__needs_grad(const ct_tensor *t) {
    const ct__meta *m = ct__meta_of(t);
    const ct__meta *b = m ? ct__meta_of(m->base) : NULL;
    return m && (m->grad_fn || m->requires_grad || (b && b->grad_fn));
}

/* Grad mode and anomaly state of this thread. */
bool ct__autograd_grad_mode(void);
/* The meta of t, created on first use. NULL on out of memory. */
ct__meta *ct__autograd_meta_get(ct_tensor *t);
/* The edge a gradient for t flows into (its grad_fn, or its leaf's
 * AccumulateGrad, made on first use). node NULL if t needs no grad. Returns
 * 0 or CT_ENOMEM. */
int ct__autograd_gradient_edge(ct_tensor *t, ct__edge *edge);

/* Nodes. ct__node_new allocates a node with room for its arrays (refcount
 * 1, seq from this thread's counter). */
ct_node *ct__node_new(ct__node_kind kind, int nnext, int nout, int nsaved);
ct_node *ct__node_retain(ct_node *n);
/* Drops a reference. Freeing is iterative: a chain of a million nodes frees
 * without recursion. */
void ct__node_release(ct_node *n);
/* Frees the saved tensors (backward without retain_graph). */
void ct__node_release_saved(ct_node *n);
/* Writes "MulBackward0 (from op mul, label 'fc1')" into buf. */
const char *ct__node_desc(char *buf, size_t cap, const ct_node *n);
/* Writes where (outside ct) the node was recorded, from anomaly mode's
 * stack, as "fn+0x1c (prog) < main+0x40 (prog)"; "" without one. */
const char *ct__node_trace(char *buf, size_t cap, const ct_node *n);
/* Keeps t (an input or output of n) for backward. Returns 0 or CT_ENOMEM. */
int ct__node_save(ct_node *n, int slot, ct_tensor *t, int output_nr);
/* Attaches n's history to output i: output i now requires grad. */
int ct__autograd_set_history(ct_tensor *out, ct_node *n, int output_nr);
void ct__autograd_shape_of(ct__shape *s, const ct_tensor *t);
/* "[2, 3]" for a shape record. */
const char *ct__autograd_shape_rec_str(char *buf, const ct__shape *s);

/* Unpacks saved slot i, checking its version. NULL (slot empty) is
 * returned as NULL with *err 0; a stale or freed one sets *err. */
ct_tensor *ct__autograd_saved_unpack(ct_node *n, int i, int *err);

/* Unpacks n's saved tensors and runs its backward on grad_outputs in,
 * writing grad_inputs to out for the inputs that needs marks. */
int ct__node_apply(ct_node *n, ct_tensor **in, ct_tensor **out, const bool *needs);
/* Checks the gradient n produced for its input i (shape, dtype, NaN in
 * anomaly mode), reducing broadcast dims. NULL with a message if wrong. */
ct_tensor *ct__autograd_validate_grad(ct_node *n, int i, ct_tensor *g);

/* Views (views.c). A view op's output remembers its root base. */
int ct__autograd_track_view(ct_tensor *in, ct_tensor *out);
/* Gives a view whose base was written in place since its history was made
 * the history of its place in the base. */
int ct__autograd_refresh_view(ct_tensor *view);
/* Whether an in-place op into the view self can be recorded as a write into
 * its base (CopySlices); 0 or an error naming op. */
int ct__autograd_check_view_write(const char *op, ct_tensor *self);
/* Records the in-place op n on the view self as a write into its base:
 * the base's history becomes CopySlices(n), the view's a slice of it. */
int ct__autograd_record_view_write(ct_node *n, ct_tensor *self);

/* Derivatives of built-in ops. */
typedef struct ct__deriv {
    ct__fn fn;
    /* Bit i: keep input i for backward. */
    unsigned save_inputs;
    bool save_output;
    int saved_output; /* which output save_output keeps */
    /* Bit i: the gradient of input i needs input 0 as it was before an
     * in-place form overwrote it. */
    unsigned needs_old_self;
} ct__deriv;

/* The derivative of op, or NULL for ops without one (their outputs never
 * require grad). */
const ct__deriv *ct__autograd_deriv_of(ct_op op);

/* Runs a backward from roots (edges and their gradients, borrowed for the
 * call; the engine takes its own references). With captures (ct_grad), the gradients flowing
 * into those edges are written to captured[] as new references and no leaf
 * is touched; otherwise leaves accumulate. Reentrant: called from inside a
 * backward it nests, past a depth limit on another thread. */
typedef struct ct__run {
    const ct__edge *roots;
    ct_tensor *const *root_grads;
    int nroots;
    const ct__edge *captures;
    ct_tensor **captured;
    int ncaptures;
    bool retain_graph;
    bool create_graph;
    /* When set, leaves hand their gradients (after their hooks) to sink
     * instead of accumulating into .grad: distributed autograd keeps them
     * per context. A non-zero return aborts the backward. */
    int (*sink)(void *ctx, ct_tensor *leaf, ct_tensor *grad);
    void *sink_ctx;
} ct__run;
int ct__engine_run(const ct__run *run);
/* Gives outputs (float, without history) a custom node with no inputs: a
 * source of gradients that flow elsewhere, as distributed autograd's recv
 * node. The node owns ctx (freed with def->free_ctx, also on failure).
 * Returns 0 or CT_ENOMEM. */
int ct__autograd_function_record_source(const ct_function_def *def, void *ctx,
                                        ct_tensor *const *outputs, int noutputs);
/* ct_backward from one-element outputs, keeping the graph, with leaves'
 * gradients going to sink (ct__run). */
int ct__autograd_backward_sink(ct_tensor *const *outputs, int n,
                               int (*sink)(void *, ct_tensor *, ct_tensor *), void *sink_ctx);
/* True inside a ct_grad (capturing) backward on this thread. */
bool ct__engine_capturing(void);

/* Sums grad down to shape (the reverse of broadcasting) and converts it to
 * its dtype. NULL, without a message, if grad does not broadcast from shape:
 * the caller knows what to name. */
ct_tensor *ct__autograd_sum_to(ct_tensor *grad, const ct__shape *shape);
bool ct__autograd_shape_equal(const ct__shape *s, const ct_tensor *t);

#endif
