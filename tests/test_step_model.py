"""The step model (ddprobe/physics/step_model.py) against numbers worked out by hand from its inputs and sources."""
import json
import math
import subprocess
import sys

import pytest

from ddprobe.probes.floor import Sharding, floor_row, FloorInput, served_model
from ddprobe.physics.models import get_model
from ddprobe.results import Result
from ddprobe.schema import upgrade_row
from dataclasses import replace

from ddprobe.physics.gpus import GPUS, KERNEL_CLASS_BOUND, KERNEL_TIMES, kernel_time
from ddprobe.physics.interconnect import INTERCONNECTS, comm_fixed, comm_interconnect, interconnect_for, interpolate
from ddprobe.physics.step_model import StepModel, structural_kernels, with_launches
from ddprobe.units import DDProbeError

K26 = get_model("kimi-k2.6")


def test_nvlink_table_reproduces_its_source_and_interpolates_in_log_log():
    nv = INTERCONNECTS["nvlink4"]
    assert [nv.allreduce_us(b, 8) for b in (512, 32768, 262144, 1 << 20)] == pytest.approx([5.9, 7.8, 16.7, 33.8])
    mid = math.sqrt(32768 * 262144)  # halfway in log bytes: the geometric mean of 7.8 and 16.7 us
    assert nv.allreduce_us(mid, 8) == pytest.approx(math.sqrt(7.8 * 16.7))
    assert nv.allreduce_us(100, 8) == 5.9  # below the table: its smallest latency
    assert nv.allreduce_us(2 << 20, 8) == pytest.approx(33.8 + (1 << 20) * (33.8 - 16.7) / ((1 << 20) - 262144))
    assert nv.allreduce_us(1 << 20, 1) == 0.0  # one rank: nothing to reduce
    assert interpolate([(100, 4.0)], 50) == 4.0 and interpolate([(100, 4.0)], 1e6) == 4.0  # one point: no slope
    assert interconnect_for("h100-nvl").name == "pcie-gen5" and interconnect_for("gh200") is None


def test_pcie_all_reduces_of_the_investigations_step_by_hand():
    """Kimi K2.6, tp 8 on RTX PRO 6000 (PCIe Gen5, NCCL): 2 x 61 = 122 all-reduces of 9 rows x 7168 x 2 B."""
    model, config = served_model(K26, Sharding(tp=8, expert_dtype="int4"), "rtx-pro-6000")
    n, nbytes, us = model.collectives(9)
    assert (n, nbytes) == (122, 9 * 7168 * 2)
    one = 20.0 + 2 * 7 / 8 * 129024 / 50e9 * 1e6  # latency + ring traffic at 50 GB/s: 24.52 us
    assert us == pytest.approx(122 * one)
    c = model.cost(131072, 9)
    assert c.comm_ms == pytest.approx(122 * one / 1e3) and 2.9 < c.comm_ms < 3.1
    mem = (131072 * 70272 + K26.step_weights(rows=9, tp=8, expert_dtype="int4").total_B) / 1.792e12 * 1e3
    assert c.floor_ms == pytest.approx(mem + c.comm_ms)  # memory-bound, plus the all-reduces
    assert "PCIe Gen5" in config["comm"]
    # plain decode: 122 all-reduces of one row each, and fewer experts
    d = model.cost(131072, 1)
    assert d.allreduce_bytes == 7168 * 2 and d.floor_ms < c.floor_ms


