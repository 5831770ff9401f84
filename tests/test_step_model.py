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

from ddprobe.physics.gpus import GPUS, KERNEL_CLASS_BOUND, kernel_time
from ddprobe.physics.interconnect import INTERCONNECTS, comm_fixed, interconnect_for, interpolate
from ddprobe.physics.step_model import BOUNDS, bound_word, gap_split, step_bound, with_launches
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
    """Kimi K2.6, tp 8 on RTX PRO 6000 (PCIe Gen5, NCCL): 2 x 61 = 122 all-reduces of 9 rows x 7168 x 2 B = 129,024 B,
    each 20 us of latency + 2 x 7/8 of the message at 50 GB/s (ring) = 24.52 us: 2.99 ms a step."""
    model, config = served_model(K26, Sharding(tp=8, expert_dtype="int4"), "rtx-pro-6000")
    n, nbytes, us = model.collectives(9)
    assert (n, nbytes) == (122, 129_024) and us == pytest.approx(122 * 24.516, rel=1e-4)
    c = model.cost(131072, 9)
    assert c.comm_ms == pytest.approx(2.991, rel=1e-3) and c.allreduce_us == pytest.approx(24.516, rel=1e-4)
    assert "PCIe Gen5" in config["comm"]
    d = model.cost(131072, 1)  # plain decode: 122 all-reduces of one row each (14,336 B), and fewer experts
    assert d.allreduce_bytes == 14_336 and d.floor_ms < c.floor_ms


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


def test_published_shapes_by_hand():
    """Numbers from the models' own papers and configs, not from the code: MLA caches 512 latent + 64 rope values
    per token per layer (DeepSeek-V2/V3; Kimi K2 has 61 layers): 576 x 2 B x 61 = 70,272 B per token, 9.21 GB at
    128k; Kimi K2 activates 32B parameters per token (its model card; one row reads about that in weights, the
    embedding's one looked-up row aside); Llama 3.1 8B has 8.03B parameters of which its 128,256 x 4,096
    embedding is 0.525B: 7.50B read per token; Qwen3-8B caches 36 layers x 8 KV heads x 128 x (K, V) x 2 B =
    147,456 B per token."""
    assert K26.attn.kv_bytes_per_token("bf16", 1) == 70_272
    m, _ = served_model(K26, Sharding(tp=8), "h200")
    c = m.cost(131072, 9)
    assert c.kv_GB == pytest.approx(9.2107, rel=1e-4) and c.kv_floor_ms == pytest.approx(1.9189, rel=1e-4)
    assert K26.step_weights(rows=1, tp=1).total_B / 2 == pytest.approx(32e9, rel=0.03)
    assert get_model("llama-3.1-8b").step_weights(rows=1, tp=1).total_B / 2 == pytest.approx(7.505e9, rel=1e-3)
    assert get_model("qwen3-8b").attn.kv_bytes_per_token("bf16", 1) == 147_456
    # the attention's FLOPs at 128k, 9 rows, all 64 heads: QK over 576 values + PV over 512 = 2 x 1,088 FLOPs per
    # (row, head, token, layer): 2,176 x 64 x 9 x 131,072 x 61 = 10.02 TFLOP
    full, _ = served_model(K26, Sharding(tp=1), "h200")
    assert full.attn_flops(131072, 9) == pytest.approx(10.0212e12, rel=1e-4)


H100_FILE = json.loads(open("tests/data/launch/bench-launch-h100.json").read())


def _h100_us(kind: str) -> float:
    return next(r["us"] for r in H100_FILE["rows"] if r["kind"] == kind)


def test_shipped_kernel_times_are_the_shipped_files_least():
    """The H100's shipped figure is its real `bench launch` file's least graph time: graph-empty 0.779 us, below
    graph-small 0.982 us; eager 5.92 us; a host sync 9.65 us (2026-12-06)."""
    kt = kernel_time("h100")
    assert kt.graph_us == _h100_us("graph-empty") == pytest.approx(0.779, abs=5e-4)
    assert _h100_us("graph-small") == pytest.approx(0.982, abs=5e-4)
    assert (kt.eager_us, kt.sync_us) == (pytest.approx(5.918, abs=1e-3), pytest.approx(9.651, abs=1e-3))
    assert kt.measured and "NVIDIA H100 80GB HBM3" in kt.source and "2026-12-06" in kt.source
    assert not kernel_time("l40s").measured and KERNEL_CLASS_BOUND.graph_us < kt.graph_us


def _tiny_h100(**kw):
    from ddprobe.physics.plan import StepInput, plan

    return plan(StepInput(get_model("tiny"), gpu="h100", **kw)).cost(1024, 9)


