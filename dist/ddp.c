/* Data-parallel training: gradient buckets whose allreduce overlaps
 * backward (PyTorch's DistributedDataParallel reducer).
 *
 * One flat gradient buffer holds, from offset 0: a usage map (one element
 * per parameter), then the parameters' gradients. Buckets are contiguous
 * ranges of it in the order gradients are expected, the first bucket at the
 * top of the buffer, so that with the usual reverse-order arrival the
 * gradients stay in registration order (the optimizer's fused path) while
 * the buckets fill from the end. The last bucket reaches down to offset 0
 * and so carries the usage map: every rank learns, from the same allreduce,
 * which parameters some rank did not use.
 *
 * The buffer lives where the parameters do: in host memory (shared memory
 * under shm), or on the parameters' device, where copies, zeroing and the
 * usage map are device ops queued on the compute stream, and a bucket's
 * allreduce follows the gradients queued before it: the nccl backend's on
 * the device, a host backend's through host copies of the bucket
 * (collectives/comm.c stages them). ddp's own small exchanges (model check, arrival order, uneven
 * inputs) go through the communicator's device as well. */
#include "base_impl.h"
#include "ddp_impl.h"
#include "dist_impl.h"

#include <ct/autograd.h>
#include <ct/cuda.h>
#include <ct/dist.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static const char *op = "ddp";

/* ----------------------------------------------- host data, comm's device */

int ct__ddp_on_host(ct_ddp *d, ct__ddp_host_op kind, ct_tensor *out, ct_tensor *in) {
    ct_device on = ct_comm_device(d->comm);
    ct_tensor *dout = ct__tensor_own(ct_to(out, on));
    ct_tensor *din = in != out ? ct__tensor_own(ct_to(in, on))
                     : dout    ? ct_tensor_retain(dout)
                               : NULL;
    int rc = !dout || !din                ? ct_errcode()
             : kind == HOST_ALLGATHER     ? ct_comm_allgather(d->comm, dout, din, NULL)
             : kind == HOST_ALLREDUCE_SUM ? ct_comm_allreduce(d->comm, dout, CT_REDUCE_SUM, NULL)
             : kind == HOST_ALLREDUCE_MAX ? ct_comm_allreduce(d->comm, dout, CT_REDUCE_MAX, NULL)
                                          : ct_comm_broadcast(d->comm, dout, 0, NULL);
    ct_tensor *back = rc ? NULL : ct__tensor_own(ct_to(dout, CT_DEVICE_CPU));
    if (!rc && !back)
        rc = ct_errcode();
    else if (back && back != out)
        ct__cpu_copy_into(out, back);
    ct_tensor_free(back);
    ct_tensor_free(din);
    ct_tensor_free(dout);
    return rc;
}

/* ----------------------------------------------------------- agreement */

/* "fc1.weight float32[256, 784]\n" for every parameter, in order. */
static char *describe(const ct_param_list *pl, size_t *len) {
    size_t cap = 256, n = 0;
    char *s = malloc(cap);
    for (int i = 0; s && i < pl->n; i++) {
        char desc[CT__DESC_STR];
        ct__tensor_desc(desc, pl->tensors[i]);
        size_t need = strlen(pl->names[i]) + strlen(desc) + 3;
        if (CT__GROW(s, &cap, n + need + 1, 0, "ddp: describing the parameters")) {
            free(s);
            return NULL;
        }
        n += (size_t)snprintf(s + n, cap - n, "%s %s\n", pl->names[i], desc);
    }
    if (s)
        s[n] = 0;
    *len = n;
    return s;
}

/* Line i of a description, into out ("(none)" past the end). */
static void line_at(const char *s, int i, char *out, size_t cap) {
    for (; i > 0 && s; i--) {
        s = strchr(s, '\n');
        if (s)
            s++;
    }
    if (!s || !*s) {
        snprintf(out, cap, "(none)");
        return;
    }
    size_t len = strcspn(s, "\n");
    snprintf(out, cap, "%.*s", (int)(len < cap - 1 ? len : cap - 1), s);
}

/* Every rank's description, gathered; then a diff of each against rank 0's
 * into msg. */
