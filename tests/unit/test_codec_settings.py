from __future__ import annotations

import pytest

from postbacks.codec import MAGIC, codec_for
from postbacks.errors import ConfigError, UndecodableRecord
from postbacks.settings import Secret, load_settings, redact_url
from postbacks.settings_env import dev_keys_in_use
from tests.unit.factories import make_conversion, make_delivery


def test_roundtrip_every_delivery_field() -> None:
    codec = codec_for("Delivery")
    d = make_delivery(due_at=123, hold_reason="retrodated")
    data = codec.encode(d)
    assert data[:2] == MAGIC
    assert codec.decode(data) == d


@pytest.mark.parametrize(
    "data",
    [None, b"", b"\x00\x01", b"garbage that is not avro at all",
     MAGIC + b"\x00" * 8 + b"body"],
)
def test_garbage_is_undecodable(data: bytes | None) -> None:
    with pytest.raises(UndecodableRecord):
        codec_for("ConversionEvent").decode(data)


def test_another_record_type_is_undecodable() -> None:
    data = codec_for("Delivery").encode(make_delivery())
    with pytest.raises(UndecodableRecord, match="fingerprint"):
        codec_for("ConversionEvent").decode(data)


def test_truncated_and_trailing_bytes_are_undecodable() -> None:
    data = codec_for("ConversionEvent").encode(make_conversion())
    with pytest.raises(UndecodableRecord):
        codec_for("ConversionEvent").decode(data[:-5])
    with pytest.raises(UndecodableRecord, match="trailing"):
        codec_for("ConversionEvent").decode(data + b"\x00")


def test_encode_refuses_a_record_missing_a_field() -> None:
    bad = dict(make_conversion())
    del bad["conversion_id"]
    with pytest.raises(ValueError):
        codec_for("ConversionEvent").encode(bad)


def test_settings_from_env() -> None:
    s = load_settings({"KAFKA_BOOTSTRAP_SERVERS": "h:1", "POSTBACKS_ENDPOINT_CONCURRENCY": "8",
                       "POSTBACKS_ALLOW_LOOPBACK_TARGETS": "yes",
                       "POSTBACKS_IDEMPOTENCY_KEY": "s3cret-of-16-chars"})
    assert (s.kafka_bootstrap_servers, s.endpoint_concurrency, s.allow_loopback_targets) == (
        "h:1", 8, True)
    assert isinstance(s.idempotency_key, Secret) and "s3cret-of-16-chars" not in repr(s)
    assert s.topic("dlq.v1") == "dlq.v1"
    assert load_settings({"POSTBACKS_TOPIC_PREFIX": "x."}).topic("dlq.v1") == "x.dlq.v1"


