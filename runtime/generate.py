"""Token generation with the KV cache kept on the device.

A module compiled from a Llama (compiler/llm.py) exports `prefill(tokens, *cache)` and
`decode(token, attention_mask, *cache)`; each returns `(logits, *cache')` with every cache result
tied to its input buffer. The loop here allocates the cache once on the device, passes the device
arrays IREE returns straight into the next call (they are the same buffers, updated in place), and
copies only the [1, 1, vocab] logits to the host. Sampling is numpy on the host. Greedy steps run the
decode function's greedy twin where the module has one (cpu; compiler/greedy.py, GreedySteps below):
the module chooses the token, the host reads that one number, and on a CPU device each step is queued
on the device behind the one before it, before that one's token is read. A prompt goes to
a prefill bucket when one fits (`prefill_N`, padded), else in chunks when the module has
`prefill_chunk` and the prompt is at least a chunk long (its first P mod C tokens through `prefill`),
else to `prefill` whole (one token: a `decode` step).

Each run is recorded as a `Generation` (the module keeps the last one, `Module.last_generation`):
prompt and new ids, and the time of prefill (the prompt's forward pass and the first new token) and of
decode (every later token), without the time spent in the caller's `on_token` callback.
"""

from __future__ import annotations

import collections
import dataclasses
import time

import numpy as np

from llmc.errors import InputError, RuntimeCallError, RuntimeLoadError
from llmc import dtypes


def sample(logits: np.ndarray, rng: np.random.Generator | None, temperature: float, top_k: int, top_p: float) -> int:
    """One token id from a [vocab] logits row. temperature 0 = greedy (the first maximum, like torch.argmax)."""
    if temperature <= 0:
        return int(np.argmax(logits))  # any float dtype: widening keeps the order and the first maximum
    logits = np.asarray(logits, dtype=np.float64)
    z = logits / temperature
    if 0 < top_k < z.size:
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, top_p) + 1)]  # smallest prefix with mass >= top_p
        mask = np.zeros_like(p, dtype=bool)
        mask[keep] = True
        p = np.where(mask, p, 0.0)
        p /= p.sum()
    return int(rng.choice(p.size, p=p))


def _prompt_list(prompt_ids) -> list[int]:
    if hasattr(prompt_ids, "tolist"):
        prompt_ids = prompt_ids.tolist()
    if isinstance(prompt_ids, int):
        prompt_ids = [prompt_ids]
    flat = list(prompt_ids)
    if len(flat) == 1 and isinstance(flat[0], list):  # [[...]] from a [1, S] tensor
        flat = flat[0]
    if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in flat):
        raise InputError("generate: prompt_ids must be a list of integer token ids (or a 1-D / [1, S] integer tensor)")
    return [int(t) for t in flat]


@dataclasses.dataclass
class Generation:
    """One generate() run: the ids and where the time went.

    prefill_seconds: from the prefill call to the first new token sampled (time to first token).
    decode_seconds: the decode steps after it, one per later new token. Neither counts `on_token`.
    text: the decoded new tokens, when the run came from generate_text.
    """

    prompt_ids: list[int]
    tokens: list[int]
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    text: str | None = None
    prefill_function: str | None = None  # the entry point that took the prompt (prefill, prefill_<bucket> or decode)
    decode_function: str | None = None  # the entry point of the steps after it (decode, decode_static or a greedy twin)

    @property
    def decode_steps(self) -> int:
        return max(len(self.tokens) - 1, 0)

    @property
    def prefill_tokens_per_s(self) -> float | None:
        return len(self.prompt_ids) / self.prefill_seconds if self.tokens and self.prefill_seconds > 0 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        return self.decode_steps / self.decode_seconds if self.decode_steps and self.decode_seconds > 0 else None

    def summary(self) -> str:
        """`N prompt tokens, prefill X tok/s; M new tokens, decode Y tok/s` (what `llmc run` prints last)."""
        rate = lambda r: f"{r:.1f} tok/s" if r is not None else "- tok/s"
        return (
            f"{len(self.prompt_ids)} prompt tokens, prefill {rate(self.prefill_tokens_per_s)}; "
            f"{len(self.tokens)} new tokens, decode {rate(self.decode_tokens_per_s)}"
        )

    def as_json(self) -> dict:
        r = lambda x, digits: round(x, digits) if x is not None else None
        return {
            "prefill_seconds": r(self.prefill_seconds, 6),
            "decode_seconds": r(self.decode_seconds, 6),
            "prefill_tokens_per_s": r(self.prefill_tokens_per_s, 2),
            "decode_tokens_per_s": r(self.decode_tokens_per_s, 2),
            "prefill_function": self.prefill_function,
            "decode_function": self.decode_function,
        }


