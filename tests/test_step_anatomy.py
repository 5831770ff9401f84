"""The whole step's anatomy in `bench verify` (issue 64): the kernels' own time against the gaps between them, from
the kernels' start and end times of a profiled replay (``timing.anatomy_of``), and ``--step-trace``'s folder."""
from typer.testing import CliRunner

from ddprobe.cli import app
from ddprobe.timing import anatomy_of


def test_kernels_and_gaps_of_each_replay_split_at_the_longest_idle():
    """Two replays of three kernels (us): 10 us kernels with 2 us launch gaps, the replays 1 ms apart (the host's
    synchronisation): per replay 3 kernels, 30 us of kernels, a 34 us span and 4 us of gaps. Overlapping kernels count
    once in the busy time; no kernels is all zeros."""
    one = [(0, 10), (12, 22), (24, 34)]
    ks = one + [(a + 1000, b + 1000) for a, b in one]
    got = anatomy_of(sorted(ks), 2)
    assert got["step_kernels"] == 3
    assert abs(got["kernels_ms"] - 0.030) < 1e-12 and abs(got["span_ms"] - 0.034) < 1e-12
    assert abs(got["gaps_ms"] - 0.004) < 1e-12
    over = anatomy_of([(0, 10), (5, 15), (20, 30)], 1)  # two kernels overlap by 5 us: busy 25 of a 30 us span
    assert abs(over["span_ms"] - 0.030) < 1e-12 and abs(over["gaps_ms"] - 0.005) < 1e-12
    assert abs(over["kernels_ms"] - 0.030) < 1e-12  # their own durations, summed
    assert anatomy_of([], 3) == {"step_kernels": 0, "kernels_ms": 0.0, "span_ms": 0.0, "gaps_ms": 0.0}


def test_step_trace_takes_a_new_or_empty_folder_only(tmp_path):
    """An earlier run's traces are never replaced: a folder with files, or a file, is one line and exit 1 (before
    any GPU is asked for)."""
    full = tmp_path / "traces"
    full.mkdir()
    (full / "step61-split_ws-131072-8h.json").write_text("{}")
    a_file = tmp_path / "f"
    a_file.write_text("x")
    for where, why in ((full, "the folder holds files already"), (a_file, "not a folder")):
        r = CliRunner().invoke(app, ["bench", "verify", "--ctx", "1k", "--step-trace", str(where),
                                     "-o", str(tmp_path / "b.json")])
        assert r.exit_code == 1 and why in r.output and "Traceback" not in r.output, r.output
    assert (full / "step61-split_ws-131072-8h.json").read_text() == "{}" and a_file.read_text() == "x"
