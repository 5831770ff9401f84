"""The CUDA C++ prefix kernel of `split_ws` (WsTuning.cuda = 1): load the prebuilt cubin, encode TMA maps, launch.

``cuda/seesaw_sm90.cu`` is compiled offline for sm_90a (``python -m ddprobe.engine.kernels._cu --build``, nvcc
12.3 or newer; no GPU needed) into ``cuda/seesaw_sm90.cubin``, which ships with the package beside a stamp of the
SHA-256 of the source and of the cubin (a test fails when either changed without the other). The shipped cubin is
nvcc 13.0's, so it needs a CUDA 13 driver (R580 or newer); with an older one `split_ws` warns and runs its
Gluon kernel (WsTuning.cuda = -1), or the cubin can be rebuilt with the local nvcc. At run time the cubin is
loaded through the CUDA driver API (``libcuda.so.1`` via ctypes) into the context torch uses, so there is no
extension build and no compiler on the GPU machine. Launches go to torch's current stream, so they are captured
by CUDA graphs like any kernel; the two TMA descriptors travel by value as kernel parameters.
DDPROBE_CU_CUBIN=PATH loads another build of the same source instead (a schedule variant, see the source's
DDP_* macros); DDPROBE_CU_L2PROMO=0..3 sets the TMA maps' L2 promotion (measurement hooks).
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

_CU_TENSOR_MAP_DTYPE = {"bfloat16": 9, "float16": 6}
_SWIZZLE_128B = 3
_L2_PROMOTION_128B = 2
_ATTR_MAX_DYNAMIC_SHARED = 8


def _l2_promotion() -> int:
    """The TMA maps' L2 promotion (CUtensorMapL2promotion: 0 none, 1 64 B, 2 128 B, 3 256 B); 128 B unless
    DDPROBE_CU_L2PROMO says otherwise (a measurement hook)."""
    v = os.environ.get("DDPROBE_CU_L2PROMO", "")
    return int(v) if v in ("0", "1", "2", "3") else _L2_PROMOTION_128B


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
_funcs: dict = {}   # (device index, kernel, cubin path) -> (module, function), or the LoadError it raised


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
        _lib = lib
    return _lib


def _check(rc: int, what: str) -> None:
    if rc:
        msg = ctypes.c_char_p()
        _driver().cuGetErrorString(rc, ctypes.byref(msg))
        raise RuntimeError(f"{what}: CUDA error {rc} ({msg.value.decode() if msg.value else 'unknown'})")


def _function(name: str, device) -> ctypes.c_void_p:
    """The kernel ``name`` loaded into the primary context of ``device`` (once per device; a load that failed is
    not retried: its LoadError is raised again)."""
    import torch

    cubin = pathlib.Path(os.environ.get("DDPROBE_CU_CUBIN") or CUBIN)  # a locally rebuilt or variant cubin
    key = (device.index, name, str(cubin))
    if key not in _funcs:
        if not cubin.exists():
            raise LoadError(f"{cubin.name} is missing: build it with python -m ddprobe.engine.kernels._cu --build")
        with torch.cuda.device(device):
            torch.empty(1, device=device)  # the runtime makes the primary context current on this thread
            try:
                lib = _driver()
                mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
                _check(lib.cuModuleLoadData(ctypes.byref(mod), cubin.read_bytes()), f"loading {cubin.name}")
                _check(lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), f"finding {name}")
                _check(lib.cuFuncSetAttribute(fn, _ATTR_MAX_DYNAMIC_SHARED, SMEM_BYTES), "setting shared memory")
            except (OSError, AttributeError, RuntimeError) as e:
                _funcs[key] = LoadError(str(e))
                raise _funcs[key] from None
        _funcs[key] = (mod, fn)
    if isinstance(_funcs[key], LoadError):
        raise _funcs[key]
    return _funcs[key][1]


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
                                            box, elem, 0, _SWIZZLE_128B, _l2_promotion(), 0), "encoding a TMA map")
    return buf, tm


def launch_seesaw(q2, kv, num_cols: int, bits, piece_ptr, pieces, o_part, lse_part, prefix_len: int, h: int,
                  qk_scale: float) -> dict:
    """Launch the seesaw prefix kernel on torch's current stream: q2 [hq, 576] and kv [>= num_cols, 576] (bf16 or
    fp16), one program per entry of the piece table (split_ws.cu_pieces: piece_ptr [programs + 1] and pieces
    [n, 6] int32 on the device); writes o_part / lse_part as the Gluon prefix kernel does. ``qk_scale`` (the
    softmax scale times log2 e) must be positive. Returns a small report for ``meta``."""
    import torch

    name = KERNELS[str(kv.dtype).removeprefix("torch.")]
    fn = _function(name, kv.device)
    hq = q2.shape[0]
    programs = piece_ptr.numel() - 1
    keep = [tensor_map(q2, hq, BLOCK_M), tensor_map(kv, num_cols, 64)]
    args = [keep[0][1], keep[1][1], ctypes.c_uint64(bits.data_ptr()), ctypes.c_uint64(piece_ptr.data_ptr()),
            ctypes.c_uint64(pieces.data_ptr()), ctypes.c_uint64(o_part.data_ptr()),
            ctypes.c_uint64(lse_part.data_ptr()), ctypes.c_int64(o_part.stride(0)), ctypes.c_int64(o_part.stride(1)),
            ctypes.c_int32(prefix_len), ctypes.c_int32(hq), ctypes.c_int32(h), ctypes.c_float(qk_scale)]
    params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
    with torch.cuda.device(kv.device):  # the context the function was loaded into is the current one
        stream = torch.cuda.current_stream(kv.device).cuda_stream
        _check(_driver().cuLaunchKernel(fn, programs, 1, 1, THREADS, 1, 1, SMEM_BYTES, ctypes.c_void_p(stream),
                                        params, None), f"launching {name}")
    return {"name": name, "shared": SMEM_BYTES, "threads": THREADS, "programs": programs,
            "pieces": pieces.shape[0]}


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
