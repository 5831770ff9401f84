"""Floor arithmetic against hand-computed values and the investigation's published numbers.

Every expected number is written out from the inputs (layers x row x bytes, bytes / bandwidth),
never copied from a run of the code."""
import math

import pytest

from ddprobe.probes.floor import FloorInput, floor_row, floor_table
from ddprobe.probes.models import get_model
from ddprobe.shapes import KIMI_K2, AttnShape, dtype_bytes, floor_s, get_gpu
from ddprobe.units import DDProbeError

K26 = get_model("kimi-k2.6")
A26 = K26.attn


def test_kimi_kv_bytes_per_token():
    # 61 layers x (512 latent + 64 rope) x 2 bytes
    assert A26 == KIMI_K2
    assert A26.kv_row == 576
    assert A26.kv_bytes_per_token() == 61 * 576 * 2 == 70_272
    # MLA keeps the whole latent cache on every tensor-parallel GPU
    assert A26.kv_bytes_per_token(tp=8) == 70_272
    # the dtype decides the bytes: fp32 doubles them, fp8 halves them
    assert A26.kv_bytes_per_token("fp32") == 61 * 576 * 4 and A26.kv_bytes_per_token("fp8") == 61 * 576 * 1
    assert A26.kv_bytes_per_token("torch.bfloat16", layers=1) == 1152


def test_dtype_names():
    assert dtype_bytes("bf16") == dtype_bytes("bfloat16") == dtype_bytes("torch.bfloat16") == 2
    assert dtype_bytes("torch.float32") == 4 and dtype_bytes("int4") == 0.5
    with pytest.raises(DDProbeError, match="unknown dtype"):
        dtype_bytes("int2")


def test_floor_s_picks_the_larger_term():
    assert floor_s(4.8e9, 1e12, bw_Bps=4.8e12, flops_per_s=1e15) == (1e-3, "memory")  # 1 ms vs 1 ms: memory
    assert floor_s(4.8e9, 2e12, bw_Bps=4.8e12, flops_per_s=1e15) == (2e-3, "compute")
    assert floor_s(4.8e9, 2e12, bw_Bps=4.8e12) == (1e-3, "memory")  # no tensor rate: memory term only


def test_published_investigation_numbers():
    """Kimi K2.6 at 128k: ~9.2 GB of bf16 latent KV; at 1.8 TB/s ~5 ms; a 714 ms step is ~140x off the floor
    and still ~16x off if all 9 rows re-read the cache."""
    row = floor_row(FloorInput(attn=A26, bw_Bps=1.8e12, queries=9, tp=8), ctx=128 * 1024, step_ms=714)
    assert row.kv_GB == pytest.approx(131072 * 70272 / 1e9)  # 9.2107 GB
    assert round(row.kv_GB, 1) == 9.2
    assert row.floor_ms == pytest.approx(9.2107e9 / 1.8e12 * 1e3, rel=1e-4)  # 5.117 ms
    assert 5.0 < row.floor_ms < 5.2
    assert row.gap == pytest.approx(714 / 5.117, rel=1e-3)
    assert round(row.gap) == 140
    assert row.gap_if_rows_reread == pytest.approx(714 / (9 * 5.117), rel=1e-3)
    assert round(row.gap_if_rows_reread) == 16
    assert row.eff_bw_GBps == pytest.approx(9.2107 / 0.714, rel=1e-3)  # ~12.9 GB/s
    assert row.bound == "memory"


def test_gqa_kv_split_across_tp():
    q = get_model("qwen3-8b").attn  # 36 layers, 8 KV heads of 128
    assert q.kv_bytes_per_token() == 36 * 2 * 8 * 128 * 2 == 147_456
    assert q.kv_bytes_per_token(tp=4) == 147_456 / 4
    assert q.kv_bytes_per_token(tp=16) == 147_456 / 8  # replicated once tp exceeds the KV heads


