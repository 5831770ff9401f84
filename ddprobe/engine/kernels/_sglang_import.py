"""Load SGLang's own Triton attention kernels from an installed ``sglang`` without importing its server.

``import sglang`` (and any ``sglang.srt...`` module) runs ``sglang/__init__.py`` and ``sglang/srt/utils/__init__``,
which pull in the whole server (psutil, transformers, zmq, ...). The kernel files themselves need only torch, Triton,
three or four predicates from ``sglang.srt.utils`` and, in newer releases, sibling kernel files and the stdlib-only
``sglang/srt/environ.py``. So ``load()``:

1. finds the installed package's folder with ``importlib.util.find_spec("sglang")`` (which does not execute it) and
   its version from the distribution metadata;
2. picks the kernel folder: ``srt/layers/attention/triton_ops/`` (0.5.14, the tested pin) or
   ``kernels/ops/attention/`` (0.5.23 and later);
3. for the duration of the load only, puts ddprobe's stand-in ``_sglang_utils`` under the name ``sglang.srt.utils``
   and a meta-path finder first in ``sys.meta_path`` that serves: the kernel folder's files and
   ``sglang.srt.environ`` from their real files, and every parent package (``sglang``, ``sglang.srt``, ...) as an
   empty namespace (its ``__init__`` never runs); any other ``sglang`` module is refused;
4. execs ``extend_attention``, ``decode_attention`` and ``metadata`` from that folder, then removes every ``sglang``
   name it added to ``sys.modules`` (a real ``import sglang`` later is unaffected);
5. checks the entry points' signatures against the arguments ddprobe passes (``inspect.signature``): a release whose
   kernels take other arguments is refused with its version named.

No SGLang code is copied into ddprobe: the functions returned are SGLang's, executed from the installed files.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from .plan import PathUnavailable

PINNED = "0.5.14"  # the release the tests run (pyproject's [sglang] extra, .ci/run)
INSTALL = f"pip install --no-deps sglang=={PINNED}  (or pip install 'ddprobe[sglang]')"
KERNEL_DIRS = ("srt/layers/attention/triton_ops", "kernels/ops/attention")  # 0.5.14, 0.5.23+
EXTRA_FILES = {"sglang.srt.environ": "srt/environ.py"}  # stdlib-only settings module newer kernel files read
MODULES = ("extend_attention", "decode_attention", "metadata")
# the leading parameters ddprobe passes, by position, and the keywords it names
EXTEND_ARGS = ("q_extend", "k_extend", "v_extend", "o_extend", "k_buffer", "v_buffer", "qo_indptr", "kv_indptr",
               "kv_indices", "custom_mask", "is_causal", "mask_indptr", "max_len_extend", "k_scale", "v_scale",
               "sm_scale", "logit_cap", "skip_prefix_custom_mask")
DECODE_ARGS = ("q", "k_buffer", "v_buffer", "o", "kv_indptr", "kv_indices", "attn_logits", "attn_lse",
               "num_kv_splits", "max_kv_splits", "sm_scale", "k_scale", "v_scale")
DECODE_KW = ("has_mla", "use_pdl")
SPLITS_ARGS = ("num_kv_splits_ptr", "seq_lens_ptr", "num_seq", "num_group", "num_head", "num_kv_head",
               "max_kv_splits", "device_core_count", "MAX_NUM_SEQ")


class SGLangUnavailable(PathUnavailable):
    """SGLang's kernels cannot be loaded here; the message (one line) says why and what to do."""


@dataclass(frozen=True)
class SGLangKernels:
    version: str
    folder: str  # the kernel folder the files were executed from
    extend_attention_fwd: Callable
    decode_attention_fwd: Callable
    get_num_kv_splits_triton: Any  # a Triton kernel: launched as SGLang's get_num_kv_splits launches it


