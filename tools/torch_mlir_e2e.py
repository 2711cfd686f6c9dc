"""Run torch-mlir's end-to-end test suite through llmc.compile + llmc.load and classify the failures.

    python tools/torch_mlir_e2e.py SUITE_DIR [--filter REGEX] [--limit N --seed S] [--timeout 180]
                                   [--workers 2] [--json out.json] [--markdown out.md] [--keep DIR] [--list]

SUITE_DIR is torch-mlir's `torch_mlir_e2e_test` package (not vendored here, and not in the torch-mlir
wheel), given as any of: the package folder itself, the folder that holds it (torch-mlir's
projects/pt1/python), or a torch-mlir checkout. To get it:

    git --git-dir=TORCH_MLIR.git archive HEAD projects/pt1/python/torch_mlir_e2e_test | tar -x -C /tmp/tm
    python tools/torch_mlir_e2e.py /tmp/tm/projects/pt1/python --limit 200 --seed 0 --json /tmp/e2e.json

The package is loaded from that folder under its own name; the folder is not put on sys.path, so a
checkout's torch_mlir sources never shadow the installed torch-mlir. Two imports of the suite that this
environment lacks are stubbed when missing: `multiprocess` (framework.py imports it for its own
runner, which is not used here) and `torch_mlir._version` (test_suite/__init__.py imports it for its
xfail lists). Each module that test_suite.register_all_tests() imports is imported on its own; one
that fails (torchvision missing, say) still keeps the tests it registered before the failure, and the
rest (its `@register_test_case` functions, found by reading the file) come out as `import-failed`.

Each test runs in a process of its own (a crash or a hang takes only that test), `--workers` at a
time, killed with everything it started after `--timeout` seconds. The processes are forked from one
server that imported torch, torch.export and llmc once (multiprocessing's forkserver with a preload
list: those imports alone take ~10 s on a busy 2-core machine). In a test's process:
  1. build: torch.manual_seed(0); module = the test's factory; its invoker is run on a recorder (like
     the suite's own golden-trace _Tracer) with the suite's TestUtils: every call, its inputs (cloned
     before the call) and its eager output are the reference.
  2. export: torch.export.export of a fresh module (same seed) on the first call's inputs, made as
     llmc makes it (model.eval(), torch.no_grad(), strict=False). Each -1 in the test's annotate_args
     becomes Dim.AUTO: dynamic where the program allows it, silently static where it does not (a dim
     the program fixes, or an example size of 0 or 1), so the annotations never turn an exportable
     program into an export error. Tests whose annotations are all static export static.
  3. compile: llmc.compile(module, args, dtype="f32", target="cpu", dynamic_shapes=that spec).
  4. run: llmc.load(threads=1), every recorded call replayed with its recorded inputs.
  5. compare each output with eager as torch-mlir's e2e framework does (reporting.py): same type and
     structure (a 1-tuple counts as its element), tensors of equal shape and dtype and
     torch.allclose(rtol=1e-3, atol=1e-7, equal_nan=True) (bool and integer tensors: equal),
     Python floats within a relative 1e-4, ints and strings equal.
A test that calls forward several times is exported once, from its first call, and every call is
replayed; a later call the compiled signature cannot take (another shape in a dim exported static,
another Python value folded as a constant) makes the test `harness`. llmc.compile exports
model.eval(), the test's eager reference runs in the module's own mode: when a mismatch goes away
against eager in eval mode, its message says so.

Classes (`exportable` = reached step 3; the pass rate is pass / exportable):
  pass                the outputs match eager
  import-failed       the test's module of the suite could not be imported here
  harness             the test could not be run as one: its eager run failed, it made no call or
                      called something other than forward, or a later call does not fit (above)
  export-failed       torch.export itself cannot export the module (not exportable)
  llmc-error          llmc raised an llmc.errors.LlmcError: a clear refusal, or iree-compile
                      failing with diagnostics (grouped by the first error line)
  iree-compile-crash  iree-compile killed by a signal, or an assertion / LLVM ERROR / stack dump
  internal-error      any other exception from inside llmc.compile or llmc.load (a bug), or the
                      test's process died while compiling
  runtime-error       IREE failed while running the module (RuntimeCallError, or the process died)
  mismatch            an output differs from eager beyond the tolerances above
  timeout             the test ran past --timeout (its message names the step it was in)

Writes --json (every test: class, message, grouping key, step, seconds) and prints a summary grouped
by class with the most common messages (numbers and paths normalised) and example tests; --markdown
writes the same summary as Markdown. Progress goes to stderr, one line per finished test. Exit
status: 0 when the run completed (whatever the results), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import ast
import collections
import concurrent.futures
import datetime
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

PACKAGE = "torch_mlir_e2e_test"
CLASSES = ("pass", "import-failed", "harness", "export-failed", "llmc-error", "iree-compile-crash",
           "internal-error", "runtime-error", "mismatch", "timeout")
FAILING = CLASSES[1:]
EXPORTED_STEPS = ("compile", "run", "compare")  # a test that got this far is exportable
# torch-mlir's e2e tolerances (projects/pt1/python/torch_mlir_e2e_test/reporting.py, ValueReport).
RTOL, ATOL, FLOAT_RTOL = 1e-3, 1e-7, 1e-4
# iree-compile's own crash reports (LLVM's signal handler, assertions, report_fatal_error).
CRASH_MARKERS = ("Stack dump:", "LLVM ERROR:", "Assertion `", "UNREACHABLE executed", "PLEASE submit a bug report",
                 "Please report issues to")


class ArgError(Exception):
    """A bad command line: printed as one line, exit 2."""


# ---------------------------------------------------------------------------------------------------
# The suite: where it is, how it is imported, which tests it holds


def find_suite(path: Path) -> Path:
    """The `torch_mlir_e2e_test` package folder for SUITE_DIR (the package, its parent, or a checkout)."""
    if not path.exists():
        raise ArgError(f"{path}: no such folder")
    if not path.is_dir():
        raise ArgError(f"{path}: not a folder (give the folder holding torch-mlir's {PACKAGE} package)")
    for pkg in (path, path / PACKAGE, path / "projects" / "pt1" / "python" / PACKAGE):
        if pkg.name == PACKAGE and all((pkg / f).is_file() for f in ("__init__.py", "registry.py", "framework.py")) \
                and (pkg / "test_suite" / "__init__.py").is_file():
            return pkg.resolve()
    raise ArgError(f"{path}: no {PACKAGE} package (registry.py, framework.py, test_suite/) there, in it "
                   f"or in its projects/pt1/python; extract it from torch-mlir, e.g. git archive HEAD "
                   f"projects/pt1/python/{PACKAGE} | tar -x -C DIR")


def import_package(pkg: Path):
    """Import the suite's package from `pkg` under its own name (without putting its folder on sys.path)."""
    import importlib.util
    import types

    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    try:
        import multiprocess  # noqa: F401  (framework.py imports it at the top)
    except ImportError:
        import multiprocessing

        stub = types.ModuleType("multiprocess")
        stub.set_start_method = lambda *a, **k: None
        stub.cpu_count, stub.Pool = multiprocessing.cpu_count, multiprocessing.Pool
        sys.modules["multiprocess"] = stub
    try:
        import torch_mlir._version  # noqa: F401  (test_suite/__init__.py imports it)
    except ImportError:
        import torch
        from packaging import version

        stub = types.ModuleType("torch_mlir._version")
        stub.version = version
        stub.torch_version_for_comparison = lambda: version.parse(torch.__version__.split("+", 1)[0])
        sys.modules["torch_mlir._version"] = stub
    spec = importlib.util.spec_from_file_location(PACKAGE, pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)
    return module


