"""The GPU-only verify path `split_ws` (Gluon, sm_90) and `split` in bf16 on the GPU, vs the fp32 reference.

Gluon kernels do not run under TRITON_INTERPRET, so these tests need an H100/H200: on any other machine
they are skipped with the reason (the CPU tests in test_kernels.py cover `split`, which computes the same
thing). Inputs as in test_kernels.py: fresh random q and cache rows, every cache row past prefix + R
poisoned with NaN (a read past the plan's columns shows up as NaN in the output), all four tree shapes,
budgets 1 to 63, 1 to 64 heads (9 to 576 folded rows: one and several 64-row blocks, the 72-row case
padded to 128), prefixes that end mid-tile, no prefix at all, and the k2 width (512 latent + 64 rope).
Tolerances (relative Frobenius error): bf16 1e-2, fp16 3e-3 (outputs rounded to the input dtype;
measured about 1e-3 and 3e-4).
"""
from __future__ import annotations

import pytest
import torch

from ddprobe.engine.kernels import get_path, reference
from ddprobe.engine.kernels.trees import shape_mask

pytest.importorskip("triton")

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def gpu(test):
    """An H100/H200 test (marker ``gpu``): split_ws is a Gluon kernel for sm_90; skipped elsewhere."""
    skip = pytest.mark.skipif(not HOPPER, reason="split_ws is a Gluon kernel for sm_90 (H100/H200): no such GPU "
                                                 "here, and Gluon does not run under TRITON_INTERPRET")
    return pytest.mark.gpu(skip(test))


TOL = {torch.bfloat16: 1e-2, torch.float16: 3e-3}
V, PE = 512, 64


def make_inputs(ctx, budget, shape, heads, dtype, seed=0, poison=70):
    g = torch.Generator().manual_seed(seed * 1000 + ctx * 7 + budget * 3 + heads)
    r = budget + 1
    n = ctx + r
    q = torch.randn(r, heads, V + PE, generator=g).to(dtype)
    kv = torch.full((n + poison, V + PE), float("nan"))
    kv[:n] = torch.randn(n, V + PE, generator=g)
    return q.cuda(), kv.to(dtype).cuda(), shape_mask(shape, budget, "cuda")


def check(path, ctx, budget, shape, heads, dtype, sm_scale=0.0722, tuning=None, repeat=1):
    """Output vs the fp32 reference; with ``repeat`` > 1 the same call again must give the same bits (a
    missing barrier between partitions shows up as outputs that move from run to run)."""
    q, kv, mask = make_inputs(ctx, budget, shape, heads, dtype)
    m = get_path(path)
    p = m.plan(ctx, mask, None, V, tuning=tuning)
    out = m.run(q, kv, p, sm_scale)
    ref = reference.run(q, kv, reference.plan(ctx, mask, None, V), sm_scale)
    assert out.shape == (budget + 1, heads, V) and out.dtype == dtype
    assert torch.isfinite(out).all(), "NaN/inf in output: a poisoned row was read"
    err = float((out.float() - ref.float()).norm() / ref.float().norm())
    assert err < TOL[dtype], f"{path} ctx={ctx} B={budget} {shape} H={heads} {dtype}: rel err {err:.2e}"
    for _ in range(repeat - 1):
        assert torch.equal(m.run(q, kv, p, sm_scale), out), "outputs differ between identical calls (a race)"
    return err


CASES = [
    # ctx, budget, shape, heads, dtype
    (0, 8, "lopsided", 8, torch.bfloat16),
    (1, 8, "chain", 8, torch.bfloat16),
    (17, 1, "star", 1, torch.bfloat16),
    (63, 8, "fork", 8, torch.float16),
    (64, 8, "lopsided", 64, torch.bfloat16),
    (65, 32, "star", 2, torch.bfloat16),
    (300, 63, "lopsided", 1, torch.bfloat16),
    (1000, 8, "lopsided", 8, torch.bfloat16),
    (4097, 8, "fork", 64, torch.bfloat16),
    (33000, 8, "lopsided", 8, torch.bfloat16),
    (20000, 8, "chain", 16, torch.float16),
]


@gpu
@pytest.mark.parametrize("path", ["split_ws", "split"])
@pytest.mark.parametrize("ctx,budget,shape,heads,dtype", CASES)
def test_matches_reference(path, ctx, budget, shape, heads, dtype):
    check(path, ctx, budget, shape, heads, dtype)


@gpu
def test_tree_mask_is_applied():
    """Same inputs, star vs chain: different outputs, each equal to its own reference."""
    outs = []
    for shape in ("star", "chain"):
        q, kv, mask = make_inputs(500, 8, "star", 8, torch.bfloat16)
        mask = shape_mask(shape, 8, "cuda")
        m = get_path("split_ws")
        out = m.run(q, kv, m.plan(500, mask, None, V), 0.07)
        ref = reference.run(q, kv, reference.plan(500, mask, None, V), 0.07)
        assert float((out.float() - ref.float()).norm() / ref.float().norm()) < TOL[torch.bfloat16]
        outs.append(out.float())
    assert (outs[0][1:] - outs[1][1:]).abs().max() > 1e-2


@gpu
@pytest.mark.parametrize("over", [{}, dict(tail=1), dict(tail=1, fold_tree=1), dict(tail=1, fold_tree=0),
                                  dict(part_bits=16), dict(tail=1, part_bits=16), dict(tail=1, tail_fuse=1),
                                  dict(tail=1, tail_fuse=1, part_bits=16), dict(tail=1, tail_queue=1),
                                  dict(tail=1, tail_queue=1, part_bits=16), dict(tail=1, tail_queue=1, merge_kind=1),
                                  dict(tail=1, tail_queue=1, merge_kind=2), dict(tail=1, tail_queue=1, merge_kind=3)],
                         ids=["default", "tail", "tail-fold", "tail-tree-apart", "p16", "tail-p16", "tail-fused",
                              "tail-fused-p16", "tail-queue", "tail-queue-p16", "tail-queue-merge1",
                              "tail-queue-merge2", "tail-queue-merge3"])
def test_plan_reused_across_layers_with_poisoned_partials(over):
    """One plan sized for 8 heads, several layers; its partial buffers, poisoned with NaN between layers,
    are fully rewritten by every layer (no stale split is merged)."""
    from ddprobe.engine.kernels.split_ws import WsTuning
    m = get_path("split_ws")
    q, kv, mask = make_inputs(5000, 8, "lopsided", 8, torch.bfloat16)
    p = m.plan(5000, mask, None, V, heads=8, tuning=WsTuning(**over))
    for layer in range(3):
        kv_l = kv.clone()
        kv_l[: 5000 + 9] = torch.randn(5009, V + PE, device="cuda").to(kv.dtype)
        out = m.run(q, kv_l, p, 0.07)
        ref = reference.run(q, kv_l, reference.plan(5000, mask, None, V), 0.07)
        assert float((out.float() - ref.float()).norm() / ref.float().norm()) < TOL[torch.bfloat16]
        for buf in p.detail.partials:
            buf.fill_(float("nan"))


MERGE_TUNINGS = [dict(merge_kind=0), dict(merge_kind=1), dict(merge_kind=3),
                 dict(merge_kind=2, merge_bv=64, merge_split_chunk=16),
                 dict(merge_kind=0, merge_split_chunk=64, merge_warps=8, merge_block_m=8)]


