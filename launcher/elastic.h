/* ctlaunch internal header: the rounds in which the nodes of a job of
 * several meet: an elastic job's (--nnodes MIN:MAX), whose nodes may die
 * or join while it runs, and a fixed one's (--nnodes M), whose restarts
 * they keep together.
 *
 * The nodes meet in rounds, through the store that the node started with
 * --node-rank 0 hosts (the host). The host opens each round, takes the
 * nodes that join until MAX have or, once MIN have, until --last-call has
 * passed, and closes it with their count: the nodes in it get node ranks
 * in the order they joined (the host is always node 0) and run one
 * generation of ranks, CT_RESTART_COUNT being the round. A round ends on
 * every node when the host opens the next one, which it does when its
 * own ranks fail, when another node asks for it (its ranks failed), or
 * when a node waits to join a round that has room for more. A node that
 * joined a closed round waits for the next. Failures count against
 * --max-restarts, growth does not; past it the host ends the job on every
 * node with the failure's code.
 *
 * A fixed job (fixed: MIN = MAX, node ranks given) starts round 0 at
 * once, without meeting, as a job without rounds would; its later rounds
 * (restarts) wait for all its nodes, in the order of their --node-rank.
 * Its other nodes reach the store only when they first need it, so that
 * one whose store is not up yet starts its ranks all the same.
 *
 * Store keys, under ct/el/: "np" (the ranks per node, which every node
 * must match), and per round G: "G/open" (why it opened: "start", "fail",
 * "grow", or "end CODE"), "G/joined" (a counter), "G/node/I" (the host
 * name of the I-th node to join), "G/size" (the count, once closed),
 * "G/restart" ("CODE NODE" from a node whose ranks failed).
 *
 * Not thread-safe: the supervising thread's alone. The store client is
 * owned by the ctl_elastic. */
#ifndef CT_LAUNCHER_ELASTIC_H
#define CT_LAUNCHER_ELASTIC_H

#include <ct/dist.h>

#include <stdbool.h>

typedef struct ctl_elastic {
    /* Set by the caller before ctl_elastic_start. */
    int min_nodes, max_nodes, np;
    bool host;           /* this node hosts the store and runs the rounds */
    bool fixed;          /* a fixed job: min_nodes == max_nodes, node ranks given */
    int given_rank;      /* a fixed job's --node-rank */
    double last_call;    /* seconds a round stays open once min_nodes joined */
    double join_timeout; /* seconds a node waits for a round to form */
    int max_restarts;
    /* The round this node is in, or waits for, and its place in it. */
    int round, node_rank, nnodes;
    int restarts; /* the host's count of failures so far */
    /* Private. */
    enum { STOP_NONE, STOP_FAILED, STOP_GROW } stop_why; /* the host's, from should_stop */
    ct_store *store; /* NULL until needed on a fixed job's other nodes */
    char addr[256];
    int port;
    double next_poll;
    char hostname[256];
    char (*last_members)[256]; /* [max_nodes]: the host names of the host's last round */
    int nlast;
} ctl_elastic;

/* Connects to the store at addr:port (the host's own, already serving)
 * and, on the host, publishes np; a fixed job's other nodes connect
 * later. 0, or 1 after a message. */
int ctl_elastic_start(ctl_elastic *e, const char *addr, int port);

/* Joins e->round (opening it first on the host, with reason) and waits
 * until this node is in a closed round, moving on past rounds that closed
 * without it: 0 with round, node_rank and nnodes set; 1 when the job is
 * over (*code: ctlaunch's exit code), after a message. */
int ctl_elastic_join(ctl_elastic *e, const char *reason, int *code);

/* While the round's ranks run, about twice a second (cheaper calls return
 * false at once): whether the round is over for this node. */
bool ctl_elastic_should_stop(ctl_elastic *e);

/* The round's ranks have stopped; failed: they failed here, with code.
 * Decides the next round's reason into reason[16] and moves e->round on:
 * 0 to join it, or 1 when the job is over (*code), after a message. */
int ctl_elastic_next(ctl_elastic *e, bool failed, int fail_code, char reason[16], int *code);

/* Ends the job on every node with code (from the host; a no-op
 * elsewhere), as after a signal. */
void ctl_elastic_end(ctl_elastic *e, int code);

void ctl_elastic_free(ctl_elastic *e);

#endif
