"""Keras 3's per-type attribute skip sets, computed once per thread instead of once per object.

Every walk of a model's saveables (``load_weights``, ``save_weights``, ckptstore's layout walk)
asks ``keras.src.saving.saving_lib.get_attr_skipset(obj_type)`` for each layer. Keras means to
cache the answer in its global state, but (up to at least Keras 3.15) stores it under
``saving_attr_skipset_<type>`` and looks it up under ``saving_attr_skiplist_<type>``, so it never
finds it: each call builds a throwaway reference ``Layer()`` and lists its attributes. For a
28-layer model that is 28 objects of ~60 Python objects each per walk, left as cyclic garbage
(issue 41: they count towards the next full garbage collection of a resume). The answer depends
only on the type name (it is the attribute list of a fresh base-class object), so
:func:`prime` computes it once for the layer types of a model and :func:`share` stores every
computed set under the name Keras reads, in Keras's own (per-thread) global state. Where Keras
reads the name it writes, both do nothing.

Example::

    prime(model)            # before Keras walks the model
    model.load_weights(path)
    share()                 # the types the walk met (optimizer, metrics) for later walks
"""

from __future__ import annotations

from typing import Any

_WRITTEN = "saving_attr_skipset_"
_READ = "saving_attr_skiplist_"
#: Types whose reference object is a plain ``Layer()`` or ``Operation()`` (no variables made).
_LAYER_TYPES = ("Layer", "Functional", "Sequential", "Operation")


def share() -> None:
    """Store each skip set Keras computed on this thread under the name it looks it up by."""
    try:
        from keras.src.backend.common import global_state
    except ImportError:  # Keras 2 (tf_keras): no such cache
        return
    tracker = global_state.GLOBAL_STATE_TRACKER
    for name, value in list(vars(tracker).items()):
        if name.startswith(_WRITTEN) and value is not None:
            alias = _READ + name[len(_WRITTEN) :]
            if getattr(tracker, alias, None) is None:
                setattr(tracker, alias, value)


def prime(model: Any) -> None:
    """Compute the skip sets of ``model``'s own layer types once (a reference ``Layer()`` each)
    and :func:`share` them, so that a walk of ``model`` builds none."""
    try:
        from keras.src.saving import saving_lib
    except ImportError:
        return
    flatten = getattr(model, "_flatten_layers", None)
    layers = list(flatten(include_self=True)) if callable(flatten) else [model]
    types = set()
    for layer in layers:
        obj_type = getattr(layer, "_obj_type", None)
        try:
            name = obj_type() if callable(obj_type) else None
        except NotImplementedError:
            name = None
        if name in _LAYER_TYPES:
            types.add(name)
    for name in sorted(types):
        saving_lib.get_attr_skipset(name)
    share()


__all__ = ["prime", "share"]
