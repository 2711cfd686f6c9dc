"""How many devices a module split over N devices (--tensor-parallel) gets at load, and the one-line
refusal when the machine has fewer (runtime/device.py more_devices)."""

import os
from types import SimpleNamespace

import pytest

from llmc.errors import RuntimeLoadError
from llmc.runtime import device


def _manifest(kind: str, n: int) -> dict:
    return {"target": {"name": kind, "device": kind, "arch": "gfx942" if kind == "hip" else "host", "devices": n},
            "runtime_device": "local-task" if kind == "local" else kind}


def test_a_gpu_module_split_over_more_devices_than_the_machine_has_is_refused(monkeypatch):
    monkeypatch.setattr(device, "_listed_devices", lambda driver: [{"device_id": 7, "path": "0", "name": "MI300X"}])
    with pytest.raises(RuntimeLoadError) as e:
        device.more_devices(_manifest("hip", 8), SimpleNamespace(device="dev0"), "m.vmfb")
    assert str(e.value) == ("m.vmfb: split over 8 devices (--tensor-parallel 8); this machine has 1 hip device(s); "
                            "recompile with --tensor-parallel 1 or run it where 8 are")


def test_cpu_modules_get_one_new_local_device_each_and_no_more_than_the_cores(monkeypatch):
    import iree.runtime as rt

    config = rt.Config("local-task")
    devices = device.more_devices(_manifest("local", 2), config, "m.vmfb")
    assert len(devices) == 2 and devices[0] is config.device and devices[1] is not config.device
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    with pytest.raises(RuntimeLoadError, match=r"split over 2 devices .* may use 1 CPU core\(s\); recompile with --tensor-parallel 1"):
        device.more_devices(_manifest("local", 2), config, "m.vmfb")
    assert device.more_devices(_manifest("local", 1), config, "m.vmfb") == [config.device]


def test_after_a_loss_every_later_caller_gets_the_replacement_device(monkeypatch):
    import iree.runtime as rt

    monkeypatch.setattr(device, "_REPLACEMENTS", {})
    cached = device.shared_device("local-sync")
    assert cached is rt.get_device("local-sync")  # IREE's cached device until a loss
    new = device.shared_device("local-sync", replace=True)
    assert new is not cached and device.shared_device("local-sync") is new
    assert device.shared_device("local-task") is rt.get_device("local-task")  # other names keep theirs


@pytest.mark.parametrize("text,family,lost", [
    ("queue.c:2867: DATA_LOSS; [vkSignalSemaphore] VK_ERROR_DEVICE_LOST", "vulkan", True),
    ("queue.c:2867: DATA_LOSS; [vkSignalSemaphore] VK_ERROR_DEVICE_LOST", "local", True),
    ("Error creating vm context with modules: DATA_LOSS; while invoking native function hal.fence.await", "vulkan", True),
    ("Error creating vm context with modules: DATA_LOSS; while invoking native function hal.fence.await", "local", False),
    ("Error invoking function: RESOURCE_EXHAUSTED; out of memory", "vulkan", False),
])
def test_which_errors_are_a_lost_device(text, family, lost):
    assert device.is_device_lost(RuntimeError(text), family) is lost


def test_a_load_after_a_loss_opens_on_the_replacement_not_on_iree_s_cached_device(monkeypatch):
    """open_device(fresh=True), as Module._ensure_loaded calls it after a loss, replaces the device that
    every later open_device(fresh=False) gets; IREE's own cache (which keeps the lost one) is not asked."""
    import iree.runtime as rt

    from conftest import vulkan_or_skip

    vulkan_or_skip()
    monkeypatch.setattr(device, "_REPLACEMENTS", {})
    manifest = {"target": {"name": "vulkan", "device": "vulkan", "arch": "llvmpipe"}, "runtime_device": "vulkan"}
    cached = device.open_device(manifest, None, "m.vmfb").device
    assert cached is rt.get_device("vulkan")
    new = device.open_device(manifest, None, "m.vmfb", fresh=True).device
    later = device.open_device(manifest, None, "m.vmfb").device
    assert new is not cached and later is new
