# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Simulated corrupted clients: attacks A1-A3 of the Ditto chapter.

T. Li, S. Hu, A. Beirami, V. Smith, "Ditto: Fair and Robust Federated
Learning Through Personalization", ICML 2021, https://arxiv.org/abs/2012.04221
(thesis section 2.3 and chapter 5). A fixed, seeded fraction of all clients
is corrupted for the whole run (`corrupted_clients`); whenever one of them is
selected it attacks:

* A1 `label_poison` (data level, any algorithm): every training example of a
  corrupted client gets a uniformly random label in [0, num_classes), drawn
  once per example (a stateless function of the seed, the client id and the
  example's position), so the client holds one consistently poisoned dataset,
  as "their training samples are poisoned" (the thesis's multi-class rule;
  flipping is only defined for binary labels). It then trains normally.
* A2 `gaussian` (update level): the client's update is replaced by
  N(0, sigma^2 I) noise (sigma = `scale`, default 1.0; the thesis leaves the
  variance unspecified), drawn from a seed of (run seed, round, client).
* A3 `model_replacement` (update level): the client trains normally and sends
  `scale` times its update. The default scale is -K / eta_s (K clients per
  round, server learning rate eta_s): the boosting of Bagdasaryan et al.
  ("How To Backdoor Federated Learning", AISTATS 2020,
  https://arxiv.org/abs/1807.00459) that lets one client replace the global
  model, applied to the reversed honest update (adversarial model
  w_t + Delta_k, the opposite of the client's training). The thesis gives
  only "scaled so they dominate", "> 10x".

Update-level attacks wrap a `ClientWorkProcess` (`UpdateAttack`): its client
data become `OrderedDict(data=<original>, attack=<marker dataset>)`, the
marker carrying `[corrupted, noise_seed]` (int32), built by the simulation
loop like AFL's client index. Benign clients' results pass through unchanged
and the weight of every client is kept. `build_fed_avg`, `build_fed_prox`,
`build_term` and `build_delta_fl` (through
`tff_algos.composition.compose_model_delta_process`) take
`update_attack=UpdateAttack(...)`; any other client work producing a
`ClientResult` can be wrapped with `wrap_client_work` (e.g. Ditto's). Metrics
are reported on benign clients (`benign_only`).
"""

import collections
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Optional

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import options as options_lib

ATTACKS = ('none', 'label_poison', 'gaussian', 'model_replacement')
UPDATE_ATTACKS = ('gaussian', 'model_replacement')
MARKER_KEY = 'attack'
LABEL_KEYS = ('y', 'label')
MARKER_TYPE = tff.SequenceType(tff.TensorType(np.int32, [2]))


@dataclasses.dataclass(frozen=True)
class AttackConfig:
  """Which clients are corrupted and how (the simulation loop's part).

  Attributes:
    kind: One of `ATTACKS`.
    fraction: Fraction of all training clients corrupted, in [0, 1).
    seed: Seed of the corrupted set, the poisoned labels and the noise.
    num_classes: `label_poison`: labels are drawn from [0, num_classes).
  """

  kind: str = 'none'
  fraction: float = 0.0
  seed: int = 0
  num_classes: int = 0

  def validate(self) -> None:
    """Raises `ValueError` with one clear message for a bad option."""
    if self.kind not in ATTACKS:
      raise ValueError(
          f'unknown attack {self.kind!r}; choose one of: {", ".join(ATTACKS)}'
      )
    if not (math.isfinite(self.fraction) and 0.0 <= self.fraction < 1.0):
      raise ValueError(
          f'attack fraction must be in [0, 1), got {self.fraction}'
      )
    if self.kind == 'none' and self.fraction:
      raise ValueError('an attack fraction needs an attack (not none)')
    if self.kind != 'none' and not self.fraction:
      raise ValueError(f'attack {self.kind} needs a fraction in (0, 1)')
    if self.kind == 'label_poison' and self.num_classes < 2:
      raise ValueError(
          f'label_poison needs num_classes >= 2, got {self.num_classes}'
      )

  @property
  def is_update_attack(self) -> bool:
    return self.kind in UPDATE_ATTACKS


@dataclasses.dataclass(frozen=True)
class AttackOptions(options_lib.Options):
  """A run's corrupted clients, declared as options (a flag each).

  `attack` and `attack_scale` shape the process (an update attack wraps
  its client work); `attack_fraction` is the population's share of
  corrupted clients (`config` gives the simulation's `AttackConfig`, whose
  `validate` checks it against the attack).
  """

  attack: str = options_lib.option(
      'none',
      'Corrupted clients: none, label_poison (A1), gaussian (A2) or '
      'model_replacement (A3); metrics are then reported on benign clients.',
      choices=ATTACKS,
  )
  attack_fraction: float = options_lib.option(
      0.0,
      'Fraction of all clients corrupted: in (0, 1) with an attack, else 0.',
      low=0.0,
      high=1.0,
      high_open=True,
  )
  attack_scale: Optional[float] = options_lib.option(
      None,
      'gaussian: sigma (default 1); model_replacement: update multiplier '
      '(default -clients_per_round / server_learning_rate).',
  )

  @property
  def on(self) -> bool:
    """Some clients are corrupted."""
    return self.attack != 'none'

  @property
  def on_updates(self) -> bool:
    """The attack corrupts updates (A2, A3), not data."""
    return self.attack in UPDATE_ATTACKS

  def check(self) -> None:
    if self.attack_scale is None:
      return
    if not self.on_updates:
      raise options_lib.OptionError(
          'attack_scale applies to attack=gaussian or model_replacement, '
          f'not {self.attack}',
          'attack_scale',
          'attack',
      )
    try:
      UpdateAttack(self.attack, self.attack_scale)
    except (TypeError, ValueError) as e:
      raise options_lib.OptionError(str(e), 'attack_scale') from None

  def update_attack(
      self, *, clients_per_round: int, server_learning_rate: float
  ) -> Optional['UpdateAttack']:
    """The update attack (None for none / label_poison); its scale
    `default_scale` where none is given."""
    if not self.on_updates:
      return None
    scale = self.attack_scale
    if scale is None:
      scale = default_scale(
          self.attack,
          clients_per_round=clients_per_round,
          server_learning_rate=server_learning_rate,
      )
    return UpdateAttack(self.attack, scale)

  def config(self, *, seed: int, num_classes: int) -> AttackConfig:
    """The simulation's part: which clients, seeded."""
    return AttackConfig(
        kind=self.attack,
        fraction=self.attack_fraction,
        seed=seed,
        num_classes=num_classes,
    )


def corrupted_clients(
    client_ids: Sequence[str], fraction: float, seed: int
) -> frozenset[str]:
  """The round(fraction * N) corrupted clients: a seeded, fixed subset."""
  num = int(round(fraction * len(client_ids)))
  rng = np.random.default_rng([seed, 7919])
  chosen = rng.choice(len(client_ids), size=num, replace=False)
  return frozenset(client_ids[i] for i in chosen)


def _client_seed(cid, seed: int):
  """A per-client int64 seed pair from the client id (string tensor)."""
  h = tf.strings.to_hash_bucket_fast(cid, 2**31 - 1)
  return tf.stack([tf.constant(seed, tf.int64), h])


def poison_client_data(
    client_data: tff.simulation.datasets.ClientData,
    corrupted: Iterable[str],
    *,
    num_classes: int,
    seed: int,
) -> tff.simulation.datasets.ClientData:
  """A1: the same clients, corrupted ones with uniformly random labels.

  Args:
    client_data: Raw client data whose examples are dicts with an integer
      `y` or `label` entry.
    corrupted: Ids of the corrupted clients.
    num_classes: Labels are drawn uniformly from [0, num_classes).
    seed: Seed of the labels.

  Returns:
    A `ClientData` with the same ids and element structure.

  Raises:
    ValueError: If the examples have no label entry.
  """
  spec = client_data.element_type_structure
  keys = [k for k in LABEL_KEYS if isinstance(spec, Mapping) and k in spec]
  if not keys:
    raise ValueError(
        'label_poison needs examples with a "y" or "label" entry, got '
        f'{spec}'
    )
  key = keys[0]
  label_dtype = spec[key].dtype
  corrupted = sorted(corrupted)
  base_fn = client_data.serializable_dataset_fn

  def dataset_fn(cid):
    cid = tf.convert_to_tensor(cid, tf.string)
    is_corrupted = tf.reduce_any(
        tf.equal(cid, tf.constant(corrupted, tf.string, shape=[len(corrupted)]))
    )
    client_seed = _client_seed(cid, seed)

    def poison(index, example):
      noisy = tf.random.stateless_uniform(
          tf.shape(example[key]),
          seed=client_seed + tf.stack([tf.constant(0, tf.int64), index]),
          maxval=num_classes,
          dtype=tf.int64,
      )
      example = dict(example)
      example[key] = tf.where(
          is_corrupted, tf.cast(noisy, label_dtype), example[key]
      )
      return collections.OrderedDict((k, example[k]) for k in spec)

    return base_fn(cid).enumerate().map(poison)

  return tff.simulation.datasets.ClientData.from_clients_and_tf_fn(
      client_data.client_ids, dataset_fn
  )


def noise_seed(seed: int, round_num: int, client_index: int) -> int:
  """The A2 noise seed of a client in a round (int32 range)."""
  rng = np.random.default_rng([seed, 31337, round_num, client_index])
  return int(rng.integers(2**31 - 1))


def marker_dataset(corrupted: bool, seed: int) -> tf.data.Dataset:
  """The per-client attack marker `[corrupted, noise_seed]`."""
  return tf.data.Dataset.from_tensors(
      np.asarray([int(corrupted), seed], np.int32)
  )


def with_attack_markers(
    datasets: Sequence,
    client_ids: Sequence[str],
    corrupted: Iterable[str],
    *,
    seed: int,
    round_num: int,
    index_of: Mapping[str, int],
):
  """Pairs each client's data with its marker, as `UpdateAttack` expects."""
  corrupted = frozenset(corrupted)
  return [
      collections.OrderedDict(
          [
              ('data', ds),
              (
                  MARKER_KEY,
                  marker_dataset(
                      cid in corrupted,
                      noise_seed(seed, round_num, index_of[cid]),
                  ),
              ),
          ]
      )
      for ds, cid in zip(datasets, client_ids)
  ]


def needs_attack_marker(process) -> bool:
  """Whether a process's client data carry the attack marker."""
  member = process.next.type_signature.parameter[1].member
  if not isinstance(member, tff.StructType):
    return False
  names = [name for name, _ in tff.structure.iter_elements(member)]
  return MARKER_KEY in names


def attacked_update(update, marker, *, kind: str, scale: float):
  """The update a client sends: attacked if `marker[0]`; call in TF.

  Args:
    update: A structure of float tensors (the honest update).
    marker: int32 `[corrupted, noise_seed]`.
    kind: `gaussian` or `model_replacement`.
    scale: sigma (gaussian) or the multiplier (model_replacement).

  Returns:
    The structure to send.
  """
  is_corrupted = marker[0] > 0
  flat = tf.nest.flatten(update)
  if kind == 'gaussian':
    attacked = [
        tf.cast(
            scale
            * tf.random.stateless_normal(
                tf.shape(t), seed=tf.stack([marker[1], i])
            ),
            t.dtype,
        )
        for i, t in enumerate(flat)
    ]
  elif kind == 'model_replacement':
    attacked = [tf.cast(scale, t.dtype) * t for t in flat]
  else:
    raise ValueError(f'unknown update attack {kind!r}')
  return tf.nest.pack_sequence_as(
      update, [tf.where(is_corrupted, a, t) for a, t in zip(attacked, flat)]
  )


@dataclasses.dataclass(frozen=True)
class UpdateAttack:
  """A2 or A3 on the updates of marked clients (a client-work wrapper).

  Attributes:
    kind: `gaussian` or `model_replacement`.
    scale: sigma > 0 for `gaussian`; the (non-zero) multiplier for
      `model_replacement` (see the module docstring for the defaults).
  """

  kind: str
  scale: float

  def __post_init__(self):
    if self.kind not in UPDATE_ATTACKS:
      raise ValueError(
          f'unknown update attack {self.kind!r}; choose one of: '
          f'{", ".join(UPDATE_ATTACKS)}'
      )
    if isinstance(self.scale, bool) or not isinstance(self.scale, (int, float)):
      raise TypeError(f'scale must be a float, got {type(self.scale).__name__}')
    if not math.isfinite(self.scale) or self.scale == 0:
      raise ValueError(f'scale must be finite and non-zero, got {self.scale}')
    if self.kind == 'gaussian' and self.scale < 0:
      raise ValueError(f'gaussian sigma must be > 0, got {self.scale}')

  def __call__(
      self, client_work: tff.learning.templates.ClientWorkProcess
  ) -> tff.learning.templates.ClientWorkProcess:
    return wrap_client_work(client_work, self)


def marked_data_type(data_type):
  """The type of a client's data with its attack marker."""
  return collections.OrderedDict(
      [('data', data_type), (MARKER_KEY, MARKER_TYPE)]
  )


def build_update_attack(attack: UpdateAttack, update_type) -> tff.Computation:
  """`(update, markers) -> update`, attacked where the client is marked.

  For processes that are not composed of a client work (Ditto's): what
  `wrap_client_work` does to a `ClientResult`, on the update alone.

  Raises:
    TypeError: If `attack` is not an `UpdateAttack`.
  """
  if not isinstance(attack, UpdateAttack):
    raise TypeError('update_attack must be a tff_algos.attacks.UpdateAttack')
  kind, scale = attack.kind, float(attack.scale)

  @tff.tensorflow.computation(update_type, MARKER_TYPE)
  def attack_update(update, markers):
    marker = markers.reduce(tf.zeros([2], tf.int32), lambda _, m: m)
    return attacked_update(update, marker, kind=kind, scale=scale)

  return attack_update


def wrap_client_work(
    client_work: tff.learning.templates.ClientWorkProcess,
    attack: UpdateAttack,
) -> tff.learning.templates.ClientWorkProcess:
  """The client work whose marked clients send attacked updates.

  Args:
    client_work: Any client work whose result is a `ClientResult` with a
      float `update`.
    attack: The update attack.

  Returns:
    A `ClientWorkProcess` taking `OrderedDict(data=..., attack=marker)`
    client data; same state, result type and measurements.
  """
  if not isinstance(client_work, tff.learning.templates.ClientWorkProcess):
    raise TypeError(
        'client_work must be a ClientWorkProcess, got '
        f'{type(client_work).__name__}'
    )
  state_type, weights_type, data_type = (
      client_work.next.type_signature.parameter
  )
  result_type = client_work.next.type_signature.result.result.member
  kind, scale = attack.kind, float(attack.scale)

  @tff.tensorflow.computation(result_type, MARKER_TYPE)
  def attack_result(result, markers):
    marker = markers.reduce(tf.zeros([2], tf.int32), lambda _, m: m)
    return tff.learning.templates.ClientResult(
        update=attacked_update(result.update, marker, kind=kind, scale=scale),
        update_weight=result.update_weight,
    )

  @tff.federated_computation(
      state_type,
      weights_type,
      tff.FederatedType(marked_data_type(data_type.member), tff.CLIENTS),
  )
  def next_fn(state, weights, client_data):
    output = client_work.next(state, weights, client_data.data)
    result = tff.federated_map(
        attack_result, (output.result, client_data[MARKER_KEY])
    )
    return tff.templates.MeasuredProcessOutput(
        output.state, result, output.measurements
    )

  return tff.learning.templates.ClientWorkProcess(
      client_work.initialize, next_fn
  )


def default_scale(
    kind: str, *, clients_per_round: int, server_learning_rate: float = 1.0
) -> float:
  """sigma = 1 for gaussian; -K / eta_s for model_replacement."""
  if kind == 'gaussian':
    return 1.0
  if kind == 'model_replacement':
    return -float(clients_per_round) / server_learning_rate
  raise ValueError(f'attack {kind!r} has no scale')


def benign_only(
    per_client: Mapping[str, Mapping[str, np.ndarray]], corrupted: Iterable[str]
) -> dict[str, dict[str, np.ndarray]]:
  """The per-client metrics restricted to clients not in `corrupted`."""
  corrupted = frozenset(corrupted)
  out = {}
  for split, values in per_client.items():
    keep = np.asarray([cid not in corrupted for cid in values['client_id']])
    out[split] = {k: np.asarray(v)[keep] for k, v in values.items()}
  return out


def describe(config: AttackConfig, scale: Optional[float]) -> str:
  if config.kind == 'none':
    return 'none'
  extra = f', scale={scale:g}' if scale is not None else ''
  return f'{config.kind} on {config.fraction:g} of clients{extra}'
