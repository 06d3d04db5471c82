/* Finding the world from the environment: ctlaunch's CT_* variables,
 * env:// (torchrun's RANK, WORLD_SIZE, ...), Open MPI's, PMI's (MPICH,
 * Intel MPI) and Slurm's, first match wins; none of them is a world of one.
 * For ct's own rendezvous it also finds where the ranks meet. */
#include "dist_impl.h"

#include "base_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The variables one launcher sets; local_* may be NULL when it has none. */
typedef struct source {
    ct_world_source id;
    const char *rank, *size, *local_rank, *local_size;
} source;

/* In the order they are tried. */
static const source sources[] = {
    {CT_WORLD_CTLAUNCH, "CT_RANK", "CT_WORLD_SIZE", "CT_LOCAL_RANK", "CT_LOCAL_WORLD_SIZE"},
    {CT_WORLD_ENV, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {CT_WORLD_OPENMPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {CT_WORLD_PMI, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {CT_WORLD_SLURM, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL},
};
#define NSOURCES  (sizeof sources / sizeof *sources)
#define MAX_RANKS (1 << 24)

/* Slurm's step ids from 0xfffffff0 up are its special steps: the batch
 * script (one process, though SLURM_NTASKS is the allocation's), the extern
 * step, an interactive allocation's shell. */
#define SLURM_SPECIAL_STEPS 0xfffffff0ul

const char *ct_world_source_name(ct_world_source s) {
    switch (s) {
    case CT_WORLD_SINGLE: return "single process";
    case CT_WORLD_CTLAUNCH: return "ctlaunch";
    case CT_WORLD_OPENMPI: return "Open MPI";
    case CT_WORLD_PMI: return "PMI";
    case CT_WORLD_SLURM: return "Slurm";
    case CT_WORLD_ENV: return "env://";
    }
    return "unknown";
}

/* The integer in variable name, which must lie in [lo, hi]; def when the
 * variable is unset (or required, when def < lo). */
static int read_int(const source *src, const char *name, long lo, long hi, long def, int *out) {
    const char *v = name ? getenv(name) : NULL;
    if (!v) {
        if (def < lo)
            return ct__err_set(CT_EINVAL,
                               "world: %s is unset, but the %s variables are there (%s is); set "
                               "it or unset them all",
                               name, ct_world_source_name(src->id), src->rank);
        *out = (int)def;
        return 0;
    }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi)
        return ct__err_set(CT_EINVAL, "world: %s=\"%s\" is not a whole number in [%ld, %ld]", name,
                           v, lo, hi);
    *out = (int)x;
    return 0;
}

/* A Slurm job step's id, which every srun task has; SLURM_STEPID is the
 * older name. */
static const char *slurm_step_id(void) {
    const char *id = getenv("SLURM_STEP_ID");
    return id ? id : getenv("SLURM_STEPID");
}

/* Whether src's variables describe this process: Slurm's only inside a
 * task step. */
static bool present(const source *src) {
    if (!getenv(src->rank) && !getenv(src->size))
        return false;
    if (src->id != CT_WORLD_SLURM)
        return true;
    const char *step = slurm_step_id();
    return step && strtoul(step, NULL, 10) < SLURM_SPECIAL_STEPS;
}

/* Rank, size and the local ones from src's variables. Without local
 * variables every rank is local, except under Slurm (the local size is not
 * a plain variable there, but a step on one node is all local) and env://
 * (PyTorchJob runs one rank per pod and says nothing), where local_size is
 * 0 and ct_dist_init finds out; local_rank is then -1 unless a variable
 * gives it. */
static int read_source(const source *src, ct_world *w) {
    int rc = read_int(src, src->size, 1, MAX_RANKS, -1, &w->size);
    if (!rc)
        rc = read_int(src, src->rank, 0, w->size - 1, -1, &w->rank);
    const char *nodes = getenv("SLURM_STEP_NUM_NODES");
    bool unsaid = (src->id == CT_WORLD_SLURM && !(nodes && !strcmp(nodes, "1"))) ||
                  (src->id == CT_WORLD_ENV && !getenv(src->local_size));
    if (!rc && unsaid) {
        w->local_size = 0;
        w->local_rank = -1;
        return getenv(src->local_rank)
                   ? read_int(src, src->local_rank, 0, w->size - 1, -1, &w->local_rank)
                   : 0;
    }
    if (!rc)
        rc = read_int(src, src->local_size, 1, w->size, w->size, &w->local_size);
    if (!rc)
        rc = read_int(src, src->local_rank, 0, w->local_size - 1, w->rank % w->local_size,
                      &w->local_rank);
    return rc;
}

/* Copies the text of variable name into out (cap bytes). */
static int copy_var(const char *name, const char *v, char *out, size_t cap) {
    if (strlen(v) >= cap || !*v)
        return ct__err_set(CT_EINVAL, "world: %s=\"%.40s\" is %s; expected 1 to %zu bytes", name, v,
                           *v ? "too long" : "empty", cap - 1);
    strcpy(out, v);
    return 0;
}

/* The first host of a Slurm host list ("node[07-09,12],gpu1" -> "node07"):
 * the first name at the top level, each bracketed range replaced by its
 * first number as written (leading zeros kept). */
static int first_host(const char *list, char *out, size_t cap) {
    size_t n = 0;
    for (const char *p = list; *p && *p != ','; p++) {
        if (*p == '[') {
            for (p++; *p >= '0' && *p <= '9'; p++)
                if (n + 1 < cap)
                    out[n++] = *p;
            while (*p && *p != ']')
                p++;
            if (!*p)
                break;
        } else if (n + 1 < cap) {
            out[n++] = *p;
        }
    }
    out[n] = 0;
    return n && n + 1 < cap ? 0
                            : ct__err_set(CT_EINVAL,
                                          "world: cannot take the first host of the Slurm node "
                                          "list \"%.80s\"",
                                          list);
}

/* The store's place for env://: MASTER_ADDR and MASTER_PORT, the port one
 * up when torchrun's agent serves its own store on MASTER_PORT
 * (TORCHELASTIC_USE_AGENT_STORE=True); CT_MASTER_ADDR and CT_MASTER_PORT
 * override either. A world of one needs none. */
static int env_master(ct_world *w) {
    static const source master = {CT_WORLD_ENV, "MASTER_ADDR", NULL, NULL, NULL};
    const char *addr = getenv("CT_MASTER_ADDR"), *addr_var = "CT_MASTER_ADDR";
    if (!addr)
        addr = getenv(addr_var = "MASTER_ADDR");
    int own_port = getenv("CT_MASTER_PORT") != NULL;
    const char *port_var = own_port ? "CT_MASTER_PORT" : "MASTER_PORT";
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    int offset = !own_port && agent && !strcmp(agent, "True");
    if (w->size == 1)
        return 0;
    if (!addr)
        return ct__err_set(CT_EINVAL,
                           "world: env:// (RANK, WORLD_SIZE) says %d ranks, but MASTER_ADDR is "
                           "unset, so they have nowhere to meet; set MASTER_ADDR and "
                           "MASTER_PORT to rank 0's host and a free port (torchrun sets both)",
                           w->size);
    int rc = copy_var(addr_var, addr, w->master_addr, sizeof w->master_addr);
    if (!rc)
        rc = read_int(&master, port_var, 1, 65535 - offset, -1, &w->master_port);
    w->master_port += offset;
    return rc;
}

/* The store's place for a Slurm step without PMI: the first host of the
 * step's nodes, where task 0 runs, and a port from the job and step ids, so
 * that the steps and jobs that share a node seldom collide: 15000 + (job %
 * 1000) * 10 + step % 10. CT_MASTER_ADDR and CT_MASTER_PORT override. With
 * PMI (srun --mpi=pmix or pmi2) MPI brings the ranks together instead. */
static int slurm_master(ct_world *w) {
    static const source slurm = {CT_WORLD_SLURM, "SLURM_PROCID", NULL, NULL, NULL};
    if (w->size == 1 || getenv("PMIX_RANK") || getenv("PMI_FD"))
        return 0;
    const char *addr = getenv("CT_MASTER_ADDR"), *list = getenv("SLURM_STEP_NODELIST");
    if (!list)
        list = getenv("SLURM_JOB_NODELIST");
    int rc = addr ? copy_var("CT_MASTER_ADDR", addr, w->master_addr, sizeof w->master_addr)
             : list
                 ? first_host(list, w->master_addr, sizeof w->master_addr)
                 : ct__err_set(CT_EINVAL, "world: a Slurm step without PMI, and without "
                                          "SLURM_STEP_NODELIST or SLURM_JOB_NODELIST to meet at");
    if (rc)
        return rc;
    if (getenv("CT_MASTER_PORT"))
        return read_int(&slurm, "CT_MASTER_PORT", 1, 65535, -1, &w->master_port);
    int job = 0;
    rc = read_int(&slurm, "SLURM_JOB_ID", 0, INT32_MAX, -1, &job);
    if (!rc)
        w->master_port = 15000 + (job % 1000) * 10 + (int)(strtoul(slurm_step_id(), NULL, 10) % 10);
    return rc;
}

/* env:// set by hand or by an operator claims to describe this process,
 * as an MPI launcher's or a Slurm step's variables do: they must agree.
 * torchrun (TORCHELASTIC_RUN_ID), like ctlaunch and mpirun, is a launcher
 * of its own that may run inside another job, whose variables then
 * describe the outer job. */
static int check_agree(const source *chosen, const ct_world *w) {
    if (chosen->id != CT_WORLD_ENV || getenv("TORCHELASTIC_RUN_ID"))
        return 0;
    for (const source *o = chosen + 1; o < sources + NSOURCES; o++) {
        ct_world other = {0};
        if (!present(o) || read_source(o, &other) != 0) {
            ct_errclear();
            continue;
        }
        if (other.rank != w->rank || other.size != w->size)
            return ct__err_set(CT_EINVAL,
                               "world: the environment describes two worlds: env:// says rank "
                               "%d of %d (RANK, WORLD_SIZE), %s says rank %d of %d (%s, %s); "
                               "unset the variables that do not describe this job",
                               w->rank, w->size, ct_world_source_name(o->id), other.rank,
                               other.size, o->rank, o->size);
    }
    return 0;
}

/* The IPv4 address host names, in out. */
static int resolve_ipv4(const char *host, char out[INET_ADDRSTRLEN]) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int err = getaddrinfo(host, NULL, &hints, &res);
    if (err || !res)
        return ct__err_set(CT_EINVAL, "cannot resolve '%s': %s", host,
                           err ? gai_strerror(err) : "no IPv4 address");
    inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, out, INET_ADDRSTRLEN);
    freeaddrinfo(res);
    return 0;
}

