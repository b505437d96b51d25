// tools/cuda_check.h — every CUDA runtime, cuBLAS and cuBLASLt call in the tool goes through one of
// these: a failure throws fp4moe::CudaError naming the call, the file:line and the error string.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "fp4moe/errors.h"

#define TOOL_CUDA(call)                                                                             \
  do {                                                                                              \
    const cudaError_t tool_err_ = (call);                                                           \
    if (tool_err_ != cudaSuccess)                                                                   \
      throw ::fp4moe::CudaError(#call, std::string(#call) + " failed at " + __FILE__ + ":" +        \
                                           std::to_string(__LINE__) + ": " + cudaGetErrorName(tool_err_) + \
                                           " (" + cudaGetErrorString(tool_err_) + ")");             \
  } while (0)

#define TOOL_CUBLAS(call)                                                                           \
  do {                                                                                              \
    const cublasStatus_t tool_st_ = (call);                                                         \
    if (tool_st_ != CUBLAS_STATUS_SUCCESS)                                                          \
      throw ::fp4moe::CudaError(#call, std::string(#call) + " failed at " + __FILE__ + ":" +        \
                                           std::to_string(__LINE__) + ": " + cublasGetStatusName(tool_st_) + \
                                           " (" + cublasGetStatusString(tool_st_) + ")");           \
  } while (0)

// cuBLASLt returns cublasStatus_t too.
#define TOOL_CUBLASLT(call) TOOL_CUBLAS(call)

// After a kernel launch: the launch error, if any.
#define TOOL_CUDA_LAUNCH(what) TOOL_CUDA(cudaGetLastError())
