"""Privacy accounting: against dp_accounting computations and closed forms."""

import math

import dp_accounting
import numpy as np
import pytest
from scipy import optimize
from scipy import special
from scipy import stats
import tensorflow_federated as tff
from tensorflow_federated.python.aggregators import (
    differential_privacy as dp_event_lib,
)

from privacy import accounting
from privacy import dp_aggregation

DELTA = 1e-3


def independent_rdp_wor(n, m, z, rounds, delta):
  """Fixed-size sampling without replacement, replace-one: multiplier z/2."""
  acc = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
  )
  event = dp_accounting.SampledWithoutReplacementDpEvent(
      n, m, dp_accounting.GaussianDpEvent(z / 2)
  )
  return acc.compose(event, rounds).get_epsilon(delta)


def independent_poisson(q, events, rounds, delta, kind):
  if kind == 'rdp':
    acc = dp_accounting.rdp.RdpAccountant()
  else:
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  # One composition of `rounds` copies: PLD composes them by FFT powers in
  # seconds, where `rounds` sequential compositions took minutes.
  acc.compose(dp_accounting.PoissonSampledDpEvent(q, events), rounds)
  return acc.get_epsilon(delta)


def test_fixed_clip_uniform_sampling_matches_dp_accounting():
  mech = accounting.DpMechanism(
      noise_multiplier=1.3,
      clients_per_round=10,
      num_clients=100,
      sampling='uniform',
  )
  tracker = accounting.EpsilonTracker(mech, DELTA)
  for rounds in (1, 7, 50):
    want = independent_rdp_wor(100, 10, 1.3, rounds, DELTA)
    assert tracker.metrics(rounds)['dp/epsilon'] == pytest.approx(
        want, rel=1e-9
    )
    assert mech.epsilon(rounds, DELTA) == pytest.approx(want, rel=1e-9)
  assert mech.available_accountants() == ('rdp',)
  with pytest.raises(ValueError, match='Poisson sampling only'):
    mech.make_accountant('pld')


def test_poisson_rdp_and_pld_match_dp_accounting():
  mech = accounting.DpMechanism(
      noise_multiplier=1.1,
      clients_per_round=20,
      num_clients=100,
      sampling='poisson',
  )
  tracker = accounting.EpsilonTracker(mech, DELTA, pld=True)
  got = tracker.metrics(30)
  gauss = dp_accounting.GaussianDpEvent(1.1)
  assert got['dp/epsilon'] == pytest.approx(
      independent_poisson(0.2, gauss, 30, DELTA, 'rdp'), rel=1e-9
  )
  assert got['dp/epsilon_pld'] == pytest.approx(
      independent_poisson(0.2, gauss, 30, DELTA, 'pld'), rel=1e-6
  )
  # PLD is tighter than RDP.
  assert got['dp/epsilon_pld'] < got['dp/epsilon']


def tff_round_event(opts, clients_per_round=10):
  """The DpEvent TFF's DP aggregator records in its state after a round."""
  factory = dp_aggregation.build_dp_aggregator(
      opts, clients_per_round=clients_per_round
  )
  process = factory.create(
      tff.TensorType(np.float32, [3]), tff.TensorType(np.float32)
  )
  out = process.next(
      process.initialize(), [np.ones(3, np.float32)] * 4, [1.0] * 4
  )
  return dp_event_lib.extract_dp_event_from_state(out.state)


@pytest.mark.parametrize('adaptive', [False, True])
def test_accounted_event_is_the_event_tff_releases(adaptive):
  opts = dp_aggregation.DpOptions(
      noise_multiplier=0.8, clip=1.0, adaptive_clip=adaptive
  )
  tff_event = tff_round_event(opts)
  mech = accounting.DpMechanism(
      noise_multiplier=0.8,
      clients_per_round=10,
      num_clients=100,
      sampling='poisson',
      adaptive_clip=adaptive,
  )
  if adaptive:
    zs = [e.noise_multiplier for e in tff_event.events]
  else:
    zs = [tff_event.noise_multiplier]
  assert zs == pytest.approx(mech.gaussian_multipliers, rel=1e-6)
  assert mech.effective_noise_multiplier == pytest.approx(0.8, rel=1e-9)
  # Independent accounting of TFF's own event under Poisson sampling (its
  # multipliers are float32: dp_accounting needs Python floats, or its RDP
  # arithmetic runs in float32 and is wrong).
  as_float = dp_accounting.ComposedDpEvent(
      [dp_accounting.GaussianDpEvent(float(z)) for z in zs]
  )
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, as_float), 40)
  assert mech.epsilon(40, DELTA) == pytest.approx(
      acc.get_epsilon(DELTA), rel=1e-6
  )


