"""GPU telemetry through NVML: one reading per GPU per tick (the sampler thread is ``probes.telemetry.sampler``).

Per GPU per tick (``Sampler.period_s``, default 0.2 s) one row, keys carrying units:
instant and average power, the enforced power limit, the energy counter, SM and memory
clocks with the clock-event reasons (power cap, thermal), NVML utilization (gpu, memory),
memory used, and on Hopper and newer the GPM metrics over the window between this tick's
sample and the previous one (SM utilization and occupancy, any-tensor and HMMA
utilization, DRAM bandwidth utilization, FP32/FP16 utilization).

Every NVML call is wrapped: a missing function, an ``NVMLError`` or a GPM metric whose own
``nvmlReturn`` is not success records ``None`` (never 0) and the reason in ``sources``.
``pynvml`` (package nvidia-ml-py) is imported lazily; nothing here imports torch.
"""
from __future__ import annotations

from typing import Any, Callable

from ... import signals
from ...signals import TABLE
from .sources import SourceUnavailable

DEFAULT_PERIOD_S = 0.2

# (row key, pynvml constant name): GPM metrics read over two consecutive samples
GPM_METRICS = [(s.key, s.gpm) for s in TABLE if s.gpm]
# clock-event reason bits (values of nvmlClocksEventReason*; the older names are ThrottleReason*)
REASONS = {"power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40, "power_brake": 0x80,
           "idle": 0x1}
# nvmlFieldValue_t.valueType -> the union member holding the value
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
NUMERIC_KEYS = signals.NUMERIC_KEYS


class NvmlUnavailable(SourceUnavailable):
    pass


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".strip().rstrip(":")


