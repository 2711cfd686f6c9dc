"""torch-mlir FX import with every weight turned into an IREE external parameter.

`import_exported(...)` runs torch-mlir's FxImporter over an ExportedProgram with `ExternalizeParams`
hooks, then torch-mlir's lowering to the torch backend contract (the torch dialect IREE's
`--iree-input-type=torch` consumes).

Why weights are never inlined (docs/architecture.md): inlining a 125M model costs 3.4 GB
of RSS and a 499 MB vmfb, f8 constants can't be serialized at all (E1), and IREE 3.13 mis-types small
inlined bf16 constants on llvm-cpu and SPIR-V (B1). Instead each parameter, buffer and lifted
constant tensor becomes

    util.global private @"layers.0.weight" = #stream.parameter.named<"model"::"layers.0.weight"> : tensor<..>
    %w = util.global.load @"layers.0.weight" : tensor<..>
    %v = torch_c.from_builtin_tensor %w : tensor<..> -> !torch.vtensor<[..],..>

and the tensor goes into a `ParamStore`, written as an IREE parameter archive (.irpa, scope
`model`). Buffers that the model mutates become `mutable` globals updated with `util.global.store`:
they are state kept on the device, never outputs.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from pathlib import Path

import torch

from llmc import dtypes
from llmc.compiler import ukernels
from llmc.errors import CompileError
from llmc.passes._scratch import _trim_heap, file_mappings, is_file_backed, unmodified_file_pages

PARAM_SCOPE = "model"

# Element types we externalize: every float and integer type of the dtype table, fp8 included (an f8
# constant can't be serialized into a vmfb at all). bool and complex tensors stay inline (rare, tiny).
_EXTERNAL_DTYPES = {e.torch for e in dtypes.ELEMENT_TYPES.values() if e.name not in ("bool", "complex64", "complex128")}


class ParamStore:
    """Named tensors destined for the .irpa, in first-use order, deduplicated by storage."""

    def __init__(self):
        self.tensors: "OrderedDict[str, torch.Tensor]" = OrderedDict()
        self.spilled_bytes = 0  # strided views of a mapped checkpoint copied through a spill file by write_irpa
        self._by_storage: dict[tuple, str] = {}

    def add(self, name: str, t: torch.Tensor) -> tuple[str, bool]:
        """Returns (name actually used, is_new). Aliases of an existing tensor reuse its name."""
        t = t.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if t.untyped_storage().data_ptr() != 0 and key in self._by_storage:
            return self._by_storage[key], False
        base, i = name, 1
        while name in self.tensors:
            name, i = f"{base}_{i}", i + 1
        self.tensors[name] = t
        self._by_storage[key] = name
        return name, True

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def write_irpa(self, path: Path) -> None:
        """Write an IREE parameter archive with IREE's own writer.

        Tensors that are memory-mapped from a file (a safetensors or mmap-loaded .pth checkpoint) are
        handed to IREE as (file, offset, length), so IREE copies them with file reads and this
        process never faults the pages in: for a 16 GB Llama-3-8B checkpoint that is the difference
        between ~14 GB and well under 2 GB of peak RSS. A strided view of such a tensor (a column
        shard of --tensor-parallel: o_proj[:, a:b]) has no single byte range in the file: it is
        copied one tensor at a time into a spill file beside the archive and handed over the same
        way, instead of as a copy in memory held until the archive is written (4.8 GB for the 8B's
        bf16 column shards, twice that in f32). Everything else goes in as a zero-copy view.
        """
        import iree.runtime as rt

        index = rt.ParameterIndex()
        files = _FileBacking()
        spill = _Spill(path)
        try:
            for name, t in self.tensors.items():
                if t.numel() == 0:
                    index.add_splat(name, b"\x00", 0)
                    continue
                nbytes = t.numel() * t.element_size()
                if not t.is_contiguous() and is_file_backed(t):
                    index.add_from_file_handle(name, *spill.add(t))
                    continue
                t = t.contiguous()
                backing = files.find(t.data_ptr(), nbytes)
                if backing is not None:
                    handle, offset = backing
                    index.add_from_file_handle(name, handle, nbytes, offset)
                else:
                    index.add_buffer(name, t.reshape(-1).view(torch.uint8).numpy())
            index.create_archive_file(str(path))
        finally:
            files.close()
            spill.close()
        self.spilled_bytes = spill.nbytes


class _Spill:
    """A temporary file beside the archive for tensors copied out of a mapped checkpoint, one at a time."""

    def __init__(self, archive: Path):
        self._dir = Path(archive).parent
        self._f = None
        self.nbytes = 0
        self._handle = None

    def add(self, t: torch.Tensor):
        """Append t's bytes, contiguous; returns (IREE FileHandle, length, offset) for add_from_file_handle."""
        import os
        import tempfile

        import iree.runtime as rt

        if self._f is None:
            fd, name = tempfile.mkstemp(prefix=".llmc-spill-", dir=self._dir)
            os.unlink(name)  # gone from the folder at once; the open file lives until close()
            self._f = os.fdopen(fd, "w+b")
            self._handle = rt.FileHandle.wrap_fd(self._f.fileno())
        offset = self._f.seek(0, 2)
        made = t.contiguous()
        raw = made.reshape(-1).view(torch.uint8).numpy()
        self._f.write(raw.data)
        self._f.flush()
        self.nbytes += raw.nbytes
        del raw, made
        _trim_heap()
        return self._handle, t.numel() * t.element_size(), offset

    def close(self):
        if self._f is not None:
            self._handle = None
            self._f.close()
            self._f = None


