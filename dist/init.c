/* ct_dist_init: joining the job a launcher started.
 *
 * The steps, each undone in reverse by teardown():
 *   1. the world from the environment, the backend and the timeout;
 *   2. MPI, under an MPI launcher or when the mpi backend is asked for
 *      (init_mpi.c; rank, size and the local ranks then come from MPI);
 *   3. the store: ctlaunch's; or one rank 0 hosts, at MASTER_ADDR:PORT for
 *      env:// and a Slurm step without PMI (after the job's secret and
 *      before a check-in that finds the ranks on each machine,
 *      rendezvous.c), on a free port under an MPI launcher;
 *   4. the world communicator, with what its backend needs from rank 0
 *      (the shared-memory segment's name) shared through the store or MPI;
 *   5. under ctlaunch, a heartbeat thread for ctlaunch's --hang-timeout.
 * docs/dist.md describes the choices; this file keeps one process-wide
 * state, touched only by the thread that calls init and finalize, except
 * for the atomics ct_dist_heartbeat() and the heartbeat thread use. */
#include "base_impl.h"
#include "dist_impl.h"
#include "init_mpi.h"

#include <ct/cuda.h>

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Bytes rank 0 shares at init: a segment name or the store's host:port. */
#define SHARED_LEN 320
/* How often a rank tells ctlaunch how far it got, and how long one such
 * message may take: a lost heartbeat is harmless, the next one follows, and
 * finalize must not wait long for the thread. */
#define HEARTBEAT_PERIOD_S      1.0
#define HEARTBEAT_SET_TIMEOUT_S 0.25
#define BACKEND_AUTO            (-1)

typedef struct heartbeat {
    ct_comm *comm;   /* the world communicator, whose progress it reports */
    ct_store *store; /* the thread's own client */
    char key[64];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC: stop was set */
    bool stop;         /* guarded by mu */
    bool running;
} heartbeat;

static struct dist {
    bool initialized;
    ct_world world;
    ct_backend backend;
    /* auto chose before the ranks' machines were known (mpi under an MPI
     * launcher, gloo for env:// or Slurm): all on one, it becomes shm */
    bool auto_deferred;
    bool auto_chosen; /* no option or CT_BACKEND named the backend */
    double timeout;
    bool mpi;                /* init_mpi.c is in use */
    ct_store_server *server; /* rank 0's, where no ctlaunch hosts the store */
    bool secret_file;        /* the job's secret came in rank 0's file (rendezvous.c) */
    ct_store *store;
    char store_host[256]; /* where store is: the gloo backend's own client connects there */
    int store_port;
    ct__dist_comm_store *gloo_store;
    ct_comm *comm;
    heartbeat hb;
} g;

/* ct_dist_init calls in this process: keys and segment names of a second
 * init never meet the first one's. */
static unsigned generation;
/* Read by ct_dist_heartbeat() from any thread. */
static atomic_bool live;
static atomic_uint_fast64_t beats;

/* Puts context in front of the error the failed call recorded. */
static int CT_PRINTF(1, 2) with_context(const char *fmt, ...) {
    int code = ct_errcode();
    CT_ASSERT(code < 0);
    char saved[768], prefix[256];
    snprintf(saved, sizeof saved, "%s", ct_errmsg());
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    return ct__err_set(code, "%s: %s", prefix, saved);
}

/* -------------------------------------------------------------- choices */

/* Whether an MPI launcher brought the ranks together (a Slurm step with
 * PMI included), rather than ct's own rendezvous at a master address. */
static bool is_mpi_world(const ct_world *w) {
    return w->source == CT_WORLD_OPENMPI || w->source == CT_WORLD_PMI ||
           (w->source == CT_WORLD_SLURM && w->master_port < 0);
}

/* ctlaunch, env:// and a Slurm step without PMI, which meet in ct's store. */
static bool is_own_rendezvous(const ct_world *w) {
    return w->source == CT_WORLD_CTLAUNCH ||
           ((w->source == CT_WORLD_ENV || w->source == CT_WORLD_SLURM) && w->master_port > 0);
}

/* What carries a hierarchical world across machines: gloo for ct's own
 * rendezvous, mpi under an MPI launcher. */
static ct_backend flat_backend(const ct_world *w) {
    return is_own_rendezvous(w) ? CT_BACKEND_GLOO : CT_BACKEND_MPI;
}

