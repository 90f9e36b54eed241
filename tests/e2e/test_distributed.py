"""DDP under torchrun on the CPU: gloo, two processes, a tiny model, a few updates.

The corpus makes an odd number of batches per epoch, so the ranks' shares are cut at every epoch
end. Four torchrun launches are shared by the tests:
- `straight`: 3 epochs in one go (tests/ddp_worker.py dumps each rank's parameters and batches);
- `stopped`: the same config, stopped by a SIGTERM to torchrun in epoch 1, then resumed with
  `torchrun --no-python attn-mt train --resume` to the same end;
- `one_epoch`: `torchrun -m attn_mt train` for one epoch without dropout, the twin of a single
  process that accumulates two batches per update.
Every shipped config trains too, tiny and short: all but the WMT14 base preset in one launch
(the worker runs each `attn-mt train` in turn), the base preset on two simulated machines.
Every launch runs on the CPU (gloo): `attn-mt train` gets `--device cpu`, the worker pins it, as
`auto` would pick CUDA on a machine with a GPU (one GPU for two ranks, or NCCL against gloo).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

import pytest
import torch
import yaml
from helpers import REPO
from helpers.ddp_worker import COMMAND_MARK, record_batches
from helpers.toy import epoch_lists, toy_config_dict, toy_pairs, write_lines
from helpers.workspace import run_cli

import attn_mt
from attn_mt.checkpoint import load_checkpoint
from attn_mt.config.file import config_from_dict, load_config
from attn_mt.data.prepare import plan, prepare_shards
from attn_mt.data.shards import MANIFEST
from attn_mt.data.text import read_lines
from attn_mt.train.setup import setup

pytestmark = pytest.mark.slow

WORKER = REPO / "tests" / "helpers" / "ddp_worker.py"
BIN = Path(sys.executable).parent  # the virtualenv's torchrun and attn-mt
RANKS = 2
BATCHES = 9  # an epoch of the corpus below: odd, so one batch is left over at every epoch end
PER_RANK = BATCHES // RANKS
EPOCHS = 3
STEPS = EPOCHS * PER_RANK
SIGTERM_AT = PER_RANK + 2  # inside epoch 1
ON_CPU = ("--device", "cpu")  # gloo on the CPU, as on a machine without a GPU
TRAIN = {
    "batch_tokens": 384,  # 200 toy pairs -> BATCHES batches
    "max_steps": 0,
    "max_epochs": EPOCHS,
    "warmup": 1,  # full-size updates from the start, so parameters move well beyond tolerance
    "log_every": 1,
    "eval_every": 1000,
    "threads": 1,  # two processes on a small machine: no oversubscription
}


def torchrun(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """`torchrun --standalone` (a free port on localhost) with `args`; output captured."""
    assert "train" not in args or args[-2:] == ON_CPU, "pin the device: auto picks a GPU"
    return subprocess.run(
        [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={RANKS}", *args],
        cwd=REPO,
        env=torchrun_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def torchrun_env(**extra: str) -> dict[str, str]:
    """The environment of a torchrun launch: the virtualenv's commands first on PATH, one
    thread a process (two processes on a small machine), and `extra`."""
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "OMP_NUM_THREADS": "1", **extra}


def torchrun_machines(*args: str, caches: list[str]) -> list[subprocess.CompletedProcess]:
    """One torchrun per simulated machine on localhost, each with one process and its own cache
    folder (`ATTN_MT_CACHE`), joined by the static rendezvous on a free port, as on real
    machines: `--nnodes`, `--node-rank` and rank 0's machine as the master. Output captured."""
    assert args[-2:] == ON_CPU, "pin the device: auto picks a GPU"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    launches = []
    for node, cache in enumerate(caches):
        command = [
            str(BIN / "torchrun"), f"--nnodes={len(caches)}", f"--node-rank={node}",
            "--nproc_per_node=1", "--master-addr=127.0.0.1", f"--master-port={port}", *args,
        ]  # fmt: skip
        env = torchrun_env(ATTN_MT_CACHE=cache)
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        launches.append(subprocess.Popen(command, cwd=REPO, env=env, text=True, **pipes))
    done = []
    for launch in launches:
        stdout, stderr = launch.communicate(timeout=180)
        done.append(subprocess.CompletedProcess(launch.args, launch.returncode, stdout, stderr))
    return done


