"""`llmc` command line: argparse and validation only, then the API (compiler/api.py, runtime/).

Exit codes (README.md): 0 ok; 1 a check failed; 2 bad usage or bad input; 3 compiler or runtime
failure (with a reproducer written). Errors print as one `llmc: error: ...` line without a traceback
unless --debug is given.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
import warnings
from pathlib import Path

from llmc.errors import LlmcError, UsageError


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        # No prefix matching of long options: `--prompt TEXT` must not silently become --prompt-ids.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):  # argparse's own errors: one line, exit 2
        self.exit(2, f"llmc: error: {message} (see `{self.prog} --help`)\n")


def _add_common(p: argparse.ArgumentParser, top: bool = False) -> None:
    # Accepted before or after the subcommand; a subcommand's default must not undo the top level's.
    default = False if top else argparse.SUPPRESS
    p.add_argument("--debug", action="store_true", default=default, help="show Python tracebacks on errors")
    p.add_argument("--verbose", "-v", action="store_true", default=default, help="log what llmc does (passes, flags, timings)")


def _add_target_options(p: argparse.ArgumentParser) -> None:
    from llmc.compiler.targets import DTYPES, TARGETS

    p.add_argument("--target", default="cpu", help=f"target: {', '.join(TARGETS)} (default cpu)")
    p.add_argument("--arch", default=None, help="target architecture (cpu: an LLVM CPU name or 'host', the default; several best first, e.g. x86-64-v4,x86-64-v3, or 'portable': one artifact that runs each CPU's best code, see --cpu-dispatch)")
    p.add_argument("--dtype", default="f32", help=f"weight and compute dtype: {', '.join(DTYPES)} (default f32)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="llmc", description="Compile PyTorch models to IREE modules and check them against eager PyTorch.")
    _add_common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    c = sub.add_parser("compile", help="compile a model (.pt2) to NAME.vmfb + NAME.irpa + NAME.json")
    c.add_argument("model", help="a torch.export archive (.pt2), or a Llama checkpoint: Meta .pth/.pt with params.json beside it, or its folder; an HF folder (config.json + safetensors)")
    _add_target_options(c)
    c.add_argument("--config", default=None, metavar="NAME|FILE", help="Llama: the config of a state dict saved on its own (.pt/.pth/.safetensors with nothing beside it): a name such as llama3-8b, or a params.json / config.json path")
    c.add_argument("--max-seq-len", type=int, default=None, metavar="N", help="Llama checkpoints: KV-cache length, the longest prompt + generation (default min(4096, the model's context))")
    c.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                   help="Llama checkpoints: split the model over N devices of the target (attention heads and MLP split, "
                        "all-reduce inside the module; cpu: N local devices in one process); default 1")
    c.add_argument("--prefill-buckets", default="auto", metavar="auto|none|N,N,...",
                   help="Llama checkpoints: prompt sizes with a prefill entry point of their own, the length fixed and the "
                        "prompt padded to it (static shapes: much faster matmuls on GPUs); auto (the default): 128,512,2048 "
                        "up to --max-seq-len on hip and cuda, none on cpu, vulkan and xpu")
    c.add_argument("--prefill-chunk", default="auto", metavar="auto|none|N",
                   help="Llama checkpoints on cpu: an entry point taking N prompt tokens after the cached ones (N fixed: "
                        "static-shape matmuls, no padding); a prompt of P >= N tokens is prefilled P mod N tokens by the "
                        "dynamic prefill, then N at a time; auto (the default): 64 on cpu when --max-seq-len holds two "
                        "chunks (bf16/fp8/int8 weights: where llmc's C kernels serve), else none")
    c.add_argument("--kv-dtype", default="auto", metavar="auto|f32|bf16",
                   help="Llama checkpoints: the KV cache's dtype; bf16 on cpu stores K/V rounded to bf16 (math stays "
                        "f32): half the cache memory and half the bytes a decode step's attention reads; auto (the "
                        "default): bf16 for --dtype bf16 on cpu, else the compute dtype")
    c.add_argument("--static-decode", choices=("auto", "on", "off"), default="auto",
                   help="Llama checkpoints: also export a decode step with every shape fixed (attention over the whole "
                        "cache, masked), which a GPU runtime can record once and replay; auto (the default): "
                        "see docs/targets.md")
    c.add_argument("-o", "--output", default=None, help="output .vmfb path (default ./MODEL_STEM.vmfb)")
    c.add_argument("--dump-ir", default=None, metavar="DIR", help="write the IR after import and after each pass")
    c.add_argument("--repro-dir", default=None, metavar="DIR", help="where to save reproducers on failure (default: the output folder)")
    c.add_argument("--iree-flag", action="append", default=[], metavar="FLAG", help="extra iree-compile flag, repeatable (e.g. --iree-flag=--iree-opt-level=O3)")
    c.add_argument("--quant-exclude", "--fp8-exclude", dest="quant_exclude", action="append", default=[], metavar="PATTERN",
                   help="--dtype fp8/int8: keep weights whose name matches (fnmatch, e.g. 'lm_head.*') in the compute dtype; repeatable (--fp8-exclude is the older name)")
    c.add_argument("--fp8-scales", choices=("channel", "tensor"), default="channel", help="--dtype fp8: one scale per output channel (default) or per tensor")
    c.add_argument("--cpu-dispatch", choices=("modules", "variants"), default="modules", help="several CPUs in --arch: one .vmfb per CPU sharing the .irpa, llmc.load runs the best (modules, the default), or one .vmfb with a variant per executable, IREE picks (variants; no data tiling in IREE 3.13)")
    c.add_argument("--quant-embeddings", "--fp8-embeddings", dest="quant_embeddings", action="store_const", const=True, default=None,
                   help="--dtype fp8/int8: embedding tables quantized too (one scale per row; only the gathered rows are decoded). "
                        "The int8 default; --fp8-embeddings is the older name")
    c.add_argument("--no-quant-embeddings", dest="quant_embeddings", action="store_const", const=False,
                   help="--dtype fp8/int8: embedding tables stay in the compute dtype (the fp8 default)")
    c.add_argument("--int8-math", choices=("integer", "float"), default="integer",
                   help="int8 (PT2E) programs: i8 x i8 -> i32 contractions where the arch can (integer, the default) or quantize/dequantize as f32 math everywhere (float)")
    c.add_argument("--json", action="store_true", help="print the artifact paths and manifest summary as JSON")
    _add_common(c)

    r = sub.add_parser("run", help="generate text (or tokens) with a compiled language model")
    r.add_argument("vmfb", help="a module compiled from a Llama checkpoint")
    prompt = r.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT", help="prompt text, encoded with the checkpoint's tokenizer; the answer streams to stdout")
    prompt.add_argument("--prompt-ids", metavar="1,2,3", help="prompt token ids, comma-separated")
    r.add_argument("--chat", action="store_true", help="with --prompt: wrap it in the checkpoint's chat template (tokenizer_config.json)")
    r.add_argument("--max-new-tokens", type=int, default=32, metavar="N", help="tokens to generate (default 32)")
    r.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    r.add_argument("--top-k", type=int, default=0, help="sample from the k most likely tokens (0 = all)")
    r.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0 = off)")
    r.add_argument("--seed", type=int, default=None, help="seed for sampling")
    r.add_argument("--no-eos", action="store_true", help="do not stop at the model's end-of-sequence id")
    r.add_argument("--device", default=None, help="IREE device (default: the manifest's, e.g. local-task)")
    r.add_argument("--threads", type=int, default=None, help="worker threads for local-task (1 or more; 1 without --device runs a module for one device on the calling thread, IREE's local-sync, "
                   "or, for a language model whose greedy steps are queued ahead, on one worker of its own while the calling thread queues)")
    r.add_argument("--weights", choices=("auto", "mmap", "memory"), default="auto",
                   help="cpu: map the weights from the .irpa, or read them into huge-page memory (faster decode); "
                        "auto (default): memory when the decode reads them in place and they fit in half the free memory")
    r.add_argument("--json", action="store_true", help="print one JSON object: tokens, prompt_ids, text (with --prompt), seconds, and prefill/decode seconds and tokens/s")
    _add_common(r)

    i = sub.add_parser("info", help="show a compiled module's manifest: target, entry points, passes")
    i.add_argument("vmfb")
    i.add_argument("--json", action="store_true", help="print the whole manifest")
    _add_common(i)

    t = sub.add_parser("targets", help="list targets, archs and dtype support (native / emulated / planned)")
    t.add_argument("--json", action="store_true")
    _add_common(t)

    d = sub.add_parser(
        "diff",
        help="run a compiled module and eager PyTorch on the same inputs and compare",
        description="Compare a compiled module with eager PyTorch on the same inputs. Exit 0: every output within "
        "tolerance; 1: an output over tolerance (the worst is named); 2: bad usage or input; 3: compile or runtime failure.",
    )
    d.add_argument("model", help="the model the artifact was compiled from: a .pt2 (torch.export.save), or a Llama checkpoint (prompt + greedy decode steps)")
    d.add_argument("--steps", type=int, default=None, metavar="N", help="Llama checkpoints: greedy decode steps after the prompt (default 8; the prompt has --seq tokens)")
    d.add_argument("vmfb", nargs="?", default=None, help="the compiled module; leave out to compile MODEL first (--target, --dtype, -o)")
    d.add_argument("--target", default=None, help="without an artifact: the target to compile for (default cpu); with one: must match it")
    d.add_argument("--arch", default=None, help="without an artifact: the architecture to compile for (default: the target's)")
    d.add_argument("--dtype", default=None, help="without an artifact: the dtype to compile in (default f32); with one: must match it")
    d.add_argument("-o", "--output", default=None, metavar="OUT.vmfb", help="without an artifact: keep the compiled module here (default: a temp dir)")
    d.add_argument("--inputs", default=None, metavar="FILE.npz", help="inputs to use (keys: the signature's input names or paths, see `llmc info`) instead of random ones")
    d.add_argument("--seed", type=int, default=0, help="seed for the random inputs (default 0)")
    d.add_argument("--seq", type=int, default=None, help="size for dynamic dimensions (default 17, clamped to range)")
    d.add_argument("--tolerance-profile", default="auto", help="f32, f16, bf16 or auto (the artifact's dtype)")
    d.add_argument("--tolerance", default=None, metavar="KEY=VALUE,...", help="override the profile for this run: max_rel, min_cosine, min_top1, max_kl (e.g. max_rel=1e-4,min_cosine=0.999)")
    d.add_argument("--logits", action="append", default=[], metavar="NAME", help="also check this output as logits (top-1/top-k agreement, KL), e.g. out or out[0]; repeatable")
    d.add_argument("--top-k", type=int, default=5, help="k for the top-k agreement of logits outputs (default 5)")
    d.add_argument("--json", default=None, metavar="REPORT.json", help="write the report as JSON (format llmc-diff-report/1)")
    d.add_argument("--junit", default=None, metavar="REPORT.xml", help="write a JUnit XML report (a testsuite per entry point, a testcase per output)")
    d.add_argument("--per-layer", action="store_true", help="also name the first module whose output goes over tolerance (compiles an instrumented copy, run with the artifact's .irpa; the exit code still follows the outputs)")
    d.add_argument("--per-layer-depth", type=int, default=None, metavar="N", help="with --per-layer: only modules down to N levels below the model (1: layers.3; 2: layers.3.self_attn)")
    d.add_argument("--repro-dir", default=None, metavar="DIR", help="where to save reproducers if a compile fails (default: the current folder)")
    _add_common(d)

    b = sub.add_parser(
        "bisect",
        help="find the op that makes a model fail to compile (or drift from eager) and write a one-op reproducer",
        description="Compile MODEL; if iree-compile fails, or the output drifts from eager PyTorch beyond the dtype's "
        "tolerance, binary-search the graph for the first op that causes it and write a one-op reproducer "
        "(repro.mlir, repro.py, command.sh) into OUTDIR. Exit 0: compiles and matches; 1: failure found and "
        "reported; 2: bad usage or input.",
    )
    b.add_argument("model", help="a torch.export archive (.pt2), or a Llama checkpoint (each entry point, prefill and decode, is bisected)")
    _add_target_options(b)
    b.add_argument("-o", "--output", default=None, metavar="OUTDIR", help="reproducer folder (default ./MODEL_STEM.bisect)")
    b.add_argument("--seed", type=int, default=0, help="seed for the random inputs of the drift check (default 0)")
    b.add_argument("--max-seq-len", type=int, default=None, metavar="N", help="Llama checkpoints: KV-cache length of the bisected module (default min(64, the model's context))")
    b.add_argument("--json", default=None, metavar="REPORT.json", help="also write the report as JSON (format llmc-bisect/1)")
    _add_common(b)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="llmc: %(message)s")
    # torch 2.13 warns about its own pytree internals on every export; it is not the user's to act on
    # and it broke the live progress line.
    from llmc.compiler.progress import PYTREE_WARNING

    warnings.filterwarnings("ignore", message=PYTREE_WARNING, category=FutureWarning)
    try:
        return {"compile": cmd_compile, "run": cmd_run, "info": cmd_info, "targets": cmd_targets, "diff": cmd_diff, "bisect": cmd_bisect}[args.command](args)
    except LlmcError as e:
        if args.debug:
            traceback.print_exc()
        msg = str(e)
        print(f"llmc: error: {msg}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("llmc: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `llmc info X --json | head`: the reader is gone; stop quietly, as cat and grep do. Point stdout
        # at /dev/null so the interpreter's final flush does not raise again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # a bug in llmc or an unexpected upstream failure
        if args.debug:
            traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"llmc: internal error: {type(e).__name__}: {first} (rerun with --debug for the traceback)", file=sys.stderr)
        return 3


def cmd_compile(args) -> int:
    from llmc.compiler import targets

    # Cheap checks first: a wrong flag or path answers before torch is imported (compile_model checks again).
    targets.resolve(args.target, args.arch, args.dtype, extra_flags=tuple(args.iree_flag), cpu_dispatch=args.cpu_dispatch)
    targets.parse_buckets(args.prefill_buckets)
    targets.parse_chunk(args.prefill_chunk)
    targets.parse_kv_dtype(args.kv_dtype)
    if not Path(args.model).exists():
        raise UsageError(f"{args.model}: no such file or directory")
    from llmc.compiler.api import compile_model

    common = dict(
        target=args.target,
        dtype=args.dtype,
        arch=args.arch,
        output=args.output,
        dump_ir=args.dump_ir,
        repro_dir=args.repro_dir,
        extra_iree_flags=tuple(args.iree_flag),
        quiet=False,
        quant_exclude=tuple(args.quant_exclude),
        fp8_scales=args.fp8_scales,
        quant_embeddings=args.quant_embeddings,
        cpu_dispatch=args.cpu_dispatch,
        int8_math=args.int8_math,
        tensor_parallel=args.tensor_parallel,
        prefill_buckets=args.prefill_buckets,
        static_decode=args.static_decode,
        prefill_chunk=args.prefill_chunk,
        kv_dtype=args.kv_dtype,
    )
    # compile_model validates the path, target and output before any work; Llama checkpoints
    # (Meta .pth + params.json, HF folders) become a prefill + decode module (compiler/llm.py).
    art = compile_model(Path(args.model), max_seq_len=args.max_seq_len, config=args.config, **common)
    manifest = art.read_manifest()
    if args.json:
        print(json.dumps({"vmfb": str(art.vmfb), "params": str(art.params) if art.params else None, "manifest": str(art.manifest), "compile": manifest["compile"]}, indent=2))
    else:
        size = art.vmfb.stat().st_size
        params = f", {art.params} ({art.params.stat().st_size / 1e6:.1f} MB)" if art.params else ""
        tok = (manifest.get("llm") or {}).get("tokenizer")
        tokenizer = f", {art.vmfb.parent / tok['file']} ({tok['kind']} tokenizer)" if tok else ""
        print(f"wrote {art.vmfb} ({size / 1e3:.0f} KB){params}, {art.manifest}{tokenizer}")
    return 0


def cmd_run(args) -> int:
    import time

    from llmc.runtime import load

    vmfb = Path(args.vmfb)
    if not vmfb.exists():
        raise UsageError(f"{vmfb}: no such file")
    if args.chat and args.prompt is None:
        raise UsageError("--chat applies to --prompt TEXT (the template wraps text); --prompt-ids are sent as given")
    prompt = None
    if args.prompt_ids is not None:
        try:
            prompt = [int(t) for t in args.prompt_ids.replace(" ", "").split(",")]
        except ValueError:
            raise UsageError(f"--prompt-ids {args.prompt_ids!r}: expected comma-separated integers, e.g. --prompt-ids 1,2,3") from None
        if not prompt:
            raise UsageError("--prompt-ids: give at least one token id, e.g. --prompt-ids 1,2,3")
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads {args.threads}: give 1 or more worker threads (or leave it out for IREE's default)")
    mod = load(vmfb, device=args.device, threads=args.threads, weights=args.weights)
    options = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop_at_eos=not args.no_eos)
    stream = not args.json and (args.prompt is not None or sys.stdout.isatty())
    if args.prompt is not None:
        _ = mod.tokenizer  # its errors (none recorded, a file missing) before any work
    start = time.perf_counter()
    if args.prompt is not None:
        if stream:
            options["on_text"] = lambda piece: print(piece, end="", flush=True)
        mod.generate_text(args.prompt, args.max_new_tokens, chat=args.chat, **options)
    else:
        if stream:
            options["on_token"] = lambda t: print(t, end=" ", flush=True)
        mod.generate(prompt, args.max_new_tokens, **options)
    seconds = time.perf_counter() - start
    run = mod.last_generation
    if args.json:
        out = {"tokens": run.tokens, "prompt_ids": run.prompt_ids, "seconds": round(seconds, 4), **run.as_json(), "weights": mod.weights}
        if args.prompt is not None:
            out["text"] = run.text
        print(json.dumps(out))
    else:
        if stream:
            print(flush=True)
        else:
            print(",".join(str(t) for t in run.tokens))
        print(f"llmc: {run.summary()}", file=sys.stderr)
    return 0


def cmd_info(args) -> int:
    vmfb = Path(args.vmfb)
    if not vmfb.exists():
        raise UsageError(f"{vmfb}: no such file")
    manifest_path = vmfb.with_suffix(".json")
    if not manifest_path.exists():
        raise UsageError(f"{manifest_path}: manifest not found beside {vmfb.name}")
    try:
        m = json.loads(manifest_path.read_text())
    except json.JSONDecodeError as e:
        raise UsageError(f"{manifest_path}: not a valid manifest ({e})") from e
    if args.json:
        print(json.dumps(m, indent=2))
        return 0
    from llmc.compiler import vmfb as vmfb_info

    try:  # before anything is printed: a file that is no IREE module is one error line
        code = vmfb_info.inspect(vmfb)
    except ValueError as e:
        raise UsageError(str(e)) from e
    t = m["target"]
    print(f"module:   {vmfb}")
    print(f"target:   {t['name']} ({t['backend']}, arch {t['arch']}{' = ' + t['cpu'] if t.get('cpu') and not t.get('cpu_variants') else ''}), dtype {m['dtype']}")
    print(f"built by: llmc {m['versions']['llmc']}, torch {m['versions']['torch']}, iree {m['versions']['iree-base-compiler']}")
    if m.get("params"):
        p = m["params"]
        print(f"params:   {p['file']} ({p['count']} tensors, {p['bytes'] / 1e6:.1f} MB, scope '{p['scope']}')")
    if t.get("cpu_features"):
        print(f"cpu:      {t.get('cpu') or t['arch']}: {' '.join(t['cpu_features'])}")
    if t.get("cpu_variants"):
        from llmc.runtime.module import chosen_variant, host_cpu_flags, host_has

        have = host_cpu_flags()
        variants = [(v["cpu"], tuple(v["requires"])) for v in t["cpu_variants"]]
        base = set(t.get("cpu_features", ()))  # the fallback's: every machine that loads it has them
        text = ", ".join(f"{cpu} (if {'+'.join(f for f in req if f not in base)})" if req else f"{cpu} (otherwise)" for cpu, req in variants)
        here = chosen_variant(variants, lambda f: host_has(have, f)) if have is not None else None
        print(f"variants: {text}; this CPU runs {here or 'unknown (no /proc/cpuinfo)'}")
        if t.get("cpu_modules"):
            stem = Path(vmfb).stem
            print(f"modules:  {', '.join(f'{cpu}: {stem}{f}' for cpu, f in t['cpu_modules'].items())} (one per CPU, sharing the parameters)")
    print(f"code:     {code.summary()}")
    for name, ep in m["entry_points"].items():
        print(f"entry:    {name}({', '.join(_grouped(_arg_text(e) for e in ep['inputs']))})")
    if m.get("llm"):
        cfg, cache = m["llm"]["config"], m["llm"]["cache"]
        print(
            f"llm:      {cfg['name']}: {cfg['n_layers']} layers, dim {cfg['dim']}, heads {cfg['n_heads']}/{cfg['n_kv_heads']} kv, "
            f"vocab {cfg['vocab_size']}; max-seq-len {m['llm']['max_seq_len']}, KV cache {cache['count']} x {cache['dtype']}{cache['shape']}"
        )
        buckets = m["llm"].get("prefill_buckets") or []
        if buckets:
            fill = m["llm"].get("prefill_bucket_min_fill", 0.0)
            print(f"prefill:  buckets {', '.join(str(b['tokens']) for b in buckets)} tokens (static-shape entry points; a prompt pads "
                  f"to the smallest that holds it{f' and is at least {fill:.0%} full' if fill else ''}), else the dynamic prefill")
        chunk = m["llm"].get("prefill_chunk")
        if chunk:
            print(f"prefill:  chunks of {chunk['tokens']} tokens ({chunk['function']}: static-shape matmuls after the cached "
                  f"positions) for a prompt of {chunk['tokens']} tokens or more, its first P mod {chunk['tokens']} by the dynamic prefill")
        if m["llm"].get("decode_static"):
            print(f"decode:   {m['llm']['decode_static']['function']} for every step (static shapes: the position an input, "
                  "attention over the whole cache masked past it)")
        step = m["llm"].get("decode_static") or m["llm"]["decode"]
        if step.get("greedy"):
            from llmc.runtime.generate import queueable_twin

            how = ("each step queued behind the one before" if queueable_twin(step["greedy"])
                   else "an older build's twin: generate reads the logits; recompile to run it")
            print(f"greedy:   {step['greedy']['function']} for greedy steps ({step['function']} that also chooses the token; "
                  f"the host reads the token, not the logits; {how})")
        tp = m["llm"].get("tensor_parallel")
        if tp:
            per = tp.get("param_bytes_by_device") or []
            placed = ", ".join(f"device {d}: {b / 1e6:.1f} MB" for d, b in enumerate(per[:-1]))
            placed += f", unsplit (rope tables, constants; on device 0): {per[-1] / 1e6:.1f} MB" if per and per[-1] else ""
            print(f"split:    {tp['devices']} devices ({t['device']} x{tp['devices']}): {tp['heads_per_device']} heads, "
                  f"{tp['kv_heads_per_device']} KV heads, {tp['ffn_per_device']} MLP channels and {tp['vocab_per_device']} vocabulary "
                  f"rows a device; all-reduce after o_proj and down_proj; KV cache {cache['count'] // tp['devices']} tensors a device")
            if placed:
                print(f"weights:  {placed}")
        tok = m["llm"].get("tokenizer")
        if tok:
            chat = ", chat template from " + tok["config"] if tok.get("config") else ""
            print(f"tokenizer: {tok['file']} ({tok['kind']}{chat}): llmc run --prompt TEXT")
        else:
            print("tokenizer: none (the checkpoint had none): llmc run --prompt-ids 1,2,3")
    ran = ", ".join(
        f"{p['name']} ({p.get('kind', '?')}: rewrote {p['rewrote']}"
        + ("".join(f", {k} {v}" for k, v in p.get("forms", {}).items())) + ")"
        for p in m["passes"]
    ) or "none"
    print(f"passes:   {ran}")
    for sk in m.get("passes_skipped", []):
        print(f"skipped:  {sk['name']}: {sk['reason']}")
    print(f"flags:    {' '.join(m['iree_flags'])}")
    return 0


def _arg_text(e: dict) -> str:
    from llmc.runtime.module import shape_text

    return f"{e['path']}={e['value']!r}" if e["kind"] == "constant" else f"{e['dtype']}{shape_text(e['shape'])}"


def _grouped(texts) -> list[str]:
    """Runs of identical arguments as `N x TEXT` (an 8B Llama's 64 cache tensors are one item)."""
    out: list[list] = []
    for t in texts:
        if out and out[-1][0] == t:
            out[-1][1] += 1
        else:
            out.append([t, 1])
    return [t if n == 1 else f"{n} x {t}" for t, n in out]


def cmd_targets(args) -> int:
    from llmc.compiler import targets

    if args.json:
        print(json.dumps(targets.as_json(), indent=2))
        return 0
    usable = None
    for c in targets.TARGETS.values():
        if c.implemented and c.runs_here and c.device != "local":
            if usable is None:
                from llmc.runtime.device import usable_devices

                usable = usable_devices()
            where = "runs here" if c.device in usable else f"no {c.device} driver here; runs"
            state = f"implemented; {where} {c.runs_how}"
        elif c.implemented:
            state = "implemented; " + (f"runs here {c.runs_how}" if c.runs_here else c.runs_how)
        else:
            state = "planned, not implemented yet"
        print(f"{c.name:7s} {c.device}/{c.backend}, arch default {c.default_arch}: {state}")
        for dt, s in c.dtypes.items():
            print(f"          {dt:5s} {s.text()}{'' if s.implemented else '  [planned]'}")
        print("          int8 PT2E programs (.pt2 in Q/DQ form): native, i8 x i8 -> i32 contractions (docs/int8.md)")
        for name, a in c.archs.items():
            feats = [f"fp8 {a.fp8}", f"bf16 math {'yes' if a.bf16 else 'no'}", f"int8 dot {'yes' if a.int8_dot else 'no'}"]
            if not a.int8_storage:
                feats.append("no 8-bit storage (int8/fp8 refused)")
            elif not a.int64:
                feats.append("no int64 (PT2E int8 as f32 math)")
            if a.subgroup_sizes:
                feats.append(f"subgroup {'/'.join(map(str, a.subgroup_sizes))}, {a.shared_memory_kb} KiB shared")
            also = f" = {', '.join(a.aliases)}" if a.aliases else ""
            print(f"          arch {name}{also}: {', '.join(feats)}" + (f" ({a.note})" if a.note else ""))
        if c.notes:
            print(f"          note: {c.notes}")
    return 0


def cmd_diff(args) -> int:
    import os

    reports = [(flag, Path(p)) for flag, p in (("--json", args.json), ("--junit", args.junit)) if p]
    for flag, p in reports:  # checked before any work: a run must not end in "cannot write the report"
        if p.is_dir():
            raise UsageError(f"{flag} {p}: is a folder; name the report file")
        if not p.parent.is_dir():
            raise UsageError(f"{flag} {p}: folder {p.parent} does not exist; create it first")
        if not os.access(p.parent, os.W_OK):
            raise UsageError(f"{flag} {p}: folder {p.parent} is not writable")
    for given in (args.model, args.vmfb):  # before torch is imported: answer fast
        if given is not None and not Path(given).exists():
            raise UsageError(f"{given}: no such file or directory")
    from llmc.compiler import diff, report

    opts = diff.DiffOptions(
        model=Path(args.model),
        artifact=Path(args.vmfb) if args.vmfb else None,
        target=args.target,
        dtype=args.dtype,
        arch=args.arch,
        output=Path(args.output) if args.output else None,
        inputs=Path(args.inputs) if args.inputs else None,
        seed=args.seed,
        seq=args.seq,
        profile=args.tolerance_profile,
        tolerance=args.tolerance,
        logits=tuple(args.logits),
        top_k=args.top_k,
        per_layer=args.per_layer,
        per_layer_depth=args.per_layer_depth,
        repro_dir=Path(args.repro_dir) if args.repro_dir else None,
        verbose=args.verbose,
        steps=args.steps,
    )
    outcome = diff.run(opts)
    for line in outcome.lines:
        print(line)
    if args.json:
        report.write_json(Path(args.json), outcome.report)
    if args.junit:
        report.write_junit(Path(args.junit), outcome.report)
    return 0 if outcome.passed else 1


def cmd_bisect(args) -> int:
    from llmc.compiler import targets

    # Cheap checks first, so bad input fails before torch loads (bisect() checks them again).
    targets.resolve(args.target, args.arch, args.dtype)
    if not Path(args.model).exists():
        raise UsageError(f"{args.model}: no such file or directory")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise UsageError(f"--json {args.json}: directory {Path(args.json).resolve().parent} does not exist")
    from llmc.compiler import bisect, llm

    if Path(args.model).suffix != ".pt2" and llm.is_llama_checkpoint(Path(args.model)):
        results = bisect.bisect_llm(
            Path(args.model), target=args.target, dtype=args.dtype, arch=args.arch, output_dir=args.output,
            seed=args.seed, max_seq_len=args.max_seq_len,
        )
        for r in results:
            print(r.summary())
        if args.json:
            bisect.write_json(results, Path(args.json))
        return max(r.exit_code for r in results)
    if args.max_seq_len is not None:
        raise UsageError(f"--max-seq-len applies to Llama checkpoints; {args.model} is not one")
    result = bisect.bisect(
        Path(args.model),  # bisect validates the path, target, dtype and output folder before any work
        target=args.target,
        dtype=args.dtype,
        arch=args.arch,
        output_dir=args.output,
        seed=args.seed,
    )
    print(result.summary())
    if args.json:
        bisect.write_json(result, Path(args.json))
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
