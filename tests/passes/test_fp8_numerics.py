"""Numerics of the fp8-weights pass (passes/fp8_weights.py), in eager PyTorch.

- decode_sw: every one of the 256 E4M3FN codes decodes to PyTorch's own float8_e4m3fn value, bit for
  bit (signed zeros and subnormals included); only the two NaN codes differ, and the quantizer never
  writes them.
- FN -> FNUZ: every finite FN code, converted and read as float8_e4m3fnuz with the adjusted scale,
  is the same real number (no re-quantization through float).
- quantize: within half an E4M3 step of the weight (relative 2^-4 of the row's scale x code).
- the pass on an exported program: the rewritten program computes exactly what the model computes
  with decode(q) * s in place of each linear weight (and of the embedding rows it gathers).
"""

import copy
import pytest
import torch

from llmc.compiler import pipeline, targets
from llmc.passes._packed import KERNEL_GROUPS, KERNEL_OPTION, PACK, PAIRS_OPTION, pairs_to_groups
from llmc.passes.fp8_weights import FN_MAX, decode_native, decode_sw, fn_to_fnuz, quantize

CODES = torch.arange(-128, 128, dtype=torch.int32).to(torch.int8)
FN = CODES.view(torch.float8_e4m3fn).float()
FINITE = ~torch.isnan(FN)


def test_software_decode_is_exact_for_all_256_codes():
    got = decode_sw(CODES)
    assert CODES[~FINITE].tolist() == [-1, 127]  # 0xFF, 0x7F: FN's NaNs
    assert torch.equal(got[FINITE].view(torch.int32), FN[FINITE].view(torch.int32))


def test_fn_to_fnuz_keeps_every_value():
    bits, scale = fn_to_fnuz(CODES[FINITE], torch.tensor([[3.0]]))
    assert scale.item() == 6.0
    as_fnuz = bits.view(torch.float8_e4m3fnuz).float() * (scale / 3.0)
    assert not torch.isnan(as_fnuz).any()  # FN's -0 (0x80) is FNUZ's NaN: it became +0
    assert torch.equal(as_fnuz.flatten(), FN[FINITE] + 0.0)  # + 0.0: -0 == +0 as values
    assert torch.equal(decode_native(bits, "e4m3fnuz", torch.float32) * 2, FN[FINITE] + 0.0)


@pytest.mark.parametrize("per_channel", [True, False])
def test_quantize_error_within_half_a_step(per_channel):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 96, generator=g) * torch.logspace(-3, 1, 64).unsqueeze(1)  # rows of very different size
    bits, scale = quantize(w, per_channel)
    assert bits.dtype == torch.int8 and scale.shape == ((64, 1) if per_channel else (1, 1))
    assert int(bits.view(torch.uint8).max()) != 0x7F and not (bits == -1).any()  # never a NaN code
    back = decode_sw(bits) * scale
    # Half a step: 2^-4 relative for normal codes (3 mantissa bits), 2^-10 x scale in the subnormal range.
    bound = torch.maximum(w.abs() * 2**-4, 2**-10 * scale.expand_as(w))
    assert ((back - w).abs() <= bound * (1 + 1e-6)).all(), ((back - w).abs() / bound).max()
    if per_channel:
        assert torch.allclose((decode_sw(bits).abs().amax(1)), torch.full((64,), FN_MAX))  # each row uses the range


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16, bias=False)

    def forward(self, ids):
        return self.down(torch.relu(self.up(self.emb(ids))))


def _dequantized(model: _Model, names) -> _Model:
    ref = _Model()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        for name in names:
            w = ref.get_parameter(name)
            bits, scale = quantize(w)
            w.copy_(decode_sw(bits) * scale)
    return ref


