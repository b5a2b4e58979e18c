"""run.experiments.bench_loss_pass: the loss pass by iterator equals the one by
reduce."""

import re

from tests import binary


def _run(args, timeout=400):
  return binary.run_module('run.experiments.bench_loss_pass', args, timeout)


def test_one_round_of_term_both_loss_passes_agree():
  code, stdout, stderr = _run(
      [
          '--algorithms=term',
          '--rounds=1',
          '--warmup_rounds=1',
          '--clients_per_round=3',
      ]
  )
  assert code == 0, stderr[-2000:]
  rows = dict(
      re.findall(r'^\| (\S+) \| [0-9.]+ \| ([0-9.]+) \|', stdout, re.MULTILINE)
  )
  assert set(rows) == {'fedavg', 'term', 'term/reduce_loss'}
  assert all(float(v) > 0 for v in rows.values())
  assert 'term: final weights, loss pass by iterator vs reduce, L-inf 0\n' in (
      stdout
  )


def test_bad_flags_exit_2_with_one_line():
  code, _, stderr = _run(['--algorithms=fedavg'])
  assert code == 2
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith('bench_loss_pass: error:')
