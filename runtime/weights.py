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

Either way, what IREE itself allocates while loading (the f32 weights it packs) is then moved into
huge pages too (huge_pages_for_new_memory; docs/targets.md "IREE's own memory in huge pages").
"""

from __future__ import annotations

import functools
import logging
import mmap
import re
import time
from pathlib import Path

from llmc.errors import RuntimeLoadError

log = logging.getLogger("llmc.runtime")

MODES = ("auto", "mmap", "memory")
LOCAL_DRIVERS = ("local-task", "local-sync", "local")  # IREE's CPU devices: their memory is this process's
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
    if driver not in LOCAL_DRIVERS:
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


# --- IREE's own memory: what a load allocates, asked into huge pages afterwards -------------------------

_HUGE = 2 << 20
_MADV_HUGEPAGE = 14  # <asm-generic/mman-common.h>
_MADV_COLLAPSE = 25  # Linux 6.1+: collapse the range into huge pages now, synchronously
_MIN_RESIDENT = 0.9  # a 2 MB range less resident than this is left alone (collapsing fills the range whole)


HUGE_PAGES_ENV = "LLMC_HUGE_PAGES"  # "off": leave IREE's memory in whatever pages it got (A/B runs)


@functools.lru_cache(maxsize=1)
def _libc():
    """libc through ctypes with madvise(2) and mincore(2) typed (errno kept for madvise's answers)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    return libc


def huge_pages_skipped(thp: str | None = None) -> str | None:
    """Why the load-time move into huge pages does nothing here (LLMC_HUGE_PAGES=off, or the kernel's THP
    mode), or None when it applies; asked before the snapshot, so a load that will move nothing pays nothing."""
    import os

    if os.environ.get(HUGE_PAGES_ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return f"{HUGE_PAGES_ENV}=off"
    thp = transparent_huge_pages() if thp is None else thp
    if thp != "madvise":
        return {"always": "the kernel gives huge pages to all memory", "never": "the kernel offers no huge pages",
                "": "the kernel offers no transparent huge pages"}.get(thp, f"THP mode {thp}")
    return None


def anonymous_mappings() -> list[tuple[int, int, int, int]]:
    """(start, end, resident bytes, bytes in huge pages) of this process's private anonymous read-write
    mappings ([heap] included)."""
    out = []
    try:
        text = Path("/proc/self/smaps").read_text()
    except OSError:
        return out
    current = None
    for line in text.splitlines():
        head = line.split(None, 6)
        if len(head) >= 5 and "-" in head[0] and len(head[1]) == 4:  # a mapping's first line
            name = head[5] if len(head) > 5 else ""
            start, end = (int(x, 16) for x in head[0].split("-"))
            current = None
            if head[1].startswith("rw") and head[1][3] == "p" and head[4] == "0" and name in ("", "[heap]"):
                current = [start, end, 0, 0]
                out.append(current)
        elif current is not None and line.startswith(("Rss:", "AnonHugePages:")):
            current[2 if line.startswith("Rss:") else 3] = int(line.split()[1]) * 1024
    return [tuple(m) for m in out]


def _chunk_presence(start: int, end: int):
    """(2 MB-aligned chunk starts, fraction of each chunk's 4 KB pages resident) for [start, end)
    (mincore(2): a few ms for a GB, where /proc/self/pagemap took ~40 ms for 0.4 GB), or None."""
    import numpy as np

    start, end = -(-start // _HUGE) * _HUGE, end // _HUGE * _HUGE
    if end <= start:
        return None
    resident = np.empty((end - start) // 4096, dtype=np.uint8)
    if _libc().mincore(start, end - start, resident.ctypes.data) != 0:
        return None
    present = (resident & 1).astype(bool).reshape(-1, _HUGE // 4096)
    return start + np.arange(len(present), dtype=np.int64) * _HUGE, present.mean(axis=1)


def _anonymous_ranges() -> list[tuple[int, int]]:
    """(start, end) of this process's private anonymous read-write mappings of 2 MB or more, from
    /proc/self/maps (cheap, where smaps costs tens of ms in a process with torch's libraries mapped)."""
    out = []
    try:
        text = Path("/proc/self/maps").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        f = line.split(None, 5)
        if len(f) >= 5 and f[1] == "rw-p" and f[4] == "0" and (len(f) == 5 or f[5].strip() == "[heap]"):
            start, end = (int(x, 16) for x in f[0].split("-"))
            if end - start >= _HUGE:
                out.append((start, end))
    return out


def populated_chunks() -> set[int]:
    """The 2 MB ranges of anonymous memory that are mostly resident now: a snapshot to take before a
    load, for huge_pages_for_new_memory."""
    out: set[int] = set()
    for s, e in _anonymous_ranges():
        got = _chunk_presence(s, e)
        if got is not None:
            out.update(int(a) for a in got[0][got[1] >= 0.5])
    return out


def huge_pages_for_new_memory(before: set[int], *, thp: str | None = None) -> tuple[int, str]:
    """Ask the kernel to back, with 2 MB pages, the anonymous memory this process populated since
    `before` (a populated_chunks() snapshot): what IREE wrote while loading a module, chiefly the
    weights it packs at load (f32 with data tiling), which IREE's allocator takes from malloc in 4 KB
    pages. Returns (bytes, how): how "collapsed" (MADV_COLLAPSE moved that many bytes into huge pages
    now), "advised" (MADV_HUGEPAGE only, on that many: an older kernel; khugepaged moves them over
    time), or why nothing moved (bytes 0).

    Only 2 MB ranges at least _MIN_RESIDENT resident now and not mostly resident before (mincore): a collapse
    fills each range whole, so a mostly untouched reservation (IREE's allocator maps 64 MB at a time)
    would grow. Memory the allocator hands out again (populated before the load, e.g. by a compile in
    the same process) is not moved. Values are unchanged (the kernel copies the pages). Cost: the copy,
    and on this project's VMs the host backing each new 2 MB page: ~2.5 s per GB (docs/targets.md).
    """
    import ctypes

    why_not = huge_pages_skipped(thp)
    if why_not:
        return 0, why_not
    ranges: list[tuple[int, int]] = []
    for s, e in _anonymous_ranges():
        got = _chunk_presence(s, e)
        if got is None:
            continue
        for a, frac in zip(got[0].tolist(), got[1].tolist()):
            if frac < _MIN_RESIDENT or a in before:
                continue
            if ranges and ranges[-1][1] == a:
                ranges[-1] = (ranges[-1][0], a + _HUGE)
            else:
                ranges.append((a, a + _HUGE))
    if not ranges:
        return 0, "no new memory of 2 MB or more"
    libc = _libc()
    huge_before = sum(m[3] for m in anonymous_mappings())
    how = "collapsed"
    advised = 0
    for a, b in ranges:
        if libc.madvise(a, b - a, _MADV_HUGEPAGE) != 0:
            continue
        advised += b - a
        if how == "collapsed" and libc.madvise(a, b - a, _MADV_COLLAPSE) != 0 and ctypes.get_errno() == 22:  # EINVAL: no MADV_COLLAPSE
            how = "advised"
    if how == "advised":
        return advised, how
    moved = sum(m[3] for m in anonymous_mappings()) - huge_before  # ranges that were huge already do not count
    return (moved, how) if moved > 0 else (0, "already in 2 MB pages")
