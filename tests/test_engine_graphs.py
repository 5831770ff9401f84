"""Static decode steps (what CUDA graphs replay) against the eager loop, on CPU.

graphs=True on CPU runs the same fixed-shape step functions a GPU captures (graphs.StaticStep, run by
the host-tree and device-tree strategies of steps.py:
device plans that read the prefix length from a tensor, padded R rows, permuting commit), so
greedy tokens must be identical to the eager engine and verify logits equal within tolerance, at
budgets 1, 8 and 32 on both KV layouts, with the tree built and walked on the device (the default
at temperature 0: tree_device.py, one read back per step) and on the host (device_tree=False, and
sampling); the kernels' device plans are tested in test_kernels.py.
"""
from __future__ import annotations

import textwrap

import pytest
import torch

from ddprobe.engine import Engine
from ddprobe.engine.tree import build_tree, tree_from_topk

PROMPT = [int(t) for t in torch.randint(0, 256, (20,), generator=torch.Generator().manual_seed(5))]
N_NEW = 96


def engine(layout: str, budget: int, graphs: bool, **kw) -> Engine:
    kw.setdefault("poison", True)
    return Engine("tiny", kv_layout=layout, budget=budget, dtype=torch.float64, seed=0, max_ctx=512,
                  shuffle_slots=layout == "paged", graphs=graphs, **kw)


def recording(eng: Engine) -> list:
    """Keep every verify's logits (the target's own output, recorded on the way out)."""
    seen, logits = [], eng.target.logits

    def record(hidden):
        out = logits(hidden)
        seen.append(out.detach().clone())
        return out

    eng.target.logits = record
    return seen


