"""The viewer loads a tokenizer only from the directories it was given (the run's own `final/`
included) or from the user's `--tokenizer`: a path a run's config names elsewhere (`/etc`,
`../../x`, a symlink out) is not followed, and the page still works with the token view off."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from looprl.viewer.synthetic import build_tokenizer, hf_encoder, write_run
from looprl.viewer.tokens import load_tokenizer


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A tokenizer directory outside every viewed directory."""
    return build_tokenizer(tmp_path_factory.mktemp("elsewhere") / "x")


def _run_naming(root: Path, model: str) -> Path:
    """A one-step run under `root` whose config names `model`."""
    return write_run(root / "run", steps=1, tasks=1, group=1, model=model)


def get(url: str, path: str) -> Any:
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("name", ["/etc", "OUTSIDE", "../../x"])
def test_a_path_a_run_names_outside_the_viewed_directories_is_not_followed(outside, name) -> None:
    named = str(outside) if name == "OUTSIDE" else name
    root = outside.parent / "a" / "b"  # ../../x from the run's folder is `outside`
    run = _run_naming(root, named)
    tok, note = load_tokenizer(run, [run])
    assert tok is None, note
    assert f"{named}: a path outside the viewed directories, not followed" in note
    assert note.endswith("showing token ids")
    tok, note = load_tokenizer(run, [run], user=str(outside))  # the user may name it
    assert tok is not None and note == f"tokenizer from --tokenizer {outside}"


def test_a_final_symlinked_out_of_the_run_is_not_followed(tmp_path, outside) -> None:
    run = _run_naming(tmp_path, "no-such-model")
    (run / "final").symlink_to(outside, target_is_directory=True)
    tok, note = load_tokenizer(run, [run])
    assert tok is None and f"{run / 'final'}: a path outside the viewed directories" in note


def test_the_runs_own_and_the_viewed_folders_tokenizers_are_used(tmp_path, outside) -> None:
    run = _run_naming(tmp_path / "runs", "no-such-model")
    build_tokenizer(run / "final")
    tok, note = load_tokenizer(run, [run])
    assert tok is not None and note == f"tokenizer from {run / 'final'}"
    sibling = build_tokenizer(tmp_path / "runs" / "sft")  # the warm start beside the run
    other = _run_naming(tmp_path / "runs" / "grpo", str(sibling))
    assert load_tokenizer(other, [other])[0] is None  # viewing the run alone: not followed
    tok, note = load_tokenizer(other, [tmp_path / "runs"])  # viewing the folder of runs: followed
    assert tok is not None and note == f"tokenizer from {sibling}"


def test_the_page_works_with_the_token_view_off(viewer_server, tmp_path, outside) -> None:
    run = write_run(
        tmp_path / "r", steps=1, tasks=1, group=1, encode=hf_encoder(outside), model="/etc"
    )
    url = viewer_server(run)
    res = get(url, "api/episode?run=r&file=train:1&i=0&tokens=1")
    assert res["episode"]["messages"] and res["tokens"] == [None]
    assert "/etc: a path outside the viewed directories, not followed" in res["tokenizer"]
    shown = get(
        viewer_server(run, tokenizer=str(outside)), "api/episode?run=r&file=train:1&i=0&tokens=1"
    )
    assert shown["tokens"][0] and shown["tokenizer"] == f"tokenizer from --tokenizer {outside}"
