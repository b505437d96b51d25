"""torch custom ops (torch.library) with fake implementations, so that torch.compile traces the
layer as one opaque op and CUDA-graph capture records its launches.

* ``torch.ops.fp4moe.wrapper_run(handle, x, token_selected_experts, token_final_scales)``: a prepared
  :class:`fp4moe.MoeWrapper` (``handle`` is ``wrapper.handle``). Allocates only its output (from
  torch's allocator) and runs on the current stream: capturable in a CUDA graph.
* ``torch.ops.fp4moe.fused_moe(...)``: the one-shot function; it prepares the weights on every call
  (host copies), so it works under torch.compile but is not capturable.
"""
from __future__ import annotations

from typing import Optional

available = False

try:
    import torch
    from torch import Tensor
except ImportError:  # torch is optional
    torch = None

if torch is not None and hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
    from . import api as _api

    def _out_dtype(name: str):
        return torch.bfloat16 if name == "bf16" else torch.float32

    @torch.library.custom_op("fp4moe::wrapper_run", mutates_args=())
    def wrapper_run(handle: int, x: Tensor, token_selected_experts: Tensor, token_final_scales: Tensor) -> Tensor:
        w = _api._REGISTRY.get(handle)
        if w is None:
            raise ValueError(f"fp4moe::wrapper_run: no live MoeWrapper with handle {handle}")
        return _api._run(w._runner, x, token_selected_experts, token_final_scales, None, None)

    @wrapper_run.register_fake
    def _(handle, x, token_selected_experts, token_final_scales):
        w = _api._REGISTRY.get(handle)
        if w is None:
            raise ValueError(f"fp4moe::wrapper_run: no live MoeWrapper with handle {handle}")
        return x.new_empty((x.shape[0], w.hidden_size), dtype=_out_dtype(w.output_dtype))

    @torch.library.custom_op("fp4moe::fused_moe", mutates_args=())
    def fused_moe_op(x: Tensor, w1_weight: Tensor, w1_weight_sf: Tensor, w2_weight: Tensor, w2_weight_sf: Tensor,
                     token_selected_experts: Tensor, token_final_scales: Tensor, num_experts: int, top_k: int,
                     w1_alpha: Optional[Tensor] = None, w2_alpha: Optional[Tensor] = None,
                     fc2_input_scale: Optional[Tensor] = None, input_global_scale: Optional[Tensor] = None,
                     w1_weight_scale_2: Optional[Tensor] = None, w2_weight_scale_2: Optional[Tensor] = None,
                     w1_input_scale: Optional[Tensor] = None, w1_bias: Optional[Tensor] = None,
                     w2_bias: Optional[Tensor] = None, num_local_experts: Optional[int] = None,
                     local_expert_offset: int = 0, output_dtype: str = "bf16", activation: str = "silu",
                     swiglu_alpha: float = 1.702, swiglu_beta: float = 1.0, swiglu_limit: Optional[float] = None,
                     activation_precision: str = "fp4", quant_mode: Optional[str] = None,
                     source_format: str = "modelopt", format: Optional[str] = None, mode: Optional[str] = None,
                     gate_up: str = "up_gate", sf_layout: str = "auto", deterministic: bool = False,
                     backend: str = "auto", cpu_threads: int = 0) -> Tensor:
        return _api.fused_moe_eager(
            x, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf, token_selected_experts, token_final_scales,
            num_experts, top_k, w1_alpha=w1_alpha, w2_alpha=w2_alpha, fc2_input_scale=fc2_input_scale,
            input_global_scale=input_global_scale, w1_weight_scale_2=w1_weight_scale_2,
            w2_weight_scale_2=w2_weight_scale_2, w1_input_scale=w1_input_scale, w1_bias=w1_bias, w2_bias=w2_bias,
            num_local_experts=num_local_experts, local_expert_offset=local_expert_offset, output_dtype=output_dtype,
            activation=activation, swiglu_alpha=swiglu_alpha, swiglu_beta=swiglu_beta, swiglu_limit=swiglu_limit,
            activation_precision=activation_precision, quant_mode=quant_mode, source_format=source_format,
            format=format, mode=mode, gate_up=gate_up, sf_layout=sf_layout, deterministic=deterministic,
            backend=backend, cpu_threads=cpu_threads)

    @fused_moe_op.register_fake
    def _(x, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf, token_selected_experts, token_final_scales,
          num_experts, top_k, *args, output_dtype: str = "bf16", **kwargs):
        return x.new_empty((x.shape[0], x.shape[1]), dtype=_out_dtype(output_dtype))

    def _tensor_or_none(v, device):
        if v is None or isinstance(v, torch.Tensor):
            return v
        return torch.as_tensor(v, dtype=torch.float32)

    def call_fused_moe(x, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf, token_selected_experts,
                       token_final_scales, num_experts, top_k, **kw):
        for k in ("w1_alpha", "w2_alpha", "fc2_input_scale", "input_global_scale", "w1_weight_scale_2",
                  "w2_weight_scale_2", "w1_input_scale", "w1_bias", "w2_bias"):
            kw[k] = _tensor_or_none(kw.get(k), x.device)
        return torch.ops.fp4moe.fused_moe(x, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf,
                                          token_selected_experts, token_final_scales, num_experts, top_k, **kw)

    available = True
