"""bf16-weights: bf16 weights stored as their 16 bits and widened with integer ops, for SPIR-V.

Matches:  every f32 parameter, persistent buffer and lifted tensor constant of the exported program
          (read-only state: a buffer the program mutates is left alone), when `--dtype bf16` is
          compiled for a target whose bf16 is emulated in f32 (vulkan, xpu: the program is exported
          in f32, compiler/targets.py `compute`).
Produces: the weight rounded to bf16 (round-to-nearest-even, as `tensor.to(torch.bfloat16)`) and
          stored as int16 with the same bits, so the .irpa holds 2 bytes per weight; where it is used,
              w = view_as_f32(int32(w_bits) << 16)
          an exact bf16 -> f32 widening made of integer ops. Everything after that is f32.
Safe because: a bf16 value is the top half of the f32 with the same value, so shifting its 16 bits
          into the high half of an int32 and reading that as f32 is exact (NaN and infinities
          included). The weights equal eager PyTorch's `model.to(torch.bfloat16)` weights bit for
          bit; activations are f32, so results are at least as accurate as eager bf16.
Why: SPIR-V has no bf16 type and IREE 3.13 fails on every bf16 -> f32 conversion there ("failed to
          legalize operation 'vector.bitcast': (vector<2xf32>) -> vector<4xbf16>", an `x.float()` of a
          bf16 weight, --iree-vulkan-target=llvmpipe). IREE's --iree-input-promote-bf16-to-f32 does
          compile, but it makes every bf16 parameter and argument f32 on the device while the module
          still declares bf16: the .irpa's 2-byte weights then fail to load ("parameter ... range out
          of bounds") and bf16 arguments fail "tensor buffer byte length 1024 less than expected
          minimum 2048".
"""

from __future__ import annotations

import torch

from llmc.passes._base import GraphPass, Requires, once_per_tensor, register_pass, written_in_place

_aten = torch.ops.aten


def widen_bf16_bits(bits: torch.Tensor) -> torch.Tensor:
    """The f32 values of bf16 numbers given as their int16 bit patterns (the pass's decode, in eager)."""
    return (bits.to(torch.int32) << 16).view(torch.float32)


@register_pass("bf16-weights", Requires(backends=("vulkan-spirv",), dtypes=("bf16",)))
class Bf16WeightsPass(GraphPass):
    def run(self, program):
        from torch.export.graph_signature import InputKind

        sig = program.graph_signature
        mutated = set(sig.buffers_to_mutate.values())
        graph = program.graph_module.graph
        placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
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
            if tensor.dtype != torch.float32:
                self.stats.decline(name, f"{tensor.dtype} (the program is computed in f32 here)")
                continue
            table[name] = self._bits(tensor, as_parameter=spec.kind == InputKind.PARAMETER)
            self._widen_at_uses(graph, placeholders[spec.arg.name])
            self.stats.rewrite()
        graph.lint()
        program.graph_module.recompile()
        return program

    def _bits(self, tensor: torch.Tensor, as_parameter: bool) -> torch.Tensor:
        """The int16 bits of `tensor` in bf16, made once per source tensor (_base.once_per_tensor)."""
        bits = once_per_tensor(self.__dict__.setdefault("_converted", {}), tensor, lambda t: t.to(torch.bfloat16).view(torch.int16))
        return torch.nn.Parameter(bits, requires_grad=False) if as_parameter else bits

    @staticmethod
    def _widen_at_uses(graph, node) -> None:
        fake = node.meta.get("val")
        users = list(node.users)
        with graph.inserting_after(node):
            wide = graph.call_function(_aten._to_copy.default, (node,), {"dtype": torch.int32})
        with graph.inserting_after(wide):
            high = graph.call_function(_aten.__lshift__.Scalar, (wide, 16))
        with graph.inserting_after(high):
            value = graph.call_function(_aten.view.dtype, (high, torch.float32))
        for user in users:
            user.replace_input_with(node, value)
        if fake is not None:
            node.meta["val"] = bits_val = fake.to(torch.bfloat16).view(torch.int16)
            wide.meta["val"] = bits_val.to(torch.int32)
            high.meta["val"] = wide.meta["val"] << 16
            value.meta["val"] = high.meta["val"].view(torch.float32)
        for n in (wide, high, value):
            n.meta["stack_trace"] = node.meta.get("stack_trace")
