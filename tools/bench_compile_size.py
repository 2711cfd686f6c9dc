"""Compile a ~125M-parameter Llama-shaped model for cpu and report sizes, memory, timings and numerics.

    python tools/bench_compile_size.py                    # f32, prefill of 32 tokens, temp output dir
    python tools/bench_compile_size.py --dtype both --out out/bench

The model is transformers' LlamaForCausalLM (hidden 768, 12 layers, 12 heads, 4 kv heads, intermediate
2048, vocab 32000, untied embeddings: 124.7M parameters) with random weights from torch.manual_seed(0);
nothing is downloaded. It is exported with input_ids [1, SEQ] and the example kwarg use_cache=False
(torch.export cannot return transformers' DynamicCache).

Printed per compiled dtype:
- parameter count, weight bytes (in the compile dtype), .vmfb size, .irpa size; checks that the .vmfb
  is < 1 MB (weights are external) and the .irpa is within 5% of the weight bytes;
- iree-compile's peak RSS (manifest compile.iree_compile_peak_rss_mb, and iree-compile's own VmHWM
  polled from /proc as a cross-check), this process's peak RSS (getrusage RUSAGE_SELF ru_maxrss),
  per-phase timings (manifest compile.seconds);
- max_rel and cosine of the compiled module's logits against eager f32 (and eager bf16 for bf16);
- eager_time / iree_time for one prefill of SEQ tokens: medians of --reps runs after one warm-up, eager and
  IREE interleaved so that load from other processes hits both alike (this 2-vCPU box is shared; a
  concurrent test run slowed eager 10x in a trial run, so the CPUs other processes kept busy while
  timing are printed too).

This is a benchmark, not a test: it prints numbers and exits 0 unless something fails to run.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

MB = 1024 * 1024


def build_model():
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
        intermediate_size=2048,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval(), transformers.__version__


def self_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


class ChildPeakRss:
    """Polls /proc for iree-compile children of this process and keeps their VmHWM (peak RSS of the
    process's own address space, reset at exec). An independent check of the manifest's figure:
    getrusage/wait4 ru_maxrss of a child also counts the RSS the forking parent had when the child
    exec'd, so for a big parent it reports the parent's size, not iree-compile's."""

    def __init__(self, name: str = "iree-compile", interval: float = 0.05):
        self.name, self.interval = name, interval
        self.peak_kb = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        me = str(os.getpid())
        while not self._stop.wait(self.interval):
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/status") as f:
                        fields = dict(line.split(":", 1) for line in f if ":" in line)
                except OSError:
                    continue
                if fields.get("Name", "").strip() == self.name[:15] and fields.get("PPid", "").strip() == me:
                    hwm = int(fields.get("VmHWM", "0 kB").split()[0])
                    self.peak_kb[pid] = max(self.peak_kb.get(pid, 0), hwm)

    @property
    def peak_mb(self) -> float | None:
        return max(self.peak_kb.values()) / 1024.0 if self.peak_kb else None


def _busy_seconds() -> float | None:
    """CPU-seconds all processes have spent busy (from /proc/stat), or None where it can't be read."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return (sum(v[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed_ab(fns: dict, reps: int) -> tuple[dict, float | None]:
    """Seconds per call of each callable, timed interleaved (A B A B ...) after one warm-up call each,
    so that load from other processes on the machine hits both sides alike."""
    for fn in fns.values():
        fn()  # warm-up (the first IREE call loads the module and maps parameters)
    times = {k: [] for k in fns}
    busy0, own0, wall0 = _busy_seconds(), _own_cpu_seconds(), time.perf_counter()
    for _ in range(reps):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    busy1, own1, wall = _busy_seconds(), _own_cpu_seconds(), time.perf_counter() - wall0
    # CPUs kept busy by other processes while timing (0 on a quiet machine).
    foreign = None if busy0 is None else max(0.0, ((busy1 - busy0) - (own1 - own0)) / wall)
    return times, foreign


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "both"], help="compile dtype(s) (default f32)")
    ap.add_argument("--seq", type=int, default=32, help="prefill length exported and timed (default 32)")
    ap.add_argument("--reps", type=int, default=7, help="timed repetitions per side, median reported (default 7)")
    ap.add_argument("--out", default=None, help="output folder (default: a temporary folder, removed afterwards)")
    args = ap.parse_args()

    import llmc
    from llmc.compiler import diff_metrics, export

    tmp = None
    if args.out is None:
        tmp = tempfile.mkdtemp(prefix="llmc-bench-")
        out = Path(tmp)
    else:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
    dtypes = ["f32", "bf16"] if args.dtype == "both" else [args.dtype]

    try:
        t0 = time.perf_counter()
        model, tf_version = build_model()
        n_params = sum(p.numel() for p in model.parameters())
        print(f"model: transformers {tf_version} LlamaForCausalLM (random weights, seed 0), "
              f"attn_implementation={model.config._attn_implementation}, built in {time.perf_counter() - t0:.1f}s")
        print(f"torch {torch.__version__}, torch threads {torch.get_num_threads()}, cpu count {os.cpu_count()}")
        print(f"parameters: {n_params:,} ({n_params / 1e6:.1f}M)")
        ids = torch.randint(0, model.config.vocab_size, (1, args.seq), generator=torch.Generator().manual_seed(1))
        kwargs = {"use_cache": False}

        with torch.no_grad():
            ref_f32 = model(ids, **kwargs).logits

        def eager_call(m):
            def f():
                with torch.no_grad():
                    return m(ids, **kwargs).logits
            return f

        for dtype in dtypes:
            tdt = dtypes.compute_torch_dtype(dtype)
            weight_bytes = sum(
                p.numel() * (tdt.itemsize if p.is_floating_point() else p.element_size()) for p in model.parameters()
            )
            print(f"\n=== dtype {dtype} (cpu, prefill seq {args.seq}) ===")
            print(f"weight bytes ({dtype}): {weight_bytes:,} ({weight_bytes / MB:.1f} MiB)")
            vmfb = out / f"llama125m_{dtype}.vmfb"
            t = time.perf_counter()
            with ChildPeakRss() as child_rss:
                art = llmc.compile(model, (ids,), target="cpu", dtype=dtype, example_kwargs=kwargs, output=vmfb)
            compile_s = time.perf_counter() - t
            rss_after_compile = self_peak_rss_mb()
            man = art.read_manifest()
            vmfb_bytes = art.vmfb.stat().st_size
            irpa_bytes = art.params.stat().st_size if art.params else 0
            params = man.get("params") or {}
            print(f"compile wall time: {compile_s:.1f}s")
            print("phase seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in man["compile"]["seconds"].items()))
            print(f"vmfb size: {vmfb_bytes:,} bytes ({vmfb_bytes / 1024:.1f} KiB)")
            print(f"irpa size: {irpa_bytes:,} bytes ({irpa_bytes / MB:.1f} MiB); manifest params: "
                  f"{params.get('count')} tensors, {params.get('bytes', 0):,} bytes")
            print(f"iree-compile peak RSS (manifest compile.iree_compile_peak_rss_mb): "
                  f"{man['compile']['iree_compile_peak_rss_mb']:.1f} MB")
            hwm = child_rss.peak_mb
            print("iree-compile peak RSS (its VmHWM, polled every 50 ms): "
                  + ("n/a" if hwm is None else f"{hwm:.1f} MB"))
            print(f"process peak RSS (RUSAGE_SELF, after compile): {rss_after_compile:.1f} MB")
            irpa_ratio = irpa_bytes / weight_bytes
            vmfb_ok = vmfb_bytes < MB
            irpa_ok = abs(irpa_ratio - 1.0) <= 0.05
            print(f"vmfb < 1 MB: {'yes' if vmfb_ok else 'NO'}")
            print(f"irpa within 5% of weight bytes: {'yes' if irpa_ok else 'NO'} (irpa/weights = {irpa_ratio:.4f})")

            t = time.perf_counter()
            mod = llmc.load(art)
            got = mod(ids, **kwargs)["logits"]
            first_call_s = time.perf_counter() - t
            print(f"load + first call: {first_call_s:.2f}s")
            r = diff_metrics.compare("logits", got, ref_f32, diff_metrics.TOLERANCES[dtype])
            print(f"vs eager f32: max_abs {r.max_abs:.3g}, max_rel {r.max_rel:.3g}, cosine {r.cosine:.7f} "
                  f"({dtype} table: {'pass' if r.passed else 'FAIL: ' + r.reason})")
            fns = {"eager f32": eager_call(model)}
            if dtype != "f32":
                ref_model = export.CastInputs(export.convert_module(model, tdt), tdt)
                with torch.no_grad():
                    ref_same = ref_model(ids, **kwargs).logits
                r2 = diff_metrics.compare("logits", got, ref_same, diff_metrics.TOLERANCES[dtype])
                print(f"vs eager {dtype}: max_abs {r2.max_abs:.3g}, max_rel {r2.max_rel:.3g}, cosine {r2.cosine:.7f} "
                      f"({dtype} table: {'pass' if r2.passed else 'FAIL: ' + r2.reason})")
                fns[f"eager {dtype}"] = eager_call(ref_model)
            fns[f"iree {dtype}"] = lambda: mod(ids, **kwargs)
            times, foreign = timed_ab(fns, args.reps)
            med = {k: statistics.median(v) for k, v in times.items()}
            busy = "n/a" if foreign is None else f"{foreign:.2f} of {os.cpu_count()} CPUs"
            print(f"prefill of {args.seq} tokens, {args.reps} interleaved reps after a warm-up "
                  f"(other processes kept {busy} busy meanwhile):")
            for k, v in times.items():
                print(f"  {k}: median {med[k] * 1e3:.1f} ms ({', '.join(f'{x * 1e3:.0f}' for x in v)})")
            iree_s = med[f"iree {dtype}"]
            print(f"speed ratio eager_f32/iree_{dtype}: {med['eager f32'] / iree_s:.2f}x"
                  + (f"; eager_{dtype}/iree_{dtype}: {med[f'eager {dtype}'] / iree_s:.2f}x" if dtype != "f32" else ""))
            if dtype != "f32":
                del ref_model
            del mod, got
        print(f"\nprocess peak RSS (RUSAGE_SELF, end): {self_peak_rss_mb():.1f} MB; "
              f"RUSAGE_CHILDREN ru_maxrss: {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.1f} MB")
        print(f"output folder: {out}" + (" (temporary, removed)" if tmp else ""))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
