# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The binaries and the simulation API.

* Binaries: `run.train`, `run.program`, `run.stateful_program`, `run.report`,
  `run.download`.
* The simulation library users call from Python: `run.simulation`,
  `run.engines`, `run.contexts`, `run.algorithms` (and their helpers
  `run.run_dir`, `run.atomic`, `run.privacy_setup`, `run.console`).
* `run.experiments`: the experiments behind docs/results.
* `run.benchmarks`: the benchmarks behind docs/performance.md.

Importing `run` sets `TF_ENABLE_ONEDNN_OPTS=0` unless it is set: TensorFlow
2.14 turns its oneDNN kernels on by default only on CPUs with AVX-512 VNNI,
BF16 or AMX, and they round otherwise than the default kernels, so the same
run gave other numbers on another machine (a Synthetic benchmark cell's
loss by 4e-6, a Delta-FL curve point by 0.2, which the theta filter
amplifies). With it every x86 machine computes the same numbers, and a
benchmark record says which kernels made it (`tail_benchmark.origin`).
`TF_ENABLE_ONEDNN_OPTS=1` turns oneDNN on again.
"""

import os

# Before any TensorFlow import: its kernels are chosen when it loads.
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
