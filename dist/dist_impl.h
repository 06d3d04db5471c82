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
} ct__store_status;

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

/* FNV-1a, 64 bits: the store's hash table and data parallel's model hash. */
static inline uint64_t ct__fnv1a(const void *data, size_t n) {
    const uint8_t *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

#endif