@gpu
@pytest.mark.parametrize("over", MERGE_TUNINGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("ctx,budget,shape,heads,dtype", CASES)
def test_merge_variants_match_reference(over, ctx, budget, shape, heads, dtype):
    """Every merge kind and shape, same shapes and poisoned rows as above; called twice, the same bits."""
    from ddprobe.engine.kernels.split_ws import WsTuning
    check("split_ws", ctx, budget, shape, heads, dtype, tuning=WsTuning(**over), repeat=2)


# the one-program kernel for 65-72 folded rows: the CASES in that range, and more shapes there (4 heads x 17 rows =
# 68: the Q tail's last 4 rows are past q and read as zeros; 9 heads x 8 rows), prefixes ending mid-tile, no prefix
TAIL_CASES = [c for c in CASES if 64 < c[3] * (c[1] + 1) <= 72] + [
    (5000, 8, "fork", 8, torch.bfloat16), (12000, 8, "star", 8, torch.bfloat16), (2000, 8, "chain", 8, torch.float16),
    (700, 7, "lopsided", 9, torch.bfloat16), (100, 16, "fork", 4, torch.bfloat16), (64, 8, "lopsided", 8, torch.float16),
    (63, 8, "star", 8, torch.bfloat16), (129, 8, "fork", 8, torch.bfloat16)]


@gpu
@pytest.mark.parametrize("fold", [0, 1])
@pytest.mark.parametrize("ctx,budget,shape,heads,dtype", TAIL_CASES)
def test_tail_matches_reference(fold, ctx, budget, shape, heads, dtype):
    """The 64 + 8-row program (rows 64.. on warpgroup 1 with KV tokens on M) against the fp32 reference, the
    tree part folded or not; called twice, the same bits."""
    from ddprobe.engine.kernels.split_ws import WsTuning, block_rows
    t = WsTuning(tail=1, fold_tree=fold)
    assert block_rows(heads * (budget + 1), t) == 72  # the tail kernel is the one that runs
    check("split_ws", ctx, budget, shape, heads, dtype, tuning=t, repeat=2)


@gpu
@pytest.mark.parametrize("part_bits", [32, 16])
@pytest.mark.parametrize("ctx,budget,shape,heads,dtype", TAIL_CASES)
def test_tail_queue_matches_reference(part_bits, ctx, budget, shape, heads, dtype):
    """The tail kernel taking its tiles from the plan's queue (WsTuning.tail_queue 1: one program per SM, the next
    64-token tile from a counter until none is left; most programs get nothing at small contexts): the fp32
    reference on three calls (which program takes which tile varies, so the bits may too), and the queue back to
    zeros after each launch (the last program to finish resets it)."""
    from ddprobe.engine.kernels.split_ws import WsTuning
    q, kv, mask = make_inputs(ctx, budget, shape, heads, dtype)
    m = get_path("split_ws")
    p = m.plan(ctx, mask, None, V, tuning=WsTuning(tail=1, tail_queue=1, part_bits=part_bits), heads=heads,
               dtype=dtype)
    d = p.detail
    assert d.kernel == "tail" and d.queue is not None and d.cfg["grid_splits"] == d.sm_count and not d.fused
    ref = reference.run(q, kv, reference.plan(ctx, mask, None, V), 0.0722)
    for call in range(3):
        out = m.run(q, kv, p, 0.0722)
        torch.cuda.synchronize()
        assert torch.isfinite(out).all(), f"call {call}: NaN/inf (a poisoned row or an empty program's O was read)"
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        assert err < TOL[dtype], f"queue ctx={ctx} B={budget} {shape} H={heads} {dtype} call {call}: rel err {err:.2e}"
        assert d.queue.tolist() == [0, 0], f"call {call}: the queue was not reset ({d.queue.tolist()})"


@gpu
@pytest.mark.parametrize("part_bits", [32, 16])
@pytest.mark.parametrize("ctx,budget,shape,heads,dtype", TAIL_CASES)
def test_tail_with_its_merge_fused_matches_reference(part_bits, ctx, budget, shape, heads, dtype):
    """The tail kernel with the merge inside its launch (WsTuning.tail_fuse 1: a grid barrier on the plan's
    counter, then every program merges its share; empty splits arrive too): the fp32 reference, and the same bits
    on the second call (the barrier has reset its arrivals and moved its generation on)."""
    from ddprobe.engine.kernels.split_ws import WsTuning
    t = WsTuning(tail=1, tail_fuse=1, part_bits=part_bits)
    q, kv, mask = make_inputs(ctx, budget, shape, heads, dtype)
    m = get_path("split_ws")
    p = m.plan(ctx, mask, None, V, tuning=t, heads=heads, dtype=dtype)
    assert p.detail.kernel == "tail" and p.detail.fused and p.detail.counter is not None
    out = m.run(q, kv, p, 0.0722)
    ref = reference.run(q, kv, reference.plan(ctx, mask, None, V), 0.0722)
    assert torch.isfinite(out).all(), "NaN/inf in output: a poisoned row or an unwritten partial was read"
    err = float((out.float() - ref.float()).norm() / ref.float().norm())
    assert err < TOL[dtype], f"fused tail ctx={ctx} B={budget} {shape} H={heads} {dtype}: rel err {err:.2e}"
    assert torch.equal(m.run(q, kv, p, 0.0722), out), "outputs differ between identical calls (a race)"
    assert p.detail.counter.tolist() == [0, 2], "each launch: every program arrived, the generation moved on once"
    with pytest.raises(ValueError, match="does not merge inside its launch"):
        m.launch_prefix(q, kv, m.plan(ctx, mask, None, V, tuning=WsTuning(tail=1), heads=heads, dtype=dtype), 0.07,
                        out=torch.empty_like(out))


@gpu
def test_unsupported_inputs_are_one_line_errors():
    m = get_path("split_ws")
    q, kv, mask = make_inputs(100, 8, "fork", 2, torch.bfloat16)
    with pytest.raises(ValueError, match="bf16 or fp16"):
        m.run(q.float(), kv.float(), m.plan(100, mask, None, V), 0.1)
    with pytest.raises(ValueError, match="512 \\+ 64"):
        m.run(q[..., :96].contiguous(), kv[:, :96].contiguous(), m.plan(100, mask, None, 64), 0.1)
    dev_plan = m.plan(torch.tensor([100], dtype=torch.int32, device="cuda"), mask, None, V, max_prefix=160, heads=2,
                      dtype=torch.bfloat16)  # split_ws takes device plans (what a captured engine step needs)
    assert dev_plan.dynamic and dev_plan.prefix_len == 160
    with pytest.raises(ValueError, match="built for 2 heads"):
        m.run(torch.cat([q, q], 1), kv, dev_plan, 0.1)
    with pytest.raises(ValueError, match="not built by split_ws"):
        m.run(q, kv, get_path("split").plan(100, mask, None, V), 0.1)


def test_refuses_without_hopper(monkeypatch):
    """On a machine without an sm_90 GPU (CPU CI) the path says why in one line instead of crashing."""
    if HOPPER:
        pytest.skip("this machine has the GPU the path needs")
    m = get_path("split_ws")
    mask = shape_mask("fork", 8)
    q, kv = torch.randn(9, 2, V + PE, dtype=torch.bfloat16), torch.randn(120, V + PE, dtype=torch.bfloat16)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="sm_90"):
        m.run(q, kv, m.plan(100, mask, None, V), 0.1)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        m.run(q, kv, m.plan(100, mask, None, V), 0.1)


# seesaw: CASES plus splits of 2 and 3 tiles (8 heads at 5000 and 12000), so every parity of a split's tile
# count meets the kernel's pairs (1, 2, 3, 4, 5 and 8 tiles per split occur below)
SEESAW_CASES = CASES + [(5000, 8, "fork", 8, torch.bfloat16), (12000, 8, "star", 8, torch.bfloat16)]