static int explain_mismatch(ct_ddp *d, const char *mine, size_t len, char *msg, size_t cap) {
    int size = ct_comm_size(d->comm);
    int64_t my_len = (int64_t)len;
    int rc = 0;
    ct_tensor *lens = ct__tensor_own(ct_empty(1, (int64_t[]){size}, CT_INT64));
    ct_tensor *one = ct__tensor_own(ct_from_data(&my_len, 1, (int64_t[]){1}, CT_INT64));
    if (!lens || !one || (rc = ct__ddp_on_host(d, HOST_ALLGATHER, lens, one))) {
        rc = rc ? rc : ct_errcode();
        goto done;
    }
    int64_t longest = 1;
    for (int r = 0; r < size; r++)
        longest = ((int64_t *)ct_data_ptr(lens))[r] > longest ? ((int64_t *)ct_data_ptr(lens))[r]
                                                              : longest;
    ct_tensor *pad = ct__tensor_own(ct_zeros(1, (int64_t[]){longest + 1}, CT_UINT8));
    ct_tensor *all = ct__tensor_own(ct_empty(1, (int64_t[]){size * (longest + 1)}, CT_UINT8));
    if (pad && all) {
        memcpy(ct_data_ptr(pad), mine, len);
        rc = ct__ddp_on_host(d, HOST_ALLGATHER, all, pad);
    } else {
        rc = ct_errcode();
    }
    if (rc == 0) {
        const char *text = ct_data_ptr(all);
        const char *zero = text;
        size_t used = (size_t)snprintf(msg, cap, "ranks hold different models:");
        for (int r = 1; r < size && used < cap; r++) {
            const char *theirs = text + r * (longest + 1);
            for (int i = 0; used < cap; i++) {
                char a[256], b[256];
                line_at(zero, i, a, sizeof a);
                line_at(theirs, i, b, sizeof b);
                if (!strcmp(a, "(none)") && !strcmp(b, "(none)"))
                    break;
                if (strcmp(a, b))
                    used += (size_t)snprintf(msg + used, cap - used,
                                             " parameter %d: rank 0 has %s, rank %d has %s;", i, a,
                                             r, b);
            }
        }
    }
    ct_tensor_free(pad);
    ct_tensor_free(all);
done:
    ct_tensor_free(lens);
    ct_tensor_free(one);
    return rc;
}

/* Compares a hash of every rank's parameter list; on a difference every
 * rank fails with the diff. */
static int check_same_model(ct_ddp *d) {
    size_t len;
    char *mine = describe(&d->params, &len);
    if (!mine)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", op);
    int size = ct_comm_size(d->comm);
    int64_t h = (int64_t)ct__fnv1a(mine, len);
    ct_tensor *hashes = ct__tensor_own(ct_empty(1, (int64_t[]){size}, CT_INT64));
    ct_tensor *one = ct__tensor_own(ct_from_data(&h, 1, (int64_t[]){1}, CT_INT64));
    int rc = hashes && one ? ct__ddp_on_host(d, HOST_ALLGATHER, hashes, one) : ct_errcode();
    bool same = true;
    for (int r = 0; rc == 0 && r < size; r++)
        same &= ((int64_t *)ct_data_ptr(hashes))[r] == h;
    if (rc == 0 && !same) {
        char msg[2048];
        rc = explain_mismatch(d, mine, len, msg, sizeof msg);
        if (rc == 0)
            rc = ct__err_set(CT_EMISMATCH, "%s: rank %d: %s", op, ct_comm_rank(d->comm), msg);
    }
    ct_tensor_free(hashes);
    ct_tensor_free(one);
    free(mine);
    return rc;
}

/* Rank 0's parameters and buffers, everywhere: every broadcast in flight at
 * once. */
static int broadcast_state(ct_ddp *d, ct_module *model) {
    ct_param_list buffers;
    ct_param_list_init(&buffers);
    int rc = ct_module_named_buffers(model, &buffers);
    int n = d->params.n + buffers.n;
    ct_work **works = calloc((size_t)n + 1, sizeof *works);
    if (!rc && !works)
        rc = ct__err_set(CT_ENOMEM, "%s: out of memory", op);
    for (int i = 0; !rc && i < n; i++) {
        ct_tensor *t = i < d->params.n ? d->params.tensors[i] : buffers.tensors[i - d->params.n];
        rc = ct_comm_broadcast(d->comm, t, 0, &works[i]);
    }
    for (int i = 0; works && i < n; i++) {
        if (works[i]) {
            int wrc = ct_work_wait(works[i]);
            rc = rc ? rc : wrc;
            ct_work_free(works[i]);
        }
    }
    free(works);
    ct_param_list_free(&buffers);
    return rc;
}

/* -------------------------------------------------------------- buckets */

void ct__ddp_free_buckets(ct_ddp *d) {
    for (int i = 0; i < d->nbuckets; i++) {
        ct_work_free(d->b[i].work);
        ct_work_free(d->b[i].waited);
        ct_tensor_free(d->b[i].view);
        free(d->b[i].names);
    }
    free(d->b);
    d->b = NULL;
    d->nbuckets = 0;
}

/* Lays out the flat buffer and cuts the buckets for d->order; gradients
 * already accumulated move with their parameters. */
