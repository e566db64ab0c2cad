"""The new Keras API: ``context = ckptstore.keras.init()`` and ``context.fit(model, ...)`` —
distribution, data sharding, checkpoints and resume set up from the trial's environment.

Example::

    import ckptstore as det

    with det.keras.init() as context:
        context.fit(model, x=x, y=y, epochs=5)
"""

from ckptstore.keras_io.context._context import KerasContext, init

__all__ = ["KerasContext", "init"]
