"""All-reduce latency at the step's message sizes (``ddprobe bench allreduce``) and the table the step
model reads back (``load_allreduce``).

Under tensor parallelism every layer all-reduces its hidden rows twice per step: a verify step's message
is (budget + 1) x hidden x dtype bytes, a plain decode step's 1 x hidden x dtype bytes. ``run_allreduce``
spawns ``ranks`` local processes (``python -c``, torch.distributed over tcp://127.0.0.1 on a free port):
NCCL on GPUs (one per rank; K all-reduces captured in one CUDA graph after a warm-up outside capture,
the replay timed with CUDA events; eager calls where capture fails, said in the row), gloo on CPUs
(K calls timed with perf_counter). Every sample starts after a barrier; rank 0's per-call time (sample
time / K) over ``samples`` samples gives the median and p10/p90. Before timing, each size is checked:
ranks 1..N reduce to N(N+1)/2. Rank 0 prints one row per size; the parent writes the results file
after each (``results.ResultWriter``): kind "allreduce", config {ranks, backend, graphs, device, dtype,
...}, rows {bytes, label, us, p10_us, p90_us, graphs, ...}.

``load_allreduce(path, ranks)`` -> the (bytes, us) points the step model interpolates between
(``step_model.comm_table``, ``--allreduce-from``): refuses in one line a file of another kind or of
another rank count.
Nothing here imports torch in this process.
"""
from __future__ import annotations

import datetime
import json
import math
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ...physics.shapes import dtype_bytes
from ...units import DDProbeError, fmt_bytes

KIND = "allreduce"
DEFAULT_CALLS = 20  # all-reduces per sample (captured in one graph on NCCL)
DEFAULT_SAMPLES = 30
MAX_MESSAGE = 1 << 34  # 16 GiB: --bytes's largest, and the largest size a file may say was measured


@dataclass(frozen=True)
class Message:
    bytes: int
    label: str  # "verify (9 rows)", "decode (1 row)", "given"


def step_messages(hidden: int, budget: int, dtype: str = "bf16", extra: list[float] | None = None) -> list[Message]:
    """The verify step's message (budget + 1 rows), the plain decode step's (1 row), then ``extra`` sizes."""
    if not 1 <= budget <= 1024:
        raise DDProbeError(f"--budget must be in 1..1024, got {budget}")
    row = int(hidden * dtype_bytes(dtype))
    out = [Message((budget + 1) * row, f"verify ({budget + 1} rows)"), Message(row, "decode (1 row)")]
    for b in extra or []:
        if not 1 <= b <= MAX_MESSAGE or b != int(b):
            raise DDProbeError(f"--bytes: message sizes are whole bytes, 1 B..16 GiB, got {b:g} B")
        out.append(Message(int(b), "given"))
    return out


@dataclass
class AllreduceOptions:
    ranks: int
    messages: list[Message]
    device: str = "cpu"  # "cpu" (gloo) or "cuda" (NCCL, one GPU per rank)
    dtype: str = "bf16"  # NCCL's element type (gloo: fp32 elements of the same bytes)
    graphs: bool = True  # NCCL: capture the K calls in a CUDA graph
    calls: int = DEFAULT_CALLS
    samples: int = DEFAULT_SAMPLES
    timeout_s: float = 300.0
    extra: dict = field(default_factory=dict)  # more config to record (model, budget, hidden)

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


def default_ranks(device: str) -> int:
    """GPUs visible on CUDA, else 2."""
    if device != "cuda":
        return 2
    import torch

    return torch.cuda.device_count()


def check(opts: AllreduceOptions) -> None:
    if opts.device not in ("cpu", "cuda"):
        raise DDProbeError(f"unknown device {opts.device!r}; known: auto, cpu, cuda")
    if opts.device == "cuda":
        import torch

        n = torch.cuda.device_count()
        if n == 0:
            raise DDProbeError("--device cuda: no CUDA GPU is visible to torch")
        if opts.ranks > n:
            raise DDProbeError(f"--ranks {opts.ranks} needs one GPU per rank; {n} visible")
    if opts.ranks < 1 or opts.ranks > 1024:
        raise DDProbeError(f"--ranks must be 1..1024, got {opts.ranks}")
    if opts.calls < 1 or opts.samples < 1:
        raise DDProbeError(f"--calls and --samples must be at least 1, got {opts.calls} and {opts.samples}")
    if not opts.messages:
        raise DDProbeError("no message sizes to measure")
    elt = int(dtype_bytes(opts.dtype)) if opts.device == "cuda" else 4  # gloo reduces fp32 elements
    odd = next((m for m in opts.messages if m.label == "given" and m.bytes % elt), None)
    if odd is not None:  # it would be rounded up to whole elements: another size than the one asked for
        raise DDProbeError(f"--bytes: {odd.bytes} B is not a whole number of {elt}-byte elements "
                           f"({opts.dtype if opts.device == 'cuda' else 'fp32, as gloo reduces'}); give a multiple "
                           f"of {elt} B")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_allreduce(opts: AllreduceOptions, writer, on_row=None) -> list[dict]:
    """Measure every message size on ``opts.ranks`` local processes; ``writer`` (a ``ResultWriter``) gets each
    row as rank 0 sends it, ``on_row(row)`` too. Returns the rows."""
    check(opts)
    port, root = free_port(), str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    if opts.device == "cpu" and sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # local ranks: the loopback, whatever the hostname says
    spec = {"world": opts.ranks, "port": port, "device": opts.device, "dtype": opts.dtype, "graphs": opts.graphs,
            "calls": opts.calls, "samples": opts.samples, "sizes": [m.bytes for m in opts.messages]}
    spec["timeout_s"] = opts.timeout_s
    with tempfile.TemporaryDirectory(prefix="ddprobe-allreduce-") as tmp:
        procs, errs = [], []
        try:
            for rank in range(opts.ranks):
                arg = json.dumps({**spec, "rank": rank})
                code = f"from ddprobe.probes.bench.allreduce import rank_main; rank_main({arg!r})"
                errs.append(open(Path(tmp) / f"rank{rank}.err", "w+"))
                procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stderr=errs[-1], text=True,
                                              stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL))
            return _collect(opts, procs, errs, writer, on_row)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
            for f in errs:
                f.close()