def choose_bucket(buckets: list[dict], n: int, min_fill: float) -> dict | None:
    """The smallest prefill bucket that holds an n-token prompt and that it fills to at least
    `min_fill` of its size; None: the dynamic prefill takes it."""
    fits = [b for b in buckets if n <= int(b["tokens"])]
    if not fits:
        return None
    best = min(fits, key=lambda b: int(b["tokens"]))
    return best if n >= min_fill * int(best["tokens"]) else None


def step_inputs(tok: int, length: int, static: bool) -> tuple[np.ndarray, np.ndarray]:
    """A decode step's first two arguments, feeding `tok` at position length - 1: the token, then the position
    (decode_static) or the attention mask over the `length` live rows (decode)."""
    second = np.asarray([length - 1], dtype=np.int64) if static else np.ones((1, length), dtype=np.int64)
    return np.asarray([[tok]], dtype=np.int64), second


def queueable_twin(record: dict | None) -> bool:
    """Whether a decode record's `greedy` entry names a twin GreedySteps runs (compiler/greedy.py record): one
    that returns its choice as a tensor and writes its token into a buffer of the caller's (next_token_input),
    so a step can be queued behind it. Older builds' twins returned a VM integer instead."""
    return bool(record) and {"function", "token_output", "chosen_output", "next_token_input"} <= set(record)


