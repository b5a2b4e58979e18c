# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""privacy.toy_regression: the thesis's AdaDPS / DP^2 toy problem (6.2.1).

Checked against the section's description directly: the features' rates,
the target weights' two levels, and the noise that gives epsilon = 4.13.
"""

# bazel-data: examples/quickstart.ipynb examples/tail_objectives.ipynb
# bazel-data: examples/personalization_robustness.ipynb examples/privacy.ipynb

import glob
import json
import os
import re

import numpy as np

from privacy import accounting
from privacy import toy_regression

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_data_follows_the_sections_description():
  x, y = toy_regression.toy_data(0)
  assert x.shape == (1000, 500) and y.shape == (1000,)
  assert set(np.unique(x)) == {0.0, 1.0}
  frequent, rare = x[:, :50].mean(), x[:, 50:].mean()
  assert abs(frequent - 0.9) < 0.01 and abs(rare - 0.01) < 0.002
  # y = x w* + N(0, 0.1^2), w* = 0.01 on the frequent, 1 on the rare ones.
  w_true = np.where(np.arange(500) < 50, 0.01, 1.0)
  noise = y - x @ w_true
  assert abs(noise.std() - 0.1) < 0.01 and abs(noise.mean()) < 0.01
  assert toy_regression.toy_loss(x, y, w_true) == 0.5 * np.mean(noise**2)
  again, _ = toy_regression.toy_data(0)
  np.testing.assert_array_equal(again, x)
  assert not np.array_equal(toy_regression.toy_data(1)[0], x)


def test_sigma_gives_the_target_epsilon():
  toy = toy_regression.TOY
  sigma = toy_regression.toy_sigma()
  mechanism = accounting.DpMechanism(sigma, toy['batch'], toy['n'], 'poisson')
  epsilon = mechanism.epsilon(toy['steps'], toy['delta'])
  assert abs(epsilon - 4.13) < 0.01, (sigma, epsilon)


def test_no_notebook_imports_what_the_wheel_leaves_out():
  """The notebooks run after "Install with pip": they import no experiment
  (run/experiments is not installed) and nothing from tests."""
  notebooks = sorted(glob.glob(os.path.join(ROOT, 'examples', '*.ipynb')))
  assert len(notebooks) == 4
  for path in notebooks:
    with open(path) as f:
      cells = json.load(f)['cells']
    source = '\n'.join(
        ''.join(c['source']) for c in cells if c['cell_type'] == 'code'
    )
    assert not re.search(r'\brun\.experiments\b|\bfrom tests\b', source), path
