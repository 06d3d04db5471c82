/* ctlaunch internal header: the last lines of a stream, kept in a ring for
 * the report of a failed rank. */
#ifndef CT_LAUNCHER_TAIL_H
#define CT_LAUNCHER_TAIL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CT__TAIL_LINES     20
#define CT__TAIL_LINE_SIZE 256 /* longer lines are cut */

typedef struct ct__tail {
    char lines[CT__TAIL_LINES][CT__TAIL_LINE_SIZE];
    uint64_t count; /* lines pushed; 64 bits, so it never wraps in a job's life */
} ct__tail;

static inline void ct__tail_push(ct__tail *t, const char *line, size_t len) {
    char *slot = t->lines[t->count++ % CT__TAIL_LINES];
    size_t n = len < CT__TAIL_LINE_SIZE - 1 ? len : CT__TAIL_LINE_SIZE - 1;
    memcpy(slot, line, n);
    slot[n] = 0;
}

/* How many lines the ring holds: the last min(count, CT__TAIL_LINES). */
static inline size_t ct__tail_size(const ct__tail *t) {
    return t->count < CT__TAIL_LINES ? (size_t)t->count : CT__TAIL_LINES;
}

/* The i-th oldest line held, 0 <= i < ct__tail_size(t). */
static inline const char *ct__tail_line(const ct__tail *t, size_t i) {
    return t->lines[(t->count - ct__tail_size(t) + i) % CT__TAIL_LINES];
}

#endif