int ct__dist_listen_address(const ct_world *w, const char *name, char bind[CT__BIND_LEN],
                            char host[256]) {
    bool one_machine = w->local_size == w->size;
    bool spans = w->local_size > 0 && !one_machine; /* 0: not known yet */
    if (name)
        snprintf(host, 256, "%s", name);
    else if (one_machine)
        snprintf(host, 256, "127.0.0.1");
    else if (gethostname(host, 255) != 0)
        return ct__err_set(CT_EIO, "gethostname: %s", strerror(errno));
    host[255] = 0;
    const char *forced = getenv("CT_BIND_ADDR");
    if (forced) {
        snprintf(bind, CT__BIND_LEN, "%s", forced);
        return 0;
    }
    int rc = resolve_ipv4(host, bind);
    if (rc == 0 && spans && strncmp(bind, "127.", 4) == 0)
        rc = ct__err_set(CT_EINVAL,
                         "the ranks span machines, but '%s' resolves to the loopback address %s, "
                         "which the other machines cannot reach; set CT_MASTER_ADDR (the store) or "
                         "CT_BIND_ADDR to this host's address on the ranks' network",
                         host, bind);
    return rc;
}

int ct__dist_env_limit(const char *name, size_t def, size_t *out) {
    const char *v = getenv(name);
    if (!v) {
        *out = def;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *v == '-' || *end || errno || x == 0 || x > SIZE_MAX)
        return ct__err_set(CT_EINVAL, "%s=\"%s\" is not a whole number in [1, %zu] (default %zu)",
                           name, v, (size_t)SIZE_MAX, def);
    *out = (size_t)x;
    return 0;
}

