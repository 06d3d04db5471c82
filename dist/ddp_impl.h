/* ct dist internal header: not installed, not part of the API.
 *
 * ct_ddp's state, shared by the replicated reducer (ddp.c) and the ZeRO
 * stages (ddp_shard.c). */
#ifndef CT_DDP_IMPL_H
#define CT_DDP_IMPL_H

#include "base_impl.h"

#include <ct/dist.h>
#include <ct/optim.h>

#define DDP_MAGIC      0x63744450u /* "ctDP" */
#define NAMES_IN_ERROR 8

typedef struct ddp_param {
    ct_ddp *ddp;
    ct_tensor *t;     /* the parameter; the list holds the reference */
    const char *name; /* the list's */
    int hook;         /* the post-accumulate hook's handle */
    int bucket;       /* its first bucket (ZeRO-2: it may span nbuckets) */
    int nbuckets;
    int64_t offset, numel; /* in the flat buffer (ZeRO-2: the flat parameters') */
    ct_tensor *grad;       /* the view .grad should be (a reference) */
    int calls;             /* hook calls in this backward */
    int expected;          /* hook calls per backward (static graph: learned) */
    bool used;             /* got a gradient since the last synchronized step */
} ddp_param;

typedef struct ddp_shard ddp_shard;
typedef struct ddp_fsdp ddp_fsdp;

typedef struct ddp_bucket {
    int first, n;      /* its parameters: order[first .. first + n) */
    int64_t lo, numel; /* its range in the flat buffer */
    ct_tensor *view;   /* that range */
    int pending;       /* parameters not ready in this backward */
    ct_work *work;     /* its allreduce, once started */
    /* The last step's allreduce, waited for: on a device it may still run
     * (ct_work_wait only ordered the compute stream after it), so the
     * handle is freed at the next launch, which finds it done. */
    ct_work *waited;
    const char **names; /* NULL-terminated, for ct_ddp_bucket_names */
} ddp_bucket;

struct ct_ddp {
    uint32_t magic;
    ct_comm *comm;
    ct_ddp_options o;
    ct_param_list params;
    int n;
    ddp_param *p;
    int *order; /* parameter indices in the order gradients are expected */
    int nbuckets;
    ddp_bucket *b;
    ct_tensor *flat;
    ct_tensor *map; /* flat's first n elements: the usage map */
    ct_dtype dtype;
    ct_device device;      /* the parameters', and the communicator's */
    ct_tensor *zero, *one; /* 0-d, on device: what fills copy from */
    bool sync;
    bool in_backward; /* the final callback is queued */
    int next_launch;  /* the next bucket to start, in order */
    int64_t iterations;
    int *arrivals; /* first iteration: parameters in the order they arrived */
    int narrivals;
    ct_ddp_comm_hook hook;
    bool has_hook;
    bool joined;         /* out of batches: shadowing the others' iterations */
    bool hooks_progress; /* the hooks advance the allreduces, not a thread */
    ddp_shard *shard;    /* ZeRO-1 and -2 (ddp_shard.c), the optimizer's share for ZeRO-3 */
    ddp_fsdp *fsdp;      /* ZeRO-3 (ddp_fsdp.c) */
};

/* --------------------------------------------------- ZeRO (ddp_shard.c) */

/* Checks opts->shard against the model and lays out this rank's shard;
 * for ZeRO-2 also its gradient buffer and buckets. A collective. */
int ct__ddp_shard_init(ct_ddp *d, ct_module *model);
void ct__ddp_shard_free(ct_ddp *d);
/* ZeRO-2: parameter p's gradient is complete in this backward: it moves
 * into its buckets, and buckets that are full start their reduce. */
int ct__ddp_shard_ready(ct_ddp *d, ddp_param *p);
/* ZeRO-2: the end of backward: what is left moves and starts, every reduce
 * is waited for, and the usage map is checked. */
int ct__ddp_shard_finalize(ct_ddp *d);
/* This rank's piece of a parameter: a 1-d view of param_base at param_at
 * (len elements) whose .grad is the view of grad_base at grad_at. Owned by the
 * caller; NULL with *rc on error. */
ct_tensor *ct__ddp_piece(ct_tensor *param_base, int64_t param_at, ct_tensor *grad_base,
                         int64_t grad_at, int64_t len, int *rc);

/* ------------------------------------------------- ZeRO-3 (ddp_fsdp.c) */

/* Builds the units, moves each one's parameters into a buffer of its own,
 * keeps this rank's shard and hooks the units' forwards. A collective. */
int ct__ddp_fsdp_init(ct_ddp *d, ct_module *model);
/* Gathers every unit one last time (the parameters keep their values) and
 * removes the hooks. A collective. */
void ct__ddp_fsdp_free(ct_ddp *d);
/* Parameter p has its gradient: its unit may be reduce-scattered. */
int ct__ddp_fsdp_ready(ct_ddp *d, ddp_param *p);
/* The end of backward: the units left are reduced, the usage map checked,
 * every unit handed back. */
int ct__ddp_fsdp_finalize(ct_ddp *d);
/* Parameter i's piece of this rank's shard (NULL when it has none there:
 * *rc 0), *from where it starts in the parameter. */
ct_tensor *ct__ddp_fsdp_piece(ct_ddp *d, int i, int64_t *from, int *rc);
/* The optimizer's hooks: after a step every unit is handed back (its shard
 * changed); zero_grad zeroes the gradient shards. */
int ct__ddp_fsdp_after_step(ct_ddp *d);
int ct__ddp_fsdp_zero_grads(ct_ddp *d);
/* Model state: *shards and *grads (bytes of this rank's parameter and
 * gradient shards); returns the staging bytes (the reduce-scatter's, and
 * the largest unit's buffer). */
int64_t ct__ddp_fsdp_bytes(const ct_ddp *d, int64_t *shards, int64_t *grads);
/* ddp.c's end-of-backward callback. */
int ct__ddp_finalize_cb(void *ctx);

/* ddp.c's: a blocking collective on host tensors (out written, in read;
 * the same tensor but for allgather), through copies on the
 * communicator's device when it takes CUDA tensors. */
typedef enum ct__ddp_host_op {
    HOST_ALLGATHER,
    HOST_ALLREDUCE_SUM,
    HOST_ALLREDUCE_MAX,
    HOST_BROADCAST_0
} ct__ddp_host_op;
int ct__ddp_on_host(ct_ddp *d, ct__ddp_host_op kind, ct_tensor *out, ct_tensor *in);
/* ddp.c's: 0 for a live ct_ddp, else CT_EINVAL naming fn. */
int ct__ddp_check(const ct_ddp *d, const char *fn);
/* ddp.c's: writes the usage map (1 per parameter used since the last
 * synchronized step) into map. */
int ct__ddp_write_usage_map(ct_ddp *d, ct_tensor *map);
void ct__ddp_free_buckets(ct_ddp *d);
/* ddp.c's: names the parameters that the averaged usage map says some
 * rank did not use (an error unless find_unused_parameters). */
int ct__ddp_unused_error(ct_ddp *d, ct_tensor *map);

#endif
