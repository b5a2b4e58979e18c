"""tff_algos.registry: each algorithm's options, engines and tuned knob in one
table, which the command line, the engines and the benchmarks read."""

import ast
import dataclasses
import os
import re

import pytest

from run import algorithms
from run import engines
from run import train
from tff_algos import options as options_lib
from tff_algos import registry
from tff_algos import stacked

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILT_IN = (
    'fedavg',
    'fedprox',
    'qffl',
    'qfedsgd',
    'term',
    'afl',
    'deltafl',
    'ditto',
    'fedavg_plus',
    'fedgeomed_plus',
    'fedcomed_plus',
)
TUNED = {
    'fedavg': None,
    'fedprox': 'proximal_strength',
    'qffl': 'q',
    'qfedsgd': 'q',
    'term': 'tilt',
    'afl': 'afl_lambda_lr',
    'deltafl': 'theta',
    'ditto': 'ditto_lambda',
    'fedavg_plus': 'fedplus_sigma',
    'fedgeomed_plus': 'fedplus_sigma',
    'fedcomed_plus': 'fedplus_sigma',
}
# What a file under tff_algos/ must not contain: an import of `run`, a
# mention of one of its modules, a command-line flag.
FORBIDDEN = (
    re.compile(r'^\s*(import run\b|from run\b)', re.MULTILINE),
    re.compile(r'\brun\.[a-z_]+'),
    re.compile(r'--[a-z]'),
)


def _library_sources():
  for folder, _, files in os.walk(os.path.join(ROOT, 'tff_algos')):
    for name in sorted(files):
      if name.endswith('.py'):
        yield os.path.join(folder, name)


# Options of other programs the library runs, which are not flags of ours:
# util-linux's setpriv, which ties TFF's workers to their process
# (`tff_algos.runtime`), by the file allowed to name them.
NOT_OUR_FLAGS = {os.path.join('tff_algos', 'runtime.py'): ('--pdeathsig',)}


def forbidden_lines(path: str) -> list[tuple[int, str]]:
  """`(line, text)` of each import of run, mention of it, or flag."""
  with open(path) as f:
    text = f.read()
  allowed = NOT_OUR_FLAGS.get(os.path.relpath(path, ROOT), ())
  found = []
  for pattern in FORBIDDEN:
    for match in pattern.finditer(text):
      if any(text.startswith(o, match.start()) for o in allowed):
        continue
      line = text.count('\n', 0, match.start()) + 1
      found.append((line, match.group(0).strip()))
  return found


def test_the_library_neither_imports_run_nor_speaks_in_flags():
  sources = list(_library_sources())
  assert len(sources) > 20
  offending = {
      os.path.relpath(p, ROOT): forbidden_lines(p)
      for p in sources
      if forbidden_lines(p)
  }
  assert not offending


