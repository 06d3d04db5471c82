/* ct RPC internal header: not installed, not part of the API. */
#ifndef CT_RPC_IMPL_H
#define CT_RPC_IMPL_H

#include <ct/dist_autograd.h>

#include "autograd_impl.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ct's RPC wire format is little-endian; this host is not"
#endif

typedef struct rpc_value {
    ct_rpc_type type;
    /* A tensor that required grad at its sender, inside a context: the
     * receiver gives it a recv node (context.c). */
    bool grad;
    union {
        ct_tensor *t; /* retained */
        int64_t i;
        double f;
        char *s; /* owned */
    };
} rpc_value;

struct ct_rpc_args {
    uint32_t magic;
    rpc_value *v;
    int n, cap;
};

int ct__rpc_args_check(const ct_rpc_args *a, const char *fn);
/* Appends the values of src from index first on to dst (tensors retained,
 * strings copied). */
int ct__rpc_args_extend(ct_rpc_args *dst, const ct_rpc_args *src, int first);

/* ------------------------------------------------------------------ wire */

/* Every message is one zmq multipart message: a header frame, a
 * description frame, then one frame per tensor (docs/rpc-design.md). */
#define RPC_MAGIC    0x31527463u /* "ctR1" */
#define RPC_VERSION  1
#define RPC_NAME_MAX 255
/* A tensor's flags on the wire. */
#define RPC_TENSOR_GRAD 1

typedef enum rpc_kind {
    RPC_REQUEST = 1,
    RPC_RESPONSE = 2,
    RPC_ERROR = 3,
    RPC_KINDS,
} rpc_kind;

typedef struct rpc_header {
    uint32_t magic;
    uint16_t version, kind;
    uint64_t id;       /* 16-bit worker id << 48 | 48-bit counter */
    uint64_t reply_to; /* the request a reply answers; 0 otherwise */
    uint64_t context;  /* a distributed autograd context, 0 if none */
    int32_t status;    /* RPC_ERROR: the CT_E* code */
    uint32_t ntensors; /* tensor frames after the description */
} rpc_header;

/* A message to send: the description's bytes, and the tensors that travel
 * in frames of their own, each contiguous. */
typedef struct rpc_out {
    rpc_header h;
    char *desc; /* malloc'd */
    size_t desc_len;
    ct_tensor **tensors; /* owned references */
    uint32_t ntensors;
} rpc_out;

void ct__rpc_out_free(rpc_out *m);
/* A request (fn: the function) or a response (fn NULL: results). With
 * grads, tensors that need grad (in grad mode) are marked as such. */
int ct__rpc_encode_call(rpc_out *m, const char *fn, const ct_rpc_args *args, bool grads);
/* An error reply: the message's text. */
int ct__rpc_encode_error(rpc_out *m, const char *message);

/* A received frame. When decoding wraps it in a tensor's storage, taken is
 * set and free_fn(data, ctx) runs when that storage goes; the caller frees
 * the frames not taken. */
typedef struct rpc_frame {
    void *data;
    size_t len;
    ct_free_fn free_fn;
    void *ctx;
    bool taken;
} rpc_frame;

/* Checks a header frame of len bytes and copies it into *h: CT_ECORRUPT for
 * a bad magic, version, kind or length. */
int ct__rpc_header_parse(const void *frame, size_t len, rpc_header *h);
/* Parses a description (desc_len bytes) with its tensor frames: the
 * function name (requests: fn gets it; responses: an empty name) and the
 * values, whose tensors wrap the frames. CT_ECORRUPT naming what is wrong;
 * never reads outside the description or a frame. */
int ct__rpc_decode_call(const void *desc, size_t desc_len, rpc_frame *frames, uint32_t nframes,
                        char fn[RPC_NAME_MAX + 1], ct_rpc_args **out);
/* The longest name a caller authenticates with that is kept. */
#define RPC_USER_MAX 32
/* Reads one request from sock, its routing id already taken: the header,
 * the description and the tensor frames, decoded into fn and *in (the
 * caller's to free). user gets the name the sender authenticated with ("" if
 * none). On failure the rest of the message is drained, *in is NULL, and *h
 * is the header as far as it was read (magic RPC_MAGIC and kind RPC_REQUEST:
 * the sender speaks the protocol and deserves an error reply). Errors:
 * CT_ECORRUPT naming what is malformed, CT_ENOMEM. */
