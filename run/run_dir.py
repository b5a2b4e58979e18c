# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""A run's output folder: checked before use, locked while used, kept intact.

* `check_output_dir` tells, before anything is created, whether a folder
  can hold a run's outputs (`OutputDirError`: bad input, one line).
* `locked` holds an exclusive `fcntl.flock` lock on `<folder>/.lock` for the
  whole run: a second run of the same folder is refused (`RunDirError`)
  naming the holder (pid, host, binary, start time, written into the file).
  The OS releases the lock when its holder dies, so a lock file left by a
  killed run is stale and taken over. The file also records which writer
  (`train`: `run.train`'s simulation; `program`, `stateful_program`: the TFF
  programs) made the folder, and another writer is refused: their files
  share names (`metrics.csv`) but not their meaning.
* `remove_temp_files` removes what TFF's writers leave of a write a kill
  or a full disk interrupted (`<name>_tempNNNN`), on resume.
* `CheckpointManager` is TFF's `FileProgramStateManager` whose
  `load_latest` skips damaged versions (a truncated `variables.data`, an
  empty folder, a garbage `saved_model.pb`): it falls back to the newest
  intact one with a one-line warning, renames the damaged ones
  `damaged_<name>` (kept, never deleted; no longer a version), and raises
  `RunDirError` when none is intact.
"""

import contextlib
import datetime
import errno
import fcntl
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, Optional

import tensorflow_federated as tff

from tff_algos import runtime

runtime.end_workers_at_exit()  # Quiet at exit: TFF's service manager.

LOCK_FILE = '.lock'
WRITERS = {
    'train': 'run.train (simulation folder: config.json, checkpoints/)',
    'program': 'run.program (program folder: program_config.json, '
    'program_state/)',
    'stateful_program': 'run.stateful_program (program folder: '
    'program_config.json, program_state/)',
}
DAMAGED_PREFIX = 'damaged_'


class OutputDirError(ValueError):
  """An output location cannot hold a run (bad input)."""


class RunDirError(RuntimeError):
  """A run folder is in use, another writer's, or has no intact checkpoint."""


def _printable(text: str) -> str:
  """`text` for a message: undecodable bytes shown as escapes (`\\xff`)."""
  return os.fsencode(text).decode('utf-8', 'backslashreplace')


def _cannot_write(path: str, error: OSError) -> str:
  return f'cannot write in {_printable(path)}: {error.strerror or error}'


def check_output_dir(path: str, *, flag: str = 'output folder') -> None:
  """Raises `OutputDirError` if `path` cannot hold a run's outputs.

  Nothing is created: an existing folder must be a writable folder (a file
  is probed there and removed), a missing one must have a writable nearest
  existing ancestor folder. Names must be valid UTF-8 (the outputs' JSON and
  CSV files record them).

  Args:
    path: The run's folder.
    flag: What named it, for the message (e.g. `--experiment_name`).
  """
  try:
    path.encode('utf-8')
  except UnicodeEncodeError:
    raise OutputDirError(
        f'{flag}: {_printable(path)} is not valid UTF-8; use a UTF-8 '
        'folder name'
    ) from None
  probe_dir = path
  while not os.path.lexists(probe_dir):
    parent = os.path.dirname(os.path.abspath(probe_dir))
    if parent == os.path.abspath(probe_dir):
      break
    probe_dir = parent
  if not os.path.isdir(probe_dir):
    kind = 'a file' if os.path.exists(probe_dir) else 'a broken link'
    raise OutputDirError(
        f'{flag}: {_printable(probe_dir)} is {kind}, not a folder'
    )
  try:
    fd, probe = tempfile.mkstemp(prefix='.write-probe-', dir=probe_dir)
  except OSError as e:
    what = '' if probe_dir == path else f' (to create {_printable(path)})'
    raise OutputDirError(
        f'{flag}: {_cannot_write(probe_dir, e)}{what}'
    ) from None
  os.close(fd)
  os.unlink(probe)


