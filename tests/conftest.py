import fcntl
import os
import re

import pytest

# No model hub here: transformers must never try the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


# ---- Lavapipe beside the other worker (`make test` runs two pytest-xdist workers: CI has 2 cores) ----
# Lavapipe (Mesa's CPU Vulkan driver) runs its compute work on a thread pool as wide as the machine by
# default; a Vulkan cell once stalled for minutes while those threads shared the cores with the other
# worker. With LP_NUM_THREADS=0 (set here for the whole run, children included, unless set already)
# lavapipe runs each dispatch on the thread that submits it: no pool, nothing to contend for (checked:
# no llvmpipe-N threads in the process), and the tests' modules are small enough that one thread is
# quick (the dtype matrix's bf16 cell: 0.3-0.5 s to load and run either way). Then every test runs
# beside the other worker, none waits for the other's test to end: test_dtype_matrix.py and
# test_tensor_parallel.py on two workers took 189.8-194.1 s this way against 208.9 s with the lock.
# With LP_NUM_THREADS set to anything else, the old rule holds: each test holds a lock (flock on this
# file) shared for its whole run (setup, call, teardown: a module fixture's first setup included) and
# upgrades it to exclusive (waiting for the other worker's test to end) when it starts on lavapipe: at
# vulkan_or_skip(), or, in a test marked `vulkan` (any with "vulkan" in its id), at the first Vulkan
# device it opens in this process (llmc.runtime.device.shared_device), so that its compiles run beside
# the other worker. A test that runs lavapipe in a child process is marked `vulkan_exclusive`:
# exclusive from its start. Without xdist, or with LP_NUM_THREADS=0, nothing is locked.
_LOCK = {"fd": None, "mode": None, "lazy": False}
_LAVAPIPE_POOL = os.environ.setdefault("LP_NUM_THREADS", "0") != "0"  # False: lavapipe inline, no lock

# ---- Lavapipe's shader compiles without LLVM's optimizations ----
# Lavapipe compiles each shader with LLVM 15 (Mesa 22.3) on its first dispatch. On an AVX-512 host the
# narrow-weight matmul shaders of the dtype matrix took minutes each at LLVM's default level
# (SelectionDAG legalization; the rest in the coroutine split lavapipe's compute shaders go through):
# the vulkan bf16 / fp8 / int8 cells 412 / 562 / 785 s cold in a full run, ~25 minutes more than on an
# AVX2 host (docs/targets.md, "lavapipe's shader compiles on an AVX-512 host"). Mesa's
# GALLIVM_PERF=nopt skips the IR optimization passes and compiles with LLVM's fast instruction
# selection: the three cells 97 / 121 / 166 s cold in one process, and the 54 tests with vulkan, lavapipe
# or spirv in their id 612 s instead of 1252 s under -n 2 (one of them slower: 47 vs 18 s). What the
# tests check (IREE's SPIR-V, its numbers against eager) does not depend on how lavapipe optimizes.
# Set for the run, children included, unless set already.
os.environ.setdefault("GALLIVM_PERF", "nopt")


def pytest_configure(config):
    config.addinivalue_line("markers", "vulkan: runs on lavapipe in this process; under pytest-xdist it runs there while the other workers wait")
    config.addinivalue_line("markers", "vulkan_exclusive: runs on lavapipe in a child process; under pytest-xdist the other workers wait for all of it")
    if os.environ.get("PYTEST_XDIST_WORKER") and _LAVAPIPE_POOL:
        _lock_at_vulkan_devices()


def _lock_at_vulkan_devices() -> None:
    """Wrap llmc.runtime.device.shared_device (every Vulkan device llmc opens comes from it) so that a
    `vulkan` test takes the exclusive lock when it opens one."""
    from llmc.runtime import device

    opener = device.shared_device

    def shared_device(name, *args, **kwargs):
        if _LOCK["lazy"] and str(name).startswith("vulkan"):
            _lock(fcntl.LOCK_EX)
        return opener(name, *args, **kwargs)

    device.shared_device = shared_device


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "vulkan" in item.nodeid.lower() and not item.get_closest_marker("vulkan"):
            item.add_marker("vulkan")
    _slowest_files_first(items)


