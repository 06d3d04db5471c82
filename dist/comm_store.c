/* A ct_comm_store over a ct_store client of its own: how dist/ hands the
 * gloo backend the store, which collectives/ does not know (it lies below
 * dist/). The client is this adapter's alone, behind a mutex, since a
 * ct_store client takes one thread at a time and the communicators call
 * from their own threads. A long get waits in short slices, so that one
 * communicator's rendezvous does not hold the lock for the others' quick
 * calls (a published progress, a failure notice). */
#include "dist_impl.h"
#include "base_impl.h"

#include <pthread.h>
#include <stdlib.h>

/* How long one slice of a waiting get holds the client. */
#define GET_SLICE_S 0.05

struct ct__dist_comm_store {
    ct_comm_store fns;
    ct_store *client;
    pthread_mutex_t mu;
};

static int store_set(void *ctx, const char *key, const void *value, size_t len) {
    ct__dist_comm_store *s = ctx;
    pthread_mutex_lock(&s->mu);
    int rc = ct_store_set(s->client, key, value, len, -1);
    pthread_mutex_unlock(&s->mu);
    return rc;
}

static int store_get(void *ctx, const char *key, double timeout_s, void **value, size_t *len) {
    ct__dist_comm_store *s = ctx;
    *value = NULL;
    *len = 0;
    double until = ct__now() + timeout_s;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        bool exists = true;
        int rc = timeout_s > 0 ? 0 : ct_store_check(s->client, &key, 1, &exists, -1);
        if (!rc && !exists)
            rc = ct__err_set(CT_ETIMEDOUT, "store: key '%s' is not there", key);
        else if (!rc) {
            double left = until - ct__now();
            rc = ct_store_get(s->client, key, value, len,
                              timeout_s <= 0       ? -1
                              : left < GET_SLICE_S ? left
                                                   : GET_SLICE_S);
        }
        pthread_mutex_unlock(&s->mu);
        if (rc != CT_ETIMEDOUT || timeout_s <= 0 || ct__now() + 1e-3 >= until)
            return rc;
    }
}

int ct__dist_comm_store_new(const char *host, int port, double timeout_s,
                            ct__dist_comm_store **out) {
    *out = NULL;
    ct__dist_comm_store *s = calloc(1, sizeof *s);
    if (!s)
        return ct__err_set(CT_ENOMEM, "out of memory for a store adapter");
    if (!(s->client = ct_store_connect(host, port, timeout_s))) {
        free(s);
        return ct_errcode();
    }
    pthread_mutex_init(&s->mu, NULL);
    s->fns = (ct_comm_store){.ctx = s, .set = store_set, .get = store_get};
    *out = s;
    return 0;
}

const ct_comm_store *ct__dist_comm_store_fns(const ct__dist_comm_store *s) { return &s->fns; }

void ct__dist_comm_store_free(ct__dist_comm_store *s) {
    if (!s)
        return;
    ct_store_free(s->client);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
