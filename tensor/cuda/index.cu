// Placeholder: this family's kernels (cuda_kernels.h).
#include "cuda_kernels.h"
