"""Tensor parallelism on cpu: decode step time at N = 1, 2, ... devices (ratios from the same run),
each device's weights as IREE places them, and the compile time and peak RSS of each build; plus
compile-only builds for GPU targets (e.g. 8 x gfx942).

    python tools/bench_tp.py [--config small-125m | --checkpoint CKPT] [--dtype f32] [--tp 1,2]
                             [--threads 1] [--prompt 16] [--decode 16] [--reps 3] [--out out/bench_tp]
    python tools/bench_tp.py --checkpoint CKPT --dtype bf16 --tp 8 --target hip --arch gfx942   # compile-only

Each build is `llmc compile ... --tensor-parallel N` in a child process: wall time and peak RSS (the
child's and its iree-compile's, from wait4). Its final IR (--dump-ir) is compiled once more to IREE's
stream level to read which parameters each device loads (compiler/placement.py), and the .vmfb's
`hal.executable.create` calls are counted (one per device that runs code).

On cpu, a worker process per thread count loads the modules (IREE's `--task_topology_group_count`
is per process: each of a module's N local-task devices gets that many workers) and alternates
--reps rounds (plus a dropped warm-up) of greedy generate(prompt, --decode): decode step time is the
median over rounds of (decode time / steps). Modules whose parameter archives together exceed half
of RAM get one worker each instead (an 8B-shaped model twice would not fit in the page cache): their
rounds are then sequential, not alternating. The greedy tokens of every N are compared with N = 1's.

Writes OUT/bench_tp.json and OUT/bench_tp.md. A benchmark, not a test: figures hold for this machine
and this run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--config", default="small-125m", help="a named Llama config with random weights (seed 0)")
    src.add_argument("--checkpoint", type=Path, help="a Llama checkpoint (Meta .pth + params.json, or an HF folder)")
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--tp", default="1,2", help="device counts, comma-separated")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--arch", default=None)
    ap.add_argument("--threads", default="1", help="cpu: workers per device, comma-separated")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--max-seq-len", type=int, default=None, help="default: prompt + decode + 8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="rounds run before the timed ones and dropped (default 1)")
    ap.add_argument("--iree-flag", action="append", default=[], metavar="FLAG",
                    help="passed on to every `llmc compile` (e.g. --iree-flag=--iree-opt-data-tiling=false), repeatable")
    ap.add_argument("--tokens-from", type=Path, default=None, metavar="BENCH_TP.json",
                    help="compare every N's greedy tokens with N = 1's from this earlier report (same model, prompt and "
                         "decode) instead of this run's first N: for machines whose disk holds one archive at a time")
    ap.add_argument("--out", type=Path, default=Path("out/bench_tp"))
    ap.add_argument("--keep", action="store_true", help="reuse artifacts already in --out (same flags) instead of compiling")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        args.tp = [int(n) for n in args.tp.split(",") if n]
        args.threads = [int(t) for t in args.threads.split(",") if t]
    except ValueError:
        ap.error("--tp and --threads take whole numbers, e.g. 1,2")
    if not args.tp or min(args.tp) < 1 or not args.threads or min(args.threads) < 1 or args.decode < 2 or args.reps < 1 or args.warmup < 0:
        ap.error("--tp >= 1, --threads >= 1, --decode >= 2, --reps >= 1, --warmup >= 0")
    return args


def build(args, n: int, source: Path) -> dict:
    """`llmc compile --tensor-parallel n` in a child: the artifact, wall seconds, peak RSS, placement."""
    from llmc.compiler import placement
    from llmc.compiler.pipeline import Dumper

    out = args.out / f"tp{n}"
    vmfb = out / "model.vmfb"
    cmd = [sys.executable, "-m", "llmc.compiler.cli", "compile", str(source), "--dtype", args.dtype, "--target", args.target,
           "--tensor-parallel", str(n), "--max-seq-len", str(args.max_seq_len), "-o", str(vmfb), "--dump-ir", str(out / "ir")]
    if args.arch:
        cmd += ["--arch", args.arch]
    cmd += [f"--iree-flag={f}" for f in args.iree_flag]
    rec = {"n": n, "vmfb": str(vmfb)}
    if not (args.keep and vmfb.exists()):
        out.mkdir(parents=True, exist_ok=True)
        print(f"bench_tp: compiling --tensor-parallel {n} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        proc = subprocess.Popen(cmd)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            raise SystemExit(f"bench_tp: {' '.join(cmd)} failed (exit {proc.returncode})")
        rec["compile_seconds"] = time.perf_counter() - start
        rec["compile_peak_rss_gb"] = usage.ru_maxrss / 2**20  # kB; the child's and its reaped children's maximum
        (out / "build.json").write_text(json.dumps(rec))
    else:
        rec = {**json.loads((out / "build.json").read_text()), **rec} if (out / "build.json").exists() else rec
    manifest = json.loads(vmfb.with_suffix(".json").read_text())
    rec["irpa_bytes"] = vmfb.with_suffix(".irpa").stat().st_size
    rec["executables_created"] = placement.executables_created(vmfb)
    final = Dumper.last_mlir(out / "ir")
    print(f"bench_tp: reading the placement of --tensor-parallel {n} (iree-compile --compile-to=stream) ...", file=sys.stderr, flush=True)
    loads = placement.parameter_loads(placement.stream_ir(final.read_text(), manifest["iree_flags"]))
    rec["device_param_bytes"] = {str(d): sum(keys.values()) for d, keys in sorted(loads.items())}
    return rec


def worker(spec: dict) -> dict:
    import llmc

    # local-task for every N (cpu only runs here): llmc.load's threads=1 alone would put N = 1 on
    # local-sync (runtime/module.py _default_device), and the ratios to N = 1 would fold that device's gain in
    mods = {n: llmc.load(path, "local-task", threads=spec["threads"]) for n, path in spec["artifacts"].items()}
    samples = {n: [] for n in mods}
    tokens = {}
    warmup = spec["warmup"]
    for rep in range(spec["reps"] + warmup):
        for n, mod in mods.items():
            tokens[n] = mod.generate(spec["prompt"], spec["decode"], stop_at_eos=False)
            g = mod.last_generation
            if rep >= warmup:
                samples[n].append(g.decode_seconds / g.decode_steps)
        print(f"  threads {spec['threads']}, tp {','.join(map(str, mods))}: round {rep + 1}/{spec['reps'] + warmup}"
              f"{' (warm-up)' if rep < warmup else ''}", file=sys.stderr, flush=True)
    return {"threads": spec["threads"], "step_seconds": samples, "tokens": tokens}


def markdown(report: dict) -> str:
    lines = [f"# llmc --tensor-parallel: {report['model']}, --dtype {report['dtype']}, --target {report['target']}\n"]
    lines += ["| N | compile s | peak RSS GB | .irpa GB | executables created | weights per device (IREE's parameter loads) |",
              "|---|---|---|---|---|---|"]
    for b in report["builds"]:
        per = ", ".join(f"{d}: {v / 1e9:.3f} GB" for d, v in b["device_param_bytes"].items())
        cs, rss = b.get("compile_seconds"), b.get("compile_peak_rss_gb")
        lines.append(f"| {b['n']} | {cs:.0f} | {rss:.2f} | {b['irpa_bytes'] / 1e9:.3f} | {b['executables_created']} | {per} |"
                     if cs is not None else f"| {b['n']} | - | - | {b['irpa_bytes'] / 1e9:.3f} | {b['executables_created']} | {per} |")
    if report["runs"]:
        ref = f"; tokens compared with N = 1 of {report['tokens_from']}" if report.get("tokens_from") else ""
        flags = f"; iree flags {' '.join(report['iree_flags'])}" if report.get("iree_flags") else ""
        lines += ["", f"prompt {report['prompt']}, decode {report['decode']}, median of {report['reps']}{ref}{flags}", "",
                  f"| threads per device | N | decode step ms | vs N = {report['runs'][0]['base']} (time) | tokens equal to N = 1 |",
                  "|---|---|---|---|---|"]
        for r in report["runs"]:
            lines.append(f"| {r['threads']} | {r['n']} | {r['step_ms']:.2f} | {r['vs_1']:.2f}x | {r['tokens_equal']} |")
    return "\n".join(lines) + "\n"


def reference_tokens(args, name: str, prompt: list[int]) -> dict[int, list[int]]:
    """N = 1's greedy tokens from the earlier report --tokens-from, which must have run the same case:
    for each of --threads, that thread count's run, else the report's first."""
    try:
        old = json.loads(args.tokens_from.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"bench_tp: --tokens-from {args.tokens_from}: cannot read it as a report ({type(e).__name__}: {e}); "
                         "run this bench with --tp 1 first") from None
    same = (old.get("model"), old.get("dtype"), old.get("prompt_ids"), old.get("decode")) == (name, args.dtype, prompt, args.decode)
    runs = [r for r in old.get("runs", []) if r["n"] == 1]
    if not same or not runs:
        raise SystemExit(f"bench_tp: --tokens-from {args.tokens_from}: not a report of N = 1 on {name}, --dtype {args.dtype}, "
                         f"the same prompt and --decode {args.decode}; run this bench with --tp 1 first")
    return {t: next((r for r in runs if r["threads"] == t), runs[0])["tokens"] for t in args.threads}


def main(argv=None) -> int:
    args = parse(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    import torch

    from llmc.models.llama.config import get_config
    from llmc.models.llama.loaders import load_checkpoint
    from llmc.tools.make_checkpoint import write_checkpoint

    args.out.mkdir(parents=True, exist_ok=True)
    if args.checkpoint:
        source, name = args.checkpoint, args.checkpoint.name
        config = load_checkpoint(args.checkpoint)[0]
    else:
        config, name = get_config(args.config), args.config
        source = args.out / "checkpoint"
        if not source.exists():
            write_checkpoint(config, "hf", source, "f32", 0)
    args.max_seq_len = args.max_seq_len or args.prompt + args.decode + 8
    prompt = torch.randint(0, config.vocab_size, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    # --tokens-from is checked before the builds: a report of another case fails in seconds, not after them
    refs = reference_tokens(args, name, prompt) if args.tokens_from and args.target == "cpu" else None
    builds = [build(args, n, source) for n in args.tp]
    runs = []
    if args.target == "cpu":
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        together = sum(b["irpa_bytes"] for b in builds) < ram / 2
        groups = [builds] if together else [[b] for b in builds]
        for t in args.threads:
            step, tokens = {}, {}
            for group in groups:
                spec = {"threads": t, "artifacts": {b["n"]: b["vmfb"] for b in group}, "prompt": prompt, "decode": args.decode,
                        "reps": args.reps, "warmup": args.warmup}
                proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], stdout=subprocess.PIPE, text=True)
                if proc.returncode:
                    raise SystemExit(f"bench_tp: the worker failed (exit {proc.returncode})")
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                step.update({int(n): statistics.median(v) for n, v in res["step_seconds"].items()})
                tokens.update({int(n): v for n, v in res["tokens"].items()})
            base = args.tp[0]
            ref = refs[t] if refs is not None else tokens[base]
            for n in args.tp:
                runs.append({"threads": t, "n": n, "step_ms": 1e3 * step[n], "vs_1": step[n] / step[base], "base": base,
                             "tokens_equal": f"{sum(a == b for a, b in zip(tokens[n], ref))} of {len(ref)}",
                             "tokens": tokens[n], "alternating": together})
    report = {"model": name, "dtype": args.dtype, "target": args.target, "arch": args.arch, "prompt": args.prompt,
              "prompt_ids": prompt if args.target == "cpu" else None, "decode": args.decode, "reps": args.reps,
              "iree_flags": args.iree_flag, "tokens_from": str(args.tokens_from) if args.tokens_from else None,
              "builds": builds, "runs": runs}
    (args.out / "bench_tp.json").write_text(json.dumps(report, indent=1))
    table = markdown(report)
    (args.out / "bench_tp.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
