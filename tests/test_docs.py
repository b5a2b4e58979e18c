# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""README.md is a front page, and no link of it or of docs/*.md is broken.

Every relative link of README.md and docs/*.md must name a file or folder of
the checkout and, for a Markdown target, a heading of that page (GitHub's
anchors); README.md stays short and links every page of docs/.
"""

import pathlib
import re

import pytest

# The links name files anywhere in the checkout (the real one behind this
# file's symlink), which Bazel's runfiles do not hold: `external` keeps Bazel
# from caching the result.
# bazel-tags: external

ROOT = pathlib.Path(__file__).resolve().parents[1]
README_MAX_LINES = 260

_FENCE = re.compile(r'^\s*(```|~~~)')
_LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')
_HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$')


def outside_code_blocks(text: str) -> list[str]:
  """The lines of Markdown `text` that are not inside fenced code blocks."""
  lines, fenced = [], False
  for line in text.splitlines():
    if _FENCE.match(line):
      fenced = not fenced
    elif not fenced:
      lines.append(line)
  return lines


def relative_links(text: str) -> list[str]:
  """Targets of the Markdown links and images that are not URLs (a link's
  text may run over several lines)."""
  return [
      target
      for target in _LINK.findall('\n'.join(outside_code_blocks(text)))
      if not re.match(r'[a-z][a-z0-9+.-]*:', target)
  ]


def slug(heading: str) -> str:
  """GitHub's anchor for a heading's text (before de-duplication)."""
  text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading).lower()
  text = ''.join(c for c in text if c.isalnum() or c in ' -_')
  return text.replace(' ', '-')


def anchors(text: str) -> set[str]:
  """Every anchor GitHub gives the headings of Markdown `text`."""
  found, seen = set(), {}
  for line in outside_code_blocks(text):
    match = _HEADING.match(line)
    if not match:
      continue
    base = slug(match.group(2))
    count = seen.get(base, 0)
    seen[base] = count + 1
    found.add(base if count == 0 else f'{base}-{count}')
  return found


def broken_links(page: pathlib.Path) -> list[str]:
  """`page`'s relative links to a missing file or to a missing heading."""
  broken = []
  for target in relative_links(page.read_text(encoding='utf-8')):
    path_text, _, anchor = target.partition('#')
    path = (page.parent / path_text).resolve() if path_text else page
    if not path.exists():
      broken.append(f'{target}: no such file')
    elif anchor and path.suffix == '.md':
      if anchor not in anchors(path.read_text(encoding='utf-8')):
        broken.append(f'{target}: no such heading')
  return broken


def pages() -> list[pathlib.Path]:
  return [
      ROOT / 'README.md',
      *sorted((ROOT / 'docs').glob('*.md')),
      *sorted((ROOT / 'docs' / 'results' / 'notes').glob('*.md')),
  ]


# docs/results.md is a reference: each section a summary of at most this
# many lines with a link to its page or notes, no issue numbers in headings.
RESULTS_SECTION_MAX_LINES = 15


def test_results_sections_are_short_summaries_with_links():
  text = (ROOT / 'docs' / 'results.md').read_text(encoding='utf-8')
  sections = re.split(r'(?m)^## ', text)[1:]
  assert len(sections) >= 8
  for section in sections:
    title, _, body = section.partition('\n')
    assert not re.search(r'issue|#\d', title, re.IGNORECASE), title
    lines = [l for l in body.strip().splitlines() if l.strip()]
    assert len(lines) <= RESULTS_SECTION_MAX_LINES, (title, len(lines))
    assert relative_links(body), f'{title}: no link to its page or notes'


# docs/performance.md is a reference (engines, how to choose, the current
# measurements, how to measure, knobs); its dated history is
# docs/performance_log.md. No heading of either carries an issue number.
PERFORMANCE_MAX_LINES = 250


def test_performance_is_a_reference_and_its_log_is_dated():
  reference = (ROOT / 'docs' / 'performance.md').read_text(encoding='utf-8')
  assert len(reference.splitlines()) <= PERFORMANCE_MAX_LINES
  log = (ROOT / 'docs' / 'performance_log.md').read_text(encoding='utf-8')
  for text in (reference, log):
    for line in outside_code_blocks(text):
      match = _HEADING.match(line)
      if match:
        assert not re.search(r'issue|#\d', match.group(2), re.IGNORECASE), line
  dated = [line for line in outside_code_blocks(log) if line.startswith('## ')]
  assert dated and all(re.match(r'## \d{4}-\d\d-\d\d', l) for l in dated), [
      l for l in dated if not re.match(r'## \d{4}-\d\d-\d\d', l)
  ]


def test_the_performance_engine_table_is_the_registrys():
  # docs/performance.md's "which engines" table, generated from the
  # entries (`engines`, `engine_notes`): one row per registered algorithm
  # (rows may list several), a column per engine, "yes" where the entry's
  # `engines` names it.
  from tff_algos import registry  # pylint: disable=g-import-not-at-top

  from tools import option_table  # pylint: disable=g-import-not-at-top

  text = (ROOT / 'docs' / 'performance.md').read_text(encoding='utf-8')
  assert (
      option_table.engine_table() in text
  ), 'docs/performance.md: run python -m tools.option_table --write'
  lines = text.splitlines()
  header = lines.index(
      '| algorithm | `tff` | `batched` | `stacked` | TFF path only |'
  )
  rows = {}
  for line in lines[header + 2 :]:
    if not line.startswith('|'):
      break
    cells = [c.strip() for c in line.strip('|').split('|')]
    for name in re.findall(r'`([a-z_]+)`', cells[0]):
      rows[name] = cells[1:4]
  assert set(rows) == set(registry.names())
  for name, cells in rows.items():
    engines = registry.get(name).engines
    for engine, cell in zip(('tff', 'batched', 'stacked'), cells):
      assert cell.startswith('yes') == (engine in engines), (name, engine)


def test_the_pages_exist():
  names = {p.relative_to(ROOT).as_posix() for p in pages()}
  moved_to = (
      'install',
      'usage',
      'reliability',
      'bazel',
      'performance',
      'reproductions',
      'programs',
      'development',
  )
  assert {'README.md', *(f'docs/{name}.md' for name in moved_to)} <= names


def test_every_relative_link_names_an_existing_file_and_heading():
  broken = {
      page.relative_to(ROOT).as_posix(): broken_links(page) for page in pages()
  }
  assert not {p: b for p, b in broken.items() if b}


def test_readme_is_a_front_page():
  text = (ROOT / 'README.md').read_text(encoding='utf-8')
  assert len(text.splitlines()) <= README_MAX_LINES
  headings = re.findall(r'^## (.*)$', text, re.MULTILINE)
  assert headings == [
      'Two commands',
      'Install with pip (Colab, Jupyter)',
      'Algorithms',
      'Command line',
      'Results',
      'Documentation',
  ]
  # The two commands, each at the start of a line of a code block.
  assert '\nscripts/test.sh\n' in text
  assert '\nscripts/train.sh --task=synthetic ' in text


def test_readme_links_every_docs_page():
  text = (ROOT / 'README.md').read_text(encoding='utf-8')
  linked = {t.partition('#')[0] for t in relative_links(text)}
  unlinked = [
      p.relative_to(ROOT).as_posix()
      for p in sorted((ROOT / 'docs').glob('*.md'))
      if p.relative_to(ROOT).as_posix() not in linked
  ]
  assert not unlinked
  results = (ROOT / 'docs' / 'results.md').read_text(encoding='utf-8')
  notes = {t.partition('#')[0] for t in relative_links(results)}
  assert not [
      p.name
      for p in sorted((ROOT / 'docs' / 'results' / 'notes').glob('*.md'))
      if f'results/notes/{p.name}' not in notes
  ], 'docs/results.md links every page of docs/results/notes'


def test_the_link_checker_finds_what_is_broken(tmp_path):
  (tmp_path / 'b.md').write_text('# Title\n\n## A `code` part: (x, y)\n')
  page = tmp_path / 'a.md'
  page.write_text(
      '# A\n[ok](b.md) [ok](b.md#a-code-part-x-y) [ok](#a) [web](https://x.y)'
      ' ![img](b.md)\n[gone](c.md) [bad](b.md#nothing) [bad](#b)\n'
      '```\n[in code](d.md)\n# not a heading\n```\n'
      '[text over\ntwo lines](#c)\n'
  )
  assert broken_links(page) == [
      'c.md: no such file',
      'b.md#nothing: no such heading',
      '#b: no such heading',
      '#c: no such heading',
  ]
  assert anchors('# X\n## X\n## X\n') == {'x', 'x-1', 'x-2'}


def test_the_option_table_is_the_registrys():
  # docs/usage.md's option table is generated from the algorithms'
  # declarations (`python -m tools.option_table --write` after a change).
  from tools import option_table  # pylint: disable=g-import-not-at-top

  usage = (ROOT / 'docs' / 'usage.md').read_text()
  assert (
      option_table.table() in usage
  ), 'docs/usage.md: run python -m tools.option_table --write'
  # One row per declared option, each naming its algorithms.
  rows = [l for l in option_table.table().splitlines() if l.startswith('| `--')]
  from tff_algos import registry  # pylint: disable=g-import-not-at-top

  assert len(rows) == len(registry.all_options())
  assert any(
      r.startswith('| `--fedplus_lambda` | `fedavg_plus`, `fedgeomed_plus`')
      for r in rows
  )
  changed = option_table.replace(
      usage, option_table.BEGIN + '\nx\n' + option_table.END
  )
  assert option_table.table() not in changed
  with pytest.raises(ValueError, match='no table'):
    option_table.replace('no markers here', 'x')


def test_the_task_option_table_is_the_registrys():
  # docs/tasks.md's task option table is generated from the tasks'
  # declarations (`python -m tools.option_table --write` after a change).
  from tasks import registry  # pylint: disable=g-import-not-at-top
  from tools import option_table  # pylint: disable=g-import-not-at-top

  tasks_md = (ROOT / 'docs' / 'tasks.md').read_text()
  assert (
      option_table.task_table() in tasks_md
  ), 'docs/tasks.md: run python -m tools.option_table --write'
  rows = [
      l for l in option_table.task_table().splitlines() if l.startswith('| `')
  ]
  assert len(rows) == len(registry.option_flags())
  assert (
      '| `--num_clients` | `synthetic`, `synthetic_iid`, `fedplus_regression` '
      '| 100 (`fedplus_regression`: 10) | >= 1 | Number of clients. |'
  ) in rows


def test_the_part_option_table_is_the_declarations():
  # docs/usage.md's table of the run's part options is generated from their
  # declarations (`tff_algos.optimizers`, `privacy.options`,
  # `tff_algos.attacks`, `run.run_options`).
  from run import algorithms  # pylint: disable=g-import-not-at-top
  from run import run_options  # pylint: disable=g-import-not-at-top
  from tff_algos import options as options_lib  # pylint: disable=g-import-not-at-top
  from tools import option_table  # pylint: disable=g-import-not-at-top

  usage = (ROOT / 'docs' / 'usage.md').read_text()
  assert (
      option_table.parts_table() in usage
  ), 'docs/usage.md: run python -m tools.option_table --write'
  rows = [
      l for l in option_table.parts_table().splitlines() if l.startswith('|')
  ][2:]
  parts = (*algorithms.PARTS.values(), *run_options.RUN_PARTS.values())
  names = [
      options_lib.flag_of(f)
      for p in parts
      for f in options_lib.fields_of(p).values()
  ]
  assert [r.split('`')[1] for r in rows] == [f'--{n}' for n in names]
  assert names[:6] == [
      'client_optimizer',
      'client_learning_rate',
      'server_optimizer',
      'server_learning_rate',
      'server_sgd_momentum',
      'client_weighting',
  ]
  assert names[18:22] == [
      'attack',
      'attack_fraction',
      'attack_scale',
      'total_rounds',
  ]
  assert len(names) == 46
  text = '\n'.join(rows)
  assert '| `--dp_delta` | DpOptions | 0 | in [0, 1) |' in text
  assert (
      '| `--attack` | AttackOptions | `none` | `none`, `label_poison`, '
      '`gaussian`, `model_replacement` |'
  ) in text
