"""One definition per algorithm: the engines hold no per-algorithm code."""

import ast
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from run import algorithms
from tasks import synthetic
from tff_algos import batched
from tff_algos import composition
from tff_algos import definition
from tff_algos import fed_prox
from tff_algos import registry
from tff_algos import stacked
from tests import engine_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = set(algorithms.ALGORITHM_NAMES)


def _weighted_result(context, loss, count, delta, num_examples, non_finite):
  del context, loss, count
  return delta, tf.where(non_finite, 0.0, tf.cast(num_examples, tf.float32))


def test_definition_options_are_checked():
  with pytest.raises(ValueError, match='loss_pass'):
    definition.AlgorithmDefinition(
        name='x', client_result=_weighted_result, loss_pass='twice'
    )
  with pytest.raises(ValueError, match='continued loss pass'):
    definition.AlgorithmDefinition(
        name='x',
        client_result=_weighted_result,
        loss_pass='continued',
        prepare=lambda losses, counts: {'m': tf.reduce_max(losses)},
    )
  with pytest.raises(ValueError, match='needs a loss pass'):
    definition.AlgorithmDefinition(
        name='x',
        client_result=_weighted_result,
        trains=lambda context, loss: loss > 0,
    )
  with pytest.raises(ValueError, match='local_work that updates them'):
    definition.AlgorithmDefinition(
        name='x', client_result=_weighted_result, personal_models=1
    )
  with pytest.raises(ValueError, match='takes the loss from local_work'):
    definition.AlgorithmDefinition(
        name='x', client_result=_weighted_result, loss_pass='work'
    )
  state = definition.ServerState(
      key='client_work',
      spec=tf.TensorSpec([2], tf.float32),
      update=lambda s, losses, indices: (s, {}),
  )
  with pytest.raises(ValueError, match="loss_pass 'work'"):
    definition.AlgorithmDefinition(
        name='x',
        client_result=_weighted_result,
        local_work=lambda *a: None,
        server_state=state,
    )
  with pytest.raises(ValueError, match='which local_work replaces'):
    definition.AlgorithmDefinition(
        name='x',
        client_result=_weighted_result,
        local_work=lambda *a: None,
        proximal_strength=0.1,
    )


def _name_constants(path):
  """Algorithm-name string constants in `path`'s code (not in docstrings)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  skip = set()
  for node in ast.walk(tree):
    body = getattr(node, 'body', None)
    if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
      skip.add(id(body[0].value))  # Docstrings.
  return [
      (node.lineno, node.value)
      for node in ast.walk(tree)
      if isinstance(node, ast.Constant)
      and node.value in NAMES
      and id(node) not in skip
  ]


def test_engines_do_not_branch_on_algorithm_names():
  # Neither engine names an algorithm: they run the registry's definitions.
  assert not _name_constants(os.path.join(ROOT, 'tff_algos', 'batched.py'))
  assert not _name_constants(os.path.join(ROOT, 'tff_algos', 'stacked.py'))


def test_every_algorithm_builds_from_the_registry():
  # Every algorithm the binary offers runs on the batched engine, built from
  # its registry entry with its example options.
  assert set(registry.engine_names('batched')) == NAMES
  for name in sorted(NAMES):
    algorithm = batched.BatchedAlgorithm.from_registry(
        name,
        client_learning_rate=0.1,
        num_clients=4,
        **registry.get(name).example,
    )
    assert algorithm.name == name
    assert isinstance(algorithm.definition(), definition.AlgorithmDefinition)


def test_branch_check_sees_a_name_comparison(tmp_path):
  path = tmp_path / 'engine.py'
  path.write_text('def f(alg):\n  return alg.name == "qffl"\n')
  assert _name_constants(str(path)) == [(2, 'qffl')]


def _loss_weighted():
  """A new algorithm: deltas weighted by n_k F_k (F_k at the broadcast)."""

  def client_result(context, loss, count, delta, num_examples, non_finite):
    del context, num_examples
    weight = tf.cast(count, tf.float32) * loss
    return delta, tf.where(non_finite, 0.0, weight)

  return definition.AlgorithmDefinition(
      name='loss_weighted',
      client_result=client_result,
      loss_pass='fresh',
  )


def test_a_new_definition_runs_on_both_engines():
  """Adding an algorithm is adding its definition; both engines agree."""
  task = synthetic.create_task(
      num_clients=8, seed=2, batch_size=5, size_law='table_4_4'
  )
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=0.1)
  algorithm = batched.BatchedAlgorithm.from_definition(
      'loss_weighted', _loss_weighted, client_optimizer=sgd
  )
  # Any process with this model and SGD server state gives the state type.
  process = fed_prox.build_fed_prox(task.model_fn, sgd, proximal_strength=0.0)
  weights = []
  for engine in (
      batched.BatchedEngine(
          task.model_fn,
          task.preprocess_train,
          batched.ClientArrays(task.train_data),
          algorithm,
      ),
      stacked.StackedEngine(
          task.model_fn, task.preprocess_train, task.train_data, algorithm
      ),
  ):
    state = engine_runs.run_engine(task, process, engine, rounds=2)
    weights.append(composition.model_weights_as_numpy(process, state))
  start = composition.model_weights_as_numpy(process, process.initialize())
  for a, b, w0 in zip(weights[0], weights[1], start):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    assert np.abs(a - w0).max() > 1e-3  # It trained.
