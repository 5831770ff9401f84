"""The DDTree build in one Triton program (engine/kernels/tree_build.py, through tree_device.build_tree_fused)
against its reference, tree_device.build_tree_device (plain torch), and the host's tree.build_tree: the same rows,
tokens, parents, depths, scores (float64, compared exactly) and ancestor mask, on the random distributions of
test_engine_tree_device.py (exact ties, bf16-rounded log-probs, vocabularies smaller than the budget), budgets 1
to 63, the chain shape, and into the buffers of an existing DeviceTree.

On a machine without a GPU the kernel runs under Triton's interpreter: the tests marked ``interpreter`` run in one
child pytest with TRITON_INTERPRET=1 set for that child alone (tests/conftest.py), each reported by its id; on CUDA
the same tests run on the GPU.
"""
from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")

from test_engine_tree_device import assert_same, random_cases  # noqa: E402  (the shared random trees)

from ddprobe.engine.tree import build_tree
from ddprobe.engine.tree_device import build_tree_device, build_tree_fused

DEV = "cuda" if torch.cuda.is_available() else "cpu"
CHILD = DEV == "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_kernel = pytest.mark.interpreter  # without a GPU: in the interpreter child (tests/conftest.py)


def both(logp: torch.Tensor, budget: int, bonus: int, shape: str = "ddtree"):
    k = 1 if shape == "chain" else min(budget, logp.shape[1])
    vals, idx = torch.topk(logp.double(), k, dim=-1)
    vals, idx = vals.to(DEV), idx.to(DEV)
    return (build_tree(logp, budget, bonus, shape), build_tree_device(vals, idx, budget, torch.tensor([bonus], device=DEV)),
            build_tree_fused(vals, idx, budget, torch.tensor([bonus], device=DEV)))


def same_tree(a, b) -> None:
    for f in ("tokens", "parents", "depths", "mask", "valid", "scores", "size"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), f


@needs_kernel
@pytest.mark.parametrize("budget", [1, 2, 8, 13])
def test_fused_build_equals_the_reference_and_the_host(budget):
    ties = 0
    for seed, logp in random_cases(24):
        want, ref, got = both(logp, budget, 42 + seed)
        same_tree(got, ref)
        assert_same(want, got if DEV == "cpu" else type(got)(*(t.cpu() for t in vars(got).values())), budget)
        ties += len(set(want.scores[1:])) < want.size
    if budget > 2:
        assert ties >= 3  # the tie rule was exercised


@needs_kernel
def test_fused_build_chain_deep_budget_and_out_buffers():
    g = torch.Generator().manual_seed(3)
    logp = torch.log_softmax(torch.randn(8, 64, generator=g, dtype=torch.float64), -1)
    for budget in (1, 5):
        same_tree(*both(logp, budget, 7, "chain")[1:])
    same_tree(*both(logp, 63, 9)[1:])  # 64 rows: the largest tree
    small = torch.log_softmax(torch.randn(2, 2, generator=g, dtype=torch.float64), -1)
    ref, got = both(small, 8, 1)[1:]  # 6 prefixes for a budget of 8: the last rows invalid
    same_tree(got, ref)
    assert int(got.size) == 6 and not bool(got.valid[-1])
    vals, idx = torch.topk(logp, 8, dim=-1)
    out = build_tree_fused(vals.to(DEV), idx.to(DEV), 8, 3)
    again = build_tree_fused(vals.to(DEV), idx.to(DEV), 8, torch.tensor([3], device=DEV), out=out)
    assert again is out
    same_tree(out, build_tree_device(vals.to(DEV), idx.to(DEV), 8, 3))


@needs_kernel
def test_a_nan_log_prob_gives_the_reference_tree():
    """A NaN among the draft's log-probs (a broken drafter): the reference's amax returns NaN and no candidate ties
    it, so the tree stops there; the kernel's reductions skip NaN and must stop at the same pop."""
    g = torch.Generator().manual_seed(11)
    logp = torch.log_softmax(torch.randn(6, 32, generator=g, dtype=torch.float64), -1)
    sizes = []
    for row, col in ((0, 0), (0, 2), (1, 0), (2, 1), (5, 3)):
        vals, idx = torch.topk(logp, 8, dim=-1)
        vals[row, col] = float("nan")
        ref = build_tree_device(vals.to(DEV), idx.to(DEV), 8, 4)
        same_tree(build_tree_fused(vals.to(DEV), idx.to(DEV), 8, 4), ref)
        sizes.append(int(ref.size))
    assert sizes[0] == 0 and 0 < min(sizes[1:3]) < 8  # the NaN stopped the tree at the first pop, and mid-tree


