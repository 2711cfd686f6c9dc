"""int8 PT2E programs compiled by llmc against the same model in float, measured alternately in one run.

    python tools/bench_int8.py [--models linear-stack,convnet] [--schemes xnnpack,x86] [--threads 1]
                               [--reps 7] [--iters 10] [--out out/bench_int8]

For each model (llmc.models.quantized: a 4 x Linear(1024, 1024) stack at batch 64, the conv net at
batch 32) and each PT2E scheme (signed int8 activations, "xnnpack"; unsigned, "x86" =
X86InductorQuantizer), the float model is quantized with torchao's PT2E flow and saved as a .pt2;
then, in this one process, with `--threads` for IREE and torch:
  - llmc int8:   `llmc compile MODEL_int8.pt2` (cpu);
  - llmc f32:    the float model, `llmc compile --dtype f32`;
  - eager float: the float nn.Module;
  - eager PT2E:  the converted (Q/DQ) module, as PyTorch runs it.
Each round runs every engine --iters times in turn (after one untimed call); --reps rounds, the
median round is reported, in ms per forward, with llmc int8's speed-up over each other engine.
The issue's bar: llmc int8 >= 1.3x llmc f32 on the linear stack for both schemes.

Writes OUT/bench_int8.json (every sample, medians, ratios, machine facts) and prints the table.
Figures hold for this machine and run; compare ratios. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="linear-stack,convnet")
    ap.add_argument("--schemes", default="xnnpack,x86")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("out/bench_int8"))
    return ap.parse_args(argv)


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main(argv=None) -> int:
    args = parse(argv)
    warnings.filterwarnings("ignore")
    import llmc
    from llmc.models import quantized

    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    batches = {"linear-stack": 64, "convnet": 32}
    engines: dict[str, dict] = {}  # "model/scheme" -> {engine: callable}
    inputs = {}
    for name in args.models.split(","):
        model, ex = quantized.build(name, seed=0, batch=batches.get(name))
        f32_pt2 = args.out / f"{name}_f32.pt2"
        torch.export.save(torch.export.export(model, ex), str(f32_pt2))
        print(f"compiling {name} f32 ...", flush=True)
        f32 = llmc.load(llmc.compile(f32_pt2, dtype="f32", output=args.out / f"{name}_f32.vmfb", quiet=True), threads=args.threads)
        for scheme in args.schemes.split(","):
            converted = quantized.pt2e(model, ex, scheme)
            pt2 = args.out / f"{name}_{scheme}.pt2"
            quantized.save(converted, ex, pt2)
            print(f"compiling {name} int8 ({scheme}) ...", flush=True)
            int8 = llmc.load(llmc.compile(pt2, output=args.out / f"{name}_{scheme}.vmfb", quiet=True), threads=args.threads)
            key = f"{name}/{scheme}"
            inputs[key] = ex
            engines[key] = {"llmc int8": int8, "llmc f32": f32, "eager float": model, "eager PT2E": converted}

    samples: dict[str, dict[str, list[float]]] = {k: {e: [] for e in v} for k, v in engines.items()}
    with torch.no_grad():
        for key, table in engines.items():
            for fn in table.values():
                fn(*inputs[key])  # warm-up (first IREE call loads the executables)
        for _ in range(args.reps):
            for key, table in engines.items():
                for engine, fn in table.items():
                    t = time.perf_counter()
                    for _ in range(args.iters):
                        fn(*inputs[key])
                    samples[key][engine].append((time.perf_counter() - t) / args.iters * 1e3)

    report = {"machine": {"cpu": _cpu(), "cores": os.cpu_count(), "threads": args.threads, "python": sys.version.split()[0],
                          "torch": torch.__version__},
              "reps": args.reps, "iters": args.iters, "results": {}}
    print(f"\nms per forward (median of {args.reps} rounds x {args.iters}), {args.threads} thread(s), {_cpu()}")
    print(f"{'model/scheme':<24}{'llmc int8':>11}{'llmc f32':>10}{'eager float':>13}{'eager PT2E':>12}   int8 speed-up vs llmc f32 / eager float / eager PT2E")
    for key, table in samples.items():
        med = {e: statistics.median(v) for e, v in table.items()}
        ratio = {e: med[e] / med["llmc int8"] for e in med if e != "llmc int8"}
        report["results"][key] = {"samples_ms": table, "median_ms": med, "int8_speedup": ratio}
        print(f"{key:<24}{med['llmc int8']:>11.2f}{med['llmc f32']:>10.2f}{med['eager float']:>13.2f}{med['eager PT2E']:>12.2f}   "
              f"{ratio['llmc f32']:.2f}x / {ratio['eager float']:.2f}x / {ratio['eager PT2E']:.2f}x")
    path = args.out / "bench_int8.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(path)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
