"""Settings refused at start-up rather than at the first use (docs/reference/settings.md: Settings)."""

from __future__ import annotations

import pydantic
import pytest

from shared.settings import Settings


@pytest.mark.parametrize(
    "proxy_url",
    [
        "https://proxy.internal:3128",
        "socks5://proxy.internal:1080",
        "http://ho st:80",
        "http://ho%73t:80",
        "http://host:80?x=1",
        "http://host:80#x",
        "http://host:80/path",
        "http://host:0",
        "http://host:99999",
        "http://:3128",
        "http://[::1:3128",
    ],
)
def test_a_proxy_url_that_cannot_be_one_is_refused(proxy_url: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="CHATEXPORT_WEBHOOK_PROXY_URL"):
        Settings(webhook_proxy_url=proxy_url)


@pytest.mark.parametrize(
    "proxy_url",
    ["http://proxy.internal:3128", "http://u:p@10.1.2.3:3128/", "http://[::1]:3128", "http://egress."],
)
def test_a_proxy_url_is_accepted(proxy_url: str) -> None:
    settings = Settings(webhook_proxy_url=proxy_url)
    assert settings.webhook_proxy_url is not None
    assert settings.webhook_proxy_url.get_secret_value() == proxy_url
