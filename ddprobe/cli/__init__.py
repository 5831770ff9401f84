"""ddprobe command line: each command parses, calls the library, prints. No logic here.

Domain errors (``DDProbeError``) print one line on stderr and exit 1. GPU libraries are
imported inside the commands that need them, so ``--help`` and ``floor`` run anywhere.
One module per group of commands; what they share (options, consoles, the error wrapper)
is in ``options``.
"""
from __future__ import annotations

from . import floor, advise, commit, serve, gpu, reports, diagnose, bench, trace  # noqa: F401, I001  (each registers its commands, in help order)
from .app import app


def main():  # console-script entry point
    app()


__all__ = ["app", "main"]
