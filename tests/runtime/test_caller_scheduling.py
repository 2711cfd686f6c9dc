"""A call on IREE's local-task workers waits with the calling thread under SCHED_BATCH, and only then
(runtime/device.py caller_yields_to_workers says why: the woken caller preempted the worker that still
had to mark the wait finished). What it gains is a benchmark figure (docs/targets.md "The caller's
wait"); these tests pin where the switch happens and that the caller gets its policy back.

One artifact for the whole file: the zoo `attention` model, dynamic in dim 1.
"""

from __future__ import annotations

import os

import pytest
import torch

import llmc
from llmc.compiler import diff_metrics
from llmc.errors import RuntimeCallError
from llmc.models import zoo
from llmc.runtime import module as rt_module
from llmc.runtime.device import CALLER_SCHED_ENV, caller_yields_to_workers



def _can_switch() -> bool:
    """Whether this process may move a thread to SCHED_BATCH and back (a seccomp profile could refuse it,
    in which case the runtime leaves every call as it was and there is nothing here to test)."""
    if not hasattr(os, "SCHED_BATCH") or os.sched_getscheduler(0) != os.SCHED_OTHER:
        return False
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError:
        return False
    return True


pytestmark = pytest.mark.skipif(not _can_switch(), reason="this process cannot switch a thread to SCHED_BATCH and back (not Linux, or refused)")

F32 = diff_metrics.TOLERANCES["f32"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    model, args, dynamic = zoo.build("attention")
    out = tmp_path_factory.mktemp("attention") / "attention.vmfb"
    return model, llmc.compile(model, args, output=out, dynamic_shapes=dynamic)


@pytest.fixture
def policy_inside(monkeypatch):
    """Every module call's IREE invocation records the calling thread's policy while it runs."""
    seen = []
    real = rt_module.EntryPoint._function

    def recording(self):
        invoke = real(self)

        def call(*arrays):
            seen.append(os.sched_getscheduler(0))
            return invoke(*arrays)

        return call

    monkeypatch.setattr(rt_module.EntryPoint, "_function", recording)
    return seen


def x_of(seq: int) -> torch.Tensor:
    return torch.randn(1, seq, 64, generator=torch.Generator().manual_seed(seq))


def test_a_local_task_call_waits_under_sched_batch(compiled, policy_inside, monkeypatch):
    monkeypatch.delenv(CALLER_SCHED_ENV, raising=False)
    model, art = compiled
    before = os.sched_getscheduler(0)
    mod = llmc.load(art, threads=2)
    assert mod.device_name == "local-task"
    x = x_of(7)
    got = mod(x)
    assert policy_inside == [os.SCHED_BATCH]
    assert os.sched_getscheduler(0) == before == os.SCHED_OTHER
    with torch.no_grad():
        want = model(x)
    assert diff_metrics.compare("local-task", got, want, F32).max_rel <= 1e-5
    # IREE's workers were started before the first switch (the module loads outside it): they keep the
    # process's normal policy, which a thread inherits from the one that creates it
    workers = [int(t) for t in os.listdir("/proc/self/task") if open(f"/proc/self/task/{t}/comm").read().startswith("iree-worker")]
    assert workers, "no IREE worker threads in this process"
    assert {os.sched_getscheduler(t) for t in workers} == {os.SCHED_OTHER}


def test_local_sync_and_the_opt_out_leave_the_caller_as_it_is(compiled, policy_inside, monkeypatch):
    _, art = compiled
    one = llmc.load(art, threads=1)
    assert one.device_name == "local-sync"  # the dispatches run on the calling thread: nothing to wait for
    one(x_of(5))
    monkeypatch.setenv(CALLER_SCHED_ENV, "normal")
    llmc.load(art, threads=2)(x_of(6))
    assert policy_inside == [os.SCHED_OTHER, os.SCHED_OTHER]


def test_the_policy_comes_back_after_a_failed_call_and_a_batch_caller_stays_batch(compiled, monkeypatch):
    monkeypatch.delenv(CALLER_SCHED_ENV, raising=False)
    _, art = compiled
    mod = llmc.load(art, threads=2)
    mod(x_of(4))  # loaded with the real invoker

    def failing(self):
        def call(*arrays):
            assert os.sched_getscheduler(0) == os.SCHED_BATCH
            raise RuntimeError("INTERNAL; a dispatch failed")

        return call

    monkeypatch.setattr(rt_module.EntryPoint, "_function", failing)
    with pytest.raises(RuntimeCallError, match="a dispatch failed"):
        mod(x_of(4))
    assert os.sched_getscheduler(0) == os.SCHED_OTHER

    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    try:
        with caller_yields_to_workers(True):
            assert os.sched_getscheduler(0) == os.SCHED_BATCH
        assert os.sched_getscheduler(0) == os.SCHED_BATCH  # not this call's to undo
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
