"""HTML translated with its markup kept (`documents.markup`): on every page, the tags, comments
and declarations come out as given and in the same order, no text node is left untranslated
(a stand-in translation upper-cases each word), scripts, styles, code and `translate="no"`
stay as they are, entities the page wrote stay entities, and inline tags go around the output
words the alignment links to the words they held.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from attn_mt.decode.translator import Translation
from attn_mt.documents.markup import Page

PAGES = {
    "nested inline tags": '<p>one <a href="/x?a=1&amp;b=2" title="t">two <em>three</em></a> '
    "four</p>\n<ul><li>five <b>six <i>seven</i></b></li><li>eight</li></ul>",
    "entities": "<p>Tom &amp; Jerry &copy; 2024 &lt;3 &#169; caf&eacute;</p>",
    "comments and a doctype": "<!DOCTYPE html><html><head><title>one two</title></head>"
    "<body><!-- a note -->\n<h1>three</h1><p>four <!-- inside --> five</p></body></html>",
    "scripts and styles": '<style>p { color: red }</style><p>one</p><script>var s = "<p>two'
    '</p>";</script><pre>keep <b>this</b></pre><p>run <code>ls -l</code> now</p>',
    "broken markup": "<div>one <b>two <i>three</b> four</i><p>five</div></span>six < seven",
    "not translated": '<p>one <span translate="no">two</span> <span class="x notranslate">'
    "three</span> four</p>",
    "a line break": "<p>one<br>two<br/>three</p>",
}


def upper(text: str, reverse: bool = False) -> Translation:
    """A stand-in translation: each word upper-cased (in reverse order if asked), aligned
    word for word."""
    words = [w.upper() for w in text.split()]
    count = len(words)
    pairs = [(count - 1 - j if reverse else j, j) for j in range(count)]
    return Translation(" ".join(reversed(words) if reverse else words), -1.0, [], pairs)


def translated(page: str, reverse: bool = False) -> str:
    document = Page(page)
    return document.render([upper(text, reverse) for text in document.texts])


class _Markup(HTMLParser):
    """Everything of a page but its text, as given, in order."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=False)
        self.found: list[str] = []
        self.feed(page)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.found.append(self.get_starttag_text())

    def handle_startendtag(self, tag, attrs):
        self.found.append(self.get_starttag_text())

    def handle_endtag(self, tag):
        self.found.append(f"</{tag}>")

    def handle_comment(self, data):
        self.found.append(f"<!--{data}-->")

    def handle_decl(self, decl):
        self.found.append(f"<!{decl}>")


def text_words(page: str) -> list[str]:
    """The words of the page's text nodes outside scripts, styles, pre, code and markup."""
    kept = re.sub(r"(?s)<(script|style|pre|code)\b.*?</\1>", " ", page)
    kept = re.sub(r'(?s)<span (translate="no"|class="x notranslate")>.*?</span>', " ", kept)
    return re.sub(r"<[^>]*>", " ", kept).split()


@pytest.mark.parametrize("page", PAGES.values(), ids=PAGES.keys())
def test_markup_is_kept_and_every_text_node_translated(page: str) -> None:
    out = translated(page)
    assert _Markup(out).found == _Markup(page).found
    left = [w for w in text_words(out) if re.search("[a-z]", re.sub("&[a-z]+;", "", w))]
    assert left == [], "words left in the source language"


def test_scripts_styles_code_and_untranslated_elements_are_as_given() -> None:
    for name in ("scripts and styles", "not translated"):
        out = translated(PAGES[name])
        for kept in re.findall(r"(?s)<(?:script|style|pre|code)\b.*?</\w+>", PAGES[name]):
            assert kept in out
    assert translated(PAGES["not translated"]) == (
        '<p>ONE <span translate="no">two</span> <span class="x notranslate">three</span> FOUR</p>'
    )
    assert "<p>FOUR <!-- inside --> FIVE</p>" in translated(PAGES["comments and a doctype"])


def test_entities_stay_entities() -> None:
    assert translated(PAGES["entities"]) == ("<p>TOM &amp; JERRY &copy; 2024 &lt;3 &copy; CAFÉ</p>")


def test_inline_tags_go_around_their_words() -> None:
    assert translated(PAGES["nested inline tags"]) == (
        '<p>ONE <a href="/x?a=1&amp;b=2" title="t">TWO <em>THREE</em></a> FOUR</p>\n'
        "<ul><li>FIVE <b>SIX <i>SEVEN</i></b></li><li>EIGHT</li></ul>"
    )
    assert translated("<p>one <b>two three</b> four</p>", reverse=True) == (
        "<p>FOUR <b>THREE TWO</b> ONE</p>"
    )
    assert translated("<p>un<b>believ</b>able words</p>") == "<p><b>UNBELIEVABLE</b> WORDS</p>"
    assert translated("<p>one <b>two</b> three</p>\n") == "<p>ONE <b>TWO</b> THREE</p>\n"


def test_tags_keep_their_order_whatever_the_alignment() -> None:
    page = PAGES["nested inline tags"]
    document = Page(page)
    crossed = [Translation(t.upper(), -1.0, [], [(0, 0)] * len(t.split())) for t in document.texts]
    unaligned = [Translation(t.upper(), -1.0, [], []) for t in document.texts]
    for found in (crossed, unaligned):
        assert _Markup(document.render(found)).found == _Markup(page).found


def test_blocks_are_what_a_model_reads() -> None:
    assert Page(PAGES["a line break"]).texts == ["one", "two", "three"]
    assert Page("<p>\n  one\n  <b>two</b>   three\n</p>").texts == ["one two three"]
    assert Page(PAGES["entities"]).texts == ["Tom & Jerry © 2024 <3 © café"]
    assert Page("<p> </p><!-- x -->").texts == []
