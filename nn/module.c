/* The module tree: named parameters, buffers and children, paths, training
 * mode, and flat parameter buffers. */
#include "nn_impl.h"

#include <ct/cuda.h>

#include <stdio.h>
#include <stdlib.h>

#define MODULE_MAGIC 0x63744d31u /* "ctM1" */

struct ct_module {
    uint32_t magic;
    const char *type;
    ct_forward_fn forward;
    void *state;
    void (*free_state)(void *state);
    bool training;
    ct_module *parent;
    char *name; /* under the parent */
    char *path; /* cached dotted path, NULL until asked for */
    ct_param_list params, buffers;
    int nchildren, children_cap;
    ct_module **children;
    ct_tensor *flat_params, *flat_grads;
    ct_module_pre_hook pre;
    ct_module_post_hook post;
    void *hooks_ctx;
};

/* ------------------------------------------------------- parameter lists */

void ct_param_list_init(ct_param_list *pl) { *pl = (ct_param_list){0}; }

void ct_param_list_free(ct_param_list *pl) {
    if (!pl)
        return;
    for (int i = 0; i < pl->n; i++) {
        free(pl->names[i]);
        ct_tensor_free(pl->tensors[i]);
    }
    free(pl->names);
    free(pl->tensors);
    *pl = (ct_param_list){0};
}

int ct_param_list_add(ct_param_list *pl, const char *name, ct_tensor *t) {
    if (!pl || !name || !t)
        return ct__err_set(t              ? CT_EINVAL
                           : ct_errcode() ? ct_errcode()
                                          : CT_EINVAL,
                           "param_list_add: %s", !t ? "NULL tensor" : "NULL list or name");
    /* Both arrays hold pl->cap; each grows to the same new capacity. */
    int names_cap = pl->cap, tensors_cap = pl->cap;
    CT_TRY(CT__GROW(pl->names, &names_cap, pl->n + 1, 0, "param_list_add: names"));
    CT_TRY(CT__GROW(pl->tensors, &tensors_cap, pl->n + 1, 0, "param_list_add: tensors"));
    pl->cap = tensors_cap;
    char *copy = strdup(name);
    if (!copy)
        return ct__err_set(CT_ENOMEM, "param_list_add: out of memory");
    pl->names[pl->n] = copy;
    pl->tensors[pl->n++] = ct_tensor_retain(t);
    return 0;
}

static int find_index(const ct_param_list *pl, const char *name) {
    for (int i = 0; pl && name && i < pl->n; i++)
        if (strcmp(pl->names[i], name) == 0)
            return i;
    return -1;
}

ct_tensor *ct_param_list_find(const ct_param_list *pl, const char *name) {
    int i = find_index(pl, name);
    return i >= 0 ? pl->tensors[i] : NULL;
}

int64_t ct_param_list_numel(const ct_param_list *pl) {
    int64_t n = 0;
    for (int i = 0; pl && i < pl->n; i++)
        n += ct_numel(pl->tensors[i]);
    return n;
}

/* --------------------------------------------------------------- modules */

static int check_module(const char *op, const ct_module *m) {
    if (!m)
        return ct_errcode() ? ct_errcode() : ct__err_set(CT_EINVAL, "%s: NULL module", op);
    if (m->magic != MODULE_MAGIC)
        return ct__err_set(CT_EINVAL, "%s: not a module (freed or foreign pointer)", op);
    return 0;
}

ct_module *ct_module_new(const char *type, ct_forward_fn forward, void *state,
                         void (*free_state)(void *state)) {
    ct_module *m = calloc(1, sizeof *m);
    if (!m) {
        if (free_state)
            free_state(state);
        ct__err_set(CT_ENOMEM, "module_new: out of memory");
        return NULL;
    }
    m->magic = MODULE_MAGIC;
    m->type = type ? type : "Module";
    m->forward = forward;
    m->state = state;
    m->free_state = free_state;
    m->training = true;
    return m;
}

