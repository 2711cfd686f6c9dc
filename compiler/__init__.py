"""The llmc compile driver: export, import, passes, IREE invocation, artifacts, CLI."""