int ct_world_from_env(ct_world *w) {
    if (!w)
        return ct__err_set(CT_EINVAL, "world_from_env: NULL world");
    *w = (ct_world){.size = 1, .local_size = 1, .source = CT_WORLD_SINGLE, .master_port = -1};
    const source *src = NULL;
    for (size_t i = 0; i < NSOURCES && !src; i++)
        if (present(&sources[i]))
            src = &sources[i];
    if (!src)
        return 0;
    int rc = read_source(src, w);
    if (!rc)
        rc = check_agree(src, w);
    if (!rc && src->id == CT_WORLD_CTLAUNCH) {
        rc = read_int(src, "CT_RESTART_COUNT", 0, MAX_RANKS, 0, &w->restart_count);
        const char *addr = getenv("CT_MASTER_ADDR");
        if (!rc && addr)
            rc = copy_var("CT_MASTER_ADDR", addr, w->master_addr, sizeof w->master_addr);
        if (!rc && addr)
            rc = read_int(src, "CT_MASTER_PORT", 1, 65535, -1, &w->master_port);
    } else if (!rc && src->id == CT_WORLD_ENV) {
        rc = read_int(src, "TORCHELASTIC_RESTART_COUNT", 0, MAX_RANKS, 0, &w->restart_count);
        if (!rc)
            rc = env_master(w);
    } else if (!rc && src->id == CT_WORLD_SLURM) {
        rc = slurm_master(w);
    }
    if (rc)
        *w = (ct_world){.size = 1, .local_size = 1, .source = CT_WORLD_SINGLE, .master_port = -1};
    else
        w->source = src->id;
    return rc;
}
