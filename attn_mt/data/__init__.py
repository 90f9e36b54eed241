"""The data path: corpora and text, SentencePiece, token shards, preparation and batches."""