@gpu
@pytest.mark.parametrize("ctx,budget,shape,heads,dtype", SEESAW_CASES)
def test_cuda_seesaw_matches_reference(ctx, budget, shape, heads, dtype):
    from ddprobe.engine.kernels.split_ws import WsTuning
    check("split_ws", ctx, budget, shape, heads, dtype, tuning=WsTuning(tail=0), repeat=2)


@gpu
@pytest.mark.parametrize("fold", [0, 1])
@pytest.mark.parametrize("min_chunk", [64, 128, 256])
@pytest.mark.parametrize("ctx,budget,shape,heads",
                         [(0, 8, "fork", 8), (700, 8, "lopsided", 8), (5000, 32, "star", 64), (130, 63, "chain", 2)])
def test_cuda_seesaw_tree_placements(fold, min_chunk, ctx, budget, shape, heads):
    from ddprobe.engine.kernels.split_ws import WsTuning
    check("split_ws", ctx, budget, shape, heads, torch.bfloat16,
          tuning=WsTuning(tail=0, min_chunk=min_chunk, fold_tree=fold), repeat=2)


@gpu
@pytest.mark.parametrize("sm_scale", [0.01, 0.0722, 1.0])
def test_cuda_seesaw_softmax_scales(sm_scale):
    from ddprobe.engine.kernels.split_ws import WsTuning
    check("split_ws", 33000, 8, "lopsided", 64, torch.bfloat16, sm_scale=sm_scale, tuning=WsTuning(tail=0),
          repeat=2)


@gpu
def test_cuda_seesaw_under_graph_replay_and_plan_reuse():
    """Captured in a CUDA graph (the engine's and the benchmark's case) and replayed with the partial buffers
    poisoned before every replay and new cache contents: each replay equals the reference."""
    from ddprobe.engine.kernels.split_ws import WsTuning
    m = get_path("split_ws")
    q, kv, mask = make_inputs(20000, 8, "fork", 64, torch.bfloat16)
    p = m.plan(20000, mask, None, V, heads=64, tuning=WsTuning(tail=0))
    m.run(q, kv, p, 0.07)  # loads the module outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = m.run(q, kv, p, 0.07)
    for _ in range(3):
        kv[: 20000 + 9] = torch.randn(20009, V + PE, device="cuda").to(kv.dtype)
        for buf in p.detail.partials:
            buf.fill_(float("nan"))
        g.replay()
        ref = reference.run(q, kv, reference.plan(20000, mask, None, V), 0.07)
        assert float((out.float() - ref.float()).norm() / ref.float().norm()) < TOL[torch.bfloat16]


@gpu
@pytest.mark.parametrize("heads,dtype,ctx,kernel", [(64, torch.bfloat16, 3000, "ddp_seesaw_bf16"),
                                                    (32, torch.float16, 3000, "ddp_seesaw_f16"),
                                                    (7, torch.bfloat16, 70000, "ddp_seesaw_bf16"),
                                                    (8, torch.bfloat16, 3000, "ddp_seesaw_bf16"),
                                                    (8, torch.bfloat16, 70000, "ws_tail_kernel")])
def test_default_runs_the_chosen_kernel_at_every_head_count(heads, dtype, ctx, kernel):
    """The default tuning's prefix kernel, as the launch reports it: the CUDA seesaw at 64, 32 and 7 heads (63
    folded rows) and at 8 heads (72 folded rows) below TAIL_FROM tokens, the Gluon tail kernel at 8 heads from it,
    as split_ws.choose picks for both plan kinds."""
    q, kv, mask = make_inputs(ctx, 8, "fork", heads, dtype)
    m = get_path("split_ws")
    meta = {}
    out = m.run(q, kv, m.plan(ctx, mask, None, V), 0.07, meta=meta)
    assert meta["prefix"]["name"] == kernel
    ref = reference.run(q, kv, reference.plan(ctx, mask, None, V), 0.07)
    assert float((out.float() - ref.float()).norm() / ref.float().norm()) < TOL[dtype]


@gpu
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "first-call-captured"])
def test_cuda_seesaw_captured_with_a_plan_built_without_heads(warm):
    """A plan built without ``heads`` (the engine's eager plans) is completed by its first call (kernel, grid,
    partials, launcher) without blocking, so the capture holds it even when that first call is inside the capture;
    replays with new cache contents equal the reference."""
    m = get_path("split_ws")
    q, kv, mask = make_inputs(9000, 8, "lopsided", 64, torch.bfloat16)
    p = m.plan(9000, mask, None, V)
    if warm:
        m.run(q, kv, p, 0.07)
    else:
        from ddprobe.engine.kernels import _cu
        _cu._function(_cu.KERNELS["bfloat16"], kv.device)  # the module load itself stays outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = m.run(q, kv, p, 0.07)
    for _ in range(2):
        kv[: 9000 + 9] = torch.randn(9009, V + PE, device="cuda").to(kv.dtype)
        g.replay()
        ref = reference.run(q, kv, reference.plan(9000, mask, None, V), 0.07)
        assert float((out.float() - ref.float()).norm() / ref.float().norm()) < TOL[torch.bfloat16]


@gpu
def test_cuda_seesaw_refuses_a_negative_scale():
    from ddprobe.engine.kernels.split_ws import WsTuning
    q, kv, mask = make_inputs(100, 8, "fork", 8, torch.bfloat16)
    m = get_path("split_ws")
    with pytest.raises(ValueError, match="positive softmax scale"):
        m.run(q, kv, m.plan(100, mask, None, V, tuning=WsTuning(tail=0)), -0.1)


@gpu
def test_a_cubin_that_does_not_load_is_one_line_and_the_tail_kernel_still_runs(monkeypatch, tmp_path):
    """No loadable cubin (_cu.CUBIN at a file that is not one, as a benchmark's --cubin sets it): a plan on the
    CUDA kernel (64 heads) is a one-line ValueError that names the split path, the failed load remembered by _cu
    (not retried); 72 folded rows on the tail kernel still run, merged by the Triton merge (equal to the
    reference)."""
    from ddprobe.engine.kernels import _cu, split_ws
    bad = tmp_path / "bad.cubin"
    bad.write_bytes(b"not a cubin")
    monkeypatch.setattr(_cu, "CUBIN", bad)
    monkeypatch.setattr(_cu, "_funcs", {})
    for _ in range(2):
        with pytest.raises(ValueError, match="CUDA kernel does not load here .*the split path") as e:
            check("split_ws", 5000, 8, "fork", 64, torch.bfloat16)
        assert "\n" not in str(e.value)
    assert len([v for v in _cu._funcs.values() if isinstance(v, _cu.LoadError)]) == 1
    with pytest.warns(RuntimeWarning, match="CUDA merge is unavailable"):
        check("split_ws", 5000, 8, "fork", 8, torch.bfloat16, tuning=split_ws.WsTuning(tail=1))


def test_tail_config_takes_72_rows_in_one_program():
    """Host-side (runs anywhere): with ``tail`` 65-72 folded rows are one row block of 64 + 8, so the grid takes
    twice the splits of two 64-row blocks, still one wave; other row counts keep 64-row blocks; the merge's
    S_MAX covers the larger number of partials. The default (tail=-1) runs it from a bound of TAIL_FROM tokens;
    tail=0 never."""
    from ddprobe.engine.kernels import split_ws
    t = split_ws.WsTuning(tail=1)
    for hq in (65, 68, 72):
        c = split_ws.config(131072, hq, 132, t)
        two = split_ws.config(131072, hq, 132, split_ws.WsTuning(tail=0))
        assert (c["n_qb"], c["block_q"], c["tail"], two["n_qb"], two["tail"]) == (1, 72, True, 2, False)
        assert c["num_splits"] == 2 * two["num_splits"] == 128 and c["grid_splits"] <= 132  # 1024-token chunks
        assert c["fold"] == 1 and two["fold"] == 0  # fold_tree=-1 folds the tree behind the tail kernel only
        assert split_ws.merge_plan(t, hq, 512, 132)["s_max"] == 256
        d = split_ws.DEFAULT_TUNING
        assert split_ws.config(131072, hq, 132, d) == c and split_ws.tails(hq, d, 131072)
        assert split_ws.config(32768, hq, 132, d) == split_ws.config(32768, hq, 132, split_ws.WsTuning(tail=0))
        assert split_ws.merge_plan(d, hq, 512, 132, 131072) == split_ws.merge_plan(t, hq, 512, 132)
    for hq in (9, 64, 73, 144, 576):
        assert split_ws.config(131072, hq, 132, t) == split_ws.config(131072, hq, 132, split_ws.WsTuning(tail=0))


