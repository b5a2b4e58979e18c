"""Privacy accounting: our epsilons equal independent dp_accounting computations."""

import dp_accounting
import numpy as np
import pytest
import tensorflow_federated as tff
from tensorflow_federated.python.aggregators import differential_privacy as dp_event_lib

from privacy import accounting
from privacy import dp_aggregation

DELTA = 1e-3


def independent_rdp_wor(n, m, z, rounds, delta):
  """Fixed-size sampling without replacement, replace-one: multiplier z/2."""
  acc = dp_accounting.rdp.RdpAccountant(
      neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  event = dp_accounting.SampledWithoutReplacementDpEvent(
      n, m, dp_accounting.GaussianDpEvent(z / 2))
  return acc.compose(event, rounds).get_epsilon(delta)


def independent_poisson(q, events, rounds, delta, kind):
  if kind == 'rdp':
    acc = dp_accounting.rdp.RdpAccountant()
  else:
    acc = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  for _ in range(rounds):
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, events))
  return acc.get_epsilon(delta)


def test_fixed_clip_uniform_sampling_matches_dp_accounting():
  mech = accounting.DpMechanism(noise_multiplier=1.3, clients_per_round=10,
                                num_clients=100, sampling='uniform')
  tracker = accounting.EpsilonTracker(mech, DELTA)
  for rounds in (1, 7, 50):
    want = independent_rdp_wor(100, 10, 1.3, rounds, DELTA)
    assert tracker.metrics(rounds)['dp/epsilon'] == pytest.approx(want,
                                                                  rel=1e-9)
    assert mech.epsilon(rounds, DELTA) == pytest.approx(want, rel=1e-9)
  assert mech.available_accountants() == ('rdp',)
  with pytest.raises(ValueError, match='Poisson sampling only'):
    mech.make_accountant('pld')


def test_poisson_rdp_and_pld_match_dp_accounting():
  mech = accounting.DpMechanism(noise_multiplier=1.1, clients_per_round=20,
                                num_clients=100, sampling='poisson')
  tracker = accounting.EpsilonTracker(mech, DELTA, pld=True)
  got = tracker.metrics(30)
  gauss = dp_accounting.GaussianDpEvent(1.1)
  assert got['dp/epsilon'] == pytest.approx(
      independent_poisson(0.2, gauss, 30, DELTA, 'rdp'), rel=1e-9)
  assert got['dp/epsilon_pld'] == pytest.approx(
      independent_poisson(0.2, gauss, 30, DELTA, 'pld'), rel=1e-6)
  # PLD is tighter than RDP.
  assert got['dp/epsilon_pld'] < got['dp/epsilon']


def tff_round_event(opts, clients_per_round=10):
  """The DpEvent TFF's DP aggregator records in its state after a round."""
  factory = dp_aggregation.build_dp_aggregator(
      opts, clients_per_round=clients_per_round)
  process = factory.create(tff.TensorType(np.float32, [3]),
                           tff.TensorType(np.float32))
  out = process.next(process.initialize(), [np.ones(3, np.float32)] * 4,
                     [1.0] * 4)
  return dp_event_lib.extract_dp_event_from_state(out.state)


@pytest.mark.parametrize('adaptive', [False, True])
def test_accounted_event_is_the_event_tff_releases(adaptive):
  opts = dp_aggregation.DpOptions(noise_multiplier=0.8, clip=1.0,
                                  adaptive_clip=adaptive)
  tff_event = tff_round_event(opts)
  mech = accounting.DpMechanism(noise_multiplier=0.8, clients_per_round=10,
                                num_clients=100, sampling='poisson',
                                adaptive_clip=adaptive)
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
      [dp_accounting.GaussianDpEvent(float(z)) for z in zs])
  acc = dp_accounting.rdp.RdpAccountant()
  acc.compose(dp_accounting.PoissonSampledDpEvent(0.1, as_float), 40)
  assert mech.epsilon(40, DELTA) == pytest.approx(acc.get_epsilon(DELTA),
                                                  rel=1e-6)


def test_delta_fl_private_quantile_is_counted_in_the_budget():
  base = accounting.DpMechanism(1.0, 10, 100, 'poisson')
  with_q = accounting.DpMechanism(1.0, 10, 100, 'poisson',
                                  quantile_noise_stddev=2.0, quantile_steps=3)
  assert with_q.gaussian_multipliers == [1.0, 4.0, 4.0, 4.0]
  composed = dp_accounting.ComposedDpEvent(
      [dp_accounting.GaussianDpEvent(1.0)] +
      [dp_accounting.GaussianDpEvent(4.0)] * 3)
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
