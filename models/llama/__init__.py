"""Llama family: config, export-friendly definition, Meta/HF checkpoint loaders."""
