"""What several commands share, defined once: the error wrapper, the consoles, the backend options,
and the engine options as one dataclass (``EngineOptions``) that a decorator adds to a command.

``@engine_options(preset="k2", ...)`` appends the eight engine options to a Typer command's
signature (with per-command defaults) and hands the command one ``eng: EngineOptions``.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape

from .. import verify_paths
from ..probes.backends.engine import MAX_BUDGET
from ..units import DDProbeError

# Piped output (CI logs, files) gets a wide page instead of rich's default 80 columns, unless COLUMNS says.
# markup off by default: names from files and servers (split[build=sm_120], a kernel's [lambda] ...) are text; the few
# lines that style themselves say markup=True and escape what they interpolate
out = Console(markup=False, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 132)
err = Console(stderr=True, markup=False, width=None if sys.stderr.isatty() or os.environ.get("COLUMNS") else 200)

def columns() -> int:
    """Width of the terminal we print to, now (COLUMNS wins, as rich and the shells agree)."""
    env = os.environ.get("COLUMNS", "")
    return int(env) if env.isdigit() else out.width


def kv_capacity(longest_ctx: int, new_tokens: int, budget: int) -> int:
    """Tokens of KV a request of ``longest_ctx`` + ``new_tokens`` needs, verify rows and slack included."""
    from ..probes.commit import request_tokens

    return request_tokens(longest_ctx, new_tokens, budget)


def num_or_dash(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def errors_exit_1(fn):
    """Turn a domain error into one line on stderr and exit code 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DDProbeError as e:
            err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True, markup=True)
            raise typer.Exit(1) from None
        except OSError as e:  # a results file or folder that cannot be written
            where = f" {e.filename}" if e.filename else ""
            err.print(f"[bold red]error:[/] cannot write{escape(where)}: {escape(e.strerror or str(e))}",
                      highlight=False, soft_wrap=True, markup=True)
            raise typer.Exit(1) from None

    return wrapper


def text_kinds(text: str) -> list[str]:
    """Comma-separated probe text kinds, checked against the known ones (one line when unknown)."""
    from .. import texts

    kinds = [k.strip() for k in text.split(",") if k.strip()]
    bad = [k for k in kinds if k not in texts.KINDS]
    if bad or not kinds:
        raise DDProbeError(f"unknown text kind {(bad or [text])[0]!r}; known: {', '.join(texts.KINDS)}")
    return list(dict.fromkeys(kinds))


def fail(message: str, code: int = 1):
    """One line on stderr and exit ``code`` (for checks that run while the options are parsed)."""
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(code)


def checked(parse):
    """A Typer option callback: ``parse(value)`` must accept the value (its ``DDProbeError`` becomes one line
    naming the option, exit 1); the option keeps the value as typed."""

    def callback(ctx: typer.Context, param: typer.CallbackParam, value):
        if value is None or ctx.resilient_parsing:
            return value
        try:
            parse(value)
        except DDProbeError as e:  # a message that names the option already is not prefixed twice
            fail(str(e) if str(e).startswith(f"{param.opts[0]}:") else f"{param.opts[0]}: {e}")
        return value

    return callback


def label(v: str) -> None:
    """A check for ``checked``: a label printed as a table's key (not blank, one line, at most 64 characters)."""
    if not v.strip():
        raise DDProbeError("an empty label: give a name, e.g. sglang")
    if len(v) > 64 or not v.isprintable():
        raise DDProbeError(f"{v[:64]!r}: a label is one printable line of at most 64 characters")


def within(lo: float, hi: float, unit: str = ""):
    """A check for ``checked``: a number in [lo, hi] (NaN and infinities refused)."""

    def check(v) -> None:
        if not (v == v and lo <= v <= hi):
            raise DDProbeError(f"must be in {lo:g}..{hi:g}{unit}, got {v}" if isinstance(lo, float) else
                               f"must be in {lo}..{hi}{unit}, got {v}")

    return check


