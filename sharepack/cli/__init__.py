"""`sharepack` (also `kubectl sharepack`): the operator's view of a cluster running sharepack."""
