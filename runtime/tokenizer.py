"""The checkpoint's own tokenizer, loaded from the files beside a .vmfb as its manifest names them.

`llmc compile` copies a checkpoint's tokenizer next to the artifact (NAME.tokenizer.json or
NAME.tokenizer.model, and NAME.tokenizer_config.json when the checkpoint has one) and records it in
the manifest's `llm.tokenizer`: {"file", "kind", "sha256", "config"}. Three kinds:

    hf             tokenizer.json, read with the `tokenizers` library (Hugging Face checkpoints)
    tiktoken       Llama-3 tokenizer.model: text lines "<base64 token> <rank>", BPE over bytes with
                   Meta's Llama-3 pre-tokenizer pattern; Meta's 256 special tokens are numbered after
                   the ranks (<|begin_of_text|> = number of ranks)
    sentencepiece  Llama-2 tokenizer.model: a SentencePiece model (a binary protobuf)

The two tokenizer.model kinds are told apart by content (`detect_kind`), never by name.

    tok = load(vmfb, manifest)              # or Module.tokenizer
    ids = tok.prompt_ids("Hello", chat=False)  # BOS + text; chat=True renders tokenizer_config.json's chat_template
    stream = tok.stream(context=ids)
    for t in new_ids: print(stream.push(t), end="")   # only complete UTF-8 text, as tokens arrive
    print(stream.flush())

Decoding skips special tokens (BOS, EOS, headers) and ids the tokenizer does not have (a model's
embedding table may be larger than its tokenizer's vocabulary). The tokenizer libraries and jinja2
are imported when a tokenizer is loaded, not with `llmc.runtime`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from pathlib import Path

from llmc.errors import InputError, RuntimeLoadError

KINDS = ("hf", "tiktoken", "sentencepiece")

# Meta's Llama-3 pre-tokenizer: contractions, letter runs (with one leading non-letter), digit groups of at
# most three, punctuation runs, newlines, and whitespace (a trailing space stays with the next word).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)

# Meta's Llama-3 special tokens (the 3.1 names), numbered from the number of BPE ranks; 256 in all, the
# rest reserved. Llama-3.0's names for ids 4, 5, 8 and 10 were reserved ones; the ids are the same.
LLAMA3_NUM_SPECIAL = 256
_LLAMA3_NAMED = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
)


def llama3_special_tokens() -> list[str]:
    """The 256 special token strings of a Llama-3 tokenizer.model, in id order."""
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(2, 2 + LLAMA3_NUM_SPECIAL - len(_LLAMA3_NAMED))]
    return [*_LLAMA3_NAMED, *reserved]


_TIKTOKEN_LINE = re.compile(rb"[A-Za-z0-9+/]+={0,2} \d+")


def detect_kind(path) -> str | None:
    """"hf", "tiktoken" or "sentencepiece" from a tokenizer file's content; None if it is none of them."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if head.lstrip()[:1] == b"{":
        return "hf"
    first = head.split(b"\n", 1)[0].rstrip(b"\r")
    if _TIKTOKEN_LINE.fullmatch(first):
        return "tiktoken"
    # A SentencePiece ModelProto starts with field 1 (repeated SentencePiece pieces), length-delimited: tag 0x0a.
    if head[:1] == b"\x0a":
        return "sentencepiece"
    return None


