/* Remote references: values kept on their owner for the worker that holds
 * the handle. */
#include "rpc_impl.h"

#include "dist_impl.h"

#include <stdlib.h>

#define RREF_MAGIC 0x63745272u /* "ctRr" */

struct ct_rref {
    uint32_t magic;
    int owner;
    int64_t id;
};

/* On the owner: the values, and who holds the handle. */
typedef struct held {
    int64_t id;
    int holder;
    ct_rpc_args *values;
    struct held *next;
} held;

/* Values are held only for the job's workers, so that a holder's death
 * frees them, and at most CT_RPC_MAX_RREFS for each. */
static struct {
    pthread_mutex_t mu;
    held *head;
    size_t *count; /* per holder: [id], of ncount */
    int ncount;
} R = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Counts one more value for holder; under R.mu. */
static int count_new(int holder) {
    size_t limit;
    int rc = ct__dist_env_limit("CT_RPC_MAX_RREFS", 65536, &limit);
    if (rc)
        return rc;
    if (holder < 0)
        return ct__err_set(CT_EINVAL, "rref: only the job's workers may hold remote references; "
                                      "this caller is no worker");
    if (holder >= R.ncount) {
        int n = holder + 1;
        size_t *c = realloc(R.count, (size_t)n * sizeof *c);
        if (!c)
            return ct__err_set(CT_ENOMEM, "rref: out of memory");
        memset(c + R.ncount, 0, (size_t)(n - R.ncount) * sizeof *c);
        R.count = c;
        R.ncount = n;
    }
    if (R.count[holder] >= limit)
        return ct__err_set(CT_ENOMEM,
                           "rref: worker %d holds %zu remote references here, its limit "
                           "(CT_RPC_MAX_RREFS=%zu); free some (ct_rref_free)",
                           holder, R.count[holder], limit);
    R.count[holder]++;
    return 0;
}

/* Unlinks *p, a value no longer held; under R.mu. */
static held *unlink_held(held **p) {
    held *h = *p;
    *p = h->next;
    if (h->holder >= 0 && h->holder < R.ncount)
        R.count[h->holder]--;
    return h;
}

static held **find(int64_t id) {
    held **p = &R.head;
    while (*p && (*p)->id != id)
        p = &(*p)->next;
    return p;
}

static int unknown(int64_t id) {
    return ct__err_set(CT_EINVAL, "no value %lld is held here: it was freed, or its holder died",
                       (long long)(id & 0xffffffffffffll));
}

/* in: the function's name, then its arguments; answers the value's id. */
void ct__rref_on_new(const rpc_call *c, ct_rpc_args *in, rpc_reply *r) {
    ct_rpc_args *args = ct_rpc_args_new(), *out = ct_rpc_args_new(), *id = ct_rpc_args_new();
    held *h = calloc(1, sizeof *h);
    int rc = args && out && id && h ? 0 : ct__err_set(CT_ENOMEM, "rref: out of memory");
    const char *fn = rc ? NULL : ct_rpc_args_string(in, 0);
    if (!rc && !fn)
        rc = ct_errcode();
    if (!rc) {
        pthread_mutex_lock(&R.mu);
        rc = count_new(c->from);
        pthread_mutex_unlock(&R.mu);
    }
    bool counted = !rc;
    if (!rc && !(rc = ct__rpc_args_extend(args, in, 1)))
        rc = ct__rpc_run_fn(fn, args, out);
    if (!rc)
        rc = ct_rpc_args_add_int(id, (int64_t)c->id);
    pthread_mutex_lock(&R.mu);
    if (!rc) {
        *h = (held){(int64_t)c->id, c->from, out, R.head};
        R.head = h;
        out = NULL;
        h = NULL;
    } else if (counted) {
        R.count[c->from]--;
    }
    pthread_mutex_unlock(&R.mu);
    ct__rpc_reply(r, rc, id);
    free(h);
    ct_rpc_args_free(out);
    ct_rpc_args_free(args);
    ct_rpc_args_free(id);
    ct_rpc_args_free(in);
}

void ct__rref_on_fetch(const rpc_call *c, ct_rpc_args *in, rpc_reply *r) {
    (void)c;
    int64_t id = ct_rpc_args_int(in, 0);
    int rc = ct_errcode();
    pthread_mutex_lock(&R.mu);
    held *h = rc ? NULL : *find(id);
    if (!rc && !h)
        rc = unknown(id);
    /* The reply takes its own references before the lock goes. */
    ct__rpc_reply(r, rc, h ? h->values : NULL);
    pthread_mutex_unlock(&R.mu);
    ct_rpc_args_free(in);
}

/* in: the value's id, the function, then its further arguments. */
void ct__rref_on_call(const rpc_call *c, ct_rpc_args *in, rpc_reply *r) {
    (void)c;
    ct_rpc_args *args = ct_rpc_args_new(), *out = ct_rpc_args_new();
    int64_t id = ct_rpc_args_int(in, 0);
    const char *fn = ct_rpc_args_string(in, 1);
    int rc = args && out ? ct_errcode() : ct__err_set(CT_ENOMEM, "rref: out of memory");
    if (!rc) {
        pthread_mutex_lock(&R.mu);
        held *h = *find(id);
        rc = h ? ct__rpc_args_extend(args, h->values, 0) : unknown(id);
        pthread_mutex_unlock(&R.mu);
    }
    if (!rc && !(rc = ct__rpc_args_extend(args, in, 2)))
        rc = ct__rpc_run_fn(fn, args, out);
    ct__rpc_reply(r, rc, out);
    ct_rpc_args_free(args);
    ct_rpc_args_free(out);
    ct_rpc_args_free(in);
}

