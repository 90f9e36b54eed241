"""Training: the loop (`loop.py`), a run's start, state and checkpoints, budget and stopping
rules, validation, logs, and what the updates run through (`speed.py`)."""
