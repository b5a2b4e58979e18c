# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""A compact, memory-mapped cache of a LEAF folder's converted examples.

`tasks.leaf` parses each split of a LEAF folder (`DIR/train/*.json`,
`DIR/test/*.json`) once into this cache, then reads only the users whose
datasets are created. One split's entry is the folder
`DIR/.leaf_cache/<split>-<key>/` holding

* `x.bin`: every user's converted `x`, flat, end to end (Shakespeare:
  uint8 character ids; FEMNIST: float32 pixels; Sent140: int32 ids into
  `tokens.json` plus one, 0 the padding, 25 per tweet);
* `y.bin`: every user's int32 labels, end to end;
* `tokens.json` (Sent140): the split's distinct tokens, sorted;
* `index.json`, written last: the key, the layout, each file's layout and
  each user's file, example count, row width and offsets, the byte sizes
  of the two arrays, and the CRC-32 of each of the other files.

The key hashes a key version and each JSON file's name, size,
modification time (ns) and inode, so an edited, added, removed or replaced
file gives a new key: the stale entry is ignored, rebuilt and deleted. An
entry is built in a temporary folder beside it and renamed into place
(`os.replace`), so a killed build leaves no entry.

Opening an entry checks it whole. An index that is missing, does not parse,
is of another format (format 1 had no checksums) or names another key, a
missing file, arrays of other sizes, or a file whose CRC-32 is not the one
its index records (a change of its bytes, even of the same size) make the
entry rebuilt, never trusted, with one warning line on stderr naming the
entry and the reason. The CRC-32s are computed from the bytes as they are
written and checked by reading the files in 1 MiB chunks (`zlib.crc32`): on
the Shakespeare LEAF build of docs/tasks.md (train: 266 MB `x.bin`, 13 MB
`y.bin`) the check takes 0.11-0.29 s, against 1.8-5.3 s for `json.load` of
the train JSON alone, 1/16 to 1/18 of it in each of 3 runs (the command:
docs/performance.md, "Checksums").

If `DIR` is not writable the cache lives in
`$XDG_CACHE_HOME/tff-hetero/leaf/<hash of DIR>/` (default `~/.cache`); if
that fails too, the split is converted in memory (same arrays, no file) and
a warning says so.
"""

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
from typing import Any, BinaryIO, Callable, Optional
import uuid
import zlib

import numpy as np

FORMAT_VERSION = 2  # Of the index; 2: with the files' CRC-32s.
# In the key: unchanged by format 2, so a format-1 entry is found, reported
# and rebuilt in place rather than silently left for a new key.
KEY_VERSION = 1
CACHE_FOLDER = '.leaf_cache'
X_DTYPES = {'femnist': 'float32', 'sent140': 'int32', 'shakespeare': 'uint8'}
_INDEX, _X, _Y, _TOKENS = 'index.json', 'x.bin', 'y.bin', 'tokens.json'
_CHUNK = 1 << 20  # Bytes read at a time to check a CRC-32.


@dataclasses.dataclass(frozen=True)
class UserRecord:
  """Where one user's examples are: source file, count, width, offsets."""

  path: str
  count: int
  width: int
  x_offset: int  # In elements of `x.bin`.
  y_offset: int  # In elements of `y.bin`.


