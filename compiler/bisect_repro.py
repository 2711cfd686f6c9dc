"""bisect's reproducer folder: writing repro.mlir, repro.py, command.sh (and, for drift, the
iree-run-module inputs and check.py), then running command.sh once to check it fails the same way.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import torch

from llmc import dtypes
from llmc.compiler import diff_metrics, iree
from llmc.compiler.bisect_graph import Culprit
from llmc.compiler.bisect_session import Failure, error_signature, error_signature_all

_REPRO_FILES = ("repro.mlir", "repro.py", "command.sh", "stderr.txt", "inputs.pt", "check.py")
_REPRO_GLOBS = ("input*.npy", "expected*.npy", "got*.npy", "repro.vmfb", "repro.pt2")


_PY_NAMES = {float("inf"): 'float("inf")', float("-inf"): 'float("-inf")'}


def _py(v) -> str:
    """Python source for a constant argument of an aten op."""
    if isinstance(v, float):
        if math.isnan(v):
            return 'float("nan")'
        return _PY_NAMES.get(v, repr(v))
    if isinstance(v, (bool, int, str)) or v is None:
        return repr(v)
    if isinstance(v, (list, tuple)):
        inner = ", ".join(_py(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(x)}" for k, x in v.items()) + "}"
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    if isinstance(v, (torch.layout, torch.memory_format)):
        return str(v)
    if isinstance(v, torch.fx.Node):
        return v.name
    raise ValueError(f"no Python spelling for {type(v).__name__} {v!r}")


def _target_source(target) -> str:
    if hasattr(target, "_schema"):  # an OpOverload: torch.ops.<ns>.<op>.<overload>
        ns = target.namespace
        packet = target._schema.name.split("::", 1)[1]
        return f"torch.ops.{ns}.{packet}.{target._overloadname}"
    mod = getattr(target, "__module__", None)
    return f"{mod}.{target.__name__}" if mod else target.__name__


def repro_py(
    gm: torch.fx.GraphModule, specs: list[dict], culprit: Culprit | None, error: str, with_inputs: bool, note: str = ""
) -> str:
    """A self-contained torch script that rebuilds the one-op module and exports it."""
    call = next(n for n in gm.graph.nodes if n.op == "call_function")
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    args = [_py(a) for a in call.args] + [f"{k}={_py(v)}" for k, v in call.kwargs.items()]
    error = error.replace("\\", "/").replace('"' * 3, "'" * 3)
    where = f"\nFrom {culprit.module_path} ({culprit.module_type}) at {culprit.source}" if culprit else ""
    if with_inputs:
        make = 'args = tuple(torch.load(HERE / "inputs.pt", weights_only=True))  # the values the op saw in the model'
    else:
        lines = []
        for s in specs:
            dt = getattr(torch, s["dtype"])
            if dt.is_floating_point:
                lines.append(f"    torch.randn({s['shape']}).to(torch.{s['dtype']}),")
            else:
                lines.append(f"    torch.zeros({s['shape']}, dtype=torch.{s['dtype']}),")
        make = "args = (\n" + "\n".join(lines) + "\n)"
    return f'''"""llmc bisect reproducer: one {_target_source(call.target)} call.{where}
Error: {error}{chr(10) + note if note else ""}