def run_imports(path: str) -> list[tuple[int, str]]:
  """`(line, module)` of every import of `run` (also inside functions)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  found = []
  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level:
      names = [node.module or '']
    found += [
        (node.lineno, n) for n in names if n == 'run' or n.startswith('run.')
    ]
  return found


def test_the_data_and_privacy_layers_import_nothing_from_run(tmp_path):
  sources = [
      os.path.join(folder, name)
      for package in ('tasks', 'privacy', 'tff_algos')
      for folder, _, files in os.walk(os.path.join(ROOT, package))
      for name in sorted(files)
      if name.endswith('.py')
  ]
  assert len(sources) > 40
  offending = {
      os.path.relpath(p, ROOT): run_imports(p)
      for p in sources
      if run_imports(p)
  }
  assert not offending
  path = tmp_path / 'bad.py'
  path.write_text(
      'import os\ndef f():\n  from run import console\n  import run.train\n'
  )
  assert run_imports(str(path)) == [(3, 'run'), (4, 'run.train')]


def test_the_scan_sees_imports_mentions_and_flags(tmp_path):
  path = tmp_path / 'bad.py'
  path.write_text(
      '"""Calls `run.train`."""\nfrom run import algorithms\n'
      "raise ValueError('pass --theta')\n"
  )
  assert forbidden_lines(str(path)) == [
      (2, 'from run'),
      (1, 'run.train'),
      (3, '--t'),
  ]


def test_table_lists_the_algorithms_with_their_engines_and_states():
  assert registry.names() == BUILT_IN
  assert algorithms.ALGORITHM_NAMES == BUILT_IN
  assert registry.engine_names('stacked') == BUILT_IN
  assert registry.engine_names('batched') == BUILT_IN
  stateful = [n for n, e in registry.ALGORITHMS.items() if e.stateful]
  assert stateful == ['ditto', 'fedavg_plus', 'fedgeomed_plus', 'fedcomed_plus']
  assert algorithms.AlgorithmSpec('ditto').is_stateful
  assert not algorithms.AlgorithmSpec('term').is_stateful
  assert algorithms.dp_algorithms() == ('fedavg', 'fedprox', 'deltafl', 'ditto')
  assert algorithms.aggregator_algorithms() == (
      'fedavg',
      'fedprox',
      'term',
      'deltafl',
      'ditto',
  )
  assert [n for n in BUILT_IN if algorithms.drops_stragglers(n)] == ['fedavg']


@pytest.mark.parametrize('name', BUILT_IN)
def test_options_are_frozen_dataclasses_with_help_and_ranges(name):
  entry = registry.get(name)
  assert dataclasses.is_dataclass(entry.options)
  assert entry.options.__dataclass_params__.frozen
  for field in dataclasses.fields(entry.options):
    help_text = field.metadata['help']
    assert help_text and '\n' not in help_text, field.name
    assert set(field.metadata) == {
        'help',
        'low',
        'high',
        'low_open',
        'high_open',
        'choices',
        'flag',
    }
  # The representative options are valid.
  entry.options(**entry.example).validate()


@pytest.mark.parametrize('name', BUILT_IN)
def test_tuned_knob_has_a_log_grid_inside_its_valid_range(name):
  tuned = registry.get(name).tuned
  if TUNED[name] is None:
    assert tuned is None
    return
  assert tuned.name == TUNED[name]
  assert tuned.log and len(tuned.grid) >= 5
  ratios = [b / a for a, b in zip(tuned.grid, tuned.grid[1:])]
  assert all(1.5 < r < 11 for r in ratios), ratios
  meta = options_lib.fields_of(registry.get(name).options)[tuned.name].metadata
  for value in (tuned.low, *tuned.grid, tuned.high):
    options_lib.check_value(tuned.name, value, meta)  # Inside the range.


def test_delta_fl_theta_grid_stays_in_its_unit_interval():
  tuned = registry.get('deltafl').tuned
  assert 0 < tuned.low < tuned.grid[0] and tuned.grid[-1] < tuned.high == 1.0
  assert tuned.extend_high and tuned.extend_low  # Up to theta = 1 (FedAvg).
  fields = options_lib.fields_of(registry.get('deltafl').options)
  with pytest.raises(options_lib.OptionError, match=r'theta must be in \(0,'):
    options_lib.check_value('theta', 1.5, fields['theta'].metadata)


def test_a_grid_must_have_five_increasing_values():
  for short in ((0.1, 1.0, 10.0), (0.1, 0.3, 1.0, 3.0)):  # 3 and 4 values.
    with pytest.raises(ValueError, match='at least 5 increasing'):
      options_lib.TunedOption('q', grid=short, low=0.0, high=100.0)
  with pytest.raises(ValueError, match='at least 5 increasing'):  # Unsorted.
    options_lib.TunedOption(
        'q', grid=(0.1, 1.0, 0.3, 3.0, 10.0), low=0.0, high=100.0
    )
  options_lib.TunedOption(
      'q', grid=(0.1, 0.3, 1.0, 3.0, 10.0), low=0.0, high=100.0
  )
  with pytest.raises(ValueError, match='outside'):
    options_lib.TunedOption(
        'q', grid=(0.1, 1.0, 2.0, 5.0, 10.0), low=0.0, high=5.0
    )
  # A line (tuned at the best joint configuration) needs 2 values, may hold
  # 0 when not log-spaced, and is no joint option.
  line = options_lib.TunedOption(
      'q', grid=(0.0, 0.1), low=0.0, high=1.0, log=False, line=True
  )
  with pytest.raises(ValueError, match='at least 2 increasing'):
    options_lib.TunedOption('q', grid=(0.1,), low=0.0, high=1.0, line=True)
  with pytest.raises(ValueError, match='a log grid is positive'):
    options_lib.TunedOption('q', grid=(0.0, 0.1), low=0.0, high=1.0, line=True)
  entry = registry.get('qffl')
  with pytest.raises(ValueError, match='is a line, not joint'):
    dataclasses.replace(entry, tuned=line)
  with pytest.raises(ValueError, match='unknown or not a line'):
    dataclasses.replace(entry, lines=(entry.tuned,))
  # Scaled by the learning rate: Fed+'s sigma.
  sigma = registry.get('fedavg_plus').tuned
  assert sigma.per_learning_rate and sigma.values(0.5) == (
      0.002,
      0.006,
      0.02,
      0.06,
      0.2,
  )


def test_an_entry_without_the_tff_engine_is_refused():
  entry = registry.get('fedavg')
  for engines_ in (('batched',), ('batched', 'stacked'), ('tff', 'gpu')):
    with pytest.raises(ValueError, match='engines are tff and any of'):
      dataclasses.replace(entry, engines=engines_)
  dataclasses.replace(entry, engines=('tff',))


def test_library_errors_name_options_and_the_binary_adds_flags():
  with pytest.raises(options_lib.OptionError) as info:
    registry.options_from_values('fedavg', {'proximal_strength': 0.5})
  assert str(info.value) == (
      'proximal_strength applies to fedprox and term, not fedavg'
  )
  assert info.value.options == ('proximal_strength',)
  with pytest.raises(ValueError) as info:
    algorithms.AlgorithmSpec('fedavg', proximal_strength=0.5).validate()
  assert str(info.value) == (
      '--proximal_strength applies to fedprox and term, not fedavg'
  )
  with pytest.raises(ValueError) as info:
    algorithms.AlgorithmSpec('deltafl', theta=0.5, thetas=(0.1,)).validate()
  assert str(info.value) == (
      'give either --theta (one model) or --thetas (a family), not both'
  )
  # An option at its default is not "given" to another algorithm.
  spec = algorithms.AlgorithmSpec('fedavg', theta=1.0, ditto_lambda=None)
  spec.validate()
  assert spec.options == registry.get('fedavg').options()


def test_spec_keeps_run_wide_settings_and_the_options_object():
  option_names = set(registry.all_options())
  spec_fields = {f.name for f in dataclasses.fields(algorithms.AlgorithmSpec)}
  assert not spec_fields & option_names
  spec = algorithms.AlgorithmSpec(
      'qffl', q=2.0, client_learning_rate=0.5, server_momentum=0.0
  )
  assert spec.options == registry.get('qffl').options(q=2.0)
  assert spec.describe() == (
      'qffl (client sgd lr=0.5, server sgd lr=1, q=2, L=2)'
  )
  given = algorithms.AlgorithmSpec('qffl', spec.options)
  assert given.options is spec.options
  with pytest.raises(TypeError, match='unknown options'):
    algorithms.AlgorithmSpec('qffl', q_max=3.0)


def test_every_option_is_a_flag_with_its_default_and_owners():
  from absl import flags  # pylint: disable=g-import-not-at-top

  for name, field in registry.all_options().items():
    flag = flags.FLAGS[name]
    default = field.default
    if isinstance(default, tuple):
      default = list(default)
    assert flag.default == default
    assert flag.help.startswith(field.metadata['help'])
    assert flag.help.endswith(f'[{", ".join(registry.owners(name))}]')
  assert flags.FLAGS['tilt'].help.endswith('[term]')
  # pylint: disable-next=protected-access
  assert set(train._OPTION_FLAGS) == set(registry.all_options())


@pytest.mark.parametrize('name', BUILT_IN)
def test_an_entry_that_declares_the_stacked_engine_has_work_it_runs(name):
  # The declared engines and the stacked engine's own check agree on each
  # entry's representative options: a kind of client work the engine does
  # not compute itself must bring its kernel (stacked_work.StackedLocalWork).
  entry = registry.get(name)
  spec = algorithms.AlgorithmSpec(name, **entry.example)
  definition = engines.batched_algorithm(spec).definition()
  if 'stacked' in entry.engines:
    stacked.check_definition(definition)
  else:
    with pytest.raises(stacked.StackedEngineError):
      stacked.check_definition(definition)


def test_engines_follow_the_table():
  # The engine's own error type (callers skip what it cannot run).
  with pytest.raises(stacked.StackedEngineError) as info:
    engines.check_engine(
        'stacked',
        algorithms.AlgorithmSpec(
            'fedcomed_plus', fedplus_sigma=1.0, fedplus_local_steps=2
        ),
    )
  assert str(info.value) == (
      '--simulation_engine=stacked runs Fed+ local steps over one read of '
      'the stream; fed_plus_comed with local_steps=2 runs on '
      '--simulation_engine=batched'
  )
  with pytest.raises(ValueError) as info:
    engines.check_engine(
        'batched',
        algorithms.AlgorithmSpec(
            'ditto', ditto_lambda=0.1, ditto_clip_norm=1.0
        ),
    )
  assert str(info.value) == (
      '--simulation_engine=batched runs plain mean aggregation: drop '
      '--ditto_clip_norm'
  )
  algorithm = engines.batched_algorithm(
      algorithms.AlgorithmSpec('term', tilt=0.5, proximal_strength=0.1)
  )
  definition = algorithm.definition()
  assert (definition.name, definition.proximal_strength) == ('term', 0.1)
  assert algorithm.server_optimizer is not None
  # q-FFL's definition has no server optimizer: the engine drops the run's.
  qffl = engines.batched_algorithm(algorithms.AlgorithmSpec('qffl', q=1.0))
  assert qffl.server_optimizer is None
  assert not qffl.definition().server_optimizer


@pytest.mark.parametrize('name', registry.names())
def test_own_server_step_is_declared_exactly_where_the_definition_has_one(
    name,
):
  entry = registry.get(name)
  spec = algorithms.AlgorithmSpec(name, **entry.example)
  definition = engines.batched_algorithm(spec).definition()
  own = not definition.server_optimizer or bool(
      definition.fixed_server_optimizer
  )
  assert bool(entry.own_server_step) == own
  for settings in (
      dict(server_learning_rate=0.5),
      dict(server_optimizer='adam'),
      dict(server_momentum=0.9),
  ):
    spec = algorithms.AlgorithmSpec(name, **entry.example, **settings)
    if not own:
      spec.validate()
      continue
    with pytest.raises(ValueError) as info:
      spec.validate()
    assert str(info.value) == (
        f'--algorithm={name} has no server optimizer (its server step: '
        f'{entry.own_server_step}); leave --server_optimizer, '
        '--server_learning_rate and --server_sgd_momentum at their defaults'
    )
