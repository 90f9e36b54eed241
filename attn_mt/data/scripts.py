"""The scripts of languages, as the rules of `data.filters` read them: which letters each
language writes with (`LANGUAGE_SCRIPTS`, ~90 languages by Unicode block), which languages write
without spaces between words (`SPACELESS`), and how much a character of each script carries
(`weighted_length`: a Han character about 3 Latin letters, a kana or Hangul one about 2).
"""

from __future__ import annotations

import re

# Characters that carry more than a Latin letter: a Han character about three, a kana or Hangul
# one about two (the length ratio counts them so).
_HAN = re.compile("[\u2e80-\u2fdf\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")
_KANA_HANGUL = re.compile("[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\uac00-\ud7af]")

# Unicode blocks of each script (a block is close to a script and needs no table at run time).
_SCRIPT_BLOCKS = {
    "Latin": "A-Za-z\u00aa\u00ba\u00c0-\u024f\u0250-\u02af\u1d00-\u1dbf\u1e00-\u1eff"
    "\u2c60-\u2c7f\ua720-\ua7ff\uab30-\uab6f\ufb00-\ufb06\uff21-\uff3a\uff41-\uff5a",
    "Cyrillic": "\u0400-\u052f\u1c80-\u1c8f\u2de0-\u2dff\ua640-\ua69f",
    "Greek": "\u0370-\u03ff\u1f00-\u1fff",
    "Armenian": "\u0530-\u058f",
    "Hebrew": "\u0590-\u05ff\ufb1d-\ufb4f",
    "Arabic": "\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff\ufb50-\ufdff\ufe70-\ufeff",
    "Devanagari": "\u0900-\u097f\ua8e0-\ua8ff",
    "Bengali": "\u0980-\u09ff",
    "Gurmukhi": "\u0a00-\u0a7f",
    "Gujarati": "\u0a80-\u0aff",
    "Oriya": "\u0b00-\u0b7f",
    "Tamil": "\u0b80-\u0bff",
    "Telugu": "\u0c00-\u0c7f",
    "Kannada": "\u0c80-\u0cff",
    "Malayalam": "\u0d00-\u0d7f",
    "Sinhala": "\u0d80-\u0dff",
    "Thai": "\u0e00-\u0e7f",
    "Lao": "\u0e80-\u0eff",
    "Tibetan": "\u0f00-\u0fff",
    "Myanmar": "\u1000-\u109f",
    "Georgian": "\u10a0-\u10ff\u2d00-\u2d2f",
    "Hangul": "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af",
    "Ethiopic": "\u1200-\u139f",
    "Khmer": "\u1780-\u17ff",
    "Han": "\u2e80-\u2fdf\u3005\u3007\u3021-\u3029\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
    "\U00020000-\U0003134f",
    "Kana": "\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f",
}
_LATIN = (
    "af az br bs ca cs cy da de en eo es et eu fi fo fr fy ga gd gl hr ht hu id is it jv ku "
    "la lb lt lv mg ms mt nb nl nn no oc pl pt qu ro rw sk sl so sq sv sw tl tr uz vi wa xh yo zu"
)
LANGUAGE_SCRIPTS: dict[str, tuple[str, ...]] = {
    **{lang: ("Latin",) for lang in _LATIN.split()},
    **{
        lang: ("Cyrillic",) for lang in ["be", "bg", "kk", "ky", "mk", "mn", "ru", "tg", "tt", "uk"]
    },
    **{lang: ("Arabic",) for lang in ["ar", "fa", "ps", "sd", "ug", "ur"]},
    **{lang: ("Devanagari",) for lang in ["hi", "mr", "ne", "sa"]},
    "sr": ("Cyrillic", "Latin"),
    "el": ("Greek",),
    "hy": ("Armenian",),
    "he": ("Hebrew",),
    "yi": ("Hebrew",),
    "bn": ("Bengali",),
    "as": ("Bengali",),
    "pa": ("Gurmukhi",),
    "gu": ("Gujarati",),
    "or": ("Oriya",),
    "ta": ("Tamil",),
    "te": ("Telugu",),
    "kn": ("Kannada",),
    "ml": ("Malayalam",),
    "si": ("Sinhala",),
    "th": ("Thai",),
    "lo": ("Lao",),
    "bo": ("Tibetan",),
    "dz": ("Tibetan",),
    "my": ("Myanmar",),
    "ka": ("Georgian",),
    "am": ("Ethiopic",),
    "km": ("Khmer",),
    "ko": ("Hangul", "Han"),
    "zh": ("Han",),
    "ja": ("Han", "Kana"),
}
# Languages written without spaces between words: a line is one long "word".
SPACELESS = frozenset(["zh", "ja", "th", "lo", "km", "my", "bo", "dz"])


def base_language(lang: str) -> str:
    """The language of a code, without its region or script: `pt_BR` -> `pt`."""
    return lang.split("_")[0]


def weighted_length(text: str) -> int:
    """The characters of `text`, a Han character counted 3 times, a kana or Hangul one twice."""
    if text.isascii():
        return len(text)
    return len(text) + 2 * len(_HAN.findall(text)) + len(_KANA_HANGUL.findall(text))


_PATTERNS: dict[tuple[str, ...], re.Pattern[str]] = {}


def not_script_pattern(scripts: tuple[str, ...]) -> re.Pattern[str]:
    """One character of none of `scripts` (removing them leaves the scripts' characters)."""
    if scripts not in _PATTERNS:
        _PATTERNS[scripts] = re.compile("[^" + "".join(_SCRIPT_BLOCKS[s] for s in scripts) + "]")
    return _PATTERNS[scripts]
