"""Load a compiled llmc module (.vmfb + .irpa + manifest) and call it with torch tensors or numpy arrays.

Imports iree.runtime only (never the compiler): a deployment needs the runtime wheel, torch and numpy.

    mod = load("out/model.vmfb")          # finds model.irpa and model.json beside it
    y = mod(x)                             # default entry point; torch tensors back
    ids = mod.generate([1, 2, 3])          # language models (runtime/generate.py)
    text = mod.generate_text("Hello")      # ... with the checkpoint's tokenizer (runtime/tokenizer.py)

Inputs are checked against the manifest's signature (shape, dtype, folded constants) with a clear
error before IREE sees them. bf16 crosses the boundary as bf16 (ml_dtypes on the numpy side).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from pathlib import Path

import numpy as np

from llmc.errors import InputError, RuntimeCallError, RuntimeLoadError
from llmc import dtypes
from llmc.runtime import weights as weights_mod
from llmc.runtime import device as device_mod
from llmc.runtime.device import caller_yields_to_workers, first_line, is_device_lost, more_devices

log = logging.getLogger("llmc.runtime")
_CPU_DATA_READY = False  # IREE's process-wide CPU data is filled in (Module._warm_cpu_data)

PARAM_SCOPE = "model"

# LLVM feature names (as recorded in the manifest) -> /proc/cpuinfo flag names, where they differ.
_CPUINFO_NAME = {
    "sse3": "pni",  # "prescott new instructions"
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16",
    "avx512fp16": "avx512_fp16",
    "avx512vbmi2": "avx512_vbmi2",
    "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq",
    "avxvnni": "avx_vnni",
    "amx-tile": "amx_tile",
    "amx-int8": "amx_int8",
    "amx-bf16": "amx_bf16",
    "pclmul": "pclmulqdq",
}
# The features whose absence makes code fault (SIGILL); others in LLVM's list are not worth a refusal.
_CHECKED_FEATURES = (
    "sse4.1 sse4.2 avx avx2 fma f16c avx512f avx512cd avx512bw avx512dq avx512vl avx512vnni "
    "avx512bf16 avx512fp16 avx512vbmi avx512vbmi2 avx512ifma avxvnni amx-tile amx-int8 amx-bf16"
).split()


def host_cpu_flags() -> set[str] | None:
    """This machine's CPU flags from /proc/cpuinfo, or None where that file doesn't exist."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def host_has(have: set[str] | None, feature: str) -> bool:
    """Whether /proc/cpuinfo's flags `have` include an LLVM-named feature."""
    return have is not None and _CPUINFO_NAME.get(feature, feature) in have


def chosen_variant(variants, has) -> str | None:
    """The CPU whose code IREE runs, of a module built for several ((cpu, required features) best
    first, the manifest's `cpu_variants`), on a machine where `has(feature)` tells what it has: the
    first whose features it all has (the last requires none). None if there are no variants."""
    for cpu, features in variants:
        if all(has(f) for f in features):
            return cpu
    return None


def missing_cpu_features(required: list[str], have: set[str] | None) -> list[str]:
    if have is None:
        return []
    return [f for f in required if f in _CHECKED_FEATURES and _CPUINFO_NAME.get(f, f) not in have]


def queues_steps_ahead(manifest: dict) -> bool:
    """Whether generate()'s greedy steps on this module can be queued one ahead (runtime/generate.py
    GreedySteps): its decode step has a greedy twin that writes its token into a buffer of the caller's
    (compiler/greedy.py; the record names next_token_input)."""
    from llmc.runtime.generate import queueable_twin

    llm = manifest.get("llm") or {}
    return queueable_twin((llm.get("decode_static") or llm.get("decode") or {}).get("greedy"))


def _find_companions(vmfb: Path) -> tuple[Path, Path | None]:
    manifest = vmfb.with_suffix(".json")
    irpa = vmfb.with_suffix(".irpa")
    if not manifest.exists():
        raise RuntimeLoadError(f"{manifest}: manifest not found beside {vmfb.name}; llmc.load needs the .json llmc wrote")
    return manifest, irpa if irpa.exists() else None


