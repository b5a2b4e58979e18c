"""The run-wide client weighting reaches exactly the algorithms declaring it.

An algorithm whose entry says `own_weighting` weighs its clients by its own
rule (q-FFL's h_k, TERM's tilt, AFL's mixture, Fed+'s weight 1, Delta-FL's
options): `--client_weighting` would change nothing, so the binary refuses
it in one line instead of ignoring it. The others' contributions follow it.
Both are checked on each registered algorithm's own definition, with three
clients of 4, 9 and 2 examples.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff

from run import algorithms
from tff_algos import options as options_lib
from tff_algos import registry

EXAMPLES = (4.0, 9.0, 2.0)


def contributions(name: str, weighting: tff.learning.ClientWeighting, **values):
  """The three clients' weighted vectors and scalars, as the engines sum
  them (`client_result` on the round context, mapped per client where the
  message needs one client at a time)."""
  entry = registry.get(name)
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=0.1)
  context = options_lib.Context(
      client_optimizer=sgd,
      client_learning_rate=0.1,
      optimizer_fn=lambda lr: tff.learning.optimizers.build_sgdm(
          learning_rate=lr
      ),
      client_weighting=weighting,
      num_clients=3,
  )
  options = registry.options_from_values(name, {**entry.example, **values})
  definition = entry.definition(options, context)
  losses = tf.constant([1.0, 2.0, 0.5])
  counts = tf.constant(EXAMPLES)
  deltas = (tf.constant([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]]),)
  round_context = dict(definition.prepare(losses, counts))
  if definition.server_state is not None:
    spec = definition.server_state.spec
    round_context.update(
        server_state=tf.fill(spec.shape, 1.0 / 3.0),
        client_index=tf.constant([0, 1, 2]),
    )
  args = (losses, counts, deltas, counts, tf.zeros([3], tf.bool))
  if definition.per_client_message:
    vectors, scalars = tf.map_fn(
        lambda a: definition.client_result(round_context, *a),
        args,
        fn_output_signature=(
            (tf.TensorSpec([2], tf.float32),),
            tf.TensorSpec([], tf.float32),
        ),
    )
  else:
    vectors, scalars = definition.client_result(round_context, *args)
  return np.concatenate([np.ravel(v) for v in vectors] + [np.ravel(scalars)])


@pytest.mark.parametrize('name', registry.names())
def test_the_weighting_trait_is_the_definitions(name):
  by_examples = contributions(name, tff.learning.ClientWeighting.NUM_EXAMPLES)
  uniform = contributions(name, tff.learning.ClientWeighting.UNIFORM)
  assert np.all(np.isfinite(by_examples))
  changed = not np.allclose(by_examples, uniform)
  assert changed == (not registry.get(name).own_weighting)


def test_the_binary_refuses_a_weighting_it_would_ignore():
  weighted = algorithms.weighted_algorithms()
  assert weighted == ('fedavg', 'fedprox', 'ditto')
  for name in registry.names():
    spec = algorithms.AlgorithmSpec(
        name, client_weighting='uniform', **registry.get(name).example
    )
    if name in weighted:
      spec.validate()
      continue
    with pytest.raises(ValueError) as info:
      spec.validate()
    assert str(info.value) == (
        '--client_weighting applies to fedavg, fedprox, ditto, not '
        f'{name} (it weighs its clients by its own rule)'
    )


@pytest.mark.parametrize(
    'name', [n for n in registry.names() if registry.get(n).uniform_option]
)
def test_an_own_uniform_option_weighs_each_client_alike(name):
  # Delta-FL's alpha_k: its examples by default, 1 with the option; a
  # benchmark tunes the option as the run-wide weighting of the others.
  by_examples = contributions(name, tff.learning.ClientWeighting.NUM_EXAMPLES)
  uniform = contributions(
      name,
      tff.learning.ClientWeighting.NUM_EXAMPLES,
      **{registry.get(name).uniform_option: True},
  )
  # The quantile moves with the weights (the kept set may differ): compare
  # the clients both keep.
  kept = (uniform[-3:] > 0) & (by_examples[-3:] > 0)
  assert kept.any() and not np.allclose(by_examples, uniform)
  np.testing.assert_allclose(uniform[-3:][kept], 1.0)
  np.testing.assert_allclose(by_examples[-3:][kept], np.asarray(EXAMPLES)[kept])


def test_a_uniform_option_is_an_own_weighting_switch():
  entry = registry.get('deltafl')
  assert entry.uniform_option == 'uniform_weights'
  for bad in (
      dict(uniform_option='no_such_option'),
      dict(uniform_option='theta'),  # Not a boolean off by default.
      dict(own_weighting=False),
  ):
    with pytest.raises(ValueError, match='is not a boolean option off'):
      dataclasses.replace(entry, **bad)
