"""CPU tests: numpy (and torch CPU) tensors through the reference backend."""
import numpy as np
import pytest

import fp4moe
from fp4moe import _ext
from conftest import make_config, numpy_moe_a16, problem, reference_bf16


def flashinfer_args(c, p):
    """A testkit problem as b12x_fused_moe arguments (input_global_scale form, linear scales)."""
    E = c.local_count()
    kw = dict(num_experts=c.num_experts, top_k=c.top_k)
    if c.format == "nvfp4":
        g13, g2 = p["w13_global_scale"], p["w2_global_scale"]
        if c.needs_input_scales():
            kw.update(w1_alpha=g13, input_global_scale=p["fc1_input_scale"],
                      w2_alpha=(p["fc2_input_scale"] * g2).astype(np.float32), fc2_input_scale=p["fc2_input_scale"])
        else:
            kw.update(w1_alpha=g13, w2_alpha=g2)
    sf1 = p["w13_scales"].reshape(E, c.fc1_rows(), -1) if p["w13_scale_layout"] == "linear" else p["w13_scales"]
    sf2 = p["w2_scales"].reshape(E, c.hidden, -1) if p["w2_scale_layout"] == "linear" else p["w2_scales"]
    return (p["x"], p["w13_packed"], sf1, p["w2_packed"], sf2, p["ids"], p["topk_weights"]), kw


@pytest.mark.parametrize("fmt,mode,act", [("nvfp4", "a4", "silu"), ("nvfp4", "a8", "gelu_tanh"),
                                          ("mxfp4", "a4", "silu"), ("nvfp4", "a16", "relu2")])
