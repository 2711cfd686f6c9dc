"""torch.export: from a user's model (nn.Module, ExportedProgram or .pt2 file) to the program we lower.

What happens here, in order:
1. the model is resolved (a .pt2 file is loaded; an ExportedProgram is turned back into a module
   only when its dtype has to change, after the pipeline's source passes have run on its graph);
2. `dtype` is applied: floating parameters and buffers are converted (the user's module is never
   modified), and floating f32 inputs are cast inside the exported graph, so callers keep passing f32;
3. `torch.export` runs with the user's dynamic dimensions.
Nothing here rewrites the graph: decompositions and every other rewrite are passes
(compiler/pipeline.py), run by compiler/lower.py.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import re
import traceback
import zipfile
from pathlib import Path

import torch
import torch.nn as nn

from llmc import dtypes
from llmc.errors import ExportError, UsageError


class CastInputs(nn.Module):
    """Casts f32 tensor inputs to the compute dtype, then calls the model.

    This is what lets a bf16 module accept the f32 inputs its users already have (README.md: call
    semantics); the cast is part of the exported graph, so it runs on the device.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype):
        super().__init__()
        self.model = model
        self.dtype = dtype

    def forward(self, *args, **kwargs):
        cast = lambda t: t.to(self.dtype) if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t
        args = torch.utils._pytree.tree_map(cast, args)
        kwargs = torch.utils._pytree.tree_map(cast, kwargs)
        return self.model(*args, **kwargs)


def convert_module(model: nn.Module, dtype: torch.dtype, keep_narrow_linears: bool | tuple = False) -> nn.Module:
    """A copy of `model` whose f32/f16/bf16 parameters and buffers are in `dtype`.

    The user's module is left untouched, and the original-precision tensors are not copied: the
    deepcopy memo maps each of them straight to its converted version (a bf16 copy of an f32 model
    costs half the model, not a full f32 copy on top).

    keep_narrow_linears: nn.Linear weights narrower than `dtype` (True: of any dtype; a tuple: of those
    dtypes only) keep their dtype, and so do nn.Embedding
    tables when the model says it casts the gathered rows itself (`casts_embedding_rows`, llmc's
    Llama); otherwise a table, and a linear weight an embedding shares, is converted (a gathered row
    would carry the narrow dtype into the activations). For weights stored narrower than the math
    (`--dtype fp8`, and bf16 computed in f32): the fp8 pass quantizes each weight from its own bf16
    values and the bf16 pass stores their bits, the same numbers as a widened copy's, so a bf16 8B
    checkpoint is never widened to 32 GB of f32; the export records the mixed-dtype product and the
    dtype-harmony pass casts it.
    """
    keep = set()
    if keep_narrow_linears:
        tables = getattr(model, "casts_embedding_rows", False)
        kinds = (nn.Linear, nn.Embedding) if tables else (nn.Linear,)
        shared = set() if tables else {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        keep = {
            id(m.weight) for m in model.modules()
            if isinstance(m, kinds) and id(m.weight) not in shared and m.weight.is_floating_point()
            and m.weight.element_size() < torch.empty((), dtype=dtype).element_size()
            and (keep_narrow_linears is True or m.weight.dtype in keep_narrow_linears)
        }
    memo = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in keep:
            memo[id(t)] = t  # shared as is (deepcopy would copy a memory-mapped checkpoint into RAM)
            continue
        if t.is_floating_point() and t.dtype in (torch.float32, torch.float16, torch.bfloat16):
            converted = t.detach().to(dtype)
            memo[id(t)] = nn.Parameter(converted, requires_grad=False) if isinstance(t, nn.Parameter) else converted
    return copy.deepcopy(model, memo)


def register_quantized_ops() -> None:
    """Register the `quantized_decomposed` ops (quantize_per_tensor, dequantize_per_channel, ...):
    the Q/DQ form of a PT2E-quantized program. torch.export.load cannot rebuild a graph that uses them
    otherwise, and PyTorch registers them only when torch.ao.quantization.fx._decomposed is imported
    (torchao imports it; a user who only loads a saved .pt2 has not)."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers the ops on import)


def load_pt2(path: Path) -> torch.export.ExportedProgram:
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    if not zipfile.is_zipfile(path):
        raise ExportError(
            f"{path}: not a torch.export archive (.pt2 files are zip archives written by torch.export.save)"
        )
    register_quantized_ops()
    # torch logs its own multi-line warning with a traceback before raising a bare RuntimeError
    # ("We ran into an error when deserializing"): kept off the console, read for the cause.
    torch_log = logging.getLogger("torch.export")
    seen = _Collect()
    handlers, propagate = list(torch_log.handlers), torch_log.propagate
    torch_log.handlers[:] = [seen]
    torch_log.propagate = False
    try:
        ep = torch.export.load(str(path))
    except Exception as e:  # torch raises many types here; all mean "this file is not usable"
        op = re.search(r"failed to resolve torch\.ops\.([\w.]+?)(?:\.default)? to an operator", seen.text)
        if op is not None:
            raise ExportError(
                f"{path}: uses operator {op.group(1)}, which is not registered in this process (a custom op); "
                f"llmc compiles aten ops and PT2E's int8 Q/DQ form ({', '.join(QDQ_OPS)}): export the model "
                "without it, or register the op (import the library defining it) before calling llmc.compile"
            ) from e
        raise ExportError(
            f"{path}: a zip file but not a loadable torch.export archive ({type(e).__name__}); "
            "write .pt2 files with torch.export.save(torch.export.export(model, args), path)"
        ) from e
    finally:
        torch_log.handlers[:] = handlers
        torch_log.propagate = propagate
    check_quantized_ops(ep, str(path))
    return ep


class _Collect(logging.Handler):
    """The text of every record (with its traceback) logged while loading."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.parts: list[str] = []

    def emit(self, record) -> None:
        self.parts.append(record.getMessage())
        if record.exc_info:
            self.parts.append("".join(traceback.format_exception(*record.exc_info)))

    @property
    def text(self) -> str:
        return "\n".join(self.parts)


# PT2E's int8 Q/DQ form: what llmc compiles (integer contractions, or dequantize-then-float math).
QDQ_OPS = ("quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel", "dequantize_per_channel")
# Namespaces of backend-specific fused quantized ops (what Inductor's lowering or eager quantized
# modules put in a graph); their names change between releases (onednn.qconv2d_pointwise became
# qconv_pointwise), and no compiler but that backend's lowers them.
_BACKEND_NAMESPACES = ("onednn", "quantized", "mkldnn", "xnnpack", "fbgemm")
_QDQ_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32)  # 16/32-bit: f32 math (passes/qdq_float.py)


