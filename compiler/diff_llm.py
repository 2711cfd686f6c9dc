"""`llmc diff` for language-model artifacts: a prompt, then N greedy decode steps, against eager PyTorch.

MODEL is the Llama checkpoint the artifact was compiled from (Meta or HF form). Eager PyTorch runs
llmc's Llama definition (models/llama, checked against transformers in tests/models) in the
artifact's dtype through the same prefill/decode wrappers; the compiled module runs its `prefill`
and `decode` entry points, and each prefill bucket (`prefill_N`, the prompt padded to N) where the
prompt fits. Both sides are fed the same tokens: a seeded random prompt (`--seq`
tokens, default 17), then eager's greedy choice at each step (teacher forcing), so one early
disagreement does not cascade into comparing unrelated continuations. Every step's logits are
compared as logits (max_rel, cosine, top-1/top-k agreement, KL); the report also records whether
the greedy tokens agree.
"""

from __future__ import annotations

import time

import torch

from llmc import dtypes
from llmc.compiler import diff_inputs, diff_metrics, export, lower
from llmc.errors import UsageError

DEFAULT_STEPS = 8


def run(o, overrides: dict):
    import contextlib
    import tempfile
    from pathlib import Path

    from llmc.compiler import llm, report
    from llmc.models.llama.model import LlamaDecode, LlamaPrefill, LlamaPrefillChunk, new_cache
    from llmc.runtime import load

    if o.inputs is not None:
        raise UsageError("--inputs: language-model diffs use a seeded prompt (--seed, --seq); .npz inputs are for .pt2 models")
    steps = DEFAULT_STEPS if o.steps is None else o.steps
    if steps < 0:
        raise UsageError(f"--steps {steps}: must be >= 0")
    with contextlib.ExitStack() as stack:
        if o.artifact is None:
            output = o.output or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llmc-diff-"))) / "model.vmfb"
            opts = lower.CompileOptions(
                target=o.target or "cpu", dtype=o.dtype or "f32", arch=o.arch, output=output, repro_dir=o.repro_dir, quiet=not o.verbose
            )
            art = llm.compile_llm(o.model, opts)
            vmfb = art.vmfb
        else:
            vmfb = o.artifact
        mod = load(vmfb)
        manifest = mod.manifest
        if not manifest.get("llm"):
            raise UsageError(f"{vmfb} is not a language-model module; diff it against the .pt2 it was compiled from")
        if o.artifact is not None:
            diff_inputs.check_built_with(o, manifest)
        dtype = manifest["dtype"]
        max_len = manifest["llm"]["max_seq_len"]
        narrowed = bool(manifest["llm"]["cache"].get("narrowed"))
        profile = diff_metrics.profile_for(dtype, narrowed) if o.profile == "auto" else o.profile
        tol = {**diff_metrics.TOLERANCES[profile], **overrides}
        if o.seq is not None and o.seq < 2:
            raise UsageError(f"--seq {o.seq}: the prompt needs at least 2 tokens")
        seq = min(17 if o.seq is None else o.seq, max_len - steps)
        if seq < 2:
            raise UsageError(
                f"--steps {steps}: leaves room for a prompt of {max(seq, 0)} token(s) in max-seq-len {max_len}; "
                f"use at most {max_len - 2} steps"
            )

        # Eager runs in --dtype; for fp8/int8 (no eager dtype) in the dtype the module computes in, with the
        # original weights, so the comparison includes the quantization error.
        eager_dtype = dtype if dtypes.compute_torch_dtype(dtype) is not None else manifest["compute_dtype"]
        llama = export.convert_module(llm.load_llama(o.model), dtypes.compute_torch_dtype(eager_dtype)).eval()
        llama.set_rope_positions(max_len)
        cfg = llama.config
        if cfg.as_dict() != {**manifest["llm"]["config"], "eos_ids": list(manifest["llm"]["config"]["eos_ids"])}:
            raise UsageError(f"{o.model} is a {cfg.name} but {vmfb} was compiled from a different config; diff against its own checkpoint")
        g = torch.Generator().manual_seed(o.seed)
        prompt = torch.randint(0, cfg.vocab_size, (1, seq), generator=g)

        start = time.perf_counter()
        results, agree = [], []
        tdt = dtypes.compute_torch_dtype(eager_dtype)
        # The module's cache is in its compute dtype, which differs from --dtype where that is emulated
        # (bf16 on SPIR-V computes in f32).
        cache_tdt = dtypes.by_name(manifest["llm"]["cache"]["dtype"]).torch
        compute = next(k for k, v in dtypes.COMPUTE_DTYPES.items() if v == manifest["llm"]["cache"]["dtype"])
        # A cache the user narrowed (--kv-dtype bf16 under f32 math) is part of the model's meaning: eager
        # stores its K/V in that dtype too (models/llama/model.py `stored`), so only the arithmetic differs.
        ref_kv = cache_tdt if narrowed else tdt
        with torch.no_grad():
            ref = LlamaPrefill(llama)(prompt, *new_cache(cfg, max_len, ref_kv))
        got = mod.prefill(prompt, *module_cache(manifest))
        results.append(diff_metrics.compare("prefill.logits", got[0], ref[0], tol, logits=True, top_k=o.top_k))
        prefill_ref = ref[0]
        got_logits, fed = [got[0]], []  # kept for the fp8 second reference (same_weights below)
        ref_cache, got_cache = ref[1:], got[1:]
        n = prompt.shape[1]
        # --per-layer localises both entry points on eager's inputs: the prompt, and the first decode
        # step after eager's prefill (teacher forcing, as the logits comparison does).
        per_layer_inputs = {"prefill": (prompt, *new_cache(cfg, max_len, cache_tdt))}
        tok0 = ref[0][0, -1].float().argmax().item()
        per_layer_inputs["decode"] = (torch.tensor([[tok0]]), torch.ones(1, n + 1, dtype=torch.int64), *(c.to(cache_tdt) for c in ref_cache))
        for i in range(steps):
            tok = ref[0][0, -1].float().argmax().item()
            agree.append(tok == got[0][0, -1].float().argmax().item())
            n += 1
            token, mask = torch.tensor([[tok]]), torch.ones(1, n, dtype=torch.int64)
            with torch.no_grad():
                ref = LlamaDecode(llama)(token, mask, *ref_cache)
            got = mod.decode(token, mask, *got_cache)
            results.append(diff_metrics.compare(f"decode[{i}].logits", got[0], ref[0], tol, logits=True, top_k=o.top_k))
            got_logits.append(got[0])
            fed.append((token, mask))
            ref_cache, got_cache = ref[1:], got[1:]
        # The prefill buckets (--prefill-buckets), which generate() prefers where the prompt fits: the same
        # prompt padded at the end to each bucket, the logits of its last position against eager's prefill.
        for b in manifest["llm"].get("prefill_buckets") or []:
            size = int(b["tokens"])
            if size < seq:
                continue
            padded = torch.zeros(1, size, dtype=torch.int64)
            padded[:, :seq] = prompt
            got_b = getattr(mod, b["function"])(padded, torch.tensor([seq]), *module_cache(manifest))
            results.append(diff_metrics.compare(f"{b['function']}.logits", got_b[0], prefill_ref, tol, logits=True, top_k=o.top_k))
        # The prefill chunk (--prefill-chunk), which generate() runs for long prompts: C new tokens after `head`
        # positions that eager's prefill put in the cache, against eager's prefill of all head + C at once.
        chunk = manifest["llm"].get("prefill_chunk")
        if chunk:
            c = int(chunk["tokens"])
            head = min(seq, max_len - c)
            ids = torch.randint(0, cfg.vocab_size, (1, head + c), generator=torch.Generator().manual_seed(o.seed + 1))
            mask = torch.ones(1, head + c, dtype=torch.int64)
            with torch.no_grad():
                before = LlamaPrefill(llama)(ids[:, :head], *new_cache(cfg, max_len, ref_kv))[1:]
                # a cache narrower than eager's math: the chunk attends over the rounded rows before it, one
                # prefill over unrounded ones, so eager's own chunk is the reference there (eager bf16 with
                # a bf16 cache rounds everything anyway: one prefill, as for every other module)
                whole = (LlamaPrefillChunk(llama)(ids[:, head:], mask, *before) if ref_kv != tdt else
                         LlamaPrefill(llama)(ids, *new_cache(cfg, max_len, ref_kv)))[0]
            got_c = getattr(mod, chunk["function"])(ids[:, head:], mask, *(t.to(cache_tdt) for t in before))
            results.append(diff_metrics.compare(f"{chunk['function']}.logits", got_c[0], whole, tol, logits=True, top_k=o.top_k))
        seconds = time.perf_counter() - start
        located = {}
        if (o.per_layer or o.per_layer_depth is not None) and manifest["llm"].get("tensor_parallel"):
            raise UsageError(f"--per-layer: {vmfb} is split over {manifest['llm']['tensor_parallel']['devices']} devices; "
                             "localise with its --tensor-parallel 1 build")
        if o.per_layer or o.per_layer_depth is not None:
            from llmc.compiler import per_layer

            for entry in llm.export_llm(llama, compute, max_len):
                workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llmc-per-layer-")))
                located[entry.function] = per_layer.localise(
                    entry.exported.program, mod, per_layer_inputs[entry.function], {}, tol, depth=o.per_layer_depth,
                    workdir=workdir, repro_dir=o.repro_dir or Path.cwd(), quiet=not o.verbose,
                    strip_prefix=entry.exported.strip_prefix,
                )
        same = None
        if dtype in lower.QUANTIZED_DTYPES:
            same = _same_weights_reference(llama, mod, manifest, prompt, fed, got_logits, max_len, ref_kv, o.top_k)

    bad = diff_metrics.worst(results)
    passed = all(r.passed for r in results)
    lines = [diff_metrics.result_line(r) for r in results]
    lines.append(f"greedy tokens: {sum(agree)} of {len(agree)} decode-step inputs agree with eager's choice")
    if same is not None:
        lines.append(same.line())
    n_fail = sum(not r.passed for r in results)
    if passed:
        summary = f"PASS: prompt of {prompt.shape[1]} + {steps} decode steps, {len(results)} logits outputs, tolerance profile {profile}"
    else:
        summary = f"FAIL: {n_fail} of {len(results)} logits outputs over tolerance (profile {profile}); worst {bad.name}: {bad.reason}"
    for name, pl in located.items():
        lines.extend(per_layer.summary_lines(pl, o.verbose, label=f"per-layer {name}"))
        if not passed:
            summary += f"; {name}: first divergent module " + (pl.first.probe.module if pl.first else "none")
    if same is not None:
        summary = same.summary(summary, passed)
    lines.append(summary)
    entries = [report.entry_record("prefill+decode", results, bad, seconds, None)]
    if same is not None:
        entries.append(same.entry("prefill+decode"))
    # One report entry per localised entry point: its logits output and its module outputs.
    firsts = {"prefill": results[:1], "decode": results[1:2]}
    for name, pl in located.items():
        entries.append(report.entry_record(f"{name} (per-layer)", firsts[name], diff_metrics.worst(firsts[name]), pl.compile_seconds, pl))
    rep = report.build_report(
        summary=summary, model=str(o.model), artifact=str(vmfb), compiled_by_diff=o.artifact is None, manifest=manifest,
        profile=profile, tolerance=tol, overrides=overrides,
        inputs={"source": "random", "seed": o.seed, "file": None},
        entries=entries, same_weights=same and same.record(),
    )
    return report.DiffOutcome(rep["passed"], rep, lines)