def check(proc: subprocess.CompletedProcess) -> None:
    output = proc.stdout[-2000:] + proc.stderr[-6000:]
    assert proc.returncode == 0, f"torchrun exited with {proc.returncode}:\n{output}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ddp")


@pytest.fixture(scope="module")
def data(folder: Path) -> dict[str, Path]:
    """A small toy corpus: 200 training pairs, a few validation and test pairs."""
    files = {}
    for split, count, seed in (("train", 200, 11), ("valid", 6, 12), ("test", 6, 13)):
        src, tgt = toy_pairs(count, seed)
        files[f"{split}.src"] = write_lines(folder / f"{split}.src", src)
        files[f"{split}.tgt"] = write_lines(folder / f"{split}.tgt", tgt)
    return files


def write_config(data: dict[str, Path], folder: Path, name: str, dropout: float, **train) -> Path:
    raw = toy_config_dict(data, folder / name, **{**TRAIN, **train})
    raw["model"]["dropout"] = dropout
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def train_lines(run: Path) -> list[dict[str, Any]]:
    """The `train` lines of a run's metrics.jsonl."""
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if line["split"] == "train"]


def dumps(out: Path) -> list[dict[str, Any]]:
    """What tests/ddp_worker.py saved for each rank."""
    return [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(RANKS)]


@pytest.fixture(scope="module")
def straight(data: dict[str, Path], folder: Path) -> tuple[Path, list[dict[str, Any]]]:
    """Three epochs with dropout in one torchrun launch: (run folder, per-rank dumps)."""
    config = write_config(data, folder, "straight", dropout=0.1)
    check(torchrun(str(WORKER), str(config), str(folder / "straight-dumps")))
    return folder / "straight", dumps(folder / "straight-dumps")


class Stopped(NamedTuple):
    config: Path
    run: Path
    ranks: list[dict[str, Any]]  # what each rank's worker saved once run() returned
    last_step: int  # of last.pt right after the stop (the resume test moves it on)
    log: str  # train.log right after the stop
    stderr: str  # torchrun's


@pytest.fixture(scope="module")
def stopped(data: dict[str, Path], folder: Path) -> Stopped:
    """The `straight` config, stopped by SIGTERM to torchrun in epoch 1."""
    config = write_config(data, folder, "stopped", dropout=0.1)
    proc = torchrun(
        str(WORKER), str(config), str(folder / "stopped-dumps"), f"--sigterm-at={SIGTERM_AT}"
    )
    run = folder / "stopped"
    return Stopped(
        config,
        run,
        dumps(folder / "stopped-dumps"),  # present only if no rank was killed
        load_checkpoint(run / "checkpoints" / "last.pt")["step"],
        (run / "train.log").read_text(),
        proc.stderr,
    )


def test_ranks_end_with_identical_parameters(straight):
    _, (rank0, rank1) = straight
    assert rank0["world_size"] == rank1["world_size"] == RANKS
    assert rank0["params"].keys() == rank1["params"].keys()
    for name, value in rank0["params"].items():
        assert torch.equal(value, rank1["params"][name]), name


def test_no_update_waits_for_the_token_count_before_its_forward(straight):
    """The token count that normalises the loss is all-reduced without waiting, started just
    before the update's first forward pass; the one blocking all-reduce of an update comes
    after its backward (the loss sums and stop flags; the stopping rules' own one only at the
    start and after validations)."""
    for rank in straight[1]:
        events, steps = rank["events"], rank["step"]
        assert events.count("forward") == steps  # accumulate 1
        started = [(a, b) for a, b in zip(events, events[1:], strict=False) if a.endswith("async")]
        assert started == [("all_reduce_async", "forward")] * steps, events
        assert events.count("all_reduce") <= steps + 2, events  # it was two an update


def test_validation_search_is_shared_and_equals_one_process(straight):
    """Each rank searches half of the validation sentences; the output gathered for BLEU is
    what one process translating them all with the checkpoint's weights gives."""
    run, ranks = straight
    sentences = ranks[0]["sentences"][-1]  # the final validation's
    assert len(sentences) == 6
    for rank, dump in enumerate(ranks):
        assert dump["sentences"][-1] == sentences
        assert max(dump["searched"]) == len(sentences[rank::RANKS])  # its share, never all
    translator = attn_mt.load(run / "checkpoints" / "last.pt", device="cpu")
    alone = translator.translate(sentences, beam=1)  # train.eval_beam
    assert ranks[0]["hyps"][-1] == ranks[1]["hyps"][-1] == alone


