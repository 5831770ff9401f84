"""The step model (ddprobe/step_model.py) against numbers worked out by hand from its inputs and sources."""
import json
import math
import subprocess
import sys

import pytest

from ddprobe.probes.floor import Sharding, floor_row, FloorInput, served_model
from ddprobe.models import get_model
from ddprobe.results import Result
from ddprobe.schema import upgrade_row
from ddprobe.step_model import INTERCONNECTS, StepModel, comm_fixed, comm_interconnect, interconnect_for, \
    interpolate
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


def test_eager_steps_pay_their_launches():
    w = lambda r: K26.step_weights(rows=r)  # noqa: E731
    g = StepModel(attn=K26.attn, weights=w, bw_Bps=4.8e12)
    e = StepModel(attn=K26.attn, weights=w, bw_Bps=4.8e12, graphs=False, launches_per_layer=20, launch_us=5.0)
    assert e.cost(1024, 9).floor_ms - g.cost(1024, 9).floor_ms == pytest.approx(20 * 61 * 5.0 / 1e3)


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
