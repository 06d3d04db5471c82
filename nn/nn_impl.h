/* ct nn internal header: not installed, not part of the API. */
#ifndef CT_NN_IMPL_H
#define CT_NN_IMPL_H

#include <ct/nn.h>

#include "tensor_impl.h"

#endif
