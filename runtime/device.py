"""The IREE device a module runs on: chosen from its manifest, checked against the module, opened.

    config = open_device(manifest, requested="vulkan://0", vmfb=path)   # an iree.runtime.Config

A module can only run on the HAL driver it was compiled for (llvm-cpu -> local-task/local-sync,
SPIR-V -> vulkan, rocm -> hip, cuda -> cuda); anything else is refused with the drivers that are
usable here, before IREE is asked. A SPIR-V module is also checked against the Vulkan device itself
(runtime/vulkan_probe.py): IREE runs a module built for another subgroup size with no error and
wrong results, so a device without one of the module's subgroup sizes, or without a shader feature
its dtype needs, is refused.

Device names: a driver ("vulkan", "local-task"), IREE's `driver://path` form, or `driver://N` for the
N-th device the driver lists (llmc's shorthand; IREE's Vulkan driver itself only takes paths).
"""

from __future__ import annotations

from llmc.errors import RuntimeLoadError

# The IREE device family in the manifest -> the runtime drivers that run it.
DRIVERS = {"local": ("local-task", "local-sync"), "vulkan": ("vulkan",), "hip": ("hip",), "cuda": ("cuda",)}
# A runtime driver -> the llmc targets that compile for it (for the hint in a refusal).
_TARGETS_FOR = {"local-task": "cpu", "local-sync": "cpu", "vulkan": "vulkan or xpu", "hip": "hip", "cuda": "cuda"}


def first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def usable_devices() -> list[str]:
    """IREE drivers this process can create a device with (a GPU driver whose library or device is
    missing is left out): what `--device` can name here."""
    import iree.runtime as rt

    out = []
    for name in rt.query_available_drivers():
        try:
            if rt.get_driver(name).query_available_devices():
                out.append(name)
        except Exception:  # the driver's library or device is missing on this machine
            continue
    return out or ["none"]


def _listed_devices(driver: str) -> list[dict]:
    import iree.runtime as rt

    try:
        return list(rt.get_driver(driver).query_available_devices())
    except Exception:
        return []


def _what(target: dict) -> str:
    return f"{target.get('name', '?')}:{target.get('arch', '?')}"


def resolve_name(manifest: dict, requested: str | None, vmfb) -> tuple[str, str, dict | None]:
    """(IREE device name to open, driver, the driver's entry for that device or None for local)."""
    target = manifest.get("target", {})
    family = target.get("device", "local")
    allowed = DRIVERS.get(family, (family,))
    name = requested or manifest.get("runtime_device") or allowed[0]
    driver, _, path = name.partition("://")
    if driver not in allowed:
        raise RuntimeLoadError(
            f"{vmfb}: compiled for {_what(target)}, which runs on IREE's {' or '.join(allowed)} driver, not {driver!r}; "
            f"use --device={allowed[0]}"
            + (f", or recompile with --target={_TARGETS_FOR[driver]} to run on {driver}" if driver in _TARGETS_FOR else "")
        )
    if driver.startswith("local"):
        return name, driver, None
    listed = _listed_devices(driver)
    if not listed:
        raise RuntimeLoadError(
            f"{vmfb}: compiled for {_what(target)}; no {driver} device here (usable here: {', '.join(usable_devices())})"
        )
    if not path:
        return name, driver, listed[0]
    if path.isdigit():
        if int(path) >= len(listed):
            raise RuntimeLoadError(f"--device={name}: this machine has {len(listed)} {driver} device(s), numbered from 0")
        entry = listed[int(path)]
        return f"{driver}://{entry['path']}", driver, entry
    for entry in listed:
        if entry.get("path") == path:
            return name, driver, entry
    known = ", ".join(f"{driver}://{i} ({e.get('name')})" for i, e in enumerate(listed))
    raise RuntimeLoadError(f"--device={name}: no such {driver} device; here: {known}")


