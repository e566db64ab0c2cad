"""The code-reference rule for classes of modules this process already imported (issue 38,
finding 7): using them imports nothing, so they pass without ``custom_objects``/``modules``;
everything the rule refused before is still refused (an attacker's config naming a module not
imported yet, a name a module merely re-exports, a module whose ``__getattr__`` would import).
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from ckptstore import errors
from ckptstore.keras_io.saving._code_refs import check_code_refs


def _config(module, class_name, registered=None, config=None):
    layer = {"module": module, "class_name": class_name, "config": config or {}}
    if registered:
        layer["registered_name"] = registered
    return json.dumps(
        {"class_name": "Sequential", "module": "keras", "config": {"layers": [layer]}}
    )


@pytest.fixture
def trial_module():
    """A trial module as the process running the trial has it: imported, defining a layer
    class (with from_config) and an activation function."""
    module = types.ModuleType("my_trial_model_def")

    class Doubler:
        @classmethod
        def from_config(cls, config):
            return cls()

    def swish_ish(x):
        return x

    for obj in (Doubler, swish_ish):
        obj.__module__ = module.__name__
        setattr(module, obj.__name__, obj)
    module.system = __import__("os").system  # re-exported, not defined here
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_a_class_or_function_of_an_imported_module_passes(trial_module):
    assert check_code_refs(_config("my_trial_model_def", "Doubler"), what="t") == []
    fn = _config("my_trial_model_def", "function", "swish_ish", "swish_ish")
    assert check_code_refs(fn, what="t") == []


def test_a_module_not_imported_yet_is_still_refused_and_not_imported():
    sys.modules.pop("this", None)  # importing it prints the Zen of Python: import-time code
    with pytest.raises(errors.UntrustedCode, match="'this'"):
        check_code_refs(_config("this", "Zen"), what="evil.keras")
    assert "this" not in sys.modules


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("my_trial_model_def", "system"),  # re-exported os.system: not the module's own
        ("my_trial_model_def", "Missing"),  # not defined at all
        ("os", "system"),  # a builtin function, not a Python function of that module
        ("subprocess", "Popen"),  # a class without from_config
    ],
)
def test_imported_modules_pass_only_their_own_keras_loadable_names(trial_module, module, name):
    import subprocess  # noqa: F401 - imported, as in any process

    with pytest.raises(errors.UntrustedCode):
        check_code_refs(_config(module, name), what="evil.keras")


def test_a_module_getattr_is_never_called(trial_module):
    """A lazily-importing module (PEP 562 ``__getattr__``) is read through its namespace only."""
    called = []
    lazy = types.ModuleType("lazy_pkg")
    lazy.__getattr__ = lambda name: called.append(name)
    sys.modules["lazy_pkg"] = lazy
    try:
        with pytest.raises(errors.UntrustedCode):
            check_code_refs(_config("lazy_pkg", "Anything"), what="evil.keras")
    finally:
        del sys.modules["lazy_pkg"]
    assert called == []
