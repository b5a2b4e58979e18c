# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
r"""q-FedAvg's h_k in one round on the q-FFL Shakespeare preset, two scales.

q-FedAvg (Li et al., ICLR 2020, Algorithm 4; `tff_algos.q_ffl`): client k
sends Delta_k = F_k^q dw_k and h_k = q F_k^(q-1) ||dw_k||^2 + L F_k^q, where
F_k is its loss at the broadcast model, dw_k = L (w_t - wbar_k) = (w_t -
wbar_k) / eta after its local SGD, and L = 1 / eta; the server steps
w_t - sum_k Delta_k / sum_k h_k. So the model delta w_t - wbar_k of client k
enters the step with weight

  a_k = L F_k^q / sum_j h_j        (FedAvg, q = 0: 1 / m for m clients),

whose sum over the round, L sum_k F_k^q / sum_k h_k, is the step's size
against FedAvg's. The first term of h_k grows with ||dw_k||^2, i.e. with the
local work (steps, width); at q = 0.001 F_k^q is within 0.25% of 1 for F_k in
[1, 10], so that term is the only way q = 0.001 can move the step.

This binary builds the `qffl` preset of `tasks.shakespeare_leaf` (31 roles,
80-character windows, 8-d embedding, two LSTM layers), takes the initial
model as the broadcast model and runs ONE round of every role's client work
with the library's own functions: `client_work.local_loss` (F_k on the
role's training windows), `client_work.local_training` (one epoch of SGD,
batch 10, the stream reshuffled as in a run) and `q_ffl.engine_definition`'s
client message (h_k). It prints per role n_k, F_k, ||dw_k||^2, the two terms
of h_k, h_k and a_k against 1 / m (all roles in one round), and over
`--sampled_rounds` rounds of 10 roles drawn in proportion to their data
(`run.simulation.sample_clients`, as `--client_sampling=examples`) the range
of the step size against FedAvg's. Scales (`--scales`):

* `thesis`: every window of each role (no cap) and the authors' LSTM(256);
* `scaled`: the scaled runs of docs/results/qffl_shakespeare.md (each role's
  first 150 windows, LSTM(32)).

One thesis-scale round of all 31 roles is about 10,900 local steps of the
LSTM(256) (over half an hour on two shared CPU cores); `--roles_every` and
`--roles_offset` keep a size-ranked subset, the same roles at every scale.

  python -m run.shakespeare_text --output_dir=/tmp/shkdata
  python -m run.experiments.qffl_h_scale --data_dir=/tmp/shkdata \
      --scales=scaled,thesis --roles_every=3 --roles_offset=1 \
      --output_md=/tmp/qffl_h_scale.md
"""

import dataclasses
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from run import atomic
from run import console
from run import run_dir
from run import simulation
from tasks import base
from tasks import shakespeare_leaf
from tff_algos import client_work
from tff_algos import q_ffl
from tff_algos import runtime

# pylint: enable=g-import-not-at-top,wrong-import-position

# name -> (LSTM units, windows kept per role; None: all).
SCALES = {'thesis': (256, None), 'scaled': (32, 150)}

_DATA_DIR = None
_SYNTHETIC = None
_SCALES = None
_QS = None
_SEED = None
_LR = None
_BATCH = None
_ROLES_EVERY = None
_ROLES_OFFSET = None
_CLIENTS_PER_ROUND = None
_SAMPLED_ROUNDS = None
_OUTPUT = None


def define_flags() -> None:
  """Defines the command-line flags."""
  global _DATA_DIR, _SYNTHETIC, _SCALES, _QS, _SEED, _LR, _BATCH
  global _ROLES_EVERY, _ROLES_OFFSET, _CLIENTS_PER_ROUND, _SAMPLED_ROUNDS
  global _OUTPUT
  _DATA_DIR = flags.DEFINE_string(
      'data_dir', None, 'Directory with shakespeare.sqlite (TFF schema).'
  )
  _SYNTHETIC = flags.DEFINE_boolean(
      'use_synthetic_data', False, 'Seeded random role texts (no files).'
  )
  _SCALES = flags.DEFINE_list(
      'scales', ['scaled', 'thesis'], f'Any of {", ".join(SCALES)}.'
  )
  _QS = flags.DEFINE_list('q', ['0.001'], 'q values (h_k for each).')
  _SEED = flags.DEFINE_integer(
      'seed', 0, 'Task seed (roles, split, initial model, shuffles).'
  )
  _LR = flags.DEFINE_float(
      'client_learning_rate', 0.8, 'Local SGD step eta; L = 1 / eta.'
  )
  _BATCH = flags.DEFINE_integer('client_batch_size', 10, 'Local batch size.')
  _ROLES_EVERY = flags.DEFINE_integer(
      'roles_every',
      1,
      'Subset for a time budget: rank the roles by their training windows '
      'at full scale (ties by name) and keep every this-many-th, from rank '
      '--roles_offset (1: all roles).',
  )
  _ROLES_OFFSET = flags.DEFINE_integer(
      'roles_offset', 0, 'First rank kept (see --roles_every).'
  )
  _CLIENTS_PER_ROUND = flags.DEFINE_integer(
      'clients_per_round', 10, 'Roles per sampled round.'
  )
  _SAMPLED_ROUNDS = flags.DEFINE_integer(
      'sampled_rounds', 200, 'Sampled rounds for the step-size range.'
  )
  _OUTPUT = flags.DEFINE_string('output_md', None, 'Markdown file to write.')


