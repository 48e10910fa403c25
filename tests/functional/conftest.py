import pytest

from tests.functional.actions_helpers import write_config


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    """A config with no default protect patterns (see actions_helpers.write_config)."""
    return write_config(tmp_path / "config.yaml", monkeypatch)
