"""Compile a tree-verify launch for an NVIDIA GPU target on a machine without one, and read what the code holds.

``paged`` renders SGLang's extend kernel; whether its memory traffic and launch match SGLang's can be checked
without a GPU: both launches are compiled for the same target (``GPUTarget("cuda", 90, 32)`` for sm_90a) with
Triton's own compiler and ptxas, from the arguments each launcher passes, specialized as a launch would specialize
them (Triton's binder: 16-byte aligned pointers and integers divisible by 16 marked, integers equal to 1 folded).
``split_launches`` builds `split`'s two launches (its prefix kernel with the tree part, and the merge) with the
configuration its plan chooses for that GPU, and ``hopper_only`` lists the sm_90-only instructions in a kernel's PTX.
``extend_launches`` records both launches (SGLang's ``extend_attention_fwd`` with its module's ``_fwd_kernel``
swapped for a recorder and its GPU-capability globals set to the target's for the duration of the call, restored
after; ``paged.verify_launch`` for ddprobe's), ``compile_launch`` compiles one, ``code_report`` counts the global
loads in the PTX (``ld.global``) and the SASS (``LDG``), the local-memory spills in the SASS (``STL`` / ``LDL``),
and reads the registers, stack and shared memory from the cubin (Triton's ``cuobjdump -res-usage``); ``ptx_body``
is the entry function's PTX without debug lines, for an exact comparison.

Triton's binder and argument packing are private API (checked on Triton 3.9); the rest is public.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from contextlib import contextmanager
from typing import Any

import torch
import triton


def target(cap: tuple[int, int]):
    """Triton's GPUTarget of a CUDA compute capability (warp size 32)."""
    from triton.backends.compiler import GPUTarget

    return GPUTarget("cuda", cap[0] * 10 + cap[1], 32)


def compile_launch(fn, cap: tuple[int, int], args: tuple, kwargs: dict):
    """The kernel ``fn[grid](*args, **kwargs)`` would run on a GPU of capability ``cap``, compiled here (a Gluon
    kernel through Gluon's own source class, as its JIT compiles it: Triton's would lose the warp-specialized
    partitions' warp counts)."""
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    source = ASTSource
    if type(fn).__name__ == "GluonJITFunction":
        from triton.experimental.gluon._runtime import GluonASTSource as source
    tgt = target(cap)
    backend = make_backend(tgt)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, spec, opts = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, spec, opts)
    return triton.compile(source(fn, signature, constexprs, attrs), target=tgt, options=options.__dict__)


