"""Floor arithmetic against hand-computed values and the investigation's published numbers."""
import math

import pytest

from ddprobe.probes.floor import FloorInput, floor_row, floor_table, get_gpu
from ddprobe.probes.models import get_model
from ddprobe.units import DDProbeError

K26 = get_model("kimi-k2.6")


def test_kimi_kv_bytes_per_token():
    # 61 layers x (512 latent + 64 rope) x 2 bytes
    assert K26.kv_values_per_token_layer() == 576
    assert K26.kv_bytes_per_token() == 61 * 576 * 2 == 70_272
    # MLA keeps the whole latent cache on every tensor-parallel GPU
    assert K26.kv_bytes_per_token(tp=8) == 70_272


def test_published_investigation_numbers():
    """Kimi K2.6 at 128k: ~9.2 GB of bf16 latent KV; at 1.8 TB/s ~5 ms; a 714 ms step is ~140x off the floor
    and still ~16x off if all 9 rows re-read the cache."""
    row = floor_row(FloorInput(model=K26, bw_Bps=1.8e12, queries=9, tp=8), ctx=128 * 1024, step_ms=714)
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
    q = get_model("qwen3-8b")  # 36 layers, 8 KV heads of 128
    assert q.kv_bytes_per_token() == 36 * 2 * 8 * 128 * 2 == 147_456
    assert q.kv_bytes_per_token(tp=4) == 147_456 / 4
    assert q.kv_bytes_per_token(tp=16) == 147_456 / 8  # replicated once tp exceeds the KV heads


def test_compute_term_makes_64_heads_compute_bound():
    h200 = get_gpu("h200")
    inp = FloorInput(model=K26, bw_Bps=h200.bw_Bps, flops_per_s=h200.bf16_flops, queries=9, tp=1)
    row = floor_row(inp, 131072)
    flops = 2 * (576 + 512) * 64 * 9 * 61 * 131072  # QK 576-wide + PV 512-wide, every head and row
    assert row.attn_GFLOP == pytest.approx(flops / 1e9)
    assert row.compute_floor_ms == pytest.approx(flops / 989e12 * 1e3)
    assert row.bound == "compute" and row.floor_ms == row.compute_floor_ms
    # one tensor-parallel shard (8 heads) is memory-bound
    assert floor_row(FloorInput(model=K26, bw_Bps=h200.bw_Bps, flops_per_s=h200.bf16_flops, tp=8), 131072).bound \
        == "memory"


def test_weights_added_to_bytes_read():
    inp = FloorInput(model=K26, bw_Bps=4.8e12, tp=8, weights="int4")
    row = floor_row(inp, 1024)
    active = K26.params(active=True)
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
    inp = FloorInput(model=K26, bw_Bps=1.792e12, tp=8)
    rows = floor_table(inp, [32768, 131072, 189440], [159, 714, 1430])
    assert [r.step_ms for r in rows] == [159, 714, 1430]
    assert all(r.gap > 100 for r in rows)
    assert len(floor_table(inp, [1024, 2048], [5.0])) == 2
    with pytest.raises(DDProbeError, match="one per context"):
        floor_table(inp, [1024, 2048, 4096], [1.0, 2.0])


@pytest.mark.parametrize("kwargs,msg", [
    ({"queries": 0}, "--queries"), ({"tp": 0}, "--tp"), ({"bw_Bps": -1}, "bandwidth"),
    ({"weights": "fp7"}, "weight dtype"), ({"kv_dtype": "int2"}, "KV dtype"), ({"tp": 128}, "exceeds"),
])
def test_bad_input(kwargs, msg):
    args = {"model": K26, "bw_Bps": 1e12} | kwargs
    with pytest.raises(DDProbeError, match=msg):
        FloorInput(**args)


def test_unknown_names_list_known_ones():
    with pytest.raises(DDProbeError, match="known: kimi-k2.6, kimi-k2, deepseek-v3"):
        get_model("gpt-5")
    with pytest.raises(DDProbeError, match="known: rtx-pro-6000, h100, h200, b200"):
        get_gpu("tpu")
    assert math.isclose(get_gpu("RTX-PRO-6000").bw_Bps, 1.792e12)
