"""Deployment security: a per-deployment TLS CA, SuperNode key pairs, key-file
checks and the partition -> node pins.

What Flower 1.42 (OSS) gives and what this module adds:

* **TLS**: the SuperLink serves its Fleet, Control and ServerAppIo APIs on one
  HTTPS port (``--ssl-ca-certfile/--ssl-certfile/--ssl-keyfile``); nodes and the
  ``flwr`` CLI verify its certificate against a CA (``--root-certificates``,
  ``root-certificates`` in ``config.toml``).  :func:`make_tls` creates a fresh CA
  and a server certificate for the given host addresses.  *Our choice*: the CA's
  private key is never written to disk — it signs the one server certificate and
  is dropped, so nobody (not even the operator) can mint a second certificate the
  nodes would trust; a new server certificate means a new CA.
* **SuperNode authentication** (``--enable-supernode-auth``): only nodes whose
  public key was registered (``flwr supernode register``) can connect.  Flower
  accepts NIST-curve ECDSA keys only (Ed25519 is refused by ``register`` and by
  ``flower-supernode``), private keys in OpenSSH format; :func:`make_node_key`
  writes a P-384 pair, the private key created 0600.
* **Pins** (ours): the SuperLink gives each registered key a node id; the
  launcher writes ``{partition: (node id, key fingerprint)}`` to a pins file
  (0600, :func:`write_pins`) and names it in its own run config
  (``node-pins``); the ServerApp's handshake refuses any node that claims a
  view not pinned to it and any unknown node (:func:`check_pin`).

  Trade-off (our choice): the pins are as trustworthy as the run config that
  names the file and the file itself.  Flower OSS has no Control API
  authentication, so anyone who reaches the port can submit *another* run with
  no pins (or another file); they cannot change the run config of ours, and
  they cannot write the pins file (on the SuperLink host, owned by the launcher,
  0600 — :func:`read_pins` refuses a file that is group/world-writable or owned by
  another user).  A pins file of one deployment is useless for another: its
  node ids exist only in the SuperLink that issued them.  Stopping other apps
  from running at all is the node-side gate's job, not the pins'.  A restarted node
  gets a new key; the old node id is kept in the file as *retired* (ignored by the
  handshake while the SuperLink still lists the dead node as online).
* **Commands**: :func:`superlink_args` / :func:`supernode_args` / :func:`node_config`
  are the exact daemon flags the launcher and ``fedsonmf flower superlink/supernode``
  use; :func:`gate_daemon_args` adds the flags that hand task execution to our gate
  executor (``gate.py``) instead of Flower's SuperExec.

Everything here is plain files and the ``cryptography`` package (a dependency of
``flwr``); no Flower import, so the CLI can create keys without a deployment.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import ipaddress
import json
import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from fedsonmf._io import PrivateFileError, check_private_file, private_dir, write_atomic  # noqa: F401 - re-exported
from fedsonmf.exceptions import FederationError, InputError

__all__ = [
    "TLSFiles", "NodeKey", "Pin", "InsecureDeploymentWarning", "make_tls", "make_node_key", "load_node_key",
    "check_private_file", "key_fingerprint", "write_private", "register_node_key", "register_node_keys",
    "unregister_node", "superlink_args", "supernode_args", "node_config", "write_connection", "write_pins",
    "read_pins", "read_retired", "add_pin", "check_pin", "gate_daemon_args", "superlink_runtime_api",
    "make_signing_key", "load_signing_key", "signing_public_key", "parse_peer_keys", "SIGNING_KEY", "PEERS_KEY",
    "node_signing_key", "read_signing_public", "peers_file", "add_peer_key", "peer_keys_for_run",
]

#: node-config key: the node's Ed25519 signing key for secure aggregation (:func:`make_signing_key`)
SIGNING_KEY = "secagg-signing-key"
#: run-config key: every view's public signing key, pinned by the coordinator's signature on the run
PEERS_KEY = "secagg-peers"


@dataclass(frozen=True)
class TLSFiles:
    """CA certificate (public: give it to every node and submitter), server certificate and key (0600)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path

    def as_tuple(self) -> tuple[str, str, str]:
        """``(ca.crt, server.pem, server.key)`` as the launcher and ``superlink_args`` take them."""
        return str(self.ca_cert), str(self.server_cert), str(self.server_key)


