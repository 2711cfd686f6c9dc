"""compiler/progress.Phases: long phases show how far they are (bytes, percent, rate), on a terminal
in place and in a log every 10 s, so a 50 s parameter write never looks like a stall."""

import io
import re
import time

import pytest

from llmc.compiler.progress import Phases


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_byte_progress_on_a_terminal():
    out = _Tty()
    phases = Phases(stream=out)
    state = {"done": 0}
    with phases.phase("write parameters", progress=lambda: (state["done"], 4_000_000_000)):
        for i in range(1, 5):
            time.sleep(0.45)
            state["done"] = i * 500_000_000
    text = out.getvalue()
    assert "llmc: write parameters ... " in text and "/4.0 GB" in text and "MB/s" in text
    seen = [int(x) for x in re.findall(r"\((\d+)%\)", text)]
    assert any(0 < v < 100 for v in seen), text  # a tick saw the writer partway
    assert text.rstrip().endswith("done after " + text.rstrip().rsplit("done after ", 1)[1])
    assert phases.timings["write parameters"] >= 1.8


def test_failing_progress_callable_falls_back_to_time():
    out = _Tty()
    with Phases(stream=out).phase("hash parameters", progress=lambda: 1 / 0):
        time.sleep(1.2)
    assert "llmc: hash parameters ... 1." in out.getvalue()


def test_pipe_gets_a_line_not_carriage_returns():
    out = io.StringIO()
    with Phases(stream=out).phase("iree-compile"):
        time.sleep(1.2)
    text = out.getvalue()
    assert "\r" not in text and text.startswith("llmc: iree-compile ... ") and "done after" in text


def _torch_pytree_warning():
    """What torch 2.13 does inside export and decompositions: deep-copy an exported program, which warns
    about its own deprecated LeafSpec API."""
    import copy

    import torch

    copy.deepcopy(torch.export.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),)))


def test_compile_silences_torchs_pytree_warning_and_nothing_else(monkeypatch):
    import warnings

    import torch

    import llmc
    from llmc.compiler import api

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _torch_pytree_warning()
    if not any("LeafSpec" in str(w.message) for w in seen):
        pytest.skip("this torch does not warn about LeafSpec: nothing to silence")

    def fake_compile(*args, **kwargs):  # the lowering, reduced to the warning it triggers and one of ours
        _torch_pytree_warning()
        warnings.warn("a warning of llmc's own", UserWarning)
        return "artifact"

    monkeypatch.setattr(api, "compile_program", fake_compile)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert llmc.compile(torch.nn.Linear(2, 2), (torch.ones(1, 2),)) == "artifact"
    messages = [str(w.message) for w in seen]
    assert not any("LeafSpec" in m for m in messages), messages
    assert "a warning of llmc's own" in messages
