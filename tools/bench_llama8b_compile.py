"""Compile a Llama-3-8B-shaped checkpoint (random weights) on this machine: wall time and peak RSS.

    python tools/bench_llama8b_compile.py --workdir /tmp/l8b [--config llama3-8b] [--format hf|meta]
                                          [--dtype bf16|fp8] [--checkpoint-dtype D] [--max-seq-len 4096] [--keep]

Writes the checkpoint with tools/make_checkpoint.py unless --workdir already holds one, then runs
`llmc compile CHECKPOINT --dtype D --max-seq-len N` as a child process and reports its wall time,
its peak RSS (the largest of llmc's own process and iree-compile's, from getrusage of the waited-for
children), llmc's sampled peak anonymous and file-backed resident memory, the per-phase seconds and
iree-compile's own peak from the manifest, and the artifact sizes. Goal (issue 3): <= 10 min and <= 12 GB for llama3-8b bf16 on a 2-core / 24 GB machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", required=True, type=Path)
    ap.add_argument("--config", default="llama3-8b")
    ap.add_argument("--format", default="hf", choices=["hf", "meta"])
    ap.add_argument("--dtype", default="bf16", help="llmc compile --dtype")
    ap.add_argument("--checkpoint-dtype", default=None, help="dtype of the written checkpoint (default: --dtype; bf16 for fp8)")
    ap.add_argument("--max-seq-len", type=int, default=4096)
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint and the artifacts")
    args = ap.parse_args(argv)

    ckpt_dtype = args.checkpoint_dtype or ("bf16" if args.dtype == "fp8" else args.dtype)
    ckpt = args.workdir / f"{args.config}-{args.format}-{ckpt_dtype}"
    args.workdir.mkdir(parents=True, exist_ok=True)
    if not ckpt.exists():
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, str(Path(__file__).with_name("make_checkpoint.py")), "--config", args.config,
             "--format", args.format, "--dtype", ckpt_dtype, "--out", str(ckpt)],
            check=True,
        )
        print(f"checkpoint written in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    size = sum(p.stat().st_size for p in ckpt.iterdir())
    out = args.workdir / f"{args.config}.vmfb"
    cmd = [sys.executable, "-m", "llmc.compiler.cli", "compile", str(ckpt), "--dtype", args.dtype,
           "--max-seq-len", str(args.max_seq_len), "-o", str(out)]
    t = time.perf_counter()
    proc = subprocess.Popen(cmd)
    peaks = _watch(proc)
    wall = time.perf_counter() - t
    r = proc
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if r.returncode != 0:
        print(f"llmc compile failed with exit {r.returncode}", file=sys.stderr)
        return r.returncode
    manifest = json.loads(out.with_suffix(".json").read_text())
    result = {
        "config": args.config,
        "format": args.format,
        "dtype": args.dtype,
        "max_seq_len": args.max_seq_len,
        "checkpoint_gb": round(size / 1e9, 2),
        "wall_s": round(wall, 1),
        "peak_rss_gb": round(peak_mb / 1024, 2),
        # Sampled every 0.2 s from /proc: anonymous memory (what the compile itself holds) and the
        # file pages mapped in (checkpoint and scratch files: clean pages the kernel can drop).
        "peak_anon_gb": round(peaks["RssAnon"] / 1e6, 2),
        "peak_file_gb": round(peaks["RssFile"] / 1e6, 2),
        "phases_s": manifest["compile"]["seconds"],
        "iree_compile_peak_rss_mb": manifest["compile"]["iree_compile_peak_rss_mb"],
        "vmfb_kb": round(out.stat().st_size / 1e3, 1),
        "irpa_gb": round(out.with_suffix(".irpa").stat().st_size / 1e9, 2),
    }
    print(json.dumps(result, indent=2))
    if not args.keep:
        for suffix in (".vmfb", ".irpa", ".json"):
            out.with_suffix(suffix).unlink(missing_ok=True)
    return 0


def _watch(proc) -> dict:
    """Wait for `proc`, sampling its RssAnon and RssFile (kB, /proc/PID/status); the peak of each."""
    peaks = {"RssAnon": 0, "RssFile": 0}
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                for line in f:
                    key = line.split(":")[0]
                    if key in peaks:
                        peaks[key] = max(peaks[key], int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.2)
    return peaks


if __name__ == "__main__":
    sys.exit(main())
