/* ct dist internal header: not installed, not part of the API.
 *
 * The store's wire format, shared by the client (store.c) and the server
 * (store_server.c); docs/store.md describes it for readers of the wire. */
#ifndef CT_DIST_IMPL_H
#define CT_DIST_IMPL_H

#include <ct/dist.h>

#include <stdint.h>
#include <string.h>

/* Every message is a header frame followed by argument frames. */
#define CT__STORE_MAGIC   0x31535443u /* "CTS1" read little-endian */
#define CT__STORE_HDR_LEN 20

typedef enum ct__store_op {
    CT__STORE_PING = 1,
    CT__STORE_SET,    /* key, value */
    CT__STORE_GET,    /* key -> value */
    CT__STORE_ADD,    /* key, int64 delta -> int64 total */
    CT__STORE_WAIT,   /* key... */
    CT__STORE_CAS,    /* key, expected, desired -> value now stored */
    CT__STORE_CHECK,  /* key... -> 1 byte: all exist */
    CT__STORE_DELETE, /* key -> 1 byte: existed */
    CT__STORE_NOPS
} ct__store_op;

typedef enum ct__store_status {
    CT__STORE_OK = 0,
    CT__STORE_TIMEOUT, /* the server gave up waiting for keys */
    CT__STORE_REFUSED, /* bad request; the payload is the server's reason */
    CT__STORE_RANGE,   /* add overflowed; the payload is the reason */
    CT__STORE_NOMEM,   /* the server ran out of memory */
    CT__STORE_FULL,    /* a limit of the server's; the payload names it */
} ct__store_status;

/* What a server holds at most: keys (CT_STORE_MAX_KEYS_TOTAL), bytes of keys
 * and values (CT_STORE_MAX_BYTES) and clients (CT_STORE_MAX_CLIENTS). */
typedef struct ct__store_limits {
    size_t max_keys, max_bytes, max_clients;
} ct__store_limits;

/* The defaults, overridden by those variables; CT_EINVAL names a variable
 * that is not a positive whole number. */
int ct__store_limits_from_env(ct__store_limits *l);

/* For the fuzzer: a server that no thread serves and no socket reaches
 * (free it with ct_store_server_free); feed() handles one message as the
 * server's thread would, frames[0] being the sender's routing id and its
 * replies going nowhere; consistent() checks the table's bookkeeping and
 * limits. One thread at a time. */
struct zmq_msg_t;
ct_store_server *ct__store_server_new_detached(void);
void ct__store_server_feed(ct_store_server *s, struct zmq_msg_t *frames, int n, bool truncated);
bool ct__store_server_consistent(const ct_store_server *s);

/* Header layout, little-endian: magic u32 @0, op u8 @4, status u8 @5,
 * reserved u16 @6, request id u64 @8, timeout in ms u32 @16 (requests; how
 * long the server keeps a get/wait pending). */
typedef struct ct__store_hdr {
    uint8_t op, status;
    uint64_t id;
    uint32_t timeout_ms;
} ct__store_hdr;

static inline void ct__store_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void ct__store_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t ct__store_get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline uint64_t ct__store_get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static inline void ct__store_hdr_encode(uint8_t out[CT__STORE_HDR_LEN], const ct__store_hdr *h) {
    memset(out, 0, CT__STORE_HDR_LEN);
    ct__store_put_u32(out, CT__STORE_MAGIC);
    out[4] = h->op;
    out[5] = h->status;
    ct__store_put_u64(out + 8, h->id);
    ct__store_put_u32(out + 16, h->timeout_ms);
}

/* False for a frame that is not a header of this protocol version. */
static inline bool ct__store_hdr_decode(const void *frame, size_t len, ct__store_hdr *h) {
    const uint8_t *p = frame;
    if (len != CT__STORE_HDR_LEN || ct__store_get_u32(p) != CT__STORE_MAGIC)
        return false;
    h->op = p[4];
    h->status = p[5];
    h->id = ct__store_get_u64(p + 8);
    h->timeout_ms = ct__store_get_u32(p + 16);
    return h->op >= CT__STORE_PING && h->op < CT__STORE_NOPS;
}

const char *ct__store_op_name(int op);

/* Where a listener of this rank binds (bind) and the host the other ranks
 * reach it by (host): name when given, else loopback when every rank is on
 * this machine, else this host's name. bind is host's IPv4 address, which
 * must not be a loopback one when the ranks span machines; CT_BIND_ADDR
 * overrides it ("*" for every interface, when that is wanted). Errors:
 * CT_EINVAL naming the host that does not resolve or resolves to loopback. */
#define CT__BIND_LEN 128
int ct__dist_listen_address(const ct_world *w, const char *name, char bind[CT__BIND_LEN],
                            char host[256]);

/* The store as the gloo backend takes it (comm_store.c): a ct_comm_store
 * over a client of its own, connected to host:port within timeout_s,
 * thread-safe. It must outlive every communicator made with it. Errors as
 * ct_store_connect's; *out is NULL on failure. Free accepts NULL. */
typedef struct ct__dist_comm_store ct__dist_comm_store;
int ct__dist_comm_store_new(const char *host, int port, double timeout_s,
                            ct__dist_comm_store **out);
const ct_comm_store *ct__dist_comm_store_fns(const ct__dist_comm_store *s);
void ct__dist_comm_store_free(ct__dist_comm_store *s);

/* A limit from the environment: variable name, a whole number >= 1, or def
 * when unset. Errors: CT_EINVAL naming the variable and its value. */
int ct__dist_env_limit(const char *name, size_t def, size_t *out);

/* ------------------------------------------------ rendezvous (rendezvous.c) */