def module_cache(manifest: dict) -> list[torch.Tensor]:
    """A zeroed KV cache as the module takes it (the manifest's count, shape and dtype: a module split
    over devices takes each layer's cache in shards)."""
    spec = manifest["llm"]["cache"]
    return [torch.zeros(spec["shape"], dtype=dtypes.by_name(spec["dtype"]).torch) for _ in range(spec["count"])]


def _same_weights_reference(llama, mod, manifest, prompt, fed, got_logits, max_len, tdt, top_k):
    """fp8/int8: eager again on the same inputs, each quantized weight replaced by decode(q) * s (changes
    `llama` in place: run after everything else that needs the original weights). What remains
    between the two sides is the compute dtype's arithmetic, judged by that dtype's profile."""
    from llmc.compiler import report
    from llmc.compiler.diff_eager import same_quantized_weights
    from llmc.models.llama.model import LlamaDecode, LlamaPrefill, new_cache

    start = time.perf_counter()
    split = manifest["llm"].get("tensor_parallel")
    if split:
        # A split module quantized each device's part on its own (a column shard's scales span only its
        # columns): the same shards over llama's weights, as views, make the same values in place.
        from llmc.models.llama.tensor_parallel import TensorParallelLlama

        n = same_quantized_weights(TensorParallelLlama(llama, split["devices"]), mod.params, manifest)
    else:
        n = same_quantized_weights(llama, mod.params, manifest)
    profile = diff_metrics.profile_for(manifest["compute_dtype"], bool(manifest["llm"]["cache"].get("narrowed")))
    tol = diff_metrics.TOLERANCES[profile]
    with torch.no_grad():
        ref = LlamaPrefill(llama)(prompt, *new_cache(llama.config, max_len, tdt))
        out = [diff_metrics.compare("prefill.logits", got_logits[0], ref[0], tol, logits=True, top_k=top_k)]
        for i, ((token, mask), got) in enumerate(zip(fed, got_logits[1:])):
            ref = LlamaDecode(llama)(token, mask, *ref[1:])
            out.append(diff_metrics.compare(f"decode[{i}].logits", got, ref[0], tol, logits=True, top_k=top_k))
    return report.SameWeights(out, profile, tol, n, time.perf_counter() - start, label=manifest["dtype"])
