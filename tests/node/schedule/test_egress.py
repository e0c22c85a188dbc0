"""The egress policy (node/schedule/egress.py): what a URL alone shows,
checked at create. The same forms refused again at delivery, with a server
listening that must receive nothing, are in tests/node/delivery/test_http_sink.py."""

from __future__ import annotations

import pytest

from node.errors import ValidationFailed
from node.schedule.egress import EgressPolicy, check_url

DEFAULT = EgressPolicy()
LOOPBACK_OPEN = EgressPolicy.parse("127.0.0.0/8")

# Every form of a URL that must not be called under the default policy.
REFUSED = [
    pytest.param("http://127.0.0.1/hook", id="loopback-v4"),
    pytest.param("http://[::1]/hook", id="loopback-v6"),
    pytest.param("http://10.0.0.1/", id="private-10"),
    pytest.param("http://172.16.0.1/", id="private-172.16"),
    pytest.param("http://192.168.0.1/", id="private-192.168"),
    pytest.param("http://169.254.169.254/latest/meta-data/", id="cloud-metadata"),
    pytest.param("http://[fc00::1]/", id="unique-local-v6"),
    pytest.param("http://[fe80::1]/", id="link-local-v6"),
    pytest.param("http://[::ffff:127.0.0.1]/", id="v4-mapped-loopback"),
    pytest.param("http://0.0.0.0/", id="unspecified"),
    pytest.param("http://localhost/", id="localhost"),
    pytest.param("http://api.localhost/", id="under-localhost"),
    pytest.param("http://2130706433/", id="decimal-v4"),
    pytest.param("http://0177.0.0.1/", id="octal-v4"),
    pytest.param("http://0x7f.0.0.1/", id="hex-v4"),
    pytest.param("http://127.1/", id="short-v4"),
    pytest.param("http://u:p@example.com/", id="userinfo"),
    pytest.param("http://u@example.com/", id="user-only"),
    pytest.param("ftp://example.com/", id="ftp"),
    pytest.param("file:///etc/passwd", id="file"),
    pytest.param("gopher://example.com/", id="gopher"),
    pytest.param("http://example.com:0/", id="port-0"),
    pytest.param("http://example.com:99999/", id="port-out-of-range"),
    pytest.param("http://example.com/a b", id="space"),
    pytest.param("http://example.com/\x00", id="nul"),
    pytest.param("http://example.com/#frag", id="fragment"),
    pytest.param("http://exa\u0301mple.com/", id="non-ascii"),
    pytest.param("http://[::1/", id="broken-v6"),
    pytest.param("http:///path", id="no-host"),
    pytest.param("http://" + "a" * 2100 + ".com/", id="too-long"),
]


@pytest.mark.parametrize("url", REFUSED)
def test_refused_at_create(url: str) -> None:
    with pytest.raises(ValidationFailed) as refused:
        check_url(url, DEFAULT)
    assert refused.value.field == "http.url"


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1/hook", "http://localhost:8080/hook", "http://127.0.0.2/"],
)
def test_allowed_once_the_policy_names_the_range(url: str) -> None:
    assert check_url(url, LOOPBACK_OPEN).url == url


@pytest.mark.parametrize(
    "url",
    [
        # Opening loopback opens no other spelling of it, nor another range.
        "http://2130706433/",
        "http://0177.0.0.1/",
        "http://10.0.0.1/",
        "http://u:p@127.0.0.1/",
        "ftp://127.0.0.1/",
    ],
)
def test_still_refused_with_loopback_open(url: str) -> None:
    with pytest.raises(ValidationFailed):
        check_url(url, LOOPBACK_OPEN)


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("https://example.com/hook", "example.com", 443),
        ("http://example.com:8080/hook", "example.com", 8080),
        ("https://93.184.216.34/", "93.184.216.34", 443),
        ("http://[2606:2800:220:1:248:1893:25c8:1946]/", "2606:2800:220:1:248:1893:25c8:1946", 80),
    ],
)
def test_public_targets_pass(url: str, host: str, port: int) -> None:
    target = check_url(url, DEFAULT)
    assert (target.host, target.port) == (host, port)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("::ffff:10.0.0.1", "embeds 10.0.0.1"),
        ("64:ff9b::7f00:1", "embeds 127.0.0.1"),
        ("0.0.0.0", "unspecified"),
    ],
)
def test_refusal_names_the_kind(address: str, kind: str) -> None:
    why = DEFAULT.refusal(address)
    assert why is not None and kind in why


def test_first_allowed_keeps_the_allowed_and_says_why_the_first_refused_was() -> None:
    allowed, reason = DEFAULT.first_allowed(["10.0.0.1", "93.184.216.34", "127.0.0.1"])
    assert allowed == ["93.184.216.34"]
    assert reason is not None and reason.startswith("10.0.0.1")
