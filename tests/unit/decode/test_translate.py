"""`attn-mt translate` (stdin -> stdout) and the Python API it wraps.

One output line per input line, in input order, whatever the input: nothing, blank lines, a
huge line, invalid UTF-8, thousands of lines; n-best blocks; a closed stdout; flushed output.
"""

from __future__ import annotations

import random
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.toy import invoke

import attn_mt
from attn_mt.data.text import read_lines
from attn_mt.documents.paragraphs import ParagraphTranslator
from attn_mt.errors import UserError

ATTN_MT = Path(sys.executable).parent / "attn-mt"
LONG_LINE = " ".join(random.Random(0).choices(["qb", "qc", "qd", "qz"], k=4000))[:10_000]
TRICKY_INPUT = [  # (bytes fed to stdin, the line as the API receives it)
    (b"qb qc qd", "qb qc qd"),
    (b"", ""),
    (b"  \t ", "  \t "),
    (LONG_LINE.encode(), LONG_LINE),
    (b"qz \xff\xfe qd", "qz \ufffd\ufffd qd"),
    (b"qf qg\r", "qf qg"),
    (b"", ""),
    (b"qh qj", "qh qj"),  # the last line, without a newline
]


def translate_command(run: Path, *options: str) -> list[str]:
    return [str(ATTN_MT), "translate", "--model", str(run), "--device", "cpu", *options]


def run_translate(run: Path, stdin: bytes, *options: str) -> subprocess.CompletedProcess:
    """`attn-mt translate` with `stdin` (bytes) as its input; never a traceback."""
    done = subprocess.run(
        translate_command(run, *options), input=stdin, capture_output=True, timeout=300
    )
    assert "Traceback" not in done.stderr.decode(), done.stderr.decode()
    return done


@pytest.fixture(scope="module")
def translator(trained_run: Path) -> attn_mt.Translator:
    return attn_mt.load(trained_run, device="cpu")


@pytest.fixture(scope="module")
def tricky(trained_run: Path) -> subprocess.CompletedProcess:
    """The CLI run once over blank, whitespace-only, huge, CRLF and invalid UTF-8 lines."""
    done = run_translate(trained_run, b"\n".join(raw for raw, _ in TRICKY_INPUT))
    assert done.returncode == 0, done.stderr.decode()
    return done


# ---------------------------------------------------------------------------------------------
# Line count and order


def test_empty_input_gives_empty_output(trained_run: Path, translator) -> None:
    done = run_translate(trained_run, b"")
    assert done.returncode == 0 and done.stdout == b""
    assert translator.translate([]) == []


