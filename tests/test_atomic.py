# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Output files appear whole or not at all (run/atomic.py).

Also checks the library's sources: no module opens a file for writing in
place except the few that write their own temporary names (listed below with
the reason), so a result file a kill or a full disk could truncate cannot
come back unnoticed.
"""

import ast
import errno
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from run import atomic

# The scan reads the real checkout (the symlink behind this file), which
# Bazel's runfiles do not hold: `external` keeps Bazel from caching it.
# bazel-tags: external

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Where `run` is imported from (the runfiles under Bazel).
IMPORT_ROOT = pathlib.Path(os.path.abspath(atomic.__file__)).parents[1]
PACKAGES = ('run', 'tasks', 'tff_algos', 'privacy', 'tools')

# (module, function) -> why its in-place writes are safe.
WRITES_THEIR_OWN_TEMPORARY_FILES = {
    ('run/atomic.py', 'open_for_replace'): 'the helper itself',
    ('run/atomic.py', 'save_figure'): 'into open_for_replace',
    ('tasks/data_files.py', '_extract_member'): 'a temp name, renamed',
    ('tasks/leaf_cache.py', '_build_in'): 'a new folder renamed when built',
    ('tasks/shakespeare_text.py', '_write_leaf_file'): 'a pending temp name',
    ('tasks/shakespeare_text.py', 'commit'): 'fsyncs its temp files',
    ('tasks/download.py', '_download'): 'a .part file, verified, renamed',
    ('tasks/download.py', '_decompress_lzma'): 'a temp name, renamed',
    ('tasks/download.py', '_extract'): 'a temp name, renamed',
    ('tff_algos/client_states.py', '_atomic_savez'): 'mkstemp, renamed',
    ('tff_algos/client_states.py', 'snapshot'): 'mkstemp, renamed',
    ('tools/build_deps.py', 'write'): 'generated BUILD files; --check',
    ('run/tail_benchmark/pool.py', '_start'): 'a worker log, appended',
    ('run/tail_benchmark/pool.py', 'serve'): 'the stdout pipe, not a file',
    ('run/fine_tune.py', 'model_bytes'): 'into memory (sent, then written)',
}


def test_a_write_replaces_the_file_whole(tmp_path):
  path = tmp_path / 'sub' / 'summary.json'
  atomic.write_json(str(path), {'a': [1, 2]}, indent=1)
  assert path.read_text(encoding='utf-8') == '{\n "a": [\n  1,\n  2\n ]\n}'
  atomic.write_text(str(path), 'é\n')
  assert path.read_bytes() == 'é\n'.encode('utf-8')
  atomic.write_bytes(str(path), b'\x00\x01')
  assert path.read_bytes() == b'\x00\x01'
  assert sorted(os.listdir(path.parent)) == ['summary.json']


def test_a_failed_write_leaves_the_earlier_file_and_no_temporary(tmp_path):
  path = tmp_path / 'summary.txt'
  path.write_text('earlier', encoding='utf-8')
  with pytest.raises(RuntimeError, match='half way'):
    with atomic.open_for_replace(str(path)) as f:
      f.write('new, but')
      f.flush()
      raise RuntimeError('half way')
  assert path.read_text(encoding='utf-8') == 'earlier'
  # A value JSON cannot encode fails before any file is opened.
  with pytest.raises(TypeError):
    atomic.write_json(str(path), {'x': object()})
  assert path.read_text(encoding='utf-8') == 'earlier'
  assert os.listdir(tmp_path) == ['summary.txt']


def test_a_full_disk_leaves_the_earlier_file(tmp_path, monkeypatch):
  path = tmp_path / 'clients.csv'
  path.write_text('earlier', encoding='utf-8')

  def no_space(fd):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(atomic.os, 'fsync', no_space)
  with pytest.raises(OSError) as raised:
    atomic.write_text(str(path), 'x' * 100_000)
  assert raised.value.errno == errno.ENOSPC
  assert path.read_text(encoding='utf-8') == 'earlier'
  assert os.listdir(tmp_path) == ['clients.csv']


def test_a_figure_is_saved_whole(tmp_path):
  matplotlib = pytest.importorskip('matplotlib')
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots()
  ax.plot([0, 1], [1, 0])
  atomic.save_figure(fig, str(tmp_path / 'curve.png'), dpi=50)
  plt.close(fig)
  assert (tmp_path / 'curve.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert os.listdir(tmp_path) == ['curve.png']


def test_refuses_modes_that_do_not_replace(tmp_path):
  for mode in ('a', 'r+', 'x'):
    with pytest.raises(ValueError, match="'w' or 'wb'"):
      with atomic.open_for_replace(str(tmp_path / 'f'), mode):
        pass
  assert not os.listdir(tmp_path)


def test_a_killed_writer_leaves_the_earlier_file_and_the_next_write_cleans(
    tmp_path,
):
  path = tmp_path / 'summary.json'
  path.write_text('earlier', encoding='utf-8')
  child = textwrap.dedent(f"""
      import sys, time
      from run import atomic
      with atomic.open_for_replace({str(path)!r}) as f:
        f.write('half of a new file')
        f.flush()
        print('writing', flush=True)
        time.sleep(60)
  """)
  with subprocess.Popen(
      [sys.executable, '-c', child],
      cwd=IMPORT_ROOT,
      stdout=subprocess.PIPE,
      text=True,
  ) as proc:
    assert proc.stdout.readline() == 'writing\n'
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
  assert path.read_text(encoding='utf-8') == 'earlier'
  left = [n for n in os.listdir(tmp_path) if n != 'summary.json']
  assert len(left) == 1 and left[0].startswith('.summary.json.tmp-'), left
  # A temporary file of a live process (this one) is not touched.
  mine = tmp_path / f'.summary.json.tmp-{os.getpid()}-99'
  mine.write_text('in use', encoding='utf-8')
  atomic.write_text(str(path), 'new')
  assert path.read_text(encoding='utf-8') == 'new'
  assert sorted(os.listdir(tmp_path)) == sorted([mine.name, 'summary.json'])


def _write_calls(tree: ast.AST):
  """(function name, line) of every call that may write a file in place."""
  found = []

  def visit(node, function):
    for child in ast.iter_child_nodes(node):
      name = function
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
        name = child.name
      if isinstance(child, ast.Call) and _writes(child):
        found.append((function, child.lineno))
      visit(child, name)

  visit(tree, '<module>')
  return found


def _writes(call: ast.Call) -> bool:
  func = call.func
  if isinstance(func, ast.Attribute) and func.attr in (
      'savefig',
      'write_text',
      'write_bytes',
      'tofile',
  ):
    return not (isinstance(func.value, ast.Name) and func.value.id == 'atomic')
  if (
      isinstance(func, ast.Attribute)
      and func.attr in ('save', 'savez', 'savez_compressed', 'savetxt')
      and isinstance(func.value, ast.Name)
      and func.value.id in ('np', 'numpy')
  ):
    return True
  opener = (isinstance(func, ast.Name) and func.id == 'open') or (
      isinstance(func, ast.Attribute)
      and func.attr == 'fdopen'
      and isinstance(func.value, ast.Name)
      and func.value.id == 'os'
  )
  if not opener:
    return False
  mode = call.args[1] if len(call.args) > 1 else None
  for keyword in call.keywords:
    if keyword.arg == 'mode':
      mode = keyword.value
  if mode is None:
    return False
  if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
    return any(c in mode.value for c in 'wax+')
  return True  # A mode computed at run time: assume it writes.


def test_no_module_writes_a_file_in_place():
  in_place, listed = [], set()
  for package in PACKAGES:
    for path in sorted((ROOT / package).rglob('*.py')):
      rel = path.relative_to(ROOT).as_posix()
      tree = ast.parse(path.read_text(encoding='utf-8'), filename=rel)
      for function, line in _write_calls(tree):
        if (rel, function) in WRITES_THEIR_OWN_TEMPORARY_FILES:
          listed.add((rel, function))
        else:
          in_place.append(f'{rel}:{line} in {function}')
  assert not in_place, (
      'write through run.atomic (whole or not at all), or list the function '
      'with the reason its writes are safe: ' + ', '.join(in_place)
  )
  stale = set(WRITES_THEIR_OWN_TEMPORARY_FILES) - listed
  assert not stale, f'listed but writing nothing (remove them): {stale}'


def test_the_scan_sees_each_kind_of_in_place_write():
  source = textwrap.dedent("""
      def a(p):
        with open(p, 'w') as f: pass
      def b(p):
        open(p, mode='ab')
      def c(p, m):
        open(p, m)
      def d(fig, p):
        fig.savefig(p)
      def e(p):
        p.write_text('x')
      def f(fd):
        os.fdopen(fd, 'wb')
      def h(p, x):
        np.save(p, x)
      def g(p, x, manager):
        manager.save(x)
        open(p)
        open(p, 'rb')
        atomic.save_figure(None, p)
  """)
  assert [f for f, _ in _write_calls(ast.parse(source))] == list('abcdefh')