class SplitData:
  """One split's users (in reading order) and, on demand, their arrays."""

  def __init__(
      self,
      *,
      dataset: Optional[str],
      file_layouts: list[tuple[str, Optional[str]]],
      users: dict[str, UserRecord],
      x: np.ndarray,
      y: np.ndarray,
      tokens: Optional[list[str]],
      location: str,
  ):
    self.dataset = dataset
    self.file_layouts = file_layouts
    self.users = users
    self.tokens = tokens
    self.location = location
    self._x, self._y = x, y

  def count(self, user: str) -> int:
    return self.users[user].count

  def width(self, user: str) -> int:
    return self.users[user].width

  def arrays(self, user: str) -> tuple[np.ndarray, np.ndarray]:
    """`(x, y)` of `user`, fresh arrays (x int32 for the id layouts)."""
    record = self.users[user]
    n, width = record.count, record.width
    x = self._x[record.x_offset : record.x_offset + n * width]
    y = self._y[record.y_offset : record.y_offset + n]
    dtype = np.float32 if self.dataset == 'femnist' else np.int32
    return x.astype(dtype).reshape(n, width), np.array(y, np.int32)

  def token_ids(self, user: str) -> np.ndarray:
    """Sent140: `[n, 25]` indices into `tokens` plus one (0: padding)."""
    return self.arrays(user)[0]


# ---------------------------------------------------------------------------
# Keys and locations.


def split_key(paths: list[str]) -> str:
  """A hash of `KEY_VERSION` and each file's name, size, mtime and inode."""
  parts = [KEY_VERSION]
  for path in paths:
    stat = os.stat(path)
    parts.append(
        [os.path.basename(path), stat.st_size, stat.st_mtime_ns, stat.st_ino]
    )
  return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _user_cache_root(leaf_dir: str) -> str:
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(
      os.path.expanduser('~'), '.cache'
  )
  digest = hashlib.sha256(os.path.abspath(leaf_dir).encode()).hexdigest()[:16]
  return os.path.join(base, 'tff-hetero', 'leaf', digest)


def _writable_root(leaf_dir: str) -> tuple[Optional[str], bool]:
  """The first cache folder that can be created and written (or None), and
  whether this call created it."""
  roots = (os.path.join(leaf_dir, CACHE_FOLDER), _user_cache_root(leaf_dir))
  for root in roots:
    with contextlib.suppress(OSError):  # Not creatable: try the next root.
      created = not os.path.isdir(root)
      os.makedirs(root, exist_ok=True)
      if os.access(root, os.W_OK | os.X_OK):
        return root, created
  return None, False


def _remove_if_empty(root: str) -> None:
  """Removes the cache folder a failed build created (kept if another
  process has written an entry there meanwhile)."""
  with contextlib.suppress(OSError):
    os.rmdir(root)


def _existing_roots(leaf_dir: str) -> list[str]:
  roots = [os.path.join(leaf_dir, CACHE_FOLDER), _user_cache_root(leaf_dir)]
  return [r for r in roots if os.path.isdir(r)]


def _warn(message: str) -> None:
  print(f'leaf cache: {message}', file=sys.stderr)


# ---------------------------------------------------------------------------
# Reading an entry.


def _memmap(path: str, dtype: str, size: int) -> np.ndarray:
  if size == 0:
    return np.zeros(0, dtype)
  return np.memmap(path, dtype=dtype, mode='r', shape=(size,))


class DamagedEntry(Exception):
  """An entry that must not be served; the message says why."""


def crc32_of(path: str) -> int:
  """The CRC-32 of the file at `path`, read `_CHUNK` bytes at a time."""
  crc = 0
  buffer = bytearray(_CHUNK)
  view = memoryview(buffer)
  with open(path, 'rb') as f:
    while n := f.readinto(buffer):  # pytype: disable=attribute-error
      crc = zlib.crc32(view[:n], crc)
  return crc


def _read_index(folder: str, key: str) -> dict[str, Any]:
  """The entry's index if it parses, has this format and names `key`."""
  try:
    with open(os.path.join(folder, _INDEX), encoding='utf-8') as f:
      index = json.load(f)
  except FileNotFoundError as e:
    raise DamagedEntry(f'{_INDEX} is missing') from e
  except (UnicodeDecodeError, ValueError) as e:
    raise DamagedEntry(f'{_INDEX} does not parse') from e
  if not isinstance(index, dict):
    raise DamagedEntry(f'{_INDEX} is not an object')
  version = index.get('format')
  if version != FORMAT_VERSION:
    raise DamagedEntry(
        f'{_INDEX} is of format {version}, without checksums (this version'
        f' writes format {FORMAT_VERSION})'
        if version == 1
        else f'{_INDEX} is of format {version!r}, not {FORMAT_VERSION}'
    )
  if index.get('key') != key:
    raise DamagedEntry(f'{_INDEX} names another key, {index.get("key")!r}')
  return index


