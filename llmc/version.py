"""llmc's version, importable without the package's lazy API (llmc/__init__.py)."""

__version__ = "0.1.0"
