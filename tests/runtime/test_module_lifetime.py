"""A loaded module's IREE objects are freed by reference count when the Module goes, never left to
Python's cycle collector.

Why it matters: CI crashed with "Fatal Python error: Segmentation fault ... Garbage-collecting" in
the middle of an unrelated torch call, right after the Vulkan cells of the dtype matrix: the cycle
collector was freeing an earlier module's IREE context (iree.runtime's load_vm_modules builds a
SystemContext <-> BoundModule cycle, and Module <-> EntryPoint was another). runtime/module.py builds
the VM context itself and keeps entry points from pointing back, so dropping a Module frees its
context then and there.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

import llmc
from llmc.errors import RuntimeLoadError
from llmc.models import zoo

from conftest import vulkan_or_skip


@pytest.fixture(scope="module", params=["cpu", "vulkan"])
def compiled(request, tmp_path_factory):
    if request.param == "vulkan":
        vulkan_or_skip()
    model, (x,), _ = zoo.build("linear_stack")
    art = llmc.compile(model, (x,), target=request.param, output=tmp_path_factory.mktemp(request.param) / "stack.vmfb", quiet=True)
    with torch.no_grad():
        want = model(x)
    return art, x, want


def _iree_objects() -> int:
    """IREE Python objects the cycle collector tracks (SystemContext, BoundModule: what a cycle holds)."""
    import iree.runtime as rt

    kinds = (rt.SystemContext, rt.system_api.BoundModule)
    return sum(type(o) in kinds for o in gc.get_objects())


def test_dropping_a_module_frees_it_without_the_cycle_collector(compiled):
    art, x, want = compiled
    gc.collect()
    before = _iree_objects()
    gc.disable()
    try:
        mod = llmc.load(art)
        got = mod(x)
        entry = getattr(mod, mod.default_entry)  # an entry point taken from it must not keep a cycle alive either
        assert entry(x).allclose(got)
        ref = weakref.ref(mod)
        del mod, entry
        assert ref() is None, "the Module is only freed by the cycle collector: something points back to it"
        assert _iree_objects() == before
    finally:
        gc.enable()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_an_entry_point_outlives_the_module_name_it_came_from(compiled):
    art, x, want = compiled
    mod = llmc.load(art)
    entry = getattr(mod, mod.default_entry)
    del mod
    gc.collect()
    torch.testing.assert_close(entry(x), want, rtol=1e-5, atol=1e-5)


def test_close_frees_and_the_next_call_loads_again(compiled):
    art, x, want = compiled
    with llmc.load(art) as mod:
        first = mod(x)
        assert mod._loaded is not None
    assert mod._loaded is None  # closed on leaving the block
    again = mod(x)  # loads again
    np.testing.assert_array_equal(again.numpy(), first.numpy())
    torch.testing.assert_close(again, want, rtol=1e-5, atol=1e-5)
    mod.close()


def test_a_function_the_module_lacks_is_a_clear_error(compiled):
    art, _, _ = compiled
    mod = llmc.load(art)
    with pytest.raises(RuntimeLoadError, match=r"stack\.vmfb: the module has no function 'nope'; the manifest does not match it, recompile") as e:
        mod.function("nope")
    assert e.value.exit_code == 2 and "\n" not in str(e.value)