def _check_file(folder: str, name: str, size: Optional[int], crc: Any) -> None:
  """Raises `DamagedEntry` unless `name` has `size` bytes and CRC-32 `crc`."""
  path = os.path.join(folder, name)
  if not os.path.isfile(path):
    raise DamagedEntry(f'{name} is missing')
  actual = os.path.getsize(path)
  if size is not None and actual != size:
    raise DamagedEntry(f'{name} has {actual} bytes, its index says {size}')
  if crc32_of(path) != crc:
    raise DamagedEntry(f'{name} does not match its checksum')


def open_entry(folder: str, key: str) -> SplitData:
  """The entry in `folder`, checked whole; `DamagedEntry` if it is not."""
  try:
    index = _read_index(folder, key)
    dtype = index['x_dtype']
    x_size, y_size = index['x_size'], index['y_size']
    crcs = index['crc32']
    _check_file(folder, _X, x_size * np.dtype(dtype).itemsize, crcs[_X])
    _check_file(folder, _Y, y_size * 4, crcs[_Y])
    tokens = None
    if index['dataset'] == 'sent140':
      _check_file(folder, _TOKENS, None, crcs[_TOKENS])
      with open(os.path.join(folder, _TOKENS), encoding='utf-8') as f:
        tokens = json.load(f)
      if len(tokens) != index['num_tokens']:
        raise DamagedEntry(
            f'{_TOKENS} holds {len(tokens)} tokens, its index says '
            f'{index["num_tokens"]}'
        )
    users = {
        u: UserRecord(index['paths'][p], n, w, xo, yo)
        for u, p, n, w, xo, yo in index['users']
    }
    return SplitData(
        dataset=index['dataset'],
        file_layouts=[tuple(fl) for fl in index['file_layouts']],
        users=users,
        x=_memmap(os.path.join(folder, _X), dtype, x_size),
        y=_memmap(os.path.join(folder, _Y), 'int32', y_size),
        tokens=tokens,
        location=folder,
    )
  except OSError as e:
    raise DamagedEntry(f'cannot be read ({e})') from e
  except (ValueError, KeyError, TypeError, IndexError) as e:
    raise DamagedEntry(
        f'{_INDEX} is malformed ({type(e).__name__}: {e})'
    ) from e


def _load_entry(folder: str, key: str) -> Optional[SplitData]:
  """The entry in `folder` if it is whole and has `key`, else None."""
  try:
    return open_entry(folder, key)
  except DamagedEntry:
    return None


# ---------------------------------------------------------------------------
# Building an entry.


