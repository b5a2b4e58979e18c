"""Runs a simulation engine and the federated path side by side."""

from run import simulation
from tff_algos import stragglers


def _round_plans(task, *, rounds, epochs, straggler_fraction, drop):
  """Yields `(round, plans, config)`: 4 sampled clients a round, stragglers."""
  config = simulation.SimulationConfig(
      total_rounds=rounds,
      clients_per_round=4,
      client_epochs_per_round=epochs,
      seed=3,
      straggler_fraction=straggler_fraction,
  )
  schedule = stragglers.StragglerSchedule(
      fraction=straggler_fraction, epochs=epochs, drop_stragglers=drop, seed=3
  )
  ids = list(task.train_data.client_ids)
  for r in range(1, rounds + 1):
    plans = schedule.participants(
        r, simulation.sample_clients(ids, r, clients_per_round=4, seed=3)
    )
    yield r, plans, config


def run_both(
    task,
    process,
    engine,
    *,
    rounds=2,
    epochs=2,
    straggler_fraction=0.0,
    drop=False,
):
  """`rounds` rounds through `process.next` and through `engine.next`.

  Both see the same sampled clients (4 per round), stragglers, shuffle
  seeds and batches; the engine is closed afterwards. Returns
  `(tff_state, engine_state, tff_metrics, engine_metrics)`, the metrics
  flattened per round.
  """
  tff_state = process.initialize()
  fast_state = tff_state
  tff_metrics, fast_metrics = [], []
  for r, plans, config in _round_plans(
      task,
      rounds=rounds,
      epochs=epochs,
      straggler_fraction=straggler_fraction,
      drop=drop,
  ):
    out = process.next(
        tff_state, simulation.client_datasets(task, plans, r, config)
    )
    tff_state = out.state
    tff_metrics.append(simulation.flatten_metrics(out.metrics))
    fast_state, metrics = engine.next(
        fast_state, simulation.batched_round_plan(task, plans, r, config)
    )
    fast_metrics.append(simulation.flatten_metrics(metrics))
  engine.close()
  return tff_state, fast_state, tff_metrics, fast_metrics


def run_engine(
    task,
    process,
    engine,
    *,
    rounds=2,
    epochs=2,
    straggler_fraction=0.0,
    drop=False,
):
  """`run_both`'s rounds through `engine.next` alone; its final state."""
  state = process.initialize()
  for r, plans, config in _round_plans(
      task,
      rounds=rounds,
      epochs=epochs,
      straggler_fraction=straggler_fraction,
      drop=drop,
  ):
    state, _ = engine.next(
        state, simulation.batched_round_plan(task, plans, r, config)
    )
  engine.close()
  return state
