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
