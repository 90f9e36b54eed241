"""Inference: `load` -> Translator, the request, the search and its steering, packed layers."""
