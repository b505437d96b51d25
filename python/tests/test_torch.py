"""torch on the CPU: tensors through DLPack, the custom ops, their fake implementations, torch.compile."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import fp4moe  # noqa: E402
from conftest import make_config, problem, reference_bf16  # noqa: E402


def torch_problem(c, T=5):
    p = problem(c, T=T)
    want, _ = reference_bf16(c, p)
    t = {k: torch.from_numpy(v) for k, v in p.items() if isinstance(v, np.ndarray)}
    t["x"] = t["x"].view(torch.bfloat16)
    t["w13_scales"] = t["w13_scales"].view(torch.float8_e4m3fn).reshape(c.local_count(), c.fc1_rows(), -1)
    t["w2_scales"] = t["w2_scales"].view(torch.float8_e4m3fn).reshape(c.local_count(), c.hidden, -1)
    t["topk_weights"] = t["topk_weights"]
    return p, t, torch.from_numpy(want.astype(np.int16)).view(torch.bfloat16)


def fi_kwargs(t):
    return dict(w1_alpha=t["w13_global_scale"], input_global_scale=t["fc1_input_scale"],
                w2_alpha=t["w2_global_scale"] * t["fc2_input_scale"], fc2_input_scale=t["fc2_input_scale"])


def test_custom_ops_are_registered():
    assert hasattr(torch.ops.fp4moe, "fused_moe") and hasattr(torch.ops.fp4moe, "wrapper_run")


def test_fused_moe_torch_cpu_matches_reference():
    c = make_config()
    p, t, want = torch_problem(c)
    out = fp4moe.fused_moe(t["x"], t["w13_packed"], t["w13_scales"], t["w2_packed"], t["w2_scales"],
                           t["ids"].long(), t["topk_weights"].half(), 4, 2, **fi_kwargs(t))
    assert out.dtype == torch.bfloat16 and out.shape == (5, 64)
    # Router weights in fp16 are cast to fp32 (as FlashInfer does): compare with the same cast.
    out32 = fp4moe.fused_moe(t["x"], t["w13_packed"], t["w13_scales"], t["w2_packed"], t["w2_scales"],
                             t["ids"], t["topk_weights"], 4, 2, **fi_kwargs(t))
    d = (out32.view(torch.int16).int() - want.view(torch.int16).int()).abs().max().item()
    assert d <= 1


def test_wrapper_op_and_fake():
    c = make_config()
    p, t, want = torch_problem(c)
    w = fp4moe.MoeWrapper(4, 2, 64, 32, device="cpu", output_dtype=torch.float32)
    w.prepare(t["w13_packed"], t["w13_scales"], t["w2_packed"], t["w2_scales"], w1_weight_scale_2=t["w13_global_scale"],
              w2_weight_scale_2=t["w2_global_scale"], w1_input_scale=t["fc1_input_scale"],
              fc2_input_scale=t["fc2_input_scale"])
    out = w(t["x"], t["ids"], t["topk_weights"])
    assert out.dtype == torch.float32
    assert torch.equal(out.to(torch.bfloat16), want)
    torch.library.opcheck(torch.ops.fp4moe.wrapper_run.default, (w.handle, t["x"], t["ids"], t["topk_weights"]),
                          test_utils=("test_schema", "test_faketensor"))
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fx = torch.empty(3, 64, dtype=torch.bfloat16)
        fo = torch.ops.fp4moe.wrapper_run(w.handle, fx, torch.empty(3, 2, dtype=torch.int32), torch.empty(3, 2))
        assert fo.shape == (3, 64) and fo.dtype == torch.float32


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_torch_compile_cpu(backend):
    c = make_config()
    p, t, want = torch_problem(c)
    w = fp4moe.MoeWrapper(4, 2, 64, 32, device="cpu")
    w.prepare(t["w13_packed"], t["w13_scales"], t["w2_packed"], t["w2_scales"], **fi_kwargs(t))
    eager = w(t["x"], t["ids"], t["topk_weights"])

    def layer(x, ids, s):
        return torch.ops.fp4moe.wrapper_run(w.handle, x * 1, ids, s) + 0

    torch._dynamo.reset()
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    assert torch.equal(compiled(t["x"], t["ids"], t["topk_weights"]), eager)
    # The functional op under torch.compile too (its weights are graph inputs).
    f = torch.compile(lambda x: fp4moe.fused_moe(x, t["w13_packed"], t["w13_scales"], t["w2_packed"],
                                                 t["w2_scales"], t["ids"], t["topk_weights"], 4, 2, **fi_kwargs(t)),
                      backend=backend)
    assert torch.equal(f(t["x"]), eager)
