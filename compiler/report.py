"""`llmc diff` reports: the JSON report (format "llmc-diff-report/1", schema below) and JUnit XML,
and DiffOutcome, what one diff run hands the CLI (the report and the lines to print).

The JUnit writer also makes the files of the CI stage's cells that llmc diff did not run on
(`python -m llmc.compiler.report ci-junit ...`, called by tools/ci/llmc-ci.sh), so every JUnit file
llmc leaves has one shape. Reports are written atomically (a temp file beside the target, then a
rename), so a CI job never reads a half-written report. The JSON schema is the contract for tools
that read reports; tests validate real reports against it with the `jsonschema` package.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from llmc.compiler import artifacts

REPORT_FORMAT = "llmc-diff-report/1"

_NUMBER_OR_NULL = {"type": ["number", "null"]}
_MEASURE = "null when not finite (shape mismatch, non-finite values that differ)"

_TOLERANCE_SCHEMA = {
    "type": "object",
    "description": "The limits applied: the dtype's profile from llmc.compiler.diff_metrics.TOLERANCES with --tolerance overrides.",
    "properties": {
        "max_rel": {"type": "number", "description": "max |compiled - eager| / max |eager| must not exceed this"},
        "min_cosine": {"type": "number", "description": "cosine similarity of the flattened outputs must be at least this"},
        "min_top1": {"type": "number", "description": "logits only: fraction of rows whose argmax agrees must be at least this"},
        "max_kl": {"type": "number", "description": "logits only: KL(eager || compiled) over the last dim, mean over rows, must not exceed this"},
    },
    "required": ["max_rel", "min_cosine", "min_top1", "max_kl"],
    "additionalProperties": False,
}

_COMPARISON_PROPERTIES = {
    "shape": {"type": "array", "items": {"type": "integer"}, "description": "the eager output's shape"},
    "dtype": {"type": "string", "description": "the eager output's dtype (torch name: float32, bfloat16, int64, ...)"},
    "max_abs": {**_NUMBER_OR_NULL, "description": f"max |compiled - eager|; {_MEASURE}"},
    "max_rel": {**_NUMBER_OR_NULL, "description": f"max |compiled - eager| / max |eager|; {_MEASURE}"},
    "cosine": {"type": "number", "description": "cosine similarity of compiled and eager, flattened"},
    "passed": {"type": "boolean", "description": "every check within tolerance"},
    "reason": {"type": "string", "description": "why the output failed (the checks over their limits, '; '-separated); empty when passed"},
}

_OUTPUT_SCHEMA = {
    "type": "object",
    "description": "One output of the entry point compared with eager PyTorch.",
    "properties": {
        "name": {"type": "string", "description": "the output's path in the result: out, out[0], out['logits']"},
        **_COMPARISON_PROPERTIES,
        "severity": {
            **_NUMBER_OR_NULL,
            "description": "how close the output is to its limits: max over the checks of measured / limit "
            "(1.0 = at the limit, above 1 = failed); the worst output has the highest; " + _MEASURE,
        },
        "logits": {
            "description": "logits checks (an output with role 'logits' in the manifest or named with --logits); null otherwise",
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "properties": {
                        "top1": {"type": "number", "minimum": 0, "maximum": 1, "description": "fraction of rows (all dims but the last) whose argmax agrees"},
                        "topk": {"type": "number", "minimum": 0, "maximum": 1, "description": "mean over rows of |top-k(eager) & top-k(compiled)| / k"},
                        "k": {"type": "integer", "minimum": 1, "description": "k of the top-k agreement (--top-k)"},
                        "kl": {**_NUMBER_OR_NULL, "description": f"KL(eager || compiled) over the last dim, mean over rows; {_MEASURE}"},
                        "rows": {"type": "integer", "minimum": 0, "description": "number of rows compared"},
                    },
                    "required": ["top1", "topk", "k", "kl", "rows"],
                    "additionalProperties": False,
                },
            ],
        },
    },
    "required": ["name", "shape", "dtype", "max_abs", "max_rel", "cosine", "passed", "reason", "severity", "logits"],
    "additionalProperties": False,
}

_MODULE_SCHEMA = {
    "type": "object",
    "description": "One module's output (per-layer localisation), compiled with the artifact's weights vs eager.",
    "properties": {
        "module": {"type": "string", "description": "the module's path in the model, e.g. layers.3.self_attn (#N: its N-th call)"},
        "type": {"type": "string", "description": "the module's class"},
        "level": {"type": "integer", "minimum": 1, "description": "nesting depth below the model (1 = called by the model's forward)"},
        "node": {"type": "string", "description": "the exported graph node holding the module's output"},
        "source": {"type": ["string", "null"], "description": "file:line of the innermost user-code frame that produced the output"},
        "code": {"type": ["string", "null"], "description": "that source line"},
        **_COMPARISON_PROPERTIES,
    },
    "required": ["module", "type", "level", "node", "source", "code", *_COMPARISON_PROPERTIES],
    "additionalProperties": False,
}

_ENTRY_SCHEMA = {
    "type": "object",
    "description": "One entry point of the artifact (a JUnit testsuite).",
    "properties": {
        "name": {"type": "string", "description": "the entry point's name in the manifest"},
        "passed": {"type": "boolean", "description": "every output within tolerance"},
        "outputs": {"type": "array", "items": _OUTPUT_SCHEMA, "description": "one record per tensor output (a JUnit testcase each)"},
        "worst": {"type": ["string", "null"], "description": "name of the output with the highest severity"},
        "seconds": {"type": "number", "description": "wall time for the eager and compiled runs"},
        "per_layer": {
            "description": "per-layer localisation (--per-layer); null when not asked for",
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "properties": {
                        "depth": {"type": ["integer", "null"], "minimum": 1, "description": "--per-layer-depth; null = every module at any depth"},
                        "params": {"type": ["string", "null"], "description": "the parameter archive the instrumented module ran with (the artifact's own)"},
                        "compile_seconds": {"type": "number", "description": "time to build the instrumented module"},
                        "modules": {"type": "array", "items": _MODULE_SCHEMA, "description": "every probed module output, in topological order"},
                        "first_divergence": {
                            "description": "the first module (topological order) over tolerance; null when none is",
                            "oneOf": [{"type": "null"}, _MODULE_SCHEMA],
                        },
                    },
                    "required": ["depth", "params", "compile_seconds", "modules", "first_divergence"],
                    "additionalProperties": False,
                },
            ],
        },
    },
    "required": ["name", "passed", "outputs", "worst", "seconds", "per_layer"],
    "additionalProperties": False,
}

REPORT_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://llmc.invalid/schemas/llmc-diff-report-1.json",
    "title": "llmc diff report",
    "description": "What `llmc diff --json` writes: a compiled module's outputs compared with eager PyTorch on the same inputs.",
    "type": "object",
    "properties": {
        "format": {"const": REPORT_FORMAT, "description": "report format and version; readers check it before anything else"},
        "passed": {"type": "boolean", "description": "every output of every entry point within tolerance (exit code 0; else 1)"},
        "summary": {"type": "string", "description": "the one-line verdict llmc printed last"},
        "model": {"type": "string", "description": "the eager model (.pt2) compared against"},
        "artifact": {"type": "string", "description": "the compiled module (.vmfb); a temporary path when diff compiled it first"},
        "compiled_by_diff": {"type": "boolean", "description": "true when llmc diff compiled MODEL itself (no artifact given)"},
        "target": {"type": "string", "description": "the artifact's llmc target (cpu, vulkan, ...)"},
        "arch": {"type": ["string", "null"], "description": "the artifact's arch as named at compile time"},
        "dtype": {"type": "string", "description": "the artifact's weight and compute dtype; eager runs in it too"},
        "profile": {"type": "string", "description": "the tolerance profile used (a key of llmc.compiler.diff_metrics.TOLERANCES)"},
        "tolerance": _TOLERANCE_SCHEMA,
        "tolerance_overrides": {
            "type": "object",
            "additionalProperties": {"type": "number"},
            "description": "the --tolerance KEY=VALUE overrides applied over the profile",
        },
        "inputs": {
            "type": "object",
            "description": "where the inputs came from",
            "properties": {
                "source": {"enum": ["random", "file"], "description": "random: seeded from the signature; file: --inputs"},
                "seed": {"type": ["integer", "null"], "description": "the seed (random inputs), else null"},
                "file": {"type": ["string", "null"], "description": "the .npz file (--inputs), else null"},
            },
            "required": ["source", "seed", "file"],
            "additionalProperties": False,
        },
        "entry_points": {
            "type": "array", "minItems": 1, "items": _ENTRY_SCHEMA,
            "description": "one record per entry point compared; for fp8 and int8 artifacts also one per entry point against eager "
            "with the same quantized weights (named '<entry> vs same fp8 weights' / '... int8 weights', judged by `same_weights`)",
        },
        "same_weights": {
            "description": "fp8 and int8 artifacts: the second reference, eager PyTorch with each weight the artifact stores quantized "
            "replaced by its dequantized value decode(q) * s, in the compute dtype; null (or absent) otherwise",
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "properties": {
                        "profile": {"type": "string", "description": "the compute dtype's tolerance profile"},
                        "tolerance": _TOLERANCE_SCHEMA,
                        "weights": {"type": "integer", "minimum": 0, "description": "number of weights dequantized on the eager side"},
                    },
                    "required": ["profile", "tolerance", "weights"],
                    "additionalProperties": False,
                },
            ],
        },
        "worst": {
            "description": "the worst output over all entry points; null when there are no outputs",
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "properties": {
                        "entry_point": {"type": "string"},
                        "output": {"type": "string"},
                        "passed": {"type": "boolean"},
                        "reason": {"type": "string"},
                    },
                    "required": ["entry_point", "output", "passed", "reason"],
                    "additionalProperties": False,
                },
            ],
        },
        "versions": {"type": "object", "additionalProperties": {"type": ["string", "null"]}, "description": "llmc and torch versions that ran the diff"},
    },
    "required": [
        "format", "passed", "summary", "model", "artifact", "compiled_by_diff", "target", "arch", "dtype",
        "profile", "tolerance", "tolerance_overrides", "inputs", "entry_points", "worst", "versions",
    ],
    "additionalProperties": False,
}


def _finite(x):
    """JSON has no inf/nan: non-finite measurements are written as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def entry_record(name: str, outputs: list, worst, seconds: float, per_layer=None) -> dict:
    """The report record of one entry point: `outputs` are diff_metrics.OutputDiff, `per_layer` a PerLayerResult."""
    pl = None
    if per_layer is not None:
        pl = {
            "depth": per_layer.depth,
            "params": per_layer.params,
            "compile_seconds": round(per_layer.compile_seconds, 3),
            "modules": [m.as_dict() for m in per_layer.modules],
            "first_divergence": per_layer.first.as_dict() if per_layer.first else None,
        }
    return _finite(
        {
            "name": name,
            "passed": all(o.passed for o in outputs),
            "outputs": [o.as_dict() for o in outputs],
            "worst": worst.name if worst is not None else None,
            "seconds": round(seconds, 3),
            "per_layer": pl,
        }
    )


