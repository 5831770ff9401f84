"""split_ws's Gluon tail kernel (8 heads x 9 rows on one program, kernels/_ws_tail.py) compiled for sm_90a on a machine
without a GPU (kernels/_target_compile.py), with fp32 partials (the default) and with 16-bit ones
(WsTuning.part_bits 16): Gluon does not run under the interpreter, so this is what the CPU can check of it. The GPU
checks the outputs (tests/test_kernels_gpu.py::test_16_bit_partials_match_the_reference)."""
from __future__ import annotations

import os
import re

import pytest
import torch
import triton

pytest.importorskip("triton.backends.nvidia")
if not hasattr(pytest.importorskip("triton.experimental.gluon._runtime"), "GluonASTSource"):
    pytest.skip("this Triton's Gluon has no GluonASTSource to compile with", allow_module_level=True)
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
                                reason="compiles in the parent (no GPU needed)")


def _compile_tail(part_dtype: torch.dtype, fuse: bool = False, queue: bool = False):
    from ddprobe.engine.kernels import _target_compile as tc, split_ws as sw
    from ddprobe.engine.kernels._ws_tail import ws_tail_kernel
    from ddprobe.engine.kernels.merge import partials
    from ddprobe.engine.kernels.plan import VerifyPlan

    r, h, ctx = 9, 8, 4096
    hq = r * h
    q2 = torch.randn(hq, 576).to(torch.bfloat16)
    kv = torch.randn(ctx + r, 576).to(torch.bfloat16)
    p = VerifyPlan(prefix_len=ctx, tree_mask=torch.eye(r, dtype=torch.bool), slots=None, v_dim=512,
                   prefix_t=torch.full((1,), ctx, dtype=torch.int32), dynamic=False, tuning=sw.DEFAULT_TUNING,
                   detail=None)
    cfg = sw.config(ctx, hq, 132, sw.WsTuning(tail=1, tail_queue=int(queue)))
    o_part, lse_part = partials(cfg["grid_splits"] - 1, hq, 512, "cpu", part_dtype)
    out = torch.empty(r, h, 512, dtype=torch.bfloat16) if fuse else None
    counter = torch.zeros(2, dtype=torch.int32) if fuse else None
    _, args, consts = sw.tail_launch(sw._descs(q2, kv, p), torch.zeros(r, dtype=torch.int64), o_part, lse_part, p,
                                     cfg, hq, 576, h, 0.1, out, counter,
                                     torch.zeros(2, dtype=torch.int32) if queue else None)  # the launch split_ws runs
    k = tc.compile_launch(ws_tail_kernel, (9, 0), args, {**consts, "num_warps": 4})
    ptx = k.asm["ptx"]
    if fuse or queue:
        return tc.code_report(k), ptx
    return tc.code_report(k), len(re.findall(r"st\.global(?:\.v\d)?\.b16", ptx))


def test_the_tail_kernel_compiles_with_16_bit_partials():
    """Both partial types compile for sm_90a within the 232,448 B an H100/H200 block may use, with the same
    registers and no more spills than fp32 partials; only the 16-bit build stores 16-bit values to global memory
    (the partials: the kernel's other global stores are fp32 log2-sum-exps)."""
    fp32, b16_in_fp32 = _compile_tail(torch.float32)
    for dt in (torch.bfloat16, torch.float16):
        p16, b16 = _compile_tail(dt)
        assert fp32["shared"] <= 232448 and p16["shared"] <= 232448, (fp32, p16)
        assert b16_in_fp32 == 0 and b16 > 0, (dt, b16_in_fp32, b16)
        assert p16["regs"] <= fp32["regs"] and p16["stl"] <= fp32["stl"], (dt, fp32, p16)


def test_the_tail_kernel_compiles_with_its_merge_fused():
    """WsTuning.tail_fuse 1: the merge inside the tail kernel's launch compiles for sm_90a in the same shared memory
    and registers as the kernel without it, with no spills on the GPU machines' Triton; its grid barrier is there;
    and it reads the partials (more global loads than the unfused kernel's Q and bitmask reads). The GPU checks
    the outputs (tests/test_kernels_gpu.py::test_tail_with_its_merge_fused_matches_reference)."""
    plain, _ = _compile_tail(torch.float32)
    fused, ptx = _compile_tail(torch.float32, fuse=True)
    assert fused["shared"] == plain["shared"] <= 232448 and fused["regs"] <= plain["regs"], (plain, fused)
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 7):  # the GPU machines' Triton
        assert fused["stl"] == plain["stl"] == 0, (plain, fused)
    else:  # later ptxas spill the merge's scalars kept across the warp-specialized loop: a store each, at entry
        assert fused["stl"] <= plain["stl"] + 16, (plain, fused)
    # the sense-reversing barrier, once for empty splits and once after the partials: the arrival (acq_rel), the
    # last one's generation step (release; a red where the old value is unused), the others' wait (acquire)
    assert len(re.findall(r"atom\.global\.gpu\.acq_rel\.add\.u32", ptx)) == 2, "one arrival per path"
    assert len(re.findall(r"(?:atom|red)\.global\.gpu\.release\.add\.u32", ptx)) == 2, "the generation moves on"
    assert re.search(r"(?:ld|atom)\.global\.gpu\.acquire\.", ptx), "the wait acquires"
    assert fused["ld_global"] > plain["ld_global"], (plain, fused)


def test_the_tail_kernel_compiles_with_its_tile_queue():
    """WsTuning.tail_queue 1: the tail kernel taking its tiles from the plan's queue compiles for sm_90a within the
    232,448 B a block may use (its 32 B of tile indices in the 48 B the kernel leaves), in the registers of the kernel
    without it and with no more spills; the queue's atomics are there: each tile asked for by one lane of the loader
    warp (relaxed adds, their value passed on by a warp reduction: no shared memory, no barrier), one acq_rel add
    per program when it is done, and the last program's two exchanges back to zero. The GPU checks the outputs
    (tests/test_kernels_gpu.py::test_tail_queue_matches_reference)."""
    plain, _ = _compile_tail(torch.float32)
    queued, ptx = _compile_tail(torch.float32, queue=True)
    assert queued["shared"] <= 232448 and queued["regs"] <= plain["regs"], (plain, queued)
    assert queued["stl"] <= plain["stl"], (plain, queued)
    queued16, _ = _compile_tail(torch.bfloat16, queue=True)  # with 16-bit partials too
    assert queued16["shared"] <= 232448 and queued16["regs"] <= plain["regs"] and queued16["stl"] <= plain["stl"]
    assert len(re.findall(r"atom\.global\.gpu\.relaxed\.add\.u32", ptx)) == 2, "the first ask and the loop's"
    assert re.search(r"redux\.sync\.max\.s32", ptx), "the asked tile passed to every lane of the warp"
    assert len(re.findall(r"atom\.global\.gpu\.acq_rel\.add\.u32", ptx)) == 1, "one arrival per program"
    assert len(re.findall(r"atom\.global\.gpu\.relaxed\.exch\.b32", ptx)) == 2, "both counters back to zero"