def test_one_output_line_per_input_line(tricky) -> None:
    lines = tricky.stdout.decode("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == len(TRICKY_INPUT)
    assert [lines[i] for i in (1, 2, 6)] == ["", "", ""]  # blank and whitespace-only lines
    assert all(lines[i] for i in (0, 3, 4, 5, 7))


# The long line is one sentence longer than the model reads: translated in parts cut between
# words (never truncated), the first whose output is cut short named once for the line.
LONG_LINE_WARNING = (
    "line 4, part 1: an output of .* the translation may have stopped early; the line holds a "
    "sentence longer than the model reads .*, translated in parts cut between words"
)


def test_cli_gives_what_the_api_gives(tricky, translator) -> None:
    """The CLI splits a line into sentences by default: as the API's ParagraphTranslator does;
    with --no-split-sentences the long line is still translated in parts, nothing truncated."""
    lines = [line for _, line in TRICKY_INPUT]
    with pytest.warns(UserWarning, match=LONG_LINE_WARNING):
        expected = ParagraphTranslator.splitting(translator).translate(lines)
    assert tricky.stdout.decode("utf-8") == "".join(text + "\n" for text in expected)
    with pytest.warns(UserWarning) as caught:
        plain = translator.translate(lines)  # the Translator alone cuts the long line short
    assert any("line 4:" in str(w.message) and "truncated" in str(w.message) for w in caught)
    assert plain[3] != expected[3] and len(plain[3]) < len(expected[3])
    assert [plain[i] for i in (0, 1, 2, 4, 5, 6, 7)] == [expected[i] for i in (0, 1, 2, 4, 5, 6, 7)]


def test_long_line_and_invalid_utf8_warn_on_stderr(tricky) -> None:
    warnings = tricky.stderr.decode().splitlines()
    prefix = "attn-mt: warning: "
    assert all(w.startswith(prefix) for w in warnings), warnings
    long = [w for w in warnings if w.startswith(f"{prefix}line 4")]
    assert len(long) == 1 and re.match(prefix + LONG_LINE_WARNING, long[0]), warnings
    assert not any("truncated" in w for w in warnings), warnings
    assert any("line 5:" in w and "UTF-8" in w for w in warnings), warnings


def test_thousands_of_shuffled_lines_keep_their_order(trained_run: Path, translator) -> None:
    """Several stdin chunks; the same as the API in order, and as translating one by one."""
    lines = read_lines(translator.config.data.train.src)  # 3000 lines
    random.Random(5).shuffle(lines)
    done = run_translate(trained_run, "".join(line + "\n" for line in lines).encode())
    assert done.returncode == 0
    output = done.stdout.decode("utf-8").splitlines()
    assert output == translator.translate(lines)
    for i in range(0, len(lines), 50):
        assert output[i] == translator.translate([lines[i]])[0]


# ---------------------------------------------------------------------------------------------
# N-best


def test_nbest_prints_n_scored_lines_and_a_blank_line(trained_run: Path, translator) -> None:
    lines = ["qb qc qd", "qz", "qf qg qh qj"]
    done = run_translate(trained_run, "".join(x + "\n" for x in lines).encode(), "--nbest", "3")
    assert done.returncode == 0
    blocks = done.stdout.decode("utf-8").split("\n\n")
    assert blocks[-1] == "" and len(blocks) - 1 == len(lines)
    expected = translator.translate_nbest(lines, beam=3, nbest=3)
    for block, entries in zip(blocks, expected, strict=False):
        rows = [row.split("\t") for row in block.split("\n")]
        assert [text for _, text in rows] == [e.text for e in entries]
        scores = [float(score) for score, _ in rows]
        assert scores == pytest.approx([e.score for e in entries], abs=1e-4)
        assert scores == sorted(scores, reverse=True)
    assert [e[0].text for e in expected] == translator.translate(lines, beam=3)


def test_nbest_larger_than_beam_is_a_user_error(trained_run: Path, translator) -> None:
    with pytest.raises(UserError, match="nbest"):
        translator.translate_nbest(["qb"], beam=2, nbest=3)
    done = run_translate(trained_run, b"qb\n", "--beam", "2", "--nbest", "3")
    assert done.returncode == 2
    assert done.stderr.decode().startswith("attn-mt: error: ")
    assert len(done.stderr.decode().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# Streaming


def test_closed_stdout_ends_quietly(trained_run: Path, translator, tmp_path: Path) -> None:
    """`attn-mt translate < big | head -1`: no traceback, exit 0 (or 141 from a shell)."""
    big = tmp_path / "big.txt"
    big.write_text("qb qc qd\n" * 3000)
    command, pipe = translate_command(trained_run), subprocess.PIPE
    with big.open("rb") as stdin:
        proc = subprocess.Popen(command, stdin=stdin, stdout=pipe, stderr=pipe)
        first = proc.stdout.readline()
        proc.stdout.close()  # what `head -1` does after its line
        stderr = proc.communicate(timeout=300)[1].decode()
    assert first.decode().rstrip("\n") == translator.translate(["qb qc qd"])[0]
    assert "Traceback" not in stderr, stderr
    assert proc.returncode in (0, 141, -13), stderr


def test_output_is_flushed_line_by_line(trained_run: Path, translator) -> None:
    """Each line's translation arrives while stdin is still open (an interactive pipeline)."""
    proc = subprocess.Popen(
        translate_command(trained_run), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        for line in ["qb qc qd", "qz qf"]:
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready, f"no output for {line!r} while stdin stays open"
            assert proc.stdout.readline().decode().rstrip("\n") == translator.translate([line])[0]
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read() == b""
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------------------------------
# --input / --output, --set decode.*, n-best formats


def test_input_output_files_give_what_stdin_gives(trained_run: Path, translator, tmp_path):
    lines = ["qb qc qd", "", "qz qf", "qh qj qk"]
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "out.txt"
    result = invoke("translate", "--model", trained_run, "--input", source, "--output", out,
                    "--device", "cpu")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output == ""
    assert out.read_text().splitlines() == translator.translate(lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]


def test_output_is_whole_or_untouched(trained_run: Path, tmp_path: Path, monkeypatch) -> None:
    """A failure after the first chunk leaves the old --output as it was, no temp file, and
    the first chunk's lines in out.txt.partial for --resume."""
    source, out = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("qb qc\n" * 1500)  # two chunks of input
    out.write_text("old\n")
    calls = []
    real = attn_mt.Translator.translate_nbest

    def failing(self, sources, *args, **kwargs):
        calls.append(len(sources))  # a chunk is what the reader had queued: up to 1,000 lines
        if len(calls) == 2:
            raise RuntimeError("disk on fire")
        return real(self, sources, *args, **kwargs)

    monkeypatch.setattr(attn_mt.Translator, "translate_nbest", failing)
    result = invoke("translate", "--model", trained_run, "--input", source, "--output", out,
                    "--device", "cpu")  # fmt: skip
    assert isinstance(result.exception, RuntimeError) and len(calls) == 2
    assert out.read_text() == "old\n"
    kept = ["out.txt.partial", "out.txt.partial.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt", *kept]
    assert len((tmp_path / kept[0]).read_text().splitlines()) == calls[0]  # the first chunk's
    result = invoke("translate", "--model", trained_run, "--input", tmp_path / "missing.txt",
                    "--output", out)  # fmt: skip
    assert isinstance(result.exception, UserError) and "--input" in str(result.exception)
    assert out.read_text() == "old\n"


def test_set_decode_keys_reach_the_search(trained_run: Path, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("qb qc qd\nqz qf\n")
    out = tmp_path / "out.txt"
    base = ["translate", "--model", trained_run, "--input", source, "--output", out]
    assert invoke(*base).exit_code == 0
    assert all(out.read_text().splitlines())
    # An output limit of 0 x source + 1 token leaves room for <eos> only: empty lines.
    result = invoke(*base, "--set", "decode.max_len_a=0", "--set", "decode.max_len_b=1")
    assert result.exit_code == 0, result.output
    assert out.read_text() == "\n\n"


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--set", "decode.beam=0"], "decode.beam: 0 is invalid; must be >= 1"),
        (["--beam", "0"], "decode.beam: 0 is invalid; must be >= 1"),
        (["--set", "decode.max_len_b=x"], "decode.max_len_b: 'x' is a string, expected int"),
        (["--set", "decode.bem=3"], "decode.bem: unknown key; did you mean decode.beam?"),
        (["--set", "train.lr=1"], "--set train.lr=1: only decode.* keys can be set here"),
    ],
)
def test_bad_decode_settings_are_config_errors(trained_run: Path, option, message) -> None:
    result = invoke("translate", "--model", trained_run, *option)
    assert isinstance(result.exception, UserError), result.output
    assert message in str(result.exception)


def test_nbest_marian_format_and_empty_lines(trained_run: Path, translator, tmp_path) -> None:
    lines = ["qb qc qd", "", "qz qf"]
    source, out = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("".join(line + "\n" for line in lines))
    base = ["translate", "--model", trained_run, "--input", source, "--output", out]
    result = invoke(*base, "--nbest", "2", "--nbest-format", "marian")
    assert result.exit_code == 0, result.output
    rows = [line.split(" ||| ") for line in out.read_text().splitlines()]
    assert [int(i) for i, _, _ in rows] == [0, 0, 1, 1, 2, 2]
    expected = translator.translate_nbest(lines, beam=3, nbest=2)
    assert [text for _, text, _ in rows] == [e.text for entries in expected for e in entries]
    assert [text for _, text, _ in rows[2:4]] == ["", ""]  # the empty line: 2 entries too
    scores = [float(score) for _, _, score in rows]
    assert scores == pytest.approx([e.score for entries in expected for e in entries], abs=1e-4)
    assert invoke(*base, "--nbest", "2").exit_code == 0  # tsv: a block of 2 per line
    assert [len(b.splitlines()) for b in out.read_text().split("\n\n")] == [2, 2, 2, 0]


# ---------------------------------------------------------------------------------------------
# attn_mt.load: every check of the command line, for a notebook too


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(decode={"beam": 0}), "decode.beam: 0 is invalid; must be >= 1"),
        (dict(decode={"bem": 3}), "decode.bem: unknown key; did you mean decode.beam?"),
        (dict(decode={"max_len_b": "x"}), "decode.max_len_b: 'x' is a string, expected int"),
        (dict(precision="fp64"), "--precision fp64: unknown; use one of fp32, bf16, fp16, auto"),
        (dict(precision="fp16"), "--precision fp16 needs a CUDA GPU; use bf16 or fp32 on the CPU"),
        (dict(quantize="int8", precision="bf16"), "--quantize int8 and --precision bf16 exclude"),
        (dict(quantize="int4"), "--quantize int4: unknown"),
        (dict(device="tpu"), "--device tpu: unknown device"),
    ],
)
def test_load_refuses_bad_options_in_one_line(trained_run: Path, options, message) -> None:
    with pytest.raises(UserError) as refused:
        attn_mt.load(trained_run, **{"device": "cpu", **options})
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_load_decode_overrides_are_the_search_settings(trained_run: Path, translator) -> None:
    lines = ["qb qc qd", "qz qf qg"]
    narrow = attn_mt.load(trained_run, device="cpu", decode={"beam": 1, "length_penalty": 0.5})
    assert (narrow.config.decode.beam, narrow.config.decode.length_penalty) == (1, 0.5)
    assert narrow.config.decode.max_len_a == translator.config.decode.max_len_a  # the rest kept
    assert narrow.translate(lines) == translator.translate(lines, beam=1, length_penalty=0.5)
    assert narrow.checkpoints == [trained_run / "checkpoints" / "best.pt"]


