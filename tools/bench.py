"""Prefill and decode speed of llmc artifacts against eager PyTorch on the same weights, with the
memory-bandwidth roofline measured in the same run.

    python tools/bench.py [--config small-125m] [--dtypes f32,bf16,fp8] [--threads 1,2]
                          [--prompt 128] [--decode 32] [--reps 3] [--out out/bench]
    python tools/bench.py --checkpoint CKPT [--eager bf16] ...   # any Llama checkpoint (Meta or HF)

Compiles one artifact per `--dtypes` entry for cpu (fp8 and int8 with `--quant-embeddings`), then for each
thread count starts a worker process (IREE's CPU device and torch's thread pool are per process, so
no run inherits another's threads). A worker loads every artifact with that thread count, sets
torch.set_num_threads to it, then alternates --reps rounds (plus one dropped warm-up round) of: read
bandwidth (torch sum over 256 MiB of f32 in 2 MB pages, median of 3, the roofline; and the same from
4 KB pages, reported; measured in every round because this
project's machines drift by 20-30% within minutes, so the roofline is the median over the rounds and
the report gives the range), each artifact's greedy
generate(prompt, --decode tokens), and eager PyTorch (llmc's own Llama with a KV cache:
LlamaPrefill + LlamaDecode, the prefill's last layer over every position as a standard forward runs
it; llmc runs only the position the logits read there) in each `--eager` dtype. Prefill tok/s = prompt tokens / time to the
first new token; decode tok/s = decode steps / their time. --weights picks where llmc's weights live
(llmc.load's weights=; `both` loads each artifact twice, mapped and in huge-page memory).
--prefill-buckets N,... builds each dtype a second time with those static-length prefills and times
both builds in the same rounds; --prefill-chunk none|N likewise with that prefill chunk (against llmc's
default, auto: a 64-token chunk on cpu once the cache holds two); --kv-dtype bf16 likewise with a bf16
KV cache. Medians
are reported, with each llmc figure's ratio to eager f32 and eager bf16 from the same worker, and
decode as a fraction of its roofline: bandwidth / bytes of weights one decode step streams (every
parameter but the embedding table, which decode only gathers one row of, at 4/2/1 bytes per weight
for f32/bf16/fp8; the KV cache and fp8 scales are left out, so the roofline is slightly optimistic).
Beside it, each round's decode over the read taken at the start of that same round (median and range over
the rounds): the machine's read rate drifts between rounds, and this pairing leaves that drift out.

Writes OUT/bench.json (every sample, medians, ratios, machine facts), OUT/bench.md (the table) and
OUT/bench.png (tok/s by engine and thread count; needs matplotlib). Figures hold for this machine
and this run: compare ratios, not absolute numbers, across machines. A benchmark, not a test: it
exits 0 unless something fails to run.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import itertools
import json
import mmap
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

BYTES_PER_WEIGHT = {"f32": 4, "bf16": 2, "f16": 2, "fp8": 1, "int8": 1}
TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16}
KERNEL_CHOICES = {"on": (True,), "off": (False,), "both": (True, False)}  # --kernels: builds with / without compiler/ukernels.py's


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--config", default="small-125m", help="a named Llama config with random weights (seed 0)")
    src.add_argument("--checkpoint", type=Path, help="a Llama checkpoint (Meta .pth + params.json, or an HF folder)")
    ap.add_argument("--dtypes", default="f32,bf16,fp8", help="llmc artifacts to build, comma-separated")
    ap.add_argument("--eager", default="f32,bf16", help="eager PyTorch references, comma-separated (f32, bf16; '' for none)")
    ap.add_argument("--arch", action="append", default=None,
                    help="cpu --arch of the llmc artifacts (repeat to compare, e.g. --arch portable --arch x86-64-v3; default host)")
    ap.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--weights", default="auto", choices=("auto", "mmap", "memory", "both"),
                    help="where llmc's weights live (llmc.load weights=; default auto), or both: each artifact twice, "
                         "mapped from its .irpa and read into huge-page memory, alternating")
    ap.add_argument("--prefill-buckets", default=None, metavar="N,N,...",
                    help="also build every dtype with these static-length prefill entry points (llmc compile --prefill-buckets) "
                         "and time both builds in the same run")
    ap.add_argument("--prefill-chunk", default=None, metavar="none|N",
                    help="also build every dtype with this --prefill-chunk (llmc compile; e.g. none, against the default "
                         "auto) and time both builds in the same run")
    ap.add_argument("--kv-dtype", default=None, choices=("f32", "bf16"),
                    help="also build every dtype with this KV-cache dtype (llmc compile --kv-dtype) and time both builds "
                         "in the same run")
    ap.add_argument("--kernels", default="on", choices=("on", "off", "both"),
                    help="llmc's cpu C kernels (compiler/ukernels.py: fp8/int8/bf16 decode and prefill chunks, f32 prefill chunks; "
                         "off = LLMC_CPU_KERNELS=off), or both: each such dtype built with and without them, timed in the same run")
    ap.add_argument("--out", type=Path, default=Path("out/bench"))
    ap.add_argument("--keep", action="store_true",
                    help="reuse an artifact already in --out (DTYPE.vmfb with its .irpa and .json) instead of compiling it")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: JSON spec of one thread count's runs
    args = ap.parse_args(argv)
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.eager = [d for d in args.eager.split(",") if d]
    bad = [d for d in args.dtypes if d not in BYTES_PER_WEIGHT] + [d for d in args.eager if d not in TORCH_DTYPE]
    if bad:
        ap.error(f"unknown dtype(s) {bad}: --dtypes takes {sorted(BYTES_PER_WEIGHT)}, --eager takes {sorted(TORCH_DTYPE)}")
    try:
        args.threads = [int(t) for t in args.threads.split(",") if t]
    except ValueError:
        ap.error(f"--threads {args.threads!r}: give whole numbers, e.g. 1,2")
    if not args.threads or min(args.threads) < 1 or args.prompt < 1 or args.decode < 2 or args.reps < 1:
        ap.error("--threads >= 1, --prompt >= 1, --decode >= 2 and --reps >= 1")
    return args


def load_model(spec: dict):
    """(config, the Llama in f32 or the checkpoint's dtype, its display name) from a --config or --checkpoint."""
    from llmc.models.llama.config import get_config
    from llmc.models.llama.model import Llama, init_random

    if spec.get("checkpoint"):
        from llmc.models.llama.loaders import load_checkpoint

        config, sd = load_checkpoint(spec["checkpoint"])
        return config, Llama.from_state_dict(config, sd).eval(), Path(spec["checkpoint"]).name
    config = get_config(spec["config"])
    return config, init_random(config, seed=0), config.name


def streamed_parameters(llama) -> int:
    """Parameters one decode step reads whole: all but the embedding table (decode gathers one row of
    it), unless the LM head shares it."""
    embed = llama.model.embed_tokens.weight
    tied = llama.lm_head.weight is embed
    return sum(p.numel() for p in llama.parameters()) - (0 if tied else embed.numel())


class ReadBuffer:
    """256 MiB of f32 ones to sum for the read bandwidth, in 2 MB pages (`huge=True`) or 4 KB ones.

    The roofline is the 2 MB figure: llmc reads its weights from memory that asks for transparent huge
    pages (runtime/weights.py), and on this project's VMs a stream from 4 KB pages ran at 60% to nearly
    100% of one from 2 MB pages in the same run (nested paging: a TLB miss walks two page tables), a
    share that moves with the host's own backing. The 4 KB figure is what a plain torch tensor reads;
    the report keeps both.
    """

    SIZE = 256 * 1024 * 1024

    def __init__(self, huge: bool):
        if huge:
            align = 2 * 1024 * 1024
            self._map = mmap.mmap(-1, self.SIZE + align, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            base = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
            offset = -base % align
            if hasattr(mmap, "MADV_HUGEPAGE"):
                self._map.madvise(mmap.MADV_HUGEPAGE, offset, self.SIZE)
            self.tensor = torch.frombuffer(self._map, dtype=torch.float32, count=self.SIZE // 4, offset=offset)
            self.tensor.fill_(1.0)
        else:
            self.tensor = torch.ones(self.SIZE // 4)

    def gb_s(self, reps: int = 5) -> float:
        """Read bandwidth with torch's current thread count: median of `reps` sums of the buffer."""
        self.tensor.sum()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            self.tensor.sum()
            times.append(time.perf_counter() - start)
        return self.SIZE / statistics.median(times) / 1e9


def eager_run(llama, config, prompt: list[int], n_new: int, max_len: int, dtype) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of greedy eager generation with a KV cache."""
    from llmc.models.llama.model import LlamaDecode, LlamaPrefill, new_cache

    cache = new_cache(config, max_len, dtype)
    # whole_last_layer: a standard forward, as eager PyTorch runs a Llama (llmc skips the last layer's unread rows)
    prefill, decode = LlamaPrefill(llama, whole_last_layer=True), LlamaDecode(llama)
    with torch.no_grad():
        start = time.perf_counter()
        out = prefill(torch.tensor([prompt]), *cache)
        logits, cache = out[0], out[1:]
        tok = int(logits[0, -1].argmax())
        t_prefill = time.perf_counter() - start
        length = len(prompt)
        start = time.perf_counter()
        for _ in range(n_new - 1):
            length += 1
            out = decode(torch.tensor([[tok]]), torch.ones(1, length, dtype=torch.int64), *cache)
            logits, cache = out[0], out[1:]
            tok = int(logits[0, -1].argmax())
        t_decode = time.perf_counter() - start
    return len(prompt) / t_prefill, (n_new - 1) / t_decode


def worker(spec: dict) -> dict:
    """One thread count: every engine, alternating, in this process."""
    import llmc

    threads = spec["threads"]
    torch.set_num_threads(threads)
    config, llama, _ = load_model(spec)
    # nn.Module.to converts in place: a copy per eager dtype but the last, which takes the model itself
    # (a big checkpoint then costs one copy fewer).
    eager = {}
    for i, d in enumerate(spec["eager"]):
        eager[f"eager {d}"] = (llama if i == len(spec["eager"]) - 1 else copy.deepcopy(llama)).to(TORCH_DTYPE[d])
    del llama
    modes = ("mmap", "memory") if spec["weights"] == "both" else (spec["weights"],)
    mods = {f"llmc {d}" + (f" [{w}]" if len(modes) > 1 else ""): llmc.load(path, threads=threads, weights=w)
            for d, path in spec["artifacts"].items() for w in modes}
    for name, mod in mods.items():
        if mod.cpu_variant:
            print(f"  {name}: this CPU runs the {mod.cpu_variant} variant", file=sys.stderr, flush=True)
    prompt, n_new, max_len = spec["prompt_ids"], spec["decode"], spec["max_len"]
    buffers = {"2m": ReadBuffer(huge=True), "4k": ReadBuffer(huge=False)}
    bandwidth = []  # one figure per timed round, next to the runs it is a roofline for (2 MB pages)
    bandwidth_4k = []  # the same read from 4 KB pages, for the report
    samples = {name: {"prefill": [], "decode": []} for name in [*mods, *eager]}
    prefill_functions = {name: set() for name in mods}  # which entry point each llmc prefill ran (a bucket or not)
    for rep in range(spec["reps"] + 1):  # round 0 warms up and is dropped
        bw, bw_4k = buffers["2m"].gb_s(3), buffers["4k"].gb_s(3)
        if rep:
            bandwidth.append(bw)
            bandwidth_4k.append(bw_4k)
        for name, mod in mods.items():
            mod.generate(prompt, n_new, stop_at_eos=False)
            g = mod.last_generation
            prefill_functions[name].add(g.prefill_function)
            if rep:
                samples[name]["prefill"].append(g.prefill_tokens_per_s)
                samples[name]["decode"].append(g.decode_tokens_per_s)
        for name, model in eager.items():
            p, d = eager_run(model, config, prompt, n_new, max_len, next(iter(model.parameters())).dtype)
            if rep:
                samples[name]["prefill"].append(p)
                samples[name]["decode"].append(d)
        print(f"  threads {threads}: round {rep}/{spec['reps']} done", file=sys.stderr, flush=True)
    return {"threads": threads, "bandwidth_gb_s": statistics.median(bandwidth), "bandwidth_samples": bandwidth,
            "bandwidth_4k_samples": bandwidth_4k, "samples": samples,
            "weights": {name: [mod.weights, mod.weights_reason, list(mod.iree_huge_pages or (0, "not a CPU device"))]
                        for name, mod in mods.items()},
            "prefill_functions": {name: sorted(f) for name, f in prefill_functions.items()}}


def summarize(result: dict, streamed: int) -> list[dict]:
    """One row per (phase, engine): median tok/s, ratios to eager f32/bf16, decode % of roofline: the median
    decode over the median read rate, and each round's decode over that round's own read (the read is taken
    at the start of every round, so this pairing leaves out the drift between rounds; its median and range)."""
    rows = []
    med = {name: {k: statistics.median(v) for k, v in s.items()} for name, s in result["samples"].items()}
    for phase in ("prefill", "decode"):
        for name, m in med.items():
            row = {"phase": phase, "engine": name, "threads": result["threads"], "tok_s": m[phase]}
            for ref in ("eager f32", "eager bf16"):
                if ref in med and name != ref:
                    row[f"vs {ref}"] = m[phase] / med[ref][phase]
            dtype = name.split()[1]  # "llmc fp8", "llmc fp8 [portable]", "eager bf16"
            if phase == "decode":
                step_gb = streamed * BYTES_PER_WEIGHT[dtype] / 1e9  # what one decode step streams
                row["roofline_tok_s"] = result["bandwidth_gb_s"] / step_gb
                row["pct_roofline"] = 100 * m[phase] / row["roofline_tok_s"]
                row["pct_roofline_rounds"] = [100 * tok_s * step_gb / bw for tok_s, bw in
                                              zip(result["samples"][name][phase], result["bandwidth_samples"])]
            rows.append(row)
    return rows


def markdown(report: dict) -> str:
    head = (f"# llmc bench: {report['model']} ({report['streamed_parameters'] / 1e6:.1f}M streamed parameters), "
            f"prompt {report['prompt']}, decode {report['decode']}, median of {report['reps']}\n\n"
            f"{report['machine']['cpu']}; read bandwidth " +
            ", ".join(f"{r['bandwidth_gb_s']:.1f} GB/s at {r['threads']} thread(s)"
                      f" ({min(r['bandwidth_samples']):.1f}-{max(r['bandwidth_samples']):.1f} over the rounds;"
                      f" {statistics.median(r['bandwidth_4k_samples']):.1f} from 4 KB pages)"
                      for r in report["runs"]) + "\n\n")
    weights = report["runs"][0].get("weights", {}) if report["runs"] else {}
    if weights:
        head += "llmc weights: " + "; ".join(
            f"{name}: {mode} ({why})" + (f", {huge[0] / 1e9:.2f} GB of IREE's load-time memory {huge[1]} into 2 MB pages" if huge[0] else "")
            for name, (mode, why, huge) in weights.items()) + "\n\n"
    lines = ["| phase | engine | threads | tok/s | vs eager f32 | vs eager bf16 | % of roofline | % of its round's read: median (range) |",
             "|---|---|---|---|---|---|---|---|"]
    fmt = lambda v, f: f.format(v) if v is not None else "-"
    for r in report["rows"]:
        rounds = r.get("pct_roofline_rounds")
        per_round = f"{statistics.median(rounds):.0f}% ({min(rounds):.0f}-{max(rounds):.0f}%)" if rounds else "-"
        lines.append(f"| {r['phase']} | {r['engine']} | {r['threads']} | {r['tok_s']:.1f} | {fmt(r.get('vs eager f32'), '{:.2f}x')} | "
                     f"{fmt(r.get('vs eager bf16'), '{:.2f}x')} | {fmt(r.get('pct_roofline'), '{:.0f}%')} | {per_round} |")
    return head + "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib is not installed; no plot (pip install matplotlib)", file=sys.stderr)
        return False
    engines = list(dict.fromkeys(r["engine"] for r in report["rows"]))
    threads = sorted({r["threads"] for r in report["rows"]})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(threads)
    for ax, phase in zip(axes, ("prefill", "decode")):
        for j, t in enumerate(threads):
            vals = [next((r["tok_s"] for r in report["rows"] if r["phase"] == phase and r["engine"] == e and r["threads"] == t), 0) for e in engines]
            ax.bar([i + j * width for i in range(len(engines))], vals, width, label=f"{t} thread(s)")
        ax.set_xticks([i + width * (len(threads) - 1) / 2 for i in range(len(engines))], engines, rotation=20)
        ax.set_title(f"{phase} (tok/s)")
        ax.legend()
    fig.suptitle(f"{report['model']}: prompt {report['prompt']}, decode {report['decode']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
    return True


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def plan_builds(args) -> list[tuple[str, str, str, str, dict, bool]]:
    """Every llmc build the run makes: (row key, file stem, dtype, arch, llmc.compile prefill options, kernels on).
    Each dtype x arch once as llmc builds it by default, and again with --prefill-buckets, with
    --prefill-chunk (both: their cross product), with --kv-dtype, and without kernels (--kernels both, narrow dtypes)."""
    from llmc.compiler import ukernels

    archs = args.arch or ["host"]
    also = lambda option: [None, option] if option else [None]  # the default build, and one with the option
    builds = []
    for d, arch, buckets, chunk, kv in itertools.product(args.dtypes, archs, also(args.prefill_buckets),
                                                         also(args.prefill_chunk), also(args.kv_dtype)):
        for kern in (KERNEL_CHOICES[args.kernels] if d in ukernels.GEMM_KINDS else (True,)):
            key = d if len(archs) == 1 else f"{d} [{arch}]"
            stem = d if len(archs) == 1 else f"{d}-{arch.replace(',', '+')}"
            options = {"prefill_buckets": buckets or "auto", "prefill_chunk": chunk or "auto", "kv_dtype": kv or "auto"}
            for value, label, suffix in ((buckets, f"buckets {buckets}", f"b{(buckets or '').replace(',', '-')}"),
                                         (chunk, f"chunk {chunk}", f"c{chunk}"), (kv, f"kv {kv}", f"kv{kv}"),
                                         (not kern, "no kernels", "nokernels")):
                if value:
                    key, stem = f"{key} [{label}]", f"{stem}-{suffix}"
            builds.append((key, stem, d, arch, options, kern))
    return builds


def main(argv=None) -> int:
    args = parse(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    import llmc
    from llmc.compiler import ukernels

    spec = {"config": None if args.checkpoint else args.config, "checkpoint": str(args.checkpoint) if args.checkpoint else None}
    config, llama, name = load_model(spec)
    streamed = streamed_parameters(llama)
    if args.checkpoint:  # llmc.compile reads the checkpoint itself: hold one copy of a big model at a time
        llama = None
    max_len = args.prompt + args.decode + 8
    if max_len > config.max_seq_len:  # llmc.compile would refuse it after the first build's setup
        print(f"bench: error: --prompt {args.prompt} + --decode {args.decode} (+ 8) is {max_len} positions; {name} has "
              f"{config.max_seq_len}: give a shorter --prompt or --decode", file=sys.stderr)
        raise SystemExit(2)
    prompt = torch.randint(0, config.vocab_size, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    args.out.mkdir(parents=True, exist_ok=True)
    artifacts, compile_s = {}, {}
    for key, stem, d, arch, options, kern in plan_builds(args):
        if args.keep and (args.out / f"{stem}.vmfb").exists():
            print(f"bench: reusing {args.out / f'{stem}.vmfb'} (--keep)", file=sys.stderr, flush=True)
            artifacts[key] = str(args.out / f"{stem}.vmfb")
            continue
        print(f"bench: compiling {name} for cpu, --dtype {d} --arch {arch} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        saved = os.environ.get(ukernels.ENV)
        os.environ[ukernels.ENV] = "on" if kern else "off"
        try:
            art = llmc.compile(args.checkpoint or llama, dtype=d, arch=arch, output=args.out / f"{stem}.vmfb", max_seq_len=max_len,
                               **options, **({"quant_embeddings": True} if d in ("fp8", "int8") else {}))
        finally:
            if saved is None:
                os.environ.pop(ukernels.ENV)
            else:
                os.environ[ukernels.ENV] = saved
        compile_s[key] = time.perf_counter() - start
        artifacts[key] = str(art.vmfb)
    del llama
    runs = []
    for t in args.threads:
        print(f"bench: {t} thread(s) ...", file=sys.stderr, flush=True)
        wspec = {**spec, "threads": t, "artifacts": artifacts, "eager": args.eager, "prompt_ids": prompt,
                 "decode": args.decode, "max_len": max_len, "reps": args.reps, "weights": args.weights}
        proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(wspec)], stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            print(f"bench: the {t}-thread worker failed (exit {proc.returncode})", file=sys.stderr)
            return proc.returncode or 1
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    report = {
        "model": name, "streamed_parameters": streamed, "prompt": args.prompt, "decode": args.decode, "reps": args.reps,
        "compile_seconds": compile_s,
        "machine": {"cpu": _cpu_name(), "platform": platform.platform(), "cores": os.cpu_count()},
        "runs": runs,
        "rows": [row for r in runs for row in summarize(r, streamed)],
    }
    write_atomic(args.out / "bench.json", json.dumps(report, indent=1).encode())
    table = markdown(report)
    write_atomic(args.out / "bench.md", table.encode())
    plotted = plot(report, args.out / "bench.png.tmp") and os.replace(args.out / "bench.png.tmp", args.out / "bench.png") is None
    print(table)
    print(f"wrote {args.out / 'bench.json'}, {args.out / 'bench.md'}" + (f", {args.out / 'bench.png'}" if plotted else ""))
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
