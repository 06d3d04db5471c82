/* ct/dist_autograd.h: remote procedure calls between the ranks of a job,
 * over libzmq, remote references, and distributed autograd on top of them
 * (docs/rpc.md is the guide).
 *
 * Every rank runs one RPC agent: a worker with a name and an id (its world
 * rank). Functions are registered by name on the workers that serve them;
 * a call names the worker and the function and passes arguments (tensors,
 * int64, double and strings) that come back as results the same way.
 * Nothing executable crosses the wire. Tensors travel without extra
 * copies: a contiguous tensor is sent from its own memory, and a received
 * one lives in the message's buffer.
 *
 * Every rank runs the example below, under `ctlaunch -np 2`; alone, it is a
 * world of one whose worker calls itself.
 *
 * Example:
 *
 *     #include <ct/dist_autograd.h>
 *     #include <stdio.h>
 *
 *     static int twice(void *ctx, const ct_rpc_args *in, ct_rpc_args *out) {
 *         (void)ctx;
 *         return ct_rpc_args_add_tensor(out, ct_mul_scalar(ct_rpc_args_tensor(in, 0), 2));
 *     }
 *
 *     int main(void) {
 *         if (ct_dist_init(NULL) || ct_rpc_register("twice", twice, NULL) ||
 *             ct_rpc_init(NULL)) {
 *             fprintf(stderr, "%s\n", ct_errmsg());
 *             return 1;
 *         }
 *         int me = ct_rpc_self(), next = (me + 1) % ct_rpc_num_workers();
 *         ct_scope_begin();
 *         ct_rpc_args *in = ct_rpc_args_new(), *out = NULL;
 *         ct_rpc_args_add_tensor(in, ct_arange(0, 4, 1, CT_FLOAT32));
 *         int rc = ct_rpc_sync(ct_rpc_worker_name(next), "twice", in, 10.0, &out);
 *         if (rc)
 *             fprintf(stderr, "%s\n", ct_errmsg());
 *         else
 *             printf("worker %d: %g\n", me, ct_item(ct_sum(ct_rpc_args_tensor(out, 0), NULL, 0,
 *                                                         false)));
 *         ct_rpc_args_free(in);
 *         ct_rpc_args_free(out);
 *         ct_scope_end();
 *         if (!rc)
 *             rc = ct_rpc_shutdown();
 *         ct_dist_finalize();
 *         return rc != 0;
 *     }
 *
 * Errors. Functions that return int return 0 or a negative CT_E* code with
 * a message (ct_errmsg()). A remote function's error comes back with its
 * code and its message, prefixed with the worker and the function. A call
 * past its timeout fails with CT_ETIMEDOUT; a call to a worker that died
 * fails with CT_EPEER as soon as the agent sees the connection drop, or
 * the worker stops answering heartbeats. User calls are never retried: a
 * failed call may or may not have run. A distributed backward fails with
 * the first error of any worker, and a context that failed, ended or
 * expired makes every later use of it fail with the reason, never hang.
 *
 * Ownership. Argument lists, futures, references and optimizers belong to
 * whoever made them (freed with their _free). Tensors given to a call are
 * retained while the call needs them; received ones belong to the result
 * list. A context's graph pieces and gradients belong to the agent and go
 * when the context is released on that worker.
 *
 * Threads. The agent runs its own threads: one owns the sockets, and a pool
 * runs registered functions (which may make calls themselves). Calls,
 * futures and argument lists may be used from any thread; one ct_rpc_args
 * or ct_future from one thread at a time. The current context is per
 * thread. Contexts may run backward at once, from any threads and workers.
 */
#ifndef CT_DIST_AUTOGRAD_H
#define CT_DIST_AUTOGRAD_H

#include <ct/dist.h>
#include <ct/optim.h>
#include <ct/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ arguments */

typedef enum ct_rpc_type {
    CT_RPC_TENSOR,
    CT_RPC_INT,
    CT_RPC_FLOAT,
    CT_RPC_STRING,
} ct_rpc_type;

/* An ordered list of values: a call's arguments or its results. It retains
 * the tensors added to it and copies strings. */
typedef struct ct_rpc_args ct_rpc_args;

/* NULL with CT_ENOMEM. */
CT_API ct_rpc_args *ct_rpc_args_new(void);
/* Accepts NULL. */
CT_API void ct_rpc_args_free(ct_rpc_args *a);
/* Each add returns 0, CT_EINVAL (a bad handle, a NULL tensor or string),
 * CT_EDEVICE (a tensor not on the CPU) or CT_ENOMEM. A message holds at most
 * 256 tensors. */
CT_API int ct_rpc_args_add_tensor(ct_rpc_args *a, ct_tensor *t);
CT_API int ct_rpc_args_add_int(ct_rpc_args *a, int64_t v);
CT_API int ct_rpc_args_add_float(ct_rpc_args *a, double v);
CT_API int ct_rpc_args_add_string(ct_rpc_args *a, const char *s);
/* The number of values, or a negative CT_E* code for a bad handle. */
CT_API int ct_rpc_args_count(const ct_rpc_args *a);
/* The type of value i, or -1 with CT_ERANGE. */
CT_API int ct_rpc_args_type(const ct_rpc_args *a, int i);
/* Value i (borrowed from a). A wrong type or index: NULL / 0 / NAN with
 * CT_EINVAL or CT_ERANGE naming what value i is. */
