"""attn-mt: a small, readable Transformer machine-translation trainer.

import attn_mt
translator = attn_mt.load("runs/multi30k_de_en")
translator.translate(["Ein Hund läuft im Schnee."])
"""

from attn_mt.translator import Translation, Translator, load

__all__ = ["Translation", "Translator", "load"]
__version__ = "0.1.0"
