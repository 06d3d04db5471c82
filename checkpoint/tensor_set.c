/* ct_tensor_dict: named tensors and string metadata in insertion order, what
 * a safetensors file holds. Names and metadata keys are looked up through
 * hash indexes, so that loading a file of many tensors (adding each after a
 * duplicate check) stays linear. */
#include <ct/checkpoint.h>

#include "base_impl.h"
#include "safetensors_impl.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SET_MAGIC 0x63745444u /* "ctTD" */
#define SET_DEAD  0xdead5e75u

/* Maps a name to its position in an array of named entries. Open
 * addressing with linear probing; a slot holds position + 1, 0 is empty.
 * The table is kept at most half full. */
typedef struct name_index {
    uint32_t *slots;
    size_t cap; /* a power of two, or 0 */
} name_index;

typedef struct entry {
    char *name;
    ct_tensor *t; /* a reference the dict owns */
} entry;

typedef struct meta_entry {
    char *key, *value;
} meta_entry;

struct ct_tensor_dict {
    uint32_t magic;
    int n, cap;
    entry *entries;
    name_index by_name;
    int nmeta, metacap;
    meta_entry *meta;
    name_index by_key;
};

static uint64_t hash_name(const char *s) {
    uint64_t h = 0xcbf29ce484222325u; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3u;
    return h;
}

/* The slot that holds name, or the empty slot where it would go.
 * name_at(owner, i) gives the name at position i. */
static size_t index_probe(const name_index *ix, const char *name,
                          const char *(*name_at)(const void *, uint32_t), const void *owner) {
    size_t mask = ix->cap - 1;
    for (size_t i = hash_name(name) & mask;; i = (i + 1) & mask) {
        uint32_t s = ix->slots[i];
        if (s == 0 || strcmp(name_at(owner, s - 1), name) == 0)
            return i;
    }
}

/* Position of name, or -1. */
static int index_find(const name_index *ix, const char *name,
                      const char *(*name_at)(const void *, uint32_t), const void *owner) {
    if (ix->cap == 0)
        return -1;
    uint32_t s = ix->slots[index_probe(ix, name, name_at, owner)];
    return s ? (int)(s - 1) : -1;
}

/* Rebuilds the index over positions [0, n) with room for at least want
 * entries. Returns false when out of memory (the index is unchanged). */
static bool index_rebuild(name_index *ix, int n, size_t want,
                          const char *(*name_at)(const void *, uint32_t), const void *owner) {
    size_t cap = 16;
    while (cap < 2 * want)
        cap *= 2;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots)
        return false;
    free(ix->slots);
    *ix = (name_index){slots, cap};
    for (int i = 0; i < n; i++)
        slots[index_probe(ix, name_at(owner, (uint32_t)i), name_at, owner)] = (uint32_t)i + 1;
    return true;
}

/* Makes room for one more entry (of n) in the index. */
static bool index_reserve(name_index *ix, int n, const char *(*name_at)(const void *, uint32_t),
                          const void *owner) {
    if (2 * ((size_t)n + 1) <= ix->cap)
        return true;
    return index_rebuild(ix, n, (size_t)n + 1, name_at, owner);
}

static const char *tensor_name_at(const void *set, uint32_t i) {
    return ((const ct_tensor_dict *)set)->entries[i].name;
}

static const char *meta_key_at(const void *set, uint32_t i) {
    return ((const ct_tensor_dict *)set)->meta[i].key;
}

static int check(const char *fn, const ct_tensor_dict *set) {
    if (!set)
        return ct__err_set(CT_EINVAL, "%s: dict is NULL", fn);
    if (set->magic != SET_MAGIC)
        return ct__err_set(CT_EINVAL, "%s: %p is not a live tensor dict (freed or foreign)", fn,
                           (const void *)set);
    return 0;
}

