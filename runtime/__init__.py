"""llmc runtime: load and run compiled modules (imports iree.runtime only, never the compiler)."""

from llmc.runtime.module import EntryPoint, Module, load

__all__ = ["load", "Module", "EntryPoint"]
