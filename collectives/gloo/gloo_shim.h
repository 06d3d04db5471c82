/* ct gloo backend internal header: not installed, not part of the API.
 *
 * The C face of gloo_shim.cpp, the only code that touches libgloo's C++.
 * Every function catches every C++ exception inside and turns it into a
 * CT_E* code with gloo's text in err (CT__GLOO_ERR_LEN bytes): none
 * crosses into C. Calls block for as long as gloo does, at most the
 * timeout they are given; gloo.c calls them from its own threads, never
 * from comm.c's executor except where noted.
 *
 * Threads: one collective at a time per context (gloo.c's collective
 * thread), while point-to-point sends and receives are posted from
 * another thread and waited for on a third: gloo's context and pairs lock
 * what they share, and the slots keep the two kinds of traffic apart.
 *
 * Error codes: CT_ETIMEDOUT for gloo's timeouts, CT_EPEER for a
 * connection that broke (*peer then names the rank at its other end when
 * it can be told, else -1), CT_ENOMEM, CT_EFOREIGN for anything else gloo
 * or the C++ runtime threw. */
#ifndef CT_GLOO_SHIM_H
#define CT_GLOO_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CT__GLOO_ERR_LEN 512

typedef struct ct__gloo_ctx ct__gloo_ctx;
typedef struct ct__gloo_buf ct__gloo_buf;

/* How the shim reaches the store: the functions of ct_comm_store with
 * their ctx, and the prefix of every key. Borrowed by ct__gloo_connect for
 * the length of the call. */
typedef struct ct__gloo_store {
    void *ctx;
    int (*set)(void *ctx, const char *key, const void *value, size_t len);
    int (*get)(void *ctx, const char *key, double timeout_s, void **value, size_t *len);
    const char *prefix;
} ct__gloo_store;

/* The elementwise reduction gloo calls: out[i] = a[i] (op) b[i] for n
 * elements, in the type the caller chose (fn_ctx says which). */
typedef void (*ct__gloo_reduce_fn)(void *fn_ctx, void *out, const void *a, const void *b, size_t n);

/* A full mesh of TCP connections among size ranks, this one bound to addr
 * (an IPv4 address or host name), met through the store within
 * timeout_ms, which also becomes every operation's default. *out is the
 * context (free it with ct__gloo_ctx_free). */
int ct__gloo_connect(const ct__gloo_store *store, const char *addr, int rank, int size,
                     int64_t timeout_ms, ct__gloo_ctx **out, int *peer, char *err);
/* Closes every connection (peers see them close, their waits fail), then
 * frees. Accepts NULL. */
void ct__gloo_ctx_free(ct__gloo_ctx *ctx);
/* Breaks every connection (shutdown(2)), so that every operation pending
 * on them fails at once, on this rank and its peers. Any thread. */
void ct__gloo_ctx_close(ct__gloo_ctx *ctx);

/* The collectives, each blocking up to timeout_ms. Buffers hold count
 * elements of esize bytes (allgather: in count, out size x count;
 * alltoall: in and out count, size blocks). in may equal out where gloo
 * allows it (allreduce, broadcast, reduce). */
int ct__gloo_allreduce(ct__gloo_ctx *ctx, void *buf, size_t count, size_t esize,
                       ct__gloo_reduce_fn fn, void *fn_ctx, int64_t timeout_ms, int *peer,
                       char *err);
int ct__gloo_reduce(ct__gloo_ctx *ctx, void *buf, size_t count, size_t esize, int root,
                    ct__gloo_reduce_fn fn, void *fn_ctx, int64_t timeout_ms, int *peer, char *err);
int ct__gloo_broadcast(ct__gloo_ctx *ctx, void *buf, size_t count, size_t esize, int root,
                       int64_t timeout_ms, int *peer, char *err);
int ct__gloo_allgather(ct__gloo_ctx *ctx, const void *in, void *out, size_t count, size_t esize,
                       int64_t timeout_ms, int *peer, char *err);
int ct__gloo_alltoall(ct__gloo_ctx *ctx, const void *in, void *out, size_t count, size_t esize,
                      int64_t timeout_ms, int *peer, char *err);
int ct__gloo_barrier(ct__gloo_ctx *ctx, int64_t timeout_ms, int *peer, char *err);

/* Point to point over bytes: posting never blocks (safe on the executor),
 * ct__gloo_buf_wait blocks until the transfer completes or timeout_ms
 * passes. Messages to one peer on one slot arrive in the order posted; a
 * receive may be longer than the message it gets. The memory must stay
 * valid until the wait returns, or until the context is freed.
 * ct__gloo_buf_free accepts NULL. */
int ct__gloo_post_send(ct__gloo_ctx *ctx, const void *buf, size_t bytes, int peer_rank,
                       uint64_t slot, ct__gloo_buf **out, char *err);
int ct__gloo_post_recv(ct__gloo_ctx *ctx, void *buf, size_t bytes, int peer_rank, uint64_t slot,
                       ct__gloo_buf **out, char *err);
int ct__gloo_buf_wait(ct__gloo_buf *b, int64_t timeout_ms, int *peer, char *err);
void ct__gloo_buf_free(ct__gloo_buf *b);

#ifdef __cplusplus
}
#endif

#endif
