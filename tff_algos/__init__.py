"""TensorFlow Federated 0.87 algorithms for heterogeneous clients (tff-hetero).

Every algorithm is a `build_*` function returning a
`tff.learning.templates.LearningProcess`; `tasks` holds the data, `privacy`
the differentially private pieces and `run` the training loop and binaries.

Install (Python 3.9, 3.10 or 3.11 on Linux x86-64, as TFF 0.87 requires):

* From a clone: `scripts/bootstrap.sh` makes `.venv` with the pinned stack
  (requirements.txt, then requirements-nodeps.txt with `--no-deps`) and
  installs this package in editable mode.
* Without a clone (Colab, Jupyter, a pipeline): the three `pip` commands of
  README.md, "Install with pip (Colab, Jupyter)": the pinned requirements,
  then `tensorflow-federated==0.87.0 jax==0.4.14 jaxlib==0.4.13` with
  `--no-deps`, then this package (a wheel or the repository) with
  `--no-deps`. `pip install tensorflow-federated==0.87.0` alone cannot
  resolve: TFF pins a jaxlib that PyPI no longer serves.

Either way every binary is a command, `tff-hetero-<module>` (`run.train` is
`tff-hetero-train`), and `--download` fetches TFF's dataset files on request
(`tasks.download`).
"""