def test_ranks_take_disjoint_shares_of_one_seeded_order(straight):
    _, ranks = straight
    cfg = load_checkpoint(straight[0] / "checkpoints" / "last.pt")["config"]["train"]
    lengths = [tuple(pair) for pair in ranks[0]["lengths"]]
    for epoch in range(EPOCHS):
        everything = epoch_lists(lengths, cfg["batch_tokens"], cfg["seed"], epoch)
        assert len(everything) == BATCHES
        taken = [[ids for e, ids in rank["rows"] if e == epoch] for rank in ranks]
        for rank, batches in enumerate(taken):  # rank r takes batches r, r + 2, r + 4, ...
            assert batches == everything[rank : PER_RANK * RANKS : RANKS]
        rows = [i for batches in taken for ids in batches for i in ids]
        assert len(rows) == len(set(rows)), "a sentence was trained on twice in one epoch"
    assert all(rank["step"] == STEPS for rank in ranks)
    assert all(rank["stopped_by"] == "max_epochs" for rank in ranks)


def test_only_rank_zero_writes(straight):
    run, _ = straight
    assert len(list((run / "tb").iterdir())) == 1, "one TensorBoard event file, not one per rank"
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    keys = [(line["split"], line["step"]) for line in lines]
    assert len(keys) == len(set(keys)), "a metrics.jsonl line was written twice"
    assert [step for split, step in keys if split == "train"] == list(range(1, STEPS + 1))
    log = (run / "train.log").read_text()
    assert "2 process(es)" in log
    assert log.count(f"finished at step {STEPS} ") == 1
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["best.pt", "last.pt"]


def test_the_process_group_is_freed_when_the_run_ends(straight):
    """No DistributedDataParallel wrapper (which holds the process group) outlives the run: a
    group freed only at the interpreter's shutdown aborted a rank after a finished run
    (`terminate called without an active exception`, SIGABRT; torchrun exit 1, seen in CI)."""
    assert [rank["wrappers_after_teardown"] for rank in straight[1]] == [0] * RANKS


def test_ddp_checkpoint_translates_in_one_process(straight):
    run, _ = straight
    state = load_checkpoint(run / "checkpoints" / "last.pt")
    assert state["train_state"]["data"]["world_size"] == RANKS
    assert not any(key.startswith("module.") for key in state["model"])
    translator = attn_mt.load(run / "checkpoints" / "best.pt", device="cpu")
    assert len(translator.translate(["qb qc qd", "", "qz"], beam=2)) == 3


def test_sigterm_to_torchrun_stops_every_rank_cleanly(stopped):
    stops = [(rank["step"], rank["stopped_by"]) for rank in stopped.ranks]
    assert stops == [(SIGTERM_AT, "signal")] * RANKS, stopped.stderr[-3000:]
    assert stopped.last_step == SIGTERM_AT
    assert f"stopped by SIGTERM at step {SIGTERM_AT}" in stopped.log


def test_resume_under_ddp_ends_where_a_straight_run_does(stopped, straight):
    """Resumed with the console script: the same parameters, bit for bit, as without a stop
    (dropout on, so every rank's own RNG stream must come back)."""
    run = stopped.run
    check(
        torchrun(
            "--no-python", "attn-mt", "train", "--config", str(stopped.config), "--resume", *ON_CPU
        )
    )
    resumed = load_checkpoint(run / "checkpoints" / "last.pt")
    reference = load_checkpoint(straight[0] / "checkpoints" / "last.pt")
    assert resumed["step"] == reference["step"] == STEPS
    for name, value in reference["model"].items():
        assert torch.equal(value, resumed["model"][name]), name
    assert [line["step"] for line in train_lines(run)] == list(range(1, STEPS + 1))
    rng = resumed["train_state"]["rng"]  # the ranks' streams differ: each needs its own
    assert len(rng) == RANKS and not torch.equal(rng[0][0], rng[1][0])


