"""The reference DDTree engine in-process, behind the probes' backend interface.

Commit length is computed here from the engine's step records, one rule for every backend and
the server: each verify step counts the tokens it put into the output (accepted depth + 1), a
step cut by the token limit (or by a stop string) counting only the tokens it actually committed;
the first token, which comes from the prefill, belongs to no step. So the per-step mean equals
(completion_tokens - 1) / verify_steps, never above min(budget, L) + 1.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

from ... import verify_paths
from ...physics.shapes import dtype_name
from ...units import DDProbeError
from .base import BackendError, GenStats, StopGeneration

ENGINE_DTYPES = ("fp32", "bf16", "fp16", "fp64")  # what the engine runs in (sizes: ddprobe.physics.shapes)
DEFAULT_MAX_CTX = 8192
WEIGHTS = ("auto", "trained", "random")  # auto: the preset's shipped weights when it has them
# Draft-tree nodes: verify rows = budget + 1, and the tree's masks and buffers grow with budget squared (100000
# nodes asked for 160 GB); trees past a few hundred nodes verify more rows than any step commits.
MAX_BUDGET = 1024
LOGITS_CHECK_TOKENS = 64  # tokens the after-cell logits check recomputes (the output's end, prompt before it)


def check_device(device: str) -> None:
    """cpu, cuda or cuda:N (one line otherwise, before torch sees the string)."""
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or (index and (kind != "cuda" or not index.isdigit())):
        raise BackendError(f"unknown device {device!r}; known: auto, cpu, cuda, cuda:N")


class EngineBackend:
    """Runs ``ddprobe.engine.generate.Engine`` in this process (torch imported here, lazily)."""

    name = "engine"

    def __init__(self, preset: str = "tiny", attn: str = "reference", budget: int = 8, device: str = "cpu",
                 dtype: str = "fp32", seed: int = 0, heads: int | None = None, max_ctx: int | None = None,
                 weights: str = "auto", graphs: bool | None = None, threads: int | None = None,
                 compile: bool | None = None, tree: str = "ddtree"):
        check_device(device)
        if not 1 <= budget <= MAX_BUDGET:
            raise BackendError(f"--budget must be in 1..{MAX_BUDGET} (draft-tree nodes; memory grows with its "
                               f"square), got {budget}")
        if graphs and not device.startswith("cuda"):
            raise BackendError("--graphs replays CUDA graphs: it needs --device cuda")
        if compile and (not device.startswith("cuda") or graphs is False):
            raise BackendError("--compile fuses the CUDA-graph step: it needs --device cuda and graphs on")
        import torch

        if device.startswith("cuda"):
            if not torch.cuda.is_available():  # before anything is written (the caches' folders included)
                raise BackendError(f"--device {device}: no CUDA GPU is visible to torch")
            from ...engine.compile_cache import enable

            enable()  # compiled kernels and graphs from the last run: the compilers read the folders when they
            # first compile, and enable() switches Inductor's loaded configs

        from .threads import choose_threads
        from ...physics.presets import ModelConfig
        from ...engine.generate import Engine
        from ...engine import weights as shipped
        from ...engine.tokenizer import WordTokenizer

        if weights not in WEIGHTS:
            raise BackendError(f"unknown weights {weights!r}; known: {', '.join(WEIGHTS)}")
        try:
            canon = dtype_name(dtype)
        except DDProbeError:
            canon = None
        if canon not in ENGINE_DTYPES:
            raise BackendError(f"unknown dtype {dtype!r} for the engine; known: {', '.join(ENGINE_DTYPES)}")
        dtype = canon
        # the CPU's thread count from the cores free now (``threads``); a GPU run keeps torch's default
        self.threads = choose_threads(threads) if device == "cpu" or threads is not None else None
        if self.threads is not None:
            torch.set_num_threads(self.threads.threads)
        if attn not in verify_paths.verify_names():
            raise BackendError(f"unknown attention path {attn!r}; known: {', '.join(verify_paths.verify_names())}")
        row = verify_paths.get(attn)
        if not device.startswith("cuda") and "any" not in row.archs:
            raise BackendError(f"--attn {attn} runs on {' / '.join(row.archs)} GPUs only: use --device cuda")
        if not row.cpu and not device.startswith("cuda") and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
            raise BackendError(f"--attn {attn} runs Triton kernels: use --device cuda (or TRITON_INTERPRET=1 to "
                               "run them slowly on the CPU)")
        try:
            cfg = ModelConfig.from_name(preset, heads=heads)
            self.limit = cfg.position_limit
            if max_ctx is not None and max_ctx > self.limit:
                raise BackendError(f"the {preset} preset supports {self.limit} tokens of context, asked for {max_ctx}")
            # KV capacity is allocated up front: without a request, keep it modest
            cfg = cfg.with_overrides(max_ctx=max_ctx if max_ctx is not None else min(self.limit, DEFAULT_MAX_CTX))
            tdtype = next(d for d in (torch.float32, torch.bfloat16, torch.float16, torch.float64)
                          if dtype_name(d) == dtype)
            self.engine = Engine(cfg, attn=attn, budget=budget, device=device, dtype=tdtype, seed=seed, graphs=graphs,
                                 compile=compile)
            misfit = shipped.config_mismatch(preset, cfg) if shipped.has_weights(preset) else None
            trained = weights == "trained" or (weights == "auto" and shipped.has_weights(preset) and misfit is None)
            # auto with shipped weights that do not fit this config: say so, never silently go random
            self.note = (f"random weights: the shipped {preset} weights do not fit this config ({misfit}); "
                         f"commit length will be near 1" if weights == "auto" and misfit else None)
            if trained:
                shipped.load_into(self.engine, preset)
        except ValueError as e:  # the engine's own checks: unknown preset/path, bad budget...
            if isinstance(e, BackendError):
                raise
            raise BackendError(str(e)) from None
        except torch.cuda.OutOfMemoryError:
            raise BackendError(_oom(f"building the {preset} engine ({heads or 'default'} heads, {dtype}) for "
                                    f"{cfg.max_ctx:,} tokens")) from None
        self.weights = "trained" if trained else f"random (seed {seed})"
        self.tokenizer = shipped.load_tokenizer(preset) if trained else WordTokenizer.default()
        self.preset, self.attn, self.budget, self.device, self.dtype, self.seed = preset, attn, budget, device, \
            dtype, seed
        self.set_tree(tree, budget)  # checked: a causal-only path (flashmla) runs the chain alone

    @property
    def tree_shape(self) -> str:
        return self.engine.tree_shape

    def set_tree(self, shape: str, budget: int) -> None:
        """Decode with a ``shape`` tree ("ddtree": the best ``budget`` prefixes; "chain": the drafter's top-1 at each
        depth, ``budget`` = its depth, at most L) from the next request on; one line for what cannot be."""
        from ...engine.tree import TREE_SHAPES

        if shape not in TREE_SHAPES:
            raise BackendError(f"unknown tree shape {shape!r}; known: {', '.join(TREE_SHAPES)}")
        if not 1 <= budget <= MAX_BUDGET:
            raise BackendError(f"budget must be in 1..{MAX_BUDGET}, got {budget}")
        if shape != "chain" and budget > 1 and verify_paths.get(self.attn).masks == "causal":
            raise BackendError(f"--attn {self.attn} verifies causal masks only: it runs --tree chain (and plain "
                               f"decode), not {shape}; use a tree-mask path for {shape}")
        if shape == "chain" and budget > self.engine.num_draft:
            raise BackendError(f"chain depth {budget} is beyond the drafter's block: it drafts "
                               f"{self.engine.num_draft} tokens (block size {self.engine.num_draft + 1})")
        self.engine.tree_shape, self.engine.budget, self.budget = shape, budget, budget

    @classmethod
    def around(cls, engine, tokenizer) -> "EngineBackend":
        """A backend over an engine built elsewhere (training scripts: the probe's prompts and generate on the
        weights being trained), with no context limit of its own beyond the engine's capacity."""
        be = cls.__new__(cls)
        be.engine, be.tokenizer, be.limit = engine, tokenizer, 1 << 30
        be.note, be.weights, be.preset, be.attn = None, "in training", engine.config.name, engine.attn
        be.budget, be.device, be.seed = engine.budget, str(engine.device), engine.seed
        be.dtype, be.threads = dtype_name(engine.dtype), None
        return be

    def tokenize(self, text: str) -> list[int]:
        vocab = self.engine.config.target.vocab_size
        return [i % vocab for i in self.tokenizer.encode(text)]

    def max_context(self) -> int | None:
        return min(self.limit, self.engine.max_ctx)

    def attention(self):
        """(AttnShape, KV dtype name, softmax scale) of the target: what floors and kernel comparisons need."""
        t = self.engine.config.target
        return t.attn_shape, self.dtype, t.sm_scale

    def step_weights(self, rows: int | None = None):
        """The target's weights one verify step of ``rows`` rows (default budget + 1) reads
        (``target_step_weights``): what ``probes.floor`` adds to the KV for the whole-step floor."""
        return target_step_weights(self.engine.config.target, rows or self.budget + 1, self.dtype)

    def step_model(self, bw_Bps: float, flops_per_s: float | None = None):
        """The step model (``ddprobe.physics.step_model``) of this engine on one GPU: its target's attention and weights
        in its dtype, no tensor parallelism (the engine is one GPU's share), graph-replayed or not as it runs."""
        return target_step_model(self.engine.config.target, self.dtype, bw_Bps, flops_per_s, bool(self.engine.graphs))

    def describe(self) -> dict[str, Any]:
        t = self.engine.config.target
        return {"backend": self.name, "preset": self.preset, "attn": self.attn, "kv_layout": self.engine.kv_layout,
                "budget": self.budget, "tree": self.engine.tree_shape, "block_size": self.engine.config.drafter.block_size, "device": self.device,
                "dtype": self.dtype, "seed": self.seed, "weights": self.weights, "layers": t.num_layers, "heads": t.num_heads,
                "kv_row": t.kv_dim, "vocab": t.vocab_size, "graphs": self.engine.graphs,
                "compile": self.engine.compiled,
                **({"compile_error": err} if (err := self.engine.compile_error) else {}),
                **({"attn_fallback": fell} if (fell := self.engine.attn_fallback) else {}),
                **({"fused_tree_fallback": fell} if (fell := self.engine.fused_tree_fallback) else {}),
                **({"threads": self.threads.to_dict()} if getattr(self, "threads", None) else {})}

    def warmup(self, capacity: int | None = None, plain: bool = False) -> dict:
        """Compile, capture (CUDA graphs) and one throwaway step before anything is measured: the
        engine's ``warmup`` ({"warmup_s", "what", "capacity"}); capacity: the largest request to come;
        plain: the plain decode step (``greedy``) instead of the DDTree step."""
        import torch

        try:
            return self.engine.warmup(capacity, plain=plain)
        except ValueError as e:
            raise BackendError(str(e)) from None
        except torch.cuda.OutOfMemoryError:
            raise BackendError(_oom(f"warming up (capturing the decode step for {capacity or 'the full'} "
                                    "tokens)")) from None

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def max_commit(self) -> int:
        """Most tokens one verify step can commit: min(budget, L) + 1 (L = block size - 1)."""
        return min(self.budget, self.engine.num_draft) + 1

    def generate(self, input_ids: list[int], max_new_tokens: int, temperature: float = 0.0,
                 on_tokens: Callable[[list[int]], None] | None = None, seed: int | None = None, *,
                 reuse_prefix: bool = False, on_prefill: Callable[[int, int], None] | None = None) -> GenStats:
        """DDTree decode of ``max_new_tokens``. ``on_tokens`` gets the tokens as they are committed (the
        prefill's first, then each verify step's, cut at the limit); a ``StopGeneration`` it raises ends
        the decode at that step and is recorded as ``extra["finish_reason"]``.
        ``reuse_prefix``: the engine keeps this prompt's cache afterwards and starts from the longest common
        prefix of the prompt it kept (``GenStats.reused_tokens``; ``prefill_s`` then times only the rest);
        False drops anything kept. ``on_prefill(done, total)``: first with the tokens reused, then after every
        prefill chunk."""
        import torch

        from ...engine.records import provenance

        toks: list[int] = []
        steps: list[tuple[int, int]] = []  # per verify step: (tokens it put into the output, tree nodes)
        uncut: list[int] = []  # per verify step: the tokens it committed before a limit or a stop cut them
        t0, t_first = time.perf_counter(), []

        def hook(new: list[int], tree_size: int) -> None:
            if not t_first:
                t_first.append(time.perf_counter())
            else:
                steps.append((0, tree_size))
                uncut.append(len(new))
            new = new[:max_new_tokens - len(toks)]
            toks.extend(new)
            if steps:
                steps[-1] = (len(new), steps[-1][1])
            if on_tokens is not None and new:
                on_tokens(new)

        finish, res = "length", None
        try:
            res = self.engine.generate(input_ids, max_new_tokens, temperature=temperature, seed=seed, on_tokens=hook,
                                       reuse_prefix=reuse_prefix, on_prefill=on_prefill)
        except ValueError as e:
            raise BackendError(str(e)) from None
        except torch.cuda.OutOfMemoryError:
            raise BackendError(_oom(f"decoding a {len(input_ids):,}-token prompt")) from None
        except StopGeneration as e:
            finish = e.reason
            if e.keep is not None:
                del toks[e.keep:]
        # the one commit-length rule: what each step put into the output, after any cut (limit, stop)
        kept, left = [], len(toks) - 1
        for n, _ in steps:
            kept.append(min(n, max(left, 0)))
            left -= kept[-1]
        while kept and kept[-1] == 0:  # steps whose every token was cut away
            kept.pop()
        records = res.steps[:len(kept)] if res is not None else []
        return GenStats(
            prompt_tokens=len(input_ids), completion_tokens=len(toks), verify_steps=len(kept), commit_lens=kept,
            reused_tokens=int(getattr(res, "reused_tokens", 0) or 0) if res is not None else None,
            drafts_per_step=sum(t for _, t in steps[:len(kept)]) / len(kept) if kept else None,
            prefill_s=res.prefill_ms / 1e3 if res is not None else (t_first[0] - t0 if t_first else None),
            decode_s=sum(r.step_ms for r in records) / 1e3 if records else None,
            e2e_s=time.perf_counter() - t0, tokens=list(toks), step_times_s=[r.step_ms / 1e3 for r in records],
            extra={"verify_ms_mean": sum(r.verify_ms for r in records) / len(records) if records else None,
                   "draft_ms_mean": sum(r.draft_ms for r in records) / len(records) if records else None,
                   "tree_nodes": sum(t for _, t in steps[:len(kept)]), "finish_reason": finish,
                   "tree": self.tree_shape, "budget": self.budget,
                   **(provenance(res.steps, self.max_commit() - 1) if res is not None else {})},
            ran_steps=[(n - 1, t) for n, (_, t) in zip(uncut, steps)])

    def logits_problem(self, ids: list[int]) -> str | None:
        """The target's logits after the last ``LOGITS_CHECK_TOKENS`` of ``ids`` (a prompt and its output),
        recomputed: 'not finite', 'all equal' or None (``sanity.logits_problem``)."""
        from .sanity import logits_problem

        return logits_problem(self.engine.next_token_logits(list(ids[-LOGITS_CHECK_TOKENS:])))

    reuses_prefix = True  # the engine keeps a prompt's cache for the next request (``generate(reuse_prefix=True)``)

    def forget_prefix(self) -> None:
        """Drop the cache a ``reuse_prefix`` request kept."""
        self.engine.forget_prefix()

    def greedy(self, input_ids: list[int], max_new_tokens: int,
               on_token: Callable[[int], None] | None = None) -> list[int]:
        """Plain greedy decoding of the target (no drafts): ``serve --no-spec``. ``on_token`` gets each token
        as it is decoded; what it raises (a ``StopGeneration``) ends the decode and propagates."""
        try:
            return self.engine.greedy_reference(input_ids, max_new_tokens, on_token=on_token)
        except ValueError as e:
            raise BackendError(str(e)) from None


