"""Per-phase timings, and a progress line on stderr for any phase that takes more than a second.

A phase that moves bytes (writing a 16 GB parameter archive, hashing it) can say how far it is:
`phases.phase("write parameters", progress=lambda: (done, total))`, and the line shows
`3.2/16.0 GB, 310 MB/s` instead of elapsed seconds alone, so a long phase never looks stalled."""

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
    def phase(self, name: str, progress=None):
        """progress: a callable returning (bytes done, bytes in all), polled from the ticker thread."""
        start = time.perf_counter()
        stop = threading.Event()
        ticker = None
        if not self.quiet:
            ticker = threading.Thread(target=self._tick, args=(name, start, stop, progress), daemon=True)
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

    def _tick(self, name: str, start: float, stop: threading.Event, progress=None):
        # Nothing is printed for phases under a second; after that, a line that updates in place
        # on a terminal (or a line every 10 s when stderr is a file or a pipe, so CI logs show life).
        if stop.wait(1.0):
            return
        tty = self.stream.isatty()
        last_log = -1e9
        while True:
            elapsed = time.perf_counter() - start
            text = f"llmc: {name} ... {_amount(progress, elapsed)}{elapsed:.1f}s"
            if tty:
                self._write(text, clear=True)
            elif elapsed - last_log >= 10.0:
                self._write(text + "\n")
                last_log = elapsed
            if stop.wait(0.5):
                return

    def _write(self, text: str, clear: bool = False):
        try:
            if clear and self.stream.isatty():
                text = "\r\033[K" + text
            self.stream.write(text)
            self.stream.flush()
        except (ValueError, OSError):
            pass


def _amount(progress, elapsed: float) -> str:
    """`3.2/16.0 GB (20%), 310 MB/s, ` from a progress callable; "" without one (or when it fails)."""
    if progress is None:
        return ""
    try:
        done, total = progress()
    except Exception:  # a file not created yet, a race with the writer: show time alone this tick
        return ""
    unit, scale = ("GB", 1e9) if total >= 1e9 else ("MB", 1e6)
    pct = f" ({100 * done / total:.0f}%)" if total else ""
    return f"{done / scale:.1f}/{total / scale:.1f} {unit}{pct}, {done / 1e6 / max(elapsed, 1e-9):.0f} MB/s, "


# torch 2.13 deep-copies its own pytree specs (export, run_decompositions, copy.deepcopy of a program)
# and warns each time that its own LeafSpec API is deprecated: nothing a caller of llmc can act on, and
# it lands between llmc's progress lines and a bench's table.
PYTREE_WARNING = r".*isinstance\(treespec, LeafSpec\)"


@contextlib.contextmanager
def quiet_pytree_warnings():
    """torch's own LeafSpec deprecation warning silenced inside the block (only that warning)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PYTREE_WARNING, category=FutureWarning)
        yield