def test_two_ranks_equal_one_rank_accumulating_two(data, folder, straight):
    """One epoch on two ranks (`python -m attn_mt` under torchrun) and one process taking the
    same batches two at a time reach the same parameters: the loss is normalised over both.
    Logged every other update, so that odd updates are read one update later (with the stop
    flags that travel with them); the validation loss alone after every update, which rank 0
    computes while rank 1 waits for it in the next all-reduce."""
    config = write_config(
        data, folder, "one-epoch", dropout=0.0, max_epochs=1, log_every=2, valid_loss_every=1
    )
    check(torchrun("-m", "attn_mt", "train", "--config", str(config), *ON_CPU))
    ddp = load_checkpoint(folder / "one-epoch" / "checkpoints" / "last.pt")

    raw = yaml.safe_load(config.read_text())
    raw["train"].update(out_dir=str(folder / "single"), accumulate=2, max_epochs=0)
    raw["train"]["max_steps"] = ddp["step"]
    trainer = setup(config_from_dict(raw))
    taken = record_batches(trainer)
    initial = {name: value.clone() for name, value in trainer.model.state_dict().items()}
    trainer.run()

    # Update k: the single process takes [b2k, b2k+1]; rank r takes b2k+r (same seeded order).
    rank0, rank1 = ([ids for epoch, ids in rank["rows"] if epoch == 0] for rank in straight[1])
    assert [ids for _, ids in taken[0::2]] == rank0
    assert [ids for _, ids in taken[1::2]] == rank1
    moved = 0.0
    for name, value in trainer.model.state_dict().items():
        # Sums in another order (all-reduce, thread counts) may differ in the last bits.
        torch.testing.assert_close(ddp["model"][name], value, rtol=0, atol=1e-6, msg=name)
        moved = max(moved, float((value - initial[name]).abs().max()))
    assert moved > 1e-3, "the parameters should move far beyond the tolerance"
    # Adam hides a constant factor in the gradients; the logged loss and norm do not.
    ddp_log, single_log = (train_lines(folder / name) for name in ("one-epoch", "single"))
    assert [r["step"] for r in ddp_log] == [r["step"] for r in single_log] == [2, 4]
    assert ddp["step"] == 4
    records = [json.loads(ln) for ln in (folder / "one-epoch" / "metrics.jsonl").open()]
    # Not 4, though the end of the epoch is not known when update 4 is read: the loss alone
    # waits for the next stop check, and the run's last validation has it.
    checks = [(r["step"], r["split"]) for r in records if r["split"] != "train"]
    assert checks == [(1, "valid_loss"), (2, "valid_loss"), (3, "valid_loss"), (4, "valid")]
    for ours, theirs in zip(ddp_log, single_log, strict=True):
        for key in ("loss", "ppl", "grad_norm"):
            assert ours[key] == pytest.approx(theirs[key], rel=1e-5), (ours["step"], key)


def test_ddp_run_resumes_in_one_process(straight, folder):
    """A checkpoint of two processes resumes in one, at the same place in the epoch order."""
    run = folder / "single-resume"
    shutil.copytree(straight[0], run)
    raw = yaml.safe_load((run / "config.yaml").read_text())
    raw["train"].update(out_dir=str(run), max_epochs=EPOCHS + 1)
    result = setup(config_from_dict(raw), resume=True).run()
    # The batch the two processes left over at the end of epoch 2, then all of epoch 3.
    assert result.step == STEPS + 1 + BATCHES
    assert "resuming a 2-process run with 1 processes" in (run / "train.log").read_text()


def test_a_user_error_on_rank_zero_stops_every_rank(data, folder):
    """Rank 0 alone checks the run folder, before torch is imported: its one line ends the run
    and torchrun stops the other ranks, which wait for it, instead of a hang."""
    config = write_config(data, folder, "nothing-yet", dropout=0.0)
    proc = torchrun("-m", "attn_mt", "train", "--config", str(config), "--resume", *ON_CPU)
    assert proc.returncode != 0
    assert proc.stderr.count("attn-mt: error: ") == 1, proc.stderr[-3000:]
    assert "nothing to resume" in proc.stderr
    assert "Traceback" not in proc.stderr.split("attn-mt: error: ")[0]


