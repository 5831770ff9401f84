"""Progress of the measured cells: plain and quiet when stderr is not a terminal (one line per cell, no escape
codes, stdout's table and the results untouched), live bars on a terminal (on stderr, or under the table when
stdout is the same terminal, and gone at the end), the hooks' numbers from the real tiny engine, and the ETAs."""
import io
import json
import re

import pytest
from rich.console import Console
from rich.live import Live
from rich.table import Table
from typer.testing import CliRunner

from ddprobe.cli import app
from ddprobe.cli.progress import CellDisplay, decode_eta, prefill_eta
from ddprobe.probes.commit import CellProgress, cell_order, prompt_ids, run_commit_probe
from ddprobe.probes.backends.engine import EngineBackend
from ddprobe.probes.bench.estimate import PrefillFit
from ddprobe.results import Result, ResultWriter, RunMeta

ESC = re.compile(r"\x1b\[")


@pytest.fixture(scope="module")
def engine():
    return EngineBackend(max_ctx=2048)


class Recorder(CellProgress):
    def __init__(self):
        self.events = []

    def cell_started(self, kind, ctx, prompt_tokens, max_new_tokens):
        self.events.append(("start", kind, ctx, prompt_tokens, max_new_tokens))

    def prefill(self, done, total):
        self.events.append(("prefill", done, total))

    def decoded(self, n):
        self.events.append(("decoded", n))

    def cell_done(self, row):
        self.events.append(("done", None if row is None else (row["text"], row["ctx"])))


def cells_of(events):
    out, cur = [], None
    for e in events:
        if e[0] == "start":
            cur = {"start": e, "prefill": [], "decoded": []}
        elif e[0] == "prefill":
            cur["prefill"].append(e[1:])
        elif e[0] == "decoded":
            cur["decoded"].append(e[1])
        else:
            cur["done"] = e[1]
            out.append(cur)
    return out


def test_hooks_report_prefill_then_decode_of_every_cell(engine):
    rec = Recorder()
    rows = run_commit_probe(engine, [512, 256], ["predictable", "novel"], 12,
                            ResultWriter(Result("commit", RunMeta.collect(probe_gpu=False))), progress=rec)
    cells = cells_of(rec.events)
    assert [c["done"] for c in cells] == [(r["text"], r["ctx"]) for r in rows] == cell_order([512, 256],
                                                                                          ["predictable", "novel"])
    for c, row in zip(cells, rows):
        _, kind, ctx, n_prompt, new = c["start"]
        assert n_prompt == ctx == row["prompt_tokens"] and new == 12
        pre = c["prefill"]
        assert pre[0] == (row["reused_tokens"], n_prompt) and pre[-1] == (n_prompt, n_prompt)  # reused first, all last
        assert [d for d, _ in pre] == sorted(d for d, _ in pre)
        assert c["decoded"][0] == 1 and sum(c["decoded"]) == row["completion_tokens"] == 12  # prefill's token first


def test_cli_without_a_terminal_is_one_plain_line_per_cell(tmp_path):
    path, csv = tmp_path / "c.json", tmp_path / "c.csv"
    r = CliRunner().invoke(app, ["commit", "--ctx", "256,512", "--text", "novel,predictable", "--max-new-tokens", "8",
                                 "--json", str(path), "--csv", str(csv)])
    assert r.exit_code == 0, r.output
    assert not ESC.search(r.stderr) and not ESC.search(r.stdout)
    cell_lines = [line for line in r.stderr.splitlines() if line.startswith("[")]
    assert cell_lines == ["[1/4] novel @ 256: prefill 256 tokens, decode 8", "[2/4] novel @ 512: prefill 512 tokens, decode 8",
                          "[3/4] predictable @ 256: prefill 256 tokens, decode 8",
                          "[4/4] predictable @ 512: prefill 512 tokens, decode 8"]
    assert "prefill" not in r.stdout.split("commit length")[0]  # nothing of the progress on stdout
    main, provenance = r.stdout.split("where the commits come from")  # the commit table, then where they come from
    for table in (main, provenance):
        table_rows = [line.split()[:2] for line in table.splitlines()
                      if line.lstrip().startswith(("novel", "predictable"))]
        assert table_rows == [["novel", "256"], ["novel", "512"], ["predictable", "256"], ["predictable", "512"]]
    assert r.stdout.rstrip().splitlines()[-1] == f"4 cell(s) written to {path} and {csv}"  # the last line
    rows = Result.load(path).rows
    assert [(row["text"], row["ctx"]) for row in rows] == [("novel", 256), ("novel", 512), ("predictable", 256),
                                                           ("predictable", 512)]
    assert all(isinstance(row["reused_tokens"], int) for row in rows)
    assert csv.read_text().splitlines()[0].split(",")[:5] == ["backend", "text", "ctx", "prompt_tokens",
                                                              "reused_tokens"]
    assert json.loads(path.read_text())["summary"]["timing"]["cells"] == 4


def test_live_bars_on_a_terminal_then_gone(engine):
    buf = io.StringIO()
    term = Console(file=buf, force_terminal=True, width=120)
    with CellDisplay(term, 2, PrefillFit(0.0, 1e-5, 1e-8), live=True) as d:
        run_commit_probe(engine, [512], ["predictable", "novel"], 8,
                         ResultWriter(Result("commit", RunMeta.collect(probe_gpu=False))), progress=d)
        d.progress.refresh()
        shown = d.progress.get_renderable()
        text = Console(width=120, file=io.StringIO(), color_system=None)
        text.print(shown)
        assert "cells 2/2" in text.file.getvalue()
    out = buf.getvalue()
    assert ESC.search(out)  # drawn live
    assert "cells" in out and "elapsed" in out
    assert d.done_cells == 2


