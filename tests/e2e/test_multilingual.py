"""One model, several directions, end to end: a tiny toy model of de->en and de->fr (the toy
task in two target "languages", see tests/unit/data/test_languages.py) trains with its
validation per direction, translates only with a target language it knows, evaluates a
direction, exports to CTranslate2 and transformers with its tags; a bilingual run is what it
was before any of this (recorded on be4f2bd, the commit before it; its weights to a tolerance
that leaves another CPU's float32 rounding free)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from helpers.clirun import assert_user_error
from helpers.clirun import attn_mt as cli
from helpers.multilingual import multilingual_files, multilingual_raw, toy_language
from helpers.toy import invoke, run, toy_config_dict, toy_pairs, write_lines

import attn_mt
from attn_mt.config.file import config_from_dict
from attn_mt.data.prepare import plan
from attn_mt.errors import UserError
from attn_mt.model.vocab import EOS_ID

PAIRS = ("de-en", "de-fr")


@pytest.fixture(scope="module")
def multi_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The toy model of de->en and de->fr, 400 steps, validated every 200, its loss alone
    every 100 between."""
    folder = tmp_path_factory.mktemp("multi")
    files = multilingual_files(folder)
    raw = multilingual_raw(files, folder / "run", PAIRS)
    raw["data"]["test"] = {"src": str(files["test.de"]), "tgt": str(files["test.fr"])}
    raw["train"].update(max_steps=400, eval_every=200, valid_max_sentences=20, samples=1)
    raw["train"]["valid_loss_every"] = 100
    raw["decode"]["beam"] = 2
    run(config_from_dict(raw))
    (folder / "run" / "files.json").write_text(json.dumps({k: str(v) for k, v in files.items()}))
    return folder / "run"


def files_of(run_dir: Path) -> dict[str, Path]:
    return {k: Path(v) for k, v in json.loads((run_dir / "files.json").read_text()).items()}


# ---------------------------------------------------------------------------------------------
# Validation per direction


def test_validation_rows_per_direction_and_their_mean(multi_run: Path):
    rows = [json.loads(line) for line in (multi_run / "metrics.jsonl").read_text().splitlines()]
    valid = [r for r in rows if r["split"] == "valid"]
    steps = sorted({r["step"] for r in valid})
    assert steps == [200, 400]
    for step in steps:
        at = [r for r in valid if r["step"] == step]
        per_pair = {r["pair"]: r for r in at if "pair" in r}
        [mean] = [r for r in at if "pair" not in r]
        assert sorted(per_pair) == sorted(PAIRS)
        for name in ("bleu", "chrf", "loss"):
            assert mean[name] == pytest.approx(sum(r[name] for r in per_pair.values()) / 2)
        assert all(r["sentences"] == 20 for r in per_pair.values())  # capped per direction
        assert mean["sentences"] == 40
        assert all(0 <= r["off_target"] <= 100 for r in per_pair.values())
    # best.pt is the validation of the best mean BLEU (train.select_metric)
    means = {r["step"]: r["bleu"] for r in valid if "pair" not in r}
    best = torch.load(multi_run / "checkpoints" / "best.pt", weights_only=True)
    assert means[best["step"]] == max(means.values())
    assert best["metrics"]["bleu"] == pytest.approx(max(means.values()))
    assert max(means.values()) > 50  # it learned both directions: the tags steer it
    # the loss alone between them: the directions' mean, one row a check
    loss_only = [r for r in rows if r["split"] == "valid_loss"]
    assert [(r["step"], sorted(r)) for r in loss_only] == [
        (step, ["loss", "ppl", "split", "step"]) for step in (100, 300)
    ]
    loss = {r["step"]: r["loss"] for r in loss_only + valid if "pair" not in r}
    assert sorted(loss) == [100, 200, 300, 400] and loss[100] > loss[400] > 0  # it learns


