"""Compile Triton/Gluon kernels for sm_90a on a machine without a GPU, with the device's Triton (3.6).

Used by compile_split_sm90.py and compile_ws_sm90.py: ``triton36(tool)`` puts the Triton unpacked at $TRITON36
(default /tmp/t36; ``pip install --no-deps --target /tmp/t36 triton==3.6.0``) first on sys.path, checks its
version, and installs a driver stub that answers what the launcher asks before it compiles (target sm_90, device
0, stream 0), so ``kernel.warmup(...)`` compiles without a driver. Returns the triton module, or None after one
line on stderr when the Triton found is not 3.6.
"""
from __future__ import annotations

import os
import sys


def triton36(tool: str):
    os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU, not the interpreter
    sys.path.insert(0, os.environ.get("TRITON36", "/tmp/t36"))
    import triton
    if not triton.__version__.startswith("3.6"):
        print(f"{tool}: needs Triton 3.6 on TRITON36, found {triton.__version__}", file=sys.stderr)
        return None
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    class NoGpu:  # what the launcher asks of a driver before it compiles
        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

        def get_active_torch_device(self):
            import torch
            return torch.device("cpu")

    driver.set_active(NoGpu())
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout, for ddprobe
    return triton
