"""ddprobe's stand-in for the few ``sglang.srt.utils`` names that SGLang's Triton attention kernel files import.

The real ``sglang.srt.utils`` is a package whose ``__init__`` imports the whole server (psutil, transformers, ...),
so ``_sglang_import`` loads SGLang's kernel files with this module in its place. These are ddprobe's own answers
to the same questions (which GPU runtime is this, how many SMs), not SGLang's code.
"""
from __future__ import annotations

import torch


def is_cuda() -> bool:
    return bool(torch.cuda.is_available() and torch.version.cuda is not None)


def is_hip() -> bool:
    return torch.version.hip is not None


def _gcn_arch() -> str:
    return getattr(torch.cuda.get_device_properties(0), "gcnArchName", "") if is_hip() else ""


def is_gfx95_supported() -> bool:
    return "gfx95" in _gcn_arch()


def is_gfx1250_supported() -> bool:  # imported by the newer releases' kernel files
    return "gfx1250" in _gcn_arch()


def get_device_core_count(device_id: int = 0) -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device_id).multi_processor_count
    return 0
