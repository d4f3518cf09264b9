"""The anomaly gate: the containment stage between fan-out and the agent (see runner)."""
