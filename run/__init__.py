# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The binaries and the simulation API.

* Binaries: `run.train`, `run.program`, `run.stateful_program`, `run.report`,
  `run.download`.
* The simulation library users call from Python: `run.simulation`,
  `run.engines`, `run.contexts`, `run.algorithms` (and their helpers
  `run.run_dir`, `run.atomic`, `run.privacy_setup`, `run.console`).
* `run.experiments`: the experiments behind docs/results.
* `run.benchmarks`: the benchmarks behind docs/performance.md.
"""
