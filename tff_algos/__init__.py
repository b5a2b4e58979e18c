"""TensorFlow Federated 0.87 algorithms for heterogeneous clients (tff-hetero).

Every algorithm is a `build_*` function returning a
`tff.learning.templates.LearningProcess`; `tasks` holds the data, `privacy`
the differentially private pieces, and the package beside them the training
loop and binaries.

Install (Python 3.9, 3.10 or 3.11 on Linux x86-64, as TFF 0.87 requires):

* From a clone: `scripts/bootstrap.sh` makes `.venv` with the pinned stack
  (requirements.txt, then requirements-nodeps.txt without dependencies) and
  installs this package in editable mode.
* Without a clone (Colab, Jupyter, a pipeline): the three `pip` commands of
  README.md, "Install with pip (Colab, Jupyter)": the pinned requirements,
  then `tensorflow-federated==0.87.0 jax==0.4.14 jaxlib==0.4.13` without
  dependencies, then this package (a wheel or the repository) without
  dependencies. `pip install tensorflow-federated==0.87.0` alone cannot
  resolve: TFF pins a jaxlib that PyPI no longer serves.

Either way every binary is a command, `tff-hetero-<module>` (the training
binary is `tff-hetero-train`), which fetches TFF's dataset files on request
(`tasks.download`).
"""

import builtins as _builtins

from tensorflow.python.autograph.pyct import inspect_utils as _inspect_utils

from tff_algos import runtime as _runtime

# Objects whose ids AutoGraph takes for builtins, kept alive so no other
# object can ever get one of their ids (see `pin_autograph_builtins`).
_PINNED_BUILTINS: tuple[object, ...] = ()


def pin_autograph_builtins() -> None:
  """Guards TF's AutoGraph against a builtin's stale id; runs on import.

  TF 2.14's AutoGraph takes a callable for a builtin when its `id` is in
  `inspect_utils._BUILTIN_FUNCTION_IDS`, the ids of `builtins`' values when
  TF was imported, and then calls it unconverted. A Jupyter kernel sets
  `builtins.input` to a new bound method for every cell and drops the old
  one, so the id of the one TF saw becomes free; a bound method TF makes
  later for a `tf.function` method (e.g. a Keras model's
  `report_local_unfinalized_metrics`) can land there and is then called with
  TF's `TfMethodTarget` as `self` (`'TfMethodTarget' object has no attribute
  'get_metrics'`, seen in one of our notebooks under CI). This keeps only the
  ids of objects still in `builtins` and holds those objects, so their ids
  are never reused; ids already freed are dropped.
  """
  global _PINNED_BUILTINS
  ids = getattr(_inspect_utils, '_BUILTIN_FUNCTION_IDS', None)
  if ids is None:  # Another TF version: nothing to guard.
    return
  current = {id(v): v for v in _builtins.__dict__.values()}
  kept = tuple(v for i, v in current.items() if i in ids)
  _PINNED_BUILTINS = tuple({id(v): v for v in _PINNED_BUILTINS + kept}.values())
  _inspect_utils._BUILTIN_FUNCTION_IDS = frozenset(  # pylint: disable=protected-access
      id(v) for v in _PINNED_BUILTINS
  )


pin_autograph_builtins()
# Exits quietly once TFF is imported (its service manager's `__del__`).
_runtime.end_workers_at_exit()
