"""The DDTree decode loop, two ways: eager (host plans, shapes follow the tree) and static (the
buffers and device plan of a ``graphs.StaticStep``, replayed as CUDA graphs on a GPU).

Both take the state after prefill (committed prompt, first bonus) and return (tokens, steps).
One step: draft -> tree build -> verify -> walk + commit; phase times from ``clock.StepClock``.
The static loop at temperature 0 with ``eng.device_tree`` (the default) keeps the tree build and
the walk on the device and reads one buffer back per step (the committed tokens, their count);
sampling (and ``device_tree=False``) builds the tree and walks on the host, two reads per step.
The eager loop is the oracle the tests compare both with.
"""
from __future__ import annotations

import time

import torch

from .clock import StepClock
from .graphs import StaticStep, tree_from_topk
from .records import StepRecord
from .tree import build_tree, target_picks, walk


def _records(clock: StepClock, pending: list, graphs: bool, captured: str, capture_ms: float,
             d2h: int | None = None) -> list[StepRecord]:
    steps = []
    for i, (ctx_len, size, k, marks, host_ms) in enumerate(pending):
        d, t, v, c = clock.times_ms(marks)
        steps.append(StepRecord(step=i, context_len=ctx_len, tree_size=size, accepted_depth=k - 1, commit_len=k,
                                draft_ms=d, tree_ms=t, verify_ms=v, commit_ms=c, graphs=graphs,
                                captured=captured if i == 0 else "", capture_ms=capture_ms if i == 0 else 0.0,
                                host_ms=host_ms, d2h=d2h))
    return steps


def decode_eager(eng, kv, dctx, bonus: int, max_new_tokens: int, temperature: float, gen, proposer,
                 on_tokens=None):
    out, pending, clock = [bonus], [], StepClock(eng.device)
    if on_tokens is not None:  # streaming / cancellation hook: the prefill's token, then each step's
        on_tokens([bonus], 0)
    embed, head = eng.target.embed_tokens, eng.target.lm_head
    while len(out) < max_new_tokens:
        ctx_len = kv.committed
        m0 = clock.mark()
        if proposer is None:
            logp = eng.drafter(dctx, torch.tensor(bonus, device=eng.device), embed, head)  # [L, V]
        else:
            logp = proposer(ctx_len, bonus)
        m1 = clock.mark()
        tree = build_tree(logp, eng.budget, bonus, eng.tree_shape)
        mask = tree.ancestor_mask(eng.device)  # [R, R]
        positions = tree.positions(ctx_len, eng.device)  # [R]
        tokens = torch.tensor(tree.tokens, dtype=torch.int64, device=eng.device)
        m2 = clock.mark()
        logits, feats = eng._forward(kv, tokens, positions, mask, eng.path)  # [R, V], [R, F]
        picks = target_picks(logits, temperature, gen)
        m3 = clock.mark()
        path, nxt = walk(tree, picks)
        kv.commit(path)
        keep = torch.tensor(path, dtype=torch.int64, device=eng.device)
        eng.drafter.append_context(dctx, feats[keep], positions[keep])
        out.extend(tree.tokens[r] for r in path[1:])
        out.append(nxt)
        bonus = nxt
        pending.append((ctx_len, tree.size, len(path), [m0, m1, m2, m3, clock.mark()], None))
        if on_tokens is not None:
            on_tokens(out[len(out) - len(path):], tree.size)
    return out, _records(clock, pending, False, "", 0.0)