/* "auto" or a backend's name into *out (BACKEND_AUTO for auto). */
static bool parse_backend(const char *name, int *out) {
    if (!strcmp(name, "auto")) {
        *out = BACKEND_AUTO;
        return true;
    }
    static const ct_backend all[] = {CT_BACKEND_SHM, CT_BACKEND_MPI, CT_BACKEND_NCCL,
                                     CT_BACKEND_GLOO, CT_BACKEND_HIER};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (!strcmp(name, ct_backend_name(all[i]))) {
            *out = (int)all[i];
            return true;
        }
    return false;
}

/* Whether backend b can carry this world's collectives, as far as can be
 * told before MPI tells where the ranks are. */
static int check_backend(ct_backend b, const ct_world *w) {
    bool own = is_own_rendezvous(w);
    switch (b) {
    case CT_BACKEND_SHM:
        if (own && w->local_size > 0 && w->local_size != w->size)
            return ct__err_set(CT_EINVAL,
                               "dist_init: backend shm needs every rank on one machine, but this "
                               "job has %d ranks with %d on this machine (%s); use the gloo "
                               "backend (or mpi under mpirun)",
                               w->size, w->local_size, ct_world_source_name(w->source));
        return 0;
    case CT_BACKEND_MPI:
        if (!ct_backend_available(CT_BACKEND_MPI))
            return ct__err_set(CT_ENOTSUP,
                               "dist_init: backend mpi: this build of ct has no MPI (configure did "
                               "not find it; install libopenmpi-dev and rebuild)%s",
                               w->local_size == w->size ? "; on one machine, use the shm backend"
                                                        : "");
        if (own && w->size > 1)
            return ct__err_set(CT_ENOTSUP,
                               "dist_init: backend mpi under %s (%d ranks): it does not start "
                               "MPI, so the mpi backend needs an MPI launcher: mpirun -np %d "
                               "./prog; ct's own rendezvous runs shm on one machine and gloo "
                               "across machines",
                               ct_world_source_name(w->source), w->size, w->size);
        return 0;
    case CT_BACKEND_GLOO:
        if (!ct_backend_available(CT_BACKEND_GLOO))
            return ct__err_set(CT_ENOTSUP,
                               "dist_init: backend gloo: this build of ct has no gloo (configure "
                               "did not find it; install libgloo-dev and rebuild)");
        return 0;
    case CT_BACKEND_DRY:
        return ct__err_set(CT_EINVAL,
                           "dist_init: backend dry moves no data between processes: it plays "
                           "one rank of a group alone (make one with ct_comm_new, or let "
                           "ct_memory_plan make its own)");
    case CT_BACKEND_HIER:
        /* Across machines on the backend the flat world would take. */
        return check_backend(flat_backend(w), w);
    case CT_BACKEND_NCCL:
        if (!ct_backend_available(CT_BACKEND_NCCL))
            return ct__err_set(CT_ENOTSUP, "dist_init: backend nccl: this build of ct has no "
                                           "NCCL (it needs CUDA and NCCL at configure time)");
        if (ct_cuda_device_count() == 0)
            return ct__err_set(CT_EDEVICE, "dist_init: backend nccl needs a CUDA device: %s",
                               ct_cuda_unavailable_reason());
        return 0;
    }
    return ct__err_set(CT_EINVAL, "dist_init: unknown backend %d", (int)b);
}

/* The backend: the option, else CT_BACKEND, else the launcher decides: shm
 * for a world of one and for ranks all on one machine, gloo across
 * machines for ct's own rendezvous (which starts no MPI) when the build has
 * it, mpi otherwise.
 * Where the machines are not known yet (an MPI launcher, env:// without
 * LOCAL_WORLD_SIZE, Slurm) auto picks for now (*deferred), and join() turns
 * it into shm once MPI or the check-in shows every rank on this machine. */
static int choose_backend(const ct_dist_options *opts, const ct_world *w, ct_backend *out,
                          bool *deferred, bool *automatic) {
    int b = BACKEND_AUTO;
    if (opts && opts->backend && !parse_backend(opts->backend, &b))
        return ct__err_set(CT_EINVAL,
                           "dist_init: backend \"%s\" is not one of auto, shm, mpi, nccl, gloo "
                           "and hier",
                           opts->backend);
    const char *env = getenv("CT_BACKEND");
    if (b == BACKEND_AUTO && env && !parse_backend(env, &b))
        return ct__err_set(
            CT_EINVAL,
            "dist_init: CT_BACKEND=\"%s\" is not one of auto, shm, mpi, nccl, gloo and hier", env);
    *deferred = false;
    *automatic = b == BACKEND_AUTO;
    if (b == BACKEND_AUTO) {
        bool own = is_own_rendezvous(w);
        bool one_machine = w->size == 1 || (own && w->local_size == w->size);
        bool gloo = own && ct_backend_available(CT_BACKEND_GLOO);
        b = one_machine ? CT_BACKEND_SHM : gloo ? CT_BACKEND_GLOO : CT_BACKEND_MPI;
        *deferred = !one_machine && (is_mpi_world(w) || w->local_size == 0);
    }
    *out = (ct_backend)b;
    return check_backend(*out, w);
}

