"""runtime/vulkan_probe.py against `vulkaninfo` on the same machine: every device, every field.

The comparison covers the VulkanDevice fields and, below them, every member of every struct the probe
reads (VkPhysicalDeviceLimits, VkPhysicalDeviceFeatures, the Vulkan 1.1/1.2 feature structs, ...), in
vulkaninfo's order, which is vulkan_core.h's: a member out of place or a wrong sType shows up as a
name or value mismatch. Skipped where no Vulkan loader/driver or no vulkaninfo binary is installed."""

import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmc.runtime import vulkan_probe
from llmc.runtime.vulkan_probe import VulkanDevice, VulkanUnavailable, probe

pytestmark = pytest.mark.vulkan_exclusive  # vulkaninfo runs in a child process (conftest: the lock)

ROOT = Path(__file__).resolve().parents[2]
DEVICE_TYPES = {
    "PHYSICAL_DEVICE_TYPE_OTHER": 0,
    "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU": 1,
    "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU": 2,
    "PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU": 3,
    "PHYSICAL_DEVICE_TYPE_CPU": 4,
}


@pytest.fixture(scope="module")
def devices():
    try:
        return probe()
    except VulkanUnavailable as e:
        pytest.skip(f"no Vulkan here: {e}")


@pytest.fixture(scope="module")
def raw(devices):
    return vulkan_probe._query(vulkan_probe.LIBVULKAN)


def parse_vulkaninfo(text: str) -> list[dict]:
    """vulkaninfo's text output, from 'Device Properties and Extensions', as one dict per GPU:
    section name -> {member: value string, or a list of item strings for `name: count = N` members};
    "Device Extensions" -> list of extension names."""
    gpus: list[dict] = []
    lines = text.split("\n")
    try:
        start = next(i for i, l in enumerate(lines) if l.startswith("Device Properties and Extensions"))
    except StopIteration:
        pytest.fail("vulkaninfo printed no 'Device Properties and Extensions' section")
    section = None
    current_list = None
    for i in range(start + 1, len(lines)):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if re.fullmatch(r"GPU\d+:", line):
            gpus.append({})
            section = current_list = None
        elif not gpus or not line.strip() or re.fullmatch(r"[-=]+", line):
            continue
        elif not line.startswith("\t"):  # a top-level heading
            current_list = None
            if line.startswith("Device Extensions:"):
                section = gpus[-1].setdefault("Device Extensions", [])
            elif line.endswith(":") and re.fullmatch(r"[-=]+", nxt):
                section = gpus[-1].setdefault(line[:-1], {})
            else:
                section = None
        elif isinstance(section, list):  # "\tVK_KHR_foo : extension revision N"
            section.append(line.split(":")[0].strip())
        elif isinstance(section, dict):
            depth = len(line) - len(line.lstrip("\t"))
            body = line.strip()
            if depth == 1:
                current_list = None
                m = re.fullmatch(r"(\w+): count = \d+", body)
                if m:
                    current_list = section[m[1]] = []
                elif " = " in body:
                    key, value = body.split(" = ", 1)
                    section[key.strip()] = value.strip()
                elif body.endswith(":"):  # a nested struct (conformanceVersion:) -- not one we compare
                    section[body[:-1]] = None
            elif depth == 2 and current_list is not None:
                current_list.append(body)
    return gpus


@pytest.fixture(scope="module")
def vulkaninfo(devices):
    exe = shutil.which("vulkaninfo")
    if exe is None:
        pytest.skip("vulkaninfo is not installed (apt: vulkan-tools)")
    p = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"vulkaninfo failed ({p.returncode}): {p.stderr[-2000:]}"
    gpus = parse_vulkaninfo(p.stdout)
    assert gpus, "no GPU sections parsed from vulkaninfo"
    return gpus


def section(gpu: dict, name: str) -> dict | None:
    """vulkaninfo names a struct by its core name, or with EXT/KHR where the device has it as an extension."""
    for n in (name, name + "EXT", name + "KHR"):
        if n in gpu:
            return gpu[n]
    return None


