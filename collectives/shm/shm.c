/* The shared-memory backend: ranks on one machine, one segment.
 *
 * Transports and algorithms stay apart. The segment holds three kinds of
 * transport, each lock-free with monotonic counters (they never reset, so
 * there is no ABA and no per-call setup):
 *   - bulletins: per rank, two buffers (by sequence parity) where a rank
 *     posts a small operation's whole input; everyone reads everyone's.
 *     One round of synchronization, which is what small messages need.
 *   - ring channels: single-producer, single-consumer queues of fixed-size
 *     slots from each rank to the next. Large allreduce, reduce_scatter,
 *     allgather, broadcast and reduce run on them as a chunked, pipelined
 *     ring (reduce-scatter then allgather for allreduce; a chain for
 *     broadcast and reduce).
 *   - outboxes: per rank, a few slots that it fills with chunks of
 *     alltoall blocks and of messages, each stamped with its receiver; a
 *     receiver takes what is addressed to it from the sender's outbox.
 *     Half the slots are for alltoall, half for send/recv, so that neither
 *     can starve the other. Per rank, not per pair: the segment grows
 *     linearly with the ranks.
 * Besides the segment, ct_comm_zeros memory is one more segment per rank
 * that every rank maps (a block); an allreduce on it runs without any
 * transport, straight from the peers' memory (see "direct" below).
 * Each slot is stamped with the sender's operation descriptor, so a
 * disagreement between ranks is caught on the first chunk, before any data
 * is used. A rank that cannot move polls its peers' published state: a
 * descriptor that differs at the same sequence number (ranks that chose
 * different paths), a rank that failed the group (the abort word), or a
 * process that died (pidfd). */
#include "coll_impl.h"
#include "tensor_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define SHM_MAGIC   0x31304d4853544354ull /* "CTSHM01" */
#define SHM_VERSION 3
#define LINE        64

/* Sizes: a ring slot holds one pipeline chunk; eight in flight keep the
 * ring busy while one end is a chunk behind. Bulletins take operations of
 * up to BULLETIN_BYTES per rank. An outbox has OUT_SLOTS slots, half of
 * them for each kind of traffic (two in flight per kind keep a transfer
 * pipelined). */
#define RING_SLOT      (64 * 1024)
#define RING_SLOTS     8
#define BULLETIN_BYTES (64 * 1024)
#define OUT_SLOT       (32 * 1024)
#define OUT_SLOTS      4
#define NAME_MAX_LEN   200
#define ACC_BYTES      (2 * BULLETIN_BYTES) /* the reduction accumulator */

/* -------------------------------------------------------------- layout */

typedef struct slot_meta {
    ct__coll_desc desc; /* the sender's operation */
    int64_t bytes;      /* payload in this slot */
    _Alignas(LINE) char pad[0];
} slot_meta;

typedef struct chan_ctl {
    _Alignas(LINE) atomic_uint_fast64_t head; /* slots produced, written by the sender */
    _Alignas(LINE) atomic_uint_fast64_t tail; /* slots consumed, written by the receiver */
} chan_ctl;

typedef struct rank_ctl {
    _Alignas(LINE) atomic_int pid;
    _Alignas(LINE) atomic_uint_fast64_t direct; /* seq * 2 + 1: its direct share is out */
} rank_ctl;

/* A rank's announcement of a collective, one per sequence parity: every
 * collective on every path announces itself here when it starts, and
 * completes only once every rank's announcement of it agrees (agree()).
 * That makes each collective a rendezvous, so a rank is never two
 * collectives ahead of another: the buffer of parity seq & 1 is free again
 * once seq + 1 has completed, and nobody reads it then. A small
 * operation's input (the bulletin) travels with its announcement. */
typedef struct bulletin {
    _Alignas(LINE) atomic_uint_fast64_t seq; /* the announced operation's seq */
    ct__coll_desc desc;
    uint64_t block; /* the ct_comm_zeros block holding its data, 0 when none */
    int64_t offset; /* bytes into the block */
    _Alignas(LINE) char data[BULLETIN_BYTES];
} bulletin;

typedef struct header {
    uint64_t magic; /* written last by rank 0: the segment is ready */
    uint32_t version;
    int32_t size;
    uint64_t bytes;
    _Alignas(LINE) atomic_int attached;
    _Alignas(LINE) atomic_int abort_claim; /* the first rank to fail the group sets it */
    atomic_int abort_code;                 /* then this: 0, or that failure's CT_E* code */
    int32_t abort_rank;
    char abort_msg[CT__MSG_LEN];
} header;

/* An outbox slot: free (for 0), or holding a chunk for rank for - 1. The
 * sender writes it only while it is free; only that receiver reads the
 * rest, and frees it. */
typedef struct out_meta {
    _Alignas(LINE) atomic_int for_rank;
    ct__coll_desc desc; /* of the sender's operation */
    int64_t offset;     /* of the chunk in the block or message, in bytes */
    int64_t bytes;
} out_meta;

