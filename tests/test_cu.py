"""The CUDA C++ prefix kernel's build (runs anywhere): the shipped cubin was built from the shipped source, and,
where nvcc is installed, the source compiles for sm_90a with no spills and with no wgmma that ptxas had to
serialize or wait on by itself (either would undo the schedule the kernel is written for). Its results are
checked on an H200 by tests/test_kernels_gpu.py (test_cuda_seesaw_*)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ddprobe.engine.kernels import _cu


def test_shipped_cubin_is_built_from_the_shipped_source():
    assert _cu.CUBIN.stat().st_size > 10_000
    assert _cu.CUBIN.read_bytes()[:4] == b"\x7fELF"
    assert _cu.STAMP.read_text() == _cu.stamp_text(), \
        "cuda/seesaw_sm90.cu or the cubin changed without the other: python -m ddprobe.engine.kernels._cu --build"
    for name in (*_cu.KERNELS.values(), *_cu.MERGE_KERNELS.values()):
        assert name.encode() in _cu.CUBIN.read_bytes()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here (the build needs CUDA >= 12.3)")
def test_source_compiles_without_spills_or_serialized_wgmma(tmp_path):
    report = _cu.build(out=tmp_path / "k.cubin")
    assert (tmp_path / "k.cubin").stat().st_size > 10_000
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    regs = [int(x) for x in re.findall(r"Used (\d+) registers", report)]
    assert len(spills) == len(regs) == 2 * (len(_cu.KERNELS) + len(_cu.MERGE_KERNELS))  # fp32 and 16-bit partials
    assert all(a == "0" and b == "0" for a, b in spills), report
    assert max(regs) <= 255
    assert "C7520" not in report and "serialized" not in report, report   # wgmma serialized by ptxas
    assert "C7517" not in report, report   # a wgmma wait ptxas injected (an overlap the source meant is lost)


def test_build_entry_point_rejects_other_arguments(capsys):
    assert _cu.main(["--bogus"]) == 2
    assert "usage" in capsys.readouterr().err


CONTEXTS = (1024, 8192, 32768, 65536, 131072)


@pytest.mark.parametrize("heads", [8, 64])
def test_host_and_device_plans_choose_one_kernel_per_shape(heads):
    """split_ws.choose (pure Python, the one place the kernel is chosen, the same for host and device plans: both
    kernels derive their chunks from the live length on the device): at every plan bound from 1k to 128k one kernel
    and grid, so `bench verify` times the kernel the engine runs. 8 heads x 9 rows = 72 folded rows: the CUDA
    kernel on two 64-row blocks below TAIL_FROM tokens, the Gluon tail kernel (one program of 64 + 8 rows per
    chunk, the tree folded) from it; 64 heads = 576 rows: the CUDA kernel at every bound."""
    from ddprobe.engine.kernels import split_ws
    hq = heads * 9
    for ctx in CONTEXTS:
        t, kernel = split_ws.choose(hq, ctx)
        tail = heads == 8 and ctx >= split_ws.TAIL_FROM
        assert kernel == ("tail" if tail else "cuda") and t.tail == int(tail) and split_ws.tails(hq, t) == tail
        cfg = split_ws.config(ctx, hq, 132, t)
        assert cfg == split_ws.config(ctx, hq, 132, split_ws.DEFAULT_TUNING)  # resolved or not: one grid
        assert cfg["tail"] == tail and cfg["block_q"] == (72 if tail else split_ws.BLOCK_M)
        assert cfg["fold"] == int(tail or heads == 64) and cfg["n_qb"] * cfg["grid_splits"] <= 132  # one wave
    assert split_ws.TAIL_FROM == 65536


def test_explicit_tunings_pick_the_kernel_at_any_bound():
    """tail=1 runs the tail kernel for 65-72 folded rows at every bound, tail=0 never; other row counts always
    run the CUDA kernel; a knob outside its choices is a one-line ValueError."""
    from ddprobe.engine.kernels import split_ws
    W = split_ws.WsTuning
    t, k = split_ws.choose(72, 1024, W(tail=1))
    assert k == "tail" and t.tail == 1 and split_ws.config(1024, 72, 132, t)["block_q"] == 72
    assert split_ws.choose(68, 0, W(tail=1))[1] == "tail" and split_ws.choose(65, 131072)[1] == "tail"
    assert split_ws.choose(72, 131072, W(tail=0)) == (W(tail=0), "cuda")
    for hq in (9, 64, 73, 144, 576):
        assert split_ws.choose(hq, 131072, W(tail=1))[1] == "cuda"
    with pytest.raises(ValueError, match="WsTuning.tail must be one of -1, 0, 1"):
        split_ws.check_tuning(W(tail=2))


@pytest.mark.parametrize("bound,hq,fold,block_q", [(20000, 72, 0, 64), (20000, 576, 1, 64), (131072, 72, 0, 64),
                                                  (0, 9, 0, 64), (0, 576, 1, 64), (100, 64, 1, 64), (20000, 72, 1, 72),
                                                  (131072, 68, 1, 72), (100, 72, 0, 72), (0, 72, 1, 72)])
def test_device_grid_covers_every_live_length(bound, hq, fold, block_q):
    """The grid of a device plan (split_ws.grid_piece: the arithmetic the CUDA kernel and the Gluon tail kernel,
    block_q 72, run on the device), sized for ``bound`` and run at live lengths 0 .. bound: every column of every
    row block is covered exactly once, the tree columns by the last slot, and every slot is written or marked
    empty (lse -inf) by exactly one program, whatever the length."""
    from ddprobe.engine.kernels import split_ws
    cfg = split_ws.choose_config(bound, hq, 132, 64, fold, block_q)
    r = 9
    for n in sorted({0, 1, 63, 64, 65, bound // 3, bound - 1, bound} & set(range(bound + 1))):
        for rb in range(cfg["n_qb"]):
            cols, slots = [], []
            for slot in range(cfg["grid_splits"]):
                piece = split_ws.grid_piece(rb + slot * cfg["n_qb"], cfg["n_qb"], cfg["grid_splits"], cfg["fold"], n, r)
                assert piece[0] == rb and piece[3] == slot
                cols.extend(range(piece[1], piece[2]))
                slots.append(slot)
                if piece[2] > n:
                    assert slot == cfg["grid_splits"] - 1 and piece[2] == n + r
            assert sorted(cols) == cols == list(range(n + r)), f"length {n}, row block {rb}"
            assert slots == list(range(cfg["grid_splits"]))


def test_every_cuda_kernel_is_named_by_the_split_ws_row_of_the_path_table():
    """The profiler and ncu attribute kernels to a path by its row's regex: the CUDA prefix kernel and the CUDA merge
    must both count as split_ws's attention (a merge left out would land in "other")."""
    from ddprobe import verify_paths
    rx = re.compile(verify_paths.BY_NAME["split_ws"].ncu_regex)
    for name in (*_cu.KERNELS.values(), *_cu.MERGE_KERNELS.values()):
        assert rx.search(name) and rx.search(name + _cu.P16_SUFFIX), name
    assert not re.compile(verify_paths.BY_NAME["split"].ncu_regex).search(_cu.MERGE_KERNELS["bfloat16"])


