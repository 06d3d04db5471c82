/* ctlaunch's elastic rendezvous: elastic.h has the protocol. Every wait
 * is a store call with a timeout, so a node never waits on a dead host
 * for longer than --join-timeout; a store call that fails ends this
 * node's part in the job with a message naming the store. */
#define _GNU_SOURCE

#include "elastic.h"

#include "base_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* How often the host looks at a round that is still open. */
#define POLL_OPEN_S 0.05
/* How often a running round is checked for its end, and how long one
 * check may wait on the store: the supervisor makes it, and a host that
 * vanished without closing its connections (a power cut) must not hold
 * it for the whole --join-timeout. */
#define POLL_RUNNING_S 0.5
#define POLL_CALL_S    5.0

/* "ct/el/<round>/<name>" into key. */
static const char *key_of(char key[96], int round, const char *name) {
    snprintf(key, 96, "ct/el/%d/%s", round, name);
    return key;
}

/* "ct/el/<round>/node/<i>", where node i of the round says who it is. */
static const char *node_key(char key[96], int round, int64_t i) {
    snprintf(key, 96, "ct/el/%d/node/%lld", round, (long long)i);
    return key;
}

static int store_failed(const char *what) {
    fprintf(stderr,
            "ctlaunch: the rounds of the nodes: %s: %s (the store's host, node 0, may be gone: a "
            "job of several nodes lives as long as its host)\n",
            what, ct_errmsg());
    return 1;
}

/* Connects to the store unless connected, waiting up to timeout_s for it:
 * whether there is a client. */
static bool connected(ctl_elastic *e, double timeout_s) {
    if (!e->store)
        e->store = ct_store_connect(e->addr, e->port, timeout_s);
    return e->store != NULL;
}

static int set_str(ctl_elastic *e, const char *key, const char *value) {
    return ct_store_set(e->store, key, value, strlen(value), -1);
}

/* The value at key, waiting up to timeout_s, into buf; 0 or a CT_E* code. */
static int get_str(ctl_elastic *e, const char *key, double timeout_s, char *buf, size_t cap) {
    void *v = NULL;
    size_t len = 0;
    int rc = ct_store_get(e->store, key, &v, &len, timeout_s);
    if (!rc)
        snprintf(buf, cap, "%.*s", (int)len, (const char *)v);
    free(v);
    return rc;
}

static bool exists(ctl_elastic *e, const char *key) {
    bool there = false;
    return !ct_store_check(e->store, &key, 1, &there, POLL_CALL_S) && there;
}

int ctl_elastic_start(ctl_elastic *e, const char *addr, int port) {
    if (gethostname(e->hostname, sizeof e->hostname - 32))
        snprintf(e->hostname, sizeof e->hostname, "?");
    size_t len = strlen(e->hostname);
    snprintf(e->hostname + len, sizeof e->hostname - len, ", ctlaunch pid %ld", (long)getpid());
    e->last_members = calloc((size_t)e->max_nodes, sizeof *e->last_members);
    if (!e->last_members) {
        perror("ctlaunch");
        return 1;
    }
    snprintf(e->addr, sizeof e->addr, "%s", addr);
    e->port = port;
    if (e->fixed && !e->host)
        return 0;
    if (!connected(e, e->join_timeout))
        return store_failed("cannot reach the store");
    char np[32];
    if (e->host) {
        snprintf(np, sizeof np, "%d", e->np);
        return set_str(e, "ct/el/np", np) ? store_failed("publishing -np") : 0;
    }
    if (get_str(e, "ct/el/np", -1, np, sizeof np))
        return store_failed("reading the host's -np");
    if (atoi(np) != e->np) {
        fprintf(stderr,
                "ctlaunch: this node runs -np %d ranks, and the job's host %s per node; every "
                "node of an elastic job runs the same number\n",
                e->np, np);
        return 1;
    }
    char current[32];
    if (get_str(e, "ct/el/current", -1, current, sizeof current))
        return store_failed("reading the current round");
    e->round = atoi(current);
    return 0;
}