typedef struct layout {
    size_t ctl, bulletins, ring_ctl, ring_meta, ring_data, out_meta, out_data, bytes;
} layout;

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Every part is per rank, so the segment holds n times a constant (about
 * 0.8 MiB, most of it the ring's slots) and a header. */
static layout make_layout(int n) {
    layout l;
    size_t page = 4096, off = round_up(sizeof(header), page);
    l.ctl = off;
    off = round_up(off + (size_t)n * sizeof(rank_ctl), page);
    l.bulletins = off;
    off = round_up(off + (size_t)n * 2 * sizeof(bulletin), page);
    l.ring_ctl = off;
    off += (size_t)n * sizeof(chan_ctl);
    l.ring_meta = off;
    off = round_up(off + (size_t)n * RING_SLOTS * sizeof(slot_meta), page);
    l.ring_data = off;
    off += (size_t)n * RING_SLOTS * RING_SLOT;
    l.out_meta = off;
    off = round_up(off + (size_t)n * OUT_SLOTS * sizeof(out_meta), page);
    l.out_data = off;
    off += (size_t)n * OUT_SLOTS * OUT_SLOT;
    l.bytes = round_up(off, page);
    return l;
}

int ct__shm_layout_bytes(int n, size_t *bytes) {
    if (n < 1 || n > CT__SHM_MAX_RANKS)
        return ct__err_set(CT_EINVAL,
                           "comm_new: the shm backend takes 1 to %d ranks on one machine, not %d "
                           "(use the mpi backend across machines)",
                           CT__SHM_MAX_RANKS, n);
    *bytes = make_layout(n).bytes;
    return 0;
}

/* One direction of traffic between two ranks, seen from one end. */
typedef struct chan {
    chan_ctl *ctl;
    slot_meta *meta;
    char *data;
    int64_t slot_bytes, nslots;
    uint64_t count; /* this end's own counter: head for a sender, tail for a receiver */
} chan;

enum { OUT_COLL, OUT_P2P };

/* ct_comm_zeros memory: every rank's segment of one allocation, as mapped
 * here. Owned by its storage; listed in its communicator's registry while
 * it lives. */
typedef struct shm_block {
    struct shm_block *next;
    struct registry *reg;
    uint64_t id;  /* 1, 2, ... in allocation order, the same on every rank */
    size_t bytes; /* of each rank's segment */
    int n;        /* ranks: the block may outlive its communicator */
    char **base;  /* [n] */
} shm_block;

/* The live blocks of a communicator. Storages may outlive it, so both hold
 * a reference. mu guards the list: blocks are made and freed on users'
 * threads and looked up on the executor's. */
typedef struct registry {
    pthread_mutex_t mu;
    shm_block *head;
    atomic_int refs;
} registry;

typedef struct shm {
    char name[NAME_MAX_LEN + 1];
    char *base;
    layout l;
    header *hdr;
    rank_ctl *ctl;
    int n, rank;
    chan ring_out, ring_in;
    bool *p2p_busy_out, *p2p_busy_in;
    int64_t *a2a_sent, *a2a_got; /* bytes per peer of the active alltoall */
    void *acc;                   /* the accumulator of bulletin reductions */
    int *pidfds;
    int guard_fd; /* rank 0 while the others attach: start_guard's pipe */
    pid_t guard;
    ct__coll_desc active; /* this rank's active collective; seq 0 when none */
    registry *blocks;
    uint64_t nblocks; /* made so far */
} shm;

static rank_ctl *ctl_of(shm *s, int r) { return &s->ctl[r]; }

static bulletin *bulletin_of(shm *s, int r, uint64_t seq) {
    return (bulletin *)(s->base + s->l.bulletins) + 2 * r + (int)(seq & 1);
}

static chan make_chan(shm *s, size_t ctl_off, size_t meta_off, size_t data_off, size_t index,
                      int64_t slot_bytes, int64_t nslots) {
    return (chan){
        .ctl = (chan_ctl *)(s->base + ctl_off) + index,
        .meta = (slot_meta *)(s->base + meta_off) + index * (size_t)nslots,
        .data = s->base + data_off + index * (size_t)nslots * (size_t)slot_bytes,
        .slot_bytes = slot_bytes,
        .nslots = nslots,
    };
}

static out_meta *out_meta_of(shm *s, int r, int i) {
    return (out_meta *)(s->base + s->l.out_meta) + (size_t)r * OUT_SLOTS + i;
}

static char *out_data_of(shm *s, int r, int i) {
    return s->base + s->l.out_data + ((size_t)r * OUT_SLOTS + (size_t)i) * OUT_SLOT;
}

/* ------------------------------------------------------------- channels */

/* The next slot to write, or NULL when the receiver has not freed one. */
static void *chan_slot_to_write(chan *ch) {
    uint64_t tail = atomic_load_explicit(&ch->ctl->tail, memory_order_acquire);
    if (ch->count - tail >= (uint64_t)ch->nslots)
        return NULL;
    return ch->data + (int64_t)(ch->count % (uint64_t)ch->nslots) * ch->slot_bytes;
}

static void chan_publish(chan *ch, const ct__coll_desc *d, int64_t bytes) {
    slot_meta *m = &ch->meta[ch->count % (uint64_t)ch->nslots];
    m->desc = *d;
    m->bytes = bytes;
    atomic_store_explicit(&ch->ctl->head, ++ch->count, memory_order_release);
}

/* The next slot to read and its stamp, or NULL when none has arrived. */
static const void *chan_slot_to_read(chan *ch, const slot_meta **meta) {
    uint64_t head = atomic_load_explicit(&ch->ctl->head, memory_order_acquire);
    if (head == ch->count)
        return NULL;
    uint64_t i = ch->count % (uint64_t)ch->nslots;
    *meta = &ch->meta[i];
    return ch->data + (int64_t)i * ch->slot_bytes;
}

static void chan_release(chan *ch) {
    atomic_store_explicit(&ch->ctl->tail, ++ch->count, memory_order_release);
}

/* "ranks disagree at collective #7 (the root differs: root 0 on rank 0,
 * root 1 on rank 1): rank 0 has ..., rank 1 has ..." */
static void disagree(char *msg, int me, const ct__coll_desc *mine, int peer,
                     const ct__coll_desc *theirs) {
    char a[256], b[256];
    snprintf(msg, CT__MSG_LEN, "ranks disagree at %s #%llu (",
             ct__op_is_p2p(mine->op) ? "message" : "collective", (unsigned long long)mine->seq);
    ct__coll_desc_differ(msg, CT__MSG_LEN, mine, me, theirs, peer);
    ct__coll_msg_append(msg, CT__MSG_LEN, "): rank %d has %s, rank %d has %s", me,
                        ct__coll_desc_str(a, sizeof a, mine), peer,
                        ct__coll_desc_str(b, sizeof b, theirs));
}

static int mismatch(ct_work *w, int peer, const ct__coll_desc *theirs) {
    disagree(w->msg, w->comm->rank, &w->desc, peer, theirs);
    return CT_EMISMATCH;
}

/* Whether a send and the recv that takes it agree. */
static bool message_match(const ct__coll_desc *sent, const ct__coll_desc *recv) {
    return sent->seq == recv->seq && sent->dtype == recv->dtype && sent->count == recv->count &&
           sent->tag == recv->tag;
}

/* --------------------------------------------------------------- state */

typedef enum path {
    PATH_LOCAL,
    PATH_BULLETIN,
    PATH_DECIDE, /* an allreduce in a block: direct if every rank's is there */
    PATH_DIRECT,
    PATH_RING,
    PATH_CHAIN,
    PATH_OUTBOX
} path;

/* Per-work state, in w->be. */
typedef struct shm_work {
    path path;
    int agreed;       /* ranks whose announcement agrees with this one, in rank order */
    bool moved;       /* this rank's data movement is over; agreement may not be */
    int64_t task;     /* ring/chain: the next task */
    int64_t ntasks;   /* ring/chain */
    int64_t chunk;    /* ring/chain: elements per chunk */
    int64_t per_task; /* ring/chain: tasks per chunk */
    int64_t k0;       /* ring: the first step of the unified schedule */
    int64_t done;     /* send/recv: bytes moved */
    bool pushed;      /* direct: this rank's share is in every rank's copy */
    shm_block *blk;   /* decide, direct: the block holding the data */
    int64_t offset;   /* decide, direct: the data's byte offset in it */
} shm_work;

_Static_assert(sizeof(shm_work) <= CT__WORK_BACKEND_BYTES, "shm_work must fit in ct_work.be");

static shm_work *state(ct_work *w) { return (shm_work *)w->be; }

static size_t esize(const ct_work *w) { return ct__esize((ct_dtype)w->desc.dtype); }

/* Bytes each rank posts for a collective on the bulletin path. */
static int64_t post_bytes(const ct_work *w, int n) {
    int64_t e = (int64_t)esize(w);
    switch (w->desc.op) {
    case CT__REDUCE_SCATTER: return w->desc.count * n * e;
    case CT__BARRIER: return 0;
    default: return w->desc.count * e;
    }
}

/* ------------------------------------------------------------ agreement */

/* Announces w (with its input when it takes the bulletins, and the block
 * holding its data, if any). The buffer is free: see struct bulletin. */
static void announce(shm *s, ct_work *w, bool post, const shm_block *blk, int64_t offset) {
    bulletin *b = bulletin_of(s, s->rank, w->desc.seq);
    bool has_data = w->desc.op != CT__BROADCAST || w->desc.root == s->rank;
    if (post && has_data && w->in)
        memcpy(b->data, w->in, (size_t)post_bytes(w, s->n));
    b->desc = w->desc;
    b->block = blk ? blk->id : 0;
    b->offset = offset;
    atomic_store_explicit(&b->seq, w->desc.seq, memory_order_release);
    s->active = w->desc;
}

/* Whether every rank announced w's collective with the same descriptor:
 * CT__DONE once all have, CT__PENDING while one has not, CT_EMISMATCH
 * (w->msg naming the field) when one differs. Picks up where the last call
 * stopped, so a waiting rank reads each announcement once. */
static int agree(shm *s, ct_work *w) {
    shm_work *st = state(w);
    for (; st->agreed < s->n; st->agreed++) {
        const bulletin *b = bulletin_of(s, st->agreed, w->desc.seq);
        if (atomic_load_explicit(&b->seq, memory_order_acquire) != w->desc.seq)
            return CT__PENDING;
        if (!ct__coll_desc_match(&b->desc, &w->desc))
            return mismatch(w, st->agreed, &b->desc);
    }
    return CT__DONE;
}

/* ------------------------------------------------------------ bulletins */

/* out := the reduction of len elements from each rank's src, in rank
 * order, so that every rank computes bitwise the same result. out may be
 * one of the sources. */
static void reduce_ranks(shm *s, ct_work *w, char *out, const char *const *src, int64_t len) {
    ct_dtype dt = (ct_dtype)w->desc.dtype;
    ct_reduce_op op = (ct_reduce_op)w->desc.rop;
    int64_t e = (int64_t)ct__esize(dt), ae = (int64_t)ct__coll_acc_size(dt);
    int n = s->n;
    int64_t piece = ACC_BYTES / ae;
    for (int64_t i = 0; i < len; i += piece) {
        int64_t m = len - i < piece ? len - i : piece;
        /* A dtype that is its own accumulator is read as one where it lies,
         * which saves a pass (on 2 ranks, the only one besides finishing). */
        const void *acc = src[0] + i * e;
        if (ae != e) {
            ct__coll_acc_load(s->acc, acc, m, dt);
            acc = s->acc;
        }
        for (int r = 1; r < n - 1; r++) {
            ct__coll_acc_combine(s->acc, acc, src[r] + i * e, m, dt, op);
            acc = s->acc;
        }
        ct__coll_acc_finish(out + i * e, acc, src[n - 1] + i * e, m, dt, op, n);
    }
}

/* Rank r's post of w. This rank's own is read from its input, which holds
 * the same bytes and is still in this core's cache; the bulletin's copy is
 * for the peers. Read from the bulletin, a 32 KiB allreduce on 2 ranks took
 * 2.5 times as long (docs/collectives.md). */
static const char *post_of(shm *s, const ct_work *w, int r) {
    return r == s->rank && w->in ? w->in : bulletin_of(s, r, w->desc.seq)->data;
}

/* Reduces element range [lo, lo + len) of every rank's post into out. */
static void bulletin_reduce(shm *s, ct_work *w, void *out, int64_t lo, int64_t len) {
    const char *src[s->n];
    int64_t e = (int64_t)esize(w);
    for (int r = 0; r < s->n; r++)
        src[r] = post_of(s, w, r) + lo * e;
    reduce_ranks(s, w, out, src, len);
}

/* Every rank's post is in and agrees: reads what this rank needs of them. */
static int bulletin_progress(shm *s, ct_work *w) {
    uint64_t seq = w->desc.seq;
    int64_t count = w->desc.count, e = (int64_t)esize(w);
    switch (w->desc.op) {
    case CT__ALLREDUCE: bulletin_reduce(s, w, w->out, 0, count); break;
    case CT__REDUCE:
        if (s->rank == w->desc.root)
            bulletin_reduce(s, w, w->out, 0, count);
        break;
    case CT__REDUCE_SCATTER: bulletin_reduce(s, w, w->out, s->rank * count, count); break;
    case CT__BROADCAST:
        if (s->rank != w->desc.root)
            memcpy(w->out, bulletin_of(s, w->desc.root, seq)->data, (size_t)(count * e));
        break;
    case CT__ALLGATHER:
        for (int r = 0; r < s->n; r++) {
            char *dst = (char *)w->out + r * count * e;
            const char *src = post_of(s, w, r);
            if (dst != src)
                memcpy(dst, src, (size_t)(count * e));
        }
        break;
    case CT__ALLTOALL: {
        int64_t block = count / s->n * e;
        for (int r = 0; r < s->n; r++) {
            char *dst = (char *)w->out + r * block;
            const char *src = post_of(s, w, r) + s->rank * block;
            if (dst != src)
                memcpy(dst, src, (size_t)block);
        }
        break;
    }
    default: break;
    }
    return CT__DONE;
}

/* ------------------------------------------------------------ direct */

/* An allreduce whose data every rank keeps at the same place of the same
 * block runs straight from the peers' memory. Rank r owns share r of the
 * elements: it reduces them from every rank's copy, in rank order, and
 * writes the result into every rank's copy. Nothing is staged, and each
 * element is reduced once, so every rank holds bitwise the same result.
 * Shares are disjoint, so the ranks never touch the same bytes: rank r
 * reads and writes only share r, in every copy, and reads each piece of
 * it from every copy before writing that piece anywhere. Two points
 * synchronize:
 *   - publishing the operation with its block and offset says that the
 *     input is in place; every rank reads every rank's, and all decide the
 *     path alike;
 *   - the direct counter, seq * 2 + 1, says that a rank wrote its share
 *     everywhere. A rank finishes once every rank has, since until then a
 *     peer may still read or write its copy.
 * A reduce-scatter from such memory runs alike: rank r reduces block r of
 * every rank's input, in rank order (the allreduce's order, so that a
 * model sharded by reduce-scatters gets data parallel's bits), into its
 * own output, and writes nothing of the peers'; the counter then says
 * that it has read them, after which they may change their input. An
 * allgather into such memory: rank r writes its input into block r of
 * every rank's output, which no one else writes or reads meanwhile (ZeRO's
 * in-place gather of the parameters after a step). A reduce of such
 * memory: the root reduces every rank's copy in rank order into its own
 * (ZeRO-2's buckets, reduced to their owner from the shared slots); the
 * others' copies stay as they were. */
#define PIECE_BYTES (64 * 1024) /* reduced, then written out, while in cache */

/* The live block holding [p, p + bytes), and the offset of p in it. */
static shm_block *find_block(shm *s, const void *p, int64_t bytes, int64_t *offset) {
    shm_block *found = NULL;
    pthread_mutex_lock(&s->blocks->mu);
    for (shm_block *b = s->blocks->head; b && !found; b = b->next) {
        const char *base = b->base[s->rank];
        if ((const char *)p >= base && (const char *)p + bytes <= base + b->bytes) {
            found = b;
            *offset = (const char *)p - base;
        }
    }
    pthread_mutex_unlock(&s->blocks->mu);
    return found;
}

/* Share r of count elements: [lo(r), lo(r + 1)), cut at multiples of 16
 * elements so that each starts on a cache line when the data does. */
static int64_t share_lo(int64_t count, int n, int r) {
    return r == n ? count : count * r / n / 16 * 16;
}

/* Every rank announced this allreduce, alike: whether every one keeps it
 * at the same place of the same block. */
static bool decide_direct(shm *s, ct_work *w) {
    shm_work *st = state(w);
    bool same = true;
    for (int r = 0; r < s->n; r++) {
        const bulletin *b = bulletin_of(s, r, w->desc.seq);
        same &= b->block == st->blk->id && b->offset == st->offset;
    }
    return same;
}

static bool all_reached(shm *s, uint64_t value) {
    for (int r = 0; r < s->n; r++)
        if (atomic_load_explicit(&ctl_of(s, r)->direct, memory_order_acquire) < value)
            return false;
    return true;
}

static int direct_progress(shm *s, ct_work *w) {
    shm_work *st = state(w);
    int n = s->n, me = s->rank;
    int64_t e = (int64_t)esize(w), count = w->desc.count;
    uint64_t pushed = w->desc.seq * 2 + 1;
    if (!st->pushed && w->desc.op == CT__REDUCE) {
        /* The root reduces every rank's copy, in rank order (the
         * allreduce's), into its own, piece by piece; the others only say
         * when the root may have read them. */
        int64_t piece = PIECE_BYTES / e;
        const char *at[n];
        for (int64_t i = 0; me == w->desc.root && i < count; i += piece) {
            int64_t len = count - i < piece ? count - i : piece;
            for (int r = 0; r < n; r++)
                at[r] = st->blk->base[r] + st->offset + i * e;
            reduce_ranks(s, w, (char *)w->out + i * e, at, len);
        }
        st->pushed = true;
        atomic_store_explicit(&ctl_of(s, me)->direct, pushed, memory_order_release);
    }
    if (!st->pushed && w->desc.op == CT__ALLGATHER) {
        /* This rank's input into block `me` of every rank's output. */
        for (int r = 0; r < n; r++) {
            char *dst = st->blk->base[r] + st->offset + me * count * e;
            if (dst != (const char *)w->in)
                memcpy(dst, w->in, (size_t)(count * e));
        }
        st->pushed = true;
        atomic_store_explicit(&ctl_of(s, me)->direct, pushed, memory_order_release);
    }
    if (!st->pushed && w->desc.op == CT__REDUCE_SCATTER) {
        /* This rank's block of every rank's input, summed in rank order as
         * the allreduce does, into its own output. */
        int64_t piece = PIECE_BYTES / e;
        const char *at[n];
        for (int64_t i = 0; i < count; i += piece) {
            int64_t len = count - i < piece ? count - i : piece;
            for (int r = 0; r < n; r++)
                at[r] = st->blk->base[r] + st->offset + (me * count + i) * e;
            reduce_ranks(s, w, (char *)w->out + i * e, at, len);
        }
        st->pushed = true;
        atomic_store_explicit(&ctl_of(s, me)->direct, pushed, memory_order_release);
    }
    if (!st->pushed) {
        int64_t lo = share_lo(count, n, me), hi = share_lo(count, n, me + 1);
        int64_t piece = PIECE_BYTES / e;
        char *at[n];
        for (int64_t i = lo; i < hi; i += piece) {
            int64_t len = hi - i < piece ? hi - i : piece;
            for (int r = 0; r < n; r++)
                at[r] = st->blk->base[r] + st->offset + i * e;
            reduce_ranks(s, w, at[me], (const char *const *)at, len);
            for (int r = 0; r < n; r++)
                if (r != me)
                    memcpy(at[r], at[me], (size_t)(len * e));
        }
        st->pushed = true;
        atomic_store_explicit(&ctl_of(s, me)->direct, pushed, memory_order_release);
    }
    return all_reached(s, pushed) ? CT__DONE : CT__PENDING;
}

/* ------------------------------------------------------------ the ring */

/* The ring runs one unified schedule of 2n - 1 steps per chunk for rank r
 * and segment (r - 1 - k) mod n at step k:
 *   k = 0          send own input                 (reduce-scatter begins)
 *   0 < k < n - 1  receive, reduce with own, send
 *   k = n - 1      receive, reduce, finish: the segment is complete; send it
 *   n - 1 < k < 2n - 2  receive a finished segment, keep it, send it on
 *   k = 2n - 2     receive a finished segment, keep it
 * allreduce runs all of it; reduce_scatter steps 0 to n - 1 (its step n - 1
 * sends nothing); allgather steps n - 1 to 2n - 2, where step n - 1 sends
 * its own block. Segments are split into chunks of one slot, and the
 * schedule runs chunk by chunk, so chunks pipeline around the ring.
 * Reduce-scatter traffic carries the accumulator type (float32 for 16-bit
 * floats), allgather traffic the dtype. */

static int64_t seg_lo(const ct_work *w, int n, int seg) {
    switch (w->desc.op) {
    case CT__ALLREDUCE: return w->desc.count * seg / n;
    default: return w->desc.count * seg; /* blocks of count elements */
    }
}

/* Chunk j of segment seg as [lo, lo + len) in elements, clipped. */
static int64_t chunk_range(const ct_work *w, int n, int seg, int64_t j, int64_t chunk,
                           int64_t *lo) {
    int64_t a = seg_lo(w, n, seg), b = seg_lo(w, n, seg + 1);
    int64_t start = a + j * chunk, end = start + chunk < b ? start + chunk : b;
    *lo = start;
    return end > start ? end - start : 0;
}

static void ring_start(shm *s, ct_work *w, shm_work *st) {
    ct_dtype dt = (ct_dtype)w->desc.dtype;
    int n = s->n;
    st->chunk = RING_SLOT / (int64_t)ct__coll_acc_size(dt);
    int64_t seg_max = w->desc.op == CT__ALLREDUCE ? (w->desc.count + n - 1) / n : w->desc.count;
    int64_t nchunks = (seg_max + st->chunk - 1) / st->chunk;
    if (nchunks < 1)
        nchunks = 1;
    switch (w->desc.op) {
    case CT__ALLREDUCE:
        st->k0 = 0;
        st->per_task = 2 * n - 1;
        break;
    case CT__REDUCE_SCATTER:
        st->k0 = 0;
        st->per_task = n;
        break;
    default: /* allgather */
        st->k0 = n - 1;
        st->per_task = n;
        break;
    }
    st->ntasks = nchunks * st->per_task;
}

/* The slots one ring or chain task needs: the next from the left (recv)
 * and a free one to the right (send). 1 when the task can run, CT__PENDING
 * (0) when a slot is not there yet, a CT_E* code when the slot from the left
 * belongs to a different operation. */
static int task_slots(shm *s, ct_work *w, bool recv, bool send, const void **in_slot,
                      void **out_slot) {
    const slot_meta *meta = NULL;
    *in_slot = NULL;
    *out_slot = NULL;
    if (recv && !(*in_slot = chan_slot_to_read(&s->ring_in, &meta)))
        return CT__PENDING;
    if (send && !(*out_slot = chan_slot_to_write(&s->ring_out)))
        return CT__PENDING;
    if (recv && !ct__coll_desc_match(&meta->desc, &w->desc))
        return mismatch(w, (s->rank + s->n - 1) % s->n, &meta->desc);
    return 1;
}

/* Hands the task's slots on: frees the one read, publishes the one written
 * (sent bytes of it). */
static void task_done(shm *s, ct_work *w, bool recv, bool send, int64_t sent) {
    if (recv)
        chan_release(&s->ring_in);
    if (send)
        chan_publish(&s->ring_out, &w->desc, sent);
}

/* Runs ring tasks until one must wait. */
static int ring_progress(shm *s, ct_work *w) {
    shm_work *st = state(w);
    ct_dtype dt = (ct_dtype)w->desc.dtype;
    ct_reduce_op op = (ct_reduce_op)w->desc.rop;
    int n = s->n, r = s->rank;
    int64_t e = (int64_t)ct__esize(dt), ae = (int64_t)ct__coll_acc_size(dt);
    bool reducing = w->desc.op != CT__ALLGATHER;
    for (; st->task < st->ntasks; st->task++) {
        int64_t j = st->task / st->per_task, k = st->k0 + st->task % st->per_task;
        int seg = (int)(((r - 1 - k) % n + 2 * n) % n);
        int64_t lo, len = chunk_range(w, n, seg, j, st->chunk, &lo);
        bool recv = k != 0 && !(w->desc.op == CT__ALLGATHER && k == n - 1);
        bool send = k < 2 * n - 2 && !(w->desc.op == CT__REDUCE_SCATTER && k == n - 1);
        const void *in_slot;
        void *out_slot;
        int rc = task_slots(s, w, recv, send, &in_slot, &out_slot);
        if (rc <= 0)
            return rc;
        /* Where this rank's input and output for the segment live. */
        const char *in = (const char *)w->in + lo * e;
        char *out = w->desc.op == CT__REDUCE_SCATTER ? (char *)w->out + (lo - seg_lo(w, n, r)) * e
                                                     : (char *)w->out + lo * e;
        if (w->desc.op == CT__ALLGATHER)
            in = (const char *)w->in + (lo - seg_lo(w, n, r)) * e;
        int64_t sent = len * (k < n - 1 && reducing ? ae : e);
        if (k == 0) {
            ct__coll_acc_load(out_slot, in, len, dt);
        } else if (k < n - 1) {
            ct__coll_acc_combine(out_slot, in_slot, in, len, dt, op);
        } else if (k == n - 1 && reducing) {
            ct__coll_acc_finish(out, in_slot, in, len, dt, op, n);
            if (send)
                memcpy(out_slot, out, (size_t)(len * e));
        } else if (k == n - 1) {
            if (out != in)
                memcpy(out, in, (size_t)(len * e));
            memcpy(out_slot, in, (size_t)(len * e));
        } else {
            memcpy(out, in_slot, (size_t)(len * e));
            if (send)
                memcpy(out_slot, in_slot, (size_t)(len * e));
        }
        task_done(s, w, recv, send, sent);
    }
    return CT__DONE;
}

/* Broadcast and reduce run along a chain on the ring channels: broadcast
 * from the root to root - 1, reduce from root + 1 to the root. One task per
 * chunk on every rank. */
static int chain_progress(shm *s, ct_work *w) {
    shm_work *st = state(w);
    ct_dtype dt = (ct_dtype)w->desc.dtype;
    int n = s->n, r = s->rank, root = w->desc.root;
    bool bcast = w->desc.op == CT__BROADCAST;
    int pos = bcast ? (r - root + n) % n : (r - root - 1 + 2 * n) % n;
    int64_t e = (int64_t)ct__esize(dt), ae = bcast ? e : (int64_t)ct__coll_acc_size(dt);
    for (; st->task < st->ntasks; st->task++) {
        int64_t lo = st->task * st->chunk;
        int64_t len = w->desc.count - lo < st->chunk ? w->desc.count - lo : st->chunk;
        if (len < 0)
            len = 0;
        bool recv = pos > 0, send = pos < n - 1;
        const void *in_slot;
        void *out_slot;
        int rc = task_slots(s, w, recv, send, &in_slot, &out_slot);
        if (rc <= 0)
            return rc;
        const char *in = (const char *)w->in + lo * e;
        char *out = (char *)w->out + lo * e;
        if (bcast) {
            const void *src = recv ? in_slot : in;
            if (recv)
                memcpy(out, src, (size_t)(len * e));
            if (send)
                memcpy(out_slot, src, (size_t)(len * e));
        } else if (!recv) {
            ct__coll_acc_load(out_slot, in, len, dt);
        } else if (send) {
            ct__coll_acc_combine(out_slot, in_slot, in, len, dt, (ct_reduce_op)w->desc.rop);
        } else {
            ct__coll_acc_finish(out, in_slot, in, len, dt, (ct_reduce_op)w->desc.rop, n);
        }
        task_done(s, w, recv, send, len * ae);
    }
    return CT__DONE;
}

/* ------------------------------------------------------------ outboxes */

/* Slot i of kind's half of an outbox. */
static int out_slot(int kind, int i) { return kind * (OUT_SLOTS / 2) + i; }

/* Moves as much of a message as the outboxes allow: from buf into this
 * rank's outbox for peer (sending) or out of peer's outbox into buf
 * (receiving), bytes in all, *done so far. Chunks of a message travel in
 * order (one slot per chunk, the offset on each), so a receiver takes the
 * chunk at *done and leaves the others. A message takes at least one slot,
 * so that an empty one still pairs its two ends. */
static int out_move(shm *s, ct_work *w, int kind, bool sending, char *buf, int64_t bytes,
                    int64_t *done, int peer) {
    while (*done < bytes || (bytes == 0 && *done == 0)) {
        int64_t len = bytes - *done < OUT_SLOT ? bytes - *done : OUT_SLOT;
        int i, owner = sending ? s->rank : peer;
        out_meta *m = NULL;
        for (i = 0; i < OUT_SLOTS / 2; i++) {
            m = out_meta_of(s, owner, out_slot(kind, i));
            int to = atomic_load_explicit(&m->for_rank, memory_order_acquire);
            if (sending ? to == 0
                        : to == s->rank + 1 && m->desc.seq == w->desc.seq && m->offset == *done)
                break;
        }
        if (i == OUT_SLOTS / 2)
            return CT__PENDING;
        char *data = out_data_of(s, owner, out_slot(kind, i));
        if (sending) {
            memcpy(data, buf + *done, (size_t)len);
            m->desc = w->desc;
            m->offset = *done;
            m->bytes = len;
            atomic_store_explicit(&m->for_rank, peer + 1, memory_order_release);
        } else {
            bool ok = kind == OUT_P2P ? message_match(&m->desc, &w->desc) && m->bytes == len
                                      : ct__coll_desc_match(&m->desc, &w->desc);
            if (!ok)
                return mismatch(w, peer, &m->desc);
            memcpy(buf + *done, data, (size_t)len);
            atomic_store_explicit(&m->for_rank, 0, memory_order_release);
        }
        *done += len;
        if (bytes == 0)
            *done = 1; /* the empty message moved */
    }
    return CT__DONE;
}

static int alltoall_progress(shm *s, ct_work *w) {
    int64_t block = w->desc.count / s->n * (int64_t)esize(w);
    bool done = true;
    for (int q = 0; q < s->n; q++) {
        if (q == s->rank)
            continue;
        int rc =
            out_move(s, w, OUT_COLL, true, (char *)w->in + q * block, block, &s->a2a_sent[q], q);
        if (rc < 0)
            return rc;
        done &= rc == CT__DONE;
        rc = out_move(s, w, OUT_COLL, false, (char *)w->out + q * block, block, &s->a2a_got[q], q);
        if (rc < 0)
            return rc;
        done &= rc == CT__DONE;
    }
    return done ? CT__DONE : CT__PENDING;
}

/* ------------------------------------------------------------ vtable */

/* The failure another rank published, if any: its code, with msg set. */
static int group_failed(shm *s, char *msg) {
    int code = atomic_load_explicit(&s->hdr->abort_code, memory_order_acquire);
    if (code)
        snprintf(msg, CT__MSG_LEN, "rank %d failed the group: %.900s", s->hdr->abort_rank,
                 s->hdr->abort_msg);
    return code;
}

static int shm_start(ct_comm *c, ct_work *w) {
    shm *s = c->impl;
    shm_work *st = state(w);
    /* A rank that arrives after the group failed must not read what the
     * others left behind. */
    int code = group_failed(s, w->msg);
    if (code)
        return code;
    memset(st, 0, sizeof *st);
    if (ct__op_is_p2p(w->desc.op)) {
        bool *busy =
            w->desc.op == CT__SEND ? &s->p2p_busy_out[w->desc.root] : &s->p2p_busy_in[w->desc.root];
        if (*busy)
            return CT__AGAIN; /* an earlier message to/from this peer is still moving */
        *busy = true;
        return CT__PENDING;
    }
    if (s->active.seq != 0)
        return CT__AGAIN; /* collectives run one at a time, in issue order */
    int64_t e = (int64_t)esize(w);
    bool small = post_bytes(w, s->n) <= BULLETIN_BYTES;
    /* An allreduce of, or a reduce-scatter from, memory every rank maps
     * (ct_comm_zeros) reads the peers' data where it lies. */
    if (s->n > 1 && !small && (w->desc.op == CT__ALLREDUCE || w->desc.op == CT__REDUCE))
        st->blk = find_block(s, w->out, w->desc.count * e, &st->offset);
    if (s->n > 1 && !small && w->desc.op == CT__REDUCE_SCATTER)
        st->blk = find_block(s, w->in, w->desc.count * s->n * e, &st->offset);
    if (s->n > 1 && !small && w->desc.op == CT__ALLGATHER)
        st->blk = find_block(s, w->out, w->desc.count * s->n * e, &st->offset);
    announce(s, w, small && s->n > 1, st->blk, st->offset);
    if (s->n == 1) {
        st->path = PATH_LOCAL;
    } else if (small) {
        st->path = PATH_BULLETIN;
    } else if (st->blk) {
        st->path = PATH_DECIDE;
    } else if (w->desc.op == CT__BROADCAST || w->desc.op == CT__REDUCE) {
        st->path = PATH_CHAIN;
        st->chunk =
            RING_SLOT /
            (w->desc.op == CT__REDUCE ? (int64_t)ct__coll_acc_size((ct_dtype)w->desc.dtype) : e);
        st->ntasks = (w->desc.count + st->chunk - 1) / st->chunk;
    } else if (w->desc.op == CT__ALLTOALL) {
        st->path = PATH_OUTBOX;
        memset(s->a2a_sent, 0, (size_t)s->n * sizeof *s->a2a_sent);
        memset(s->a2a_got, 0, (size_t)s->n * sizeof *s->a2a_got);
        int64_t part = w->desc.count / s->n * e;
        memcpy((char *)w->out + s->rank * part, (char *)w->in + s->rank * part, (size_t)part);
    } else {
        st->path = PATH_RING;
        ring_start(s, w, st);
    }
    return CT__PENDING;
}

/* A collective of several ranks: its data moves on its path while the
 * announcements are checked, and it completes only once both are done, on
 * every path alike. Slot stamps keep the channel paths from using a
 * disagreeing peer's data before the announcements say so; the bulletins
 * and the direct path read peers' data only once they agree. */
static int collective_progress(shm *s, ct_work *w) {
    shm_work *st = state(w);
    int agreed = agree(s, w);
    if (agreed < 0)
        return agreed;
    if (!st->moved) {
        bool reads_posts = st->path == PATH_BULLETIN || st->path == PATH_DECIDE;
        if (reads_posts && agreed != CT__DONE)
            return CT__PENDING;
        if (st->path == PATH_DECIDE) {
            st->path = decide_direct(s, w) ? PATH_DIRECT : PATH_RING;
            if (st->path == PATH_RING)
                ring_start(s, w, st);
        }
        int rc;
        switch (st->path) {
        case PATH_BULLETIN: rc = bulletin_progress(s, w); break;
        case PATH_DIRECT: rc = direct_progress(s, w); break;
        case PATH_RING: rc = ring_progress(s, w); break;
        case PATH_CHAIN: rc = chain_progress(s, w); break;
        default: rc = alltoall_progress(s, w); break;
        }
        if (rc != CT__DONE)
            return rc;
        st->moved = true;
    }
    return agreed;
}

/* A single rank: every collective is a copy, or nothing. */
static void local_run(ct_work *w) {
    int64_t bytes = w->desc.count * (int64_t)esize(w);
    if (w->desc.op == CT__ALLREDUCE || w->desc.op == CT__REDUCE) {
        /* avg over one rank is the value itself; only integer rounding
         * could differ, and division by one has none. */
        return;
    }
    if (w->in && w->out != w->in && w->desc.op != CT__BROADCAST)
        memcpy(w->out, w->in, (size_t)bytes);
}

static int shm_progress(ct_comm *c, ct_work *w) {
    shm *s = c->impl;
    shm_work *st = state(w);
    int rc;
    if (ct__op_is_p2p(w->desc.op)) {
        bool sending = w->desc.op == CT__SEND;
        int peer = w->desc.root;
        rc = out_move(s, w, OUT_P2P, sending, sending ? w->in : w->out,
                      w->desc.count * (int64_t)esize(w), &st->done, peer);
        if (rc != CT__PENDING)
            (sending ? s->p2p_busy_out : s->p2p_busy_in)[peer] = false;
        return rc;
    }
    rc = st->path == PATH_LOCAL ? (local_run(w), CT__DONE) : collective_progress(s, w);
    if (rc == CT__DONE && st->path == PATH_DIRECT)
        atomic_fetch_add_explicit(&c->direct, 1, memory_order_relaxed);
    if (rc != CT__PENDING)
        s->active.seq = 0;
    return rc;
}

/* Any device's tensors: comm.c stages those off the host through host
 * memory. */
static int shm_check_tensor(ct_comm *c, const char *op, const ct_tensor *t) {
    (void)c;
    (void)op;
    (void)t;
    return 0;
}

static bool pid_alive(int pidfd, int pid) {
    if (pidfd >= 0) {
        struct pollfd p = {.fd = pidfd, .events = POLLIN};
        return poll(&p, 1, 0) == 0;
    }
    return kill(pid, 0) == 0 || errno == EPERM;
}

static int shm_poll(ct_comm *c, char *msg) {
    shm *s = c->impl;
    int code = group_failed(s, msg);
    if (code)
        return code;
    for (int r = 0; r < s->n; r++) {
        if (r == s->rank)
            continue;
        int pid = atomic_load(&ctl_of(s, r)->pid);
        if (!pid_alive(s->pidfds[r], pid)) {
            char desc[256] = "no operation";
            if (s->active.seq)
                ct__coll_desc_str(desc, sizeof desc, &s->active);
            snprintf(msg, CT__MSG_LEN, "%s: rank %d (pid %d) died", desc, r, pid);
            return CT_EPEER;
        }
    }
    return 0;
}

static void shm_describe_timeout(ct_comm *c, const ct_work *w, char *msg) {
    shm *s = c->impl;
    if (ct__op_is_p2p(w->desc.op)) {
        ct__coll_msg_append(msg, CT__MSG_LEN, "; rank %d did not %s it", w->desc.root,
                            w->desc.op == CT__SEND ? "receive" : "send");
        return;
    }
    ct__coll_msg_append(msg, CT__MSG_LEN, "; ranks that did not arrive:");
    int missing = 0;
    for (int r = 0; r < s->n; r++) {
        /* A rank arrived if it announced this operation or a later one. */
        uint64_t s0 = atomic_load(&bulletin_of(s, r, 0)->seq),
                 s1 = atomic_load(&bulletin_of(s, r, 1)->seq);
        if (r == s->rank || s0 >= w->desc.seq || s1 >= w->desc.seq)
            continue;
        ct__coll_msg_append(msg, CT__MSG_LEN, "%s %d", missing ? "," : "", r);
        missing++;
    }
    if (!missing)
        ct__coll_msg_append(msg, CT__MSG_LEN, " none (every rank is in it; it did not finish)");
}

static void shm_abort(ct_comm *c, int code, const char *msg) {
    shm *s = c->impl;
    int expected = 0;
    /* Only the first failure is published: the ranks that see it fail with
     * it, and their own abort finds the claim taken. */
    if (atomic_compare_exchange_strong(&s->hdr->abort_claim, &expected, 1)) {
        s->hdr->abort_rank = s->rank;
        snprintf(s->hdr->abort_msg, sizeof s->hdr->abort_msg, "%s", msg);
        atomic_store_explicit(&s->hdr->abort_code, code, memory_order_release);
    }
}

/* ------------------------------------------------------------ blocks */

static void registry_release(registry *reg) {
    if (atomic_fetch_sub_explicit(&reg->refs, 1, memory_order_acq_rel) == 1) {
        pthread_mutex_destroy(&reg->mu);
        free(reg);
    }
}

static void block_unmap(shm_block *b) {
    for (int r = 0; r < b->n; r++)
        if (b->base[r])
            munmap(b->base[r], b->bytes);
    free(b->base);
    free(b);
}

/* The storage's free function: by then no operation uses the block. */
static void block_release(void *data, void *ctx) {
    (void)data;
    shm_block *b = ctx;
    registry *reg = b->reg;
    pthread_mutex_lock(&reg->mu);
    for (shm_block **p = &reg->head; *p; p = &(*p)->next)
        if (*p == b) {
            *p = b->next;
            break;
        }
    pthread_mutex_unlock(&reg->mu);
    block_unmap(b);
    registry_release(reg);
}

static void block_name(char *buf, size_t n, const shm *s, uint64_t id, int r) {
    snprintf(buf, n, "%s.b%llu.%d", s->name, (unsigned long long)id, r);
}

static void block_unlink(const shm *s, const shm_block *b, int r) {
    char name[NAME_MAX_LEN + 64];
    block_name(name, sizeof name, s, b->id, r);
    shm_unlink(name);
}

/* errno after a failed step (what) on shared memory name, as op's error. */
static int shm_errno(const char *op, const char *what, const char *name) {
    int e = errno;
    return ct__err_set(e == ENOMEM || e == ENOSPC ? CT_ENOMEM : CT_EIO,
                       "%s: %s of shared memory %s: %s%s", op, what, name, strerror(e),
                       e == ENOSPC ? " (/dev/shm is full: give it more room, such as docker run "
                                     "--shm-size=1g, or free some)"
                                   : "");
}

/* Sizes a new segment and reserves its memory at once: a tmpfs without the
 * room fails here, where pages mapped past its room would raise SIGBUS
 * when first touched. */
static int size_segment(int fd, size_t bytes, const char *op, const char *name) {
    if (ftruncate(fd, (off_t)bytes) != 0)
        return shm_errno(op, "sizing", name);
    int e = posix_fallocate(fd, 0, (off_t)bytes);
    if (e) {
        errno = e;
        return shm_errno(op, "reservation", name);
    }
    return 0;
}

/* Maps rank r's segment of b (creating it, zero-filled, when r is this
 * rank). */
static int block_map(shm *s, shm_block *b, int r) {
    char name[NAME_MAX_LEN + 64];
    block_name(name, sizeof name, s, b->id, r);
    bool own = r == s->rank;
    int fd = own ? shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600) : shm_open(name, O_RDWR, 0);
    if (fd < 0)
        return shm_errno("comm_zeros", own ? "creation" : "opening", name);
    int rc = 0;
    struct stat sb;
    if (own)
        rc = size_segment(fd, b->bytes, "comm_zeros", name);
    else if (!own && (fstat(fd, &sb) != 0 || (size_t)sb.st_size != b->bytes))
        rc = ct__err_set(CT_EIO, "comm_zeros: shared memory %s has %lld bytes, not %zu", name,
                         (long long)sb.st_size, b->bytes);
    if (rc == 0) {
        void *p = mmap(NULL, b->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (p == MAP_FAILED)
            rc = shm_errno("comm_zeros", "mapping", name);
        else
            b->base[r] = p;
    }
    close(fd);
    if (rc && own)
        block_unlink(s, b, r);
    return rc;
}

/* Every rank makes its segment; once all have, every rank maps the others';
 * once all have, the names go. When some rank cannot (a /dev/shm without
 * the room, as in containers by default), every rank lets go of what it
 * made, and the one that failed says why on stderr, once. */
static int shm_alloc_shared(ct_comm *c, size_t bytes, ct_storage **out) {
    shm *s = c->impl;
    *out = NULL;
    shm_block *b = calloc(1, sizeof *b);
    char **base = calloc((size_t)s->n, sizeof *base);
    int rc = 0;
    if (b && base) {
        *b = (shm_block){.reg = s->blocks, .id = ++s->nblocks, .n = s->n, .base = base};
        b->bytes = round_up(bytes, (size_t)sysconf(_SC_PAGESIZE));
        rc = block_map(s, b, s->rank);
    } else {
        free(base);
        free(b);
        b = NULL;
        rc = ct__err_set(CT_ENOMEM, "comm_zeros: out of memory");
    }
    int failed = -1;
    int crc = ct__comm_agree(c, rc == 0, &failed);
    for (int r = 0; r < s->n && !crc && failed < 0 && rc == 0; r++)
        if (r != s->rank)
            rc = block_map(s, b, r);
    if (!crc && failed < 0) {
        if (rc == 0 && !(*out = ct_storage_from_blob(b->base[s->rank], bytes,
                                                     (ct_device){CT_CPU, 0}, block_release, b)))
            rc = ct_errcode();
        if (*out) /* the storage owns the block, and a reference to the registry */
            atomic_fetch_add_explicit(&s->blocks->refs, 1, memory_order_relaxed);
        /* Memory of this rank's as much as a private buffer: counted so, in
         * ct_memory_peak and against CT_MEMORY_LIMIT. */
        if (rc == 0 && *out && ct__tensor_storage_count(*out, "comm_zeros"))
            rc = ct_errcode();
        crc = ct__comm_agree(c, rc == 0, &failed);
    }
    if (b && b->base[s->rank]) /* every rank that could map it has */
        block_unlink(s, b, s->rank);
    if (rc)
        fprintf(stderr,
                "ct: %s; the tensor lives in private memory on every rank, and "
                "collectives on it take the slower path\n",
                ct_errmsg());
    if (crc || failed >= 0) {
        if (*out)
            ct_storage_free(*out);
        else if (b)
            block_unmap(b);
        *out = NULL;
        return crc;
    }
    pthread_mutex_lock(&s->blocks->mu);
    b->next = s->blocks->head;
    s->blocks->head = b;
    pthread_mutex_unlock(&s->blocks->mu);
    return 0;
}

/* ------------------------------------------------------------ setup */

static void shm_free(shm *s) {
    if (!s)
        return;
    if (s->blocks)
        registry_release(s->blocks);
    if (s->pidfds)
        for (int r = 0; r < s->n; r++)
            if (s->pidfds[r] >= 0)
                close(s->pidfds[r]);
    if (s->base)
        munmap(s->base, s->l.bytes);
    free(s->p2p_busy_out);
    free(s->p2p_busy_in);
    free(s->a2a_sent);
    free(s->a2a_got);
    free(s->acc);
    free(s->pidfds);
    free(s);
}

static void shm_destroy(ct_comm *c) {
    shm_free(c->impl);
    c->impl = NULL;
}

/* The name must go once every rank has attached, even if rank 0 dies
 * before that (a SIGTERM has no handler in most programs, and SIGKILL
 * never has one). A child process holds the other end of a pipe: when
 * rank 0 says every rank attached (it unlinked the name itself), the child
 * just exits; when the pipe closes without that, rank 0 failed or died, and
 * the child unlinks the name. It ignores the signals a launcher sends the
 * job, and calls only async-signal-safe functions. Returns the pipe's
 * write end, or -1 (then nothing guards the name: the caller goes on). */
static int start_guard(const char *name, pid_t *guard) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        struct sigaction ign = {.sa_handler = SIG_IGN};
        sigaction(SIGTERM, &ign, NULL);
        sigaction(SIGINT, &ign, NULL);
        sigaction(SIGHUP, &ign, NULL);
        close(p[1]);
        char byte;
        ssize_t got;
        while ((got = read(p[0], &byte, 1)) < 0 && errno == EINTR)
            ;
        if (got != 1)
            shm_unlink(name);
        _exit(0);
    }
    close(p[0]);
    if (pid < 0) {
        close(p[1]);
        return -1;
    }
    *guard = pid;
    return p[1];
}

