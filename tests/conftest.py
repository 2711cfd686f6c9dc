import os

# No model hub here: transformers must never try the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def llmc_in_process(*args):
    """`llmc ARGS` run in this process (llmc.compiler.cli.main): exit code, stdout and stderr as a
    subprocess.CompletedProcess. For lists of error cases, where starting a Python with torch for each
    one would cost seconds apiece; the tests that check the real process (tracebacks, pipes, exit codes
    from the interpreter) keep using subprocesses."""
    import contextlib
    import io
    import subprocess

    from llmc.compiler import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in args])
        except SystemExit as e:  # argparse's own usage errors
            code = e.code if isinstance(e.code, int) else 2
    return subprocess.CompletedProcess(["llmc", *map(str, args)], code, out.getvalue(), err.getvalue())


def vulkan_or_skip():
    """Skip unless Mesa's lavapipe is usable; with LLMC_REQUIRE_VULKAN set (CI installs it), fail instead."""
    import pytest

    from llmc.runtime import vulkan_probe

    try:
        devices, why = vulkan_probe.probe(), "no lavapipe device"
    except vulkan_probe.VulkanUnavailable as e:
        devices, why = [], str(e)
    if not any("llvmpipe" in d.name for d in devices):
        if os.environ.get("LLMC_REQUIRE_VULKAN"):
            pytest.fail(f"LLMC_REQUIRE_VULKAN is set but lavapipe is not usable: {why}")
        pytest.skip(f"Mesa lavapipe not available ({why}); apt-get install mesa-vulkan-drivers libvulkan1")