def typed_flags(ctx: typer.Context, names) -> list[str]:
    """The options among parameter ``names`` the user gave on the command line (or in the environment)."""
    return [p.opts[0] for p in ctx.command.params if p.name in names and
            getattr(ctx.get_parameter_source(p.name), "name", "") in ("COMMANDLINE", "ENVIRONMENT")]


def output_file(ctx: typer.Context, param: typer.CallbackParam, value):
    """A Typer option callback for a file the command writes (``outputs.check_file``), checked as the options
    are parsed: before anything is computed or measured."""
    from .outputs import check_file

    if value is not None and not ctx.resilient_parsing:
        try:
            check_file(param.opts[0], value)
        except DDProbeError as e:
            fail(str(e))
    return value


ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an output file that is already there (earlier "
                                                       "results, or one of this command's inputs).")]

MAX_TIMEOUT_S = 7 * 24 * 3600.0
BackendOpt = Annotated[str, typer.Option("--backend", help="engine (in-process), sglang or vllm (a server on "
                                                           "this host).")]
UrlOpt = Annotated[Optional[str], typer.Option("--url", help="Server URL for sglang/vllm, e.g. "
                                                             "http://127.0.0.1:30000.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds to wait for one HTTP answer.",
                                           callback=checked(within(1e-3, MAX_TIMEOUT_S, " s")))]

_PANEL = "Engine backend"
MAX_SEED = 2**64 - 1  # torch's generators take 64-bit seeds
_ENGINE_OPTS = {  # field -> (annotation, flag, help[, callback])
    "preset": (str, "--preset", "Engine preset: tiny or k2."),
    "attn": (str, "--attn", verify_paths.attn_help()),
    "budget": (int, "--budget", f"Draft-tree nodes (verify rows = budget + 1), 1..{MAX_BUDGET}.",
               checked(within(1, MAX_BUDGET))),
    "device": (str, "--device", "auto (cuda when a GPU is visible, else cpu), cpu or cuda."),
    "dtype": (str, "--dtype", "auto (bf16 on cuda, fp32 on cpu), fp32, bf16, fp16."),
    "heads": (Optional[int], "--heads", "Attention heads (k2: 8 = one tensor-parallel shard, 64 = all)."),
    "weights": (str, "--weights", "auto (the preset's trained weights when shipped: tiny), trained, or random "
                                  "(from --seed)."),
    "seed": (int, "--seed", "Weights seed (engine) and text seed.", checked(within(0, MAX_SEED))),
    "graphs": (Optional[bool], "--graphs/--no-graphs", "Replay decode steps as CUDA graphs (default: on for cuda, "
                                                       "off on cpu; cuda only)."),
    "compile": (Optional[bool], "--compile/--no-compile", "torch.compile the model around the attention in the "
                "CUDA-graph step: a faster step for seconds of warm-up (default: on, except in commit, whose answer "
                "is the commit length; cuda only)."),
    "threads": (Optional[int], "--threads", "CPU threads of torch (default: the cores this process may use less "
                                            "the busy ones; OMP_NUM_THREADS when set).",
                checked(within(1, 4096))),
}


ENGINE_OPTION_NAMES = tuple(_ENGINE_OPTS)  # the engine options' parameter names (one list for every command)
SERVER_IGNORES = tuple(k for k in _ENGINE_OPTS if k != "seed")  # engine options a server backend ignores (the
                                                                # seed also seeds the probe's text)


