"""Where completion callbacks may go (README: API reference, Completion callbacks): https to public
addresses only, whatever the spelling of a private one.
"""

from __future__ import annotations

import pytest

from shared.webhooks.targets import RefusedTarget, check_addresses, check_url

REFUSED = [
    "http://example.com/hook",
    "ftp://example.com/hook",
    "https://user:secret@example.com/hook",
    "https:///hook",
    "https://127.0.0.1/",
    "https://2130706433/",
    "https://0x7f.1/",
    "https://0177.0.0.1/",
    "https://127.1/",
    "https://0/",
    "https://0.1.2.3/",
    "https://10.1.2.3/",
    "https://172.16.0.1/",
    "https://192.168.1.1:8443/",
    "https://100.64.0.1/",
    "https://169.254.169.254/latest/meta-data",
    "https://224.0.0.1/",
    "https://[::1]/",
    "https://[::]/",
    "https://[::ffff:127.0.0.1]/",
    "https://[::ffff:7f00:1]/",
    "https://[::ffff:10.0.0.1]/",
    "https://[::127.0.0.1]/",
    "https://[fd00:ec2::254]/",
    "https://[fe80::1%25eth0]/",
    "https://localhost/",
    "https://LOCALHOST./",
    "https://a.localhost/",
    "https://metadata.google.internal/",
    "https://" + "a" * 2050 + ".example/",
]


@pytest.mark.parametrize("url", REFUSED)
def test_refused(url: str) -> None:
    with pytest.raises(RefusedTarget):
        check_url(url, allow_private=False)


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("https://example.com/hook?x=1", "example.com", 443),
        ("https://8.8.8.8:8443/", "8.8.8.8", 8443),
        ("https://[2001:4860:4860::8888]/", "2001:4860:4860::8888", 443),
    ],
)
def test_accepted(url: str, host: str, port: int) -> None:
    target = check_url(url, allow_private=False)
    assert (target.url, target.host, target.port) == (url, host, port)


def test_the_development_setting_allows_http_and_private_addresses() -> None:
    target = check_url("http://127.0.0.1:9999/hook", allow_private=True)
    assert (target.scheme, target.host, target.port) == ("http", "127.0.0.1", 9999)
    with pytest.raises(RefusedTarget):
        check_url("https://user:pw@127.0.0.1/", allow_private=True)


def test_a_name_is_refused_whole_when_any_of_its_addresses_is_private() -> None:
    assert str(check_addresses(["93.184.216.34", "2606:2800:220:1::1"], allow_private=False)) == "93.184.216.34"
    for addresses in (["93.184.216.34", "10.0.0.1"], ["::ffff:127.0.0.1"], []):
        with pytest.raises(RefusedTarget):
            check_addresses(addresses, allow_private=False)
