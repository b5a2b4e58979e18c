"""Test-suite set-up: quiet TensorFlow, no TFF worker outlives the suite, and
the rotation of the slow integration tests (`tests/rotation.py`)."""

import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
# The binaries' kernels (run/__init__.py): the same numbers on every machine.
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')

# After the environment variable on purpose: it must precede any TF import.
# pylint: disable=g-import-not-at-top,wrong-import-position
import pytest

from tests import rotation
from tff_algos import runtime

# pylint: enable=g-import-not-at-top,wrong-import-position

runtime.install_worker_cleanup()


def pytest_configure(config):
  """Refuses a bad `TEST_ROTATION` in one line, before any test runs.

  In the controller, before pytest-xdist starts its workers: a worker
  refusing it at collection crashes the run (an INTERNALERROR traceback).
  """
  if getattr(config, 'workerinput', None) is not None:
    return  # An xdist worker: its controller has checked.
  try:
    rotation.choice(os.environ.get('TEST_ROTATION'))
  except ValueError as e:
    raise pytest.UsageError(f'rotation: {e}') from None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  """Leaves out the listed slow tests outside today's shard (`rotation`)."""
  setting = os.environ.get('TEST_ROTATION')
  workerinput = getattr(config, 'workerinput', None)  # An xdist worker's.
  if workerinput is not None:
    whole = workerinput[_WHOLE]
  else:
    whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS
  if setting is None and not whole:
    return  # Test paths given: run what was asked for.
  try:
    entries = rotation.read()
    shard = rotation.choice(setting)
  except (OSError, ValueError) as e:
    raise pytest.UsageError(f'rotation: {e}') from None
  if whole:
    stale = rotation.unmatched((i.nodeid for i in items), entries)
    if stale:
      raise pytest.UsageError(
          f'{rotation.LIST}: no test matches {", ".join(stale)}'
      )
  left_out = rotation.skipped((i.nodeid for i in items), entries, shard)
  if not left_out:
    _ROTATION_NOTE.append(f'rotation: every listed slow test runs ({setting})')
    return
  config.hook.pytest_deselected(
      items=[i for i in items if i.nodeid in left_out]
  )
  items[:] = [i for i in items if i.nodeid not in left_out]
  which = 'no shard' if shard < 0 else f'shard {shard} of {rotation.SHARDS}'
  _ROTATION_NOTE.append(
      f'rotation: {which}; {len(left_out)} listed slow integration tests '
      'left out (tests/rotation.txt; TEST_ROTATION=all runs them)'
  )


_ROTATION_NOTE: list[str] = []
_WHOLE = 'tff_hetero_whole_suite'


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
  """xdist: tells each worker whether the run is the whole suite (a worker
  is given the collected paths, so it cannot tell on its own)."""
  node.workerinput[_WHOLE] = (
      node.config.args_source == pytest.Config.ArgsSource.TESTPATHS
  )


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
  """xdist: the rotation's note comes back from the workers, once."""
  del error
  for line in getattr(node, 'workeroutput', {}).get(_WHOLE, []):
    if line not in _ROTATION_NOTE:
      _ROTATION_NOTE.append(line)


def pytest_sessionfinish(session, exitstatus):
  del exitstatus
  runtime.kill_workers()
  runtime.disarm_service_managers()
  workeroutput = getattr(session.config, 'workeroutput', None)
  if workeroutput is not None:
    workeroutput[_WHOLE] = list(_ROTATION_NOTE)


def pytest_terminal_summary(terminalreporter):
  for line in _ROTATION_NOTE:
    terminalreporter.write_line(line)