@dataclasses.dataclass
class DiffOutcome:
    """What one `llmc diff` run (compiler/diff.py, compiler/diff_llm.py) hands the CLI."""

    passed: bool
    report: dict  # format llmc-diff-report/1 (build_report)
    lines: list[str]  # what the CLI prints, the verdict last


@dataclasses.dataclass
class SameWeights:
    """The second reference of an fp8 or int8 diff (eager with the same quantized weights): its
    comparisons, and what llmc diff prints and reports of them. Shared by the .pt2 and the checkpoint
    diffs."""

    results: list  # diff_metrics.OutputDiff
    profile: str  # the compute dtype's tolerance profile
    tolerance: dict
    weights: int  # how many weights were dequantized on the eager side
    seconds: float
    label: str = "fp8"  # the artifact's --dtype, as the lines name the weights

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def worst(self):
        from llmc.compiler.diff_metrics import worst

        return worst(self.results)

    def line(self) -> str:
        bad = self.worst()
        head = f"vs eager with the same {self.label} weights ({self.weights} dequantized in PyTorch, profile {self.profile}): "
        return head + (f"PASS, worst {bad.name} cosine {bad.cosine:.6f}" if self.passed else f"FAIL, worst {bad.name}: {bad.reason}")

    def summary(self, primary_summary: str, primary_passed: bool) -> str:
        """The verdict line: the primary one, extended when both pass; this one's failure when only it failed."""
        if not primary_passed:
            return primary_summary
        if self.passed:
            return primary_summary + f"; and vs the same {self.label} weights ({self.weights} dequantized in PyTorch), profile {self.profile}"
        bad = self.worst()
        return f"FAIL: vs eager with the same {self.label} weights (profile {self.profile}), worst {bad.name}: {bad.reason}"

    def entry(self, entry_name: str) -> dict:
        return entry_record(f"{entry_name} vs same {self.label} weights", self.results, self.worst(), self.seconds, None)

    def record(self) -> dict:
        return {"profile": self.profile, "tolerance": dict(self.tolerance), "weights": self.weights}


