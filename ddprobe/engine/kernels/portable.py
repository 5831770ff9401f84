"""`split`'s portable build on the GPU at hand: the code `split.ARCHS` makes for the GPUs without a Hopper kernel,
timed where only Hopper cards are lent.

`split` on sm_80 (A100), sm_86/89 and sm_120 (the RTX PRO 6000 Blackwell of the investigation) is Triton's
mma.sync + cp.async code with that GPU's tiling (``split.ARCHS``: pointer loads, 64 x 64 tiles in 163 KB on sm_80,
32 x 32 in 99 KB on sm_86/89/120). A build of `split` for sm_90 says nothing about that code (it runs wgmma and
bulk tensor copies), so here the launches are compiled for the portable target with Triton's compiler
(``_target_compile``: any target, no GPU needed), and the PTX (not the cubin: sm_80/sm_89 machine code does not run
on sm_90) is handed to the CUDA driver (``cuModuleLoadData`` through Triton's driver module), which JIT-compiles it
for the card at hand; Triton's launcher then launches it on torch's current stream (CUDA graphs capture it).

``BUILDS``: ``sm_120`` is the tiling of the sm_120 entry (the same as sm_86/89's) compiled for sm_89's PTX, the
newest mma.sync target whose PTX a Hopper driver compiles (an sm_120a PTX does not run on sm_90); ``sm_80`` is the
sm_80 entry's tiling compiled for sm_80. The grid is sized for the card at hand (its SM count), the tiles and
shared memory are the target's (checked against the target's per-block limit, not the card's).
What this times is a PROXY: those GPUs' code on Hopper's SMs, caches and memory, never an sm_120 (or A100) figure.

Bad input is one line (``PortableUnavailable``): an unknown build, a card older than the PTX target, a driver that
cannot JIT the PTX, a tiling that does not fit the rows or the target's shared memory.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import split
from .merge import merge_launch
from .plan import VerifyPlan


@dataclass(frozen=True)
class Build:
    name: str
    tiling: tuple[int, int]   # the split.ARCHS entry whose tuning, shared memory and rows limit are used
    ptx: tuple[int, int]      # the compute capability the PTX is compiled for


BUILDS = {
    "sm_120": Build("sm_120", (12, 0), (8, 9)),
    "sm_80": Build("sm_80", (8, 0), (8, 0)),
}


class PortableUnavailable(RuntimeError):
    """This portable build cannot run here (one line: why)."""


def build_of(name: str) -> Build:
    b = BUILDS.get(name)
    if b is None:
        raise ValueError(f"unknown portable build {name!r}; known: {', '.join(BUILDS)}")
    return b


def describe(name: str, gpu: str = "this GPU") -> str:
    """What a row timed with this build is, in one line."""
    b = build_of(name)
    a = split.ARCHS[b.tiling]
    t = a.tuning
    return (f"proxy: split's {b.name} tiling ({t.block_q or 64} rows x {t.block_n} tokens x {t.num_stages} stages, "
            f"{t.num_warps} warps, pointer loads, {a.smem:,} B per block) compiled to sm_{b.ptx[0]}{b.ptx[1]} PTX "
            f"(mma.sync) and JIT-compiled by the driver for {gpu}: those GPUs' code on this GPU's memory, "
            f"not an {b.name} figure")


def base_tuning(name: str) -> split.SplitTuning:
    """The tuning the build starts from: its split.ARCHS entry's."""
    return split.ARCHS[build_of(name).tiling].tuning


def plan(prefix_len, tree_mask: torch.Tensor, v_dim: int = 512, *, build: str, heads: int,
         tuning: split.SplitTuning | None = None, max_prefix: int | None = None, dtype: torch.dtype = torch.bfloat16,
         rope_dim: int = 64) -> VerifyPlan:
    """`split`'s plan with the tiling of ``build`` (its tuning, or ``tuning`` given, and its shared-memory limit)
    and this card's SM count; PortableUnavailable (one line) where the card is older than the PTX target or the
    tiling does not fit."""
    b = build_of(build)
    dev = tree_mask.device
    if dev.type != "cuda":
        raise PortableUnavailable(f"the portable build {b.name} runs on a CUDA GPU (the driver JIT-compiles its PTX)")
    cap = torch.cuda.get_device_capability(dev)
    if tuple(cap) < b.ptx:
        raise PortableUnavailable(f"the portable build {b.name}: its PTX targets sm_{b.ptx[0]}{b.ptx[1]}, this GPU is "
                                  f"sm_{cap[0]}{cap[1]}")
    try:
        p = split.plan(prefix_len, tree_mask, None, v_dim, tuning=tuning, heads=heads, max_prefix=max_prefix,
                       dtype=dtype, rope_dim=rope_dim, arch=b.tiling)
    except ValueError as e:
        raise PortableUnavailable(f"the portable build {b.name}: {_first_line(e)}") from None
    if p.extra.get("fallback"):
        raise PortableUnavailable(f"the portable build {b.name}: {p.extra['fallback']}")
    p.extra["portable"] = {"build": b, "kernels": {}}
    return p


