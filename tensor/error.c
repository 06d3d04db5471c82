/* Error codes, thread-local messages and assertions. */
#include "tensor_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static _Thread_local char errmsg[CT__ERRMSG_MAX];
static _Thread_local int errcode;

static const char *const err_text[] = {
#define CT__ERR_TEXT(name, text) text,
    CT_ERRNO_MAP(CT__ERR_TEXT)
#undef CT__ERR_TEXT
};

static const char *const err_name[] = {
#define CT__ERR_NAME(name, text) "CT_" #name,
    CT_ERRNO_MAP(CT__ERR_NAME)
#undef CT__ERR_NAME
};

const char *ct_strerror(int err) {
    if (err == CT_OK)
        return "success";
    if (err < 0 && -err <= CT__ERR_COUNT)
        return err_text[-err - 1];
    return "unknown error";
}

const char *ct_errname(int err) {
    if (err == CT_OK)
        return "CT_OK";
    if (err < 0 && -err <= CT__ERR_COUNT)
        return err_name[-err - 1];
    return "CT_UNKNOWN";
}

const char *ct_errmsg(void) { return errmsg; }

int ct_errcode(void) { return errcode; }

void ct_errclear(void) {
    errmsg[0] = '\0';
    errcode = CT_OK;
}

/* Formats into a scratch buffer first: callers may pass ct_errmsg() as an
 * argument to wrap an earlier message. */
static void set_error(int code, const char *prefix, const char *fmt, va_list ap) {
    char buf[CT__ERRMSG_MAX];
    int n = prefix ? snprintf(buf, sizeof buf, "%s", prefix) : 0;
    if (n >= 0 && (size_t)n < sizeof buf)
        vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    memcpy(errmsg, buf, sizeof buf);
    errcode = code;
}

int ct__err_set(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error(code, NULL, fmt, ap);
    va_end(ap);
    return code;
}

/* The public name of the same function; ct's own code calls ct__err_set,
 * which does not go through the PLT. */
extern __typeof__(ct_seterr) ct_seterr __attribute__((alias("ct__err_set")));

void ct__err_ctx_init(ct__errctx *cx, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cx->prefix, sizeof cx->prefix, fmt, ap);
    va_end(ap);
}

int ct__err_ctx_set(const ct__errctx *cx, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    set_error(code, cx->prefix, fmt, ap);
    va_end(ap);
    return code;
}

void ct__err_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "ct: assertion failed: %s (%s:%d)\n", expr, file, line);
    fflush(stderr);
    abort();
}

const char *ct__tensor_shape_str(char *buf, int ndim, const int64_t *sizes) {
    size_t len = 0, cap = CT__SHAPE_STR;
    buf[len++] = '[';
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)sizes[i]);
    if (len < cap - 1) {
        buf[len++] = ']';
        buf[len] = '\0';
    } else {
        buf[cap - 1] = '\0';
    }
    return buf;
}

const char *ct__tensor_desc(char *buf, const ct_tensor *t) {
    char shape[CT__SHAPE_STR];
    snprintf(buf, CT__DESC_STR, "%s%s", ct_dtype_name(t->dtype),
             ct__tensor_shape_str(shape, t->ndim, t->sizes));
    return buf;
}
