"""The duration estimate: the fits on synthetic timings (pure functions), the run plan with prefix reuse, the
line's wording and threshold, and the CLI's line and record with the real tiny engine on the CPU."""
import json
import math

import pytest
from typer.testing import CliRunner

from ddprobe.cli import app
from ddprobe.probes.bench import estimate as E
from ddprobe.probes.commit import cell_order


def test_fit_prefill_recovers_quadratic_plus_linear():
    c, a, b = 0.02, 4e-5, 6e-8
    pts = [(n, c + a * n + b * n * n) for n in (256, 512, 1024, 1536, 2048)]
    fit = E.fit_prefill(pts)
    assert fit.c == pytest.approx(c, rel=1e-6) and fit.a == pytest.approx(a, rel=1e-6)
    assert fit.b == pytest.approx(b, rel=1e-6)
    # 16x the calibration: the quadratic term carries it
    assert fit.seconds(32768) == pytest.approx(c + a * 32768 + b * 32768 ** 2, rel=1e-6)


def test_fit_prefill_never_negative():
    # noise that an unconstrained fit would turn into a negative linear term (time given back per token)
    pts = [(512, 0.060), (1024, 0.110), (2048, 0.34), (1536, 0.20)]
    fit = E.fit_prefill(pts)
    assert min(fit.c, fit.a, fit.b) >= 0
    assert all(fit.seconds(n) > 0 for n in (1, 10_000, 131_072))
    # falling times (a cache warming up) give a flat fit, not a negative one
    flat = E.fit_prefill([(512, 0.3), (2048, 0.1)])
    assert flat.a == flat.b == 0 and flat.c == pytest.approx(0.2)
    # one point: a single non-negative term through it
    one = E.fit_prefill([(1000, 0.5)])
    assert one.seconds(1000) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        E.fit_prefill([])


def test_fit_decode_linear_in_context():
    fit = E.fit_decode([(512, 0.0070 + 1e-6 * 512), (2048, 0.0070 + 1e-6 * 2048)])
    assert fit.s0 == pytest.approx(0.007) and fit.s1 == pytest.approx(1e-6)
    noisy = E.fit_decode([(512, 0.009), (2048, 0.008)])  # shorter context measured slower: no negative slope
    assert noisy.s1 == 0 and noisy.s0 == pytest.approx(0.0085)


def test_prefix_reuse_makes_a_kinds_prefill_its_longest_context():
    order = cell_order([16384, 1024, 65536], ["predictable", "novel"])
    assert order == [("predictable", 1024), ("predictable", 16384), ("predictable", 65536),
                     ("novel", 1024), ("novel", 16384), ("novel", 65536)]
    cells = E.reuse_plan(order)
    assert cells[:3] == [("predictable", 1024, 0), ("predictable", 16384, 1024), ("predictable", 65536, 16384)]
    assert cells[3] == ("novel", 1024, 0)  # a new kind starts from nothing
    fit = E.PrefillFit(c=0.01, a=3e-5, b=7e-8)
    dec = E.DecodeFit(0.0, 0.0)
    pre, _ = E.estimate_cells(cells, 128, fit, dec, 8)
    assert pre == pytest.approx(2 * (fit.cumulative(65536) + 3 * fit.c))
    pre_alone, _ = E.estimate_cells(E.reuse_plan(order, reuse=False), 128, fit, dec, 8)
    assert pre_alone == pytest.approx(2 * (sum(fit.cumulative(n) for n in (1024, 16384, 65536)) + 3 * fit.c))


def test_decode_steps_from_the_commit_guesses():
    assert E.decode_steps(128, E.commit_guess("predictable", 8)) == 16  # 127 tokens, 8 a step
    assert E.decode_steps(128, E.commit_guess("novel", 8)) == math.ceil(127 / 1.5)
    assert E.commit_guess("novel", 1) == 1.0  # never above what a step can commit
    dec = E.DecodeFit(s0=0.01, s1=1e-6)
    _, d = E.estimate_cells([("novel", 4096, 0)], 128, E.PrefillFit(0, 0, 0), dec, 8)
    assert d == pytest.approx(math.ceil(127 / 1.5) * dec.step(4096 + 64))


def test_line_only_for_long_runs_and_its_wording():
    short = E.Estimate(prefill_s=20.0, decode_s=9.0, device="cpu")
    assert short.line() is None  # under 30 s: nothing said
    long = E.Estimate(prefill_s=660.0, decode_s=180.0, device="cpu", gpu_s=40.0, gpu_name="an H200")
    assert long.line() == ("estimate: about 14 min on this CPU (prefill 11 min, decode 3 min); a GPU would take "
                           "under a minute (an H200: about 40 s)")
    gpu = E.Estimate(prefill_s=5400.0, decode_s=0.0, device="cuda")
    assert gpu.line() == "estimate: about 1.5 h on this GPU (prefill 1.5 h, decode 1 s)"
    assert [E.fmt_duration(s) for s in (0.2, 42, 754, 9000)] == ["1 s", "42 s", "13 min", "2.5 h"]
    d = long.to_dict()
    assert d["total_s"] == 840.0 and d["printed_over_s"] == E.SAY_OVER_S and d["gpu_s"] == 40.0


def test_gpu_hint_from_the_recorded_h200_run():
    # the recorded tiny H200 run: 3 ms a step, so decode is (3 x 16 predictable + 3 x 85 novel steps) x 3 ms
    # = 0.91 s; the six prompts' prefills (1k, 4k, 16k twice: 0.01-0.06 s each) add 0.1-0.3 s
    cells = E.reuse_plan(cell_order([1024, 4096, 16384], ["predictable", "novel"]), reuse=False)
    s, gpu = E.gpu_recorded("tiny", cells, 128, 8)
    decode = (3 * E.decode_steps(128, 8) + 3 * E.decode_steps(128, 1.5)) * 3.0e-3
    assert gpu == "an H200" and decode == pytest.approx(0.909) and decode + 0.1 < s < decode + 0.3
    assert E.gpu_recorded("k2", cells, 128, 8) is None


def test_cli_says_the_estimate_and_records_it_beside_the_actual_time(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    args = ["commit", "--ctx", "256,512", "--text", "predictable,novel", "--max-new-tokens", "12", "--json", str(path)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "estimate:" not in r.stderr  # a run of a few seconds: nothing said
    res = json.loads(path.read_text())
    est, timing = res["config"]["estimate"], res["summary"]["timing"]
    cal = est["calibration"]
    assert est["device"] == "cpu" and 0 < cal["seconds"] < 20  # about 0.1 s at 512 tokens on a quiet 2-core CPU
    assert [n for n, _ in cal["prefill_points"][:2]] == [128, 512]  # n/4 and n: the run's longest context
    assert est["total_s"] == pytest.approx(est["prefill_s"] + est["decode_s"]) and est["total_s"] > 0
    assert timing["estimate_s"] == est["total_s"] and timing["actual_s"] > 0 and timing["complete"] is True
    assert timing["cells"] == 4
    # the same run, told to say any estimate: one line, before the first cell
    monkeypatch.setattr(E, "SAY_OVER_S", 0.0)
    r = CliRunner().invoke(app, args + ["--force"])  # over the first run's file, on purpose
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("estimate: about ")]
    import torch

    threads = torch.get_num_threads()  # what the engine chose and the estimate assumed
    assert len(said) == 1 and f"on this CPU with {threads} thread{'s' if threads != 1 else ''} (prefill " \
        in lines[said[0]] and "a GPU would take" in lines[said[0]]
    assert said[0] < min(i for i, line in enumerate(lines) if line.startswith("[1/4]"))