def test_nbest_without_a_beam_widens_the_beam(translator) -> None:
    """`translate --nbest 4` without --beam searches a beam of 4 when decode.beam is smaller."""
    assert translator.config.decode.beam < 4
    widened = translator.translate_nbest(["qb qc qd"], nbest=4)
    assert [[e.text for e in n] for n in widened] == [
        [e.text for e in n] for n in translator.translate_nbest(["qb qc qd"], beam=4, nbest=4)
    ]


@pytest.mark.parametrize("beam", [1, 2, 5])
def test_batches_fit_the_budget_a_beam_counting_half_its_rows(
    translator, monkeypatch: pytest.MonkeyPatch, beam: int
) -> None:
    """decode.batch_tokens bounds source tokens x (K + 1) / 2 per batch (x 1 for greedy): a
    sentence's K beams share their source rows, so a beam batch holds more than budget / K."""
    from attn_mt.decode import translator as module

    shapes: list[tuple[int, int]] = []
    search = module.generate

    def recording(model, src, *args, **kwargs):
        shapes.append(tuple(src.shape))
        return search(model, src, *args, **kwargs)

    monkeypatch.setattr(module, "generate", recording)
    rng = random.Random(beam)
    lines = [
        " ".join(rng.choices(["qb", "qc", "qd", "qz"], k=rng.randint(1, 6))) for _ in range(60)
    ]
    budget = 90
    translator.translate(lines, beam=beam, batch_tokens=budget)
    assert sum(rows for rows, _ in shapes) == len(lines)
    assert all(rows * length * (beam + 1) / 2 <= budget for rows, length in shapes)
    if beam > 1:  # the rule, not budget / K, sized them
        assert max(rows * length for rows, length in shapes) * beam > budget
