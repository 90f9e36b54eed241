"""attn-mt: a small, readable Transformer machine-translation trainer.

import attn_mt
translator = attn_mt.load("runs/multi30k_de_en")
translator.translate(["Ein Hund läuft im Schnee."])
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

# Large CPU tensors on transparent huge pages: without it every fresh activation or logits
# buffer is page-faulted in 4 KiB at a time, which made a bf16->fp32 copy of the (N, V) logits
# 6x slower than the copy itself. torch reads this variable at its first large allocation.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

if TYPE_CHECKING:
    from attn_mt.search import Sampling
    from attn_mt.translator import Translation, Translator, load

__all__ = ["Sampling", "Translation", "Translator", "load"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """Import the translation API (and torch) on first use, so `attn-mt --help` stays fast."""
    if name == "Sampling":
        from attn_mt.search import Sampling

        return Sampling
    if name in __all__:
        from attn_mt import translator

        return getattr(translator, name)
    raise AttributeError(f"module 'attn_mt' has no attribute {name!r}")
