"""ParamStore.write_irpa: memory-mapped checkpoint tensors go to IREE as file ranges (never faulted
into this process), in-memory tensors as buffers; the archive holds the same bytes either way."""

import numpy as np
import pytest
import torch
from safetensors.torch import safe_open, save_file

from llmc.compiler import export, importer
from llmc.compiler.importer import ParamStore, _FileBacking


def _read_irpa(path):
    import iree.runtime as rt

    index = rt.ParameterIndex()
    index.load(str(path))
    return {k: np.asarray(rt.parameter_index_entry_as_numpy_flat_ndarray(e)) for k, e in index.items()}


def test_mmapped_tensors_are_file_ranges_and_bytes_survive(tmp_path):
    src = {"a": torch.randn(64, 32), "b": torch.arange(100, dtype=torch.int64)}
    save_file(src, tmp_path / "w.safetensors")
    with safe_open(tmp_path / "w.safetensors", framework="pt") as f:
        mapped = {k: f.get_tensor(k) for k in f.keys()}
    in_memory = torch.randn(7, 5).to(torch.bfloat16)

    files = _FileBacking()
    try:
        assert files.find(mapped["a"].data_ptr(), mapped["a"].numel() * 4) is not None
        assert files.find(in_memory.data_ptr(), in_memory.numel() * 2) is None
    finally:
        files.close()

    store = ParamStore()
    for k, v in mapped.items():
        store.add(k, v)
    store.add("c", in_memory)
    store.write_irpa(tmp_path / "p.irpa")
    got = _read_irpa(tmp_path / "p.irpa")
    for k, t in [*src.items(), ("c", in_memory)]:
        assert bytes(got[k].tobytes()) == t.contiguous().view(torch.uint8).numpy().tobytes(), k


def test_modified_copy_on_write_page_is_not_read_from_the_file(tmp_path):
    t = torch.zeros(4096)
    save_file({"z": t}, tmp_path / "z.safetensors")
    with safe_open(tmp_path / "z.safetensors", framework="pt") as f:
        z = f.get_tensor("z")
    try:
        z[0] = 5.0  # if safetensors hands out a private mapping, this page now differs from the file
    except RuntimeError:
        return  # read-only mapping: nothing to check
    store = ParamStore()
    store.add("z", z)
    store.write_irpa(tmp_path / "z.irpa")
    assert _read_irpa(tmp_path / "z.irpa")["z"].view(np.float32)[0] == 5.0


def test_a_write_in_the_middle_of_a_mapped_tensor_is_kept(tmp_path):
    """Only a middle page differs from the file: the archive must hold the modified bytes."""
    torch.save({"w": torch.arange(1_000_000, dtype=torch.float32)}, tmp_path / "w.pt")
    w = torch.load(tmp_path / "w.pt", mmap=True, weights_only=True)["w"]
    w[500_000:500_010] = -1.0
    store = ParamStore()
    store.add("w", w)
    store.write_irpa(tmp_path / "w.irpa")
    got = _read_irpa(tmp_path / "w.irpa")["w"].view(np.float32)
    assert got[500_000] == -1.0 and got[0] == 0.0 and got[999_999] == 999_999.0


def test_column_shards_of_a_mapped_tensor_go_through_a_spill_file(tmp_path):
    """--tensor-parallel's column shards (w[:, a:b]) of a mapped checkpoint are strided views: copied
    one at a time through a spill file, not held in memory until the archive is written. The bytes are
    the view's, a modified (copy-on-write) element included; an in-memory view is not spilled."""
    torch.save({"w": torch.arange(64 * 48, dtype=torch.float32).reshape(64, 48)}, tmp_path / "w.pt")
    w = torch.load(tmp_path / "w.pt", mmap=True, weights_only=True)["w"]
    w[3, 40] = -7.0  # a private page now: the spilled copy must hold it
    cols = [w[:, 0:16], w[:, 16:32], w[:, 32:48]]
    in_memory = torch.randn(8, 6)[:, 2:4]
    assert not cols[0].is_contiguous() and not in_memory.is_contiguous()
    store = ParamStore()
    for i, c in enumerate(cols):
        store.add(f"shards.{i}.o_proj", c)
    store.add("rows", w[8:16])  # contiguous: a file range, not spilled
    store.add("small", in_memory)
    out = tmp_path / "archive"
    out.mkdir()
    store.write_irpa(out / "p.irpa")
    assert store.spilled_bytes == sum(c.numel() * 4 for c in cols)
    assert [p.name for p in out.iterdir()] == ["p.irpa"]  # the spill file is gone
    got = _read_irpa(out / "p.irpa")
    for i, c in enumerate(cols):
        np.testing.assert_array_equal(got[f"shards.{i}.o_proj"].view(np.float32).reshape(64, 16), c.numpy())
    assert got["shards.2.o_proj"].view(np.float32).reshape(64, 16)[3, 8] == -7.0
    np.testing.assert_array_equal(got["rows"].view(np.float32).reshape(8, 48), w[8:16].numpy())
    np.testing.assert_array_equal(got["small"].view(np.float32).reshape(8, 2), in_memory.numpy())


@pytest.mark.parametrize("dtype, mlir", [(torch.float8_e4m3fn, "f8E4M3FN"), (torch.float8_e4m3fnuz, "f8E4M3FNUZ"), (torch.float8_e5m2, "f8E5M2")])
def test_fp8_weights_are_external_parameters(dtype, mlir):
    """An f8 constant cannot be serialized into a vmfb (IREE 3.13: 'unhandled float element bit width 8'),
    so fp8 weights must go to the .irpa like every other weight, typed with IREE's f8 element type."""

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4).to(dtype), requires_grad=False)

        def forward(self, x):
            return x @ self.w.to(torch.float32)

    ep = torch.export.export(M(), (torch.randn(2, 4),))
    module, store, _ = importer.import_exported(export.Exported(ep))
    text = str(module)
    assert list(store.tensors) == ["w"] and store.tensors["w"].dtype == dtype
    assert f'#stream.parameter.named<"model"::"w"> : tensor<4x4x{mlir}>' in text
    assert "dense<" not in text.split("func.func")[0]  # nothing inlined before the function
