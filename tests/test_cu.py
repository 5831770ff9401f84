"""The CUDA C++ prefix kernel's build (runs anywhere): the shipped cubin was built from the shipped source, and,
where nvcc is installed, the source compiles for sm_90a with no spills and with no wgmma that ptxas had to
serialize or wait on by itself (either would undo the schedule the kernel is written for). Its results are
checked on an H200 by tests/test_kernels_gpu.py (test_cuda_seesaw_*)."""
from __future__ import annotations

import re
import shutil

import pytest

from ddprobe.engine.kernels import _cu


def test_shipped_cubin_is_built_from_the_shipped_source():
    assert _cu.CUBIN.stat().st_size > 10_000
    assert _cu.CUBIN.read_bytes()[:4] == b"\x7fELF"
    assert _cu.STAMP.read_text().strip() == _cu.source_hash(), \
        "cuda/seesaw_sm90.cu changed: rebuild with python -m ddprobe.engine.kernels._cu --build"
    for name in _cu.KERNELS.values():
        assert name.encode() in _cu.CUBIN.read_bytes()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here (the build needs CUDA >= 12.3)")
def test_source_compiles_without_spills_or_serialized_wgmma(tmp_path):
    report = _cu.build(out=tmp_path / "k.cubin")
    assert (tmp_path / "k.cubin").stat().st_size > 10_000
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", report)]
    assert len(spills) == len(regs) == len(_cu.KERNELS)
    assert all(a == "0" and b == "0" for a, b in spills), report
    assert max(regs) <= 255
    assert "C7520" not in report and "serialized" not in report, report   # wgmma serialized by ptxas
    assert "C7517" not in report, report   # a wgmma wait ptxas injected (an overlap the source meant is lost)


def test_build_entry_point_rejects_other_arguments(capsys):
    assert _cu.main(["--bogus"]) == 2
    assert "usage" in capsys.readouterr().err
