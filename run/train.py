# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""Trains a federated algorithm on a task and reports per-client tail metrics.

Example (built-in data, no files needed):

  tff-hetero-train --task=synthetic --algorithm=fedprox \
      --proximal_strength=1.0 --total_rounds=100 --clients_per_round=10 \
      --client_learning_rate=0.01 --experiment_name=prox

Flags follow google-research/federated. Outputs go to
`<root_output_dir>/<experiment_name>/` (see `run.simulation`); running the
same command again resumes from the last checkpoint there.
"""

import os
import sys

if not (3, 9) <= sys.version_info[:2] <= (3, 11):
  sys.exit(
      'error: tff-hetero needs Python 3.9, 3.10 or 3.11 (TensorFlow Federated'
      f' 0.87 supports no other); this is Python {sys.version.split()[0]}.'
  )
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
from absl import logging

from run import algorithms
from run import contexts
from run import engines
from run import simulation
from tasks import base as task_base
from tasks import registry
from tff_algos import runtime
# pylint: enable=g-import-not-at-top,wrong-import-position

_TASK = flags.DEFINE_string(
    'task', 'synthetic', f'Task: one of {", ".join(registry.TASK_NAMES)}.')
_ALGORITHM = flags.DEFINE_string(
    'algorithm', 'fedavg',
    f'Algorithm: one of {", ".join(algorithms.ALGORITHM_NAMES)}.')
_TOTAL_ROUNDS = flags.DEFINE_integer('total_rounds', 100, 'Training rounds.')
_CLIENTS_PER_ROUND = flags.DEFINE_integer(
    'clients_per_round', 10, 'Clients selected per round.')
_EPOCHS = flags.DEFINE_integer(
    'client_epochs_per_round', 1, 'Local epochs E per round.')
_BATCH_SIZE = flags.DEFINE_integer('client_batch_size', 10, 'Local batch.')
_CLIENT_OPT = flags.DEFINE_string(
    'client_optimizer', 'sgd',
    f'Client optimizer: {", ".join(algorithms.OPTIMIZERS)}.')
_CLIENT_LR = flags.DEFINE_float('client_learning_rate', 0.01, 'Client lr.')
_SERVER_OPT = flags.DEFINE_string(
    'server_optimizer', 'sgd',
    f'Server optimizer: {", ".join(algorithms.OPTIMIZERS)}.')
_SERVER_LR = flags.DEFINE_float(
    'server_learning_rate', 1.0,
    'Server lr (1.0 with sgd: the new model is the average of local models).')
_SERVER_MOMENTUM = flags.DEFINE_float(
    'server_sgd_momentum', 0.0, 'Server SGD momentum.')
_WEIGHTING = flags.DEFINE_string(
    'client_weighting', 'num_examples',
    'Aggregation weights: num_examples or uniform.')
_SAMPLING = flags.DEFINE_string(
    'client_sampling', 'uniform',
    'Client sampling: uniform or examples (probability proportional to size).')
_ROUNDS_PER_EVAL = flags.DEFINE_integer(
    'rounds_per_eval', 10, 'Per-client evaluation period (0: only at end).')
_ROUNDS_PER_CHECKPOINT = flags.DEFINE_integer(
    'rounds_per_checkpoint', 10, 'Checkpoint period (0: only at the end).')
_ROOT = flags.DEFINE_string(
    'root_output_dir', 'output', 'Root folder of all experiments.')
_EXPERIMENT = flags.DEFINE_string(
    'experiment_name', None,
    'Output sub-folder (default: <task>_<algorithm>_seed<seed>).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of data, sampling, shuffles.')
_PROX = flags.DEFINE_float(
    'proximal_strength', 0.0, 'FedProx mu >= 0 (fedprox, term).')
_Q = flags.DEFINE_float(
    'q', 0.0, 'q-FFL fairness q >= 0 (qffl, qfedsgd; 0 is FedAvg/FedSGD).')
_Q_LIPSCHITZ = flags.DEFINE_float(
    'q_lipschitz', 0.0,
    'q-FFL Lipschitz constant L (0: 1 / --client_learning_rate, as the paper).')
_TILT = flags.DEFINE_float(
    'tilt', 0.0, 'TERM tilt t (term; > 0 fairness, < 0 robustness).')
_AFL_LAMBDA_LR = flags.DEFINE_float(
    'afl_lambda_lr', 0.0,
    'AFL mixture step gamma_lambda >= 0 (afl; gamma_w is '
    '--client_learning_rate). Run AFL with --clients_per_round equal to the '
    'number of clients, as the paper.')
_THETA = flags.DEFINE_float(
    'theta', 1.0, 'Delta-FL conformity level in (0, 1] (deltafl; 1 is FedAvg).')
_SECURE_QUANTILE = flags.DEFINE_string(
    'secure_quantile', 'none',
    'Delta-FL quantile through secure sums only: none (exact; the server sees '
    'the losses), mm, bisection or private. Secure modes run under TFF\'s '
    'test execution context, the only one that executes secure sums.')
_STRICT = flags.DEFINE_boolean(
    'strict_filter', False, 'Delta-FL: keep loss > eta (Algorithm 3) instead '
    'of >= (Algorithm 2).')
_UNIFORM_WEIGHTS = flags.DEFINE_boolean(
    'uniform_weights', False,
    'Delta-FL: weigh clients uniformly (the workshop variant).')
_WEIGHT_DECAY = flags.DEFINE_float(
    'weight_decay', 0.0, 'Delta-FL local weight decay lambda (workshop).')
_Q_UPPER = flags.DEFINE_float(
    'quantile_upper_bound', 20.0,
    'Secure quantiles: losses are clipped to [0, this].')
_Q_TOL = flags.DEFINE_float(
    'quantile_tolerance', 1e-4, 'Bisection quantile: final bracket width.')
_Q_ITERS = flags.DEFINE_integer(
    'quantile_iterations', 50, 'MM / private quantile: iterations per round.')
_STRAGGLERS = flags.DEFINE_float(
    'straggler_fraction', 0.0,
    'Fraction of selected clients that straggle (FedAvg drops them, FedProx '
    'keeps their partial work).')
_EVAL_TRAIN = flags.DEFINE_boolean(
    'eval_train_clients', True,
    'Also evaluate every training client on its training data.')
_PROGRESS = flags.DEFINE_boolean('progress', True, 'Show a progress bar.')
# Execution (results do not depend on these).
_ENGINE = flags.DEFINE_string(
    'simulation_engine', 'tff',
    'tff: rounds through TFF\'s runtime (process.next); batched: each round '
    'in one TensorFlow call (fedavg, fedprox, qffl, deltafl; same result, '
    'simulation only; see docs/performance.md).')
_WORKERS = flags.DEFINE_list(
    'workers', [],
    'host:port,... of running TFF worker_binary processes: each round\'s '
    'clients are split across them (see docs/deployment.md).')
_MAX_CALLS = flags.DEFINE_integer(
    'max_concurrent_computation_calls', -1,
    'Limit on concurrent TensorFlow computations in TFF\'s runtime (e.g. to '
    'bound GPU memory); -1: no limit.')
_LOOP = flags.DEFINE_string(
    'loop_implementation', 'dataset_reduce',
    'How clients iterate their data in TFF: dataset_reduce or '
    'dataset_iterator (TFF\'s advice for GPUs).')
# Task options.
_DATA_DIR = flags.DEFINE_string(
    'data_dir', None, "Folder with TFF's cached dataset files (~/.tff).")
_USE_SYNTHETIC = flags.DEFINE_boolean(
    'use_synthetic_data', False,
    "File tasks: use TFF's small synthetic stand-in data instead of files.")
_NUM_CLIENTS = flags.DEFINE_integer(
    'num_clients', 100, 'Synthetic tasks: number of clients.')
_ALPHA = flags.DEFINE_float('synthetic_alpha', 1.0, 'Synthetic alpha.')
_BETA = flags.DEFINE_float('synthetic_beta', 1.0, 'Synthetic beta.')
_SIZE_LAW = flags.DEFINE_string(
    'synthetic_size_law', 'fedprox',
    'Synthetic client sizes: fedprox, table_4_4 or constant.')
_TEST_FRACTION = flags.DEFINE_float(
    'synthetic_test_fraction', 0.2, 'Synthetic per-client test fraction.')
_MIN_EXAMPLES = flags.DEFINE_integer(
    'min_examples', 0, 'File tasks: drop clients with fewer examples.')
_TEST_CLIENTS = flags.DEFINE_float(
    'test_clients_fraction', 0.0,
    'Evaluate on this fraction of unseen clients, the Delta-FL protocol (0: '
    'each client\'s own test split).')
_MAX_CLIENTS = flags.DEFINE_integer(
    'max_clients', None, 'File tasks: keep at most this many clients.')
_EMNIST_MODEL = flags.DEFINE_string(
    'emnist_model', 'cnn_dropout',
    'emnist_character model: linear, convnet, cnn_dropout, cnn or 2nn.')
_ONLY_DIGITS = flags.DEFINE_boolean(
    'only_digits', False, 'emnist_character: 10 digit classes only.')


class UsageError(ValueError):
  """A flag has an impossible value."""


def task_kwargs() -> dict:
  """Arguments of `tasks.registry.create_task` from the flags."""
  name = _TASK.value
  if name not in registry.TASK_NAMES:
    raise UsageError(
        f'unknown --task={name!r}; choose one of: '
        f'{", ".join(registry.TASK_NAMES)}'
    )
  if _BATCH_SIZE.value < 1:
    raise UsageError(f'--client_batch_size must be >= 1, got {_BATCH_SIZE.value}')
  kwargs = {'seed': _SEED.value, 'batch_size': _BATCH_SIZE.value}
  if name in registry.SYNTHETIC_TASKS:
    if _NUM_CLIENTS.value < 1:
      raise UsageError(f'--num_clients must be >= 1, got {_NUM_CLIENTS.value}')
    kwargs.update(
        num_clients=_NUM_CLIENTS.value, alpha=_ALPHA.value, beta=_BETA.value,
        size_law=_SIZE_LAW.value, test_fraction=_TEST_FRACTION.value,
        test_clients_fraction=_TEST_CLIENTS.value,
    )
  else:
    if not _USE_SYNTHETIC.value and not _DATA_DIR.value:
      raise UsageError(
          f'--task={name} reads TFF dataset files: pass --data_dir (the '
          'folder holding them), or --use_synthetic_data'
      )
    kwargs.update(
        data_dir=_DATA_DIR.value, use_synthetic_data=_USE_SYNTHETIC.value,
        min_examples=_MIN_EXAMPLES.value,
        test_clients_fraction=_TEST_CLIENTS.value,
        max_clients=_MAX_CLIENTS.value,
    )
    if name == 'emnist_character':
      kwargs.update(model=_EMNIST_MODEL.value, only_digits=_ONLY_DIGITS.value)
  return kwargs


def hparams() -> dict:
  """Every flag of this binary, for config.json."""
  names = [f.name for f in flags.FLAGS.get_key_flags_for_module(sys.modules[__name__])]
  return {name: flags.FLAGS[name].value for name in sorted(names)}


def experiment_dir() -> str:
  name = _EXPERIMENT.value or (
      f'{_TASK.value}_{_ALGORITHM.value}_seed{_SEED.value}')
  if not name or '/' in name or name in ('.', '..'):
    raise UsageError(f'--experiment_name must be a plain folder name, got {name!r}')
  return os.path.join(_ROOT.value, name)


def prepare():
  """Validates the flags and builds `(task, process, config, out_dir)`."""
  spec = algorithms.AlgorithmSpec(
      name=_ALGORITHM.value,
      client_optimizer=_CLIENT_OPT.value,
      client_learning_rate=_CLIENT_LR.value,
      server_optimizer=_SERVER_OPT.value,
      server_learning_rate=_SERVER_LR.value,
      server_momentum=_SERVER_MOMENTUM.value,
      client_weighting=_WEIGHTING.value,
      proximal_strength=_PROX.value,
      q=_Q.value,
      q_lipschitz=_Q_LIPSCHITZ.value,
      tilt=_TILT.value,
      afl_lambda_lr=_AFL_LAMBDA_LR.value,
      theta=_THETA.value,
      secure_quantile=_SECURE_QUANTILE.value,
      strict_filter=_STRICT.value,
      uniform_weights=_UNIFORM_WEIGHTS.value,
      weight_decay=_WEIGHT_DECAY.value,
      quantile_upper_bound=_Q_UPPER.value,
      quantile_tolerance=_Q_TOL.value,
      quantile_iterations=_Q_ITERS.value,
  )
  spec.validate()
  engines.check_engine(_ENGINE.value, spec)
  if _ENGINE.value == 'batched' and _WORKERS.value:
    raise UsageError('--simulation_engine=batched runs in this process; it '
                     'cannot use --workers')
  loop_implementation = engines.loop_implementation(_LOOP.value)
  context_kind = contexts.check(
      workers=_WORKERS.value,
      max_concurrent_computation_calls=_MAX_CALLS.value,
      secure=spec.uses_secure_intrinsics)
  config = simulation.SimulationConfig(
      total_rounds=_TOTAL_ROUNDS.value,
      clients_per_round=_CLIENTS_PER_ROUND.value,
      client_epochs_per_round=_EPOCHS.value,
      rounds_per_eval=_ROUNDS_PER_EVAL.value,
      rounds_per_checkpoint=_ROUNDS_PER_CHECKPOINT.value,
      seed=_SEED.value,
      client_sampling=_SAMPLING.value,
      straggler_fraction=_STRAGGLERS.value,
      drop_stragglers=algorithms.drops_stragglers(_ALGORITHM.value),
      eval_train_clients=_EVAL_TRAIN.value,
  )
  config.validate(num_clients=max(_CLIENTS_PER_ROUND.value, 1))
  out_dir = experiment_dir()
  task = registry.create_task(_TASK.value, **task_kwargs())
  config.validate(num_clients=len(task.train_data.client_ids))
  if spec.uses_secure_intrinsics:
    # TFF 0.87 executes secure sums only in its test context, which replaces
    # them by plain sums: the algorithm is the secure one, the runtime is not.
    import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
    tff.backends.test.set_sync_test_cpp_execution_context()
    print('secure quantile: running under TFF\'s test execution context',
          file=sys.stderr)
  elif context_kind != 'default':
    contexts.set_context(
        workers=_WORKERS.value,
        max_concurrent_computation_calls=_MAX_CALLS.value)
  process = algorithms.build_process(
      spec, task.model_fn, num_clients=len(task.train_data.client_ids),
      loop_implementation=loop_implementation)
  engine = None
  if _ENGINE.value == 'batched':
    engine = engines.build_batched_engine(spec, task, shuffle=config.shuffle)
  print(f'task: {task.description}', file=sys.stderr)
  print(f'algorithm: {spec.describe()}; output: {out_dir}', file=sys.stderr)
  return task, process, config, out_dir, engine


def train(task, process, config, out_dir, engine=None) -> dict:
  """Runs the training job and prints the final per-client table."""
  result = simulation.run_simulation(
      process, task, config, output_dir=out_dir, hparams=hparams(),
      progress=_PROGRESS.value, engine=engine,
  )
  print(f'\nPer-client metrics after round {result["round_num"]} '
        f'({task.description}):')
  print(simulation.summary_table(result['final_summaries']))
  print(f'\nOutputs: {out_dir}/ (metrics.csv, clients/, summary.txt, '
        'tensorboard/, checkpoints/)')
  return result


def main(argv) -> int:
  """Runs the binary; returns the exit code (2: bad input, 1: failed run)."""
  if len(argv) > 1:
    print(f'train: error: unexpected arguments: {" ".join(argv[1:])}',
          file=sys.stderr)
    return 2
  logging.set_verbosity(logging.WARNING)
  runtime.install_worker_cleanup()
  try:
    try:
      job = prepare()
    except (ValueError, TypeError, OSError) as e:
      # Bad flags or missing data files: one line, no traceback.
      print(f'train: error: {e}', file=sys.stderr)
      return 2
    try:
      train(*job)
    except (simulation.SimulationError, task_base.TaskError) as e:
      print(f'train: error: {e}', file=sys.stderr)
      return 1
    except KeyboardInterrupt:
      print('train: interrupted; rerun the same command to resume from the '
            'last checkpoint', file=sys.stderr)
      return 130
  finally:
    runtime.kill_workers()
  return 0


def run_main() -> None:
  """Console-script entry point."""
  app.run(lambda argv: runtime.exit_now(main(argv)))


if __name__ == '__main__':
  run_main()
