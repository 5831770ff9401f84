"""What one verify step reads besides the KV cache: the weights, per GPU, under tensor and expert
parallelism (stdlib only; beside ``shapes.py``, which holds the attention and GPU facts).

Per GPU and per verify step of R rows (budget + 1):
- attention projections: q_a and kv_a (with their norms) are replicated on every GPU, q_b / kv_b / o
  split over ``tp`` (SGLang's and vLLM's DeepSeek-V3 layout); GQA's q/k/v/o split over ``tp``;
- dense MLP layers (the first ``first_k_dense_replace``) and shared experts: split over ``tp``;
- the router (hidden x E, every GPU routes every row);
- routed experts: ``ep`` groups of E / ep whole experts, each expert's width split over tp / ep
  (the rest of tp); R rows with top-k of E touch, under uniform routing, E_gpu (1 - (1 - k/E)^R)
  distinct local experts in expectation, min(E_gpu, R k) at worst;
- lm_head split over ``tp`` (vocabulary parallel); the embedding reads R rows.
Routed experts take ``expert_dtype`` (K2's INT4 experts), everything else ``dense_dtype``.
"""
from __future__ import annotations

from dataclasses import dataclass

from .shapes import AttnShape, dtype_bytes
from ..units import DDProbeError

# what a measured step below its whole-step floor means (the CLI prints it, the reports' "Where the step goes" says it)
BELOW_FLOOR = "step below the floor: check --tp/--ep/--weight-dtype/--expert-dtype"


def expected_distinct(local: int, n_experts: int, top_k: int, rows: int) -> float:
    """Expected distinct experts among ``local`` of ``n_experts`` that ``rows`` rows touch, each row
    picking ``top_k`` distinct experts uniformly: a given expert escapes one row with 1 - k/E."""
    return local * (1.0 - (1.0 - top_k / n_experts) ** rows)


def worst_distinct(local: int, top_k: int, rows: int) -> int:
    """At worst every row's top-k lands on a different local expert."""
    return min(local, rows * top_k)


@dataclass(frozen=True)
class MoeShape:
    """The MoE of a model (HF config names); n_routed_experts 0 is a dense model."""

    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    n_shared_experts: int = 0
    first_k_dense_replace: int = 0

    def check(self, tp: int = 1, ep: int = 1) -> None:
        if ep < 1:
            raise DDProbeError(f"--ep must be at least 1, got {ep}")
        if not self.n_routed_experts:
            return
        e, k = self.n_routed_experts, self.num_experts_per_tok
        if not 1 <= k <= e:
            raise DDProbeError(f"top-k {k} experts per token is not within the model's {e} experts")
        if e % ep:
            raise DDProbeError(f"--ep {ep} does not divide the model's {e} routed experts")
        if ep > tp or tp % ep:
            raise DDProbeError(f"--ep {ep} must divide --tp {tp} (the expert-parallel GPUs are tensor-parallel ones)")

    def local_experts(self, ep: int = 1) -> int:
        return self.n_routed_experts // ep

    def expert_params(self, hidden: int) -> int:
        """One routed expert's gate, up and down projections."""
        return 3 * hidden * self.moe_intermediate_size


# Kimi K2 / K2.6 (moonshotai/Kimi-K2-Instruct, moonshotai/Kimi-K2.6 config.json): 384 routed experts, top-8,
# moe_intermediate_size 2048, 1 shared expert, the first layer dense (intermediate_size 18432).
KIMI_K2_MOE = MoeShape(n_routed_experts=384, num_experts_per_tok=8, moe_intermediate_size=2048, n_shared_experts=1,
                       first_k_dense_replace=1)
KIMI_K2_INTERMEDIATE = 18432
KIMI_K2_ROUTED_SCALING = 2.827  # routed_scaling_factor