def test_each_bound_by_a_hand_computed_step():
    """One step per word of the one rule, each worked out by hand:
    - launch-bound: the tiny engine (a few MB of weights) with 1,000 graph-replayed kernels at 0.779 us = 0.779 ms;
    - host-bound: the same eager, 10 kernels x 5.92 us = 59 us of launches, but 100 host syncs x 9.65 us = 0.965 ms;
    - communication-bound: Llama 3.1 8B at tp 8 (1.88 GB of weights a GPU: 0.56 ms at 3.35 TB/s) with 2 x 32 = 64
      all-reduces of 50 us = 3.2 ms;
    - compute-bound: Kimi K2.6 on one GPU at 100 TFLOP/s: 10 TFLOP of attention alone at 128k take 100 ms;
    - bandwidth-bound: the same at the H200's datasheet rate (989 TFLOP/s)."""
    c = _tiny_h100(kernels=1000)
    assert c.binds == "launch" and c.floor_ms == pytest.approx(0.7791, rel=1e-3) and 0 < c.bytes_floor_ms < 0.1
    # max, not sum: each kernel moves its bytes inside its own duration
    assert c.floor_ms == pytest.approx(1000 * _h100_us("graph-empty") / 1e3, rel=1e-12)
    c = _tiny_h100(kernels=10, syncs=100, graphs=False)
    assert c.binds == "host" and c.launch_ms == pytest.approx(0.05918, rel=1e-3)
    assert c.floor_ms == pytest.approx(max(c.bytes_floor_ms, 0.05918) + 0.9651, rel=1e-3)
    m, _ = served_model(get_model("llama-3.1-8b"), Sharding(tp=8, allreduce_us=50.0), "h100")
    c = m.cost(1024, 9)
    assert c.binds == "communication" and (c.allreduces, c.comm_ms) == (64, pytest.approx(3.2))
    assert c.weights_GB == pytest.approx(1.877, rel=1e-3) and 0.55 < c.bytes_floor_ms < 0.6
    slow, _ = served_model(K26, Sharding(tp=1), None, bw_Bps=4.8e12, flops_per_s=100e12)
    c = slow.cost(131072, 9)
    assert c.binds == "compute" and c.compute_floor_ms > 100.2 and c.compute_floor_ms > c.bytes_floor_ms
    fast, _ = served_model(K26, Sharding(tp=1), "h200")
    assert fast.cost(131072, 9).binds == "bandwidth"


@pytest.mark.parametrize("parts, word", [
    (dict(bytes_ms=5.0, compute_ms=2.0, launch_ms=1.0), "bandwidth-bound"),
    (dict(bytes_ms=5.0, compute_ms=6.0, launch_ms=1.0), "compute-bound"),
    (dict(bytes_ms=0.5, launch_ms=1.0, sync_ms=0.9), "launch-bound"),
    (dict(bytes_ms=0.5, launch_ms=1.0, sync_ms=1.1), "host-bound"),  # syncs are their own part, not the launches'
    (dict(bytes_ms=0.5, launch_ms=1.0, comm_ms=3.0), "communication-bound"),
    (dict(bytes_ms=1.0, launch_ms=1.0), "bandwidth-bound"),  # a tie goes to the work
    (dict(bytes_ms=None, compute_ms=None), "bandwidth-bound"),
])
def test_the_one_rule(parts, word):
    assert step_bound(**parts) == word and word in BOUNDS


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_no_row_says_two_bounds(gpu):
    """Every served preset on every GPU, with a step measured, eager with syncs or not: the floor's ``binds``, the
    row's ``step_bound`` and the gap split are the same word (issue 63: one row said "weights" and "launch-bound")."""
    from ddprobe.physics.models import PRESETS as SERVED

    for name, spec in SERVED.items():
        tp = 8 if spec.n_routed_experts else 1  # an all-reduce time only where there are all-reduces (tp > 1)
        m, _ = served_model(spec, Sharding(tp=tp, allreduce_us=20.0 if tp > 1 else None), gpu)
        for mm in (m, with_launches(replace(m, graphs=False), gpu, 3000, syncs=40)):
            for ctx in (1, 4096, 262144):
                row = floor_row(FloorInput(mm, 9), ctx, step_ms=1e4)
                assert row.step_bound == bound_word(row.binds) == gap_split(mm.cost(ctx, 9), 1e4)["bound"], \
                    (name, ctx)
    assert bound_word("KV") == bound_word("weights") == "bandwidth-bound" and bound_word("launches") == "launch-bound"


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


def test_the_kernel_floor_by_hand():
    """One definition: SGLang's k2 verify attention at 32k reads 37.7 MB of KV per call; over the H100's datasheet
    (3.35 TB/s) that is 11.25 us, over a measured 3.0 TB/s copy ceiling 12.57 us, and the basis says which. 1 GFLOP
    against 1 MB at the H100's 989 TFLOP/s: 1.01 us of FLOPs beside 0.30 us of bytes, compute-bound."""
    from ddprobe.physics.step_model import kernel_floor

    d = kernel_floor(37.7e6, bw_Bps=3.35e12, flops_per_s=989e12, gpu="h100")
    assert d.us == pytest.approx(11.254, rel=1e-3) and d.bound == "bandwidth-bound"
    assert d.basis.startswith("the datasheet (h100: 3.35 TB/s")
    m = kernel_floor(37.7e6, copy_Bps=3.0e12, matmul_flops=700e12, bw_Bps=3.35e12)
    assert m.us == pytest.approx(12.567, rel=1e-3) and m.basis.startswith("measured ceilings (3 TB/s, 700 TFLOP/s")
    c = kernel_floor(1e6, 1e9, bw_Bps=3.35e12, flops_per_s=989e12)
    assert c.us == pytest.approx(1.0111, rel=1e-3) and c.bound == "compute-bound"
    with pytest.raises(DDProbeError, match="needs a bandwidth"):
        kernel_floor(1e6)
