"""Runs a simulation engine and the federated path side by side."""

from run import simulation
from tff_algos import stateful
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
    client_states=None,
):
  """`rounds` rounds through `process.next` and through `engine.next`.

  Both see the same sampled clients (4 per round), stragglers, shuffle
  seeds and batches; the engine is closed afterwards. A stateful process
  (Ditto, Fed+) and the engine each keep their own client states (pass a
  dict as `client_states` to get them back under 'tff' and 'engine'); AFL's
  clients get their indices. Returns `(tff_state, engine_state,
  tff_metrics, engine_metrics)`, the metrics flattened per round.
  """
  tff_state = process.initialize()
  fast_state = tff_state
  tff_metrics, fast_metrics = [], []
  is_stateful = stateful.is_stateful(process)
  index_of = None
  if simulation.needs_client_index(process):
    index_of = {c: i for i, c in enumerate(task.train_data.client_ids)}
  states = {'tff': {}, 'engine': {}}
  for r, plans, config in _round_plans(
      task,
      rounds=rounds,
      epochs=epochs,
      straggler_fraction=straggler_fraction,
      drop=drop,
  ):
    datasets = simulation.client_datasets(task, plans, r, config)
    if index_of is not None:
      datasets = simulation.with_client_index(datasets, plans, index_of)
    plan = simulation.batched_round_plan(
        task, plans, r, config, index_of=index_of
    )
    if is_stateful:
      ids = [p.client_id for p in plans]

      def held_states(name, ids=ids):
        return [
            states[name].get(c, process.initial_client_state()) for c in ids
        ]

      out = process.next(tff_state, datasets, held_states('tff'))
      fast_out = engine.next(fast_state, plan, held_states('engine'))
      states['tff'].update(zip(ids, out.client_states))
      states['engine'].update(zip(ids, fast_out.client_states))
      tff_state, fast_state = out.state, fast_out.state
      tff_metrics.append(simulation.flatten_metrics(out.metrics))
      fast_metrics.append(simulation.flatten_metrics(fast_out.metrics))
      continue
    out = process.next(tff_state, datasets)
    tff_state = out.state
    tff_metrics.append(simulation.flatten_metrics(out.metrics))
    fast_state, metrics = engine.next(fast_state, plan)
    fast_metrics.append(simulation.flatten_metrics(metrics))
  engine.close()
  if client_states is not None:
    client_states.update(states)
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