def check_output_file(path: str, *, flag: str) -> None:
  """Raises `OutputDirError` if the file `path` cannot be written there.

  Checked before a binary's work, so that a run does not fail at its last
  step; nothing is created (`check_output_dir` of the file's folder).

  Args:
    path: The file a binary writes at its end.
    flag: What named it, for the message (e.g. `--output_json`).
  """
  if os.path.isdir(path):
    raise OutputDirError(f'{flag}: {_printable(path)} is a folder, not a file')
  check_output_dir(os.path.dirname(os.path.abspath(path)), flag=flag)


def refuse_output_file(path: str, *, flag: str, prog: str) -> bool:
  """`check_output_file` for a binary's `main`: True after its error line.

  Prints one `prog: error: ...` line to stderr when the file `path` cannot
  be written; an empty `path` (no output asked for) is fine.
  """
  if not path:
    return False
  try:
    check_output_file(path, flag=flag)
  except OutputDirError as e:
    print(f'{prog}: error: {e}', file=sys.stderr)
    return True
  return False


def _read_record(lock_path: str) -> dict[str, Any]:
  try:
    with open(lock_path, encoding='utf-8') as f:
      record = json.load(f)
  except (OSError, ValueError):
    return {}
  return record if isinstance(record, dict) else {}


def _holder(record: dict[str, Any]) -> str:
  if 'pid' not in record:
    return 'another process'
  return (
      f'{record.get("binary", "a run")} (pid {record["pid"]} on '
      f'{record.get("host", "?")}, started {record.get("started", "?")})'
  )


def _inferred_writer(path: str) -> Optional[str]:
  """The writer of a folder made before writers were recorded."""
  exists = lambda name: os.path.exists(os.path.join(path, name))
  if exists('program_config.json') or exists('program_state'):
    return 'program'
  if exists('config.json') or exists('checkpoints'):
    return 'train'
  return None


def _same_writer(recorded: str, writer: str, inferred: bool) -> bool:
  if inferred and recorded == 'program':  # Either program binary.
    return writer in ('program', 'stateful_program')
  return recorded == writer


def _check_writer(path: str, record: dict[str, Any], writer: str) -> None:
  recorded, inferred = record.get('writer'), False
  if recorded is None:
    recorded, inferred = _inferred_writer(path), True
  if recorded is not None and not _same_writer(recorded, writer, inferred):
    raise RunDirError(
        f'{_printable(path)} was written by '
        f'{WRITERS.get(recorded, recorded)}; {WRITERS[writer].split()[0]} '
        'cannot continue it: use another --experiment_name'
    )


def _busy(path: str, lock_path: str) -> RunDirError:
  return RunDirError(
      f'{_printable(path)} is in use by {_holder(_read_record(lock_path))}; '
      'wait for it to end, or use another --experiment_name'
  )


def check_available(path: str, writer: str) -> None:
  """Raises `RunDirError` now if `locked(path, writer)` would refuse.

  Creates nothing: for a binary to refuse before it builds anything. The
  lock itself is taken by `locked`.
  """
  if not os.path.isdir(path):
    return
  lock_path = os.path.join(path, LOCK_FILE)
  try:
    fd = os.open(lock_path, os.O_RDONLY)
  except OSError:  # No lock file: a folder from before locks, or new.
    _check_writer(path, {}, writer)
    return
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise _busy(path, lock_path) from None
    _check_writer(path, _read_record(lock_path), writer)
  finally:
    os.close(fd)


# What each writer keeps in a run's folder: folders, then text files.
_RUN_FOLDERS = {
    'train': ('checkpoints', 'clients', 'tensorboard', 'client_states'),
    'program': (
        'program_state',
        'clients',
        'tensorboard',
        'models',
        'evaluation',
    ),
    'stateful_program': (
        'program_state',
        'clients',
        'tensorboard',
        'models',
        'client_states',
    ),
}
_RUN_TEXT_FILES = ('metrics.csv', 'evaluation.csv', 'config.json')


