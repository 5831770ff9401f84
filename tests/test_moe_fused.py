"""The fused Triton MoE (engine/kernels/moe_fused.py) against the fp32 plain-PyTorch reference.

On a machine without a GPU the kernels run under Triton's interpreter: the tests marked ``interpreter`` run in
one child pytest with TRITON_INTERPRET=1 set for that child alone (tests/conftest.py), each reported by its id. On CUDA the same
tests run on the GPU, plus a CUDA-graph capture and a torch.compile of the MoE layer (skipped elsewhere).
Tolerances, ||out - ref|| / ||ref|| against fp32 arithmetic on the same weights: fp32 1e-5 (exact dots),
bf16 1.5e-2 (bf16 operands, bf16 output).
"""
from __future__ import annotations

import pytest
import torch

from ddprobe.physics.presets import ModelConfig
from ddprobe.engine.moe import MoE, Experts, experts_fused, experts_reference, fused_moe_agrees, fused_moe_works

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernels = pytest.mark.interpreter  # without a GPU: in the interpreter child (tests/conftest.py)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1.5e-2}


def needs_cuda(test):
    """A GPU test (marker ``gpu``): CUDA graphs and torch.compile of the fused MoE; skipped elsewhere."""
    skip = pytest.mark.skipif(DEV != "cuda", reason="CUDA graphs and torch.compile of the fused MoE need a GPU")
    return pytest.mark.gpu(skip(test))


def experts(n, dim, inter, dtype, seed) -> Experts:
    g = torch.Generator().manual_seed(seed)
    e = Experts(n, dim, inter)
    with torch.no_grad():
        e.w13.copy_(torch.randn(e.w13.shape, generator=g) / dim ** 0.5)
        e.w2.copy_(torch.randn(e.w2.shape, generator=g) / inter ** 0.5)
    return e.to(DEV, dtype)


def routing(r, n, k, seed, hi=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random distinct ids per row among the first ``hi`` experts (the rest untouched), weights summing to 2.5."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(hi or n, generator=g)[:k] for _ in range(r)])
    w = torch.rand(r, k, generator=g) + 0.1
    return ids.to(DEV), (w / w.sum(-1, keepdim=True) * 2.5).to(DEV)


def rel(out, ref) -> float:
    assert torch.isfinite(out).all()
    return float((out.detach().float() - ref.detach()).norm() / ref.detach().norm())


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k,r,hi", [(6, 3, 9, None), (8, 8, 9, None), (6, 1, 1, None), (12, 4, 13, 6),
                                      (48, 8, 9, None), (5, 2, 64, None)])
def test_fused_experts_equal_the_reference(n, k, r, hi, dtype):
    from ddprobe.engine.kernels.moe_fused import moe_experts

    e = experts(n, 32, 48, dtype, seed=n * 10 + k)  # inter 48: a partial BN tile
    x = torch.randn(r, 32, generator=torch.Generator().manual_seed(r)).to(DEV, dtype)
    ids, w = routing(r, n, k, seed=r + n, hi=hi)
    ref = experts_reference(e, x, ids, w)
    slots = moe_experts(x, ids, w, e.w13, e.w2)
    assert slots.dtype == torch.float32 and slots.shape == (r, k, 32)
    assert rel(experts_fused(e, x, ids, w), ref) < TOL[dtype]
    assert torch.equal(slots, moe_experts(x, ids, w, e.w13, e.w2))  # no atomics: the same bits every run


@needs_kernels
def test_neighbouring_experts_in_one_row_and_untouched_experts():
    from ddprobe.engine.kernels.moe_fused import moe_experts

    e = experts(10, 32, 32, torch.float32, seed=4)
    ids = torch.tensor([[3, 4, 5], [4, 3, 2], [5, 6, 4], [2, 3, 4], [6, 5, 3]], device=DEV)  # 0, 1, 7-9 untouched
    w = torch.rand(5, 3, generator=torch.Generator().manual_seed(1)).to(DEV)
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(2)).to(DEV)
    ref = experts_reference(e, x, ids, w)
    assert rel(moe_experts(x, ids, w, e.w13, e.w2).sum(1), ref) < TOL[torch.float32]
    with torch.no_grad():  # NaN weights in the untouched experts: read, they would poison the output
        e.w13[[0, 1, 7, 8, 9]] = float("nan")
        e.w2[[0, 1, 7, 8, 9]] = float("nan")
    assert rel(moe_experts(x, ids, w, e.w13, e.w2).sum(1), ref) < TOL[torch.float32]


@needs_kernels
@pytest.mark.parametrize("gate_up,down", [((16, 16, 4, 2), (16, 32, 4, 2)), ((32, 64, 4, 3), (64, 16, 8, 1))])
def test_tile_shapes_do_not_change_the_result(gate_up, down):
    from ddprobe.engine.kernels.moe_fused import launch

    e = experts(7, 64, 80, torch.float32, seed=9)  # several K and N tiles, partial ones too
    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(3)).to(DEV)
    ids, w = routing(9, 7, 3, seed=5)
    ref = experts_reference(e, x, ids, w)
    assert rel(launch(x, ids, w, e.w13, e.w2, gate_up, down).sum(1), ref) < TOL[torch.float32]