/* How many nodes have joined round g so far, or -1. */
static int64_t joined(ctl_elastic *e, int g) {
    char key[96];
    int64_t n = -1;
    return ct_store_add(e->store, key_of(key, g, "joined"), 0, &n, POLL_CALL_S) ? -1 : n;
}

/* Orders the nodes admitted to the closed round, publishes the order as
 * "G/order" (one node per line) and prints it, with the nodes of the
 * host's last round that did not come back. A fixed job's nodes are in
 * the order of their node ranks; an elastic job's nodes of the last round
 * keep their order, so that node ranks move as little as they can, and
 * new ones follow in the order they joined. 0, or 1 after a message. */
static int host_order(ctl_elastic *e, const char *reason) {
    int k = e->nnodes;
    char key[96], (*arrived)[256] = calloc((size_t)k, sizeof *arrived),
                  (*order)[256] = calloc((size_t)k, sizeof *order);
    bool *placed = calloc((size_t)k, sizeof *placed);
    char *list = malloc((size_t)k * 257 + 1);
    int rc = 0;
    if (!arrived || !order || !placed || !list) {
        perror("ctlaunch");
        rc = 1;
    }
    for (int i = 0; !rc && i < k; i++) {
        if (get_str(e, node_key(key, e->round, i), -1, arrived[i], sizeof arrived[i]))
            rc = store_failed("reading who joined");
    }
    /* A fixed job's nodes joined under their node ranks. Else the last
     * round's nodes first, in their order (the host is its node 0, and is
     * in every round); then the new ones, as they came. */
    int n = 0;
    for (int a = 0; !rc && !e->fixed && a < e->nlast; a++)
        for (int i = 0; i < k; i++)
            if (!placed[i] && !strcmp(arrived[i], e->last_members[a])) {
                placed[i] = true;
                memcpy(order[n++], arrived[i], sizeof *order);
            }
    for (int i = 0; !rc && i < k; i++)
        if (!placed[i])
            memcpy(order[n++], arrived[i], sizeof *order);
    size_t len = 0;
    for (int i = 0; !rc && i < k; i++)
        len += (size_t)sprintf(list + len, "%s\n", order[i]);
    if (!rc && set_str(e, key_of(key, e->round, "order"), list))
        rc = store_failed("publishing the node ranks");
    if (!rc) {
        fprintf(stderr, "ctlaunch: round %d (%s): %d node%s, %d ranks:", e->round, reason, k,
                k > 1 ? "s" : "", k * e->np);
        for (int i = 0; i < k; i++)
            fprintf(stderr, "%s node %d (%s)", i ? "," : "", i, order[i]);
        for (int i = 0; i < e->nlast; i++) {
            bool back = false;
            for (int j = 0; j < k; j++)
                back |= !strcmp(e->last_members[i], order[j]);
            if (!back)
                fprintf(stderr, "; gone since round %d: node %d (%s)", e->round - 1, i,
                        e->last_members[i]);
        }
        fputc('\n', stderr);
        memcpy(e->last_members, order, sizeof *order * (size_t)k);
        e->nlast = k;
    }
    free(arrived);
    free(order);
    free(placed);
    free(list);
    return rc;
}

