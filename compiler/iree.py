"""iree-compile, run out of process.

IREE crashes (segfaults on bad flags, asserts in codegen); running it as a child process turns any of
that into a CompileError (exit 3) with the input IR, the exact command and the diagnostics saved in a
reproducer folder, instead of taking the Python process down.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from llmc.errors import CompileError


@dataclasses.dataclass
class CompileRun:
    command: list[str]
    peak_rss_mb: float
    seconds: float


def iree_compile_path() -> str:
    from iree.compiler.tools.binaries import find_tool

    return find_tool("iree-compile")


def compile_mlir(
    mlir_text: str,
    output: Path,
    flags: list[str] | tuple[str, ...],
    *,
    repro_dir: Path,
    target_name: str,
    configure: Callable[[str], str] | None = None,
) -> CompileRun:
    """Compile torch-dialect MLIR text to `output` (written atomically). Raises CompileError on failure.

    configure: an edit of the executable configurations (MLIR text). iree-compile then runs in two
    halves, `--compile-to=executable-configurations` and `--compile-from=` that phase, with the edit
    in between (the CPU variants' conditions, compiler/targets.py).
    """
    output = Path(output)
    from llmc.compiler.artifacts import temp_path

    tmp_out = str(temp_path(output).resolve())  # absolute: iree-compile runs in its scratch folder
    work = Path(tempfile.mkdtemp(prefix="llmc-compile-"))
    src = work / "input.mlir"
    src.write_text(mlir_text)
    # Run in the scratch folder on a relative input name: iree-compile records the input's path in the
    # module's debug info, and a random temp path would make two compiles of one input differ.
    cmd = [iree_compile_path(), src.name, "--iree-input-type=torch", *flags, "-o", tmp_out]
    if configure is None:
        seconds, peak_kb = _run(cmd, work, mlir_text, tmp_out, repro_dir, target_name)
    else:
        first = [*cmd[:-2], "--compile-to=executable-configurations", "-o", "configured.mlir"]
        seconds, peak_kb = _run(first, work, mlir_text, None, repro_dir, target_name)
        configured = configure((work / "configured.mlir").read_text())
        src.write_text(configured)  # under the input's own name: IREE names the module and its executables after it
        second = [cmd[0], src.name, *flags, "--compile-from=executable-configurations", "-o", tmp_out]
        more, peak2 = _run(second, work, configured, tmp_out, repro_dir, target_name)
        seconds, peak_kb, cmd = seconds + more, max(peak_kb, peak2), second
    os.replace(tmp_out, output)
    _cleanup(work)
    return CompileRun(command=cmd, peak_rss_mb=peak_kb / 1024.0, seconds=seconds)


def _run(cmd: list[str], work: Path, mlir_text: str, tmp_out: str | None, repro_dir: Path, target_name: str) -> tuple[float, int]:
    """Run one iree-compile command in `work`: (seconds, peak RSS in KiB); CompileError on failure."""
    start = time.perf_counter()
    with open(work / "stderr.txt", "w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=work)
        # Peak RSS of iree-compile itself: its VmHWM, polled. (wait4's ru_maxrss is no good here: on
        # Linux it starts from the Python parent's size at fork, ~1 GB with a 125M model loaded.)
        peak_kb = 0
        while proc.poll() is None:
            peak_kb = max(peak_kb, _vm_hwm_kb(proc.pid))
            time.sleep(0.05)
        err.seek(0)
        diagnostics = err.read()
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        if tmp_out is not None and os.path.exists(tmp_out):  # iree-compile removes its output on failure, a crash may not
            os.unlink(tmp_out)
        saved = save_reproducer(repro_dir, mlir_text, cmd, diagnostics)
        code = proc.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        lines = [l for l in diagnostics.strip().splitlines() if l.strip()]
        shown = "\n".join(lines[:25]) + (f"\n... ({len(lines) - 25} more lines in {saved / 'stderr.txt'})" if len(lines) > 25 else "")
        _cleanup(work)
        raise CompileError(
            f"iree-compile {how} for target '{target_name}'.\nDiagnostics:\n{shown or '(none)'}\n"
            f"Input IR saved to {saved / 'input.mlir'}. Reproduce with: {shlex.join(_repro_cmd(cmd, saved))}",
            diagnostics=diagnostics,
        )
    return seconds, peak_kb


def _vm_hwm_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _repro_cmd(cmd: list[str], saved: Path) -> list[str]:
    # The reproducer points at the saved copy of the input and writes next to it.
    out = list(cmd)
    out[0] = "iree-compile"
    out[1] = str(saved / "input.mlir")
    out[-1] = str(saved / ("configured.mlir" if cmd[-1].endswith(".mlir") else "out.vmfb"))
    return out


def save_reproducer(repro_dir: Path, mlir_text: str, cmd: list[str], diagnostics: str) -> Path:
    """Write input.mlir, command.sh and stderr.txt into a fresh folder under `repro_dir`."""
    repro_dir = Path(repro_dir)
    repro_dir.mkdir(parents=True, exist_ok=True)
    saved = Path(tempfile.mkdtemp(prefix="llmc-repro-", dir=repro_dir))
    (saved / "input.mlir").write_text(mlir_text)
    (saved / "stderr.txt").write_text(diagnostics)
    (saved / "command.sh").write_text("#!/bin/sh\n" + shlex.join(_repro_cmd(cmd, saved)) + "\n")
    os.chmod(saved / "command.sh", 0o755)
    return saved


def _cleanup(work: Path) -> None:
    for p in work.iterdir():
        p.unlink()
    work.rmdir()
