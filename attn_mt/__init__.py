"""attn-mt: a small, readable Transformer machine-translation trainer.

import attn_mt
translator = attn_mt.load("runs/multi30k_de_en")
translator.translate(["Ein Hund läuft im Schnee."])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attn_mt.decode.search import Sampling
    from attn_mt.decode.translator import Translation, Translator, load

__all__ = ["Sampling", "Translation", "Translator", "load"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """Import the translation API (and torch) on first use, so `attn-mt --help` stays fast."""
    if name == "Sampling":
        from attn_mt.decode.search import Sampling

        return Sampling
    if name in __all__:
        from attn_mt.decode import translator

        return getattr(translator, name)
    raise AttributeError(f"module 'attn_mt' has no attribute {name!r}")
