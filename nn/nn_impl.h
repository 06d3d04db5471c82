/* ct nn internal header: not installed, not part of the API. */
#ifndef CT_NN_IMPL_H
#define CT_NN_IMPL_H

#include <ct/nn.h>

#include "tensor_impl.h"

/* Multi-head self-attention over a packed projection: qkv [B, T, 3 C]
 * holds q, k and v side by side, each [B, T, C] of `heads` heads; returns
 * the heads' outputs merged, [B, T, C]. As ct_scaled_dot_product_attention
 * on the heads' views, and the same numbers; but on the CPU, for contiguous
 * float32 or float64 qkv, the kernels read the heads in place and write the
 * output and qkv's gradient in their packed layouts, which saves the copy
 * that merges the heads and the three gradients of the views that split
 * them. CT_ESHAPE unless qkv is 3-D with a last dim divisible by 3 heads. */
ct_tensor *ct__nn_attention_packed(ct_tensor *qkv, int64_t heads, const ct_attention_options *opts);

#endif