/* A string safetensors can carry: a safetensors header is UTF-8 JSON. */
static int check_text(const char *fn, const char *what, const char *s) {
    if (!s)
        return ct__err_set(CT_EINVAL, "%s: %s is NULL", fn, what);
    size_t bad;
    if (!ct__ckpt_utf8_valid(s, strlen(s), &bad))
        return ct__err_set(
            CT_EINVAL,
            "%s: %s \"%.64s\" is not valid UTF-8 (byte %zu); safetensors headers are "
            "UTF-8 JSON",
            fn, what, s, bad);
    return 0;
}

ct_tensor_dict *ct_tensor_dict_new(void) {
    ct_tensor_dict *set = calloc(1, sizeof *set);
    if (!set) {
        ct__err_set(CT_ENOMEM, "tensor_dict_new: out of memory");
        return NULL;
    }
    set->magic = SET_MAGIC;
    return set;
}

void ct_tensor_dict_free(ct_tensor_dict *set) {
    if (!set)
        return;
    CT_ASSERT(set->magic == SET_MAGIC && "ct_tensor_dict_free on a freed or foreign pointer");
    for (int i = 0; i < set->n; i++) {
        free(set->entries[i].name);
        ct_tensor_free(set->entries[i].t);
    }
    for (int i = 0; i < set->nmeta; i++) {
        free(set->meta[i].key);
        free(set->meta[i].value);
    }
    free(set->entries);
    free(set->by_name.slots);
    free(set->meta);
    free(set->by_key.slots);
    set->magic = SET_DEAD;
    free(set);
}

int ct_tensor_dict_add(ct_tensor_dict *set, const char *name, ct_tensor *t) {
    static const char fn[] = "tensor_dict_add";
    int rc = check(fn, set);
    if (rc == 0)
        rc = check_text(fn, "name", name);
    if (rc)
        return rc;
    if (!name[0])
        return ct__err_set(CT_EINVAL, "%s: name is empty", fn);
    /* The header's one key that is not a tensor: a tensor under it would
     * make a file no reader can load. */
    if (strcmp(name, "__metadata__") == 0)
        return ct__err_set(CT_EINVAL,
                           "%s: \"__metadata__\" is reserved for the metadata; it cannot name a "
                           "tensor",
                           fn);
    if (!t) {
        /* A failed op upstream: keep its message, which says what broke. */
        if (ct_errcode() != CT_OK)
            return ct_errcode();
        return ct__err_set(CT_EINVAL, "%s: tensor '%.200s' is NULL", fn, name);
    }
    if (CT__CHECK_ANY(fn, t))
        return ct__err_set(CT_EINVAL, "%s: tensor '%.200s' is not a live tensor (freed or foreign)",
                           fn, name);
    if (index_find(&set->by_name, name, tensor_name_at, set) >= 0)
        return ct__err_set(CT_EINVAL, "%s: the dict already has a tensor named '%.200s'", fn, name);
    char *copy = strdup(name);
    if (!copy || CT__GROW(set->entries, &set->cap, set->n + 1, 0, fn) ||
        !index_reserve(&set->by_name, set->n, tensor_name_at, set)) {
        free(copy);
        return ct__err_set(CT_ENOMEM, "%s: out of memory adding tensor '%.200s'", fn, name);
    }
    set->entries[set->n] = (entry){copy, ct_tensor_retain(t)};
    set->by_name.slots[index_probe(&set->by_name, copy, tensor_name_at, set)] =
        (uint32_t)set->n + 1;
    set->n++;
    return 0;
}

int ct_tensor_dict_count(const ct_tensor_dict *set) {
    int rc = check("tensor_dict_count", set);
    return rc ? rc : set->n;
}

/* Whether i indexes the dict's tensors (or its metadata entries); sets the
 * error when not. */
static bool check_index(const char *fn, const ct_tensor_dict *set, int i, bool meta) {
    if (check(fn, set))
        return false;
    int n = meta ? set->nmeta : set->n;
    if (i < 0 || i >= n) {
        ct__err_set(CT_ERANGE, "%s: index %d is out of range (the dict has %d %s)", fn, i, n,
                    meta ? "metadata entries" : "tensors");
        return false;
    }
    return true;
}

