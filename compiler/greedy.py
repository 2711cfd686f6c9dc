"""A decode step that also chooses its greedy token: `<decode>_greedy`, next to the decode entry point.

Greedy generation needs one number from a step, the index of its largest logit, but a decode step's
only result was the whole logits row. On cpu the host side of a step (reading the row back, widening
it, numpy's argmax, and iree.runtime's conversion of every argument and result) took 0.39-0.45 ms of a
small-125m bf16 step of ~8.5-9.7 ms, although the same reads take ~0.01 ms in a loop of their own: a step
streams 200 MB of weights through the caches, so every host instruction after it runs cold
(docs/targets.md "The greedy token in the module"). So the module chooses the token.

`add_greedy(module, source, name)` clones the torch-dialect function `source` (after llmc's IR
passes) as `name`, with two results more, both [1, 1] si64 tensors (the shape of decode's token
argument):
- the token: the index of the first maximum, always an index into the row. Where the function's
  argument 0 is a [1, 1] si64 token (decode's), the twin takes one argument more, `next_token`, a
  [1, 1] si64 buffer of the caller's, and writes the token into it (the result is tied to it), so
  runtime/generate.py alternates two buffers of its own as the steps' token and next_token and never
  copies a token from the host;
- the choice: the same index, or -1 where the value there is not finite; the host reads this one.
No VM integer result: IREE's coarse-fences form of the function (`name$async`) would then wait for the
step inside the call to load it, so no next step could be queued behind this one. With tensors only,
runtime/generate.py queues step n + 1 on step n's fence before it reads step n's choice, and the
host's side of a step (the call, recording the command buffer, the wake-up) overlaps the step before
(docs/targets.md "Steps queued ahead"). The token fed back is a valid index even where the choice is
-1, so a step queued behind a non-finite one reads the embedding table in bounds. The cache results
keep their ties (`iree.abi.tied`): the step updates the caller's cache in place exactly as `source`
does. The choice is a private function (`_helper`) of two reductions IREE vectorizes, ~11 us for
32000 bf16 logits on Zen 4; a one-pass argmax (a select chain) stays scalar there and took 240 us.

Matches: a function whose result `logits_result` is a [1, ..., 1, V] f32, bf16 or f16 tensor
          (compiler/llm.py asks for decode and decode_static on llvm-cpu, one device).
Produces: the token numpy's argmax gives over the row the caller would have read (the function's own
          result, after bf16_outputs' rounding), or -1 where the value there is not finite:
          - m = the maximum (arith.maximumf: NaN when any element is NaN);
          - the least index whose element equals m, or is NaN when m is (arith.minsi);
          - -1 unless -inf < m < +inf.
Safe because: numpy's argmax returns the first maximum and the first NaN when there is one, which is
          the least index equal to m in both cases; a row of -inf gives m = -inf and index 0, and
          runtime/generate.py raised on a non-finite chosen value (NaN, +inf, every logit -inf) before,
          so -1 stops it at the same rows. bf16 and f16 elements are widened to f32 exactly.
"""

from __future__ import annotations

from llmc.errors import CompileError

SUFFIX = "_greedy"
INDEX_DTYPE = "int64"
TOKEN_ROLE, CHOSEN_ROLE = "greedy_token", "greedy_chosen"  # the twin's two results in its signature
NEXT_TOKEN = "next_token"  # the twin's last argument where the token is its first: the buffer its token result is written into
LOGITS_TYPES = ("f32", "bf16", "f16")
_WIDENED = ("bf16", "f16")  # widened to f32 for the comparisons (exact)


def greedy_name(function: str) -> str:
    return function + SUFFIX