def check_run_files(path: str, writer: str) -> None:
  """Raises `RunDirError` naming a damaged part of an existing run folder.

  A resumed run appends to its CSV files and writes into its folders: one
  replaced by a file (or a file by a folder), or a CSV file that is not
  UTF-8 text, would fail mid-run with a traceback. Creates nothing.
  """
  if not os.path.isdir(path):
    return
  for name in _RUN_FOLDERS[writer]:
    full = os.path.join(path, name)
    if os.path.lexists(full) and not os.path.isdir(full):
      raise RunDirError(
          f'{_printable(full)} is a file, not a folder: the run cannot be '
          'resumed; move it away (or remove the run folder to start over)'
      )
  for name in _RUN_TEXT_FILES:
    full = os.path.join(path, name)
    if not os.path.lexists(full):
      continue
    if os.path.isdir(full):
      raise RunDirError(
          f'{_printable(full)} is a folder, not a file: the run cannot be '
          'resumed; move it away (or remove the run folder to start over)'
      )
    try:
      with open(full, encoding='utf-8') as f:
        while f.read(1 << 20):  # Decodes it all, a megabyte at a time.
          continue
    except UnicodeDecodeError as e:
      raise RunDirError(
          f'{_printable(full)} is damaged (not UTF-8 text: byte '
          f'{e.start}): the run cannot be resumed; move it away (or remove '
          'the run folder to start over)'
      ) from None
    except OSError as e:
      raise RunDirError(
          f'{_printable(full)} cannot be read ({e.strerror or e})'
      ) from None


