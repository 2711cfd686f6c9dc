"""Llama end to end: random-weight checkpoints in Meta and HF form -> llmc compile -> generate,
checked against `transformers` LlamaForCausalLM (which reads the HF checkpoint with its own loader).

Tolerances: prefill logits vs eager f32, max |diff| / max |ref| <= 1e-5 (the f32 profile of
compiler/diff_metrics.py); greedy tokens must be identical (32 in f32; the first 16 in bf16 against eager
bf16, where both sides round every op to 8 bits of mantissa and long runs may legitimately part).
The f32 build also carries the cpu defaults (no buckets, no static decode step).
"""

import json
import subprocess
import sys

import pytest
from conftest import hf_greedy, llmc_in_process
import torch

transformers = pytest.importorskip("transformers")

import llmc  # noqa: E402
from llmc.dtypes import by_name  # noqa: E402
from llmc.models.llama.config import get_config  # noqa: E402
from llmc.tools.make_checkpoint import write_checkpoint  # noqa: E402

MAX_SEQ = 64
PROMPT = [1, 77, 300, 5, 42, 9, 256, 13]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama")
    config = get_config("tiny-llama3")  # Llama-3.1 rope scaling, tied embeddings, one KV head
    write_checkpoint(config, "meta", root / "meta", dtype="f32", seed=3)
    write_checkpoint(config, "hf", root / "hf", dtype="f32", seed=3)
    hf = transformers.LlamaForCausalLM.from_pretrained(root / "hf", torch_dtype=torch.float32).eval()
    return root, config, hf


@pytest.fixture(scope="module")
def compiled(checkpoints):
    root, config, _ = checkpoints
    arts = {}
    arts["meta"] = llmc.compile(root / "meta", output=root / "meta.vmfb", max_seq_len=MAX_SEQ)
    # The public API routes a checkpoint folder to the same path (the model may be an HF folder).
    arts["hf"] = llmc.compile(root / "hf", output=root / "hf.vmfb", max_seq_len=MAX_SEQ)
    assert arts["hf"].read_manifest()["llm"]["max_seq_len"] == MAX_SEQ
    return arts


def test_cpu_defaults_add_no_buckets_and_no_static_decode(compiled):
    """On cpu, prefill buckets (pads cost compute there) and the static decode step (auto: off on every
    target, compiler/llm.py) are off unless asked for: a default build has neither entry point.
    (Checked here for tests/e2e/test_prefill_buckets.py and tests/e2e/test_static_decode.py, on a
    default cpu build this file makes anyway.)"""
    m = compiled["hf"].read_manifest()
    assert m["llm"]["prefill_buckets"] == [] and not [e for e in m["entry_points"] if e.startswith("prefill_")]
    assert "decode_static" not in m["llm"] and "decode_static" not in m["entry_points"]
    # nor a prefill chunk: auto adds one on cpu only when the cache holds two (compiler/llm.py), 64 < 2 x 64
    assert "prefill_chunk" not in m["llm"]
    # the decode step's greedy twin (compiler/greedy.py), which generate() runs for greedy steps on cpu
    assert sorted(m["entry_points"]) == ["decode", "decode_greedy", "prefill"]
    n = m["llm"]["cache"]["count"]
    assert m["llm"]["decode"]["greedy"] == {"function": "decode_greedy", "token_output": 1 + n, "chosen_output": 2 + n,
                                               "next_token_input": 2 + n}
    # the twin's inputs: decode's, then the buffer its token is written into (compiler/greedy.py)
    inputs = m["entry_points"]["decode_greedy"]["inputs"]
    assert inputs[:-1] == m["entry_points"]["decode"]["inputs"]
    assert inputs[-1] == {"path": f"[0][{2 + n}]", "name": "next_token", "kind": "tensor", "dtype": "int64", "shape": [1, 1]}
    children = m["entry_points"]["decode_greedy"]["outputs"]["children"]
    assert children[:-2] == m["entry_points"]["decode"]["outputs"]["children"]
    assert [c.get("role") for c in children[-2:]] == ["greedy_token", "greedy_chosen"]


