"""A fork server for the lit suite's RUN lines: torch, torch.export and llmc imported once, each command
a fork of that warm process.

Why: every RUN line of tests/passes/ is a fresh Python (`%python X.py %t.pt2` exports a small program,
`llmc-opt %t.pt2 --pipeline ...` lowers it), and each spent ~7 s of its time on the first import of
torch and the first torch.export in a process (measured: a second export of the same program in one
process takes 0.03 s against 2.1 s for the first). With ~100 RUN lines that was 11 minutes of CI.

How: tests/passes/test_lit.py starts `python tests/forkserver.py serve SOCKET` and runs lit with
LLMC_LIT_FORKSERVER=SOCKET; lit.cfg.py then prefixes `%python` and `llmc-opt` with this file's client
(`python -S tests/forkserver.py SOCKET python|llmc-opt ARGS...`, stdlib only, ~20 ms to start). The
client hands the server its argv, working directory, environment and its own stdin/stdout/stderr file
descriptors (SCM_RIGHTS), so lit's pipes and redirections reach the command unchanged; a forked child
of the server runs the command and the client exits with the child's status (a child killed by a
signal kills the client with the same signal). `lit tests/passes` run by hand, without the variable,
runs every command as its own process as before.

Protocol on a Unix stream socket: client sends an 8-byte big-endian length, then that many bytes of
JSON {"prog", "argv", "cwd", "env"}; the three descriptors ride with the first message. The server
replies with 4 bytes: the signed wait status as an exit code (negative: the signal that ended it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

PROGRAMS = ("python", "llmc-opt")


# ---- client (stdlib only: started with `python -S`) ----

def client(sock_path: str, prog: str, argv: list[str]) -> int:
    if prog not in PROGRAMS:
        print(f"forkserver: unknown program {prog!r} (one of {', '.join(PROGRAMS)})", file=sys.stderr)
        return 2
    body = json.dumps({"prog": prog, "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(sock_path)
        except OSError as e:
            print(f"forkserver: no server at {sock_path} ({e.strerror}); start one with `forkserver.py serve {sock_path}`", file=sys.stderr)
            return 2
        msg = struct.pack(">Q", len(body)) + body
        sent = socket.send_fds(s, [msg], [0, 1, 2])
        if sent < len(msg):
            s.sendall(msg[sent:])
        reply = _recv_exact(s, 4)
    code = struct.unpack(">i", reply)[0]
    if code < 0:  # the command was killed by a signal: end the same way, as a plain process would
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("forkserver: the server closed the connection before the command's status")
        buf += chunk
    return buf


# ---- server ----

def _warm_up() -> None:
    """Import what the RUN lines use and run one export + lowering, so that each fork starts warm.

    Everything is tiny on purpose: no tensor here is big enough for torch's intra-op (OpenMP) thread pool
    to start, and a process that used that pool cannot fork safely. The threads the server does have
    (one parked since `import torch`, one from MLIR) hold no lock while idle, as in any PyTorch
    DataLoader that forks its workers after importing torch."""
    import tempfile
    from pathlib import Path

    import torch
    import torch.export

    import llmc.tools.llmc_opt as llmc_opt  # noqa: F401  (imports llmc's compiler and passes)
    from llmc.compiler import export, lower, pipeline, targets

    class Tiny(torch.nn.Module):
        def forward(self, x, w):
            return torch.nn.functional.linear(x, w).softmax(-1)

    args = (torch.ones(2, 4), torch.ones(3, 4))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "warm.pt2")
        torch.export.save(torch.export.export(Tiny(), args), path)
        target = targets.resolve("cpu", None, "f32", allow_planned=True)
        plan = pipeline.build(target, only=None)
        lower.lower_module([lower.export_main(export.load_pt2(Path(path)), plan)], target, plan=plan)


def _run_command(prog: str, argv: list[str]) -> int:
    """In the forked child: run one command as `python SCRIPT ARGS` or `llmc-opt ARGS` would."""
    import runpy
    import traceback

    try:
        if prog == "llmc-opt":
            from llmc.tools.llmc_opt import main

            sys.argv = ["llmc-opt", *argv]
            code = main(argv)
        else:
            if not argv or argv[0].startswith("-"):
                print("forkserver: python needs a script path (no interpreter options)", file=sys.stderr)
                return 2
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:  # sys.exit("message"): printed, status 1, as the interpreter does
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    return code


def _session(conn: socket.socket, initial_seed: int) -> None:
    """A child of the server serving one client: receive the command, fork a worker, report its status."""
    msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    if len(fds) != 3 or len(msg) < 8:
        os._exit(3)
    (length,) = struct.unpack(">Q", msg[:8])
    body = msg[8:]
    while len(body) < length:
        chunk = conn.recv(length - len(body))
        if not chunk:
            os._exit(3)
        body += chunk
    req = json.loads(body)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server ignores it; this process waits for its worker
    pid = os.fork()
    if pid == 0:
        conn.close()
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        import torch

        torch.manual_seed(initial_seed)  # the RNG state a fresh process starts with
        code = _run_command(req["prog"], req["argv"])
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code & 0xFF if code >= 0 else 1)
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    conn.sendall(struct.pack(">i", code))
    conn.close()
    os._exit(0)


def serve(sock_path: str) -> None:
    import torch

    initial_seed = torch.initial_seed()
    _warm_up()
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # sessions are reaped by the kernel
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = sock_path + ".tmp"
    if os.path.exists(tmp):
        os.unlink(tmp)
    srv.bind(tmp)
    srv.listen(16)
    os.rename(tmp, sock_path)  # the socket appears only once the server is warm and listening
    while True:
        conn, _ = srv.accept()
        if os.fork() == 0:
            srv.close()
            _session(conn, initial_seed)
        conn.close()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) >= 3:
        sys.exit(client(sys.argv[1], sys.argv[2], sys.argv[3:]))
    else:
        print("usage: forkserver.py serve SOCKET | forkserver.py SOCKET python|llmc-opt ARGS...", file=sys.stderr)
        sys.exit(2)
