"""runtime/device.py's refusals that need no particular device: a Vulkan device without a shader
feature the module needs, no Vulkan loader at all, a module for another driver. And compiler/vmfb.py
on files that are not IREE modules (llmc info answers with one line, exit 2)."""

import json
import subprocess
import sys
import zipfile

import pytest

from llmc.compiler import vmfb
from llmc.errors import RuntimeLoadError
from llmc.runtime import device, vulkan_probe

TARGET = {"name": "vulkan", "arch": "rdna3", "device": "vulkan", "requires": {"subgroup_sizes": [32, 64], "float16": True, "float64": False}}


def _dev(**kw):
    base = dict(index=0, name="Test GPU", vendor_id=1, device_type="discrete", api_version="1.3.0", subgroup_size=32,
                min_subgroup_size=32, max_subgroup_size=64, shader_float16=True, shader_int8=True, shader_int16=True,
                shader_int64=True, shader_float64=True, storage_buffer_8bit=True, storage_buffer_16bit=True,
                max_compute_shared_memory=65536)
    return vulkan_probe.VulkanDevice(**{**base, **kw})


def test_device_without_float16_is_refused(monkeypatch):
    monkeypatch.setattr(vulkan_probe, "probe", lambda: [_dev(shader_float16=False)])
    with pytest.raises(RuntimeLoadError, match=r"m\.vmfb: the module needs shaderFloat16 \(f16 arithmetic\); the Vulkan device 'Test GPU' lacks it"):
        device.check_vulkan(TARGET, "Test GPU (driver 1.0)", "m.vmfb")
    monkeypatch.setattr(vulkan_probe, "probe", lambda: [_dev()])
    device.check_vulkan(TARGET, "Test GPU (driver 1.0)", "m.vmfb")  # the same device with f16: accepted


def test_subgroup_range_and_unlisted_device(monkeypatch):
    monkeypatch.setattr(vulkan_probe, "probe", lambda: [_dev(subgroup_size=16, min_subgroup_size=8, max_subgroup_size=16)])
    with pytest.raises(RuntimeLoadError, match=r"\(subgroup size 32/64\); the device 'Test GPU' has subgroup size 8\.\.16"):
        device.check_vulkan(TARGET, "Test GPU", "m.vmfb")
    with pytest.raises(RuntimeLoadError, match="the Vulkan device 'Other GPU' is not among those the Vulkan loader lists \\(Test GPU\\)"):
        device.check_vulkan(TARGET, "Other GPU", "m.vmfb")


def test_no_vulkan_loader_is_a_load_error(monkeypatch):
    def missing():
        raise vulkan_probe.VulkanUnavailable("libvulkan.so.1 not found: install libvulkan1")

    monkeypatch.setattr(vulkan_probe, "probe", missing)
    with pytest.raises(RuntimeLoadError, match="m.vmfb: cannot inspect the Vulkan device to check it fits the module: libvulkan.so.1 not found"):
        device.check_vulkan(TARGET, "Test GPU", "m.vmfb")


def test_module_for_another_driver_is_refused_before_iree():
    manifest = {"target": {"name": "hip", "arch": "gfx942", "device": "hip"}, "runtime_device": "hip"}
    with pytest.raises(RuntimeLoadError, match="compiled for hip:gfx942, which runs on IREE's hip driver, not 'cuda'; use --device=hip, or recompile with --target=cuda"):
        device.resolve_name(manifest, "cuda", "m.vmfb")


def test_not_an_iree_module(tmp_path):
    junk = tmp_path / "junk.vmfb"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="junk.vmfb: not an IREE module"):
        vmfb.inspect(junk)
    other = tmp_path / "other.vmfb"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(ValueError, match="other.vmfb: no module.fb inside; not an IREE module"):
        vmfb.inspect(other)
    other.with_suffix(".json").write_text(json.dumps({"target": {}}))
    r = subprocess.run([sys.executable, "-m", "llmc.compiler.cli", "info", str(other)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.strip().splitlines() == [
        f"llmc: error: {other}: no module.fb inside; not an IREE module"
    ]
