"""vecmat-as-mv: a vector times a matrix with a dynamic result length as the transposed matrix times a column.

Matches:  squeeze(mm(unsqueeze(v, 0), B), 0) with v 1-D and the product's N (B's columns) symbolic:
          `torch.matmul(v, B)` of a vector and a matrix as the decomposition writes it. The mm has no
          other use.
Produces: squeeze(mm(permute(B, [1, 0]), unsqueeze(v, 1)), 1): the matrix-vector form of the same
          [N] vector, sum over k of B[k, n] * v[k].
Safe because: both are the same sums over K of the same products (a matrix-vector product of the
          transpose is the vector-matrix product); shapes follow v and B, so N and K stay dynamic.
Why: on llvm-cpu, IREE 3.13's older data-tiling route (`--iree-global-opt-data-tiling=true`, which
          llmc uses for dynamic f32 programs: docs/targets.md) returns the squeezed vector with its
          padded length: torch-mlir's e2e Matmul_vecmat, [4] x [4, 5] with dynamic dims, came back
          as `8xf32=<the 5 right values> 0 0 0` from iree-run-module itself, no error. a matrix
          times a column vector, `mm` of [1, K] x [K, N] left unsqueezed, and static N come back right, so only
          this form is rewritten. (`aten.mv` itself reaches IREE as a matmul of [?, ?] x [?] that came
          back padded the same way, so the pass writes the column-vector mm.)
"""

from __future__ import annotations

import torch

from llmc.passes import _packed
from llmc.passes._base import GraphPass, Requires, fill_fake_values, register_pass

_aten = torch.ops.aten
_SQUEEZES = (torch.ops.prims.squeeze.default, _aten.squeeze.dim, _aten.squeeze.dims)


def _squeezes_dim0(node: torch.fx.Node) -> bool:
    if node.target == _aten.squeeze.dim:
        return node.args[1] == 0
    return list(node.args[1]) == [0]


def _vecmat(node: torch.fx.Node):
    """(v, B) when node is squeeze(mm(unsqueeze(v, 0), B), 0) with a symbolic N; else None."""
    if node.op != "call_function" or node.target not in _SQUEEZES or not _squeezes_dim0(node):
        return None
    mm = node.args[0]
    if not isinstance(mm, torch.fx.Node) or mm.target != _aten.mm.default or len(mm.users) != 1:
        return None
    row, mat = mm.args
    if not isinstance(row, torch.fx.Node) or row.target != _aten.unsqueeze.default or row.args[1] != 0:
        return None
    vec, out = row.args[0], mm.meta.get("val")
    if not isinstance(vec, torch.fx.Node) or vec.meta["val"].dim() != 1 or out is None:
        return None
    return (vec, mat) if not isinstance(out.shape[1], int) else None


@register_pass("vecmat-as-mv", Requires(backends=("llvm-cpu",)))
class VecmatAsMvPass(GraphPass):
    def run(self, program):
        graph = program.graph_module.graph
        changed = False
        for node in list(graph.nodes):
            found = _vecmat(node)
            if found is None:
                continue
            vec, mat = found
            mm = node.args[0]
            with graph.inserting_before(node):
                t = graph.call_function(_aten.permute.default, (mat, [1, 0]))
                col = graph.call_function(_aten.unsqueeze.default, (vec, 1))
                prod = graph.call_function(_aten.mm.default, (t, col))
                col_out = graph.call_function(_aten.squeeze.dim, (prod, 1))
            _packed.replace(graph, node, col_out, program.graph_signature.output_specs)
            if not mm.users:
                row = mm.args[0]
                graph.erase_node(mm)
                if not row.users:
                    graph.erase_node(row)
            self.stats.rewrite()
            changed = True
        if changed:
            fill_fake_values(graph)
            graph.lint()
            program.graph_module.recompile()
        return program
