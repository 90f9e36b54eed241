"""The off-target rate: the share of outputs not identified as the language asked for, among
the model's own languages (py3langid)."""

from __future__ import annotations

from attn_mt.langid import off_target_rate

GERMAN = ["Ein Mann fährt mit dem Fahrrad über eine Brücke.", "Zwei Hunde spielen im Schnee."]
ENGLISH = ["A man rides his bike over a bridge.", "Two dogs are playing in the snow."]
FRENCH = ["Un homme traverse un pont à vélo.", "Deux chiens jouent dans la neige."]
LANGUAGES = ["de", "en", "fr", "cs"]


def test_outputs_in_the_asked_language_are_on_target():
    assert off_target_rate(GERMAN, "de", LANGUAGES) == 0
    assert off_target_rate(ENGLISH, "en", LANGUAGES) == 0
    assert off_target_rate(FRENCH, "fr", LANGUAGES) == 0


def test_the_rate_is_the_share_of_other_languages_blank_lines_left_out():
    assert off_target_rate(ENGLISH, "de", LANGUAGES) == 100
    assert off_target_rate([*GERMAN, *ENGLISH, "", "  "], "de", LANGUAGES) == 50
    assert off_target_rate([GERMAN[0], *FRENCH, ENGLISH[0]], "fr", LANGUAGES) == 50


def test_nothing_to_judge_gives_no_rate():
    assert off_target_rate(["", " "], "de", LANGUAGES) is None
    assert off_target_rate(ENGLISH, "xx", ["yy", "xx"]) is None  # languages py3langid lacks
    portuguese = ["Um homem anda de bicicleta sobre uma ponte."]
    assert off_target_rate(portuguese, "pt_BR", ["pt_BR", "de"]) == 0  # a region: its language
    assert off_target_rate(GERMAN, "pt_BR", ["pt_BR", "de"]) == 100
