"""fp4moe — fused Mixture-of-Experts with 4-bit (NVFP4 / MXFP4) expert weights on NVIDIA Hopper.

``fused_moe`` and ``MoeWrapper`` follow FlashInfer's ``b12x_fused_moe`` / ``B12xMoEWrapper``
(see :mod:`fp4moe.api` for the argument mapping). CPU tensors run the reference backend, CUDA
tensors the GPU backends. With torch installed, ``torch.ops.fp4moe.fused_moe`` and
``torch.ops.fp4moe.wrapper_run`` are registered on import.
"""
import importlib.util as _ilu

from . import _ext
from ._ext import (CapacityError, CudaError, Error, InvalidArgument, LoadedLayer, MoeConfig, PreparedWeights,
                   Runner, SafetensorsFile, Unsupported, build_info, cuda_device_count)
from .api import (MoeWrapper, bf16_bits, bf16_to_float, fused_moe, load_gpt_oss_mxfp4, load_modelopt_nvfp4)

__version__ = "0.1.0"

if _ilu.find_spec("torch") is not None:
    from . import _torch_ops  # noqa: F401  (registers the custom ops)

__all__ = ["fused_moe", "MoeWrapper", "load_modelopt_nvfp4", "load_gpt_oss_mxfp4", "bf16_bits", "bf16_to_float",
           "MoeConfig", "PreparedWeights", "Runner", "LoadedLayer", "SafetensorsFile", "Error", "InvalidArgument",
           "Unsupported", "CapacityError", "CudaError", "build_info", "cuda_device_count"]
