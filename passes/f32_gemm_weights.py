"""f32-gemm-weights: f32 linear weights stored in llmc's 16-channel panels for the many-row C kernel (cpu).

Matches:  on llvm-cpu, when the compile has entry points with a fixed number of rows (an LLM's prefill
          chunk or buckets: ctx.options[FIXED_ROWS_OPTION], set by compiler/llm.py) and llmc's cpu C
          kernels serve the target (ctx.options[_packed.KERNEL_OPTION]), every 2-D f32 parameter,
          buffer or constant W [N, K] with N % 16 == 0 that a matrix product reads through one
          transpose (`mm(x, W.t())`, `addmm(b, x, W.t())`; read-only state only).
Produces: W stored as P[N/16, K, 16] (P[b, k, j] = W[16b + j, k]: _packed.pack with 16 channels, the
          layout of bf16's panels) in every entry point, so the .irpa holds it once; in each program
              mm(x, W.t()) with x f32 [M, K], M >= 2 fixed  ->  llmc::gemm_f32(x, P)     (+ b for addmm)
          (compiler/csrc's 6 x 16 register block over each panel), and every other use of W reads
              unpack(P) = P.permute(0, 2, 1).reshape(N, K)
          computed once after the placeholders. It depends on the stored weight only, so IREE's
          const-expr hoisting evaluates it at load, together with its data-tiling pack: the decode
          and the dynamic prefill run the same data-tiled matmuls as before, and no call transposes
          a weight (checked by profiling a decode step: docs/targets.md "f32 weights for the prefill
          kernel"). An embedding table tied to the output head is gathered from that unpacked copy,
          which IREE then keeps in memory beside its own packed one.
Safe because: P is a permutation of W's values and unpack(P) is W exactly; the kernel's products
          differ from IREE's only in the f32 summation order (one accumulator per output, K in order).
Why:      a prefill chunk's products are 64 x K x N matmuls. IREE 3.13's data-tiled f32 matmul
          runs 73-82 GFLOP/s with AVX2's 8 x 8 tile (Zen 3) and 77-98 with AVX-512's 16 x 16 (Zen 4);
          the 6 x 16 block 91-95 and 94-116 on the same cores (docs/targets.md "Prefill kernels").
"""

from __future__ import annotations

import torch

from llmc.passes import _packed
from llmc.passes._base import GraphPass, Requires, once_per_tensor, register_pass, written_in_place

_aten = torch.ops.aten
FIXED_ROWS_OPTION = "fixed_row_products"  # ctx.options: True when the compile has fixed-row entry points (chunk, buckets)
GROUP = _packed.KERNEL_GROUPS["f32"]  # output channels per panel: the C block's width


def _identity(p):
    return p


_packed.define_gemm_op("f32", _identity)


def _why_not(ctx) -> str | None:
    if not ctx.options.get(FIXED_ROWS_OPTION):
        return "no entry point with a fixed number of rows (prefill chunk or bucket)"
    if not ctx.options.get(_packed.KERNEL_OPTION):
        return "llmc's cpu C kernels do not serve this target"
    return None


@register_pass("f32-gemm-weights", Requires(backends=("llvm-cpu",), dtypes=("f32",), check=_why_not))
class F32GemmWeightsPass(GraphPass):
    def run(self, program):
        from torch.export.graph_signature import InputKind

        sig = program.graph_signature
        mutated = set(sig.buffers_to_mutate.values())
        graph = program.graph_module.graph
        placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
        for spec in sig.input_specs:
            if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                continue
            name, node = spec.target, placeholders[spec.arg.name]
            table = program.state_dict if name in program.state_dict else program.constants
            tensor = table.get(name)
            if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.float32 or tensor.dim() != 2:
                continue
            uses, _ = _packed._transposed_uses(node)
            if not uses:
                continue
            if name in mutated or written_in_place(node):
                self.stats.decline(name, "mutated by the program (state, not a weight)")
                continue
            n, k = tensor.shape
            if n % GROUP:
                self.stats.decline(name, f"{n} output channels, not a multiple of {GROUP}")
                continue
            stored = once_per_tensor(self.__dict__.setdefault("_packed", {}), tensor,
                                     lambda t: self.ctx.keep(t, _packed.pack(t, GROUP)))
            table[name] = torch.nn.Parameter(stored, requires_grad=False) if spec.kind == InputKind.PARAMETER else stored
            fake = node.meta.get("val")
            gemms = _rewrite(graph, node, (n, k), uses, sig.output_specs)
            _packed.propagate_fake(graph, node, None, fake, stored, None)
            self.stats.rewrite("packed" + _packed.rows_form(0, 0, gemms))
        graph.lint()
        program.graph_module.recompile()
        return program


def _rewrite(graph, node, shape: tuple[int, int], uses, outputs) -> int:
    """Point every use of the now-packed `node` at its kernel call or at unpack(node); returns how many
    products became `llmc::gemm_f32` calls."""
    call = graph.call_function
    n, k = shape
    gemms = 0
    for wt, product in uses:
        x, m = _packed._static_rows_input(product, wt, k)
        if m < 2 or x.meta["val"].dtype != torch.float32:
            continue
        with graph.inserting_before(product):
            y = call(_packed.GEMM_OPS["f32"], (x, node))
            if product.target == _aten.addmm.default:
                y = call(_aten.add.Tensor, (product.args[0], y))
        _packed.replace(graph, product, y, outputs)
        gemms += 1
    for dead in dict.fromkeys(wt for wt, _ in uses):  # transposes no product reads any more
        if not dead.users:
            graph.erase_node(dead)
    rest = [u for u in node.users if not (u.op == "call_function" and u.target == _packed.GEMM_OPS["f32"])]
    if rest:
        with graph.inserting_before(next(n_ for n_ in graph.nodes if n_.op != "placeholder")):
            full = call(_aten.permute.default, (node, [0, 2, 1]))
            full = call(_aten.view.default, (call(_aten.clone.default, (full,), {"memory_format": torch.contiguous_format}), [n, k]))
        for user in rest:
            user.replace_input_with(node, full)
    return gemms