def build_report(*, summary: str, model: str, artifact: str, compiled_by_diff: bool, manifest: dict, profile: str,
                 tolerance: dict, overrides: dict, inputs: dict, entries: list[dict], same_weights: dict | None = None) -> dict:
    import torch

    import llmc

    worst = None
    candidates = [(e["name"], o) for e in entries for o in e["outputs"]]
    if candidates:
        sev = lambda o: math.inf if o["severity"] is None else o["severity"]
        name, o = max(candidates, key=lambda c: (not c[1]["passed"], sev(c[1])))
        worst = {"entry_point": name, "output": o["name"], "passed": o["passed"], "reason": o["reason"]}
    return _finite(
        {
            "format": REPORT_FORMAT,
            "passed": all(e["passed"] for e in entries),
            "summary": summary,
            "model": model,
            "artifact": artifact,
            "compiled_by_diff": compiled_by_diff,
            "target": manifest["target"]["name"],
            "arch": manifest["target"].get("arch"),
            "dtype": manifest["dtype"],
            "profile": profile,
            "tolerance": dict(tolerance),
            "tolerance_overrides": dict(overrides),
            "inputs": inputs,
            "entry_points": entries,
            "same_weights": same_weights,
            "worst": worst,
            "versions": {"llmc": llmc.__version__, "torch": torch.__version__},
        }
    )