MULTI30K = sorted((REPO / "configs").glob("multi30k_*.yaml"))
WMT_PRESETS = sorted((REPO / "configs").glob("wmt14_*.yaml"))
TWO_MACHINES = "wmt14_en_de_base"  # the preset trained on two simulated machines
# A shipped config as shipped (its schedule, time budget, validation and checkpoints) but for a
# tiny model, a short budget (3 s of max_minutes, or 20 max_steps, whichever it sets) and 2
# validation sentences (a direction's), one for each rank to search.
TINY_AND_SHORT = {
    "model.d_model": 32,
    "model.heads": 2,
    "model.encoder_layers": 1,
    "model.decoder_layers": 1,
    "model.d_ff": 64,
    "tokenizer.vocab_size": 400,
    "tokenizer.max_sentences": 4000,
    "train.valid_max_sentences": 2,
    "train.eval_every": 10,
    "train.threads": 1,
}
# A WMT14 preset's updates: 6, a checkpoint kept at 3 and 6, the loss alone at 2 and 4. Not
# compiled: Inductor's C++ build would take most of a minute here; compiled DDP is
# tests/unit/train/test_compile.py's.
WMT_SHORT = {
    "train.max_steps": 6,
    "train.eval_every": 3,
    "train.valid_loss_every": 2,
    "train.compile": "false",
}


def shipped_overrides(config: Path, wmt_like: dict[str, Path]) -> dict[str, Any]:
    """The overrides that make `config` tiny and short: a Multi30k config keeps its kind of
    budget; a WMT14 preset reads `wmt_like`'s files and makes 6 updates."""
    if config in WMT_PRESETS:
        files = {f"data.{split}.{side}": wmt_like[f"{name}.{lang}"]
                 for split, name in (("train", "train"), ("valid", "newstest2013"),
                                     ("test", "newstest2014"))
                 for side, lang in (("src", "en"), ("tgt", "de"))}  # fmt: skip
        return {**TINY_AND_SHORT, **files, **WMT_SHORT}
    shipped_train = yaml.safe_load(config.read_text())["train"]
    budget = {"train.max_steps": 20} if shipped_train.get("max_steps") else {}
    if shipped_train.get("max_minutes"):
        budget["train.max_minutes"] = 0.05
    return {**TINY_AND_SHORT, **budget}


def prepared_train(config: Path, overrides: dict[str, Any], run: Path) -> list[str]:
    """The `attn-mt train` arguments that train `config` with `overrides` into `run`, its data
    prepared first, as `attn-mt prepare` makes it (here in this process, which has torch
    imported already: the budget counts start-up, and six corpora's took all of it on a loaded
    machine, a final validation at step 0 and no update)."""
    settings = [f"{k}={v}" for k, v in {**overrides, "train.out_dir": run}.items()]
    prepare_shards(load_config(config, settings, training=False), workers=1, repair=True)
    sets = [arg for setting in settings for arg in ("--set", setting)]
    return ["train", "--config", str(config), *sets, *ON_CPU]


def check_quiet(proc: subprocess.CompletedProcess) -> None:
    """A launch of shipped configs ended well and warned of nothing: on the torch CI installs
    (torch 2.13 deprecated DDP's `broadcast_buffers` with a warning per rank)."""
    check(proc)
    assert "warning" not in proc.stderr.lower(), proc.stderr[-3000:]


def check_trained(run: Path, stderr: str) -> None:
    """The run read the data prepared for it (not preparing it again), made 2 updates or more
    and kept its best checkpoint; `stderr`: rank 0's while it ran."""
    assert "is up to date" in stderr, f"{run.name}: the run prepared its data again"
    steps = [line["step"] for line in train_lines(run)]
    assert steps and steps[-1] >= 2, f"{run.name}: too few updates:\n{stderr[-3000:]}"
    assert (run / "checkpoints" / "best.pt").is_file(), run.name


def check_average_and_evaluate(run: Path) -> None:
    """A WMT14 preset's documented end: the kept step_N.pt averaged, the average evaluated on
    the test set with the preset's beam."""
    assert "(loss only)" in (run / "train.log").read_text(), run.name
    kept = sorted((run / "checkpoints").glob("step_*.pt"))
    assert [p.name for p in kept] == ["step_3.pt", "step_6.pt"], run.name
    average = run / "avg.pt"
    averaged = run_cli(["average", "--out", average, *kept], stdin=None, env={})
    assert averaged.returncode == 0, averaged.stderr.decode()[-2000:]
    scored = run_cli(["evaluate", "--model", average, "--split", "test", "--json"], None, {})
    assert scored.returncode == 0, scored.stderr.decode()[-2000:]
    score = json.loads(scored.stdout)
    assert score["sentences"] == 20 and score["beam"] == 4, run.name  # the preset's beam


