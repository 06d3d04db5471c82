/* ct error-reporting internal header: not installed, not part of the API.
 * Part of the base layer (base_impl.h), on every module's include path.
 *
 * Library code reports a failure where it finds it, in one statement that
 * sets this thread's error and returns its code:
 *
 *     CT_REQUIRE(n >= 0, CT_EINVAL, "narrow: length %lld is negative", (long long)n);
 *
 * A block of checks about one object names the object once, in a context
 * that every message of the block starts with:
 *
 *     ct__errctx cx;
 *     ct__err_ctx_init(&cx, "safetensors: %s: tensor '%s': ", path, name);
 *     CT_REQUIRE_CTX(&cx, cJSON_IsArray(shape), CT_ECORRUPT, "shape is %s", json_type(shape));
 *     // "safetensors: a.st: tensor 'w': shape is a string"
 *
 * A callee's failure is passed on with CT_TRY (ct/tensor.h), its message
 * kept. The macros return from the enclosing function: use them where an
 * early return leaves nothing to release.
 *
 * Threads: the error state is per thread, and a context lives on its
 * caller's stack; nothing here is shared. */
#ifndef CT_ERROR_IMPL_H
#define CT_ERROR_IMPL_H

#include <ct/tensor.h>

/* A bug: prints the expression, the file and the line, and aborts. Only a
 * bug aborts; bad input, a failed peer or a full disk is an error that is
 * returned (ARCHITECTURE.md, "Errors"). */
#define CT_ASSERT(expr) ((expr) ? (void)0 : ct__err_assert_fail(#expr, __FILE__, __LINE__))
_Noreturn void ct__err_assert_fail(const char *expr, const char *file, int line);

/* Bytes of an error message, its NUL included; longer ones are cut. */
#define CT__ERRMSG_MAX 1024

/* Records code and a formatted message for this thread; returns code. */
int ct__err_set(int code, const char *fmt, ...) CT_PRINTF(2, 3);

/* The start of every message about one object, formatted once, with what
 * joins it to each message (": ", or a space where the object is the
 * sentence's subject). As long as a whole message, so that writing it once
 * cuts nothing the repeated prefix kept. */
typedef struct ct__errctx {
    char prefix[CT__ERRMSG_MAX];
} ct__errctx;

void ct__err_ctx_init(ct__errctx *cx, const char *fmt, ...) CT_PRINTF(2, 3);
/* Records code and "<prefix><message>" for this thread, cut at
 * CT__ERRMSG_MAX; returns code. An argument may be ct_errmsg(), to wrap a
 * callee's message. */
int ct__err_ctx_set(const ct__errctx *cx, int code, const char *fmt, ...) CT_PRINTF(3, 4);

/* In a function returning int: unless cond holds, records code and the
 * formatted message and returns code. */
#define CT_REQUIRE(cond, code, ...)                                                                \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return ct__err_set((code), __VA_ARGS__);                                               \
    } while (0)

/* CT_REQUIRE with the message under the context cx. */
#define CT_REQUIRE_CTX(cx, cond, code, ...)                                                        \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return ct__err_ctx_set((cx), (code), __VA_ARGS__);                                     \
    } while (0)

#endif
