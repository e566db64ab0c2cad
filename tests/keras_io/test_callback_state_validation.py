"""``callback_state.json`` is checked whole before any value is applied (issue 27, finding 9):
wrong types, NaN/inf, negative or huge counters, missing keys, malformed RNG states and
non-objects are refused with InvalidCheckpoint; what ckptstore writes reads back."""

from __future__ import annotations

import base64
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptstore import errors
from ckptstore.keras_io.fit import _callback_state as state_lib

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
#: Never a valid counter: wrong type, NaN/inf, negative, beyond int64.
BAD_COUNT = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
    st.lists(JSON_SCALARS, max_size=2),
)


def _not(*types: type) -> st.SearchStrategy:
    return JSON.filter(
        lambda v: not isinstance(v, types) or (bool not in types and isinstance(v, bool))
    )


#: Per field, values that field must refuse.
BAD = {
    "epoch": BAD_COUNT,
    "steps_completed": BAD_COUNT,
    "version": BAD_COUNT | st.integers(min_value=state_lib.STATE_VERSION + 1),
    "epoch_complete": _not(bool),
    "callbacks": _not(dict),
    "rng": _not(dict),
    "extra_variables": _not(dict),
    "data": _not(dict, type(None)),
    "metrics_variables": _not(list, type(None)),
    "layer_states": _not(list, type(None)),
}
RNG_KEYS = ("python", "numpy", "tensorflow", "keras_global_seed", "torch")


@pytest.fixture(scope="module")
def good() -> dict:
    """A real state as DeterminedCallback writes it (the RNG states of this process)."""
    state = state_lib.TrainingState(epoch=3, steps_completed=120, continue_id=7)
    state.rng = state_lib.capture_rng()
    state.rng.setdefault("tensorflow", {"state": [1, 2, 3], "algorithm": 1})
    state.rng.setdefault("keras_global_seed", [0, 1337])
    state.rng.setdefault("torch", base64.b64encode(bytes(state_lib.TORCH_RNG_BYTES)).decode())
    return json.loads(state.to_json())


def test_a_state_ckptstore_wrote_reads_back(good, tmp_path):
    state = state_lib.TrainingState.from_json(json.dumps(good))
    assert (state.epoch, state.steps_completed, state.continue_id) == (3, 120, 7)
    (tmp_path / state_lib.STATE_FILENAME).write_text(json.dumps(good))
    assert state_lib.read_state(str(tmp_path)).rng == good["rng"]


def _int_list(value) -> bool:
    return isinstance(value, list) and all(type(v) is int for v in value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_malformed_states_are_refused_before_use(good, data):
    doc = json.loads(json.dumps(good))
    kind = data.draw(st.sampled_from(["field", "missing", "rng", "not-an-object"]))
    if kind == "field":
        name = data.draw(st.sampled_from(sorted(BAD)))
        doc[name] = data.draw(BAD[name])
    elif kind == "missing":
        del doc[data.draw(st.sampled_from(["epoch", "steps_completed", "version"]))]
    elif kind == "rng":
        key = data.draw(st.sampled_from(RNG_KEYS))
        value = doc["rng"][key]
        if isinstance(value, dict):  # tensorflow: its state truncated or retyped
            broken = [dict(value, state=value["state"][:1]), dict(value, algorithm="philox")]
        elif isinstance(value, str):  # torch: base64 cut short, or not base64
            broken = [value[:-4], value[:-1], "!" + value[1:]]
        else:  # a list: truncated, or wrapped once more
            broken = [value[:-1], [value]]
        # not None (absent: allowed) nor a list of integers (may be a valid seed, e.g. [0, 0])
        other = JSON.filter(lambda v: v is not None and not _int_list(v))
        doc["rng"][key] = data.draw(st.sampled_from(broken) | other)
    else:
        doc = data.draw(JSON.filter(lambda v: not isinstance(v, dict)))
    text = json.dumps(doc)  # NaN/inf as JSON's NaN/Infinity, which json.loads accepts
    with pytest.raises(errors.InvalidCheckpoint, match="Received: "):
        state_lib.TrainingState.from_json(text)


def test_huge_and_nan_values_name_the_field(good, tmp_path):
    for name, value in [("epoch", math.nan), ("steps_completed", 2**70), ("epoch", -1)]:
        doc = dict(good, **{name: value})
        with pytest.raises(errors.InvalidCheckpoint, match=f"{name} must be an integer"):
            state_lib.TrainingState.from_json(json.dumps(doc))
    big = tmp_path / state_lib.STATE_FILENAME
    with open(big, "wb") as f:
        f.truncate(state_lib.MAX_STATE_BYTES + 1)
    with pytest.raises(errors.InvalidCheckpoint, match="larger than"):
        state_lib.read_state(str(tmp_path))
