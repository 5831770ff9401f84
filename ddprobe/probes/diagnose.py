"""`ddprobe diagnose`: the whole investigation in one run, ending in a written diagnosis.

Steps, each writing its results file into the output folder as soon as it has numbers:
1. commit: commit length on predictable and novel text at every context;
2. gpu-util: telemetry during a decode-heavy request at the longest context (NVML: needs an NVIDIA GPU
   here; ``telemetry`` from ``--source prometheus|dcgm-exporter``: the fleet's GPUs, none needed here);
3. floor: the bandwidth floor of the measured decode step (needs a GPU's bandwidth: detected, or
   ``--gpu``/``--bw``);
4. verify: `paged` vs `split` verify attention at the engine's shapes (embedded engine on a GPU);
then the report, whose first screen is the diagnosis. A step that cannot run here is recorded as
skipped with the reason and the others still run; ``diagnose.json`` records every step's status.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..results import Result, ResultWriter, RunMeta
from ..physics.gpus import get_gpu, gpu_spec_for
from ..physics.step_shape import BELOW_FLOOR
from ..units import DDProbeError
from .backends.base import Backend
from .commit import CellProgress, cell_order, run_tree_probe
from .bench.estimate import timing_block
from .floor import Sharding, floor_result, served_floor
from ..physics.models import get_model

# Every file a diagnosis writes in its folder (the report last): an earlier run's are never replaced unasked.
FILES = ("diagnose.json", "commit.json", "gpu-util.json", "floor.json", "advise.json", "verify.json", "report.html")


COMMIT_KINDS = ("predictable", "novel")
GPU_UTIL_PERIOD_S = 0.1  # the gpu-util step's sampling period


@dataclass
class DiagnoseOptions:
    ctxs: list[int]
    max_new_tokens: int = 64
    decode_tokens: int = 64
    gpu: str | None = None  # a floor GPU preset
    bw_Bps: float | None = None
    model: str = "kimi-k2.6"  # the floor's model for HTTP backends, sharded and stored as below
    tp: int = 1
    ep: int = 1
    weight_dtype: str = "bf16"
    expert_dtype: str = "bf16"
    dcp: int = 1
    allreduce_us: float | None = None
    allreduce_from: str | None = None
    kernels: int | None = None  # a server's kernels per step (None: the structural lower bound)
    seed: int = 0
    # gpu_util_run's source ({"reader_factory", "window"}, ``cli.gpu_source.open_source``); None: NVML here
    telemetry: dict[str, Any] | None = None
    trees: tuple[str, ...] = ("ddtree",)  # draft shapes the decision compares (the engine: the chain too)
    kv_dtype: str = "bf16"  # a server's KV cache dtype (the engine: its own)
    flops_per_s: float | None = None  # the tensor rate instead of the GPU's datasheet (--tflops)
    launch: Any = None  # a `bench launch` file's least kernel times (physics.gpus.KernelTime), else the GPU's
    launch_any_gpu: bool = False


COPY_BYTES = 256 * 2**20  # the copy that measures this machine's memory bandwidth when no GPU gives one


def copy_bandwidth(nbytes: int = COPY_BYTES, repeats: int = 5) -> float:
    """This machine's memory bandwidth in bytes/s, measured: the fastest of ``repeats`` copies of ``nbytes`` (torch,
    one tensor into another: ``nbytes`` read and ``nbytes`` written, counted both). What the embedded engine on the
    CPU streams its weights and KV through, so its floor can be stated without a GPU preset."""
    import torch

    a = torch.ones(nbytes // 4, dtype=torch.float32)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best


def detect_gpu_preset(meta: RunMeta) -> str | None:
    """The floor preset of the first NVIDIA GPU NVML sees, if ddprobe knows it."""
    spec = gpu_spec_for(meta.gpu_name)
    return spec.name if spec else None


class Diagnose:
    """The steps of a diagnosis. ``progress`` (``commit.CellProgress``) hears of every request measured: the
    commit cells, then the gpu-util request (``cells()`` says how many). ``estimate`` (an
    ``estimate.Estimate`` of those requests, made by the caller after its warm-up) goes into diagnose.json's
    config, next to the time the steps actually took (summary ``timing``)."""

    def __init__(self, backend: Backend, opts: DiagnoseOptions, out_dir: Path, say: Callable[[str], None] = print,
                 progress: CellProgress | None = None):
        self.backend, self.opts, self.out, self.say, self.progress = backend, opts, Path(out_dir), say, progress
        self.estimate = None
        self.out.mkdir(parents=True, exist_ok=True)
        self.meta = RunMeta.collect()
        self.record = ResultWriter(Result(kind="diagnose", meta=self.meta,
                                          config={"ctx": opts.ctxs, **backend.describe()}), self.out / "diagnose.json")
        self.files: dict[str, Path] = {}
        self.commit_rows: list[dict] = []
        self.util: Result | None = None

    def _written(self, name: str, before: dict[str, int]) -> str | None:
        """The step's file when this run wrote it (new, or changed since the step began: ``--force`` leaves an
        earlier run's files in place until they are written over)."""
        f = self.files.get(name)
        if f is None or not f.exists():
            return None
        return f.name if before.get(f.name) != f.stat().st_mtime_ns else None

    def _step(self, name: str, fn: Callable[[], tuple[str, str] | None]) -> None:
        t0 = time.perf_counter()
        before = {p.name: p.stat().st_mtime_ns for p in self.out.iterdir() if p.is_file()}
        self.say(f"{name}: running...")
        try:
            out = fn()
            status, reason = out if out else ("ok", "")
        except DDProbeError as e:
            status, reason = "failed", str(e)
        except KeyboardInterrupt:
            self.record.add({"step": name, "status": "interrupted", "reason": "interrupted by the user",
                             "file": self._written(name, before), "seconds": time.perf_counter() - t0})
            raise
        except Exception as e:  # a bug or a GPU error in one step must not lose the others
            status, reason = "failed", f"{type(e).__name__}: {e}".splitlines()[0]
            (self.out / f"{name}.error.txt").write_text(traceback.format_exc())
        self.record.add({"step": name, "status": status, "reason": reason, "file": self._written(name, before),
                         "seconds": time.perf_counter() - t0})
        self.say(f"{name}: {status}" + (f": {reason}" if reason else ""))

    # ---- steps ------------------------------------------------------------------------
    def commit(self):
        path = self.files["commit"] = self.out / "commit.json"
        w = ResultWriter(Result(kind="commit", meta=self.meta, config={
            "ctx": self.opts.ctxs, "text": list(COMMIT_KINDS), "max_new_tokens": self.opts.max_new_tokens,
            **self.backend.describe()}), path)
        self.commit_rows = run_tree_probe(self.backend, self._configs(), self.opts.ctxs, list(COMMIT_KINDS),
                                          self.opts.max_new_tokens, w, seed=self.opts.seed, progress=self.progress)

    def _configs(self) -> list:
        """The (shape, budget) pairs the commit step measures: the backend's tree, and on the engine the chain a
        budget buys (min(budget, L)) when asked for; [None]: the backend as it is (a server)."""
        if not hasattr(self.backend, "set_tree"):
            return [None]
        b = int(self.backend.budget)
        return [("ddtree", b)] + ([("chain", min(b, self.backend.max_commit() - 1))] if "chain" in self.opts.trees
                                  else [])

    def gpu_util(self):
        if not self._samples_gpus():
            return "skipped", "no NVIDIA GPU visible to NVML on this machine (a fleet's GPUs: --source " \
                              "prometheus or dcgm-exporter)"
        try:
            from .gpu_util import gpu_util_run
        except ImportError as e:
            return "skipped", f"the gpu-util probe is not available ({e})"
        path = self.files["gpu-util"] = self.out / "gpu-util.json"
        w = ResultWriter(Result(kind="gpu-util", meta=self.meta, config=self.backend.describe()), path)
        self.util = gpu_util_run(self.backend, max(self.opts.ctxs), self.opts.decode_tokens, GPU_UTIL_PERIOD_S, w,
                                 text="novel", telemetry=self.opts.telemetry, progress=self.progress)
        if self.util.summary.get("telemetry_error"):  # the request's numbers are kept in the file
            return "failed", self.util.summary["telemetry_error"]

    def _samples_gpus(self) -> bool:
        """Is there telemetry to sample: a fleet source given, or a GPU NVML sees here?"""
        return self.opts.telemetry is not None or bool(self.meta.gpus)

    def _measured_step(self) -> tuple[int, float, str] | None:
        if self.util is not None and self.util.summary.get("decode_step_ms"):
            return max(self.opts.ctxs), float(self.util.summary["decode_step_ms"]), "gpu-util decode"
        novel = [r for r in self.commit_rows if r["text"] == "novel" and r.get("decode_ms_per_step")
                 and r.get("tree") != "chain"]
        if novel:
            r = max(novel, key=lambda r: r["ctx"])
            return r["ctx"], float(r["decode_ms_per_step"]), "commit probe, novel text"
        return None

    def _sampled_preset(self) -> str | None:
        """The floor preset of the GPUs the gpu-util step read (a fleet's, through Prometheus or dcgm-exporter),
        if ddprobe knows their model."""
        gpus = (self.util.config.get("sampled_gpus") or []) if self.util is not None else []
        spec = next((s for s in (gpu_spec_for(g.get("name")) for g in gpus if isinstance(g, dict)) if s), None)
        return spec.name if spec else None

    def floor(self):
        preset = self.opts.gpu or (None if self.opts.bw_Bps else detect_gpu_preset(self.meta) or self._sampled_preset())
        bw_said = None
        if preset is None and self.opts.bw_Bps is None:
            if not (getattr(self.backend, "step_model", None) and self.backend.describe().get("device") == "cpu"):
                return "skipped", "no GPU detected and no --gpu or --bw given: no bandwidth to compare with"
            self.opts.bw_Bps = copy_bandwidth()  # the engine on the CPU: this machine's memory, measured
            bw_said = (f"measured: this machine's copy bandwidth ({COPY_BYTES >> 20} MiB copied, read + write), the "
                       "CPU's memory the engine streams through; no GPU preset")
        gpu = get_gpu(preset) if preset else None
        bw = self.opts.bw_Bps or gpu.bw_Bps
        step = self._measured_step()
        if step is None:
            if any(r.get("text") == "novel" for r in self.commit_rows):  # measured, but no step time to read
                return "skipped", (f"the {self.backend.name} backend reports no decode step time (only whole "
                                   "requests): no measured step to compare with the floor")
            return "skipped", "no decode step was measured (the commit probe did not finish)"
        ctx, step_ms, source = step
        queries = int(self.backend.describe().get("budget", 8)) + 1
        # where the step goes: every context whose novel-text step was measured (else the one step)
        timed = sorted({r["ctx"]: float(r["decode_ms_per_step"]) for r in self.commit_rows
                        if r["text"] == "novel" and r.get("decode_ms_per_step") and r.get("tree") != "chain"}.items()) \
            or [(ctx, step_ms)]
        ctxs, steps = [c for c, _ in timed], [t for _, t in timed]
        config = {"step_source": "commit probe, novel text" if len(timed) > 1 else source,
                  **({"bw_source": bw_said} if bw_said else {})}
        o = self.opts
        if getattr(self.backend, "step_model", None) is not None:  # the embedded engine: its own weights, one GPU
            from .bench.step_times import engine_step_model

            model = engine_step_model(self.backend, preset, bw, o.flops_per_s or (gpu.bf16_flops if gpu else None),
                                      decode_step=True, launch=o.launch, launch_any_gpu=o.launch_any_gpu)
            config.update(model=f"engine-{self.backend.describe().get('preset', '?')}", tp=1, ep=1, dcp=1,
                          weights="the engine's own", gpu=preset, bw_Bps=bw, flops_per_s=model.flops_per_s)
            result, rows = floor_result(model, ctxs, steps, queries=queries, config=config, meta=self.meta)
        else:  # a server: the model's weights on one GPU of the server's tp/ep/dcp, in its dtypes (as `floor`)
            sh = Sharding(tp=o.tp, ep=o.ep, dcp=o.dcp, weight_dtype=o.weight_dtype, expert_dtype=o.expert_dtype,
                          kv_dtype=o.kv_dtype, allreduce_us=o.allreduce_us, allreduce_from=o.allreduce_from)
            model, result, rows = served_floor(get_model(o.model), sh, ctxs, steps, gpu=preset, bw_Bps=o.bw_Bps,
                                               flops_per_s=o.flops_per_s, queries=queries, config=config,
                                               meta=self.meta, kernels=o.kernels, launch=o.launch,
                                               launch_any_gpu=o.launch_any_gpu)
        self.step_model = model
        path = self.files["floor"] = self.out / "floor.json"
        result.save(path)
        if any(r.below_floor for r in rows):
            return "ok", BELOW_FLOOR

    def advise(self):
        """Speculation on or off (``probes.advise``): the commit cells' commit length and verify step per text and
        context against the plain one-row decode step measured through the same path as `advise`'s
        (``step_times.plain_decode_ms`` on the embedded engine); a server's plain side is the step model's floor,
        said in every sentence as a bound, not a verdict."""
        from .advise import advise_result, points_from_commit

        model = getattr(self, "step_model", None)
        cells = [r for r in self.commit_rows if r.get("commit_len") and r.get("decode_ms_per_step")]
        if not cells:
            return "skipped", "no commit cell has a commit length and a step time"
        budget = max(int(r.get("budget") or self.backend.describe().get("budget", 8)) for r in cells)
        path = str(self.backend.describe().get("attn") or self.backend.name)
        ctxs = sorted({int(r["ctx"]) for r in cells})
        decode, source = self._plain_decode(ctxs)
        if decode is None and model is None:
            return "skipped", "no plain decode step measured and no floor to model plain decoding with"
        if decode is None:
            decode = {c: model.cost(c, 1).floor_ms for c in ctxs}
        cells = [r for r in cells if int(r["ctx"]) in decode]
        pts = points_from_commit(cells, {"budget": budget}, decode, path, "commit probe")
        result, _, _ = advise_result(pts, {"budget": budget, "path": path}, self.meta, step_model=model,
                                     decode_source=source, at_floor=False)
        path_out = self.files["advise"] = self.out / "advise.json"
        result.save(path_out)

    def _plain_decode(self, ctxs: list[int]) -> tuple[dict[int, float] | None, str | None]:
        """The plain decode step per context measured on the embedded engine (``step_times.plain_decode_ms``), and
        where it comes from; (None, None) for a backend without an engine here (a server)."""
        eng = getattr(self.backend, "engine", None)
        if eng is None:
            return None, None
        from .bench.step_times import plain_decode_ms

        ms = plain_decode_ms(eng, ctxs)
        if not ms:
            return None, None
        return ms, "measured: the engine's plain one-row decode step through the same path as `advise`"

    def verify(self):
        b = self.backend
        attention = getattr(b, "attention", None)
        if attention is None:
            return "skipped", "the paged vs split(_ws) comparison runs on the embedded engine only"
        if not str(b.describe().get("device")).startswith("cuda"):
            return "skipped", "the embedded engine runs on the CPU (--device cpu): Triton kernels need a GPU"
        from .bench.verify import compare

        shape, _, sm_scale = attention()
        path = self.files["verify"] = self.out / "verify.json"
        w = ResultWriter(Result(kind="bench-verify", meta=self.meta, config={"source": "ddprobe diagnose"}), path)
        _, summary = compare(self.opts.ctxs, shape, int(b.describe()["budget"]) + 1, sm_scale, on_row=w.add)
        w.result.summary.update(summary)
        w.flush()

    def requests(self) -> dict[str, list[tuple[str, int]]]:
        """The requests the run will measure, in order, per step: {"commit": [(kind, ctx)...], "gpu-util": [...]}
        (gpu-util only where there is telemetry: a fleet source, or a GPU NVML sees here)."""
        out = {"commit": cell_order(self.opts.ctxs, COMMIT_KINDS) * len(self._configs())}
        if self._samples_gpus():
            out["gpu-util"] = [("novel", max(self.opts.ctxs))]
        return out

    def run(self) -> None:
        """Run every step in order; each writes its file as soon as it has numbers."""
        if self.estimate is not None:
            self.record.result.config["estimate"] = self.estimate.to_dict()
        t0 = time.perf_counter()
        try:
            for name, fn in (("commit", self.commit), ("gpu-util", self.gpu_util), ("floor", self.floor),
                             ("advise", self.advise), ("verify", self.verify)):
                self._step(name, fn)
        finally:
            est = self.estimate
            measured = [r["seconds"] for r in self.record.result.rows if r.get("step") in ("commit", "gpu-util")]
            # the estimate covers the measured requests' steps
            self.record.result.summary["timing"] = timing_block(sum(measured), est,
                                                                all_steps_s=time.perf_counter() - t0)
            self.record.flush()

    def written(self) -> list[Path]:
        """The results files written so far, diagnose.json first (what the report reads)."""
        return [self.out / "diagnose.json"] + [p for p in self.files.values() if p.exists()]

