"""Operator and developer tools: seeding, the local receiver, the demo."""
