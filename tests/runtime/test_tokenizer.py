"""runtime/tokenizer.py on tokenizers trained on the fly (tools/make_checkpoint.py): each kind against
its own library, Llama-3's pre-tokenizer and special-token ids, streaming detokenisation, chat
templates, the manifest record's errors, and the Generation record's arithmetic. No model, no compile.
"""

from __future__ import annotations

import json
import shutil

import jinja2
import pytest
import regex

from llmc.errors import InputError, RuntimeLoadError
from llmc.models.llama.config import get_config
from llmc.runtime import tokenizer as T
from llmc.runtime.generate import Generation
from llmc.tools import make_checkpoint as mc

CONFIG = get_config("tiny-llama3").replace(vocab_size=1024)
FILES = {"hf": "tokenizer.json", "tiktoken": "tokenizer.model", "sentencepiece": "tokenizer.model"}
TEXTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    " leading space,  double  spaces\tand a tab\nand a newline",
    "café crème brûlée, Jürgen, niño",
    "日本語の文章 和 中文 — Привет, мир",
    "emoji 🙂🚀 and ZWJ 👩‍💻, digits 1234567 3.14159",
    "words the training text never saw: xylophone quizzaciously",
    "",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """kind -> (folder, config with the tokenizer's BOS/EOS): a tokenizer of each kind with tokenizer_config.json."""
    out = {}
    for kind in T.KINDS:
        folder = tmp_path_factory.mktemp(kind)
        out[kind] = (folder, mc.write_tokenizer(kind, CONFIG, folder, chat_config=True))
    return out


def _load(trained, kind) -> T.Tokenizer:
    folder, cfg = trained[kind]
    return T.from_files(folder / FILES[kind], None, folder / "tokenizer_config.json", fallback_bos=cfg.bos_id)


@pytest.mark.parametrize("kind", T.KINDS)
def test_detect_kind_by_content(trained, kind, tmp_path):
    folder, _ = trained[kind]
    assert T.detect_kind(folder / FILES[kind]) == kind
    junk = tmp_path / "tokenizer.model"
    junk.write_bytes(b"\x00\x01 not a tokenizer")
    assert T.detect_kind(junk) is None
    with pytest.raises(RuntimeLoadError, match="not a tokenizer llmc can read"):
        T.from_files(junk)


@pytest.mark.parametrize("kind", T.KINDS)
def test_round_trips(trained, kind):
    tok = _load(trained, kind)
    assert tok.vocab_size <= CONFIG.vocab_size
    for text in TEXTS:
        ids = tok.encode(text, bos=False)
        assert tok.decode(ids) == text, (kind, text, ids)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.encode(text) == [tok.bos_id, *ids]  # BOS first, once
    common = tok.encode("The quick brown fox", bos=False)
    assert len(common) < len("The quick brown fox") / 2, "trained merges should cover words of the training text"


def test_hf_matches_the_tokenizers_library(trained):
    from tokenizers import Tokenizer

    folder, cfg = trained["hf"]
    lib = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok = _load(trained, "hf")
    assert tok.bos_id == lib.token_to_id("<|begin_of_text|>") == cfg.bos_id
    for text in TEXTS:
        assert tok.encode(text, bos=False) == lib.encode(text, add_special_tokens=False).ids
    # special-token strings are text unless asked for
    assert lib.token_to_id("<|eot_id|>") not in tok.encode("a <|eot_id|> b", bos=False)
    assert lib.token_to_id("<|eot_id|>") in tok.encode("a <|eot_id|> b", bos=False, special=True)


def test_sentencepiece_matches_its_library(trained):
    import sentencepiece as spm

    folder, cfg = trained["sentencepiece"]
    lib = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    tok = _load(trained, "sentencepiece")
    assert (tok.bos_id, cfg.bos_id, cfg.eos_ids) == (lib.bos_id(), 1, (2,))
    for text in TEXTS:
        assert tok.encode(text, bos=False) == lib.encode(text)
    # control pieces in text: characters as text, the control ids with special=True (split out first)
    assert tok.encode("x</s>y", bos=False) == lib.encode("x</s>y")
    assert tok.encode("<s>x</s>", bos=False, special=True) == [1, *lib.encode("x"), 2]


