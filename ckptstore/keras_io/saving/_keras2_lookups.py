"""Keras 2 adapted preprocessing lookups (``StringLookup``, ``IntegerLookup``,
``TextVectorization``) through ``model_config.json``: Keras 2 leaves an adapted vocabulary out of
a layer's config, so the checkpoint puts it there (:func:`with_adapted_vocabularies`) and the
rebuild gives the layer back the weight it had (:func:`model_from_config_json`).

Example::

    text = with_adapted_vocabularies(model, model.to_json())
    rebuilt = model_from_config_json(text)
"""

from __future__ import annotations

import json
from typing import Any

from ckptstore.keras_io._types import KerasModel


def _adapted_vocabulary(layer: Any) -> dict[str, Any] | None:
    """The config entries that rebuild an adapted Keras 2 lookup (``StringLookup``,
    ``IntegerLookup``, ``TextVectorization``) with its vocabulary; None for other layers."""
    import numpy as np

    names = {c.__name__ for c in type(layer).__mro__}
    if not names & {"IndexLookup", "TextVectorization"}:
        return None
    lookup = getattr(layer, "_lookup_layer", layer)
    if getattr(lookup, "_has_input_vocabulary", True):
        return None  # built with a vocabulary: its config has it
    vocabulary = layer.get_vocabulary(include_special_tokens=False)
    if not vocabulary:
        return None  # not adapted
    special = len(layer.get_vocabulary()) - len(vocabulary)
    entries: dict[str, Any] = {
        "vocabulary": [v.decode() if isinstance(v, bytes) else v for v in vocabulary]
        if isinstance(vocabulary[0], (str, bytes))
        else np.asarray(vocabulary).tolist()
    }
    if getattr(lookup, "output_mode", None) == "tf_idf":
        entries["idf_weights"] = np.asarray(lookup.idf_weights)[special:].tolist()
    return entries


def with_adapted_vocabularies(model: KerasModel, config_json: str) -> str:
    """``config_json`` with the vocabulary (and tf-idf weights) of every adapted lookup layer of
    ``model`` put in its layer's config. Keras 2 leaves an adapted vocabulary out of the config
    and a rebuilt layer is called with an empty one; a lookup whose output size depends on it
    (multi_hot, count, one_hot, tf_idf) then refuses the checkpoint's vocabulary ("the
    vocabulary size cannot be changed after the layer is called"), and an "int" lookup's
    table is never filled. Given in the config, the rebuilt layer matches the saved one."""
    flatten = getattr(model, "_flatten_layers", None)
    layers = list(flatten(include_self=False, recursive=True)) if flatten else []
    adapted = {layer.name: e for layer in layers if (e := _adapted_vocabulary(layer)) is not None}
    if not adapted:
        return config_json
    config = json.loads(config_json)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            inner = node.get("config")
            if "class_name" in node and isinstance(inner, dict) and inner.get("name") in adapted:
                inner.update(adapted[inner["name"]])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(config)
    config[ADAPTED_KEY] = sorted(adapted)
    return json.dumps(config)


#: Top-level key of ``model_config.json``: the adapted lookups whose vocabulary was put in
#: their config (:func:`with_adapted_vocabularies`); ``model_from_json`` ignores it.
ADAPTED_KEY = "ckptstore_adapted_lookups"


def model_from_config_json(config_json: str, custom_objects: Any = None) -> KerasModel:
    """``model_from_json`` of a ``model_config.json``, with the adapted lookups as saved.

    A lookup given its vocabulary in the config has no vocabulary weight, which the adapted
    layer that was saved had; its place among the model's layers with weights (how a TensorFlow
    checkpoint names them) would shift every later layer's and their weights would silently not
    load. The weight is given back to the layers :func:`with_adapted_vocabularies` filled in."""
    from ckptstore.keras_io.backend import keras

    model = keras.models.model_from_json(config_json, custom_objects=custom_objects)
    adapted = set(json.loads(config_json).get(ADAPTED_KEY) or ())
    if adapted:
        from tf_keras.src.layers.preprocessing.index_lookup import VocabWeightHandler

        for layer in model._flatten_layers(include_self=False, recursive=True):
            if layer.name in adapted:
                lookup = getattr(layer, "_lookup_layer", layer)
                lookup._add_trackable(VocabWeightHandler(lookup), False)
    return model
