"""--static-decode: a decode_static entry point with every shape fixed (LlamaDecodeStatic).

Checked on cpu against `transformers` LlamaForCausalLM on the same HF checkpoint (greedy tokens
identical in f32), after a bucket prefill (pads in the cache past the prompt, which the static step
must mask) and after the dynamic one, and step by step against the module's own dynamic decode
(logits max |diff| / max |ref| <= 1e-5, the f32 profile of compiler/diff_metrics.py).
"""

import subprocess
import sys

import numpy as np
from llmc.dtypes import by_name
import pytest
import torch
from conftest import llmc_in_process

transformers = pytest.importorskip("transformers")

import llmc  # noqa: E402
from llmc.errors import UsageError  # noqa: E402
from llmc.models.llama.config import get_config  # noqa: E402
from llmc.tools.make_checkpoint import write_checkpoint  # noqa: E402

MAX_SEQ = 96


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("static")
    config = get_config("tiny")
    write_checkpoint(config, "hf", root / "hf", dtype="f32", seed=3)
    hf = transformers.LlamaForCausalLM.from_pretrained(root / "hf", torch_dtype=torch.float32).eval()
    art = llmc.compile(root / "hf", output=root / "s.vmfb", max_seq_len=MAX_SEQ, prefill_buckets=(16,), static_decode="on")
    return root, config, hf, llmc.load(art)


def _prompt(n, vocab):
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(200 + n)).tolist()


def test_manifest_and_static_shapes(setup):
    _, config, _, mod = setup
    llm = mod.manifest["llm"]
    n = llm["cache"]["count"]
    # on cpu with its greedy twin (compiler/greedy.py), which generate() runs for greedy steps
    assert llm["decode_static"] == {"function": "decode_static", "position_arg": 1, "cache_args_start": 2,
                                    "greedy": {"function": "decode_static_greedy", "token_output": 1 + n, "chosen_output": 2 + n,
                                               "next_token_input": 2 + n}}
    shapes = [i["shape"] for i in mod.manifest["entry_points"]["decode_static"]["inputs"]]
    assert shapes[:2] == [[1, 1], [1]]  # static: no dynamic dimension
    assert all(s == llm["cache"]["shape"] for s in shapes[2:]) and len(shapes) == 2 + llm["cache"]["count"]
    info = llmc_in_process("info", mod.vmfb)
    assert "decode:   decode_static for every step" in info.stdout, info.stdout + info.stderr


@pytest.mark.parametrize("n, prefill", [(13, "prefill_16"), (30, "prefill")])
@pytest.mark.parametrize("in_module", [True, False])
def test_generate_runs_the_static_step_and_matches_transformers(setup, n, prefill, in_module, monkeypatch):
    """Greedy steps through decode_static_greedy (the token chosen in the module, the position uploaded each
    step) and through decode_static with the logits read: the same tokens as transformers."""
    from llmc.runtime.generate import Generator

    _, config, hf, mod = setup
    monkeypatch.setattr(Generator, "greedy_in_module", in_module)
    prompt = _prompt(n, config.vocab_size)
    got = mod.generate(prompt, 40, stop_at_eos=False)
    g = mod.last_generation
    assert (g.prefill_function, g.decode_function) == (prefill, "decode_static_greedy" if in_module else "decode_static")
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0)
    want = want[0, n:].tolist()
    assert len(set(want)) > 3, "degenerate reference: pick another seed"
    assert got == want


def test_static_step_logits_equal_the_dynamic_step(setup):
    """Both entry points over the same cache, position by position: the static one sees the bucket's
    pads (non-zero rows past the prompt) and must mask them."""
    _, config, _, mod = setup
    spec = mod.manifest["llm"]["cache"]
    n = 10
    padded = np.zeros((1, 16), dtype=np.int64)
    padded[0, :n] = _prompt(n, config.vocab_size)
    zeros = [np.zeros(spec["shape"], dtype=by_name(spec["dtype"]).numpy) for _ in range(spec["count"])]
    out = [mod.host(x) for x in mod.entry_points["prefill_16"].call_raw([padded, np.asarray([n], dtype=np.int64), *zeros])]
    assert np.abs(out[1][:, :, n:16]).max() > 0  # the pads' keys: what the mask must hide
    dyn_cache, st_cache = out[1:], [c.copy() for c in out[1:]]
    tok = int(out[0].reshape(-1).argmax())
    for length in range(n + 1, n + 6):
        d = [mod.host(x) for x in mod.entry_points["decode"].call_raw([np.asarray([[tok]]), np.ones((1, length), dtype=np.int64), *dyn_cache])]
        s = [mod.host(x) for x in mod.entry_points["decode_static"].call_raw(
            [np.asarray([[tok]]), np.asarray([length - 1], dtype=np.int64), *st_cache])]
        rel = np.abs(s[0] - d[0]).max() / np.abs(d[0]).max()
        assert rel <= 1e-5, f"length {length}: max rel {rel:.3g}"
        dyn_cache, st_cache, tok = d[1:], s[1:], int(d[0].reshape(-1).argmax())