@pytest.mark.parametrize("fmt", ["meta", "hf"])
def test_greedy_32_tokens_equal_transformers_f32(checkpoints, compiled, fmt):
    import llmc

    _, _, hf = checkpoints
    mod = llmc.load(compiled[fmt])
    got = mod.generate(PROMPT, 32, stop_at_eos=False)
    want = hf_greedy(hf, PROMPT, 32)
    assert len(set(want)) > 3, "degenerate reference: pick another seed"
    assert got == want


def test_prefill_logits_match_transformers_f32(checkpoints, compiled):
    import llmc

    _, config, hf = checkpoints
    mod = llmc.load(compiled["hf"])
    cache = [torch.zeros(s) for s in [mod.manifest["llm"]["cache"]["shape"]] * mod.manifest["llm"]["cache"]["count"]]
    for n in (2, 8, 37):
        tokens = torch.randint(0, config.vocab_size, (1, n), generator=torch.Generator().manual_seed(n))
        got = mod.prefill(tokens, *cache)[0]
        with torch.no_grad():
            ref = hf(tokens, use_cache=False).logits[:, -1:, :]
        assert got.shape == ref.shape
        rel = ((got - ref).abs().max() / ref.abs().max()).item()
        assert rel <= 1e-5, f"S={n}: max rel {rel:.3g}"


def test_decode_step_continues_prefill(checkpoints, compiled):
    """Entry points called by hand: prefill S tokens, then decode one at position S with the returned cache."""
    import llmc

    _, config, hf = checkpoints
    mod = llmc.load(compiled["meta"])
    spec = mod.manifest["llm"]["cache"]
    cache = [torch.zeros(spec["shape"], dtype=by_name(spec["dtype"]).torch) for _ in range(spec["count"])]
    tokens = torch.tensor([PROMPT])
    out = mod.prefill(tokens[:, :-1], *cache)
    step = mod.decode(tokens[:, -1:], torch.ones(1, len(PROMPT), dtype=torch.int64), *out[1:])
    with torch.no_grad():
        ref = hf(tokens, use_cache=False).logits[:, -1:, :]
    rel = ((step[0] - ref).abs().max() / ref.abs().max()).item()
    assert rel <= 1e-5, rel


def test_bf16_first_16_tokens_equal_eager_bf16(checkpoints, tmp_path):
    import llmc

    root, config, hf = checkpoints
    art = llmc.compile(root / "hf", output=tmp_path / "bf16.vmfb", dtype="bf16", max_seq_len=MAX_SEQ)
    manifest = art.read_manifest()
    # bf16 on cpu is bf16 weights with f32 math (passes/bf16_weights.py): the .irpa holds 2 bytes per
    # weight, and the cache is bf16 too (--kv-dtype auto: K/V rounded as eager bf16 stores them)
    assert manifest["llm"]["cache"]["dtype"] == "bfloat16" and manifest["llm"]["cache"]["narrowed"]
    weights = sum(p.numel() for p in hf.parameters() if p.dim() == 2)
    assert art.params.stat().st_size < 2.2 * weights
    got = llmc.load(art).generate(PROMPT, 16, stop_at_eos=False)
    want = hf_greedy(hf.to(torch.bfloat16), PROMPT, 16)
    hf.to(torch.float32)
    assert got == want


def test_sampling_is_seeded_and_eos_stops(compiled, checkpoints):
    import llmc

    _, config, hf = checkpoints
    mod = llmc.load(compiled["hf"])
    a = mod.generate(PROMPT, 12, temperature=1.0, top_k=50, top_p=0.95, seed=7)
    b = mod.generate(PROMPT, 12, temperature=1.0, top_k=50, top_p=0.95, seed=7)
    c = mod.generate(PROMPT, 12, temperature=1.0, top_k=50, top_p=0.95, seed=8)
    assert a == b and a != c
    greedy = mod.generate(PROMPT, 12, stop_at_eos=False)
    # Make the 4th greedy token the end-of-sequence id: generation must stop right after it.
    mod.manifest["llm"]["config"]["eos_ids"] = [greedy[3]]
    first = greedy.index(greedy[3])
    assert mod.generate(PROMPT, 12) == greedy[: first + 1]


