"""The Python rules of the generated BUILD files (tools/build_deps.py).

`py_library` is Bazel's native rule. `py_test` runs one pytest module: its
`main` is tools/bazel/pytest_main.py, which runs pytest on the module's one
source file with the repository's pytest.ini, and depends on the isolation
(tools/bazel/sitecustomize.py) that limits imports to the test's runfiles and
the pinned virtual environment, so a first-party import that is not in the
test's transitive deps fails the test.
"""

def py_library(**kwargs):
    native.py_library(**kwargs)

def py_test(name, srcs, deps = [], data = [], args = [], **kwargs):
    """A pytest module as a Bazel test.

    Args:
      name: the target name (the module's name).
      srcs: exactly one pytest module.
      deps: the libraries the module imports.
      data: files the test reads or runs.
      args: extra pytest arguments.
      **kwargs: passed to the native py_test (size, tags, ...).
    """
    if len(srcs) != 1:
        fail("py_test %s: srcs must be one pytest module, not %s" % (name, srcs))
    runner = "//tools/bazel:pytest_main.py"
    native.py_test(
        name = name,
        srcs = srcs + [runner],
        main = runner,
        args = ["$(rootpath %s)" % srcs[0]] + args,
        deps = deps + ["//tools/bazel:pytest_main"],
        data = data + ["//:pytest.ini"],
        python_version = "PY3",
        srcs_version = "PY3",
        **kwargs
    )
