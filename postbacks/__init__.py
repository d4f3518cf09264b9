"""postbacks: a Kafka pipeline that delivers signed postbacks to ad publishers."""

__version__ = "0.1.0"
