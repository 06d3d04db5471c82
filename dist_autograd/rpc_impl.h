/* ct RPC internal header: not installed, not part of the API. */
#ifndef CT_RPC_IMPL_H
#define CT_RPC_IMPL_H

#include <ct/dist_autograd.h>

#include "tensor_impl.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ct's RPC wire format is little-endian; this host is not"
#endif

typedef struct rpc_value {
    ct_rpc_type type;
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

/* ------------------------------------------------------------------ wire */

/* Every message is one zmq multipart message: a header frame, a
 * description frame, then one frame per tensor (docs/rpc-design.md). */
#define RPC_MAGIC    0x31527463u /* "ctR1" */
#define RPC_VERSION  1
#define RPC_NAME_MAX 255

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
/* A request (fn: the function) or a response (fn NULL: results). */
int ct__rpc_encode_call(rpc_out *m, const char *fn, const ct_rpc_args *args);
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
/* The text of an error reply's description (malloc'd). */
int ct__rpc_decode_error(const void *desc, size_t desc_len, char **text);

#endif
