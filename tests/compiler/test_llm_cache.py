"""The KV cache is updated in place: IREE's stream IR for prefill, decode and the prefill chunk returns the caller's cache
buffers (tied) and never allocates or copies a cache-sized buffer. This is the copy count of
docs/architecture.md checked on every build, independent of timing noise."""

import re
import subprocess

import pytest

from llmc.compiler.iree import iree_compile_path
import llmc
from llmc.models.llama.config import get_config
from llmc.models.llama.model import init_random

MAX_SEQ = 48


@pytest.fixture(scope="module")
def stream_ir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kv")
    config = get_config("tiny")
    art = llmc.compile(init_random(config, seed=0), output=tmp / "tiny.vmfb", max_seq_len=MAX_SEQ, dump_ir=tmp / "ir",
                        prefill_chunk=8)
    flags = art.read_manifest()["iree_flags"]
    out = tmp / "stream.mlir"
    # the text iree-compile gets: where llmc's C kernels serve (here: gemm_f32 for the chunk on a CPU without
    # AVX-512), the dump after ukernels.link; the import's text calls them as external functions, whose
    # buffer-view round trips allocate transients that are not the module's
    dumps = sorted((tmp / "ir").glob("*.mlir"), key=lambda f: int(f.name.split("-", 1)[0]))
    linked = [f for f in dumps if f.name.endswith("-cpu-kernels.mlir")]
    source = linked[-1] if linked else next(f for f in dumps if f.name.endswith("-import.mlir"))
    subprocess.run([iree_compile_path(), str(source), *flags, "--compile-to=stream", "-o", str(out)], check=True)
    cache_bytes = 1 * config.n_kv_heads * MAX_SEQ * config.head_dim * 4
    return out.read_text(), cache_bytes, 2 * config.n_layers


def _function(text: str, name: str) -> tuple[str, str]:
    m = re.search(rf"util\.func public @{name}\$async\((.*?)\) -> \((.*?)\) attributes", text)
    assert m, f"no {name}$async in the stream IR"
    start = m.end()
    end = text.find("\n  }", start)
    return m.group(2), text[start:end]


@pytest.mark.parametrize("name, first_cache_arg", [("prefill", 1), ("decode", 2), ("prefill_chunk", 2)])
def test_cache_results_are_the_input_buffers(stream_ir, name, first_cache_arg):
    text, _, n_cache = stream_ir
    results, _ = _function(text, name)
    tied = [r.strip() for r in results.split(",")[1:]]
    assert tied == [f"%arg{first_cache_arg + i}" for i in range(n_cache)]


@pytest.mark.parametrize("name", ["prefill", "decode", "prefill_chunk"])
def test_no_cache_sized_alloc_or_copy(stream_ir, name):
    text, cache_bytes, _ = stream_ir
    _, body = _function(text, name)
    sized = [line for line in body.splitlines() if re.search(r"stream\.(resource\.alloca|cmd\.copy|async\.copy|async\.clone)", line)]
    big = [line for line in sized if f"%c{cache_bytes}" in line or re.search(rf"\b{cache_bytes}\b", line)]
    assert not big, "cache-sized allocation or copy:\n" + "\n".join(big)
    # The check can see the cache: each cache argument is imported with exactly that size.
    assert body.count(f"{{%c{cache_bytes}}}") >= 1
