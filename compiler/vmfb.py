"""What a .vmfb holds: its executables (format, and the architecture the binary itself names) and the
device target it was compiled for.

    info = vmfb.inspect("out/model.vmfb")
    info.formats          # {"rocm-hsaco-fb"}
    info.binary_archs     # {"gfx942"}: read from the code objects, not from llmc's manifest
    info.target_archs     # {"gfx942"}: from the module's own #iree_gpu.target
    info.dispatches       # ("main$async_dispatch_5_attention_2x2x8x16x16x8", ...): what IREE formed

An IREE module is a FlatBuffer that is also a zip archive: `module.fb` (the VM bytecode) and one
entry per executable, named `<dispatch>_<format>.fb` (`.so` for llvm-cpu). The binaries carry their
architecture: an AMDGPU code object names its processor in its metadata (`...-amd-amdhsa-unknown-gfx942`),
PTX its `.target sm_90`; SPIR-V has none, but the module keeps the device target it was built for
(IREE's "device not found" message embeds it, `arch = "llvmpipe"`, `subgroup_size_choices = [8]`).
Compile-only tests read these, so that a build that silently fell back to another target or arch
cannot pass; `llmc info` prints them.
"""

from __future__ import annotations

import dataclasses
import re
import zipfile
from pathlib import Path

# Executable entry suffix -> IREE executable format.
_FORMATS = {
    "_vulkan_spirv_fb.fb": "vulkan-spirv-fb",
    "_rocm_hsaco_fb.fb": "rocm-hsaco-fb",
    "_cuda_nvptx_fb.fb": "cuda-nvptx-fb",
    "_embedded_elf_x86_64.so": "embedded-elf-x86_64",
    "_embedded_elf_arm_64.so": "embedded-elf-arm_64",
}
_SPIRV_MAGIC = b"\x03\x02\x23\x07"  # 0x07230203, little-endian


@dataclasses.dataclass(frozen=True)
class Executable:
    name: str  # the zip entry
    format: str
    arch: str | None  # what the binary names (gfx942, sm_90; None for SPIR-V and CPU code)
    bytes: int
    valid: bool  # the payload is what the format says (SPIR-V magic, ELF code object, PTX text)


@dataclasses.dataclass(frozen=True)
class ModuleInfo:
    path: Path
    executables: tuple[Executable, ...]
    target_archs: frozenset[str]  # `arch = "..."` of the module's GPU device targets
    subgroup_sizes: tuple[int, ...]  # subgroup_size_choices of those targets (first target)
    # The dispatch functions the VM module calls, named by IREE after their root op and shape
    # (`<function>$async_dispatch_<n>_<op>_<shape>_<types>`; `_initializer_<k>_dispatch_...` for work
    # IREE hoisted to load time): tests read which ops IREE formed, e.g. its fused attention op.
    dispatches: tuple[str, ...] = ()

    @property
    def formats(self) -> set[str]:
        return {e.format for e in self.executables}

    @property
    def binary_archs(self) -> set[str]:
        return {e.arch for e in self.executables if e.arch}

    def summary(self) -> str:
        n = len(self.executables)
        formats = ", ".join(sorted(self.formats)) or "none"
        text = f"{n} executable{'s' if n != 1 else ''} ({formats})"
        archs = sorted(self.binary_archs | set(self.target_archs))
        if archs:
            text += f", built for {', '.join(archs)}"
        if self.subgroup_sizes:
            text += f", subgroup size {'/'.join(map(str, self.subgroup_sizes))}"
        return text


def _executable(name: str, data: bytes) -> Executable | None:
    # A module with several variants of a format (one per CPU: --arch portable) numbers them: `_0.so`, `_1.so`.
    base = re.sub(r"_[0-9]+(\.[a-z]+)$", r"\1", name)
    fmt = next((f for suffix, f in _FORMATS.items() if name.endswith(suffix) or base.endswith(suffix)), None)
    if fmt is None:
        return None
    arch, valid = None, False
    if fmt == "vulkan-spirv-fb":
        valid = _SPIRV_MAGIC in data
    elif fmt == "rocm-hsaco-fb":
        m = re.search(rb"-amd-amdhsa-[a-z]*-(gfx[0-9a-f]+)", data)
        arch, valid = (m.group(1).decode() if m else None), b"\x7fELF" in data
    elif fmt == "cuda-nvptx-fb":
        m = re.search(rb"\.target\s+(sm_[0-9a-z]+)", data)
        arch, valid = (m.group(1).decode() if m else None), b".version" in data
    else:
        valid = data[:4] == b"\x7fELF"
    return Executable(name, fmt, arch, len(data), valid)


def inspect(path) -> ModuleInfo:
    """Read a .vmfb's executables and device targets. Raises ValueError if it is not an IREE module."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            if "module.fb" not in z.namelist():
                raise ValueError(f"{path}: no module.fb inside; not an IREE module")
            module = z.read("module.fb")
            exes = [e for n in z.namelist() if (e := _executable(n, z.read(n))) is not None]
    except zipfile.BadZipFile as e:
        raise ValueError(f"{path}: not an IREE module ({e})") from e
    archs = frozenset(m.decode() for m in re.findall(rb'#iree_gpu\.target<arch = "([^"]+)"', module))
    m = re.search(rb"subgroup_size_choices = \[([0-9, ]+)\]", module)
    sizes = tuple(int(x) for x in m.group(1).split(b",")) if m else ()
    return ModuleInfo(path, tuple(exes), archs, sizes, _dispatch_names(module))


def _dispatch_names(module: bytes) -> tuple[str, ...]:
    """Dispatch function names in the VM module: FlatBuffer strings, each after its 4-byte length."""
    names = set()
    for m in re.finditer(rb"[A-Za-z_][A-Za-z0-9_]*\$?[A-Za-z0-9_]*dispatch_[0-9]+_[A-Za-z0-9_]+", module):
        start = m.start()
        length = int.from_bytes(module[start - 4 : start], "little") if start >= 4 else 0
        if 0 < length <= m.end() - start:
            names.add(module[start : start + length].decode())
    return tuple(sorted(names))
