/* ct_memory_plan (ct/dist.h): a training run replayed on the meta device,
 * over a dry communicator, with the run's own callbacks. What the meta
 * allocator counts is what the run would hold, in the run's order, because
 * the same code makes and frees it; only the kernels are missing. */
#include "base_impl.h"
#include "dist_impl.h"

#include <pthread.h>

/* The meta device's counters are the process's: one plan at a time. */
static pthread_mutex_t plan_lock = PTHREAD_MUTEX_INITIALIZER;

static int64_t tensor_bytes(ct_tensor *t) {
    return t ? ct_numel(t) * (int64_t)ct_dtype_size(ct_tensor_dtype(t)) : 0;
}

/* One process's split, as ct_ddp_memory_of gives a rank's: the parameters,
 * their gradients (the flat buffer's when there is one), the optimizer's
 * state. */
static int lone_state(ct_module *model, const ct_optim *opt, ct_ddp_memory *m) {
    ct_param_list pl;
    ct_param_list_init(&pl);
    int rc = ct_module_named_parameters(model, &pl);
    for (int i = 0; !rc && i < pl.n; i++) {
        m->params += tensor_bytes(pl.tensors[i]);
        m->grads += tensor_bytes(ct_tensor_grad(pl.tensors[i]));
    }
    ct_param_list_free(&pl);
    if (ct_module_flat_grads(model))
        m->grads = tensor_bytes(ct_module_flat_grads(model));
    int n = rc ? 0 : ct_optim_num_states(opt);
    for (int i = 0; i < n && !rc; i++) {
        ct_tensor *t = NULL;
        if (!(rc = ct_optim_state_at(opt, i, NULL, &t)))
            m->optimizer += tensor_bytes(t);
    }
    return rc ? rc : n < 0 ? n : 0;
}

/* A callback returned NULL: its error, or one saying it gave none. */
static int gave_none(const char *callback) {
    return ct_errcode()
               ? ct_errcode()
               : ct__err_set(CT_EINVAL, "memory_plan: %s returned NULL without an error", callback);
}

/* The replay itself, the lock held; frees what it made. */
static int replay(const ct_memory_plan_config *cfg, ct_memory_estimate *out) {
    const ct_device meta = CT_DEVICE_META;
    int64_t base = ct_memory_allocated(meta), host = ct_memory_allocated(CT_DEVICE_CPU);
    ct_memory_reset_peak(meta);
    ct_device was = ct_nn_set_device(meta);
    ct_module *model = cfg->build(cfg->ctx);
    ct_nn_set_device(was);
    if (!model)
        return gave_none("build");
    int rc = 0;
    ct_comm *comm = NULL;
    ct_ddp *ddp = NULL;
    ct_optim *opt = NULL;
    if (cfg->world_size > 1) {
        ct_comm_config cc = {.backend = CT_BACKEND_DRY, .rank = cfg->rank, .size = cfg->world_size};
        comm = ct_comm_new(&cc);
        ddp = !comm       ? NULL
              : cfg->wrap ? cfg->wrap(cfg->ctx, comm, model)
                          : ct_ddp_new(comm, model, NULL);
        if (!ddp)
            rc = gave_none(comm ? "wrap" : "the dry communicator");
    }
    if (!rc && !(opt = cfg->optimizer(cfg->ctx, model, ddp)))
        rc = gave_none("optimizer");
    out->setup_peak = ct_memory_peak(meta) - base;
    ct_memory_reset_peak(meta);
    int steps = cfg->steps > 0 ? cfg->steps : 2;
    for (int s = 0; s < steps && !rc; s++) {
        ct_scope_begin();
        rc = cfg->step(cfg->ctx, model, ddp, opt, meta);
        ct_scope_end();
    }
    if (!rc) {
        out->peak = ct_memory_peak(meta) - base;
        out->resident = ct_memory_allocated(meta) - base;
        out->host = ct_memory_allocated(CT_DEVICE_CPU) - host;
        rc = ddp ? ct_ddp_memory_of(ddp, opt, &out->state) : lone_state(model, opt, &out->state);
    }
    /* The optimizer goes before its ct_ddp, as ct_ddp_optim_new asks. */
    ct_optim_free(opt);
    ct_ddp_free(ddp);
    ct_comm_free(comm);
    ct_module_free(model);
    return rc;
}

int ct_memory_plan(const ct_memory_plan_config *cfg, ct_memory_estimate *out) {
    CT_REQUIRE(cfg && out, CT_EINVAL, "memory_plan: %s is NULL", cfg ? "out" : "cfg");
    CT_REQUIRE(cfg->build && cfg->optimizer && cfg->step, CT_EINVAL,
               "memory_plan: the config needs build, optimizer and step (the run's own code)");
    CT_REQUIRE(cfg->world_size >= 1 && cfg->rank >= 0 && cfg->rank < cfg->world_size, CT_EINVAL,
               "memory_plan: rank %d of %d ranks: expected 0 <= rank < world_size, world_size >= 1",
               cfg->rank, cfg->world_size);
    *out = (ct_memory_estimate){0};
    /* The run's initialisation and dropout draw from the default generator:
     * a plan made first leaves the run's numbers as they were. */
    ct_generator saved = *ct_default_generator();
    pthread_mutex_lock(&plan_lock);
    int rc = replay(cfg, out);
    pthread_mutex_unlock(&plan_lock);
    *ct_default_generator() = saved;
    return rc;
}
