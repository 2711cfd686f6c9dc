"""llmc: compile PyTorch models ahead of time into IREE modules and check them against eager PyTorch.

    art = llmc.compile(model, example_args, target="cpu", dtype="f32")
    mod = llmc.load(art)
    out = mod(*example_args)

Attributes are resolved lazily so that `import llmc.runtime` (deployment) never pulls in torch.export,
torch-mlir or the IREE compiler.
"""

from llmc.version import __version__

__all__ = ["compile", "load", "Artifact", "LlmcError", "__version__"]


def __getattr__(name):
    if name == "compile":
        from llmc.compiler.api import compile_model

        return compile_model
    if name == "Artifact":
        from llmc.compiler.artifacts import Artifact

        return Artifact
    if name == "load":
        from llmc.runtime import load

        return load
    if name == "LlmcError":
        from llmc.errors import LlmcError

        return LlmcError
    raise AttributeError(f"module 'llmc' has no attribute {name!r}")