# How a cpu build lays out and multiplies the packed weights: the graph's reduction, the C kernel ops over
# 32-channel groups, or over the pair layout of a module whose CPUs have AVX512_BF16 (64 channels; here run
# in eager PyTorch, on any CPU): (options, group)
LAYOUTS = {"reduction": ({KERNEL_OPTION: False}, PACK), "kernel-op": ({KERNEL_OPTION: True, PAIRS_OPTION: False}, KERNEL_GROUPS["fp8"]),
           "pairs": ({KERNEL_OPTION: True, PAIRS_OPTION: True}, KERNEL_GROUPS["fp8dp"])}


def _plain(stored, layout: str):
    """A stored weight in the plain packed layout P[b, k, j] = w[Gb + j, k]."""
    return pairs_to_groups(stored) if layout == "pairs" else stored


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("embeddings, tokens", [(False, 5), (True, 5), (False, 1), (True, 1)])
def test_pass_computes_with_the_dequantized_weights(embeddings, tokens, layout):
    """One token: every linear has a one-row input and becomes the packed reduction form on cpu (or the
    kernel op); five tokens: the weights are decoded and unpacked whole (or the many-row kernel op). All
    run here in eager PyTorch."""
    options, g = LAYOUTS[layout]
    kernels = options[KERNEL_OPTION]
    torch.manual_seed(0)
    model = _Model().eval()
    ids = torch.tensor([[3, 7, 0, 49, 7][:tokens]])
    program = torch.export.export(model, (ids,)).run_decompositions(pipeline.base_decompositions())
    target = targets.resolve("cpu", None, "fp8")
    plan = pipeline.build(target, {"fp8_embeddings": embeddings, **options}, only=["fp8-weights"])
    program = plan.graph[0].run(program)
    quantized = ["up.weight", "down.weight"] + (["emb.weight"] if embeddings else [])
    assert sorted(k for k, v in program.state_dict.items() if v.dtype == torch.int8) == sorted(quantized)
    for k in quantized:
        rows, cols = model.state_dict()[k].shape
        assert program.state_dict[f"{k}_fp8_scale"].shape == (rows, 1)
        bits, _ = quantize(model.state_dict()[k])
        stored = program.state_dict[k]
        if k == "emb.weight":  # gathered by rows: kept [rows, cols]
            assert torch.equal(stored, bits)
        else:  # linear weights on cpu: G output channels side by side per K step (the C kernel's 32 or 64, else 8)
            assert stored.shape == (-(-rows // g), cols, g)
            stored = _plain(stored, layout)
            unpacked = stored.permute(0, 2, 1).reshape(-1, cols)
            assert torch.equal(stored[0, 5, :rows], bits[:g, 5]) and torch.equal(unpacked[:rows], bits)
            assert not unpacked[rows:].any()  # padding rows are zero codes
    forms = plan.stats()[0]["forms"]
    # one-row products: the reduction graph, or llmc::matvec_fp8 (eager: its torch definition)
    packed = "packed in pairs" if layout == "pairs" else "packed"  # the stats name the pair layout
    reduced = f"per-channel software, {packed}, 1 one-row product(s) as {'C kernel calls' if kernels else 'a reduction'}"
    assert forms.get(reduced, 0) == (2 if tokens == 1 else 0), forms
    got = program.module()(ids)
    want = _dequantized(model, quantized)(ids)
    assert torch.allclose(got, want, rtol=0, atol=1e-6), (got - want).abs().max()
    assert not torch.allclose(got, model(ids), rtol=0, atol=1e-6)  # the quantization is visible


@pytest.mark.parametrize("k", [16, 6])
def test_one_row_product_splits_k_in_four_partial_sums_when_it_can(k):
    """K % 4 == 0: the reduction runs over K/4 with 4 partial sums per output channel, added last;
    otherwise one sum over K. Both equal the product with the dequantized weight."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, 16).eval()
    x = torch.randn(1, k)
    program = torch.export.export(lin, (x,)).run_decompositions(pipeline.base_decompositions())
    plan = pipeline.build(targets.resolve("cpu", None, "fp8"), {KERNEL_OPTION: False}, only=["fp8-weights"])
    program = plan.graph[0].run(program)
    sums = [n for n in program.graph.nodes if n.target == torch.ops.aten.sum.dim_IntList]
    shapes = [tuple(n.args[0].meta["val"].shape) for n in sums]
    assert shapes == ([(2, 4, 4, 8), (2, 4, 8)] if k == 16 else [(2, 6, 1, 8), (2, 1, 8)]), shapes
    bits, scale = quantize(lin.weight)
    want = x @ (decode_sw(bits) * scale).T + lin.bias
    got = program.module()(x)
    assert torch.allclose(got, want, rtol=0, atol=1e-5), (got - want).abs().max()


def test_pair_layout_only_for_an_even_k():
    """With the pair option on, a weight with an odd K keeps the 32-channel layout and the plain kernel op (the
    pair layout holds K pairs), one with an even K gets the 64-channel pair layout; both compute the product with
    the dequantized weights (eager)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3, bias=False)).eval()
    x = torch.randn(1, 7)
    program = torch.export.export(model, (x,)).run_decompositions(pipeline.base_decompositions())
    options, _ = LAYOUTS["pairs"]
    plan = pipeline.build(targets.resolve("cpu", None, "fp8"), options, only=["fp8-weights"])
    program = plan.graph[0].run(program)
    assert program.state_dict["0.weight"].shape == (1, 7, KERNEL_GROUPS["fp8"])  # K = 7: 32 channels
    assert program.state_dict["2.weight"].shape == (1, 10, KERNEL_GROUPS["fp8dp"])  # K = 10: pairs
    ops = {n.target for n in program.graph.nodes if n.op == "call_function"}
    assert torch.ops.llmc.matvec_fp8.default in ops and torch.ops.llmc.matvec_fp8dp.default in ops
    forms = plan.stats()[0]["forms"]
    assert forms == {"per-channel software, packed, 1 one-row product(s) as C kernel calls": 1,
                     "per-channel software, packed in pairs, 1 one-row product(s) as C kernel calls": 1}, forms
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for w in (ref[0].weight, ref[2].weight):
            bits, scale = quantize(w)
            w.copy_(decode_sw(bits) * scale)
    got, want = program.module()(x), ref(x)
    assert torch.allclose(got, want, rtol=0, atol=1e-6), (got - want).abs().max()


