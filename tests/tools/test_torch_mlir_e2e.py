"""tools/torch_mlir_e2e.py on a fake torch-mlir e2e suite written here (the real one is not vendored):
the same package layout and API (registry.GLOBAL_TEST_REGISTRY / register_test_case, annotations.
annotate_args / export, framework.TestUtils, test_suite/ with register_all_tests), holding one test per
class the tool can reach cheaply. One run classifies all six, the timeout's among them (its test sleeps
past --timeout while the others run beside it: --workers 3, one of them asleep); bad arguments fail in
one line."""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "torch_mlir_e2e.py"

FILES = {
    "__init__.py": "",
    "framework.py": '''
        from typing import Any, Callable, NamedTuple

        import torch


        class TestUtils:
            def __init__(self):
                torch.manual_seed(0)

            def rand(self, *sizes, low=0.0, high=1.0):
                return torch.empty(sizes).uniform_(low, high)


        class Test(NamedTuple):
            unique_name: str
            program_factory: Callable[[], torch.nn.Module]
            program_invoker: Callable[[Any, TestUtils], None]
            timeout_seconds: int
    ''',
    "registry.py": '''
        from .framework import Test

        GLOBAL_TEST_REGISTRY = []


        def register_test_case(module_factory, timeout_seconds=120):
            def decorator(f):
                GLOBAL_TEST_REGISTRY.append(Test(f.__name__, module_factory, f, timeout_seconds))
                return f
            return decorator
    ''',
    "annotations.py": '''
        def export(fn):
            fn._torch_mlir_export = True
            return fn


        def annotate_args(annotations):
            def decorator(fn):
                fn._torch_mlir_arg_annotations = annotations
                return fn
            return decorator
    ''',
    "test_suite/__init__.py": '''
        def register_all_tests():
            from . import cases
            from . import needs_missing
            from . import slow
    ''',
    "test_suite/cases.py": '''
        import torch

        from torch_mlir_e2e_test.annotations import annotate_args, export
        from torch_mlir_e2e_test.framework import TestUtils
        from torch_mlir_e2e_test.registry import register_test_case


        class AddModule(torch.nn.Module):
            @export
            @annotate_args([None, ([-1, -1], torch.float32, True), ([-1, -1], torch.float32, True)])
            def forward(self, x, y):
                return x + 2 * y


        @register_test_case(module_factory=lambda: AddModule())
        def AddModule_basic(module, tu: TestUtils):
            module.forward(tu.rand(3, 4), tu.rand(3, 4))


        class DataDependentModule(torch.nn.Module):
            def forward(self, x):
                if x.sum() > 0:  # a branch on a tensor's value: torch.export cannot export it
                    return x * 2
                return x - 1


        @register_test_case(module_factory=lambda: DataDependentModule())
        def DataDependentModule_basic(module, tu: TestUtils):
            module.forward(tu.rand(5))


        class DropoutTrainModule(torch.nn.Module):
            # Eager runs it in training mode (elements dropped, the rest scaled by 2); llmc.compile
            # exports model.eval(), where dropout is the identity: a real, deterministic mismatch.
            def __init__(self):
                super().__init__()
                self.drop = torch.nn.Dropout(0.5)

            def forward(self, x):
                return self.drop(x)


        @register_test_case(module_factory=lambda: DropoutTrainModule())
        def DropoutTrainModule_basic(module, tu: TestUtils):
            module.forward(tu.rand(8, 8) + 1.0)


        @register_test_case(module_factory=lambda: AddModule())
        def BrokenInvoker_basic(module, tu: TestUtils):
            module.forward(tu.rand(2, 2))  # one argument short: the test itself fails in eager
    ''',
    "test_suite/needs_missing.py": '''
        import a_package_this_environment_does_not_have

        from torch_mlir_e2e_test.registry import register_test_case


        @register_test_case(module_factory=lambda: None)
        def LostModule_basic(module, tu):
            module.forward()
    ''',
    "test_suite/slow.py": '''
        import time

        import torch

        from torch_mlir_e2e_test.registry import register_test_case


        @register_test_case(module_factory=lambda: torch.nn.Identity())
        def SleepModule_basic(module, tu):
            time.sleep(600)
            module.forward(tu.rand(2))
    ''',
}


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tm") / "python"
    for name, text in FILES.items():
        path = root / "torch_mlir_e2e_test" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root


def run_tool(*args, timeout=300):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=timeout)


TIMEOUT = 40  # seconds per test: the sleeping one is killed after it; each of the others took under 5 (2 cores, load 6): 8x margin