def _collect(opts: AllreduceOptions, procs, errs, writer, on_row) -> list[dict]:
    """Rank 0's rows as they come (one JSON object per line), each written at once; a rank that fails or a
    run past the timeout -> one line."""
    deadline, rows, lines = time.monotonic() + opts.timeout_s, [], queue.Queue()
    threading.Thread(target=_pump, args=(procs[0].stdout, lines), daemon=True).start()
    while len(rows) < len(opts.messages):
        failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
        if failed is not None:
            raise DDProbeError(f"all-reduce rank {failed} of {opts.ranks} ({opts.backend}) failed: "
                               f"{_last_line(errs[failed])}; {len(rows)} of {len(opts.messages)} sizes measured")
        if time.monotonic() > deadline:
            raise DDProbeError(f"all-reduce on {opts.ranks} ranks ({opts.backend}) took longer than "
                               f"{opts.timeout_s:g} s; {len(rows)} of {len(opts.messages)} sizes measured")
        try:
            line = lines.get(timeout=0.2)
        except queue.Empty:
            continue
        if line is None:  # rank 0 closed its output: its exit status says why on the next pass
            procs[0].wait()
            if procs[0].returncode == 0:
                raise DDProbeError(f"all-reduce rank 0 gave {len(rows)} of {len(opts.messages)} sizes")
            continue
        if line.startswith("{"):
            d = json.loads(line)
            row = {"bytes": d.pop("bytes"), "label": opts.messages[len(rows)].label, **d}
            rows.append(row)
            writer.add(row)
            if on_row is not None:
                on_row(row)
    for i, p in enumerate(procs):  # the others leave the group after the last size
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    return rows


def _pump(stream, lines: queue.Queue) -> None:
    """Rank 0's output lines into ``lines``, then None."""
    for x in stream:
        lines.put(x)
    lines.put(None)


def _last_line(f) -> str:
    f.flush()
    f.seek(0)
    last = [x for x in f.read().strip().splitlines() if x.strip()][-1:] or ["no message"]
    return last[0][:300]


# ---- one rank (a child process) ----------------------------------------------------------------------