# ---- Slowest files first ----
# `make test` hands whole files to two workers (--dist loadfile) in collection order
# (--no-loadscope-reorder: xdist would otherwise order them by their number of tests). A long file
# taken last leaves the other worker idle until it ends; taken first, the short files fill in around
# it. tests/file_seconds.txt holds each file's seconds from a timed run (LLMC_TEST_TIMES, below); a
# file not listed counts as DEFAULT_FILE_SECONDS. Regenerate it after a full timed run with:
#   awk -F'\t' '{split($3, a, "::"); s[a[1]] += $1} END {for (f in s) printf "%.0f %s\n", s[f], f}' TIMES | sort -rn
FILE_SECONDS = os.path.join(os.path.dirname(__file__), "file_seconds.txt")
DEFAULT_FILE_SECONDS = 30.0


def _slowest_files_first(items) -> None:
    seconds = {}
    try:
        with open(FILE_SECONDS) as f:
            for line in f:
                if line.strip() and not line.startswith("#"):
                    value, path = line.split(None, 1)
                    seconds[path.strip()] = float(value)
    except OSError:
        return
    # stable: a file's tests keep their order, and stay together
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], DEFAULT_FILE_SECONDS))


def _lock(mode: int) -> None:
    if not _LAVAPIPE_POOL or not os.environ.get("PYTEST_XDIST_WORKER") or _LOCK["mode"] == fcntl.LOCK_EX:
        return  # lavapipe inline (LP_NUM_THREADS=0): nothing to be alone for, so nothing is locked
    if _LOCK["fd"] is None:
        _LOCK["fd"] = os.open(__file__, os.O_RDONLY)  # this file is the lock: it exists, nothing is left behind
    fcntl.flock(_LOCK["fd"], mode)  # shared -> exclusive: Linux drops the shared lock, then waits
    _LOCK["mode"] = mode


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _lock(fcntl.LOCK_EX if item.get_closest_marker("vulkan_exclusive") else fcntl.LOCK_SH)
    _LOCK["lazy"] = item.get_closest_marker("vulkan") is not None
    try:
        yield
    finally:
        _release_vulkan_devices()
        _LOCK["lazy"] = False
        if _LOCK["mode"] is not None:
            fcntl.flock(_LOCK["fd"], fcntl.LOCK_UN)
            _LOCK["mode"] = None


# ---- Vulkan devices let go after every test ----
# An open lavapipe device keeps two threads of IREE's runtime spinning inside lavapipe (clock_gettime in
# a loop; gdb on a worker) for as long as the device lives, idle or not: one Python process that had run
# one call burnt 1.05-1.09 s of CPU per 3 s asleep, 0.0 once the device was gone. IREE caches each
# device for the process (iree.runtime.system_setup), so each worker's first Vulkan test left CI's two
# cores half busy for the rest of the suite (docs/targets.md, "Running"). After each
# test the cached Vulkan devices are dropped; the device ends when the last module on it does (a
# module-scoped fixture's, at the end of its file).
def _release_vulkan_devices() -> None:
    import gc
    import sys

    setup = sys.modules.get("iree.runtime.system_setup")
    if setup is None:
        return
    devices = getattr(setup, "_GLOBAL_DEVICES_BY_URI", {})  # iree.runtime's private cache: absent in another version
    cached = [uri for uri in devices if uri.startswith("vulkan")]
    device = sys.modules.get("llmc.runtime.device")
    replaced = [n for n in getattr(device, "_REPLACEMENTS", {}) if n.startswith("vulkan")]
    if not cached and not replaced:
        return
    for uri in cached:
        del devices[uri]
    for name in replaced:
        del device._REPLACEMENTS[name]
    gc.collect()


# ---- Test times as they finish (LLMC_TEST_TIMES=FILE) ----
# pytest's --durations prints only when the whole run ends; a run stopped by a time limit prints
# nothing. With LLMC_TEST_TIMES set, each test appends "seconds<TAB>phase<TAB>node id" to that file the
# moment each phase ends (setup includes a module fixture's first build). Under xdist the controller
# writes (it receives every worker's reports; the workers see them too and stay quiet).
def pytest_runtest_logreport(report):
    path = os.environ.get("LLMC_TEST_TIMES")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):
        with open(path, "a") as f:
            f.write(f"{report.duration:.2f}\t{report.when}\t{report.nodeid}\n")


