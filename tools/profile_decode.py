"""Where a cpu module's decode steps spend their time: llmc's C kernels by function, IREE's generated dispatch
code, IREE's runtime, Python, the rest, from `perf` samples of real generate() calls.

    python tools/profile_decode.py OUT.vmfb [--threads 1] [--weights auto] [--prompt 128] [--decode 32]
                                   [--runs 20] [--freq 4000] [--json FILE]

Loads the module as a user does (llmc.load with --threads and --weights), runs one untimed generate, then
--runs greedy generate(prompt, --decode) calls with `perf record` sampling this process's threads (--freq Hz,
CLOCK_MONOTONIC time stamps). Only samples inside each call's decode window are kept: from the end of its
prefill (the first token) to its last token, as Generation times them, so the prefill and the Python
between calls are left out (the window's ends are the loop's own clock readings: a few microseconds of
slack a call).

A sample is named by where its instruction lies:
- inside one of IREE's loaded executables (the .vmfb's embedded ELF, which IREE maps anonymously: each
  anonymous executable mapping is matched to an ELF by the size of its text segment): llmc's kernels by
  function, from the ELF's own symbols (`llmc_matvec_bf16`, ...) and, for the static helpers the linker
  leaves unnamed (`bf16_groups_512`, `attn_head`, ...), from the local symbols of the kernels' object as
  llmc built it (compiler/ukernels.py build_object: its .text is one input section, so every symbol sits
  at the same distance from its place in the ELF; checked on every global symbol both have). Any other
  address of the ELF is "IREE dispatch code" (the dispatches IREE generated: norms, RoPE, cache scatters);
- elsewhere, by the file perf names: IREE's runtime (`_runtime*.so`: the VM, the HAL, the task system),
  Python, libc, the Linux kernel, or the file itself.

Prints, per part, its share of the decode samples and its CPU milliseconds per decode step (samples /
--freq / steps); at more than one thread the parts add up to the CPU time of every thread, which can
exceed the wall time of a step (also printed). Needs Linux on x86-64, `perf` (Debian: linux-perf) allowed
to sample this process (kernel.perf_event_paranoid <= 2 for one's own process), and binutils' `nm`. A
profiler, not a test: the shares move with the machine like every figure here.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from llmc.errors import LlmcError
from llmc.tools.bench import write_atomic

PAGE = 4096


class ProfileError(Exception):
    """A one-line reason this profile cannot be taken (exit 2)."""


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vmfb", type=Path, help="a cpu module with prefill/decode entry points (llmc compile of a Llama)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--weights", default="auto", choices=("auto", "mmap", "memory"), help="llmc.load weights=")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (ids 1..N)")
    ap.add_argument("--decode", type=int, default=32, help="new tokens a call (decode steps: one fewer)")
    ap.add_argument("--runs", type=int, default=20, help="profiled generate calls")
    ap.add_argument("--freq", type=int, default=4000, help="perf's sampling rate, Hz")
    ap.add_argument("--json", type=Path, help="also write the parts and the raw counts here")
    args = ap.parse_args(argv)
    if args.threads < 1 or args.prompt < 1 or args.decode < 2 or args.runs < 1 or args.freq < 1:
        ap.error("--threads, --prompt, --runs, --freq >= 1 and --decode >= 2")
    return args


# --- the executables inside a .vmfb, and their symbols --------------------------------------------------

@dataclass
class Image:
    """One embedded ELF: its text segment (vaddr, size) and its function symbols [(address, name)], sorted."""

    name: str
    text: tuple[int, int]
    symbols: list[tuple[int, str]] = field(default_factory=list)
    kernel_start: int | None = None  # where llmc's kernels begin: the object's first symbol, else the first llmc_ one

    def mapped_size(self) -> int:
        """The length of the anonymous mapping IREE's loader makes of the text segment (whole pages)."""
        start, size = self.text
        return -(-(start + size) // PAGE) * PAGE - start // PAGE * PAGE


def text_segment(elf: bytes) -> tuple[int, int]:
    """(vaddr, memsz) of the executable PT_LOAD segment of a 64-bit little-endian ELF."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ProfileError("an embedded executable is not a 64-bit little-endian ELF")
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for i in range(phnum):
        p_type, p_flags, _, p_vaddr, _, _, p_memsz, _ = struct.unpack_from("<IIQQQQQQ", elf, phoff + i * phentsize)
        if p_type == 1 and p_flags & 1:  # PT_LOAD, PF_X
            return p_vaddr, p_memsz
    raise ProfileError("an embedded executable has no executable segment")


def nm_functions(path: Path, local: bool) -> list[tuple[int, str]]:
    """Function symbols of an ELF file or object (`nm --defined-only`): global ones ('T'), and local ones
    ('t') too when `local`."""
    nm = shutil.which("nm")
    if nm is None:
        raise ProfileError("needs binutils' nm to name the kernels' functions (Debian: apt-get install binutils)")
    out = subprocess.run([nm, "--defined-only", str(path)], capture_output=True, text=True)
    if out.returncode:
        raise ProfileError(f"nm could not read {path.name}: {out.stderr.strip().splitlines()[-1:]}")
    found = []
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) == 3 and (f[1] == "T" or (local and f[1] == "t")):
            found.append((int(f[0], 16), f[2]))
    return sorted(found)


def kernel_locals(elf_symbols: list[tuple[int, str]], object_symbols: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The object's symbols placed in the ELF: every global symbol both have must sit at one distance
    (the object's .text linked whole); [] where they do not, or share none."""
    in_elf = dict((n, a) for a, n in elf_symbols)
    deltas = {in_elf[n] - a for a, n in object_symbols if n in in_elf}
    if len(deltas) != 1:
        return []
    delta = deltas.pop()
    return [(a + delta, n) for a, n in object_symbols]


def images(vmfb: Path, kernels_object: Path | None) -> list[Image]:
    """The .vmfb's embedded ELFs (its zip members ending in .so), each with its symbols: the ELF's own, and
    the kernels' object's local ones placed in it where the object is the one linked in."""
    try:
        archive = zipfile.ZipFile(vmfb)
    except (OSError, zipfile.BadZipFile) as e:
        raise ProfileError(f"{vmfb}: not a .vmfb IREE can load ({e})") from e
    found = []
    obj = nm_functions(kernels_object, local=True) if kernels_object else []
    with archive, tempfile.TemporaryDirectory(prefix="llmc-profile-") as d:
        for member in archive.namelist():
            if not member.endswith(".so"):
                continue
            data = archive.read(member)
            path = Path(d) / Path(member).name
            path.write_bytes(data)
            own = nm_functions(path, local=False)
            placed = kernel_locals(own, obj)
            merged = sorted(set(own) | set(placed))
            ours = [a for a, _ in placed] or [a for a, n in own if n.startswith("llmc_")]
            found.append(Image(member, text_segment(data), merged, min(ours) if ours else None))
    if not found:
        raise ProfileError(f"{vmfb}: no embedded llvm-cpu executable inside (a cpu module is needed)")
    return found


def executable_regions(maps_text: str, imgs: list[Image]) -> list[tuple[int, int, Image]]:
    """(start, end, image) of each anonymous executable mapping whose size is one image's text size: where
    IREE's loader put that image's code (its load base is start - the segment's page-rounded vaddr)."""
    by_size: dict[int, list[Image]] = {}
    for img in imgs:
        by_size.setdefault(img.mapped_size(), []).append(img)
    regions = []
    for line in maps_text.splitlines():
        f = line.split()
        if len(f) < 5 or "x" not in f[1] or (len(f) > 5 and not f[5].startswith("[anon")):
            continue
        start, end = (int(v, 16) for v in f[0].split("-"))
        candidates = by_size.get(end - start, [])
        if len(candidates) == 1:
            regions.append((start, end, candidates[0]))
    return sorted(regions, key=lambda r: r[0])


# --- samples ----------------------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^\s*(?P<comm>.+?)\s+(?P<tid>\d+)\s+(?P<time>\d+\.\d+):\s+(?P<ip>[0-9a-f]+)\s+\((?P<dso>.*)\)\s*$")


def parse_samples(text: str) -> list[tuple[float, int, str]]:
    """(time s, instruction address, file) of each line `perf script -F comm,tid,time,ip,dso` prints."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out.append((float(m["time"]), int(m["ip"], 16), m["dso"]))
    return out


def in_windows(t: float, windows: list[tuple[float, float]]) -> bool:
    i = bisect.bisect_right(windows, (t, float("inf"))) - 1
    return i >= 0 and windows[i][0] <= t <= windows[i][1]


def part_of(ip: int, dso: str, regions: list[tuple[int, int, Image]], starts: list[int] | None = None) -> str:
    """The part of the program a sampled address belongs to (the module docstring's list). starts: the
    regions' start addresses, when the caller names many samples against the same regions."""
    i = bisect.bisect_right(starts if starts is not None else [r[0] for r in regions], ip) - 1
    if i >= 0 and ip < regions[i][1]:
        start, _, img = regions[i]
        offset = ip - start + img.text[0] // PAGE * PAGE
        if img.kernel_start is not None and offset >= img.kernel_start:
            j = bisect.bisect_right(img.symbols, (offset, "\uffff")) - 1
            return f"llmc kernel: {img.symbols[j][1]}"
        return "IREE dispatch code"
    base = os.path.basename(dso)
    if "_runtime" in base:
        return "IREE runtime"
    if base.startswith("libpython") or base.startswith("python"):
        return "Python"
    if base.startswith("libc.so") or base.startswith("libc-"):
        return "libc"
    if "kernel.kallsyms" in base or base.startswith("[vdso"):
        return "Linux kernel"
    return f"other: {base or 'unknown'}"


def attribute(samples, windows, regions) -> dict[str, int]:
    """Decode-window samples counted per part."""
    counts: dict[str, int] = {}
    starts = [r[0] for r in regions]
    for t, ip, dso in samples:
        if in_windows(t, windows):
            p = part_of(ip, dso, regions, starts)
            counts[p] = counts.get(p, 0) + 1
    return counts


# --- the run ----------------------------------------------------------------------------------------------

def _perf() -> str:
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        raise ProfileError("Linux on x86-64 only (perf, and llmc's cpu kernels are x86-64)")
    perf = shutil.which("perf")
    if perf is None:
        raise ProfileError("needs perf on PATH (Debian: apt-get install linux-perf)")
    return perf


def profile(args) -> dict:
    perf = _perf()
    import llmc
    from llmc.compiler import ukernels

    mod = llmc.load(args.vmfb, threads=args.threads, weights=args.weights)
    if not mod.manifest.get("llm"):
        raise ProfileError(f"{args.vmfb}: not a language-model module (no prefill/decode entry points)")
    if mod.manifest.get("target", {}).get("backend") != "llvm-cpu":
        raise ProfileError(f"{args.vmfb}: a {mod.manifest.get('target', {}).get('name')} module; this profiles cpu modules")
    cap = int(mod.manifest["llm"]["max_seq_len"])
    if args.prompt + args.decode > cap:
        raise ProfileError(f"--prompt {args.prompt} + --decode {args.decode} is over the module's max-seq-len {cap}")
    prompt = [1 + i % 100 for i in range(args.prompt)]
    mod.generate(prompt, args.decode, stop_at_eos=False)  # loads, warms up, leaves a cache behind
    obj = ukernels.build_object() if ukernels.c_compiler() else None
    regions = executable_regions(Path("/proc/self/maps").read_text(), images(args.vmfb, obj))
    if not regions:
        raise ProfileError("found none of the module's executables in this process's memory (IREE loaded them differently?)")
    with tempfile.TemporaryDirectory(prefix="llmc-profile-") as d:
        data = Path(d) / "perf.data"
        rec = subprocess.Popen([perf, "record", "-q", "-F", str(args.freq), "-k", "CLOCK_MONOTONIC", "-T",
                                "-p", str(os.getpid()), "-o", str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # perf attaches to every thread before the first call
        if rec.poll() is not None:
            raise ProfileError(f"perf record could not sample this process: {rec.stderr.read().decode().strip().splitlines()[-1:]}"
                               " (kernel.perf_event_paranoid, or a container without perf events)")
        windows, steps, wall = [], 0, 0.0
        for _ in range(args.runs):
            t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
            mod.generate(prompt, args.decode, stop_at_eos=False)
            g = mod.last_generation
            windows.append((t0 + g.prefill_seconds, t0 + g.prefill_seconds + g.decode_seconds))
            steps += g.decode_steps
            wall += g.decode_seconds
        rec.send_signal(signal.SIGINT)
        rec.wait(timeout=60)
        script = subprocess.run([perf, "script", "-i", str(data), "-F", "comm,tid,time,ip,dso"], capture_output=True, text=True)
    samples = parse_samples(script.stdout)
    counts = attribute(samples, windows, regions)
    total = sum(counts.values())
    if not total:
        raise ProfileError("perf recorded no sample inside a decode step (a --freq too low, or --decode too short)")
    parts = [{"part": p, "share": n / total, "cpu_ms_per_step": n / args.freq / steps * 1e3, "samples": n}
             for p, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return {"vmfb": str(args.vmfb), "threads": args.threads, "weights": mod.weights, "prompt": args.prompt,
            "decode_steps": steps, "wall_ms_per_step": wall / steps * 1e3, "freq": args.freq, "samples": total,
            "images": [{"name": img.name, "mapped_at": hex(s)} for s, _, img in regions], "parts": parts,
            "function": mod.last_generation.decode_function}


def report(result: dict) -> str:
    lines = [f"# decode profile: {Path(result['vmfb']).name}, {result['threads']} thread(s), weights {result['weights']}, "
             f"{result['decode_steps']} steps of {result['function']} after a {result['prompt']}-token prompt",
             "", f"wall {result['wall_ms_per_step']:.3f} ms a step; {result['samples']} samples at {result['freq']} Hz", "",
             "| part | share of samples | CPU ms a step |", "|---|---|---|"]
    lines += [f"| {p['part']} | {100 * p['share']:.1f}% | {p['cpu_ms_per_step']:.3f} |" for p in result["parts"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse(argv)
    try:
        if not args.vmfb.is_file():
            raise ProfileError(f"{args.vmfb}: no such module; give the .vmfb llmc compile wrote")
        result = profile(args)
    except (ProfileError, LlmcError) as e:  # LlmcError: llmc.load's refusals (not a module, no .irpa, another CPU)
        print(f"profile_decode: {e}", file=sys.stderr)
        return 2
    print(report(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(args.json, json.dumps(result, indent=1).encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