def _helper(name: str, dims: list[int], elem: str) -> str:
    """func.func private @name(tensor<dims x elem>) -> (tensor<1x1xi64>, tensor<1x1xi64>): the index of the
    first maximum of the row (the dims before the last are all 1), NaN first; then the same, or -1 when that
    value is not finite.

    Two reductions IREE vectorizes (a select-chain argmax in one pass stays scalar: 240 us for 32000
    bf16 logits on Zen 4): the maximum (`arith.maximumf`, which is NaN when any element is), then the
    least index whose element equals it (`arith.minsi`; NaN matches NaN)."""
    from llmc.passes._base import builtin_tensor

    v = dims[-1]
    t_in = builtin_tensor([str(d) for d in dims], elem)
    outer = list(range(len(dims) - 1))
    widen = [f"      %x = arith.extf %in : {elem} to f32"] if elem in _WIDENED else []
    arg = "%in" if widen else "%x"  # the element as the body reads it: widened to f32 first, or f32 already
    row_t = f"tensor<1x{v}x{elem}>"
    lines = [f"func.func private @{name}(%arg0: {t_in}) -> (tensor<1x1xi64>, tensor<1x1xi64>) {{"]
    if outer:
        lines.append(f"  %row = tensor.collapse_shape %arg0 [[{', '.join(str(i) for i in outer)}], [{len(dims) - 1}]] : {t_in} into {row_t}")
    else:
        lines.append(f"  %row = tensor.expand_shape %arg0 [[0, 1]] output_shape [1, {v}] : {t_in} into {row_t}")
    reduce_maps = "[affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>]"
    lines += [
        "  %ninf = arith.constant 0xFF800000 : f32",
        "  %pinf = arith.constant 0x7F800000 : f32",
        f"  %big = arith.constant {v} : i64",
        "  %none = arith.constant -1 : i64",
        "  %ev = tensor.empty() : tensor<1xf32>",
        "  %ei = tensor.empty() : tensor<1xi64>",
        "  %fv = linalg.fill ins(%ninf : f32) outs(%ev : tensor<1xf32>) -> tensor<1xf32>",
        "  %fi = linalg.fill ins(%big : i64) outs(%ei : tensor<1xi64>) -> tensor<1xi64>",
        f"  %max = linalg.generic {{indexing_maps = {reduce_maps}, iterator_types = [\"parallel\", \"reduction\"]}} "
        f"ins(%row : {row_t}) outs(%fv : tensor<1xf32>) {{",
        f"    ^bb0({arg}: {elem}, %m: f32):",
        *widen,
        "      %nm = arith.maximumf %x, %m : f32",
        "      linalg.yield %nm : f32",
        "  } -> tensor<1xf32>",
        # the first index holding the maximum (NaN: the first NaN); V where none does, which cannot happen
        "  %at = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0)>, "
        f"affine_map<(d0, d1) -> (d0)>], iterator_types = [\"parallel\", \"reduction\"]}} "
        f"ins(%row, %max : {row_t}, tensor<1xf32>) outs(%fi : tensor<1xi64>) {{",
        f"    ^bb0({arg}: {elem}, %m: f32, %i: i64):",
        *widen,
        "      %k = linalg.index 1 : index",
        "      %ki = arith.index_cast %k : index to i64",
        "      %eq = arith.cmpf oeq, %x, %m : f32",
        "      %xnan = arith.cmpf uno, %x, %x : f32",
        "      %mnan = arith.cmpf uno, %m, %m : f32",
        "      %bothnan = arith.andi %xnan, %mnan : i1",
        "      %hit = arith.ori %eq, %bothnan : i1",
        "      %cand = arith.select %hit, %ki, %big : i64",
        "      %ni = arith.minsi %cand, %i : i64",
        "      linalg.yield %ni : i64",
        "  } -> tensor<1xi64>",
        # the index as a [1, 1] token (decode's token argument), -1 unless -inf < maximum < +inf
        "  %et = tensor.empty() : tensor<1x1xi64>",
        "  %t = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0)>, "
        "affine_map<(d0, d1) -> (d0, d1)>], iterator_types = [\"parallel\", \"parallel\"]} "
        "ins(%max, %at : tensor<1xf32>, tensor<1xi64>) outs(%et : tensor<1x1xi64>) {",
        "    ^bb0(%m: f32, %i: i64, %o: i64):",
        "      %above = arith.cmpf ogt, %m, %ninf : f32",
        "      %below = arith.cmpf olt, %m, %pinf : f32",
        "      %finite = arith.andi %above, %below : i1",
        "      %tok = arith.select %finite, %i, %none : i64",
        "      linalg.yield %tok : i64",
        "  } -> tensor<1x1xi64>",
        # the index as the next step's token: always in [0, V) (V - 1 bounds the "none" that cannot happen)
        "  %last = arith.constant " + str(v - 1) + " : i64",
        "  %en = tensor.empty() : tensor<1x1xi64>",
        "  %n = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0)>, affine_map<(d0, d1) -> (d0, d1)>], "
        "iterator_types = [\"parallel\", \"parallel\"]} ins(%at : tensor<1xi64>) outs(%en : tensor<1x1xi64>) {",
        "    ^bb0(%i: i64, %o: i64):",
        "      %c = arith.minsi %i, %last : i64",
        "      linalg.yield %c : i64",
        "  } -> tensor<1x1xi64>",
        "  return %n, %t : tensor<1x1xi64>, tensor<1x1xi64>",
        "}",
    ]
    return "\n".join(lines)


