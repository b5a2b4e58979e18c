"""Every notebook in examples/ runs top to bottom without an error.

The notebooks are executed with nbclient in a kernel of this very interpreter
(a kernel spec written for `sys.executable`, so the venv's TFF is used), from
the examples/ folder as Jupyter would, with a per-cell timeout. A notebook
added to examples/ is picked up automatically. Each must end its TFF worker
process: its first cell calls `tff_algos.runtime.install_worker_cleanup()`
(interrupts, errors) and its last cell `runtime.kill_workers()`, because a
kernel shutdown does not always run Python's exit handlers.
"""

# bazel-data: examples/quickstart.ipynb examples/tail_objectives.ipynb
# bazel-data: examples/personalization_robustness.ipynb examples/privacy.ipynb
# bazel-size: large

import glob
import json
import re
import os
import sys
import time

from jupyter_client import kernelspec
from jupyter_client import manager
import nbclient
import nbformat
import pytest

from tff_algos import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, 'examples')
NOTEBOOKS = sorted(glob.glob(os.path.join(EXAMPLES, '*.ipynb')))
CELL_TIMEOUT = 300
KERNEL_NAME = 'tff-hetero-test'


def alive(pids):
  """The `pids` still running (zombies count as ended)."""
  running = []
  for pid in pids:
    try:
      with open(f'/proc/{pid}/stat') as f:
        state = f.read().rsplit(')', 1)[1].split()[0]
    except OSError:
      continue
    if state != 'Z':
      running.append(pid)
  return running


def cpu_seconds(pid):
  """User + system CPU seconds of a live process."""
  with open(f'/proc/{pid}/stat') as f:
    fields = f.read().rsplit(')', 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


@pytest.fixture(scope='module')
def kernel_specs(tmp_path_factory):
  """A kernel spec directory whose only kernel is this interpreter."""
  kernels = tmp_path_factory.mktemp('kernels')
  spec_dir = kernels / KERNEL_NAME
  spec_dir.mkdir()
  (spec_dir / 'kernel.json').write_text(
      json.dumps(
          {
              'argv': [
                  sys.executable,
                  '-m',
                  'ipykernel_launcher',
                  '-f',
                  '{connection_file}',
              ],
              'display_name': 'tff-hetero test kernel',
              'language': 'python',
              'env': {'TF_CPP_MIN_LOG_LEVEL': '3'},
          }
      )
  )
  return kernelspec.KernelSpecManager(kernel_dirs=[str(kernels)])


def test_the_examples_are_there():
  names = {os.path.basename(path) for path in NOTEBOOKS}
  assert {
      'quickstart.ipynb',
      'tail_objectives.ipynb',
      'personalization_robustness.ipynb',
      'privacy.ipynb',
  } <= names


def test_every_notebook_is_bazel_data():
  # Under `bazel test` only the notebooks named above are in the runfiles
  # (and tools/build_deps.py adds their imports to this target's deps).
  with open(__file__) as f:
    declared = set(re.findall(r'examples/\S+\.ipynb', f.read()))
  on_disk = {os.path.relpath(p, ROOT) for p in NOTEBOOKS}
  assert on_disk <= declared, f'add {sorted(on_disk - declared)} to bazel-data'


def test_notebooks_are_committed_lean():
  for path in NOTEBOOKS:
    assert os.path.getsize(path) < 200_000, f'{path}: clear its outputs'
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    first = next(c for c in nb.cells if c.cell_type == 'code')
    assert 'runtime.install_worker_cleanup()' in first.source, path
    assert 'runtime.kill_workers()' in nb.cells[-1].source, path


@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_notebook_runs(path, kernel_specs):
  nb = nbformat.read(path, as_version=4)
  km = manager.KernelManager(
      kernel_name=KERNEL_NAME, kernel_spec_manager=kernel_specs
  )
  client = nbclient.NotebookClient(
      nb,
      km=km,
      timeout=CELL_TIMEOUT,
      allow_errors=False,
      resources={'metadata': {'path': EXAMPLES}},
  )
  t0 = time.monotonic()
  with client.setup_kernel():
    kernel_pid = km.provisioner.pid
    try:
      for index, cell in enumerate(nb.cells):
        client.execute_cell(cell, index)  # Raises CellExecutionError.
    except BaseException:
      # A failed kernel may not shut down cleanly: end its workers here.
      runtime.kill_workers(parent=kernel_pid)
      raise
    # The notebook ends its TFF workers itself (its last cell).
    left = alive(runtime.worker_pids(parent=kernel_pid))
    cpu = cpu_seconds(kernel_pid)
    runtime.kill_workers(parent=kernel_pid)
    assert not left, f'TFF workers {left} outlived the notebook'
    # The notebooks check their own numbers and print 'ok' last.
    last = nb.cells[-1]
    text = ''.join(o.get('text', '') for o in last.get('outputs', []))
    assert text.strip().endswith('ok'), text
    # The kernel is this interpreter.
    probe = nbformat.v4.new_code_cell('import sys; print(sys.executable)')
    nb.cells.append(probe)
    client.execute_cell(probe, len(nb.cells) - 1, store_history=False)
    assert probe.outputs[0]['text'].strip() == sys.executable
  # CPU time is what a quiet machine would take (the kernel is one busy
  # thread); wall time on a shared machine can be far longer.
  print(
      f'\n{os.path.basename(path)}: {time.monotonic() - t0:.0f} s wall, '
      f'{cpu:.0f} s CPU (kernel)'
  )