static int build_buckets(ct_ddp *d) {
    int64_t total = d->n;
    for (int i = 0; i < d->n; i++)
        total += d->p[i].numel;
    /* In memory every rank maps, the buffer's allreduce reads the peers'
     * gradients where they lie (ct_comm_zeros). A collective: every rank
     * builds its buckets at the same point. Parameters on a device that a
     * host backend stages keep their buffer on that device. */
    bool staged = !ct_device_equal(d->device, ct_comm_device(d->comm));
    ct_tensor *flat = ct__tensor_own(staged ? ct_full_on(1, &total, 0, d->dtype, d->device)
                                            : ct_comm_zeros(d->comm, 1, &total, d->dtype));
    ddp_bucket *b = calloc((size_t)d->n, sizeof *b);
    if (!flat || !b) {
        ct_tensor_free(flat);
        free(b);
        return ct_errcode() ? ct_errcode() : ct__err_set(CT_ENOMEM, "%s: out of memory", op);
    }
    int64_t esize = (int64_t)ct_dtype_size(d->dtype), top = total;
    int nb = 0;
    for (int k = 0; k < d->n; k++) {
        ddp_param *p = &d->p[d->order[k]];
        ddp_bucket *cur = nb ? &b[nb - 1] : NULL;
        int64_t cap = nb <= 1 ? d->o.first_bucket_bytes : d->o.bucket_bytes;
        /* A parameter larger than the cap gets a bucket of its own. */
        if (!cur || (cur->numel + p->numel) * esize > cap) {
            cur = &b[nb++];
            cur->first = k;
        }
        top -= p->numel;
        p->offset = top;
        p->bucket = nb - 1;
        cur->n++;
        cur->lo = top;
        cur->numel += p->numel;
    }
    /* The last bucket carries the usage map below the gradients. */
    b[nb - 1].lo = 0;
    b[nb - 1].numel += d->n;
    int rc = 0;
    for (int i = 0; !rc && i < d->n; i++) {
        ddp_param *p = &d->p[i];
        ct_tensor *slice = ct__tensor_own(ct_narrow(flat, 0, p->offset, p->numel));
        ct_tensor *view =
            slice ? ct__tensor_own(ct_view(slice, ct_ndim(p->t), ct_sizes(p->t))) : NULL;
        ct_tensor_free(slice);
        ct_tensor *old = ct_tensor_grad(p->t);
        rc = !view ? ct_errcode() : old ? ct__tensor_copy_any(view, old) : 0;
        if (!rc)
            rc = ct_tensor_set_grad(p->t, view);
        ct_tensor_free(p->grad);
        p->grad = view;
    }
    for (int i = 0; !rc && i < nb; i++) {
        b[i].view = ct__tensor_own(ct_narrow(flat, 0, b[i].lo, b[i].numel));
        b[i].names = calloc((size_t)b[i].n + 1, sizeof *b[i].names);
        if (!b[i].view || !b[i].names)
            rc = ct_errcode() ? ct_errcode() : ct__err_set(CT_ENOMEM, "%s: out of memory", op);
        for (int k = 0; !rc && k < b[i].n; k++)
            b[i].names[k] = d->p[d->order[b[i].first + k]].name;
        b[i].pending = b[i].n;
    }
    ct__ddp_free_buckets(d);
    d->b = b;
    d->nbuckets = nb;
    ct_tensor_free(d->flat);
    d->flat = flat;
    ct_tensor_free(d->map);
    d->map = ct__tensor_own(ct_narrow(flat, 0, 0, d->n));
    return rc ? rc : d->map ? 0 : ct_errcode();
}

/* ------------------------------------------------------------ backward */

/* The usage map: 1 for a parameter this rank used since the last
 * synchronized step (or any, once it has joined); averaged, 1 means every
 * rank used it. It goes out with the last bucket. */
int ct__ddp_write_usage_map(ct_ddp *d, ct_tensor *map) {
    int rc = ct__tensor_copy_any(map, d->one);
    for (int k = 0; !rc && !d->joined && k < d->n; k++) {
        if (d->p[k].used)
            continue;
        ct_tensor *entry = ct__tensor_own(ct_narrow(map, 0, k, 1));
        rc = entry ? ct__tensor_copy_any(entry, d->zero) : ct_errcode();
        ct_tensor_free(entry);
    }
    return rc;
}

static int launch(ct_ddp *d, int i) {
    ddp_bucket *b = &d->b[i];
    ct_work_free(b->waited);
    b->waited = NULL;
    int rc = i == d->nbuckets - 1 ? ct__ddp_write_usage_map(d, d->map) : 0;
    if (rc)
        return rc;
    if (d->has_hook)
        return d->hook.start(d->comm, b->view, i, d->hook.ctx, &b->work);
    return ct_comm_allreduce(d->comm, b->view, CT_REDUCE_AVG, &b->work);
}