/* Opens e->round, waits for the nodes and closes it. */
static int host_join(ctl_elastic *e, const char *reason) {
    char key[96], buf[32];
    int g = e->round;
    int64_t n;
    if (ct_store_add(e->store, key_of(key, g, "joined"), 1, &n, -1) ||
        set_str(e, node_key(key, g, 0), e->hostname) || set_str(e, key_of(key, g, "open"), reason))
        return store_failed("opening a round");
    snprintf(buf, sizeof buf, "%d", g);
    if (set_str(e, "ct/el/current", buf))
        return store_failed("opening a round");
    double start = ct__now(), enough_at = 0;
    for (;;) {
        if ((n = joined(e, g)) < 0)
            return store_failed("counting the nodes");
        if (n >= e->max_nodes)
            break;
        if (n >= e->min_nodes && enough_at == 0)
            enough_at = ct__now();
        if (enough_at > 0 && ct__now() - enough_at >= e->last_call)
            break;
        if (enough_at == 0 && ct__now() - start >= e->join_timeout) {
            fprintf(stderr,
                    "ctlaunch: round %d: %lld of the --nnodes minimum %d nodes joined within "
                    "--join-timeout %g s; giving up\n",
                    g, (long long)n, e->min_nodes, e->join_timeout);
            return 1;
        }
        nanosleep(&(struct timespec){0, (long)(POLL_OPEN_S * 1e9)}, NULL);
    }
    e->nnodes = (int)(n < e->max_nodes ? n : e->max_nodes);
    e->node_rank = 0;
    snprintf(buf, sizeof buf, "%d", e->nnodes);
    if (set_str(e, key_of(key, g, "size"), buf))
        return store_failed("closing a round");
    return host_order(e, reason);
}

/* Waits up to --join-timeout for key, into buf: 0 or a CT_E* code. By
 * checks that the store answers at once, not by one long get: a host that
 * ended the job and went away would leave a long get waiting out the
 * whole timeout, where a check fails within POLL_CALL_S. */
static int wait_for(ctl_elastic *e, const char *key, char *buf, size_t cap) {
    double until = ct__now() + e->join_timeout;
    for (;;) {
        bool there = false;
        int rc = ct_store_check(e->store, &key, 1, &there, POLL_CALL_S);
        if (rc || there)
            return rc ? rc : get_str(e, key, POLL_CALL_S, buf, cap);
        if (ct__now() >= until)
            return ct_seterr(CT_ETIMEDOUT, "store: '%s' did not come within --join-timeout %g s",
                             key, e->join_timeout);
        nanosleep(&(struct timespec){0, (long)(POLL_OPEN_S * 1e9)}, NULL);
    }
}

/* The index of the line of list (lines ending in '\n') that is id, or -1. */
static int line_of(const char *list, const char *id) {
    size_t len = strlen(id);
    int i = 0;
    for (const char *end; (end = strchr(list, '\n')); list = end + 1, i++)
        if ((size_t)(end - list) == len && !memcmp(list, id, len))
            return i;
    return -1;
}

int ctl_elastic_join(ctl_elastic *e, const char *reason, int *code) {
    *code = 1; /* what a failed store call ends the job with */
    e->next_poll = 0;
    e->stop_why = STOP_NONE;
    if (e->fixed && e->round == 0) {
        e->node_rank = e->given_rank;
        e->nnodes = e->max_nodes;
        return 0;
    }
    if (e->host)
        return host_join(e, reason);
    if (!connected(e, e->join_timeout))
        return store_failed("cannot reach the store");
    for (;;) {
        char key[96], buf[64];
        int g = e->round;
        if (wait_for(e, key_of(key, g, "open"), buf, sizeof buf))
            return store_failed("waiting for the next round");
        if (!strncmp(buf, "end ", 4)) {
            *code = atoi(buf + 4);
            fprintf(stderr, "ctlaunch: the job's host ended the job (code %d)\n", *code);
            return 1;
        }
        int64_t n;
        if (ct_store_add(e->store, key_of(key, g, "joined"), 1, &n, -1))
            return store_failed("joining a round");
        node_key(key, g, e->fixed ? e->given_rank : n - 1);
        if (set_str(e, key, e->hostname) ||
            get_str(e, key_of(key, g, "size"), e->join_timeout + e->last_call, buf, sizeof buf))
            return store_failed("joining a round");
        int size = atoi(buf), place = -1;
        if (n - 1 < size) {
            void *order = NULL;
            size_t len = 0;
            if (ct_store_get(e->store, key_of(key, g, "order"), &order, &len, -1))
                return store_failed("reading the node ranks");
            place = line_of(order, e->hostname);
            free(order);
        }
        if (place >= 0) {
            e->node_rank = place;
            e->nnodes = size;
            fprintf(stderr, "ctlaunch: round %d: this is node %d of %d (ranks %d to %d)\n", g,
                    e->node_rank, size, e->node_rank * e->np, (e->node_rank + 1) * e->np - 1);
            return 0;
        }
        fprintf(stderr,
                "ctlaunch: round %d closed with %d nodes before this one joined; "
                "waiting for the next round\n",
                g, size);
        e->round++;
    }
}