/* The option when set, else CT_TIMEOUT, else the collectives' default. */
static int choose_timeout(const ct_dist_options *opts, double *out) {
    if (opts && opts->timeout_s != 0) {
        if (!(opts->timeout_s > 0) || !isfinite(opts->timeout_s))
            return ct__err_set(CT_EINVAL,
                               "dist_init: timeout_s is %g; expected a finite number of seconds "
                               "> 0, or 0 for CT_TIMEOUT or the default (%g s)",
                               opts->timeout_s, CT_COMM_DEFAULT_TIMEOUT);
        *out = opts->timeout_s;
        return 0;
    }
    const char *env = getenv("CT_TIMEOUT");
    if (!env) {
        *out = CT_COMM_DEFAULT_TIMEOUT;
        return 0;
    }
    char *end;
    errno = 0;
    double t = strtod(env, &end);
    if (!*env || *end || errno || !(t > 0) || !isfinite(t))
        return ct__err_set(
            CT_EINVAL, "dist_init: CT_TIMEOUT=\"%s\" is not a finite number of seconds > 0", env);
    *out = t;
    return 0;
}

/* ------------------------------------------------------ store and sharing */

/* Rank 0's buf (a string shorter than SHARED_LEN) reaches every rank:
 * under MPI by a broadcast, under ctlaunch through the store under a key of
 * this restart and this init. A world of one has nothing to share. */
static int share(char *buf, const char *what, const char *name) {
    if (g.mpi)
        return ct__dist_mpi_share(buf, SHARED_LEN, what, g.timeout);
    if (!g.store)
        return 0;
    char key[128];
    snprintf(key, sizeof key, "ct/init/%d/%u/%s", g.world.restart_count, generation, name);
    if (g.world.rank == 0) {
        int rc = ct_store_set(g.store, key, buf, strlen(buf), -1);
        return rc ? with_context("dist_init: publishing %s", what) : 0;
    }
    void *value;
    size_t len;
    if (ct_store_get(g.store, key, &value, &len, -1))
        return with_context("dist_init: rank %d waiting for rank 0's %s", g.world.rank, what);
    if (len >= SHARED_LEN) {
        free(value);
        return ct__err_set(CT_ECORRUPT,
                           "dist_init: rank 0's %s ('%s') is %zu bytes; expected at most %d", what,
                           key, len, SHARED_LEN - 1);
    }
    memcpy(buf, value, len + 1);
    free(value);
    return 0;
}

static int connect_store(const char *host, int port) {
    snprintf(g.store_host, sizeof g.store_host, "%s", host);
    g.store_port = port;
    g.store = ct_store_connect(host, port, g.timeout);
    /* A secret file left by a crashed job on this port is replaced by rank
     * 0's new one: a rank that read the old one reads again. */
    double start = ct__now();
    while (!g.store && g.secret_file && ct_errcode() == CT_EAUTH && ct__now() - start < g.timeout) {
        nanosleep(&(struct timespec){0, 50000000}, NULL);
        if (ct__dist_rdzv_reread_secret(&g.world) == 0)
            g.store = ct_store_connect(host, port, g.timeout);
    }
    return g.store ? 0 : with_context("dist_init: rank %d cannot reach the store", g.world.rank);
}

/* env:// and a Slurm step without PMI: rank 0 hosts the store at the
 * master address (MASTER_ADDR, the first host of the step), which must be
 * its own, and every rank, after the job's secret, connects and checks in. */
static int meet_at_master(void) {
    int rc = ct__dist_rdzv_secret(&g.world, g.timeout, &g.secret_file);
    if (rc)
        return with_context("dist_init: rank %d", g.world.rank);
    if (g.world.rank == 0) {
        char bind[CT__BIND_LEN], host[256];
        rc = ct__dist_listen_address(&g.world, g.world.master_addr, bind, host);
        if (!rc && !(g.server = ct_store_server_new(bind, g.world.master_port)))
            rc = with_context("dist_init: rank 0 cannot host the store at %s:%d (%s's master "
                              "address, which must be rank 0's host)",
                              g.world.master_addr, g.world.master_port,
                              ct_world_source_name(g.world.source));
    }
    if (!rc)
        rc = connect_store(g.world.master_addr, g.world.master_port);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "ct/init/%d/%u/", g.world.restart_count, generation);
    if (!rc && (rc = ct__dist_rdzv_check_in(g.store, &g.world, prefix)))
        rc = with_context("dist_init: rank %d checking in", g.world.rank);
    return rc;
}