def test_tiktoken_matches_tiktoken_reading_the_file(trained, monkeypatch):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken caches by path; these paths are reused across runs
    folder, cfg = trained["tiktoken"]
    ranks = load_tiktoken_bpe(str(folder / "tokenizer.model"))
    assert len(ranks) == CONFIG.vocab_size - 256 and all(ranks[bytes([b])] == b for b in range(256))
    n = len(ranks)
    lib = tiktoken.Encoding("ref", pat_str=T.LLAMA3_PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|begin_of_text|>": n, "<|eot_id|>": n + 9})
    tok = _load(trained, "tiktoken")
    assert T.read_tiktoken_ranks(folder / "tokenizer.model") == ranks
    for text in TEXTS:
        assert tok.encode(text, bos=False) == lib.encode(text, disallowed_special=())
    # Meta's numbering: the 256 special tokens follow the ranks; the config got the same ids
    assert tok.vocab_size == CONFIG.vocab_size
    assert (tok.bos_id, cfg.bos_id, cfg.eos_ids) == (n, n, (n + 1, n + 9))
    specials = T.llama3_special_tokens()
    assert len(specials) == 256 and len(set(specials)) == 256
    assert [specials.index(s) for s in ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")] == [0, 1, 6, 7, 9]
    assert all(s.startswith("<|reserved_special_token_") for s in specials[11:])
    assert tok.encode("<|start_header_id|>user<|end_header_id|>", bos=False, special=True)[0] == n + 6
    assert n + 9 not in tok.encode("<|eot_id|>", bos=False)  # plain text unless special=True


def test_llama3_pretokenizer_pattern():
    """Meta's Llama-3 splits: contractions apart, digits in threes, a space joins the next word,
    newlines take the whitespace before them."""
    find = lambda s: regex.findall(T.LLAMA3_PATTERN, s)
    assert find("I'm 12345 fox's  \n\n hi") == ["I", "'m", " ", "123", "45", " fox", "'s", "  \n\n", " hi"]
    assert find("Hello, world!!  ok") == ["Hello", ",", " world", "!!", " ", " ok"]
    assert find("DON'T x=1;\n") == ["DON", "'T", " x", "=", "1", ";\n"]


@pytest.mark.parametrize("kind", T.KINDS)
def test_decode_skips_special_and_unknown_ids(trained, kind):
    tok = _load(trained, kind)
    ids = tok.encode("Hello world", bos=False)
    eos = trained[kind][1].eos_ids[0]
    assert tok.decode([tok.bos_id, *ids, eos, CONFIG.vocab_size + 7, -1]) == "Hello world"


@pytest.mark.parametrize("kind", T.KINDS)
def test_stream_emits_complete_text_only(trained, kind):
    tok = _load(trained, kind)
    text = "日本語 ünïcödé 🙂🚀 👩‍💻 done"
    ids = tok.encode(text, bos=False)
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces), pieces
    if kind != "sentencepiece":  # byte-level BPE splits some characters over several tokens
        assert "" in pieces[:-1]


def test_stream_keeps_the_space_after_the_prompt(trained):
    """SentencePiece decodes a lone '▁word' without its space: the stream starts its window in the prompt."""
    tok = _load(trained, "sentencepiece")
    prompt, full = tok.encode("The quick"), tok.encode("The quick brown fox")
    assert full[: len(prompt)] == prompt
    new = full[len(prompt):]  # what a model continuing the prompt would produce
    stream = tok.stream(context=prompt)
    got = "".join(stream.push(i) for i in new) + stream.flush()
    assert got == " brown fox"
    assert tok.decode(new) == "brown fox"  # what a decode of the new ids alone gives


@pytest.mark.parametrize("kind", ["hf", "sentencepiece"])
def test_chat_prompt_is_the_rendered_template(trained, kind):
    folder, _ = trained[kind]
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    tok = _load(trained, kind)
    prompt = "  What is a fox?  "
    want = jinja2.Template(tc["chat_template"]).render(
        messages=[{"role": "user", "content": prompt}], add_generation_prompt=True, bos_token=tc["bos_token"], eos_token=tc["eos_token"]
    )
    assert tok.render_chat(prompt) == want
    ids = tok.prompt_ids(prompt, chat=True)
    assert ids.count(tok.bos_id) == 1 and ids[0] == tok.bos_id  # the template's BOS, not a second one
    if kind == "hf":
        from tokenizers import Tokenizer

        assert want.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is a fox?<|eot_id|>")
        assert ids == Tokenizer.from_file(str(folder / "tokenizer.json")).encode(want, add_special_tokens=False).ids
    else:
        import sentencepiece as spm

        assert want == "<s>[INST] What is a fox? [/INST]"
        lib = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
        assert ids == [1, *lib.encode(want.removeprefix("<s>"))]
    assert tok.prompt_ids(prompt) == tok.encode(prompt)


def test_chat_without_template_is_refused(trained, tmp_path):
    folder, cfg = trained["tiktoken"]
    tok = T.from_files(folder / "tokenizer.model", fallback_bos=cfg.bos_id)
    with pytest.raises(InputError, match="no tokenizer_config.json"):
        tok.prompt_ids("hi", chat=True)
    (tmp_path / "tc.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>"}))
    tok = T.from_files(folder / "tokenizer.model", config_path=tmp_path / "tc.json")
    with pytest.raises(InputError, match="has no chat_template"):
        tok.prompt_ids("hi", chat=True)


