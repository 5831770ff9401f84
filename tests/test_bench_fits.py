"""A bench file's fixed part and marginal rate per path (reports.bench.Fit): read from real device files and from
files written here with known lines; shown by `ddprobe report` and printed by `bench verify` after its table."""
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddprobe.cli.app import app
from ddprobe.cli.bench import fit_lines
from ddprobe.reports import bench, load
from ddprobe.timing import NOISE

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "examples" / "baselines" / "bench-verify-h100.json"
H200 = ROOT / "examples" / "baselines" / "bench-verify-h200.json"


def _rows(path: Path, name: str, heads: int) -> dict[int, dict]:
    """The file's own rows of one path at one head count, by context, read as plain JSON."""
    return {r["ctx"]: r for r in json.loads(path.read_text())["results"]
            if r.get("path") == name and r.get("heads") == heads and r.get("kind") is None and r.get("us")}


@pytest.mark.parametrize("path", [H100, H200])
def test_the_tail_kernel_fit_is_the_line_through_its_two_longest_times(path):
    """split_ws at 8 heads runs the CUDA kernel up to 32k and the tail kernel from 64k: one fit per kernel, each
    through its own two longest contexts, its numbers those of the file's rows."""
    rows = _rows(path, "split_ws", 8)
    a, b = rows[65536], rows[131072]
    assert a["kernel"] == b["kernel"] == "tail" and rows[32768]["kernel"] == "cuda"
    fs = {(f.kernel, f.ctx1): f for f in bench.fits(load.load_one(path)) if f.path == "split_ws" and f.heads == 8}
    assert set(fs) == {("cuda", 32768), ("tail", 131072)} and fs["cuda", 32768].ctx0 == 8192
    f = fs["tail", 131072]
    dt = b["us"] - a["us"]
    assert f.fixed_us == pytest.approx(b["us"] - 2 * dt)  # 128k is twice 64k: the line at no context
    assert f.marginal_GBps == pytest.approx((b["bytes"] - a["bytes"]) / (dt * 1e-6) / 1e9)
    assert f.marginal_TFLOPs == pytest.approx((b["flops"] - a["flops"]) / (dt * 1e-6) / 1e12)
    assert f.bound == "bandwidth-bound" and f.time1_us == b["us"] and f.floor1_us == b["floor_us"]


def test_what_the_time_over_the_kernel_floor_is_made_of_is_named():
    """On the H100 the tail kernel streams the added context at about copy speed, so its time over the kernel floor
    is its fixed part; the sm_120 proxy's fixed part is a few us and its time over the kernel floor is its streaming
    rate;
    at 64 heads (compute-bound) the rate is said against the matmul rate."""
    r = load.load_one(H100)
    fl = bench.floors(r)
    by = {(f.path, f.heads, f.ctx1): f for f in bench.fits(r)}
    tail = bench.describe(by["split_ws", 8, 131072], fl)
    copy = json.loads(H100.read_text())["ceilings"]["copy_GBps"]
    share = by["split_ws", 8, 131072].marginal_GBps / copy
    assert share > 0.9 and f"({share:.0%} of copy)" in tail and tail.endswith("most is the fixed part")
    assert tail.startswith("8 heads, split_ws (tail kernel), 64k -> 128k: fixed part ")
    proxy = by["split[build=sm_120]", 8, 131072]
    assert proxy.fixed_us < 0.05 * proxy.time1_us
    assert bench.describe(proxy, fl).endswith("most is the marginal rate")
    wide = bench.describe(by["split_ws", 64, 131072], fl)
    assert "marginal rate" in wide and "of matmul)" in wide and "KV bandwidth" not in wide


def _file(tmp_path: Path, rows: list[dict], ceilings: bool = True, name: str = "bench.json") -> Path:
    doc = {"meta": {"date": "2026-12-08", "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "triton": "3.6.0",
                    "python": "3.12.3", "command": "ddprobe bench verify", "sm_count": 132},
           "ceilings": {"copy_GBps": 3000.0, "bf16_mm_TFLOPs": 780.0} if ceilings else {}, "results": rows}
    f = tmp_path / name
    f.write_text(json.dumps(doc))
    return f


def _row(path: str, ctx: int, us: float, **kw) -> dict:
    nbytes = (ctx + 9) * 1152
    return dict(ctx=ctx, heads=8, rows=9, path=path, us=us, bytes=nbytes, flops=72 * ctx * 1088 * 2,
                floor_us=nbytes / 3000e9 * 1e6, GBps=nbytes / us / 1e3, rel_err=1e-3, **kw)


