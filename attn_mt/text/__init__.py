"""Text as people write it: the casing table and lines in capitals or Title Case, spans kept
verbatim (links, addresses, code, emoji) and numbers, the characters normalised before the
model, and one line's way to the model and back (`form.py`). Pure text rules, below `data`."""