/* Starts every bucket that is ready, in bucket order. */
static int launch_ready(ct_ddp *d) {
    int rc = 0;
    while (!rc && d->next_launch < d->nbuckets && d->b[d->next_launch].pending == 0)
        rc = launch(d, d->next_launch++);
    return rc;
}

/* .grad must stay the bucket's view; a backward after zero_grad with
 * set_to_none made a new tensor, which goes back into the view. */
static int keep_view(ddp_param *p) {
    ct_tensor *g = ct_tensor_grad(p->t);
    if (g == p->grad)
        return 0;
    CT_TRY(ct__tensor_copy_any(p->grad, g ? g : p->ddp->zero));
    return ct_tensor_set_grad(p->t, p->grad);
}

static int finalize(void *ctx);

int ct__ddp_finalize_cb(void *ctx) { return finalize(ctx); }

/* Uneven inputs: how many ranks still train (this one counts if it does). */
static int count_training(ct_ddp *d, int *training) {
    int32_t mine = d->joined ? 0 : 1;
    ct_tensor *t = ct__tensor_own(ct_from_data(&mine, 1, (int64_t[]){1}, CT_INT32));
    int rc = t ? ct__ddp_on_host(d, HOST_ALLREDUCE_SUM, t, t) : ct_errcode();
    if (!rc)
        *training = ((int32_t *)ct_data_ptr(t))[0];
    ct_tensor_free(t);
    return rc;
}

static int on_grad(ct_tensor *leaf, void *ctx) {
    ddp_param *p = ctx;
    ct_ddp *d = p->ddp;
    bool sharded_grads = d->o.shard >= CT_DDP_SHARD_GRADIENTS;
    int rc = sharded_grads ? 0 : keep_view(p);
    if (rc)
        return ct_autograd_fail(rc, "%s: parameter %s: %s", op, p->name, ct_errmsg());
    p->used = true;
    if (!d->sync)
        return 0;
    if (!d->in_backward) {
        int training;
        if (d->o.uneven_inputs && (rc = count_training(d, &training)))
            return ct_autograd_fail(rc, "%s: %s", op, ct_errmsg());
        if ((rc = ct_autograd_queue_final_callback(finalize, d)))
            return rc;
        d->in_backward = true;
    }
    bool learning = d->o.static_graph && d->iterations == 0;
    if (++p->calls == 1 && d->iterations == 0)
        d->arrivals[d->narrivals++] = (int)(p - d->p);
    if (learning)
        return 0; /* the first iteration of a static graph reduces at its end */
    if (p->calls > p->expected)
        return ct_autograd_fail(
            CT_ESTATE,
            "%s: parameter %s was marked ready %d times in one backward (expected %d): a "
            "parameter used in several reentrant backwards (activation checkpointing) needs "
            "static_graph in ct_ddp_options",
            op, p->name, p->calls, p->expected);
    /* ZeRO-2 moves every gradient out of .grad as it comes, whatever the
     * progress mode: keeping them would cost the memory it saves. */
    if (sharded_grads)
        return (rc = d->fsdp ? ct__ddp_fsdp_ready(d, p) : ct__ddp_shard_ready(d, p))
                   ? ct_autograd_fail(rc, "%s: %s", op, ct_errmsg())
                   : 0;
    /* Without a thread to advance them, buckets started early would only
     * wait for the hooks and split the same work in pieces (docs/ddp.md):
     * they all start at the end of backward, in order. */
    if (d->hooks_progress)
        return 0;
    if (p->calls == p->expected && --d->b[p->bucket].pending == 0)
        rc = launch_ready(d);
    return rc ? ct_autograd_fail(rc, "%s: %s", op, ct_errmsg()) : 0;
}

/* Names the parameters some rank did not use (at most NAMES_IN_ERROR). */
int ct__ddp_unused_error(ct_ddp *d, ct_tensor *averaged) {
    /* A plan's replay (ct_memory_plan): the map holds no values, and every
     * rank of a dry communicator uses what this one does. */
    if (ct_tensor_device(averaged).type == CT_META)
        return 0;
    int size = ct_comm_size(d->comm), listed = 0, count = 0;
    char names[1024] = "";
    size_t used = 0;
    ct_tensor *map = ct__tensor_own(ct_to(averaged, CT_DEVICE_CPU));
    if (!map)
        return ct_errcode();
    for (int k = 0; k < d->n; k++) {
        double v = d->dtype == CT_FLOAT64 ? ((double *)ct_data_ptr(map))[k]
                                          : ((float *)ct_data_ptr(map))[k];
        long ranks = lround(v * size);
        if (ranks == size)
            continue;
        count++;
        if (listed++ < NAMES_IN_ERROR && used < sizeof names)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s (used on %ld of %d)",
                                     listed > 1 ? ", " : "", d->p[k].name, ranks, size);
    }
    ct_tensor_free(map);
    if (!count || d->o.find_unused_parameters)
        return 0;
    return ct__err_set(CT_ESTATE,
                       "%s: %d parameter%s got no gradient on some ranks in this iteration: %s%s. "
                       "Make every parameter take part in the loss, or pass "
                       "find_unused_parameters to ct_ddp_new",
                       op, count, count > 1 ? "s" : "", names, count > listed ? ", ..." : "");
}

