"""Kernel-name rules: which part of a decode / verify step a GPU kernel (or, for a CPU-only engine's trace, a
top-level PyTorch operator) belongs to. Stdlib only; ``ddprobe trace`` and anything else that reads kernel names
read this one table.

The classes, in the order a step's split is printed:
  attention       verify and decode attention (and their split-K merges, plan/metadata kernels, KV-cache writes)
  moe             MoE routing (gating, top-k over experts, token sorting/alignment) and expert GEMMs
  gemm            dense GEMMs and GEMVs (cuBLAS ``nvjet_*`` / ``sm90_xmma_*`` / ``ampere_*gemm``, CUTLASS, DeepGEMM)
  communication   NCCL collectives, custom all-reduces (SGLang's / vLLM's ``cross_device_reduce_*``), DeepEP
  norm_elementwise  norms, activations, rotary, casts, copies inside the step, PyTorch elementwise/reduce kernels
  sampling_tree   sampling, argmax/top-k over the vocabulary, the draft tree's build, verify and walk kernels
  other           what no rule names (and memcpy / memset)

Rules are tried in order and the first match wins, so the specific rules come first (an attention kernel whose
name says ``cutlass`` is attention, a MoE kernel that says ``gemm`` is MoE). ddprobe's own verify kernels are read
from ``ddprobe.verify_paths`` (each path's ``ncu_regex``), the one place they are named.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from . import verify_paths

CLASSES = ("attention", "moe", "gemm", "communication", "norm_elementwise", "sampling_tree", "other")
LABELS = {"attention": "attention", "moe": "MoE", "gemm": "dense GEMM", "communication": "communication",
          "norm_elementwise": "norms / elementwise", "sampling_tree": "sampling / tree", "other": "other"}


@dataclass(frozen=True)
class Rule:
    cls: str  # one of CLASSES
    pattern: str  # a regular expression searched in the kernel's name
    what: str  # whose kernel it is, said in the output ("SGLang extend (verify) attention")
    role: str = ""  # attention only: "verify", "decode", "merge", "metadata" or "kv-write"


def _own_attention() -> tuple[Rule, ...]:
    """ddprobe's engine: each verify path's kernels, as ``verify_paths`` names them (SGLang's own are below)."""
    out = []
    for p in verify_paths.PATHS:
        if p.ncu_regex and not p.theirs:
            out.append(Rule("attention", rf"^(?:{p.ncu_regex})", f"ddprobe {p.name} attention", "verify"))
    return tuple(out)


RULES: tuple[Rule, ...] = (
    # communication first: an all-reduce fused with a norm is still time spent waiting on the other ranks
    Rule("communication", r"nccl", "NCCL collective"),
    Rule("communication", r"cross_device_reduce", "custom all-reduce (SGLang / vLLM)"),
    Rule("communication", r"(?i)all_?reduce|allgather|all_gather|reduce_scatter|reducescatter|all_to_all|alltoall",
         "all-reduce / collective"),
    Rule("communication", r"(?i)quick_?reduce|mscclpp|deep_ep::|one_shot|two_shot|multimem", "custom collective"),
    # attention: SGLang's Triton backend (extend = target verify; decode = split-K stage 1 + merge stage 2)
    Rule("attention", r"^_fwd_kernel$", "SGLang extend attention (target verify, Triton)", "verify"),
    Rule("attention", r"^_fwd_(?:grouped_)?kernel_stage1$", "SGLang decode attention stage 1 (Triton)", "decode"),
    Rule("attention", r"^_fwd_kernel_stage2$", "SGLang decode attention merge (Triton)", "merge"),
    Rule("attention", r"get_num_kv_splits", "SGLang decode split planner", "metadata"),
    *_own_attention(),
    Rule("attention", r"flash_fwd_splitkv_mla_combine|flash_fwd_mla_combine", "FlashMLA combine", "merge"),
    Rule("attention", r"(?i)flash_?mla|splitkv_mla|sm90_mla|sparse_attn", "FlashMLA decode", "decode"),
    Rule("attention", r"get_mla_metadata|get_mla_decoding_metadata", "FlashMLA metadata", "metadata"),
    Rule("attention", r"(?i)merge_?states|MergeState", "FlashInfer merge states", "merge"),
    Rule("attention", r"BatchMLAPaged|MLAPaged|BatchPrefillWith|BatchDecodeWith|SinglePrefillWith|"
                      r"SingleDecodeWith|PersistentKernel", "FlashInfer attention", "decode"),
    Rule("attention", r"(?i)reshape_and_cache|concat_and_cache|set_mla_kv|store_kv|kv_buffer|write_req_to_token",
         "KV-cache write", "kv-write"),
    Rule("attention", r"(?i)fmha|flash_fwd|flash::|FlashAttn|flash_attn|cutlass_mla|Sm100Fmha|trtllm.*(?:mla|attn)"
                      r"|paged_attention|unified_attention|_attn_fwd|attention|_mla_", "attention (other)", "decode"),
    # MoE: routing and expert GEMMs
    Rule("moe", r"(?i)fused_moe|moe_|_moe|grouped_topk|topk_?softmax|topkGating|topk_sigmoid|expert|ep_scatter|"
                r"ep_gather|m_grouped|grouped_gemm|count_and_sort|align_block_size|_routed_to|fused_gate",
         "MoE routing / experts"),
    # the draft tree and sampling (before the GEMM rules: cub's sorts and argmax reductions carry generic names)
    Rule("sampling_tree", r"(?i)verify_tree|tree_speculative|build_tree|tree_build|segment_packbits|eagle|"
                          r"rejection|sampling|sample|ArgMax|argmax|multinomial|top_?p|top_?k_|TopK|RadixSort|"
                          r"radixSort|_tree_|walk|accept", "sampling / draft tree"),
    # dense GEMMs: cuBLAS (nvjet on Hopper/Blackwell, xmma/ampere/sm80 names before), CUTLASS, DeepGEMM, Triton
    Rule("gemm", r"(?i)nvjet|gemm|gemv|xmma|cutlass|s16816|s1688|splitKreduce|deep_gemm|scaled_mm|matmul|bmm|"
                 r"wgmma|cublas|Kernel2$", "dense GEMM"),
    Rule("gemm", r"^aten::(?:mm|addmm|bmm|baddbmm|matmul|linear|einsum)$", "PyTorch matmul (CPU operator)"),
    Rule("attention", r"^aten::(?:_?scaled_dot_product|_flash_attention|_efficient_attention)",
         "PyTorch attention (CPU operator)", "verify"),
    # norms, activations and the rest of PyTorch's pointwise work
    Rule("norm_elementwise", r"(?i)norm|rotary|rope|act_and_mul|silu|gelu|swiglu|activation|elementwise|"
                             r"vectorized|unrolled|CatArray|cat_|copy|fill|reduce_kernel|index|scatter|gather|"
                             r"softmax|where|cast|quant|triton_(?:poi|red|per)_|embedding|fused_add|aten::",
         "norm / elementwise"),
    Rule("other", r"(?i)^memcpy|^memset", "memcpy / memset"),
)


@dataclass(frozen=True)
class Match:
    cls: str
    what: str
    role: str = ""


OTHER = Match("other", "unclassified")


@lru_cache(maxsize=None)
def _compiled() -> tuple[tuple[re.Pattern, Rule], ...]:
    return tuple((re.compile(r.pattern), r) for r in RULES)


@lru_cache(maxsize=65536)
def classify(name: str) -> Match:
    """The class of the kernel (or CPU operator) called ``name`` (a trace's ``name`` field, demangled or not)."""
    for rx, r in _compiled():
        if rx.search(name):
            return Match(r.cls, r.what, r.role)
    return OTHER