class _Writer:
  """Appends users' converted arrays to two binary streams."""

  def __init__(self, x_file: BinaryIO, y_file: BinaryIO):
    self.x_file, self.y_file = x_file, y_file
    self.x_size, self.y_size = 0, 0
    self.crc32 = {_X: 0, _Y: 0}  # Of the bytes written, as they are.
    self.users: list[list[Any]] = []
    self.paths: list[str] = []
    self.file_layouts: list[tuple[str, Optional[str]]] = []
    self.dataset: Optional[str] = None
    self.token_ids: dict[str, int] = {}  # Sent140: first-seen ids.

  def add_file(self, path: str, layout: Optional[str]) -> None:
    self.file_layouts.append((path, layout))
    self.paths.append(path)
    if layout is not None and self.dataset is None:
      self.dataset = layout

  def add_user(self, user: str, x: Any, y: np.ndarray) -> None:
    """One user's converted `x` (array, or token lists) and labels."""
    if isinstance(x, list):
      x = self._token_rows(x)
    x = np.ascontiguousarray(x, X_DTYPES[self.dataset])
    self.users.append(
        [user, len(self.paths) - 1, len(y), x.shape[1]]
        + [self.x_size, self.y_size]
    )
    self._write(_X, self.x_file, x.tobytes())
    self._write(_Y, self.y_file, np.ascontiguousarray(y, np.int32).tobytes())
    self.x_size += x.size
    self.y_size += len(y)

  def _write(self, name: str, file: BinaryIO, data: bytes) -> None:
    file.write(data)
    self.crc32[name] = zlib.crc32(data, self.crc32[name])

  def _token_rows(self, token_lists: list[list[str]]) -> np.ndarray:
    rows = np.zeros((len(token_lists), 25), np.int32)
    ids = self.token_ids
    for row, tokens in zip(rows, token_lists):
      row[: len(tokens)] = [ids.setdefault(t, len(ids)) + 1 for t in tokens]
    return rows

  def sorted_tokens(self) -> tuple[list[str], np.ndarray]:
    """The tokens sorted, and the map from first-seen id + 1 to sorted + 1."""
    tokens = sorted(self.token_ids)
    remap = np.zeros(len(tokens) + 1, np.int32)
    rank = {t: i for i, t in enumerate(tokens)}
    for token, first in self.token_ids.items():
      remap[first + 1] = rank[token] + 1
    return tokens, remap

  def index(self, key: str) -> dict[str, Any]:
    return {
        'format': FORMAT_VERSION,
        'key': key,
        'dataset': self.dataset,
        'x_dtype': X_DTYPES.get(self.dataset, 'uint8'),
        'x_size': self.x_size,
        'y_size': self.y_size,
        'num_tokens': len(self.token_ids),
        'crc32': self.crc32,
        'paths': self.paths,
        'file_layouts': self.file_layouts,
        'users': self.users,
    }


ReadFn = Callable[[_Writer], None]


def _build_in(folder: str, key: str, read: ReadFn) -> None:
  """Builds an entry into the (new, empty) `folder`."""
  x_path, y_path = os.path.join(folder, _X), os.path.join(folder, _Y)
  with open(x_path, 'wb') as x_file, open(y_path, 'wb') as y_file:
    writer = _Writer(x_file, y_file)
    read(writer)
  if writer.dataset == 'sent140':
    tokens, remap = writer.sorted_tokens()
    x = remap[np.fromfile(x_path, np.int32)]
    x.tofile(x_path)
    tokens_json = json.dumps(tokens).encode()
    with open(os.path.join(folder, _TOKENS), 'wb') as f:
      f.write(tokens_json)
    writer.crc32[_X] = zlib.crc32(x)
    writer.crc32[_TOKENS] = zlib.crc32(tokens_json)
  for name in writer.crc32:
    with open(os.path.join(folder, name), 'rb+') as f:
      os.fsync(f.fileno())
  with open(os.path.join(folder, _INDEX), 'w', encoding='utf-8') as f:
    json.dump(writer.index(key), f)
    f.flush()
    os.fsync(f.fileno())


def _build_in_memory(key: str, read: ReadFn) -> SplitData:
  x_file, y_file = io.BytesIO(), io.BytesIO()
  writer = _Writer(x_file, y_file)
  read(writer)
  dtype = X_DTYPES.get(writer.dataset, 'uint8')
  x = np.frombuffer(x_file.getvalue(), dtype)
  tokens = None
  if writer.dataset == 'sent140':
    tokens, remap = writer.sorted_tokens()
    x = remap[x]
  index = writer.index(key)
  return SplitData(
      dataset=writer.dataset,
      file_layouts=writer.file_layouts,
      users={
          u: UserRecord(writer.paths[p], n, w, xo, yo)
          for u, p, n, w, xo, yo in index['users']
      },
      x=x,
      y=np.frombuffer(y_file.getvalue(), np.int32),
      tokens=tokens,
      location='memory',
  )