/* Under an MPI launcher there is no ctlaunch: rank 0 hosts the store on a
 * free port and tells the others where (ct__dist_listen_address). */
static int host_store(void) {
    char addr[SHARED_LEN] = "";
    int rc = 0;
    if (g.world.rank == 0) {
        char bind[CT__BIND_LEN], host[256];
        rc = ct__dist_listen_address(&g.world, getenv("CT_MASTER_ADDR"), bind, host);
        if (!rc && !(g.server = ct_store_server_new(bind, 0)))
            rc = with_context("dist_init: rank 0 cannot host the store");
        if (!rc)
            snprintf(addr, sizeof addr, "%s:%d", host, ct_store_server_port(g.server));
    }
    /* Rank 0 shares even after a failure, so that the others fail now
     * rather than at their timeout. */
    int shared = share(addr, "the store's address", "store");
    if (rc || shared)
        return rc ? rc : shared;
    char *colon = strrchr(addr, ':');
    if (!colon)
        return ct__err_set(CT_EPEER, "dist_init: rank 0 could not host the store (its own error "
                                     "says why)");
    *colon = 0;
    return connect_store(addr, atoi(colon + 1));
}

/* ------------------------------------------------------ world communicator */

/* Rank 0's NCCL unique id, shared as hex like the other bootstrap strings:
 * through the store under ctlaunch, by MPI_Bcast under an MPI launcher. */
static int share_nccl_id(unsigned char id[CT_NCCL_ID_BYTES]) {
    char hex[SHARED_LEN] = "";
    int rc = 0;
    if (g.world.rank == 0) {
        rc = ct_comm_nccl_id(id);
        for (int i = 0; !rc && i < CT_NCCL_ID_BYTES; i++)
            snprintf(hex + 2 * i, 3, "%02x", id[i]);
    }
    /* Rank 0 shares even after a failure, so that the others fail now
     * rather than at their timeout. */
    int shared = share(hex, "NCCL unique id", "nccl_id");
    if (rc || shared)
        return rc ? rc : shared;
    if (g.world.rank == 0)
        return 0;
    if (strlen(hex) != 2 * CT_NCCL_ID_BYTES)
        return ct__err_set(CT_EPEER, "dist_init: rank 0 could not make the NCCL unique id (its own "
                                     "error says why)");
    for (int i = 0; i < CT_NCCL_ID_BYTES; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1)
            return ct__err_set(CT_ECORRUPT, "dist_init: rank 0's NCCL unique id is not hex: %.16s",
                               hex + 2 * i);
        id[i] = (unsigned char)v;
    }
    return 0;
}

#include <sys/random.h> /* make_world_comm's segment name */

/* What the gloo backend needs: the store, as functions over a client of
 * its own (collectives/ does not know ct_store), a key prefix of this
 * restart and init, and the address its connections bind to
 * (ct__dist_listen_address: loopback on one machine, else this host's,
 * CT_BIND_ADDR overriding). A world of one meets nobody. */
static int gloo_config(ct_comm_config *cfg) {
    static char prefix[64], host[256];
    static char bind[CT__BIND_LEN];
    if (!g.store)
        return 0;
    int rc = ct__dist_listen_address(&g.world, NULL, bind, host);
    if (!rc)
        rc = ct__dist_comm_store_new(g.store_host, g.store_port, g.timeout, &g.gloo_store);
    if (rc)
        return with_context("dist_init: rank %d: the gloo backend's store and address",
                            g.world.rank);
    snprintf(prefix, sizeof prefix, "ct/gloo/%d/%u/", g.world.restart_count, generation);
    cfg->store = ct__dist_comm_store_fns(g.gloo_store);
    cfg->store_prefix = prefix;
    /* "*" (every interface) is for listeners that take any address; a
     * gloo pair binds one, and tells the peers that one. */
    cfg->gloo_addr = strcmp(bind, "*") ? bind : host;
    return 0;
}

/* Hierarchical when asked for; when auto chose gloo, if the machines fit
 * (machines_fit decides). */
