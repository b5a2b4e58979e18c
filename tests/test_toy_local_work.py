"""An algorithm with its own client work runs stacked through its kernel.

The toy below declares, in this file alone, client work of its own: local
SGD whose every step is mixed back toward the broadcast model,
`w <- mix * (w - lr g) + (1 - mix) w0`. Its work object is a
`stacked_work.StackedLocalWork`: called per client (the TFF path and the
batched engine), and as a kernel on stacked weights (the stacked engine),
which names no algorithm. Registered, it trains to the same weights and
metrics on the three, and a setting its kernel cannot run is refused in one
line naming the batched engine.
"""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.python.learning import loop_builder

from tasks import synthetic
from tests import engine_runs
from tff_algos import batched
from tff_algos import client_work
from tff_algos import composition
from tff_algos import definition as definition_lib
from tff_algos import options as options_lib
from tff_algos import registry
from tff_algos import stacked
from tff_algos import stacked_work

NAME = 'toy_mix'
LR = 0.1


@dataclasses.dataclass(frozen=True, eq=False)
class MixedSteps(stacked_work.StackedLocalWork):
  """Local SGD steps, each mixed toward the broadcast model by `mix`."""

  learning_rate: float
  mix: float
  max_steps: int = 0  # > 0: a setting the kernel refuses (for the test).

  def __call__(self, model, weights, dataset, personal, loop_implementation):
    del personal
    variables = tff.learning.models.ModelWeights.from_model(model)
    tf.nest.map_structure(lambda v, t: v.assign(t), variables, weights)
    trainable = tuple(tf.nest.flatten(variables.trainable))
    w0 = tuple(tf.nest.flatten(weights.trainable))

    def step(num_examples, batch):
      with tf.GradientTape() as tape:
        output = model.forward_pass(batch, training=True)
      grads = tape.gradient(output.loss, trainable)
      for v, g, a in zip(trainable, grads, w0):
        v.assign(self.mix * (v - self.learning_rate * g) + (1 - self.mix) * a)
      return num_examples + tf.cast(output.num_examples, tf.int64)

    loop = loop_builder.build_training_loop(loop_implementation)
    num_examples = loop(step, dataset, lambda: tf.constant(0, tf.int64))
    delta, non_finite = client_work.zero_all_if_any_non_finite(
        tuple(a - v for a, v in zip(w0, trainable))
    )
    return definition_lib.LocalWork(tuple(delta), num_examples, non_finite)

  def check_stacked(self, definition) -> None:
    if self.max_steps:
      raise stacked_work.StackedEngineError(
          f'{definition.name} with max_steps={self.max_steps} runs on the '
          'batched engine'
      )

  def stacked_kernel(self, kit):
    solver = kit.solver(
        tff.learning.optimizers.build_sgdm(learning_rate=self.learning_rate)
    )

    def mixed_pass(w0, start, x_all, y_all, idx, valid, proximal, decay):
      del start, proximal, decay
      k = tf.shape(idx)[1]
      w_start = tuple(
          tf.broadcast_to(v[None], tf.concat([[k], tf.shape(v)], 0)) for v in w0
      )
      w, sums = kit.descend(
          w_start, w0, solver, x_all, y_all, idx, valid, 0.0, 0.0, mix=self.mix
      )
      return tuple(a - v for a, v in zip(w_start, w)), sums

    def round_work(inputs):
      deltas, sums = kit.run_clients(
          mixed_pass,
          inputs.w0,
          None,
          inputs.x_all,
          inputs.y_all,
          inputs.idx,
          inputs.valid,
          inputs.steps,
          0.0,
          0.0,
      )
      zeros = tuple(tf.zeros_like(d) for d in deltas)
      deltas, bad = stacked_work.keep_finite(kit, deltas, zeros)
      return stacked_work.LocalResult(deltas, sums, bad)

    return round_work


@dataclasses.dataclass(frozen=True)
class ToyMixOptions(options_lib.Options):
  toy_mix: float = options_lib.option(
      0.5,
      'Toy mix: each local step is mixed toward the broadcast model.',
      low=0.0,
      high=1.0,
      low_open=True,
  )
  toy_max_steps: int = options_lib.option(
      0, 'Toy mix: a setting the stacked kernel refuses.', low=0
  )