const char *ct_tensor_dict_name(const ct_tensor_dict *set, int i) {
    return check_index("tensor_dict_name", set, i, false) ? set->entries[i].name : NULL;
}

ct_tensor *ct_tensor_dict_tensor(const ct_tensor_dict *set, int i) {
    return check_index("tensor_dict_tensor", set, i, false) ? set->entries[i].t : NULL;
}

ct_tensor *ct_tensor_dict_find(const ct_tensor_dict *set, const char *name) {
    if (check("tensor_dict_find", set) || !name)
        return NULL;
    int i = index_find(&set->by_name, name, tensor_name_at, set);
    return i >= 0 ? set->entries[i].t : NULL;
}

/* Removes metadata entry i, keeping the order of the rest. */
static void meta_remove(ct_tensor_dict *set, int i) {
    free(set->meta[i].key);
    free(set->meta[i].value);
    memmove(&set->meta[i], &set->meta[i + 1], (size_t)(set->nmeta - i - 1) * sizeof *set->meta);
    set->nmeta--;
    /* Positions after i moved: rebuild in place (same capacity, so no
     * allocation can fail). */
    memset(set->by_key.slots, 0, set->by_key.cap * sizeof *set->by_key.slots);
    for (int k = 0; k < set->nmeta; k++)
        set->by_key.slots[index_probe(&set->by_key, set->meta[k].key, meta_key_at, set)] =
            (uint32_t)k + 1;
}

int ct_tensor_dict_set_meta(ct_tensor_dict *set, const char *key, const char *value) {
    static const char fn[] = "tensor_dict_set_meta";
    int rc = check(fn, set);
    if (rc == 0)
        rc = check_text(fn, "key", key);
    if (rc == 0 && value)
        rc = check_text(fn, "value", value);
    if (rc)
        return rc;
    int i = index_find(&set->by_key, key, meta_key_at, set);
    if (!value) {
        if (i >= 0)
            meta_remove(set, i);
        return 0;
    }
    char *v = strdup(value);
    if (!v)
        return ct__err_set(CT_ENOMEM, "%s: out of memory for the value of '%.200s'", fn, key);
    if (i >= 0) {
        free(set->meta[i].value);
        set->meta[i].value = v;
        return 0;
    }
    char *k = strdup(key);
    if (!k || CT__GROW(set->meta, &set->metacap, set->nmeta + 1, 0, fn) ||
        !index_reserve(&set->by_key, set->nmeta, meta_key_at, set)) {
        free(k);
        free(v);
        return ct__err_set(CT_ENOMEM, "%s: out of memory adding key '%.200s'", fn, key);
    }
    set->meta[set->nmeta] = (meta_entry){k, v};
    set->by_key.slots[index_probe(&set->by_key, k, meta_key_at, set)] = (uint32_t)set->nmeta + 1;
    set->nmeta++;
    return 0;
}

const char *ct_tensor_dict_meta(const ct_tensor_dict *set, const char *key) {
    if (check("tensor_dict_meta", set) || !key)
        return NULL;
    int i = index_find(&set->by_key, key, meta_key_at, set);
    return i >= 0 ? set->meta[i].value : NULL;
}

int ct_tensor_dict_num_meta(const ct_tensor_dict *set) {
    int rc = check("tensor_dict_num_meta", set);
    return rc ? rc : set->nmeta;
}

int ct_tensor_dict_meta_at(const ct_tensor_dict *set, int i, const char **key, const char **value) {
    static const char fn[] = "tensor_dict_meta_at";
    if (!check_index(fn, set, i, true))
        return ct_errcode();
    if (key)
        *key = set->meta[i].key;
    if (value)
        *value = set->meta[i].value;
    return 0;
}
