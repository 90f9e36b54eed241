"""Every search mode's outputs pinned as digests: greedy, beam (n-best), sampling, terms,
prefixes, avoided words, alignment, an ensemble, with and without the KV cache, on tiny random
models and a random checkpoint. The digests were recorded before the searches became
strategies of one loop (`attn_mt.decode.generate`): the loop must search exactly as the
separate searches did.

A digest hashes the tokens and the scores rounded to 4 decimals, so that another CPU's float
rounding does not move it; `python -m pytest ... -s` prints the exact ones as well.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from helpers.models import VOCAB, random_checkpoint, random_model, random_sources
from helpers.toy import toy_pairs

import attn_mt
from attn_mt.decode.controls import Controls
from attn_mt.decode.generate import generate, max_output_lengths
from attn_mt.decode.search import Beam, Draw, Greedy, Sampling
from attn_mt.decode.steered import SteeredBeam

SAMPLING = Sampling(temperature=0.8, top_k=6, top_p=0.9, seed=3)

# Recorded on the code before the searches became strategies of one loop (ea9e217), on one
# thread: a float sum's order follows the thread count, and two beam modes hold a near-tie
# that it decides. Another CPU's kernels may round differently still.
EXPECTED = {
    "greedy/one/cache": "2d429f9da86f7ca9",
    "beam4/one/cache": "6e5b710114969518",
    "sample/one/cache": "7b99b5e69d2c8a1a",
    "steered-terms/one/cache": "7e18aa3e73d0a31a",
    "steered-prefix/one/cache": "f8a27d1c4f6518e5",
    "steered-avoid/one/cache": "d8e7902f823c04e5",
    "steered-all/one/cache": "5c9130178d5ed84c",
    "greedy/one/nocache": "ec46c75e42ae66f2",
    "beam4/one/nocache": "6e5b710114969518",
    "sample/one/nocache": "b97d58543391fb6b",
    "steered-terms/one/nocache": "86cf9e0079425db1",
    "steered-prefix/one/nocache": "300ab46f1d5f9776",
    "steered-avoid/one/nocache": "975bdbb813c7a373",
    "steered-all/one/nocache": "1801e59fecca4cef",
    "greedy/ensemble/cache": "423fde4250946dea",
    "beam4/ensemble/cache": "d3a47d35d7b276c0",
    "sample/ensemble/cache": "29a7d43ac6e055d7",
    "steered-terms/ensemble/cache": "56c22e455715714e",
    "steered-prefix/ensemble/cache": "0a42c0b3d54ba39d",
    "steered-avoid/ensemble/cache": "68a7e22931fc57db",
    "steered-all/ensemble/cache": "d5bb080d6ff70ed3",
    "greedy/ensemble/nocache": "423fde4250946dea",
    "beam4/ensemble/nocache": "d3a47d35d7b276c0",
    "sample/ensemble/nocache": "29a7d43ac6e055d7",
    "steered-terms/ensemble/nocache": "cd1324d0ccd96ddf",
    "steered-prefix/ensemble/nocache": "ae2667cbe223ca1f",
    "steered-avoid/ensemble/nocache": "2c364f5586fdeaa4",
    "steered-all/ensemble/nocache": "9aad3cfade6e8bd2",
    "api/greedy": "71d3f00a8afa8185",
    "api/beam4": "755225f82f282c87",
    "api/beam4-nocache": "15222475e7d1c962",
    "api/sample": "1749619c1b24deeb",
    "api/terms": "cb69c23b7bf207cb",
    "api/prefix": "b24ede5888b94249",
    "api/prefix-greedy": "2e6f1f4fdccc63a8",
    "api/avoid": "5e7904712ad9bebc",
    "api/alignment": "cc0bef32a0fd4beb",  # every layer's mean since 5154ffc (AER); text unchanged
    "api/small-batches": "52a75d31fb925a5b",
}


def digest(outputs, exact: bool = False) -> str:
    """sha256 of every output's tokens, score and log-probability (and alignment)."""

    def number(x: float) -> str:
        return repr(x) if exact else f"{x:.4f}"

    def entry(h) -> list:
        if hasattr(h, "text"):
            return [h.text, h.tokens, number(h.score), h.alignment]
        return [h.tokens, number(h.score), number(h.logprob)]

    rows = [[entry(h) for h in (row if isinstance(row, list) else [row])] for row in outputs]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def controls(count: int, kind: str) -> list[Controls]:
    """Per row, for `kind` "terms", "prefix", "avoid" or "all": 0-2 terms of 1-2 tokens, a
    1-2 token prefix, avoided tokens (the ids below 12; terms and prefixes use the others)."""
    gen = torch.Generator().manual_seed(5)

    def tokens(low: int, high: int) -> list[int]:
        length = int(torch.randint(low, high + 1, ()))
        return torch.randint(12, VOCAB, (length,), generator=gen).tolist()

    return [
        Controls(
            [tokens(1, 2) for _ in range(i % 3)] if kind in ("terms", "all") else [],
            tokens(1, 2) if kind in ("prefix", "all") else [],
            [[5 + i % 3], [7, 8]] if kind in ("avoid", "all") else [],
        )
        for i in range(count)
    ]


