"""Credentials in a URL never reach a log line or an error message.

:func:`redact_url` masks one URL; :func:`redact_urls` masks every URL in a text that may hold
some (a config value echoed in an error, a library's exception). As Go's ``url.URL.Redacted``
(what the Collector and Prometheus print), the password becomes ``xxxxx``; a user name alone
(``https://TOKEN@host``, as some services take a token) is masked too.
"""

from __future__ import annotations

import re

MASK = "xxxxx"

# scheme://userinfo@ : the userinfo runs to the last "@" before the host (a password may hold
# one), never past the authority (/ ? #), whitespace or a quote around a repr'd value.
_USERINFO = re.compile(r"\b(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#'\"]*)@")


def _masked(match: re.Match[str]) -> str:
    user, colon, _ = match["userinfo"].partition(":")
    return f"{match['scheme']}{f'{user}:{MASK}' if colon else MASK}@"


def redact_urls(text: str) -> str:
    """``text`` with the credentials of every URL in it masked."""
    return _USERINFO.sub(_masked, text) if "@" in text else text


def redact_url(url: str) -> str:
    """``url`` with its credentials masked: ``http://user:xxxxx@host/metrics``."""
    return redact_urls(url)
