"""Weight-only quantization shared by `fp8-weights` and `int8-weights`: one pass body, one codec each.

A codec (`Codec`) says how a weight is coded and read back:

    quantize(w, per_channel) -> (codes: int8, scale: f32 [rows, 1] or [1, 1]),  w ~= decode(codes) * scale
    emit_bits(graph, codes)  -> an f32 node equal to decode(codes) / factor, from integer or convert ops
    factor                   -> the constant emit_bits leaves out, folded into the scale (fp8 2^120, int8 1)
    scale_suffix             -> the scale of weight W is the buffer W + scale_suffix in the .irpa
    option                   -> the pass options read: <option>_exclude, <option>_embeddings, <option>_scales

Everything else is the same for every codec, and lives here (`QuantizedWeightsPass`):

- which parameters are weights: 2-D floating parameters (or buffers) that reach a matrix product
  (mm / addmm / bmm / matmul / linear) through view-like ops; embedding tables only with the
  `<option>_embeddings` option or when the table is tied to a product; never a buffer the program
  writes; never a name matching an `<option>_exclude` pattern (fnmatch on the stored name);
- each source tensor quantized once (`_base.once_per_tensor`: prefill and decode share weights, so
  the .irpa stores each weight once), and made from a memory-mapped checkpoint into a scratch file
  (`ctx.keep`, passes/_scratch.py);
- on llvm-cpu every weight a product reads stored packed [ceil(N/G), K, G] (passes/_packed.py; G = 8,
  or the C kernel's G where it serves: 32 for fp8), one-row products (decode steps) as a reduction
  with 4 partial sums (or the C kernel) scaled after the sum, a tied table's
  embedding gathering its rows' codes from the packed layout, other uses decoding the whole weight;
- elsewhere [N, K] codes decoded ahead of the products (IREE fuses the decode into the matmul), an
  embedding decoding only the rows it gathers.

The decode at a use is `emit_bits(codes) * (scale * factor)` in f32, then cast to the compute dtype
(f16 on GPUs): the scale is never rounded to f16 (a row of small weights would have a subnormal f16
scale), the product w = decode(q) * s has the weight's own magnitude. A subclass may decode natively
instead (fp8 on archs IREE lowers E4M3 for: `native`, `emit_native`).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Callable

import torch

from llmc.passes import _packed
from llmc.passes._base import GraphPass, once_per_tensor, written_in_place

_aten = torch.ops.aten

# Rows are quantized in blocks of about this many elements, so the f32 temporaries stay near 64 MB
# whatever the weight (an 8B model's output head is 525M elements: done whole, its f32 copies took
# 8 GB at once). The result is the same as in one piece: every step is per element or per row.
BLOCK_ELEMENTS = 1 << 24


def quantize_rows(w: torch.Tensor, per_channel: bool, qmax: float, encode: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes, f32 scale [rows, 1] or [1, 1]): s = amax|row| / qmax (1 for an all-zero row),
    codes = encode(clamp(w / s, -qmax, qmax)), computed in f32 from the weight's own dtype."""
    w = w.detach()
    w2 = w.reshape(w.shape[0], -1) if w.dim() > 1 else w.reshape(1, -1)
    step = max(1, BLOCK_ELEMENTS // max(1, w2.shape[1]))
    blocks = range(0, w2.shape[0], step)
    amax = torch.cat([w2[i:i + step].float().abs().amax(dim=1, keepdim=True) for i in blocks])
    if not per_channel:
        amax = amax.amax().reshape(1, 1)
    scale = torch.where(amax > 0, amax / qmax, torch.ones_like(amax))
    q = torch.empty(w2.shape, dtype=torch.int8)
    for i in blocks:
        s = scale[i:i + step] if per_channel else scale
        q[i:i + step] = encode((w2[i:i + step].float() / s).clamp(-qmax, qmax))
    return q.reshape(w.shape), scale


@dataclasses.dataclass(frozen=True)
class Codec:
    """How one weight format is coded (see the module docstring)."""

    dtype: str  # the --dtype that selects it
    option: str  # prefix of the pass options it reads
    scale_suffix: str
    quantize: Callable  # (w, per_channel) -> (codes, scale)
    decode: Callable  # eager: codes -> f32 values (decode(codes) * scale ~= w)
    emit_bits: Callable  # (graph, codes_node) -> f32 node = decode(codes) / factor
    factor: float
    form: str  # how the stats name the decode ("software" for fp8's integer decode, "int8")


# --dtype -> codec, filled by the pass modules (fp8_weights.py, int8_weights.py) when they are imported.
CODECS: dict[str, Codec] = {}


def register_codec(codec: Codec) -> Codec:
    CODECS[codec.dtype] = codec
    return codec


def dequantized(codec: Codec, w: torch.Tensor, per_channel: bool = True) -> torch.Tensor:
    """decode(q) * s for `w` quantized with `codec`, in w's shape and dtype: what the compiled
    program computes with in place of w (the `llmc diff` second reference, tests)."""
    codes, scale = codec.quantize(w, per_channel)
    return (codec.decode(codes) * scale).reshape(w.shape).to(w.dtype)


class QuantizedWeightsPass(GraphPass):
    """The pass body; subclasses set `codec` and may decode natively (`native`, `emit_native`)."""

    codec: Codec

    # Hooks --------------------------------------------------------------------------------------

    def native(self) -> str | None:
        """The arch's native format to decode from ("e4m3fn", ...), or None for emit_bits."""
        return None

    def encode(self, tensor, per_channel: bool, native: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes as stored, scale) of one weight."""
        return self.codec.quantize(tensor, per_channel)

    def decline_scale(self, scale, native: str | None) -> str | None:
        """Why a weight with this scale cannot be decoded (None: it can)."""
        return None

    @staticmethod
    def emit_native(graph, bits_node, scale_node, native: str, compute):  # pragma: no cover - interface
        raise NotImplementedError(f"native decode {native!r} is not implemented")

    # The pass -----------------------------------------------------------------------------------

    def run(self, program):
        from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

        codec = self.codec
        opts = self.ctx.options
        exclude = tuple(opts.get(f"{codec.option}_exclude") or ())
        per_channel = opts.get(f"{codec.option}_scales", "channel") != "tensor"
        embeddings = bool(opts.get(f"{codec.option}_embeddings"))  # tables too (an embedding decodes only the rows it gathers)
        native = self.native()
        compute = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[self.ctx.target.compute_dtype]
        sig = program.graph_signature
        mutated = set(sig.buffers_to_mutate.values())
        graph = program.graph_module.graph
        placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
        new_specs = []
        first_user_input = next((i for i, s in enumerate(sig.input_specs) if s.kind == InputKind.USER_INPUT), len(sig.input_specs))
        for spec in list(sig.input_specs):
            if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER):
                continue
            name = spec.target
            tensor = program.state_dict.get(name)
            if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or tensor.dim() != 2:
                continue
            node = placeholders[spec.arg.name]
            product = _packed.feeds(node, _packed.PRODUCTS)
            embedding = _packed.feeds(node, _packed.EMBEDDING)
            if not product and not (embedding and embeddings):
                if embedding:
                    self.stats.decline(name, f"embedding table (set {codec.option}_embeddings to quantize it)")
                continue
            if name in mutated or written_in_place(node):
                self.stats.decline(name, "written by the program")
                continue
            pattern = next((p for p in exclude if fnmatch.fnmatchcase(self.ctx.stored_name(name), p)), None)
            if pattern is not None:
                self.stats.decline(name, f"excluded by {pattern!r}")
                continue
            stored, scale, packed = self._quantized(tensor, per_channel, native, product)
            reason = self.decline_scale(scale, native)
            if reason is not None:
                self.stats.decline(name, reason)
                continue
            program.state_dict[name] = torch.nn.Parameter(stored, requires_grad=False) if spec.kind == InputKind.PARAMETER else stored
            scale_name = name + codec.scale_suffix
            with graph.inserting_before(placeholders[sig.input_specs[first_user_input].arg.name] if first_user_input < len(sig.input_specs) else node):
                scale_node = graph.placeholder(f"b_{scale_name.replace('.', '_')}")
            program.state_dict[scale_name] = scale
            new_specs.append(InputSpec(InputKind.BUFFER, TensorArgument(scale_node.name), scale_name, persistent=True))
            if packed:
                rows = self._decode_packed_at_uses(graph, node, scale_node, tuple(tensor.shape), per_row=scale.shape[0] != 1,
                                                   outputs=sig.output_specs, compute=compute)
                _packed.propagate_fake(graph, node, scale_node, node.meta.get("val"), stored, scale)
                pairs = self._layout(tensor.shape[1])[1] in _packed.PAIR_LAYOUTS
                decode = f"{codec.form}, packed{' in pairs' if pairs else ''}" + _packed.rows_form(*rows)
            else:
                self._decode_at_uses(graph, node, scale_node, native, compute, stored, scale, sig.output_specs)
                decode = native or codec.form
            self.stats.rewrite(f"{'per-channel' if per_channel else 'per-tensor'} {decode}")
        if new_specs:
            specs = list(sig.input_specs)
            specs[first_user_input:first_user_input] = new_specs
            sig.input_specs[:] = specs
        graph.lint()
        program.graph_module.recompile()
        return program

    def _quantized(self, tensor, per_channel, native, product):
        """(codes as stored, scale, packed?), once per source tensor (_base.once_per_tensor), so every
        entry point of a program stores the same thing under the weight's name; only the stored form
        is kept (an 8B model's codes are 8 GB). On cpu a weight a matrix product reads is stored
        packed, [ceil(N/G), K, G] (passes/_packed.py, G from `_group`); other targets and tables only gathered from
        keep [N, K]."""
        pack = self.ctx.target.caps.backend == "llvm-cpu" and native is None and product

        def make(t):
            bits, scale = self.encode(t, per_channel, native)
            return self.ctx.keep(t, _packed.pack_as(bits, *self._layout(t.shape[1])) if pack else bits), scale, pack

        return once_per_tensor(self.__dict__.setdefault("_done", {}), tensor, make)

    def _decode_packed_at_uses(self, graph, node, scale_node, shape, per_row: bool, outputs, compute) -> int:
        """Uses of a packed weight (passes/_packed.py): emit_bits(P) * s with s * factor applied
        after a one-row product's sum; an embedding decodes only its gathered rows, times their scales."""
        codec = self.codec
        scale = scale_node
        if codec.factor != 1:
            with graph.inserting_before(next(n_ for n_ in graph.nodes if n_.op != "placeholder")):
                scale = graph.call_function(_aten.mul.Scalar, (scale_node, codec.factor))

        def rows_dec(g, codes, ids):
            return self._emit_decode(g, codes, g.call_function(_aten.embedding.default, (scale_node, ids)), None, compute)

        group, kernel = self._layout(shape[1])
        return _packed.rewrite_uses(graph, node, shape, codec.emit_bits, outputs, scale=scale, per_row=per_row,
                                    rows_dec=rows_dec, group=group, kernel=kernel)

    def _layout(self, k: int) -> tuple[int, str | None]:
        """(output channels per packed group, C kernel kind or None) of a weight with K = k (passes/_packed.py
        layout_for: the pair layout where the module's CPUs have the fp8 dot-product loop, else 32 channels
        where the C kernels serve, else 8)."""
        return _packed.layout_for(self.ctx, self.codec.dtype, k)

    def _decode_at_uses(self, graph, node, scale_node, native, compute, bits, scale, outputs) -> None:
        """Matrix products read the whole decoded weight (decoded once, ahead of every use); an
        embedding gathers its rows' codes and scales first and decodes only those rows."""
        users = list(node.users)
        fake = node.meta.get("val")
        full = None
        for user in users:
            if user.target in _packed.EMBEDDING and user.args[0] is node:
                with graph.inserting_before(user):
                    rows = graph.call_function(_aten.embedding.default, (node, *user.args[1:]))
                    row_scales = graph.call_function(_aten.embedding.default, (scale_node, *user.args[1:]))
                    value = self._emit_decode(graph, rows, row_scales, native, compute)
                _packed.drop_metadata_asserts(graph, user)
                _packed.replace(graph, user, value, outputs)
                continue
            if full is None:
                with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")):
                    full = self._emit_decode(graph, node, scale_node, native, compute)
            user.replace_input_with(node, full)
        if fake is not None:
            _packed.propagate_fake(graph, node, scale_node, fake, bits, scale)

    def _emit_decode(self, graph, bits_node, scale_node, native, compute):
        """decode(bits) * scale in the compute dtype, as graph nodes at the current insertion point."""
        if native is not None:
            return self.emit_native(graph, bits_node, scale_node, native, compute)
        call = graph.call_function
        codec = self.codec
        f = codec.emit_bits(graph, bits_node)
        s = scale_node if codec.factor == 1 else call(_aten.mul.Scalar, (scale_node, codec.factor))
        value = call(_aten.mul.Tensor, (f, s))
        return value if compute == torch.float32 else call(_aten._to_copy.default, (value,), {"dtype": compute})