/* Agrees on rank 0's arrival order and rebuilds the buckets in it. */
static int rebuild(ct_ddp *d) {
    bool *seen = calloc((size_t)d->n, sizeof *seen);
    ct_tensor *order = ct__tensor_own(ct_empty(1, (int64_t[]){d->n}, CT_INT64));
    int rc = seen && order ? 0 : ct__err_set(CT_ENOMEM, "%s: out of memory", op);
    int64_t *o = order ? ct_data_ptr(order) : NULL;
    int k = 0;
    for (int i = 0; !rc && i < d->narrivals; i++)
        if (!seen[d->arrivals[i]]) {
            seen[d->arrivals[i]] = true;
            o[k++] = d->arrivals[i];
        }
    for (int i = 0; !rc && i < d->n; i++)
        if (!seen[d->order[i]])
            o[k++] = d->order[i];
    if (!rc)
        rc = ct__ddp_on_host(d, HOST_BROADCAST_0, order, order);
    bool changed = false;
    for (int i = 0; !rc && i < d->n; i++) {
        changed |= d->order[i] != (int)o[i];
        d->order[i] = (int)o[i];
    }
    if (!rc && changed)
        rc = build_buckets(d);
    ct_tensor_free(order);
    free(seen);
    return rc;
}

/* The replicated reducer's end of backward: unused gradients count as
 * zero, what has not started starts, everything is waited for and the
 * usage map checked. */
static int reduce_replicated(ct_ddp *d) {
    int rc = 0;
    for (int k = 0; k < d->n && !rc; k++) {
        ddp_param *p = &d->p[k];
        if (p->used)
            continue;
        /* It counts as zero, whatever the gradient held before; and after
         * zero_grad with set_to_none it gets the view back, since other
         * ranks may have used it: the optimizer must see the average. */
        rc = ct__tensor_copy_any(p->grad, d->zero);
        if (!rc && ct_tensor_grad(p->t) != p->grad)
            rc = ct_tensor_set_grad(p->t, p->grad);
    }
    if (d->hooks_progress && !d->has_hook && d->next_launch == 0) {
        /* Every bucket starts now, and together they tile the buffer: one
         * allreduce of all of it costs one synchronization instead of one
         * per bucket (measured in docs/bench-ddp.md). */
        if (!rc)
            rc = ct__ddp_write_usage_map(d, d->map);
        if (!rc)
            rc = ct_comm_allreduce(d->comm, d->flat, CT_REDUCE_AVG, NULL);
        d->next_launch = d->nbuckets;
    }
    for (int i = d->next_launch; i < d->nbuckets; i++)
        d->b[i].pending = 0;
    if (!rc)
        rc = launch_ready(d);
    for (int i = 0; i < d->nbuckets; i++) {
        ddp_bucket *b = &d->b[i];
        if (!b->work)
            continue;
        int wrc = ct_work_wait(b->work);
        if (!wrc && d->has_hook && d->hook.finish)
            wrc = d->hook.finish(d->comm, b->view, i, d->hook.ctx);
        rc = rc ? rc : wrc;
        b->waited = b->work;
        b->work = NULL;
    }
    return rc ? rc : ct__ddp_unused_error(d, d->map);
}

static int finalize(void *ctx) {
    ct_ddp *d = ctx;
    d->in_backward = false;
    /* Only ZeRO-3 queues this in a no_sync backward: its units go back. */
    if (!d->sync) {
        int rc = ct__ddp_fsdp_finalize(d);
        return rc ? ct_autograd_fail(rc, "%s", ct_errmsg()) : 0;
    }
    if (d->o.static_graph && d->iterations == 0)
        for (int k = 0; k < d->n; k++)
            d->p[k].expected = d->p[k].calls > 0 ? d->p[k].calls : 1;
    int rc = d->fsdp                                ? ct__ddp_fsdp_finalize(d)
             : d->o.shard == CT_DDP_SHARD_GRADIENTS ? ct__ddp_shard_finalize(d)
                                                    : reduce_replicated(d);
    /* ZeRO's buckets follow the shards' layout, not the arrival order. */
    if (!rc && d->iterations == 0 && d->o.rebuild_buckets && d->o.shard == CT_DDP_SHARD_NONE)
        rc = rebuild(d);
    for (int k = 0; k < d->n; k++) {
        d->p[k].calls = 0;
        d->p[k].used = false;
    }
    for (int i = 0; i < d->nbuckets; i++)
        d->b[i].pending = d->b[i].n;
    d->next_launch = 0;
    d->iterations++;
    return rc ? ct_autograd_fail(rc, "%s", ct_errmsg()) : 0;
}

