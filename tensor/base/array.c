/* The growable array (base_impl.h). */
#include "base_impl.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* The first allocation: small arrays pay one realloc, not four. */
#define ARRAY_FIRST 16

int ct__array_grow(void *items, size_t *cap, size_t need, size_t elem, size_t limit,
                   const char *what) {
    if (need <= *cap)
        return 0;
    if (limit && need > limit)
        return ct__err_set(CT_ENOMEM, "%s: %zu entries would pass the limit of %zu", what, need,
                           limit);
    size_t most = SIZE_MAX / (elem ? elem : 1);
    if (limit && limit < most)
        most = limit;
    if (need > most)
        return ct__err_set(CT_ENOMEM, "%s: out of memory: %zu entries of %zu bytes overflow size_t",
                           what, need, elem);
    size_t ncap = *cap <= most / 2 ? 2 * *cap : most;
    if (ncap < ARRAY_FIRST)
        ncap = ARRAY_FIRST <= most ? ARRAY_FIRST : most;
    if (ncap < need)
        ncap = need;
    void *old;
    memcpy(&old, items, sizeof old);
    void *grown = realloc(old, ncap * elem);
    if (!grown)
        return ct__err_set(CT_ENOMEM, "%s: out of memory for %zu entries of %zu bytes", what, ncap,
                           elem);
    memcpy(items, &grown, sizeof grown);
    *cap = ncap;
    return 0;
}

int ct__array_grow_int(void *items, int *cap, int need, size_t elem, int limit, const char *what) {
    CT_ASSERT(need >= 0 && *cap >= 0);
    size_t c = (size_t)*cap;
    int rc =
        ct__array_grow(items, &c, (size_t)need, elem, (size_t)(limit > 0 ? limit : INT_MAX), what);
    if (rc == 0)
        *cap = (int)c;
    return rc;
}
