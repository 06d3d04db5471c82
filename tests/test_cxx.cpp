// ct's headers from C++17, as a C++ program uses them: the umbrella header
// compiles, and CT_SHAPE and CT_DIMS, compound literals in C, and CT_TRY
// work.
#include <ct/ct.h>

#include <cstdio>

static int failures;

static void check(bool ok, const char *what) {
    if (!ok) {
        std::fprintf(stderr, "FAIL %s (ct_errmsg: %s)\n", what, ct_errmsg());
        failures++;
    }
}

// CT_TRY from C++: returns the negative code and skips what follows.
static int fails_first(int *reached) {
    CT_TRY(ct_seterr(CT_EINVAL, "C++: refused"));
    *reached = 1;
    return 0;
}

int main() {
    int rows = 2;
    ct_tensor *t = ct_full(CT_SHAPE(rows, 3), 1.5, CT_FLOAT32);
    check(t && ct_ndim(t) == 2 && ct_size(t, 0) == 2 && ct_size(t, 1) == 3, "CT_SHAPE(rows, 3)");
    ct_tensor *s = t ? ct_sum(t, CT_DIMS(0), false) : nullptr;
    check(s && ct_ndim(s) == 1 && ct_size(s, 0) == 3, "ct_sum over CT_DIMS(0)");
    const int64_t at[] = {1};
    check(s && ct_get(s, at) == 3.0, "the column sums");
    ct_tensor_free(s);
    ct_tensor_free(t);
    int reached = 0;
    check(fails_first(&reached) == CT_EINVAL && reached == 0, "CT_TRY returns the code");
    std::printf("%s\n", failures ? "C++: failed" : "C++: ct.h, CT_SHAPE, CT_DIMS and CT_TRY work");
    return failures ? 1 : 0;
}
