"""Calls into a loaded module are checked against the manifest signature before IREE sees them,
and a module that can't run here refuses to load with RuntimeLoadError.

One artifact for the whole file: the zoo `attention` model, dynamic in dim 1 (2..128).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import llmc
from llmc.compiler import diff_metrics
from llmc.errors import InputError, RuntimeCallError, RuntimeLoadError
from llmc.models import zoo
from llmc.runtime import module as rt_module

F32 = diff_metrics.TOLERANCES["f32"]
INPUT = "[0][0]"  # how the manifest (and the messages) name the first positional input


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    model, args, dynamic = zoo.build("attention")
    out = tmp_path_factory.mktemp("attention") / "attention.vmfb"
    art = llmc.compile(model, args, output=out, dynamic_shapes=dynamic)
    return model, args, art


@pytest.fixture(scope="module")
def mod(compiled):
    return llmc.load(compiled[2])


@pytest.mark.parametrize("threads", [0, -2, 1.5, True])
def test_thread_count_is_checked(compiled, threads):
    from llmc.errors import RuntimeLoadError

    with pytest.raises(RuntimeLoadError, match=r"threads=.*1 or more") as info:
        llmc.load(compiled[2], threads=threads)
    assert info.value.exit_code == 2


def test_one_thread_runs_on_local_sync_with_the_same_results(compiled, mod, tmp_path):
    """threads=1 runs on IREE's local-sync device (the dispatches on the calling thread), with the
    numbers local-task gives; an explicit device, another thread count or a module split over
    devices keeps the manifest's local-task."""
    model, _, art = compiled
    x = x_of(9, seed=3)
    one = llmc.load(art, threads=1)
    assert one.device_name == "local-sync"
    got = one(x)
    assert torch.equal(got, mod(x))  # the same executable, each workgroup's sums in the same order
    assert diff_metrics.compare("local-sync", got, eager(model, x), F32).max_rel <= 1e-5
    assert llmc.load(art, "local-task", threads=1).device_name == "local-task"
    assert llmc.load(art, threads=2).device_name == "local-task"
    # a module for two devices (--tensor-parallel 2): its two local-sync devices would run one after the other
    split = tmp_path / "split.vmfb"
    shutil.copy(art.vmfb, split)
    manifest = json.loads(art.vmfb.with_suffix(".json").read_text())
    manifest["target"]["devices"] = 2
    split.with_suffix(".json").write_text(json.dumps(manifest))
    if art.vmfb.with_suffix(".irpa").exists():
        shutil.copy(art.vmfb.with_suffix(".irpa"), split.with_suffix(".irpa"))
    assert llmc.load(split, threads=1).device_name == "local-task"


def x_of(seq: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, seq, 64, generator=torch.Generator().manual_seed(seed))


def eager(model, x):
    with torch.no_grad():
        return model(x)


def test_signature_recorded(compiled):
    """The checks below rely on this: one f32 input [1, seq:2..128, 64]."""
    (entry,) = compiled[2].read_manifest()["entry_points"].values()
    (inp,) = entry["inputs"]
    assert inp["path"] == INPUT and inp["dtype"] == "float32"
    assert inp["shape"][0] == 1 and inp["shape"][2] == 64
    assert (inp["shape"][1]["min"], inp["shape"][1]["max"]) == (2, 128)


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.int32, torch.float16])
def test_wrong_dtype(mod, dtype):
    x = x_of(8).to(dtype)
    with pytest.raises(InputError) as ei:
        mod(x)
    msg = str(ei.value)
    got = str(dtype).removeprefix("torch.")
    assert INPUT in msg
    assert "expected dtype float32" in msg and f"got {got}" in msg, msg
    assert ei.value.exit_code == 2


def test_wrong_dtype_numpy(mod):
    with pytest.raises(InputError, match=r"expected dtype float32, got float64"):
        mod(x_of(8).numpy().astype(np.float64))


SHAPE_RE = r"expected shape \[1, \w+:2\.\.128, 64\], got {}"


@pytest.mark.parametrize(
    "shape",
    [(1, 8, 32), (2, 8, 64), (1, 8, 65)],
    ids=["last-dim", "batch", "last-dim-plus-one"],
)
def test_wrong_static_dim(mod, shape):
    with pytest.raises(InputError) as ei:
        mod(torch.randn(*shape))
    msg = str(ei.value)
    assert INPUT in msg
    assert re.search(SHAPE_RE.format(re.escape(str(list(shape)))), msg), msg


@pytest.mark.parametrize("seq", [1, 129, 500])
def test_dynamic_dim_out_of_range(mod, seq):
    with pytest.raises(InputError) as ei:
        mod(x_of(seq))
    assert re.search(SHAPE_RE.format(re.escape(f"[1, {seq}, 64]")), str(ei.value)), str(ei.value)


