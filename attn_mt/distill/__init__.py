"""Sequence-level knowledge distillation: a student trained on its teacher's translations of
the training sources (`attn-mt distill`)."""