static bool wants_hier(void) {
    return g.backend == CT_BACKEND_HIER ||
           (g.auto_chosen && g.backend == CT_BACKEND_GLOO && g.world.size > 1);
}

/* Whether there are several machines with as many ranks on each, more than
 * one: what the hierarchical communicator is for. Decided alike on every
 * rank, from an allgather of the machine ids over the flat communicator:
 * the environment's local sizes may differ from rank to rank (Slurm's
 * uneven tasks per node), so no rank can decide alone. */
static int machines_fit(uint64_t machine, bool *fit) {
    const int n = g.world.size;
    ct_scope_begin();
    ct_tensor *mine = ct_from_data(&machine, CT_SHAPE(1), CT_INT64);
    ct_tensor *all = ct_empty(1, (int64_t[]){n}, CT_INT64);
    int rc = mine && all ? ct_comm_allgather(g.comm, all, mine, NULL) : ct_errcode();
    if (!rc) {
        const int64_t *ids = ct_data_ptr(all);
        int machines = 0, first_count = -1;
        bool even = true;
        for (int r = 0; r < n; r++) {
            bool seen = false;
            for (int q = 0; q < r && !seen; q++)
                seen = ids[q] == ids[r];
            if (seen)
                continue;
            int count = 0;
            for (int q = r; q < n; q++)
                count += ids[q] == ids[r];
            machines++;
            even &= first_count < 0 || count == first_count;
            if (first_count < 0)
                first_count = count;
        }
        *fit = machines > 1 && even && first_count > 1;
    }
    ct_scope_end();
    return rc;
}

/* Makes the world communicator g.comm (of flat's backend) hierarchical.
 * Under ctlaunch a machine is a node of its command line (ranks are
 * numbered node by node), else a host name and boot id. When auto chose
 * it, machines that do not fit keep the flat communicator. */
static int make_hier(void) {
    const ct_world *w = &g.world;
    uint64_t machine = w->source == CT_WORLD_CTLAUNCH ? (uint64_t)(w->rank / w->local_size)
                                                      : ct__dist_rdzv_machine_key();
    bool fit = true;
    int rc = g.backend == CT_BACKEND_HIER ? 0 : machines_fit(machine, &fit);
    ct_comm *h = NULL;
    if (!rc && !fit)
        return 0;
    if (!rc)
        rc = ct_comm_hierarchical(g.comm, machine, &h);
    if (!rc) {
        g.comm = h;
        g.backend = CT_BACKEND_HIER;
        return 0;
    }
    return with_context("dist_init: rank %d of %d: the hierarchical communicator", w->rank,
                        w->size);
}

static int make_world_comm(void) {
    bool hier = wants_hier();
    ct_backend flat = g.backend == CT_BACKEND_HIER ? flat_backend(&g.world) : g.backend;
    ct_comm_config cfg = {
        .backend = flat, .rank = g.world.rank, .size = g.world.size, .timeout_s = g.timeout};
    char name[SHARED_LEN] = "";
    unsigned char id[CT_NCCL_ID_BYTES];
    if (flat == CT_BACKEND_SHM) {
        /* Unique among the jobs on this machine (rank 0's pid) and across
         * restarts and inits; the port and restart count help a reader of
         * /dev/shm tell jobs apart. The random part keeps another user
         * from guessing the name and creating it first. */
        unsigned char rnd[16];
        if (g.world.rank == 0) {
            if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
                return ct__err_set(CT_EIO, "dist_init: getrandom for the segment name: %s",
                                   strerror(errno));
            int len = snprintf(name, sizeof name, "/ct-%d-%d-%ld-%u-",
                               g.world.master_port > 0 ? g.world.master_port : 0,
                               g.world.restart_count, (long)getpid(), generation);
            for (size_t i = 0; i < sizeof rnd; i++)
                len += snprintf(name + len, sizeof name - (size_t)len, "%02x", rnd[i]);
        }
        int rc = share(name, "shared-memory segment name", "shm_name");
        if (rc)
            return rc;
        cfg.shm_name = name;
    } else if (flat == CT_BACKEND_NCCL) {
        int rc = share_nccl_id(id);
        if (rc)
            return rc;
        cfg.nccl_id = id;
        cfg.device = ct_cuda_current_device();
    } else if (flat == CT_BACKEND_GLOO) {
        int rc = gloo_config(&cfg);
        if (rc)
            return rc;
    } else {
        cfg.mpi_comm = ct__dist_mpi_world_comm();
    }
    g.comm = ct_comm_new(&cfg);
    if (!g.comm)
        return with_context("dist_init: rank %d of %d: the world communicator (%s)", g.world.rank,
                            g.world.size, ct_backend_name(flat));
    return hier ? make_hier() : 0;
}