@pytest.mark.parametrize(
    ("env", "message"),
    [({"POSTBACKS_ENDPOINT_CONCURRENCY": "many"}, "POSTBACKS_ENDPOINT_CONCURRENCY"),
     ({"POSTBACKS_ENDPOINT_CONCURRENCY": "0"}, "POSTBACKS_ENDPOINT_CONCURRENCY"),
     ({"POSTBACKS_ALLOW_LOOPBACK_TARGETS": "maybe"}, "boolean"),
     ({"POSTBACKS_DATABASE_URL": "mysql://x"}, "postgresql"),
     ({"POSTBACKS_SECRETS_KEY": ""}, "POSTBACKS_SECRETS_KEY"),
     ({"POSTBACKS_GATE_SWITCH_INTERVAL_S": "0"}, "POSTBACKS_GATE_SWITCH_INTERVAL_S"),
     ({"POSTBACKS_GATE_LINGER_MS": "-1"}, "POSTBACKS_GATE_LINGER_MS"),
     ({"POSTBACKS_GATE_LINGER_MS": "1001"}, "POSTBACKS_GATE_LINGER_MS"),
     ({"POSTBACKS_BATCH_WITHIN_MS": "-1"}, "POSTBACKS_BATCH_WITHIN_MS"),
     ({"POSTBACKS_BATCH_WITHIN_MS": "1001"}, "POSTBACKS_BATCH_WITHIN_MS"),
     ({"POSTBACKS_TXN_RETRY_BACKOFF_MS": "0"}, "POSTBACKS_TXN_RETRY_BACKOFF_MS"),
     ({"POSTBACKS_TXN_RETRY_BACKOFF_MS": "1001"}, "POSTBACKS_TXN_RETRY_BACKOFF_MS"),
     ({"POSTBACKS_GC_GEN0_THRESHOLD": "99"}, "POSTBACKS_GC_GEN0_THRESHOLD"),
     ({"POSTBACKS_GC_GEN0_THRESHOLD": "1000001"}, "POSTBACKS_GC_GEN0_THRESHOLD"),
     ({"POSTBACKS_GATE_SWITCH_INTERVAL_S": "5"}, "POSTBACKS_GATE_SWITCH_INTERVAL_S"),
     ({"POSTBACKS_GATE_PARTIALS_INTERVAL_S": "-1"}, "POSTBACKS_GATE_PARTIALS_INTERVAL_S"),
     ({"POSTBACKS_KAFKA_COMPRESSION": "brotli"}, "POSTBACKS_KAFKA_COMPRESSION.*lz4"),
     # nan passed every "> 0" check; inf too (a timeout that never fires)
     ({"POSTBACKS_HTTP_TIMEOUT_S": "nan"}, "POSTBACKS_HTTP_TIMEOUT_S='nan' is not a finite"),
     ({"POSTBACKS_RETRY_CEILING_S": "inf"}, "POSTBACKS_RETRY_CEILING_S='inf' is not a finite"),
     ({"POSTBACKS_STALL_RESTART_S": "NaN"}, "POSTBACKS_STALL_RESTART_S"),
     # librdkafka refused it when the consumer was made: a restart in place for ever
     ({"POSTBACKS_CONSUMER_SESSION_TIMEOUT_MS": "0"}, "POSTBACKS_CONSUMER_SESSION_TIMEOUT_MS"),
     ({"POSTBACKS_CONSUMER_SESSION_TIMEOUT_MS": "3600001"},
      "POSTBACKS_CONSUMER_SESSION_TIMEOUT_MS"),
     # at 0 a refresher or committer spins, and Faust waits for a full batch
     ({"POSTBACKS_CONFIG_REFRESH_S": "0"}, "POSTBACKS_CONFIG_REFRESH_S must be > 0"),
     ({"POSTBACKS_ANOMALY_REFRESH_S": "-1"}, "POSTBACKS_ANOMALY_REFRESH_S"),
     ({"POSTBACKS_GATE_COMMIT_INTERVAL_S": "0"}, "POSTBACKS_GATE_COMMIT_INTERVAL_S"),
     ({"POSTBACKS_GATE_BATCH_WITHIN_S": "0"}, "POSTBACKS_GATE_BATCH_WITHIN_S"),
     ({"POSTBACKS_GATE_BATCH_MAX": "0"}, "POSTBACKS_GATE_BATCH_MAX"),
     ({"POSTBACKS_ATTEMPT_LOST_AFTER_S": "0"}, "POSTBACKS_ATTEMPT_LOST_AFTER_S"),
     ({"POSTBACKS_METRICS_PORT": "70000"}, "POSTBACKS_METRICS_PORT"),
     ({"POSTBACKS_METRICS_PORT": "-5"}, "POSTBACKS_METRICS_PORT"),
     ({"POSTBACKS_CONSOLE_PORT": "99999"}, "POSTBACKS_CONSOLE_PORT"),
     ({"POSTBACKS_LOG_LEVEL": "verbose"}, "POSTBACKS_LOG_LEVEL='verbose'"),
     ({"POSTBACKS_INSTANCE_ID": ""}, "POSTBACKS_INSTANCE_ID"),
     ({"POSTBACKS_INSTANCE_ID": "a b"}, "POSTBACKS_INSTANCE_ID"),
     ({"POSTBACKS_AVRO_CODEC": "java"}, "POSTBACKS_AVRO_CODEC"),
     ({"POSTBACKS_RETRY_MAX_ATTEMPTS_BY_EVENT_TYPE": "supersede=1"}, "'supersede' is not an"),
     ({"POSTBACKS_IDEMPOTENCY_KEY": "REPLACE-ME"}, "at least 16 characters"),
     ({"POSTBACKS_DATABASE_URL": "postgresql://u:pw@h:x/db"}, "not a valid URL"),
     # accepted, then broke later: diverts due past the relay's 73 h were dead-lettered,
     # the sink's read refused its count, a stage restarted on its first transaction,
     # and `topics create` failed on the name
     ({"POSTBACKS_BREAKER_OPEN_S": "300000"}, "POSTBACKS_BREAKER_OPEN_S must be at most 72 h"),
     ({"POSTBACKS_QUARANTINE_DELAY_S": "259201"}, "POSTBACKS_QUARANTINE_DELAY_S must be at"),
     ({"POSTBACKS_RETRY_CEILING_S": "259201"}, "POSTBACKS_RETRY_CEILING_S must be at most"),
     ({"POSTBACKS_BATCH_SIZE": "250001"}, "POSTBACKS_BATCH_SIZE must be at most 250000"),
     ({"POSTBACKS_STALL_RESTART_S": "0.5"}, "POSTBACKS_STALL_RESTART_S must be at least 1"),
     ({"POSTBACKS_TOPIC_PREFIX": "a b/"}, "POSTBACKS_TOPIC_PREFIX='a b/'"),
     ({"POSTBACKS_TOPIC_PREFIX": "x" * 101}, "POSTBACKS_TOPIC_PREFIX")],
)
def test_bad_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(env)


