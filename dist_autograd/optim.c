/* The distributed optimizer: each owner steps its own parameters with the
 * gradients a context accumulated there. */
#include "rpc_impl.h"

#include <stdlib.h>

#define MAX_SERVED 64

static struct {
    pthread_mutex_t mu;
    struct {
        char name[RPC_NAME_MAX + 1];
        ct_optim *opt;
        /* Steps from several trainers are applied one at a time. */
        pthread_mutex_t step;
    } v[MAX_SERVED];
    int n;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

int ct_dist_optim_serve(const char *name, ct_optim *opt) {
    const char *fn = "ct_dist_optim_serve";
    if (!name || !*name || strlen(name) > RPC_NAME_MAX || !opt)
        return ct__err_set(CT_EINVAL, "%s: a name of 1-%d bytes and an optimizer, please", fn,
                           RPC_NAME_MAX);
    pthread_mutex_lock(&S.mu);
    int rc = S.n == MAX_SERVED
                 ? ct__err_set(CT_EINVAL, "%s: more than %d optimizers", fn, MAX_SERVED)
                 : 0;
    for (int i = 0; i < S.n && !rc; i++)
        if (!strcmp(S.v[i].name, name))
            rc = ct__err_set(CT_EINVAL, "%s: '%s' is served already", fn, name);
    if (!rc) {
        snprintf(S.v[S.n].name, sizeof S.v[S.n].name, "%s", name);
        S.v[S.n].opt = opt;
        pthread_mutex_init(&S.v[S.n].step, NULL);
        S.n++;
    }
    pthread_mutex_unlock(&S.mu);
    return rc;
}

/* Steps the optimizer with the context's gradients standing in for .grad. */
static int step_with(ct_optim *opt, uint64_t context) {
    int n = ct_optim_num_params(opt), rc = 0;
    ct_tensor *saved[n > 0 ? n : 1];
    for (int i = 0; i < n; i++) {
        ct_tensor *p = ct_optim_param(opt, i), *g = ct_tensor_grad(p);
        saved[i] = g ? ct_tensor_retain(g) : NULL;
        g = ct_dist_autograd_grad((int64_t)context, p);
        if (!g && ct_errcode())
            rc = ct_errcode();
        if (!rc)
            rc = ct_tensor_set_grad(p, g);
    }
    if (!rc)
        rc = ct_optim_step(opt);
    for (int i = 0; i < n; i++) {
        ct_tensor_set_grad(ct_optim_param(opt, i), saved[i]);
        ct_tensor_free(saved[i]);
    }
    return rc;
}

void ct__dautograd_optim_on_step(const rpc_call *c, ct_rpc_args *in, rpc_reply *r) {
    const char *name = ct_rpc_args_string(in, 0);
    int rc = name ? 0 : ct_errcode(), at = -1;
    pthread_mutex_lock(&S.mu);
    for (int i = 0; i < S.n && name; i++)
        if (!strcmp(S.v[i].name, name))
            at = i;
    int n = S.n;
    pthread_mutex_unlock(&S.mu);
    if (!rc && at < 0)
        rc = ct__err_set(CT_EINVAL, "no optimizer '%s' is served here (%d are)", name, n);
    if (!rc && !c->context)
        rc = ct__err_set(CT_EINVAL, "a step outside any context");
    if (!rc) {
        pthread_mutex_lock(&S.v[at].step);
        rc = step_with(S.v[at].opt, c->context);
        pthread_mutex_unlock(&S.v[at].step);
    }
    ct__rpc_reply(r, rc, NULL);
    ct_rpc_args_free(in);
}

struct ct_dist_optim {
    char name[RPC_NAME_MAX + 1];
    int n;
    int workers[];
};

ct_dist_optim *ct_dist_optim_new(const char *name, const char *const *workers, int n) {
    if (!name || !*name || strlen(name) > RPC_NAME_MAX || !workers || n < 1) {
        ct__err_set(CT_EINVAL, "ct_dist_optim_new: a name and at least one worker, please");
        return NULL;
    }
    ct_dist_optim *o = malloc(sizeof *o + (size_t)n * sizeof o->workers[0]);
    if (!o) {
        ct__err_set(CT_ENOMEM, "ct_dist_optim_new: out of memory");
        return NULL;
    }
    snprintf(o->name, sizeof o->name, "%s", name);
    o->n = n;
    for (int i = 0; i < n; i++)
        if ((o->workers[i] = ct_rpc_worker_id(workers[i])) < 0) {
            free(o);
            return NULL;
        }
    return o;
}

int ct_dist_optim_step(ct_dist_optim *o, int64_t context) {
    if (!o || !context)
        return ct__err_set(CT_EINVAL, "ct_dist_optim_step: %s",
                           o ? "no context" : "NULL optimizer");
    ct_rpc_args *a = ct_rpc_args_new();
    int rc = a ? ct_rpc_args_add_string(a, o->name) : ct_errcode();
    ct_future *f[o->n];
    for (int i = 0; i < o->n; i++)
        f[i] = rc ? NULL
                  : ct__rpc_call(o->workers[i], "ct.optim_step", "ct_dist_optim_step", a, 0,
                                 (uint64_t)context);
    ct_rpc_args_free(a);
    for (int i = 0; i < o->n; i++) {
        int r = f[i] ? ct_future_wait(f[i], NULL) : ct_errcode();
        if (r && !rc) {
            rc = r;
            char message[512];
            snprintf(message, sizeof message, "%s", ct_errmsg());
            ct__err_set(rc, "ct_dist_optim_step: %s", message);
        }
        ct_future_free(f[i]);
    }
    return rc;
}

void ct_dist_optim_free(ct_dist_optim *o) { free(o); }
