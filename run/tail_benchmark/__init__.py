# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The tail benchmark: methods tuned alike, compared on their worst clients.

`python -m run.tail_benchmark.benchmark` (the console command
`tff-hetero-benchmark`) is the command line; its docstring describes the
benchmark. The modules:

* `settings`: the settings (task, budget, grids) and the methods, read from
  the algorithm registry's declarations;
* `selection`: the configurations to try, successive halving, the fairness
  rules, the baselines and the report's runs (`Benchmark`);
* `records`: the record store (`Runs`): one JSON record per run, reused or
  redone by its arguments and origin;
* `origin`: which code, data and library versions made a record;
* `stats`: per-client summaries, the selection criterion, the fall-back and
  spread rules;
* `page`: the Markdown page, its pictures and results JSON;
* `pool`: long-lived worker processes that run `run.train` with their builds
  kept between runs;
* `processes`: the driver's children, and how a signal ends them.
"""