@pytest.fixture(scope="module")
def report(suite, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    proc = run_tool(suite, "--timeout", TIMEOUT, "--workers", "3", "--json", out / "r.json", "--markdown", out / "r.md")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "r.json").read_text()), proc, (out / "r.md").read_text()


def test_each_test_gets_its_class(report):
    rep, _, _ = report
    got = {r["name"]: r["class"] for r in rep["results"]}
    assert got == {
        "AddModule_basic": "pass",
        "DataDependentModule_basic": "export-failed",
        "DropoutTrainModule_basic": "mismatch",
        "BrokenInvoker_basic": "harness",
        "LostModule_basic": "import-failed",
        "SleepModule_basic": "timeout",
    }
    by = {r["name"]: r for r in rep["results"]}
    assert by["AddModule_basic"]["dynamic_dims"] >= 1  # the -1 annotations became dynamic dims
    assert "data-dependent" in by["DataDependentModule_basic"]["message"].lower().replace(" ", "-")
    assert by["DropoutTrainModule_basic"]["key"].startswith("values not close")
    assert "matches eager in eval mode" in by["DropoutTrainModule_basic"]["key"]
    assert "eager PyTorch: TypeError" in by["BrokenInvoker_basic"]["message"]
    assert "a_package_this_environment_does_not_have" in by["LostModule_basic"]["message"]
    assert rep["import_failures"] == [{"module": "needs_missing", "registered": 0, "lost": ["LostModule_basic"],
                                       "error": "ModuleNotFoundError: No module named 'a_package_this_environment_does_not_have'"}]


def test_summary_counts_and_pass_rate(report):
    rep, proc, markdown = report
    s = rep["summary"]
    assert s["counts"] == {"pass": 1, "import-failed": 1, "harness": 1, "export-failed": 1, "llmc-error": 0,
                           "iree-compile-crash": 0, "internal-error": 0, "runtime-error": 0, "mismatch": 1, "timeout": 1}
    # export-failed, harness, import-failed and a timeout before the export are left out
    assert s["exportable"] == 2 and s["pass_rate"] == 0.5
    assert [g["examples"] for g in s["groups"]["mismatch"]] == [["DropoutTrainModule_basic"]]
    assert "pass rate over exportable tests (eager ran, torch.export succeeded): 1/2 = 50.0%" in proc.stdout
    assert re.search(r"^  mismatch +1$", proc.stdout, re.M)
    progress = [l for l in proc.stderr.splitlines() if re.match(r"\[\d/6\] ", l)]
    assert sorted(l.split()[0] for l in progress) == [f"[{i}/6]" for i in range(1, 7)]
    assert "| mismatch | 1 |" in markdown and "1/2 = 50.0%" in markdown


def test_a_test_past_the_timeout_is_killed(report):
    """SleepModule_basic sleeps 600 s in its invoker (the build step), in the run the other tests share."""
    rep, _, _ = report
    by = {r["name"]: r for r in rep["results"]}
    r = by["SleepModule_basic"]
    assert (r["class"], r["step"]) == ("timeout", "build")
    assert TIMEOUT <= r["wall_seconds"] < TIMEOUT + 60


@pytest.mark.parametrize("where", ["missing", "empty"])
def test_bad_suite_folder_is_one_line_exit_2(tmp_path, where):
    folder = tmp_path / "nothing-here" if where == "missing" else tmp_path
    proc = run_tool(folder, timeout=60)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert str(folder) in proc.stderr


def test_messages_group_by_normalised_first_line():
    sys.path.insert(0, str(TOOL.parent))
    try:
        import torch_mlir_e2e as tool
    finally:
        sys.path.remove(str(TOOL.parent))
    key = tool.normalise("input.mlir:3:5: error: %12 = op (!torch.vtensor<[1,?],f32>) tensor<3x4xf8E5M2> in /tmp/a/b.mlir\nmore")
    assert key == "error: %N = op (!torch.vtensor<[N,?],f32>) tensor<NxNxf8E5M2> in PATH"
    import torch

    assert tool.compare((torch.ones(2),), torch.ones(2)) == []  # a 1-tuple counts as its element
    assert tool.compare(torch.tensor([1.0, float("nan")]), torch.tensor([1.0005, float("nan")])) == []  # rtol 1e-3
    assert tool.compare(torch.ones(2), torch.ones(2, dtype=torch.float64))[0].startswith("dtype torch.float32")
    assert tool.compare(torch.tensor([1.002]), torch.tensor([1.0]))[0].startswith("values not close")
    assert tool.compare(3, 4) == ["value 3 where eager returns 4"]