@pytest.mark.parametrize("fold", [0, 1])
def test_tail_kernel_compiles_for_sm90_without_a_gpu(fold):
    """Host-side (runs anywhere, Triton's compiler and ptxas for sm_90a): the Gluon tail kernel with the arguments
    a plan passes compiles under this Triton (its Gluon names differ from the H200 machine's 3.6: _ws_tail picks
    them), within the 232,448 B of shared memory a block gets, with wgmma and TMA copies in its PTX."""
    import triton
    try:  # the private API this compiles through (checked on Triton 3.9, the CPU's)
        from triton.experimental.gluon._runtime import GluonASTSource  # noqa: F401
        from triton.runtime.jit import create_function_from_signature  # noqa: F401
    except ImportError as e:
        pytest.skip(f"this Triton ({triton.__version__}) compiles Gluon for a target only through its GPU: {e}")

    from ddprobe.engine.kernels import _target_compile as tc
    from ddprobe.engine.kernels import split_ws
    from ddprobe.engine.kernels._ws_tail import ws_tail_kernel as fn
    from ddprobe.engine.kernels.plan import VerifyPlan
    hq, h, r, n = 72, 8, 9, 4000
    q2, kv = torch.zeros(hq, V + PE, dtype=torch.bfloat16), torch.zeros(n + r, V + PE, dtype=torch.bfloat16)
    p = VerifyPlan(prefix_len=n, tree_mask=torch.eye(r, dtype=torch.bool), prefix_t=torch.tensor([n], dtype=torch.int32))
    cfg = split_ws.config(n, hq, 132, split_ws.WsTuning(tail=1, fold_tree=fold))
    o, lse = torch.zeros(cfg["grid_splits"], hq, V), torch.zeros(cfg["grid_splits"], hq)
    _, args, kw = split_ws.tail_launch(split_ws._descs(q2, kv, p), torch.zeros(r, dtype=torch.int64), o, lse, p, cfg,
                                       hq, V + PE, h, 0.1)  # the launch split_ws runs
    k = tc.compile_launch(fn, (9, 0), args, {**kw, "num_warps": 4})
    assert k.metadata.shared <= 232448
    ptx = k.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx


@pytest.mark.parametrize("fold", [0, 1, -1])
def test_split_config_covers_the_prefix_in_one_wave(fold):
    """Host-side tiling (runs anywhere): chunks of whole tiles that cover the prefix exactly once, and at
    most one program per SM whenever the row blocks leave room for one split each."""
    from ddprobe.engine.kernels.split_ws import BLOCK_N, choose_config
    for sms in (132, 114):
        for prefix in (0, 1, 63, 64, 65, 1000, 1024, 8192, 131072, 262144):
            for hq in (9, 72, 144, 576, 1152):
                c = choose_config(prefix, hq, sms, 64, fold)
                assert c["fold"] == (fold if fold >= 0 else int(c["n_qb"] >= 4))
                assert c["n_qb"] == -(-hq // 64) and c["grid_splits"] == c["num_splits"] + (1 - c["fold"])
                assert c["chunk"] % BLOCK_N == 0
                if prefix:
                    assert (c["num_splits"] - 1) * c["chunk"] < prefix <= c["num_splits"] * c["chunk"]
                    if c["n_qb"] * 2 <= sms:
                        assert c["n_qb"] * c["grid_splits"] <= sms
                else:
                    assert c["grid_splits"] == 1


@pytest.mark.parametrize("over,field", [(dict(fold_tree=2), "fold_tree"), (dict(tail=3), "tail"),
                                        (dict(merge_kind=7), "merge_kind"), (dict(tail_fuse=2), "tail_fuse"),
                                        (dict(tail_queue=2), "tail_queue")])
def test_tuning_outside_the_kernels_choices_is_refused(over, field):
    """Host-side (runs anywhere): a schedule knob no kernel implements is a one-line ValueError at plan time,
    naming the field, not another schedule run silently; every value the kernels implement passes the check."""
    from ddprobe.engine.kernels import split_ws
    mask = shape_mask("fork", 8)
    with pytest.raises(ValueError, match=f"WsTuning.{field} must be"):
        get_path("split_ws").plan(100, mask, None, V, tuning=split_ws.WsTuning(**over))
    for f, allowed in split_ws._CHOICES.items():
        for value in allowed:
            split_ws.check_tuning(split_ws.WsTuning(**{f: value}))
    with pytest.raises(ValueError, match="tail_queue 1 runs the merge in its own launch: it takes tail_fuse 0"):
        get_path("split_ws").plan(100, mask, None, V, tuning=split_ws.WsTuning(tail_queue=1, tail_fuse=1))
    with pytest.raises(ValueError, match=r"the online merge \(merge_kind 0\) does not take: use -2, -1 or 1-3"):
        get_path("split_ws").plan(100, mask, None, V, tuning=split_ws.WsTuning(tail_queue=1, merge_kind=0))
    for kind in (-2, -1, 1, 2, 3):
        split_ws.check_tuning(split_ws.WsTuning(tail_queue=1, merge_kind=kind))


def test_the_tail_queue_runs_one_program_per_sm_whatever_the_bound():
    """Host-side (runs anywhere): with tail_queue 1 the tail kernel's grid is one program of 72 rows per SM at every
    plan bound (the tiles come from the queue, so nothing is sized for the bound; one partial per program for the
    merge); the CUDA kernel's shapes (64 heads, or 8 heads below TAIL_FROM with tail -1) ignore the knob."""
    from ddprobe.engine.kernels import split_ws
    t = split_ws.WsTuning(tail_queue=1)
    for sms in (132, 114):
        for bound in (65536, 131072, 1 << 20):
            c = split_ws.config(bound, 72, sms, t)
            assert (c["n_qb"], c["grid_splits"], c["fold"], c["block_q"], c["tail"], c.get("queue")) == \
                (1, sms, 1, 72, True, True)
        assert split_ws.config(4096, 72, sms, split_ws.WsTuning(tail=1, tail_queue=1))["grid_splits"] == sms
        for hq, bound in ((576, 131072), (72, 32768)):
            assert split_ws.config(bound, hq, sms, t) == split_ws.config(bound, hq, sms, split_ws.WsTuning())


def test_benchmark_peers_say_why_they_cannot_run():
    """probes/bench/peers.py: without a Hopper GPU (or without the libraries) every production peer raises
    PeerUnavailable with a one-line reason, which the verify comparison records; the SDPA peer matches the
    reference."""
    from ddprobe.probes.bench import peers

    assert peers.rows_for(1) == 64 and peers.rows_for(64) == 64 and peers.rows_for(65) == 128
    with pytest.raises(ValueError, match="unknown peer"):
        peers.make("flashmla3", 100, 9, 8, V, PE, 0.07)
    if not HOPPER:
        for name in peers.PEERS:
            with pytest.raises(peers.PeerUnavailable) as e:
                peers.make(name, 100, 9, 8, V, PE, 0.07)
            assert "\n" not in str(e.value) and name.split("-")[0] in str(e.value)
    mask = shape_mask("lopsided", 8)
    q, kv = torch.randn(9, 4, 96), torch.randn(309, 96)
    out = peers.sdpa_peer(300, mask, 4, 64)(q, kv, 0.1)
    ref = reference.run(q, kv, reference.plan(300, mask, None, 64), 0.1)
    assert float((out - ref).norm() / ref.norm()) < 1e-5


# ---- device plans (the engine's CUDA-graph-captured step) ----------------------------------------------------------

# budget, shape, heads, dtype, tuning overrides, the kernel that runs (72 and 66 folded rows with tail=1: the Gluon
# tail kernel, the default from a bound of TAIL_FROM tokens; the bound here is 20000)
DEVICE_CASES = [(8, "lopsided", 8, torch.bfloat16, {}, "cuda"), (8, "fork", 64, torch.bfloat16, {}, "cuda"),
                (8, "lopsided", 8, torch.bfloat16, dict(merge_kind=-1), "cuda"),
                (8, "fork", 64, torch.bfloat16, dict(merge_kind=-1), "cuda"),
                (1, "chain", 1, torch.float16, {}, "cuda"), (32, "star", 2, torch.bfloat16, dict(tail=1), "tail"),
                (63, "lopsided", 1, torch.bfloat16, {}, "cuda"), (8, "fork", 8, torch.float16, dict(tail=1), "tail"),
                (8, "chain", 8, torch.bfloat16, dict(tail=1, fold_tree=0), "tail"),
                (8, "lopsided", 8, torch.bfloat16, dict(tail=1), "tail"),
                (8, "lopsided", 8, torch.bfloat16, dict(tail=1, tail_fuse=1), "tail"),
                (8, "fork", 8, torch.float16, dict(tail=1, tail_fuse=1, fold_tree=0, part_bits=16), "tail"),
                (8, "lopsided", 8, torch.bfloat16, dict(tail=1, tail_queue=1), "tail"),
                (8, "fork", 8, torch.float16, dict(tail=1, tail_queue=1, part_bits=16), "tail")]


@gpu
@pytest.mark.parametrize("budget,shape,heads,dtype,over,kernel", DEVICE_CASES)
def test_device_plan_replays_one_graph_at_changing_lengths(budget, shape, heads, dtype, over, kernel):
    """A device plan sized for max_prefix, captured once in a CUDA graph, replayed at prefix lengths from 0 and 1
    to max_prefix (mid-tile ends, one split, every split): the length, the tree mask and the cache rows rewritten
    in place before each replay, every cache row past prefix + R and the partial buffers poisoned with NaN; each
    replay equals the fp32 reference at that length. Both kernels device plans run: the CUDA seesaw and the Gluon
    tail kernel (each derives its chunk from the live length on the device)."""
    from ddprobe.engine.kernels.split_ws import WsTuning
    max_prefix, r = 20000, budget + 1
    m = get_path("split_ws")
    assert m.device_plans
    q, kv, mask = make_inputs(max_prefix, budget, shape, heads, dtype)
    prefix_t = torch.zeros(1, dtype=torch.int32, device="cuda")
    tree = torch.eye(r, dtype=torch.bool, device="cuda")
    p = m.plan(prefix_t, tree, None, V, heads=heads, max_prefix=max_prefix, dtype=dtype, tuning=WsTuning(**over))
    assert p.detail.kernel == kernel
    if (kernel == "cuda" and over.get("merge_kind") == -1) or over.get("tail_fuse"):
        assert p.detail.fused, "the merge runs inside the prefix kernel's launch"
    else:
        assert not p.detail.fused, "the merge is its own launch (WsTuning.merge_kind -2, the default)"
    m.refresh(p)
    m.run(q, kv, p, 0.0722)  # the module load stays outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        m.refresh(p)
        out = m.run(q, kv, p, 0.0722)
    rows = torch.randn(max_prefix + r, V + PE, device="cuda").to(dtype)
    for n in (1, 0, 63, 64, 65, 1000, 4097, 12345, max_prefix - 1, max_prefix):
        prefix_t.fill_(n)
        tree.copy_(mask)
        kv.fill_(float("nan"))
        kv[: n + r] = rows[: n + r]
        for buf in p.detail.partials:
            buf.fill_(float("nan"))
        g.replay()
        ref = reference.run(q, kv, reference.plan(n, mask, None, V), 0.0722)
        assert torch.isfinite(out).all(), f"prefix {n}: NaN (a poisoned row or partial was read)"
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        assert err < TOL[dtype], f"prefix {n}: rel err {err:.2e}"


@gpu
def test_device_plan_eager_equals_replay_and_run_checks_its_inputs():
    """The same device plan run eagerly gives the replay's bits; run() refuses inputs the plan was not built for
    (heads, dtype) in one line."""
    m = get_path("split_ws")
    q, kv, mask = make_inputs(5000, 8, "fork", 8, torch.bfloat16)
    prefix_t = torch.full((1,), 4321, dtype=torch.int32, device="cuda")
    p = m.plan(prefix_t, mask.clone(), None, V, heads=8, max_prefix=5000)
    eager = m.run(q, kv, p, 0.07).clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = m.run(q, kv, p, 0.07)
    g.replay()
    assert torch.equal(out, eager)
    with pytest.raises(ValueError, match="built for 8 heads"):
        m.run(q[:, :4].contiguous(), kv, p, 0.07)
    with pytest.raises(ValueError, match="built for 8 heads"):
        m.run(q.half(), kv.half(), p, 0.07)


@gpu
@pytest.mark.parametrize("heads", [8, 64])
def test_engine_captured_split_ws_step_equals_its_eager_run(heads):
    """The engine on split_ws (k2 widths, 2 layers, bf16, NaN-poisoned cache): graph-captured steps with device
    plans generate without reading outside the plan, and at three prefix lengths on one captured step the verify
    graph's replay gives the logits of the same step function called eagerly (same compiled layers, same plan:
    what the capture must not change), to the bit or within 1e-3 relative; greedy picks equal."""
    from ddprobe.physics.presets import ModelConfig
    from ddprobe.engine.generate import Engine

    cfg = ModelConfig.from_name("k2", heads=heads, num_layers=2, feature_layers=(0, 1), max_ctx=8192)
    eng = Engine(cfg, attn="split_ws", device="cuda", dtype=torch.bfloat16, graphs=True, seed=0, poison=True)
    assert eng.graphs
    for n_prompt in (300, 1500, 4000):  # the static step is kept while a request fits: one graph, three lengths
        res = eng.generate(list(range(1, n_prompt + 1)), max_new_tokens=16)
        assert len(res.tokens) >= 16 and all(s.graphs for s in res.steps)
        st = eng.runner.static
        graph = st.run("verify")[0].clone()
        eager = st.run("verify", eager=True)[0]
        n = int(st.rows)
        assert torch.isfinite(graph[:n]).all()
        err = float((graph[:n].float() - eager[:n].float()).norm() / eager[:n].float().norm())
        assert err < 1e-3, (n_prompt, err)
        assert torch.equal(graph[:n].argmax(-1), eager[:n].argmax(-1))


@gpu
@pytest.mark.parametrize("heads", [8, 64])
def test_bench_verify_times_the_kernel_the_engine_runs(heads):
    """The kernel the engine's captured step runs (its split_ws device plan, k2 widths, bf16) is the kernel
    `bench verify` timed for the same heads: the row's plan kind is the engine's and its kernel the engine plan's
    WsPlan.kernel; and at every context of the grid (1k-128k) the plan bench verify builds picks the kernel of a
    plan built as engine/graphs.py builds it (a [1] int32 prefix tensor, max_prefix = the context)."""
    from ddprobe.physics.presets import ModelConfig
    from ddprobe.engine.generate import Engine
    from ddprobe.probes.bench import verify as verify_bench

    cfg = ModelConfig.from_name("k2", heads=heads, num_layers=2, feature_layers=(0, 1), max_ctx=8192)
    eng = Engine(cfg, attn="split_ws", device="cuda", dtype=torch.bfloat16, graphs=True, seed=0)
    assert eng.graphs
    eng.generate(list(range(1, 301)), max_new_tokens=4)
    engine = eng.runner.static.plan
    assert engine.dynamic and engine.detail.heads == heads
    variants = [("split_ws", {"plan": "host", "tail": "1"}), ("split_ws", {"tail": "1"}), ("split_ws", {"bound": "128k"})]
    b = verify_bench.Bench(verify_bench.BenchOptions(ctxs=[4096], heads=[heads], paths=["split_ws"], quick=True,
                                                     step_ctx=None, variants=variants, eager=True))
    b.point(4096, heads)
    row, host, device, sized = b.results
    # bound=128k: the plan an engine of that capacity builds, its kernel choose's at that bound (8 heads: the tail)
    assert sized.get("ok") and sized["bound"] == 131072, sized
    assert sized["kernel"] == get_path("split_ws").choose(heads * 9, 131072)[1], sized
    assert row.get("ok"), row
    assert row["eager_us"] > 0 and row["eager_ratio"] == pytest.approx(row["eager_us"] / row["us"]), row
    assert (row["path"], row["plan"], row["kernel"]) == ("split_ws", "device", engine.detail.kernel), row
    # tail=1: the Gluon tail kernel at 72 folded rows on both plan kinds (64 heads: the CUDA kernel)
    assert row["kernel"] == "cuda", row  # the engine's bound (max_ctx 8192) and 4096 are below TAIL_FROM
    want = "tail" if heads == 8 else "cuda"
    assert host.get("ok") and (host["plan"], host["kernel"]) == ("host", want), host
    assert device.get("ok") and (device["plan"], device["kernel"]) == ("device", want), device
    m, mask = get_path("split_ws"), shape_mask("lopsided", 8, "cuda")
    for ctx in (1024, 8192, 32768, 65536, 131072):
        timed = verify_bench.engine_plan(torch, m, "device", ctx, mask, None, V, m.DEFAULT_TUNING, heads)
        prefix_t = torch.zeros(1, dtype=torch.int32, device="cuda")
        built = m.plan(prefix_t, mask, None, V, heads=heads, max_prefix=ctx)  # as StaticStep builds it
        host = m.plan(ctx, mask, None, V, heads=heads)  # the default host plan: the same kernel and grid
        assert timed.detail.kernel == built.detail.kernel == host.detail.kernel, ctx
        assert timed.detail.kernel == ("tail" if heads == 8 and ctx >= m.TAIL_FROM else "cuda"), ctx
        assert timed.detail.cfg == built.detail.cfg == host.detail.cfg, ctx


@gpu
@pytest.mark.parametrize("heads,dtype", [(8, torch.bfloat16), (64, torch.bfloat16), (8, torch.float16),
                                         (1, torch.bfloat16)])
def test_cuda_merge_matches_the_formula_with_poisoned_empty_partials(heads, dtype):
    """The CUDA merge (the default, WsTuning.merge_kind -2) on the plan's own partial buffers filled with fresh
    random values, three empty splits (lse -inf) whose partials hold NaN (never written by the prefix kernel):
    out = sum_i 2^(lse_i - M) o_i / sum_i 2^(lse_i - M), rounded to the output dtype (relative error under the
    dtype's tolerance); every column slice and row written, nothing read from the empty splits."""
    from ddprobe.engine.kernels import split_ws
    q, kv, mask = make_inputs(20000, 8, "lopsided", heads, dtype)
    p = split_ws.plan(20000, mask, None, V, heads=heads, dtype=dtype)
    d = p.detail
    assert d.merger is not None and d.merger.report["name"] == _cu_merge_name(dtype)
    o, lse = d.partials
    ns = o.shape[0] - 1
    g = torch.Generator(device="cuda").manual_seed(heads)
    o.copy_(torch.randn(o.shape, generator=g, device="cuda"))
    lse.copy_(torch.randn(lse.shape, generator=g, device="cuda") * 4)
    empty = torch.tensor([0, ns // 2, ns - 1], device="cuda")
    lse[empty] = float("-inf")
    o[empty] = float("nan")
    w = torch.exp2(lse - lse.max(0).values)
    want = ((torch.nan_to_num(o) * w[..., None]).sum(0) / w.sum(0)[:, None]).view(9, heads, V)
    out = torch.full((9, heads, V), float("nan"), dtype=dtype, device="cuda")
    assert split_ws.launch_merge(d.partials, ns, out, p) is out
    assert torch.isfinite(out).all()
    err = float((out.float() - want).norm() / want.norm())
    assert err < TOL[dtype], f"H={heads} {dtype}: rel err {err:.2e}"


def _cu_merge_name(dtype) -> str:
    from ddprobe.engine.kernels import _cu
    return _cu.MERGE_KERNELS[str(dtype).removeprefix("torch.")]


@gpu
def test_run_merges_on_cuda_by_default_and_on_triton_when_asked():
    """meta names the merge that ran: the CUDA merge by default, the Triton merge (merge.py) with merge_kind 0-3; the
    two agree with each other (both within the tolerance of the reference, checked by check())."""
    from ddprobe.engine.kernels.split_ws import WsTuning
    m = get_path("split_ws")
    q, kv, mask = make_inputs(9000, 8, "fork", 8, torch.bfloat16)
    outs = {}
    for kind in (WsTuning().merge_kind, -1, 3):
        meta: dict = {}
        outs[kind] = m.run(q, kv, m.plan(9000, mask, None, V, heads=8, tuning=WsTuning(merge_kind=kind)), 0.07,
                           meta=meta)
        assert (meta["merge"].get("name") == _cu_merge_name(torch.bfloat16)) == (kind < 0), meta["merge"]
    err = float((outs[-2].float() - outs[3].float()).norm() / outs[3].float().norm())
    assert err < TOL[torch.bfloat16]


@gpu
def test_run_refuses_kv_of_another_dtype_or_device_and_merges_any_out_correctly():
    """kv in another dtype than q, or on the CPU, is a one-line ValueError for plans built with and without heads
    (never a launch on the wrong bytes); launch_merge into an fp32 `out` (which the CUDA merge cannot write) takes
    the Triton merge, into a strided view the CUDA merge writes through its strides: both equal run()'s result."""
    from ddprobe.engine.kernels import split_ws
    m = get_path("split_ws")
    q, kv, mask = make_inputs(6000, 8, "fork", 8, torch.bfloat16)
    for heads in (8, None):
        p = m.plan(6000, mask, None, V, heads=heads)
        with pytest.raises(ValueError, match="kv"):
            m.run(q, kv.half(), p, 0.07)
        with pytest.raises(ValueError, match="kv"):
            m.run(q, kv.cpu(), p, 0.07)
    p = m.plan(6000, mask, None, V, heads=8)
    want = m.run(q, kv, p, 0.07)
    ns = p.detail.partials[0].shape[0] - 1
    out32 = torch.full((9, 8, V), float("nan"), device="cuda")
    assert torch.allclose(split_ws.launch_merge(p.detail.partials, ns, out32, p).to(want.dtype).float(),
                          want.float(), rtol=1e-2, atol=1e-2)
    wide = torch.full((9, 8, 2 * V), float("nan"), dtype=want.dtype, device="cuda")
    split_ws.launch_merge(p.detail.partials, ns, wide[..., :V], p)
    assert torch.allclose(wide[..., :V].float(), want.float(), rtol=1e-2, atol=1e-2)
    assert torch.isnan(wide[..., V:].float()).all()  # nothing written past the view


@gpu
def test_a_merge_knob_runs_the_triton_merge():
    m = get_path("split_ws")
    from ddprobe.engine.kernels.split_ws import WsTuning
    q, kv, mask = make_inputs(6000, 8, "fork", 8, torch.bfloat16)
    assert m.plan(6000, mask, None, V, heads=8).detail.merger is not None
    assert m.plan(6000, mask, None, V, heads=8, tuning=WsTuning(merge_block_m=8)).detail.merger is None
    check("split_ws", 6000, 8, "fork", 8, torch.bfloat16, tuning=WsTuning(merge_block_m=8))


@gpu
@pytest.mark.parametrize("heads,ctx,dynamic", [(8, 20000, True), (64, 33000, False), (64, 4097, True),
                                               (1, 300, True), (16, 65, False)])
def test_fused_merge_equals_the_merge_in_its_own_launch(heads, ctx, dynamic):
    """The merge fused into the CUDA prefix kernel (after its grid barrier; merge_kind -1) against the same prefix
    kernel with the merge as its own launch (merge_kind -2, the default): both within the tolerance of the fp32
    reference and within it of each other (only the order of the merge's sums differs); 30 launches in a row (30
    epochs of the barrier's counter, partials poisoned with NaN before each) give the same bits; device plans (the
    row-block x split grid) and host plans. Empty splits arriving at
    the barrier: test_device_plan_replays_one_graph_at_changing_lengths (lengths 0 to max_prefix, fused)."""
    from ddprobe.engine.kernels.split_ws import WsTuning
    m = get_path("split_ws")
    dtype = torch.bfloat16
    q, kv, mask = make_inputs(ctx, 8, "fork", heads, dtype)
    prefix = torch.full((1,), ctx, dtype=torch.int32, device="cuda") if dynamic else ctx
    extra = dict(max_prefix=ctx) if dynamic else {}
    ref = reference.run(q, kv, reference.plan(ctx, mask, None, V), 0.07)
    outs = {}
    for kind in (-1, -2):
        p = m.plan(prefix, mask, None, V, heads=heads, tuning=WsTuning(tail=0, merge_kind=kind), **extra)
        d = p.detail
        assert d.kernel == "cuda" and d.fused == (kind == -1)
        outs[kind] = m.run(q, kv, p, 0.07).clone()
        for _ in range(30):
            for buf in d.partials:
                buf.fill_(float("nan"))
            assert torch.equal(m.run(q, kv, p, 0.07), outs[kind]), f"merge_kind {kind}: outputs move between launches"
        err = float((outs[kind].float() - ref.float()).norm() / ref.float().norm())
        assert err < TOL[dtype], f"merge_kind {kind}: rel err {err:.2e}"
        if kind == -2:
            with pytest.raises(ValueError, match="cannot merge"):
                d.launcher(q, kv, 0.1, 0, torch.empty_like(outs[kind]))
    err = float((outs[-1].float() - outs[-2].float()).norm() / outs[-2].float().norm())
    assert err < TOL[dtype], f"fused vs own launch: rel err {err:.2e}"


P16_TUNINGS = [dict(tail=0), dict(tail=0, merge_kind=-1), dict(tail=1), dict(tail=1, merge_kind=3),
               dict(tail=0, merge_kind=1)]


@gpu
@pytest.mark.parametrize("over", P16_TUNINGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("heads,ctx,dtype", [(8, 20000, torch.bfloat16), (64, 33000, torch.bfloat16),
                                             (8, 4097, torch.float16)])
def test_16_bit_partials_match_the_reference(over, heads, ctx, dtype):
    """WsTuning.part_bits 16 (the partials in the inputs' dtype) on every kernel that writes or reads them: the CUDA
    prefix kernel with its fused merge, with the CUDA merge in its own launch, the tail kernel (behind the CUDA
    merge and the Triton merge), the Triton merge behind the CUDA kernel; device plans. Within the tolerance of the
    fp32 reference and of the same tuning with fp32 partials; called twice, the same bits. The plan is checked to
    run the pairing named (64 heads have no tail kernel: tail=1 there is the CUDA kernel again)."""
    from ddprobe.engine.kernels.split_ws import WsTuning
    m = get_path("split_ws")
    q, kv, mask = make_inputs(ctx, 8, "fork", heads, dtype)
    ref = reference.run(q, kv, reference.plan(ctx, mask, None, V), 0.07)
    kind = over.get("merge_kind", WsTuning().merge_kind)
    kernel = "tail" if over["tail"] == 1 and heads * 9 <= 72 else "cuda"
    outs = {}
    for bits in (32, 16):
        prefix = torch.full((1,), ctx, dtype=torch.int32, device="cuda")
        p = m.plan(prefix, mask, None, V, heads=heads, max_prefix=ctx, dtype=dtype,
                   tuning=WsTuning(part_bits=bits, **over))
        d = p.detail
        assert d.partials[0].dtype == (dtype if bits == 16 else torch.float32)
        assert d.kernel == kernel and d.fused == (kernel == "cuda" and kind == -1), (d.kernel, d.fused)
        assert (d.merger is None) == (kind >= 0)
        if d.merger is not None:
            assert d.merger.name.endswith("_p16") == (bits == 16), d.merger.name
        outs[bits] = m.run(q, kv, p, 0.07).clone()
        assert torch.equal(m.run(q, kv, p, 0.07), outs[bits])
        err = float((outs[bits].float() - ref.float()).norm() / ref.float().norm())
        assert err < TOL[dtype], f"part_bits {bits}: rel err {err:.2e}"
    err = float((outs[16].float() - outs[32].float()).norm() / outs[32].float().norm())
    assert err < TOL[dtype], f"16-bit vs fp32 partials: rel err {err:.2e}"


PORTABLE_CASES = [  # ctx, budget, shape, heads, dtype (R <= 16: the sm_120 tiling's rows limit); few: each compiles
    (63, 8, "fork", 8, torch.float16),
    (1000, 8, "lopsided", 8, torch.bfloat16),
    (4097, 15, "chain", 64, torch.bfloat16),
]


@gpu
@pytest.mark.parametrize("build", ["sm_120", "sm_80"])
@pytest.mark.parametrize("ctx,budget,shape,heads,dtype", PORTABLE_CASES)
def test_portable_build_matches_reference(build, ctx, budget, shape, heads, dtype):
    """split's portable build (the target's tiling, its PTX JIT-compiled by the driver for this GPU) vs the fp32
    reference, on a host plan and on a device plan replayed in a CUDA graph at a shorter live length."""
    from ddprobe.engine.kernels import portable

    q, kv, mask = make_inputs(ctx, budget, shape, heads, dtype)
    ref = reference.run(q, kv, reference.plan(ctx, mask, None, V), 0.0722)
    p = portable.plan(ctx, mask, V, build=build, heads=heads, dtype=dtype)
    meta: dict = {}
    out = portable.run(q, kv, p, 0.0722, meta=meta)
    assert torch.isfinite(out).all(), "NaN/inf in output: a poisoned row was read"
    err = float((out.float() - ref.float()).norm() / ref.float().norm())
    assert err < TOL[dtype], f"{build} ctx={ctx} H={heads}: rel err {err:.2e}"
    assert meta["prefix"]["mma_sync"] > 0 and meta["prefix"]["wgmma"] == 0
    assert meta["prefix"]["shared"] <= portable.split.ARCHS[portable.BUILDS[build].tiling].smem
    bound = ctx + 500
    pt = torch.full((1,), bound, dtype=torch.int32, device="cuda")
    big = torch.full((bound + budget + 1 + 64, V + PE), float("nan"), device="cuda", dtype=dtype)
    big[:ctx + budget + 1] = kv[:ctx + budget + 1]  # the live rows; everything past them NaN
    dp = portable.plan(pt, mask, V, build=build, heads=heads, dtype=dtype, max_prefix=bound)
    portable.run(q, big, dp, 0.0722)  # compiled and loaded before the capture (its output is not checked)
    pt.fill_(ctx)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = portable.run(q, big, dp, 0.0722)
    graph.replay()
    torch.cuda.synchronize()
    err = float((got.float() - ref.float()).norm() / ref.float().norm())
    assert err < TOL[dtype], f"{build} device plan replayed at {ctx} of {bound}: rel err {err:.2e}"


@gpu
def test_portable_build_bad_input_is_one_line():
    from ddprobe.engine.kernels import portable

    mask = shape_mask("chain", 32, "cuda")  # R = 33: more rows than the sm_120 tiling takes
    with pytest.raises(portable.PortableUnavailable) as e:
        portable.plan(100, mask, V, build="sm_120", heads=8)
    assert "\n" not in str(e.value) and "sm_120" in str(e.value)
    with pytest.raises(ValueError, match="unknown portable build"):
        portable.plan(100, mask, V, build="sm_75", heads=8)


# ---- flashmla: FlashMLA's dense decode as the chain's verify path (issue 61) ------------------------------------
def flashmla(test):
    """An H100/H200 test with FlashMLA installed (benchmarks/peers_bundle.sh carries it to the GPU machine)."""
    try:
        import flash_mla  # noqa: F401
        why = None
    except Exception as e:  # noqa: BLE001
        why = f"flash_mla does not import ({type(e).__name__}): pip install 'ddprobe[peers]'"
    return gpu(pytest.mark.skipif(why is not None, reason=why or "")(test))


def chain_inputs(ctx, budget, heads, seed=0):
    """q and a cache of whole 64-row pages: rows past prefix + R inside the last page random (a read of them shows
    as an error against the reference), the pages after it NaN."""
    from ddprobe.engine.kernels.flashmla import PAGE

    g = torch.Generator().manual_seed(seed + ctx * 7 + budget * 3 + heads)
    r = budget + 1
    pages = -(-(ctx + r) // PAGE)
    q = torch.randn(r, heads, V + PE, generator=g).to(torch.bfloat16).cuda()
    kv = torch.full(((pages + 2) * PAGE, V + PE), float("nan"))
    kv[: pages * PAGE] = torch.randn(pages * PAGE, V + PE, generator=g)
    return q, kv.to(torch.bfloat16).cuda(), shape_mask("chain", budget, "cuda")


@flashmla
@pytest.mark.parametrize("ctx,budget,heads", [(0, 7, 8), (1, 0, 8), (63, 3, 8), (1000, 7, 8), (4097, 0, 64),
                                              (33000, 7, 8), (20000, 5, 16), (5000, 7, 64)])
def test_flashmla_chain_matches_reference(ctx, budget, heads):
    """FlashMLA over a chain's causal rows (and plain decode, budget 0) equals the fp32 reference in bf16."""
    q, kv, mask = chain_inputs(ctx, budget, heads)
    m = get_path("flashmla")
    p = m.plan(ctx, mask, None, V, heads=heads)
    out = m.run(q, kv, p, 0.0722)
    ref = reference.run(q, kv, reference.plan(ctx, mask, None, V), 0.0722)
    assert out.shape == (budget + 1, heads, V) and torch.isfinite(out).all()
    err = float((out.float() - ref.float()).norm() / ref.float().norm())
    assert err < TOL[torch.bfloat16], f"ctx={ctx} B={budget} H={heads}: rel err {err:.2e}"


@flashmla
def test_flashmla_refuses_a_tree_and_the_engine_refuses_ddtree_on_it():
    """A tree mask (not causal) is one line at plan time; the engine's DDTree step on the path is refused before
    anything is built, and its chain runs."""
    from ddprobe.probes.backends.base import BackendError
    from ddprobe.probes.backends.engine import EngineBackend

    q, kv, _ = chain_inputs(100, 8, 8)
    with pytest.raises(ValueError, match="causal masks only"):
        get_path("flashmla").plan(100, shape_mask("lopsided", 8, "cuda"), None, V)
    with pytest.raises(BackendError, match="causal masks only"):
        EngineBackend("k2", "flashmla", budget=8, device="cuda", dtype="bf16", heads=8, max_ctx=2048, weights="random")
    be = EngineBackend("k2", "flashmla", budget=7, device="cuda", dtype="bf16", heads=8, max_ctx=2048,
                       weights="random", tree="chain")
    assert be.tree_shape == "chain" and be.engine.runner.new_cache(1000).capacity % 64 == 0


@flashmla
def test_flashmla_device_plan_replays_one_graph_at_changing_lengths():
    """A device plan captured once (refresh + run, as the engine's step records them) replays at prefix lengths
    from 0 to its bound, each equal to the reference at that length: the split schedule follows the length."""
    from ddprobe.engine.kernels.flashmla import PAGE

    max_prefix, budget, heads = 20000, 7, 8
    r = budget + 1
    m = get_path("flashmla")
    q, kv, mask = chain_inputs(max_prefix, budget, heads)
    prefix_t = torch.zeros(1, dtype=torch.int32, device="cuda")
    p = m.plan(prefix_t, mask, None, V, heads=heads, max_prefix=max_prefix)
    m.refresh(p)
    m.run(q, kv, p, 0.0722)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        m.refresh(p)
        out = m.run(q, kv, p, 0.0722)
        out2 = m.run(q, kv, p, 0.0722)  # a second layer reuses the step's schedule
    rows = torch.randn(kv.shape[0], V + PE, device="cuda").to(torch.bfloat16)
    for n in (0, 1, 63, 64, 1000, 4097, 12345, max_prefix):
        prefix_t.fill_(n)
        live = -(-(n + r) // PAGE) * PAGE
        kv.fill_(float("nan"))
        kv[:live] = rows[:live]
        g.replay()
        ref = reference.run(q, kv, reference.plan(n, mask, None, V), 0.0722)
        for o in (out, out2):
            assert torch.isfinite(o).all(), f"prefix {n}: NaN"
            err = float((o.float() - ref.float()).norm() / ref.float().norm())
            assert err < TOL[torch.bfloat16], f"prefix {n}: rel err {err:.2e}"


@flashmla
def test_engine_chain_on_flashmla_decodes_as_plain_greedy():
    """The engine's chain on FlashMLA (k2 widths, 2 layers, bf16, CUDA graphs) commits the tokens plain greedy
    decoding on FlashMLA gives (greedy speculative decoding reproduces greedy decoding)."""
    from ddprobe.physics.presets import ModelConfig
    from ddprobe.engine.generate import Engine

    cfg = ModelConfig.from_name("k2", heads=8, num_layers=2, feature_layers=(0, 1), max_ctx=4096)
    eng = Engine(cfg, attn="flashmla", budget=7, device="cuda", dtype=torch.bfloat16, graphs=True, seed=0)
    eng.tree_shape = "chain"
    prompt = list(range(1, 1501))
    spec = eng.generate(prompt, max_new_tokens=24)
    plain = eng.greedy_reference(prompt, 24)
    assert spec.tokens[:24] == plain
    assert all(s.graphs for s in spec.steps)
