"""`ddprobe trace` on the real H100 traces shipped in tests/data/traces/ (the engine's k2 verify step at 32k context,
8 heads per GPU, recorded 2026-12-06 by make_traces.py; README.md there says how): issue 55's targets, read off the
files. The step times the traces are checked against were measured in the same run without the profiler
(h100-notes.json); the per-call kernel times come from `ddprobe bench verify` in the same machine session (below)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddprobe.probes.trace import run_trace

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "traces"
NOTES = json.loads((DATA / "h100-notes.json").read_text())
MODEL = dict(model="kimi-k2", ctx=32768, tp=8)  # Kimi K2's TP-8 shard: 8 heads, 61 layers, the k2 preset's attention

# `ddprobe bench verify --ctx 32k --heads 8 --paths sglang,split_ws --quick --step-ctx 0` on the same H100, same
# machine session (2026-12-06, torch 2.11, Triton 3.6), its results file shipped beside the traces: us per call (one
# layer) and effective GB/s per path
_BV = json.loads((DATA / "h100-bench-verify-32k.json").read_text())
assert _BV["meta"]["gpu"] == "NVIDIA H100 80GB HBM3"
BENCH_VERIFY = {r["path"]: {"us": r["us"], "GBps": r["GBps"]} for r in _BV["results"] if r.get("ctx") == 32768}
WITHIN = 0.10  # issue 55's targets: within 10%
LAYERS = 61


def measured_ms(name: str) -> float:
    """The step time measured without the profiler (CUDA graphs or eager as the file says) for a shipped trace."""
    run = next(r for r in NOTES["runs"] if "h100-" + r["file"] == name)
    return run["step_ms_median"]


def near(value: float, ref: float) -> bool:
    return abs(value / ref - 1) <= WITHIN


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    out = {}
    for name in NOTES["shipped"]:
        result, _ = run_trace([DATA / name], **MODEL)
        assert len(result.rows) == 1
        out[name] = dict(result.rows[0], detail=result.summary["detail"]["0"])
    return out


def test_the_shipped_cuts_are_the_notes_files():
    assert NOTES["gpu"] == "NVIDIA H100 80GB HBM3" and NOTES["preset"] == "k2" and NOTES["heads"] == 8
    for name in NOTES["shipped"]:
        assert (DATA / name).stat().st_size < 600_000, name


def test_sglang_fwd_kernel_takes_most_of_the_step(rows):
    r = rows["h100-sglang-graphs-32k.trace.json.gz"]
    assert r["gpu"] == "NVIDIA H100 80GB HBM3"
    assert r["method"] == "graph launches" and r["steps"] == 2  # 3 recorded; windows start after the largest gap (the host tree build before verify), so 2 whole ones
    # each cudaGraphLaunch is one unit (its replayed kernels share its correlation id): 6 graphs per step
    assert r["detail"].startswith("a sequence of 6 graph launches repeats 2 times"), r["detail"]
    assert r["attn_kernel"] == "_fwd_kernel" and "SGLang" in r["attn_what"]
    assert r["attn_calls"] == LAYERS
    share = r["attention_ms"] / r["step_ms"]
    assert share > 0.9, share  # 95%
    assert r["attn_us"] * r["attn_calls"] / 1e3 / r["step_ms"] > 0.9  # one kernel is all of it
    # the step span agrees with the step measured without the profiler
    assert near(r["step_ms"], measured_ms("h100-sglang-graphs-32k.trace.json.gz")), r["step_ms"]


def test_sglang_grid_against_the_sms(rows):
    r = rows["h100-sglang-graphs-32k.trace.json.gz"]
    assert r["sms"] == 132
    assert r["attn_launch"]["grid"] == [1, 8, 1] and r["attn_blocks"] == 8  # one block per head, no split
    assert "grid 1 x 8 x 1 = 8 blocks on 132 SMs: at most 6% of the GPU can work on it" in r["attn_grid"]
    # Kineto's occupancy estimate is 0 for every block over 48 KB of shared memory: not shown as a figure
    assert r["attn_launch"]["shared_memory_B"] == 106_496
    assert r["attn_launch"]["achieved_occupancy_pct"] is None
    assert "no occupancy estimate" in r["attn_grid"]


def test_sglang_bandwidth_matches_bench_verify(rows):
    r = rows["h100-sglang-graphs-32k.trace.json.gz"]
    bench = BENCH_VERIFY["sglang"]
    assert near(r["attn_eff_bw_GBps"], bench["GBps"]), (r["attn_eff_bw_GBps"], bench)  # 7.42 against 7.91
    assert near(r["attn_us"], bench["us"]), (r["attn_us"], bench)  # 5,084 against 4,794 us
    assert r["attn_vs_kernel_floor"] > 100  # hundreds of times its kernel floor


def test_split_ws_span_and_attention_share_match_the_measured_step(rows):
    name = "h100-split_ws-graphs-32k.trace.json.gz"
    r = rows[name]
    step = measured_ms(name)  # 16.9 ms with CUDA graphs, no profiler
    assert near(r["step_ms"], step), (r["step_ms"], step)
    assert r["attn_kernel"] == "ddp_seesaw_bf16" and r["attn_blocks"] == r["sms"] == 132
    expected_share = LAYERS * BENCH_VERIFY["split_ws"]["us"] / 1e3 / step  # 61 calls at bench verify's time
    assert near(r["attention_ms"] / r["step_ms"], expected_share), (r["attention_ms"], r["step_ms"])
    assert near(r["attn_eff_bw_GBps"], BENCH_VERIFY["split_ws"]["GBps"])
    assert r["moe_ms"] > r["attention_ms"]  # split over the SMs, attention is no longer where the step goes


def test_paged_is_one_block_per_head_too(rows):
    r = rows["h100-paged-graphs-32k.trace.json.gz"]
    assert r["attn_kernel"] == "_paged_verify_kernel" and r["attn_blocks"] == 8
    assert r["attention_ms"] / r["step_ms"] > 0.9
    assert near(r["step_ms"], measured_ms("h100-paged-graphs-32k.trace.json.gz"))


def test_eager_steps_by_repeating_sequence_same_kernel_time(rows):
    eager, graphs = rows["h100-sglang-eager-32k.trace.json.gz"], rows["h100-sglang-graphs-32k.trace.json.gz"]
    assert eager["method"] == "repeating kernel sequence" and eager["steps"] == 2
    assert eager["attn_kernel"] == "_fwd_kernel" and eager["attn_calls"] == LAYERS
    assert near(eager["attn_us"], graphs["attn_us"])
    assert near(eager["step_ms"], measured_ms("h100-sglang-eager-32k.trace.json.gz"))
    assert eager["idle_ms"] > graphs["idle_ms"]  # launched one by one, the GPU waits on the host


def test_the_command_on_the_h100_trace(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    out = tmp_path / "t.json"
    p = subprocess.run([sys.executable, "-m", "ddprobe", "trace", str(DATA / "h100-sglang-graphs-32k.trace.json.gz"),
                        "--model", "kimi-k2", "--ctx", "32k", "--tp", "8", "-o", str(out)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "NVIDIA H100 80GB HBM3, 132 SMs" in p.stdout
    assert "attention kernel _fwd_kernel" in p.stdout and "8 blocks on 132 SMs" in p.stdout
    assert json.loads(out.read_text())["kind"] == "trace"
    assert "step below the floor" not in p.stdout  # the right model, context and sharding: 325.9 ms over 16.7 ms


def test_a_step_below_its_floor_says_the_model_is_not_the_traces(tmp_path):
    """The same H100 step read as the whole Kimi K2.6 on one GPU (no --tp): its floor (111 ms) is above the traced
    17.3 ms, which physics does not allow: the model, context or sharding is not the trace's, and the line says so."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "ddprobe", "trace", str(DATA / "h100-split_ws-graphs-32k.trace.json.gz"),
                        "--model", "kimi-k2.6", "--ctx", "32k", "-o", str(tmp_path / "t.json")],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    row = json.loads((tmp_path / "t.json").read_text())["rows"][0]
    assert row["gap"] < 1 and row["floor_ms"] > row["step_ms"]
    assert "step below the floor: check --model, --ctx and --tp" in p.stdout
