"""The FlashInfer-compatible Python API: ``fused_moe`` and ``MoeWrapper``.

Argument names, dtypes and layouts follow FlashInfer's ``b12x_fused_moe`` / ``B12xMoEWrapper``
(x, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf, token_selected_experts, token_final_scales,
num_experts, top_k, w1_alpha, w2_alpha, fc2_input_scale, input_global_scale, ...). Our additions
(mode, format, biases, local expert range, deterministic, backend, ...) are keyword arguments.

Scales. fp4moe has one convention: every global scale is a *decode* scale (ModelOpt's
``weight_scale_2`` and ``input_scale``: v ≈ code · block_scale · g). FlashInfer-style arguments are
mapped onto it (E_local values each; a scalar or [1] broadcasts):

=================================  ===========================================================
FlashInfer arguments (nvfp4, a4)   fp4moe
=================================  ===========================================================
input_global_scale given           fc1_input_scale = input_global_scale, W13 global = w1_alpha
input_global_scale None (legacy)   fc1_input_scale = w1_alpha, W13 global = 1 (w1_alpha plays
                                   both roles, exactly as FlashInfer)
fc2_input_scale (required)         fc2_input_scale; W2 global = w2_alpha / fc2_input_scale
                                   (fp32; the product differs from w2_alpha by at most 1 ulp)
mode a16 / a8 (w4a16)              W13 global = w1_alpha, W2 global = w2_alpha (the weight
                                   scales); input scales unused
mxfp4                              no global scales: w1_alpha / w2_alpha must be 1 (or None)
=================================  ===========================================================

The direct ModelOpt form instead takes ``w1_weight_scale_2`` / ``w2_weight_scale_2`` (per-expert
weight decode scales), ``w1_input_scale`` (FC1 input decode scale) and ``fc2_input_scale`` (FC2
input decode scale); it cannot be mixed with the alphas.

Scale factors (``*_weight_sf``) may be FlashInfer's 6-D MMA view ``(32, 4, mtiles, 4, ktiles, E)``,
the swizzled 128x4 storage (any shape holding E·swizzled bytes) or linear ``[E, N, K/block]``;
``sf_layout="auto"`` tells them apart by shape, ``"linear"`` / ``"swizzled"`` force one.

Tensors: torch, numpy, cupy, jax or anything with ``__dlpack__``. CPU tensors run the reference
backend, CUDA tensors the GPU backends. numpy has no bfloat16: pass bf16 activations as their
uint16 bit patterns (or float32, rounded to nearest even here); bf16 outputs come back as uint16.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import _ext

__all__ = ["fused_moe", "MoeWrapper", "load_modelopt_nvfp4", "load_gpt_oss_mxfp4", "bf16_bits", "bf16_to_float"]

# ---------------------------------------------------------------------------------------------
# Tensor helpers (framework-agnostic)
# ---------------------------------------------------------------------------------------------


def _framework(t: Any) -> str:
    mod = type(t).__module__
    if isinstance(t, np.ndarray):
        return "numpy"
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("cupy"):
        return "cupy"
    if mod.startswith("jax") or mod.startswith("jaxlib"):
        return "jax"
    return "dlpack"


def _device_of(t: Any) -> int:
    """-1 for host memory, the CUDA ordinal otherwise."""
    if isinstance(t, np.ndarray):
        return -1
    if hasattr(t, "__dlpack_device__"):
        kind, idx = t.__dlpack_device__()
        kind = int(kind)
        if kind in (1, 3):  # kDLCPU, kDLCUDAHost
            return -1
        if kind == 2:
            return int(idx)
        raise ValueError(f"unsupported DLPack device type {kind} (CPU and CUDA only)")
    return -1


def _to_numpy(t: Any) -> np.ndarray:
    """A host numpy array with t's values (a copy where t lives on a GPU). 1-byte types as uint8,
    bfloat16 / float16 as float32."""
    fw = _framework(t)
    if fw == "numpy":
        return t
    if fw == "torch":
        import torch

        t = t.detach()
        if t.element_size() == 1 and t.dtype not in (torch.uint8, torch.int8, torch.bool):
            t = t.view(torch.uint8)  # float8_*, float4_e2m1fn_x2
        elif t.dtype in (torch.bfloat16, torch.float16):
            t = t.float()
        return t.cpu().numpy()
    if fw == "cupy":
        return t.get()
    if _device_of(t) < 0:
        try:
            return np.from_dlpack(t)
        except Exception:  # jax and others
            return np.asarray(t)
    return np.asarray(t)


def _u8(t: Any, name: str) -> np.ndarray:
    a = _to_numpy(t)
    if a.dtype.itemsize != 1:
        raise ValueError(f"{name}: expected a 1-byte dtype (uint8 / float8), got {a.dtype}")
    return a.view(np.uint8) if a.dtype != np.uint8 else a


def _f32_vec(v: Any, n: int, name: str) -> Optional[np.ndarray]:
    if v is None:
        return None
    a = np.asarray(_to_numpy(v) if not isinstance(v, (int, float)) else v, dtype=np.float32).reshape(-1)
    if a.size == 1:
        return np.full(n, a[0], dtype=np.float32)
    if a.size != n:
        raise ValueError(f"{name}: expected a scalar, [1] or [{n}] values, got {a.size}")
    return np.ascontiguousarray(a)


def bf16_bits(a: Any) -> np.ndarray:
    """float32 values → bfloat16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    f = np.ascontiguousarray(np.asarray(a, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return r


def bf16_to_float(bits: Any) -> np.ndarray:
    """bfloat16 bit patterns (uint16) → float32."""
    b = np.ascontiguousarray(np.asarray(bits, dtype=np.uint16))
    return (b.astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------------------------------------
# Configuration from FlashInfer-style and our arguments
# ---------------------------------------------------------------------------------------------

_QUANT_MODES = {
    "nvfp4": ("nvfp4", "a4"), "w4a4": ("nvfp4", "a4"), "fp4": ("nvfp4", "a4"),
    "mxfp4": ("mxfp4", "a4"),
    "w4a16": ("nvfp4", "a16"), "bf16": ("nvfp4", "a16"),
}


def _make_config(num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, *,
                 num_local_experts: Optional[int], local_expert_offset: int, activation: str,
                 swiglu_alpha: float, swiglu_beta: float, swiglu_limit: Optional[float],
                 activation_precision: str, quant_mode: Optional[str], source_format: str,
                 format: Optional[str], mode: Optional[str], output_dtype: Any, has_bias: bool) -> "_ext.MoeConfig":
    qm = (quant_mode or activation_precision or "fp4").lower()
    if qm not in _QUANT_MODES:
        raise ValueError(f"quant_mode: unknown value {qm!r} (accepted: {', '.join(_QUANT_MODES)})")
    fmt_, mode_ = _QUANT_MODES[qm]
    if mode_ == "a16" and source_format == "fp4_e8m0_k32":
        fmt_ = "mxfp4"
    elif source_format not in ("modelopt", "fp4_e8m0_k32"):
        raise NotImplementedError(f"source_format: {source_format!r} is not supported (modelopt, fp4_e8m0_k32)")
    c = _ext.MoeConfig()
    c.num_experts = int(num_experts)
    c.top_k = int(top_k)
    c.hidden = int(hidden_size)
    c.intermediate = int(intermediate_size)
    c.local_expert_first = int(local_expert_offset)
    c.local_expert_count = -1 if num_local_experts is None else int(num_local_experts)
    c.format = format or fmt_
    c.mode = mode or mode_
    act = "swiglu_oai" if activation in ("swigluoai", "swigluoai_uninterleave", "swiglu_oai") else activation
    c.activation = act
    c.swiglu_alpha = float(swiglu_alpha)
    c.swiglu_beta = float(swiglu_beta)
    c.swiglu_limit = float("inf") if swiglu_limit is None else float(swiglu_limit)
    c.output_dtype = _dtype_name(output_dtype)
    c.has_bias = bool(has_bias)
    c.validate()
    return c


def _dtype_name(d: Any) -> str:
    if d is None:
        return "bf16"
    s = str(d).replace("torch.", "").replace("jnp.", "")
    if s in ("bfloat16", "bf16"):
        return "bf16"
    if s in ("float32", "fp32", "float"):
        return "fp32"
    if isinstance(d, type) and d is np.float32:
        return "fp32"
    raise ValueError(f"output_dtype: bfloat16 or float32, got {d!r}")


def _scale_bytes(sf: Any, E: int, N: int, K: int, block: int, layout: str, name: str):
    a = _u8(sf, name)
    sc = K // block
    lin = E * N * sc
    swz = E * _ext.swizzled_scale_bytes(N, sc)
    if a.ndim == 6:  # FlashInfer's MMA view (32, 4, mtiles, 4, ktiles, E) of [E, mtiles, ktiles, 32, 4, 4]
        if layout == "linear":
            raise ValueError(f"{name}: a 6-D scale tensor is the swizzled MMA view, not linear")
        a = np.ascontiguousarray(np.transpose(a, (5, 2, 4, 0, 1, 3)))
        kind = "swizzled"
    elif layout == "linear":
        kind = "linear"
    elif layout in ("swizzled", "swizzled128x4"):
        kind = "swizzled"
    elif layout == "auto":
        if a.size == lin and (a.ndim == 1 and a.size != swz or a.ndim >= 2 and a.shape[-1] == sc):
            kind = "linear"
        elif a.size == swz:
            kind = "swizzled"
        elif a.size == lin:
            kind = "linear"
        else:
            raise ValueError(f"{name}: {a.size} bytes (shape {tuple(a.shape)}) are neither the linear [{E}, {N}, {sc}] "
                             f"({lin} bytes) nor the swizzled 128x4 layout ({swz} bytes)")
    else:
        raise ValueError(f"sf_layout: auto, linear or swizzled, got {layout!r}")
    return np.ascontiguousarray(a).reshape(-1), kind


def _map_scales(c, w1_alpha, w2_alpha, fc2_input_scale, input_global_scale, w1_weight_scale_2,
                w2_weight_scale_2, w1_input_scale):
    """(w13 global, w2 global, fc1 input, fc2 input) decode scales, [E_local] float32 or None."""
    n = c.local_count()
    direct = any(v is not None for v in (w1_weight_scale_2, w2_weight_scale_2, w1_input_scale))
    if direct and any(v is not None for v in (w1_alpha, w2_alpha, input_global_scale)):
        raise ValueError("pass either FlashInfer's w1_alpha/w2_alpha/input_global_scale or ModelOpt's "
                         "w1_weight_scale_2/w2_weight_scale_2/w1_input_scale, not both")
    if c.format == "mxfp4":
        for nm, v in (("w1_alpha", w1_alpha), ("w2_alpha", w2_alpha), ("w1_weight_scale_2", w1_weight_scale_2),
                      ("w2_weight_scale_2", w2_weight_scale_2)):
            a = _f32_vec(v, n, nm)
            if a is not None and not np.all(a == 1.0):
                raise ValueError(f"{nm}: MXFP4 weights have no global scale; it must be 1 (or None)")
        return None, None, None, None
    needs_in = c.needs_input_scales()
    if direct:
        g13 = _f32_vec(w1_weight_scale_2, n, "w1_weight_scale_2")
        g2 = _f32_vec(w2_weight_scale_2, n, "w2_weight_scale_2")
        fc1 = _f32_vec(w1_input_scale, n, "w1_input_scale") if needs_in else None
        fc2 = _f32_vec(fc2_input_scale, n, "fc2_input_scale") if needs_in else None
        return g13, g2, fc1, fc2
    a1 = _f32_vec(w1_alpha, n, "w1_alpha")
    a2 = _f32_vec(w2_alpha, n, "w2_alpha")
    if not needs_in:
        return a1, a2, None, None
    fc2 = _f32_vec(fc2_input_scale, n, "fc2_input_scale")
    if fc2 is None:
        raise ValueError("fc2_input_scale is required for nvfp4 (mode a4)")
    if input_global_scale is not None:
        fc1, g13 = _f32_vec(input_global_scale, n, "input_global_scale"), a1
    else:
        fc1, g13 = (a1 if a1 is not None else np.ones(n, np.float32)), None
    g2 = None if a2 is None else (a2 / fc2).astype(np.float32)
    return g13, g2, fc1, fc2


def _prepare(c, device: int, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf, *, w1_alpha=None, w2_alpha=None,
             fc2_input_scale=None, input_global_scale=None, w1_weight_scale_2=None, w2_weight_scale_2=None,
             w1_input_scale=None, w1_bias=None, w2_bias=None, sf_layout="auto", gate_up="up_gate"):
    E, N1, H, I, bs = c.local_count(), c.fc1_rows(), c.hidden, c.intermediate, c.weight_block()
    w13 = np.ascontiguousarray(_u8(w1_weight, "w1_weight")).reshape(-1)
    w2 = np.ascontiguousarray(_u8(w2_weight, "w2_weight")).reshape(-1)
    sf13, l13 = _scale_bytes(w1_weight_sf, E, N1, H, bs, sf_layout, "w1_weight_sf")
    sf2, l2 = _scale_bytes(w2_weight_sf, E, H, I, bs, sf_layout, "w2_weight_sf")
    g13, g2, fc1, fc2 = _map_scales(c, w1_alpha, w2_alpha, fc2_input_scale, input_global_scale, w1_weight_scale_2,
                                    w2_weight_scale_2, w1_input_scale)
    b13 = None if w1_bias is None else np.ascontiguousarray(_to_numpy(w1_bias), dtype=np.float32)
    b2 = None if w2_bias is None else np.ascontiguousarray(_to_numpy(w2_bias), dtype=np.float32)
    return _ext.prepare(c, w13, sf13, l13, g13, w2, sf2, l2, g2, gate_up, fc1, fc2, b13, b2, device)


def _parse_device(device: Any) -> int:
    if device is None:
        return 0 if _ext.cuda_device_count() > 0 else -1
    if isinstance(device, int):
        return device
    s = str(device)
    if s == "cpu":
        return -1
    if s == "cuda":
        try:
            import torch

            if torch.cuda.is_available():
                return torch.cuda.current_device()
        except ImportError:
            pass
        return 0
    if s.startswith("cuda:"):
        return int(s[5:])
    raise ValueError(f"device: 'cpu', 'cuda', 'cuda:N' or an ordinal, got {device!r}")


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


def _prep_inputs(x, ids, scales):
    """Normalises the per-call tensors: numpy float x → bf16 bits, scales → float32 (as FlashInfer)."""
    fw = _framework(x)
    if fw == "numpy":
        if x.dtype in (np.float32, np.float64):
            x = bf16_bits(x)
        x = np.ascontiguousarray(x)
        ids = np.ascontiguousarray(ids)
        scales = np.ascontiguousarray(scales, dtype=np.float32)
    elif fw == "torch":
        import torch

        x = x.contiguous()
        ids = ids.contiguous()
        if scales.dtype != torch.float32:
            scales = scales.float()
        scales = scales.contiguous()
    return x, ids, scales


def _empty_like_output(x, T: int, H: int, out_dtype: str):
    fw = _framework(x)
    dev = _device_of(x)
    if fw == "torch":
        import torch

        return torch.empty((T, H), dtype=torch.bfloat16 if out_dtype == "bf16" else torch.float32, device=x.device)
    if fw == "numpy" or dev < 0 and fw != "jax":
        return np.empty((T, H), dtype=np.uint16 if out_dtype == "bf16" else np.float32)
    return _ext.empty([T, H], out_dtype, dev)


def _wrap_output(x, out):
    """An output the module allocated (for cupy / jax inputs) in x's framework."""
    fw = _framework(x)
    if isinstance(out, np.ndarray) or fw in ("torch", "numpy"):
        return out
    if fw == "cupy":
        import cupy

        return cupy.from_dlpack(out)
    if fw == "jax":
        import jax.dlpack

        return jax.dlpack.from_dlpack(out)
    return out


def _stream_for(x, stream: Optional[int]) -> int:
    if stream is not None:
        return int(stream)
    fw = _framework(x)
    if fw == "torch" and x.is_cuda:
        import torch

        return torch.cuda.current_stream(x.device).cuda_stream
    if fw == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return 0


def _run(runner, x, ids, scales, output=None, stream: Optional[int] = None):
    x, ids, scales = _prep_inputs(x, ids, scales)
    c = runner.config
    T = int(x.shape[0])
    out = output if output is not None else _empty_like_output(x, T, c.hidden, c.output_dtype)
    runner.run(x, ids, scales, out, _stream_for(x, stream))
    return out if output is not None else _wrap_output(x, out)


_REGISTRY: "weakref.WeakValueDictionary[int, MoeWrapper]" = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)


class MoeWrapper:
    """A prepared MoE layer and its runner, FlashInfer ``B12xMoEWrapper``-shaped.

    Weights are validated and repacked once, by :meth:`prepare` (or the first :meth:`run` that is
    given them); nothing is cached on data pointers. :meth:`run` with the weights again checks they
    are the same tensors, unmodified (torch ``_version``), and raises otherwise: call
    :meth:`prepare` after changing weights. One wrapper per stream (the workspace is its own).

    ``prefill_bf16_bytes`` (default 0: none) lets the dynamic backend hold a bf16 copy of the expert
    weights of up to that many device bytes: calls with at least ``prefill_bf16_min_rows`` routes per
    expert (T·K / E) then dequantise each touched expert once per call and run plain bf16 GEMMs, which
    is faster for large prefill (C++ ``RunnerOptions::prefill_bf16_bytes``). ``dynamic_tile_m`` (0:
    chosen from the rows per expert) forces the dynamic backend's register-path m-tile to 16, 32, 64 or
    128 routed rows (C++ ``RunnerOptions::dynamic_tile_m``).
    """

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, *,
                 use_cuda_graph: bool = False, max_num_tokens: int = 4096, num_local_experts: Optional[int] = None,
                 output_dtype: Any = "bf16", device: Any = None, activation: str = "silu",
                 swiglu_alpha: float = 1.702, swiglu_beta: float = 1.0, swiglu_limit: Optional[float] = None,
                 activation_precision: str = "fp4", quant_mode: Optional[str] = None,
                 source_format: str = "modelopt",
                 # fp4moe additions
                 format: Optional[str] = None, mode: Optional[str] = None, local_expert_offset: int = 0,
                 has_bias: bool = False, deterministic: bool = False, backend: str = "auto", cpu_threads: int = 0,
                 gate_up: str = "up_gate", sf_layout: str = "auto", prefill_bf16_bytes: int = 0,
                 prefill_bf16_min_rows: int = _ext.DEFAULT_PREFILL_BF16_MIN_ROWS, dynamic_tile_m: int = 0):
        self.config = _make_config(num_experts, top_k, hidden_size, intermediate_size,
                                   num_local_experts=num_local_experts, local_expert_offset=local_expert_offset,
                                   activation=activation, swiglu_alpha=swiglu_alpha, swiglu_beta=swiglu_beta,
                                   swiglu_limit=swiglu_limit, activation_precision=activation_precision,
                                   quant_mode=quant_mode, source_format=source_format, format=format, mode=mode,
                                   output_dtype=output_dtype, has_bias=has_bias)
        self.device = _parse_device(device)
        self.use_cuda_graph = use_cuda_graph  # accepted for compatibility: run() allocates nothing of its own
        self.max_num_tokens = int(max_num_tokens)
        self.backend = backend
        self.deterministic = deterministic
        self.cpu_threads = cpu_threads
        self.prefill_bf16_bytes = int(prefill_bf16_bytes)
        self.prefill_bf16_min_rows = int(prefill_bf16_min_rows)
        self.dynamic_tile_m = int(dynamic_tile_m)
        self.gate_up = gate_up
        self.sf_layout = sf_layout
        self.hidden_size = int(hidden_size)
        self.output_dtype = self.config.output_dtype
        self.weights: Optional[_ext.PreparedWeights] = None
        self._runner: Optional[_ext.Runner] = None
        self._sources: tuple = ()
        self.handle = next(_HANDLES)
        _REGISTRY[self.handle] = self

    # -- preparation ---------------------------------------------------------------------------
    def prepare(self, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf, *, w1_alpha=None, w2_alpha=None,
                fc2_input_scale=None, input_global_scale=None, w1_weight_scale_2=None, w2_weight_scale_2=None,
                w1_input_scale=None, w1_bias=None, w2_bias=None, sf_layout: Optional[str] = None,
                gate_up: Optional[str] = None) -> "MoeWrapper":
        """Validates and repacks the weights for this wrapper's device (see the module docstring for
        the scale arguments). Returns self."""
        pw = _prepare(self.config, self.device, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf,
                      w1_alpha=w1_alpha, w2_alpha=w2_alpha, fc2_input_scale=fc2_input_scale,
                      input_global_scale=input_global_scale, w1_weight_scale_2=w1_weight_scale_2,
                      w2_weight_scale_2=w2_weight_scale_2, w1_input_scale=w1_input_scale, w1_bias=w1_bias,
                      w2_bias=w2_bias, sf_layout=sf_layout or self.sf_layout, gate_up=gate_up or self.gate_up)
        self._set_weights(pw)
        srcs = (w1_weight, w1_weight_sf, w2_weight, w2_weight_sf)
        self._sources = tuple((id(t), getattr(t, "_version", None)) for t in srcs)
        return self

    def _set_weights(self, pw) -> None:
        self.weights = pw
        self._runner = _ext.Runner(self.config, pw, max_tokens=self.max_num_tokens, backend=self.backend,
                                   deterministic=self.deterministic, cpu_threads=self.cpu_threads,
                                   prefill_bf16_bytes=self.prefill_bf16_bytes,
                                   prefill_bf16_min_rows=self.prefill_bf16_min_rows,
                                   dynamic_tile_m=self.dynamic_tile_m)

    @classmethod
    def from_checkpoint(cls, layer: "_ext.LoadedLayer", *, device: Any = None, max_num_tokens: int = 4096,
                        output_dtype: Any = "bf16", deterministic: bool = False, backend: str = "auto",
                        cpu_threads: int = 0, prefill_bf16_bytes: int = 0,
                        prefill_bf16_min_rows: int = _ext.DEFAULT_PREFILL_BF16_MIN_ROWS,
                        dynamic_tile_m: int = 0) -> "MoeWrapper":
        """A wrapper over a layer loaded by :func:`load_modelopt_nvfp4` / :func:`load_gpt_oss_mxfp4`."""
        c = layer.config
        w = cls.__new__(cls)
        w.config = c
        w.config.output_dtype = _dtype_name(output_dtype)
        w.device = _parse_device(device)
        w.use_cuda_graph = False
        w.max_num_tokens = int(max_num_tokens)
        w.backend, w.deterministic, w.cpu_threads = backend, deterministic, cpu_threads
        w.prefill_bf16_bytes, w.prefill_bf16_min_rows = int(prefill_bf16_bytes), int(prefill_bf16_min_rows)
        w.dynamic_tile_m = int(dynamic_tile_m)
        w.gate_up, w.sf_layout = "up_gate", "auto"
        w.hidden_size = c.hidden
        w.output_dtype = c.output_dtype
        w._sources = ()
        w.handle = next(_HANDLES)
        _REGISTRY[w.handle] = w
        w._set_weights(layer.prepare(c, w.device))
        return w

    # -- running -------------------------------------------------------------------------------
    def forward(self, x, token_selected_experts, token_final_scales, *, output=None, stream: Optional[int] = None):
        """out[T, H] = the MoE layer on x [T, H] with routes [T, K] and router weights [T, K]."""
        if self._runner is None:
            raise RuntimeError("MoeWrapper: no weights; call prepare(...) first")
        if _framework(x) == "torch" and output is None and stream is None:
            from . import _torch_ops

            if _torch_ops.available:
                import torch

                return torch.ops.fp4moe.wrapper_run(self.handle, x, token_selected_experts, token_final_scales)
        return _run(self._runner, x, token_selected_experts, token_final_scales, output, stream)

    __call__ = forward

    def run(self, x, w1_weight=None, w1_weight_sf=None, w2_weight=None, w2_weight_sf=None,
            token_selected_experts=None, token_final_scales=None, *, w1_alpha=None, w2_alpha=None,
            fc2_input_scale=None, input_global_scale=None, output=None, stream: Optional[int] = None, **kw):
        """FlashInfer's ``B12xMoEWrapper.run`` signature. The first call with weights prepares them;
        later calls must pass the same, unmodified tensors (else ValueError: call prepare())."""
        if token_selected_experts is None or token_final_scales is None:
            raise ValueError("run: token_selected_experts and token_final_scales are required")
        if w1_weight is not None:
            srcs = (w1_weight, w1_weight_sf, w2_weight, w2_weight_sf)
            key = tuple((id(t), getattr(t, "_version", None)) for t in srcs)
            if self._runner is None:
                self.prepare(*srcs, w1_alpha=w1_alpha, w2_alpha=w2_alpha, fc2_input_scale=fc2_input_scale,
                             input_global_scale=input_global_scale, **kw)
            elif key != self._sources:
                raise ValueError("MoeWrapper.run: these weights are not the tensors prepared (or they were modified "
                                 "since); call prepare(...) with the new weights first")
        return self.forward(x, token_selected_experts, token_final_scales, output=output, stream=stream)

    def plan(self, num_tokens: int) -> str:
        """The backend a call with num_tokens tokens runs on."""
        return self._runner.plan(num_tokens) if self._runner else "unprepared"


def fused_moe(x, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf, token_selected_experts, token_final_scales,
              num_experts: int, top_k: int, *, w1_alpha=None, w2_alpha=None, fc2_input_scale=None,
              input_global_scale=None, num_local_experts: Optional[int] = None, output=None,
              output_dtype: Any = "bf16", activation: str = "silu", swiglu_alpha: float = 1.702,
              swiglu_beta: float = 1.0, swiglu_limit: Optional[float] = None, activation_precision: str = "fp4",
              quant_mode: Optional[str] = None, source_format: str = "modelopt",
              # fp4moe additions
              format: Optional[str] = None, mode: Optional[str] = None, local_expert_offset: int = 0,
              w1_weight_scale_2=None, w2_weight_scale_2=None, w1_input_scale=None, w1_bias=None, w2_bias=None,
              gate_up: str = "up_gate", sf_layout: str = "auto", deterministic: bool = False,
              backend: str = "auto", cpu_threads: int = 0, stream: Optional[int] = None):
    """FlashInfer's ``b12x_fused_moe``: one call, weights prepared for it (validated and repacked on
    every call: for serving, keep a :class:`MoeWrapper`). With torch tensors and no ``output`` /
    ``stream`` it goes through the custom op ``torch.ops.fp4moe.fused_moe``."""
    kwargs = dict(w1_alpha=w1_alpha, w2_alpha=w2_alpha, fc2_input_scale=fc2_input_scale,
                  input_global_scale=input_global_scale, num_local_experts=num_local_experts,
                  output_dtype=_dtype_name(output_dtype), activation=activation, swiglu_alpha=swiglu_alpha,
                  swiglu_beta=swiglu_beta, swiglu_limit=swiglu_limit, activation_precision=activation_precision,
                  quant_mode=quant_mode, source_format=source_format, format=format, mode=mode,
                  local_expert_offset=local_expert_offset, w1_weight_scale_2=w1_weight_scale_2,
                  w2_weight_scale_2=w2_weight_scale_2, w1_input_scale=w1_input_scale, w1_bias=w1_bias,
                  w2_bias=w2_bias, gate_up=gate_up, sf_layout=sf_layout, deterministic=deterministic,
                  backend=backend, cpu_threads=cpu_threads)
    if _framework(x) == "torch" and output is None and stream is None:
        from . import _torch_ops

        if _torch_ops.available:
            return _torch_ops.call_fused_moe(x, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf,
                                             token_selected_experts, token_final_scales, num_experts, top_k, **kwargs)
    return fused_moe_eager(x, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf, token_selected_experts,
                           token_final_scales, num_experts, top_k, output=output, stream=stream, **kwargs)


def fused_moe_eager(x, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf, token_selected_experts, token_final_scales,
                    num_experts, top_k, *, output=None, stream=None, w1_alpha=None, w2_alpha=None,
                    fc2_input_scale=None, input_global_scale=None, num_local_experts=None, output_dtype="bf16",
                    activation="silu", swiglu_alpha=1.702, swiglu_beta=1.0, swiglu_limit=None,
                    activation_precision="fp4", quant_mode=None, source_format="modelopt", format=None, mode=None,
                    local_expert_offset=0, w1_weight_scale_2=None, w2_weight_scale_2=None, w1_input_scale=None,
                    w1_bias=None, w2_bias=None, gate_up="up_gate", sf_layout="auto", deterministic=False,
                    backend="auto", cpu_threads=0):
    """fused_moe without the torch op (what the op runs)."""
    H = int(x.shape[1])
    I = int(w2_weight.shape[-1]) * 2  # w2_weight: [E, H, I/2]
    c = _make_config(num_experts, top_k, H, I, num_local_experts=num_local_experts,
                     local_expert_offset=local_expert_offset, activation=activation, swiglu_alpha=swiglu_alpha,
                     swiglu_beta=swiglu_beta, swiglu_limit=swiglu_limit, activation_precision=activation_precision,
                     quant_mode=quant_mode, source_format=source_format, format=format, mode=mode,
                     output_dtype=output_dtype, has_bias=w1_bias is not None or w2_bias is not None)
    device = _device_of(x)
    pw = _prepare(c, device, w1_weight, w1_weight_sf, w2_weight, w2_weight_sf, w1_alpha=w1_alpha,
                  w2_alpha=w2_alpha, fc2_input_scale=fc2_input_scale, input_global_scale=input_global_scale,
                  w1_weight_scale_2=w1_weight_scale_2, w2_weight_scale_2=w2_weight_scale_2,
                  w1_input_scale=w1_input_scale, w1_bias=w1_bias, w2_bias=w2_bias, sf_layout=sf_layout,
                  gate_up=gate_up)
    runner = _ext.Runner(c, pw, max_tokens=max(1, int(x.shape[0])), backend=backend, deterministic=deterministic,
                         cpu_threads=cpu_threads)
    if int(x.shape[0]) == 0:
        return _empty_like_output(x, 0, H, c.output_dtype) if output is None else output
    return _run(runner, x, token_selected_experts, token_final_scales, output, stream)


# ---------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------


def _paths(paths: Union[str, Sequence[str]]) -> list:
    return [str(paths)] if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__") else [str(p) for p in paths]


def load_modelopt_nvfp4(paths, layer: int, top_k: int, *, mode: str = "a4", activation: Optional[str] = None,
                        swiglu_alpha: Optional[float] = None, swiglu_beta: Optional[float] = None,
                        swiglu_limit: Optional[float] = None, local_expert_offset: int = 0,
                        num_local_experts: Optional[int] = None, num_experts: Optional[int] = None, prefix: str = "",
                        rescale_mismatched_gate_up: bool = False) -> "_ext.LoadedLayer":
    """The experts of layer `layer` of a ModelOpt NVFP4 checkpoint (files or directories of
    .safetensors). The C++ side validates every file and tensor (fp4moe.InvalidArgument names the
    file and the tensor). Use with :meth:`MoeWrapper.from_checkpoint`."""
    return _ext.load_modelopt_nvfp4(_paths(paths), layer, top_k, mode, activation, swiglu_alpha, swiglu_beta,
                                    swiglu_limit, local_expert_offset,
                                    -1 if num_local_experts is None else num_local_experts,
                                    -1 if num_experts is None else num_experts, prefix, rescale_mismatched_gate_up)


def load_gpt_oss_mxfp4(paths, layer: int, top_k: int = 4, *, mode: str = "a4", activation: Optional[str] = None,
                       swiglu_alpha: Optional[float] = None, swiglu_beta: Optional[float] = None,
                       swiglu_limit: Optional[float] = None, local_expert_offset: int = 0,
                       num_local_experts: Optional[int] = None, prefix: str = "") -> "_ext.LoadedLayer":
    """The experts of layer `layer` of a gpt-oss MXFP4 checkpoint (swiglu_oai, limit 7, biases)."""
    return _ext.load_gpt_oss_mxfp4(_paths(paths), layer, top_k, mode, activation, swiglu_alpha, swiglu_beta,
                                   swiglu_limit, local_expert_offset,
                                   -1 if num_local_experts is None else num_local_experts, -1, prefix, False)
