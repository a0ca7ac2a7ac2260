"""Where a completion callback may be sent: checked when the export is submitted and again right before each
delivery, on the resolved addresses, so that a name that later resolves elsewhere (DNS rebinding) is refused
too (docs/api.md: Completion callbacks).

Refused unless ``allow_private`` (a setting for development and tests only): any scheme but https, a URL
with user information, a name of this machine or its network (``localhost``, ``*.local``, ...), and any
address in one of the networks IANA's special-purpose registries do not call globally reachable, or in the
multicast and reserved space, or an IPv6 address outside global unicast, whatever its spelling; an IPv6
address that carries an IPv4 one is judged by that one too. The table is ours rather than ``ipaddress``'s
``is_global``, whose answers changed between Python 3.11 patch releases.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

import idna

# Long enough for any real callback URL, short enough that a submit with it and 100 senders stays far
# below CHATEXPORT_EXPORT_REQUEST_MAX_BYTES.
MAX_URL_LENGTH = 900
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_DEFAULT_PORTS = {"https": 443, "http": 80}
_LOCAL_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain")
# Python's urlsplit reads "[::1]evil" as the host ::1; browsers and resolvers refuse it, and so do we.
_BRACKETED_AUTHORITY = re.compile(r"\[[^\]]*\](:[0-9]*)?")

_TEREDO = ipaddress.IPv6Network("2001::/32")
# IANA IPv4 Special-Purpose Address Registry (blocks not globally reachable, whole even where the registry
# lists one anycast address inside as reachable: no receiver lives there), the deprecated 6to4 relay anycast,
# multicast and the reserved 240.0.0.0/4 (limited broadcast included).
_REFUSED_V4 = tuple(
    ipaddress.IPv4Network(block)
    for block in (
        "0.0.0.0/8",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.2.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "224.0.0.0/4",
        "240.0.0.0/4",
    )
)
# IANA IPv6 Special-Purpose Address Registry likewise, with the IPv4-compatible ::/96 (deprecated, RFC 4291),
# site-local fec0::/10 (deprecated, RFC 3879) and multicast. Of 2001::/23 only Teredo is left out: it is
# judged by the two IPv4 addresses it carries. 6to4 (2002::/16) and NAT64's 64:ff9b::/96 are judged so too.
_REFUSED_V6 = (
    *(
        ipaddress.IPv6Network(block)
        for block in (
            "::/96",
            "::ffff:0:0/96",
            "64:ff9b:1::/48",
            "100::/64",
            "100:0:0:1::/64",
            "2001:db8::/32",
            "3fff::/20",
            "5f00::/16",
            "fc00::/7",
            "fe80::/10",
            "fec0::/10",
            "ff00::/8",
        )
    ),
    *ipaddress.IPv6Network("2001::/23").address_exclude(_TEREDO),
)
# Outside these every IPv6 address is refused: global unicast (RFC 4291; the rest is unassigned or special)
# and NAT64's well-known prefix, which is judged by the IPv4 address it carries.
_ROUTABLE_V6 = tuple(ipaddress.IPv6Network(block) for block in ("2000::/3", "64:ff9b::/96"))
# Where the low 32 bits are an IPv4 address: IPv4-compatible (RFC 4291), IPv4-mapped (RFC 4291) and NAT64's
# well-known and local-use prefixes in their /96 form (RFC 6052, RFC 8215).
_LOW_32_EMBEDDINGS = tuple(
    ipaddress.IPv6Network(block) for block in ("::/96", "::ffff:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48")
)


class RefusedTarget(ValueError):
    """The URL may not receive callbacks; ``str()`` says why, without quoting the URL's query."""


@dataclass(frozen=True)
class Target:
    """A checked callback URL: its ``scheme``; ``host`` normalised by ``normalise_host`` (an ASCII name
    without its trailing dot, or an address's text); ``address`` when the host is an address (already
    checked); ``port``; and ``request_url``, the URL with that host, which is what a delivery asks for.
    """

    url: str
    scheme: str
    host: str
    address: IPAddress | None
    port: int
    request_url: str


def check_url(url: str, *, allow_private: bool) -> Target:
    """The callback target of ``url``, its host read by ``normalise_host``: the one check of the submit and
    of each delivery. Raises ``RefusedTarget``. A name is checked for what it names literally here; its
    addresses are checked by ``check_addresses`` at each delivery.
    """
    if len(url) > MAX_URL_LENGTH:
        raise RefusedTarget(f"longer than {MAX_URL_LENGTH} characters")
    # RFC 3986, section 2: a URI holds no space or control character (urlsplit would drop a tab unseen).
    if any(char <= " " or char == "\x7f" for char in url):
        raise RefusedTarget("a URL holds no space or control character")
    try:
        parts = urlsplit(url)
        port = _DEFAULT_PORTS.get(parts.scheme, 0) if parts.port is None else parts.port
    except ValueError:
        raise RefusedTarget("not a URL") from None
    _check_form(parts, allow_private=allow_private)
    host = normalise_host(parts.hostname or "", bracketed=parts.netloc.startswith("["))
    if isinstance(host, str):
        if not allow_private and _names_this_machine(host):
            raise RefusedTarget("the host names this machine or a local network")
    else:
        check_address(host, allow_private=allow_private)
    address = None if isinstance(host, str) else host
    request_url = _with_host(parts, str(host))
    return Target(url=url, scheme=parts.scheme, host=str(host), address=address, port=port, request_url=request_url)