/* ok: every rank attached and the name is gone; the guard just exits. */
static void stop_guard(int fd, pid_t guard, bool ok) {
    if (fd < 0)
        return;
    if (ok)
        (void)!write(fd, "", 1);
    close(fd);
    while (waitpid(guard, NULL, 0) < 0 && errno == EINTR)
        ;
}

/* Rank 0 creates and sizes the segment, then marks it ready. */
static int create_segment(shm *s) {
    int fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            return ct__err_set(CT_EINVAL,
                               "comm_new: shared memory %s already exists (another communicator "
                               "uses the name, or a crashed job left it in /dev/shm)",
                               s->name);
        return shm_errno("comm_new", "creation", s->name);
    }
    s->guard_fd = start_guard(s->name, &s->guard);
    int rc = size_segment(fd, s->l.bytes, "comm_new", s->name);
    if (rc == 0) {
        s->base = mmap(NULL, s->l.bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (s->base == MAP_FAILED) {
            s->base = NULL;
            rc = shm_errno("comm_new", "mapping", s->name);
        }
    }
    close(fd);
    if (rc) {
        shm_unlink(s->name);
        return rc;
    }
    s->hdr = (header *)s->base;
    s->hdr->version = SHM_VERSION;
    s->hdr->size = s->n;
    s->hdr->bytes = s->l.bytes;
    /* The release store orders the header's fields before the magic. */
    __atomic_store_n(&s->hdr->magic, SHM_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

/* Whether the segment behind fd is one this rank may trust: owned by this
 * user, reachable by nobody else, of the size this layout has (or still
 * empty, before rank 0 sizes it). 0, 1 while empty, or CT_EINVAL
 * recorded. */
static int check_segment(shm *s, int fd, struct stat *sb) {
    if (fstat(fd, sb) != 0)
        return shm_errno("comm_new", "fstat", s->name);
    if (sb->st_uid != geteuid())
        return ct__err_set(CT_EINVAL,
                           "comm_new: shared memory %s belongs to uid %u, not this process's %u: "
                           "refusing a segment another user made",
                           s->name, (unsigned)sb->st_uid, (unsigned)geteuid());
    if (sb->st_mode & 077)
        return ct__err_set(CT_EINVAL,
                           "comm_new: shared memory %s has mode %03o: refusing a segment other "
                           "users can reach (ct makes them 0600)",
                           s->name, (unsigned)(sb->st_mode & 0777));
    if (sb->st_size == 0)
        return 1;
    if ((size_t)sb->st_size != s->l.bytes)
        return ct__err_set(CT_EINVAL,
                           "comm_new: shared memory %s has %lld bytes; %d ranks lay out %zu: "
                           "refusing a segment of another layout or world size",
                           s->name, (long long)sb->st_size, s->n, s->l.bytes);
    return 0;
}

/* The other ranks wait for rank 0's segment, then map it. */
static int attach_segment(shm *s, double deadline, double timeout) {
    for (;;) {
        int fd = shm_open(s->name, O_RDWR | O_NOFOLLOW, 0);
        struct stat sb;
        int checked = fd >= 0 ? check_segment(s, fd, &sb) : 1;
        if (checked < 0) {
            close(fd);
            return checked;
        }
        if (fd >= 0 && checked == 0) {
            void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            close(fd);
            if (p == MAP_FAILED)
                return shm_errno("comm_new", "mapping", s->name);
            header *h = p;
            if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == SHM_MAGIC) {
                if (h->version != SHM_VERSION || h->size != s->n || h->bytes != s->l.bytes) {
                    int size = h->size, version = (int)h->version;
                    munmap(p, (size_t)sb.st_size);
                    return ct__err_set(CT_EINVAL,
                                       "comm_new: shared memory %s was made for %d ranks (format "
                                       "%d); this rank (%d) expects %d ranks (format %d)",
                                       s->name, size, version, s->rank, s->n, SHM_VERSION);
                }
                s->base = p;
                s->hdr = h;
                return 0;
            }
            munmap(p, (size_t)sb.st_size);
        } else if (fd >= 0) {
            close(fd);
        } else if (errno != ENOENT) {
            return shm_errno("comm_new", "opening", s->name);
        }
        if (ct__now() > deadline)
            return ct__err_set(CT_ETIMEDOUT,
                               "comm_new: rank 0 did not create shared memory %s within %g s "
                               "(rank %d of %d waited)",
                               s->name, timeout, s->rank, s->n);
        usleep(1000);
    }
}

/* Waits for every rank to attach; rank 0 then unlinks the name. */
static int await_ranks(shm *s, double deadline, double timeout) {
    while (atomic_load_explicit(&s->hdr->attached, memory_order_acquire) < s->n) {
        if (ct__now() > deadline) {
            char missing[512] = "";
            size_t len = 0;
            for (int r = 0; r < s->n && len < sizeof missing - 16; r++)
                if (!atomic_load(&ctl_of(s, r)->pid))
                    len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d",
                                            len ? ", " : "", r);
            return ct__err_set(CT_ETIMEDOUT,
                               "comm_new: ranks %s did not join shared memory %s within %g s",
                               missing, s->name, timeout);
        }
        usleep(200);
    }
    return 0;
}

