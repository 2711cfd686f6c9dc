"""Pass infrastructure: the pass kinds, their context, PassStats, and the name -> class registry.

Three kinds of pass, one registry (`REGISTRY`, filled by `@register_pass` when `llmc.passes` is
imported, which imports every pass file in this folder):

- `SourcePass` runs on the graph of a user's f32 ExportedProgram (a `torch.fx.GraphModule`) before
  llmc re-exports it in another dtype: what only makes sense while the original dtypes are visible.
- `GraphPass` runs on the exported program (`torch.export.ExportedProgram`) before import and returns
  the program to continue with. It may replace parameters (quantize, re-layout, cast) by writing
  `program.state_dict`. `DecompositionPass` is the common case: it contributes decomposition-table
  entries; the pipeline merges consecutive ones with the base table into ONE retrace of the program.
- `IRPass` runs on the torch-dialect MLIR module (torch-mlir's `ir.Module`) in place. Its context
  carries the parameter store, so a pass can write new weight bytes next to its rewrite.

Every pass gets a `PassContext`: the resolved target (typed capabilities: `ctx.caps`, `ctx.arch`),
the compute dtype, the pass options and the parameters. Passes do no file I/O and never call
iree-compile (docs/passes.md). `compiler/pipeline.py` lists which passes run for a target and dtype;
gating on capabilities happens there, in one place, through each pass's `requires`.
"""

from __future__ import annotations

import dataclasses
import logging

log = logging.getLogger("llmc.passes")

REGISTRY: dict[str, type["Pass"]] = {}


@dataclasses.dataclass(frozen=True)
class Requires:
    """What a pass needs from the target and dtype; checked once, by the pipeline builder.

    Every field left empty means "any". `attention` names the target's attention mode
    ("decompose" / "fused"); `dtypes` the compute dtypes; `fp8` the arch's native fp8 flavours.
    """

    backends: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    attention: str | None = None
    fp8: tuple[str, ...] = ()
    # Any other condition on the context: a function returning why the pass does not apply, or None.
    check: object = None

    def why_not(self, ctx: "PassContext") -> str | None:
        caps, dtype = ctx.caps, ctx.dtype
        if self.backends and caps.backend not in self.backends:
            return f"needs backend {'/'.join(self.backends)}, target {caps.name} uses {caps.backend}"
        if self.dtypes and dtype not in self.dtypes:
            return f"needs dtype {'/'.join(self.dtypes)}, compiling {dtype}"
        if self.attention is not None and caps.attention != self.attention:
            return f"for targets whose attention mode is {self.attention!r}; {caps.name} uses {caps.attention!r}"
        if self.fp8 and ctx.arch.fp8 not in self.fp8:
            return f"needs native fp8 {'/'.join(self.fp8)}, arch {ctx.target.arch} has {ctx.arch.fp8}"
        if self.check is not None:
            return self.check(ctx)
        return None


@dataclasses.dataclass
class PassContext:
    """What every pass sees. `target` is a compiler.targets.ResolvedTarget (typed, duck-typed here so
    that passes import nothing of the compiler); `params` is the importer's ParamStore for IR passes
    (None before import: graph passes write `program.state_dict` instead)."""

    target: object
    dtype: str
    options: dict = dataclasses.field(default_factory=dict)
    params: object | None = None
    entry: str = ""  # the entry point (function) whose program a graph pass is running on
    # What the importer strips from the program's parameter names ("llama." of an LLM's entry-point
    # wrapper): a name the user writes (an --fp8-exclude pattern) is the stored, stripped one.
    name_prefix: str = ""
    # Where a pass puts weights it makes from a memory-mapped checkpoint (passes/_scratch.py `Scratch`);
    # None: kept in memory.
    scratch: object | None = None
    # The entry point's user outputs (by position) returned into their own input buffer (a KV cache).
    tied_outputs: frozenset = frozenset()
    # What passes report for the manifest beyond their stats, by key (e.g. "quantization": the
    # per-layer int8 schemes passes/qdq_contractions.py found); written as manifest[key].
    records: dict = dataclasses.field(default_factory=dict)

    def keep(self, source, made):
        """`made`, moved to a scratch file when `source` is memory-mapped (see `scratch`)."""
        return self.scratch.keep(source, made) if self.scratch is not None else made

    def stored_name(self, name: str) -> str:
        return name[len(self.name_prefix):] if self.name_prefix and name.startswith(self.name_prefix) else name

    @property
    def caps(self):
        return self.target.caps

    @property
    def arch(self):
        return self.target.arch_caps


class PassError(Exception):
    """A pass refuses its input: there is no correct rewrite (the `_invalid` test cases).

    The compiler turns it into llmc.errors.PassError (exit 3) naming the pass; llmc-opt prints it as
    one line."""