void ct_module_free(ct_module *m) {
    if (!m || m->magic != MODULE_MAGIC)
        return;
    for (int i = 0; i < m->nchildren; i++)
        ct_module_free(m->children[i]);
    free(m->children);
    ct_param_list_free(&m->params);
    ct_param_list_free(&m->buffers);
    ct_tensor_free(m->flat_params);
    ct_tensor_free(m->flat_grads);
    if (m->free_state)
        m->free_state(m->state);
    free(m->name);
    free(m->path);
    m->magic = 0;
    free(m);
}

const char *ct_module_type(const ct_module *m) { return m ? m->type : NULL; }
void *ct_module_state(const ct_module *m) { return m ? m->state : NULL; }

const char *ct_module_path(ct_module *m) {
    if (!m)
        return NULL;
    if (m->path)
        return m->path;
    if (!m->parent)
        return "";
    const char *up = ct_module_path(m->parent);
    size_t len = strlen(up) + strlen(m->name) + 2;
    m->path = malloc(len);
    if (!m->path)
        return m->name;
    snprintf(m->path, len, "%s%s%s", up, *up ? "." : "", m->name);
    return m->path;
}

/* Paths below m are recomputed the next time they are asked for. */
static void forget_paths(ct_module *m) {
    free(m->path);
    m->path = NULL;
    for (int i = 0; i < m->nchildren; i++)
        forget_paths(m->children[i]);
}

/* How a module is named in messages: its type and, in a tree, its path. */
static const char *who(ct_module *m, char *buf, size_t cap) {
    const char *path = ct_module_path(m);
    snprintf(buf, cap, "%s%s%s%s", m->type, *path ? " '" : "", path, *path ? "'" : "");
    return buf;
}

ct_tensor *ct_module_forward(ct_module *m, ct_tensor *x) {
    if (check_module("module_forward", m))
        return NULL;
    char desc[160];
    if (!m->forward) {
        ct__err_set(CT_EINVAL, "module_forward: %s has no forward function",
                    who(m, desc, sizeof desc));
        return NULL;
    }
    int rc = m->pre ? m->pre(m, m->hooks_ctx) : 0;
    if (rc) {
        ct__err_set(rc, "%s: before its forward: %s", who(m, desc, sizeof desc), ct_errmsg());
        return NULL;
    }
    ct_tensor *y;
    if (!ct_anomaly_enabled()) {
        y = m->forward(m, x);
    } else {
        const char *prev = ct_autograd_set_label(ct_module_path(m));
        y = m->forward(m, x);
        ct_autograd_set_label(prev);
    }
    if (y && m->post && (rc = m->post(m, y, m->hooks_ctx))) {
        ct__err_set(rc, "%s: after its forward: %s", who(m, desc, sizeof desc), ct_errmsg());
        return NULL;
    }
    return y;
}

int ct_module_set_forward_hooks(ct_module *m, ct_module_pre_hook pre, ct_module_post_hook post,
                                void *ctx) {
    CT_TRY(check_module("module_set_forward_hooks", m));
    char desc[160];
    CT_REQUIRE(!(pre || post) || !(m->pre || m->post), CT_ESTATE,
               "module_set_forward_hooks: %s has forward hooks already (a module wrapped twice?)",
               who(m, desc, sizeof desc));
    m->pre = pre;
    m->post = post;
    m->hooks_ctx = ctx;
    return 0;
}

static int check_name(ct_module *m, const char *op, const char *name) {
    char desc[160];
    if (!name || !*name || strchr(name, '.'))
        return ct__err_set(CT_EINVAL,
                           "%s: invalid name '%s' in %s: names are non-empty and have no "
                           "'.'",
                           op, name ? name : "(null)", who(m, desc, sizeof desc));
    if (find_index(&m->params, name) >= 0 || find_index(&m->buffers, name) >= 0 ||
        ct_module_child(m, name))
        return ct__err_set(CT_EINVAL, "%s: %s already has something named '%s'", op,
                           who(m, desc, sizeof desc), name);
    return 0;
}

