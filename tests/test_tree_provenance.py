"""Where a tree's commits come from (issue 61): per step the sibling rank of every accepted node (0 = the spine),
the tree's own spine on the same picks, and the spine check (under greedy decoding a tree never accepts fewer tokens
than its own spine: fewer is a bug). The real engine on the CPU with the shipped tiny pair."""
import pytest
import torch

from ddprobe.engine import steps
from ddprobe.engine.records import provenance
from ddprobe.engine.tree import build_tree, path_ranks, sibling_ranks, spine_depth, walk
from ddprobe.probes.backends.engine import EngineBackend
from ddprobe.probes.commit import prompt_ids


def test_ranks_and_spine_by_hand():
    # depth 1: tokens 5 (p .6) then 6 (.3); depth 2: token 7 (.9) then 8. Budget 4: rows in pop order:
    # 1 = 5 (d1, rank 0), 2 = 5>7 (d2), 3 = 6 (d1, rank 1), 4 = 6>7 (d2)
    logp = torch.full((2, 10), -20.0)
    logp[0, 5], logp[0, 6], logp[1, 7], logp[1, 8] = (torch.tensor(x).log() for x in (0.6, 0.3, 0.9, 0.05))
    t = build_tree(logp, 4, bonus=1)
    assert t.tokens == (1, 5, 7, 6, 7) and t.parents == (-1, 0, 1, 0, 3)
    assert sibling_ranks(t) == (0, 0, 0, 1, 0)
    picks = [6, 0, 0, 7, 2]  # the target wants 6 after the root (a sibling), then 7
    path, nxt = walk(t, picks)
    assert path == [0, 3, 4] and nxt == 2 and path_ranks(t, path) == (1, 0)
    assert spine_depth(t, picks) == 0  # the spine's first token (5) is not the target's pick
    assert spine_depth(t, [5, 7, 3, 0, 0]) == 2 and walk(t, [5, 7, 3, 0, 0])[0] == [0, 1, 2]
    chain = build_tree(logp, 4, bonus=1, shape="chain")
    assert sibling_ranks(chain) == (0, 0, 0) and spine_depth(chain, [5, 7, 3]) == 2


@pytest.fixture(scope="module")
def tiny():
    return EngineBackend("tiny", "reference", budget=8, max_ctx=1024)


@pytest.mark.parametrize("shape, budget", [("ddtree", 8), ("chain", 7), ("ddtree", 2)])
def test_the_spine_check_holds_and_greedy_is_plain_greedy(tiny, shape, budget):
    """Both shapes reproduce plain greedy decoding token for token; the spine check finds nothing; a chain is its
    own spine (gain 1, no siblings); per-step depths and ranks add up to the commit length."""
    tiny.set_tree(shape, budget)
    for kind in ("predictable", "novel"):
        ids = prompt_ids(tiny, kind, 512)
        st = tiny.generate(ids, 48)
        assert st.tokens == tiny.engine.greedy_reference(ids, 48)
        e = st.extra
        assert e["tree"] == shape and e["budget"] == budget and e["spine_violations"] == 0
        assert e["spine_violation_first"] is None
        assert all(len(r) == d for r, d in zip(e["step_ranks"], e["step_depths"]))
        assert e["ran_commit_len"] == pytest.approx(1 + sum(e["step_depths"]) / len(e["step_depths"]))
        assert e["ran_commit_len"] >= e["spine_commit_len"]
        depths = e["step_depths"]
        assert e["cond_accept_per_pos"][0] == pytest.approx(sum(d > 0 for d in depths) / len(depths))
        if shape == "chain":
            assert e["sibling_share"] == 0 and e["gain_over_spine"] == 1.0


def test_novel_text_commits_from_siblings(tiny):
    tiny.set_tree("ddtree", 8)
    e = tiny.generate(prompt_ids(tiny, "novel", 512), 48).extra
    assert e["sibling_share"] > 0.2 and e["gain_over_spine"] > 1.1  # measured: 0.83 and 1.64x at 1k, 64 tokens


def test_a_broken_walk_is_caught(tiny, monkeypatch):
    """A walk that drops the last accepted node (state drift: the tree then accepts fewer than its own spine would)
    is what the spine check exists for: it fires, naming the first step and both counts."""
    def broken(tree, picks):
        path, nxt = walk(tree, picks)
        return (path[:-1], picks[path[-2]]) if len(path) > 1 else (path, nxt)

    monkeypatch.setattr(steps, "walk", broken)
    tiny.set_tree("ddtree", 8)
    e = tiny.generate(prompt_ids(tiny, "predictable", 512), 24).extra
    assert e["spine_violations"] > 0
    first = e["spine_violation_first"]
    assert first["step"] == 0 and first["tree_tokens"] < first["spine_tokens"]


def test_provenance_of_device_tree_steps_is_not_made_up():
    """Steps that carry no ranks (the tree on the device) give no figures rather than zeros."""
    from ddprobe.engine.records import StepRecord

    s = StepRecord(0, 10, 8, 3, 4, 0.0, 0.0, 0.0, 0.0)
    assert provenance([s], 7) == {}


def test_the_static_host_tree_step_records_the_same_provenance(tiny):
    """The static step with the host tree (what a GPU runs when sampling, here eagerly on the CPU) records the same
    ranks and spine depths as the eager oracle, step for step; the device tree records none."""
    from ddprobe.engine import weights
    from ddprobe.engine.generate import Engine

    ids = prompt_ids(tiny, "novel", 256)
    got = {}
    for graphs, device_tree in ((False, True), (True, False), (True, True)):
        eng = Engine("tiny", budget=8, graphs=graphs, device_tree=device_tree, max_ctx=512)
        weights.load_into(eng, "tiny")
        res = eng.generate(ids, 24)
        got[(graphs, device_tree)] = [(s.ranks, s.spine_depth) for s in res.steps]
    assert got[(True, False)] == got[(False, True)] and any(r and max(r) > 0 for r, _ in got[(False, True)])
    assert all(r is None and d is None for r, d in got[(True, True)])
