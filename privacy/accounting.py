# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Privacy accounting of DP federated training with `dp_accounting`.

User-level DP (thesis Definition 4; H. B. McMahan, D. Ramage, K. Talwar,
L. Zhang, "Learning Differentially Private Recurrent Language Models", ICLR
2018, arXiv:1710.06963): each round samples clients, clips each client's model
update to L2 norm C and adds Gaussian noise of standard deviation z C to the
sum. The accountant composes one `dp_accounting.DpEvent` per round:

* `sampling='uniform'`: what `run.simulation` does, a fixed number m of the N
  clients uniformly WITHOUT replacement. dp_accounting analyses it only under
  the REPLACE_ONE neighbouring relation (N public; Wang, Balle,
  Kasiviswanathan, AISTATS 2019), where replacing one client's data moves the
  clipped sum by up to 2C: every Gaussian of the round enters with noise
  multiplier z / 2 (sensitivity 2C). RDP only: the PLD accountant of
  dp_accounting 0.4.3 has no sampling-without-replacement event.
* `sampling='poisson'`: each client joins independently with probability
  q = m / N (`--client_sampling=poisson`), the analysis of McMahan et al. 2018
  under ADD_OR_REMOVE_ONE with sensitivity C. RDP and PLD.
* Sampling proportional to examples has no amplification result here and is
  refused.

The Gaussians released about the same sampled clients in one round compose
into one Gaussian with multiplier (sum_i z_i^-2)^-1/2 (exact: a vector of
independent Gaussians with per-part sensitivities). A round releases:

* the noised model-update sum, multiplier z (fixed clipping), or with adaptive
  clipping (Andrew, Chien, Thakkar, McMahan, Ramage, "Differentially Private
  Learning with Adaptive Clipping", NeurIPS 2021, arXiv:1905.03871) TFF's split
  of a total z into the value noise and the clipped-count noise (stddev s,
  sensitivity 1/2, multiplier 2 s): their composition is z again;
* Delta-FL's private quantile (`tff_algos.quantiles.PrivateQuantileEstimator`
  with noise): `num_steps` noised counts of the clients below the estimate,
  each a Gaussian of multiplier 2 s_q (count records are +-1/2).

