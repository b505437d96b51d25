// Validation of the arguments of a run() call, shared by MoeRunner and the expert-parallel layer.
// Internal.
#pragma once

#include <cstdint>

#include "fp4moe/config.h"

namespace fp4moe {

// Throws InvalidArgument naming the argument: null pointers (when T > 0), x / out not 16-byte
// aligned, ids / weights not aligned to their element size, an unknown ids_type.
void validate_run_args(const void* x, const void* ids, IndexType ids_type, const float* topk_weights,
                       const void* out, int64_t num_tokens);

}  // namespace fp4moe