@dataclass(frozen=True)
class NodeKey:
    """A SuperNode's key pair: ``private`` (OpenSSH PEM, 0600), ``public`` (``ecdsa-sha2-nistp384 ...``)."""

    private: Path
    public: Path
    fingerprint: str


@dataclass(frozen=True)
class Pin:
    """The node id the SuperLink gave a view's registered key, and that key's fingerprint."""

    node_id: int
    fingerprint: str


class InsecureDeploymentWarning(UserWarning):
    """A deployment runs without TLS or without SuperNode authentication (an explicit opt-out)."""


# ---------------------------------------------------------------------------------------------- files
def write_private(path, data: bytes) -> Path:
    """Write a key or secret to ``path`` atomically, 0600, in a folder made 0700.

    Never readable by others, not even for an instant: :func:`fedsonmf._io.write_atomic`
    creates its temporary file 0600.

    Parameters
    ----------
    path : path-like
        The file.
    data : bytes
        Its content.

    Returns
    -------
    Path
        ``path``.
    """
    private_dir(Path(path).parent)
    return write_atomic(path, data)


def _write_public(path: Path, data: bytes) -> Path:
    """Public key material (a node's .pub, the CA and server certificates): no secret, but written
    0600 in a 0700 folder like every file of a run (our choice: the operator, who copies it to the
    other hosts, can read it; nobody else on the machine needs to)."""
    private_dir(Path(path).parent)
    return write_atomic(path, data, mode=0o600)


# ---------------------------------------------------------------------------------------------- TLS
def _host_names(hosts) -> list:
    from cryptography import x509

    names: list = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(str(h))))
        except ValueError:
            names.append(x509.DNSName(str(h)))
    return names


def make_tls(directory, hosts=("127.0.0.1",), *, days: int = 365, name: str = "fedsonmf") -> TLSFiles:
    """A fresh CA and a server certificate for ``hosts`` (the addresses the nodes dial).

    The CA's private key is not kept (module docstring).  ECDSA P-256 keys, SHA-256 signatures.

    Parameters
    ----------
    directory : path
        Receives ``ca.crt``, ``server.pem`` and ``server.key`` (all 0600; the folder 0700).
    hosts : sequence of str, default=("127.0.0.1",)
        IP addresses or DNS names the certificate names.
    days : int, default=365
        Validity.
    name : str, default="fedsonmf"
        The CA's common name.

    Returns
    -------
    TLSFiles
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    hosts = list(hosts)
    if not hosts:
        raise InputError("make_tls needs at least one host address for the server certificate")
    directory = Path(directory)
    now = _dt.datetime.now(_dt.UTC)
    start, end = now - _dt.timedelta(minutes=5), now + _dt.timedelta(days=int(days))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} deployment CA {os.urandom(4).hex()}")])
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(start).not_valid_after(end)
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                            key_encipherment=False, data_encipherment=False, key_agreement=False,
                                            key_cert_sign=True, crl_sign=True, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
               .sign(ca_key, hashes.SHA256()))
    srv_key = ec.generate_private_key(ec.SECP256R1())
    srv_cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(hosts[0]))]))
                .issuer_name(ca_name).public_key(srv_key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(end)
                .add_extension(x509.SubjectAlternativeName(_host_names(hosts)), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
    del ca_key  # never written: no further certificate can be signed by this CA
    pem = serialization.Encoding.PEM
    files = TLSFiles(directory / "ca.crt", directory / "server.pem", directory / "server.key")
    write_private(files.server_key, srv_key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    _write_public(files.ca_cert, ca_cert.public_bytes(pem))
    _write_public(files.server_cert, srv_cert.public_bytes(pem))
    return files


# ---------------------------------------------------------------------------------------------- node keys
def key_fingerprint(public_key_line: str | bytes) -> str:
    """OpenSSH-style fingerprint ``SHA256:<base64>`` of a public key line (``ecdsa-sha2-nistp384 AAAA...``)."""
    if isinstance(public_key_line, bytes):
        public_key_line = public_key_line.decode()
    parts = public_key_line.split()
    if len(parts) < 2:
        raise InputError(f"not an OpenSSH public key line: {public_key_line[:40]!r}")
    digest = hashlib.sha256(base64.b64decode(parts[1])).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def make_node_key(directory, name: str) -> NodeKey:
    """A SuperNode key pair: ``<name>`` (private, 0600) and ``<name>.pub`` in ``directory``.

    ECDSA P-384: Flower 1.42 accepts only NIST-curve EC keys for SuperNode authentication.

    Parameters
    ----------
    directory : path
        The key folder (0700).
    name : str
        The file name of the private key.

    Returns
    -------
    NodeKey
        The two paths and the public key's fingerprint.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory = Path(directory)
    key = ec.generate_private_key(ec.SECP384R1())
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                             serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    private = write_private(directory / name, priv)
    public = _write_public(directory / f"{name}.pub", pub + f" fedsonmf-{name}\n".encode())
    return NodeKey(private, public, key_fingerprint(pub))