def test_a_known_line_is_read_back_and_flat_falling_and_single_contexts_are_said(tmp_path):
    """Times on the line 20 us + bytes / 2.5 TB/s give back 20 us and 2.5 TB/s (from the two longest contexts only:
    the 1k point, off the line, is not read); times within the noise or falling give no line and say why; a path
    timed at one context has no fit."""
    line = [_row("k", c, 20.0 + c * 1152 / 2.5e12 * 1e6) for c in (32768, 65536)] + [_row("k", 1024, 99.0)]
    t = 50.0
    flat = [_row("flat", 65536, t), _row("flat", 131072, t * (1 + NOISE / 2))]
    dip = [_row("dip", 65536, t), _row("dip", 131072, t * (1 - NOISE / 2))]  # falls, but within the noise
    falling = [_row("down", 65536, 60.0), _row("down", 131072, 50.0)]
    wrong = [_row("wrong", 65536, 40.0), _row("wrong", 131072, 60.0, ok=False)]  # a wrong output is no time
    f = _file(tmp_path, line + flat + dip + falling + wrong + [_row("once", 131072, 70.0)])
    fs = {x.path: x for x in bench.fits(load.load_one(f))}
    assert set(fs) == {"k", "flat", "dip", "down"}
    assert fs["dip"].fixed_us is None and "within the noise of each other" in fs["dip"].note
    assert fs["k"].fixed_us == pytest.approx(20.0) and fs["k"].marginal_GBps == pytest.approx(2500.0)
    assert (fs["k"].ctx0, fs["k"].ctx1) == (32768, 65536)
    assert fs["flat"].fixed_us is None and "within the noise of each other" in fs["flat"].note
    assert fs["down"].fixed_us is None and "falling with context" in fs["down"].note
    lines = {line.split(",")[1].strip(): line for line in fit_lines(f)}
    assert "8 heads, k, 32k -> 64k: fixed part 20 us" in lines["k"] \
        and "marginal KV bandwidth 2.5 TB/s (83% of copy)" in lines["k"]
    assert lines["down"] == ("8 heads, down, 64k -> 128k: no fixed part read: its times at 64k and 128k are falling "
                             "with context")


def _line_through(path: str, fixed: float, floor_us: float, time_us: float, **kw) -> list[dict]:
    """Rows at 64k and 128k on the line through ``fixed`` at no context and ``time_us`` at 128k, the 128k kernel
    floor set to ``floor_us``."""
    a, b = _row(path, 65536, (fixed + time_us) / 2, **kw), _row(path, 131072, time_us, **kw)
    b["floor_us"] = floor_us
    return [a, b]


def test_which_part_the_time_over_the_kernel_floor_mostly_is_and_a_line_below_zero(tmp_path):
    """At 128k, 100 us against a 50 us kernel floor: a 30 us fixed part leaves 20 us of streaming over it (mostly the
    fixed part, though the fixed part is less than the 50 us over the floor); a 20 us one leaves 30 (mostly the
    marginal rate). A line below zero at no context has no fixed part and says where it is. The kernel is named
    unless it is the path's own name (a variant's label included)."""
    rows = (_line_through("a", 30.0, 50.0, 100.0) + _line_through("b", 20.0, 50.0, 100.0)
            + _line_through("c", -10.0, 50.0, 100.0)
            + _line_through("split_ws[bound=128k,tail=1]", 25.0, 50.0, 100.0, kernel="tail")
            + _line_through("paged", 25.0, 50.0, 100.0, kernel="paged"))
    f = _file(tmp_path, rows)
    r = load.load_one(f)
    fs = {x.path: x for x in bench.fits(r)}
    assert fs["a"].fixed_us == pytest.approx(30.0) and fs["b"].fixed_us == pytest.approx(20.0)
    assert fs["c"].intercept_us == pytest.approx(-10.0) and fs["c"].fixed_us == 0.0
    said = {p: bench.describe(x, bench.floors(r)) for p, x in fs.items()}
    assert said["a"].endswith("of its 50 us over the kernel floor, most is the fixed part")
    assert said["b"].endswith("of its 50 us over the kernel floor, most is the marginal rate")
    assert "no fixed part (the line through both times is -10 us at no context)" in said["c"]
    assert said["split_ws[bound=128k,tail=1]"].startswith("8 heads, split_ws[bound=128k,tail=1] (tail kernel), 64k")
    assert said["paged"].startswith("8 heads, paged, 64k")


def test_without_measured_ceilings_the_rate_is_said_against_the_datasheet(tmp_path):
    """A file without ceilings: the share is over its GPU's datasheet, named as such (never "of copy"), in the line
    and in the report's table alike."""
    from ddprobe.physics.gpus import gpu_spec_for

    g = gpu_spec_for("NVIDIA H100 80GB HBM3")
    f = _file(tmp_path, _line_through("a", 20.0, 40.0, 80.0), ceilings=False)
    r = load.load_one(f)
    (fit,) = bench.fits(r)
    share = fit.marginal_GBps * 1e9 / g.bw_Bps
    text = bench.describe(fit, bench.floors(r))
    assert f"({share:.0%} of the {g.name} datasheet's {g.bw_Bps / 1e12:.3g} TB/s)" in text and "of copy" not in text
    out = CliRunner().invoke(app, ["report", str(f), "-o", str(tmp_path / "r.md")])
    assert out.exit_code == 0, out.output
    assert f"| {share:.0%} of the {g.name} datasheet's {g.bw_Bps / 1e12:.3g} TB/s |" in (tmp_path / "r.md").read_text()


def test_the_report_shows_the_fits_and_its_findings_name_the_fastest_paths(tmp_path):
    r = CliRunner().invoke(app, ["report", str(H100), str(H200), "-o", str(tmp_path / "r.md")])
    assert r.exit_code == 0, r.output
    md = (tmp_path / "r.md").read_text()
    assert md.count("### Fixed part and marginal rate per path") == 2
    for path in (H100, H200):
        f = next(x for x in bench.fits(load.load_one(path)) if x.path == "split_ws" and x.heads == 8 and x.ctx1 == 131072)
        assert f"- {bench.describe(f, bench.floors(load.load_one(path)))}." in md


def test_the_lines_docs_bench_shows_are_what_the_baseline_gives():
    """docs/bench.md's example lines are printed from the H100 baseline file as they stand there."""
    text = (ROOT / "docs" / "bench.md").read_text().split("### Fixed part and marginal rate", 1)[1]
    block = text.split("```text\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2 and all(line in fit_lines(H100) for line in block)