class _FileBacking:
    """Maps an address range to (IREE FileHandle, file offset) when it lies in a read-only file mapping."""

    def __init__(self):
        self._maps = None
        self._handles: dict[str, tuple[int, object]] = {}

    def _load_maps(self):

        # Shared writable mappings are left out: the file can change under the archive writer.
        self._maps = [m for m in file_mappings() if not ("w" in m[4] and "p" not in m[4])]

    def find(self, ptr: int, nbytes: int):
        import os

        import iree.runtime as rt

        if self._maps is None:
            self._load_maps()
        for lo, hi, off, path, perms in self._maps:
            if lo <= ptr and ptr + nbytes <= hi and perms.startswith("r"):
                offset = off + (ptr - lo)
                if not os.path.isfile(path) or not unmodified_file_pages(ptr, nbytes):
                    return None
                if path not in self._handles:
                    fd = os.open(path, os.O_RDONLY)
                    self._handles[path] = (fd, rt.FileHandle.wrap_fd(fd))
                return self._handles[path][1], offset
        return None

    def close(self):
        import os

        for fd, _ in self._handles.values():
            os.close(fd)
        self._handles.clear()


def _builtin_tensor_type(ir, t_shape, dtype: torch.dtype):
    elem = ir.Type.parse(dtypes.of_torch(dtype).builtin)
    return ir.RankedTensorType.get(list(t_shape), elem)


