import pytest

from tests.cli.helpers import Env, make_env


@pytest.fixture
def env(tmp_path) -> Env:
    """Local storage + SQLite registry in tmp_path."""
    return make_env(tmp_path)
