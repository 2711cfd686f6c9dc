"""Where a module's weights live while it runs on a CPU: mapped from the .irpa, or read into memory.

- "mmap": IREE maps the archive; pages come from the page cache on first use, are shared with other
  processes that map the same file, and the kernel may drop and re-read them.
- "memory": the archive is read once into anonymous memory that asks the kernel for transparent huge
  pages (madvise MADV_HUGEPAGE) and IREE reads the weights from there. A decode step streams every
  weight: with 2 MB pages instead of 4 KB ones it takes 512x fewer TLB entries to cover them, and the
  one-row products run faster (docs/targets.md, "Weights in memory").
- "auto" (the default): "memory" where it pays and fits, else "mmap". It pays on a local CPU device
  when the decode reads the archived weights in place. It does not when IREE repacks them at load
  (f32 with data tiling: the archive is read once and the packed copies live in IREE's own memory;
  reading it into memory first would only hold a second copy), nor on GPU devices (weights are
  copied to device memory). It fits when the archive is at most half of the memory available now.
"""

from __future__ import annotations

import logging
import mmap
import re
import time
from pathlib import Path

from llmc.errors import RuntimeLoadError

log = logging.getLogger("llmc.runtime")

MODES = ("auto", "mmap", "memory")
_CHUNK = 256 << 20  # one read() per 256 MB (Linux caps a single read at ~2 GB)
_DATA_TILING = re.compile(r"^--iree-(?:opt|global-opt|dispatch-creation)-data-tiling(?:=(\w+))?$")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise RuntimeLoadError(f"weights={mode!r}: give one of {', '.join(MODES)}")
    return mode


def data_tiling(iree_flags: list[str]) -> bool:
    """Whether the flags leave IREE's data tiling on (the last data-tiling flag wins, as in iree-compile)."""
    on = False
    for flag in iree_flags:
        m = _DATA_TILING.match(flag)
        if m:
            on = (m.group(1) or "true").lower() in ("1", "true", "on")
    return on


def transparent_huge_pages() -> str:
    """The kernel's THP mode for anonymous memory: always, madvise, never ('' where there is none)."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return ""
    m = re.search(r"\[(\w+)\]", text)
    return m.group(1) if m else ""


def mem_available() -> int:
    """Bytes of memory available to new allocations without swapping (MemAvailable), 0 if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def choose(mode: str, manifest: dict, driver: str, archive_bytes: int, *, available: int | None = None,
           thp: str | None = None) -> tuple[str, str]:
    """(the residency to use, why): "mmap" or "memory" for the requested mode on this module and machine."""
    check_mode(mode)
    if mode != "auto":
        return mode, "asked for"
    if driver not in ("local-task", "local-sync", "local"):
        return "mmap", f"the {driver} device copies weights into its own memory"
    if manifest.get("dtype") in ("f32", "f64") and data_tiling(manifest.get("iree_flags", [])):
        return "mmap", "IREE packs f32 weights into its own memory at load (data tiling)"
    thp = transparent_huge_pages() if thp is None else thp
    if thp not in ("always", "madvise"):
        return "mmap", "the kernel offers no transparent huge pages"
    available = mem_available() if available is None else available
    if archive_bytes > available // 2:
        return "mmap", (f"the archive ({archive_bytes / 1e9:.2f} GB) is over half of the available memory "
                        f"({available / 1e9:.2f} GB)")
    return "memory", f"read in place by the decode, {archive_bytes / 1e9:.2f} GB of {available / 1e9:.2f} GB available"


class ResidentArchive:
    """An .irpa read into anonymous memory with huge pages asked for; IREE reads the weights in place.

    `handle` (an IREE FileHandle over the memory) must outlive every IREE object that uses the
    parameters: the owner drops this object only after the VM context (runtime/module.py: _Loaded).
    """

    def __init__(self, path: Path):
        import iree.runtime as rt

        size = path.stat().st_size
        start = time.perf_counter()
        self.memory = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self.memory.madvise(mmap.MADV_HUGEPAGE)
        view = memoryview(self.memory)
        try:
            with open(path, "rb", buffering=0) as f:
                done = 0
                while done < size:
                    n = f.readinto(view[done:min(size, done + _CHUNK)])
                    if not n:
                        raise RuntimeLoadError(f"{path}: the parameter archive ended at byte {done} of {size} while reading it")
                    done += n
        except OSError as e:
            raise RuntimeLoadError(f"{path}: could not read the parameter archive ({e.strerror or e})") from e
        finally:
            view.release()
        seconds = time.perf_counter() - start
        self.handle = rt.FileHandle.wrap_memory(self.memory, readable=True, writable=False)
        log.info("%s: %.2f GB of weights read into memory in %.1f s", path.name, size / 1e9, seconds)

    def index(self):
        import iree.runtime as rt

        index = rt.ParameterIndex()
        index.load_from_file_handle(self.handle, "irpa")
        return index
