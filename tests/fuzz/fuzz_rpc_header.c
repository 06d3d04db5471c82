/* libFuzzer target: the RPC header and error-reply decoders on arbitrary
 * bytes, as a worker receives them from anyone who can reach its socket.
 *
 * The first byte chooses the decoder; the rest is the frame. Even:
 * ct__rpc_header_parse, the frame that opens every message. Odd:
 * ct__rpc_decode_error, the description of an error reply. Besides not
 * crashing, leaking or invoking undefined behaviour, the decoders must keep
 * their promises. A header is CT_ECORRUPT with an "rpc: " message unless
 * the frame is exactly a header's size with ct's magic, version and a known
 * kind, and then it is the frame's bytes. An error reply is CT_ECORRUPT or
 * CT_ENOMEM with no text, unless its u32 length is exactly the bytes after
 * it, and then the text is those bytes, NUL-terminated. A broken promise
 * aborts, which libFuzzer reports as a crash. */
#include "rpc_impl.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void broken(const char *promise) {
    fprintf(stderr, "fuzz_rpc_header: %s (last error %s: %s)\n", promise, ct_errname(ct_errcode()),
            ct_errmsg());
    abort();
}

static uint32_t le(const uint8_t *p, int width) {
    uint32_t v = 0;
    for (int i = width - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void check_header(const uint8_t *frame, size_t len) {
    rpc_header h;
    int rc = ct__rpc_header_parse(frame, len, &h);
    bool valid = len == sizeof h && le(frame, 4) == RPC_MAGIC && le(frame + 4, 2) == RPC_VERSION &&
                 le(frame + 6, 2) >= RPC_REQUEST && le(frame + 6, 2) < RPC_KINDS;
    if (rc) {
        if (rc != CT_ECORRUPT || rc != ct_errcode() || strncmp(ct_errmsg(), "rpc: ", 5) != 0)
            broken("a refused header is not CT_ECORRUPT with an rpc message");
        if (valid)
            broken("a valid header was refused");
        return;
    }
    if (!valid)
        broken("a header with a bad length, magic, version or kind was accepted");
    if (memcmp(&h, frame, sizeof h) != 0)
        broken("an accepted header is not the frame's bytes");
}

static void check_error(const uint8_t *desc, size_t len) {
    char *text = NULL;
    int rc = ct__rpc_decode_error(desc, len, &text);
    bool valid = len >= 4 && le(desc, 4) == len - 4;
    if (rc) {
        if ((rc != CT_ECORRUPT && rc != CT_ENOMEM) || rc != ct_errcode())
            broken("a refused error reply is not CT_ECORRUPT or CT_ENOMEM");
        if (text)
            broken("a refused error reply returned text");
        if (valid && rc != CT_ENOMEM)
            broken("a valid error reply was refused");
        return;
    }
    if (!valid || !text)
        broken("an error reply whose length is not its text's was accepted");
    if (memcmp(text, desc + 4, len - 4) != 0 || text[len - 4] != '\0')
        broken("an error reply's text is not its bytes, NUL-terminated");
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ct_errclear();
    if (size < 1)
        return 0;
    if (data[0] & 1)
        check_error(data + 1, size - 1);
    else
        check_header(data + 1, size - 1);
    return 0;
}
