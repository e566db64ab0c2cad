"""Shared helpers for CLI tests: a storage + registry pair and a CliRunner wrapper."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from click.testing import CliRunner, Result

from ckptstore.checkpointing import CheckpointContext
from ckptstore.cli.main import cli
from ckptstore.registry import Registry
from tests.checkpointing._helpers import corrupt_stored


@dataclasses.dataclass
class Env:
    storage_url: str
    registry_url: str
    workdir: str

    def run(self, *args: str, input: str | None = None) -> Result:
        """``ckptstore --storage S --registry R ARGS...`` in-process."""
        runner = CliRunner()
        return runner.invoke(
            cli,
            ["--storage", self.storage_url, "--registry", self.registry_url, *args],
            input=input,
            catch_exceptions=True,
        )

    def json(self, *args: str) -> Any:
        result = self.run(*args, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def corrupt(self, uuid: str, rel: str) -> None:
        """Flip the first byte of stored file ``rel`` of a local checkpoint (see
        :func:`tests.checkpointing._helpers.corrupt_stored`)."""
        corrupt_stored(self.storage_url, uuid, rel)

    def registry(self) -> Registry:
        return Registry(self.registry_url)

    def save(
        self,
        trial_id: int,
        steps: int,
        *,
        experiment_id: int | None = None,
        metrics: dict | None = None,
        files: dict[str, bytes] | None = None,
    ) -> str:
        """Commit a small checkpoint through the real CheckpointContext + Registry."""
        folder = os.path.join(self.workdir, f"src-{trial_id}-{steps}")
        files = files or {
            "model.keras": os.urandom(2048),
            "extra/notes.txt": b"hello",
            "saved_model/x.pb": b"pb",
        }
        for rel, data in files.items():
            path = os.path.join(folder, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        with Registry(self.registry_url) as registry:
            context = CheckpointContext(
                self.storage_url, index=registry, trial_id=trial_id, experiment_id=experiment_id
            )
            try:
                meta = {"steps_completed": steps, "metrics": metrics or {}}
                return context.upload(folder, meta)
            finally:
                context.close()


def make_env(tmp_path, storage_url: str | None = None) -> Env:
    storage = storage_url or str(tmp_path / "store")
    return Env(storage, f"sqlite:///{tmp_path / 'reg.db'}", str(tmp_path))