CT_API ct_tensor *ct_rpc_args_tensor(const ct_rpc_args *a, int i);
CT_API int64_t ct_rpc_args_int(const ct_rpc_args *a, int i);
CT_API double ct_rpc_args_float(const ct_rpc_args *a, int i);
CT_API const char *ct_rpc_args_string(const ct_rpc_args *a, int i);

/* ---------------------------------------------------------------- agent */

/* A registered function: reads in, adds its results to out, and returns 0
 * or a CT_E* code with ct_errmsg() set, which the caller gets back. It runs
 * on one of the agent's handler threads, inside a scope of that thread,
 * possibly at the same time as other calls: it must be thread-safe. */
typedef int (*ct_rpc_fn)(void *ctx, const ct_rpc_args *in, ct_rpc_args *out);

typedef struct ct_rpc_options {
    /* This worker's name; NULL: "worker<rank>". At most 64 bytes. */
    const char *name;
    /* Default timeout of a call, and of init and shutdown; 0: 60 s. */
    double timeout_s;
    /* Threads that run registered functions; 0: 4. */
    int handler_threads;
    /* A distributed autograd context unused this long on a worker is
     * released there; 0: 600 s. */
    double context_timeout_s;
    /* A peer that answers no heartbeat for this long is taken for dead
     * (its calls fail with CT_EPEER); 0: 5 s. A peer whose process ends
     * is seen at once, as its connection drops. */
    double heartbeat_timeout_s;
} ct_rpc_options;

/* Registers fn under name on this worker; do it before ct_rpc_init() so
 * that no call arrives first. CT_EINVAL for an empty or taken name. */
CT_API int ct_rpc_register(const char *name, ct_rpc_fn fn, void *ctx);
/* Starts this rank's agent, after ct_dist_init(); collective: returns once
 * every rank's agent is reachable, or CT_ETIMEDOUT naming a rank that did
 * not come. The agent listens on 127.0.0.1 when every rank is on this
 * machine, else on the address of this host's name (CT_BIND_ADDR
 * overrides), and serves only connections that prove the job's secret
 * (docs/security.md); CT_RPC_MAX_PENDING, CT_RPC_MAX_FRAME_BYTES and
 * CT_RPC_MAX_RREFS bound what one caller can queue, send and hold. opts
 * NULL: the defaults. CT_ESTATE before ct_dist_init or when already
 * started; CT_EINVAL for names that are taken twice, for a bad limit
 * variable, or for a host name that resolves to loopback when the ranks
 * span machines. */
CT_API int ct_rpc_init(const ct_rpc_options *opts);
/* Collective and graceful: waits until no call of this worker is pending
 * and no handler runs, and until every worker has got that far, then stops
 * the agent. Calls made after it fail with CT_ESTATE. */
CT_API int ct_rpc_shutdown(void);

/* This worker's id, the number of workers, and the names: valid between
 * init and shutdown (-1 / NULL otherwise, or for a bad id). */
CT_API int ct_rpc_self(void);
CT_API int ct_rpc_num_workers(void);
CT_API const char *ct_rpc_worker_name(int id);
/* The id of the worker named name, or -1 with CT_EINVAL. */
CT_API int ct_rpc_worker_id(const char *name);

/* ---------------------------------------------------------------- calls */

/* The result of a call, to wait on. */
typedef struct ct_future ct_future;

/* Calls fn on worker `to` (a name) with args, which may be freed once this
 * returns. A contiguous tensor is sent from its own memory: leave its bytes
 * alone until the future is done (or send a ct_clone()). timeout_s <= 0:
 * the agent's default.
 * The caller owns the future. NULL with CT_EINVAL (no such worker) or
 * CT_ESTATE (no agent); every other failure comes through the future. */
CT_API ct_future *ct_rpc_async(const char *to, const char *fn, const ct_rpc_args *args,
                               double timeout_s);
/* Waits for the call; 0 and the results in *out (owned by the caller;
 * out may be NULL to drop them), or the call's error. May be called again:
 * the same outcome each time. */
CT_API int ct_future_wait(ct_future *f, ct_rpc_args **out);
/* Whether the call has finished (successfully or not). */
CT_API bool ct_future_done(ct_future *f);
/* Accepts NULL. A pending call is not cancelled: its outcome is dropped. */
CT_API void ct_future_free(ct_future *f);
/* Runs fn(f, ctx) once when f is done: at once, on this thread, if it is
 * done already; otherwise on the thread that completes it, which is the
 * agent's own, so fn must be quick and must not wait on other calls. f stays
 * valid while fn runs, but a waiter may wake before fn has run; callbacks
 * run in no promised order. CT_EINVAL for a bad future or a NULL fn. */
