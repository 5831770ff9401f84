"""The CUDA C++ kernels of `split_ws` (the prefix kernel, split_ws.choose's "cuda", and the merge of its partials, fused
into the prefix kernel's launch after a grid barrier or as its own launch): load the prebuilt cubin, encode TMA
maps, launch.

``cuda/seesaw_sm90.cu`` is compiled offline for sm_90a (``python -m ddprobe.engine.kernels._cu --build``, nvcc
12.3 or newer; no GPU needed) into ``cuda/seesaw_sm90.cubin``, which ships with the package beside a stamp of the
SHA-256 of the source and of the cubin (a test fails when either changed without the other). The shipped cubin is
nvcc 13.0's, so it needs a CUDA 13 driver (R580 or newer); with an older one a `split_ws` plan on the CUDA
kernel is a one-line error (the Gluon tail kernel and the Triton merge still run), or the cubin can be rebuilt
with the local nvcc. At run time the cubin is loaded through the CUDA driver API (``libcuda.so.1`` via ctypes)
into the context torch uses, so there is no extension build and no compiler on the GPU machine. Launches go to torch's current stream, so they are captured
by CUDA graphs like any kernel; the two TMA descriptors travel by value as kernel parameters.
Nothing here imports torch or touches the driver at import time.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent / "cuda"
SOURCE = HERE / "seesaw_sm90.cu"
CUBIN = HERE / "seesaw_sm90.cubin"
STAMP = HERE / "seesaw_sm90.cubin.sha256"   # SHA-256 of the source and of the cubin built from it
NVCC_FLAGS = ("-O3", "-arch=sm_90a", "-cubin", "-std=c++17", "-Xptxas", "-v")
SMEM_BYTES = 231832   # the kernel's SMEM_BYTES (a static_assert there keeps the two equal)
THREADS = 256
BLOCK_M = 64
KERNELS = {"bfloat16": "ddp_seesaw_bf16", "float16": "ddp_seesaw_f16"}
MERGE_KERNELS = {"bfloat16": "ddp_merge_bf16", "float16": "ddp_merge_f16"}
P16_SUFFIX = "_p16"  # the kernels whose partials are in the input's 16-bit type (WsTuning.part_bits 16)
MERGE_THREADS = 256
MERGE_MAX_PARTS = 1024   # the merge's MERGE_MAX_PARTS (weights kept in shared memory)

_CU_TENSOR_MAP_DTYPE = {"bfloat16": 9, "float16": 6}
_SWIZZLE_128B = 3
_L2_PROMOTION_128B = 2  # the TMA maps' L2 promotion (CUtensorMapL2promotion 2: 128 B; the others measured within 1%)
_ATTR_MAX_DYNAMIC_SHARED = 8


def source_hash() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def stamp_text(cubin: pathlib.Path = CUBIN) -> str:
    """What STAMP holds: the SHA-256 of the source and of the cubin built from it."""
    return f"{source_hash()}  {SOURCE.name}\n{hashlib.sha256(cubin.read_bytes()).hexdigest()}  {cubin.name}\n"


def build(nvcc: str | None = None, out: pathlib.Path = CUBIN) -> str:
    """Compile the source into ``out`` (and, for the shipped CUBIN, write STAMP); returns ptxas's report.
    RuntimeError (one line) when nvcc is missing or fails."""
    nvcc = nvcc or shutil.which("nvcc")
    if not nvcc:
        raise RuntimeError("nvcc not found (CUDA 12.3 or newer is needed to build the sm_90a cubin)")
    r = subprocess.run([nvcc, *NVCC_FLAGS, "-o", str(out), str(SOURCE)], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"nvcc failed: {(r.stderr or r.stdout).strip().splitlines()[-1]}")
    if out == CUBIN:
        STAMP.write_text(stamp_text())
    return r.stderr


class LoadError(RuntimeError):
    """The driver, the cubin or its kernel could not be loaded here."""


class _TensorMap(ctypes.Structure):
    _fields_ = [("opaque", ctypes.c_uint64 * 16)]   # CUtensorMap: 128 bytes, 64-byte aligned


_lib = None
_funcs: dict = {}   # (device index, cubin path) -> the loaded module or the LoadError its load raised;
                    # (device index, cubin path, kernel) -> the function


def _driver():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuTensorMapEncodeTiled.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
            ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.cuLaunchKernel.argtypes = [
            ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        lib.cuFuncGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_void_p]
        _lib = lib
    return _lib


def _check(rc: int, what: str) -> None:
    if rc:
        msg = ctypes.c_char_p()
        _driver().cuGetErrorString(rc, ctypes.byref(msg))
        raise RuntimeError(f"{what}: CUDA error {rc} ({msg.value.decode() if msg.value else 'unknown'})")


def _function(name: str, device, smem: int = SMEM_BYTES) -> ctypes.c_void_p:
    """The kernel ``name`` loaded into the primary context of ``device`` with ``smem`` bytes of dynamic shared
    memory allowed (the cubin once per device, each kernel once; a load that failed is not retried: its LoadError
    is raised again)."""
    import torch

    cubin = CUBIN  # read at call time (a test points it at a file that is no cubin)
    key = (device.index, str(cubin))
    fkey = (*key, name)
    if fkey not in _funcs:
        if key not in _funcs and not cubin.exists():
            raise LoadError(f"{cubin.name} is missing: build it with python -m ddprobe.engine.kernels._cu --build")
        with torch.cuda.device(device):
            torch.empty(1, device=device)  # the runtime makes the primary context current on this thread
            try:
                if key not in _funcs:
                    mod = ctypes.c_void_p()
                    _check(_driver().cuModuleLoadData(ctypes.byref(mod), cubin.read_bytes()), f"loading {cubin.name}")
                    _funcs[key] = mod
            except (OSError, AttributeError, RuntimeError) as e:
                _funcs[key] = LoadError(str(e))
            if isinstance(_funcs[key], LoadError):
                raise _funcs[key]
            fn = ctypes.c_void_p()
            try:
                _check(_driver().cuModuleGetFunction(ctypes.byref(fn), _funcs[key], name.encode()), f"finding {name}")
                if smem:
                    _check(_driver().cuFuncSetAttribute(fn, _ATTR_MAX_DYNAMIC_SHARED, smem), "setting shared memory")
                _funcs[fkey] = fn
            except RuntimeError as e:
                _funcs[fkey] = LoadError(str(e))
    if isinstance(_funcs[fkey], LoadError):
        raise _funcs[fkey]
    return _funcs[fkey]


def kernel_name(table: dict, dtype, o_part) -> str:
    """The kernel of ``table`` (KERNELS, MERGE_KERNELS) for q/kv of ``dtype`` and partials ``o_part``: fp32
    partials, or 16-bit ones of the same dtype (the *_p16 kernels); ValueError for anything else."""
    name = table[str(dtype).removeprefix("torch.")]
    if o_part.dtype == dtype:
        return name + P16_SUFFIX
    if str(o_part.dtype) != "torch.float32":
        raise ValueError(f"the CUDA kernels take fp32 partials or {dtype} ones, got {o_part.dtype}")
    return name


def _mps_limited() -> bool:
    """Whether CUDA MPS may give this process fewer SMs than the device has (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    below 100): the fused merge's grid barrier could then wait for programs that never start."""
    try:
        return float(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")) < 100
    except ValueError:
        return True


def stream_of(device_index: int) -> int:
    """The handle of torch's current stream on this device (torch's raw accessor: a fraction of a microsecond,
    against a few for torch.cuda.current_stream(...).cuda_stream, which it falls back to)."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device_index) if raw is not None else torch.cuda.current_stream(device_index).cuda_stream


def tensor_map(t, rows: int, box_rows: int):
    """A TMA descriptor of the 2-D tensor ``t`` ([>= rows, width], unit column stride, 16-byte aligned rows) seen
    as ``rows`` rows (rows past it read as zeros), boxes of [box_rows, 64] in the 128-byte swizzle. Returns the
    backing buffer and the descriptor (keep both alive until the launch)."""
    buf = ctypes.create_string_buffer(128 + 64)
    tm = _TensorMap.from_address((ctypes.addressof(buf) + 63) & ~63)
    dims = (ctypes.c_uint64 * 2)(t.shape[1], rows)
    strides = (ctypes.c_uint64 * 1)(t.stride(0) * t.element_size())
    box = (ctypes.c_uint32 * 2)(64, box_rows)
    elem = (ctypes.c_uint32 * 2)(1, 1)
    dt = _CU_TENSOR_MAP_DTYPE[str(t.dtype).removeprefix("torch.")]
    _check(_driver().cuTensorMapEncodeTiled(ctypes.byref(tm), dt, 2, ctypes.c_void_p(t.data_ptr()), dims, strides,
                                            box, elem, 0, _SWIZZLE_128B, _L2_PROMOTION_128B, 0), "encoding a TMA map")
    return buf, tm


_ATTR_LOCAL_BYTES, _ATTR_NUM_REGS = 3, 4  # CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, CU_FUNC_ATTRIBUTE_NUM_REGS


def resources(fn) -> dict:
    """Registers per thread and local-memory spills of a loaded kernel, as the driver reports them (``n_spills``:
    local bytes per thread / 4, Triton's convention, so bench verify's regs/spill line reads the same for both)."""
    regs, local = ctypes.c_int(-1), ctypes.c_int(-1)
    _driver().cuFuncGetAttribute(ctypes.byref(regs), _ATTR_NUM_REGS, fn)
    _driver().cuFuncGetAttribute(ctypes.byref(local), _ATTR_LOCAL_BYTES, fn)
    return {"n_regs": regs.value, "n_spills": local.value // 4 if local.value >= 0 else None}


class Launcher:
    """One plan's launch of the seesaw kernel, built once (plan time): the function, the parameter block (the
    plan's bitmask, grid, partial buffers, device prefix length) and the TMA maps of the q and kv
    tensors it has met, cached by address and shape. A call only points the block at q's and kv's maps (encoded on
    first sight) and launches on torch's current stream, so an eager call costs a few microseconds of host time.

    The grid is the row-block x split grid (n_qb x grid_splits programs) the kernel derives from the live prefix
    length.
    fuse_parts > 0: the merge of that many partials can run inside the launch (a call given ``out``), after a grid
    barrier on a counter of the launcher's own; only where the grid is one wave (at most ``sms`` programs, one per
    SM) and no MPS thread percentage below 100 limits the SMs, else ``fused`` is False and a call given ``out``
    raises. The barrier needs every program resident at once: kernels on other streams only delay that, but two
    fused launches running concurrently on different streams, or a context given fewer SMs than the device has
    (green contexts), would wait forever: keep WsTuning.merge_kind -2 (the default) there."""

    MAX_MAPS = 512   # cached TMA maps (per role) before the cache is cleared

    def __init__(self, device, dtype, hq: int, h: int, r: int, num_cols: int, bits, prefix_t, o_part, lse_part,
                 n_qb: int, grid_splits: int, fold: int, fuse_parts: int = 0, sms: int = 0):
        import torch

        self.device = torch.device(device)
        self.name = kernel_name(KERNELS, dtype, o_part)
        self.fn = _function(self.name, self.device)
        self.hq, self.num_cols = hq, num_cols
        self.programs = n_qb * grid_splits
        self.fused = 1 <= fuse_parts <= MERGE_MAX_PARTS and self.programs <= sms and not _mps_limited()
        counter = torch.zeros(1, dtype=torch.int64, device=self.device) if self.fused else None
        self._keep = (bits, prefix_t, o_part, lse_part, counter)   # what the block points at stays alive
        self._maps: dict = {}
        self.scale = ctypes.c_float(1.0)
        self._args = [ctypes.c_uint64(bits.data_ptr()), ctypes.c_uint64(o_part.data_ptr()),
                      ctypes.c_uint64(lse_part.data_ptr()),
                      ctypes.c_int64(o_part.stride(0)), ctypes.c_int64(o_part.stride(1)),
                      ctypes.c_uint64(prefix_t.data_ptr()), ctypes.c_int32(hq), ctypes.c_int32(h), self.scale,
                      ctypes.c_int32(r), ctypes.c_int32(n_qb), ctypes.c_int32(grid_splits), ctypes.c_int32(fold)]
        # the fused merge: out (0: none), its row and head strides, the barrier's counter, the partials
        self.out, self.stride_or, self.stride_oh = ctypes.c_uint64(0), ctypes.c_int64(0), ctypes.c_int64(0)
        self._args += [self.out, self.stride_or, self.stride_oh,
                       ctypes.c_uint64(counter.data_ptr() if counter is not None else 0),
                       ctypes.c_int32(fuse_parts if self.fused else 0)]
        self.params = (ctypes.c_void_p * (2 + len(self._args)))(
            None, None, *[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in self._args])
        self.report = {"name": self.name, "shared": SMEM_BYTES, "threads": THREADS, "programs": self.programs,
                       **resources(self.fn)}
        self.fused_report = {**self.report, "merge": "fused", "partials": fuse_parts}

    def _map(self, t, rows: int) -> int:
        """The address of the TMA map of ``t`` seen as 2-D rows of its last dimension (``t`` contiguous but for
        its row stride), encoded on first sight (the cache holds (address, backing buffer))."""
        key = (t.data_ptr(), t.stride(-2), rows)
        m = self._maps.get(key)
        if m is None:
            buf, tm = tensor_map(t.reshape(-1, t.shape[-1]), rows, 64)
            m = self._maps[key] = (ctypes.addressof(tm), buf)
        return m[0]

    def __call__(self, q2, kv, qk_scale: float, stream: int, out=None) -> dict:
        """Launch on ``stream`` (torch's current stream's handle): q2 [hq, 576] (or a contiguous [R, H, 576]) and
        kv [>= num_cols, 576] of the plan's dtype, 16-byte aligned rows; ``qk_scale`` (the softmax scale times
        log2 e) > 0. ``out`` [R, H, 512] of the plan's dtype (unit column stride, strides of whole 4-value groups,
        8-byte aligned): the merge runs inside the launch (``fused`` launchers only)."""
        if len(self._maps) >= self.MAX_MAPS - 1:  # room for both maps: none freed between lookup and launch
            self._maps.clear()
        self.params[0] = self._map(q2, self.hq)
        self.params[1] = self._map(kv, self.num_cols)
        self.scale.value = qk_scale
        if out is None:
            self.out.value = 0
        elif not self.fused:
            raise ValueError(f"{self.name}: this launcher cannot merge (its grid is not one wave or has no partials)")
        else:
            self.out.value = out.data_ptr()
            self.stride_or.value, self.stride_oh.value = out.stride(0), out.stride(1)
        rc = _driver().cuLaunchKernel(self.fn, self.programs, 1, 1, THREADS, 1, 1, SMEM_BYTES, stream, self.params,
                                      None)
        if rc:
            _check(rc, f"launching {self.name}")
        return self.report if out is None else self.fused_report


class MergeLauncher:
    """One plan's launch of the merge (ddp_merge_*): out [R, H, 512] (16-bit, unit column stride) from the plan's
    n_parts partials of hq = R H folded rows, built once (plan time); a call only points the block at ``out``.
    The grid is hq programs x ``slices`` column slices of 512 / slices (more slices where the rows are few, so
    the grid covers the SMs)."""

    def __init__(self, device, dtype, o_part, lse_part, hq: int, h: int, n_parts: int, sms: int):
        import torch

        if not 1 <= n_parts <= MERGE_MAX_PARTS:
            raise ValueError(f"the CUDA merge takes 1 to {MERGE_MAX_PARTS} partials, got {n_parts}")
        self.device = torch.device(device)
        self.name = kernel_name(MERGE_KERNELS, dtype, o_part)
        self.fn = _function(self.name, self.device, smem=0)
        self.hq, self.h = hq, h
        self.slices = next(s for s in (1, 2, 4) if hq * s >= 2 * sms or s == 4)
        self._keep = (o_part, lse_part)
        self.out = ctypes.c_uint64(0)
        self.stride_or, self.stride_oh = ctypes.c_int64(h * 512), ctypes.c_int64(512)
        self._args = [ctypes.c_uint64(o_part.data_ptr()), ctypes.c_uint64(lse_part.data_ptr()), self.out,
                      self.stride_or, self.stride_oh, ctypes.c_int64(o_part.stride(0)),
                      ctypes.c_int64(o_part.stride(1)), ctypes.c_int32(hq), ctypes.c_int32(h),
                      ctypes.c_int32(n_parts)]
        self.params = (ctypes.c_void_p * len(self._args))(
            *[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in self._args])
        self.report = {"name": self.name, "threads": MERGE_THREADS, "programs": hq * self.slices,
                       "partials": n_parts, **resources(self.fn)}

    def __call__(self, out, stream: int) -> dict:
        """Launch on ``stream`` into ``out`` [R, H, 512] of the plan's dtype, unit column stride, 8-byte aligned."""
        self.out.value = out.data_ptr()
        self.stride_or.value, self.stride_oh.value = out.stride(0), out.stride(1)
        rc = _driver().cuLaunchKernel(self.fn, self.hq, self.slices, 1, MERGE_THREADS, 1, 1, 0, stream, self.params,
                                      None)
        if rc:
            _check(rc, f"launching {self.name}")
        return self.report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["--build"]:
        print("usage: python -m ddprobe.engine.kernels._cu --build", file=sys.stderr)
        return 2
    try:
        report = build()
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    lines = [ln for ln in report.splitlines() if "Used" in ln or "spill" in ln]
    print("\n".join(lines) + f"\nwrote {CUBIN} ({CUBIN.stat().st_size} B) and {STAMP.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
