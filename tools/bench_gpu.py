"""Run llmc's GPU modules on a real GPU and time them against PyTorch on the same GPU.

Two halves, because the machine with the GPU (a lent H100/H200) has no IREE compiler and no
torch-mlir, and only a small working tree (64 MiB) travels to it:

    python tools/bench_gpu.py prepare --out .gpu           # here: checkpoints, compiles, weight recipes
    python tools/bench_gpu.py run --dir .gpu --out OUTDIR  # there: rebuild weights, run, time, compare
    python tools/bench_gpu.py probe --dir .gpu --case NAME --out OUTDIR  # there: one decode step, broken down

prepare compiles every case of the plan (below) and writes, per case, the .vmfb and its manifest.
A speed case's .irpa (250 MB to 2.5 GB) does not travel: its *recipe* does, the archive's entries in
order, each with the sha256 of its bytes and where they come from: a tensor of the random checkpoint
(tools/make_checkpoint.py is deterministic in config, dtype and seed, so the GPU machine writes the
same checkpoint again), as it is or in the panels cpu f32 builds store linear weights in, or a few
inline bytes (the rotary tables). run rebuilds the archive from the
recipe and refuses any entry whose hash differs, so the module there runs on exactly the weights it
was compiled against here. A check case (the tiny config) carries its checkpoint and .irpa whole.

run, per model: PyTorch on the same GPU in the checkpoint's dtype (greedy prefill of a 128-token
prompt, then 32 decode steps with a KV cache), eager and as CUDA graphs (prefill captured whole; a
decode step captured over the full-length cache with the position as a device tensor); then every
llmc case of that model in its own process (IREE runtime flags are process-wide), each timed the
same way through `Module.generate`, its greedy tokens and first logits compared with PyTorch's, and
for one case per model the CUDA kernels of one prefill and one decode step listed (torch.profiler
sees IREE's launches, CUPTI records every kernel of the process). Decode time is put against the
bandwidth roofline: bytes a step must read (weights + the KV cache in use) over the device-to-device
copy bandwidth measured in the same run.

Writes OUTDIR/gpu-bench.json and OUTDIR/gpu-bench.md. `--torch-device cpu` with `prepare --target
cpu` runs the same flow on a CPU (how tests/tools/test_bench_gpu.py checks it without a GPU).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROMPT_LEN = 128
NEW_TOKENS = 33  # the first comes from prefill, then 32 decode steps
REPS = 5


# ---- the plan -------------------------------------------------------------------------------------

def plan(target: str) -> list[dict]:
    """The cases prepare compiles. Speed cases rebuild their weights from a recipe; check cases carry them."""
    gpu = target == "cuda"
    cases = []

    def speed(name, config, dtype, flags=(), runtime_flags=(), profile=False, max_len=512, ckpt_dtype=None, compile_args=()):
        cases.append(dict(name=name, kind="speed", config=config, ckpt_dtype=ckpt_dtype or dtype, dtype=dtype,
                          target=target, arch=None, flags=list(flags), runtime_flags=list(runtime_flags),
                          profile=profile, max_len=max_len, compile_args=list(compile_args)))

    def check(name, dtype, target_=None, arch=None):
        cases.append(dict(name=name, kind="check", config="tiny", ckpt_dtype="f32", dtype=dtype, target=target_ or target,
                          arch=arch, flags=[], runtime_flags=[], profile=False, max_len=256, compile_args=[]))

    if not gpu:  # the CPU rehearsal: one of each kind
        speed("tiny-f32", "tiny", "f32", max_len=256)
        speed("tiny-f32-static", "tiny", "f32", max_len=256, compile_args=["--static-decode", "on"])
        check("tiny-check-f32", "f32")
        return cases
    speed("small-f16", "small-125m", "f16", profile=True)
    # The prefill without its static-length buckets (the default on cuda): the dynamic-M matmuls
    speed("small-f16-dynamic-prefill", "small-125m", "f16", compile_args=["--prefill-buckets", "none"])
    speed("small-f16-graphs", "small-125m", "f16", runtime_flags=["--cuda_use_streams=false"])
    speed("small-f16-O3", "small-125m", "f16", flags=["--iree-opt-level=O3"])
    speed("small-f16-aggressive-fusion", "small-125m", "f16", flags=["--iree-dispatch-creation-enable-aggressive-fusion"])
    speed("small-f16-tile-and-fuse", "small-125m", "f16", flags=["--iree-codegen-llvmgpu-use-tile-and-fuse-matmul"])
    speed("small-f16-vector-distribution", "small-125m", "f16", flags=["--iree-codegen-llvmgpu-use-vector-distribution"])
    speed("small-f16-reduction-vector-distribution", "small-125m", "f16",
          flags=["--iree-codegen-llvmgpu-use-reduction-vector-distribution"])
    speed("small-f16-prefetch-3", "small-125m", "f16", flags=["--iree-llvmgpu-prefetch-num-stages=3"])
    speed("small-f16-O3-aggressive-fusion", "small-125m", "f16",
          flags=["--iree-opt-level=O3", "--iree-dispatch-creation-enable-aggressive-fusion"])
    speed("small-bf16", "small-125m", "bf16")
    # The decode step with every shape fixed (--static-decode on): IREE records its command buffer once
    # (memoization and indirect bindings: IREE 3.13's defaults, the flags change no byte of the .vmfb).
    static = ["--static-decode", "on"]
    speed("small-f16-static", "small-125m", "f16", compile_args=static, profile=True)
    speed("small-f16-static-graphs", "small-125m", "f16", compile_args=static, runtime_flags=["--cuda_use_streams=false"])
    speed("small-f16-static-fusion", "small-125m", "f16", compile_args=static,
          flags=["--iree-dispatch-creation-enable-aggressive-fusion"])
    speed("1b-f16", "llama3.2-1b", "f16", profile=True, max_len=1024)
    speed("1b-f16-graphs", "llama3.2-1b", "f16", runtime_flags=["--cuda_use_streams=false"], max_len=1024)
    speed("1b-f16-dynamic-prefill", "llama3.2-1b", "f16", max_len=1024, compile_args=["--prefill-buckets", "none"])
    speed("1b-f16-static", "llama3.2-1b", "f16", compile_args=static, max_len=1024)
    # Prefill's 128-row matmuls fill few workgroups (128x2048 outputs of the down projection, K = 8192):
    # split the reduction so more of the GPU works on each. Measured: no prefill gain, decode 2x slower
    # (split-reduction); splitk4 fails to compile the dynamic prefill (docs/targets.md)
    speed("1b-f16-splitk4", "llama3.2-1b", "f16", max_len=1024, flags=["--iree-dispatch-creation-split-matmul-reduction=4"])
    speed("1b-f16-split-reduction", "llama3.2-1b", "f16", max_len=1024, flags=["--iree-dispatch-creation-enable-split-reduction"])
    for d in ("f32", "f16", "bf16", "fp8", "int8"):
        check(f"tiny-cuda-{d}", d)
    for d in ("f32", "f16"):
        check(f"tiny-vulkan-ampere-{d}", d, target_="vulkan", arch="ampere")
    return cases


def model_key(case: dict) -> str:
    """Cases sharing a checkpoint and cache length share one PyTorch reference."""
    return f"{case['config']}-{case['ckpt_dtype']}-{case['max_len']}"


# ---- prepare (the machine with the compiler) ------------------------------------------------------

def _sha(b) -> str:
    return hashlib.sha256(b).hexdigest()


def _tensor_bytes(t):
    """A tensor's bytes as a flat uint8 numpy array (bf16 included, which numpy cannot hold as such)."""
    import torch

    return t.contiguous().reshape(-1).view(torch.uint8).numpy()