/* A pidfd turns readable when its process exits, zombie or not; kill(pid,
 * 0) is the fallback where pidfds are missing. */
static void open_pidfds(shm *s) {
    for (int r = 0; r < s->n; r++)
        if (r != s->rank)
            s->pidfds[r] = (int)syscall(SYS_pidfd_open, atomic_load(&ctl_of(s, r)->pid), 0);
}

static void build_channels(shm *s) {
    int n = s->n;
    s->ring_out = make_chan(s, s->l.ring_ctl, s->l.ring_meta, s->l.ring_data, (size_t)s->rank,
                            RING_SLOT, RING_SLOTS);
    s->ring_in = make_chan(s, s->l.ring_ctl, s->l.ring_meta, s->l.ring_data,
                           (size_t)((s->rank + n - 1) % n), RING_SLOT, RING_SLOTS);
}

static int shm_init_named(ct_comm *c, const char *name) {
    int n = c->size;
    if (!name || name[0] != '/' || strlen(name) > NAME_MAX_LEN || strchr(name + 1, '/'))
        return ct__err_set(CT_EINVAL,
                           "comm_new: shm_name '%s' must be '/' and up to %d more bytes without "
                           "another '/'",
                           name ? name : "(null)", NAME_MAX_LEN);
    size_t bytes;
    if (ct__shm_layout_bytes(n, &bytes))
        return CT_EINVAL;
    shm *s = calloc(1, sizeof *s);
    if (!s)
        return ct__err_set(CT_ENOMEM, "comm_new: out of memory");
    snprintf(s->name, sizeof s->name, "%s", name);
    s->n = n;
    s->rank = c->rank;
    s->l = make_layout(n);
    s->p2p_busy_out = calloc((size_t)n, sizeof(bool));
    s->p2p_busy_in = calloc((size_t)n, sizeof(bool));
    s->a2a_sent = calloc((size_t)n, sizeof(int64_t));
    s->a2a_got = calloc((size_t)n, sizeof(int64_t));
    s->pidfds = malloc((size_t)n * sizeof(int));
    s->acc = malloc(ACC_BYTES);
    s->blocks = calloc(1, sizeof *s->blocks);
    if (s->blocks) {
        pthread_mutex_init(&s->blocks->mu, NULL);
        atomic_init(&s->blocks->refs, 1);
    }
    if (!s->p2p_busy_out || !s->p2p_busy_in || !s->a2a_sent || !s->a2a_got || !s->pidfds ||
        !s->acc || !s->blocks) {
        shm_free(s);
        return ct__err_set(CT_ENOMEM, "comm_new: out of memory");
    }
    for (int r = 0; r < n; r++)
        s->pidfds[r] = -1;
    s->guard_fd = -1;
    double timeout = c->timeout, deadline = ct__now() + timeout;
    int rc = s->rank == 0 ? create_segment(s) : attach_segment(s, deadline, timeout);
    if (rc == 0) {
        s->ctl = (rank_ctl *)(s->base + s->l.ctl);
        atomic_store(&ctl_of(s, s->rank)->pid, (int)getpid());
        atomic_fetch_add_explicit(&s->hdr->attached, 1, memory_order_acq_rel);
        rc = await_ranks(s, deadline, timeout);
        if (s->rank == 0)
            shm_unlink(s->name);
    } else if (s->rank == 0 && s->base) {
        shm_unlink(s->name);
    }
    if (s->rank == 0)
        stop_guard(s->guard_fd, s->guard, rc == 0);
    if (rc == 0) {
        open_pidfds(s);
        build_channels(s);
    }
    if (rc) {
        shm_free(s);
        return rc;
    }
    c->impl = s;
    return 0;
}

static int shm_init(ct_comm *c, const ct_comm_config *cfg) {
    return shm_init_named(c, cfg->shm_name);
}

static ct_comm *shm_split(ct_comm *c, int color, uint64_t index, int new_rank, int new_size,
                          const int *new_to_old) {
    shm *s = c->impl;
    char name[NAME_MAX_LEN + 64];
    snprintf(name, sizeof name, "%.*s.%llu.%d", NAME_MAX_LEN - 40, s->name,
             (unsigned long long)index, color);
    ct_comm *child = ct__comm_alloc(&ct__shm_backend, new_rank, new_size, c->timeout);
    if (!child)
        return NULL;
    if (shm_init_named(child, name)) {
        ct__comm_discard(child);
        return NULL;
    }
    return ct__comm_activate(child);
}

const ct__backend ct__shm_backend = {
    .kind = CT_BACKEND_SHM,
    .init = shm_init,
    .destroy = shm_destroy,
    .check_tensor = shm_check_tensor,
    .start = shm_start,
    .progress = shm_progress,
    .poll = shm_poll,
    .describe_timeout = shm_describe_timeout,
    .abort = shm_abort,
    .split = shm_split,
    .alloc_shared = shm_alloc_shared,
};