class EntryPoint:
    """One exported function: signature checking, conversion in and out, and the call."""

    def __init__(self, module: "Module", name: str, spec: dict):
        self._module = module  # the module does not point back: no reference cycle (see Module)
        self.name = name
        self.spec = spec

    def _function(self):
        return self._module.function(self.spec.get("function", self.name))

    def _flatten(self, args, kwargs):
        import torch.utils._pytree as pytree

        import torch

        # A list of plain numbers is one (wrong) argument, not many: keep it whole for the error.
        plain = lambda x: isinstance(x, list) and x and not any(isinstance(i, (torch.Tensor, np.ndarray, list, tuple, dict)) for i in x)
        leaves, _ = pytree.tree_flatten_with_path((tuple(args), dict(kwargs)), is_leaf=plain)
        return [(pytree.keystr(p), v) for p, v in leaves]

    def convert_inputs(self, args, kwargs) -> list:
        """Check the call against the manifest signature; returns numpy arrays for IREE."""
        import torch

        expected = self.spec["inputs"]
        given = dict(self._flatten(args, kwargs))
        unknown = [p for p in given if p not in {e["path"] for e in expected}]
        if unknown:
            raise InputError(
                f"{self.name}: unexpected argument(s) {', '.join(unknown)}; the module was compiled for "
                f"{self.signature_text()}"
            )
        arrays = []
        for i, e in enumerate(expected):
            where = f"{self.name}: input {e['name']!r} ({e['path']})" if e.get("name") else f"{self.name}: input {e['path']}"
            if e["path"] not in given:
                raise InputError(f"{where} is missing; the module was compiled for {self.signature_text()}")
            v = given[e["path"]]
            if e["kind"] == "constant":
                if isinstance(v, torch.Tensor) or v != e["value"]:
                    raise InputError(
                        f"{where} was folded into the module as the constant {e['value']!r} at compile time; "
                        f"got {v!r}. Pass {e['value']!r}, or recompile with this value"
                    )
                continue
            arrays.append(self._check_tensor(where, e, v))
        return arrays

    def _check_tensor(self, where: str, e: dict, v):
        import torch

        if isinstance(v, torch.Tensor):
            dtype_name = str(v.dtype).removeprefix("torch.")
            arr = dtypes.to_numpy(v)
        elif isinstance(v, np.ndarray) or np.isscalar(v):
            arr = np.ascontiguousarray(v)
            dtype_name = dtypes.numpy_name(arr)
        else:
            raise InputError(f"{where}: expected a torch tensor or numpy array, got {type(v).__name__}")
        if dtype_name == "bfloat16" and e["dtype"] == "float32" and self._module.widens_bf16_inputs:
            # --dtype bf16 computed in f32 (cpu, SPIR-V): a bf16 input, as eager bf16 takes, widened exactly.
            arr, dtype_name = dtypes.to_numpy(v.float()), "float32"
        if dtype_name != e["dtype"]:
            raise InputError(f"{where}: expected dtype {e['dtype']}, got {dtype_name} (shape {list(arr.shape)})")
        shape = list(arr.shape)
        want = e["shape"]
        ok = len(shape) == len(want) and all(
            (isinstance(w, int) and w == s) or (isinstance(w, dict) and w["min"] <= s <= w["max"])
            for w, s in zip(want, shape)
        )
        if not ok:
            raise InputError(f"{where}: expected shape {shape_text(want)}, got {shape}")
        return arr

    def signature_text(self) -> str:
        parts = []
        for e in self.spec["inputs"]:
            if e["kind"] == "constant":
                parts.append(f"{e['path']}={e['value']!r}")
            else:
                parts.append(f"{e['path']}: {e['dtype']}{shape_text(e['shape'])}")
        return "(" + ", ".join(parts) + ")"

    def call_raw(self, arrays: list):
        for retries_left in (2, 1, 0):
            try:
                function = self._function()  # loads the module first: IREE's workers start outside the switch below
                with caller_yields_to_workers(self._module.device_driver == "local-task"):
                    return function(*arrays)
            except Exception as e:
                # A Vulkan device lost during a call (lavapipe's timeline emulation and IREE 3.13's unlocked
                # queue wakeup, see _ensure_loaded) stays lost. When every input is a host array, nothing of
                # the call lived on that device: run it once more on a new one, twice at most (as a load is
                # retried; one retry lost its device again in a full local run, docs/targets.md). Device-
                # resident inputs (a KV cache from an earlier call) are gone with the device, so those calls
                # fail. A load that failed has had its own retry.
                if not retries_left or isinstance(e, RuntimeLoadError) or not is_device_lost(e, self._module.device_family) or not all(isinstance(a, np.ndarray) for a in arrays):
                    raise RuntimeCallError(f"{self.name}: IREE failed while running the module: {str(e).splitlines()[0]}") from e
                log.warning("%s: the Vulkan device was lost while running %s (%s); running it once more on a new device",
                            self._module.vmfb, self.name, first_line(e))
                self._module.close()
                self._module._device_lost = True

    def __call__(self, *args, **kwargs):
        arrays = self.convert_inputs(args, kwargs)
        result = self.call_raw(arrays)
        return self._module._unflatten(self.spec["outputs"], _as_list(result))