# Layouts an archive entry may hold a checkpoint tensor in, beside its own: "panels16" is the 16-channel
# panels [N/16, K, 16] passes/f32_gemm_weights.py stores cpu f32 linear weights in.
LAYOUTS = ("panels16",)


def _in_layout(t, layout: str | None):
    """The checkpoint tensor `t` as the archive stores it in `layout` (None: as it is)."""
    if layout is None:
        return t
    from llmc.passes import _packed
    from llmc.passes.f32_gemm_weights import GROUP

    return _packed.pack(t, GROUP)


def _checkpoint_bytes(ckpt: Path, layouts: bool = False) -> dict[str, tuple[str, str | None]]:
    """sha256 of every tensor's bytes in an HF checkpoint folder -> (its name, None); with `layouts`, also
    of each tensor in the layouts it may be stored in (2-D f32 with whole 16-row panels: panels16) ->
    (its name, the layout)."""
    import torch
    from safetensors import safe_open

    from llmc.passes.f32_gemm_weights import GROUP

    out = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                t = st.get_tensor(k)
                out[_sha(_tensor_bytes(t))] = (k, None)
                if layouts and t.dtype == torch.float32 and t.dim() == 2 and t.shape[0] % GROUP == 0:
                    out.setdefault(_sha(_tensor_bytes(_in_layout(t, "panels16"))), (k, "panels16"))
    return out


def write_recipe(irpa: Path, ckpt: Path, recipe: Path, inline: Path) -> dict:
    """The archive's entries in order: each from the checkpoint (by name, in a layout where the build's
    manifest says a pass stored one) or inline, with its sha256."""
    import iree.runtime as rt

    manifest = json.loads(irpa.with_suffix(".json").read_text())
    packed = any(p["name"] == "f32-gemm-weights" and p["rewrote"] for p in manifest["passes"])
    by_hash = _checkpoint_bytes(ckpt, layouts=packed)
    index = rt.ParameterIndex()
    index.load(str(irpa))
    entries, blob = [], bytearray()
    for name, e in index.items():
        if e.is_splat:
            raise SystemExit(f"{irpa}: entry {name} is a splat; the recipe has no form for it")
        data = e.file_view
        h = _sha(data)
        if h in by_hash:
            source, layout = by_hash[h]
            entries.append({"name": name, "sha256": h, "nbytes": len(data), "checkpoint": source, **({"layout": layout} if layout else {})})
        else:
            entries.append({"name": name, "sha256": h, "nbytes": len(data), "inline": len(blob)})
            blob += data
    inline.write_bytes(bytes(blob))
    recipe.write_text(json.dumps({"entries": entries}, indent=0))
    return {"entries": len(entries), "inline_bytes": len(blob)}


