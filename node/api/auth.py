"""Who is calling: ``Authorization: Bearer KEY`` mapped to a tenant.

With auth on (the default of ``python -m node run``) every route needs a key
except the probes, the metrics, the OpenAPI document, the console's files
(its HTML, script and stylesheet: the console asks for a key, then sends it
with every call) and the node-to-node wake-up hint (which no tenant sends: with
CLUSTER_KEYS set, it needs the cluster's signature instead, see
``cluster.wake``); the operator routes
(``/v1/cluster``, ``/v1/admin/``, ``/v1/chaos/``) need an admin tenant's key.
A schedule belongs to the tenant of the key that created it, and another
tenant's key gets 404 for it, as if it did not exist.

With auth off (``python -m node dev``, tests) a call acts for the tenant it
names (``tenant`` in the body or query, default ``default``), as before
tenants existed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiohttp import web

from node.errors import Forbidden, Unauthorized
from node.schedule.model import DEFAULT_TENANT
from node.tenants.directory import TenantDirectory

OPEN_ROUTES = frozenset(
    {
        "/",
        "/console.js",
        "/console.css",
        "/healthz",
        "/readyz",
        "/metrics",
        "/v1/openapi.json",
        "/v1/internal/wake",
    }
)
ADMIN_PREFIXES = ("/v1/cluster", "/v1/admin/", "/v1/chaos/")
CALLER: web.RequestKey[Caller] = web.RequestKey("caller")
# What an API key can be (``sk_`` and URL-safe base64): anything else is no
# key, refused without a lookup (aiohttp hands undecodable header bytes over
# as lone surrogates, which no digest can take).
_KEY = re.compile(r"[\x21-\x7e]{1,256}")


@dataclass(frozen=True)
class Caller:
    tenant: str | None  # None: auth off, the call may act for any tenant
    admin: bool

    def scope(self, requested: str | None) -> str:
        """The tenant a call acts for; a key may act only for its own."""
        if self.tenant is None:
            return requested or DEFAULT_TENANT
        if requested is not None and requested != self.tenant:
            raise Forbidden(f"this API key acts for tenant {self.tenant!r} only", "tenant")
        return self.tenant


ANYONE = Caller(tenant=None, admin=True)


async def identify(request: web.Request, directory: TenantDirectory | None) -> Caller:
    """The caller of ``request``; raises 401 or 403. ``directory`` None: auth off."""
    if directory is None:
        return ANYONE
    path = request.path
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if path in OPEN_ROUTES:
        return Caller(tenant=None, admin=False)
    key = key.strip()
    if scheme.lower() != "bearer" or not key:
        raise Unauthorized("send Authorization: Bearer <API key>")
    if not _KEY.fullmatch(key):
        raise Unauthorized("unknown or revoked API key")
    tenant = await directory.authenticate(key)
    if tenant is None:
        raise Unauthorized("unknown or revoked API key")
    if path.startswith(ADMIN_PREFIXES) and not tenant.admin:
        raise Forbidden("this route needs an admin tenant's API key")
    return Caller(tenant=tenant.name, admin=tenant.admin)
