# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""A deliberate type error that scripts/lint.sh expects pytype to report.

`q` of `q_ffl.build_q_fedavg` is annotated `float`; a string is a real bug a
user could make (a flag value passed through unparsed). scripts/lint.sh
type-checks this file after the project and fails if pytype stays silent, so
CI shows on every run that the type checker catches such an error. Not part
of the package: nothing imports it.
"""

from tff_algos import q_ffl


def build_with_a_string_q(model_fn, optimizer):
  return q_ffl.build_q_fedavg(
      model_fn, optimizer, q='1.0', lipschitz_constant=10.0
  )