@dataclasses.dataclass(frozen=True)
class ClientRound:
  """One client's round from the broadcast model.

  Attributes:
    client_id: The role.
    num_examples: n_k, training windows processed (one epoch).
    loss: F_k at the broadcast model over its training windows.
    sq_norm: ||dw_k||^2 with dw_k = L (w_t - wbar_k).
    h: q -> h_k as the library's q-FedAvg client message computes it.
  """

  client_id: str
  num_examples: int
  loss: float
  sq_norm: float
  h: dict


def h_terms(loss, sq_norm, *, q: float, lipschitz: float):
  """`(q F^(q-1) ||dw||^2, L F^q)` in float64 (F floored as q_ffl does)."""
  loss = np.asarray(loss, np.float64)
  if q == 0.0:
    return np.zeros_like(loss), lipschitz * np.ones_like(loss)
  curvature = q * np.maximum(loss, q_ffl.LOSS_FLOOR) ** (q - 1.0) * sq_norm
  return curvature, lipschitz * loss**q


def step_weights(loss, h, *, q: float, lipschitz: float):
  """a_k = L F_k^q / sum_j h_j: client k's model delta's weight in the step."""
  loss = np.asarray(loss, np.float64)
  f_q = np.ones_like(loss) if q == 0.0 else loss**q
  return lipschitz * f_q / np.sum(h)


def measure(model_fn, datasets, *, learning_rate: float, qs, log=None):
  """One round of q-FedAvg client work per dataset, from `model_fn()`'s init.

  Args:
    model_fn: No-arg callable returning a `VariableModel`; its initial
      weights are the broadcast model.
    datasets: `client_id -> batched tf.data.Dataset` (one epoch; reshuffled
      between the loss pass and the training pass if it shuffles).
    learning_rate: eta of local SGD; L = 1 / eta.
    qs: q values whose h_k to compute.
    log: Optional `str -> None` progress callback.

  Returns:
    A list of `ClientRound`, in the order of `datasets`.
  """
  lipschitz = 1.0 / learning_rate
  model = model_fn()
  broadcast = tf.nest.map_structure(
      lambda v: tf.constant(v.numpy()),
      tff.learning.models.ModelWeights.from_model(model),
  )
  optimizer = tff.learning.optimizers.build_sgdm(learning_rate=learning_rate)
  definitions = [
      q_ffl.engine_definition(q=float(q), lipschitz_constant=lipschitz)
      for q in qs
  ]

  @tf.function
  def one_client(initial_weights, dataset):
    # As the q-FedAvg client: the loss pass, then training on the stream.
    loss, _ = client_work.local_loss(model, initial_weights, dataset)
    delta, num_examples, non_finite = client_work.local_training(
        model, optimizer, initial_weights, dataset
    )
    flat = tuple(tf.nest.flatten(delta))
    sq_norm = tf.add_n([tf.reduce_sum(tf.square(lipschitz * d)) for d in flat])
    hs = [
        d.client_result(None, loss, None, flat, num_examples, non_finite)[1]
        for d in definitions
    ]
    return loss, num_examples, sq_norm, hs, non_finite

  results = []
  for client_id, dataset in datasets.items():
    start = time.time()
    loss, n, sq_norm, hs, non_finite = one_client(broadcast, dataset)
    if bool(non_finite):
      raise base.TaskError(f'client {client_id}: non-finite local update')
    results.append(
        ClientRound(
            client_id=client_id,
            num_examples=int(n),
            loss=float(loss),
            sq_norm=float(sq_norm),
            h={float(q): float(h) for q, h in zip(qs, hs)},
        )
    )
    if log:
      log(
          f'{client_id}: n={int(n)} F={float(loss):.4f} '
          f'||dw||^2={float(sq_norm):.4g} ({time.time() - start:.0f} s)'
      )
  return results