/* ---------------------------------------------------------------- heartbeat */

/* One heartbeat: "<progress> <what it waits in>", e.g. "42 allreduce #17"
 * or "42 -", or "<progress> done" at finalize. Progress counts completed
 * collectives of the world communicator and ct_dist_heartbeat() calls; a
 * failed set is dropped (the next one follows in a second). */
static void beat(heartbeat *hb, bool done) {
    ct_comm_stats st;
    ct_comm_stats_get(hb->comm, &st);
    unsigned long long progress = st.completed + atomic_load(&beats);
    char value[192];
    if (done)
        snprintf(value, sizeof value, "%llu done", progress);
    else if (st.pending_op)
        snprintf(value, sizeof value, "%llu %s #%llu", progress, st.pending_op,
                 (unsigned long long)st.pending_seq);
    else
        snprintf(value, sizeof value, "%llu -", progress);
    ct_store_set(hb->store, hb->key, value, strlen(value), HEARTBEAT_SET_TIMEOUT_S);
}

static void *heartbeat_main(void *arg) {
    heartbeat *hb = arg;
    pthread_mutex_lock(&hb->mu);
    while (!hb->stop) {
        pthread_mutex_unlock(&hb->mu);
        beat(hb, false);
        pthread_mutex_lock(&hb->mu);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += (time_t)HEARTBEAT_PERIOD_S;
        while (!hb->stop && pthread_cond_timedwait(&hb->cv, &hb->mu, &until) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&hb->mu);
    beat(hb, true);
    return NULL;
}

static int start_heartbeat(void) {
    heartbeat *hb = &g.hb;
    hb->comm = g.comm;
    snprintf(hb->key, sizeof hb->key, "ct/hb/%d/%d", g.world.restart_count, g.world.rank);
    hb->store = ct_store_connect(g.world.master_addr, g.world.master_port, g.timeout);
    if (!hb->store)
        return with_context("dist_init: the heartbeat's store client");
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&hb->cv, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&hb->mu, NULL);
    hb->stop = false;
    /* Signals are for the application's threads, as on the collectives'
     * threads: the thread starts with every one blocked. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&hb->thread, NULL, heartbeat_main, hb);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        pthread_cond_destroy(&hb->cv);
        pthread_mutex_destroy(&hb->mu);
        return ct__err_set(CT_EFOREIGN, "dist_init: cannot start the heartbeat thread: %s",
                           strerror(err));
    }
    hb->running = true;
    return 0;
}

/* Wakes the thread, which sends its "done" heartbeat and ends. */
static void stop_heartbeat(void) {
    heartbeat *hb = &g.hb;
    if (hb->running) {
        pthread_mutex_lock(&hb->mu);
        hb->stop = true;
        pthread_cond_signal(&hb->cv);
        pthread_mutex_unlock(&hb->mu);
        pthread_join(hb->thread, NULL);
        pthread_cond_destroy(&hb->cv);
        pthread_mutex_destroy(&hb->mu);
        hb->running = false;
    }
    ct_store_free(hb->store);
    hb->store = NULL;
}

/* ------------------------------------------------------------- init, finalize */

/* Undoes whatever init did, in reverse. orderly: every rank is finalizing,
 * so under an MPI launcher the ranks first meet, because rank 0's store
 * must outlive the others' use of it. */
static void teardown(bool orderly) {
    atomic_store(&live, false);
    stop_heartbeat();
    /* After a failure (ct_comm_progress returns it) nothing here waits for
     * the peers, which may be stuck, longer than the timeout: the failed
     * communicator's barrier is skipped, and under MPI the ranks meet in one
     * bounded by the communicator's timeout before MPI_Finalize, or leave
     * MPI_Finalize out. */
    bool failed = g.comm && ct_comm_progress(g.comm) != 0;
    bool rank0_store = g.world.size > 1 && g.world.source != CT_WORLD_CTLAUNCH;
    if (orderly && !failed && rank0_store)
        ct_comm_barrier(g.comm, NULL);
    if (failed && g.mpi)
        ct__dist_mpi_meet(ct_comm_timeout(g.comm));
    ct_comm_free(g.comm);
    ct__dist_comm_store_free(g.gloo_store);
    ct_store_free(g.store);
    ct_store_server_free(g.server);
    if (g.secret_file && g.world.rank == 0)
        ct__dist_rdzv_secret_remove(&g.world);
    if (g.mpi)
        ct__dist_mpi_finalize();
    g = (struct dist){0};
}

/* Under an MPI launcher every rank takes rank 0's secret, which MPI carries
 * (the launcher's channel is the job's to trust): the one rank 0 was given,
 * or a random one. */
static int share_secret(void) {
    char secret[SHARED_LEN] = "";
    int rc = 0;
    if (g.world.rank == 0) {
        char own[CT_SECRET_MAX + 1];
        rc = ct__auth_secret_copy(own);
        if (!rc && strlen(own) >= SHARED_LEN)
            rc = ct__err_set(CT_EINVAL,
                             "dist_init: rank 0's job secret is %zu bytes; under an MPI launcher "
                             "it is shared by MPI and may be at most %d",
                             strlen(own), SHARED_LEN - 1);
        if (!rc)
            memcpy(secret, own, strlen(own) + 1);
        memset(own, 0, sizeof own);
    }
    int shared = ct__dist_mpi_share(secret, SHARED_LEN, "the job's secret", g.timeout);
    if (!rc && !shared && g.world.rank != 0)
        rc = secret[0] ? ct_secret_set(secret)
                       : ct__err_set(CT_EPEER, "dist_init: rank 0 could not share the job's "
                                               "secret (its own error says why)");
    memset(secret, 0, sizeof secret);
    return rc ? rc : shared;
}

/* The store every rank uses: ctlaunch's, rank 0's at the master address,
 * or rank 0's on a free port under an MPI launcher. */
static int meet(void) {
    if (g.world.source == CT_WORLD_CTLAUNCH && g.world.master_port > 0)
        return connect_store(g.world.master_addr, g.world.master_port);
    if (g.world.source != CT_WORLD_CTLAUNCH && is_own_rendezvous(&g.world) && g.world.size > 1)
        return meet_at_master();
    if (g.mpi)
        return host_store();
    if (g.world.size > 1)
        return ct__err_set(CT_EINVAL,
                           "dist_init: CT_WORLD_SIZE is %d but CT_MASTER_ADDR and CT_MASTER_PORT "
                           "are unset, so the ranks have nowhere to meet; start the job with "
                           "ctlaunch -np %d ./prog",
                           g.world.size, g.world.size);
    return 0;
}

static int join(void) {
    int rc;
    if (g.mpi && (rc = ct__dist_mpi_init(&g.world)))
        return rc;
    if (g.mpi && (rc = share_secret()))
        return rc;
    if ((rc = meet()))
        return rc;
    /* On one machine ct's shm collectives beat the MPI library's (the fmnist
     * recipe on 2 ranks: 46,600-55,200 samples/s against 28,700-35,400,
     * docs/bench-ddp.md), so mpirun on one machine gets shm too. */
    if (g.auto_deferred && g.world.local_size == g.world.size)
        g.backend = CT_BACKEND_SHM;
    if (g.backend == CT_BACKEND_SHM && g.world.local_size != g.world.size)
        return ct__err_set(CT_EINVAL,
                           "dist_init: backend shm needs every rank on one machine, but %s puts "
                           "%d of the %d ranks on this one; use the %s backend",
                           g.mpi ? "MPI" : "the check-in", g.world.local_size, g.world.size,
                           g.mpi ? "mpi" : "gloo");
    /* Each rank on a machine takes its own accelerator, as a PyTorch
     * program does with set_device(local_rank) by hand; the nccl
     * communicator is made on it. */
    ct__device_take_local(g.world.local_rank);
    rc = make_world_comm();
    if (!rc && g.world.source == CT_WORLD_CTLAUNCH && g.store)
        rc = start_heartbeat();
    return rc;
}

int ct_dist_init(const ct_dist_options *opts) {
    if (g.initialized)
        return ct__err_set(CT_ESTATE,
                           "dist_init: already initialized (rank %d of %d, backend %s); call "
                           "ct_dist_finalize first",
                           g.world.rank, g.world.size, ct_backend_name(g.backend));
    ct_world w;
    if (ct_world_from_env(&w))
        return with_context("dist_init");
    ct_backend backend = CT_BACKEND_SHM;
    bool deferred = false, automatic = false;
    double timeout = 0;
    int rc = choose_backend(opts, &w, &backend, &deferred, &automatic);
    if (!rc)
        rc = choose_timeout(opts, &timeout);
    if (rc)
        return rc;
    g = (struct dist){.world = w,
                      .backend = backend,
                      .auto_deferred = deferred,
                      .auto_chosen = automatic,
                      .timeout = timeout,
                      .mpi = is_mpi_world(&w) || backend == CT_BACKEND_MPI};
    generation++;
    atomic_store(&beats, 0);
    if ((rc = join())) {
        teardown(false);
        return rc;
    }
    g.initialized = true;
    atomic_store(&live, true);
    return 0;
}

void ct_dist_finalize(void) {
    if (g.initialized)
        teardown(true);
}

bool ct_dist_is_initialized(void) { return g.initialized; }
const ct_world *ct_dist_world(void) { return g.initialized ? &g.world : NULL; }
ct_comm *ct_dist_comm(void) { return g.comm; }
ct_store *ct_dist_store(void) { return g.store; }

void ct_dist_heartbeat(void) {
    if (atomic_load_explicit(&live, memory_order_relaxed))
        atomic_fetch_add_explicit(&beats, 1, memory_order_relaxed);
}

/* ----------------------------------------------------------- process groups */

/* "[0, 2, 4]", shortened past a few dozen ranks. */
static const char *list_str(char *buf, size_t cap, const int *ranks, int n) {
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n && len + 16 < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? ", " : "", ranks[i]);
    snprintf(buf + len, cap - len, "%s]", len + 16 < cap ? "" : ", ...");
    return buf;
}

