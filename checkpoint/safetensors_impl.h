/* ct safetensors internal header: not installed, not part of the API. */
#ifndef CT_SAFETENSORS_IMPL_H
#define CT_SAFETENSORS_IMPL_H

#include <ct/checkpoint.h>

#include <stdbool.h>
#include <stddef.h>

/* The reference implementation's cap on the JSON header. */
#define CT__SAFETENSORS_MAX_HEADER ((uint64_t)100000000)

/* Parses a whole safetensors file held in memory (len bytes at buf) into a
 * new set (*out, owned by the caller). what names the source in messages
 * (ct_safetensors_load passes the path). The rules and the errors are
 * ct_safetensors_load's; on failure *out is NULL. This is the fuzzers'
 * entry point: any input gives 0 or an error, never a crash. */
int ct__safetensors_parse(const void *buf, size_t len, const char *what, ct_tensor_dict **out);

/* Whether the n bytes at s are well-formed UTF-8 (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF). When not, *bad (nullable)
 * receives the offset of the first byte of the bad sequence. */
bool ct__ckpt_utf8_valid(const void *s, size_t n, size_t *bad);

#endif
