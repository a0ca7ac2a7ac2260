"""Where a completion callback may be sent: checked when the export is submitted and again, on the
resolved addresses, right before each delivery, so that a name that later resolves elsewhere (DNS
rebinding) is refused too (README: API reference, Completion callbacks).

Refused unless ``allow_private`` (a setting for development and tests only): any scheme but https, a URL
with user information, and any host that is or resolves to an address that is not globally routable:
loopback, private, link-local (cloud metadata included), CGNAT, unique-local, multicast, unspecified and
``0.0.0.0/8``, IPv4-mapped and IPv4-compatible IPv6 forms of those, in any spelling a resolver accepts
(``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``[::ffff:127.0.0.1]``).
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

# Long enough for any real callback URL, short enough that a submit with it and 100 senders stays far
# below CHATEXPORT_EXPORT_REQUEST_MAX_BYTES.
MAX_URL_LENGTH = 900
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class RefusedTarget(ValueError):
    """The URL may not receive callbacks; ``str()`` says why, without quoting the URL's query."""


@dataclass(frozen=True)
class Target:
    """A checked callback URL: its ``scheme``, ``host`` as written (an IP literal already checked) and
    ``port``.
    """

    url: str
    scheme: str
    host: str
    port: int


def check_url(url: str, *, allow_private: bool) -> Target:
    """The callback target of ``url``; raises ``RefusedTarget``. A host name is checked for what it names
    literally here; its addresses are checked by ``check_addresses`` at each delivery.
    """
    if len(url) > MAX_URL_LENGTH:
        raise RefusedTarget(f"longer than {MAX_URL_LENGTH} characters")
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise RefusedTarget("not a URL") from None
    _check_form(parts, allow_private=allow_private)
    host = parts.hostname or ""
    address = literal_address(host)
    if address is not None:
        check_address(address, allow_private=allow_private)
    elif not allow_private and _names_this_machine(host):
        raise RefusedTarget("the host names this machine or a local network")
    return Target(url=url, scheme=parts.scheme, host=host, port=port)


def _check_form(parts: SplitResult, *, allow_private: bool) -> None:
    if parts.scheme not in (("https", "http") if allow_private else ("https",)):
        raise RefusedTarget("only https URLs receive callbacks")
    if parts.username is not None or parts.password is not None:
        raise RefusedTarget("a URL with user information is refused")
    if not parts.hostname:
        raise RefusedTarget("the URL has no host")


def _names_this_machine(host: str) -> bool:
    name = host.rstrip(".").lower()
    return name == "localhost" or name.endswith((".localhost", ".local", ".internal", ".localdomain"))


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` spells, in any form a resolver accepts (dotted, integer, octal, hex, short
    IPv4, IPv6 without brackets), or None for a name. A zone index (``fe80::1%eth0``) is an address too.
    """
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    if host and all(character in "0123456789abcdefxABCDEFX." for character in host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def check_address(address: IPAddress, *, allow_private: bool) -> None:
    """Raise ``RefusedTarget`` unless ``address`` is globally routable (or ``allow_private``)."""
    if allow_private:
        return
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or _ipv4_compatible(address)
        if embedded is not None:
            check_address(embedded, allow_private=False)
    if not address.is_global or address.is_multicast:
        raise RefusedTarget("the address is not a public internet address")


def _ipv4_compatible(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    # ::a.b.c.d, deprecated but still understood by some stacks.
    if int(address) >> 32 == 0 and int(address) > 1:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def check_addresses(addresses: list[str], *, allow_private: bool) -> IPAddress:
    """The first of a name's resolved ``addresses``, once every one of them passed ``check_address``: a
    name with one private address is refused whole, so no retry can land on it. Raises ``RefusedTarget``.
    """
    if not addresses:
        raise RefusedTarget("the host name does not resolve")
    checked = [ipaddress.ip_address(address.split("%", 1)[0]) for address in addresses]
    for address in checked:
        check_address(address, allow_private=allow_private)
    return checked[0]
