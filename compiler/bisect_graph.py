"""bisect's graph surgery: the ops of an exported program, its prefixes, one op on its own.

The search runs over `graph_ops` in topological order; `prefix_outputs` + `subprogram` cut the
program after its first k ops (every value the rest of the graph uses becomes an output, so every op
in the prefix stays live); `one_op_module` rebuilds the culprit alone, its tensor inputs turned into
arguments with the shapes and dtypes of `node.meta['val']`. `node_origin` and `op_name` say where a
node comes from, for the report (`Culprit`).
"""

from __future__ import annotations

import dataclasses

import torch

from llmc.errors import CompileError


def graph_ops(ep: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The nodes the search runs over: calls producing tensors, in topological order (getitems of
    multi-output ops and symbolic-size helpers ride along with their producers)."""
    import operator

    ops = []
    for n in ep.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) or (
            isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val)
        ):
            ops.append(n)
    return ops


def is_tensor_node(n: torch.fx.Node) -> bool:
    return isinstance(n.meta.get("val"), torch.Tensor)


def prefix_outputs(ep: torch.export.ExportedProgram, ops: list[torch.fx.Node], k: int) -> list[torch.fx.Node]:
    """The values of the first k ops (and their getitems) that anything outside the prefix uses."""
    import operator

    inside = set(ops[:k])
    inside |= {u for n in ops[:k] for u in n.users if u.op == "call_function" and u.target is operator.getitem}
    outs = []
    for n in ep.graph.nodes:
        if n in inside and is_tensor_node(n) and any(u not in inside for u in n.users):
            outs.append(n)
    return outs


def user_output_nodes(program) -> list[str]:
    from torch.export.graph_signature import OutputKind, TensorArgument

    return [
        s.arg.name
        for s in program.graph_signature.output_specs
        if s.kind == OutputKind.USER_OUTPUT and isinstance(s.arg, TensorArgument)
    ]


def _is_assert(n: torch.fx.Node) -> bool:
    return n.op == "call_function" and str(n.target).startswith("aten._assert")


def subprogram(ep: torch.export.ExportedProgram, outputs: list[torch.fx.Node]) -> torch.export.ExportedProgram:
    """`ep` cut so that it returns exactly `outputs` (as a tuple), everything else dead-code-eliminated.

    Parameters, buffers and user inputs stay as they are (so the importer still makes the weights
    external parameters and every attempt takes the same inputs); buffer mutations are dropped.
    """
    from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
    from torch.export.graph_signature import ExportGraphSignature, OutputKind, OutputSpec, TensorArgument
    import torch.utils._pytree as pytree

    g = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for n in ep.graph.nodes:
        if n.op == "output" or _is_assert(n):
            # torch.export's metadata asserts (`_assert_tensor_metadata`, `_assert_scalar`) return
            # nothing, but dead-code elimination keeps them (side effects) and with them every
            # value they check: a prefix would then keep the whole graph.
            continue
        env[n] = g.node_copy(n, lambda a: env[a])
    new_outs = [env[n] for n in outputs]
    g.output(tuple(new_outs))
    g.eliminate_dead_code()
    gm = torch.fx.GraphModule(ep.graph_module, g)
    sig = ExportGraphSignature(
        input_specs=list(ep.graph_signature.input_specs),
        output_specs=[OutputSpec(kind=OutputKind.USER_OUTPUT, arg=TensorArgument(name=n.name), target=None) for n in new_outs],
    )
    out_spec = pytree.tree_flatten(tuple(range(len(new_outs))))[1]
    call = ModuleCallSignature(inputs=[], outputs=[], in_spec=ep.call_spec.in_spec, out_spec=out_spec)
    return torch.export.ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=sig,
        state_dict=ep.state_dict,
        range_constraints=ep.range_constraints,
        module_call_graph=[ModuleCallEntry(fqn="", signature=call)],
        example_inputs=None,
        constants=ep.constants,
        verifiers=[ep.verifier],
    )


def search_prefix(n: int, fails, known_fail_at_n: bool = True) -> int | None:
    """Smallest k in 1..n with fails(k), for `fails` monotone in k (False below, True from k on).

    fails(n) is taken as known (the whole model failed) when `known_fail_at_n`. Returns None when
    fails(n) was not known and turns out False. Calls `fails` about log2(n) times.
    """
    lo, hi = 0, n  # fails(lo) is False (the empty prefix), fails(hi) is True
    if not known_fail_at_n:
        if n == 0 or not fails(n):
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid
    return hi if n > 0 else None


def _concrete(d) -> int:
    if isinstance(d, int):
        return d
    node = getattr(d, "node", None)
    hint = getattr(node, "hint", None)
    if hint is not None:
        return int(hint)
    try:
        return int(node.shape_env.size_hint(node.expr))
    except Exception:
        return 17


def value_spec(v) -> dict:
    return {"shape": [_concrete(d) for d in v.shape], "dtype": str(v.dtype).removeprefix("torch.")}


def tensor_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The culprit's tensor inputs, each once, in first-use order."""
    seen: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda a: seen.append(a) if a not in seen and is_tensor_node(a) else None)
    return seen


