# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Output files that appear whole or not at all.

Every result file the binaries write (summaries, per-client CSVs, configs,
reports, figures, benchmark JSON) goes through `open_for_replace`: it is
written under a temporary name in the target's folder, flushed to disk, and
renamed over the target only once complete. A kill, a full disk or an
exception leaves the previous file (or none), never a truncated one, and no
temporary file (the training binary's `metrics.csv` too, rewritten whole
each round from memory). The exceptions, by design: the programs'
`metrics.csv` and `evaluation.csv` grow a row a round through TFF's
`CSVFileReleaseManager` (which rewrites the file whole, through a temporary
file, when a resumed run releases a round it already holds), and the run lock
(`run/run_dir.py`). `tests/test_atomic.py` checks that no other module opens
a file for writing in place.

This module imports neither TensorFlow nor TFF.
"""

import contextlib
import itertools
import json
import os
from collections.abc import Iterator
from typing import Any

_counter = itertools.count()
_TEMP = '.tmp-'


def _remove_stale_temps(folder: str, name: str) -> None:
  """Removes `name`'s temporary files left by processes no longer alive.

  A process killed while writing (SIGKILL, power loss) cannot remove its
  temporary file; the next write of the same file does.
  """
  prefix = f'.{name}{_TEMP}'
  with contextlib.suppress(OSError):
    for entry in os.listdir(folder):
      if not entry.startswith(prefix):
        continue
      pid = entry[len(prefix) :].split('-', 1)[0]
      if pid.isdigit() and not _alive(int(pid)):
        with contextlib.suppress(OSError):
          os.remove(os.path.join(folder, entry))


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Alive, another user's.
    return True
  return True


@contextlib.contextmanager
def open_for_replace(
    path: str, mode: str = 'w', **open_kwargs: Any
) -> Iterator[Any]:  # A TextIO for 'w', a BinaryIO for 'wb'.
  """Opens a temporary file that replaces `path` when the block ends cleanly.

  Args:
    path: The file to write. Its folder is created if missing.
    mode: 'w' (text) or 'wb' (bytes).
    **open_kwargs: Passed to `open` (`encoding`, `newline`); text files
      default to UTF-8.

  Yields:
    The open temporary file.

  Raises:
    ValueError: `mode` is not 'w' or 'wb'.
  """
  if mode not in ('w', 'wb'):
    raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
  if mode == 'w':
    open_kwargs.setdefault('encoding', 'utf-8')
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  _remove_stale_temps(folder, os.path.basename(path))
  # Same folder (a rename across file systems is not atomic); the name is
  # unique per process and call, and open() keeps the umask's permissions.
  temp = os.path.join(
      folder, f'.{os.path.basename(path)}{_TEMP}{os.getpid()}-{next(_counter)}'
  )
  try:
    with open(temp, mode, **open_kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(temp, path)
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.remove(temp)


def write_text(path: str, text: str, **open_kwargs: Any) -> None:
  """Writes `text` to `path` whole or not at all."""
  with open_for_replace(path, **open_kwargs) as f:
    f.write(text)


def write_bytes(path: str, data: bytes) -> None:
  """Writes `data` to `path` whole or not at all."""
  with open_for_replace(path, 'wb') as f:
    f.write(data)


def write_json(path: str, data: Any, **dump_kwargs: Any) -> None:
  """Writes `json.dumps(data, **dump_kwargs)` to `path` whole or not at all.

  The text is made before the file is opened, so data JSON cannot encode
  leaves no file behind either.
  """
  write_text(path, json.dumps(data, **dump_kwargs))


def save_figure(fig: Any, path: str, **savefig_kwargs: Any) -> None:
  """A matplotlib figure's `fig.savefig(path)` whole or not at all.

  The format is `path`'s suffix unless `format` is given; matplotlib is not
  imported here.
  """
  savefig_kwargs.setdefault('format', os.path.splitext(path)[1][1:] or 'png')
  with open_for_replace(path, 'wb') as f:
    fig.savefig(f, **savefig_kwargs)