def check_quantized_ops(ep: torch.export.ExportedProgram, where: str) -> None:
    """Refuse (exit 2, one line) a program with a quantized op llmc does not compile: a
    quantized_decomposed op outside the int8 Q/DQ form (per-group, per-token, 4-bit, fp8 or int16
    quantization, dynamic qparams) or a backend-specific fused op. Found here, before any lowering,
    rather than as an IREE failure deep in a dispatch."""
    accepted = ", ".join(QDQ_OPS)
    for node in ep.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        ns, name = node.target.namespace, node.target._opname
        if ns == "quantized_decomposed":
            if name not in QDQ_OPS:
                kind = "per-group (e.g. 4-bit)" if "group" in name else "per-token" if "token" in name else "dynamic" if "choose_qparams" in name else "other"
                raise UsageError(
                    f"{where}: uses quantized_decomposed.{name} ({kind} quantization), which llmc does not compile; llmc "
                    f"accepts PT2E's int8 Q/DQ form ({accepted}: torchao's convert_pt2e with an int8 quantizer such as "
                    "X86InductorQuantizer), or a float model with --dtype int8 (weight-only, per-channel)"
                )
            at = 5 if name.endswith("per_tensor") else 6  # (x, scale(s), zero point(s), [axis,] qmin, qmax, dtype)
            dtype = node.args[at] if len(node.args) > at else node.kwargs.get("dtype")
            if isinstance(dtype, torch.dtype) and dtype not in _QDQ_DTYPES:
                hint = " (for fp8 weights compile the float model with --dtype fp8)" if dtype.is_floating_point else ""
                raise UsageError(
                    f"{where}: quantized_decomposed.{name} to {str(dtype).replace('torch.', '')}; llmc compiles int8, uint8, int16 "
                    f"and int32 quantization{hint}"
                )
        elif ns == "torchao":
            raise UsageError(
                f"{where}: uses torchao.{name} (torchao's quantize_ API, not PT2E), which llmc does not compile; quantize with "
                f"the PT2E flow (prepare_pt2e / convert_pt2e: {accepted}), or compile the float model with --dtype int8"
            )
        elif ns in _BACKEND_NAMESPACES:
            raise UsageError(
                f"{where}: uses {ns}.{name}, a backend-specific fused quantized op (a graph traced after Inductor's "
                f"lowering, or eager quantized modules); llmc compiles the stable Q/DQ form ({accepted}): export the "
                "model right after torchao's convert_pt2e, before torch.compile"
            )