def check_vulkan(target: dict, iree_name: str, vmfb) -> None:
    """Refuse a Vulkan device that lacks the module's subgroup size or a shader feature it needs."""
    from llmc.runtime import vulkan_probe

    needs = target.get("requires") or {}
    try:
        devices = vulkan_probe.probe()
    except vulkan_probe.VulkanUnavailable as e:
        raise RuntimeLoadError(f"{vmfb}: cannot inspect the Vulkan device to check it fits the module: {e}") from e
    matches = [d for d in devices if iree_name.startswith(d.name)]
    if not matches:
        raise RuntimeLoadError(
            f"{vmfb}: the Vulkan device {iree_name!r} is not among those the Vulkan loader lists "
            f"({', '.join(d.name for d in devices)}); cannot check it fits the module"
        )
    dev = matches[0]
    sizes = needs.get("subgroup_sizes") or []
    if sizes and not any(dev.supports_subgroup_size(n) for n in sizes):
        have = (
            str(dev.subgroup_size) if dev.min_subgroup_size == dev.max_subgroup_size
            else f"{dev.min_subgroup_size}..{dev.max_subgroup_size}"
        )
        raise RuntimeLoadError(
            f"{vmfb}: compiled for {_what(target)} (subgroup size {'/'.join(map(str, sizes))}); the device "
            f"{dev.name!r} has subgroup size {have}, and IREE would run the module with wrong results. "
            "Recompile for this device's --arch"
        )
    for need, have, what in (
        (needs.get("float16"), dev.shader_float16, "shaderFloat16 (f16 arithmetic)"),
        (needs.get("float64"), dev.shader_float64, "shaderFloat64 (f64 arithmetic)"),
    ):
        if need and not have:
            raise RuntimeLoadError(f"{vmfb}: the module needs {what}; the Vulkan device {dev.name!r} lacks it")


def is_device_lost(e: Exception, family: str = "vulkan") -> bool:
    """Whether IREE's error says the device was lost (it stays lost: only a new device helps).

    IREE 3.13's Vulkan driver reports the loss as DATA_LOSS. Where the driver itself saw it the text
    names VK_ERROR_DEVICE_LOST; where a fence or semaphore only carried the failure on (seen in CI:
    "Error creating vm context with modules: DATA_LOSS; while invoking native function
    hal.fence.await") it does not. On a Vulkan device both are a loss; elsewhere only the first.
    """
    text = str(e)
    return "VK_ERROR_DEVICE_LOST" in text or (family == "vulkan" and "DATA_LOSS" in text)


# name -> the device that replaced IREE's cached one for that name after a loss (shared_device).
_REPLACEMENTS: dict = {}


def shared_device(name: str, *, replace: bool = False):
    """This process's IREE device for `name`: IREE's cached one, or, once a loss replaced it, the new one.

    IREE caches one device per name for the process and a lost device stays in that cache, so after a
    loss every later load would start on it and fail once more. `replace=True` opens a new device
    and makes it the one every later caller gets.
    """
    import iree.runtime as rt

    if replace:
        _REPLACEMENTS[name] = rt.get_device(name, cache=False)
    return _REPLACEMENTS.get(name) or rt.get_device(name)


def open_device(manifest: dict, requested: str | None, vmfb, *, fresh: bool = False):
    """An iree.runtime.Config on the device the module should run on, after the checks above.

    `fresh` replaces the process's device for this name with a new one (after a loss, see
    shared_device and Module._ensure_loaded).
    """
    import iree.runtime as rt

    name, driver, entry = resolve_name(manifest, requested, vmfb)
    if driver == "vulkan":
        check_vulkan(manifest.get("target", {}), entry.get("name", ""), vmfb)
    try:
        if driver.startswith("local"):
            return rt.Config(name)
        return rt.Config(device=shared_device(name, replace=fresh))
    except Exception as e:
        raise RuntimeLoadError(
            f"device {name!r}: IREE could not create it ({first_line(e)}); usable here: {', '.join(usable_devices())}"
        ) from e