def oracle(seq: list[int], num_draft: int, vocab: int):
    """Drafts that put the greedy continuation at rank 0, 1 or 3, or nowhere: every accepted depth."""

    def propose(ctx_len: int, bonus: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(ctx_len)
        logits = 3 * torch.randn(num_draft, vocab, generator=g, dtype=torch.float64)
        for d in range(num_draft):
            pos, rank = ctx_len + 1 + d, [0, 0, 1, 3, -1][(ctx_len + d) % 5]
            if pos < len(seq) and rank >= 0:
                order = logits[d].argsort(descending=True)
                true, other = seq[pos], int(order[rank])
                logits[d, true], logits[d, other] = logits[d, other].clone(), logits[d, true].clone()
        return torch.log_softmax(logits, dim=-1)

    return propose


@pytest.fixture(scope="module")
def greedy() -> list[int]:
    return engine("paged", 8, False).greedy_reference(PROMPT, N_NEW)


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
@pytest.mark.parametrize("budget", [1, 8, 32])
def test_static_step_equals_eager(greedy, layout, budget):
    runs = {}
    for graphs, device_tree in ((False, True), (True, True), (True, False)):
        eng = engine(layout, budget, graphs, device_tree=device_tree)
        seen = recording(eng)
        res = eng.generate(PROMPT, N_NEW, proposer=oracle(PROMPT + greedy, eng.num_draft, eng.config.target.vocab_size))
        runs[graphs, device_tree] = (res, seen)
    eager, le = runs[False, True]
    assert eager.tokens == greedy and not eager.steps[0].graphs and eager.steps[0].d2h is None
    for device_tree in (True, False):
        static, ls = runs[True, device_tree]
        assert static.tokens == greedy
        assert [(s.tree_size, s.commit_len) for s in static.steps] == [(s.tree_size, s.commit_len) for s in eager.steps]
        assert max(s.accepted_depth for s in static.steps) >= (1 if budget == 1 else 3)
        assert all(s.graphs and s.host_ms is not None for s in static.steps)
        assert {s.d2h for s in static.steps} == {1 if device_tree else 2}
        assert len(le) == len(ls)  # prefill chunks and verify steps, in order
        for a, b in zip(le, ls):  # the static verify runs R = budget + 1 rows: compare the tree's rows
            b = b[: a.shape[0]]
            assert (a - b).abs().max() <= 1e-6 * a.abs().max(), "verify logits differ beyond fp32 attention rounding"


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_static_drafter_and_chain_trees(layout):
    """The real drafter (its static forward over the whole capacity, masked) and chain trees of
    min(B, L) nodes padded to B + 1 rows: same tokens and the same trees (commit lengths)."""
    for kw in ({"budget": 8}, {"budget": 12, "tree_shape": "chain"}):
        a = engine(layout, graphs=False, **kw).generate(PROMPT, 48)
        b = engine(layout, graphs=True, **kw).generate(PROMPT, 48)
        assert a.tokens == b.tokens
        assert [(s.tree_size, s.commit_len) for s in a.steps] == [(s.tree_size, s.commit_len) for s in b.steps]


def test_static_state_is_reused_and_resized():
    eng = engine("contiguous", 8, True)
    info = eng.warmup(capacity=80)
    assert info["what"] == "first step" and info["warmup_s"] > 0 and info["capacity"] == 80
    st = eng.runner.static
    first = eng.generate(PROMPT, 30)  # 20 + 30 + 9 rows fit in 80
    assert eng.runner.static is st and first.steps[0].captured == ""  # same buffers, nothing new
    assert eng.generate(PROMPT, 30).tokens == first.tokens  # a reused state starts clean
    longer = eng.generate(PROMPT, 60)  # 20 + 60 + 9 > 80: a bigger state
    assert eng.runner.static is not st and eng.runner.static.capacity >= 89
    assert longer.tokens[:30] == first.tokens


def test_changed_settings_give_a_new_runner_and_release_frees_the_step():
    """The runner is built for the engine's step plan (spec.StepSpec): a changed setting gets a new
    one (here the host tree instead of the device tree, same tokens); release() drops the static step."""
    eng = engine("paged", 8, True)
    a = eng.generate(PROMPT, 24)
    r = eng.runner
    assert {s.d2h for s in a.steps} == {1} and eng.runner is r and r.static is not None
    eng.device_tree = False
    b = eng.generate(PROMPT, 24)
    assert eng.runner is not r and {s.d2h for s in b.steps} == {2} and b.tokens == a.tokens
    eng.release()
    assert eng.runner.static is None
    c = eng.generate(PROMPT, 24)
    assert c.tokens == a.tokens and c.steps[0].graphs and eng.runner.static is not None


def test_sampling_through_the_static_step():
    a = engine("paged", 8, False).generate(PROMPT, 30, temperature=1.0, seed=3)
    b = engine("paged", 8, True).generate(PROMPT, 30, temperature=1.0, seed=3)
    assert a.tokens == b.tokens  # same generator draws, same logits
    assert {s.d2h for s in b.steps} == {2}  # sampling keeps the tree and the walk on the host


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_device_tree_state_and_streaming(layout):
    """Device tree: the host's counters follow the device (committed, drafter context), a reused
    state starts clean, streaming sees every step's tokens, and a second request equals the first."""
    eng = engine(layout, 8, True)
    chunks = []
    res = eng.generate(PROMPT, 40, on_tokens=lambda toks, size: chunks.append(list(toks)))
    st = eng.runner.static
    assert sum(chunks, []) == res.tokens[:sum(map(len, chunks))] and len(chunks) == len(res.steps) + 1
    assert st.kv.committed == len(PROMPT) + sum(s.commit_len for s in res.steps) and st.dctx.n == st.kv.committed
    assert eng.generate(PROMPT, 40).tokens == res.tokens
    assert res.tokens == engine(layout, 8, False).generate(PROMPT, 40).tokens


def test_tree_from_topk_is_build_tree():
    g = torch.Generator().manual_seed(2)
    for budget, shape in ((8, "ddtree"), (32, "ddtree"), (5, "chain")):
        logp = torch.log_softmax(torch.randn(7, 256, generator=g, dtype=torch.float64), -1)
        k = 1 if shape == "chain" else budget
        vals, idx = torch.topk(logp, k, dim=-1)
        assert tree_from_topk(vals, idx, budget, 42, shape) == build_tree(logp, budget, 42, shape)


HOST_OPS = ("aten.lift_fresh", "aten._local_scalar_dense", "aten.nonzero", "aten.masked_select", "aten.item")


def Seen():
    """A dispatch mode that records every aten op run under it (``.ops``): what a CUDA graph would record."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    return _Seen()


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_step_functions_never_touch_the_host(layout):
    """What a CUDA graph records must not read from or write to the host: no tensor made from
    Python data (``x[i] = 0`` copies from the host: capture refuses it), no item() / nonzero()."""
    for budget in (1, 8):
        eng = engine(layout, budget, True)
        eng.generate(PROMPT, 8)
        st = eng.runner.static
        st.benign_inputs()
        for name in ("draft", "tree", "unpack", "verify", "walk", "commit"):
            with torch.no_grad(), Seen() as seen:
                st.run(name)
            assert len(seen.ops) > 3  # the mode saw the function
            assert not seen.ops & set(HOST_OPS), (name, seen.ops & set(HOST_OPS))


SCRIPT = textwrap.dedent("""
    import torch
    from ddprobe.engine import Engine
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: the interpreter (run_triton_script sets it)
    prompt = [5, 17, 42, 9, 77, 3]
    ref = Engine("tiny", dtype=torch.float32, device=dev, max_ctx=128).greedy_reference(prompt, 10)
    for attn in ("paged", "split"):
        eng = Engine("tiny", attn=attn, budget=4, dtype=torch.float32, device=dev, poison=True, shuffle_slots=True,
                     max_ctx=128, graphs=True)
        assert eng.generate(prompt, 10).tokens == ref, attn
    print("ok")
""")


def test_triton_paths_through_the_static_step(run_triton_script):
    """paged and split with device plans inside the engine's static step, greedy tokens equal to the plain
    greedy reference's (CPU: the interpreter, in a child process so the switch stays there; CUDA: the kernels)."""
    run_triton_script(SCRIPT)


def test_compile_needs_the_cuda_graph_step():
    with pytest.raises(ValueError, match="compile fuses the CUDA-graph step"):
        Engine("tiny", device="cpu", compile=True)
    assert not Engine("tiny", device="cpu", compile=False, max_ctx=64).fuse


def test_a_plan_that_fell_back_is_said_and_recorded():
    """A held step whose verify plan fell back to the fp32 reference (split on a GPU its table does not fit: the
    plan's ``fallback``, split.py) is named by the engine and said on the warm-up line, never hidden."""
    eng = Engine("tiny", graphs=True, max_ctx=64)
    assert eng.warmup(capacity=64)["what"] == "first step" and eng.attn_fallback is None and not eng.compiled
    plan = eng.runner.static.plan
    plan.extra["fallback"] = "the split path on sm_120 takes at most 16 new rows (its tree tile), got 17"
    assert eng.attn_fallback == plan.extra["fallback"]
    assert eng.warmup(capacity=64)["what"] == ("first step (attention: the fp32 reference runs, the split path on "
                                               "sm_120 takes at most 16 new rows (its tree tile), got 17)")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_compile_off_replays_the_same_tokens_without_torch_compile():
    """commit's default (compile off): CUDA graphs of the plain step functions, the same greedy tokens as the
    fused step and the eager reference; its warm-up says it compiled only kernels. Dynamo's caches are emptied
    first: every compiled engine is a new entry of the same step functions, and this file's earlier tests compile
    enough of them to reach dynamo's recompile limit (8) in one process, where the engine gives the compile up and
    says so (seen on the H200, 2026-12-04), which is not what this test is about."""
    torch._dynamo.reset()
    kw = dict(attn="split", budget=8, dtype=torch.float32, device="cuda", max_ctx=256, graphs=True)
    off, on = Engine("tiny", compile=False, **kw), Engine("tiny", **kw)
    assert not off.fuse and on.fuse
    assert off.warmup(capacity=256)["what"] == "kernels + capture"
    assert on.warmup(capacity=256)["what"] == "compile + capture"
    ref = Engine("tiny", dtype=torch.float32, device="cuda", max_ctx=256).greedy_reference(PROMPT, 40)
    assert off.generate(PROMPT, 40).tokens == ref == on.generate(PROMPT, 40).tokens
