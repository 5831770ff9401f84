"""Phase times of decode steps: CUDA events on a GPU (read once, at the end), perf_counter on CPU.

    clock = StepClock(device)
    marks = clock.mark()        # at each phase boundary of a step: draft | tree | verify | commit
    ...
    clock.times_ms(step_marks)  # -> [ms between consecutive marks], one synchronize for all steps

Events measure the GPU's timeline between marks: a phase the host spends building a tree shows
up as the gap the GPU waited, and nothing synchronizes inside a step to take the time.
"""
from __future__ import annotations

import time

import torch


class StepClock:
    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def times_ms(self, marks: list) -> list[float]:
        """Milliseconds between consecutive marks (synchronizes once on CUDA)."""
        if self.cuda:
            marks[-1].synchronize()
            return [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]
