"""The set-up script refuses unsupported Pythons with one clear line."""

import os
import stat
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fake_python(tmp_path, version):
  path = tmp_path / f'python{version}'
  path.write_text(f'#!/bin/sh\necho {version}\n')
  path.chmod(path.stat().st_mode | stat.S_IEXEC)
  return str(path)


def run_bootstrap(python, tmp_path):
  env = dict(os.environ, PYTHON=python, VENV=str(tmp_path / 'venv'))
  return subprocess.run(
      ['bash', 'scripts/bootstrap.sh'],
      cwd=ROOT,
      check=False,
      env=env,
      capture_output=True,
      text=True,
      timeout=60,
  )


def test_wrong_python_version_is_one_line_error(tmp_path):
  result = run_bootstrap(fake_python(tmp_path, '3.12'), tmp_path)
  lines = [l for l in result.stderr.splitlines() if l.strip()]
  assert result.returncode == 2
  assert len(lines) == 1
  assert 'Python 3.12' in lines[0] and '3.9, 3.10 or 3.11' in lines[0]
  assert not (tmp_path / 'venv').exists()


def test_missing_python_is_one_line_error(tmp_path):
  result = run_bootstrap(str(tmp_path / 'no-such-python'), tmp_path)
  assert result.returncode == 2
  assert len([l for l in result.stderr.splitlines() if l.strip()]) == 1
  assert 'cannot run' in result.stderr