/* For a world that meets in a store rank 0 hosts (env://, a Slurm step
 * without PMI), gives this process the job's secret (docs/multinode.md):
 * the one it has, else, when every rank is on this machine, rank 0's from a
 * private file (*file is then true: ct__dist_rdzv_reread_secret reads it again,
 * ct__dist_rdzv_secret_remove removes it). Errors: CT_EAUTH for ranks across
 * machines without a secret; CT_ETIMEDOUT when rank 0's file does not come
 * within timeout_s; CT_EINVAL or CT_EIO for a directory or file that is not
 * private. Called by ct_dist_init's thread only. */
int ct__dist_rdzv_secret(const ct_world *w, double timeout_s, bool *file);
int ct__dist_rdzv_reread_secret(const ct_world *w);
void ct__dist_rdzv_secret_remove(const ct_world *w);
/* Every rank checks in to the store under prefix: a rank that another
 * process already claims is refused (CT_EINVAL naming both processes; the
 * ranks waiting are told, CT_EPEER), and the ranks counted on this machine
 * give w's local size, and its local rank where the launcher did not, or
 * must equal the local size it gave (CT_EINVAL naming both). Waits for all
 * w->size ranks within the store client's timeout (CT_ETIMEDOUT saying how
 * many came). */
int ct__dist_rdzv_check_in(ct_store *s, ct_world *w, const char *prefix);
/* This machine's key for the hierarchical communicator: a hash of the
 * machine's identity the check-in counts by (its host name and boot id),
 * equal on the ranks of one machine. Thread-safe. */
uint64_t ct__dist_rdzv_machine_key(void);

/* ------------------------------------------------------------- auth (auth.c) */

/* A listener's authentication: the ZAP handler's socket, served by the
 * listener's own thread (poll fd for POLLIN, then ct__auth_serve), and what
 * it has refused. Used by one thread. fd is the socket's ZMQ_FD: a zmq
 * socket in a zmq_poll set costs a system call in every poll, to look for
 * events, and the listener polls once or twice per message it serves,
 * while ZAP requests come once per connection. */
typedef struct ct__auth {
    void *zap;       /* a REP socket on zmq's ZAP endpoint of the listener's context */
    int fd;          /* zap's ZMQ_FD: readable when zap may have requests */
    const char *who; /* "the store server", for log lines */
    char secret[CT_SECRET_MAX + 1];
    unsigned long long accepted, refused, unlogged;
    double logged_at;
} ct__auth;

/* Makes sock (not yet bound) accept only connections that prove the job's
 * secret, with a ZAP handler in ctx (one per context). Errors: the secret's
 * (a bad CT_JOB_SECRET or CT_SECRET_FILE), CT_EFOREIGN from zmq. */
int ct__auth_listen(void *ctx, void *sock, ct__auth *a, const char *who);
/* Answers every waiting ZAP request (as ZMQ_FD requires: it signals only
 * that something arrived since the socket was last read to the end);
 * refusals are logged to stderr with the peer's address, at most once a
 * second. */
void ct__auth_serve(ct__auth *a);
void ct__auth_close(ct__auth *a);
/* Gives sock (not yet connected) the job's secret, and user as the name the
 * listener sees ("User-Id" on its messages). */
int ct__auth_client(void *sock, const char *user);
/* Copies the process's secret, finding it first if needed. */
int ct__auth_secret_copy(char out[CT_SECRET_MAX + 1]);
/* Whether the process has a secret from outside (ct_secret_set,
 * CT_JOB_SECRET, CT_SECRET_FILE) rather than a random one of its own.
 * Thread-safe. */
bool ct__auth_secret_given(void);
/* ct_secret_read_file of path relative to the directory dir (AT_FDCWD for
 * the working directory), with its checks. */
int ct__auth_read_secret_at(int dir, const char *path, char out[CT_SECRET_MAX + 1]);

/* zmq_msg_recv, with a signal (EINTR) retried. Every read of a message's
 * later parts goes through it: zmq delivers a message whole, so those parts
 * are there, and giving up on one would leave the message's tail on the
 * socket to be read as the start of the next message. Returns what
 * zmq_msg_recv returns; m must be initialised. */
struct zmq_msg_t;
int ct__dist_zmq_recv(struct zmq_msg_t *m, void *sock, int flags);

/* libzmq is not built with ThreadSanitizer, which thus cannot see that a
 * frame given to zmq_msg_send reaches zmq's own thread, where the frame's
 * free callback runs: CT__ZMQ_HANDOFF(p) before the send and
 * CT__ZMQ_HANDBACK(p) in the callback tell it (p: the callback's hint). */
#if defined(__SANITIZE_THREAD__)
#define CT__ZMQ_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CT__ZMQ_TSAN 1
#endif
#endif
#ifdef CT__ZMQ_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define CT__ZMQ_HANDOFF(p)  __tsan_release(p)
#define CT__ZMQ_HANDBACK(p) __tsan_acquire(p)
#else
#define CT__ZMQ_HANDOFF(p)  ((void)(p))
#define CT__ZMQ_HANDBACK(p) ((void)(p))
#endif

/* Copies src into dst (n > 0 bytes), cut short to fit, always
 * NUL-terminated: snprintf's "%s" without parsing a format, for the paths
 * that run once per message. */
static inline void ct__str_copy(char *dst, size_t n, const char *src) {
    size_t len = strnlen(src, n - 1);
    memcpy(dst, src, len);
    dst[len] = '\0';
}

/* FNV-1a, 64 bits: the store's hash table and data parallel's model hash. */
static inline uint64_t ct__fnv1a(const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

#endif