def decode_static(eng, st: StaticStep, bonus: int, max_new_tokens: int, temperature: float, gen, proposer,
                  captured: str = "", capture_ms: float = 0.0, on_tokens=None):
    """The loop over a StaticStep after prefill (st.kv / st.dctx hold the prompt)."""
    if temperature == 0 and getattr(eng, "device_tree", False) and st.device_ok:
        return decode_device(eng, st, bonus, max_new_tokens, proposer, captured, capture_ms, on_tokens)
    out, pending, clock = [bonus], [], StepClock(eng.device)
    if on_tokens is not None:
        on_tokens([bonus], 0)
    st.write_commit(list(range(st.rows)), st.kv.committed, 0, bonus)  # the first draft reads n and the bonus
    while len(out) < max_new_tokens:
        ctx_len = st.kv.committed
        w0 = time.perf_counter()
        m0 = clock.mark()
        if proposer is None:
            vals, idx = st.run("draft")
        else:
            vals, idx = torch.topk(proposer(ctx_len, bonus).double(), st.topk, dim=-1)
        m1 = clock.mark()
        b0 = time.perf_counter()
        vals, idx = vals.cpu(), idx.cpu()  # waits for the draft
        blocked = time.perf_counter() - b0
        tree = tree_from_topk(vals, idx, eng.budget, bonus, eng.tree_shape)
        widx = st.write_step(tree, ctx_len)
        m2 = clock.mark()
        logits, _, picks = st.run("verify")
        n = tree.num_rows
        b0 = time.perf_counter()
        picks = picks[:n].tolist() if temperature == 0 else target_picks(logits[:n], temperature, gen)  # waits
        blocked += time.perf_counter() - b0
        m3 = clock.mark()
        path, nxt = walk(tree, picks)
        if eng.poison and not bool(torch.isfinite(logits[:n]).all()):
            raise RuntimeError(f"NaN in target logits (path {eng.path.name}): attention read a row outside the plan")
        st.after_walk(path, widx, nxt)
        out.extend(tree.tokens[r] for r in path[1:])
        out.append(nxt)
        bonus = nxt
        pending.append((ctx_len, tree.size, len(path), [m0, m1, m2, m3, clock.mark()],
                        (time.perf_counter() - w0 - blocked) * 1e3))
        if on_tokens is not None:
            on_tokens(out[len(out) - len(path):], tree.size)
    return out, _records(clock, pending, True, captured, capture_ms, d2h=2)


def decode_device(eng, st: StaticStep, bonus: int, max_new_tokens: int, proposer, captured: str = "",
                  capture_ms: float = 0.0, on_tokens=None):
    """Greedy loop with the tree on the device: draft -> tree -> verify -> walk -> commit run back to
    back (graphs on CUDA), then one copy back: the committed tokens and their count (which decide
    whether to stop), the tree size and the finite-logits flag. The host keeps only counters."""
    out, pending, clock = [bonus], [], StepClock(eng.device)
    if on_tokens is not None:
        on_tokens([bonus], 0)
    st.start_device(bonus)
    r = st.rows
    while len(out) < max_new_tokens:
        ctx_len = st.kv.committed
        w0 = time.perf_counter()
        m0 = clock.mark()
        if proposer is None:
            st.run("draft")
        else:  # the proposer reads the host's context length and bonus (known from the last copy)
            st.set_draft(*torch.topk(proposer(ctx_len, bonus).double(), st.topk, dim=-1))
        m1 = clock.mark()
        st.run("tree")
        m2 = clock.mark()
        st.run("verify")
        m3 = clock.mark()
        st.run("walk")
        st.run("commit")
        m4 = clock.mark()
        b0 = time.perf_counter()
        back = st.read_step()  # the one device-to-host copy; waits for the step
        blocked = time.perf_counter() - b0
        k, size, finite = back[r], back[r + 1], back[r + 2]
        if eng.poison and not finite:
            raise RuntimeError(f"NaN in target logits (path {eng.path.name}): attention read a row outside the plan")
        st.kv.committed += k
        st.dctx.n += k
        out.extend(back[:k])
        bonus = out[-1]
        pending.append((ctx_len, size, k, [m0, m1, m2, m3, m4], (time.perf_counter() - w0 - blocked) * 1e3))
        if on_tokens is not None:
            on_tokens(out[len(out) - k:], size)
    return out, _records(clock, pending, True, captured, capture_ms, d2h=1)