/* ----------------------------------------------------------------- API */

ct_ddp_options ct_ddp_defaults(void) {
    return (ct_ddp_options){.first_bucket_bytes = CT_DDP_FIRST_BUCKET_BYTES,
                            .bucket_bytes = CT_DDP_BUCKET_BYTES,
                            .rebuild_buckets = true};
}

/* "cpu", "cuda:1" */
static int check_params(ct_ddp *d) {
    if (d->n == 0)
        return ct__err_set(CT_EINVAL, "%s: the model has no parameters", op);
    d->dtype = ct_tensor_dtype(d->params.tensors[0]);
    /* A host backend takes any device's buckets through host memory
     * (collectives stage them); a device's backend (nccl) takes its
     * device's only. */
    ct_device comm_device = ct_comm_device(d->comm);
    d->device = ct_tensor_device(d->params.tensors[0]);
    for (int i = 0; i < d->n; i++) {
        ct_tensor *t = d->params.tensors[i];
        char desc[CT__DESC_STR];
        ct_device dev = ct_tensor_device(t);
        char on[CT_DEVICE_STR], wants[CT_DEVICE_STR];
        if (!ct_device_equal(dev, d->device))
            return ct__err_set(CT_EDEVICE,
                               "%s: parameter %s (%s) is on %s, but %s is on %s; a model's "
                               "parameters must share one device",
                               op, d->params.names[i], ct__tensor_desc(desc, t),
                               ct_device_str(dev, on), d->params.names[0],
                               ct_device_str(d->device, wants));
        if (!ct__is_host(comm_device) && !ct_device_equal(dev, comm_device))
            return ct__err_set(CT_EDEVICE,
                               "%s: parameter %s (%s) is on %s, but the communicator (%s) takes "
                               "tensors on %s; move the model there, or use a communicator for "
                               "its device",
                               op, d->params.names[i], ct__tensor_desc(desc, t),
                               ct_device_str(dev, on), ct_backend_name(ct_comm_backend(d->comm)),
                               ct_device_str(comm_device, wants));
        if (ct_tensor_dtype(t) != d->dtype || (d->dtype != CT_FLOAT32 && d->dtype != CT_FLOAT64))
            return ct__err_set(CT_EDTYPE,
                               "%s: parameter %s is %s; every parameter must be float32, or every "
                               "one float64",
                               op, d->params.names[i], ct__tensor_desc(desc, t));
        if (!ct_is_contiguous(t) || !ct_requires_grad(t))
            return ct__err_set(CT_EINVAL,
                               "%s: parameter %s (%s) must be contiguous and require grad", op,
                               d->params.names[i], ct__tensor_desc(desc, t));
    }
    return 0;
}

/* On a machine with fewer than two cores per local rank, a progress thread
 * waiting for peers takes its core from backward, and nothing else can
 * advance an allreduce while backward computes: every bucket then starts
 * at the end of backward (measured in docs/bench-ddp.md). */
static int choose_progress(ct_ddp *d) {
    bool hooks = d->o.progress == CT_DDP_PROGRESS_END;
    /* With a device's backend, the thread only polls events: the device
     * does the work. */
    if (d->o.progress == CT_DDP_PROGRESS_AUTO && ct__is_host(ct_comm_device(d->comm))) {
        const ct_world *w = ct_dist_world();
        long local = w && w->local_size > 0 ? w->local_size : ct_comm_size(d->comm);
        hooks = sysconf(_SC_NPROCESSORS_ONLN) < 2 * local;
    }
    d->hooks_progress = hooks;
    return hooks ? ct_comm_set_progress_thread(d->comm, false) : 0;
}

/* The post-accumulate hook on every parameter. */
static int hook_params(ct_ddp *d) {
    for (int i = 0; i < d->n; i++) {
        int h = ct_tensor_register_post_accumulate_grad_hook(d->p[i].t, on_grad, &d->p[i]);
        if (h < 0)
            return h;
        d->p[i].hook = h;
    }
    return 0;
}