def _remove_stale(root: str, split: str, keep: str) -> None:
  """Deletes `split`'s other entries and dead builders' temporary folders."""
  for name in os.listdir(root):
    path = os.path.join(root, name)
    if name.startswith(f'{split}-') and name != keep:
      shutil.rmtree(path, ignore_errors=True)
    elif name.startswith(f'.tmp-{split}-'):
      pid = name.split('-')[2]
      if pid.isdigit() and not _alive(int(pid)):
        shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except OSError:
    return True
  return True


def _build(root: str, split: str, key: str, read: ReadFn) -> SplitData:
  """Builds `split`'s entry under `root` atomically and loads it."""
  final = os.path.join(root, f'{split}-{key}')
  temp = tempfile.mkdtemp(
      prefix=f'.tmp-{split}-{os.getpid()}-{uuid.uuid4().hex[:8]}-', dir=root
  )
  try:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temp, 0o777 & ~umask)  # `mkdtemp` makes it private.
    _build_in(temp, key, read)
    if os.path.isdir(final):  # A damaged entry, or another builder's.
      if _load_entry(final, key) is None:
        shutil.rmtree(final, ignore_errors=True)
    # OSError: another process put a whole entry there first.
    with contextlib.suppress(OSError):
      os.replace(temp, final)
  finally:
    shutil.rmtree(temp, ignore_errors=True)
  _remove_stale(root, split, os.path.basename(final))
  try:
    return open_entry(final, key)
  except DamagedEntry as e:
    raise OSError(f'the cache entry {final} did not read back: {e}') from e


def _as_spelled(data: SplitData, paths: list[str]) -> SplitData:
  """`data` naming its files as `paths` do (the folder may be spelled anew)."""
  spelled = {os.path.basename(p): p for p in paths}
  respell = lambda path: spelled.get(os.path.basename(path), path)
  data.file_layouts = [(respell(p), layout) for p, layout in data.file_layouts]
  data.users = {
      u: dataclasses.replace(r, path=respell(r.path))
      for u, r in data.users.items()
  }
  return data


def _checked_entry(folder: str, key: str) -> Optional[SplitData]:
  """The entry in `folder`; None, with one warning if it is damaged."""
  if not os.path.lexists(folder):
    return None
  try:
    return open_entry(folder, key)
  except DamagedEntry as e:
    _warn(f'rebuilding {folder}: {e}')
    return None


def load_split(
    leaf_dir: str, split: str, paths: list[str], read: ReadFn
) -> SplitData:
  """`split`'s cached data, built with `read` when missing or stale.

  Args:
    leaf_dir: The LEAF folder.
    split: `'train'` or `'test'`.
    paths: The split's JSON files, sorted (the key's input).
    read: Fills a `_Writer` from the files: `add_file` per file, then
      `add_user` per user; raises `TaskError` on bad data (nothing is kept).

  Returns:
    The split's users and their arrays (memory-mapped when cached).
  """
  key = split_key(paths)
  for root in _existing_roots(leaf_dir):
    data = _checked_entry(os.path.join(root, f'{split}-{key}'), key)
    if data is not None:
      return _as_spelled(data, paths)
  root, created = _writable_root(leaf_dir)
  if root is not None:
    try:
      return _build(root, split, key, read)
    except OSError as e:
      if created:
        _remove_if_empty(root)
      _warn(f'cannot write under {root} ({e}); converting {split}/ in memory')
    except BaseException:  # Bad data (`TaskError`) or an interrupt.
      if created:
        _remove_if_empty(root)
      raise
  else:
    _warn(
        f'neither {os.path.join(leaf_dir, CACHE_FOLDER)} nor '
        f'{_user_cache_root(leaf_dir)} is writable; converting {split}/ in '
        'memory'
    )
  return _build_in_memory(key, read)
