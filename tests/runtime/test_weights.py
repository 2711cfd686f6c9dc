"""Where a module's weights live on a CPU device (runtime/weights.py): mapped from the .irpa or read
into huge-page memory, and which one `weights="auto"` picks.

The end-to-end checks tell the two apart by their behaviour, not by the label: after the module's
first call the .irpa is overwritten in place; a mapped module then computes with the new bytes, a
module whose weights were read into memory keeps the old ones.
"""

from __future__ import annotations

import shutil

import pytest
import torch

import llmc
from llmc.errors import RuntimeLoadError
from llmc.models import zoo
from llmc.runtime import weights


BF16 = {"dtype": "bf16", "iree_flags": ["--iree-llvmcpu-target-cpu=host"]}
F32_TILED = {"dtype": "f32", "iree_flags": ["--iree-global-opt-data-tiling=true"]}
GB = 10**9


@pytest.mark.parametrize("manifest, driver, size, thp, mode", [
    (BF16, "local-task", 1 * GB, "madvise", "memory"),    # read in place by the decode, fits
    (BF16, "local-sync", 1 * GB, "always", "memory"),
    (BF16, "local-task", 6 * GB, "madvise", "mmap"),      # over half of the 10 GB available
    (BF16, "local-task", 1 * GB, "never", "mmap"),        # no huge pages: nothing gained
    (BF16, "hip", 1 * GB, "madvise", "mmap"),             # a GPU copies weights to its own memory
    (BF16, "vulkan", 1 * GB, "madvise", "mmap"),
    (F32_TILED, "local-task", 1 * GB, "madvise", "mmap"),  # IREE packs f32 weights at load
    ({"dtype": "f32", "iree_flags": ["--iree-global-opt-data-tiling=true", "--iree-global-opt-data-tiling=false"]},
     "local-task", 1 * GB, "madvise", "memory"),           # data tiling turned off again: the last flag wins
    ({"dtype": "fp8", "iree_flags": ["--iree-opt-data-tiling=true"]}, "local-task", 1 * GB, "madvise", "memory"),
])
def test_auto_choice(manifest, driver, size, thp, mode):
    chosen, why = weights.choose("auto", manifest, driver, size, available=10 * GB, thp=thp)
    assert chosen == mode, why


def test_asked_mode_is_kept_and_bad_mode_refused():
    assert weights.choose("mmap", BF16, "local-task", 1, available=10 * GB, thp="madvise")[0] == "mmap"
    assert weights.choose("memory", F32_TILED, "local-task", 1, available=10 * GB, thp="never")[0] == "memory"
    with pytest.raises(RuntimeLoadError, match=r"weights='ram': give one of auto, mmap, memory"):
        weights.check_mode("ram")


def test_data_tiling_flags():
    assert weights.data_tiling(["--iree-opt-data-tiling"])
    assert weights.data_tiling(["--iree-dispatch-creation-data-tiling=true"])
    assert not weights.data_tiling(["--iree-opt-data-tiling=true", "--iree-opt-data-tiling=false"])
    assert not weights.data_tiling(["--iree-opt-data-tiling-something=true"])


@pytest.fixture(scope="module")
def bf16_module(tmp_path_factory):
    model, (x,), _ = zoo.build("linear_stack")
    art = llmc.compile(model, (x,), dtype="bf16", output=tmp_path_factory.mktemp("bf16") / "stack.vmfb", quiet=True)
    with torch.no_grad():
        want = model(x)
    return art, x, want


def _copy(art, tmp_path):
    for suffix in (".vmfb", ".irpa", ".json"):
        shutil.copy(art.vmfb.with_suffix(suffix), tmp_path / f"m{suffix}")
    return tmp_path / "m.vmfb"


