"""TFKerasTrial: the class users subclass to describe a model, its data and its callbacks."""

from __future__ import annotations

import abc
import logging
from typing import Any

from ckptstore.keras_io._types import KerasModel
from ckptstore.keras_io.trial.context import TFKerasTrialContext

logger = logging.getLogger(__name__)


class TFKerasTrial(abc.ABC):
    """A Keras training job that ckptstore runs, checkpoints, resumes and searches over.

    Subclass it and implement :meth:`build_model`, :meth:`build_training_data_loader` and
    :meth:`build_validation_data_loader`; ckptstore calls them, trains in batches as the experiment
    config says (``searcher.max_length``, ``min_validation_period``, ``min_checkpoint_period``),
    and records checkpoints and metrics in the registry.

    Args:
        context: the trial's :class:`TFKerasTrialContext`; keep it as ``self.context``.

    Example::

        import keras
        import ckptstore as det
        from ckptstore.keras import InMemorySequence, TFKerasTrial

        class MNISTTrial(TFKerasTrial):
            def __init__(self, context):
                self.context = context

            def build_model(self):
                model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(10)])
                model = self.context.wrap_model(model)
                model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
                return model

            def build_training_data_loader(self):
                return InMemorySequence(x, y, self.context.get_per_slot_batch_size())

            def build_validation_data_loader(self):
                return InMemorySequence(xv, yv, self.context.get_per_slot_batch_size())

    Run it with ``ckptstore experiment create const.yaml .`` (``entrypoint: model_def:MNISTTrial``).
    """

    #: The class that runs this trial (Determined's ``trial_controller_class``): ckptstore's
    #: ``TrialController``, as ``TrialController(trial_class, core_context, config).run()``. Set by
    #: the package ``ckptstore.keras_io.trial`` (its ``__init__``), which any import of this
    #: module runs first; the controller module is imported when it is first read.
    trial_controller_class: Any = None

    def __init__(self, context: TFKerasTrialContext) -> None:
        self.context = context

    @abc.abstractmethod
    def build_model(self) -> KerasModel:
        """Return a compiled ``keras.Model``, wrapped with ``context.wrap_model()`` before compiling."""

    @abc.abstractmethod
    def build_training_data_loader(self) -> Any:
        """Return training data: ``(x, y)``, ``(x, y, sample_weights)``, inputs only (an array,
        a dict of arrays or ``(x,)``, for a custom ``train_step``), a ``tf.data.Dataset``
        (wrapped with ``context.wrap_dataset``), a ``keras.utils.PyDataset`` (on Keras 2, i.e.
        ``TF_USE_LEGACY_KERAS=1``: a ``tf.keras.utils.Sequence``) or a
        :class:`~ckptstore.keras_io.trial.sequences.SequenceAdapter`."""

    @abc.abstractmethod
    def build_validation_data_loader(self) -> Any:
        """Return validation data, of the same types as the training data."""

    def keras_callbacks(self) -> list[Any]:
        """Keras callbacks to run during training (``ckptstore.keras.callbacks.Callback``
        subclasses get the workload and checkpoint hooks and keep their state across resumes)."""
        return []

    def session_config(self) -> Any:
        """TF1's ``tf.ConfigProto``; accepted for compatibility and ignored under TF2."""
        return None


__all__ = ["TFKerasTrial"]
