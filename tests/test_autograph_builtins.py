"""tff_algos.pin_autograph_builtins: no method is taken for a builtin."""

import builtins
import types

import pytest
import tensorflow as tf
from tensorflow.python.autograph.pyct import inspect_utils

import tff_algos


class _Model:

  def __init__(self):
    self.v = tf.Variable(1.5)

  def value(self):
    return self.v

  @tf.function
  def doubled(self):
    return self.value() * 2.0


class _Probe:

  def method(self):
    return self


@pytest.fixture
def restore_ids():
  ids = inspect_utils._BUILTIN_FUNCTION_IDS  # pylint: disable=protected-access
  pinned = tff_algos._PINNED_BUILTINS  # pylint: disable=protected-access
  yield
  inspect_utils._BUILTIN_FUNCTION_IDS = ids  # pylint: disable=protected-access
  tff_algos._PINNED_BUILTINS = pinned  # pylint: disable=protected-access


def test_freed_builtin_ids_cannot_capture_a_tf_function_method(restore_ids):
  del restore_ids
  # As in a Jupyter kernel: builtins values TF saw at import (there the cell's
  # `input` method) are replaced and freed, leaving their ids in the set.
  # Many such holes make a later bound method land on one almost surely
  # (unpinned, 4 of 5 calls failed with "'TfMethodTarget' object has no
  # attribute 'value'").
  probe = _Probe()
  stale = [types.MethodType(_Probe.method, probe) for _ in range(20000)]
  inspect_utils._BUILTIN_FUNCTION_IDS |= {  # pylint: disable=protected-access
      id(m) for m in stale
  }
  del stale
  tff_algos.pin_autograph_builtins()
  for _ in range(5):
    model = _Model()

    @tf.function
    def outer(model=model):
      return model.doubled()

    assert float(outer()) == 3.0


def test_pinned_ids_are_builtins_kept_alive(restore_ids):
  del restore_ids
  original_input = builtins.input
  tff_algos.pin_autograph_builtins()
  ids = inspect_utils._BUILTIN_FUNCTION_IDS  # pylint: disable=protected-access
  pinned = tff_algos._PINNED_BUILTINS  # pylint: disable=protected-access
  assert ids == frozenset(id(v) for v in pinned)
  assert id(len) in ids and id(range) in ids
  assert inspect_utils.isbuiltin(len)
  # A builtins value replaced later keeps its object, so its id stays its own.
  builtins.input = lambda prompt='': ''
  try:
    assert any(v is original_input for v in pinned)
    assert not inspect_utils.isbuiltin(builtins.input)
  finally:
    builtins.input = original_input
