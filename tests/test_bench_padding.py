"""run.experiments.bench_padding: the padding a vectorized round runs."""

import re

from run.experiments import bench_padding
from tasks import shakespeare_text
from tests import binary


def test_cohort_padding_counts_slots_both_ways():
  # Batch 5: steps 1, 80, 2, 12; one group pads all four to 80 steps.
  got = bench_padding.cohort_padding([4, 400, 7, 60], 5)
  assert got['real'] == 471
  assert got['padded_slots'] == 4 * 80 * 5
  # Size groups {4, 7} (2 steps), {60} (12), {400} (80).
  assert got['grouped_slots'] == 5 * (2 * 2 + 12 + 80)
  assert got['groups'] == 3
  # Equal clients: one group, the same slots.
  same = bench_padding.cohort_padding([32, 32, 32], 16)
  assert same['padded_slots'] == same['grouped_slots'] == 96
  assert same['groups'] == 1


def test_real_roles_and_bad_flags(tmp_path):
  data = tmp_path / 'data'
  shakespeare_text.build(str(data))
  code, stdout, stderr = binary.run_module(
      'run.experiments.bench_padding',
      [f'--data_dir={data}', '--presets=deltafl', '--rounds=20'],
  )
  assert code == 0, stderr[-2000:]
  rows = [l for l in stdout.splitlines() if l.startswith('| deltafl |')]
  assert [r.split('|')[2].strip() for r in rows] == ['all', '200']
  for row in rows:
    padded, grouped = (
        float(v) for v in re.findall(r'\| ([0-9.]+)% \(median', row)
    )
    assert 0 <= grouped <= padded < 100
  uncapped = rows[0]
  assert float(re.findall(r'\| ([0-9.]+)% \(median', uncapped)[0]) > 50
  biggest = f'--batch_size={bench_padding.MAX_BATCH_SIZE}'
  bad = {
      (): 'needs --data_dir',
      (f'--data_dir={tmp_path / "missing"}',): 'missing data file',
      (f'--data_dir={data}', '--presets=nope'): (
          '--presets must name one or more of deltafl, qffl, fedprox, got '
          "['nope']"
      ),
      (f'--data_dir={data}', '--presets='): (
          '--presets must name one or more of deltafl, qffl, fedprox, got []'
      ),
      (f'--data_dir={data}', '--max_examples_per_client=x'): (
          '--max_examples_per_client must be one or more integers >= 0, got '
          "['x']"
      ),
      (f'--data_dir={data}', '--max_examples_per_client='): (
          '--max_examples_per_client must be one or more integers >= 0, got []'
      ),
      (f'--data_dir={data}', '--batch_size=9223372036854775807'): (
          '--batch_size must be in [1, 2147483647], got 9223372036854775807'
      ),
      (f'--data_dir={data}', '--batch_size=0'): (
          '--batch_size must be in [1, 2147483647], got 0'
      ),
      (f'--data_dir={data}', 'stray'): "unexpected arguments ['stray']",
  }
  results = binary.call_main_in_subprocess(
      'run.experiments.bench_padding',
      'bench_padding',
      list(bad)
      + [[f'--data_dir={data}', '--presets=qffl', '--rounds=2', biggest]],
  )
  for (code, err), message in zip(results, bad.values()):
    assert code == 2, err
    lines = binary.error_lines(err)
    assert len(lines) == 1 and lines[0].startswith('bench_padding: error:'), err
    assert message in lines[0], err
  assert results[-1][0] == 0, results[-1][1]  # The largest batch: no overflow.


def test_a_missing_data_file_is_the_error_line_only(tmp_path):
  code, stdout, stderr = binary.run_module(
      'run.experiments.bench_padding', [f'--data_dir={tmp_path}']
  )
  assert code == 2, stderr
  lines = binary.error_lines(stderr)
  assert len(lines) == 1 and lines[0].startswith(
      'bench_padding: error:'
  ), stderr
  assert 'missing data file' in lines[0], stderr
  assert not stdout.strip()  # No table header before the error.
