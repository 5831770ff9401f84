"""Persistent compile caches: Triton's kernels and Inductor's FX-graph / AOT-autograd artifacts in the user's cache
directory, reused by every later process (the warm-up of a second run is then tracing and capture, not compiling).

``enable()`` sets, where the user has not: TRITON_CACHE_DIR = <cache>/ddprobe/triton, TORCHINDUCTOR_CACHE_DIR =
<cache>/ddprobe/inductor (<cache>: $XDG_CACHE_HOME, else ~/.cache), TORCHINDUCTOR_FX_GRAPH_CACHE=1 and
TORCHINDUCTOR_AUTOGRAD_CACHE=1; and, when torch is already imported, the same two switches in its configs. A
variable the user set wins (never overwritten); a cache folder that cannot be made leaves the defaults (the
compilers then cache where they always do). Stdlib at import; torch is only touched when already loaded.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

SWITCHES = {"TORCHINDUCTOR_FX_GRAPH_CACHE": "1", "TORCHINDUCTOR_AUTOGRAD_CACHE": "1"}
DIRS = {"TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "inductor"}


def cache_root(environ=os.environ) -> Path:
    """<$XDG_CACHE_HOME or ~/.cache>/ddprobe."""
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ddprobe"


def enable(environ=os.environ) -> dict[str, str]:
    """Point the compilers at the persistent caches (see the module doc); returns the variables it set."""
    set_: dict[str, str] = {}
    for var, sub in DIRS.items():
        if environ.get(var):
            continue
        d = cache_root(environ) / sub
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError:  # read-only home, no home: the compilers' own defaults
            continue
        environ[var] = set_[var] = str(d)
    for var, value in SWITCHES.items():
        if var not in environ:
            environ[var] = set_[var] = value
    if "torch" in sys.modules:  # configs already read their variables at import: switch them too
        _configure_loaded(environ)
    return set_


def _configure_loaded(environ) -> None:
    try:
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config
    except ImportError:  # a torch without Inductor
        return
    if environ.get("TORCHINDUCTOR_FX_GRAPH_CACHE") == "1":
        inductor_config.fx_graph_cache = True
    if environ.get("TORCHINDUCTOR_AUTOGRAD_CACHE") == "1":
        functorch_config.enable_autograd_cache = True