def write_json(path: Path, report: dict) -> None:
    artifacts.write_text_atomic(Path(path), json.dumps(report, indent=2, allow_nan=False) + "\n")


def _fmt(x) -> str:
    return "inf" if x is None else f"{x:.4g}"


# ---------------------------------------------------------------------------------------------
# JUnit XML: one writer for `llmc diff --junit` and the CI stage's cells that diff did not run on
# (tools/ci/llmc-ci.sh), so CI systems read one shape of file.


@dataclasses.dataclass
class JUnitCase:
    classname: str
    name: str
    failure: str | None = None  # the failure's message; None: not failed
    failure_type: str | None = None
    detail: str | None = None  # the failure's text
    skipped: str | None = None  # why it was skipped; None: not skipped
    out: str | None = None  # system-out


@dataclasses.dataclass
class JUnitSuite:
    name: str
    cases: list[JUnitCase]
    properties: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    seconds: float | None = None  # None: not timed (no time attribute)


def junit_document(name: str, suites: list[JUnitSuite], seconds: float | None = None) -> str:
    """The JUnit XML text: a testsuites element holding `suites`, with the counts filled in."""
    cases = [c for s in suites for c in s.cases]
    totals = {
        "tests": str(len(cases)),
        "failures": str(sum(c.failure is not None for c in cases)),
        "errors": "0",
    }
    n_skipped = sum(c.skipped is not None for c in cases)
    if n_skipped:  # diff reports never skip, and their root has never carried the attribute
        totals["skipped"] = str(n_skipped)
    if seconds is not None:
        totals["time"] = f"{seconds:.3f}"
    root = ET.Element("testsuites", name=name, **totals)
    for s in suites:
        counts = {
            "tests": str(len(s.cases)),
            "failures": str(sum(c.failure is not None for c in s.cases)),
            "errors": "0",
            "skipped": str(sum(c.skipped is not None for c in s.cases)),
        }
        if s.seconds is not None:
            counts["time"] = f"{s.seconds:.3f}"
        suite = ET.SubElement(root, "testsuite", name=s.name, **counts)
        props = ET.SubElement(suite, "properties")
        for key, value in s.properties:
            ET.SubElement(props, "property", name=key, value=str(value))
        for c in s.cases:
            case = ET.SubElement(suite, "testcase", classname=c.classname, name=c.name, time="0")
            if c.failure is not None:
                failure = ET.SubElement(case, "failure", message=c.failure)
                if c.failure_type:
                    failure.set("type", c.failure_type)
                failure.text = c.detail
            if c.skipped is not None:
                ET.SubElement(case, "skipped", message=c.skipped)
            if c.out is not None:
                ET.SubElement(case, "system-out").text = c.out
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def junit_xml(report: dict) -> str:
    """JUnit XML: one testsuite per entry point, one testcase per output; failures carry the reason."""
    suites = []
    for e in report["entry_points"]:
        pl = e.get("per_layer")
        first = pl["first_divergence"] if pl else None
        properties = [
            ("model", report["model"]), ("artifact", report["artifact"]), ("target", report["target"]),
            ("dtype", report["dtype"]), ("profile", report["profile"]),
            ("tolerance", ",".join(f"{k}={v:g}" for k, v in report["tolerance"].items())),
            *((("first_divergence", f"{first['module']} at {first['source']}" if first else "none"),) if pl else ()),
        ]
        cases = []
        for o in e["outputs"]:
            text = f"shape {o['shape']} {o['dtype']}: max_abs {_fmt(o['max_abs'])}, max_rel {_fmt(o['max_rel'])}, cosine {o['cosine']:.7f}"
            if o["logits"]:
                lg = o["logits"]
                text += f"; top-1 {lg['top1']:.4f}, top-{lg['k']} {lg['topk']:.4f}, KL {_fmt(lg['kl'])}"
            case = JUnitCase(f"llmc.diff.{e['name']}", o["name"], out=text)
            if not o["passed"]:
                detail = text
                if first is not None:
                    detail += f"\nfirst divergent module: {first['module']} ({first['reason']}) at {first['source']}"
                case.failure, case.failure_type, case.detail = o["reason"], "ToleranceExceeded", detail
            cases.append(case)
        suites.append(JUnitSuite(e["name"], cases, properties, e["seconds"]))
    return junit_document("llmc diff", suites, sum(e["seconds"] for e in report["entry_points"]))


