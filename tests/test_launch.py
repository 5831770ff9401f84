"""`ddprobe bench launch` (the least time per kernel), the foreign-message filter and the smoke step's check for
third-party warnings on the terminal."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddprobe.probes.bench.launch import check, per_kernel
from ddprobe.physics.gpus import launch_time
from ddprobe.results import Result, ResultWriter, RunMeta
from ddprobe.units import DDProbeError

ROOT = Path(__file__).resolve().parents[1]
# Inductor's message as torch 2.8-2.12 raise it (torch/_inductor/lowering.py): a leading newline, wrapped lines
ONLINE_SOFTMAX = ("\nOnline softmax is disabled on the fly since Inductor decides to\nsplit the reduction. Cut an issue "
                  "to PyTorch if this is an\nimportant use case and you want to speed it up with online\nsoftmax.\n")
TF32 = ("TensorFloat32 tensor cores for float32 matrix multiplication available but not enabled. Consider setting "
        "`torch.set_float32_matmul_precision('high')` for better performance.")


def test_per_kernel_is_the_median_of_samples_over_their_launches():
    # 1000 launches per sample: 2.0 / 2.5 / 3.0 ms per sample are 2.0 / 2.5 / 3.0 us per kernel
    r = per_kernel([3.0, 2.0, 2.5], 1000, "graph-small")
    assert (r.kind, r.us, r.kernels, r.samples) == ("graph-small", pytest.approx(2.5), 1000, 3)
    assert r.p10_us <= r.us <= r.p90_us
    with pytest.raises(DDProbeError, match="took no time"):
        per_kernel([0.0, 1.0], 10, "sync")
    with pytest.raises(DDProbeError, match="no launches timed"):
        per_kernel([], 10, "sync")
    with pytest.raises(DDProbeError, match="--kernels must be in 1..100000"):
        check(0, 5)


def test_a_launch_file_gives_the_kernel_time_figures(tmp_path):
    rows = [per_kernel([2.1], 1000, "graph-empty"), per_kernel([2.4], 1000, "graph-small"),
            per_kernel([5.0], 1000, "eager-small"), per_kernel([1.5], 100, "sync")]
    w = ResultWriter(Result(kind="bench-launch", meta=RunMeta.collect(probe_gpu=False), config={}),
                     tmp_path / "launch.json")
    for r in rows:
        w.add(r.to_dict())
    loaded = json.loads((tmp_path / "launch.json").read_text())
    kt = launch_time(loaded, "launch.json")  # the least graph time: the smaller of graph-empty and graph-small
    assert (kt.graph_us, kt.eager_us, kt.sync_us) == (pytest.approx(2.1), pytest.approx(5.0), pytest.approx(15.0))
    with pytest.raises(DDProbeError, match="without the sync row"):
        launch_time({"kind": "bench-launch", "rows": [r.to_dict() for r in rows[:3]]}, "launch.json")


def _ddprobe(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ddprobe", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**os.environ, **(env or {})})


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the no-GPU line")
def test_bench_launch_without_a_gpu_is_one_line_and_writes_nothing(tmp_path):
    p = _ddprobe("bench", "launch", "-o", str(tmp_path / "l.json"))
    assert p.returncode == 1 and p.stderr.strip() == "error: ddprobe bench launch needs a CUDA GPU (none is " \
                                                      "visible to torch here)"
    assert not (tmp_path / "l.json").exists()


def _floor_warning(tmp_path, verbose: bool):
    """`ddprobe [-v] floor --ctx 1k` in a fresh process whose floor table raises the torch-worded warning first
    (sitecustomize wraps it before the command runs)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import warnings\n"
        "import ddprobe.probes.floor as f\n"
        "_t = f.floor_table\n"
        f"f.floor_table = lambda *a, **k: (warnings.warn({TF32!r}), _t(*a, **k))[1]\n")
    log = tmp_path / "foreign.log"
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "DDPROBE_FOREIGN_LOG": str(log)}
    return _ddprobe(*(["-v"] if verbose else []), "floor", "--ctx", "1k", env=env), log


def test_the_cli_keeps_foreign_warnings_in_the_log_it_names(tmp_path):
    p, log = _floor_warning(tmp_path, verbose=False)
    assert p.returncode == 0 and "TensorFloat32" not in p.stdout + p.stderr
    assert TF32 in log.read_text() and p.stderr.strip().endswith(f"kept in {log} (-v shows them)")
    p, _ = _floor_warning(tmp_path, verbose=True)
    assert p.returncode == 0 and TF32 in p.stderr


def test_a_foreign_warning_goes_to_the_log_by_its_exact_text(tmp_path):
    """The exact torch message is kept in the log, a warning of ddprobe's own is not."""
    import warnings

    from ddprobe import foreign

    assert foreign.is_foreign(TF32) and not foreign.is_foreign("TensorFloat32 is great")
    assert foreign.is_foreign(ONLINE_SOFTMAX)
    was = os.environ.get("DDPROBE_FOREIGN_LOG")
    os.environ["DDPROBE_FOREIGN_LOG"] = str(tmp_path / "in-process.log")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            foreign.install(verbose=False)  # catch_warnings restores the hook it found when it ends
            warnings.warn(TF32)
            warnings.warn(ONLINE_SOFTMAX)
            warnings.warn("a warning of ddprobe's own")
        assert TF32 in (tmp_path / "in-process.log").read_text()
        assert "Online softmax is disabled" in (tmp_path / "in-process.log").read_text()
        assert "own" not in (tmp_path / "in-process.log").read_text()
        assert "kept in " + str(tmp_path / "in-process.log") in foreign.kept()
    finally:
        os.environ["DDPROBE_FOREIGN_LOG"] = was or ""  # the session's log (conftest), never the machine's /tmp one


def test_quiet_stderr_keeps_cpp_noise_in_the_log(tmp_path):
    """A C++ library writing to fd 2 (Kineto's profiler_start lines) lands in the log, not on stderr."""
    code = ("import os; from ddprobe import foreign\n"
            "with foreign.quiet_stderr():\n"
            "    os.write(2, b'USDT:2026-12-06 SyncActivityProfilerHandler.cpp:52] profiler_start\\n')\n"
            "os.write(2, b'after\\n'); print(foreign.kept())\n")
    log = tmp_path / "f.log"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                       env={**os.environ, "DDPROBE_FOREIGN_LOG": str(log)})
    assert p.returncode == 0 and p.stderr == "after\n" and "profiler_start" in log.read_text()
    assert str(log) in p.stdout


def test_smoke_fails_on_a_third_party_warning_line():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import smoke
    finally:
        sys.path.pop(0)
    warned = f"/x/torch/_inductor/compile_fx.py:321: UserWarning: {TF32}\n  warnings.warn(\n"
    assert smoke.foreign_line("diagnose: ok\n" + warned).startswith("/x/torch/_inductor/compile_fx.py:321")
    assert smoke.foreign_line("USDT:2026-12-06 03:46:17 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start")
    assert smoke.foreign_line("warm-up 1.2 s: kernels + capture\nfloor: ok\n") == ""


def test_bench_launch_keeps_an_earlier_results_file(tmp_path):
    """An earlier run's measurements are never replaced without --force (checked before torch or a GPU is asked)."""
    earlier = tmp_path / "launch.json"
    earlier.write_text('{"kind": "bench-launch", "rows": []}')
    p = _ddprobe("bench", "launch", "-o", str(earlier))
    assert p.returncode == 1 and "--force" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert earlier.read_text() == '{"kind": "bench-launch", "rows": []}'