def _definition(options: ToyMixOptions, context: options_lib.Context):
  return definition_lib.AlgorithmDefinition(
      name=NAME,
      client_result=client_work.weighted_delta_result(context.client_weighting),
      local_work=MixedSteps(
          context.client_learning_rate, options.toy_mix, options.toy_max_steps
      ),
  )


def _build(options: ToyMixOptions, model_fn, context: options_lib.Context):
  work = client_work.build_local_training_client_work(
      model_fn,
      context.client_optimizer,
      _definition(options, context),
      loop_implementation=context.loop_implementation,
  )
  return composition.compose_model_delta_process(
      model_fn, work, server_optimizer_fn=context.server_optimizer
  )


TOY = options_lib.Algorithm(
    name=NAME,
    options=ToyMixOptions,
    definition=_definition,
    builder=_build,
    in_benchmark=False,
)


@pytest.fixture(scope='module')
def task():
  return synthetic.create_task(
      num_clients=12, seed=1, batch_size=5, size_law='table_4_4'
  )


@pytest.fixture(scope='module')
def toy_registered():
  registry.register(TOY)
  yield
  registry.unregister(NAME)


def algorithm(**options):
  return batched.BatchedAlgorithm.from_registry(
      NAME, client_learning_rate=LR, **options
  )


def run_three(task, mix):
  """`{engine: (weights, metrics)}` after two rounds of the toy."""
  alg = algorithm(toy_mix=mix)
  sgd = tff.learning.optimizers.build_sgdm(learning_rate=LR)
  context = options_lib.Context(
      client_optimizer=sgd,
      client_learning_rate=LR,
      optimizer_fn=lambda lr: tff.learning.optimizers.build_sgdm(
          learning_rate=lr
      ),
  )
  process = registry.get(NAME).builder(
      ToyMixOptions(toy_mix=mix), task.model_fn, context
  )
  engines = {
      'batched': batched.BatchedEngine(
          task.model_fn,
          task.preprocess_train,
          batched.ClientArrays(task.train_data),
          alg,
      ),
      'stacked': stacked.StackedEngine(
          task.model_fn, task.preprocess_train, task.train_data, alg
      ),
  }
  out = {}
  for name, engine in engines.items():
    tff_state, fast_state, tff_metrics, fast_metrics = engine_runs.run_both(
        task, process, engine, rounds=2, epochs=2
    )
    out['tff'] = (
        composition.model_weights_as_numpy(process, tff_state),
        tff_metrics,
    )
    out[name] = (
        composition.model_weights_as_numpy(process, fast_state),
        fast_metrics,
    )
  return out


KEYS = ('train/loss', 'train/accuracy', 'train/num_examples')


def test_the_toy_trains_equally_on_tff_and_both_engines(task, toy_registered):
  del toy_registered
  assert 'stacked' in registry.get(NAME).engines
  runs = run_three(task, 0.5)
  tff_weights, tff_metrics = runs['tff']
  assert np.abs(tff_weights[0]).max() > 1e-2  # The model moved.
  for engine in ('batched', 'stacked'):
    weights, metrics = runs[engine]
    for a, b in zip(tff_weights, weights):
      np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=engine)
    for t, f in zip(tff_metrics, metrics):
      for key in KEYS:
        np.testing.assert_allclose(f[key], t[key], rtol=1e-5, err_msg=key)
  # The mix reaches the kernel: another mix, other stacked weights.
  other = run_three(task, 1.0)['stacked'][0]
  assert max(np.abs(a - b).max() for a, b in zip(other, tff_weights)) > 1e-3


def test_a_setting_the_kernel_cannot_run_is_refused(task, toy_registered):
  del toy_registered
  with pytest.raises(stacked.StackedEngineError, match='batched engine'):
    stacked.StackedEngine(
        task.model_fn,
        task.preprocess_train,
        task.train_data,
        algorithm(toy_max_steps=3),
    )


def test_other_own_work_is_refused_by_the_stacked_engine(task):
  def plain_callable(model, weights, dataset, personal, loop_implementation):
    del model, weights, dataset, personal, loop_implementation
    raise AssertionError('a refused work is never called')

  definition = definition_lib.AlgorithmDefinition(
      name='own_work',
      client_result=client_work.weighted_delta_result(
          tff.learning.ClientWeighting.NUM_EXAMPLES
      ),
      local_work=plain_callable,
  )
  with pytest.raises(stacked.StackedEngineError, match='its own client work'):
    stacked.check_definition(definition)
