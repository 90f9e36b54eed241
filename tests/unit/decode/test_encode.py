"""`Translator.encode`, the one way an input line becomes source ids: stripped, a multilingual
model's tag first, cut to decode.max_input_len less the tag with one warning per line cut. Every
entry point reads its sources through it (translate, evaluate, score, the attention map, the
server); the rule itself is `data.ids`, and no other module segments a line with a tokenizer
but those named in SEGMENTERS."""

from __future__ import annotations

import ast
import asyncio
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.models import random_checkpoint
from helpers.toy import write_lines

import attn_mt
from attn_mt.decode.forced import score_lines
from attn_mt.decode.request import Request
from attn_mt.decode.translator import Translator
from attn_mt.evaluate import evaluate_split
from attn_mt.model.vocab import EOS_ID
from attn_mt.serve.routing import Route
from attn_mt.serve.service import Documents, Limits, Service
from attn_mt.viz import attention_maps

MAX_INPUT = 12  # decode.max_input_len of the translator here
LINE, OTHER = "qb qc qd", "qz qf qg qh"
PACKAGE = Path(attn_mt.__file__).parent
# The modules besides data/ids.py (the ids of a line) that segment text with a tokenizer, and why.
SEGMENTERS = {
    "data/shardwriter.py": "training text as read, neither stripped nor cut (data.max_len drops)",
    "decode/alignment.py": "a line's words one by one, to merge its pieces into words",
    "export/hf_parity.py": "compares the exported tokenizer with ours",
}


@pytest.fixture(scope="module")
def translator(toy_data, tmp_path_factory) -> Translator:
    folder = tmp_path_factory.mktemp("encode")
    checkpoint = random_checkpoint(folder, toy_data)
    return attn_mt.load(
        checkpoint, device="cpu", prepack=False, decode={"max_input_len": MAX_INPUT}
    )


def test_a_line_is_stripped_and_cut_with_one_warning(translator: Translator) -> None:
    long = " ".join(["qb qc qd qf"] * 10)
    [plain] = translator.src_tokenizer.encode([LINE])
    with pytest.warns(UserWarning) as caught:
        ids = translator.encode([f"  {LINE} \t", "", " \t ", long, long], first_line=7)
    assert [str(w.message) for w in caught] == [
        f"line {n}: {len(translator.src_tokenizer.encode([long])[0])} source tokens, "
        f"truncated to {MAX_INPUT} (decode.max_input_len)"
        for n in (10, 11)
    ]
    assert ids[:3] == [plain, [], []]  # blank lines stay blank
    assert ids[3] == ids[4] == translator.src_tokenizer.encode([long])[0][:MAX_INPUT]


def test_the_language_tag_comes_first_and_counts_against_the_limit(
    translator: Translator, monkeypatch: pytest.MonkeyPatch
) -> None:
    long = " ".join(["qb qc qd qf"] * 10)
    [plain, cut] = translator.encode([LINE, long], warn=False)
    tag = 7  # the <2xx> piece a multilingual model's language_prefix gives
    monkeypatch.setattr(translator, "language_prefix", lambda lang: [tag] if lang else [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warn=False: no warning
        tagged = translator.encode([LINE, "", long], "xx", warn=False)
    assert tagged == [[tag, *plain], [], [tag, *cut[: MAX_INPUT - 1]]]


def read_as_other(translator: Translator, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on `Translator.encode` reads every non-blank line as OTHER: an entry point that
    segments its lines any other way shows LINE's pieces or translation. Returns OTHER's ids."""
    encode = Translator.encode

    def other(self: Translator, lines, *args, **kwargs) -> list[list[int]]:
        return encode(self, [OTHER if line.strip() else line for line in lines], *args, **kwargs)

    [ids] = translator.encode([OTHER])
    monkeypatch.setattr(Translator, "encode", other)
    return ids


@pytest.fixture
def reads_other(translator: Translator, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return read_as_other(translator, monkeypatch)


def test_translate_evaluate_and_score_read_through_encode(
    translator: Translator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = translator.translate([OTHER, ""])
    [expected_score] = score_lines(translator, [OTHER], ["qb qc"])
    read_as_other(translator, monkeypatch)
    assert translator.translate([LINE, ""]) == expected
    src, ref = write_lines(tmp_path / "src", [LINE]), write_lines(tmp_path / "ref", ["qb"])
    found = evaluate_split(translator, src=src, ref=ref, out=tmp_path / "hyp.txt")
    assert found.hypotheses.read_text() == expected[0] + "\n"
    [scored] = score_lines(translator, [LINE], ["qb qc"])
    assert scored.tokens == pytest.approx(expected_score.tokens, abs=1e-6)


def test_the_attention_map_reads_through_encode(translator: Translator, reads_other) -> None:
    maps = attention_maps(translator, LINE, "cross")
    assert maps.columns == translator.src_tokenizer.pieces([*reads_other, EOS_ID])


def test_the_server_reads_through_encode(translator: Translator, reads_other) -> None:
    service = Service([Route(translator, [])], Limits(), max_batch_tokens=1000, max_wait_ms=0)
    submitted = []
    submit = service.batcher.submit
    service.batcher.submit = lambda job: submitted.append(job) or submit(job)  # type: ignore
    service.batcher.start()
    try:
        [[found]] = asyncio.run(service.translate(Documents([LINE]), Request()))
        attention = service.attention(LINE, beam=None)
    finally:
        service.batcher.stop()
    assert found.text == translator.translate([OTHER])[0]
    assert submitted[0].sizes == [len(reads_other) + 1]  # the batch budget counts OTHER's
    assert attention["source"] == translator.src_tokenizer.pieces([*reads_other, EOS_ID])


def calls(name_of_call: Callable[[ast.Call], str | None]) -> dict[str, set[str]]:
    """Per module of the package, the calls `name_of_call(call)` names (None: not counted)."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and (name := name_of_call(node)):
                found.setdefault(path.relative_to(PACKAGE).as_posix(), set()).add(name)
    return found


def test_no_module_but_the_ids_rule_segments_lines_with_a_tokenizer() -> None:
    """`x.encode(...)` of one of our tokenizers (a name or attribute ending in `tokenizer` or
    `tok`, a worker's `w["src"]`) appears in data/ids.py and the modules of SEGMENTERS only."""

    def tokenizer_encode(call: ast.Call) -> str | None:
        func = call.func
        if not (isinstance(func, ast.Attribute) and func.attr == "encode"):
            return None
        receiver = ast.unparse(func.value)
        ours = receiver.endswith(("tokenizer", "tok")) or receiver in ("w['src']", "w['tgt']")
        return receiver if ours else None

    assert calls(tokenizer_encode).keys() == {"data/ids.py", *SEGMENTERS}


def test_source_ids_are_built_by_translation_and_validation_only() -> None:
    """The one source-ids function, `data.ids.source_ids`, is called by `Translator.encode`
    (every entry point's way in) and by validation (`training_data`), nowhere else."""

    def source_ids(call: ast.Call) -> str | None:
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        return name if name == "source_ids" else None

    assert calls(source_ids).keys() == {"decode/translator.py", "data/corpus.py"}
