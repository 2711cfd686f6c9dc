"""llmc-opt: run llmc's passes by name on a .mlir file or a .pt2 archive and print the torch-dialect IR.

    llmc-opt IN.mlir --pass log10-to-log                 # IR passes on torch-dialect MLIR
    llmc-opt IN.pt2 --pass decompose-attention                 # graph passes, then import: prints the MLIR
    llmc-opt IN.pt2 --pipeline --target cpu --dtype bf16 # exactly the passes `llmc compile` would run
    llmc-opt --list                                      # every registered pass and its kind

For a .pt2 the program goes through export (source passes when --dtype differs from the archive's
f32), the graph passes, torch-mlir's import and the IR passes: compiler/lower.lower_module, the same
function `llmc compile` uses, stopping before iree-compile. `--stats` prints each pass's match counts
on stderr. The FileCheck tests in tests/passes/ are built on this tool.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmc-opt", description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("input", nargs="?", help="a .mlir file (torch dialect) or a .pt2 archive")
    p.add_argument("--pass", dest="passes", action="append", default=[], metavar="NAME", help="run this pass (repeatable, in pipeline order)")
    p.add_argument("--pipeline", action="store_true", help="run the passes `llmc compile` runs for --target/--dtype")
    p.add_argument("--target", default="cpu", help="target whose capabilities the passes see (planned targets allowed)")
    p.add_argument("--arch", default=None)
    p.add_argument("--dtype", default="f32")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a pass option (ctx.options; VALUE read as JSON, else as a string), e.g. fixed_row_products=true: "
                        "what `llmc compile` sets for an LLM with a prefill chunk or buckets (repeatable)")
    p.add_argument("--stats", action="store_true", help="print the passes' match counts (JSON) on stderr")
    p.add_argument("--list", action="store_true", help="list the registered passes")
    p.add_argument("-o", "--output", default=None, help="write the IR here instead of stdout")
    return p


def run(args) -> int:
    from llmc.compiler import pipeline, targets
    from llmc.errors import UsageError
    from llmc.passes import REGISTRY

    if args.list:
        for name, cls in sorted(REGISTRY.items()):
            print(f"{name:20s} {cls.kind:6s} {(cls.__doc__ or '').strip().splitlines()[0] if cls.__doc__ else ''}")
        return 0
    if not args.input:
        raise UsageError("give an input file (.mlir or .pt2), or --list")
    path = Path(args.input)
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    if args.passes and args.pipeline:
        raise UsageError("--pass and --pipeline: choose one")
    unknown = [n for n in args.passes if n not in REGISTRY]
    if unknown:
        raise UsageError(f"--pass {unknown[0]}: no such pass; `llmc-opt --list` shows them ({', '.join(sorted(REGISTRY))})")
    options = {}
    for item in args.option:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"--option {item}: give KEY=VALUE (e.g. fixed_row_products=true)")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    target = targets.resolve(args.target, args.arch, args.dtype, allow_planned=True)
    plan = pipeline.build(target, options, only=None if args.pipeline else args.passes)
    if path.suffix == ".mlir":
        wrong = [] if args.pipeline else plan.source + plan.graph
        if wrong:
            raise UsageError(f"--pass {wrong[0].name}: a {wrong[0].kind} pass runs on a .pt2, not on MLIR")
        plan.source, plan.graph = [], []  # --pipeline on MLIR: its IR passes only
        text = _run_mlir(path, plan)
    elif path.suffix == ".pt2":
        text = _run_pt2(path, plan, target)
    else:
        raise UsageError(f"{path}: expected a .mlir or .pt2 file")
    if args.stats:
        print(json.dumps({"passes": plan.stats(), "skipped": plan.skipped}, indent=1), file=sys.stderr)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _run_mlir(path: Path, plan) -> str:
    from torch_mlir import ir
    from torch_mlir.dialects import torch as torch_d

    from llmc.compiler import pipeline
    from llmc.errors import UsageError

    ctx = ir.Context()
    torch_d.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True  # util.global, torch_c, stream attributes from the importer
    try:
        module = ir.Module.parse(path.read_text(), ctx)
    except Exception as e:
        raise UsageError(f"{path}: not parseable MLIR: {str(e).strip().splitlines()[0]}") from None
    pipeline.run_ir(plan, module)
    return str(module)


def _run_pt2(path: Path, plan, target) -> str:
    from llmc.compiler import export, lower

    entry = lower.export_main(export.load_pt2(path), plan)
    return lower.lower_module([entry], target, plan=plan).mlir


def main(argv=None) -> int:
    from llmc.errors import LlmcError

    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except LlmcError as e:
        print(f"llmc-opt: error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
