"""The network: attention (pure scoring functions, masks, the KV cache), the Transformer,
the special token ids, and its training objective (the label-smoothed loss)."""