python repro.py          rebuild the module, export it, save repro.pt2 (llmc compile repro.pt2 ...)
python repro.py --mlir   also print the torch-dialect MLIR torch-mlir makes of it (needs torch-mlir)
"""
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


class OneOp(torch.nn.Module):
    def forward(self, {", ".join(names)}):
        return {_target_source(call.target)}({", ".join(args)})


{make}
ep = torch.export.export(OneOp(), args)
torch.export.save(ep, str(HERE / "repro.pt2"))
print(ep.graph)
if "--mlir" in sys.argv:
    from torch_mlir import fx

    print(fx.export_and_import(OneOp(), *args, output_type="torch", func_name="main"))
'''


_CHECK_PY = '''"""Compares iree-run-module's outputs (got*.npy) with eager PyTorch's (expected*.npy). Exit 1 on drift."""
import math
import sys
from pathlib import Path

import numpy as np

MAX_REL, MIN_COSINE = {max_rel!r}, {min_cosine!r}  # llmc's {dtype} tolerance profile
here = Path(__file__).resolve().parent
failed = False
for i in range({n}):
    got = np.load(here / f"got{{i}}.npy").astype(np.float64).ravel()
    ref = np.load(here / f"expected{{i}}.npy").astype(np.float64).ravel()
    max_abs = float(np.abs(got - ref).max()) if ref.size else 0.0
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    cos = float(got @ ref) / max(float(np.linalg.norm(got) * np.linalg.norm(ref)), 1e-300)
    bad = not (max_rel <= MAX_REL and cos >= MIN_COSINE)
    failed |= bad
    print(f"{{'DRIFT' if bad else 'ok'}} output {{i}}: max_abs {{max_abs:.4g}}, max_rel {{max_rel:.4g}} (<= {{MAX_REL}}), cosine {{cos:.7f}} (>= {{MIN_COSINE}})")
sys.exit(1 if failed else 0)
'''


def _npy_ok(t: torch.Tensor) -> bool:
    return dtypes.of_torch(t.dtype).plain_numpy and not t.dtype.is_complex


def write_reproducer(
    out_dir: Path, failure: Failure, gm, specs, culprit, kind: str, inputs=None, expected=None, dtype: str = "f32", note: str = ""
) -> str:
    """Write the reproducer files into `out_dir`; returns the command line (as in command.sh)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_outputs(out_dir, _REPRO_FILES + _REPRO_GLOBS)
    tol = diff_metrics.TOLERANCES.get(dtype, diff_metrics.TOLERANCES["f32"])
    if gm is not None:
        (out_dir / "repro.py").write_text(repro_py(gm, specs, culprit, failure.first_line, inputs is not None, note))
    # iree-compile names its temporary input; the reproducer's copy is repro.mlir.
    (out_dir / "stderr.txt").write_text(re.sub(r"\S*llmc-compile-[^/\s]+/input\.mlir", "repro.mlir", failure.diagnostics))
    header = f"#!/bin/sh\n# llmc bisect reproducer ({kind}): {failure.first_line}\n"
    if failure.mlir is None:
        # torch-mlir rejected the graph before iree-compile saw it: torch-mlir itself reproduces it.
        command = "python3 repro.py --mlir"
        body = f'cd "$(dirname "$0")" || exit 2\nexec {command}\n'
    else:
        (out_dir / "repro.mlir").write_text(failure.mlir)
        compile_cmd = shlex.join(["iree-compile", "repro.mlir", "--iree-input-type=torch", *failure.flags, "-o", "repro.vmfb"])
        command = compile_cmd
        body = 'cd "$(dirname "$0")" || exit 2\n'
        if failure.kind == "compile":
            body += f"exec {compile_cmd}\n"
        elif inputs is None or not all(_npy_ok(t) for t in list(inputs) + list(expected)):
            # bf16 (or other non-numpy) values: iree-run-module's .npy files can't carry them.
            if inputs is not None:
                torch.save(list(inputs), out_dir / "inputs.pt")
            body += f"# the drift check needs values .npy cannot hold; this compiles only\nexec {compile_cmd}\n"
        else:
            import numpy as np

            torch.save(list(inputs), out_dir / "inputs.pt")
            run = ["iree-run-module", "--device=local-task", "--module=repro.vmfb", "--function=main"]
            for i, t in enumerate(inputs):
                np.save(out_dir / f"input{i}.npy", t.contiguous().numpy())
                run.append(f"--input=@input{i}.npy")
            for i, t in enumerate(expected):
                np.save(out_dir / f"expected{i}.npy", t.contiguous().numpy())
                run.append(f"--output=@got{i}.npy")
            (out_dir / "check.py").write_text(
                _CHECK_PY.format(max_rel=tol["max_rel"], min_cosine=tol["min_cosine"], dtype=dtype, n=len(expected))
            )
            command = f"{compile_cmd} && {shlex.join(run)} && python3 check.py"
            body += f"{compile_cmd} || exit 2\n{shlex.join(run)} || exit 2\nexec python3 check.py\n"
    (out_dir / "command.sh").write_text(header + body)
    os.chmod(out_dir / "command.sh", 0o755)
    return command


def _remove_outputs(out_dir: Path, patterns) -> None:
    for pattern in patterns:
        for p in out_dir.glob(pattern):
            if p.is_file():
                p.unlink()


def check_reproducer(out_dir: Path, failure: Failure) -> tuple[bool, str]:
    """Run command.sh once; (fails the same way, first line of what it printed)."""
    tool_dir = str(Path(iree.iree_compile_path()).parent)
    env = {**os.environ, "PATH": f"{tool_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["sh", str(out_dir / "command.sh")], capture_output=True, text=True, env=env, timeout=3600)
    _remove_outputs(out_dir, ("repro.vmfb", "repro.pt2", "got*.npy"))
    if failure.kind == "drift":
        drifted = proc.returncode == 1 and "DRIFT" in proc.stdout
        line = next((l for l in proc.stdout.splitlines() if "DRIFT" in l), (proc.stderr or proc.stdout).strip()[:200])
        return drifted, line
    if proc.returncode == 0:
        return False, "command.sh succeeded"
    sig, first = error_signature(proc.stderr)
    if failure.stage == "import":
        return failure.signature in error_signature_all(proc.stderr), first
    return sig == failure.signature, first