def test_dcp_shards_the_kv_and_adds_one_combine_per_layer():
    m1, _ = served_model(K26, Sharding(tp=8, allreduce_us=10.0), "h200")
    m8, _ = served_model(K26, Sharding(tp=8, dcp=8, allreduce_us=10.0), "h200")
    a, b = m1.cost(131072, 9), m8.cost(131072, 9)
    assert b.kv_GB == pytest.approx(a.kv_GB / 8) and b.kv_floor_ms == pytest.approx(a.kv_floor_ms / 8)
    assert (a.allreduces, b.allreduces) == (122, 244)  # + the queries gathered and the outputs combined, per layer
    assert a.comm_ms == pytest.approx(122 * 10e-3) and b.comm_ms == pytest.approx(244 * 10e-3)
    assert b.GFLOP == pytest.approx(a.GFLOP)  # the group's heads over 1 / dcp of the context: the same FLOPs
    assert b.allreduce_us == 10.0  # one TP all-reduce's latency, not an average with the dcp collectives
    with pytest.raises(DDProbeError, match="--dcp 3 does not divide --tp 8"):
        served_model(K26, Sharding(tp=8, dcp=3), "h200")


def test_tp1_and_unknown_interconnects():
    m, config = served_model(K26, Sharding(tp=1), "h200")
    assert m.cost(1024, 9).comm_ms == 0 and "tp 1" in config["comm"]
    m, config = served_model(K26, Sharding(tp=8), "mi300x")
    assert m.cost(1024, 9).comm_ms == 0 and "not counted" in config["comm"] and "--allreduce-us" in config["comm"]
    assert interconnect_for("h200").name == "nvlink4" and interconnect_for("rtx-pro-6000").name == "pcie-gen5"
    with pytest.raises(DDProbeError, match="--allreduce-us must be a finite number"):
        comm_fixed(float("nan"))
    with pytest.raises(DDProbeError, match="not both"):
        served_model(K26, Sharding(tp=8, allreduce_us=5.0, allreduce_from="x.json"), "h200")


def test_launches_bound_the_step_by_max_not_sum():
    """Kernels serialize and each moves its bytes inside its own duration: floor = max(bytes, FLOPs, launches)."""
    w = lambda r: K26.step_weights(rows=r)  # noqa: E731
    g = StepModel(attn=K26.attn, weights=w, bw_Bps=4.8e12)
    few = with_launches(g, "h200", 100, counted="test")
    many = with_launches(g, "h200", 10_000_000)
    kt = kernel_time("h200")
    b, f, m = g.cost(1024, 9), few.cost(1024, 9), many.cost(1024, 9)
    assert f.launch_ms == pytest.approx(100 * kt.graph_us / 1e3) and f.launch_ms < f.bytes_floor_ms
    assert f.floor_ms == pytest.approx(b.floor_ms) and f.binds == b.binds  # bytes dominate: launches add nothing
    assert m.binds == "launches" and m.floor_ms == pytest.approx(10_000_000 * kt.graph_us / 1e3)
    assert m.latency_floor_ms == pytest.approx(m.launch_ms)
    # eager: the eager launch rate; host syncs add (the queue drains)
    e = with_launches(replace(g, graphs=False), "h200", 10_000_000, syncs=4)
    c = e.cost(1024, 9)
    assert c.kernel_us == kt.eager_us and c.sync_ms == pytest.approx(4 * kt.sync_us / 1e3)
    assert c.floor_ms == pytest.approx(10_000_000 * kt.eager_us / 1e3 + c.sync_ms)
    with pytest.raises(DDProbeError, match="kernels per step"):
        with_launches(g, "h200", -1)