def test_the_merge_limits_are_the_sources_own():
    """_cu's MERGE_MAX_PARTS and MERGE_THREADS are the .cu's constexprs (the weights' shared array and the block):
    a bound out of step with the source would let a plan past the array through."""
    src = _cu.SOURCE.read_text()
    assert int(re.search(r"constexpr int MERGE_MAX_PARTS = (\d+);", src).group(1)) == _cu.MERGE_MAX_PARTS
    assert int(re.search(r"constexpr int MERGE_THREADS = (\d+);", src).group(1)) == _cu.MERGE_THREADS


def test_a_merge_knob_selects_the_triton_merge():
    """merge_kind -1 with no knob set runs the CUDA merge; a kind 0-3 or any of the Triton merge's knobs runs that
    merge (the CUDA merge has no knobs: a knob must not be ignored silently)."""
    from ddprobe.engine.kernels import split_ws
    assert not split_ws.triton_merge(split_ws.WsTuning())
    for over in (dict(merge_kind=3), dict(merge_block_m=32), dict(merge_split_chunk=16), dict(merge_stages=2),
                 dict(merge_bv=64), dict(merge_warps=8)):
        assert split_ws.triton_merge(split_ws.WsTuning(**over)), over


def test_an_mps_thread_limit_keeps_the_merge_out_of_the_prefix_launch(monkeypatch):
    """The fused merge's grid barrier needs every program resident: under MPS with an active-thread percentage
    below 100 (fewer SMs than the device has) the launcher does not fuse (_cu._mps_limited)."""
    from ddprobe.engine.kernels import _cu

    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)
    assert not _cu._mps_limited()
    for value, limited in (("100", False), ("50", True), ("12.5", True), ("junk", True)):
        monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", value)
        assert _cu._mps_limited() is limited, value


def test_16_bit_partials_pick_the_p16_kernels_which_the_source_defines():
    """WsTuning.part_bits 16 keeps the partials in the inputs' dtype: the launchers then pick the *_p16 kernels
    (fp32 partials the plain ones); partials of another type are refused in one line, not reinterpreted; every
    name the launchers can ask for is an entry point of the source (so of the cubin built from it)."""
    import torch
    src = _cu.SOURCE.read_text()
    for table in (_cu.KERNELS, _cu.MERGE_KERNELS):
        for dt in (torch.bfloat16, torch.float16):
            plain = _cu.kernel_name(table, dt, torch.empty(1))
            p16 = _cu.kernel_name(table, dt, torch.empty(1, dtype=dt))
            assert p16 == plain + _cu.P16_SUFFIX
            for name in (plain, p16):
                assert re.search(rf'extern "C" __global__ void __launch_bounds__\([^)]*\) {name}\(', src), name
        with pytest.raises(ValueError, match="fp32 partials or torch.bfloat16 ones"):
            _cu.kernel_name(table, torch.bfloat16, torch.empty(1, dtype=torch.float16))
    from ddprobe.engine.kernels import split_ws
    split_ws.check_tuning(split_ws.WsTuning(part_bits=16))
    with pytest.raises(ValueError, match="WsTuning.part_bits must be one of 32, 16"):
        split_ws.check_tuning(split_ws.WsTuning(part_bits=8))