@pytest.fixture(scope="module")
def wmt_like(folder: Path) -> dict[str, Path]:
    """Multi30k's en-de standing in for WMT14's files, laid out as the presets read them:
    6,000 training pairs gzipped, newstest as plain lines (20 of them for the test set)."""
    if not os.environ.get("ATTN_MT_DATA"):
        pytest.fail("set ATTN_MT_DATA to the folder holding multi30k/ (CI: ../shared/data)")
    multi30k = Path(os.environ["ATTN_MT_DATA"]) / "multi30k"
    files = {}
    for lang in ("en", "de"):
        train, valid = (read_lines(multi30k / f"{split}.{lang}.gz") for split in ("train", "val"))
        files[f"train.{lang}"] = folder / f"train.{lang}.gz"
        files[f"train.{lang}"].write_bytes(
            gzip.compress("".join(f"{line}\n" for line in train[:6000]).encode())
        )
        files[f"newstest2013.{lang}"] = write_lines(folder / f"newstest2013.{lang}", valid)
        files[f"newstest2014.{lang}"] = write_lines(folder / f"newstest2014.{lang}", valid[:20])
    return files


def test_every_shipped_config_trains_under_torchrun(wmt_like, tmp_path):
    """Each shipped Multi30k config and WMT14 preset (but the base preset, on two machines
    below) trains on two processes and finishes; a WMT14 preset, as shipped (its batch,
    accumulation, schedule, loss-only checks, validation subset and kept checkpoints) but for a
    tiny model, WMT-like files and 6 updates, then reaches its documented end (the kept
    checkpoints averaged, the average evaluated). One torchrun launch runs every
    `attn-mt train` in turn (tests/helpers/ddp_worker.py --commands), each with its own process
    group and run folder, as a launch of its own would: the two processes start, and import
    torch, once instead of once a config."""
    configs = [path for path in MULTI30K + WMT_PRESETS if path.stem != TWO_MACHINES]
    commands = [
        prepared_train(path, shipped_overrides(path, wmt_like), tmp_path / path.stem)
        for path in configs
    ]
    listed = tmp_path / "commands.json"
    listed.write_text(json.dumps(commands))
    proc = torchrun(str(WORKER), "--commands", str(listed), timeout=600)
    ran = proc.stderr.split(COMMAND_MARK)[1:]  # rank 0's stderr, command by command
    if ran and proc.returncode:  # the config whose command failed
        raise AssertionError(
            f"{configs[len(ran) - 1].stem}: exit {proc.returncode}\n{ran[-1][-6000:]}"
        )
    check_quiet(proc)
    assert len(ran) == len(configs), proc.stderr[-3000:]
    for path, stderr in zip(configs, ran, strict=True):
        check_trained(tmp_path / path.stem, stderr)
        if path in WMT_PRESETS:
            check_average_and_evaluate(tmp_path / path.stem)


def test_wmt14_base_trains_on_two_machines_averages_and_evaluates(wmt_like, tmp_path):
    """The WMT14 base preset, as the test above trains the others, on two simulated machines
    (`torchrun_machines`), the second of which prepares its own copy of the data; then its
    documented end."""
    [preset] = [path for path in WMT_PRESETS if path.stem == TWO_MACHINES]
    run, overrides = tmp_path / "run", shipped_overrides(preset, wmt_like)
    args = ("-m", "attn_mt", *prepared_train(preset, overrides, run))
    second = tmp_path / "second-machine-cache"
    procs = torchrun_machines(*args, caches=[os.environ["ATTN_MT_CACHE"], str(second)])
    for proc in procs:
        check_quiet(proc)
    cfg = load_config(preset, [f"{k}={v}" for k, v in overrides.items()], training=False)
    with mock.patch.dict(os.environ, {"ATTN_MT_CACHE": str(second)}):
        assert (plan(cfg).folder / MANIFEST).is_file(), "the second machine prepared nothing"
    check_trained(run, procs[0].stderr)
    check_average_and_evaluate(run)
