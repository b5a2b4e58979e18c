# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Which engines run an algorithm: one derived answer (`engine_check`)."""

import dataclasses

import pytest

from run import algorithms
from run import engines
from tff_algos import engine_check
from tff_algos import options as options_lib
from tff_algos import registry
from tff_algos import stacked

BUILT_IN = (
    'fedavg', 'fedprox', 'qffl', 'qfedsgd', 'term', 'afl', 'deltafl',
    'ditto', 'fedavg_plus', 'fedgeomed_plus', 'fedcomed_plus',
)  # fmt: skip
ALL = ('tff', 'batched', 'stacked')


@pytest.mark.parametrize('name', BUILT_IN)
def test_every_built_in_runs_on_every_engine_at_its_example(name):
  spec = algorithms.AlgorithmSpec(name, **registry.get(name).example)
  assert engines.engines_of(spec) == ALL


@pytest.mark.parametrize(
    'name,options,expected',
    [
        ('deltafl', dict(theta=0.5, secure_quantile='mm'), ('tff',)),
        ('deltafl', dict(thetas=(0.5, 0.1)), ('tff',)),
        ('ditto', dict(ditto_lambda=0.1, ditto_clip_norm=1.0), ('tff',)),
        ('ditto', dict(ditto_lambda=0.1, ditto_personal_steps=2), ALL[:2]),
        (
            'fedcomed_plus',
            dict(fedplus_sigma=1.0, fedplus_local_steps=2),
            ALL[:2],
        ),
    ],
)
def test_options_and_client_work_narrow_the_engines(name, options, expected):
  spec = algorithms.AlgorithmSpec(name, **options)
  assert engines.engines_of(spec) == expected
  # The binary refuses each engine the answer leaves out, and only those.
  for engine in ALL:
    if engine in expected:
      engines.check_engine(engine, spec)
    else:
      with pytest.raises(ValueError):
        engines.check_engine(engine, spec)


def test_an_undeclared_engine_is_refused_with_the_declared_list():
  fedavg = registry.get('fedavg')
  entry = dataclasses.replace(fedavg, name='toy_tff_only', engines=('tff',))
  options = entry.options()
  with pytest.raises(engine_check.UndeclaredEngineError) as info:
    engine_check.check(entry, options, lambda: None, 'batched')
  assert str(info.value) == (
      'the batched engine runs '
      f'{", ".join(registry.engine_names("batched"))}, not toy_tff_only'
  )
  assert set(BUILT_IN) <= set(registry.engine_names('batched'))
  assert engine_check.engines(entry, options, lambda: None) == ('tff',)
  with pytest.raises(ValueError, match="unknown engine 'warp'"):
    engine_check.check(entry, options, lambda: None, 'warp')


def test_the_stacked_refusal_keeps_its_type_and_flag_wording():
  spec = algorithms.AlgorithmSpec(
      'fedcomed_plus', fedplus_sigma=1.0, fedplus_local_steps=2
  )
  with pytest.raises(stacked.StackedEngineError) as info:
    engines.check_engine('stacked', spec)
  assert '--simulation_engine=batched' in str(info.value)
  with pytest.raises(options_lib.OptionError):
    registry.get('deltafl').options(secure_quantile='mm').check_engine(
        'batched'
    )
