"""Runs every lit/FileCheck file in tests/passes/ (one pytest case each, so CI counts them).

Each file is IR in, IR out: `.mlir` files go through `llmc-opt --pass NAME` (IR passes), `.py` files
write a small .pt2 and run `llmc-opt` on it (graph passes). Most files also run `--pipeline` for a
target, so removing a pass from compiler/pipeline.py fails its test.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
FORKSERVER = HERE.parent / "forkserver.py"
CASES = sorted(p.name for p in HERE.iterdir() if p.suffix in (".mlir", ".py") and not p.name.startswith(("test_", "lit.", "conftest")))


def test_every_pass_has_a_lit_file():
    from llmc.passes import REGISTRY

    stems = {c.rsplit(".", 1)[0].removesuffix("_negative").removesuffix("_invalid") for c in CASES}
    missing = [n for n in REGISTRY if n.replace("-", "_") not in stems]
    assert not missing, f"passes without a FileCheck test in tests/passes/: {missing}"


@pytest.fixture(scope="module")
def forkserver(tmp_path_factory):
    """tests/forkserver.py serving on a socket for this module's tests; yields the socket's path."""
    sock = tmp_path_factory.mktemp("lit") / "forkserver.sock"
    log = sock.with_suffix(".log")
    with open(log, "wb") as log_file:
        server = subprocess.Popen([sys.executable, str(FORKSERVER), "serve", str(sock)], stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not sock.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the lit fork server did not start (exit {server.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield sock
    finally:
        server.kill()
        server.wait()


@pytest.fixture(scope="module")
def lit_results(forkserver, tmp_path_factory) -> dict[str, tuple[str, str]]:
    """One lit run over every file, two at a time, its `%python` and `llmc-opt` commands forked from one
    warm Python (tests/forkserver.py: ~0.2-0.6 s a command instead of ~7 s, most of it the first import
    of torch and the first torch.export in a process): file -> (result code, lit's output for it when
    it failed)."""
    lit = Path(sys.executable).parent / "lit"
    # its own output folder (lit.cfg.py): with xdist's default distribution both workers run this fixture,
    # and in one shared tests/passes/Output they overwrote each other's %t files (an empty .stats file)
    env = {**os.environ, "LLMC_LIT_FORKSERVER": str(forkserver), "LLMC_LIT_EXEC_ROOT": str(tmp_path_factory.mktemp("lit-out"))}
    proc = subprocess.run([str(lit), "-v", "-j", "2", str(HERE)], capture_output=True, text=True, timeout=1800, env=env)
    out = proc.stdout
    results = {m.group(2): (m.group(1), "") for m in re.finditer(r"^([A-Z]+): llmc-passes :: (\S+) \(", out, re.M)}
    for m in re.finditer(r"^\*+ TEST 'llmc-passes :: (\S+)' FAILED \*+\n(.*?)^\*{20}$", out, re.M | re.S):
        results[m.group(1)] = (results.get(m.group(1), ("FAIL", ""))[0], m.group(2))
    assert results, f"lit ran nothing (exit {proc.returncode}):\n{out[-3000:]}\n{proc.stderr[-2000:]}"
    return results


@pytest.mark.parametrize("case", CASES)
def test_lit(lit_results, case):
    code, output = lit_results.get(case, ("NOT RUN", ""))
    assert code == "PASS", f"{case}: {code}\n{output[-6000:]}"


def _client(sock, *cmd, **kw):
    return subprocess.run([sys.executable, "-S", str(FORKSERVER), str(sock), *cmd], capture_output=True, text=True, timeout=120, **kw)


def test_forkserver_relays_stdio_cwd_env_and_exit_status(forkserver, tmp_path):
    """A RUN line through the fork server sees what a fresh process would: its argv, stdin, working
    directory and environment; its stdout/stderr reach the caller's; its exit status and a killing
    signal come back (lit's `not`, pipes and redirections depend on all of them)."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import os, signal, sys\n"
        "print('argv', sys.argv[1:], 'cwd', os.getcwd(), 'env', os.environ.get('PROBE'), 'in', sys.stdin.read())\n"
        "print('to stderr', file=sys.stderr)\n"
        "if sys.argv[1] == 'kill':\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "sys.exit(int(sys.argv[1]))\n"
    )
    run = _client(forkserver, "python", str(script), "3", "x y", input="stdin text", cwd=tmp_path, env={"PROBE": "p-value", "PATH": os.environ["PATH"]})
    assert run.returncode == 3, run.stderr
    assert run.stdout == f"argv ['3', 'x y'] cwd {tmp_path} env p-value in stdin text\n"
    assert run.stderr == "to stderr\n"
    killed = _client(forkserver, "python", str(script), "kill")
    assert killed.returncode == -15, (killed.returncode, killed.stderr)
    missing = _client(forkserver, "llmc-opt", str(tmp_path / "missing.pt2"), "--pipeline")
    assert missing.returncode == 2 and missing.stderr.strip() == f"llmc-opt: error: {tmp_path / 'missing.pt2'}: no such file", missing.stderr