@dataclass
class StepWeights:
    """Weights one GPU reads in one verify step (bytes) and its FLOPs, routed experts both ways."""

    dense_B: float  # attention projections, dense MLPs, shared experts, router, norms, lm_head, embedding rows
    routed_B: float  # routed experts, expected distinct under uniform routing
    routed_worst_B: float  # routed experts, every row on different experts
    experts_per_layer: float  # expected distinct local experts per MoE layer
    experts_worst: int
    moe_layers: int
    flops: float  # 2 x params x rows for every weight a row uses (attention over the context not counted)

    @property
    def total_B(self) -> float:
        return self.dense_B + self.routed_B

    @property
    def total_worst_B(self) -> float:
        return self.dense_B + self.routed_worst_B


def attn_params(attn: AttnShape, hidden: int, q_lora_rank: int, tp: int = 1) -> tuple[float, float]:
    """Attention parameters of one layer on one GPU: (replicated, split over tp) parts."""
    n = attn.num_heads
    if attn.kind == "mla":
        qk = attn.qk_nope_head_dim + attn.qk_rope_head_dim
        rep = hidden * attn.kv_row + attn.kv_lora_rank + ((hidden * q_lora_rank + q_lora_rank) if q_lora_rank else 0)
        split = (q_lora_rank or hidden) * n * qk + attn.kv_lora_rank * n * (attn.qk_nope_head_dim + attn.v_head_dim) \
            + n * attn.v_head_dim * hidden
        return rep, split / tp
    d = attn.head_dim
    return 0.0, (2 * hidden * n * d + 2 * hidden * attn.num_kv_heads * d) / tp


def step_weights(attn: AttnShape, moe: MoeShape, *, hidden: int, vocab: int, q_lora_rank: int = 0,
                 intermediate: int = 0, rows: int = 9, tp: int = 1, ep: int = 1,
                 dense_dtype: str = "bf16", expert_dtype: str = "bf16",
                 shared_intermediate: int | None = None) -> StepWeights:
    """The weights of one verify step of ``rows`` rows on one GPU (see the module docstring).
    ``shared_intermediate``: the shared experts' total width on this GPU when it is not
    n_shared_experts x moe_intermediate_size / tp (an engine that sizes its shared expert itself)."""
    attn.check_tp(tp)
    moe.check(tp, ep)
    layers = attn.num_layers
    rep, split = attn_params(attn, hidden, q_lora_rank, tp)
    per_layer = rep + split + 2 * hidden  # + the two norms
    moe_layers = max(0, layers - moe.first_k_dense_replace) if moe.n_routed_experts else 0
    dense_layers = layers - moe_layers
    dense = layers * per_layer + dense_layers * 3 * hidden * intermediate / tp
    shared, router = 0.0, 0.0
    routed = worst = expected = 0.0
    worst_n, routed_flops = 0, 0.0
    if moe_layers:
        e, k = moe.n_routed_experts, moe.num_experts_per_tok
        local, moe_tp = moe.local_experts(ep), tp // ep
        one = moe.expert_params(hidden) / moe_tp  # one local expert's share on this GPU
        shared = moe.n_shared_experts * moe.expert_params(hidden) / tp if shared_intermediate is None else \
            3 * hidden * shared_intermediate
        router = hidden * e
        expected = expected_distinct(local, e, k, rows)
        worst_n = worst_distinct(local, k, rows)
        routed, worst = moe_layers * expected * one, moe_layers * worst_n * one
        routed_flops = 2.0 * rows * moe_layers * (k * local / e) * one  # each row's k experts, this GPU's share
        dense += moe_layers * (shared + router)
    head = hidden * vocab / tp + hidden  # lm_head shard and the final norm
    dense += head
    flops = 2.0 * rows * dense + routed_flops
    embed = rows * hidden  # the embedding rows the step gathers
    db, eb = dtype_bytes(dense_dtype), dtype_bytes(expert_dtype)
    return StepWeights(dense_B=dense * db + embed * db, routed_B=routed * eb, routed_worst_B=worst * eb,
                       experts_per_layer=expected, experts_worst=worst_n, moe_layers=moe_layers, flops=flops)