def _llmc(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "llmc.compiler.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_cli_run_json_matches_api(compiled, checkpoints):
    import llmc

    r = _llmc("run", compiled["meta"].vmfb, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "20", "--no-eos", "--json")
    assert r.returncode == 0, r.stderr
    want = llmc.load(compiled["meta"]).generate(PROMPT, 20, stop_at_eos=False)
    assert json.loads(r.stdout)["tokens"] == want
    # f32 weights are packed by IREE at load (data tiling): auto maps them. Read into memory, same tokens.
    assert json.loads(r.stdout)["weights"] == "mmap"
    r = _llmc("run", compiled["meta"].vmfb, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "20", "--no-eos", "--json",
              "--weights", "memory")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["weights"] == "memory" and json.loads(r.stdout)["tokens"] == want


@pytest.mark.parametrize(
    "prompt, n, needle",
    [
        ("1,2,999999", 4, "outside the vocabulary"),
        (",".join(["3"] * (MAX_SEQ + 1)), 1, "more than the module's max-seq-len"),
        ("1,2,x", 4, "expected comma-separated integers"),
    ],
)
def test_cli_run_bad_prompts(compiled, prompt, n, needle):
    r = _llmc("run", compiled["hf"].vmfb, "--prompt-ids", prompt, "--max-new-tokens", n)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_llmc_diff_llm_artifact(checkpoints, compiled, tmp_path):
    """`llmc diff CHECKPOINT ARTIFACT`: prompt + greedy decode steps. Passes against its own weights,
    fails (exit 1, naming a logits output) against a checkpoint with other weights of the same shape."""
    import jsonschema

    from llmc.compiler.report import REPORT_SCHEMA

    root, config, _ = checkpoints
    r = llmc_in_process("diff", root / "hf", compiled["meta"].vmfb, "--steps", "4", "--json", tmp_path / "ok.json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((tmp_path / "ok.json").read_text())
    jsonschema.validate(rep, REPORT_SCHEMA)
    names = [o["name"] for e in rep["entry_points"] for o in e["outputs"]]
    assert names == ["prefill.logits"] + [f"decode[{i}].logits" for i in range(4)]

    write_checkpoint(config, "hf", tmp_path / "other", dtype="f32", seed=4)
    r = llmc_in_process("diff", tmp_path / "other", compiled["meta"].vmfb, "--steps", "2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL" in r.stdout and "logits" in r.stdout.strip().splitlines()[-1]


def _break(kind, root, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    if kind in ("missing params.json", "wrong n_heads"):
        d = tmp_path / "meta"
        shutil.copytree(root / "meta", d)
        if kind == "missing params.json":
            (d / "params.json").unlink()
        else:
            p = json.loads((d / "params.json").read_text())
            p["n_heads"] *= 2
            (d / "params.json").write_text(json.dumps(p))
        return d
    d = tmp_path / "hf"
    shutil.copytree(root / "hf", d)
    f = d / "model.safetensors"
    if kind == "missing key":
        sd = load_file(f)
        del sd["model.layers.1.mlp.up_proj.weight"]
        save_file(sd, f)
    else:  # truncated
        data = f.read_bytes()
        f.write_bytes(data[: len(data) // 2])
    return d


@pytest.mark.parametrize(
    "kind, needle",
    [
        ("missing params.json", "params.json"),
        ("wrong n_heads", "n_heads"),
        ("missing key", "model.layers.1.mlp.up_proj.weight"),
        ("truncated", "truncated"),
    ],
)
def test_cli_compile_bad_checkpoints(checkpoints, tmp_path, kind, needle):
    root, _, _ = checkpoints
    bad = _break(kind, root, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    r = llmc_in_process("compile", bad, "-o", out / "m.vmfb")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert list(out.iterdir()) == []  # no partial artifacts


def test_generate_edges(compiled):
    """Review findings: the exact cache boundary works; non-finite or non-integer options are refused."""
    import llmc
    from llmc.errors import InputError

    mod = llmc.load(compiled["hf"])
    full = [3] * MAX_SEQ
    assert len(mod.generate(full, 1, stop_at_eos=False)) == 1  # the last new token is never fed back
    assert len(mod.generate(full[:-4], 5, stop_at_eos=False)) == 5
    with pytest.raises(InputError, match="max-seq-len"):
        mod.generate(full[:-4], 6)
    for bad in ({"temperature": float("nan")}, {"top_p": 5.0}, {"max_new_tokens": 2.5}):
        with pytest.raises(InputError):
            mod.generate(PROMPT, **{"max_new_tokens": 3, **bad})


def test_logits_row_is_the_results_and_non_finite_logits_stop_generation(compiled, monkeypatch):
    """generate reads each logits row through Module.host with the manifest's dtype (runtime/generate.py
    _logits_dtype), which on a CPU device maps the result without iree.runtime's per-call queries: the
    same f32 row the plain Module.host gives. A NaN or +inf in a row, the first or a later step's, stops
    the run with RuntimeCallError, greedy (argmax, then its value checked) and sampled (the whole row)."""
    import numpy as np
    from iree.runtime.array_interop import DeviceArray

    import llmc
    from llmc.errors import RuntimeCallError
    from llmc.runtime import generate as gen

    mod = llmc.load(compiled["hf"])
    decode = mod.entry_points["decode"].call_raw
    g = gen.Generator(mod)
    cache = g._new_cache(mod.devices)
    logits = decode([np.asarray([[3]], dtype=np.int64), np.ones((1, 1), dtype=np.int64), *cache])[0]
    dtype = g._logits_dtype("decode")
    assert dtype is not None and dtype == np.asarray(mod.host(logits)).dtype
    plain = np.asarray(mod.host(logits), dtype=np.float32).reshape(-1)
    with monkeypatch.context() as m:  # the mapped read asks iree.runtime nothing per call
        m.setattr(DeviceArray, "_is_mappable", lambda self: pytest.fail("Module.host queried the result"))
        m.setattr(DeviceArray, "_get_raw_dtype", lambda self: pytest.fail("Module.host queried the result"))
        row = g._row(logits, dtype)
    assert row.dtype == np.float32 and row.shape == (mod.manifest["llm"]["config"]["vocab_size"],)
    assert np.array_equal(row, plain)

    real = gen.Generator._row
    # greedy decode steps read a row only on the logits path (the module's choice: the test after this one)
    monkeypatch.setattr(gen.Generator, "greedy_in_module", False)
    for value in (np.nan, np.inf):
        for bad_call in (0, 2):  # the prompt's row, a decode step's
            calls = []

            def poisoned(self, logits, dtype, value=value, bad_call=bad_call, calls=calls):
                out = real(self, logits, dtype)
                if len(calls) == bad_call:
                    out[7] = value
                calls.append(dtype)
                return out

            monkeypatch.setattr(gen.Generator, "_row", poisoned)
            for options in ({}, {"temperature": 0.8, "seed": 1}):
                calls.clear()
                with pytest.raises(RuntimeCallError, match="non-finite logits"):
                    mod.generate(PROMPT, 5, stop_at_eos=False, **options)
                assert len(calls) == bad_call + 1
    monkeypatch.setattr(gen.Generator, "_row", real)
    assert len(mod.generate(PROMPT, 5, stop_at_eos=False)) == 5


@pytest.mark.parametrize("threads, direct, device", [(1, True, None), (1, True, "local-sync"), (2, True, None), (1, False, None)])
def test_greedy_steps_in_the_module_equal_the_logits_path_and_update_the_cache_in_place(compiled, monkeypatch, threads, direct, device):
    """generate()'s greedy steps through decode_greedy (runtime/generate.py GreedySteps: the VM function's
    `$async` form called directly, steps queued one ahead, the cache's buffers passed as they are, the token
    fed back on the device) give the tokens the logits path gives, and leave the cache it leaves, bit for
    bit: the cache results are tied, so the buffers passed in are the ones updated. Only the prefill goes
    through EntryPoint.call_raw. 1 thread runs one local-task worker (where the process has 2 CPUs, else
    local-sync) or local-sync when asked (a call runs inside the invoke: nothing is queued behind it), 2
    threads local-task; direct=False takes the path a non-CPU device would (each step through call_raw,
    the choice read back as a tensor)."""
    import numpy as np

    import llmc
    from llmc.runtime import generate as gen
    from llmc.runtime import module as module_mod

    mod = llmc.load(compiled["hf"], device, threads=threads)
    if device is not None:
        assert mod.device_name == device
    monkeypatch.setattr(gen.GreedySteps, "calls_vm_directly", staticmethod(lambda module, loaded: direct))
    calls = []
    real_call = module_mod.EntryPoint.call_raw
    monkeypatch.setattr(module_mod.EntryPoint, "call_raw", lambda self, arrays: calls.append(self.name) or real_call(self, arrays))
    runs = {}
    for in_module in (True, False):
        monkeypatch.setattr(gen.Generator, "greedy_in_module", in_module)
        calls.clear()
        tokens = mod.generate(PROMPT, 40, stop_at_eos=False)
        cache = [np.array(mod.host(c)) for c in mod._ensure_loaded().spare_cache]
        runs[in_module] = (tokens, cache, mod.last_generation.decode_function, list(calls))
    (t_mod, c_mod, f_mod, calls_mod), (t_host, c_host, f_host, calls_host) = runs[True], runs[False]
    assert (f_mod, f_host) == ("decode_greedy", "decode")
    assert calls_mod == ["prefill"] + ([] if direct else ["decode_greedy"] * 39) and calls_host == ["prefill"] + ["decode"] * 39
    assert len(set(t_host)) > 3 and t_mod == t_host
    assert len(c_mod) == len(c_host) and all(np.array_equal(a, b) for a, b in zip(c_mod, c_host))
    # the steps wrote their rows: past the prompt the cache is not what the prefill left
    assert np.abs(c_mod[0][:, :, len(PROMPT):len(PROMPT) + 39]).max() > 0


def test_greedy_steps_are_queued_one_ahead_and_an_eos_run_drains_its_extra_step(compiled, monkeypatch):
    """On a CPU device, GreedySteps queues step n + 1 (its token read on the device from the buffer step n
    writes) before it waits for step n's choice, never more than two in flight, and none past the run's last
    token or the cache's end. A run ended by an end-of-sequence token waits for the step queued ahead of it:
    the tokens equal the logits path's, the cache rows of the produced tokens too, and the next run on that
    cache (which holds one row more, written past the run's end) gives the logits path's tokens again."""
    import numpy as np

    import llmc
    from llmc.runtime import generate as gen

    mod = llmc.load(compiled["hf"], threads=2)
    events = []
    real_queue, real_wait = gen.GreedySteps._queue, gen.GreedySteps._wait
    monkeypatch.setattr(gen.GreedySteps, "_queue", lambda self, tok, length: (real_queue(self, tok, length),
                                                                               events.append(("queue", length, len(self.queued)))))
    monkeypatch.setattr(gen.GreedySteps, "_wait", lambda self, value: (events.append(("wait", value)), real_wait(self, value)))
    n_new = 12
    tokens = mod.generate(PROMPT, n_new, stop_at_eos=False)
    queued = [e[1] for e in events if e[0] == "queue"]
    first = len(PROMPT) + 1  # the first step feeds the prefill's token at position len(PROMPT)
    assert queued == list(range(first, first + n_new - 1))  # one step per token after the first, none past the run
    assert max(e[2] for e in events if e[0] == "queue") == 2  # the step waited for next, and one behind it
    order = [(e[0], e[1]) for e in events]
    for k in range(1, n_new - 1):  # step k's wait comes after step k + 1 was queued
        assert order.index(("queue", first + k)) < order.index(("wait", k)), order
    # a run that fills the cache: its last token is never fed back, so no step is queued past the one that
    # feeds the token before it
    events.clear()
    assert len(mod.generate(PROMPT, MAX_SEQ - len(PROMPT), stop_at_eos=False)) == MAX_SEQ - len(PROMPT)
    assert max(e[1] for e in events if e[0] == "queue") == MAX_SEQ - 1

    # an end-of-sequence token in the middle: the step queued behind it is drained, its choice dropped
    eos = tokens[5]
    stop = tokens.index(eos) + 1
    monkeypatch.setitem(mod.manifest["llm"]["config"], "eos_ids", [eos])
    in_flight = []  # steps still queued each time a run drains
    real_drain = gen.GreedySteps.drain
    monkeypatch.setattr(gen.GreedySteps, "drain", lambda self, quiet=False: (in_flight.append(len(self.queued)), real_drain(self, quiet)))
    runs = {}
    for in_module in (True, False):
        monkeypatch.setattr(gen.Generator, "greedy_in_module", in_module)
        got = mod.generate(PROMPT, n_new)
        cache = [np.array(mod.host(c)) for c in mod._ensure_loaded().spare_cache]
        again = mod.generate(PROMPT[:3], 6)  # a run on the cache that one left behind
        runs[in_module] = (got, cache, again)
    assert in_flight[:2] == [1, 0]  # the EOS run returned with one step queued behind its last token, drained
    assert runs[True][0] == runs[False][0] == tokens[:stop]
    rows = len(PROMPT) + stop - 1  # the rows the steps of those tokens wrote
    assert all(np.array_equal(a[:, :, :rows], b[:, :, :rows]) for a, b in zip(runs[True][1], runs[False][1]))
    assert runs[True][2] == runs[False][2]


def test_one_thread_greedy_modules_run_on_local_task_where_a_second_cpu_is(compiled, monkeypatch):
    """threads=1 keeps local-sync (runtime/module.py) except for a module whose greedy steps can be queued
    ahead, which runs on one local-task worker while the calling thread queues the next step, when the
    process may use two CPUs; with one it keeps local-sync, as it does for a twin of an older build."""
    import json as json_mod

    import llmc
    from llmc.runtime import module as module_mod

    import iree.runtime as rt

    from llmc.runtime import device as device_mod

    art = compiled["hf"]
    monkeypatch.setattr(device_mod, "usable_cpus", lambda: 2)
    one = llmc.load(art, threads=1)
    assert one.device_name == "local-task"
    # its own one-worker device, not the process's shared local-task device, and no worker count left set:
    # a local-task device made after it gets IREE's default again
    one.generate(PROMPT, 2, stop_at_eos=False)
    assert one._ensure_loaded().config.device is device_mod.one_worker_task_device()
    assert one._ensure_loaded().config.device is not rt.get_device("local-task")
    flags_now = []
    real_parse = rt.flags.parse_flags
    monkeypatch.setattr(rt.flags, "parse_flags", lambda *f: (flags_now.extend(f), real_parse(*f)))
    llmc.load(art, threads=1).generate(PROMPT, 2, stop_at_eos=False)
    assert flags_now == []  # the one-worker device is made once a process
    monkeypatch.setattr(device_mod, "usable_cpus", lambda: 1)
    assert llmc.load(art, threads=1).device_name == "local-sync"
    monkeypatch.setattr(device_mod, "usable_cpus", lambda: 2)
    manifest = json_mod.loads(art.vmfb.with_suffix(".json").read_text())
    older = dict(manifest["llm"]["decode"]["greedy"])
    del older["next_token_input"], older["chosen_output"]
    older["token_int_output"] = 2 + manifest["llm"]["cache"]["count"]
    assert not module_mod.queues_steps_ahead({"llm": {"decode": {"greedy": older}}})
    assert module_mod.queues_steps_ahead(manifest)


def test_a_non_finite_greedy_choice_stops_generation(compiled, monkeypatch):
    """decode_greedy returns -1 where the chosen logit is not finite (its numerics: tests/compiler/test_greedy.py);
    generate() raises there as it does for a non-finite row."""
    import llmc
    from llmc.errors import RuntimeCallError
    from llmc.runtime import generate as gen

    mod = llmc.load(compiled["hf"])
    real = gen.GreedySteps.next
    steps = []

    def poisoned(self, tok, length, ahead=False):
        steps.append(length)
        got = real(self, tok, length, ahead)
        return -1 if len(steps) == 3 else got

    monkeypatch.setattr(gen.GreedySteps, "next", poisoned)
    with pytest.raises(RuntimeCallError, match=f"non-finite logits at position {len(PROMPT) + 3}"):
        mod.generate(PROMPT, 8, stop_at_eos=False)
    assert len(steps) == 3


def test_a_manifest_naming_a_missing_twin_or_a_failing_step_is_one_clear_error(compiled, tmp_path, monkeypatch):
    """A manifest whose greedy record names a function the .vmfb lacks, or puts next_token elsewhere than after the
    cache (a hand-edited or mismatched pair), is a load error: one line naming the module and what to do, exit 2,
    no traceback. Steps asked for out of order are refused. An IREE failure inside a
    direct step is RuntimeCallError naming the function (exit 3 through the CLI, as for call_raw's)."""
    import os

    import llmc
    from llmc.errors import RuntimeCallError
    from llmc.runtime import generate as gen

    src = compiled["hf"].vmfb
    for suffix in (".vmfb", ".irpa"):
        os.link(src.with_suffix(suffix), tmp_path / f"m{suffix}")
    manifest = json.loads(src.with_suffix(".json").read_text())
    manifest["llm"]["decode"]["greedy"]["function"] = "decode_gone"
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    r = _llmc("run", tmp_path / "m.vmfb", "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "4", "--no-eos")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "m.vmfb: the manifest names decode_gone, which the module does not export; recompile it" in lines[0]

    # a record whose next_token is not the argument after the cache: a load error naming it, exit 2
    manifest["llm"]["decode"]["greedy"]["function"] = "decode_greedy"
    manifest["llm"]["decode"]["greedy"]["next_token_input"] = 1
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    r = _llmc("run", tmp_path / "m.vmfb", "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "4", "--no-eos")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert ("m.vmfb: the manifest puts decode_greedy's next_token at input 1, not after the token, the mask and the "
            "cache; recompile it") in lines[0]

    mod = llmc.load(compiled["hf"])
    # steps asked for out of order (a caller bug GreedySteps refuses rather than returning another step's token)
    mod.generate(PROMPT, 2, stop_at_eos=False)
    cache = list(mod._ensure_loaded().spare_cache)
    steps = gen.GreedySteps(mod, mod.manifest["llm"]["decode"]["greedy"], False, cache, MAX_SEQ)
    steps.next(PROMPT[0], len(PROMPT) + 1, ahead=True)
    with pytest.raises(RuntimeCallError, match=f"^decode_greedy: the step at length {len(PROMPT) + 5} was asked for, "
                                               f"{len(PROMPT) + 2} is next$"):
        steps.next(PROMPT[0], len(PROMPT) + 5)
    steps.drain()
    real_init = gen.GreedySteps.__init__

    class Failing:
        def invoke(self, *args):
            raise RuntimeError("INTERNAL; a dispatch failed\nmore detail")

    def init(self, *a, **k):
        real_init(self, *a, **k)
        self.context = Failing()

    monkeypatch.setattr(gen.GreedySteps, "__init__", init)
    with pytest.raises(RuntimeCallError, match="^decode_greedy: IREE failed while running the module: INTERNAL; a dispatch failed$"):
        mod.generate(PROMPT, 4, stop_at_eos=False)


def test_cli_bad_lengths(checkpoints, compiled, tmp_path):
    root, _, _ = checkpoints
    r = llmc_in_process("compile", root / "hf", "--max-seq-len", "2", "-o", tmp_path / "m.vmfb")
    assert r.returncode == 2 and "at least 3" in r.stderr, r.stderr
    r = llmc_in_process("diff", root / "hf", compiled["hf"].vmfb, "--steps", str(MAX_SEQ - 1))
    assert r.returncode == 2 and "--steps" in r.stderr, r.stderr


@pytest.fixture(scope="module")
def plain_module(tmp_path_factory):
    """A non-language-model .pt2 and its artifact, for the LLM-only flags' errors."""
    import llmc

    tmp = tmp_path_factory.mktemp("plain")
    model = torch.nn.Linear(4, 3)
    pt2 = tmp / "lin.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 4),)), pt2)
    return pt2, llmc.compile(pt2, output=tmp / "lin.vmfb")


def test_llm_only_options_are_refused_with_one_line(checkpoints, compiled, plain_module, tmp_path):
    """Each LLM-specific option on the wrong kind of input: exit 2, one line naming the option or file."""
    root, _, _ = checkpoints
    pt2, plain = plain_module
    np_inputs = tmp_path / "x.npz"
    import numpy as np

    np.savez(np_inputs, x=np.zeros((2, 4), np.float32))
    write_checkpoint(get_config("tiny"), "hf", tmp_path / "other-config", dtype="f32", seed=0)
    cases = [
        (("compile", pt2, "--max-seq-len", "64", "-o", tmp_path / "a.vmfb"), "--max-seq-len applies to Llama checkpoints"),
        (("run", plain.vmfb, "--prompt-ids", "1,2"), "not a language-model module"),
        (("run", compiled["hf"].vmfb, "--prompt-ids", "1,,2"), "expected comma-separated integers"),
        (("diff", pt2, plain.vmfb, "--steps", "3"), "--steps: applies to language-model checkpoints"),
        (("diff", root / "hf", compiled["hf"].vmfb, "--inputs", np_inputs), "--inputs: language-model diffs use a seeded prompt"),
        (("diff", root / "hf", plain.vmfb), "is not a language-model module"),
        (("diff", tmp_path / "other-config", compiled["hf"].vmfb), "compiled from a different config"),
        (("diff", root / "hf", compiled["hf"].vmfb, "--seq", "1"), "--seq 1: the prompt needs at least 2 tokens"),
        # options that differ from how the artifact was built are refused for checkpoints too
        (("diff", root / "hf", compiled["hf"].vmfb, "--dtype", "bf16"), "--dtype=bf16: "),
        (("diff", root / "hf", compiled["hf"].vmfb, "--target", "hip"), "--target=hip: "),
        (("run", compiled["hf"].vmfb, "--prompt-ids", "1,2", "--threads", "0"), "--threads 0: give 1 or more"),
        (("run", compiled["hf"].vmfb, "--prompt-ids", "1,2", "--threads", "-1"), "--threads -1: give 1 or more"),
        (("run", compiled["hf"].vmfb, "--prompt-ids", "1,2", "--device", "cuda"), "compiled for cpu:host, which runs on IREE's local-task or local-sync driver, not 'cuda'; use --device=local-task"),
        # no abbreviations: --prompt-id is not --prompt-ids
        (("run", compiled["hf"].vmfb, "--prompt-id", "1,2"), "--prompt-id"),
    ]
    for args, needle in cases:
        r = llmc_in_process(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], (args, r.returncode, r.stderr)
    assert not (tmp_path / "a.vmfb").exists()


def test_generate_empty_prompt(compiled):
    import llmc
    from llmc.errors import InputError

    with pytest.raises(InputError, match="the prompt is empty"):
        llmc.load(compiled["hf"]).generate([], 3)


def test_info_names_dims_and_groups_the_cache(checkpoints, compiled):
    _, config, _ = checkpoints
    r = _llmc("info", compiled["hf"].vmfb)
    assert r.returncode == 0, r.stderr
    entries = {l.split("(")[0].split()[-1]: l for l in r.stdout.splitlines() if l.startswith("entry:")}
    n_cache = 2 * config.n_layers
    assert "int64[1, seq:2.." in entries["prefill"] and f"{n_cache} x float32[1, " in entries["prefill"]
    assert "int64[1, kv_len:1.." in entries["decode"]
    # the same arguments, then the buffer the twin writes its token into
    assert entries["decode_greedy"].split("(", 1)[1] == entries["decode"].split("(", 1)[1][:-1] + ", int64[1, 1])"
    assert any(l.startswith("greedy:   decode_greedy for greedy steps") for l in r.stdout.splitlines()), r.stdout
    assert any(l.startswith("cpu:") and "avx" in l for l in r.stdout.splitlines())  # the CPU features compiled for
    assert "decompose-attention (graph: rewrote" in r.stdout
    from llmc.compiler import targets, ukernels

    if ukernels.unavailable(targets.resolve("cpu", "host", "f32")) is None:  # the decode step's attention: llmc's C kernel
        assert f"decode-attention-kernel (graph: rewrote {config.n_layers})" in r.stdout
    else:  # or decompose-attention's decode form
        assert "decode " in r.stdout