def _as_list(result) -> list:
    if result is None:
        return []
    if isinstance(result, (list, tuple)):
        return list(result)
    return [result]


def shape_text(shape: list) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) else f"{d['name']}:{d['min']}..{d['max']}" for d in shape) + "]"


class Module:
    """A loaded llmc module. Call it like the PyTorch model; entry points are attributes too.

    IREE's objects are freed when the Module is: nothing here (nor in its entry points) forms a
    reference cycle, so they go by reference count, in order (functions, context, device), not
    whenever Python's cycle collector gets to them in whatever order it picks. A collector pass that
    freed a Vulkan module's context midway through an unrelated call crashed the process (seen in
    CI: "Fatal Python error: Segmentation fault ... Garbage-collecting"); iree.runtime's own
    load_vm_modules builds such a cycle (SystemContext <-> BoundModule), so it is not used.
    `close()` (or `with llmc.load(...) as mod:`) frees them at a chosen point; the next call loads again.
    """

    def __init__(self, vmfb: Path, *, device: str | None = None, threads: int | None = None, weights: str = "auto"):
        self.vmfb = Path(vmfb)
        if not self.vmfb.exists():
            raise RuntimeLoadError(f"{self.vmfb}: no such file")
        manifest_path, self.params = _find_companions(self.vmfb)
        try:
            self.manifest = json.loads(manifest_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise RuntimeLoadError(f"{manifest_path}: not a readable llmc manifest ({e})") from e
        if self.manifest.get("params") and self.params is None:
            raise RuntimeLoadError(
                f"{self.vmfb.with_suffix('.irpa')}: parameter archive not found; the module's weights live there"
            )
        self._module_file = self.vmfb  # the .vmfb this CPU runs: another for an artifact with one module per CPU
        self._check_cpu()
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise RuntimeLoadError(f"threads={threads!r}: give a whole number of worker threads, 1 or more (or None for IREE's default)")
        self.threads = threads
        self.device_name = device or self._default_device()
        # threads=1 moved to local-task by _default_device (steps queued ahead): a one-worker device of its own,
        # so that no process-wide worker count is set for the local-task modules loaded after it
        self._one_worker = device is None and threads == 1 and self.device_name == "local-task"
        self.device_family = self.manifest.get("target", {}).get("device", "local")  # runtime/device.py DRIVERS
        self.weights_mode = weights_mod.check_mode(weights)
        # Where the weights live once loaded ("mmap" or "memory", runtime/weights.py) and why; None before.
        self.weights = self.weights_reason = None
        # IREE's own memory from the load asked into 2 MB pages (runtime/weights.py huge_pages_for_new_memory):
        # (bytes, how) on a CPU device once loaded, else None.
        self.iree_huge_pages = None
        self._loaded = None  # _Loaded: IREE's context, main module and device, once the module is loaded
        self._device_lost = False  # the last device was lost: the next load opens a new one
        self._tokenizer = None
        self.last_generation = None  # the last generate() / generate_text() run (runtime/generate.py: Generation)
        self.default_entry = self.manifest.get("default_entry", next(iter(self.manifest["entry_points"])))

    def _default_device(self) -> str:
        """The manifest's device, except one thread on a CPU module for one device: IREE's local-sync.

        local-sync runs every dispatch on the calling thread; local-task with one worker hands each
        call to that worker and waits for it, and hands each dispatch on through its task system.
        The same work, less around it: a 12-layer dim-128 Llama's decode call 0.43 -> 0.30 ms,
        small-125m bf16 decode 107.9 -> 109.6 tok/s by the medians, 1.075x by the median of per-round
        ratios (docs/targets.md, "One thread: local-sync"). A module
        split over several devices (--tensor-parallel) keeps local-task: local-sync devices would
        all run on the one calling thread, one after another.

        Except a language model whose greedy steps can be queued ahead (runtime/generate.py GreedySteps),
        where this process may use two CPUs or more: local-sync runs a call inside the invoke, so nothing
        could be queued behind it, while on local-task the calling thread records and submits step n + 1 on
        another CPU while the one worker runs step n (small-125m bf16 greedy decode 1.047x local-sync's,
        docs/targets.md "Steps queued ahead"). Sampled steps (temperature > 0) on such a module lose
        local-sync's edge.
        """
        name = self.manifest.get("runtime_device", "local-task")
        target = self.manifest.get("target", {})
        if self.threads == 1 and name == "local-task" and int(target.get("devices", 1)) == 1:
            return "local-task" if queues_steps_ahead(self.manifest) and device_mod.usable_cpus() >= 2 else "local-sync"
        return name

    @property
    def entry_points(self) -> dict[str, EntryPoint]:
        """name -> EntryPoint (made on each access: entry points point to the module, not back)."""
        return {name: EntryPoint(self, name, spec) for name, spec in self.manifest["entry_points"].items()}

    def _check_cpu(self):
        target = self.manifest.get("target", {})
        if target.get("backend") != "llvm-cpu":
            return
        if target.get("machine") and target["machine"] != platform.machine():
            raise RuntimeLoadError(
                f"{self.vmfb}: compiled for {target['machine']}, this machine is {platform.machine()}; recompile here"
            )
        if target.get("cpu_modules"):
            chosen = self.cpu_variant
            module = self.vmfb.with_name(self.vmfb.stem + target["cpu_modules"].get(chosen, ".vmfb"))
            if not module.is_file():
                raise RuntimeLoadError(
                    f"{module}: the {chosen} module of an artifact built for several CPUs is missing; keep it beside "
                    f"{self.vmfb.name} (this CPU runs it) or recompile"
                )
            self._module_file = module
        elif target.get("cpu_variants"):
            probe = self.vmfb.with_name(target.get("cpu_probe") or self.vmfb.stem + ".cpu-probe.vmfb")
            if not target.get("cpu_probe") or not probe.is_file():
                raise RuntimeLoadError(
                    f"{probe}: the CPU probe of a module built for several CPUs is missing; keep it beside "
                    f"{self.vmfb.name} (it picks the CPU's variant) or recompile"
                )
        missing = missing_cpu_features(target.get("cpu_features", []), host_cpu_flags())
        if missing:
            raise RuntimeLoadError(
                f"{self.vmfb}: compiled for --arch={target.get('arch')} which needs {', '.join(missing)}; "
                "this CPU lacks them; recompile with --arch host"
            )

    def _ensure_loaded(self) -> "_Loaded":
        if self._loaded is None:
            import iree.runtime as rt

            if self.threads and self.device_driver == "local-task" and not self._one_worker:
                rt.flags.parse_flags(f"--task_topology_group_count={int(self.threads)}")
            from llmc.runtime.device import is_device_lost, one_worker_task_device, open_device

            # Up to two new devices: under load the loss was seen twice in a row (a CI run, once a
            # full local run), never three times.
            attempts = (self._device_lost, True, True)
            # what is resident before the device and the module (IREE's allocator maps memory for both);
            # no snapshot where nothing would be moved (not a CPU device, LLMC_HUGE_PAGES=off, THP mode)
            local = self.device_driver in weights_mod.LOCAL_DRIVERS
            skipped = weights_mod.huge_pages_skipped() if local else None
            before = weights_mod.populated_chunks() if local and not skipped else None
            for attempt, fresh in enumerate(attempts):
                config = (rt.Config(device=one_worker_task_device()) if self._one_worker
                          else open_device(self.manifest, self.device_name, self.vmfb, fresh=fresh))
                self._warm_cpu_data(config)
                try:
                    self._loaded = self._load_on(config)
                    self._device_lost = False
                    break
                except Exception as e:
                    if attempt == len(attempts) - 1 or not is_device_lost(e, self.device_family):
                        raise RuntimeLoadError(f"{self.vmfb}: IREE could not load the module: {first_line(e)}") from e
                    # Seen on lavapipe under CPU load, at queue.c:2867 of IREE 3.13's Vulkan driver: its
                    # queue wakeup takes the next timeline value with an atomic add and host-signals it
                    # unlocked, so two threads can signal out of order, and Mesa's timeline emulation
                    # marks the device lost on a value that does not increase (docs/targets.md). A lost
                    # device stays lost and IREE caches one per name: load once more on a new device.
                    log.warning("%s: the Vulkan device was lost while loading (%s); retrying on a new device",
                                self.vmfb, first_line(e))
            if before is not None:
                self._huge_pages(before)
            elif skipped:
                self.iree_huge_pages = (0, skipped)
        return self._loaded

    def _huge_pages(self, before: set[int]) -> None:
        """Move what the load populated in 4 KB pages to 2 MB ones (runtime/weights.py): a decode step
        streams IREE's packed weights, and on this project's VMs a stream from 4 KB pages ran at 60-90%
        of one from 2 MB pages (f32 small-125m decode 54.2 -> 71.2 tok/s, docs/targets.md)."""
        start = time.perf_counter()
        self.iree_huge_pages = moved, how = weights_mod.huge_pages_for_new_memory(before)
        if moved:
            log.info("%s: %.2f GB of memory from the load %s into 2 MB pages in %.2f s", self.vmfb.name,
                     moved / 1e9, how, time.perf_counter() - start)
        else:
            log.info("%s: memory from the load left in its pages: %s", self.vmfb.name, how)

    def function(self, name: str):
        """IREE's invoker for the module function `name` (loads the module on first use)."""
        loaded = self._ensure_loaded()
        fn = loaded.functions.get(name)
        if fn is None:
            import iree.runtime as rt

            vm_function = loaded.main.lookup_function(name)
            if vm_function is None:
                raise RuntimeLoadError(f"{self.vmfb}: the module has no function {name!r}; the manifest does not match it, recompile")
            fn = loaded.functions[name] = rt.FunctionInvoker(loaded.context, loaded.config.device, vm_function)
        return fn

    def close(self) -> None:
        """Free the module's IREE state now (its device memory included); a later call loads it again."""
        loaded, self._loaded = self._loaded, None
        if loaded is not None:
            loaded.release()

    def __enter__(self) -> "Module":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def widens_bf16_inputs(self) -> bool:
        """A --dtype bf16 module computed in f32: its f32 inputs take bf16 tensors too."""
        return self.manifest.get("dtype") == "bf16" and self.manifest.get("compute_dtype") == "f32"

    @property
    def cpu_variant(self) -> str | None:
        """The CPU whose code runs here, for an artifact built for several (--arch portable); else None."""
        variants = self.manifest.get("target", {}).get("cpu_variants")
        if not variants:
            return None
        have = host_cpu_flags()
        return chosen_variant([(v["cpu"], v["requires"]) for v in variants], lambda f: host_has(have, f))

    def _warm_cpu_data(self, config) -> None:
        """Before a module with CPU variants is loaded: load its probe, so that IREE's CPU data is
        filled in before the module's variant conditions read it (compiler/cpu_variants.py). Once
        per process; without it every condition reads false and the slowest variant runs."""
        global _CPU_DATA_READY
        target = self.manifest.get("target", {})
        if _CPU_DATA_READY or not target.get("cpu_variants") or target.get("cpu_modules"):
            return
        import iree.runtime as rt

        probe = self.vmfb.with_name(target["cpu_probe"])
        try:
            loaded = _Loaded.create(config, [rt.create_hal_module(config.vm_instance, config.device),
                                             rt.VmModule.mmap(config.vm_instance, str(probe))])
            ones = np.ones(16, np.float32)
            fn = rt.FunctionInvoker(loaded.context, config.device, loaded.main.lookup_function("probe"))
            ok = np.array_equal(np.asarray(fn(ones, ones).to_host()), ones * 2)
            del fn
            loaded.release()
        except Exception as e:
            raise RuntimeLoadError(f"{probe}: IREE could not run the CPU probe: {first_line(e)}") from e
        if not ok:
            raise RuntimeLoadError(f"{probe}: the CPU probe computed a wrong sum; the module's CPU variants can't be trusted here")
        _CPU_DATA_READY = True
        log.info("%s: CPU variants %s; this CPU runs %s", self.vmfb.name,
                 ", ".join(v["cpu"] for v in target["cpu_variants"]), self.cpu_variant)

    def _load_on(self, config) -> "_Loaded":
        """The module in a new VM context with its parameters and the HAL on config's device."""
        import iree.runtime as rt

        modules = []
        resident = None
        if self.params is not None:
            self.weights, self.weights_reason = weights_mod.choose(
                self.weights_mode, self.manifest, self.device_driver, self.params.stat().st_size)
            if self.weights == "memory":
                resident = weights_mod.ResidentArchive(self.params)
                index = resident.index()
            else:
                index = rt.ParameterIndex()
                index.load(str(self.params))
            modules.append(rt.create_io_parameters_module(config.vm_instance, index.create_provider(scope=PARAM_SCOPE)))
        devices = more_devices(self.manifest, config, self.vmfb)
        if len(devices) > 1:
            modules.append(rt.create_hal_module(config.vm_instance, devices=devices))
        else:
            modules.append(rt.create_hal_module(config.vm_instance, config.device))
        modules.append(rt.VmModule.mmap(config.vm_instance, str(self._module_file)))
        loaded = _Loaded.create(config, modules)  # runs the module's initializers: IREE packs weights here, if it does
        loaded.devices = devices
        loaded.resident = resident
        return loaded

    def _unflatten(self, structure: dict, values: list):
        # Host copies (device memory is not ours to keep). A module-level builder, not a recursive
        # closure: one that names itself and captures self would make a cycle holding the Module.
        return _build(structure, iter([dtypes.to_torch(self.host(v)) for v in values]), self.vmfb)

    def host(self, value, dtype=None) -> np.ndarray:
        """A result's values on the host.

        dtype: the result's numpy dtype when the caller knows it (the manifest's). On a CPU device a result
        is host memory: with dtype given it is read through a mapping of its buffer and copied, without
        iree.runtime's per-call queries (`_is_mappable`, `_get_raw_dtype`: 0.06 of the 0.10 ms a decode
        step's logits took on small-125m; runtime/generate.py reads every step's row this way).

        Results that live in device memory IREE cannot map are copied through a staging buffer the
        device allocates: for small results (a decode step's logits) one kept per size and reused,
        since allocating or registering host memory costs more than the copy (cuda, H200: IREE's
        to_host of 64 KB logits 0.30 ms a call). iree.runtime's own copy imports an ordinary numpy
        array instead, which a Vulkan driver such as lavapipe refuses ("host allocation import pointer
        does not satisfy Vulkan minImportedHostPointerAlignment 4096"), so a large result goes through
        a fresh staging buffer on vulkan and through IREE's copy elsewhere.
        """
        if not hasattr(value, "to_host"):
            return np.asarray(value)
        if dtype is not None and self.device_driver in weights_mod.LOCAL_DRIVERS:
            view = value._buffer_view
            return np.array(view.map().asarray(view.shape, dtype))  # a copy: the mapping ends with this call
        if value.is_host_accessible or value._is_mappable():
            return value.to_host()
        if self.device_driver != "vulkan" and value._buffer_view.get_buffer().byte_length() > _Staging.MAX_BYTES:
            return value.to_host()
        return self._ensure_loaded().staging.copy(value)  # keeps the buffer only up to MAX_BYTES

    @property
    def device_driver(self) -> str:
        """The IREE driver name of the device this module runs on ("vulkan" for "vulkan://0")."""
        return self.device_name.split(":", 1)[0]

    @property
    def _device(self):
        return self._ensure_loaded().config.device

    @property
    def devices(self) -> list:
        """The IREE devices the module runs on, in its @__device_0..N-1 order (one unless it was
        compiled with --tensor-parallel N)."""
        return list(self._ensure_loaded().devices)

    def generate(self, prompt_ids, max_new_tokens: int = 32, **options) -> list[int]:
        """Generate `max_new_tokens` token ids after `prompt_ids` (a language-model module only).

        Greedy by default; `temperature`, `top_k`, `top_p` and `seed` select seeded sampling. Stops
        early at the model's end-of-sequence id unless `stop_at_eos=False`. The KV cache stays on the
        device for the whole call. Returns the new ids (the eos id included when it ends the run).
        """
        from llmc.runtime.generate import Generator

        gen = Generator(self)
        try:
            return gen.generate(prompt_ids, max_new_tokens, **options)
        finally:
            self.last_generation = gen.last

    @property
    def tokenizer(self):
        """The checkpoint's tokenizer, copied beside the module at compile time (runtime/tokenizer.py).

        Raises InputError when the checkpoint had none: use generate() with token ids then."""
        if self._tokenizer is None:
            from llmc.runtime import tokenizer

            self._tokenizer = tokenizer.load(self.vmfb, self.manifest)
        return self._tokenizer

    def generate_text(self, prompt: str, max_new_tokens: int = 32, *, chat: bool = False, on_text=None, **options) -> str:
        """Generate after a text prompt with the checkpoint's tokenizer; returns the new text.

        The prompt gets the tokenizer's BOS; chat=True renders tokenizer_config.json's chat template
        around it instead (one user message, the assistant's turn opened). on_text(piece) receives the
        text as it is generated, in complete UTF-8 characters; special tokens (end of turn, EOS) are
        not part of it. Other options are generate()'s (temperature, top_k, top_p, seed, stop_at_eos,
        on_token). `last_generation` has the ids and timings afterwards.
        """
        tok = self.tokenizer
        ids = tok.prompt_ids(prompt, chat=chat)
        stream = tok.stream(context=ids)
        pieces: list[str] = []
        user_on_token = options.pop("on_token", None)

        def emit(piece: str) -> None:
            if piece:
                pieces.append(piece)
                if on_text is not None:
                    on_text(piece)

        def on_token(t: int) -> None:
            emit(stream.push(t))
            if user_on_token is not None:
                user_on_token(t)

        self.generate(ids, max_new_tokens, on_token=on_token, **options)
        emit(stream.flush())
        self.last_generation.text = "".join(pieces)
        return self.last_generation.text

    def __getattr__(self, name):
        specs = self.__dict__.get("manifest", {}).get("entry_points", {})
        if name in specs:
            return EntryPoint(self, name, specs[name])
        raise AttributeError(f"llmc module {self.__dict__.get('vmfb')} has no entry point {name!r}")

    def __call__(self, *args, **kwargs):
        return EntryPoint(self, self.default_entry, self.manifest["entry_points"][self.default_entry])(*args, **kwargs)

    def __repr__(self):
        return f"<llmc.Module {self.vmfb.name} target={self.manifest.get('target', {}).get('name')} entries={list(self.manifest['entry_points'])}>"


def _build(s: dict, tensors, vmfb):
    """The output structure the manifest records, filled with `tensors` in order."""
    kind = s["type"]
    if kind == "tensor":
        t = next(tensors)
        if s.get("dtype") == "uint8" and str(t.dtype) == "torch.int8":
            # IREE's integers are signless: a uint8 result arrives as int8 holding the same bits.
            import torch

            return t.view(torch.uint8)
        return t
    if kind == "scalar":  # a Python number the program computed (x.item()), returned by IREE as a scalar
        t = next(tensors)
        return {"int": int, "float": float, "bool": bool}[s["python"]](t.item())
    if kind == "none":
        return None
    if kind == "constant":
        return s["value"]
    children = [_build(c, tensors, vmfb) for c in s["children"]]
    if kind == "tuple":
        return tuple(children)
    if kind == "list":
        return children
    if kind == "dict":
        return dict(zip(s["keys"], children))
    raise RuntimeLoadError(f"{vmfb}: unknown output structure {kind!r} in the manifest")


class _Loaded:
    """One VM context and what it runs on. Holds no reference back to the Module."""

    def __init__(self, config, context, main):
        self.config = config  # iree.runtime.Config: the VM instance and the device
        self.context = context  # iree.runtime.VmContext with [io_parameters,] hal, main
        self.main = main  # the main VmModule
        self.functions: dict = {}  # name -> iree.runtime.FunctionInvoker
        self.devices: list = [config.device] if config is not None else []  # @__device_0..N-1 (N > 1: --tensor-parallel)
        self.resident = None  # runtime/weights.ResidentArchive: the weights' memory, when not mapped from the .irpa
        self.staging = _Staging()  # host-visible buffers for small results (Module.host)
        self.spare_cache = None  # the KV cache the last generate() left, for the next one (runtime/generate.py)

    @classmethod
    def create(cls, config, modules: list) -> "_Loaded":
        """A VmContext over `modules` (the last is the main one), made directly: no SystemContext."""
        import iree.runtime as rt

        return cls(config, rt.VmContext(config.vm_instance, modules=modules), modules[-1])

    def release(self) -> None:
        """Drop IREE's objects users first: invokers, then the context, its modules, the device."""
        self.spare_cache = None
        self.functions.clear()
        self.staging = None
        self.devices = []
        self.context = None
        self.main = None
        self.config = None
        self.resident = None  # after the context and its parameter module, the last users of this memory

    def __del__(self):
        if self.context is not None:
            self.release()


class _Staging:
    """Host-visible buffers that devices allocated, for copying device arrays to the host: one per
    (device, size) kept for reuse, the newest MAX_KEPT of them, each with a timeline semaphore whose
    value counts its copies."""

    MAX_BYTES = 4 << 20  # results up to this size are staged through a kept buffer
    MAX_KEPT = 8

    def __init__(self):
        self.kept: dict = {}  # (id(device), nbytes) -> [device, buffer, semaphore, copies so far]

    def copy(self, value) -> np.ndarray:
        import iree.runtime as rt

        device, source = value._device, value._buffer_view.get_buffer()
        nbytes = source.byte_length()
        key = (id(device), nbytes)
        entry = self.kept.pop(key, None)
        if entry is None:
            buffer = device.allocator.allocate_buffer(
                memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
                allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED),
                allocation_size=nbytes,
            )
            entry = [device, buffer, device.create_semaphore(0), 0]
        _, buffer, sem, n = entry
        device.queue_copy(source, buffer, wait_semaphores=rt.HalFence.create_at(sem, n), signal_semaphores=rt.HalFence.create_at(sem, n + 1))
        rt.HalFence.create_at(sem, n + 1).wait()
        entry[3] = n + 1
        out = np.array(buffer.map().asarray(tuple(value.shape), value._get_raw_dtype()), copy=True)
        if nbytes <= self.MAX_BYTES:
            self.kept[key] = entry  # the newest last: dicts keep insertion order
            while len(self.kept) > self.MAX_KEPT:
                self.kept.pop(next(iter(self.kept)))
        return out


def load(path_or_artifact, device: str | None = None, *, threads: int | None = None, weights: str = "auto") -> Module:
    """Load a compiled module. `path_or_artifact`: the .vmfb path or an llmc.Artifact.

    threads: worker count of IREE's local-task device. IREE caches devices per process and the flag
    is process-global, so it takes effect for the first local-task module loaded in a process only.
    threads=1 on a CPU module for one device (without `device`) runs on IREE's local-sync device
    instead: the dispatches run on the calling thread (Module._default_device); or, for a language model
    whose greedy steps are queued ahead and a process with two CPUs or more, on a one-worker local-task
    device of its own (runtime/device.py one_worker_task_device). Either way the flag is not set, so a
    later threads=None load in the process gets IREE's default worker count.
    weights: where the weights live on a CPU device, "mmap" (mapped from the .irpa), "memory" (read
    into memory with huge pages: faster decode) or "auto" (memory where it pays and fits;
    runtime/weights.py). Module.weights says what was chosen, once loaded.
    """
    vmfb = getattr(path_or_artifact, "vmfb", path_or_artifact)
    return Module(Path(os.fspath(vmfb)), device=device, threads=threads, weights=weights)