# Off by default on cpu: tests/e2e/test_llama_generate.py::test_cpu_defaults_add_no_buckets_and_no_static_decode
# (a default cpu build that file makes anyway).


def test_bad_uses_are_refused(setup, tmp_path):
    root, *_ = setup
    with pytest.raises(UsageError, match="--static-decode on: not available with --tensor-parallel"):
        llmc.compile(root / "hf", output=tmp_path / "tp.vmfb", max_seq_len=MAX_SEQ, tensor_parallel=2, static_decode="on")
    with pytest.raises(UsageError, match="--static-decode applies to Llama checkpoints"):
        llmc.compile(torch.nn.Linear(4, 4), (torch.zeros(1, 4),), output=tmp_path / "lin.vmfb", static_decode="on")
    with pytest.raises(UsageError, match="--static-decode='yes': choose auto, on or off"):
        llmc.compile(root / "hf", output=tmp_path / "bad.vmfb", max_seq_len=MAX_SEQ, static_decode="yes")
    r = subprocess.run([sys.executable, "-m", "llmc.compiler.cli", "compile", str(root / "hf"), "--static-decode", "maybe",
                        "-o", str(tmp_path / "x.vmfb")], capture_output=True, text=True)
    assert r.returncode == 2 and "--static-decode" in r.stderr and "Traceback" not in r.stderr
    assert not list(tmp_path.glob("x.*"))


def test_a_later_generate_reuses_the_cache_and_its_stale_rows_change_nothing(setup, monkeypatch):
    """generate() starts from the cache the last run left (no zeroed cache made and uploaded); rows
    the new run has not written yet hold the old run's K/V, which neither prefill nor decode_static
    may read. A short prompt after a long run must give the tokens a fresh module gives."""
    from llmc.runtime import generate as gen_mod

    root, config, _, mod = setup
    made = []
    real = gen_mod.Generator._new_cache
    monkeypatch.setattr(gen_mod.Generator, "_new_cache", lambda self, devices: made.append(1) or real(self, devices))
    short = _prompt(11, config.vocab_size)
    fresh = llmc.load(mod.vmfb)
    want = fresh.generate(short, 30, stop_at_eos=False)
    assert len(made) == 1
    mod.generate(_prompt(50, config.vocab_size), 40, stop_at_eos=False)  # writes rows 0..88
    made.clear()
    assert mod.generate(short, 30, stop_at_eos=False) == want
    assert made == []  # the long run's cache was taken, not a new one
    mod.close()  # closing drops it with the rest of the module's IREE state
    mod.generate(short, 2, stop_at_eos=False)
    assert made == [1]


def test_cuda_records_the_static_step_once(setup, tmp_path):
    """What decode_static is for: on a GPU target IREE memoizes its command buffer (recorded once,
    reusable, buffers bound per call), where the dynamic decode records a one-shot buffer every
    call. Read from IREE's HAL-stage IR of the module llmc compiles (cuda, compile-only here): llmc's
    own iree-compile stops after the HAL phase (`--compile-to=hal` comes after llmc's flags), so its
    output is that IR, of exactly the module and flags llmc compiles, in one iree-compile run."""
    root, *_ = setup
    art = llmc.compile(root / "hf", target="cuda", dtype="f16", output=tmp_path / "hal.vmfb", max_seq_len=MAX_SEQ,
                       prefill_buckets="none", static_decode="on", extra_iree_flags=("--compile-to=hal",))
    assert "decode_static" in art.read_manifest()["entry_points"]
    text = art.vmfb.read_text()
    memo = text.split("@__decode_static$async_memoize_apply", 1)
    assert len(memo) == 2, "decode_static's command buffer is not memoized"
    assert 'mode("None")' in memo[1].split("util.func", 1)[0]  # reusable, not OneShot
    dynamic = text.split("util.func public @decode$async", 1)[1].split("util.func public", 1)[0]
    assert "mode(OneShot)" in dynamic and "memoize" not in dynamic