def _with_host(parts: SplitResult, host: str) -> str:
    authority = f"[{host}]" if ":" in host else host
    return parts._replace(netloc=authority if parts.port is None else f"{authority}:{parts.port}").geturl()


def _check_form(parts: SplitResult, *, allow_private: bool) -> None:
    if parts.scheme not in (("https", "http") if allow_private else ("https",)):
        raise RefusedTarget("only https URLs receive callbacks")
    if parts.username is not None or parts.password is not None:
        raise RefusedTarget("a URL with user information is refused")
    if not parts.hostname:
        raise RefusedTarget("the URL has no host")
    if parts.netloc.startswith("[") and not _BRACKETED_AUTHORITY.fullmatch(parts.netloc):
        raise RefusedTarget("only a port may follow a bracketed address")
    if parts.port == 0:
        raise RefusedTarget("port 0 receives nothing")


def normalise_host(host: str, *, bracketed: bool) -> str | IPAddress:
    """What a resolver makes of a URL's ``host`` (lower-cased, brackets removed; ``bracketed`` when the URL
    wrote it in brackets): an address, or an ASCII name without its trailing dot. Raises ``RefusedTarget``.

    In order (docs/api.md: Completion callbacks): percent-escapes are refused; a bracketed host is
    an IPv6 address; any other is mapped by IDNA/UTS 46 (``127。0。0。1`` is ``127.0.0.1``), refused if that
    fails; one trailing dot is removed (two are refused); a host whose last label is a number is an IPv4
    address in any spelling (``parse_ipv4``), else it is a name.
    """
    if "%" in host:
        raise RefusedTarget("the host holds percent-escapes")
    if bracketed:
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            raise RefusedTarget("the host is not an IPv6 address") from None
    try:
        mapped = idna.uts46_remap(host, std3_rules=False, transitional=False)
        if mapped.endswith(".."):
            raise RefusedTarget("the host ends with more than one dot")
        name = idna.encode(mapped.removesuffix("."), strict=True).decode("ascii")
    except UnicodeError:  # idna.IDNAError and its kinds
        raise RefusedTarget("the host is not a valid domain name (IDNA)") from None
    return parse_ipv4(name) or name


def parse_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address ``host`` spells when its last label is a number, in the forms resolvers and
    browsers accept (dotted, integer, octal, hex, short: ``2130706433``, ``0x7f.1``, ``0177.0.0.1``); None
    when it ends in a name. A host that ends in a number but is no valid address is refused
    (``RefusedTarget``). The rules of the WHATWG URL Standard's IPv4 parser, so that no C library's
    ``inet_aton`` decides.
    """
    labels = host.split(".")
    if not (labels[-1].isascii() and labels[-1].isdigit()) and _ipv4_number(labels[-1]) is None:
        return None
    numbers = [_ipv4_number(label) for label in labels]
    if len(numbers) > 4 or any(number is None for number in numbers):
        raise RefusedTarget("the host ends in a number but is not an IPv4 address")
    *head, last = [number for number in numbers if number is not None]
    if any(number > 255 for number in head) or last >= 256 ** (4 - len(head)):
        raise RefusedTarget("the host ends in a number but is not an IPv4 address")
    return ipaddress.IPv4Address(sum(number << 8 * (3 - index) for index, number in enumerate(head)) + last)


def _ipv4_number(label: str) -> int | None:
    # 0x... is hex, a leading 0 octal, else decimal; an empty number after the prefix is 0.
    digits, base = (label[2:], 16) if label[:2].lower() == "0x" else (label[1:], 8) if label[:1] == "0" else (label, 10)
    allowed = "0123456789abcdef"[:base]
    if not label or any(character not in allowed for character in digits.lower()):
        return None
    return int(digits, base) if digits else 0


def _names_this_machine(name: str) -> bool:
    return name == "localhost" or name.endswith(_LOCAL_SUFFIXES)


def check_address(address: IPAddress, *, allow_private: bool) -> None:
    """Raise ``RefusedTarget`` when ``address``, or an IPv4 address it carries (``embedded_ipv4``), is in a
    refused network (this module's tables, from IANA's special-purpose registries); nothing when
    ``allow_private``.
    """
    if allow_private:
        return
    if _refused(address):
        raise RefusedTarget("the address is not a public internet address")
    if any(_refused(embedded) for embedded in embedded_ipv4(address)):
        raise RefusedTarget("the address carries an IPv4 address that is not a public internet address")


def _refused(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv4Address):
        return any(address in network for network in _REFUSED_V4)
    outside = not any(address in network for network in _ROUTABLE_V6)
    return outside or any(address in network for network in _REFUSED_V6)


def embedded_ipv4(address: IPAddress) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 ``address`` carries: Teredo's server and client (RFC 4380), 6to4's
    (RFC 3056), and the low 32 bits of the IPv4-mapped, IPv4-compatible and NAT64 forms; none otherwise.
    """
    if isinstance(address, ipaddress.IPv4Address):
        return ()
    if address.teredo is not None:
        return address.teredo
    if address.sixtofour is not None:
        return (address.sixtofour,)
    if any(address in network for network in _LOW_32_EMBEDDINGS):
        return (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF),)
    return ()


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
