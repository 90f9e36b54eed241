"""The key/value cache of one attention layer between decoding steps (`KVCache`)."""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of one attention layer kept between decoding steps.

    Self-attention appends each new step's keys and values; cross-attention (`static`) computes
    them once from the encoder output and reuses them for every step.

    Beam search reorders the rows after every step and appends at the next one; done one after
    the other, each copies the whole cache. So a self-attention cache only notes the rows of a
    `select` and takes them in the copy that appends (`extend`): one copy a step.
    """

    def __init__(
        self, static: bool = False, k: torch.Tensor | None = None, v: torch.Tensor | None = None
    ):
        self.static = static
        self._k, self._v = k, v  # (B, H, S, Dh)
        self._rows: torch.Tensor | None = None  # rows still to take from _k, _v (a select)

    @property
    def k(self) -> torch.Tensor | None:
        self._take_rows()
        return self._k

    @property
    def v(self) -> torch.Tensor | None:
        self._take_rows()
        return self._v

    @property
    def length(self) -> int:
        """Number of cached positions."""
        return 0 if self._k is None else self._k.size(2)

    def select(self, index: torch.Tensor) -> None:
        """Keep batch rows `index` (beam reordering, dropping finished sentences)."""
        if self._k is None or self._v is None:  # empty (the two are filled together)
            return
        if self.static:
            self._k, self._v = self._k.index_select(0, index), self._v.index_select(0, index)
        else:  # rows `index` of the rows already noted
            self._rows = index if self._rows is None else self._rows.index_select(0, index)

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this call's keys and values (B, H, T, Dh) after the cached (selected) ones;
        returns all of them, (B, H, S + T, Dh)."""
        if self._k is None or self._v is None:  # the first call (the two are filled together):
            # contiguous, so each step's matrix products take them as they are
            self._k, self._v = (k.contiguous(), v.contiguous()) if self.static else (k, v)
        else:
            self._k, self._v = self._joined(self._k, k), self._joined(self._v, v)
            self._rows = None
        return self._k, self._v

    def _joined(self, cached: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """The selected rows of `cached` followed by `new` along the positions, in one copy."""
        if torch.is_grad_enabled() and (cached.requires_grad or new.requires_grad):
            kept = cached if self._rows is None else cached.index_select(0, self._rows)
            return torch.cat([kept, new], dim=2)  # out= below cannot record a gradient
        rows, heads, length, head_dim = new.size(0), *cached.shape[1:]
        out = new.new_empty(rows, heads, length + new.size(2), head_dim)
        if self._rows is None:
            out[:, :, :length].copy_(cached)
        else:
            torch.index_select(cached, 0, self._rows, out=out[:, :, :length])
        out[:, :, length:].copy_(new)
        return out

    def _take_rows(self) -> None:
        if self._rows is not None:
            assert self._k is not None and self._v is not None  # `select` notes rows when filled
            self._k, self._v = (
                self._k.index_select(0, self._rows),
                self._v.index_select(0, self._rows),
            )
            self._rows = None
