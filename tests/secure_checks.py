"""Checks that only secure sums move client values to the server."""

import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.compiler import building_blocks
from tensorflow_federated.python.core.impl.compiler import intrinsic_defs
from tensorflow_federated.python.core.impl.compiler import tree_analysis
from tensorflow_federated.python.core.impl.types import type_analysis

SECURE_URIS = {
    intrinsic_defs.FEDERATED_SECURE_SUM_BITWIDTH.uri,
    intrinsic_defs.FEDERATED_SECURE_SUM.uri,
}


def _has_placement(type_spec, placement):
  return type_spec is not None and type_analysis.contains(
      type_spec,
      lambda t: isinstance(t, tff.FederatedType) and t.placement is placement,
  )


def client_to_server_intrinsics(comp):
  """URIs of every intrinsic taking CLIENTS data and giving SERVER data."""
  uris = []

  def visit(block):
    if isinstance(block, building_blocks.Intrinsic):
      t = block.type_signature
      if (
          isinstance(t, tff.FunctionType)
          and _has_placement(t.parameter, tff.CLIENTS)
          and _has_placement(t.result, tff.SERVER)
      ):
        uris.append(block.uri)

  tree_analysis.visit_postorder(comp.to_building_block(), visit)
  return uris
