/* ct tensor internal header: factory helpers shared by the files that make
 * new tensors from nothing (factory.c, random.c). Not installed. */
#ifndef CT_FACTORY_H
#define CT_FACTORY_H

#include "tensor_impl.h"

/* ct__new, with shape errors reported under op's name rather than
 * "empty". */
ct_tensor *ct__new_named(const char *op, int ndim, const int64_t *sizes, ct_dtype dtype);

#endif
