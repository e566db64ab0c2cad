"""Everything that imports Keras, by concern (each sub-package's ``__init__`` is its public list;
the code is in private ``_x.py`` modules). Users import :mod:`ckptstore.keras`, not this.

- :mod:`.backend`: which Keras runs (Keras 3, or Keras 2 with ``TF_USE_LEGACY_KERAS=1``);
- :mod:`.fit`: ``DeterminedCallback``, its state, stateful callbacks, TensorBoard;
- :mod:`.saving`: snapshot, archive and checkpoint writer, tensor-bundle cuts, the Keras 2 format;
- :mod:`.exporting`: SavedModel exports (policy, worker process, ``export_checkpoint``);
- :mod:`.loading`: models from checkpoints;
- :mod:`.data`: resumable input for both Kerases;
- :mod:`.trial`: ``TFKerasTrial``, its controller and per-trial worker;
- :mod:`.context`: the new Keras API (``ckptstore.keras.init()``).

Importing this package imports nothing.
"""