def _overwrite_weights(irpa):
    """Zero the second half of the archive in place (same inode: a mapping sees the new bytes)."""
    size = irpa.stat().st_size
    with open(irpa, "r+b") as f:
        f.seek(size // 2)
        f.write(bytes(size - size // 2))


@pytest.mark.parametrize("mode", ["mmap", "memory"])
def test_where_the_weights_are_read_from(bf16_module, tmp_path, mode):
    art, x, want = bf16_module
    vmfb = _copy(art, tmp_path)
    mod = llmc.load(vmfb, weights=mode)
    before = mod(x)
    # Either way the module is eager's f32 model to bf16 accuracy (bf16 weights and output).
    torch.testing.assert_close(before.float(), want, rtol=3e-2, atol=3e-2)
    assert mod.weights == mode
    _overwrite_weights(vmfb.with_suffix(".irpa"))
    after = mod(x)
    if mode == "memory":
        assert torch.equal(after, before), "weights read into memory changed when the file did"
    else:
        assert not torch.equal(after, before), "mapped weights did not follow the file: they are not read from it"
    mod.close()


def test_auto_reads_low_precision_weights_into_huge_page_memory(bf16_module):
    art, x, _ = bf16_module
    mod = llmc.load(art)
    got = mod(x)
    assert mod.weights == "memory" or "huge pages" in mod.weights_reason, mod.weights_reason
    ref = llmc.load(art, weights="mmap")
    assert torch.equal(got, ref(x))  # the same bytes, so bit-identical results


def test_auto_leaves_data_tiled_f32_weights_mapped(tmp_path):
    model, (x,), _ = zoo.build("linear_stack")
    art = llmc.compile(model, (x,), output=tmp_path / "f32.vmfb", quiet=True)
    mod = llmc.load(art)
    with torch.no_grad():
        torch.testing.assert_close(mod(x), model(x), rtol=1e-4, atol=1e-5)
    assert mod.weights == "mmap" and "data tiling" in mod.weights_reason


def test_unreadable_archive_is_one_clear_error(tmp_path):
    """An archive that cannot be read (here a folder in its place) is a RuntimeLoadError naming it."""
    bad = tmp_path / "m.irpa"
    bad.mkdir()
    with pytest.raises(RuntimeLoadError, match=r"m\.irpa: could not read the parameter archive \(Is a directory\)"):
        weights.ResidentArchive(bad)


def _huge_bytes(address: int) -> int:
    """Bytes of the anonymous mapping holding `address` that sit in huge pages."""
    return next(m[3] for m in weights.anonymous_mappings() if m[0] <= address < m[1])


def _private_memory(size: int, touch: int):
    """A private anonymous mapping of `size` bytes (4 KB pages: no madvise) with its first `touch` bytes written."""
    import ctypes
    import mmap

    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m[:touch] = b"\x01" * touch
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


@pytest.mark.skipif(weights.transparent_huge_pages() != "madvise", reason="the kernel's THP mode is not madvise")
def test_memory_mapped_during_a_load_goes_to_huge_pages(monkeypatch):
    """What a load populates (IREE's packed weights) is moved to 2 MB pages; what was resident before it
    and a mostly untouched mapping are left alone, and the bytes are unchanged."""
    monkeypatch.delenv(weights.HUGE_PAGES_ENV, raising=False)
    size = 16 << 20
    old, old_at = _private_memory(size, size)
    before = weights.populated_chunks()
    new, new_at = _private_memory(size, size)
    new[5 << 20] = 7
    sparse, sparse_at = _private_memory(size, 1 << 20)
    assert _huge_bytes(new_at) == 0
    moved, how = weights.huge_pages_for_new_memory(before)
    if how == "advised":
        pytest.skip("this kernel has no MADV_COLLAPSE (before Linux 6.1)")
    assert how == "collapsed"
    # 16 MB at any 4 KB alignment holds at least 7 whole 2 MB pages
    assert _huge_bytes(new_at) >= 14 << 20 and moved >= 14 << 20
    assert new[5 << 20] == 7 and new[(5 << 20) + 1] == 1 and new[size - 1] == 1
    assert _huge_bytes(old_at) == 0, "a mapping from before the load was moved"
    assert _huge_bytes(sparse_at) == 0, "a mapping 1/16 resident was filled out to huge pages"


def test_huge_pages_are_left_alone_when_asked_or_not_offered(monkeypatch):
    before = weights.populated_chunks()
    new, _ = _private_memory(8 << 20, 8 << 20)
    assert weights.huge_pages_for_new_memory(before, thp="never") == (0, "the kernel offers no huge pages")
    assert weights.huge_pages_for_new_memory(before, thp="always")[0] == 0
    monkeypatch.setenv(weights.HUGE_PAGES_ENV, "off")
    assert weights.huge_pages_for_new_memory(before, thp="madvise") == (0, "LLMC_HUGE_PAGES=off")


_LOAD = """
import sys, numpy as np, torch, llmc
mod = llmc.load(sys.argv[1])
x = torch.from_numpy(np.load(sys.argv[2]))
np.save(sys.argv[3], mod(x).numpy())
print(*mod.iree_huge_pages, sep="|")
"""


@pytest.mark.skipif(weights.transparent_huge_pages() != "madvise", reason="the kernel's THP mode is not madvise")
def test_load_moves_iree_packed_f32_weights_to_huge_pages(tmp_path):
    """An f32 module with data tiling: IREE packs its 8 MB of weights at load into memory of its own,
    which the load then moves to 2 MB pages; the results are bit-identical to a load that does not.
    Loaded in fresh processes, as `llmc run` or a server would (this one compiled: its allocator
    may place IREE's buffers in memory it mapped before, which the load does not move)."""
    import os
    import subprocess
    import sys

    import numpy as np
    from llmc.models.zoo import LinearStack

    torch.manual_seed(0)
    model = LinearStack(dims=(1024, 1024, 1024)).eval()
    x = torch.randn(2, 8, 1024)
    art = llmc.compile(model, (x,), output=tmp_path / "f32.vmfb", quiet=True)
    np.save(tmp_path / "x.npy", x.numpy())

    def load(out, **env):
        run = subprocess.run([sys.executable, "-c", _LOAD, str(art.vmfb), str(tmp_path / "x.npy"), str(tmp_path / out)],
                             capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        moved, how = run.stdout.strip().splitlines()[-1].split("|")
        return int(moved), how, torch.from_numpy(np.load(tmp_path / out))

    moved, how, got = load("y.npy", **{weights.HUGE_PAGES_ENV: "on"})
    if how == "advised":
        pytest.skip("this kernel has no MADV_COLLAPSE (before Linux 6.1)")
    assert how == "collapsed" and moved >= 6 << 20, (moved, how)
    with torch.no_grad():
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
    moved, how, plain = load("plain.npy", **{weights.HUGE_PAGES_ENV: "off"})
    assert (moved, how) == (0, "LLMC_HUGE_PAGES=off")
    assert torch.equal(plain, got)
