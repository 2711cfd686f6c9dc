"""A cpu decode step reads bf16/fp8/int8 weights where it multiplies them.

The bf16-weights, fp8-weights and int8-weights passes store a linear weight packed and narrow. Where
every CPU of the module has AVX2 + FMA and a C compiler is at hand, a decode step's products are
dispatches of llmc's C kernels (compiler/ukernels.py), which read the packed weight itself.
Otherwise (LLMC_CPU_KERNELS=off here) they are decode(P) * x summed over K, and IREE must put the
decode into the dispatch that sums (a `matvec_like`), or every step writes and reads back a widened
f32 copy of every weight: 3x to 5x the memory traffic of a step that is bandwidth-bound. llmc used
to turn on IREE's aggressive fusion to get this; it no longer does (compiler/targets.py), so this
pins the fusion on IREE's default one. Both from the flow IR of the module llmc hands iree-compile.

The no-kernels builds (x86-64-v3) are compile-only and stop at IREE's flow phase. With the kernels,
the check runs on this machine's default cpu build of each dtype (fp8 and int8: the ones
tests/e2e/test_fp8.py and test_int8.py make and run anyway); those builds have a 16-token prefill
bucket too, which must compute what their dynamic prefill does (helpers below).
"""

from __future__ import annotations

import pytest

import llmc
from llmc.compiler import ukernels
from llmc.models.llama import model as llama_model

from narrow_checks import CONFIG, check_bucket_matches_dynamic_prefill, check_decode_reads, check_kernel_reads, narrow_build_options

MAX_SEQ = 64


@pytest.mark.parametrize("dtype", ["bf16", "fp8", "int8"])
def test_cpu_decode_reads_packed_narrow_weights_in_its_matvecs_without_kernels(tmp_path, monkeypatch, dtype):
    """LLMC_CPU_KERNELS=off, x86-64-v3. llmc's own iree-compile stops at the flow phase
    (`--compile-to=flow` comes after llmc's flags): its output is the flow IR of exactly the module and
    flags llmc compiles, without the code generation a runnable module would cost."""
    monkeypatch.setenv(ukernels.ENV, "off")
    llama = llama_model.init_random(CONFIG, seed=5)
    art = llmc.compile(llama, dtype=dtype, arch="x86-64-v3", output=tmp_path / "flow.vmfb", max_seq_len=MAX_SEQ,
                       dump_ir=tmp_path / "ir", extra_iree_flags=("--compile-to=flow",))
    check_decode_reads(tmp_path / "ir", art.vmfb.read_text(), dtype, kernels=False)


# With the kernels, fp8 and int8: the default cpu builds that tests/e2e/test_fp8.py and test_int8.py
# make, run and compare with eager anyway carry this check and the bucket one, with the helpers of narrow_checks.py:
# test_cpu_fp8_decode_reads_the_packed_weights_in_the_kernels, test_cpu_fp8_bucket_matches_its_dynamic_prefill
# and the same two in test_int8.py (test_cpu_int8_...). bf16: test_cpu_bf16_... at the end of this file.


def test_cpu_bf16_decode_reads_packed_weights_in_the_kernels_and_its_bucket_matches_its_dynamic_prefill(tmp_path):
    """The default cpu bf16 build of the tiny Llama (fp8 and int8: see above) serves both checks."""
    art = llmc.compile(llama_model.init_random(CONFIG, seed=5), dtype="bf16", output=tmp_path / "m.vmfb", max_seq_len=MAX_SEQ,
                       **narrow_build_options(tmp_path))
    check_bucket_matches_dynamic_prefill(llmc.load(art), CONFIG.vocab_size)
    check_kernel_reads(tmp_path, "bf16", CONFIG.n_layers)
    # bf16 only: the bucket's products (16 rows, fixed) and the dynamic prefill's (M = the prompt's tokens) are
    # llmc's many-row kernel (the check above compared the two; `llmc diff` in test_dtype_matrix compares the
    # dynamic prefill with eager bf16)
    forms = next(p for p in art.read_manifest()["passes"] if p["name"] == "bf16-weights")["forms"]
    # 7 linears a layer, but the last layer's q, o and MLP run one row (models/llama/model.py LlamaPrefill): k and v there
    many_row = 7 * (CONFIG.n_layers - 1) + 2
    assert sum(n for form, n in forms.items() if "1 fixed many-row product(s) as C kernel calls" in form) == many_row
    assert sum(n for form, n in forms.items() if "1 dynamic many-row product(s) as C kernel calls" in form) == many_row
    flow = next((tmp_path / "phases").glob("*.flow.mlir")).read_text()
    assert flow.count(f"flow.dispatch @{ukernels.EXECUTABLE}::@gemm_bf16") >= many_row
