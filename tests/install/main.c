/* Uses an installed ct through the umbrella header: a small matmul whose
 * answer is known. Exits non-zero, with ct's message, if anything is off. */
#include <ct/ct.h>

#include <stdio.h>

int main(void) {
    ct_scope_begin();
    /* [[0 1 2] [3 4 5]] @ ones(3, 1) = [[3] [12]] */
    ct_tensor *a = ct_view(ct_arange(0, 6, 1, CT_FLOAT32), CT_SHAPE(2, 3));
    ct_tensor *y = ct_matmul(a, ct_ones(CT_SHAPE(3, 1), CT_FLOAT32));
    ct_tensor *s = ct_sum(y, NULL, 0, false);
    if (!s) {
        fprintf(stderr, "consumer: %s\n", ct_errmsg());
        ct_scope_end();
        return 1;
    }
    double sum = ct_item(s);
    ct_scope_end();
    if (sum != 15.0) {
        fprintf(stderr, "consumer: sum of [2, 3] @ [3, 1] is %g; expected 15\n", sum);
        return 1;
    }
    printf("consumer: installed ct works (matmul, sum = %g, %d threads)\n", sum,
           ct_get_num_threads());
    return 0;
}
