"""Measurement options for the split_ws CUDA kernel (ddprobe/engine/kernels/_cu.py), shared by the benchmarks:
--cubin PATH times another build of the same source (a schedule variant: the source's DDP_* macros, built with
nvcc and the flags _cu.NVCC_FLAGS names) in place of the shipped cubin; --l2-promotion 0..3 sets the TMA maps' L2
promotion (0 none, 1 64 B, 2 128 B the shipped one, 3 256 B). Both hold for the whole process."""
import argparse
from pathlib import Path


def add_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--cubin", type=Path, default=None, help="time this build of seesaw_sm90.cu instead of the "
                    "shipped cubin (a schedule variant)")
    ap.add_argument("--l2-promotion", type=int, choices=(0, 1, 2, 3), default=None,
                    help="the TMA maps' L2 promotion (0 none, 1 64 B, 2 128 B: the shipped one, 3 256 B)")


def apply(a: argparse.Namespace, ap: argparse.ArgumentParser) -> dict:
    """Point _cu at the options' cubin and L2 promotion (before any launch); returns what was set, for the
    results' meta (empty when neither option was given)."""
    from ddprobe.engine.kernels import _cu

    done = {}
    if a.cubin is not None:
        if not a.cubin.is_file():
            ap.error(f"--cubin {a.cubin}: no such file")
        _cu.CUBIN = a.cubin.resolve()
        done["cubin"] = str(_cu.CUBIN)
    if a.l2_promotion is not None:
        _cu.L2_PROMOTION = a.l2_promotion
        done["l2_promotion"] = a.l2_promotion
    return done
