#include "tensor_impl.h"