def test_bars_join_the_tables_live_region_when_stdout_is_the_terminal(engine):
    buf = io.StringIO()
    term = Console(file=buf, force_terminal=True, width=120)
    table = Table("text")
    with Live(table, console=term, transient=False, redirect_stderr=False, redirect_stdout=False) as live:
        with CellDisplay(term, 1, embed_in=live) as d:
            assert live.get_renderable() is not table  # the table and the bars, one region
            run_commit_probe(engine, [256], ["novel"], 8,
                             ResultWriter(Result("commit", RunMeta.collect(probe_gpu=False))), progress=d)
        assert live.get_renderable() is table  # the bars leave with the run


def test_a_backend_without_hooks_gets_start_and_end_only(engine):
    class Plain(EngineBackend):  # what an HTTP backend offers: generate(ids, n), nothing else
        def __init__(self, inner):
            self.__dict__.update(inner.__dict__)

        def generate(self, ids, n):
            return super().generate(ids, n)

    rec = Recorder()
    run_commit_probe(Plain(engine), [256], ["novel"], 8,
                     ResultWriter(Result("commit", RunMeta.collect(probe_gpu=False))), progress=rec)
    assert [e[0] for e in rec.events] == ["start", "done"]
    buf = io.StringIO()
    d = CellDisplay(Console(file=buf, force_terminal=True, width=100), 1, live=True)
    d.cell_started("novel", 256, 256, 8)
    task = d.progress.tasks[d.cell_task]
    assert task.fields["phase"] == "wait" and task.total is None  # a spinner and the time elapsed


def test_a_failed_cell_still_ends_its_bar_and_writes_nothing(engine):
    class CtrlC(Recorder):  # the user presses Ctrl-C during the first cell's decode
        def decoded(self, n):
            super().decoded(n)
            raise KeyboardInterrupt

    rec, w = CtrlC(), ResultWriter(Result("commit", RunMeta.collect(probe_gpu=False)))
    with pytest.raises(KeyboardInterrupt):
        run_commit_probe(engine, [256], ["novel"], 8, w, progress=rec)
    kinds = [e[0] for e in rec.events]
    assert kinds[0] == "start" and kinds[-2:] == ["decoded", "done"] and kinds.count("decoded") == 1
    assert rec.events[-1] == ("done", None) and w.result.rows == []


def test_prefill_eta_follows_the_quadratic_fit():
    fit = PrefillFit(c=0.0, a=0.0, b=1e-8)
    # half the tokens done is a quarter of the work: three times as long again, at the measured pace
    assert prefill_eta(8192, 16384, 0, 2.0, fit) == pytest.approx(6.0)
    # with 4096 reused, the work done so far is T(8192) - T(4096)
    assert prefill_eta(8192, 16384, 4096, 1.0, fit) == pytest.approx((16384 ** 2 - 8192 ** 2) / (8192 ** 2 - 4096 ** 2))
    # nothing done yet: the calibration's own guess, less the time already spent
    assert prefill_eta(0, 10000, 0, 0.25, fit) == pytest.approx(1.0 - 0.25)
    # no fit: tokens left at the rate so far; nothing known before the first chunk
    assert prefill_eta(1000, 4000, 0, 1.0) == pytest.approx(3.0)
    assert prefill_eta(0, 4000, 0, 1.0) is None and prefill_eta(4000, 4000, 0, 9.0) == 0.0
    assert decode_eta(33, 129, 1.0) == pytest.approx(3.0) and decode_eta(1, 129, 1.0) is None


class _Nvml:  # a GPU reader for the sampler (there is no GPU here); the engine itself is the real one
    def __init__(self):
        self.handles, self.sources = [0], {"gpm": "ok"}

    def name(self, i): return "NVIDIA H200"
    def open(self): return [{"index": 0, "name": "NVIDIA H200"}]
    def sample(self): return [self.read(0)]
    def close(self): pass

    def read(self, i):
        return {"power_W": 140.0, "power_limit_W": 700.0, "util_gpu_pct": 100.0}


def test_gpu_util_request_is_one_cell_and_the_estimate_runs_inside_the_warmup(engine):
    from ddprobe.probes.bench.estimate import estimate_run
    from ddprobe.probes.gpu_util import run_gpu_util

    rec, est = Recorder(), []
    w = ResultWriter(Result("gpu-util", RunMeta.collect(probe_gpu=False)))
    res = run_gpu_util(engine, 512, 8, 0.01, w, reader_factory=_Nvml, progress=rec,
                       after_warmup=lambda: est.append(estimate_run(engine, [("novel", 512)], 8, reuse=False)))
    (cell,) = cells_of(rec.events)
    assert cell["start"] == ("start", "novel", 512, 512, 8) and cell["prefill"][-1] == (512, 512)
    assert sum(cell["decoded"]) == res.summary["request"]["completion_tokens"] == 8
    assert est[0] is not None and est[0].cells == [("novel", 512, 0)] and est[0].total_s > 0
    assert [m[1] for m in res.summary["markers"]] == ["warmup", "idle", "prefill", "decode", "idle"]