def search_outputs() -> dict[str, list]:
    """Every strategy of the search loop on random models and sources."""
    src = random_sources(3, count=10)
    limits = max_output_lengths(src, 1.5, 5)
    one, pair = random_model(0), [random_model(1), random_model(2)]
    out: dict[str, list] = {}
    for name, model in (("one", one), ("ensemble", pair)):
        for cache in (True, False):
            tag = f"{name}/{'cache' if cache else 'nocache'}"
            out[f"greedy/{tag}"] = generate(model, src, limits, Greedy(), 0.6, cache)
            out[f"beam4/{tag}"] = generate(model, src, limits, Beam(4, nbest=4), 1.0, cache)
            draw = Draw(SAMPLING, range(7, 7 + src.size(0)), samples=3)
            out[f"sample/{tag}"] = generate(model, src, limits, draw, 0.6, cache)
            for kind in ("terms", "prefix", "avoid", "all"):
                rows = controls(src.size(0), kind)
                needed = torch.tensor([c.needed_length() for c in rows])
                steered = torch.maximum(limits, needed)
                strategy = SteeredBeam(rows, 3, nbest=3)
                out[f"steered-{kind}/{tag}"] = generate(model, src, steered, strategy, 1.0, cache)
    return out


def translator_outputs(translator: attn_mt.Translator) -> dict[str, list]:
    """Every mode of `translate_nbest` on a random checkpoint."""
    lines, targets = toy_pairs(12, seed=11)
    lines[3] = ""
    terms = [[t.split()[0]] if i % 2 else [] for i, t in enumerate(targets)]
    prefixes = [t.split()[0] if i % 3 == 0 else None for i, t in enumerate(targets)]
    avoid = [targets[0].split()[-1]]
    calls = {
        "greedy": dict(beam=1),
        "beam4": dict(beam=4, nbest=4, length_penalty=0.8),
        "beam4-nocache": dict(beam=4, nbest=4, use_cache=False),
        "sample": dict(nbest=3, sampling=SAMPLING),
        "terms": dict(beam=3, nbest=2, constraints=terms),
        "prefix": dict(beam=3, nbest=2, prefixes=prefixes),
        "prefix-greedy": dict(beam=1, prefixes=prefixes),
        "avoid": dict(beam=3, nbest=2, avoid=avoid),
        "alignment": dict(beam=2, nbest=2, alignment=True, constraints=terms),
        "small-batches": dict(beam=3, nbest=3, batch_tokens=8),
    }
    return {name: translator.translate_nbest(lines, **kw) for name, kw in calls.items()}


@pytest.fixture(scope="module")
def translator(toy_data, tmp_path_factory) -> attn_mt.Translator:
    folder = tmp_path_factory.mktemp("digests")
    return attn_mt.load(random_checkpoint(folder, toy_data), device="cpu", prepack=False)


def test_every_mode_searches_as_recorded(translator, capsys) -> None:
    torch.set_num_threads(1)  # as recorded (conftest restores the count after the test)
    found = {
        **search_outputs(),
        **{f"api/{k}": v for k, v in translator_outputs(translator).items()},
    }
    with capsys.disabled():
        for name, outputs in found.items():
            print(f"{name:32} {digest(outputs)} exact {digest(outputs, exact=True)}")
    assert {name: digest(outputs) for name, outputs in found.items()} == EXPECTED