def hf_greedy(model, prompt, n):
    """transformers' greedy continuation of `prompt` (token ids) by n tokens, EOS ignored: the reference
    llmc's generate() is checked against."""
    import torch

    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def main_in_process(main, *args):
    """`main(ARGS)` of a command-line entry point (llmc's cli.main, a tool's main) run in this process:
    exit code, stdout and stderr as a subprocess.CompletedProcess. For lists of error cases and for
    tools whose own children do the work, where starting a Python with torch would cost seconds; the
    tests that check the real process (tracebacks, pipes, exit codes from the interpreter) keep using
    subprocesses."""
    import contextlib
    import io
    import subprocess

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse's own usage errors
            code = e.code if isinstance(e.code, int) else 2
    return subprocess.CompletedProcess([getattr(main, "__module__", "main"), *map(str, args)], code, out.getvalue(), err.getvalue())


def llmc_in_process(*args):
    """`llmc ARGS` run in this process (llmc.compiler.cli.main): main_in_process."""
    from llmc.compiler import cli

    return main_in_process(cli.main, *args)


PROGRESS = re.compile(r"^llmc: .+ (\.\.\. .*\d+\.\ds|(done|failed) after \d+\.\ds)$")


def message_lines(stderr: str) -> list[str]:
    """stderr's lines less the progress lines a phase over a second prints on a slow machine
    (compiler/progress.py: `llmc: graph passes ... 2.6s`, `llmc: graph passes failed after 3.3s`)."""
    return [ln for ln in stderr.strip().splitlines() if not PROGRESS.match(ln)]


def hf_eager(model, ids, dtype: str, kwargs: dict):
    """A Hugging Face model's eager output for llmc's --dtype: as it is for f32, else the model converted
    to the compute dtype with its inputs cast, as llmc exports it (compiler/export.py)."""
    import torch

    from llmc import dtypes
    from llmc.compiler import export

    if dtype != "f32":
        tdt = dtypes.compute_torch_dtype(dtype)
        model = export.CastInputs(export.convert_module(model, tdt), tdt)
    with torch.no_grad():
        return model(ids, **kwargs)


_LAVAPIPE: dict = {}  # the probe's answer, once per process: (usable, why not)


def vulkan_or_skip(lock: bool = True):
    """Skip unless Mesa's lavapipe is usable; with LLMC_REQUIRE_VULKAN set (CI installs it), fail instead.
    The calling test then runs alone under pytest-xdist (see _lock); lock=False in a `vulkan` test that
    compiles first: it runs alone from the first Vulkan device it opens."""
    from llmc.runtime import vulkan_probe

    if lock:
        _lock(fcntl.LOCK_EX)
    if not _LAVAPIPE:
        try:
            devices, why = vulkan_probe.probe(), "no lavapipe device"
        except vulkan_probe.VulkanUnavailable as e:
            devices, why = [], str(e)
        _LAVAPIPE["usable"], _LAVAPIPE["why"] = any("llvmpipe" in d.name for d in devices), why
    why = _LAVAPIPE["why"]
    if not _LAVAPIPE["usable"]:
        if os.environ.get("LLMC_REQUIRE_VULKAN"):
            pytest.fail(f"LLMC_REQUIRE_VULKAN is set but lavapipe is not usable: {why}")
        pytest.skip(f"Mesa lavapipe not available ({why}); apt-get install mesa-vulkan-drivers libvulkan1")


def rows_through(modules: dict, run):
    """(how many rows, dim 1 of its input, each of `modules` {key: nn.Module} saw on each call while `run()`
    ran, as {key: [rows, ...]}; run's result)."""
    seen = {key: [] for key in modules}
    hooks = [m.register_forward_hook(lambda mod, args, out, key=key: seen[key].append(args[0].shape[1]))
             for key, m in modules.items()]
    try:
        result = run()
    finally:
        for h in hooks:
            h.remove()
    return seen, result


def attention_calls(run):
    """(each F.scaled_dot_product_attention call made while `run()` ran, as (query rows, has a mask, causal);
    run's result). A one-query-row attention without a mask, causal or not, is the form IREE 3.13's GPU
    pipelines take minutes to compile (models/llama/model.py last_row_bias)."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    calls = []

    class Record(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention:
                mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
                calls.append((args[0].shape[-2], mask is not None, bool(kwargs.get("is_causal", False))))
            return func(*args, **kwargs)

    with Record(), torch.no_grad():
        result = run()
    return calls, result
