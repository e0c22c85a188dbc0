"""node.config: flags over environment over defaults; bad values named."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from node import config as node_config
from node.ops import cli
from tests.helpers import ROOT

# What every load below runs with besides its own settings: a node id, and
# the explicit consent to unsigned gossip (else a node refuses to start).
BASE = {"NODE_ID": "n1", "GOSSIP_UNSIGNED": "on"}


def test_defaults() -> None:
    config = node_config.load({}, environ=BASE)
    assert config.node_id == "n1"
    assert config.buckets == 256
    assert config.http_bind == ("0.0.0.0", 8080)
    assert config.kafka_bootstrap == ("127.0.0.1:9092",)
    assert config.max_payload_bytes == 256 * 1024


def test_flag_overrides_environment() -> None:
    config = node_config.load(
        {"buckets": "64"}, environ={**BASE, "BUCKETS": "32", "SEEDS": "a:1,b:2"}
    )
    assert config.buckets == 64
    assert config.seeds == ("a:1", "b:2")


def test_advertise_host_defaults_to_a_specific_bind_host() -> None:
    config = node_config.load({"http_bind": "10.1.2.3:80"}, environ=BASE)
    assert config.advertise_host == "10.1.2.3"
    assert config.http_address == "10.1.2.3:80"


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"BUCKETS": "abc"}, "BUCKETS"),
        ({"BUCKETS": "0"}, "BUCKETS"),
        ({"MONGO_URI": "postgres://x"}, "MONGO_URI"),
        ({"HTTP_BIND": "8080"}, "HTTP_BIND"),
        ({"KAFKA_BOOTSTRAP": ""}, "KAFKA_BOOTSTRAP"),
        ({"NODE_ID": "bad id"}, "NODE_ID"),
        ({"LEASE_TTL": "-1"}, "LEASE_TTL"),
        ({"SEEDS": "host:notaport"}, "SEEDS"),
        ({"LOG_FORMAT": "xml"}, "LOG_FORMAT"),
        ({"DEAD_LETTER_TOPIC": "bad topic"}, "DEAD_LETTER_TOPIC"),
        ({"RETRY_BACKOFF": "10", "RETRY_BACKOFF_MAX": "1"}, "RETRY_BACKOFF_MAX"),
    ],
)
def test_invalid_setting_is_named(environ: dict[str, str], named: str) -> None:
    with pytest.raises(node_config.ConfigError, match=f"^{named}:"):
        node_config.load({}, environ={**BASE, **environ})


def test_invalid_flag_names_the_flag() -> None:
    with pytest.raises(node_config.ConfigError, match=r"^--buckets:"):
        node_config.load({"buckets": "many"}, environ=BASE)


def test_run_with_invalid_config_exits_2_with_one_line_before_starting() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "node", "run", "--node-id", "n1"],
        env={"BUCKETS": "-5", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "config error: BUCKETS: must be between 1 and 65536, got -5"
    ]
    assert result.stdout == ""


def test_the_manual_table_is_the_settings_table() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    start = page.index("-->\n", page.index("<!-- config-table")) + 4
    end = page.index("\n<!-- /config-table -->")
    assert page[start:end] == node_config.describe()


def test_cluster_keys_are_parsed_and_never_printed() -> None:
    import base64

    old, new = b"o" * 16, b"n" * 32
    keys = ",".join(base64.b64encode(k).decode() for k in (new, old))
    config = node_config.load({}, environ={**BASE, "CLUSTER_KEYS": keys})
    assert config.cluster_keys == (new, old)
    assert base64.b64encode(new).decode() not in repr(config)
    assert "nnnn" not in repr(config)


@pytest.mark.parametrize("keys", ["not base64!", "c2hvcnQ="])  # the second is 5 bytes
def test_bad_cluster_keys_are_refused(keys: str) -> None:
    with pytest.raises(node_config.ConfigError, match=r"^CLUSTER_KEYS:"):
        node_config.load({}, environ={**BASE, "CLUSTER_KEYS": keys})


def test_node_id_defaults_to_the_host_name() -> None:
    config = node_config.load({}, environ={"GOSSIP_UNSIGNED": "on"})
    assert config.node_id == socket.gethostname().split(".")[0]


@pytest.mark.parametrize(
    ("host", "node_id"),
    [("scheduler-2", "scheduler-2"), ("web1.example.com", "web1"), ("a" * 64, "a" * 64)],
)
def test_node_id_is_the_host_name_when_none_is_given(
    monkeypatch: pytest.MonkeyPatch, host: str, node_id: str
) -> None:
    # A StatefulSet's pod is named scheduler-N, and that is its host name.
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    for environ in ({"GOSSIP_UNSIGNED": "on"}, {"GOSSIP_UNSIGNED": "on", "NODE_ID": ""}):
        assert node_config.load({}, environ=environ).node_id == node_id
    explicit = node_config.load({"node_id": "given"}, environ={"GOSSIP_UNSIGNED": "on"})
    assert explicit.node_id == "given"


@pytest.mark.parametrize("host", ["bad_host!", "x" * 65, ""])
def test_a_host_name_that_is_no_node_id_is_one_line_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], host: str
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: host)
    monkeypatch.delenv("NODE_ID", raising=False)
    monkeypatch.setenv("GOSSIP_UNSIGNED", "on")
    assert cli.main(["run"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("config error: --node-id: not given (nor NODE_ID)"), line
    assert repr(host) in line and "give one with --node-id or NODE_ID" in line


def test_run_without_cluster_keys_refuses_to_start_and_says_how_to_fix_it() -> None:
    """As documented (no --node-id, nothing but the defaults): the node
    refuses unsigned gossip unless told, before it binds anything."""
    result = subprocess.run(
        [sys.executable, "-m", "node", "run"],
        env={"PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("config error: CLUSTER_KEYS: not set")
    assert "GOSSIP_UNSIGNED=on" in line and "head -c 32 /dev/urandom" in line


def test_unsigned_gossip_is_taken_only_when_asked_for() -> None:
    with pytest.raises(node_config.ConfigError, match=r"^CLUSTER_KEYS:"):
        node_config.load({}, environ={"NODE_ID": "n1"})
    assert node_config.load({}, environ=BASE).gossip_unsigned is True


def test_the_node_id_flag_names_the_host_name_as_its_default_and_nothing_else() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    node_config.add_arguments(parser)
    [action] = [a for a in parser._actions if "--node-id" in a.option_strings]
    assert action.help is not None
    assert "(default: the host name)" in action.help and "default none" not in action.help
    [port] = [a for a in parser._actions if "--http-bind" in a.option_strings]
    assert port.help is not None and "default 0.0.0.0:8080" in port.help