def make_hooks(store: ParamStore, name_of=lambda fqn: fqn):
    """FxImporterHooks that externalize parameters, buffers and lifted constants into `store`."""
    from torch_mlir import ir
    from torch_mlir.extras.fx_importer import FxImporterHooks

    class ExternalizeParams(FxImporterHooks):
        def __init__(self):
            self.name_of = name_of  # reset per program when several are imported into one module
            self.module_op = None
            self.globals: dict[str, str] = {}  # param name -> symbol
            self.mutable: set[str] = set()
            self.n_constants = 0

        def prepare_module(self, module_op):
            self.module_op = module_op
            module_op.context.allow_unregistered_dialects = True

        def _global(self, name: str, t: torch.Tensor, mutable: bool) -> tuple[str, object]:
            tensor_type = _builtin_tensor_type(ir, t.shape, t.dtype)
            name, is_new = store.add(name, t)
            sym = name
            if is_new or name not in self.globals:
                body = self.module_op.regions[0].blocks[0]
                with ir.InsertionPoint.at_block_begin(body), ir.Location.unknown():
                    attrs = {
                        "sym_name": ir.StringAttr.get(sym),
                        "sym_visibility": ir.StringAttr.get("private"),
                        "type": ir.TypeAttr.get(tensor_type),
                        "initial_value": ir.Attribute.parse(
                            f'#stream.parameter.named<"{PARAM_SCOPE}"::"{name}"> : {tensor_type}'
                        ),
                    }
                    if mutable:
                        attrs["is_mutable"] = ir.UnitAttr.get()
                    ir.Operation.create("util.global", attributes=attrs)
                self.globals[name] = sym
                if mutable:
                    self.mutable.add(name)
            return self.globals[name], tensor_type

        def _load(self, gni, name: str, t: torch.Tensor, mutable: bool):
            sym, tensor_type = self._global(name, t, mutable)
            loaded = ir.Operation.create(
                "util.global.load",
                results=[tensor_type],
                attributes={"global": ir.FlatSymbolRefAttr.get(sym)},
            ).result
            return ir.Operation.create(
                "torch_c.from_builtin_tensor",
                results=[gni._cc.tensor_to_vtensor_type(t)],
                operands=[loaded],
            ).result

        def resolve_input(self, gni, value, info):
            if not isinstance(value, torch.Tensor) or value.dtype not in _EXTERNAL_DTYPES:
                return None
            mutable = info.store_producer_node is not None
            return self._load(gni, self.name_of(info.input_spec.target), value, mutable)

        def resolve_literal(self, gni, literal, info):
            if not isinstance(literal, torch.Tensor) or literal.dtype not in _EXTERNAL_DTYPES:
                return None
            if info is not None:
                return self._load(gni, self.name_of(info.input_spec.target), literal, False)
            self.n_constants += 1
            return self._load(gni, f"__constant_{self.n_constants - 1}", literal, False)

        def store_produced_value(self, gni, py_value, produced_ir_value, info):
            name, _ = store.add(self.name_of(info.input_spec.target), py_value)
            if name not in self.mutable:
                raise CompileError(f"buffer {info.input_spec.target} is mutated but was not imported as mutable")
            tensor_type = _builtin_tensor_type(ir, py_value.shape, py_value.dtype)
            builtin = ir.Operation.create(
                "torch_c.to_builtin_tensor", results=[tensor_type], operands=[produced_ir_value]
            ).result
            ir.Operation.create(
                "util.global.store",
                operands=[builtin],
                attributes={"global": ir.FlatSymbolRefAttr.get(self.globals[name])},
            )

    return ExternalizeParams()


def import_exported(exported, func_name: str = "main"):
    """Import one exported program; returns (torch-dialect module, ParamStore, mutated buffer names)."""
    return import_programs([(exported, func_name)])


@dataclasses.dataclass(frozen=True)
class DevicePlan:
    """Where a multi-device module's values live (--tensor-parallel): `n` devices, IREE's
    `@__device_0..n-1`. args/results: {func_name: {index: device}}; any argument or result not named is
    device 0's. param_device(name) -> the device a parameter's global is pinned to, or None to let
    IREE place it by its uses."""

    n: int
    args: dict = dataclasses.field(default_factory=dict)
    results: dict = dataclasses.field(default_factory=dict)
    param_device: object = None


