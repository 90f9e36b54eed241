"""The network: attention (pure scoring functions, masks, the KV cache), the Transformer,
and the special token ids."""