@dataclasses.dataclass
class PassStats:
    name: str
    kind: str = ""
    matched: int = 0
    rewrote: int = 0
    declined: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    forms: dict[str, int] = dataclasses.field(default_factory=dict)  # rewrites by the form chosen

    def decline(self, what: str, reason: str) -> None:
        self.matched += 1
        self.declined.append((what, reason))
        log.debug("%s: declined %s: %s", self.name, what, reason)

    def rewrite(self, form: str | None = None) -> None:
        self.matched += 1
        self.rewrote += 1
        if form is not None:
            self.forms[form] = self.forms.get(form, 0) + 1

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "matched": self.matched,
            "rewrote": self.rewrote,
            "declined": len(self.declined),
            "decline_reasons": sorted({r for _, r in self.declined}),
            "forms": dict(sorted(self.forms.items())),
        }


class Pass:
    """Base of the three kinds. Subclasses get `name`/`requires` from @register_pass.

    One instance serves one compile: when several entry points are lowered (prefill and decode), the
    same instance runs on each, so its stats add up over the module.
    """

    name: str = ""
    kind: str = ""
    requires: Requires = Requires()

    def __init__(self, ctx: PassContext):
        self.ctx = ctx
        self.stats = PassStats(self.name, self.kind)


class SourcePass(Pass):
    kind = "source"

    def run(self, gm) -> None:  # pragma: no cover - interface
        raise NotImplementedError(f"pass {self.name}: run() is not implemented")


class GraphPass(Pass):
    kind = "graph"

    def applies(self, program) -> bool:
        """Whether the program has anything for this pass; when False the pass does not run (and
        --dump-ir writes no step for it): the int8 passes on a program without Q/DQ ops."""
        return True

    def run(self, program):  # pragma: no cover - interface
        """Returns the ExportedProgram to continue with (the same object or a new one)."""
        raise NotImplementedError(f"pass {self.name}: run() is not implemented")


class DecompositionPass(GraphPass):
    """A graph pass expressed as decomposition-table entries {OpOverload: python function}.

    The functions run while the program is retraced with fake tensors, so they see real shapes and
    dtypes (`q.shape[2] == 1`) and choose a form per call. They return the op's value, or
    `NotImplemented` to leave the call as it is (torch's tracer then records the op unchanged). A
    function may re-call its own op where that call is one it leaves (scatter-reduce re-calls a
    scatter with its dim made non-negative and returns NotImplemented for non-negative dims); a
    re-call it rewrites again recurses. Each rewritten call reports itself with
    `self.rewrote_here(form)`, which counts each source node once (run_decompositions may trace the
    program more than once).
    """

    def rewrote_here(self, form: str | None = None) -> None:
        import torch.fx.traceback as fx_traceback

        source = (fx_traceback.get_current_meta() or {}).get("from_node") or []
        key = (self.ctx.entry, source[-1].name if source else None)
        seen = self.__dict__.setdefault("_seen", set())
        if key[1] is not None and key in seen:
            return
        seen.add(key)
        self.stats.rewrite(form)

    def decompositions(self) -> dict:  # pragma: no cover - interface
        raise NotImplementedError(f"pass {self.name}: decompositions() is not implemented")

    def before_decomposing(self, program) -> None:
        """Edits the exported graph in place before it is decomposed, for what a table entry cannot
        take (run_decompositions refuses some ops before it consults the table). Nothing by default."""


class IRPass(Pass):
    kind = "ir"

    def run(self, module) -> None:  # pragma: no cover - interface
        raise NotImplementedError(f"pass {self.name}: run() is not implemented")


def register_pass(name: str, requires: Requires = Requires()):
    def wrap(cls):
        if name in REGISTRY:
            raise ValueError(f"pass name {name!r} registered twice ({REGISTRY[name].__name__}, {cls.__name__})")
        cls.name = name
        cls.requires = requires
        REGISTRY[name] = cls
        return cls

    return wrap


# ---------------------------------------------------------------------------------------------
# Helpers for IR passes over torch-mlir's Python bindings.


def walk_ops(module, names: set[str] | None = None):
    """Every operation in `module` (nested regions included), in order; only `names` when given.

    The list is collected first, so a pass may erase or replace what it visits."""
    out = []

    def visit(op):
        for region in op.regions:
            for block in region.blocks:
                for child in block.operations:
                    if names is None or child.operation.name in names:
                        out.append(child.operation)
                    visit(child.operation)

    visit(module.operation)
    return out


def written_in_place(node) -> bool:
    """Whether an op writes into the FX `node` (an in-place op in a program not functionalized yet):
    such a buffer is state, not a weight a pass may re-encode."""
    for user in node.users:
        schema = getattr(user.target, "_schema", None)
        if schema is None:
            continue
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is not None and arg.alias_info.is_write:
                given = user.args[i] if i < len(user.args) else user.kwargs.get(arg.name)
                if given is node:
                    return True
    return False