def import_programs(programs, tied_results: dict[str, dict[int, int]] | None = None, devices: DevicePlan | None = None):
    """Import several exported programs as functions of ONE module sharing one ParamStore.

    programs: [(Exported, func_name)]. Tensors shared between the programs (the same storage, as
    when prefill and decode wrap one model) become one parameter. tied_results: {func_name:
    {result_index: argument_index}} marks results that IREE must write into the given argument's
    buffer (`iree.abi.tied`), e.g. an updated KV cache. devices: where a multi-device module's
    arguments, results and parameters live (DevicePlan). Returns (module, ParamStore, mutable names).
    """
    from torch_mlir import fx, ir
    from torch_mlir.compiler_utils import OutputType, TorchMlirCompilerError
    from torch_mlir.dialects import torch as torch_d
    from torch_mlir.extras.fx_importer import FxImporter

    store = ParamStore()
    hooks = make_hooks(store)
    ctx = ir.Context()
    torch_d.register_dialect(ctx)
    importer = FxImporter(context=ctx, hooks=hooks)
    _constant_sizes_static(importer)
    for exported, func_name in programs:
        hooks.name_of = exported.param_name
        _drop_input_mutations(exported.program)
        _sym_float_as_aten(exported.program)
        try:
            importer.import_program(exported.program, func_name=func_name)
        except Exception as e:
            raise CompileError(f"torch-mlir FX import of {func_name} failed: {type(e).__name__}: {e}") from e
    _lower_transfers(importer.module)
    ukernels.lower_calls(importer.module)
    diagnostics: list[str] = []

    def collect(d) -> bool:
        if d.severity == ir.DiagnosticSeverity.ERROR:
            diagnostics.append(f"{d.location}: {d.message}")
        return False  # let MLIR handle (and print) it as it would

    handler = ctx.attach_diagnostic_handler(collect)
    try:
        module = fx._module_lowering(False, False, OutputType.TORCH, importer.module)
    except TorchMlirCompilerError as e:
        # torch-mlir's own message says only "Failure while executing pass pipeline": name the first error.
        first = diagnostics[0] if diagnostics else "no diagnostic was reported"
        raise CompileError(f"torch-mlir lowering to the torch backend contract failed: {first}\n{e}") from e
    finally:
        handler.detach()
    if tied_results:
        _tie_results(module, tied_results)
    if devices is not None and devices.n > 1:
        _place_on_devices(module, devices)
    return module, store, sorted(hooks.mutable)


def _drop_input_mutations(program) -> None:
    """Drop the outputs that write a value back into a user input (in place, on this program).

    llmc's calling convention copies every host input to the device, so an in-place write into an
    input's device buffer is never seen by the caller (eager `x.zero_()` changes x; a compiled module
    leaves the caller's x as it was, with or without this), and a device-resident input that must be
    updated (a KV cache) is a returned result tied to it. Imported as they are, those writes make the
    argument a mutable `!torch.tensor` with `torch.overwrite.tensor.contents`, which IREE 3.13 cannot
    compile for integer tensors ("failed to legalize unresolved target materialization from
    ('tensor<?x?xsi64>') to ('tensor<?x?xi64>')", torch-mlir's e2e ZeroInt64Module and
    IndexPutImpl1DInt*)."""
    from torch.export.graph_signature import OutputKind

    sig = program.graph_signature
    drop = {i for i, spec in enumerate(sig.output_specs) if spec.kind == OutputKind.USER_INPUT_MUTATION}
    if not drop:
        return
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    values = program.graph.output_node().args[0]
    for i in drop:
        target = sig.output_specs[i].target
        written, into = values[i].meta.get("val"), placeholders[target].meta.get("val")
        if written is not None and into is not None and list(written.shape) != list(into.shape):
            # An out= tensor of another shape: eager fills it in place when the sizes agree, and the
            # decomposed program returns the result in its own shape instead (torch.arange(1, 13,
            # out=x) with x [3, 4]: [12]). Refuse rather than return the other shape.
            raise CompileError(
                f"the program writes a {list(written.shape)} result into its input {target!r} of shape {list(into.shape)} "
                "(an out= tensor of another shape), which llmc cannot reproduce; return the result instead of writing it into an input"
            )
    out = program.graph.output_node()
    out.args = (tuple(a for i, a in enumerate(out.args[0]) if i not in drop),)
    sig.output_specs[:] = [spec for i, spec in enumerate(sig.output_specs) if i not in drop]
    program.graph_module.recompile()


