"""Where completion callbacks may go (docs/api.md: Completion callbacks): https to public
addresses only, whatever the spelling of a private one. The verdicts come from the module's own table, so
they are the same on every Python patch release (whose ``is_global`` answers changed).
"""

from __future__ import annotations

import ipaddress

import pytest

from shared.webhooks.targets import RefusedTarget, check_address, check_addresses, check_url

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
    # A trailing dot, and what IDNA/UTS 46 maps to a dot, a digit or a letter.
    "https://169.254.169.254./",
    "https://127.0.0.1./",
    "https://127。0。0。1/",
    "https://１２７.０.０.１/",
    "https://localhost。/",
    "https://ＬＯＣＡＬＨＯＳＴ/",
    # Refused before any rule: two trailing dots, percent-escapes, what IDNA refuses, a bad IPv4 number.
    "https://example.com../",
    "https://%31%32%37.0.0.1/",
    "https://exa%2emple.com/",
    "https://under_score.example.com/",
    "https://1.2.3.08/",
    "https://example.123/",
    "https://4294967296/",
    # IPv6 forms that carry a private IPv4 address.
    "https://[64:ff9b::7f00:1]/",
    "https://[64:ff9b::a9fe:a9fe]/",
    "https://[64:ff9b:1::a9fe:a9fe]/",
    "https://[2002:7f00:1::]/",
    "https://[2002:a9fe:a9fe::1]/",
    "https://[2001:0:7f00:1::fefe:fefe]/",
    "https://[2001:0:808:808::80ff:fffe]/",
    # Outside global unicast: the old IPv4-translated form, unassigned space, beside the NAT64 prefix.
    "https://[::ffff:0:7f00:1]/",
    "https://[::ffff:0:a9fe:a9fe]/",
    "https://[1::]/",
    "https://[4000::1]/",
    "https://[fe00::1]/",
    "https://[64:ff9b::1:0:0]/",
    # What follows a bracketed address can only be a port; port 0 receives nothing.
    "https://[2001:4860:4860::8888]evil.com/",
    "https://example.com:0/",
    # Characters no URI holds (RFC 3986, section 2): a U+0000 would not even reach the database.
    "https://example.com/a\x00b",
    "https://example.com/a b",
    "https://example.com/\thook",
    "https://example.com/hook\n",
    "https://example.com/\x7f",
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
        ("https://[64:ff9b::808:808]/", "64:ff9b::808:808", 443),
        ("https://[2002:808:808::1]/", "2002:808:808::1", 443),
        ("https://[2001:0:808:808::fefe:fefe]/", "2001:0:808:808::fefe:fefe", 443),
    ],
)
def test_accepted(url: str, host: str, port: int) -> None:
    target = check_url(url, allow_private=False)
    assert (target.url, target.host, target.port) == (url, host, port)


@pytest.mark.parametrize(
    ("url", "host", "request_url"),
    [
        ("https://Bücher.Example./hook?x=1", "xn--bcher-kva.example", "https://xn--bcher-kva.example/hook?x=1"),
        ("https://example.com.:8443/", "example.com", "https://example.com:8443/"),
        ("https://ｅｘａｍｐｌｅ。ｃｏｍ/", "example.com", "https://example.com/"),
        ("https://0x08.0x08.2056/", "8.8.8.8", "https://8.8.8.8/"),
        ("https://134744072./", "8.8.8.8", "https://8.8.8.8/"),
        ("https://[2001:4860:4860:0:0:0:0:8888]/", "2001:4860:4860::8888", "https://[2001:4860:4860::8888]/"),
    ],
)
def test_a_host_is_checked_and_asked_for_as_a_resolver_reads_it(url: str, host: str, request_url: str) -> None:
    target = check_url(url, allow_private=False)
    assert (target.host, target.request_url) == (host, request_url)


# One address of every refused block, and IPv6 forms judged by the IPv4 address they carry.
REFUSED_ADDRESSES = [
    # IPv4: this network, private, CGNAT, loopback, link-local, IETF, TEST-NETs, 6to4 relay, benchmarking,
    # multicast, reserved, broadcast.
    "0.1.2.3", "10.0.0.1", "100.64.0.1", "127.0.0.1", "169.254.169.254", "172.31.255.255", "192.0.0.9",
    "192.0.2.1", "192.88.99.1", "192.168.0.1", "198.19.0.1", "198.51.100.1", "203.0.113.1", "224.0.0.1",
    "240.0.0.1", "255.255.255.255",
    # IPv6: unspecified, loopback, IPv4-compatible and -mapped, local-use NAT64, discard, dummy, IETF,
    # benchmarking, ORCHID, documentation, SRv6, unique-local, link-local, site-local, multicast.
    "::", "::1", "::8.8.8.8", "::ffff:8.8.8.8", "64:ff9b:1::808:808", "100::1", "100:0:0:1::1", "2001:1::1",
    "2001:2::1", "2001:10::1", "2001:db8::1", "3fff::1", "5f00::1", "fc00::1", "fd00:ec2::254", "fe80::1",
    "fec0::1", "ff02::1",
    # Judged by the IPv4 address they carry: NAT64, 6to4, Teredo's server, Teredo's client (RFC 4380's
    # example, whose client is in 192.0.2.0/24).
    "64:ff9b::7f00:1", "64:ff9b::a00:1", "2002:7f00:1::", "2002:c0a8:101::1", "2001:0:7f00:1::fefe:fefe",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",
]  # fmt: skip


@pytest.mark.parametrize("address", REFUSED_ADDRESSES)
def test_the_table_refuses(address: str) -> None:
    with pytest.raises(RefusedTarget):
        check_address(ipaddress.ip_address(address), allow_private=False)


@pytest.mark.parametrize("address", ["8.8.8.8", "192.31.196.1", "2606:4700::1111", "64:ff9b::808:808"])
def test_the_table_accepts(address: str) -> None:
    check_address(ipaddress.ip_address(address), allow_private=False)


def test_the_development_setting_allows_http_and_private_addresses() -> None:
    target = check_url("http://127.0.0.1:9999/hook", allow_private=True)
    assert (target.scheme, target.host, target.port) == ("http", "127.0.0.1", 9999)
    assert check_url("http://localhost.:9999/", allow_private=True).host == "localhost"
    for refused in ("https://user:pw@127.0.0.1/", "http://127.0.0.1../", "http://under_score.test/"):
        with pytest.raises(RefusedTarget):
            check_url(refused, allow_private=True)


def test_a_name_is_refused_whole_when_any_of_its_addresses_is_private() -> None:
    assert str(check_addresses(["93.184.216.34", "2606:2800:220:1::1"], allow_private=False)) == "93.184.216.34"
    for addresses in (["93.184.216.34", "10.0.0.1"], ["::ffff:127.0.0.1"], []):
        with pytest.raises(RefusedTarget):
            check_addresses(addresses, allow_private=False)
