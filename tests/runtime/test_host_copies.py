"""Module.host's staged copies (runtime/module.py _Staging): a small result that a device's memory
cannot map goes through a host-visible buffer kept per (device, size) and reused. A reused buffer
must hand back each copy's own values, never an earlier one's, and the kept set stays bounded."""

import numpy as np
import pytest

from conftest import vulkan_or_skip
from llmc.runtime.device import shared_device
from llmc.runtime.module import _Staging


@pytest.fixture(params=["local-task", "vulkan"])
def device(request):
    if request.param == "vulkan":
        vulkan_or_skip()
    # The process's device as modules get it: after a loss earlier in this worker, its replacement.
    return shared_device(request.param)


def test_a_kept_buffer_returns_each_copys_own_values(device):
    import iree.runtime as rt

    staging = _Staging()
    rng = np.random.default_rng(0)
    for _ in range(3):  # the same size three times: one buffer, three different contents
        want = rng.standard_normal((1, 1, 1000)).astype(np.float16)
        got = staging.copy(rt.asdevicearray(device, want))
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert len(staging.kept) == 1
    [(_, _, _, copies)] = staging.kept.values()
    assert copies == 3  # the semaphore's timeline advanced once a copy


def test_the_kept_set_is_bounded_and_keeps_the_newest(device):
    import iree.runtime as rt

    staging = _Staging()
    sizes = [64 * (i + 1) for i in range(_Staging.MAX_KEPT + 3)]
    for n in sizes:
        want = np.arange(n, dtype=np.int64) * 3 - n
        assert np.array_equal(staging.copy(rt.asdevicearray(device, want)), want)
    assert sorted(nbytes for _, nbytes in staging.kept) == [8 * n for n in sizes[-_Staging.MAX_KEPT:]]
    big = np.ones(_Staging.MAX_BYTES // 4 + 1, dtype=np.float32)  # one byte-size step over the limit: copied, not kept
    assert np.array_equal(staging.copy(rt.asdevicearray(device, big)), big)
    assert all(nbytes <= _Staging.MAX_BYTES for _, nbytes in staging.kept)
