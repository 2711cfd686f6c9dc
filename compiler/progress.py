"""Per-phase timings, and a progress line on stderr for any phase that takes more than a second."""

from __future__ import annotations

import contextlib
import sys
import threading
import time


class Phases:
    """Times named phases; shows a live `llmc: <phase> ... 3.2s` line on a terminal, a log line otherwise."""

    def __init__(self, *, quiet: bool = False, stream=None):
        self.timings: dict[str, float] = {}
        self.quiet = quiet
        self.stream = stream or sys.stderr

    @contextlib.contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        stop = threading.Event()
        ticker = None
        if not self.quiet:
            ticker = threading.Thread(target=self._tick, args=(name, start, stop), daemon=True)
            ticker.start()
        ok = False
        try:
            yield
            ok = True
        finally:
            stop.set()
            if ticker is not None:
                ticker.join()
            elapsed = time.perf_counter() - start
            self.timings[name] = self.timings.get(name, 0.0) + elapsed
            if not self.quiet and elapsed >= 1.0:
                status = "done" if ok else "failed"
                self._write(f"llmc: {name} {status} after {elapsed:.1f}s\n", clear=True)

    def _tick(self, name: str, start: float, stop: threading.Event):
        # Nothing is printed for phases under a second; after that, a line that updates in place
        # on a terminal (or one "started" line when stderr is a file or a pipe).
        if stop.wait(1.0):
            return
        if not self.stream.isatty():
            self._write(f"llmc: {name} ...\n")
            return
        while not stop.wait(0.5):
            self._write(f"llmc: {name} ... {time.perf_counter() - start:.1f}s", clear=True)

    def _write(self, text: str, clear: bool = False):
        try:
            if clear and self.stream.isatty():
                text = "\r\033[K" + text
            self.stream.write(text)
            self.stream.flush()
        except (ValueError, OSError):
            pass
