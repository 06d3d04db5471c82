/* ct_rpc_args: the values a call takes and returns. */
#include "rpc_impl.h"

#include <math.h>
#include <stdlib.h>

#define ARGS_MAGIC 0x63744172u /* "ctAr" */

int ct__rpc_args_check(const ct_rpc_args *a, const char *fn) {
    if (!a)
        return ct__err_set(CT_EINVAL, "%s: the argument list is NULL", fn);
    if (a->magic != ARGS_MAGIC)
        return ct__err_set(CT_EINVAL, "%s: %p is not a live ct_rpc_args (freed or foreign)", fn,
                           (const void *)a);
    return 0;
}

ct_rpc_args *ct_rpc_args_new(void) {
    ct_rpc_args *a = calloc(1, sizeof *a);
    if (!a) {
        ct__err_set(CT_ENOMEM, "ct_rpc_args_new: out of memory");
        return NULL;
    }
    a->magic = ARGS_MAGIC;
    return a;
}

void ct_rpc_args_free(ct_rpc_args *a) {
    if (!a)
        return;
    CT_ASSERT(a->magic == ARGS_MAGIC && "ct_rpc_args_free: not a live argument list");
    for (int i = 0; i < a->n; i++) {
        if (a->v[i].type == CT_RPC_TENSOR)
            ct_tensor_free(a->v[i].t);
        else if (a->v[i].type == CT_RPC_STRING)
            free(a->v[i].s);
    }
    free(a->v);
    a->magic = 0;
    free(a);
}

static rpc_value *push(ct_rpc_args *a, const char *fn) {
    if (ct__rpc_args_check(a, fn))
        return NULL;
    if (CT__GROW(a->v, &a->cap, a->n + 1, 0, fn))
        return NULL;
    return &a->v[a->n];
}

int ct_rpc_args_add_tensor(ct_rpc_args *a, ct_tensor *t) {
    const char *fn = "ct_rpc_args_add_tensor";
    int rc = CT__CHECK_ANY(fn, t);
    if (rc)
        return rc;
    rpc_value *v = push(a, fn);
    if (!v)
        return ct_errcode();
    *v = (rpc_value){.type = CT_RPC_TENSOR, .t = ct_tensor_retain(t)};
    a->n++;
    return 0;
}

int ct_rpc_args_add_int(ct_rpc_args *a, int64_t i) {
    rpc_value *v = push(a, "ct_rpc_args_add_int");
    if (!v)
        return ct_errcode();
    *v = (rpc_value){.type = CT_RPC_INT, .i = i};
    a->n++;
    return 0;
}

int ct_rpc_args_add_float(ct_rpc_args *a, double f) {
    rpc_value *v = push(a, "ct_rpc_args_add_float");
    if (!v)
        return ct_errcode();
    *v = (rpc_value){.type = CT_RPC_FLOAT, .f = f};
    a->n++;
    return 0;
}

int ct_rpc_args_add_string(ct_rpc_args *a, const char *s) {
    const char *fn = "ct_rpc_args_add_string";
    if (!s)
        return ct__err_set(CT_EINVAL, "%s: the string is NULL", fn);
    rpc_value *v = push(a, fn);
    if (!v)
        return ct_errcode();
    char *copy = strdup(s);
    if (!copy)
        return ct__err_set(CT_ENOMEM, "%s: out of memory", fn);
    *v = (rpc_value){.type = CT_RPC_STRING, .s = copy};
    a->n++;
    return 0;
}

int ct_rpc_args_count(const ct_rpc_args *a) {
    int rc = ct__rpc_args_check(a, "ct_rpc_args_count");
    return rc ? rc : a->n;
}

int ct_rpc_args_type(const ct_rpc_args *a, int i) {
    if (ct__rpc_args_check(a, "ct_rpc_args_type"))
        return -1;
    if (i < 0 || i >= a->n) {
        ct__err_set(CT_ERANGE, "ct_rpc_args_type: value %d of %d", i, a->n);
        return -1;
    }
    return (int)a->v[i].type;
}

static const char *const type_names[] = {"a tensor", "an int", "a float", "a string"};

/* Value i if it is of type; NULL with the error otherwise. */
static const rpc_value *get(const ct_rpc_args *a, int i, ct_rpc_type type, const char *fn) {
    if (ct__rpc_args_check(a, fn))
        return NULL;
    if (i < 0 || i >= a->n) {
        ct__err_set(CT_ERANGE, "%s: value %d asked for, but the list has %d", fn, i, a->n);
        return NULL;
    }
    if (a->v[i].type != type) {
        ct__err_set(CT_EINVAL, "%s: value %d is %s, not %s", fn, i, type_names[a->v[i].type],
                    type_names[type]);
        return NULL;
    }
    return &a->v[i];
}

ct_tensor *ct_rpc_args_tensor(const ct_rpc_args *a, int i) {
    const rpc_value *v = get(a, i, CT_RPC_TENSOR, "ct_rpc_args_tensor");
    return v ? v->t : NULL;
}

int64_t ct_rpc_args_int(const ct_rpc_args *a, int i) {
    const rpc_value *v = get(a, i, CT_RPC_INT, "ct_rpc_args_int");
    return v ? v->i : 0;
}

double ct_rpc_args_float(const ct_rpc_args *a, int i) {
    const rpc_value *v = get(a, i, CT_RPC_FLOAT, "ct_rpc_args_float");
    return v ? v->f : NAN;
}

const char *ct_rpc_args_string(const ct_rpc_args *a, int i) {
    const rpc_value *v = get(a, i, CT_RPC_STRING, "ct_rpc_args_string");
    return v ? v->s : NULL;
}

int ct__rpc_args_extend(ct_rpc_args *dst, const ct_rpc_args *src, int first) {
    int rc = ct__rpc_args_check(src, "rpc");
    for (int i = first; !rc && i < src->n; i++) {
        const rpc_value *v = &src->v[i];
        switch (v->type) {
        case CT_RPC_TENSOR: rc = ct_rpc_args_add_tensor(dst, v->t); break;
        case CT_RPC_INT: rc = ct_rpc_args_add_int(dst, v->i); break;
        case CT_RPC_FLOAT: rc = ct_rpc_args_add_float(dst, v->f); break;
        case CT_RPC_STRING: rc = ct_rpc_args_add_string(dst, v->s); break;
        }
    }
    return rc;
}
