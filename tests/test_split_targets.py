"""`split` built for the GPUs that cannot be timed here: its kernels compiled for sm_120, sm_80 and sm_89 (and sm_90)
with Triton's own compiler and ptxas, with the configuration its plan chooses for that GPU (``split.ARCHS``), on a
machine without a GPU (kernels/_target_compile.py). The prefix kernel holds the tree part (its last split index);
the merge is the second launch. Checked: the shared memory fits what that GPU gives a block, the figure the
configuration table records covers it, no spills, and no sm_90-only instruction where the GPU has none.
The fallback when a kernel does not build for a GPU: one line, then the reference.
"""
from __future__ import annotations

import os
import warnings

import pytest
import torch

pytest.importorskip("triton.backends.nvidia")

CHILD = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
pytestmark = pytest.mark.skipif(CHILD, reason="compiles in the parent (no GPU needed)")

# (capability, heads, new rows R): K2's shard (8 heads x 9 rows: a 64-row block and a 16-row program on sm_80, 32-row
# blocks on the 99 KB GPUs), 64 heads, and the most rows each GPU's table entry takes (Arch.max_rows)
TARGETS = [((12, 0), 8, 9), ((12, 0), 64, 9), ((12, 0), 4, 16), ((8, 9), 8, 9), ((8, 0), 8, 9), ((8, 0), 64, 9),
           ((8, 0), 2, 32), ((9, 0), 8, 9)]


def _compile(cap, heads, r, **kw):
    from ddprobe.engine.kernels import _target_compile as tc

    out = {}
    for part, (fn, args, kwargs) in tc.split_launches(cap, heads, r, **kw).items():
        k = tc.compile_launch(fn, cap, args, kwargs)
        out[part] = (tc.code_report(k), tc.hopper_only(k), kwargs)
    return out


@pytest.mark.parametrize("cap,heads,r", TARGETS)
def test_split_compiles_for_the_gpu(cap, heads, r):
    """Both launches compile for the target with the plan's configuration for that GPU: shared memory within the
    block's limit there (and within the table's figure, which the plan checks wider rows and fp32 against), no
    local-memory spills, num_warps as configured; wgmma and the other sm_90-only instructions only on sm_90."""
    from ddprobe.engine.kernels import split

    a = split.arch_for(cap)
    rep = _compile(cap, heads, r)
    pre, hop, kw = rep["prefix"]
    assert pre["ld_global"] > 10, pre  # the kernel was really compiled and read
    assert pre["shared"] <= a.smem, f"{a.name}: {pre['shared']} B of shared memory, {a.smem} B per block there"
    if a.shared:
        assert pre["shared"] <= a.shared, f"{a.name}: {pre} above the table's {a.shared} B"
        assert (kw["BLOCK_N"], kw["num_stages"]) == (a.tuning.block_n, a.tuning.num_stages) and not kw["TMA"]
    assert pre["num_warps"] == kw["num_warps"]
    merge, mhop, _ = rep["merge"]
    assert merge["shared"] <= a.smem and merge["stl"] == 0
    if cap[0] == 9:
        assert "wgmma" in hop and kw["TMA"], hop  # the Hopper build does use them: the check can see them
    else:
        assert pre["stl"] == pre["ldl"] == 0, pre
        assert hop == [] and mhop == [], f"{a.name}: sm_90-only instructions {hop + mhop}"


def test_sm90_prefetch_where_rows_take_three_programs():
    """split's L2 prefetch (SplitTuning.prefetch, auto): compiled into the sm_90 kernel for 64 heads (nine 64-row
    programs per split share each tile), left out for 8 heads (a 64-row and a 16-row program) and off sm_90 (there
    the loop has no descriptor loads, the only place it asks)."""
    from ddprobe.engine.kernels import _target_compile as tc

    for cap, heads, want in (((9, 0), 64, 2), ((9, 0), 8, 0), ((8, 0), 64, 2)):
        fn, args, kw = tc.split_launches(cap, heads)["prefix"]
        assert kw["PREFETCH"] == want, (cap, heads, kw["PREFETCH"])
        k = tc.compile_launch(fn, cap, args, kw)
        assert ("prefetch.global.L2" in k.asm["ptx"]) == (want > 0 and cap[0] >= 9), (cap, heads)


