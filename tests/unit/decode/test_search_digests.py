"""Every search mode's outputs pinned: greedy, beam (n-best), sampling, terms, prefixes,
avoided words, alignment, an ensemble, with and without the KV cache, on tiny random models and a
random checkpoint. The searches must search exactly as the code before the restructure did.

Pinned across CPUs: another CPU's kernels (MKL's AVX2 path on AMD, AVX-512 on Intel) round float32
sums differently. The tiny models run in float64, so their logits agree to ~1e-16 on any CPU and
no near-tie between two tokens is decided by rounding; the search's own float32 log-softmax
(`StepDecoder.log_probs`) still rounds, so a mode pins its tokens (texts, alignments) exactly, in
a digest, and its scores and log-probabilities as one sum to a tolerance: a score rounded to 4
decimals in the digest moved it whenever it sat near a rounding boundary (14 of the 38 modes
differed between the AMD EPYC that recorded them and an Intel Xeon). `python -m pytest ... -s`
prints what a run found.
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

# Recorded on the code before the restructure (323d8ea), on one thread (a float sum's order follows
# the thread count); that code searched as the searches before one loop (ea9e217) did, whose
# float32 digests it still matched. Per mode: (tokens digest, sum of scores and log-probabilities).
EXPECTED: dict[str, tuple[str, float]] = {
    "greedy/one/cache": ("6409bdfbce6c806a", -163.389205),
    "beam4/one/cache": ("5580219e5d4d6076", -652.787543),
    "sample/one/cache": ("5fc368c20df6e4cf", -613.562054),
    "steered-terms/one/cache": ("ad6644814907b1e1", -392.725514),
    "steered-prefix/one/cache": ("261b19d30cb6d3be", -723.250829),
    "steered-avoid/one/cache": ("2546033dd8aa229d", -482.706198),
    "steered-all/one/cache": ("55d6ca1eb2a0a273", -487.757091),
    "greedy/one/nocache": ("6409bdfbce6c806a", -163.389205),
    "beam4/one/nocache": ("5580219e5d4d6076", -652.787543),
    "sample/one/nocache": ("5fc368c20df6e4cf", -613.562054),
    "steered-terms/one/nocache": ("ae92bc07273cae6b", -389.928223),
    "steered-prefix/one/nocache": ("2953ced70053e217", -671.585330),
    "steered-avoid/one/nocache": ("2546033dd8aa229d", -482.706198),
    "steered-all/one/nocache": ("3d6cdb9acdab0c1e", -578.783747),
    "greedy/ensemble/cache": ("958ff4728c550fb2", -145.588280),
    "beam4/ensemble/cache": ("b6c21b60ce57033c", -486.690432),
    "sample/ensemble/cache": ("e6698f0f9581dbb9", -620.317362),
    "steered-terms/ensemble/cache": ("66eaae5c69474fc4", -347.025500),
    "steered-prefix/ensemble/cache": ("790ae77e80107638", -698.774755),
    "steered-avoid/ensemble/cache": ("5c6e6d8cd239d80c", -366.900913),
    "steered-all/ensemble/cache": ("a5389de67b3bdeb8", -531.153431),
    "greedy/ensemble/nocache": ("958ff4728c550fb2", -145.588280),
    "beam4/ensemble/nocache": ("b6c21b60ce57033c", -486.690432),
    "sample/ensemble/nocache": ("e6698f0f9581dbb9", -620.317362),
    "steered-terms/ensemble/nocache": ("e9256293d2dd55e7", -345.058495),
    "steered-prefix/ensemble/nocache": ("aa42c990df743e34", -641.723319),
    "steered-avoid/ensemble/nocache": ("5c6e6d8cd239d80c", -366.900913),
    "steered-all/ensemble/nocache": ("b0fbcbed7acf2a4f", -549.821754),
    "api/greedy": ("2d60aa91f3077b2e", -48.226038),
    "api/beam4": ("96bafc7582124a1d", -282.964739),
    "api/beam4-nocache": ("96bafc7582124a1d", -211.495603),
    "api/sample": ("c472b7e16e7a460e", -238.488217),
    "api/terms": ("697605195a03341a", -103.437850),
    "api/prefix": ("1f181a6643893909", -115.159160),
    "api/prefix-greedy": ("4b5f6e91718a0ebc", -58.867709),
    "api/avoid": ("bd7c6f12e47179a6", -102.644532),
    "api/alignment": ("b61cb93dc9569dab", -92.799004),
    "api/small-batches": ("d513fbdcf428fc7c", -157.322934),
}
# The float32 log-softmax rounds each score to ~1e-6: one CPU's five kernel sets (ATen's AVX-512,
# AVX2 and plain code, MKL's AVX-512, AVX2 and SSE paths) gave sums within 3.3e-5 of each other,
# where a changed score (a length penalty, an ensemble's mean, one hypothesis) moves one by more.
SUM_TOLERANCE = 2e-4


def digest(outputs) -> str:
    """sha256 of every output's tokens (and text and alignment), in order."""

    def entry(h) -> list:
        return [h.text, h.tokens, h.alignment] if hasattr(h, "text") else h.tokens

    rows = [[entry(h) for h in (row if isinstance(row, list) else [row])] for row in outputs]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def score_sum(outputs) -> float:
    """The sum of every output's score (and log-probability, where it has one)."""
    hyps = [h for row in outputs for h in (row if isinstance(row, list) else [row])]
    return sum(h.score + getattr(h, "logprob", 0.0) for h in hyps)


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
    """Every strategy of the search loop on random models (in float64) and sources."""
    src = random_sources(3, count=10)
    limits = max_output_lengths(src, 1.5, 5)
    one, pair = random_model(0).double(), [random_model(1).double(), random_model(2).double()]
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
    translator = attn_mt.load(random_checkpoint(folder, toy_data), device="cpu", prepack=False)
    for model in translator.models:
        model.double()  # as the random models: logits alike on every CPU
    return translator


def test_every_mode_searches_as_recorded(translator, capsys) -> None:
    torch.set_num_threads(1)  # as recorded (conftest restores the count after the test)
    found = {
        **search_outputs(),
        **{f"api/{k}": v for k, v in translator_outputs(translator).items()},
    }
    with capsys.disabled():
        for name, outputs in found.items():
            print(f'    "{name}": ("{digest(outputs)}", {score_sum(outputs):.6f}),')
    assert {name: digest(outputs) for name, outputs in found.items()} == {
        name: tokens for name, (tokens, _) in EXPECTED.items()
    }
    for name, outputs in found.items():
        assert score_sum(outputs) == pytest.approx(EXPECTED[name][1], rel=0, abs=SUM_TOLERANCE), (
            name
        )
