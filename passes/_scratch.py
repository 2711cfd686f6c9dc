"""Scratch files for the weights a pass rewrites from a memory-mapped checkpoint.

A Llama-3-8B checkpoint is 15 GB of bf16, read through a file mapping: its pages are clean file
pages the kernel can drop, so compiling it costs little anonymous memory. A pass that rewrites its
weights (bf16 bits packed for cpu, fp8 codes) makes new tensors of the same order of size; held in
anonymous memory they would need 15 GB (bf16) or 8 GB (fp8) of RAM on top of everything else.
`Scratch.keep` writes such a tensor to a file and maps it back read-only: the same values, held as
file pages, and the .irpa writer copies them file to file (compiler/importer.py `_FileBacking`).

A tensor made from an ordinary in-memory source stays in memory (a small model, a module built in
Python): there, the source already costs its size in RAM.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
import weakref

import numpy as np
import torch


def file_mappings() -> list[tuple[int, int, int, str, str]]:
    """(start, end, file offset, path, permissions) of this process's file-backed mappings
    (/proc/self/maps; [] where it cannot be read)."""
    maps = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)
                if len(parts) < 6 or not parts[5].startswith("/"):
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                maps.append((lo, hi, int(parts[2], 16), parts[5].strip(), parts[1]))
    except OSError:
        pass
    return maps


def is_file_backed(t: torch.Tensor) -> bool:
    """Whether `t`'s data lies in a file mapping (a memory-mapped checkpoint)."""
    if t.numel() == 0:
        return False
    ptr = t.untyped_storage().data_ptr()
    end = ptr + t.untyped_storage().nbytes()
    return any(lo <= ptr and end <= hi for lo, hi, _, _, _ in file_mappings())


def unmodified_file_pages(ptr: int, nbytes: int) -> bool:
    """True when no page of [ptr, ptr + nbytes) was modified since it was mapped from the file.

    A write to a private (copy-on-write) file mapping turns that page into an anonymous page; the
    kernel's /proc/self/pagemap says so per page (bit 61: file-backed or shared; bit 62: swapped,
    which only anonymous pages are; bit 63: present). Reading the flags touches no tensor data.
    Without a readable pagemap, the tensor is treated as modified (copied, never wrong).
    """
    page = os.sysconf("SC_PAGE_SIZE")
    first, last = ptr // page, (ptr + nbytes - 1) // page
    try:
        with open("/proc/self/pagemap", "rb") as f:
            for start in range(first, last + 1, 1 << 20):
                count = min(1 << 20, last + 1 - start)
                f.seek(start * 8)
                flags = np.frombuffer(f.read(count * 8), dtype=np.uint64)
                if flags.size != count:
                    return False
                present = (flags >> np.uint64(63)) & np.uint64(1)
                swapped = (flags >> np.uint64(62)) & np.uint64(1)
                file_page = (flags >> np.uint64(61)) & np.uint64(1)
                if np.any(swapped == 1) or np.any((present == 1) & (file_page == 0)):
                    return False
    except OSError:
        return False
    return True


def _drop_pages(t: torch.Tensor) -> None:
    """Drop this process's pages of a file-mapped tensor (madvise MADV_DONTNEED over the whole pages
    inside it). They are clean file pages: a later read maps them in again from the file, so only the
    resident size changes, not any value. Without it a pass that reads a whole 15 GB checkpoint
    ends with all of it counted in its RSS."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    start = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
    end = start + t.numel() * t.element_size()
    lo, hi = -(-start // page) * page, end // page * page
    if hi <= lo or not unmodified_file_pages(lo, hi - lo):  # a written (copy-on-write) page would be lost
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), 4)  # MADV_DONTNEED; a failure only keeps the pages


def _trim_heap() -> None:
    """Give the C heap's free memory back to the system (glibc malloc_trim). Converting weight after
    weight leaves freed temporaries in glibc's heap, which it keeps: measured on the 8B fp8 compile,
    7.3 GB of anonymous memory after the passes, 0.5 GB after one trim, with nothing live in between."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


class Scratch:
    """Files holding tensors a compile made, mapped read-only; removed by `close` (or when this
    object is collected). A mapping outlives its removed file, so a tensor stays valid after close."""

    def __init__(self, root: str | None = None):
        self._root = root
        self._dir: str | None = None
        self._count = 0
        self.nbytes = 0  # written so far
        self._finalizer = None

    def keep(self, source: torch.Tensor, made: torch.Tensor) -> torch.Tensor:
        """`made` itself, or, when `source` is memory-mapped from a file, the same tensor read back
        from a scratch file."""
        if made.numel() == 0 or made.untyped_storage().data_ptr() == source.untyped_storage().data_ptr():
            return made  # a view of the source (a bf16 weight's bits): nothing new to hold
        if not is_file_backed(source):
            return made
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="llmc-scratch-", dir=self._root)
            self._finalizer = weakref.finalize(self, shutil.rmtree, self._dir, True)
        path = os.path.join(self._dir, f"{self._count}.bin")
        self._count += 1
        made = made.contiguous()
        raw = made.reshape(-1).view(torch.uint8).numpy()
        with open(path, "wb") as f:
            raw.tofile(f)
        self.nbytes += raw.nbytes
        del raw
        _drop_pages(source)  # read once; the file keeps it (a later read faults it back in)
        _trim_heap()
        mapped = np.memmap(path, dtype=np.uint8, mode="r", shape=(made.numel() * made.element_size(),))
        with warnings.catch_warnings():  # read-only by design: nothing writes a weight
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(mapped)
        return flat.view(made.dtype).reshape(made.shape)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._dir, self._finalizer = None, None  # a later keep() starts a new folder