def test_split_table_scales_to_other_rows():
    """Off sm_90 the plan checks other widths and dtypes against the table's figure scaled by their bytes: the tiny
    preset's fp32 rows (64 + 32) compile within that estimate on sm_120. fp32 K2 rows and R past the table do not fit
    there: choose_config says so in one line naming the GPU; a plan for them holds that reason and its run gives the
    fp32 reference's output, said once in one RuntimeWarning line, launching nothing."""
    from ddprobe.engine.kernels import reference, split
    from ddprobe.engine.kernels.trees import shape_mask
    from ddprobe.probes.bench import verify as verify_bench

    a = split.arch_for((12, 0))
    pre = _compile((12, 0), 8, 9, v_dim=64, rope=32, dtype=torch.float32)["prefix"][0]
    assert pre["shared"] <= split.measured_smem(a, 96, 4) <= a.smem, pre
    for r, dtype in ((9, torch.float32), (a.max_rows + 1, torch.bfloat16)):
        with pytest.raises(ValueError, match="sm_120") as e:
            split.choose_config(4096, 8 * r, a.sms, a.tuning, dtype=dtype, r=r, smem_limit=a.smem, arch=a)
        assert "\n" not in str(e.value)
        g = torch.Generator().manual_seed(r)
        q, kv = torch.randn(r, 2, 576, generator=g).to(dtype), torch.randn(300 + r, 576, generator=g).to(dtype)
        p = split.plan(300, shape_mask("chain", r - 1), None, 512, heads=2, dtype=dtype, arch=(12, 0))
        assert p.extra["fallback"] and "config" not in p.extra
        with pytest.warns(RuntimeWarning) as rec:
            out = split.run(q, kv, p, 0.1)
        assert len(rec) == 1 and "\n" not in str(rec[0].message) and "sm_120" in str(rec[0].message)
        assert torch.equal(out, reference.run(q, kv, p, 0.1))
        assert verify_bench.kernel_of("split", p) == "reference"  # what bench verify records for it
        call = lambda *a, p=p: None  # noqa: E731  bench verify's call, its plan attached
        call.plan = p
        with pytest.raises(verify_bench.peers.PeerUnavailable, match="split runs the fp32 reference on this GPU"):
            verify_bench._check_no_fallback(call, "split")  # its row skipped, saying so, never timed as split
    with pytest.raises(ValueError, match=f"takes at most {a.max_rows} new rows"):
        split.choose_config(4096, 8 * 17, a.sms, a.tuning, r=17, smem_limit=a.smem, arch=a)


def test_auto_picks_split_where_split_ws_does_not_run():
    """``--attn auto`` on the investigation's GPUs: split for K2's rows in bf16 (split_ws is sm_90 only), saying why."""
    from ddprobe import verify_paths

    for cap in ((12, 0), (8, 0), (8, 9), (8, 6)):
        name, why = verify_paths.auto_choice(cap, "bf16", (512, 64))
        assert name == "split" and f"sm_{cap[0]}{cap[1]}" in why and "split_ws runs on sm_90 only" in why, why
    assert verify_paths.auto_choice((9, 0), "bf16", (512, 64))[0] == "split_ws"


def test_auto_says_when_it_picks_a_kernel_not_built_for_the_gpu():
    """The GPUs split's kernels are checked for are split.ARCHS's (the table this file compiles), and nowhere else: on
    a GPU outside it (sm_100, sm_75) auto still picks split, and its line says the kernels were not configured or
    compile-checked there and what happens; on the checked ones it says nothing of the kind."""
    from ddprobe import verify_paths
    from ddprobe.engine.kernels import split

    assert set(verify_paths.BY_NAME["split"].tested) == {a.name for a in split.ARCHS.values()}
    for cap in ((10, 0), (7, 5)):
        name, why = verify_paths.auto_choice(cap, "bf16", (512, 64))
        assert name == "split" and f"split's kernels are not configured or compile-checked for sm_{cap[0]}{cap[1]}" in why, why
        assert "fall back to the fp32 reference in one line" in why
    for cap in split.ARCHS:
        assert "not configured" not in verify_paths.auto_choice(cap, "bf16", (512, 64))[1]


