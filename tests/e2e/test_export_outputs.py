"""What an export leaves the machine with, and where it writes: the model card and README
name the checkpoint by its file name (never the training machine's paths) and carry a license
and limitations; a `--out` that is a link to a folder is exported through, the link kept."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import yaml
from helpers.workspace import Stdin, World, run_cli

pytest.importorskip("transformers")


@pytest.fixture
def folder(world: World) -> Path:
    return Path(tempfile.mkdtemp(dir=world.root, prefix="export."))


def export_hf(world: World, out: Path, *extra: str):
    from attn_mt.export import hf_parity

    args = ["export", "--format", "hf", "--model", world.run, "--out", out, "--beam", "1"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hf_parity, "PARITY_SOURCES", 2)  # the parity itself is tested elsewhere
        return run_cli([*args, *extra], Stdin(), {"ATTN_MT_OFFLINE": "1"})


def test_hf_card_names_files_and_states_license_and_limitations(world: World, folder: Path) -> None:
    result = export_hf(world, folder / "hf", "--license", "Apache-2.0")
    assert result.returncode == 0, result.stderr.decode()
    card = (folder / "hf" / "README.md").read_text()
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["license"] == "Apache-2.0"
    assert "## License" in card and "`Apache-2.0`" in card and "## Limitations" in card
    assert "`best.pt`" in card
    for local in (str(world.root), str(folder), os.path.expanduser("~") + "/"):
        assert local not in card, f"{local} in the card"


def test_hf_license_defaults_to_unknown_and_is_one_word(world: World, folder: Path) -> None:
    assert export_hf(world, folder / "hf").returncode == 0
    card = (folder / "hf" / "README.md").read_text()
    assert yaml.safe_load(card.split("---\n")[1])["license"] == "unknown"
    refused = export_hf(world, folder / "other", "--license", "MIT\nlibrary_name: evil")
    assert refused.returncode == 2 and b"not an SPDX license identifier" in refused.stderr
    assert not (folder / "other").exists()


def test_hf_export_through_a_linked_folder_keeps_the_link(world: World, folder: Path) -> None:
    (folder / "real").mkdir()
    (folder / "real" / "old.txt").write_text("an earlier export\n")
    (folder / "hf").symlink_to(folder / "real")
    result = export_hf(world, folder / "hf", "--force")
    assert result.returncode == 0, result.stderr.decode()
    assert (folder / "hf").is_symlink() and os.readlink(folder / "hf") == str(folder / "real")
    assert (folder / "real" / "config.json").is_file() and not (
        folder / "real" / "old.txt"
    ).exists()
    assert sorted(os.listdir(folder)) == ["hf", "real"]  # no staging folder left


def test_ct2_readme_names_files_and_states_the_license(world: World, folder: Path) -> None:
    pytest.importorskip("ctranslate2")
    args = ["export", "--model", world.run, "--out", folder / "ct2", "--license", "MIT"]
    result = run_cli(args, Stdin(), {"ATTN_MT_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr.decode()
    readme = (folder / "ct2" / "README.txt").read_text()
    assert "best.pt" in readme and "MIT" in readme and str(folder) not in readme
