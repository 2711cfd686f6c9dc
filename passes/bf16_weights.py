"""bf16-weights: bf16 weights stored as their 16 bits and widened with integer ops; f32 math.

Matches:  every f32 parameter, persistent buffer and lifted tensor constant of the exported program
          (read-only state: a buffer the program mutates is left alone), and bf16 ones (a bf16
          checkpoint's linear and embedding weights, kept narrow by the export), when `--dtype
          bf16` is compiled for a target where bf16 is emulated in f32 (vulkan, xpu, cpu: the program
          is exported in f32, compiler/targets.py `compute`).
Produces: the weight rounded to bf16 (round-to-nearest-even, as `tensor.to(torch.bfloat16)`; a bf16
          weight as it is) and stored as int16 with the same bits, so the .irpa holds 2 bytes per
          weight; where it is used,
              w = view_as_f32(int32(w_bits) << 16)
          an exact bf16 -> f32 widening made of integer ops. Everything after that is f32. On cpu a
          2-D weight a matrix product reads is stored packed, [ceil(N/G), K, G] (G = 16, or 32 where
          llmc's C kernels serve), and its uses are
          rewritten by passes/_packed.py (a decode step's linear reads each weight once, 2 bytes, in
          a reduction with 4 partial sums per channel; two or more rows (a prefill chunk, bucket or
          the dynamic prefill) go to llmc's many-row C kernel where the cpu kernels serve; without
          it, multi-row products widen and unpack it once per call into the f32 data-tiled matmul); an embedding
          table gathers its rows' bits first and widens only those.
Safe because: a bf16 value is the top half of the f32 with the same value, so shifting its 16 bits
          into the high half of an int32 and reading that as f32 is exact (NaN and infinities
          included). The weights equal eager PyTorch's `model.to(torch.bfloat16)` weights bit for
          bit; activations are f32, so results are at least as accurate as eager bf16. The packed
          forms are views of the same values; only the f32 summation order differs.
Why: SPIR-V has no bf16 type and IREE 3.13 fails on every bf16 -> f32 conversion there ("failed to
          legalize operation 'vector.bitcast': (vector<2xf32>) -> vector<4xbf16>", an `x.float()` of a
          bf16 weight, --iree-vulkan-target=llvmpipe). IREE's --iree-input-promote-bf16-to-f32 does
          compile, but it makes every bf16 parameter and argument f32 on the device while the module
          still declares bf16: the .irpa's 2-byte weights then fail to load ("parameter ... range out
          of bounds") and bf16 arguments fail "tensor buffer byte length 1024 less than expected
          minimum 2048".
          On a CPU without avx512_bf16, bf16 math is LLVM widening every operand to f32 and rounding
          every result back: a data-tiled bf16 matmul ran at 1.4 GFLOP/s against 55 in f32, and the
          small Llama's bf16 decode reached 37% of its roofline (docs/targets.md, bf16 on cpu).
"""

from __future__ import annotations

import torch

from llmc.passes import _packed
from llmc.passes._base import GraphPass, Requires, once_per_tensor, register_pass, tensor_key, written_in_place

_aten = torch.ops.aten
# Output channels per packed group on cpu where the graph's reduction computes one-row products
# (passes/_packed.py; fp8/int8 keep its default, 8): two f32 vectors per K step share one broadcast of
# x, so the decode loop issues fewer instructions per byte and its loads run further ahead (small
# Llama decode 5-8% faster than 8, docs/targets.md). Where the C kernel serves, its layout
# (_packed.KERNEL_GROUPS: 32) decides.
PACK = 16


def widen_bf16_bits(bits: torch.Tensor) -> torch.Tensor:
    """The f32 values of bf16 numbers given as their int16 bit patterns (the pass's decode, in eager)."""
    return (bits.to(torch.int32) << 16).view(torch.float32)


_packed.define_kernel_op("bf16", widen_bf16_bits)
_packed.define_gemm_op("bf16", widen_bf16_bits)


