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
from ..shapes import get_gpu, gpu_spec_for
from ..step_shape import BELOW_FLOOR
from ..units import DDProbeError
from .backends import Backend
from .commit import CellProgress, cell_order, run_commit_probe
from .anatomy import fit_anatomy
from .estimate import timing_block
from .floor import FloorInput, floor_table
from .models import get_model

# Every file a diagnosis writes in its folder (the report last): an earlier run's are never replaced unasked.
FILES = ("diagnose.json", "commit.json", "gpu-util.json", "floor.json", "verify.json", "report.html")


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
    seed: int = 0
    # run_gpu_util's source ({"reader_factory", "window"}, ``cli.gpu_source.open_source``); None: NVML here
    telemetry: dict[str, Any] | None = None


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

    def _step(self, name: str, fn: Callable[[], tuple[str, str] | None]) -> None:
        t0 = time.perf_counter()
        self.say(f"{name}: running...")
        try:
            out = fn()
            status, reason = out if out else ("ok", "")
        except DDProbeError as e:
            status, reason = "failed", str(e)
        except KeyboardInterrupt:
            self.record.add({"step": name, "status": "interrupted", "reason": "interrupted by the user",
                             "file": None, "seconds": time.perf_counter() - t0})
            raise
        except Exception as e:  # a bug or a GPU error in one step must not lose the others
            status, reason = "failed", f"{type(e).__name__}: {e}".splitlines()[0]
            (self.out / f"{name}.error.txt").write_text(traceback.format_exc())
        self.record.add({"step": name, "status": status, "reason": reason,
                         "file": self.files[name].name if name in self.files else None,
                         "seconds": time.perf_counter() - t0})
        self.say(f"{name}: {status}" + (f": {reason}" if reason else ""))

    # ---- steps ------------------------------------------------------------------------
    def commit(self):
        path = self.files["commit"] = self.out / "commit.json"
        w = ResultWriter(Result(kind="commit", meta=self.meta, config={
            "ctx": self.opts.ctxs, "text": list(COMMIT_KINDS), "max_new_tokens": self.opts.max_new_tokens,
            **self.backend.describe()}), path)
        self.commit_rows = run_commit_probe(self.backend, self.opts.ctxs, list(COMMIT_KINDS),
                                            self.opts.max_new_tokens, w, seed=self.opts.seed, progress=self.progress)

    def gpu_util(self):
        if not self._samples_gpus():
            return "skipped", "no NVIDIA GPU visible to NVML on this machine (a fleet's GPUs: --source " \
                              "prometheus or dcgm-exporter)"
        try:
            from .gpu_util import run_gpu_util
        except ImportError as e:
            return "skipped", f"the gpu-util probe is not available ({e})"
        path = self.files["gpu-util"] = self.out / "gpu-util.json"
        w = ResultWriter(Result(kind="gpu-util", meta=self.meta, config=self.backend.describe()), path)
        self.util = run_gpu_util(self.backend, max(self.opts.ctxs), self.opts.decode_tokens, GPU_UTIL_PERIOD_S, w,
                                 text="novel", progress=self.progress, **(self.opts.telemetry or {}))
        if self.util.summary.get("telemetry_error"):  # the request's numbers are kept in the file
            return "failed", self.util.summary["telemetry_error"]

    def _samples_gpus(self) -> bool:
        """Is there telemetry to sample: a fleet source given, or a GPU NVML sees here?"""
        return self.opts.telemetry is not None or bool(self.meta.gpus)

    def _measured_step(self) -> tuple[int, float, str] | None:
        if self.util is not None and self.util.summary.get("decode_step_ms"):
            return max(self.opts.ctxs), float(self.util.summary["decode_step_ms"]), "gpu-util decode"
        novel = [r for r in self.commit_rows if r["text"] == "novel" and r.get("decode_ms_per_step")]
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
        if preset is None and self.opts.bw_Bps is None:
            return "skipped", "no GPU detected and no --gpu or --bw given: no bandwidth to compare with"
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
        o = self.opts
        attention = getattr(self.backend, "attention", None)  # the embedded engine knows its own shape and dtype
        if attention is not None:
            shape, kv_dtype, _ = attention()
            name = f"engine-{self.backend.describe().get('preset', '?')}"
            weights = self.backend.step_weights(rows=queries)  # the engine's own weights (one GPU's share)
            sharding = {"tp": 1, "ep": 1, "weights": "the engine's own"}
        else:
            spec = get_model(o.model)
            shape, kv_dtype, name = spec.attn, "bf16", o.model
            # the whole step: the model's weights on one GPU of the server's tp/ep, in its dtypes
            weights = spec.step_weights(rows=queries, tp=o.tp, ep=o.ep, dense_dtype=o.weight_dtype,
                                        expert_dtype=o.expert_dtype)
            sharding = {"tp": o.tp, "ep": o.ep, "weight_dtype": o.weight_dtype, "expert_dtype": o.expert_dtype}
        inp = FloorInput(attn=shape, bw_Bps=bw, queries=queries, tp=sharding["tp"], kv_dtype=kv_dtype,
                         flops_per_s=gpu.bf16_flops if gpu else None, step=weights)
        # where the step goes: every context whose novel-text step was measured (else the one step)
        timed = sorted({r["ctx"]: float(r["decode_ms_per_step"]) for r in self.commit_rows
                        if r["text"] == "novel" and r.get("decode_ms_per_step")}.items()) or [(ctx, step_ms)]
        rows = floor_table(inp, [c for c, _ in timed], [t for _, t in timed])
        summary = {}
        if len(timed) > 1:
            try:
                summary["anatomy"] = fit_anatomy([c for c, _ in timed], [t for _, t in timed],
                                                 kv_B_per_token=rows[0].kv_B_per_token, bw_Bps=bw,
                                                 weight_floor_ms=rows[0].weight_floor_ms).to_dict()
            except DDProbeError as e:  # the rows are kept; the anatomy says why it is missing
                summary["anatomy_error"] = str(e)
        path = self.files["floor"] = self.out / "floor.json"
        Result(kind="floor", meta=self.meta, rows=[r.to_dict() for r in rows], summary=summary,
               config={"model": name, "queries": queries, **sharding, "gpu": preset, "bw_Bps": bw,
                       "flops_per_s": inp.flops_per_s, "kv_dtype": inp.kv_dtype,
                       "step_source": "commit probe, novel text" if len(timed) > 1 else source}).save(path)
        if any(r.below_floor for r in rows):
            return "ok", BELOW_FLOOR

    def verify(self):
        b = self.backend
        attention = getattr(b, "attention", None)
        if attention is None:
            return "skipped", "the paged vs split(_ws) comparison runs on the embedded engine only"
        if not str(b.describe().get("device")).startswith("cuda"):
            return "skipped", "the embedded engine runs on the CPU (--device cpu): Triton kernels need a GPU"
        from .verify_bench import compare

        shape, _, sm_scale = attention()
        path = self.files["verify"] = self.out / "verify.json"
        w = ResultWriter(Result(kind="bench-verify", meta=self.meta, config={"source": "ddprobe diagnose"}), path)
        _, summary = compare(self.opts.ctxs, shape, int(b.describe()["budget"]) + 1, sm_scale, on_row=w.add)
        w.result.summary.update(summary)
        w.flush()

    def requests(self) -> dict[str, list[tuple[str, int]]]:
        """The requests the run will measure, in order, per step: {"commit": [(kind, ctx)...], "gpu-util": [...]}
        (gpu-util only where there is telemetry: a fleet source, or a GPU NVML sees here)."""
        out = {"commit": cell_order(self.opts.ctxs, COMMIT_KINDS)}
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
                             ("verify", self.verify)):
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

