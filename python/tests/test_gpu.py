"""GPU tests (run on the H200): Python results equal the C++ results bit for bit on the same
inputs; CUDA graphs and torch.compile on CUDA. Skipped with the reason where there is no GPU."""
import numpy as np
import pytest

import fp4moe
from fp4moe import _ext
from conftest import make_config, problem, reference_bf16

pytestmark = pytest.mark.skipif(_ext.cuda_device_count() == 0, reason="no CUDA device")
torch = pytest.importorskip("torch", reason="torch is not installed")

CASES = [
    dict(fmt="nvfp4", mode="a4", act="silu"),
    dict(fmt="nvfp4", mode="a16", act="relu2"),
    dict(fmt="nvfp4", mode="a8", act="gelu_tanh"),
    dict(fmt="mxfp4", mode="a4", act="swiglu_oai", bias=True, limit=7.0),
]


def prepared(c, p, device):
    return _ext.prepare(c, p["w13_packed"], p["w13_scales"], p["w13_scale_layout"], p.get("w13_global_scale"),
                        p["w2_packed"], p["w2_scales"], p["w2_scale_layout"], p.get("w2_global_scale"), p["gate_up"],
                        p.get("fc1_input_scale"), p.get("fc2_input_scale"), p.get("b13"), p.get("b2"), device)


# direct_micro serves T·K <= 512 (1024 for nvfp4-a4; K = 4 here), so it is not asked for T = 300;
# static serves T·K <= 4096 on sm_90 (wgmma).
RUNS = [(T, b) for T in (1, 7, 64, 300) for b in ("auto", "generic", "direct_micro", "static")
        if b != "direct_micro" or T * 4 <= 512]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
@pytest.mark.parametrize("T,backend", RUNS)
def test_python_equals_cpp_bit_for_bit(case, T, backend):
    if backend == "static" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("static needs an sm_90 (Hopper) GPU")
    c = make_config(E=8, H=256, I=128, K=4, **case)
    p = problem(c, T=T, seed=T)
    pw = prepared(c, p, 0)
    cpp = _ext._run_cpp(c, pw, p["x"], p["ids"], p["topk_weights"], backend, True)
    runner = _ext.Runner(c, pw, max_tokens=T, backend=backend, deterministic=True)
    x = torch.from_numpy(p["x"].astype(np.int16)).view(torch.bfloat16).cuda()
    ids = torch.from_numpy(p["ids"]).cuda()
    tw = torch.from_numpy(p["topk_weights"]).cuda()
    out = torch.empty(T, c.hidden, dtype=torch.bfloat16, device="cuda")
    runner.run(x, ids, tw, out, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    got = out.view(torch.int16).cpu().numpy().view(np.uint8).reshape(-1)
    np.testing.assert_array_equal(got, cpp)
    # And close to the CPU reference.
    want, r = reference_bf16(c, problem(c, T=T, seed=T), p["w13_scale_layout"], p["gate_up"])
    o = fp4moe.bf16_to_float(got.view(np.uint16)).astype(np.float64).reshape(r.shape)
    assert np.linalg.norm(o - r) <= 1.5e-2 * np.linalg.norm(r)


def test_wrapper_on_cuda_equals_cpu_reference_and_graph_capture():
    c = make_config(E=8, H=256, I=128, K=4)
    p = problem(c, T=16)
    want, r = reference_bf16(c, p)
    E = 8
    dev = lambda a: torch.from_numpy(a).cuda()  # noqa: E731
    w = fp4moe.MoeWrapper(8, 4, 256, 128, device="cuda", max_num_tokens=64, deterministic=True)
    w.prepare(dev(p["w13_packed"]), dev(p["w13_scales"]).view(torch.float8_e4m3fn).reshape(E, 256, -1),
              dev(p["w2_packed"]), dev(p["w2_scales"]).view(torch.float8_e4m3fn).reshape(E, 256, -1),
              w1_weight_scale_2=p["w13_global_scale"], w2_weight_scale_2=p["w2_global_scale"],
              w1_input_scale=p["fc1_input_scale"], fc2_input_scale=p["fc2_input_scale"])
    x = torch.from_numpy(p["x"].astype(np.int16)).view(torch.bfloat16).cuda()
    ids, tw = dev(p["ids"]), dev(p["topk_weights"])
    eager = w(x, ids, tw)
    o = eager.float().cpu().numpy().astype(np.float64)
    assert np.linalg.norm(o - r) <= 1.5e-2 * np.linalg.norm(r)
    # CUDA graph: capture on a side stream, replay with new inputs in the same buffers.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        w(x, ids, tw)  # warm-up
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graph_out = w(x, ids, tw)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph_out, eager)
    x.copy_(torch.flip(x, [0]))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(graph_out, w(x, ids, tw))
    # torch.compile with the op inside.
    compiled = torch.compile(lambda a, b, c_: w(a, b, c_), fullgraph=False)
    assert torch.equal(compiled(x, ids, tw), w(x, ids, tw))