def test_compute_term_makes_64_heads_compute_bound():
    h200 = get_gpu("h200")
    inp = FloorInput(attn=A26, bw_Bps=h200.bw_Bps, flops_per_s=h200.bf16_flops, queries=9, tp=1)
    row = floor_row(inp, 131072)
    flops = 2 * (576 + 512) * 64 * 9 * 61 * 131072  # QK 576-wide + PV 512-wide, every head and row
    assert row.attn_GFLOP == pytest.approx(flops / 1e9)
    assert row.compute_floor_ms == pytest.approx(flops / 989e12 * 1e3)
    assert row.bound == "compute" and row.floor_ms == row.compute_floor_ms
    # one tensor-parallel shard (8 heads) is memory-bound
    assert floor_row(FloorInput(attn=A26, bw_Bps=h200.bw_Bps, flops_per_s=h200.bf16_flops, tp=8), 131072).bound \
        == "memory"


def test_weights_added_to_bytes_read():
    active = K26.params(active=True)
    inp = FloorInput(attn=A26, bw_Bps=4.8e12, tp=8, weights="int4", active_params=active)
    row = floor_row(inp, 1024)
    assert row.weights_GB == pytest.approx(active * 0.5 / 8 / 1e9)
    assert row.read_GB == pytest.approx(row.kv_GB + row.weights_GB)
    assert row.mem_floor_ms == pytest.approx(row.read_GB * 1e9 / 4.8e12 * 1e3)


def test_parameter_counts_match_published_sizes():
    ds = get_model("deepseek-v3")
    assert ds.params() / 1e9 == pytest.approx(671, rel=0.01)  # 671B total
    assert ds.params(active=True) / 1e9 == pytest.approx(37, rel=0.03)  # 37B active
    assert get_model("kimi-k2.6").params(active=True) / 1e9 == pytest.approx(32, rel=0.03)
    assert get_model("llama-3.1-8b").params() / 1e9 == pytest.approx(8.03, rel=0.01)


def test_table_step_times():
    inp = FloorInput(attn=A26, bw_Bps=1.792e12, tp=8)
    rows = floor_table(inp, [32768, 131072, 189440], [159, 714, 1430])
    assert [r.step_ms for r in rows] == [159, 714, 1430]
    assert all(r.gap > 100 for r in rows)
    assert len(floor_table(inp, [1024, 2048], [5.0])) == 2
    with pytest.raises(DDProbeError, match="one per context"):
        floor_table(inp, [1024, 2048, 4096], [1.0, 2.0])


@pytest.mark.parametrize("kwargs,msg", [
    ({"queries": 0}, "--queries"), ({"tp": 0}, "--tp"), ({"bw_Bps": -1}, "bandwidth"),
    ({"bw_Bps": float("nan")}, "bandwidth"), ({"weights": "fp7", "active_params": 1e9}, "unknown dtype"),
    ({"kv_dtype": "int2"}, "unknown dtype"), ({"tp": 128}, "does not divide"), ({"tp": 3}, "does not divide"),
    ({"weights": "int4"}, "parameter count"),
])
def test_bad_input(kwargs, msg):
    args = {"attn": A26, "bw_Bps": 1e12} | kwargs
    with pytest.raises(DDProbeError, match=msg):
        FloorInput(**args)


def test_unknown_names_list_known_ones():
    with pytest.raises(DDProbeError, match="known: kimi-k2.6, kimi-k2, deepseek-v3"):
        get_model("gpt-5")
    with pytest.raises(DDProbeError, match="known: rtx-pro-6000, h100, h200, b200"):
        get_gpu("tpu")
    assert math.isclose(get_gpu("RTX-PRO-6000").bw_Bps, 1.792e12)


@pytest.mark.parametrize("kwargs,msg", [
    ({"head_dim": -128}, "head_dim must be a positive integer"),
    ({"num_kv_heads": -8}, "num_kv_heads must be a positive integer"),
    ({"num_kv_heads": 5}, "not a multiple"),
    ({"num_layers": 0}, "num_layers must be a positive integer"),
])
def test_shape_rejects_nonsense(kwargs, msg):
    args = {"kind": "gqa", "num_layers": 32, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128} | kwargs
    with pytest.raises(DDProbeError, match=msg):
        AttnShape(**args)


def test_tp_over_gqa_kv_heads():
    q = get_model("qwen3-8b").attn  # 32 query heads, 8 KV heads
    q.check_tp(16)  # KV heads replicated: fine
    with pytest.raises(DDProbeError, match="does not divide the model's 32 attention heads"):
        q.check_tp(3)


def test_context_beyond_any_model():
    with pytest.raises(DDProbeError, match="beyond any model"):
        floor_row(FloorInput(attn=A26, bw_Bps=1e12), ctx=10**300)
