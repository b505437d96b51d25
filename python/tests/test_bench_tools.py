"""bench/bars.py on hand-made rows: which rows meet each part of the issues' bars (no GPU needed)."""
import json
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


def row(model, mode, tokens, time_us, floor_us, peers):
    return {"type": "row", "run": "t", "model": model, "format": "nvfp4", "mode": mode, "tokens": tokens,
            "backend": "direct_micro", "time_us": time_us, "floor_us": floor_us,
            "efficiency": floor_us / time_us, "peers": peers, "status": "ok"}


def bars(tmp_path, kind, rows):
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [{"type": "run", "run": "t"}, *rows]) + "\n")
    out = tmp_path / "table.md"
    done = subprocess.run([sys.executable, str(BENCH / "bars.py"), kind, str(src), "-o", str(out)],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip(), out.read_text()


def test_decode_whole_bar_needs_the_run_peer_and_the_protocol_peers(tmp_path):
    rows = [
        # floor + 10 = 14.7: met; faster than the run's peer and than vLLM fp8's 25.6 µs (protocol)
        row("qwen3-30b-a3b", "a4", 1, 14.0, 4.7, {"cublas_bf16": 100.0}),
        # over floor + 10, and slower than the protocol's 25.6
        row("qwen3-30b-a3b", "a16", 1, 26.0, 4.7, {"cublas_bf16": 100.0}),
        # efficiency 0.87 ≥ 0.75; the protocol lists no figure at T = 2: no condition from it
        row("deepseek-v3", "a4", 2, 100.0, 87.4, {"cublas_bf16": 500.0}),
        # efficiency met, but no peer in the run: cannot be shown faster
        row("mixtral-8x7b", "a4", 1, 50.0, 43.7, {}),
        # efficiency 0.76 and faster than the run's peer, but slower than triton_kernels' 787 µs
        row("deepseek-v3", "a4", 16, 790.0, 600.0, {"cublas_bf16": 3000.0}),
    ]
    said, table = bars(tmp_path, "decode", rows)
    assert said.endswith("5 rows, 4 meet the efficiency bar, 2 the whole bar"), said
    assert "25.6 (vllm_fp8)" in table
    assert "Whole bar met (efficiency, the run's peer, the protocol's peers): 2." in table


def test_prefill_compares_each_mode_with_peers_of_its_precision(tmp_path):
    rows = [
        row("qwen3-30b-a3b", "a4", 1024, 300.0, 200.0, {"cublas_bf16": 400.0}),  # bf16 math
        row("qwen3-30b-a3b", "a8", 1024, 300.0, 200.0, {"cublas_bf16": 400.0}),  # fp8 math
    ]
    said, table = bars(tmp_path, "prefill", rows)
    lines = {l.split("|")[3].strip(): l for l in table.splitlines() if l.startswith("| qwen3-30b-a3b")}
    assert "363.5 (triton_kernels_mxfp4)" in lines["a4"] and "| faster |" in lines["a4"]
    assert "243.7 (vllm_fp8)" in lines["a8"] and "| slower |" in lines["a8"]
    assert said.endswith("2 rows, 2 meet the efficiency bar, 1 the whole bar"), said


def test_sweep_tables_backends_side_by_side(tmp_path):
    def forced(model, tokens, backend, time_us, E, K):
        r = row(model, "a4", tokens, time_us, 40.0, {})
        r.update(backend=backend, E=E, K=K)
        return r
    rows = [
        forced("qwen3-30b-a3b", 8, "direct_micro", 83.6, 128, 8),
        forced("qwen3-30b-a3b", 8, "dynamic", 90.4, 128, 8),
        forced("mixtral-8x7b", 16, "direct_micro", 357.7, 8, 2),
        forced("mixtral-8x7b", 16, "dynamic (register path)", 337.6, 8, 2),
        forced("mixtral-8x7b", 32, "dynamic", 335.6, 8, 2),  # direct_micro missing: shown as —
    ]
    src = tmp_path / "sweep.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [{"type": "run", "run": "t"}, *rows]) + "\n")
    done = subprocess.run([sys.executable, str(BENCH / "sweep.py"), str(src)], capture_output=True, text=True,
                          check=True)
    lines = {tuple(c.strip() for c in l.split("|")[1:4]): l for l in done.stdout.splitlines() if l.startswith("| ")}
    # per expert: T·K over min(E, T·K): 64 / 64 = 1 for qwen3 T = 8, 32 / 8 = 4 for mixtral T = 16
    assert "| 1 | 83.6 | 90.4 | direct_micro |" in lines[("qwen3-30b-a3b", "a4", "8")]
    assert "| 4 | 357.7 | 337.6 | dynamic |" in lines[("mixtral-8x7b", "a4", "16")]
    assert "| — | 335.6 | dynamic |" in lines[("mixtral-8x7b", "a4", "32")]
    assert "Fastest: direct_micro 1, dynamic 2 of 3 points." in done.stdout

    # --line: qwen3 T = 8 is 64 routes (direct_micro faster), mixtral T = 16 32 routes (dynamic faster;
    # direct_micro 6.0 % over). A line at 16 routes gives both to dynamic (qwen3 8.1 % over), at 32
    # each to its slower backend, at 64 both to direct_micro (mixtral 6.0 % over). mixtral T = 32 has
    # no direct_micro row and is left out.
    done = subprocess.run([sys.executable, str(BENCH / "sweep.py"), str(src), "--line", "direct_micro,dynamic"],
                          capture_output=True, text=True, check=True)
    costs = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:6]]
             for l in done.stdout.splitlines() if l.startswith("| ") and l.split("|")[1].strip().isdigit()}
    assert "(2 points with both)" in done.stdout
    assert costs["16"][0] == "1" and costs["16"][2].startswith("8.1 % (qwen3-30b-a3b a4 T = 8)"), costs["16"]
    assert costs["32"] == ["2", "7.0 %", "8.1 % (qwen3-30b-a3b a4 T = 8)", "7.04 %"], costs["32"]
    assert costs["64"][0] == "1" and costs["64"][2].startswith("6.0 % (mixtral-8x7b a4 T = 16)"), costs["64"]
    assert costs["64"][3] == "2.98 %", costs["64"]  # (357.7 / 337.6 − 1) / 2

    # --rule: any expression of T, K, E, routes, model, mode, true where direct_micro is taken. K == 8 takes
    # each point's faster backend; "model == 'mixtral-8x7b'" each one's slower (as the 32-route line).
    done = subprocess.run([sys.executable, str(BENCH / "sweep.py"), str(src), "--line", "direct_micro,dynamic",
                           "--rule", "K == 8", "--rule", "model == 'mixtral-8x7b'"],
                          capture_output=True, text=True, check=True)
    rules = {l.split("|")[1].strip(): [c.strip() for c in l.split("|")[2:6]]
             for l in done.stdout.splitlines() if l.startswith("| `")}
    assert rules["`K == 8`"] == ["0", "0.0 %", "—", "0.00 %"], rules
    assert rules["`model == 'mixtral-8x7b'`"] == costs["32"], rules
    refused = subprocess.run([sys.executable, str(BENCH / "sweep.py"), str(src), "--rule", "K == 8"],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "--rule needs --line" in refused.stderr