def test_fused_moe_cuda_matches_wrapper():
    c = make_config(E=8, H=256, I=128, K=4, fmt="mxfp4", act="swiglu_oai", bias=True, limit=7.0)
    p = problem(c, T=9, gate_up="interleaved")
    dev = lambda a: torch.from_numpy(a).cuda()  # noqa: E731
    x = torch.from_numpy(p["x"].astype(np.int16)).view(torch.bfloat16).cuda()
    args = (x, dev(p["w13_packed"]), dev(p["w13_scales"]).reshape(8, 256, -1), dev(p["w2_packed"]),
            dev(p["w2_scales"]).reshape(8, 256, -1), dev(p["ids"]), dev(p["topk_weights"]), 8, 4)
    kw = dict(activation="swiglu_oai", swiglu_limit=7.0, quant_mode="mxfp4", gate_up="interleaved",
              w1_bias=dev(p["b13"]), w2_bias=dev(p["b2"]), deterministic=True)
    a = fp4moe.fused_moe(*args, **kw)
    pw = prepared(c, p, 0)
    cpp = _ext._run_cpp(c, pw, p["x"], p["ids"], p["topk_weights"], "auto", True)
    np.testing.assert_array_equal(a.view(torch.int16).cpu().numpy().view(np.uint8).reshape(-1), cpp)


@pytest.mark.parametrize("case", CASES[:2] + CASES[3:], ids=lambda c: "-".join(str(v) for v in c.values()))
def test_prefill_bf16_copy_matches_reference(case):
    # The dynamic backend's bf16 copy (prefill_bf16_bytes), taken from one route per expert on.
    c = make_config(E=8, H=256, I=128, K=4, **case)
    T = 64
    p = problem(c, T=T, seed=11)
    pw = prepared(c, p, 0)
    runner = _ext.Runner(c, pw, max_tokens=T, backend="dynamic", prefill_bf16_bytes=1 << 30, prefill_bf16_min_rows=1)
    assert runner.plan_bf16_copy(T) and not runner.plan_bf16_copy(1)
    x = torch.from_numpy(p["x"].astype(np.int16)).view(torch.bfloat16).cuda()
    out = torch.empty(T, c.hidden, dtype=torch.bfloat16, device="cuda")
    runner.run(x, torch.from_numpy(p["ids"]).cuda(), torch.from_numpy(p["topk_weights"]).cuda(), out,
               torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    got = out.view(torch.int16).cpu().numpy().view(np.uint16).reshape(-1)
    _, r = reference_bf16(c, problem(c, T=T, seed=11), p["w13_scale_layout"], p["gate_up"])
    o = fp4moe.bf16_to_float(got).astype(np.float64).reshape(r.shape)
    assert np.linalg.norm(o - r) <= 1.5e-2 * np.linalg.norm(r)