def one_op_module(node: torch.fx.Node) -> torch.fx.GraphModule:
    """A module whose forward is just `node`'s op, its tensor inputs as arguments (SymInts as their hint)."""
    g = torch.fx.Graph()
    inputs = tensor_inputs(node)
    env = {}
    for i, a in enumerate(inputs):
        env[a] = g.placeholder(f"arg{i}")

    def sub(a):
        if a in env:
            return env[a]
        val = a.meta.get("val")
        if isinstance(val, torch.SymInt) or isinstance(val, int):
            return _concrete(val)
        raise CompileError(f"bisect: input {a.name} of {node.name} is a {type(val).__name__}; cannot make it a graph input")

    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), sub)
    out = g.call_function(node.target, tuple(args), dict(kwargs))
    g.output(out)
    return torch.fx.GraphModule(torch.nn.Module(), g)


def example_value(spec: dict, gen: torch.Generator) -> torch.Tensor:
    dtype = getattr(torch, spec["dtype"])
    if dtype.is_floating_point:
        return torch.randn(spec["shape"], generator=gen, dtype=torch.float32).to(dtype)
    if dtype.is_complex:
        return torch.randn(spec["shape"], generator=gen, dtype=dtype)
    return torch.zeros(spec["shape"], dtype=dtype)  # index-like inputs: 0 is always in range


# ---------------------------------------------------------------------------------------------
# Where a node comes from


def node_origin(node: torch.fx.Node, strip_prefix: str = "") -> tuple[str, str, str]:
    """(module path, module class, "file:line: code") from the node's export metadata."""
    stack = node.meta.get("nn_module_stack") or {}
    path, mtype = "", ""
    if stack:
        path, mtype = list(stack.values())[-1]
        mtype = mtype if isinstance(mtype, str) else getattr(mtype, "__qualname__", str(mtype))
    if strip_prefix and path.startswith(strip_prefix):
        path = path[len(strip_prefix) :]
    elif strip_prefix and path == strip_prefix.rstrip("."):
        path = ""
    from llmc.compiler.per_layer import source_of

    where, code = source_of(node)
    source = "(no stack trace recorded)" if where is None else where + (f": {code}" if code else "")
    return path or "(top level)", mtype.rsplit(".", 1)[-1] or "?", source


def op_name(node: torch.fx.Node) -> str:
    """`aten.erfinv.default` for an ATen overload, the function's name otherwise."""
    t = node.target
    return str(t) if hasattr(t, "_schema") else getattr(t, "__name__", str(t))


@dataclasses.dataclass
class Culprit:
    node: str
    op: str
    position: int  # 1-based index among the graph's ops
    ops_total: int
    module_path: str
    module_type: str
    source: str  # file:line: code (the innermost frame outside torch)
    inputs: list  # [{"shape": [...], "dtype": "float32"}]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
