# Copyright 2026 The tff-hetero Authors. Licensed under the Apache License 2.0.
"""Under `bazel test`, first-party imports resolve from the runfiles only.

Python imports this module at start-up when it is on the path, which Bazel
arranges for every py_test of this repository (`//tools/bazel:pytest_main`
has `imports = ["."]`, and the tests' child processes inherit PYTHONPATH).
Outside Bazel (no RUNFILES_DIR / TEST_SRCDIR) it does nothing.

The pinned virtual environment has the repository installed in editable mode:
its site-packages holds a .pth file that appends the checkout the venv was
made from to sys.path. Under Bazel that entry would let a test import a
module its BUILD deps omit (from the source tree, or from another checkout),
so a missing dep would go unnoticed. This module keeps only the sys.path
entries inside the runfiles tree or inside the interpreter's own prefixes
(the standard library and the venv's site-packages), and drops the import
hooks of PEP 660 editable installs.
"""

import os
import sys


def _inside(path: str, roots: list[str]) -> bool:
  return any(path == root or path.startswith(root + os.sep) for root in roots)


def isolate(environ=os.environ) -> list[str]:
  """Drops the sys.path entries outside runfiles and prefixes; returns them."""
  runfiles = environ.get('RUNFILES_DIR') or environ.get('TEST_SRCDIR')
  if not runfiles:
    return []
  roots = sorted(
      {
          os.path.realpath(p)
          for p in (
              runfiles,
              sys.prefix,
              sys.base_prefix,
              sys.exec_prefix,
              sys.base_exec_prefix,
          )
      }
  )
  kept, dropped = [], []
  for entry in sys.path:
    real = os.path.realpath(entry or os.getcwd())
    (kept if _inside(real, roots) else dropped).append(entry)
  sys.path[:] = kept
  sys.meta_path[:] = [
      finder
      for finder in sys.meta_path
      if not getattr(finder, '__module__', '').startswith('__editable__')
      and not getattr(type(finder), '__module__', '').startswith('__editable__')
  ]
  for entry in dropped:
    sys.path_importer_cache.pop(entry, None)
  return dropped


DROPPED = isolate()
