"""fp8-weights: linear weights quantized to fp8 E4M3, stored 1 byte per weight, decoded where used.

Matches:  with `--dtype fp8`, every floating 2-D parameter of the exported program that feeds a matrix
          product (aten.mm / addmm / bmm / matmul / linear, through views and transposes): the linear
          layers. Embedding tables (aten.embedding) are left alone unless the `fp8_embeddings` option
          is set; parameters matching an `fp8_exclude` pattern (fnmatch, e.g. `lm_head.*`) and written
          buffers are left alone, with the reason in the stats.
Produces: per output channel (row) s = amax|w_row| / 448 (or one s per tensor with `fp8_scales=
          "tensor"`), q = e4m3fn(w / s) rounded to nearest even, stored as an int8 parameter with the
          same bits; s is an f32 buffer `<name>_fp8_scale` ([rows, 1]). Where the weight was used:
              w' = decode(q) * s     in the program's compute dtype (f32 on cpu, f16 on GPUs)
          On cpu (software decode) every weight a matrix product reads is stored packed,
          P[ceil(N/8), K, 8] (P[b, k, j] = q[8b + j, k], rows padded with zeros), and its uses are
          rewritten by passes/_packed.py: `x @ w.T` with one row of x becomes
              (x.view(1, K/4, 4, 1) * decode(P).view(N/8, K/4, 4, 8)).sum(1).sum(1).view(1, N) * s.T
          (+ bias for addmm; K % 4 != 0 keeps one partial sum per channel), which IREE compiles to a
          transpose-free vectorized reduction with 4 independent accumulators (docs/targets.md); an
          embedding of a tied table gathers its rows' codes from P; every other use reads
          decode(P) * s unpacked to [N, K]. Same values: only the summation order of the f32 dot
          product differs from the matmul's.
          decode is chosen from the arch's capabilities (compiler/targets.py `fp8`):
            - "e4m3fnuz" native (gfx942): the FN bits are converted to FNUZ losslessly (same bits,
              value halved: the scale doubles; 0x80, FN's -0, becomes 0x00, FNUZ's +0) and viewed
              as float8_e4m3fnuz, then widened;
            - "e4m3fn" native (gfx950, gfx12xx): viewed as float8_e4m3fn, then widened;
            - none (cpu, SPIR-V, gfx1100, cuda): integer ops only: sign, exponent and mantissa bits
              moved into an f32's places (a bitcast the `bitcast-elementwise` IR pass keeps fusable),
              times s * 2^120 (the exponent bias difference, folded into the row's scale; weights
              beyond 1e5 in magnitude would overflow it and are left unquantized).
Safe because: every decode is exact for every finite E4M3 code (tests check all 256; a subnormal code
          is an f32 subnormal before the multiply, exact unless a device flushes denormals, where
          it is off by less than 2^-15 of its row's largest weight), so the program
          computes with exactly the dequantized weights decode(q) * s; the quantizer clamps to
          +-448 and never produces a NaN code. The math after the decode is the compute dtype's.
Why: fp8 as PyTorch writes it compiles nowhere in IREE 3.13: an f8 constant cannot be serialized
          ("unhandled float element bit width 8"), gfx942 rejects FN and gfx950/gfx1100 reject FNUZ
          ("'arith.extf' op F8E5M2 and F8E4M3FN types are not supported on gfx942"), SPIR-V rejects
          f8 conversion, CUDA fails in LLVM translation. External int8 parameters with the decode
          in the graph compile everywhere; on cpu IREE fuses the decode into the matmul, so a
          decode step reads 1 byte per weight.
"""

from __future__ import annotations

import fnmatch

import torch

from llmc.passes import _packed
from llmc.passes._base import GraphPass, Requires, once_per_tensor, register_pass, written_in_place

_aten = torch.ops.aten
FN_MAX = 448.0
SCALE_SUFFIX = "_fp8_scale"  # the scale of weight W is the buffer W + SCALE_SUFFIX

