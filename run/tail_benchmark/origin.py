# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Where a benchmark record came from: code, data and library versions.

Every record the benchmark writes carries an `origin` (`current`):

* `code`: a SHA-256 over the sources that train and evaluate a run (every
  `.py` file of `tff_algos`, `tasks`, `privacy` and the top level of `run`,
  by path and content: the same in a clone and in an installed wheel), and
  the git commit where the sources are a clone's (None outside one);
* `data`: a SHA-256 of every data file the run's task flags name
  (`data_files`); none for generated data (Synthetic), which the code hash
  and the arguments fix;
* `versions`: Python, TensorFlow, TFF and NumPy;
* `numerics`: whether TensorFlow's oneDNN kernels ran (`onednn`: `off`,
  the binaries' default, `on`, or `cpu default`, where TensorFlow turns them
  on only on CPUs with AVX-512 VNNI, BF16 or AMX): they round otherwise,
  and a chaotic run amplifies it. Older records do not say (what is known
  of them: docs/results/notes/tail_benchmark.md).

`key` is what two records must share to be the same run's: the source hash,
the data, the versions and the numerics (not the commit, which a
documentation change moves). A record of another key is redone unless the
user accepts it (`--accept_foreign_records`), and the page lists every
origin with its number of records (`summary`).
"""

import hashlib
import importlib.metadata
import json
import os
import platform
import subprocess
from collections.abc import Iterable, Sequence
from typing import Any, Optional

# The packages whose sources make a run (the benchmark's own planning,
# reading and page code, `run/tail_benchmark`, the paper reproductions,
# `run/experiments`, and the speed suite, `run/benchmarks`, do not train).
_PACKAGES = ('tff_algos', 'tasks', 'privacy', 'run')
_NOT_RUN = (
    os.path.join('run', 'experiments'),
    os.path.join('run', 'benchmarks'),
    os.path.join('run', 'tail_benchmark'),
)
_VERSIONED = ('tensorflow', 'tensorflow-federated', 'numpy')
# A record made before records carried an origin.
UNKNOWN = 'not recorded (made before records carried their origin)'


def _root() -> str:
  return os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def source_files(root: Optional[str] = None) -> list[str]:
  """The sources hashed, relative to `root` (the folder of the packages)."""
  root = root or _root()
  out = []
  for package in _PACKAGES:
    for folder, dirs, files in os.walk(os.path.join(root, package)):
      rel = os.path.relpath(folder, root)
      dirs[:] = sorted(
          d
          for d in dirs
          if d != '__pycache__' and os.path.join(rel, d) not in _NOT_RUN
      )
      out += [os.path.join(rel, f) for f in sorted(files) if f.endswith('.py')]
  return out


def source_hash(root: Optional[str] = None) -> str:
  root = root or _root()
  digest = hashlib.sha256()
  for rel in source_files(root):
    with open(os.path.join(root, rel), 'rb') as f:
      content = f.read()
    digest.update(rel.replace(os.sep, '/').encode() + b'\0')
    digest.update(hashlib.sha256(content).digest())
  return digest.hexdigest()[:16]


def _commit(root: str) -> Optional[str]:
  if not os.path.exists(os.path.join(root, '.git')):  # A worktree's: a file.
    return None
  try:
    out = subprocess.run(
        ['git', '-C', root, 'rev-parse', 'HEAD'],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() or None


def file_hash(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for chunk in iter(lambda: f.read(1 << 20), b''):
      digest.update(chunk)
  return digest.hexdigest()[:16]


# The data files a task reads, by its `--task` (relative to `--data_dir`);
# LEAF folders are hashed whole (`--leaf_dir`).
_TASK_FILES = {
    'shakespeare_leaf': ('shakespeare.sqlite',),
    'shakespeare_character': ('shakespeare.sqlite',),
    'emnist_character': ('emnist_all.sqlite',),
    'stackoverflow_word': (
        'stackoverflow.sqlite',
        'stackoverflow.word_count',
    ),
    'stackoverflow_tag': (
        'stackoverflow.sqlite',
        'stackoverflow.word_count',
        'stackoverflow.tag_count',
    ),
}


def _flag(args: Sequence[str], name: str) -> Optional[str]:
  for arg in args:
    if arg.startswith(f'--{name}='):
      return arg.split('=', 1)[1]
  return None


def data_files(task_flags: Sequence[str]) -> dict[str, str]:
  """`{name: path}` of the data files a run with `task_flags` reads."""
  out = {}
  task = _flag(task_flags, 'task')
  data_dir = _flag(task_flags, 'data_dir')
  for name in _TASK_FILES.get(task or '', ()):
    if data_dir is not None:
      out[name] = os.path.join(data_dir, name)
  leaf_dir = _flag(task_flags, 'leaf_dir')
  if task == 'leaf' and leaf_dir is not None:
    for split in ('train', 'test'):
      folder = os.path.join(leaf_dir, split)
      if os.path.isdir(folder):
        for f in sorted(os.listdir(folder)):
          if f.endswith('.json'):
            out[f'{split}/{f}'] = os.path.join(folder, f)
  return out


def data_fingerprints(task_flags: Sequence[str]) -> dict[str, str]:
  """`{name: sha256}` of `data_files` (a missing file: 'missing')."""
  return {
      name: file_hash(path) if os.path.isfile(path) else 'missing'
      for name, path in data_files(task_flags).items()
  }


def _version(package: str) -> str:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return 'absent'


def onednn(environ: Optional[dict] = None) -> str:
  """Whether TensorFlow runs its oneDNN kernels under `environ` (default:
  this process's, which the runs' workers inherit): `on`, `off` or `cpu
  default` (unset, or a value TensorFlow does not read as a boolean)."""
  value = (os.environ if environ is None else environ).get(
      'TF_ENABLE_ONEDNN_OPTS', ''
  )
  value = value.strip().lower()
  if value in ('0', 'false'):
    return 'off'
  if value in ('1', 'true'):
    return 'on'
  return 'cpu default'


def current(task_flags: Sequence[str], root: Optional[str] = None) -> dict:
  """This machine's origin for runs with `task_flags`."""
  root = root or _root()
  return {
      'code': {'sources': source_hash(root), 'commit': _commit(root)},
      'data': data_fingerprints(task_flags),
      'versions': {
          'python': platform.python_version(),
          **{p: _version(p) for p in _VERSIONED},
      },
      'numerics': {'onednn': onednn()},
  }