def rank_main(spec_json: str) -> None:
    """A rank: join the group, then per size check the sum and time it; rank 0 prints one JSON row per size."""
    import torch
    import torch.distributed as dist

    s = json.loads(spec_json)
    rank, world, cuda = s["rank"], s["world"], s["device"] == "cuda"
    init = dict(backend="nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{s['port']}", rank=rank,
                world_size=world, timeout=datetime.timedelta(seconds=s["timeout_s"]))
    if cuda:
        torch.cuda.set_device(rank)
        init["device_id"] = torch.device("cuda", rank)  # the communicator now, not inside a capture
    dist.init_process_group(**init)
    try:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[s["dtype"]] if cuda \
            else torch.float32
        for nbytes in s["sizes"]:
            elt = torch.empty((), dtype=dtype).element_size()
            x = torch.empty(max(1, -(-nbytes // elt)), dtype=dtype, device="cuda" if cuda else "cpu")
            _check_sum(dist, x, rank, world)
            us, graphs = _time(torch, dist, x, s["calls"], s["samples"], cuda and s["graphs"])
            if rank == 0:
                q = statistics.quantiles(us, n=10, method="inclusive") if len(us) > 1 else [us[0]] * 9
                med = statistics.median(us)
                print(json.dumps({"bytes": x.numel() * elt, "us": med, "p10_us": q[0], "p90_us": q[8],
                                  "algbw_GBps": x.numel() * elt / med / 1e3, "graphs": graphs,
                                  "samples": len(us), "calls": s["calls"]}), flush=True)
    finally:
        dist.destroy_process_group()


def _check_sum(dist, x, rank: int, world: int) -> None:
    x.fill_(rank + 1)
    dist.all_reduce(x)
    want = world * (world + 1) / 2
    if float(x[0]) != want or float(x[-1]) != want:
        raise RuntimeError(f"all-reduce gave {float(x[0])}, want {want}: the ranks did not reduce")
    x.zero_()  # zeros stay zeros: the timed sums never overflow


def _time(torch, dist, x, calls: int, samples: int, graphs: bool) -> tuple[list[float], bool]:
    """Per-call microseconds of ``samples`` samples of ``calls`` all-reduces (CUDA: events around a graph replay,
    or around eager calls where capture fails; CPU: perf_counter)."""
    def many():
        for _ in range(calls):
            dist.all_reduce(x)

    if not x.is_cuda:
        many()  # warm-up
        out = []
        for _ in range(samples):
            dist.barrier()
            t0 = time.perf_counter()
            many()
            out.append((time.perf_counter() - t0) / calls * 1e6)
        return out, False
    run, captured = many, False
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture (NCCL's own setup, the kernels' first launch)
        many()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if graphs:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, capture_error_mode="thread_local"):  # NCCL's watchdog thread queries events
                many()
            run, captured = g.replay, True
        except Exception as e:  # noqa: BLE001  an NCCL or driver without graph support: time eager calls
            print(f"graph capture failed, timing eager calls: {type(e).__name__}: {e}"[:300], file=sys.stderr)
            torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    run()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        dist.barrier()
        torch.cuda.synchronize()
        e0.record()
        run()
        e1.record()
        e1.synchronize()
        out.append(e0.elapsed_time(e1) * 1e3 / calls)
    return out, captured


# ---- the table the step model reads ----------------------------------------------------------------


def load_allreduce(path: str | os.PathLike, ranks: int) -> list[tuple[float, float]]:
    """The (bytes, median us) points of a ``bench allreduce`` file measured on ``ranks`` ranks, sorted by bytes
    (one line otherwise); ``step_model.comm_table`` interpolates between them. Every number is checked as the
    options that measured it are: ranks 1..1024, sizes 1 B..16 GiB, times 1 us..1 h (``units.check_measured``),
    samples and calls at least 1."""
    from ...results import Result
    from ...units import check_measured

    r = Result.load(path)
    check_measured(r.kind, r.rows, str(path))
    if r.kind != KIND:
        raise DDProbeError(f"{path}: not an all-reduce file (kind {r.kind!r}; `ddprobe bench allreduce` writes one)")
    have = r.config.get("ranks")
    if not isinstance(have, int) or isinstance(have, bool) or not 1 <= have <= 1024:
        raise DDProbeError(f"{path}: config 'ranks' is {have!r} (must be a whole number 1..1024)")
    if have != ranks:
        raise DDProbeError(f"{path}: all-reduce measured on {have} ranks, the model asks for {ranks}: measure with "
                           f"`ddprobe bench allreduce --ranks {ranks}`")
    pts: dict[int, float] = {}
    for i, row in enumerate(r.records, 1):  # typed rows (schema.AllreduceRow), times in range (load_one)
        if row.us is None:
            raise DDProbeError(f"{path}: row {i} ({fmt_bytes(row.bytes)}): 'us' is null (no latency measured)")
        if row.bytes > MAX_MESSAGE:
            raise DDProbeError(f"{path}: row {i}: 'bytes' is {row.bytes} (must be 1 B..16 GiB)")
        for key in ("samples", "calls"):
            if getattr(row, key) == 0:
                raise DDProbeError(f"{path}: row {i} ({fmt_bytes(row.bytes)}): {key!r} is 0 (must be at least 1)")
        pts[row.bytes] = min(row.us, pts.get(row.bytes, math.inf))
    if not pts:
        raise DDProbeError(f"{path}: the all-reduce file has no rows")
    return [(float(b), u) for b, u in sorted(pts.items())]


def allreduce_origin(path: str | os.PathLike, gpu: str | None = None) -> str:
    """Where a ``bench allreduce`` file was measured, said on the floor's communication line: its backend and device
    (config ``backend``, ``device``; the GPU meta names), and, for a file measured on the CPU (gloo) feeding the floor
    of GPU preset ``gpu``, that its latencies are not that GPU's interconnect's (said, not refused)."""
    from ...results import Result

    r = Result.load(path)
    backend, device = r.config.get("backend"), r.config.get("device")
    name = r.meta.gpu_name if device != "cpu" else None
    where = f"{backend or 'backend not recorded'} on " + (
        "the CPU" if device == "cpu" else str(name or device or "a device not recorded"))
    if device == "cpu" and gpu:
        where += f": a CPU measurement, not the {gpu}'s interconnect (measure on the GPUs for their floor)"
    return where