def suite_modules(pkg: Path) -> list[str]:
    """The test_suite modules register_all_tests() imports (every test_suite/*.py if it can't be read)."""
    init = pkg / "test_suite" / "__init__.py"
    names = []
    for node in ast.walk(ast.parse(init.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == "register_all_tests":
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom) and sub.level == 1 and sub.module is None:
                    names += [a.name for a in sub.names]
    return names or sorted(p.stem for p in (pkg / "test_suite").glob("*.py") if p.stem != "__init__")


def declared_tests(source: Path) -> list[str]:
    """Names of the functions decorated with register_test_case(...) in a suite file, read without importing it."""
    names = []
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                f = d.func if isinstance(d, ast.Call) else d
                if (isinstance(f, ast.Name) and f.id == "register_test_case") or \
                        (isinstance(f, ast.Attribute) and f.attr == "register_test_case"):
                    names.append(node.name)
    return names


def import_suite_module(module: str) -> None:
    import importlib

    importlib.import_module(f"{PACKAGE}.test_suite.{module}")


def list_tests(pkg: Path) -> dict:
    """Import the suite module by module: {"tests": [{name, module}], "import_failures": [...]}."""
    import warnings

    warnings.simplefilter("ignore")
    import_package(pkg)
    import importlib

    registry = importlib.import_module(f"{PACKAGE}.registry")
    importlib.import_module(f"{PACKAGE}.test_suite")
    tests, failures = [], []
    for module in suite_modules(pkg):
        before = len(registry.GLOBAL_TEST_REGISTRY)
        try:
            import_suite_module(module)
            error = None
        except BaseException as e:  # noqa: BLE001  (a suite module may fail in any way, even SystemExit)
            error = f"{type(e).__name__}: {first_line(str(e))}"
        got = [t.unique_name for t in registry.GLOBAL_TEST_REGISTRY[before:]]
        tests += [{"name": n, "module": module} for n in got]
        if error is not None:
            source = pkg / "test_suite" / f"{module}.py"
            lost = [n for n in declared_tests(source) if n not in set(got)] if source.is_file() else []
            failures.append({"module": module, "error": error, "registered": len(got), "lost": lost})
    return {"tests": tests, "import_failures": failures}


# ---------------------------------------------------------------------------------------------------
# One test, in its own process


class _Recorder:
    """Wraps the module under test and records each call into it (torch-mlir's framework._Tracer, plus
    kwargs): the symbol called, its inputs cloned before the call, its output cloned after it."""

    def __init__(self, wrapped, path: list[str], calls: list):
        self._wrapped, self._path, self._calls = wrapped, path, calls

    def __call__(self, *args, **kwargs):
        recorded = (_clone(args), _clone(kwargs))
        out = self._wrapped(*args, **kwargs)
        self._calls.append({"symbol": ".".join(self._path) or "forward", "args": recorded[0], "kwargs": recorded[1],
                            "output": _clone(out)})
        return out

    def __getattr__(self, name):
        return _Recorder(getattr(self._wrapped, name), self._path + [name], self._calls)


def _clone(v):
    import torch

    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, (tuple, list)):
        return type(v)(_clone(x) for x in v)
    if isinstance(v, dict):
        return {k: _clone(x) for k, x in v.items()}
    return v