def _dynamic_shapes_of(ep: torch.export.ExportedProgram):
    """Dynamic-shape spec (Dim.DYNAMIC for each symbolic dim) that reproduces `ep`'s user inputs."""
    from torch.export import Dim
    from torch.export.graph_signature import InputKind

    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    specs = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        node = placeholders.get(getattr(spec.arg, "name", None))
        val = node.meta.get("val") if node is not None else None
        if isinstance(val, torch.Tensor):
            dims = {i: Dim.DYNAMIC for i, s in enumerate(val.shape) if not isinstance(s, int)}
            specs.append(dims or None)
        else:
            specs.append(None)
    return specs


def _for_varargs(model: nn.Module, args: tuple, kwargs: dict, dynamic_shapes):
    """Re-key a dynamic-shape spec written for `model.forward` for CastInputs' (*args, **kwargs)."""
    import inspect

    if isinstance(dynamic_shapes, (tuple, list)):
        by_pos, by_name = tuple(dynamic_shapes)[: len(args)], {k: None for k in kwargs}
    else:
        params = list(inspect.signature(model.forward).parameters)
        by_pos = tuple(dynamic_shapes.get(params[i]) if i < len(params) else None for i in range(len(args)))
        by_name = {k: dynamic_shapes.get(k) for k in kwargs}
    return {"args": by_pos, "kwargs": by_name} if kwargs else {"args": by_pos}


def is_dynamic(ep: torch.export.ExportedProgram) -> bool:
    """Whether any value in the program has a symbolic (dynamic) dimension."""
    for n in ep.graph.nodes:
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) and any(not isinstance(d, int) for d in val.shape):
            return True
    return False


@dataclasses.dataclass
class Exported:
    """An exported program, plus the FQN prefix llmc's own wrapper added (stripped from parameter names)."""

    program: torch.export.ExportedProgram
    strip_prefix: str = ""

    def param_name(self, fqn: str) -> str:
        return fqn[len(self.strip_prefix) :] if self.strip_prefix and fqn.startswith(self.strip_prefix) else fqn


def export_model(
    model,
    example_args: tuple = (),
    example_kwargs: dict | None = None,
    *,
    dtype: str = "f32",
    dynamic_shapes=None,
    source_passes=None,
) -> Exported:
    """Export `model` in `dtype`.

    source_passes: called with the graph module of an f32 ExportedProgram before it is re-exported in
    another dtype (compiler/pipeline.run_source): the rewrites that need the original dtypes.
    """
    example_kwargs = example_kwargs or {}
    where = "the model"
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        where = str(path)
        if path.suffix != ".pt2":
            if not path.exists():
                raise UsageError(f"{path}: no such file or directory")
            raise UsageError(
                f"{path}: llmc compiles .pt2 files (torch.export.save) and nn.Modules; "
                "Llama checkpoints (.pt/.pth with params.json, HF folders) come with the Llama loader"
            )
        model = load_pt2(path)

    target_dtype = dtypes.compute_torch_dtype(dtype)
    if target_dtype is None:
        raise UsageError(f"--dtype={dtype}: not supported by the export step (f32, f16, bf16)")

    if isinstance(model, torch.export.ExportedProgram):
        ep = model
        check_quantized_ops(ep, where)
        if target_dtype == torch.float32:
            return Exported(ep)
        # Changing dtype means re-exporting: the ExportedProgram's graph has its dtypes baked in.
        if example_args or example_kwargs:
            args, kwargs = tuple(example_args), dict(example_kwargs)
        else:
            args, kwargs = ep.example_inputs
        if dynamic_shapes is None:
            dynamic_shapes = _dynamic_shapes_of(ep)
            if kwargs:
                dynamic_shapes = None  # positional spec does not fit kwargs; export static
        model = ep.module()
        if source_passes is not None:
            source_passes(model)
    elif isinstance(model, nn.Module):
        args, kwargs = tuple(example_args), dict(example_kwargs)
    else:
        raise UsageError(
            f"llmc.compile: model must be an nn.Module, an ExportedProgram or a path, not {type(model).__name__}"
        )

    model = model.eval() if isinstance(model, nn.Module) and not isinstance(model, torch.fx.GraphModule) else model
    strip_prefix = ""
    if target_dtype != torch.float32:
        strip_prefix = "model."
        if dynamic_shapes is not None:
            dynamic_shapes = _for_varargs(model, args, kwargs, dynamic_shapes)
        model = CastInputs(convert_module(model, target_dtype), target_dtype)
    try:
        with torch.no_grad():
            ep = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ExportError(f"torch.export failed: {type(e).__name__}: {msg}") from e
    check_quantized_ops(ep, where)
    return Exported(ep, strip_prefix)