`epsilon(rounds)` is the epsilon at `delta` after that many rounds; the
calibration (`calibrate_noise_multiplier`) finds the smallest z whose epsilon
after the planned rounds is at most a target.
"""

import dataclasses
import math
from typing import Optional

import dp_accounting

SAMPLING_SCHEMES = ('uniform', 'poisson')
ACCOUNTANTS = ('rdp', 'pld')
_PLD_DISCRETIZATION = 1e-4


def _positive(x, name):
  if isinstance(x, bool) or not isinstance(x, (int, float)):
    raise TypeError(f'{name} must be a number, got {x!r}')
  if not (math.isfinite(x) and x > 0):
    raise ValueError(f'{name} must be > 0, got {x}')
  return x


def adaptive_clip_noise_split(
    noise_multiplier: float,
    clients_per_round: float,
    clipped_count_stddev: Optional[float] = None,
):
  """TFF's `(value_noise_multiplier, clipped_count_stddev)` for a total z.

  The same split as `tff.aggregators.DifferentiallyPrivateFactory.
  gaussian_adaptive` (default count stddev 0.05 m), so that the value noise
  and the clipped-count noise compose to the total multiplier z.
  """
  if noise_multiplier == 0:
    return 0.0, 0.0 if clipped_count_stddev is None else clipped_count_stddev
  if clipped_count_stddev is None:
    clipped_count_stddev = 0.05 * clients_per_round
  if noise_multiplier >= 2 * clipped_count_stddev:
    raise ValueError(
        f'noise_multiplier={noise_multiplier} is too large for adaptive '
        f'clipping with {clients_per_round:g} clients per round: the clipped '
        f'count noise ({clipped_count_stddev:g}) cannot carry it; use more '
        'clients per round or fixed clipping'
    )
  value = (noise_multiplier**-2 - (2 * clipped_count_stddev) ** -2) ** -0.5
  return value, clipped_count_stddev


@dataclasses.dataclass(frozen=True)
class DpMechanism:
  """What one DP round releases, and how clients are sampled.

  Attributes:
    noise_multiplier: z of the model update: noise stddev z C on the clipped
      sum (with adaptive clipping the total z, split as TFF does).
    clients_per_round: m, the (expected) number of sampled clients.
    num_clients: N, the population.
    sampling: 'uniform' (fixed m without replacement) or 'poisson'.
    adaptive_clip: Adaptive clipping (the count noise shares z).
    clipped_count_stddev: Adaptive clipping's count noise (default 0.05 m).
    quantile_noise_stddev: Delta-FL private quantile count noise (0: none).
    quantile_steps: Noised quantile counts per round.
  """

  noise_multiplier: float
  clients_per_round: int
  num_clients: int
  sampling: str = 'uniform'
  adaptive_clip: bool = False
  clipped_count_stddev: Optional[float] = None
  quantile_noise_stddev: float = 0.0
  quantile_steps: int = 0

  def validate(self) -> None:
    """Raises `ValueError`/`TypeError` for an impossible mechanism."""
    _positive(self.noise_multiplier, 'noise_multiplier')
    if not 1 <= self.clients_per_round <= self.num_clients:
      raise ValueError(
          f'need 1 <= clients_per_round <= num_clients, got '
          f'{self.clients_per_round} and {self.num_clients}'
      )
    if self.sampling not in SAMPLING_SCHEMES:
      raise ValueError(
          f'DP accounting supports client sampling {SAMPLING_SCHEMES}, got '
          f'{self.sampling!r} (sampling proportional to examples has no '
          'amplification analysis here)'
      )
    if self.quantile_noise_stddev < 0 or self.quantile_steps < 0:
      raise ValueError('quantile noise and steps must be >= 0')
    if self.quantile_steps and not self.quantile_noise_stddev:
      raise ValueError(
          'a quantile estimated without noise is not differentially private'
      )
    if self.adaptive_clip:
      adaptive_clip_noise_split(
          self.noise_multiplier,
          self.clients_per_round,
          self.clipped_count_stddev,
      )

  @property
  def gaussian_multipliers(self) -> list[float]:
    """Noise multipliers (stddev / add-or-remove sensitivity) of a round."""
    if self.adaptive_clip:
      value, count = adaptive_clip_noise_split(
          self.noise_multiplier,
          self.clients_per_round,
          self.clipped_count_stddev,
      )
      out = [value, 2.0 * count]
    else:
      out = [self.noise_multiplier]
    out += [2.0 * self.quantile_noise_stddev] * self.quantile_steps
    return out

  @property
  def effective_noise_multiplier(self) -> float:
    """The single Gaussian equivalent to a round's releases (add/remove)."""
    return sum(z**-2 for z in self.gaussian_multipliers) ** -0.5

  @property
  def sampling_probability(self) -> float:
    return self.clients_per_round / self.num_clients

  def neighboring_relation(self) -> dp_accounting.NeighboringRelation:
    if self.sampling == 'uniform':
      return dp_accounting.NeighboringRelation.REPLACE_ONE
    return dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE

  def round_event(self) -> dp_accounting.DpEvent:
    """The `DpEvent` of one round."""
    z = self.effective_noise_multiplier
    if self.sampling == 'uniform':
      # Replace-one: sensitivity 2C, so the multiplier halves.
      return dp_accounting.SampledWithoutReplacementDpEvent(
          self.num_clients,
          self.clients_per_round,
          dp_accounting.GaussianDpEvent(z / 2.0),
      )
    return dp_accounting.PoissonSampledDpEvent(
        self.sampling_probability, dp_accounting.GaussianDpEvent(z)
    )

  def event(self, rounds: int) -> dp_accounting.DpEvent:
    return dp_accounting.SelfComposedDpEvent(self.round_event(), rounds)

  def make_accountant(
      self, accountant: str = 'rdp'
  ) -> dp_accounting.PrivacyAccountant:
    """A fresh accountant of kind `accountant` for this mechanism."""
    if accountant == 'rdp':
      return dp_accounting.rdp.RdpAccountant(
          neighboring_relation=self.neighboring_relation()
      )
    if accountant == 'pld':
      if self.sampling != 'poisson':
        raise ValueError(
            'dp_accounting 0.4.3 has PLD accounting for Poisson sampling only;'
            ' fixed-size uniform sampling is accounted with RDP'
        )
      return dp_accounting.pld.PLDAccountant(
          self.neighboring_relation(),
          value_discretization_interval=_PLD_DISCRETIZATION,
      )
    raise ValueError(f'unknown accountant {accountant!r}; choose {ACCOUNTANTS}')

  def epsilon(
      self, rounds: int, delta: float, accountant: str = 'rdp'
  ) -> float:
    """Epsilon at `delta` after `rounds` rounds (0 rounds: 0)."""
    if rounds <= 0:
      return 0.0
    return float(
        self.make_accountant(accountant)
        .compose(self.round_event(), rounds)
        .get_epsilon(delta)
    )

  def available_accountants(self) -> tuple[str, ...]:
    return ACCOUNTANTS if self.sampling == 'poisson' else ('rdp',)