def _paren_or_plain(s: str) -> str:
    m = re.search(r"\((\d+)\)$", s)  # "1.3.230 (4206822)": the raw number
    return m[1] if m else s


def _number(s: str):
    s = _paren_or_plain(s)
    if s in ("true", "false"):
        return int(s == "true")
    if s in DEVICE_TYPES:
        return DEVICE_TYPES[s]
    if re.fullmatch(r"0x[0-9a-fA-F]+", s):
        return int(s, 16)
    if re.fullmatch(r"-?\d+", s):
        return int(s)
    return float(s)


def _same(expected, actual, where: str):
    if isinstance(expected, list):
        if isinstance(actual, list):
            assert len(expected) == len(actual), f"{where}: vulkaninfo {expected}, probe {actual}"
            for j, (e, a) in enumerate(zip(expected, actual)):
                _same(e, a, f"{where}[{j}]")
        elif all(re.fullmatch(r"SAMPLE_COUNT_(\d+)_BIT", e) for e in expected):  # sample-count flags
            assert actual == sum(int(re.fullmatch(r"SAMPLE_COUNT_(\d+)_BIT", e)[1]) for e in expected), (
                f"{where}: vulkaninfo {expected}, probe {actual:#x}")
        else:  # other flags, as names: as many bits as names
            assert bin(actual).count("1") == len(expected), f"{where}: vulkaninfo {expected}, probe {actual:#x}"
    elif isinstance(actual, str):
        if re.fullmatch(r"[0-9a-f]{32}", actual):  # a UUID
            assert expected.replace("-", "") == actual, f"{where}: vulkaninfo {expected}, probe {actual}"
        else:
            assert expected == actual, f"{where}: vulkaninfo {expected!r}, probe {actual!r}"
    elif isinstance(actual, float):
        assert math.isclose(_number(expected), actual, rel_tol=1e-6), f"{where}: vulkaninfo {expected}, probe {actual}"
    else:
        assert _number(expected) == actual, f"{where}: vulkaninfo {expected}, probe {actual}"


def test_same_devices_as_vulkaninfo(devices, vulkaninfo):
    assert len(devices) == len(vulkaninfo), f"probe found {len(devices)} devices, vulkaninfo {len(vulkaninfo)}"


def test_device_fields_match_vulkaninfo(devices, vulkaninfo):
    for d, gpu in zip(devices, vulkaninfo):
        props = gpu["VkPhysicalDeviceProperties"]
        assert d.name == props["deviceName"]
        assert d.api_version == props["apiVersion"].split()[0]
        assert d.vendor_id == int(props["vendorID"], 16)
        assert DEVICE_TYPES[props["deviceType"]] == {"other": 0, "integrated": 1, "discrete": 2, "virtual": 3, "cpu": 4}[d.device_type]
        assert d.max_compute_shared_memory == int(gpu["VkPhysicalDeviceLimits"]["maxComputeSharedMemorySize"])

        sub = section(gpu, "VkPhysicalDeviceSubgroupProperties")
        assert d.subgroup_size == (int(sub["subgroupSize"]) if sub else 0)
        ctl = section(gpu, "VkPhysicalDeviceSubgroupSizeControlProperties")
        assert d.min_subgroup_size == (int(ctl["minSubgroupSize"]) if ctl else d.subgroup_size)
        assert d.max_subgroup_size == (int(ctl["maxSubgroupSize"]) if ctl else d.subgroup_size)

        def feature(name, *sections):
            for s in sections:
                sec = section(gpu, s)
                if sec and name in sec:
                    return sec[name] == "true"
            return False

        core = gpu["VkPhysicalDeviceFeatures"]
        assert d.shader_int16 == (core["shaderInt16"] == "true")
        assert d.shader_int64 == (core["shaderInt64"] == "true")
        assert d.shader_float64 == (core["shaderFloat64"] == "true")
        assert d.shader_float16 == feature("shaderFloat16", "VkPhysicalDeviceVulkan12Features", "VkPhysicalDeviceShaderFloat16Int8Features")
        assert d.shader_int8 == feature("shaderInt8", "VkPhysicalDeviceVulkan12Features", "VkPhysicalDeviceShaderFloat16Int8Features")
        assert d.storage_buffer_8bit == feature("storageBuffer8BitAccess", "VkPhysicalDeviceVulkan12Features", "VkPhysicalDevice8BitStorageFeatures")
        assert d.storage_buffer_16bit == feature("storageBuffer16BitAccess", "VkPhysicalDeviceVulkan11Features", "VkPhysicalDevice16BitStorageFeatures")


