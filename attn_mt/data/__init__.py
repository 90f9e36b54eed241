"""The data path: corpora and text, SentencePiece, token shards, preparation, batches, and
what a training run reads (`corpus.py`)."""
