/* libFuzzer target: the checkpoint manifest parser on arbitrary bytes, as a
 * full manifest or as one rank's partial one (the first byte chooses).
 *
 * Besides not crashing, leaking or invoking undefined behaviour, the parser
 * must keep its promises: a failure is CT_ECORRUPT, CT_EVERSION or
 * CT_ENOMEM with no manifest and a message that names the input; a success
 * is a manifest that writes back to text which parses again to the same
 * text. A broken promise aborts, which libFuzzer reports as a crash. */
#include "checkpoint_impl.h"

#include <stdio.h>
#include <stdlib.h>

#define WHAT "fuzz-input"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void broken(const char *promise) {
    fprintf(stderr, "fuzz_manifest: %s (last error %s: %s)\n", promise, ct_errname(ct_errcode()),
            ct_errmsg());
    abort();
}

static void parse(const uint8_t *data, size_t size, bool partial) {
    ct_errclear();
    ck_manifest *m = (ck_manifest *)1;
    int rc = ct__manifest_parse((const char *)data, size, WHAT, partial, &m);
    if (rc != 0) {
        if (m)
            broken("a failed parse returned a manifest");
        if (rc != CT_ECORRUPT && rc != CT_EVERSION && rc != CT_ENOMEM)
            broken("a failed parse returned a code other than ECORRUPT, EVERSION or ENOMEM");
        if (rc != ct_errcode() || !strstr(ct_errmsg(), WHAT))
            broken("the error message does not name the input");
        return;
    }
    char *text = ct__manifest_emit(m);
    if (!text)
        broken("a parsed manifest does not write back");
    ck_manifest *again = NULL;
    if (ct__manifest_parse(text, strlen(text), WHAT, partial, &again) != 0)
        broken("a manifest written back does not parse");
    char *text2 = ct__manifest_emit(again);
    if (!text2 || strcmp(text, text2))
        broken("a manifest written back parses to something else");
    free(text);
    free(text2);
    ct__manifest_free(again);
    ct__manifest_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    parse(data, size, false);
    parse(data, size, true);
    return 0;
}