@contextlib.contextmanager
def locked(
    path: str,
    writer: str,
    *,
    binary: Optional[str] = None,
    check: Optional[Callable[[], None]] = None,
) -> Iterator[None]:
  """Holds `path`'s run lock (creating the folder) for the `with` body.

  Args:
    path: The run's folder.
    writer: A `WRITERS` key: what writes the folder.
    binary: Named in the lock for a refused second run (default: this
      process's command).
    check: Called once the lock is held, before this process records itself
      in the lock file: whatever it raises refuses the run and leaves the
      record of the folder's last run as it was (e.g. other settings).

  Raises:
    RunDirError: If another process holds the lock, another writer made the
      folder, or the folder cannot be created or written.
  """
  if writer not in WRITERS:
    raise ValueError(f'unknown writer {writer!r}; one of {sorted(WRITERS)}')
  lock_path = os.path.join(path, LOCK_FILE)
  try:
    os.makedirs(path, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
  except OSError as e:
    raise RunDirError(_cannot_write(path, e)) from None
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      raise _busy(path, lock_path) from None
    _check_writer(path, _read_record(lock_path), writer)
    if check is not None:
      check()
    record = {
        'writer': writer,
        'pid': os.getpid(),
        'host': socket.gethostname(),
        'binary': binary or _command(),
        'started': datetime.datetime.now().isoformat(timespec='seconds'),
    }
    try:
      os.ftruncate(fd, 0)
      os.pwrite(fd, (json.dumps(record) + '\n').encode('utf-8'), 0)
    except OSError as e:
      raise RunDirError(_cannot_write(path, e)) from None
    yield
  finally:
    os.close(fd)  # Releases the lock.


def _command() -> str:
  main = sys.modules.get('__main__')
  spec = getattr(main, '__spec__', None)
  if spec is not None and spec.name:
    return f'python -m {spec.name}'
  return (
      os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ('python')
  )


def _reason(error: Exception) -> str:
  text = ' '.join(str(error).split()) or type(error).__name__
  return text if len(text) <= 160 else text[:157] + '...'


def has_checkpoint(root_dir: str) -> bool:
  """Whether `root_dir` (a run's checkpoints/) holds a saved version.

  Counts the names TFF's `FileProgramStateManager` gives versions
  (`program_state_<round>`), not its half-written temporaries or the
  checkpoints `CheckpointManager` set aside as damaged.
  """
  try:
    names = os.listdir(root_dir)
  except OSError:
    return False
  return any(re.fullmatch(r'program_state_\d+', name) for name in names)


# What TFF's file writers name a file or folder until it is whole (then they
# rename it): `<name>_temp` and four random digits.
_TFF_TEMP_NAME = re.compile(r'.+_temp[0-9]{4}')


def remove_temp_files(output_dir: str) -> list[str]:
  """Removes the `<name>_tempNNNN` files and folders TFF's writers leave.

  TFF writes a program state (a checkpoint), a released model and a CSV file
  under a temporary name and renames it when whole; a kill or a full disk in
  between leaves the temporary one, which no later run reads or removes.
  Only such names are removed (a saved version is `program_state_N`). The
  binaries call it on their locked folder when they start (and the programs
  when they end).

  Returns:
    The paths removed.
  """
  removed = []
  for folder, dirs, files in os.walk(output_dir):
    for name in [d for d in dirs if _TFF_TEMP_NAME.fullmatch(d)]:
      dirs.remove(name)
      shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
      removed.append(os.path.join(folder, name))
    for name in files:
      if _TFF_TEMP_NAME.fullmatch(name):
        os.remove(os.path.join(folder, name))
        removed.append(os.path.join(folder, name))
  return removed


class CheckpointManager(tff.program.FileProgramStateManager):
  """A `FileProgramStateManager` that resumes from the newest intact version.

  `load_latest` tries the versions newest first; a version that cannot be
  loaded is renamed `damaged_<name>` (so saving that version again works and
  the old-version clean-up never deletes it) with a one-line warning to
  `log`. If none loads, `RunDirError` names them.
  """

  def __init__(
      self,
      root_dir: str,
      *,
      log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
      **kwargs,
  ):
    super().__init__(root_dir, **kwargs)
    self._log = log
    self._root = root_dir

  async def load_latest(self, structure):
    """The newest intact checkpoint and its round (None, 0 if none)."""
    versions = await self.get_versions()
    if versions is None:
      return None, 0
    damaged = []
    for version in reversed(versions):
      try:
        return await self.load(version, structure), version
      except Exception as e:  # pylint: disable=broad-except
        name = os.path.basename(self._get_path_for_version(version))
        kept = self._set_aside(name)
        damaged.append(kept)
        self._log(
            f'warning: skipped the damaged checkpoint {name} in '
            f'{self._root} ({type(e).__name__}: {_reason(e)}); kept as '
            f'{kept}'
        )
    raise RunDirError(
        f'no intact checkpoint in {self._root} (damaged, kept: '
        f'{", ".join(damaged)}); remove that folder to start over'
    )

  def set_aside(self, version: int, reason: str) -> str:
    """Renames checkpoint `version` `damaged_<name>` with a warning.

    For a version whose own files load but that cannot be resumed (e.g. its
    client states are damaged): `load_latest` then finds the one before.

    Returns:
      The new name.
    """
    name = os.path.basename(self._get_path_for_version(version))
    kept = self._set_aside(name)
    self._log(
        f'warning: skipped the checkpoint {name} in {self._root} ({reason});'
        f' kept as {kept}'
    )
    return kept

  def _set_aside(self, name: str) -> str:
    for i in range(1000):
      kept = f'{DAMAGED_PREFIX}{name}' + (f'.{i}' if i else '')
      if not os.path.lexists(os.path.join(self._root, kept)):
        os.rename(
            os.path.join(self._root, name), os.path.join(self._root, kept)
        )
        return kept
    raise RunDirError(f'too many damaged checkpoints in {self._root}')


_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXTS = ('No space left on device', 'Disk quota exceeded')


def disk_full_message(error: BaseException, out_dir: str) -> Optional[str]:
  """The one-line message for a write that failed on a full disk, else None.

  Python's writes raise `OSError` (ENOSPC, EDQUOT); TensorFlow's (the
  checkpoints, TensorBoard, TFF's CSV files) `ResourceExhaustedError`, whose
  text names the cause (a TensorFlow out-of-memory error does not).
  """
  if isinstance(error, OSError):
    full = error.errno in _DISK_FULL_ERRNOS
  else:
    full = type(error).__name__ == 'ResourceExhaustedError' and any(
        t in str(error) for t in _DISK_FULL_TEXTS
    )
  if not full:
    return None
  return (
      f'disk full while writing in {out_dir}; the checkpoints written before '
      'are kept: free some space and rerun the same command to resume'
  )