def sampled_step_sizes(
    rounds, *, q, lipschitz, clients_per_round, num_rounds, seed
):
  """Step size against FedAvg's, L sum F^q / sum h, over sampled rounds."""
  ids = [r.client_id for r in rounds]
  by_id = {r.client_id: r for r in rounds}
  counts = [r.num_examples for r in rounds]
  m = min(clients_per_round, len(ids))
  sizes = []
  for t in range(num_rounds):
    chosen = simulation.sample_clients(
        ids,
        t,
        clients_per_round=m,
        seed=seed,
        scheme='examples',
        num_examples=counts,
    )
    loss = np.array([by_id[c].loss for c in chosen])
    h = np.array([by_id[c].h[q] for c in chosen])
    sizes.append(np.sum(step_weights(loss, h, q=q, lipschitz=lipschitz)))
  return np.asarray(sizes)


def report(name, description, rounds, *, q, lipschitz, **sampling):
  """Markdown lines: per-role table and the ranges."""
  loss = np.array([r.loss for r in rounds])
  sq = np.array([r.sq_norm for r in rounds])
  n = np.array([r.num_examples for r in rounds])
  h = np.array([r.h[q] for r in rounds])
  curvature, lf = h_terms(loss, sq, q=q, lipschitz=lipschitz)
  weights = step_weights(loss, h, q=q, lipschitz=lipschitz)
  m = len(rounds)
  ratio = curvature / lf
  sizes = sampled_step_sizes(rounds, q=q, lipschitz=lipschitz, **sampling)
  rel = np.abs(h - (curvature + lf)) / h
  lines = [
      f'### {name}, q = {q:g} ({description})',
      '',
      f'L = {lipschitz:g}; {m} roles in one round; a_k = L F_k^q / sum h '
      f"against FedAvg's 1/m = {1 / m:.4g}. h_k from the library's client "
      f'message; the two terms recomputed in float64 '
      f'(max relative gap {rel.max():.1e}).',
      '',
      '| role | n_k | F_k | \\|\\|dw_k\\|\\|^2 | q F^(q-1) \\|\\|dw\\|\\|^2 '
      '| L F^q | h_k | first / second | a_k | a_k m |',
      '|---|---|---|---|---|---|---|---|---|---|',
  ]
  for r, c, t, hk, x, w in zip(rounds, curvature, lf, h, ratio, weights):
    lines.append(
        f'| {r.client_id} | {r.num_examples} | {r.loss:.4f} | '
        f'{r.sq_norm:.4g} | {c:.4g} | {t:.5g} | {hk:.5g} | {x:.3g} | '
        f'{w:.4g} | {w * m:.4f} |'
    )
  lines += [
      '',
      f'* n_k {n.min()}-{n.max()} (sum {n.sum()}); F_k {loss.min():.3f}-'
      f'{loss.max():.3f}; ||dw_k||^2 {sq.min():.4g}-{sq.max():.4g}.',
      f'* first term {curvature.min():.4g}-{curvature.max():.4g}, second '
      f'{lf.min():.5g}-{lf.max():.5g}; first / second {ratio.min():.3g}-'
      f'{ratio.max():.3g} (median {np.median(ratio):.3g}); h_k '
      f'{h.min():.5g}-{h.max():.5g}.',
      f'* all {m} roles in one round: sum h = {h.sum():.5g} against '
      f"FedAvg's m L = {m * lipschitz:.5g}; step against FedAvg's "
      f'{weights.sum():.4f}; a_k m {(weights * m).min():.4f}-'
      f'{(weights * m).max():.4f}; the relative weights F_k^q / sum F^q '
      f'differ from 1/m by at most '
      f'{np.max(np.abs(m * lf / lf.sum() - 1)):.2%}.',
      f'* {len(sizes)} sampled rounds of {sampling["clients_per_round"]} '
      f"roles (in proportion to n_k): step against FedAvg's "
      f'{sizes.min():.4f}-{sizes.max():.4f} (median {np.median(sizes):.4f}).',
      '',
  ]
  return lines


def role_subset(counts, *, every: int, offset: int):
  """Roles ranked by `counts` (ascending, ties by name): ranks offset::every."""
  ranked = sorted(counts, key=lambda cid: (counts[cid], cid))
  return ranked[offset::every]


