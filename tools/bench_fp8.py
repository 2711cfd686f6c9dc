"""fp8 weights on cpu: decode speed and parameter size against llmc f32 and eager PyTorch f32.

    python tools/bench_fp8.py [--config small-125m] [--threads 1] [--prompt 128] [--decode 32] [--reps 5]

Compiles one random-weight Llama (seed 0) twice for cpu, `--dtype f32` and `--dtype fp8
--fp8-embeddings`, loads both in this process with the same thread count, and alternates
prefill + greedy decode runs of each (median of --reps); eager PyTorch f32 (llmc's own Llama with
a KV cache, torch.set_num_threads(--threads)) runs in the same loop. Prints decode tokens/s, the
ratios fp8 / f32 and fp8 / eager, and the .irpa sizes. The figures hold for this machine and run
only: compare ratios, not absolute numbers, across machines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import llmc
from llmc.models.llama.config import get_config
from llmc.models.llama.model import LlamaDecode, LlamaPrefill, init_random, new_cache


def eager_decode(llama, prompt, n_new, max_len):
    """tokens/s of eager f32 greedy decode with a KV cache (prefill excluded)."""
    cache = new_cache(llama.config, max_len, torch.float32)
    with torch.no_grad():
        out = LlamaPrefill(llama)(torch.tensor([prompt]), *cache)
        logits, cache = out[0], out[1:]
        length = len(prompt)
        start = time.perf_counter()
        for _ in range(n_new):
            tok = int(logits[0, -1].argmax())
            length += 1
            out = LlamaDecode(llama)(torch.tensor([[tok]]), torch.ones(1, length, dtype=torch.int64), *cache)
            logits, cache = out[0], out[1:]
        return n_new / (time.perf_counter() - start)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="small-125m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    config = get_config(args.config)
    llama = init_random(config, seed=0).eval()
    max_len = args.prompt + args.decode + 8
    prompt = torch.randint(0, config.vocab_size, (args.prompt,), generator=torch.Generator().manual_seed(1)).tolist()
    with tempfile.TemporaryDirectory(prefix="llmc-bench-fp8-") as d:
        arts = {
            "f32": llmc.compile(llama, output=Path(d) / "f32.vmfb", max_seq_len=max_len),
            "fp8": llmc.compile(llama, dtype="fp8", fp8_embeddings=True, output=Path(d) / "fp8.vmfb", max_seq_len=max_len),
        }
        mods = {k: llmc.load(a, threads=args.threads) for k, a in arts.items()}
        sizes = {k: a.params.stat().st_size for k, a in arts.items()}
        rates: dict[str, list[float]] = {"f32": [], "fp8": [], "eager f32": []}
        for rep in range(args.reps + 1):  # the first round warms up and is dropped
            for name, mod in mods.items():
                mod.generate(prompt, args.decode, stop_at_eos=False)
                g = mod.last_generation
                if rep:
                    rates[name].append((args.decode - 1) / g.decode_seconds)
            if rep:
                rates["eager f32"].append(eager_decode(llama, prompt, args.decode - 1, max_len))
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"{config.name}: {sum(p.numel() for p in llama.parameters()) / 1e6:.0f}M parameters, {args.threads} thread(s), "
          f"prompt {args.prompt}, decode {args.decode}, median of {args.reps}")
    for k, v in med.items():
        print(f"  decode {k:10s} {v:8.1f} tok/s")
    print(f"  fp8 / llmc f32 decode: {med['fp8'] / med['f32']:.2f}x;  fp8 / eager f32: {med['fp8'] / med['eager f32']:.2f}x")
    print(f"  .irpa: f32 {sizes['f32'] / 1e6:.1f} MB, fp8 {sizes['fp8'] / 1e6:.1f} MB ({sizes['fp8'] / sizes['f32']:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
