"""The SuperLink's front door for the nodes: the Fleet API only.

Flower 1.42 serves its Fleet API (the SuperNodes), Control API (``flwr run``, ``ls``, ``stop``,
``supernode register/unregister``) and Runtime API on ONE HTTP port, and Flower OSS has no user
authentication on the Control API: anyone who reaches the port with the CA certificate can stop
runs, register keys and unregister nodes.  ``fedsonmf flower superlink`` therefore binds the
SuperLink to the coordinator host's loopback (``127.0.0.1:CONTROL_PORT``) and puts this proxy on
the public address: it forwards only ``/v1/fleet/*`` (and ``GET /health``) to the SuperLink and
answers everything else with 403.  The coordinator reaches the Control API on that host, or from
elsewhere through an SSH tunnel (docs/flower.md).

Run as ``python -m fedsonmf.federation.flower.fleetproxy --listen HOST:PORT --upstream
https://127.0.0.1:PORT [--ca ca.crt --certfile server.pem --keyfile server.key]``.  It is built
from Flower's own dependencies (uvicorn, Starlette, httpx); request bodies and headers (the
SuperNodes' signed authentication headers) pass unchanged.
"""

from __future__ import annotations

import argparse
import ssl
import sys

#: the path prefix of Flower 1.42's Fleet API (``flwr/superlink/routers/fleet/router.py``)
FLEET_PREFIX = "/v1/fleet/"
#: headers that belong to one connection, not to the request (RFC 9110 §7.6.1), and the host
_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host",
        "content-length"}
REFUSAL = ("fedsonmf: this address serves only the Fleet API; the Control API is reachable only on the "
           "SuperLink host (127.0.0.1), e.g. through an SSH tunnel")


def allowed(method: str, path: str) -> bool:
    """Whether the proxy forwards ``method path``: the Fleet API, and the health probe."""
    return path.startswith(FLEET_PREFIX) or (method in ("GET", "HEAD") and path == "/health")


def make_app(upstream: str, ca_cert: str | None = None):
    """The Starlette app forwarding the Fleet API to ``upstream`` (``https://127.0.0.1:PORT``,
    its certificate checked against ``ca_cert``; or ``http://`` for an insecure deployment)."""
    import contextlib

    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_cert) if ca_cert else True
    state: dict = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        async with httpx.AsyncClient(base_url=upstream, verify=verify, timeout=httpx.Timeout(300.0, connect=10.0),
                                     limits=httpx.Limits(max_connections=256)) as client:
            state["client"] = client
            yield

    async def forward(request: Request) -> Response:
        path = request.url.path
        if not allowed(request.method, path):
            return PlainTextResponse(REFUSAL, status_code=403)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        try:
            resp = await state["client"].request(request.method, path, params=request.url.query or None,
                                                 content=await request.body(), headers=headers)
        except httpx.HTTPError as exc:
            return PlainTextResponse(f"fedsonmf: the SuperLink is not reachable ({type(exc).__name__})",
                                     status_code=502)
        out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP | {"content-encoding"}}
        return Response(resp.content, status_code=resp.status_code, headers=out)

    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)], lifespan=lifespan)


def argv(listen: str, upstream: str, tls: tuple | None) -> list[str]:
    """The command line of a proxy on ``listen`` (HOST:PORT) for ``upstream``; ``tls`` =
    (ca.crt, server.pem, server.key) or None (plain HTTP)."""
    args = [sys.executable, "-m", "fedsonmf.federation.flower.fleetproxy", "--listen", listen, "--upstream", upstream]
    if tls is not None:
        args += ["--ca", str(tls[0]), "--certfile", str(tls[1]), "--keyfile", str(tls[2])]
    return args


def main(args=None) -> int:
    ap = argparse.ArgumentParser(prog="fedsonmf-fleetproxy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", required=True, help="HOST:PORT the nodes dial.")
    ap.add_argument("--upstream", required=True, help="The SuperLink's URL on loopback.")
    ap.add_argument("--ca", default=None)
    ap.add_argument("--certfile", default=None)
    ap.add_argument("--keyfile", default=None)
    ns = ap.parse_args(args)
    import uvicorn

    host, _, port = ns.listen.rpartition(":")
    uvicorn.run(make_app(ns.upstream, ns.ca), host=host.strip("[]"), port=int(port), log_level="warning",
                access_log=False, ssl_certfile=ns.certfile, ssl_keyfile=ns.keyfile, workers=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
