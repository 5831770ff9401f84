"""``ddprobe serve`` under uvicorn, with a graceful stop.

The first SIGINT or SIGTERM says "shutting down" (on stderr), stops accepting connections and cancels the
engine's work (``EngineWorker.shutdown``: the running request at its next step, the queued ones before they
start), so every waiting client gets its answer at once (a 503 error body, or a stream's end event with finish
reason ``abort``) and the process exits 0 within ``GRACE_S`` seconds (open connections are cut after it). A
second signal only says the stop is under way: uvicorn's force exit would skip the app's shutdown and print a
traceback. The signal is not raised again once the server has stopped (uvicorn does that, which turned a
clean stop into a KeyboardInterrupt), and the handlers stay until the engine's thread is joined: a second
signal after the event loop has closed, while the engine finishes, is absorbed the same way (the previous
handlers, restored earlier, let it kill the process with a KeyboardInterrupt).
"""
import asyncio
import contextlib
import signal
import sys
import threading

import uvicorn

from .app import build_app

GRACE_S = 4.0  # longest wait for open connections once stopping; the engine is then joined for as long
SIGNALS = (signal.SIGINT, signal.SIGTERM)


SWITCH_S = 0.001  # the interpreter's thread switch interval while serving (Python's default: 5 ms)


def say_on_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, worker, say=say_on_stderr):
        super().__init__(config)
        self.worker, self.say, self.loop = worker, say, None

    async def serve(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        """The signal handler: it takes no lock (the main thread may hold any), so what it says and the
        worker's shutdown run on the event loop, next."""
        again = self.should_exit  # the stop is already bounded: forcing it would only skip the app's shutdown
        if not again:
            super().handle_exit(sig, frame)
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self.stop_work, signal.Signals(sig).name, again)
                return
            except RuntimeError:  # closed between the check and the call
                pass
        self.stop_work(signal.Signals(sig).name, again)  # the loop is gone: serve() is joining the engine

    def stop_work(self, name: str, again: bool) -> None:
        if again:
            self.say(f"ddprobe serve: already shutting down (within {GRACE_S:g} s)")
            return
        busy = self.worker.running + self.worker.waiting
        self.say(f"ddprobe serve: shutting down ({name}" + (f"; cancelling {busy} request(s))" if busy else ")"))
        self.worker.shutdown()

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn's handlers for SIGINT/SIGTERM while serving, the previous ones restored after (and the signal
        not raised again: a graceful stop exits 0)."""
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return
        for sig in SIGNALS:  # restored by serve() once the engine's thread is joined
            signal.signal(sig, self.handle_exit)
        yield


def serve(backend, host: str = "127.0.0.1", port: int = 30000, spec: bool = True, log_level: str = "warning",
          say=None, **limits) -> None:
    """Block serving ``backend`` on host:port until the first SIGINT/SIGTERM; returns once the engine is idle.
    ``limits``: ``max_body``, ``body_read_s`` (``app.build_app``)."""
    app = build_app(backend, spec=spec, **limits)
    worker = app.state.worker
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=GRACE_S)
    main = threading.current_thread() is threading.main_thread()
    before = {sig: signal.getsignal(sig) for sig in SIGNALS} if main else {}
    interval = sys.getswitchinterval()
    # threads doing Python work (tokenizing, writing a long answer) hand the interpreter lock back to the event loop
    # within 1 ms rather than 5: /health and /metrics stay quick beside them
    sys.setswitchinterval(SWITCH_S)
    try:
        GracefulServer(config, worker, say or say_on_stderr).run()
    finally:
        sys.setswitchinterval(interval)
        worker.shutdown()
        worker.join(GRACE_S)
        for sig, handler in before.items():
            signal.signal(sig, handler)
