"""Write a random-weight Llama checkpoint of a named config, in Meta or Hugging Face format.

    python tools/make_checkpoint.py --config tiny --format hf --out /tmp/tiny-hf [--dtype bf16] [--seed 0] [--shard-size-gb 5]

Formats: `meta` writes consolidated.00.pth + params.json; `hf` writes config.json + model.safetensors,
or model-0000k-of-0000n.safetensors + model.safetensors.index.json when the weights exceed
--shard-size-gb. Both load with `llmc.models.llama.loaders.load_checkpoint`.

Same seed, same weights, in either format: every tensor is generated in HF layout, in HF's order,
from its own generator seeded with (seed, tensor name); the Meta writer then renames it and puts q/k
into Meta's interleaved rotary order. So `load_checkpoint(meta) == load_checkpoint(hf)` exactly.
Init: embedding and linear weights ~ N(0, 1/fan_in) with fan_in = the row length; norm weights
1 + 0.1 * N(0, 1).

Memory: one tensor at a time, so a llama3-8b (16 GB in bf16) fits on a small machine. safetensors
files are written by hand (8-byte header length, JSON header, raw data), streamed tensor by tensor.
For .pth, torch.save needs the whole dict: it is saved from fake tensors (FakeTensorMode) under
`torch.serialization.skip_data()`, which lays out the zip with holes where the data goes (a sparse
file); the storage offsets are read back with a meta-device torch.load, each tensor's bytes are
written there, and the result is checked by a memory-mapped torch.load at the end.

Output goes to a temporary folder beside --out and is renamed into place when complete: an error
or Ctrl-C leaves no half-written checkpoint.

--tokenizer hf|tiktoken|sentencepiece also writes a small tokenizer trained on a few built-in lines of
text (deterministic, well under a second), with at most the config's vocab_size ids, and sets the
config's BOS/EOS ids to the tokenizer's:
  hf             tokenizer.json: byte-level BPE with Llama-3's pre-tokenizer (the `tokenizers` library)
  tiktoken       tokenizer.model: Llama-3's format, "<base64 token> <rank>" lines (256 bytes + merges);
                 Meta's 256 special tokens follow the ranks, so vocab_size must be at least 512
  sentencepiece  tokenizer.model: Llama-2's format, a SentencePiece BPE model with byte fallback
With --format hf it also writes tokenizer_config.json with a chat template (Llama-3's turn markers,
or Llama-2's [INST] for sentencepiece), as Hugging Face chat checkpoints have.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import math
import os
import shutil
import signal
import struct
import sys
import tempfile
import time
from pathlib import Path

import torch

from llmc import dtypes
from llmc.errors import LlmcError, UsageError
from llmc.models.llama.config import CONFIGS, LlamaConfig, get_config
from llmc.models.llama.loaders import DTYPES, hf_to_meta_name, hf_to_meta_rotary, llama_param_shapes

FORMATS = ("meta", "hf")
TOKENIZERS = ("hf", "tiktoken", "sentencepiece")
_WEIGHT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what --dtype offers
_BLOCK = 1 << 24  # elements generated per randn call (64 MB of f32 scratch)
_WRITE_CHUNK = 1 << 28  # bytes per write call (Linux writes at most ~2 GB at once)


# ---- weights -------------------------------------------------------------------------------------

def tensor_seed(seed: int, name: str) -> int:
    """A 63-bit seed from (seed, tensor name), stable across runs, platforms and Python's hash salt."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little") >> 1


