"""Decode-step time against --max-seq-len: the KV cache stays on the device and is never copied.

    python tools/bench_decode.py [--config bench-decode] [--lens 512,1024,2048,4096] [--steps 64] [--reps 5]

For each max-seq-len, compiles a random-weight Llama (cpu, f32), prefills a 32-token prompt, then
times `--steps` decode steps (median of --reps runs of the loop, per step), at the same positions
for every max-seq-len. A step that copied the cache would grow linearly with max-seq-len (the cache
is 2 x n_layers x n_kv_heads x max_seq_len x head_dim x 4 bytes); llmc's decode attends to the live
prefix only and updates the cache in place, so the time should stay flat.
The same steps run in eager PyTorch (llmc's LlamaDecode, the same cache layout) for a ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import llmc
from llmc.models.llama.config import LlamaConfig, get_config
from llmc.models.llama.model import LlamaDecode, LlamaPrefill, init_random, new_cache

# Big enough that a copy of the cache is visible next to the weights (4096 positions: 64 MB of cache
# against 45 MB of weights), small enough to compile four times in a few minutes.
BENCH = LlamaConfig(dim=512, n_layers=8, n_heads=8, n_kv_heads=4, vocab_size=4096, ffn_dim=1408,
                    max_seq_len=8192, name="bench-decode")


def time_llmc(mod, prompt, steps, reps):
    from llmc.runtime.generate import Generator

    gen = Generator(mod)
    prefill, decode, device = mod.function("prefill"), mod.function("decode"), mod._device
    per_rep = []
    for _ in range(reps):
        cache = gen._new_cache(device)
        out = list(prefill(np.asarray([prompt], dtype=np.int64), *cache))
        n = len(prompt)
        tok = int(np.argmax(out[0].to_host().reshape(-1)))
        start = time.perf_counter()
        for _ in range(steps):
            n += 1
            out = list(decode(np.asarray([[tok]], dtype=np.int64), np.ones((1, n), dtype=np.int64), *out[1:]))
            tok = int(np.argmax(out[0].to_host().reshape(-1)))
        per_rep.append((time.perf_counter() - start) / steps)
    return statistics.median(per_rep), tok


def time_eager(model, max_len, prompt, steps, reps):
    pre, dec = LlamaPrefill(model), LlamaDecode(model)
    per_rep = []
    with torch.no_grad():
        for _ in range(reps):
            out = pre(torch.tensor([prompt]), *new_cache(model.config, max_len))
            n, tok = len(prompt), int(out[0].argmax())
            start = time.perf_counter()
            for _ in range(steps):
                n += 1
                out = dec(torch.tensor([[tok]]), torch.ones(1, n, dtype=torch.int64), *out[1:])
                tok = int(out[0].argmax())
            per_rep.append((time.perf_counter() - start) / steps)
    return statistics.median(per_rep), tok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="bench-decode", help="a named config, or bench-decode (default)")
    ap.add_argument("--lens", default="512,1024,2048,4096")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    config = BENCH if args.config == "bench-decode" else get_config(args.config)
    lens = [int(x) for x in args.lens.split(",")]
    prompt = list(range(3, 35))
    model = init_random(config, seed=0, rope_positions=max(lens))
    cache_mb = lambda n: 2 * config.n_layers * config.n_kv_heads * n * config.head_dim * 4 / 1e6
    print(f"{config.name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params; decode steps at positions "
          f"{len(prompt)}..{len(prompt) + args.steps - 1}; {torch.get_num_threads()} torch threads", file=sys.stderr)
    rows = []

    with tempfile.TemporaryDirectory() as tmp:
        for n in lens:
            t0 = time.perf_counter()
            art = llmc.compile(model, output=Path(tmp) / f"m{n}.vmfb", max_seq_len=n)
            compile_s = time.perf_counter() - t0
            mod = llmc.load(art, threads=args.threads)
            t_llmc, tok_a = time_llmc(mod, prompt, args.steps, args.reps)
            t_eager, tok_b = time_eager(model, n, prompt, args.steps, args.reps)
            rows.append((n, cache_mb(n), compile_s, t_llmc, t_eager, tok_a == tok_b))
            print(f"  max-seq-len {n}: compiled in {compile_s:.0f} s", file=sys.stderr)
    base = rows[0][3]
    print(f"{'max-seq-len':>11} {'cache MB':>9} {'llmc ms/step':>13} {'vs first':>9} {'eager ms/step':>14} {'eager/llmc':>11} {'same token':>10}")
    for n, mb, _, t, e, same in rows:
        print(f"{n:>11} {mb:>9.1f} {t * 1e3:>13.3f} {t / base:>9.2f} {e * 1e3:>14.3f} {e / t:>11.2f} {str(same):>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