class _Finder(importlib.abc.MetaPathFinder):
    """Serves ``sglang.*`` during one load: kernel files and environ from disk, parents as empty namespaces."""

    def __init__(self, root: Path, kdir: str):
        self.root, self.kdir = root, root / kdir

    def find_spec(self, name, path=None, target=None):
        if name != "sglang" and not name.startswith("sglang."):
            return None
        rel = name.split(".")[1:]
        node = self.root.joinpath(*rel)
        if name in EXTRA_FILES:
            return importlib.util.spec_from_file_location(name, self.root / EXTRA_FILES[name])
        if node.with_suffix(".py").parent == self.kdir and node.with_suffix(".py").is_file():
            return importlib.util.spec_from_file_location(name, node.with_suffix(".py"))
        if node.is_dir():  # a parent package: a namespace, so its __init__ (the server) never runs
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(node)]
            return spec
        raise ImportError(f"SGLang's kernel files import {name}, which ddprobe does not load")


def _root() -> Path:
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise SGLangUnavailable(f"the sglang path needs SGLang's Triton kernels: {INSTALL}")
    return Path(list(spec.submodule_search_locations)[0])


def _version(root: Path) -> str:
    for dist in importlib.metadata.distributions(path=[str(root.parent)]):
        if (dist.metadata["Name"] or "").lower() == "sglang":
            return dist.version
    return "unknown"


def _check(fn, want: tuple[str, ...], kw: tuple[str, ...], what: str, version: str) -> None:
    params = list(inspect.signature(fn).parameters)
    if tuple(params[: len(want)]) != want or any(k not in params for k in kw):
        raise SGLangUnavailable(f"sglang {version}: {what} takes ({', '.join(params[:len(want) + 2])}, ...), not "
                                f"the arguments ddprobe passes; the tested version is {PINNED} ({INSTALL})")


def _exec_files(root: Path, kdir: str) -> dict[str, Any]:
    from . import _sglang_utils

    before = {k: v for k, v in sys.modules.items() if k == "sglang" or k.startswith("sglang.")}
    finder = _Finder(root, kdir)
    sys.meta_path.insert(0, finder)
    sys.modules["sglang.srt.utils"] = _sglang_utils
    base = "sglang." + kdir.replace("/", ".")
    try:
        return {m: importlib.import_module(f"{base}.{m}") for m in MODULES}
    finally:
        sys.meta_path.remove(finder)
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            if k not in before:
                del sys.modules[k]
        sys.modules.update(before)


def load_from(root: Path) -> SGLangKernels:
    """SGLang's kernels from the package folder ``root`` (``.../site-packages/sglang``)."""
    version = _version(root)
    kdir = next((d for d in KERNEL_DIRS if (root / d / "extend_attention.py").is_file()), None)
    if kdir is None:
        raise SGLangUnavailable(f"sglang {version} has no Triton extend_attention.py under "
                                f"{' or '.join(KERNEL_DIRS)}; the tested version is {PINNED} ({INSTALL})")
    try:
        mods = _exec_files(root, kdir)
    except (ImportError, AttributeError, SyntaxError) as e:
        raise SGLangUnavailable(f"sglang {version}: its kernel files do not load without the server "
                                f"({type(e).__name__}: {str(e)[:160]}); the tested version is {PINNED}") from None
    try:
        k = SGLangKernels(version, str(root / kdir), mods["extend_attention"].extend_attention_fwd,
                          mods["decode_attention"].decode_attention_fwd, mods["metadata"].get_num_kv_splits_triton)
    except AttributeError as e:
        raise SGLangUnavailable(f"sglang {version}: {e}; the tested version is {PINNED} ({INSTALL})") from None
    _check(k.extend_attention_fwd, EXTEND_ARGS, (), "extend_attention_fwd", version)
    _check(k.decode_attention_fwd, DECODE_ARGS, DECODE_KW, "decode_attention_fwd", version)
    _check(k.get_num_kv_splits_triton.fn, SPLITS_ARGS, (), "get_num_kv_splits_triton", version)
    return k


@lru_cache(maxsize=1)
def load() -> SGLangKernels:
    """The installed sglang's kernels (loaded once per process); SGLangUnavailable (one line) when they cannot be."""
    return load_from(_root())