static int add_tensor(ct_module *m, const char *op, const char *name, ct_tensor *t, bool param) {
    int rc = check_module(op, m);
    if (!rc && !t)
        rc = ct_errcode() ? ct_errcode() : ct__err_set(CT_EINVAL, "%s: NULL tensor", op);
    if (!rc)
        rc = check_name(m, op, name);
    char desc[160], td[CT__DESC_STR];
    if (!rc && param && !ct_dtype_is_float(ct_tensor_dtype(t)))
        rc = ct__err_set(CT_EDTYPE, "%s: parameter '%s' of %s is %s; parameters must be float", op,
                         name, who(m, desc, sizeof desc), ct__tensor_desc(td, t));
    if (!rc && param && !ct_requires_grad_(t, true))
        rc = ct_errcode();
    if (!rc)
        rc = ct_param_list_add(param ? &m->params : &m->buffers, name, t);
    ct_tensor_free(t);
    return rc;
}

int ct_module_add_param(ct_module *m, const char *name, ct_tensor *t) {
    return add_tensor(m, "module_add_param", name, t, true);
}

int ct_module_add_buffer(ct_module *m, const char *name, ct_tensor *t) {
    return add_tensor(m, "module_add_buffer", name, t, false);
}

int ct_module_add_child(ct_module *m, const char *name, ct_module *child) {
    int rc = check_module("module_add_child", m);
    if (!rc)
        rc = check_module("module_add_child", child);
    if (!rc && child->parent)
        rc = ct__err_set(CT_EINVAL, "module_add_child: the module is already a child of another");
    if (!rc)
        rc = check_name(m, "module_add_child", name);
    if (!rc)
        rc = CT__GROW(m->children, &m->children_cap, m->nchildren + 1, 0,
                      "module_add_child: children");
    char *copy = rc ? NULL : strdup(name);
    if (!rc && !copy)
        rc = ct__err_set(CT_ENOMEM, "module_add_child: out of memory");
    if (rc) {
        if (child && child->magic == MODULE_MAGIC && !child->parent)
            ct_module_free(child);
        return rc;
    }
    child->name = copy;
    child->parent = m;
    forget_paths(child);
    m->children[m->nchildren++] = child;
    return 0;
}

ct_tensor *ct_module_param(const ct_module *m, const char *name) {
    return m ? ct_param_list_find(&m->params, name) : NULL;
}

ct_tensor *ct_module_buffer(const ct_module *m, const char *name) {
    return m ? ct_param_list_find(&m->buffers, name) : NULL;
}

ct_module *ct_module_child(const ct_module *m, const char *name) {
    for (int i = 0; m && name && i < m->nchildren; i++)
        if (strcmp(m->children[i]->name, name) == 0)
            return m->children[i];
    return NULL;
}

int ct_module_num_children(const ct_module *m) { return m ? m->nchildren : 0; }

ct_module *ct_module_child_at(const ct_module *m, int i) {
    return m && i >= 0 && i < m->nchildren ? m->children[i] : NULL;
}

void ct_module_train(ct_module *m, bool training) {
    if (!m || m->magic != MODULE_MAGIC)
        return;
    m->training = training;
    for (int i = 0; i < m->nchildren; i++)
        ct_module_train(m->children[i], training);
}

bool ct_module_training(const ct_module *m) { return m && m->training; }

/* ------------------------------------------------------------ collecting */

static int collect(ct_module *m, ct_param_list *pl, bool params, const char *prefix) {
    const ct_param_list *own = params ? &m->params : &m->buffers;
    char name[512];
    for (int i = 0; i < own->n; i++) {
        snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", own->names[i]);
        int rc = ct_param_list_add(pl, name, own->tensors[i]);
        if (rc)
            return rc;
    }
    for (int i = 0; i < m->nchildren; i++) {
        snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", m->children[i]->name);
        int rc = collect(m->children[i], pl, params, name);
        if (rc)
            return rc;
    }
    return 0;
}