def test_unmeasured_gpus_use_the_class_bound_and_say_so():
    w = lambda r: K26.step_weights(rows=r)  # noqa: E731
    m = with_launches(StepModel(attn=K26.attn, weights=w, bw_Bps=4.8e12), "l40s", 1000)
    assert not kernel_time("l40s").measured and m.kernel_us == KERNEL_CLASS_BOUND.graph_us
    assert "no measurement" in m.kernel_source and "bound" in m.kernel_source
    for name, kt in KERNEL_TIMES.items():  # every measurement names its source and stays above the class bound
        assert name in GPUS and kt.measured and kt.source and kt.graph_us >= KERNEL_CLASS_BOUND.graph_us


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_latency_term_for_every_preset_and_gpu(gpu):
    """Every served preset (the structural least count) and engine preset (tiny, k2) on every GPU of the table:
    launches = kernels x the GPU's least kernel time, and the floor is the largest of its parts plus the rest."""
    from ddprobe.physics.presets import PRESETS as ENGINE
    from ddprobe.physics.models import PRESETS as SERVED
    from ddprobe.probes.backends.engine import preset_step_model

    g, kt = GPUS[gpu], kernel_time(gpu)
    models = [(name, served_model(spec, Sharding(), gpu)[0]) for name, spec in SERVED.items()]
    models += [(name, with_launches(preset_step_model(name, None, "bf16", g.bw_Bps, g.bf16_flops), gpu, 300))
               for name in ENGINE]
    for name, m in models:
        for ctx, rows in ((1, 1), (1024, 9), (131072, 9)):
            c = m.cost(ctx, rows)
            n = structural_kernels(m.attn.num_layers) if name in SERVED else 300
            assert c.kernels == n and c.kernel_us == kt.graph_us, name
            assert c.launch_ms == pytest.approx(n * kt.graph_us / 1e3)
            top = max(c.bytes_floor_ms, c.compute_floor_ms or 0, c.launch_ms)
            assert c.floor_ms == pytest.approx(top + c.comm_ms + c.sync_ms), (name, ctx)
            assert (c.binds == "launches") == (c.launch_ms > max(c.bytes_floor_ms, c.compute_floor_ms or 0))
    tiny = dict(models)["tiny"].cost(1, 1)
    assert tiny.binds == "launches"  # a one-row step of the tiny model is launch-bound on every GPU


def test_an_older_floor_file_loads_under_todays_names(tmp_path):
    old = {"ctx": 1024, "floor_ms": 1.0, "bound": "memory", "gap": 40.0, "total_floor_ms": 9.0, "total_gap": 4.4,
           "step_compute_floor_ms": 2.0, "mem_floor_ms": 1.0, "read_GB": 0.07, "gap_if_rows_reread": 4.0}
    new = upgrade_row("floor", old)
    assert new["floor_ms"] == 9.0 and new["gap"] == 4.4 and new["attn_floor_ms"] == 1.0 and new["attn_gap"] == 40.0
    assert new["compute_floor_ms"] == 2.0 and new["attn_bound"] == "memory" and "read_GB" not in new
    assert upgrade_row("floor", new) == new  # today's rows unchanged
    r = Result.load("tests/data/floor-rtx-pro-6000-tp8.json")  # an attention-only file of 2026-11-29
    assert "floor_ms" not in r.rows[0] and r.rows[0]["attn_floor_ms"] == pytest.approx(0.04015542857142857)


def _floor(*args):
    p = subprocess.run([sys.executable, "-m", "ddprobe", "floor", "--json", *args], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_floor_command_shows_the_all_reduce_term_and_dcp():
    """`ddprobe floor --model kimi-k2.6 --gpu rtx-pro-6000 --tp 8`: the all-reduce term; `--dcp 8`: KV / 8."""
    a = _floor("--model", "kimi-k2.6", "--gpu", "rtx-pro-6000", "--tp", "8", "--ctx", "128k")
    b = _floor("--model", "kimi-k2.6", "--gpu", "rtx-pro-6000", "--tp", "8", "--dcp", "8", "--ctx", "128k")
    ra, rb = a["rows"][0], b["rows"][0]
    assert ra["allreduces"] == 122 and ra["comm_ms"] > 2.5
    assert rb["kv_floor_ms"] == pytest.approx(ra["kv_floor_ms"] / 8)
    assert a["config"]["dcp"] == 1 and b["config"]["dcp"] == 8
    c = _floor("--model", "kimi-k2.6", "--gpu", "rtx-pro-6000", "--tp", "8", "--ctx", "128k", "--allreduce-us", "7")
    assert c["rows"][0]["comm_ms"] == pytest.approx(122 * 7e-3)