def quantize(w: torch.Tensor, per_channel: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 bits of E4M3FN codes, f32 scale [rows, 1] or [1, 1]) with w ~= decode(bits) * scale.

    Works through the rows in blocks of about 2^24 elements, so the f32 temporaries stay near 64 MB
    whatever the weight (an 8B model's output head is 525M elements: done whole, its f32 copies took
    8 GB at once). The result is the same as in one piece: every step is per element or per row."""
    w = w.detach()
    w2 = w.reshape(w.shape[0], -1) if w.dim() > 1 else w.reshape(1, -1)
    step = max(1, (1 << 24) // max(1, w2.shape[1]))
    blocks = range(0, w2.shape[0], step)
    amax = torch.cat([w2[i:i + step].float().abs().amax(dim=1, keepdim=True) for i in blocks])
    if not per_channel:
        amax = amax.amax().reshape(1, 1)
    scale = torch.where(amax > 0, amax / FN_MAX, torch.ones_like(amax))
    q = torch.empty(w2.shape, dtype=torch.int8)
    for i in blocks:
        s = scale[i:i + step] if per_channel else scale
        q[i:i + step] = (w2[i:i + step].float() / s).clamp(-FN_MAX, FN_MAX).to(torch.float8_e4m3fn).view(torch.int8)
    return q.reshape(w.shape), scale


def fn_to_fnuz(bits: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same numbers as E4M3FNUZ codes: identical bits (an FNUZ code's value is half the FN code's:
    exponent bias 8 instead of 7), the scale doubled; FN's -0 (0x80, FNUZ's NaN) becomes +0. FN's NaN
    codes (0x7F, 0xFF) would read as +-240: the quantizer never writes them."""
    return torch.where(bits == -128, torch.zeros_like(bits), bits), scale * 2