def test_fused_moe_equals_cpp_reference(fmt, mode, act):
    c = make_config(fmt=fmt, mode=mode, act=act)
    p = problem(c)
    want, _ = reference_bf16(c, p)
    args, kw = flashinfer_args(c, p)
    out = fp4moe.fused_moe(*args, **kw, mode=mode, format=fmt, activation=act)
    assert out.dtype == np.uint16 and out.shape == (5, 64)
    # w2_alpha / fc2_input_scale can differ from the weight scale by 1 ulp in fp32: allow 1 bf16 ulp.
    diff = np.abs(out.astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1, diff.max()


def test_modelopt_form_is_bit_exact_and_fp32_output():
    c = make_config()
    p = problem(c)
    want, r = reference_bf16(c, p)
    out = fp4moe.fused_moe(p["x"], p["w13_packed"], p["w13_scales"].reshape(4, 64, 4), p["w2_packed"],
                           p["w2_scales"].reshape(4, 64, 2), p["ids"], p["topk_weights"], 4, 2,
                           w1_weight_scale_2=p["w13_global_scale"], w2_weight_scale_2=p["w2_global_scale"],
                           w1_input_scale=p["fc1_input_scale"], fc2_input_scale=p["fc2_input_scale"])
    np.testing.assert_array_equal(out, want)
    out32 = fp4moe.fused_moe(p["x"], p["w13_packed"], p["w13_scales"].reshape(4, 64, 4), p["w2_packed"],
                             p["w2_scales"].reshape(4, 64, 2), p["ids"], p["topk_weights"], 4, 2,
                             w1_weight_scale_2=p["w13_global_scale"], w2_weight_scale_2=p["w2_global_scale"],
                             w1_input_scale=p["fc1_input_scale"], fc2_input_scale=p["fc2_input_scale"],
                             output_dtype="float32")
    np.testing.assert_array_equal(out32, r.astype(np.float32))


@pytest.mark.parametrize("act", ["silu", "relu2"])
def test_a16_matches_independent_numpy(act):
    c = make_config(mode="a16", act=act, bias=True)
    p = problem(c, T=6, seed=3)
    ref = numpy_moe_a16(c, p)
    w = fp4moe.MoeWrapper(4, 2, 64, 32, device="cpu", mode="a16", activation=act, has_bias=True)
    w.prepare(p["w13_packed"], p["w13_scales"], p["w2_packed"], p["w2_scales"], w1_alpha=p["w13_global_scale"],
              w2_alpha=p["w2_global_scale"], w1_bias=p["b13"], w2_bias=p["b2"], sf_layout="linear")
    out = fp4moe.bf16_to_float(w(p["x"], p["ids"], p["topk_weights"]))
    # Same math in float64; only summation order and one bf16 rounding of the intermediate may differ.
    np.testing.assert_allclose(out, ref, rtol=2 ** -7, atol=1e-3 * np.abs(ref).max())


def test_scale_layouts_linear_swizzled_and_mma_view_agree():
    c = make_config(E=3, H=64, I=32)
    pl = problem(c, layout="linear")
    ps = problem(c, layout="swizzled")
    want, _ = reference_bf16(c, pl)
    args, kw = flashinfer_args(c, ps)
    out_swz = fp4moe.fused_moe(*args, **kw)
    # FlashInfer's 6-D MMA view: storage [E, mtiles, ktiles, 32, 4, 4] seen as (32, 4, mtiles, 4, ktiles, E).
    E, N1, H, I = 3, 64, 64, 32
    def mma_view(sf, N, K):
        mt, kt = -(-N // 128), -(-(K // 16) // 4)
        return sf.reshape(E, mt, kt, 32, 4, 4).transpose(3, 4, 1, 5, 2, 0)
    a = list(args)
    a[2], a[4] = mma_view(ps["w13_scales"], N1, H), mma_view(ps["w2_scales"], H, I)
    out_mma = fp4moe.fused_moe(*a, **kw)
    np.testing.assert_array_equal(out_swz, out_mma)
    assert np.abs(out_swz.astype(np.int32) - want.astype(np.int32)).max() <= 1


def test_numpy_float32_x_is_rounded_to_bf16():
    c = make_config()
    p = problem(c)
    args, kw = flashinfer_args(c, p)
    a = list(args)
    a[0] = fp4moe.bf16_to_float(p["x"])
    np.testing.assert_array_equal(fp4moe.fused_moe(*a, **kw), fp4moe.fused_moe(*args, **kw))


def test_local_expert_range():
    c = make_config(E=4, first=1, count=2)
    p = problem(c)
    want, _ = reference_bf16(c, p)
    args, kw = flashinfer_args(c, p)
    out = fp4moe.fused_moe(*args, **kw, num_local_experts=2, local_expert_offset=1)
    assert np.abs(out.astype(np.int32) - want.astype(np.int32)).max() <= 1


def test_wrapper_flashinfer_run_prepares_once_and_checks_weights():
    c = make_config()
    p = problem(c)
    args, kw = flashinfer_args(c, p)
    x, w1, sf1, w2, sf2, ids, tw = args
    kw.pop("num_experts"), kw.pop("top_k")
    w = fp4moe.MoeWrapper(4, 2, 64, 32, device="cpu", max_num_tokens=8)
    assert w.plan(3) == "unprepared"
    a = w.run(x, w1, sf1, w2, sf2, ids, tw, **kw)
    b = w.run(x, w1, sf1, w2, sf2, ids, tw, **kw)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, w(x, ids, tw))
    assert w.plan(3) == "reference"
    with pytest.raises(ValueError, match="call prepare"):
        w.run(x, w1.copy(), sf1, w2, sf2, ids, tw, **kw)
    with pytest.raises(fp4moe.CapacityError):
        w(np.zeros((9, 64), np.uint16), np.zeros((9, 2), np.int32), np.ones((9, 2), np.float32))


def test_typed_errors():
    c = make_config()
    p = problem(c)
    args, kw = flashinfer_args(c, p)
    a = list(args)
    a[1] = a[1][:3]
    with pytest.raises(fp4moe.InvalidArgument, match="w1_weight"):
        fp4moe.fused_moe(*a, **kw)
    kw2 = dict(kw)
    kw2.pop("fc2_input_scale")
    with pytest.raises(ValueError, match="fc2_input_scale is required"):
        fp4moe.fused_moe(*args, **kw2)
    with pytest.raises(ValueError, match="not both"):
        fp4moe.fused_moe(*args, **kw, w1_weight_scale_2=1.0)
    with pytest.raises(NotImplementedError):
        fp4moe.fused_moe(*args, **kw, backend="generic")
    with pytest.raises(fp4moe.InvalidArgument, match="token_selected_experts"):
        a = list(args)
        a[5] = a[5].astype(np.int16)
        fp4moe.fused_moe(*a, **kw)
    with pytest.raises(fp4moe.InvalidArgument, match="activation"):
        fp4moe.fused_moe(*args, **kw, activation="tanh")
    assert issubclass(fp4moe.InvalidArgument, ValueError)


def test_build_info():
    info = fp4moe.build_info()
    assert info["version"] == fp4moe.__version__
    assert fp4moe.cuda_device_count() >= 0


def _exported_symbols(path):
    """Names of the symbols an ELF64 little-endian shared object defines in its dynamic symbol
    table with a global, weak or GNU-unique binding (what other libraries can bind to)."""
    import struct
    data = open(path, "rb").read()
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1, "not an ELF64 little-endian file"
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = set()
    for _, sh_type, _, _, off, size, link, _, _, entsize in sections:
        if sh_type != 11:  # SHT_DYNSYM
            continue
        stroff = sections[link][4]
        for i in range(1, size // entsize):
            st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", data, off + i * entsize)
            if st_shndx != 0 and (st_info >> 4) in (1, 2, 10):  # defined; GLOBAL, WEAK, GNU_UNIQUE
                names.add(data[stroff + st_name:data.index(b"\0", stroff + st_name)].decode())
    return names


@pytest.mark.skipif(not _ext.__file__.endswith(".so"), reason="the extension is not an ELF shared object")
def test_extension_exports_only_its_entry_point():
    # python/CMakeLists.txt hides everything else: exported, the module's static libstdc++ pieces,
    # CCCL/cudart objects and template instances are shared with the rest of the process (torch's
    # C++ runtime included), which broke our error messages once torch was loaded.
    assert _exported_symbols(_ext.__file__) == {"PyInit__ext"}


def host_prepared(c, p):
    return _ext.prepare(c, p["w13_packed"], p["w13_scales"], "linear", p.get("w13_global_scale"), p["w2_packed"],
                        p["w2_scales"], "linear", p.get("w2_global_scale"), "up_gate", p.get("fc1_input_scale"),
                        p.get("fc2_input_scale"), p.get("b13"), p.get("b2"), -1)


def test_host_prepared_weights_hold_no_device_bytes():
    c = make_config(fmt="nvfp4", mode="a4", act="silu")
    p = problem(c)
    pw = host_prepared(c, p)
    assert pw.device == -1
    assert pw.device_bytes == 0


def test_prefill_bf16_options_are_validated_by_name():
    c = make_config(fmt="nvfp4", mode="a4", act="silu")
    p = problem(c)
    pw = host_prepared(c, p)
    with pytest.raises(fp4moe.InvalidArgument, match="prefill_bf16_bytes"):
        _ext.Runner(c, pw, max_tokens=8, prefill_bf16_bytes=-1)
    with pytest.raises(fp4moe.InvalidArgument, match="prefill_bf16_min_rows"):
        _ext.Runner(c, pw, max_tokens=8, prefill_bf16_min_rows=0)
    with pytest.raises(fp4moe.InvalidArgument, match="dynamic_tile_m.*48"):
        _ext.Runner(c, pw, max_tokens=8, dynamic_tile_m=48)
    r = _ext.Runner(c, pw, max_tokens=8, prefill_bf16_bytes=1 << 30, prefill_bf16_min_rows=1)
    assert r.plan(8) == "reference" and not r.plan_bf16_copy(8)  # host weights: no GPU path, no copy


def test_stub_says_what_the_extension_says():
    """python/fp4moe/_ext.pyi, what type checkers and editors read, must give every function and
    method the signature the extension reports (its nanobind docstring). After changing a binding,
    regenerate it: `python -m nanobind.stubgen -m fp4moe._ext -o python/fp4moe/_ext.pyi`."""
    import re
    from pathlib import Path

    stub = (Path(__file__).resolve().parents[1] / "fp4moe" / "_ext.pyi").read_text().splitlines()
    owner, checked, differ = _ext, 0, []
    for i, line in enumerate(stub):
        if m := re.match(r"class (\w+)", line):
            owner = getattr(_ext, m.group(1))
            continue
        m = re.match(r"(    )?def (\w+)\((.*)\) -> (.*): \.\.\.$", line)
        if not m or (i > 0 and stub[i - 1].strip().startswith("@")):  # properties: no docstring signature
            continue
        obj = getattr(owner if m.group(1) else _ext, m.group(2))
        said = (obj.__doc__ or "").splitlines()
        assert said, f"{m.group(2)}: no signature in its docstring"
        got = said[0].replace("fp4moe._ext.", "").replace("collections.abc.", "").replace("ndarray[]", "NDArray")
        want = f"{m.group(2)}({m.group(3)}) -> {m.group(4)}"
        checked += 1
        if got != want:
            differ.append(f"stub: {want}\n  extension: {got}")
    assert checked >= 20, f"only {checked} signatures read from the stub"
    assert not differ, "\n".join(differ)
    m = re.search(r"^DEFAULT_PREFILL_BF16_MIN_ROWS: int = (\d+)$", "\n".join(stub), re.M)
    assert m and int(m.group(1)) == _ext.DEFAULT_PREFILL_BF16_MIN_ROWS
