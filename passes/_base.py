"""Pass infrastructure: the Pass base class, PassStats, and the name -> class registry.

A pass rewrites one MLIR module in place (torch dialect, as torch-mlir's importer produced it) and
returns PassStats: how many ops it matched, rewrote, and declined (with reasons). Passes do no file
I/O and never call iree-compile (DESIGN.md). `compiler/pipeline.py` orders them per target and dtype;
`llmc-opt --pass=NAME` runs one on a .mlir file for the FileCheck tests in tests/passes/.
"""

from __future__ import annotations

import dataclasses
import logging

log = logging.getLogger("llmc.passes")

REGISTRY: dict[str, type["Pass"]] = {}


@dataclasses.dataclass(frozen=True)
class Requires:
    """Capabilities a pass needs from the target; checked once, by the pipeline builder."""

    backends: tuple[str, ...] = ()  # empty: any backend
    dtypes: tuple[str, ...] = ()  # empty: any dtype

    def why_not(self, backend: str, dtype: str) -> str | None:
        if self.backends and backend not in self.backends:
            return f"needs backend {'/'.join(self.backends)}, target uses {backend}"
        if self.dtypes and dtype not in self.dtypes:
            return f"needs dtype {'/'.join(self.dtypes)}, compiling {dtype}"
        return None


@dataclasses.dataclass
class PassStats:
    name: str
    matched: int = 0
    rewrote: int = 0
    declined: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def decline(self, op_text: str, reason: str) -> None:
        self.matched += 1
        self.declined.append((op_text, reason))
        log.debug("%s: declined %s: %s", self.name, op_text, reason)

    def rewrite(self) -> None:
        self.matched += 1
        self.rewrote += 1

    def as_dict(self) -> dict:
        return {"name": self.name, "matched": self.matched, "rewrote": self.rewrote, "declined": len(self.declined)}


class Pass:
    """Subclasses set `name` through @register_pass and implement run(module) -> PassStats."""

    name: str = ""
    requires: Requires = Requires()

    def __init__(self, **options):
        self.options = options
        self.stats = PassStats(self.name)

    def run(self, module) -> PassStats:  # pragma: no cover - interface
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