@dataclass(frozen=True)
class EngineOptions:
    """The embedded engine a command builds when ``--backend engine``."""

    preset: str = "tiny"
    attn: str = verify_paths.AUTO
    budget: int = 8
    device: str = "auto"
    dtype: str = "auto"
    heads: Optional[int] = None
    weights: str = "auto"
    seed: int = 0
    graphs: Optional[bool] = None
    compile: Optional[bool] = None
    threads: Optional[int] = None

    def resolved(self) -> "EngineOptions":
        """``auto`` made concrete: cuda when torch sees a GPU, else cpu; bf16 on cuda, fp32 on cpu; the attention
        path ``verify_paths.auto_choice`` picks for this model on this GPU in this dtype."""
        device, dtype = self.device, self.dtype
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "bf16" if device.startswith("cuda") else "fp32"
        attn = self.attn
        if attn == verify_paths.AUTO:
            attn = verify_paths.auto_choice(_capability(device), _dtype_key(dtype), self.model_row())[0]
        return dataclasses.replace(self, device=device, dtype=dtype, attn=attn)

    def model_row(self) -> tuple[int, int]:
        """The preset's MLA latent row (v_dim, rope), known before anything is built."""
        t = self._config().target
        return t.kv_lora_rank, t.qk_rope_head_dim

    def _config(self):
        from ..physics.presets import ModelConfig

        try:
            return ModelConfig.from_name(self.preset, heads=self.heads)
        except ValueError as e:  # unknown preset, bad heads
            raise DDProbeError(str(e)) from None

    def check(self) -> None:
        """Refuse, in one line and before anything is built, what the engine would refuse later: an unknown
        preset or path, trained weights the preset does not ship, a path that cannot run this model here."""
        if self.attn != verify_paths.AUTO and self.attn not in verify_paths.verify_names():
            raise DDProbeError(f"--attn: unknown attention path {self.attn!r}; known: auto, "
                               + ", ".join(verify_paths.verify_names()))
        row = self.model_row()  # an unknown preset fails here
        if self.weights == "trained" and not _ships_weights(self.preset):
            raise DDProbeError(f"--weights trained: the {self.preset} preset ships no trained weights (use "
                               "--weights random, or --preset tiny)")
        if self.attn == verify_paths.AUTO:
            return
        r = self.resolved()  # on the CPU the Triton paths run under the interpreter (EngineBackend says how)
        why = verify_paths.why_not(verify_paths.get(r.attn), _capability(r.device), _dtype_key(r.dtype), row)
        if why:
            raise DDProbeError(f"--attn {r.attn} cannot run the {self.preset} preset here: {why} (--attn auto picks "
                               "one that can)")

    def chosen(self) -> str | None:
        """One line saying what ``auto`` chose, or None when nothing was automatic."""
        if self.device != "auto" and self.dtype != "auto" and self.attn != verify_paths.AUTO:
            return None
        r = self.resolved()
        said = [("device", r.device, self.device), ("dtype", r.dtype, self.dtype)]
        if self.attn == verify_paths.AUTO:  # the attention path is named only when it was chosen here
            said.append(("attn", r.attn, self.attn))
        return ", ".join(f"{what} {v}" + (" (auto)" if typed == "auto" else "") for what, v, typed in said)

    def attn_reason(self) -> str | None:
        """Why ``--attn auto`` chose its path (one line), or None when the path was typed."""
        if self.attn != verify_paths.AUTO:
            return None
        r = self.resolved()
        name, why = verify_paths.auto_choice(_capability(r.device), _dtype_key(r.dtype), self.model_row())
        return f"attn {name}: {why}"

    def backend(self, max_ctx: Optional[int]):
        from ..probes.backends.engine import EngineBackend

        self.check()
        r = self.resolved()
        return EngineBackend(preset=r.preset, attn=r.attn, budget=r.budget, device=r.device, dtype=r.dtype,
                             seed=r.seed, heads=r.heads, max_ctx=max_ctx, weights=r.weights, graphs=r.graphs,
                             threads=r.threads, compile=r.compile)

    def position_limit(self) -> int:
        """Longest context the preset's weights reach (its RoPE/YaRN range), known before anything is built."""
        return self._config().position_limit

    def capacity(self, longest_ctx: int, new_tokens: int) -> int:
        """KV capacity for the longest request; a context beyond the preset's limit is refused here, before
        the engine is built, naming the value typed rather than an internal total."""
        from ..units import fmt_tokens

        need, limit = kv_capacity(longest_ctx, new_tokens, self.budget), self.position_limit()
        if need > limit:
            raise DDProbeError(f"context {fmt_tokens(longest_ctx)} ({longest_ctx:,} tokens) + {new_tokens} new tokens "
                               f"is beyond the {limit:,} tokens the {self.preset} preset reaches")
        return need

    def args(self) -> list[str]:
        """The command-line options that rebuild this engine (for a child process)."""
        out_ = []
        for f in dataclasses.fields(self):
            v, flag = getattr(self, f.name), _ENGINE_OPTS[f.name][1]
            if isinstance(v, bool):  # a --on/--off pair
                out_.append(flag.split("/")[0 if v else 1])
            elif v is not None:
                out_ += [flag, str(v)]
        return out_


