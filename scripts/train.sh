#!/usr/bin/env bash
# Sets up the pinned environment if needed, then runs the training binary with the given flags.
# Usage: scripts/train.sh --task=synthetic --algorithm=fedprox --proximal_strength=1 ...
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m run.train "$@"
