"""llmc's cpu one-row product kernels on a model's decode-step products, streamed from memory, against a plain read.

    python tools/bench_matvec.py [--config small-125m] [--kinds fp8,bf16,int8] [--layers N] [--rounds 15]
                                 [--threads N] [--arch host] [--json OUT]

What a decode step's linear layers cost when each is one of compiler/csrc/matvec_x86_64.c's loops, without
IREE around them: the kernels' object as llmc builds it (compiler/ukernels.py build_object) linked into a small
C driver (tools/csrc/bench_matvec.c, built here with the same C compiler), over every product of a step in the
order it runs them (q, k, v, o, gate, up, down of each layer, then the LM head), in the packed layout and the
workgroup split llmc compiles (ukernels.groups_per_workgroup; bf16's C function and stream threshold for
--arch from ukernels.bf16_matvec; fp8dp: fp8 as a build for CPUs with AVX512_BF16 runs it, in the pair layout
with x as two bf16 halves, made by the driver as the graph makes them), one thread, weights in 2 MB pages, denormals flushed as in IREE's workers.
With --threads N, N pinned threads: the plain read split into N contiguous parts, the products with each product's
workgroups handed out one at a time (IREE's order) and a spinning barrier after each product, and a third timing
(`stream`) of every workgroup split into N contiguous runs with no barrier; the last product is checked as the
threads leave it. That separates the loops' own 2-thread rate from IREE's hand-off between dispatches.
Each round reads each kind's bytes once plainly (four 256-bit loads per 128 bytes into four f32 sums: the round's
roofline, as fast as tools/bench.py's torch sum) and
then runs its products; kinds alternate their order from round to round. Reports, per kind, the kernels'
GB/s and their per-round ratio to the plain read (medians, with the range), and checks the first product
against a double-precision sum of the same decoded weights.

This separates the loops from the rest of a step: tools/bench.py's decode figure is the whole step in IREE
(the kernels, the attention, the small dispatches, the call). The machine's read rate drifts by 20-30% within
minutes, so compare ratios from one run, not GB/s across runs. A benchmark, not a test: it exits 0 unless
something fails to build or run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

DRIVER = Path(__file__).parent / "csrc" / "bench_matvec.c"
KINDS = ("fp8", "bf16", "int8", "fp8dp")  # fp8dp: fp8 in the pair layout a build for AVX512_BF16 CPUs packs
BYTES = {"fp8": 1, "int8": 1, "bf16": 2, "fp8dp": 1}


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="small-125m", help="a named Llama config (models/llama/config.py)")
    ap.add_argument("--kinds", default="fp8,bf16,int8", help="weight kinds, comma-separated (fp8, bf16, int8, fp8dp: the "
                    "dot-product loop a build for CPUs with AVX512_BF16 runs for fp8, passes/_packed.py pack_pairs)")
    ap.add_argument("--layers", type=int, default=None, help="layers to stream (default: all of the config's)")
    ap.add_argument("--no-head", action="store_true", help="leave the LM head out")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1, help="threads (default 1): with more, each round also times "
                    "the products with IREE's hand-out of workgroups but a spinning barrier between products, and the "
                    "loops alone with no barrier (`stream`)")
    ap.add_argument("--arch", default="host", help="llvm-cpu --arch whose bf16 loop to run (default host)")
    ap.add_argument("--json", type=Path, help="also write every round and the medians here")
    args = ap.parse_args(argv)
    args.kinds = [k for k in args.kinds.split(",") if k]
    bad = [k for k in args.kinds if k not in KINDS]
    if bad or not args.kinds:
        ap.error(f"--kinds {','.join(bad) or '(none)'}: choose from {', '.join(KINDS)}")
    if args.rounds < 1 or (args.layers is not None and args.layers < 1):
        ap.error("--rounds and --layers must be at least 1")
    if not 1 <= args.threads <= 64:
        ap.error("--threads must be 1 to 64")
    return args


def products(config, layers: int, head: bool) -> list[tuple[int, int]]:
    """(N, K) of each one-row product of a decode step, in the order the step runs them."""
    hd = config.dim // config.n_heads
    q, kv = config.n_heads * hd, config.n_kv_heads * hd
    layer = [(q, config.dim), (kv, config.dim), (kv, config.dim), (config.dim, q),
             (config.ffn_dim, config.dim), (config.ffn_dim, config.dim), (config.dim, config.ffn_dim)]
    return layer * layers + ([(config.vocab_size, config.dim)] if head else [])


def spec(kind: str, shapes: list[tuple[int, int]], arch: str) -> str:
    """The driver's SPEC for `kind`: its C function, its last argument (bf16: the stream threshold; fp8, int8:
    the prefetch distance), the packed group's channels (the layout the compile packs for the kernels),
    GROUPSxKxPER per product."""
    from llmc.compiler import ukernels

    group = ukernels.KINDS[kind][1]
    if kind == "bf16":
        arg, function = ukernels.bf16_matvec(arch)
    else:  # fp8dp's function takes no last argument
        arg, function = ukernels.matvec_prefetch(arch) if kind in ("fp8", "int8") else 0, f"llmc_matvec_{kind}"
    items = []
    for n, k in shapes:
        groups = -(-n // group)
        items.append(f"{groups}x{k}x{ukernels.groups_per_workgroup(kind, groups, k)}")
    return f"{kind}:{function}:{arg}:{group}:{','.join(items)}"


def build(folder: Path) -> Path:
    """The driver linked with the kernels' object (the C compiler llmc builds the kernels with)."""
    from llmc.compiler import ukernels

    obj = ukernels.build_object()
    exe = folder / "bench_matvec"
    proc = subprocess.run([ukernels.c_compiler(), "-O2", "-mavx2", str(DRIVER), str(obj), "-o", str(exe), "-lm", "-pthread"],
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"bench_matvec: the driver did not build: {proc.stderr.strip().splitlines()[-1:]}")
    return exe