/* Every rank must pass the same list: an allreduce of (fp, -fp) with max
 * gives (max fp, -min fp), equal up to sign only when every fp is. */
static int check_same_list(const int *ranks, int n) {
    uint64_t fp = 1469598103934665603ull; /* FNV-1a over the list */
    for (int i = 0; i < n; i++)
        fp = (fp ^ (uint64_t)(uint32_t)ranks[i]) * 1099511628211ull;
    int64_t v[2] = {(int64_t)(fp >> 2), -(int64_t)(fp >> 2)};
    ct_scope_begin();
    ct_tensor *host = ct_from_data(v, CT_SHAPE(2), CT_INT64);
    ct_tensor *t = host ? ct_to(host, ct_comm_device(g.comm)) : NULL;
    int rc = t ? ct_comm_allreduce(g.comm, t, CT_REDUCE_MAX, NULL) : ct_errcode();
    ct_tensor *back = rc ? NULL : ct_to(t, CT_DEVICE_CPU);
    if (rc || !back) {
        rc = with_context("dist_new_group: comparing the lists of ranks");
    } else {
        const int64_t *r = ct_data_ptr(back);
        char buf[256];
        if (r[0] != -r[1])
            rc = ct__err_set(CT_EMISMATCH,
                             "dist_new_group: the ranks were given different lists (rank %d has "
                             "%s); every rank must pass the same list",
                             g.world.rank, list_str(buf, sizeof buf, ranks, n));
    }
    ct_scope_end();
    return rc;
}