class EpsilonTracker:
  """Epsilon after each round, cached per round (RDP; PLD when available).

  RDP is additive over rounds, so the RDP curve of one round is computed once
  and scaled; PLD epsilons are computed on request (`pld=True`).
  """

  def __init__(
      self, mechanism: DpMechanism, delta: float, *, pld: bool = False
  ):
    mechanism.validate()
    _positive(delta, 'delta')
    if delta >= 1:
      raise ValueError(f'delta must be in (0, 1), got {delta}')
    self.mechanism = mechanism
    self.delta = delta
    self.pld = pld and 'pld' in mechanism.available_accountants()
    self._orders = dp_accounting.rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS
    base = mechanism.make_accountant('rdp')
    base.compose(mechanism.round_event())
    self._rdp_one_round = base._rdp.copy()  # pylint: disable=protected-access

  def epsilon_rdp(self, rounds: int) -> float:
    if rounds <= 0:
      return 0.0
    eps, _ = dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon(
        self._orders, rounds * self._rdp_one_round, self.delta
    )
    return float(eps)

  def metrics(self, rounds: int, *, with_pld: bool = True) -> dict[str, float]:
    """`{'dp/epsilon': ..., 'dp/delta': ..., ['dp/epsilon_pld': ...]}`.

    `dp/epsilon` is RDP; `dp/epsilon_pld` is added when the tracker was
    built with `pld=True`, the sampling allows it and `with_pld` (a PLD
    epsilon takes about a second, so per-round metrics leave it out).
    """
    out = {'dp/epsilon': self.epsilon_rdp(rounds), 'dp/delta': self.delta}
    if self.pld and with_pld:
      out['dp/epsilon_pld'] = self.mechanism.epsilon(rounds, self.delta, 'pld')
    return out


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    rounds: int,
    make_mechanism,
    *,
    accountant: str = 'rdp',
    tol: float = 1e-4,
) -> float:
  """The smallest z with epsilon(rounds) <= target_epsilon.

  Args:
    target_epsilon: The budget epsilon > 0.
    delta: The budget delta in (0, 1).
    rounds: Planned rounds.
    make_mechanism: `z -> DpMechanism` (everything else fixed).
    accountant: 'rdp' or 'pld'.
    tol: Tolerance on z (the returned z errs on the private side).

  Returns:
    The noise multiplier.
  """
  _positive(target_epsilon, 'target_epsilon')
  _positive(delta, 'delta')
  if rounds < 1:
    raise ValueError(f'rounds must be >= 1, got {rounds}')

  def event(z):
    return make_mechanism(max(z, 1e-6)).event(rounds)

  probe = make_mechanism(1.0)
  z = dp_accounting.calibrate_dp_mechanism(
      lambda: probe.make_accountant(accountant),
      event,
      target_epsilon,
      delta,
      dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
      tol=tol,
  )
  # Brent returns a value within tol of the boundary: step to the private side.
  while make_mechanism(z).epsilon(rounds, delta, accountant) > target_epsilon:
    z += tol
  return float(z)