def write_junit(path: Path, report: dict) -> None:
    artifacts.write_text_atomic(Path(path), junit_xml(report))


def ci_cell_junit(cell: str, target: str, dtype: str, steps) -> str:
    """JUnit XML for a cell of tools/ci/llmc-ci.sh that llmc diff did not report on: one testcase per
    step (compile, diff), each (step, status, message) with status "ok", "skipped" (message: why) or
    anything else for a failure (message: the error)."""
    cases = []
    for step, status, message in steps:
        case = JUnitCase(f"llmc.ci.{cell}", step)
        if status == "skipped":
            case.skipped = message
        elif status != "ok":
            case.failure = message
        cases.append(case)
    return junit_document("llmc ci", [JUnitSuite(cell, cases, [("target", target), ("dtype", dtype)])])


_USAGE = "usage: python -m llmc.compiler.report ci-junit FILE CELL TARGET DTYPE [STEP STATUS MESSAGE]..."


def main(argv: list[str]) -> int:
    """`ci-junit`: write ci_cell_junit's file (how tools/ci/llmc-ci.sh writes its JUnit)."""
    if len(argv) < 5 or argv[0] != "ci-junit" or (len(argv) - 5) % 3:
        print(_USAGE, file=sys.stderr)
        return 2
    _, file, cell, target, dtype, *rest = argv
    steps = [tuple(rest[i : i + 3]) for i in range(0, len(rest), 3)]
    artifacts.write_text_atomic(Path(file), ci_cell_junit(cell, target, dtype, steps))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
