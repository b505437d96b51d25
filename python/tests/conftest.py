"""Shared helpers: testkit problems through the binding, an independent numpy MoE for a16, and a
tiny safetensors writer (our own, independent of the C++ reader)."""
import json
import struct

import numpy as np
import pytest

import fp4moe
from fp4moe import _ext


def make_config(E=4, H=64, I=32, K=2, fmt="nvfp4", mode="a4", act="silu", bias=False, first=0, count=-1, limit=None):
    c = _ext.MoeConfig()
    c.num_experts, c.hidden, c.intermediate, c.top_k = E, H, I, K
    c.format, c.mode, c.activation, c.has_bias = fmt, mode, act, bias
    c.local_expert_first, c.local_expert_count = first, count
    if limit is not None:
        c.swiglu_limit = limit
    c.validate()
    return c


def problem(c, T=5, seed=1, gate_up="up_gate", layout="linear"):
    return _ext._make_problem(c, T, seed, gate_up, layout)


def reference_bf16(c, p, layout="linear", gate_up="up_gate"):
    """The C++ float64 reference through the binding, rounded to bf16 bits (as every backend rounds)."""
    pw = _ext.prepare(c, p["w13_packed"], p["w13_scales"], layout, p.get("w13_global_scale"), p["w2_packed"],
                      p["w2_scales"], layout, p.get("w2_global_scale"), gate_up, p.get("fc1_input_scale"),
                      p.get("fc2_input_scale"), p.get("b13"), p.get("b2"), -1)
    r = _ext._reference_f64(pw, p["x"], p["ids"], p["topk_weights"])
    return fp4moe.bf16_bits(r.astype(np.float32)), r


_E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def _e4m3(b):
    b = b.astype(np.int64)
    e, m = (b >> 3) & 15, b & 7
    v = np.where(e == 0, m * 2.0 ** -9, (8 + m) * np.exp2(e - 10.0))
    v = np.where((e == 15) & (m == 7), np.nan, v)
    return np.where(b & 0x80, -v, v)


def dequant(packed, scales, gs, E, N, K, fmt):
    """Dense float64 [E, N, K] from packed E2M1 [E, N, K/2] and linear scales."""
    codes = np.empty((E, N, K), dtype=np.int64)
    p = packed.reshape(E, N, K // 2).astype(np.int64)
    codes[..., 0::2], codes[..., 1::2] = p & 15, p >> 4
    bs = 16 if fmt == "nvfp4" else 32
    s = scales.reshape(E, N, K // bs)
    sv = _e4m3(s) if fmt == "nvfp4" else np.exp2(s.astype(np.float64) - 127)
    w = _E2M1[codes] * np.repeat(sv, bs, axis=2)
    if gs is not None:
        w *= gs.astype(np.float64)[:, None, None]
    return w


def numpy_moe_a16(c, p):
    """An independent float64 MoE for mode a16 (no activation quantisation): canonical [up; gate] rows."""
    E, H, I, K = c.local_count(), c.hidden, c.intermediate, c.top_k
    N1 = c.fc1_rows()
    w13 = dequant(p["w13_packed"], p["w13_scales"], p.get("w13_global_scale"), E, N1, H, c.format)
    w2 = dequant(p["w2_packed"], p["w2_scales"], p.get("w2_global_scale"), E, H, I, c.format)
    x = fp4moe.bf16_to_float(p["x"]).astype(np.float64)
    out = np.zeros((x.shape[0], H))
    for t in range(x.shape[0]):
        for j in range(K):
            e = int(p["ids"][t, j]) - c.local_expert_first
            if not 0 <= e < E:
                continue
            h = w13[e] @ x[t]
            if "b13" in p:
                h += p["b13"][e]
            if c.activation == "silu":
                up, g = h[:I], h[I:]
                a = g / (1 + np.exp(-g)) * up
            elif c.activation == "relu2":
                a = np.maximum(h, 0) ** 2
            else:
                raise NotImplementedError
            a = fp4moe.bf16_to_float(fp4moe.bf16_bits(a.astype(np.float32))).astype(np.float64)
            y = w2[e] @ a
            if "b2" in p:
                y += p["b2"][e]
            out[t] += float(p["topk_weights"][t, j]) * y
    return out


_DT = {np.dtype(np.uint8): "U8", np.dtype(np.float32): "F32", np.dtype(np.uint16): "BF16", np.dtype(np.int64): "I64"}


def write_safetensors(path, tensors, dtypes=None):
    """tensors: {name: ndarray}; dtypes: {name: safetensors dtype} overrides (e.g. F8_E4M3 for uint8)."""
    dtypes = dtypes or {}
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        b = a.tobytes()
        header[name] = {"dtype": dtypes.get(name, _DT[a.dtype]), "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


@pytest.fixture
def torch_mod():
    return pytest.importorskip("torch", reason="torch is not installed")