def test_a_bad_database_url_never_shows_its_password() -> None:
    for url in ("postgresql://u:hunter2@[::1/x", "postgresql://u:hunter2@h:port/x"):
        with pytest.raises(ConfigError) as exc:
            load_settings({"POSTBACKS_DATABASE_URL": url})
        assert "hunter2" not in str(exc.value) and "u:***@" in str(exc.value)
    assert redact_url("postgresql://u:hun@ter2@h/x") == "postgresql://u:***@h/x"  # a bare @
    assert redact_url("postgresql://u@h/x?sslmode=require&password=hunter2") == \
        "postgresql://u@h/x?sslmode=require&password=***"


def test_empty_console_session_key_means_a_random_one_as_documented() -> None:
    assert load_settings({"POSTBACKS_CONSOLE_SESSION_KEY": ""}).console_session_key.reveal() == ""


def test_a_short_console_session_key_is_refused() -> None:
    """A signed-in user holds two HMACs under it (cookie, CSRF token): a short key is
    guessed offline and every session forged."""
    with pytest.raises(ConfigError, match="POSTBACKS_CONSOLE_SESSION_KEY must be at least 32"):
        load_settings({"POSTBACKS_CONSOLE_SESSION_KEY": "hunter2"})
    key = "k" * 32
    assert load_settings({"POSTBACKS_CONSOLE_SESSION_KEY": key}).console_session_key.reveal() == key


def test_dev_keys_are_named_when_in_use() -> None:
    assert dev_keys_in_use(load_settings({})) == ["POSTBACKS_IDEMPOTENCY_KEY",
                                                  "POSTBACKS_SECRETS_KEY"]
    assert dev_keys_in_use(load_settings({"POSTBACKS_IDEMPOTENCY_KEY": "x" * 32})) == [
        "POSTBACKS_SECRETS_KEY"]


def test_transactional_producers_back_off_the_setting_not_librdkafkas_100_ms() -> None:
    from postbacks.kafka.clients import producer_config, transactional_config

    s = load_settings({"POSTBACKS_TXN_RETRY_BACKOFF_MS": "7"})
    assert transactional_config(s, "fanout")["retry.backoff.ms"] == 7
    assert load_settings({}).txn_retry_backoff_ms == 10
    assert "retry.backoff.ms" not in producer_config(s)  # plain producers keep the default


def test_stage_clients_name_their_stage_to_the_broker() -> None:
    from postbacks.kafka.clients import producer_config, transactional_config
    from streams.anomaly_gate.startup import faust_settings

    s = load_settings({"POSTBACKS_TOPIC_PREFIX": "t."})
    assert transactional_config(s, "fanout")["client.id"] == "postbacks-fanout"
    assert transactional_config(s, "agent")["client.id"] == "postbacks-agent"
    assert transactional_config(s, "console-replay-0a1b2c", "console-replay")[
        "client.id"] == "postbacks-console-replay"  # the same id for every publisher
    assert producer_config(s)["client.id"] == "postbacks"  # unless a caller names one
    assert faust_settings(s)["broker_client_id"] == "postbacks-gate-faust"


def test_a_misspelt_setting_is_named_with_the_one_meant() -> None:
    from postbacks.settings_env import unknown_names

    env = {"POSTBACKS_HTTP_TIMEOUT": "1", "POSTBACKS_HTTP_TIMEOUT_S": "2", "HOME": "/",
           "POSTBACKS_KAFKA_PORT": "19092", "POSTBACKS_BENCH_X": "1", "POSTBACKS_ZZZ": "1"}
    assert unknown_names(env) == ["POSTBACKS_HTTP_TIMEOUT (did you mean POSTBACKS_HTTP_TIMEOUT_S?)",
                                  "POSTBACKS_ZZZ"]


def test_every_postbacks_name_the_scripts_read_is_known() -> None:
    """The service scripts' own POSTBACKS_* names are not reported as typos."""
    import re
    from pathlib import Path

    from postbacks.settings_env import unknown_names

    root = Path(__file__).resolve().parents[2]
    text = "".join(p.read_text() for p in [*root.glob("deploy/**/*.sh"), root / ".ci" / "run",
                                           root / "Makefile"] if p.is_file())
    names = set(re.findall(r"POSTBACKS_[A-Z0-9_]*[A-Z0-9]", text))
    assert names and unknown_names(dict.fromkeys(names, "x")) == []