def make_checkpoint(config: str, dtype: str, out: Path, seed: int = 0) -> None:
    if (out / "config.json").exists():
        return
    subprocess.run([sys.executable, str(REPO / "tools" / "make_checkpoint.py"), "--config", config, "--format", "hf",
                    "--out", str(out), "--dtype", dtype, "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)


def prepare(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    # --only adds to (or redoes cases of) an existing plan.json; a twin may be any compiled case.
    earlier = {c["name"]: c for c in json.loads((out / "plan.json").read_text())} if (out / "plan.json").exists() else {}
    for c in earlier.values():
        if "vmfb_sha256" not in c and (out / f"{c['name']}.vmfb").exists():
            c["vmfb_sha256"] = _sha((out / f"{c['name']}.vmfb").read_bytes())
    todo = [c for c in plan(args.target) if not args.only or c["name"] in args.only]
    cases = [*[c for n, c in earlier.items() if n not in {t["name"] for t in todo}], *todo]
    for case in todo:
        ckpt = scratch / f"ckpt-{case['config']}-{case['ckpt_dtype']}"
        make_checkpoint(case["config"], case["ckpt_dtype"], ckpt)
        vmfb = (out if case["kind"] == "check" else scratch) / f"{case['name']}.vmfb"
        cmd = [str(Path(sys.executable).parent / "llmc"), "compile", str(ckpt), "--target", case["target"],
               "--dtype", case["dtype"], "--max-seq-len", str(case["max_len"]), "-o", str(vmfb)]
        if case["arch"]:
            cmd += ["--arch", case["arch"]]
        cmd += [f"--iree-flag={f}" for f in case["flags"]] + case.get("compile_args", [])
        start = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        case["compile_s"] = round(time.perf_counter() - start, 1)
        if r.returncode:
            case["compile_error"] = (r.stderr.strip().splitlines() or ["?"])[-1]
            print(f"prepare: {case['name']}: compile failed: {case['compile_error']}", file=sys.stderr)
            continue
        digest = _sha(vmfb.read_bytes())
        twin = next((c for c in cases if c is not case and c.get("vmfb_sha256") == digest and c["runtime_flags"] == case["runtime_flags"]), None)
        case["vmfb_sha256"] = digest
        if twin is not None:
            # The flags changed nothing: running it would time the same binary twice.
            case["same_binary_as"] = twin["name"]
            for stale in out.glob(f"{case['name']}.*"):
                stale.unlink()
            print(f"prepare: {case['name']}: the same .vmfb as {twin['name']}; it will not be run", file=sys.stderr, flush=True)
            continue
        if case["kind"] == "speed":
            for suffix in (".vmfb", ".json"):
                shutil.copyfile(vmfb.with_suffix(suffix), out / f"{case['name']}{suffix}")
            case["recipe"] = write_recipe(vmfb.with_suffix(".irpa"), ckpt, out / f"{case['name']}.recipe.json",
                                          out / f"{case['name']}.inline.bin")
            vmfb.with_suffix(".irpa").unlink()
        else:
            dest = out / f"ckpt-{case['config']}-{case['ckpt_dtype']}"
            if not dest.exists():
                shutil.copytree(ckpt, dest)
        print(f"prepare: {case['name']}: compiled in {case['compile_s']} s", file=sys.stderr, flush=True)
    (out / "plan.json").write_text(json.dumps(cases, indent=1))
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"prepare: {len(cases)} cases in {out} ({size / 2**20:.1f} MiB)", file=sys.stderr)
    return 0


# ---- run (the machine with the GPU) ---------------------------------------------------------------

def rebuild_archive(case: dict, src: Path, work: Path) -> Path:
    """The case's .irpa, written from the regenerated checkpoint and the inline bytes; every entry's
    sha256 must equal the one recorded at compile time."""
    import iree.runtime as rt
    import numpy as np
    from safetensors import safe_open

    recipe = json.loads((src / f"{case['name']}.recipe.json").read_text())["entries"]
    unknown = [e for e in recipe if e.get("layout") not in (None, *LAYOUTS)]
    if unknown:  # before regenerating a checkpoint for nothing
        raise RuntimeError(f"{case['name']}: entry {unknown[0]['name']}: unknown layout {unknown[0]['layout']!r} "
                           f"(known: {', '.join(LAYOUTS)}); prepare and run come from different llmc versions")
    ckpt = work / f"ckpt-{case['config']}-{case['ckpt_dtype']}"
    make_checkpoint(case["config"], case["ckpt_dtype"], ckpt)
    inline = (src / f"{case['name']}.inline.bin").read_bytes()
    where = {}  # tensor name -> its file (a checkpoint may be sharded)
    for f in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            where.update(dict.fromkeys(st.keys(), f))

    index, keep = rt.ParameterIndex(), []  # keep: add_buffer refers to the arrays until the archive is written
    for e in recipe:
        if "checkpoint" in e:
            with safe_open(str(where[e["checkpoint"]]), framework="pt") as st:
                data = _tensor_bytes(_in_layout(st.get_tensor(e["checkpoint"]), e.get("layout")))
        else:
            data = np.frombuffer(inline, dtype=np.uint8, count=e["nbytes"], offset=e["inline"])
        if _sha(data) != e["sha256"]:
            raise RuntimeError(f"{case['name']}: entry {e['name']} differs from the compiled one (sha256); "
                               "the regenerated checkpoint is not the one compiled against")
        keep.append(data)
        index.add_buffer(e["name"], data)
    irpa = work / f"{case['name']}.irpa"
    index.create_archive_file(str(irpa))
    for suffix in (".vmfb", ".json"):
        shutil.copyfile(src / f"{case['name']}{suffix}", work / f"{case['name']}{suffix}")
    return irpa


def prompt_ids(vocab: int) -> list[int]:
    import numpy as np

    return [int(t) for t in np.random.default_rng(0).integers(3, vocab, PROMPT_LEN)]


def _sync(device: str):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _bandwidth_gb_s(device: str) -> float:
    """Device-to-device copy of 1 GiB, bytes read + written per second (median of 10)."""
    import torch

    a = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    _sync(device)
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        b.copy_(a)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return 2 * a.numel() / statistics.median(times) / 1e9


def torch_reference(ckpt: Path, max_len: int, device: str, logits_file: Path) -> dict:
    """Greedy generation in PyTorch on `device`: tokens, first logits, eager and CUDA-graph timings."""
    import numpy as np
    import torch

    from llmc.models.llama.loaders import load_checkpoint
    from llmc.models.llama.model import Llama, LlamaDecode, LlamaPrefill, new_cache

    config, sd = load_checkpoint(ckpt)
    dtype = next(iter(sd.values())).dtype
    model = Llama.from_state_dict(config, sd, rope_positions=max_len).to(device).eval()
    prompt = prompt_ids(config.vocab_size)
    res = {"config": config.name, "dtype": str(dtype).replace("torch.", ""), "device": device,
           "streamed_bytes": sum(p.numel() * p.element_size() for p in model.parameters())
           - (0 if config.tie_embeddings else model.model.embed_tokens.weight.numel() * model.model.embed_tokens.weight.element_size()),
           "kv_bytes_per_position": 2 * config.n_layers * config.n_kv_heads * config.head_dim * torch.tensor([], dtype=dtype).element_size()}
    # whole_last_layer: a standard forward, as PyTorch runs a Llama (llmc skips the last layer's unread rows)
    prefill, decode = LlamaPrefill(model, whole_last_layer=True), LlamaDecode(model)

    def eager():
        with torch.device(device), torch.no_grad():
            cache = new_cache(config, max_len, dtype)
            _sync(device)
            t0 = time.perf_counter()
            out = prefill(torch.tensor([prompt]), *cache)
            logits, cache = out[0], out[1:]
            toks = [int(logits[0, -1].argmax())]
            t1 = time.perf_counter()
            first = logits[0, -1].float().cpu().numpy()
            t1b = time.perf_counter()
            n = len(prompt)
            for _ in range(NEW_TOKENS - 1):
                n += 1
                out = decode(torch.tensor([[toks[-1]]]), torch.ones(1, n, dtype=torch.int64), *cache)
                logits, cache = out[0], out[1:]
                toks.append(int(logits[0, -1].argmax()))
            t2 = time.perf_counter()
        return toks, first, t1 - t0, (t2 - t1b) / (NEW_TOKENS - 1)

    runs = [eager() for _ in range(REPS + 1)][1:]
    res["tokens"], first = runs[0][0], runs[0][1]
    res["eager"] = {"prefill_ms": 1e3 * statistics.median(r[2] for r in runs),
                    "decode_ms": 1e3 * statistics.median(r[3] for r in runs)}
    np.save(logits_file, first)
    if device == "cuda":
        try:
            res["cuda_graph"] = _graph_timings(model, config, prompt, max_len, dtype, res["tokens"])
        except Exception as e:  # record, don't lose the rest of the run
            res["cuda_graph"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    return res


def _graph_timings(model, config, prompt, max_len, dtype, ref_tokens) -> dict:
    """Prefill and a decode step as CUDA graphs: static shapes, the decode position a device tensor,
    attention over the whole cache with positions past it masked."""
    import torch
    import torch.nn.functional as F

    from llmc.models.llama.model import LlamaPrefill, new_cache

    dev = "cuda"
    with torch.device(dev), torch.no_grad():
        tokens = torch.tensor([prompt])
        cache = new_cache(config, max_len, dtype)
        prefill = LlamaPrefill(model, whole_last_layer=True)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                prefill(tokens, *cache)
        torch.cuda.current_stream().wait_stream(s)
        g_pre = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g_pre):
            pre_out = prefill(tokens, *cache)
        static_cache = [c.clone() for c in cache]
        tok = torch.zeros(1, 1, dtype=torch.int64)
        pos = torch.zeros(1, dtype=torch.int64)
        positions = torch.arange(max_len)
        m = model

        def step():
            h = m.embed(tok)
            cos, sin = m.rope_cos.index_select(0, pos).to(h.dtype), m.rope_sin.index_select(0, pos).to(h.dtype)
            bias = torch.where(positions <= pos, 0.0, float("-inf")).to(h.dtype)[None, None, None, :]
            for i, layer in enumerate(m.model.layers):
                attn = layer.self_attn
                q, k, v = attn.qkv(layer.input_layernorm(h), cos, sin)
                static_cache[2 * i].index_copy_(2, pos, k)
                static_cache[2 * i + 1].index_copy_(2, pos, v)
                o = F.scaled_dot_product_attention(q, static_cache[2 * i], static_cache[2 * i + 1], attn_mask=bias, enable_gqa=True)
                h = h + attn.out(o)
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            return m.lm_head(m.model.norm(h)).argmax(-1)

        with torch.cuda.stream(s):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(s)
        g_dec = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g_dec):
            next_tok = step()

        def run():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            g_pre.replay()
            toks = [int(pre_out[0][0, -1].argmax())]
            t1 = time.perf_counter()
            for c, src in zip(static_cache, pre_out[1:]):
                c.copy_(src)
            torch.cuda.synchronize()
            t1b = time.perf_counter()
            for n in range(len(prompt), len(prompt) + NEW_TOKENS - 1):
                tok.fill_(toks[-1])
                pos.fill_(n)
                g_dec.replay()
                toks.append(int(next_tok[0, 0]))
            t2 = time.perf_counter()
            return toks, t1 - t0, (t2 - t1b) / (NEW_TOKENS - 1)

        runs = [run() for _ in range(REPS + 1)][1:]
    return {"prefill_ms": 1e3 * statistics.median(r[1] for r in runs), "decode_ms": 1e3 * statistics.median(r[2] for r in runs),
            "tokens_match": _leading_match(runs[0][0], ref_tokens)}


def _leading_match(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def llmc_case(case: dict, work: Path, ref: dict, profile: bool) -> dict:
    """One llmc module: load time, greedy generation timings, agreement with PyTorch, kernel profile."""
    import numpy as np

    if case["runtime_flags"]:
        import iree.runtime as rt

        rt.flags.parse_flags(*case["runtime_flags"])
    import llmc.runtime

    vmfb = work / f"{case['name']}.vmfb"
    t0 = time.perf_counter()
    mod = llmc.runtime.load(vmfb)
    mod._ensure_loaded()
    res = {"load_s": time.perf_counter() - t0, "device": mod.device_name}
    prompt = prompt_ids(mod.manifest["llm"]["config"]["vocab_size"])
    t0 = time.perf_counter()
    toks = mod.generate(prompt, NEW_TOKENS, stop_at_eos=False)
    res["first_run_s"] = time.perf_counter() - t0  # kernel loading on first use (PTX JIT) included
    pre, dec = [], []
    for _ in range(REPS):
        mod.generate(prompt, NEW_TOKENS, stop_at_eos=False)
        g = mod.last_generation
        pre.append(g.prefill_seconds)
        dec.append(g.decode_seconds / (NEW_TOKENS - 1))
    res["prefill_ms"], res["decode_ms"] = 1e3 * statistics.median(pre), 1e3 * statistics.median(dec)
    res["tokens"] = toks
    res["prefill_function"] = mod.last_generation.prefill_function
    res["tokens_match"] = _leading_match(toks, ref["tokens"])
    # First logits against PyTorch's (same weights, same dtype on the same device).
    fn = mod.entry_points[mod.manifest["llm"]["prefill"]["function"]]
    spec = mod.manifest["llm"]["cache"]
    from llmc import dtypes

    zeros = [np.zeros(spec["shape"], dtype=dtypes.by_name(spec["dtype"]).numpy) for _ in range(spec["count"])]
    out = fn.call_raw([np.asarray([prompt], dtype=np.int64), *zeros])
    got = mod.host(out[0]).reshape(-1).astype(np.float32)
    want = np.load(ref["logits_file"])
    res["logits_max_abs_err"] = float(np.abs(got - want).max())
    res["logits_ref_max_abs"] = float(np.abs(want).max())
    res["logits_cosine"] = float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))
    if profile:
        try:
            res["kernels"] = _profile(mod, prompt)
        except Exception as e:
            res["kernels"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    return res


def _profile(mod, prompt) -> dict:
    """CUDA kernels of one prefill and of one decode step (generate with 2 new tokens = prefill + 1 step)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    out = {}
    for phase, n_new in (("prefill", 1), ("prefill+decode", 2)):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            mod.generate(prompt, n_new, stop_at_eos=False)
            torch.cuda.synchronize()
        rows = {}
        for ev in prof.events():
            if getattr(ev, "device_type", None) is None or "CUDA" not in str(ev.device_type):
                continue
            r = rows.setdefault(ev.name, [0, 0.0])
            r[0] += 1
            r[1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
        out[phase] = {"kernels": sum(r[0] for r in rows.values()), "gpu_us": sum(r[1] for r in rows.values()),
                      "top": sorted(([k[:90], r[0], round(r[1], 1)] for k, r in rows.items()), key=lambda x: -x[2])[:12]}
    pre, both = out["prefill"], out["prefill+decode"]
    out["decode"] = {"kernels": both["kernels"] - pre["kernels"], "gpu_us": both["gpu_us"] - pre["gpu_us"]}
    return out


def probe(args) -> int:
    """Where one decode step's time goes, for one case: IREE alone (iree-benchmark-module, every input
    a splat, streams and CUDA graphs on cuda), then the pieces of llmc's Python step. Writes OUT/probe.json."""
    import iree.runtime as rt
    import numpy as np

    import llmc.runtime
    from llmc.runtime.module import PARAM_SCOPE

    src, out = Path(args.dir).resolve(), Path(args.out)
    work = Path(args.work or tempfile.mkdtemp(prefix="llmc-probe-"))
    work.mkdir(parents=True, exist_ok=True)
    case = {c["name"]: c for c in json.loads((src / "plan.json").read_text())}[args.case]
    rebuild_archive(case, src, work)
    vmfb, man = work / f"{args.case}.vmfb", json.loads((src / f"{args.case}.json").read_text())
    llm, entries = man["llm"], man["entry_points"]
    pos = min(PROMPT_LEN + NEW_TOKENS // 2, llm["max_seq_len"] - 2)  # the step's position
    steps = [e for e in ("decode_static", "decode") if e in entries]
    tool = Path(rt.__file__).parent.parent / "_runtime_libs" / "iree-benchmark-module"
    device = "cuda" if args.torch_device == "cuda" else "local-task"
    abbrev = {"int64": "i64", "float16": "f16", "float32": "f32", "bfloat16": "bf16"}
    report = {"case": args.case, "position": pos, "iree_benchmark_module_ms": {}}
    for mode, flags in (("streams", []), ("graphs", ["--cuda_use_streams=false"])) if device == "cuda" else (("local-task", []),):
        for entry in steps:
            inputs = []
            for i in entries[entry]["inputs"]:
                shape = [d if isinstance(d, int) else pos + 1 for d in i["shape"]]  # decode's one dynamic size: the mask, L = pos + 1
                value = {"attention_mask": 1, "position": pos}.get(i["name"], 0)
                inputs.append(f"--input={'x'.join(map(str, shape))}x{abbrev[i['dtype']]}={value}")
            cmd = [str(tool), f"--device={device}", f"--module={vmfb}", f"--parameters={PARAM_SCOPE}={work / (args.case + '.irpa')}",
                   f"--function={entry}", "--benchmark_repetitions=5", "--benchmark_min_time=0.5s", *flags, *inputs]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            median = [l.split()[1] for l in r.stdout.splitlines() if "real_time_median" in l]
            report["iree_benchmark_module_ms"][f"{entry} {mode}"] = float(median[0]) if median and r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]

    mod = llmc.runtime.load(vmfb)
    mod._ensure_loaded()
    from llmc.runtime.generate import Generator

    dev = mod.devices[0]
    cache = Generator(mod)._new_cache(mod.devices)
    tok = np.asarray([[5]], dtype=np.int64)

    def median_ms(fn, n=60):
        for _ in range(5):
            fn()
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return round(1e3 * statistics.median(times), 4)

    py = report["python_ms"] = {}
    for entry in steps:
        f = mod.entry_points[entry].call_raw
        extra = [np.asarray([pos], dtype=np.int64)] if entry == "decode_static" else [np.ones((1, pos + 1), dtype=np.int64)]
        on_device = [rt.asdevicearray(dev, a) for a in (tok, *extra)]
        logits = f([tok, *extra, *cache])[0]
        py[f"{entry}: call, host inputs"] = median_ms(lambda: f([tok, *extra, *cache]))
        py[f"{entry}: call, inputs on the device"] = median_ms(lambda: f([*on_device, *cache]))
        py[f"{entry}: call + Module.host(logits)"] = median_ms(lambda: mod.host(f([tok, *extra, *cache])[0]))
    py["iree.runtime DeviceArray.to_host(logits)"] = median_ms(lambda: logits.to_host())
    py["llmc Module.host(logits)"] = median_ms(lambda: mod.host(logits))
    py["asdevicearray(token)"] = median_ms(lambda: rt.asdevicearray(dev, tok))
    report["host_copy_equal"] = bool(np.array_equal(logits.to_host(), mod.host(logits)))
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    return 0