def test_a_kernel_that_does_not_build_falls_back_in_one_line():
    """What split.run does when its first launch raises one of Triton's build errors (split.COMPILE_ERRORS; no GPU
    here to raise one, so the fallback itself): one RuntimeWarning line, then the fp32 reference's output over the
    same plan; said once per plan."""
    from triton.runtime.errors import OutOfResources

    from ddprobe.engine.kernels import reference, split
    from ddprobe.engine.kernels.trees import shape_mask

    assert OutOfResources in split.COMPILE_ERRORS
    g = torch.Generator().manual_seed(3)
    q, kv = torch.randn(9, 2, 96, generator=g), torch.randn(120, 96, generator=g)
    p = split.plan(100, shape_mask("fork", 8), None, 64, heads=2, dtype=torch.float32, rope_dim=32, arch=(12, 0))
    assert "fallback" not in p.extra
    why = "the split path's kernels (32 rows x 32 tokens x 2 stages) do not build on sm_120 (OutOfResources: x)"
    with pytest.warns(RuntimeWarning) as rec:
        out = split._fallback(q, kv, p, 0.1, why)
    assert len(rec) == 1 and str(rec[0].message) == why + "; the fp32 reference runs instead"
    assert torch.equal(out, reference.run(q, kv, p, 0.1))
    assert p.extra["fallback"] == why  # the plan records what ran (the engine's record and bench verify read it)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        split._fallback(q, kv, p, 0.1, why)  # said once


@pytest.mark.parametrize("build,heads", [("sm_120", 8), ("sm_80", 8), ("sm_120", 64)])
def test_portable_build_compiles_to_ptx_a_hopper_driver_can_jit(build, heads):
    """The portable build bench verify times on an H100/H200 (``split:build=...``): both launches compiled with the
    build's tiling (split.ARCHS) for its PTX target: a target at or below sm_90 (the driver JIT-compiles PTX only
    upwards), mma.sync and no sm_90-only instruction, within that GPU's shared memory, no spills."""
    import re

    from ddprobe.engine.kernels import _target_compile as tc
    from ddprobe.engine.kernels import portable, split
    from ddprobe.engine.kernels.merge import merge_launch
    from ddprobe.engine.kernels.trees import shape_mask

    b = portable.build_of(build)
    assert b.ptx <= (9, 0) and split.ARCHS[b.tiling].tuning.tma == 0
    q, kv = torch.randn(9, heads, 576).bfloat16(), torch.randn(32768 + 9, 576).bfloat16()
    p = split.plan(32768, shape_mask("lopsided", 8), None, 512, heads=heads, arch=b.tiling)
    cfg = p.extra["config"]
    t = split.ARCHS[b.tiling].tuning
    assert (cfg["block_n"], cfg["num_stages"], cfg["ksplit"]) == (t.block_n, t.num_stages, t.ksplit)
    fn, _, args, kw = split.prefix_launch(q, kv, p, 0.1, cfg, p.extra["partials"], tma_ok=False, compiled=True)
    out = torch.empty(9, heads, 512, dtype=torch.bfloat16)
    mfn, _, margs, mkw = merge_launch(p.extra["partials"], cfg["num_splits"], out, p.extra["merge"])
    for role, (f, a, k) in {"prefix": (fn, args, kw), "merge": (mfn, margs, mkw)}.items():
        c, values, _ = portable.compile_for(b, role, f, a, k)
        ptx = c.asm["ptx"]
        assert re.search(rf"^\.target sm_{b.ptx[0]}{b.ptx[1]}\b", ptx, re.M), role
        assert not tc.hopper_only(c) and (role == "merge" or "mma.sync" in ptx)
        rep = tc.code_report(c)
        assert rep["shared"] <= split.ARCHS[b.tiling].smem and rep["stl"] == 0, (role, rep)
        assert len(values) == len(f.arg_names)  # every argument in the kernel's order, as Triton's launcher takes


