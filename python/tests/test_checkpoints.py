"""Real checkpoint layouts: ModelOpt NVFP4 and gpt-oss MXFP4 safetensors files written here, loaded
by the C++ loaders, checked against the reference on the same weights; malformed files."""
import numpy as np
import pytest

import fp4moe
from conftest import make_config, problem, reference_bf16, write_safetensors


def modelopt_tensors(c, p, layer=2):
    E, H, I = c.num_experts, c.hidden, c.intermediate
    t, dt = {}, {}
    w13 = p["w13_packed"].reshape(E, 2 * I, H // 2)
    s13 = p["w13_scales"].reshape(E, 2 * I, H // 16)
    w2, s2 = p["w2_packed"].reshape(E, H, I // 2), p["w2_scales"].reshape(E, H, I // 16)
    ones = np.ones(E, np.float32)  # a16 problems have no calibrated input scales
    for e in range(E):
        pre = f"model.layers.{layer}.mlp.experts.{e}."
        for proj, rows, w, s, g, ins in (
                ("up_proj", slice(0, I), w13, s13, p["w13_global_scale"], p.get("fc1_input_scale", ones)),
                ("gate_proj", slice(I, 2 * I), w13, s13, p["w13_global_scale"], p.get("fc1_input_scale", ones)),
                ("down_proj", slice(0, H), w2, s2, p["w2_global_scale"], p.get("fc2_input_scale", ones))):
            t[pre + proj + ".weight"] = w[e, rows]
            t[pre + proj + ".weight_scale"] = s[e, rows]
            dt[pre + proj + ".weight_scale"] = "F8_E4M3"
            t[pre + proj + ".weight_scale_2"] = np.array(g[e], np.float32)
            t[pre + proj + ".input_scale"] = np.array([ins[e]], np.float32)
    return t, dt


def test_modelopt_nvfp4_layer(tmp_path):
    c = make_config(E=4, H=64, I=32, K=2)
    p = problem(c, T=7)
    want, _ = reference_bf16(c, p)
    t, dt = modelopt_tensors(c, p)
    names = sorted(t)
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {n: t[n] for n in names[:20]}, dt)
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {n: t[n] for n in names[20:]}, dt)
    layer = fp4moe.load_modelopt_nvfp4(tmp_path, layer=2, top_k=2)
    assert (layer.config.num_experts, layer.config.hidden, layer.config.intermediate) == (4, 64, 32)
    w = fp4moe.MoeWrapper.from_checkpoint(layer, device="cpu")
    np.testing.assert_array_equal(w(p["x"], p["ids"], p["topk_weights"]), want)
    # A local expert range: routes to other experts contribute nothing.
    part = fp4moe.load_modelopt_nvfp4([str(tmp_path)], layer=2, top_k=2, local_expert_offset=2, num_local_experts=2)
    assert part.config.local_count() == 2
    ids = np.full_like(p["ids"], 0)
    out = fp4moe.MoeWrapper.from_checkpoint(part, device="cpu")(p["x"], ids, p["topk_weights"])
    assert not out.any()


def test_modelopt_file_written_by_safetensors_package(tmp_path):
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")
    c = make_config(E=2, H=32, I=16, K=1, mode="a16")
    p = problem(c, T=3)
    want, _ = reference_bf16(c, p)
    t, _ = modelopt_tensors(c, p, layer=0)
    # safetensors.numpy has no float8: ModelOpt's F8_E4M3 is patched into the header afterwards.
    path = tmp_path / "m.safetensors"
    st.save_file({k: np.ascontiguousarray(v) for k, v in t.items()}, str(path))
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    import json
    h = json.loads(raw[8:8 + n])
    for k in h:
        if k.endswith(".weight_scale"):
            h[k]["dtype"] = "F8_E4M3"
    hb = json.dumps(h, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    path.write_bytes(len(hb).to_bytes(8, "little") + hb + bytes(raw[8 + n:]))
    layer = fp4moe.load_modelopt_nvfp4(str(path), layer=0, top_k=1, mode="a16")
    out = fp4moe.MoeWrapper.from_checkpoint(layer, device="cpu")(p["x"], p["ids"], p["topk_weights"])
    np.testing.assert_array_equal(out, want)


def test_gpt_oss_mxfp4_layer(tmp_path):
    c = make_config(E=3, H=64, I=32, K=2, fmt="mxfp4", act="swiglu_oai", bias=True, limit=7.0)
    p = problem(c, T=4, gate_up="interleaved")
    b13 = fp4moe.bf16_bits(p["b13"])
    b2 = fp4moe.bf16_bits(p["b2"])
    pre = "model.layers.0.mlp.experts."
    write_safetensors(tmp_path / "gptoss.safetensors", {
        pre + "gate_up_proj_blocks": p["w13_packed"].reshape(3, 64, 2, 16),
        pre + "gate_up_proj_scales": p["w13_scales"].reshape(3, 64, 2),
        pre + "gate_up_proj_bias": b13,
        pre + "down_proj_blocks": p["w2_packed"].reshape(3, 64, 1, 16),
        pre + "down_proj_scales": p["w2_scales"].reshape(3, 64, 1),
        pre + "down_proj_bias": b2})
    layer = fp4moe.load_gpt_oss_mxfp4(tmp_path / "gptoss.safetensors", layer=0, top_k=2)
    cfg = layer.config
    assert (cfg.format, cfg.activation, cfg.swiglu_limit, cfg.has_bias) == ("mxfp4", "swiglu_oai", 7.0, True)
    arrays = layer.arrays()
    assert arrays["gate_up"] == "interleaved"
    q = dict(p)
    q["b13"], q["b2"] = fp4moe.bf16_to_float(b13), fp4moe.bf16_to_float(b2)  # the bf16 biases the file holds
    want, _ = reference_bf16(c, q, gate_up="interleaved")
    out = fp4moe.MoeWrapper.from_checkpoint(layer, device="cpu")(p["x"], p["ids"], p["topk_weights"])
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("mutate,needle", [
    (lambda b: b[:-3], "run past the end of the data"),
    (lambda b: b[:4], "shorter than the 8-byte header length"),
    (lambda b: (10 ** 9).to_bytes(8, "little") + b[8:], "runs past the end of the file"),
    (lambda b: b.replace(b'"U8"', b'"F32"', 1), "needs"),
    (lambda b: b.replace(b'"shape"', b'"shapf"', 1), "unknown field"),
    (lambda b: b[:8] + b"[" + b[9:], "does not start with"),
])
def test_malformed_files_raise_invalid_argument(tmp_path, mutate, needle):
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"model.layers.0.mlp.experts.0.up_proj.weight": np.arange(64, dtype=np.uint8).reshape(4, 16)})
    path.write_bytes(mutate(path.read_bytes()))
    with pytest.raises(fp4moe.InvalidArgument, match=needle) as ei:
        fp4moe.SafetensorsFile(str(path))
    assert str(path) in str(ei.value)
    with pytest.raises(fp4moe.InvalidArgument):
        fp4moe.load_modelopt_nvfp4(path, layer=0, top_k=1)


def test_lying_dtype_names_file_and_tensor(tmp_path):
    c = make_config(E=2, H=32, I=16, K=1)
    p = problem(c)
    t, dt = modelopt_tensors(c, p, layer=0)
    dt["model.layers.0.mlp.experts.1.gate_proj.weight_scale"] = "I8"
    write_safetensors(tmp_path / "x.safetensors", t, dt)
    with pytest.raises(fp4moe.InvalidArgument, match=r"x\.safetensors.*experts\.1\.gate_proj\.weight_scale.*dtype I8"):
        fp4moe.load_modelopt_nvfp4(tmp_path / "x.safetensors", layer=0, top_k=1)
    f = fp4moe.SafetensorsFile(str(tmp_path / "x.safetensors"))
    assert f.info("model.layers.0.mlp.experts.0.up_proj.weight") == ("U8", [16, 16])
    assert f.raw("model.layers.0.mlp.experts.0.up_proj.weight").nbytes == 256