class _Recorder:
    """Stands in for a Triton kernel: ``rec[grid](*args, **kw)`` records the launch instead of running it."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((grid, args, kw))


@contextmanager
def _sglang_targeting(cap: tuple[int, int]):
    """SGLang's extend module as it would run on ``cap`` (its ``_is_cuda`` / ``CUDA_CAPABILITY`` globals), with its
    ``_fwd_kernel`` recorded, not launched; everything restored on exit."""
    from . import _sglang_import

    g = _sglang_import.load().extend_attention_fwd.__globals__
    names = ("_fwd_kernel", "_is_cuda", "_is_hip", "CUDA_CAPABILITY")
    saved = {n: g[n] for n in names if n in g}
    rec = _Recorder(g["_fwd_kernel"])
    g.update(_fwd_kernel=rec, _is_cuda=True, _is_hip=False, CUDA_CAPABILITY=cap)
    try:
        yield rec
    finally:
        for n in names:
            if n in saved:
                g[n] = saved[n]
            else:
                g.pop(n, None)


def extend_launches(cap: tuple[int, int], q: torch.Tensor, kv: torch.Tensor, prefix: int, tree_mask: torch.Tensor,
                    slots: torch.Tensor, v_dim: int, sm_scale: float) -> dict[str, tuple[Any, tuple, dict]]:
    """{"sglang": ..., "paged": ...}: each path's tree-verify launch (kernel, args, kwargs) for a GPU of ``cap``,
    built by each launcher from the same host plan and inputs (CPU tensors stand in for device memory)."""
    from . import paged, sglang
    from ._common import dot_flags

    with _sglang_targeting(cap) as rec:
        sglang.run(q, kv, sglang.plan(prefix, tree_mask, slots, v_dim), sm_scale)
    _, s_args, s_kw = rec.calls[-1]
    bm, bn, nw = paged.extend_blocks(cap)
    p = paged.plan(prefix, tree_mask, slots, v_dim, tuning=paged.PagedTuning(block_m=bm, block_n=bn, num_warps=nw))
    out = torch.empty(q.shape[0], q.shape[1], v_dim, dtype=q.dtype)
    _, p_args, p_kw = paged.verify_launch(q, kv, p, sm_scale, out, False, dot_flags(q.dtype)[1])  # compiled: no UPCAST
    return {"sglang": (rec.fn, s_args, s_kw), "paged": (paged._paged_verify_kernel, p_args, p_kw)}


def split_launches(cap: tuple[int, int], heads: int, r: int = 9, v_dim: int = 512, rope: int = 64,
                   dtype: torch.dtype = torch.bfloat16, ctx: int = 4096, tuning=None) -> dict[str, tuple[Any, tuple, dict]]:
    """{"prefix": ..., "merge": ...}: `split`'s two launches (kernel, args, kwargs) as its plan for a GPU of ``cap``
    chooses them (``split.ARCHS``: the tuning and shared memory of that GPU, or ``tuning`` given; the prefix kernel
    holds the tree part, its last split index), for ``heads`` x ``r`` rows of ``v_dim + rope`` values (CPU tensors
    stand in for device memory); tensor descriptors from sm_90 up, as ``split.run`` uses them."""
    from . import split
    from .merge import merge_launch
    from .trees import shape_mask

    g = torch.Generator().manual_seed(heads * 131 + r)
    q = torch.randn(r, heads, v_dim + rope, generator=g).to(dtype)
    kv = torch.randn(ctx + r + 16, v_dim + rope, generator=g).to(dtype)
    p = split.plan(ctx, shape_mask("lopsided", r - 1), None, v_dim, heads=heads, dtype=dtype, rope_dim=rope, arch=cap,
                   tuning=tuning)
    cfg = split.config_for(p, heads)
    fn, _, args, kw = split.prefix_launch(q, kv, p, 0.1, cfg, p.extra["partials"], tma_ok=cap[0] >= 9, compiled=True)
    out = torch.empty(r, heads, v_dim, dtype=dtype)
    mfn, _, margs, mkw = merge_launch(p.extra["partials"], cfg["num_splits"], out, p.extra["merge"])
    return {"prefix": (fn, args, kw), "merge": (mfn, margs, mkw)}


HOPPER_ONLY = ("wgmma", "setmaxnreg", "cp.async.bulk.tensor", "mbarrier.try_wait.parity")


def hopper_only(compiled) -> list[str]:
    """The sm_90-only PTX instructions (warpgroup MMA, register reallocation, bulk tensor copies and the mbarrier waits
    they complete on) in a compiled kernel: none belongs in a kernel built for a GPU without them."""
    ptx = compiled.asm["ptx"]
    return [op for op in HOPPER_ONLY if re.search(r"\b" + re.escape(op) + r"\b", ptx)]


def _tool(name: str, *args: str) -> str:
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    return subprocess.run([path, *args], capture_output=True, text=True, check=True).stdout


def code_report(compiled) -> dict:
    """Global loads (PTX ``ld.global``, SASS ``LDG``), spills (SASS ``STL``/``LDL``), registers, stack and shared
    memory of a kernel compiled by ``compile_launch``."""
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as d:
        cubin = os.path.join(d, "k.cubin")
        with open(cubin, "wb") as f:
            f.write(compiled.asm["cubin"])
        sass = _tool("cuobjdump", "-sass", cubin)
        res = _tool("cuobjdump", "-res-usage", cubin)
    usage = dict(re.findall(r"(REG|STACK):(\d+)", res))
    return {"ld_global": len(re.findall(r"\bld\.global\b", ptx)), "ldg": len(re.findall(r"\bLDG\b", sass)),
            "stl": len(re.findall(r"\bSTL\b", sass)), "ldl": len(re.findall(r"\bLDL\b", sass)),
            "regs": int(usage.get("REG", -1)), "stack": int(usage.get("STACK", -1)),
            "shared": int(compiled.metadata.shared), "num_warps": int(compiled.metadata.num_warps),
            "num_stages": int(compiled.metadata.num_stages)}


def ptx_body(compiled) -> str:
    """The kernel's PTX instructions without debug lines, line-info labels and the kernel's name: two kernels whose
    bodies are equal compile to the same code."""
    ptx, name = compiled.asm["ptx"], compiled.metadata.name
    start = ptx.index(".visible .entry")
    body = ptx[start:ptx.index("\n}\n", start)]  # the entry function; the debug sections follow it
    return "\n".join(ln.replace(name, "K") for ln in body.splitlines()
                     if not re.match(r"\s*(\.loc\b|//|\$L__tmp\d+:)", ln))


_SHARED_OPS = {"ldmatrix": r"\bldmatrix\.", "ld_shared": r"\bld\.shared\.", "st_shared": r"\bst\.shared\.",
               "cp_async": r"\bcp\.async\.c[ag]\.", "commit_group": r"\bcp\.async\.commit_group",
               "mma": r"\bmma\.sync\b", "bar_sync": r"\b(bar|barrier)\.sync\b"}


def loop_report(compiled) -> dict:
    """What one trip of the kernel's main loop (the PTX loop, closed by a backward branch, that issues the most
    mma.sync) executes per warp: ldmatrix, ld.shared, st.shared, cp.async (16-byte copies), commit groups, mma.sync and
    bar.sync counts, and ``shared_read``, the bytes one warp reads from shared memory (ldmatrix .x1/.x2/.x4: 128 B a
    matrix; ld.shared by its vector width and type). Empty where no loop issues mma.sync."""
    lines = compiled.asm["ptx"].splitlines()
    labels = {m.group(1): i for i, ln in enumerate(lines) if (m := re.match(r"^\$(L__BB\d+_\d+):", ln.strip()))}
    best: dict = {}
    for i, ln in enumerate(lines):
        m = re.search(r"\bbra(\.uni)?\s+\$(L__BB\d+_\d+);", ln)
        if not (m and labels.get(m.group(2), i) < i):
            continue
        body = "\n".join(lines[labels[m.group(2)]:i + 1])
        rep = {k: len(re.findall(v, body)) for k, v in _SHARED_OPS.items()}
        rd = sum(128 * int(x) for x in re.findall(r"ldmatrix\.sync\.aligned\.m8n8\.x(\d)", body))
        rd += sum(32 * int(v or 1) * int(bits) // 8 for v, bits in re.findall(r"ld\.shared(?:\.v(\d))?\.[bfsu](\d+)", body))
        rep["shared_read"] = rd
        if rep["mma"] > best.get("mma", 0):
            best = rep
    return best
