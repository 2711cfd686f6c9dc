"""`llmc` command line: argparse and validation only, then the API (compiler/api.py, runtime/).

Exit codes (DESIGN.md): 0 ok; 1 a check failed; 2 bad usage or bad input; 3 compiler or runtime
failure (with a reproducer written). Errors print as one `llmc: error: ...` line without a traceback
unless --debug is given.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from pathlib import Path

from llmc.errors import LlmcError, UsageError


class _Parser(argparse.ArgumentParser):
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
    p.add_argument("--arch", default=None, help="target architecture (cpu: an LLVM CPU name or 'host', the default)")
    p.add_argument("--dtype", default="f32", help=f"weight and compute dtype: {', '.join(DTYPES)} (default f32)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="llmc", description="Compile PyTorch models to IREE modules and check them against eager PyTorch.")
    _add_common(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    c = sub.add_parser("compile", help="compile a model (.pt2) to NAME.vmfb + NAME.irpa + NAME.json")
    c.add_argument("model", help="a torch.export archive (.pt2)")
    _add_target_options(c)
    c.add_argument("-o", "--output", default=None, help="output .vmfb path (default ./MODEL_STEM.vmfb)")
    c.add_argument("--dump-ir", default=None, metavar="DIR", help="write the IR after import and after each pass")
    c.add_argument("--repro-dir", default=None, metavar="DIR", help="where to save reproducers on failure (default: the output folder)")
    c.add_argument("--iree-flag", action="append", default=[], metavar="FLAG", help="extra iree-compile flag, repeatable (e.g. --iree-flag=--iree-opt-level=O3)")
    c.add_argument("--json", action="store_true", help="print the artifact paths and manifest summary as JSON")
    _add_common(c)

    i = sub.add_parser("info", help="show a compiled module's manifest: target, entry points, passes")
    i.add_argument("vmfb")
    i.add_argument("--json", action="store_true", help="print the whole manifest")
    _add_common(i)

    t = sub.add_parser("targets", help="list targets, archs and dtype support (native / emulated / planned)")
    t.add_argument("--json", action="store_true")
    _add_common(t)

    d = sub.add_parser("diff", help="run a compiled module and eager PyTorch on the same inputs and compare")
    d.add_argument("model", help="the model the artifact was compiled from (.pt2)")
    d.add_argument("vmfb", help="the compiled module")
    d.add_argument("--seed", type=int, default=0, help="seed for the random inputs (default 0)")
    d.add_argument("--seq", type=int, default=None, help="size for dynamic dimensions (default 17, clamped to range)")
    d.add_argument("--tolerance-profile", default="auto", help="f32, f16, bf16 or auto (the artifact's dtype)")
    d.add_argument("--json", default=None, metavar="REPORT.json", help="write the comparison as JSON")
    _add_common(d)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="llmc: %(message)s")
    try:
        return {"compile": cmd_compile, "info": cmd_info, "targets": cmd_targets, "diff": cmd_diff}[args.command](args)
    except LlmcError as e:
        if args.debug:
            traceback.print_exc()
        msg = str(e)
        print(f"llmc: error: {msg}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("llmc: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug in llmc or an unexpected upstream failure
        if args.debug:
            traceback.print_exc()
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"llmc: internal error: {type(e).__name__}: {first} (rerun with --debug for the traceback)", file=sys.stderr)
        return 3


def cmd_compile(args) -> int:
    from llmc.compiler.api import compile_model

    art = compile_model(
        Path(args.model),  # compile_model validates the path, target and output before any work
        target=args.target,
        dtype=args.dtype,
        arch=args.arch,
        output=args.output,
        dump_ir=args.dump_ir,
        repro_dir=args.repro_dir,
        extra_iree_flags=tuple(args.iree_flag),
        quiet=False,
    )
    manifest = art.read_manifest()
    if args.json:
        print(json.dumps({"vmfb": str(art.vmfb), "params": str(art.params) if art.params else None, "manifest": str(art.manifest), "compile": manifest["compile"]}, indent=2))
    else:
        size = art.vmfb.stat().st_size
        params = f", {art.params} ({art.params.stat().st_size / 1e6:.1f} MB)" if art.params else ""
        print(f"wrote {art.vmfb} ({size / 1e3:.0f} KB){params}, {art.manifest}")
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
    from llmc.runtime.module import _shape_text

    t = m["target"]
    print(f"module:   {vmfb}")
    print(f"target:   {t['name']} ({t['backend']}, arch {t['arch']}{' = ' + t['cpu'] if t.get('cpu') else ''}), dtype {m['dtype']}")
    print(f"built by: llmc {m['versions']['llmc']}, torch {m['versions']['torch']}, iree {m['versions']['iree-base-compiler']}")
    if m.get("params"):
        p = m["params"]
        print(f"params:   {p['file']} ({p['count']} tensors, {p['bytes'] / 1e6:.1f} MB, scope '{p['scope']}')")
    for name, ep in m["entry_points"].items():
        ins = ", ".join(
            f"{e['path']}={e['value']!r}" if e["kind"] == "constant" else f"{e['dtype']}{_shape_text(e['shape'])}"
            for e in ep["inputs"]
        )
        print(f"entry:    {name}({ins})")
    ran = ", ".join(f"{p['name']} (rewrote {p['rewrote']})" for p in m["passes"]) or "none"
    print(f"passes:   {ran}")
    print(f"flags:    {' '.join(m['iree_flags'])}")
    return 0


def cmd_targets(args) -> int:
    from llmc.compiler.targets import TARGETS

    if args.json:
        print(json.dumps({n: {k: v for k, v in vars(c).items()} for n, c in TARGETS.items()}, indent=2))
        return 0
    for c in TARGETS.values():
        state = "" if c.implemented else "  [planned]"
        print(f"{c.name:7s} {c.device}/{c.backend}, arch default {c.default_arch}, runs here: {c.runs_here}{state}")
        for dt, mode in c.dtype_support.items():
            print(f"          {dt:5s} {mode}")
        if c.notes:
            print(f"          note: {c.notes}")
    return 0


def cmd_diff(args) -> int:
    from llmc.compiler import diff, export
    from llmc.runtime import load

    model, vmfb = Path(args.model), Path(args.vmfb)
    for p in (model, vmfb):
        if not p.exists():
            raise UsageError(f"{p}: no such file")
    mod = load(vmfb)
    dtype = mod.manifest["dtype"]
    profile = dtype if args.tolerance_profile == "auto" else args.tolerance_profile
    if profile not in diff.TOLERANCES:
        raise UsageError(f"--tolerance-profile={profile}: choose one of auto, {', '.join(diff.TOLERANCES)}")
    ep = export.load_pt2(model)
    entry = mod.manifest["entry_points"][mod.default_entry]
    inputs, kwargs = diff.random_inputs(entry, args.seed, diff.int_high(ep), args.seq)
    import torch

    with torch.no_grad():
        ref = diff.eager_reference(ep, dtype)(*inputs, **kwargs)
    got = mod(*inputs, **kwargs)
    results = diff.diff_outputs(entry["outputs"], got, ref, dtype, diff.TOLERANCES[profile])
    passed = all(r.passed for r in results)
    for r in results:
        status = "ok  " if r.passed else "FAIL"
        print(f"{status} {r.name} {r.shape}: max_abs {r.max_abs:.3g}, max_rel {r.max_rel:.3g}, cosine {r.cosine:.7f}{'  (' + r.reason + ')' if r.reason else ''}")
    worst = max(results, key=lambda r: r.max_rel) if results else None
    print(f"{'PASS' if passed else 'FAIL'}: {len(results)} output(s), tolerance profile {profile}" + (f", worst {worst.name}" if worst else ""))
    if args.json:
        report = {"passed": passed, "profile": profile, "tolerance": diff.TOLERANCES[profile], "seed": args.seed, "outputs": [r.as_dict() for r in results]}
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
