"""Text in, text out: checkpoints carrying each kind of tokenizer (trained on the fly by
tools/make_checkpoint.py) -> llmc compile -> `llmc run --prompt` / `--chat` / `generate_text`.

Checked: the tokenizer copied beside the artifact and recorded in the manifest (sha256 of the copy =
the source's); `--prompt TEXT` encodes as the tokenizer library does and gives the same tokens as
`--prompt-ids` of those ids and as `generate(ids)`; the streamed text is the JSON's text; `--chat`
sends the chat template rendered with jinja2; `--json` splits prefill and decode; a module whose
checkpoint had no tokenizer refuses text with one line, and a stale tokenizer from an earlier compile
of the same name is removed.
"""

import json
import re
import shutil
import subprocess
import sys

import jinja2
import pytest
from conftest import llmc_in_process

import llmc
from llmc.errors import InputError
from llmc.models.llama.config import get_config
from llmc.runtime.tokenizer import LLAMA3_PATTERN
from llmc.tools.make_checkpoint import write_checkpoint

MAX_SEQ = 64
PROMPT = "The quick brown fox jumps over the lazy dog. Café 日本語"
# room for 256 bytes + merges + Meta's 256 special tokens; one layer: what is checked here is text in and out
CONFIG = get_config("tiny-llama3").replace(vocab_size=1024, n_layers=1)
# (tokenizer kind, checkpoint format): Llama-3 HF with a chat template, Llama-3 Meta, Llama-2 HF with [INST] chat
CASES = {"hf": ("hf", "hf"), "tiktoken": ("tiktoken", "meta"), "sentencepiece": ("sentencepiece", "hf")}
TOKENIZER_FILE = {"hf": "tokenizer.json", "tiktoken": "tokenizer.model", "sentencepiece": "tokenizer.model"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """kind -> (checkpoint folder, artifact), one compile each."""
    root = tmp_path_factory.mktemp("text")
    out = {}
    for kind, (tok, fmt) in CASES.items():
        ck = write_checkpoint(CONFIG, fmt, root / f"ck-{kind}", dtype="f32", seed=5, tokenizer=tok)
        out[kind] = (ck, llmc.compile(ck, output=root / f"{kind}.vmfb", max_seq_len=MAX_SEQ))
    return out


def _llmc(*args):
    return subprocess.run([sys.executable, "-m", "llmc.compiler.cli", *map(str, args)], capture_output=True, text=True)


def _run_json(vmfb, *args):
    """`llmc run ... --json` in this process (the CLI's answer, not the process's: the streamed output
    and the one-line errors below are checked with real processes)."""
    r = llmc_in_process("run", vmfb, *args, "--max-new-tokens", 8, "--no-eos", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _library_ids(kind, ck, text, monkeypatch) -> list[int]:
    """BOS + text encoded by the tokenizer's own library, reading the checkpoint's file (not llmc's copy)."""
    f = ck / TOKENIZER_FILE[kind]
    if kind == "hf":
        from tokenizers import Tokenizer

        lib = Tokenizer.from_file(str(f))
        return [lib.token_to_id("<|begin_of_text|>"), *lib.encode(text, add_special_tokens=False).ids]
    if kind == "sentencepiece":
        import sentencepiece as spm

        lib = spm.SentencePieceProcessor(model_file=str(f))
        return [lib.bos_id(), *lib.encode(text)]
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # no cache keyed by (reused) temp paths
    ranks = load_tiktoken_bpe(str(f))
    lib = tiktoken.Encoding("ref", pat_str=LLAMA3_PATTERN, mergeable_ranks=ranks, special_tokens={})
    return [len(ranks), *lib.encode(text)]


@pytest.mark.parametrize("kind", CASES)
def test_manifest_records_the_copied_tokenizer(built, kind):
    ck, art = built[kind]
    rec = art.read_manifest()["llm"]["tokenizer"]
    suffix = ".tokenizer.json" if kind == "hf" else ".tokenizer.model"
    assert rec["file"] == f"{kind}{suffix}" and rec["kind"] == kind
    copy = art.vmfb.with_name(rec["file"])
    from llmc.compiler.artifacts import sha256_file

    assert sha256_file(copy) == sha256_file(ck / TOKENIZER_FILE[kind]) == rec["sha256"]
    if CASES[kind][1] == "hf":
        assert rec["config"] == f"{kind}.tokenizer_config.json"
        assert art.vmfb.with_name(rec["config"]).read_bytes() == (ck / "tokenizer_config.json").read_bytes()
    else:
        assert rec["config"] is None and not art.vmfb.with_name(f"{kind}.tokenizer_config.json").exists()
    assert not [p.name for p in art.vmfb.parent.iterdir() if p.name.startswith(".")]  # no temp copies left


@pytest.mark.parametrize("kind", CASES)
def test_prompt_equals_prompt_ids_and_generate(built, kind, monkeypatch):
    ck, art = built[kind]
    by_text = _run_json(art.vmfb, "--prompt", PROMPT)
    want_ids = _library_ids(kind, ck, PROMPT, monkeypatch)
    assert by_text["prompt_ids"] == want_ids
    by_ids = _run_json(art.vmfb, "--prompt-ids", ",".join(map(str, want_ids)))
    assert by_ids["tokens"] == by_text["tokens"] and len(by_text["tokens"]) == 8
    mod = llmc.load(art)
    assert mod.generate(want_ids, 8, stop_at_eos=False) == by_text["tokens"]
    # the text: the new tokens decoded after the prompt, as the Python API gives it
    assert mod.generate_text(PROMPT, 8, stop_at_eos=False) == by_text["text"]
    assert mod.last_generation.tokens == by_text["tokens"] and mod.last_generation.prompt_ids == want_ids
    tok = mod.tokenizer
    whole, prompt_only = tok.decode(want_ids + by_text["tokens"]), tok.decode(want_ids)
    assert whole.startswith(prompt_only) and by_text["text"] == whole[len(prompt_only):]
    # --json's timings: prefill and decode apart, each with its rate
    for j in (by_text, by_ids):
        assert {"tokens", "prompt_ids", "seconds", "prefill_seconds", "decode_seconds", "prefill_tokens_per_s", "decode_tokens_per_s"} <= set(j)
        assert 0 < j["prefill_seconds"] and 0 < j["decode_seconds"] and j["prefill_seconds"] + j["decode_seconds"] <= j["seconds"]
        assert j["prefill_tokens_per_s"] == pytest.approx(len(j["prompt_ids"]) / j["prefill_seconds"], rel=0.01)
        assert j["decode_tokens_per_s"] == pytest.approx(7 / j["decode_seconds"], rel=0.01)


def test_streamed_output_and_rates(built):
    _, art = built["hf"]
    j = _run_json(art.vmfb, "--prompt", PROMPT)
    r = _llmc("run", art.vmfb, "--prompt", PROMPT, "--max-new-tokens", 8, "--no-eos")
    assert r.returncode == 0, r.stderr
    assert r.stdout == j["text"] + "\n"
    m = re.fullmatch(r"llmc: (\d+) prompt tokens, prefill [\d.]+ tok/s; (\d+) new tokens, decode [\d.]+ tok/s", r.stderr.strip())
    assert m and (int(m[1]), int(m[2])) == (len(j["prompt_ids"]), 8), r.stderr
    # on_text is called while generating, not once at the end
    mod = llmc.load(art)
    seen, pieces = [], []
    text = mod.generate_text(PROMPT, 8, stop_at_eos=False, on_token=seen.append, on_text=lambda p: pieces.append((p, len(seen))))
    assert "".join(p for p, _ in pieces) == text == j["text"]
    assert pieces and pieces[0][1] < 8


@pytest.mark.parametrize("kind", ["hf", "sentencepiece"])
def test_chat_sends_the_rendered_template(built, kind):
    ck, art = built[kind]
    tc = json.loads((ck / "tokenizer_config.json").read_text())
    rendered = jinja2.Template(tc["chat_template"]).render(
        messages=[{"role": "user", "content": PROMPT}], add_generation_prompt=True, bos_token=tc["bos_token"], eos_token=tc["eos_token"]
    )
    j = _run_json(art.vmfb, "--prompt", PROMPT, "--chat")
    if kind == "hf":
        from tokenizers import Tokenizer

        lib = Tokenizer.from_file(str(ck / "tokenizer.json"))
        want = lib.encode(rendered, add_special_tokens=False).ids  # the template's special tokens included
        assert [lib.token_to_id(t) for t in ("<|begin_of_text|>", "<|start_header_id|>")] == want[:2]
        assert want[-5:] == lib.encode("<|start_header_id|>assistant<|end_header_id|>\n\n", add_special_tokens=False).ids[-5:]
    else:
        import sentencepiece as spm

        lib = spm.SentencePieceProcessor(model_file=str(ck / "tokenizer.model"))
        assert rendered == f"<s>[INST] {PROMPT} [/INST]"
        want = [lib.bos_id(), *lib.encode(rendered.removeprefix("<s>"))]
    assert j["prompt_ids"] == want
    assert j["prompt_ids"] != _run_json(art.vmfb, "--prompt", PROMPT)["prompt_ids"]
    assert j["tokens"] == llmc.load(art).generate(want, 8, stop_at_eos=False)


@pytest.mark.parametrize(
    "kind, args, needle",
    [
        ("tiktoken", ("--prompt", "hi", "--chat"), "--chat: the checkpoint's tokenizer_config.json was not part of the checkpoint"),
        ("hf", ("--prompt-ids", "1,2", "--chat"), "--chat applies to --prompt TEXT"),
        ("hf", ("--prompt", "hi", "--prompt-ids", "1,2"), "not allowed with argument"),
        ("hf", (), "one of the arguments --prompt --prompt-ids is required"),
    ],
)
def test_cli_errors_are_one_line(built, kind, args, needle):
    r = _llmc("run", built[kind][1].vmfb, *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr


def test_no_tokenizer_and_stale_copies(built, tmp_path):
    """A checkpoint without a tokenizer compiled over an artifact that had one: the old tokenizer files
    go, the manifest records null, and text prompts are refused with one line."""
    _, hf_art = built["hf"]
    out = tmp_path / "out"
    out.mkdir()
    for f in hf_art.vmfb.parent.glob("hf.*"):
        shutil.copy(f, out / f.name.replace("hf.", "a.", 1))
    assert (out / "a.tokenizer.json").exists() and (out / "a.tokenizer_config.json").exists()
    ck = write_checkpoint(CONFIG, "meta", tmp_path / "ck", dtype="f32", seed=5)
    art = llmc.compile(ck, output=out / "a.vmfb", max_seq_len=MAX_SEQ)
    assert art.read_manifest()["llm"]["tokenizer"] is None
    assert sorted(p.name for p in out.iterdir()) == ["a.irpa", "a.json", "a.vmfb"]

    r = _llmc("run", art.vmfb, "--prompt", "hello")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "had no tokenizer" in lines[0] and "--prompt-ids" in lines[0], r.stderr
    assert _llmc("run", art.vmfb, "--prompt-ids", "1,2,3", "--max-new-tokens", 2).returncode == 0
    with pytest.raises(InputError, match="had no tokenizer"):
        llmc.load(art).generate_text("hello")


def test_missing_tokenizer_copy_is_named(built, tmp_path):
    _, art = built["sentencepiece"]
    for f in art.vmfb.parent.glob("sentencepiece.*"):
        if "tokenizer.model" not in f.name:
            shutil.copy(f, tmp_path / f.name)
    r = _llmc("run", tmp_path / "sentencepiece.vmfb", "--prompt", "hello")
    assert r.returncode == 2 and "sentencepiece.tokenizer.model: not found beside sentencepiece.vmfb" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
