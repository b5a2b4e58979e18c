"""A toy with a loss pass and a round context: no engine or builder by hand.

Toy 2 (toy 1 is `test_toy_algorithm`, toy 3 `test_toy_local_work`): FedAvg
over the clients whose loss at the broadcast model is at least `toy_gate`
times the round's mean loss. Its module here declares only options, a
definition (a fresh loss pass; the mean loss as two reductions, the sum of
the losses and the number of clients; the filter `trains`) and a registry
entry whose TFF builder is derived from that definition
(`composition.definition_builder`). Registered, the training binary runs it
on TFF and on both engines to the same per-client numbers, and the filter
really leaves clients out.
"""

import csv
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tests import binary
from tff_algos import composition
from tff_algos import definition as definition_lib
from tff_algos import options as options_lib

NAME = 'toy_gate'


@dataclasses.dataclass(frozen=True)
class GateOptions(options_lib.Options):
  """The toy's one option."""

  toy_gate: float = options_lib.option(
      1.0,
      'Toy gate: clients train whose loss is at least this times the mean.',
      low=0.0,
      high=10.0,
  )


def _definition(options: GateOptions, context: options_lib.Context):
  del context
  gate = options.toy_gate

  def trains(context, loss):
    mean = context['loss_sum'] / context['clients']
    return loss >= gate * mean

  def client_result(context, loss, count, delta, num_examples, non_finite):
    del count
    kept = tf.logical_and(trains(context, loss), tf.logical_not(non_finite))
    return delta, tf.where(kept, tf.cast(num_examples, tf.float32), 0.0)

  return definition_lib.AlgorithmDefinition(
      name=NAME,
      client_result=client_result,
      loss_pass='fresh',
      reductions=(
          ('loss_sum', definition_lib.Reduction('sum', lambda loss, _: loss)),
          (
              'clients',
              definition_lib.Reduction(
                  'sum', lambda loss, _: tf.ones_like(loss)
              ),
          ),
      ),
      trains=trains,
  )


TOY = options_lib.Algorithm(
    name=NAME,
    options=GateOptions,
    definition=_definition,
    builder=composition.definition_builder(_definition),
    own_weighting=True,  # Its kept clients by examples, the others 0.
)

_LAUNCH = (
    'import sys; from tests import test_toy_loss_pass as toy;'
    ' from tff_algos import registry; registry.register(toy.TOY);'
    ' from run import train; sys.argv[0] = "train"; train.run_main()'
)
ARGS = [
    '--task=synthetic',
    '--num_clients=8',
    '--clients_per_round=4',
    '--client_batch_size=5',
    '--client_learning_rate=0.1',
    '--synthetic_size_law=table_4_4',
    '--algorithm=toy_gate',
    '--toy_gate=1',
    '--total_rounds=3',
    '--rounds_per_eval=3',
    '--progress=false',
    '--eval_train_clients=false',
]


def test_the_tff_builder_follows_from_the_definition():
  # A definition whose server is not the weighted mean is refused, in words.
  definition = _definition(GateOptions(), None)
  own_server = dataclasses.replace(definition, weighted=False)
  with pytest.raises(ValueError, match='write this one by hand'):
    composition.build_from_definition(lambda: None, own_server, None)
  # Its context is the reductions' (no hand-written prepare besides).
  assert isinstance(definition.prepare, definition_lib.ReducedContext)
  context = definition.prepare(tf.constant([1.0, 2.0, 6.0]), None)
  assert {k: float(v) for k, v in context.items()} == {
      'loss_sum': 9.0,
      'clients': 3.0,
  }
  with pytest.raises(ValueError, match='either prepare or reductions'):
    dataclasses.replace(definition, prepare=lambda losses, counts: {})
  with pytest.raises(ValueError, match='reduce a fresh loss pass'):
    dataclasses.replace(definition, loss_pass='none', trains=None)
  with pytest.raises(ValueError, match='one of'):
    definition_lib.Reduction('mean', lambda loss, _: loss)


def _run(tmp_path, engine):
  code, _, err = binary.run_code(
      _LAUNCH,
      ARGS
      + [
          f'--simulation_engine={engine}',
          f'--experiment_name={engine}',
          f'--root_output_dir={tmp_path}',
      ],
  )
  assert code == 0, err[-2000:]
  folder = tmp_path / engine
  path = folder / 'clients' / 'round_00003.csv'
  rows = [line.split(',') for line in path.read_text().splitlines()[1:]]
  with open(folder / 'metrics.csv', newline='') as f:
    metrics = list(csv.DictReader(f))
  return np.array([[float(v) for v in row[2:]] for row in rows]), metrics


def test_toy_gate_trains_equally_on_tff_and_both_engines(tmp_path):
  tables, metrics = {}, {}
  for engine in ('tff', 'batched', 'stacked'):
    tables[engine], metrics[engine] = _run(tmp_path, engine)
  assert tables['tff'].shape == (8, 3)
  for engine in ('batched', 'stacked'):
    np.testing.assert_allclose(
        tables[engine], tables['tff'], rtol=1e-5, atol=1e-6, err_msg=engine
    )
  # The gate leaves clients out (of 4 a round, those below the mean loss),
  # and the TFF path measures the context the engines compute.
  kept = [float(r['client_work/fraction_kept']) for r in metrics['tff']]
  assert all(0.0 < k < 1.0 for k in kept), kept
  for key in ('client_work/loss_sum', 'client_work/clients'):
    assert all(float(r[key]) > 0 for r in metrics['tff'])
  assert [float(r['client_work/clients']) for r in metrics['tff']] == [4.0] * 3