def more_devices(manifest: dict, config, vmfb) -> list:
    """The devices a module split over N devices (--tensor-parallel, the manifest's target.devices) runs
    on, in IREE's @__device_0..N-1 order: config's device first, then N - 1 more of the same driver.

    local-task: new devices of the driver (each with its own workers; `rt.get_device` would hand back
    the cached one). A GPU driver: the machine's next devices, in the driver's order."""
    import iree.runtime as rt

    n = int(manifest.get("target", {}).get("devices", 1))
    if n == 1:
        return [config.device]
    name, driver, _ = resolve_name(manifest, None, vmfb)
    if driver.startswith("local"):
        cores = usable_cpus()
        if n > cores:
            raise RuntimeLoadError(
                f"{vmfb}: split over {n} devices (--tensor-parallel {n}), each a local-task device with workers of its own; "
                f"this process may use {cores} CPU core(s); recompile with --tensor-parallel {cores} or fewer"
            )
        # Each from a driver of its own: local-task devices of one driver share its task executor (one
        # pool of --task_topology_group_count workers), so N of them would run one after another.
        from iree._runtime_libs._runtime import create_hal_driver

        return [config.device] + [create_hal_driver(driver).create_default_device() for _ in range(n - 1)]
    listed = _listed_devices(driver)
    if len(listed) < n:
        raise RuntimeLoadError(
            f"{vmfb}: split over {n} devices (--tensor-parallel {n}); this machine has {len(listed)} {driver} device(s); "
            f"recompile with --tensor-parallel {max(len(listed), 1)} or run it where {n} are"
        )
    d = rt.get_driver(driver)
    return [config.device] + [d.create_device(listed[i]["device_id"]) for i in range(1, n)]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


_ONE_WORKER = []  # the process's one-worker local-task device, made on first use


def one_worker_task_device():
    """A local-task device with one worker, from a driver of its own (a driver's devices share its task
    executor, sized by --task_topology_group_count when the driver is made), shared by every module that
    asks for it in this process. The flag is set to 1 only while this driver is made and then back to 0
    (IREE's default), so local-task devices made later get their usual worker count."""
    if not _ONE_WORKER:
        import iree.runtime as rt
        from iree._runtime_libs._runtime import create_hal_driver

        rt.flags.parse_flags("--task_topology_group_count=1")
        try:
            _ONE_WORKER.append(create_hal_driver("local-task").create_default_device())
        finally:
            rt.flags.parse_flags("--task_topology_group_count=0")
    return _ONE_WORKER[0]


CALLER_SCHED_ENV = "LLMC_CALLER_SCHED"  # "normal": leave the calling thread's scheduling as it is (A/B runs)


class caller_yields_to_workers:
    """While a call runs on IREE's local-task workers, the calling thread under SCHED_BATCH (Linux).

    The caller waits for the call's fence in IREE's semaphore wait (iree/async/semaphore.c): the worker
    that finishes the last dispatch posts the caller's notification (a futex wake) and then marks its
    timepoint completed; the caller, once woken, spins on that mark before it returns. Woken under
    SCHED_OTHER, the caller can preempt that worker on the worker's own core (it slept through the call,
    so it is owed CPU time) and then spins on a mark only the descheduled worker can write, until the
    scheduler moves one of them. On 2 cores with 2 workers that spin was ~40% of the calling thread's
    time in a small Llama's decode, the workers waited 1-2 ms a step for a core, and `perf sched` saw 70
    of 234 wakeups of the caller by a worker switch that worker out, still runnable, on its own core.
    A SCHED_BATCH thread does not preempt on wakeup: the worker writes the mark and goes to sleep, then
    the caller runs (1 such switch in 298 wakeups; the spin and the workers' wait for a core gone). Measured: docs/targets.md "The caller's wait". Only SCHED_OTHER is changed (a real-time or
    idle caller keeps its policy), and it is restored when the call returns; an unprivileged thread may
    switch between the two both ways (sched(7)). Anything that refuses the switch leaves the call as it
    was.
    """

    __slots__ = ("active", "previous")

    def __init__(self, active: bool):
        import os

        self.active = active and hasattr(os, "SCHED_BATCH") and os.environ.get(CALLER_SCHED_ENV, "batch") != "normal"
        self.previous = None

    def __enter__(self):
        if self.active:
            import os

            try:
                if os.sched_getscheduler(0) == os.SCHED_OTHER:
                    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
                    self.previous = os.SCHED_OTHER
            except OSError:
                self.previous = None
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            import os

            try:
                os.sched_setscheduler(0, self.previous, os.sched_param(0))
            except OSError:
                pass
            self.previous = None
        return False
