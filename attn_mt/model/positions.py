"""Positional encodings, chosen by name (`POSITIONS`): the sinusoidal table of Vaswani et al.
(p[i, 2j] = sin(i / 10000^(2j/D)), p[i, 2j+1] = cos(...)) and learned position embeddings.

Shape legend: L positions, D model width.
"""

from __future__ import annotations

import torch
from torch import nn

from attn_mt.errors import UserError


def sinusoidal_table(length: int, d_model: int, offset: int = 0) -> torch.Tensor:
    """P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(i / 10000^(2j/d)); (length, d)."""
    position = torch.arange(offset, offset + length, dtype=torch.float64)[:, None]  # (L, 1)
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d/2,)
    angle = position * inv_freq  # (L, d/2)
    table = torch.empty(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.float()


class SinusoidalPositions(nn.Module):
    """The fixed sinusoidal table; it grows on demand, so no input is too long for it."""

    max_positions: int | None = None  # unbounded
    table: torch.Tensor  # a buffer, not saved: rebuilt from d_model

    def __init__(self, d_model: int, initial_length: int = 512):
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoidal_table(initial_length, d_model), persistent=False)

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        """Rows offset..offset+length-1 of the table; (length, D)."""
        if offset + length > self.table.size(0):
            grown = sinusoidal_table(2 * (offset + length), self.d_model)
            self.table = grown.to(self.table.device)
        return self.table[offset : offset + length]

    def encodings(self, rows: int) -> torch.Tensor:
        """The first `rows` position vectors, as the model adds them; (rows, D)."""
        return self.forward(rows).detach()


class LearnedPositions(nn.Module):
    """A trained embedding per position, up to `max_positions`."""

    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        self.max_positions = max_positions
        self.embedding = nn.Embedding(max_positions, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        """Embeddings of positions offset..offset+length-1; (length, D)."""
        if offset + length > self.max_positions:
            raise UserError(
                f"input of {offset + length} tokens is longer than model.max_positions "
                f"({self.max_positions}) of this learned-position model"
            )
        return self.embedding.weight[offset : offset + length]

    def encodings(self, rows: int) -> torch.Tensor:
        """The first `rows` position vectors (all of them at most); (rows, D)."""
        return self.embedding.weight[:rows].detach()


Positions = SinusoidalPositions | LearnedPositions

# model.positions -> the module class; each is built as kind(d_model, max_positions)
POSITIONS: dict[str, type[Positions]] = {
    "sinusoidal": SinusoidalPositions,
    "learned": LearnedPositions,
}
