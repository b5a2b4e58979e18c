"""Round plans and a loop for the stateful engines' equivalence tests.

Shared by tests/test_stacked_ditto.py and tests/test_stacked_fedplus.py:
both run the batched and the stacked engine on the same plans and compare
the global model, each client's state and the round metrics.
"""

import collections

from tff_algos import batched


def plans(task, rounds):
  """Round plans: 5 clients, 1 or 2 epochs, two cut short (stragglers).

  Rounds overlap (clients 3, 4, 6 and 7 come back), so a client's own
  state differs from the broadcast model when it does.
  """
  ids = sorted(task.train_data.client_ids)
  for r in range(rounds):
    chosen = [ids[(3 * r + i) % len(ids)] for i in range(5)]
    yield batched.RoundPlan(
        client_ids=chosen,
        epochs=[2, 1, 2, 2, 1],
        shuffle_seeds=[1000 * r + 17 * i + 5 for i in range(5)],
        max_batches=[-1, 2, 3, -1, -1],
    )


def run_engine(task, engine, process, rounds):
  """`rounds` rounds of `engine`: final state, client states, metrics."""
  state = process.initialize()
  held, metrics = {}, []
  for plan in plans(task, rounds):
    ids = list(plan.client_ids)
    states = [held.get(c, process.initial_client_state()) for c in ids]
    out = engine.next(state, plan, states)
    held.update(zip(ids, out.client_states))
    state = out.state
    metrics.append(out.metrics)
  engine.close()
  return state, held, metrics


def flat_metrics(metrics):
  """`{'a/b': value}` of nested round metrics."""
  flat = {}
  for key, value in metrics.items():
    if isinstance(value, collections.abc.Mapping):
      flat.update({f'{key}/{k}': v for k, v in flat_metrics(value).items()})
    else:
      flat[key] = value
  return flat
