"""Where a multi-device module (--tensor-parallel) keeps its weights, read from IREE's own program.

iree-compile's `--compile-to=stream` output states, for each device, the parameters that device
loads into its memory at initialization:

    %results:8, %t = stream.cmd.parameter.load on(#hal.device.affinity<@__device_1>) {
      %scope::%key[%c0_i64] : !stream.resource<constant>{%c32768}, ...

with `%key = util.buffer.constant ... = "shards.1.model.layers.0.mlp.up_proj.weight"` and the size an
index constant. That is the placement IREE executes (the runtime's allocator statistics do not count
parameter loads on local devices), so the tests and tools/bench_tp.py measure per-device weights here.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from llmc.errors import CompileError

_LOAD = re.compile(r"stream\.(?:cmd|async)\.parameter\.load on\(#hal\.device\.affinity<@__device_(\d+)>\) \{(.*?)\n\s*\} =>", re.S)
_ENTRY = re.compile(r"(%[\w.$-]+)::(%[\w.$-]+)\[[^\]]*\] : !stream\.resource<[^>]*>\{(%[\w.$-]+|\d+)\}")
_BUFFER = re.compile(r"(%[\w.$-]+) = util\.buffer\.constant[^=]*= \"((?:[^\"\\]|\\.)*)\"")
_INDEX = re.compile(r"(%[\w.$-]+) = arith\.constant (\d+) : index")


def stream_ir(mlir_text: str, flags: list[str] | tuple[str, ...]) -> str:
    """The module at IREE's stream level: `iree-compile --compile-to=stream` of the torch-dialect
    text with the artifact's flags (the manifest's iree_flags)."""
    from llmc.compiler.iree import iree_compile_path

    with tempfile.TemporaryDirectory(prefix="llmc-stream-") as work:
        src = Path(work) / "input.mlir"
        src.write_text(mlir_text)
        flags = [f for f in flags if f != "--iree-input-type=torch"]
        proc = subprocess.run([iree_compile_path(), str(src), "--iree-input-type=torch", *flags, "--compile-to=stream",
                               "-o", str(Path(work) / "stream.mlir")], capture_output=True, text=True)
        if proc.returncode:
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:300])
            raise CompileError(f"iree-compile --compile-to=stream failed: {first}")
        return (Path(work) / "stream.mlir").read_text()


def parameter_loads(stream_text: str) -> dict[int, dict[str, int]]:
    """device -> {parameter key: bytes} that device loads, from stream IR (one device may load a key
    more than once in several initializers; counted once)."""
    names = {m.group(1): m.group(2) for m in _BUFFER.finditer(stream_text)}
    sizes = {m.group(1): int(m.group(2)) for m in _INDEX.finditer(stream_text)}
    out: dict[int, dict[str, int]] = {}
    for m in _LOAD.finditer(stream_text):
        device = out.setdefault(int(m.group(1)), {})
        for e in _ENTRY.finditer(m.group(2)):
            key = names.get(e.group(2), e.group(2))
            size = e.group(3)
            device[key] = int(size) if size.isdigit() else sizes.get(size, 0)
    return out


def executables_created(vmfb) -> int:
    """How many executables the module creates at load (one per device that runs code; identical
    devices share one binary): the `hal.executable.create` calls in iree-dump-module's listing."""
    import iree._runtime_libs as libs  # iree-base-runtime ships the tool beside its libraries

    tool = Path(libs.__file__).parent / "iree-dump-module"
    proc = subprocess.run([str(tool), str(vmfb)], capture_output=True, text=True)
    if proc.returncode:
        raise CompileError(f"iree-dump-module {vmfb} failed: {proc.stderr.strip()[:300]}")
    return proc.stdout.count("call @hal.executable.create")


_IMPORT = re.compile(r"stream\.tensor\.import on\(#hal\.device\.affinity<@__device_(\d+)>\) (?:consume )?%arg(\d+)\b")


def argument_devices(stream_text: str, function: str) -> dict[int, int]:
    """argument index -> the device IREE imports it on, in the public function `function` of stream
    IR (its `$async` form, which holds the imports; an argument imported on two devices maps to the
    last, and llmc's are imported once)."""
    start = stream_text.find(f"util.func public @{function}$async(")
    if start < 0:
        raise ValueError(f"no public function {function!r} in the stream IR")
    end = stream_text.find("util.func ", start + 1)
    body = stream_text[start:end if end > 0 else len(stream_text)]
    return {int(m.group(2)): int(m.group(1)) for m in _IMPORT.finditer(body)}