def test_fused_build_refuses_bad_shapes_in_one_line():
    vals = torch.zeros(4, 3, dtype=torch.float64)
    idx = torch.zeros(4, 3, dtype=torch.int64)
    for budget, v, i, what in ((0, vals, idx, "budget"), (64, vals, idx, "rows"), (8, vals, idx[:, :2], "shape")):
        with pytest.raises(ValueError, match=what) as e:
            build_tree_fused(v, i, budget, 1)
        assert "\n" not in str(e.value)


@pytest.mark.skipif(CHILD, reason="compiles in the parent (no GPU needed)")
@pytest.mark.parametrize("rows", [2, 9, 64])
def test_the_kernel_compiles_for_sm90_with_runtime_depth_and_width(rows):
    """The interpreter runs Python, not the compiler: this compiles the kernel for sm_90 here (Triton ships ptxas),
    with the draft's depth L and width K as runtime integers. Triton turns an integer argument equal to 1 into a
    constant unless told not to, and ``L.to(...)`` on that constant failed on the H200 for a one-position draft;
    the kernel now declares L and K do_not_specialize, so every launch compiles this signature."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ddprobe.engine.kernels._common import next_pow2
    from ddprobe.engine.kernels.tree_build import _tree_build

    sig = {"vals_ptr": "*fp64", "idx_ptr": "*i64", "bonus_ptr": "*i64", "tok_ptr": "*i64", "par_ptr": "*i64",
           "dep_ptr": "*i64", "mask_ptr": "*i1", "valid_ptr": "*i1", "score_ptr": "*fp64", "size_ptr": "*i64",
           "L": "i32", "K": "i32", "R": "constexpr", "RP": "constexpr"}
    names = {a if isinstance(a, str) else _tree_build.arg_names[a] for a in _tree_build.do_not_specialize}
    assert {"L", "K"} <= names  # names or indices, by Triton version
    k = triton.compile(ASTSource(fn=_tree_build, signature=sig, constexprs={"R": rows, "RP": next_pow2(rows)}),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 1})
    assert len(k.asm["cubin"]) > 1000


@needs_kernel
def test_the_engine_checks_the_kernel_against_the_plain_build(monkeypatch):
    """The static step uses the kernel where ``fused_tree_works`` says it gives the plain build's tree on that
    device (checked once per shape, ties included); a kernel that differs in one field is refused."""
    from ddprobe.engine import tree_device

    assert tree_device._fused_tree_agrees(torch.device(DEV), 8, 8, 8)
    assert tree_device.fused_tree_works(torch.device("cpu"), 8, 8, 8) is False  # off CUDA: the plain build
    if DEV == "cuda":
        assert tree_device.fused_tree_works(torch.device(DEV), 8, 8, 8)
    real = tree_device.build_tree_fused

    def off_by_one(*a, **k):
        t = real(*a, **k)
        t.depths[-1] += 1
        return t
    monkeypatch.setattr(tree_device, "build_tree_fused", off_by_one)
    assert not tree_device._fused_tree_agrees(torch.device(DEV), 8, 8, 8)


@pytest.mark.skipif(CHILD, reason="no kernel runs: once in the parent")
def test_a_fallback_is_said_once_and_recorded(monkeypatch, recwarn):
    """Where the fused kernel was wanted (a CUDA device) and fails its check, fused_tree_fallback says why, warns
    once (a second query of the shape is answered from the cache, silently) and fused_tree_works is False; off
    CUDA the answer is no kernel, without a warning."""
    from ddprobe.engine import tree_device

    def no_triton(*_):
        raise ImportError("no Triton here")

    monkeypatch.setattr(tree_device, "_FUSED_WHY", {})
    monkeypatch.setattr(tree_device, "_fused_tree_agrees", no_triton)
    cuda = torch.device("cuda")
    assert tree_device.fused_tree_fallback(cuda, 8, 7, 8) == "ImportError: no Triton here"
    said = [str(w.message) for w in recwarn.list if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1 and "budget 8, draft [7, 8]" in said[0] and "plain device build" in said[0]
    assert tree_device.fused_tree_works(cuda, 8, 7, 8) is False
    monkeypatch.setattr(tree_device, "_fused_tree_agrees", lambda *_: False)
    assert tree_device.fused_tree_fallback(cuda, 4, 7, 4) == "its tree differs from the plain build's"
    assert tree_device.fused_tree_fallback(torch.device("cpu"), 8, 7, 8) == "not a CUDA device"
    assert len([w for w in recwarn.list if issubclass(w.category, RuntimeWarning)]) == 2  # one per failing shape
