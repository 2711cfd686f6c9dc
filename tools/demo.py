"""The README's main job on a built-in default: a tiny Llama checkpoint made on the fly, compiled, run, diffed.

    python tools/demo.py --out out/demo [--config tiny-llama3] [--format meta|hf] [--dtype f32|bf16]

Steps, each through the public surface a user would use:
1. `tools/make_checkpoint.py` writes a random-weight checkpoint of a named Llama config (Meta form by
   default: consolidated.00.pth + params.json);
2. `llmc compile CHECKPOINT -o tiny.vmfb --max-seq-len 128` (prefill + decode, KV cache on the device);
3. `llmc run tiny.vmfb --prompt-ids ... --json`: greedy tokens, checked against eager PyTorch running
   `transformers` LlamaForCausalLM on the same weights (llmc's own Llama definition when transformers
   is not installed);
4. `llmc diff CHECKPOINT tiny.vmfb`: prompt + greedy decode steps, every step's logits (exit 0 when
   within tolerance).
Exit 0 only when the tokens agree and the diff passes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

PROMPT = [1, 77, 300, 5, 42, 9, 256, 13]


def eager_greedy(ckpt: Path, n: int, dtype: str) -> tuple[list[int], str]:
    from llmc import dtypes
    from llmc.models.llama.loaders import load_checkpoint
    from llmc.models.llama.model import Llama

    tdt = dtypes.compute_torch_dtype(dtype)
    config, state = load_checkpoint(ckpt)
    try:
        import transformers

        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config.to_hf_config()))
        model.load_state_dict(state, strict=False)
        if config.tie_embeddings:
            model.tie_weights()
        model = model.to(tdt).eval()
        with torch.no_grad():
            out = model.generate(torch.tensor([PROMPT]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
        return out[0, len(PROMPT):].tolist(), "transformers LlamaForCausalLM"
    except ImportError:
        model = Llama.from_state_dict(config, state, rope_positions=len(PROMPT) + n).to(tdt)
        ids = list(PROMPT)
        with torch.no_grad():
            for _ in range(n):
                ids.append(int(model(torch.tensor([ids]))[0, -1].float().argmax()))
        return ids[len(PROMPT):], "llmc's eager Llama"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/demo", help="output folder (created)")
    ap.add_argument("--config", default="tiny-llama3", help="a named Llama config (llmc.models.llama.config.CONFIGS)")
    ap.add_argument("--format", default="meta", choices=["meta", "hf"])
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--new-tokens", type=int, default=16)
    args = ap.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / f"{args.config}-{args.format}"
    if ckpt.exists():
        shutil.rmtree(ckpt)
    tools = Path(__file__).parent
    subprocess.run(
        [sys.executable, str(tools / "make_checkpoint.py"), "--config", args.config, "--format", args.format,
         "--dtype", "f32", "--seed", "3", "--out", str(ckpt)],
        check=True,
    )
    print(f"[1/4] wrote a random-weight {args.config} checkpoint ({args.format} form) to {ckpt}")

    vmfb = out / "tiny.vmfb"
    llmc_cli = [sys.executable, "-m", "llmc.compiler.cli"]
    t = time.perf_counter()
    subprocess.run([*llmc_cli, "compile", str(ckpt), "-o", str(vmfb), "--dtype", args.dtype, "--max-seq-len", "128"], check=True)
    print(f"[2/4] compiled in {time.perf_counter() - t:.1f}s")
    subprocess.run([*llmc_cli, "info", str(vmfb)], check=True)

    r = subprocess.run(
        [*llmc_cli, "run", str(vmfb), "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", str(args.new_tokens), "--no-eos", "--json"],
        check=True, capture_output=True, text=True,
    )
    got = json.loads(r.stdout)["tokens"]
    want, reference = eager_greedy(ckpt, args.new_tokens, args.dtype)
    agree = sum(a == b for a, b in zip(got, want))
    print(f"[3/4] llmc run: prompt {PROMPT} -> {got}")
    print(f"      {reference} (eager {args.dtype}): {want}; {agree}/{args.new_tokens} equal")

    rc = subprocess.run([*llmc_cli, "diff", str(ckpt), str(vmfb), "--steps", "8", "--json", str(out / "diff.json")]).returncode
    print(f"[4/4] llmc diff exit code {rc}; report in {out / 'diff.json'}")
    return 0 if rc == 0 and got == want else 1


if __name__ == "__main__":
    sys.exit(main())
