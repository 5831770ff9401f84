"""Reports from the recorded results files in tests/data: HTML and markdown render, every section and
image is there, metadata is shown, errors name the file, and the HTML loads in headless Chromium."""
import base64
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddprobe.cli import app
from ddprobe.reports import load, render
from ddprobe.units import DDProbeError

DATA = Path(__file__).parent / "data"
FILES = sorted(DATA.glob("*.json"))
KINDS = {"commit", "floor", "bench-verify", "gpu-util"}
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One report from every file in tests/data, written as HTML and as markdown (plots drawn once)."""
    out = tmp_path_factory.mktemp("report")
    report = render.build([DATA], command="ddprobe report tests/data")
    return report, render.write(report, out / "report.html"), render.write(report, out / "report.md")


def test_fixtures_cover_every_kind():
    assert {load.load_one(f).kind for f in FILES} >= KINDS


def test_html_is_self_contained_with_every_section_and_plot(built):
    report, (html_path, *rest), _ = built
    assert rest == []  # one file, nothing beside it
    html = html_path.read_text()
    assert {s.kind for s in report.sections} >= KINDS and len(report.sections) == len(FILES)
    for s in report.sections:
        assert f'<section id="{s.id}"' in html and s.findings and s.figures
    srcs = re.findall(r'<img src="([^"]+)"', html)
    assert len(srcs) == sum(len(s.figures) for s in report.sections) >= 8
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG)
    assert not re.search(r'(src|href)="(https?:)?//', html) and "<link" not in html and "<script" not in html
    assert 'name="viewport"' in html


def test_summary_says_the_findings_in_words(built):
    html = built[1][0].read_text()
    summary = html[html.index('id="summary"'):html.index("<nav>")]
    assert "bandwidth-bound at every context" in summary and "compute-bound" in summary  # bound type
    assert "split buys" in summary and "over paged" in summary  # what the split path buys
    # gap to the floor, from the floor file's inputs: K2.6 at 185k = 189,440 tokens x 70,272 B = 13.3 GB; at
    # 1.792 TB/s that is 7.43 ms; the measured 1430 ms step is 192x that
    assert round(1430 / (189440 * 70272 / 1.792e12 * 1e3)) == 192
    assert "Attention gap" in summary and "192x" in summary  # an older file: the attention's floor, so named
    assert "Drafter NOT accepting" in summary  # random-weight tiny engine: commit length 1
    assert "decode (GPU 0, 1): latency-bound" in summary  # per phase, from gpu-util
    # the real H200 run (bench_verify.py's raw JSON), its numbers read here from the file and the ratios
    # worked out by hand: paged 9955.5 us / split 139.6 us per layer = 71.3x at 128k and 8 heads; the
    # 61-layer paged attention 604.8 ms against its 2.19 ms kernel floor = 276x.
    raw = json.loads((DATA / "bench-verify-h200-raw.json").read_text())["results"]
    at = {(r.get("kind"), r["path"]): r for r in raw if r.get("ctx") == 131072 and r.get("heads") == 8}
    paged_us, split_us = at[(None, "paged")]["us"], at[(None, "split")]["us"]
    assert round(paged_us / split_us, 1) == 71.3
    assert f"8 heads: split buys {paged_us / split_us:.1f}x over paged at 128k ({paged_us / 1e3:.2f} ms -&gt; " \
           f"{split_us:.0f} us per layer)" in summary
    step = at[("step61", "paged")]
    assert round(step["step_ms"] / step["floor_ms"]) == 276
    assert f"Verify attention of all layers at 128k, 8 heads, paged: {step['step_ms']:.0f} ms, " \
           f"{step['step_ms'] / step['floor_ms']:.0f}x its kernel floor {step['floor_ms']:.2f} ms." in summary


def test_metadata_shown_for_every_result(built):
    html = built[1][0].read_text()
    for f in FILES:
        meta = load.load_one(f).meta
        sec = html[html.index(f"<th>file</th><td>{f.name}</td>"):]
        sec = sec[:sec.index("</table>")]
        for label in ("GPU", "driver", "torch", "triton", "python", "date (UTC)", "command"):
            assert f"<th>{label}</th>" in sec
        assert meta.date_utc in sec and meta.python in sec
        if meta.gpus:
            assert meta.gpus[0]["name"] in sec and (meta.gpus[0]["driver"] or "-") in sec
    assert "NVIDIA H200 x2" in html and "none (CPU)" in html


def test_markdown_with_images_in_a_folder_beside_it(built):
    report, _, (md_path, *images) = built
    md = md_path.read_text()
    assert len(images) == sum(len(s.figures) for s in report.sections)
    for img in images:
        assert img.parent == md_path.parent / "report_files" and img.read_bytes().startswith(PNG)
        assert f"](report_files/{img.name})" in md
    for s in report.sections:
        assert f"## {s.title}" in md
    assert "| path | heads | ctx | time |" in md and "## Summary" in md


def test_subset_and_unknown_kind_render(tmp_path):
    unknown = json.loads((DATA / "commit-tiny-cpu.json").read_text())
    unknown.update(kind="mystery-probe", rows=[{"a_ms": 1.5, "b": "x|y"}, {"a_ms": 2, "c": [1, 2]}])
    (tmp_path / "u.json").write_text(json.dumps(unknown))
    out = tmp_path / "sub.md"
    render.write_report([DATA / "floor-rtx-pro-6000-tp8.json", tmp_path / "u.json"], out)
    md = out.read_text()
    assert "Bandwidth floor" in md and "mystery-probe" in md and "no analysis for it yet" in md
    assert "x\\|y" in md  # pipes escaped in markdown cells


def test_raw_bench_verify_output_is_read(tmp_path):
    """`ddprobe bench verify`'s own JSON (meta/ceilings/results, `us`, `step61`) reads as bench-verify."""
    raw = {"meta": {"date": "2026-11-29", "gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0",
                    "python": "3.12.3", "command": "bench_verify.py", "sm_count": 132},
           "ceilings": {"copy_GBps": 4240.0, "bf16_mm_TFLOPs": 790.0},
           "results": [{"ctx": 131072, "heads": 8, "rows": 9, "path": "split", "bytes": 1.5e8, "flops": 2e10,
                        "floor_us": 35.6, "us": 46.0, "GBps": 3260.0, "rel_err": 3e-3},
                       {"ctx": 131072, "heads": 8, "rows": 9, "path": "paged", "bytes": 1.5e8, "floor_us": 35.6,
                        "error": "OutOfResources: shared memory"},
                       {"kind": "step61", "ctx": 131072, "heads": 8, "path": "split", "step_ms": 2.9,
                        "floor_ms": 2.2, "GBps": 3100.0, "bytes": 9e9}]}
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    r = load.load_one(tmp_path / "raw.json")
    assert r.kind == "bench-verify" and r.meta.gpus[0]["name"] == "NVIDIA H200"
    report = render.build([tmp_path / "raw.json"])
    text = " ".join(report.sections[0].findings)
    assert "fastest path is split" in text and "1 entry failed: paged" in text and "2.9 ms" in text


