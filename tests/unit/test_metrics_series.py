"""A stage's labelled counters exist at 0 from its start, so Prometheus sees the first
increment as an increase (increase() ignores a series born at 1)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from postbacks.metrics import DEAD_LETTER_REASONS, DLQ_TOTAL, start_series


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_every_dead_letter_reason_of_the_stage_starts_at_zero() -> None:
    assert _value("webhook_dlq_total", stage="ut-stage", reason="permanent") is None
    start_series("ut-stage")
    for reason in DEAD_LETTER_REASONS:
        assert _value("webhook_dlq_total", stage="ut-stage", reason=reason) == 0.0
    DLQ_TOTAL.labels(stage="ut-stage", reason="permanent").inc()
    assert _value("webhook_dlq_total", stage="ut-stage", reason="permanent") == 1.0


def test_the_gate_starts_every_trip_series() -> None:
    start_series("gate")
    for scope in ("endpoint", "global"):
        for detector in ("retrodating", "value_rate"):
            assert _value("postbacks_anomaly_trips_total", scope=scope,
                          detector=detector) is not None


def test_the_agent_starts_every_attempt_result_and_the_gate_every_signal() -> None:
    """An agent failing every attempt since its start had no "delivered" series: the
    success ratio had no value and never paged. A global signal counted once per window
    was born at 1: the detect-mode alert never saw it."""
    from postbacks.metrics import ATTEMPT_RESULTS

    start_series("agent")
    for result in ATTEMPT_RESULTS:
        assert _value("webhook_delivery_attempts_total", result=result) is not None, result
    start_series("gate")
    for signal in ("retrodated_burst", "payout_rate_global", "retrodated"):
        for mode in ("detect", "enforce"):
            assert _value("postbacks_anomaly_signals_total", reason=signal,
                          mode=mode) is not None, (signal, mode)


def test_the_agent_starts_the_control_refusal_series() -> None:
    """The agent also refuses halts dated ahead or naming an unknown detector, often at
    its start: a series born at 1 is never seen by increase(). Checked in a fresh process
    (the registry is per process, and the gate's start above creates the same series)."""
    import subprocess
    import sys

    code = ("from prometheus_client import REGISTRY\n"
            "from postbacks.metrics import start_series\n"
            "start_series('agent')\n"
            "print([REGISTRY.get_sample_value('postbacks_gate_control_refused_total',"
            " {'reason': r}) for r in ('dated_ahead', 'unknown_detector')])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[0.0, 0.0]"