def test_every_struct_member_matches_vulkaninfo(raw, vulkaninfo):
    """Each struct the probe reads, member by member: names in order (the layout), then values."""
    assert len(raw) == len(vulkaninfo)
    for i, (dev, gpu) in enumerate(zip(raw, vulkaninfo)):
        assert "VkPhysicalDeviceLimits" in dev and "VkPhysicalDeviceFeatures" in dev
        for name, members in dev.items():
            if name == "extensions":
                assert sorted(members) == sorted(gpu.get("Device Extensions", [])), f"GPU{i} device extensions differ"
                continue
            expected = section(gpu, name)
            assert expected is not None, f"GPU{i}: vulkaninfo has no {name} section"
            assert list(members) == list(expected), f"GPU{i} {name}: members differ from vulkaninfo's (layout?)"
            for member, value in members.items():
                _same(expected[member], value, f"GPU{i} {name}.{member}")


def test_subgroup_size_struct_chained_when_the_device_has_it(raw, vulkaninfo):
    for dev, gpu in zip(raw, vulkaninfo):
        has = section(gpu, "VkPhysicalDeviceSubgroupSizeControlProperties") is not None
        assert ("VkPhysicalDeviceSubgroupSizeControlProperties" in dev) == has


def test_probe_is_cached(devices):
    before = vulkan_probe._probe.cache_info().hits
    again = probe()
    assert again == devices and again is not devices  # a fresh list each time, the same devices
    assert vulkan_probe._probe.cache_info().hits == before + 1


def test_missing_library_is_a_readable_error(monkeypatch):
    monkeypatch.setattr(vulkan_probe, "LIBVULKAN", "libvulkan-llmc-missing.so.1")
    for _ in range(2):  # raised every time, never cached
        with pytest.raises(VulkanUnavailable) as e:
            probe()
        msg = str(e.value)
        assert msg.startswith("libvulkan-llmc-missing.so.1 not found: install libvulkan1 and a Vulkan driver"), msg
        assert "mesa-vulkan-drivers" in msg and "\n" not in msg
    assert isinstance(e.value, RuntimeError)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses glibc's libc.so.6 as a library that is not Vulkan")
def test_a_library_that_is_not_a_vulkan_loader(monkeypatch):
    monkeypatch.setattr(vulkan_probe, "LIBVULKAN", "libc.so.6")
    with pytest.raises(VulkanUnavailable, match="no vkGetInstanceProcAddr"):
        probe()


def test_supports_subgroup_size():
    d = VulkanDevice(index=0, name="x", vendor_id=0, device_type="discrete", api_version="1.3.0", subgroup_size=32,
                     min_subgroup_size=16, max_subgroup_size=64, shader_float16=True, shader_int8=True,
                     shader_int16=True, shader_int64=True, shader_float64=False, storage_buffer_8bit=True,
                     storage_buffer_16bit=True, max_compute_shared_memory=65536)
    assert [n for n in (4, 8, 16, 32, 64, 128) if d.supports_subgroup_size(n)] == [16, 32, 64]
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.subgroup_size = 16


def test_cli_prints_json_lines(devices):
    p = subprocess.run([sys.executable, "-m", "llmc.runtime.vulkan_probe"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert [json.loads(l) for l in lines] == [dataclasses.asdict(d) for d in devices]


def test_imports_no_torch_numpy_or_iree():
    # Loaded from its file, without the llmc.runtime package (whose __init__ brings in module.py and numpy).
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('vulkan_probe', {str(ROOT / 'runtime' / 'vulkan_probe.py')!r})\n"
        "m = sys.modules['vulkan_probe'] = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "try:\n    m.probe()\nexcept m.VulkanUnavailable:\n    pass\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'numpy', 'iree')))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
