"""The special token ids every SentencePiece model of attn-mt has: kept apart from the tokenizer,
so the model, the loss and search need no SentencePiece."""

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIAL_PIECES = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}