class GreedySteps:
    """Greedy decode steps through a decode function's `_greedy` twin (compiler/greedy.py): the module
    chooses each token (-1: its logit was not finite), and the host reads that one number instead of
    the logits row.

    On a CPU device (IREE's local drivers, one device) a step calls the twin's coarse-fences form
    (`<twin>$async`) directly, with nothing made on the host but the argument list: the token and
    next_token are two buffers made once (the prompt's token, and one the first step writes its token
    into), swapped after every step; the attention mask is a view of the first `length`
    entries of one buffer of ones made once; the cache's buffer views go in as they are (every cache
    result is tied to its argument, so the steps update the same buffers). Each step waits on the
    device for the step before it (a fence on one semaphore) and signals the next value, so `next`
    can queue step n + 1 before it waits for step n's choice: the host's side of step n + 1 (the call,
    the command buffer's recording, the submission) runs while step n does, and when step n ends the
    workers go on to step n + 1 without waiting for the host (docs/targets.md "Steps queued ahead").
    A step queued ahead of a run's last token (an end-of-sequence token) is waited for and its choice
    dropped (`drain`); it wrote a cache row past the run's last one, which nothing reads before
    rewriting it (Generator.generate). Elsewhere a step goes through EntryPoint.call_raw and
    Module.host, one at a time.

    spec: the decode record's `greedy` entry (compiler/greedy.py record); static: the decode
    function takes the position (decode_static) instead of the attention mask; cache: the device
    arrays the prefill returned; max_len: the module's max-seq-len (the longest mask).
    """

    queue_ahead = True  # False: each step waited for before the next is queued (A/B runs)

    def __init__(self, module, spec: dict, static: bool, cache: list, max_len: int):
        self.module = module
        self.name = spec["function"]
        self.token_output, self.chosen_output = int(spec["token_output"]), int(spec["chosen_output"])
        self.static = static
        if int(spec["next_token_input"]) != 2 + len(cache):  # the argument lists next and _queue build
            raise RuntimeLoadError(f"{module.vmfb.name}: the manifest puts {self.name}'s next_token at input "
                                   f"{spec['next_token_input']}, not after the token, the mask and the cache; recompile it")
        loaded = module._ensure_loaded()
        self.direct = self.calls_vm_directly(module, loaded)
        self.cache = cache
        self.queued = collections.deque()  # (length, the choice's buffer view, fence value) per step in flight, oldest first
        if not self.direct:
            self.call = module.entry_points[self.name].call_raw
            return
        import iree.runtime as rt

        self.rt = rt
        self.function = loaded.main.lookup_function(self.name + "$async")
        if self.function is None:
            raise RuntimeLoadError(f"{module.vmfb.name}: the manifest names {self.name}, which the module does not export; recompile it")
        self.context, self.device = loaded.context, loaded.config.device
        self.refs = [c._buffer_view for c in cache]
        self.n_results = max(self.token_output, self.chosen_output) + 1
        from llmc.runtime.device import caller_yields_to_workers

        self.yields, self.waits = caller_yields_to_workers, module.device_driver == "local-task"
        self.tokens = None  # two [1, 1] int64 device buffers: a step reads its token from one, writes the next into the other
        self.ones = None if static else self._upload(np.ones((1, max_len), dtype=np.int64)).get_buffer()
        self.semaphore = self.device.create_semaphore(0)
        self.timeline = 0  # the value the last queued step signals
        self.waited = 0  # the last value waited for: a step above it may still be running

    @staticmethod
    def calls_vm_directly(module, loaded) -> bool:
        """Whether steps call the VM function themselves: a CPU device (IREE's local drivers), one device."""
        from llmc.runtime import weights as weights_mod

        return module.device_driver in weights_mod.LOCAL_DRIVERS and len(loaded.devices) == 1

    def _upload(self, a: np.ndarray):
        rt = self.rt
        return self.device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=self.device,
            buffer=a, element_type=rt.HalElementType.SINT_64)

    def next(self, tok: int, length: int, ahead: bool = False) -> int:
        """The choice of the step feeding `tok` at position length - 1 (-1 where its logit was not finite).
        ahead: queue the step after it (position length) first, which feeds this step's token from the device;
        the caller asks only when that step will be needed unless this token ends the run, and length < max_len."""
        if not self.direct:
            out = list(self.call([*step_inputs(tok, length, self.static), *self.cache, np.zeros((1, 1), dtype=np.int64)]))
            self.cache = out[1:1 + len(self.cache)]
            return int(np.asarray(self.module.host(out[self.chosen_output])).reshape(-1)[0])
        if not self.queued:
            self._queue(tok, length)
        if ahead and self.queue_ahead:
            self._queue(None, length + 1)
        queued_length, chosen, value = self.queued.popleft()
        if queued_length != length:
            raise RuntimeCallError(f"{self.name}: the step at length {length} was asked for, {queued_length} is next")
        self._wait(value)
        return int(chosen.map().asarray((1, 1), np.dtype(np.int64))[0, 0])

    def _queue(self, tok: int | None, length: int) -> None:
        """Call the twin for the step at position length - 1, behind the last queued step: its token is `tok`
        from the host for the first step, else the one the step before wrote into the token buffer."""
        rt = self.rt
        args = rt.VmVariantList(5 + len(self.refs))
        first = self.tokens is None
        if first or self.static:
            token, second = step_inputs(0 if tok is None else tok, length, self.static)
        if first:  # the prompt's token, and the buffer the first step writes its token into
            self.tokens = [self._upload(token), self._upload(np.zeros((1, 1), dtype=np.int64))]
        args.push_ref(self.tokens[0])
        args.push_ref(self._upload(second) if self.static else rt.HalBufferView(self.ones, (1, length), rt.HalElementType.SINT_64))
        for r in self.refs:
            args.push_ref(r)
        args.push_ref(self.tokens[1])  # next_token: this step's token lands here (compiler/greedy.py)
        self.tokens.reverse()  # the next step reads it from there
        args.push_ref(rt.HalFence.create_at(self.semaphore, self.timeline).ref)  # wait: the step before
        args.push_ref(rt.HalFence.create_at(self.semaphore, self.timeline + 1).ref)  # signal: this one
        results = rt.VmVariantList(self.n_results)
        try:
            self.context.invoke(self.function, args, results)
        except Exception as e:
            raise RuntimeCallError(f"{self.name}: IREE failed while running the module: {str(e).splitlines()[0]}") from e
        self.timeline += 1
        self.queued.append((length, results.get_as_ref(self.chosen_output).deref(rt.HalBufferView), self.timeline))

    def _wait(self, value: int) -> None:
        try:
            with self.yields(self.waits):
                self.rt.HalFence.create_at(self.semaphore, value).wait()
        except Exception as e:
            raise RuntimeCallError(f"{self.name}: IREE failed while running the module: {str(e).splitlines()[0]}") from e
        self.waited = max(self.waited, value)

    def drain(self, quiet: bool = False) -> None:
        """Wait for the steps still queued (one queued ahead of the run's last token) and drop their choices.
        quiet: on the way out of an error, a failure here is not raised over it."""
        self.queued.clear()
        if not self.direct or self.timeline <= self.waited:  # nothing queued is still running
            return
        try:
            self._wait(self.timeline)
        except RuntimeCallError:
            if not quiet:
                raise


