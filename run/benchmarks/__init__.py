# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The benchmarks behind docs/performance.md.

Each module is a binary that times this library against stock TFF and a plain
`tf.function` loop (`python -m run.benchmarks.<name>`, or the console command
`tff-hetero-<name>`).
"""
