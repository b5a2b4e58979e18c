# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""A NumPy simulator of q-FedAvg and TERM on the synthetic task, for long runs.

The authors' q-FFL code suggests 20,000 rounds for Synthetic(1,1)
(litian96/fair_flearn README), 20x what the TFF path of `run.train` affords
here in an hour. This simulator runs the same update rules (thesis Algorithm 4
for q-FedAvg, tilted client weights for TERM, mini-batch SGD on softmax
regression) on the same data (`tasks.synthetic.generate` and
`split_arrays`) with the same client sampling (`run.simulation.sample_clients`),
training the round's clients together with padded, masked batches. It is a
diagnostic next to the training binary, not a replacement: the binary's
algorithms are the ones tested against independent oracles; this module is
tested against the same oracle (`tests/test_numpy_sim.py`).

  python -m run.experiments.numpy_sim --algorithm=qffl --q=1 \
      --rounds=20000 --seeds=0,1,2

Data settings of thesis Table 4.10: `--iid` (Synthetic-IID), `--alpha` and
`--beta` (Synthetic(alpha, beta)) and `--num_clients` (e.g. 50 devices).
`--evaluate=test,train` also reports accuracy on the clients' training splits
(thesis Table 4.6), from the same final model.
"""

import sys

if not (3, 9) <= sys.version_info[:2] <= (3, 11):
  sys.exit('error: needs Python 3.9, 3.10 or 3.11 (TFF 0.87)')

# pylint: disable=g-import-not-at-top,wrong-import-position
import dataclasses
import time

from absl import flags
import numpy as np

from run import console
from tasks import synthetic
from tasks import tail_metrics

# pylint: enable=g-import-not-at-top,wrong-import-position


@dataclasses.dataclass(frozen=True)
class Setting:
  """One simulated run (defaults: thesis section 4.6.2, Synthetic(1,1))."""

  algorithm: str = 'qffl'
  q: float = 0.0
  tilt: float = 0.0
  rounds: int = 1000
  seed: int = 0
  num_clients: int = 100
  alpha: float = 1.0
  beta: float = 1.0
  iid: bool = False
  size_law: str = 'table_4_4'
  test_fraction: float = 0.1
  clients_per_round: int = 10
  learning_rate: float = 0.1
  batch_size: int = 10
  sampling: str = 'examples'

  def validate(self) -> None:
    """Raises ValueError on an unknown algorithm or an impossible size."""
    if self.algorithm not in ('qffl', 'term'):
      raise ValueError(
          f'unknown algorithm {self.algorithm!r}; choose qffl or' ' term'
      )
    if self.q < 0 or not np.isfinite(self.q):
      raise ValueError(f'q must be >= 0, got {self.q}')
    if not np.isfinite(self.tilt):
      raise ValueError(f'tilt must be finite, got {self.tilt}')
    if self.rounds < 1 or self.batch_size < 1 or self.learning_rate <= 0:
      raise ValueError('rounds, batch_size and learning_rate must be positive')
    if not (0 <= self.alpha < np.inf and 0 <= self.beta < np.inf):
      raise ValueError(
          f'alpha and beta must be finite and >= 0, got {self.alpha},'
          f' {self.beta}'
      )
    if not 1 <= self.clients_per_round <= self.num_clients:
      raise ValueError(f'clients_per_round must be in [1, {self.num_clients}]')


def _softmax_probs(logits):
  logits = logits - logits.max(axis=-1, keepdims=True)
  p = np.exp(logits)
  return p / p.sum(axis=-1, keepdims=True)


def client_loss(w, b, x, y) -> float:
  """Mean cross-entropy of softmax(x @ w + b)."""
  p = _softmax_probs(x.astype(np.float64) @ w + b)
  return float(-np.log(np.maximum(p[np.arange(len(y)), y], 1e-300)).mean())


def local_sgd(w, b, clients, *, learning_rate, batch_size, rng=None):
  """One epoch of mini-batch SGD from (w, b) on each client, all together.

  Args:
    w, b: The broadcast model, float64 `[d, c]` and `[c]`.
    clients: A list of `(x, y)`; batches follow the given order (shuffled
      first when `rng` is given) and never straddle clients.
    learning_rate, batch_size: Local SGD settings.
    rng: Shuffles each client's examples when given.

  Returns:
    `(W, B)`: the clients' final models, `[K, d, c]` and `[K, c]`.
  """
  k = len(clients)
  steps = max(-(-len(y) // batch_size) for _, y in clients)
  d = w.shape[0]
  xs = np.zeros((k, steps * batch_size, d))
  ys = np.zeros((k, steps * batch_size), np.int64)
  mask = np.zeros((k, steps * batch_size))
  for i, (x, y) in enumerate(clients):
    order = rng.permutation(len(y)) if rng is not None else np.arange(len(y))
    xs[i, : len(y)] = x[order]
    ys[i, : len(y)] = y[order]
    mask[i, : len(y)] = 1.0
  xs = xs.reshape((k, steps, batch_size, d))
  ys = ys.reshape((k, steps, batch_size))
  mask = mask.reshape((k, steps, batch_size))
  ww = np.repeat(w[None], k, axis=0)
  bb = np.repeat(b[None], k, axis=0)
  rows = np.arange(batch_size)
  for s in range(steps):
    count = mask[:, s].sum(axis=1)
    p = _softmax_probs(np.einsum('kbd,kdc->kbc', xs[:, s], ww) + bb[:, None])
    p[np.arange(k)[:, None], rows[None], ys[:, s]] -= 1.0
    p *= (mask[:, s] / np.maximum(count, 1.0)[:, None])[..., None]
    ww -= learning_rate * np.einsum('kbd,kbc->kdc', xs[:, s], p)
    bb -= learning_rate * p.sum(axis=1)
  return ww, bb


def aggregate(setting: Setting, w, b, losses, sizes, ww, bb):
  """The server step of q-FedAvg (Algorithm 4) or TERM from local models."""
  if setting.algorithm == 'qffl':
    lipschitz = 1.0 / setting.learning_rate
    dw, db = lipschitz * (w[None] - ww), lipschitz * (b[None] - bb)
    sq_norm = (dw**2).sum(axis=(1, 2)) + (db**2).sum(axis=1)
    fq = losses**setting.q
    h = lipschitz * fq
    if setting.q:
      h = h + setting.q * losses ** (setting.q - 1) * sq_norm
    coef = fq / h.sum()
    return (
        w - np.einsum('k,kdc->dc', coef, dw),
        b - np.einsum('k,kc->c', coef, db),
    )
  logits = setting.tilt * losses + np.log(sizes)
  weights = np.exp(logits - logits.max())
  weights /= weights.sum()
  return np.einsum('k,kdc->dc', weights, ww), np.einsum('k,kc->c', weights, bb)


SPLITS = ('test', 'train')


def client_data(setting: Setting):
  """`(train, test)`: per-client arrays of `setting`'s data, keyed by id."""
  clients = synthetic.generate(
      num_clients=setting.num_clients,
      alpha=setting.alpha,
      beta=setting.beta,
      iid=setting.iid,
      seed=setting.seed,
      size_law=setting.size_law,
  )
  train, test, _ = synthetic.split_arrays(
      clients, seed=setting.seed, test_fraction=setting.test_fraction
  )
  return train, test