def _manifest(rec):
    return {"llm": {"config": {"bos_id": 1}, "tokenizer": rec}}


def test_load_from_manifest_and_its_errors(trained, tmp_path):
    folder, _ = trained["hf"]
    vmfb = tmp_path / "m.vmfb"
    shutil.copy(folder / "tokenizer.json", tmp_path / "m.tokenizer.json")
    sha = T.hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
    rec = {"file": "m.tokenizer.json", "kind": "hf", "sha256": sha, "config": None}
    tok = T.load(vmfb, _manifest(rec))
    assert tok.kind == "hf" and tok.encode("Hello", bos=False) == _load(trained, "hf").encode("Hello", bos=False)

    with pytest.raises(InputError, match="had no tokenizer.*--prompt-ids"):
        T.load(vmfb, _manifest(None))
    with pytest.raises(InputError, match="records no tokenizer"):
        T.load(vmfb, {"llm": {"config": {}}})
    with pytest.raises(InputError, match="not a language-model module"):
        T.load(vmfb, {})
    with pytest.raises(RuntimeLoadError, match="m.tokenizer_config.json: not found beside m.vmfb"):
        T.load(vmfb, _manifest({**rec, "config": "m.tokenizer_config.json"}))
    with pytest.raises(RuntimeLoadError, match="sha256 mismatch"):
        T.load(vmfb, _manifest({**rec, "sha256": "0" * 64}))


def test_generation_record():
    g = Generation(prompt_ids=[1, 2, 3, 4], tokens=[5, 6, 7], prefill_seconds=0.5, decode_seconds=0.25)
    assert (g.prefill_tokens_per_s, g.decode_steps, g.decode_tokens_per_s) == (8.0, 2, 8.0)
    assert g.summary() == "4 prompt tokens, prefill 8.0 tok/s; 3 new tokens, decode 8.0 tok/s"
    one = Generation(prompt_ids=[1, 2], tokens=[3], prefill_seconds=0.1)
    assert one.decode_tokens_per_s is None and one.summary().endswith("1 new tokens, decode - tok/s")
    assert one.as_json() == {"prefill_seconds": 0.1, "decode_seconds": 0.0, "prefill_tokens_per_s": 20.0, "decode_tokens_per_s": None,
                             "prefill_function": None, "decode_function": None}
    assert Generation(prompt_ids=[1], tokens=[2], prefill_function="prefill_128").as_json()["prefill_function"] == "prefill_128"
    assert Generation(prompt_ids=[1], tokens=[2], decode_function="decode_static").as_json()["decode_function"] == "decode_static"