def once_per_tensor(cache: dict, tensor, make):
    """make(tensor), computed once per source tensor (the same storage, offset, shape and strides).

    One pass instance serves every entry point of a compile, and prefill and decode share their
    weights: converting each program's copy separately would store every weight twice in the .irpa
    (the importer's ParamStore deduplicates by storage). The cache keeps the source alive so its
    storage address is not reused while the key stands."""
    t = tensor.detach()
    key = tensor_key(t)
    if key not in cache:
        cache[key] = (t, make(t))
    return cache[key][1]


def has_qdq(program) -> bool:
    """Whether the program has PT2E quantize / dequantize ops (quantized_decomposed namespace)."""
    import torch

    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "quantized_decomposed"
               for n in program.graph.nodes)


def fill_fake_values(graph, mode=None) -> None:
    """Fake-tensor values (node.meta['val']) for every call node a pass added without one, computed
    in graph order from their inputs' values under the program's fake mode: torch-mlir's importer
    types each value from them."""
    import torch

    if mode is None:
        mode = next((v.fake_mode for n in graph.nodes if hasattr(v := n.meta.get("val"), "fake_mode")), None)
    for n in graph.nodes:
        if n.op != "call_function" or "val" in n.meta:
            continue
        args = torch.fx.node.map_arg(n.args, lambda a: a.meta["val"])
        kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: a.meta["val"])
        if mode is not None:
            with mode:
                n.meta["val"] = n.target(*args, **kwargs)
        else:
            n.meta["val"] = n.target(*args, **kwargs)


def tensor_key(t) -> tuple:
    """What makes two tensors the same weight: storage, offset, shape and strides (tied weights,
    and one tensor seen by several entry points, have the same key)."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))


_VTENSOR_PREFIX = "!torch.vtensor<["


def vtensor_dims(type_text: str) -> tuple[list[str], str] | None:
    """!torch.vtensor<[4,?],si32> -> (["4", "?"], "si32"); None for any other type."""
    if not type_text.startswith(_VTENSOR_PREFIX) or "]," not in type_text:
        return None
    shape, elem = type_text[len(_VTENSOR_PREFIX): -1].rsplit("],", 1)
    return ([d.strip() for d in shape.split(",")] if shape else []), elem.strip()


def builtin_tensor(dims: list[str], elem: str) -> str:
    """The builtin tensor type text of a shape and element type: tensor<4x?xf32>, tensor<f32>."""
    return f"tensor<{'x'.join(dims)}x{elem}>" if dims else f"tensor<{elem}>"


def elementwise_function(name: str, dims: list[str], in_elem: str, n_inputs: int, out_elem: str,
                         body: list[str], result: str) -> str:
    """A private func.func @name taking n_inputs tensors of `dims` x in_elem and returning one of
    out_elem, computing `body` (block arguments %x0.. %x{n-1}, then %out) elementwise in one
    linalg.generic and yielding `result`. Dynamic dims are read from the first input. IR passes
    that need exact scalar arithmetic (no torch promotion or folding) call such functions."""
    t_in, t_out = builtin_tensor(dims, in_elem), builtin_tensor(dims, out_elem)
    idx = ", ".join(f"d{i}" for i in range(len(dims)))
    amap = f"affine_map<({idx}) -> ({idx})>"
    iters = ", ".join(['"parallel"'] * len(dims))
    params = ", ".join(f"%a{i}: {t_in}" for i in range(n_inputs))
    lines = [f"func.func private @{name}({params}) -> {t_out} {{"]
    dyn = []
    for i, d in enumerate(dims):
        if d == "?":
            lines.append(f"  %c{i} = arith.constant {i} : index")
            lines.append(f"  %d{i} = tensor.dim %a0, %c{i} : {t_in}")
            dyn.append(f"%d{i}")
    lines.append(f"  %empty = tensor.empty({', '.join(dyn)}) : {t_out}")
    ins = ", ".join(f"%a{i}" for i in range(n_inputs))
    lines.append(
        f"  %res = linalg.generic {{indexing_maps = [{', '.join([amap] * (n_inputs + 1))}], iterator_types = [{iters}]}} "
        f"ins({ins} : {', '.join([t_in] * n_inputs)}) outs(%empty : {t_out}) {{"
    )
    lines.append(f"  ^bb0({', '.join(f'%x{i}: {in_elem}' for i in range(n_inputs))}, %out: {out_elem}):")
    lines += [f"    {line}" for line in body]
    lines.append(f"    linalg.yield {result} : {out_elem}")
    lines.append(f"  }} -> {t_out}")
    lines.append(f"  return %res : {t_out}")
    lines.append("}")
    return "\n".join(lines)