int ct_module_named_parameters(ct_module *m, ct_param_list *pl) {
    int rc = check_module("module_named_parameters", m);
    return rc ? rc : collect(m, pl, true, "");
}

int ct_module_named_buffers(ct_module *m, ct_param_list *pl) {
    int rc = check_module("module_named_buffers", m);
    return rc ? rc : collect(m, pl, false, "");
}

/* ------------------------------------------------------------ flattening */

/* Where each parameter of the tree is held, in named order. */
typedef struct slot_list {
    ct_tensor ***at;
    int n, cap;
} slot_list;

/* The slots of the tree's parameters (and buffers, with buffers), in
 * named order. */
static int tree_slots(ct_module *m, slot_list *s, bool buffers) {
    for (int k = 0; k < (buffers ? 2 : 1); k++) {
        ct_param_list *own = k ? &m->buffers : &m->params;
        for (int i = 0; i < own->n; i++) {
            CT_TRY(CT__GROW(s->at, &s->cap, s->n + 1, 0, "module: listing tensors"));
            s->at[s->n++] = &own->tensors[i];
        }
    }
    for (int i = 0; i < m->nchildren; i++) {
        int rc = tree_slots(m->children[i], s, buffers);
        if (rc)
            return rc;
    }
    return 0;
}

static bool on_device(const ct_tensor *t, ct_device d) {
    return ct_device_equal(ct_tensor_device(t), d);
}

int ct_module_to(ct_module *m, ct_device device) {
    int rc = check_module("module_to", m);
    if (rc)
        return rc;
    char desc[160];
    if (m->flat_params || m->flat_grads)
        return ct__err_set(CT_ESTATE,
                           "module_to: %s is flattened; move it before ct_module_flatten, which "
                           "then makes its flat buffers on the device",
                           who(m, desc, sizeof desc));
    slot_list sl = {0};
    rc = tree_slots(m, &sl, true);
    int n = sl.n;
    /* Every copy is made before any slot changes, so that a failure (a
     * device out of memory) leaves the module as it was. */
    ct_tensor **moved = rc ? NULL : calloc((size_t)n + 1, sizeof *moved);
    if (!rc && !moved)
        rc = ct__err_set(CT_ENOMEM, "module_to: out of memory");
    bool prev = ct_set_grad_enabled(false);
    for (int i = 0; i < n && !rc; i++) {
        ct_tensor *t = *sl.at[i];
        if (on_device(t, device))
            continue;
        ct_scope_begin();
        ct_tensor *c = ct_to(t, device);
        if (c && ct_requires_grad(t) && !ct_requires_grad_(c, true))
            c = NULL;
        moved[i] = c ? ct_tensor_retain(c) : NULL;
        ct_scope_end();
        if (!moved[i])
            rc = ct_errcode();
    }
    ct_set_grad_enabled(prev);
    for (int i = 0; i < n && moved; i++) {
        if (moved[i] && !rc) {
            ct_tensor_free(*sl.at[i]);
            *sl.at[i] = moved[i];
        } else {
            ct_tensor_free(moved[i]);
        }
    }
    free(moved);
    free(sl.at);
    return rc;
}

/* A caller-owned view of flat at offset with t's shape. */
static ct_tensor *view_at(ct_tensor *flat, int64_t offset, const ct_tensor *t) {
    ct_scope_begin();
    ct_tensor *v = ct_tensor_from_storage(ct_tensor_storage(flat), offset, ct_ndim(t), ct_sizes(t),
                                          NULL, ct_tensor_dtype(flat));
    ct_tensor_retain(v);
    ct_scope_end();
    return v;
}

