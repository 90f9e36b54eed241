"""Inference: `load` -> Translator, search, the packed and int8 layers, and export."""