def test_portable_build_bad_input_is_one_line():
    """An unknown build, a plan off CUDA: one line each; the names bench verify accepts are the builds; what a row
    says it timed is a proxy, never that GPU's figure."""
    from ddprobe.engine.kernels import portable
    from ddprobe.engine.kernels.trees import shape_mask
    from ddprobe.probes.bench import verify

    with pytest.raises(ValueError, match="unknown portable build 'sm_75'; known: sm_120, sm_80"):
        portable.build_of("sm_75")
    with pytest.raises(portable.PortableUnavailable) as e:
        portable.plan(100, shape_mask("chain", 8), 512, build="sm_120", heads=8)
    assert "\n" not in str(e.value) and "CUDA GPU" in str(e.value)
    for name in portable.BUILDS:
        verify.check_build("split", {"build": name})
        what = portable.describe(name, "NVIDIA H100 80GB HBM3")
        assert what.startswith("proxy: ") and f"not an {name} figure" in what and "H100" in what
    with pytest.raises(verify.DDProbeError, match="unknown portable build"):
        verify.check_build("split", {"build": "sm_90"})


# the 99 KB tiling with the latent on the batch axis (SplitTuning.kbatch), the candidates bench verify times as
# split:build=sm_120,kbatch=4[,...] (issue 64)
KBATCH_TILINGS = [dict(kbatch=4), dict(kbatch=4, block_q=32, block_n=16, num_stages=4), dict(kbatch=4, block_n=16, num_stages=5)]


@pytest.mark.parametrize("over", KBATCH_TILINGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("cap", [(12, 0), (8, 9), (8, 0), (9, 0)])
def test_kbatch_tiling_compiles_within_99k(cap, over):
    """The 99 KB tiling with the latent as batched chunks compiles for sm_120, sm_89 (the proxy's PTX), sm_80 and sm_90
    (8 heads x 9 rows, K2 rows, bf16): within sm_120's block limit (the tiling is sized for it) and the target's, no
    spills, mma.sync and no sm_90-only instruction off sm_90. Its main loop (one KV tile) reads fewer shared-memory
    bytes than the 2-D tiling's (whose 4 warps split the tile's tokens and each re-read all of Q): each warp reads its
    own Q chunk and latent chunk (as K and as V) and the tile comes from memory once (one set of cp.async copies)."""
    import dataclasses

    from ddprobe.engine.kernels import _target_compile as tc
    from ddprobe.engine.kernels import split

    base = split.ARCHS[(12, 0)].tuning
    t = dataclasses.replace(base, **over)
    fn, args, kw = tc.split_launches(cap, 8, tuning=t)["prefix"]
    assert kw["KBATCH"] == 4 and not kw["TMA"]
    k = tc.compile_launch(fn, cap, args, kw)
    rep, loop = tc.code_report(k), tc.loop_report(k)
    assert rep["shared"] <= min(split.SMEM_99K, split.arch_for(cap).smem), rep
    assert rep["stl"] == rep["ldl"] == 0, rep
    if cap[0] != 9:
        assert tc.hopper_only(k) == [] and "mma.sync" in k.asm["ptx"]
    fn2, args2, kw2 = tc.split_launches(cap, 8, tuning=dataclasses.replace(base, block_n=t.block_n,
                                                                            num_stages=t.num_stages))["prefix"]
    flat = tc.loop_report(tc.compile_launch(fn2, cap, args2, kw2))
    tile = t.block_n * 576 * 2
    assert loop["cp_async"] * 16 * kw["num_warps"] * 32 == tile, loop  # the tile's bytes, copied once
    per_token = loop["shared_read"] * kw["num_warps"] / t.block_n
    assert per_token < 0.85 * flat["shared_read"] * kw2["num_warps"] / t.block_n, (loop, flat)