ct_ddp *ct_ddp_new(ct_comm *comm, ct_module *model, const ct_ddp_options *opts) {
    if (!comm || !model) {
        ct__err_set(CT_EINVAL, "%s: comm and model must not be NULL", op);
        return NULL;
    }
    ct_ddp *d = calloc(1, sizeof *d);
    if (!d) {
        ct__err_set(CT_ENOMEM, "%s: out of memory", op);
        return NULL;
    }
    d->magic = DDP_MAGIC;
    d->comm = comm;
    d->o = opts ? *opts : ct_ddp_defaults();
    if (d->o.first_bucket_bytes <= 0)
        d->o.first_bucket_bytes = CT_DDP_FIRST_BUCKET_BYTES;
    if (d->o.bucket_bytes <= 0)
        d->o.bucket_bytes = CT_DDP_BUCKET_BYTES;
    d->sync = true;
    ct_param_list_init(&d->params);
    if (d->o.shard < CT_DDP_SHARD_NONE || d->o.shard > CT_DDP_SHARD_FULL) {
        ct__err_set(CT_EINVAL,
                    "%s: shard %d is not a stage ct_ddp has: 0 (replicated), 1 (optimizer state, "
                    "ZeRO-1), 2 (and gradients, ZeRO-2) or 3 (and parameters, ZeRO-3/FSDP)",
                    op, (int)d->o.shard);
        free(d);
        return NULL;
    }
    int rc = ct_module_named_parameters(model, &d->params);
    d->n = d->params.n;
    if (!rc)
        rc = check_params(d);
    if (!rc) {
        d->zero = ct__tensor_own(ct_full_on(0, NULL, 0, d->dtype, d->device));
        d->one = ct__tensor_own(ct_full_on(0, NULL, 1, d->dtype, d->device));
        rc = d->zero && d->one ? 0 : ct_errcode();
    }
    if (!rc)
        rc = check_same_model(d);
    if (!rc)
        rc = broadcast_state(d, model);
    if (!rc) {
        d->p = calloc((size_t)d->n, sizeof *d->p);
        d->order = malloc((size_t)d->n * sizeof *d->order);
        d->arrivals = malloc((size_t)d->n * sizeof *d->arrivals);
        if (!d->p || !d->order || !d->arrivals)
            rc = ct__err_set(CT_ENOMEM, "%s: out of memory", op);
    }
    for (int i = 0; !rc && i < d->n; i++) {
        d->p[i] = (ddp_param){.ddp = d,
                              .t = d->params.tensors[i],
                              .name = d->params.names[i],
                              .numel = ct_numel(d->params.tensors[i]),
                              .expected = 1};
        d->order[i] = d->n - 1 - i; /* reverse registration order */
    }
    /* ZeRO-2 and -3 keep no whole gradient buffer: their buckets are
     * their own. */
    if (!rc && d->o.shard < CT_DDP_SHARD_GRADIENTS)
        rc = build_buckets(d);
    if (!rc && d->o.shard == CT_DDP_SHARD_FULL && !(rc = hook_params(d)))
        rc = ct__ddp_fsdp_init(d, model);
    if (!rc && d->o.shard != CT_DDP_SHARD_NONE)
        rc = ct__ddp_shard_init(d, model);
    if (!rc)
        rc = choose_progress(d);
    /* ZeRO-3 hooked them before its units took their memory away. */
    if (!rc && d->o.shard != CT_DDP_SHARD_FULL)
        rc = hook_params(d);
    if (rc) {
        ct_ddp_free(d);
        return NULL;
    }
    return d;
}

void ct_ddp_free(ct_ddp *d) {
    if (!d)
        return;
    /* ZeRO-3: every unit back in the model, before its hooks go. */
    if (d->fsdp)
        ct_ddp_summon_params(d, true);
    for (int i = 0; d->p && i < d->n; i++) {
        ddp_param *p = &d->p[i];
        if (p->hook > 0)
            ct_tensor_remove_hook(p->t, p->hook);
        /* The parameter keeps its gradient, in storage of its own. */
        if (p->grad && ct_tensor_grad(p->t) == p->grad) {
            ct_tensor *copy = ct__tensor_own(ct_clone(p->grad));
            ct_tensor_set_grad(p->t, copy);
            ct_tensor_free(copy);
        }
        ct_tensor_free(p->grad);
    }
    if (d->has_hook && d->hook.free)
        d->hook.free(d->hook.ctx);
    if (d->hooks_progress)
        ct_comm_set_progress_thread(d->comm, true);
    ct__ddp_shard_free(d);
    ct__ddp_fsdp_free(d);
    ct__ddp_free_buckets(d);
    ct_tensor_free(d->map);
    ct_tensor_free(d->flat);
    ct_tensor_free(d->zero);
    ct_tensor_free(d->one);
    ct_param_list_free(&d->params);
    free(d->p);
    free(d->order);
    free(d->arrivals);
    d->magic = 0;
    free(d);
}