static void drop(held *h) {
    ct_rpc_args_free(h->values);
    free(h);
}

/* Only the holder frees a value. */
void ct__rref_on_del(const rpc_call *c, ct_rpc_args *in, rpc_reply *r) {
    int64_t id = ct_rpc_args_int(in, 0);
    int rc = ct_errcode();
    pthread_mutex_lock(&R.mu);
    held **p = rc ? NULL : find(id),
         *h = p && *p && (*p)->holder == c->from ? unlink_held(p) : NULL;
    pthread_mutex_unlock(&R.mu);
    if (h)
        drop(h);
    ct__rpc_reply(r, rc, NULL);
    ct_rpc_args_free(in);
}

/* Values held for a dead worker (holder >= 0), or all of them (-1). */
static void drop_held_by(int holder) {
    pthread_mutex_lock(&R.mu);
    held *gone = NULL;
    for (held **p = &R.head; *p;) {
        if (holder < 0 || (*p)->holder == holder) {
            held *h = unlink_held(p);
            h->next = gone;
            gone = h;
        } else {
            p = &(*p)->next;
        }
    }
    if (holder < 0) {
        free(R.count);
        R.count = NULL;
        R.ncount = 0;
    }
    pthread_mutex_unlock(&R.mu);
    while (gone) {
        held *next = gone->next;
        drop(gone);
        gone = next;
    }
}

void ct__rref_peer_died(int id) { drop_held_by(id); }
void ct__rref_shutdown(void) { drop_held_by(-1); }

/* ------------------------------------------------------------ the holder */

/* Calls the owner's internal function fn with (head..., args...). */
static int owner_call(int owner, const char *fn, const char *label, ct_rpc_args *head,
                      const ct_rpc_args *args, double timeout_s, ct_rpc_args **out) {
    int rc = head ? 0 : ct_errcode();
    if (!rc && args)
        rc = ct__rpc_args_extend(head, args, 0);
    ct_future *f = rc ? NULL : ct__rpc_call(owner, fn, label, head, timeout_s, 0);
    ct_rpc_args_free(head);
    if (!f)
        return ct_errcode();
    rc = ct_future_wait(f, out);
    ct_future_free(f);
    return rc;
}

static ct_rpc_args *head_int(int64_t v) {
    ct_rpc_args *a = ct_rpc_args_new();
    if (a && ct_rpc_args_add_int(a, v)) {
        ct_rpc_args_free(a);
        return NULL;
    }
    return a;
}

ct_rref *ct_rpc_remote(const char *to, const char *fn, const ct_rpc_args *args, double timeout_s) {
    int owner = ct_rpc_worker_id(to);
    if (owner < 0)
        return NULL;
    ct_rpc_args *head = ct_rpc_args_new(), *out = NULL;
    if (head && (!fn || ct_rpc_args_add_string(head, fn))) {
        ct_rpc_args_free(head);
        ct__err_set(CT_EINVAL, "ct_rpc_remote: fn is NULL");
        return NULL;
    }
    int rc = owner_call(owner, "ct.rref_new", fn, head, args, timeout_s, &out);
    ct_rref *r = rc ? NULL : malloc(sizeof *r);
    if (r)
        *r = (ct_rref){RREF_MAGIC, owner, ct_rpc_args_int(out, 0)};
    else if (!rc)
        ct__err_set(CT_ENOMEM, "ct_rpc_remote: out of memory");
    ct_rpc_args_free(out);
    return r;
}

static int check(const ct_rref *r, const char *fn) {
    if (!r || r->magic != RREF_MAGIC)
        return ct__err_set(CT_EINVAL, "%s: not a live ct_rref", fn);
    return ct_rpc_self() < 0 ? ct__err_set(CT_ESTATE, "%s: the RPC agent is not running", fn) : 0;
}

int ct_rref_owner(const ct_rref *r) { return check(r, "ct_rref_owner") ? -1 : r->owner; }

int ct_rref_fetch(ct_rref *r, double timeout_s, ct_rpc_args **out) {
    int rc = check(r, "ct_rref_fetch");
    return rc ? rc
              : owner_call(r->owner, "ct.rref_fetch", "ct_rref_fetch", head_int(r->id), NULL,
                           timeout_s, out);
}

int ct_rref_call(ct_rref *r, const char *fn, const ct_rpc_args *args, double timeout_s,
                 ct_rpc_args **out) {
    int rc = check(r, "ct_rref_call");
    if (!rc && !fn)
        rc = ct__err_set(CT_EINVAL, "ct_rref_call: fn is NULL");
    ct_rpc_args *head = rc ? NULL : head_int(r->id);
    if (head && ct_rpc_args_add_string(head, fn)) {
        ct_rpc_args_free(head);
        head = NULL;
    }
    return rc ? rc : owner_call(r->owner, "ct.rref_call", fn, head, args, timeout_s, out);
}

void ct_rref_free(ct_rref *r) {
    if (!r)
        return;
    CT_ASSERT(r->magic == RREF_MAGIC && "ct_rref_free: not a live ct_rref");
    ct_rpc_args *a = ct_rpc_self() >= 0 ? head_int(r->id) : NULL;
    if (a)
        ct_future_free(ct__rpc_call(r->owner, "ct.rref_del", "ct_rref_free", a, 0, 0));
    ct_rpc_args_free(a);
    r->magic = 0;
    free(r);
}
