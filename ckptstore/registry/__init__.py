"""The registry: an index of experiments, trials, metrics, checkpoints and models.

SQLite by default (a file under the per-user ckptstore home, or ``CKPTSTORE_REGISTRY``),
PostgreSQL for teams and many machines. Storage stays the source of truth:
:meth:`Registry.reindex` rebuilds the checkpoint index from a storage.

Example::

    from ckptstore.registry import Registry

    with Registry("postgresql://me@db.internal/ckpts") as registry:
        ckpt = registry.latest_checkpoint(trial_id=3)
        model = registry.get_model("mnist-cnn")
        print(model.get_version("production").checkpoint.uuid)
"""

from ckptstore.registry.entities import Checkpoint, Experiment, MetricRow, Trial, lookup_metric
from ckptstore.registry.models import Model, ModelVersion
from ckptstore.registry.pins import Pin
from ckptstore.registry.registry import Registry, open_registry

__all__ = [
    "Checkpoint",
    "Experiment",
    "MetricRow",
    "Model",
    "ModelVersion",
    "Pin",
    "Registry",
    "Trial",
    "lookup_metric",
    "open_registry",
]
