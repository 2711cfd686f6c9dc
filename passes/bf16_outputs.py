"""bf16-outputs: a program computed in f32 for `--dtype bf16` returns bf16, as eager bf16 does.

Matches:  the user outputs of a program exported in f32 for `--dtype bf16` on cpu (bf16 weights with
          f32 math, compiler/targets.py `_CPU_BF16`): every f32 output that is not tied to an input
          (a Llama's KV cache is returned into its own f32 buffer: it stays f32).
Produces: the output cast to bf16 (`aten._to_copy`, round to nearest even).
Safe because: eager PyTorch's bf16 model returns bf16, so callers get the dtype they expect; the
          value is the f32 result rounded once, at least as close to the exact value as eager's.
Why: only llvm-cpu: SPIR-V has no bf16 type at all (vulkan/xpu bf16 programs return f32).
"""

from __future__ import annotations

import torch

from llmc.passes._base import GraphPass, Requires, register_pass


@register_pass("bf16-outputs", Requires(backends=("llvm-cpu",), dtypes=("bf16",)))
class Bf16OutputsPass(GraphPass):
    def run(self, program):
        from torch.export.graph_signature import OutputKind

        if self.ctx.target.compute_dtype != "f32":
            return program
        graph = program.graph_module.graph
        out = next(n for n in graph.nodes if n.op == "output")
        values = list(out.args[0])
        tied = set(self.ctx.tied_outputs)
        user = -1
        for i, spec in enumerate(program.graph_signature.output_specs):
            if spec.kind != OutputKind.USER_OUTPUT:
                continue
            user += 1
            node = values[i]
            val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
            if not isinstance(val, torch.Tensor) or val.dtype != torch.float32:
                continue
            if user in tied:
                self.stats.decline(spec.arg.name, "tied to an input (state kept in the compute dtype)")
                continue
            with graph.inserting_before(out):
                cast = graph.call_function(torch.ops.aten._to_copy.default, (node,), {"dtype": torch.bfloat16})
            cast.meta["val"] = val.to(torch.bfloat16)
            cast.meta["stack_trace"] = node.meta.get("stack_trace")
            values[i] = cast
            spec.arg.name = cast.name
            self.stats.rewrite()
        out.args = (tuple(values),) + tuple(out.args[1:])
        graph.lint()
        program.graph_module.recompile()
        return program
