"""The config: its schema (`schema.py`, the data section in `data.py`), how a key is declared and
checked (`keys.py`), and how a file and `--set` overrides are read into it (`file.py`)."""