class NvmlReader:
    """One NVML session over every visible GPU; ``read(i)`` returns one row of readings for GPU ``i``.
    A ``sources.TelemetrySource``: ``open()`` lists the GPUs, ``sample()`` reads one row each, ``close()``."""

    kind = "nvml"

    def __init__(self, nvml: Any = None):
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as e:
                raise NvmlUnavailable(f"no NVIDIA GPU visible to NVML: pynvml (nvidia-ml-py) is not installed "
                                      f"({e})") from None
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded...
            raise NvmlUnavailable(f"no NVIDIA GPU visible to NVML: {_reason(e)}") from None
        try:
            n = nvml.nvmlDeviceGetCount()
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        except Exception as e:
            self.close()
            raise NvmlUnavailable(f"no NVIDIA GPU visible to NVML: {_reason(e)}") from None
        if not self.handles:
            self.close()
            raise NvmlUnavailable("no NVIDIA GPU visible to NVML: the driver lists 0 devices")
        self.sources: dict[str, str] = {}  # signal -> "ok" or why it is missing
        self._gpm_prev: list[Any] = [None] * len(self.handles)
        self._gpm_ok = [self._gpm_supported(i) for i in range(len(self.handles))]

    def open(self) -> list[dict[str, Any]]:
        return [{"index": i, "name": self.name(i)} for i in range(len(self.handles))]

    def sample(self) -> list[dict[str, Any]]:
        return [self.read(i) for i in range(len(self.handles))]

    def close(self) -> None:
        for s in getattr(self, "_gpm_prev", []):
            if s is not None:
                self._call("gpm_free", lambda s=s: self.nvml.nvmlGpmSampleFree(s))
        try:
            self.nvml.nvmlShutdown()
        except Exception:
            pass

    # ---- helpers -------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run one NVML call; on any failure record why under ``what`` and return None."""
        try:
            v = fn()
        except Exception as e:  # NVMLError_NotSupported, AttributeError (old pynvml), FunctionNotFound...
            self.sources.setdefault(what, f"missing: {_reason(e)}")
            return None
        self.sources.setdefault(what, "ok")
        return v

    def _const(self, name: str):
        return getattr(self.nvml, name, None)

    def _gpm_supported(self, i: int) -> bool:
        sup = self._call("gpm", lambda: self.nvml.nvmlGpmQueryDeviceSupport(self.handles[i]))
        if sup is None:
            return False
        if not getattr(sup, "isSupportedDevice", 0):
            self.sources["gpm"] = "missing: nvmlGpmQueryDeviceSupport says this GPU has no GPM (before Hopper?)"
            return False
        return True

    def name(self, i: int) -> str:
        n = self._call("name", lambda: self.nvml.nvmlDeviceGetName(self.handles[i]))
        return n.decode() if isinstance(n, bytes) else str(n)

    # ---- one tick ------------------------------------------------------------------------
    def read(self, i: int) -> dict[str, Any]:
        nv, h = self.nvml, self.handles[i]
        row: dict[str, Any] = {k: None for k in NUMERIC_KEYS}
        row["clock_reasons"] = None
        fields = [(k, self._const(c)) for k, c in (("power_W", "NVML_FI_DEV_POWER_INSTANT"),
                                                   ("power_avg_W", "NVML_FI_DEV_POWER_AVERAGE"))]
        vals = self._call("field_values", lambda: nv.nvmlDeviceGetFieldValues(h, [f for _, f in fields
                                                                                     if f is not None]))
        for j, (key, fid) in enumerate(k for k in fields if k[1] is not None):
            if vals is None:
                break
            v = vals[j]
            if v.nvmlReturn != 0:
                self.sources.setdefault(key, f"missing: field value returned NVML code {v.nvmlReturn}")
                continue
            self.sources.setdefault(key, "ok (nvmlDeviceGetFieldValues)")
            raw = getattr(v.value, _VALUE_FIELDS.get(v.valueType, "dVal"))
            row[key] = float(raw) / 1e3  # mW -> W
        if row["power_W"] is None:  # older drivers: the plain (averaged) power reading
            mw = self._call("power_usage", lambda: nv.nvmlDeviceGetPowerUsage(h))
            row["power_W"] = None if mw is None else mw / 1e3
        lim = self._call("power_limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
        row["power_limit_W"] = None if lim is None else lim / 1e3
        mj = self._call("energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h))
        row["energy_J"] = None if mj is None else mj / 1e3
        row["sm_clock_MHz"] = self._call("sm_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        row["mem_clock_MHz"] = self._call("mem_clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))
        get_reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons")
        bits = self._call("clock_reasons", lambda: get_reasons(h))
        if bits is not None:
            row["clock_reasons"] = ",".join(n for n, b in REASONS.items() if bits & b) or "none"
        u = self._call("util", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if u is not None:
            row["util_gpu_pct"], row["util_mem_pct"] = float(u.gpu), float(u.memory)
        m = self._call("memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        row["mem_used_GB"] = None if m is None else m.used / 1e9
        if self._gpm_ok[i]:
            row.update(self._gpm(i))
        return row

    def _gpm(self, i: int) -> dict[str, float | None]:
        nv = self.nvml
        out: dict[str, float | None] = {}
        cur = self._call("gpm", lambda: nv.nvmlGpmSampleAlloc())
        if cur is None or self._call("gpm", lambda: nv.nvmlGpmSampleGet(self.handles[i], cur)) is None:
            return out
        prev, self._gpm_prev[i] = self._gpm_prev[i], cur
        if prev is None:  # the first tick only opens the window
            return out
        try:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_METRICS)
            mg.sample1, mg.sample2 = prev, cur
            for j, (_, cname) in enumerate(GPM_METRICS):
                mg.metrics[j].metricId = getattr(nv, cname)
            res = self._call("gpm", lambda: nv.nvmlGpmMetricsGet(mg))
        finally:
            self._call("gpm_free", lambda: nv.nvmlGpmSampleFree(prev))
        if res is None:
            return out
        for j, (key, cname) in enumerate(GPM_METRICS):
            met = res.metrics[j]
            if met.nvmlReturn != 0:  # checked per metric: unsupported stays missing, never 0
                self.sources.setdefault(key, f"missing: {cname} returned NVML code {met.nvmlReturn}")
                out[key] = None
            else:
                self.sources.setdefault(key, f"ok ({cname})")
                out[key] = float(met.value)
        return out


def require_nvml(reader_factory: Callable[[], Any] = NvmlReader) -> list[str]:
    """Names of the GPUs NVML sees; raises ``NvmlUnavailable`` ("no NVIDIA GPU visible to NVML: ...") if none."""
    reader = reader_factory()
    try:
        return [reader.name(i) for i in range(len(reader.handles))]
    finally:
        reader.close()