@pytest.mark.parametrize("content, message", [
    (None, "not found"), ("{oops", "not valid JSON"), ('{"hello": 1}', "not a ddprobe results file"),
    ('{"schema": "ddprobe.result/1", "kind": "floor"}', "malformed results file"),
])
def test_bad_files_are_named(tmp_path, content, message):
    f = tmp_path / "bad.json"
    if content is not None:
        f.write_text(content)
    with pytest.raises(DDProbeError, match=message) as e:
        render.write_report([DATA / "commit-tiny-cpu.json", f], tmp_path / "r.html")
    assert str(f) in str(e.value)


def test_malformed_rows_of_a_known_kind_are_named(tmp_path):
    d = json.loads((DATA / "floor-rtx-pro-6000-tp8.json").read_text())
    d["rows"][0].pop("kv_GB")
    (tmp_path / "floor.json").write_text(json.dumps(d))
    with pytest.raises(DDProbeError, match=r"floor\.json: row 1 of this floor file: 'kv_GB' is missing \(required\)$"):
        render.build([tmp_path / "floor.json"])


def test_cli_report_and_errors(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["report", str(DATA / "commit-tiny-cpu.json"), "-o", str(tmp_path / "c.md")])
    assert r.exit_code == 0, r.output
    assert "report written to" in r.output and (tmp_path / "c_files").is_dir()
    r = runner.invoke(app, ["report", str(tmp_path / "nope.json"), "-o", str(tmp_path / "x.html")])
    assert r.exit_code == 1 and "nope.json" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["report", str(DATA), "-o", str(tmp_path / "x.pdf")])
    assert r.exit_code == 1 and "use .html or .md" in r.output
    (tmp_path / "empty").mkdir()
    r = runner.invoke(app, ["report", str(tmp_path / "empty")])
    assert r.exit_code == 1 and "holds no results files" in r.output


