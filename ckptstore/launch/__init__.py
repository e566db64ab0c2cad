"""Starting user code the way Determined did: ``determined`` imports, the interpreter, workers.

- :mod:`ckptstore.launch.process`: the command and environment of every process ckptstore
  starts for the user (experiment trials, ``ckptstore job run``, ``ckptstore run``): a leading
  ``python``/``python3`` becomes the interpreter running ckptstore, and ``import determined``
  resolves to ckptstore there (only there).
- :mod:`ckptstore.launch.tensorflow`: ``python3 -m determined.launch.tensorflow -- python3
  train.py``, Determined's launcher: with ``resources.slots_per_trial: N > 1`` it starts N
  workers on this machine, each with its ``TF_CONFIG``.

This package never imports TensorFlow.

Example::

    from ckptstore.launch.process import child_command, child_env

    subprocess.run(child_command(["python3", "train.py"]), env=child_env(os.environ))
"""

from ckptstore.launch.process import ALIAS_DIR, child_command, child_env

__all__ = ["ALIAS_DIR", "child_command", "child_env"]
