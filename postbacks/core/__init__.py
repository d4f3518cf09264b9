"""The pure core: decisions as plain functions and frozen values.

Nothing in this package imports Kafka, HTTP, a database driver, the clock or ``random``:
callers pass ``now`` (epoch milliseconds) and any randomness in. Everything here is tested
with parameter tables and no services.
"""
