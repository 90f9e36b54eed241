"""Training: the loop, its state and validation, the run folder and log, the loss, the
learning-rate schedule, the weight EMA and the torchrun plumbing."""