def _sym_float_as_aten(program) -> None:
    """`torch.sym_float(n)` (a symbolic size used as a float: interpolation scales) as
    `aten.Float.Scalar(n)`, the op torch-mlir's importer itself emits when it promotes a symbolic int,
    and lowers. The importer has no entry for the Python function: "FIX ME: Unimplemented
    call_function: target=<function sym_float ...>" (torch-mlir's e2e UpSampleNearest1dVecNoneShape).

    The way back, `math.trunc` of a symbolic float (interpolate's recompute_scale_factor), is left
    alone: torch-mlir's `aten.Int.float` has no lowering, and its `aten.Int.Scalar` of a float rounds
    where Python truncates (4 * 1.9 gave 8 rows where eager has 7)."""
    changed = False
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target is torch.sym_float:
            node.target = torch.ops.aten.Float.Scalar
            changed = True
    if changed:
        program.graph_module.recompile()


def concrete_size(d):
    """A size as an int when it is one: export can specialise a dynamic dim (Dim.AUTO, a guard
    such as a Linear's K) while the placeholder's fake tensor still holds a SymInt whose expression
    is that number. Anything else (an int, a truly symbolic SymInt) is returned as it is."""
    if isinstance(d, torch.SymInt) and d.node.expr.is_number:
        return int(d.node.expr)
    return d


def _constant_sizes_static(importer) -> None:
    """Import a SymInt size whose expression is a number as that static size.

    torch-mlir's ContextCache.format_asm_shape writes `?` for every SymInt. For a Linear on a
    [?, ?, 3] input exported with Dim.AUTO (torch-mlir's e2e BatchMlpLayerModule), K then reached
    IREE as `?`, viewed to [?, 3], and IREE 3.13 returned a result 0.85 off (with the Tanh) or failed
    with "OUT_OF_RANGE; attempted to access an address outside of the valid buffer range" (without)."""
    from torch_mlir.extras.fx_importer import ContextCache

    class StaticConstants(ContextCache):
        __slots__ = ()

        def format_asm_shape(self, shape) -> str:
            return super().format_asm_shape([concrete_size(d) for d in shape])

    importer._cc = StaticConstants(importer._c, py_attr_tracker=importer._py_attr_tracker)


TRANSFER_OPERATOR = "torch.llmc.transfer"  # models/llama/tensor_parallel.py's llmc::transfer, as imported


def _lower_transfers(module) -> None:
    """`llmc::transfer(x, d)` (a tensor placed on logical device d, models/llama/tensor_parallel.py)
    as IREE's own op, before torch-mlir's backend pipeline (which refuses any `torch.operator`):

        %b = torch_c.to_builtin_tensor %x
        %t = flow.tensor.transfer %b : tensor<..>{dynamic dims} to #hal.device.promise<@__device_d>
        %y = torch_c.from_builtin_tensor %t

    The flow op is opaque to torch-mlir (its context allows unregistered dialects) and reaches
    iree-compile as it is; the devices `@__device_0..N-1` are declared by its flags
    (`--iree-hal-target-device=local[i]`, compiler/targets.py), as iree-turbine's
    `transfer_to_logical_device` expects them."""
    from torch_mlir import ir

    from llmc.passes._base import builtin_tensor, vtensor_dims, walk_ops

    ops = [op for op in walk_ops(module, {"torch.operator"}) if ir.StringAttr(op.attributes["name"]).value == TRANSFER_OPERATOR]
    if not ops:
        return
    with module.context, ir.Location.unknown():
        module.context.allow_unregistered_dialects = True
        index = ir.IndexType.get()
        for op in ops:
            x, device = op.operands
            d = ir.IntegerAttr(device.owner.attributes["value"]).value
            parsed = vtensor_dims(str(x.type))
            if parsed is None:
                raise CompileError(f"llmc::transfer of a non-tensor value ({x.type})")
            dims, elem = parsed
            elem = elem.lstrip("su") if elem[:2] in ("si", "ui") else elem
            builtin = ir.Type.parse(builtin_tensor(dims, elem))
            with ir.InsertionPoint(op):
                b = ir.Operation.create("torch_c.to_builtin_tensor", results=[builtin], operands=[x]).result
                sizes = []
                for i, size in enumerate(dims):
                    if size == "?":
                        c = ir.Operation.create("arith.constant", results=[index],
                                                attributes={"value": ir.IntegerAttr.get(index, i)}).result
                        sizes.append(ir.Operation.create("tensor.dim", results=[index], operands=[b, c]).result)
                t = ir.Operation.create(
                    "flow.tensor.transfer", results=[builtin], operands=[b, *sizes],
                    attributes={"target": ir.Attribute.parse(f"#hal.device.promise<@__device_{d}>")},
                ).result
                y = ir.Operation.create("torch_c.from_builtin_tensor", results=[op.results[0].type], operands=[t]).result
            op.results[0].replace_all_uses_with(y)
            op.erase()


