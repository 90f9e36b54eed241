"""An inline element wraps the output words aligned to the words it wrapped, whatever the
alignment does at its edges: `Ein <b>kleiner</b> Hund` is `A <b>small</b> dog` when the
alignment is word for word and also when it links "A" (or "dog") to "kleiner", as the argmax
of attention often does, leaving "Ein" (or "Hund") without any output word. The alignments are
given (a model whose alignment is known); the whole page's markup stays as it was."""

from __future__ import annotations

import pytest

from attn_mt.decode.translator import Translation
from attn_mt.documents.markup import Page


def rendered(page: str, output: str, alignment: list[tuple[int, int]]) -> str:
    """`page` rendered with its one block translated as `output`, aligned so."""
    document = Page(page)
    assert len(document.texts) == 1
    return document.render([Translation(output, -1.0, [], alignment)])


@pytest.mark.parametrize(
    "alignment",
    [
        [(0, 0), (1, 1), (2, 2)],  # word for word
        [(1, 0), (1, 1), (2, 2)],  # "A" from "kleiner": "Ein" has no word of its own
        [(0, 0), (1, 1), (1, 2)],  # "dog" from "kleiner": "Hund" has none
        [(1, 0), (1, 1), (1, 2)],  # all from "kleiner"
    ],
    ids=["one-to-one", "article-to-adjective", "noun-to-adjective", "all-to-adjective"],
)
def test_a_tag_wraps_the_words_aligned_to_its_words(alignment: list[tuple[int, int]]) -> None:
    assert rendered("Ein <b>kleiner</b> Hund", "A small dog", alignment) == "A <b>small</b> dog"


def test_a_word_aligned_inside_stays_inside_when_its_neighbour_has_words() -> None:
    """ "Ein" has its own word ("A"): both "a" and "little" come from "kleiner" and stay inside."""
    alignment = [(0, 0), (1, 1), (1, 2), (2, 3)]
    assert rendered("Ein <b>kleiner</b> Hund", "A a little dog", alignment) == (
        "A <b>a little</b> dog"
    )


def test_moved_words_follow_their_source_words() -> None:
    """The adjective after the noun: the tag goes with it; a link and the page around stay."""
    page = '<p>Ein <a href="/k">kleiner</a> Hund.</p>'
    assert rendered(page, "Un chien petit.", [(0, 0), (2, 1), (1, 2)]) == (
        '<p>Un chien <a href="/k">petit.</a></p>'
    )
    two = "Der <i>große</i> Hund und die <b>kleine</b> Katze"
    alignment = [(0, 0), (1, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7)]
    assert rendered(two, "The big big dog and the small cat", alignment) == (
        "The <i>big big</i> dog and the <b>small</b> cat"
    )
