"""When a provider renews the token it handed to a foreign cluster, and which earlier tokens it revokes:
the pure rules behind activities/credentials.py and the push in activities/peering.py.

A token is renewed at half its life, on a push (no wake of its own): with the default 10-minute period a
token of 3,600 s is renewed after 30 to 40 minutes, long before it expires. It is renewed at once when the
foreign cluster's Secret no longer holds it (deleted, or written by someone else: its resourceVersion
moved), so that the Secret always holds a valid token (Liqo issue 277). Each token is bound to a Secret
of its generation; when generation N is issued, the anchors before N-1 go, so that exactly the current
token and the previous one work: a holder that has not reloaded its file yet keeps working.

The token a consumer mints for a provider at `tidepool peer` (kube/identity.py) follows the same rule
(`renewal_due`), renewed by the provider itself with that token; its life is read from the token's own
claims, since nothing else on the provider records it. Once it has expired nothing can renew it but
`tidepool peer` again (`token_expired`)."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from models.names import (
    CREDENTIALS_SECRET_VERSION_ANNOTATION,
    TOKEN_EXPIRES_AT_ANNOTATION,
    TOKEN_GENERATION_ANNOTATION,
    TOKEN_ISSUED_AT_ANNOTATION,
)
from models.times import format_rfc3339, parse_rfc3339

# The API server refuses a TokenRequest for less (its minimum expirationSeconds).
MIN_TOKEN_LIFETIME_SECONDS = 600

RenewalReason = Literal["NoToken", "HalfLife", "ExpiresBeforeNextPush", "SecretMissing", "SecretChanged"]
# How long a holder may take to pick a renewed token up: a kubelet updates a mounted Secret within about a
# minute. A token renewed with less than one period and this left would expire before the next push's.
RELOAD_MARGIN = timedelta(minutes=2)


@dataclass(frozen=True)
class TokenGeneration:
    """The token a foreign cluster holds, as the provider remembers it (annotations of the foreign namespace)."""

    number: int
    issued_at: datetime
    expires_at: datetime
    secret_version: str  # resourceVersion of the foreign cluster's Secret right after the token was written

    @classmethod
    def from_annotations(cls, annotations: dict[str, str] | None) -> TokenGeneration | None:
        """None when the namespace has no (or an unreadable) record: a push then issues a token."""
        a = annotations or {}
        issued_at, expires_at = parse_rfc3339(a.get(TOKEN_ISSUED_AT_ANNOTATION)), parse_rfc3339(a.get(TOKEN_EXPIRES_AT_ANNOTATION))
        try:
            number, secret_version = int(a[TOKEN_GENERATION_ANNOTATION]), a[CREDENTIALS_SECRET_VERSION_ANNOTATION]
        except (KeyError, ValueError):
            return None
        if issued_at is None or expires_at is None:
            return None
        return cls(number=number, issued_at=issued_at, expires_at=expires_at, secret_version=secret_version)

    def to_annotations(self) -> dict[str, str]:
        return {
            TOKEN_GENERATION_ANNOTATION: str(self.number),
            TOKEN_ISSUED_AT_ANNOTATION: format_rfc3339(self.issued_at),
            TOKEN_EXPIRES_AT_ANNOTATION: format_rfc3339(self.expires_at),
            CREDENTIALS_SECRET_VERSION_ANNOTATION: self.secret_version,
        }

    @property
    def life(self) -> TokenLife:
        return TokenLife(issued_at=self.issued_at, expires_at=self.expires_at)


@dataclass(frozen=True)
class TokenLife:
    """When a token was issued and when it expires."""

    issued_at: datetime
    expires_at: datetime
    subject: str | None = None  # the `sub` claim: whose token it is

    @classmethod
    def of_jwt(cls, token: str) -> TokenLife | None:
        """The `iat` and `exp` claims of a ServiceAccount token (a JWT), read without verifying it: the
        holder asks only when to renew what it holds. None for a token without them (not a JWT: a
        credential tidepool did not mint, which it neither renews nor declares expired)."""
        parts = token.split(".")
        if len(parts) != 3:
            return None
        try:
            claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
            subject = claims.get("sub")
            return cls(issued_at=datetime.fromtimestamp(int(claims["iat"]), UTC),
                       expires_at=datetime.fromtimestamp(int(claims["exp"]), UTC),
                       subject=subject if isinstance(subject, str) else None)  # fmt: skip
        except (binascii.Error, UnicodeDecodeError, ValueError, TypeError, KeyError):
            return None

    @property
    def lifetime_seconds(self) -> int:
        return int((self.expires_at - self.issued_at).total_seconds())

    def half_life(self) -> datetime:
        return self.issued_at + (self.expires_at - self.issued_at) / 2


def renewal_due(life: TokenLife, *, now: datetime, period: timedelta) -> Literal["HalfLife", "ExpiresBeforeNextPush"] | None:
    """Whether a push renews a token that still works: at half its life, or when it would expire before
    the next push (`period` away at most) with time left for its holder to reload."""
    if now >= life.half_life():
        return "HalfLife"
    if now + period + RELOAD_MARGIN >= life.expires_at:
        return "ExpiresBeforeNextPush"
    return None


def renewal_deadline(life: TokenLife, *, period: timedelta) -> datetime:
    """The first moment `renewal_due` says yes: until then a push need not look at the token."""
    return min(life.half_life(), life.expires_at - period - RELOAD_MARGIN)


def access_verified_until(current: TokenGeneration, *, checked_at: datetime, period: timedelta) -> datetime:
    """Until when a push may skip re-ensuring the foreign cluster's access (its RBAC objects at home, the
    token and the Secret holding it) after a push that ensured them at `checked_at`: one period at most,
    so that access put right by the periodic push is never older than that however often pushes come
    early, and never past the token's renewal."""
    return min(checked_at + period, renewal_deadline(current.life, period=period))


def token_expired(life: TokenLife, *, now: datetime) -> bool:
    """A token past its `exp` is refused: only a holder of other credentials can issue the next one."""
    return now >= life.expires_at


def renewal_reason(
    current: TokenGeneration | None, *, held_version: str | None, now: datetime, period: timedelta
) -> RenewalReason | None:
    """Why a push must issue a new token, or None to leave the foreign cluster's Secret as it is.
    `held_version` is the resourceVersion of that Secret now (None: it does not exist); `period` is the
    advertisement period: the next push may be that far away (an early push moves the schedule), so a
    token that would expire before then, with time for its holder to reload, is renewed now."""
    if current is None:
        return "NoToken"
    if held_version is None:
        return "SecretMissing"
    if held_version != current.secret_version:
        return "SecretChanged"
    return renewal_due(current.life, now=now, period=period)


# Generations before the previous one that a rotation still deletes, in case an earlier rotation stopped
# before its revocation. Older ones have expired anyway: a token lives at most two renewals.
REVOKE_LOOKBACK = 3


def anchors_to_revoke(*, current: int) -> list[int]:
    """The anchor Secrets to delete once `current` is issued: those before the previous generation. By
    name, never by listing: the anchors live in the namespace whose holder may write Secrets, so a label
    it could edit must not decide what is revoked."""
    return list(range(max(1, current - 1 - REVOKE_LOOKBACK), current - 1))


def token_lifetime_seconds(configured: int) -> int:
    return max(configured, MIN_TOKEN_LIFETIME_SECONDS)