def dynamic_shapes_for(forward, args: tuple):
    """torch.export dynamic_shapes from the test's annotate_args: Dim.AUTO for each -1, None if all static."""
    from torch.export import Dim

    annotations = getattr(forward, "_torch_mlir_arg_annotations", None) or []
    specs, dynamic = [], False
    for i, a in enumerate(args):
        ann = annotations[i + 1] if i + 1 < len(annotations) else None
        dims = None
        if ann is not None and hasattr(a, "dim") and len(ann[0]) == a.dim():
            dims = {d: Dim.AUTO for d, size in enumerate(ann[0]) if size == -1} or None
        dynamic |= dims is not None
        specs.append(dims)
    return tuple(specs) if dynamic else None


class Outcome(Exception):
    """Ends a test's run with a class and a message."""

    def __init__(self, cls: str, message: str, key: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.cls, self.message, self.key, self.detail = cls, message, key or normalise(message), detail


def run_one(pkg: Path, module: str, name: str, work: Path) -> dict:
    """Build, export, compile, run and compare one test; the result dict (written by the caller)."""
    import warnings

    warnings.simplefilter("ignore")
    result = {"name": name, "module": module, "seconds": {}}
    step_file = work / "step"

    def step(s: str):
        result["step"] = s
        step_file.write_text(s)
        return time.perf_counter()

    try:
        t = step("build")
        import torch

        torch.set_num_threads(1)
        import_package(pkg)
        import importlib

        registry = importlib.import_module(f"{PACKAGE}.registry")
        try:
            import_suite_module(module)
        except BaseException:  # noqa: BLE001  (the listing saw it fail too: its tests registered before the failure run)
            pass
        framework = importlib.import_module(f"{PACKAGE}.framework")
        test = next((t for t in registry.GLOBAL_TEST_REGISTRY if t.unique_name == name), None)
        if test is None:
            raise Outcome("harness", f"no test named {name} in {module}")
        calls = []
        try:
            torch.manual_seed(0)
            program = test.program_factory()
            test.program_invoker(_Recorder(program, [], calls), framework.TestUtils())
        except Exception as e:
            raise Outcome("harness", f"the test fails in eager PyTorch: {type(e).__name__}: {first_line(str(e))}",
                          detail=tail(traceback.format_exc()))
        result["calls"] = len(calls)
        if not calls:
            raise Outcome("harness", "the test makes no call into its module")
        other = sorted({c["symbol"] for c in calls} - {"forward"})
        if other:
            raise Outcome("harness", f"the test calls {', '.join(other)}; llmc compiles forward only")
        result["seconds"]["build"] = round(time.perf_counter() - t, 2)

        t = step("export")
        torch.manual_seed(0)
        model = test.program_factory()
        first = calls[0]
        args, kwargs = _clone(first["args"]), _clone(first["kwargs"])
        dynamic = None if kwargs else dynamic_shapes_for(model.forward, args)
        try:
            with torch.no_grad():
                ep = torch.export.export(model.eval(), args, kwargs, dynamic_shapes=dynamic, strict=False)
        except Exception as e:
            raise Outcome("export-failed", f"{type(e).__name__}: {first_line(str(e))}",
                          detail=tail(traceback.format_exc()))
        result["dynamic_dims"] = _count_dynamic(ep)
        del ep
        result["seconds"]["export"] = round(time.perf_counter() - t, 2)

        t = step("compile")
        import llmc
        from llmc.errors import CompileError, InputError, LlmcError, RuntimeCallError

        try:
            art = llmc.compile(model, args, example_kwargs=kwargs or None, dtype="f32", target="cpu",
                               dynamic_shapes=dynamic, output=work / "m.vmfb")
        except CompileError as e:
            raise compile_outcome(e)
        except LlmcError as e:
            raise llmc_outcome(e)
        except Exception as e:
            raise internal_outcome(e)
        result["seconds"]["compile"] = round(time.perf_counter() - t, 2)

        t = step("run")
        outputs = []
        try:
            mod = llmc.load(art, threads=1)
            for i, call in enumerate(calls):
                try:
                    outputs.append(mod(*_clone(call["args"]), **_clone(call["kwargs"])))
                except InputError as e:
                    if i == 0:
                        raise
                    raise Outcome("harness", f"call {i + 1} of {len(calls)} does not fit the program exported "
                                             f"from call 1: {first_line(str(e))}",
                                  "a later call does not fit the program exported from the first")
        except RuntimeCallError as e:
            raise Outcome("runtime-error", str(e).strip())
        except LlmcError as e:
            raise llmc_outcome(e)
        except Outcome:
            raise
        except Exception as e:
            raise internal_outcome(e)
        result["seconds"]["run"] = round(time.perf_counter() - t, 2)

        step("compare")
        problems = [f"call {i + 1}: {p}" if len(calls) > 1 else p
                    for i, (c, o) in enumerate(zip(calls, outputs)) for p in compare(o, c["output"])]
        if problems:
            # The key without the figures: "values not close", "[N] dtype torch.float32 where eager has torch.float64".
            key = re.sub(r" \(.*\)$", "", normalise(problems[0].split(": ", 1)[-1] if len(calls) > 1 else problems[0]))
            if _matches_eval_mode(test, calls, outputs):
                key += "; matches eager in eval mode (llmc.compile exports model.eval())"
                problems.append("llmc's outputs match eager run in eval mode: llmc.compile exports model.eval(), "
                                "the test runs its module in training mode")
            more = f"; ... ({len(problems)} in all)" if len(problems) > 4 else ""
            raise Outcome("mismatch", "; ".join(problems[:4]) + more, key)
        result.update({"class": "pass", "message": "", "key": ""})
    except Outcome as o:
        result.update({"class": o.cls, "message": o.message[:4000], "key": o.key[:300]})
        if o.detail:
            result["detail"] = o.detail
    except Exception as e:  # the harness's own failure on this test (a suite module that no longer imports, ...)
        result.update({"class": "harness", "message": f"{type(e).__name__}: {first_line(str(e))}",
                       "key": normalise(f"{type(e).__name__}: {first_line(str(e))}"), "detail": tail(traceback.format_exc())})
    result["exported"] = result.get("step") in EXPORTED_STEPS
    return result


def _count_dynamic(ep) -> int:
    from torch.export.graph_signature import InputKind

    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    count = 0
    for spec in ep.graph_signature.input_specs:
        val = nodes[spec.arg.name].meta.get("val") if spec.kind == InputKind.USER_INPUT and hasattr(spec.arg, "name") else None
        if hasattr(val, "shape"):
            count += sum(not isinstance(d, int) for d in val.shape)
    return count


def _matches_eval_mode(test, calls, outputs) -> bool:
    """Whether llmc's outputs match eager with the module in eval mode (what llmc.compile exports).
    Only asked of modules that can behave differently in eval mode (dropout or norm submodules, or a
    forward that reads self.training): a second eager run of a large test can take minutes."""
    import inspect

    import torch

    try:
        torch.manual_seed(0)
        model = test.program_factory()
        modal = (torch.nn.modules.dropout._DropoutNd, torch.nn.modules.batchnorm._NormBase, torch.nn.RReLU)
        if not any(isinstance(m, modal) for m in model.modules()) and "training" not in inspect.getsource(type(model).forward):
            return False
        model.eval()
        with torch.no_grad():
            return all(not compare(o, model(*_clone(c["args"]), **_clone(c["kwargs"]))) for c, o in zip(calls, outputs))
    except Exception:
        return False


def llmc_outcome(e) -> Outcome:
    """An LlmcError other than a CompileError: llmc refused, and says why in its first line."""
    return Outcome("llmc-error", f"{type(e).__name__}: {str(e).strip()}", f"{type(e).__name__}: {normalise(first_line(str(e)))}")


def compile_outcome(e) -> Outcome:
    """A CompileError: iree-compile crashed, iree-compile failed with diagnostics, or the importer failed."""
    text = str(e).strip()
    diagnostics = e.diagnostics or ""
    killed = re.match(r"iree-compile was killed by (\w+)", text)
    crash = next((m for m in CRASH_MARKERS if m in diagnostics), None)
    error, op = _first_error(diagnostics)
    at = f" [{op}]" if op else ""
    if killed or crash:
        what = f"iree-compile killed by {killed.group(1)}" if killed else "iree-compile crashed"
        where = _first_matching(diagnostics, ("Assertion `", "LLVM ERROR:", "UNREACHABLE")) or error or crash or ""
        return Outcome("iree-compile-crash", f"{what}: {where}\n{text}", normalise(f"{what}: {where}") + at)
    if text.startswith("iree-compile"):
        return Outcome("llmc-error", text, normalise(f"iree-compile: {error or first_line(text)}") + at)
    return Outcome("llmc-error", f"CompileError: {text}", f"CompileError: {normalise(first_line(text))}")


def internal_outcome(e: BaseException) -> Outcome:
    """Any non-LlmcError exception from inside llmc: named by type, first line and innermost llmc frame."""
    frames = traceback.extract_tb(e.__traceback__)
    root = Path(__file__).resolve().parents[1]
    ours = [f for f in frames if f.filename.startswith(str(root)) and not f.filename.endswith("torch_mlir_e2e.py")]
    where = f" [{Path(ours[-1].filename).relative_to(root)}:{ours[-1].name}]" if ours else ""
    message = f"{type(e).__name__}: {first_line(str(e))}{where}"
    return Outcome("internal-error", message, normalise(message),
                   detail=tail("".join(traceback.format_exception(type(e), e, e.__traceback__))))


def _first_error(diagnostics: str) -> tuple[str | None, str | None]:
    """iree-compile's first error line, and the torch op at its location (the source line printed after it)."""
    lines = diagnostics.splitlines()
    for i, line in enumerate(lines):
        m = re.search(r"\berror: (.*)", line)
        if m:
            op = next((o.group(0) for l in lines[i + 1:i + 3] if (o := re.search(r"\btorch\.[a-z_]+\.[\w.]+", l))), None)
            return "error: " + m.group(1).strip(), op
    return None, None


def _first_matching(text: str, needles) -> str | None:
    for line in text.splitlines():
        if any(n in line for n in needles):
            return line.strip()
    return None


def compare(value, golden) -> list[str]:
    """torch-mlir's ValueReport rules: the reasons `value` is not `golden` (empty when it is)."""
    import torch

    if isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    if isinstance(golden, tuple) and len(golden) == 1:
        golden = golden[0]
    kind = lambda v: type(v).__name__
    if isinstance(golden, torch.Tensor):
        if not isinstance(value, torch.Tensor):
            return [f"type {kind(value)} where eager returns a tensor"]
        if value.shape != golden.shape:
            return [f"shape {list(value.shape)} where eager has {list(golden.shape)}"]
        if value.dtype != golden.dtype:
            return [f"dtype {value.dtype} where eager has {golden.dtype}"]
        if golden.dtype == torch.bool or not (golden.is_floating_point() or golden.is_complex()):
            if torch.equal(value, golden):
                return []
            return [f"values differ ({int((value != golden).sum())} of {golden.numel()} elements)"]
        bad = ~torch.isclose(value, golden, rtol=RTOL, atol=ATOL, equal_nan=True)
        if not bad.any():
            return []
        diff = (value[bad].double() - golden[bad].double()).abs()
        finite = diff[torch.isfinite(diff)]
        worst = f", max abs error {finite.max().item():.3g}" if finite.numel() else ""
        return [f"values not close ({int(bad.sum())} of {golden.numel()} elements over rtol={RTOL}, atol={ATOL}{worst})"]
    if isinstance(golden, bool) or isinstance(golden, int) or isinstance(golden, str):
        if type(value) is not type(golden):
            return [f"type {kind(value)} where eager returns {kind(golden)}"]
        return [] if value == golden else [f"value {value!r} where eager returns {golden!r}"]
    if isinstance(golden, float):
        if not isinstance(value, float):
            return [f"type {kind(value)} where eager returns float"]
        if value == golden or (value != value and golden != golden) or abs(value - golden) <= FLOAT_RTOL * abs(golden):
            return []
        return [f"value {value!r} where eager returns {golden!r}"]
    if isinstance(golden, (tuple, list)):  # a named tuple (torch.return_types.sort, ...) is a tuple, as in reporting.py
        if not isinstance(value, tuple if isinstance(golden, tuple) else list):
            return [f"type {kind(value)} where eager returns {kind(golden)}"]
        if len(value) != len(golden):
            return [f"{len(value)} elements where eager returns {len(golden)}"]
        return [f"[{i}] {p}" for i, (v, g) in enumerate(zip(value, golden)) for p in compare(v, g)]
    if isinstance(golden, dict):
        if not isinstance(value, dict) or sorted(value, key=str) != sorted(golden, key=str):
            return [f"{kind(value)} where eager returns a dict with keys {sorted(golden, key=str)}"]
        return [f"[{k!r}] {p}" for k in golden for p in compare(value[k], golden[k])]
    if golden is None:
        return [] if value is None else [f"type {kind(value)} where eager returns None"]
    return [f"eager returns a {kind(golden)}, which this harness does not compare"]


# ---------------------------------------------------------------------------------------------------
# Messages: one line, numbers and paths normalised, for grouping


def first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def normalise(text: str, keep_numbers: bool = False) -> str:
    """The grouping key of a message: its first line, paths as PATH, numbers as N (not those inside
    names such as f32, E5M2 or sm_80), SSA values as %N, addresses as ADDR; the IR an MLIR "failed to
    legalize operation 'x'" error prints after the op's name is dropped (it differs by shapes only)."""
    s = first_line(text)
    s = re.sub(r"(?<![\w.])/(?:[\w.+-]+/)+[\w.+-]*", "PATH", s)
    s = re.sub(r"^[\w.-]+\.mlir:\d+:\d+: ", "", s)
    s = re.sub(r"\b0x[0-9a-fA-F]+", "ADDR", s)
    s = re.sub(r", \{'stack_trace'.*", "", s)  # the FX node's metadata in torch-mlir's "Unimplemented call_function"
    s = re.sub(r"(failed to legalize operation '[\w.]+'[\w ]*?)(?: that was explicitly marked illegal)?: %.*", r"\1", s)
    if not keep_numbers:
        s = re.sub(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[+-]?\d+)?", "N", s)
        while re.search(r"(?<=Nx)\d+", s):
            s = re.sub(r"(?<=Nx)\d+", "N", s)
    s = re.sub(r"%[\w.]+", "%N", s)
    return s[:240]


# ---------------------------------------------------------------------------------------------------
# The runner: one process per test, --workers at a time


# Imported once, by the forkserver every test's process is forked from (torch and its export stack
# take ~10 s to import on a busy 2-core machine, more than most tests take to compile and run).
PRELOAD = ["torch", "torch.export", "torch._dynamo", "torch._functorch.aot_autograd", "sympy", "numpy", "llmc",
           "llmc.compiler.api", "llmc.compiler.lower", "llmc.compiler.importer", "llmc.compiler.iree", "llmc.runtime",
           "torch_mlir.fx", "iree.runtime"]
_CONTEXT = None
_RUNNING: set[int] = set()  # pids of the tests' processes now running (killed on Ctrl-C)


def _context():
    """The forkserver context (started on first use, with PRELOAD imported in the server)."""
    global _CONTEXT
    if _CONTEXT is None:
        import multiprocessing

        os.environ.setdefault("OMP_NUM_THREADS", "1")  # inherited by the server: one thread per test's process
        os.environ.setdefault("PYTHONWARNINGS", "ignore")
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def _child(job: str, args: dict, work: str) -> None:
    """A test's process: its own session (so a timeout kills iree-compile too), output to work/log.txt,
    the result to work/result.json."""
    os.setsid()
    try:  # PR_SET_PDEATHSIG: killed when the forkserver goes, which goes when this tool does, however it ends
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    fd = os.open(os.path.join(work, "log.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    if job == "list":
        try:
            result = list_tests(Path(args["pkg"]))
        except BaseException as e:  # noqa: BLE001  (reported by the parent as a bad suite)
            result = {"error": f"{type(e).__name__}: {first_line(str(e))}"}
    else:
        result = run_one(Path(args["pkg"]), args["module"], args["name"], Path(work))
    tmp = os.path.join(work, "result.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, os.path.join(work, "result.json"))


def _in_child(job: str, args: dict, work: Path, timeout: float | None) -> tuple[dict | None, int | None, bool]:
    """Run `job` in a process forked by the forkserver: (its result or None, exit code, timed out)."""
    work.mkdir(parents=True, exist_ok=True)
    proc = _context().Process(target=_child, args=(job, args, str(work)), daemon=True)
    proc.start()
    _RUNNING.add(proc.pid)
    proc.join(timeout)
    timed_out = proc.exitcode is None
    if timed_out:
        _kill(proc.pid)
        proc.join()
    _RUNNING.discard(proc.pid)
    result_file = work / "result.json"
    result = json.loads(result_file.read_text()) if result_file.exists() and not timed_out else None
    return result, proc.exitcode, timed_out


def _kill(pid: int) -> None:
    """Kill a test's process and everything it started (iree-compile): its session's process group."""
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            return kill()
        except (ProcessLookupError, PermissionError):
            continue


def run_test_process(pkg: Path, test: dict, timeout: float, work: Path) -> dict:
    """Run one test in a process of its own (killed with its children on timeout); its result dict."""
    start = time.perf_counter()
    result, code, timed_out = _in_child("test", {"pkg": str(pkg), "module": test["module"], "name": test["name"]}, work, timeout)
    seconds = round(time.perf_counter() - start, 2)
    step = (work / "step").read_text().strip() if (work / "step").exists() else "build"
    if timed_out:
        result = {"name": test["name"], "module": test["module"], "class": "timeout", "step": step,
                  "message": f"ran past the {timeout:g} s timeout during {step}", "key": f"ran past the timeout during {step}"}
    elif result is None:
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code} without a result"
        cls = {"build": "harness", "export": "export-failed", "compile": "internal-error"}.get(step, "runtime-error")
        log_tail = tail((work / "log.txt").read_text(errors="replace"), 15) if (work / "log.txt").exists() else ""
        result = {"name": test["name"], "module": test["module"], "class": cls, "step": step,
                  "message": f"the test's process was {how} during {step}\n{log_tail}", "key": f"process {how} during {step}"}
    result["exported"] = result.get("step") in EXPORTED_STEPS
    result["wall_seconds"] = seconds
    return result


def list_in_child(pkg: Path) -> dict:
    """The suite's tests, listed by a forked process (this one never imports torch or the suite)."""
    work = Path(tempfile.mkdtemp(prefix="llmc-tm-e2e-list-"))
    try:
        result, code, _ = _in_child("list", {"pkg": str(pkg)}, work, None)
        log = (work / "log.txt").read_text(errors="replace") if (work / "log.txt").exists() else ""
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if result is None or "error" in result:
        why = result["error"] if result else f"the listing process exited with code {code}: {first_line(tail(log, 1))}"
        raise ArgError(f"{pkg}: importing the suite failed: {why}")
    return result


def select(listing: dict, pattern: str | None, limit: int | None, seed: int) -> list[dict]:
    """The tests to run (sorted by name): the suite's tests plus those lost to import failures, filtered, sampled."""
    pool = [dict(t) for t in listing["tests"]]
    for f in listing["import_failures"]:
        pool += [{"name": n, "module": f["module"], "import_error": f["error"]} for n in f["lost"]]
    if pattern:
        pool = [t for t in pool if re.search(pattern, t["name"])]
    pool.sort(key=lambda t: t["name"])
    if limit is not None and limit < len(pool):
        pool = sorted(random.Random(seed).sample(pool, limit), key=lambda t: t["name"])
    return pool


def run_all(pkg: Path, tests: list[dict], workers: int, timeout: float, keep: Path | None) -> list[dict]:
    results, lock, done, stopping = [], threading.Lock(), [0], threading.Event()
    root = Path(tempfile.mkdtemp(prefix="llmc-tm-e2e-"))
    counts = collections.Counter()

    def finish(r: dict):
        if stopping.is_set():  # interrupted: what the killed processes left is no result
            return
        with lock:
            results.append(r)
            done[0] += 1
            counts[r["class"]] += 1
            so_far = ", ".join(f"{c} {counts[c]}" for c in CLASSES if counts[c])
            secs = f"{r['wall_seconds']:6.1f}s" if "wall_seconds" in r else "       "
            print(f"[{done[0]:{len(str(len(tests)))}}/{len(tests)}] {r['class']:<18} {secs} {r['name']}   ({so_far})",
                  file=sys.stderr, flush=True)

    def one(t: dict):
        if "import_error" in t:
            return finish({"name": t["name"], "module": t["module"], "class": "import-failed", "step": "build",
                           "exported": False, "message": f"test_suite/{t['module']}.py: {t['import_error']}",
                           "key": normalise(f"{t['module']}: {t['import_error']}")})
        work = root / t["name"]
        r = run_test_process(pkg, t, timeout, work)
        if keep is not None and r["class"] != "pass":
            shutil.copytree(work, keep / t["name"], dirs_exist_ok=True)
        shutil.rmtree(work, ignore_errors=True)
        finish(r)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
    try:
        for f in concurrent.futures.as_completed([pool.submit(one, t) for t in tests]):
            f.result()
    except KeyboardInterrupt:
        stopping.set()
        pool.shutdown(wait=False, cancel_futures=True)
        for pid in list(_RUNNING):
            _kill(pid)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(root, ignore_errors=True)
    return sorted(results, key=lambda r: r["name"])


# ---------------------------------------------------------------------------------------------------
# The summary


def summarise(results: list[dict], top: int = 10, examples: int = 3) -> dict:
    counts = collections.Counter(r["class"] for r in results)
    exportable = sum(1 for r in results if r.get("exported"))
    groups = {}
    for cls in FAILING:
        rs = [r for r in results if r["class"] == cls]
        by_key = collections.defaultdict(list)
        for r in rs:
            by_key[r.get("key") or first_line(r.get("message", ""))].append(r["name"])
        ordered = sorted(by_key.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        groups[cls] = [{"key": k, "count": len(v), "examples": v[:examples]} for k, v in ordered[:top]]
        if len(ordered) > top:
            groups[cls].append({"key": f"({len(ordered) - top} more messages)", "count": sum(len(v) for _, v in ordered[top:]),
                                "examples": []})
    return {"total": len(results), "counts": {c: counts.get(c, 0) for c in CLASSES}, "exportable": exportable,
            "pass_rate": round(counts["pass"] / exportable, 4) if exportable else None, "groups": groups}


def summary_text(s: dict, header: str) -> str:
    lines = [header, ""]
    notes = {"import-failed": "not run (a suite module failed to import)", "harness": "not runnable as a test here",
             "export-failed": "torch.export cannot export them: not counted in the pass rate"}
    for c in CLASSES:
        if s["counts"][c] or c == "pass":
            lines.append(f"  {c:<20}{s['counts'][c]:>6}" + (f"   {notes[c]}" if c in notes else ""))
    rate = f"{100 * s['pass_rate']:.1f}%" if s["pass_rate"] is not None else "n/a"
    lines += ["", "pass rate over exportable tests (eager ran, torch.export succeeded): "
                  f"{s['counts']['pass']}/{s['exportable']} = {rate}"]
    for c in FAILING:
        if not s["groups"][c]:
            continue
        lines += ["", f"{c} ({s['counts'][c]})"]
        for g in s["groups"][c]:
            lines.append(f"  {g['count']:>4}  {g['key']}")
            if g["examples"]:
                lines.append(f"        e.g. {', '.join(g['examples'])}")
    return "\n".join(lines)


def summary_markdown(s: dict, header: str) -> str:
    esc = lambda t: t.replace("|", "\\|").replace("`", "'")
    lines = [f"# {header}", "", "| class | tests |", "|---|---:|"]
    lines += [f"| {c} | {s['counts'][c]} |" for c in CLASSES if s["counts"][c] or c == "pass"]
    rate = f"{100 * s['pass_rate']:.1f}%" if s["pass_rate"] is not None else "n/a"
    lines += ["", f"Pass rate over exportable tests (eager ran, torch.export succeeded): "
                  f"{s['counts']['pass']}/{s['exportable']} = {rate}."]
    for c in FAILING:
        if s["groups"][c]:
            lines += ["", f"## {c} ({s['counts'][c]})", "", "| tests | message | examples |", "|---:|---|---|"]
            lines += [f"| {g['count']} | {esc(g['key'])} | {', '.join(g['examples'])} |" for g in s["groups"][c]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# Command line


def parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite", type=Path, metavar="SUITE_DIR",
                    help=f"torch-mlir's {PACKAGE} package, the folder holding it, or a torch-mlir checkout")
    ap.add_argument("--filter", metavar="REGEX", help="only tests whose name matches (re.search)")
    ap.add_argument("--limit", type=int, metavar="N", help="a random sample of N tests (after --filter)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the --limit sample (default 0)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per test, all steps (default 180)")
    ap.add_argument("--workers", type=int, default=2, help="tests run at once (default 2)")
    ap.add_argument("--json", type=Path, metavar="PATH", help="write every result and the summary here")
    ap.add_argument("--markdown", type=Path, metavar="PATH", help="write the summary as Markdown here")
    ap.add_argument("--keep", type=Path, metavar="DIR", help="keep each failing test's folder (log, reproducer) in DIR/NAME")
    ap.add_argument("--list", action="store_true", help="print the selected tests' names and stop")
    return ap.parse_args(argv)


def check_args(args: argparse.Namespace) -> Path:
    pkg = find_suite(args.suite)
    if args.filter is not None:
        try:
            re.compile(args.filter)
        except re.error as e:
            raise ArgError(f"--filter {args.filter!r}: not a regular expression ({e})")
    if args.limit is not None and args.limit < 1:
        raise ArgError(f"--limit {args.limit}: must be at least 1")
    if args.workers < 1:
        raise ArgError(f"--workers {args.workers}: must be at least 1")
    if args.timeout <= 0:
        raise ArgError(f"--timeout {args.timeout:g}: must be positive")
    for opt, path in (("--json", args.json), ("--markdown", args.markdown)):
        if path is not None and not path.resolve().parent.is_dir():
            raise ArgError(f"{opt} {path}: folder {path.resolve().parent} does not exist")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    return pkg


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    try:
        pkg = check_args(args)
        listing = list_in_child(pkg)
    except ArgError as e:
        print(f"torch_mlir_e2e: error: {e}", file=sys.stderr)
        return 2
    tests = select(listing, args.filter, args.limit, args.seed)
    if args.list:
        print("\n".join(t["name"] for t in tests))
        return 0
    for f in listing["import_failures"]:
        print(f"suite module {f['module']} failed to import ({f['error']}): {f['registered']} tests registered "
              f"before the failure, {len(f['lost'])} lost", file=sys.stderr)
    print(f"{len(tests)} of {len(listing['tests']) + sum(len(f['lost']) for f in listing['import_failures'])} tests, "
          f"{args.workers} at a time, {args.timeout:g} s each at most", file=sys.stderr)
    versions, start = _versions(), time.time()  # before the run: the tree may change while it goes
    signal.signal(signal.SIGTERM, _interrupt)  # kill: the tests' processes go too
    try:
        results = run_all(pkg, tests, args.workers, args.timeout, args.keep)
    except KeyboardInterrupt:
        print("torch_mlir_e2e: interrupted", file=sys.stderr)
        return 130
    seconds = round(time.time() - start, 1)
    summary = summarise(results)
    header = (f"torch-mlir e2e suite through llmc (cpu, f32): {len(results)} tests in "
              f"{datetime.timedelta(seconds=int(seconds))}, {args.workers} workers")
    print(summary_text(summary, header))
    if args.markdown:
        args.markdown.write_text(summary_markdown(summary, header))
    if args.json:
        import llmc

        report = {"suite": str(pkg), "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                  "versions": versions, "llmc": llmc.__version__, "seconds": seconds,
                  "tolerances": {"rtol": RTOL, "atol": ATOL, "float_rtol": FLOAT_RTOL},
                  "import_failures": listing["import_failures"], "summary": summary, "results": results}
        args.json.write_text(json.dumps(report, indent=1))
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _versions() -> dict:
    """The versions a manifest records (compiler/lower.py), and llmc's git commit with the files changed
    from it (results depend on both)."""
    import subprocess

    from llmc.compiler.lower import _versions as package_versions

    root = Path(__file__).resolve().parents[1]
    git = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True, timeout=30).stdout
    out = {"llmc_commit": None, "llmc_changed_files": []}
    try:
        out["llmc_commit"] = git("rev-parse", "HEAD").strip() or None
        changed = git("status", "--porcelain", "--", "compiler", "passes", "runtime", "llmc")
        out["llmc_changed_files"] = [line[3:] for line in changed.splitlines()]
    except (OSError, subprocess.SubprocessError):
        pass
    return {**package_versions(), **out}


if __name__ == "__main__":
    sys.exit(main())
