"""The README's main job on a built-in default: a tiny Llama made on the fly, compiled, run and diffed.

    python tools/demo.py --out out/demo

Steps, each through the public surface a user would use:
1. build `models.zoo.TinyLlama` (seeded random weights) and save it with torch.export (dynamic
   sequence length 2..128) as tiny_llama.pt2;
2. `llmc compile tiny_llama.pt2 -o tiny_llama.vmfb` (the CLI);
3. `llmc.load(...)` and greedy next-token generation for a few steps (no KV cache yet: the whole
   prefix is re-run each step), checked against eager PyTorch token by token;
4. `llmc diff tiny_llama.pt2 tiny_llama.vmfb` (exit 0 when within tolerance).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/demo", help="output folder (created)")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    ap.add_argument("--new-tokens", type=int, default=8)
    args = ap.parse_args()

    import llmc
    from llmc.models import zoo

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, example, dynamic = zoo.build("tiny_llama")
    pt2 = out / "tiny_llama.pt2"
    torch.export.save(torch.export.export(model, example, dynamic_shapes=dynamic), str(pt2))
    print(f"[1/4] saved {pt2} ({sum(p.numel() for p in model.parameters()) / 1e3:.0f}K params)")

    vmfb = out / "tiny_llama.vmfb"
    llmc_cli = [sys.executable, "-m", "llmc.compiler.cli"]
    t = time.perf_counter()
    subprocess.run([*llmc_cli, "compile", str(pt2), "-o", str(vmfb), "--dtype", args.dtype], check=True)
    print(f"[2/4] compiled in {time.perf_counter() - t:.1f}s")
    subprocess.run([*llmc_cli, "info", str(vmfb)], check=True)

    mod = llmc.load(vmfb)
    ids = example[0]
    ref_ids = ids.clone()
    ref_model = model if args.dtype == "f32" else model.to(getattr(torch, {"f16": "float16", "bf16": "bfloat16"}[args.dtype]))
    generated, agree = [], 0
    with torch.no_grad():
        for _ in range(args.new_tokens):
            nxt = int(mod(ids)[0, -1].float().argmax())
            ref_nxt = int(ref_model(ref_ids)[0, -1].float().argmax())
            agree += nxt == ref_nxt
            generated.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
            ref_ids = torch.cat([ref_ids, torch.tensor([[ref_nxt]])], dim=1)
    print(f"[3/4] prompt {example[0][0].tolist()} -> generated {generated}; {agree}/{args.new_tokens} equal to eager PyTorch")

    rc = subprocess.run([*llmc_cli, "diff", str(pt2), str(vmfb), "--json", str(out / "diff.json")]).returncode
    print(f"[4/4] llmc diff exit code {rc}; report in {out / 'diff.json'}")
    return 0 if rc == 0 and agree == args.new_tokens else 1


if __name__ == "__main__":
    sys.exit(main())
