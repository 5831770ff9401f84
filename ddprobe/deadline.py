"""A deadline over a whole answer (stdlib only): the socket timeouts of ``requests`` and ``urllib`` bound each
read, not the answer, so a server sending a byte a second holds a client for as long as it likes.
``within(fn, seconds)`` runs ``fn`` in a daemon thread and gives up at the deadline (``Late``); the thread is
left to end when its socket does (the caller's session is then not reused: see ``probes.backends.http``)."""
from __future__ import annotations

import threading
from typing import Any, Callable


class Late(Exception):
    """``fn`` had not finished at the deadline; ``stage`` is what it was doing (its ``progress`` dict's "stage")."""

    def __init__(self, stage: str):
        super().__init__(stage)
        self.stage = stage


def within(fn: Callable[[dict], Any], seconds: float, progress: dict | None = None) -> Any:
    """``fn(progress)`` within ``seconds``, else ``Late``; ``fn`` may set ``progress["stage"]`` to say how far it
    got (for the message; a caller that passes its own dict can read the stage when ``fn`` raises its own timeout).
    What ``fn`` raises is raised here."""
    progress = {"stage": "connecting"} if progress is None else progress
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(progress)
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name="ddprobe-http", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise Late(str(progress["stage"]))
    if "error" in box:
        raise box["error"]
    return box["value"]
