"""attn-mt: a small, readable Transformer machine-translation trainer.

import attn_mt
translator = attn_mt.load("runs/multi30k_de_en")
translator.translate(["Ein Hund läuft im Schnee."])
attn_mt.translate_file("runs/multi30k_de_en", "big.de", "big.en", resume=True)  # as `translate`
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attn_mt.decode.load import load
    from attn_mt.decode.search import Sampling
    from attn_mt.decode.translator import Translation, Translator
    from attn_mt.jobs.translate import translate_file

__all__ = ["Sampling", "Translation", "Translator", "load", "translate_file"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """Import the translation API (and torch) on first use, so `attn-mt --help` stays fast."""
    if name == "Sampling":
        from attn_mt.decode.search import Sampling

        return Sampling
    if name == "load":
        from attn_mt.decode.load import load

        return load
    if name == "translate_file":
        from attn_mt.jobs.translate import translate_file

        return translate_file
    if name in __all__:
        from attn_mt.decode import translator

        return getattr(translator, name)
    raise AttributeError(f"module 'attn_mt' has no attribute {name!r}")
