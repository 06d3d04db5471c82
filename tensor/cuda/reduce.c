/* Placeholder: this family's launches (cuda_impl.h). */
#include "cuda_impl.h"