def test_adaptive_clip_noise_split_closed_form():
  # z^-2 = z_value^-2 + (2 s)^-2 with s = 0.05 m by default.
  value, count = accounting.adaptive_clip_noise_split(1.0, 100)
  assert count == pytest.approx(5.0)
  assert value == pytest.approx((1.0 - 0.1**2) ** -0.5)
  value, count = accounting.adaptive_clip_noise_split(0.5, 10, 2.0)
  assert (value, count) == (pytest.approx((4.0 - 0.25**2) ** -0.5), 2.0)
  assert accounting.adaptive_clip_noise_split(0.0, 10) == (0.0, 0.0)


def test_delta_fl_private_quantile_is_counted_in_the_budget():
  base = accounting.DpMechanism(1.0, 10, 100, 'poisson')
  with_q = accounting.DpMechanism(
      1.0, 10, 100, 'poisson', quantile_noise_stddev=2.0, quantile_steps=3
  )
  assert with_q.gaussian_multipliers == [1.0, 4.0, 4.0, 4.0]
  composed = dp_accounting.ComposedDpEvent(
      [dp_accounting.GaussianDpEvent(1.0)]
      + [dp_accounting.GaussianDpEvent(4.0)] * 3
  )
  want = independent_poisson(0.1, composed, 20, DELTA, 'rdp')
  assert with_q.epsilon(20, DELTA) == pytest.approx(want, rel=1e-9)
  assert with_q.epsilon(20, DELTA) > base.epsilon(20, DELTA)
  with pytest.raises(ValueError, match='not differentially private'):
    accounting.DpMechanism(1.0, 10, 100, quantile_steps=3).validate()


def test_calibration_hits_the_target_epsilon():
  make = lambda z: accounting.DpMechanism(z, 10, 100, 'poisson')
  z = accounting.calibrate_noise_multiplier(4.0, DELTA, 60, make)
  assert make(z).epsilon(60, DELTA) <= 4.0
  assert make(z - 1e-3).epsilon(60, DELTA) > 4.0
  assert make(z).epsilon(60, DELTA) == pytest.approx(4.0, abs=0.01)


def test_refusals():
  with pytest.raises(ValueError, match='amplification'):
    accounting.DpMechanism(1.0, 10, 100, 'examples').validate()
  with pytest.raises(ValueError, match='clients_per_round'):
    accounting.DpMechanism(1.0, 200, 100).validate()
  with pytest.raises(ValueError, match='too large for adaptive'):
    accounting.DpMechanism(5.0, 10, 100, adaptive_clip=True).validate()
  with pytest.raises(ValueError, match='delta'):
    accounting.EpsilonTracker(accounting.DpMechanism(1.0, 10, 100), 1.5)


# ---------------------------------------------------------------------------
# Checks that do not share dp_accounting's modelling: closed forms by hand.


def analytic_gaussian_epsilon(mu, delta):
  """Exact epsilon of a Gaussian mechanism with sensitivity / stddev = mu.

  Balle & Wang, "Improving the Gaussian Mechanism for Differential Privacy",
  ICML 2018, Theorem 8: delta(eps) = Phi(mu/2 - eps/mu) - e^eps
  Phi(-mu/2 - eps/mu); solved for eps.
  """

  def gap(eps):
    return (
        stats.norm.cdf(mu / 2 - eps / mu)
        - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu)
        - delta
    )

  return optimize.brentq(gap, 0.0, 200.0, xtol=1e-12)


# dp_accounting's default RDP orders, spelled out.
ORDERS = (
    [1 + x / 10 for x in range(1, 100)]
    + list(range(11, 64))
    + [128, 256, 512, 1024]
)


def rdp_to_epsilon(orders, rdp, delta, improved=True):
  """(eps, delta) from RDP curve `rdp` at `orders`.

  improved: Canonne, Kamath, Steinke 2020 (arXiv:2004.00010, Prop. 12),
  eps = r + log(1 - 1/a) - log(delta a) / (a - 1); else the classical
  Mironov 2017 bound eps = r + log(1/delta) / (a - 1).
  """
  if improved:
    return min(
        r + math.log1p(-1 / a) - math.log(delta * a) / (a - 1)
        for a, r in zip(orders, rdp)
        if a > 1.01
    )
  return min(r + math.log(1 / delta) / (a - 1) for a, r in zip(orders, rdp))


def sampled_gaussian_rdp(q, z, alpha):
  """RDP at integer order alpha of the Poisson-subsampled Gaussian.

  Mironov, Talwar, Zhang 2019 (arXiv:1908.10530), Section 3.3: A_alpha =
  sum_k C(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k) / (2 z^2)), RDP =
  log(A_alpha) / (alpha - 1).
  """
  k = np.arange(alpha + 1)
  with np.errstate(divide='ignore'):
    logs = (
        special.gammaln(alpha + 1)
        - special.gammaln(k + 1)
        - special.gammaln(alpha - k + 1)
        + (alpha - k) * np.log1p(-q)
        + k * np.log(q)
        + (k * k - k) / (2 * z * z)
    )
  return special.logsumexp(logs) / (alpha - 1)


