/* Finding the world from the environment: ctlaunch's CT_* variables, Open
 * MPI's, PMI's (MPICH, Intel MPI) and Slurm's, first match wins; none of
 * them is a world of one. */
#include "dist_impl.h"

#include "base_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The variables one launcher sets; local_* may be NULL when it has none. */
typedef struct source {
    ct_world_source id;
    const char *rank, *size, *local_rank, *local_size;
} source;

static const source sources[] = {
    {CT_WORLD_CTLAUNCH, "CT_RANK", "CT_WORLD_SIZE", "CT_LOCAL_RANK", "CT_LOCAL_WORLD_SIZE"},
    {CT_WORLD_OPENMPI, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {CT_WORLD_PMI, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {CT_WORLD_SLURM, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL},
};

const char *ct_world_source_name(ct_world_source s) {
    switch (s) {
    case CT_WORLD_SINGLE: return "single process";
    case CT_WORLD_CTLAUNCH: return "ctlaunch";
    case CT_WORLD_OPENMPI: return "Open MPI";
    case CT_WORLD_PMI: return "PMI";
    case CT_WORLD_SLURM: return "Slurm";
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
    if (rc == 0 && !one_machine && strncmp(bind, "127.", 4) == 0)
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
    for (size_t i = 0; i < sizeof sources / sizeof *sources && !src; i++)
        if (getenv(sources[i].rank) || getenv(sources[i].size))
            src = &sources[i];
    if (!src)
        return 0;
    const int max = 1 << 24;
    int rc = read_int(src, src->size, 1, max, -1, &w->size);
    if (!rc)
        rc = read_int(src, src->rank, 0, w->size - 1, -1, &w->rank);
    if (!rc)
        rc = read_int(src, src->local_size, 1, w->size, w->size, &w->local_size);
    if (!rc)
        rc = read_int(src, src->local_rank, 0, w->local_size - 1, w->rank % w->local_size,
                      &w->local_rank);
    if (!rc && src->id == CT_WORLD_SLURM)
        w->local_size = 0; /* not given by a plain variable: the backend finds it */
    if (!rc && src->id == CT_WORLD_CTLAUNCH) {
        rc = read_int(src, "CT_RESTART_COUNT", 0, max, 0, &w->restart_count);
        const char *addr = getenv("CT_MASTER_ADDR");
        if (!rc && addr) {
            if (strlen(addr) >= sizeof w->master_addr)
                rc = ct__err_set(CT_EINVAL, "world: CT_MASTER_ADDR is longer than %zu bytes",
                                 sizeof w->master_addr - 1);
            else
                strcpy(w->master_addr, addr);
        }
        if (!rc && addr)
            rc = read_int(src, "CT_MASTER_PORT", 1, 65535, -1, &w->master_port);
    }
    w->source = rc ? CT_WORLD_SINGLE : src->id;
    return rc;
}