@pytest.mark.parametrize("seq", [2, 128])
def test_dynamic_dim_range_ends_are_accepted(compiled, mod, seq):
    model = compiled[0]
    x = x_of(seq, seed=seq)
    got = mod(x)
    assert got.shape == (1, seq, 64)
    assert diff_metrics.compare(f"seq{seq}", got, eager(model, x), F32).max_rel <= 1e-5


@pytest.mark.parametrize("shape", [(8, 64), (1, 1, 8, 64), (64,)], ids=["rank2", "rank4", "rank1"])
def test_wrong_rank(mod, shape):
    with pytest.raises(InputError) as ei:
        mod(torch.randn(*shape))
    assert re.search(SHAPE_RE.format(re.escape(str(list(shape)))), str(ei.value)), str(ei.value)


def test_missing_argument(mod):
    with pytest.raises(InputError) as ei:
        mod()
    msg = str(ei.value)
    assert f"input 'x' ({INPUT}) is missing" in msg
    assert "float32[1, " in msg and ":2..128, 64]" in msg  # says what the module takes


def test_extra_positional_argument(mod):
    x = x_of(8)
    with pytest.raises(InputError) as ei:
        mod(x, x)
    assert "unexpected argument(s) [0][1]" in str(ei.value)


def test_extra_keyword_argument(mod):
    x = x_of(8)
    with pytest.raises(InputError) as ei:
        mod(x, mask=x)
    assert "unexpected argument(s) [1]['mask']" in str(ei.value)


def test_not_a_tensor(mod):
    with pytest.raises(InputError):
        mod("not a tensor")


def test_numpy_input_same_as_torch(compiled, mod):
    model = compiled[0]
    x = x_of(8, seed=3)
    got_t = mod(x)
    got_n = mod(x.numpy())
    assert isinstance(got_n, torch.Tensor) and got_n.dtype == torch.float32
    assert torch.equal(got_n, got_t)
    assert diff_metrics.compare("numpy", got_n, eager(model, x), F32).max_rel <= 1e-5


def test_non_contiguous_input(compiled, mod):
    model = compiled[0]
    x = torch.randn(1, 64, 9, generator=torch.Generator().manual_seed(4)).transpose(1, 2)  # [1, 9, 64], strided
    assert not x.is_contiguous()
    r = diff_metrics.compare("strided", mod(x), eager(model, x), F32)
    assert r.max_rel <= 1e-5, r


@pytest.mark.parametrize("seq", [3, 17, 64])
def test_matches_eager_across_lengths(compiled, mod, seq):
    model = compiled[0]
    x = x_of(seq, seed=seq)
    got = mod(x)
    ref = eager(model, x)
    assert got.shape == ref.shape == (1, seq, 64)
    r = diff_metrics.compare(f"seq{seq}", got, ref, F32)
    assert r.passed and r.max_rel <= 1e-5, r


def test_a_rejected_call_leaves_the_module_usable(compiled, mod):
    with pytest.raises(InputError):
        mod(x_of(500))
    x = x_of(5, seed=9)
    assert diff_metrics.compare("after", mod(x), eager(compiled[0], x), F32).max_rel <= 1e-5


# ---------------------------------------------------------------------------------------------
# Loading


def copy_artifact(art, dest: Path, *, manifest: bool = True) -> Path:
    dest.mkdir()
    for p in (art.vmfb, art.params, art.manifest if manifest else None):
        if p is not None:
            shutil.copy2(p, dest / p.name)
    return dest / art.vmfb.name


def test_copied_artifact_loads_and_runs(compiled, tmp_path):
    """Control for the tests below: an unmodified copy works."""
    model, _, art = compiled
    vmfb = copy_artifact(art, tmp_path / "copy")
    x = x_of(6, seed=6)
    assert diff_metrics.compare("copy", llmc.load(vmfb)(x), eager(model, x), F32).max_rel <= 1e-5


LOST = "c/runtime/src/iree/hal/drivers/vulkan/queue.c:2867: DATA_LOSS; [vkSignalSemaphore] VK_ERROR_DEVICE_LOST"
# The loss as a fence carried it on, without the driver's words (CI, test_cell[vulkan-f32], IREE 3.13).
CARRIED = "Error creating vm context with modules: DATA_LOSS; while invoking native function hal.fence.await; while calling variadic import;"


def _losing_device(monkeypatch, losses: int, message: str = ""):
    """Make the first `losses` loads fail the way IREE's Vulkan driver does when the device is lost;
    record the `fresh` flag of every device opened."""
    from llmc.runtime import device as rt_device

    opened, real_open, real_load = [], rt_device.open_device, rt_module.Module._load_on
    left = [losses]

    def open_device(*a, fresh=False, **k):
        opened.append(fresh)
        return real_open(*a, fresh=fresh, **k)

    def load_on(self, config):
        if left[0]:
            left[0] -= 1
            raise RuntimeError(message or f"Error creating vm context with modules: {LOST}; while invoking native function hal.fence.await")
        return real_load(self, config)

    monkeypatch.setattr(rt_device, "open_device", open_device)
    monkeypatch.setattr(rt_module.Module, "_load_on", load_on)
    return opened