int ct_module_flatten(ct_module *m, bool grads) {
    int rc = check_module("module_flatten", m);
    if (rc)
        return rc;
    char desc[160], td[CT__DESC_STR];
    if (m->parent)
        return ct__err_set(CT_EINVAL, "module_flatten: %s is not the root of its tree",
                           who(m, desc, sizeof desc));
    slot_list sl = {0};
    rc = tree_slots(m, &sl, false);
    ct_tensor ***slots = sl.at;
    int n = sl.n;
    int64_t total = 0;
    ct_dtype dt = n ? ct_tensor_dtype(*slots[0]) : CT_FLOAT32;
    ct_device device = n ? ct_tensor_device(*slots[0]) : CT_DEVICE_CPU;
    for (int i = 0; i < n && !rc; i++) {
        total += ct_numel(*slots[i]);
        if (!on_device(*slots[i], device))
            rc = ct__err_set(CT_EDEVICE,
                             "module_flatten: parameters of %s are on different devices; a flat "
                             "buffer lives on one (ct_module_to moves them all)",
                             who(m, desc, sizeof desc));
        if (ct_tensor_dtype(*slots[i]) != dt)
            rc = ct__err_set(CT_EDTYPE,
                             "module_flatten: parameters of %s have different dtypes (%s and %s); "
                             "a flat buffer holds one",
                             who(m, desc, sizeof desc), ct_dtype_name(dt),
                             ct__tensor_desc(td, *slots[i]));
    }
    ct_tensor *flat = NULL, *flat_grad = NULL;
    if (!rc) {
        ct_scope_begin();
        flat = ct_tensor_retain(ct_empty_on(1, (int64_t[]){total}, dt, device));
        flat_grad =
            grads ? ct_tensor_retain(ct_full_on(1, (int64_t[]){total}, 0, dt, device)) : NULL;
        ct_scope_end();
        if (!flat || (grads && !flat_grad))
            rc = ct_errcode();
    }
    /* Build every view first, so that a failure leaves the module as it
     * was. */
    ct_tensor **views = rc ? NULL : calloc((size_t)n + 1, 2 * sizeof *views);
    if (!rc && !views)
        rc = ct__err_set(CT_ENOMEM, "module_flatten: out of memory");
    int64_t at = 0;
    for (int i = 0; i < n && !rc; i++) {
        ct_tensor *p = *slots[i];
        views[2 * i] = view_at(flat, at, p);
        views[2 * i + 1] = grads ? view_at(flat_grad, at, p) : NULL;
        if (!views[2 * i] || (grads && !views[2 * i + 1]))
            rc = ct_errcode();
        at += ct_numel(p);
    }
    bool prev = ct_set_grad_enabled(false);
    for (int i = 0; i < n && !rc; i++) {
        ct_tensor *v = views[2 * i];
        if (!ct_copy_(v, *slots[i]) || !ct_requires_grad_(v, true) ||
            (grads && ct_tensor_set_grad(v, views[2 * i + 1])))
            rc = ct_errcode();
    }
    ct_set_grad_enabled(prev);
    for (int i = 0; i < n; i++) {
        if (views && !rc) {
            ct_tensor_free(*slots[i]);
            *slots[i] = views[2 * i];
        } else if (views) {
            ct_tensor_free(views[2 * i]);
        }
        if (views)
            ct_tensor_free(views[2 * i + 1]);
    }
    free(views);
    free(slots);
    if (rc) {
        ct_tensor_free(flat);
        ct_tensor_free(flat_grad);
        return rc;
    }
    ct_tensor_free(m->flat_params);
    ct_tensor_free(m->flat_grads);
    m->flat_params = flat;
    m->flat_grads = flat_grad;
    return 0;
}

ct_tensor *ct_module_flat_params(const ct_module *m) { return m ? m->flat_params : NULL; }
ct_tensor *ct_module_flat_grads(const ct_module *m) { return m ? m->flat_grads : NULL; }