def _import(module: str, package: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise RuntimeLoadError(f"the {package!r} package is needed to read this tokenizer; install it with `pip install {package}`") from None


# ---- the tokenizer --------------------------------------------------------------------------------


class Tokenizer:
    """encode / decode / prompt_ids / stream over one of the three kinds (subclasses below).

    bos_id: the id put before a plain prompt (None: nothing is put there). chat_template: the Jinja
    template from tokenizer_config.json, or None. bos_token / eos_token: the strings the template gets.
    """

    kind = "?"

    def __init__(self, path: Path, config: dict | None, fallback_bos: int | None):
        self.path = Path(path)
        self.config = config or {}
        self.chat_template = _template_text(self.config.get("chat_template"))
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        bos = self._token_id(self.bos_token) if self.bos_token else None
        self.bos_id = bos if bos is not None else self._default_bos(fallback_bos)
        if self.bos_token is None and self.bos_id is not None:
            self.bos_token = self._id_text(self.bos_id)

    # -- what each kind supplies
    def _encode(self, text: str, special: bool) -> list[int]:
        raise NotImplementedError

    def _decode(self, ids: list[int]) -> str:
        """Text of ids that are all plain (known, not special) tokens."""
        raise NotImplementedError

    def _is_plain(self, i: int) -> bool:
        raise NotImplementedError

    def _token_id(self, text: str) -> int | None:
        raise NotImplementedError

    def _id_text(self, i: int) -> str | None:
        raise NotImplementedError

    def _default_bos(self, fallback: int | None) -> int | None:
        return fallback

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    # -- the API
    def encode(self, text: str, *, bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text`, BOS first when `bos` (and the tokenizer has one). special=True reads
        special-token strings in the text (e.g. <|eot_id|>) as those tokens; otherwise they are text."""
        if not isinstance(text, str):
            raise InputError(f"expected the prompt as a str, got {type(text).__name__}")
        ids = self._encode(text, special)
        return [self.bos_id, *ids] if bos and self.bos_id is not None else ids

    def decode(self, ids) -> str:
        """Text of `ids`, leaving out special tokens and ids outside the tokenizer's vocabulary."""
        return self._decode([int(i) for i in ids if self._is_plain(int(i))])

    def render_chat(self, prompt: str) -> str:
        """tokenizer_config.json's chat_template with one user message and the assistant's turn opened."""
        if not self.chat_template:
            where = "has no chat_template" if self.config else "was not part of the checkpoint (no tokenizer_config.json)"
            raise InputError(f"--chat: the checkpoint's tokenizer_config.json {where}; leave out --chat to send the prompt as plain text")
        jinja2 = _import("jinja2", "jinja2")
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise InputError(f"--chat: the chat template refused the prompt: {message}")

        def strftime_now(fmt):
            import datetime

            return datetime.datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
        try:
            template = env.from_string(self.chat_template)
            return template.render(
                messages=[{"role": "user", "content": prompt}],
                add_generation_prompt=True,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except jinja2.TemplateError as e:
            raise InputError(f"--chat: the chat_template in tokenizer_config.json does not render: {e}") from None

    def prompt_ids(self, prompt: str, *, chat: bool = False) -> list[int]:
        """The ids generation starts from: BOS + the text, or (chat) the rendered template, whose
        special-token strings become special tokens and which brings its own BOS (as transformers does)."""
        if chat:
            return self.encode(self.render_chat(prompt), bos=False, special=True)
        return self.encode(prompt, bos=True)

    def stream(self, context=()) -> "TextStream":
        """A detokenizer for ids that arrive one at a time; `context`: the ids before them (the prompt)."""
        return TextStream(self, context)

    def __repr__(self):
        return f"<llmc.Tokenizer {self.kind} {self.path.name} vocab={self.vocab_size} bos={self.bos_id}>"


class TextStream:
    """Turns ids arriving one at a time into text, emitting only complete UTF-8 characters.

    Each push decodes a short window (a few ids already shown + the new ones) and emits what the new
    ids added, once that no longer ends in an unfinished character (U+FFFD). Decoding with a window
    rather than one id at a time keeps the space SentencePiece and Metaspace decoders strip from a
    leading piece; starting the window in the prompt gives the first new word its space too.
    """

    _CONTEXT = 4

    def __init__(self, tokenizer: Tokenizer, context=()):
        self.tokenizer = tokenizer
        self._ids = [int(i) for i in list(context)[-self._CONTEXT:]]
        self._prefix = 0  # window start
        self._read = len(self._ids)  # ids before this are already shown

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        decode = self.tokenizer.decode
        shown = decode(self._ids[self._prefix:self._read])
        text = decode(self._ids[self._prefix:])
        if len(text) > len(shown) and not text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return text[len(shown):]
        return ""

    def flush(self) -> str:
        """What is left at the end (an unfinished character comes out as U+FFFD)."""
        decode = self.tokenizer.decode
        shown = decode(self._ids[self._prefix:self._read])
        text = decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return text[len(shown):]


class HFTokenizer(Tokenizer):
    kind = "hf"

    def __init__(self, path, config, fallback_bos):
        tokenizers = _import("tokenizers", "tokenizers")
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the library raises its own exception type with a one-line message
            raise RuntimeLoadError(f"{path}: not a tokenizer.json the `tokenizers` library can read: {_one_line(e)}") from None
        self._size = self._tok.get_vocab_size(with_added_tokens=True)
        self._special = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        super().__init__(path, config, fallback_bos)

    @property
    def vocab_size(self) -> int:
        return self._size

    def _encode(self, text, special):
        self._tok.encode_special_tokens = not special
        return self._tok.encode(text, add_special_tokens=False).ids

    def _decode(self, ids):
        return self._tok.decode(ids, skip_special_tokens=True)

    def _is_plain(self, i):
        tok = self._tok.id_to_token(i) if 0 <= i else None
        return tok is not None and tok not in self._special

    def _token_id(self, text):
        return self._tok.token_to_id(text)

    def _id_text(self, i):
        return self._tok.id_to_token(i)


class TiktokenTokenizer(Tokenizer):
    kind = "tiktoken"

    def __init__(self, path, config, fallback_bos):
        tiktoken = _import("tiktoken", "tiktoken")
        ranks = read_tiktoken_ranks(path)
        self._n_ranks = len(ranks)
        self._specials = {s: self._n_ranks + i for i, s in enumerate(llama3_special_tokens())}
        self._enc = tiktoken.Encoding(
            name=Path(path).name, pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens=self._specials
        )
        super().__init__(path, config, fallback_bos)

    @property
    def vocab_size(self) -> int:
        return self._n_ranks + len(self._specials)

    def _encode(self, text, special):
        if special:
            return self._enc.encode(text, allowed_special="all")
        return self._enc.encode(text, disallowed_special=())

    def _decode(self, ids):
        return self._enc.decode_bytes(ids).decode("utf-8", errors="replace")

    def _is_plain(self, i):
        return 0 <= i < self._n_ranks

    def _token_id(self, text):
        return self._specials.get(text)

    def _default_bos(self, fallback):
        return self._specials["<|begin_of_text|>"]

    def _id_text(self, i):
        for s, j in self._specials.items():
            if j == i:
                return s
        return None


def read_tiktoken_ranks(path) -> dict[bytes, int]:
    """A tiktoken BPE file's {token bytes: rank}; ranks must be 0..n-1, each once."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                tok, rank = line.split()
                ranks[base64.b64decode(tok, validate=True)] = int(rank)
            except (ValueError, binascii.Error):
                raise RuntimeLoadError(
                    f"{path}: line {n} is not '<base64 token> <rank>'; a Llama-3 tokenizer.model is tiktoken BPE ranks"
                ) from None
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise RuntimeLoadError(f"{path}: the BPE ranks are not 0..{len(ranks) - 1} each once (a token repeated or a rank missing)")
    return ranks


class SentencePieceTokenizer(Tokenizer):
    kind = "sentencepiece"

    def __init__(self, path, config, fallback_bos):
        spm = _import("sentencepiece", "sentencepiece")
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.Load(str(path))
        except Exception as e:
            raise RuntimeLoadError(f"{path}: not a SentencePiece model: {_one_line(e)}") from None
        self._size = self._sp.get_piece_size()
        self._controls = {self._sp.id_to_piece(i): i for i in range(self._size) if self._sp.is_control(i)}
        self._split = re.compile("(" + "|".join(re.escape(p) for p in sorted(self._controls, key=len, reverse=True)) + ")") if self._controls else None
        super().__init__(path, config, fallback_bos)

    @property
    def vocab_size(self) -> int:
        return self._size

    def _encode(self, text, special):
        if not special or self._split is None:
            return self._sp.encode(text)
        # SentencePiece reads "<s>" as three characters: split the control pieces out first (as
        # transformers' LlamaTokenizer does), encoding each stretch of text between them.
        ids: list[int] = []
        for part in self._split.split(text):
            if part in self._controls:
                ids.append(self._controls[part])
            elif part:
                ids.extend(self._sp.encode(part))
        return ids

    def _decode(self, ids):
        return self._sp.decode(ids)

    def _is_plain(self, i):
        return 0 <= i < self._size and not self._sp.is_control(i)

    def _token_id(self, text):
        i = self._sp.piece_to_id(text)
        return i if i != self._sp.unk_id() or text == self._sp.id_to_piece(i) else None

    def _default_bos(self, fallback):
        b = self._sp.bos_id()
        return b if b >= 0 else fallback

    def _id_text(self, i):
        return self._sp.id_to_piece(i) if 0 <= i < self._size else None


_CLASSES = {"hf": HFTokenizer, "tiktoken": TiktokenTokenizer, "sentencepiece": SentencePieceTokenizer}


def from_files(path, kind: str | None = None, config_path=None, *, fallback_bos: int | None = None) -> Tokenizer:
    """A tokenizer from its file (kind detected from the content when not given) and an optional tokenizer_config.json."""
    path = Path(path)
    kind = kind or detect_kind(path)
    if kind not in _CLASSES:
        raise RuntimeLoadError(
            f"{path}: not a tokenizer llmc can read (a tokenizer.json, a tiktoken BPE file or a SentencePiece model)"
        )
    config = None
    if config_path is not None:
        try:
            config = json.loads(Path(config_path).read_text())
        except (OSError, ValueError) as e:
            raise RuntimeLoadError(f"{config_path}: not a readable tokenizer_config.json ({e})") from None
        if not isinstance(config, dict):
            raise RuntimeLoadError(f"{config_path}: expected a JSON object in tokenizer_config.json")
    return _CLASSES[kind](path, config, fallback_bos)


def load(vmfb, manifest: dict) -> Tokenizer:
    """The tokenizer a module's manifest records, from the files beside `vmfb`.

    Raises InputError when the module has none (compiled from a checkpoint without a tokenizer) and
    RuntimeLoadError when a recorded file is missing or not the one compiled with.
    """
    vmfb = Path(vmfb)
    llm = manifest.get("llm")
    if not llm:
        raise InputError(
            f"{vmfb.name}: not a language-model module (no prefill/decode entry points); "
            "compile a Llama checkpoint with `llmc compile CHECKPOINT` to get one"
        )
    if "tokenizer" not in llm:
        raise InputError(
            f"{vmfb.name}: its manifest records no tokenizer (compiled by an llmc that did not copy tokenizers); "
            "recompile it, or give token ids with --prompt-ids 1,2,3 (mod.generate(ids) in Python)"
        )
    rec = llm["tokenizer"]
    if rec is None:
        raise InputError(
            f"{vmfb.name}: the checkpoint it was compiled from had no tokenizer (tokenizer.json or tokenizer.model), "
            "so text cannot be encoded; give token ids with --prompt-ids 1,2,3 (mod.generate(ids) in Python), "
            "or put the tokenizer in the checkpoint folder and recompile"
        )
    path = vmfb.with_name(rec["file"])
    config = vmfb.with_name(rec["config"]) if rec.get("config") else None
    for p in (path, config):
        if p is not None and not p.is_file():
            raise RuntimeLoadError(f"{p}: not found beside {vmfb.name}; the manifest names it: copy it back or recompile")
    with open(path, "rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
    if rec.get("sha256") and sha != rec["sha256"]:
        raise RuntimeLoadError(f"{path}: differs from the tokenizer the module was compiled with (sha256 mismatch); recompile")
    return from_files(path, rec.get("kind"), config, fallback_bos=llm.get("config", {}).get("bos_id"))


def _one_line(e: Exception) -> str:
    """A library's error message on one line (the CLI prints errors as one line)."""
    return " ".join(str(e).split()) or type(e).__name__


def _token_text(v) -> str | None:
    """tokenizer_config.json writes a token as a string or as an AddedToken object {"content": ...}."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


def _template_text(v) -> str | None:
    """chat_template: a string, or a list of {"name", "template"} (the one named "default" is used)."""
    if isinstance(v, list):
        named = {t.get("name"): t.get("template") for t in v if isinstance(t, dict)}
        v = named.get("default")
    return v if isinstance(v, str) and v else None