def _place_on_devices(module, plan: DevicePlan) -> None:
    """`iree.abi.affinity` on every argument and result of every function (DevicePlan.args/results,
    else device 0), and `stream.affinity` on the globals of pinned parameters: IREE then imports each
    input on its device, runs each op on the device of its operands and keeps each weight (and each
    KV-cache shard, a tied argument) on its device only."""
    from torch_mlir import ir

    def promise(d: int):
        return ir.Attribute.parse(f"#hal.device.promise<@__device_{d}>")

    def with_affinity(attrs, count: int, where: dict):
        old = list(ir.ArrayAttr(attrs)) if attrs is not None else [ir.DictAttr.get({})] * count
        out = []
        for i, a in enumerate(old):
            entries = {na.name: na.attr for na in ir.DictAttr(a)}
            entries["iree.abi.affinity"] = promise(where.get(i, 0))
            out.append(ir.DictAttr.get(entries))
        return ir.ArrayAttr.get(out)

    with module.context:
        module.context.allow_unregistered_dialects = True
        for op in module.body.operations:
            op = op.operation
            if op.name == "func.func" and "function_type" in op.attributes:
                name = ir.StringAttr(op.attributes["sym_name"]).value
                ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
                if op.attributes.get("sym_visibility") is not None and ir.StringAttr(op.attributes["sym_visibility"]).value == "private":
                    continue
                for key, count, where in (("arg_attrs", len(ftype.inputs), plan.args.get(name, {})),
                                          ("res_attrs", len(ftype.results), plan.results.get(name, {}))):
                    current = op.attributes[key] if key in op.attributes else None
                    op.attributes[key] = with_affinity(current, count, where)
            elif op.name == "util.global" and plan.param_device is not None:
                d = plan.param_device(ir.StringAttr(op.attributes["sym_name"]).value)
                if d is not None:
                    op.attributes["stream.affinity"] = promise(d)


def _tie_results(module, tied: dict[str, dict[int, int]]) -> None:
    """Set `iree.abi.tied = ARG : index` on the given results of the given functions.

    IREE's torch input conversion reads this attribute: the result is then written into (and
    returned as) the argument's buffer, so an updated KV cache is never copied.
    """
    from torch_mlir import ir

    with module.context:
        funcs = {
            ir.StringAttr(op.attributes["sym_name"]).value: op
            for op in module.body.operations
            if op.operation.name == "func.func"
        }
        for name, mapping in tied.items():
            if name not in funcs:
                raise CompileError(f"cannot tie results of {name}: no such function in the imported module")
            op = funcs[name]
            n_results = len(ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value).results)
            attrs = []
            for r in range(n_results):
                if r in mapping:
                    attrs.append(ir.DictAttr.get({"iree.abi.tied": ir.Attribute.parse(f"{mapping[r]} : index")}))
                else:
                    attrs.append(ir.DictAttr.get({}))
            op.attributes["res_attrs"] = ir.ArrayAttr.get(attrs)