def _capability(device: str) -> tuple[int, int] | None:
    """The compute capability of a cuda ``device`` torch sees, None for the CPU (or no GPU)."""
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.get_device_capability(device) if torch.cuda.is_available() else None


def _dtype_key(dtype: str) -> str:
    """A dtype as the path table names it (fp32, bf16, fp16...); unknown spellings kept for the engine to refuse."""
    from ..physics.shapes import dtype_name

    try:
        return dtype_name(dtype)
    except DDProbeError:
        return dtype


def _ships_weights(preset: str) -> bool:
    from ..engine.weights import has_weights

    return has_weights(preset)


def engine_options(**defaults):
    """Add the engine options to a Typer command (``defaults`` override EngineOptions' per command);
    the command receives them as one ``eng: EngineOptions`` keyword."""
    unknown = set(defaults) - set(_ENGINE_OPTS)
    if unknown:
        raise TypeError(f"unknown engine options {sorted(unknown)}")
    base = EngineOptions(**defaults)

    def deco(fn):
        sig = inspect.signature(fn, eval_str=True)
        params = [p for p in sig.parameters.values() if p.name != "eng"]
        for name, (typ, flag, help_, *callback) in _ENGINE_OPTS.items():
            ann = Annotated[typ, typer.Option(flag, help=help_, rich_help_panel=_PANEL,
                                              callback=callback[0] if callback else None)]
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=getattr(base, name),
                                            annotation=ann))

        # the command's typer.Context (Typer hands one to a single parameter): its own, else one added here
        ctx_name = next((p.name for p in params if p.annotation is typer.Context), None)
        if ctx_name is None:
            params.append(inspect.Parameter("_engine_ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            eng = EngineOptions(**{k: kwargs.pop(k) for k in _ENGINE_OPTS if k in kwargs})
            tctx = kwargs[ctx_name] if ctx_name else kwargs.pop("_engine_ctx")
            backend = kwargs.get("backend")
            ignored = typed_flags(tctx, SERVER_IGNORES) if backend not in (None, "engine") else []
            if ignored:  # a server decodes with its own model and tree: these would silently change nothing
                fail(f"{', '.join(ignored)}: engine option{'s' if len(ignored) > 1 else ''}, ignored with --backend "
                     f"{backend} (the server's own model and tree are measured): drop "
                     f"{'them' if len(ignored) > 1 else 'it'}")
            return fn(*args, eng=eng, **kwargs)

        wrapper.__signature__ = sig.replace(parameters=params)
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__  # typer must read the new signature, not fn's
        return wrapper

    return deco


def warm_up(be, capacity: Optional[int]) -> Optional[dict]:
    """Compile, capture and one throwaway step before anything is measured (backends that can: the engine),
    said in its own line; returns what the backend reported, for the results file."""
    if not hasattr(be, "warmup"):
        return None
    done = be.warmup(capacity)
    off = " (torch.compile off: --compile for the fused step)" if done["what"] == "kernels + capture" else ""
    err.print(f"warm-up {done['warmup_s']:.1f} s: {done['what']}{off}", highlight=False)
    return done


def results_path(given: Optional[Path], kind: str) -> Path:
    """The results file: the one given, else ddprobe-results/<kind>-<time>.json (-2, -3, ... after the time when a run
    of the same second wrote that name already: measured results are never overwritten nor refused)."""
    import datetime as dt

    if given:
        return given
    stem = Path("ddprobe-results") / f"{kind}-{dt.datetime.now():%Y%m%d-%H%M%S}"
    path, n = stem.with_suffix(".json"), 2
    while path.exists():
        path, n = Path(f"{stem}-{n}.json"), n + 1
    return path
