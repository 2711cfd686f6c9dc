"""tools/profile_decode.py: the naming of sampled addresses (a real module's embedded ELF and llmc's kernels'
object, whose local symbols the tool places in the ELF; checked against the code bytes themselves), the
parsing and windowing of perf's samples, the refusals, and, where perf may sample this process, a real
profile of a tiny bf16 Llama's decode steps."""

import json
import os
import shutil
import struct
import subprocess
import zipfile

import pytest
import torch
from conftest import main_in_process

import llmc
from llmc.compiler import ukernels
from llmc.models.llama.config import get_config
from llmc.models.llama.model import init_random
from llmc.tools import profile_decode as pd

PAGE = pd.PAGE
needs_kernels = pytest.mark.skipif(ukernels.c_compiler() is None and not os.environ.get("LLMC_REQUIRE_CPU_KERNELS"),
                                   reason="no C compiler: the module has no llmc kernels to name")


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    """A tiny Llama in bf16 for cpu: its decode steps call llmc's matvec and attention kernels."""
    out = tmp_path_factory.mktemp("profile")
    llama = init_random(get_config("tiny"), seed=0)
    return llmc.compile(llama, dtype="bf16", output=out / "tiny.vmfb", max_seq_len=64)


def _text_section(obj: bytes) -> int:
    """File offset of an ELF64 object's .text section."""
    shoff, = struct.unpack_from("<Q", obj, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", obj, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", obj, shoff + i * shentsize) for i in range(shnum)]
    names = sections[shstrndx][4]
    for name, _, _, _, offset, *_ in sections:
        if obj[names + name:names + name + 6] == b".text\0":
            return offset
    raise AssertionError("no .text in the kernels' object")


@needs_kernels
def test_kernel_helpers_are_placed_on_their_own_code(module, tmp_path):
    """Every symbol of the kernels' object, placed in the module's ELF by the tool, starts with the same code
    bytes there as in the object (a placement off by even one byte matches almost nowhere)."""
    obj_path = ukernels.build_object()
    (img,) = pd.images(module.vmfb, obj_path)
    elf = zipfile.ZipFile(module.vmfb).read(img.name)
    obj = obj_path.read_bytes()
    text = _text_section(obj)
    own = pd.nm_functions(obj_path, local=True)
    placed = pd.kernel_locals([(a, n) for a, n in img.symbols], own)
    assert len(placed) == len(own) > 10
    assert any(n == "bf16_groups_512" or n == "bf16_groups" for _, n in own)
    # the executable segment's file offset: vaddr - p_vaddr + p_offset
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    seg = next(s for s in (struct.unpack_from("<IIQQQQQQ", elf, phoff + i * phentsize) for i in range(phnum))
               if s[0] == 1 and s[1] & 1)
    same = sum(elf[a - seg[3] + seg[2]:a - seg[3] + seg[2] + 4] == obj[text + o:text + o + 4]
               for (a, _), (o, _) in zip(placed, own))
    assert same >= 0.8 * len(own), (same, len(own))
    assert img.kernel_start == min(a for a, _ in placed)
    assert img.kernel_start > dict((n, a) for a, n in img.symbols)["iree_hal_executable_library_query"]
    shifted = sum(elf[a + 1 - seg[3] + seg[2]:a + 1 - seg[3] + seg[2] + 4] == obj[text + o:text + o + 4]
                  for (a, _), (o, _) in zip(placed, own))
    assert shifted < 0.2 * len(own)  # the check can fail: one byte off matches almost nowhere


def test_placement_needs_one_distance_for_every_shared_symbol():
    elf = [(0x100, "iree_hal_executable_library_query"), (0x2000, "llmc_a"), (0x2100, "llmc_b")]
    assert pd.kernel_locals(elf, [(0x10, "helper"), (0x40, "llmc_a"), (0x140, "llmc_b")]) == [
        (0x1FD0, "helper"), (0x2000, "llmc_a"), (0x2100, "llmc_b")]
    assert pd.kernel_locals(elf, [(0x10, "helper"), (0x40, "llmc_a"), (0x150, "llmc_b")]) == []  # two distances
    assert pd.kernel_locals(elf, [(0x10, "helper")]) == []  # nothing shared


def _image():
    return pd.Image("lib.so", (0x83E0, 0x14B90), [(0x14550, "iree_hal_executable_library_query"), (0x15110, "bf16_groups_512"),
                                                  (0x16B80, "llmc_matvec_fp8"), (0x18B60, "llmc_attn_decode_bf16")], 0x15110)


def test_regions_are_anonymous_executable_mappings_of_the_text_size():
    img = _image()
    size = img.mapped_size()
    assert size == 0x1D000 - 0x8000
    maps = "\n".join([
        f"7f0000000000-{0x7f0000000000 + size:x} r-xp 00000000 00:00 0 ",
        f"7f1000000000-{0x7f1000000000 + size:x} r-xp 00000000 08:01 1234 /usr/lib/libfoo.so",  # a file: not IREE's
        f"7f2000000000-{0x7f2000000000 + size + PAGE:x} r-xp 00000000 00:00 0 ",  # another size
        f"7f3000000000-{0x7f3000000000 + size:x} rw-p 00000000 00:00 0 ",  # not executable
    ])
    assert [(s, img2.name) for s, _, img2 in pd.executable_regions(maps, [img])] == [(0x7f0000000000, "lib.so")]