_binders: dict = {}


def _bind(fn, cap: tuple[int, int], args: tuple, kw: dict):
    """(target, backend, bound argument values in the kernel's order, specialization key) of a launch of ``fn``
    compiled for ``cap`` (Triton's binder, as ``_target_compile.compile_launch`` uses it)."""
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    from ._target_compile import target

    key = (fn, cap)
    if key not in _binders:
        tgt = target(cap)
        backend = make_backend(tgt)
        _binders[key] = (tgt, backend, create_function_from_signature(fn.signature, fn.params, backend))
    tgt, backend, binder = _binders[key]
    bound, spec, opts = binder(*args, **kw)
    return tgt, backend, bound, spec, opts


def compile_for(b: Build, role: str, fn, args: tuple, kw: dict):
    """(CompiledKernel for the build's PTX target, not loaded; the argument values in the kernel's order; the
    specialization key). PortableUnavailable (one line) where it does not compile or does not fit the target's
    shared memory. Needs no GPU."""
    import triton
    from triton.compiler import ASTSource

    tgt, backend, bound, spec, opts = _bind(fn, b.ptx, args, kw)
    options, signature, constexprs, attrs = fn._pack_args(backend, kw, bound, spec, opts)
    try:
        k = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=tgt, options=options.__dict__)
    except Exception as e:  # noqa: BLE001  (Triton's compile and ptxas errors: one line)
        raise PortableUnavailable(f"the portable build {b.name}'s {role} kernel does not compile for "
                                  f"sm_{b.ptx[0]}{b.ptx[1]}: {_first_line(e)}") from None
    limit = split.ARCHS[b.tiling].smem
    if k.metadata.shared > limit:
        raise PortableUnavailable(f"the portable build {b.name}'s {role} kernel needs {k.metadata.shared:,} B of "
                                  f"shared memory, more than {b.name}'s {limit:,} B per block")
    return k, list(bound.values()), (role, repr(spec))


def _kernel(p: VerifyPlan, role: str, fn, args: tuple, kw: dict):
    """The compiled launch (a CompiledKernel whose image is the PTX, loaded and JIT-compiled by the driver) and the
    argument values; compiled once per plan, role and specialization."""
    port = p.extra["portable"]
    b: Build = port["build"]
    _, _, bound, spec, _ = _bind(fn, b.ptx, args, kw)
    key = (role, repr(spec))
    k = port["kernels"].get(key)
    if k is None:
        k, _, key = compile_for(b, role, fn, args, kw)
        k.kernel = k.asm["ptx"].encode()  # the driver JIT-compiles the PTX for this GPU at load
        try:
            k._init_handles()
        except Exception as e:  # noqa: BLE001  (the driver's JIT refused it: an older driver, a PTX version)
            raise PortableUnavailable(f"the driver could not JIT-compile the portable build {b.name}'s {role} PTX "
                                      f"for this GPU: {_first_line(e)}") from None
        port["kernels"][key] = k
    return k, list(bound.values())


def _first_line(e: BaseException) -> str:
    return ((str(e).strip().splitlines() or [type(e).__name__])[0])[:200]


def _report(k) -> dict:
    b = k.metadata
    return {"n_regs": k.n_regs, "n_spills": k.n_spills, "shared": b.shared, "name": b.name,
            "ptx_target": getattr(b, "target", None) and f"sm_{b.target.arch}",
            "mma_sync": k.asm["ptx"].count("mma.sync"), "wgmma": k.asm["ptx"].count("wgmma")}


def run(q: torch.Tensor, kv: torch.Tensor, p: VerifyPlan, sm_scale: float, *, meta: dict | None = None) -> torch.Tensor:
    """q [R, H, D], kv [rows, D] contiguous layout -> out [R, H, v_dim]: `split`'s two launches of the plan's
    portable build (PortableUnavailable, one line, where they cannot run here)."""
    if "portable" not in p.extra:
        raise ValueError("plan was not built by portable.plan")
    split.check_run_args(q, kv, p)
    r, h, _ = q.shape
    cfg, parts = split.config_for(p, h, q.dtype, q.shape[2] - p.v_dim), p.extra["partials"]
    if cfg is not p.extra["config"]:
        raise ValueError(f"the portable plan was built for {p.extra['heads']} heads; got {h}")
    fn, grid, args, kw = split.prefix_launch(q, kv, p, sm_scale, cfg, parts, tma_ok=False, compiled=True)
    k, full = _kernel(p, "prefix", fn, args, kw)
    k[(*grid, 1)](*full)
    out = torch.empty(r, h, p.v_dim, dtype=q.dtype, device=q.device)
    mfn, mgrid, margs, mkw = merge_launch(parts, cfg["num_splits"], out, p.extra["merge"])
    mk, mfull = _kernel(p, "merge", mfn, margs, mkw)
    mk[(*mgrid, 1)](*mfull)
    if meta is not None:
        meta["prefix"], meta["merge"] = _report(k), _report(mk)
    return out


refresh = split.refresh