def simulate(setting: Setting, *, log=None) -> dict:
  """Runs `setting`; returns the test-accuracy summary over clients."""
  return simulate_splits(setting, ('test',), log=log)['test']


def simulate_splits(setting: Setting, splits, *, log=None) -> dict:
  """Runs `setting`; returns `{split: accuracy summary over clients}`.

  `splits` names the data the final model is scored on, each of `SPLITS`:
  'test' (the clients' held-out examples) or 'train' (their training
  examples, thesis Table 4.6).
  """
  setting.validate()
  unknown = [s for s in splits if s not in SPLITS]
  if unknown or not splits:
    raise ValueError(f'splits must be some of {SPLITS}, got {list(splits)}')
  # Imported here: run.simulation imports TFF (seconds), needed only for the
  # sampling rule shared with the training binary.
  from run import simulation  # pylint: disable=g-import-not-at-top

  train, test = client_data(setting)
  ids = sorted(train)
  sizes = np.array([len(train[c][1]) for c in ids], np.float64)
  w = np.zeros((synthetic.NUM_FEATURES, synthetic.NUM_CLASSES))
  b = np.zeros(synthetic.NUM_CLASSES)
  start = time.time()
  for round_num in range(1, setting.rounds + 1):
    chosen = simulation.sample_clients(
        ids,
        round_num,
        clients_per_round=setting.clients_per_round,
        seed=setting.seed,
        scheme=setting.sampling,
        num_examples=sizes,
    )
    data = [train[c] for c in chosen]
    losses = np.array([client_loss(w, b, x, y) for x, y in data])
    rng = np.random.default_rng([setting.seed, 7, round_num])
    ww, bb = local_sgd(
        w,
        b,
        data,
        learning_rate=setting.learning_rate,
        batch_size=setting.batch_size,
        rng=rng,
    )
    w, b = aggregate(
        setting,
        w,
        b,
        losses,
        np.array([len(y) for _, y in data], np.float64),
        ww,
        bb,
    )
    if log and round_num % max(1, setting.rounds // 10) == 0:
      log(f'  round {round_num}: {time.time() - start:.0f} s')
  return {
      split: _accuracy_summary(w, b, {'test': test, 'train': train}[split])
      for split in splits
  }


def _accuracy_summary(w, b, data) -> dict:
  ids = sorted(data)
  accuracy = np.array(
      [
          float((np.argmax(data[c][0] @ w + b, axis=1) == data[c][1]).mean())
          for c in ids
      ]
  )
  counts = np.array([len(data[c][1]) for c in ids])
  return tail_metrics.summarize_clients(accuracy, counts, kind='accuracy')


def _end_workers() -> None:
  from tff_algos import runtime  # pylint: disable=g-import-not-at-top

  runtime.kill_workers()
  runtime.disarm_service_managers()


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the flags (at start-up only: absl flags are global)."""
  flags.DEFINE_enum('algorithm', 'qffl', ['qffl', 'term'], 'q-FedAvg or TERM.')
  flags.DEFINE_list('q', ['0', '1'], 'q values (qffl).')
  flags.DEFINE_list('tilt', ['0', '1'], 'Tilts (term).')
  flags.DEFINE_integer('rounds', 1000, 'Rounds.')
  flags.DEFINE_list('seeds', ['0', '1', '2'], 'Data/sampling seeds.')
  flags.DEFINE_enum(
      'size_law', 'table_4_4', list(synthetic.SIZE_LAWS), 'Client-size law.'
  )
  flags.DEFINE_enum(
      'client_sampling', 'examples', ['examples', 'uniform'], 'Client sampling.'
  )
  flags.DEFINE_float('learning_rate', 0.1, 'Local lr (= 1/L for q-FFL).')
  flags.DEFINE_integer('num_clients', 100, 'Number of clients (devices).')
  flags.DEFINE_float('alpha', 1.0, 'Synthetic(alpha, beta): model spread.')
  flags.DEFINE_float('beta', 1.0, 'Synthetic(alpha, beta): feature spread.')
  flags.DEFINE_bool(
      'iid',
      False,
      'Synthetic-IID (one W, b for all clients; alpha, beta unused).',
  )
  flags.DEFINE_list(
      'evaluate', ['test'], 'Splits to score the final model on: test, train.'
  )


def setting_from_flags(flag_values, value: float, seed: int) -> Setting:
  """The `Setting` of one (q or tilt, seed) run under `flag_values`."""
  return Setting(
      algorithm=flag_values.algorithm,
      rounds=flag_values.rounds,
      seed=seed,
      num_clients=flag_values.num_clients,
      alpha=flag_values.alpha,
      beta=flag_values.beta,
      iid=flag_values.iid,
      size_law=flag_values.size_law,
      sampling=flag_values.client_sampling,
      learning_rate=flag_values.learning_rate,
      **({'q': value} if flag_values.algorithm == 'qffl' else {'tilt': value}),
  )


COLUMNS = (
    'weighted_mean',
    'mean',
    'worst10',
    'best10',
    'variance',
    'angle_deg',
    'kl_uniform',
)


def main(argv) -> int:
  code = console.unexpected_arguments('numpy_sim', argv)
  if code is not None:
    return code
  log = lambda s: print(s, file=sys.stderr, flush=True)
  try:
    values = [
        float(v) for v in (FLAGS.q if FLAGS.algorithm == 'qffl' else FLAGS.tilt)
    ]
    seeds = [int(s) for s in FLAGS.seeds]
  except ValueError as e:
    print(f'numpy_sim: error: {e}', file=sys.stderr)
    return 2
  splits = list(FLAGS.evaluate)
  if not splits or any(s not in SPLITS for s in splits):
    print(
        f'numpy_sim: error: --evaluate takes some of {",".join(SPLITS)}, got'
        f' {",".join(splits)}',
        file=sys.stderr,
    )
    return 2
  name = 'q' if FLAGS.algorithm == 'qffl' else 't'
  label = lambda value, split: (
      f'{value:g}' if split == 'test' else f'{value:g} ({split})'
  )
  print(f'| {name} | seed | ' + ' | '.join(COLUMNS) + ' |')
  print('|' + '---|' * (len(COLUMNS) + 2))
  rows = {}
  for value in values:
    for seed in seeds:
      setting = setting_from_flags(FLAGS, value, seed)
      start = time.time()
      try:
        summaries = simulate_splits(setting, splits, log=log)
      except ValueError as e:
        print(f'numpy_sim: error: {e}', file=sys.stderr)
        return 2
      log(f'{name} = {value:g}, seed {seed}: {time.time() - start:.0f} s')
      for split in splits:
        summary = summaries[split]
        rows.setdefault((value, split), []).append(summary)
        cells = [
            f'{100 * summary[c]:.2f}'
            if c in ('weighted_mean', 'mean', 'worst10', 'best10')
            else f'{summary[c]:.4g}'
            for c in COLUMNS
        ]
        print(
            f'| {label(value, split)} | {seed} | ' + ' | '.join(cells) + ' |',
            flush=True,
        )
  _end_workers()
  for (value, split), summaries in rows.items():
    cells = []
    for c in COLUMNS:
      v = np.array([s[c] for s in summaries])
      scale = (
          100.0 if c in ('weighted_mean', 'mean', 'worst10', 'best10') else 1.0
      )
      cells.append(f'{scale * v.mean():.4g} ({scale * v.std():.2g})')
    print(f'| {label(value, split)} | mean (std) | ' + ' | '.join(cells) + ' |')
  return 0


def run_main() -> None:
  """Console-script entry point."""
  define_flags()
  console.run(__name__, lambda argv: sys.exit(main(argv)))


if __name__ == '__main__':
  run_main()