def summarize(lines: list[str]) -> tuple[dict, int]:
    """({kind: check error, samples (read s, kernel s, bytes) per round, medians}, bytes in 2 MB pages or -1)
    from the driver's output."""
    out: dict[str, dict] = {}
    huge = -1
    for line in lines:
        f = line.split()
        if f and f[0] == "huge":
            huge = int(f[1])
        elif f and f[0] == "check":
            out.setdefault(f[1], {"rounds": []})["check"] = float(f[2])
        elif f and f[0] == "check_threads":  # the last product as the threads left it, per mode
            out.setdefault(f[1], {"rounds": []}).setdefault("check_threads", {})[f[2]] = float(f[3])
        elif f and f[0] == "round":
            read_s, kernel_s, nbytes = float(f[3]), float(f[4]), int(f[5])
            out.setdefault(f[2], {"rounds": []})["rounds"].append({"read_s": read_s, "kernel_s": kernel_s, "bytes": nbytes})
        elif f and f[0] == "stream":  # follows its round's line
            out[f[2]]["rounds"][-1]["stream_s"] = float(f[3])
    for kind, r in out.items():
        rates = [s["bytes"] / s["kernel_s"] / 1e9 for s in r["rounds"]]
        reads = [s["bytes"] / s["read_s"] / 1e9 for s in r["rounds"]]
        ratios = [s["read_s"] / s["kernel_s"] for s in r["rounds"]]
        r.update(gb_s=statistics.median(rates), gb_s_range=[min(rates), max(rates)], read_gb_s=statistics.median(reads),
                 ratio=statistics.median(ratios), ratio_range=[min(ratios), max(ratios)])
        streams = [s["read_s"] / s["stream_s"] for s in r["rounds"] if "stream_s" in s]
        if streams:
            r.update(stream_ratio=statistics.median(streams), stream_ratio_range=[min(streams), max(streams)])
    return out, huge


def worst_check(r: dict) -> float:
    """The kind's largest check error: the first product's, and with threads the last product's per mode (NaN
    where a channel was never written; NaN wins)."""
    errors = [r["check"], *r.get("check_threads", {}).values()]
    return max(errors, key=lambda e: (math.isnan(e), e))


def main(argv=None) -> int:
    args = parse(argv)
    from llmc.compiler import ukernels
    from llmc.errors import CompileError
    from llmc.models.llama.config import get_config
    from llmc.runtime.weights import mem_available

    if os.uname().machine != "x86_64" or ukernels.c_compiler() is None:
        print("bench_matvec: needs x86-64 and a C compiler (the kernels are x86-64 C)", file=sys.stderr)
        return 2
    config = get_config(args.config)
    layers = config.n_layers if args.layers is None else min(args.layers, config.n_layers)
    shapes = products(config, layers, not args.no_head)
    need = max(BYTES[k] for k in args.kinds) * sum(n * k for n, k in shapes)
    free = mem_available()  # 0: unknown
    if free and need > 0.7 * free:
        print(f"bench_matvec: {args.config} x {layers} layers is {need / 1e9:.1f} GB of {max(args.kinds, key=BYTES.get)} "
              f"weights, over 70% of the {free / 1e9:.1f} GB available: give fewer --layers", file=sys.stderr)
        return 2
    print(f"bench_matvec: {args.config}, {layers} layer(s){'' if args.no_head else ' + LM head'}, {len(shapes)} products, "
          f"kinds {', '.join(args.kinds)}, {args.rounds} rounds, {args.threads} thread(s)", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="llmc-bench-matvec-") as d:
        try:
            exe = build(Path(d))
        except CompileError as e:
            print(f"bench_matvec: {e}", file=sys.stderr)
            return 2
        proc = subprocess.run([str(exe), "-t", str(args.threads), str(args.rounds), *(spec(k, shapes, args.arch) for k in args.kinds)],
                              capture_output=True, text=True)
    if proc.returncode:
        print(f"bench_matvec: the driver failed ({proc.returncode}): {proc.stderr.strip()}", file=sys.stderr)
        return 1
    result, huge = summarize(proc.stdout.splitlines())
    weights = max(r["rounds"][0]["bytes"] for r in result.values())
    print(f"bench_matvec: weights {weights / 1e9:.2f} GB, of which in 2 MB pages: "
          + (f"{min(huge, weights) / 1e9:.2f} GB" if huge >= 0 else "unknown (no /proc/self/smaps_rollup)"), file=sys.stderr)
    many = args.threads > 1
    print(f"| kind | GB of weights | kernels GB/s (range) | plain read GB/s | kernels / read, per round (range) |"
          + (" no barriers / read (range) |" if many else "") + " check |")
    print("|---|---|---|---|---|" + ("---|" if many else "") + "---|")
    for kind in args.kinds:
        r = result[kind]
        stream = f" {r['stream_ratio']:.3f} ({r['stream_ratio_range'][0]:.3f}-{r['stream_ratio_range'][1]:.3f}) |" if many else ""
        print(f"| {kind} | {r['rounds'][0]['bytes'] / 1e9:.2f} | {r['gb_s']:.1f} ({r['gb_s_range'][0]:.1f}-{r['gb_s_range'][1]:.1f}) | "
              f"{r['read_gb_s']:.1f} | {r['ratio']:.3f} ({r['ratio_range'][0]:.3f}-{r['ratio_range'][1]:.3f}) |{stream} {worst_check(r):.1e} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"config": args.config, "layers": layers, "head": not args.no_head, "arch": args.arch, "threads": args.threads,
                                         "huge_page_bytes": huge, "weight_bytes": weights, "kinds": result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