def random_tensor(name: str, shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """The tensor `name` (HF name and layout) of a random checkpoint: deterministic in (seed, name, shape, dtype).

    Norm weights (1-D): 1 + 0.1 * N(0, 1). Matrices: N(0, 1) / sqrt(shape[1]). Generated in f32 blocks
    of a fixed size and rounded to `dtype`, so the peak extra memory is one block."""
    g = torch.Generator().manual_seed(tensor_seed(seed, name))
    out = torch.empty(shape, dtype=dtype)
    flat = out.view(-1)
    scale, shift = (0.1, 1.0) if len(shape) == 1 else (1.0 / math.sqrt(shape[1]), 0.0)
    for start in range(0, flat.numel(), _BLOCK):
        n = min(_BLOCK, flat.numel() - start)
        blk = torch.randn(n, generator=g)
        blk.mul_(scale).add_(shift)
        flat[start:start + n].copy_(blk)
    return out


def random_state_dict(config: LlamaConfig, dtype: torch.dtype, seed: int):
    """(HF name, tensor) in HF order, one at a time."""
    for name, shape in llama_param_shapes(config).items():
        yield name, random_tensor(name, shape, dtype, seed)


# ---- writer --------------------------------------------------------------------------------------

def write_checkpoint(config: LlamaConfig | str, fmt: str, out_dir, dtype="bf16", seed: int = 0, *,
                     shard_size_gb: float = 5.0, overwrite: bool = False, progress: bool = False,
                     tokenizer: str | None = None) -> Path:
    """Write a random-weight checkpoint of `config` in `fmt` ("meta" or "hf") to `out_dir`; returns it.

    out_dir must not exist, or be an empty folder (overwrite=True replaces a non-empty one once the
    new checkpoint is complete). dtype: "f32"/"f16"/"bf16" or a torch.dtype. tokenizer: None, or one of
    TOKENIZERS to write a small trained tokenizer too (the config's bos_id/eos_ids become its ids)."""
    if isinstance(config, str):
        config = get_config(config)
    if fmt not in FORMATS:
        raise UsageError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    if tokenizer is not None and tokenizer not in TOKENIZERS:
        raise UsageError(f"tokenizer {tokenizer!r} is not one of {', '.join(TOKENIZERS)}")
    dt = dtype if isinstance(dtype, torch.dtype) else DTYPES.get(str(dtype).lower())
    if dt not in _WEIGHT_DTYPES:
        raise UsageError(f"dtype {dtype!r} is not one of f32, f16, bf16")
    if not shard_size_gb > 0:
        raise UsageError(f"shard size {shard_size_gb} GB must be positive")
    out = Path(out_dir)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())) and not overwrite:
        raise UsageError(f"{out} already exists and is not an empty folder; choose another --out or pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the checkpoint gets ordinary permissions
        if tokenizer is not None:  # first: a vocabulary too small for it fails before the weights are written
            config = write_tokenizer(tokenizer, config, tmp, chat_config=fmt == "hf")
        report = _Progress(config, dt, fmt, enabled=progress)
        if fmt == "meta":
            _write_meta(config, dt, seed, tmp, report)
        else:
            _write_hf(config, dt, seed, tmp, int(shard_size_gb * 1e9), report)
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
        report.done(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# ---- tokenizers ----------------------------------------------------------------------------------

# What the small tokenizers are trained on: a few lines of prose, other scripts, digits and code, so
# merges cover common words and multi-byte characters have tokens of their own.
TOKENIZER_TEXT = """\
The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away.
Hello world! How are you today? I am fine, thank you, and you?
Once upon a time there was a small model that learned to speak in tokens.
It read the same few lines again and again, and then it wrote them back.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2024 3.14159 1,000,000
Code: def add(a, b): return a + b  # x = [1, 2, 3]; print(x[0] * 2)
Le café est très chaud, mais la crème brûlée est déjà prête à côté.
Über den Wolken muss die Freiheit wohl grenzenlos sein, sagt Jürgen.
El niño pequeño come una manzana en la mañana; ¿quién sabe por qué?
Ελληνικά: καλημέρα κόσμε. Русский: привет, мир! Как дела?
日本語の文章も少しだけ書きます。東京は大きな都市です。
中文：你好，世界。今天天气很好。
Emoji: 🙂 🚀 🌍 ❤️ ✨ and symbols: © ® ™ € £ ¥ → ← ∑ ∞ ≠ ≤ ≥
Tabs\tand  double  spaces, new
lines, and "quotes" with 'apostrophes' aren't a problem, we're sure they'll work.
"""

HF_SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")

# Chat templates in tokenizer_config.json (Jinja, rendered with messages=[...], add_generation_prompt,
# bos_token, eos_token): Llama-3's header/turn markers, and Llama-2's [INST] blocks.
LLAMA3_CHAT_TEMPLATE = (
    r"{{ bos_token }}{% for message in messages %}"
    r"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    r"{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA2_CHAT_TEMPLATE = (
    r"{% for message in messages %}{% if message['role'] == 'user' %}"
    r"{{ bos_token + '[INST] ' + message['content'] | trim + ' [/INST]' }}"
    r"{% else %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{% endif %}{% endfor %}"
)


def write_tokenizer(kind: str, config: LlamaConfig, folder: Path, *, chat_config: bool = False) -> LlamaConfig:
    """Train a `kind` tokenizer of at most config.vocab_size ids into `folder` (tokenizer.json or
    tokenizer.model; tokenizer_config.json with a chat template when chat_config). Returns the config
    with the tokenizer's BOS and EOS ids."""
    n = config.vocab_size
    if kind == "hf":
        need = 256 + len(HF_SPECIAL_TOKENS)
        if n < need:
            raise UsageError(f"--tokenizer hf needs vocab_size >= {need} (256 bytes + {len(HF_SPECIAL_TOKENS)} special tokens); {config.name} has {n}")
        (folder / "tokenizer.json").write_text(_train_hf(n))
        bos, eos = 0, (1, 4)  # trained special tokens come first, in HF_SPECIAL_TOKENS' order
        tokens, template = ("<|begin_of_text|>", "<|eot_id|>"), LLAMA3_CHAT_TEMPLATE
    elif kind == "tiktoken":
        from llmc.runtime.tokenizer import LLAMA3_NUM_SPECIAL

        if n < 256 + LLAMA3_NUM_SPECIAL:
            raise UsageError(f"--tokenizer tiktoken needs vocab_size >= {256 + LLAMA3_NUM_SPECIAL} (256 bytes + Meta's "
                             f"{LLAMA3_NUM_SPECIAL} special tokens); {config.name} has {n}")
        vocab = _train_byte_bpe(TOKENIZER_TEXT, n - 256 - LLAMA3_NUM_SPECIAL)
        (folder / "tokenizer.model").write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(vocab)))
        bos, eos = len(vocab), (len(vocab) + 1, len(vocab) + 9)  # <|begin_of_text|>; <|end_of_text|>, <|eot_id|>
        tokens, template = ("<|begin_of_text|>", "<|eot_id|>"), LLAMA3_CHAT_TEMPLATE
    elif kind == "sentencepiece":
        (folder / "tokenizer.model").write_bytes(_train_sentencepiece(n, config.name))
        bos, eos = 1, (2,)
        tokens, template = ("<s>", "</s>"), LLAMA2_CHAT_TEMPLATE
    else:
        raise UsageError(f"tokenizer {kind!r} is not one of {', '.join(TOKENIZERS)}")
    if chat_config:
        tc = {"bos_token": tokens[0], "eos_token": tokens[1], "chat_template": template,
              "model_max_length": config.max_seq_len, "tokenizer_class": "PreTrainedTokenizerFast" if kind == "hf" else "LlamaTokenizer"}
        (folder / "tokenizer_config.json").write_text(json.dumps(tc, indent=2) + "\n")
    return config.replace(bos_id=bos, eos_ids=eos)


def _train_hf(vocab_size: int) -> str:
    """tokenizer.json of a byte-level BPE with Llama-3's pre-tokenizer, as Llama-3's own is built."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from llmc.runtime.tokenizer import LLAMA3_PATTERN

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(HF_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TOKENIZER_TEXT.splitlines(keepends=True), trainer)
    return tok.to_str(pretty=True)


def _train_byte_bpe(text: str, n_merges: int) -> list[bytes]:
    """Byte-level BPE over Llama-3's pre-tokenized text: the 256 bytes in order, then up to n_merges
    merged tokens, the most frequent adjacent pair first (ties: the smaller pair of ids)."""
    from collections import Counter

    import regex

    from llmc.runtime.tokenizer import LLAMA3_PATTERN

    vocab = [bytes([i]) for i in range(256)]
    index = {t: i for i, t in enumerate(vocab)}
    words = Counter(regex.findall(LLAMA3_PATTERN, text))
    seqs = [list(w.encode()) for w in words]
    freqs = list(words.values())
    while len(vocab) < 256 + n_merges:
        pairs: Counter = Counter()
        for seq, f in zip(seqs, freqs):
            for pair in zip(seq, seq[1:]):
                pairs[pair] += f
        if not pairs:
            break
        (a, b), _ = min(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        merged = vocab[a] + vocab[b]
        if merged not in index:  # the same bytes may already be a token, reached through other pairs
            index[merged] = len(vocab)
            vocab.append(merged)
        new = index[merged]
        for seq in seqs:
            i = 0
            while i < len(seq) - 1:
                if seq[i] == a and seq[i + 1] == b:
                    seq[i:i + 2] = [new]
                i += 1
    return vocab


def _train_sentencepiece(vocab_size: int, name: str) -> bytes:
    """A SentencePiece BPE model with Llama-2's options: byte fallback, digits split, no normalisation,
    unk/bos/eos = 0/1/2."""
    import sentencepiece as spm

    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(TOKENIZER_TEXT.splitlines()), model_writer=buf, vocab_size=vocab_size,
            model_type="bpe", byte_fallback=True, split_digits=True, character_coverage=1.0,
            normalization_rule_name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False,
            allow_whitespace_only_pieces=True, hard_vocab_limit=False, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            num_threads=1, shuffle_input_sentence=False, minloglevel=2,
        )
    except RuntimeError as e:
        if "smaller than required_chars" in str(e):
            raise UsageError(f"--tokenizer sentencepiece: vocab_size {vocab_size} of {name} is too small for 256 byte pieces, "
                             "3 control tokens and the characters of the training text; use a config with a larger vocabulary") from None
        raise
    return buf.getvalue()


def _write_hf(config: LlamaConfig, dtype: torch.dtype, seed: int, folder: Path, shard_bytes: int, report) -> None:
    shapes = llama_param_shapes(config)
    esize = torch.empty((), dtype=dtype).element_size()
    sizes = {n: math.prod(s) * esize for n, s in shapes.items()}
    # Plan the shards (greedy in HF order, like save_pretrained) so their names are known up front.
    shards: list[list[str]] = [[]]
    used = 0
    for n in shapes:
        if shards[-1] and used + sizes[n] > shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(n)
        used += sizes[n]
    names = (["model.safetensors"] if len(shards) == 1
             else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])

    samples = {}
    for fname, members in zip(names, shards):
        header: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        for n in members:
            header[n] = {"dtype": dtypes.of_torch(dtype).safetensors, "shape": list(shapes[n]), "data_offsets": [offset, offset + sizes[n]]}
            offset += sizes[n]
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned
        with open(folder / fname, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for n in members:
                t = random_tensor(n, shapes[n], dtype, seed)
                samples[n] = _sample(t)
                _write_all(f, t)
                report.tensor(n, t)
                del t

    cfg = config.to_hf_config()
    cfg["torch_dtype"] = dtypes.name_of(dtype)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(sizes.values())},
                 "weight_map": {n: fname for fname, members in zip(names, shards) for n in members}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")

    # Read back through the safetensors library: header, offsets, sizes and a few values per tensor.
    from safetensors import safe_open

    for fname, members in zip(names, shards):
        with safe_open(str(folder / fname), framework="pt") as f:
            if sorted(f.keys()) != sorted(members):
                raise RuntimeError(f"{fname}: read back {len(list(f.keys()))} tensors, wrote {len(members)}")
            for n in members:
                _check_sample(f"{fname}:{n}", f.get_tensor(n), samples[n])


def _write_meta(config: LlamaConfig, dtype: torch.dtype, seed: int, folder: Path, report) -> None:
    shapes = llama_param_shapes(config)
    path = folder / "consolidated.00.pth"
    # 1. The zip layout, with holes where the data goes, from fake CPU tensors (no memory at all).
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        skeleton = {hf_to_meta_name(n): torch.empty(s, dtype=dtype) for n, s in shapes.items()}
    with torch.serialization.skip_data(materialize_fake_tensors=True):
        torch.save(skeleton, path)
    del skeleton
    # 2. Where each tensor's bytes go.
    layout = torch.load(path, map_location="meta", weights_only=True)
    offsets = {}
    for name, t in layout.items():
        st = t.untyped_storage()
        if t.storage_offset() != 0 or st.nbytes() != t.numel() * t.element_size():
            raise RuntimeError(f"unexpected storage layout for {name} in the skip_data skeleton")
        offsets[name] = st._checkpoint_offset
    del layout
    # 3. The data, tensor by tensor, in Meta layout.
    samples = {}
    fd = os.open(path, os.O_WRONLY)
    try:
        for n, shape in shapes.items():
            meta_name = hf_to_meta_name(n)
            t = random_tensor(n, shape, dtype, seed)
            if n.endswith("self_attn.q_proj.weight"):
                t = hf_to_meta_rotary(t, config.n_heads)
            elif n.endswith("self_attn.k_proj.weight"):
                t = hf_to_meta_rotary(t, config.n_kv_heads)
            samples[meta_name] = _sample(t)
            _pwrite_all(fd, t, offsets[meta_name])
            report.tensor(meta_name, t)
            del t
    finally:
        os.close(fd)
    (folder / "params.json").write_text(json.dumps(config.to_meta_params(), indent=2) + "\n")
    # 4. Check through torch.load that every tensor's bytes landed where torch reads them.
    back = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if list(back) != list(samples):
        raise RuntimeError(f"{path}: read back {len(back)} tensors, wrote {len(samples)}")
    for name, t in back.items():
        _check_sample(f"{path.name}:{name}", t, samples[name])


def _byte_view(t: torch.Tensor) -> memoryview:
    return memoryview(t.contiguous().view(-1).view(torch.uint8).numpy())


def _write_all(f, t: torch.Tensor) -> None:
    mv = _byte_view(t)
    for start in range(0, len(mv), _WRITE_CHUNK):
        f.write(mv[start:start + _WRITE_CHUNK])


def _pwrite_all(fd: int, t: torch.Tensor, offset: int) -> None:
    mv = _byte_view(t)
    done = 0
    while done < len(mv):
        done += os.pwrite(fd, mv[done:done + _WRITE_CHUNK], offset + done)


def _sample(t: torch.Tensor) -> torch.Tensor:
    """A few elements (first, middle, last) to check a tensor after writing."""
    flat = t.reshape(-1)
    idx = torch.tensor(sorted({0, 1, flat.numel() // 2, flat.numel() - 1}))
    return flat[idx].clone()


def _check_sample(what: str, t: torch.Tensor, expected: torch.Tensor) -> None:
    got = _sample(t)
    if got.dtype != expected.dtype or not torch.equal(got, expected):
        raise RuntimeError(f"{what}: read back {got.tolist()}, wrote {expected.tolist()}")


class _Progress:
    """One stderr line per second at most, and one at the end."""

    def __init__(self, config: LlamaConfig, dtype: torch.dtype, fmt: str, enabled: bool):
        self.enabled = enabled
        shapes = llama_param_shapes(config)
        esize = torch.empty((), dtype=dtype).element_size()
        self.total_n = len(shapes)
        self.total_b = sum(math.prod(s) for s in shapes.values()) * esize
        self.n = self.b = 0
        self.t0 = self.last = time.monotonic()
        if enabled:
            print(f"make_checkpoint: {config.name} ({self.total_n} tensors, {self.total_b / 1e9:.2f} GB {dtypes.name_of(dtype)}) "
                  f"in {fmt} format", file=sys.stderr, flush=True)

    def tensor(self, name: str, t: torch.Tensor) -> None:
        self.n += 1
        self.b += t.numel() * t.element_size()
        now = time.monotonic()
        if self.enabled and (now - self.last >= 1.0 or self.n == self.total_n):
            self.last = now
            print(f"  [{self.n}/{self.total_n}] {self.b / 1e9:.2f}/{self.total_b / 1e9:.2f} GB  {now - self.t0:.0f} s  {name}",
                  file=sys.stderr, flush=True)

    def done(self, out: Path) -> None:
        if self.enabled:
            print(f"make_checkpoint: wrote {out} in {time.monotonic() - self.t0:.1f} s", file=sys.stderr, flush=True)


# ---- CLI -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="make_checkpoint", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, choices=sorted(CONFIGS), help="named Llama config")
    ap.add_argument("--format", required=True, choices=FORMATS, help="meta: consolidated.00.pth + params.json; hf: config.json + safetensors")
    ap.add_argument("--out", required=True, type=Path, help="output folder (must not exist, or be empty)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-size-gb", type=float, default=5.0, help="hf: largest safetensors shard (default 5)")
    ap.add_argument("--force", action="store_true", help="replace --out if it exists")
    ap.add_argument("--tokenizer", default=None, choices=TOKENIZERS,
                    help="also write a small tokenizer trained on built-in text (its BOS/EOS ids go into the config)")
    args = ap.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the temporary folder is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        write_checkpoint(args.config, args.format, args.out, args.dtype, args.seed,
                         shard_size_gb=args.shard_size_gb, overwrite=args.force, progress=True, tokenizer=args.tokenizer)
    except LlmcError as e:
        print(f"make_checkpoint: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("make_checkpoint: interrupted; nothing written", file=sys.stderr)
        return 130
    except SystemExit:
        print("make_checkpoint: terminated; nothing written", file=sys.stderr)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
