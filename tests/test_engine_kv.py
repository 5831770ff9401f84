"""KV cache layouts: page_size=1 pool with request-to-token table (in order / shuffled), contiguous
rows; commit semantics; NaN poisoning makes any read outside the plan fail loudly."""
from __future__ import annotations

import pytest
import torch

from ddprobe.engine import Engine, KVCache
from ddprobe.engine.kernels import get_path


def fill(cache: KVCache, idx: torch.Tensor, base: float) -> None:
    cache.buffer[:, idx] = base + idx.to(cache.buffer.dtype)[None, :, None]


def test_paged_in_order_commit_keeps_accepted_slots_and_frees_the_rest():
    c = KVCache(2, 16, 4, "paged", poison=True)
    w, slots = c.reserve(3)
    assert w.tolist() == [0, 1, 2] and slots.tolist() == [0, 1, 2]
    fill(c, w, 0.0)
    c.commit([0, 1, 2])
    w, slots = c.reserve(4)  # e.g. [bonus, 3 nodes]
    assert w.tolist() == [3, 4, 5, 6] and slots.tolist() == [0, 1, 2, 3, 4, 5, 6]
    fill(c, w, 0.0)
    c.commit([0, 2])  # root + node at reserved index 2
    assert c.committed == 5 and c.req_to_token[0, :5].tolist() == [0, 1, 2, 3, 5]
    assert torch.isnan(c.buffer[:, [4, 6]]).all() and not torch.isnan(c.buffer[:, [0, 1, 2, 3, 5]]).any()
    assert c.free_slots == 16 - 5
    w, _ = c.reserve(2)
    assert sorted(w.tolist()) == [4, 6]  # freed slots are reused first


def test_paged_shuffled_allocation_is_a_seeded_permutation():
    a = KVCache(1, 64, 4, "paged", shuffle=True, seed=3)
    b = KVCache(1, 64, 4, "paged", shuffle=True, seed=3)
    wa, _ = a.reserve(64)
    wb, _ = b.reserve(64)
    assert torch.equal(wa, wb) and sorted(wa.tolist()) == list(range(64)) and wa.tolist() != list(range(64))


def test_contiguous_commit_copies_accepted_rows_to_the_tail():
    c = KVCache(2, 16, 4, "contiguous", poison=True)
    w, slots = c.reserve(2)
    assert slots is None and w.tolist() == [0, 1]
    fill(c, w, 100.0)
    c.commit([0, 1])
    w, _ = c.reserve(5)
    assert w.tolist() == [2, 3, 4, 5, 6]
    fill(c, w, 100.0)
    c.commit([0, 2, 4])  # rows 2, 4, 6 -> rows 2, 3, 4
    assert c.committed == 5
    assert c.buffer[0, :5, 0].tolist() == [100.0, 101.0, 102.0, 104.0, 106.0]
    assert torch.isnan(c.buffer[:, 5:7]).all() and torch.isnan(c.buffer[:, 7:]).all()


def test_cache_errors():
    c = KVCache(1, 4, 4, "paged")
    with pytest.raises(ValueError, match="context beyond the cache"):
        c.reserve(5)
    c.reserve(2)
    with pytest.raises(RuntimeError, match="reserve"):
        c.reserve(1)
    with pytest.raises(ValueError, match="layout"):
        KVCache(1, 4, 4, "pages")


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_reading_outside_the_plan_gives_nan(layout):
    c = KVCache(1, 32, 8, layout, poison=True, shuffle=True, seed=1)
    w, slots = c.reserve(6)
    c.buffer[0, w] = torch.randn(6, 8)
    c.commit([0, 1, 2, 3, 4, 5])
    ref = get_path("reference")
    w, slots = c.reserve(2)
    c.buffer[0, w] = torch.randn(2, 8)
    q = torch.randn(2, 2, 8)
    good = ref.plan(6, torch.ones(2, 2, dtype=torch.bool).tril(), slots, v_dim=4)
    assert torch.isfinite(ref.run(q, c.layer(0), good, 0.3)).all()
    if layout == "paged":  # one column points at a never-written slot
        unused = sorted(set(range(32)) - set(slots.tolist()))[0]
        bad_slots = torch.cat([slots[:-1], torch.tensor([unused])])
        bad = ref.plan(6, torch.ones(2, 2, dtype=torch.bool).tril(), bad_slots, v_dim=4)
    else:  # a plan one column too long reads an unused row
        bad = ref.plan(7, torch.ones(2, 2, dtype=torch.bool).tril(), None, v_dim=4)
    assert torch.isnan(ref.run(q, c.layer(0), bad, 0.3)).any()


class OverreadPath:
    """A broken attention path that also reads the next cache row (must be caught by poison)."""

    name, layout = "overread", "contiguous"

    @staticmethod
    def plan(prefix_len, tree_mask, slots=None, v_dim=512):
        return get_path("reference").plan(prefix_len, tree_mask, slots, v_dim)

    @staticmethod
    def run(q, kv, p, sm_scale):
        out = get_path("reference").run(q, kv, p, sm_scale)
        return out + 0.0 * kv[p.num_cols].sum()


def test_engine_with_poison_fails_loudly_on_an_overreading_path():
    eng = Engine("tiny", kv_layout="contiguous", budget=4, poison=True, max_ctx=128)
    eng.path = OverreadPath
    with pytest.raises(RuntimeError, match="outside the plan"):
        eng.generate([1, 2, 3], 8)
    eng.poison = False  # without poison the bug is silent
    assert len(eng.generate([1, 2, 3], 8).tokens) == 8