def test_a_device_lost_while_loading_is_retried_once_on_a_new_device(compiled, monkeypatch, caplog):
    model, _, art = compiled
    opened = _losing_device(monkeypatch, losses=1)
    m = llmc.load(art)
    x = x_of(7, seed=7)
    assert diff_metrics.compare("retried", m(x), eager(model, x), F32).max_rel <= 1e-5
    assert opened == [False, True]  # the cached device first, then a new one
    assert "Vulkan device was lost while loading" in caplog.text and "retrying on a new device" in caplog.text


def test_a_device_lost_twice_while_loading_gets_a_third_device(compiled, monkeypatch):
    model, _, art = compiled
    opened = _losing_device(monkeypatch, losses=2)
    x = x_of(6, seed=2)
    assert diff_metrics.compare("third", llmc.load(art)(x), eager(model, x), F32).max_rel <= 1e-5
    assert opened == [False, True, True]


def test_a_device_lost_three_times_is_a_one_line_load_error(compiled, monkeypatch):
    opened = _losing_device(monkeypatch, losses=3)
    m = llmc.load(compiled[2])
    with pytest.raises(RuntimeCallError) as ei:  # loading is lazy: the first call reports it (exit 3)
        m(x_of(5))
    msg = str(ei.value)
    assert opened == [False, True, True] and "could not load the module" in msg and "VK_ERROR_DEVICE_LOST" in msg, msg
    assert "\n" not in msg


def test_a_loss_a_fence_carried_on_is_retried_on_a_vulkan_module(compiled, monkeypatch):
    """DATA_LOSS without VK_ERROR_DEVICE_LOST is a loss on Vulkan: the module loads on a new device."""
    model, _, art = compiled
    opened = _losing_device(monkeypatch, losses=1, message=CARRIED)
    m = llmc.load(art)
    m.device_family = "vulkan"  # as a SPIR-V module's manifest gives it; the cpu module stands in
    x = x_of(7, seed=8)
    assert diff_metrics.compare("carried", m(x), eager(model, x), F32).max_rel <= 1e-5
    assert opened == [False, True]


def test_data_loss_on_a_cpu_module_is_not_taken_for_a_lost_device(compiled, monkeypatch):
    opened = _losing_device(monkeypatch, losses=1, message=CARRIED)
    m = llmc.load(compiled[2])
    assert m.device_family == "local"
    with pytest.raises(RuntimeCallError, match="DATA_LOSS; while invoking native function hal.fence.await"):
        m(x_of(5))
    assert opened == [False]


def _losing_calls(monkeypatch, losses: int):
    """Make the first `losses` calls fail as IREE's Vulkan driver does when the device is lost mid-call;
    record the `fresh` flag of every device opened."""
    from llmc.runtime import device as rt_device

    opened, real_open, real_function = [], rt_device.open_device, rt_module.Module.function
    left = [losses]
    monkeypatch.setattr(rt_device, "open_device", lambda *a, fresh=False, **k: opened.append(fresh) or real_open(*a, fresh=fresh, **k))

    def function(self, name):
        fn = real_function(self, name)

        def call(*arrays):
            if left[0]:
                left[0] -= 1
                raise RuntimeError(f"Error invoking function: {LOST}; while invoking native function hal.fence.await")
            return fn(*arrays)

        return call

    monkeypatch.setattr(rt_module.Module, "function", function)
    return opened


def test_a_device_lost_during_a_call_on_host_inputs_is_run_again_on_a_new_device(compiled, monkeypatch, caplog):
    model, _, art = compiled
    opened = _losing_calls(monkeypatch, losses=1)
    m = llmc.load(art)
    x = x_of(6, seed=3)
    assert diff_metrics.compare("rerun", m(x), eager(model, x), F32).max_rel <= 1e-5
    assert opened == [False, True]  # loaded on the cached device, then once more on a new one
    assert "lost while running main" in caplog.text and "once more on a new device" in caplog.text
    assert diff_metrics.compare("after", m(x), eager(model, x), F32).max_rel <= 1e-5 and opened == [False, True]


def test_a_device_lost_twice_during_a_call_gets_a_third_device(compiled, monkeypatch):
    model, _, art = compiled
    opened = _losing_calls(monkeypatch, losses=2)
    x = x_of(6, seed=4)
    assert diff_metrics.compare("third", llmc.load(art)(x), eager(model, x), F32).max_rel <= 1e-5
    assert opened == [False, True, True]