def test_reports_never_import_torch():
    code = ("import sys, ddprobe.reports.render, ddprobe.reports.gate, ddprobe.reports.sections; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- the HTML in a real browser ----------------------------------------------------------------------

@pytest.mark.parametrize("width", [390, 1400], ids=["phone", "wide"])
def test_html_in_headless_chromium(load_in_browser, built, width):
    report, (html_path,), _ = built
    got = load_in_browser(html_path.read_text(), width)
    n = sum(len(s.figures) for s in report.sections)
    assert got["images"] == n and got["loaded"] == n and got["shown"] == n
    assert got["sections"] == ["summary"] + [s.id for s in report.sections]
    assert got["overflow"] <= 0, "page wider than the window: tables or images overflow"


def test_commit_table_shows_sglangs_accept_length_beside_commit_len(tmp_path):
    # 128 tokens in 16 steps: commit_len = (128 - 1) / 16 = 7.94 (the prefill's token in no step); SGLang's
    # completion / verify = 128 / 16 = 8.00
    d = json.loads((DATA / "commit-tiny-cpu.json").read_text())
    for row in d["rows"]:
        row.update(completion_tokens=128, verify_steps=16, commit_len=127 / 16, sglang_accept_length=128 / 16)
    (tmp_path / "c.json").write_text(json.dumps(d))
    table = render.build([tmp_path / "c.json"]).sections[0].tables[0]
    i, j = table.columns.index("commit len"), table.columns.index("SGLang accept len")
    assert {(row[i], row[j]) for row in table.rows} == {("7.94", "8.00")}


def test_where_the_step_goes_flags_steps_below_the_whole_step_floor(tmp_path):
    """ddprobe floor with steps too fast for K2.6 at tp 8 (10 ms at 32k: below its ~10.4 ms whole-step floor;
    20 ms at 128k: above it): the report's "Where the step goes" table marks the first row, not the second, and
    says what a step below its floor means."""
    res = CliRunner().invoke(app, ["floor", "--ctx", "32k,128k", "--step-ms", "10,20", "--tp", "8",
                                   "-o", str(tmp_path / "floor.json")])
    assert (tmp_path / "floor.json").exists(), res.output
    rows = json.loads((tmp_path / "floor.json").read_text())["rows"]
    assert [r["below_floor"] for r in rows] == [True, False]
    render.write_report([tmp_path / "floor.json"], tmp_path / "r.md")
    md = (tmp_path / "r.md").read_text()
    table = md[md.rindex("Where the step goes (per GPU)"):]
    lines = [ln for ln in table.splitlines() if ln.startswith("| 32k") or ln.startswith("| 128k")]
    assert len(lines) == 2 and "below the floor" in lines[0] and "below the floor" not in lines[1]
    assert "A row below the floor: step below the floor: check --tp/--ep" in table


def test_a_bench_launch_file_is_read_into_what_it_means():
    """The H100's real `bench launch` file (tests/data/launch/): the report says the least time per kernel, eager and
    per sync, read from the file's rows, and what the step model makes of them."""
    f = DATA / "launch" / "bench-launch-h100.json"
    rows = {x["kind"]: x["us"] for x in json.loads(f.read_text())["rows"]}
    report = render.build([f])
    (s,) = report.sections
    assert s.kind == "bench-launch" and s.title.startswith("The least time per kernel")
    least = min(rows["graph-empty"], rows["graph-small"])  # the floor's least graph time: the smaller of the two
    assert s.findings[0].startswith(f"On NVIDIA H100 80GB HBM3 a kernel replayed in a CUDA graph takes at least "
                                    f"{least:.3g} us (the least of graph-empty {rows['graph-empty']:.3g} us and "
                                    f"graph-small {rows['graph-small']:.3g} us)")
    assert f"{rows['eager-small']:.3g} us" in s.findings[1] and f"{rows['sync']:.3g} us" in s.findings[1]
    assert "no analysis" not in " ".join(s.findings)


def _no_ceilings(tmp_path, gpu: str) -> Path:
    """The synthetic bench-verify file (H200) with its measured ceilings taken out and its GPU named ``gpu``."""
    d = json.loads((DATA / "bench-verify-synthetic.json").read_text())
    for where in (d["summary"], d["config"]):
        where.pop("copy_GBps"), where.pop("matmul_TFLOPs")
    d["meta"]["gpus"][0]["name"] = gpu
    f = tmp_path / f"bench-{len(gpu)}.json"
    f.write_text(json.dumps(d))
    return f


def test_a_bench_file_without_ceilings_is_over_its_gpus_datasheet_or_says_its_basis_is_unknown(tmp_path):
    """Without measured ceilings the file's floor_us was not over any datasheet: on an H200 each kernel floor is
    recomputed over the H200's 4.8 TB/s (the 8-head split path at 256k: 1.56x it, not the file's 1.38x) and said
    so; on a GPU ddprobe has no datasheet for, the file's own floor_us is shown as such and no bound is named."""
    h200 = _no_ceilings(tmp_path, "NVIDIA H200")
    r = CliRunner().invoke(app, ["report", str(h200), "-o", str(tmp_path / "h200.md")])
    assert r.exit_code == 0, r.output
    md = " ".join((tmp_path / "h200.md").read_text().split())
    assert "over the datasheet: no ceilings measured" not in md
    assert ("split, 98.1 us per layer, 1.56x its kernel floor (over the datasheet (h200: 4.8 TB/s, 989 TFLOP/s; no "
            "ceilings measured in this file: recomputed from its bytes and FLOPs))") in md
    assert "8 heads: bandwidth-bound at every context" in md and "64 heads: compute-bound at every context" in md
    odd = _no_ceilings(tmp_path, "Some Unlisted GPU")
    r = CliRunner().invoke(app, ["report", str(odd), "-o", str(tmp_path / "odd.md")])
    assert r.exit_code == 0, r.output
    md = " ".join((tmp_path / "odd.md").read_text().split())
    assert "over the datasheet" not in md and "bound unknown (no ceilings and no datasheet for its GPU)" in md
    assert ("1.38x its kernel floor (the file's own floor_us, its basis not recorded (no ceilings measured in this "
            "file))") in md