def load_node_key(private_path, public_path=None) -> NodeKey:
    """Check a SuperNode key pair given by an operator.

    Parameters
    ----------
    private_path : path
        The private key: 0600 (refused otherwise), ECDSA on a NIST curve.
    public_path : path or None, default=None
        Its public key; None = ``<private>.pub``.  It must be the private key's own.

    Returns
    -------
    NodeKey

    Raises
    ------
    InputError
        Naming the file and what is wrong.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private = check_private_file(private_path, "SuperNode private key")
    public = Path(public_path).expanduser().resolve() if public_path else private.with_name(private.name + ".pub")
    try:
        key = serialization.load_ssh_private_key(private.read_bytes(), None)
    except (ValueError, TypeError) as exc:
        raise InputError(f"SuperNode private key {private} cannot be read as an unencrypted OpenSSH key: "
                         f"{exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise InputError(f"SuperNode private key {private} is {type(key).__name__}: Flower 1.42 accepts only "
                         "ECDSA keys on a NIST curve (e.g. ssh-keygen -t ecdsa -b 384)")
    mine = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    if not public.is_file():
        raise InputError(f"SuperNode public key {public} does not exist (expected beside the private key)")
    given = public.read_text().split()
    if given[:2] != mine.decode().split()[:2]:
        raise InputError(f"SuperNode public key {public} does not belong to the private key {private}")
    return NodeKey(private, public, key_fingerprint(mine))


def make_signing_key(path) -> str:
    """A node's Ed25519 signing key for secure aggregation's key agreement, written to ``path``
    (PKCS#8 PEM, 0600, in a 0700 folder); returns its public half (raw 32 bytes, base64url),
    which the coordinator pins in every run config it signs (``secagg-peers``).

    Separate from the SuperNode key: Flower accepts only NIST-curve ECDSA keys for node
    authentication and re-keys a restarted node, while this key signs one node's
    secure-aggregation public keys for the whole deployment, under the coordinator's signature.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    write_private(path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return _public_b64(key)


def signing_public_key(path) -> str:
    """The public half (base64url) of the signing key at ``path`` (:func:`load_signing_key`)."""
    return _public_b64(load_signing_key(path))


def _public_b64(key) -> str:
    """The raw public half of an Ed25519 private key (:meth:`~fedsonmf.federation.secagg.KeySigner.public_bytes`,
    what the nodes verify against), base64url without padding."""
    from fedsonmf.federation.secagg import KeySigner

    return base64.urlsafe_b64encode(KeySigner.public_bytes(key)).decode("ascii").rstrip("=")


def load_signing_key(path):
    """The node's Ed25519 signing key at ``path`` (refused unless 0600 and Ed25519: InputError)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = check_private_file(path, "secure-aggregation signing key")
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise InputError(f"secure-aggregation signing key {path} cannot be read: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(f"secure-aggregation signing key {path} is {type(key).__name__}, not Ed25519")
    return key


def parse_peer_keys(text: str) -> list[bytes]:
    """The run config's ``secagg-peers`` (a JSON list of base64url raw Ed25519 public keys, by
    view) as raw bytes; InputError when malformed."""
    try:
        keys = [base64.urlsafe_b64decode(str(k) + "=" * (-len(str(k)) % 4)) for k in json.loads(text)]
    except (ValueError, TypeError) as exc:
        raise InputError(f"run config 'secagg-peers' is not a JSON list of base64url keys: {exc}") from None
    if any(len(k) != 32 for k in keys):
        raise InputError("run config 'secagg-peers' holds a key that is not 32 bytes (Ed25519)")
    return keys


def node_signing_key(node_key) -> tuple[Path, Path, str]:
    """The secure-aggregation signing key kept beside the SuperNode key ``node_key``
    (``NAME-secagg.pem``, 0600; made on first use, kept after: peers pin it for the deployment's
    lifetime) and its public half's file ``NAME-secagg.pub``, which travels to the coordinator like
    ``NAME.pub``.  Returns (private path, public path, public key)."""
    node_key = Path(node_key)
    private = node_key.with_name(f"{node_key.name}-secagg.pem")
    public = node_key.with_name(f"{node_key.name}-secagg.pub")
    key = make_signing_key(private) if not private.is_file() else signing_public_key(private)
    if not public.is_file() or public.read_text().strip() != key:
        _write_public(public, (key + "\n").encode())
    return private, public, key


def read_signing_public(path) -> str:
    """A node's public signing key file (``NAME-secagg.pub``: one base64url line of 32 bytes);
    InputError naming the file otherwise (a private key is refused: it must not travel)."""
    path = Path(path)
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise InputError(f"signing key file {path} cannot be read: {exc}") from None
    if "PRIVATE" in text:
        raise InputError(f"{path} is a private key: give the node's NAME-secagg.pub")
    try:
        parse_peer_keys(json.dumps([text]))
    except InputError:
        raise InputError(f"{path} is not a secure-aggregation public signing key (NAME-secagg.pub from "
                         "`fedsonmf flower keys node` or `supernode`)") from None
    return text


def peers_file(pins_path) -> Path:
    """The coordinator's record of every view's public signing key, beside the pins file
    (``PINS-secagg.json``, 0600): written by ``flower register --signing-key``, read by ``submit``."""
    pins_path = Path(pins_path)
    return pins_path.with_name(f"{pins_path.stem}-secagg.json")


def add_peer_key(pins_path, partition: int, public: str) -> Path:
    """Record view ``partition``'s public signing key ``public`` (replacing the view's old one)."""
    path = peers_file(pins_path)
    keys = json.loads(check_private_file(path, "signing keys file").read_text()) if path.exists() else {}
    keys[str(int(partition))] = public
    return write_private(path, json.dumps(dict(sorted(keys.items(), key=lambda kv: int(kv[0]))), indent=1).encode())


def peer_keys_for_run(pins_path, n_views: int | None) -> str:
    """The run config's ``secagg-peers`` (JSON list by view) from the record beside ``pins_path``;
    InputError naming the views without a key (``n_views`` None: the views 0..max recorded)."""
    path = peers_file(pins_path)
    if not path.exists():
        raise InputError(f"no secure-aggregation signing keys are recorded ({path} does not exist): register each "
                         "node with `fedsonmf flower register ... --signing-key NAME-secagg.pub`")
    try:
        body = json.loads(check_private_file(path, "signing keys file").read_text())
        keys = {int(p): str(k) for p, k in body.items()}
    except (ValueError, AttributeError) as exc:
        raise InputError(f"signing keys file {path} is malformed: {exc}") from None
    n = n_views if n_views is not None else (max(keys) + 1 if keys else 0)
    missing = [p for p in range(n) if p not in keys]
    if missing or n == 0:
        raise InputError(f"views {missing or 'all'} have no secure-aggregation signing key in {path}: register "
                         "them with `fedsonmf flower register ... --signing-key NAME-secagg.pub --replace`")
    text = json.dumps([keys[p] for p in range(n)])
    parse_peer_keys(text)
    return text


def _register_args(flwr: str, public_key, connection: str) -> list[str]:
    return [flwr, "supernode", "register", str(public_key), connection, "--format", "json"]


def _node_id_from(proc_stdout: str, returncode: int, public_key, output: str) -> int:
    try:  # the JSON object follows any human-readable lines
        out = json.loads(proc_stdout[proc_stdout.index("{"):]) if "{" in proc_stdout else {}
    except json.JSONDecodeError:
        out = {}
    if returncode == 0 and out.get("success") and "node-id" in out:
        return int(out["node-id"])
    raise FederationError(f"flwr supernode register {public_key} failed (exit {returncode}): {output.strip()[-800:]}")


def register_node_key(flwr: str, public_key, connection: str, *, env: dict, cwd=None, timeout: float = 60.0) -> int:
    """``flwr supernode register PUBLIC_KEY CONNECTION --format json``; return the node id the
    SuperLink gave the key.  Raises :class:`FederationError` with Flower's message on failure."""
    proc = subprocess.run(_register_args(flwr, public_key, connection), env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return _node_id_from(proc.stdout, proc.returncode, public_key, proc.stdout + proc.stderr)


def register_node_keys(flwr: str, public_keys, connection: str, *, env: dict, cwd=None,
                       timeout: float = 120.0) -> list[int]:
    """Register several SuperNode public keys, the ``flwr`` processes side by side.

    Parameters
    ----------
    flwr : str
        The ``flwr`` executable.
    public_keys : list of path
        The keys' ``.pub`` files.
    connection : str
        The connection name in ``FLWR_HOME/config.toml``.
    env : dict
        The processes' environment (``FLWR_HOME``).
    cwd : path or None, default=None
        Their working folder.
    timeout : float, default=120.0
        Seconds for all registrations (a ceiling: they return as soon as Flower answers).

    Returns
    -------
    list of int
        The node ids, in the order of ``public_keys``.

    Raises
    ------
    FederationError
        With Flower's message, when a registration fails.
    """
    procs = [subprocess.Popen(_register_args(flwr, k, connection), env=env, cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, start_new_session=True)
             for k in public_keys]
    outs = []
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=timeout))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [_node_id_from(o, proc.returncode, k, o + e) for k, proc, (o, e) in zip(public_keys, procs, outs)]