def target_step_model(t, dtype: str, bw_Bps: float, flops_per_s: float | None = None, graphs: bool = True,
                      name: str = "engine"):
    """The step model of an engine target (``physics.presets.TargetConfig``, one GPU's share: no tensor
    parallelism) in ``dtype``, from the one planner (launches at the structural least count until counted)."""
    from ...physics.models import ModelSpec
    from ...physics.plan import StepInput, plan

    return plan(StepInput(ModelSpec.from_target(t, name), weight_dtype=dtype, kv_dtype=dtype, bw_Bps=bw_Bps,
                          flops_per_s=flops_per_s, graphs=graphs))


def preset_step_model(preset: str, heads: int | None, dtype: str, bw_Bps: float, flops_per_s: float | None = None):
    """The step model of an engine preset (its config alone: no engine is built, no torch needed)."""
    from ...physics.presets import ModelConfig

    return target_step_model(ModelConfig.from_name(preset, heads=heads).target, dtype, bw_Bps, flops_per_s,
                             name=preset)


def target_step_weights(t, rows: int, dtype: str):
    """``step_shape.StepWeights`` of an engine target for one verify step of ``rows`` rows
    (``ModelSpec.from_target``: one GPU's share, every weight in the engine's ``dtype``)."""
    from ...physics.models import ModelSpec

    return ModelSpec.from_target(t, "engine").step_weights(rows=rows, dense_dtype=dtype, expert_dtype=dtype)


def _oom(what: str) -> str:
    return (f"out of GPU memory {what}: try a shorter context, fewer --heads, --no-graphs, or a GPU with more "
            "memory")
