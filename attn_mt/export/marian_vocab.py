"""A Marian vocabulary as attn-mt's: the ids of `vocab.json` (and `target_vocab.json`) moved so
that attn-mt's special ids hold, and the SentencePiece models rebuilt so that their ids are the
model's rows.

MarianTokenizer segments a line with `source.spm`, looks each piece's string up in `vocab.json`
(a piece missing there is `<unk>`) and appends `</s>`; the SentencePiece models' own ids mean
nothing to the model. Marian's ids are `</s>` 0, `<unk>` 1, the pieces, `<pad>` last, and its
decoder starts from `<pad>`'s row (a zero vector); it has no `<s>`. attn-mt's are fixed
(`model.vocab`: `<pad>` 0, `<unk>` 1, `<s>` 2, `</s>` 3). So the vocabulary is permuted:

    attn-mt row:   0 <pad>   1 <unk>   2 <s>      3 </s>   4, 5, ... the other pieces in order
    Marian row:    <pad>     <unk>     (a zero)   </s>     2, 3, ... (their Marian ids)

and each side's SentencePiece model is rebuilt with its pieces in that order: a piece of the
vocabulary that this side's model holds keeps its type and score; one it does not (the other
side's pieces of a shared vocabulary) is UNUSED, so segmentation never makes it, while its
string still looks it up (`Tokenizer.by_pieces`). A label `>>fra<<` of a multilingual model
becomes attn-mt's tag `<2fra>`. A piece `source.spm` makes that the vocabulary lacks (Marian:
`<unk>`) is appended after the vocabulary, its row `<unk>`'s, so segmentation stays as Marian's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from attn_mt.config.data import language_tag
from attn_mt.errors import UserError, named
from attn_mt.model.vocab import BOS_ID, EOS_ID, PAD_ID, SPECIAL_PIECES, UNK_ID

# A multilingual OPUS-MT model's target-language label, as its vocabulary holds it.
LABEL = re.compile(r">>([a-z]{2,3}(?:_[A-Za-z0-9]+)?)<<")


@dataclass(frozen=True)
class VocabularyMap:
    """Where each attn-mt row comes from: `rows[a]` is the Marian id of attn-mt id `a` (None:
    a row of zeros, attn-mt's `<s>`), `extra` Marian's `<unk>` for the appended pieces."""

    rows: list[int | None]
    size: int  # Marian's vocabulary size

    def attn_id(self, marian_id: int) -> int:
        """attn-mt's id of a Marian id."""
        return self.rows.index(marian_id)


def read_vocab(path: Path) -> dict[str, int]:
    """A vocab.json (piece -> id), checked: the ids 0 .. V-1, each held by a piece (a label
    may be a second name of a piece: attn-mt's own exports write `>>de<<` beside `<2de>`)."""
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{named(path)}: unreadable ({err}); not a MarianMT vocabulary") from None
    ids = set(vocab.values()) if isinstance(vocab, dict) else set()
    if not ids or ids != set(range(len(ids))) or not all(isinstance(k, str) for k in vocab):
        raise UserError(f"{named(path)}: not a vocabulary (pieces with the ids 0 to N-1)")
    return vocab


def vocabulary_map(vocab: dict[str, int], pad_id: int, eos_id: int, start_id: int) -> VocabularyMap:
    """The permutation of a Marian vocabulary into attn-mt's rows (module docstring); a
    decoder that starts from `<pad>` (Marian's) gets a `<s>` of zeros, one that starts from
    a piece of its own (attn-mt's exports) that piece."""
    unk_id = vocab.get("<unk>")
    if unk_id is None:
        raise UserError("vocab.json: no <unk> piece; not a MarianMT vocabulary")
    start = None if start_id == pad_id else start_id
    specials = {PAD_ID: pad_id, UNK_ID: unk_id, BOS_ID: start, EOS_ID: eos_id}
    rows = [specials[i] for i in range(len(specials))]
    size = len(set(vocab.values()))
    rows += [i for i in range(size) if i not in specials.values()]
    return VocabularyMap(rows, size)


def labels(vocab: dict[str, int]) -> list[str]:
    """The target languages of a multilingual model (its `>>xx<<` labels), in vocabulary order."""
    found = [(i, m.group(1)) for piece, i in vocab.items() if (m := LABEL.fullmatch(piece))]
    return [lang for _, lang in sorted(found)]


def rebuild_model(
    spm: bytes, vocab: dict[str, int], mapping: VocabularyMap, extra: list[str]
) -> bytes:
    """One side's SentencePiece model with attn-mt's ids: the pieces of `vocab` in `mapping`'s
    row order, then the `extra` pieces (module docstring)."""
    from sentencepiece import sentencepiece_model_pb2 as pb  # protobuf: tensorboard's dependency

    original = pb.ModelProto.FromString(spm)  # type: ignore[attr-defined]
    kind = {p.piece: (p.type, p.score) for p in original.pieces}
    normal = [p.score for p in original.pieces if p.type == p.NORMAL]
    floor = min(normal, default=0.0)  # an unused piece's score: never below the model's own
    piece_of = {i: piece for piece, i in sorted(vocab.items(), key=_label_last)}
    proto = pb.ModelProto()  # type: ignore[attr-defined]
    proto.CopyFrom(original)
    del proto.pieces[:]
    piece_type = pb.ModelProto.SentencePiece  # type: ignore[attr-defined]
    special_types = {PAD_ID: "CONTROL", UNK_ID: "UNKNOWN", BOS_ID: "CONTROL", EOS_ID: "CONTROL"}
    names = [SPECIAL_PIECES[k] for k in ("pad", "unk", "bos", "eos")]
    for row, marian_id in enumerate(mapping.rows):
        new = proto.pieces.add()
        if row in special_types:
            new.piece, new.score = names[row], 0.0
            new.type = getattr(piece_type, special_types[row])
            continue
        assert marian_id is not None
        piece = piece_of[marian_id]
        if label := LABEL.fullmatch(piece):  # a tag, which attn-mt puts in by id
            new.piece, new.type, new.score = (
                language_tag(label.group(1)),
                piece_type.USER_DEFINED,
                0.0,
            )
        elif piece in kind and kind[piece][0] != piece_type.UNKNOWN:  # this side's own
            new.piece, (new.type, new.score) = piece, kind[piece]
        else:  # the other side's: never made by segmentation, found by its string
            new.piece, new.type, new.score = piece, piece_type.UNUSED, floor
    for piece in extra:
        new = proto.pieces.add()
        new.piece, (new.type, new.score) = piece, kind.get(piece, (piece_type.UNUSED, floor))
    spec = proto.trainer_spec  # where SentencePiece reads the special ids from
    spec.pad_id, spec.unk_id, spec.bos_id, spec.eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID
    spec.pad_piece, spec.unk_piece, spec.bos_piece, spec.eos_piece = names
    return proto.SerializeToString()


def _label_last(item: tuple[str, int]) -> bool:
    """Sort key: a label after the other names of its id (it names the piece then)."""
    return LABEL.fullmatch(item[0]) is not None


def missing_pieces(spm: bytes, vocab: dict[str, int]) -> list[str]:
    """The pieces SentencePiece model `spm` makes that `vocab` lacks (Marian reads them as
    `<unk>`), in the model's order."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    original = pb.ModelProto.FromString(spm)  # type: ignore[attr-defined]
    made = (original.pieces[0].NORMAL, original.pieces[0].BYTE)
    return [p.piece for p in original.pieces if p.type in made and p.piece not in vocab]