def build_datasets(
    scale, *, data_dir, synthetic, seed, batch_size, every=1, offset=0
):
  """`(description, datasets, model_fn)` of one scale of the qffl preset."""
  units, cap = SCALES[scale]
  common = dict(
      preset='qffl',
      data_dir=data_dir,
      use_synthetic_data=synthetic,
      batch_size=batch_size,
      seed=seed,
  )
  task = shakespeare_leaf.create_task(
      max_examples_per_client=cap, rnn_units=units, **common
  )
  ids = list(task.train_data.client_ids)
  subset = ''
  if every > 1 or offset > 0:
    full = shakespeare_leaf.create_task(**common).train_data
    counts = {cid: len(full.arrays(cid)[1]) for cid in ids}
    ids = role_subset(counts, every=every, offset=offset)
    if not ids:
      raise base.TaskError(f'--roles_offset={offset} leaves no role')
    subset = (
        f' (ranked by full-scale training windows, every {every} from rank '
        f'{offset})'
    )
  datasets = {
      cid: task.train_dataset(cid, epochs=1, shuffle_seed=seed) for cid in ids
  }
  cap_text = 'all windows' if cap is None else f'first {cap} windows'
  description = (
      f'{cap_text} of {len(ids)} roles{subset}, LSTM({units}), batch '
      f'{batch_size}, one epoch; {task.description}'
  )
  return description, datasets, task.model_fn


def _check_flags(qs) -> None:
  unknown = [s for s in _SCALES.value if s not in SCALES]
  if unknown:
    raise base.TaskError(
        f'unknown scale {unknown[0]!r}; choose from {", ".join(SCALES)}'
    )
  if any(not np.isfinite(q) or q < 0 for q in qs):
    raise base.TaskError(f'--q must be finite and >= 0, got {_QS.value}')
  if not _LR.value > 0:
    raise base.TaskError('--client_learning_rate must be > 0')
  if _ROLES_OFFSET.value < 0:
    raise base.TaskError(
        f'--roles_offset must be >= 0, got {_ROLES_OFFSET.value}'
    )
  for name, value in (
      ('roles_every', _ROLES_EVERY.value),
      ('clients_per_round', _CLIENTS_PER_ROUND.value),
      ('sampled_rounds', _SAMPLED_ROUNDS.value),
  ):
    if value is not None and value < 1:
      raise base.TaskError(f'--{name} must be >= 1, got {value}')


def main(argv) -> int:
  code = console.unexpected_arguments('qffl_h_scale', argv)
  if code is not None:
    return code
  runtime.install_worker_cleanup()
  try:
    qs = [float(q) for q in _QS.value]
    _check_flags(qs)
  except (ValueError, base.TaskError) as e:
    print(f'qffl_h_scale: error: {e}', file=sys.stderr)
    return 2
  if run_dir.refuse_output_file(
      _OUTPUT.value, flag='--output_md', prog='qffl_h_scale'
  ):
    return 2
  lipschitz = 1.0 / _LR.value
  lines = []
  for scale in _SCALES.value:
    start = time.time()
    try:
      description, datasets, model_fn = build_datasets(
          scale,
          data_dir=_DATA_DIR.value,
          synthetic=_SYNTHETIC.value,
          seed=_SEED.value,
          batch_size=_BATCH.value,
          every=_ROLES_EVERY.value,
          offset=_ROLES_OFFSET.value,
      )
      rounds = measure(
          model_fn,
          datasets,
          learning_rate=_LR.value,
          qs=qs,
          log=lambda s, tag=scale: print(
              f'[{tag}] {s}', file=sys.stderr, flush=True
          ),
      )
    except base.TaskError as e:
      print(f'qffl_h_scale: error: {e}', file=sys.stderr)
      return 2
    elapsed = time.time() - start
    for q in qs:
      lines += report(
          scale,
          f'{description}; {elapsed:.0f} s',
          rounds,
          q=q,
          lipschitz=lipschitz,
          clients_per_round=_CLIENTS_PER_ROUND.value,
          num_rounds=_SAMPLED_ROUNDS.value,
          seed=_SEED.value,
      )
    print('\n'.join(lines[-(len(rounds) + 14) :]), file=sys.stderr, flush=True)
  text = '\n'.join(lines)
  print(text)
  if _OUTPUT.value:
    atomic.write_text(_OUTPUT.value, text)
  runtime.kill_workers()
  return 0


def run_main() -> None:
  """Console-script entry point."""
  define_flags()
  console.run(__name__, lambda argv: sys.exit(main(argv)))


if __name__ == '__main__':
  run_main()