typedef void (*ct_future_fn)(ct_future *f, void *ctx);
CT_API int ct_future_then(ct_future *f, ct_future_fn fn, void *ctx);
/* ct_rpc_async and ct_future_wait in one. */
CT_API int ct_rpc_sync(const char *to, const char *fn, const ct_rpc_args *args, double timeout_s,
                       ct_rpc_args **out);

/* ------------------------------------------------------ remote references */

/* A reference to values held by their owner, a worker. The handle belongs
 * to the worker that made it; the owner keeps the values while the handle
 * lives, and drops them when it is freed or when its holder dies. */
typedef struct ct_rref ct_rref;

/* Runs fn on worker `to` with args and leaves its results there, returning
 * a reference to them (owned by the caller) once the owner holds them.
 * NULL with the call's error. */
CT_API ct_rref *ct_rpc_remote(const char *to, const char *fn, const ct_rpc_args *args,
                              double timeout_s);
/* The owner's worker id, or -1 for a bad handle. */
CT_API int ct_rref_owner(const ct_rref *r);
/* Copies the values to this worker (*out, owned by the caller). */
CT_API int ct_rref_fetch(ct_rref *r, double timeout_s, ct_rpc_args **out);
/* Runs fn on the owner with the referenced values first, then args; the
 * results come back as from ct_rpc_sync. */
CT_API int ct_rref_call(ct_rref *r, const char *fn, const ct_rpc_args *args, double timeout_s,
                        ct_rpc_args **out);
/* Accepts NULL. Tells the owner, without waiting. */
CT_API void ct_rref_free(ct_rref *r);

/* ------------------------------------------------- distributed autograd */

/* A context is the scope of one distributed forward and backward. Inside
 * it, a call whose arguments or results include tensors that require grad
 * links the graphs of the two workers, and ct_dist_backward() runs
 * backward across them. Gradients accumulate in the context, per worker,
 * never in .grad, so contexts running at once never mix.
 *
 * Begins a context and makes it this thread's current one; returns its id
 * (never 0), or 0 with CT_ESTATE when no agent runs or a context is current
 * already. */
CT_API int64_t ct_dist_autograd_begin(void);
/* The thread's current context, 0 if none. A registered function runs in
 * the context of the call that invoked it. */
CT_API int64_t ct_dist_autograd_current(void);
/* Ends context id (which must have begun on this worker): releases it here
 * and on every worker it touched, and clears it as the current context.
 * Releasing is idempotent: a context that failed or expired ends with 0. */
CT_API int ct_dist_autograd_end(int64_t id);

/* Computes the gradients of roots[0..n-1] (one-element tensors) across
 * every worker the context's calls reached, and returns when all of it is
 * done. Graph buffers are kept until the context ends, since gradients
 * from several workers may reach the same nodes. On the first error
 * anywhere (a remote backward, a dead worker, a timeout) it fails with that
 * error, and the context is released everywhere. */
CT_API int ct_dist_backward(int64_t id, ct_tensor *const *roots, int n);
/* The gradient this worker accumulated for leaf in context id (the
 * context's running sum, not a copy), owned by the current scope. NULL
 * when the leaf got none, leaving the error as it was (clear it first to
 * tell); NULL with CT_EINVAL for an unknown context, or with the code that
 * released it. */
CT_API ct_tensor *ct_dist_autograd_grad(int64_t id, const ct_tensor *leaf);
/* Every (leaf, gradient) pair of context id on this worker: returns the
 * count, and malloc'd arrays (freed with free()) of tensors owned by the
 * current scope, or a negative CT_E* code as ct_dist_autograd_grad. */
CT_API int ct_dist_autograd_get_gradients(int64_t id, ct_tensor ***leaves, ct_tensor ***grads);
/* Contexts alive on this worker, for leak checks. */
CT_API int ct_dist_autograd_num_contexts(void);

/* ------------------------------------------------ distributed optimizer */

/* On a worker that owns parameters: serves opt (borrowed; it must outlive
 * the agent) under name, so that distributed optimizers can step it.
 * CT_EINVAL for a taken name. */
CT_API int ct_dist_optim_serve(const char *name, ct_optim *opt);

/* Steps, on every one of its workers, the optimizer served there under one
 * name, with the gradients that a context accumulated on that worker. */
typedef struct ct_dist_optim ct_dist_optim;

/* NULL with CT_EINVAL for an unknown worker, CT_ENOMEM. */
CT_API ct_dist_optim *ct_dist_optim_new(const char *name, const char *const *workers, int n);
/* Steps every worker's optimizer at once, with context's gradients there
 * (parameters without a gradient in the context are left alone); returns
 * when all are done, with the first error. Steps from several trainers on
 * one owner are applied one at a time. */
CT_API int ct_dist_optim_step(ct_dist_optim *o, int64_t context);
/* Accepts NULL. */
CT_API void ct_dist_optim_free(ct_dist_optim *o);

#ifdef __cplusplus
}
#endif

#endif
