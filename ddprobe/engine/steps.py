"""One DDTree step three ways: the strategies the one decode loop (``loop.decode``) calls.

Each is built over a request's caches (``runner.Caches``) and the models, and runs draft -> tree
build -> verify -> walk + commit once per call: ``step(bonus, clock) -> Done``, whose ``tokens``
are the committed tokens (the accepted path after the root, then the next bonus), ``marks`` the
five ``clock.StepClock`` marks at the phase boundaries, ``blocked`` the seconds the host waited for
the device's answers.

- ``EagerStep``: host plans, shapes follow the tree (tree.build_tree, tree.walk). The oracle the
  tests compare the others with.
- ``HostTreeStep``: the static step's buffers and device plan (``graphs.StaticStep``, CUDA graphs
  on a GPU); the host reads the draft's top-k, builds the tree, reads the picks (or samples the
  logits) and walks: two device-to-host reads per step.
- ``DeviceTreeStep`` (greedy): the static step with the tree build and the walk on the device
  (``tree_device.py``); one read back per step (the committed tokens, their count, the tree size,
  a finite-logits flag). The host keeps only counters.

``step_for`` picks one: eager without graphs, the device tree at temperature 0 (when the spec asks
for it and its graphs were captured), else the host tree.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .clock import StepClock
from .runner import Caches, StepRunner
from .spec import Models
from .tree import build_tree, path_ranks, spine_depth, target_picks, tree_from_topk, walk


@dataclass
class Done:
    tokens: list[int]  # committed: the accepted path's tokens after the root, then the next bonus
    size: int  # tree size (drafted nodes)
    marks: list  # draft | tree | verify | commit boundaries (5 marks)
    blocked: float = 0.0  # seconds the host waited for the device
    ranks: tuple[int, ...] | None = None  # sibling rank of each accepted node (0 = spine); None: device tree
    spine: int | None = None  # draft tokens the tree's own spine accepts on the same picks (``tree.spine_depth``)


class EagerStep:
    graphs, d2h = False, None  # what the step records say

    def __init__(self, runner: StepRunner, models: Models, c: Caches, temperature: float = 0.0, gen=None,
                 proposer=None):
        self.runner, self.models, self.kv, self.dctx = runner, models, c.kv, c.dctx
        self.temperature, self.gen, self.proposer = temperature, gen, proposer

    @property
    def committed(self) -> int:
        return self.kv.committed

    def start(self, bonus: int) -> None:
        pass

    def __call__(self, bonus: int, clock: StepClock) -> Done:
        spec, (target, drafter), kv = self.runner.spec, self.models, self.kv
        dev, ctx_len = spec.device, kv.committed
        m0 = clock.mark()
        if self.proposer is None:
            logp = drafter(self.dctx, torch.tensor(bonus, device=dev), target.embed_tokens, target.lm_head)  # [L, V]
        else:
            logp = self.proposer(ctx_len, bonus)
        m1 = clock.mark()
        tree = build_tree(logp, spec.budget, bonus, spec.tree_shape)
        mask = tree.ancestor_mask(dev)  # [R, R]
        positions = tree.positions(ctx_len, dev)  # [R]
        tokens = torch.tensor(tree.tokens, dtype=torch.int64, device=dev)
        m2 = clock.mark()
        logits, feats = self.runner.forward(target, kv, tokens, positions, mask, spec.path)  # [R, V], [R, F]
        picks = target_picks(logits, self.temperature, self.gen)
        m3 = clock.mark()
        path, nxt = walk(tree, picks)
        kv.commit(path)
        keep = torch.tensor(path, dtype=torch.int64, device=dev)
        drafter.append_context(self.dctx, feats[keep], positions[keep])
        return Done([tree.tokens[r] for r in path[1:]] + [nxt], tree.size, [m0, m1, m2, m3, clock.mark()],
                    ranks=path_ranks(tree, path), spine=spine_depth(tree, picks))


class HostTreeStep:
    graphs, d2h = True, 2

    def __init__(self, runner: StepRunner, models: Models, c: Caches, temperature: float = 0.0, gen=None,
                 proposer=None):
        if c.static is None:
            raise ValueError("the host-tree step runs on a static step: build the caches with graphs on")
        self.runner, self.st = runner, c.static
        self.temperature, self.gen, self.proposer = temperature, gen, proposer

    @property
    def committed(self) -> int:
        return self.st.kv.committed

    def start(self, bonus: int) -> None:
        st = self.st
        st.write_commit(list(range(st.rows)), st.kv.committed, 0, bonus)  # the first draft reads n and the bonus

    def __call__(self, bonus: int, clock: StepClock) -> Done:
        st, spec = self.st, self.runner.spec
        ctx_len = st.kv.committed
        m0 = clock.mark()
        if self.proposer is None:
            vals, idx = st.run("draft")
        else:
            vals, idx = torch.topk(self.proposer(ctx_len, bonus).double(), st.topk, dim=-1)
        m1 = clock.mark()
        b0 = time.perf_counter()
        vals, idx = vals.cpu(), idx.cpu()  # waits for the draft
        blocked = time.perf_counter() - b0
        tree = tree_from_topk(vals, idx, spec.budget, bonus, spec.tree_shape)
        widx = st.write_step(tree, ctx_len)
        m2 = clock.mark()
        logits, _, picks = st.run("verify")
        n = tree.num_rows
        b0 = time.perf_counter()
        t = self.temperature
        picks = picks[:n].tolist() if t == 0 else target_picks(logits[:n], t, self.gen)  # waits
        blocked += time.perf_counter() - b0
        m3 = clock.mark()
        path, nxt = walk(tree, picks)
        self.runner.require_finite(spec.path, lambda: bool(torch.isfinite(logits[:n]).all()))
        st.after_walk(path, widx, nxt)
        return Done([tree.tokens[r] for r in path[1:]] + [nxt], tree.size, [m0, m1, m2, m3, clock.mark()], blocked,
                    path_ranks(tree, path), spine_depth(tree, picks))


class DeviceTreeStep:
    graphs, d2h = True, 1

    def __init__(self, runner: StepRunner, models: Models, c: Caches, temperature: float = 0.0, gen=None,
                 proposer=None):
        if c.static is None or temperature != 0:
            raise ValueError("the device-tree step is greedy (temperature 0) on a static step")
        self.runner, self.st, self.proposer = runner, c.static, proposer

    @property
    def committed(self) -> int:
        return self.st.kv.committed

    def start(self, bonus: int) -> None:
        self.st.start_device(bonus)

    def __call__(self, bonus: int, clock: StepClock) -> Done:
        st, r = self.st, self.st.rows
        m0 = clock.mark()
        if self.proposer is None:
            st.run("draft")
        else:  # the proposer reads the host's context length and bonus (known from the last copy)
            st.set_draft(*torch.topk(self.proposer(st.kv.committed, bonus).double(), st.topk, dim=-1))
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
        self.runner.require_finite(self.runner.spec.path, lambda: bool(finite))
        st.advance(k)
        return Done(back[:k], size, [m0, m1, m2, m3, m4], blocked)


def step_for(runner: StepRunner, models: Models, c: Caches, temperature: float = 0.0, gen=None, proposer=None):
    """The strategy for a request: eager without a static step; on one, the device tree at
    temperature 0 when the spec asks for it and the step can run it, else the host tree."""
    if c.static is None:
        kind = EagerStep
    elif temperature == 0 and runner.spec.device_tree and c.static.device_ok:
        kind = DeviceTreeStep
    else:
        kind = HostTreeStep
    return kind(runner, models, c, temperature, gen, proposer)