class _Tied(torch.nn.Module):
    """An embedding table tied to the output head, 50 rows: not a multiple of 8."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.mid = torch.nn.Linear(16, 20)  # 20 outputs: padded to 24
        self.back = torch.nn.Linear(20, 16, bias=False)

    def forward(self, ids):
        h = self.back(torch.relu(self.mid(self.emb(ids))))
        return torch.nn.functional.linear(h, self.emb.weight)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("tokens", [1, 5])
def test_packed_layout_pads_rows_and_serves_a_tied_embedding(tokens, layout):
    """N % G != 0 is padded with zero rows to the next multiple of G (8, or the C kernel's 32 or 64; sliced
    off after the product); a table that is both gathered from and multiplied by is packed too, and
    its embedding gathers rows of codes from the packed layout (from the pair layout: from one copy of
    the codes in the plain one). Same values as the dequantized weights."""
    options, g = LAYOUTS[layout]
    torch.manual_seed(0)
    model = _Tied().eval()
    ids = torch.tensor([[3, 7, 0, 49, 7][:tokens]])
    program = torch.export.export(model, (ids,)).run_decompositions(pipeline.base_decompositions())
    plan = pipeline.build(targets.resolve("cpu", None, "fp8"), options, only=["fp8-weights"])
    program = plan.graph[0].run(program)
    for name, (rows, cols) in {"emb.weight": (50, 16), "mid.weight": (20, 16)}.items():
        stored = program.state_dict[name]
        bits, _ = quantize(model.state_dict()[name])
        assert stored.shape == (-(-rows // g), cols, g)
        stored = _plain(stored, layout)
        unpacked = stored.permute(0, 2, 1).reshape(-1, cols)
        assert torch.equal(unpacked[:rows], bits) and not unpacked[rows:].any()
    table = next(k for k, v in program.graph_signature.inputs_to_parameters.items() if v == "emb.weight")
    gathers = [n for n in program.graph.nodes if n.target == torch.ops.aten.gather.default]
    assert gathers and not any(n.target == torch.ops.aten.embedding.default and n.args[0].name == table for n in program.graph.nodes)
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for name in ("emb.weight", "mid.weight", "back.weight"):
            w = ref.get_parameter(name)
            bits, scale = quantize(w)
            w.copy_(decode_sw(bits) * scale)
    got, want = program.module()(ids), ref(ids)
    assert got.shape == (1, tokens, 50)
    assert torch.allclose(got, want, rtol=0, atol=1e-5), (got - want).abs().max()


@pytest.mark.parametrize("tokens", [1, 3])
def test_a_bf16_weight_in_an_f32_program_is_quantized_from_its_own_values(tokens):
    """A bf16 checkpoint compiled for fp8 with f32 math keeps its linear weights bf16 at export
    (export.convert_module keep_narrow_linears): the product is mixed-dtype, dtype-harmony casts
    the transposed weight to f32, and fp8-weights sees through that cast: the same packed forms, the
    one-row reduction included, and the values of the weight quantized from bf16."""
    from llmc.compiler import export

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 8)).to(torch.bfloat16).eval()
    conv = export.convert_module(model, torch.float32, keep_narrow_linears=True)
    assert conv[0].weight.dtype == torch.bfloat16 and conv[0].bias.dtype == torch.float32
    assert conv[0].weight.data_ptr() == model[0].weight.data_ptr()  # shared, not copied (an 8B checkpoint is mmapped)
    assert export.convert_module(model, torch.float32)[0].weight.dtype == torch.float32
    x = torch.randn(tokens, 16)
    program = torch.export.export(conv, (x,)).run_decompositions(pipeline.base_decompositions())
    plan = pipeline.build(targets.resolve("cpu", None, "fp8"), {KERNEL_OPTION: False}, only=["dtype-harmony", "fp8-weights"])
    for p in plan.graph:
        program = p.run(program)
    forms = plan.stats()[1]["forms"]
    assert forms == {("per-channel software, packed, 1 one-row product(s) as a reduction" if tokens == 1
                      else "per-channel software, packed"): 2}, forms
    assert not [n for n in program.graph.nodes if n.target == torch.ops.aten.mm.default and tokens == 1]
    ref = copy.deepcopy(model).float()
    with torch.no_grad():
        for lin in (ref[0], ref[2]):
            bits, scale = quantize(lin.weight)
            lin.weight.copy_(decode_sw(bits) * scale)
        lin_b = [conv[0].bias, conv[2].bias]
        ref[0].bias.copy_(lin_b[0]); ref[2].bias.copy_(lin_b[1])
    got, want = program.module()(x), ref(x)
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, rtol=0, atol=1e-5), (got - want).abs().max()


def test_gpu_targets_keep_the_row_layout():
    program = torch.export.export(_Model(), (torch.tensor([[1]]),)).run_decompositions(pipeline.base_decompositions())
    plan = pipeline.build(targets.resolve("vulkan", None, "fp8"), {}, only=["fp8-weights"])
    program = plan.graph[0].run(program)
    assert program.state_dict["up.weight"].shape == (32, 16) and program.state_dict["down.weight"].shape == (16, 32)
    assert set(plan.stats()[0]["forms"]) == {"per-channel software"}


def test_excluded_weights_stay():
    program = torch.export.export(_Model(), (torch.tensor([[1, 2]]),)).run_decompositions(pipeline.base_decompositions())
    plan = pipeline.build(targets.resolve("cpu", None, "fp8"), {"fp8_exclude": ("down.*",)}, only=["fp8-weights"])
    program = plan.graph[0].run(program)
    assert program.state_dict["down.weight"].dtype == torch.float32 and program.state_dict["up.weight"].dtype == torch.int8
    assert "excluded by 'down.*'" in plan.stats()[0]["decline_reasons"]
