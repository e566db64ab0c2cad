"""The documentation site builds with ``mkdocs build --strict``: a broken link, a missing page or
an API reference to a renamed object (mkdocstrings) fails here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.docs.examples import ROOT

mkdocs_config = pytest.importorskip("mkdocs.config", reason="pip install -e '.[docs]'")


def test_site_builds_strictly_with_generated_references(tmp_path: Path) -> None:
    from mkdocs.commands.build import build

    from ckptstore import errors

    cwd = os.getcwd()
    os.chdir(ROOT)  # mkdocstrings and the hooks resolve paths from the repository
    try:
        config = mkdocs_config.load_config(
            str(ROOT / "mkdocs.yml"), strict=True, site_dir=str(tmp_path / "site")
        )
        build(config)
    finally:
        os.chdir(cwd)
    site = tmp_path / "site"
    cli = (site / "reference/cli/index.html").read_text()
    for command in ("ckptstore-checkpoint-list", "ckptstore-experiment-create", "ckptstore-gc"):
        assert f'id="{command}"' in cli, command
    errors_page = (site / "reference/errors/index.html").read_text()
    assert all(name in errors_page for name in errors.__all__)
    config_page = (site / "reference/config/index.html").read_text()
    assert "searcher" in config_page and "checkpoint_storage" in config_page
    assert "DeterminedCallback" in (site / "reference/api/keras/index.html").read_text()