def add_greedy(module, source: str, name: str, logits_result: int = 0) -> bool:
    """Append `name`: a copy of the function `source` of `module` (torch dialect, after the IR passes)
    returning, after its own results, the greedy token of result `logits_result` (a [1, ..., 1, V]
    tensor of f32, bf16 or f16) and the choice (-1 where not finite), each a [1, 1] si64 tensor; True when it
    added the `next_token` argument (argument 0 is a [1, 1] si64 token; pass that on to `signature`). Raises CompileError when
    there is no such function, `name` exists, or the logits are not such a tensor."""
    from torch_mlir import ir

    from llmc.passes._base import builtin_tensor, vtensor_dims

    ctx = module.context
    with ctx, ir.Location.unknown():
        funcs = {ir.StringAttr(op.attributes["sym_name"]).value: op for op in module.body.operations if op.operation.name == "func.func"}
        if source not in funcs:
            raise CompileError(f"greedy entry point {name}: no function {source} in the module")
        if name in funcs:
            raise CompileError(f"greedy entry point {name}: the module already has a function of that name")
        src = funcs[source]
        ftype = ir.FunctionType(ir.TypeAttr(src.attributes["function_type"]).value)
        logits_type = ftype.results[logits_result]
        parsed = vtensor_dims(str(logits_type))
        if parsed is None or parsed[1] not in LOGITS_TYPES or "?" in parsed[0] or not parsed[0] or any(d != "1" for d in parsed[0][:-1]):
            raise CompileError(f"greedy entry point {name}: {source}'s result {logits_result} is {logits_type}, "
                               "not a [1, ..., 1, vocab] f32/bf16/f16 logits row")
        dims, elem = [int(d) for d in parsed[0]], parsed[1]
        helper = f"__llmc_greedy_{'x'.join(str(d) for d in dims)}_{elem}"
        if helper not in funcs:
            parsed_helper = ir.Module.parse(_helper(helper, dims, elem), ctx)  # kept until its function has moved
            module.body.append(parsed_helper.body.operations[0])

        t_index = ir.Type.parse("!torch.vtensor<[1,1],si64>")
        tie_token = bool(ftype.inputs) and str(ftype.inputs[0]) == str(t_index)
        fn = src.operation.clone(ir.InsertionPoint(module.body))
        fn.attributes["sym_name"] = ir.StringAttr.get(name)
        block = fn.regions[0].blocks[0]
        ret = list(block.operations)[-1]
        t_builtin = ir.Type.parse(builtin_tensor(parsed[0], elem))
        with ir.InsertionPoint(ret):
            row = ir.Operation.create("torch_c.to_builtin_tensor", results=[t_builtin], operands=[ret.operands[logits_result]]).result
            i64 = ir.Type.parse("tensor<1x1xi64>")
            call = ir.Operation.create("func.call", results=[i64, i64], operands=[row],
                                       attributes={"callee": ir.FlatSymbolRefAttr.get(helper)})
            token, chosen = (ir.Operation.create("torch_c.from_builtin_tensor", results=[t_index], operands=[r]).result
                             for r in call.results)
            if tie_token:  # a buffer of the caller's, the function's last argument, receives the token
                token = _written_into(block.add_argument(t_index, ir.Location.unknown()), token, t_index)
            ir.Operation.create("func.return", operands=[*ret.operands, token, chosen])
        ret.erase()
        inputs = [*ftype.inputs, *([t_index] if tie_token else [])]
        fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(inputs, [*ftype.results, t_index, t_index]))
        if tie_token and "arg_attrs" in fn.attributes:
            fn.attributes["arg_attrs"] = ir.ArrayAttr.get([*ir.ArrayAttr(fn.attributes["arg_attrs"]), ir.DictAttr.get({})])
        # the token written into a buffer the caller passes (a last argument, where the token argument is
        # decode's, argument 0, a [1, 1] si64 tensor): steps queued behind one another then read and write
        # buffers the caller made, and no step's arguments hold a buffer that an earlier step, not run yet, is
        # still to allocate (IREE refuses to record a dispatch over such a transient buffer: "transient buffer
        # has not been committed"). Not argument 0 itself: the step reads it too, and IREE then writes the
        # update into a copy (copy-on-write), which the tie does not bring back
        if "res_attrs" in fn.attributes or tie_token:
            attrs = list(ir.ArrayAttr(fn.attributes["res_attrs"])) if "res_attrs" in fn.attributes else [ir.DictAttr.get({})] * len(ftype.results)
            token_attr = (ir.DictAttr.get({"iree.abi.tied": ir.Attribute.parse(f"{len(inputs) - 1} : index")}) if tie_token
                          else ir.DictAttr.get({}))
            fn.attributes["res_attrs"] = ir.ArrayAttr.get([*attrs, token_attr, ir.DictAttr.get({})])
    return tie_token