int ct__rpc_read_request(void *sock, rpc_header *h, char fn[RPC_NAME_MAX + 1], ct_rpc_args **in,
                         char user[RPC_USER_MAX]);
/* The text of an error reply's description (malloc'd). */
int ct__rpc_decode_error(const void *desc, size_t desc_len, char **text);

/* ----------------------------------------------------- the agent, inside */

/* The calling worker, and the ids of a request being served. */
typedef struct rpc_call {
    int from;
    uint64_t id, context;
} rpc_call;

/* A request being served, to be answered once (ct__rpc_reply). */
typedef struct rpc_reply rpc_reply;

/* Answers r and frees it: rc 0 with out (may be NULL: no values), or rc
 * with ct_errmsg() as the error's text. Any thread. */
void ct__rpc_reply(rpc_reply *r, int rc, const ct_rpc_args *out);

/* Internal functions, named "ct.*": they run on a handler thread and answer
 * whenever they choose, so that one may wait for other calls without
 * holding a thread. in is theirs to free. */
typedef void (*rpc_internal_fn)(const rpc_call *c, ct_rpc_args *in, rpc_reply *r);
void ct__dautograd_on_backward(const rpc_call *c, ct_rpc_args *in, rpc_reply *r);
void ct__dautograd_on_release(const rpc_call *c, ct_rpc_args *in, rpc_reply *r);
void ct__rref_on_new(const rpc_call *c, ct_rpc_args *in, rpc_reply *r);
void ct__rref_on_fetch(const rpc_call *c, ct_rpc_args *in, rpc_reply *r);
void ct__rref_on_call(const rpc_call *c, ct_rpc_args *in, rpc_reply *r);
void ct__rref_on_del(const rpc_call *c, ct_rpc_args *in, rpc_reply *r);
void ct__dautograd_optim_on_step(const rpc_call *c, ct_rpc_args *in, rpc_reply *r);

/* Runs a registered function by name, as a call from c would. */
int ct__rpc_run_fn(const char *fn, const ct_rpc_args *in, ct_rpc_args *out);

/* A call from ct internals: to a worker id, in context (0: none), never
 * recorded for autograd; errors name it by label (what the user asked
 * for), not by fn. NULL with the error. */
ct_future *ct__rpc_call(int to, const char *fn, const char *label, const ct_rpc_args *args,
                        double timeout_s, uint64_t context);
/* The agent's state, for the layers above it. */
double ct__rpc_timeout(void);
double ct__rpc_context_timeout(void);
/* Whether worker id has been seen to die. */
bool ct__rpc_peer_dead(int id);
uint64_t ct__rpc_next_id(void);

/* -------------------------------------------- distributed autograd hooks */

/* A call about to be sent to worker `to` as message id: when this thread
 * has a context, records a send node for the tensors of args that need
 * grad. *context gets the id for the header (0: none). An error (the
 * context was released, out of memory) fails the call: sent without its
 * gradients, it would lose them silently. */
int ct__dautograd_on_send(int to, uint64_t id, const ct_rpc_args *args, uint64_t *context);
/* A message that arrived in context from worker `from` as message id:
 * gives its marked tensors a recv node. Then, for a request, the handler
 * runs in the context (ct__dautograd_enter), and its results are sent as
 * message reply_id (ct__dautograd_leave, which records their send node). */
int ct__dautograd_on_receive(uint64_t context, int from, uint64_t id, ct_rpc_args *args);
uint64_t ct__dautograd_enter(uint64_t context);
void ct__dautograd_leave(uint64_t saved);
int ct__dautograd_record_send(uint64_t context, int to, uint64_t id, const ct_rpc_args *args);
/* The agent saw worker id die; every context it touched fails. */
void ct__dautograd_peer_died(int id);
/* Ticks of the I/O thread (about every 50 ms): releases idle contexts. */
void ct__dautograd_tick(double now);
/* The agent stops: everything is released. */
void ct__dautograd_shutdown(void);
void ct__rref_peer_died(int id);
void ct__rref_shutdown(void);

#endif