def key(origin: Any) -> Optional[str]:
  """What records of one origin share (None: no origin recorded)."""
  if not isinstance(origin, dict):
    return None
  code = origin.get('code')
  return json.dumps(
      [
          code.get('sources') if isinstance(code, dict) else None,
          origin.get('data'),
          origin.get('versions'),
          origin.get('numerics'),
      ],
      sort_keys=True,
  )


def describe(origin: Any, commits: Sequence[str] = ()) -> str:
  """One line: sources hash, commits, data hashes, versions."""
  if key(origin) is None:
    return UNKNOWN
  code = origin.get('code') or {}
  versions = origin.get('versions') or {}
  data = origin.get('data') or {}
  commits = sorted({c[:10] for c in commits if c}) or (
      [code['commit'][:10]] if code.get('commit') else []
  )
  parts = [f"code {code.get('sources')}"]
  if commits:
    parts[0] += f" (commit {', '.join(commits)})"
  parts.append(
      'data '
      + (
          ', '.join(f'{n} {h}' for n, h in sorted(data.items()))
          if data
          else 'generated (no file)'
      )
  )
  parts.append(
      ', '.join(
          f'{name} {versions[name]}'
          for name in ('python', *_VERSIONED)
          if name in versions
      )
  )
  numerics = origin.get('numerics')
  if isinstance(numerics, dict) and 'onednn' in numerics:
    parts.append(f"TensorFlow's oneDNN kernels {numerics['onednn']}")
  return '; '.join(parts)


def commit_of(origin: Any) -> Optional[str]:
  code = origin.get('code') if isinstance(origin, dict) else None
  return code.get('commit') if isinstance(code, dict) else None


def summary(records: Iterable[dict]) -> list[tuple[str, int]]:
  """`(describe(origin), records)` per origin, the most records first.

  Records with the same source hash, data and versions are one origin
  whatever their commits (all listed): only the sources make a run.
  """
  groups: dict[Optional[str], list] = {}
  for record in records:
    origin = record.get('origin') if isinstance(record, dict) else None
    group = groups.setdefault(key(origin), [origin, set(), 0])
    if commit_of(origin):
      group[1].add(commit_of(origin))
    group[2] += 1
  rows = [(describe(o, sorted(c)), n) for o, c, n in groups.values()]
  return sorted(rows, key=lambda r: (-r[1], r[0]))
