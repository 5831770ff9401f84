"""Verify-attention paths vs the fp32 reference, under Triton's CPU interpreter.

The interpreter's tl.dot is wrong for two bf16 operands (docs/kernels.md): the kernels
upcast operands to fp32 when interpreting (constexpr UPCAST), and bf16 itself is covered on
the GPU by `ddprobe bench verify`. Tolerances (relative Frobenius error vs reference):
fp32 1e-4, fp16 3e-3, bf16 1.5e-2 (the output is rounded to the input dtype).
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

pytest.importorskip("triton")

from ddprobe.engine.kernels import available, get_path, reference  # noqa: E402
from ddprobe.engine.kernels.trees import SHAPES, ancestor_mask, shape_mask  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}
# On CPU the kernels run under Triton's interpreter, which triton.jit picks when triton itself is
# imported: so the tests marked ``interpreter`` run in one child pytest with TRITON_INTERPRET=1 set for
# that child alone (tests/conftest.py; nothing leaks into the other tests' environment or subprocesses),
# each reported here by its own id.
CHILD = DEV == "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_kernels = pytest.mark.interpreter
INTERPRETER_TIMEOUT = 900  # s, the child


PATHS = {name: get_path(name) for name in ("paged", "split")} if CHILD else {}


def make_inputs(path, ctx, budget, shape, heads, dtype, v_dim=64, rope=32, seed=0, poison=7):
    """q, kv cache (unused rows NaN), slots (shuffled pool for paged, None for contiguous), mask."""
    g = torch.Generator().manual_seed(seed * 1000 + ctx * 7 + budget)
    r = budget + 1
    d = v_dim + rope
    n = ctx + r
    rows = torch.randn(n, d, generator=g)
    q = torch.randn(r, heads, d, generator=g).to(dtype)
    mask = shape_mask(shape, budget)
    if path == "paged":
        pool = n + poison
        slots = torch.randperm(pool, generator=g)[:n]
        kv = torch.full((pool, d), float("nan"))
        kv[slots] = rows
    else:
        slots = None
        kv = torch.full((n + poison, d), float("nan"))
        kv[:n] = rows
    return q.to(DEV), kv.to(dtype).to(DEV), (slots.to(DEV) if slots is not None else None), mask.to(DEV)


def tune(**kw):
    """A split tuning with some knobs changed (the plan holds it; nothing global moves)."""
    return dataclasses.replace(PATHS["split"].DEFAULT_TUNING, **kw)


def check(path, ctx, budget, shape, heads, dtype, v_dim=64, rope=32, sm_scale=0.125, tuning=None):
    q, kv, slots, mask = make_inputs(path, ctx, budget, shape, heads, dtype, v_dim, rope)
    m = get_path(path)
    out = m.run(q, kv, m.plan(ctx, mask, slots, v_dim, tuning=tuning), sm_scale)
    ref = reference.run(q, kv, reference.plan(ctx, mask, slots, v_dim), sm_scale)
    assert out.shape == (budget + 1, heads, v_dim) and out.dtype == dtype
    assert torch.isfinite(out).all(), "NaN/inf in output: a poisoned slot was read"
    err = float((out.float() - ref.float()).norm() / ref.float().norm())
    assert err < TOL[dtype], f"{path} ctx={ctx} B={budget} {shape} H={heads} {dtype}: rel err {err:.2e}"
    return out


CASES = [
    # ctx, budget, shape, heads, dtype
    (0, 8, "lopsided", 8, torch.float16),
    (1, 8, "chain", 8, torch.float16),
    (3, 1, "chain", 1, torch.float32),
    (17, 8, "star", 1, torch.float16),
    (63, 8, "fork", 8, torch.float32),
    (127, 32, "lopsided", 1, torch.float16),
    (300, 8, "lopsided", 8, torch.float16),
    (127, 8, "fork", 4, torch.bfloat16),
    (33, 32, "star", 8, torch.float16),
    (300, 1, "star", 1, torch.float32),
]


def test_paths_registered():
    assert {"reference", "paged", "split"} <= set(available())
    assert get_path("paged").layout == "paged" and get_path("split").layout == "contiguous"


@pytest.mark.parametrize("path", ["paged", "split"])
@pytest.mark.parametrize("ctx,budget,shape,heads,dtype", CASES)
@needs_kernels
def test_matches_reference(path, ctx, budget, shape, heads, dtype):
    check(path, ctx, budget, shape, heads, dtype)


@pytest.mark.parametrize("path", ["paged", "split"])
@needs_kernels
def test_k2_width(path):
    """The real row: 512 latent + 64 rope."""
    check(path, 17, 8, "lopsided", 2, torch.float16, v_dim=512, rope=64)


@pytest.mark.parametrize("block_q,tiling", [(0, (64, 2, 16)), (32, (32, 3, 0))])
@needs_kernels
def test_split_row_tilings(block_q, tiling):
    """72 folded rows (8 heads x 9): a 64-row block and a separate 16-row program (auto), or 32-row blocks
    (block_q=32, the 99 KB GPUs' tuning)."""
    t = tune(block_q=block_q)
    cfg = PATHS["split"].choose_config(200, 72, 4, t)
    assert (cfg["block_q"], cfg["n_qb"], cfg["tail_program"]) == tiling
    check("split", 200, 8, "fork", 8, torch.float16, tuning=t)


@pytest.mark.parametrize("ksplit,block_q,block_n,stages", [(2, 32, 32, 2), (4, 16, 16, 4), (4, 0, 32, 3), (4, 16, 32, 3)])
@needs_kernels
def test_split_latent_chunks(ksplit, block_q, block_n, stages):
    """Pointer-load tiles with the latent in ksplit column chunks (independent S products and P V accumulators, the
    portable builds' tuning): a prefix ending mid-tile, the 64 + 16-row tiling, bf16, the k2 width in fp32, and a
    grid sized for two programs per SM."""
    t = tune(tma=0, ksplit=ksplit, block_q=block_q, block_n=block_n, num_stages=stages, programs_per_sm=2)
    check("split", 201, 8, "lopsided", 8, torch.float16, tuning=t)
    check("split", 77, 8, "fork", 8, torch.bfloat16, tuning=t)
    check("split", 70, 8, "chain", 2, torch.float32, v_dim=512, rope=64, tuning=t)


@pytest.mark.parametrize("kbatch,block_q,block_n,stages,warps",
                         [(4, 16, 32, 3, 4), (4, 32, 16, 4, 4), (4, 16, 16, 5, 4), (8, 16, 32, 3, 4), (2, 0, 32, 2, 4)])
@needs_kernels
def test_split_latent_batched(kbatch, block_q, block_n, stages, warps):
    """Pointer-load tiles with the latent as kbatch chunks on the batch axis of 3-D dots (each warp its own chunks,
    the rope part in 16-column slots of the same axis, S summed over it), on fresh random inputs against the fp32
    reference within the file's tolerances (fp16 3e-3, bf16 1.5e-2, fp32 1e-4): a prefix ending mid-tile, the
    64 + 16-row tiling, bf16, the k2 width in fp32 (rope 64 in 4 slots of 16, or 2 of 32 with kbatch 2; with kbatch
    8 the last four slots read as zeros), and the tiny rows (v_dim 64: chunks of at least 16 columns)."""
    t = tune(tma=0, kbatch=kbatch, block_q=block_q, block_n=block_n, num_stages=stages, num_warps=warps)
    check("split", 201, 8, "lopsided", 8, torch.float16, tuning=t)
    check("split", 77, 8, "fork", 8, torch.bfloat16, tuning=t)
    check("split", 70, 8, "chain", 2, torch.float32, v_dim=512, rope=64, tuning=t)
    check("split", 45, 1, "chain", 16, torch.float32, tuning=t)


@needs_kernels
def test_split_latent_batched_device_plan():
    """kbatch under a device plan: one plan (7 splits sized for a 400-token bound) run at live lengths 0 to the bound,
    rows past the live ones NaN; each output within fp16's 3e-3 of the reference (spare splits empty)."""
    from ddprobe.engine.kernels import split

    g = torch.Generator().manual_seed(5)
    t = tune(tma=0, kbatch=4, block_q=16, block_n=32, num_stages=3, num_warps=4, programs_per_sm=40)
    r, h, bound = 9, 8, 400
    q = torch.randn(r, h, 96, generator=g).to(torch.float16).to(DEV)
    mask = shape_mask("fork", r - 1).to(DEV)
    pt = torch.zeros(1, dtype=torch.int32, device=DEV)
    p = split.plan(pt, mask, None, 64, tuning=t, heads=h, max_prefix=bound, dtype=torch.float16, rope_dim=32)
    assert p.extra["config"]["num_splits"] > 1 and p.extra["config"]["kbatch"] == 4
    for n in (0, 37, 200, bound):
        kv = torch.full((bound + r + 8, 96), float("nan"))
        kv[:n + r] = torch.randn(n + r, 96, generator=g)
        kv = kv.to(torch.float16).to(DEV)
        pt.fill_(n)
        split.refresh(p)
        out = split.run(q, kv, p, 0.125)
        ref = reference.run(q, kv, reference.plan(n, mask, None, 64), 0.125)
        assert torch.isfinite(out).all()
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        assert err < TOL[torch.float16], (n, err)


def test_split_ksplit_and_programs_per_sm_config():
    """ksplit outside 1, 2, 4 is one line; programs_per_sm sizes the split count for that many programs per SM."""
    from ddprobe.engine.kernels import split

    t = split.DEFAULT_TUNING
    with pytest.raises(ValueError, match="ksplit"):
        split.choose_config(4096, 72, 132, dataclasses.replace(t, ksplit=3))
    with pytest.raises(ValueError, match="kbatch must be 0, 2, 4 or 8, got 3"):
        split.choose_config(4096, 72, 132, dataclasses.replace(t, kbatch=3))
    one = split.choose_config(1 << 17, 72, 132, dataclasses.replace(t, block_q=32, block_n=32))
    two = split.choose_config(1 << 17, 72, 132, dataclasses.replace(t, block_q=32, block_n=32, programs_per_sm=2))
    assert one["n_qb"] == two["n_qb"] == 3 and (one["num_splits"], two["num_splits"]) == (44, 88)


@pytest.mark.parametrize("tma", [0, 1])
@pytest.mark.parametrize("block_n", [64, 32])
@needs_kernels
def test_split_tile_loads(tma, block_n):
    """KV tiles through tensor descriptors (TMA: full tiles; the prefix's last partial tile through
    pointer loads) or pointer loads, 64- or 32-token tiles; a prefix that ends mid-tile; bf16 and the
    k2 width too."""
    t = tune(tma=tma, block_n=block_n)
    check("split", 201, 8, "lopsided", 8, torch.float16, tuning=t)
    if block_n == 64:
        check("split", 77, 8, "fork", 8, torch.bfloat16, tuning=t)
        check("split", 70, 8, "chain", 2, torch.float32, v_dim=512, rope=64, tuning=t)


# metadata.shared of split's prefix kernel compiled for sm_90a by Triton 3.6 (lab-2026-12-03:benchmarks/compile_split_sm90.py,
# tma=1) at the k2 width: (dtype, heads, R, block_n, num_stages) -> bytes; the limit is 232,448 B
SM90_SHARED = [
    (torch.float32, 2, 9, 64, 2, 368648),  # what `split` launched for fp32 before the fit: OutOfResources
    (torch.float32, 2, 9, 64, 1, 221200),
    (torch.float32, 8, 9, 32, 1, 221200),
    (torch.float32, 1, 64, 32, 1, 294912),  # the tree part's [64, 576] tile beside 64 rows: 32-row blocks instead
    (torch.bfloat16, 8, 9, 64, 2, 221200),  # the defaults at 8 and 64 heads
    (torch.bfloat16, 64, 9, 64, 2, 221200),
    (torch.bfloat16, 1, 64, 64, 2, 221200),
]
STEP = {"block_n", "num_stages", "chunk", "num_splits"}  # what a tile step-down moves


@pytest.mark.parametrize("dtype,heads,r,block_n,stages,shared", SM90_SHARED)
def test_split_smem_estimate_matches_sm90_compiles(dtype, heads, r, block_n, stages, shared):
    """split.prefix_smem covers what Triton 3.6 allocates for sm_90 within its 1 KiB margin."""
    from ddprobe.engine.kernels import split
    t = dataclasses.replace(split.DEFAULT_TUNING, block_n=block_n, num_stages=stages)
    cfg = split.choose_config(4096, heads * r, 132, t, dtype=dtype, width=576, r=r, smem_limit=1 << 62)
    assert shared <= split.prefix_smem(cfg, r, 576, dtype.itemsize) <= shared + 1024 + 16


@pytest.mark.parametrize("heads,r,fp32_tiles", [(2, 9, (32, 64, 1)), (8, 9, (64, 32, 1)), (64, 9, (64, 32, 1)),
                                                (1, 64, (32, 64, 1)), (2, 33, (32, 64, 1))])
def test_split_config_fits_shared_memory(heads, r, fp32_tiles):
    """At 512 + 64 wide, bf16/fp16 keep the tuned tiles (64 tokens, 2 stages: fits); fp32 steps down, only as far
    as needed, to fewer stages, then 32-token tiles, then (the tree part's 64-row tile beside 64 rows, R > 32)
    32-row blocks: (block_q, block_n, num_stages). The plan shows it (config_for) for the dtype it was built for."""
    from ddprobe.engine.kernels import split
    hq, limit = heads * r, split.SMEM_SM90
    asked = split.choose_config(4096, hq, 132, dtype=torch.float32, r=r, smem_limit=1 << 62)
    b16 = split.choose_config(4096, hq, 132, dtype=torch.bfloat16, r=r)
    assert b16 == split.choose_config(4096, hq, 132, dtype=torch.float16, r=r) == split.choose_config(4096, hq, 132)
    assert b16 == asked and (b16["block_n"], b16["num_stages"]) == (64, 2)  # unchanged: the tuning's own
    assert split.prefix_smem(asked, r, 576, 4) > limit
    f32 = split.choose_config(4096, hq, 132, dtype=torch.float32, r=r)
    assert (f32["block_q"], f32["block_n"], f32["num_stages"]) == fp32_tiles
    assert split.prefix_smem(f32, r, 576, 4) <= limit
    moved = {k for k in b16 if f32[k] != b16[k]}
    assert moved <= (STEP if f32["block_q"] == b16["block_q"] else STEP | {"block_q", "tail_program", "n_qb"})
    mask = shape_mask("lopsided", r - 1, DEV)
    p32 = split.plan(70, mask, None, 512, heads=heads, dtype=torch.float32)
    p16 = split.plan(70, mask, None, 512, heads=heads)
    c32 = split.config_for(p32, heads)
    assert (c32["block_q"], c32["block_n"], c32["num_stages"]) == fp32_tiles
    assert split.config_for(p16, heads, torch.float32) == c32
    assert split.config_for(p32, heads, torch.bfloat16) == split.config_for(p16, heads)
    assert split.config_for(p16, heads)["num_stages"] == 2 and split.config_for(p16, heads, torch.float16) is p16.extra["config"]


def test_split_prefetch_auto():
    """SplitTuning.prefetch = -1 (auto): 2 tiles ahead where the rows take three or more 64-row programs per split (64
    heads x 9 rows: nine), none for 8 heads x 9 (a 64-row and a 16-row program), one block, or 32-row blocks (fp32
    rows stepped down: not measured); an explicit value is kept."""
    import dataclasses as dc

    from ddprobe.engine.kernels import split
    assert split.DEFAULT_TUNING.prefetch == -1
    assert split.choose_config(4096, 64 * 9, 132)["prefetch"] == 2
    assert split.choose_config(4096, 8 * 9, 132)["prefetch"] == 0
    assert split.choose_config(4096, 4 * 9, 132)["prefetch"] == 0
    assert split.choose_config(4096, 2 * 33, 132, dtype=torch.float32, r=33)["prefetch"] == 0  # 3 x 32 rows
    for n in (0, 1, 3):
        assert split.choose_config(4096, 8 * 9, 132, dc.replace(split.DEFAULT_TUNING, prefetch=n))["prefetch"] == n


def test_split_nothing_fits_is_one_line():
    """When even 32-token, 1-stage tiles with 32-row blocks exceed the limit: a one-line ValueError naming the dtype
    and width, from choose_config (an explicit limit), plan (fp32 rows 2048 + 64 wide) and run (before any launch)."""
    from ddprobe.engine.kernels import split
    with pytest.raises(ValueError, match=r"torch\.float32 kv rows 576 wide in 100000 B") as e:
        split.choose_config(4096, 72, 132, dtype=torch.float32, width=576, r=9, smem_limit=100_000)
    assert "\n" not in str(e.value)
    assert split.choose_config(4096, 72, 132, dtype=torch.bfloat16, width=576, r=9, smem_limit=100_000)["block_q"] == 32
    mask = shape_mask("chain", 8, DEV)
    with pytest.raises(ValueError, match=r"torch\.float32 kv rows 2112 wide"):
        split.plan(100, mask, None, 2048, heads=2, dtype=torch.float32)
    q = torch.zeros(9, 2, 2112, device=DEV)
    with pytest.raises(ValueError, match=r"torch\.float32 kv rows 2112 wide"):
        split.run(q, torch.zeros(120, 2112, device=DEV), split.plan(100, mask, None, 2048), 0.1)


@pytest.mark.parametrize("budget,heads", [(8, 8), (63, 1)])
@needs_kernels
def test_split_fp32_k2_after_step_down(budget, heads):
    """fp32 at 512 + 64 with 32-token tiles (72 folded rows) and with 32-row blocks (R = 64) matches the fp32
    reference (2 heads x 9 rows, 64-token tiles and one stage: test_split_tile_loads)."""
    check("split", 70, budget, "lopsided", heads, torch.float32, v_dim=512, rope=64)


@needs_kernels
def test_split_tma_fallback():
    """A kv whose rows are not 16-byte aligned cannot be described: pointer loads instead."""
    split = PATHS["split"]
    q, kv, _, mask = make_inputs("split", 50, 8, "fork", 2, torch.float16)
    kv_odd = torch.full((kv.shape[0], kv.shape[1] + 4), float("nan"), dtype=kv.dtype, device=kv.device)
    kv_odd[:, :kv.shape[1]] = kv
    kv_view = kv_odd[:, :kv.shape[1]]  # row stride 100 halfs = 200 bytes
    assert not split._tma_ok(kv_view) and split._tma_ok(kv)
    out = split.run(q, kv_view, split.plan(50, mask, None, 64), 0.1)
    ref = reference.run(q, kv, reference.plan(50, mask, None, 64), 0.1)
    assert float((out.float() - ref.float()).norm() / ref.float().norm()) < TOL[torch.float16]


@needs_kernels
def test_split_tail_program_spare_splits_are_empty():
    """A device plan's grid is sized for its bound: at a shorter prefix the 16-row tail program's splits past it
    mark their split empty (lse -inf) and write no partial output, so whatever the buffer holds (NaN here) never
    reaches the result; it matches the reference at that prefix."""
    split = PATHS["split"]
    q, kv, _, mask = make_inputs("split", 60, 8, "lopsided", 8, torch.float16)
    prefix_t = torch.full((1,), 60, dtype=torch.int32, device=DEV)
    plan = split.plan(prefix_t, mask, None, 64, heads=8, max_prefix=400)
    pool = torch.full((400 + 9, kv.shape[1]), float("nan"), dtype=kv.dtype, device=DEV)
    pool[: kv.shape[0]] = kv
    cfg = split.config_for(plan, 8)
    assert cfg["tail_program"] == 16 and cfg["num_splits"] >= 2  # one chunk (min_chunk) covers 60 tokens
    plan.extra["partials"][0].fill_(float("nan"))
    out = split.run(q, pool, plan, 0.125)
    ref = reference.run(q, kv, reference.plan(60, mask, None, 64), 0.125)
    assert torch.isfinite(out).all()
    assert float((out.float() - ref.float()).norm() / ref.float().norm()) < TOL[torch.float16]


@pytest.mark.parametrize("heads,budget", [(12, 8), (8, 12), (2, 63)])
@needs_kernels
def test_split_rows_81_to_128_use_64_row_blocks(heads, budget):
    """Hq in (80, 128] (12 heads x 9, 8 heads x 13, 2 heads x 64) takes two 64-row blocks: a 128-row block
    does not compile for sm_90 at 576 wide (ptxas wants 158 registers, 16 warps allow 128)."""
    split = PATHS["split"]
    hq = heads * (budget + 1)
    cfg = split.choose_config(300, hq, 132)
    assert 80 < hq <= 128 and cfg["block_q"] == 64 and cfg["n_qb"] == 2 and cfg["num_warps"] == 8
    check("split", 100, budget, "lopsided", heads, torch.float16)


@needs_kernels
def test_split_many_blocks_and_splits():
    """Hq = 16 x 9 = 144 rows: three 64-row blocks, several splits."""
    check("split", 250, 8, "lopsided", 16, torch.float16, tuning=tune(min_chunk=64))


@pytest.mark.parametrize("path", ["paged", "split"])
@needs_kernels
def test_tree_mask_is_applied(path):
    """star and chain differ only in the tree mask: outputs must differ, each matching reference."""
    a = check(path, 5, 8, "star", 2, torch.float32)
    b = check(path, 5, 8, "chain", 2, torch.float32)
    assert not torch.allclose(a[1:], b[1:], atol=1e-3)
    assert torch.allclose(a[:2], b[:2], atol=1e-4)  # root and first child see the same columns


@needs_kernels
def test_noncontiguous_q():
    q, kv, _, mask = make_inputs("split", 40, 8, "fork", 4, torch.float16)
    big = torch.zeros(q.shape[0], q.shape[1] * 2, q.shape[2], dtype=q.dtype, device=q.device)
    big[:, ::2] = q
    qv = big[:, ::2]
    m = get_path("split")
    out = m.run(qv, kv, m.plan(40, mask, None, 64), 0.1)
    ref = reference.run(q, kv, reference.plan(40, mask, None, 64), 0.1)
    assert float((out.float() - ref.float()).norm() / ref.float().norm()) < TOL[torch.float16]


@needs_kernels
def test_plan_reused_across_layers():
    split = PATHS["split"]
    _, kv0, _, mask = make_inputs("split", 90, 8, "lopsided", 4, torch.float16, seed=1)
    p = split.plan(90, mask, None, 64)
    for seed in (2, 3):
        q, kv, _, _ = make_inputs("split", 90, 8, "lopsided", 4, torch.float16, seed=seed)
        out = split.run(q, kv, p, 0.1)
        ref = reference.run(q, kv, reference.plan(90, mask, None, 64), 0.1)
        assert float((out.float() - ref.float()).norm() / ref.float().norm()) < TOL[torch.float16]


@needs_kernels
def test_errors():
    paged, split = get_path("paged"), get_path("split")
    big = torch.ones(65, 65, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match="at most 64"):
        split.plan(10, big)
    with pytest.raises(ValueError, match="at most 64"):
        paged.plan(10, big, torch.arange(80))
    m = shape_mask("chain", 3)
    with pytest.raises(ValueError, match="slots"):
        paged.plan(10, m, None)
    with pytest.raises(ValueError, match="contiguous"):
        split.plan(10, m, torch.arange(14))
    q = torch.randn(4, 2, 64 + 24)
    kv = torch.randn(20, 64 + 24)
    with pytest.raises(ValueError, match="powers of two"):
        split.run(q, kv, split.plan(10, m, None, 64), 0.1)
    with pytest.raises(ValueError, match="dtype"):
        q2 = torch.randn(4, 2, 96, dtype=torch.float16)
        split.run(q2, torch.randn(20, 96), split.plan(10, m, None, 64), 0.1)


def test_tree_shapes():
    for name, fn in SHAPES.items():
        for b in (1, 8, 32):
            parents = fn(b)
            assert len(parents) == b + 1 and parents[0] == -1
            mk = ancestor_mask(parents)
            assert mk.diagonal().all() and mk[:, 0].all()  # everyone sees the root
            assert not mk.triu(1).any()
    assert shape_mask("star", 4).sum() == 5 + 4
    with pytest.raises(ValueError):
        ancestor_mask([-1, 2, 0])


@pytest.mark.parametrize("path", ["reference", "paged", "split"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@needs_kernels
def test_device_plan_reads_lengths_from_tensors(path, dtype):
    """One device plan (bound 260 columns of prefix) reused over growing contexts: the caller
    rewrites prefix_t, the tree mask and the slot table in place and calls refresh(); every step
    matches a fresh host plan through the reference. Rows past prefix + R are NaN, so any read
    beyond the length in device memory fails."""
    m, r, heads, bound, v = get_path(path), 9, 8, 260, 64
    g = torch.Generator().manual_seed(11)
    prefix_t = torch.zeros(1, dtype=torch.int32, device=DEV)
    mask_buf = torch.eye(r, dtype=torch.bool, device=DEV)
    slot_buf = torch.zeros(bound + r, dtype=torch.int64, device=DEV) if path != "split" else None
    plan = m.plan(prefix_t, mask_buf, slot_buf, v, heads=heads, max_prefix=bound)
    keys = set(plan.extra)
    for ctx, shape in ((0, "star"), (5, "lopsided"), (130, "fork"), (200, "chain"), (260, "lopsided")):
        q = torch.randn(r, heads, v + 32, generator=g).to(dtype).to(DEV)
        pool = bound + r + 7
        kv = torch.full((pool, v + 32), float("nan"))
        if path == "split":
            kv[: ctx + r] = torch.randn(ctx + r, v + 32, generator=g)
            slots = None
        else:
            slots = torch.randperm(pool, generator=g)[: ctx + r]
            kv[slots] = torch.randn(ctx + r, v + 32, generator=g)
            slot_buf[: ctx + r] = slots.to(DEV)
        kv = kv.to(dtype).to(DEV)
        mask = shape_mask(shape, r - 1, DEV)
        prefix_t.fill_(ctx)
        mask_buf.copy_(mask)
        m.refresh(plan)
        out = m.run(q, kv, plan, 0.125)
        ref = reference.run(q, kv, reference.plan(ctx, mask, slots.to(DEV) if slots is not None else None, v), 0.125)
        assert torch.isfinite(out).all(), f"{path} ctx={ctx}: read a row past the device length"
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        assert err < TOL[dtype], f"{path} device plan ctx={ctx} {shape}: rel err {err:.2e}"
    assert set(plan.extra) == keys  # nothing was memoized into the plan by run()


@needs_kernels
def test_tuning_is_held_by_the_plan_and_meta_is_opt_in():
    split, paged = PATHS["split"], PATHS["paged"]
    mask = shape_mask("fork", 8, DEV)
    t = tune(block_q=32, block_n=32)
    p = split.plan(100, mask, None, 64, tuning=t, heads=8)
    assert p.tuning is t and split.config_for(p, 8)["block_q"] == 32 and split.config_for(p, 8)["block_n"] == 32
    assert split.DEFAULT_TUNING.block_q == 0 and split.plan(100, mask, None, 64).tuning == split.DEFAULT_TUNING
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.block_q = 0
    with pytest.raises(ValueError, match="SplitTuning"):
        split.plan(100, mask, None, 64, tuning=paged.DEFAULT_TUNING)
    q, kv, slots, _ = make_inputs("paged", 100, 8, "fork", 2, torch.float16)
    meta: dict = {}
    paged.run(q, kv, paged.plan(100, mask, slots, 64, tuning=paged.PagedTuning(num_stages=1)), 0.1, meta=meta)
    assert set(meta) == {"paged"} and "n_regs" in meta["paged"]
    q, kv, _, _ = make_inputs("split", 100, 8, "fork", 2, torch.float16)
    split.run(q, kv, p, 0.1)  # no meta asked: nothing recorded anywhere
    split.run(q, kv, p, 0.1, meta=meta)
    assert {"prefix", "merge"} <= set(meta)


@needs_kernels
def test_device_plan_errors():
    split = PATHS["split"]
    mask = shape_mask("chain", 3, DEV)
    with pytest.raises(ValueError, match="max_prefix"):
        split.plan(torch.zeros(1, dtype=torch.int32, device=DEV), mask)
    with pytest.raises(ValueError, match="int32"):
        split.plan(torch.zeros(1, dtype=torch.int64, device=DEV), mask, max_prefix=10)


@needs_kernels
@pytest.mark.parametrize("kind,bm,chunk,bv,warps", [(0, 16, 8, 0, 4), (0, 8, 64, 0, 8), (0, 32, 16, 64, 4),
                                                     (0, 16, 32, 16, 4), (1, 16, 1, 0, 4), (1, 8, 4, 0, 2),
                                                     (1, 16, 16, 64, 4), (2, 8, 4, 64, 4), (2, 16, 16, 0, 2),
                                                     (3, 16, 8, 0, 4), (3, 8, 4, 32, 2)])
@pytest.mark.parametrize("part", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_ws_merge_shapes_match_torch(kind, bm, chunk, bv, warps, part):
    """split_ws's merges (split's online one and the flat one) and their knobs (rows and value columns per
    program, partials per step, warps) on random
    partials, some splits empty (lse -inf, their partials never written: NaN), against the merge in torch:
    out = sum_i 2^(lse_i - M) o_i / sum_i 2^(lse_i - M) over the splits and the tree part (last index). The
    partials fp32 or 16-bit (WsTuning.part_bits 16): read as fp32, the sum in fp32."""
    from ddprobe.engine.kernels import split_ws
    g = torch.Generator().manual_seed(bm * 100 + chunk)
    r, h, v, ns = 9, 8, 512, 13
    hq = r * h
    o = torch.randn(ns + 1, hq, v, generator=g).to(part).float()  # the values a 16-bit partial holds
    lse = torch.randn(ns + 1, hq, generator=g) * 4
    empty = torch.tensor([2, 7, 12])
    lse[empty] = float("-inf")
    o[empty] = float("nan")
    w = torch.exp2(lse - lse.max(0).values)
    want = (torch.nan_to_num(o) * w[..., None]).sum(0) / w.sum(0)[:, None]
    p = split_ws.plan(4000, shape_mask("lopsided", r - 1, DEV), None, v, tuning=split_ws.WsTuning(
        merge_block_m=bm, merge_split_chunk=chunk, merge_bv=bv, merge_warps=warps, merge_kind=kind))
    out = torch.empty(r, h, v, device=DEV)
    split_ws.launch_merge((o.to(part).to(DEV), lse.to(DEV)), ns, out, p)
    assert torch.allclose(out.cpu().reshape(hq, v), want, atol=1e-5, rtol=1e-5)


def test_merge_config_picks_by_rows_and_refuses_unknown_kinds():
    """merge_kind -1 picks the summed-once flat merge (3) up to 128 folded rows and the flat one-partial-per-step
    merge (1) above; explicit knobs override the kind's preset; an unknown kind is a one-line ValueError."""
    from ddprobe.engine.kernels import split_ws
    t = split_ws.WsTuning()
    assert split_ws.merge_plan(t, 72, 512, 132) == dict(kind=3, block_m=16, split_chunk=8, stages=3, warps=4,
                                                        n_mb=5, bv=16, s_max=128)
    # with the tail kernel (tail=1), 72 rows are one program: twice the partials, 8-row merge programs
    assert split_ws.merge_plan(split_ws.WsTuning(tail=1), 72, 512, 132) == dict(
        kind=3, block_m=8, split_chunk=8, stages=3, warps=4, n_mb=9, bv=32, s_max=256)
    assert split_ws.merge_plan(split_ws.WsTuning(tail=1, merge_block_m=32), 72, 512, 132)["block_m"] == 32
    assert split_ws.merge_plan(t, 72, 512, 132, 131072) == split_ws.merge_plan(split_ws.WsTuning(tail=1), 72, 512, 132)
    assert split_ws.merge_plan(t, 576, 512, 132) == dict(kind=1, block_m=8, split_chunk=1, stages=4, warps=4,
                                                         n_mb=72, bv=256, s_max=16)
    assert split_ws.merge_plan(split_ws.WsTuning(merge_kind=0, merge_split_chunk=16), 576, 512, 132)["split_chunk"] == 16
    with pytest.raises(ValueError, match="merge_kind must be"):
        split_ws.merge_plan(split_ws.WsTuning(merge_kind=7), 72, 512, 132)
    # split: the same choice; S_MAX above the most partials its prefix grid writes (one program per SM)
    from ddprobe.engine.kernels import split
    assert split.merge_plan(split.DEFAULT_TUNING, 72, 512, 132)["kind"] == 3
    assert split.merge_plan(split.DEFAULT_TUNING, 72, 512, 132)["s_max"] == 256
    assert split.merge_plan(split.DEFAULT_TUNING, 576, 512, 300)["s_max"] == 512  # 300 SMs: up to 300 partials


@needs_kernels
@pytest.mark.parametrize("kind", [0, 1, 2, 3])
@pytest.mark.parametrize("heads", [8, 16])
def test_split_merge_kinds(kind, heads):
    """`split` with each merge kind (72 folded rows: the auto rule picks 3; 144: 1), a prefix with several
    splits and a poisoned cache tail, against the fp32 reference."""
    check("split", 300, 8, "lopsided", heads, torch.float32, tuning=tune(merge_kind=kind))