int ct_dist_new_group(const int *ranks, int n, ct_comm **out) {
    if (!out)
        return ct__err_set(CT_EINVAL, "dist_new_group: out is NULL");
    *out = NULL;
    if (!g.initialized)
        return ct__err_set(CT_ESTATE, "dist_new_group: call ct_dist_init first");
    int size = g.world.size;
    /* More ranks than the world holds repeat one, which the loop reports. */
    if (!ranks || n < 1)
        return ct__err_set(CT_EINVAL, "dist_new_group: %d ranks%s; expected at least 1", n,
                           ranks ? "" : " in a NULL list");
    int *where = calloc((size_t)size, sizeof *where); /* 1 + a rank's index in the list */
    if (!where)
        return ct__err_set(CT_ENOMEM, "dist_new_group: %d ranks", size);
    int rc = 0, me = -1;
    for (int i = 0; i < n && !rc; i++) {
        int r = ranks[i];
        if (r < 0 || r >= size)
            rc = ct__err_set(CT_EINVAL,
                             "dist_new_group: ranks[%d] = %d is outside the world [0, %d)", i, r,
                             size);
        else if (where[r])
            rc = ct__err_set(CT_EINVAL,
                             "dist_new_group: rank %d is listed twice (ranks[%d] and "
                             "ranks[%d])",
                             r, where[r] - 1, i);
        else
            where[r] = i + 1;
    }
    if (!rc)
        me = where[g.world.rank] - 1;
    free(where);
    if (!rc)
        rc = check_same_list(ranks, n);
    if (rc)
        return rc;
    return ct_comm_split(g.comm, me >= 0 ? 0 : CT_COMM_SPLIT_NONE, me >= 0 ? me : 0, out);
}