@register_pass("bf16-weights", Requires(backends=("vulkan-spirv", "llvm-cpu"), dtypes=("bf16",)))
class Bf16WeightsPass(GraphPass):
    def run(self, program):
        from torch.export.graph_signature import InputKind

        sig = program.graph_signature
        mutated = set(sig.buffers_to_mutate.values())
        graph = program.graph_module.graph
        cpu = self.ctx.target.caps.backend == "llvm-cpu"
        placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
        # A table tied to the output head is one tensor under two names (two placeholders): it is
        # stored packed when any of its placeholders feeds a matrix product (the embedding's then
        # gathers from the packed layout), so the .irpa holds it once.
        packed_storage = set()  # tensor_key of each weight stored packed
        for spec in sig.input_specs:
            t = _state(program, spec.target)
            if cpu and t is not None and t.dim() == 2 and _packed.feeds(placeholders[spec.arg.name], _packed.PRODUCTS):
                packed_storage.add(tensor_key(t))
        for spec in sig.input_specs:
            if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                continue
            name = spec.target
            if name in mutated or written_in_place(placeholders[spec.arg.name]):
                self.stats.decline(name, "mutated by the program (state, not a weight)")
                continue
            table = program.state_dict if name in program.state_dict else program.constants
            tensor = table.get(name)
            if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
                continue
            if tensor.dtype not in (torch.float32, torch.bfloat16):
                self.stats.decline(name, f"{tensor.dtype} (the program is computed in f32 here)")
                continue
            node = placeholders[spec.arg.name]
            packed = tensor.dim() == 2 and tensor_key(tensor) in packed_storage
            bits = self._bits(tensor, packed)
            table[name] = torch.nn.Parameter(bits, requires_grad=False) if spec.kind == InputKind.PARAMETER else bits
            if packed:
                fake = node.meta.get("val")
                rows = _packed.rewrite_uses(graph, node, tuple(tensor.shape), _emit_widen, sig.output_specs, group=self._group(),
                                            kernel=_packed.kernel_kind(self.ctx, "bf16"))
                _packed.propagate_fake(graph, node, None, fake, bits, None)
                self.stats.rewrite("packed" + _packed.rows_form(*rows))
            else:
                self._widen_at_uses(graph, node, sig.output_specs)
                self.stats.rewrite()
        graph.lint()
        program.graph_module.recompile()
        return program

    def _group(self) -> int:
        return _packed.group_for(self.ctx, "bf16", PACK)

    def _bits(self, tensor: torch.Tensor, packed: bool) -> torch.Tensor:
        """The int16 bits of `tensor` in bf16 (packed: passes/_packed.py's layout), made once per
        source tensor (_base.once_per_tensor), so every entry point stores the same thing."""
        def make(t):
            bits = t.to(torch.bfloat16).view(torch.int16)
            return self.ctx.keep(t, _packed.pack(bits, self._group()) if packed else bits)

        # One cache per form: a tensor stored packed for one program and plain for another gets both.
        return once_per_tensor(self.__dict__.setdefault(f"_converted_{'packed' if packed else 'plain'}", {}), tensor, make)

    @staticmethod
    def _widen_at_uses(graph, node, outputs) -> None:
        """One widening for every use, except an embedding's, which gathers its rows' bits and widens
        only those (a table is not widened whole on every call)."""
        fake = node.meta.get("val")
        bits_val = fake.to(torch.bfloat16).view(torch.int16) if fake is not None else None
        users = list(node.users)
        value = None
        for user in users:
            if user.target in _packed.EMBEDDING and user.args[0] is node:
                with graph.inserting_before(user):
                    rows = graph.call_function(_aten.embedding.default, (node, *user.args[1:]), dict(user.kwargs))
                    rows_val = user.meta["val"].to(torch.bfloat16).view(torch.int16) if "val" in user.meta else None
                    if rows_val is not None:
                        rows.meta["val"] = rows_val
                    wide = _emit_widen(graph, rows, rows_val)
                _copy_trace(user, rows, wide)
                _packed.drop_metadata_asserts(graph, user)
                _packed.replace(graph, user, wide, outputs)
                continue
            if value is None:  # after every placeholder (passes/_packed.py inserts there too)
                with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")):
                    value = _emit_widen(graph, node, bits_val)
                _copy_trace(node, value)
            user.replace_input_with(node, value)
        if bits_val is not None:
            node.meta["val"] = bits_val


def _state(program, name):
    """The tensor a parameter, buffer or constant input names (None for others)."""
    t = program.state_dict.get(name, program.constants.get(name))
    return t if isinstance(t, torch.Tensor) else None


def _emit_widen(graph, bits_node, bits_val=None):
    """f32 values of the int16 bf16 bits `bits_node`: int32(bits) << 16 read as f32 (widen_bf16_bits),
    at the current insertion point; the fake values follow `bits_val` when given."""
    call = graph.call_function
    wide = call(_aten._to_copy.default, (bits_node,), {"dtype": torch.int32})
    high = call(_aten.__lshift__.Scalar, (wide, 16))
    value = call(_aten.view.dtype, (high, torch.float32))
    if bits_val is not None:
        wide.meta["val"] = bits_val.to(torch.int32)
        high.meta["val"] = wide.meta["val"] << 16
        value.meta["val"] = high.meta["val"].view(torch.float32)
    return value


def _copy_trace(source, *nodes) -> None:
    """The source node's stack trace on the nodes that replace it (and on their inputs made here)."""
    for n in nodes:
        for m in (n, *[a for a in n.all_input_nodes if a.op == "call_function"]):
            m.meta.setdefault("stack_trace", source.meta.get("stack_trace"))