def test_a_device_lost_three_times_during_a_call_is_a_one_line_error(compiled, monkeypatch):
    opened = _losing_calls(monkeypatch, losses=3)
    with pytest.raises(RuntimeCallError) as ei:
        llmc.load(compiled[2])(x_of(5))
    msg = str(ei.value)
    assert opened == [False, True, True] and "IREE failed while running the module" in msg and "VK_ERROR_DEVICE_LOST" in msg, msg
    assert "\n" not in msg


def test_a_call_on_device_resident_inputs_is_not_run_again(compiled, monkeypatch):
    """A device-resident input (a KV cache an earlier call left there) is lost with the device."""
    import iree.runtime as rt

    opened = _losing_calls(monkeypatch, losses=1)
    m = llmc.load(compiled[2])
    ep = m.entry_points[m.default_entry]
    arrays = ep.convert_inputs((x_of(5),), {})
    resident = [rt.asdevicearray(m._ensure_loaded().config.device, a) for a in arrays]
    with pytest.raises(RuntimeCallError, match="VK_ERROR_DEVICE_LOST"):
        ep.call_raw(resident)
    assert opened == [False]


def test_other_load_failures_are_not_retried(compiled, monkeypatch):
    from llmc.runtime import device as rt_device

    opened = []
    real_open = rt_device.open_device
    monkeypatch.setattr(rt_device, "open_device", lambda *a, fresh=False, **k: opened.append(fresh) or real_open(*a, fresh=fresh, **k))
    monkeypatch.setattr(rt_module.Module, "_load_on", lambda self, config: (_ for _ in ()).throw(RuntimeError("INVALID_ARGUMENT; bad module")))
    with pytest.raises(RuntimeCallError, match="INVALID_ARGUMENT; bad module"):
        llmc.load(compiled[2])(x_of(5))
    assert opened == [False]


def test_missing_manifest(compiled, tmp_path):
    art = compiled[2]
    vmfb = copy_artifact(art, tmp_path / "nomanifest", manifest=False)
    assert not vmfb.with_suffix(".json").exists() and vmfb.exists()
    with pytest.raises(RuntimeLoadError) as ei:
        llmc.load(vmfb)
    msg = str(ei.value)
    assert str(vmfb.with_suffix(".json")) in msg and "manifest not found" in msg, msg


def test_missing_vmfb(tmp_path):
    with pytest.raises(RuntimeLoadError, match="no such file"):
        llmc.load(tmp_path / "absent.vmfb")


def test_missing_cpu_features():
    assert rt_module.missing_cpu_features(["avx512f", "avx2"], {"avx2"}) == ["avx512f"]
    assert rt_module.missing_cpu_features(["avx512f", "avx2"], {"avx2", "avx512f"}) == []
    # LLVM names map to /proc/cpuinfo names; features no refusal is made for are ignored.
    assert rt_module.missing_cpu_features(["sse4.1", "amx-tile"], {"sse4_1"}) == ["amx-tile"]
    assert rt_module.missing_cpu_features(["sse4.1", "amx-tile"], {"sse4_1", "amx_tile"}) == []
    assert rt_module.missing_cpu_features(["64bit", "cx16"], set()) == []
    assert rt_module.missing_cpu_features(["avx512f"], None) == []  # unknown host: no refusal


def test_module_needing_absent_cpu_feature_is_refused(compiled, tmp_path):
    flags = rt_module.host_cpu_flags()
    if flags is None or "amx_tile" in flags:
        pytest.skip("needs a Linux CPU without amx_tile")
    art = compiled[2]
    vmfb = copy_artifact(art, tmp_path / "amx")
    manifest_path = vmfb.with_suffix(".json")
    m = json.loads(manifest_path.read_text())
    assert m["target"]["backend"] == "llvm-cpu"
    assert "amx-tile" not in m["target"]["cpu_features"]
    m["target"]["cpu_features"].append("amx-tile")
    manifest_path.write_text(json.dumps(m))
    with pytest.raises(RuntimeLoadError) as ei:
        llmc.load(vmfb)
    msg = str(ei.value)
    assert "amx-tile" in msg and "recompile with --arch host" in msg, msg
    assert str(vmfb) in msg


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float16, torch.int8])
def test_dtype_table_round_trips_tensors_through_numpy(dtype):
    """llmc/dtypes.py moves bf16 and fp8 across the numpy boundary bit-exactly (numpy has neither)."""
    from llmc import dtypes

    t = (torch.randn(3, 5) * 4).to(dtype)
    arr = dtypes.to_numpy(t)
    assert arr.dtype == dtypes.of_torch(dtype).numpy and dtypes.numpy_name(arr) == dtypes.name_of(dtype)
    back = dtypes.to_torch(arr)
    assert back.dtype == dtype and torch.equal(back.view(torch.uint8), t.view(torch.uint8))