def child(args) -> int:
    """One unit of `run` in its own process: a PyTorch reference or one llmc case; JSON on stdout."""
    work, src = Path(args.work), Path(args.dir)
    cases = {c["name"]: c for c in json.loads((src / "plan.json").read_text())}
    if args.reference:
        case = cases[args.reference]
        ckpt = work / f"ckpt-{case['config']}-{case['ckpt_dtype']}"
        if case["kind"] == "check":
            ckpt = src / ckpt.name
        logits_file = work / f"ref-logits-{model_key(case)}.npy"
        res = torch_reference(ckpt, case["max_len"], args.torch_device, logits_file)
        res["logits_file"] = str(logits_file)
    else:
        case = cases[args.case]
        ref = json.loads(Path(args.ref).read_text())
        if case["kind"] == "check":
            for suffix in (".vmfb", ".json", ".irpa"):
                shutil.copyfile(src / f"{case['name']}{suffix}", work / f"{case['name']}{suffix}")
        elif not (work / f"{case['name']}.irpa").exists():
            t0 = time.perf_counter()
            rebuild_archive(case, src, work)
            print(f"  {case['name']}: weights rebuilt in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        res = llmc_case(case, work, ref, case["profile"] and args.torch_device == "cuda")
    print("@@RESULT " + json.dumps(res))
    return 0


def _child(argv: list[str], timeout: int) -> dict:
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    sys.stderr.write(r.stderr[-4000:] if r.returncode else "")
    for line in r.stdout.splitlines():
        if line.startswith("@@RESULT "):
            out = json.loads(line[len("@@RESULT "):])
            out["wall_s"] = round(time.perf_counter() - t0, 1)
            return out
    tail = [l for l in r.stderr.strip().splitlines() if l.strip()][-3:]
    return {"error": f"exit {r.returncode}: " + " | ".join(tail)}


def run(args) -> int:
    src, out = Path(args.dir).resolve(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="llmc-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    planned = json.loads((src / "plan.json").read_text())
    cases = [c for c in planned if "compile_error" not in c and "same_binary_as" not in c]
    if args.only:
        cases = [c for c in cases if c["name"] in args.only]
    report = {"machine": _machine(args.torch_device), "refs": {}, "cases": {},
              "not_run": {c["name"]: (f"compile failed: {c['compile_error']}" if "compile_error" in c else
                                      f"flags {' '.join(c['flags'])} changed nothing: the same .vmfb as {c['same_binary_as']}")
                          for c in planned if "compile_error" in c or "same_binary_as" in c}}
    if args.torch_device == "cuda":
        report["machine"]["copy_gb_s"] = _bandwidth_gb_s("cuda")
    common = ["--dir", str(src), "--work", str(work), "--torch-device", args.torch_device]
    for key in dict.fromkeys(model_key(c) for c in cases):
        group = [c for c in cases if model_key(c) == key]
        t0 = time.perf_counter()
        if group[0]["kind"] == "speed":
            make_checkpoint(group[0]["config"], group[0]["ckpt_dtype"], work / f"ckpt-{group[0]['config']}-{group[0]['ckpt_dtype']}")
        ref = _child(["child", "--reference", group[0]["name"], *common], args.timeout)
        report["refs"][key] = ref
        print(f"run: {key}: PyTorch reference in {time.perf_counter() - t0:.1f} s: "
              f"{ref.get('error') or ref.get('eager')} {ref.get('cuda_graph', '')}", file=sys.stderr, flush=True)
        if "error" in ref:
            continue
        ref_file = work / f"ref-{key}.json"
        ref_file.write_text(json.dumps(ref))
        for case in group:
            res = _child(["child", "--case", case["name"], "--ref", str(ref_file), *common], args.timeout)
            res["case"] = {k: case.get(k) for k in ("kind", "config", "dtype", "target", "arch", "flags", "runtime_flags", "compile_args")}
            res["ref"] = key  # the PyTorch reference its ratios are taken against
            report["cases"][case["name"]] = res
            brief = res.get("error") or {k: round(res[k], 3) for k in ("prefill_ms", "decode_ms", "load_s") if k in res}
            print(f"run: {case['name']}: {brief} tokens {res.get('tokens_match')}/{NEW_TOKENS}", file=sys.stderr, flush=True)
            (out / "gpu-bench.json").write_text(json.dumps(report, indent=1))
    (out / "gpu-bench.json").write_text(json.dumps(report, indent=1))
    (out / "gpu-bench.md").write_text(markdown(report))
    print(markdown(report))
    return 0


def _machine(device: str) -> dict:
    info = {"torch_device": device}
    try:
        import torch

        info["torch"] = torch.__version__
        if device == "cuda":
            info["gpu"] = torch.cuda.get_device_name(0)
    except Exception:
        pass
    try:
        from importlib.metadata import version

        info["iree_runtime"] = version("iree-base-runtime")
    except Exception:
        pass
    return info


def markdown(report: dict) -> str:
    bw = report["machine"].get("copy_gb_s")
    lines = [f"# llmc on {report['machine'].get('gpu', report['machine']['torch_device'])}", "",
             f"copy bandwidth (read + write): {bw:.0f} GB/s" if bw else "", "",
             "| case | load s | prefill ms | decode ms | decode % roofline | vs torch eager (prefill, decode) | vs CUDA graph (prefill, decode) | tokens = torch | logits max err / cos | kernels per decode step |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in report["cases"].items():
        ref = report["refs"].get(r.get("ref"), {})
        if "error" in r:
            lines.append(f"| {name} | {r['error'][:150]} |||||||||")
            continue
        e, g = ref.get("eager", {}), ref.get("cuda_graph", {})

        def ratio(x, y):
            return f"{y / x:.2f}x" if x and y else "-"

        roof = "-"
        if bw and ref.get("streamed_bytes"):
            step_bytes = ref["streamed_bytes"] + ref["kv_bytes_per_position"] * (PROMPT_LEN + NEW_TOKENS // 2)
            roof = f"{100 * step_bytes / (bw / 2 * 1e9) / (r['decode_ms'] / 1e3):.0f}%"
        kern = (r.get("kernels") or {}).get("decode", {}).get("kernels", "-") if isinstance(r.get("kernels"), dict) else "-"
        entry = f" ({r['prefill_function']})" if r.get("prefill_function") else ""
        lines.append(f"| {name}{entry} | {r['load_s']:.1f} | {r['prefill_ms']:.2f} | {r['decode_ms']:.3f} | {roof} | "
                     f"{ratio(r['prefill_ms'], e.get('prefill_ms'))}, {ratio(r['decode_ms'], e.get('decode_ms'))} | "
                     f"{ratio(r['prefill_ms'], g.get('prefill_ms'))}, {ratio(r['decode_ms'], g.get('decode_ms'))} | "
                     f"{r['tokens_match']}/{NEW_TOKENS} | {r['logits_max_abs_err']:.2e} / {r['logits_cosine']:.6f} | {kern} |")
    lines += ["", "ratios: PyTorch time / llmc time (above 1: llmc faster). roofline: (weights + KV cache in use) "
              "read once per step at half the copy bandwidth (a copy reads and writes).", "",
              "| PyTorch reference | eager prefill ms | eager decode ms | graph prefill ms | graph decode ms | graph tokens = eager |",
              "| --- | --- | --- | --- | --- | --- |"]
    for key, ref in report["refs"].items():
        if "error" in ref:
            lines.append(f"| {key} | {ref['error'][:150]} |||||")
            continue
        e, g = ref.get("eager", {}), ref.get("cuda_graph", {})
        f = lambda d, k, p=2: f"{d[k]:.{p}f}" if k in d else (d.get("error", "-")[:80] if k == "prefill_ms" else "-")
        lines.append(f"| {key} | {f(e, 'prefill_ms')} | {f(e, 'decode_ms', 3)} | {f(g, 'prefill_ms')} | {f(g, 'decode_ms', 3)} | {g.get('tokens_match', '-')} |")
    if report.get("not_run"):
        lines += ["", "Not run:"] + [f"- {n}: {why}" for n, why in report["not_run"].items()]
    for name, r in report["cases"].items():
        k = r.get("kernels")
        if not isinstance(k, dict) or "error" in k:
            if isinstance(k, dict):
                lines += ["", f"{name}: kernel profile failed: {k['error']}"]
            continue
        for phase in ("prefill", "prefill+decode"):
            lines += ["", f"## {name}: CUDA kernels, {phase} ({k[phase]['kernels']} launches, {k[phase]['gpu_us'] / 1e3:.2f} ms on the GPU)", "",
                      "| kernel | count | µs |", "| --- | --- | --- |"]
            lines += [f"| `{n}` | {c} | {t} |" for n, c, t in k[phase]["top"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="compile the plan's cases and write their weight recipes (here)")
    pp.add_argument("--out", default=".gpu")
    pp.add_argument("--scratch", default="/tmp/llmc-gpu-prepare", help="checkpoints and archives that do not travel")
    pp.add_argument("--target", default="cuda", choices=("cuda", "cpu"), help="cpu: a rehearsal of the flow on this machine")
    pp.add_argument("--only", nargs="*", help="case names")
    pr = sub.add_parser("run", help="rebuild weights, run every case and PyTorch, write the report (on the GPU machine)")
    pr.add_argument("--dir", default=".gpu")
    pr.add_argument("--out", required=True)
    pr.add_argument("--work", help="scratch folder (default: a new temporary one)")
    pr.add_argument("--torch-device", default="cuda", choices=("cuda", "cpu"))
    pr.add_argument("--timeout", type=int, default=150, help="seconds per case process")
    pr.add_argument("--only", nargs="*", help="case names")
    pb = sub.add_parser("probe", help="one case's decode step, broken down: IREE alone, then llmc's Python call (there)")
    pb.add_argument("--dir", default=".gpu")
    pb.add_argument("--case", required=True)
    pb.add_argument("--out", required=True)
    pb.add_argument("--work", help="scratch folder (default: a new temporary one)")
    pb.add_argument("--torch-device", default="cuda", choices=("cuda", "cpu"), help="cpu: the module runs on local-task")
    pc = sub.add_parser("child")
    pc.add_argument("--dir", required=True)
    pc.add_argument("--work", required=True)
    pc.add_argument("--torch-device", default="cuda")
    pc.add_argument("--reference")
    pc.add_argument("--case")
    pc.add_argument("--ref")
    args = p.parse_args(argv)
    return {"prepare": prepare, "run": run, "child": child, "probe": probe}[args.cmd](args)


def ensure_llmc_importable() -> None:
    """On a machine where llmc is not installed (the GPU machine gets the bare working tree), put a
    package tree of links to the repo's folders on sys.path and on the children's PYTHONPATH."""
    try:
        import llmc.runtime  # noqa: F401
        return
    except ImportError:
        for name in [m for m in sys.modules if m == "llmc" or m.startswith("llmc.")]:
            del sys.modules[name]  # a plain `llmc` folder found on the path without its mapped subpackages
    shim = Path(tempfile.gettempdir()) / "llmc-shim"
    pkg = shim / "llmc"
    if not pkg.exists():
        pkg.mkdir(parents=True)
        for f in (REPO / "llmc").iterdir():
            (pkg / f.name).symlink_to(f)
        for sub in ("compiler", "passes", "runtime", "models", "tools"):
            (pkg / sub).symlink_to(REPO / sub)
    sys.path.insert(0, str(shim))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))


if __name__ == "__main__":
    ensure_llmc_importable()
    sys.exit(main())
