# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""A NumPy simulator of FedProx and FedAvg with stragglers (thesis ch. 3).

FedProx (Li et al., MLSys 2020, arXiv:1812.06127), thesis section 3.4.2 and
Figures 3.1, 3.2 and 3.5: 30 devices with power-law sizes, 10 sampled
uniformly per round, E = 20 local epochs of mini-batch SGD (lr 0.01, batch
10) on softmax regression; 0%, 50% or 90% of the selected devices are
stragglers that run x epochs, x uniform in {1, ..., E}. FedAvg drops the
stragglers, FedProx aggregates their partial solutions; mu is the proximal
strength (mu = 0 with stragglers kept is "FedProx mu = 0").

The data (`tasks.synthetic.generate`, `split_arrays`), the client sampling
(`run.simulation.sample_clients`) and the straggler schedule
(`tff_algos.stragglers.StragglerSchedule`) are the training binary's own.
The local solver is plain SGD on F_k(w) + mu/2 ||w - w_t||^2 in float64.
Two choices are flags:

* `weighting`: `samples` weights a model by its client's size n_k, as the
  authors' code does (flearn/trainers/fedbase.py `aggregate`); `processed`
  by the examples it processed (x n_k for a straggler), as the library's
  `build_fed_prox` does (TFF's NUM_EXAMPLES convention).
* `shuffle`: each epoch in a fresh random order (NumPy's, not tf.data's, so
  runs match the binary in distribution only), or the stored order, with
  which `tests/test_fedprox_sim.py` checks this module equal to the binary's
  simulation loop with `build_fed_prox` on a short case.

  python -m run.experiments.fedprox_sim --datasets=1_1 --stragglers=0.9 \
      --seeds=0,1,2
"""

import sys

if not (3, 9) <= sys.version_info[:2] <= (3, 11):
  sys.exit('error: needs Python 3.9, 3.10 or 3.11 (TFF 0.87)')

# pylint: disable=g-import-not-at-top,wrong-import-position
import dataclasses
import time

from absl import flags
import numpy as np

from tasks import synthetic
from tff_algos import stragglers as stragglers_lib

# pylint: enable=g-import-not-at-top,wrong-import-position

VARIANTS = ('fedavg', 'mu0', 'mu')


@dataclasses.dataclass(frozen=True)
class Setting:
  """One simulated run (defaults: thesis section 3.4 / Figure 3.1)."""

  dataset: str = '1_1'  # 'iid' or 'ALPHA_BETA'
  straggler_fraction: float = 0.0
  drop_stragglers: bool = False  # True: FedAvg.
  mu: float = 0.0
  rounds: int = 200
  seed: int = 0
  num_clients: int = 30
  clients_per_round: int = 10
  epochs: int = 20
  learning_rate: float = 0.01
  batch_size: int = 10
  test_fraction: float = 0.2
  weighting: str = 'samples'
  sampling: str = 'uniform'
  shuffle: bool = True
  eval_every: int = 10

  def alpha_beta(self) -> tuple[bool, float, float]:
    if self.dataset == 'iid':
      return True, 0.0, 0.0
    try:
      alpha, beta = (float(v) for v in self.dataset.split('_'))
    except ValueError:
      raise ValueError(
          f"dataset must be 'iid' or 'ALPHA_BETA', got " f'{self.dataset!r}'
      ) from None
    return False, alpha, beta

  def validate(self) -> None:
    """Raises ValueError on an out-of-range option."""
    self.alpha_beta()
    if not 0.0 <= self.straggler_fraction <= 1.0:
      raise ValueError(
          'straggler_fraction must be in [0, 1], got '
          f'{self.straggler_fraction}'
      )
    if self.mu < 0 or not np.isfinite(self.mu):
      raise ValueError(f'mu must be >= 0, got {self.mu}')
    if self.weighting not in ('samples', 'processed'):
      raise ValueError(
          f"weighting must be 'samples' or 'processed', got "
          f'{self.weighting!r}'
      )
    if min(self.rounds, self.epochs, self.batch_size, self.eval_every) < 1:
      raise ValueError('rounds, epochs, batch_size and eval_every must be >= 1')
    if not 1 <= self.clients_per_round <= self.num_clients:
      raise ValueError(f'clients_per_round must be in [1, {self.num_clients}]')


def _softmax_probs(logits):
  logits = logits - logits.max(axis=-1, keepdims=True)
  p = np.exp(logits)
  return p / p.sum(axis=-1, keepdims=True)


def local_solve(w0, b0, x, y, *, plan, learning_rate, mu, batch_size, rng=None):
  """FedProx's local solver for one client's `stragglers.ClientPlan`.

  Mini-batch SGD on the mean cross-entropy plus mu/2 ||(w, b) - (w0, b0)||^2,
  `plan.epochs` epochs (batches never straddle epochs), cut at
  `plan.num_batches` batches for a fractional (E = 1) straggler.

  Returns:
    `(w, b, examples_processed)`.
  """
  n = len(y)
  limit = plan.num_batches(-(-n // batch_size))
  w, b = w0.copy(), b0.copy()
  done = processed = 0
  for _ in range(plan.epochs):
    order = rng.permutation(n) if rng is not None else np.arange(n)
    for start in range(0, n, batch_size):
      if done >= limit:
        return w, b, processed
      idx = order[start : start + batch_size]
      xb = x[idx]
      p = _softmax_probs(xb @ w + b)
      p[np.arange(len(idx)), y[idx]] -= 1.0
      p /= len(idx)
      w = w - learning_rate * (xb.T @ p + mu * (w - w0))
      b = b - learning_rate * (p.sum(axis=0) + mu * (b - b0))
      done += 1
      processed += len(idx)
  return w, b, processed


def pooled_loss_and_accuracy(w, b, arrays):
  """Example-weighted mean loss and accuracy over `arrays` (id -> (x, y))."""
  total_loss = correct = count = 0.0
  for x, y in arrays.values():
    logits = x @ w + b
    p = _softmax_probs(logits)
    total_loss += -np.log(np.maximum(p[np.arange(len(y)), y], 1e-300)).sum()
    correct += float((np.argmax(logits, axis=1) == y).sum())
    count += len(y)
  return total_loss / count, correct / count


def simulate(setting: Setting, *, log=None) -> dict:
  """Runs `setting`; returns the final metrics and the training-loss curve."""
  setting.validate()
  # Imported here: run.simulation imports TFF (seconds), needed only for the
  # sampling rule shared with the training binary.
  from run import simulation  # pylint: disable=g-import-not-at-top

  iid, alpha, beta = setting.alpha_beta()
  clients = synthetic.generate(
      num_clients=setting.num_clients,
      alpha=alpha,
      beta=beta,
      iid=iid,
      seed=setting.seed,
      size_law='fedprox',
  )
  train, test, _ = synthetic.split_arrays(
      clients, seed=setting.seed, test_fraction=setting.test_fraction
  )
  train = {c: (x.astype(np.float64), y) for c, (x, y) in train.items()}
  test = {c: (x.astype(np.float64), y) for c, (x, y) in test.items()}
  ids = sorted(train)
  schedule = stragglers_lib.StragglerSchedule(
      fraction=setting.straggler_fraction,
      epochs=setting.epochs,
      drop_stragglers=setting.drop_stragglers,
      seed=setting.seed,
  )
  w = np.zeros((synthetic.NUM_FEATURES, synthetic.NUM_CLASSES))
  b = np.zeros(synthetic.NUM_CLASSES)
  curve = []
  start = time.time()
  for round_num in range(1, setting.rounds + 1):
    selected = simulation.sample_clients(
        ids,
        round_num,
        clients_per_round=setting.clients_per_round,
        seed=setting.seed,
        scheme=setting.sampling,
        num_examples=[len(train[c][1]) for c in ids],
    )
    plans = schedule.participants(round_num, selected)
    models, weights = [], []
    for i, plan in enumerate(plans):
      x, y = train[plan.client_id]
      rng = (
          np.random.default_rng([setting.seed, round_num, i, 17])
          if setting.shuffle
          else None
      )
      wk, bk, processed = local_solve(
          w,
          b,
          x,
          y,
          plan=plan,
          learning_rate=setting.learning_rate,
          mu=setting.mu,
          batch_size=setting.batch_size,
          rng=rng,
      )
      models.append((wk, bk))
      weights.append(len(y) if setting.weighting == 'samples' else processed)
    if models:
      a = np.asarray(weights, np.float64) / np.sum(weights)
      w = sum(ak * m[0] for ak, m in zip(a, models))
      b = sum(ak * m[1] for ak, m in zip(a, models))
    if round_num % setting.eval_every == 0 or round_num == setting.rounds:
      curve.append((round_num, pooled_loss_and_accuracy(w, b, train)[0]))
      if log and round_num % max(1, setting.rounds // 4) == 0:
        log(
            f'  round {round_num}: train loss {curve[-1][1]:.4f}, '
            f'{time.time() - start:.0f} s'
        )
  train_loss, train_accuracy = pooled_loss_and_accuracy(w, b, train)
  _, test_accuracy = pooled_loss_and_accuracy(w, b, test)
  return {
      'w': w,
      'b': b,
      'curve': curve,
      'train_loss': train_loss,
      'train_accuracy': train_accuracy,
      'test_accuracy': test_accuracy,
  }


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the flags (at start-up only: absl flags are global)."""
  flags.DEFINE_list(
      'datasets', ['1_1'], "Datasets: 'iid' or ALPHA_BETA (e.g. 0.5_0.5)."
  )
  flags.DEFINE_list('stragglers', ['0', '0.5', '0.9'], 'Straggler fractions.')
  flags.DEFINE_list(
      'variants',
      list(VARIANTS),
      'fedavg (drops stragglers), mu0 (FedProx mu = 0), mu '
      '(FedProx with --mu).',
  )
  flags.DEFINE_float(
      'mu', 1.0, 'mu of the `mu` variant (thesis: 1 for Synthetic).'
  )
  flags.DEFINE_integer('rounds', 200, 'Rounds.')
  flags.DEFINE_integer('epochs', 20, 'E, local epochs of a non-straggler.')
  flags.DEFINE_list('seeds', ['0', '1', '2'], 'Data/sampling seeds.')
  flags.DEFINE_enum(
      'weighting',
      'samples',
      ['samples', 'processed'],
      "Aggregation weights: n_k (the authors' code) or "
      'examples processed (the library).',
  )


def _variant_setting(variant, **common) -> Setting:
  if variant == 'fedavg':
    return Setting(drop_stragglers=True, mu=0.0, **common)
  return Setting(mu=0.0 if variant == 'mu0' else FLAGS.mu, **common)


def main(argv) -> int:
  from run import console  # pylint: disable=g-import-not-at-top

  code = console.unexpected_arguments('fedprox_sim', argv)
  if code is not None:
    return code
  log = lambda s: print(s, file=sys.stderr, flush=True)
  try:
    fractions = [float(v) for v in FLAGS.stragglers]
    seeds = [int(s) for s in FLAGS.seeds]
    bad = set(FLAGS.variants) - set(VARIANTS)
    if bad:
      raise ValueError(
          f'unknown variants {sorted(bad)}; choose from '
          f'{", ".join(VARIANTS)}'
      )
    for d in FLAGS.datasets:
      Setting(dataset=d).validate()
  except ValueError as e:
    print(f'fedprox_sim: error: {e}', file=sys.stderr)
    return 2
  print(
      '| dataset | stragglers | variant | seed | train loss | test accuracy'
      ' % | max train loss, 2nd half | seconds |'
  )
  print('|---|---|---|---|---|---|---|---|')
  results = {}
  for dataset in FLAGS.datasets:
    for fraction in fractions:
      for variant in FLAGS.variants:
        for seed in seeds:
          common = dict(
              dataset=dataset,
              straggler_fraction=fraction,
              rounds=FLAGS.rounds,
              epochs=FLAGS.epochs,
              seed=seed,
              weighting=FLAGS.weighting,
          )
          twin = {'fedavg': 'mu0', 'mu0': 'fedavg'}.get(variant)
          if fraction == 0.0 and (dataset, fraction, twin, seed) in results:
            # No stragglers: FedAvg is FedProx mu = 0, the same run.
            results[(dataset, fraction, variant, seed)] = results[
                (dataset, fraction, twin, seed)
            ]
            continue
          t0 = time.time()
          try:
            r = simulate(_variant_setting(variant, **common), log=log)
          except ValueError as e:
            print(f'fedprox_sim: error: {e}', file=sys.stderr)
            return 2
          r['seconds'] = time.time() - t0
          results[(dataset, fraction, variant, seed)] = r
          late = [v for rnd, v in r['curve'] if rnd > FLAGS.rounds // 2]
          print(
              f'| {dataset} | {fraction:g} | {variant} | {seed} | '
              f'{r["train_loss"]:.4f} | {100 * r["test_accuracy"]:.2f} | '
              f'{max(late):.4f} | {r["seconds"]:.0f} |',
              flush=True,
          )
  print()
  print('Mean (std) over seeds, and paired per-seed differences:')
  print()
  print(
      '| dataset | stragglers | variant | train loss | test accuracy % |'
      ' test acc. minus FedAvg, per seed | minus FedProx mu=0, per seed |'
  )
  print('|---|---|---|---|---|---|---|')
  for dataset in FLAGS.datasets:
    for fraction in fractions:
      for variant in FLAGS.variants:
        rs = [results.get((dataset, fraction, variant, s)) for s in seeds]
        if None in rs:
          continue
        loss = np.array([r['train_loss'] for r in rs])
        acc = 100 * np.array([r['test_accuracy'] for r in rs])
        cells = []
        for ref in ('fedavg', 'mu0'):
          refs = [results.get((dataset, fraction, ref, s)) for s in seeds]
          if ref == variant or None in refs:
            cells.append('')
            continue
          diff = acc - 100 * np.array([r['test_accuracy'] for r in refs])
          cells.append(
              ' / '.join(f'{d:+.2f}' for d in diff)
              + f' (mean {diff.mean():+.2f})'
          )
        print(
            f'| {dataset} | {fraction:g} | {variant} | {loss.mean():.4f} '
            f'({loss.std():.3f}) | {acc.mean():.2f} ({acc.std():.2f}) | '
            + ' | '.join(cells)
            + ' |'
        )
  from tff_algos import runtime  # pylint: disable=g-import-not-at-top

  runtime.kill_workers()
  runtime.disarm_service_managers()
  return 0


def run_main() -> None:
  """Console-script entry point."""
  from run import console  # pylint: disable=g-import-not-at-top

  define_flags()
  console.run(__name__, lambda argv: sys.exit(main(argv)))


if __name__ == '__main__':
  run_main()