bool ctl_elastic_should_stop(ctl_elastic *e) {
    if (ct__now() < e->next_poll)
        return false;
    e->next_poll = ct__now() + POLL_RUNNING_S;
    char key[96], buf[64];
    if (!e->host) {
        /* A fixed job's store may not be up yet: tried again in a while. */
        if (!connected(e, 1.0)) {
            e->next_poll = ct__now() + POLL_CALL_S;
            return false;
        }
        /* A job that ended well ("end 0") lets the ranks finish. */
        return exists(e, key_of(key, e->round + 1, "open")) &&
               !(get_str(e, key, POLL_CALL_S, buf, sizeof buf) == 0 && !strcmp(buf, "end 0"));
    }
    /* The reason is kept from here: once this node stops its ranks, the
     * others' fail, and their requests that follow are no cause. */
    if (exists(e, key_of(key, e->round, "restart")))
        e->stop_why = STOP_FAILED;
    else if (e->nnodes < e->max_nodes && joined(e, e->round) > e->nnodes)
        e->stop_why = STOP_GROW;
    return e->stop_why != STOP_NONE;
}

int ctl_elastic_next(ctl_elastic *e, bool failed, int fail_code, char reason[16], int *code) {
    char key[96], buf[64];
    int g = e->round;
    if (!e->host) {
        /* Best effort, and brief: a host that is gone is found in join. */
        if (failed && connected(e, POLL_CALL_S)) {
            snprintf(buf, sizeof buf, "%d %d", fail_code, e->node_rank);
            ct_store_set(e->store, key_of(key, g, "restart"), buf, strlen(buf), POLL_CALL_S);
        }
        e->round++;
        snprintf(reason, 16, "-");
        return 0;
    }
    int who = 0;
    if (!failed && e->stop_why == STOP_FAILED &&
        !get_str(e, key_of(key, g, "restart"), -1, buf, sizeof buf) &&
        sscanf(buf, "%d %d", &fail_code, &who) == 2)
        failed = true;
    e->stop_why = STOP_NONE;
    if (failed) {
        e->restarts++;
        fprintf(stderr, "ctlaunch: round %d failed on node %d (code %d)", g, who, fail_code);
        if (e->restarts > e->max_restarts) {
            fprintf(stderr, "; no restarts left (--max-restarts %d)\n", e->max_restarts);
            *code = fail_code;
            ctl_elastic_end(e, fail_code);
            return 1;
        }
        fprintf(stderr, "; re-forming the job (restart %d of %d)\n", e->restarts, e->max_restarts);
        snprintf(reason, 16, "fail");
    } else {
        fprintf(stderr, "ctlaunch: a node waits to join round %d; re-forming the job with it\n", g);
        snprintf(reason, 16, "grow");
    }
    e->round++;
    return 0;
}

void ctl_elastic_end(ctl_elastic *e, int code) {
    if (!e->host || !e->store)
        return;
    char key[96], buf[32];
    snprintf(buf, sizeof buf, "end %d", code);
    set_str(e, key_of(key, e->round + 1, "open"), buf);
}

void ctl_elastic_free(ctl_elastic *e) {
    ct_store_free(e->store);
    free(e->last_members);
    e->store = NULL;
    e->last_members = NULL;
}
