# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""The experiments behind docs/results.

Each module is a binary that reproduces a seed's table or figure
(`python -m run.experiments.<name>`, or the console command
`tff-hetero-<name>`) and writes the Markdown that docs/ quotes.
"""
