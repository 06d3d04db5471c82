/* ct optim internal header: not installed, not part of the API. */
#ifndef CT_OPTIM_IMPL_H
#define CT_OPTIM_IMPL_H

#include <ct/optim.h>

#include "device_impl.h"

_Static_assert((int)CT_OPTIM_SGD == CT__OPTIM_SGD && (int)CT_OPTIM_ADAM == CT__OPTIM_ADAM &&
                   (int)CT_OPTIM_ADAMW == CT__OPTIM_ADAMW,
               "the kernels' kinds (optim_rules.h) are ct/optim.h's");

/* ct__tensor_check_inputs's checks with the tensor named by its role in messages
 * ("param 3 (group 1)"); a NULL tensor keeps the error that made it NULL.
 * Returns 0 or a CT_E* code. */
int ct__optim_check_tensor(const ct_tensor *t, const char *fn, const char *role);

#endif