@pytest.mark.parametrize('z, rounds', [(1.0, 1), (2.0, 10), (0.8, 3)])
def test_full_participation_is_the_exact_gaussian_mechanism(z, rounds):
  """Every client every round: T Gaussians of sensitivity C = one of z/sqrt(T).

  With q = 1 there is no amplification: PLD must give the exact (analytic)
  epsilon, RDP the conversion of T alpha / (2 z^2) and never less.
  """
  delta = 1e-3
  poisson = accounting.DpMechanism(z, 50, 50, 'poisson')
  exact = analytic_gaussian_epsilon(math.sqrt(rounds) / z, delta)
  assert poisson.epsilon(rounds, delta, 'pld') == pytest.approx(exact, rel=1e-6)
  rdp = [rounds * a / (2 * z * z) for a in ORDERS]
  got = poisson.epsilon(rounds, delta)
  assert got == pytest.approx(rdp_to_epsilon(ORDERS, rdp, delta), rel=1e-9)
  assert got > exact
  # Replace-one (fixed-size sampling, here m = N): one client's clipped
  # update u can become -u, so the sum moves by 2C: the Gaussian of
  # sensitivity 2C, RDP alpha (2C)^2 / (2 z^2 C^2) per round.
  uniform = accounting.DpMechanism(z, 50, 50, 'uniform')
  rdp2 = [rounds * a * 4 / (2 * z * z) for a in ORDERS]
  got2 = uniform.epsilon(rounds, delta)
  assert got2 == pytest.approx(rdp_to_epsilon(ORDERS, rdp2, delta), rel=1e-9)
  exact2 = analytic_gaussian_epsilon(2 * math.sqrt(rounds) / z, delta)
  assert got2 > exact2 > 1.8 * exact


def test_replace_one_moves_the_clipped_sum_by_twice_the_clip():
  rng = np.random.default_rng(0)
  clip = 1.5
  updates = rng.normal(size=(6, 4)) * 3

  def clipped_sum(u):
    norms = np.sqrt(np.sum(u**2, axis=1, keepdims=True))
    return np.sum(u * np.minimum(1.0, clip / norms), axis=0)

  replaced = updates.copy()
  replaced[2] = -updates[2]  # The worst replacement of client 2.
  removed = np.delete(updates, 2, axis=0)
  base = clipped_sum(updates)
  assert np.linalg.norm(base - clipped_sum(replaced)) == pytest.approx(2 * clip)
  assert np.linalg.norm(base - clipped_sum(removed)) == pytest.approx(clip)
  # So the accounted multiplier of fixed-size sampling is z / 2.
  mech = accounting.DpMechanism(1.2, 5, 10, 'uniform')
  assert mech.round_event().event.noise_multiplier == pytest.approx(0.6)


@pytest.mark.parametrize(
    'z, m, n, rounds',
    [(1.1, 20, 100, 30), (4.0, 1, 100, 2000), (0.9, 256, 60000, 500)],
)
def test_subsampled_rdp_matches_the_integer_order_closed_form(z, m, n, rounds):
  delta = 1e-5
  mech = accounting.DpMechanism(z, m, n, 'poisson')
  orders = list(range(2, 64)) + [128, 256, 512, 1024]
  mine = rdp_to_epsilon(
      orders,
      [rounds * sampled_gaussian_rdp(m / n, z, a) for a in orders],
      delta,
  )
  ours = mech.epsilon(rounds, delta)
  # dp_accounting also tries fractional orders: never worse, <= 5% better.
  assert mine * 0.95 <= ours <= mine * (1 + 1e-9)
  # PLD on the same event is tighter than RDP's conversion (by how much
  # depends on the regime: about 45% at q = 256/60000 over 500 rounds), and
  # composing more rounds never lowers epsilon.
  pld = mech.epsilon(rounds, delta, 'pld')
  assert mech.epsilon(rounds // 2, delta, 'pld') < pld < ours


@pytest.mark.parametrize(
    'z, m, n, rounds, published',
    [
        # Abadi et al., "Deep Learning with Differential Privacy", CCS 2016,
        # section 3.1: q = 0.01, sigma = 4, T = 10000, delta = 1e-5: eps ~ 1.26.
        (4.0, 1, 100, 10000, 1.26),
        # Bu, Dong, Long, Su, "Deep Learning with Gaussian Differential
        # Privacy", HDSR 2020, Fig. 4: q = 256/60000, sigma = 0.7, 70 epochs,
        # moments accountant: eps = 8.68 at delta = 1e-5.
        (0.7, 256, 60000, 16406, 8.68),
    ],
)
def test_published_moments_accountant_values(z, m, n, rounds, published):
  """Both used the classical RDP conversion; ours is the improved one."""
  delta = 1e-5
  tracker = accounting.EpsilonTracker(
      accounting.DpMechanism(z, m, n, 'poisson'), delta
  )
  rdp = rounds * tracker._rdp_one_round  # pylint: disable=protected-access
  classical = rdp_to_epsilon(ORDERS, rdp, delta, improved=False)
  assert classical == pytest.approx(published, abs=0.005)
  assert tracker.epsilon_rdp(rounds) < published