def test_parts_by_address_and_file():
    img = _image()
    base = 0x7f0000000000
    regions = [(base, base + img.mapped_size(), img)]
    at = lambda offset: base + offset - 0x8000  # noqa: E731  the segment's page is mapped at base
    assert pd.part_of(at(0x15200), "[unknown]", regions) == "llmc kernel: bf16_groups_512"
    assert pd.part_of(at(0x18B60), "[unknown]", regions) == "llmc kernel: llmc_attn_decode_bf16"
    assert pd.part_of(at(0x9000), "[unknown]", regions) == "IREE dispatch code"
    assert pd.part_of(at(0x14600), "[unknown]", regions) == "IREE dispatch code"  # IREE's library query
    assert pd.part_of(0x1000, "/x/iree/_runtime_libs/_runtime.cpython-311-x86_64-linux-gnu.so", regions) == "IREE runtime"
    assert pd.part_of(0x1000, "/usr/lib/libpython3.11.so.1.0", regions) == "Python"
    assert pd.part_of(0x1000, "/lib/x86_64-linux-gnu/libc.so.6", regions) == "libc"
    assert pd.part_of(0x1000, "[kernel.kallsyms]", regions) == "Linux kernel"
    assert pd.part_of(0x1000, "/x/numpy/_multiarray_umath.so", regions) == "other: _multiarray_umath.so"
    no_object = pd.Image("lib.so", img.text, img.symbols, None)  # no kernels found: all of it IREE's
    assert pd.part_of(at(0x15200), "[unknown]", [(base, base + img.mapped_size(), no_object)]) == "IREE dispatch code"


def test_samples_outside_the_decode_windows_are_dropped():
    text = "\n".join([
        "          python  4407   942.800671:      7f96dea9742c (/tmp/perf-4407.map)",
        "   iree-worker-0  4410   942.900000:          102625 (/x/_runtime.cpython-311-x86_64-linux-gnu.so)",
        "          python  4407   943.500000:            1234 (/usr/lib/libpython3.11.so.1.0)",
        "not a sample line",
    ])
    samples = pd.parse_samples(text)
    assert samples == [(942.800671, 0x7f96dea9742c, "/tmp/perf-4407.map"),
                       (942.9, 0x102625, "/x/_runtime.cpython-311-x86_64-linux-gnu.so"),
                       (943.5, 0x1234, "/usr/lib/libpython3.11.so.1.0")]
    counts = pd.attribute(samples, [(942.85, 943.0), (943.4, 943.6)], [])
    assert counts == {"IREE runtime": 1, "Python": 1}


def test_refusals_are_one_line_and_exit_2(tmp_path, monkeypatch):
    r = main_in_process(pd.main, tmp_path / "missing.vmfb")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "missing.vmfb: no such module" in r.stderr
    dummy = tmp_path / "m.vmfb"
    dummy.write_bytes(b"not a module")
    monkeypatch.setattr(pd.shutil, "which", lambda name: None)
    r = main_in_process(pd.main, dummy)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "needs perf on PATH" in r.stderr
    r = main_in_process(pd.main, dummy, "--decode", "1")
    assert r.returncode == 2 and "--decode >= 2" in r.stderr


def test_modules_it_cannot_profile_are_one_line_and_exit_2(module, tmp_path, monkeypatch):
    """The refusals after perf is found (perf itself is not run: each is refused before the sampling)."""
    monkeypatch.setattr(pd, "_perf", lambda: "perf")
    dummy = tmp_path / "m.vmfb"
    dummy.write_bytes(b"not a module")
    r = main_in_process(pd.main, dummy)  # llmc.load's own refusal, as one line
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("profile_decode: "), r.stderr
    r = main_in_process(pd.main, module.vmfb, "--prompt", "60", "--decode", "10")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "over the module's max-seq-len 64" in r.stderr
    linear = llmc.compile(torch.nn.Linear(8, 4), (torch.randn(2, 8),), output=tmp_path / "lin.vmfb")
    r = main_in_process(pd.main, linear.vmfb)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a language-model module" in r.stderr
    with pytest.raises(pd.ProfileError, match="not a .vmfb IREE can load"):
        pd.images(dummy, None)


def _perf_samples_us() -> bool:
    perf = shutil.which("perf")
    if perf is None:
        return False
    probe = subprocess.run([perf, "record", "-q", "-o", os.devnull, "--", "true"], capture_output=True)
    return probe.returncode == 0


@needs_kernels
@pytest.mark.skipif(not _perf_samples_us(), reason="no perf, or perf may not sample here (kernel.perf_event_paranoid)")
def test_a_real_profile_names_the_kernels(module, tmp_path):
    out = tmp_path / "p.json"
    r = main_in_process(pd.main, module.vmfb, "--prompt", "8", "--decode", "24", "--runs", "3", "--freq", "4000",
                        "--json", out)
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    parts = {p["part"]: p for p in result["parts"]}
    assert sum(p["samples"] for p in result["parts"]) == result["samples"] > 0
    assert result["decode_steps"] == 3 * 23
    assert any(name.startswith("llmc kernel: ") for name in parts), parts
    cpu = sum(p["cpu_ms_per_step"] for p in result["parts"])
    assert 0.3 * result["wall_ms_per_step"] < cpu < 1.5 * result["wall_ms_per_step"]  # 1 thread: CPU time ~ wall time
    assert "| part | share of samples | CPU ms a step |" in r.stdout