int ct__ddp_check(const ct_ddp *d, const char *fn) {
    if (!d || d->magic != DDP_MAGIC)
        return ct__err_set(CT_EINVAL, "%s: not a live ct_ddp", fn);
    return 0;
}

int ct_ddp_set_sync(ct_ddp *d, bool sync) {
    CT_TRY(ct__ddp_check(d, "ddp_set_sync"));
    CT_REQUIRE(!d->in_backward, CT_ESTATE, "ddp_set_sync: called during a backward");
    d->sync = sync;
    return 0;
}

int ct_ddp_join(ct_ddp *d) {
    CT_TRY(ct__ddp_check(d, "ddp_join"));
    CT_REQUIRE(d->o.uneven_inputs, CT_ESTATE,
               "ddp_join: the ct_ddp was made without uneven_inputs in its options; every rank "
               "must then run the same number of steps");
    d->joined = true;
    int rc;
    for (;;) {
        int training;
        if ((rc = count_training(d, &training)) || training == 0)
            break;
        /* One of the others' iterations, with zero gradients: finalize
         * zeroes what this rank did not use, which is everything. */
        if ((rc = finalize(d)))
            break;
    }
    d->joined = false;
    return rc;
}

int ct_ddp_set_comm_hook(ct_ddp *d, const ct_ddp_comm_hook *hook) {
    CT_TRY(ct__ddp_check(d, "ddp_set_comm_hook"));
    CT_REQUIRE(!d->shard, CT_EINVAL,
               "ddp_set_comm_hook: the ct_ddp shards (options.shard %d): a comm hook replaces "
               "the allreduce that sharding replaces too",
               (int)d->o.shard);
    CT_REQUIRE(!hook || (hook->start && (!hook->free || hook->ctx)), CT_EINVAL,
               "ddp_set_comm_hook: the hook has no start function, or its state could not be "
               "made");
    if (d->has_hook && d->hook.free)
        d->hook.free(d->hook.ctx);
    d->has_hook = hook != NULL;
    if (hook)
        d->hook = *hook;
    return 0;
}

int ct_ddp_num_buckets(const ct_ddp *d) {
    CT_TRY(ct__ddp_check(d, "ddp_num_buckets"));
    return d->nbuckets;
}

const char *const *ct_ddp_bucket_names(const ct_ddp *d, int bucket) {
    if (ct__ddp_check(d, "ddp_bucket_names"))
        return NULL;
    if (bucket < 0 || bucket >= d->nbuckets) {
        ct__err_set(CT_EINVAL, "ddp_bucket_names: bucket %d is outside [0, %d)", bucket,
                    d->nbuckets);
        return NULL;
    }
    return d->b[bucket].names;
}

/* --------------------------------------------------- bf16 compression */

/* A bfloat16 copy of each bucket travels instead of its gradients; the
 * copies are kept per bucket and reused while the bucket keeps its size. */
typedef struct bf16_state {
    ct_tensor **wire;
    int n;
} bf16_state;

static int bf16_start(ct_comm *comm, ct_tensor *bucket, int index, void *ctx, ct_work **work) {
    bf16_state *st = ctx;
    if (index >= st->n) {
        ct_tensor **grown = realloc(st->wire, (size_t)(index + 1) * sizeof *grown);
        if (!grown)
            return ct__err_set(CT_ENOMEM, "%s: bf16 hook: out of memory", op);
        for (int i = st->n; i <= index; i++)
            grown[i] = NULL;
        st->wire = grown;
        st->n = index + 1;
    }
    ct_tensor **wire = &st->wire[index];
    if (!*wire || ct_numel(*wire) != ct_numel(bucket)) {
        ct_tensor_free(*wire);
        if (!(*wire = ct__tensor_own(ct_empty_on(1, (int64_t[]){ct_numel(bucket)}, CT_BFLOAT16,
                                                 ct_tensor_device(bucket)))))
            return ct_errcode();
    }
    CT_TRY(ct__tensor_copy_any(*wire, bucket));
    return ct_comm_allreduce(comm, *wire, CT_REDUCE_AVG, work);
}

static int bf16_finish(ct_comm *comm, ct_tensor *bucket, int index, void *ctx) {
    bf16_state *st = ctx;
    return ct__tensor_copy_any(bucket, st->wire[index]);
}

static void bf16_free(void *ctx) {
    bf16_state *st = ctx;
    for (int i = 0; st && i < st->n; i++)
        ct_tensor_free(st->wire[i]);
    if (st)
        free(st->wire);
    free(st);
}

ct_ddp_comm_hook ct_ddp_bf16_compress_hook(void) {
    return (ct_ddp_comm_hook){.start = bf16_start,
                              .finish = bf16_finish,
                              .free = bf16_free,
                              .ctx = calloc(1, sizeof(bf16_state))};
}