def test_tensorboard_has_a_curve_per_direction(multi_run: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(multi_run / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"valid/de-en/bleu", "valid/de-fr/bleu", "valid/de-fr/off_target", "valid/bleu"} <= tags


# ---------------------------------------------------------------------------------------------
# Translate and evaluate


def test_translate_needs_a_target_language_it_knows(multi_run: Path, tmp_path: Path):
    """One error line listing the model's target languages, before any input is read."""
    source = write_lines(tmp_path / "in.de", toy_pairs(10, seed=7)[0])
    missing = cli("translate", "-m", multi_run, "-i", source, "-o", tmp_path / "out", cwd=tmp_path)
    assert_user_error(missing, "--tgt-lang", "target languages: en, fr")
    unknown = cli("translate", "-m", multi_run, "--tgt-lang", "cs", cwd=tmp_path, stdin=b"qb\n")
    assert_user_error(unknown, "--tgt-lang cs", "en, fr")
    assert not (tmp_path / "out").exists()
    translator = attn_mt.load(multi_run, device="cpu")
    with pytest.raises(UserError, match="en, fr"):
        translator.translate(["qb qc"])


def test_each_target_language_gets_its_own_output(multi_run: Path, tmp_path: Path):
    de, en = toy_pairs(10, seed=7)
    source = write_lines(tmp_path / "in.de", de)
    outputs = {}
    for lang in ("en", "fr"):
        result = invoke("translate", "-m", multi_run, "-i", source, "--tgt-lang", lang, "-b", "2")
        assert result.exit_code == 0, result.output
        outputs[lang] = result.output.splitlines()
        api = attn_mt.load(multi_run, device="cpu").translate(de, beam=2, tgt_lang=lang)
        assert outputs[lang] == api  # the CLI is the API
    right = sum(o == e for o, e in zip(outputs["en"], en, strict=True))
    right += sum(o == toy_language(e) for o, e in zip(outputs["fr"], en, strict=True))
    assert right >= 16  # the tag chose the language of each


def test_evaluate_a_direction(multi_run: Path, tmp_path: Path):
    files = files_of(multi_run)
    by_files = invoke(
        "evaluate", "-m", multi_run, "--src", files["test.de"], "--ref", files["test.fr"],
        "--tgt-lang", "fr", "--json", "-o", tmp_path / "fr.hyp",
    )  # fmt: skip
    assert by_files.exit_code == 0, by_files.output
    found = json.loads(by_files.output.splitlines()[-1])
    assert found["bleu"] > 50 and "off_target" in found
    no_pair = invoke("evaluate", "-m", multi_run, "--split", "test")
    assert isinstance(no_pair.exception, UserError) and "\n" not in str(no_pair.exception)
    assert "--pair" in str(no_pair.exception) and "de-en, de-fr" in str(no_pair.exception)
    both = invoke("evaluate", "-m", multi_run, "--pair", "de-en", "--src", files["test.de"],
                  "--ref", files["test.en"])  # fmt: skip
    assert isinstance(both.exception, UserError) and "--tgt-lang instead" in str(both.exception)
    valid = invoke("evaluate", "-m", multi_run, "--split", "valid", "--pair", "de-en", "--json")
    assert valid.exit_code == 0, valid.output
    assert json.loads(valid.output.splitlines()[-1])["bleu"] > 50


# ---------------------------------------------------------------------------------------------
# A bilingual model


def test_a_bilingual_model_takes_its_own_language_only(trained_run: Path, tmp_path: Path):
    source = write_lines(tmp_path / "in.src", toy_pairs(6, seed=8)[0])
    plain = invoke("translate", "-m", trained_run, "-i", source)
    same = invoke("translate", "-m", trained_run, "-i", source, "--tgt-lang", "yy")
    assert plain.exit_code == same.exit_code == 0 and plain.output == same.output
    other = cli("translate", "-m", trained_run, "-i", source, "--tgt-lang", "fr", cwd=tmp_path)
    assert_user_error(other, "--tgt-lang fr", "translates into yy only")


# Recorded on be4f2bd (before multilingual training) with the same steps, on one thread.
BILINGUAL = {
    "prepared": "8d3564448c09b50cc9db",  # the cache key holds data.filters since 2e15597
    "tokenizers": "46e1fbe64e7266e7",
    "valid": "397c8b4dde27b452",
    "outputs": "2033fbd2ac76f1bc",
}
# Each weight's (sum, norm) after the 20 steps (last.pt), an in_proj bias without its key third:
# recorded on the code before the restructure (323d8ea), whose weights were be4f2bd's bit for bit.
WEIGHTS = {
    "decoder.0.cross_attn.in_proj.bias": (0.015608, 0.106205),
    "decoder.0.cross_attn.in_proj.weight": (-5.315996, 9.903386),
    "decoder.0.cross_attn.out_proj.bias": (-0.010209, 0.079859),
    "decoder.0.cross_attn.out_proj.weight": (10.691391, 8.053101),
    "decoder.0.ff.w_1.bias": (0.497649, 0.107602),
    "decoder.0.ff.w_1.weight": (-0.253962, 9.245341),
    "decoder.0.ff.w_2.bias": (0.034769, 0.083105),
    "decoder.0.ff.w_2.weight": (4.612190, 9.322343),
    "decoder.0.res_cross.norm.bias": (0.074942, 0.073125),
    "decoder.0.res_cross.norm.weight": (64.135443, 8.017254),
    "decoder.0.res_ff.norm.bias": (0.114797, 0.085717),
    "decoder.0.res_ff.norm.weight": (64.503732, 8.063212),
    "decoder.0.res_self.norm.bias": (-0.023543, 0.077115),
    "decoder.0.res_self.norm.weight": (64.508502, 8.063758),
    "decoder.0.self_attn.in_proj.bias": (0.057564, 0.111296),
    "decoder.0.self_attn.in_proj.weight": (16.342342, 9.938428),
    "decoder.0.self_attn.out_proj.bias": (-0.014502, 0.079432),
    "decoder.0.self_attn.out_proj.weight": (-15.180930, 8.058321),
    "decoder_norm.bias": (-0.082075, 0.081929),
    "decoder_norm.weight": (63.405402, 7.925724),
    "encoder.0.ff.w_1.bias": (0.224705, 0.104912),
    "encoder.0.ff.w_1.weight": (12.046424, 9.285675),
    "encoder.0.ff.w_2.bias": (-0.011959, 0.070870),
    "encoder.0.ff.w_2.weight": (-18.596287, 9.216632),
    "encoder.0.res_attn.norm.bias": (-0.000639, 0.068802),
    "encoder.0.res_attn.norm.weight": (64.113138, 8.014418),
    "encoder.0.res_ff.norm.bias": (0.031460, 0.074772),
    "encoder.0.res_ff.norm.weight": (64.274044, 8.034501),
    "encoder.0.self_attn.in_proj.bias": (-0.126935, 0.102000),
    "encoder.0.self_attn.in_proj.weight": (4.290322, 9.848309),
    "encoder.0.self_attn.out_proj.bias": (0.006070, 0.071369),
    "encoder.0.self_attn.out_proj.weight": (2.123794, 8.093316),
    "encoder_norm.bias": (-0.096920, 0.080605),
    "encoder_norm.weight": (64.381016, 8.047867),
    "output.weight": (-6.266924, 7.614713),
    "src_embed.embedding.weight": (-6.266924, 7.614713),
    "tgt_embed.embedding.weight": (-6.266924, 7.614713),
}
# Five kernel sets on one CPU (ATen's AVX-512, AVX2 and plain code; MKL's AVX-512, AVX2 and SSE
# paths) moved a sum by 8.5e-6 at most, a norm by 1.4e-7; lr 0.1% higher moved 22 of them beyond.
WEIGHTS_TOLERANCE = 1e-4


def weight_sums(model: dict[str, torch.Tensor]) -> dict[str, tuple[float, float]]:
    """Each weight's (sum, norm) in float64. A key bias (the middle third of an in_proj bias)
    has no gradient in exact arithmetic (the softmax ignores what it adds to every score of a
    query), so Adam turns the rounding noise in its gradient into steps the size of the
    learning rate: it differs between CPUs as noise does, and it is left out."""
    found = {}
    for name, tensor in sorted(model.items()):
        tensor = tensor.double()
        if name.endswith("in_proj.bias"):
            query, _, value = tensor.chunk(3)
            tensor = torch.cat([query, value])
        found[name] = (float(tensor.sum()), float(tensor.norm()))
    return found


def test_a_bilingual_run_is_what_it_was(tmp_path: Path):
    """The prepared folder's name (the shards' identity), the SentencePiece model, the weights
    after 20 steps, the validation rows and beam outputs of a bilingual toy run.

    The weights are pinned to a tolerance, not bit for bit: float32 sums round differently on
    another CPU's kernels (an AMD EPYC's and an Intel Xeon's digests of them differed), and
    the trainer has no float64 mode. Each weight's sum and norm, to 1e-4, hold the training
    (data order, schedule, loss, optimiser: a 0.1% change of the learning rate moves them
    beyond it) and leave the last bits of float32 rounding free."""
    torch.set_num_threads(1)  # a float sum's order follows the thread count
    files = {}
    for split, count, seed in (("train", 3000, 1), ("valid", 100, 2), ("test", 100, 3)):
        src, tgt = toy_pairs(count, seed)
        files[f"{split}.src"] = write_lines(tmp_path / f"{split}.src", src)
        files[f"{split}.tgt"] = write_lines(tmp_path / f"{split}.tgt", tgt)
    raw = toy_config_dict(files, tmp_path / "run", max_steps=20, eval_every=10, threads=1)
    raw["data"]["prepared_dir"] = str(tmp_path / "prepared")
    cfg = config_from_dict(raw)
    run(cfg)
    state = torch.load(tmp_path / "run" / "checkpoints" / "best.pt", weights_only=True)
    last = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    valid = [
        {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
        for r in rows
        if r["split"] == "valid"
    ]
    outputs = attn_mt.load(tmp_path / "run", device="cpu").translate(toy_pairs(30, 9)[0], beam=3)
    tokenizers = state["tokenizers"]["src"] + state["tokenizers"]["tgt"]
    found = {
        "prepared": plan(cfg).folder.name,
        "tokenizers": hashlib.sha256(tokenizers).hexdigest()[:16],
        "valid": hashlib.sha256(json.dumps(valid).encode()).hexdigest()[:16],
        "outputs": hashlib.sha256("\n".join(outputs).encode()).hexdigest()[:16],
    }
    assert found == BILINGUAL
    assert last["step"] == 20
    weights = weight_sums(last["model"])
    assert weights.keys() == WEIGHTS.keys()
    for name, sums in weights.items():
        assert sums == pytest.approx(WEIGHTS[name], rel=0, abs=WEIGHTS_TOLERANCE), name


def test_a_tags_string_in_a_source_does_not_steer(multi_run: Path):
    """A tag's string ("<2fr>") in a line asked in English is text: every entry point reads its
    lines through `Translator.encode` (tests/unit/decode/test_encode.py), whose only tag is the
    one asked."""
    ours = attn_mt.load(multi_run, device="cpu")
    tags = {lang: ours.language_prefix(lang)[0] for lang in ("en", "fr")}
    [ids] = ours.encode(["qb <2fr> qc <2en>"], "en")
    assert ids[0] == tags["en"] and not set(ids[1:]) & set(tags.values())


def test_score_takes_the_target_language(multi_run: Path, tmp_path: Path):
    """score needs --tgt-lang as translate does, and scores with its tag: each language's
    references score higher under its own tag."""
    de, en = toy_pairs(10, seed=7)
    src = write_lines(tmp_path / "src", de)
    refs = {"en": write_lines(tmp_path / "en", en)}
    refs["fr"] = write_lines(tmp_path / "fr", [toy_language(e) for e in en])
    missing = invoke("score", "-m", multi_run, "--src", src, "--ref", refs["en"])
    assert isinstance(missing.exception, UserError)  # the CLI's main prints it as one line
    assert "target languages: en, fr" in str(missing.exception)
    totals = {}
    for ref, asked in [(r, a) for r in refs for a in refs]:
        result = invoke("score", "-m", multi_run, "--src", src, "--ref", refs[ref], "--tgt-lang",
                        asked, "--device", "cpu")  # fmt: skip
        assert result.exit_code == 0, result.output
        totals[ref, asked] = [float(line.split("\t")[0]) for line in result.output.splitlines()]
    for ref, other in (("en", "fr"), ("fr", "en")):
        higher = sum(a > b for a, b in zip(totals[ref, ref], totals[ref, other], strict=True))
        assert higher >= 9, (ref, totals)


# ---------------------------------------------------------------------------------------------
# Exports


def test_ctranslate2_export_translates_with_the_source_tag(multi_run: Path, tmp_path: Path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    import sentencepiece as spm

    from attn_mt.export.ct2 import export_ctranslate2

    folder = export_ctranslate2(multi_run, tmp_path / "ct2", decode={"beam": 1})
    readme = (folder / "README.txt").read_text()
    assert '["<2de>"]' in readme and "(de-en, de-fr (2 directions)," in readme
    engine = ctranslate2.Translator(str(folder), device="cpu")
    source = spm.SentencePieceProcessor(model_file=str(folder / "source.model"))
    target = spm.SentencePieceProcessor(model_file=str(folder / "target.model"))
    decode = json.loads((folder / "decode.json").read_text())
    lines = toy_pairs(12, seed=12)[0]
    ours = attn_mt.load(multi_run, device="cpu")
    tagged = ["qb <2fr> qc", "<2en>qb"]  # a tag's string in a sentence is text, as in attn-mt
    assert source.encode(tagged) == ours.src_tokenizer.encode(tagged)
    for lang in ("en", "fr"):
        tokens = [[f"<2{lang}>", *source.encode(line, out_type=str)] for line in lines]
        found = [target.decode(r.hypotheses[0]) for r in engine.translate_batch(tokens, **decode)]
        expected = ours.translate(lines, beam=1, tgt_lang=lang)
        assert sum(a == b for a, b in zip(found, expected, strict=True)) >= 11, lang


def test_hf_export_passes_parity_and_reads_marian_language_codes(multi_run: Path, tmp_path):
    transformers = pytest.importorskip("transformers")
    result = invoke("export", "--format", "hf", "--model", multi_run, "--out", tmp_path / "hf",
                    "--beam", "1")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "tokenizer ids identical" in result.output
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "language: [de, en, fr]" in card and "# de-en, de-fr (2 directions) translation" in card
    assert '[">>en<< your sentence here"]' in card and "`>>en<<` for en" in card
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", local_files_only=True)
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf").eval()
    ours = attn_mt.load(multi_run, device="cpu")
    lines = toy_pairs(8, seed=13)[0]
    for lang in ("en", "fr"):
        prefix = ours.language_prefix(lang)
        for line in lines:
            ids = tokenizer(f">>{lang}<< {line}")["input_ids"]
            assert ids == [*prefix, *ours.src_tokenizer.encode([line])[0], EOS_ID]
        batch = tokenizer([f">>{lang}<< {line}" for line in lines], return_tensors="pt",
                          padding=True)  # fmt: skip
        with torch.no_grad():
            generated = model.generate(**batch, num_beams=1, do_sample=False)
        found = tokenizer.batch_decode(generated, skip_special_tokens=True)
        expected = ours.translate(lines, beam=1, tgt_lang=lang)
        assert sum(a == b for a, b in zip(found, expected, strict=True)) >= 7, lang


# ---------------------------------------------------------------------------------------------
# Serving


def test_server_takes_each_target_language(multi_run: Path, tmp_path: Path):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from helpers.serving import start_server

    server = start_server(multi_run, tmp_path)
    try:
        lines = toy_pairs(4, seed=14)[0]
        ours = attn_mt.load(multi_run, device="cpu")
        for lang in ("en", "fr"):
            body = {"text": lines, "tgt_lang": lang, "beam": 2}
            reply = httpx.post(server.url + "/v1/translate", json=body, timeout=60)
            assert reply.json()["translations"] == ours.translate(lines, beam=2, tgt_lang=lang)
        body = {"text": lines[0], "tgt_lang": "fr"}
        drawn = httpx.post(server.url + "/v1/attention", json=body, timeout=60).json()
        assert drawn["translation"] == ours.translate(lines[:1], tgt_lang="fr")[0]
        assert drawn["source"][0] == "<2fr>"  # the tag the model read first
        missing = httpx.post(server.url + "/v1/translate", json={"text": lines}, timeout=60)
        assert missing.status_code in (400, 422) and "en, fr" in missing.json()["error"]
        libre = {"q": lines[0], "source": "de", "target": "fr"}
        found = httpx.post(server.url + "/translate", json=libre, timeout=60).json()
        assert found == {"translatedText": ours.translate(lines[:1], tgt_lang="fr")[0]}
        assert httpx.get(server.url + "/languages", timeout=60).json() == [
            {"code": "de", "name": "German", "targets": ["en", "fr"]},
            {"code": "en", "name": "English", "targets": []},
            {"code": "fr", "name": "French", "targets": []},
        ]
        from helpers.browser import open_page, translate_on

        with open_page(server.url) as page:  # the try-it page offers each target language
            page.wait_for_selector("#into", state="visible")
            page.wait_for_selector("#target option", state="attached")  # /languages answered
            offered = page.eval_on_selector_all("#target option", "os => os.map(o => o.value)")
            shown = {lang: translate_on(page, lines[0], lang) for lang in ("fr", "en")}
        assert offered == ["en", "fr"]
        assert shown == {lang: ours.translate(lines[:1], tgt_lang=lang)[0] for lang in shown}
    finally:
        assert server.stop() == 0