def _written_into(arg, token, t_index):
    """`token` ([1, 1] si64) written over the function argument `arg` of the same type, as an index_put into it
    (the form of the KV cache's row writes). The tie alone (`iree.abi.tied`) only makes IREE return the
    argument's buffer: the value lands there only when the result is an update of the argument in the
    dataflow, which IREE then does in place; a freshly computed tensor would be written elsewhere and the
    caller's buffer left as it was."""
    from torch_mlir import ir

    zeros = [ir.Operation.create("torch.vtensor.literal", results=[ir.Type.parse(f"!torch.vtensor<[{shape}],si64>")],
                                 attributes={"value": ir.Attribute.parse(f"dense<0> : tensor<{shape.replace(',', 'x')}xsi64>")}).result
             for shape in ("1,1", "1")]
    indices = ir.Operation.create("torch.prim.ListConstruct", results=[ir.Type.parse("!torch.list<vtensor>")], operands=zeros).result
    false = ir.Operation.create("torch.constant.bool", results=[ir.Type.parse("!torch.bool")],
                                attributes={"value": ir.BoolAttr.get(False)}).result
    return ir.Operation.create("torch.aten.index_put.hacked_twin", results=[t_index], operands=[arg, indices, token, false]).result


def signature(source_sig: dict, name: str, next_token: bool = False) -> dict:
    """The manifest signature of `name` (add_greedy's copy of a function whose signature is source_sig):
    the same inputs (and `next_token` after them where add_greedy added it: its return value), its outputs
    and then the greedy token and the choice."""
    import copy

    sig = copy.deepcopy(source_sig)
    sig["function"] = name
    if next_token:
        first = (sig.get("inputs") or [{}])[0]
        if not (first.get("kind") == "tensor" and first.get("dtype") == INDEX_DTYPE and first.get("shape") == [1, 1]):
            raise CompileError(f"greedy entry point {name}: next_token added, but {source_sig.get('function')}'s first "
                               f"input is not a [1, 1] {INDEX_DTYPE} token")
        sig["inputs"].append({"path": f"[0][{len(sig['inputs'])}]", "name": NEXT_TOKEN, "kind": "tensor", "dtype": INDEX_DTYPE,
                              "shape": [1, 1]})
    out = sig["outputs"]
    if out.get("type") != "tuple":
        raise CompileError(f"greedy entry point {name}: {source_sig.get('function')} does not return a tuple")
    out["children"] += [{"type": "tensor", "dtype": INDEX_DTYPE, "shape": [1, 1], "role": TOKEN_ROLE},
                        {"type": "tensor", "dtype": INDEX_DTYPE, "shape": [1, 1], "role": CHOSEN_ROLE}]
    return sig


def record(signatures: dict, source: str) -> dict:
    """The manifest's `greedy` record of a decode function's twin (runtime/generate.py GreedySteps): its name and
    the output indices of the token and the choice and the input index of next_token, read from the twin's
    signature (signature above). A record
    with `token_int_output` instead of `chosen_output` is an older twin (a VM integer result) that the runtime
    does not queue steps behind; it takes the logits path for those."""
    name = greedy_name(source)
    roles = [c.get("role") for c in signatures[name]["outputs"]["children"]]
    out = {"function": name, "token_output": roles.index(TOKEN_ROLE), "chosen_output": roles.index(CHOSEN_ROLE)}
    names = [i.get("name") for i in signatures[name]["inputs"]]
    if NEXT_TOKEN in names:
        out["next_token_input"] = names.index(NEXT_TOKEN)
    return out