def decode_sw(bits: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """E4M3FN codes (int8 bits) to their values with integer ops and one multiply (exact).

    The sign goes to an f32's sign bit and the 7 exponent+mantissa bits to the top of its exponent
    and mantissa fields: read as f32 that is the code's value times 2^-120 (exponent bias 127 vs 7),
    subnormal codes included (they become f32 subnormals, which IEEE arithmetic scales exactly).
    (An f16 construction with 16-bit lanes measured slower on cpu: IREE's f16 -> f32 widening.)
    """
    b = bits.to(torch.int32)
    f = (((b & 0x80) << 24) | ((b & 0x7F) << 20)).view(torch.float32)
    return (f * 2.0**120).to(dtype)


def decode_native(bits: torch.Tensor, flavour: str, dtype) -> torch.Tensor:
    f8 = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[flavour]
    return bits.view(f8).to(dtype)


@register_pass("fp8-weights", Requires(dtypes=("fp8",)))
class Fp8WeightsPass(GraphPass):
    def run(self, program):
        from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

        opts = self.ctx.options
        exclude = tuple(opts.get("fp8_exclude") or ())
        per_channel = opts.get("fp8_scales", "channel") != "tensor"
        embeddings = bool(opts.get("fp8_embeddings"))  # tables too (an embedding decodes only the rows it gathers)
        flavour = self.ctx.arch.fp8
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
                    self.stats.decline(name, "embedding table (set fp8_embeddings to quantize it)")
                continue
            if name in mutated or written_in_place(node):
                self.stats.decline(name, "written by the program")
                continue
            pattern = next((p for p in exclude if fnmatch.fnmatchcase(self.ctx.stored_name(name), p)), None)
            if pattern is not None:
                self.stats.decline(name, f"excluded by {pattern!r}")
                continue
            stored, scale, packed = self._quantized(tensor, per_channel, flavour, product)
            if flavour not in ("e4m3fn", "e4m3fnuz") and float(scale.max()) * 2.0**120 > torch.finfo(torch.float32).max:
                self.stats.decline(name, "weights beyond 1e5 in magnitude (the decode's scale x 2^120 overflows f32)")
                continue
            program.state_dict[name] = torch.nn.Parameter(stored, requires_grad=False) if spec.kind == InputKind.PARAMETER else stored
            scale_name = name + SCALE_SUFFIX
            with graph.inserting_before(placeholders[sig.input_specs[first_user_input].arg.name] if first_user_input < len(sig.input_specs) else node):
                scale_node = graph.placeholder(f"b_{scale_name.replace('.', '_')}")
            program.state_dict[scale_name] = scale
            new_specs.append(InputSpec(InputKind.BUFFER, TensorArgument(scale_node.name), scale_name, persistent=True))
            if packed:
                rows = self._decode_packed_at_uses(graph, node, scale_node, tuple(tensor.shape), per_row=scale.shape[0] != 1,
                                                   outputs=sig.output_specs, flavour=flavour, compute=compute)
                _packed.propagate_fake(graph, node, scale_node, node.meta.get("val"), stored, scale)
                decode = "software, packed" + (f", {rows} one-row product(s) as a reduction" if rows else "")
            else:
                self._decode_at_uses(graph, node, scale_node, flavour, compute, stored, scale, sig.output_specs)
                decode = flavour if flavour in ("e4m3fn", "e4m3fnuz") else "software"
            self.stats.rewrite(f"{'per-channel' if per_channel else 'per-tensor'} {decode}")
        if new_specs:
            specs = list(sig.input_specs)
            specs[first_user_input:first_user_input] = new_specs
            sig.input_specs[:] = specs
        graph.lint()
        program.graph_module.recompile()
        return program

    def _quantized(self, tensor, per_channel, flavour, product):
        """(codes as stored, scale, packed?) in the arch's flavour, once per source tensor
        (_base.once_per_tensor), so every entry point of a program stores the same thing under the
        weight's name; only the stored form is kept (an 8B model's codes are 8 GB). On cpu a weight a
        matrix product reads is stored packed, [ceil(N/8), K, 8] (passes/_packed.py); other targets
        and tables only gathered from keep [N, K]."""
        pack = self.ctx.target.caps.backend == "llvm-cpu" and flavour not in ("e4m3fn", "e4m3fnuz") and product

        def make(t):
            bits, scale = quantize(t, per_channel)
            if flavour == "e4m3fnuz":
                bits, scale = fn_to_fnuz(bits, scale)
            return self.ctx.keep(t, _packed.pack(bits) if pack else bits), scale, pack

        return once_per_tensor(self.__dict__.setdefault("_done", {}), tensor, make)

    @staticmethod
    def _decode_packed_at_uses(graph, node, scale_node, shape, per_row: bool, outputs, flavour, compute) -> int:
        """Uses of a packed weight (passes/_packed.py): decode(P) * s with s * 2^120 applied after a
        one-row product's sum; an embedding decodes only its gathered rows, times their scales."""
        with graph.inserting_before(next(n_ for n_ in graph.nodes if n_.op != "placeholder")):
            scale = graph.call_function(_aten.mul.Scalar, (scale_node, 2.0**120))

        def rows_dec(g, codes, ids):
            return _emit_decode(g, codes, g.call_function(_aten.embedding.default, (scale_node, ids)), flavour, compute)

        return _packed.rewrite_uses(graph, node, shape, _emit_decode_bits, outputs, scale=scale, per_row=per_row,
                                    rows_dec=rows_dec)

    @staticmethod
    def _decode_at_uses(graph, node, scale_node, flavour, compute, bits, scale, outputs) -> None:
        """Matrix products read the whole decoded weight (decoded once, ahead of every use); an
        embedding gathers its rows' bytes and scales first and decodes only those rows."""
        users = list(node.users)
        fake = node.meta.get("val")
        full = None
        for user in users:
            if user.target in _packed.EMBEDDING and user.args[0] is node:
                with graph.inserting_before(user):
                    rows = graph.call_function(_aten.embedding.default, (node, *user.args[1:]))
                    row_scales = graph.call_function(_aten.embedding.default, (scale_node, *user.args[1:]))
                    value = _emit_decode(graph, rows, row_scales, flavour, compute)
                _packed.drop_metadata_asserts(graph, user)
                _packed.replace(graph, user, value, outputs)
                continue
            if full is None:
                with graph.inserting_before(next(n for n in graph.nodes if n.op != "placeholder")):
                    full = _emit_decode(graph, node, scale_node, flavour, compute)
            user.replace_input_with(node, full)
        if fake is not None:
            _packed.propagate_fake(graph, node, scale_node, fake, bits, scale)


def _emit_decode_bits(graph, bits_node):
    """E4M3FN codes (int8) to value x 2^-120 in f32 with 3 integer ops (see _emit_decode)."""
    call = graph.call_function
    b = call(_aten._to_copy.default, (bits_node,), {"dtype": torch.int32})
    top = call(_aten.__lshift__.Scalar, (b, 24))
    return call(_aten.view.dtype, (call(_aten.bitwise_and.Scalar, (call(_aten.__rshift__.Scalar, (top, 4)), -0x78100000)), torch.float32))


def _emit_decode(graph, bits_node, scale_node, flavour, compute):
    """decode(bits) * scale as graph nodes at the current insertion point (decode_native / decode_sw)."""
    call = graph.call_function
    if flavour in ("e4m3fn", "e4m3fnuz"):
        f8 = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[flavour]
        value = call(_aten._to_copy.default, (call(_aten.view.dtype, (bits_node, f8)),), {"dtype": compute})
        s = call(_aten._to_copy.default, (scale_node,), {"dtype": compute}) if compute != torch.float32 else scale_node
        return call(_aten.mul.Tensor, (value, s))
    # decode_sw's value with 3 integer ops: the code shifted to the top byte of an i32, shifted back
    # arithmetically by 4 (the sign fills bits 27..31, the 7 exponent+mantissa bits land at 20..26)
    # and masked with 0x87F00000; read as f32 that is value x 2^-120, the 2^120 folded into the row's
    # scale. The shift up makes it independent of how the backend widens i8 (sign- or zero-extension:
    # a form that relied on sign extension was right on cpu and wrong on IREE's SPIR-V path).
    f = _emit_decode_bits(graph, bits_node)
    value = call(_aten.mul.Tensor, (f, call(_aten.mul.Scalar, (scale_node, 2.0**120))))
    return value if compute == torch.float32 else call(_aten._to_copy.default, (value,), {"dtype": compute})
