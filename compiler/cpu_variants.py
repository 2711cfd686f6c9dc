"""Several CPUs in one module: IREE executable variants chosen at load by the running CPU's features.

`--arch x86-64-v4,x86-64-v3` (or the preset `portable`) gives the module one local device with one
llvm-cpu executable target per CPU, best first (compiler/targets.py `module_target`), so every
executable is compiled once per CPU. IREE picks, per executable, the first variant whose condition
holds; iree-compile writes no conditions for llvm-cpu variants, so `condition_variants` adds them to
the executable configurations between iree-compile's two halves:

    hal.executable.condition(%device: !hal.device) -> i1 {
      %ok0, %v0 = hal.device.query<%device : !hal.device> key("hal.cpu" :: "avx512f") : i1, i1 = false
      ...
      hal.return (%v0 and %v1 and ...) : i1
    }

one query per feature the variant was compiled with (those IREE's runtime knows), the last variant
unguarded. The queries read IREE's process-wide CPU data, which IREE 3.13 fills only when the first
local executable is created (runtime/src/iree/hal/local/executable_environment.c), while a module
evaluates its conditions before it creates its executables: in a fresh process every query reads
false and the fallback runs. So the artifact carries a probe (`NAME.cpu-probe.vmfb`, one tiny
dispatch compiled for the fallback CPU) that the runtime loads first (runtime/module.py).
"""

from __future__ import annotations

import re

from llmc.errors import CompileError

PROBE_SUFFIX = ".cpu-probe.vmfb"

# One elementwise dispatch: loading it creates a local executable, which fills IREE's CPU data.
PROBE_MLIR = """func.func @probe(%a: tensor<16xf32>, %b: tensor<16xf32>) -> tensor<16xf32> {
  %0 = arith.addf %a, %b : tensor<16xf32>
  return %0 : tensor<16xf32>
}
"""

_VARIANT = re.compile(r"^(\s*)hal\.executable\.variant public @\S+ target\((.*)\) \{\s*$")
_ALIAS = re.compile(r"^(#[\w.$-]+) = (#hal\.executable\.target<.*>)\s*$")
_CPU = re.compile(r'\{cpu = "([^"]+)"')


def condition_variants(configured: str, conditions: list[tuple[str, tuple[str, ...]]]) -> str:
    """`configured` (iree-compile's executable configurations, MLIR text) with a condition on every
    variant whose CPU has features in `conditions` ((cpu, features) best first, from
    targets.cpu_variant_conditions). Raises CompileError if a CPU's variants are not found."""
    wanted = dict(conditions)
    lines = configured.splitlines(keepends=True)
    aliases = {}
    for line in lines:
        m = _ALIAS.match(line)
        if m:
            aliases[m.group(1)] = m.group(2)
    out, seen = [], {cpu: 0 for cpu in wanted}
    for line in lines:
        out.append(line)
        m = _VARIANT.match(line)
        if not m:
            continue
        target = aliases.get(m.group(2), m.group(2))
        cpu = _CPU.search(target)
        if cpu is None or cpu.group(1) not in wanted:
            raise CompileError(f"iree-compile configured a CPU variant llmc did not ask for: {target[:160]}")
        seen[cpu.group(1)] += 1
        features = wanted[cpu.group(1)]
        if features:
            out.append(_condition(m.group(1) + "  ", features))
    missing = [cpu for cpu, n in seen.items() if n == 0]
    if missing and any(seen.values()):
        raise CompileError(f"iree-compile configured no executable variant for --arch CPU(s) {', '.join(missing)}")
    return "".join(out)


def _condition(indent: str, features: tuple[str, ...]) -> str:
    body = [f"{indent}hal.executable.condition(%device: !hal.device) -> i1 {{\n"]
    for i, f in enumerate(features):
        body.append(f'{indent}  %ok{i}, %v{i} = hal.device.query<%device : !hal.device> key("hal.cpu" :: "{f}") : i1, i1 = false\n')
    last = "%v0"
    for i in range(1, len(features)):
        body.append(f"{indent}  %all{i} = arith.andi {last}, %v{i} : i1\n")
        last = f"%all{i}"
    body.append(f"{indent}  hal.return {last} : i1\n{indent}}}\n")
    return "".join(body)