class Generator:
    """The generation loop over one loaded llmc Module with an `llm` section in its manifest."""

    # False: greedy steps read the logits row even where the module can choose the token (tests, A/B runs)
    greedy_in_module = True

    def __init__(self, module):
        llm = module.manifest.get("llm")
        if not llm:
            raise InputError(
                f"{module.vmfb}: not a language-model module (no prefill/decode entry points); "
                "compile a Llama checkpoint with `llmc compile CHECKPOINT` to get one"
            )
        self.module = module
        self.llm = llm
        self.config = llm["config"]
        self.max_seq_len = int(llm["max_seq_len"])
        self.last: Generation | None = None

    def _check(self, prompt: list[int], max_new_tokens: int) -> None:
        vocab = self.config["vocab_size"]
        where = f"{self.module.vmfb.name}"
        if not prompt:
            raise InputError(f"{where}: the prompt is empty; give at least one token id")
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise InputError(f"{where}: prompt id(s) {bad[:5]} outside the vocabulary [0, {vocab})")
        if max_new_tokens < 0:
            raise InputError(f"{where}: max_new_tokens={max_new_tokens} must be >= 0")
        if len(prompt) > self.max_seq_len:
            raise InputError(
                f"{where}: the prompt has {len(prompt)} tokens, more than the module's max-seq-len {self.max_seq_len}; "
                "shorten it or recompile with a larger --max-seq-len"
            )
        # The last new token is returned, never fed back: the cache holds prompt + new - 1 positions.
        if len(prompt) + max_new_tokens - 1 > self.max_seq_len:
            raise InputError(
                f"{where}: prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceeds the module's "
                f"max-seq-len {self.max_seq_len}; ask for at most {self.max_seq_len - len(prompt) + 1} new tokens "
                "or recompile with a larger --max-seq-len"
            )

    def _new_cache(self, devices: list):
        """Zeroed KV cache tensors, each on its device (a split module's shards: llm.tensor_parallel)."""
        import iree.runtime as rt

        spec = self.llm["cache"]
        zeros = np.zeros(spec["shape"], dtype=dtypes.by_name(spec["dtype"]).numpy)
        on = (self.llm.get("tensor_parallel") or {}).get("cache_devices") or [0] * spec["count"]
        return [rt.asdevicearray(devices[d], zeros) for d in on]

    def _logits_dtype(self, function: str):
        """The numpy dtype of `function`'s logits as the manifest records it (a `--dtype bf16` cpu module
        returns bf16 ones, passes/bf16_outputs.py), for Module.host; None where it records none."""
        outputs = self.module.manifest["entry_points"][function].get("outputs") or {}
        spec = outputs.get("children", [{}])[0] if outputs.get("type") == "tuple" else {}
        return dtypes.by_name(spec["dtype"]).numpy if spec.get("type") == "tensor" else None

    def _row(self, logits, dtype) -> np.ndarray:
        """A logits result's [vocab] row as f32 on the host."""
        return np.asarray(self.module.host(logits, dtype).reshape(-1), dtype=np.float32)

    def _chunked_prefill(self, prompt: list[int], c: int, min_tokens: int, cache) -> list:
        """A prompt of P >= c tokens: its first P mod c tokens through the dynamic prefill (one token: a
        decode step at position 0), then c at a time through prefill_chunk (LlamaPrefillChunk), each
        after the positions before it; returns the last call's (logits, *cache). No padding, so no
        position is computed twice."""
        entry = self.module.entry_points
        ids = np.asarray([prompt], dtype=np.int64)
        head = len(prompt) % c
        if head >= min_tokens:
            cache = list(entry[self.llm["prefill"]["function"]].call_raw([ids[:, :head], *cache]))[1:]
        elif head:
            cache = list(entry[self.llm["decode"]["function"]].call_raw([ids[:, :head], np.ones((1, head), dtype=np.int64), *cache]))[1:]
        step = entry[self.llm["prefill_chunk"]["function"]].call_raw
        for end in range(head + c, len(prompt) + 1, c):
            out = list(step([ids[:, end - c:end], np.ones((1, end), dtype=np.int64), *cache]))
            cache = out[1:]
        return out

    def generate(
        self,
        prompt_ids,
        max_new_tokens: int = 32,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_at_eos: bool = True,
        on_token=None,
    ) -> list[int]:
        import math
        import operator

        prompt = _prompt_list(prompt_ids)
        try:
            max_new_tokens = operator.index(max_new_tokens)
            top_k = operator.index(top_k)
        except TypeError:
            raise InputError("generate: max_new_tokens and top_k must be integers") from None
        if not (math.isfinite(temperature) and temperature >= 0) or not (math.isfinite(top_p) and 0 < top_p <= 1) or top_k < 0:
            raise InputError("generate: temperature must be a finite number >= 0, top_p in (0, 1], top_k >= 0")
        self._check(prompt, max_new_tokens)
        tokens: list[int] = []
        self.last = run = Generation(prompt, tokens)
        if max_new_tokens == 0:
            return tokens
        prefill = self.module.entry_points[self.llm["prefill"]["function"]].call_raw
        decode = self.module.entry_points[self.llm["decode"]["function"]].call_raw
        static = self.llm.get("decode_static")
        if static is not None:
            # every step the same shapes (LlamaDecodeStatic): the position as a tensor
            run.decode_function = static["function"]
            step = self.module.entry_points[static["function"]].call_raw
        else:
            run.decode_function = self.llm["decode"]["function"]
            step = decode

        def decode_step(tok: int, length: int, cache):
            return step([*step_inputs(tok, length, static is not None), *cache])
        devices = self.module.devices
        rng = np.random.default_rng(seed) if temperature > 0 else None
        eos = set(self.config.get("eos_ids") or ()) if stop_at_eos else set()
        # The last generate's cache, as it left it, when there is one: nothing reads a row this run has
        # not written (prefill attends over the prompt's own K/V; a decode step writes its row before
        # it reads rows <= it, and decode_static masks the rows after it), so stale rows are as safe as
        # a bucket's pads, and no zeroed cache is made and uploaded (cuda: 24-32 host-to-device copies,
        # 0.4-1.5 ms of every prefill measured on an H200; 1 GB of zeros for an 8B f32 cache).
        loaded = self.module._ensure_loaded()
        cache, loaded.spare_cache = loaded.spare_cache, None  # a run that fails leaves none behind
        if cache is None:
            cache = self._new_cache(devices)

        bucket = choose_bucket(self.llm.get("prefill_buckets") or [], len(prompt), float(self.llm.get("prefill_bucket_min_fill", 0.0)))
        chunk = self.llm.get("prefill_chunk")

        start = time.perf_counter()
        in_callback = 0.0  # the caller's on_token time, left out of prefill and decode
        min_tokens = int(self.llm["prefill"].get("min_tokens", 2))  # a shorter prompt is a decode step
        if len(prompt) >= min_tokens and bucket is not None:
            # The prompt, then pad ids (0) up to the bucket's size: see LlamaPrefillBucket for why that is safe.
            padded = np.zeros((1, int(bucket["tokens"])), dtype=np.int64)
            padded[0, :len(prompt)] = prompt
            run.prefill_function = bucket["function"]
            out = list(self.module.entry_points[bucket["function"]].call_raw([padded, np.asarray([len(prompt)], dtype=np.int64), *cache]))
        elif chunk is not None and len(prompt) >= int(chunk["tokens"]):
            out = self._chunked_prefill(prompt, int(chunk["tokens"]), min_tokens, cache)
            run.prefill_function = chunk["function"]
        elif len(prompt) >= min_tokens:
            run.prefill_function = self.llm["prefill"]["function"]
            out = list(prefill([np.asarray([prompt], dtype=np.int64), *cache]))
        else:  # a one-token prompt is a decode step at position 0
            run.prefill_function = self.llm["decode"]["function"]
            out = list(decode([np.asarray([prompt], dtype=np.int64), np.ones((1, 1), dtype=np.int64), *cache]))
        length = len(prompt)
        logits_dtype = self._logits_dtype(run.prefill_function)  # the first row is the prompt's, then the steps'
        # Greedy steps after the first token: the module's choice when its decode function has a greedy
        # twin (GreedySteps), the same token as the row's argmax below, NaN and infinities included.
        greedy = (static if static is not None else self.llm["decode"]).get("greedy") if temperature <= 0 and self.greedy_in_module else None
        steps = chosen = None
        if greedy is not None and not queueable_twin(greedy):
            greedy = None  # an older twin (a VM integer result: no step can be queued behind it): the logits path
        try:
            while True:
                if steps is not None:  # the module's choice: -1 where the chosen logit was not finite
                    tok = chosen
                    finite = tok >= 0
                else:
                    logits, cache = out[0], out[1:]
                    row = self._row(logits, logits_dtype)
                    if temperature <= 0:
                        # Greedy: the first maximum, then its value checked. NaN wins numpy's argmax (its first
                        # NaN) and +inf is the maximum, so either is caught without a pass of its own over the
                        # vocabulary (0.05 ms a step for 32000 logits); only logits all -inf leave a -inf there.
                        tok = int(np.argmax(row))
                        finite = np.isfinite(row[tok])
                    else:
                        finite = np.isfinite(row).all()
                if not finite:
                    raise RuntimeCallError(f"{self.module.vmfb.name}: the module returned non-finite logits at position {length}")
                if temperature > 0:
                    tok = sample(row, rng, temperature, top_k, top_p)
                tokens.append(tok)
                now = time.perf_counter()
                if len(tokens) == 1:
                    run.prefill_seconds, start = now - start, now
                else:
                    run.decode_seconds = now - start - in_callback
                if on_token is not None:
                    on_token(tok)
                    in_callback += time.perf_counter() - now
                if len(tokens) >= max_new_tokens or tok in eos:
                    if steps is not None:
                        steps.drain()  # the step queued ahead of an end-of-sequence token writes the cache
                    loaded.spare_cache = steps.cache if steps is not None else cache
                    return tokens
                length += 1
                if len(tokens) == 1:
                    logits_dtype = self._logits_dtype(run.decode_function)
                    if greedy is not None:
                        steps = GreedySteps(self.module, greedy, static is not None, list(cache), self.max_seq_len)
                        run.decode_function = greedy["function"]
                if steps is not None:
                    # queue the step after this one first, unless this one gives the run's last token
                    chosen = steps.next(tok, length, ahead=len(tokens) + 1 < max_new_tokens and length < self.max_seq_len)
                else:
                    out = list(decode_step(tok, length, cache))
        finally:
            if steps is not None:  # a step queued ahead, when an error ends the run
                steps.drain(quiet=True)
