"""The engine's CPU thread count: one thread per core this process may use that other work does not keep busy;
--threads and OMP_NUM_THREADS win. Busy cores are read from /proc/stat snapshots (real files, written here)."""
import os

import pytest

from ddprobe.probes.backends import threads as th


def _stat(tmp_path, name, per_core):
    """A /proc/stat with ``per_core``: {core: (user, idle)} jiffies (the other fields 0)."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{c} {u} 0 0 {i} 0 0 0 0 0 0" for c, (u, i) in sorted(per_core.items())]
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\nintr 1 2 3\n")
    return th._cpu_times(str(p))


def test_busy_cores_from_two_snapshots(tmp_path):
    before = _stat(tmp_path, "a", {0: (100, 100), 1: (100, 100)})
    after = _stat(tmp_path, "b", {0: (200, 100), 1: (105, 195)})  # core 0 all busy, core 1 5% busy
    assert th.busy_between(before, after, [0, 1]) == pytest.approx(1.05)
    assert th.busy_between(before, after, [1]) == pytest.approx(0.05)  # only the cores we may use count
    assert th.busy_between(before, after, [7]) is None


@pytest.mark.parametrize("cores,busy,want", [(2, 0.05, 2), (2, 1.05, 1), (2, 0.7, 1), (2, 0.6, 2), (2, 2.0, 1),
                                             (8, 3.2, 5), (1, 1.0, 1), (4, None, 4)])
def test_one_thread_per_free_core(cores, busy, want):
    assert th.threads_for(cores, busy) == want


def test_order_of_choice():
    assert th.choose_threads(3, env={"OMP_NUM_THREADS": "1"}).how == "--threads"
    c = th.choose_threads(None, env={"OMP_NUM_THREADS": "1"})
    assert (c.threads, c.how) == (1, "OMP_NUM_THREADS") and c.line() == "1 thread (OMP_NUM_THREADS)"
    auto = th.choose_threads(None, env={})
    assert auto.how == "auto" and 1 <= auto.threads <= len(os.sched_getaffinity(0)) == auto.cores
    assert auto.line().startswith(f"{auto.threads} thread") and "(auto: " in auto.line()


def test_engine_backend_applies_and_reports_it():
    import torch

    from ddprobe.probes.backends.engine import EngineBackend

    before = torch.get_num_threads()
    try:
        be = EngineBackend(device="cpu", threads=1, max_ctx=512)
        assert torch.get_num_threads() == 1
        assert be.describe()["threads"] == {"threads": 1, "cores": len(os.sched_getaffinity(0)), "busy_cores": None,
                                            "how": "--threads"}
    finally:
        torch.set_num_threads(before)


def test_estimate_says_the_threads_it_assumed():
    from ddprobe.probes.bench.estimate import Estimate

    e = Estimate(prefill_s=50.0, decode_s=20.0, device="cpu", threads=1)
    assert e.line().startswith("estimate: about 1 min on this CPU with 1 thread (prefill")
    assert e.to_dict()["threads"] == 1
    assert "thread" not in Estimate(prefill_s=50.0, decode_s=20.0, device="cuda:0").line()


def _cgroup(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    return tmp_path


@pytest.mark.parametrize("files,want", [
    ({"cpu.max": "150000 100000"}, 2),  # v2: 1.5 cores' worth -> 2
    ({"cpu.max": "100000 100000"}, 1),
    ({"cpu.max": "max 100000"}, None),  # v2 unlimited
    ({"cpu/cpu.cfs_quota_us": "300000", "cpu/cpu.cfs_period_us": "100000"}, 3),  # v1
    ({"cpu,cpuacct/cpu.cfs_quota_us": "50000", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 1),
    ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),  # v1 unlimited
    ({}, None),
])
def test_cgroup_quota_from_real_files(tmp_path, files, want):
    assert th.cpu_quota(_cgroup(tmp_path, files)) == want


def test_quota_caps_the_cores(tmp_path):
    root = _cgroup(tmp_path, {"cpu.max": "100000 100000"})
    assert th.allowed_cores(root) == sorted(os.sched_getaffinity(0))[:1]
    auto = th.choose_threads(None, env={}, cgroup_root=root)
    assert (auto.threads, auto.cores, auto.how) == (1, 1, "auto")
    free = th.choose_threads(None, env={}, cgroup_root=tmp_path / "none")
    assert free.cores == len(os.sched_getaffinity(0))


def test_nested_omp_num_threads_uses_the_first_field():
    c = th.choose_threads(None, env={"OMP_NUM_THREADS": "4,2"})
    assert (c.threads, c.how) == (4, "OMP_NUM_THREADS")
    assert th.choose_threads(None, env={"OMP_NUM_THREADS": " 3 "}).threads == 3
    for bad in ("abc", "0", ",2"):
        with pytest.raises(th.DDProbeError, match="OMP_NUM_THREADS=.* is not a thread count"):
            th.choose_threads(None, env={"OMP_NUM_THREADS": bad})
    assert th.choose_threads(2, env={"OMP_NUM_THREADS": "abc"}).threads == 2  # --threads wins