@needs_kernels
@pytest.mark.parametrize("r,n,k", [(1, 6, 3), (9, 48, 8), (13, 12, 12), (64, 5, 1)])
def test_fused_routing_equals_sigmoid_top_k(r, n, k):
    from ddprobe.engine.kernels.moe_fused import moe_route

    wide = torch.randn(r, n + 7, generator=torch.Generator().manual_seed(r * n)).to(DEV)
    for logits in (wide[:, :n].contiguous(), wide[:, 3:3 + n]):  # a slice of a joined GEMM's output: a row stride
        ids, w = moe_route(logits, k, 2.827)
        want_w, want_ids = torch.topk(torch.sigmoid(logits), k, dim=-1)
        assert torch.equal(ids, want_ids)
        assert torch.allclose(w, want_w / want_w.sum(-1, keepdim=True) * 2.827, rtol=1e-5, atol=0)


@needs_kernels
def test_too_many_rows_are_refused():
    from ddprobe.engine.kernels.moe_fused import launch

    e = experts(4, 32, 32, torch.float32, seed=1)
    ids, w = routing(65, 4, 2, seed=1)
    with pytest.raises(ValueError, match="at most 64 rows, got 65"):
        launch(torch.randn(65, 32, device=DEV), ids, w, e.w13, e.w2)


def moe(dtype) -> MoE:
    m = MoE(32, Experts(8, 32, 48), 3, shared_inter=16, routed_scaling=2.5)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return m.to(DEV, dtype)


@needs_kernels
@pytest.mark.parametrize("rows", [9, 70])  # 70: more than the fused path takes, so grouped / batched
def test_moe_layer_through_the_fused_path(rows):
    m = moe(torch.float32)
    m.experts.kernel = "fused"  # as chosen on CUDA; on the CPU this runs the interpreter
    x = torch.randn(rows, 32, generator=torch.Generator().manual_seed(rows)).to(DEV)
    assert rel(m(x), m.reference(x)) < TOL[torch.float32]


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_choice_check_passes_where_the_kernels_run(dtype):
    assert fused_moe_agrees(torch.device(DEV), dtype)  # what fused_moe_works runs (and caches) on CUDA


def test_the_choice_is_explicit():
    """Off CUDA the fused path is never chosen (the interpreter is for tests); on a GPU where the kernels run, it is."""
    m = moe(torch.float32)
    if DEV == "cpu":
        assert not fused_moe_works(torch.device("cpu"), torch.float32)
        assert m.experts.kernel in ("grouped", "batched")
    else:
        assert m.experts.kernel == "fused"


@needs_cuda
def test_fused_moe_is_chosen_and_captures_in_a_cuda_graph():
    m = moe(torch.bfloat16)
    assert m.experts.kernel == "fused"
    x = torch.randn(9, 32, generator=torch.Generator().manual_seed(11)).to(DEV, torch.bfloat16)
    eager = m(x)
    assert rel(eager, m.reference(x)) < TOL[torch.bfloat16]
    static = x.clone()
    m(static)  # warm-up (compiles the kernels) before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = m(static)
    fresh = torch.randn(9, 32, generator=torch.Generator().manual_seed(12)).to(DEV, torch.bfloat16)
    static.copy_(fresh)
    graph.replay()
    assert rel(out, m(fresh).float()) < 1e-2  # cuBLAS may pick another router GEMM under capture
    compiled = torch.compile(m, fullgraph=True, dynamic=False)  # the custom ops are opaque to dynamo
    with torch.inference_mode():  # as the engine runs (the custom ops have no backward)
        assert rel(compiled(fresh), m.reference(fresh)) < TOL[torch.bfloat16]


@needs_kernels
def test_a_row_with_a_nan_logit_gets_nan_weights_and_valid_ids():
    """As torch's path shows a NaN input as a NaN output, the fused routing gives the row NaN weights (so its
    output is NaN, not a silent value) and ids that are still experts (no slot left unwritten)."""
    from ddprobe.engine.kernels.moe_fused import moe_experts, moe_route

    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(3))
    logits[1, 2] = float("nan")
    logits[3] = float("nan")
    ids, w = moe_route(logits.to(DEV), 3, 2.0)
    assert ((ids >= 0) & (ids < 6)).all()
    assert torch.isnan(w[[1, 3]]).all() and torch.isfinite(w[[0, 2]]).all()
    e = experts(6, 32, 48, torch.float32, seed=2)
    y = moe_experts(torch.randn(4, 32, device=DEV), ids, w, e.w13, e.w2).sum(1)
    assert torch.isnan(y[[1, 3]]).all() and torch.isfinite(y[[0, 2]]).all()


@needs_cuda
@pytest.mark.parametrize("rows", [9, 64])
def test_fused_experts_at_the_k2_shapes_equal_the_reference(rows):
    """The shipped bf16 tiles at the engine's own shapes (48 experts, hidden 1024, width 2048, top-8): many K and
    N tiles of both GEMMs, the widest row tile at 64 rows."""
    t = ModelConfig.from_name("k2").target
    e = experts(t.n_experts, t.hidden_size, t.moe_intermediate_size, torch.bfloat16, seed=rows)
    x = torch.randn(rows, t.hidden_size, generator=torch.Generator().manual_seed(rows)).to(DEV, torch.bfloat16)
    ids, w = routing(rows, t.n_experts, t.experts_per_tok, seed=rows)
    assert rel(experts_fused(e, x, ids, w), experts_reference(e, x, ids, w)) < TOL[torch.bfloat16]
