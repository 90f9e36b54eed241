"""Exports of a trained model (CTranslate2, Hugging Face transformers) with their parity checks,
and the import of pretrained Marian models."""