def unregister_node(flwr: str, node_id: int, connection: str, *, env: dict, cwd=None, timeout: float = 60.0) -> bool:
    """``flwr supernode unregister NODE_ID CONNECTION``: the node's key can no longer connect.
    Returns False when Flower refused (e.g. already unregistered)."""
    proc = subprocess.run([flwr, "supernode", "unregister", str(int(node_id)), connection], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return proc.returncode == 0


# ---------------------------------------------------------------------------------------------- commands
def superlink_args(host: str, port: int, tls: tuple | None, *, auth: bool = True) -> list[str]:
    """The ``flower-superlink`` flags of a deployment (without the program name).

    Run-time dependency installation is off: every host has fedsonmf installed.

    Parameters
    ----------
    host : str
        The listen address.
    port : int
        The Fleet API port.
    tls : (ca.crt, server.pem, server.key) or None
        None: plain HTTP (no SuperNode authentication possible).
    auth : bool, default=True
        SuperNode authentication.

    Returns
    -------
    list of str
    """
    args = (["--ssl-ca-certfile", str(tls[0]), "--ssl-certfile", str(tls[1]), "--ssl-keyfile", str(tls[2])]
            if tls else ["--insecure"])
    if auth:
        if not tls:
            raise InputError("SuperNode authentication needs TLS (flower-superlink refuses --enable-supernode-auth "
                             "with --insecure)")
        args.append("--enable-supernode-auth")
    return [*args, "--host", str(host), "--port", str(int(port)), "--disable-runtime-dependency-installation"]


def supernode_args(superlink: str, ca_cert, private_key, node_config: str, *, port: int = 9094) -> list[str]:
    """The ``flower-supernode`` flags of one node (without the program name).

    Parameters
    ----------
    superlink : str
        ``HOST:PORT`` of the SuperLink.
    ca_cert : path or None
        The deployment's CA certificate; None: plain HTTP.
    private_key : path or None
        The node's private key; None: no SuperNode authentication.
    node_config : str
        The ``--node-config`` string (:func:`node_config`).
    port : int, default=9094
        The node's own local runtime API (unique per node on one host).

    Returns
    -------
    list of str
    """
    args = ["--root-certificates", str(ca_cert)] if ca_cert else ["--insecure"]
    if private_key:
        args += ["--auth-supernode-private-key", str(private_key)]
    return [*args, "--superlink", str(superlink), "--port", str(int(port)), "--node-config", node_config]


def gate_daemon_args(secret_file) -> list[str]:
    """The flags that make a SuperLink/SuperNode start no app process itself and hand its tasks
    only to a process holding ``secret_file`` (our gate executor, ``gate.py``)."""
    return ["--isolation", "process", "--superexec-auth-secret-file", str(secret_file)]


def superlink_runtime_api(host: str, port: int) -> str:
    """The address the SuperLink host's executor dials: the listen address, or loopback when the
    SuperLink listens on every interface (as Flower's own SuperExec does)."""
    host = str(host).strip("[]")
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"


def node_config(partition: int, partitions: int, view, state_dir=None, mask=None, *,
                require_secure: bool = True, min_cluster_size: int = 1, predict=None, signing_key=None) -> str:
    """The ``--node-config`` string of the node holding view ``partition``.

    Parameters
    ----------
    partition : int
        The view index.
    partitions : int
        The number of views.
    view : path
        The node's view file (``data-path``).
    state_dir : path or None, default=None
        The node-local state folder (``state-dir``).
    mask : path or None, default=None
        The availability mask (``mask-path``, incomplete views).
    require_secure : bool, default=True
        The node's policy ``require-secure-aggregation`` (written out either way): False lets it
        take part in runs whose uploads are not masked.
    min_cluster_size : int, default=1
        The node's policy ``refine-min-cluster-size`` (written when above 1).
    predict : path or None, default=None
        The node's file of new samples (``predict-path``) that a ``predict`` run embeds; only the
        node config names a file a node reads, never a run config.
    signing_key : path or None, default=None
        The node's secure-aggregation signing key (``secagg-signing-key``, :func:`make_signing_key`).

    Returns
    -------
    str
    """
    text = (f'partition-id={int(partition)} num-partitions={int(partitions)} data-path="{Path(view).resolve()}"'
            f' require-secure-aggregation={"true" if require_secure else "false"}')
    if state_dir is not None:
        text += f' state-dir="{Path(state_dir).resolve()}"'
    if mask is not None:
        text += f' mask-path="{Path(mask).resolve()}"'
    if int(min_cluster_size) > 1:
        text += f" refine-min-cluster-size={int(min_cluster_size)}"
    if predict is not None:
        text += f' predict-path="{Path(predict).resolve()}"'
    if signing_key is not None:
        text += f' {SIGNING_KEY}="{Path(signing_key).resolve()}"'
    return text


def write_connection(flwr_home, name: str, address: str, ca_cert=None) -> Path:
    """Write ``FLWR_HOME/config.toml`` with the one connection ``name`` (the default) to ``address``,
    verifying the SuperLink against ``ca_cert`` (None: plain HTTP, ``insecure = true``)."""
    home = Path(flwr_home)
    private_dir(home)
    path = home / "config.toml"
    write_atomic(path, f'[superlink]\ndefault = "{name}"\n\n[superlink.{name}]\naddress = "{address}"\n'
                    + (f'root-certificates = "{Path(ca_cert).resolve()}"\n' if ca_cert else "insecure = true\n"))
    return path


# ---------------------------------------------------------------------------------------------- pins
def write_pins(path, pins: dict[int, Pin], retired=()) -> Path:
    """Write the pins ``{partition: Pin}`` to ``path`` (JSON, atomically, 0600).

    Parameters
    ----------
    path : path
        The pins file.
    pins : dict of int to Pin
        Each view's node id and key fingerprint.
    retired : iterable of int, default=()
        Node ids this deployment used before (a SuperNode restarted with a new key); the
        SuperLink may list such a dead node as online for ~1 min, and the handshake ignores it.

    Returns
    -------
    Path
    """
    body = {"pins": {str(p): {"node-id": int(pin.node_id), "fingerprint": pin.fingerprint}
                     for p, pin in sorted(pins.items())},
            "retired": sorted(int(n) for n in retired)}
    return write_private(path, json.dumps(body, indent=1).encode())


def read_retired(path) -> set[int]:
    """The retired node ids of the pins file ``path`` (see :func:`write_pins`); checked like :func:`read_pins`."""
    read_pins(path)
    return {int(n) for n in json.loads(Path(path).read_text()).get("retired", [])}


def read_pins(path) -> dict[int, Pin]:
    """The pins in ``path``.

    Parameters
    ----------
    path : path
        A pins file (:func:`write_pins`).

    Returns
    -------
    dict of int to Pin

    Raises
    ------
    FederationError
        A missing file, one another user owns or that group/others may write (anyone who can
        write it can re-pin a view to their own node), or one that is not a pins file.
    """
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise FederationError(f"node pins file {path} (run config 'node-pins') does not exist", round=0) from None
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise FederationError(f"node pins file {path} is owned by uid {st.st_uid} with mode "
                              f"{stat.S_IMODE(st.st_mode):04o}: it must belong to the ServerApp's user "
                              "and be writable by no one else", round=0)
    try:
        body = json.loads(path.read_text())
        return {int(p): Pin(int(v["node-id"]), str(v["fingerprint"])) for p, v in body["pins"].items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise FederationError(f"node pins file {path} is malformed: {type(exc).__name__}: {exc}", round=0) from None


def check_pin(pins: dict[int, Pin], node_id: int, partition: int) -> None:
    """Refuse ``node_id`` claiming view ``partition`` unless that view is pinned to it.

    Raises :class:`FederationError` naming the node, the view and the pinned node and key.
    """
    pin = pins.get(partition)
    if pin is not None and pin.node_id == node_id:
        return
    mine = [p for p, q in pins.items() if q.node_id == node_id]
    if pin is None:
        raise FederationError(f"node {node_id} claims view {partition}, which is pinned to no node "
                              f"(pinned views: {sorted(pins)})", client=partition, round=0, node_id=node_id)
    who = f"node {node_id} (pinned to view {mine[0]})" if mine else f"node {node_id} (no pinned key)"
    raise FederationError(f"{who} claims view {partition}, which is pinned to node {pin.node_id} "
                          f"(key {pin.fingerprint}): refused", client=partition, round=0, node_id=node_id)


def add_pin(path, partition: int, pin: Pin, *, replace: bool = False) -> dict[int, Pin]:
    """Pin view ``partition`` to ``pin`` in the pins file ``path`` (created 0600 when absent).
    A view already pinned to another node is refused unless ``replace``.  Returns all pins."""
    path = Path(path)
    pins = read_pins(path) if path.exists() else {}
    old = pins.get(partition)
    if old is not None and old != pin and not replace:
        raise InputError(f"view {partition} is already pinned to node {old.node_id} (key {old.fingerprint}) in "
                         f"{path}; unregister that node first or pass --replace")
    retired = read_retired(path) if path.exists() else set()
    if old is not None and old.node_id != pin.node_id:
        retired.add(old.node_id)
    pins[int(partition)] = pin
    write_pins(path, pins, retired)
    return pins
