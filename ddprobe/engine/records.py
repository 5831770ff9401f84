"""Per-step records and the result of one ``Engine.generate`` call."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class StepRecord:
    """One DDTree step: draft -> tree build -> verify -> walk + commit.

    commit_len = accepted_depth + 1 (bonus included); drafts = tree_size = nodes proposed (root
    not counted); context_len = committed tokens before the step (the verify prefix length).
    verify_ms includes the target's picks; commit_ms includes the walk, the KV commit and the
    drafter's context append. On a GPU the four times come from CUDA events (the GPU's timeline
    between phase boundaries, so host work the GPU waits on is inside them).
    graphs: the step replayed captured CUDA graphs (or, on CPU, ran the static-buffer step they
    record). captured: what was captured just before this step ("" when nothing was: warm-up
    did it, or graphs are off), and capture_ms how long that took (not part of step_ms).
    host_ms (static steps): the host's own work in the step, i.e. its wall time less the time it
    waited for the GPU's answers; None when eager.
    d2h (static steps): device-to-host copies the host waited on in the step: 1 with the tree on
    the device (the committed tokens and their count), 2 with the host tree (the draft's top-k for
    the build, the picks for the walk); None when eager.
    ranks: where each accepted node came from, its rank among its siblings (0 = the parent's most
    probable child: the spine); spine_depth: what the tree's own spine (its rank-0 path) accepts on
    the same target picks. Both None where the tree lives on the device (one copy back per step).
    """

    step: int
    context_len: int
    tree_size: int
    accepted_depth: int
    commit_len: int
    draft_ms: float
    tree_ms: float
    verify_ms: float
    commit_ms: float
    graphs: bool = False
    captured: str = ""
    capture_ms: float = 0.0
    host_ms: float | None = None
    d2h: int | None = None
    ranks: tuple[int, ...] | None = None  # sibling rank of each accepted node, depth order (0: the spine)
    spine_depth: int | None = None  # draft tokens the tree's own spine accepted on the same picks

    @property
    def drafts(self) -> int:
        return self.tree_size

    @property
    def step_ms(self) -> float:
        return self.draft_ms + self.tree_ms + self.verify_ms + self.commit_ms

    def to_dict(self) -> dict:
        d = asdict(self)
        d["drafts"] = self.drafts
        d["step_ms"] = self.step_ms
        return d


@dataclass
class GenerateResult:
    tokens: list[int]  # generated tokens (prompt excluded), exactly max_new_tokens
    steps: list[StepRecord] = field(default_factory=list)
    prompt_len: int = 0
    prefill_ms: float = 0.0
    attn: str = "reference"
    kv_layout: str = "paged"
    budget: int = 0
    graphs: bool = False
    reused_tokens: int = 0  # prompt tokens taken from the kept prefix (generate(reuse_prefix=True))

    @property
    def mean_commit_len(self) -> float:
        """Mean tokens per verify step as each step committed them (accepted depth + 1), a last step past
        max_new_tokens counted whole: vLLM's mean acceptance length (1 + accepted / drafts). Not SGLang's
        spec_accept_length (completion_tokens / spec_verify_ct, which counts the prefill's token) nor the probes'
        commit length (``GenStats.commit_len``, which counts a cut step as the tokens it kept)."""
        return sum(s.commit_len for s in self.steps) / len(self.steps) if self.steps else 0.0

    @property
    def decode_ms(self) -> float:
        return sum(s.step_ms for s in self.steps)

    def to_dict(self) -> dict:
        return {
            "tokens": list(self.tokens), "prompt_len": self.prompt_len, "prefill_ms": self.prefill_ms,
            "attn": self.attn, "kv_layout": self.kv_layout, "budget": self.budget, "graphs": self.graphs,
            "reused_tokens": self.reused_tokens, "mean_commit_len": self.mean_commit_len, "decode_ms": self.decode_ms,
            "steps": [s.to_dict() for s in self.steps],
        }


def provenance(steps: list[StepRecord], depth_max: int) -> dict:
    """Where a request's commits came from, over the steps that ran (``depth_max``: L, the drafter's depth):
    ``accepted_per_pos`` (steps whose draft token at depth p + 1 was accepted) and ``cond_accept_per_pos`` (at p
    over at p - 1, the first over the steps): acceptance per depth; ``sibling_share``: committed draft tokens from a
    sibling of rank >= 1 over all committed draft tokens; ``ran_commit_len``: the tree's commit length over the
    same steps (a step cut by the token limit counted whole); ``spine_commit_len``: the tree's own spine's commit length
    on the same steps, and ``gain_over_spine`` the tree's over it; ``spine_violations``: steps where the tree
    accepted fewer than its spine (a bug under greedy decoding), ``spine_violation_first`` the first (step, tree
    and spine draft tokens). Empty where the steps carry no ranks (the device tree)."""
    known = [s for s in steps if s.ranks is not None and s.spine_depth is not None]
    if not known or len(known) != len(steps):
        return {}
    at = [sum(1 for s in known if s.accepted_depth > p) for p in range(depth_max)]
    drafted = sum(s.accepted_depth for s in known)
    bad = [s for s in known if s.accepted_depth < s.spine_depth]
    tree = sum(s.accepted_depth + 1 for s in known) / len(known)
    spine = sum(s.spine_depth + 1 for s in known) / len(known)
    cond = [a / b if b else None for a, b in zip(at, [len(known)] + at)]
    return {"accepted_per_pos": at, "cond_accept_per_pos": cond,
            "sibling_share": sum(1 for s in known for r in s.ranks if r >= 1) / drafted if drafted else 0.0,
            "ran_commit_len": tree, "spine_commit_len": spine, "gain_over_spine": tree / spine,
            "spine_violations": len(bad),
            "spine_violation_first": {"step": bad[0].step, "tree_tokens": bad[0].accepted_depth,
                                      "spine_tokens": bad[0].spine_depth} if bad else None,
            "step_depths": [s.accepted_depth for s in known], "step_ranks": [list(s.ranks) for s in known]}
