"""Which path runs a call: the planner's choice for a communicator (``choice``) and the
symmetric-memory route on one host (``routing``)."""
