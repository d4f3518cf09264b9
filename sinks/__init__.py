"""Sinks: consumers that write topics into PostgreSQL, exactly once."""
