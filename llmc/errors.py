"""The one exception hierarchy of llmc, shared by the compiler and the runtime.

Every error carries the process exit code the CLI uses for it (docs/architecture.md): 1 a check failed,
2 bad usage or bad input, 3 compiler or runtime failure. Messages are written to be acted on: what
failed, with which values, and what to do.
"""


class LlmcError(Exception):
    exit_code = 2


class UsageError(LlmcError):
    """A flag, argument or input file is wrong."""


class UnsupportedTargetError(UsageError):
    """The target, arch or dtype is unknown, or no correct lowering exists for the combination."""


class InputError(UsageError):
    """A runtime input does not match the compiled signature."""


class ExportError(UsageError):
    """torch.export (or loading a .pt2) failed for the given model."""


class PassError(LlmcError):
    """One of llmc's rewrite passes failed on the IR it was given."""

    exit_code = 3


class CompileError(LlmcError):
    """iree-compile (or the torch-mlir importer) failed; a reproducer has been written.

    `diagnostics`: the compiler's whole stderr when there is one (the message shows the first lines).
    """

    exit_code = 3

    def __init__(self, message: str, diagnostics: str | None = None):
        super().__init__(message)
        self.diagnostics = diagnostics


class RuntimeLoadError(UsageError):
    """A module can't be loaded here: missing files, a manifest mismatch, CPU features this machine lacks."""


class RuntimeCallError(LlmcError):
    """IREE failed while running a loaded module."""

    exit_code = 3


class CheckFailed(LlmcError):
    """A numeric comparison went over tolerance (llmc diff)."""

    exit_code = 1
