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
